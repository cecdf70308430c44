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
 * epoch). Also: a task over OFF yields the whole range, and the buffer holds
 * the pipeline back while nobody takes batches; a DYNAMIC task asks for
 * splits of its target length, never past its prefetch bound, and reads
 * splits of any length exactly once.
 */
#include <criterion/criterion.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static void start_with(struct run *r, sl_sharding_t sharding, const char *spec, const sl_task_config_t *with)
{
    /* The producer thread activates the notify event on this base. */
    evthread_use_pthreads();
    r->base = event_base_new();
    cr_assert_not_null(r->base);
    sluice_TaskDef def = {.task_id = 7, .job_id = 3, .dataset_id = 2, .sharding = sharding, .num_workers = 1};
    sl_task_config_t cfg = with ? *with : config();
    char err[512];
    cr_assert_eq(sl_task_new(r->base, &def, spec, strlen(spec), NULL, 0, &cfg, on_notify, r, &r->task, err,
                             sizeof err),
                 0, "%s", err);
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
    unsigned most_in_one_frame = 0;
    bool ended = false;
    uint64_t below = 0;
    for (int guard = 0; !ended && guard < 1000000; guard++) {
        uint64_t epoch, seq, records;
        uint32_t max;
        if (sl_task_want_splits(r.task, &epoch, &max, &seq, &records)) {
            sluice_GetSplitResponse resp = sluice_GetSplitResponse_init_zero;
            resp.epoch = epoch;
            for (uint32_t i = 0; i < max && next_begin < N && resp.splits_count < 64; i++) {
                resp.splits[resp.splits_count++] = (sluice_Split){
                    .split_id = next_id++, .begin = next_begin, .end = next_begin + SPLIT, .epoch = epoch};
                next_begin += SPLIT;
            }
            resp.end_of_epoch = resp.splits_count == 0;
            resp.finished = resp.end_of_epoch;
            sl_task_splits_arrived(r.task, &resp);
        }
        sl_wire_batch_t *b = NULL;
        int rc = sl_task_take(r.task, &b);
        if (rc == SL_TASK_PENDING) {
            wait_notify(&r);
            continue;
        }
        cr_assert(rc == SL_TASK_BATCH || rc == SL_TASK_END, "take: %d %s", rc, sl_task_errmsg(r.task));
        sl_split_done_rec_t *done = NULL;
        unsigned n = 0;
        cr_assert_eq(sl_task_batch_sent(r.task, rc == SL_TASK_BATCH ? b : NULL, &done, &n, &below), 0);
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
        if (rc == SL_TASK_BATCH) {
            elements += b->num_elements;
            size_t size = b->size;
            sl_wire_batch_free(b);
            sl_task_release(r.task, size);
        } else {
            ended = true;
        }
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
    sluice_TaskStatus ts = sluice_TaskStatus_init_zero;
    sl_task_status(r.task, &ts);
    cr_assert_eq(ts.state, SL_TASK_DONE);
    cr_assert_eq(ts.done_below, next_id, "done_below %lu at DONE: splits from there would go out again",
                 (unsigned long)ts.done_below);
    cr_assert_eq(below, next_id);
    stop(&r);
}

Test(task, off_yields_the_whole_range_and_the_buffer_holds_the_pipeline_back)
{
    struct run r = {0};
    start(&r, SL_SHARDING_OFF,
          "{\"source\":{\"type\":\"range\",\"stop\":1000000},\"ops\":[{\"op\":\"batch\",\"batch_size\":1000}]}");
    /* Nobody takes (so nothing is notified): the pipeline fills its 16
     * batches and waits. Polled, for at most 30 s. */
    sl_task_info_t info;
    for (int i = 0; i < 30000; i++) {
        sl_task_info(r.task, &info);
        if (info.buffered_batches == 16)
            break;
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    cr_assert_eq(info.buffered_batches, 16);
    cr_assert_leq(info.batches_produced, 17, "made %lu batches with a buffer of 16",
                  (unsigned long)info.batches_produced);
    uint64_t sum = 0, count = 0;
    for (;;) {
        sl_wire_batch_t *b = NULL;
        int rc = sl_task_take(r.task, &b);
        if (rc == SL_TASK_PENDING) {
            wait_notify(&r);
            continue;
        }
        if (rc == SL_TASK_END)
            break;
        cr_assert_eq(rc, SL_TASK_BATCH, "%s", sl_task_errmsg(r.task));
        const int64_t *v = (const int64_t *)(b->data + b->components[0].offset);
        for (uint64_t i = 0; i < b->num_elements; i++)
            sum += (uint64_t)v[i];
        count += b->num_elements;
        size_t size = b->size;
        sl_wire_batch_free(b);
        sl_task_release(r.task, size);
    }
    cr_assert_eq(count, 1000000);
    cr_assert_eq(sum, (uint64_t)999999 * 1000000 / 2);
    sluice_TaskStatus ts = sluice_TaskStatus_init_zero;
    sl_task_status(r.task, &ts);
    cr_assert_eq(ts.state, SL_TASK_DONE);
    stop(&r);
}

/* Runs a DYNAMIC task over range(200000) in batches of 1000 as its
 * dispatcher: answers each request with what it asks for, splits as long as
 * its split_records (at least 1000, at most 50000, multiples of 1000).
 * Checks that a request never asks past split_prefetch, that every element
 * comes once and every split gets its notice. @return the most records a
 * request asked for */
static uint64_t run_sized(const sl_task_config_t *cfg)
{
    enum { TOTAL = 200000 };
    struct run r = {0};
    start_with(&r, SL_SHARDING_DYNAMIC,
               "{\"source\":{\"type\":\"range\",\"stop\":200000},\"ops\":[{\"op\":\"batch\",\"batch_size\":1000}]}",
               cfg);
    static unsigned char seen[TOTAL];
    memset(seen, 0, sizeof seen);
    uint64_t next_id = 1, next_begin = 0, most = 0, noticed = 0, below = 0;
    bool ended = false;
    for (int guard = 0; !ended && guard < 1000000; guard++) {
        uint64_t epoch, seq, records;
        uint32_t max;
        if (sl_task_want_splits(r.task, &epoch, &max, &seq, &records)) {
            cr_assert_leq(max, cfg->split_prefetch, "asked for %u splits, prefetch %u", max, cfg->split_prefetch);
            most = records > most ? records : most;
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
        sl_wire_batch_t *b = NULL;
        int rc = sl_task_take(r.task, &b);
        if (rc == SL_TASK_PENDING) {
            wait_notify(&r);
            continue;
        }
        cr_assert(rc == SL_TASK_BATCH || rc == SL_TASK_END, "take: %d %s", rc, sl_task_errmsg(r.task));
        sl_split_done_rec_t *done = NULL;
        unsigned n = 0;
        cr_assert_eq(sl_task_batch_sent(r.task, rc == SL_TASK_BATCH ? b : NULL, &done, &n, &below), 0);
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
        size_t size = b->size;
        sl_wire_batch_free(b);
        sl_task_release(r.task, size);
    }
    cr_assert(ended, "the task never ended");
    for (int i = 0; i < TOTAL; i++)
        cr_assert(seen[i], "element %d never came", i);
    cr_assert_eq(noticed, next_id - 1, "%lu notices for %lu splits", (unsigned long)noticed,
                 (unsigned long)(next_id - 1));
    stop(&r);
    return most;
}

/* A task asks for splits as long as its measured rate times
 * split_target_ms (so, once it read one, for some length), never for more
 * than split_prefetch at a time, and reads splits of any length exactly
 * once; with split_target_ms 0 it never asks for a length. */
Test(task, dynamic_asks_for_splits_of_its_target_length_within_the_prefetch_bound)
{
    sl_task_config_t cfg = config();
    cfg.split_target_ms = 1000;
    cr_assert_gt(run_sized(&cfg), 0, "no request asked for a length");
    cfg.split_target_ms = 0;
    cfg.split_prefetch = 3;
    cr_assert_eq(run_sized(&cfg), 0, "a request asked for a length with split_target_ms 0");
}
