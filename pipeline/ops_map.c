/*
 * ops_map.c: map through a plugin function, and filter by a built-in
 * comparison or a plugin predicate (docs/dataset-spec.md, docs/plugins.md).
 *
 * map's output spec is declared in the dataset spec ("output": name to
 * dtype), so the pipeline knows it when it is built: the output element is
 * the input's components not named in "output" (unless keep_input is
 * false), in input order, then the declared ones in name order. The plugin
 * writes the declared components through an sluice_output_t whose memory
 * the worker allocates, each bounded by the pipeline's max_batch_bytes.
 *
 * Both ops are element-wise (sl_iter_elem_t): their apply runs one element
 * and is what parallel.c runs on pool threads.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "iter.h"
#include "plugin.h"

#define PLUGIN_ERR SLUICE_PLUGIN_ERR_BYTES

/* ---- the input element as the plugin sees it ---- */

/* Fills comps[] with views of el's values (spec: the input's). */
static int element_view(sl_iter_t *it, const sl_element_spec_t *spec, sl_element_t *el, sluice_component_t *comps,
                        sluice_element_t *view)
{
    for (uint32_t c = 0; c < el->num_components; c++) {
        sl_value_t *v = &el->v[c];
        sluice_component_t *x = &comps[c];
        if (v->ragged)
            return sl__iter_fail(it, SL_EDATA, "component \"%s\" is a ragged batch; plugins take dense values",
                                 spec->c[c].name);
        uint64_t count = 1;
        for (int d = 0; d < v->rank; d++)
            count *= (uint64_t)v->shape[d];
        x->name = spec->c[c].name;
        x->dtype = (int32_t)v->dtype;
        x->rank = v->rank;
        x->shape = v->shape;
        x->count = count;
        if (v->dtype == SL_DTYPE_BYTES) {
            const uint8_t *data = sl_value_data(v);
            x->offsets = (const uint64_t *)data;
            x->data = data + 8 * (count + 1);
            x->size = v->size - 8 * (count + 1);
        } else {
            x->offsets = NULL;
            x->data = sl_value_data(v);
            x->size = v->size;
        }
    }
    view->num_components = el->num_components;
    view->components = comps;
    return 0;
}

/* ---- map ---- */

struct map_iter {
    sl_iter_t base;
    const sluice_plugin_function_t *fn;
    char plugin[SL_SPEC_PLUGIN_NAME];
    char function[SL_SPEC_FUNCTION_NAME];
    uint32_t num_kept;                /* input components passed on */
    uint32_t kept[SL_MAX_COMPONENTS]; /* their indices in the input */
    int num_outputs;                  /* declared, after the kept ones in the spec */
    sl_element_t *in;                 /* next()'s slot, room for SL_MAX_COMPONENTS */
    uint64_t ordinal;
};

/* What the worker's side of sluice_output_t keeps during one call. */
struct builder {
    sluice_output_t out;
    struct map_iter *m;
    sl_value_t vals[SL_MAX_COMPONENTS]; /* the declared outputs, in spec order */
    bool set[SL_MAX_COMPONENTS];
    size_t total;    /* bytes set so far */
    char why[256];   /* the first refusal */
};

static int builder_slot(struct builder *b, const char *name, int32_t dtype, int32_t rank, const int64_t *shape)
{
    struct map_iter *m = b->m;
    const sl_element_spec_t *spec = &m->base.spec;
    int idx = -1;
    for (int i = 0; i < m->num_outputs; i++) {
        if (name && strcmp(spec->c[m->num_kept + (uint32_t)i].name, name) == 0)
            idx = i;
    }
    if (b->why[0])
        return -1;
    if (idx < 0) {
        snprintf(b->why, sizeof b->why, "output \"%s\" is not declared in the op's \"output\"", name ? name : "(null)");
        return -1;
    }
    sl_dtype_t want = spec->c[m->num_kept + (uint32_t)idx].dtype;
    if (dtype != (int32_t)want) {
        const char *got = sl_dtype_name((sl_dtype_t)dtype);
        snprintf(b->why, sizeof b->why, "output \"%s\" is declared %s, the plugin set it as %s", name,
                 sl_dtype_name(want), got ? got : "an unknown dtype");
        return -1;
    }
    if (b->set[idx]) {
        snprintf(b->why, sizeof b->why, "output \"%s\" set twice", name);
        return -1;
    }
    if (rank < 0 || rank > SL_MAX_RANK || (rank > 0 && !shape)) {
        snprintf(b->why, sizeof b->why, "output \"%s\": rank %d is not 0 .. %d", name, rank, SL_MAX_RANK);
        return -1;
    }
    for (int d = 0; d < rank; d++) {
        if (shape[d] < 0) {
            snprintf(b->why, sizeof b->why, "output \"%s\": dimension %d is %" PRId64, name, d, shape[d]);
            return -1;
        }
    }
    return idx;
}

static int builder_room(struct builder *b, const char *name, size_t bytes)
{
    size_t limit = b->m->base.ctx->opts.max_batch_bytes;
    if (bytes == SIZE_MAX || bytes > limit || b->total + bytes > limit) {
        snprintf(b->why, sizeof b->why, "output \"%s\" would make the element larger than max_batch_bytes %zu", name,
                 limit);
        return -1;
    }
    b->total += bytes;
    return 0;
}

static void *builder_tensor(sluice_output_t *out, const char *name, int32_t dtype, int32_t rank, const int64_t *shape)
{
    struct builder *b = out->host;
    int idx = builder_slot(b, name, dtype, rank, shape);
    if (idx < 0)
        return NULL;
    if (dtype == SL_DTYPE_BYTES) {
        snprintf(b->why, sizeof b->why, "output \"%s\" is bytes: set it with bytes(), not tensor()", name);
        return NULL;
    }
    size_t bytes = sl_value_dense_size((sl_dtype_t)dtype, rank, shape);
    if (builder_room(b, name, bytes) < 0)
        return NULL;
    uint8_t *p = sl_value_alloc(&b->vals[idx], (sl_dtype_t)dtype, rank, shape, bytes);
    if (!p) {
        snprintf(b->why, sizeof b->why, "out of memory for %zu bytes of output \"%s\"", bytes, name);
        return NULL;
    }
    b->set[idx] = true;
    return p;
}

static int builder_bytes(sluice_output_t *out, const char *name, int32_t rank, const int64_t *shape,
                         const void *const *strings, const size_t *lengths)
{
    struct builder *b = out->host;
    int idx = builder_slot(b, name, SL_DTYPE_BYTES, rank, shape);
    if (idx < 0)
        return -1;
    uint64_t n = 1;
    for (int d = 0; d < rank; d++) {
        if (shape[d] > 0 && n > (UINT64_MAX >> 1) / (uint64_t)shape[d])
            n = UINT64_MAX >> 1;
        else
            n *= (uint64_t)shape[d];
    }
    size_t limit = b->m->base.ctx->opts.max_batch_bytes, bytes = 0;
    if (n > limit / 8) {
        builder_room(b, name, SIZE_MAX);
        return -1;
    }
    bytes = 8 * ((size_t)n + 1);
    for (uint64_t i = 0; i < n; i++) {
        if (lengths[i] > limit || bytes + lengths[i] > limit) {
            builder_room(b, name, SIZE_MAX);
            return -1;
        }
        bytes += lengths[i];
    }
    if (builder_room(b, name, bytes) < 0)
        return -1;
    uint8_t *p = sl_value_alloc(&b->vals[idx], SL_DTYPE_BYTES, rank, shape, bytes);
    if (!p) {
        snprintf(b->why, sizeof b->why, "out of memory for %zu bytes of output \"%s\"", bytes, name);
        return -1;
    }
    uint64_t off = 0;
    uint8_t *data = p + 8 * (n + 1);
    for (uint64_t i = 0; i < n; i++) {
        memcpy(p + 8 * i, &off, 8);
        if (lengths[i])
            memcpy(data + off, strings[i], lengths[i]);
        off += lengths[i];
    }
    memcpy(p + 8 * n, &off, 8);
    b->set[idx] = true;
    return 0;
}

static int map_apply(sl_iter_t *it, void *local, uint64_t ordinal, sl_element_t *el)
{
    (void)local;
    (void)ordinal;
    struct map_iter *m = (struct map_iter *)it;
    sluice_component_t comps[SL_MAX_COMPONENTS];
    sluice_element_t view;
    char err[PLUGIN_ERR] = "";
    struct builder b;
    memset(&b.set, 0, sizeof b.set);
    b.out = (sluice_output_t){builder_tensor, builder_bytes, &b};
    b.m = m;
    b.total = 0;
    b.why[0] = '\0';
    for (int i = 0; i < m->num_outputs; i++) {
        b.vals[i].storage = SL_VALUE_INLINE;
        b.vals[i].ragged = 0;
    }
    int rc = element_view(it, &it->input->spec, el, comps, &view);
    if (rc < 0)
        goto fail;
    int prc = m->fn->map(&view, &b.out, err, sizeof err);
    err[sizeof err - 1] = '\0';
    if (prc != 0) {
        rc = sl__iter_fail(it, SL_EDATA, "plugin \"%s\" function \"%s\" failed (%d): %s%s%s", m->plugin, m->function,
                           prc, err[0] ? err : "(no message)", b.why[0] ? "; " : "", b.why);
        goto fail;
    }
    if (b.why[0]) {
        rc = sl__iter_fail(it, SL_EDATA, "plugin \"%s\" function \"%s\": %s", m->plugin, m->function, b.why);
        goto fail;
    }
    for (int i = 0; i < m->num_outputs; i++) {
        if (!b.set[i]) {
            rc = sl__iter_fail(it, SL_EDATA, "plugin \"%s\" function \"%s\" did not set output \"%s\"", m->plugin,
                               m->function, it->spec.c[m->num_kept + (uint32_t)i].name);
            goto fail;
        }
    }
    /* The kept values move to the front (a BLOCK value stays in the
     * element's block), the others are freed, then the outputs follow. */
    sl_value_t kept[SL_MAX_COMPONENTS];
    bool keep[SL_MAX_COMPONENTS] = {false};
    for (uint32_t j = 0; j < m->num_kept; j++) {
        kept[j] = el->v[m->kept[j]];
        keep[m->kept[j]] = true;
    }
    for (uint32_t c = 0; c < el->num_components; c++) {
        if (!keep[c])
            sl_value_clear(&el->v[c]);
    }
    for (uint32_t j = 0; j < m->num_kept; j++)
        el->v[j] = kept[j];
    for (int i = 0; i < m->num_outputs; i++)
        el->v[m->num_kept + (uint32_t)i] = b.vals[i];
    el->num_components = it->spec.num_components;
    if (el->num_elements == 0)
        el->num_elements = 1;
    return 0;
fail:
    for (int i = 0; i < m->num_outputs; i++)
        sl_value_clear(&b.vals[i]);
    sl_element_clear(el);
    return rc;
}

static int map_next(sl_iter_t *it, sl_element_t *out)
{
    struct map_iter *m = (struct map_iter *)it;
    sl_element_init(m->in, it->input->spec.num_components);
    int rc = it->input->vt->next(it->input, m->in);
    if (rc != 0)
        return rc;
    rc = map_apply(it, NULL, m->ordinal++, m->in);
    if (rc != 0)
        return rc;
    sl_element_move(out, m->in);
    return 0;
}

static int map_reset(sl_iter_t *it)
{
    struct map_iter *m = (struct map_iter *)it;
    m->ordinal = 0;
    return it->input->vt->reset(it->input);
}

static void map_destroy(sl_iter_t *it)
{
    struct map_iter *m = (struct map_iter *)it;
    sl_element_free(m->in);
    free(m);
}

static const sl_iter_vtbl_t map_vtbl = {map_next, map_reset, map_destroy};
static const sl_iter_elem_t map_elem = {.apply = map_apply};

int sl__op_map_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                      sl_iter_t **out)
{
    char err[1024];
    const sluice_plugin_function_t *fn = NULL;
    int rc = sl_plugins_find(ctx->opts.plugins, op->u.map.plugin, op->u.map.function, SLUICE_PLUGIN_MAP, &fn, err,
                             sizeof err);
    if (rc < 0)
        return sl__ctx_fail(ctx, rc, label, "%s", err);
    struct map_iter *m = calloc(1, sizeof *m);
    if (!m || !(m->in = sl_element_new(SL_MAX_COMPONENTS))) {
        free(m);
        return -ENOMEM;
    }
    sl__iter_init(&m->base, &map_vtbl, input, ctx, label);
    m->base.elem = &map_elem;
    m->fn = fn;
    snprintf(m->plugin, sizeof m->plugin, "%s", op->u.map.plugin);
    snprintf(m->function, sizeof m->function, "%s", op->u.map.function);
    sl_element_spec_t *spec = &m->base.spec;
    spec->num_components = 0;
    for (uint32_t c = 0; op->u.map.keep_input && c < input->spec.num_components; c++) {
        bool replaced = false;
        for (int i = 0; i < op->u.map.num_outputs; i++)
            replaced |= strcmp(op->u.map.outputs[i].name, input->spec.c[c].name) == 0;
        if (replaced)
            continue;
        m->kept[m->num_kept++] = c;
        spec->c[spec->num_components++] = input->spec.c[c];
    }
    if (m->num_kept + (uint32_t)op->u.map.num_outputs > SL_MAX_COMPONENTS) {
        map_destroy(&m->base);
        return sl__ctx_fail(ctx, SL_EINVAL, label, "%u kept components and %d outputs make more than %d components",
                            input->spec.num_components, op->u.map.num_outputs, SL_MAX_COMPONENTS);
    }
    m->num_outputs = op->u.map.num_outputs;
    for (int i = 0; i < op->u.map.num_outputs; i++) {
        uint32_t c = spec->num_components++;
        snprintf(spec->c[c].name, sizeof spec->c[c].name, "%s", op->u.map.outputs[i].name);
        spec->c[c].dtype = op->u.map.outputs[i].dtype;
        /* Each element may give it another shape: batch makes it ragged. */
        spec->c[c].varlen = false;
    }
    *out = &m->base;
    return 0;
}

/* ---- filter ---- */

struct filter_iter {
    sl_iter_t base;
    const sluice_plugin_function_t *fn; /* a plugin predicate, or NULL */
    char plugin[SL_SPEC_PLUGIN_NAME];
    char function[SL_SPEC_FUNCTION_NAME];
    uint32_t key; /* comparison: the component */
    sl_filter_cmp_t cmp;
    int num_values;
    long double *values;
};

/* long double holds every int64, uint64 and double exactly (x86-64, aarch64). */
static long double scalar_of(const sl_value_t *v)
{
    double d;
    sl__cast_values(v->dtype, sl_value_data((sl_value_t *)v), 1, SL_DTYPE_FLOAT64, &d);
    const uint8_t *p = sl_value_data((sl_value_t *)v);
    switch (v->dtype) {
    case SL_DTYPE_INT64: {
        int64_t x;
        memcpy(&x, p, 8);
        return (long double)x;
    }
    case SL_DTYPE_UINT64: {
        uint64_t x;
        memcpy(&x, p, 8);
        return (long double)x;
    }
    default: return d;
    }
}

static bool compare(sl_filter_cmp_t cmp, long double x, const long double *vals, int n)
{
    switch (cmp) {
    case SL_FILTER_EQ: return x == vals[0];
    case SL_FILTER_NE: return x != vals[0];
    case SL_FILTER_LT: return x < vals[0];
    case SL_FILTER_LE: return x <= vals[0];
    case SL_FILTER_GT: return x > vals[0];
    case SL_FILTER_GE: return x >= vals[0];
    case SL_FILTER_IN:
        for (int i = 0; i < n; i++) {
            if (x == vals[i])
                return true;
        }
        return false;
    }
    return false;
}

static int filter_apply(sl_iter_t *it, void *local, uint64_t ordinal, sl_element_t *el)
{
    (void)local;
    (void)ordinal;
    struct filter_iter *f = (struct filter_iter *)it;
    int rc;
    bool keep;
    if (f->fn) {
        sluice_component_t comps[SL_MAX_COMPONENTS];
        sluice_element_t view;
        char err[PLUGIN_ERR] = "";
        int k = 1;
        rc = element_view(it, &it->spec, el, comps, &view);
        if (rc < 0)
            goto fail;
        int prc = f->fn->filter(&view, &k, err, sizeof err);
        err[sizeof err - 1] = '\0';
        if (prc != 0) {
            rc = sl__iter_fail(it, SL_EDATA, "plugin \"%s\" function \"%s\" failed (%d): %s", f->plugin, f->function,
                               prc, err[0] ? err : "(no message)");
            goto fail;
        }
        keep = k != 0;
    } else {
        const sl_value_t *v = &el->v[f->key];
        if (v->rank != 0 || v->ragged || v->dtype == SL_DTYPE_BYTES) {
            char got[128];
            sl__shape_str(v->shape, v->rank, got, sizeof got);
            rc = sl__iter_fail(it, SL_EDATA,
                               "component \"%s\" has shape %s; filter compares one number per element (put it "
                               "before batch)",
                               it->spec.c[f->key].name, got);
            goto fail;
        }
        keep = compare(f->cmp, scalar_of(v), f->values, f->num_values);
    }
    if (keep)
        return 0;
    sl__iter_drop(it, el);
    return 1;
fail:
    sl_element_clear(el);
    return rc;
}

static int filter_next(sl_iter_t *it, sl_element_t *out)
{
    for (;;) {
        int rc = it->input->vt->next(it->input, out);
        if (rc != 0)
            return rc;
        rc = filter_apply(it, NULL, 0, out);
        if (rc != 1)
            return rc;
    }
}

static int filter_reset(sl_iter_t *it)
{
    return it->input->vt->reset(it->input);
}

static void filter_destroy(sl_iter_t *it)
{
    struct filter_iter *f = (struct filter_iter *)it;
    free(f->values);
    free(f);
}

static const sl_iter_vtbl_t filter_vtbl = {filter_next, filter_reset, filter_destroy};
static const sl_iter_elem_t filter_elem = {.apply = filter_apply, .drops = true};

int sl__op_filter_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                         sl_iter_t **out)
{
    char err[1024], names[1024];
    const sluice_plugin_function_t *fn = NULL;
    int k = -1;
    if (op->u.filter.has_plugin) {
        int rc = sl_plugins_find(ctx->opts.plugins, op->u.filter.plugin, op->u.filter.function, SLUICE_PLUGIN_FILTER,
                                 &fn, err, sizeof err);
        if (rc < 0)
            return sl__ctx_fail(ctx, rc, label, "%s", err);
    } else {
        k = sl__spec_find(&input->spec, op->u.filter.key);
        if (k < 0) {
            sl__spec_names(&input->spec, names, sizeof names);
            return sl__ctx_fail(ctx, SL_EINVAL, label, "component \"%s\" is not in its input (%s)", op->u.filter.key,
                                names);
        }
        sl_dtype_t dt = input->spec.c[k].dtype;
        if (dt == SL_DTYPE_BYTES || input->spec.c[k].varlen)
            return sl__ctx_fail(ctx, SL_EINVAL, label, "component \"%s\" is %s%s; filter compares scalar numbers",
                                op->u.filter.key, input->spec.c[k].varlen ? "varlen " : "", sl_dtype_name(dt));
    }
    struct filter_iter *f = calloc(1, sizeof *f);
    if (!f)
        return -ENOMEM;
    sl__iter_init(&f->base, &filter_vtbl, input, ctx, label);
    f->base.elem = &filter_elem;
    f->fn = fn;
    if (fn) {
        snprintf(f->plugin, sizeof f->plugin, "%s", op->u.filter.plugin);
        snprintf(f->function, sizeof f->function, "%s", op->u.filter.function);
    } else {
        f->key = (uint32_t)k;
        f->cmp = op->u.filter.cmp;
        f->num_values = op->u.filter.num_values;
        f->values = calloc((size_t)f->num_values, sizeof *f->values);
        if (!f->values) {
            free(f);
            return -ENOMEM;
        }
        for (int i = 0; i < f->num_values; i++) {
            const sl_spec_filter_value_t *v = &op->u.filter.values[i];
            f->values[i] = v->is_int ? (long double)v->i : (long double)v->d;
        }
    }
    *out = &f->base;
    return 0;
}
