/* copy.c: see copy.h. */
#include "copy.h"

#include <stdint.h>
#include <string.h>

#if defined(__SSE2__) && !defined(__SANITIZE_ADDRESS__)
#include <emmintrin.h>
#define SL_COPY_STREAMS 1
#endif

void sl_copy_stream(void *dst, const void *src, size_t n)
{
#ifdef SL_COPY_STREAMS
    uint8_t *d = dst;
    const uint8_t *s = src;
    /* Whole cache lines from a line's start: the write-combining buffers
     * then go out full. The head and the tail go through the cache. */
    size_t head = (size_t)(-(uintptr_t)d & 63);
    if (head > n)
        head = n;
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(const void *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(s + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(const void *)(s + 48));
        _mm_stream_si128((__m128i *)(void *)d, a);
        _mm_stream_si128((__m128i *)(void *)(d + 16), b);
        _mm_stream_si128((__m128i *)(void *)(d + 32), c);
        _mm_stream_si128((__m128i *)(void *)(d + 48), e);
    }
    memcpy(d, s, n);
#else
    memcpy(dst, src, n);
#endif
}

void sl_copy_stream_done(void)
{
#ifdef SL_COPY_STREAMS
    /* Streamed stores are ordered with nothing else: fence them so that
     * whoever is told of the block next (a lock, a queue) sees them. */
    _mm_sfence();
#endif
}

void sl_copy_far(void *dst, const void *src, size_t n)
{
    if (n < SL_COPY_FAR_MIN) {
        memcpy(dst, src, n);
        return;
    }
    sl_copy_stream(dst, src, n);
    sl_copy_stream_done();
}
