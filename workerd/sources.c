/*
 * sources.c: the iterators that start a pipeline.
 *
 * range: one int64 scalar per element (the file sources are in
 * sources_files.c). Under OFF it yields the whole range
 * every epoch; under DYNAMIC it yields, for its current epoch, the splits
 * next_split hands out (element indices [begin, end) of the range) until
 * the dispatcher says the epoch is over. Each reset moves it to the next
 * epoch, so epoch e is the e-th time the pipeline reads the source.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "iter.h"

struct range_iter {
    sl_iter_t base;
    int64_t start, step;
    uint64_t count;    /* elements of the range */
    uint64_t pos, end; /* next index to yield, end of the current split */
    uint64_t epoch;
    bool dynamic;
    bool epoch_over; /* DYNAMIC: the dispatcher has no split left for epoch */
};

/* DYNAMIC: asks for splits until one is not empty. 0: [pos, end) is the
 * new split; 1: the epoch is over. */
static int range_next_split(struct range_iter *r)
{
    sl_iter_ctx_t *ctx = r->base.ctx;
    /* An empty source has no split to ask for; not asking also tells
     * repeat that another epoch would be just as empty. */
    if (r->epoch_over || r->count == 0) {
        r->epoch_over = true;
        return 1;
    }
    for (;;) {
        sl_split_t split = {0, 0, 0};
        ctx->split_requests++;
        int rc = ctx->opts.splits.next_split(ctx->opts.splits.arg, r->epoch, &split);
        uint64_t begin = split.begin, end = split.end;
        if (rc == 1) {
            r->epoch_over = true;
            return 1;
        }
        if (rc < 0)
            return sl__iter_fail(&r->base, rc, "next_split for epoch %" PRIu64 " failed: %s", r->epoch,
                                 sl_strerror(rc));
        if (rc != 0)
            return sl__iter_fail(&r->base, SL_EINTERNAL, "next_split returned %d", rc);
        if (split.file_index != 0)
            return sl__iter_fail(&r->base, SL_EPROTO, "split of epoch %" PRIu64 " names file %" PRIu32
                                 "; a range has no files", r->epoch, split.file_index);
        if (begin > end || end > r->count)
            return sl__iter_fail(&r->base, SL_EPROTO,
                                 "split [%" PRIu64 ", %" PRIu64 ") of epoch %" PRIu64
                                 " is not inside the source's %" PRIu64 " elements",
                                 begin, end, r->epoch, r->count);
        if (begin < end) {
            r->pos = begin;
            r->end = end;
            return 0;
        }
    }
}

static int range_next(sl_iter_t *it, sl_element_t *out)
{
    struct range_iter *r = (struct range_iter *)it;
    if (r->pos == r->end) {
        if (!r->dynamic)
            return 1;
        int rc = range_next_split(r);
        if (rc != 0)
            return rc;
    }
    /* Every value lies between start and stop, so the sum is exact; it is
     * done in unsigned arithmetic only because the intermediate product
     * may wrap. */
    int64_t x = (int64_t)((uint64_t)r->start + r->pos * (uint64_t)r->step);
    r->pos++;
    uint8_t *data = sl_value_alloc(&out->v[0], SL_DTYPE_INT64, 0, NULL, sizeof x);
    memcpy(data, &x, sizeof x); /* inline: never fails */
    out->num_elements = 1;
    return 0;
}

/* The bulk path (iter.h): one int64 per row, written in a tight loop. Like
 * range_next it asks for a split only when the current one is used up, so
 * a batch spanning splits sees the same split requests either way. */
static int range_next_bulk(sl_iter_t *it, uint8_t *const *dst, uint64_t max_rows, uint64_t *rows)
{
    struct range_iter *r = (struct range_iter *)it;
    *rows = 0;
    if (r->pos == r->end) {
        if (!r->dynamic)
            return 1;
        int rc = range_next_split(r);
        if (rc != 0)
            return rc;
    }
    uint64_t n = r->end - r->pos < max_rows ? r->end - r->pos : max_rows;
    uint64_t step = (uint64_t)r->step;
    uint64_t x = (uint64_t)r->start + r->pos * step; /* wraps as in range_next */
    uint8_t *d = dst[0];
    for (uint64_t i = 0; i < n; i++, x += step)
        memcpy(d + i * sizeof x, &x, sizeof x);
    r->pos += n;
    *rows = n;
    return 0;
}

static int range_reset(sl_iter_t *it)
{
    struct range_iter *r = (struct range_iter *)it;
    r->epoch++;
    r->epoch_over = false;
    r->pos = 0;
    r->end = r->dynamic ? 0 : r->count;
    return 0;
}

static void range_destroy(sl_iter_t *it)
{
    free(it);
}

static const sl_iter_vtbl_t range_vtbl = {range_next, range_reset, range_destroy};

int sl__source_range_create(const sl_spec_t *spec, sl_iter_ctx_t *ctx, const char *label, sl_iter_t **out)
{
    const sl_spec_source_t *src = sl_spec_source(spec);
    struct range_iter *r = calloc(1, sizeof *r);
    if (!r)
        return -ENOMEM;
    sl__iter_init(&r->base, &range_vtbl, NULL, ctx, label);
    r->base.next_bulk = range_next_bulk;
    r->base.spec.num_components = 1;
    memcpy(r->base.spec.c[0].name, src->name, SL_MAX_NAME);
    r->base.spec.c[0].dtype = SL_DTYPE_INT64;
    r->start = src->u.range.start;
    r->step = src->u.range.step;
    r->count = (uint64_t)sl_spec_source_cardinality(spec); /* exact for a range */
    r->dynamic = ctx->opts.sharding == SL_SHARDING_DYNAMIC;
    r->end = r->dynamic ? 0 : r->count;
    *out = &r->base;
    return 0;
}
