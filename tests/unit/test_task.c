/*
 * test_task.c: the worker's task runner (workerd/task.c) without a worker:
 * the test is its dispatcher (it answers the task's split requests) and its
 * client (it takes batches, hands them "to a connection", releases them).
 * Under DYNAMIC behind a shuffle buffer of 100,000 elements, every split
 * handed out comes back in exactly one split-done notice, with every record
 * delivered, however many splits finish at once at the end; the task is DONE
 * only after its end of sequence carried the last of them, and its
 * done_below then covers every split (a notice left unsaid made the
 * dispatcher hand splits out again: a shuffle of 100,000 repeated 14% of an
 * epoch), and no frame's done_below passes a split not noticed yet. Also: a task over OFF yields the whole range, and the buffer holds
 * the pipeline back while nobody takes batches; a DYNAMIC task asks for
 * splits of its target length, never past its prefetch bound, and reads
 * splits of any length exactly once.
 */
#include <criterion/criterion.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "provwire.h"
#include "thread_util.h"
#include "shm.h"
#include "task.h"

struct run {
    struct event_base *base;
    sl_task_t *task;
    int notified;
};

static void on_notify(sl_task_t *task, void *arg)
{
    (void)task;
    ((struct run *)arg)->notified++;
}

static sl_task_config_t config(void)
{
    return (sl_task_config_t){.buffer_bytes = 64u << 20, .buffer_batches = 16, .max_batch_bytes = 256u << 20,
                              .split_prefetch = 8, .threads = 1};
}

/* start_with() of a task of coordinated reads by num_consumers (0: none). */
static void start_coordinated(struct run *r, sl_sharding_t sharding, const char *spec, const sl_task_config_t *with,
                              uint32_t num_consumers)
{
    /* The producer thread activates the notify event on this base. */
    evthread_use_pthreads();
    r->base = event_base_new();
    cr_assert_not_null(r->base);
    sluice_TaskDef def = {.task_id = 7, .job_id = 3, .dataset_id = 2, .sharding = sharding, .num_workers = 1,
                          .num_consumers = num_consumers};
    sl_task_config_t cfg = with ? *with : config();
    char err[512];
    cr_assert_eq(sl_task_new(r->base, &def, spec, strlen(spec), NULL, 0, &cfg, on_notify, r, &r->task, err,
                             sizeof err),
                 0, "%s", err);
}

static void start_with(struct run *r, sl_sharding_t sharding, const char *spec, const sl_task_config_t *with)
{
    start_coordinated(r, sharding, spec, with, 0);
}

static void start(struct run *r, sl_sharding_t sharding, const char *spec)
{
    start_with(r, sharding, spec, NULL);
}

static void stop(struct run *r)
{
    sl_task_free(r->task);
    event_base_free(r->base);
}

/* The task's info once ok says so, polled every millisecond for at most
 * 30 s (a hang fails the test rather than the run): the last one read. */
static sl_task_info_t info_when(struct run *r, bool (*ok)(const sl_task_info_t *))
{
    sl_task_info_t info;
    for (int i = 0; i < 30000; i++) {
        sl_task_info(r->task, &info);
        if (ok(&info))
            break;
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    return info;
}

static bool sixteen_buffered(const sl_task_info_t *i)
{
    return i->buffered_batches == 16;
}

static bool buffer_full(const sl_task_info_t *i)
{
    return i->buffer_full;
}

static bool budget_wait_or_failed(const sl_task_info_t *i)
{
    return i->budget_wait || i->state == SL_TASK_FAILED;
}

/* Waits for the task's notify callback (a batch ready, splits wanted, the
 * end), at most 30 s: a hang fails the test rather than the run. */
static void wait_notify(struct run *r)
{
    int before = r->notified;
    for (int i = 0; i < 3000 && r->notified == before; i++) {
        struct timeval tv = {0, 10000};
        event_base_loopexit(r->base, &tv);
        event_base_dispatch(r->base);
    }
}

/* The task's next batch (SL_TASK_BATCH, *b) or SL_TASK_END, waiting for
 * the notify callback while none is ready; an error fails the test. */
static int take_next(struct run *r, sl_wire_batch_t **b)
{
    for (;;) {
        *b = NULL;
        int rc = sl_task_take(r->task, b);
        if (rc != SL_TASK_PENDING) {
            cr_assert(rc == SL_TASK_BATCH || rc == SL_TASK_END, "take: %d %s", rc, sl_task_errmsg(r->task));
            return rc;
        }
        wait_notify(r);
    }
}

/* Waits until the task asks for splits (its pipeline is running): its
 * request's epoch, split count and records per split. */
static void await_request(struct run *r, uint64_t *epoch, uint32_t *max, uint64_t *records)
{
    uint64_t seq;
    bool asked = false;
    for (int i = 0; i < 3000 && !(asked = sl_task_want_splits(r->task, epoch, max, &seq, records)); i++)
        wait_notify(r);
    cr_assert(asked, "the task never asked for splits");
}

/* Answers the task's request for splits, if it has one: as many as it asks
 * for (at most 64) of split records each, ids and records from *next_id and
 * *next_begin on, then the end of the epoch once total records went out. */
static void answer_splits(struct run *r, uint64_t *next_id, uint64_t *next_begin, uint64_t total, uint64_t split)
{
    uint64_t epoch, seq, records;
    uint32_t max;
    if (!sl_task_want_splits(r->task, &epoch, &max, &seq, &records))
        return;
    sluice_GetSplitResponse resp = sluice_GetSplitResponse_init_zero;
    resp.epoch = epoch;
    for (uint32_t i = 0; i < max && *next_begin < total && resp.splits_count < 64; i++) {
        resp.splits[resp.splits_count++] =
            (sluice_Split){.split_id = (*next_id)++, .begin = *next_begin, .end = *next_begin + split, .epoch = epoch};
        *next_begin += split;
    }
    resp.end_of_epoch = resp.splits_count == 0;
    resp.finished = resp.end_of_epoch;
    sl_task_splits_arrived(r->task, &resp);
}

/* Takes the task's next batch and reports it sent, as a worker's send
 * does: SL_TASK_BATCH (*b) or SL_TASK_END, with the split-done notices the
 * send carries (*n of them at *done, freed by the caller); SL_TASK_PENDING,
 * after a wait for the notify callback, when none is ready. */
static int take_and_send(struct run *r, sl_wire_batch_t **b, sl_split_done_rec_t **done, unsigned *n,
                         uint64_t *below)
{
    *b = NULL;
    *done = NULL;
    *n = 0;
    int rc = sl_task_take(r->task, b);
    if (rc == SL_TASK_PENDING) {
        wait_notify(r);
        return rc;
    }
    cr_assert(rc == SL_TASK_BATCH || rc == SL_TASK_END, "take: %d %s", rc, sl_task_errmsg(r->task));
    cr_assert_eq(sl_task_batch_sent(r->task, rc == SL_TASK_BATCH ? *b : NULL, done, n, below), 0);
    return rc;
}

/* A frame's done_below passes no split not noticed yet (in this frame or
 * before: the producer's thread takes splits from the queue into the
 * tracker meanwhile), nor the splits handed out; ids below first are none
 * of the test's. Checks the ids from *checked up to below. */
static void check_below(uint64_t below, uint64_t next_id, uint64_t first, const int *noticed, uint64_t *checked)
{
    cr_assert_leq(below, next_id, "done_below %lu past the splits handed out", (unsigned long)below);
    for (; *checked < below; (*checked)++)
        cr_assert(*checked < first || noticed[*checked - first],
                  "a frame's done_below %lu passes split %lu, not noticed yet", (unsigned long)below,
                  (unsigned long)*checked);
}

/* Gives back a frame's batch as a worker's send does, counting its
 * elements. @return true for the end of sequence */
static bool sent(struct run *r, int rc, sl_wire_batch_t *b, uint64_t *elements)
{
    if (rc != SL_TASK_BATCH)
        return true;
    *elements += b->num_elements;
    sl_task_release(r->task, b);
    sl_wire_batch_free(b);
    return false;
}

#define N 300000
#define SPLIT 1000

Test(task, dynamic_behind_a_large_shuffle_notices_every_split_once_and_ends_done)
{
    struct run r = {0};
    char spec[256];
    snprintf(spec, sizeof spec,
             "{\"source\":{\"type\":\"range\",\"stop\":%d},\"ops\":[{\"op\":\"shuffle\",\"buffer_size\":100000,"
             "\"seed\":1},{\"op\":\"batch\",\"batch_size\":1024}]}",
             N);
    start(&r, SL_SHARDING_DYNAMIC, spec);
    uint64_t next_id = 100, next_begin = 0;
    enum { SPLITS = N / SPLIT };
    static uint64_t delivered[SPLITS];
    static int noticed[SPLITS];
    memset(delivered, 0, sizeof delivered);
    memset(noticed, 0, sizeof noticed);
    uint64_t elements = 0;
    unsigned most_in_one_frame = 0, most_rows = 0;
    bool ended = false;
    uint64_t below = 0, checked_below = 0;
    for (int guard = 0; !ended && guard < 1000000; guard++) {
        answer_splits(&r, &next_id, &next_begin, N, SPLIT);
        sl_wire_batch_t *b;
        sl_split_done_rec_t *done;
        unsigned n;
        int rc = take_and_send(&r, &b, &done, &n, &below);
        if (rc == SL_TASK_PENDING)
            continue;
        if (rc == SL_TASK_BATCH) {
            /* Its tally rows (the batch's own, or a copy of more) count
             * each of its records once, in its splits. */
            uint64_t counted = 0;
            for (unsigned i = 0; i < b->ntally; i++) {
                cr_assert_eq(b->tally[i].end - b->tally[i].begin, SPLIT, "row %u of a batch", i);
                counted += b->tally[i].delivered;
            }
            cr_assert_eq(counted, b->num_elements, "a batch of %lu records tallies %lu",
                         (unsigned long)b->num_elements, (unsigned long)counted);
            most_rows = b->ntally > most_rows ? b->ntally : most_rows;
        }
        for (unsigned i = 0; i < n; i++) {
            uint64_t k = done[i].split_id - 100;
            cr_assert_lt(k, SPLITS, "a notice of split %lu, never handed out", (unsigned long)done[i].split_id);
            cr_assert_eq(noticed[k], 0, "split %lu noticed twice", (unsigned long)done[i].split_id);
            noticed[k] = 1;
            cr_assert_eq(done[i].begin, k * SPLIT);
            cr_assert_eq(done[i].end, (k + 1) * SPLIT);
            delivered[k] = done[i].delivered;
        }
        if (n > most_in_one_frame)
            most_in_one_frame = n;
        free(done);
        check_below(below, next_id, 100, noticed, &checked_below);
        ended = sent(&r, rc, b, &elements);
    }
    cr_assert(ended, "the task never ended");
    cr_assert_eq(elements, N);
    for (int k = 0; k < SPLITS; k++) {
        cr_assert_eq(noticed[k], 1, "split %d has no notice", k + 100);
        cr_assert_eq(delivered[k], SPLIT, "split %d: %lu of %d records delivered", k + 100,
                     (unsigned long)delivered[k], SPLIT);
    }
    /* A buffer of 100,000 over splits of 1,000 finishes about a hundred
     * splits in its last batches: more than the 64 a frame once carried. */
    cr_assert_gt(most_in_one_frame, 64, "at most %u notices came at once", most_in_one_frame);
    cr_assert_gt(most_rows, SL_WIRE_TALLY_INLINE, "no batch had more tally rows than it holds itself");
    sluice_TaskStatus ts = sluice_TaskStatus_init_zero;
    sl_task_status(r.task, &ts);
    cr_assert_eq(ts.state, SL_TASK_DONE);
    cr_assert_eq(ts.done_below, next_id, "done_below %lu at DONE: splits from there would go out again",
                 (unsigned long)ts.done_below);
    cr_assert_eq(below, next_id);
    stop(&r);
}

/* A range in batches of its splits' length: after a batch's send its split
 * is done and the tracker often empty while splits wait in the queue (8
 * prefetched); a frame's done_below stops at the first of them, never at
 * the next id to come. */
Test(task, done_below_stops_at_splits_that_wait_in_the_queue)
{
    struct run r = {0};
    enum { RN = 200000, RSPLIT = 1000 };
    char spec[256];
    snprintf(spec, sizeof spec, "{\"source\":{\"type\":\"range\",\"stop\":%d},\"ops\":[{\"op\":\"batch\","
             "\"batch_size\":%d}]}", RN, RSPLIT);
    start(&r, SL_SHARDING_DYNAMIC, spec);
    uint64_t next_id = 0, next_begin = 0, below = 0, checked_below = 0, elements = 0, frames = 0, queued_seen = 0;
    static int noticed[RN / RSPLIT];
    memset(noticed, 0, sizeof noticed);
    bool ended = false;
    for (int guard = 0; !ended && guard < 1000000; guard++) {
        answer_splits(&r, &next_id, &next_begin, RN, RSPLIT);
        sl_wire_batch_t *b;
        sl_split_done_rec_t *done;
        unsigned n;
        int rc = take_and_send(&r, &b, &done, &n, &below);
        if (rc == SL_TASK_PENDING)
            continue;
        for (unsigned i = 0; i < n; i++)
            noticed[done[i].split_id] = 1;
        free(done);
        frames++;
        queued_seen += below < next_id;
        check_below(below, next_id, 0, noticed, &checked_below);
        ended = sent(&r, rc, b, &elements);
    }
    cr_assert(ended, "the task never ended");
    cr_assert_eq(elements, RN);
    cr_assert_eq(below, next_id);
    /* Most frames went out with splits handed out and not done. */
    cr_assert_gt(queued_seen * 2, frames, "%lu of %lu frames", (unsigned long)queued_seen, (unsigned long)frames);
    stop(&r);
}

/* A split handed out again (a lost worker's) comes with a smaller id than
 * the splits queued before it: a frame's done_below stays at or below its
 * id until it is done, whatever the queue's head holds (the head holds the
 * least id only while the ids queued rise). */
Test(task, done_below_stops_at_a_split_handed_out_again_behind_later_ones)
{
    struct run r = {0};
    sl_task_config_t cfg = config();
    cfg.buffer_batches = 1; /* the pipeline stays within a batch of what is taken */
    start_with(&r, SL_SHARDING_DYNAMIC,
               "{\"source\":{\"type\":\"range\",\"stop\":1000},\"ops\":[{\"op\":\"batch\",\"batch_size\":100}]}", &cfg);
    uint64_t epoch, records, seq, below = 0, elements = 0;
    uint32_t max;
    await_request(&r, &epoch, &max, &records);
    sluice_GetSplitResponse resp = sluice_GetSplitResponse_init_zero;
    resp.splits[resp.splits_count++] = (sluice_Split){.split_id = 10, .begin = 0, .end = 100};
    resp.splits[resp.splits_count++] = (sluice_Split){.split_id = 11, .begin = 100, .end = 200};
    sl_task_splits_arrived(r.task, &resp);
    cr_assert(sl_task_want_splits(r.task, &epoch, &max, &seq, &records), "two queued of eight: it asks");
    resp = (sluice_GetSplitResponse)sluice_GetSplitResponse_init_zero;
    resp.splits[resp.splits_count++] = (sluice_Split){.split_id = 12, .begin = 200, .end = 300};
    resp.splits[resp.splits_count++] = (sluice_Split){.split_id = 3, .begin = 500, .end = 600};
    resp.splits[resp.splits_count++] = (sluice_Split){.split_id = 13, .begin = 300, .end = 400};
    sl_task_splits_arrived(r.task, &resp);
    bool done3 = false, ended = false;
    int noticed = 0;
    for (int guard = 0; !ended && guard < 100000; guard++) {
        if (sl_task_want_splits(r.task, &epoch, &max, &seq, &records)) {
            resp = (sluice_GetSplitResponse)sluice_GetSplitResponse_init_zero;
            resp.end_of_epoch = resp.finished = true;
            sl_task_splits_arrived(r.task, &resp);
        }
        sl_wire_batch_t *b;
        sl_split_done_rec_t *done;
        unsigned n;
        int rc = take_and_send(&r, &b, &done, &n, &below);
        if (rc == SL_TASK_PENDING)
            continue;
        for (unsigned i = 0; i < n; i++) {
            done3 |= done[i].split_id == 3;
            noticed++;
        }
        free(done);
        if (!done3)
            cr_assert_leq(below, 3, "done_below %lu while split 3 waits", (unsigned long)below);
        ended = sent(&r, rc, b, &elements);
    }
    cr_assert(ended, "the task never ended");
    cr_assert(done3);
    cr_assert_eq(noticed, 5);
    cr_assert_eq(elements, 500);
    stop(&r);
}

/* Hands the task splits of 100 records, ids *next_id up to upto (excluded),
 * as the answer to its request for epoch. */
static void give_splits(struct run *r, uint64_t epoch, uint64_t *next_id, uint64_t upto)
{
    sluice_GetSplitResponse resp = sluice_GetSplitResponse_init_zero;
    resp.epoch = epoch;
    for (; *next_id < upto; (*next_id)++)
        resp.splits[resp.splits_count++] = (sluice_Split){
            .split_id = *next_id, .begin = *next_id * 100, .end = *next_id * 100 + 100, .epoch = epoch};
    sl_task_splits_arrived(r->task, &resp);
}

/* take_and_send(), counting the notices its frame carries by split id
 * (below 5) and keeping what each says was delivered. */
static int take_noting(struct run *r, sl_wire_batch_t **b, int *noticed, uint64_t *delivered, uint64_t *below)
{
    sl_split_done_rec_t *done;
    unsigned n;
    int rc = take_and_send(r, b, &done, &n, below);
    for (unsigned i = 0; rc != SL_TASK_PENDING && i < n; i++) {
        cr_assert_lt(done[i].split_id, 5);
        noticed[done[i].split_id]++;
        delivered[done[i].split_id] = done[i].delivered;
    }
    if (rc != SL_TASK_PENDING)
        free(done);
    return rc;
}

/* A pipeline that ends before its splits do (a take) while a split request
 * is out: the end of sequence and DONE wait for the answer, whose splits,
 * never read, get their notices with the end (delivered 0) and stay below
 * done_below; answered as soon as the pipeline ended, the end would leave
 * them to the dispatcher to hand out again, to a task that reads them. */
Test(task, an_ended_pipeline_waits_for_its_split_request_and_notices_what_it_brings)
{
    struct run r = {0};
    /* A buffer of two batches holds the pipeline back until batches are
     * taken, so that it cannot reach the take's end (five batches) before
     * the second request is out: with room for all five, a pipeline that
     * ran ahead of the test had ended before it asked again (3 runs in 25
     * with other tests beside it). */
    sl_task_config_t cfg = config();
    cfg.buffer_batches = 2;
    start_with(&r, SL_SHARDING_DYNAMIC,
               "{\"source\":{\"type\":\"range\",\"stop\":1000000},\"ops\":[{\"op\":\"take\",\"count\":250},"
               "{\"op\":\"batch\",\"batch_size\":50}]}",
               &cfg);
    uint64_t epoch, seq, records, next_id = 0, below = 0, elements = 0;
    uint32_t max;
    /* Three splits of 100: the take ends in the third. */
    await_request(&r, &epoch, &max, &records);
    give_splits(&r, epoch, &next_id, 3);
    /* Three queued of a prefetch of 8: it asks again; the answer waits. */
    cr_assert(sl_task_want_splits(r.task, &epoch, &max, &seq, &records));
    int noticed[5] = {0};
    uint64_t delivered[5] = {0};
    sl_wire_batch_t *b = NULL;
    while (elements < 250) {
        int rc = take_noting(&r, &b, noticed, delivered, &below);
        cr_assert(rc == SL_TASK_PENDING || rc == SL_TASK_BATCH, "the end before the take's 250 elements (%lu)",
                  (unsigned long)elements);
        sent(&r, rc, b, &elements);
    }
    /* The pipeline ends (its notify), and still no end while the request
     * is out. */
    cr_assert_eq(sl_task_take(r.task, &b), SL_TASK_PENDING);
    wait_notify(&r);
    cr_assert_eq(sl_task_take(r.task, &b), SL_TASK_PENDING, "the end went out with a split request unanswered");
    cr_assert_neq(sl_task_state(r.task), SL_TASK_DONE);
    /* The answer: two splits the pipeline will never read. */
    give_splits(&r, epoch, &next_id, 5);
    cr_assert_eq(take_noting(&r, &b, noticed, delivered, &below), SL_TASK_END);
    static const uint64_t want[5] = {100, 100, 50, 0, 0};
    for (int k = 0; k < 5; k++) {
        cr_assert_eq(noticed[k], 1, "split %d: %d notices", k, noticed[k]);
        cr_assert_eq(delivered[k], want[k], "split %d: %lu delivered", k, (unsigned long)delivered[k]);
    }
    cr_assert_eq(below, 5);
    sluice_TaskStatus ts = sluice_TaskStatus_init_zero;
    sl_task_status(r.task, &ts);
    cr_assert_eq(ts.state, SL_TASK_DONE);
    cr_assert_eq(ts.done_below, 5);
    stop(&r);
}

/* Splits read in order, a batch wholly in one split: the send settles most
 * of a split's batches without the table's lock, and still each split's
 * notice goes with the batch that holds its last record, counting every
 * record. The test takes a batch only while the pipeline waits for room
 * with its next batch made, so that it has left the split of the batch
 * taken (read all of it), unless that is the last split, whose notice goes
 * with the end. */
Test(task, a_split_read_in_order_has_its_notice_with_its_last_batch)
{
    enum { TOTAL = 100000, SPLIT_LEN = 10000, BATCH = 1000, SPLITS = TOTAL / SPLIT_LEN };
    struct run r = {0};
    sl_task_config_t cfg = config();
    start_with(&r, SL_SHARDING_DYNAMIC,
               "{\"source\":{\"type\":\"range\",\"stop\":100000},\"ops\":[{\"op\":\"batch\",\"batch_size\":1000}]}",
               &cfg);
    uint64_t next_id = 1, next_begin = 0, below = 0, batches = 0;
    int noticed_at[SPLITS + 1];
    for (int k = 0; k <= SPLITS; k++)
        noticed_at[k] = -1;
    bool ended = false;
    for (int guard = 0; !ended && guard < 100000; guard++) {
        answer_splits(&r, &next_id, &next_begin, TOTAL, SPLIT_LEN);
        sl_task_info_t info;
        sl_task_info(r.task, &info);
        if (!info.buffer_full && batches + info.buffered_batches < TOTAL / BATCH) {
            /* The pipeline fills the buffer and waits for room with its
             * next batch made (or asks for splits): a poll, bounded by the
             * guard (100,000 polls of 1 ms at most). */
            struct timeval tv = {0, 1000};
            event_base_loopexit(r.base, &tv);
            event_base_dispatch(r.base);
            continue;
        }
        sl_wire_batch_t *b;
        sl_split_done_rec_t *done;
        unsigned n;
        int rc = take_and_send(&r, &b, &done, &n, &below);
        if (rc == SL_TASK_PENDING)
            continue;
        for (unsigned i = 0; i < n; i++) {
            uint64_t id = done[i].split_id;
            cr_assert(id >= 1 && id <= SPLITS && noticed_at[id] < 0, "split %lu noticed twice or unknown",
                      (unsigned long)id);
            cr_assert_eq(done[i].delivered, SPLIT_LEN, "split %lu: %lu delivered", (unsigned long)id,
                         (unsigned long)done[i].delivered);
            noticed_at[id] = (int)batches; /* the frame after `batches` batches: the end's is SPLITS * 10 */
        }
        free(done);
        if (rc == SL_TASK_END) {
            ended = true;
            break;
        }
        batches++;
        sl_task_release(r.task, b);
        sl_wire_batch_free(b);
    }
    cr_assert(ended, "the task never ended");
    /* Split k's last record is in batch k * 10 (1-based): its frame is the
     * one counted after k * 10 - 1 batches. */
    for (int k = 1; k < SPLITS; k++)
        cr_assert_eq(noticed_at[k], k * (SPLIT_LEN / BATCH) - 1,
                     "split %d's notice came after %d batches, not with its last batch (batch %d)", k,
                     noticed_at[k], k * (SPLIT_LEN / BATCH));
    cr_assert_geq(noticed_at[SPLITS], SPLITS * (SPLIT_LEN / BATCH) - 1, "the last split's notice came early");
    cr_assert_eq(below, SPLITS + 1);
    stop(&r);
}

Test(task, off_yields_the_whole_range_and_the_buffer_holds_the_pipeline_back)
{
    struct run r = {0};
    start(&r, SL_SHARDING_OFF,
          "{\"source\":{\"type\":\"range\",\"stop\":1000000},\"ops\":[{\"op\":\"batch\",\"batch_size\":1000}]}");
    /* Nobody takes (so nothing is notified): the pipeline fills its 16
     * batches and waits. Polled, for at most 30 s. */
    sl_task_info_t info = info_when(&r, sixteen_buffered);
    cr_assert_eq(info.buffered_batches, 16);
    cr_assert_leq(info.batches_produced, 17, "made %lu batches with a buffer of 16",
                  (unsigned long)info.batches_produced);
    cr_assert_eq(threads_named("sl-task"), 1, "its pipeline's thread says what it is (top -H, perf, gdb)");
    uint64_t sum = 0, count = 0;
    sl_wire_batch_t *b;
    while (take_next(&r, &b) == SL_TASK_BATCH) {
        const int64_t *v = (const int64_t *)(b->data + b->components[0].offset);
        for (uint64_t i = 0; i < b->num_elements; i++)
            sum += (uint64_t)v[i];
        count += b->num_elements;
        sl_task_release(r.task, b);
        sl_wire_batch_free(b);
    }
    cr_assert_eq(count, 1000000);
    cr_assert_eq(sum, (uint64_t)999999 * 1000000 / 2);
    sluice_TaskStatus ts = sluice_TaskStatus_init_zero;
    sl_task_status(r.task, &ts);
    cr_assert_eq(ts.state, SL_TASK_DONE);
    stop(&r);
    cr_assert_eq(threads_settle_to("sl-task", 0), 0);
}

/* A spec this worker cannot parse (the dispatcher, of another version,
 * accepted it) or cannot build makes a task that failed at once, saying
 * why, under every policy: its clients get the error rather than a task
 * that never produces. */
Test(task, a_spec_the_worker_cannot_read_fails_the_task_and_says_why)
{
    const char *specs[] = {"{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[{\"op\":\"batch\",\"batch_size\":2},"
                           "{\"op\":\"op_of_a_later_version\"}]}",
                           "{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[{\"op\":\"cast\",\"key\":\"nope\","
                           "\"dtype\":\"int8\"}]}"};
    const char *want[] = {"this worker cannot read the job's dataset spec, which the dispatcher accepted (is the "
                          "worker older than the dispatcher?): $.ops[1].op: unknown op \"op_of_a_later_version\"",
                          "ops[0] (cast): component \"nope\" is not in its input (value)"};
    const sl_sharding_t policies[] = {SL_SHARDING_OFF, SL_SHARDING_DYNAMIC};
    for (int i = 0; i < 2; i++) {
        for (int p = 0; p < 2; p++) {
            struct run r = {0};
            start(&r, policies[p], specs[i]);
            sl_wire_batch_t *b = NULL;
            int rc = sl_task_take(r.task, &b);
            cr_assert_lt(rc, 0, "spec %d: take gave %d", i, rc);
            cr_assert_eq(rc, i == 0 ? SL_ESPEC : SL_EINVAL, "spec %d: %d", i, rc);
            cr_assert_null(b);
            cr_assert(strncmp(sl_task_errmsg(r.task), want[i], strlen(want[i])) == 0, "spec %d: %s", i,
                      sl_task_errmsg(r.task));
            cr_assert_eq(sl_task_state(r.task), SL_TASK_FAILED);
            stop(&r);
        }
    }
    cr_assert_eq(threads_settle_to("sl-task", 0), 0);
}

Test(task, a_batch_counts_in_the_buffer_with_its_provenance)
{
    /* Behind a shuffle each element is mostly a run of its own: 24 bytes
     * of runs (and about 3 encoded) to its 8 of tensor. A buffer of 256 KiB
     * holds 32 such batches by their tensors alone, and 8 or 9 counted
     * with their provenance. */
    struct run r = {0};
    sl_task_config_t cfg = config();
    cfg.buffer_bytes = 256u << 10;
    cfg.buffer_batches = 64;
    start_with(&r, SL_SHARDING_OFF,
               "{\"source\":{\"type\":\"range\",\"stop\":1000000},\"ops\":[{\"op\":\"shuffle\","
               "\"buffer_size\":10000,\"seed\":3},{\"op\":\"batch\",\"batch_size\":1000}]}",
               &cfg);
    sl_task_prov_form(r.task, true, true);
    sl_task_info_t info = info_when(&r, buffer_full); /* nobody takes: until the pipeline waits */
    cr_assert(info.buffer_full, "the pipeline never waited for room");
    cr_assert_leq(info.buffered_bytes, cfg.buffer_bytes);
    cr_assert_lt(info.buffered_batches, 12, "%u batches of 8000 tensor bytes in a buffer of %zu bytes",
                 info.buffered_batches, cfg.buffer_bytes);
    cr_assert_gt(info.buffered_bytes, (size_t)info.buffered_batches * 8000 * 3, "the provenance did not count");
    /* Taken and given back, what a batch counted leaves with it. */
    size_t total = 0;
    for (unsigned i = 0; i < info.buffered_batches; i++) {
        sl_wire_batch_t *b = NULL;
        cr_assert_eq(sl_task_take(r.task, &b), SL_TASK_BATCH);
        cr_assert_eq(b->charged, sl_wire_batch_held_bytes(b));
        total += b->charged;
        sl_task_release(r.task, b);
        sl_wire_batch_free(b);
    }
    cr_assert_eq(total, info.buffered_bytes);
    stop(&r);
}

static bool waits_with_none_buffered(const sl_task_info_t *i)
{
    return i->buffer_full && i->buffered_batches == 0;
}

/* A coordinated read's stand-in (workerd/worker.c) must not wait on batches
 * others took and hold: a task's rounds may hold its whole buffer for the
 * consumer that waits on the stand-in first. sl_task_take_extra() lets the
 * pipeline make one batch past the buffer's bytes, once per call that found
 * none; sl_task_take() waits for room as before. */
Test(task, a_stand_in_take_gets_a_batch_while_taken_batches_fill_the_buffer)
{
    struct run r = {0};
    sl_task_config_t cfg = config();
    cfg.buffer_bytes = 64u << 10; /* 8 batches of 1000 int64s */
    cfg.buffer_batches = 64;
    start_with(&r, SL_SHARDING_OFF,
               "{\"source\":{\"type\":\"range\",\"stop\":1000000},\"ops\":[{\"op\":\"batch\",\"batch_size\":1000}]}",
               &cfg);
    sl_wire_batch_t *held[64];
    unsigned n = 0;
    sl_task_info_t info;
    /* Taken and not given back (a round's batches waiting for a consumer):
     * the pipeline waits for room with nothing left to take. */
    for (;;) {
        info = info_when(&r, buffer_full);
        cr_assert(info.buffer_full, "the pipeline never waited for room");
        if (info.buffered_batches == 0)
            break;
        while (n < 64 && sl_task_take(r.task, &held[n]) == SL_TASK_BATCH)
            n++;
        cr_assert_lt(n, 64, "%u batches of 8000 bytes taken from a buffer of 64 KiB", n);
    }
    cr_assert_gt(n, 0);
    sl_wire_batch_t *b = NULL;
    cr_assert_eq(sl_task_take(r.task, &b), SL_TASK_PENDING);
    int rc = sl_task_take_extra(r.task, &b);
    if (rc == SL_TASK_PENDING) {
        wait_notify(&r); /* the batch it let the pipeline make (at most 30 s) */
        rc = sl_task_take_extra(r.task, &b);
    }
    cr_assert_eq(rc, SL_TASK_BATCH, "the stand-in got no batch past the full buffer: %d", rc);
    int64_t first;
    memcpy(&first, b->data + b->components[0].offset, sizeof first);
    cr_assert_eq(first, (int64_t)n * 1000, "the stand-in's batch is the task's next one");
    /* One batch past the buffer, not more: the pipeline waits again. */
    info = info_when(&r, waits_with_none_buffered);
    cr_assert(waits_with_none_buffered(&info));
    cr_assert_gt(info.buffered_bytes, cfg.buffer_bytes);
    cr_assert_leq(info.buffered_bytes, cfg.buffer_bytes + b->charged);
    cr_assert_eq(sl_task_take(r.task, &held[n]), SL_TASK_PENDING);
    held[n++] = b;
    for (unsigned i = 0; i < n; i++) {
        sl_task_release(r.task, held[i]);
        sl_wire_batch_free(held[i]);
    }
    stop(&r);
}

/* Marks the elements of b (int64 values below 400000) in seen, failing on
 * one seen before: @return how many. */
static uint64_t mark_once(const sl_wire_batch_t *b, unsigned char *seen)
{
    const int64_t *v = (const int64_t *)(b->data + b->components[0].offset);
    for (uint64_t i = 0; i < b->num_elements; i++) {
        cr_assert(v[i] >= 0 && v[i] < 400000 && !seen[v[i]], "element %ld twice or out of range", (long)v[i]);
        seen[v[i]] = 1;
    }
    return b->num_elements;
}

/* Takes the task's batches to its end, each marked once and released:
 * @return the elements taken. */
static uint64_t take_rest_once(struct run *r, unsigned char *seen)
{
    uint64_t count = 0;
    sl_wire_batch_t *b;
    while (take_next(r, &b) == SL_TASK_BATCH) {
        count += mark_once(b, seen);
        sl_task_release(r->task, b);
        sl_wire_batch_free(b);
    }
    return count;
}

/* Starts a task of 400,000 shuffled elements in batches of 10,000 with
 * their provenance, its buffer 64 batches, on budget. */
static void start_shuffled_on(struct run *r, sl_membudget_t *budget)
{
    sl_task_config_t cfg = config();
    cfg.mem = budget;
    cfg.buffer_batches = 64;
    start_with(r, SL_SHARDING_OFF,
               "{\"source\":{\"type\":\"range\",\"stop\":400000},\"ops\":[{\"op\":\"shuffle\","
               "\"buffer_size\":10000,\"seed\":5},{\"op\":\"batch\",\"batch_size\":10000}]}",
               &cfg);
    sl_task_prov_form(r->task, true, true);
}

/* Under a tight memory budget a finished batch that does not fit waits for
 * the task's own batches to be written (they give their charge back), as it
 * waits for room in the buffer, instead of failing the task: whether the
 * budget is full at that moment depends on how far the client has read. A
 * shuffled batch counts 4 to 5 times its tensor bytes with its provenance
 * (about 350 KB here), so the buffer's charges run out of budget before the
 * shuffle's slots and the block being filled do. */
Test(task, a_finished_batch_waits_for_the_budget_while_its_own_batches_are_out)
{
    sl_membudget_t budget;
    sl_membudget_init(&budget, (size_t)5 << 20, "--max-memory-mb");
    struct run r = {0};
    start_shuffled_on(&r, &budget);
    sl_task_info_t info = info_when(&r, budget_wait_or_failed); /* nobody takes: until the pipeline waits */
    cr_assert(info.budget_wait, "the pipeline never waited for the budget (state %d, %u batches buffered): %s",
              info.state, info.buffered_batches, sl_task_errmsg(r.task));
    cr_assert(!info.buffer_full);
    cr_assert_gt(info.buffered_batches, 0);
    cr_assert_leq(sl_membudget_used(&budget), budget.limit);
    /* Taken one at a time, every element comes once and nothing is refused. */
    static unsigned char seen[400000];
    memset(seen, 0, sizeof seen);
    uint64_t count = 0;
    count += take_rest_once(&r, seen);
    cr_assert_eq(count, 400000);
    cr_assert_eq(budget.refusals, 0, "a charge was refused");
    stop(&r);
    cr_assert_eq(sl_membudget_used(&budget), 0, "%zu bytes left charged", sl_membudget_used(&budget));
}

/* The same budget filled by the task's batches its clients have not
 * acknowledged (held for them, workerd/held.h: their bytes count in
 * sl_task_own_bytes()) while its buffer is empty: the finished batch waits
 * past the budget's wait for them to come back. Before 2026-12-03 it
 * waited only while the buffer held batches, and the task failed after
 * the budget's wait (a trainer paused behind a prefetch, its batches sent
 * and held). */
Test(task, a_finished_batch_waits_for_the_budget_while_its_clients_hold_its_batches)
{
    sl_membudget_t budget;
    sl_membudget_init(&budget, (size_t)5 << 20, "--max-memory-mb");
    budget.wait_ms = 20;
    struct run r = {0};
    start_shuffled_on(&r, &budget);
    size_t *own = sl_task_own_bytes(r.task);
    static unsigned char seen[400000];
    memset(seen, 0, sizeof seen);
    uint64_t count = 0;
    size_t held = 0;
    /* Every batch taken is held as a worker holds it for its client (the
     * task's charge handed over, own counted) until the budget has no room
     * for the task's next batch, which then waits with the buffer empty. */
    for (int i = 0; i < 30000; i++) {
        sl_wire_batch_t *b = NULL;
        int rc = sl_task_take(r.task, &b);
        if (rc == SL_TASK_PENDING) {
            if (__atomic_load_n(&budget.waiters, __ATOMIC_SEQ_CST) > 0 && held > 0)
                break;
            wait_notify(&r);
            continue;
        }
        cr_assert_eq(rc, SL_TASK_BATCH, "take: %d %s", rc, sl_task_errmsg(r.task));
        count += mark_once(b, seen);
        size_t c = b->charged;
        __atomic_add_fetch(own, c, __ATOMIC_RELEASE);
        sl_task_hand_over(r.task, b, c);
        sl_task_release(r.task, b);
        held += c;
        sl_wire_batch_free(b);
    }
    cr_assert_gt(held, 0);
    cr_assert_eq(__atomic_load_n(&budget.waiters, __ATOMIC_SEQ_CST), 1, "nothing waited for the budget");
    /* Past the budget's wait (20 ms) the task still waits; a failure would
     * show by now (this sleep only gives a broken wait time to show). */
    struct timespec pause = {0, 200 * 1000000};
    nanosleep(&pause, NULL);
    cr_assert_eq(sl_task_state(r.task), SL_TASK_RUNNING, "%s", sl_task_errmsg(r.task));
    cr_assert_eq(budget.refusals, 0, "a charge was refused");
    /* The client acknowledges them: the task runs to its end. */
    __atomic_sub_fetch(own, held, __ATOMIC_RELEASE);
    sl_membudget_release(&budget, held);
    count += take_rest_once(&r, seen);
    cr_assert_eq(count, 400000);
    cr_assert_eq(budget.refusals, 0, "a charge was refused");
    stop(&r);
    cr_assert_eq(sl_membudget_used(&budget), 0, "%zu bytes left charged", sl_membudget_used(&budget));
}

/* A batch whose holder took over its charge (sl_task_hand_over()) and
 * that is still being sent when its task goes: the task gives back the
 * rest of what it charged and not that batch's, which its holder gives
 * back when it lets it go. */
Test(task, a_task_that_goes_gives_back_no_charge_a_holder_took_over)
{
    sl_membudget_t budget;
    sl_membudget_init(&budget, (size_t)64 << 20, "--max-memory-mb");
    struct run r = {0};
    start_shuffled_on(&r, &budget);
    sl_wire_batch_t *b = NULL, *kept = NULL;
    cr_assert_eq(take_next(&r, &b), SL_TASK_BATCH, "%s", sl_task_errmsg(r.task));
    cr_assert_eq(take_next(&r, &kept), SL_TASK_BATCH, "%s", sl_task_errmsg(r.task));
    size_t c = b->charged;
    cr_assert_gt(c, 0);
    sl_task_hand_over(r.task, b, c - 100); /* all but 100 bytes */
    sl_task_hand_over(r.task, kept, kept->charged);
    sl_task_release(r.task, kept);
    sl_membudget_release(&budget, kept->charged); /* its holder lets it go */
    sl_wire_batch_free(kept);
    stop(&r); /* b is still being sent */
    cr_assert_eq(sl_membudget_used(&budget), c - 100, "the task gave back %zu of the %zu bytes handed over",
                 c - 100 - sl_membudget_used(&budget), c - 100);
    sl_membudget_release(&budget, c - 100); /* its holder lets it go */
    sl_wire_batch_free(b);
}

static void *stop_main(void *arg)
{
    stop(arg);
    return NULL;
}

/* A pipeline whose charge waits for memory another owner holds (here the
 * test, for ten minutes) stops waiting when its task is dropped: dropping
 * it takes no longer than the pipeline's thread needs to see so, and the
 * charge it gave up is no refusal. */
Test(task, a_task_dropped_while_its_pipeline_waits_for_the_budget_stops_at_once)
{
    sl_membudget_t budget;
    sl_membudget_init(&budget, (size_t)1 << 20, "--max-memory-mb");
    budget.wait_ms = 600000;
    cr_assert(sl_membudget_charge(&budget, budget.limit));
    struct run r = {0};
    sl_task_config_t cfg = config();
    cfg.mem = &budget;
    start_with(&r, SL_SHARDING_OFF,
               "{\"source\":{\"type\":\"range\",\"stop\":100000},\"ops\":[{\"op\":\"shuffle\","
               "\"buffer_size\":10000,\"seed\":1},{\"op\":\"batch\",\"batch_size\":100}]}",
               &cfg);
    for (int i = 0; i < 30000 && __atomic_load_n(&budget.waiters, __ATOMIC_SEQ_CST) == 0; i++) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    cr_assert_eq(__atomic_load_n(&budget.waiters, __ATOMIC_SEQ_CST), 1, "the shuffle's charge never waited");
    cr_assert_eq(sl_task_state(r.task), SL_TASK_RUNNING);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, stop_main, &r), 0);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 30;
    cr_assert_eq(pthread_timedjoin_np(t, NULL, &until), 0, "dropping the task waited for the budget");
    cr_assert_eq(budget.refusals, 0, "a charge given up as its task stopped counted as a refusal");
    cr_assert_eq(budget.waits, 1);
    sl_membudget_release(&budget, budget.limit);
    cr_assert_eq(sl_membudget_used(&budget), 0, "%zu bytes left charged", sl_membudget_used(&budget));
}

/* Coordinated reads (num_consumers 2): the task's k-th batch goes to
 * consumer k mod 2 (rounds.h), so its block is made in that consumer's
 * region (sl_task_lend_region()). A second client naming consumer 0 ends
 * it: once the batches made before are out, no block is made in any
 * region. The splits wait for the test, so that no batch is made before
 * the regions are set. */
Test(task, coordinated_batches_are_made_in_their_consumers_regions_until_an_index_has_two_clients)
{
    enum { ROWS = 8192, TOTAL = ROWS * 200 };
    struct event_base *lb = event_base_new();
    cr_assert_not_null(lb);
    char why[256];
    sl_shm_lane_t *lane = sl_shm_lane_new(lb, (size_t)64 << 20, NULL, why, sizeof why);
    cr_assert_not_null(lane, "%s", why);
    sl_shm_region_t *reg[3];
    for (int i = 0; i < 3; i++)
        cr_assert_not_null(reg[i] = sl_shm_region_new(lane, why, sizeof why), "%s", why);
    struct run r = {0};
    start_coordinated(&r, SL_SHARDING_DYNAMIC,
                      "{\"source\":{\"type\":\"range\",\"stop\":1638400},\"ops\":[{\"op\":\"batch\","
                      "\"batch_size\":8192}]}",
                      NULL, 2);
    sl_task_lend_region(r.task, reg[0], 11, 0);
    sl_task_lend_region(r.task, reg[1], 12, 1);
    sl_task_lend_region(r.task, reg[2], 12, 7); /* an index past the consumers: nothing */
    uint64_t next_id = 1, next_begin = 0, below = 0;
    unsigned k = 0, in_region = 0, late_in_region = 0;
    for (int guard = 0; guard < 1000000; guard++) {
        answer_splits(&r, &next_id, &next_begin, TOTAL, ROWS * 4);
        sl_wire_batch_t *b;
        sl_split_done_rec_t *done;
        unsigned n;
        int rc = take_and_send(&r, &b, &done, &n, &below);
        free(done);
        if (rc == SL_TASK_PENDING)
            continue;
        if (rc == SL_TASK_END)
            break;
        if (k < 60) {
            cr_assert(sl_shm_region_holds(reg[k % 2], b->data), "batch %u is not in consumer %u's region", k, k % 2);
            in_region++;
        }
        if (k == 60)
            sl_task_lend_region(r.task, reg[2], 13, 0); /* another client says it is consumer 0 */
        if (k >= 100)
            late_in_region += sl_shm_region_holds(reg[0], b->data) || sl_shm_region_holds(reg[1], b->data) ||
                              sl_shm_region_holds(reg[2], b->data);
        sl_task_release(r.task, b);
        sl_wire_batch_free(b);
        k++;
    }
    cr_assert_eq(k, 200);
    cr_assert_eq(in_region, 60);
    cr_assert_eq(late_in_region, 0, "%u batches made in a region after an index had two clients", late_in_region);
    stop(&r);
    for (int i = 0; i < 3; i++)
        sl_shm_region_free(reg[i]);
    sl_shm_lane_free(lane);
    event_base_free(lb);
}

/* Runs a DYNAMIC task over range(2000000) in batches of 1000 as its
 * dispatcher: answers each request with what it asks for, splits as long as
 * its split_records (at least 1000, at most 50000, multiples of 1000).
 * Checks that a request never asks past split_prefetch, that every element
 * comes once and every split gets its notice. The first request that asked
 * for a length said the rate *first_said (records_per_second) and asked for
 * *first_max splits (both left as they are when none asked for one).
 * @return the most records a request asked for */
static uint64_t run_sized(const sl_task_config_t *cfg, uint32_t *most_max, uint64_t *first_said,
                          uint32_t *first_max)
{
    enum { TOTAL = 2000000 };
    struct run r = {0};
    start_with(&r, SL_SHARDING_DYNAMIC,
               "{\"source\":{\"type\":\"range\",\"stop\":2000000},\"ops\":[{\"op\":\"batch\",\"batch_size\":1000}]}",
               cfg);
    static unsigned char seen[TOTAL];
    memset(seen, 0, sizeof seen);
    uint64_t next_id = 1, next_begin = 0, most = 0, noticed = 0, below = 0;
    bool ended = false;
    for (int guard = 0; !ended && guard < 1000000; guard++) {
        uint64_t epoch, seq, records;
        uint32_t max;
        if (sl_task_want_splits(r.task, &epoch, &max, &seq, &records)) {
            cr_assert_leq(max, 512, "asked for %u splits, more than the queue (512) holds", max);
            uint32_t slack;
            uint64_t said;
            sl_task_split_report(r.task, &slack, &said);
            if (records > 0 && most == 0) {
                *first_said = said;
                *first_max = max;
            }
            if (records == 0)
                cr_assert_leq(max, cfg->split_prefetch, "asked for %u splits, prefetch %u", max, cfg->split_prefetch);
            most = records > most ? records : most;
            *most_max = max > *most_max ? max : *most_max;
            uint64_t len = records < 1000 ? 1000 : records > 50000 ? 50000 : records / 1000 * 1000;
            sluice_GetSplitResponse resp = sluice_GetSplitResponse_init_zero;
            resp.epoch = epoch;
            for (uint32_t i = 0; i < max && next_begin < TOTAL; i++) {
                uint64_t end = TOTAL - next_begin < len ? TOTAL : next_begin + len;
                resp.splits[resp.splits_count++] =
                    (sluice_Split){.split_id = next_id++, .begin = next_begin, .end = end, .epoch = epoch};
                next_begin = end;
            }
            resp.end_of_epoch = resp.splits_count == 0;
            resp.finished = resp.end_of_epoch;
            sl_task_splits_arrived(r.task, &resp);
        }
        sl_wire_batch_t *b;
        sl_split_done_rec_t *done;
        unsigned n;
        int rc = take_and_send(&r, &b, &done, &n, &below);
        if (rc == SL_TASK_PENDING)
            continue;
        for (unsigned i = 0; i < n; i++)
            cr_assert_eq(done[i].delivered, done[i].end - done[i].begin, "split %lu", (unsigned long)done[i].split_id);
        noticed += n;
        free(done);
        if (rc != SL_TASK_BATCH) {
            ended = true;
            break;
        }
        const int64_t *v = (const int64_t *)(b->data + b->components[0].offset);
        for (uint64_t i = 0; i < b->num_elements; i++) {
            cr_assert(v[i] >= 0 && v[i] < TOTAL && !seen[v[i]], "element %ld twice or outside", (long)v[i]);
            seen[v[i]] = 1;
        }
        sl_task_release(r.task, b);
        sl_wire_batch_free(b);
    }
    cr_assert(ended, "the task never ended");
    for (int i = 0; i < TOTAL; i++)
        cr_assert(seen[i], "element %d never came", i);
    cr_assert_eq(noticed, next_id - 1, "%lu notices for %lu splits", (unsigned long)noticed,
                 (unsigned long)(next_id - 1));
    stop(&r);
    return most;
}

/* A dispatcher that gives at most 10 splits an answer (a task's share of
 * what is left, near a job's end) to a task whose queue asks for hundreds
 * (splits far shorter than its target length, up to 512 queued; an answer
 * held 64 at most before 2026-12-01): the task asks again once
 * about half of what an answer left is read, not after every answer, so its
 * queue stays near what the dispatcher gives. Asking again after every
 * answer cut short, it queued 250 and more, and a short job of short
 * epochs made hundreds of requests. */
Test(task, an_answer_cut_short_is_half_read_before_the_task_asks_again)
{
    enum { TOTAL = 1000000, LEN = 1000, GIVE = 10 };
    sl_task_config_t cfg = config();
    /* Splits of 1000 records against a target of 1000 s at the task's
     * rate: 64 times shorter and more at any rate over 64 records a
     * second, so the queue is 512 however fast the machine. */
    cfg.split_target_ms = 1000000;
    struct run r = {0};
    start_with(&r, SL_SHARDING_DYNAMIC,
               "{\"source\":{\"type\":\"range\",\"stop\":1000000},\"ops\":[{\"op\":\"batch\",\"batch_size\":1000}]}",
               &cfg);
    uint64_t next_id = 1, next_begin = 0, below = 0, elements = 0, long_asks = 0;
    unsigned most_queued = 0, most_max = 0;
    bool ended = false;
    for (int guard = 0; !ended && guard < 1000000; guard++) {
        uint64_t epoch, seq, records;
        uint32_t max;
        if (sl_task_want_splits(r.task, &epoch, &max, &seq, &records)) {
            /* A queue of 512 (64 times split_prefetch) asks for 512 less
             * what it holds. */
            most_max = max > most_max ? max : most_max;
            if (max > cfg.split_prefetch) {
                long_asks++;
                most_queued = 512 - max > most_queued ? 512 - max : most_queued;
            }
            sluice_GetSplitResponse resp = sluice_GetSplitResponse_init_zero;
            resp.epoch = epoch;
            for (uint32_t i = 0; i < max && i < GIVE && next_begin < TOTAL; i++) {
                resp.splits[resp.splits_count++] = (sluice_Split){
                    .split_id = next_id++, .begin = next_begin, .end = next_begin + LEN, .epoch = epoch};
                next_begin += LEN;
            }
            resp.end_of_epoch = resp.splits_count == 0;
            resp.finished = resp.end_of_epoch;
            sl_task_splits_arrived(r.task, &resp);
        }
        sl_wire_batch_t *b;
        sl_split_done_rec_t *done;
        unsigned n;
        int rc = take_and_send(&r, &b, &done, &n, &below);
        free(done);
        if (rc == SL_TASK_PENDING)
            continue;
        if (rc != SL_TASK_BATCH) {
            ended = true;
            break;
        }
        elements += b->num_elements;
        sl_task_release(r.task, b);
        sl_wire_batch_free(b);
    }
    cr_assert(ended, "the task never ended");
    cr_assert_eq(elements, TOTAL);
    /* Up to 64 times split_prefetch: past the 64 an answer once held, with
     * which epochs of a few thousand records repeated waited on hand-outs. */
    cr_assert_gt(most_max, 256, "splits far shorter than asked for came %u at most a request", most_max);
    cr_assert_gt(long_asks, 10, "%lu requests from a queue of 512", (unsigned long)long_asks);
    cr_assert_leq(most_queued, 2 * GIVE, "a request with %u splits queued, answers of %d", most_queued, GIVE);
    stop(&r);
}

/* A task asks for splits as long as its measured rate times
 * split_target_ms (so, once it read one, for some length), for
 * split_prefetch at a time, more when they come shorter than it asked (this
 * dispatcher cuts them at 50,000 records, a fraction of a second's worth),
 * never more than its queue (512) holds, and reads splits of any length exactly
 * once; with split_target_ms 0 it never asks for a length. The first
 * request that asks for a length comes a few splits of 1,000 records after
 * the first: its rate, from one split, is not said to the dispatcher
 * (records_per_second 0) until a few windows of 5 ms went into it, and it
 * asks for split_prefetch at most: the splits before it were asked with no
 * length, so that they came short says nothing. */
Test(task, dynamic_asks_for_splits_of_its_target_length_within_the_prefetch_bound)
{
    sl_task_config_t cfg = config();
    cfg.split_target_ms = 1000;
    uint32_t most_max = 0, first_max = 0;
    uint64_t said = 1;
    cr_assert_gt(run_sized(&cfg, &most_max, &said, &first_max), 0, "no request asked for a length");
    cr_assert_gt(most_max, cfg.split_prefetch, "splits shorter than asked for came %u at most a request", most_max);
    cr_assert_eq(said, 0, "a rate of one split said: %lu records/s", (unsigned long)said);
    cr_assert_leq(first_max, cfg.split_prefetch, "after splits asked with no length, a request for %u", first_max);
    cfg.split_target_ms = 0;
    cfg.split_prefetch = 3;
    most_max = 0;
    cr_assert_eq(run_sized(&cfg, &most_max, &said, &first_max), 0,
                 "a request asked for a length with split_target_ms 0");
    cr_assert_leq(most_max, 3);
}

/* A task seeded with a rate (what its worker measured of the dataset before)
 * asks for splits of that rate times split_target_ms from its first request
 * and says the rate in it; a seed of 0 or less is no seed, and a task that
 * has a rate keeps it. */
Test(task, a_seeded_rate_sizes_the_first_request_and_never_replaces_a_rate)
{
    sl_task_config_t cfg = config();
    cfg.split_target_ms = 100;
    struct run r = {0};
    start_with(&r, SL_SHARDING_DYNAMIC,
               "{\"source\":{\"type\":\"range\",\"stop\":1000000},\"ops\":[{\"op\":\"batch\",\"batch_size\":1000}]}",
               &cfg);
    sl_task_seed_split_rate(r.task, 0);
    sl_task_seed_split_rate(r.task, -5);
    cr_assert_eq(sl_task_split_rate(r.task), 0);
    sl_task_seed_split_rate(r.task, 250000);
    sl_task_seed_split_rate(r.task, 999999);
    cr_assert_eq(sl_task_split_rate(r.task), 250000);
    uint64_t epoch, records = 0;
    uint32_t max;
    await_request(&r, &epoch, &max, &records);
    cr_assert_eq(records, 25000, "the first request asked for %lu records", (unsigned long)records);
    uint32_t slack;
    uint64_t said;
    sl_task_split_report(r.task, &slack, &said);
    cr_assert_eq(said, 250000, "the seeded rate was said as %lu records/s", (unsigned long)said);
    stop(&r);
}

/* The records of n runs, one (epoch, file, record) each, in order. */
static uint64_t expand(const sl_provenance_run_t *runs, uint64_t n, uint64_t *out, uint64_t cap)
{
    uint64_t k = 0;
    for (uint64_t i = 0; i < n; i++)
        for (uint64_t j = 0; j < runs[i].count && k < cap; j++)
            out[k++] = (uint64_t)runs[i].epoch << 56 ^ (uint64_t)runs[i].file_index << 40 ^ (runs[i].begin + j);
    return k;
}

enum form { FORM_NONE, FORM_RUNS, FORM_DENSE };

/* The producer encodes a batch's provenance in the form the consumers last
 * asked for (sl_task_prov_form()) before the batch is taken, so that the
 * send does not (it keeps the bytes as they are): dense behind a shuffle,
 * the runs form, or none while nobody reads provenance. A change reaches
 * the batches made after it: the buffered ones (at most buffer_batches,
 * and one the producer holds) keep theirs. Each encoding decodes to the
 * batch's records in order. */
Test(task, batches_come_with_their_provenance_encoded_in_the_form_asked_for)
{
    enum { TOTAL = 400000, PHASE = 60, BATCH = 1024 };
    static const struct {
        bool provenance, dense;
        enum form form;
    } phases[] = {{true, true, FORM_DENSE}, {true, false, FORM_RUNS}, {false, false, FORM_NONE},
                  {true, true, FORM_DENSE}, {false, true, FORM_NONE}};
    struct run r = {0};
    sl_task_config_t cfg = config();
    start_with(&r, SL_SHARDING_DYNAMIC,
               "{\"source\":{\"type\":\"range\",\"stop\":400000},\"ops\":[{\"op\":\"shuffle\",\"buffer_size\":10000,"
               "\"seed\":3},{\"op\":\"batch\",\"batch_size\":1024}]}",
               &cfg);
    /* Before any split: the first batch is made in this form already. */
    sl_task_prov_form(r.task, phases[0].provenance, phases[0].dense);
    static uint64_t want[BATCH], got[BATCH];
    uint64_t next_id = 1, next_begin = 0, below = 0;
    unsigned batches = 0, phase = 0, in_phase = 0, seen[3] = {0};
    bool ended = false, arrived = true;
    for (int guard = 0; !ended && guard < 1000000; guard++) {
        answer_splits(&r, &next_id, &next_begin, TOTAL, 5000);
        sl_wire_batch_t *b;
        sl_split_done_rec_t *done;
        unsigned n;
        int rc = take_and_send(&r, &b, &done, &n, &below);
        if (rc == SL_TASK_PENDING)
            continue;
        free(done);
        if (rc != SL_TASK_BATCH) {
            ended = true;
            break;
        }
        enum form form = !b->prov_wire ? FORM_NONE : b->prov_wire_dense ? FORM_DENSE : FORM_RUNS;
        seen[form]++;
        /* The phase's form, or, until it arrived, the last phase's. */
        if (form == phases[phase].form)
            arrived = true;
        else
            cr_assert(!arrived && phase > 0 && form == phases[phase - 1].form && in_phase < cfg.buffer_batches + 2,
                      "batch %u (%u of phase %u): form %d, asked for %d", batches, in_phase, phase, form,
                      phases[phase].form);
        cr_assert_gt(b->prov_n, 0, "batch %u has no provenance", batches);
        if (b->prov_wire) {
            /* Either form is the batch's records (epoch 0, file 0, the
             * range's values), and the send keeps it. Encoded, the runs
             * are gone (sl_wire_batch_drop_runs()). */
            cr_assert_null(sl_wire_batch_prov(b), "batch %u kept its runs once encoded", batches);
            const int64_t *v = (const int64_t *)(b->data + b->components[0].offset);
            uint64_t nw = b->num_elements;
            cr_assert_leq(nw, BATCH);
            for (uint64_t i = 0; i < nw; i++)
                want[i] = (uint64_t)v[i];
            cr_assert_eq(b->prov_records, b->num_elements);
            sl_provenance_run_t *runs = NULL;
            uint64_t nr = 0;
            char err[256];
            cr_assert_eq(sl_provwire_decode(b->prov_wire, b->prov_wire_len, b->num_elements, &runs, &nr, err,
                                            sizeof err),
                         0, "batch %u: %s", batches, err);
            cr_assert_eq(expand(runs, nr, got, BATCH), nw);
            cr_assert_arr_eq(got, want, nw * sizeof *got, "batch %u decodes to other records", batches);
            free(runs);
            const uint8_t *bytes = b->prov_wire;
            cr_assert_eq(sl_wire_batch_encode_prov(b, form == FORM_DENSE), 0);
            cr_assert_eq(b->prov_wire, bytes, "batch %u encoded again at the send", batches);
        }
        batches++;
        if (++in_phase == PHASE && phase + 1 < sizeof phases / sizeof *phases) {
            phase++;
            in_phase = 0;
            arrived = false;
            sl_task_prov_form(r.task, phases[phase].provenance, phases[phase].dense);
        }
        sl_task_release(r.task, b);
        sl_wire_batch_free(b);
    }
    cr_assert(ended, "the task never ended");
    cr_assert_eq(batches, (TOTAL + BATCH - 1) / BATCH);
    cr_assert_eq(phase, 4, "the job ended in phase %u", phase);
    cr_assert(arrived, "the last phase's form never came");
    for (int f = 0; f < 3; f++)
        cr_assert_gt(seen[f], 0, "no batch in form %d", f);
    stop(&r);
}

static uint32_t slack_of(sl_task_t *task)
{
    uint32_t ms;
    uint64_t rate;
    sl_task_split_report(task, &ms, &rate);
    return ms;
}

/* What a split request says its task can wait for the answer
 * (GetSplitRequest.slack_ms): its queued splits' records at its rate, and
 * what is left of the split its pipeline reads (its length at the rate
 * less the time since it took it); nothing without a rate. The first split
 * is one the pipeline reads for ever (its buffer of one batch stays full),
 * so the seven behind it stay queued; at 4 records a second its 2,000
 * records last 500 s from its take, which the test does not reach. */
Test(task, a_split_request_says_how_long_its_queued_splits_last)
{
    struct run r;
    sl_task_config_t cfg = config();
    cfg.buffer_batches = 1;
    start_with(&r, SL_SHARDING_DYNAMIC,
               "{\"source\":{\"type\":\"range\",\"stop\":1000000000000000},\"ops\":[{\"op\":\"batch\",\"batch_size\":10}]}",
               &cfg);
    uint64_t epoch, records;
    uint32_t max;
    await_request(&r, &epoch, &max, &records);
    cr_assert_eq(slack_of(r.task), 0, "nothing queued yet");
    sluice_GetSplitResponse resp = sluice_GetSplitResponse_init_zero;
    resp.epoch = epoch;
    resp.splits[resp.splits_count++] = (sluice_Split){.split_id = 0, .begin = 0, .end = 2000, .epoch = epoch};
    for (uint64_t i = 1; i < 8; i++)
        resp.splits[resp.splits_count++] =
            (sluice_Split){.split_id = i, .begin = 1000 + i * 1000, .end = 2000 + i * 1000, .epoch = epoch};
    sl_task_splits_arrived(r.task, &resp);
    /* The first take measures no rate (a rate is measured from a split
     * read whole): none yet. */
    cr_assert_eq(slack_of(r.task), 0, "a slack without a rate");
    sl_task_seed_split_rate(r.task, 4.0);
    /* 9,000 records at 4 a second before the pipeline took the first;
     * then the 7,000 behind it and what is left of its 2,000: more than
     * 1,750 s, at most 2,250 s, less as time goes. */
    uint32_t slack = 0;
    for (int i = 0; i < 3000 && (slack = slack_of(r.task)) == 2250000; i++)
        wait_notify(&r);
    cr_assert(slack > 1750000 && slack < 2250000, "not the seven queued and what is left of the first: %u ms",
              slack);
    uint32_t later = 0;
    for (int i = 0; i < 3000 && (later = slack_of(r.task)) == slack; i++)
        usleep(1000);
    cr_assert(later < slack && later > 1750000, "what is left of the first split did not go down: %u then %u ms",
              slack, later);
    stop(&r);
}

/* Takes batches until `want` elements came (each reported sent), noting
 * the epoch of every record's provenance in epochs[] (by element order);
 * answers no split request. */
static void take_elements(struct run *r, uint64_t want, uint64_t *got, uint64_t *epochs)
{
    time_t deadline = time(NULL) + 30;
    while (*got < want) {
        cr_assert_lt(time(NULL), deadline, "only %lu of %lu elements came in 30 s", (unsigned long)*got,
                     (unsigned long)want);
        sl_wire_batch_t *b;
        sl_split_done_rec_t *done;
        unsigned n;
        uint64_t below;
        int rc = take_and_send(r, &b, &done, &n, &below);
        if (rc == SL_TASK_PENDING)
            continue;
        free(done);
        cr_assert_eq(rc, SL_TASK_BATCH, "the end before %lu elements", (unsigned long)want);
        const sl_provenance_run_t *runs = sl_wire_batch_prov(b);
        for (uint64_t i = 0; i < b->prov_n; i++)
            for (uint64_t k = 0; k < runs[i].count; k++)
                epochs[(*got)++] = runs[i].epoch;
        sl_task_release(r->task, b);
        sl_wire_batch_free(b);
    }
}

/* A dispatcher that hands a task splits of later epochs (cross_epochs): each
 * waits in the queue for its own epoch, which the pipeline enters without
 * asking, at the split; and an answer that comes after the pipeline left
 * the epoch it asked about is read, not dropped as an old epoch's. */
Test(task, splits_of_later_epochs_wait_for_theirs_and_a_late_answer_is_kept)
{
    struct run r;
    sl_task_config_t cfg = config();
    cfg.buffer_batches = 1; /* the pipeline stays within a batch of what is taken */
    start_with(&r, SL_SHARDING_DYNAMIC,
               "{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[{\"op\":\"repeat\",\"count\":3},"
               "{\"op\":\"batch\",\"batch_size\":2}]}",
               &cfg);
    uint64_t epoch, records, seq;
    uint32_t max;
    await_request(&r, &epoch, &max, &records);
    cr_assert_eq(epoch, 0);
    sluice_GetSplitResponse resp = sluice_GetSplitResponse_init_zero;
    resp.epoch = 0;
    resp.splits[resp.splits_count++] = (sluice_Split){.split_id = 0, .begin = 0, .end = 10, .epoch = 0};
    resp.splits[resp.splits_count++] = (sluice_Split){.split_id = 1, .begin = 0, .end = 10, .epoch = 1};
    sl_task_splits_arrived(r.task, &resp);
    /* The next request goes out while the pipeline is in epoch 0 (its first
     * batch at most is made), and is answered only once it is in epoch 1. */
    cr_assert(sl_task_want_splits(r.task, &epoch, &max, &seq, &records), "two queued of eight: it asks");
    cr_assert_eq(epoch, 0);
    uint64_t got = 0, epochs[30];
    take_elements(&r, 20, &got, epochs);
    for (int i = 0; i < 20; i++)
        cr_assert_eq(epochs[i], i < 10 ? 0 : 1, "element %d of epoch %lu", i, (unsigned long)epochs[i]);
    resp = (sluice_GetSplitResponse)sluice_GetSplitResponse_init_zero;
    resp.epoch = 0; /* the epoch asked about, which the pipeline left */
    resp.splits[resp.splits_count++] = (sluice_Split){.split_id = 2, .begin = 0, .end = 10, .epoch = 2};
    sl_task_splits_arrived(r.task, &resp);
    take_elements(&r, 30, &got, epochs);
    for (int i = 20; i < 30; i++)
        cr_assert_eq(epochs[i], 2);
    /* Epoch 2 read, the task asks once more and hears the end. */
    uint64_t next_id = 3, next_begin = 0;
    int rc = SL_TASK_PENDING;
    for (time_t deadline = time(NULL) + 30; time(NULL) < deadline && rc != SL_TASK_END;) {
        answer_splits(&r, &next_id, &next_begin, 0, 10);
        sl_wire_batch_t *b;
        sl_split_done_rec_t *done;
        unsigned n;
        uint64_t below;
        rc = take_and_send(&r, &b, &done, &n, &below);
        if (rc == SL_TASK_PENDING)
            continue;
        free(done);
        cr_assert_eq(rc, SL_TASK_END, "a batch past the three epochs");
    }
    cr_assert_eq(rc, SL_TASK_END);
    stop(&r);
}

/* The dispatcher's "ask again in retry_ms" holds the task's requests back
 * until the wait is over, and no longer: then the pipeline, waiting for a
 * split, says how long it waited with none asked for (what the worker's
 * heartbeat tick looks at to ask should a wake-up be lost; a LongRun hang
 * had a task wait for ever with no request out). While a request is out
 * or the wait runs, it says 0. While the wait runs, and after an answer
 * that left the task at --max-outstanding-splits (at_bound), its clients
 * are to acknowledge its batches at once (sl_task_acks_wanted()). */
Test(task, a_retry_holds_requests_back_until_its_wait_ends_and_an_unasked_wait_shows)
{
    struct run r = {0};
    start(&r, SL_SHARDING_DYNAMIC,
          "{\"source\":{\"type\":\"range\",\"stop\":1000},\"ops\":[{\"op\":\"batch\",\"batch_size\":10}]}");
    uint64_t epoch, seq, records;
    uint32_t max;
    await_request(&r, &epoch, &max, &records);
    cr_assert_eq(sl_task_split_wait_unasked(r.task), 0, "a wait while a request is out");
    sluice_GetSplitResponse resp = sluice_GetSplitResponse_init_zero;
    resp.epoch = epoch;
    resp.retry_ms = 300;
    sl_task_splits_arrived(r.task, &resp);
    cr_assert_not(sl_task_want_splits(r.task, &epoch, &max, &seq, &records), "asked again before the wait ended");
    cr_assert_eq(sl_task_split_wait_unasked(r.task), 0, "a wait while the retry's wait runs");
    cr_assert(sl_task_acks_wanted(r.task), "no acknowledgement at once while the task waits");
    /* The wait ends (the loop runs its timer); the pipeline waits on. */
    double waited = 0;
    for (int i = 0; i < 3000 && (waited = sl_task_split_wait_unasked(r.task)) == 0; i++)
        wait_notify(&r);
    cr_assert_gt(waited, 0, "no unasked wait after the retry's wait");
    cr_assert_not(sl_task_acks_wanted(r.task), "acknowledgements at once after the wait");
    cr_assert(sl_task_want_splits(r.task, &epoch, &max, &seq, &records), "no request after the retry's wait");
    cr_assert_eq(sl_task_split_wait_unasked(r.task), 0, "a wait while a request is out");
    resp = (sluice_GetSplitResponse)sluice_GetSplitResponse_init_zero;
    resp.epoch = epoch;
    resp.splits_count = 1;
    resp.splits[0] = (sluice_Split){.split_id = 1, .begin = 0, .end = 1000, .epoch = epoch};
    resp.at_bound = true;
    sl_task_splits_arrived(r.task, &resp);
    cr_assert(sl_task_acks_wanted(r.task), "no acknowledgement at once at the bound");
    uint64_t below = 0, elements = 0;
    bool ended = false;
    for (int guard = 0; !ended && guard < 100000; guard++) {
        uint64_t next_id = 2, next_begin = 1000;
        answer_splits(&r, &next_id, &next_begin, 1000, 1000);
        sl_wire_batch_t *b;
        sl_split_done_rec_t *done;
        unsigned n;
        int rc = take_and_send(&r, &b, &done, &n, &below);
        free(done);
        if (rc != SL_TASK_PENDING)
            ended = sent(&r, rc, b, &elements);
    }
    cr_assert(ended, "the task never ended");
    cr_assert_eq(elements, 1000);
    stop(&r);
}
