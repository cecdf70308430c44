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
 *   - ROW: in memory the value does not own: the row of a batch's block
 *     that the batch above a parallel stage offered for it (map-and-batch
 *     fusion: sl__value_dest_offer()). The batch owns the block and
 *     outlives the element.
 *
 * A bytes value of n strings is n + 1 uint64 offsets and the strings
 * (batch.h). A ragged value (what batch makes of a varlen component) is a
 * batch of rows of different lengths: shape [rows, -1, inner...], its values
 * at u.ptr and rows + 1 int64 row splits at u.splits, both in the block.
 *
 * Elements are moved, not shared: sl_element_move() hands over every buffer.
 * An element ends with a flexible array of values, so a slot for one is
 * sl_element_size(n) bytes; arrays of slots (a shuffle buffer) are one
 * allocation.
 */
#ifndef SL_ELEMENT_H
#define SL_ELEMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "batch.h"
#include "sluice.h"

#define SL_VALUE_INLINE_BYTES 16

/* sl_element_t.prov_n: the runs are on the heap. */
#define SL_PROV_HEAP 0x80000000u

enum sl_value_storage { SL_VALUE_INLINE = 0, SL_VALUE_HEAP = 1, SL_VALUE_BLOCK = 2, SL_VALUE_ROW = 3 };

typedef struct sl_value {
    sl_dtype_t dtype;
    uint8_t rank;
    uint8_t storage; /* enum sl_value_storage */
    uint8_t ragged;  /* 1: a ragged batch, BLOCK storage only */
    size_t size;     /* bytes of the values in wire layout, row splits not counted */
    int64_t shape[SL_MAX_RANK];
    union {
        struct {
            uint8_t *ptr;    /* HEAP (owned), BLOCK (into the element's block) or ROW */
            int64_t *splits; /* ragged: shape[0] + 1 row splits, in the block */
        };
        uint8_t inl[SL_VALUE_INLINE_BYTES];
    } u;
} sl_value_t;

typedef struct sl_element {
    uint64_t num_elements; /* 1, or the leading dimension when made by batch */
    uint8_t *block;        /* owned, may be NULL: holds the BLOCK values */
    size_t block_size;     /* bytes of block in use, in wire layout */
    uint32_t num_components;
    /* Provenance (docs/architecture.md, "Provenance and split-done
     * notices"): sl_prov_count() runs of the source records the element
     * came from, at sl_prov_runs(). One run (what a source yields) lives in
     * prov.one, costing no allocation; a merged element (batch) with more
     * keeps them in prov.heap (owned, room for cap), and prov_n has
     * SL_PROV_HEAP set. Kept small: elements are moved by value. */
    uint32_t prov_n;
    union {
        sl_provenance_run_t one;
        struct {
            sl_provenance_run_t *runs;
            uint64_t cap;
        } heap;
    } prov;
    sl_value_t v[];
} sl_element_t;

/** Names and dtypes of the components a pipeline stage yields. A varlen
 *  component's leading dimension differs from element to element
 *  (parse_example's varlen features): batch makes it a ragged value. */
typedef struct sl_element_spec {
    uint32_t num_components;
    struct {
        char name[SL_MAX_NAME];
        sl_dtype_t dtype;
        bool varlen;
    } c[SL_MAX_COMPONENTS];
} sl_element_spec_t;

/** @return the bytes of an element slot with n components */
static inline size_t sl_element_size(uint32_t n)
{
    return sizeof(sl_element_t) + (size_t)n * sizeof(sl_value_t);
}

/** @return the bytes e owns outside its slot (HEAP values, its block, its
 *  provenance on the heap): what holding it costs beyond sl_element_size() */
static inline size_t sl_element_bytes(const sl_element_t *e)
{
    size_t n = e->block ? e->block_size : 0;
    for (uint32_t i = 0; i < e->num_components; i++)
        if (e->v[i].storage == SL_VALUE_HEAP)
            n += e->v[i].size;
    if (e->prov_n & SL_PROV_HEAP)
        n += (size_t)e->prov.heap.cap * sizeof(sl_provenance_run_t);
    return n;
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
    int owns = (e->block != NULL) | (int)(e->prov_n >> 31); /* SL_PROV_HEAP */
    for (uint32_t i = 0; i < e->num_components; i++)
        owns |= e->v[i].storage != SL_VALUE_INLINE;
    if (owns)
        sl__element_release(e);
    e->block_size = 0;
    e->num_elements = 0;
    e->prov_n = 0;
}

/** @return how many provenance runs the element has */
static inline uint32_t sl_prov_count(const sl_element_t *e)
{
    return e->prov_n & ~SL_PROV_HEAP;
}

/** @return the element's sl_prov_count() provenance runs, valid while e is
 *  neither moved nor cleared */
static inline const sl_provenance_run_t *sl_prov_runs(const sl_element_t *e)
{
    return (e->prov_n & SL_PROV_HEAP) ? e->prov.heap.runs : &e->prov.one;
}

/** Gives e, an element a source just filled (no provenance yet), the one
 *  run of record pos of file file_index in epoch epoch. */
static inline void sl_prov_set(sl_element_t *e, uint64_t epoch, uint32_t file_index, uint64_t pos)
{
    e->prov_n = 1;
    e->prov.one.epoch = (uint32_t)epoch;
    e->prov.one.file_index = file_index;
    e->prov.one.begin = pos;
    e->prov.one.count = 1;
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
    v->ragged = 0;
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
 * Sets v, an empty value, to the scalar bytes value data (len bytes, copied).
 * @return 0, -ENOMEM
 */
int sl_value_set_bytes(sl_value_t *v, const void *data, size_t len);

/**
 * Sets v, an empty value, to a value of dtype and shape whose size bytes are
 * buf, a buffer from malloc() or sl__value_buf() it takes ownership of (the
 * row on offer: a ROW value, owned by the batch).
 */
void sl_value_adopt(sl_value_t *v, sl_dtype_t dtype, int rank, const int64_t *shape, uint8_t *buf, size_t size);

/*
 * Map-and-batch fusion. A parallel stage runs its ops on an element with
 * the row of the batch block the element goes to on offer
 * (sl__value_dest_offer(), on that thread, cleared after): the first
 * output made with sl__value_buf() of exactly that size is written there,
 * and sl_value_adopt() makes it a ROW value. Any other size, or a second
 * buffer, comes from malloc().
 */
void sl__value_dest_offer(uint8_t *p, size_t size);
/** @return a buffer of size bytes for a value: the row on offer, or malloc's (NULL without memory) */
uint8_t *sl__value_buf(size_t size);
/** Frees a buffer of sl__value_buf() that no value adopted (the row goes back on offer). */
void sl__value_buf_free(uint8_t *p);
/** Whether p, from sl__value_buf(), is the row on offer (written past the cache is best). */
bool sl__value_buf_is_row(const uint8_t *p);
/** Gives a ROW value a heap buffer of its own (a copy). @return 0, -ENOMEM */
int sl__value_own(sl_value_t *v);

/**
 * Sets dst, an empty value, to a copy of src, which is not ragged.
 * @return 0, -ENOMEM
 */
int sl_value_copy(sl_value_t *dst, const sl_value_t *src);

/** Frees what v owns (a HEAP buffer) and leaves it empty. A BLOCK value's
 *  bytes stay with its element's block, a ROW value's with its batch. */
void sl_value_clear(sl_value_t *v);

/** @return the number of values of v (the product of its shape; a ragged
 *  value's row splits say how many it holds) */
uint64_t sl_value_count(const sl_value_t *v);

/**
 * String i of a bytes value of n strings (wire layout, batch.h).
 * @param[out] len its length
 * @return its bytes, valid while the value is
 */
static inline const uint8_t *sl_bytes_at(const uint8_t *data, uint64_t n, uint64_t i, size_t *len)
{
    uint64_t a, b;
    memcpy(&a, data + 8 * i, 8);
    memcpy(&b, data + 8 * (i + 1), 8);
    *len = (size_t)(b - a);
    return data + 8 * (n + 1) + a;
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
