/*
 * image_window.c: decoding only a window of a JPEG (image.h), with
 * libjpeg-turbo's libjpeg API: TurboJPEG 2.1 has no cropping call.
 *
 * Decoding what sl_image_decode_jpeg() decodes, in the same way: the
 * accurate integer IDCT (JDCT_ISLOW), fancy upsampling, RGB or grayscale
 * output, a warning fails the image (as TJFLAG_STOPONWARNING) and a
 * progressive JPEG of more than 500 scans is refused (as
 * TJFLAG_LIMITSCANS). Only the window's neighbourhood is decoded:
 *
 * - columns: jpeg_crop_scanline() over the window widened by one iMCU on
 *   each side (it rounds the left edge down to an iMCU boundary itself).
 *   Fancy upsampling reads a chroma sample's neighbours, and at the edge of
 *   a cropped region it repeats the edge sample instead: the margin keeps
 *   the window's pixels away from those edges, so they come out as in a full
 *   decode.
 * - rows: jpeg_skip_scanlines() up to one iMCU above the window (the skipped
 *   rows are entropy-decoded but get no IDCT, upsampling or colour
 *   conversion), then rows are read up to the window's last; the rest of
 *   the image is not decoded.
 *
 * At a DCT scale of 1/2, 1/4 or 1/8 (scale_denom, as
 * sl_image_decode_jpeg_scaled() decodes) the window and the margins are
 * in the scaled image's pixels, and the iMCU is scaled with it.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#include "errbuf.h"
#include "image.h"

#define MAX_SCANS 500 /* as TurboJPEG's TJFLAG_LIMITSCANS */

struct werr {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX + 64];
};

struct wprog {
    struct jpeg_progress_mgr pub;
    struct werr *err;
};

/* Everything freed on the way out, kept out of locals so that longjmp()
 * cannot leave it stale. */
struct wstate {
    struct jpeg_decompress_struct ci;
    struct werr jerr;
    struct wprog prog;
    uint8_t *img, *row;
};

static void on_error(j_common_ptr c)
{
    struct werr *e = (struct werr *)c->err;
    (*c->err->format_message)(c, e->msg);
    longjmp(e->jb, 1);
}

static void on_message(j_common_ptr c, int level)
{
    /* level < 0 is a warning (corrupt or truncated data): fail the image,
     * as TJFLAG_STOPONWARNING does. Trace messages (level > 0) are dropped. */
    if (level < 0)
        on_error(c);
}

static void on_progress(j_common_ptr c)
{
    struct wprog *p = (struct wprog *)c->progress;
    if (c->is_decompressor && ((j_decompress_ptr)c)->input_scan_number > MAX_SCANS) {
        snprintf(p->err->msg, sizeof p->err->msg, "progressive JPEG image has more than %d scans", MAX_SCANS);
        longjmp(p->err->jb, 1);
    }
}

/* The window's rows of the image at scale 1/denom, dense (copied out of
 * libjpeg-turbo's row, *stride = w * channels, *first = 0) or as decoded
 * (each row read straight into out, *stride its decoded width, the window
 * from *first on). */
static int decode_window(const uint8_t *src, size_t len, int channels, size_t max_pixels, unsigned denom, size_t y,
                         size_t x, size_t h, size_t w, bool dense, uint8_t **out, size_t *stride, size_t *first,
                         sl_image_shape_t *shape, char *err, size_t errlen)
{
    *out = NULL;
    if (channels != 0 && channels != 1 && channels != 3)
        return sl_errf(err, errlen, SL_EINVAL, "decode_jpeg: channels %d, expected 0, 1 or 3", channels);
    if (denom != 1 && denom != 2 && denom != 4 && denom != 8)
        return sl_errf(err, errlen, SL_EINVAL, "decode_jpeg: scale 1/%u, expected 1/1, 1/2, 1/4 or 1/8", denom);
    if (len == 0)
        return sl_errf(err, errlen, SL_EDATA, "decode_jpeg: empty input");
    if (len > (unsigned long)-1)
        return sl_errf(err, errlen, SL_EDATA, "decode_jpeg: input of %zu bytes is too large", len);
    if (h == 0 || w == 0)
        return sl_errf(err, errlen, SL_EINVAL, "decode_jpeg: empty window %zu x %zu", h, w);

    struct wstate *st = calloc(1, sizeof *st);
    if (!st)
        return sl_errf(err, errlen, -ENOMEM, "decode_jpeg: out of memory");
    int rc;
    st->ci.err = jpeg_std_error(&st->jerr.pub);
    st->jerr.pub.error_exit = on_error;
    st->jerr.pub.emit_message = on_message;
    st->prog.pub.progress_monitor = on_progress;
    st->prog.err = &st->jerr;
    if (setjmp(st->jerr.jb)) {
        rc = sl_errf(err, errlen, SL_EDATA, "decode_jpeg: %s (%zu bytes of input)", st->jerr.msg, len);
        goto done;
    }
    jpeg_create_decompress(&st->ci);
    st->ci.progress = &st->prog.pub;
    jpeg_mem_src(&st->ci, src, (unsigned long)len);
    jpeg_read_header(&st->ci, TRUE);

    j_decompress_ptr ci = &st->ci;
    if (ci->jpeg_color_space == JCS_CMYK || ci->jpeg_color_space == JCS_YCCK) {
        rc = sl_errf(err, errlen, SL_EDATA, "decode_jpeg: CMYK JPEG (%u x %u) is not supported", ci->image_width,
                  ci->image_height);
        goto done;
    }
    size_t ih = ci->image_height, iw = ci->image_width;
    if (channels == 0)
        channels = ci->jpeg_color_space == JCS_GRAYSCALE ? 1 : 3;
    size_t c = (size_t)channels;
    if (ih * iw * c > max_pixels) {
        rc = sl_errf(err, errlen, SL_ETOOBIG, "decode_jpeg: %zu x %zu x %zu image exceeds the limit of %zu values", ih,
                  iw, c, max_pixels);
        goto done;
    }
    /* At 1/denom each side is rounded up (TJSCALED, jpeg_calc_output_dimensions()). */
    ih = (ih + denom - 1) / denom;
    iw = (iw + denom - 1) / denom;
    if (h > ih || w > iw || y > ih - h || x > iw - w) {
        rc = sl_errf(err, errlen, SL_EINVAL, "decode_jpeg: window %zu x %zu at (%zu, %zu) leaves the image %zu x %zu%s",
                     h, w, y, x, ih, iw, denom > 1 ? " (scaled)" : "");
        goto done;
    }
    ci->out_color_space = c == 1 ? JCS_GRAYSCALE : JCS_RGB;
    ci->dct_method = JDCT_ISLOW;
    ci->do_fancy_upsampling = TRUE;
    ci->scale_num = 1;
    ci->scale_denom = denom;
    jpeg_start_decompress(ci);

    /* The iMCU: the unit of decoding, 8 pixels (8 / denom scaled) times the
     * largest sampling factor each way (one margin of it around the
     * window). */
    size_t mx = (size_t)ci->max_h_samp_factor * (size_t)ci->min_DCT_scaled_size;
    size_t my = (size_t)ci->max_v_samp_factor * (size_t)ci->min_DCT_scaled_size;
    size_t x0 = x > mx ? x - mx : 0, x1 = x + w + mx < iw ? x + w + mx : iw;
    size_t y0 = y > my ? y - my : 0;
    JDIMENSION xoff = (JDIMENSION)x0, cw = (JDIMENSION)(x1 - x0);
    if (x0 > 0 || x1 < iw)
        jpeg_crop_scanline(ci, &xoff, &cw); /* xoff rounds down, cw grows to match */
    size_t from = (x - (size_t)xoff) * c, row_bytes = w * c, decoded = (size_t)ci->output_width * c;
    if (dense ? !(st->img = malloc(h * row_bytes)) || !(st->row = malloc(decoded)) : !(st->img = malloc(h * decoded))) {
        rc = sl_errf(err, errlen, -ENOMEM, "decode_jpeg: out of memory for a %zu x %zu x %zu window", h, w, c);
        goto done;
    }
    if (y0 > 0 && jpeg_skip_scanlines(ci, (JDIMENSION)y0) != (JDIMENSION)y0) {
        rc = sl_errf(err, errlen, SL_EDATA, "decode_jpeg: could not skip to row %zu (%zu bytes of input)", y0, len);
        goto done;
    }
    for (size_t r = y0; r < y + h; r++) {
        /* Rows above the window (read for upsampling) go where the first
         * of it will. */
        JSAMPROW rows[1] = {dense ? st->row : st->img + (r >= y ? r - y : 0) * decoded};
        if (jpeg_read_scanlines(ci, rows, 1) != 1) {
            rc = sl_errf(err, errlen, SL_EDATA, "decode_jpeg: no data for row %zu (%zu bytes of input)", r, len);
            goto done;
        }
        if (dense && r >= y)
            memcpy(st->img + (r - y) * row_bytes, st->row + from, row_bytes);
    }
    *out = st->img;
    st->img = NULL;
    *stride = dense ? row_bytes : decoded;
    *first = dense ? 0 : from;
    *shape = (sl_image_shape_t){h, w, c};
    rc = 0;

done:
    /* Abort rather than finish: the rows after the window are not read. */
    jpeg_destroy_decompress(&st->ci);
    free(st->row);
    free(st->img);
    free(st);
    return rc;
}

int sl_image_decode_jpeg_window(const uint8_t *src, size_t len, int channels, size_t max_pixels, size_t y, size_t x,
                                size_t h, size_t w, uint8_t **out, sl_image_shape_t *shape, char *err, size_t errlen)
{
    size_t stride, first;
    return decode_window(src, len, channels, max_pixels, 1, y, x, h, w, true, out, &stride, &first, shape, err,
                         errlen);
}

int sl_image_decode_jpeg_window_rows(const uint8_t *src, size_t len, int channels, size_t max_pixels, unsigned denom,
                                     size_t y, size_t x, size_t h, size_t w, uint8_t **out, size_t *stride,
                                     size_t *first, sl_image_shape_t *shape, char *err, size_t errlen)
{
    return decode_window(src, len, channels, max_pixels, denom, y, x, h, w, false, out, stride, first, shape, err,
                         errlen);
}
