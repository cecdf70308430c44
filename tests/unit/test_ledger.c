/*
 * test_ledger.c: the client's record of what it handed its caller
 * (client/ledger.c): shuffled batches and split-done notices become the
 * positions a checkpoint holds and a report says; a checkpoint reads back as
 * the same set; a bound on runs turns into a named error, never a silent
 * loss; damaged checkpoints are refused by name.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <openssl/sha.h>
#include <string.h>
#include <time.h>

#include "delta.h"
#include "le.h"
#include "ledger.h"
#include "provwire.h"
#include "received.h"
#include "seed_util.h"
#include "sluice.h"

/* What the last sl__checkpoint_read() said of done epochs. */
static uint64_t epochs_done;

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

/* A report of l from `from` as its bytes say it (sl_posbits_bytes()), as runs. */
static int report_runs(sl_ledger_t *l, uint64_t from, sl_posset_t *out)
{
    sl_posbits_t set;
    int rc = sl__ledger_report(l, from, &set);
    uint8_t *buf = NULL;
    size_t len = 0;
    char err[256];
    sl_posset_init(out, SL_POSSET_MAX_RUNS);
    if (rc == 0)
        rc = sl_posbits_bytes(&set, &buf, &len);
    if (rc == 0)
        cr_assert_eq(sl_posset_decode(out, buf, len, err, sizeof err), 0, "%s", err);
    free(buf);
    sl_posbits_clear(&set);
    return rc;
}

/* The positions a checkpoint of l holds, as a set. */
static void checkpoint_set(sl_ledger_t *l, sl_posset_t *out)
{
    uint8_t *ckpt = NULL, *posset = NULL;
    size_t len = 0, plen = 0;
    char err[300];
    cr_assert_eq(sl__ledger_checkpoint(l, 42, NULL, 0, &ckpt, &len, err, sizeof err), 0, "%s", err);
    cr_assert_eq(
        sl__checkpoint_read(ckpt, len, 42, NULL, 0, l->max_runs, &posset, &plen, &epochs_done, NULL, err, sizeof err),
        0, "%s", err);
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
    shuffled_order(order, N, 7);
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
    cr_assert_eq(sl_posbits_count(&l.got, 0, 0, 0, 10), 10, "the dropped record fills the split");
    cr_assert_eq(l.got.runs.num, 1);
    /* Split [10, 20): 9 delivered but only 8 given (one still on its way
     * to another consumer): the holes stay. */
    sl_provenance_run_t b[2] = {{0, 0, 10, 4}, {0, 0, 15, 4}};
    sl_split_done_t e = {.split_id = 2, .epoch = 0, .file_index = 0, .begin = 10, .end = 20, .delivered = 9};
    give(&l, b, 2, &e, 1, true);
    cr_assert_eq(sl_posbits_count(&l.got, 0, 0, 10, 20), 8);
    cr_assert_eq(l.missing, 0, "the other consumer's record is not missing");
    sl__ledger_free(&l);
}

Test(ledger, a_split_the_sole_client_got_less_of_than_delivered_counts_as_missing)
{
    sl_ledger_t l;
    sl__ledger_init(&l, 1000);
    l.sole = true;
    /* Split [0, 10): all 10 delivered and given. */
    sl_provenance_run_t a = {0, 0, 0, 10};
    sl_split_done_t d = {.split_id = 1, .epoch = 0, .file_index = 0, .begin = 0, .end = 10, .delivered = 10};
    give(&l, &a, 1, &d, 1, false);
    /* Split [10, 30): 20 delivered, a batch of 7 lost on the way; split
     * [30, 40) of a worker lost before, handed out again without the 4
     * records given then: 6 delivered, 10 given, nothing missing. */
    sl_provenance_run_t b[3] = {{0, 0, 10, 5}, {0, 0, 22, 8}, {0, 0, 30, 4}};
    give(&l, b, 3, NULL, 0, false);
    sl_provenance_run_t c = {0, 0, 34, 6};
    sl_split_done_t e[2] = {{.split_id = 2, .epoch = 0, .file_index = 0, .begin = 10, .end = 30, .delivered = 20},
                            {.split_id = 3, .epoch = 0, .file_index = 0, .begin = 30, .end = 40, .delivered = 6}};
    give(&l, &c, 1, e, 2, true);
    cr_assert_eq(l.missing, 7);
    cr_assert_eq(sl_posbits_count(&l.got, 0, 0, 0, 40), 33, "the lost records are not in what was given");
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
    cr_assert_eq(sl__ledger_restore(&l, buf, n, (sl_posrun_t){0}, err, sizeof err), 0, "%s", err);
    sl_posset_clear(&r);
    sl_provenance_run_t runs[3] = {{0, 0, 100, 5}, {1, 0, 50, 5}, {2, 1, 0, 5}};
    give(&l, runs, 3, NULL, 0, false);
    sl_posbits_t set;
    cr_assert_eq(sl__ledger_report(&l, 1, &set), 0);
    cr_assert_eq(sl_posbits_size(&set), 15, "epochs 1 and 2 only: restored 5, given 10");
    cr_assert_eq(sl_posbits_count(&set, 0, 0, 100, 105), 0);
    /* A waiting batch's provenance goes in too, its earlier epochs left out. */
    sl_provenance_run_t wait[2] = {{0, 0, 200, 2}, {2, 1, 5, 2}};
    uint8_t *wire;
    size_t len;
    cr_assert_eq(sl_provwire_encode(wait, 2, &wire, &len), 0);
    sl_provenance_run_t *scratch = NULL;
    size_t cap = 0;
    cr_assert_eq(sl__report_add_wire(&set, wire, len, 4, 1, &scratch, &cap), 0);
    cr_assert_eq(sl_posbits_size(&set), 17);
    free(scratch);
    free(wire);
    sl_posbits_clear(&set);
    sl__ledger_free(&l);
}

Test(ledger, over_half_its_bound_it_says_so_once_and_still_checkpoints)
{
    sl_ledger_t l;
    sl__ledger_init(&l, 10);
    sl_provenance_run_t runs[8];
    for (int i = 0; i < 8; i++)
        runs[i] = (sl_provenance_run_t){0, 0, (uint64_t)i * 2, 1};
    give(&l, runs, 5, NULL, 0, true);
    cr_assert_not(l.half_said, "5 runs of 10 are not over half");
    give(&l, runs + 5, 1, NULL, 0, true);
    cr_assert(l.half_said, "6 runs of 10 are");
    give(&l, runs + 6, 2, NULL, 0, true);
    cr_assert_eq(l.rc, 0, "8 runs still fit");
    uint8_t *ckpt = NULL;
    size_t len = 0;
    char err[300] = "";
    cr_assert_eq(sl__ledger_checkpoint(&l, 1, NULL, 0, &ckpt, &len, err, sizeof err), 0, "%s", err);
    free(ckpt);
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
    /* Why, by who keeps the ledger: an anonymous job's iterator (or a
     * builder), or a rank of a named job. */
    cr_assert(strstr(err, "a shuffle buffer leaves about half its size in holes") && !strstr(err, "fold"), "%s", err);
    l.named = true;
    cr_assert_eq(sl__ledger_checkpoint(&l, 1, NULL, 0, &ckpt, &len, err, sizeof err), SL_ETOOBIG);
    cr_assert(strstr(err, "past the job's fold") && strstr(err, "more ranks, fewer workers"), "%s", err);
    sl_posbits_t set;
    cr_assert_lt(sl__ledger_report(&l, 0, &set), 0, "a report cannot say what it received: untracked");
    sl_posbits_clear(&set);
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
        {"a later version", 4, 7, 0, 5, "version 7"},
        {"cut short", 0, 'S', 20, 5, "checkpoint"},
        {"a position changed", 40, 0x7f, 0, 5, "damaged: its SHA-256 checksum does not match"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t *c = malloc(len);
        memcpy(c, ckpt, len);
        c[bad[i].at] = bad[i].byte;
        err[0] = '\0';
        int rc = sl__checkpoint_read(c, bad[i].len ? bad[i].len : len, bad[i].dataset, NULL, 0, 100, &pos, &plen,
                                     &epochs_done, NULL, err, sizeof err);
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
                                         &plen, &epochs_done, NULL, err, sizeof err);
            cr_assert_lt(rc, 0, "bit %zu of %zu flipped (%s): accepted", bit, len * 8, keyed ? "MAC" : "checksum");
            cr_assert_null(pos);
            tried++;
        }
        uint8_t *pos = NULL;
        size_t plen;
        char err[300] = "";
        cr_assert_eq(sl__checkpoint_read(ckpt, len, 9, keyed ? key : NULL, keyed ? sizeof key - 1 : 0, 1u << 16, &pos,
                                         &plen, &epochs_done, NULL, err, sizeof err),
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
    cr_assert_eq(
        sl__checkpoint_read(ckpt, len, 9, b, sizeof b - 1, 1u << 16, &pos, &plen, &epochs_done, NULL, err, sizeof err),
        SL_EDATA);
    cr_assert(strstr(err, "another cluster token"), "%s", err);
    cr_assert_eq(sl__checkpoint_read(ckpt, len, 9, NULL, 0, 1u << 16, &pos, &plen, &epochs_done, NULL, err, sizeof err),
                 SL_EDATA);
    cr_assert(strstr(err, "made with a cluster token"), "%s", err);
    free(ckpt);
    /* A checkpoint without a MAC could be forged by anyone: a client with a
     * token refuses it. */
    shuffled_checkpoint(NULL, 0, &ckpt, &len);
    cr_assert_eq(
        sl__checkpoint_read(ckpt, len, 9, a, sizeof a - 1, 1u << 16, &pos, &plen, &epochs_done, NULL, err, sizeof err),
        SL_EDATA);
    cr_assert(strstr(err, "made without a cluster token"), "%s", err);
    cr_assert_null(pos);
    free(ckpt);
}

/* A long run at a user's size: EPOCHS epochs over F files of R records,
 * one split per file, records mixed within a window (a shuffle buffer),
 * BATCH a batch, each split's done notice once all of it was given. */
enum { F = 400, R = 8, EPOCHS = 300, BATCH = 32, WINDOW = 64, PER_EPOCH = F * R };

struct longrun {
    sl_ledger_t l;
    uint8_t *given; /* one byte a position: was it given */
    uint32_t *left; /* records of each (epoch, file) not given yet */
    uint64_t next;  /* the next position of the stream in order */
    uint64_t total; /* positions given */
    uint32_t epoch; /* of the last batch */
};

static uint64_t pos_of(uint32_t epoch, uint32_t file, uint64_t rec)
{
    return (uint64_t)epoch * PER_EPOCH + (uint64_t)file * R + rec;
}

/* Gives the next batch: BATCH positions drawn from the window ahead of the
 * stream's front; fold_lag >= 0: at each epoch's first batch the
 * dispatcher says every epoch below (epoch - fold_lag) is done, with 3
 * batches waiting for the caller. */
static void longrun_batch(struct longrun *lr, int fold_lag)
{
    sl_provenance_run_t runs[BATCH];
    sl_split_done_t done[BATCH];
    size_t n = 0, nd = 0;
    uint64_t end = (uint64_t)EPOCHS * PER_EPOCH;
    while (n < BATCH && lr->total < end) {
        /* The front moves past given positions; a position of the window
         * (the same epoch as the front) is picked at random. */
        while (lr->next < end && lr->given[lr->next])
            lr->next++;
        uint64_t epoch_end = (lr->next / PER_EPOCH + 1) * PER_EPOCH;
        uint64_t span = epoch_end - lr->next < WINDOW ? epoch_end - lr->next : WINDOW;
        uint64_t p = lr->next + (uint64_t)rand() % span;
        while (lr->given[p])
            p = p + 1 < epoch_end ? p + 1 : lr->next;
        lr->given[p] = 1;
        lr->total++;
        uint32_t e = (uint32_t)(p / PER_EPOCH), f = (uint32_t)(p % PER_EPOCH / R);
        runs[n++] = (sl_provenance_run_t){e, f, p % R, 1};
        if (--lr->left[(uint64_t)e * F + f] == 0)
            done[nd++] = (sl_split_done_t){.split_id = (uint64_t)e * F + f, .epoch = e, .file_index = f, .begin = 0,
                                           .end = R, .delivered = R};
    }
    uint32_t epoch = runs[n - 1].epoch;
    if (fold_lag >= 0 && epoch > lr->epoch && epoch >= (uint32_t)fold_lag)
        sl__ledger_epochs_done(&lr->l, epoch - (uint32_t)fold_lag, 3);
    lr->epoch = epoch;
    give(&lr->l, runs, n, done, nd, lr->total == end);
}

static void longrun_init(struct longrun *lr, size_t max_runs)
{
    memset(lr, 0, sizeof *lr);
    sl__ledger_init(&lr->l, max_runs);
    lr->given = calloc((size_t)EPOCHS * PER_EPOCH, 1);
    lr->left = malloc((size_t)EPOCHS * F * sizeof *lr->left);
    for (size_t i = 0; i < (size_t)EPOCHS * F; i++)
        lr->left[i] = R;
}

static void longrun_free(struct longrun *lr)
{
    sl__ledger_free(&lr->l);
    free(lr->given);
    free(lr->left);
}

/* A checkpoint of lr says exactly what was given: every epoch below its
 * done epochs whole, and of later ones the given positions and no other.
 * @return the checkpoint's size */
static size_t longrun_check(struct longrun *lr, uint8_t **ckpt_out)
{
    uint8_t *ckpt = NULL, *posset = NULL;
    size_t len = 0, plen = 0;
    char err[300];
    cr_assert_eq(sl__ledger_checkpoint(&lr->l, 42, NULL, 0, &ckpt, &len, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl__checkpoint_read(ckpt, len, 42, NULL, 0, lr->l.max_runs, &posset, &plen, &epochs_done, NULL, err,
                                     sizeof err), 0, "%s", err);
    sl_posset_t set;
    sl_posset_init(&set, lr->l.max_runs);
    cr_assert_eq(sl_posset_decode(&set, posset, plen, err, sizeof err), 0, "%s", err);
    for (uint64_t p = 0; p < epochs_done * PER_EPOCH; p++)
        cr_assert(lr->given[p], "position %" PRIu64 " of a done epoch was not given", p);
    uint64_t later = 0;
    for (uint64_t p = epochs_done * PER_EPOCH; p < (uint64_t)EPOCHS * PER_EPOCH; p++)
        later += lr->given[p];
    cr_assert_eq(sl_posset_size(&set), later, "the checkpoint holds %" PRIu64 " positions past epoch %" PRIu64
                 ", %" PRIu64 " were given", sl_posset_size(&set), epochs_done, later);
    for (size_t i = 0; i < set.num; i++) {
        cr_assert_geq(set.runs[i].epoch, epochs_done);
        for (uint64_t k = 0; k < set.runs[i].count; k++)
            cr_assert(lr->given[pos_of(set.runs[i].epoch, set.runs[i].file, set.runs[i].begin + k)]);
    }
    /* A report says the same of the open epochs, also when asked from 0. */
    sl_posset_t rep;
    cr_assert_eq(report_runs(&lr->l, 0, &rep), 0);
    cr_assert_eq(sl_posset_size(&rep), later);
    sl_posset_clear(&rep);
    sl_posset_clear(&set);
    free(posset);
    if (ckpt_out)
        *ckpt_out = ckpt;
    else
        free(ckpt);
    return len;
}

Test(ledger, three_hundred_epochs_over_four_hundred_files_stay_the_size_of_the_open_epochs)
{
    /* 960,000 positions, 120,000 (epoch, file) runs in all: past the 65,536
     * runs a ledger of that bound holds. The dispatcher says epochs are
     * done one epoch late; the ledger must stay within about two epochs of
     * runs, and every checkpoint must say exactly what was given. */
    srand(17);
    struct longrun lr;
    longrun_init(&lr, 1u << 16);
    size_t most_runs = 0, most_bytes = 0;
    uint64_t batches = 0;
    while (lr.total < (uint64_t)EPOCHS * PER_EPOCH) {
        longrun_batch(&lr, 1);
        cr_assert_eq(lr.l.rc, 0, "the ledger overflowed after %" PRIu64 " positions", lr.total);
        sl__ledger_sync(&lr.l);
        size_t runs = sl__ledger_runs(&lr.l);
        most_runs = runs > most_runs ? runs : most_runs;
        cr_assert_leq(runs, 3 * F + WINDOW, "%zu runs after %" PRIu64 " positions (epoch %" PRIu64 ")", runs,
                      lr.total, lr.total / PER_EPOCH);
        if (++batches % 397 == 0) {
            size_t bytes = longrun_check(&lr, NULL);
            most_bytes = bytes > most_bytes ? bytes : most_bytes;
            /* About 3 bytes a run; the header, done epochs and tag 72. */
            cr_assert_leq(bytes, 72 + 6 * (3 * F + WINDOW), "a checkpoint of %zu bytes at epoch %" PRIu64, bytes,
                          lr.total / PER_EPOCH);
        }
    }
    /* At the end the dispatcher says all are done. */
    sl__ledger_epochs_done(&lr.l, EPOCHS, 0);
    cr_assert_eq(sl__ledger_runs(&lr.l), 0);
    longrun_check(&lr, NULL);
    cr_assert_eq(epochs_done, EPOCHS);
    cr_log_info("most runs %zu, largest checkpoint %zu bytes", most_runs, most_bytes);
    longrun_free(&lr);
}

Test(ledger, without_done_epochs_the_same_run_overflows)
{
    /* The bound above is what keeps the ledger small: without it the same
     * stream needs one run per (epoch, file) and overflows. */
    srand(17);
    struct longrun lr;
    longrun_init(&lr, 1u << 16);
    while (lr.total < (uint64_t)EPOCHS * PER_EPOCH && lr.l.rc == 0)
        longrun_batch(&lr, -1);
    cr_assert_lt(lr.l.rc, 0, "120,000 runs fit 65,536");
    longrun_free(&lr);
}

Test(ledger, a_restore_mid_run_carries_the_done_epochs_and_checkpoints_chain)
{
    /* Stop at epoch 150 and a bit, restore into a new ledger, go on to the
     * end: the restored ledger's checkpoint is the first one's, its size
     * stays flat, and every checkpoint on the way is exact. */
    srand(23);
    struct longrun lr;
    longrun_init(&lr, 1u << 16);
    while (lr.total < 150 * (uint64_t)PER_EPOCH + 1000)
        longrun_batch(&lr, 0);
    uint8_t *ckpt = NULL;
    size_t len = longrun_check(&lr, &ckpt);
    cr_assert_geq(epochs_done, 149);
    uint8_t *posset = NULL;
    size_t plen = 0;
    char err[300];
    cr_assert_eq(
        sl__checkpoint_read(ckpt, len, 42, NULL, 0, 1u << 16, &posset, &plen, &epochs_done, NULL, err, sizeof err), 0,
        "%s", err);
    sl_ledger_t again;
    sl__ledger_init(&again, 1u << 16);
    cr_assert_eq(
        sl__ledger_restore(&again, posset, plen, (sl_posrun_t){.epoch = (uint32_t)epochs_done}, err, sizeof err), 0,
        "%s", err);
    uint8_t *ckpt2 = NULL;
    size_t len2 = 0;
    cr_assert_eq(sl__ledger_checkpoint(&again, 42, NULL, 0, &ckpt2, &len2, err, sizeof err), 0, "%s", err);
    cr_assert_eq(len2, len);
    cr_assert_eq(memcmp(ckpt2, ckpt, len), 0, "a restored ledger checkpoints as the one it came from");
    free(ckpt2);
    free(ckpt);
    free(posset);
    /* The rest of the run goes to the restored ledger. */
    sl__ledger_free(&lr.l);
    lr.l = again;
    while (lr.total < (uint64_t)EPOCHS * PER_EPOCH) {
        longrun_batch(&lr, 0);
        sl__ledger_sync(&lr.l);
        cr_assert_leq(sl__ledger_runs(&lr.l), 3 * F + WINDOW);
    }
    longrun_check(&lr, NULL);
    longrun_free(&lr);
}

Test(ledger, a_fold_waits_for_the_batches_that_waited_and_later_runs_of_done_epochs_are_dropped)
{
    sl_ledger_t l;
    sl__ledger_init(&l, 1000);
    sl_provenance_run_t e0[1] = {{0, 0, 0, 10}}, e0b[1] = {{0, 1, 0, 10}}, e1[1] = {{1, 0, 0, 10}};
    give(&l, e0, 1, NULL, 0, false);
    /* Epoch 0 done, with two batches waiting for the caller: not yet. */
    sl__ledger_epochs_done(&l, 1, 2);
    give(&l, e0b, 1, NULL, 0, false);
    sl__ledger_sync(&l);
    cr_assert_eq(sl__ledger_runs(&l), 2, "epoch 0 is kept until the caller has what waited");
    cr_assert_eq(l.epochs_done, 0);
    give(&l, e1, 1, NULL, 0, false);
    sl__ledger_sync(&l);
    cr_assert_eq(l.epochs_done, 1);
    cr_assert_eq(sl__ledger_runs(&l), 1, "only epoch 1's run is left");
    /* A stray run or notice of a done epoch does not grow it again. */
    sl_split_done_t d = {.split_id = 1, .epoch = 0, .file_index = 3, .begin = 0, .end = 5, .delivered = 0};
    give(&l, (sl_provenance_run_t[]){{0, 2, 0, 4}}, 1, &d, 1, true);
    cr_assert_eq(sl__ledger_runs(&l), 1);
    /* A report asked from epoch 0 says epoch 1's positions. */
    sl_posset_t set;
    cr_assert_eq(report_runs(&l, 0, &set), 0);
    cr_assert_eq(set.num, 1);
    cr_assert_eq(set.runs[0].epoch, 1);
    sl_posset_clear(&set);
    sl__ledger_free(&l);
}

Test(ledger, a_fold_made_at_once_goes_past_one_that_waits_and_ends_it_when_it_covers_it)
{
    /* A heartbeat's fold waits for two batches the caller has not taken;
     * a checkpoint's fold (the caller has every record of epoch 0: waiting
     * 0) is made at once all the same. One that reaches the waiting fold's
     * epochs ends it: the caller taking the batches then changes nothing. */
    sl_ledger_t l;
    sl__ledger_init(&l, 1000);
    for (uint32_t e = 0; e < 4; e++)
        give(&l, (sl_provenance_run_t[]){{e, 0, 0, 10}}, 1, NULL, 0, false);
    sl__ledger_epochs_done(&l, 2, 2);
    cr_assert_eq(l.fold_below, 2);
    sl__ledger_epochs_done(&l, 1, 0);
    sl__ledger_sync(&l);
    cr_assert_eq(l.epochs_done, 1, "a fold of waiting 0 is made while another waits");
    cr_assert_eq(sl__ledger_runs(&l), 3);
    cr_assert_eq(l.fold_below, 2, "the waiting fold, past it, still waits");
    sl__ledger_epochs_done(&l, 3, 0);
    sl__ledger_sync(&l);
    cr_assert_eq(l.epochs_done, 3);
    cr_assert_eq(l.fold_below, 0, "a fold at once past the waiting one ends it");
    cr_assert_eq(sl__ledger_runs(&l), 1);
    /* A later heartbeat's fold may wait again. */
    sl__ledger_epochs_done(&l, 4, 1);
    cr_assert_eq(l.fold_below, 4);
    give(&l, (sl_provenance_run_t[]){{4, 0, 0, 10}}, 1, NULL, 0, false);
    sl__ledger_sync(&l);
    cr_assert_eq(l.epochs_done, 4);
    sl__ledger_free(&l);
}

Test(ledger, version_3_checkpoints_still_restore)
{
    /* A version 3 checkpoint (no done epochs) made from a version 4 one of
     * no done epochs, its SHA-256 tag written again: it reads as the same
     * positions with no done epochs. */
    sl_ledger_t l;
    sl__ledger_init(&l, 100);
    give(&l, (sl_provenance_run_t[]){{2, 1, 5, 10}}, 1, NULL, 0, true);
    uint8_t *v4 = NULL;
    size_t len = 0;
    char err[300];
    cr_assert_eq(sl__ledger_checkpoint(&l, 5, NULL, 0, &v4, &len, err, sizeof err), 0, "%s", err);
    cr_assert_eq(v4[4], 4, "checkpoints are written in version 4");
    size_t len3 = len - 8;
    uint8_t *v3 = malloc(len3);
    memcpy(v3, v4, 24);
    memcpy(v3 + 24, v4 + 32, len - 32 - 32);
    v3[4] = 3;
    SHA256(v3, len3 - 32, v3 + len3 - 32);
    uint8_t *pos = NULL;
    size_t plen = 0;
    epochs_done = 99;
    cr_assert_eq(sl__checkpoint_read(v3, len3, 5, NULL, 0, 100, &pos, &plen, &epochs_done, NULL, err, sizeof err), 0,
                 "%s", err);
    cr_assert_eq(epochs_done, 0);
    sl_posset_t set;
    sl_posset_init(&set, 100);
    cr_assert_eq(sl_posset_decode(&set, pos, plen, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_posset_count(&set, 2, 1, 0, 100), 10);
    cr_assert_eq(sl_posset_size(&set), 10);
    sl_posset_clear(&set);
    /* Done epochs past 2^32 are refused by name (the tag written again). */
    v4[24 + 4] = 1;
    SHA256(v4, len - 32, v4 + len - 32);
    free(pos);
    pos = NULL;
    cr_assert_eq(sl__checkpoint_read(v4, len, 5, NULL, 0, 100, &pos, &plen, &epochs_done, NULL, err, sizeof err),
                 SL_EDATA);
    cr_assert(strstr(err, "past 2^32 epochs"), "%s", err);
    cr_assert_null(pos);
    free(v3);
    free(v4);
    sl__ledger_free(&l);
}

/* Deltas (delta.h): a stream at a user's size, 25 epochs of 50 files of
 * 100 records (125,000 positions), mixed within a window of 500 (a
 * shuffle), every seventh record dropped by a "filter" (so done notices
 * fill holes), the dispatcher saying epochs are done one epoch late with
 * batches waiting, and now and then with none waiting between batches. */
enum { DF = 50, DR = 100, DE = 25, DB = 64, DW = 500, DPER = DF * DR };

struct dstream {
    uint8_t *read;  /* one byte a position: read (given or dropped) */
    uint32_t *left; /* records of each (epoch, file) not read yet */
    uint32_t *sent; /* records of each (epoch, file) given */
    uint64_t next, total;
    uint32_t epoch;
    /* With others: of every fifth file, the records at positions 5 mod 11
     * go to another consumer (its notice counts them, this ledger never
     * sees them: the file is never given whole here). */
    bool others;
};

/* The batch's tallies: its records counted by split (a file is a split). */
static size_t tallies_of(const sl_provenance_run_t *runs, size_t n, sl_split_done_t *out)
{
    size_t nt = 0;
    for (size_t i = 0; i < n; i++) {
        size_t j = 0;
        while (j < nt && !(out[j].epoch == runs[i].epoch && out[j].file_index == runs[i].file_index))
            j++;
        if (j == nt)
            out[nt++] = (sl_split_done_t){.epoch = runs[i].epoch, .file_index = runs[i].file_index, .begin = 0,
                                          .end = DR, .delivered = 0};
        out[j].delivered += runs[i].count;
    }
    return nt;
}

/* The next batch's calls, made on l, recorded in log (if not NULL) and,
 * with the batch's tallies, made on lazy (if not NULL): @return false at
 * the end */
static bool dstream_batch(struct dstream *s, sl_ledger_t *l, sl_delta_log_t *log, sl_ledger_t *lazy)
{
    uint64_t end = (uint64_t)DE * DPER;
    if (s->total == end)
        return false;
    sl_provenance_run_t runs[DB];
    sl_split_done_t done[DB];
    size_t n = 0, nd = 0;
    /* Now and then a batch of one record (a worker's last, short batch):
     * a batch of one run carries no tallies, as on the wire. */
    size_t most = rand() % 40 == 0 ? 1 : DB;
    while (n < most && s->total < end) {
        while (s->next < end && s->read[s->next])
            s->next++;
        uint64_t epoch_end = (s->next / DPER + 1) * DPER;
        uint64_t span = epoch_end - s->next < DW ? epoch_end - s->next : DW;
        uint64_t p = s->next + (uint64_t)rand() % span;
        while (s->read[p])
            p = p + 1 < epoch_end ? p + 1 : s->next;
        s->read[p] = 1;
        s->total++;
        uint32_t e = (uint32_t)(p / DPER), f = (uint32_t)(p % DPER / DR);
        uint64_t k = (uint64_t)e * DF + f;
        if (p % 7 != 3) {
            if (!(s->others && f % 5 == 0 && p % 11 == 5))
                runs[n++] = (sl_provenance_run_t){e, f, p % DR, 1};
            s->sent[k]++;
        }
        if (--s->left[k] == 0)
            done[nd++] = (sl_split_done_t){.split_id = k, .epoch = e, .file_index = f, .begin = 0, .end = DR,
                                           .delivered = s->sent[k]};
    }
    uint32_t epoch = n > 0 ? runs[n - 1].epoch : s->epoch;
    if (epoch > s->epoch && epoch >= 1) {
        sl__ledger_epochs_done(l, epoch - 1, 3);
        if (log)
            sl__delta_log_epochs_done(log, epoch - 1, 3);
        if (lazy)
            sl__ledger_epochs_done(lazy, epoch - 1, 3);
    }
    s->epoch = epoch;
    uint8_t *wire = NULL;
    size_t len = 0, elements = n;
    if (n > 0)
        cr_assert_eq(sl_provwire_encode(runs, n, &wire, &len), 0);
    bool last = s->total == end;
    sl__ledger_add(l, wire, len, elements, done, nd, last);
    if (log)
        sl__delta_log_batch(log, wire, len, elements, done, nd, last);
    if (lazy && n == 1) {
        sl__ledger_add_run(lazy, &runs[0], done, nd, last);
    } else if (lazy) {
        sl_split_done_t tally[DB];
        sl__ledger_add_tallied(lazy, wire, len, elements, tally, tallies_of(runs, n, tally), done, nd, last);
    }
    free(wire);
    /* Now and then the dispatcher's word comes between batches, with none
     * waiting: the ledger folds at once. */
    if (rand() % 97 == 0 && epoch >= 1) {
        sl__ledger_epochs_done(l, epoch, 0);
        if (log)
            sl__delta_log_epochs_done(log, epoch, 0);
        if (lazy)
            sl__ledger_epochs_done(lazy, epoch, 0);
    }
    return true;
}

static void dstream_init(struct dstream *s)
{
    memset(s, 0, sizeof *s);
    s->read = calloc((size_t)DE * DPER, 1);
    s->left = malloc((size_t)DE * DF * sizeof *s->left);
    s->sent = calloc((size_t)DE * DF, sizeof *s->sent);
    for (size_t i = 0; i < (size_t)DE * DF; i++)
        s->left[i] = DR;
}

static void dstream_free(struct dstream *s)
{
    free(s->read);
    free(s->left);
    free(s->sent);
}

static void assert_same_checkpoint(sl_ledger_t *l, sl_ckpt_builder_t *b, uint64_t batch)
{
    uint8_t *want = NULL, *got = NULL;
    size_t wlen = 0, glen = 0;
    char err[300];
    cr_assert_eq(sl__ledger_checkpoint(l, 42, NULL, 0, &want, &wlen, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_ckpt_builder_checkpoint(b, &got, &glen), 0, "%s", sl_ckpt_builder_errmsg(b));
    cr_assert(wlen == glen && memcmp(want, got, wlen) == 0,
              "batch %" PRIu64 ": the builder's checkpoint (%zu bytes) is not the ledger's (%zu bytes)", batch, glen,
              wlen);
    free(want);
    free(got);
}

Test(ledger, deltas_replayed_give_the_checkpoint_bytes_of_every_batch)
{
    srand(23);
    struct dstream s;
    dstream_init(&s);
    sl_ledger_t l;
    sl__ledger_init(&l, 1u << 16);
    sl_delta_log_t log = {0};
    /* every: a checkpoint after every batch (both sync every batch);
     * rarely: only every 211 batches (the builder syncs on its own schedule). */
    sl_ckpt_builder_t *every, *rarely;
    cr_assert_eq(sl_ckpt_builder_open(42, NULL, 1u << 16, NULL, 0, &every), 0, "%s", sl_ckpt_builder_errmsg(every));
    cr_assert_eq(sl_ckpt_builder_open(42, NULL, 1u << 16, NULL, 0, &rarely), 0, "%s", sl_ckpt_builder_errmsg(rarely));
    uint64_t batches = 0;
    size_t most_delta = 0;
    char err[300];
    while (dstream_batch(&s, &l, &log, NULL)) {
        uint8_t *d = NULL;
        size_t dlen = 0;
        cr_assert_eq(sl__delta_log_take(&log, 42, &d, &dlen, err, sizeof err), 0, "%s", err);
        most_delta = dlen > most_delta ? dlen : most_delta;
        cr_assert_eq(sl_ckpt_builder_apply(every, d, dlen), 0, "%s", sl_ckpt_builder_errmsg(every));
        cr_assert_eq(sl_ckpt_builder_apply(rarely, d, dlen), 0, "%s", sl_ckpt_builder_errmsg(rarely));
        free(d);
        batches++;
        if (batches % 211 == 0)
            assert_same_checkpoint(&l, rarely, batches);
        assert_same_checkpoint(&l, every, batches);
        if (batches == 900) {
            /* Halfway: the ledger restored from its own checkpoint (a new
             * iterator) and a builder opened from the same checkpoint go on
             * as one. */
            uint8_t *ck = NULL, *pos = NULL;
            size_t cklen = 0, plen = 0;
            uint64_t done = 0;
            cr_assert_eq(sl__ledger_checkpoint(&l, 42, NULL, 0, &ck, &cklen, err, sizeof err), 0, "%s", err);
            cr_assert_eq(
                sl__checkpoint_read(ck, cklen, 42, NULL, 0, 1u << 16, &pos, &plen, &done, NULL, err, sizeof err), 0,
                "%s", err);
            cr_assert_gt(done, 0, "folds came by batch 900");
            sl__ledger_free(&l);
            sl__ledger_init(&l, 1u << 16);
            cr_assert_eq(sl__ledger_restore(&l, pos, plen, (sl_posrun_t){.epoch = (uint32_t)done}, err, sizeof err), 0,
                         "%s", err);
            sl_ckpt_builder_close(every);
            cr_assert_eq(sl_ckpt_builder_open(42, NULL, 1u << 16, ck, cklen, &every), 0, "%s",
                         sl_ckpt_builder_errmsg(every));
            /* So does one whose deltas came in a lump. */
            free(ck);
            free(pos);
        }
    }
    cr_assert_geq(batches, 1600);
    assert_same_checkpoint(&l, rarely, batches);
    /* A delta is a batch's provenance (about 2 bytes an element in order
     * within a window of 500), its notices and 34 bytes: constant over the run. */
    cr_assert_leq(most_delta, 16 + 18 + 3 * DB + 17 + 6 * 8 * 4, "a delta of %zu bytes", most_delta);
    cr_log_info("%" PRIu64 " batches, largest delta %zu bytes", batches, most_delta);
    sl_ckpt_builder_close(every);
    sl_ckpt_builder_close(rarely);
    sl__delta_log_free(&log);
    sl__ledger_free(&l);
    dstream_free(&s);
}

static void assert_same_ledger_checkpoint(sl_ledger_t *want_l, sl_ledger_t *got_l, uint64_t batch, unsigned seed,
                                          const char *what)
{
    uint8_t *want = NULL, *got = NULL;
    size_t wlen = 0, glen = 0;
    char err[300];
    cr_assert_eq(sl__ledger_checkpoint(want_l, 42, NULL, 0, &want, &wlen, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl__ledger_checkpoint(got_l, 42, NULL, 0, &got, &glen, err, sizeof err), 0, "%s", err);
    cr_assert(wlen == glen && memcmp(want, got, wlen) == 0,
              "seed %u, batch %" PRIu64 ": the %s ledger's checkpoint (%zu bytes) is not the decoding one's "
              "(%zu bytes)",
              seed, batch, what, glen, wlen);
    free(want);
    free(got);
}

/* Lazy provenance (ledger.h): the stream above given with its batches'
 * tallies to one ledger and without to another: checkpoints taken at
 * random batches (each one decodes what the lazy ledger keeps) are the same
 * bytes, and what it keeps undecoded stays the size of the shuffle's window,
 * also when some splits are never given whole here (another consumer has
 * some of their records). Seeded: SLUICE_TEST_SEED repeats a run. */
Test(ledger, tallied_batches_checkpoint_as_decoded_ones_and_keep_only_a_window)
{
    const char *env = getenv("SLUICE_TEST_SEED");
    unsigned seed = env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)time(NULL);
    fprintf(stderr, "ledger.tallied_batches...: seed %u (SLUICE_TEST_SEED=%u repeats it)\n", seed, seed);
    srand(seed);
    for (int others = 0; others < 2; others++) {
        struct dstream s;
        dstream_init(&s);
        s.others = others;
        sl_ledger_t eager, lazy;
        sl__ledger_init(&eager, 1u << 16);
        sl__ledger_init(&lazy, 1u << 16);
        uint64_t batches = 0, checkpoints = 0;
        size_t most_kept = 0;
        while (dstream_batch(&s, &eager, NULL, &lazy)) {
            batches++;
            size_t kept = lazy.log_kept;
            most_kept = kept > most_kept ? kept : most_kept;
            if (rand() % 50 == 0) {
                assert_same_ledger_checkpoint(&eager, &lazy, batches, seed, "tallied");
                checkpoints++;
            }
        }
        assert_same_ledger_checkpoint(&eager, &lazy, batches, seed, "tallied");
        cr_assert_geq(checkpoints, 10, "seed %u: %" PRIu64 " checkpoints", seed, checkpoints);
        /* What is kept reaches back to the oldest file not given whole:
         * its last record waits in the window of 500 a geometric number of
         * picks (each takes it with chance 1/500; 10,000 picks or more with
         * chance e^-20), about 2 bytes each. All of the 125,000 records
         * would be about 250 KB. */
        cr_assert_leq(most_kept, 32768, "seed %u, others %d: the lazy ledger kept %zu bytes undecoded", seed, others,
                      most_kept);
        cr_log_info("others %d: %" PRIu64 " batches, at most %zu bytes kept undecoded", others, batches, most_kept);
        sl__ledger_free(&eager);
        sl__ledger_free(&lazy);
        dstream_free(&s);
    }
}

Test(ledger, a_damaged_delta_is_refused_by_name_and_changes_nothing)
{
    sl_ledger_t l;
    sl__ledger_init(&l, 1000);
    sl_delta_log_t log = {0};
    sl_provenance_run_t r[2] = {{0, 1, 0, 3}, {0, 1, 7, 2}};
    uint8_t *wire = NULL;
    size_t wlen = 0;
    cr_assert_eq(sl_provwire_encode(r, 2, &wire, &wlen), 0);
    sl_split_done_t d = {.split_id = 9, .epoch = 0, .file_index = 1, .begin = 0, .end = 10, .delivered = 5};
    sl__ledger_add(&l, wire, wlen, 5, &d, 1, false);
    sl__delta_log_batch(&log, wire, wlen, 5, &d, 1, false);
    sl__ledger_epochs_done(&l, 1, 4);
    sl__delta_log_epochs_done(&log, 1, 4);
    uint8_t *delta = NULL;
    size_t len = 0;
    char err[300];
    cr_assert_eq(sl__delta_log_take(&log, 42, &delta, &len, err, sizeof err), 0, "%s", err);
    sl_ckpt_builder_t *b;
    cr_assert_eq(sl_ckpt_builder_open(42, NULL, 1000, NULL, 0, &b), 0);
    struct {
        size_t at;
        uint8_t to;
        int rc;
        const char *says;
    } cases[] = {
        {0, 'X', SL_EDATA, "not a Sluice iterator delta"},
        {4, 9, SL_EDATA, "version 9"},
        {8, 43, SL_EINVAL, "delta of dataset 43"},
        {16, 'Q', SL_EDATA, "unknown record kind 0x51 at byte 16"},
        {16 + 1, 4, SL_EDATA, "provenance of the batch at byte 16"},
        {16 + 9, 200, SL_EDATA, "says 200 bytes of provenance"},
        {16 + 17, 2, SL_EDATA, "end flag is 2"},
        {len - 17 + 1 + 4, 1, SL_EDATA, "past 2^32 epochs"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t keep = delta[cases[i].at];
        delta[cases[i].at] = cases[i].to;
        cr_assert_eq(sl_ckpt_builder_apply(b, delta, len), cases[i].rc, "case %zu: %s", i, sl_ckpt_builder_errmsg(b));
        cr_assert(strstr(sl_ckpt_builder_errmsg(b), cases[i].says), "case %zu: %s", i, sl_ckpt_builder_errmsg(b));
        delta[cases[i].at] = keep;
    }
    cr_assert_eq(sl_ckpt_builder_apply(b, delta, len - 1), SL_EDATA);
    cr_assert(strstr(sl_ckpt_builder_errmsg(b), "cut short"), "%s", sl_ckpt_builder_errmsg(b));
    /* Nothing of those was applied: the good delta once makes the ledger's checkpoint. */
    cr_assert_eq(sl_ckpt_builder_apply(b, delta, len), 0, "%s", sl_ckpt_builder_errmsg(b));
    assert_same_checkpoint(&l, b, 1);
    /* A checkpoint of another dataset, or damaged, does not start a builder. */
    uint8_t *ck = NULL;
    size_t cklen = 0;
    cr_assert_eq(sl__ledger_checkpoint(&l, 42, NULL, 0, &ck, &cklen, err, sizeof err), 0, "%s", err);
    sl_ckpt_builder_t *o;
    cr_assert_eq(sl_ckpt_builder_open(7, NULL, 1000, ck, cklen, &o), SL_EINVAL);
    cr_assert(strstr(sl_ckpt_builder_errmsg(o), "checkpoint of dataset 42"), "%s", sl_ckpt_builder_errmsg(o));
    sl_ckpt_builder_close(o);
    ck[20] ^= 1;
    cr_assert_eq(sl_ckpt_builder_open(42, NULL, 1000, ck, cklen, &o), SL_EDATA);
    cr_assert(strstr(sl_ckpt_builder_errmsg(o), "damaged"), "%s", sl_ckpt_builder_errmsg(o));
    sl_ckpt_builder_close(o);
    free(ck);
    sl_ckpt_builder_close(b);
    free(delta);
    free(wire);
    sl__delta_log_free(&log);
    sl__ledger_free(&l);
}

/* Reads a checkpoint of dataset 42 under key into a set (of at most the most runs). */
static void read_set(const uint8_t *ckpt, size_t len, const uint8_t *key, size_t key_len, sl_posset_t *out)
{
    uint8_t *posset = NULL;
    size_t plen = 0;
    char err[300];
    cr_assert_eq(sl__checkpoint_read(ckpt, len, 42, key, key_len, SL_POSSET_MAX_RUNS, &posset, &plen, &epochs_done,
                                     NULL, err, sizeof err),
                 0, "%s", err);
    sl_posset_init(out, SL_POSSET_MAX_RUNS);
    cr_assert_eq(sl_posset_decode(out, posset, plen, err, sizeof err), 0, "%s", err);
    free(posset);
}

Test(ledger, the_ranks_of_a_named_job_merge_into_what_their_callers_were_given)
{
    /* One epoch of 100,000 positions over 4 files, shuffled, in batches of
     * 100 handed to 4 ranks at random; about half of the last 12 stay in
     * their rank's buffer (never given). The merged checkpoint holds exactly what
     * the ranks gave, under the cluster token; a rank restored from it
     * that gives more checkpoints as the merged set and its own. */
    enum { N = 100000, BATCH = 100, RANKS = 4, FILES = 4 };
    static const uint8_t key[] = "a cluster token of some length";
    uint64_t *order = malloc(N * sizeof *order);
    shuffled_order(order, N, 11);
    sl_ledger_t rank[RANKS];
    for (int r = 0; r < RANKS; r++)
        sl__ledger_init(&rank[r], SL_POSSET_MAX_RUNS);
    uint8_t *given = calloc(N, 1);
    int stop = N / BATCH * 3 / 4; /* the ranks stop at three quarters of the epoch */
    sl_provenance_run_t runs[BATCH];
    for (int b = 0; b < stop; b++) {
        int r = rand() % RANKS;
        for (int i = 0; i < BATCH; i++) {
            uint64_t p = order[(size_t)b * BATCH + i];
            runs[i] = (sl_provenance_run_t){0, (uint32_t)(p % FILES), p / FILES, 1};
        }
        /* Some of the last batches stay in their rank's buffer. */
        if (b >= stop - 3 * RANKS && rand() % 2)
            continue;
        give(&rank[r], runs, BATCH, NULL, 0, false);
        for (int i = 0; i < BATCH; i++)
            given[order[(size_t)b * BATCH + i]] = 1;
    }
    uint8_t *ckpt[RANKS];
    size_t len[RANKS];
    char err[300];
    for (int r = 0; r < RANKS; r++)
        cr_assert_eq(sl__ledger_checkpoint(&rank[r], 42, key, sizeof key, &ckpt[r], &len[r], err, sizeof err), 0,
                     "%s", err);
    uint8_t *merged;
    size_t mlen;
    cr_assert_eq(sl__checkpoint_merge((const uint8_t *const *)ckpt, len, RANKS, key, sizeof key, SL_POSSET_MAX_RUNS,
                                      &merged, &mlen, err, sizeof err), 0, "%s", err);
    sl_posset_t set;
    read_set(merged, mlen, key, sizeof key, &set);
    cr_assert_eq(epochs_done, 0);
    uint64_t want = 0;
    for (uint64_t p = 0; p < N; p++) {
        want += given[p];
        cr_assert_eq(sl_posset_count(&set, 0, (uint32_t)(p % FILES), p / FILES, p / FILES + 1), given[p],
                     "position %" PRIu64, p);
    }
    cr_assert_eq(sl_posset_size(&set), want);
    sl_posset_clear(&set);

    /* Chained: a rank of the resumed job restores the merged checkpoint
     * and gives one more batch; its checkpoint merged with a rank that gave
     * nothing since is the merged set and that batch. */
    uint8_t *posset = NULL;
    size_t plen = 0;
    uint64_t done = 0;
    cr_assert_eq(sl__checkpoint_read(merged, mlen, 42, key, sizeof key, SL_POSSET_MAX_RUNS, &posset, &plen, &done, NULL,
                                     err, sizeof err),
                 0, "%s", err);
    sl_ledger_t a, b;
    sl__ledger_init(&a, SL_POSSET_MAX_RUNS);
    sl__ledger_init(&b, SL_POSSET_MAX_RUNS);
    cr_assert_eq(sl__ledger_restore(&a, posset, plen, (sl_posrun_t){.epoch = (uint32_t)done}, err, sizeof err), 0, "%s",
                 err);
    cr_assert_eq(sl__ledger_restore(&b, posset, plen, (sl_posrun_t){.epoch = (uint32_t)done}, err, sizeof err), 0, "%s",
                 err);
    free(posset);
    uint64_t extra = 0;
    for (uint64_t p = 0; p < N && extra < BATCH; p++)
        if (!given[p])
            runs[extra++] = (sl_provenance_run_t){0, (uint32_t)(p % FILES), p / FILES, 1};
    give(&a, runs, BATCH, NULL, 0, false);
    uint8_t *two[2];
    size_t two_len[2];
    cr_assert_eq(sl__ledger_checkpoint(&a, 42, key, sizeof key, &two[0], &two_len[0], err, sizeof err), 0);
    cr_assert_eq(sl__ledger_checkpoint(&b, 42, key, sizeof key, &two[1], &two_len[1], err, sizeof err), 0);
    uint8_t *again;
    size_t again_len;
    cr_assert_eq(sl__checkpoint_merge((const uint8_t *const *)two, two_len, 2, key, sizeof key, SL_POSSET_MAX_RUNS,
                                      &again, &again_len, err, sizeof err), 0, "%s", err);
    read_set(again, again_len, key, sizeof key, &set);
    cr_assert_eq(sl_posset_size(&set), want + BATCH);
    sl_posset_clear(&set);

    free(merged);
    /* Refused by name: a damaged one (which one it is), one made with
     * another token, none, another dataset. */
    ckpt[2][len[2] / 2] ^= 4;
    cr_assert_eq(sl__checkpoint_merge((const uint8_t *const *)ckpt, len, RANKS, key, sizeof key, SL_POSSET_MAX_RUNS,
                                      &merged, &mlen, err, sizeof err), SL_EDATA);
    cr_assert(strstr(err, "checkpoint 3 of 4") && strstr(err, "damaged"), "%s", err);
    ckpt[2][len[2] / 2] ^= 4;
    static const uint8_t other_key[] = "another token";
    cr_assert_eq(sl__checkpoint_merge((const uint8_t *const *)ckpt, len, RANKS, other_key, sizeof other_key,
                                      SL_POSSET_MAX_RUNS, &merged, &mlen, err, sizeof err), SL_EDATA);
    cr_assert(strstr(err, "checkpoint 1 of 4"), "%s", err);
    cr_assert_eq(sl__checkpoint_merge((const uint8_t *const *)ckpt, len, 0, key, sizeof key, SL_POSSET_MAX_RUNS,
                                      &merged, &mlen, err, sizeof err), SL_EINVAL);
    uint8_t *mixed[2] = {ckpt[0], NULL};
    size_t mixed_len[2] = {len[0], 0};
    cr_assert_eq(sl__ledger_checkpoint(&rank[1], 43, key, sizeof key, &mixed[1], &mixed_len[1], err, sizeof err), 0);
    cr_assert_eq(sl__checkpoint_merge((const uint8_t *const *)mixed, mixed_len, 2, key, sizeof key, SL_POSSET_MAX_RUNS,
                                      &merged, &mlen, err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "checkpoint 2 of 2 is of dataset 43, checkpoint 1 of dataset 42"), "%s", err);
    free(mixed[1]);
    /* A rank that folded epoch 0 (every client of the job was given its
     * records of it) and one that has not yet: the merge has epoch 0 done
     * and none of its positions, and keeps the later epoch's. */
    sl__ledger_epochs_done(&rank[1], 1, 0);
    runs[0] = (sl_provenance_run_t){1, 2, 10, 5};
    give(&rank[1], runs, 1, NULL, 0, true);
    cr_assert_eq(sl__ledger_checkpoint(&rank[1], 42, key, sizeof key, &mixed[1], &mixed_len[1], err, sizeof err), 0);
    cr_assert_eq(sl__checkpoint_merge((const uint8_t *const *)mixed, mixed_len, 2, key, sizeof key, SL_POSSET_MAX_RUNS,
                                      &merged, &mlen, err, sizeof err), 0, "%s", err);
    read_set(merged, mlen, key, sizeof key, &set);
    cr_assert_eq(epochs_done, 1);
    cr_assert_eq(sl_posset_size(&set), 5);
    cr_assert_eq(sl_posset_count(&set, 1, 2, 10, 15), 5);
    sl_posset_clear(&set);
    free(merged);
    free(mixed[1]);

    for (int r = 0; r < RANKS; r++) {
        free(ckpt[r]);
        sl__ledger_free(&rank[r]);
    }
    free(two[0]);
    free(two[1]);
    free(again);
    sl__ledger_free(&a);
    sl__ledger_free(&b);
    free(given);
    free(order);
}

/* A GET_ELEMENT answer of 4 int64 elements from runs (4 records), its
 * provenance and tallies (rows, n of them) after the tensor bytes: what
 * sl__batch_from_wire makes of it (NULL with err). */
static struct sl_batch *wire_batch(const sl_provenance_run_t *runs, size_t nruns, const sl_split_done_t *rows,
                                   size_t n, uint64_t tallies_offset_shift, char *err, size_t errlen)
{
    uint8_t *prov = NULL, *tally = NULL;
    size_t plen = 0, tlen = 0;
    cr_assert_eq(sl_provwire_encode(runs, nruns, &prov, &plen), 0);
    if (n > 0)
        cr_assert_eq(sl_provwire_encode_done(rows, n, &tally, &tlen), 0);
    size_t size = 32 + plen + tlen;
    uint8_t *payload = calloc(1, size);
    memcpy(payload + 32, prov, plen);
    if (tlen)
        memcpy(payload + 32 + plen, tally, tlen);
    sluice_GetElementResponse resp = {.task_id = 9, .num_elements = 4, .components_count = 1,
                                      .provenance_offset = 32, .provenance_length = plen,
                                      .tallies_offset = 32 + plen + tallies_offset_shift, .tallies_length = tlen};
    snprintf(resp.components[0].name, sizeof resp.components[0].name, "value");
    resp.components[0].dtype = SL_DTYPE_INT64;
    resp.components[0].shape_count = 1;
    resp.components[0].shape[0] = 4;
    resp.components[0].length = 32;
    free(prov);
    free(tally);
    return sl__batch_from_wire(&resp, payload, size, err, errlen);
}

/* wire_batch() of 4 records of epoch 0, 3 of file 1's split [0, 10) and 1
 * of file 2's [40, 50). */
static struct sl_batch *tallied_batch(const sl_split_done_t *rows, size_t n, uint64_t tallies_offset_shift,
                                      char *err, size_t errlen)
{
    static const sl_provenance_run_t runs[] = {{0, 1, 7, 1}, {0, 1, 3, 1}, {0, 2, 40, 1}, {0, 1, 9, 1}};
    return wire_batch(runs, 4, rows, n, tallies_offset_shift, err, errlen);
}

Test(ledger, a_batch_says_the_least_epoch_of_its_records)
{
    /* What a checkpoint's fold reads of the batches still waiting for the
     * caller (iterator.c): from the tallies when they count every record,
     * else from the runs, decoded; one run is known as it is checked. */
    char err[400];
    static const sl_provenance_run_t runs[] = {{7, 1, 7, 1}, {5, 1, 3, 1}, {6, 2, 40, 1}, {9, 1, 9, 1}};
    struct sl_batch *b = wire_batch(runs, 4, NULL, 0, 0, err, sizeof err);
    cr_assert_not_null(b, "%s", err);
    cr_assert_eq(sl__batch_least_epoch(b), 5, "the runs' least epoch, not the first run's");
    sl__batch_free(b);
    sl_split_done_t rows[] = {{.epoch = 7, .file_index = 1, .begin = 0, .end = 10, .delivered = 1},
                              {.epoch = 5, .file_index = 1, .begin = 0, .end = 10, .delivered = 1},
                              {.epoch = 6, .file_index = 2, .begin = 40, .end = 50, .delivered = 1},
                              {.epoch = 9, .file_index = 1, .begin = 0, .end = 10, .delivered = 1}};
    b = wire_batch(runs, 4, rows, 4, 0, err, sizeof err);
    cr_assert_not_null(b, "%s", err);
    cr_assert_eq(b->num_tally, 4);
    cr_assert_eq(sl__batch_least_epoch(b), 5, "the tallies' least epoch");
    sl__batch_free(b);
    static const sl_provenance_run_t one[] = {{3, 0, 0, 4}};
    b = wire_batch(one, 1, NULL, 0, 0, err, sizeof err);
    cr_assert_not_null(b, "%s", err);
    cr_assert_eq(sl__batch_least_epoch(b), 3);
    sl__batch_free(b);
}

Test(ledger, a_batch_keeps_tallies_that_count_every_record_and_refuses_wrong_ones)
{
    char err[400];
    /* File 1's split [0, 10) has 3 of the records, file 2's [40, 50) one. */
    sl_split_done_t rows[] = {{.epoch = 0, .file_index = 1, .begin = 0, .end = 10, .delivered = 3},
                              {.epoch = 0, .file_index = 2, .begin = 40, .end = 50, .delivered = 1}};
    struct sl_batch *b = tallied_batch(rows, 2, 0, err, sizeof err);
    cr_assert_not_null(b, "%s", err);
    cr_assert_eq(b->num_tally, 2);
    cr_assert_eq(b->tally[0].delivered, 3);
    cr_assert_eq(b->tally[1].file_index, 2);
    cr_assert_eq(b->size, 32, "the tallies are no part of the tensor bytes");
    sl__batch_free(b);
    /* Rows that count fewer records than the provenance: not kept (the
     * ledger decodes the provenance), the batch is good. */
    b = tallied_batch(rows, 1, 0, err, sizeof err);
    cr_assert_not_null(b, "%s", err);
    cr_assert_null(b->tally);
    sl__batch_free(b);
    /* More than the batch has, or a row of none: refused by name. */
    rows[1].delivered = 2;
    cr_assert_null(tallied_batch(rows, 2, 0, err, sizeof err));
    cr_assert(strstr(err, "task 9: tally 1 (split [40, 50) of file 2 of epoch 0) counts 2 records: more than"),
              "%s", err);
    rows[1].delivered = 0;
    cr_assert_null(tallied_batch(rows, 2, 0, err, sizeof err));
    cr_assert(strstr(err, "counts 0 records: none"), "%s", err);
    /* Outside the payload. */
    rows[1].delivered = 1;
    cr_assert_null(tallied_batch(rows, 2, 5, err, sizeof err));
    cr_assert(strstr(err, "task 9: tallies at ["), "%s", err);
    cr_assert(strstr(err, "are outside the payload"), "%s", err);
}

/* One tallied batch of count records of (epoch 0, file) from begin, its
 * split [0, 100) of that file; with the notices in done. */
static void give_tallied(sl_ledger_t *l, uint32_t file, uint64_t begin, uint64_t count, const sl_split_done_t *done,
                         size_t ndone)
{
    sl_provenance_run_t run = {0, file, begin, count};
    sl_split_done_t tally = {.split_id = file + 1, .epoch = 0, .file_index = file, .begin = 0, .end = 100,
                             .delivered = count};
    uint8_t *wire = NULL;
    size_t len = 0;
    cr_assert_eq(sl_provwire_encode(&run, 1, &wire, &len), 0);
    sl__ledger_add_tallied(l, wire, len, count, &tally, 1, done, ndone, false);
    free(wire);
}

/* Lazy provenance lets a kept batch go, undecoded, as soon as every split
 * it reaches was given whole: the notice of one split lets go the batches
 * of that split alone, up to the first batch that also reaches a split
 * still open; that split's notice lets the rest go; and the end of an
 * epoch lets go what is kept of it. */
Test(ledger, a_kept_batch_goes_once_every_split_it_reaches_is_given_whole)
{
    sl_ledger_t l;
    sl__ledger_init(&l, 1u << 16);
    const sl_split_done_t done_a = {.split_id = 1, .epoch = 0, .file_index = 0, .begin = 0, .end = 100,
                                    .delivered = 100};
    const sl_split_done_t done_b = {.split_id = 2, .epoch = 0, .file_index = 1, .begin = 0, .end = 100,
                                    .delivered = 100};
    give_tallied(&l, 0, 0, 50, NULL, 0);  /* A */
    give_tallied(&l, 0, 50, 50, NULL, 0); /* A */
    give_tallied(&l, 1, 0, 10, NULL, 0);  /* B */
    give_tallied(&l, 1, 10, 20, NULL, 0); /* B */
    cr_assert_eq(l.ent_num - l.ent_head, 4, "%zu batches kept, not 4", l.ent_num - l.ent_head);
    give_tallied(&l, 1, 30, 30, &done_a, 1); /* B, and A's notice */
    cr_assert_eq(l.ent_num - l.ent_head, 3, "A's notice: %zu batches kept, not B's 3", l.ent_num - l.ent_head);
    give_tallied(&l, 1, 60, 40, &done_b, 1); /* B, and B's notice */
    cr_assert_eq(l.ent_num - l.ent_head, 0, "B's notice: %zu batches kept, not none", l.ent_num - l.ent_head);
    /* Of a split whose notice does not come, until its epoch is done. */
    give_tallied(&l, 2, 0, 50, NULL, 0);
    give_tallied(&l, 2, 50, 50, NULL, 0);
    cr_assert_eq(l.ent_num - l.ent_head, 2);
    sl__ledger_epochs_done(&l, 1, 0);
    cr_assert_eq(l.ent_num - l.ent_head, 0, "epoch 0 done: %zu batches kept, not none", l.ent_num - l.ent_head);
    cr_assert_eq(l.rc, 0);
    sl__ledger_free(&l);
}

/* Lazy provenance's log is a ring: a long stream in which kept batches
 * never run out (batch k holds the second half of split k and the first
 * half of split k + 1, each half's records in a seeded order, so batches
 * differ in length; split k's notice comes with batch k + 1) goes round
 * it again and again in the memory of a few batches, never moving what is
 * kept, and checkpoints of it, some taken while it has wrapped, are those of
 * a ledger that decodes every batch; also after 150 notices waited, while
 * the ring grew with what it kept. Every 97th split's notice counts a
 * record more than was given (another consumer had it): then what is kept
 * is decoded from where it lies in the ring. */
Test(ledger, the_kept_batches_go_round_a_ring_of_a_few_batches)
{
    uint64_t rng = test_seed("ledger.the_kept_batches_go_round_a_ring_of_a_few_batches");
    unsigned seed = (unsigned)rng;
    sl_ledger_t eager, lazy;
    sl__ledger_init(&eager, 1u << 20);
    sl__ledger_init(&lazy, 1u << 20);
    enum { SPLITS = 3000, HALF = 50, HOLD = 150 };
    sl_provenance_run_t runs[2 * HALF];
    uint64_t appended = 0, checkpoints = 0, wrapped = 0, last_checkpoint = 0;
    uint32_t hold_from = 0;
    for (uint32_t k = 0; k + 1 < SPLITS; k++) {
        size_t n = 0;
        for (uint32_t f = k; f <= k + 1; f++) {
            uint64_t from = f == k ? HALF : 0;
            for (uint64_t r = 0; r < HALF; r++)
                runs[n++] = (sl_provenance_run_t){0, f, from + r, 1};
        }
        for (size_t i = n - 1; i > 0; i--) {
            size_t j = (size_t)(splitmix64(&rng) % (i + 1));
            sl_provenance_run_t t = runs[i];
            runs[i] = runs[j];
            runs[j] = t;
        }
        sl_split_done_t tally[2] = {
            {.split_id = k + 1, .epoch = 0, .file_index = k, .begin = 0, .end = 2 * HALF, .delivered = HALF},
            {.split_id = k + 2, .epoch = 0, .file_index = k + 1, .begin = 0, .end = 2 * HALF, .delivered = HALF}};
        /* Split k - 1 was given whole with batch k - 1 (or not, every 97th). */
        sl_split_done_t done = {.split_id = k, .epoch = 0, .file_index = k - 1, .begin = 0, .end = 2 * HALF,
                                .delivered = 2 * HALF + ((k - 1) % 97 == 3)};
        size_t ndone = k > 0 ? 1 : 0;
        /* For HOLD batches from the first at or after batch 1000 that finds
         * the ring wrapped, the notices wait (a worker slow to send them):
         * the batches kept grow, and the ring with them, from wrapped;
         * then they all come with one batch. */
        static sl_split_done_t held[HOLD + 1];
        const sl_split_done_t *notices = &done;
        if (hold_from == 0 && k >= 1000 && sl__ledger_log_wrapped(&lazy))
            hold_from = k;
        if (hold_from > 0 && k >= hold_from && k < hold_from + HOLD) {
            held[k - hold_from] = done;
            ndone = 0;
        } else if (hold_from > 0 && k == hold_from + HOLD) {
            held[HOLD] = done;
            notices = held;
            ndone = HOLD + 1;
        }
        uint8_t *wire = NULL;
        size_t len = 0;
        cr_assert_eq(sl_provwire_encode(runs, n, &wire, &len), 0);
        sl__ledger_add(&eager, wire, len, n, notices, ndone, false);
        sl__ledger_add_tallied(&lazy, wire, len, n, tally, 2, notices, ndone, false);
        free(wire);
        appended += len;
        bool wraps = sl__ledger_log_wrapped(&lazy);
        wrapped += wraps;
        if (hold_from > 0 && k == hold_from + HOLD - 1)
            assert_same_ledger_checkpoint(&eager, &lazy, k, seed, "tallied"); /* the most kept, the ring grown */
        /* Checkpoints decode what is kept and empty the ring: none in the
         * 100 batches before the hold and none in it. */
        bool near_hold = k >= 900 && (hold_from == 0 || k < hold_from + HOLD);
        if (wraps && !near_hold && k >= last_checkpoint + 50 && checkpoints < 20) {
            assert_same_ledger_checkpoint(&eager, &lazy, k, seed, "tallied");
            checkpoints++;
            last_checkpoint = k;
        }
    }
    assert_same_ledger_checkpoint(&eager, &lazy, SPLITS, seed, "tallied");
    cr_assert_eq(lazy.rc, 0);
    cr_assert(hold_from > 0, "seed %u: the ring was never wrapped after batch 1000", seed);
    cr_assert_leq(lazy.log_cap, 131072, "seed %u: the ring grew to %zu bytes for at most %d batches of about %" PRIu64,
                  seed, lazy.log_cap, HOLD + 2, appended / SPLITS);
    cr_assert_geq(appended, 8 * lazy.log_cap, "seed %u: %" PRIu64 " bytes through a ring of %zu", seed, appended,
                  lazy.log_cap);
    cr_assert_gt(wrapped, 40, "seed %u: the ring was wrapped at %" PRIu64 " of the batches only", seed, wrapped);
    cr_assert_geq(checkpoints, 10, "seed %u: %" PRIu64 " checkpoints taken wrapped", seed, checkpoints);
    cr_log_info("%" PRIu64 " bytes through a ring of %zu, wrapped at %" PRIu64 " of the batches, %" PRIu64
                " checkpoints taken wrapped", appended, lazy.log_cap, wrapped, checkpoints);
    sl__ledger_free(&eager);
    sl__ledger_free(&lazy);
}

/* One-run batches (sl__ledger_add_run()): the stream an unshuffled pipeline
 * makes under DYNAMIC, read by W workers at once, its batches interleaved
 * at random as the consumer takes them. Splits of S records never cross a
 * file and go to the workers in order; a worker's batch of up to B records
 * reads on into its next split, one run when that split starts where its
 * last ended (the same file); a filter drops some blocks of records (a batch
 * across one has two runs) and another consumer may have some (its notices
 * count them); epochs fold now and then. A ledger given every batch decoded and
 * one given one-run batches by their run checkpoint as the same bytes. */
struct pworker {
    uint64_t split[2][4]; /* up to two splits: epoch, file, begin, end */
    unsigned nsplits;
    uint64_t at;          /* the next record of split[0] */
    uint64_t given;       /* records of split[0] given or had by the other consumer */
    uint64_t given2;      /* the same of split[1] */
};

struct pstream {
    uint64_t epochs, files, records, split, batch;
    bool filter, others;
    uint64_t next_split; /* splits handed out, all epochs in order */
    uint64_t splits_per_file;
};

static bool p_dropped(const struct pstream *s, uint64_t e, uint64_t f, uint64_t r)
{
    return s->filter && (e * 7919 + f * 104729 + r / 97) % 7 == 3; /* blocks of 97 */
}

static bool p_others(const struct pstream *s, uint64_t f, uint64_t r)
{
    return s->others && f % 5 == 0 && r / 53 % 11 == 5;
}

/* Hands worker w its next split when the stream has one. */
static bool p_take_split(struct pstream *s, struct pworker *w)
{
    uint64_t total = s->epochs * s->files * s->splits_per_file;
    if (s->next_split == total || w->nsplits == 2)
        return false;
    uint64_t k = s->next_split++, e = k / (s->files * s->splits_per_file), f = k / s->splits_per_file % s->files;
    uint64_t b = k % s->splits_per_file * s->split, end = b + s->split < s->records ? b + s->split : s->records;
    uint64_t *sp = w->split[w->nsplits++];
    sp[0] = e, sp[1] = f, sp[2] = b, sp[3] = end;
    if (w->nsplits == 1) {
        w->at = b;
        w->given = 0;
    } else {
        w->given2 = 0;
    }
    return true;
}

/* Worker w's next batch: its runs and notices. @return false when w has nothing left */
static bool p_batch(struct pstream *s, struct pworker *w, sl_provenance_run_t *runs, size_t *n,
                    sl_split_done_t *done, size_t *nd)
{
    *n = *nd = 0;
    if (w->nsplits == 0 && !p_take_split(s, w))
        return false;
    uint64_t kept = 0;
    while (kept < s->batch) {
        if (w->nsplits == 0 && !p_take_split(s, w))
            break;
        uint64_t *sp = w->split[0];
        if (w->at == sp[3]) {
            /* Split done: its notice goes with this batch; the worker goes
             * on into its next one. */
            done[(*nd)++] = (sl_split_done_t){.split_id = (sp[0] * s->files + sp[1]) * s->splits_per_file +
                                                          sp[2] / s->split + 1,
                                              .epoch = (uint32_t)sp[0], .file_index = (uint32_t)sp[1],
                                              .begin = sp[2], .end = sp[3], .delivered = w->given};
            memmove(w->split[0], w->split[1], sizeof w->split[0]);
            w->nsplits--;
            w->given = w->given2;
            if (w->nsplits == 1)
                w->at = w->split[0][2];
            else if (!p_take_split(s, w))
                break;
            continue;
        }
        if (w->nsplits == 1 && sp[3] - w->at <= s->batch)
            p_take_split(s, w); /* the next split is known before this one ends */
        uint64_t r = w->at++;
        if (p_dropped(s, sp[0], sp[1], r))
            continue;
        w->given++;
        kept++;
        if (p_others(s, sp[1], r))
            continue;
        sl_provenance_run_t *last = *n ? &runs[*n - 1] : NULL;
        if (last && last->epoch == sp[0] && last->file_index == sp[1] && last->begin + last->count == r)
            last->count++;
        else
            runs[(*n)++] = (sl_provenance_run_t){(uint32_t)sp[0], (uint32_t)sp[1], r, 1};
    }
    return *n > 0 || *nd > 0;
}

Test(ledger, one_run_batches_checkpoint_as_decoded_ones)
{
    unsigned seed = test_seed("ledger.one_run_batches_checkpoint_as_decoded_ones");
    srand(seed);
    for (int round = 0; round < 6; round++) {
        struct pstream s = {.epochs = 1 + (uint64_t)(rand() % 4), .files = 1 + (uint64_t)(rand() % 200),
                            .batch = 1 + (uint64_t)(rand() % 1024), .filter = rand() % 3 == 0,
                            .others = rand() % 3 == 0};
        /* About a million records in all. The first round reads them
         * unfiltered in splits of whole batches, as a range pipeline does. */
        s.records = 1000000 / (s.epochs * s.files) + 1;
        s.split = 1 + (uint64_t)rand() % (s.records < 50000 ? s.records : 50000);
        if (round == 0) {
            s.filter = s.others = false;
            s.files = 1 + s.files % 8;
            s.records = 1000000 / (s.epochs * s.files) + 1;
            s.split = s.batch * (8 + (uint64_t)(rand() % 64));
        }
        s.splits_per_file = (s.records + s.split - 1) / s.split;
        unsigned nw = 1 + (unsigned)(rand() % 6);
        struct pworker w[6];
        memset(w, 0, sizeof w);
        sl_ledger_t eager, runs_l;
        sl__ledger_init(&eager, 1u << 20);
        sl__ledger_init(&runs_l, 1u << 20);
        static sl_provenance_run_t runs[1024];
        static sl_split_done_t done[2048]; /* a batch may end many splits of one record */
        uint64_t batches = 0, one_run = 0, checkpoints = 0, epoch_given = 0;
        unsigned live = nw;
        bool ended[6] = {0};
        while (live > 0) {
            unsigned k = (unsigned)rand() % nw;
            if (ended[k])
                continue;
            size_t n, nd;
            if (!p_batch(&s, &w[k], runs, &n, done, &nd)) {
                ended[k] = true;
                live--;
                continue;
            }
            batches++;
            give(&eager, runs, n, done, nd, false);
            if (n == 1) {
                one_run++;
                sl__ledger_add_run(&runs_l, &runs[0], done, nd, false);
            } else {
                give(&runs_l, runs, n, done, nd, false);
            }
            /* Every record of the epochs below the least one a worker
             * holds or the stream hands out next was given: now and then
             * the dispatcher says so. */
            uint64_t below = s.next_split / (s.files * s.splits_per_file);
            for (unsigned i = 0; i < nw; i++)
                if (w[i].nsplits > 0 && w[i].split[0][0] < below)
                    below = w[i].split[0][0];
            if (below > epoch_given && rand() % 50 == 0) {
                epoch_given = below;
                sl__ledger_epochs_done(&eager, epoch_given, 0);
                sl__ledger_epochs_done(&runs_l, epoch_given, 0);
            }
            if (rand() % 100 == 0) {
                assert_same_ledger_checkpoint(&eager, &runs_l, batches, seed, "one-run");
                checkpoints++;
            }
        }
        give(&eager, NULL, 0, NULL, 0, true);
        give(&runs_l, NULL, 0, NULL, 0, true);
        assert_same_ledger_checkpoint(&eager, &runs_l, batches, seed, "one-run");
        cr_assert_eq(runs_l.rc, 0, "seed %u: %s", seed, sl_strerror(runs_l.rc));
        if (round == 0)
            cr_assert_geq(one_run * 2, batches, "seed %u: %" PRIu64 " of %" PRIu64 " batches of one run", seed,
                          one_run, batches);
        cr_log_info("seed %u round %d: %u workers, %" PRIu64 " batches (%" PRIu64 " of one run), %" PRIu64
                    " checkpoints", seed, round, nw, batches, one_run, checkpoints);
        sl__ledger_free(&eager);
        sl__ledger_free(&runs_l);
    }
}

/* Batches that continue the runs that wait (unshuffled splits) are not
 * merged every few batches: a few runs wait until a notice comes to be
 * checked against them, or until there are eight. */
Test(ledger, a_few_runs_wait_until_a_notice_comes)
{
    sl_ledger_t l;
    sl__ledger_init(&l, 1u << 16);
    for (uint64_t b = 0; b < 1000; b++) {
        sl_provenance_run_t run = {0, (uint32_t)(b % 2), b / 2 * 8, 8};
        sl__ledger_add_run(&l, &run, NULL, 0, false);
    }
    cr_assert_eq(l.num, 2, "%zu runs wait", l.num);
    cr_assert_eq(l.got.runs.num, 0, "%zu runs merged before a notice came", l.got.runs.num);
    /* Split 0 (file 0) is done: a thousand batches came since the last
     * merge, so its notice is checked at once. */
    sl_split_done_t d = {.split_id = 0, .epoch = 0, .file_index = 0, .begin = 0, .end = 4000, .delivered = 4000};
    sl_provenance_run_t next = {0, 1, 4000, 8};
    sl__ledger_add_run(&l, &next, &d, 1, false);
    cr_assert_eq(l.ndone, 0, "%zu notices wait", l.ndone);
    cr_assert_eq(l.num, 0, "%zu runs wait after the merge", l.num);
    cr_assert_eq(sl_posbits_count(&l.got, 0, 0, 0, 4000), 4000);
    cr_assert_eq(sl_posbits_count(&l.got, 0, 1, 0, 4008), 4008);
    /* Split 1 (file 1) is done three batches later: its notice waits for
     * LEDGER_BATCHES batches since that merge. */
    for (uint64_t b = 1; b <= 3; b++) {
        sl_provenance_run_t run = {0, 1, 4000 + b * 8, 8};
        sl_split_done_t d1 = {.split_id = 1, .epoch = 0, .file_index = 1, .begin = 0, .end = 4032, .delivered = 4032};
        sl__ledger_add_run(&l, &run, &d1, b == 3, false);
    }
    cr_assert_eq(l.ndone, 1, "%zu notices wait", l.ndone);
    for (uint64_t b = 4; b < 8; b++) {
        sl_provenance_run_t run = {0, 1, 4000 + b * 8, 8};
        sl__ledger_add_run(&l, &run, NULL, 0, false);
    }
    cr_assert_eq(l.ndone, 1, "%zu notices wait after 7 batches", l.ndone);
    sl_provenance_run_t eighth = {0, 1, 4064, 8};
    sl__ledger_add_run(&l, &eighth, NULL, 0, false);
    cr_assert_eq(l.ndone, 0, "the notice still waits after %d batches", 8);
    cr_assert_eq(sl_posbits_count(&l.got, 0, 1, 0, 4032), 4032);
    /* Eight runs that wait are merged without a notice. */
    for (uint32_t f = 2; f < 2 + 8 * 2; f++) {
        sl_provenance_run_t run = {0, f, 0, 8};
        sl__ledger_add_run(&l, &run, NULL, 0, false);
    }
    cr_assert_lt(l.num, 8, "%zu runs wait", l.num);
    cr_assert_gt(l.got.runs.num, 2, "%zu runs merged", l.got.runs.num);
    sl__ledger_free(&l);
}

/* A split read in order waits as one run, also with the batches of a few
 * workers interleaved: each batch continues its worker's run. */
Test(ledger, a_split_read_in_order_waits_as_one_run)
{
    sl_ledger_t l;
    sl__ledger_init(&l, 1u << 16);
    size_t most = 0;
    for (uint64_t b = 0; b < 200; b++)
        for (uint32_t w = 0; w < 4; w++) {
            sl_provenance_run_t run = {0, w, b * 10, 10};
            sl__ledger_add_run(&l, &run, NULL, 0, false);
            most = l.num > most ? l.num : most;
        }
    cr_assert_leq(most, 4, "%zu runs waited for 4 splits read in order", most);
    /* Where a run of another epoch or file starts where one ended, it is
     * not that run's. */
    sl_provenance_run_t more = {0, 0, 2000, 5}, other_epoch = {1, 0, 2005, 5}, other_file = {0, 9, 2005, 5};
    size_t before = l.num;
    sl__ledger_add_run(&l, &more, NULL, 0, false);
    cr_assert_eq(l.num, before, "%zu runs wait, %zu before: a run that continues one is that run", l.num, before);
    sl__ledger_add_run(&l, &other_epoch, NULL, 0, false);
    sl__ledger_add_run(&l, &other_file, NULL, 0, false);
    cr_assert_eq(l.num, before + 2, "%zu runs wait, %zu before", l.num, before);
    sl_posset_t got;
    checkpoint_set(&l, &got);
    cr_assert_eq(got.num, 6, "%zu runs", got.num);
    cr_assert_eq(sl_posset_count(&got, 0, 0, 0, 2010), 2005);
    for (uint32_t w = 1; w < 4; w++)
        cr_assert_eq(sl_posset_count(&got, 0, w, 0, 2010), 2000);
    cr_assert_eq(sl_posset_count(&got, 1, 0, 0, 2010), 5);
    cr_assert_eq(sl_posset_count(&got, 0, 9, 0, 2010), 5);
    sl_posset_clear(&got);
    cr_assert_eq(l.rc, 0);
    sl__ledger_free(&l);
}

static sl_split_done_t notice(uint64_t i)
{
    return (sl_split_done_t){.epoch = (uint32_t)(i % 7), .file_index = (uint32_t)i, .begin = i, .end = i + 3,
                             .delivered = 2};
}

static void assert_notices(const sl_split_done_t *got, size_t n, uint64_t first)
{
    for (size_t i = 0; i < n; i++) {
        sl_split_done_t want = notice(first + i);
        cr_assert(got[i].epoch == want.epoch && got[i].file_index == want.file_index &&
                      got[i].begin == want.begin && got[i].end == want.end && got[i].delivered == want.delivered,
                  "notice %zu is not the %" PRIu64 "th appended", i, first + i);
    }
}

/* A notice at a time (the ledger's, per split) costs an allocation only
 * when the room doubles. */
Test(ledger, notices_appended_one_at_a_time_grow_their_room_by_doubling)
{
    sl_split_done_t *arr = NULL;
    size_t num = 0, cap = 0, grew = 0;
    for (uint64_t i = 0; i < 5000; i++) {
        sl_split_done_t d = notice(i);
        size_t before = cap;
        cr_assert_eq(sl__notices_append(&arr, &num, &cap, &d, 1), 0);
        grew += cap != before;
        cr_assert(cap >= num && (cap & (cap - 1)) == 0 && cap >= 16, "room %zu for %zu notices", cap, num);
    }
    cr_assert_eq(num, 5000);
    cr_assert_eq(grew, 10, "the room grew %zu times for 5,000 notices (16 to 8,192: 10)", grew);
    assert_notices(arr, num, 0);
    /* Emptied and refilled, as a sync empties the ledger's: no new room. */
    num = 0;
    sl_split_done_t many[40];
    for (int i = 0; i < 40; i++)
        many[i] = notice(100 + (uint64_t)i);
    cr_assert_eq(sl__notices_append(&arr, &num, &cap, many, 40), 0);
    cr_assert_eq(cap, 8192);
    assert_notices(arr, 40, 100);
    free(arr);
}

/* A batch keeps up to SL_BATCH_DONE_INLINE notices in itself; notices that
 * come after it move them to the heap, in order (ASan: the batch's own
 * room is never freed). */
Test(ledger, a_batch_moves_its_own_notices_to_the_heap_when_more_come)
{
    struct sl_batch *b = calloc(1, sizeof *b);
    cr_assert_not_null(b);
    b->done = b->done_one;
    for (int i = 0; i < SL_BATCH_DONE_INLINE; i++)
        b->done_one[i] = notice((uint64_t)i);
    b->num_done = SL_BATCH_DONE_INLINE;
    sl_split_done_t more[3] = {notice(SL_BATCH_DONE_INLINE), notice(SL_BATCH_DONE_INLINE + 1),
                               notice(SL_BATCH_DONE_INLINE + 2)};
    cr_assert_eq(sl__batch_add_notices(b, more, 2), 0);
    cr_assert(b->done != b->done_one);
    cr_assert_eq(b->num_done, SL_BATCH_DONE_INLINE + 2);
    cr_assert_eq(sl__batch_add_notices(b, more + 2, 1), 0);
    cr_assert_eq(b->num_done, SL_BATCH_DONE_INLINE + 3);
    assert_notices(b->done, b->num_done, 0);
    sl__batch_free(b);

    /* A batch that came with none. */
    b = calloc(1, sizeof *b);
    cr_assert_not_null(b);
    cr_assert_eq(sl__batch_add_notices(b, more, 3), 0);
    assert_notices(b->done, 3, SL_BATCH_DONE_INLINE);
    sl__batch_free(b);
}

/* Coordinated reads (sl__ledger_confirmed_below()): a long shuffled stream,
 * 2 epochs of 10 files of 100,000 records in splits of 1,000 mixed within a
 * window of 1,000, its batches of 100 going in turn to this consumer and to
 * a peer, each split's notice with the batch that holds its last record.
 * Without the dispatcher's place this consumer's ledger would hold a run
 * for about every other record it got, 500,000 and more, past its bound of
 * 50,000. With it, every 37 batches (the least split not read whole), the
 * ledger, eager or lazy, keeps what lies past the shuffle's tail only, and
 * a report says exactly what this consumer got at or past the place. */
enum { CE = 2, CF = 10, CR = 100000, CS = 1000, CW = 1000, CB = 100, CPER = CF * CR, CMAX = 50000 };

static sl_provenance_run_t cpos(uint64_t p)
{
    return (sl_provenance_run_t){(uint32_t)(p / CPER), (uint32_t)(p % CPER / CR), p % CR, 1};
}

/* The stream: `read` marks the positions drawn, `left` counts each split's
 * records not drawn yet, `next` is the first position not drawn. */
struct cstream {
    uint64_t rng, next, total, end;
    uint8_t *read;
    uint32_t *left;
};

static void cstream_init(struct cstream *s, unsigned seed)
{
    *s = (struct cstream){.rng = seed, .end = (uint64_t)CE * CPER};
    s->read = calloc(s->end, 1);
    s->left = malloc(s->end / CS * sizeof *s->left);
    cr_assert(s->read && s->left);
    for (uint64_t k = 0; k < s->end / CS; k++)
        s->left[k] = CS;
}

static void cstream_free(struct cstream *s)
{
    free(s->read);
    free(s->left);
}

/* The next batch, of at most CB records drawn within the window: their
 * positions and runs, the notices of the splits whose last record it holds
 * (*nd) and its tally (*nt rows). @return its records */
static size_t cstream_batch(struct cstream *s, uint64_t *pos, sl_provenance_run_t *runs, sl_split_done_t *done,
                            size_t *nd, sl_split_done_t *tally, size_t *nt)
{
    size_t n = 0;
    while (n < CB && s->total < s->end) {
        while (s->next < s->end && s->read[s->next])
            s->next++;
        uint64_t span = s->end - s->next < CW ? s->end - s->next : CW;
        uint64_t p = s->next + splitmix64(&s->rng) % span;
        while (s->read[p])
            p = p + 1 < s->end ? p + 1 : s->next;
        s->read[p] = 1;
        s->total++;
        pos[n] = p;
        runs[n++] = cpos(p);
        sl_provenance_run_t at = cpos(p / CS * CS);
        if (--s->left[p / CS] == 0)
            done[(*nd)++] = (sl_split_done_t){.split_id = p / CS, .epoch = at.epoch, .file_index = at.file_index,
                                              .begin = at.begin, .end = at.begin + CS, .delivered = CS};
        size_t j = 0;
        while (j < *nt && tally[j].split_id != p / CS)
            j++;
        if (j == *nt)
            tally[(*nt)++] = (sl_split_done_t){.split_id = p / CS, .epoch = at.epoch, .file_index = at.file_index,
                                               .begin = at.begin, .end = at.begin + CS};
        tally[j].delivered++;
    }
    return n;
}

/* The least position from `floor` on whose split was not drawn whole (the
 * stream's end when every one was). */
static uint64_t cstream_floor(const struct cstream *s, uint64_t floor)
{
    while (floor < s->end && s->left[floor / CS] == 0)
        floor += CS;
    return floor;
}

/* A report of l: exactly the positions mine marks at or past floor. */
static void assert_report_past(sl_ledger_t *l, const uint8_t *mine, uint64_t floor, uint64_t want, uint64_t *rng,
                               unsigned seed, const char *which)
{
    sl_posset_t set;
    cr_assert_eq(report_runs(l, 0, &set), 0, "seed %u, %s", seed, which);
    cr_assert_eq(sl_posset_size(&set), want, "seed %u, %s: the report holds %" PRIu64 " positions, not %" PRIu64, seed,
                 which, sl_posset_size(&set), want);
    uint64_t past = 0, end = (uint64_t)CE * CPER;
    for (uint64_t q = floor; q < end;) {
        sl_provenance_run_t at = cpos(q);
        past += sl_posset_count(&set, at.epoch, at.file_index, at.begin, CR);
        q += CR - at.begin;
    }
    cr_assert_eq(past, want, "seed %u, %s: the report holds positions before the place", seed, which);
    for (int i = 0; i < 200 && floor < end; i++) {
        uint64_t q = floor + splitmix64(rng) % (end - floor);
        sl_provenance_run_t at = cpos(q);
        cr_assert_eq(sl_posset_count(&set, at.epoch, at.file_index, at.begin, at.begin + 1), mine[q],
                     "seed %u, %s: position %" PRIu64, seed, which, q);
    }
    sl_posset_clear(&set);
}

Test(ledger, a_coordinated_consumer_keeps_only_what_lies_past_the_confirmed_place)
{
    unsigned seed = test_seed("ledger.a_coordinated_consumer_keeps_only...");
    struct cstream cs;
    cstream_init(&cs, seed);
    uint64_t end = cs.end;
    uint8_t *mine = calloc(end, 1);
    cr_assert(mine);
    sl_ledger_t eager, lazy;
    sl__ledger_init(&eager, CMAX);
    sl__ledger_init(&lazy, CMAX);
    uint64_t floor = 0, placed = 0, mine_total = 0, mine_below = 0, reports = 0;
    size_t most_runs = 0, most_kept = 0, most_open = 0;
    for (uint64_t batch = 0; cs.total < end; batch++) {
        sl_provenance_run_t runs[CB];
        sl_split_done_t done[CB], tally[CB];
        uint64_t pos[CB];
        size_t nd = 0, nt = 0, n = cstream_batch(&cs, pos, runs, done, &nd, tally, &nt);
        for (size_t i = 0; i < n && batch % 2 == 0; i++) {
            mine[pos[i]] = 1;
            mine_total++;
        }
        if (batch % 2 == 0) {
            /* This consumer's batch; the peer's go elsewhere, their notices too. */
            uint8_t *wire = NULL;
            size_t len = 0;
            cr_assert_eq(sl_provwire_encode(runs, n, &wire, &len), 0);
            sl__ledger_add(&eager, wire, len, n, done, nd, false);
            sl__ledger_add_tallied(&lazy, wire, len, n, tally, nt, done, nd, false);
            free(wire);
        }
        if (batch % 37 == 0) {
            floor = cstream_floor(&cs, floor);
            for (; placed < floor; placed++)
                mine_below += mine[placed];
            sl_provenance_run_t at = floor < end ? cpos(floor) : (sl_provenance_run_t){CE, 0, 0, 0};
            sl__ledger_confirmed_below(&eager, at.epoch, at.file_index, at.begin);
            sl__ledger_confirmed_below(&lazy, at.epoch, at.file_index, at.begin);
            /* A place not past the last one changes nothing. */
            sl__ledger_confirmed_below(&lazy, 0, 0, 0);
        }
        cr_assert_eq(eager.rc, 0, "seed %u: the eager ledger overflowed at batch %" PRIu64, seed, batch);
        cr_assert_eq(lazy.rc, 0, "seed %u: the lazy ledger overflowed at batch %" PRIu64, seed, batch);
        size_t held = sl__ledger_runs_held(&eager);
        most_runs = held > most_runs ? held : most_runs;
        most_kept = lazy.log_kept > most_kept ? lazy.log_kept : most_kept;
        most_open = lazy.open.num > most_open ? lazy.open.num : most_open;
        if (splitmix64(&cs.rng) % 400 == 0) {
            assert_report_past(&eager, mine, placed, mine_total - mine_below, &cs.rng, seed, "eager");
            assert_report_past(&lazy, mine, placed, mine_total - mine_below, &cs.rng, seed, "lazy");
            reports++;
        }
    }
    cr_assert_geq(reports, 10, "seed %u: %" PRIu64 " reports", seed, reports);
    cr_assert_eq(mine_total, end / 2, "seed %u", seed);
    /* The shuffle's tail: a split's last record leaves the window of 1,000
     * about 7,500 records after its first (past 40,000 with chance e^-30),
     * and the place comes every 3,700 records. */
    cr_assert_leq(most_runs, 20000, "seed %u: the ledger held %zu runs", seed, most_runs);
    cr_assert_leq(most_kept, 256 * 1024, "seed %u: the lazy ledger kept %zu bytes undecoded", seed, most_kept);
    /* The counts of splits whose notice went to the peer go with the
     * place, not at LAZY_MAX_KEYS: those past it, some 40 splits. */
    cr_assert_leq(most_open, 200, "seed %u: the lazy ledger counted %zu splits at once", seed, most_open);
    cr_log_info("seed %u: at most %zu runs held, %zu bytes kept undecoded, %zu splits counted", seed, most_runs,
                most_kept, most_open);
    /* Its checkpoint would leave out what was given before the place. */
    uint8_t *ckpt = NULL;
    size_t len = 0;
    char err[300] = "";
    cr_assert_eq(sl__ledger_checkpoint(&eager, 1, NULL, 0, &ckpt, &len, err, sizeof err), SL_EINVAL);
    cr_assert_null(ckpt);
    cr_assert(strstr(err, "coordinated reads only"), "%s", err);
    sl__ledger_free(&eager);
    sl__ledger_free(&lazy);
    cstream_free(&cs);
    free(mine);
}

/* A named job's ranks that checkpoint (sl__ledger_given_below()): the same
 * long shuffled stream as above, its batches of 100 going to 3 ranks at
 * random, each split's notice with the batch that holds its last record.
 * Every 37 batches the dispatcher's fold by place reaches every rank: the
 * least split not yet given whole (some records of later splits wait in
 * the shuffle's window). Without it each rank's ledger would hold a run for
 * about every record it got, some 660,000, past its bound of 50,000 (a
 * named job's ranks cannot drop what they were given on their own). With
 * it, no ledger overflows; and every so often the ranks checkpoint, the
 * checkpoints merge, and the merged one starts at the place (version 5)
 * and holds exactly what the ranks were given past it; a ledger restored
 * from it checkpoints the same bytes. */
enum { NRANKS = 3 };

/* Reads a checkpoint of dataset 42 (no key): its positions into *set, its place into *at. */
static void read_placed(const uint8_t *ckpt, size_t len, sl_posset_t *set, sl_posrun_t *at)
{
    uint8_t *posset = NULL;
    size_t plen = 0;
    uint64_t done = 0;
    char err[300];
    cr_assert_eq(sl__checkpoint_read(ckpt, len, 42, NULL, 0, SL_POSSET_MAX_RUNS, &posset, &plen, &done, at, err,
                                     sizeof err), 0, "%s", err);
    cr_assert_eq(done, at->epoch);
    sl_posset_init(set, SL_POSSET_MAX_RUNS);
    if (plen > 0)
        cr_assert_eq(sl_posset_decode(set, posset, plen, err, sizeof err), 0, "%s", err);
    free(posset);
}

/* The ranks checkpoint and merge: the merged checkpoint starts at `floor`
 * (a position of the stream) and holds exactly the positions given past it. */
static void assert_merged_past(sl_ledger_t *rank, const uint8_t *given, uint64_t floor, uint64_t want, uint64_t *rng,
                               unsigned seed)
{
    uint8_t *ck[NRANKS], *merged = NULL;
    size_t len[NRANKS], mlen = 0;
    char err[300];
    for (int r = 0; r < NRANKS; r++)
        cr_assert_eq(sl__ledger_checkpoint(&rank[r], 42, NULL, 0, &ck[r], &len[r], err, sizeof err), 0, "seed %u: %s",
                     seed, err);
    cr_assert_eq(sl__checkpoint_merge((const uint8_t *const *)ck, len, NRANKS, NULL, 0, SL_POSSET_MAX_RUNS, &merged,
                                      &mlen, err, sizeof err), 0, "seed %u: %s", seed, err);
    sl_posset_t set;
    sl_posrun_t at;
    read_placed(merged, mlen, &set, &at);
    sl_provenance_run_t want_at = floor < (uint64_t)CE * CPER ? cpos(floor) : (sl_provenance_run_t){CE, 0, 0, 0};
    cr_assert(at.epoch == want_at.epoch && at.file == want_at.file_index && at.begin == want_at.begin,
              "seed %u: the merged checkpoint starts at (%u, %u, %" PRIu64 "), not at position %" PRIu64, seed,
              at.epoch, at.file, at.begin, floor);
    cr_assert_eq(merged[4], floor % CPER ? 5 : 4, "seed %u: version %u", seed, merged[4]);
    cr_assert_eq(sl_posset_size(&set), want, "seed %u: it holds %" PRIu64 " positions past the place, not %" PRIu64,
                 seed, sl_posset_size(&set), want);
    if (set.num > 0)
        cr_assert(!sl_place_before(set.runs[0].epoch, set.runs[0].file, set.runs[0].begin, at.epoch, at.file, at.begin),
                  "seed %u: it holds positions before its place", seed);
    uint64_t end = (uint64_t)CE * CPER;
    for (int i = 0; i < 300 && floor < end; i++) {
        uint64_t q = floor + splitmix64(rng) % (end - floor);
        sl_provenance_run_t p = cpos(q);
        cr_assert_eq(sl_posset_count(&set, p.epoch, p.file_index, p.begin, p.begin + 1), given[q],
                     "seed %u: position %" PRIu64, seed, q);
    }
    /* Restored, it checkpoints the same bytes (what a resumed rank holds). */
    uint8_t *posset = NULL, *again = NULL;
    size_t plen = 0, alen = 0;
    uint64_t done = 0;
    cr_assert_eq(sl__checkpoint_read(merged, mlen, 42, NULL, 0, SL_POSSET_MAX_RUNS, &posset, &plen, &done, &at, err,
                                     sizeof err), 0, "%s", err);
    sl_ledger_t back;
    sl__ledger_init(&back, SL_POSSET_MAX_RUNS);
    cr_assert_eq(sl__ledger_restore(&back, posset, plen, at, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl__ledger_checkpoint(&back, 42, NULL, 0, &again, &alen, err, sizeof err), 0, "%s", err);
    cr_assert(alen == mlen && memcmp(again, merged, mlen) == 0, "seed %u: the restored ledger's checkpoint differs",
              seed);
    sl__ledger_free(&back);
    free(posset);
    free(again);
    sl_posset_clear(&set);
    free(merged);
    for (int r = 0; r < NRANKS; r++)
        free(ck[r]);
}

Test(ledger, the_ranks_of_a_named_job_keep_only_what_lies_past_the_given_place)
{
    unsigned seed = test_seed("ledger.the_ranks_of_a_named_job_keep_only...");
    struct cstream cs;
    cstream_init(&cs, seed);
    uint64_t end = cs.end;
    const uint8_t *given = cs.read; /* every record drawn is given to a rank's caller */
    sl_ledger_t rank[NRANKS];
    for (int r = 0; r < NRANKS; r++) {
        sl__ledger_init(&rank[r], CMAX);
        rank[r].named = true;
    }
    uint64_t floor = 0, placed = 0, given_below = 0, merges = 0;
    size_t most_runs = 0;
    /* Merges at batches drawn among the multiples of 37, at most 119 of
     * them apart: 4 or more in the stream's 20,000 batches whatever the
     * seed (a draw of each one alone made fewer than 3 about once in 160). */
    uint64_t merge_at = 37 * (1 + splitmix64(&cs.rng) % 119);
    for (uint64_t batch = 0; cs.total < end; batch++) {
        sl_provenance_run_t runs[CB];
        sl_split_done_t done[CB], tally[CB];
        uint64_t pos[CB];
        size_t nd = 0, nt = 0, n = cstream_batch(&cs, pos, runs, done, &nd, tally, &nt);
        /* Given to one rank's caller: ranks 0 and 2 lazy, rank 1 eager. */
        int r = (int)(splitmix64(&cs.rng) % NRANKS);
        uint8_t *wire = NULL;
        size_t len = 0;
        cr_assert_eq(sl_provwire_encode(runs, n, &wire, &len), 0);
        if (r == 1)
            sl__ledger_add(&rank[r], wire, len, n, done, nd, false);
        else
            sl__ledger_add_tallied(&rank[r], wire, len, n, tally, nt, done, nd, false);
        free(wire);
        /* The fold the ranks heard before this batch was made when it was
         * given: the ranks' checkpoints merge into one that starts there. */
        if (batch == merge_at) {
            assert_merged_past(rank, given, placed, cs.total - given_below, &cs.rng, seed);
            merges++;
            merge_at += 37 * (1 + splitmix64(&cs.rng) % 119);
        }
        if (batch % 37 == 0) {
            floor = cstream_floor(&cs, floor);
            for (; placed < floor; placed++)
                given_below += given[placed];
            sl_provenance_run_t at = floor < end ? cpos(floor) : (sl_provenance_run_t){CE, 0, 0, 0};
            for (int k = 0; k < NRANKS; k++)
                sl__ledger_given_below(&rank[k], at.epoch, at.file_index, at.begin);
            /* A place not past the last one changes nothing. */
            cr_assert_not(sl__ledger_given_below(&rank[0], 0, 0, 0));
        }
        size_t held = 0;
        for (int k = 0; k < NRANKS; k++) {
            cr_assert_eq(rank[k].rc, 0, "seed %u: rank %d's ledger overflowed at batch %" PRIu64, seed, k, batch);
            /* A rank gets few notices, so what it keeps undecoded is
             * decoded every CMAX / 16 records: its runs are known. */
            cr_assert_leq(rank[k].lazy_records, CMAX / 16 + CB, "seed %u: rank %d keeps %" PRIu64 " records undecoded",
                          seed, k, rank[k].lazy_records);
            held = sl__ledger_runs_held(&rank[k]) > held ? sl__ledger_runs_held(&rank[k]) : held;
        }
        most_runs = held > most_runs ? held : most_runs;
    }
    cr_assert_geq(merges, 4, "seed %u: %" PRIu64 " merges", seed, merges);
    cr_assert_leq(most_runs, 20000, "seed %u: a rank's ledger held %zu runs", seed, most_runs);
    cr_log_info("seed %u: at most %zu runs held by a rank, %" PRIu64 " merges checked", seed, most_runs, merges);
    /* At the end every split was given whole: the merge starts past the
     * stream, once a rank was given its end. */
    floor = cstream_floor(&cs, floor);
    for (int k = 0; k < NRANKS; k++)
        sl__ledger_given_below(&rank[k], CE, 0, 0);
    sl__ledger_add(&rank[0], NULL, 0, 0, NULL, 0, true);
    assert_merged_past(rank, given, floor, 0, &cs.rng, seed);
    for (int k = 0; k < NRANKS; k++)
        sl__ledger_free(&rank[k]);
    cstream_free(&cs);
}

Test(ledger, a_rank_of_a_named_job_decodes_what_it_keeps_as_it_goes)
{
    /* A rank of a named job given every other record of a split of
     * 200,000 (its peer the rest), in batches of 100 with their tallies and
     * no notice: none of its batches goes undecoded, and it decodes them
     * every max_runs / 16 records, so its runs (what its heartbeat says)
     * are known long before the bound; and they crowd into bitmaps. Another ledger (an anonymous job's,
     * a builder's) waits for its notices, up to its log's bound. */
    for (int named = 1; named >= 0; named--) {
        sl_ledger_t l;
        sl__ledger_init(&l, 160000);
        l.named = named;
        uint64_t most = 0;
        for (uint64_t b = 0; b < 1000; b++) {
            sl_provenance_run_t runs[100];
            for (int i = 0; i < 100; i++)
                runs[i] = (sl_provenance_run_t){0, 0, (b * 100 + (uint64_t)i) * 2, 1};
            sl_split_done_t tally[1] = {{.epoch = 0, .file_index = 0, .begin = 0, .end = 200000, .delivered = 100}};
            uint8_t *wire = NULL;
            size_t len = 0;
            cr_assert_eq(sl_provwire_encode(runs, 100, &wire, &len), 0);
            sl__ledger_add_tallied(&l, wire, len, 100, tally, 1, NULL, 0, false);
            free(wire);
            most = l.lazy_records > most ? l.lazy_records : most;
        }
        cr_assert_eq(l.rc, 0);
        if (named) {
            cr_assert_leq(most, 160000 / 16 + 100, "%" PRIu64 " records kept undecoded", most);
            uint64_t known = sl_posbits_size(&l.got);
            cr_assert_geq(known, 90000, "%" PRIu64 " records known", known);
            /* One a record as runs; as bitmaps, about a bit. */
            cr_assert_leq(sl__ledger_runs_held(&l), known / 64, "%zu runs held", sl__ledger_runs_held(&l));
        } else {
            cr_assert_gt(most, 160000 / 16 + 100, "another ledger waits for notices: %" PRIu64, most);
        }
        sl__ledger_free(&l);
    }
}

Test(ledger, a_fold_by_place_replays_from_a_delta)
{
    /* Two files of 1,000 positions given in shuffled runs of 10, a fold by
     * place after each 20 batches: a builder fed the deltas takes the
     * ledger's checkpoint bytes (version 5 once the place is within the
     * epoch), and a cut-short place record is refused by name. */
    uint64_t order[2000];
    shuffled_order(order, 2000, 5);
    sl_ledger_t l;
    sl__ledger_init(&l, 1000);
    sl_delta_log_t log = {0};
    sl_ckpt_builder_t *b;
    cr_assert_eq(sl_ckpt_builder_open(42, NULL, 1000, NULL, 0, &b), 0);
    char err[300];
    sl_posrun_t heard = {0};
    for (int batch = 0; batch < 100; batch++) {
        sl_provenance_run_t runs[20];
        for (int i = 0; i < 20; i++) {
            uint64_t p = order[batch * 20 + i];
            runs[i] = (sl_provenance_run_t){0, (uint32_t)(p / 1000), p % 1000, 1};
        }
        uint8_t *wire = NULL;
        size_t wlen = 0;
        cr_assert_eq(sl_provwire_encode(runs, 20, &wire, &wlen), 0);
        sl__ledger_add(&l, wire, wlen, 20, NULL, 0, false);
        sl__delta_log_batch(&log, wire, wlen, 20, NULL, 0, false);
        free(wire);
        if (batch % 20 == 1 && (heard.file > 0 || heard.begin > 0)) {
            /* The fold heard after the last batch was made with this one. */
            cr_assert(l.floor_set && l.floor.file == heard.file && l.floor.begin == heard.begin,
                      "batch %d: the floor is (%u, %" PRIu64 "), not the fold heard", batch, l.floor.file,
                      l.floor.begin);
        }
        if (batch % 20 == 19) {
            /* Somewhere behind what was given: the place of the least position not given. */
            uint64_t least = 2000;
            for (int k = (batch + 1) * 20; k < 2000; k++)
                least = order[k] < least ? order[k] : least;
            sl_posrun_t was = l.floor;
            heard = (sl_posrun_t){.file = (uint32_t)(least / 1000), .begin = least % 1000};
            if (sl__ledger_given_below(&l, 0, heard.file, heard.begin))
                sl__delta_log_given_below(&log, 0, heard.file, heard.begin);
            /* Not before the caller is given its next batch: a checkpoint
             * now holds the fold as it stood when it got this one. */
            cr_assert(memcmp(&l.floor, &was, sizeof was) == 0, "batch %d: the fold was made at once", batch);
        }
        uint8_t *delta = NULL;
        size_t dlen = 0;
        cr_assert_eq(sl__delta_log_take(&log, 42, &delta, &dlen, err, sizeof err), 0, "%s", err);
        if (batch == 39) {
            cr_assert_eq(sl_ckpt_builder_apply(b, delta, dlen - 1), SL_EDATA);
            cr_assert(strstr(sl_ckpt_builder_errmsg(b), "place fold record cut short"), "%s",
                      sl_ckpt_builder_errmsg(b));
        }
        cr_assert_eq(sl_ckpt_builder_apply(b, delta, dlen), 0, "%s", sl_ckpt_builder_errmsg(b));
        free(delta);
        assert_same_checkpoint(&l, b, (uint64_t)batch);
    }
    /* The end is given too: the last fold is made. */
    sl__ledger_add(&l, NULL, 0, 0, NULL, 0, true);
    sl__delta_log_batch(&log, NULL, 0, 0, NULL, 0, true);
    uint8_t *delta = NULL;
    size_t dlen = 0;
    cr_assert_eq(sl__delta_log_take(&log, 42, &delta, &dlen, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_ckpt_builder_apply(b, delta, dlen), 0, "%s", sl_ckpt_builder_errmsg(b));
    free(delta);
    assert_same_checkpoint(&l, b, 100);
    cr_assert(l.floor_given && l.floor_set);
    uint8_t *ck = NULL;
    size_t cklen = 0;
    cr_assert_eq(sl__ledger_checkpoint(&l, 42, NULL, 0, &ck, &cklen, err, sizeof err), 0, "%s", err);
    /* Every position was given: it starts past the last file (2, 0). */
    cr_assert_eq(ck[4], 5);
    /* A reader that cannot start within an epoch refuses it by name. */
    uint8_t *pos = NULL;
    size_t plen = 0;
    uint64_t done = 0;
    cr_assert_eq(sl__checkpoint_read(ck, cklen, 42, NULL, 0, 1000, &pos, &plen, &done, NULL, err, sizeof err),
                 SL_EINVAL);
    cr_assert(strstr(err, "epoch 0 file 2 record 0") && strstr(err, "cannot resume from"), "%s", err);
    free(ck);
    sl_ckpt_builder_close(b);
    sl__delta_log_free(&log);
    sl__ledger_free(&l);
}

/* A version 6 checkpoint's bytes changed at `at` (4 bytes, little-endian
 * v), its SHA-256 tag written again: a damage only the decoder can see. */
static int read_changed(const uint8_t *ckpt, size_t len, size_t at, uint32_t v, char *err, size_t errlen)
{
    uint8_t *c = malloc(len);
    memcpy(c, ckpt, len);
    for (int i = 0; i < 4; i++)
        c[at + (size_t)i] = (uint8_t)(v >> (8 * i));
    SHA256(c, len - 32, c + len - 32);
    uint8_t *pos = NULL;
    size_t plen = 0;
    sl_posrun_t place;
    int rc = sl__checkpoint_read(c, len, 42, NULL, 0, SL_POSSET_MAX_RUNS, &pos, &plen, &epochs_done, &place, err,
                                 errlen);
    free(pos);
    free(c);
    return rc;
}

Test(ledger, a_ranks_share_past_the_fold_checkpoints_as_bitmaps_and_the_shares_merge_whole)
{
    /* 2 to 6 ranks of a named job share 1.5 million records of two files,
     * shuffled within a window of 100,000, in turns of a batch of 256: each
     * holds about a run a record it got, more than its bound of 100,000
     * runs as runs. As bitmaps it holds a bit a position, checkpoints in
     * version 6, and the ranks' checkpoints merge into what they were given
     * together: at 60% of the stream, exactly that; at its end, every
     * record, one run a file. */
    uint64_t seed = test_seed("ledger::a_ranks_share_past_the_fold_checkpoints_as_bitmaps_and_the_shares_merge_whole");
    uint64_t rng = seed;
    enum { N = 1500000, HALF = N / 2, WINDOW = 100000, BATCH = 256, MAXR = 6 };
    unsigned ranks = 2 + (unsigned)(splitmix64(&rng) % (MAXR - 1));
    uint64_t *order = malloc(N * sizeof *order);
    uint8_t *given = calloc(N, 1);
    cr_assert(order && given);
    for (uint64_t i = 0; i < N; i++)
        order[i] = i;
    for (uint64_t i = 0; i + 1 < N; i++) {
        uint64_t j = i + splitmix64(&rng) % (N - i < WINDOW ? N - i : WINDOW), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    sl_ledger_t rank[MAXR];
    for (unsigned k = 0; k < ranks; k++) {
        sl__ledger_init(&rank[k], 100000);
        rank[k].named = true;
    }
    uint64_t at = 0, step = 0;
    for (int stage = 0; stage < 2; stage++) {
        uint64_t stop = stage == 0 ? N * 3 / 5 : N;
        for (; at < stop; step++) {
            sl_provenance_run_t runs[BATCH];
            size_t n = 0;
            for (; n < BATCH && at < stop; at++, n++) {
                /* Positions [0, HALF) are file 0's, the rest file 1's. */
                uint64_t p = order[at];
                runs[n] = (sl_provenance_run_t){0, p >= HALF, p % HALF, 1};
                given[p] = 1;
            }
            give(&rank[step % ranks], runs, n, NULL, 0, false);
        }
        uint8_t *ck[MAXR];
        size_t len[MAXR];
        char err[400];
        for (unsigned k = 0; k < ranks; k++) {
            cr_assert_eq(rank[k].rc, 0, "rank %u overflowed", k);
            cr_assert_eq(sl__ledger_checkpoint(&rank[k], 42, NULL, 0, &ck[k], &len[k], err, sizeof err), 0, "%s",
                         err);
            cr_assert_eq(ck[k][4], 6, "rank %u: version %u", k, ck[k][4]);
            /* A bit a position it spans, and a few runs' bytes. */
            cr_assert_lt(len[k], N / 8 + 200000, "rank %u: %zu bytes", k, len[k]);
        }
        uint8_t *merged = NULL;
        size_t mlen = 0;
        cr_assert_eq(sl__checkpoint_merge((const uint8_t *const *)ck, len, ranks, NULL, 0, 100000, &merged, &mlen,
                                          err, sizeof err),
                     0, "%s", err);
        uint8_t *pos = NULL;
        size_t plen = 0;
        sl_posrun_t place;
        cr_assert_eq(sl__checkpoint_read(merged, mlen, 42, NULL, 0, 100000, &pos, &plen, &epochs_done, &place, err,
                                         sizeof err),
                     0, "%s", err);
        sl_posset_t set;
        sl_posset_init(&set, 100000);
        cr_assert_eq(sl_posset_decode(&set, pos, plen, err, sizeof err), 0, "%s", err);
        uint64_t want = 0;
        for (uint64_t p = 0; p < N; p++) {
            want += given[p];
            uint32_t f = p >= HALF;
            if (p % 9973 == 0 || (stage == 0 && p % 7 == 0))
                cr_assert_eq(sl_posset_count(&set, 0, f, p % HALF, p % HALF + 1), given[p],
                             "record %" PRIu64 " (seed %" PRIu64 ")", p, seed);
        }
        cr_assert_eq(sl_posset_size(&set), want, "(seed %" PRIu64 ")", seed);
        if (stage == 1)
            cr_assert_eq(set.num, 2, "every record of both files: %zu runs", set.num);
        /* One rank's checkpoint alone, as runs far past the bound, restores
         * all the same: its bytes for the restore are version 3, and the
         * restored ledger keeps them as bitmaps. */
        if (stage == 0) {
            uint8_t *one = NULL;
            size_t olen = 0;
            cr_assert_eq(sl__checkpoint_read(ck[0], len[0], 42, NULL, 0, 100000, &one, &olen, &epochs_done, &place,
                                             err, sizeof err),
                         0, "%s", err);
            cr_assert_eq(one[4], 3, "a rank's share for the restore: version %u", one[4]);
            sl_ledger_t back;
            sl__ledger_init(&back, 100000);
            cr_assert_eq(sl__ledger_restore(&back, one, olen, place, err, sizeof err), 0, "%s", err);
            cr_assert_lt(sl__ledger_runs(&back), 100000);
            uint64_t mine = 0;
            for (uint64_t p = 0; p < N; p++)
                if (p % 9973 == 0)
                    cr_assert_eq(sl_posbits_count(&back.restored, 0, p >= HALF, p % HALF, p % HALF + 1),
                                 sl_posbits_count(&rank[0].got, 0, p >= HALF, p % HALF, p % HALF + 1));
            mine = sl_posbits_size(&rank[0].got);
            cr_assert_eq(sl_posbits_size(&back.restored), mine);
            sl__ledger_free(&back);
            free(one);
        }
        /* Damage only the decoder sees: refused by name. */
        if (stage == 0) {
            uint8_t *c = ck[0];
            size_t fixed = 16 + 8 + 8 + 16, nb = (size_t)sl_get_le64(c + fixed + 8);
            cr_assert_gt(nb, 1);
            struct {
                size_t at;
                uint32_t v;
                const char *says;
            } bad[] = {
                {fixed + 8, 0xfffffff, "bitmaps do not fit"},
                {fixed + 16 + 8, 0x7fffffff, "not after the one before it"},
                {fixed, 1, "more than the 1 it says it holds"},
            };
            for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                cr_assert_eq(read_changed(c, len[0], bad[i].at, bad[i].v, err, sizeof err), SL_EDATA);
                cr_assert(strstr(err, bad[i].says), "\"%s\" does not say \"%s\"", err, bad[i].says);
            }
            /* An empty bitmap: its words cleared one u32 at a time. */
            uint8_t *e = malloc(len[0]);
            memcpy(e, c, len[0]);
            memset(e + fixed + 16 + 16, 0, 8 * SL_POSBITS_WORDS);
            cr_assert_eq(read_changed(e, len[0], fixed + 16 + 16, 0, err, sizeof err), SL_EDATA);
            cr_assert(strstr(err, "bitmap 1 of") && strstr(err, "is empty"), "%s", err);
            free(e);
        }
        sl_posset_clear(&set);
        free(pos);
        free(merged);
        for (unsigned k = 0; k < ranks; k++)
            free(ck[k]);
    }
    for (unsigned k = 0; k < ranks; k++)
        sl__ledger_free(&rank[k]);
    free(order);
    free(given);
}
