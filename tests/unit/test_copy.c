/*
 * test_copy.c: sl_copy_far() (common/copy.h) copies as memcpy() does, at
 * every alignment of its source and destination, below, at and above the
 * size where it starts to stream, and writes nothing outside [dst, dst + n);
 * so does sl_copy_stream() at every size and alignment.
 */
#include <criterion/criterion.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "copy.h"

#define GUARD 128

/* Copies n bytes from src + sa to a buffer at da (both offsets past a
 * 64-byte-aligned base) with sl_copy_far() or, stream, sl_copy_stream(),
 * and checks the copy and the bytes around it. */
static void check_copy_with(const uint8_t *src, size_t sa, size_t da, size_t n, uint8_t *buf, bool stream)
{
    uint8_t *dst = buf + GUARD + da;
    memset(buf, 0xa5, GUARD + 64 + n + GUARD);
    if (stream) {
        sl_copy_stream(dst, src + sa, n);
        sl_copy_stream_done();
    } else {
        sl_copy_far(dst, src + sa, n);
    }
    cr_assert(memcmp(dst, src + sa, n) == 0, "%zu bytes from offset %zu to offset %zu differ", n, sa, da);
    for (size_t i = 0; i < GUARD + da; i++)
        cr_assert_eq(buf[i], 0xa5, "%zu bytes from %zu to %zu: byte %zu before the copy written", n, sa, da,
                     GUARD + da - i);
    for (size_t i = GUARD + da + n; i < GUARD + 64 + n + GUARD; i++)
        cr_assert_eq(buf[i], 0xa5, "%zu bytes from %zu to %zu: byte %zu after the copy written", n, sa, da,
                     i - (GUARD + da + n));
}

static void check_copy(const uint8_t *src, size_t sa, size_t da, size_t n, uint8_t *buf)
{
    check_copy_with(src, sa, da, n, buf, false);
}

Test(copy, copies_as_memcpy_at_every_alignment_and_around_the_streaming_size)
{
    const size_t sizes[] = {0,
                            1,
                            63,
                            64,
                            65,
                            4096,
                            SL_COPY_FAR_MIN - 1,
                            SL_COPY_FAR_MIN,
                            SL_COPY_FAR_MIN + 1,
                            SL_COPY_FAR_MIN + 63,
                            SL_COPY_FAR_MIN + 64,
                            SL_COPY_FAR_MIN + 127,
                            3 * SL_COPY_FAR_MIN + 17};
    size_t max = 3 * SL_COPY_FAR_MIN + 17, src_len = (max + 64 + 63) / 64 * 64,
           buf_len = (GUARD + 64 + max + GUARD + 63) / 64 * 64;
    uint8_t *src = aligned_alloc(64, src_len), *buf = aligned_alloc(64, buf_len);
    cr_assert(src && buf);
    /* Bytes that differ from their neighbours at every distance a slip of
     * the loop could make (16, 32, 48, 64). */
    uint32_t x = 12345;
    for (size_t i = 0; i < max + 64; i++) {
        x = x * 1103515245u + 12345u;
        src[i] = (uint8_t)(x >> 24);
    }
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (size_t sa = 0; sa < 64; sa += (sizes[s] >= SL_COPY_FAR_MIN ? 7 : 1))
            for (size_t da = 0; da < 64; da += (sizes[s] >= SL_COPY_FAR_MIN ? 5 : 1))
                check_copy(src, sa, da, sizes[s], buf);
    /* Every head and tail length the streaming path splits off. */
    for (size_t da = 0; da < 64; da++)
        for (size_t tail = 0; tail < 64; tail++)
            check_copy(src, 3, da, SL_COPY_FAR_MIN + tail, buf);
    free(buf);
    free(src);
}

/* sl_copy_stream() (a row of an image at a time) copies as memcpy() does
 * whatever its size and alignment: every head before the first aligned
 * store and every tail after the last. */
Test(copy, a_streamed_row_is_copied_whole_at_every_size_and_alignment)
{
    size_t max = 3000;
    uint8_t *src = aligned_alloc(64, 4096), *buf = aligned_alloc(64, 4096);
    cr_assert(src && buf);
    uint32_t x = 777;
    for (size_t i = 0; i < 4096; i++) {
        x = x * 1103515245u + 12345u;
        src[i] = (uint8_t)(x >> 24);
    }
    for (size_t n = 0; n < 80; n++)
        for (size_t sa = 0; sa < 16; sa++)
            for (size_t da = 0; da < 20; da++)
                check_copy_with(src, sa, da, n, buf, true);
    for (size_t da = 0; da < 20; da++)
        check_copy_with(src, 1, da, max, buf, true);
    free(buf);
    free(src);
}
