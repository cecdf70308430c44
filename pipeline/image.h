/*
 * image.h: image kernels on uint8 HWC tensors (height, width, channels;
 * row-major; 1 or 3 channels): JPEG decoding, bilinear resize, crops, flips,
 * normalization and casts.
 *
 * These are pure functions over buffers. They know nothing of elements or
 * pipelines: the ops that wrap them (decode_jpeg, resize, random_crop,
 * random_flip, normalize, cast) pass in the bytes and the shape of a value.
 * Every function that can fail returns 0 or a negative code from sluice.h
 * (SL_EDATA for bad data, SL_EINVAL for bad arguments, SL_ETOOBIG over a
 * limit, -ENOMEM) and writes a message naming the problem into err (errlen
 * bytes, may be 0); outputs are left alone on failure unless said otherwise.
 *
 * Random ops draw from an sl_rng_t (common/rng.h: xoshiro256**, seeded
 * through splitmix64) that the caller owns and seeds, so a seed fixes every
 * outcome.
 */
#ifndef SL_IMAGE_H
#define SL_IMAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rng.h"
#include "sluice.h"

/** The shape of an HWC image: h >= 1, w >= 1, c 1 or 3. */
typedef struct sl_image_shape {
    size_t h, w, c;
} sl_image_shape_t;

/** A JPEG decoder: a TurboJPEG handle, made anew for every image so that
 *  nothing of one image (its tables) is left for the next. Use it from one
 *  thread at a time. */
typedef struct sl_image_decoder sl_image_decoder_t;

typedef enum sl_image_flip_dir {
    SL_IMAGE_FLIP_LEFT_RIGHT = 0, /* mirror each row (the width axis) */
    SL_IMAGE_FLIP_UP_DOWN = 1     /* reverse the rows (the height axis) */
} sl_image_flip_dir_t;

/* ---- JPEG ---- */

/**
 * Makes a JPEG decoder, to be reused across images.
 * @param[out] out the decoder, freed by sl_image_decoder_free()
 * @return 0, or -ENOMEM
 */
int sl_image_decoder_new(sl_image_decoder_t **out, char *err, size_t errlen);

/** Frees dec (NULL is fine). */
void sl_image_decoder_free(sl_image_decoder_t *dec);

/**
 * Reads a JPEG's header only and says what sl_image_decode_jpeg() would
 * return, without decoding.
 * @param[in] dec a decoder
 * @param[in] src,len the JPEG bytes, only read during the call
 * @param[in] channels 0 (1 for a grayscale JPEG, else 3), 1 or 3
 * @param[out] shape the decoded image's shape
 * @return 0; SL_EDATA when the header is corrupt, truncated or of a CMYK
 *         JPEG (turbojpeg's message in err); SL_EINVAL for bad channels;
 *         -ENOMEM
 */
int sl_image_jpeg_header(sl_image_decoder_t *dec, const uint8_t *src, size_t len, int channels,
                         sl_image_shape_t *shape, char *err, size_t errlen);

/**
 * Decodes a JPEG into uint8 HWC, with TurboJPEG's accurate integer IDCT and
 * fancy upsampling (as PIL and tf.io.decode_jpeg do). Strict: any libjpeg
 * warning (a truncated file, corrupt entropy data) fails the image.
 * @param[in] dec a decoder, not used by another thread during the call
 * @param[in] src,len the JPEG bytes, only read during the call
 * @param[in] channels 0 (as in the file: 1 for grayscale, else 3), 1 or 3;
 *            1 from a color JPEG is its luma (Y) plane, 3 from a grayscale
 *            JPEG repeats it
 * @param[in] max_pixels a limit on h * w * channels (the output's bytes),
 *            checked on the header before anything is allocated
 * @param[out] out the image, h * w * c bytes from malloc(): the caller frees
 *            it with free(); NULL on failure
 * @param[out] shape its shape
 * @return 0; SL_EDATA for a corrupt, truncated or CMYK JPEG (turbojpeg's
 *         message in err); SL_ETOOBIG over max_pixels; SL_EINVAL for bad
 *         channels; -ENOMEM
 */
int sl_image_decode_jpeg(sl_image_decoder_t *dec, const uint8_t *src, size_t len, int channels, size_t max_pixels,
                         uint8_t **out, sl_image_shape_t *shape, char *err, size_t errlen);

/**
 * The scale to decode a JPEG at before a resize to out_h x out_w: the
 * largest d of 8, 4 and 2 with out_h <= in.h / d and out_w <= in.w / d (the
 * image at 1/d is still at least the resize's size each way), or 1 when the
 * resize keeps more than half of either side.
 */
unsigned sl_image_jpeg_scale_denom(sl_image_shape_t in, size_t out_h, size_t out_w);

/**
 * As sl_image_decode_jpeg(), at scale 1/denom with libjpeg-turbo's scaled
 * IDCT (DCT scaling: each 8 x 8 block becomes 8/denom x 8/denom pixels
 * straight from its coefficients): an image of ceil(h / denom) x
 * ceil(w / denom). Not the same pixels as decoding whole and resizing: a
 * low-pass of the blocks, not samples of the pixels. max_pixels still
 * applies to the full-size image (h * w * channels).
 * @param[in] denom 1, 2, 4 or 8; 1 is sl_image_decode_jpeg()
 * @return as sl_image_decode_jpeg(); SL_EINVAL for another denom
 */
int sl_image_decode_jpeg_scaled(sl_image_decoder_t *dec, const uint8_t *src, size_t len, int channels,
                                size_t max_pixels, unsigned denom, uint8_t **out, sl_image_shape_t *shape, char *err,
                                size_t errlen);

/* ---- resize ---- */

/**
 * Bilinear resize as tf.image.resize(method="bilinear", antialias=False)
 * computes it (ResizeBilinear with half_pixel_centers=True): output pixel
 * (y, x) samples the input at ((y + 0.5) * in_h / out_h - 0.5, likewise for
 * x), clamped to the edges, in float32 arithmetic in TensorFlow's order.
 * @param[in] src the input, in.h * in.w * in.c bytes
 * @param[in] in its shape
 * @param[in] out_h,out_w the output size, >= 1
 * @param[out] dst out_h * out_w * in.c values, not overlapping src; the
 *            uint8 variant rounds half to even and saturates
 * @return 0; SL_EINVAL for a bad shape or size; -ENOMEM (a scratch row)
 */
int sl_image_resize_u8(const uint8_t *src, sl_image_shape_t in, size_t out_h, size_t out_w, uint8_t *dst, char *err,
                       size_t errlen);
/** As sl_image_resize_u8(), with tf.image.resize's float32 output. */
int sl_image_resize_f32(const uint8_t *src, sl_image_shape_t in, size_t out_h, size_t out_w, float *dst, char *err,
                        size_t errlen);

/** What sl_image_resize_fused() does around the resize. */
typedef struct sl_image_resize_fuse {
    bool flip;                    /* resize the image mirrored along flip_dir */
    sl_image_flip_dir_t flip_dir;
    bool flip_after;              /* mirror the resized image along flip_after_dir */
    sl_image_flip_dir_t flip_after_dir;
    bool out_f32;                 /* without mean: float32 output (else uint8) */
    const float *mean, *std;      /* non-NULL: the uint8 result normalized (float32 output) */
    bool scale;                   /* normalize's scale */
    /* > 0: how many pixels of the input the image spans along that axis, at
     * most in.h / in.w; 0: all of them. A JPEG decoded at 1/d spans h / d
     * of its ceil(h / d) rows (the last one partly padding): the resize
     * maps the output onto that span. Both 0: tf.image.resize exactly. */
    float extent_h, extent_w;
    /* >= 0: where that span starts in the input, in pixels: 0 .. 1 for a
     * window decoded at 1/d, which starts (y mod d) / d into its first
     * scaled row (y its first row at full size); origin + extent (or the
     * side) <= the side. Both 0: at the input's edge. */
    float origin_h, origin_w;
    /* > 0: bytes from one input row to the next, at least in.w * in.c: the
     * input is a window of a wider image (src its first pixel), resized
     * without copying it out; 0: in.w * in.c. */
    size_t stride;
    /* dst is memory this thread does not read again (a batch's row, where
     * map-and-batch fusion puts the image): each output row is made in a
     * buffer of the pass's own and streamed there past the cache, so that
     * no line of dst is read from memory before it is written. */
    bool far_out;
} sl_image_resize_fuse_t;

/**
 * In one pass, what sl_image_flip() (when f->flip), then
 * sl_image_resize_u8() or sl_image_resize_f32(), then sl_image_flip() of the
 * result (when f->flip_after), then (when f->mean) sl_image_normalize() of
 * the uint8 result give, to the bit: the first flip reads the input
 * mirrored instead of copying it, the second writes each output pixel where
 * its mirror goes, and the uint8 rows go through normalize's tables as they
 * are made, without a whole uint8 image between.
 * @param[in] src the input, in.h * in.w * in.c bytes
 * @param[in] f what to do; with mean, mean and std have in.c values each
 * @param[out] dst out_h * out_w * in.c values: float32 with f->mean or
 *            f->out_f32, else uint8; not overlapping src
 * @return 0; SL_EINVAL for a bad shape, size, direction, mean or std (as
 *         the three functions refuse them); -ENOMEM (scratch rows)
 */
int sl_image_resize_fused(const uint8_t *src, sl_image_shape_t in, const sl_image_resize_fuse_t *f, size_t out_h,
                          size_t out_w, void *dst, char *err, size_t errlen);

/* ---- crops and flips ---- */

/**
 * Copies the window of h rows and w columns at (y, x) out of src.
 * @param[in] src the input, in.h * in.w * in.c bytes
 * @param[out] dst h * w * in.c bytes, not overlapping src
 * @return 0; SL_EINVAL when the window is empty or leaves the image
 */
int sl_image_crop(const uint8_t *src, sl_image_shape_t in, size_t y, size_t x, size_t h, size_t w, uint8_t *dst,
                  char *err, size_t errlen);

/**
 * The offsets of a centered h x w window: ((in.h - h) / 2, (in.w - w) / 2),
 * rounded down.
 * @param[out] y,x the offsets to give sl_image_crop()
 * @return 0; SL_EINVAL when the window is empty or larger than the image
 */
int sl_image_center_crop_offsets(sl_image_shape_t in, size_t h, size_t w, size_t *y, size_t *x, char *err,
                                 size_t errlen);

/**
 * Offsets of an h x w window drawn uniformly from all that fit (as
 * tf.image.random_crop): y in [0, in.h - h], then x in [0, in.w - w].
 * @param[in,out] rng the generator, advanced by two draws on success
 * @param[out] y,x the offsets to give sl_image_crop()
 * @return 0; SL_EINVAL when the window is empty or larger than the image
 */
int sl_image_random_crop_offsets(sl_rng_t *rng, sl_image_shape_t in, size_t h, size_t w, size_t *y, size_t *x,
                                 char *err, size_t errlen);

/**
 * The window torchvision's RandomResizedCrop cuts (get_params, to the same
 * arithmetic): up to 10 tries draw an area of in.h * in.w * U(scale[0],
 * scale[1]) and a width / height of exp(U(log ratio[0], log ratio[1])),
 * round each side half to even, and keep the first window that fits, at
 * offsets drawn uniformly (y, then x); when none fits, the largest centered
 * window whose shape the ratio bounds allow (the whole image when its own
 * ratio is within them). Four draws a try, two more for the offsets.
 * @param[in,out] rng the generator
 * @param[in] scale,ratio 0 < scale[0] <= scale[1] <= 1, 0 < ratio[0] <= ratio[1]
 * @param[out] y,x,h,w the window, inside the image, h and w >= 1
 * @return 0; SL_EINVAL for a bad shape, scale or ratio
 */
int sl_image_random_resized_crop_window(sl_rng_t *rng, sl_image_shape_t in, const double scale[2],
                                        const double ratio[2], size_t *y, size_t *x, size_t *h, size_t *w, char *err,
                                        size_t errlen);

/**
 * Mirrors an image along dir.
 * @param[in] src the input, shape.h * shape.w * shape.c bytes
 * @param[out] dst as many bytes: src itself (in place) or a buffer that does
 *            not overlap it
 * @return 0; SL_EINVAL for a bad shape or direction
 */
int sl_image_flip(const uint8_t *src, sl_image_shape_t shape, sl_image_flip_dir_t dir, uint8_t *dst, char *err,
                  size_t errlen);

/**
 * Mirrors an image along dir with probability 1/2 (one draw from rng), else
 * copies it (nothing to do when dst is src).
 * @param[out] flipped whether it was mirrored (may be NULL)
 * @return as sl_image_flip()
 */
int sl_image_random_flip(sl_rng_t *rng, const uint8_t *src, sl_image_shape_t shape, sl_image_flip_dir_t dir,
                         uint8_t *dst, bool *flipped, char *err, size_t errlen);

/* ---- color jitter ---- */

/** The adjustments of torchvision's ColorJitter, in the order it draws. */
typedef enum sl_image_jitter_kind {
    SL_IMAGE_JITTER_BRIGHTNESS = 0,
    SL_IMAGE_JITTER_CONTRAST = 1,
    SL_IMAGE_JITTER_SATURATION = 2,
    SL_IMAGE_JITTER_HUE = 3,
} sl_image_jitter_kind_t;

/** What one element's color jitter does: n adjustments, kind[i] by factor[i], in that order. */
typedef struct sl_image_jitter {
    int n;
    sl_image_jitter_kind_t kind[4];
    float factor[4];
} sl_image_jitter_t;

/**
 * Draws one element's jitter as torchvision's ColorJitter.get_params does:
 * a random order of the four adjustments, then each given one's factor
 * uniform in its [lo, hi] (range[kind]; given[kind] false leaves it out).
 * @param[in,out] rng the generator: 3 draws for the order, 1 per factor
 */
void sl_image_color_jitter_draw(sl_rng_t *rng, const bool given[4], const double range[4][2], sl_image_jitter_t *out);

/**
 * Applies j to a uint8 image in place, each adjustment as torchvision's
 * functional ops compute it on a uint8 tensor, in float32, truncated back
 * to uint8 after each: brightness blends with black, contrast with the
 * mean of the image's grayscale, saturation with each pixel's grayscale
 * (0.2989 R + 0.587 G + 0.114 B, truncated), hue shifts H in HSV by the
 * factor (of a full turn). Saturation and hue leave a 1-channel image as
 * it is, as torchvision does.
 * @return 0; SL_EINVAL for a bad shape
 */
int sl_image_color_jitter(uint8_t *img, sl_image_shape_t shape, const sl_image_jitter_t *j, char *err, size_t errlen);

/**
 * torchvision's rgb_to_grayscale of a 3-channel uint8 image, in place, with
 * its 3 channels kept (RandomGrayscale): each pixel's 0.2989 R + 0.587 G +
 * 0.114 B in float32, truncated, in all three. A 1-channel image is left
 * as it is.
 * @return 0; SL_EINVAL for a bad shape
 */
int sl_image_grayscale(uint8_t *img, sl_image_shape_t shape, char *err, size_t errlen);

/**
 * torchvision's gaussian_blur of a uint8 image, in place: a kernel of kh x
 * kw (both odd) of a Gaussian of sigma, made as _get_gaussian_kernel1d
 * makes it (float32, normalized to sum 1), over the image padded by
 * reflection (torch's "reflect": the edge pixel is not repeated), in
 * float32, rounded half to even back to uint8. Applied as two passes of
 * the 1-D kernels, which torch's 2-D convolution sums in another order:
 * within one unit of it.
 * @return 0; SL_EDATA when a side is not longer than half its kernel
 *         (reflection needs kh / 2 < h and kw / 2 < w, as in torch);
 *         SL_EINVAL for a bad shape, size or sigma; -ENOMEM
 */
int sl_image_gaussian_blur(uint8_t *img, sl_image_shape_t shape, size_t kh, size_t kw, float sigma, char *err,
                           size_t errlen);

/**
 * torchvision's solarize of a uint8 image, in place: each value at or
 * above threshold (0 .. 255) becomes 255 minus it (RandomSolarize, PIL's
 * ImageOps.solarize).
 * @return 0; SL_EINVAL for a bad shape or threshold
 */
int sl_image_solarize(uint8_t *img, sl_image_shape_t shape, double threshold, char *err, size_t errlen);

/* ---- normalize and cast ---- */

/**
 * dst = (x - mean[c]) / std[c] per channel in float32, where x is the byte
 * itself or, with scale, the byte / 255.0f (torchvision's ToTensor then
 * Normalize). Exactly this expression for every byte value.
 * @param[in] mean,std shape.c values each; every std > 0, all finite
 * @param[out] dst shape.h * shape.w * shape.c floats
 * @return 0; SL_EINVAL for a bad shape, mean or std
 */
int sl_image_normalize(const uint8_t *src, sl_image_shape_t shape, const float *mean, const float *std, bool scale,
                       float *dst, char *err, size_t errlen);
/** sl_image_normalize(), and with far dst is written a row at a time past
 *  the cache (sl_image_resize_fuse_t.far_out says when). */
int sl_image_normalize_far(const uint8_t *src, sl_image_shape_t shape, const float *mean, const float *std,
                           bool scale, float *dst, bool far, char *err, size_t errlen);

/* Element-wise casts of n values; they cannot fail. dst may not overlap src. */

/** uint8 -> float32, exact. */
void sl_image_cast_u8_f32(const uint8_t *src, size_t n, float *dst);
/** float32 -> uint8, rounding half to even and saturating to [0, 255]; NaN becomes 0. */
void sl_image_cast_f32_u8(const float *src, size_t n, uint8_t *dst);
/** uint8 -> int32, exact. */
void sl_image_cast_u8_i32(const uint8_t *src, size_t n, int32_t *dst);
/** float32 -> IEEE 754 binary16 bits, rounding to nearest even; overflow to inf, NaN stays NaN. */
void sl_image_cast_f32_f16(const float *src, size_t n, uint16_t *dst);

/* ---- JPEG: decoding only a window (image_window.c) ---- */

/**
 * Decodes the window of h rows and w columns at (y, x) of a JPEG, what
 * sl_image_decode_jpeg() then sl_image_crop() give, byte for byte, without
 * the work outside the window: libjpeg-turbo's jpeg_crop_scanline() leaves
 * out the columns left and right of it (but for a margin of one iMCU, where
 * upsampling reads its neighbours), jpeg_skip_scanlines() skips the rows
 * above it without the IDCT, and decoding stops after its last row.
 * Entropy-coded data after the window's rows is not read, so damage there
 * goes unnoticed; anything in the rows read fails as in
 * sl_image_decode_jpeg() (any libjpeg warning is an error; a progressive
 * JPEG of more than 500 scans is refused).
 * @param[in] src,len the JPEG bytes, only read during the call
 * @param[in] channels 0, 1 or 3, as in sl_image_decode_jpeg()
 * @param[in] max_pixels the limit on the whole image's h * w * channels, as
 *            sl_image_decode_jpeg() applies it
 * @param[in] y,x,h,w the window, inside the image (sl_image_jpeg_header()
 *            gives its size)
 * @param[out] out h * w * channels bytes from malloc() (the caller frees
 *            it); NULL on failure
 * @param[out] shape the window's shape {h, w, channels}
 * @return 0; SL_EDATA for a corrupt, truncated or CMYK JPEG; SL_ETOOBIG over
 *         max_pixels; SL_EINVAL for bad channels or a window that is empty
 *         or leaves the image; -ENOMEM
 */
int sl_image_decode_jpeg_window(const uint8_t *src, size_t len, int channels, size_t max_pixels, size_t y, size_t x,
                                size_t h, size_t w, uint8_t **out, sl_image_shape_t *shape, char *err,
                                size_t errlen);

/**
 * As sl_image_decode_jpeg_window(), without copying the window out of the
 * rows libjpeg-turbo decodes, and of the image as
 * sl_image_decode_jpeg_scaled() decodes it at 1/denom: for a caller that
 * reads it with a row stride (sl_image_resize_fuse_t.stride), as
 * random_resized_crop's resize does. y, x, h and w are the scaled image's
 * pixels (each side of it ceil(side / denom)), and the window is, byte for
 * byte, that of the scaled full decode. max_pixels still limits the full
 * size.
 * @param[in] denom 1, 2, 4 or 8 (else SL_EINVAL)
 * @param[out] out h rows of *stride bytes from malloc() (the caller frees
 *            it), the window's pixel (r, 0) at out + r * *stride + *first;
 *            NULL on failure
 * @param[out] stride the decoded rows' length, at least *first + w * channels
 * @param[out] first where the window starts in a row
 * @return as sl_image_decode_jpeg_window()
 */
int sl_image_decode_jpeg_window_rows(const uint8_t *src, size_t len, int channels, size_t max_pixels, unsigned denom,
                                     size_t y, size_t x, size_t h, size_t w, uint8_t **out, size_t *stride,
                                     size_t *first, sl_image_shape_t *shape, char *err, size_t errlen);

#endif
