/*
 * outstanding.c: see outstanding.h.
 *
 * Why a split is safe to forget once every client reading its task passed
 * its done_below: a worker puts done_below into a batch when it sends it,
 * and a split below it had every record sent in that batch or an earlier
 * one. A client's connection delivers in order, so a client that got a
 * batch with done_below d also got every earlier batch sent to it; any
 * record of a split below the smallest d of all clients went to one of
 * them in a batch it received. Coordinated reads too: a consumer's batches
 * of one task come on its one connection to the worker, in the order the
 * worker sent them, whatever rounds they answer.
 *
 * Memory and storage: a task holds the splits between its worker's reading
 * and its slowest client's progress report, an array pruned from the front.
 * Each split is one stored record, put when handed out, deleted when
 * pruned; orphans are rewritten when they change (a loss is rare).
 */
#include "outstanding.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "le.h"
#include "log.h"
#include "policy.h"

bool sl__out_tracked(const struct job *j)
{
    return j->sharding == SL_SHARDING_DYNAMIC;
}

static void osplit_free(struct osplit *o)
{
    if (o->have) {
        sl_posbits_clear(o->have);
        free(o->have);
        o->have = NULL;
    }
}

static sl_posbits_t *have_new(const struct osplit *o)
{
    sl_posbits_t *p = malloc(sizeof *p);
    if (p)
        sl_posbits_init(p, sl__out_have_units(o->begin, o->end));
    return p;
}

/* Adds runs (begin, count pairs, 16 bytes each, little-endian) to o's have. */
static int have_add_wire(struct osplit *o, const uint8_t *runs, uint64_t n)
{
    if (n == 0)
        return 0;
    if (!o->have && !(o->have = have_new(o)))
        return -ENOMEM;
    for (uint64_t i = 0; i < n; i++) {
        sl_posrun_t r = {(uint32_t)o->epoch, o->file, sl_get_le64(runs + 16 * i), sl_get_le64(runs + 16 * i + 8)};
        int rc = sl_posbits_add_many(o->have, &r, 1);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int sl__out_add(sl_dstate_t *st, struct job *j, struct task *t, const sluice_Split *s, const uint8_t *skips)
{
    if (t->out_head > 0 && t->out_num == t->out_cap) {
        /* Reuse the room pruning left at the front. */
        memmove(t->out, t->out + t->out_head, (t->out_num - t->out_head) * sizeof *t->out);
        t->out_num -= t->out_head;
        t->out_saved -= t->out_head;
        t->out_head = 0;
    }
    if (sl__dstate_grow(&t->out, &t->out_cap, t->out_num, sizeof *t->out) < 0)
        return -ENOMEM;
    struct osplit *o = &t->out[t->out_num];
    *o = (struct osplit){.id = s->split_id, .task_id = t->id, .epoch = s->epoch, .file = s->file_index,
                         .state = OS_OUT, .begin = s->begin, .end = s->end};
    if (skips && have_add_wire(o, skips, s->skip_count) < 0) {
        osplit_free(o);
        return -ENOMEM;
    }
    t->out_num++;
    sl__dstate_touch(st, j); /* stored at the next commit */
    return 0;
}

unsigned sl__out_count(const struct task *t)
{
    return t->out_num - t->out_head;
}

unsigned sl__out_bounded(const struct task *t)
{
    return sl__out_count(t) - t->out_given_back;
}

/* Counts t's given-back splits again (after a cut). */
static void recount_given_back(struct task *t)
{
    t->out_given_back = 0;
    for (unsigned i = t->out_head; i < t->out_num; i++)
        t->out_given_back += t->out[i].given_back;
}

uint64_t sl__out_oldest(const struct task *t)
{
    return t->out_head < t->out_num ? t->out[t->out_head].id : UINT64_MAX;
}

bool sl__out_pending(const struct job *j)
{
    if (j->num_orphans > 0)
        return true;
    if (j->num_clients == 0)
        return false; /* nobody to protect, nobody to say what arrived */
    for (unsigned k = 0; k < j->num_tasks; k++)
        if (sl__out_count(&j->tasks[k]) > 0)
            return true;
    return false;
}

static struct client_progress *progress_of(struct client *c, uint64_t task_id)
{
    for (unsigned i = 0; i < c->num_progress; i++)
        if (c->progress[i].task_id == task_id)
            return &c->progress[i];
    return NULL;
}

/* Whether client c reads task t (a client of local workers only does not
 * read the others). */
static bool reads(const struct client *c, const struct task *t)
{
    return c->target != SL_TARGET_LOCAL || sl_policy_is_local(t->worker_address, c->host);
}

static void prune(sl_dstate_t *st, struct job *j, struct task *t)
{
    if (sl__out_count(t) == 0)
        return;
    uint64_t below = UINT64_MAX;
    unsigned readers = 0;
    for (unsigned i = 0; i < j->num_clients; i++) {
        struct client *c = &j->clients[i];
        if (!reads(c, t) || c->away_since || c->stalled_since)
            continue; /* an away or stalled client holds no split back (state.c, client_away()) */
        readers++;
        const struct client_progress *p = progress_of(c, t->id);
        uint64_t b = p ? p->done_below : 0;
        if (b < below)
            below = b;
    }
    if (readers == 0)
        below = 0;
    if (t->lost_below != 0 && below >= t->lost_below && t->received_past > below)
        below = t->received_past; /* past the batches its worker lost, which the clients had */
    if (t->received_below > below)
        below = t->received_below; /* its worker saw every batch of those splits acknowledged */
    while (t->out_head < t->out_num && t->out[t->out_head].id < below) {
        if (t->out_head < t->out_saved)
            sl__dstate_del(st, SL_DT_OUTSTANDING, j->id, t->out[t->out_head].id);
        t->out_given_back -= t->out[t->out_head].given_back;
        osplit_free(&t->out[t->out_head]);
        t->out_head++;
    }
    if (t->out_saved < t->out_head)
        t->out_saved = t->out_head;
    if (t->out_head == t->out_num)
        t->out_head = t->out_num = t->out_saved = 0;
}

bool sl__out_holds_back(const struct job *j, const struct client *c)
{
    if (!sl__out_tracked(j))
        return false;
    for (unsigned k = 0; k < j->num_tasks; k++) {
        const struct task *t = &j->tasks[k];
        if (sl__out_count(t) == 0 || !reads(c, t))
            continue;
        const struct client_progress *p = progress_of((struct client *)c, t->id);
        if (!p || p->done_below <= t->out[t->out_head].id)
            return true;
    }
    return false;
}

void sl__out_received(sl_dstate_t *st, struct job *j, struct task *t, const sluice_GetSplitRequest *req)
{
    if (!sl__out_tracked(j))
        return;
    bool more = req->received_below > t->received_below ||
                (req->lost_below != 0 && (req->lost_below != t->lost_below || req->received_past_lost > t->received_past));
    if (req->received_below > t->received_below)
        t->received_below = req->received_below;
    /* The last pair its worker said: lost_below grows as it loses more. */
    t->lost_below = req->lost_below;
    t->received_past = req->lost_below != 0 ? req->received_past_lost : 0;
    if (more)
        prune(st, j, t);
}

uint64_t sl__out_probe_below(const sl_dstate_t *st, const struct task *t, const struct client *c)
{
    /* A done task asks no more splits, so its worker says no more of what
     * reached its clients: its last splits wait for their word, and the
     * job's end with them (before 2026-12-05 a client whose trainer paused
     * held it until it read on). */
    bool waits = sl__out_bounded(t) >= st->cfg.max_outstanding || t->state == TASK_DONE;
    /* An away or stalled client holds nothing back: asked, a stalled one
     * would count as reading again. */
    if (!waits || t->worker_done_below <= sl__out_oldest(t) || !reads(c, t) || c->away_since || c->stalled_since)
        return 0;
    const struct client_progress *p = progress_of((struct client *)c, t->id);
    return p && p->done_below >= t->worker_done_below ? 0 : t->worker_done_below;
}

bool sl__out_progress(sl_dstate_t *st, struct job *j, struct client *c, const sluice_TaskProgress *p, unsigned n)
{
    bool grew = false;
    if (!sl__out_tracked(j))
        return false;
    if (!c) {
        /* A client left: any task's smallest progress may have grown. */
        for (unsigned k = 0; k < j->num_tasks; k++)
            prune(st, j, &j->tasks[k]);
        return false;
    }
    /* Only the tasks whose progress from c grew can have a larger minimum. */
    for (unsigned i = 0; i < n; i++) {
        struct task *t = NULL;
        for (unsigned k = 0; k < j->num_tasks && !t; k++)
            if (j->tasks[k].id == p[i].task_id)
                t = &j->tasks[k];
        if (!t)
            continue; /* not a task of this job: nothing to prune */
        struct client_progress *cp = progress_of(c, p[i].task_id);
        if (!cp) {
            if (sl__dstate_grow(&c->progress, &c->cap_progress, c->num_progress, sizeof *c->progress) < 0)
                continue; /* out of memory: the splits stay outstanding, which is safe */
            cp = &c->progress[c->num_progress++];
            *cp = (struct client_progress){.task_id = p[i].task_id};
        }
        if (p[i].done_below > cp->done_below) {
            cp->done_below = p[i].done_below;
            grew = true;
            prune(st, j, t);
        }
    }
    return grew;
}

static int orphans_append(sl_dstate_t *st, struct job *j, const struct osplit *o)
{
    if (sl__dstate_grow(&j->orphans, &j->cap_orphans, j->num_orphans, sizeof *j->orphans) < 0)
        return -ENOMEM;
    j->orphans[j->num_orphans++] = *o;
    j->orphans_dirty = true;
    sl__dstate_touch(st, j);
    return 0;
}

/* Moves t's outstanding splits from index `from` on to the orphans in state
 * `state`. @return how many moved */
static unsigned move_to_orphans(sl_dstate_t *st, struct job *j, struct task *t, unsigned from,
                                enum osplit_state state)
{
    unsigned moved = 0;
    for (unsigned i = from; i < t->out_num; i++) {
        struct osplit o = t->out[i];
        o.state = state;
        o.dirty = true;
        if (orphans_append(st, j, &o) < 0) {
            /* Cannot keep it: say so loudly; its records may be missing. */
            sl_log_error("job %" PRIu64 ": out of memory: split %" PRIu64 " (file %" PRIu32 " [%" PRIu64 ", %" PRIu64
                         ") of epoch %" PRIu64 ") of lost task %" PRIu64 " is not handed out again",
                         j->id, o.id, o.file, o.begin, o.end, o.epoch, t->id);
            if (i < t->out_saved)
                sl__dstate_del(st, SL_DT_OUTSTANDING, j->id, o.id);
            osplit_free(&t->out[i]);
            continue;
        }
        moved++;
    }
    t->out_num = from > t->out_head ? from : t->out_head;
    if (t->out_saved > t->out_num)
        t->out_saved = t->out_num;
    if (t->out_head == t->out_num)
        t->out_head = t->out_num = t->out_saved = 0;
    recount_given_back(t);
    return moved;
}

void sl__out_orphan(sl_dstate_t *st, struct job *j, struct task *t)
{
    if (!sl__out_tracked(j) || sl__out_count(t) == 0)
        return;
    unsigned n = move_to_orphans(st, j, t, t->out_head, OS_AWAIT);
    j->report_gen++;
    j->dirty = true;
    sl__dstate_touch(st, j);
    sl_log_warn("job %" PRIu64 ": %u splits of %s task %" PRIu64 " wait for the clients to say what they received "
                "(report %" PRIu64 ")", j->id, n, t->state == TASK_LOST ? "lost" : "drained", t->id, j->report_gen);
}

void sl__out_unreceived(sl_dstate_t *st, struct job *j, struct task *t, uint64_t below)
{
    if (!sl__out_tracked(j))
        return;
    unsigned from = t->out_head;
    while (from < t->out_num && t->out[from].id < below)
        from++;
    if (from == t->out_num)
        return;
    unsigned n = move_to_orphans(st, j, t, from, OS_QUEUED);
    sl_log_info("job %" PRIu64 ": task %" PRIu64 " ended without reading %u of its splits: they are handed out again",
                j->id, t->id, n);
}

/* Orders ranges by place. */
static int cmp_range(const void *a, const void *b)
{
    const sl_posrun_t *x = a, *y = b;
    return sl_posrun_before(*x, *y) ? -1 : sl_posrun_before(*y, *x);
}

/* Which splits a client's word of what it received is for: the orphans
 * that wait for reports (a worker loss), or every split that may still go
 * out again, outstanding at a task or orphaned (a client leaving). */
enum have_of { HAVE_AWAITING, HAVE_ALL };

static bool have_of(const struct osplit *o, enum have_of which)
{
    return (which == HAVE_ALL || o->state == OS_AWAIT) && o->end > o->begin && o->epoch <= UINT32_MAX;
}

/* Decodes the position set at payload (len bytes) into *got, keeping only
 * what lies in the splits `which` picks: a rank of a named job may say
 * millions of scattered records (a bitmap's worth), of which those splits
 * hold a few. @return 0 or as sl_posbits_decode_within(), why in why */
static int decode_for(sl_dstate_t *st, const struct job *j, enum have_of which, const uint8_t *payload, size_t len,
                      sl_posbits_t *got, char *why, size_t whylen)
{
    size_t most = j->num_orphans;
    for (unsigned k = 0; which == HAVE_ALL && k < j->num_tasks; k++)
        most += sl__out_count(&j->tasks[k]);
    sl_posrun_t *ranges = most ? malloc(most * sizeof *ranges) : NULL;
    if (most && !ranges)
        return -ENOMEM;
    size_t nr = 0;
    for (unsigned k = 0; which == HAVE_ALL && k < j->num_tasks; k++)
        for (unsigned i = j->tasks[k].out_head; i < j->tasks[k].out_num; i++) {
            const struct osplit *o = &j->tasks[k].out[i];
            if (have_of(o, which))
                ranges[nr++] = (sl_posrun_t){(uint32_t)o->epoch, o->file, o->begin, o->end - o->begin};
        }
    for (unsigned i = 0; i < j->num_orphans; i++) {
        const struct osplit *o = &j->orphans[i];
        if (have_of(o, which))
            ranges[nr++] = (sl_posrun_t){(uint32_t)o->epoch, o->file, o->begin, o->end - o->begin};
    }
    if (nr > 1)
        qsort(ranges, nr, sizeof *ranges, cmp_range);
    size_t kept = 0; /* splits do not overlap; ones that touch are joined */
    for (size_t i = 0; i < nr; i++) {
        sl_posrun_t *last = kept ? &ranges[kept - 1] : NULL;
        if (last && last->epoch == ranges[i].epoch && last->file == ranges[i].file &&
            ranges[i].begin <= last->begin + last->count) {
            uint64_t end = ranges[i].begin + ranges[i].count;
            if (end > last->begin + last->count)
                last->count = end - last->begin;
        } else {
            ranges[kept++] = ranges[i];
        }
    }
    sl_posbits_init(got, st->cfg.max_exclude_runs);
    int rc = sl_posbits_decode_within(got, payload, len, ranges, kept, why, whylen);
    free(ranges);
    return rc;
}

/* Adds what got holds of split o (one `which` picks) to its have.
 * @return the records added, or < 0 */
static int64_t have_add(const sl_posbits_t *got, struct osplit *o)
{
    uint32_t e = (uint32_t)o->epoch;
    if (sl_posbits_count(got, e, o->file, o->begin, o->end) == 0)
        return 0;
    if (!o->have && !(o->have = have_new(o)))
        return -ENOMEM;
    uint64_t before = sl_posbits_count(o->have, e, o->file, o->begin, o->end);
    int rc = sl_posbits_add_within(o->have, got, e, o->file, o->begin, o->end);
    o->dirty = true;
    return rc < 0 ? rc : (int64_t)(sl_posbits_count(o->have, e, o->file, o->begin, o->end) - before);
}

/* Adds what got holds to the have of each split `which` picks, marking
 * them to be stored again. @return the records added, or < 0 */
static int64_t have_add_all(sl_dstate_t *st, struct job *j, enum have_of which, const sl_posbits_t *got)
{
    int64_t added = 0, n = 0;
    for (unsigned k = 0; which == HAVE_ALL && k < j->num_tasks && n >= 0; k++) {
        struct task *t = &j->tasks[k];
        for (unsigned i = t->out_head; i < t->out_num && n >= 0; i++)
            if ((n = have_add(got, &t->out[i])) > 0) {
                added += n;
                t->out_rewrite = true;
            }
    }
    /* Not to splits given back (task 0): a client's word of what it
     * received may span records it did not get (a split it got every
     * record of counts as its whole range, skips and all), and those are
     * nobody's yet. */
    for (unsigned i = 0; i < j->num_orphans && n >= 0; i++)
        if (have_of(&j->orphans[i], which) && j->orphans[i].task_id != 0 &&
            (n = have_add(got, &j->orphans[i])) > 0)
            added += n;
    j->orphans_dirty = true;
    sl__dstate_touch(st, j);
    return n < 0 ? n : added;
}

int sl__out_report(sl_dstate_t *st, struct job *j, struct client *c, const sluice_ReportReceivedRequest *req,
                   const uint8_t *payload, size_t len, char *err, size_t errlen)
{
    if (req->report_gen != j->report_gen) {
        sl_log_debug("job %" PRIu64 ": client %" PRIu64 " answered report %" PRIu64 ", the job is at %" PRIu64, j->id,
                     c->id, req->report_gen, j->report_gen);
        return 0;
    }
    if (req->untracked) {
        sl_log_warn("job %" PRIu64 ": client %" PRIu64 " cannot say what it received of the lost workers' splits: "
                    "what it got of them may come again", j->id, c->id);
        c->reported_gen = req->report_gen;
        return 0;
    }
    sl_posbits_t got;
    char why[200];
    int rc = decode_for(st, j, HAVE_AWAITING, payload, len, &got, why, sizeof why);
    if (rc < 0) {
        sl_posbits_clear(&got);
        if (rc == -ENOSPC)
            return sl_errf(err, errlen, SL_ELIMIT, "report of client %" PRIu64 ": more than %u units of positions "
                           "within the lost splits (a unit a run, 22 a bitmap of 4096 positions; --max-exclude-runs)",
                           c->id, st->cfg.max_exclude_runs);
        return sl_errf(err, errlen, rc == -ENOMEM ? rc : SL_EDATA, "report of client %" PRIu64 ": %s", c->id,
                       rc == -ENOMEM ? "out of memory" : why);
    }
    int64_t added = have_add_all(st, j, HAVE_AWAITING, &got);
    sl_posbits_clear(&got);
    if (added < 0)
        return sl_errf(err, errlen, (int)added, "out of memory");
    sl_log_info("job %" PRIu64 ": client %" PRIu64 " reported for %" PRIu64 ": %" PRId64
                " more records of the lost splits received", j->id, c->id, req->report_gen, added);
    c->reported_gen = req->report_gen;
    return 0;
}

/* Why run r of what a client gives back cannot be taken, into why; NULL
 * when it can. */
static const char *return_refusal(const struct job *j, const sl_posrun_t *r, struct sl_place floor,
                                  char *why, size_t len)
{
    uint32_t files = sl__dataset_num_files(j->dataset);
    struct sl_place first = {.epoch = r->epoch, .file = r->file, .pos = r->begin};
    struct sl_place last = {.epoch = r->epoch, .file = r->file, .pos = r->begin + r->count - 1};
    struct sl_place cursor = {.epoch = j->split_epoch, .file = j->split_file, .pos = j->split_next};
    if (r->file >= files)
        snprintf(why, len, "records of file %" PRIu32 " (epoch %" PRIu32 "): the dataset has %" PRIu32 " files",
                 r->file, r->epoch, files);
    else if (sl__place_before(first, floor))
        snprintf(why, len, "record %" PRIu64 " of file %" PRIu32 " (epoch %" PRIu32 ") lies before the job's fold "
                 "(epoch %" PRIu64 ", file %" PRIu32 ", record %" PRIu64 "): every record there was given", r->begin,
                 r->file, r->epoch, floor.epoch, floor.file, floor.pos);
    else if (!sl__place_before(last, cursor))
        snprintf(why, len, "record %" PRIu64 " of file %" PRIu32 " (epoch %" PRIu32 ") was not handed out yet",
                 last.pos, r->file, r->epoch);
    else if (sl_posbits_count(&j->exclude, r->epoch, r->file, r->begin, r->begin + r->count) > 0)
        snprintf(why, len, "records of file %" PRIu32 " (epoch %" PRIu32 ") from %" PRIu64 " are of the restore's "
                 "exclusions: no split hands them out", r->file, r->epoch, r->begin);
    else
        return NULL;
    return why;
}

/* Queues run r as an orphan of its own, skipping nothing: a rank that
 * later gets every record of a split takes its whole range as its own
 * (a split-done notice says no more), so a split given back must not span
 * records that are not in it. Task 0: no task's. */
static int return_orphan(sl_dstate_t *st, struct job *j, const sl_posrun_t *r)
{
    struct osplit o = {.id = j->split_seq++, .epoch = r->epoch, .file = r->file, .state = OS_QUEUED,
                       .begin = r->begin, .end = r->begin + r->count, .dirty = true, .given_back = true};
    j->cursor_dirty = true; /* split_seq */
    return orphans_append(st, j, &o);
}

int sl__out_return(sl_dstate_t *st, struct job *j, const struct client *c, struct sl_place floor,
                   const uint8_t *payload, size_t len, size_t received_len, char *err, size_t errlen)
{
    sl_posbits_t back, got;
    sl_posbits_init(&back, st->cfg.max_exclude_runs);
    sl_posbits_init(&got, st->cfg.max_exclude_runs);
    char why[200] = "";
    const char *what = "what it gives back";
    int rc = received_len > len ? SL_EDATA : 0;
    if (rc < 0)
        snprintf(why, sizeof why, "received_length %zu is past the payload's %zu bytes", received_len, len);
    else
        rc = sl_posbits_decode(&back, payload + received_len, len - received_len, why, sizeof why);
    sl_posrun_t *runs = NULL;
    size_t n = 0;
    if (rc == 0)
        rc = sl_posbits_runs(&back, 0, &runs, &n);
    for (size_t i = 0; i < n && rc == 0; i++)
        if (return_refusal(j, &runs[i], floor, why, sizeof why))
            rc = SL_EDATA;
    if (rc == 0 && received_len > 0) {
        what = "what it received";
        rc = decode_for(st, j, HAVE_ALL, payload, received_len, &got, why, sizeof why);
    }
    if (rc < 0) {
        free(runs);
        sl_posbits_clear(&back);
        sl_posbits_clear(&got);
        if (rc == -ENOSPC)
            return sl_errf(err, errlen, SL_ELIMIT, "%s: more than %u units of positions (a unit a run, 22 a bitmap "
                           "of 4096 positions; --max-exclude-runs)", what, st->cfg.max_exclude_runs);
        return sl_errf(err, errlen, rc == -ENOMEM ? rc : SL_EDATA, "%s: %s", what,
                       rc == -ENOMEM ? "out of memory" : why);
    }
    /* What it received no longer comes again from the splits that hold it
     * when their workers are lost: what its caller was given is consumed,
     * and what it gives back goes out as splits of its own. */
    int64_t added = have_add_all(st, j, HAVE_ALL, &got);
    if (added >= 0)
        added = have_add_all(st, j, HAVE_ALL, &back);
    rc = added < 0 ? (int)added : 0;
    unsigned splits = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        rc = return_orphan(st, j, &runs[i]);
        splits += rc == 0;
    }
    uint64_t records = sl_posbits_size(&back);
    st->records_given_back += records;
    free(runs);
    sl_posbits_clear(&back);
    sl_posbits_clear(&got);
    if (rc < 0) {
        sl_log_error("job %" PRIu64 ": out of memory: of the %" PRIu64 " records client %" PRIu64 " gave back, "
                     "those past the %u splits queued are not handed out again", j->id, records, c->id, splits);
        return sl_errf(err, errlen, rc, "out of memory");
    }
    if (records == 0 && received_len > 0)
        return 0; /* nothing waited for its caller */
    sl_log_info("job %" PRIu64 ": client %" PRIu64 " leaves with %" PRIu64 " records its caller was not given: "
                "handed out again as %u splits%s", j->id, c->id, records, splits,
                received_len ? "" : " (it did not say what else it received: a worker lost later may send that again)");
    return 0;
}

bool sl__out_check_reports(sl_dstate_t *st, struct job *j)
{
    bool waiting = false, queued = false;
    for (unsigned i = 0; i < j->num_orphans; i++) {
        waiting |= j->orphans[i].state == OS_AWAIT;
        queued |= j->orphans[i].state == OS_QUEUED;
    }
    if (!waiting)
        return queued;
    for (unsigned i = 0; i < j->num_clients; i++)
        if (j->clients[i].reported_gen < j->report_gen)
            return queued;
    unsigned n = 0;
    uint64_t have = 0;
    for (unsigned i = 0; i < j->num_orphans; i++) {
        struct osplit *o = &j->orphans[i];
        if (o->state != OS_AWAIT)
            continue;
        o->state = OS_QUEUED;
        o->dirty = true;
        n++;
        have += o->have ? sl_posbits_size(o->have) : 0;
    }
    j->orphans_dirty = true;
    sl__dstate_touch(st, j);
    sl_log_info("job %" PRIu64 ": every client reported: %u splits of lost tasks are handed out again, without the %"
                PRIu64 " records the clients have", j->id, n, have);
    return true;
}

uint64_t sl__out_report_from(const struct job *j)
{
    uint64_t from = UINT64_MAX;
    for (unsigned i = 0; i < j->num_orphans; i++)
        if (j->orphans[i].state == OS_AWAIT && j->orphans[i].epoch < from)
            from = j->orphans[i].epoch;
    return from == UINT64_MAX ? 0 : from;
}

uint64_t sl__out_epochs_done(const struct job *j)
{
    if (!sl__out_tracked(j) || j->state != SL_JOB_RUNNING)
        return 0;
    /* The least place not confirmed is the least split outstanding at a
     * task or orphaned, whose epoch holds the number back, or else the
     * cursor, whose epoch is done once every split of it is out (the
     * cursor is past its last file). */
    return sl__out_epochs_done_at(j, sl__out_confirmed_below(j));
}

uint64_t sl__out_epochs_done_at(const struct job *j, struct sl_place at)
{
    return at.epoch + (at.file >= sl__dataset_num_files(j->dataset) ? 1 : 0);
}

struct sl_place sl__out_confirmed_below(const struct job *j)
{
    struct sl_place at = {.epoch = j->split_epoch, .file = j->split_file, .pos = j->split_next};
    for (unsigned k = 0; k < j->num_tasks; k++) {
        const struct task *t = &j->tasks[k];
        for (unsigned i = t->out_head; i < t->out_num; i++) {
            struct sl_place p = {.epoch = t->out[i].epoch, .file = t->out[i].file, .pos = t->out[i].begin};
            if (sl__place_before(p, at))
                at = p;
        }
    }
    for (unsigned i = 0; i < j->num_orphans; i++) {
        struct sl_place p = {.epoch = j->orphans[i].epoch, .file = j->orphans[i].file, .pos = j->orphans[i].begin};
        if (sl__place_before(p, at))
            at = p;
    }
    return at;
}

/* Drops orphan i (handed out whole, or all of it received). */
static void orphan_remove(sl_dstate_t *st, struct job *j, unsigned i)
{
    sl__dstate_del(st, SL_DT_OUTSTANDING, j->id, j->orphans[i].id);
    osplit_free(&j->orphans[i]);
    memmove(&j->orphans[i], &j->orphans[i + 1], (j->num_orphans - i - 1) * sizeof *j->orphans);
    j->num_orphans--;
}

/* The ranges of the splits a task holds, sorted by place, to tell whether
 * a split meets one of them: a worker tells a record's split by its place,
 * so the splits a task holds must not overlap, and a split given back lies
 * inside the range of the split it came from, which a task may still hold
 * (its shuffle buffer keeps that split's other records). */
struct held {
    sl_posrun_t *r;
    size_t n;
};

static int held_of(const struct task *t, struct held *h)
{
    h->n = 0;
    h->r = sl__out_count(t) ? malloc(sl__out_count(t) * sizeof *h->r) : NULL;
    if (sl__out_count(t) && !h->r)
        return -ENOMEM;
    for (unsigned i = t->out_head; i < t->out_num; i++) {
        const struct osplit *o = &t->out[i];
        h->r[h->n++] = (sl_posrun_t){(uint32_t)o->epoch, o->file, o->begin, o->end - o->begin};
    }
    if (h->n > 1)
        qsort(h->r, h->n, sizeof *h->r, cmp_range);
    return 0;
}

/* Whether o meets a range of h (the splits a task holds do not overlap one
 * another, so only the last one that starts before o's end can). */
static bool meets(const struct held *h, const struct osplit *o)
{
    sl_posrun_t end = {(uint32_t)o->epoch, o->file, o->end, 0};
    size_t lo = 0, hi = h->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (sl_posrun_before(h->r[mid], end))
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return false;
    const sl_posrun_t *r = &h->r[lo - 1];
    return r->epoch == o->epoch && r->file == o->file && r->begin + r->count > o->begin;
}

bool sl__out_waits_for(const struct job *j, const struct task *t)
{
    if (j->num_orphans == 0)
        return false; /* the end of every epoch asks: no sort then */
    struct held h;
    if (held_of(t, &h) < 0)
        return true; /* out of memory: it asks again */
    bool waits = false;
    for (unsigned i = 0; i < j->num_orphans && !waits; i++)
        waits = j->orphans[i].state == OS_AWAIT || !meets(&h, &j->orphans[i]);
    free(h.r);
    return waits;
}

int sl__out_reissue(sl_dstate_t *st, struct job *j, struct task *t, sluice_GetSplitResponse *resp, unsigned max)
{
    struct held h = {NULL, 0};
    bool held_known = false; /* h is made at the first queued orphan: lost ones may all await reports */
    pb_size_t before = resp->splits_count; /* the splits handed from here on are not in h */
    for (unsigned i = 0; i < j->num_orphans && resp->splits_count < max;) {
        struct osplit *o = &j->orphans[i];
        if (o->state == OS_QUEUED && !held_known) {
            if (held_of(t, &h) < 0)
                return -ENOMEM;
            held_known = true;
        }
        bool meets_new = false;
        for (unsigned k = t->out_num - (resp->splits_count - before); k < t->out_num && !meets_new; k++)
            meets_new = t->out[k].epoch == o->epoch && t->out[k].file == o->file && t->out[k].begin < o->end &&
                        o->begin < t->out[k].end;
        if (o->state != OS_QUEUED || meets_new || meets(&h, o)) {
            i++; /* waits for reports, or for t to be done with what it meets */
            continue;
        }
        uint64_t end = o->end, offset = t->last_skips_len;
        uint32_t take = 0;
        int rc = o->have ? sl__dstate_split_skips(st, t, o->have, (uint32_t)o->epoch, o->file, o->begin, &end, &take)
                         : 0;
        if (rc == 1) {
            orphan_remove(st, j, i); /* every record of it arrived: nothing to hand out */
            continue;
        }
        if (rc == 2)
            break; /* no room for its skips in this answer: the next one */
        if (rc < 0) {
            free(h.r);
            return rc;
        }
        sluice_Split *s = &resp->splits[resp->splits_count];
        *s = (sluice_Split){.split_id = j->split_seq++, .file_index = o->file, .begin = o->begin, .end = end,
                            .epoch = o->epoch, .skip_offset = take ? offset : 0, .skip_count = take};
        j->cursor_dirty = true; /* split_seq */
        sl__dstate_touch(st, j);
        if (sl__out_add(st, j, t, s, take ? t->last_skips + offset : NULL) < 0) {
            t->last_skips_len = (size_t)offset;
            free(h.r);
            return -ENOMEM;
        }
        resp->splits_count++;
        if (o->given_back || o->task_id == 0) {
            /* task 0: loaded from the store, which does not keep the flag */
            t->out[t->out_num - 1].given_back = true;
            t->out_given_back++;
        }
        sl_log_debug("job %" PRIu64 ": split %" PRIu64 " (file %" PRIu32 " [%" PRIu64 ", %" PRIu64 ") of epoch %" PRIu64
                     ", %" PRIu32 " runs skipped) handed again to task %" PRIu64 " as split %" PRIu64, j->id, o->id, o->file,
                     o->begin, end, o->epoch, take, t->id, s->split_id);
        if (end == o->end) {
            orphan_remove(st, j, i);
        } else {
            /* The rest waits for the next answer: what the clients have of
             * the front went out with it (its skips). The stored record
             * holds runs inside [begin, end) only: a restart refused the
             * store when the front's were kept. */
            o->begin = end;
            if (o->have)
                sl_posbits_drop_before(o->have, (uint32_t)o->epoch, o->file, end);
            o->dirty = true;
            j->orphans_dirty = true;
            sl__dstate_touch(st, j);
            break;
        }
    }
    free(h.r);
    return 0;
}

void sl__out_clear(sl_dstate_t *st, struct job *j)
{
    bool stored = j->num_orphans > 0;
    for (unsigned k = 0; k < j->num_tasks; k++) {
        struct task *t = &j->tasks[k];
        stored |= t->out_saved > t->out_head;
        sl__out_free_task(t);
    }
    sl__out_free_job(j);
    /* Every record of the job: a split id of UINT64_MAX stands for all. */
    if (stored)
        sl__dstate_del(st, SL_DT_OUTSTANDING, j->id, UINT64_MAX);
}

void sl__out_free_task(struct task *t)
{
    for (unsigned i = t->out_head; i < t->out_num; i++)
        osplit_free(&t->out[i]);
    free(t->out);
    t->out = NULL;
    t->out_head = t->out_num = t->out_cap = t->out_saved = t->out_given_back = 0;
}

void sl__out_free_job(struct job *j)
{
    for (unsigned i = 0; i < j->num_orphans; i++)
        osplit_free(&j->orphans[i]);
    free(j->orphans);
    j->orphans = NULL;
    j->num_orphans = j->cap_orphans = 0;
    j->orphans_dirty = false;
}

void sl__out_free_client(struct client *c)
{
    free(c->progress);
    c->progress = NULL;
    c->num_progress = c->cap_progress = 0;
}
