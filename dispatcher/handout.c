/*
 * handout.c: DYNAMIC split hand-out (GetSplit, docs/architecture.md): a
 * request asked again gets the same answer; a task held at
 * --max-outstanding-splits waits; lost workers' splits go out first; then
 * splits from the job's cursor, epoch by epoch, at most half a task's share
 * of what is left (or, for a task that says its rate, within the share
 * that makes the job's tasks end together with the splits they have
 * queued: balanced_share()), with the skip runs of a restored iterator's
 * exclusions.
 * A split is as long as its worker asks for (split_records: its rate times
 * its target time per split), a multiple of the dataset's split size, kept
 * between it and --max-split-size and, guided self-scheduling while two or
 * more tasks read, at most 1/GUIDED_PARTS of
 * a live task's share of what is left (but not below 1/GUIDED_FLOOR of the
 * length asked for, within that share, nor below a crumb of it at the very
 * end), so that splits shrink toward the end of an epoch and the workers
 * finish it together.
 */
#include "state.h"
#include "state_types.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "log.h"
#include "outstanding.h"

/* How long a task waits before asking for splits again when its job has
 * none for it yet (GetSplitResponse.retry_ms). */
#define RETRY_SPLITS_MS 50

/* With two or more live tasks, a split is at most 1/GUIDED_PARTS of a live
 * task's share of the records left, and an answer at most half that share
 * (sl_dstate_get_splits()'s fair): a worker keeps up to 8 splits queued
 * (workerd's split_prefetch) and asks again once half are read, so an
 * answer of 4 splits reaches that bound. With 1/16 an answer took a
 * quarter of the share: a range of 40,000,000 read by 2 workers took 40
 * hand-outs (each a commit of the state store), 4 workers 72; with 1/8, 30
 * and 56 (a job after the first of its dataset, whose workers know their
 * rate), and the workers finish the epoch as close together (a model of
 * the hand-out at rates of 10^5 to 10^8 records a second, 2 to 8 workers).
 * A lone task keeps splits of the length it asks for to the end: shrinking
 * them would only make it wait on more hand-outs. */
#define GUIDED_PARTS 8

/* ...but not below 1/GUIDED_FLOOR of the length the task asked for (at
 * most --max-split-size), unless that is more than a live task's share of
 * what is left: at the end of the epoch its queue of 8 then holds about
 * one split's target time, and every live task still gets splits of it.
 * Shrinking to the least size gave a fast epoch hundreds of splits (a
 * range of 40,000,000 read by 2 workers: 291 splits in 67 hand-outs, each
 * a commit of the state store; 129 in 40 with the floor, at 1/16 of a
 * share), and as many split-done notices.
 *
 * In the epoch's last floor split per live task, a split is never below a
 * crumb, 1/live of that floor (but at most half of a live task's share of
 * the whole epoch, so that a small epoch still reaches every live task),
 * and one that would leave less than a crumb takes all that is left.
 * Bounded by the share alone, the tail halved with each answer (each task
 * took half of what the one before left) down to the least size:
 * 40,000,000 records read by 2 workers ended with 10 answers of 131,072,
 * 92,160, 46,080 ... 1,024 and 512 records, each a commit and a wait for a
 * worker whose queue had run dry; with the crumb, 3 (and 20 hand-outs in
 * the epoch, not 28; 4 workers 37, not 56). A crumb is 1/(8 live) of a
 * split's target time; a task's last split is less than a floor split and
 * a crumb. */
#define GUIDED_FLOOR 8

/* The length of the next split of d from a cursor with left records left
 * in the epoch, for a task that asked for want records (0: no wish). */
/* How many times its length a restored job's split may grow to hold that
 * many records not consumed yet. */
#define SPARSE_GROWTH 64

/* Where a restored job's split of [begin, end) ends so that it holds `len`
 * records its checkpoint (ex) does not: past a place that lags what the
 * ranks read, most records were consumed, and splits of `len` records of
 * range would deliver a few dozen each, so that a shuffle buffer spans
 * hundreds of them (past --max-outstanding-splits). It grows to at most
 * SPARSE_GROWTH times len, within the file (total records), in at most as
 * many steps, each by what it lacks at the density seen so far; one wholly
 * consumed stays as it is. */
static uint64_t sparse_end(const sl_posbits_t *ex, uint32_t epoch, uint32_t file, uint64_t begin, uint64_t end,
                           uint64_t len, uint64_t total)
{
    uint64_t cap = total - begin > len * SPARSE_GROWTH ? begin + len * SPARSE_GROWTH : total;
    uint64_t left = (end - begin) - sl_posbits_count(ex, epoch, file, begin, end);
    if (left == 0)
        return end; /* all consumed: the hand-out steps past the consumed run at once */
    for (int i = 0; i < SPARSE_GROWTH && left < len && end < cap; i++) {
        /* As many more as lack, at the density seen so far. */
        uint64_t per = (end - begin) / left; /* at least 1 */
        uint64_t more = len - left > UINT64_MAX / per ? UINT64_MAX : (len - left) * per;
        uint64_t to = cap - end > more ? end + more : cap;
        left += (to - end) - sl_posbits_count(ex, epoch, file, end, to);
        end = to;
    }
    return end;
}

static uint64_t split_length(const sl_dstate_t *st, const struct dataset *d, uint64_t want, uint64_t left,
                             unsigned live)
{
    uint64_t min = d->split_size;
    if (want <= min)
        return min;
    if (want > st->cfg.max_split_size)
        want = st->cfg.max_split_size;
    if (live >= 2) {
        uint64_t guided = left / ((uint64_t)GUIDED_PARTS * live), share = left / live;
        uint64_t at_least = want / GUIDED_FLOOR, crumb = at_least / live;
        uint64_t epoch_half_share = sl__dataset_records(d) / (2 * (uint64_t)live);
        if (crumb > epoch_half_share)
            crumb = epoch_half_share;
        if (at_least > share)
            at_least = share > crumb ? share : crumb;
        if (guided < at_least)
            guided = at_least;
        if (want > guided)
            want = guided;
        if (want >= left || left - want < crumb) {
            /* Less than a crumb would be left: this split takes the rest
             * (it ends at its file's end, so it holds at most left records). */
            if (left <= st->cfg.max_split_size)
                return (left + min - 1) / min * min;
            want = st->cfg.max_split_size;
        }
    }
    /* A multiple of the least: what that size keeps (whole batches, see
     * split_size_for() in state.c) holds for every split. */
    want = want / min * min;
    return want > min ? want : min;
}

const uint8_t *sl_dstate_split_skips(sl_dstate_t *st, uint64_t task_id, size_t *len)
{
    struct job *j = NULL;
    struct task *t = sl__dstate_task(st, task_id, &j);
    *len = t && t->last_skips ? t->last_skips_len : 0;
    return *len ? t->last_skips : NULL;
}

/* Where w remembers a split length of dataset_id in its rates, or -1 (an
 * entry is made with a length: an empty one matches no dataset). */
static int rate_index(const struct worker *w, uint64_t dataset_id)
{
    for (int i = 0; i < SL_WORKER_RATES; i++)
        if (w->rates[i].dataset_id == dataset_id && w->rates[i].split_records > 0)
            return i;
    return -1;
}

/* Keeps what w's task asked for of dataset_id: the splits a first request
 * asks for, and the length of a split, for sl__dstate_first_splits(). */
static void remember_request(struct worker *w, uint64_t dataset_id, const sluice_GetSplitRequest *req)
{
    if (req->cross_epochs)
        w->cross_epochs = true;
    if (req->request_seq == 0)
        return; /* not numbered: its first request could not find an answer made ahead */
    if (req->request_seq == 1)
        w->first_max_splits = req->max_splits ? req->max_splits : 1;
    if (req->split_records == 0)
        return;
    int i = rate_index(w, dataset_id);
    if (i < 0) {
        i = (int)w->rates_next;
        w->rates_next = (w->rates_next + 1) % SL_WORKER_RATES;
    }
    w->rates[i] = (struct worker_rate){.dataset_id = dataset_id, .split_records = req->split_records};
}

/* Moves j's cursor to the start of its next epoch. */
static void open_next_epoch(sl_dstate_t *st, struct job *j)
{
    j->cursor_dirty = true;
    sl__dstate_touch(st, j);
    j->split_epoch++;
    j->split_file = 0;
    j->split_next = 0;
    j->split_epoch_handed = 0;
}

/* The records left from j's cursor: to its epoch's end, and with cross
 * also every later epoch's below its dataset's passes (at most
 * UINT64_MAX). */
static uint64_t records_ahead(const struct job *j, bool cross)
{
    uint64_t left = sl__job_records_left(j);
    if (!cross || j->split_epoch + 1 >= j->dataset->passes)
        return left;
    uint64_t epochs = j->dataset->passes - j->split_epoch - 1, each = sl__dataset_records(j->dataset);
    if (epochs > (UINT64_MAX - left) / each)
        return UINT64_MAX;
    return left + epochs * each;
}

/* The records a request says its task has queued: its slack at its rate. */
static double said_queued(const sluice_GetSplitRequest *req)
{
    return (double)req->slack_ms / 1000.0 * (double)req->records_per_second;
}

/* The records task t of j may take in this answer so that j's live tasks
 * finish what is left of the epoch together (or UINT64_MAX: no bound).
 * Each live task's queue lasts till now + queued / rate; what is left from
 * the cursor, left, goes to them so that all end at one time T:
 * (left + every queue) / (the rates together). t's share is T times its
 * rate less its own queue: 0 when its queue alone lasts past T, and then
 * the others, whose queues run out sooner, take what is left. t's rate and
 * queue are what its request says (records_per_second, slack_ms); another
 * task's are what it said at its last answer, plus what that answer gave
 * it, drained at its rate since (a task that said no rate counts at t's
 * rate, with the splits it was handed as its queue). Without it, each task
 * took up to half its share of what was left without regard to the splits
 * it had queued, and its queue when the cursor ran out was what set it
 * apart from the others: a range of 40,000,000 read by 2 workers ended
 * with one worker's queue at 39 ms, the other's at 11 ms, and the first
 * read alone for up to 60 ms. */
static uint64_t balanced_share(const struct job *j, const struct task *t, const sluice_GetSplitRequest *req,
                               uint64_t left, int64_t now)
{
    if (req->records_per_second == 0 || left == UINT64_MAX)
        return UINT64_MAX;
    double rate = (double)req->records_per_second, queued = said_queued(req);
    double work = (double)left + queued, rates = rate;
    for (unsigned k = 0; k < j->num_tasks; k++) {
        const struct task *o = &j->tasks[k];
        if (o == t || !sl__task_live(o))
            continue;
        double r = o->split_rate > 0 ? (double)o->split_rate : rate;
        double q = (double)o->queued_records - r * (double)(now - o->queued_at) / 1000.0;
        work += q > 0 ? q : 0;
        rates += r;
    }
    /* Rounded up: a share of less than a record is one record. Cut to 0,
     * the last record of an epoch read by tasks at one rate with nothing
     * queued was each one's half, and each was told the others take it. */
    double share = work / rates * rate - queued;
    if (share <= 0)
        return 0;
    if (share >= 1.8e19)
        return UINT64_MAX;
    uint64_t whole = (uint64_t)share;
    return (double)whole < share ? whole + 1 : whole;
}

/* What balanced_share() counts of t at now: the rate and queue its request
 * says, with the splits of its answer resp (NULL: none). */
static void note_queue(struct task *t, const sluice_GetSplitRequest *req, const sluice_GetSplitResponse *resp,
                       int64_t now)
{
    double q = said_queued(req);
    for (pb_size_t k = 0; resp && k < resp->splits_count; k++)
        q += (double)(resp->splits[k].end - resp->splits[k].begin);
    t->split_rate = req->records_per_second;
    t->queued_records = q >= 1.8e19 ? UINT64_MAX : (uint64_t)q; /* both as a peer says them */
    t->queued_at = now;
}

/* Room in t's last answer for one of up to max splits, what it holds
 * kept: made before the cursor moves, so that no answer is handed out that
 * could not be kept. @return 0 or -ENOMEM */
static int last_answer_room(struct task *t, unsigned max)
{
    struct last_answer *a = t->last_splits;
    if (a && a->num >= max)
        return 0;
    a = realloc(a, sizeof *a + (size_t)max * sizeof a->splits[0]);
    if (!a)
        return -ENOMEM;
    if (!t->last_splits)
        *a = (struct last_answer){0};
    t->last_splits = a;
    return 0;
}

/* Keeps resp as t's last answer, in the room last_answer_room() made, and
 * then in as much as its splits take. */
static void last_answer_keep(struct task *t, const sluice_GetSplitResponse *resp)
{
    struct last_answer *a = t->last_splits;
    a->epoch = resp->epoch;
    a->end_of_epoch = resp->end_of_epoch;
    a->finished = resp->finished;
    a->num = resp->splits_count;
    memcpy(a->splits, resp->splits, a->num * sizeof a->splits[0]);
    struct last_answer *fit = realloc(a, sizeof *a + a->num * sizeof a->splits[0]);
    if (fit)
        t->last_splits = fit; /* else the larger block serves */
}

/* The answer kept, given again. */
static void last_answer_give(const struct last_answer *a, sluice_GetSplitResponse *resp)
{
    *resp = (sluice_GetSplitResponse){.epoch = a->epoch, .end_of_epoch = a->end_of_epoch, .finished = a->finished,
                                      .splits_count = a->num};
    memcpy(resp->splits, a->splits, a->num * sizeof a->splits[0]);
}

int sl_dstate_get_splits(sl_dstate_t *st, const sluice_GetSplitRequest *req, int64_t now,
                         sluice_GetSplitResponse *resp, char *err, size_t errlen)
{
    struct job *j = NULL;
    struct task *t = sl__dstate_task(st, req->task_id, &j);
    if (!t) {
        return sl_errf(err, errlen, SL_ENOTFOUND, "task %" PRIu64 " is unknown", req->task_id);
    }
    if (j->sharding != SL_SHARDING_DYNAMIC) {
        return sl_errf(err, errlen, SL_EINVAL, "job %" PRIu64 " is not DYNAMIC: it has no splits", j->id);
    }
    if (!sl__task_live(t)) {
        /* A task declared lost (its worker alive but cut off, or stuck) gets
         * nothing more: its splits go to the others, and its clients no
         * longer read it. */
        resp->epoch = req->epoch;
        resp->end_of_epoch = true;
        resp->finished = true;
        return 0;
    }
    struct worker *w = sl__dstate_worker(st, t->worker_id);
    if (w)
        remember_request(w, j->dataset->id, req);
    bool tracked = sl__out_tracked(j) && j->state == SL_JOB_RUNNING;
    /* A worker that did not get our answer (we or the connection died)
     * asks again with the same request_seq: it gets the same splits, so a
     * split is never handed out without reaching its worker. A task's
     * first request finds its answer here too when the job's creation
     * handed it its first splits (sl__dstate_first_splits()). */
    if (req->request_seq != 0 && req->request_seq <= t->split_req_seq) {
        if (req->request_seq == t->split_req_seq && t->last_splits) {
            last_answer_give(t->last_splits, resp);
            /* At the bound as answers are (below), for the base bound: its
             * worker has the batches of these splits acknowledged at once. */
            resp->at_bound = tracked && sl__out_bounded(t) >= st->cfg.max_outstanding;
            return 0;
        }
        return sl_errf(err, errlen, SL_EINVAL,
                       "task %" PRIu64 " asked for splits with request_seq %" PRIu64 ", older than its last "
                   "answered request %" PRIu64, t->id, req->request_seq, t->split_req_seq);
    }
    t->last_skips_len = 0; /* a new answer: none of the last one's skips */
    struct dataset *d = j->dataset;
    uint32_t nfiles = sl__dataset_num_files(d);
    resp->epoch = req->epoch;
    if (w && w->draining && j->num_consumers == 0) {
        /* A drained worker's splits go to the others from now on. A task
         * of coordinated reads keeps getting them: it serves the rounds
         * below its end_round, each of which must have a batch for every
         * consumer, and is done once the consumers are past them
         * (state.c, coord_drained_done()). */
        resp->end_of_epoch = true;
        resp->finished = true;
        return 0;
    }
    /* At most what the request asks for (0 means one) and an answer holds. */
    unsigned max = req->max_splits ? req->max_splits : 1;
    if (max > pb_arraysize(sluice_GetSplitResponse, splits))
        max = pb_arraysize(sluice_GetSplitResponse, splits);
    /* Its worker saw every batch of its splits below this acknowledged:
     * those are confirmed before the bound is counted, so that a task held
     * at it goes on without its clients' heartbeats. */
    if (tracked)
        sl__out_received(st, j, t, req);
    /* No answer takes a task past --max-outstanding-splits, but for a
     * batch a coordinated consumer waits for outside the rounds (a
     * stand-in's): that consumer may be the one whose confirmations would
     * free the task, and its batches of the task's rounds wait behind the
     * one it waits for. Those get a split an answer, up to a split more for
     * each round every consumer may ask ahead (the rounds a lost worker
     * leaves to stand-ins end where the consumers may reach). */
    unsigned bound = st->cfg.max_outstanding, bounded = tracked ? sl__out_bounded(t) : 0;
    if (tracked && req->for_extra && j->num_consumers > 0 && bounded >= bound) {
        uint64_t extra = st->cfg.round_lookahead * j->num_consumers;
        bound = extra > UINT32_MAX - bound ? UINT32_MAX : bound + (unsigned)extra;
        max = 1;
    }
    /* Held at the bound, its pipeline waiting for a split while the oldest
     * it holds is not finished (task_check_held() saw it so): its splits
     * may hold too few records for its buffers to let one finish, as a lost
     * worker's handed out again without what the clients received do
     * (sparse, dozens of them to a shuffle buffer of one split's records).
     * It gets a split past the bound, up to sl__held_cap(), each time
     * its worker's heartbeat shows it so again. */
    if (tracked && t->held_full_since != 0 && bounded >= bound && bounded < sl__held_cap(st)) {
        bound = bounded + 1;
        max = 1;
        t->held_full_since = 0;
    }
    if (tracked && bounded < bound && max > bound - bounded)
        max = bound - bounded;
    if (req->request_seq != 0 && last_answer_room(t, max) < 0)
        return sl_errf(err, errlen, -ENOMEM, "out of memory");
    if (tracked && bounded >= bound) {
        /* Its clients are that far behind: hold it back until they report
         * (task_check_held() fails the job if they are not). */
        t->held = true;
        resp->retry_ms = RETRY_SPLITS_MS;
        resp->at_bound = true;
        return 0;
    }
    if (tracked && j->num_orphans > 0) {
        /* Lost workers' splits first, whatever epoch the task is in. */
        int rc = sl__out_reissue(st, j, t, resp, max);
        if (rc < 0) {
            return sl_errf(err, errlen, rc, "out of memory");
        }
        if (resp->splits_count > 0)
            goto answered;
    }
    /* A task that takes splits of later epochs gets them once its own ran
     * out, up to the epochs every pipeline reads (never one its pipeline
     * might not reach); not of an empty source, whose epochs would open
     * without end. */
    bool cross = req->cross_epochs && d->passes > 1 && sl__dataset_records(d) > 0;
    if (j->state != SL_JOB_RUNNING || (req->epoch < j->split_epoch && !cross)) {
        resp->end_of_epoch = true;
        return 0;
    }
    if (req->epoch == j->split_epoch + 1 && j->split_file >= nfiles) {
        open_next_epoch(st, j);
    } else if (req->epoch > j->split_epoch) {
        return sl_errf(err, errlen, SL_EINVAL,
                       "job %" PRIu64 " is in epoch %" PRIu64 "; task %" PRIu64 " asked for epoch %" PRIu64,
                   j->id, j->split_epoch, t->id, req->epoch);
    }
    bool excl = sl_posbits_units(&j->exclude) > 0;
    /* Guided hand-out: no task takes more than half its share of what is
     * left of the epoch in one answer, so a worker asking for many splits
     * at a time (to make each commit count) leaves some for the others
     * near the end. */
    unsigned live = 0;
    for (unsigned k = 0; k < j->num_tasks; k++)
        live += sl__task_live(&j->tasks[k]);
    uint64_t left = records_ahead(j, cross), halves = 2 * (uint64_t)(live ? live : 1);
    uint64_t fair = left / halves + (left % halves != 0); /* rounded up, without overflow at UINT64_MAX */
    if (live >= 2 && left > 0) {
        uint64_t balanced = balanced_share(j, t, req, left, now);
        if (balanced == 0) {
            /* Its queue lasts past the others': they take what is left.
             * It asks again at half its queue (the others' may have
             * run slower than they said). */
            note_queue(t, req, NULL, now);
            uint32_t ms = req->slack_ms / 2;
            resp->retry_ms = ms < 1 ? 1 : ms > RETRY_SPLITS_MS ? RETRY_SPLITS_MS : ms;
            st->split_requests_left_to_others++;
            return 0;
        }
        /* Within its balanced share; and up to half of it in one answer
         * when that is more than half its share of what is left: at an
         * epoch's end, a task whose queue runs short takes what the others'
         * long queues leave in one or two answers, not a quarter of what is
         * left at a time. */
        if (balanced != UINT64_MAX)
            fair = balanced <= fair ? balanced : balanced / 2 > fair ? balanced / 2 : fair;
    }
    uint64_t given = 0;
    /* Splits never cross a file; empty files are stepped over. */
    while (resp->splits_count < max && (live < 2 || resp->splits_count == 0 || given < fair)) {
        if (j->split_file >= nfiles) {
            if (!cross || j->split_epoch + 1 >= d->passes)
                break;
            open_next_epoch(st, j);
            continue;
        }
        uint64_t total = sl__dataset_file_records(d, j->split_file);
        if (j->split_next >= total) {
            j->split_file++;
            j->split_next = 0;
            j->cursor_dirty = true;
            sl__dstate_touch(st, j);
            continue;
        }
        uint64_t begin = j->split_next;
        uint64_t len = split_length(st, d, req->split_records, records_ahead(j, cross), live);
        uint64_t end = total - begin > len ? begin + len : total;
        uint32_t skips = 0;
        uint64_t skip_offset = t->last_skips_len;
        if (excl && len <= UINT64_MAX / SPARSE_GROWTH)
            end = sparse_end(&j->exclude, (uint32_t)j->split_epoch, j->split_file, begin, end, len, total);
        if (excl) {
            int rc = sl__dstate_split_skips(st, t, &j->exclude, (uint32_t)j->split_epoch, j->split_file, begin,
                                            &end, &skips);
            if (rc == 1) {
                /* Every record of it was consumed already: step past the
                 * whole run of consumed records at once, not a split at a
                 * time (a checkpoint's one run over 2^62 records would
                 * otherwise hold the loop for hours). */
                uint64_t to = sl_posbits_covered_to(&j->exclude, (uint32_t)j->split_epoch, j->split_file, begin);
                j->split_next = to > end ? (to < total ? to : total) : end;
                j->cursor_dirty = true;
                sl__dstate_touch(st, j);
                continue;
            }
            if (rc == 2)
                break; /* no room for its skips in this answer: the next one */
            if (rc < 0) {
                return sl_errf(err, errlen, rc, "out of memory");
            }
        }
        sluice_Split *s = &resp->splits[resp->splits_count];
        j->cursor_dirty = true;
        sl__dstate_touch(st, j);
        s->split_id = j->split_seq++;
        s->file_index = j->split_file;
        s->begin = begin;
        s->end = end;
        s->epoch = j->split_epoch;
        s->skip_offset = skips ? skip_offset : 0;
        s->skip_count = skips;
        if (tracked && sl__out_add(st, j, t, s, skips ? t->last_skips + skip_offset : NULL) < 0) {
            t->last_skips_len = skip_offset;
            return sl_errf(err, errlen, -ENOMEM, "out of memory");
        }
        resp->splits_count++;
        given += s->end - s->begin;
        j->split_next = s->end;
        j->split_epoch_handed++;
    }
    /* Step past a finished last file now, so that the epoch counts as
     * exhausted as soon as its last split is out. */
    while (j->split_file < nfiles && j->split_next >= sl__dataset_file_records(d, j->split_file)) {
        j->split_file++;
        j->split_next = 0;
        j->cursor_dirty = true;
        sl__dstate_touch(st, j);
    }
    resp->end_of_epoch = resp->splits_count == 0;
    if (resp->end_of_epoch && tracked && sl__out_waits_for(j, t)) {
        /* Lost splits wait for the clients' reports: the epoch is not over
         * yet, and the task may take them once they are queued. */
        resp->end_of_epoch = false;
        resp->retry_ms = RETRY_SPLITS_MS;
    }
answered:
    /* Its next request waits unless its clients confirm: its worker has
     * them acknowledge its batches at once meanwhile. */
    resp->at_bound = tracked && sl__out_bounded(t) >= bound;
    note_queue(t, req, resp, now);
    if (req->request_seq != 0 && resp->splits_count > 0) {
        last_answer_keep(t, resp);
        t->split_req_seq = req->request_seq;
        t->handout_dirty = true;
        sl__dstate_touch(st, j);
    }
    return 0;
}

void sl__dstate_first_splits(sl_dstate_t *st, struct job *j, int64_t now)
{
    if (j->sharding != SL_SHARDING_DYNAMIC || j->split_epoch != 0 || sl_posbits_units(&j->exclude) > 0)
        return;
    for (unsigned k = 0; k < j->num_tasks; k++) {
        struct task *t = &j->tasks[k];
        const struct worker *w = sl__dstate_worker(st, t->worker_id);
        int i = w ? rate_index(w, j->dataset->id) : -1;
        if (i < 0 || !w->first_max_splits || t->split_req_seq != 0)
            continue;
        /* The request the task's pipeline makes first: epoch 0, its whole
         * queue, splits of the length its worker's tasks asked for last. */
        sluice_GetSplitRequest req = {.task_id = t->id,
                                      .epoch = 0,
                                      .max_splits = w->first_max_splits,
                                      .request_seq = 1,
                                      .split_records = w->rates[i].split_records,
                                      .cross_epochs = w->cross_epochs};
        sluice_GetSplitResponse resp = sluice_GetSplitResponse_init_zero;
        char err[256];
        if (sl_dstate_get_splits(st, &req, now, &resp, err, sizeof err) < 0)
            sl_log_debug("job %" PRIu64 ": task %" PRIu64 " asks for its first splits itself: %s", j->id, t->id, err);
        else if (resp.splits_count > 0)
            st->first_splits_with_job++;
    }
}
