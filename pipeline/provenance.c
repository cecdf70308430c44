/*
 * provenance.c: an element's provenance runs (provenance.h): appending
 * with merging, copying, and moving them into a wire batch.
 */
#include "provenance.h"

#include <errno.h>
#include <stdbool.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "iter.h"

/* Room for at least want runs on the heap, the inline run moved there
 * first. The array grows by doubling; it never holds more runs than the
 * element has records, since every run counts at least one. */
static int prov_reserve(sl_element_t *e, uint64_t want)
{
    bool heap = e->prov_n & SL_PROV_HEAP;
    if (heap && want <= e->prov.heap.cap)
        return 0;
    uint64_t cap = heap ? e->prov.heap.cap : 8;
    while (cap < want)
        cap *= 2;
    if (cap > SL_PROV_HEAP - 1)
        return -ENOMEM;
    sl_provenance_run_t one = e->prov.one;
    sl_provenance_run_t *p = realloc(heap ? e->prov.heap.runs : NULL, cap * sizeof *p);
    if (!p)
        return -ENOMEM;
    if (!heap && e->prov_n == 1)
        p[0] = one;
    e->prov.heap.runs = p;
    e->prov.heap.cap = cap;
    e->prov_n |= SL_PROV_HEAP;
    return 0;
}

int sl_prov_reserve(sl_element_t *e, uint64_t n)
{
    return sl_prov_count(e) > 1 ? prov_reserve(e, n) : 0;
}

int sl_prov_append(sl_element_t *dst, const sl_provenance_run_t *runs, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        const sl_provenance_run_t *r = &runs[i];
        uint32_t count = sl_prov_count(dst);
        if (count > 0) {
            sl_provenance_run_t *last = (sl_provenance_run_t *)sl_prov_runs(dst) + count - 1;
            if (sl_prov_follows(last, r)) {
                last->count += r->count;
                continue;
            }
        }
        if (dst->prov_n == 0) {
            dst->prov.one = *r;
            dst->prov_n = 1;
            continue;
        }
        if (prov_reserve(dst, (uint64_t)count + 1) < 0)
            return -ENOMEM;
        dst->prov.heap.runs[count] = *r;
        dst->prov_n = (count + 1) | SL_PROV_HEAP;
    }
    return 0;
}

void sl_prov_clear(sl_element_t *e)
{
    if (e->prov_n & SL_PROV_HEAP)
        free(e->prov.heap.runs);
    e->prov_n = 0;
}

int sl_prov_copy(sl_element_t *dst, const sl_element_t *src)
{
    sl_prov_clear(dst);
    return sl_prov_append(dst, sl_prov_runs(src), sl_prov_count(src));
}

/* ---- drops and split reads, for the iterators (iter.h) ---- */

void sl__ctx_dropped(sl_iter_ctx_t *ctx, const sl_provenance_run_t *runs, uint64_t n)
{
    if (n > 0 && ctx->opts.splits.dropped)
        ctx->opts.splits.dropped(ctx->opts.splits.arg, runs, n);
}

void sl__iter_drop(sl_iter_t *it, sl_element_t *e)
{
    sl__ctx_dropped(it->ctx, sl_prov_runs(e), sl_prov_count(e));
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
