/*
 * batch.h: a finished batch as the worker holds it and the wire carries it:
 * one contiguous buffer of tensor bytes and a table of components that
 * point into it. The worker sends data straight from this buffer.
 */
#ifndef SL_BATCH_H
#define SL_BATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "provwire.h"
#include "sluice.h"

/* Bytes of a component inside sl_wire_batch_t.data. A bytes (string) tensor
 * of n values is laid out as n + 1 little-endian uint64 offsets, relative to
 * the end of the offsets, followed by the concatenated values. A ragged
 * component also has rows + 1 int64 row splits at splits_offset. */
typedef struct sl_component {
    char name[SL_MAX_NAME];
    sl_dtype_t dtype;
    int rank;
    int64_t shape[SL_MAX_RANK];
    uint64_t offset;
    uint64_t length;
    bool ragged;
    uint64_t splits_offset;
    uint64_t splits_length;
} sl_component_t;

/* Tally rows a batch keeps in itself; more are malloc'd. */
#define SL_WIRE_TALLY_INLINE 4

/* Bytes of encoded provenance a batch keeps in itself: the runs form's
 * bound of two runs (provwire.h); longer is malloc'd. */
#define SL_WIRE_PROV_INLINE 128

typedef struct sl_wire_batch {
    uint64_t num_elements;
    int num_components;
    sl_component_t components[SL_MAX_COMPONENTS];
    uint8_t *data; /* owned, malloc'd; freed by sl_wire_batch_free() */
    size_t size;
    /* The elements' provenance: prov_n runs (0: none), at prov_heap (owned)
     * or, when prov_heap is NULL, the one in prov_one. The wire carries
     * them after data, encoded (prov_wire; docs/protocol.md). */
    uint64_t prov_n;
    sl_provenance_run_t prov_one;
    sl_provenance_run_t *prov_heap;
    /* The runs as the wire carries them (provwire.h), prov_wire_len bytes
     * in prov_wire_one or malloc'd (owned); encoded by the worker when a
     * client asks for them. */
    uint8_t *prov_wire;
    size_t prov_wire_len;
    bool prov_wire_dense; /* prov_wire is in the dense form (provwire.h) */
    uint64_t prov_records;  /* the runs' records (their counts' sum), set with prov_wire */
    /* The runs' span (provwire.h), when prov_span_known: found by whoever
     * walked them first (a DYNAMIC worker, as it settles the batch), so
     * that the encoding need not walk them again for it. */
    bool prov_span_known;
    sl_prov_span_t prov_span;
    uint8_t prov_wire_one[SL_WIRE_PROV_INLINE]; /* a plain batch's run or two */
    /* DYNAMIC: the records counted split by split when the batch left the
     * pipeline (ntally rows, owned; NULL when not counted): how the worker
     * settles it when sent, and its tallies on the wire. */
    sl_split_done_t *tally; /* tally_one or malloc'd */
    uint32_t ntally;
    sl_split_done_t tally_one[SL_WIRE_TALLY_INLINE]; /* most batches fall in a split or two */
    /* What a task's buffer counts for the batch (sl_wire_batch_held_bytes()
     * when it was buffered), given back as counted when it leaves; handed:
     * the part of that charge to the memory budget that a holder of the
     * sent batch took over (workerd/task.h, sl_task_hand_over()). */
    size_t charged;
    size_t handed;
} sl_wire_batch_t;

/* One provenance run in memory and in a disk cache's blobs: u32 epoch,
 * u32 file_index, u64 begin, u64 count; sl_provenance_run_t and
 * sl_posrun_t (posset.h) have that layout. The wire encodes runs compactly
 * (provwire.h). */
#define SL_PROV_RUN_BYTES 24
_Static_assert(sizeof(sl_provenance_run_t) == SL_PROV_RUN_BYTES, "sl_provenance_run_t is 24 bytes");

/** @return b's b->prov_n provenance runs, valid while b is; NULL once
 *  sl_wire_batch_drop_runs() freed them (more than one run, none kept) */
static inline const sl_provenance_run_t *sl_wire_batch_prov(const sl_wire_batch_t *b)
{
    return b->prov_heap ? b->prov_heap : b->prov_n > 1 ? NULL : &b->prov_one;
}

/**
 * Frees b's runs once they are encoded, when there is more than one: a
 * shuffled batch's, 24 bytes an element, three times an int64 batch's
 * tensors, which its buffer and the batches held until acknowledged would
 * otherwise keep. prov_n stays; sl_wire_batch_prov() is NULL afterwards.
 * Encoded in the runs form, which serves every client, they are not read
 * again; in the dense form, a client that does not read it has them
 * decoded back from it (sl_wire_batch_encode_prov(), one run a record). The
 * caller must not need them otherwise (a DYNAMIC task settles a batch by
 * its tally when it has one). Does nothing without an encoding.
 */
void sl_wire_batch_drop_runs(sl_wire_batch_t *b);

/** sl_wire_batch_encode_prov() of a batch not yet encoded in a form that
 *  serves (inline, the check costs a send next to nothing). */
int sl__wire_batch_encode_prov(sl_wire_batch_t *b, bool dense);

/**
 * Encodes b's provenance for the wire into b->prov_wire, once: a batch is
 * made once. In the dense form when dense (the client reads it) and it
 * applies, else as runs (provwire.h); a batch already encoded is encoded
 * again only if it is in the dense form and dense is false (a batch sent
 * again to a client that does not read it). Nothing without runs.
 * @return 0 or -ENOMEM
 */
static inline int sl_wire_batch_encode_prov(sl_wire_batch_t *b, bool dense)
{
    /* The runs form serves every client; the dense form only one that
     * reads it. */
    if (b->prov_wire && (b->prov_wire_dense == dense || !b->prov_wire_dense))
        return 0;
    return sl__wire_batch_encode_prov(b, dense);
}

/** A wire batch's block, not initialized, or NULL without memory: one a
 *  batch before gave back (a stock of up to SL_RECYCLE_SLOTS, recycle.h),
 *  else malloc's. A worker makes one a batch, 6 KiB or more. */
sl_wire_batch_t *sl_wire_batch_alloc(void);

/** Frees the batch's data (to sl__big_free(): a large block is kept for the
 *  next batch) and gives the batch back (sl_wire_batch_alloc()'s stock; a
 *  block from malloc(sizeof(sl_wire_batch_t)) may be given too). NULL is
 *  ignored. */
void sl_wire_batch_free(sl_wire_batch_t *b);

/**
 * The bytes b holds: its tensor bytes, and its provenance runs, their wire
 * encoding and its tallies where they are on the heap (a shuffled batch's
 * runs, 24 bytes an element, can be three times an int64 batch's tensors).
 * Tensor bytes in a block made in a client's shared-memory region (a
 * foreign range of big_alloc.h) are not counted: the region's pages are
 * charged already (workerd/shm.h).
 */
size_t sl_wire_batch_held_bytes(const sl_wire_batch_t *b);

/**
 * Checks that every component lies inside [0, size) and that its length
 * matches its dtype and shape (dense) or its offsets (bytes, ragged).
 * @return 0, or SL_EPROTO with a message naming the component in err
 */
int sl_wire_batch_validate(const sl_wire_batch_t *b, char *err, size_t errlen);

#endif
