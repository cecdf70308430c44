/*
 * test_rounds.c: coordinated reads on a worker (workerd/rounds.c), over a
 * real task running a range pipeline: each round holds consecutive
 * batches, one per consumer, in round order even when a later round finds
 * batches ready first; a consumer's batch is given once; at most
 * SL_ROUNDS_OPEN rounds are open.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "log.h"
#include "seed_util.h"
#include "rounds.h"
#include "shm.h"
#include "task.h"

static struct event_base *base;
static sl_task_t *task;
static sl_rounds_t *rounds;

static void notify(sl_task_t *t, void *arg)
{
    (void)t;
    (void)arg;
}

/* A task of coordinated reads by consumers over spec under sharding, its
 * buffer holding buffer_batches. */
static void setup_spec(const char *spec, sl_sharding_t sharding, uint32_t consumers, unsigned buffer_batches)
{
    sl_log_init("test_rounds", -1);
    /* The task's producer thread activates its notify event on this base. */
    evthread_use_pthreads();
    base = event_base_new();
    cr_assert_not_null(base);
    sluice_TaskDef def = {.task_id = 1, .job_id = 2, .dataset_id = 3, .sharding = sharding, .num_workers = 1,
                          .num_consumers = consumers};
    sl_task_config_t cfg = {.buffer_bytes = 1 << 20, .buffer_batches = buffer_batches, .max_batch_bytes = 1 << 20};
    char err[256];
    cr_assert_eq(sl_task_new(base, &def, spec, strlen(spec), NULL, 0, &cfg, notify, NULL, &task, err, sizeof err), 0, "%s",
                 err);
    rounds = sl_rounds_new(consumers);
    cr_assert_not_null(rounds);
}

/* setup_spec() of batches of 2 values: batch b holds 2b and 2b + 1. */
static void setup_task(sl_sharding_t sharding, uint32_t consumers, unsigned buffer_batches)
{
    setup_spec("{\"source\":{\"type\":\"range\",\"stop\":1000000},\"ops\":[{\"op\":\"batch\",\"batch_size\":2}]}",
               sharding, consumers, buffer_batches);
}

static void setup(void)
{
    setup_task(SL_SHARDING_OFF, 2, 8);
}

/* DYNAMIC: the pipeline has no batch until the test hands it a split. */
static void setup_dynamic(void)
{
    setup_task(SL_SHARDING_DYNAMIC, 2, 8);
}

/* Frees what setup made; again (a test that tears down early), nothing. */
static void teardown(void)
{
    sl_rounds_free(rounds);
    rounds = NULL;
    if (task)
        sl_task_free(task);
    task = NULL;
    if (base)
        event_base_free(base);
    base = NULL;
}

TestSuite(rounds, .init = setup, .fini = teardown);
TestSuite(rounds_dynamic, .init = setup_dynamic, .fini = teardown);

/* Takes consumer's batch of round, waiting for the pipeline while it is
 * pending; returns the first value of the batch. */
static int64_t take(uint64_t round, uint32_t consumer)
{
    char err[256];
    for (int i = 0; i < 10000; i++) {
        sl_wire_batch_t *b = NULL;
        int rc = sl_rounds_take(rounds, task, round, consumer, &b, err, sizeof err);
        if (rc == SL_TASK_BATCH) {
            int64_t v;
            memcpy(&v, b->data + b->components[0].offset, sizeof v);
            sl_task_release(task, b);
            sl_wire_batch_free(b);
            return v;
        }
        cr_assert_eq(rc, SL_TASK_PENDING, "round %" PRIu64 ": %d %s", round, rc, err);
        event_base_loop(base, EVLOOP_NONBLOCK);
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    cr_assert_fail("round %" PRIu64 " of consumer %u never came", round, consumer);
    return -1;
}

/* DYNAMIC: the splits handed to the task so far, of the range in order. */
struct feed {
    uint64_t next_id, next_begin;
};

/* Hands the task at most count splits of records each, if it asks for
 * splits now. @return whether it asked */
static bool hand_splits(struct feed *f, unsigned count, uint64_t records)
{
    uint64_t epoch, seq, want;
    uint32_t max;
    if (!sl_task_want_splits(task, &epoch, &max, &seq, &want))
        return false;
    sluice_GetSplitResponse resp = sluice_GetSplitResponse_init_zero;
    resp.epoch = epoch;
    for (unsigned i = 0; i < count && i < max && resp.splits_count < 64; i++) {
        resp.splits[resp.splits_count++] = (sluice_Split){
            .split_id = ++f->next_id, .begin = f->next_begin, .end = f->next_begin + records, .epoch = epoch};
        f->next_begin += records;
    }
    sl_task_splits_arrived(task, &resp);
    return true;
}

/* Hands the task one split of records once it asks, then waits until its
 * pipeline buffered `batches` batches. */
static void feed_until(struct feed *feed, uint64_t records, unsigned batches)
{
    bool asked = false;
    for (int i = 0; i < 30000 && !(asked = hand_splits(feed, 1, records)); i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    cr_assert(asked, "the task never asked for a split");
    sl_task_info_t info;
    for (int i = 0; i < 30000; i++) {
        sl_task_info(task, &info);
        if (info.buffered_batches >= batches)
            break;
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    cr_assert_geq(info.buffered_batches, batches, "the pipeline never made %u batches", batches);
}

Test(rounds, each_round_holds_consecutive_batches_one_per_consumer)
{
    /* The consumers ask in any order; a round's batches are taken together. */
    int64_t r0c1 = take(0, 1), r0c0 = take(0, 0);
    cr_assert_eq(r0c0, 0);
    cr_assert_eq(r0c1, 2);
    int64_t r5c0 = take(5, 0), r5c1 = take(5, 1);
    cr_assert_eq(r5c0, 4);
    cr_assert_eq(r5c1, 6);
}

Test(rounds, a_consumers_batch_is_given_once_and_out_of_range_is_refused)
{
    char err[256];
    sl_wire_batch_t *b = NULL;
    take(3, 0);
    cr_assert_eq(sl_rounds_take(rounds, task, 3, 0, &b, err, sizeof err), SL_ROUNDS_TAKEN);
    cr_assert_str_eq(err, "consumer 0 already took its batch of round 3");
    take(3, 1);
    cr_assert_eq(sl_rounds_take(rounds, task, 3, 1, &b, err, sizeof err), SL_ROUNDS_TAKEN);
    cr_assert_str_eq(err, "round 3 was already served to every consumer");
    cr_assert_eq(sl_rounds_take(rounds, task, 4, 2, &b, err, sizeof err), SL_EINVAL);
    cr_assert_str_eq(err, "consumer_index 2 is out of range: the job has 2 consumers");
}

Test(rounds, at_most_sl_rounds_open_rounds_are_open)
{
    char err[256];
    for (uint64_t r = 0; r < SL_ROUNDS_OPEN; r++)
        take(r, 0);
    sl_wire_batch_t *b = NULL;
    cr_assert_eq(sl_rounds_take(rounds, task, SL_ROUNDS_OPEN, 0, &b, err, sizeof err), SL_TASK_PENDING);
    take(0, 1); /* round 0 completes: a place opens */
    take(SL_ROUNDS_OPEN, 0);
}

Test(rounds_dynamic, a_round_asked_for_before_any_batch_is_ready_keeps_its_place)
{
    /* Round 0 is asked for while the pipeline has no split, so no batch:
     * it stays open and empty. Round 1, asked for once batches are ready,
     * must not take round 0's (a 16-consumer job once gave consumer 0 of
     * round 0 the batch of round 1 this way). */
    char err[256];
    sl_wire_batch_t *b = NULL;
    cr_assert_eq(sl_rounds_take(rounds, task, 0, 0, &b, err, sizeof err), SL_TASK_PENDING, "%s", err);
    struct feed feed = {0};
    feed_until(&feed, 1000, 4); /* round 0's and round 1's batches */
    cr_assert_eq(take(1, 0), 4, "round 1 took round 0's batches");
    cr_assert_eq(take(1, 1), 6);
    cr_assert_eq(take(0, 1), 2);
    cr_assert_eq(take(0, 0), 0);
}

Test(rounds_dynamic, a_round_not_full_holds_its_batches_for_the_pipeline)
{
    /* A round's batches go out once all are made: those of a round not
     * full wait for the pipeline, not for a consumer, and a task whose
     * pipeline waits for a split with nothing else taken is starved
     * (TaskStatus.starved: the dispatcher fails a job held at
     * --max-outstanding-splits that cannot finish a split). */
    char err[256];
    sl_wire_batch_t *b = NULL;
    struct feed feed = {0};
    cr_assert_eq(sl_rounds_unfilled(rounds), 0);
    feed_until(&feed, 2, 1); /* one batch of 2 */
    cr_assert_eq(sl_rounds_take(rounds, task, 0, 0, &b, err, sizeof err), SL_TASK_PENDING, "%s", err);
    cr_assert_eq(sl_rounds_unfilled(rounds), 1, "round 0 holds the first of its two batches");
    feed_until(&feed, 2, 1);
    cr_assert_eq(take(0, 0), 0);
    cr_assert_eq(sl_rounds_unfilled(rounds), 0, "round 0 is full: its other batch waits for consumer 1");
    cr_assert_eq(take(0, 1), 2);
}

Test(rounds, info_says_what_the_lowest_open_round_waits_for)
{
    sl_rounds_info_t ri;
    sl_rounds_info(rounds, &ri);
    cr_assert_eq(ri.consumers, 2);
    cr_assert(!ri.any_open);
    cr_assert_eq(ri.open + ri.waiting, 0);
    take(0, 0);
    take(1, 1);
    sl_rounds_info(rounds, &ri);
    cr_assert(ri.any_open);
    cr_assert_eq(ri.open, 2);
    cr_assert_eq(ri.lowest, 0);
    cr_assert_eq(ri.lowest_made, 2);
    cr_assert_eq(ri.num_missing, 1);
    cr_assert_eq(ri.missing[0], 1, "consumer 1 has not taken its batch of round 0");
    take(0, 1);
    sl_rounds_info(rounds, &ri);
    cr_assert_eq(ri.open, 1);
    cr_assert_eq(ri.lowest, 1);
    cr_assert_eq(ri.num_missing, 1);
    cr_assert_eq(ri.missing[0], 0);
    /* Sixteen open: a request for another waits for a place. */
    for (uint64_t r = 2; r < 1 + SL_ROUNDS_OPEN; r++)
        take(r, 0);
    sl_wire_batch_t *b = NULL;
    char err[256];
    cr_assert_eq(sl_rounds_take(rounds, task, 1 + SL_ROUNDS_OPEN, 0, &b, err, sizeof err), SL_TASK_PENDING);
    sl_rounds_info(rounds, &ri);
    cr_assert_eq(ri.open, SL_ROUNDS_OPEN);
    cr_assert_eq(ri.waiting, 1);
    cr_assert_eq(ri.lowest, 1);
}

/* One consumer of the property test below: the rounds it asked for are
 * [low, next), the ones of them it received marked in got (by round mod
 * 64); at most window are out at once. */
struct consumer {
    uint64_t low, next;
    unsigned window;
    bool got[64];
};

static void teardown_after(void)
{
    teardown();
}

TestSuite(rounds_own_task, .fini = teardown_after);

/*
 * A seeded property test at a job's sizes: 1 to 64 consumers, each with 1
 * to 32 rounds in flight (as a client's window), ask for hundreds of rounds
 * in any interleaving a worker sees: a consumer's first request for a round
 * comes after its first for the round before (one connection, in order),
 * and requests that waited are tried again in any order. The pipeline gets
 * its records in splits of random length at random moments, so requests
 * find it with no batch ready, and rounds wait for a place past the 16
 * open. Every consumer c of round r must get the task's batch rC + c.
 */
Test(rounds_own_task, every_consumer_gets_its_batch_of_each_round_in_round_order)
{
    unsigned seed = test_seed("rounds in round order");
    uint64_t st = seed;
    uint32_t n = 1 + (uint32_t)(splitmix64(&st) % 64);
    uint64_t total = 100 + splitmix64(&st) % (n > 16 ? 400 : 1500); /* rounds */
    unsigned buffer = 1 + (unsigned)(splitmix64(&st) % 16);
    setup_task(SL_SHARDING_DYNAMIC, n, buffer);
    struct consumer *cs = calloc(n, sizeof *cs);
    cr_assert_not_null(cs);
    for (uint32_t c = 0; c < n; c++)
        cs[c].window = 1 + (unsigned)(splitmix64(&st) % 32);
    struct feed feed = {0};
    uint32_t done = 0;
    uint64_t takes = 0, pending = 0, idle = 0, naps = 0;
    char err[256];
    while (done < n) {
        cr_assert_lt(naps, 300000, "seed %u: no request was served in 300000 naps of 0.1 ms for the pipeline", seed);
        if (splitmix64(&st) % 8 == 0 && hand_splits(&feed, 1 + (unsigned)(splitmix64(&st) % 4),
                                                     1 + splitmix64(&st) % 300))
            continue;
        uint32_t c = (uint32_t)(splitmix64(&st) % n);
        struct consumer *k = &cs[c];
        if (k->low == total)
            continue;
        uint64_t round;
        if (k->next < total && k->next < k->low + k->window && (k->next == k->low || splitmix64(&st) % 2))
            round = k->next++; /* its first request for the round */
        else if (k->next > k->low)
            round = k->low + splitmix64(&st) % (k->next - k->low); /* one that waited, tried again */
        else
            continue;
        if (k->got[round % 64])
            continue;
        sl_wire_batch_t *b = NULL;
        int rc = sl_rounds_take(rounds, task, round, c, &b, err, sizeof err);
        takes++;
        if (rc == SL_TASK_PENDING) {
            pending++;
            if (++idle % (4u * n) == 0) { /* every consumer likely waits: let the pipeline run */
                event_base_loop(base, EVLOOP_NONBLOCK);
                nanosleep(&(struct timespec){0, 100000}, NULL);
                naps++;
            }
            continue;
        }
        cr_assert_eq(rc, SL_TASK_BATCH, "seed %u: round %" PRIu64 ", consumer %u: %d %s", seed, round, c, rc, err);
        idle = naps = 0;
        int64_t v;
        memcpy(&v, b->data + b->components[0].offset, sizeof v);
        sl_task_release(task, b);
        sl_wire_batch_free(b);
        cr_assert_eq(v, (int64_t)(2 * (round * n + c)),
                     "seed %u (%u consumers): consumer %u got batch %" PRId64 " in round %" PRIu64 ", not %" PRIu64,
                     seed, n, c, v / 2, round, round * n + c);
        k->got[round % 64] = true;
        while (k->low < k->next && k->got[k->low % 64])
            k->got[k->low++ % 64] = false;
        done += k->low == total;
    }
    fprintf(stderr, "seed %u: %u consumers, %" PRIu64 " rounds, %" PRIu64 " requests, %" PRIu64 " of them waited\n",
            seed, n, total, takes, pending);
    free(cs);
}

Test(rounds_own_task, info_lists_the_first_missing_consumers_and_counts_them_all)
{
    setup_task(SL_SHARDING_OFF, 40, 64);
    take(0, 5);
    sl_rounds_info_t ri;
    sl_rounds_info(rounds, &ri);
    cr_assert_eq(ri.lowest_made, 40);
    cr_assert_eq(ri.num_missing, 39);
    for (uint32_t i = 0; i < SL_ROUNDS_INFO_MISSING; i++)
        cr_assert_eq(ri.missing[i], i < 5 ? i : i + 1, "missing[%u]", i);
}

/* A worker on the consumers' host makes each batch of a coordinated task in
 * the region of shared memory of the consumer it goes to (the k-th in
 * consumer k mod C's), so that it is lent in place. A batch taken outside
 * the rounds (a stand-in's for a lost worker's round) shifts that count:
 * each consumer must still get the batches made in its own region, not
 * its neighbour's, copied out (every later batch was, before 2026-12-02). */
Test(rounds_own_task, each_consumer_gets_the_batches_made_in_its_region_also_after_a_stand_in)
{
    enum { C = 3 };
    /* Batches of 8192 int64s (64 KiB): large enough to be made in a region. */
    setup_spec("{\"source\":{\"type\":\"range\",\"stop\":1000000000},\"ops\":[{\"op\":\"batch\",\"batch_size\":8192}]}",
               SL_SHARDING_OFF, C, 4);
    char err[256];
    sl_shm_lane_t *lane = sl_shm_lane_new(base, (size_t)16 << 20, NULL, err, sizeof err);
    cr_assert_not_null(lane, "%s", err);
    sl_shm_region_t *regions[C];
    for (uint32_t c = 0; c < C; c++) {
        regions[c] = sl_shm_region_new(lane, err, sizeof err);
        cr_assert_not_null(regions[c], "%s", err);
        sl_task_lend_region(task, regions[c], 100 + c, c);
    }
    unsigned own = 0, other = 0;
    uint64_t round = 0;
    for (int phase = 0; phase < 3; phase++) {
        /* Phase 0 lets the batches made before the regions came through;
         * between phases 1 and 2, a stand-in. */
        if (phase == 2) {
            sl_wire_batch_t *b = NULL;
            int rc;
            for (int i = 0; i < 30000 && (rc = sl_task_take_extra(task, &b)) == SL_TASK_PENDING; i++) {
                event_base_loop(base, EVLOOP_NONBLOCK);
                nanosleep(&(struct timespec){0, 1000000}, NULL);
            }
            cr_assert_eq(rc, SL_TASK_BATCH);
            sl_task_release(task, b);
            sl_wire_batch_free(b);
        }
        for (int k = 0; k < 20; k++, round++)
            for (uint32_t c = 0; c < C; c++) {
                sl_wire_batch_t *b = NULL;
                int rc;
                for (int i = 0; i < 30000 && (rc = sl_rounds_take(rounds, task, round, c, &b, err, sizeof err)) ==
                                                  SL_TASK_PENDING; i++) {
                    event_base_loop(base, EVLOOP_NONBLOCK);
                    nanosleep(&(struct timespec){0, 1000000}, NULL);
                }
                cr_assert_eq(rc, SL_TASK_BATCH, "round %" PRIu64 ", consumer %u: %d %s", round, c, rc, err);
                bool mine = sl_shm_region_holds(regions[c], b->data);
                if (phase > 0) {
                    own += mine;
                    other += !mine;
                    cr_assert(mine, "phase %d, round %" PRIu64 ": consumer %u got a batch made in %s", phase, round,
                              c, sl_task_lent_to(task, b, 0) >= 0 ? "another consumer's region" : "no region");
                }
                sl_task_release(task, b);
                sl_wire_batch_free(b);
            }
    }
    cr_assert_eq(own, 2 * 20 * C);
    cr_assert_eq(other, 0);
    /* The task lets its regions go first, then the connections and the lane. */
    sl_rounds_free(rounds);
    rounds = NULL;
    sl_task_free(task);
    task = NULL;
    for (uint32_t c = 0; c < C; c++)
        sl_shm_region_free(regions[c]);
    sl_shm_lane_free(lane);
}
