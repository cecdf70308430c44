/*
 * fuzz_posset.c: libFuzzer target for the position-set decoder
 * (protocol/posset.c), which reads a client's REPORT_RECEIVED and a
 * restored checkpoint's positions on the dispatcher. Beyond "no crash, no
 * leak": only the documented results, at most max_runs runs, and on success
 * bytes that encode and decode to the same set.
 * Run it with scripts/fuzz.sh (FUZZ_TARGETS=fuzz_posset).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "posbits.h"
#include "posset.h"
#include "sluice.h"

#include "fuzz_check.h"

#define MAX_RUNS 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sl_posset_t s;
    sl_posset_init(&s, MAX_RUNS);
    char err[256];
    int rc = sl_posset_decode(&s, data, size, err, sizeof err);
    /* (the whole set is cleared after the ranges' check) */
    CHECK(rc == 0 || rc == SL_EDATA || rc == -ENOSPC || rc == -ENOMEM);
    if (rc == 0) {
        CHECK(s.num <= MAX_RUNS);
        size_t n = sl_posset_encode(&s, NULL, 0);
        uint8_t *buf = malloc(n);
        CHECK(buf && sl_posset_encode(&s, buf, n) == n);
        sl_posset_t t;
        sl_posset_init(&t, MAX_RUNS);
        CHECK(sl_posset_decode(&t, buf, n, err, sizeof err) == 0);
        CHECK(t.num == s.num && (s.num == 0 || memcmp(t.runs, s.runs, s.num * sizeof *s.runs) == 0));
        if (s.num > 0) {
            /* What the hand-out asks of a set stays within the run it names. */
            const sl_posrun_t *r = &s.runs[s.num - 1];
            CHECK(sl_posset_covered_to(&s, r->epoch, r->file, r->begin) == r->begin + r->count);
        }
        sl_posset_clear(&t);
        free(buf);
    }
    /* A report read within ranges (the dispatcher's lost splits): the same
     * results, and on success what the whole set holds of the ranges. */
    static const sl_posrun_t ranges[] = {{0, 0, 0, 5000}, {0, 1, 100, 100000}, {1, 0, 4096, 8192}};
    sl_posbits_t w;
    sl_posbits_init(&w, MAX_RUNS);
    int rw = sl_posbits_decode_within(&w, data, size, ranges, 3, err, sizeof err);
    CHECK(rw == 0 || rw == SL_EDATA || rw == -ENOSPC || rw == -ENOMEM);
    CHECK(rc != SL_EDATA || rw == SL_EDATA);
    if (rw == 0 && rc == 0) {
        uint64_t in = 0;
        for (size_t i = 0; i < 3; i++)
            in += sl_posset_count(&s, ranges[i].epoch, ranges[i].file, ranges[i].begin,
                                  ranges[i].begin + ranges[i].count);
        CHECK(sl_posbits_size(&w) == in);
    }
    sl_posbits_clear(&w);
    sl_posset_clear(&s);
    return 0;
}
