/*
 * fuzz_jpeg.c: libFuzzer target for JPEG decoding (pipeline/image.c,
 * sl_image_decode_jpeg with TurboJPEG, and pipeline/image_window.c,
 * sl_image_decode_jpeg_window and sl_image_decode_jpeg_window_rows (at a
 * DCT scale too) with libjpeg, whose errors longjmp),
 * which
 * decode_jpeg runs on image bytes from the dataset's files.
 *
 * The input: a byte that picks the channels (0, 1 or 3), the limit on
 * h * w * c (12 KiB or 3 MiB) and a DCT scale (1/1 to 1/8), four bytes
 * that place a window, then the JPEG.
 *
 * Beyond "no crash, no leak" (a libjpeg error that longjmps out of the
 * window decoder must free what it holds): only the documented results and
 * a message on failure; a header over the limit refused with SL_ETOOBIG by
 * both decoders before they allocate (a header may claim 65535 x 65535:
 * the allocation would fail the run); on success the header's shape, and a
 * window that is byte for byte the same window cut out of the whole image
 * (libjpeg alone takes sampling factors TurboJPEG's header refuses, so a
 * window of an image whose header fails is not compared: decode_jpeg reads
 * the header with TurboJPEG before it decodes a window); at the scale, the
 * window of the scaled image the same as cut out of the scaled whole
 * decode;
 * and after any input, the decoder still reads a good JPEG's header (one
 * bad image must not fail the images after it).
 * Run it with scripts/fuzz.sh (FUZZ_TARGETS=fuzz_jpeg).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <turbojpeg.h>

#include "image.h"
#include "sluice.h"

#include "fuzz_check.h"

static sl_image_decoder_t *dec;
static unsigned char *good; /* a 16 x 8 JPEG, to show the decoder still works */
static unsigned long good_len;

static void start(void)
{
    char err[512];
    CHECK(sl_image_decoder_new(&dec, err, sizeof err) == 0);
    uint8_t px[8 * 16 * 3];
    for (size_t i = 0; i < sizeof px; i++)
        px[i] = (uint8_t)(i * 7);
    tjhandle tj = tjInitCompress();
    CHECK(tj != NULL);
    CHECK(tjCompress2(tj, px, 16, 0, 8, TJPF_RGB, &good, &good_len, TJSAMP_420, 90, 0) == 0);
    tjDestroy(tj);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512];
    if (!dec)
        start();
    if (size < 5)
        return 0;
    static const int chans[4] = {0, 1, 3, 0};
    int channels = chans[data[0] & 3];
    size_t max_pixels = data[0] & 4 ? (size_t)3 << 20 : (size_t)12 << 10;
    unsigned denom = 1u << ((data[0] >> 3) & 3);
    const uint8_t *win = data + 1;
    const uint8_t *src = data + 5;
    size_t len = size - 5;

    sl_image_shape_t hs = {0, 0, 0};
    err[0] = '\0';
    int hrc = sl_image_jpeg_header(dec, src, len, channels, &hs, err, sizeof err);
    CHECK(hrc == 0 || hrc == SL_EDATA);
    CHECK(hrc == 0 || err[0] != '\0');
    if (hrc == 0) {
        CHECK(hs.h >= 1 && hs.h <= 65535 && hs.w >= 1 && hs.w <= 65535);
        CHECK(channels == 0 ? hs.c == 1 || hs.c == 3 : hs.c == (size_t)channels);
    }
    bool over = hrc == 0 && hs.h * hs.w * hs.c > max_pixels;

    uint8_t *img = (uint8_t *)1;
    sl_image_shape_t s = {0, 0, 0};
    err[0] = '\0';
    int rc = sl_image_decode_jpeg(dec, src, len, channels, max_pixels, &img, &s, err, sizeof err);
    CHECK(rc == 0 || rc == SL_EDATA || rc == SL_ETOOBIG || rc == -ENOMEM);
    CHECK((rc == 0) == (img != NULL));
    if (rc < 0)
        CHECK(err[0] != '\0');
    if (hrc < 0)
        CHECK(rc == SL_EDATA);
    if (over)
        CHECK(rc == SL_ETOOBIG);
    if (rc == 0)
        CHECK(s.h == hs.h && s.w == hs.w && s.c == hs.c);

    /* A window: inside the image when the header was read, else anywhere
     * small (the decoder must refuse it or the data). */
    size_t y = win[0], x = win[1], h = (size_t)win[2] + 1, w = (size_t)win[3] + 1;
    if (hrc == 0) {
        y %= hs.h;
        x %= hs.w;
        h = 1 + (h - 1) % (hs.h - y);
        w = 1 + (w - 1) % (hs.w - x);
    }
    uint8_t *wimg = (uint8_t *)1;
    sl_image_shape_t ws = {0, 0, 0};
    err[0] = '\0';
    int wrc = sl_image_decode_jpeg_window(src, len, channels, max_pixels, y, x, h, w, &wimg, &ws, err, sizeof err);
    CHECK(wrc == 0 || wrc == SL_EDATA || wrc == SL_ETOOBIG || wrc == SL_EINVAL || wrc == -ENOMEM);
    CHECK((wrc == 0) == (wimg != NULL));
    if (wrc < 0)
        CHECK(err[0] != '\0');
    if (over)
        CHECK(wrc == SL_ETOOBIG);
    if (hrc == 0 && !over)
        CHECK(wrc != SL_ETOOBIG && wrc != SL_EINVAL);
    if (wrc == 0) {
        CHECK(ws.h == h && ws.w == w);
        if (hrc == 0)
            CHECK(ws.c == hs.c);
    }
    if (rc == 0) {
        /* What the whole decode read without a warning, the window reads too. */
        if (wrc != 0)
            fprintf(stderr, "fuzz_jpeg: window failed after the whole image decoded: %s\n", err);
        CHECK(wrc == 0);
        uint8_t *crop = malloc(h * w * s.c);
        CHECK(crop != NULL);
        CHECK(sl_image_crop(img, s, y, x, h, w, crop, err, sizeof err) == 0);
        CHECK(memcmp(crop, wimg, h * w * s.c) == 0);
        /* And the window in the rows as decoded (random_resized_crop's). */
        uint8_t *rows = NULL;
        size_t stride = 0, first = 0;
        sl_image_shape_t rs;
        CHECK(sl_image_decode_jpeg_window_rows(src, len, channels, max_pixels, 1, y, x, h, w, &rows, &stride, &first,
                                               &rs, err, sizeof err) == 0);
        CHECK(rs.h == h && rs.w == w && rs.c == s.c && stride >= first + w * s.c);
        for (size_t r = 0; r < h; r++)
            CHECK(memcmp(rows + r * stride + first, crop + r * w * s.c, w * s.c) == 0);
        free(rows);
        free(crop);
        /* At the scale: the window's place in the scaled image. */
        uint8_t *sc = NULL;
        sl_image_shape_t ss;
        if (sl_image_decode_jpeg_scaled(dec, src, len, channels, max_pixels, denom, &sc, &ss, err, sizeof err) == 0) {
            size_t sy = y / denom, sx = x / denom, sh = 1 + (h - 1) % (ss.h - sy), sw = 1 + (w - 1) % (ss.w - sx);
            rows = NULL;
            int src_rc = sl_image_decode_jpeg_window_rows(src, len, channels, max_pixels, denom, sy, sx, sh, sw,
                                                          &rows, &stride, &first, &rs, err, sizeof err);
            if (src_rc != 0)
                fprintf(stderr, "fuzz_jpeg: window at 1/%u failed after the scaled image decoded: %s\n", denom, err);
            CHECK(src_rc == 0);
            CHECK(rs.h == sh && rs.w == sw && rs.c == ss.c && stride >= first + sw * ss.c);
            for (size_t r = 0; r < sh; r++)
                CHECK(memcmp(rows + r * stride + first, sc + ((sy + r) * ss.w + sx) * ss.c, sw * ss.c) == 0);
            free(rows);
            free(sc);
        }
    }
    free(wimg);
    free(img);

    /* A bad image does not spoil the decoder for the next one. */
    sl_image_shape_t gs;
    CHECK(sl_image_jpeg_header(dec, good, good_len, 0, &gs, err, sizeof err) == 0);
    CHECK(gs.h == 8 && gs.w == 16 && gs.c == 3);
    return 0;
}
