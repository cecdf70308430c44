/*
 * test_image.c: the image kernels (pipeline/image.c): JPEG decoding of
 * images encoded here with tjCompress2, bilinear resize against values
 * computed by hand and against TensorFlow's per-pixel formula, crops,
 * flips, the random ops' determinism, normalize and the casts.
 *
 * Buffers handed to the kernels are malloc'd to their exact length, so that
 * AddressSanitizer catches any access past the end.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <turbojpeg.h>

#include "image.h"

static char err[256];

/* xorshift64*: test data that is the same on every run. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

static uint8_t *xmalloc(size_t n)
{
    uint8_t *p = malloc(n ? n : 1);
    cr_assert_not_null(p);
    return p;
}

static uint8_t *random_image(sl_image_shape_t s)
{
    uint8_t *p = xmalloc(s.h * s.w * s.c);
    for (size_t i = 0; i < s.h * s.w * s.c; i++)
        p[i] = (uint8_t)(rng() >> 56);
    return p;
}

/* A smooth color image (gradients and a soft ring) that JPEG keeps well. */
static uint8_t *smooth_image(size_t h, size_t w, size_t c)
{
    uint8_t *p = xmalloc(h * w * c);
    for (size_t y = 0; y < h; y++)
        for (size_t x = 0; x < w; x++) {
            double dx = (double)x - w / 2.0, dy = (double)y - h / 2.0;
            double ring = 60.0 * (1.0 - (dx * dx + dy * dy) / (double)(w * w / 4 + h * h / 4));
            uint8_t *px = p + (y * w + x) * c;
            px[0] = (uint8_t)(20 + 200 * x / w);
            if (c == 3) {
                px[1] = (uint8_t)(30 + 180 * y / h);
                px[2] = (uint8_t)(100 + ring);
            }
        }
    return p;
}

/* Encodes an image with TurboJPEG at quality 95; 4:4:4 for color.
 * @return the JPEG (free with tjFree), its size in *len */
static uint8_t *encode_flags(const uint8_t *img, size_t h, size_t w, size_t c, int flags, unsigned long *len)
{
    tjhandle tj = tjInitCompress();
    cr_assert_not_null(tj);
    unsigned char *jpeg = NULL;
    *len = 0;
    int rc = tjCompress2(tj, img, (int)w, 0, (int)h, c == 3 ? TJPF_RGB : TJPF_GRAY, &jpeg, len,
                         c == 3 ? TJSAMP_444 : TJSAMP_GRAY, 95, TJFLAG_ACCURATEDCT | flags);
    cr_assert_eq(rc, 0, "tjCompress2: %s", tjGetErrorStr2(tj));
    tjDestroy(tj);
    return jpeg;
}

static uint8_t *encode(const uint8_t *img, size_t h, size_t w, size_t c, unsigned long *len)
{
    return encode_flags(img, h, w, c, 0, len);
}

static sl_image_decoder_t *new_decoder(void)
{
    sl_image_decoder_t *dec = NULL;
    cr_assert_eq(sl_image_decoder_new(&dec, err, sizeof(err)), 0, "%s", err);
    cr_assert_not_null(dec);
    return dec;
}

static void max_mean_error(const uint8_t *a, const uint8_t *b, size_t n, int *max, double *mean)
{
    long sum = 0;
    *max = 0;
    for (size_t i = 0; i < n; i++) {
        int d = abs((int)a[i] - (int)b[i]);
        sum += d;
        if (d > *max)
            *max = d;
    }
    *mean = (double)sum / (double)n;
}

/* ---- JPEG ---- */

Test(image_jpeg, color_round_trip)
{
    size_t h = 48, w = 64;
    uint8_t *img = smooth_image(h, w, 3);
    unsigned long len;
    uint8_t *jpeg = encode(img, h, w, 3, &len);
    sl_image_decoder_t *dec = new_decoder();

    for (int channels = 0; channels <= 3; channels += 3) {
        uint8_t *out = NULL;
        sl_image_shape_t s = {0, 0, 0};
        int rc = sl_image_decode_jpeg(dec, jpeg, len, channels, SIZE_MAX, &out, &s, err, sizeof(err));
        cr_assert_eq(rc, 0, "%s", err);
        cr_assert_eq(s.h, h);
        cr_assert_eq(s.w, w);
        cr_assert_eq(s.c, 3);
        int max;
        double mean;
        max_mean_error(img, out, h * w * 3, &max, &mean);
        cr_assert_leq(max, 6, "max error %d", max);
        cr_assert_lt(mean, 1.5, "mean error %f", mean);
        free(out);
    }
    sl_image_decoder_free(dec);
    tjFree(jpeg);
    free(img);
}

Test(image_jpeg, progressive_decodes_as_baseline)
{
    /* Decoding limits the number of scans; a normal progressive file is
     * well within it and gives the same pixels as its baseline twin. */
    size_t h = 40, w = 72;
    uint8_t *img = smooth_image(h, w, 3);
    unsigned long blen, plen;
    uint8_t *base = encode(img, h, w, 3, &blen), *prog = encode_flags(img, h, w, 3, TJFLAG_PROGRESSIVE, &plen);
    sl_image_decoder_t *dec = new_decoder();
    uint8_t *a = NULL, *b = NULL;
    sl_image_shape_t sa, sb;
    cr_assert_eq(sl_image_decode_jpeg(dec, base, blen, 3, SIZE_MAX, &a, &sa, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(sl_image_decode_jpeg(dec, prog, plen, 3, SIZE_MAX, &b, &sb, err, sizeof(err)), 0, "%s", err);
    cr_assert(sb.h == h && sb.w == w && sb.c == 3);
    cr_assert_arr_eq(a, b, h * w * 3);
    free(b);
    free(a);
    sl_image_decoder_free(dec);
    tjFree(prog);
    tjFree(base);
    free(img);
}

Test(image_jpeg, grayscale)
{
    size_t h = 33, w = 17; /* not multiples of the 8x8 block */
    uint8_t *img = smooth_image(h, w, 1);
    unsigned long len;
    uint8_t *jpeg = encode(img, h, w, 1, &len);
    sl_image_decoder_t *dec = new_decoder();
    uint8_t *out = NULL;
    sl_image_shape_t s;
    int max;
    double mean;

    cr_assert_eq(sl_image_decode_jpeg(dec, jpeg, len, 0, SIZE_MAX, &out, &s, err, sizeof(err)), 0, "%s", err);
    cr_assert(s.h == h && s.w == w && s.c == 1);
    max_mean_error(img, out, h * w, &max, &mean);
    cr_assert_leq(max, 4, "max error %d", max);
    free(out);

    /* Three channels from a grayscale JPEG repeat the one. */
    cr_assert_eq(sl_image_decode_jpeg(dec, jpeg, len, 3, SIZE_MAX, &out, &s, err, sizeof(err)), 0, "%s", err);
    cr_assert(s.h == h && s.w == w && s.c == 3);
    for (size_t i = 0; i < h * w; i++) {
        cr_assert_eq(out[3 * i], out[3 * i + 1]);
        cr_assert_eq(out[3 * i], out[3 * i + 2]);
        cr_assert_leq(abs((int)out[3 * i] - (int)img[i]), 4);
    }
    free(out);
    sl_image_decoder_free(dec);
    tjFree(jpeg);
    free(img);
}

Test(image_jpeg, one_channel_from_color_is_luma)
{
    size_t h = 40, w = 56;
    uint8_t *img = smooth_image(h, w, 3);
    unsigned long len;
    uint8_t *jpeg = encode(img, h, w, 3, &len);
    sl_image_decoder_t *dec = new_decoder();
    uint8_t *out = NULL;
    sl_image_shape_t s;

    cr_assert_eq(sl_image_decode_jpeg(dec, jpeg, len, 1, SIZE_MAX, &out, &s, err, sizeof(err)), 0, "%s", err);
    cr_assert(s.h == h && s.w == w && s.c == 1);
    for (size_t i = 0; i < h * w; i++) {
        const uint8_t *p = img + 3 * i;
        double y = 0.299 * p[0] + 0.587 * p[1] + 0.114 * p[2];
        cr_assert_leq(abs((int)out[i] - (int)(y + 0.5)), 5, "pixel %zu: %d vs %f", i, out[i], y);
    }
    free(out);
    sl_image_decoder_free(dec);
    tjFree(jpeg);
    free(img);
}

Test(image_jpeg, header_only)
{
    size_t h = 24, w = 40;
    uint8_t *color = smooth_image(h, w, 3), *gray = smooth_image(h, w, 1);
    unsigned long clen, glen;
    uint8_t *cjpeg = encode(color, h, w, 3, &clen), *gjpeg = encode(gray, h, w, 1, &glen);
    sl_image_decoder_t *dec = new_decoder();
    sl_image_shape_t s;

    cr_assert_eq(sl_image_jpeg_header(dec, cjpeg, clen, 0, &s, err, sizeof(err)), 0, "%s", err);
    cr_assert(s.h == h && s.w == w && s.c == 3);
    cr_assert_eq(sl_image_jpeg_header(dec, cjpeg, clen, 1, &s, err, sizeof(err)), 0, "%s", err);
    cr_assert(s.h == h && s.w == w && s.c == 1);
    cr_assert_eq(sl_image_jpeg_header(dec, gjpeg, glen, 0, &s, err, sizeof(err)), 0, "%s", err);
    cr_assert(s.h == h && s.w == w && s.c == 1);
    cr_assert_eq(sl_image_jpeg_header(dec, gjpeg, glen, 3, &s, err, sizeof(err)), 0, "%s", err);
    cr_assert(s.h == h && s.w == w && s.c == 3);
    /* The header is enough: the scan data may be missing. */
    size_t sos = 0;
    for (size_t i = 2; i + 3 < clen && !sos; i++)
        if (cjpeg[i] == 0xff && cjpeg[i + 1] == 0xda)
            sos = i + 2 + ((size_t)cjpeg[i + 2] << 8 | cjpeg[i + 3]);
    cr_assert(sos > 0 && sos + 8 < clen);
    cr_assert_eq(sl_image_jpeg_header(dec, cjpeg, sos + 8, 0, &s, err, sizeof(err)), 0, "%s", err);
    cr_assert(s.h == h && s.w == w && s.c == 3);

    cr_assert_eq(sl_image_jpeg_header(dec, cjpeg, clen, 2, &s, err, sizeof(err)), SL_EINVAL);
    cr_assert(strstr(err, "channels 2"), "%s", err);
    cr_assert_eq(sl_image_jpeg_header(dec, cjpeg, 10, 0, &s, err, sizeof(err)), SL_EDATA);
    cr_assert(strncmp(err, "decode_jpeg: ", 13) == 0 && strlen(err) > 13, "%s", err);

    sl_image_decoder_free(dec);
    tjFree(gjpeg);
    tjFree(cjpeg);
    free(gray);
    free(color);
}

Test(image_jpeg, truncated_and_corrupt_are_edata)
{
    size_t h = 64, w = 64;
    uint8_t *img = smooth_image(h, w, 3);
    unsigned long len;
    uint8_t *jpeg = encode(img, h, w, 3, &len);
    sl_image_decoder_t *dec = new_decoder();
    uint8_t *out = (uint8_t *)1;
    sl_image_shape_t s;

    /* An exact-length copy of the first half, so ASan sees any overread. */
    size_t half = len / 2;
    uint8_t *cut = xmalloc(half);
    memcpy(cut, jpeg, half);
    err[0] = '\0';
    cr_assert_eq(sl_image_decode_jpeg(dec, cut, half, 3, SIZE_MAX, &out, &s, err, sizeof(err)), SL_EDATA);
    cr_assert_null(out);
    cr_assert(strstr(err, "decode_jpeg: ") == err, "%s", err);
    cr_assert(strstr(err, "Premature end of JPEG file"), "%s", err);
    free(cut);

    /* Not a JPEG at all. */
    uint8_t junk[64];
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = (uint8_t)rng();
    junk[0] = 0x12;
    cr_assert_eq(sl_image_decode_jpeg(dec, junk, sizeof(junk), 3, SIZE_MAX, &out, &s, err, sizeof(err)), SL_EDATA);
    cr_assert(strstr(err, "JPEG"), "%s", err);
    cr_assert_eq(sl_image_decode_jpeg(dec, junk, 0, 3, SIZE_MAX, &out, &s, err, sizeof(err)), SL_EDATA);
    cr_assert(strstr(err, "empty"), "%s", err);

    /* Scan data overwritten with junk: some error, never a crash. */
    uint8_t *bad = xmalloc(len);
    memcpy(bad, jpeg, len);
    for (size_t i = len / 2; i < len - 2; i++)
        bad[i] = (uint8_t)(rng() | 1);
    int rc = sl_image_decode_jpeg(dec, bad, len, 3, SIZE_MAX, &out, &s, err, sizeof(err));
    cr_assert(rc == SL_EDATA || rc == 0, "rc %d", rc);
    free(out);
    free(bad);

    /* The decoder works on after errors. */
    cr_assert_eq(sl_image_decode_jpeg(dec, jpeg, len, 3, SIZE_MAX, &out, &s, err, sizeof(err)), 0, "%s", err);
    cr_assert(s.h == h && s.w == w && s.c == 3);
    free(out);

    sl_image_decoder_free(dec);
    tjFree(jpeg);
    free(img);
}

/* @return the offset of the SOF0 segment's height field in a baseline JPEG */
static size_t sof_offset(const uint8_t *jpeg, size_t len)
{
    for (size_t i = 2; i + 9 < len; i++)
        if (jpeg[i] == 0xff && jpeg[i + 1] == 0xc0)
            return i + 5;
    cr_assert_fail("no SOF0 marker");
    return 0;
}

/* A header libjpeg fails after the SOI (a size over its 65500, a segment
 * cut short) left TurboJPEG's handle mid-stream, and the next image failed
 * with "two SOI markers" (found by tests/fuzz/fuzz_jpeg.c). */
Test(image_jpeg, bad_header_does_not_fail_the_next_image)
{
    size_t h = 16, w = 24;
    uint8_t *img = smooth_image(h, w, 3);
    unsigned long len;
    uint8_t *jpeg = encode(img, h, w, 3, &len);
    sl_image_decoder_t *dec = new_decoder();
    uint8_t *out = NULL;
    sl_image_shape_t s;

    uint8_t *huge = xmalloc(len);
    memcpy(huge, jpeg, len);
    size_t at = sof_offset(huge, len);
    memset(huge + at, 0xff, 4); /* 65535 x 65535 */
    size_t cut = at + 2;         /* inside the SOF segment */
    for (int round = 0; round < 2; round++) {
        cr_assert_eq(sl_image_jpeg_header(dec, huge, len, 3, &s, err, sizeof(err)), SL_EDATA);
        cr_assert(strstr(err, "65500"), "%s", err);
        cr_assert_eq(sl_image_jpeg_header(dec, jpeg, len, 3, &s, err, sizeof(err)), 0, "%s", err);
        cr_assert(s.h == h && s.w == w && s.c == 3);
        cr_assert_eq(sl_image_decode_jpeg(dec, huge, len, 3, SIZE_MAX, &out, &s, err, sizeof(err)), SL_EDATA);
        cr_assert_eq(sl_image_decode_jpeg(dec, jpeg, len, 3, SIZE_MAX, &out, &s, err, sizeof(err)), 0, "%s", err);
        free(out);
        cr_assert_eq(sl_image_decode_jpeg(dec, jpeg, cut, 3, SIZE_MAX, &out, &s, err, sizeof(err)), SL_EDATA);
        cr_assert_eq(sl_image_decode_jpeg(dec, jpeg, len, 3, SIZE_MAX, &out, &s, err, sizeof(err)), 0, "%s", err);
        cr_assert(s.h == h && s.w == w && s.c == 3);
        free(out);
    }
    sl_image_decoder_free(dec);
    free(huge);
    tjFree(jpeg);
    free(img);
}

/* libjpeg keeps tables across the images of a decompressor: a JPEG that
 * lacks its quantization table decoded with the previous image's on a
 * reused decoder, and failed on a fresh one (found by
 * tests/fuzz/fuzz_jpeg.c, as a window decode that disagreed). */
Test(image_jpeg, tables_of_the_previous_image_are_not_used)
{
    size_t h = 16, w = 16;
    uint8_t *img = smooth_image(h, w, 3);
    unsigned long len;
    uint8_t *jpeg = encode(img, h, w, 3, &len);
    uint8_t *notable = xmalloc(len);
    memcpy(notable, jpeg, len);
    size_t at = 0;
    for (size_t i = 2; i + 4 < len && !at; i++)
        if (notable[i] == 0xff && notable[i + 1] == 0xdb)
            at = i + 4;
    cr_assert(at > 0 && notable[at] == 0x00, "no DQT of table 0");
    notable[at] = 0x02; /* table 0 becomes table 2: the components' table 0 is missing */

    sl_image_decoder_t *dec = new_decoder();
    uint8_t *out = NULL;
    sl_image_shape_t s;
    cr_assert_eq(sl_image_decode_jpeg(dec, notable, len, 3, SIZE_MAX, &out, &s, err, sizeof(err)), SL_EDATA);
    cr_assert(strstr(err, "Quantization table 0x00"), "%s", err);
    cr_assert_eq(sl_image_decode_jpeg(dec, jpeg, len, 3, SIZE_MAX, &out, &s, err, sizeof(err)), 0, "%s", err);
    free(out);
    out = NULL;
    cr_assert_eq(sl_image_decode_jpeg(dec, notable, len, 3, SIZE_MAX, &out, &s, err, sizeof(err)), SL_EDATA);
    cr_assert_null(out);
    cr_assert(strstr(err, "Quantization table 0x00"), "%s", err);
    cr_assert_eq(sl_image_jpeg_header(dec, jpeg, len, 3, &s, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(sl_image_decode_jpeg(dec, notable, len, 3, SIZE_MAX, &out, &s, err, sizeof(err)), SL_EDATA);
    cr_assert_eq(sl_image_decode_jpeg_window(notable, len, 3, SIZE_MAX, 0, 0, h, w, &out, &s, err, sizeof(err)),
                 SL_EDATA);
    sl_image_decoder_free(dec);
    free(notable);
    tjFree(jpeg);
    free(img);
}

/* Leaves the stack below the caller full of 0x41 bytes, so that a local
 * read before it is set shows as a large number. */
__attribute__((noinline)) static void dirty_stack(void)
{
    volatile unsigned char junk[16384];
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = 0x41;
}

/* A stream of tables only (SOI, tables, EOI) is no image. TurboJPEG 2.1
 * accepts its header without setting the size, which was read unset: the
 * header passed with whatever the stack held (found by
 * tests/fuzz/fuzz_jpeg.c as an image size out of range). */
Test(image_jpeg, tables_only_stream_is_no_image)
{
    size_t h = 8, w = 8;
    uint8_t *img = smooth_image(h, w, 3);
    unsigned long len;
    uint8_t *jpeg = encode(img, h, w, 3, &len);
    size_t sof = sof_offset(jpeg, len) - 5;
    uint8_t *tables = xmalloc(sof + 2);
    memcpy(tables, jpeg, sof);
    tables[sof] = 0xff;
    tables[sof + 1] = 0xd9; /* EOI */

    sl_image_decoder_t *dec = new_decoder();
    for (int round = 0; round < 3; round++) {
        sl_image_shape_t s = {7, 7, 7};
        uint8_t *out = (uint8_t *)1;
        dirty_stack();
        cr_assert_eq(sl_image_jpeg_header(dec, tables, sof + 2, 0, &s, err, sizeof(err)), SL_EDATA);
        cr_assert(strstr(err, "no image"), "%s", err);
        cr_assert(s.h == 7 && s.w == 7 && s.c == 7);
        dirty_stack();
        cr_assert_eq(sl_image_decode_jpeg(dec, tables, sof + 2, 3, SIZE_MAX, &out, &s, err, sizeof(err)), SL_EDATA);
        cr_assert_null(out);
        cr_assert_eq(sl_image_decode_jpeg_window(tables, sof + 2, 3, SIZE_MAX, 0, 0, 1, 1, &out, &s, err,
                                                 sizeof(err)),
                     SL_EDATA);
        cr_assert_null(out);
    }
    sl_image_decoder_free(dec);
    free(tables);
    tjFree(jpeg);
    free(img);
}

Test(image_jpeg, max_pixels)
{
    size_t h = 30, w = 20;
    uint8_t *img = smooth_image(h, w, 3);
    unsigned long len;
    uint8_t *jpeg = encode(img, h, w, 3, &len);
    sl_image_decoder_t *dec = new_decoder();
    uint8_t *out = NULL;
    sl_image_shape_t s;

    cr_assert_eq(sl_image_decode_jpeg(dec, jpeg, len, 3, h * w * 3, &out, &s, err, sizeof(err)), 0, "%s", err);
    free(out);
    cr_assert_eq(sl_image_decode_jpeg(dec, jpeg, len, 3, h * w * 3 - 1, &out, &s, err, sizeof(err)), SL_ETOOBIG);
    cr_assert_null(out);
    cr_assert(strstr(err, "30 x 20 x 3"), "%s", err);
    /* The limit counts the channels asked for. */
    cr_assert_eq(sl_image_decode_jpeg(dec, jpeg, len, 1, h * w, &out, &s, err, sizeof(err)), 0, "%s", err);
    free(out);

    /* A header claiming 60000 x 60000 over truncated data: refused on the
     * header alone, before 10 GB are allocated or a scan is read. */
    uint8_t *big = xmalloc(len);
    memcpy(big, jpeg, len);
    size_t off = sof_offset(big, len);
    big[off] = 60000 >> 8;
    big[off + 1] = 60000 & 0xff;
    big[off + 2] = 60000 >> 8;
    big[off + 3] = 60000 & 0xff;
    cr_assert_eq(sl_image_jpeg_header(dec, big, len, 3, &s, err, sizeof(err)), 0, "%s", err);
    cr_assert(s.h == 60000 && s.w == 60000 && s.c == 3);
    cr_assert_eq(sl_image_decode_jpeg(dec, big, len, 3, (size_t)1 << 28, &out, &s, err, sizeof(err)), SL_ETOOBIG);
    cr_assert_null(out);
    cr_assert(strstr(err, "60000 x 60000 x 3") && strstr(err, "268435456"), "%s", err);
    free(big);

    sl_image_decoder_free(dec);
    tjFree(jpeg);
    free(img);
}

/* ---- resize ---- */

/* TensorFlow's ResizeBilinear (half_pixel_centers) written per pixel, as in
 * resize_bilinear_op.cc: the reference for the row-cached kernel. */
static void tf_resize(const uint8_t *src, sl_image_shape_t in, size_t oh, size_t ow, float *dst)
{
    float sy = (float)in.h / (float)oh, sx = (float)in.w / (float)ow;
    for (size_t y = 0; y < oh; y++) {
        float fy = ((float)y + 0.5f) * sy - 0.5f;
        float y0f = (float)(long)fy > fy ? (float)(long)fy - 1 : (float)(long)fy;
        long y0 = (long)y0f < 0 ? 0 : (long)y0f;
        long y1 = (long)y0f + (y0f < fy);
        if (y1 > (long)in.h - 1)
            y1 = (long)in.h - 1;
        float ty = fy - y0f;
        for (size_t x = 0; x < ow; x++) {
            float fx = ((float)x + 0.5f) * sx - 0.5f;
            float x0f = (float)(long)fx > fx ? (float)(long)fx - 1 : (float)(long)fx;
            long x0 = (long)x0f < 0 ? 0 : (long)x0f;
            long x1 = (long)x0f + (x0f < fx);
            if (x1 > (long)in.w - 1)
                x1 = (long)in.w - 1;
            float tx = fx - x0f;
            for (size_t k = 0; k < in.c; k++) {
                float tl = src[((size_t)y0 * in.w + (size_t)x0) * in.c + k];
                float tr = src[((size_t)y0 * in.w + (size_t)x1) * in.c + k];
                float bl = src[((size_t)y1 * in.w + (size_t)x0) * in.c + k];
                float br = src[((size_t)y1 * in.w + (size_t)x1) * in.c + k];
                float top = tl + (tr - tl) * tx;
                float bottom = bl + (br - bl) * tx;
                dst[(y * ow + x) * in.c + k] = top + (bottom - top) * ty;
            }
        }
    }
}

/* Resizes with both variants and checks them against expected values. */
static void check_resize(const uint8_t *src, sl_image_shape_t in, size_t oh, size_t ow, const float *want_f,
                         const uint8_t *want_u8)
{
    size_t n = oh * ow * in.c;
    float *f = (float *)xmalloc(n * sizeof(float));
    uint8_t *u = xmalloc(n);
    cr_assert_eq(sl_image_resize_f32(src, in, oh, ow, f, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(sl_image_resize_u8(src, in, oh, ow, u, err, sizeof(err)), 0, "%s", err);
    for (size_t i = 0; i < n; i++) {
        cr_assert_float_eq(f[i], want_f[i], 0.0, "f32[%zu] = %g, want %g", i, (double)f[i], (double)want_f[i]);
        cr_assert_eq(u[i], want_u8[i], "u8[%zu] = %d, want %d", i, u[i], want_u8[i]);
    }
    free(u);
    free(f);
}

Test(image_resize, up_2x2_to_4x4)
{
    /* Along each axis, 2 -> 4 samples at -0.25, 0.25, 0.75, 1.25: a, .75a+.25b, .25a+.75b, b. */
    const uint8_t src[] = {0, 100, 200, 40};
    const float want[] = {0,   25,     75,     100, /* */
                          50,  58.75f, 76.25f, 85,  /* */
                          150, 126.25f, 78.75f, 55, /* */
                          200, 160,    80,     40};
    const uint8_t want_u8[] = {0, 25, 75, 100, 50, 59, 76, 85, 150, 126, 79, 55, 200, 160, 80, 40};
    check_resize(src, (sl_image_shape_t){2, 2, 1}, 4, 4, want, want_u8);
}

Test(image_resize, down_4x4_to_2x2)
{
    /* 4 -> 2 samples at 0.5 and 2.5: the mean of each 2x2 block. */
    uint8_t src[16];
    for (int i = 0; i < 16; i++)
        src[i] = (uint8_t)(10 * i);
    const float want[] = {25, 45, 105, 125};
    const uint8_t want_u8[] = {25, 45, 105, 125};
    check_resize(src, (sl_image_shape_t){4, 4, 1}, 2, 2, want, want_u8);
}

Test(image_resize, non_square_rounds_half_to_even)
{
    /* 2x4 -> 4x2: rows as in up_2x2_to_4x4, columns as pair means. */
    const uint8_t src[] = {0, 20, 40, 60, 100, 100, 200, 200};
    const float want[] = {10, 50, 32.5f, 87.5f, 77.5f, 162.5f, 100, 200};
    const uint8_t want_u8[] = {10, 50, 32, 88, 78, 162, 100, 200};
    check_resize(src, (sl_image_shape_t){2, 4, 1}, 4, 2, want, want_u8);
}

Test(image_resize, one_row)
{
    /* 1x2x3 -> 1x4x3: the height stays, each channel as a, .75a+.25b, .25a+.75b, b. */
    const uint8_t src[] = {0, 100, 255, 40, 0, 255};
    const float want[] = {0, 100, 255, 10, 75, 255, 30, 25, 255, 40, 0, 255};
    const uint8_t want_u8[] = {0, 100, 255, 10, 75, 255, 30, 25, 255, 40, 0, 255};
    check_resize(src, (sl_image_shape_t){1, 2, 3}, 1, 4, want, want_u8);

    /* 1x3 -> 1x2 samples at 0.25 and 1.75. */
    const uint8_t src2[] = {0, 100, 200};
    const float want2[] = {25, 175};
    const uint8_t want2_u8[] = {25, 175};
    check_resize(src2, (sl_image_shape_t){1, 3, 1}, 1, 2, want2, want2_u8);

    /* A column, 3x1 -> 5x1, against the formula. */
    const uint8_t src3[] = {0, 50, 250};
    float want3[5];
    uint8_t want3_u8[5];
    tf_resize(src3, (sl_image_shape_t){3, 1, 1}, 5, 1, want3);
    sl_image_cast_f32_u8(want3, 5, want3_u8);
    check_resize(src3, (sl_image_shape_t){3, 1, 1}, 5, 1, want3, want3_u8);
}

Test(image_resize, identity_returns_input)
{
    sl_image_shape_t s = {7, 5, 3};
    uint8_t *src = random_image(s);
    size_t n = 7 * 5 * 3;
    uint8_t *u = xmalloc(n);
    float *f = (float *)xmalloc(n * sizeof(float));
    cr_assert_eq(sl_image_resize_u8(src, s, 7, 5, u, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(sl_image_resize_f32(src, s, 7, 5, f, err, sizeof(err)), 0, "%s", err);
    cr_assert_arr_eq(u, src, n);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(f[i], (float)src[i]);
    free(f);
    free(u);
    free(src);
}

Test(image_resize, matches_tensorflow_formula_and_variants_agree)
{
    static const size_t sizes[][4] = {{1, 1, 5, 3}, {5, 3, 1, 1}, {375, 500, 224, 224}, {17, 31, 64, 9},
                                      {64, 9, 17, 31}, {3, 3, 7, 2}, {10, 10, 10, 3}, {2, 200, 3, 7}};
    for (size_t t = 0; t < sizeof(sizes) / sizeof(sizes[0]); t++)
        for (size_t c = 1; c <= 3; c += 2) {
            sl_image_shape_t in = {sizes[t][0], sizes[t][1], c};
            size_t oh = sizes[t][2], ow = sizes[t][3], n = oh * ow * c;
            uint8_t *src = random_image(in);
            float *want = (float *)xmalloc(n * sizeof(float)), *f = (float *)xmalloc(n * sizeof(float));
            uint8_t *u = xmalloc(n), *fu = xmalloc(n);
            tf_resize(src, in, oh, ow, want);
            cr_assert_eq(sl_image_resize_f32(src, in, oh, ow, f, err, sizeof(err)), 0, "%s", err);
            cr_assert_eq(sl_image_resize_u8(src, in, oh, ow, u, err, sizeof(err)), 0, "%s", err);
            cr_assert(memcmp(f, want, n * sizeof(float)) == 0, "%zux%zux%zu -> %zux%zu differs from TF", in.h,
                      in.w, c, oh, ow);
            sl_image_cast_f32_u8(f, n, fu);
            cr_assert_arr_eq(u, fu, n, "u8 and rounded f32 differ");
            free(fu);
            free(u);
            free(f);
            free(want);
            free(src);
        }
}

/* Mirrors an image of h x w pixels of px bytes each, in place. */
static void mirror_pixels(uint8_t *img, size_t h, size_t w, size_t px, int dir)
{
    uint8_t tmp[64];
    for (size_t y = 0; y < h; y++)
        for (size_t x = 0; x < w; x++) {
            size_t my = dir == SL_IMAGE_FLIP_UP_DOWN ? h - 1 - y : y;
            size_t mx = dir == SL_IMAGE_FLIP_LEFT_RIGHT ? w - 1 - x : x;
            if (my * w + mx <= y * w + x)
                continue; /* each pair once */
            uint8_t *a = img + (y * w + x) * px, *b = img + (my * w + mx) * px;
            memcpy(tmp, a, px);
            memcpy(a, b, px);
            memcpy(b, tmp, px);
        }
}

/* The fused pass gives what flip, resize, flip and normalize give in turn,
 * to the bit, for every flip before and after, output and channel count,
 * down and up. */
Test(image_resize, fused_equals_flip_resize_normalize)
{
    static const size_t sizes[][4] = {{256, 256, 224, 224}, {375, 500, 224, 224}, {17, 31, 64, 9}, {64, 9, 17, 31},
                                      {1, 1, 5, 3},         {5, 3, 1, 1},         {2, 200, 3, 7}, {3, 3, 7, 2}};
    const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
    for (size_t t = 0; t < sizeof(sizes) / sizeof(sizes[0]); t++)
        for (size_t c = 1; c <= 3; c += 2)
            for (int flip = -1; flip <= 1; flip++)
                for (int after = -1; after <= 1; after++)
                    for (int mode = 0; mode < 3; mode++) { /* uint8, float32, normalized */
                        sl_image_shape_t in = {sizes[t][0], sizes[t][1], c}, out = {sizes[t][2], sizes[t][3], c};
                        size_t n = out.h * out.w * c;
                        uint8_t *src = random_image(in), *tmp = xmalloc(in.h * in.w * c), *u = xmalloc(n);
                        float *want = (float *)xmalloc(n * sizeof(float)),
                              *got = (float *)xmalloc(n * sizeof(float) + 4);
                        const uint8_t *from = src;
                        if (flip >= 0) {
                            cr_assert_eq(sl_image_flip(src, in, (sl_image_flip_dir_t)flip, tmp, err, sizeof(err)), 0);
                            from = tmp;
                        }
                        size_t bytes = n * (mode == 0 ? 1 : sizeof(float));
                        if (mode == 1) {
                            cr_assert_eq(sl_image_resize_f32(from, in, out.h, out.w, want, err, sizeof(err)), 0, "%s",
                                         err);
                            if (after >= 0)
                                mirror_pixels((uint8_t *)want, out.h, out.w, c * sizeof(float), after);
                        } else {
                            cr_assert_eq(sl_image_resize_u8(from, in, out.h, out.w, u, err, sizeof(err)), 0, "%s",
                                         err);
                            if (after >= 0)
                                mirror_pixels(u, out.h, out.w, c, after);
                            if (mode == 0)
                                memcpy(want, u, n);
                            else
                                cr_assert_eq(sl_image_normalize(u, out, mean, std, true, want, err, sizeof(err)), 0,
                                             "%s", err);
                        }
                        sl_image_resize_fuse_t f = {.flip = flip >= 0,
                                                    .flip_dir = flip >= 0 ? (sl_image_flip_dir_t)flip : 0,
                                                    .flip_after = after >= 0,
                                                    .flip_after_dir = after >= 0 ? (sl_image_flip_dir_t)after : 0,
                                                    .out_f32 = mode == 1,
                                                    .mean = mode == 2 ? mean : NULL,
                                                    .std = mode == 2 ? std : NULL,
                                                    .scale = true};
                        /* Written in place, or streamed a row at a time to a
                         * destination not 16-aligned (a batch's row). */
                        for (int far = 0; far < 2; far++) {
                            f.far_out = far;
                            uint8_t *to = (uint8_t *)got + (far ? 4 : 0);
                            cr_assert_eq(sl_image_resize_fused(src, in, &f, out.h, out.w, to, err, sizeof(err)), 0,
                                         "%s", err);
                            cr_assert(memcmp(to, want, bytes) == 0,
                                      "%zux%zux%zu -> %zux%zu, flip %d, flip after %d, mode %d, far %d differs", in.h,
                                      in.w, c, out.h, out.w, flip, after, mode, far);
                        }
                        free(got);
                        free(want);
                        free(u);
                        free(tmp);
                        free(src);
                    }
}

Test(image_resize, fused_bad_arguments)
{
    uint8_t src[12] = {0};
    float dst[12];
    const float mean[3] = {0, 0, 0}, bad_std[3] = {1, 0, 1};
    sl_image_resize_fuse_t f = {.flip = true, .flip_dir = (sl_image_flip_dir_t)7};
    cr_assert_eq(sl_image_resize_fused(src, (sl_image_shape_t){2, 2, 3}, &f, 2, 2, dst, err, sizeof(err)), SL_EINVAL);
    cr_assert(strstr(err, "unknown direction 7"), "%s", err);
    f = (sl_image_resize_fuse_t){.flip_after = true, .flip_after_dir = (sl_image_flip_dir_t)5};
    cr_assert_eq(sl_image_resize_fused(src, (sl_image_shape_t){2, 2, 3}, &f, 2, 2, dst, err, sizeof(err)), SL_EINVAL);
    cr_assert(strstr(err, "unknown direction 5"), "%s", err);
    f = (sl_image_resize_fuse_t){.mean = mean, .std = bad_std};
    cr_assert_eq(sl_image_resize_fused(src, (sl_image_shape_t){2, 2, 3}, &f, 2, 2, dst, err, sizeof(err)), SL_EINVAL);
    cr_assert(strstr(err, "std[1] = 0"), "%s", err);
    f = (sl_image_resize_fuse_t){.out_f32 = true};
    cr_assert_eq(sl_image_resize_fused(src, (sl_image_shape_t){2, 2, 3}, &f, 0, 2, dst, err, sizeof(err)), SL_EINVAL);
    cr_assert(strstr(err, "resize: output"), "%s", err);
}

Test(image_resize, bad_arguments)
{
    uint8_t src[12] = {0}, dst[64];
    float f[64];
    cr_assert_eq(sl_image_resize_u8(src, (sl_image_shape_t){2, 2, 3}, 0, 4, dst, err, sizeof(err)), SL_EINVAL);
    cr_assert(strstr(err, "resize: output"), "%s", err);
    cr_assert_eq(sl_image_resize_f32(src, (sl_image_shape_t){2, 2, 3}, 4, 0, f, err, sizeof(err)), SL_EINVAL);
    cr_assert_eq(sl_image_resize_u8(src, (sl_image_shape_t){0, 2, 3}, 2, 2, dst, err, sizeof(err)), SL_EINVAL);
    cr_assert(strstr(err, "resize: input"), "%s", err);
    cr_assert_eq(sl_image_resize_u8(src, (sl_image_shape_t){2, 2, 2}, 2, 2, dst, err, sizeof(err)), SL_EINVAL);
    cr_assert(strstr(err, "2 channels"), "%s", err);
    cr_assert_eq(sl_image_resize_u8(src, (sl_image_shape_t){2, 2, 1}, SIZE_MAX / 2, SIZE_MAX / 2, dst, err,
                                    sizeof(err)),
                 SL_EINVAL);
    cr_assert(strstr(err, "too large"), "%s", err);
}

/* ---- crops and flips ---- */

Test(image_crop, copies_the_window)
{
    sl_image_shape_t s = {4, 5, 3};
    uint8_t *src = random_image(s);
    uint8_t *dst = xmalloc(2 * 3 * 3);
    cr_assert_eq(sl_image_crop(src, s, 1, 2, 2, 3, dst, err, sizeof(err)), 0, "%s", err);
    for (size_t y = 0; y < 2; y++)
        for (size_t x = 0; x < 3; x++)
            for (size_t k = 0; k < 3; k++)
                cr_assert_eq(dst[(y * 3 + x) * 3 + k], src[((y + 1) * 5 + x + 2) * 3 + k]);
    free(dst);

    /* The whole image is a window too. */
    dst = xmalloc(4 * 5 * 3);
    cr_assert_eq(sl_image_crop(src, s, 0, 0, 4, 5, dst, err, sizeof(err)), 0, "%s", err);
    cr_assert_arr_eq(dst, src, 4 * 5 * 3);
    free(dst);
    free(src);
}

Test(image_crop, bounds)
{
    sl_image_shape_t s = {4, 5, 1};
    uint8_t src[20] = {0}, dst[20];
    cr_assert_eq(sl_image_crop(src, s, 3, 0, 2, 2, dst, err, sizeof(err)), SL_EINVAL);
    cr_assert(strstr(err, "leaves the image"), "%s", err);
    cr_assert_eq(sl_image_crop(src, s, 0, 4, 2, 2, dst, err, sizeof(err)), SL_EINVAL);
    cr_assert_eq(sl_image_crop(src, s, SIZE_MAX, 0, 1, 1, dst, err, sizeof(err)), SL_EINVAL);
    cr_assert_eq(sl_image_crop(src, s, 0, SIZE_MAX - 1, 1, 2, dst, err, sizeof(err)), SL_EINVAL);
    cr_assert_eq(sl_image_crop(src, s, 0, 0, 5, 1, dst, err, sizeof(err)), SL_EINVAL);
    cr_assert(strstr(err, "larger than the image"), "%s", err);
    cr_assert_eq(sl_image_crop(src, s, 0, 0, 0, 1, dst, err, sizeof(err)), SL_EINVAL);
    cr_assert(strstr(err, "empty window"), "%s", err);
    cr_assert_eq(sl_image_crop(src, s, 2, 3, 2, 2, dst, err, sizeof(err)), 0, "%s", err);
}

Test(image_crop, center_offsets)
{
    size_t y, x;
    cr_assert_eq(sl_image_center_crop_offsets((sl_image_shape_t){5, 7, 3}, 2, 3, &y, &x, err, sizeof(err)), 0);
    cr_assert(y == 1 && x == 2, "(%zu, %zu)", y, x);
    cr_assert_eq(sl_image_center_crop_offsets((sl_image_shape_t){375, 500, 3}, 224, 224, &y, &x, err, sizeof(err)),
                 0);
    cr_assert(y == 75 && x == 138, "(%zu, %zu)", y, x);
    cr_assert_eq(sl_image_center_crop_offsets((sl_image_shape_t){5, 7, 3}, 5, 7, &y, &x, err, sizeof(err)), 0);
    cr_assert(y == 0 && x == 0);
    cr_assert_eq(sl_image_center_crop_offsets((sl_image_shape_t){5, 7, 3}, 6, 7, &y, &x, err, sizeof(err)),
                 SL_EINVAL);
    cr_assert(strstr(err, "center_crop"), "%s", err);
}

Test(image_crop, random_offsets_deterministic_and_in_range)
{
    sl_image_shape_t s = {10, 20, 3};
    sl_rng_t a, b;
    bool seen_y[4] = {false}, seen_x[8] = {false};
    sl_rng_seed(&a, 42);
    sl_rng_seed(&b, 42);
    for (int i = 0; i < 500; i++) {
        size_t ya, xa, yb, xb;
        cr_assert_eq(sl_image_random_crop_offsets(&a, s, 7, 13, &ya, &xa, err, sizeof(err)), 0, "%s", err);
        cr_assert_eq(sl_image_random_crop_offsets(&b, s, 7, 13, &yb, &xb, err, sizeof(err)), 0, "%s", err);
        cr_assert(ya == yb && xa == xb);
        cr_assert(ya <= 3 && xa <= 7, "(%zu, %zu)", ya, xa);
        seen_y[ya] = seen_x[xa] = true;
    }
    /* Every offset, the extremes included, comes up. */
    for (int i = 0; i < 4; i++)
        cr_assert(seen_y[i], "y %d never drawn", i);
    for (int i = 0; i < 8; i++)
        cr_assert(seen_x[i], "x %d never drawn", i);

    /* Another seed, another sequence. */
    sl_rng_seed(&a, 42);
    sl_rng_seed(&b, 43);
    int differ = 0;
    for (int i = 0; i < 20; i++) {
        size_t ya, xa, yb, xb;
        sl_image_random_crop_offsets(&a, s, 7, 13, &ya, &xa, err, sizeof(err));
        sl_image_random_crop_offsets(&b, s, 7, 13, &yb, &xb, err, sizeof(err));
        differ += ya != yb || xa != xb;
    }
    cr_assert_gt(differ, 5);

    /* A window of the whole image has one place; too big has none. */
    size_t y, x;
    cr_assert_eq(sl_image_random_crop_offsets(&a, s, 10, 20, &y, &x, err, sizeof(err)), 0);
    cr_assert(y == 0 && x == 0);
    cr_assert_eq(sl_image_random_crop_offsets(&a, s, 11, 20, &y, &x, err, sizeof(err)), SL_EINVAL);
    cr_assert(strstr(err, "random_crop"), "%s", err);
}

/* RandomResizedCrop's window (torchvision's get_params): with the area and
 * the ratio fixed, the sides are known; sides round half to even, as
 * Python's round(); over 10^5 draws every window lies inside, its share of
 * the area and its ratio stay in bounds (but for rounding), the shares
 * spread over the range, and a seed repeats its windows. */
Test(image_crop, random_resized_crop_window)
{
    sl_rng_t a, b;
    size_t y, x, h, w;
    const double any_scale[2] = {0.08, 1.0}, any_ratio[2] = {3.0 / 4.0, 4.0 / 3.0};

    /* Fixed area and ratio: 500 x 375 (w x h), a quarter of it, square:
     * sqrt(46875) = 216.506 -> 217; half of it at ratio 2: 433 x 217. */
    sl_image_shape_t photo = {375, 500, 3};
    sl_rng_seed(&a, 1);
    const double quarter[2] = {0.25, 0.25}, square[2] = {1, 1}, half[2] = {0.5, 0.5}, wide[2] = {2, 2};
    cr_assert_eq(sl_image_random_resized_crop_window(&a, photo, quarter, square, &y, &x, &h, &w, err, sizeof err), 0,
                 "%s", err);
    cr_assert(h == 217 && w == 217 && y <= 375 - 217 && x <= 500 - 217, "%zu x %zu at (%zu, %zu)", h, w, y, x);
    cr_assert_eq(sl_image_random_resized_crop_window(&a, photo, half, wide, &y, &x, &h, &w, err, sizeof err), 0);
    cr_assert(h == 217 && w == 433, "%zu x %zu", h, w);

    /* Exact halves round to even: 2.5 -> 2 (10 x 10), 3.5 -> 4 (14 x 14). */
    const double sixteenth[2] = {0.0625, 0.0625};
    cr_assert_eq(sl_image_random_resized_crop_window(&a, (sl_image_shape_t){10, 10, 1}, sixteenth, square, &y, &x,
                                                     &h, &w, err, sizeof err),
                 0);
    cr_assert(h == 2 && w == 2, "%zu x %zu", h, w);
    cr_assert_eq(sl_image_random_resized_crop_window(&a, (sl_image_shape_t){14, 14, 1}, sixteenth, square, &y, &x,
                                                     &h, &w, err, sizeof err),
                 0);
    cr_assert(h == 4 && w == 4, "%zu x %zu", h, w);

    /* No window fits: the centered one of the nearest allowed ratio. A
     * 10 x 1000 strip (h x w) cannot hold 90% of its area at ratio <= 4/3:
     * 10 x round(13.33) = 13 at x = 493. A 1000 x 10 one: round(10 / 0.75)
     * = 13 x 10 at y = 493. A 1 x 1000 line: 1 x 1. */
    const double most[2] = {0.9, 1.0};
    cr_assert_eq(sl_image_random_resized_crop_window(&a, (sl_image_shape_t){10, 1000, 3}, most, any_ratio, &y, &x,
                                                     &h, &w, err, sizeof err),
                 0);
    cr_assert(h == 10 && w == 13 && y == 0 && x == 493, "%zu x %zu at (%zu, %zu)", h, w, y, x);
    cr_assert_eq(sl_image_random_resized_crop_window(&a, (sl_image_shape_t){1000, 10, 3}, most, any_ratio, &y, &x,
                                                     &h, &w, err, sizeof err),
                 0);
    cr_assert(h == 13 && w == 10 && y == 493 && x == 0, "%zu x %zu at (%zu, %zu)", h, w, y, x);
    cr_assert_eq(sl_image_random_resized_crop_window(&a, (sl_image_shape_t){1, 1000, 3}, most, any_ratio, &y, &x, &h,
                                                     &w, err, sizeof err),
                 0);
    cr_assert(h == 1 && w == 1 && y == 0 && x == 499, "%zu x %zu at (%zu, %zu)", h, w, y, x);

    /* 10^5 draws with the defaults, two generators of one seed in step. */
    sl_rng_seed(&a, 77);
    sl_rng_seed(&b, 77);
    const int n = 100000;
    double share_sum = 0, y_sum = 0;
    int small = 0, whole = 0, offsets = 0;
    for (int i = 0; i < n; i++) {
        size_t y2, x2, h2, w2;
        cr_assert_eq(sl_image_random_resized_crop_window(&a, photo, any_scale, any_ratio, &y, &x, &h, &w, err,
                                                         sizeof err),
                     0, "%s", err);
        sl_image_random_resized_crop_window(&b, photo, any_scale, any_ratio, &y2, &x2, &h2, &w2, err, sizeof err);
        cr_assert(y == y2 && x == x2 && h == h2 && w == w2, "draw %d differs under one seed", i);
        cr_assert(h >= 1 && w >= 1 && y + h <= photo.h && x + w <= photo.w, "draw %d: %zu x %zu at (%zu, %zu)", i, h,
                  w, y, x);
        double share = (double)(h * w) / (375.0 * 500.0), ratio = (double)w / (double)h;
        if (h == photo.h && w == photo.w) {
            whole++; /* the fallback, or a draw of (nearly) all of it */
            continue;
        }
        /* Each side is off by at most half a pixel from the drawn one. */
        cr_assert(share >= 0.08 * 0.98 && share <= 1.0, "draw %d: share %.4f", i, share);
        cr_assert(ratio >= 0.75 * 0.98 && ratio <= 4.0 / 3.0 * 1.02, "draw %d: ratio %.4f", i, ratio);
        share_sum += share;
        small += share < 0.2;
        if (h < photo.h) {
            y_sum += (double)y / (double)(photo.h - h);
            offsets++;
        }
    }
    double mean = share_sum / (n - whole), y_mean = y_sum / offsets;
    /* Shares drawn uniform on [0.08, 1], less the large ones whose shape
     * does not fit 500 x 375 (drawn again): torchvision's algorithm written
     * in Python (random.uniform, 2 x 10^5 draws) gives a mean share of
     * 0.4328 and 17.6% below 0.2. */
    cr_assert(mean > 0.425 && mean < 0.441, "mean share %.4f", mean);
    cr_assert(small > n * 17 / 100 && small < n * 181 / 1000, "%d of %d below 0.2", small, n);
    cr_assert(whole < n / 50, "%d whole images", whole);
    cr_assert(y_mean > 0.48 && y_mean < 0.52, "mean relative offset %.4f", y_mean);

    /* Bad arguments. */
    const double zero[2] = {0, 1}, upside[2] = {2, 1};
    cr_assert_eq(sl_image_random_resized_crop_window(&a, photo, zero, any_ratio, &y, &x, &h, &w, err, sizeof err),
                 SL_EINVAL);
    cr_assert(strstr(err, "random_resized_crop"), "%s", err);
    cr_assert_eq(sl_image_random_resized_crop_window(&a, photo, any_scale, upside, &y, &x, &h, &w, err, sizeof err),
                 SL_EINVAL);
}

/* A resize given a row stride reads a window of a wider image in place:
 * the same values as resizing the window copied out. */
Test(image_resize, strided_window_equals_copied_window)
{
    sl_image_shape_t big = {40, 64, 3}, win = {23, 37, 3};
    size_t y0 = 9, x0 = 17;
    uint8_t *src = xmalloc(big.h * big.w * 3), *copy = xmalloc(win.h * win.w * 3);
    for (size_t i = 0; i < big.h * big.w * 3; i++)
        src[i] = (uint8_t)rng();
    cr_assert_eq(sl_image_crop(src, big, y0, x0, win.h, win.w, copy, err, sizeof err), 0, "%s", err);
    const size_t outs[][2] = {{11, 13}, {23, 37}, {50, 61}, {1, 1}};
    for (size_t k = 0; k < sizeof outs / sizeof outs[0]; k++) {
        size_t oh = outs[k][0], ow = outs[k][1];
        float *want = malloc(oh * ow * 3 * sizeof(float)), *got = malloc(oh * ow * 3 * sizeof(float));
        cr_assert(want && got);
        cr_assert_eq(sl_image_resize_f32(copy, win, oh, ow, want, err, sizeof err), 0, "%s", err);
        sl_image_resize_fuse_t f = {.out_f32 = true, .stride = big.w * 3};
        cr_assert_eq(sl_image_resize_fused(src + (y0 * big.w + x0) * 3, win, &f, oh, ow, got, err, sizeof err), 0,
                     "%s", err);
        cr_assert_eq(memcmp(want, got, oh * ow * 3 * sizeof(float)), 0, "%zu x %zu", oh, ow);
        free(want);
        free(got);
    }
    /* A stride shorter than a row is refused. */
    float out[3];
    sl_image_resize_fuse_t f = {.out_f32 = true, .stride = win.w * 3 - 1};
    cr_assert_eq(sl_image_resize_fused(copy, win, &f, 1, 1, out, err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "stride"), "%s", err);
    free(copy);
    free(src);
}

/* ColorJitter's draw: every order of the four adjustments comes up about
 * as often (24 orders, 48,000 draws), factors stay in their ranges, absent
 * adjustments are left out, and a seed repeats its draws. The kernel:
 * brightness 0 is black, contrast 0 the grayscale's mean everywhere,
 * saturation 0 each pixel's grayscale, hue 0.5 on a pure red is cyan; a
 * 1-channel image takes brightness and contrast, and saturation and hue
 * leave it as it is. */
Test(image_jitter, draw_and_kernel)
{
    const bool all[4] = {true, true, true, true}, two[4] = {true, false, false, true};
    const double range[4][2] = {{0.6, 1.4}, {0.5, 1.5}, {0.0, 2.0}, {-0.1, 0.1}};
    sl_rng_t a, b;
    sl_rng_seed(&a, 5);
    sl_rng_seed(&b, 5);
    int seen[256] = {0};
    for (int i = 0; i < 48000; i++) {
        sl_image_jitter_t j, k;
        sl_image_color_jitter_draw(&a, all, range, &j);
        sl_image_color_jitter_draw(&b, all, range, &k);
        cr_assert_eq(memcmp(&j, &k, sizeof j), 0, "draw %d differs under one seed", i);
        cr_assert_eq(j.n, 4);
        int code = 0, used = 0;
        for (int x = 0; x < 4; x++) {
            int kind = (int)j.kind[x];
            cr_assert(kind >= 0 && kind < 4 && !(used & (1 << kind)), "draw %d: kind %d twice", i, kind);
            used |= 1 << kind;
            code = code * 4 + kind;
            cr_assert(j.factor[x] >= (float)range[kind][0] && j.factor[x] <= (float)range[kind][1], "draw %d: %g",
                      i, (double)j.factor[x]);
        }
        seen[code]++;
    }
    int orders = 0;
    for (int c = 0; c < 256; c++) {
        if (!seen[c])
            continue;
        orders++;
        cr_assert(seen[c] > 1700 && seen[c] < 2300, "order %d drawn %d times of 48000", c, seen[c]);
    }
    cr_assert_eq(orders, 24);
    sl_image_jitter_t j;
    sl_image_color_jitter_draw(&a, two, range, &j);
    cr_assert(j.n == 2 && (j.kind[0] == SL_IMAGE_JITTER_BRIGHTNESS || j.kind[0] == SL_IMAGE_JITTER_HUE) &&
              (j.kind[1] == SL_IMAGE_JITTER_BRIGHTNESS || j.kind[1] == SL_IMAGE_JITTER_HUE) && j.kind[0] != j.kind[1]);

    /* The kernel on a 1 x 3 image: red, a gray, a color. */
    uint8_t px[9] = {255, 0, 0, 100, 100, 100, 10, 200, 60}, img[9];
    sl_image_shape_t s3 = {1, 3, 3};
    sl_image_jitter_t one = {.n = 1, .kind = {SL_IMAGE_JITTER_BRIGHTNESS}, .factor = {0.0f}};
    memcpy(img, px, 9);
    cr_assert_eq(sl_image_color_jitter(img, s3, &one, err, sizeof err), 0, "%s", err);
    for (int i = 0; i < 9; i++)
        cr_assert_eq(img[i], 0);
    /* Grayscales (0.2989 R + 0.587 G + 0.114 B, truncated; the weights sum
     * to 0.9999, so a gray of 100 gives 99, as in torchvision): 76, 99, 127. */
    one = (sl_image_jitter_t){.n = 1, .kind = {SL_IMAGE_JITTER_SATURATION}, .factor = {0.0f}};
    memcpy(img, px, 9);
    sl_image_color_jitter(img, s3, &one, err, sizeof err);
    const uint8_t grays[3] = {76, 99, 127};
    for (int p = 0; p < 3; p++)
        cr_assert(img[3 * p] == grays[p] && img[3 * p + 1] == grays[p] && img[3 * p + 2] == grays[p], "pixel %d: %d",
                  p, img[3 * p]);
    /* Contrast 0: their mean, 302 / 3 = 100.67, truncated. */
    one = (sl_image_jitter_t){.n = 1, .kind = {SL_IMAGE_JITTER_CONTRAST}, .factor = {0.0f}};
    memcpy(img, px, 9);
    sl_image_color_jitter(img, s3, &one, err, sizeof err);
    for (int i = 0; i < 9; i++)
        cr_assert_eq(img[i], 100);
    /* Hue half a turn: red becomes cyan, a gray stays. */
    one = (sl_image_jitter_t){.n = 1, .kind = {SL_IMAGE_JITTER_HUE}, .factor = {0.5f}};
    memcpy(img, px, 9);
    sl_image_color_jitter(img, s3, &one, err, sizeof err);
    cr_assert(img[0] == 0 && img[1] == 255 && img[2] == 255, "%d %d %d", img[0], img[1], img[2]);
    cr_assert(img[3] == 100 && img[4] == 100 && img[5] == 100);
    /* One channel: brightness 0.5 halves (truncated), saturation and hue do nothing. */
    uint8_t g[3] = {9, 100, 255};
    sl_image_jitter_t mix = {.n = 3,
                             .kind = {SL_IMAGE_JITTER_SATURATION, SL_IMAGE_JITTER_HUE, SL_IMAGE_JITTER_BRIGHTNESS},
                             .factor = {0.0f, 0.3f, 0.5f}};
    cr_assert_eq(sl_image_color_jitter(g, (sl_image_shape_t){1, 3, 1}, &mix, err, sizeof err), 0);
    cr_assert(g[0] == 4 && g[1] == 50 && g[2] == 127, "%d %d %d", g[0], g[1], g[2]);
    cr_assert_eq(sl_image_color_jitter(g, (sl_image_shape_t){1, 3, 2}, &mix, err, sizeof err), SL_EINVAL);

    /* Grayscale keeps 3 channels, each the pixel's grayscale; 1 channel stays. */
    memcpy(img, px, 9);
    cr_assert_eq(sl_image_grayscale(img, s3, err, sizeof err), 0, "%s", err);
    for (int p = 0; p < 3; p++)
        cr_assert(img[3 * p] == grays[p] && img[3 * p + 1] == grays[p] && img[3 * p + 2] == grays[p], "pixel %d", p);
    uint8_t lone[3] = {1, 2, 3};
    cr_assert_eq(sl_image_grayscale(lone, (sl_image_shape_t){1, 3, 1}, err, sizeof err), 0);
    cr_assert(lone[0] == 1 && lone[1] == 2 && lone[2] == 3);
}

/* solarize: values at or above the threshold inverted, a fractional
 * threshold at its ceiling, 0 inverts all, 255 only 255; a bad threshold is
 * refused. */
Test(image_color, solarize)
{
    uint8_t all[256], img[256];
    for (int v = 0; v < 256; v++)
        all[v] = (uint8_t)v;
    const double thresholds[] = {128, 100.5, 0, 255, 254.01};
    for (size_t t = 0; t < sizeof thresholds / sizeof thresholds[0]; t++) {
        memcpy(img, all, sizeof img);
        cr_assert_eq(sl_image_solarize(img, (sl_image_shape_t){16, 16, 1}, thresholds[t], err, sizeof err), 0, "%s",
                     err);
        for (int v = 0; v < 256; v++)
            cr_assert_eq(img[v], v >= thresholds[t] ? 255 - v : v, "threshold %g, value %d: %d", thresholds[t], v,
                         img[v]);
    }
    memcpy(img, all, 255);
    cr_assert_eq(sl_image_solarize(img, (sl_image_shape_t){5, 17, 3}, 10, err, sizeof err), 0);
    cr_assert(img[9] == 9 && img[10] == 245 && img[254] == 1);
    cr_assert_eq(sl_image_solarize(img, (sl_image_shape_t){16, 16, 1}, 256, err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "threshold 256"), "%s", err);
    cr_assert_eq(sl_image_solarize(img, (sl_image_shape_t){16, 16, 2}, 1, err, sizeof err), SL_EINVAL);
}

/* gaussian_blur: a 1 x 5 impulse through a 1 x 3 kernel of sigma 1
 * (weights 0.274, 0.452, 0.274), reflection at the ends; a tiny sigma
 * changes nothing; a flat image stays flat; too small an image for the
 * kernel is refused, naming both. */
Test(image_blur, known_values_and_refusals)
{
    uint8_t row[5] = {0, 0, 255, 0, 0};
    cr_assert_eq(sl_image_gaussian_blur(row, (sl_image_shape_t){1, 5, 1}, 1, 3, 1.0f, err, sizeof err), 0, "%s", err);
    cr_assert(row[0] == 0 && row[1] == 70 && row[2] == 115 && row[3] == 70 && row[4] == 0, "%d %d %d %d %d", row[0],
              row[1], row[2], row[3], row[4]);
    /* At the edge: 255 at x = 0 reflects to x = -1 as its neighbour x = 1. */
    uint8_t edge[3] = {255, 0, 0};
    sl_image_gaussian_blur(edge, (sl_image_shape_t){1, 3, 1}, 1, 3, 1.0f, err, sizeof err);
    cr_assert(edge[0] == 115 && edge[1] == 70 && edge[2] == 0, "%d %d %d", edge[0], edge[1], edge[2]);

    sl_image_shape_t s = {17, 23, 3};
    uint8_t *img = xmalloc(17 * 23 * 3), *copy = xmalloc(17 * 23 * 3);
    for (size_t i = 0; i < 17 * 23 * 3; i++)
        img[i] = (uint8_t)rng();
    memcpy(copy, img, 17 * 23 * 3);
    cr_assert_eq(sl_image_gaussian_blur(img, s, 5, 7, 0.1f, err, sizeof err), 0, "%s", err);
    cr_assert_eq(memcmp(img, copy, 17 * 23 * 3), 0, "sigma 0.1: the neighbours weigh about e^-50");
    memset(img, 77, 17 * 23 * 3);
    cr_assert_eq(sl_image_gaussian_blur(img, s, 15, 21, 5.0f, err, sizeof err), 0, "%s", err);
    for (size_t i = 0; i < 17 * 23 * 3; i++)
        cr_assert_eq(img[i], 77);
    /* 17 rows hold a kernel of 33 (16 on each side), not 35. */
    cr_assert_eq(sl_image_gaussian_blur(img, s, 33, 3, 1.0f, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_image_gaussian_blur(img, s, 35, 3, 1.0f, err, sizeof err), SL_EDATA);
    cr_assert(strstr(err, "an image of 17 x 23 is too small for a kernel of 35 x 3"), "%s", err);
    cr_assert_eq(sl_image_gaussian_blur(img, s, 4, 3, 1.0f, err, sizeof err), SL_EINVAL);
    free(img);
    free(copy);
}

Test(image_flip, known_values)
{
    const uint8_t src[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, /* row 0: three RGB pixels */
                           10, 11, 12, 13, 14, 15, 16, 17, 18};
    const uint8_t lr[] = {7, 8, 9, 4, 5, 6, 1, 2, 3, 16, 17, 18, 13, 14, 15, 10, 11, 12};
    const uint8_t ud[] = {10, 11, 12, 13, 14, 15, 16, 17, 18, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    uint8_t dst[18];
    sl_image_shape_t s = {2, 3, 3};
    cr_assert_eq(sl_image_flip(src, s, SL_IMAGE_FLIP_LEFT_RIGHT, dst, err, sizeof(err)), 0);
    cr_assert_arr_eq(dst, lr, 18);
    cr_assert_eq(sl_image_flip(src, s, SL_IMAGE_FLIP_UP_DOWN, dst, err, sizeof(err)), 0);
    cr_assert_arr_eq(dst, ud, 18);
    /* In place gives the same. */
    memcpy(dst, src, 18);
    cr_assert_eq(sl_image_flip(dst, s, SL_IMAGE_FLIP_LEFT_RIGHT, dst, err, sizeof(err)), 0);
    cr_assert_arr_eq(dst, lr, 18);
    memcpy(dst, src, 18);
    cr_assert_eq(sl_image_flip(dst, s, SL_IMAGE_FLIP_UP_DOWN, dst, err, sizeof(err)), 0);
    cr_assert_arr_eq(dst, ud, 18);

    cr_assert_eq(sl_image_flip(src, s, (sl_image_flip_dir_t)7, dst, err, sizeof(err)), SL_EINVAL);
    cr_assert(strstr(err, "direction 7"), "%s", err);
    cr_assert_eq(sl_image_flip(src, (sl_image_shape_t){2, 3, 4}, SL_IMAGE_FLIP_UP_DOWN, dst, err, sizeof(err)),
                 SL_EINVAL);
}

Test(image_flip, twice_is_identity)
{
    static const size_t shapes[][3] = {{1, 1, 1}, {1, 1, 3}, {4, 5, 3}, {5, 4, 1}, {3, 2000, 3}, {7, 1, 3}};
    for (size_t t = 0; t < sizeof(shapes) / sizeof(shapes[0]); t++)
        for (int dir = 0; dir <= 1; dir++) {
            sl_image_shape_t s = {shapes[t][0], shapes[t][1], shapes[t][2]};
            size_t n = s.h * s.w * s.c;
            uint8_t *src = random_image(s), *a = xmalloc(n), *b = xmalloc(n);
            cr_assert_eq(sl_image_flip(src, s, (sl_image_flip_dir_t)dir, a, err, sizeof(err)), 0);
            cr_assert_eq(sl_image_flip(a, s, (sl_image_flip_dir_t)dir, b, err, sizeof(err)), 0);
            cr_assert_arr_eq(b, src, n);
            /* In place, twice. */
            cr_assert_eq(sl_image_flip(b, s, (sl_image_flip_dir_t)dir, b, err, sizeof(err)), 0);
            cr_assert_arr_eq(b, a, n);
            cr_assert_eq(sl_image_flip(b, s, (sl_image_flip_dir_t)dir, b, err, sizeof(err)), 0);
            cr_assert_arr_eq(b, src, n);
            free(b);
            free(a);
            free(src);
        }
}

Test(image_flip, random_flip_per_seed)
{
    sl_image_shape_t s = {3, 4, 3};
    uint8_t *src = random_image(s), *flipped_img = xmalloc(36), *dst = xmalloc(36), *dst2 = xmalloc(36);
    int heads = 0, tails = 0;
    cr_assert_eq(sl_image_flip(src, s, SL_IMAGE_FLIP_LEFT_RIGHT, flipped_img, err, sizeof(err)), 0);
    for (uint64_t seed = 0; seed < 64; seed++) {
        sl_rng_t a, b;
        bool fa, fb;
        sl_rng_seed(&a, seed);
        sl_rng_seed(&b, seed);
        cr_assert_eq(sl_image_random_flip(&a, src, s, SL_IMAGE_FLIP_LEFT_RIGHT, dst, &fa, err, sizeof(err)), 0);
        cr_assert_eq(sl_image_random_flip(&b, src, s, SL_IMAGE_FLIP_LEFT_RIGHT, dst2, &fb, err, sizeof(err)), 0);
        cr_assert_eq(fa, fb, "seed %llu", (unsigned long long)seed);
        cr_assert_arr_eq(dst, dst2, 36);
        cr_assert_arr_eq(dst, fa ? flipped_img : src, 36);
        heads += fa;
        tails += !fa;
    }
    cr_assert(heads > 10 && tails > 10, "%d flipped, %d not", heads, tails);

    /* In place: flipped or untouched. */
    memcpy(dst, src, 36);
    sl_rng_t r;
    bool f;
    sl_rng_seed(&r, 1);
    cr_assert_eq(sl_image_random_flip(&r, dst, s, SL_IMAGE_FLIP_LEFT_RIGHT, dst, &f, err, sizeof(err)), 0);
    cr_assert_arr_eq(dst, f ? flipped_img : src, 36);
    cr_assert_eq(sl_image_random_flip(&r, dst, s, (sl_image_flip_dir_t)2, dst, NULL, err, sizeof(err)), SL_EINVAL);
    free(dst2);
    free(dst);
    free(flipped_img);
    free(src);
}

Test(image_rng, deterministic_and_bounded)
{
    sl_rng_t a, b;
    sl_rng_seed(&a, 0);
    sl_rng_seed(&b, 0);
    uint64_t first = sl_rng_next(&a);
    cr_assert_eq(first, sl_rng_next(&b));
    cr_assert_neq(first, 0);
    cr_assert_neq(first, sl_rng_next(&a));

    /* below(n) stays below n and covers it about evenly. */
    int counts[6] = {0};
    for (int i = 0; i < 6000; i++) {
        uint64_t v = sl_rng_below(&a, 6);
        cr_assert_lt(v, 6);
        counts[v]++;
    }
    for (int i = 0; i < 6; i++)
        cr_assert(counts[i] > 850 && counts[i] < 1150, "%d drawn %d times", i, counts[i]);
    cr_assert_eq(sl_rng_below(&a, 1), 0);
    cr_assert_eq(sl_rng_below(&a, 0), 0);
    uint64_t big = UINT64_MAX / 2 + 3;
    for (int i = 0; i < 100; i++)
        cr_assert_lt(sl_rng_below(&a, big), big);

    /* jitter_ms(500): 250 to 749, spread over the range (a worker's
     * reconnect delay: a fleet does not come back in step). */
    int64_t lo = 1000, hi = 0;
    for (int i = 0; i < 2000; i++) {
        int64_t ms = sl_rng_jitter_ms(&a, 500);
        cr_assert(ms >= 250 && ms < 750, "%lld", (long long)ms);
        lo = ms < lo ? ms : lo;
        hi = ms > hi ? ms : hi;
    }
    cr_assert(lo < 275 && hi > 725, "drawn from %lld to %lld only", (long long)lo, (long long)hi);
    cr_assert_eq(sl_rng_jitter_ms(&a, 0), 0);

    /* Uniform doubles in [lo, hi): bounded, spread, a lone point when lo = hi. */
    double sum = 0, least = 1e9, most = -1e9;
    for (int i = 0; i < 100000; i++) {
        double u = sl_rng_uniform(&a, -0.5, 1.5);
        cr_assert(u >= -0.5 && u < 1.5, "%g", u);
        sum += u;
        least = u < least ? u : least;
        most = u > most ? u : most;
    }
    cr_assert(sum / 100000 > 0.49 && sum / 100000 < 0.51, "mean %g", sum / 100000);
    cr_assert(least < -0.49 && most > 1.49, "drawn from %g to %g only", least, most);
    cr_assert_eq(sl_rng_uniform(&a, 0.25, 0.25), 0.25);
}

/* ---- normalize and cast ---- */

Test(image_normalize, exact_values)
{
    const uint8_t src[] = {0, 128, 255, 64, 1, 200};
    sl_image_shape_t s = {1, 2, 3};
    const float mean[] = {128, 0, 100}, std[] = {2, 1, 0.5f};
    float dst[6];
    cr_assert_eq(sl_image_normalize(src, s, mean, std, false, dst, err, sizeof(err)), 0, "%s", err);
    const float want[] = {-64, 128, 310, -32, 1, 200};
    for (int i = 0; i < 6; i++)
        cr_assert_eq(dst[i], want[i], "[%d] = %g, want %g", i, (double)dst[i], (double)want[i]);

    /* ImageNet's constants with scaling: exactly the expression, every byte. */
    const float im_mean[] = {0.485f, 0.456f, 0.406f}, im_std[] = {0.229f, 0.224f, 0.225f};
    uint8_t all[768];
    float out[768];
    for (int i = 0; i < 768; i++)
        all[i] = (uint8_t)(i / 3);
    cr_assert_eq(sl_image_normalize(all, (sl_image_shape_t){1, 256, 3}, im_mean, im_std, true, out, err,
                                    sizeof(err)),
                 0, "%s", err);
    for (int i = 0; i < 768; i++) {
        int k = i % 3;
        float want_v = ((float)all[i] / 255.0f - im_mean[k]) / im_std[k];
        cr_assert_eq(out[i], want_v, "[%d]", i);
    }
    cr_assert_float_eq(out[0], -0.485f / 0.229f, 1e-6);
    cr_assert_float_eq(out[767], (1.0f - 0.406f) / 0.225f, 1e-6);

    /* One channel. */
    const float m1 = 0.5f, s1 = 0.5f;
    cr_assert_eq(sl_image_normalize(all, (sl_image_shape_t){16, 16, 1}, &m1, &s1, true, out, err, sizeof(err)), 0);
    cr_assert_eq(out[0], -1.0f);
    cr_assert_eq(out[255], (85.0f / 255.0f - 0.5f) / 0.5f);

    /* Written past the cache a row at a time (a batch's row), to a
     * destination not 16-aligned: the same floats, none outside. */
    float ref[768], far[770];
    for (int rows = 1; rows <= 16; rows *= 4) {
        sl_image_shape_t fs = {(size_t)rows, 256 / (size_t)rows, 3};
        cr_assert_eq(sl_image_normalize(all, fs, im_mean, im_std, true, ref, err, sizeof(err)), 0, "%s", err);
        memset(far, 0x7f, sizeof far);
        cr_assert_eq(sl_image_normalize_far(all, fs, im_mean, im_std, true, far + 1, true, err, sizeof(err)), 0, "%s",
                     err);
        cr_assert_eq(memcmp(far + 1, ref, sizeof ref), 0, "%d rows", rows);
        uint32_t guard;
        memcpy(&guard, &far[769], 4);
        cr_assert_eq(guard, 0x7f7f7f7fu);
        memcpy(&guard, &far[0], 4);
        cr_assert_eq(guard, 0x7f7f7f7fu);
    }
}

Test(image_normalize, bad_std_and_mean)
{
    const uint8_t src[3] = {1, 2, 3};
    float dst[3];
    sl_image_shape_t s = {1, 1, 3};
    const float mean[] = {0, 0, 0}, ok[] = {1, 1, 1};
    const float zero[] = {1, 0, 1}, neg[] = {1, 1, -1}, nan[] = {__builtin_nanf(""), 1, 1};
    const float inf_mean[] = {0, __builtin_inff(), 0};
    cr_assert_eq(sl_image_normalize(src, s, mean, zero, false, dst, err, sizeof(err)), SL_EINVAL);
    cr_assert(strstr(err, "std[1]"), "%s", err);
    cr_assert_eq(sl_image_normalize(src, s, mean, neg, false, dst, err, sizeof(err)), SL_EINVAL);
    cr_assert(strstr(err, "std[2]"), "%s", err);
    cr_assert_eq(sl_image_normalize(src, s, mean, nan, false, dst, err, sizeof(err)), SL_EINVAL);
    cr_assert(strstr(err, "std[0]"), "%s", err);
    cr_assert_eq(sl_image_normalize(src, s, inf_mean, ok, false, dst, err, sizeof(err)), SL_EINVAL);
    cr_assert(strstr(err, "mean[1]"), "%s", err);
    cr_assert_eq(sl_image_normalize(src, s, mean, ok, false, dst, err, sizeof(err)), 0);
}

Test(image_cast, round_trips_and_saturation)
{
    uint8_t all[256], back[256];
    float f[256];
    int32_t i32[256];
    for (int i = 0; i < 256; i++)
        all[i] = (uint8_t)i;
    sl_image_cast_u8_f32(all, 256, f);
    sl_image_cast_f32_u8(f, 256, back);
    sl_image_cast_u8_i32(all, 256, i32);
    for (int i = 0; i < 256; i++) {
        cr_assert_eq(f[i], (float)i);
        cr_assert_eq(i32[i], i);
    }
    cr_assert_arr_eq(back, all, 256);

    const float in[] = {-1.0f, -0.0f, 300.0f, __builtin_nanf(""), __builtin_inff(), -__builtin_inff(),
                        0.5f, 1.5f, 2.5f, 254.5f, 254.6f, 0.49999997f, 255.49f, 1e30f, -1e30f, 0.50000006f};
    const uint8_t want[] = {0, 0, 255, 0, 255, 0, 0, 2, 2, 254, 255, 0, 255, 255, 0, 1};
    uint8_t out[sizeof(want)];
    sl_image_cast_f32_u8(in, sizeof(want), out);
    for (size_t i = 0; i < sizeof(want); i++)
        cr_assert_eq(out[i], want[i], "%g -> %d, want %d", (double)in[i], out[i], want[i]);
}

/* binary16 bits to float, exactly (every half is a float). */
static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
    if (e == 0x1f)
        bits = sign | 0x7f800000u | (m << 13);
    else if (e != 0)
        bits = sign | ((e + 112) << 23) | (m << 13);
    else {
        /* Subnormal: m * 2^-24. */
        float v = (float)m / 16777216.0f;
        return sign ? -v : v;
    }
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

/* The float one step from positive f, down (d = -1) or up (d = 1). */
static float step(float f, int d)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof(bits));
    bits = (uint32_t)((int64_t)bits + d);
    memcpy(&f, &bits, sizeof(f));
    return f;
}

static uint16_t half(float f)
{
    uint16_t h;
    sl_image_cast_f32_f16(&f, 1, &h);
    return h;
}

Test(image_cast, float16_known_values)
{
    cr_assert_eq(half(1.0f), 0x3c00);
    cr_assert_eq(half(65504.0f), 0x7bff);
    cr_assert_eq(half(1e-8f), 0x0000);
    cr_assert_eq(half(-1e-8f), 0x8000);
    cr_assert_eq(half(__builtin_inff()), 0x7c00);
    cr_assert_eq(half(-__builtin_inff()), 0xfc00);
    cr_assert_eq(half(0.0f), 0x0000);
    cr_assert_eq(half(-0.0f), 0x8000);
    cr_assert_eq(half(-2.0f), 0xc000);
    cr_assert_eq(half(0.5f), 0x3800);
    cr_assert_eq(half(0.1f), 0x2e66);
    cr_assert_eq(half(65519.0f), 0x7bff);              /* below the midpoint to 65536 */
    cr_assert_eq(half(65520.0f), 0x7c00);              /* the midpoint: to even, which is inf */
    cr_assert_eq(half(1e6f), 0x7c00);                  /* overflow */
    cr_assert_eq(half(1.0f + 1.0f / 2048), 0x3c00);    /* tie, down to even */
    cr_assert_eq(half(1.0f + 3.0f / 2048), 0x3c02);    /* tie, up to even */
    cr_assert_eq(half(6.103515625e-05f), 0x0400);      /* 2^-14, the smallest normal */
    cr_assert_eq(half(5.9604644775390625e-08f), 0x0001); /* 2^-24, the smallest subnormal */
    cr_assert_eq(half(2.98023223876953125e-08f), 0x0000); /* 2^-25: tie, to even zero */
    cr_assert_eq(half(4.4703483581542969e-08f), 0x0001);  /* 1.5 * 2^-25 */
    cr_assert_eq(half(8.940696716308594e-08f), 0x0002);   /* 1.5 * 2^-24: tie, up to even */
    uint16_t n = half(__builtin_nanf(""));
    cr_assert((n & 0x7c00) == 0x7c00 && (n & 0x3ff) != 0, "NaN -> %#x", n);
}

Test(image_cast, float16_every_half_and_midpoint)
{
    /* Each finite half maps back to itself; the midpoint between two
     * neighbours goes to the even one; just off it, to the nearer one. */
    for (uint32_t h = 0; h < 0x7c00; h++) {
        float f = f16_to_f32((uint16_t)h);
        cr_assert_eq(half(f), h, "%#x", h);
        cr_assert_eq(half(-f), h | 0x8000, "-%#x", h);
        if (h + 1 < 0x7c00) {
            float next = f16_to_f32((uint16_t)(h + 1));
            float mid = f + (next - f) / 2;
            cr_assert_eq(half(mid), (h & 1) ? h + 1 : h, "midpoint after %#x", h);
            cr_assert_eq(half(step(mid, -1)), h, "below midpoint after %#x", h);
            cr_assert_eq(half(step(mid, 1)), h + 1, "above midpoint after %#x", h);
        }
    }
#ifdef __FLT16_MAX__
    /* And the compiler's own conversion agrees on random floats. */
    for (int i = 0; i < 200000; i++) {
        uint32_t bits = (uint32_t)rng();
        float f;
        memcpy(&f, &bits, sizeof(f));
        if (f != f)
            continue;
        _Float16 c = (_Float16)f;
        uint16_t want;
        memcpy(&want, &c, sizeof(want));
        cr_assert_eq(half(f), want, "%a", (double)f);
    }
#endif
}

/* ---- DCT scaling ---- */

/* A photo-like image: smooth colour fields, a few shapes with hard edges,
 * fine texture and sensor noise (as the JPEG benchmark's pictures). */
static uint8_t *photo_image(size_t h, size_t w, size_t c, double noise)
{
    uint8_t *p = xmalloc(h * w * c);
    struct {
        size_t y0, x0, y1, x1;
        int col[3];
        bool disc;
    } shapes[6];
    for (int i = 0; i < 6; i++) {
        shapes[i].y0 = (size_t)(rng() % h);
        shapes[i].x0 = (size_t)(rng() % w);
        shapes[i].y1 = shapes[i].y0 + 10 + (size_t)(rng() % (h / 2));
        shapes[i].x1 = shapes[i].x0 + 10 + (size_t)(rng() % (w / 2));
        for (int k = 0; k < 3; k++)
            shapes[i].col[k] = (int)(rng() % 256);
        shapes[i].disc = rng() & 1;
    }
    for (size_t y = 0; y < h; y++)
        for (size_t x = 0; x < w; x++)
            for (size_t k = 0; k < c; k++) {
                double fx = (double)x / (double)w, fy = (double)y / (double)h;
                double v = 120 + 70 * sin(6.0 * fx + 2.0 * (double)k) * cos(4.0 * fy) +
                           25 * sin(40.0 * fx + 31.0 * fy + (double)k) + 12 * sin(120.0 * fx) * sin(90.0 * fy);
                for (int i = 0; i < 6; i++) {
                    bool in;
                    if (shapes[i].disc) {
                        double cy = (shapes[i].y0 + shapes[i].y1) / 2.0, cx = (shapes[i].x0 + shapes[i].x1) / 2.0;
                        double ry = (shapes[i].y1 - shapes[i].y0) / 2.0, rx = (shapes[i].x1 - shapes[i].x0) / 2.0;
                        double dy = ((double)y - cy) / ry, dx = ((double)x - cx) / rx;
                        in = dx * dx + dy * dy <= 1.0;
                    } else {
                        in = y >= shapes[i].y0 && y < shapes[i].y1 && x >= shapes[i].x0 && x < shapes[i].x1;
                    }
                    if (in)
                        v = shapes[i].col[k];
                }
                /* Roughly normal noise: the sum of four uniforms. */
                double n = 0;
                for (int j = 0; j < 4; j++)
                    n += (double)(rng() >> 11) / 9007199254740992.0 - 0.5;
                v += n * noise * 1.732;
                p[(y * w + x) * c + k] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : (int)(v + 0.5));
            }
    return p;
}

static uint8_t *encode_q(const uint8_t *img, size_t h, size_t w, size_t c, int subsamp, int quality,
                         unsigned long *len)
{
    tjhandle tj = tjInitCompress();
    cr_assert_not_null(tj);
    unsigned char *jpeg = NULL;
    *len = 0;
    int rc = tjCompress2(tj, img, (int)w, 0, (int)h, c == 3 ? TJPF_RGB : TJPF_GRAY, &jpeg, len, subsamp, quality,
                         TJFLAG_ACCURATEDCT);
    cr_assert_eq(rc, 0, "tjCompress2: %s", tjGetErrorStr2(tj));
    tjDestroy(tj);
    return jpeg;
}

/* The mean of each output pixel's footprint in the input (an area
 * resize: what an antialiased downscale converges to), rounded. */
static uint8_t *area_resize(const uint8_t *src, sl_image_shape_t in, size_t oh, size_t ow)
{
    uint8_t *dst = xmalloc(oh * ow * in.c);
    for (size_t y = 0; y < oh; y++)
        for (size_t x = 0; x < ow; x++)
            for (size_t k = 0; k < in.c; k++) {
                double y0 = (double)y * in.h / oh, y1 = (double)(y + 1) * in.h / oh;
                double x0 = (double)x * in.w / ow, x1 = (double)(x + 1) * in.w / ow;
                double sum = 0, area = 0;
                for (size_t yy = (size_t)y0; yy < in.h && (double)yy < y1; yy++) {
                    double wy = fmin(y1, (double)yy + 1) - fmax(y0, (double)yy);
                    for (size_t xx = (size_t)x0; xx < in.w && (double)xx < x1; xx++) {
                        double wx = fmin(x1, (double)xx + 1) - fmax(x0, (double)xx);
                        sum += wy * wx * src[(yy * in.w + xx) * in.c + k];
                        area += wy * wx;
                    }
                }
                dst[(y * ow + x) * in.c + k] = (uint8_t)(sum / area + 0.5);
            }
    return dst;
}

static double psnr(const uint8_t *a, const uint8_t *b, size_t n)
{
    double se = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        se += d * d;
    }
    return se == 0 ? 99.0 : 10.0 * log10(255.0 * 255.0 / (se / (double)n));
}

/* A JPEG of a tolerance test, and the bounds it is held to. */
struct photo_case {
    size_t h, w, c;
    int subsamp;
    double noise, min_psnr, max_mean;
};

/* pc's photo-like image (photo_image()) as a JPEG at quality 90 (tjFree
 * it), and its whole decode (*full, malloc'd, of shape *fs). */
static uint8_t *photo_jpeg(sl_image_decoder_t *dec, const struct photo_case *pc, size_t *len, uint8_t **full,
                           sl_image_shape_t *fs)
{
    uint8_t *img = photo_image(pc->h, pc->w, pc->c, pc->noise);
    unsigned long n;
    uint8_t *jpeg = encode_q(img, pc->h, pc->w, pc->c, pc->subsamp, 90, &n);
    free(img);
    *len = n;
    *full = NULL;
    cr_assert_eq(sl_image_decode_jpeg(dec, jpeg, n, (int)pc->c, SIZE_MAX, full, fs, err, sizeof err), 0, "%s", err);
    return jpeg;
}

Test(image_jpeg, scale_denom)
{
    sl_image_shape_t s = {375, 500, 3};
    cr_assert_eq(sl_image_jpeg_scale_denom(s, 224, 224), 1, "more than half of the height kept");
    cr_assert_eq(sl_image_jpeg_scale_denom(s, 187, 250), 2, "exactly half (rounded down) each way");
    cr_assert_eq(sl_image_jpeg_scale_denom(s, 188, 100), 1, "more than half of one side");
    cr_assert_eq(sl_image_jpeg_scale_denom(s, 112, 112), 2);
    cr_assert_eq(sl_image_jpeg_scale_denom(s, 93, 125), 4);
    cr_assert_eq(sl_image_jpeg_scale_denom(s, 46, 62), 8);
    cr_assert_eq(sl_image_jpeg_scale_denom(s, 1, 1), 8, "at most 1/8");
    cr_assert_eq(sl_image_jpeg_scale_denom((sl_image_shape_t){1, 1, 3}, 1, 1), 1);
}

Test(image_jpeg, scaled_decode_shape_and_refusal)
{
    sl_image_decoder_t *dec = new_decoder();
    const size_t dims[][2] = {{375, 500}, {333, 501}, {17, 9}, {8, 8}};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        size_t h = dims[i][0], w = dims[i][1];
        uint8_t *img = photo_image(h, w, 3, 4);
        unsigned long len;
        uint8_t *jpeg = encode_q(img, h, w, 3, TJSAMP_420, 90, &len);
        for (unsigned d = 1; d <= 8; d *= 2) {
            uint8_t *out = NULL;
            sl_image_shape_t s;
            cr_assert_eq(sl_image_decode_jpeg_scaled(dec, jpeg, len, 3, SIZE_MAX, d, &out, &s, err, sizeof err), 0,
                         "%s", err);
            cr_assert_eq(s.h, (h + d - 1) / d, "%zu x %zu at 1/%u", h, w, d);
            cr_assert_eq(s.w, (w + d - 1) / d);
            cr_assert_eq(s.c, 3);
            if (d == 1) {
                uint8_t *full = NULL;
                sl_image_shape_t fs;
                cr_assert_eq(sl_image_decode_jpeg(dec, jpeg, len, 3, SIZE_MAX, &full, &fs, err, sizeof err), 0);
                cr_assert_eq(memcmp(full, out, h * w * 3), 0, "1/1 is the plain decode");
                free(full);
            }
            free(out);
        }
        uint8_t *out = NULL;
        sl_image_shape_t s;
        cr_assert_eq(sl_image_decode_jpeg_scaled(dec, jpeg, len, 3, SIZE_MAX, 3, &out, &s, err, sizeof err), SL_EINVAL);
        cr_assert_null(out);
        cr_assert_eq(sl_image_decode_jpeg_scaled(dec, jpeg, len, 3, h * w * 3 - 1, 8, &out, &s, err, sizeof err),
                     SL_ETOOBIG, "the limit is on the full size: %s", err);
        tjFree(jpeg);
        free(img);
    }
    sl_image_decoder_free(dec);
}

/*
 * The tolerance of DCT scaling, stated in docs/dataset-spec.md (decode_jpeg):
 * decoding at 1/d then resizing to the target against decoding whole then
 * resizing (tf.image.resize's bilinear, which takes two taps per output
 * pixel however far it shrinks), on ImageNet-sized images. The two are
 * different filters, so the bound is on the mean (PSNR), and the scaled
 * path must be the nearer of the two to an area resize of the full decode
 * (the antialiased result): it averages all of each block where the
 * bilinear resize skips pixels.
 */
Test(image_jpeg, scaled_decode_then_resize_within_tolerance)
{
    sl_image_decoder_t *dec = new_decoder();
    const struct photo_case imgs[] = {
        {375, 500, 3, TJSAMP_420, 4, 27.0, 6.0},
        {500, 375, 3, TJSAMP_444, 4, 27.0, 6.0},
        {480, 640, 1, TJSAMP_GRAY, 4, 27.0, 6.0},
        {480, 640, 3, TJSAMP_420, 4, 27.0, 6.0},
        {375, 500, 1, TJSAMP_GRAY, 4, 27.0, 6.0},
        {375, 500, 3, TJSAMP_420, 16, 26.0, 9.0}, /* heavy noise: the worst case */
    };
    /* Half each way (rounded down: 1/2 exactly), then smaller. */
    const size_t targets[][2] = {{0, 0}, {160, 160}, {112, 112}, {80, 80}, {64, 64}, {40, 40}};
    double worst = 99;
    for (size_t i = 0; i < sizeof imgs / sizeof imgs[0]; i++) {
        size_t h = imgs[i].h, w = imgs[i].w, c = imgs[i].c, len;
        uint8_t *full;
        sl_image_shape_t fs;
        uint8_t *jpeg = photo_jpeg(dec, &imgs[i], &len, &full, &fs);
        for (size_t t = 0; t < sizeof targets / sizeof targets[0]; t++) {
            size_t oh = t ? targets[t][0] : h / 2, ow = t ? targets[t][1] : w / 2, n = oh * ow * c;
            unsigned d = sl_image_jpeg_scale_denom(fs, oh, ow);
            cr_assert_gt(d, 1);
            uint8_t *scaled = NULL;
            sl_image_shape_t ss;
            cr_assert_eq(sl_image_decode_jpeg_scaled(dec, jpeg, len, (int)c, SIZE_MAX, d, &scaled, &ss, err,
                                                     sizeof err),
                         0, "%s", err);
            /* As decode_jpeg fused with a resize does: the output mapped onto
             * the h / d x w / d pixels the scaled image spans. */
            sl_image_resize_fuse_t f = {.extent_h = (float)h / (float)d, .extent_w = (float)w / (float)d};
            uint8_t *a = xmalloc(n), *b = xmalloc(n);
            cr_assert_eq(sl_image_resize_u8(full, fs, oh, ow, a, err, sizeof err), 0, "%s", err);
            cr_assert_eq(sl_image_resize_fused(scaled, ss, &f, oh, ow, b, err, sizeof err), 0, "%s", err);
            uint8_t *ref = area_resize(full, fs, oh, ow);
            int maxd;
            double mean;
            max_mean_error(a, b, n, &maxd, &mean);
            double p_ab = psnr(a, b, n), p_a = psnr(a, ref, n), p_b = psnr(b, ref, n);
            cr_log_info("%zux%zux%zu noise %.0f -> %zux%zu at 1/%u: max |diff| %d, mean %.2f, PSNR %.1f dB; "
                        "against an area resize: unscaled %.1f dB, scaled %.1f dB",
                        h, w, c, imgs[i].noise, oh, ow, d, maxd, mean, p_ab, p_a, p_b);
            cr_assert_geq(p_ab, t ? imgs[i].min_psnr : 34.0, "%zu: %zux%zu at 1/%u: PSNR %.1f dB", i, oh, ow, d, p_ab);
            cr_assert_leq(mean, imgs[i].max_mean, "%zu: %zux%zu at 1/%u: mean %.2f", i, oh, ow, d, mean);
            cr_assert_leq(maxd, 128, "%zu: %zux%zu at 1/%u: max %d", i, oh, ow, d, maxd);
            /* Bilinear at exactly 1/2 averages 2 x 2 pixels: an area resize
             * itself. Below that it skips pixels, the scaled IDCT does not. */
            if (t)
                cr_assert_gt(p_b, p_a, "%zu: %zux%zu at 1/%u: the scaled path is nearer an area resize", i, oh, ow,
                             d);
            if (p_ab < worst)
                worst = p_ab;
            free(a);
            free(b);
            free(ref);
            free(scaled);
        }
        free(full);
        tjFree(jpeg);
    }
    cr_log_info("worst PSNR %.1f dB", worst);
    sl_image_decoder_free(dec);
}

/*
 * The same tolerance for random_resized_crop fused with decode_jpeg
 * (docs/dataset-spec.md): a window at least twice the output each way is
 * decoded at 1/d (sl_image_decode_jpeg_window_rows(), the scaled rows it
 * reaches into) and resized from where it lies in them (origin and extent),
 * against decoding whole, cropping and resizing. Windows as the op draws
 * them (the default scale and ratio), on ImageNet-sized and larger images,
 * every scale reached. The scaled path must also be, over the windows of an
 * image and output, the nearer of the two to an area resize of the window.
 */
Test(image_jpeg, scaled_window_then_resize_within_tolerance)
{
    sl_image_decoder_t *dec = new_decoder();
    const struct photo_case imgs[] = {
        {375, 500, 3, TJSAMP_420, 4, 26.0, 6.0},   {500, 375, 3, TJSAMP_444, 4, 26.0, 6.0},
        {480, 640, 1, TJSAMP_GRAY, 4, 26.0, 6.0},  {960, 1280, 3, TJSAMP_420, 4, 26.0, 6.0},
        {1200, 900, 3, TJSAMP_422, 4, 26.0, 6.0},  {375, 500, 3, TJSAMP_420, 16, 26.0, 9.0},
    };
    /* Down to 1/11 a side, bilinear's two taps alias where the scaled IDCT
     * averages: 26.6 dB the least here (a 359 x 339 window to 32 x 32), the
     * scaled result then 40.5 dB from an area resize, the unscaled 27.6. */
    const size_t outs[][2] = {{224, 224}, {112, 112}, {64, 48}, {32, 32}};
    const double scale[2] = {0.08, 1.0}, ratio[2] = {3.0 / 4.0, 4.0 / 3.0};
    unsigned reached = 0, windows = 0;
    double worst = 99;
    for (size_t i = 0; i < sizeof imgs / sizeof imgs[0]; i++) {
        size_t c = imgs[i].c, len;
        uint8_t *full;
        sl_image_shape_t fs;
        uint8_t *jpeg = photo_jpeg(dec, &imgs[i], &len, &full, &fs);
        for (size_t o = 0; o < sizeof outs / sizeof outs[0]; o++) {
            size_t oh = outs[o][0], ow = outs[o][1], n = oh * ow * c;
            sl_rng_t rng;
            sl_rng_seed(&rng, 1000 * i + o);
            double near_scaled = 0, near_unscaled = 0;
            for (int k = 0; k < 12; k++) {
                size_t y, x, wh, ww;
                cr_assert_eq(sl_image_random_resized_crop_window(&rng, fs, scale, ratio, &y, &x, &wh, &ww, err,
                                                                 sizeof err),
                             0, "%s", err);
                sl_image_shape_t win = {wh, ww, c};
                unsigned d = sl_image_jpeg_scale_denom(win, oh, ow);
                if (d == 1)
                    continue;
                reached |= d;
                windows++;
                /* The fused path, as do_random_resized_crop() runs it. */
                size_t y0 = y / d, x0 = x / d, y1 = (y + wh + d - 1) / d, x1 = (x + ww + d - 1) / d, stride, first;
                uint8_t *rows = NULL;
                sl_image_shape_t rs;
                cr_assert_eq(sl_image_decode_jpeg_window_rows(jpeg, len, (int)c, SIZE_MAX, d, y0, x0, y1 - y0,
                                                              x1 - x0, &rows, &stride, &first, &rs, err, sizeof err),
                             0, "%s", err);
                sl_image_resize_fuse_t f = {.origin_h = (float)(y % d) / (float)d,
                                            .origin_w = (float)(x % d) / (float)d,
                                            .extent_h = (float)wh / (float)d,
                                            .extent_w = (float)ww / (float)d,
                                            .stride = stride};
                uint8_t *a = xmalloc(n), *b = xmalloc(n), *crop = xmalloc(wh * ww * c);
                cr_assert_eq(sl_image_resize_fused(rows + first, rs, &f, oh, ow, b, err, sizeof err), 0, "%s", err);
                /* Apart: the whole decode, the window cut out, resized. */
                cr_assert_eq(sl_image_crop(full, fs, y, x, wh, ww, crop, err, sizeof err), 0, "%s", err);
                cr_assert_eq(sl_image_resize_u8(crop, win, oh, ow, a, err, sizeof err), 0, "%s", err);
                uint8_t *ref = area_resize(crop, win, oh, ow);
                int maxd;
                double mean;
                max_mean_error(a, b, n, &maxd, &mean);
                double p_ab = psnr(a, b, n);
                near_unscaled += psnr(a, ref, n);
                near_scaled += psnr(b, ref, n);
                cr_assert_geq(p_ab, imgs[i].min_psnr, "%zu: window %zux%zu at (%zu, %zu) -> %zux%zu at 1/%u: %.1f dB",
                              i, wh, ww, y, x, oh, ow, d, p_ab);
                cr_assert_leq(mean, imgs[i].max_mean, "%zu: window %zux%zu -> %zux%zu at 1/%u: mean %.2f", i, wh, ww,
                              oh, ow, d, mean);
                cr_assert_leq(maxd, 128, "%zu: window %zux%zu -> %zux%zu at 1/%u: max %d", i, wh, ww, oh, ow, d, maxd);
                if (p_ab < worst)
                    worst = p_ab;
                free(a);
                free(b);
                free(crop);
                free(ref);
                free(rows);
            }
            cr_assert_geq(near_scaled, near_unscaled, "%zu -> %zux%zu: against an area resize, scaled %.1f dB in "
                          "all, unscaled %.1f", i, oh, ow, near_scaled, near_unscaled);
        }
        free(full);
        tjFree(jpeg);
    }
    cr_log_info("%u windows scaled, worst PSNR %.1f dB", windows, worst);
    cr_assert_eq(reached, 2 | 4 | 8, "scales reached: %u", reached);
    sl_image_decoder_free(dec);
}
