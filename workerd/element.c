/*
 * element.c: element values, their storage and their conversion to a wire
 * batch (element.h).
 */
#include "element.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

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
    for (uint32_t i = 0; i < n; i++)
        e->v[i].storage = SL_VALUE_INLINE;
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
    }
    free(e->block);
    e->block = NULL;
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

static void describe_component(sl_component_t *c, const sl_element_spec_t *spec, uint32_t i, const sl_value_t *v,
                               uint64_t offset)
{
    memset(c, 0, sizeof *c);
    memcpy(c->name, spec->c[i].name, sizeof c->name);
    c->dtype = v->dtype;
    c->rank = v->rank;
    memcpy(c->shape, v->shape, (size_t)v->rank * sizeof v->shape[0]);
    c->offset = offset;
    c->length = v->size;
}

int sl_element_to_wire(sl_element_t *e, const sl_element_spec_t *spec, sl_wire_batch_t **out)
{
    sl_wire_batch_t *b = calloc(1, sizeof *b);
    uint8_t *data = NULL;
    if (!b)
        return -ENOMEM;
    b->num_elements = e->num_elements;
    b->num_components = (int)e->num_components;

    bool all_in_block = e->block != NULL;
    for (uint32_t i = 0; i < e->num_components; i++)
        all_in_block = all_in_block && e->v[i].storage == SL_VALUE_BLOCK;

    if (all_in_block) {
        /* The block is already in wire layout: hand it over. */
        for (uint32_t i = 0; i < e->num_components; i++)
            describe_component(&b->components[i], spec, i, &e->v[i], (uint64_t)(e->v[i].u.ptr - e->block));
        b->data = e->block;
        b->size = e->block_size;
        e->block = NULL;
        e->block_size = 0;
    } else {
        size_t size = 0;
        for (uint32_t i = 0; i < e->num_components; i++)
            size = ALIGN8(size) + e->v[i].size;
        /* calloc: the alignment gaps go on the wire and must not leak memory. */
        data = calloc(1, size ? size : 1);
        if (!data) {
            free(b);
            return -ENOMEM;
        }
        size_t off = 0;
        for (uint32_t i = 0; i < e->num_components; i++) {
            off = ALIGN8(off);
            describe_component(&b->components[i], spec, i, &e->v[i], off);
            memcpy(data + off, sl_value_data(&e->v[i]), e->v[i].size);
            off += e->v[i].size;
        }
        b->data = data;
        b->size = size;
    }
    sl_element_clear(e);
    *out = b;
    return 0;
}
