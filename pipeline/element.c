/*
 * element.c: element values, their storage and their conversion to a wire
 * batch (element.h).
 */
#include "element.h"

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "big_alloc.h"
#include "zero.h"

/* Values are kept in wire layout, which is little-endian; sources write
 * native integers into it. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "Sluice's wire layout assumes a little-endian host");

#define ALIGN8(x) (((x) + 7) & ~(size_t)7)

void sl_element_init(sl_element_t *e, uint32_t n)
{
    e->num_elements = 0;
    e->block = NULL;
    e->block_size = 0;
    e->num_components = n;
    e->prov_n = 0;
    for (uint32_t i = 0; i < n; i++) {
        e->v[i].storage = SL_VALUE_INLINE;
        e->v[i].ragged = 0;
    }
}

sl_element_t *sl_element_new(uint32_t n)
{
    sl_element_t *e = malloc(sl_element_size(n));
    if (e)
        sl_element_init(e, n);
    return e;
}

void sl__element_release(sl_element_t *e)
{
    for (uint32_t i = 0; i < e->num_components; i++) {
        if (e->v[i].storage == SL_VALUE_HEAP)
            free(e->v[i].u.ptr);
        e->v[i].storage = SL_VALUE_INLINE;
        e->v[i].ragged = 0;
    }
    sl__big_free(e->block); /* a batch's: perhaps sl_pipeline_opts_t.block_alloc's */
    e->block = NULL;
    if (e->prov_n & SL_PROV_HEAP)
        free(e->prov.heap.runs);
    e->prov_n = 0;
}

void sl_element_free(sl_element_t *e)
{
    if (!e)
        return;
    sl_element_clear(e);
    free(e);
}

void sl_element_move(sl_element_t *dst, sl_element_t *src)
{
    /* BLOCK and HEAP pointers point at separate allocations, so a bitwise
     * copy moves them; INLINE bytes travel with the value. */
    memcpy(dst, src, sl_element_size(src->num_components));
    sl_element_init(src, src->num_components);
}

uint8_t *sl__value_alloc_heap(sl_value_t *v, size_t size)
{
    v->u.ptr = malloc(size);
    if (!v->u.ptr) {
        v->storage = SL_VALUE_INLINE;
        return NULL;
    }
    v->storage = SL_VALUE_HEAP;
    return v->u.ptr;
}

int sl_value_set_bytes(sl_value_t *v, const void *data, size_t len)
{
    uint64_t offsets[2] = {0, len};
    uint8_t *p = sl_value_alloc(v, SL_DTYPE_BYTES, 0, NULL, sizeof offsets + len);
    if (!p)
        return -ENOMEM;
    memcpy(p, offsets, sizeof offsets);
    if (len > 0)
        memcpy(p + sizeof offsets, data, len);
    return 0;
}

/* The row on offer to the ops running on this thread (element.h). */
static _Thread_local struct {
    uint8_t *p;
    size_t size;
    bool taken;
} dest;

void sl__value_dest_offer(uint8_t *p, size_t size)
{
    dest.p = p;
    dest.size = size;
    dest.taken = false;
}

uint8_t *sl__value_buf(size_t size)
{
    if (dest.p && !dest.taken && size == dest.size) {
        dest.taken = true;
        return dest.p;
    }
    return malloc(size);
}

bool sl__value_buf_is_row(const uint8_t *p)
{
    return p && p == dest.p && dest.taken;
}

void sl__value_buf_free(uint8_t *p)
{
    if (p && p == dest.p)
        dest.taken = false;
    else
        free(p);
}

int sl__value_own(sl_value_t *v)
{
    if (v->storage != SL_VALUE_ROW)
        return 0;
    uint8_t *p = malloc(v->size ? v->size : 1);
    if (!p)
        return -ENOMEM;
    memcpy(p, v->u.ptr, v->size);
    v->u.ptr = p;
    v->storage = SL_VALUE_HEAP;
    return 0;
}

void sl_value_adopt(sl_value_t *v, sl_dtype_t dtype, int rank, const int64_t *shape, uint8_t *buf, size_t size)
{
    v->dtype = dtype;
    v->rank = (uint8_t)rank;
    v->ragged = 0;
    for (int d = 0; d < rank; d++)
        v->shape[d] = shape[d];
    v->size = size;
    v->storage = sl__value_buf_is_row(buf) ? SL_VALUE_ROW : SL_VALUE_HEAP;
    v->u.ptr = buf;
}

int sl_value_copy(sl_value_t *dst, const sl_value_t *src)
{
    uint8_t *p = sl_value_alloc(dst, src->dtype, src->rank, src->shape, src->size);
    if (!p)
        return -ENOMEM;
    memcpy(p, src->storage == SL_VALUE_INLINE ? src->u.inl : src->u.ptr, src->size);
    return 0;
}

void sl_value_clear(sl_value_t *v)
{
    if (v->storage == SL_VALUE_HEAP)
        free(v->u.ptr);
    v->storage = SL_VALUE_INLINE;
    v->ragged = 0;
}

uint64_t sl_value_count(const sl_value_t *v)
{
    uint64_t n = 1;
    int first = 0;
    if (v->ragged) {
        n = (uint64_t)v->u.splits[v->shape[0]];
        first = 2;
    }
    for (int d = first; d < v->rank; d++)
        n *= (uint64_t)v->shape[d];
    return n;
}

size_t sl_value_dense_size(sl_dtype_t dtype, int rank, const int64_t *shape)
{
    size_t n = sl_dtype_size(dtype);
    if (n == 0)
        return SIZE_MAX;
    for (int d = 0; d < rank; d++) {
        if (shape[d] < 0 || __builtin_mul_overflow(n, (uint64_t)shape[d], &n))
            return SIZE_MAX;
    }
    return n;
}

static size_t splits_size(const sl_value_t *v)
{
    return v->ragged ? ((size_t)v->shape[0] + 1) * sizeof(int64_t) : 0;
}

static void describe_component(sl_component_t *c, const sl_element_spec_t *spec, uint32_t i, const sl_value_t *v,
                               uint64_t offset, uint64_t splits_offset)
{
    memset(c, 0, sizeof *c);
    memcpy(c->name, spec->c[i].name, sizeof c->name);
    c->dtype = v->dtype;
    c->rank = v->rank;
    memcpy(c->shape, v->shape, (size_t)v->rank * sizeof v->shape[0]);
    c->offset = offset;
    c->length = v->size;
    if (v->ragged) {
        c->ragged = true;
        c->splits_offset = splits_offset;
        c->splits_length = splits_size(v);
    }
}

int sl_element_to_wire(sl_element_t *e, const sl_element_spec_t *spec, sl_wire_batch_t **out)
{
    /* Zeroed but for the component slots, which describe_component()
     * writes whole up to num_components. */
    sl_wire_batch_t *b = sl_wire_batch_alloc();
    uint8_t *data = NULL;
    if (!b)
        return -ENOMEM;
    sl_zero_except(b, sizeof *b, offsetof(sl_wire_batch_t, components), sizeof b->components);
    b->num_elements = e->num_elements;
    b->num_components = (int)e->num_components;

    bool all_in_block = e->block != NULL;
    for (uint32_t i = 0; i < e->num_components; i++)
        all_in_block = all_in_block && e->v[i].storage == SL_VALUE_BLOCK;

    if (all_in_block) {
        /* The block is already in wire layout: hand it over. */
        for (uint32_t i = 0; i < e->num_components; i++) {
            const sl_value_t *v = &e->v[i];
            describe_component(&b->components[i], spec, i, v, (uint64_t)(v->u.ptr - e->block),
                               v->ragged ? (uint64_t)((uint8_t *)v->u.splits - e->block) : 0);
        }
        b->data = e->block;
        b->size = e->block_size;
        e->block = NULL;
        e->block_size = 0;
    } else {
        /* A ragged value's row splits go right before its values. */
        size_t size = 0;
        for (uint32_t i = 0; i < e->num_components; i++)
            size = ALIGN8(ALIGN8(size) + splits_size(&e->v[i])) + e->v[i].size;
        /* calloc: the alignment gaps go on the wire and must not leak memory. */
        data = calloc(1, size ? size : 1);
        if (!data) {
            sl_wire_batch_free(b);
            return -ENOMEM;
        }
        size_t off = 0;
        for (uint32_t i = 0; i < e->num_components; i++) {
            sl_value_t *v = &e->v[i];
            size_t splits_off = ALIGN8(off);
            off = ALIGN8(splits_off + splits_size(v));
            describe_component(&b->components[i], spec, i, v, off, splits_off);
            if (v->ragged)
                memcpy(data + splits_off, v->u.splits, splits_size(v));
            memcpy(data + off, sl_value_data(v), v->size);
            off += v->size;
        }
        b->data = data;
        b->size = size;
    }
    /* The provenance goes with the batch; a merged element's runs are
     * handed over, not copied. */
    b->prov_n = sl_prov_count(e);
    if (e->prov_n & SL_PROV_HEAP)
        b->prov_heap = e->prov.heap.runs;
    else
        b->prov_one = e->prov.one;
    e->prov_n = 0;
    sl_element_clear(e);
    *out = b;
    return 0;
}
