/*
 * image.c: image kernels on uint8 HWC tensors (image.h).
 */
#include "image.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <turbojpeg.h>
#ifdef __SSE2__
#include <emmintrin.h>

#include "copy.h"
#include "errbuf.h"
#endif

struct sl_image_decoder {
    tjhandle tj;
};

/* Adding and subtracting 1.5 * 2^23 rounds a float in [0, 2^22) to an
 * integer, half to even, in the default rounding mode, without libm. */
#define ROUND_MAGIC 0x1.8p23f

/* Checks a shape and that its byte count, times elem (the size of the
 * widest output element), fits in a size_t. @return 0 or SL_EINVAL */
static int check_shape(const char *what, sl_image_shape_t s, size_t elem, char *err, size_t errlen)
{
    if (s.c != 1 && s.c != 3)
        return sl_errf(err, errlen, SL_EINVAL, "%s: %zu channels, expected 1 or 3", what, s.c);
    if (s.h == 0 || s.w == 0)
        return sl_errf(err, errlen, SL_EINVAL, "%s: empty image (%zu x %zu)", what, s.h, s.w);
    if (s.w > SIZE_MAX / s.c / elem || s.h > SIZE_MAX / (s.w * s.c * elem))
        return sl_errf(err, errlen, SL_EINVAL, "%s: image of %zu x %zu x %zu is too large", what, s.h, s.w, s.c);
    return 0;
}

static inline uint8_t round_u8(float v)
{
    /* Written so that NaN takes the first branch. */
    if (!(v > 0.0f))
        return 0;
    if (v >= 255.0f)
        return 255;
    return (uint8_t)(int)((v + ROUND_MAGIC) - ROUND_MAGIC);
}

/* ---- JPEG ---- */

int sl_image_decoder_new(sl_image_decoder_t **out, char *err, size_t errlen)
{
    sl_image_decoder_t *dec = calloc(1, sizeof(*dec));
    if (!dec)
        return sl_errf(err, errlen, -ENOMEM, "decode_jpeg: out of memory");
    dec->tj = tjInitDecompress();
    if (!dec->tj) {
        free(dec);
        return sl_errf(err, errlen, -ENOMEM, "decode_jpeg: tjInitDecompress: %s", tjGetErrorStr2(NULL));
    }
    *out = dec;
    return 0;
}

void sl_image_decoder_free(sl_image_decoder_t *dec)
{
    if (!dec)
        return;
    tjDestroy(dec->tj);
    free(dec);
}

/*
 * Every image starts on a fresh TurboJPEG handle. A handle keeps what it
 * read of earlier images: libjpeg keeps quantization and Huffman tables
 * across the images of a decompressor (for abbreviated streams), so an
 * image that lacks a table would decode with the previous image's, its
 * pixels depending on what the pipeline decoded before it (and failing in
 * sl_image_decode_jpeg_window(), which starts fresh); and TurboJPEG 2.1's
 * tjDecompressHeader3() does not abort the decompressor when libjpeg fails
 * inside a header (a size over 65500, a segment cut short), so the next
 * image's header failed ("two SOI markers"). A handle costs well under a
 * microsecond to make.
 */
static int fresh_handle(sl_image_decoder_t *dec, char *err, size_t errlen)
{
    tjhandle fresh = tjInitDecompress();
    if (!fresh)
        return sl_errf(err, errlen, -ENOMEM, "decode_jpeg: tjInitDecompress: %s", tjGetErrorStr2(NULL));
    tjDestroy(dec->tj);
    dec->tj = fresh;
    return 0;
}

/* Reads the header into shape and the pixel format to ask turbojpeg for. */
static int read_header(sl_image_decoder_t *dec, const uint8_t *src, size_t len, int channels,
                       sl_image_shape_t *shape, int *pixel_format, char *err, size_t errlen)
{
    /* TurboJPEG 2.1 returns 0 for a tables-only stream (tables, no image)
     * without setting any of these: they must start out as no image. */
    int w = 0, h = 0, subsamp = -1, colorspace = -1;

    if (channels != 0 && channels != 1 && channels != 3)
        return sl_errf(err, errlen, SL_EINVAL, "decode_jpeg: channels %d, expected 0, 1 or 3", channels);
    if (len == 0)
        return sl_errf(err, errlen, SL_EDATA, "decode_jpeg: empty input");
    if (len > (unsigned long)-1)
        return sl_errf(err, errlen, SL_EDATA, "decode_jpeg: input of %zu bytes is too large", len);
    int rc = fresh_handle(dec, err, errlen);
    if (rc < 0)
        return rc;
    if (tjDecompressHeader3(dec->tj, src, (unsigned long)len, &w, &h, &subsamp, &colorspace) != 0)
        return sl_errf(err, errlen, SL_EDATA, "decode_jpeg: %s (%zu bytes of input)", tjGetErrorStr2(dec->tj), len);
    /* libjpeg converts CMYK to neither RGB nor gray, and Adobe's inverted
     * CMYK needs a marker turbojpeg does not report. */
    if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK)
        return sl_errf(err, errlen, SL_EDATA, "decode_jpeg: CMYK JPEG (%d x %d) is not supported", w, h);
    if (w <= 0 || h <= 0)
        return sl_errf(err, errlen, SL_EDATA, "decode_jpeg: no image (%d x %d; a stream of tables only?)", w, h);
    if (channels == 0)
        channels = colorspace == TJCS_GRAY ? 1 : 3;
    shape->h = (size_t)h;
    shape->w = (size_t)w;
    shape->c = (size_t)channels;
    *pixel_format = channels == 1 ? TJPF_GRAY : TJPF_RGB;
    return 0;
}

int sl_image_jpeg_header(sl_image_decoder_t *dec, const uint8_t *src, size_t len, int channels,
                         sl_image_shape_t *shape, char *err, size_t errlen)
{
    int pixel_format;
    return read_header(dec, src, len, channels, shape, &pixel_format, err, errlen);
}

int sl_image_decode_jpeg(sl_image_decoder_t *dec, const uint8_t *src, size_t len, int channels, size_t max_pixels,
                         uint8_t **out, sl_image_shape_t *shape, char *err, size_t errlen)
{
    return sl_image_decode_jpeg_scaled(dec, src, len, channels, max_pixels, 1, out, shape, err, errlen);
}

unsigned sl_image_jpeg_scale_denom(sl_image_shape_t in, size_t out_h, size_t out_w)
{
    for (unsigned d = 8; d >= 2; d /= 2) {
        if (out_h <= in.h / d && out_w <= in.w / d)
            return d;
    }
    return 1;
}

int sl_image_decode_jpeg_scaled(sl_image_decoder_t *dec, const uint8_t *src, size_t len, int channels,
                                size_t max_pixels, unsigned denom, uint8_t **out, sl_image_shape_t *shape, char *err,
                                size_t errlen)
{
    sl_image_shape_t s;
    int pixel_format = TJPF_RGB, rc;
    uint8_t *img = NULL;

    *out = NULL;
    if (denom != 1 && denom != 2 && denom != 4 && denom != 8)
        return sl_errf(err, errlen, SL_EINVAL, "decode_jpeg: scale 1/%u, expected 1/1, 1/2, 1/4 or 1/8", denom);
    if ((rc = read_header(dec, src, len, channels, &s, &pixel_format, err, errlen)) != 0)
        return rc;
    /* JPEG sizes are at most 65535 x 65535, so this product cannot overflow. */
    size_t n = s.h * s.w * s.c;
    if (n > max_pixels)
        return sl_errf(err, errlen, SL_ETOOBIG, "decode_jpeg: %zu x %zu x %zu image exceeds the limit of %zu values",
                    s.h, s.w, s.c, max_pixels);
    /* What TurboJPEG makes at scale 1/denom (TJSCALED): each side rounded up. */
    s.h = (s.h + denom - 1) / denom;
    s.w = (s.w + denom - 1) / denom;
    n = s.h * s.w * s.c;
    if (!(img = malloc(n)))
        return sl_errf(err, errlen, -ENOMEM, "decode_jpeg: out of memory for %zu x %zu x %zu", s.h, s.w, s.c);
    /* A warning (a truncated file, corrupt data) stops the decode and fails
     * it: a half-gray image is no training example. LIMITSCANS refuses
     * progressive files with absurd scan counts, a known CPU sink. */
    int flags = TJFLAG_ACCURATEDCT | TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS;
    if (tjDecompress2(dec->tj, src, (unsigned long)len, img, (int)s.w, 0, (int)s.h, pixel_format, flags) != 0) {
        rc = sl_errf(err, errlen, SL_EDATA, "decode_jpeg: %s (%zu x %zu image, %zu bytes of input)",
                  tjGetErrorStr2(dec->tj), s.h, s.w, len);
        goto fail;
    }
    *out = img;
    *shape = s;
    return 0;

fail:
    free(img);
    return rc;
}

/* ---- resize ---- */

/* Where one output coordinate samples the input: between lo and hi (both
 * already clamped), weight t on hi. For x, lo and hi are byte offsets into a
 * row (pixel index times channels). */
typedef struct lerp {
    uint32_t lo, hi; /* sides are at most 2^24, rows at most 3 * 2^24 bytes */
    float t;
} lerp_t;

/* TensorFlow's compute_interpolation_weights with HalfPixelScaler, in the
 * same float32 steps so that results agree to the bit. extent > 0: the
 * input spans that many pixels rather than in (a DCT-scaled decode, whose
 * last pixel is partly padding), from origin on (a window of it, which
 * starts inside its first pixel; 0 else). */
static void compute_lerps(size_t in, size_t out, size_t stride, float extent, float origin, lerp_t *l)
{
    float scale = (extent > 0 ? extent : (float)in) / (float)out;
    for (size_t i = 0; i < out; i++) {
        float s = ((float)i + 0.5f) * scale - 0.5f;
        if (origin > 0)
            s += origin;
        /* floor and ceil without libm: s >= -0.5 and s < in, so truncation
         * toward zero is exact to correct by one. */
        int64_t f = (int64_t)s;
        if ((float)f > s)
            f--;
        int64_t c = (float)f < s ? f + 1 : f;
        l[i].t = s - (float)f;
        if (f < 0)
            f = 0;
        if (c > (int64_t)in - 1)
            c = (int64_t)in - 1;
        l[i].lo = (uint32_t)((size_t)f * stride);
        l[i].hi = (uint32_t)((size_t)c * stride);
    }
}

/* Interpolates one input row along x into out_w * C floats. C is a
 * constant in each call so that the compiler unrolls the channel loop. */
static inline void hlerp_row(const uint8_t *restrict row, const lerp_t *restrict xl, size_t out_w, size_t C,
                             float *restrict dst)
{
    for (size_t x = 0; x < out_w; x++) {
        const uint8_t *a = row + xl[x].lo, *b = row + xl[x].hi;
        float t = xl[x].t;
        for (size_t k = 0; k < C; k++) {
            float fa = (float)a[k];
            dst[k] = fa + ((float)b[k] - fa) * t;
        }
        dst += C;
    }
}

#ifdef __SSE2__
/* Three channels as one SSE2 op per pixel: the fourth lane reads the next
 * input pixel's first byte and writes a float that the next output pixel
 * overwrites, so the pixels that sample the row's last pixel (they come
 * last, or first when the row is read mirrored) and the row's last output
 * pixel go through the scalar loop. Lanes compute what the scalar code
 * does, to the bit. */
static void hlerp_rgb(const uint8_t *row, size_t row_bytes, const lerp_t *xl, size_t out_w, float *dst)
{
    const __m128i zero = _mm_setzero_si128();
    for (size_t x = 0; x < out_w; x++) {
        if (x + 1 == out_w || xl[x].hi + 3 >= row_bytes || xl[x].lo + 3 >= row_bytes) {
            hlerp_row(row, xl + x, 1, 3, dst + 3 * x);
            continue;
        }
        uint32_t wa, wb;
        memcpy(&wa, row + xl[x].lo, sizeof(wa));
        memcpy(&wb, row + xl[x].hi, sizeof(wb));
        __m128 a = _mm_cvtepi32_ps(_mm_unpacklo_epi16(_mm_unpacklo_epi8(_mm_cvtsi32_si128((int)wa), zero), zero));
        __m128 b = _mm_cvtepi32_ps(_mm_unpacklo_epi16(_mm_unpacklo_epi8(_mm_cvtsi32_si128((int)wb), zero), zero));
        __m128 r = _mm_add_ps(a, _mm_mul_ps(_mm_sub_ps(b, a), _mm_set1_ps(xl[x].t)));
        _mm_storeu_ps(dst + 3 * x, r);
    }
}
#endif

static void hlerp(const uint8_t *row, size_t row_bytes, const lerp_t *xl, size_t out_w, size_t c, float *dst)
{
#ifdef __SSE2__
    if (c == 3) {
        hlerp_rgb(row, row_bytes, xl, out_w, dst);
        return;
    }
#else
    (void)row_bytes;
    if (c == 3) {
        hlerp_row(row, xl, out_w, 3, dst);
        return;
    }
#endif
    hlerp_row(row, xl, out_w, 1, dst);
}

/* The two input rows, interpolated along x, that the current output row
 * blends. Output rows walk down the input (up it when it is read mirrored
 * top to bottom), so a row once computed serves every output row that needs
 * it until both slots have moved past it. */
typedef struct row_cache {
    float *buf[2];
    int64_t idx[2]; /* the input row in each slot, -1 for none */
    bool up;        /* rows are asked for bottom to top */
} row_cache_t;

static const float *cached_row(row_cache_t *rc, const uint8_t *src, size_t stride, size_t row_bytes,
                               const lerp_t *xl, size_t out_w, size_t c, size_t row, int keep)
{
    for (int k = 0; k < 2; k++)
        if (rc->idx[k] == (int64_t)row)
            return rc->buf[k];
    /* Replace the slot not holding the row still needed (keep), else an
     * empty one, else the one behind the walk (the lower row walking down,
     * the higher walking up), which no later output row asks for. */
    int k;
    if (keep >= 0)
        k = !keep;
    else if (rc->idx[0] < 0 || rc->idx[1] < 0)
        k = rc->idx[0] < 0 ? 0 : 1;
    else
        k = (rc->idx[0] <= rc->idx[1]) != rc->up ? 0 : 1;
    hlerp(src + row * stride, row_bytes, xl, out_w, c, rc->buf[k]);
    rc->idx[k] = (int64_t)row;
    return rc->buf[k];
}

static int slot_of(const row_cache_t *rc, const float *p)
{
    return p == rc->buf[0] ? 0 : 1;
}

/* Blends two interpolated rows along y, four lanes at a time with GCC's
 * vector extension (SSE2 on x86-64, NEON on arm64): -O2 does not vectorize
 * loops that need a scalar tail. Each lane computes what the scalar tail
 * does, so the result does not depend on where a value falls. */
typedef float v4f __attribute__((vector_size(16)));
typedef uint32_t v4u __attribute__((vector_size(16)));

static void vlerp_f32(const float *top, const float *bot, float t, size_t n, float *dst)
{
    v4f tv = {t, t, t, t};
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        v4f a, b;
        memcpy(&a, top + i, sizeof(a));
        memcpy(&b, bot + i, sizeof(b));
        v4f r = a + (b - a) * tv;
        memcpy(dst + i, &r, sizeof(r));
    }
    for (; i < n; i++)
        dst[i] = top[i] + (bot[i] - top[i]) * t;
}

static void vlerp_u8(const float *top, const float *bot, float t, size_t n, uint8_t *dst)
{
    /* A blend of two values in [0, 255] stays in it (rounding is monotonic),
     * so no clamp is needed: after adding ROUND_MAGIC the low mantissa bits
     * hold the value rounded half to even, as round_u8() gives it. */
    v4f tv = {t, t, t, t}, magic = {ROUND_MAGIC, ROUND_MAGIC, ROUND_MAGIC, ROUND_MAGIC};
    size_t i = 0;
#ifdef __SSE2__
    /* Sixteen at a time: the low bytes of four vectors packed into one
     * (each is 0..255 once masked, so the saturating packs keep it). */
    const __m128i low = _mm_set1_epi32(0xff);
    for (; i + 16 <= n; i += 16) {
        __m128i q[4];
        for (int k = 0; k < 4; k++) {
            v4f a, b;
            memcpy(&a, top + i + 4 * k, sizeof(a));
            memcpy(&b, bot + i + 4 * k, sizeof(b));
            v4f r = (a + (b - a) * tv) + magic;
            __m128i bits;
            memcpy(&bits, &r, sizeof(bits));
            q[k] = _mm_and_si128(bits, low);
        }
        __m128i w = _mm_packus_epi16(_mm_packs_epi32(q[0], q[1]), _mm_packs_epi32(q[2], q[3]));
        _mm_storeu_si128((__m128i *)(void *)(dst + i), w);
    }
#endif
    for (; i + 4 <= n; i += 4) {
        v4f a, b;
        memcpy(&a, top + i, sizeof(a));
        memcpy(&b, bot + i, sizeof(b));
        v4u bits = (v4u)((a + (b - a) * tv) + magic);
        dst[i + 0] = (uint8_t)bits[0];
        dst[i + 1] = (uint8_t)bits[1];
        dst[i + 2] = (uint8_t)bits[2];
        dst[i + 3] = (uint8_t)bits[3];
    }
    for (; i < n; i++) {
        float r = (top[i] + (bot[i] - top[i]) * t) + ROUND_MAGIC;
        uint32_t bits;
        memcpy(&bits, &r, sizeof(bits));
        dst[i] = (uint8_t)bits;
    }
}

/* Mirrors lerps computed for an image read mirrored: position p of the
 * mirrored line is n - 1 - p of the real one (offsets in units of stride). */
static void mirror_lerps(size_t n, size_t out, size_t stride, lerp_t *l)
{
    uint32_t last = (uint32_t)((n - 1) * stride);
    for (size_t i = 0; i < out; i++) {
        l[i].lo = last - l[i].lo;
        l[i].hi = last - l[i].hi;
    }
}

/* Normalization after a uint8 resize: a table per channel, as
 * sl_image_normalize() builds it. */
typedef struct norm_table {
    float t[3][256];
} norm_table_t;

static int norm_table_init(norm_table_t *nt, size_t c, const float *mean, const float *std, bool scale, char *err,
                           size_t errlen)
{
    for (size_t k = 0; k < c; k++) {
        if (!isfinite(mean[k]))
            return sl_errf(err, errlen, SL_EINVAL, "normalize: mean[%zu] is not finite", k);
        if (!(std[k] > 0.0f) || !isfinite(std[k]))
            return sl_errf(err, errlen, SL_EINVAL, "normalize: std[%zu] = %g, must be > 0 and finite", k,
                        (double)std[k]);
        for (int v = 0; v < 256; v++) {
            float x = scale ? (float)v / 255.0f : (float)v;
            nt->t[k][v] = (x - mean[k]) / std[k];
        }
    }
    return 0;
}

/* n bytes of pixels of c channels (n a multiple of c) through the tables. */
static void norm_row(const norm_table_t *nt, const uint8_t *src, size_t n, size_t c, float *dst)
{
    if (c == 3) {
        for (size_t i = 0; i < n; i += 3) {
            dst[i + 0] = nt->t[0][src[i + 0]];
            dst[i + 1] = nt->t[1][src[i + 1]];
            dst[i + 2] = nt->t[2][src[i + 2]];
        }
    } else {
        for (size_t i = 0; i < n; i++)
            dst[i] = nt->t[0][src[i]];
    }
}

/* Reverses n lerps: output position i then computes what n - 1 - i did,
 * which mirrors the result without a float step changing. */
static void reverse_lerps(size_t n, lerp_t *l)
{
    for (size_t i = 0, j = n - 1; i < j && j < n; i++, j--) {
        lerp_t t = l[i];
        l[i] = l[j];
        l[j] = t;
    }
}

/* The resize of src, or of src mirrored (flip >= 0: an sl_image_flip_dir_t),
 * mirrored afterwards (flip_out >= 0), into dst_u8, dst_f32, or through nt
 * (non-NULL) into dst_f32: the uint8 result normalized. span: the extent and
 * origin the output maps onto (sl_image_resize_fuse_t's; NULL: the whole
 * input). far: each row is made in a buffer of its own and streamed to the
 * destination (sl_image_resize_fuse_t.far_out). */
static int resize(const uint8_t *src, sl_image_shape_t in, size_t stride, int flip, int flip_out,
                  const sl_image_resize_fuse_t *span, size_t out_h, size_t out_w, uint8_t *dst_u8, float *dst_f32,
                  const norm_table_t *nt, bool far, char *err, size_t errlen)
{
    sl_image_shape_t out = {out_h, out_w, in.c};
    row_cache_t rc = {{NULL, NULL}, {-1, -1}, (flip == SL_IMAGE_FLIP_UP_DOWN) != (flip_out == SL_IMAGE_FLIP_UP_DOWN)};
    lerp_t *xl = NULL, *yl = NULL;
    uint8_t *u8row = NULL;
    int rc_code;

    if ((rc_code = check_shape("resize: input", in, sizeof(float), err, errlen)) != 0)
        return rc_code;
    if ((rc_code = check_shape("resize: output", out, sizeof(float), err, errlen)) != 0)
        return rc_code;
    /* Float coordinates are exact only below 2^24, as in TensorFlow. */
    if (in.h > (1u << 24) || in.w > (1u << 24) || out_h > (1u << 24) || out_w > (1u << 24))
        return sl_errf(err, errlen, SL_EINVAL, "resize: %zu x %zu -> %zu x %zu exceeds 2^24 on a side", in.h, in.w,
                    out_h, out_w);

    size_t c = in.c, row_bytes = in.w * c, out_row = out_w * c;
    if (stride == 0)
        stride = row_bytes;
    xl = malloc(out_w * sizeof(*xl));
    yl = malloc(out_h * sizeof(*yl));
    rc.buf[0] = malloc(out_row * sizeof(float));
    rc.buf[1] = malloc(out_row * sizeof(float));
    if (nt)
        u8row = malloc(out_row);
    size_t out_px = dst_f32 ? sizeof(float) : 1; /* bytes a value of the output */
    uint8_t *stage = far ? malloc(out_row * out_px) : NULL;
    if (!xl || !yl || !rc.buf[0] || !rc.buf[1] || (nt && !u8row) || (far && !stage)) {
        rc_code = sl_errf(err, errlen, -ENOMEM, "resize: out of memory for %zu x %zu -> %zu x %zu", in.h, in.w, out_h,
                       out_w);
        goto done;
    }
    compute_lerps(in.w, out_w, c, span ? span->extent_w : 0, span ? span->origin_w : 0, xl);
    compute_lerps(in.h, out_h, 1, span ? span->extent_h : 0, span ? span->origin_h : 0, yl);
    /* The mirrored image's lerps, in the same float steps, then each
     * position read from its mirror: the same values as resizing a
     * flipped copy, to the bit. */
    if (flip == SL_IMAGE_FLIP_LEFT_RIGHT)
        mirror_lerps(in.w, out_w, c, xl);
    else if (flip == SL_IMAGE_FLIP_UP_DOWN)
        mirror_lerps(in.h, out_h, 1, yl);
    /* The result mirrored: each output pixel (row) takes its mirror's lerp. */
    if (flip_out == SL_IMAGE_FLIP_LEFT_RIGHT)
        reverse_lerps(out_w, xl);
    else if (flip_out == SL_IMAGE_FLIP_UP_DOWN)
        reverse_lerps(out_h, yl);

    for (size_t y = 0; y < out_h; y++) {
        const float *top = cached_row(&rc, src, stride, row_bytes, xl, out_w, c, yl[y].lo, -1);
        const float *bot = cached_row(&rc, src, stride, row_bytes, xl, out_w, c, yl[y].hi, slot_of(&rc, top));
        uint8_t *row = dst_f32 ? (uint8_t *)(dst_f32 + y * out_row) : dst_u8 + y * out_row;
        uint8_t *to = far ? stage : row;
        if (nt) {
            vlerp_u8(top, bot, yl[y].t, out_row, u8row);
            norm_row(nt, u8row, out_row, c, (float *)(void *)to);
        } else if (dst_f32) {
            vlerp_f32(top, bot, yl[y].t, out_row, (float *)(void *)to);
        } else {
            vlerp_u8(top, bot, yl[y].t, out_row, to);
        }
        if (far)
            sl_copy_stream(row, stage, out_row * out_px);
    }
    if (far)
        sl_copy_stream_done();
    rc_code = 0;

done:
    free(stage);
    free(u8row);
    free(rc.buf[1]);
    free(rc.buf[0]);
    free(yl);
    free(xl);
    return rc_code;
}

int sl_image_resize_u8(const uint8_t *src, sl_image_shape_t in, size_t out_h, size_t out_w, uint8_t *dst, char *err,
                       size_t errlen)
{
    return resize(src, in, 0, -1, -1, NULL, out_h, out_w, dst, NULL, NULL, false, err, errlen);
}

int sl_image_resize_f32(const uint8_t *src, sl_image_shape_t in, size_t out_h, size_t out_w, float *dst, char *err,
                        size_t errlen)
{
    return resize(src, in, 0, -1, -1, NULL, out_h, out_w, NULL, dst, NULL, false, err, errlen);
}

int sl_image_resize_fused(const uint8_t *src, sl_image_shape_t in, const sl_image_resize_fuse_t *f, size_t out_h,
                          size_t out_w, void *dst, char *err, size_t errlen)
{
    if (f->flip && f->flip_dir != SL_IMAGE_FLIP_LEFT_RIGHT && f->flip_dir != SL_IMAGE_FLIP_UP_DOWN)
        return sl_errf(err, errlen, SL_EINVAL, "random_flip: unknown direction %d", (int)f->flip_dir);
    if (f->flip_after && f->flip_after_dir != SL_IMAGE_FLIP_LEFT_RIGHT && f->flip_after_dir != SL_IMAGE_FLIP_UP_DOWN)
        return sl_errf(err, errlen, SL_EINVAL, "random_flip: unknown direction %d", (int)f->flip_after_dir);
    int flip = f->flip ? (int)f->flip_dir : -1, flip_out = f->flip_after ? (int)f->flip_after_dir : -1;
    /* The span, from the origin on, lies in the image (0 <= origin, and
     * origin + extent <= the side: every float compare exact, as the sides
     * are below 2^24 and the origins are 0 .. 1). */
    float eh = f->extent_h > 0 ? f->extent_h : (float)in.h, ew = f->extent_w > 0 ? f->extent_w : (float)in.w;
    if (!(f->extent_h >= 0 && f->extent_w >= 0 && f->origin_h >= 0 && f->origin_w >= 0 &&
          f->origin_h + eh <= (float)in.h && f->origin_w + ew <= (float)in.w))
        return sl_errf(err, errlen, SL_EINVAL, "resize: extent %g x %g from (%g, %g) outside the image %zu x %zu",
                       (double)f->extent_h, (double)f->extent_w, (double)f->origin_h, (double)f->origin_w, in.h, in.w);
    if (f->stride != 0 && f->stride / in.c < in.w)
        return sl_errf(err, errlen, SL_EINVAL, "resize: a row stride of %zu bytes is shorter than a row of %zu x %zu",
                       f->stride, in.w, in.c);
    if (!f->mean)
        return f->out_f32
                   ? resize(src, in, f->stride, flip, flip_out, f, out_h, out_w, NULL, dst, NULL, f->far_out, err,
                            errlen)
                   : resize(src, in, f->stride, flip, flip_out, f, out_h, out_w, dst, NULL, NULL, f->far_out, err,
                            errlen);
    int rc;
    if ((rc = check_shape("normalize", in, sizeof(float), err, errlen)) != 0)
        return rc;
    norm_table_t nt;
    if ((rc = norm_table_init(&nt, in.c, f->mean, f->std, f->scale, err, errlen)) != 0)
        return rc;
    return resize(src, in, f->stride, flip, flip_out, f, out_h, out_w, NULL, dst, &nt, f->far_out, err, errlen);
}

/* ---- crops and flips ---- */

static int check_window(const char *what, sl_image_shape_t in, size_t h, size_t w, char *err, size_t errlen)
{
    int rc;
    if ((rc = check_shape(what, in, 1, err, errlen)) != 0)
        return rc;
    if (h == 0 || w == 0)
        return sl_errf(err, errlen, SL_EINVAL, "%s: empty window %zu x %zu", what, h, w);
    if (h > in.h || w > in.w)
        return sl_errf(err, errlen, SL_EINVAL, "%s: window %zu x %zu is larger than the image %zu x %zu", what, h, w,
                    in.h, in.w);
    return 0;
}

int sl_image_crop(const uint8_t *src, sl_image_shape_t in, size_t y, size_t x, size_t h, size_t w, uint8_t *dst,
                  char *err, size_t errlen)
{
    int rc;
    if ((rc = check_window("crop", in, h, w, err, errlen)) != 0)
        return rc;
    if (y > in.h - h || x > in.w - w)
        return sl_errf(err, errlen, SL_EINVAL, "crop: window %zu x %zu at (%zu, %zu) leaves the image %zu x %zu", h, w,
                    y, x, in.h, in.w);
    size_t row_bytes = in.w * in.c, out_row = w * in.c;
    const uint8_t *s = src + y * row_bytes + x * in.c;
    for (size_t r = 0; r < h; r++)
        memcpy(dst + r * out_row, s + r * row_bytes, out_row);
    return 0;
}

int sl_image_center_crop_offsets(sl_image_shape_t in, size_t h, size_t w, size_t *y, size_t *x, char *err,
                                 size_t errlen)
{
    int rc;
    if ((rc = check_window("center_crop", in, h, w, err, errlen)) != 0)
        return rc;
    *y = (in.h - h) / 2;
    *x = (in.w - w) / 2;
    return 0;
}

int sl_image_random_crop_offsets(sl_rng_t *rng, sl_image_shape_t in, size_t h, size_t w, size_t *y, size_t *x,
                                 char *err, size_t errlen)
{
    int rc;
    if ((rc = check_window("random_crop", in, h, w, err, errlen)) != 0)
        return rc;
    *y = (size_t)sl_rng_below(rng, (uint64_t)(in.h - h) + 1);
    *x = (size_t)sl_rng_below(rng, (uint64_t)(in.w - w) + 1);
    return 0;
}

/* Python's int(round(v)) of a v >= 0: half to even. */
static size_t round_even(double v)
{
    return (size_t)nearbyint(v);
}

int sl_image_random_resized_crop_window(sl_rng_t *rng, sl_image_shape_t in, const double scale[2],
                                        const double ratio[2], size_t *y, size_t *x, size_t *h, size_t *w, char *err,
                                        size_t errlen)
{
    int rc;
    if ((rc = check_shape("random_resized_crop", in, 1, err, errlen)) != 0)
        return rc;
    if (!(scale[0] > 0) || !(scale[0] <= scale[1]) || !(scale[1] <= 1) || !(ratio[0] > 0) || !(ratio[0] <= ratio[1]) ||
        !isfinite(ratio[1]))
        return sl_errf(err, errlen, SL_EINVAL, "random_resized_crop: bad scale [%g, %g] or ratio [%g, %g]", scale[0],
                       scale[1], ratio[0], ratio[1]);
    double area = (double)in.h * (double)in.w, lr0 = log(ratio[0]), lr1 = log(ratio[1]);
    for (int i = 0; i < 10; i++) {
        double target = area * sl_rng_uniform(rng, scale[0], scale[1]);
        double aspect = exp(sl_rng_uniform(rng, lr0, lr1));
        size_t cw = round_even(sqrt(target * aspect)), ch = round_even(sqrt(target / aspect));
        if (cw > 0 && cw <= in.w && ch > 0 && ch <= in.h) {
            *y = (size_t)sl_rng_below(rng, (uint64_t)(in.h - ch) + 1);
            *x = (size_t)sl_rng_below(rng, (uint64_t)(in.w - cw) + 1);
            *h = ch;
            *w = cw;
            return 0;
        }
    }
    /* None fitted: the centered window of the nearest allowed ratio. */
    double own = (double)in.w / (double)in.h;
    size_t ch = in.h, cw = in.w;
    if (own < ratio[0])
        ch = round_even((double)cw / ratio[0]);
    else if (own > ratio[1])
        cw = round_even((double)ch * ratio[1]);
    ch = ch < 1 ? 1 : ch > in.h ? in.h : ch;
    cw = cw < 1 ? 1 : cw > in.w ? in.w : cw;
    *y = (in.h - ch) / 2;
    *x = (in.w - cw) / 2;
    *h = ch;
    *w = cw;
    return 0;
}

/* ---- color jitter ---- */

void sl_image_color_jitter_draw(sl_rng_t *rng, const bool given[4], const double range[4][2], sl_image_jitter_t *out)
{
    /* A uniform permutation of the four (Fisher-Yates), as torch.randperm(4). */
    int order[4] = {0, 1, 2, 3};
    for (int i = 3; i > 0; i--) {
        int k = (int)sl_rng_below(rng, (uint64_t)i + 1);
        int t = order[i];
        order[i] = order[k];
        order[k] = t;
    }
    /* The factors in torchvision's order (brightness, contrast, saturation,
     * hue), each uniform in its range. */
    float factor[4] = {1, 1, 1, 0};
    for (int k = 0; k < 4; k++)
        if (given[k])
            factor[k] = (float)sl_rng_uniform(rng, range[k][0], range[k][1]);
    out->n = 0;
    for (int i = 0; i < 4; i++) {
        if (!given[order[i]])
            continue;
        out->kind[out->n] = (sl_image_jitter_kind_t)order[i];
        out->factor[out->n] = factor[order[i]];
        out->n++;
    }
}

/* torch's float32 -> uint8 after clamp(0, 255): truncation. */
static inline uint8_t trunc_u8(float v)
{
    return (uint8_t)(v < 0.0f ? 0.0f : v > 255.0f ? 255.0f : v);
}

/* rgb_to_grayscale of a uint8 pixel, truncated to uint8 as torchvision's is. */
static inline uint8_t gray_u8(const uint8_t *p)
{
    return (uint8_t)(0.2989f * (float)p[0] + 0.587f * (float)p[1] + 0.114f * (float)p[2]);
}

/* _blend(x, other, f): f * x + (1 - f) * other, clamped and truncated. */
static inline uint8_t blend(uint8_t x, float other, float f, float g)
{
    return trunc_u8(f * (float)x + g * other);
}

/* torchvision's _rgb2hsv, adjust_hue's shift and _hsv2rgb for one pixel of
 * values in [0, 1], in float32 as torch computes them. */
static void hue_shift(float r, float g, float b, float shift, float out[3])
{
    float maxc = fmaxf(r, fmaxf(g, b)), minc = fminf(r, fminf(g, b));
    bool eqc = maxc == minc;
    float cr = maxc - minc;
    float s = cr / (eqc ? 1.0f : maxc);
    float div = eqc ? 1.0f : cr;
    float rc = (maxc - r) / div, gc = (maxc - g) / div, bc = (maxc - b) / div;
    float hr = maxc == r ? bc - gc : 0.0f;
    float hg = (maxc == g && maxc != r) ? 2.0f + rc - bc : 0.0f;
    float hb = (maxc != g && maxc != r) ? 4.0f + gc - rc : 0.0f;
    float h = fmodf((hr + hg + hb) / 6.0f + 1.0f, 1.0f);
    /* (h + shift) % 1.0, Python's modulo: the sign of the divisor. */
    h = fmodf(h + shift, 1.0f);
    if (h < 0)
        h += 1.0f;
    float v = maxc, h6 = h * 6.0f, i = floorf(h6), f = h6 - i;
    float p = fminf(fmaxf(v * (1.0f - s), 0.0f), 1.0f);
    float q = fminf(fmaxf(v * (1.0f - s * f), 0.0f), 1.0f);
    float t = fminf(fmaxf(v * (1.0f - s * (1.0f - f)), 0.0f), 1.0f);
    switch (((int)i % 6 + 6) % 6) {
    case 0: out[0] = v, out[1] = t, out[2] = p; break;
    case 1: out[0] = q, out[1] = v, out[2] = p; break;
    case 2: out[0] = p, out[1] = v, out[2] = t; break;
    case 3: out[0] = p, out[1] = q, out[2] = v; break;
    case 4: out[0] = t, out[1] = p, out[2] = v; break;
    default: out[0] = v, out[1] = p, out[2] = q; break;
    }
}

int sl_image_color_jitter(uint8_t *img, sl_image_shape_t shape, const sl_image_jitter_t *j, char *err, size_t errlen)
{
    int rc;
    if ((rc = check_shape("color_jitter", shape, 1, err, errlen)) != 0)
        return rc;
    size_t px = shape.h * shape.w, c = shape.c;
    for (int a = 0; a < j->n; a++) {
        float f = j->factor[a], g = (float)(1.0 - (double)j->factor[a]);
        switch (j->kind[a]) {
        case SL_IMAGE_JITTER_BRIGHTNESS:
            for (size_t i = 0; i < px * c; i++)
                img[i] = blend(img[i], 0.0f, f, g);
            break;
        case SL_IMAGE_JITTER_CONTRAST: {
            /* The mean of the truncated grayscale, summed exactly. */
            uint64_t sum = 0;
            for (size_t i = 0; i < px; i++)
                sum += c == 3 ? gray_u8(img + 3 * i) : img[i];
            /* torch's float32 mean: exact below 2^24, as here. */
            float mean = (float)sum / (float)px;
            for (size_t i = 0; i < px * c; i++)
                img[i] = blend(img[i], mean, f, g);
            break;
        }
        case SL_IMAGE_JITTER_SATURATION:
            if (c != 3)
                break;
            for (size_t i = 0; i < px; i++) {
                uint8_t *p = img + 3 * i;
                float gr = (float)gray_u8(p);
                p[0] = blend(p[0], gr, f, g);
                p[1] = blend(p[1], gr, f, g);
                p[2] = blend(p[2], gr, f, g);
            }
            break;
        case SL_IMAGE_JITTER_HUE:
            if (c != 3)
                break;
            for (size_t i = 0; i < px; i++) {
                uint8_t *p = img + 3 * i;
                float o[3];
                hue_shift((float)p[0] / 255.0f, (float)p[1] / 255.0f, (float)p[2] / 255.0f, f, o);
                for (int k = 0; k < 3; k++)
                    p[k] = (uint8_t)(o[k] * 255.0f);
            }
            break;
        default: return sl_errf(err, errlen, SL_EINVAL, "color_jitter: unknown adjustment %d", (int)j->kind[a]);
        }
    }
    return 0;
}

int sl_image_grayscale(uint8_t *img, sl_image_shape_t shape, char *err, size_t errlen)
{
    int rc;
    if ((rc = check_shape("random_grayscale", shape, 1, err, errlen)) != 0)
        return rc;
    if (shape.c != 3)
        return 0;
    for (size_t i = 0; i < shape.h * shape.w; i++) {
        uint8_t *p = img + 3 * i;
        p[0] = p[1] = p[2] = gray_u8(p);
    }
    return 0;
}

int sl_image_solarize(uint8_t *img, sl_image_shape_t shape, double threshold, char *err, size_t errlen)
{
    int rc;
    if ((rc = check_shape("random_solarize", shape, 1, err, errlen)) != 0)
        return rc;
    if (!(threshold >= 0 && threshold <= 255))
        return sl_errf(err, errlen, SL_EINVAL, "random_solarize: threshold %g is not from 0 to 255", threshold);
    /* A value v is at or above threshold when it is at or above its ceiling. */
    unsigned from = (unsigned)ceil(threshold);
    uint8_t lut[256];
    for (unsigned v = 0; v < 256; v++)
        lut[v] = (uint8_t)(v >= from ? 255 - v : v);
    for (size_t i = 0, n = shape.h * shape.w * shape.c; i < n; i++)
        img[i] = lut[img[i]];
    return 0;
}

/* _get_gaussian_kernel1d: exp(-0.5 (x / sigma)^2) at x = -(k-1)/2 .. (k-1)/2,
 * over its sum, in float32. */
static void gaussian_kernel(size_t k, float sigma, float *out)
{
    float half = (float)(k - 1) * 0.5f, sum = 0;
    for (size_t i = 0; i < k; i++) {
        float x = (-half + (float)i) / sigma;
        out[i] = expf(-0.5f * (x * x));
        sum += out[i];
    }
    for (size_t i = 0; i < k; i++)
        out[i] /= sum;
}

/* torch's "reflect" padding: index i of an axis of n, mirrored at its ends
 * without repeating them (|i| < n). */
static inline size_t reflect(ptrdiff_t i, size_t n)
{
    if (i < 0)
        return (size_t)-i;
    if ((size_t)i >= n)
        return 2 * (n - 1) - (size_t)i;
    return (size_t)i;
}

int sl_image_gaussian_blur(uint8_t *img, sl_image_shape_t shape, size_t kh, size_t kw, float sigma, char *err,
                           size_t errlen)
{
    int rc;
    if ((rc = check_shape("gaussian_blur", shape, sizeof(float), err, errlen)) != 0)
        return rc;
    if (kh % 2 == 0 || kw % 2 == 0 || kh > 255 || kw > 255 || !(sigma > 0))
        return sl_errf(err, errlen, SL_EINVAL, "gaussian_blur: bad kernel %zu x %zu or sigma %g", kh, kw,
                       (double)sigma);
    if (kh / 2 >= shape.h || kw / 2 >= shape.w)
        return sl_errf(err, errlen, SL_EDATA,
                       "an image of %zu x %zu is too small for a kernel of %zu x %zu (reflection needs half the "
                       "kernel, rounded down, to be shorter than each side)",
                       shape.h, shape.w, kh, kw);
    size_t h = shape.h, w = shape.w, c = shape.c, rh = kh / 2, rw = kw / 2;
    float ky[255], kx[255];
    gaussian_kernel(kh, sigma, ky);
    gaussian_kernel(kw, sigma, kx);
    size_t n = w * c;
    float *tmp = malloc(h * n * sizeof(float)), *acc = malloc(n * sizeof(float));
    if (!tmp || !acc) {
        free(tmp);
        free(acc);
        return sl_errf(err, errlen, -ENOMEM, "gaussian_blur: out of memory for %zu x %zu x %zu floats", h, w, c);
    }
    /* Along each row, then down each column. */
    for (size_t y = 0; y < h; y++) {
        const uint8_t *row = img + y * n;
        for (size_t x = 0; x < w; x++)
            for (size_t ch = 0; ch < c; ch++) {
                float a = 0;
                for (size_t j = 0; j < kw; j++)
                    a += kx[j] * (float)row[reflect((ptrdiff_t)x + (ptrdiff_t)j - (ptrdiff_t)rw, w) * c + ch];
                tmp[y * n + x * c + ch] = a;
            }
    }
    for (size_t y = 0; y < h; y++) {
        /* A whole output row at a time, each value summed in the kernel's
         * order, as a value at a time would. */
        for (size_t k = 0; k < n; k++)
            acc[k] = 0;
        for (size_t i = 0; i < kh; i++) {
            const float *src = tmp + reflect((ptrdiff_t)y + (ptrdiff_t)i - (ptrdiff_t)rh, h) * n;
            for (size_t k = 0; k < n; k++)
                acc[k] += ky[i] * src[k];
        }
        for (size_t k = 0; k < n; k++)
            img[y * n + k] = round_u8(acc[k]);
    }
    free(acc);
    free(tmp);
    return 0;
}

/* Mirrors one row of w pixels of C bytes; dst is src or apart from it. */
static inline void mirror_row(const uint8_t *src, uint8_t *dst, size_t w, size_t C)
{
    if (src == dst) {
        for (size_t i = 0, j = w - 1; i < j; i++, j--)
            for (size_t k = 0; k < C; k++) {
                uint8_t t = dst[i * C + k];
                dst[i * C + k] = dst[j * C + k];
                dst[j * C + k] = t;
            }
    } else {
        for (size_t i = 0; i < w; i++)
            for (size_t k = 0; k < C; k++)
                dst[i * C + k] = src[(w - 1 - i) * C + k];
    }
}

int sl_image_flip(const uint8_t *src, sl_image_shape_t shape, sl_image_flip_dir_t dir, uint8_t *dst, char *err,
                  size_t errlen)
{
    int rc;
    if ((rc = check_shape("flip", shape, 1, err, errlen)) != 0)
        return rc;
    size_t row_bytes = shape.w * shape.c;
    switch (dir) {
    case SL_IMAGE_FLIP_LEFT_RIGHT:
        for (size_t r = 0; r < shape.h; r++) {
            if (shape.c == 3)
                mirror_row(src + r * row_bytes, dst + r * row_bytes, shape.w, 3);
            else
                mirror_row(src + r * row_bytes, dst + r * row_bytes, shape.w, 1);
        }
        return 0;
    case SL_IMAGE_FLIP_UP_DOWN:
        if (src == dst) {
            /* Swap rows pairwise through a small bounce buffer. */
            uint8_t tmp[4096];
            for (size_t i = 0, j = shape.h - 1; i < j; i++, j--) {
                uint8_t *a = dst + i * row_bytes, *b = dst + j * row_bytes;
                for (size_t off = 0; off < row_bytes; off += sizeof(tmp)) {
                    size_t n = row_bytes - off < sizeof(tmp) ? row_bytes - off : sizeof(tmp);
                    memcpy(tmp, a + off, n);
                    memcpy(a + off, b + off, n);
                    memcpy(b + off, tmp, n);
                }
            }
        } else {
            for (size_t r = 0; r < shape.h; r++)
                memcpy(dst + r * row_bytes, src + (shape.h - 1 - r) * row_bytes, row_bytes);
        }
        return 0;
    }
    return sl_errf(err, errlen, SL_EINVAL, "flip: unknown direction %d", (int)dir);
}

int sl_image_random_flip(sl_rng_t *rng, const uint8_t *src, sl_image_shape_t shape, sl_image_flip_dir_t dir,
                         uint8_t *dst, bool *flipped, char *err, size_t errlen)
{
    int rc;
    if ((rc = check_shape("random_flip", shape, 1, err, errlen)) != 0)
        return rc;
    if (dir != SL_IMAGE_FLIP_LEFT_RIGHT && dir != SL_IMAGE_FLIP_UP_DOWN)
        return sl_errf(err, errlen, SL_EINVAL, "random_flip: unknown direction %d", (int)dir);
    /* The top bit: xoshiro256**'s high bits are its best. */
    bool flip = (sl_rng_next(rng) >> 63) != 0;
    if (flipped)
        *flipped = flip;
    if (flip)
        return sl_image_flip(src, shape, dir, dst, err, errlen);
    if (dst != src)
        memcpy(dst, src, shape.h * shape.w * shape.c);
    return 0;
}

/* ---- normalize and cast ---- */

int sl_image_normalize(const uint8_t *src, sl_image_shape_t shape, const float *mean, const float *std, bool scale,
                       float *dst, char *err, size_t errlen)
{
    return sl_image_normalize_far(src, shape, mean, std, scale, dst, false, err, errlen);
}

int sl_image_normalize_far(const uint8_t *src, sl_image_shape_t shape, const float *mean, const float *std,
                           bool scale, float *dst, bool far, char *err, size_t errlen)
{
    int rc;
    if ((rc = check_shape("normalize", shape, sizeof(float), err, errlen)) != 0)
        return rc;
    /* A byte has 256 values: a table per channel gives the exact result of
     * the expression (no reciprocal) at the cost of a load per value. */
    norm_table_t nt;
    if ((rc = norm_table_init(&nt, shape.c, mean, std, scale, err, errlen)) != 0)
        return rc;
    size_t row = shape.w * shape.c;
    float *stage = far ? malloc(row * sizeof(float)) : NULL;
    if (!stage) {
        norm_row(&nt, src, shape.h * row, shape.c, dst); /* through the cache */
        return 0;
    }
    for (size_t y = 0; y < shape.h; y++) {
        norm_row(&nt, src + y * row, row, shape.c, stage);
        sl_copy_stream(dst + y * row, stage, row * sizeof(float));
    }
    sl_copy_stream_done();
    free(stage);
    return 0;
}

void sl_image_cast_u8_f32(const uint8_t *src, size_t n, float *dst)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = (float)src[i];
}

void sl_image_cast_f32_u8(const float *src, size_t n, uint8_t *dst)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = round_u8(src[i]);
}

void sl_image_cast_u8_i32(const uint8_t *src, size_t n, int32_t *dst)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = (int32_t)src[i];
}

static uint16_t f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;

    if (ax >= 0x7f800000u) {
        /* Inf stays inf; NaN stays a quiet NaN with the top payload bits. */
        if (ax == 0x7f800000u)
            return sign | 0x7c00;
        return (uint16_t)(sign | 0x7e00 | ((ax >> 13) & 0x3ff));
    }
    /* 65520 is halfway between 65504 (the largest half) and 65536: it and
     * all above round to inf. */
    if (ax >= 0x477ff000u)
        return sign | 0x7c00;
    if (ax < 0x38800000u) {
        /* Below 2^-14 the half is subnormal, in units of 2^-24; below 2^-25
         * (and at it, a tie to even) it is zero. */
        if (ax <= 0x33000000u)
            return sign;
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1)))
            h++;
        return (uint16_t)(sign | h);
    }
    /* Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits
     * to even; a carry out of the mantissa correctly bumps the exponent. */
    uint32_t h = (ax - 0x38000000u) >> 13, rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
        h++;
    return (uint16_t)(sign | h);
}

void sl_image_cast_f32_f16(const float *src, size_t n, uint16_t *dst)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = f32_to_f16(src[i]);
}
