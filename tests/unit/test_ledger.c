/*
 * test_ledger.c: the client's record of what it handed its caller
 * (client/ledger.c): shuffled batches and split-done notices become the
 * positions a checkpoint holds and a report says; a checkpoint reads back as
 * the same set; a bound on runs turns into a named error, never a silent
 * loss; damaged checkpoints are refused by name.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "ledger.h"
#include "provwire.h"

/* Gives the ledger one batch of the given runs (its provenance on the wire). */
static void give(sl_ledger_t *l, const sl_provenance_run_t *runs, size_t n, const sl_split_done_t *done,
                 size_t ndone, bool last)
{
    uint64_t elements = 0;
    for (size_t i = 0; i < n; i++)
        elements += runs[i].count;
    uint8_t *wire = NULL;
    size_t len = 0;
    if (n > 0)
        cr_assert_eq(sl_provwire_encode(runs, n, &wire, &len), 0);
    sl__ledger_add(l, wire, len, elements, done, ndone, last);
    free(wire);
}

/* The positions a checkpoint of l holds, as a set. */
static void checkpoint_set(sl_ledger_t *l, sl_posset_t *out)
{
    uint8_t *ckpt = NULL, *posset = NULL;
    size_t len = 0, plen = 0;
    char err[300];
    cr_assert_eq(sl__ledger_checkpoint(l, 42, NULL, 0, &ckpt, &len, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl__checkpoint_read(ckpt, len, 42, NULL, 0, l->max_runs, &posset, &plen, err, sizeof err), 0, "%s",
                 err);
    sl_posset_init(out, l->max_runs);
    cr_assert_eq(sl_posset_decode(out, posset, plen, err, sizeof err), 0, "%s", err);
    free(ckpt);
    free(posset);
}

Test(ledger, a_shuffled_stream_checkpoints_as_exactly_what_was_given)
{
    /* 200,000 positions of one file given in a shuffled order, 1,000 a
     * batch, the last 20,000 held back (still in a shuffle buffer): the
     * checkpoint holds the 180,000 given and nothing else. */
    enum { N = 200000, HELD = 20000, BATCH = 1000 };
    uint64_t *order = malloc(N * sizeof *order);
    for (uint64_t i = 0; i < N; i++)
        order[i] = i;
    srand(7);
    for (uint64_t i = N - 1; i > 0; i--) {
        uint64_t j = (uint64_t)rand() % (i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    sl_ledger_t l;
    sl__ledger_init(&l, SL_POSSET_MAX_RUNS);
    sl_provenance_run_t runs[BATCH];
    for (uint64_t b = 0; b < (N - HELD) / BATCH; b++) {
        for (int k = 0; k < BATCH; k++)
            runs[k] = (sl_provenance_run_t){0, 3, order[b * BATCH + (uint64_t)k], 1};
        give(&l, runs, BATCH, NULL, 0, false);
    }
    sl_posset_t got;
    checkpoint_set(&l, &got);
    cr_assert_eq(sl_posset_size(&got), N - HELD);
    for (uint64_t i = N - HELD; i < N; i++)
        cr_assert_eq(sl_posset_count(&got, 0, 3, order[i], order[i] + 1), 0, "position %lu was not given",
                     (unsigned long)order[i]);
    cr_assert_gt(got.num, 1000, "the held positions leave holes: %zu runs", got.num);
    sl_posset_clear(&got);
    sl__ledger_free(&l);
    free(order);
}

Test(ledger, a_notice_fills_the_records_a_filter_dropped_only_when_all_delivered_were_given)
{
    sl_ledger_t l;
    sl__ledger_init(&l, 1000);
    /* Split [0, 10) of file 0: record 3 dropped, the other 9 given. */
    sl_provenance_run_t a[2] = {{0, 0, 0, 3}, {0, 0, 4, 6}};
    sl_split_done_t d = {.split_id = 1, .epoch = 0, .file_index = 0, .begin = 0, .end = 10, .delivered = 9};
    give(&l, a, 2, &d, 1, true);
    cr_assert_eq(sl_posset_count(&l.got, 0, 0, 0, 10), 10, "the dropped record fills the split");
    cr_assert_eq(l.got.num, 1);
    /* Split [10, 20): 9 delivered but only 8 given (one still on its way
     * to another consumer): the holes stay. */
    sl_provenance_run_t b[2] = {{0, 0, 10, 4}, {0, 0, 15, 4}};
    sl_split_done_t e = {.split_id = 2, .epoch = 0, .file_index = 0, .begin = 10, .end = 20, .delivered = 9};
    give(&l, b, 2, &e, 1, true);
    cr_assert_eq(sl_posset_count(&l.got, 0, 0, 10, 20), 8);
    sl__ledger_free(&l);
}

Test(ledger, a_report_says_the_epochs_from_its_first_and_what_was_restored)
{
    sl_ledger_t l;
    sl__ledger_init(&l, 1000);
    /* Restored from a checkpoint that held epoch 1's [0, 5). */
    sl_posset_t r;
    sl_posset_init(&r, 10);
    cr_assert_eq(sl_posset_add(&r, 1, 0, 0, 5, NULL), 0);
    uint8_t buf[256];
    size_t n = sl_posset_encode(&r, buf, sizeof buf);
    char err[200];
    cr_assert_eq(sl__ledger_restore(&l, buf, n, err, sizeof err), 0, "%s", err);
    sl_posset_clear(&r);
    sl_provenance_run_t runs[3] = {{0, 0, 100, 5}, {1, 0, 50, 5}, {2, 1, 0, 5}};
    give(&l, runs, 3, NULL, 0, false);
    sl_posset_t set;
    cr_assert_eq(sl__ledger_report(&l, 1, &set), 0);
    cr_assert_eq(sl_posset_size(&set), 15, "epochs 1 and 2 only: restored 5, given 10");
    cr_assert_eq(sl_posset_count(&set, 0, 0, 100, 105), 0);
    /* A waiting batch's provenance goes in too, its earlier epochs left out. */
    sl_provenance_run_t wait[2] = {{0, 0, 200, 2}, {2, 1, 5, 2}};
    uint8_t *wire;
    size_t len;
    cr_assert_eq(sl_provwire_encode(wait, 2, &wire, &len), 0);
    sl_provenance_run_t *scratch = NULL;
    size_t cap = 0;
    cr_assert_eq(sl__report_add_wire(&set, wire, len, 4, 1, &scratch, &cap), 0);
    cr_assert_eq(sl_posset_size(&set), 17);
    free(scratch);
    free(wire);
    sl_posset_clear(&set);
    sl__ledger_free(&l);
}

Test(ledger, past_its_bound_it_says_so_and_takes_no_checkpoint)
{
    sl_ledger_t l;
    sl__ledger_init(&l, 10);
    l.job_id = 9;
    /* 20 separate positions: 20 runs, over the bound of 10. */
    sl_provenance_run_t runs[20];
    for (int i = 0; i < 20; i++)
        runs[i] = (sl_provenance_run_t){0, 0, (uint64_t)i * 2, 1};
    give(&l, runs, 20, NULL, 0, true);
    cr_assert_eq(l.rc, SL_ETOOBIG);
    uint8_t *ckpt = NULL;
    size_t len = 0;
    char err[300] = "";
    cr_assert_eq(sl__ledger_checkpoint(&l, 1, NULL, 0, &ckpt, &len, err, sizeof err), SL_ETOOBIG);
    cr_assert_null(ckpt);
    cr_assert(strstr(err, "more than 10 runs") && strstr(err, "max_ledger_runs"), "%s", err);
    sl_posset_t set;
    cr_assert_lt(sl__ledger_report(&l, 0, &set), 0, "a report cannot say what it received: untracked");
    sl_posset_clear(&set);
    sl__ledger_free(&l);
}

Test(ledger, damaged_checkpoints_are_refused_by_name)
{
    sl_ledger_t l;
    sl__ledger_init(&l, 100);
    sl_provenance_run_t runs[1] = {{0, 0, 0, 10}};
    give(&l, runs, 1, NULL, 0, true);
    uint8_t *ckpt;
    size_t len;
    char err[300];
    cr_assert_eq(sl__ledger_checkpoint(&l, 5, NULL, 0, &ckpt, &len, err, sizeof err), 0, "%s", err);
    uint8_t *pos;
    size_t plen;
    struct {
        const char *what;
        size_t at;
        uint8_t byte;
        size_t len;
        uint64_t dataset;
        const char *says;
    } bad[] = {
        {"another dataset", 0, 'S', 0, 6, "checkpoint of dataset 5, restored over dataset 6"},
        {"not a checkpoint", 0, 'X', 0, 5, "not a Sluice iterator checkpoint"},
        {"a later version", 4, 4, 0, 5, "version 4"},
        {"cut short", 0, 'S', 20, 5, "checkpoint"},
        {"a position changed", 40, 0x7f, 0, 5, "damaged: its SHA-256 checksum does not match"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t *c = malloc(len);
        memcpy(c, ckpt, len);
        c[bad[i].at] = bad[i].byte;
        err[0] = '\0';
        int rc = sl__checkpoint_read(c, bad[i].len ? bad[i].len : len, bad[i].dataset, NULL, 0, 100, &pos, &plen,
                                     err, sizeof err);
        cr_assert_lt(rc, 0, "%s: accepted", bad[i].what);
        cr_assert(strstr(err, bad[i].says), "%s: \"%s\" does not say \"%s\"", bad[i].what, err, bad[i].says);
        cr_assert_null(pos);
        free(c);
    }
    free(ckpt);
    sl__ledger_free(&l);
}

/* A large checkpoint of a shuffled stream (thousands of runs), for the
 * integrity tests below. */
static void shuffled_checkpoint(const uint8_t *key, size_t key_len, uint8_t **ckpt, size_t *len)
{
    sl_ledger_t l;
    sl__ledger_init(&l, 1u << 16);
    enum { N = 3000 };
    static sl_provenance_run_t runs[N];
    for (int i = 0; i < N; i++)
        runs[i] = (sl_provenance_run_t){0, (uint32_t)(i % 7), (uint64_t)i * 3, 1 + (uint64_t)(i % 2)};
    give(&l, runs, N, NULL, 0, true);
    char err[300];
    cr_assert_eq(sl__ledger_checkpoint(&l, 9, key, key_len, ckpt, len, err, sizeof err), 0, "%s", err);
    sl__ledger_free(&l);
}

/* Attack 16: a bit flipped anywhere is refused before anything is used.
 * Every bit of the first and last 512 bytes, and every 13th bit between. */
Test(ledger, every_flipped_bit_is_refused)
{
    static const uint8_t key[] = "0123456789abcdef-cluster-token";
    for (int keyed = 0; keyed < 2; keyed++) {
        uint8_t *ckpt;
        size_t len;
        shuffled_checkpoint(keyed ? key : NULL, keyed ? sizeof key - 1 : 0, &ckpt, &len);
        cr_assert_gt(len, 4096, "a checkpoint of many runs");
        uint8_t *c = malloc(len);
        size_t tried = 0;
        for (size_t bit = 0; bit < len * 8; bit++) {
            size_t byte = bit / 8;
            if (byte >= 512 && byte < len - 512 && bit % 13 != 0)
                continue;
            memcpy(c, ckpt, len);
            c[byte] ^= (uint8_t)(1u << (bit % 8));
            uint8_t *pos = NULL;
            size_t plen;
            char err[300] = "";
            int rc = sl__checkpoint_read(c, len, 9, keyed ? key : NULL, keyed ? sizeof key - 1 : 0, 1u << 16, &pos,
                                         &plen, err, sizeof err);
            cr_assert_lt(rc, 0, "bit %zu of %zu flipped (%s): accepted", bit, len * 8, keyed ? "MAC" : "checksum");
            cr_assert_null(pos);
            tried++;
        }
        uint8_t *pos = NULL;
        size_t plen;
        char err[300] = "";
        cr_assert_eq(sl__checkpoint_read(ckpt, len, 9, keyed ? key : NULL, keyed ? sizeof key - 1 : 0, 1u << 16, &pos,
                                         &plen, err, sizeof err),
                     0, "the checkpoint itself: %s", err);
        free(pos);
        cr_assert_gt(tried, 8000);
        free(c);
        free(ckpt);
    }
}

Test(ledger, a_mac_needs_the_same_token)
{
    static const uint8_t a[] = "token-a-0123456789", b[] = "token-b-0123456789";
    uint8_t *ckpt, *pos = NULL;
    size_t len, plen;
    char err[300];
    shuffled_checkpoint(a, sizeof a - 1, &ckpt, &len);
    cr_assert_eq(sl__checkpoint_read(ckpt, len, 9, b, sizeof b - 1, 1u << 16, &pos, &plen, err, sizeof err), SL_EDATA);
    cr_assert(strstr(err, "another cluster token"), "%s", err);
    cr_assert_eq(sl__checkpoint_read(ckpt, len, 9, NULL, 0, 1u << 16, &pos, &plen, err, sizeof err), SL_EDATA);
    cr_assert(strstr(err, "made with a cluster token"), "%s", err);
    free(ckpt);
    /* A checkpoint without a MAC could be forged by anyone: a client with a
     * token refuses it. */
    shuffled_checkpoint(NULL, 0, &ckpt, &len);
    cr_assert_eq(sl__checkpoint_read(ckpt, len, 9, a, sizeof a - 1, 1u << 16, &pos, &plen, err, sizeof err), SL_EDATA);
    cr_assert(strstr(err, "made without a cluster token"), "%s", err);
    cr_assert_null(pos);
    free(ckpt);
}
