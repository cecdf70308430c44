/*
 * ops_batch.c: batch and padded_batch, which stack consecutive elements
 * into one, each component gaining a leading batch dimension.
 *
 * batch has two paths. The fast one serves components of fixed size
 * (numbers of any shape): the first element of a batch fixes every row's
 * size, the whole batch is laid out at once and each element is copied
 * straight into its row (see below). The gather path serves batches with
 * bytes or varlen components, whose sizes are only known once every
 * element is at hand: it holds the batch's elements, sizes the block, then
 * copies them in; bytes get their string offsets rebased, varlen components
 * become ragged values (values and row splits). padded_batch always
 * gathers: it pads every component to the longest (or given) shape in the
 * batch.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "big_alloc.h"
#include "copy.h"
#include "iter.h"
#include "provenance.h"

#define ALIGN8(x) (((x) + 7) & ~(size_t)7)

/* ---- batch, the fast path ----
 *
 * The first element of a batch fixes each component's size, so the whole
 * batch is laid out at once in one buffer in wire layout (component c's
 * rows at off[c], 8-byte aligned) and every element is copied straight into
 * its row. The finished element owns that buffer as its block, and the
 * pipeline sends it as the batch's data without another copy.
 *
 * When the input offers the bulk path (iter.h), only the first element of a
 * batch comes as an element; the input writes the other rows straight into
 * the block, so range -> batch runs at memory speed.
 *
 * Memory: the block is charged to the worker's memory budget (opts.mem)
 * before it is allocated, for as long as the op fills it (what holds the
 * finished batch then charges it: prefetch, the task's buffer); the gather
 * path's slots and what its gathered elements own are charged too. A
 * refused charge fails the pipeline (SL_ETOOBIG).
 */

/* What padded_batch pads one component to and with. */
struct pad_spec {
    bool has_dims;           /* padded_shapes names the component */
    sl_spec_ints_t dims;     /* -1: the longest in the batch */
    uint8_t value[8];        /* the padding value in the component's dtype */
};

struct batch_iter {
    sl_iter_t base;
    uint64_t batch_size;
    bool drop_remainder;
    bool input_done;
    bool gather;             /* the gather path: bytes or varlen components, or padded */
    bool padded;             /* padded_batch */
    sl_element_t *in;        /* the slot the input fills (fast path) */
    uint8_t *slots;          /* gather path: cap slots of stride bytes, the first n filled */
    size_t stride;
    uint64_t cap, n;
    struct pad_spec pad[SL_MAX_COMPONENTS];
    sl_memacct_t mem;        /* the block being filled, the slots, the gathered elements */
    size_t block_charge;     /* of mem: the block of the batch being made */
    size_t gathered;         /* of mem: what the gathered elements own */
    bool last;               /* the pipeline's last batch (only prefetch, take, skip, repeat and shard
                                after it): ctx->opts.block_alloc may place its block */
    bool in_order;           /* and only prefetch, take and repeat: its outputs are the pipeline's */
    uint64_t outs;           /* batches it gave, never reset: the next one's index among them */
    /* Map-and-batch fusion (fast path, below a parallel stage that asks:
     * base.dest_stage): batches made since the last reset (the one being
     * made is number `made`); the layout of the last batch, which the next
     * is taken to have (lay_known: a stage asks, and a component has rows
     * worth it: lay_c, the largest); the block of the batch being made
     * (cur), and blocks made ahead for the next ones, with what each is
     * charged. */
    uint64_t made;
    bool lay_known;
    uint64_t lay_gen; /* changes with the layout */
    uint32_t lay_c;
    size_t lay_total, lay_off[SL_MAX_COMPONENTS], lay_row[SL_MAX_COMPONENTS];
    uint8_t *cur;
    size_t cur_off[SL_MAX_COMPONENTS], cur_row[SL_MAX_COMPONENTS];
    struct ahead {
        uint8_t *p;
        uint64_t batch, gen; /* its batch, and the layout it was made for */
        size_t charge;
    } ahead[2];
};

/* Rows smaller than this are copied: not worth a row on offer. */
#define FUSE_MIN_ROW 4096

/* Charges the block of a batch of total bytes, until batch_next returns. */
static int charge_block(struct batch_iter *b, size_t total)
{
    int rc = sl__iter_charge(&b->base, &b->mem, total, "a batch of %" PRIu64 " elements", b->batch_size);
    if (rc == 0)
        b->block_charge = total;
    return rc;
}

/* Lays out a batch whose first element is e: where each component's rows
 * start, and the bytes of the whole batch. */
static int batch_layout(struct batch_iter *b, const sl_element_t *e, size_t *off, size_t *total)
{
    const sl_element_spec_t *spec = &b->base.spec;
    size_t limit = b->base.ctx->opts.max_batch_bytes;
    size_t size = 0;
    for (uint32_t c = 0; c < e->num_components; c++) {
        const sl_value_t *v = &e->v[c];
        size_t rows;
        if (v->ragged)
            return sl__iter_fail(&b->base, SL_EDATA,
                                 "component \"%s\" is already a ragged batch; it cannot be batched again",
                                 spec->c[c].name);
        /* The spec sent bytes to the gather path: a bytes value here means
         * a stage broke its spec. */
        if (v->dtype == SL_DTYPE_BYTES)
            return sl__iter_fail(&b->base, SL_EINTERNAL, "component \"%s\" holds bytes, but its spec says %s",
                                 spec->c[c].name, sl_dtype_name(spec->c[c].dtype));
        if (v->rank + 1 > SL_MAX_RANK)
            return sl__iter_fail(&b->base, SL_EDATA, "component \"%s\" has rank %d; batched it would exceed rank %d",
                                 spec->c[c].name, v->rank, SL_MAX_RANK);
        off[c] = ALIGN8(size);
        if (__builtin_mul_overflow(v->size, (size_t)b->batch_size, &rows) ||
            __builtin_add_overflow(off[c], rows, &size) || size > limit) {
            size_t elem = 0;
            for (uint32_t k = 0; k < e->num_components; k++)
                elem += e->v[k].size;
            return sl__iter_fail(&b->base, SL_ETOOBIG,
                                 "batch of %" PRIu64 " elements of %zu bytes each exceeds max_batch_bytes %zu",
                                 b->batch_size, elem, limit);
        }
    }
    *total = size;
    return 0;
}

/* Whether v, an element's value, has the shape of the batch's rows o
 * describes (o->shape[0] is the leading dimension). Inline and without
 * memcmp: it runs for every element, and for a scalar it is two compares. */
static inline bool batch_row_matches(const sl_value_t *v, const sl_value_t *o, size_t row_size)
{
    if (v->rank + 1 != o->rank || v->size != row_size)
        return false;
    for (int d = 0; d < v->rank; d++) {
        if (v->shape[d] != o->shape[d + 1])
            return false;
    }
    return true;
}

/* Copies one row; scalars take a fixed-size copy, which compiles to a
 * single load and store instead of a call to memcpy, and large rows (an
 * image) go past the cache: the block is read next by another thread. */
static inline void batch_copy_row(uint8_t *dst, const uint8_t *src, size_t size)
{
    switch (size) {
    case 8: memcpy(dst, src, 8); break;
    case 4: memcpy(dst, src, 4); break;
    case 2: memcpy(dst, src, 2); break;
    case 1: *dst = *src; break;
    default: sl_copy_far(dst, src, size); break;
    }
}

static int batch_row_mismatch(struct batch_iter *b, uint32_t c, const sl_value_t *v, const sl_value_t *o,
                              size_t row_size, uint64_t row)
{
    const char *name = b->base.spec.c[c].name;
    /* Equal shapes with unequal sizes mean a stage broke its spec. */
    if (v->rank + 1 == o->rank && v->size != row_size &&
        memcmp(v->shape, o->shape + 1, v->rank * sizeof v->shape[0]) == 0)
        return sl__iter_fail(&b->base, SL_EINTERNAL,
                             "component \"%s\" has %zu bytes in element %" PRIu64 " of the batch but %zu in element 0",
                             name, v->size, row, row_size);
    char want[128], got[128];
    sl__shape_str(o->shape + 1, o->rank - 1, want, sizeof want);
    sl__shape_str(v->shape, v->rank, got, sizeof got);
    return sl__iter_fail(&b->base, SL_EDATA,
                         "component \"%s\" has shape %s in element %" PRIu64
                         " of the batch but %s in element 0; batch needs equal shapes (padded_batch pads them)",
                         name, got, row, want);
}

/* A block of total bytes for a batch: where the pipeline's owner says for
 * the last batch's large ones, else sl__big_alloc()'s. */
static uint8_t *block_alloc(struct batch_iter *b, size_t total, uint64_t batch, size_t *charge)
{
    const sl_iter_ctx_t *ctx = b->base.ctx;
    uint8_t *p = NULL;
    /* Batch `batch` since the last reset, the one being made `made`: its
     * output is number outs + batch - made. */
    uint64_t index = b->in_order ? b->outs + (batch - b->made) : SL_PIPELINE_UNORDERED;
    if (b->last && total >= SL_PIPELINE_LEND_MIN && ctx->opts.block_alloc)
        p = ctx->opts.block_alloc(ctx->opts.block_arg, total, index);
    if (p) {
        /* The owner's memory, charged by its owner (a worker's region
         * charges its pages as blocks are placed): *charge goes back. */
        sl_memacct_release(&b->mem, *charge);
        *charge = 0;
        return p;
    }
    return sl__big_alloc(total);
}

/* Frees the blocks made ahead for batches up to `upto` (all: UINT64_MAX). */
static void ahead_drop(struct batch_iter *b, uint64_t upto)
{
    for (int i = 0; i < 2; i++) {
        struct ahead *a = &b->ahead[i];
        if (a->p && a->batch <= upto) {
            sl__big_free(a->p);
            sl_memacct_release(&b->mem, a->charge);
            *a = (struct ahead){0};
        }
    }
}

/* sl_iter_t.dest: the row of the n-th input element since the reset, in
 * the block of the batch being made or in one made ahead for its batch
 * (at most two ahead; none when that one holds another batch, or memory
 * says no). */
static bool batch_dest(sl_iter_t *it, uint64_t n, uint32_t *c, uint8_t **p, size_t *size)
{
    struct batch_iter *b = (struct batch_iter *)it;
    uint64_t k = n / b->batch_size, row = n % b->batch_size;
    if (!b->lay_known || k < b->made)
        return false;
    *c = b->lay_c;
    if (k == b->made && b->cur) {
        *p = b->cur + b->cur_off[*c] + row * b->cur_row[*c];
        *size = b->cur_row[*c];
        return true;
    }
    struct ahead *a = &b->ahead[k % 2];
    if (a->p && (a->batch != k || a->gen != b->lay_gen))
        return false;
    if (!a->p) {
        if (!sl_memacct_charge(&b->mem, b->lay_total))
            return false;
        size_t charge = b->lay_total;
        if (!(a->p = block_alloc(b, b->lay_total, k, &charge))) {
            sl_memacct_release(&b->mem, charge);
            return false;
        }
        a->batch = k;
        a->gen = b->lay_gen;
        a->charge = charge;
    }
    *p = a->p + b->lay_off[*c] + row * b->lay_row[*c];
    *size = b->lay_row[*c];
    return true;
}

/* Copies a row into place, unless the op before wrote it there. */
static inline void place_row(struct batch_iter *b, uint8_t *dst, sl_value_t *v, size_t size)
{
    const uint8_t *src = sl_value_data(v);
    if (src != dst)
        batch_copy_row(dst, src, size);
    else
        b->base.ctx->rows_in_place++;
}

/* Whether a batch laid out so has the layout the batch before had. */
static bool layout_is(const struct batch_iter *b, uint32_t n, const size_t *off, const size_t *row_size,
                      size_t total)
{
    return b->lay_known && total == b->lay_total && memcmp(off, b->lay_off, n * sizeof off[0]) == 0 &&
           memcmp(row_size, b->lay_row, n * sizeof row_size[0]) == 0;
}

/* A batch of this layout made: the next is taken to have it too. */
static void layout_learn(struct batch_iter *b, uint32_t n, const size_t *off, const size_t *row_size, size_t total)
{
    uint32_t best = 0;
    for (uint32_t c = 1; c < n; c++)
        if (row_size[c] > row_size[best])
            best = c;
    if (!layout_is(b, n, off, row_size, total))
        b->lay_gen++;
    b->lay_known = b->base.dest_stage && n > 0 && row_size[best] >= FUSE_MIN_ROW;
    b->lay_c = best;
    b->lay_total = total;
    memcpy(b->lay_off, off, n * sizeof off[0]);
    memcpy(b->lay_row, row_size, n * sizeof row_size[0]);
}

static int batch_next_fast(sl_iter_t *it, sl_element_t *out)
{
    struct batch_iter *b = (struct batch_iter *)it;
    sl_iter_t *input = it->input;
    sl_element_t *in = b->in;
    uint32_t n = it->spec.num_components;
    size_t off[SL_MAX_COMPONENTS], row_size[SL_MAX_COMPONENTS], total = 0;
    uint8_t *block = NULL;
    uint64_t rows = 0;
    int rc;

    if (b->input_done)
        return 1;
    rc = input->vt->next(input, in);
    if (rc == 1)
        b->input_done = true;
    if (rc != 0)
        return rc;

    rc = batch_layout(b, in, off, &total);
    if (rc < 0)
        goto fail;
    /* The first element fixes the batch's row sizes; every other element
     * must match. */
    for (uint32_t c = 0; c < n; c++)
        row_size[c] = in->v[c].size;
    struct ahead *a = &b->ahead[b->made % 2];
    if (a->p && a->batch == b->made && a->gen == b->lay_gen && layout_is(b, n, off, row_size, total)) {
        /* Made ahead, and rows of this batch may be in it already. */
        block = a->p;
        b->block_charge = a->charge;
        *a = (struct ahead){0};
    } else {
        if ((rc = charge_block(b, total)) < 0)
            goto fail;
        if (!(block = block_alloc(b, total, b->made, &b->block_charge))) {
            rc = sl__iter_fail(it, -ENOMEM, "out of memory for a batch of %zu bytes", total);
            goto fail;
        }
    }
    if (b->base.dest_stage) {
        /* The rest of this batch's elements get their rows here. */
        b->cur = block;
        memcpy(b->cur_off, off, n * sizeof off[0]);
        memcpy(b->cur_row, row_size, n * sizeof row_size[0]);
    }
    /* ... and its dtypes and shapes (behind the leading dimension). */
    for (uint32_t c = 0; c < n; c++) {
        sl_value_t *o = &out->v[c];
        o->dtype = in->v[c].dtype;
        o->rank = (uint8_t)(in->v[c].rank + 1);
        memcpy(o->shape + 1, in->v[c].shape, in->v[c].rank * sizeof in->v[c].shape[0]);
        place_row(b, block + off[c], &in->v[c], row_size[c]);
    }
    if (sl_prov_append(out, sl_prov_runs(in), sl_prov_count(in)) < 0)
        goto nomem_prov;
    sl_element_clear(in);
    rows = 1;

    if (input->next_bulk) {
        /* The input's elements are all alike (iter.h), so the first one's
         * layout holds for the rest: let it write them straight into the
         * rows, as many per call as it has at hand. */
        uint8_t *dst[SL_MAX_COMPONENTS];
        while (rows < b->batch_size) {
            uint64_t got = 0;
            for (uint32_t c = 0; c < n; c++)
                dst[c] = block + off[c] + rows * row_size[c];
            rc = input->next_bulk(input, dst, b->batch_size - rows, &got);
            if (rc == 1) {
                b->input_done = true;
                break;
            }
            if (rc < 0)
                goto fail;
            rows += got;
            /* The rows' provenance is one run (iter.h). */
            if (sl_prov_append(out, &it->ctx->bulk_prov, 1) < 0)
                goto nomem_prov;
        }
    } else {
        while (rows < b->batch_size) {
            rc = input->vt->next(input, in);
            if (rc == 1) {
                b->input_done = true;
                break;
            }
            if (rc < 0)
                goto fail;
            for (uint32_t c = 0; c < n; c++) {
                sl_value_t *v = &in->v[c];
                if (!batch_row_matches(v, &out->v[c], row_size[c])) {
                    rc = batch_row_mismatch(b, c, v, &out->v[c], row_size[c], rows);
                    goto fail;
                }
                place_row(b, block + off[c] + rows * row_size[c], v, row_size[c]);
            }
            int prc = sl_prov_count(in) == 1 ? sl_prov_append_one(out, sl_prov_runs(in))
                                              : sl_prov_append(out, sl_prov_runs(in), sl_prov_count(in));
            if (prc < 0)
                goto nomem_prov;
            /* Runs that do not merge (a shuffled input) come one per
             * element: room for all at once, not by doubling. */
            if (out->prov_n == (2 | SL_PROV_HEAP) && sl_prov_reserve(out, b->batch_size) < 0)
                goto nomem_prov;
            sl_element_clear(in);
            rows++;
        }
    }
    /* Whatever was made ahead for this batch (rows there were copied), or
     * before it, serves none. */
    b->cur = NULL;
    ahead_drop(b, b->made);
    if (b->base.dest_stage)
        layout_learn(b, n, off, row_size, total);
    b->made++;
    if (rows < b->batch_size && b->drop_remainder) {
        /* The short last batch is dropped, and its records with it (the
         * input ended: no element in flight has a row in the block). */
        sl__ctx_dropped(it->ctx, sl_prov_runs(out), sl_prov_count(out));
        sl_prov_clear(out);
        sl__big_free(block);
        return 1;
    }

    /* Pack the components down (a short last batch leaves room behind each)
     * and zero the alignment gaps: the whole block goes on the wire.
     * Components only move towards the start, so going in order is safe. */
    size_t pos = 0;
    for (uint32_t c = 0; c < n; c++) {
        sl_value_t *o = &out->v[c];
        size_t start = ALIGN8(pos), len = (size_t)rows * row_size[c];
        memset(block + pos, 0, start - pos);
        if (start != off[c])
            memmove(block + start, block + off[c], len);
        o->storage = SL_VALUE_BLOCK;
        o->u.ptr = block + start;
        o->shape[0] = (int64_t)rows;
        o->size = len;
        pos = start + len;
    }
    out->block = block;
    out->block_size = pos;
    out->num_elements = rows;
    b->outs++;
    return 0;
nomem_prov:
    rc = sl__iter_fail(it, -ENOMEM, "out of memory for the provenance of a batch");
fail:
    sl_prov_clear(out);
    if (b->base.dest_stage) {
        /* Elements in flight may be writing rows of the block: the stage
         * lets them go first, and offers no more rows. */
        sl__parallel_detach(b->base.dest_stage);
        b->base.dest_stage = NULL;
        b->cur = NULL;
        b->lay_known = false;
    }
    sl_element_clear(in);
    sl__big_free(block); /* perhaps block_alloc's */
    return rc;
}


/* ---- the gather path ---- */

static sl_element_t *slot(struct batch_iter *b, uint64_t i)
{
    return (sl_element_t *)(b->slots + i * b->stride);
}

/* Drops the gathered elements as records the pipeline dropped (the split
 * source hears of them), unlike gather_drop, which frees what is left of
 * elements already in a batch. */
static void gather_discard(struct batch_iter *b)
{
    for (uint64_t i = 0; i < b->n; i++)
        sl__iter_drop(&b->base, slot(b, i));
    b->n = 0;
    sl_memacct_release(&b->mem, b->gathered);
    b->gathered = 0;
}

static void gather_drop(struct batch_iter *b)
{
    for (uint64_t i = 0; i < b->n; i++)
        sl_element_clear(slot(b, i));
    b->n = 0;
    sl_memacct_release(&b->mem, b->gathered);
    b->gathered = 0;
}

/* Takes up to batch_size elements from the input into the slots, which grow
 * by doubling so a large batch_size costs only what arrives. What they hold
 * is counted against max_batch_bytes as they come. */
static int gather_fill(struct batch_iter *b)
{
    sl_iter_t *it = &b->base;
    size_t limit = it->ctx->opts.max_batch_bytes, held = 0;
    while (b->n < b->batch_size) {
        if (b->n == b->cap) {
            uint64_t cap = b->cap ? b->cap * 2 : 16;
            if (cap > b->batch_size)
                cap = b->batch_size;
            int rc = sl__iter_charge(it, &b->mem, (cap - b->cap) * b->stride, "%" PRIu64 " elements of a batch", cap);
            if (rc < 0)
                return rc;
            uint8_t *p = realloc(b->slots, cap * b->stride);
            if (!p)
                return sl__iter_fail(it, -ENOMEM, "out of memory for %" PRIu64 " elements of a batch", cap);
            b->slots = p;
            b->cap = cap;
        }
        sl_element_t *e = slot(b, b->n);
        sl_element_init(e, it->spec.num_components);
        int rc = it->input->vt->next(it->input, e);
        if (rc == 1) {
            b->input_done = true;
            return 0;
        }
        if (rc < 0)
            return rc;
        b->n++;
        size_t owned = sl_element_bytes(e);
        if (owned > 0) {
            if ((rc = sl__iter_charge(it, &b->mem, owned, "element %" PRIu64 " of a batch", b->n)) < 0)
                return rc;
            b->gathered += owned;
        }
        for (uint32_t c = 0; c < e->num_components; c++)
            held += e->v[c].size;
        if (held > limit)
            return sl__iter_fail(it, SL_ETOOBIG,
                                 "the first %" PRIu64 " elements of a batch hold %zu bytes, over max_batch_bytes %zu",
                                 b->n, held, limit);
    }
    return 0;
}

/* How one component of a gathered batch is laid out. */
struct col {
    int rank;                   /* of the batched value */
    int64_t shape[SL_MAX_RANK]; /* of the batched value */
    bool ragged;
    uint64_t per_row;           /* padded: values per element */
    uint64_t values;            /* values in the batch */
    size_t splits_len, vals_len;
};

static int not_again(struct batch_iter *b, uint32_t c)
{
    return sl__iter_fail(&b->base, SL_EDATA,
                         "component \"%s\" is already a ragged batch; it cannot be batched again",
                         b->base.spec.c[c].name);
}

static int rank_mismatch(struct batch_iter *b, uint32_t c, uint64_t k, int got, int want)
{
    return sl__iter_fail(&b->base, SL_EDATA, "component \"%s\" has rank %d in element %" PRIu64
                         " of the batch but %d in element 0", b->base.spec.c[c].name, got, k, want);
}

/* The total bytes of the strings of a bytes value of n strings. */
static uint64_t strings_len(const sl_value_t *v, uint64_t n)
{
    uint64_t end;
    memcpy(&end, sl_value_data((sl_value_t *)v) + 8 * n, 8);
    return end;
}

/* batch: sizes component c of the gathered elements. */
static int layout_batch(struct batch_iter *b, uint32_t c, struct col *col)
{
    const sl_value_t *v0 = &slot(b, 0)->v[c];
    bool varlen = b->base.input->spec.c[c].varlen; /* the batch's own spec has it no more */
    bool bytes = v0->dtype == SL_DTYPE_BYTES;
    uint64_t n = b->n, values = 0, data = 0;
    if (v0->rank + 1 > SL_MAX_RANK)
        return sl__iter_fail(&b->base, SL_EDATA, "component \"%s\" has rank %d; batched it would exceed rank %d",
                             b->base.spec.c[c].name, v0->rank, SL_MAX_RANK);
    if (varlen && v0->rank == 0)
        return sl__iter_fail(&b->base, SL_EINTERNAL, "varlen component \"%s\" is a scalar", b->base.spec.c[c].name);
    for (uint64_t k = 0; k < n; k++) {
        sl_value_t *v = &slot(b, k)->v[c];
        if (v->ragged)
            return not_again(b, c);
        if (v->rank != v0->rank)
            return rank_mismatch(b, c, k, v->rank, v0->rank);
        /* A varlen component may differ in its leading dimension only. */
        for (int d = varlen ? 1 : 0; d < v->rank; d++) {
            if (v->shape[d] != v0->shape[d]) {
                char want[128], got[128];
                sl__shape_str(v0->shape, v0->rank, want, sizeof want);
                sl__shape_str(v->shape, v->rank, got, sizeof got);
                return sl__iter_fail(&b->base, SL_EDATA,
                                     "component \"%s\" has shape %s in element %" PRIu64
                                     " of the batch but %s in element 0; batch needs equal shapes%s",
                                     b->base.spec.c[c].name, got, k, want,
                                     varlen ? " behind the varlen dimension" : " (padded_batch pads them)");
            }
        }
        uint64_t count = sl_value_count(v);
        values += count;
        data += bytes ? strings_len(v, count) : v->size;
    }
    col->rank = v0->rank + 1;
    col->shape[0] = (int64_t)n;
    for (int d = 0; d < v0->rank; d++)
        col->shape[d + 1] = v0->shape[d];
    col->ragged = varlen;
    if (varlen)
        col->shape[1] = -1;
    col->values = values;
    col->splits_len = varlen ? (size_t)(n + 1) * 8 : 0;
    col->vals_len = bytes ? (size_t)(values + 1) * 8 + (size_t)data : (size_t)data;
    return 0;
}

/* padded_batch: sizes component c of the gathered elements, padded. */
static int layout_padded(struct batch_iter *b, uint32_t c, struct col *col)
{
    const char *name = b->base.spec.c[c].name;
    const struct pad_spec *ps = &b->pad[c];
    const sl_value_t *v0 = &slot(b, 0)->v[c];
    bool bytes = v0->dtype == SL_DTYPE_BYTES;
    int rank = v0->rank;
    int64_t dims[SL_MAX_RANK];
    uint64_t n = b->n, data = 0;
    if (rank + 1 > SL_MAX_RANK)
        return sl__iter_fail(&b->base, SL_EDATA, "component \"%s\" has rank %d; batched it would exceed rank %d",
                             name, rank, SL_MAX_RANK);
    if (ps->has_dims && ps->dims.n != rank)
        return sl__iter_fail(&b->base, SL_EDATA,
                             "padded_shapes gives component \"%s\" %d dimensions, but its elements have rank %d",
                             name, ps->dims.n, rank);
    for (int d = 0; d < rank; d++)
        dims[d] = ps->has_dims ? ps->dims.v[d] : -1;
    for (uint64_t k = 0; k < n; k++) {
        sl_value_t *v = &slot(b, k)->v[c];
        if (v->ragged)
            return not_again(b, c);
        if (v->rank != rank)
            return rank_mismatch(b, c, k, v->rank, rank);
        if (bytes)
            data += strings_len(v, sl_value_count(v));
    }
    for (int d = 0; d < rank; d++) {
        int64_t longest = 0;
        for (uint64_t k = 0; k < n; k++) {
            const sl_value_t *v = &slot(b, k)->v[c];
            if (v->shape[d] > longest)
                longest = v->shape[d];
            if (dims[d] >= 0 && v->shape[d] > dims[d]) {
                char got[128], want[128];
                sl__shape_str(v->shape, rank, got, sizeof got);
                sl__shape_str(ps->dims.v, rank, want, sizeof want);
                return sl__iter_fail(&b->base, SL_EDATA,
                                     "component \"%s\" has shape %s in element %" PRIu64
                                     " of the batch, larger than its padded shape %s",
                                     name, got, k, want);
            }
        }
        if (dims[d] < 0)
            dims[d] = longest;
    }
    uint64_t per_row = 1, values, size = bytes ? 8 : sl_dtype_size(v0->dtype);
    for (int d = 0; d < rank; d++) {
        if (__builtin_mul_overflow(per_row, (uint64_t)dims[d], &per_row))
            goto too_big;
    }
    if (__builtin_mul_overflow(per_row, n, &values) || values > (uint64_t)SIZE_MAX / 8 / size)
        goto too_big;
    col->rank = rank + 1;
    col->shape[0] = (int64_t)n;
    memcpy(col->shape + 1, dims, (size_t)rank * sizeof dims[0]);
    col->ragged = false;
    col->per_row = per_row;
    col->values = values;
    col->splits_len = 0;
    col->vals_len = bytes ? (size_t)(values + 1) * 8 + (size_t)data : (size_t)(values * size);
    return 0;
too_big:
    return sl__iter_fail(&b->base, SL_ETOOBIG, "component \"%s\" padded to a batch of %" PRIu64
                         " elements exceeds max_batch_bytes %zu", name, n, b->base.ctx->opts.max_batch_bytes);
}

/* batch: writes component c of every gathered element, one after the other. */
static void fill_batch(struct batch_iter *b, uint32_t c, const struct col *col, uint8_t *vals, int64_t *splits)
{
    bool bytes = slot(b, 0)->v[c].dtype == SL_DTYPE_BYTES;
    uint64_t *offsets = (uint64_t *)vals; /* 8-aligned in the block */
    uint8_t *strings = vals + (col->values + 1) * 8;
    uint64_t at = 0, str_at = 0;
    if (splits)
        splits[0] = 0;
    for (uint64_t k = 0; k < b->n; k++) {
        sl_value_t *v = &slot(b, k)->v[c];
        const uint8_t *src = sl_value_data(v);
        uint64_t count = sl_value_count(v);
        if (splits)
            splits[k + 1] = splits[k] + v->shape[0];
        if (!bytes) {
            memcpy(vals + at, src, v->size);
            at += v->size;
            continue;
        }
        /* Rebase the element's offsets onto the batch's strings. */
        for (uint64_t i = 0; i < count; i++) {
            uint64_t o;
            memcpy(&o, src + 8 * i, 8);
            offsets[at + i] = str_at + o;
        }
        uint64_t len = strings_len(v, count);
        memcpy(strings + str_at, src + 8 * (count + 1), len);
        at += count;
        str_at += len;
    }
    if (bytes)
        offsets[at] = str_at;
}

/* padded_batch: writes component c padded. Every element's values go to
 * the corner of its row; the rest holds the padding value (bytes: ""). */
static int fill_padded(struct batch_iter *b, uint32_t c, const struct col *col, uint8_t *vals)
{
    const sl_value_t *v0 = &slot(b, 0)->v[c];
    bool bytes = v0->dtype == SL_DTYPE_BYTES;
    int rank = v0->rank;
    size_t size = bytes ? 0 : sl_dtype_size(v0->dtype);
    const int64_t *dims = col->shape + 1;
    uint64_t stride[SL_MAX_RANK];
    struct str {
        const uint8_t *p;
        uint64_t len;
    } *strs = NULL;

    if (bytes) {
        strs = calloc(col->values ? col->values : 1, sizeof *strs);
        if (!strs)
            return sl__iter_fail(&b->base, -ENOMEM, "out of memory padding component \"%s\"",
                                 b->base.spec.c[c].name);
    } else {
        bool zero = true;
        for (size_t i = 0; i < size; i++)
            zero = zero && b->pad[c].value[i] == 0;
        if (zero)
            memset(vals, 0, col->vals_len);
        else
            for (uint64_t i = 0; i < col->values; i++)
                memcpy(vals + i * size, b->pad[c].value, size);
    }
    for (int d = rank - 1; d >= 0; d--)
        stride[d] = d == rank - 1 ? 1 : stride[d + 1] * (uint64_t)dims[d + 1];

    for (uint64_t k = 0; k < b->n; k++) {
        sl_value_t *v = &slot(b, k)->v[c];
        const uint8_t *src = sl_value_data(v);
        uint64_t count = sl_value_count(v), base = k * col->per_row;
        if (count == 0)
            continue;
        /* Walk the element's values in row-major order with an odometer
         * over its dimensions; the last one is contiguous in both. */
        int64_t idx[SL_MAX_RANK] = {0};
        uint64_t run = rank > 0 ? (uint64_t)v->shape[rank - 1] : 1;
        for (uint64_t i = 0; i < count; i += run) {
            uint64_t at = base;
            for (int d = 0; d + 1 < rank; d++)
                at += (uint64_t)idx[d] * stride[d];
            if (bytes) {
                for (uint64_t j = 0; j < run; j++) {
                    size_t len;
                    strs[at + j].p = sl_bytes_at(src, count, i + j, &len);
                    strs[at + j].len = len;
                }
            } else {
                memcpy(vals + at * size, src + i * size, run * size);
            }
            for (int d = rank - 2; d >= 0; d--) {
                if (++idx[d] < v->shape[d])
                    break;
                idx[d] = 0;
            }
        }
    }
    if (bytes) {
        uint64_t *offsets = (uint64_t *)vals, o = 0;
        uint8_t *strings = vals + (col->values + 1) * 8;
        for (uint64_t i = 0; i < col->values; i++) {
            offsets[i] = o;
            if (strs[i].len)
                memcpy(strings + o, strs[i].p, strs[i].len);
            o += strs[i].len;
        }
        offsets[col->values] = o;
        free(strs);
    }
    return 0;
}

static int batch_next_gather(sl_iter_t *it, sl_element_t *out)
{
    struct batch_iter *b = (struct batch_iter *)it;
    uint32_t n = it->spec.num_components;
    struct col cols[SL_MAX_COMPONENTS];
    uint8_t *block = NULL;
    size_t total = 0, limit = it->ctx->opts.max_batch_bytes;
    int rc;

    if (b->input_done)
        return 1;
    rc = gather_fill(b);
    if (rc < 0)
        goto fail;
    if (b->n == 0 || (b->n < b->batch_size && b->drop_remainder)) {
        gather_discard(b);
        return 1;
    }
    for (uint64_t i = 0; i < b->n; i++) {
        const sl_element_t *e = slot(b, i);
        if (sl_prov_append(out, sl_prov_runs(e), sl_prov_count(e)) < 0 ||
            (out->prov_n == (2 | SL_PROV_HEAP) && sl_prov_reserve(out, b->n) < 0)) {
            rc = sl__iter_fail(it, -ENOMEM, "out of memory for the provenance of a batch");
            goto fail;
        }
    }
    for (uint32_t c = 0; c < n; c++) {
        rc = b->padded ? layout_padded(b, c, &cols[c]) : layout_batch(b, c, &cols[c]);
        if (rc < 0)
            goto fail;
        total = ALIGN8(ALIGN8(total) + cols[c].splits_len);
        if (cols[c].vals_len > limit || total > limit - cols[c].vals_len) {
            rc = sl__iter_fail(it, SL_ETOOBIG, "batch of %" PRIu64 " elements exceeds max_batch_bytes %zu", b->n,
                               limit);
            goto fail;
        }
        total += cols[c].vals_len;
    }
    if ((rc = charge_block(b, total)) < 0)
        goto fail;
    /* calloc: the alignment gaps go on the wire and must not leak memory. */
    block = calloc(1, total ? total : 1);
    if (!block) {
        rc = sl__iter_fail(it, -ENOMEM, "out of memory for a batch of %zu bytes", total);
        goto fail;
    }
    size_t pos = 0;
    for (uint32_t c = 0; c < n; c++) {
        sl_value_t *o = &out->v[c];
        size_t splits_at = ALIGN8(pos);
        size_t vals_at = ALIGN8(splits_at + cols[c].splits_len);
        int64_t *splits = cols[c].ragged ? (int64_t *)(block + splits_at) : NULL;
        if (b->padded) {
            rc = fill_padded(b, c, &cols[c], block + vals_at);
            if (rc < 0)
                goto fail;
        } else {
            fill_batch(b, c, &cols[c], block + vals_at, splits);
        }
        o->dtype = slot(b, 0)->v[c].dtype;
        o->rank = (uint8_t)cols[c].rank;
        memcpy(o->shape, cols[c].shape, (size_t)cols[c].rank * sizeof o->shape[0]);
        o->storage = SL_VALUE_BLOCK;
        o->ragged = cols[c].ragged;
        o->u.ptr = block + vals_at;
        o->u.splits = splits;
        o->size = cols[c].vals_len;
        pos = vals_at + cols[c].vals_len;
    }
    out->block = block;
    out->block_size = pos;
    out->num_elements = b->n;
    gather_drop(b);
    return 0;
fail:
    sl_prov_clear(out);
    free(block);
    gather_drop(b);
    return rc;
}

/* ---- both ---- */

static int batch_next(sl_iter_t *it, sl_element_t *out)
{
    struct batch_iter *b = (struct batch_iter *)it;
    int rc = b->gather ? batch_next_gather(it, out) : batch_next_fast(it, out);
    sl_memacct_release(&b->mem, b->block_charge);
    b->block_charge = 0;
    return rc;
}

static int batch_reset(sl_iter_t *it)
{
    struct batch_iter *b = (struct batch_iter *)it;
    gather_discard(b);
    b->input_done = false;
    int rc = it->input->vt->reset(it->input);
    /* The input dropped its elements in flight: rows ahead serve none. */
    ahead_drop(b, UINT64_MAX);
    b->made = 0;
    return rc;
}

static void batch_destroy(sl_iter_t *it)
{
    struct batch_iter *b = (struct batch_iter *)it;
    if (b->base.dest_stage)
        sl__parallel_detach(b->base.dest_stage); /* before the rows go */
    ahead_drop(b, UINT64_MAX);
    gather_drop(b);
    free(b->slots);
    sl_element_free(b->in);
    sl_memacct_release_all(&b->mem);
    free(b);
}

static const sl_iter_vtbl_t batch_vtbl = {batch_next, batch_reset, batch_destroy};

static int batch_new(sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label, int64_t batch_size,
                     bool drop_remainder, struct batch_iter **out)
{
    struct batch_iter *b = calloc(1, sizeof *b);
    if (!b)
        return -ENOMEM;
    b->in = sl_element_new(input->spec.num_components);
    if (!b->in) {
        free(b);
        return -ENOMEM;
    }
    sl__iter_init(&b->base, &batch_vtbl, input, ctx, label);
    b->batch_size = (uint64_t)batch_size;
    b->drop_remainder = drop_remainder;
    b->stride = sl_element_size(input->spec.num_components);
    sl_memacct_init(&b->mem, ctx->opts.mem);
    /* A batched varlen component is ragged: a later batch cannot take it. */
    for (uint32_t c = 0; c < input->spec.num_components; c++) {
        b->gather = b->gather || input->spec.c[c].dtype == SL_DTYPE_BYTES || input->spec.c[c].varlen;
        b->base.spec.c[c].varlen = false;
    }
    *out = b;
    return 0;
}

int sl__op_batch_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                        sl_iter_t **out)
{
    struct batch_iter *b;
    int rc = batch_new(input, ctx, label, op->u.batch.batch_size, op->u.batch.drop_remainder, &b);
    if (rc < 0)
        return rc;
    if (!b->gather)
        b->base.dest = batch_dest; /* rows a parallel stage below may write in place */
    /* Its blocks go out unread when the ops after it only pass elements on
     * or drop them. */
    int n = sl_spec_num_ops(ctx->spec), i = 0;
    while (i < n && sl_spec_op(ctx->spec, i) != op)
        i++;
    b->last = b->in_order = i < n;
    while (b->last && ++i < n) {
        sl_op_kind_t k = sl_spec_op(ctx->spec, i)->kind;
        bool one_for_one = k == SL_OP_PREFETCH || k == SL_OP_TAKE || k == SL_OP_REPEAT;
        b->in_order &= one_for_one;
        b->last = one_for_one || k == SL_OP_SKIP || k == SL_OP_SHARD;
    }
    *out = &b->base;
    return 0;
}

/* The padding value pv in dtype, or a message saying why it does not fit. */
static int pad_value(sl_dtype_t dtype, const sl_spec_padding_value_t *pv, uint8_t *out, char *why, size_t whylen)
{
    bool is_float = dtype == SL_DTYPE_FLOAT16 || dtype == SL_DTYPE_BFLOAT16 || dtype == SL_DTYPE_FLOAT32 ||
                    dtype == SL_DTYPE_FLOAT64;
    if (dtype == SL_DTYPE_BYTES) {
        snprintf(why, whylen, "is of dtype bytes, which is padded with empty strings");
        return SL_EINVAL;
    }
    if (is_float) {
        double d = pv->is_int ? (double)pv->i : pv->d;
        sl__cast_values(SL_DTYPE_FLOAT64, &d, 1, dtype, out);
        return 0;
    }
    if (!pv->is_int) {
        snprintf(why, whylen, "is of dtype %s, which takes an integer padding value, not %.15g", sl_dtype_name(dtype),
                 pv->d);
        return SL_EINVAL;
    }
    /* Integers must fit: a value that does not survive the round trip
     * would be saturated. */
    int64_t back = 0;
    sl__cast_values(SL_DTYPE_INT64, &pv->i, 1, dtype, out);
    sl__cast_values(dtype, out, 1, SL_DTYPE_INT64, &back);
    if (back != pv->i || (dtype == SL_DTYPE_UINT64 && pv->i < 0)) {
        snprintf(why, whylen, "is of dtype %s, which cannot hold the padding value %" PRId64, sl_dtype_name(dtype),
                 pv->i);
        return SL_EINVAL;
    }
    return 0;
}

int sl__op_padded_batch_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                               sl_iter_t **out)
{
    char names[1024], why[200];
    const sl_element_spec_t *in = &input->spec;
    sl__spec_names(in, names, sizeof names);
    for (int i = 0; i < op->u.padded_batch.num_padded_shapes; i++) {
        const char *name = op->u.padded_batch.padded_shapes[i].name;
        if (sl__spec_find(in, name) < 0)
            return sl__ctx_fail(ctx, SL_EINVAL, label, "padded_shapes names \"%s\", which is not in its input (%s)",
                                name, names);
    }
    struct pad_spec pad[SL_MAX_COMPONENTS];
    memset(pad, 0, sizeof pad);
    for (int i = 0; i < op->u.padded_batch.num_padded_shapes; i++) {
        int c = sl__spec_find(in, op->u.padded_batch.padded_shapes[i].name);
        pad[c].has_dims = true;
        pad[c].dims = op->u.padded_batch.padded_shapes[i].dims;
    }
    for (int i = 0; i < op->u.padded_batch.num_padding_values; i++) {
        const sl_spec_padding_value_t *pv = &op->u.padded_batch.padding_values[i];
        int c = sl__spec_find(in, pv->name);
        if (c < 0)
            return sl__ctx_fail(ctx, SL_EINVAL, label, "padding_values names \"%s\", which is not in its input (%s)",
                                pv->name, names);
        if (pad_value(in->c[c].dtype, pv, pad[c].value, why, sizeof why) < 0)
            return sl__ctx_fail(ctx, SL_EINVAL, label, "padding_values: component \"%s\" %s", pv->name, why);
    }
    struct batch_iter *b;
    int rc = batch_new(input, ctx, label, op->u.padded_batch.batch_size, op->u.padded_batch.drop_remainder, &b);
    if (rc < 0)
        return rc;
    b->gather = true;
    b->padded = true;
    memcpy(b->pad, pad, sizeof pad);
    *out = &b->base;
    return 0;
}
