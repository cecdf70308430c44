/*
 * provlanes.h: four provenance runs as 64-bit lanes, for the AVX2 paths of
 * provspan.c (the span) and provwire.c (the dense form's offsets). Four
 * runs are 96 bytes, three 32-byte loads:
 *
 *   a = pair0 begin0 count0 pair1
 *   b = begin1 count1 pair2 begin2
 *   c = count2 pair3 begin3 count3
 *
 * and two blends gather each field's four lanes, in an order of their own
 * (below): the caller permutes them where the order matters.
 */
#ifndef SL_PROVLANES_H
#define SL_PROVLANES_H

#if defined(__x86_64__)
#include <immintrin.h>

#include "sluice.h"

/* _mm256_blend_epi32 masks of 64-bit lanes 1 and 2. */
#define SL_LANE1 0x0c
#define SL_LANE2 0x30

/* The pairs (lanes: runs 0 3 2 1), begins (1 0 3 2) and counts (2 1 0 3)
 * of runs r[0..4); unused ones cost nothing once inlined. */
static inline __attribute__((target("avx2"), always_inline)) void
sl_runs4_lanes(const sl_provenance_run_t *r, __m256i *pairs, __m256i *begins, __m256i *counts)
{
    const __m256i *v = (const __m256i *)(const void *)r;
    __m256i a = _mm256_loadu_si256(v), b = _mm256_loadu_si256(v + 1), c = _mm256_loadu_si256(v + 2);
    *pairs = _mm256_blend_epi32(_mm256_blend_epi32(a, b, SL_LANE2), c, SL_LANE1);
    *begins = _mm256_blend_epi32(_mm256_blend_epi32(b, a, SL_LANE1), c, SL_LANE2);
    *counts = _mm256_blend_epi32(_mm256_blend_epi32(c, b, SL_LANE1), a, SL_LANE2);
}
#endif

#endif
