/*
 * test_posset.c: position sets (protocol/posset.c) against a bitmap model:
 * random adds in and out of order, counts, clipped runs, the run limit,
 * and the byte form, including damaged bytes.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "posset.h"
#include "sluice.h"

#define EPOCHS 2
#define FILES 3
#define RECORDS 200

static bool model[EPOCHS][FILES][RECORDS];

static void check_invariants(const sl_posset_t *s)
{
    for (size_t i = 0; i < s->num; i++) {
        cr_assert_gt(s->runs[i].count, 0);
        if (i == 0)
            continue;
        const sl_posrun_t *a = &s->runs[i - 1], *b = &s->runs[i];
        bool ordered = a->epoch < b->epoch || (a->epoch == b->epoch && a->file < b->file) ||
                       (a->epoch == b->epoch && a->file == b->file && a->begin + a->count < b->begin);
        cr_assert(ordered, "runs %zu and %zu are not sorted, disjoint and apart", i - 1, i);
    }
}

static void check_model(const sl_posset_t *s)
{
    uint64_t total = 0;
    for (int e = 0; e < EPOCHS; e++)
        for (int f = 0; f < FILES; f++)
            for (int r = 0; r < RECORDS; r++) {
                total += model[e][f][r];
                cr_assert_eq(sl_posset_count(s, (uint32_t)e, (uint32_t)f, (uint64_t)r, (uint64_t)r + 1),
                             model[e][f][r], "position (%d, %d, %d)", e, f, r);
            }
    cr_assert_eq(sl_posset_size(s), total);
}

Test(posset, random_adds_match_a_bitmap)
{
    sl_posset_t s;
    sl_posset_init(&s, 100000);
    memset(model, 0, sizeof model);
    srand(7);
    for (int i = 0; i < 3000; i++) {
        uint32_t e = (uint32_t)(rand() % EPOCHS), f = (uint32_t)(rand() % FILES);
        uint64_t b = (uint64_t)(rand() % RECORDS), n = (uint64_t)(1 + rand() % 8);
        if (b + n > RECORDS)
            n = RECORDS - b;
        uint64_t want = 0, overlap = 99;
        for (uint64_t r = b; r < b + n; r++)
            want += model[e][f][r];
        cr_assert_eq(sl_posset_add(&s, e, f, b, n, &overlap), 0);
        cr_assert_eq(overlap, want, "add %d: overlap", i);
        for (uint64_t r = b; r < b + n; r++)
            model[e][f][r] = true;
        check_invariants(&s);
        if (i % 300 == 0)
            check_model(&s);
    }
    check_model(&s);
    /* Ranges count what they hold; within() clips to the range. */
    sl_posrun_t out[RECORDS];
    size_t n = sl_posset_within(&s, 1, 2, 50, 150, out, RECORDS);
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        cr_assert(out[i].begin >= 50 && out[i].begin + out[i].count <= 150);
        sum += out[i].count;
    }
    cr_assert_eq(sum, sl_posset_count(&s, 1, 2, 50, 150));
    sl_posset_clear(&s);
}

/* 4,000 random steps on an empty set against the bitmap: a run of up to 20
 * records added, or, one step in one_in, drop() at a random place (from the
 * set and the model alike); the runs stay sorted, disjoint and apart. */
static void adds_and_drops(sl_posset_t *s, unsigned seed, int one_in,
                           void (*drop)(sl_posset_t *, uint32_t, uint32_t, uint64_t))
{
    sl_posset_init(s, 100000);
    memset(model, 0, sizeof model);
    srand(seed);
    for (int i = 0; i < 4000; i++) {
        uint32_t e = (uint32_t)(rand() % EPOCHS), f = (uint32_t)(rand() % FILES);
        if (rand() % one_in == 0) {
            drop(s, e, f, (uint64_t)(rand() % (RECORDS + 2)));
        } else {
            uint64_t b = (uint64_t)(rand() % RECORDS), n = (uint64_t)(1 + rand() % 20);
            if (b + n > RECORDS)
                n = RECORDS - b;
            cr_assert_eq(sl_posset_add(s, e, f, b, n, NULL), 0);
            for (uint64_t r = b; r < b + n; r++)
                model[e][f][r] = true;
        }
        check_invariants(s);
        if (i % 200 == 0)
            check_model(s);
    }
    check_model(s);
}

static void drop_before(sl_posset_t *s, uint32_t e, uint32_t f, uint64_t pos)
{
    sl_posset_drop_before(s, e, f, pos);
    for (uint32_t de = 0; de < EPOCHS; de++)
        for (uint32_t df = 0; df < FILES; df++)
            for (uint64_t r = 0; r < RECORDS; r++)
                if (de < e || (de == e && (df < f || (df == f && r < pos))))
                    model[de][df][r] = false;
}

Test(posset, drops_before_a_place_match_a_bitmap)
{
    sl_posset_t s;
    adds_and_drops(&s, 13, 8, drop_before);
    /* Before a place past every run: nothing is left. */
    sl_posset_drop_before(&s, EPOCHS, 0, 0);
    cr_assert_eq(s.num, 0);
    sl_posset_clear(&s);
}

Test(posset, in_order_runs_coalesce_into_one)
{
    sl_posset_t s;
    sl_posset_init(&s, 4);
    for (uint64_t b = 0; b < 1000; b += 10)
        cr_assert_eq(sl_posset_add(&s, 0, 0, b, 10, NULL), 0);
    cr_assert_eq(s.num, 1);
    cr_assert_eq(s.runs[0].count, 1000);
    /* A gap filled later merges the two sides. */
    cr_assert_eq(sl_posset_add(&s, 0, 0, 1010, 5, NULL), 0);
    cr_assert_eq(s.num, 2);
    cr_assert_eq(sl_posset_add(&s, 0, 0, 1000, 10, NULL), 0);
    cr_assert_eq(s.num, 1);
    cr_assert_eq(s.runs[0].count, 1015);
    sl_posset_clear(&s);
}

Test(posset, an_add_over_the_limit_changes_nothing)
{
    sl_posset_t s;
    sl_posset_init(&s, 2);
    cr_assert_eq(sl_posset_add(&s, 0, 0, 0, 1, NULL), 0);
    cr_assert_eq(sl_posset_add(&s, 0, 0, 5, 1, NULL), 0);
    cr_assert_eq(sl_posset_add(&s, 0, 0, 9, 1, NULL), -ENOSPC);
    cr_assert_eq(s.num, 2);
    cr_assert_eq(sl_posset_size(&s), 2);
    /* Merging needs no new run: still fine at the limit. */
    cr_assert_eq(sl_posset_add(&s, 0, 0, 1, 4, NULL), 0);
    cr_assert_eq(s.num, 1);
    sl_posset_clear(&s);
}

static uint8_t *encode(const sl_posset_t *s, size_t *len)
{
    *len = sl_posset_encode(s, NULL, 0);
    uint8_t *buf = malloc(*len + 1);
    cr_assert_not_null(buf);
    cr_assert_eq(sl_posset_encode(s, buf, *len), *len);
    return buf;
}

Test(posset, bytes_round_trip_and_damage_is_refused)
{
    sl_posset_t s, t;
    sl_posset_init(&s, 100);
    sl_posset_init(&t, 100);
    cr_assert_eq(sl_posset_add(&s, 0, 1, 10, 5, NULL), 0);
    cr_assert_eq(sl_posset_add(&s, 0, 1, 16, 1, NULL), 0);
    cr_assert_eq(sl_posset_add(&s, 0, 4, 0, 3, NULL), 0);
    cr_assert_eq(sl_posset_add(&s, 2, 0, UINT64_MAX - 7, 7, NULL), 0);
    size_t need;
    uint8_t *buf = encode(&s, &need);
    char err[256];
    cr_assert_eq(sl_posset_decode(&t, buf, need, err, sizeof err), 0, "%s", err);
    cr_assert_eq(t.num, 4);
    cr_assert_eq(memcmp(t.runs, s.runs, 4 * sizeof *s.runs), 0);
    /* Cut short, a byte left over, foreign, a version it does not know:
     * each refused by name, t unchanged. */
    cr_assert_eq(sl_posset_decode(&t, buf, need - 1, err, sizeof err), SL_EDATA);
    cr_assert(strstr(err, "cut short"), "%s", err);
    buf[need] = 0;
    cr_assert_eq(sl_posset_decode(&t, buf, need + 1, err, sizeof err), SL_EDATA);
    cr_assert(strstr(err, "left over"), "%s", err);
    buf[0] = 'X';
    cr_assert_eq(sl_posset_decode(&t, buf, need, err, sizeof err), SL_EDATA);
    cr_assert(strstr(err, "no \"SLPS\" header"), "%s", err);
    buf[0] = 'S';
    buf[4] = 4;
    cr_assert_eq(sl_posset_decode(&t, buf, need, err, sizeof err), SL_EDATA);
    cr_assert(strstr(err, "version 4"), "%s", err);
    buf[4] = 2;
    /* More runs than the bytes can hold, or than the limit: refused before
     * anything is allocated. */
    buf[8] = 200;
    cr_assert_eq(sl_posset_decode(&t, buf, need, err, sizeof err), SL_EDATA);
    cr_assert(strstr(err, "cannot hold"), "%s", err);
    buf[8] = 4;
    sl_posset_t small;
    sl_posset_init(&small, 3);
    cr_assert_eq(sl_posset_decode(&small, buf, need, err, sizeof err), -ENOSPC);
    cr_assert_eq(t.num, 4);
    free(buf);

    /* A last run that would end past 2^64 - 1. */
    uint8_t wrap[] = {'S', 'L', 'P', 'S', 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
                      1, 0, 0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01, 1};
    cr_assert_eq(sl_posset_decode(&t, wrap, sizeof wrap, err, sizeof err), SL_EDATA);
    cr_assert(strstr(err, "run 0"), "%s", err);
    /* A first run that says "the same file as the run before". */
    uint8_t first[] = {'S', 'L', 'P', 'S', 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 5, 1};
    cr_assert_eq(sl_posset_decode(&t, first, sizeof first, err, sizeof err), SL_EDATA);
    cr_assert(strstr(err, "run 0"), "%s", err);
    sl_posset_clear(&s);
    sl_posset_clear(&t);
}

Test(posset, version_1_bytes_still_decode)
{
    /* Checkpoints and stores written before version 2 hold every run in
     * full: (u32 epoch, u32 file, u64 begin, u64 count). */
    uint8_t v1[16 + 48] = {'S', 'L', 'P', 'S', 1, 0, 0, 0, 2};
    uint8_t *r = v1 + 16;
    r[4] = 1, r[8] = 10, r[16] = 5;            /* (0, 1, [10, 15)) */
    r[24] = 2, r[24 + 16] = 7;                 /* (2, 0, [0, 7)) */
    sl_posset_t t;
    sl_posset_init(&t, 100);
    char err[256];
    cr_assert_eq(sl_posset_decode(&t, v1, sizeof v1, err, sizeof err), 0, "%s", err);
    cr_assert_eq(t.num, 2);
    cr_assert(t.runs[0].file == 1 && t.runs[0].begin == 10 && t.runs[0].count == 5);
    cr_assert(t.runs[1].epoch == 2 && t.runs[1].count == 7);
    /* Out of order: the second run first, twice. */
    memcpy(r, r + 24, 24);
    cr_assert_eq(sl_posset_decode(&t, v1, sizeof v1, err, sizeof err), SL_EDATA);
    cr_assert(strstr(err, "run 1"), "%s", err);
    cr_assert_eq(sl_posset_decode(&t, v1, sizeof v1 - 1, err, sizeof err), SL_EDATA);
    cr_assert(strstr(err, "cannot hold"), "%s", err);
    sl_posset_clear(&t);
}

Test(posset, a_shuffles_holes_take_about_three_bytes_a_run)
{
    /* What a client received of 400,000 records while a shuffle buffer of
     * 100,000 still held a random half of the last 200,000: about 100,000
     * runs over 3 files and 2 epochs, which round-trip. */
    sl_posset_t s, t;
    sl_posset_init(&s, 1u << 20);
    sl_posset_init(&t, 1u << 20);
    srand(3);
    for (uint32_t e = 0; e < 2; e++)
        for (uint32_t f = 0; f < 3; f += 2) {
            cr_assert_eq(sl_posset_add(&s, e, f, 0, 200000, NULL), 0);
            for (uint64_t k = 200000; k < 400000; k++)
                if (rand() % 2)
                    cr_assert_eq(sl_posset_add(&s, e, f, k, 1, NULL), 0);
        }
    size_t len;
    uint8_t *buf = encode(&s, &len);
    cr_assert_gt(s.num, 150000);
    cr_assert_lt(len, 16 + 3 * s.num + 32, "%zu runs took %zu bytes", s.num, len);
    char err[256];
    cr_assert_eq(sl_posset_decode(&t, buf, len, err, sizeof err), 0, "%s", err);
    cr_assert_eq(t.num, s.num);
    cr_assert_eq(memcmp(t.runs, s.runs, s.num * sizeof *s.runs), 0);
    free(buf);
    sl_posset_clear(&s);
    sl_posset_clear(&t);
}

/* A random run over a few epochs and files; begins cluster near a moving
 * frontier, as a shuffled stream's do, with some far behind it. */
static sl_posrun_t random_run(uint64_t frontier)
{
    sl_posrun_t r = {(uint32_t)(rand() % EPOCHS), (uint32_t)(rand() % FILES), 0,
                     (uint64_t)(rand() % 20 ? rand() % 6 : rand() % 200)};
    uint64_t back = (uint64_t)(rand() % 10 == 0 ? rand() % 5000 : rand() % 300);
    r.begin = frontier > back ? frontier - back : 0;
    return r;
}

static void assert_same_set(const sl_posset_t *got, const sl_posset_t *want, int round)
{
    check_invariants(got);
    cr_assert_eq(got->num, want->num, "round %d: %zu runs, the one-at-a-time set has %zu", round, got->num,
                 want->num);
    for (size_t i = 0; i < got->num; i++) {
        const sl_posrun_t *a = &got->runs[i], *b = &want->runs[i];
        cr_assert(a->epoch == b->epoch && a->file == b->file && a->begin == b->begin && a->count == b->count,
                  "round %d run %zu: (%u, %u, %lu, +%lu), one at a time (%u, %u, %lu, +%lu)", round, i, a->epoch,
                  a->file, (unsigned long)a->begin, (unsigned long)a->count, b->epoch, b->file,
                  (unsigned long)b->begin, (unsigned long)b->count);
    }
}

Test(posset, add_many_matches_one_at_a_time_on_random_batches)
{
    sl_posset_t many, one;
    sl_posset_init(&many, 1000000);
    sl_posset_init(&one, 1000000);
    srand(11);
    sl_posrun_t batch[600];
    uint64_t frontier = 0;
    for (int round = 0; round < 400; round++) {
        size_t n = (size_t)(rand() % 600);
        for (size_t i = 0; i < n; i++)
            batch[i] = random_run(frontier + (uint64_t)(rand() % 400));
        /* Sometimes an in-order batch (the sorted path), sometimes more
         * files than a batch coalesces by bitmap (the sort). */
        if (round % 7 == 0)
            for (size_t i = 0; i < n; i++)
                batch[i] = (sl_posrun_t){1, 2, frontier + 3 * i, 2};
        if (round % 7 == 3)
            for (size_t i = 0; i < n; i++)
                batch[i].file = (uint32_t)(rand() % 40);
        frontier += 150;
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(sl_posset_add(&one, batch[i].epoch, batch[i].file, batch[i].begin, batch[i].count, NULL), 0);
        cr_assert_eq(sl_posset_add_many(&many, batch, n), 0, "round %d", round);
        assert_same_set(&many, &one, round);
    }
    cr_assert_gt(many.num, 100, "the test should build a set of many runs (%zu)", many.num);
    sl_posset_clear(&many);
    sl_posset_clear(&one);
}

Test(posset, add_many_matches_a_bitmap_with_overlaps_inside_the_batch)
{
    sl_posset_t s;
    sl_posset_init(&s, 100000);
    memset(model, 0, sizeof model);
    srand(3);
    for (int round = 0; round < 300; round++) {
        sl_posrun_t batch[40];
        size_t n = (size_t)(rand() % 40);
        for (size_t i = 0; i < n; i++) {
            uint64_t b = (uint64_t)(rand() % RECORDS), c = (uint64_t)(rand() % 12);
            if (b + c > RECORDS)
                c = RECORDS - b;
            batch[i] = (sl_posrun_t){(uint32_t)(rand() % EPOCHS), (uint32_t)(rand() % FILES), b, c};
            for (uint64_t r = b; r < b + c; r++)
                model[batch[i].epoch][batch[i].file][r] = true;
        }
        cr_assert_eq(sl_posset_add_many(&s, batch, n), 0);
        check_invariants(&s);
        if (round % 30 == 0)
            check_model(&s);
    }
    check_model(&s);
    sl_posset_clear(&s);
}

Test(posset, add_many_takes_provenance_runs_and_refuses_what_does_not_fit)
{
    sl_posset_t s;
    sl_posset_init(&s, 3);
    /* sl_provenance_run_t has the layout; the batch fills a gap and
     * merges three runs into one. */
    cr_assert_eq(sl_posset_add(&s, 0, 0, 0, 2, NULL), 0);
    cr_assert_eq(sl_posset_add(&s, 0, 0, 5, 2, NULL), 0);
    cr_assert_eq(sl_posset_add(&s, 0, 0, 9, 2, NULL), 0);
    sl_provenance_run_t fill[] = {{0, 0, 7, 2}, {0, 0, 2, 3}, {0, 0, 3, 0}};
    cr_assert_eq(sl_posset_add_many(&s, fill, 3), 0);
    cr_assert_eq(s.num, 1);
    cr_assert_eq(s.runs[0].count, 11);
    /* Four new runs do not fit in three: the set is unchanged. */
    sl_provenance_run_t apart[] = {{1, 0, 0, 1}, {1, 0, 2, 1}, {1, 0, 4, 1}};
    cr_assert_eq(sl_posset_add_many(&s, apart, 3), -ENOSPC);
    cr_assert_eq(s.num, 1);
    cr_assert_eq(sl_posset_size(&s), 11);
    /* A run ending past 2^64 is refused, the set unchanged. */
    sl_provenance_run_t wrap[] = {{0, 0, 20, 1}, {0, 1, UINT64_MAX - 1, 5}};
    cr_assert_eq(sl_posset_add_many(&s, wrap, 2), -EOVERFLOW);
    cr_assert_eq(s.num, 1);
    cr_assert_eq(sl_posset_add_many(&s, NULL, 0), 0);
    sl_posset_clear(&s);
}

/* What handout.c steps over at once: the end of the run that holds a
 * position, however long (attack 5 of issue 15: one run of 2^62). */
Test(posset, covered_to_is_the_end_of_the_run_that_holds_a_position)
{
    sl_posset_t s;
    sl_posset_init(&s, 16);
    cr_assert_eq(sl_posset_add(&s, 0, 0, 0, 1ull << 62, NULL), 0);
    cr_assert_eq(sl_posset_add(&s, 0, 1, 100, 50, NULL), 0);
    cr_assert_eq(sl_posset_covered_to(&s, 0, 0, 0), 1ull << 62);
    cr_assert_eq(sl_posset_covered_to(&s, 0, 0, 12345), 1ull << 62);
    cr_assert_eq(sl_posset_covered_to(&s, 0, 0, 1ull << 62), 1ull << 62, "not in the set: itself");
    cr_assert_eq(sl_posset_covered_to(&s, 0, 1, 99), 99);
    cr_assert_eq(sl_posset_covered_to(&s, 0, 1, 100), 150);
    cr_assert_eq(sl_posset_covered_to(&s, 0, 1, 149), 150);
    cr_assert_eq(sl_posset_covered_to(&s, 0, 1, 150), 150);
    cr_assert_eq(sl_posset_covered_to(&s, 1, 0, 5), 5, "another epoch");
    sl_posset_clear(&s);
}
