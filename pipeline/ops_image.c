/*
 * ops_image.c: the ops that change one component of an element:
 * decode_jpeg, resize, random_crop, center_crop, random_resized_crop,
 * color_jitter, random_grayscale, gaussian_blur, random_solarize, random_flip
 * and normalize on uint8 HWC images (through image.h), and cast on numbers of any shape.
 * Each replaces the value of its `key` component and passes the other
 * components on as they are.
 *
 * Images come one per element, shape [height, width, channels] with 1 or
 * 3 channels: these ops go before batch, as in a tf.data map. decode_jpeg
 * makes uint8 images; resize and random_resized_crop take them and make
 * float32 ones (as tf.image.resize) or uint8; color_jitter,
 * random_grayscale, gaussian_blur and random_solarize change uint8 ones in
 * place;
 * random_crop, center_crop and random_flip take images of any numeric
 * dtype, normalize uint8 or float32 ones.
 *
 * The random ops (random_crop, random_resized_crop, color_jitter,
 * random_grayscale, gaussian_blur, random_solarize, random_flip) draw, for the element at
 * ordinal i of epoch e (the e-th reset), from a generator seeded with
 * sl__element_seed(seed, e, i): every run with the same seed makes the same
 * draws, whatever num_parallel_calls, and each epoch new ones. Without a
 * seed each pipeline instance draws its own.
 *
 * decode_jpeg reads the JPEG's header before it decodes: an image whose
 * height x width x channels exceeds the per-image limit (max_batch_bytes,
 * the worker's --max-batch-mb) or the worker's whole memory budget
 * (opts.mem, --max-memory-mb) fails the pipeline with SL_ETOOBIG before its
 * pixels are allocated; one that does not fit what the budget has left
 * waits for room as shuffle and batch do (opts.mem_wait: on while the
 * task's own batches fill it), then fails the same way. The decoded bytes
 * stay charged to the budget while
 * the image is decoded; whatever holds the image afterwards (shuffle,
 * batch, prefetch, cache) charges it in turn.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image.h"
#include "iter.h"

struct image_iter {
    sl_iter_t base;
    sl_op_kind_t kind;
    uint32_t key;       /* the component changed */
    sl_spec_op_t op;    /* a copy: these ops' descriptors hold no pointers */
    sl_image_decoder_t *dec; /* decode_jpeg */
    bool random;             /* a random op: each element draws from its own generator */
    uint64_t seed, epoch;    /* random ops */
    sl_rng_t rng;      /* unused: each element draws from its own (image_apply) */
    uint64_t ordinal;        /* next()'s count of elements since the last reset */
    /* decode_jpeg directly followed by a crop of the same component, both
     * run alike (in next(), or in parallel with the same num_parallel_calls):
     * the decode passes the bytes on and the crop decodes only its window
     * (sl_image_decode_jpeg_window), with the same result. The crop then
     * has a decoder of its own (dec, and one per thread as its local). */
    bool fused;                       /* decode_jpeg: leave the decoding to the crop */
    struct image_iter *fused_decode;  /* the crops: the decode_jpeg before it */
    /* Likewise random_flip directly followed by a resize, and a uint8
     * resize directly followed by normalize, of the same component: the
     * later op does the earlier one's work in the same pass
     * (sl_image_resize_fused), with the same result. The earlier op passes
     * the image on (fused); the flip's draw stays its own (its seed and
     * epoch, the element's ordinal). */
    struct image_iter *fused_flip;    /* resize: the random_flip before it */
    struct image_iter *fused_resize;  /* normalize: the uint8 resize before it */
    /* resize: a crop fused with its decode_jpeg, directly before it or
     * before its fused flip; it decodes the crop's window into rows that
     * the resize reads in place, and the crop passes the JPEG on. */
    struct image_iter *fused_crop;
    /* And random_resized_crop directly followed by random_flip, normalize
     * (a uint8 crop), or both in that order: the last of them runs the
     * crop, whose resize writes the pixels mirrored and normalized in the
     * same pass, with the same result; the others pass the image on. */
    struct image_iter *fused_rrc;     /* random_flip, normalize: the random_resized_crop they run */
    struct image_iter *rrc_flip;      /* normalize: the random_flip between them, NULL: none */
};

/* ---- casts ---- */

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13); /* inf, NaN */
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {
        /* A subnormal half is a normal float. */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static uint16_t float_to_bfloat16(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if (isnan(f))
        return (uint16_t)((bits >> 16) | 0x40); /* stays a quiet NaN */
    bits += 0x7fff + ((bits >> 16) & 1);     /* round to nearest even */
    return (uint16_t)(bits >> 16);
}

static float bfloat16_to_float(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* long double holds every value of every dtype exactly on x86-64 and
 * aarch64 (64- and 113-bit mantissas), int64 and uint64 included. */
static long double load(sl_dtype_t t, const uint8_t *p)
{
    switch (t) {
    case SL_DTYPE_BOOL: return *p != 0;
    case SL_DTYPE_INT8: return (int8_t)*p;
    case SL_DTYPE_UINT8: return *p;
#define LOAD(dt, ctype)                                                                                              \
    case dt: {                                                                                                       \
        ctype x;                                                                                                     \
        memcpy(&x, p, sizeof x);                                                                                     \
        return x;                                                                                                    \
    }
        LOAD(SL_DTYPE_INT16, int16_t)
        LOAD(SL_DTYPE_INT32, int32_t)
        LOAD(SL_DTYPE_INT64, int64_t)
        LOAD(SL_DTYPE_UINT16, uint16_t)
        LOAD(SL_DTYPE_UINT32, uint32_t)
        LOAD(SL_DTYPE_UINT64, uint64_t)
        LOAD(SL_DTYPE_FLOAT32, float)
        LOAD(SL_DTYPE_FLOAT64, double)
#undef LOAD
    case SL_DTYPE_FLOAT16: {
        uint16_t h;
        memcpy(&h, p, 2);
        return half_to_float(h);
    }
    case SL_DTYPE_BFLOAT16: {
        uint16_t h;
        memcpy(&h, p, 2);
        return bfloat16_to_float(h);
    }
    default: return 0;
    }
}

static void store(sl_dtype_t t, long double x, uint8_t *p)
{
    switch (t) {
    case SL_DTYPE_BOOL: *p = x != 0; return;
    case SL_DTYPE_FLOAT32: {
        float f = (float)x;
        memcpy(p, &f, sizeof f);
        return;
    }
    case SL_DTYPE_FLOAT64: {
        double d = (double)x;
        memcpy(p, &d, sizeof d);
        return;
    }
    case SL_DTYPE_FLOAT16: {
        float f = (float)x;
        uint16_t h;
        sl_image_cast_f32_f16(&f, 1, &h);
        memcpy(p, &h, 2);
        return;
    }
    case SL_DTYPE_BFLOAT16: {
        uint16_t h = float_to_bfloat16((float)x);
        memcpy(p, &h, 2);
        return;
    }
    default: break;
    }
    /* Integers: round half to even, saturate, NaN is 0. */
    x = isnan(x) ? 0 : nearbyintl(x);
    switch (t) {
#define STORE(dt, ctype, lo, hi)                                                                                     \
    case dt: {                                                                                                       \
        ctype v = x <= (long double)(lo) ? (ctype)(lo) : x >= (long double)(hi) ? (ctype)(hi) : (ctype)x;            \
        memcpy(p, &v, sizeof v);                                                                                     \
        return;                                                                                                      \
    }
        STORE(SL_DTYPE_INT8, int8_t, INT8_MIN, INT8_MAX)
        STORE(SL_DTYPE_INT16, int16_t, INT16_MIN, INT16_MAX)
        STORE(SL_DTYPE_INT32, int32_t, INT32_MIN, INT32_MAX)
        STORE(SL_DTYPE_INT64, int64_t, INT64_MIN, INT64_MAX)
        STORE(SL_DTYPE_UINT8, uint8_t, 0, UINT8_MAX)
        STORE(SL_DTYPE_UINT16, uint16_t, 0, UINT16_MAX)
        STORE(SL_DTYPE_UINT32, uint32_t, 0, UINT32_MAX)
        STORE(SL_DTYPE_UINT64, uint64_t, 0, UINT64_MAX)
#undef STORE
    default: return;
    }
}

void sl__cast_values(sl_dtype_t from, const void *src, size_t n, sl_dtype_t to, void *dst)
{
    /* The kernels of image.h do the common image casts, with the same
     * rounding as the general loop. */
    if (from == to) {
        memcpy(dst, src, n * sl_dtype_size(from));
    } else if (from == SL_DTYPE_UINT8 && to == SL_DTYPE_FLOAT32) {
        sl_image_cast_u8_f32(src, n, dst);
    } else if (from == SL_DTYPE_FLOAT32 && to == SL_DTYPE_UINT8) {
        sl_image_cast_f32_u8(src, n, dst);
    } else if (from == SL_DTYPE_UINT8 && to == SL_DTYPE_INT32) {
        sl_image_cast_u8_i32(src, n, dst);
    } else if (from == SL_DTYPE_FLOAT32 && to == SL_DTYPE_FLOAT16) {
        sl_image_cast_f32_f16(src, n, dst);
    } else {
        size_t a = sl_dtype_size(from), b = sl_dtype_size(to);
        const uint8_t *s = src;
        uint8_t *d = dst;
        for (size_t i = 0; i < n; i++)
            store(to, load(from, s + i * a), d + i * b);
    }
}

/* ---- the ops ---- */

static const char *key_name(const struct image_iter *ii)
{
    return ii->base.spec.c[ii->key].name;
}

/* Checks that v is one image of a dtype the op takes and gives its shape. */
static int image_shape(struct image_iter *ii, const sl_value_t *v, sl_image_shape_t *s)
{
    const char *op = sl_spec_op_name(ii->kind), *takes;
    /* As sl__op_image_create() checked the input's spec, on the value. */
    if (!sl_spec_op_takes(ii->kind, v->dtype, &takes))
        return sl__iter_fail(&ii->base, SL_EDATA, "component \"%s\" is %s, which %s does not take", key_name(ii),
                             sl_dtype_name(v->dtype), op);
    if (v->ragged || v->rank != 3 || v->shape[0] < 1 || v->shape[1] < 1 || (v->shape[2] != 1 && v->shape[2] != 3)) {
        char got[128];
        sl__shape_str(v->shape, v->rank, got, sizeof got);
        return sl__iter_fail(&ii->base, SL_EDATA,
                             "component \"%s\" has shape %s%s; %s takes one image of shape [height, width, 1 or 3] "
                             "per element (put it before batch)",
                             key_name(ii), v->ragged ? "(ragged)" : "", got, op);
    }
    *s = (sl_image_shape_t){(size_t)v->shape[0], (size_t)v->shape[1], (size_t)v->shape[2]};
    return 0;
}

/* Replaces v with buf, a malloc'd HWC result of dtype (taken over). */
static void set_image(sl_value_t *v, sl_dtype_t dtype, size_t h, size_t w, size_t c, uint8_t *buf)
{
    int64_t shape[3] = {(int64_t)h, (int64_t)w, (int64_t)c};
    sl_value_clear(v);
    sl_value_adopt(v, dtype, 3, shape, buf, h * w * c * sl_dtype_size(dtype));
}

static int nomem(struct image_iter *ii, size_t bytes)
{
    return sl__iter_fail(&ii->base, -ENOMEM, "out of memory for %zu bytes of component \"%s\"", bytes, key_name(ii));
}

/* The output size of resize rs for an image of shape in: its size, or
 * with shorter_side torchvision's Resize(int): the shorter side that long
 * and the longer int(shorter_side * longer / shorter) (Python's true
 * division, then truncated; at least 1). */
static void resize_size(const struct image_iter *rs, sl_image_shape_t in, size_t *h, size_t *w)
{
    if (rs->op.u.resize.has_size) {
        *h = (size_t)rs->op.u.resize.size.v[0];
        *w = (size_t)rs->op.u.resize.size.v[1];
        return;
    }
    size_t n = (size_t)rs->op.u.resize.shorter_side, lo = in.w <= in.h ? in.w : in.h, hi = in.w <= in.h ? in.h : in.w;
    size_t longer = (size_t)((double)(n * hi) / (double)lo); /* n * hi < 2^33: exact in a double */
    if (longer < 1)
        longer = 1;
    *h = in.w <= in.h ? longer : n;
    *w = in.w <= in.h ? n : longer;
}

/* Decodes v, an encoded image, for ii (a decode_jpeg, named in errors).
 * With fit (a resize after it, fused), at the DCT scale
 * sl_image_jpeg_scale_denom() picks for its size, and *full is the image's
 * size before scaling; else whole. */
static int decode_value(struct image_iter *ii, sl_image_decoder_t *dec, sl_value_t *v,
                        const struct image_iter *fit, sl_image_shape_t *full, float extent[2])
{
    char err[256];
    if (v->dtype != SL_DTYPE_BYTES || v->rank != 0 || v->ragged) {
        char got[128];
        sl__shape_str(v->shape, v->rank, got, sizeof got);
        return sl__iter_fail(&ii->base, SL_EDATA,
                             "component \"%s\" is %s of shape %s; decode_jpeg takes one encoded image (a bytes "
                             "scalar) per element",
                             key_name(ii), sl_dtype_name(v->dtype), got);
    }
    size_t len;
    const uint8_t *jpeg = sl_bytes_at(sl_value_data(v), 1, 0, &len);
    uint8_t *img = NULL;
    sl_image_shape_t s;
    int channels = (int)ii->op.u.decode_jpeg.channels;
    size_t limit = ii->base.ctx->opts.max_batch_bytes, charged = 0;
    sl_membudget_t *mem = ii->base.ctx->opts.mem;
    unsigned denom = 1;
    int rc;
    if (mem || fit) {
        /* The header says what the decode would allocate: charge it first. */
        rc = sl_image_jpeg_header(dec, jpeg, len, channels, &s, err, sizeof err);
        if (rc < 0)
            return sl__iter_fail(&ii->base, rc, "component \"%s\" (%zu bytes): %s", key_name(ii), len, err);
        size_t n = s.h * s.w * s.c; /* at most 65535 x 65535 x 3: no overflow */
        if (fit) {
            size_t fit_h, fit_w;
            *full = s;
            resize_size(fit, s, &fit_h, &fit_w);
            denom = sl_image_jpeg_scale_denom(s, fit_h, fit_w);
            /* At 1/d the image spans h / d of its ceil(h / d) rows. */
            if (denom > 1) {
                extent[0] = (float)s.h / (float)denom;
                extent[1] = (float)s.w / (float)denom;
            }
        }
        size_t scaled = ((s.h + denom - 1) / denom) * ((s.w + denom - 1) / denom) * s.c;
        if (mem && n <= limit) {
            n = scaled;
            if (!sl_membudget_charge_wait(mem, n, &ii->base.ctx->opts.mem_wait)) {
                char what[128], msg[512];
                snprintf(what, sizeof what, "a decoded %zu x %zu x %zu image", s.h, s.w, s.c);
                sl_membudget_refusal(mem, n, what, msg, sizeof msg);
                return sl__iter_fail(&ii->base, SL_ETOOBIG, "component \"%s\" (%zu bytes): %s", key_name(ii), len,
                                     msg);
            }
            charged = n;
        }
    }
    rc = sl_image_decode_jpeg_scaled(dec, jpeg, len, channels, limit, denom, &img, &s, err, sizeof err);
    sl_membudget_release(mem, charged);
    if (rc < 0)
        return sl__iter_fail(&ii->base, rc, "component \"%s\" (%zu bytes): %s%s", key_name(ii), len, err,
                             rc == SL_ETOOBIG ? " (the per-image limit is the largest batch, --max-batch-mb)" : "");
    set_image(v, SL_DTYPE_UINT8, s.h, s.w, s.c, img);
    return 0;
}

static int do_decode_jpeg(struct image_iter *ii, sl_image_decoder_t *dec, sl_value_t *v)
{
    if (ii->fused) {
        /* The op after it decodes; the input is still checked here. */
        if (v->dtype != SL_DTYPE_BYTES || v->rank != 0 || v->ragged)
            return decode_value(ii, dec, v, NULL, NULL, NULL);
        return 0;
    }
    return decode_value(ii, dec, v, NULL, NULL, NULL);
}

/* Whether a random_flip run by a later op (fl) flips element ordinal: the
 * draw sl_image_random_flip() makes, the top bit, from fl's own generator;
 * and along which direction (*dir). */
static bool flip_draw(const struct image_iter *fl, uint64_t ordinal, sl_image_flip_dir_t *dir)
{
    sl_rng_t rng;
    sl_rng_seed(&rng, sl__element_seed(fl->seed, fl->epoch, ordinal));
    *dir = (sl_image_flip_dir_t)fl->op.u.random_flip.direction;
    return (sl_rng_next(&rng) >> 63) != 0;
}

/* A normalize run by the op before it (ii): its mean, std (into m, d) and
 * scale in f, after checking them against c channels. */
static int fuse_normalize(struct image_iter *norm, const struct image_iter *ii, size_t c, float *m, float *d,
                          sl_image_resize_fuse_t *f)
{
    const sl_spec_floats_t *mean = &norm->op.u.normalize.mean, *std = &norm->op.u.normalize.std;
    if ((size_t)mean->n != c)
        return sl__iter_fail(&norm->base, SL_EDATA,
                             "component \"%s\" has %zu channel%s, but mean and std have %d values", key_name(ii), c,
                             c == 1 ? "" : "s", mean->n);
    for (int i = 0; i < mean->n; i++) {
        m[i] = (float)mean->v[i];
        d[i] = (float)std->v[i];
    }
    f->mean = m;
    f->std = d;
    f->scale = norm->op.u.normalize.scale;
    return 0;
}

static int crop_window(struct image_iter *ii, sl_image_decoder_t *dec, sl_rng_t *rng, sl_value_t *v,
                       const struct image_iter *fit, sl_image_resize_fuse_t *f, uint8_t **img, sl_image_shape_t *ws,
                       sl_image_shape_t *cs, size_t *first);

/* resize, with the decode_jpeg (fused_decode: DCT scaling), or the crop
 * fused with its decode_jpeg (fused_crop) and the flip (fused_flip) before
 * it, and the normalize after it (norm, NULL when not fused) in the same
 * pass. The input's shape is checked by the first of them, which names the
 * op in an error. dec: the thread's decoder, with fused_decode or
 * fused_crop. */
static int do_resize(struct image_iter *ii, sl_image_decoder_t *dec, uint64_t ordinal, struct image_iter *norm,
                     sl_value_t *v)
{
    struct image_iter *first = ii->fused_flip ? ii->fused_flip : ii;
    sl_image_shape_t s;
    char err[256];
    float extent[2] = {0, 0};
    sl_image_shape_t full = {0, 0, 0};
    const uint8_t *src = NULL;
    uint8_t *window = NULL, *out = NULL;
    sl_image_resize_fuse_t f = {0};
    int rc;
    sl_image_shape_t cs = {0, 0, 0};
    if (ii->fused_crop) {
        /* The crop's draws from its own generator, as it would make them;
         * the window at a DCT scale when this keeps at most half of it. */
        struct image_iter *crop = ii->fused_crop;
        sl_rng_t rng;
        sl_rng_seed(&rng, sl__element_seed(crop->seed, crop->epoch, ordinal));
        size_t at;
        if ((rc = crop_window(crop, dec, &rng, v, ii, &f, &window, &s, &cs, &at)) < 0)
            return rc;
        src = window + at;
    } else {
        if (ii->fused_decode && (rc = decode_value(ii->fused_decode, dec, v, ii, &full, extent)) < 0)
            return rc;
        if ((rc = image_shape(first, v, &s)) < 0)
            return rc;
        src = sl_value_data(v);
    }
    /* The size from the image (or the crop) as decoded whole, also when
     * the decode was scaled. */
    size_t h, w;
    sl_image_shape_t whole = ii->fused_crop ? cs : ii->fused_decode ? full : s;
    resize_size(ii, whole, &h, &w);
    if (!ii->fused_crop) {
        f.extent_h = extent[0];
        f.extent_w = extent[1];
    }
    /* A scaled image or window is flipped after the resize: mirroring its
     * rows would move it by a part of a scaled pixel (its origin, or the
     * padding of its last row and column), and the result is the flip's
     * geometry either way. */
    if (ii->fused_flip && (f.extent_h > 0 || f.extent_w > 0))
        f.flip_after = flip_draw(ii->fused_flip, ordinal, &f.flip_after_dir);
    else if (ii->fused_flip)
        f.flip = flip_draw(ii->fused_flip, ordinal, &f.flip_dir);
    float m[SL_SPEC_MAX_FLOATS], d[SL_SPEC_MAX_FLOATS];
    if (norm && (rc = fuse_normalize(norm, ii, s.c, m, d, &f)) < 0)
        goto done;
    sl_dtype_t dt = norm ? SL_DTYPE_FLOAT32 : ii->op.u.resize.dtype;
    f.out_f32 = dt == SL_DTYPE_FLOAT32;
    size_t bytes = h * w * s.c * sl_dtype_size(dt);
    /* shorter_side makes the longer side from the image: held to the
     * per-image limit, as a decoded image is. */
    if (bytes > ii->base.ctx->opts.max_batch_bytes) {
        rc = sl__iter_fail(&(norm ? norm : ii)->base, SL_ETOOBIG,
                           "component \"%s\": a resize of %zu x %zu to %zu x %zu makes %zu bytes, over the "
                           "per-image limit of %zu (the largest batch, --max-batch-mb)",
                           key_name(ii), whole.h, whole.w, h, w, bytes, ii->base.ctx->opts.max_batch_bytes);
        goto done;
    }
    if (!(out = sl__value_buf(bytes))) {
        rc = nomem(norm ? norm : ii, bytes);
        goto done;
    }
    f.far_out = sl__value_buf_is_row(out);
    if ((rc = sl_image_resize_fused(src, s, &f, h, w, out, err, sizeof err)) < 0) {
        sl__value_buf_free(out);
        rc = sl__iter_fail(&(norm ? norm : ii)->base, rc, "component \"%s\": %s", key_name(ii), err);
        goto done;
    }
    set_image(v, dt, h, w, s.c, out);
done:
    free(window);
    return rc;
}

/* The header of the JPEG v still holds (a crop fused with the decode_jpeg
 * before it, ii): errors name the decode_jpeg, as decoding first would. */
static int fused_header(struct image_iter *ii, sl_image_decoder_t *dec, sl_value_t *v, const uint8_t **jpeg,
                        size_t *len, sl_image_shape_t *s)
{
    struct image_iter *d = ii->fused_decode;
    char err[256];
    if (v->dtype != SL_DTYPE_BYTES || v->rank != 0 || v->ragged) {
        char got[128];
        sl__shape_str(v->shape, v->rank, got, sizeof got);
        return sl__iter_fail(&d->base, SL_EDATA,
                             "component \"%s\" is %s of shape %s; decode_jpeg takes one encoded image (a bytes "
                             "scalar) per element",
                             key_name(ii), sl_dtype_name(v->dtype), got);
    }
    *jpeg = sl_bytes_at(sl_value_data(v), 1, 0, len);
    int rc = sl_image_jpeg_header(dec, *jpeg, *len, (int)d->op.u.decode_jpeg.channels, s, err, sizeof err);
    if (rc < 0)
        return sl__iter_fail(&d->base, rc, "component \"%s\" (%zu bytes): %s", key_name(ii), *len, err);
    return 0;
}

/* Whether the image of shape s is over the per-image limit: then the window
 * decoder fails it, as decode_jpeg does, before a crop looks at its size. */
static bool fused_too_big(const struct image_iter *ii, sl_image_shape_t s)
{
    return s.h * s.w * s.c > ii->fused_decode->base.ctx->opts.max_batch_bytes;
}

/* Decodes the window (y, x, h, w) of the JPEG jpeg (len bytes, an image of
 * shape full) into *img, at DCT scale 1/denom (the window then in the
 * scaled image's pixels, and as decoded rows: stride not NULL). While it
 * decodes, h rows of the (scaled) image's width are charged to the memory
 * budget (at least what the window decoder holds), as decode_jpeg charges
 * the whole image. */
static int fused_window(struct image_iter *ii, const uint8_t *jpeg, size_t len, sl_image_shape_t full, unsigned denom,
                        size_t y, size_t x, size_t h, size_t w, uint8_t **img, sl_image_shape_t *ws, size_t *stride,
                        size_t *first)
{
    struct image_iter *d = ii->fused_decode;
    char err[256];
    int ch = (int)d->op.u.decode_jpeg.channels;
    size_t max = d->base.ctx->opts.max_batch_bytes, n = h * ((full.w + denom - 1) / denom) * full.c, charged = 0;
    sl_membudget_t *mem = d->base.ctx->opts.mem;
    if (mem && n <= max) {
        if (!sl_membudget_charge_wait(mem, n, &d->base.ctx->opts.mem_wait)) {
            char what[128], msg[512];
            snprintf(what, sizeof what, "a decoded window of %zu x %zu x %zu (rows of %zu)", h, w, full.c, full.w);
            sl_membudget_refusal(mem, n, what, msg, sizeof msg);
            return sl__iter_fail(&d->base, SL_ETOOBIG, "component \"%s\" (%zu bytes): %s", key_name(ii), len, msg);
        }
        charged = n;
    }
    int rc = stride ? sl_image_decode_jpeg_window_rows(jpeg, len, ch, max, denom, y, x, h, w, img, stride, first, ws,
                                                       err, sizeof err)
                    : sl_image_decode_jpeg_window(jpeg, len, ch, max, y, x, h, w, img, ws, err, sizeof err);
    sl_membudget_release(mem, charged);
    if (rc < 0)
        return sl__iter_fail(&d->base, rc, "component \"%s\" (%zu bytes): %s", key_name(ii), len, err);
    return 0;
}

/* The window (y, x, h, w) of the JPEG (an image of shape s) in the rows as
 * decoded, for a resize to oh x ow that reads it there (f: its stride; *first
 * where the window starts in a row): at 1/d when the resize keeps at most
 * half of it each way (as a resize after decode_jpeg is scaled), the rows
 * and columns of the scaled image it reaches into, f mapping the output
 * onto where it lies in them: from (y mod d) / d into the first, h / d rows
 * and w / d columns (exact in a float). */
static int scaled_window(struct image_iter *ii, const uint8_t *jpeg, size_t len, sl_image_shape_t s, size_t y,
                         size_t x, size_t h, size_t w, size_t oh, size_t ow, sl_image_resize_fuse_t *f, uint8_t **img,
                         sl_image_shape_t *ws, size_t *first)
{
    unsigned d = sl_image_jpeg_scale_denom((sl_image_shape_t){h, w, s.c}, oh, ow);
    size_t y0 = y / d, x0 = x / d, y1 = (y + h + d - 1) / d, x1 = (x + w + d - 1) / d;
    if (d > 1) {
        f->origin_h = (float)(y % d) / (float)d;
        f->origin_w = (float)(x % d) / (float)d;
        f->extent_h = (float)h / (float)d;
        f->extent_w = (float)w / (float)d;
    }
    return fused_window(ii, jpeg, len, s, d, y0, x0, y1 - y0, x1 - x0, img, ws, &f->stride, first);
}

/* The window of crop ii, fused with the decode_jpeg before it, decoded
 * from the encoded image v still holds: dense, or, for fit (a resize that
 * takes the crop over: f and first not NULL), in the rows as decoded, at a
 * DCT scale when fit keeps at most half of it (scaled_window()). *cs is the
 * crop's shape, *ws the window's as decoded. The offsets are drawn from the
 * header's shape with the draws do_crop makes, so the window is the one
 * decode-then-crop would cut. */
static int crop_window(struct image_iter *ii, sl_image_decoder_t *dec, sl_rng_t *rng, sl_value_t *v,
                       const struct image_iter *fit, sl_image_resize_fuse_t *f, uint8_t **img, sl_image_shape_t *ws,
                       sl_image_shape_t *cs, size_t *first)
{
    char err[256];
    const uint8_t *jpeg = NULL;
    size_t len = 0;
    sl_image_shape_t s;
    int rc = fused_header(ii, dec, v, &jpeg, &len, &s);
    if (rc < 0)
        return rc;
    const sl_spec_ints_t *size = ii->kind == SL_OP_RANDOM_CROP ? &ii->op.u.random_crop.size : &ii->op.u.center_crop.size;
    size_t h = (size_t)size->v[0], w = (size_t)size->v[1], y, x;
    bool too_big = fused_too_big(ii, s);
    if (!too_big && (h > s.h || w > s.w))
        return sl__iter_fail(&ii->base, SL_EDATA,
                             "component \"%s\" has shape [%zu, %zu, %zu], smaller than the crop [%zu, %zu]",
                             key_name(ii), s.h, s.w, s.c, h, w);
    if (too_big)
        y = x = 0;
    else if (ii->kind == SL_OP_RANDOM_CROP)
        rc = sl_image_random_crop_offsets(rng, s, h, w, &y, &x, err, sizeof err);
    else
        rc = sl_image_center_crop_offsets(s, h, w, &y, &x, err, sizeof err);
    if (rc < 0)
        return sl__iter_fail(&ii->base, rc, "component \"%s\": %s", key_name(ii), err);
    *cs = (sl_image_shape_t){h, w, s.c};
    if (!fit)
        return fused_window(ii, jpeg, len, s, 1, y, x, h, w, img, ws, NULL, NULL);
    size_t oh = h, ow = w; /* too big: not scaled, the decoder refuses it */
    if (!too_big)
        resize_size(fit, *cs, &oh, &ow);
    return scaled_window(ii, jpeg, len, s, y, x, h, w, oh, ow, f, img, ws, first);
}

static int do_decode_crop(struct image_iter *ii, sl_image_decoder_t *dec, sl_rng_t *rng, sl_value_t *v)
{
    uint8_t *img = NULL;
    sl_image_shape_t ws, cs;
    int rc = crop_window(ii, dec, rng, v, NULL, NULL, &img, &ws, &cs, NULL);
    if (rc < 0)
        return rc;
    set_image(v, SL_DTYPE_UINT8, ws.h, ws.w, ws.c, img);
    return 0;
}

/* random_resized_crop: the window drawn from the image's shape (the JPEG's
 * header when fused with the decode_jpeg before it, which then decodes only
 * the window, at a DCT scale when it is twice the output or more), resized
 * to size without being copied out; with the random_flip (flip) and the
 * normalize (norm) after it in the same pass when they run it (fused_rrc). */
static int do_random_resized_crop(struct image_iter *ii, sl_image_decoder_t *dec, uint64_t ordinal,
                                  struct image_iter *flip, struct image_iter *norm, sl_value_t *v)
{
    char err[256];
    sl_rng_t rngs, *rng = &rngs;
    sl_rng_seed(rng, sl__element_seed(ii->seed, ii->epoch, ordinal));
    const uint8_t *jpeg = NULL;
    size_t len = 0, y, x, h, w;
    sl_image_shape_t s;
    int rc = ii->fused_decode ? fused_header(ii, dec, v, &jpeg, &len, &s) : image_shape(ii, v, &s);
    if (rc < 0)
        return rc;
    const double *scale = ii->op.u.random_resized_crop.scale.v, *ratio = ii->op.u.random_resized_crop.ratio.v;
    if (ii->fused_decode && fused_too_big(ii, s))
        y = x = 0, h = w = 1;
    else if ((rc = sl_image_random_resized_crop_window(rng, s, scale, ratio, &y, &x, &h, &w, err, sizeof err)) < 0)
        return sl__iter_fail(&ii->base, rc, "component \"%s\": %s", key_name(ii), err);
    const uint8_t *src;
    uint8_t *img = NULL;
    sl_dtype_t dt = norm ? SL_DTYPE_FLOAT32 : ii->op.u.random_resized_crop.dtype;
    sl_image_resize_fuse_t f = {.out_f32 = dt == SL_DTYPE_FLOAT32};
    sl_image_shape_t ws = {h, w, s.c};
    size_t oh = (size_t)ii->op.u.random_resized_crop.size.v[0], ow = (size_t)ii->op.u.random_resized_crop.size.v[1];
    if (ii->fused_decode) {
        /* Read in the rows as decoded, at a DCT scale when the window is
         * twice the output or more: the window is not copied out. */
        size_t first;
        if ((rc = scaled_window(ii, jpeg, len, s, y, x, h, w, oh, ow, &f, &img, &ws, &first)) < 0)
            return rc;
        src = img + first;
    } else {
        src = (const uint8_t *)sl_value_data(v) + (y * s.w + x) * s.c;
        f.stride = s.w * s.c;
    }
    if (flip)
        f.flip_after = flip_draw(flip, ordinal, &f.flip_after_dir);
    float m[SL_SPEC_MAX_FLOATS], d[SL_SPEC_MAX_FLOATS];
    if (norm && (rc = fuse_normalize(norm, ii, ws.c, m, d, &f)) < 0) {
        free(img);
        return rc;
    }
    size_t bytes = oh * ow * ws.c * sl_dtype_size(dt);
    uint8_t *out = sl__value_buf(bytes);
    if (!out) {
        free(img);
        return nomem(ii, bytes);
    }
    f.far_out = sl__value_buf_is_row(out);
    rc = sl_image_resize_fused(src, ws, &f, oh, ow, out, err, sizeof err);
    free(img);
    if (rc < 0) {
        sl__value_buf_free(out);
        return sl__iter_fail(&(norm ? norm : ii)->base, rc, "component \"%s\": %s", key_name(ii), err);
    }
    set_image(v, dt, oh, ow, ws.c, out);
    return 0;
}

static int do_crop(struct image_iter *ii, sl_rng_t *rng, sl_value_t *v)
{
    sl_image_shape_t s;
    char err[256];
    int rc = image_shape(ii, v, &s);
    if (rc < 0)
        return rc;
    const sl_spec_ints_t *size = ii->kind == SL_OP_RANDOM_CROP ? &ii->op.u.random_crop.size : &ii->op.u.center_crop.size;
    size_t h = (size_t)size->v[0], w = (size_t)size->v[1], y, x;
    if (h > s.h || w > s.w) {
        char got[128];
        sl__shape_str(v->shape, v->rank, got, sizeof got);
        return sl__iter_fail(&ii->base, SL_EDATA, "component \"%s\" has shape %s, smaller than the crop [%zu, %zu]",
                             key_name(ii), got, h, w);
    }
    if (ii->kind == SL_OP_RANDOM_CROP)
        rc = sl_image_random_crop_offsets(rng, s, h, w, &y, &x, err, sizeof err);
    else
        rc = sl_image_center_crop_offsets(s, h, w, &y, &x, err, sizeof err);
    if (rc < 0)
        return sl__iter_fail(&ii->base, rc, "component \"%s\": %s", key_name(ii), err);
    /* A pixel is c values of the dtype: rows of the window are copied whole. */
    size_t px = s.c * sl_dtype_size(v->dtype);
    uint8_t *out = sl__value_buf(h * w * px);
    if (!out)
        return nomem(ii, h * w * px);
    const uint8_t *src = sl_value_data(v);
    for (size_t r = 0; r < h; r++)
        memcpy(out + r * w * px, src + ((y + r) * s.w + x) * px, w * px);
    set_image(v, v->dtype, h, w, s.c, out);
    return 0;
}

/* RandomApply's draw, an op's first: whether it applies (below p). */
static bool applies(sl_rng_t *rng, double p)
{
    return sl_rng_uniform(rng, 0, 1) < p;
}

/* color_jitter's draws for one image: the order of the adjustments given
 * and each one's factor in its range. */
static void jitter_draw(const struct image_iter *ii, sl_rng_t *rng, sl_image_jitter_t *j)
{
    const bool given[4] = {ii->op.u.color_jitter.has_brightness, ii->op.u.color_jitter.has_contrast,
                           ii->op.u.color_jitter.has_saturation, ii->op.u.color_jitter.has_hue};
    const sl_spec_floats_t *r[4] = {&ii->op.u.color_jitter.brightness, &ii->op.u.color_jitter.contrast,
                                    &ii->op.u.color_jitter.saturation, &ii->op.u.color_jitter.hue};
    double range[4][2];
    for (int k = 0; k < 4; k++) {
        range[k][0] = given[k] ? r[k]->v[0] : 0;
        range[k][1] = given[k] ? r[k]->v[1] : 0;
    }
    sl_image_color_jitter_draw(rng, given, range, j);
}

/* The ops that change a uint8 image in place (its bytes are its own, as
 * random_flip's) with probability p, RandomApply's draw first, then the
 * op's own: color_jitter (the order and factors of its adjustments),
 * random_grayscale (one draw, as torch.rand(1) < p), gaussian_blur (sigma
 * uniform in its range, GaussianBlur.get_params) and random_solarize. */
static int do_in_place(struct image_iter *ii, sl_rng_t *rng, sl_value_t *v)
{
    sl_image_shape_t s;
    char err[256];
    int rc = image_shape(ii, v, &s);
    if (rc < 0)
        return rc;
    const sl_spec_op_t *op = &ii->op;
    uint8_t *img = sl_value_data(v);
    switch (ii->kind) {
    case SL_OP_COLOR_JITTER: {
        if (!applies(rng, op->u.color_jitter.p))
            return 0;
        sl_image_jitter_t j;
        jitter_draw(ii, rng, &j);
        rc = sl_image_color_jitter(img, s, &j, err, sizeof err);
        break;
    }
    case SL_OP_RANDOM_GRAYSCALE:
        if (!applies(rng, op->u.random_grayscale.p))
            return 0;
        rc = sl_image_grayscale(img, s, err, sizeof err);
        break;
    case SL_OP_GAUSSIAN_BLUR: {
        if (!applies(rng, op->u.gaussian_blur.p))
            return 0;
        const double *sg = op->u.gaussian_blur.sigma.v;
        float sigma = (float)sl_rng_uniform(rng, sg[0], sg[1]);
        size_t kh = (size_t)op->u.gaussian_blur.kernel_size.v[0], kw = (size_t)op->u.gaussian_blur.kernel_size.v[1];
        rc = sl_image_gaussian_blur(img, s, kh, kw, sigma, err, sizeof err);
        break;
    }
    case SL_OP_RANDOM_SOLARIZE:
        if (!applies(rng, op->u.random_solarize.p))
            return 0;
        rc = sl_image_solarize(img, s, op->u.random_solarize.threshold, err, sizeof err);
        break;
    default: return sl__iter_fail(&ii->base, SL_EINTERNAL, "op kind %d does not change images in place",
                                 (int)ii->kind);
    }
    if (rc < 0)
        return sl__iter_fail(&ii->base, rc, "component \"%s\": %s", key_name(ii), err);
    return 0;
}

static int do_random_flip(struct image_iter *ii, sl_rng_t *rng, sl_value_t *v)
{
    sl_image_shape_t s;
    char err[256];
    int rc = image_shape(ii, v, &s);
    if (rc < 0)
        return rc;
    /* In place: the value's bytes are its own (heap, inline or its
     * element's block). */
    uint8_t *data = sl_value_data(v);
    if (v->dtype == SL_DTYPE_UINT8) {
        rc = sl_image_random_flip(rng, data, s, (sl_image_flip_dir_t)ii->op.u.random_flip.direction, data, NULL,
                                  err, sizeof err);
        if (rc < 0)
            return sl__iter_fail(&ii->base, rc, "component \"%s\": %s", key_name(ii), err);
        return 0;
    }
    /* Other dtypes: the same draw as image.h's (the top bit), then pixels
     * of c values swapped whole. */
    if ((sl_rng_next(rng) >> 63) == 0)
        return 0;
    size_t px = s.c * sl_dtype_size(v->dtype), row = s.w * px;
    uint8_t tmp[64];
    if (ii->op.u.random_flip.direction == SL_IMAGE_FLIP_LEFT_RIGHT) {
        for (size_t y = 0; y < s.h; y++) {
            uint8_t *r = data + y * row;
            for (size_t i = 0, j = s.w - 1; i < j; i++, j--) {
                memcpy(tmp, r + i * px, px);
                memcpy(r + i * px, r + j * px, px);
                memcpy(r + j * px, tmp, px);
            }
        }
    } else {
        for (size_t i = 0, j = s.h - 1; i < j; i++, j--) {
            uint8_t *a = data + i * row, *b = data + j * row;
            for (size_t k = 0; k < row; k += px) {
                memcpy(tmp, a + k, px);
                memcpy(a + k, b + k, px);
                memcpy(b + k, tmp, px);
            }
        }
    }
    return 0;
}

static int do_normalize(struct image_iter *ii, sl_image_decoder_t *dec, uint64_t ordinal, sl_value_t *v)
{
    if (ii->fused_resize)
        return do_resize(ii->fused_resize, dec, ordinal, ii, v);
    if (ii->fused_rrc)
        return do_random_resized_crop(ii->fused_rrc, dec, ordinal, ii->rrc_flip, ii, v);
    sl_image_shape_t s;
    char err[256];
    int rc = image_shape(ii, v, &s);
    if (rc < 0)
        return rc;
    const sl_spec_floats_t *mean = &ii->op.u.normalize.mean, *std = &ii->op.u.normalize.std;
    if ((size_t)mean->n != s.c)
        return sl__iter_fail(&ii->base, SL_EDATA, "component \"%s\" has %zu channel%s, but mean and std have %d values",
                             key_name(ii), s.c, s.c == 1 ? "" : "s", mean->n);
    float m[SL_SPEC_MAX_FLOATS], d[SL_SPEC_MAX_FLOATS];
    for (int i = 0; i < mean->n; i++) {
        m[i] = (float)mean->v[i];
        d[i] = (float)std->v[i];
    }
    size_t n = s.h * s.w * s.c, bytes = n * sizeof(float);
    if (v->dtype == SL_DTYPE_FLOAT32) {
        /* In place, with the expression image.h uses for bytes. */
        float *x = (float *)sl_value_data(v); /* 8-aligned: heap, inline or block */
        bool scale = ii->op.u.normalize.scale;
        for (size_t i = 0; i < n; i++) {
            float y = scale ? x[i] / 255.0f : x[i];
            x[i] = (y - m[i % s.c]) / d[i % s.c];
        }
        return 0;
    }
    float *out = (float *)sl__value_buf(bytes);
    if (!out)
        return nomem(ii, bytes);
    rc = sl_image_normalize_far(sl_value_data(v), s, m, d, ii->op.u.normalize.scale, out,
                                sl__value_buf_is_row((uint8_t *)out), err, sizeof err);
    if (rc < 0) {
        sl__value_buf_free((uint8_t *)out);
        return sl__iter_fail(&ii->base, rc, "component \"%s\": %s", key_name(ii), err);
    }
    set_image(v, SL_DTYPE_FLOAT32, s.h, s.w, s.c, (uint8_t *)out);
    return 0;
}

static int do_cast(struct image_iter *ii, sl_value_t *v)
{
    sl_dtype_t to = ii->op.u.cast.dtype;
    if (v->dtype == to)
        return 0;
    if (v->dtype == SL_DTYPE_BYTES || v->ragged)
        return sl__iter_fail(&ii->base, SL_EDATA, "component \"%s\" is %s%s; cast takes numbers (cast before batch)",
                             key_name(ii), v->ragged ? "a ragged batch of " : "", sl_dtype_name(v->dtype));
    uint64_t n = sl_value_count(v);
    size_t bytes = (size_t)n * sl_dtype_size(to);
    int64_t shape[SL_MAX_RANK];
    memcpy(shape, v->shape, sizeof shape);
    sl_value_t nv;
    uint8_t *dst = sl_value_alloc(&nv, to, v->rank, shape, bytes);
    if (!dst)
        return nomem(ii, bytes);
    sl__cast_values(v->dtype, sl_value_data(v), (size_t)n, to, dst);
    sl_value_clear(v);
    *v = nv;
    return 0;
}

/* The per-element method (iter.h): local is the thread's decoder
 * (decode_jpeg, and a crop fused with it). A random op draws from a generator seeded by (seed, epoch,
 * ordinal), so the draws do not depend on which thread runs the element. */
static int image_apply(sl_iter_t *it, void *local, uint64_t ordinal, sl_element_t *out)
{
    struct image_iter *ii = (struct image_iter *)it;
    int rc;
    sl_rng_t rng;
    if (ii->random)
        sl_rng_seed(&rng, sl__element_seed(ii->seed, ii->epoch, ordinal));
    sl_value_t *v = &out->v[ii->key];
    switch (ii->kind) {
    case SL_OP_DECODE_JPEG: rc = do_decode_jpeg(ii, local, v); break;
    case SL_OP_RESIZE: rc = ii->fused ? 0 : do_resize(ii, local, ordinal, NULL, v); break;
    case SL_OP_RANDOM_CROP:
    case SL_OP_CENTER_CROP:
        rc = ii->fused ? 0 : ii->fused_decode ? do_decode_crop(ii, local, &rng, v) : do_crop(ii, &rng, v);
        break;
    case SL_OP_RANDOM_RESIZED_CROP:
        rc = ii->fused ? 0 : do_random_resized_crop(ii, local, ordinal, NULL, NULL, v);
        break;
    case SL_OP_COLOR_JITTER:
    case SL_OP_RANDOM_GRAYSCALE:
    case SL_OP_GAUSSIAN_BLUR:
    case SL_OP_RANDOM_SOLARIZE: rc = do_in_place(ii, &rng, v); break;
    case SL_OP_RANDOM_FLIP:
        rc = ii->fused       ? 0
             : ii->fused_rrc ? do_random_resized_crop(ii->fused_rrc, local, ordinal, ii, NULL, v)
                             : do_random_flip(ii, &rng, v);
        break;
    case SL_OP_NORMALIZE: rc = do_normalize(ii, local, ordinal, v); break;
    case SL_OP_CAST: rc = do_cast(ii, v); break;
    default: rc = sl__iter_fail(it, SL_EINTERNAL, "op kind %d is not an image op", (int)ii->kind); break;
    }
    if (rc < 0)
        sl_element_clear(out);
    return rc;
}

static int image_next(sl_iter_t *it, sl_element_t *out)
{
    struct image_iter *ii = (struct image_iter *)it;
    int rc = it->input->vt->next(it->input, out);
    if (rc != 0)
        return rc;
    return image_apply(it, ii->dec, ii->ordinal++, out);
}

/* Whether the op decodes JPEGs: decode_jpeg, or an op that does its work
 * (a crop or a resize after it, a normalize after such a resize). */
static bool needs_decoder(const struct image_iter *ii)
{
    return ii->kind == SL_OP_DECODE_JPEG || ii->fused_decode || ii->fused_crop ||
           (ii->fused_resize && (ii->fused_resize->fused_decode || ii->fused_resize->fused_crop)) ||
           (ii->fused_rrc && ii->fused_rrc->fused_decode);
}

static int image_local_new(sl_iter_t *it, void **local)
{
    struct image_iter *ii = (struct image_iter *)it;
    char err[256];
    *local = NULL;
    if (!needs_decoder(ii))
        return 0;
    return sl_image_decoder_new((sl_image_decoder_t **)local, err, sizeof err) < 0 ? -ENOMEM : 0;
}

static void image_local_free(sl_iter_t *it, void *local)
{
    (void)it;
    sl_image_decoder_free(local);
}

static void image_seed(struct image_iter *ii)
{
    sl_rng_seed(&ii->rng, sl__epoch_seed(ii->seed, ii->epoch));
}

static int image_reset(sl_iter_t *it)
{
    struct image_iter *ii = (struct image_iter *)it;
    ii->epoch++;
    ii->ordinal = 0;
    image_seed(ii);
    return it->input->vt->reset(it->input);
}

static void image_destroy(sl_iter_t *it)
{
    struct image_iter *ii = (struct image_iter *)it;
    sl_image_decoder_free(ii->dec);
    free(ii);
}

static const sl_iter_vtbl_t image_vtbl = {image_next, image_reset, image_destroy};
static const sl_iter_elem_t image_elem = {image_apply, image_local_new, image_local_free, false};

/* The key field of each op. */
static const char *op_key(const sl_spec_op_t *op)
{
    switch (op->kind) {
    case SL_OP_DECODE_JPEG: return op->u.decode_jpeg.key;
    case SL_OP_RESIZE: return op->u.resize.key;
    case SL_OP_RANDOM_CROP: return op->u.random_crop.key;
    case SL_OP_CENTER_CROP: return op->u.center_crop.key;
    case SL_OP_RANDOM_RESIZED_CROP: return op->u.random_resized_crop.key;
    case SL_OP_COLOR_JITTER: return op->u.color_jitter.key;
    case SL_OP_RANDOM_GRAYSCALE: return op->u.random_grayscale.key;
    case SL_OP_GAUSSIAN_BLUR: return op->u.gaussian_blur.key;
    case SL_OP_RANDOM_SOLARIZE: return op->u.random_solarize.key;
    case SL_OP_RANDOM_FLIP: return op->u.random_flip.key;
    case SL_OP_NORMALIZE: return op->u.normalize.key;
    case SL_OP_CAST: return op->u.cast.key;
    default: return NULL;
    }
}


/* Whether op (being built as later) can take over the work of input, an
 * image op of kind on the same component not already fused: only when both
 * run alike, so that no work moves from a parallel stage into a sequential
 * op, or the other way. The pipeline records input's parallelism right after
 * building it (sl__parallel_opts); later's is recorded here the same way to
 * compare them. */
static struct image_iter *fusable(struct image_iter *later, const sl_spec_op_t *op, sl_iter_t *input,
                                  sl_op_kind_t kind)
{
    if (input->vt != &image_vtbl)
        return NULL;
    struct image_iter *e = (struct image_iter *)input;
    if (e->kind != kind || e->key != later->key || e->fused)
        return NULL;
    sl__parallel_opts(&later->base, op, later->base.ctx);
    const sl_iter_t *a = &e->base, *b = &later->base;
    bool pa = a->par_calls > 1, pb = b->par_calls > 1;
    if (pa != pb || (pa && (a->par_calls != b->par_calls || a->deterministic != b->deterministic)))
        return NULL;
    return e;
}

/* Whether op draws at random, and then its seed field (has, seed). */
static bool random_seed_of(const sl_spec_op_t *op, bool *has, int64_t *seed)
{
    switch (op->kind) {
    case SL_OP_RANDOM_CROP: *has = op->u.random_crop.has_seed, *seed = op->u.random_crop.seed; return true;
    case SL_OP_RANDOM_RESIZED_CROP:
        *has = op->u.random_resized_crop.has_seed, *seed = op->u.random_resized_crop.seed;
        return true;
    case SL_OP_COLOR_JITTER: *has = op->u.color_jitter.has_seed, *seed = op->u.color_jitter.seed; return true;
    case SL_OP_RANDOM_GRAYSCALE:
        *has = op->u.random_grayscale.has_seed, *seed = op->u.random_grayscale.seed;
        return true;
    case SL_OP_GAUSSIAN_BLUR: *has = op->u.gaussian_blur.has_seed, *seed = op->u.gaussian_blur.seed; return true;
    case SL_OP_RANDOM_SOLARIZE:
        *has = op->u.random_solarize.has_seed, *seed = op->u.random_solarize.seed;
        return true;
    case SL_OP_RANDOM_FLIP: *has = op->u.random_flip.has_seed, *seed = op->u.random_flip.seed; return true;
    default: return false;
    }
}

/* A crop or a resize (into) takes the decoding over, with a decoder of its
 * own, from a decode_jpeg of the same component straight before later,
 * built as op on input (see struct image_iter): later is into itself, or
 * the random_flip a resize runs. */
static int fuse_with_decode(struct image_iter *into, struct image_iter *later, const sl_spec_op_t *op,
                            sl_iter_t *input)
{
    struct image_iter *d = fusable(later, op, input, SL_OP_DECODE_JPEG);
    if (!d)
        return 0;
    char err[256];
    if (sl_image_decoder_new(&into->dec, err, sizeof err) < 0)
        return -ENOMEM;
    d->fused = true;
    into->fused_decode = d;
    return 0;
}

/* A resize straight after a crop fused with its decode_jpeg, or after a
 * random_flip (which it runs) straight after one, takes the crop over (see
 * struct image_iter), with a decoder of its own. */
static int fuse_crop(struct image_iter *ii, const sl_spec_op_t *op, sl_iter_t *input)
{
    struct image_iter *later = ii, *crop;
    const sl_spec_op_t *later_op = op;
    if (ii->fused_flip) {
        later = ii->fused_flip;
        later_op = &later->op;
        input = later->base.input;
    }
    if (!(crop = fusable(later, later_op, input, SL_OP_RANDOM_CROP)) &&
        !(crop = fusable(later, later_op, input, SL_OP_CENTER_CROP)))
        return 0;
    if (!crop->fused_decode)
        return 0;
    char err[256];
    if (sl_image_decoder_new(&ii->dec, err, sizeof err) < 0)
        return -ENOMEM;
    crop->fused = true;
    ii->fused_crop = crop;
    return 0;
}

/* A random_flip or a normalize straight after a random_resized_crop of the
 * same component, or a normalize after a random_flip that runs one, takes
 * the crop over (see struct image_iter), with a decoder of its own when
 * the crop decodes. The caller checks that a normalize's input is uint8. */
static int fuse_rrc(struct image_iter *ii, const sl_spec_op_t *op, sl_iter_t *input)
{
    struct image_iter *rrc = fusable(ii, op, input, SL_OP_RANDOM_RESIZED_CROP), *flip = NULL;
    if (!rrc && ii->kind == SL_OP_NORMALIZE && (flip = fusable(ii, op, input, SL_OP_RANDOM_FLIP)) != NULL)
        rrc = flip->fused_rrc;
    if (!rrc)
        return 0;
    char err[256];
    if (rrc->fused_decode && sl_image_decoder_new(&ii->dec, err, sizeof err) < 0)
        return -ENOMEM;
    if (flip) { /* it passes the image on now */
        flip->fused = true;
        flip->fused_rrc = NULL;
        sl_image_decoder_free(flip->dec);
        flip->dec = NULL;
    }
    rrc->fused = true;
    ii->fused_rrc = rrc;
    ii->rrc_flip = flip;
    return 0;
}

int sl__op_image_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                        sl_iter_t **out)
{
    char names[1024], err[256];
    const char *key = op_key(op), *takes;
    if (!key)
        return sl__ctx_fail(ctx, SL_EINTERNAL, label, "op kind %d is not an image op", (int)op->kind);
    int k = sl__spec_find(&input->spec, key);
    if (k < 0) {
        sl__spec_names(&input->spec, names, sizeof names);
        return sl__ctx_fail(ctx, SL_EINVAL, label, "component \"%s\" is not in its input (%s)", key, names);
    }
    sl_dtype_t dt = input->spec.c[k].dtype;
    if (!sl_spec_op_takes(op->kind, dt, &takes))
        return sl__ctx_fail(ctx, SL_EINVAL, label, "component \"%s\" is %s; %s takes %s", key, sl_dtype_name(dt),
                            sl_spec_op_name(op->kind), takes);

    struct image_iter *ii = calloc(1, sizeof *ii);
    if (!ii)
        return -ENOMEM;
    sl__iter_init(&ii->base, &image_vtbl, input, ctx, label);
    ii->base.elem = &image_elem;
    ii->kind = op->kind;
    ii->key = (uint32_t)k;
    ii->op = *op;
    bool has_seed;
    int64_t seed;
    if ((ii->random = random_seed_of(op, &has_seed, &seed)))
        ii->seed = has_seed ? (uint64_t)seed : sl__random_seed(ii);
    switch (op->kind) {
    case SL_OP_DECODE_JPEG:
        if (sl_image_decoder_new(&ii->dec, err, sizeof err) < 0) {
            free(ii);
            return -ENOMEM;
        }
        ii->base.spec.c[k].dtype = SL_DTYPE_UINT8;
        break;
    case SL_OP_RESIZE:
        ii->base.spec.c[k].dtype = op->u.resize.dtype;
        /* And the decode_jpeg straight before it, or before the flip it
         * runs, as if that came straight before the resize (DCT scaling;
         * a flip that runs a random_resized_crop has none before it). */
        struct image_iter *fl = ii->fused_flip = fusable(ii, op, input, SL_OP_RANDOM_FLIP);
        if (fl)
            fl->fused = true;
        if ((fl ? fuse_with_decode(ii, fl, &fl->op, fl->base.input) : fuse_with_decode(ii, ii, op, input)) < 0) {
            free(ii);
            return -ENOMEM;
        }
        if (!ii->fused_decode && fuse_crop(ii, op, input) < 0) {
            free(ii);
            return -ENOMEM;
        }
        break;
    case SL_OP_NORMALIZE:
        ii->base.spec.c[k].dtype = SL_DTYPE_FLOAT32;
        /* Only a uint8 resize: normalize's tables then see its bytes. */
        if (dt == SL_DTYPE_UINT8 && !(ii->fused_resize = fusable(ii, op, input, SL_OP_RESIZE)) &&
            fuse_rrc(ii, op, input) < 0) {
            free(ii);
            return -ENOMEM;
        }
        if (ii->fused_resize) {
            ii->fused_resize->fused = true;
            /* A resize that decodes: normalize runs it, with a decoder of its own. */
            if ((ii->fused_resize->fused_decode || ii->fused_resize->fused_crop) &&
                sl_image_decoder_new(&ii->dec, err, sizeof err) < 0) {
                free(ii);
                return -ENOMEM;
            }
        }
        break;
    case SL_OP_CAST: ii->base.spec.c[k].dtype = op->u.cast.dtype; break;
    case SL_OP_RANDOM_FLIP:
        if (fuse_rrc(ii, op, input) < 0) {
            free(ii);
            return -ENOMEM;
        }
        break;
    case SL_OP_RANDOM_CROP:
        if (fuse_with_decode(ii, ii, op, input) < 0) {
            free(ii);
            return -ENOMEM;
        }
        break;
    case SL_OP_CENTER_CROP:
        if (fuse_with_decode(ii, ii, op, input) < 0) {
            free(ii);
            return -ENOMEM;
        }
        break;
    case SL_OP_RANDOM_RESIZED_CROP:
        ii->base.spec.c[k].dtype = op->u.random_resized_crop.dtype;
        if (fuse_with_decode(ii, ii, op, input) < 0) {
            free(ii);
            return -ENOMEM;
        }
        break;
    default: break;
    }
    /* An image is one per element; a cast keeps a varlen component varlen. */
    if (op->kind != SL_OP_CAST)
        ii->base.spec.c[k].varlen = false;
    image_seed(ii);
    *out = &ii->base;
    return 0;
}
