/*
 * ops_example.c: parse_example, which decodes the serialized
 * tf.train.Example of its `key` component (by default the source's record)
 * into one component per feature, through example.h.
 *
 * The record component is dropped; any other component of the input is
 * passed on first, then the features in name order. A fixed feature has
 * the shape the spec gives it; a varlen feature is a vector of any length
 * (shape [n]) and its component is varlen, so batch makes it ragged.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "example.h"
#include "iter.h"

struct example_iter {
    sl_iter_t base;
    uint32_t key;                     /* the input's record component */
    uint32_t num_kept;                /* input components passed on, before the features */
    uint32_t kept[SL_MAX_COMPONENTS]; /* their indices in the input */
    int num_features;
    int rank[SL_MAX_COMPONENTS];      /* of each fixed feature */
    int64_t shape[SL_MAX_COMPONENTS][SL_MAX_RANK];
    sl_example_decoder_t *dec;
    sl_element_t *in; /* the slot the input fills, room for SL_MAX_COMPONENTS */
    /* What a pool thread's decoder is made of (example_local_new). The
     * names and some defaults point into the spec, which lives only during
     * sl_pipeline_create(): parallel.c makes every thread's local then. */
    sl_example_feature_t feats[SL_MAX_COMPONENTS];
    void *mem[SL_MAX_COMPONENTS];
};

/* The per-element method (iter.h): decodes el's record with dec (the
 * thread's decoder) and turns el into the output element in place. */
static int example_apply(sl_iter_t *it, void *local, uint64_t ordinal, sl_element_t *el)
{
    (void)ordinal;
    struct example_iter *x = (struct example_iter *)it;
    sl_example_decoder_t *dec = local;
    sl_example_value_t vals[SL_MAX_COMPONENTS];
    sl_value_t outv[SL_MAX_COMPONENTS];
    uint32_t nout = 0;
    char err[512];
    int rc;

    sl_value_t *rec = &el->v[x->key];
    const char *key = it->input->spec.c[x->key].name;
    if (rec->dtype != SL_DTYPE_BYTES || rec->rank != 0) {
        char got[128];
        sl__shape_str(rec->shape, rec->rank, got, sizeof got);
        rc = sl__iter_fail(it, SL_EDATA,
                           "component \"%s\" has shape %s; parse_example takes one serialized record per element "
                           "(put it before batch)",
                           key, got);
        goto fail;
    }
    size_t len;
    const uint8_t *data = sl_bytes_at(sl_value_data(rec), 1, 0, &len);
    rc = sl_example_decode(dec, data, len, vals, err, sizeof err);
    if (rc < 0) {
        rc = sl__iter_fail(it, rc, "%s", err);
        goto fail;
    }
    /* The other components move over, or are copied when their bytes live
     * in the input's block (a batched input). */
    bool moved[SL_MAX_COMPONENTS] = {false};
    for (uint32_t j = 0; j < x->num_kept; j++) {
        sl_value_t *v = &el->v[x->kept[j]];
        if (el->block) {
            if (v->ragged) {
                rc = sl__iter_fail(it, SL_EDATA, "component \"%s\" is a ragged batch; parse_example goes before batch",
                                   it->input->spec.c[x->kept[j]].name);
                goto fail;
            }
            outv[nout].storage = SL_VALUE_INLINE;
            if (sl_value_copy(&outv[nout], v) < 0)
                goto nomem;
        } else {
            outv[nout] = *v;
            moved[x->kept[j]] = true;
        }
        nout++;
    }
    for (int f = 0; f < x->num_features; f++) {
        const sl_example_value_t *ev = &vals[f];
        sl_value_t *v = &outv[nout];
        int64_t n = (int64_t)ev->count;
        bool varlen = it->spec.c[x->num_kept + (uint32_t)f].varlen;
        v->storage = SL_VALUE_INLINE;
        uint8_t *p = varlen ? sl_value_alloc(v, ev->dtype, 1, &n, ev->size)
                            : sl_value_alloc(v, ev->dtype, x->rank[f], x->shape[f], ev->size);
        if (!p)
            goto nomem;
        nout++;
        memcpy(p, ev->data, ev->size);
    }
    for (uint32_t c = 0; c < el->num_components; c++) {
        if (!moved[c])
            sl_value_clear(&el->v[c]);
    }
    free(el->block);
    el->block = NULL;
    el->block_size = 0;
    for (uint32_t j = 0; j < nout; j++)
        el->v[j] = outv[j];
    el->num_components = nout;
    el->num_elements = 1;
    return 0;
nomem:
    rc = sl__iter_fail(it, -ENOMEM, "out of memory for a decoded record");
    for (uint32_t j = 0; j < nout; j++) {
        if (!(j < x->num_kept && !el->block))
            sl_value_clear(&outv[j]);
    }
fail:
    sl_element_clear(el);
    return rc;
}

static int example_local_new(sl_iter_t *it, void **local)
{
    struct example_iter *x = (struct example_iter *)it;
    char err[512];
    *local = NULL;
    int rc = sl_example_decoder_new(x->feats, x->num_features, it->ctx->opts.max_batch_bytes,
                                    (sl_example_decoder_t **)local, err, sizeof err);
    return rc < 0 ? -ENOMEM : 0;
}

static void example_local_free(sl_iter_t *it, void *local)
{
    (void)it;
    sl_example_decoder_free(local);
}

static int example_next(sl_iter_t *it, sl_element_t *out)
{
    struct example_iter *x = (struct example_iter *)it;
    sl_element_init(x->in, it->input->spec.num_components);
    int rc = it->input->vt->next(it->input, x->in);
    if (rc != 0)
        return rc;
    rc = example_apply(it, x->dec, 0, x->in);
    if (rc != 0)
        return rc;
    sl_element_move(out, x->in);
    return 0;
}

static int example_reset(sl_iter_t *it)
{
    return it->input->vt->reset(it->input);
}

static void example_destroy(sl_iter_t *it)
{
    struct example_iter *x = (struct example_iter *)it;
    sl_example_decoder_free(x->dec);
    sl_element_free(x->in);
    for (int f = 0; f < x->num_features; f++)
        free(x->mem[f]);
    free(x);
}

static const sl_iter_vtbl_t example_vtbl = {example_next, example_reset, example_destroy};
static const sl_iter_elem_t example_elem = {example_apply, example_local_new, example_local_free, false};

/* The spec's defaults in the decoder's types; float32 defaults are given
 * as doubles. Returns 0 or -ENOMEM; *mem is freed by the caller. */
static int convert_default(const sl_spec_feature_t *sf, sl_example_feature_t *ef, void **mem)
{
    *mem = NULL;
    if (sf->default_count == 0)
        return 0;
    if (sf->dtype == SL_DTYPE_FLOAT32) {
        float *v = malloc(sf->default_count * sizeof *v);
        if (!v)
            return -ENOMEM;
        for (size_t i = 0; i < sf->default_count; i++)
            v[i] = (float)((const double *)sf->default_values)[i];
        *mem = v;
        ef->default_values = v;
    } else if (sf->dtype == SL_DTYPE_BYTES) {
        sl_example_bytes_t *v = malloc(sf->default_count * sizeof *v);
        if (!v)
            return -ENOMEM;
        for (size_t i = 0; i < sf->default_count; i++) {
            const sl_spec_bytes_t *b = &((const sl_spec_bytes_t *)sf->default_values)[i];
            v[i] = (sl_example_bytes_t){b->data, b->len};
        }
        *mem = v;
        ef->default_values = v;
    } else {
        ef->default_values = sf->default_values;
    }
    ef->default_count = sf->default_count;
    return 0;
}

int sl__op_parse_example_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                                sl_iter_t **out)
{
    const sl_element_spec_t *in = &input->spec;
    const char *key = op->u.parse_example.key;
    int nf = op->u.parse_example.num_features;
    char names[1024], err[512];
    int k = sl__spec_find(in, key);
    if (k < 0) {
        sl__spec_names(in, names, sizeof names);
        return sl__ctx_fail(ctx, SL_EINVAL, label, "component \"%s\" is not in its input (%s)", key, names);
    }
    if (in->c[k].dtype != SL_DTYPE_BYTES)
        return sl__ctx_fail(ctx, SL_EINVAL, label,
                            "component \"%s\" is %s; parse_example takes serialized tf.train.Example records (bytes)",
                            key, sl_dtype_name(in->c[k].dtype));
    if (in->num_components - 1 + (uint32_t)nf > SL_MAX_COMPONENTS)
        return sl__ctx_fail(ctx, SL_EINVAL, label, "%u components and %d features make more than %d components",
                            in->num_components - 1, nf, SL_MAX_COMPONENTS);
    for (int f = 0; f < nf; f++) {
        int same = sl__spec_find(in, op->u.parse_example.features[f].name);
        if (same >= 0 && same != k)
            return sl__ctx_fail(ctx, SL_EINVAL, label, "feature \"%s\" has the name of a component of its input",
                                op->u.parse_example.features[f].name);
    }

    struct example_iter *x = calloc(1, sizeof *x);
    sl_example_feature_t feats[SL_MAX_COMPONENTS];
    void *mem[SL_MAX_COMPONENTS] = {NULL};
    int rc = -ENOMEM;
    if (!x || !(x->in = sl_element_new(SL_MAX_COMPONENTS)))
        goto fail;
    sl__iter_init(&x->base, &example_vtbl, input, ctx, label);
    x->base.elem = &example_elem;
    x->key = (uint32_t)k;
    x->num_features = nf;
    x->base.spec.num_components = 0;
    for (uint32_t c = 0; c < in->num_components; c++) {
        if ((int)c == k)
            continue;
        x->kept[x->num_kept++] = c;
        x->base.spec.c[x->base.spec.num_components++] = in->c[c];
    }
    memset(feats, 0, sizeof feats);
    for (int f = 0; f < nf; f++) {
        const sl_spec_feature_t *sf = &op->u.parse_example.features[f];
        sl_example_feature_t *ef = &feats[f];
        ef->name = sf->name;
        ef->dtype = sf->dtype;
        ef->varlen = sf->varlen;
        ef->rank = sf->rank;
        memcpy(ef->shape, sf->shape, sizeof ef->shape);
        if (convert_default(sf, ef, &mem[f]) < 0)
            goto fail;
        x->rank[f] = sf->rank;
        memcpy(x->shape[f], sf->shape, sizeof x->shape[f]);
        uint32_t c = x->base.spec.num_components++;
        snprintf(x->base.spec.c[c].name, sizeof x->base.spec.c[c].name, "%s", sf->name);
        x->base.spec.c[c].dtype = sf->dtype;
        x->base.spec.c[c].varlen = sf->varlen;
    }
    rc = sl_example_decoder_new(feats, nf, ctx->opts.max_batch_bytes, &x->dec, err, sizeof err);
    if (rc < 0) {
        if (rc != -ENOMEM)
            rc = sl__ctx_fail(ctx, rc, label, "%s", err);
        goto fail;
    }
    /* Pool threads make decoders of their own from the same list. */
    memcpy(x->feats, feats, sizeof feats);
    memcpy(x->mem, mem, sizeof mem);
    *out = &x->base;
    return 0;
fail:
    for (int f = 0; f < nf; f++)
        free(mem[f]);
    if (x) {
        sl_element_free(x->in);
        free(x);
    }
    return rc;
}
