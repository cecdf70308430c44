/*
 * element_spec.c: what a spec's elements hold (names, dtypes, shapes),
 * derived op by op from the source the way the pipeline shapes them
 * (docs/dataset-spec.md, "Element spec"). Dimensions the data decides (an
 * image's size, a short last batch) are -1; a plugin map's outputs have a
 * known dtype and an unknown rank. A spec whose ops would fail the pipeline
 * when a worker builds it (a key that names no component, a dtype an op does
 * not take) has no element spec: known is 0.
 */
#include <stdio.h>
#include <string.h>

#include "spec.h"

/* The element so far, with what batch needs to know besides the public
 * fields: which components are varlen (batch makes them ragged). */
struct elem {
    sl_elemspec_t *e;
    bool varlen[SL_MAX_COMPONENTS];
};

static int find(const struct elem *el, const char *name)
{
    for (int i = 0; i < el->e->num_components; i++)
        if (strcmp(el->e->components[i].name, name) == 0)
            return i;
    return -1;
}

static void drop(struct elem *el, int i)
{
    sl_elemspec_t *e = el->e;
    memmove(&e->components[i], &e->components[i + 1], (size_t)(e->num_components - i - 1) * sizeof e->components[0]);
    memmove(&el->varlen[i], &el->varlen[i + 1], (size_t)(e->num_components - i - 1) * sizeof el->varlen[0]);
    e->num_components--;
}

static sl_component_spec_t *add(struct elem *el, const char *name, sl_dtype_t dtype, int rank, const int64_t *shape,
                                bool varlen)
{
    sl_elemspec_t *e = el->e;
    if (e->num_components >= SL_MAX_COMPONENTS)
        return NULL;
    int i = e->num_components++;
    sl_component_spec_t *c = &e->components[i];
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    c->dtype = dtype;
    c->rank = rank;
    for (int d = 0; d < rank && d < SL_MAX_RANK; d++)
        c->shape[d] = shape ? shape[d] : -1;
    el->varlen[i] = varlen;
    return c;
}

/* The image component key of an image op: rank 3 (or not known), not
 * ragged, of a dtype the op takes. */
static sl_component_spec_t *image(struct elem *el, const char *key, sl_op_kind_t kind)
{
    int i = find(el, key);
    if (i < 0)
        return NULL;
    sl_component_spec_t *c = &el->e->components[i];
    if (c->dtype == SL_DTYPE_BYTES || c->ragged || el->varlen[i] || (c->rank >= 0 && c->rank != 3))
        return NULL;
    const char *takes;
    if (!sl_spec_op_takes(kind, c->dtype, &takes))
        return NULL;
    if (c->rank < 0) { /* a plugin's output: the op takes only images */
        c->rank = 3;
        c->shape[0] = c->shape[1] = c->shape[2] = -1;
    }
    return c;
}

/* batch and padded_batch: a leading dimension of n (or -1: a short last
 * batch may come); varlen components become ragged (batch) or dense
 * (padded_batch, each dimension padded to the longest or to its given size). */
static int batch(struct elem *el, const sl_spec_op_t *op)
{
    bool padded = op->kind == SL_OP_PADDED_BATCH;
    int64_t n = padded ? (op->u.padded_batch.drop_remainder ? op->u.padded_batch.batch_size : -1)
                       : (op->u.batch.drop_remainder ? op->u.batch.batch_size : -1);
    for (int i = 0; i < el->e->num_components; i++) {
        sl_component_spec_t *c = &el->e->components[i];
        if (c->ragged)
            return -1; /* a batch of a ragged batch is refused */
        if (padded) {
            for (int k = 0; k < op->u.padded_batch.num_padded_shapes; k++) {
                const sl_spec_padded_shape_t *ps = &op->u.padded_batch.padded_shapes[k];
                if (strcmp(ps->name, c->name) != 0)
                    continue;
                if (c->rank >= 0 && ps->dims.n != c->rank)
                    return -1;
                bool had_rank = c->rank >= 0;
                c->rank = ps->dims.n;
                for (int d = 0; d < ps->dims.n; d++)
                    c->shape[d] = ps->dims.v[d] >= 0 ? ps->dims.v[d] : (had_rank ? c->shape[d] : -1);
            }
            el->varlen[i] = false;
        }
        if (c->rank < 0)
            continue; /* not known before, not known after */
        if (c->rank + 1 > SL_MAX_RANK)
            return -1;
        memmove(&c->shape[1], &c->shape[0], (size_t)c->rank * sizeof c->shape[0]);
        c->shape[0] = n;
        c->rank++;
        if (el->varlen[i]) {
            c->ragged = 1;
            el->varlen[i] = false;
        }
    }
    return 0;
}

static int apply(struct elem *el, const sl_spec_op_t *op)
{
    sl_elemspec_t *e = el->e;
    sl_component_spec_t *c;
    int i;
    switch (op->kind) {
    case SL_OP_SHUFFLE:
    case SL_OP_TAKE:
    case SL_OP_SKIP:
    case SL_OP_REPEAT:
    case SL_OP_SHARD:
    case SL_OP_INTERLEAVE:
    case SL_OP_PREFETCH:
    case SL_OP_CACHE:
        return 0;
    case SL_OP_FILTER:
        if (op->u.filter.has_key) {
            i = find(el, op->u.filter.key);
            if (i < 0 || e->components[i].dtype == SL_DTYPE_BYTES || e->components[i].rank > 0 ||
                e->components[i].ragged || el->varlen[i])
                return -1;
        }
        return 0;
    case SL_OP_BATCH:
    case SL_OP_PADDED_BATCH:
        return batch(el, op);
    case SL_OP_PARSE_EXAMPLE: {
        i = find(el, op->u.parse_example.key);
        if (i < 0 || e->components[i].dtype != SL_DTYPE_BYTES || e->components[i].rank != 0)
            return -1;
        drop(el, i);
        for (int f = 0; f < op->u.parse_example.num_features; f++) {
            const sl_spec_feature_t *ft = &op->u.parse_example.features[f];
            int j = find(el, ft->name);
            if (j >= 0)
                drop(el, j);
            int64_t any = -1;
            if (!add(el, ft->name, ft->dtype, ft->varlen ? 1 : ft->rank, ft->varlen ? &any : ft->shape, ft->varlen))
                return -1;
        }
        return 0;
    }
    case SL_OP_DECODE_JPEG:
        i = find(el, op->u.decode_jpeg.key);
        if (i < 0 || e->components[i].dtype != SL_DTYPE_BYTES || e->components[i].rank != 0)
            return -1;
        c = &e->components[i];
        c->dtype = SL_DTYPE_UINT8;
        c->rank = 3;
        c->shape[0] = c->shape[1] = -1;
        c->shape[2] = op->u.decode_jpeg.channels ? op->u.decode_jpeg.channels : -1;
        return 0;
    case SL_OP_RESIZE:
        if (!(c = image(el, op->u.resize.key, op->kind)))
            return -1;
        /* With shorter_side the longer side depends on the image. */
        c->shape[0] = op->u.resize.has_size ? op->u.resize.size.v[0] : -1;
        c->shape[1] = op->u.resize.has_size ? op->u.resize.size.v[1] : -1;
        c->dtype = op->u.resize.dtype;
        return 0;
    case SL_OP_RANDOM_CROP:
        if (!(c = image(el, op->u.random_crop.key, op->kind)))
            return -1;
        c->shape[0] = op->u.random_crop.size.v[0];
        c->shape[1] = op->u.random_crop.size.v[1];
        return 0;
    case SL_OP_CENTER_CROP:
        if (!(c = image(el, op->u.center_crop.key, op->kind)))
            return -1;
        c->shape[0] = op->u.center_crop.size.v[0];
        c->shape[1] = op->u.center_crop.size.v[1];
        return 0;
    case SL_OP_RANDOM_RESIZED_CROP:
        if (!(c = image(el, op->u.random_resized_crop.key, op->kind)))
            return -1;
        c->shape[0] = op->u.random_resized_crop.size.v[0];
        c->shape[1] = op->u.random_resized_crop.size.v[1];
        c->dtype = op->u.random_resized_crop.dtype;
        return 0;
    case SL_OP_RANDOM_FLIP:
        return image(el, op->u.random_flip.key, op->kind) ? 0 : -1;
    case SL_OP_COLOR_JITTER:
        return image(el, op->u.color_jitter.key, op->kind) ? 0 : -1;
    case SL_OP_RANDOM_GRAYSCALE:
        return image(el, op->u.random_grayscale.key, op->kind) ? 0 : -1;
    case SL_OP_GAUSSIAN_BLUR:
        return image(el, op->u.gaussian_blur.key, op->kind) ? 0 : -1;
    case SL_OP_RANDOM_SOLARIZE:
        return image(el, op->u.random_solarize.key, op->kind) ? 0 : -1;
    case SL_OP_NORMALIZE:
        if (!(c = image(el, op->u.normalize.key, op->kind)))
            return -1;
        if (c->shape[2] >= 0 && c->shape[2] != op->u.normalize.mean.n)
            return -1;
        c->shape[2] = op->u.normalize.mean.n;
        c->dtype = SL_DTYPE_FLOAT32;
        return 0;
    case SL_OP_CAST:
        i = find(el, op->u.cast.key);
        if (i < 0 || e->components[i].dtype == SL_DTYPE_BYTES || e->components[i].ragged)
            return -1;
        e->components[i].dtype = op->u.cast.dtype;
        return 0;
    case SL_OP_MAP: {
        /* The input's components that output does not name (none without
         * keep_input), in order, then the outputs in name order: their
         * dtypes are declared, their shapes the function's to choose. */
        for (i = e->num_components - 1; i >= 0; i--) {
            bool named = false;
            for (int k = 0; k < op->u.map.num_outputs; k++)
                named = named || strcmp(op->u.map.outputs[k].name, e->components[i].name) == 0;
            if (named || !op->u.map.keep_input)
                drop(el, i);
        }
        for (int k = 0; k < op->u.map.num_outputs; k++)
            if (!add(el, op->u.map.outputs[k].name, op->u.map.outputs[k].dtype, -1, NULL, false))
                return -1;
        return 0;
    }
    default:
        return -1;
    }
}

int sl_spec_element_spec(const sl_spec_t *spec, sl_elemspec_t *out)
{
    memset(out, 0, sizeof *out);
    struct elem el = {.e = out};
    const sl_spec_source_t *src = sl_spec_source(spec);
    sl_dtype_t dtype = src->kind == SL_SOURCE_RANGE ? SL_DTYPE_INT64 : SL_DTYPE_BYTES;
    add(&el, src->name, dtype, 0, NULL, false);
    for (int k = 0; k < sl_spec_num_ops(spec); k++) {
        if (apply(&el, sl_spec_op(spec, k)) < 0) {
            memset(out, 0, sizeof *out);
            return -1;
        }
    }
    out->known = 1;
    return 0;
}
