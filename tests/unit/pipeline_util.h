/*
 * pipeline_util.h: helpers the pipeline tests share (test_sources.c,
 * test_ops_example.c, test_ops_image.c): build a pipeline from a spec, run
 * it to its end collecting every batch (each checked with
 * sl_wire_batch_validate()), and read components of the batches. Static
 * inline, so a test file that does not use one gets no warning.
 */
#ifndef SL_TEST_PIPELINE_UTIL_H
#define SL_TEST_PIPELINE_UTIL_H

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch.h"
#include "confine.h"
#include "pipeline.h"
#include "spec.h"

#define FIXTURES SL_TEST_DATA "/tfrecord"

typedef struct batches {
    sl_wire_batch_t **b;
    size_t n;
    int rc;              /* 1 at the end, or the error */
    char errmsg[1024];   /* the pipeline's message on an error */
    uint64_t skipped;    /* sl_pipeline_records_skipped() at the end */
} batches_t;

/* A spec's text made with printf, in a static buffer. */
static inline const char *specf(const char *fmt, ...)
{
    static char buf[16384];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    cr_assert_lt((size_t)n, sizeof buf);
    return buf;
}

/* Roots that hold the fixtures; freed with sl_confine_destroy(). */
static inline sl_confine_t *roots_at(const char *dir)
{
    sl_confine_t *c = NULL;
    char err[512];
    const char *roots[] = {dir};
    cr_assert_eq(sl_confine_create(roots, 1, &c, err, sizeof err), 0, "%s", err);
    return c;
}

/* Builds a pipeline; rc and err say why not. */
static inline int pipeline_try(const char *json, const sl_pipeline_opts_t *o, sl_pipeline_t **p, char *err,
                               size_t errlen)
{
    sl_spec_t *spec = NULL;
    char serr[512] = "";
    int rc = sl_spec_parse(json, strlen(json), &spec, serr, sizeof serr);
    cr_assert_eq(rc, 0, "%s: %s", json, serr);
    *p = NULL;
    rc = sl_pipeline_create(spec, o, p, err, errlen);
    sl_spec_free(spec);
    return rc;
}

static inline sl_pipeline_t *pipeline_make(const char *json, const sl_pipeline_opts_t *o)
{
    sl_pipeline_t *p;
    char err[1024] = "";
    int rc = pipeline_try(json, o, &p, err, sizeof err);
    cr_assert_eq(rc, 0, "pipeline of %s: %d %s", json, rc, err);
    return p;
}

/* Runs p to its end or first error, at most limit batches. */
static inline batches_t run_pipeline_n(sl_pipeline_t *p, size_t limit)
{
    batches_t bs = {0};
    for (size_t i = 0; i < limit; i++) {
        sl_wire_batch_t *b = NULL;
        bs.rc = sl_pipeline_next(p, &b);
        if (bs.rc != 0) {
            cr_assert_null(b);
            snprintf(bs.errmsg, sizeof bs.errmsg, "%s", sl_pipeline_errmsg(p));
            break;
        }
        char err[256];
        cr_assert_eq(sl_wire_batch_validate(b, err, sizeof err), 0, "batch %zu is invalid: %s", bs.n, err);
        bs.b = realloc(bs.b, (bs.n + 1) * sizeof *bs.b);
        cr_assert_not_null(bs.b);
        bs.b[bs.n++] = b;
    }
    bs.skipped = sl_pipeline_records_skipped(p);
    return bs;
}

static inline batches_t run_pipeline(sl_pipeline_t *p)
{
    return run_pipeline_n(p, SIZE_MAX);
}

/* Builds, runs and frees a pipeline. */
static inline batches_t run_spec(const char *json, const sl_pipeline_opts_t *o)
{
    sl_pipeline_t *p = pipeline_make(json, o);
    batches_t bs = run_pipeline(p);
    sl_pipeline_destroy(p);
    return bs;
}

static inline void batches_free(batches_t *bs)
{
    for (size_t i = 0; i < bs->n; i++)
        sl_wire_batch_free(bs->b[i]);
    free(bs->b);
    memset(bs, 0, sizeof *bs);
}

static inline const sl_component_t *comp_of(const sl_wire_batch_t *b, const char *name)
{
    for (int i = 0; i < b->num_components; i++) {
        if (strcmp(b->components[i].name, name) == 0)
            return &b->components[i];
    }
    cr_assert_fail("the batch has no component \"%s\"", name);
    return NULL;
}

static inline int64_t i64_at(const sl_wire_batch_t *b, const sl_component_t *c, uint64_t i)
{
    cr_assert_eq(c->dtype, SL_DTYPE_INT64, "component %s is not int64", c->name);
    cr_assert_leq((i + 1) * 8, c->length);
    int64_t v;
    memcpy(&v, b->data + c->offset + 8 * i, 8);
    return v;
}

static inline float f32_at(const sl_wire_batch_t *b, const sl_component_t *c, uint64_t i)
{
    cr_assert_eq(c->dtype, SL_DTYPE_FLOAT32, "component %s is not float32", c->name);
    cr_assert_leq((i + 1) * 4, c->length);
    float v;
    memcpy(&v, b->data + c->offset + 4 * i, 4);
    return v;
}

/* The number of values of a component (a ragged one's from its splits). */
static inline uint64_t count_of(const sl_wire_batch_t *b, const sl_component_t *c)
{
    uint64_t n = 1;
    int first = 0;
    if (c->ragged) {
        int64_t last;
        memcpy(&last, b->data + c->splits_offset + 8 * (uint64_t)c->shape[0], 8);
        n = (uint64_t)last;
        first = 2;
    }
    for (int d = first; d < c->rank; d++)
        n *= (uint64_t)c->shape[d];
    return n;
}

static inline int64_t split_at(const sl_wire_batch_t *b, const sl_component_t *c, uint64_t r)
{
    cr_assert(c->ragged, "component %s is not ragged", c->name);
    int64_t v;
    memcpy(&v, b->data + c->splits_offset + 8 * r, 8);
    return v;
}

/* String i of a bytes component. */
static inline const uint8_t *str_at(const sl_wire_batch_t *b, const sl_component_t *c, uint64_t i, size_t *len)
{
    cr_assert_eq(c->dtype, SL_DTYPE_BYTES, "component %s is not bytes", c->name);
    uint64_t n = count_of(b, c);
    cr_assert_lt(i, n);
    const uint8_t *p = b->data + c->offset;
    uint64_t lo, hi;
    memcpy(&lo, p + 8 * i, 8);
    memcpy(&hi, p + 8 * (i + 1), 8);
    *len = (size_t)(hi - lo);
    return p + 8 * (n + 1) + lo;
}

/* Every int64 value of component name across the batches, in order. */
static inline int64_t *all_i64(const batches_t *bs, const char *name, size_t *n)
{
    int64_t *v = NULL;
    *n = 0;
    for (size_t k = 0; k < bs->n; k++) {
        const sl_component_t *c = comp_of(bs->b[k], name);
        uint64_t m = count_of(bs->b[k], c);
        v = realloc(v, (*n + m + 1) * sizeof *v);
        for (uint64_t i = 0; i < m; i++)
            v[(*n)++] = i64_at(bs->b[k], c, i);
    }
    return v;
}

static inline json_t *manifest_load(void)
{
    json_error_t jerr;
    json_t *m = json_load_file(FIXTURES "/MANIFEST.json", 0, &jerr);
    cr_assert_not_null(m, "MANIFEST.json: %s", jerr.text);
    return m;
}

static inline json_t *manifest_file(json_t *m, const char *file)
{
    json_t *f = json_object_get(json_object_get(m, "files"), file);
    cr_assert_not_null(f, "MANIFEST.json lists no %s", file);
    return f;
}

/* A split source for DYNAMIC: hands out splits[0 .. n) in epoch 0, then
 * says the epoch is over; later epochs have none. */
typedef struct split_list {
    const sl_split_t *splits;
    size_t n, next;
    int calls;
} split_list_t;

static inline int split_list_next(void *arg, uint64_t epoch, sl_split_t *out)
{
    split_list_t *l = arg;
    l->calls++;
    if (epoch != 0 || l->next == l->n)
        return 1;
    *out = l->splits[l->next++];
    return 0;
}

static inline sl_pipeline_opts_t dynamic_opts(split_list_t *l, const sl_confine_t *roots, sl_io_engine_t engine)
{
    return (sl_pipeline_opts_t){.sharding = SL_SHARDING_DYNAMIC,
                                .splits = {split_list_next, l},
                                .roots = roots,
                                .io_engine = engine};
}

#endif
