/*
 * test_posbits.c: position sets with bitmap blocks (protocol/posbits.c)
 * against plain position sets (posset.c, tested on its own): seeded random
 * adds, bitmaps, drops and counts; the bound, and that a refused add
 * changes nothing; and the size a rank of a named job holds at user sizes.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "le.h"
#include "posbits.h"
#include "sluice.h"
#include "seed_util.h"

#define EPOCHS 2
#define FILES 3
#define SPAN 60000 /* positions of a file drawn from: about 15 blocks */

static void check_invariants(const sl_posbits_t *b)
{
    cr_assert_leq(sl_posbits_units(b), b->max_units);
    for (size_t k = 0; k < b->nblocks; k++) {
        const sl_posblock_t *x = &b->blocks[k];
        bool any = false;
        for (unsigned i = 0; i < SL_POSBITS_WORDS; i++)
            any |= x->w[i] != 0;
        cr_assert(any, "block %zu is empty", k);
        if (k > 0) {
            const sl_posblock_t *p = &b->blocks[k - 1];
            bool ordered = p->epoch < x->epoch || (p->epoch == x->epoch && p->file < x->file) ||
                           (p->epoch == x->epoch && p->file == x->file && p->no < x->no);
            cr_assert(ordered, "blocks %zu and %zu are out of order", k - 1, k);
        }
        uint64_t base = x->no * SL_POSBITS_BLOCK;
        cr_assert_eq(sl_posset_count(&b->runs, x->epoch, x->file, base, base + SL_POSBITS_BLOCK), 0,
                     "a run reaches into block %zu", k);
    }
}

/* b holds what ref holds: the same runs, size and counts. */
static void check_same(const sl_posbits_t *b, const sl_posset_t *ref, uint64_t *rng)
{
    check_invariants(b);
    sl_posrun_t *runs = NULL;
    size_t n = 0;
    cr_assert_eq(sl_posbits_runs(b, 0, &runs, &n), 0);
    cr_assert_eq(n, ref->num, "%zu runs, the model has %zu", n, ref->num);
    for (size_t i = 0; i < n; i++)
        cr_assert(memcmp(&runs[i], &ref->runs[i], sizeof runs[i]) == 0,
                  "run %zu: (%u, %u, %llu, %llu), the model's (%u, %u, %llu, %llu)", i, runs[i].epoch,
                  runs[i].file, (unsigned long long)runs[i].begin, (unsigned long long)runs[i].count,
                  ref->runs[i].epoch, ref->runs[i].file, (unsigned long long)ref->runs[i].begin,
                  (unsigned long long)ref->runs[i].count);
    free(runs);
    cr_assert_eq(sl_posbits_size(b), sl_posset_size(ref));
    for (int q = 0; q < 20; q++) {
        uint32_t e = (uint32_t)(splitmix64(rng) % EPOCHS), f = (uint32_t)(splitmix64(rng) % FILES);
        uint64_t lo = splitmix64(rng) % SPAN, hi = lo + splitmix64(rng) % (SPAN / 3);
        cr_assert_eq(sl_posbits_count(b, e, f, lo, hi), sl_posset_count(ref, e, f, lo, hi),
                     "count of [%llu, %llu) of (%u, %u)", (unsigned long long)lo, (unsigned long long)hi, e, f);
        /* The runs within: a split's skips (more than a chunk of 64 runs
         * apart from the blocks between them, and at most max written). */
        sl_posrun_t got[200], want[200];
        size_t max = (size_t)(splitmix64(rng) % 200);
        size_t ng = sl_posbits_within(b, e, f, lo, hi, got, max), nw = sl_posset_within(ref, e, f, lo, hi, want, max);
        cr_assert_eq(ng, nw, "%zu runs within [%llu, %llu) of (%u, %u), the model has %zu", ng,
                     (unsigned long long)lo, (unsigned long long)hi, e, f, nw);
        cr_assert(memcmp(got, want, (ng < max ? ng : max) * sizeof *got) == 0, "the runs within [%llu, %llu)",
                  (unsigned long long)lo, (unsigned long long)hi);
        /* Where the stretch from a position ends: from a random one and
         * from inside one of the set's runs, which may go on through blocks. */
        uint64_t p = lo;
        if (ref->num > 0 && q % 2) {
            const sl_posrun_t *r = &ref->runs[splitmix64(rng) % ref->num];
            e = r->epoch, f = r->file, p = r->begin + splitmix64(rng) % r->count;
        }
        cr_assert_eq(sl_posbits_covered_to(b, e, f, p), sl_posset_covered_to(ref, e, f, p),
                     "covered from %llu of (%u, %u)", (unsigned long long)p, e, f);
    }
}

/* b's bytes (posset.h's version 3) read back as ref's set, whole and
 * within random ranges. */
static void check_wire(const sl_posbits_t *b, const sl_posset_t *ref, uint64_t *rng)
{
    static const size_t keeps[] = {0, 1, SL_POSBITS_DENSE, 176, 100000};
    size_t keep = keeps[splitmix64(rng) % 5];
    uint8_t *buf = NULL;
    size_t len = 0;
    char err[256];
    cr_assert_eq(sl_posbits_encode(b, keep, &buf, &len), 0);
    sl_posset_t back;
    sl_posset_init(&back, SL_POSSET_MAX_RUNS);
    cr_assert_eq(sl_posset_decode(&back, buf, len, err, sizeof err), 0, "%s", err);
    cr_assert_eq(back.num, ref->num);
    cr_assert(ref->num == 0 || memcmp(back.runs, ref->runs, ref->num * sizeof *ref->runs) == 0);
    /* What a reader of the set's bound takes: version 2 where its runs fit
     * the bound (every reader's), version 3 past it; the same set both ways. */
    sl_posbits_t bounded;
    sl_posbits_init(&bounded, 1 + (size_t)(splitmix64(rng) % (2 * ref->num + 2)));
    int rc = sl_posbits_add_set(&bounded, b, 0);
    if (rc == 0) {
        uint8_t *bytes = NULL;
        size_t blen = 0;
        cr_assert_eq(sl_posbits_bytes(&bounded, &bytes, &blen), 0);
        cr_assert_eq(sl_get_le32(bytes + 4), ref->num <= bounded.max_units ? 2u : 3u, "version for %zu runs, bound %zu",
                     ref->num, bounded.max_units);
        sl_posset_clear(&back);
        sl_posset_init(&back, SL_POSSET_MAX_RUNS);
        cr_assert_eq(sl_posset_decode(&back, bytes, blen, err, sizeof err), 0, "%s", err);
        cr_assert_eq(back.num, ref->num);
        cr_assert(ref->num == 0 || memcmp(back.runs, ref->runs, ref->num * sizeof *ref->runs) == 0);
        free(bytes);
    } else {
        cr_assert_eq(rc, -ENOSPC);
    }
    sl_posbits_clear(&bounded);
    /* Within ranges: what of the set lies in them, and nothing else. */
    sl_posrun_t ranges[8];
    size_t nr = (size_t)(splitmix64(rng) % 9);
    uint64_t at = 0;
    uint32_t e = 0, f = 0;
    for (size_t i = 0; i < nr; i++) {
        at += splitmix64(rng) % 8000;
        uint64_t count = 1 + splitmix64(rng) % 9000;
        ranges[i] = (sl_posrun_t){e, f, at, count};
        at += count + 1;
        if (splitmix64(rng) % 3 == 0) {
            f = (f + 1) % FILES;
            e += f == 0;
            at = splitmix64(rng) % 1000;
        }
    }
    sl_posbits_t within_bits;
    sl_posset_t within, want;
    sl_posbits_init(&within_bits, SL_POSSET_MAX_RUNS);
    sl_posset_init(&within, SL_POSSET_MAX_RUNS);
    sl_posset_init(&want, SL_POSSET_MAX_RUNS);
    cr_assert_eq(sl_posbits_decode_within(&within_bits, buf, len, ranges, nr, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_posbits_to_posset(&within_bits, 0, &within), 0);
    sl_posbits_clear(&within_bits);
    for (size_t i = 0; i < nr; i++) {
        sl_posrun_t part[20000];
        size_t k = sl_posset_within(ref, ranges[i].epoch, ranges[i].file, ranges[i].begin,
                                    ranges[i].begin + ranges[i].count, part, 20000);
        cr_assert_leq(k, 20000);
        cr_assert_eq(sl_posset_add_many(&want, part, k), 0);
    }
    cr_assert_eq(within.num, want.num, "%zu runs within %zu ranges, %zu wanted", within.num, nr, want.num);
    cr_assert(want.num == 0 || memcmp(within.runs, want.runs, want.num * sizeof *want.runs) == 0);
    sl_posset_clear(&back);
    sl_posset_clear(&within);
    sl_posset_clear(&want);
    free(buf);
}

/* A batch as workers send them: a shuffled window's records, every
 * stride-th taken (a rank among stride), long runs, or any runs. */
static size_t draw_batch(uint64_t *rng, sl_posrun_t *out, size_t max)
{
    uint32_t e = (uint32_t)(splitmix64(rng) % EPOCHS), f = (uint32_t)(splitmix64(rng) % FILES);
    size_t n = 1 + (size_t)(splitmix64(rng) % max);
    unsigned kind = (unsigned)(splitmix64(rng) % 3);
    uint64_t at = splitmix64(rng) % SPAN, stride = 1 + splitmix64(rng) % 4;
    for (size_t i = 0; i < n; i++) {
        if (kind == 0) {
            uint64_t p = (at + (splitmix64(rng) % 5000) * stride) % SPAN;
            out[i] = (sl_posrun_t){e, f, p, 1};
        } else if (kind == 1) {
            out[i] = (sl_posrun_t){e, f, splitmix64(rng) % SPAN, 1 + splitmix64(rng) % 9000};
        } else {
            out[i] = (sl_posrun_t){(uint32_t)(splitmix64(rng) % EPOCHS), (uint32_t)(splitmix64(rng) % FILES),
                                   splitmix64(rng) % SPAN, 1 + splitmix64(rng) % 40};
        }
    }
    return n;
}

Test(posbits, random_adds_bitmaps_and_drops_match_a_plain_set)
{
    uint64_t rng = test_seed("posbits::random_adds_bitmaps_and_drops_match_a_plain_set");
    enum { MAX_BATCH = 3000 };
    sl_posrun_t *batch = malloc(MAX_BATCH * sizeof *batch);
    cr_assert_not_null(batch);
    for (int round = 0; round < 12; round++) {
        sl_posbits_t b;
        sl_posset_t ref;
        sl_posbits_init(&b, SL_POSSET_MAX_RUNS);
        sl_posset_init(&ref, SL_POSSET_MAX_RUNS);
        int steps = 20 + (int)(splitmix64(&rng) % 60);
        for (int s = 0; s < steps; s++) {
            unsigned op = (unsigned)(splitmix64(&rng) % 10);
            if (op < 7) {
                size_t n = draw_batch(&rng, batch, MAX_BATCH);
                cr_assert_eq(sl_posbits_add_many(&b, batch, n), 0);
                cr_assert_eq(sl_posset_add_many(&ref, batch, n), 0);
            } else if (op < 9) {
                uint32_t e = (uint32_t)(splitmix64(&rng) % EPOCHS), f = (uint32_t)(splitmix64(&rng) % FILES);
                uint64_t no = splitmix64(&rng) % (SPAN / SL_POSBITS_BLOCK + 1), w[SL_POSBITS_WORDS];
                unsigned fill = (unsigned)(splitmix64(&rng) % 4); /* empty, sparse, half, full */
                for (unsigned i = 0; i < SL_POSBITS_WORDS; i++)
                    w[i] = fill == 0 ? 0 : fill == 3 ? ~(uint64_t)0
                                       : fill == 1 ? splitmix64(&rng) & splitmix64(&rng) & splitmix64(&rng)
                                                   : splitmix64(&rng);
                cr_assert_eq(sl_posbits_add_block(&b, e, f, no, w), 0);
                for (unsigned i = 0; i < SL_POSBITS_BLOCK; i++)
                    if (w[i / 64] >> (i % 64) & 1)
                        cr_assert_eq(sl_posset_add(&ref, e, f, no * SL_POSBITS_BLOCK + i, 1, NULL), 0);
            } else {
                uint32_t e = (uint32_t)(splitmix64(&rng) % EPOCHS), f = (uint32_t)(splitmix64(&rng) % FILES);
                uint64_t pos = splitmix64(&rng) % SPAN;
                sl_posbits_drop_before(&b, e, f, pos);
                sl_posset_drop_before(&ref, e, f, pos);
            }
            check_same(&b, &ref, &rng);
            if (splitmix64(&rng) % 4 == 0)
                check_wire(&b, &ref, &rng);
        }
        sl_posbits_clear(&b);
        sl_posset_clear(&ref);
    }
    free(batch);
}

Test(posbits, crowded_runs_become_bitmaps_and_full_ones_runs_again)
{
    sl_posbits_t b;
    sl_posbits_init(&b, SL_POSSET_MAX_RUNS);
    /* Every other position of 4 blocks: 8192 runs, past COMPACT_MIN. */
    sl_posrun_t *r = malloc(8192 * sizeof *r);
    cr_assert_not_null(r);
    for (uint64_t i = 0; i < 8192; i++)
        r[i] = (sl_posrun_t){0, 0, 2 * i, 1};
    cr_assert_eq(sl_posbits_add_many(&b, r, 8192), 0);
    cr_assert_eq(b.nblocks, 4, "%zu blocks", b.nblocks);
    cr_assert_eq(b.runs.num, 0);
    cr_assert_eq(sl_posbits_units(&b), 4 * SL_POSBITS_BLOCK_UNITS);
    cr_assert_eq(sl_posbits_size(&b), 8192);
    /* The other half: full blocks, one run once the set looks again. */
    for (uint64_t i = 0; i < 8192; i++)
        r[i] = (sl_posrun_t){0, 0, 2 * i + 1, 1};
    cr_assert_eq(sl_posbits_add_many(&b, r, 8192), 0);
    cr_assert_eq(sl_posbits_size(&b), 16384);
    sl_posrun_t *out = NULL;
    size_t n = 0;
    cr_assert_eq(sl_posbits_runs(&b, 0, &out, &n), 0);
    cr_assert_eq(n, 1);
    cr_assert_eq(out[0].begin, 0);
    cr_assert_eq(out[0].count, 16384);
    free(out);
    /* Runs of blocks with many runs can be left out, for the caller to write as bitmaps. */
    sl_posbits_drop_before(&b, 1, 0, 0); /* epoch 0 goes */
    for (uint64_t i = 0; i < 8192; i++)
        r[i] = (sl_posrun_t){1, 0, 3 * i, 1};
    cr_assert_eq(sl_posbits_add_many(&b, r, 8192), 0);
    cr_assert_eq(sl_posbits_runs(&b, 64, &out, &n), 0);
    size_t kept_out = 0;
    for (size_t k = 0; k < b.nblocks; k++)
        kept_out += sl_posbits_block_runs(&b.blocks[k]) >= 64;
    cr_assert_gt(kept_out, 0);
    uint64_t in_runs = 0;
    for (size_t i = 0; i < n; i++)
        in_runs += out[i].count;
    uint64_t in_blocks = 0;
    for (size_t k = 0; k < b.nblocks; k++)
        if (sl_posbits_block_runs(&b.blocks[k]) >= 64)
            in_blocks += sl_posbits_count(&b, 1, 0, b.blocks[k].no * SL_POSBITS_BLOCK,
                                          (b.blocks[k].no + 1) * SL_POSBITS_BLOCK);
    cr_assert_eq(in_runs + in_blocks, 8192);
    free(out);
    /* A drop past every bit of a block takes the block too. */
    uint64_t last = 3 * 8191;
    sl_posbits_drop_before(&b, 1, 0, last);
    cr_assert_eq(b.nblocks, 1);
    sl_posbits_drop_before(&b, 1, 0, last + 1);
    cr_assert_eq(b.nblocks, 0);
    cr_assert_eq(sl_posbits_size(&b), 0);
    sl_posbits_clear(&b);

    /* Runs that would pass the bound fit once those held crowd into bits. */
    sl_posbits_init(&b, 5000);
    for (uint64_t i = 0; i < 4000; i++)
        r[i] = (sl_posrun_t){0, 0, 2 * i, 1};
    cr_assert_eq(sl_posbits_add_many(&b, r, 4000), 0);
    cr_assert_eq(b.runs.num, 4000, "below the size at which adds look for crowding");
    for (uint64_t i = 0; i < 2000; i++)
        r[i] = (sl_posrun_t){0, 0, 8000 + 2 * i, 1};
    cr_assert_eq(sl_posbits_add_many(&b, r, 2000), 0);
    cr_assert_eq(sl_posbits_size(&b), 6000);
    cr_assert_leq(sl_posbits_units(&b), 5000);
    free(r);
    sl_posbits_clear(&b);
}

Test(posbits, over_its_bound_an_add_is_refused_and_changes_nothing)
{
    uint64_t rng = test_seed("posbits::over_its_bound_an_add_is_refused_and_changes_nothing");
    sl_posbits_t b;
    sl_posbits_init(&b, 300);
    sl_posrun_t batch[400];
    int refused = 0;
    for (int s = 0; s < 200 && refused < 5; s++) {
        size_t n = 1 + (size_t)(splitmix64(&rng) % 400);
        for (size_t i = 0; i < n; i++)
            batch[i] = (sl_posrun_t){0, (uint32_t)(splitmix64(&rng) % 2), splitmix64(&rng) % 100000, 1};
        sl_posrun_t *before = NULL, *after = NULL;
        size_t nb = 0, na = 0;
        cr_assert_eq(sl_posbits_runs(&b, 0, &before, &nb), 0);
        int rc = sl_posbits_add_many(&b, batch, n);
        cr_assert(rc == 0 || rc == -ENOSPC, "rc %d", rc);
        check_invariants(&b);
        if (rc == -ENOSPC) {
            refused++;
            cr_assert_eq(sl_posbits_runs(&b, 0, &after, &na), 0);
            cr_assert_eq(na, nb);
            cr_assert(nb == 0 || memcmp(before, after, nb * sizeof *before) == 0);
        }
        free(before);
        free(after);
    }
    cr_assert_gt(refused, 0);
    sl_posbits_clear(&b);
}

/* A rank of 2 to 8 of a named job behind shuffles: its share of 3 million
 * positions in batches of 256 drawn from a window of 200,000. As runs that
 * is about a run a record; as bits, a block per 4096 positions. */
Test(posbits, a_ranks_share_of_millions_of_positions_takes_a_bit_each)
{
    uint64_t rng = test_seed("posbits::a_ranks_share_of_millions_of_positions_takes_a_bit_each");
    enum { N = 3000000, WINDOW = 200000, BATCH = 256 };
    unsigned ranks = 2 + (unsigned)(splitmix64(&rng) % 7);
    uint64_t *order = malloc(N * sizeof *order);
    cr_assert_not_null(order);
    /* A shuffle within a sliding window: position i leaves within WINDOW of its place. */
    for (uint64_t i = 0; i < N; i++)
        order[i] = i;
    for (uint64_t i = 0; i + 1 < N; i++) {
        uint64_t j = i + splitmix64(&rng) % (N - i < WINDOW ? N - i : WINDOW);
        uint64_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    sl_posbits_t b;
    sl_posset_t ref;
    sl_posbits_init(&b, SL_POSSET_MAX_RUNS);
    sl_posset_init(&ref, SL_POSSET_MAX_RUNS);
    sl_posrun_t batch[BATCH];
    uint64_t mine = 0;
    size_t most_units = 0;
    for (uint64_t at = 0, step = 0; at < N; at += BATCH, step++) {
        if (step % ranks != 0)
            continue; /* a peer's batch */
        size_t n = 0;
        for (uint64_t i = at; i < at + BATCH && i < N; i++)
            batch[n++] = (sl_posrun_t){0, 0, order[i], 1};
        mine += n;
        cr_assert_eq(sl_posbits_add_many(&b, batch, n), 0);
        cr_assert_eq(sl_posset_add_many(&ref, batch, n), 0);
        if (sl_posbits_units(&b) > most_units)
            most_units = sl_posbits_units(&b);
    }
    cr_assert_eq(sl_posbits_size(&b), mine);
    /* Runs: about 1 - 1 / ranks a record it got (a record starts a run
     * unless the one before it is its own too). Bits: about N / 4096
     * blocks. */
    cr_assert_gt(ref.num, mine / 3, "%zu runs of %llu records", ref.num, (unsigned long long)mine);
    size_t blocks_bound = (N / SL_POSBITS_BLOCK + 2) * SL_POSBITS_BLOCK_UNITS + 8192;
    cr_assert_leq(most_units, blocks_bound, "%zu units at most, %zu allowed", most_units, blocks_bound);
    for (int q = 0; q < 200; q++) {
        uint64_t lo = splitmix64(&rng) % N, hi = lo + splitmix64(&rng) % 50000;
        cr_assert_eq(sl_posbits_count(&b, 0, 0, lo, hi), sl_posset_count(&ref, 0, 0, lo, hi));
    }
    sl_posrun_t *runs = NULL;
    size_t n = 0;
    cr_assert_eq(sl_posbits_runs(&b, 0, &runs, &n), 0);
    cr_assert_eq(n, ref.num);
    cr_assert(memcmp(runs, ref.runs, n * sizeof *runs) == 0);
    free(runs);
    free(order);
    sl_posbits_clear(&b);
    sl_posset_clear(&ref);
}

Test(posbits, damaged_version_3_bytes_are_refused_by_name)
{
    sl_posbits_t b;
    sl_posbits_init(&b, SL_POSSET_MAX_RUNS);
    sl_posrun_t r[6000];
    for (uint64_t i = 0; i < 6000; i++)
        r[i] = (sl_posrun_t){0, 0, 3 * i, 1};
    cr_assert_eq(sl_posbits_add_many(&b, r, 6000), 0);
    cr_assert_eq(sl_posbits_add_many(&b, (sl_posrun_t[]){{0, 1, 7, 5}}, 1), 0);
    cr_assert_geq(b.nblocks, 2);
    uint8_t *buf = NULL;
    size_t len = 0;
    cr_assert_eq(sl_posbits_encode(&b, 0, &buf, &len), 0);
    cr_assert_eq(buf[4], 3);
    const size_t first = 24; /* the first bitmap: after the header and its count */
    struct {
        size_t at, bytes;
        uint8_t to;
        size_t len;
        const char *says;
    } bad[] = {
        {16, 1, 0xff, 0, "cannot hold its"},                          /* bitmaps past the bytes */
        {first + 8, 1, 9, 0, "not after the one before it"},           /* bitmap 1 past bitmap 2 */
        {first + 16, 8 * SL_POSBITS_WORDS, 0, 0, "is empty"},          /* bitmap 1's words cleared */
        {0, 0, 0, 1, "left over"},                                     /* a byte more */
        {8, 1, 9, 0, "cannot hold its 9 runs"},                        /* more runs than the bytes hold */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t *c = malloc(len + 1);
        memcpy(c, buf, len);
        c[len] = 0;
        memset(c + bad[i].at, bad[i].to, bad[i].bytes);
        sl_posset_t t;
        sl_posset_init(&t, SL_POSSET_MAX_RUNS);
        char err[256] = "";
        cr_assert_eq(sl_posset_decode(&t, c, len + bad[i].len, err, sizeof err), SL_EDATA, "case %zu", i);
        cr_assert(strstr(err, bad[i].says), "case %zu: \"%s\" does not say \"%s\"", i, err, bad[i].says);
        cr_assert_eq(t.num, 0);
        sl_posbits_t tb;
        sl_posbits_init(&tb, SL_POSSET_MAX_RUNS);
        cr_assert_eq(sl_posbits_decode_within(&tb, c, len + bad[i].len, r, 1, err, sizeof err), SL_EDATA, "case %zu",
                     i);
        sl_posbits_clear(&tb);
        free(c);
    }
    /* Within no range: nothing kept, the bytes checked all the same. */
    sl_posbits_t t;
    sl_posbits_init(&t, 10);
    char err[256];
    cr_assert_eq(sl_posbits_decode_within(&t, buf, len, NULL, 0, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_posbits_units(&t), 0);
    /* More units than the limit, within the ranges: refused by name. */
    sl_posrun_t all = {0, 0, 0, 20000};
    cr_assert_eq(sl_posbits_decode_within(&t, buf, len, &all, 1, err, sizeof err), -ENOSPC);
    cr_assert(strstr(err, "more than 10 units within the ranges"), "%s", err);
    sl_posbits_clear(&t);
    free(buf);
    sl_posbits_clear(&b);
}
