/*
 * ownership.c: ids are not capabilities (docs/security.md, "Ownership").
 * What a worker may ask about (its own tasks, the jobs and datasets they
 * are of), and the capabilities the state hands out and checks: a client's
 * secret and a task's key, derived from the state's secret (caps.h). The
 * transitions that use them are in state.c.
 */
#include "state.h"
#include "state_types.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "errbuf.h"

/* Whether task t is worker w's: given to it, or to the id it had before it
 * registered again over the same connection (that worker is gone and had
 * its address; it runs those tasks until it hears to drop them). */
bool sl__dstate_worker_owns_task(sl_dstate_t *st, const struct worker *w, const struct task *t)
{
    if (t->worker_id == w->id)
        return true;
    const struct worker *prev = sl__dstate_worker(st, t->worker_id);
    return (!prev || prev->state != WORKER_LIVE) && strcmp(t->worker_address, w->address) == 0;
}

int sl_dstate_worker_may(sl_dstate_t *st, uint64_t worker_id, sl_daccess_t what, uint64_t id, char *err,
                         size_t errlen)
{
    static const char *const names[] = {"task", "job", "dataset"};
    if (worker_id == 0) {
        return sl_errf(err, errlen, SL_EPERM,
                       "no worker registered over this connection: WORKER_REGISTER first");
    }
    const struct worker *w = sl__dstate_worker(st, worker_id);
    if (!w) {
        return sl_errf(err, errlen, SL_ENOTFOUND, "worker %" PRIu64 " is not registered: register again",
                       worker_id);
    }
    if (what == SL_DACCESS_TASK) {
        struct job *j = NULL;
        const struct task *t = sl__dstate_task(st, id, &j);
        if (!t || sl__dstate_worker_owns_task(st, w, t))
            return 0; /* an unknown task is the request's to answer */
    } else if (what == SL_DACCESS_JOB) {
        const struct job *j = sl__dstate_job(st, id);
        for (unsigned k = 0; j && k < j->num_tasks; k++)
            if (sl__dstate_worker_owns_task(st, w, &j->tasks[k]))
                return 0;
    } else {
        for (unsigned i = 0; i < st->num_jobs; i++) {
            const struct job *j = st->jobs[i];
            if (j->dataset->id != id)
                continue;
            for (unsigned k = 0; k < j->num_tasks; k++)
                if (sl__dstate_worker_owns_task(st, w, &j->tasks[k]))
                    return 0;
        }
    }
    return sl_errf(err, errlen, SL_EPERM, "%s %" PRIu64 " is not worker %" PRIu64 "'s: %s", names[what], id,
                   worker_id,
                   what == SL_DACCESS_TASK ? "a worker asks only for its own tasks' splits"
                   : what == SL_DACCESS_JOB ? "it has no task of that job"
                                            : "none of its tasks reads that dataset");
}

/* The nonce of job job_id, 0 when there is no such job (its capabilities
 * are derived as a job's stored before nonces: they match none a client of
 * this state could show). */
static uint64_t job_nonce(const sl_dstate_t *st, uint64_t job_id)
{
    const struct job *j = sl__dstate_job(st, job_id);
    return j ? j->nonce : 0;
}

void sl_dstate_client_secret(const sl_dstate_t *st, uint64_t job_id, uint64_t client_id, uint8_t out[16])
{
    sl_cap_client_secret(st->secret, job_id, client_id, job_nonce(st, job_id), out);
}

void sl_dstate_task_key(const sl_dstate_t *st, uint64_t task_id, uint8_t out[16])
{
    struct job *j = NULL;
    sl_cap_task_key(st->secret, task_id, sl__dstate_task(st, task_id, &j) ? j->nonce : 0, out);
}

const uint8_t *sl__dstate_task_key(const sl_dstate_t *st, const struct job *j, struct task *t)
{
    if (!t->keyed) {
        sl_cap_task_key(st->secret, t->id, j->nonce, t->key);
        t->keyed = true;
    }
    return t->key;
}

void sl_dstate_worker_secret(const sl_dstate_t *st, uint64_t worker_id, uint8_t out[16])
{
    sl_cap_worker_secret(st->secret, worker_id, out);
}

/* Checked before the client is looked up: a wrong secret learns nothing,
 * not even whether the client exists (only the job's nonce is looked up,
 * and a job that does not exist has the nonce 0, which no client of this
 * state's jobs holds a secret of). */
int sl__dstate_check_client_secret(const sl_dstate_t *st, const char *what, uint64_t job_id, uint64_t client_id,
                                   const uint8_t secret[SL_CAP_LEN], char *err, size_t errlen)
{
    uint8_t want[SL_CAP_LEN];
    sl_cap_client_secret(st->secret, job_id, client_id, job_nonce(st, job_id), want);
    bool ok = sl_cap_equal(want, secret);
    explicit_bzero(want, sizeof want);
    if (ok)
        return 0;
    /* Its secret cannot be checked: the job was held back at load. What
     * the record held is the operator's to read (the admin endpoint). */
    if (!sl__dstate_job(st, job_id) && sl__dstate_held_back(st, "job", job_id))
        return sl_errf(err, errlen, SL_EDATA,
                       "%s refused: job %" PRIu64 " is held back since the dispatcher started, its state store "
                       "record damaged; the job cannot go on (the dispatcher's admin endpoint says why: GET "
                       "/v1/quarantine)", what, job_id);
    return sl_errf(err, errlen, SL_EPERM,
                   "%s refused: client_secret is not the one job %" PRIu64 " gave client %" PRIu64
                   " (GetOrCreateJobResponse.client_secret; a client of another dispatcher, or of this one "
                   "before it lost its state, has none here); nothing changed",
                   what, job_id, client_id);
}
