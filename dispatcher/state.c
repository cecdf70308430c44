/*
 * state.c: see state.h. The hand-out of DYNAMIC splits is handout.c, what
 * happens to a lost task's splits outstanding.c, the admin views views.c,
 * what they share state_base.c, who may touch what ownership.c. Past 900
 * lines: the transitions below, of workers, jobs, tasks and clients, call
 * each other (a lost worker loses its tasks, which may finish or fail their
 * jobs).
 *
 * Worker states:  LIVE -> LOST (its connection closed, no heartbeat for
 *                 worker_timeout_ms, stuck for stall_timeout_ms, or the same
 *                 address registered again). A worker that reconnects with
 *                 the id it had while the dispatcher still knows it LIVE
 *                 resumes it (a dispatcher restart); otherwise it registers
 *                 under a new id.
 * Job states:     RUNNING -> FINISHED  every task is DONE or LOST, one DONE
 *                                      by itself (not cut off by a drain
 *                                      while DYNAMIC splits are left)
 *                 RUNNING -> FAILED    a task reported a pipeline failure, or
 *                                      stays held at --max-outstanding-splits
 *                 RUNNING -> CANCELLED no client for job_gc_timeout_ms, or
 *                                      DELETE /v1/jobs/{id}
 * Named jobs:     keyed by (name, repetition). A join of a running one joins
 *                 it; of an ended one leases a client that is told the end
 *                 (it gets no task); of none creates it. An ended one without
 *                 clients for job_gc_timeout_ms (or one cancelled for that) is
 *                 collected: the next join creates it again.
 * Task states:    ASSIGNED -> RUNNING -> DONE
 *                 ASSIGNED -> DONE      (finished before its first report)
 *                 ASSIGNED | RUNNING -> FAILED | LOST
 *                 DONE -> LOST          (DYNAMIC: its worker was lost before
 *                                      every client confirmed its splits)
 * DYNAMIC splits: one cursor per job over the source's elements, cut into
 *                 split_size pieces, for one epoch at a time: epoch e+1
 *                 opens when a task asks for it after e ran out.
 * Static policies (FILE, DATA, FILE_OR_DATA, HINT): a task's worker_index
 *                 is its worker's place in --worker-addresses; the job
 *                 finishes once every index has a DONE task.
 * Coordinated reads (num_consumers > 0): the job's round_horizon only
 *                 grows; a task added later starts at horizon + 1, a lost
 *                 task ends at horizon + 1, so no consumer has passed
 *                 either round when it learns of it (docs/sharding.md).
 */
#include "state.h"
#include "state_types.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <openssl/evp.h>

#include "errbuf.h"
#include "files.h"
#include "le.h"
#include "log.h"
#include "net.h"
#include "outstanding.h"
#include "policy.h"
#include "spec.h"
#include "taskkey.h"

void sl_dstate_config_init(sl_dstate_config_t *cfg)
{
    *cfg = (sl_dstate_config_t){
        .worker_timeout_ms = 10000,
        .stall_timeout_ms = 60000,
        .client_timeout_ms = 30000,
        .client_rejoin_ms = 300000,
        .client_stall_ms = 60000,
        .job_gc_timeout_ms = 60000,
        .split_size = 1024,
        .max_split_size = 1u << 20,
        .worker_heartbeat_ms = 250,
        .client_heartbeat_ms = 250,
        .max_workers = 256, /* a client heartbeat lists at most 256 tasks */
        .max_datasets = 4096,
        .dataset_gc_timeout_ms = 86400000,
        .max_jobs = 4096,
        .max_clients_per_job = 1024,
        .max_files = 100000,
        .round_lookahead = 64,
        .max_exclude_runs = SL_POSSET_MAX_RUNS,
        .max_exclude_total = 4 * (uint64_t)SL_POSSET_MAX_RUNS,
        .count_timeout_ms = 60000,
        .max_skip_bytes = 256u << 10,
        .max_outstanding = 16384,
        .handout_commit_delay_ms = 50,
    };
}

static void queue_del(sl_dstate_t *st, enum sl_dtable table, uint64_t key)
{
    sl__dstate_del(st, table, key, 0);
}

/* Requests carry the time: a job that ends in one says when (job_set_state()
 * reads st->now, which otherwise only the tick moves). */
static void clock_at(sl_dstate_t *st, int64_t now)
{
    if (now > st->now)
        st->now = now;
}

sl_dstate_t *sl_dstate_new(const sl_dstate_config_t *cfg)
{
    sl_dstate_t *st = calloc(1, sizeof *st);
    if (!st)
        return NULL;
    st->cfg = *cfg;
    if (cfg->worker_addresses && cfg->worker_addresses[0]) {
        const char *p = cfg->worker_addresses;
        unsigned n = 1;
        for (const char *q = p; *q; q++)
            n += *q == ',';
        if (n > st->cfg.max_workers || !(st->addresses = calloc(n, sizeof *st->addresses))) {
            free(st);
            return NULL;
        }
        while (*p) {
            size_t len = strcspn(p, ",");
            if (len > 0 && len < sizeof st->addresses[0]) {
                memcpy(st->addresses[st->num_addresses], p, len);
                st->addresses[st->num_addresses++][len] = '\0';
            }
            p += len + (p[len] == ',');
        }
    }
    st->cfg.worker_addresses = NULL; /* the copy above is what counts */
    if (st->cfg.round_lookahead == 0)
        st->cfg.round_lookahead = 1;
    if (st->cfg.split_size == 0)
        st->cfg.split_size = 1; /* an empty split would never move the cursor */
    st->next_id = st->saved_next_id = 1;
    if (sl_cap_secret_new(st->secret) < 0) {
        free(st->addresses);
        free(st);
        return NULL;
    }
    st->secret_dirty = true;
    return st;
}

const sl_dstate_config_t *sl_dstate_config(const sl_dstate_t *st)
{
    return &st->cfg;
}

static void job_free(struct job *j)
{
    for (unsigned k = 0; k < j->num_tasks; k++) {
        free(j->tasks[k].last_splits);
        free(j->tasks[k].last_skips);
        sl__out_free_task(&j->tasks[k]);
    }
    free(j->tasks);
    sl__out_free_job(j);
    sl_posbits_clear(&j->exclude);
    for (unsigned i = 0; i < j->num_clients; i++)
        sl__out_free_client(&j->clients[i]);
    free(j->clients);
    free(j->gone);
    free(j);
}

/* Frees what st holds, keeping its configuration. */
static void dstate_clear(sl_dstate_t *st)
{
    for (unsigned i = 0; i < st->num_datasets; i++)
        sl__dataset_free(st->datasets[i]);
    for (unsigned i = 0; i < st->num_jobs; i++)
        job_free(st->jobs[i]);
    free(st->workers);
    free(st->dels);
    free(st->datasets);
    free(st->jobs);
    free(st->dirty_jobs);
    free(st->quarantine);
    sl_idmap_clear(&st->index);
}

void sl_dstate_reset(sl_dstate_t *st)
{
    dstate_clear(st);
    st->workers = NULL;
    st->num_workers = st->cap_workers = 0;
    st->dels = NULL;
    st->num_dels = st->cap_dels = 0;
    st->datasets = NULL;
    st->num_datasets = st->cap_datasets = 0;
    st->jobs = NULL;
    st->num_jobs = st->cap_jobs = 0;
    st->dirty_jobs = NULL;
    st->num_dirty_jobs = st->cap_dirty_jobs = 0;
    st->quarantine = NULL;
    st->num_quarantine = st->cap_quarantine = 0;
    st->workers_dirty = st->datasets_dirty = false;
    st->next_id = st->saved_next_id = 1;
}

void sl_dstate_free(sl_dstate_t *st)
{
    if (!st)
        return;
    dstate_clear(st);
    free(st->addresses);
    explicit_bzero(st->secret, sizeof st->secret);
    free(st);
}

/* Ops that turn each element into exactly one element, so that a count of
 * source elements is the same count at the next op: the element-wise ops
 * but filter, and those that only reorder, repeat or hold elements. */
static bool op_keeps_count(sl_op_kind_t kind)
{
    switch (kind) {
    case SL_OP_SHUFFLE:
    case SL_OP_REPEAT:
    case SL_OP_PREFETCH:
    case SL_OP_CACHE: return true;
    case SL_OP_FILTER: return false;
    default: return sl_spec_op_elementwise(kind);
    }
}

/* Splits a shuffle buffer spans at most, once split_size_for() sized them. */
#define SHUFFLE_SPAN_SPLITS 64

/* DYNAMIC splits are at least 1/SHUFFLE_SPAN_SPLITS of the records a shuffle
 * buffer holds: a buffer of B records lets a split's last record out about
 * B ln(N) records after its first came in (N the records read), so a task
 * holds about B ln(N) / size splits it has not finished, all outstanding;
 * with 1024-record splits a buffer of 10^6 would pass --max-outstanding-
 * splits. Records per buffered element are counted through batch ops before
 * the shuffle (a filter makes them more, which the bound's check catches).
 * Then they are rounded up to a multiple of the batch size when every
 * element of the source reaches the first batch op one for one: then each
 * worker builds only full batches from a run of splits, and the only short
 * batches of an epoch are at the end of a worker's share. Splits sized to a
 * worker's rate (handout.c) are multiples of this size, so the same holds
 * for them. */
static uint64_t split_size_for(const sl_spec_t *spec, uint64_t size)
{
    uint64_t per = 1; /* records per element at op i, as far as batch ops say */
    for (int i = 0; i < sl_spec_num_ops(spec); i++) {
        const sl_spec_op_t *op = sl_spec_op(spec, i);
        if (op->kind == SL_OP_SHUFFLE) {
            uint64_t b = (uint64_t)op->u.shuffle.buffer_size * per;
            uint64_t want = (b + SHUFFLE_SPAN_SPLITS - 1) / SHUFFLE_SPAN_SPLITS;
            if (want > size)
                size = want;
        } else if (op->kind == SL_OP_BATCH || op->kind == SL_OP_PADDED_BATCH) {
            uint64_t bs = (uint64_t)(op->kind == SL_OP_BATCH ? op->u.batch.batch_size : op->u.padded_batch.batch_size);
            per = per > (UINT64_C(1) << 36) / bs ? UINT64_C(1) << 36 : per * bs;
        }
    }
    for (int i = 0; i < sl_spec_num_ops(spec); i++) {
        const sl_spec_op_t *op = sl_spec_op(spec, i);
        if (op->kind == SL_OP_BATCH) {
            uint64_t b = (uint64_t)op->u.batch.batch_size;
            return (size + b - 1) / b * b;
        }
        if (!op_keeps_count(op->kind))
            break;
    }
    return size;
}

static bool is_static(sl_sharding_t p)
{
    return p == SL_SHARDING_FILE || p == SL_SHARDING_DATA || p == SL_SHARDING_FILE_OR_DATA ||
           p == SL_SHARDING_HINT;
}

/* The place of address in --worker-addresses, or -1. */
static int address_index(const sl_dstate_t *st, const char *address)
{
    for (unsigned i = 0; i < st->num_addresses; i++)
        if (strcmp(st->addresses[i], address) == 0)
            return (int)i;
    return -1;
}

static void task_set_state(sl_dstate_t *st, struct job *j, struct task *t, enum task_state next)
{
    if (t->state == next)
        return;
    bool ok = false;
    switch (t->state) {
    case TASK_ASSIGNED: ok = next != TASK_ASSIGNED; break;
    case TASK_RUNNING: ok = next == TASK_DONE || next == TASK_FAILED || next == TASK_LOST; break;
    /* A DONE task whose worker is lost before its clients had all of it. */
    case TASK_DONE: ok = next == TASK_LOST; break;
    default: ok = false; break;
    }
    assert(ok && "task state transition");
    if (!ok)
        return;
    sl_log_debug("job %" PRIu64 " task %" PRIu64 ": %s -> %s", j->id, t->id, sl__task_state_names[t->state],
                 sl__task_state_names[next]);
    t->state = next;
    j->dirty = true;
    sl__dstate_touch(st, j);
}

static void job_set_state(sl_dstate_t *st, struct job *j, sl_job_state_t next, const char *why)
{
    assert(j->state == SL_JOB_RUNNING && next != SL_JOB_RUNNING);
    if (j->state != SL_JOB_RUNNING)
        return;
    /* What its clients had whole when it ended, for its view: the
     * outstanding splits that say it go now. */
    j->end_epochs_known = sl__out_tracked(j);
    j->end_epochs_done = sl__out_epochs_done(j);
    j->state = next;
    j->ended = st->now > 0 ? st->now : 1;
    j->dirty = true;
    sl__dstate_touch(st, j);
    sl__out_clear(st, j); /* nothing more is handed out */
    /* Nor does a consumer come back (coordinated reads). */
    free(j->gone);
    j->gone = NULL;
    j->num_gone = j->cap_gone = 0;
    /* Nor are its restored positions needed: they leave memory and the
     * store now, not when the job is forgotten (--max-exclude-total-runs
     * counts running jobs only, so ended ones must not keep theirs). */
    if (sl_posbits_units(&j->exclude) > 0 || j->exclude_dirty) {
        sl_posbits_clear(&j->exclude);
        j->exclude_dirty = false;
        queue_del(st, SL_DT_EXCLUDE, j->id);
    }
    if (why)
        snprintf(j->error, sizeof j->error, "%s", why);
    sl_log_info("job %" PRIu64 "%s%s%s %s%s%s", j->id, j->name[0] ? " \"" : "", j->name, j->name[0] ? "\"" : "",
                sl__job_state_names[next], why ? ": " : "", why ? why : "");
}

/* A job is finished once no task can produce any more, and one finished
 * by itself: a task that ended only because its worker was drained does
 * not count while DYNAMIC splits are left, which wait for another worker. */
static void job_check_finished(sl_dstate_t *st, struct job *j)
{
    if (j->state != SL_JOB_RUNNING)
        return;
    /* DYNAMIC: not before every split reached its clients (a worker lost
     * now would have some handed out again). */
    if (sl__out_tracked(j) && sl__out_pending(j))
        return;
    bool splits_left = j->sharding == SL_SHARDING_DYNAMIC && j->split_file < sl__dataset_num_files(j->dataset);
    bool any_done = false;
    for (unsigned k = 0; k < j->num_tasks; k++) {
        const struct task *t = &j->tasks[k];
        if (sl__task_live(t))
            return;
        const struct worker *w = sl__dstate_worker(st, t->worker_id);
        /* Coordinated reads have no end of their own: a task done because
         * its worker was drained (coord_drained_done()) ends nothing. */
        bool drained_rounds = j->num_consumers > 0 && t->end_round > 0;
        any_done |= t->state == TASK_DONE && !drained_rounds && (!splits_left || !w || !w->draining);
    }
    /* Under a static policy every index owns its own shard: the job waits
     * for each one, also for an index whose worker was lost (it reads its
     * shard again from the start when it registers again). */
    if (any_done && is_static(j->sharding)) {
        for (unsigned i = 0; i < st->num_addresses; i++) {
            bool done = false;
            for (unsigned k = 0; k < j->num_tasks && !done; k++)
                done = j->tasks[k].worker_index == i && j->tasks[k].state == TASK_DONE;
            if (!done)
                return;
        }
    }
    if (any_done)
        job_set_state(st, j, SL_JOB_FINISHED, NULL);
}

/* Keeps the worker's counts and a smoothed byte rate for the admin views,
 * and its done_below (TaskInfo.probe_below). */
static void task_record_progress(struct task *t, const sluice_TaskStatus *ts, int64_t now)
{
    if (t->reported_at && now > t->reported_at && ts->bytes >= t->bytes) {
        double rate = (double)(ts->bytes - t->bytes) * 1000.0 / (double)(now - t->reported_at);
        t->bytes_per_s = t->bytes_per_s ? 0.7 * t->bytes_per_s + 0.3 * rate : rate;
    }
    t->batches = ts->batches;
    t->elements = ts->elements;
    t->bytes = ts->bytes;
    t->reported_at = now;
    t->worker_done_below = ts->done_below;
}

/* A DYNAMIC task held back at --max-outstanding-splits waits for its
 * clients to confirm splits. When every split it holds is one its worker has
 * not finished (its done_below is at or below the oldest), no client can;
 * when its pipeline also waits for a split (starved: not for buffer room, as
 * behind a consumer that pauses), it cannot finish one either. Its splits
 * may hold few records (a lost worker's, handed out again without what the
 * clients had): seen so, it gets a split at a time past the bound, up to
 * sl__held_cap() (handout.c: 64 more, at most twice the bound). Held
 * there, its buffers span more splits than that (a shuffle buffer far
 * larger than the splits), or it reads them
 * without making a batch (a skip past the data under a repeat, which then
 * takes epoch after epoch): past HELD_FAIL_MS of that the job fails, naming
 * the bound, rather than wait for ever. */
#define HELD_FAIL_MS 5000

static void task_check_held(sl_dstate_t *st, struct job *j, struct task *t, const sluice_TaskStatus *ts, int64_t now)
{
    bool full = t->held && ts->starved && sl__out_bounded(t) >= st->cfg.max_outstanding &&
                sl__out_oldest(t) >= ts->done_below;
    t->held = false;
    if (!full) {
        t->held_full_since = 0;
        return;
    }
    if (t->held_full_since == 0) {
        t->held_full_since = now;
        return;
    }
    if (now - t->held_full_since < HELD_FAIL_MS || sl__out_bounded(t) < sl__held_cap(st))
        return;
    char why[sizeof ((struct job *)0)->error];
    snprintf(why, sizeof why,
             "task %" PRIu64 " on worker %s holds %u splits it has not finished, --max-outstanding-splits %u "
             "and the most it gets past it, a split at a time, while none can finish, and cannot finish "
             "one without another: its pipeline's buffers (a shuffle buffer) span more splits than that, or it "
             "drops every element it reads (a skip or filter that leaves nothing, under a repeat, runs through "
             "epochs without end: the job is at epoch %" PRIu64
             "%s); raise --max-outstanding-splits or --split-size, or correct the spec",
             t->id, t->worker_address, sl__out_bounded(t), st->cfg.max_outstanding, j->split_epoch,
             t->batches == 0 ? " and the task has served no batch" : "");
    sl_log_error("job %" PRIu64 ": %s", j->id, why);
    job_set_state(st, j, SL_JOB_FAILED, why);
}

static struct task *job_task_of_worker(struct job *j, uint64_t worker_id)
{
    for (unsigned k = 0; k < j->num_tasks; k++)
        if (j->tasks[k].worker_id == worker_id)
            return &j->tasks[k];
    return NULL;
}

static int job_add_task(sl_dstate_t *st, struct job *j, struct worker *w)
{
    if (sl__dstate_grow(&j->tasks, &j->cap_tasks, j->num_tasks, sizeof *j->tasks) < 0)
        return -1;
    struct task *t = &j->tasks[j->num_tasks];
    uint32_t index = j->num_tasks;
    if (is_static(j->sharding)) {
        int a = address_index(st, w->address);
        index = a < 0 ? 0 : (uint32_t)a; /* registration refuses unlisted workers */
    }
    *t = (struct task){.id = st->next_id++, .worker_id = w->id, .state = TASK_ASSIGNED, .worker_index = index};
    /* A task that joins coordinated reads starts after every round a
     * consumer may already be in (see the top of this file). */
    if (j->num_consumers > 0 && j->started)
        t->start_round = j->round_horizon + 1;
    snprintf(t->worker_address, sizeof t->worker_address, "%s", w->address);
    if (sl__dstate_index_task(st, j, j->num_tasks) < 0)
        return -1;
    j->num_tasks++;
    j->dirty = true;
    sl__dstate_touch(st, j);
    w->notice = true;
    st->notices_due = true;
    return 0;
}

/* DYNAMIC: lost splits that every client answered for need a running task
 * to take them; when every task of the job has ended, a live worker gets a
 * new one (or the next worker to register does). */
static void job_ensure_task(sl_dstate_t *st, struct job *j)
{
    if (j->state != SL_JOB_RUNNING || !sl__out_tracked(j) || !sl__out_check_reports(st, j))
        return;
    for (unsigned k = 0; k < j->num_tasks; k++)
        if (sl__task_live(&j->tasks[k]))
            return;
    for (unsigned i = 0; i < st->num_workers; i++) {
        struct worker *w = &st->workers[i];
        if (w->state != WORKER_LIVE || w->draining || w->unconfirmed)
            continue;
        if (job_add_task(st, j, w) < 0) {
            sl_log_error("job %" PRIu64 ": out of memory for a task to take the lost splits", j->id);
            return;
        }
        sl_log_info("job %" PRIu64 ": task %" PRIu64 " on worker %s takes the lost workers' splits", j->id,
                    j->tasks[j->num_tasks - 1].id, w->address);
        return;
    }
}

/* Coordinated reads: where task t of job j stops serving rounds when its
 * worker is lost or drained now: past the horizon, up to which a consumer
 * may have asked already, so that every consumer learns of it before it
 * gets there (an empty range for a task that starts past it). */
static uint64_t rounds_end_now(const struct job *j, const struct task *t)
{
    return j->round_horizon + 1 > t->start_round ? j->round_horizon + 1 : t->start_round;
}

static void worker_lose(sl_dstate_t *st, struct worker *w, const char *why)
{
    if (w->state == WORKER_LOST)
        return;
    w->state = WORKER_LOST;
    w->dirty = true;
    st->workers_dirty = true;
    snprintf(w->why_lost, sizeof w->why_lost, "%s", why);
    sl_log_warn("worker %" PRIu64 " at %s lost: %s", w->id, w->address, why);
    for (unsigned i = 0; i < st->num_jobs; i++) {
        struct job *j = st->jobs[i];
        bool lost_one = false;
        for (unsigned k = 0; k < j->num_tasks; k++) {
            struct task *t = &j->tasks[k];
            if (t->worker_id != w->id)
                continue;
            bool active = sl__task_live(t);
            /* A task that ended while its clients had not all of it yet. */
            bool unfinished = t->state == TASK_DONE && j->state == SL_JOB_RUNNING && sl__out_count(t) > 0;
            if (!active && !unfinished)
                continue;
            if (j->num_consumers > 0 && active)
                t->end_round = rounds_end_now(j, t);
            task_set_state(st, j, t, TASK_LOST);
            if (j->state == SL_JOB_RUNNING)
                sl__out_orphan(st, j, t);
            lost_one = true;
        }
        if (lost_one) {
            job_ensure_task(st, j);
            job_check_finished(st, j);
        }
    }
}

int sl_dstate_worker_register(sl_dstate_t *st, const char *address, int64_t now, uint64_t *worker_id,
                              char *err, size_t errlen)
{
    if (st->num_addresses > 0 && address_index(st, address) < 0) {
        size_t o = (size_t)snprintf(err, errlen, "worker %s refused: it is not in the dispatcher's --worker-addresses (",
                                    address);
        for (unsigned i = 0; i < st->num_addresses && o < errlen; i++)
            o += (size_t)snprintf(err + o, errlen - o, "%s%s", i ? "," : "", st->addresses[i]);
        if (o < errlen)
            snprintf(err + o, errlen - o, ")");
        return SL_EREFUSED;
    }
    unsigned live = 0;
    for (unsigned i = 0; i < st->num_workers; i++) {
        struct worker *w = &st->workers[i];
        if (w->state == WORKER_LIVE && strcmp(w->address, address) == 0)
            worker_lose(st, w, "registered again (restarted)");
        live += w->state == WORKER_LIVE;
    }
    if (live >= st->cfg.max_workers) {
        st->workers_refused++;
        sl_errf(err, errlen, SL_ETOOBIG,
                "worker %s refused: %u workers are live, as many as --max-workers allows (a worker without "
                "heartbeat for --worker-timeout-ms %" PRId64 " ms is lost and frees its place)",
                address, st->cfg.max_workers, st->cfg.worker_timeout_ms);
        sl_log_warn("%s", err);
        return SL_ETOOBIG;
    }
    /* Lost workers are forgotten once the table is full of them. */
    if (st->num_workers >= st->cfg.max_workers) {
        unsigned k = 0;
        for (unsigned i = 0; i < st->num_workers; i++) {
            if (st->workers[i].state == WORKER_LIVE)
                st->workers[k++] = st->workers[i];
            else
                queue_del(st, SL_DT_WORKERS, st->workers[i].id);
        }
        st->num_workers = k;
    }
    if (sl__dstate_grow(&st->workers, &st->cap_workers, st->num_workers, sizeof *st->workers) < 0) {
        return sl_errf(err, errlen, -ENOMEM, "out of memory");
    }
    struct worker *w = &st->workers[st->num_workers++];
    *w = (struct worker){.id = st->next_id++, .state = WORKER_LIVE, .joined = now, .last_seen = now, .dirty = true};
    st->workers_dirty = true;
    snprintf(w->address, sizeof w->address, "%s", address);
    *worker_id = w->id;
    sl_log_info("worker %" PRIu64 " joined from %s", w->id, w->address);
    /* A worker that joins mid-job takes part in every running job. */
    for (unsigned i = 0; i < st->num_jobs; i++) {
        struct job *j = st->jobs[i];
        if (j->state == SL_JOB_RUNNING && job_add_task(st, j, w) < 0) {
            return sl_errf(err, errlen, -ENOMEM, "out of memory");
        }
    }
    return 0;
}

/* A worker loaded from the store is heard from again: it takes part in the
 * running jobs created while it was unconfirmed, as a new worker would. */
static int worker_confirm(sl_dstate_t *st, struct worker *w)
{
    if (!w->unconfirmed)
        return 0;
    w->unconfirmed = false;
    for (unsigned i = 0; i < st->num_jobs; i++) {
        struct job *j = st->jobs[i];
        if (j->state == SL_JOB_RUNNING && !w->draining && !job_task_of_worker(j, w->id) &&
            job_add_task(st, j, w) < 0)
            return -ENOMEM;
        job_ensure_task(st, j);
    }
    return 0;
}

int sl_dstate_worker_resume(sl_dstate_t *st, const char *address, uint64_t worker_id, int64_t now)
{
    struct worker *w = sl__dstate_worker(st, worker_id);
    if (!w || w->state != WORKER_LIVE || strcmp(w->address, address) != 0)
        return SL_ENOTFOUND;
    w->last_seen = now;
    sl_log_info("worker %" PRIu64 " at %s reconnected", w->id, w->address);
    return worker_confirm(st, w);
}

/* Whether the worker's task ts is another than this state's task of its id
 * in job j: a task of a state this one was restored from a backup of, whose
 * ids this state gives out again (the job's nonce tells them apart; a
 * worker that reports none is taken at its word). */
static bool stale(const sluice_TaskStatus *ts, const struct job *j)
{
    return ts->job_nonce != 0 && ts->job_nonce != j->nonce;
}

static bool reported(const sluice_WorkerHeartbeatRequest *req, const struct job *j, const struct task *t)
{
    for (pb_size_t i = 0; i < req->tasks_count; i++)
        if (req->tasks[i].task_id == t->id && !stale(&req->tasks[i], j))
            return true;
    return false;
}

int sl_dstate_worker_heartbeat(sl_dstate_t *st, const sluice_WorkerHeartbeatRequest *req, int64_t now,
                               sluice_WorkerHeartbeatResponse *resp, char *err, size_t errlen)
{
    clock_at(st, now);
    struct worker *w = sl__dstate_worker(st, req->worker_id);
    if (!w || w->state != WORKER_LIVE) {
        return sl_errf(err, errlen, SL_ENOTFOUND,
                       "worker %" PRIu64 " is not registered (or was declared lost): register again",
                   req->worker_id);
    }
    /* Another worker's task: refused whole, before anything changes. */
    for (pb_size_t i = 0; i < req->tasks_count; i++) {
        struct job *oj = NULL;
        const struct task *ot = sl__dstate_task(st, req->tasks[i].task_id, &oj);
        if (ot && !stale(&req->tasks[i], oj) && !sl__dstate_worker_owns_task(st, w, ot)) {
            return sl_errf(err, errlen, SL_EPERM,
                           "worker %" PRIu64 " reported task %" PRIu64 ", which is not one of its tasks: "
                           "heartbeat refused, nothing changed", w->id, ot->id);
        }
    }
    w->last_seen = now;
    if (worker_confirm(st, w) < 0) {
        return sl_errf(err, errlen, -ENOMEM, "out of memory");
    }
    /* Alive but stuck: its heartbeats come, its pipeline makes nothing. */
    for (pb_size_t i = 0; i < req->tasks_count && st->cfg.stall_timeout_ms > 0; i++) {
        struct job *sj = NULL;
        const struct task *stk = sl__dstate_task(st, req->tasks[i].task_id, &sj);
        /* Only its own running tasks count: a task of the id it had before
         * (still unwinding) is dropped through removed_tasks below. */
        if (!stk || stk->worker_id != w->id || stale(&req->tasks[i], sj) || !sl__task_live(stk))
            continue;
        if (req->tasks[i].state == SL_TASK_RUNNING && req->tasks[i].stalled_ms > (uint64_t)st->cfg.stall_timeout_ms) {
            char why[200];
            snprintf(why, sizeof why, "stuck: task %" PRIu64 " made no batch for %" PRIu64 " ms while not waiting "
                     "for input (--stall-timeout-ms %" PRId64 ")", req->tasks[i].task_id, req->tasks[i].stalled_ms,
                     st->cfg.stall_timeout_ms);
            worker_lose(st, w, why);
            return sl_errf(err, errlen, SL_ENOTFOUND,
                           "worker %" PRIu64 " was declared lost: %s; register again", w->id, why);
        }
    }
    for (pb_size_t i = 0; i < req->tasks_count; i++) {
        const sluice_TaskStatus *ts = &req->tasks[i];
        struct job *j = NULL;
        struct task *t = sl__dstate_task(st, ts->task_id, &j);
        /* A drained worker's task of coordinated reads is done once every
         * consumer went past its rounds: the worker lets it go. */
        bool rounds_done = t && j->num_consumers > 0 && t->end_round > 0 && t->state == TASK_DONE;
        if (!t || t->worker_id != w->id || j->state != SL_JOB_RUNNING || stale(ts, j) || rounds_done) {
            if (resp->removed_tasks_count < sizeof resp->removed_tasks / sizeof resp->removed_tasks[0])
                resp->removed_tasks[resp->removed_tasks_count++] = ts->task_id;
            continue;
        }
        if (!sl__task_live(t))
            continue;
        task_record_progress(t, ts, now);
        if (ts->state == SL_TASK_RUNNING) {
            task_set_state(st, j, t, TASK_RUNNING);
            task_check_held(st, j, t, ts, now);
        } else if (ts->state == SL_TASK_DONE) {
            task_set_state(st, j, t, TASK_DONE);
            sl__out_unreceived(st, j, t, ts->done_below);
            job_ensure_task(st, j); /* t may move */
            job_check_finished(st, j);
        } else if (ts->state == SL_TASK_FAILED) {
            task_set_state(st, j, t, TASK_FAILED);
            char why[700];
            snprintf(why, sizeof why, "worker %s: %s", w->address, ts->error);
            job_set_state(st, j, SL_JOB_FAILED, why);
        }
    }
    w->notice = false; /* this answer lists them */
    for (unsigned i = 0; i < st->num_jobs; i++) {
        struct job *j = st->jobs[i];
        if (j->state != SL_JOB_RUNNING)
            continue;
        /* A worker may hold a second task of a job: one that takes lost
         * splits after its first ended. */
        for (unsigned k = 0; k < j->num_tasks; k++) {
            struct task *t = &j->tasks[k];
            if (t->worker_id != w->id || t->state != TASK_ASSIGNED || reported(req, j, t))
                continue;
            if (resp->new_tasks_count >= sizeof resp->new_tasks / sizeof resp->new_tasks[0]) {
                w->notice = true; /* the rest go out with the next heartbeat, at once */
                st->notices_due = true;
                return 0;
            }
            sluice_TaskDef *d = &resp->new_tasks[resp->new_tasks_count++];
            d->task_id = t->id;
            d->job_id = j->id;
            d->job_nonce = j->nonce;
            d->dataset_id = j->dataset->id;
            d->sharding = j->effective;
            d->worker_index = t->worker_index;
            d->num_workers = is_static(j->sharding) ? st->num_addresses : j->num_tasks;
            d->num_consumers = j->num_consumers;
            /* A static shard skips the positions itself (DYNAMIC: the
             * dispatcher's splits do). */
            d->exclusions = is_static(j->sharding) && sl_posbits_units(&j->exclude) > 0;
            memcpy(d->task_key, sl__dstate_task_key(st, j, t), sizeof d->task_key);
            d->client_keys = true;
        }
    }
    return 0;
}

static uint64_t dataset_reader(const sl_dstate_t *st, const struct dataset *d);
static void dataset_drop(sl_dstate_t *st, unsigned di);

/* The registered dataset of spec (the same canonical text) and name ("":
 * none), or NULL. */
static struct dataset *dataset_of_spec(const sl_dstate_t *st, const sl_spec_t *spec, const char *name)
{
    const char *canon = sl_spec_canonical(spec);
    const char *fp = sl_spec_fingerprint(spec);
    for (unsigned i = 0; i < st->num_datasets; i++) {
        struct dataset *d = st->datasets[i];
        /* The fingerprint is only a hash: equal text is what makes two
         * specs one dataset. */
        if (strcmp(d->fingerprint, fp) == 0 && strcmp(d->canonical, canon) == 0 && strcmp(d->name, name) == 0)
            return d;
    }
    return NULL;
}

static struct dataset *dataset_of_name(const sl_dstate_t *st, const char *name)
{
    for (unsigned i = 0; name[0] && i < st->num_datasets; i++)
        if (strcmp(st->datasets[i]->name, name) == 0)
            return st->datasets[i];
    return NULL;
}

bool sl_dstate_dataset_known(const sl_dstate_t *st, const sl_spec_t *spec, const char *name)
{
    name = name ? name : "";
    return dataset_of_spec(st, spec, name) != NULL || dataset_of_name(st, name) != NULL;
}

int sl_dstate_dataset_name_check(const char *name, char *err, size_t errlen)
{
    if (!name || !name[0])
        return 0;
    size_t n = strlen(name);
    if (n >= SL_DATASET_NAME_MAX)
        return sl_errf(err, errlen, SL_EINVAL, "dataset name of %zu bytes: at most %d", n, SL_DATASET_NAME_MAX - 1);
    bool digits = true;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)name[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || strchr("_.:/-", ch)))
            return sl_errf(err, errlen, SL_EINVAL,
                           "dataset name \"%.*s\": character %zu is not one of [A-Za-z0-9_.:/-]", (int)n, name, i);
        digits = digits && ch >= '0' && ch <= '9';
    }
    if (digits)
        return sl_errf(err, errlen, SL_EINVAL, "dataset name \"%s\" is all digits, which is how dataset ids are "
                       "written: give it a letter", name);
    return 0;
}

int sl_dstate_dataset_lookup(const sl_dstate_t *st, uint64_t id, const char *name, uint64_t *id_out,
                             const char **canonical, const char **fingerprint, const char **name_out, char *err,
                             size_t errlen)
{
    const struct dataset *d = id ? sl__dstate_dataset(st, id) : dataset_of_name(st, name ? name : "");
    if (!d) {
        if (id)
            return sl_errf(err, errlen, SL_ENOTFOUND, "dataset %" PRIu64 " is not registered", id);
        return sl_errf(err, errlen, SL_ENOTFOUND, "no dataset is registered under the name \"%s\" (datasets "
                       "no job read for --dataset-gc-timeout-ms are deleted: register it again)", name ? name : "");
    }
    *id_out = d->id;
    *canonical = d->canonical;
    *fingerprint = d->fingerprint;
    *name_out = d->name;
    return 0;
}

int sl_dstate_dataset_register(sl_dstate_t *st, const char *spec_text, size_t len, uint64_t *dataset_id,
                               const char **fingerprint, char *err, size_t errlen)
{
    return sl_dstate_dataset_register_counted(st, spec_text, len, NULL, NULL, dataset_id, fingerprint, err, errlen);
}

int sl_dstate_dataset_register_counted(sl_dstate_t *st, const char *spec_text, size_t len, const char *name,
                                       sl_file_list_t *counted, uint64_t *dataset_id, const char **fingerprint,
                                       char *err, size_t errlen)
{
    sl_spec_t *spec = NULL;
    name = name ? name : "";
    int rc = sl_dstate_dataset_name_check(name, err, errlen);
    if (rc < 0)
        return rc;
    rc = sl_spec_parse(spec_text, len, &spec, err, errlen);
    if (rc < 0)
        return rc;
    const char *canon = sl_spec_canonical(spec);
    const char *fp = sl_spec_fingerprint(spec);
    const struct dataset *known = dataset_of_spec(st, spec, name);
    if (known) {
        *dataset_id = known->id;
        *fingerprint = known->fingerprint;
        sl_spec_free(spec);
        return 0;
    }
    const struct dataset *named = dataset_of_name(st, name);
    if (named) {
        rc = sl_errf(err, errlen, SL_ECONFLICT,
                     "dataset name \"%s\" is registered with another spec (dataset %" PRIu64 ", fingerprint %s; "
                     "this spec's is %s): pick another name, or delete that dataset first", name, named->id,
                     named->fingerprint, fp);
        goto out;
    }
    if (st->num_datasets >= st->cfg.max_datasets) {
        /* Full: the dataset no running job read for the longest goes (a
         * client registers its spec again before it joins a job, and gets
         * the same dataset back as a new one). */
        int oldest = -1;
        for (unsigned i = 0; i < st->num_datasets; i++)
            if (!dataset_reader(st, st->datasets[i]) &&
                (oldest < 0 || st->datasets[i]->last_used < st->datasets[oldest]->last_used))
                oldest = (int)i;
        if (oldest < 0) {
            snprintf(err, errlen, "dataset refused: %u datasets are registered, as many as --max-datasets allows, "
                     "each read by a running job", st->cfg.max_datasets);
            st->datasets_refused++;
            sl_log_warn("%s", err);
            rc = SL_ELIMIT;
            goto out;
        }
        sl_log_info("dataset %" PRIu64 " deleted to make room: the registry is full (%u datasets)",
                    st->datasets[oldest]->id, st->cfg.max_datasets);
        dataset_drop(st, (unsigned)oldest);
    }
    /* A file source is expanded and counted at registration: a path
     * outside the data roots is refused, and DYNAMIC splits need counts.
     * The server counts off its event loop and hands the list in. */
    sl_file_list_t files = {0};
    if (counted) {
        files = *counted;
        memset(counted, 0, sizeof *counted);
    } else if (sl_spec_source_num_patterns(spec) > 0) {
        rc = sl_file_list_resolve(spec, st->cfg.roots, (int)st->cfg.max_files, &files, err, errlen);
        if (rc < 0)
            goto out;
    }
    char *copy = strdup(canon);
    struct dataset *d = calloc(1, sizeof *d);
    if (!copy || !d || sl__dstate_grow(&st->datasets, &st->cap_datasets, st->num_datasets, sizeof *st->datasets) < 0) {
        free(copy);
        free(d);
        sl_file_list_clear(&files);
        snprintf(err, errlen, "out of memory");
        rc = -ENOMEM;
        goto out;
    }
    st->datasets[st->num_datasets++] = d;
    *d = (struct dataset){.id = st->next_id++, .canonical = copy, .cardinality = sl_spec_source_cardinality(spec),
                          .files = files, .split_size = split_size_for(spec, st->cfg.split_size)};
    if (files.num_files > 0)
        d->cardinality = (int64_t)files.total;
    d->hint_op = sl_policy_hint_op(spec);
    d->infinite = sl_policy_infinite(spec, d->cardinality);
    d->passes = sl_policy_source_passes(spec);
    d->last_used = st->now;
    d->dirty = true;
    st->datasets_dirty = true;
    snprintf(d->fingerprint, sizeof d->fingerprint, "%s", fp);
    snprintf(d->name, sizeof d->name, "%s", name);
    *dataset_id = d->id;
    *fingerprint = d->fingerprint;
    sl_log_info("dataset %" PRIu64 " registered, fingerprint %s%s%s%s", d->id, d->fingerprint,
                name[0] ? ", name \"" : "", name, name[0] ? "\"" : "");
out:
    sl_spec_free(spec);
    return rc;
}

const char *sl_dstate_dataset_spec(const sl_dstate_t *st, uint64_t dataset_id)
{
    const struct dataset *d = sl__dstate_dataset(st, dataset_id);
    return d ? d->canonical : NULL;
}

static void job_remove_client(sl_dstate_t *st, struct job *j, struct client *c, bool gave_back, int64_t now);
static struct client *longest_away(struct job *j);

static struct gone_consumer *gone_find(struct job *j, uint32_t consumer_index)
{
    for (unsigned i = 0; i < j->num_gone; i++)
        if (j->gone[i].consumer_index == consumer_index)
            return &j->gone[i];
    return NULL;
}

static void gone_forget(struct job *j, uint32_t consumer_index)
{
    struct gone_consumer *g = gone_find(j, consumer_index);
    if (g)
        *g = j->gone[--j->num_gone];
}

/* Client c of a running coordinated job leaves for good: its index's next
 * client starts at its round (job_add_client()). */
static void gone_note(sl_dstate_t *st, struct job *j, const struct client *c, int64_t now)
{
    struct gone_consumer *g = gone_find(j, c->consumer_index);
    if (!g && j->num_gone >= st->cfg.max_clients_per_job) {
        unsigned oldest = 0;
        for (unsigned i = 1; i < j->num_gone; i++)
            if (j->gone[i].since < j->gone[oldest].since)
                oldest = i;
        g = &j->gone[oldest];
    } else if (!g) {
        if (sl__dstate_grow(&j->gone, &j->cap_gone, j->num_gone, sizeof *j->gone) < 0) {
            sl_log_warn("job %" PRIu64 ": out of memory: the next client of consumer_index %u starts at round 0",
                        j->id, c->consumer_index);
            return;
        }
        g = &j->gone[j->num_gone++];
    }
    *g = (struct gone_consumer){.consumer_index = c->consumer_index, .round = c->round,
                                .since = c->away_since ? c->away_since : now};
}

/* Whether a consumer of job j left within client_rejoin_ms: it may come
 * back with the others of a restart. */
static bool gone_lately(const sl_dstate_t *st, const struct job *j, int64_t now)
{
    for (unsigned i = 0; i < j->num_gone; i++)
        if (now - j->gone[i].since <= st->cfg.client_rejoin_ms)
            return true;
    return false;
}

/* The first round a client that came in place of an away or gone one
 * hands its caller (coordinated reads): while a restart is under way (a
 * client that came in place of another is aligning: others are away, or
 * left lately), where the first of the restart started, so that every
 * consumer restarted with it starts at that one round, whatever the others
 * read since; else the largest round any other consumer of job j was at
 * (an away or gone one where it stopped, a present one where it is), or
 * its predecessor's round if that is larger. Consumers restarted together
 * thus start their callers at one round, whichever of them comes first,
 * though their predecessors stopped as far apart as their windows of
 * rounds in flight. */
static uint64_t aligned_start(const struct job *j, uint64_t round)
{
    for (unsigned i = 0; i < j->num_clients; i++) {
        const struct client *o = &j->clients[i];
        if (o->aligning && !o->away_since)
            return o->start_round > round ? o->start_round : round;
    }
    for (unsigned i = 0; i < j->num_clients; i++)
        if (j->clients[i].round > round)
            round = j->clients[i].round;
    for (unsigned i = 0; i < j->num_gone; i++)
        if (j->gone[i].round > round)
            round = j->gone[i].round;
    return round;
}

/* Ends a restart once no consumer of job j is away or left lately (each
 * index has its client again, or the others are gone for good): a later
 * one aligns with where the consumers are, not where they began. */
static void restart_over_if_none_away(sl_dstate_t *st, struct job *j, int64_t now)
{
    for (unsigned i = 0; i < j->num_clients; i++)
        if (j->clients[i].away_since != 0)
            return;
    if (gone_lately(st, j, now))
        return;
    for (unsigned i = 0; i < j->num_clients; i++) {
        if (j->clients[i].aligning) {
            j->clients[i].aligning = false; /* stored */
            j->dirty = true;
            sl__dstate_touch(st, j);
        }
    }
}

/* Adds a client to job j; *replaced says whether it came in place of an
 * away or gone client of its consumer index (coordinated reads), whose
 * round it asks from (and hands its caller from aligned_start()). */
static int job_add_client(sl_dstate_t *st, struct job *j, const sluice_GetOrCreateJobRequest *req,
                          const char *host, int64_t now, uint64_t *client_id, bool *replaced, char *err,
                          size_t errlen)
{
    /* A client that comes in place of an away one (a restarted trainer)
     * takes its consumer index and round; one more than the limit, its
     * place. */
    uint64_t round = 0;
    *replaced = false;
    for (unsigned i = 0; j->num_consumers > 0 && i < j->num_clients; i++) {
        if (j->clients[i].away_since && j->clients[i].consumer_index == req->consumer_index) {
            sl_log_warn("job %" PRIu64 ": client %" PRIu64 ", away for %" PRId64 " ms, released: a new client "
                        "takes its consumer_index %u, from round %" PRIu64, j->id, j->clients[i].id,
                        now - j->clients[i].away_since, req->consumer_index, j->clients[i].round);
            round = j->clients[i].round;
            *replaced = true;
            job_remove_client(st, j, &j->clients[i], false, now);
            break;
        }
    }
    /* Or in place of one that left for good while the job ran (it closed
     * its iterator: a trainer stopped cleanly and started again). */
    const struct gone_consumer *g = !*replaced && j->num_consumers > 0 ? gone_find(j, req->consumer_index) : NULL;
    if (g) {
        sl_log_warn("job %" PRIu64 ": a new client takes consumer_index %u, whose client left %" PRId64 " ms ago, "
                    "from round %" PRIu64, j->id, req->consumer_index, now - g->since, g->round);
        round = g->round;
        *replaced = true;
    }
    struct client *away = j->num_clients >= st->cfg.max_clients_per_job ? longest_away(j) : NULL;
    if (away) {
        sl_log_warn("job %" PRIu64 ": client %" PRIu64 ", away for %" PRId64 " ms, released: the job is at its "
                    "limit of %u clients", j->id, away->id, now - away->away_since, st->cfg.max_clients_per_job);
        job_remove_client(st, j, away, false, now);
    }
    if (j->num_clients >= st->cfg.max_clients_per_job) {
        return sl_errf(err, errlen, SL_ETOOBIG,
                       "job %" PRIu64 " has %u clients, the limit", j->id, st->cfg.max_clients_per_job);
    }
    if (sl__dstate_grow(&j->clients, &j->cap_clients, j->num_clients, sizeof *j->clients) < 0) {
        return sl_errf(err, errlen, -ENOMEM, "out of memory");
    }
    uint64_t start = *replaced ? aligned_start(j, round) : 0;
    if (start > round)
        sl_log_warn("job %" PRIu64 ": the new client of consumer_index %u drops rounds %" PRIu64 " to %" PRIu64
                    ": another consumer of the job was at round %" PRIu64, j->id, req->consumer_index, round,
                    start - 1, start);
    struct client *c = &j->clients[j->num_clients++];
    *c = (struct client){.id = st->next_id++, .last_seen = now, .progress_at = now, .consumer_index = req->consumer_index,
                         .round = round, .target = (sl_target_workers_t)req->target_workers, .replaced = *replaced,
                         .aligning = *replaced, .start_round = start};
    snprintf(c->host, sizeof c->host, "%s", host ? host : "");
    if (j->num_consumers > 0)
        gone_forget(j, req->consumer_index);
    restart_over_if_none_away(st, j, now);
    *client_id = c->id;
    j->dirty = true;
    sl__dstate_touch(st, j);
    return 0;
}

/* Takes job i out of memory (its records' deletion is the caller's). */
static void job_remove_at(sl_dstate_t *st, unsigned i)
{
    sl__dstate_unindex_job(st, st->jobs[i]);
    job_free(st->jobs[i]);
    memmove(&st->jobs[i], &st->jobs[i + 1], (st->num_jobs - i - 1) * sizeof *st->jobs);
    st->num_jobs--;
}

void sl__dstate_forget_job(sl_dstate_t *st, uint64_t id)
{
    for (unsigned i = 0; i < st->num_jobs; i++) {
        if (st->jobs[i]->id == id) {
            job_remove_at(st, i);
            return;
        }
    }
}

void sl__dstate_forget_dataset(sl_dstate_t *st, uint64_t id)
{
    for (unsigned i = 0; i < st->num_datasets; i++) {
        if (st->datasets[i]->id != id)
            continue;
        sl__dataset_free(st->datasets[i]);
        memmove(&st->datasets[i], &st->datasets[i + 1], (st->num_datasets - i - 1) * sizeof *st->datasets);
        st->num_datasets--;
        return;
    }
}

int sl_dstate_forget_held_back(sl_dstate_t *st, const char *kind, uint64_t id, char *err, size_t errlen)
{
    const struct quarantined *q = sl__dstate_held_back(st, kind, id);
    if (!q)
        return sl_errf(err, errlen, SL_ENOTFOUND, "no %s %" PRIu64 " is held back (GET /v1/quarantine lists what is)",
                       kind, id);
    unsigned i = (unsigned)(q - st->quarantine);
    if (strcmp(kind, "job") == 0) {
        /* Its tasks' last hand-outs stay: their ids were in the record. */
        queue_del(st, SL_DT_JOBS, id);
        queue_del(st, SL_DT_CURSORS, id);
        queue_del(st, SL_DT_EXCLUDE, id);
        sl__dstate_del(st, SL_DT_OUTSTANDING, id, UINT64_MAX);
    } else {
        queue_del(st, strcmp(kind, "dataset") == 0 ? SL_DT_DATASETS : SL_DT_WORKERS, id);
    }
    sl_log_warn("%s %" PRIu64 ", held back since the start (%s), is forgotten: its records are deleted from the state "
                "store", kind, id, st->quarantine[i].why);
    memmove(&st->quarantine[i], &st->quarantine[i + 1], (st->num_quarantine - i - 1) * sizeof *st->quarantine);
    st->num_quarantine--;
    return 0;
}

const char *sl_dstate_job_held_back(const sl_dstate_t *st, uint64_t id)
{
    const struct quarantined *q = sl__dstate_held_back(st, "job", id);
    return q ? q->why : NULL;
}

/* Forgets an ended job i, in memory and (at the next commit) in the store. */
static void job_drop(sl_dstate_t *st, unsigned i)
{
    struct job *old = st->jobs[i];
    queue_del(st, SL_DT_JOBS, old->id);
    queue_del(st, SL_DT_CURSORS, old->id);
    if (sl_posbits_units(&old->exclude) > 0)
        queue_del(st, SL_DT_EXCLUDE, old->id);
    for (unsigned k = 0; k < old->num_tasks; k++)
        if (old->tasks[k].last_splits)
            queue_del(st, SL_DT_HANDOUTS, old->tasks[k].id);
    job_remove_at(st, i);
}

/* Makes room for one more job by forgetting the oldest job that ended. */
static int jobs_make_room(sl_dstate_t *st)
{
    if (st->num_jobs < st->cfg.max_jobs)
        return sl__dstate_grow(&st->jobs, &st->cap_jobs, st->num_jobs, sizeof *st->jobs);
    /* An ended named job not yet collected goes last: while it is kept, a
     * late client of it sees its end rather than the data again. */
    for (int pass = 0; pass < 2; pass++) {
        for (unsigned i = 0; i < st->num_jobs; i++) {
            const struct job *j = st->jobs[i];
            if (j->state != SL_JOB_RUNNING && (pass == 1 || !j->name[0] || j->collected)) {
                job_drop(st, i);
                return 0;
            }
        }
    }
    return -1;
}

/* @return the id of a running job that reads dataset d, 0 if none */
static uint64_t dataset_reader(const sl_dstate_t *st, const struct dataset *d)
{
    for (unsigned i = 0; i < st->num_jobs; i++)
        if (st->jobs[i]->dataset == d && st->jobs[i]->state == SL_JOB_RUNNING)
            return st->jobs[i]->id;
    return 0;
}

/* Deletes dataset di, which no running job reads, with the ended jobs that
 * read it. */
static void dataset_drop(sl_dstate_t *st, unsigned di)
{
    struct dataset *d = st->datasets[di];
    for (unsigned i = 0; i < st->num_jobs;) {
        if (st->jobs[i]->dataset == d)
            job_drop(st, i);
        else
            i++;
    }
    queue_del(st, SL_DT_DATASETS, d->id);
    sl__dataset_free(d);
    memmove(&st->datasets[di], &st->datasets[di + 1], (st->num_datasets - di - 1) * sizeof *st->datasets);
    st->num_datasets--;
}

int sl_dstate_dataset_delete(sl_dstate_t *st, uint64_t id, char *err, size_t errlen)
{
    for (unsigned i = 0; i < st->num_datasets; i++) {
        if (st->datasets[i]->id != id)
            continue;
        uint64_t reader = dataset_reader(st, st->datasets[i]);
        if (reader)
            return sl_errf(err, errlen, SL_ECONFLICT,
                           "dataset %" PRIu64 " is read by running job %" PRIu64 ": cancel the job first", id, reader);
        dataset_drop(st, i);
        sl_log_info("dataset %" PRIu64 " deleted", id);
        return 0;
    }
    return sl_errf(err, errlen, SL_ENOTFOUND, "dataset %" PRIu64 " is not registered", id);
}

/* Deletes datasets that no running job read for dataset_gc_timeout_ms. */
static void datasets_collect(sl_dstate_t *st, int64_t now)
{
    for (unsigned i = 0; i < st->num_datasets;) {
        struct dataset *d = st->datasets[i];
        if (d->last_used == 0 || dataset_reader(st, d)) {
            d->last_used = now;
            if (d->last_used - d->saved_used >= 60000) {
                d->dirty = true; /* stored once a minute at most */
                st->datasets_dirty = true;
            }
        }
        if (st->cfg.dataset_gc_timeout_ms > 0 && now - d->last_used > st->cfg.dataset_gc_timeout_ms) {
            sl_log_info("dataset %" PRIu64 " deleted: no running job read it for %" PRId64 " ms "
                        "(--dataset-gc-timeout-ms %" PRId64 ")", d->id, now - d->last_used,
                        st->cfg.dataset_gc_timeout_ms);
            st->datasets_collected++;
            dataset_drop(st, i);
        } else {
            i++;
        }
    }
}

/* Checks what a new job's policy needs of its dataset and the dispatcher's
 * configuration, and resolves FILE_OR_DATA. @return 0 or SL_EINVAL */
static int job_check_policy(const sl_dstate_t *st, const struct dataset *d, sl_sharding_t p,
                            sl_sharding_t *effective, char *err, size_t errlen)
{
    const char *policy = sl_sharding_name(p);
    *effective = p;
    if (d->hint_op >= 0 && p != SL_SHARDING_HINT) {
        return sl_errf(err, errlen, SL_EINVAL,
                       "dataset %" PRIu64 ": ops[%d] is a shard with num_shards \"hint\", which only HINT "
                   "sharding binds; this job's sharding is %s", d->id, d->hint_op, policy);
    }
    if (p == SL_SHARDING_DYNAMIC && d->cardinality < 0) {
        return sl_errf(err, errlen, SL_EINVAL,
                       "dynamic sharding needs a source of known size; dataset %" PRIu64 " has none", d->id);
    }
    if (!is_static(p))
        return 0;
    unsigned n = st->num_addresses;
    if (n == 0) {
        return sl_errf(err, errlen, SL_EINVAL,
                       "%s sharding needs the dispatcher's --worker-addresses: a worker's index is its place "
                   "in that list", policy);
    }
    if (p == SL_SHARDING_FILE_OR_DATA)
        *effective = (unsigned)d->files.num_files >= n ? SL_SHARDING_FILE : SL_SHARDING_DATA;
    if (*effective == SL_SHARDING_FILE && d->files.num_files == 0) {
        return sl_errf(err, errlen, SL_EINVAL,
                       "file sharding needs a file source; dataset %" PRIu64 " has no files (use data, "
                   "file_or_data or dynamic sharding)", d->id);
    }
    if (*effective == SL_SHARDING_FILE && (unsigned)d->files.num_files < n) {
        return sl_errf(err, errlen, SL_EINVAL,
                       "file sharding needs at least as many files as workers: dataset %" PRIu64
                   " has %zu files, --worker-addresses lists %u workers (file_or_data would pick data)", d->id,
                   (size_t)d->files.num_files, n);
    }
    if (p == SL_SHARDING_HINT && d->hint_op < 0) {
        return sl_errf(err, errlen, SL_EINVAL,
                       "hint sharding binds a shard op whose num_shards and index are \"hint\"; dataset %"
                   PRIu64 " has none", d->id);
    }
    return 0;
}

/* Checks a request for coordinated reads against the dataset, and against
 * the job it joins when j is not NULL. @return 0, SL_EINVAL or SL_ECONFLICT */
static int job_check_consumers(const sl_dstate_t *st, const sluice_GetOrCreateJobRequest *req,
                               const struct dataset *d, const struct job *j, char *err, size_t errlen)
{
    if (req->num_consumers == 0) {
        if (j && j->num_consumers > 0) {
            return sl_errf(err, errlen, SL_ECONFLICT,
                           "job \"%s\" has coordinated reads with %u consumers; this client asked for none "
                       "(give num_consumers %u and a consumer_index)", j->name, j->num_consumers, j->num_consumers);
        }
        return 0;
    }
    if (!req->job_name[0]) {
        return sl_errf(err, errlen, SL_EINVAL,
                       "coordinated reads (num_consumers %u) need a named job: the consumers share one job "
                   "by its name", req->num_consumers);
    }
    if (req->num_consumers > st->cfg.max_clients_per_job || req->consumer_index >= req->num_consumers) {
        return sl_errf(err, errlen, SL_EINVAL, "consumer_index %u is out of range: num_consumers is %u (at most %u)",
                   req->consumer_index, req->num_consumers, st->cfg.max_clients_per_job);
    }
    if (req->target_workers != SL_TARGET_ANY) {
        return sl_errf(err, errlen, SL_EINVAL,
                       "coordinated reads take every round from the job's workers in turn: target_workers "
                   "must be any, not %s", sl_target_workers_name((sl_target_workers_t)req->target_workers));
    }
    if (!d->infinite) {
        return sl_errf(err, errlen, SL_EINVAL,
                       "coordinated reads need an infinite dataset (a repeat without count, no take after "
                   "it): every round must have a batch for every consumer; dataset %" PRIu64 " ends", d->id);
    }
    if (!j)
        return 0;
    if (j->num_consumers != req->num_consumers) {
        return sl_errf(err, errlen, SL_ECONFLICT,
                       "job \"%s\" exists with num_consumers %u, requested %u", j->name, j->num_consumers,
                   req->num_consumers);
    }
    for (unsigned i = 0; i < j->num_clients; i++) {
        /* An away client's index goes to the one that asks (job_add_client()). */
        if (j->clients[i].consumer_index == req->consumer_index && !j->clients[i].away_since) {
            return sl_errf(err, errlen, SL_ECONFLICT,
                           "job \"%s\": consumer_index %u is taken by client %" PRIu64, j->name,
                       req->consumer_index, j->clients[i].id);
        }
    }
    return 0;
}

static struct client *job_find_client(struct job *j, uint64_t client_id)
{
    for (unsigned i = 0; i < j->num_clients; i++)
        if (j->clients[i].id == client_id)
            return &j->clients[i];
    return NULL;
}

/* The tasks of job j that client c reads, as it is to see them (at most
 * max): its first heartbeat's answer and each after it, and the answer to
 * its GET_OR_CREATE_JOB, with which it connects to its workers at once. */
static void list_tasks(sl_dstate_t *st, struct job *j, const struct client *c, sluice_TaskInfo *tasks,
                       pb_size_t *count, size_t max)
{
    for (unsigned k = 0; k < j->num_tasks && !c->late; k++) {
        struct task *t = &j->tasks[k];
        /* Coordinated reads list a lost task too: consumers need its rounds
         * to agree on who served which round. */
        if (t->state == TASK_LOST && (j->num_consumers == 0 || t->end_round <= t->start_round))
            continue;
        if (c->target == SL_TARGET_LOCAL && !sl_policy_is_local(t->worker_address, c->host))
            continue;
        if (*count >= max)
            break;
        sluice_TaskInfo *ti = &tasks[(*count)++];
        ti->task_id = t->id;
        ti->worker_id = t->worker_id;
        snprintf(ti->worker_address, sizeof ti->worker_address, "%s", t->worker_address);
        ti->start_round = t->start_round;
        ti->end_round = t->end_round;
        ti->lost = t->state == TASK_LOST;
        /* The client's own key to the task, not the task's (taskkey.h). */
        sl_task_client_key(sl__dstate_task_key(st, j, t), c->id, ti->task_key);
        if (sl__out_tracked(j))
            ti->probe_below = sl__out_probe_below(st, t, c);
    }
}

/* Leases a client id of job j for the caller, with its secret and the
 * tasks it reads (none when it came late: joined_ended()). */
static int joined(sl_dstate_t *st, struct job *j, const sluice_GetOrCreateJobRequest *req, const char *client_host,
                  int64_t now, bool late, sluice_GetOrCreateJobResponse *resp, char *err, size_t errlen)
{
    bool replaced;
    int rc = job_add_client(st, j, req, client_host, now, &resp->client_id, &replaced, err, errlen);
    if (rc < 0)
        return rc;
    sl_cap_client_secret(st->secret, j->id, resp->client_id, j->nonce, resp->client_secret);
    struct client *c = job_find_client(j, resp->client_id);
    if (c) {
        c->late = late;
        if (replaced) {
            /* Coordinated reads: it starts where the client it came in
             * place of was, and asks the rounds that one may have taken
             * (it never asked past the horizon) so that a taken batch gives
             * way to a new one (GetElementRequest.take_over). */
            resp->first_round = c->round;
            resp->take_over_below = j->round_horizon + 1;
            resp->deliver_from = c->start_round;
        }
        list_tasks(st, j, c, resp->tasks, &resp->tasks_count, sizeof resp->tasks / sizeof resp->tasks[0]);
    }
    return 0;
}

/* " repetition N" of a named job (for logs), "" for an anonymous one. */
static const char *repetition_text(const struct job *j)
{
    static _Thread_local char buf[40];
    if (!j->name[0])
        return "";
    snprintf(buf, sizeof buf, " repetition %" PRIu64, j->repetition);
    return buf;
}

/* A join of a named job's repetition that already ended: the client is
 * leased (so that a client of any version hears the end on its first
 * heartbeat) but listed no task, and told. It never reads the data again. */
static int joined_ended(sl_dstate_t *st, struct job *j, const sluice_GetOrCreateJobRequest *req,
                        const char *client_host, int64_t now, sluice_GetOrCreateJobResponse *resp, char *err,
                        size_t errlen)
{
    resp->job_id = j->id;
    int rc = joined(st, j, req, client_host, now, true, resp, err, errlen);
    if (rc < 0)
        return rc;
    snprintf(resp->notice, sizeof resp->notice, "job \"%s\" repetition %" PRIu64 " (id %" PRIu64 ") had already "
             "ended (%s) %" PRId64 " ms ago: this client gets its end at once and does not read it again (the next "
             "epoch is repetition %" PRIu64 ")", j->name, j->repetition, j->id, sl__job_state_names[j->state],
             j->ended > 0 && now > j->ended ? now - j->ended : 0, j->repetition + 1);
    sl_log_info("client %" PRIu64 ": %s", resp->client_id, resp->notice);
    return 0;
}

/* Forgets the collected jobs of (name, repetition) that no client holds:
 * the join that creates the repetition again replaces them. */
static void drop_collected(sl_dstate_t *st, const char *name, uint64_t repetition)
{
    for (unsigned i = 0; i < st->num_jobs;) {
        const struct job *o = st->jobs[i];
        if (o->collected && o->num_clients == 0 && o->repetition == repetition && strcmp(o->name, name) == 0)
            job_drop(st, i);
        else
            i++;
    }
}

/* The SHA-256 of a restore's done epochs (u64, little-endian), its place
 * within that epoch when it has one (u32 file, u64 record), and positions
 * (posset.h's bytes). */
static int restore_digest(const sluice_GetOrCreateJobRequest *req, const uint8_t *exclude, size_t len,
                          uint8_t out[32])
{
    /* The place within the epoch goes in only when there is one, so that
     * a job restored before it keeps its digest across an upgrade. */
    uint8_t le[20];
    sl_put_le64(le, req->restore_epochs_done);
    sl_put_le32(le + 8, req->restore_file);
    sl_put_le64(le + 12, req->restore_record);
    size_t n_le = req->restore_file > 0 || req->restore_record > 0 ? 20 : 8;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned n = 0;
    int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) && EVP_DigestUpdate(ctx, le, n_le) &&
             (len == 0 || EVP_DigestUpdate(ctx, exclude, len)) && EVP_DigestFinal_ex(ctx, out, &n) && n == 32;
    EVP_MD_CTX_free(ctx);
    return ok ? 0 : -ENOMEM;
}

static bool has_local_worker(const sl_dstate_t *st, const char *host)
{
    for (unsigned i = 0; i < st->num_workers; i++)
        if (st->workers[i].state == WORKER_LIVE && sl_policy_is_local(st->workers[i].address, host))
            return true;
    return false;
}

int sl_dstate_job_join(sl_dstate_t *st, const sluice_GetOrCreateJobRequest *req, const char *client_host,
                       const uint8_t *exclude, size_t exclude_len, int64_t now, sluice_GetOrCreateJobResponse *resp,
                       char *err, size_t errlen)
{
    if (exclude_len > 0 && (req->sharding == SL_SHARDING_OFF || req->num_consumers > 0 ||
                            (req->job_name[0] && req->sharding != SL_SHARDING_DYNAMIC))) {
        return sl_errf(err, errlen, SL_EINVAL,
                       "a restored iterator reads a job of its own with a sharding policy other than off, or a "
                       "named DYNAMIC job; no coordinated reads");
    }
    if (req->restore_epochs_done > 0 && (req->sharding != SL_SHARDING_DYNAMIC || req->num_consumers > 0)) {
        return sl_errf(err, errlen, SL_EINVAL,
                       "restore_epochs_done %" PRIu64 ": only a restored iterator of a DYNAMIC job skips "
                       "whole epochs", req->restore_epochs_done);
    }
    bool placed = req->restore_file > 0 || req->restore_record > 0;
    if (placed && (req->sharding != SL_SHARDING_DYNAMIC || req->num_consumers > 0)) {
        return sl_errf(err, errlen, SL_EINVAL,
                       "restore place (file %" PRIu32 ", record %" PRIu64 "): only a restored iterator of a DYNAMIC "
                       "job starts within an epoch", req->restore_file, req->restore_record);
    }
    if (req->restore_epochs_done > UINT32_MAX) {
        return sl_errf(err, errlen, SL_EINVAL, "restore_epochs_done %" PRIu64 " is past 2^32 epochs",
                       req->restore_epochs_done);
    }
    struct dataset *d = sl__dstate_dataset(st, req->dataset_id);
    if (!d) {
        return sl_errf(err, errlen, SL_ENOTFOUND, "dataset %" PRIu64 " is not registered", req->dataset_id);
    }
    uint32_t nfiles = sl__dataset_num_files(d);
    if (placed && (req->restore_file > nfiles ||
                   req->restore_record > (req->restore_file < nfiles ? sl__dataset_file_records(d, req->restore_file)
                                                                     : 0))) {
        return sl_errf(err, errlen, SL_EINVAL,
                       "restore place (file %" PRIu32 ", record %" PRIu64 ") is past the end of dataset %" PRIu64
                       "'s epoch (%" PRIu32 " files): the checkpoint is of another dataset's files",
                       req->restore_file, req->restore_record, d->id, nfiles);
    }
    /* Said on every answer that follows (one refused is not sent). */
    resp->restore_place_taken = placed;
    const char *policy = sl_sharding_name((sl_sharding_t)req->sharding);
    if (!policy) {
        return sl_errf(err, errlen, SL_EINVAL, "sharding policy %u is unknown", req->sharding);
    }
    const char *target = sl_target_workers_name((sl_target_workers_t)req->target_workers);
    if (!target) {
        return sl_errf(err, errlen, SL_EINVAL, "target_workers %u is unknown", req->target_workers);
    }
    if (req->target_workers == SL_TARGET_LOCAL && !has_local_worker(st, client_host)) {
        return sl_errf(err, errlen, SL_ENOTFOUND,
                       "target_workers local: no live worker is on this client's host %s (a worker is local "
                   "when the host of its --worker-address is the address the client connects from)",
                   client_host && client_host[0] ? client_host : "(unknown)");
    }
    clock_at(st, now);
    /* A named job is keyed by (name, repetition): j is the one a join joins
     * (running, or ended and not collected yet), gone a collected one. */
    struct job *j = NULL;
    struct {
        uint64_t id;
        sl_job_state_t state;
        int64_t ended;
    } gone = {0};
    /* The ranks of a named job restore one merged checkpoint: what they
     * sent is compared by its digest. */
    bool restoring = req->job_name[0] && (exclude_len > 0 || req->restore_epochs_done > 0 || placed);
    uint8_t digest[32] = {0};
    if (restoring && restore_digest(req, exclude, exclude_len, digest) < 0)
        return sl_errf(err, errlen, -ENOMEM, "out of memory");
    /* A named job held back at load (its record damaged) is not made
     * again: the records its ranks were given would come once more. */
    for (unsigned i = 0; req->job_name[0] && i < st->num_quarantine; i++) {
        const struct quarantined *q = &st->quarantine[i];
        if (q->named && q->repetition == req->repetition && strcmp(q->name, req->job_name) == 0)
            return sl_errf(err, errlen, SL_ECONFLICT,
                           "job \"%s\" repetition %" PRIu64 " (id %" PRIu64 ") is held back, its state store record "
                           "damaged: an operator repairs or restores the store (the admin endpoint says why: GET "
                           "/v1/quarantine), or join under another job name or repetition", q->name, q->repetition,
                           q->id);
    }
    if (req->job_name[0]) {
        for (unsigned i = 0; i < st->num_jobs; i++) {
            struct job *o = st->jobs[i];
            if (strcmp(o->name, req->job_name) != 0 || o->repetition != req->repetition)
                continue;
            /* An ended job of another checkpoint (or of none) is an earlier
             * run under this name: a restore starts a new one. */
            if (restoring && o->state != SL_JOB_RUNNING &&
                !(o->restored && memcmp(o->restore_digest, digest, sizeof digest) == 0))
                continue;
            if (!o->collected && (!j || o->state == SL_JOB_RUNNING))
                j = o;
            else if (o->collected)
                gone.id = o->id, gone.state = o->state, gone.ended = o->ended;
        }
    }
    int rc;
    if (j) {
        if (j->dataset != d) {
            return sl_errf(err, errlen, SL_ECONFLICT,
                           "job \"%s\" exists with dataset %" PRIu64 ", requested dataset %" PRIu64, j->name,
                       j->dataset->id, d->id);
        }
        if (j->sharding != (sl_sharding_t)req->sharding) {
            return sl_errf(err, errlen, SL_ECONFLICT, "job \"%s\" exists with sharding %s, requested %s", j->name,
                       sl_sharding_name(j->sharding), policy);
        }
        if (restoring && !(j->restored && memcmp(j->restore_digest, digest, sizeof digest) == 0)) {
            return sl_errf(err, errlen, SL_ECONFLICT,
                           "job \"%s\" repetition %" PRIu64 " (id %" PRIu64 ") is running and was %s: every rank "
                           "restores the same merged checkpoint; cancel the job (DELETE /v1/jobs/%" PRIu64 ") or "
                           "restore under another job name or repetition",
                           j->name, j->repetition, j->id,
                           j->restored ? "restored from another checkpoint" : "not restored from a checkpoint",
                           j->id);
        }
        if (!restoring && j->restored && j->state == SL_JOB_RUNNING) {
            return sl_errf(err, errlen, SL_ECONFLICT,
                           "job \"%s\" repetition %" PRIu64 " (id %" PRIu64 ") was restored from a checkpoint: a "
                           "rank joins it by restoring the same checkpoint",
                           j->name, j->repetition, j->id);
        }
        if (j->state != SL_JOB_RUNNING)
            return joined_ended(st, j, req, client_host, now, resp, err, errlen);
        if ((rc = job_check_consumers(st, req, d, j, err, errlen)) < 0)
            return rc;
        resp->job_id = j->id;
        return joined(st, j, req, client_host, now, false, resp, err, errlen);
    }
    sl_sharding_t effective;
    if ((rc = job_check_policy(st, d, (sl_sharding_t)req->sharding, &effective, err, errlen)) < 0)
        return rc;
    if ((rc = job_check_consumers(st, req, d, NULL, err, errlen)) < 0)
        return rc;
    if (gone.id)
        drop_collected(st, req->job_name, req->repetition);
    if (jobs_make_room(st) < 0) {
        st->jobs_refused++;
        sl_errf(err, errlen, SL_ETOOBIG,
                "job refused: %u jobs are running, as many as --max-jobs allows (ended jobs are forgotten to make "
                "room; a running job without clients is cancelled after --job-gc-timeout-ms %" PRId64 " ms)",
                st->cfg.max_jobs, st->cfg.job_gc_timeout_ms);
        sl_log_warn("%s", err);
        return SL_ETOOBIG;
    }
    j = calloc(1, sizeof *j);
    if (!j) {
        return sl_errf(err, errlen, -ENOMEM, "out of memory");
    }
    sl_posbits_init(&j->exclude, st->cfg.max_exclude_runs);
    if (exclude_len > 0) {
        char why[300];
        if ((rc = sl_posbits_decode(&j->exclude, exclude, exclude_len, why, sizeof why)) < 0) {
            job_free(j);
            st->exclusions_refused += rc == -ENOSPC;
            return sl_errf(err, errlen, rc == -ENOSPC ? SL_ELIMIT : rc, "the restored iterator's checkpoint: %s%s", why,
                           rc == -ENOSPC ? " (--max-exclude-runs)" : "");
        }
        /* Every running job's restored positions stay in memory and in the
         * state store until the job ends: bounded together, so that a
         * stream of restores cannot fill the store (then every commit
         * would fail). */
        uint64_t held = 0;
        for (unsigned i = 0; i < st->num_jobs; i++)
            if (st->jobs[i]->state == SL_JOB_RUNNING)
                held += sl_posbits_units(&st->jobs[i]->exclude);
        if (held + sl_posbits_units(&j->exclude) > st->cfg.max_exclude_total) {
            uint64_t mine = sl_posbits_units(&j->exclude);
            job_free(j);
            st->exclusions_refused++;
            return sl_errf(err, errlen, SL_ELIMIT,
                           "job refused: its checkpoint's %" PRIu64 " units of positions (runs, and 22 a bitmap) "
                           "with the %" PRIu64
                           " that running jobs restored hold are over the dispatcher's limit of %" PRIu64
                           " (--max-exclude-total-runs); retry when restored jobs end",
                           mine, held, st->cfg.max_exclude_total);
        }
        j->exclude_dirty = true;
        sl__dstate_touch(st, j);
    }
    if (sl_cap_nonce_new(&j->nonce) < 0) {
        job_free(j);
        return sl_errf(err, errlen, -EIO, "job refused: the system's random source gave no bytes for its nonce");
    }
    j->restored = restoring;
    memcpy(j->restore_digest, digest, sizeof digest);
    j->id = st->next_id++;
    snprintf(j->name, sizeof j->name, "%s", req->job_name);
    j->repetition = j->name[0] ? req->repetition : 0;
    j->dataset = d;
    d->last_used = now;
    j->sharding = (sl_sharding_t)req->sharding;
    j->effective = effective;
    j->num_consumers = req->num_consumers;
    j->round_horizon = st->cfg.round_lookahead;
    j->state = SL_JOB_RUNNING;
    /* A restored iterator's done epochs are never handed out: its tasks
     * are told they are over (sl_dstate_get_splits()). */
    j->split_epoch = req->restore_epochs_done;
    /* Nor the records before a restored place in its epoch. */
    j->split_file = req->restore_file;
    j->split_next = req->restore_record;
    j->created = now;
    /* Every live worker gets its task now, so that no worker can finish the
     * job before the others have heard of it. */
    for (unsigned i = 0; i < st->num_workers; i++) {
        if (st->workers[i].state == WORKER_LIVE && !st->workers[i].draining && !st->workers[i].unconfirmed &&
            job_add_task(st, j, &st->workers[i]) < 0) {
            job_free(j);
            return sl_errf(err, errlen, -ENOMEM, "out of memory");
        }
    }
    j->started = true;
    j->dirty = true;
    j->cursor_dirty = true;
    st->jobs[st->num_jobs++] = j;
    if (sl__dstate_index_job(st, j) < 0) { /* lists it for the commit */
        st->num_jobs--;
        job_free(j);
        return sl_errf(err, errlen, -ENOMEM, "out of memory");
    }
    sl__dstate_first_splits(st, j, now);
    /* A collected repetition is created again: one more pass over the data,
     * as tf.data service does once it garbage-collected an iteration. */
    if (gone.id) {
        snprintf(resp->notice, sizeof resp->notice, "job \"%s\" repetition %" PRIu64 " (id %" PRIu64 ") ended "
                 "(%s) %" PRId64 " ms ago and was collected (no client for --job-gc-timeout-ms %" PRId64 " ms); "
                 "a new job %" PRIu64 " was created for the repetition, reading the dataset from the start",
                 j->name, j->repetition, gone.id, sl__job_state_names[gone.state],
                 gone.ended > 0 && now > gone.ended ? now - gone.ended : 0, st->cfg.job_gc_timeout_ms, j->id);
        sl_log_info("%s", resp->notice);
    }
    sl_log_info("job %" PRIu64 "%s%s%s%s created: dataset %" PRIu64 ", sharding %s%s%s, %u tasks, %u consumers",
                j->id, j->name[0] ? " \"" : "", j->name, j->name[0] ? "\"" : "", repetition_text(j), d->id, policy,
                effective != j->sharding ? " as " : "", effective != j->sharding ? sl_sharding_name(effective) : "",
                j->num_tasks, j->num_consumers);
    resp->job_id = j->id;
    return joined(st, j, req, client_host, now, false, resp, err, errlen);
}

int sl_dstate_job_get_or_create(sl_dstate_t *st, const sluice_GetOrCreateJobRequest *req, int64_t now,
                                uint64_t *job_id, uint64_t *client_id, char *err, size_t errlen)
{
    sluice_GetOrCreateJobResponse resp = sluice_GetOrCreateJobResponse_init_zero;
    int rc = sl_dstate_job_join(st, req, "", NULL, 0, now, &resp, err, errlen);
    *job_id = resp.job_id;
    *client_id = resp.client_id;
    return rc;
}

/* A named job's client c leaves. Records it had received and not given
 * may have gone with it, unless it gave every one of them back
 * (gave_back): else no later fold passes the place it was given up to
 * (given_floor). Records given back went out again as splits, before the
 * confirmed place now, and reach the job's other clients later: what each
 * of those said it was given counts no further than that place, until
 * their heartbeats say it again (capped at the confirmed place then, which
 * passes a split given back only once every client has what it will get
 * of it, said in the same heartbeat as its place given). */
static void leave_given(struct job *j, const struct client *c, bool gave_back)
{
    if (!gave_back) {
        if (!j->given_floor_set || sl__place_before(c->given, j->given_floor)) {
            j->given_floor = c->given;
            j->given_floor_set = true;
        }
        return;
    }
    struct sl_place at = sl__out_confirmed_below(j);
    for (unsigned i = 0; i < j->num_clients; i++)
        if (sl__place_before(at, j->clients[i].given))
            j->clients[i].given = at;
}

static void job_remove_client(sl_dstate_t *st, struct job *j, struct client *c, bool gave_back, int64_t now)
{
    if (j->num_consumers > 0 && j->state == SL_JOB_RUNNING)
        gone_note(st, j, c, now);
    if (j->name[0] && j->state == SL_JOB_RUNNING)
        leave_given(j, c, gave_back);
    sl__out_free_client(c);
    *c = j->clients[--j->num_clients];
    j->dirty = true;
    sl__dstate_touch(st, j);
    if (j->num_clients == 0)
        j->idle_since = now;
    /* One client fewer to wait for: its progress no longer holds splits
     * back, and its report is no longer awaited. */
    sl__out_progress(st, j, NULL, NULL, 0);
    job_ensure_task(st, j);
    job_check_finished(st, j);
}

/* Client c's lease ran out: it is away. It holds back none of the splits
 * its peers have (they may end their epoch), but a report after a worker
 * loss waits for it, and what it has not confirmed stays known, until it
 * comes back (client_back()) or --client-rejoin-ms passes. */
static void client_away(sl_dstate_t *st, struct job *j, struct client *c, int64_t now)
{
    c->away_since = now;
    sl_log_warn("job %" PRIu64 ": client %" PRIu64 " is away: no heartbeat for %" PRId64 " ms; it may come back "
                "for %" PRId64 " ms (--client-rejoin-ms)", j->id, c->id, now - c->last_seen,
                st->cfg.client_rejoin_ms);
    sl__out_progress(st, j, NULL, NULL, 0); /* its progress no longer holds splits back */
    job_check_finished(st, j);
}

/* Client c heartbeats but has received nothing new for --client-stall-ms
 * while it holds splits back (its caller stopped reading and did not
 * close): like an away client, it holds none back from its peers until
 * its progress grows again (sl_dstate_client_heartbeat()). */
static void client_stalled(sl_dstate_t *st, struct job *j, struct client *c, int64_t now)
{
    c->stalled_since = now;
    sl_log_warn("job %" PRIu64 ": client %" PRIu64 " is stalled: it heartbeats but received nothing new for %" PRId64
                " ms while its peers wait for it (--client-stall-ms); they read on without it", j->id, c->id,
                now - c->progress_at);
    sl__out_progress(st, j, NULL, NULL, 0); /* its progress no longer holds splits back */
    job_check_finished(st, j);
}

/* A frame from client c: its lease starts again, and an away client is back. */
static void client_heard(const sl_dstate_t *st, const struct job *j, struct client *c, int64_t now)
{
    (void)st;
    if (c->away_since)
        sl_log_info("job %" PRIu64 ": client %" PRIu64 " is back after %" PRId64 " ms away", j->id, c->id,
                    now - c->away_since);
    c->away_since = 0;
    c->last_seen = now;
}

/* A client that is away the longest, or NULL. */
static struct client *longest_away(struct job *j)
{
    struct client *a = NULL;
    for (unsigned i = 0; i < j->num_clients; i++)
        if (j->clients[i].away_since && (!a || j->clients[i].away_since < a->away_since))
            a = &j->clients[i];
    return a;
}

/* Coordinated reads: a task of a drained worker serves the rounds below its
 * end_round (sl_dstate_worker_drain()). Once the consumer of every index
 * asks for rounds at or past it, none asks it again: it is done, and its
 * worker drops it at its next heartbeat (removed_tasks), after which the
 * worker holds nothing of the job and can be stopped. */
static void coord_drained_done(sl_dstate_t *st, struct job *j)
{
    bool any = false; /* only while a drained task serves: every client heartbeat asks */
    for (unsigned k = 0; k < j->num_tasks && !any; k++)
        any = j->tasks[k].end_round > 0 && sl__task_live(&j->tasks[k]);
    uint8_t *here = any ? calloc(j->num_consumers, 1) : NULL;
    if (!here)
        return;
    uint64_t least = UINT64_MAX;
    uint32_t seen = 0;
    for (unsigned i = 0; i < j->num_clients; i++) {
        const struct client *c = &j->clients[i];
        if (c->late || c->consumer_index >= j->num_consumers)
            continue;
        seen += !here[c->consumer_index];
        here[c->consumer_index] = 1;
        if (c->round < least)
            least = c->round;
    }
    free(here);
    if (seen < j->num_consumers)
        return; /* a consumer not here may still need the rounds */
    bool let_go = false;
    for (unsigned k = 0; k < j->num_tasks; k++) {
        struct task *t = &j->tasks[k];
        if (t->end_round > 0 && sl__task_live(t) && least >= t->end_round) {
            sl_log_info("job %" PRIu64 ": every consumer is past round %" PRIu64 ", the last of task %" PRIu64
                        " on drained worker %s: it is done", j->id, t->end_round - 1, t->id, t->worker_address);
            task_set_state(st, j, t, TASK_DONE);
            /* Under DYNAMIC its pipeline still holds records of its splits
             * that no round took: they go out again, without what the
             * consumers say they received (their reports). */
            sl__out_orphan(st, j, t);
            let_go = true;
        }
    }
    if (let_go)
        job_ensure_task(st, j); /* after the loop: it may add a task */
}

struct sl_place sl__job_folded(const struct job *j)
{
    /* The least over every client, the away ones too (what they were
     * given is not known until they come back or are released). */
    struct sl_place folded = {.epoch = UINT64_MAX, .file = UINT32_MAX, .pos = UINT64_MAX};
    if (j->given_floor_set)
        folded = j->given_floor;
    for (unsigned i = 0; i < j->num_clients; i++)
        if (sl__place_before(j->clients[i].given, folded))
            folded = j->clients[i].given;
    return folded.epoch == UINT64_MAX ? (struct sl_place){0} : folded;
}

/* Takes what a named job's client says its caller was given (epochs_given,
 * place_given), no further than what is confirmed: every record before
 * `at` reached a client, and so did every epoch below epochs_done. */
static void client_given(struct client *c, const sluice_ClientHeartbeatRequest *req, struct sl_place at,
                         uint64_t epochs_done)
{
    struct sl_place said = {.epoch = req->epochs_given};
    const sluice_Place *p = &req->place_given;
    struct sl_place place = {.epoch = p->epoch, .file = p->file, .pos = p->record};
    if (req->has_place_given && sl__place_before(said, place))
        said = place;
    struct sl_place confirmed = {.epoch = epochs_done};
    if (sl__place_before(confirmed, at))
        confirmed = at;
    if (sl__place_before(confirmed, said))
        said = confirmed;
    if (sl__place_before(c->given, said))
        c->given = said;
}

int sl_dstate_client_heartbeat(sl_dstate_t *st, const sluice_ClientHeartbeatRequest *req, int64_t now,
                               sluice_ClientHeartbeatResponse *resp, char *err, size_t errlen)
{
    clock_at(st, now);
    int rc = sl__dstate_check_client_secret(st, "CLIENT_HEARTBEAT", req->job_id, req->client_id, req->client_secret, err,
                                 errlen);
    if (rc < 0)
        return rc;
    struct job *j = sl__dstate_job(st, req->job_id);
    if (!j) {
        return sl_errf(err, errlen, SL_ENOTFOUND, "job %" PRIu64 " is unknown", req->job_id);
    }
    struct client *c = job_find_client(j, req->client_id);
    if (!c) {
        return sl_errf(err, errlen, SL_ENOTFOUND,
                       "client %" PRIu64 " of job %" PRIu64 " is unknown: it was released after %" PRId64
                       " ms without heartbeat (--client-timeout-ms %" PRId64 " and --client-rejoin-ms %" PRId64 ")",
                       req->client_id, j->id, st->cfg.client_timeout_ms + st->cfg.client_rejoin_ms,
                       st->cfg.client_timeout_ms, st->cfg.client_rejoin_ms);
    }
    client_heard(st, j, c, now);
    c->ledger_runs = req->ledger_runs;
    c->ledger_max_runs = req->ledger_max_runs;
    if (req->progress_count > 0 && j->state == SL_JOB_RUNNING) {
        if (sl__out_progress(st, j, c, req->progress, req->progress_count)) {
            c->progress_at = now;
            if (c->stalled_since) {
                sl_log_info("job %" PRIu64 ": client %" PRIu64 " reads again after %" PRId64 " ms stalled", j->id,
                            c->id, now - c->stalled_since);
                c->stalled_since = 0;
                /* Pruned above while it counted as stalled, not as a reader:
                 * once more with what it said. Before 2026-12-05 a client
                 * that read to its tasks' end in one heartbeat kept their
                 * last splits outstanding, and the job from ending. */
                sl__out_progress(st, j, NULL, NULL, 0);
            }
        }
        job_check_finished(st, j);
    }
    if (j->num_consumers > 0) {
        /* The horizon only grows, and only here: every round up to it has
         * its tasks fixed (see the top of this file). */
        if (c->round != req->round) {
            j->dirty = true;
            sl__dstate_touch(st, j);
        }
        c->round = req->round;
        if (req->round + st->cfg.round_lookahead > j->round_horizon) {
            j->round_horizon = req->round + st->cfg.round_lookahead;
            j->dirty = true;
            sl__dstate_touch(st, j);
        }
        resp->round_horizon = j->round_horizon;
        /* Before the answer's report_gen: a drained task let go now
         * asks for reports. */
        coord_drained_done(st, j);
    }
    resp->job_state = j->state;
    snprintf(resp->error, sizeof resp->error, "%s", j->error);
    resp->report_gen = j->report_gen;
    resp->report_from_epoch = sl__out_report_from(j);
    /* One scan of the outstanding splits gives both epochs_done and,
     * for coordinated reads, the place. */
    bool placed = sl__out_tracked(j) && j->state == SL_JOB_RUNNING;
    struct sl_place at = placed ? sl__out_confirmed_below(j) : (struct sl_place){0};
    resp->epochs_done = placed ? sl__out_epochs_done_at(j, at) : 0;
    if (sl__out_tracked(j)) {
        /* A client hears the split-done notices of the frames it reads,
         * about one in num_clients of its tasks': each confirms at its
         * share of a quarter of the bound, so that the job's clients
         * together confirm every quarter of it. */
        uint64_t every = st->cfg.max_outstanding / 4 / (j->num_clients > 0 ? j->num_clients : 1);
        resp->confirm_every = every > 0 ? (uint32_t)every : 1;
    }
    if (placed && (j->num_consumers > 0 || j->name[0])) {
        /* Coordinated clients take no checkpoints: their ledgers serve
         * reports only, and drop what lies before this place. A named
         * job's clients say how far their callers were given what had
         * reached them by then (place_given). */
        resp->has_confirmed_below = true;
        resp->confirmed_below = (sluice_Place){.epoch = at.epoch, .file = at.file, .record = at.pos};
    }
    if (j->name[0] && j->state == SL_JOB_RUNNING) {
        client_given(c, req, placed ? at : (struct sl_place){0}, resp->epochs_done);
        struct sl_place folded = sl__job_folded(j);
        resp->epochs_folded = folded.epoch;
        resp->has_place_folded = folded.epoch > 0 || folded.file > 0 || folded.pos > 0;
        resp->place_folded = (sluice_Place){.epoch = folded.epoch, .file = folded.file, .record = folded.pos};
    }
    list_tasks(st, j, c, resp->tasks, &resp->tasks_count, sizeof resp->tasks / sizeof resp->tasks[0]);
    return 0;
}

/* The client a request names, once its secret proved it is the client's:
 * REPORT_RECEIVED and RELEASE_CLIENT. @return 0, SL_EPERM or SL_ENOTFOUND */
static int owned_client(sl_dstate_t *st, const char *what, uint64_t job_id, uint64_t client_id, const uint8_t *secret,
                        struct job **jp, struct client **cp, char *err, size_t errlen)
{
    int rc = sl__dstate_check_client_secret(st, what, job_id, client_id, secret, err, errlen);
    if (rc < 0)
        return rc;
    *jp = sl__dstate_job(st, job_id);
    *cp = *jp ? job_find_client(*jp, client_id) : NULL;
    if (!*cp)
        return sl_errf(err, errlen, SL_ENOTFOUND, "client %" PRIu64 " of job %" PRIu64 " is unknown", client_id,
                       job_id);
    return 0;
}

int sl_dstate_client_report(sl_dstate_t *st, const sluice_ReportReceivedRequest *req, const uint8_t *payload,
                            size_t len, int64_t now, char *err, size_t errlen)
{
    struct job *j;
    struct client *c;
    int rc = owned_client(st, "REPORT_RECEIVED", req->job_id, req->client_id, req->client_secret, &j, &c, err, errlen);
    if (rc < 0)
        return rc;
    client_heard(st, j, c, now);
    if (j->state != SL_JOB_RUNNING || !sl__out_tracked(j))
        return 0;
    rc = sl__out_report(st, j, c, req, payload, len, err, errlen);
    if (rc == 0)
        job_ensure_task(st, j);
    return rc;
}

int sl_dstate_client_release(sl_dstate_t *st, const sluice_ReleaseClientRequest *req, int64_t now, char *err,
                             size_t errlen)
{
    return sl_dstate_client_leave(st, req, NULL, 0, now, NULL, err, errlen);
}

/* What client c of job j gives back as it leaves: handed out again when
 * the job is a running named DYNAMIC one of independent reads (a
 * coordinated read's rounds are not splits; an anonymous job ends with its
 * one client). Before c leaves: its place is part of the fold that no
 * record given back may lie before. @return whether they were taken */
static bool take_returns(sl_dstate_t *st, struct job *j, struct client *c, const sluice_ReleaseClientRequest *req,
                         const uint8_t *payload, size_t len, sluice_ReleaseClientResponse *resp)
{
    char why[sizeof resp->returns_error];
    int rc = 0;
    if (!j->name[0] || j->num_consumers > 0 || !sl__out_tracked(j))
        rc = sl_errf(why, sizeof why, SL_EINVAL, "only a named DYNAMIC job of independent reads takes records back");
    else if (j->state != SL_JOB_RUNNING)
        rc = sl_errf(why, sizeof why, SL_EINVAL, "the job is %s", sl__job_state_names[j->state]);
    else
        rc = sl__out_return(st, j, c, sl__job_folded(j), payload, len, (size_t)req->received_length, why, sizeof why);
    resp->returns_taken = rc == 0;
    st->returns_refused += rc < 0;
    if (rc < 0) {
        snprintf(resp->returns_error, sizeof resp->returns_error, "%s", why);
        sl_log_warn("job %" PRIu64 ": client %" PRIu64 " leaves; what it gives back is not taken: %s", j->id, c->id,
                    why);
    }
    return rc == 0;
}

int sl_dstate_client_leave(sl_dstate_t *st, const sluice_ReleaseClientRequest *req, const uint8_t *payload,
                           size_t len, int64_t now, sluice_ReleaseClientResponse *resp, char *err, size_t errlen)
{
    struct job *j;
    struct client *c;
    clock_at(st, now);
    int rc = owned_client(st, "RELEASE_CLIENT", req->job_id, req->client_id, req->client_secret, &j, &c, err, errlen);
    if (rc < 0)
        return rc;
    bool gave_back = false;
    if (req->returns && resp) {
        gave_back = take_returns(st, j, c, req, payload, len, resp) && req->returns_whole;
        if (!gave_back && j->state == SL_JOB_RUNNING)
            sl_log_info("job %" PRIu64 ": client %" PRIu64 " left with %s: no fold of the job passes epoch %" PRIu64
                        ", file %" PRIu32 ", record %" PRIu64 ", where it was given to", j->id, c->id,
                        resp->returns_taken ? "a worker that did not answer its leave (what was on its way to it "
                                              "may be lost)" : "records not taken back",
                        c->given.epoch, c->given.file, c->given.pos);
    }
    job_remove_client(st, j, c, gave_back, now);
    /* An anonymous job has its one client: once it left, nobody can join
     * the job again. It ends now rather than after job_gc_timeout_ms, so
     * that its workers drop its tasks, and the batches they buffered give
     * their memory back to the other jobs at once (a trainer that stopped
     * early: an evaluation pass cut short, sluice-cat --limit). */
    if (!j->name[0] && j->state == SL_JOB_RUNNING && j->num_clients == 0)
        job_set_state(st, j, SL_JOB_CANCELLED, "its client released it before its end");
    return 0;
}

const sl_posbits_t *sl_dstate_job_exclusions(const sl_dstate_t *st, uint64_t job_id)
{
    const struct job *j = sl__dstate_job((sl_dstate_t *)st, job_id);
    return j ? &j->exclude : NULL;
}

bool sl_dstate_take_notices_due(sl_dstate_t *st)
{
    bool due = st->notices_due;
    st->notices_due = false;
    return due;
}

bool sl_dstate_worker_take_notice(sl_dstate_t *st, uint64_t worker_id)
{
    struct worker *w = sl__dstate_worker(st, worker_id);
    if (!w || !w->notice)
        return false;
    w->notice = false;
    return w->state == WORKER_LIVE;
}

bool sl_dstate_worker_disconnected(sl_dstate_t *st, uint64_t worker_id, const char *why)
{
    struct worker *w = sl__dstate_worker(st, worker_id);
    if (!w || w->state != WORKER_LIVE)
        return false;
    char reason[sizeof w->why_lost];
    snprintf(reason, sizeof reason, "its connection closed: %s", why ? why : "");
    worker_lose(st, w, reason);
    return true;
}

void sl_dstate_heard(sl_dstate_t *st, int64_t now)
{
    if (now > st->last_rx)
        st->last_rx = now;
}

/* Whether a live worker has heartbeated since it registered: without one
 * nothing is served, and a silence tells nothing (registrations that never
 * heartbeat, as a stranger's, are lost on time as always). */
static bool any_heartbeating_worker(const sl_dstate_t *st)
{
    for (unsigned i = 0; i < st->num_workers; i++)
        if (st->workers[i].state == WORKER_LIVE && st->workers[i].last_seen > st->workers[i].joined)
            return true;
    return false;
}

/* The dispatcher does not spend leases on its own absence. With live
 * workers, but no frame from any peer (sl_dstate_heard()) for half the
 * shorter lease, it is the one cut
 * off (its host's link, a partition): no lease runs out until it hears
 * from someone again, and then every lease starts afresh. (After a
 * restart, sl_dpersist_load() gives every lease a fresh start too.)
 * @return true while it is silent: expire nothing */
static bool silence(sl_dstate_t *st, int64_t now)
{
    int64_t heard = st->last_rx > 0 && any_heartbeating_worker(st) ? st->last_rx : 0;
    /* Half the shorter lease, and never less than 4 heartbeat intervals
     * (quiet between heartbeats is no silence). */
    int64_t limit = (st->cfg.worker_timeout_ms < st->cfg.client_timeout_ms ? st->cfg.worker_timeout_ms
                                                                            : st->cfg.client_timeout_ms) / 2;
    int64_t beat = st->cfg.worker_heartbeat_ms > st->cfg.client_heartbeat_ms ? st->cfg.worker_heartbeat_ms
                                                                             : st->cfg.client_heartbeat_ms;
    if (limit < 4 * beat)
        limit = 4 * beat;
    if (heard == 0) {
        st->silent = false;
        return false;
    }
    if (now - heard > limit) {
        if (!st->silent) {
            st->silent = true;
            st->silent_since = heard;
            st->silences++;
            sl_log_warn("heard from no worker and no client for %" PRId64 " ms: this dispatcher seems cut off; "
                        "no lease runs out until it hears from one again",
                        now - heard);
        }
        return true;
    }
    if (st->silent) {
        st->silent = false;
        for (unsigned i = 0; i < st->num_workers; i++)
            if (st->workers[i].state == WORKER_LIVE)
                st->workers[i].last_seen = now;
        for (unsigned i = 0; i < st->num_jobs; i++)
            for (unsigned k = 0; k < st->jobs[i]->num_clients; k++) {
                struct client *c = &st->jobs[i]->clients[k];
                c->last_seen = now;
                c->progress_at = now > c->progress_at ? now : c->progress_at; /* so does its stall's */
                if (c->away_since)
                    c->away_since = now; /* its window starts afresh too */
            }
        sl_log_info("heard again after %" PRId64 " ms of silence: every worker and client lease starts afresh",
                    now - st->silent_since);
    }
    return false;
}

/* An ended named job without clients for job_gc_timeout_ms: the next join
 * of its (name, repetition) creates it again. */
static void job_collect(sl_dstate_t *st, struct job *j)
{
    if (!j->name[0] || j->collected)
        return;
    j->collected = true;
    j->dirty = true;
    sl__dstate_touch(st, j);
    sl_log_info("job %" PRIu64 " \"%s\"%s collected: it ended (%s) and had no client for the job's gc timeout; a "
                "join of it creates it again", j->id, j->name, repetition_text(j), sl__job_state_names[j->state]);
}

void sl_dstate_tick(sl_dstate_t *st, int64_t now)
{
    st->now = now;
    datasets_collect(st, now);
    if (silence(st, now))
        return;
    for (unsigned i = 0; i < st->num_workers; i++) {
        struct worker *w = &st->workers[i];
        if (w->state == WORKER_LIVE && now - w->last_seen > st->cfg.worker_timeout_ms) {
            char why[100];
            snprintf(why, sizeof why, "no heartbeat for %" PRId64 " ms", now - w->last_seen);
            worker_lose(st, w, why);
        }
    }
    for (unsigned i = 0; i < st->num_jobs; i++) {
        struct job *j = st->jobs[i];
        /* Away is for running jobs: an ended one has nothing left to keep
         * exactly once, and its clients should not hold its collection. */
        bool running = j->state == SL_JOB_RUNNING;
        for (unsigned k = 0; k < j->num_clients;) {
            struct client *c = &j->clients[k];
            if (c->away_since == 0 && now - c->last_seen > st->cfg.client_timeout_ms && running &&
                st->cfg.client_rejoin_ms > 0) {
                client_away(st, j, c, now);
                k++;
            } else if (c->away_since == 0 ? now - c->last_seen > st->cfg.client_timeout_ms
                                          : !running || now - c->away_since > st->cfg.client_rejoin_ms) {
                sl_log_warn("job %" PRIu64 ": client %" PRIu64 " released after %" PRId64 " ms without heartbeat",
                            j->id, c->id, now - c->last_seen);
                job_remove_client(st, j, c, false, now);
            } else {
                /* Not under coordinated reads: the peers wait at the
                 * rounds for it anyway. */
                if (running && j->num_consumers == 0 && c->away_since == 0 && c->stalled_since == 0 &&
                    st->cfg.client_stall_ms > 0 && now - c->progress_at > st->cfg.client_stall_ms &&
                    sl__out_holds_back(j, c))
                    client_stalled(st, j, c, now);
                k++;
            }
        }
        if (j->num_consumers > 0)
            restart_over_if_none_away(st, j, now); /* away ones released, gone ones no longer lately */
        if (j->state == SL_JOB_RUNNING && j->num_clients == 0 && now - j->idle_since > st->cfg.job_gc_timeout_ms) {
            job_set_state(st, j, SL_JOB_CANCELLED, "no client for the job's gc timeout");
            job_collect(st, j);
        } else if (j->state != SL_JOB_RUNNING && j->name[0] && !j->collected && j->num_clients == 0 &&
                   now - (j->idle_since > j->ended ? j->idle_since : j->ended) > st->cfg.job_gc_timeout_ms) {
            job_collect(st, j);
        } else if (j->num_orphans > 0) {
            job_ensure_task(st, j); /* e.g. a worker that can take them is back */
        }
    }
}

void sl_dstate_stats(const sl_dstate_t *st, sl_dstate_stats_t *out)
{
    *out = (sl_dstate_stats_t){.datasets = st->num_datasets, .jobs_total = st->num_jobs,
                               .datasets_refused = st->datasets_refused, .jobs_refused = st->jobs_refused,
                               .workers_refused = st->workers_refused, .exclusions_refused = st->exclusions_refused,
                               .datasets_collected = st->datasets_collected,
                               .first_splits_with_job = st->first_splits_with_job,
                               .split_requests_left_to_others = st->split_requests_left_to_others,
                               .held_back = st->num_quarantine, .records_given_back = st->records_given_back,
                               .returns_refused = st->returns_refused};
    for (unsigned i = 0; i < st->num_workers; i++)
        out->workers_live += st->workers[i].state == WORKER_LIVE;
    for (unsigned i = 0; i < st->num_jobs; i++) {
        out->jobs_running += st->jobs[i]->state == SL_JOB_RUNNING;
        if (st->jobs[i]->state != SL_JOB_RUNNING)
            continue;
        out->exclude_runs += sl_posbits_units(&st->jobs[i]->exclude);
        for (unsigned k = 0; k < st->jobs[i]->num_clients; k++)
            out->clients_away += st->jobs[i]->clients[k].away_since != 0;
    }
}

/* Coordinated reads: each running task of the drained worker serves the
 * rounds up to the horizon, which every consumer may have asked for
 * already, and no more: the others take its share from the next round on,
 * and it is done once every consumer went past (coord_drained_done()), with
 * no round lost or served from two workers, where a worker stopped without
 * a drain leaves its rounds to stand-ins. */
static void drain_rounds(sl_dstate_t *st, const struct worker *w)
{
    for (unsigned i = 0; i < st->num_jobs; i++) {
        struct job *j = st->jobs[i];
        if (j->state != SL_JOB_RUNNING || j->num_consumers == 0)
            continue;
        for (unsigned k = 0; k < j->num_tasks; k++) {
            struct task *t = &j->tasks[k];
            if (t->worker_id != w->id || !sl__task_live(t) || t->end_round > 0)
                continue;
            t->end_round = rounds_end_now(j, t);
            sl_log_info("job %" PRIu64 ": task %" PRIu64 " on draining worker %s serves rounds below %" PRIu64
                        ", the other workers the rounds from there on", j->id, t->id, w->address, t->end_round);
            j->dirty = true;
            sl__dstate_touch(st, j);
        }
        coord_drained_done(st, j);
    }
}

/* ---- operator actions ---- */

int sl_dstate_job_cancel(sl_dstate_t *st, uint64_t job_id, const char *why, char *err, size_t errlen)
{
    struct job *j = sl__dstate_job(st, job_id);
    if (!j) {
        return sl_errf(err, errlen, SL_ENOTFOUND, "job %" PRIu64 " is unknown", job_id);
    }
    if (j->state != SL_JOB_RUNNING) {
        return sl_errf(err, errlen, SL_EINVAL,
                       "job %" PRIu64 " is already %s", job_id, sl__job_state_names[j->state]);
    }
    job_set_state(st, j, SL_JOB_CANCELLED, why);
    return 0;
}

int sl_dstate_worker_drain(sl_dstate_t *st, const char *address, char *err, size_t errlen)
{
    for (unsigned i = 0; i < st->num_workers; i++) {
        struct worker *w = &st->workers[i];
        if (w->state == WORKER_LIVE && strcmp(w->address, address) == 0) {
            if (!w->draining)
                sl_log_info("worker %" PRIu64 " at %s draining: no new tasks or splits", w->id, w->address);
            w->draining = true;
            w->dirty = true;
            st->workers_dirty = true;
            drain_rounds(st, w);
            return 0;
        }
    }
    return sl_errf(err, errlen, SL_ENOTFOUND, "no live worker at %s", address);
}
