/*
 * test_membudget.c: the worker's memory budget (common/membudget.c) and
 * the pipeline ops that charge it: charges and refusals, accounts that
 * reserve in granules and give them back, concurrent charges, and
 * pipelines (shuffle, batch, prefetch, decode_jpeg) that fail with a clear
 * error over the budget, give everything back, and run exactly under it.
 */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "membudget.h"
#include "pipeline_util.h"

#define MiB ((size_t)1 << 20)

Test(membudget, charges_up_to_the_limit_and_counts_refusals)
{
    sl_membudget_t b;
    sl_membudget_init(&b, 1000, "--max-memory-mb");
    cr_assert(sl_membudget_charge(&b, 600));
    cr_assert(sl_membudget_charge(&b, 400));
    cr_assert_eq(sl_membudget_used(&b), 1000);
    cr_assert_not(sl_membudget_charge(&b, 1));
    cr_assert_not(sl_membudget_charge(&b, SIZE_MAX));
    cr_assert_eq(b.refusals, 2);
    cr_assert_eq(sl_membudget_used(&b), 1000, "a refused charge took nothing");
    sl_membudget_release(&b, 600);
    cr_assert(sl_membudget_charge(&b, 500));
    sl_membudget_release(&b, 900);
    cr_assert_eq(sl_membudget_used(&b), 0);
    /* No budget: everything fits. */
    cr_assert(sl_membudget_charge(NULL, SIZE_MAX));
    sl_membudget_release(NULL, 5);
}

struct waiter {
    sl_membudget_t *b;
    size_t bytes;
    bool cancel;
    bool got;
    size_t own;     /* what its owner holds for its consumer */
    bool overdraw;  /* its owner must make one more batch */
    bool thread_stop; /* its own thread is told to stop (a prefetch's) */
};

static void *waiter_main(void *arg)
{
    struct waiter *w = arg;
    /* Its own thread's stop first, up to its owner's (as a prefetch's). */
    sl_memwait_t owner = {.cancel = &w->cancel};
    w->got = sl_membudget_charge_wait(w->b, w->bytes,
                                      &(sl_memwait_t){.cancel = &w->thread_stop, .up = &owner, .own = &w->own,
                                                      .overdraw = &w->overdraw});
    return NULL;
}

/* Gated on the waiter being counted (at most 30 s: a hang fails the test). */
/* Starts a thread that charges bytes to b, its owner holding own. */
static void start_waiter(pthread_t *t, struct waiter *w, sl_membudget_t *b, size_t bytes, size_t own)
{
    *w = (struct waiter){.b = b, .bytes = bytes, .own = own};
    cr_assert_eq(pthread_create(t, NULL, waiter_main, w), 0);
}

static void until_waiting(sl_membudget_t *b)
{
    for (int i = 0; i < 30000 && __atomic_load_n(&b->waiters, __ATOMIC_SEQ_CST) == 0; i++) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    cr_assert_eq(__atomic_load_n(&b->waiters, __ATOMIC_SEQ_CST), 1, "the charge never waited");
}

/* A charge that may wait gets what a release gives back while it waits;
 * one told to stop gives up without a refusal; one nobody makes room for
 * is refused once its wait is over; without a wait it is refused at once. */
Test(membudget, a_waiting_charge_gets_what_is_released_stops_when_told_and_is_refused_after_its_wait)
{
    sl_membudget_t b;
    sl_membudget_init(&b, 1000, "--max-memory-mb");
    cr_assert_not(sl_membudget_charge_wait(&b, 2000, NULL), "without a wait: refused at once");
    cr_assert_eq(b.refusals, 1);
    cr_assert_eq(b.waits, 0);
    b.wait_ms = 600000; /* the test ends long before, or hangs visibly */
    cr_assert(sl_membudget_charge(&b, 900));
    struct waiter w;
    pthread_t t;
    start_waiter(&t, &w, &b, 300, 0);
    until_waiting(&b);
    sl_membudget_release(&b, 500);
    pthread_join(t, NULL);
    cr_assert(w.got, "the release did not reach the waiting charge");
    cr_assert_eq(sl_membudget_used(&b), 700);
    cr_assert_eq(b.waits, 1);
    cr_assert_eq(b.refusals, 1);
    /* Told to stop. */
    start_waiter(&t, &w, &b, 600, 0);
    until_waiting(&b);
    __atomic_store_n(&w.cancel, true, __ATOMIC_RELEASE);
    sl_membudget_wake(&b);
    pthread_join(t, NULL);
    cr_assert_not(w.got);
    cr_assert_eq(b.refusals, 1, "a charge that stopped is no refusal");
    cr_assert_eq(sl_membudget_used(&b), 700);
    /* Nobody makes room. */
    b.wait_ms = 20;
    cr_assert_not(sl_membudget_charge_wait(&b, 600, NULL));
    cr_assert_eq(b.refusals, 2);
    cr_assert_eq(b.waits, 3);
    cr_assert_eq(b.waiters, 0);
    sl_membudget_release(&b, 700);
    cr_assert(sl_membudget_charge_wait(NULL, SIZE_MAX, NULL));
}

/* A task whose own finished batches fill the budget waits as long as it
 * holds them (its consumer paused: they come back as it reads), not
 * wait_ms: before 2026-12-02 a trainer that paused for 2 s with its task's
 * buffer over the budget failed its job. Once it holds none, the wait is
 * over after wait_ms as for anyone. */
Test(membudget, a_charge_waits_on_while_its_owner_holds_memory_of_its_own, .timeout = 120)
{
    sl_membudget_t b;
    sl_membudget_init(&b, 1000, "--max-memory-mb");
    b.wait_ms = 20;
    cr_assert(sl_membudget_charge(&b, 900));
    struct waiter w;
    pthread_t t;
    start_waiter(&t, &w, &b, 300, 900);
    until_waiting(&b);
    struct timespec five_waits = {0, 100 * 1000000};
    nanosleep(&five_waits, NULL);
    cr_assert_eq(__atomic_load_n(&b.waiters, __ATOMIC_SEQ_CST), 1, "it gave up while its owner held 900 bytes");
    sl_membudget_release(&b, 500); /* the consumer read some */
    __atomic_store_n(&w.own, 400, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
    cr_assert(w.got);
    cr_assert_eq(b.refusals, 0);
    /* Its owner holds nothing of its own: refused after its wait. */
    start_waiter(&t, &w, &b, 600, 0);
    pthread_join(t, NULL);
    cr_assert_not(w.got);
    cr_assert_eq(b.refusals, 1);
    /* It held some, then none (they went to a client that stopped reading
     * and the task was dropped elsewhere): refused once its wait is over. */
    start_waiter(&t, &w, &b, 600, 100);
    until_waiting(&b);
    __atomic_store_n(&w.own, 0, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
    cr_assert_not(w.got);
    cr_assert_eq(b.refusals, 2);
    cr_assert_eq(sl_membudget_used(&b), 700);
    /* Its own thread is stopped (a prefetch reset or destroyed) while its
     * owner still holds memory: it gives up, no refusal counted. */
    start_waiter(&t, &w, &b, 600, 700);
    until_waiting(&b);
    __atomic_store_n(&w.thread_stop, true, __ATOMIC_RELEASE);
    sl_membudget_wake(&b);
    pthread_join(t, NULL);
    cr_assert_not(w.got);
    cr_assert_eq(b.refusals, 2);
    /* More than the whole budget: no wait makes room for it, refused at
     * once although its owner holds memory (it waited for ever before). */
    start_waiter(&t, &w, &b, 1001, 700);
    pthread_join(t, NULL);
    cr_assert_not(w.got);
    cr_assert_eq(b.refusals, 3);
    cr_assert_eq(b.waits, 4, "the charge over the whole budget did not wait");
    /* Its owner must make one more batch that its own wait for (a
     * stand-in's): the charge is taken past the limit once told so. */
    start_waiter(&t, &w, &b, 600, 700);
    until_waiting(&b);
    __atomic_store_n(&w.overdraw, true, __ATOMIC_RELEASE);
    sl_membudget_wake(&b);
    pthread_join(t, NULL);
    cr_assert(w.got);
    cr_assert_eq(sl_membudget_used(&b), 1300, "past the limit of 1000");
    cr_assert_eq(b.refusals, 3);
    cr_assert_not(sl_membudget_charge(&b, 1), "over the limit, nothing more fits");
    sl_membudget_release(&b, 1300);
}

Test(membudget, the_refusal_names_the_need_the_budget_and_the_option)
{
    sl_membudget_t b;
    sl_membudget_init(&b, 64 * MiB, "sluice-workerd --max-memory-mb");
    cr_assert(sl_membudget_charge(&b, 60 * MiB));
    char msg[400];
    sl_membudget_refusal(&b, 8 * MiB, "a shuffle buffer of 8 elements", msg, sizeof msg);
    cr_assert_str_eq(msg, "needs 8388608 bytes (8.0 MiB) for a shuffle buffer of 8 elements, but the worker's memory "
                          "budget of 67108864 bytes (64.0 MiB) has 4194304 bytes left "
                          "(sluice-workerd --max-memory-mb)");
}

/* Shares: each task's part of the worker's budget. Their charges are the
 * budget's, each counts its own, a batch handed to a holder leaves its
 * count, one that ends gives back what it still holds, and a refusal says
 * who holds the budget, the most first. */
Test(membudget, shares_count_their_part_and_a_refusal_names_who_holds_the_budget)
{
    sl_membudget_t b, s1, s2, s3, s4;
    sl_membudget_init(&b, 64 * MiB, "sluice-workerd --max-memory-mb");
    sl_membudget_init_share(&s1, &b, "task 7 of job 3");
    sl_membudget_init_share(&s2, &b, "task 9 of job 4");
    sl_membudget_init_share(&s3, &b, "task 11 of job 5");
    sl_membudget_init_share(&s4, &b, "task 12 of job 6");
    cr_assert(sl_membudget_charge(&s1, 30 * MiB));
    cr_assert(sl_membudget_try_charge(&s2, 10 * MiB));
    cr_assert(sl_membudget_charge_spare(&s3, 1 * MiB));
    sl_memacct_t a;
    sl_memacct_init(&a, &s4);
    cr_assert(sl_memacct_charge(&a, 3 * MiB));
    cr_assert(sl_membudget_charge(&b, 5 * MiB)); /* no share's: a holder's, a kept block */
    cr_assert_eq(sl_membudget_used(&b), 49 * MiB);
    cr_assert_eq(sl_membudget_used(&s1), 30 * MiB);
    cr_assert_eq(sl_membudget_used(&s2), 10 * MiB);
    cr_assert_eq(sl_membudget_used(&s4), sl_membudget_used(&b) - 46 * MiB, "the account's granules");
    cr_assert_not(sl_membudget_charge(&s3, 20 * MiB));
    cr_assert_eq(b.refusals, 1, "a share's refusal is its budget's");
    cr_assert_eq(sl_membudget_used(&s3), 1 * MiB, "a refused charge took nothing");
    char msg[512];
    sl_membudget_refusal(&s2, 20 * MiB, "a shuffle buffer of 8 elements", msg, sizeof msg);
    cr_assert_str_eq(msg, "needs 20971520 bytes (20.0 MiB) for a shuffle buffer of 8 elements, but the worker's "
                          "memory budget of 67108864 bytes (64.0 MiB) has 15728640 bytes left "
                          "(sluice-workerd --max-memory-mb); held now by task 7 of job 3 30.0 MiB, this task 10.0 MiB, "
                          "task 12 of job 6 3.0 MiB, others 6.0 MiB");
    /* A wait through a share gets the room another share gives back. */
    b.wait_ms = 10000;
    cr_assert(sl_membudget_charge_wait(&s3, 1 * MiB, NULL));
    cr_assert_eq(sl_membudget_used(&s3), 2 * MiB);
    /* Half of task 7's charge goes to a holder, which gives it back to the
     * budget; task 7 ends holding 5 MiB more, which come back with it. */
    sl_membudget_hand_over(&s1, 15 * MiB);
    cr_assert_eq(sl_membudget_used(&s1), 15 * MiB);
    cr_assert_eq(sl_membudget_used(&b), 50 * MiB, "still charged, to the holder now");
    sl_membudget_release(&b, 15 * MiB);
    sl_membudget_release(&s1, 10 * MiB);
    sl_membudget_share_done(&s1);
    cr_assert_eq(sl_membudget_used(&b), 20 * MiB);
    sl_membudget_refusal(&s3, 60 * MiB, "x", msg, sizeof msg);
    cr_assert(strstr(msg, "; held now by task 9 of job 4 10.0 MiB, task 12 of job 6 3.0 MiB, this task 2.0 MiB, "
                          "others 5.0 MiB"), "%s", msg);
    sl_memacct_release_all(&a);
    sl_membudget_release(&s2, 10 * MiB);
    sl_membudget_release(&s3, 2 * MiB);
    sl_membudget_release(&b, 5 * MiB);
    sl_membudget_share_done(&s2);
    sl_membudget_share_done(&s3);
    sl_membudget_share_done(&s4);
    cr_assert_eq(sl_membudget_used(&b), 0);
    /* No share holds anything: the message is the budget's alone. */
    sl_membudget_init_share(&s1, &b, "task 13 of job 7");
    sl_membudget_refusal(&s1, 80 * MiB, "y", msg, sizeof msg);
    cr_assert(strstr(msg, "(sluice-workerd --max-memory-mb)") && !strstr(msg, "held now"), "%s", msg);
    sl_membudget_share_done(&s1);
}

Test(membudget, an_account_reserves_granules_and_gives_them_back)
{
    const size_t G = SL_MEMACCT_GRANULE;
    sl_membudget_t b;
    sl_membudget_init(&b, 10 * G - 100, "x");
    sl_memacct_t a;
    sl_memacct_init(&a, &b);
    /* Many small charges: one granule from the budget. */
    for (int i = 0; i < 1000; i++)
        cr_assert(sl_memacct_charge(&a, 100));
    cr_assert_eq(a.held, 100000);
    cr_assert_eq(sl_membudget_used(&b), G);
    /* Near the limit a charge gets exactly what it needs, not a granule. */
    sl_memacct_t c;
    sl_memacct_init(&c, &b);
    cr_assert(sl_memacct_charge(&c, 9 * G - 200));
    cr_assert_eq(sl_membudget_used(&b), 10 * G - 200);
    cr_assert(sl_memacct_charge(&c, 100));
    cr_assert_eq(sl_membudget_used(&b), 10 * G - 100);
    cr_assert_eq(b.refusals, 0, "a granule that did not fit is no refusal");
    cr_assert_not(sl_memacct_charge(&c, 1));
    cr_assert_eq(b.refusals, 1);
    cr_assert_eq(c.held, 9 * G - 100);
    /* Shrinking gives back all but what is held, rounded to a granule. */
    sl_memacct_release(&c, 9 * G - 105);
    cr_assert_eq(c.held, 5);
    cr_assert_eq(c.reserved, G);
    cr_assert_eq(sl_membudget_used(&b), 2 * G);
    sl_memacct_release(&c, 1000); /* more than held: what is held */
    cr_assert_eq(c.held, 0);
    sl_memacct_release_all(&c);
    sl_memacct_release_all(&a);
    cr_assert_eq(sl_membudget_used(&b), 0);
    /* An account without a budget counts what it holds. */
    sl_memacct_t u = {0};
    cr_assert(sl_memacct_charge(&u, SIZE_MAX / 2));
    cr_assert_not(sl_memacct_charge(&u, SIZE_MAX), "an overflowing charge is refused");
    sl_memacct_release_all(&u);
}

struct hammer {
    sl_membudget_t *b;
    uint64_t ok;
};

static void *hammer_main(void *arg)
{
    struct hammer *h = arg;
    sl_memacct_t a;
    sl_memacct_init(&a, h->b);
    for (int i = 0; i < 20000; i++) {
        size_t n = (size_t)(i % 97) * 4099;
        if (sl_memacct_charge(&a, n)) {
            h->ok++;
            if (i % 3 == 0)
                sl_memacct_release(&a, n);
        }
        if (i % 1000 == 999)
            sl_memacct_release_all(&a);
    }
    sl_memacct_release_all(&a);
    return NULL;
}

Test(membudget, concurrent_accounts_never_exceed_the_limit_and_give_all_back)
{
    sl_membudget_t b;
    sl_membudget_init(&b, 40 * MiB, "x");
    struct hammer h[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        h[i] = (struct hammer){&b, 0};
        cr_assert_eq(pthread_create(&t[i], NULL, hammer_main, &h[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    cr_assert_eq(sl_membudget_used(&b), 0);
    cr_assert_gt(b.refusals, 0, "the accounts should have met the limit");
}

/* ---- pipelines ---- */

static sl_membudget_t budget;

static void budget_init(void)
{
    sl_membudget_init(&budget, 4 * MiB, "sluice-workerd --max-memory-mb");
}

TestSuite(membudget_pipeline, .init = budget_init);

Test(membudget_pipeline, a_shuffle_over_the_budget_fails_naming_it_and_gives_its_memory_back)
{
    sl_pipeline_opts_t o = {.mem = &budget};
    sl_pipeline_t *p = pipeline_make("{\"source\":{\"type\":\"range\",\"stop\":1000000},\"ops\":["
                                     "{\"op\":\"shuffle\",\"buffer_size\":1000000,\"seed\":1},"
                                     "{\"op\":\"batch\",\"batch_size\":100}]}",
                                     &o);
    batches_t bs = run_pipeline(p);
    cr_assert_eq(bs.rc, SL_ETOOBIG, "%d %s", bs.rc, bs.errmsg);
    cr_assert_eq(bs.n, 0);
    cr_assert(strstr(bs.errmsg, "ops[0] (shuffle): needs ") == bs.errmsg, "%s", bs.errmsg);
    cr_assert(strstr(bs.errmsg, "for a shuffle buffer of "), "%s", bs.errmsg);
    cr_assert(strstr(bs.errmsg, "(buffer_size 1000000), but the worker's memory budget of 4194304 bytes (4.0 MiB) "
                                "has "),
              "%s", bs.errmsg);
    cr_assert(strstr(bs.errmsg, "(sluice-workerd --max-memory-mb)"), "%s", bs.errmsg);
    cr_assert_eq(sl_membudget_used(&budget), 0, "the refused shuffle gave its buffer back: %zu held",
                 sl_membudget_used(&budget));
    cr_assert_eq(budget.refusals, 1);
    /* Every later call says the same. */
    sl_wire_batch_t *b = NULL;
    cr_assert_eq(sl_pipeline_next(p, &b), SL_ETOOBIG);
    sl_pipeline_destroy(p);
    batches_free(&bs);
}

/* Sums the int64 values of component 0 over every batch. */
static void sum_of(const batches_t *bs, uint64_t *count, int64_t *sum)
{
    *count = 0;
    *sum = 0;
    for (size_t i = 0; i < bs->n; i++) {
        const sl_component_t *c = &bs->b[i]->components[0];
        const int64_t *v = (const int64_t *)(bs->b[i]->data + c->offset);
        for (int64_t k = 0; k < c->shape[0]; k++)
            *sum += v[k];
        *count += (uint64_t)c->shape[0];
    }
}

Test(membudget_pipeline, pipelines_under_the_budget_run_exactly_and_give_everything_back)
{
    sl_pipeline_opts_t o = {.mem = &budget};
    const char *specs[] = {
        "{\"source\":{\"type\":\"range\",\"stop\":20000},\"ops\":[{\"op\":\"shuffle\",\"buffer_size\":5000},"
        "{\"op\":\"batch\",\"batch_size\":64},{\"op\":\"prefetch\",\"buffer_size\":4}]}",
        "{\"source\":{\"type\":\"range\",\"stop\":20000},\"ops\":[{\"op\":\"prefetch\",\"buffer_size\":64},"
        "{\"op\":\"cache\"},{\"op\":\"repeat\",\"count\":2},{\"op\":\"batch\",\"batch_size\":1000}]}",
        "{\"source\":{\"type\":\"range\",\"stop\":20000},\"ops\":[{\"op\":\"cache\"},"
        "{\"op\":\"repeat\",\"count\":2},{\"op\":\"batch\",\"batch_size\":1000}]}",
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        sl_pipeline_t *p = pipeline_make(specs[i], &o);
        batches_t bs = run_pipeline(p);
        cr_assert_eq(bs.rc, 1, "%s: %d %s", specs[i], bs.rc, bs.errmsg);
        uint64_t n;
        int64_t sum;
        sum_of(&bs, &n, &sum);
        uint64_t reps = i >= 1 ? 2 : 1;
        cr_assert_eq(n, 20000 * reps, "%s", specs[i]);
        cr_assert_eq(sum, (int64_t)(19999 * 20000 / 2 * reps), "%s", specs[i]);
        sl_pipeline_destroy(p);
        batches_free(&bs);
        cr_assert_eq(sl_membudget_used(&budget), 0, "%s left %zu bytes charged", specs[i], sl_membudget_used(&budget));
    }
    cr_assert_eq(budget.refusals, 0);
}

/* A shuffle whose input ended gives its slots back when its buffer empties,
 * not when the pipeline is destroyed: a worker keeps a finished task's
 * pipeline until its job is collected, and the next job needs the room. A
 * repeat after it grows them again for the next epoch. */
Test(membudget_pipeline, a_shuffle_gives_its_slots_back_when_its_input_ends_and_it_empties)
{
    sl_pipeline_opts_t o = {.mem = &budget};
    sl_pipeline_t *p = pipeline_make("{\"source\":{\"type\":\"range\",\"stop\":50000},\"ops\":["
                                     "{\"op\":\"shuffle\",\"buffer_size\":20000,\"seed\":4},"
                                     "{\"op\":\"repeat\",\"count\":2},{\"op\":\"batch\",\"batch_size\":1000}]}",
                                     &o);
    /* Ten batches in, the buffer is full: its 20000 slots of at least 64
     * bytes are charged. */
    batches_t first = run_pipeline_n(p, 10);
    cr_assert_eq(first.n, 10, "%s", first.errmsg);
    size_t mid = sl_membudget_used(&budget);
    cr_assert_gt(mid, (size_t)20000 * 64, "the slots were never charged (%zu bytes)", mid);
    batches_t rest = run_pipeline(p);
    cr_assert_eq(rest.rc, 1, "%s", rest.errmsg);
    uint64_t n1, n2;
    int64_t sum1, sum2;
    sum_of(&first, &n1, &sum1);
    sum_of(&rest, &n2, &sum2);
    cr_assert_eq(n1 + n2, 100000);
    cr_assert_eq(sum1 + sum2, (int64_t)49999 * 50000);
    /* What stays is what the batch's account keeps reserved (at most two
     * granules, membudget.h), not the slots. */
    cr_assert_leq(sl_membudget_used(&budget), 2 * SL_MEMACCT_GRANULE, "the ended pipeline still has %zu bytes charged",
                  sl_membudget_used(&budget));
    batches_free(&first);
    batches_free(&rest);
    sl_pipeline_destroy(p);
    cr_assert_eq(budget.refusals, 0);
}

Test(membudget_pipeline, a_batch_over_the_budget_fails_naming_it)
{
    sl_pipeline_opts_t o = {.mem = &budget};
    /* 1,000,000 int64 rows: an 8 MB block. */
    batches_t bs = run_spec("{\"source\":{\"type\":\"range\",\"stop\":2000000},\"ops\":["
                            "{\"op\":\"batch\",\"batch_size\":1000000}]}",
                            &o);
    cr_assert_eq(bs.rc, SL_ETOOBIG, "%d %s", bs.rc, bs.errmsg);
    cr_assert(strstr(bs.errmsg, "ops[0] (batch): needs 8000000 bytes (7.6 MiB) for a batch of 1000000 elements, but "
                                "the worker's memory budget of 4194304 bytes") == bs.errmsg,
              "%s", bs.errmsg);
    cr_assert_eq(sl_membudget_used(&budget), 0);
    batches_free(&bs);
}

#define FIXTURES_IMAGES SL_TEST_DATA "/tfrecord"

/* The fixtures' images parsed, decoded, then ops. */
static const char *decode_then(const char *ops)
{
    return specf("{\"source\":{\"type\":\"tfrecord\",\"files\":\"" FIXTURES_IMAGES "/images-*.tfrecord\"},"
                 "\"ops\":[{\"op\":\"parse_example\",\"features\":{\"image/encoded\":{\"dtype\":\"bytes\"}}},"
                 "{\"op\":\"decode_jpeg\",\"key\":\"image/encoded\"},%s]}",
                 ops);
}

Test(membudget_pipeline, decode_jpeg_is_refused_on_its_header_before_decoding)
{
    sl_confine_t *roots = roots_at(FIXTURES_IMAGES);
    sl_membudget_t tiny;
    sl_membudget_init(&tiny, 1000, "sluice-workerd --max-memory-mb");
    sl_pipeline_opts_t o = {.roots = roots, .mem = &tiny};
    batches_t bs = run_spec("{\"source\":{\"type\":\"tfrecord\",\"files\":\"" FIXTURES_IMAGES
                            "/images-*.tfrecord\"},\"ops\":[{\"op\":\"parse_example\",\"features\":{"
                            "\"image/encoded\":{\"dtype\":\"bytes\"}}},"
                            "{\"op\":\"decode_jpeg\",\"key\":\"image/encoded\"}]}",
                            &o);
    cr_assert_eq(bs.rc, SL_ETOOBIG, "%d %s", bs.rc, bs.errmsg);
    cr_assert(strstr(bs.errmsg, "ops[1] (decode_jpeg): component \"image/encoded\" (") == bs.errmsg, "%s",
              bs.errmsg);
    cr_assert(strstr(bs.errmsg, " for a decoded "), "%s", bs.errmsg);
    cr_assert(strstr(bs.errmsg, "the worker's memory budget of 1000 bytes"), "%s", bs.errmsg);
    cr_assert_eq(sl_membudget_used(&tiny), 0);
    cr_assert_eq(tiny.refusals, 1);
    batches_free(&bs);
    /* A crop or random_resized_crop fused with the decode (only the window
     * decoded) is charged its rows too, and refused before it decodes. */
    const char *crops[] = {"{\"op\":\"random_crop\",\"key\":\"image/encoded\",\"size\":[20,20]}",
                           "{\"op\":\"random_resized_crop\",\"key\":\"image/encoded\",\"size\":[8,8]}",
                           "{\"op\":\"center_crop\",\"key\":\"image/encoded\",\"size\":[20,20]},"
                           "{\"op\":\"resize\",\"key\":\"image/encoded\",\"size\":[8,8]}"};
    for (size_t i = 0; i < sizeof crops / sizeof crops[0]; i++) {
        bs = run_spec(decode_then(crops[i]), &o);
        cr_assert_eq(bs.rc, SL_ETOOBIG, "%s: %d %s", crops[i], bs.rc, bs.errmsg);
        cr_assert(strstr(bs.errmsg, "ops[1] (decode_jpeg): component \"image/encoded\" (") == bs.errmsg, "%s",
                  bs.errmsg);
        cr_assert(strstr(bs.errmsg, " for a decoded window of "), "%s", bs.errmsg);
        cr_assert_eq(sl_membudget_used(&tiny), 0);
        batches_free(&bs);
    }
    cr_assert_eq(tiny.refusals, 4);
    /* With room, the same pipeline decodes every image and gives it all back. */
    sl_membudget_t room;
    sl_membudget_init(&room, 64 * MiB, "x");
    o.mem = &room;
    bs = run_spec("{\"source\":{\"type\":\"tfrecord\",\"files\":\"" FIXTURES_IMAGES
                  "/images-*.tfrecord\"},\"ops\":[{\"op\":\"parse_example\",\"features\":{"
                  "\"image/encoded\":{\"dtype\":\"bytes\"}}},"
                  "{\"op\":\"decode_jpeg\",\"key\":\"image/encoded\",\"num_parallel_calls\":2},"
                  "{\"op\":\"shuffle\",\"buffer_size\":8}]}",
                  &o);
    cr_assert_eq(bs.rc, 1, "%d %s", bs.rc, bs.errmsg);
    cr_assert_gt(bs.n, 0);
    cr_assert_eq(sl_membudget_used(&room), 0);
    batches_free(&bs);
    for (size_t i = 0; i < sizeof crops / sizeof crops[0]; i++) {
        bs = run_spec(decode_then(crops[i]), &o);
        cr_assert_eq(bs.rc, 1, "%s: %d %s", crops[i], bs.rc, bs.errmsg);
        cr_assert_eq(bs.n, 32);
        cr_assert_eq(sl_membudget_used(&room), 0);
        batches_free(&bs);
    }
    sl_confine_destroy(roots);
}

/* ---- charges that wait while the pipeline's owner holds memory ---- */

/* Gives `bytes` back to b once a charge waits for them (or after 30 s). */
struct releaser {
    sl_membudget_t *b;
    size_t bytes;
    bool saw_wait;
};

static void *releaser_main(void *arg)
{
    struct releaser *r = arg;
    for (int i = 0; i < 30000 && __atomic_load_n(&r->b->waiters, __ATOMIC_SEQ_CST) == 0; i++) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    r->saw_wait = __atomic_load_n(&r->b->waiters, __ATOMIC_SEQ_CST) > 0;
    sl_membudget_release(r->b, r->bytes);
    return NULL;
}

/* 100 records of 64 KiB in a file of their own (record k filled with k),
 * read by records_spec(). */
struct records {
    char dir[32];
    char path[64];
    sl_confine_t *roots;
};

static void records_make(struct records *r)
{
    snprintf(r->dir, sizeof r->dir, "/tmp/sl-membudget-XXXXXX");
    cr_assert_not_null(mkdtemp(r->dir));
    snprintf(r->path, sizeof r->path, "%s/records.bin", r->dir);
    FILE *f = fopen(r->path, "wb");
    cr_assert_not_null(f);
    static uint8_t rec[64 << 10];
    for (size_t k = 0; k < 100; k++) {
        memset(rec, (int)k, sizeof rec);
        cr_assert_eq(fwrite(rec, 1, sizeof rec, f), sizeof rec);
    }
    cr_assert_eq(fclose(f), 0);
    r->roots = roots_at(r->dir);
}

static void records_remove(struct records *r)
{
    sl_confine_destroy(r->roots);
    unlink(r->path);
    rmdir(r->dir);
}

/* A spec reading the records, then ops (JSON of the ops array's items). */
static const char *records_spec(const struct records *r, const char *ops)
{
    return specf("{\"source\":{\"type\":\"fixed_length_records\",\"files\":\"%s\",\"record_bytes\":65536},"
                 "\"ops\":[%s]}",
                 r->path, ops);
}

/* The budget full but for room bytes, which the test holds (its owner's
 * own batches: own not 0, a wait without end): @return what it charged. */
static size_t budget_with_room(sl_pipeline_opts_t *o, size_t room)
{
    static size_t own = 1;
    budget.wait_ms = 600000; /* the test ends long before, or hangs visibly */
    o->mem = &budget;
    o->mem_wait = (sl_memwait_t){.own = &own};
    size_t taken = budget.limit - room;
    cr_assert(sl_membudget_charge(&budget, taken));
    return taken;
}

/* Gives back what budget_with_room() took: nothing else stays charged. */
static void budget_given_back(size_t taken)
{
    sl_membudget_release(&budget, taken);
    cr_assert_eq(sl_membudget_used(&budget), 0, "%zu bytes left charged", sl_membudget_used(&budget));
    cr_assert_eq(budget.refusals, 0, "a charge was refused (or a wait given up as its thread stopped counted)");
}

/* Runs spec over a budget its owner's own batches fill (own not 0, a wait
 * without end): the first charge that needs room waits until the budget is
 * given back, then the pipeline runs to its end. */
static batches_t run_on_a_full_budget(const char *spec, sl_pipeline_opts_t *o)
{
    struct releaser r = {&budget, budget_with_room(o, 0), false};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, releaser_main, &r), 0);
    batches_t bs = run_spec(spec, o);
    pthread_join(t, NULL);
    cr_assert(r.saw_wait, "no charge waited: %d %s", bs.rc, bs.errmsg);
    budget_given_back(0);
    return bs;
}

/* The first byte of a batch's one record. */
static uint8_t first_byte(const sl_wire_batch_t *b)
{
    size_t len;
    const uint8_t *rec = str_at(b, &b->components[0], 0, &len);
    cr_assert_eq(len, 64 << 10);
    return rec[0];
}

/* Before 2026-12-03 prefetch's and decode_jpeg's charges were refused at
 * once on a full budget (SL_ETOOBIG) while shuffle's and batch's waited:
 * a trainer that paused with its task's batches filling the budget failed
 * its job behind a prefetch of records or a decode. */
Test(membudget_pipeline, prefetch_and_decode_jpeg_wait_for_room_their_owner_gives_back)
{
    struct records rs;
    records_make(&rs);
    sl_pipeline_opts_t o = {.roots = rs.roots};
    batches_t bs = run_on_a_full_budget(records_spec(&rs, "{\"op\":\"prefetch\",\"buffer_size\":4}"), &o);
    cr_assert_eq(bs.rc, 1, "%d %s", bs.rc, bs.errmsg);
    cr_assert_eq(bs.n, 100);
    for (size_t k = 0; k < bs.n; k++)
        cr_assert_eq(first_byte(bs.b[k]), (uint8_t)k, "record %zu out of order", k);
    batches_free(&bs);
    records_remove(&rs);

    sl_confine_t *roots = roots_at(FIXTURES_IMAGES);
    o = (sl_pipeline_opts_t){.roots = roots};
    bs = run_on_a_full_budget(decode_then("{\"op\":\"cast\",\"key\":\"image/encoded\",\"dtype\":\"uint8\"}"), &o);
    cr_assert_eq(bs.rc, 1, "%d %s", bs.rc, bs.errmsg);
    cr_assert_eq(bs.n, 32);
    batches_free(&bs);
    sl_confine_destroy(roots);
}

/* A prefetch whose thread waits for room, with no end to the wait (its
 * owner holds memory), is reset by a take and a repeat above it: its own
 * stop ends the wait, and the next epoch runs. Before 2026-12-03 only the
 * task's stop did, and the reset waited for ever. */
Test(membudget_pipeline, a_prefetch_reset_while_its_thread_waits_for_room_runs_on, .timeout = 120)
{
    struct records rs;
    records_make(&rs);
    sl_pipeline_opts_t o = {.roots = rs.roots};
    /* Room for one record (64 KiB and its offsets), not two: the thread
     * queues it, then one more once it is taken (its room stays reserved
     * to the prefetch's account), then waits for a third. */
    size_t taken = budget_with_room(&o, 80 << 10);
    sl_pipeline_t *p = pipeline_make(records_spec(&rs, "{\"op\":\"prefetch\",\"buffer_size\":4},"
                                                       "{\"op\":\"take\",\"count\":1},{\"op\":\"repeat\",\"count\":2}"),
                                     &o);
    batches_t first = run_pipeline_n(p, 1);
    cr_assert_eq(first.n, 1, "%d %s", first.rc, first.errmsg);
    until_waiting(&budget);
    batches_t rest = run_pipeline(p);
    cr_assert_eq(rest.rc, 1, "%d %s", rest.rc, rest.errmsg);
    cr_assert_eq(rest.n, 1, "the second epoch's record");
    cr_assert_eq(first_byte(rest.b[0]), 0, "the second epoch starts at record 0");
    batches_free(&first);
    batches_free(&rest);
    sl_pipeline_destroy(p);
    budget_given_back(taken);
    records_remove(&rs);
}

/* The queue's thread waits for room its own account reserved for the
 * elements its consumer took since (granules, membudget.h): taking one
 * gives the account's spare reservation back while a charge waits. Before,
 * with room for 1.25 records and a queue of 2, the thread waited for ever
 * beside 64 KiB of its own reserved and unused. Until 2026-12-05 it still
 * did about one run in ten: a take between the thread's failed try and
 * its counting as a waiter kept its bytes; fifty runs, each a fresh race. */
Test(membudget_pipeline, a_prefetch_waiting_for_room_gets_what_its_queue_gave_back, .timeout = 120)
{
    struct records rs;
    records_make(&rs);
    uint64_t waits = budget.waits;
    for (int run = 0; run < 50; run++) {
        sl_pipeline_opts_t o = {.roots = rs.roots};
        size_t taken = budget_with_room(&o, 80 << 10);
        batches_t bs = run_spec(records_spec(&rs, "{\"op\":\"prefetch\",\"buffer_size\":2}"), &o);
        cr_assert_eq(bs.rc, 1, "run %d: %d %s", run, bs.rc, bs.errmsg);
        cr_assert_eq(bs.n, 100);
        for (size_t k = 0; k < bs.n; k++)
            cr_assert_eq(first_byte(bs.b[k]), (uint8_t)k, "run %d: record %zu out of order", run, k);
        batches_free(&bs);
        budget_given_back(taken);
    }
    cr_assert_gt(budget.waits, waits, "the queue's thread never waited: the test tests nothing");
    records_remove(&rs);
}

/* A prefetch below another: the outer one's thread waits on the inner
 * queue while the inner one's thread waits for room (its owner holds
 * memory: no end). Resetting the outer one (a take and a repeat above)
 * ends the inner one's wait too (sl_memwait_t.up); before, the reset
 * waited for ever. The fixtures' records are 1.1 to 2.9 KB, in a known
 * order: with 1500 bytes of room the first ones fit and a larger one
 * waits; the labels the outer queue holds cost nothing. */
Test(membudget_pipeline, a_prefetch_below_a_reset_prefetch_stops_waiting_for_room, .timeout = 120)
{
    sl_confine_t *roots = roots_at(FIXTURES_IMAGES);
    sl_pipeline_opts_t o = {.roots = roots};
    size_t taken = budget_with_room(&o, 1500);
    sl_pipeline_t *p = pipeline_make("{\"source\":{\"type\":\"tfrecord\",\"files\":\"" FIXTURES_IMAGES
                                     "/images-*.tfrecord\"},\"ops\":[{\"op\":\"prefetch\",\"buffer_size\":1},"
                                     "{\"op\":\"parse_example\",\"features\":{\"label\":{\"dtype\":\"int64\"}}},"
                                     "{\"op\":\"prefetch\",\"buffer_size\":4},{\"op\":\"take\",\"count\":1},"
                                     "{\"op\":\"repeat\",\"count\":2}]}",
                                     &o);
    batches_t first = run_pipeline_n(p, 1);
    cr_assert_eq(first.n, 1, "%d %s", first.rc, first.errmsg);
    until_waiting(&budget);
    batches_t rest = run_pipeline(p);
    cr_assert_eq(rest.rc, 1, "%d %s", rest.rc, rest.errmsg);
    cr_assert_eq(rest.n, 1, "the second epoch's label");
    cr_assert_eq(i64_at(rest.b[0], &rest.b[0]->components[0], 0), i64_at(first.b[0], &first.b[0]->components[0], 0),
                 "the second epoch starts at the first record");
    batches_free(&first);
    batches_free(&rest);
    sl_pipeline_destroy(p);
    budget_given_back(taken);
    sl_confine_destroy(roots);
}
