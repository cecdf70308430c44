/*
 * element.h: the values that flow through a worker's pipeline.
 *
 * An element is a fixed number of component values; what the components
 * are called and which dtype each has is fixed per pipeline stage and kept
 * once in an sl_element_spec_t, not in every element (as tf.data's
 * element_spec). A value is a dtype, a shape and its bytes in wire layout
 * (batch.h), so a value can be copied into a batch buffer as is.
 *
 * Where a value's bytes live:
 *   - INLINE: up to SL_VALUE_INLINE_BYTES inside the value itself, so
 *     scalars and short vectors cost no allocation;
 *   - HEAP: a malloc'd buffer owned by the value;
 *   - BLOCK: inside its element's block, one malloc'd buffer in wire
 *     layout that holds several values (what batch makes). Such an element
 *     becomes a wire batch without copying a byte.
 *
 * Elements are moved, not shared: sl_element_move() hands over every buffer.
 * An element ends with a flexible array of values, so a slot for one is
 * sl_element_size(n) bytes; arrays of slots (a shuffle buffer) are one
 * allocation.
 */
#ifndef SL_ELEMENT_H
#define SL_ELEMENT_H

#include <stddef.h>
#include <stdint.h>

#include "batch.h"
#include "sluice.h"

#define SL_VALUE_INLINE_BYTES 16

enum sl_value_storage { SL_VALUE_INLINE = 0, SL_VALUE_HEAP = 1, SL_VALUE_BLOCK = 2 };

typedef struct sl_value {
    sl_dtype_t dtype;
    uint8_t rank;
    uint8_t storage; /* enum sl_value_storage */
    size_t size;     /* bytes in wire layout */
    int64_t shape[SL_MAX_RANK];
    union {
        uint8_t *ptr; /* HEAP (owned) or BLOCK (into the element's block) */
        uint8_t inl[SL_VALUE_INLINE_BYTES];
    } u;
} sl_value_t;

typedef struct sl_element {
    uint64_t num_elements; /* 1, or the leading dimension when made by batch */
    uint8_t *block;        /* owned, may be NULL: holds the BLOCK values */
    size_t block_size;     /* bytes of block in use, in wire layout */
    uint32_t num_components;
    sl_value_t v[];
} sl_element_t;

/** Names and dtypes of the components a pipeline stage yields. */
typedef struct sl_element_spec {
    uint32_t num_components;
    struct {
        char name[SL_MAX_NAME];
        sl_dtype_t dtype;
    } c[SL_MAX_COMPONENTS];
} sl_element_spec_t;

/** @return the bytes of an element slot with n components */
static inline size_t sl_element_size(uint32_t n)
{
    return sizeof(sl_element_t) + (size_t)n * sizeof(sl_value_t);
}

/** @return the value's bytes, valid while the value is neither moved nor cleared */
static inline uint8_t *sl_value_data(sl_value_t *v)
{
    return v->storage == SL_VALUE_INLINE ? v->u.inl : v->u.ptr;
}

/** Makes the slot at e an empty element of n components (no memory to free). */
void sl_element_init(sl_element_t *e, uint32_t n);

/** @return a new empty element of n components, freed by sl_element_free(); NULL without memory */
sl_element_t *sl_element_new(uint32_t n);

/** Frees what the element holds and the element; NULL is ignored. */
void sl_element_free(sl_element_t *e);

/* Frees the HEAP values and the block of e and marks every value INLINE;
 * sl_element_clear()'s slow path. */
void sl__element_release(sl_element_t *e);

/** Frees what the element holds and leaves it empty, ready to be filled again. */
static inline void sl_element_clear(sl_element_t *e)
{
    /* Clearing runs once per element in every stage, and most elements are
     * scalars that own nothing: for them it is a look at the storage tags,
     * with no call and no free(NULL). */
    int owns = e->block != NULL;
    for (uint32_t i = 0; i < e->num_components; i++)
        owns |= e->v[i].storage != SL_VALUE_INLINE;
    if (owns)
        sl__element_release(e);
    e->block_size = 0;
    e->num_elements = 0;
}

/** Moves src into dst, which must be empty; src is left empty. Same num_components. */
void sl_element_move(sl_element_t *dst, sl_element_t *src);

/* Gives v, whose other fields are set, a malloc'd buffer of size bytes;
 * sl_value_alloc()'s slow path. */
uint8_t *sl__value_alloc_heap(sl_value_t *v, size_t size);

/**
 * Sets v, an empty value (INLINE, owning nothing), to a value of dtype and
 * shape with room for size bytes, inline when they fit, else malloc'd and
 * owned by the value.
 * @return where to write the size bytes, valid as sl_value_data(); NULL
 *         without memory (never for an inline size)
 */
static inline uint8_t *sl_value_alloc(sl_value_t *v, sl_dtype_t dtype, int rank, const int64_t *shape, size_t size)
{
    v->dtype = dtype;
    v->rank = (uint8_t)rank;
    /* A loop, not memcpy: ranks are small, and a scalar copies nothing. */
    for (int d = 0; d < rank; d++)
        v->shape[d] = shape[d];
    v->size = size;
    if (size <= SL_VALUE_INLINE_BYTES) {
        v->storage = SL_VALUE_INLINE;
        return v->u.inl;
    }
    return sl__value_alloc_heap(v, size);
}

/**
 * @return the bytes of a dense value of dtype and shape, or SIZE_MAX when
 *         that overflows or dtype is bytes (whose size depends on its data)
 */
size_t sl_value_dense_size(sl_dtype_t dtype, int rank, const int64_t *shape);

/**
 * Turns an element into a wire batch. A batch-made element (every value in
 * its block) hands its block over as the batch data; any other element is
 * copied into a new buffer, each component aligned to 8 bytes.
 * @param[in] e the element, left empty on success
 * @param[in] spec names and dtypes of e's components
 * @param[out] out the batch, owned by the caller, freed by sl_wire_batch_free()
 * @return 0, -ENOMEM (e left as it was)
 */
int sl_element_to_wire(sl_element_t *e, const sl_element_spec_t *spec, sl_wire_batch_t **out);

#endif
