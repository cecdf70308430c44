/*
 * provspan.c: a batch's sl_prov_span_t (provspan.h), a run at a time or,
 * on x86-64 CPUs with AVX2, four at a time. A shuffled batch is a run a
 * record, so this pass is per record: the scalar loop takes about 17
 * instructions a run, the vector one about 8. Also the records of a batch
 * below a bound (sl_prov_records_below()), likewise.
 */
#include "provspan.h"

#include "provlanes.h"

#if defined(__x86_64__)
/* The lanes of provlanes.h: the reductions do not mind their order, but
 * begin and count must pair lane by lane, so the counts are permuted into
 * the begins' order. Unsigned compares are signed compares of values with
 * the top bit flipped (AVX2 has no unsigned 64-bit compare): lo and hi are
 * kept flipped. */
__attribute__((target("avx2"))) static void span_avx2(const sl_provenance_run_t *runs, uint64_t n,
                                                     sl_prov_span_t *s)
{
    const __m256i flip = _mm256_set1_epi64x(INT64_MIN), none = _mm256_set1_epi64x(-1);
    const __m256i zero = _mm256_setzero_si256(), pair = _mm256_set1_epi64x((long long)s->pair);
    __m256i other = zero, wraps = zero, empty = zero, records = zero;
    __m256i lo = _mm256_set1_epi64x(INT64_MAX), hi = _mm256_set1_epi64x(INT64_MIN); /* flipped: 2^64 - 1, 0 */
    uint64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        __m256i p, beg, cnt;
        sl_runs4_lanes(&runs[i], &p, &beg, &cnt);
        cnt = _mm256_permute4x64_epi64(cnt, _MM_SHUFFLE(0, 3, 2, 1)); /* counts 1 0 3 2, as the begins */
        other = _mm256_or_si256(other, _mm256_xor_si256(p, pair));
        records = _mm256_add_epi64(records, cnt);
        empty = _mm256_or_si256(empty, _mm256_cmpeq_epi64(cnt, zero));
        __m256i bx = _mm256_xor_si256(beg, flip), ex = _mm256_xor_si256(_mm256_add_epi64(beg, cnt), flip);
        wraps = _mm256_or_si256(wraps, _mm256_cmpgt_epi64(bx, ex)); /* begin + count < begin */
        lo = _mm256_blendv_epi8(lo, bx, _mm256_cmpgt_epi64(lo, bx));
        __m256i lastx = _mm256_add_epi64(ex, none); /* begin + count - 1, flipped */
        hi = _mm256_blendv_epi8(hi, lastx, _mm256_cmpgt_epi64(lastx, hi));
    }
    uint64_t r[4], l[4], h[4];
    _mm256_storeu_si256((__m256i *)(void *)r, records);
    _mm256_storeu_si256((__m256i *)(void *)l, _mm256_xor_si256(lo, flip));
    _mm256_storeu_si256((__m256i *)(void *)h, _mm256_xor_si256(hi, flip));
    s->one_pair &= _mm256_testz_si256(other, other);
    s->wraps |= !_mm256_testz_si256(wraps, wraps);
    s->empty |= !_mm256_testz_si256(empty, empty);
    for (int k = 0; k < 4; k++) {
        s->records += r[k];
        s->lo = l[k] < s->lo ? l[k] : s->lo;
        s->hi = h[k] > s->hi ? h[k] : s->hi;
    }
    for (; i < n; i++)
        sl_prov_span_add(s, &runs[i]);
}

/* Lanes as in span_avx2(). A run's records below bound: none when it
 * begins at or past it, else the lesser of its count and bound - begin
 * (unsigned compares, flipped as above). */
__attribute__((target("avx2"))) static uint64_t below_avx2(const sl_provenance_run_t *runs, uint64_t n,
                                                          uint64_t bound)
{
    const __m256i flip = _mm256_set1_epi64x(INT64_MIN), b = _mm256_set1_epi64x((long long)bound);
    const __m256i bx = _mm256_xor_si256(b, flip);
    __m256i sum = _mm256_setzero_si256();
    uint64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        __m256i p, beg, cnt;
        sl_runs4_lanes(&runs[i], &p, &beg, &cnt);
        cnt = _mm256_permute4x64_epi64(cnt, _MM_SHUFFLE(0, 3, 2, 1));
        __m256i below = _mm256_cmpgt_epi64(bx, _mm256_xor_si256(beg, flip));
        __m256i room = _mm256_sub_epi64(b, beg);
        __m256i more = _mm256_cmpgt_epi64(_mm256_xor_si256(cnt, flip), _mm256_xor_si256(room, flip));
        sum = _mm256_add_epi64(sum, _mm256_and_si256(_mm256_blendv_epi8(cnt, room, more), below));
    }
    uint64_t s[4];
    _mm256_storeu_si256((__m256i *)(void *)s, sum);
    uint64_t k = s[0] + s[1] + s[2] + s[3];
    for (; i < n; i++)
        k += sl_prov_run_below(&runs[i], bound);
    return k;
}
#endif

uint64_t sl_prov_records_below(const sl_provenance_run_t *runs, uint64_t n, uint64_t bound)
{
#if defined(__x86_64__)
    if (n >= SL_PROV_SPAN_WIDE && sl_prov_span_vector())
        return below_avx2(runs, n, bound);
#endif
    return sl_prov_records_below_scalar(runs, n, bound);
}

bool sl_prov_span_vector(void)
{
#if defined(__x86_64__)
    return __builtin_cpu_supports("avx2");
#else
    return false;
#endif
}

void sl_prov_span_wide(const sl_provenance_run_t *runs, uint64_t n, sl_prov_span_t *s)
{
    sl_prov_span_start(s, &runs[0]);
#if defined(__x86_64__)
    if (sl_prov_span_vector()) {
        span_avx2(runs, n, s);
        return;
    }
#endif
    for (uint64_t i = 0; i < n; i++)
        sl_prov_span_add(s, &runs[i]);
}
