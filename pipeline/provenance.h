/*
 * provenance.h: changing an element's provenance runs (provenance.c):
 * appending with merging, making room, dropping, copying. Reading them
 * (sl_prov_count(), sl_prov_runs()) and setting a source's one run
 * (sl_prov_set()) are element.h's.
 */
#ifndef SL_PROVENANCE_H
#define SL_PROVENANCE_H

#include <stdbool.h>
#include <stdint.h>

#include "element.h"

/**
 * Appends n runs to dst's provenance, merging a run into the one before it
 * when they are contiguous (same epoch and file, and it begins where that
 * one ends), so that an unshuffled batch has one run (provenance.c).
 * @return 0, -ENOMEM (some runs may be appended: the element is then dropped)
 */
int sl_prov_append(sl_element_t *dst, const sl_provenance_run_t *runs, uint64_t n);

/** @return whether run r goes on where last ends (same epoch and file, its
 *  begin last's end): sl_prov_append() merges it into last then */
static inline bool sl_prov_follows(const sl_provenance_run_t *last, const sl_provenance_run_t *r)
{
    return last->epoch == r->epoch && last->file_index == r->file_index && last->begin + last->count == r->begin;
}

/** sl_prov_append() of one run, inline where dst's runs are on the heap
 *  with room for one more (a batch's, once sl_prov_reserve() made room for
 *  all): the batch op calls it once an element. */
static inline int sl_prov_append_one(sl_element_t *dst, const sl_provenance_run_t *r)
{
    uint32_t count = sl_prov_count(dst);
    if (!(dst->prov_n & SL_PROV_HEAP) || count == 0 || count >= dst->prov.heap.cap)
        return sl_prov_append(dst, r, 1);
    sl_provenance_run_t *last = &dst->prov.heap.runs[count - 1];
    if (sl_prov_follows(last, r)) {
        last->count += r->count;
        return 0;
    }
    last[1] = *r;
    dst->prov_n++; /* the count, below SL_PROV_HEAP (count < cap) */
    return 0;
}

/** Makes room for n runs on the heap once e has more than one, so that a
 *  batch that will not merge its runs allocates them once. @return 0, -ENOMEM */
int sl_prov_reserve(sl_element_t *e, uint64_t n);

/** Drops e's provenance (its values stay). */
void sl_prov_clear(sl_element_t *e);

/** Drops dst's provenance and gives it a copy of src's. @return 0, -ENOMEM */
int sl_prov_copy(sl_element_t *dst, const sl_element_t *src);

#endif
