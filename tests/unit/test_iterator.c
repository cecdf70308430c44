/*
 * test_iterator.c: libsluice's iterator (client/iterator.c) against a real
 * dispatcher and two real workers running in-process on one event loop
 * thread, over loopback: under DYNAMIC behind shuffle(50000) every element
 * comes exactly once, every batch with its tallies; a checkpoint taken
 * mid-epoch restores in a new iterator to exactly the rest; an iterator
 * over OFF gets the dataset once per worker; a dataset that cannot be
 * registered is refused by name; a checkpoint builder fed the iterator's
 * deltas gives its checkpoint's bytes at every batch; shuffled batches'
 * provenance comes in the dense form and names each element; a negative
 * request window is refused by name.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dstate_util.h"
#include "thread_util.h"
#include "le.h"
#include "received.h"
#include "server.h"
#include "sluice.h"
#include "worker.h"

#define N 200000

static struct {
    char dir[64];
    struct event_base *base;
    sl_store_t *store;
    sl_dstate_t *st;
    sl_dserver_t *srv;
    sl_worker_t *w[2];
    char addr[64];
    pthread_t thread;
} C;

static void *loop_main(void *arg)
{
    (void)arg;
    event_base_loop(C.base, EVLOOP_NO_EXIT_ON_EMPTY);
    return NULL;
}

static void cluster_start(void)
{
    evthread_use_pthreads();
    /* As the daemons' main() (workerd/main.c): a client that goes with
     * answers in flight fails the worker's next write with EPIPE, which
     * the process must outlive. */
    signal(SIGPIPE, SIG_IGN);
    snprintf(C.dir, sizeof C.dir, "/tmp/sl-test-iter-XXXXXX");
    cr_assert_not_null(mkdtemp(C.dir));
    C.base = event_base_new();
    C.store = open_state_store(C.dir, 0);
    C.st = new_state();
    char err[512];
    uint16_t dport, port;
    cr_assert_eq(sl_dserver_start(C.base, C.st, C.store, NULL, "127.0.0.1", 0, &dport, &C.srv, err, sizeof err), 0, "%s",
                 err);
    snprintf(C.addr, sizeof C.addr, "127.0.0.1:%u", dport);
    for (int i = 0; i < 2; i++) {
        sl_worker_config_t cfg;
        sl_worker_config_init(&cfg);
        cfg.dispatcher = C.addr;
        cfg.bind = "127.0.0.1";
        cr_assert_eq(sl_worker_start(C.base, &cfg, &port, &C.w[i], err, sizeof err), 0, "%s", err);
    }
    /* Both workers registered before the loop moves to its thread (the
     * state is read on the loop's thread only), at most 30 s. */
    for (int i = 0; i < 3000; i++) {
        sl_dstate_stats_t ds;
        sl_dstate_stats(C.st, &ds);
        if (ds.workers_live == 2)
            break;
        struct timeval tv = {0, 10000};
        event_base_loopexit(C.base, &tv);
        event_base_dispatch(C.base);
    }
    sl_dstate_stats_t ds;
    sl_dstate_stats(C.st, &ds);
    cr_assert_eq(ds.workers_live, 2);
    cr_assert_eq(pthread_create(&C.thread, NULL, loop_main, NULL), 0);
}

static void cluster_stop(void)
{
    event_base_loopbreak(C.base);
    pthread_join(C.thread, NULL);
    for (int i = 0; i < 2; i++)
        sl_worker_free(C.w[i]);
    sl_dserver_free(C.srv);
    sl_dstate_free(C.st);
    sl_store_close(C.store);
    event_base_free(C.base);
    remove_dir(C.dir);
}

TestSuite(iterator, .init = cluster_start, .fini = cluster_stop, .timeout = 120);

static uint64_t register_spec(sl_client_t *c, const char *spec)
{
    uint64_t id = 0;
    cr_assert_eq(sl_client_register_dataset(c, spec, strlen(spec), &id), 0, "%s", sl_client_errmsg(c));
    return id;
}

/* Reads up to limit batches (0: to the end), counting each value in seen.
 * @return the batches read */
static int read_batches(sl_iterator_t *it, unsigned *seen, int limit)
{
    int batches = 0;
    while (limit == 0 || batches < limit) {
        sl_batch_t *b;
        int rc = sl_iterator_next(it, &b);
        if (rc == 1)
            break;
        cr_assert_eq(rc, 0, "%s", sl_iterator_errmsg(it));
        const sl_tensor_t *t = sl_batch_find(b, "value");
        cr_assert_not_null(t);
        /* A dense tensor says so whole: no row splits, a shape of its
         * rank and zeros past it (the batch's structs are not zeroed
         * whole, common/zero.h). */
        cr_assert_eq(sl_batch_num_tensors(b), 1);
        cr_assert(t->row_splits == NULL && t->num_row_splits == 0 && t->dtype == SL_DTYPE_INT64);
        cr_assert_eq(t->rank, 1);
        cr_assert_eq(t->shape[0], (int64_t)sl_batch_num_elements(b));
        for (int k = 1; k < SL_MAX_RANK; k++)
            cr_assert_eq(t->shape[k], 0, "shape[%d] past the rank", k);
        cr_assert_eq(t->size, sl_batch_num_elements(b) * sizeof(int64_t));
        const int64_t *v = t->data;
        for (uint64_t i = 0; i < sl_batch_num_elements(b); i++) {
            cr_assert(v[i] >= 0 && v[i] < N, "value %ld", (long)v[i]);
            seen[v[i]]++;
        }
        sl_batch_release(b);
        batches++;
    }
    return batches;
}

static void assert_each(const unsigned *seen, unsigned times)
{
    for (int i = 0; i < N; i++)
        cr_assert_eq(seen[i], times, "value %d came %u times, not %u", i, seen[i], times);
}

static const char *shuffled =
    "{\"source\":{\"type\":\"range\",\"stop\":200000},\"ops\":[{\"op\":\"shuffle\",\"buffer_size\":50000,"
    "\"seed\":4},{\"op\":\"batch\",\"batch_size\":512}]}";

/* A client and an iterator over spec under sharding, from its first batch. */
struct reader {
    sl_client_t *c;
    uint64_t ds;
    sl_iterator_opts_t o;
    sl_iterator_t *it;
};

static void reader_open(struct reader *r, const char *spec, sl_sharding_t sharding)
{
    cr_assert_eq(sl_client_open(C.addr, NULL, &r->c), 0);
    r->ds = register_spec(r->c, spec);
    sl_iterator_opts_init(&r->o);
    r->o.sharding = sharding;
    cr_assert_eq(sl_iterator_open(r->c, r->ds, &r->o, &r->it), 0, "%s", sl_iterator_errmsg(r->it));
}

static void reader_close(struct reader *r)
{
    sl_iterator_close(r->it);
    sl_client_close(r->c);
}

static unsigned seen[N];

/* Every batch of a DYNAMIC job came with its tallies (the iterator asks
 * for them: lazy provenance), rows that count its records split by split.
 * @return the batches read */
static int read_tallied(sl_iterator_t *it, unsigned *seen)
{
    int batches = 0;
    for (;;) {
        sl_batch_t *b;
        int rc = sl_iterator_next(it, &b);
        if (rc == 1)
            break;
        cr_assert_eq(rc, 0, "%s", sl_iterator_errmsg(it));
        const struct sl_batch *sb = b;
        cr_assert_not_null(sb->tally, "batch %d came without tallies", batches);
        uint64_t sum = 0;
        for (size_t i = 0; i < sb->num_tally; i++) {
            cr_assert(sb->tally[i].delivered >= 1 && sb->tally[i].delivered <= sb->tally[i].end - sb->tally[i].begin);
            sum += sb->tally[i].delivered;
        }
        cr_assert_eq(sum, sb->num_records, "batch %d", batches);
        const int64_t *v = sl_batch_find(b, "value")->data;
        for (uint64_t i = 0; i < sl_batch_num_elements(b); i++)
            seen[v[i]]++;
        sl_batch_release(b);
        batches++;
    }
    return batches;
}

Test(iterator, dynamic_behind_a_shuffle_is_exactly_once)
{
    struct reader r;
    reader_open(&r, shuffled, SL_SHARDING_DYNAMIC);
    memset(seen, 0, sizeof seen);
    cr_assert_gt(read_tallied(r.it, seen), 0);
    assert_each(seen, 1);
    reader_close(&r);
}

/* Behind a shuffle the workers send the provenance in the dense form
 * (provwire.h), which decodes to one run per record: each batch's runs
 * must name its values in element order, one record each. A small buffer
 * puts neighbours side by side often, so runs merged in the runs form
 * would be fewer than the records. Then without a shuffle: the runs form,
 * one run per batch. */
Test(iterator, shuffled_provenance_comes_dense_and_names_each_element)
{
    static const char *specs[] = {
        "{\"source\":{\"type\":\"range\",\"stop\":200000},\"ops\":[{\"op\":\"shuffle\",\"buffer_size\":4,"
        "\"seed\":4},{\"op\":\"batch\",\"batch_size\":1024}]}",
        "{\"source\":{\"type\":\"range\",\"stop\":200000},\"ops\":[{\"op\":\"batch\",\"batch_size\":1024}]}"};
    for (int k = 0; k < 2; k++) {
        struct reader r;
        cr_assert_eq(sl_client_open(C.addr, NULL, &r.c), 0);
        r.ds = register_spec(r.c, specs[k]);
        sl_iterator_opts_init(&r.o);
        r.o.sharding = SL_SHARDING_DYNAMIC;
        r.o.provenance = 1;
        cr_assert_eq(sl_iterator_open(r.c, r.ds, &r.o, &r.it), 0, "%s", sl_iterator_errmsg(r.it));
        memset(seen, 0, sizeof seen);
        int batches = 0, dense = 0, adjacent = 0;
        for (;; batches++) {
            sl_batch_t *b;
            int rc = sl_iterator_next(r.it, &b);
            if (rc == 1)
                break;
            cr_assert_eq(rc, 0, "%s", sl_iterator_errmsg(r.it));
            uint64_t n = sl_batch_num_elements(b);
            const int64_t *v = sl_batch_find(b, "value")->data;
            size_t nr;
            const sl_provenance_run_t *runs = sl_batch_provenance(b, &nr);
            cr_assert_not_null(runs, "batch %d came without provenance", batches);
            uint64_t j = 0;
            for (size_t i = 0; i < nr; i++) {
                cr_assert(runs[i].epoch == 0 && runs[i].file_index == 0);
                for (uint64_t x = 0; x < runs[i].count; x++, j++) {
                    cr_assert_lt(j, n, "batch %d: its runs name more records than its %lu elements", batches,
                                 (unsigned long)n);
                    cr_assert_eq((int64_t)(runs[i].begin + x), v[j], "batch %d element %lu: runs say %lu, value %ld",
                                 batches, (unsigned long)j, (unsigned long)(runs[i].begin + x), (long)v[j]);
                }
            }
            cr_assert_eq(j, n, "batch %d: runs name %lu of %lu elements", batches, (unsigned long)j,
                         (unsigned long)n);
            for (uint64_t i = 0; i < n; i++) {
                seen[v[i]]++;
                adjacent += i > 0 && v[i] == v[i - 1] + 1;
            }
            dense += nr == n && n > 1;
            sl_batch_release(b);
        }
        assert_each(seen, 1);
        if (k == 0) {
            cr_assert_gt(adjacent, batches, "the shuffle put too few neighbours side by side to tell the forms apart");
            cr_assert_geq(dense, batches - 2, "%d of %d shuffled batches came in the dense form", dense, batches);
        } else {
            cr_assert_eq(dense, 0, "%d of %d ordered batches came in the dense form", dense, batches);
        }
        reader_close(&r);
    }
}

Test(iterator, a_checkpoint_restores_to_exactly_the_rest)
{
    struct reader r;
    reader_open(&r, shuffled, SL_SHARDING_DYNAMIC);
    memset(seen, 0, sizeof seen);
    cr_assert_eq(read_batches(r.it, seen, 100), 100);
    uint8_t *ckpt;
    size_t len;
    cr_assert_eq(sl_iterator_checkpoint(r.it, &ckpt, &len), 0, "%s", sl_iterator_errmsg(r.it));
    sl_iterator_close(r.it);
    cr_assert_eq(sl_iterator_restore(r.c, r.ds, &r.o, ckpt, len, &r.it), 0, "%s", sl_iterator_errmsg(r.it));
    sl_free(ckpt);
    read_batches(r.it, seen, 0);
    assert_each(seen, 1);
    reader_close(&r);
}

/* A plain DYNAMIC read through shared memory (every batch but the first
 * few, read before the region was mapped): a batch without split-done
 * notices has a tail of a run and a tally row or two, which comes in the
 * answer (GetElementRequest.shm_tail_in_answer), its slot holding the
 * tensor bytes alone; every element comes once. */
Test(iterator, dynamic_batches_in_shared_memory_bring_small_tails_in_their_answer)
{
    struct reader r;
    reader_open(&r,
                "{\"source\":{\"type\":\"range\",\"stop\":200000},"
                "\"ops\":[{\"op\":\"batch\",\"batch_size\":512}]}",
                SL_SHARDING_DYNAMIC);
    memset(seen, 0, sizeof seen);
    cr_assert_eq(threads_named("sl-iterator"), 1, "the iterator's loop thread says what it is (top -H, py-spy)");
    int batches = 0, small = 0;
    for (;;) {
        sl_batch_t *b;
        int rc = sl_iterator_next(r.it, &b);
        if (rc == 1)
            break;
        cr_assert_eq(rc, 0, "%s", sl_iterator_errmsg(r.it));
        const struct sl_batch *sb = b;
        if (sb->shm && sb->num_done == 0) {
            cr_assert(sb->tail_in_answer, "batch %d: its provenance and tallies came in its slot", batches);
            small++;
        }
        const int64_t *v = sl_batch_find(b, "value")->data;
        for (uint64_t i = 0; i < sl_batch_num_elements(b); i++)
            seen[v[i]]++;
        sl_batch_release(b);
        batches++;
    }
    assert_each(seen, 1);
    cr_assert_gt(small, batches / 2, "%d of %d batches came through shared memory without notices", small, batches);
    reader_close(&r);
    cr_assert_eq(threads_settle_to("sl-iterator", 0), 0);
}

Test(iterator, off_gives_the_dataset_once_per_worker)
{
    struct reader r;
    reader_open(&r,
                "{\"source\":{\"type\":\"range\",\"stop\":200000},"
                "\"ops\":[{\"op\":\"batch\",\"batch_size\":1000}]}",
                SL_SHARDING_OFF);
    memset(seen, 0, sizeof seen);
    read_batches(r.it, seen, 0);
    assert_each(seen, 2);
    reader_close(&r);
}

Test(iterator, a_bad_spec_is_refused_naming_the_field)
{
    sl_client_t *c;
    cr_assert_eq(sl_client_open(C.addr, NULL, &c), 0);
    const char *spec = "{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[{\"op\":\"batch\",\"batch_size\":0}]}";
    uint64_t id;
    cr_assert_eq(sl_client_register_dataset(c, spec, strlen(spec), &id), SL_ESPEC);
    cr_assert(strstr(sl_client_errmsg(c), "$.ops[0].batch_size"), "%s", sl_client_errmsg(c));
    sl_client_close(c);
}

Test(iterator, a_negative_window_is_refused_by_name)
{
    /* 0 is the window sized by window_bytes (every other test here reads
     * with it); below 0 is refused, naming the option. */
    static const struct {
        int max_outstanding, per_worker_outstanding;
        const char *named;
    } cases[] = {
        {-1, 0, "max_outstanding -1 is out of range"},
        {0, -1, "per_worker_outstanding -1 is out of range"},
        {0, 17, "per_worker_outstanding 17 is out of range"},
    };
    sl_client_t *c;
    cr_assert_eq(sl_client_open(C.addr, NULL, &c), 0);
    uint64_t ds = register_spec(c, "{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[]}");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sl_iterator_opts_t o;
        sl_iterator_opts_init(&o);
        o.max_outstanding = cases[i].max_outstanding;
        o.per_worker_outstanding = cases[i].per_worker_outstanding;
        sl_iterator_t *it;
        cr_assert_eq(sl_iterator_open(c, ds, &o, &it), SL_EINVAL);
        cr_assert(strstr(sl_iterator_errmsg(it), cases[i].named), "%s", sl_iterator_errmsg(it));
        sl_iterator_close(it);
    }
    sl_client_close(c);
}

Test(iterator, a_builder_fed_deltas_gives_the_checkpoint_of_every_batch)
{
    /* 3 epochs of 120,000 records (a repeat) behind shuffle(10000), with
     * filters that leave holes in splits (their done notices fill them),
     * over two workers; the dispatcher's epochs_done folds come as they
     * come. At every batch, the delta and the checkpoint are taken at one
     * moment, and the builder's checkpoint must be the same bytes. */
    const char *spec =
        "{\"source\":{\"type\":\"range\",\"stop\":120000},\"ops\":["
        "{\"op\":\"filter\",\"key\":\"value\",\"cmp\":\"ne\",\"value\":7},"
        "{\"op\":\"filter\",\"key\":\"value\",\"cmp\":\"ne\",\"value\":40003},"
        "{\"op\":\"filter\",\"key\":\"value\",\"cmp\":\"ne\",\"value\":99999},"
        "{\"op\":\"shuffle\",\"buffer_size\":10000,\"seed\":3},{\"op\":\"repeat\",\"count\":3},"
        "{\"op\":\"batch\",\"batch_size\":256}]}";
    struct reader r;
    cr_assert_eq(sl_client_open(C.addr, NULL, &r.c), 0);
    r.ds = register_spec(r.c, spec);
    sl_iterator_opts_init(&r.o);
    r.o.sharding = SL_SHARDING_DYNAMIC;
    r.o.ledger_deltas = 1;
    cr_assert_eq(sl_iterator_open(r.c, r.ds, &r.o, &r.it), 0, "%s", sl_iterator_errmsg(r.it));
    sl_ckpt_builder_t *b;
    cr_assert_eq(sl_ckpt_builder_open(r.ds, NULL, 0, NULL, 0, &b), 0, "%s", sl_ckpt_builder_errmsg(b));
    uint64_t elements = 0, batches = 0;
    size_t most_delta = 0, most_ckpt = 0, delta_bytes = 0, ckpt_bytes = 0;
    uint8_t *d, *ck, *got;
    size_t dlen, cklen, glen;
    uint64_t most_done = 0;
    for (;;) {
        sl_batch_t *bt;
        int rc = sl_iterator_next(r.it, &bt);
        if (rc == 1)
            break;
        cr_assert_eq(rc, 0, "%s", sl_iterator_errmsg(r.it));
        elements += sl_batch_num_elements(bt);
        sl_batch_release(bt);
        batches++;
        cr_assert_eq(sl_iterator_delta(r.it, &d, &dlen, &ck, &cklen), 0, "%s", sl_iterator_errmsg(r.it));
        cr_assert_eq(sl_ckpt_builder_apply(b, d, dlen), 0, "%s", sl_ckpt_builder_errmsg(b));
        cr_assert_eq(sl_ckpt_builder_checkpoint(b, &got, &glen), 0, "%s", sl_ckpt_builder_errmsg(b));
        cr_assert(glen == cklen && memcmp(got, ck, cklen) == 0,
                  "batch %" PRIu64 ": the builder's checkpoint (%zu bytes) is not the iterator's (%zu bytes)", batches,
                  glen, cklen);
        most_done = sl_get_le64(ck + 24) > most_done ? sl_get_le64(ck + 24) : most_done;
        most_delta = dlen > most_delta ? dlen : most_delta;
        most_ckpt = cklen > most_ckpt ? cklen : most_ckpt;
        delta_bytes += dlen;
        ckpt_bytes += cklen;
        sl_free(d);
        sl_free(ck);
        sl_free(got);
    }
    cr_assert_eq(elements, 3 * (120000 - 3));
    /* The last delta (the end, with the last notices) too. */
    cr_assert_eq(sl_iterator_delta(r.it, &d, &dlen, &ck, &cklen), 0, "%s", sl_iterator_errmsg(r.it));
    cr_assert_eq(sl_ckpt_builder_apply(b, d, dlen), 0, "%s", sl_ckpt_builder_errmsg(b));
    cr_assert_eq(sl_ckpt_builder_checkpoint(b, &got, &glen), 0, "%s", sl_ckpt_builder_errmsg(b));
    cr_assert(glen == cklen && memcmp(got, ck, cklen) == 0, "after the end");
    sl_free(d);
    sl_free(ck);
    sl_free(got);
    /* A delta is the size of a batch's provenance (a few bytes an element
     * shuffled, at most 10 with its varints) and notices: nothing in it
     * grows with the run, where a checkpoint holds the shuffle's holes. */
    cr_assert_leq(most_delta, 16 + 18 + 10 * 256 + 1024, "a delta of %zu bytes", most_delta);
    cr_log_info("%" PRIu64 " batches: deltas %zu bytes in all (largest %zu), checkpoints %zu (largest %zu), "
                "epochs done %" PRIu64 " at most", batches, delta_bytes, most_delta, ckpt_bytes, most_ckpt, most_done);
    sl_ckpt_builder_close(b);
    sl_iterator_close(r.it);
    /* Only an iterator that takes checkpoints keeps deltas. */
    r.o.sharding = SL_SHARDING_OFF;
    cr_assert_eq(sl_iterator_open(r.c, r.ds, &r.o, &r.it), SL_EINVAL);
    cr_assert(strstr(sl_iterator_errmsg(r.it), "ledger_deltas: checkpoints need"), "%s", sl_iterator_errmsg(r.it));
    reader_close(&r);
}
