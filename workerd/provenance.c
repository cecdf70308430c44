/*
 * provenance.c: an element's provenance runs (element.h): appending with
 * merging, copying, and moving them into a wire batch.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "element.h"
#include "iter.h"

/* Room for at least want runs at e->prov_heap, the inline run moved there
 * first. The array grows by doubling; it never holds more runs than the
 * element has records, since every run counts at least one. */
static int prov_reserve(sl_element_t *e, uint64_t want)
{
    if (e->prov_heap && want <= e->prov_cap)
        return 0;
    uint64_t cap = e->prov_cap ? e->prov_cap : 8;
    while (cap < want)
        cap *= 2;
    if (cap > UINT32_MAX)
        return -ENOMEM;
    sl_provenance_run_t *p = realloc(e->prov_heap, cap * sizeof *p);
    if (!p)
        return -ENOMEM;
    if (!e->prov_heap && e->prov_n == 1)
        p[0] = e->prov;
    e->prov_heap = p;
    e->prov_cap = (uint32_t)cap;
    return 0;
}

int sl_prov_append(sl_element_t *dst, const sl_provenance_run_t *runs, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        const sl_provenance_run_t *r = &runs[i];
        if (dst->prov_n > 0) {
            sl_provenance_run_t *last = (dst->prov_heap ? dst->prov_heap : &dst->prov) + dst->prov_n - 1;
            if (last->epoch == r->epoch && last->file_index == r->file_index && last->begin + last->count == r->begin) {
                last->count += r->count;
                continue;
            }
        }
        if (dst->prov_n == 0 && !dst->prov_heap) {
            dst->prov = *r;
            dst->prov_n = 1;
            continue;
        }
        if (prov_reserve(dst, dst->prov_n + 1) < 0)
            return -ENOMEM;
        dst->prov_heap[dst->prov_n++] = *r;
    }
    return 0;
}

void sl_prov_clear(sl_element_t *e)
{
    free(e->prov_heap);
    e->prov_heap = NULL;
    e->prov_cap = 0;
    e->prov_n = 0;
}

int sl_prov_copy(sl_element_t *dst, const sl_element_t *src)
{
    dst->prov_n = 0;
    return sl_prov_append(dst, sl_prov_runs(src), src->prov_n);
}

/* ---- drops and split reads, for the iterators (iter.h) ---- */

void sl__ctx_dropped(sl_iter_ctx_t *ctx, const sl_provenance_run_t *runs, uint64_t n)
{
    if (n > 0 && ctx->opts.splits.dropped)
        ctx->opts.splits.dropped(ctx->opts.splits.arg, runs, n);
}

void sl__iter_drop(sl_iter_t *it, sl_element_t *e)
{
    sl__ctx_dropped(it->ctx, sl_prov_runs(e), e->prov_n);
    sl_element_clear(e);
}

void sl__split_read(sl_iter_ctx_t *ctx, uint64_t epoch, const sl_split_t *s, uint64_t records)
{
    if (ctx->opts.splits.split_read)
        ctx->opts.splits.split_read(ctx->opts.splits.arg, epoch, s, records);
}

int sl__split_check_skips(sl_iter_t *it, uint64_t epoch, const sl_split_t *s)
{
    uint64_t at = s->begin;
    for (uint32_t i = 0; i < s->num_skips; i++) {
        const sl_skip_run_t *k = &s->skips[i];
        if (k->count == 0 || k->begin < at || k->begin > s->end || k->count > s->end - k->begin)
            return sl__iter_fail(it, SL_EPROTO,
                                 "skip run %" PRIu32 " [%" PRIu64 ", +%" PRIu64 ") of split %" PRIu64
                                 " [%" PRIu64 ", %" PRIu64 ") of file %" PRIu32 " of epoch %" PRIu64
                                 " is empty, out of order, overlapping or outside the split",
                                 i, k->begin, k->count, s->split_id, s->begin, s->end, s->file_index, epoch);
        at = k->begin + k->count;
    }
    return 0;
}
