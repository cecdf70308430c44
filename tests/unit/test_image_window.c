/*
 * test_image_window.c: decoding only a window of a JPEG
 * (sl_image_decode_jpeg_window, pipeline/image_window.c) gives, byte for
 * byte, what a full decode then a crop give, for every chroma subsampling,
 * progressive files, channel conversions, odd sizes and windows at every
 * edge and corner; and its refusals. At a DCT scale of 1/2, 1/4 and 1/8
 * (sl_image_decode_jpeg_window_rows) it gives what the scaled full
 * decode then a crop give. Also common/big_alloc.c's buffers.
 *
 * The JPEGs are encoded here with tjCompress2 from noisy images, so that
 * every block has detail and an upsampling slip shows.
 */
#include <criterion/criterion.h>

#include <malloc.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <turbojpeg.h>

#include "big_alloc.h"
#include "image.h"

static char err[256];

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint64_t rng(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

/* Gradients plus noise: detail in every 8 x 8 block. */
static uint8_t *noisy_image(size_t h, size_t w, size_t c)
{
    uint8_t *p = malloc(h * w * c);
    cr_assert_not_null(p);
    for (size_t y = 0; y < h; y++)
        for (size_t x = 0; x < w; x++)
            for (size_t k = 0; k < c; k++) {
                int v = (int)((x * (k + 1) * 255) / w + (y * 128) / h) / 2 + (int)(rng() >> 58) - 32 + 40;
                p[(y * w + x) * c + k] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
    return p;
}

static uint8_t *encode(size_t h, size_t w, size_t c, int subsamp, int flags, unsigned long *len)
{
    uint8_t *img = noisy_image(h, w, c);
    tjhandle tj = tjInitCompress();
    cr_assert_not_null(tj);
    unsigned char *jpeg = NULL;
    *len = 0;
    int rc = tjCompress2(tj, img, (int)w, 0, (int)h, c == 3 ? TJPF_RGB : TJPF_GRAY, &jpeg, len, subsamp, 90,
                         flags);
    cr_assert_eq(rc, 0, "tjCompress2: %s", tjGetErrorStr2(tj));
    tjDestroy(tj);
    free(img);
    return jpeg;
}

/* Decodes the whole image and crops (the unfused path), decodes the window
 * (the fused one), dense and as decoded rows, and compares them byte for
 * byte. */
static void check_window(const uint8_t *jpeg, unsigned long len, int channels, size_t y, size_t x, size_t h,
                         size_t w, const char *what)
{
    sl_image_decoder_t *dec = NULL;
    cr_assert_eq(sl_image_decoder_new(&dec, err, sizeof err), 0, "%s", err);
    uint8_t *full = NULL, *win = NULL;
    sl_image_shape_t fs, ws;
    cr_assert_eq(sl_image_decode_jpeg(dec, jpeg, len, channels, SIZE_MAX, &full, &fs, err, sizeof err), 0, "%s", err);
    uint8_t *crop = malloc(h * w * fs.c);
    cr_assert_not_null(crop);
    cr_assert_eq(sl_image_crop(full, fs, y, x, h, w, crop, err, sizeof err), 0, "%s", err);
    int rc = sl_image_decode_jpeg_window(jpeg, len, channels, SIZE_MAX, y, x, h, w, &win, &ws, err, sizeof err);
    cr_assert_eq(rc, 0, "%s: %s", what, err);
    cr_assert_eq(ws.h, h);
    cr_assert_eq(ws.w, w);
    cr_assert_eq(ws.c, fs.c);
    for (size_t i = 0; i < h * w * fs.c; i++)
        if (crop[i] != win[i])
            cr_assert_fail("%s: window %zu x %zu at (%zu, %zu) of %zu x %zu x %zu differs at row %zu col %zu "
                           "channel %zu: %u, decode then crop gives %u",
                           what, h, w, y, x, fs.h, fs.w, fs.c, i / fs.c / w, i / fs.c % w, i % fs.c, win[i],
                           crop[i]);
    free(win);
    size_t stride, first;
    rc = sl_image_decode_jpeg_window_rows(jpeg, len, channels, SIZE_MAX, 1, y, x, h, w, &win, &stride, &first, &ws, err,
                                          sizeof err);
    cr_assert_eq(rc, 0, "%s: %s", what, err);
    cr_assert(ws.h == h && ws.w == w && ws.c == fs.c);
    cr_assert_geq(stride, first + w * fs.c, "%s: a row of %zu bytes, the window from %zu", what, stride, first);
    for (size_t r = 0; r < h; r++)
        cr_assert(memcmp(win + r * stride + first, crop + r * w * fs.c, w * fs.c) == 0,
                  "%s: window %zu x %zu at (%zu, %zu) of %zu x %zu x %zu, as decoded rows (%zu bytes, from %zu), "
                  "differs in row %zu",
                  what, h, w, y, x, fs.h, fs.w, fs.c, stride, first, r);
    free(win);
    free(crop);
    free(full);
    sl_image_decoder_free(dec);
}

/* Windows at the corners, the edges, the middle, odd offsets, single pixels
 * and the whole image. */
static void check_many(const uint8_t *jpeg, unsigned long len, int channels, size_t ih, size_t iw, const char *what)
{
    size_t wins[][4] = {
        {0, 0, ih, iw},               {0, 0, 1, 1},
        {ih - 1, iw - 1, 1, 1},       {0, 0, ih / 2, iw / 2},
        {ih / 2, iw / 2, ih / 2, iw - iw / 2}, {0, iw - 37, 41, 37},
        {ih - 29, 0, 29, 53},         {17, 33, ih - 40, iw - 50},
        {9, 1, 7, iw - 3},            {ih / 3, 15, ih / 3, 17},
        {31, 47, 64, 64},             {1, iw / 2 + 3, ih - 2, 9},
    };
    for (size_t i = 0; i < sizeof wins / sizeof wins[0]; i++) {
        size_t y = wins[i][0], x = wins[i][1], h = wins[i][2], w = wins[i][3];
        cr_assert(y + h <= ih && x + w <= iw, "test window %zu does not fit", i);
        check_window(jpeg, len, channels, y, x, h, w, what);
    }
    /* And random ones. */
    for (int i = 0; i < 40; i++) {
        size_t h = 1 + (size_t)(rng() % ih), w = 1 + (size_t)(rng() % iw);
        size_t y = (size_t)(rng() % (ih - h + 1)), x = (size_t)(rng() % (iw - w + 1));
        check_window(jpeg, len, channels, y, x, h, w, what);
    }
}

Test(image_window, equals_decode_then_crop_for_every_subsampling)
{
    struct {
        int subsamp;
        const char *name;
    } modes[] = {{TJSAMP_444, "4:4:4"}, {TJSAMP_422, "4:2:2"}, {TJSAMP_420, "4:2:0"},
                 {TJSAMP_440, "4:4:0"}, {TJSAMP_411, "4:1:1"}};
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        /* Sizes that are not multiples of the iMCU. */
        size_t ih = 123, iw = 157;
        unsigned long len;
        uint8_t *jpeg = encode(ih, iw, 3, modes[m].subsamp, TJFLAG_ACCURATEDCT, &len);
        check_many(jpeg, len, 3, ih, iw, modes[m].name);
        check_many(jpeg, len, 1, ih, iw, modes[m].name); /* luma only */
        tjFree(jpeg);
    }
}

Test(image_window, equals_decode_then_crop_for_progressive_and_gray)
{
    size_t ih = 97, iw = 131;
    unsigned long len;
    uint8_t *jpeg = encode(ih, iw, 3, TJSAMP_420, TJFLAG_ACCURATEDCT | TJFLAG_PROGRESSIVE, &len);
    check_many(jpeg, len, 3, ih, iw, "progressive 4:2:0");
    tjFree(jpeg);

    jpeg = encode(ih, iw, 1, TJSAMP_GRAY, TJFLAG_ACCURATEDCT, &len);
    check_many(jpeg, len, 0, ih, iw, "grayscale");
    check_many(jpeg, len, 3, ih, iw, "grayscale as RGB");
    tjFree(jpeg);
}

/* The window (y, x, h, w) of the image decoded at 1/denom, against the
 * scaled full decode (sl_image_decode_jpeg_scaled) cropped, byte for byte. */
static void check_scaled(const uint8_t *jpeg, unsigned long len, int channels, unsigned denom, size_t y, size_t x,
                         size_t h, size_t w, const char *what)
{
    sl_image_decoder_t *dec = NULL;
    cr_assert_eq(sl_image_decoder_new(&dec, err, sizeof err), 0, "%s", err);
    uint8_t *full = NULL, *win = NULL;
    sl_image_shape_t fs, ws;
    cr_assert_eq(sl_image_decode_jpeg_scaled(dec, jpeg, len, channels, SIZE_MAX, denom, &full, &fs, err, sizeof err),
                 0, "%s", err);
    cr_assert(y + h <= fs.h && x + w <= fs.w, "%s: test window %zu x %zu at (%zu, %zu) outside %zu x %zu at 1/%u", what,
              h, w, y, x, fs.h, fs.w, denom);
    size_t stride, first;
    int rc = sl_image_decode_jpeg_window_rows(jpeg, len, channels, SIZE_MAX, denom, y, x, h, w, &win, &stride,
                                              &first, &ws, err, sizeof err);
    cr_assert_eq(rc, 0, "%s: %s", what, err);
    cr_assert(ws.h == h && ws.w == w && ws.c == fs.c);
    cr_assert_geq(stride, first + w * fs.c);
    for (size_t r = 0; r < h; r++)
        for (size_t i = 0; i < w * fs.c; i++) {
            uint8_t got = win[r * stride + first + i], want = full[((y + r) * fs.w + x) * fs.c + i];
            if (got != want)
                cr_assert_fail("%s at 1/%u: window %zu x %zu at (%zu, %zu) of %zu x %zu x %zu differs at row %zu col "
                               "%zu channel %zu: %u, the scaled decode then a crop give %u",
                               what, denom, h, w, y, x, fs.h, fs.w, fs.c, r, i / fs.c, i % fs.c, got, want);
        }
    free(win);
    free(full);
    sl_image_decoder_free(dec);
}

/* Corners, edges, the whole scaled image, single pixels and random windows,
 * at each scale. */
static void check_scaled_many(const uint8_t *jpeg, unsigned long len, int channels, size_t ih, size_t iw,
                              const char *what)
{
    for (unsigned d = 2; d <= 8; d *= 2) {
        size_t sh = (ih + d - 1) / d, sw = (iw + d - 1) / d;
        size_t wins[][4] = {
            {0, 0, sh, sw}, {0, 0, 1, 1}, {sh - 1, sw - 1, 1, 1}, {sh / 2, sw / 2, sh - sh / 2, sw - sw / 2},
            {0, sw - 5, sh, 5}, {sh - 3, 0, 3, sw}, {1, 1, sh - 2, sw - 2},
        };
        for (size_t i = 0; i < sizeof wins / sizeof wins[0]; i++)
            check_scaled(jpeg, len, channels, d, wins[i][0], wins[i][1], wins[i][2], wins[i][3], what);
        for (int i = 0; i < 25; i++) {
            size_t h = 1 + (size_t)(rng() % sh), w = 1 + (size_t)(rng() % sw);
            size_t y = (size_t)(rng() % (sh - h + 1)), x = (size_t)(rng() % (sw - w + 1));
            check_scaled(jpeg, len, channels, d, y, x, h, w, what);
        }
    }
}

Test(image_window, scaled_equals_scaled_decode_then_crop)
{
    struct {
        int subsamp, flags;
        size_t c;
        const char *name;
    } modes[] = {{TJSAMP_444, 0, 3, "4:4:4"},
                 {TJSAMP_422, 0, 3, "4:2:2"},
                 {TJSAMP_420, 0, 3, "4:2:0"},
                 {TJSAMP_440, 0, 3, "4:4:0"},
                 {TJSAMP_411, 0, 3, "4:1:1"},
                 {TJSAMP_420, TJFLAG_PROGRESSIVE, 3, "progressive 4:2:0"},
                 {TJSAMP_GRAY, 0, 1, "grayscale"}};
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        /* Sides that are not multiples of the iMCU or of the scale. */
        size_t ih = 243, iw = 317;
        unsigned long len;
        uint8_t *jpeg = encode(ih, iw, modes[m].c, modes[m].subsamp, TJFLAG_ACCURATEDCT | modes[m].flags, &len);
        check_scaled_many(jpeg, len, modes[m].c == 3 ? 3 : 0, ih, iw, modes[m].name);
        check_scaled_many(jpeg, len, modes[m].c == 3 ? 1 : 3, ih, iw, modes[m].name);
        tjFree(jpeg);
    }
}

Test(image_window, scaled_refusals)
{
    size_t ih = 40, iw = 48;
    unsigned long len;
    uint8_t *jpeg = encode(ih, iw, 3, TJSAMP_420, TJFLAG_ACCURATEDCT, &len);
    uint8_t *out = (uint8_t *)"not touched";
    size_t stride, first;
    sl_image_shape_t ws;
    cr_assert_eq(sl_image_decode_jpeg_window_rows(jpeg, len, 3, SIZE_MAX, 3, 0, 0, 1, 1, &out, &stride, &first, &ws,
                                                  err, sizeof err),
                 SL_EINVAL);
    cr_assert_null(out);
    cr_assert(strstr(err, "scale 1/3") != NULL, "%s", err);
    /* 40 x 48 at 1/4 is 10 x 12: a window of 11 rows leaves it. */
    cr_assert_eq(sl_image_decode_jpeg_window_rows(jpeg, len, 3, SIZE_MAX, 4, 0, 0, 11, 1, &out, &stride, &first,
                                                  &ws, err, sizeof err),
                 SL_EINVAL);
    cr_assert(strstr(err, "leaves the image 10 x 12 (scaled)") != NULL, "%s", err);
    /* The limit is on the full size. */
    cr_assert_eq(sl_image_decode_jpeg_window_rows(jpeg, len, 3, 40 * 48 * 3 - 1, 8, 0, 0, 1, 1, &out, &stride,
                                                  &first, &ws, err, sizeof err),
                 SL_ETOOBIG);
    tjFree(jpeg);
}

Test(image_window, an_imagenet_sized_image)
{
    size_t ih = 375, iw = 500;
    unsigned long len;
    uint8_t *jpeg = encode(ih, iw, 3, TJSAMP_420, TJFLAG_ACCURATEDCT, &len);
    check_window(jpeg, len, 3, 0, 0, 256, 256, "top left 256");
    check_window(jpeg, len, 3, 119, 244, 256, 256, "bottom right 256");
    check_window(jpeg, len, 3, 60, 123, 256, 256, "inside 256");
    check_window(jpeg, len, 3, 59, 121, 256, 256, "odd 256");
    tjFree(jpeg);
}

Test(image_window, refusals)
{
    size_t ih = 40, iw = 48;
    unsigned long len;
    uint8_t *jpeg = encode(ih, iw, 3, TJSAMP_420, TJFLAG_ACCURATEDCT, &len);
    uint8_t *out = (uint8_t *)&out;
    sl_image_shape_t s;

    cr_assert_eq(sl_image_decode_jpeg_window(jpeg, len, 3, SIZE_MAX, 1, 0, 40, 48, &out, &s, err, sizeof err),
                 SL_EINVAL);
    cr_assert_null(out);
    cr_assert(strstr(err, "window 40 x 48 at (1, 0) leaves the image 40 x 48"), "%s", err);
    cr_assert_eq(sl_image_decode_jpeg_window(jpeg, len, 3, SIZE_MAX, 0, 0, 0, 4, &out, &s, err, sizeof err),
                 SL_EINVAL);
    cr_assert(strstr(err, "empty window"), "%s", err);
    cr_assert_eq(sl_image_decode_jpeg_window(jpeg, len, 2, SIZE_MAX, 0, 0, 4, 4, &out, &s, err, sizeof err),
                 SL_EINVAL);
    cr_assert(strstr(err, "channels 2"), "%s", err);
    /* The limit is on the whole image, as for a full decode. */
    cr_assert_eq(sl_image_decode_jpeg_window(jpeg, len, 3, 40 * 48 * 3 - 1, 0, 0, 4, 4, &out, &s, err, sizeof err),
                 SL_ETOOBIG);
    cr_assert(strstr(err, "40 x 48 x 3 image exceeds the limit"), "%s", err);
    cr_assert_eq(sl_image_decode_jpeg_window(jpeg, len, 3, 40 * 48 * 3, 0, 0, 4, 4, &out, &s, err, sizeof err), 0,
                 "%s", err);
    free(out);

    /* Not a JPEG; a header cut short; entropy data cut inside the window. */
    uint8_t junk[64] = {1, 2, 3};
    cr_assert_eq(sl_image_decode_jpeg_window(junk, sizeof junk, 3, SIZE_MAX, 0, 0, 1, 1, &out, &s, err, sizeof err),
                 SL_EDATA);
    cr_assert(strstr(err, "decode_jpeg: "), "%s", err);
    cr_assert_eq(sl_image_decode_jpeg_window(jpeg, 100, 3, SIZE_MAX, 0, 0, 1, 1, &out, &s, err, sizeof err),
                 SL_EDATA);
    cr_assert_eq(sl_image_decode_jpeg_window(jpeg, len / 2, 3, SIZE_MAX, 0, 0, 40, 48, &out, &s, err, sizeof err),
                 SL_EDATA, "a truncated file decodes: %s", err);
    cr_assert_null(out);
    cr_assert_eq(sl_image_decode_jpeg_window(jpeg, 0, 3, SIZE_MAX, 0, 0, 1, 1, &out, &s, err, sizeof err), SL_EDATA);
    cr_assert(strstr(err, "empty input"), "%s", err);
    tjFree(jpeg);
}

/* ---- big_alloc ---- */

Test(big_alloc, gives_usable_memory_of_any_size)
{
    size_t sizes[] = {0, 1, 4095, (4u << 20) - 1, 4u << 20, (9u << 20) + 123};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint8_t *p = sl__big_alloc(sizes[i]);
        cr_assert_not_null(p);
        memset(p, 0xa5, sizes[i]);
        if (sizes[i])
            cr_assert_eq(p[sizes[i] - 1], 0xa5);
        free(p);
    }
}

Test(big_alloc, setup_keeps_large_blocks_out_of_mmap)
{
    sl__big_alloc_setup(256u << 20);
    uint8_t *p = sl__big_alloc(40u << 20);
    cr_assert_not_null(p);
    memset(p, 1, 40u << 20);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33) && !defined(__SANITIZE_ADDRESS__)
    /* From the heap, not a mapping of its own that free() would unmap. */
    cr_assert_eq(mallinfo2().hblks, 0, "%zu mmapped chunks", mallinfo2().hblks);
#endif
    free(p);
    uint8_t *q = sl__big_alloc(40u << 20);
    cr_assert_not_null(q);
    free(q);
}
