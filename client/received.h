/*
 * received.h: a batch as the client received it (struct sl_batch, which
 * sluice.h keeps opaque): built from a GET_ELEMENT answer, its components,
 * provenance and split-done notices checked against the payload before the
 * caller sees it (iterator.c takes them from the wire; received.c also has
 * sluice.h's sl_batch_* accessors).
 */
#ifndef SL_CLIENT_RECEIVED_H
#define SL_CLIENT_RECEIVED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "batch.h"
#include "frame.h"
#include "posset.h"
#include "sluice.h"

/* The provenance, notices and tallies of a batch in shared memory, copied
 * out, are kept in the batch when they take at most this many bytes. */
#define SL_BATCH_TAIL_INLINE 256
/* Split-done notices a batch holds in itself: a frame carries a notice or
 * none for most splits of a few batches. */
#define SL_BATCH_DONE_INLINE 2

struct sl_batch {
    uint64_t task_id;
    uint64_t round;
    char worker[128];
    uint64_t num_elements;
    uint64_t num_records; /* the source records its provenance counts */
    int num_tensors;
    sl_tensor_t tensors[SL_MAX_COMPONENTS];
    char names[SL_MAX_COMPONENTS][SL_MAX_NAME];
    uint8_t *payload;
    size_t size;
    /* A batch whose tensor bytes lie in a worker's shared-memory region
     * (shmmap.h): its slot there, held until the batch is freed; payload
     * is then NULL, and the provenance, notices and tallies, copied out,
     * lie in tail_one or, longer, in the bytes that follow the batch
     * (allocated with it). */
    struct sl_shm_map *shm;
    uint64_t shm_seq;
    bool tail_in_answer; /* its provenance, notices and tallies came in the answer's shm_tail, not the slot */
    uint8_t tail_one[SL_BATCH_TAIL_INLINE]; /* such a batch's tail when it is this small */
    /* The provenance: num_prov runs, checked, encoded at prov_wire (in
     * payload; provwire.h) and decoded into prov (owned) when the caller
     * asks for them: the ledger reads them without keeping a copy. A batch
     * of one run (most unshuffled ones) has it decoded as it is checked,
     * in prov_one, which prov points to. */
    const uint8_t *prov_wire;
    size_t prov_wire_len;
    sl_provenance_run_t *prov;
    size_t num_prov;
    sl_provenance_run_t prov_one;
    sl_split_done_t *done;     /* num_done notices: done_one, or malloc'd (owned) */
    size_t num_done;
    sl_split_done_t done_one[SL_BATCH_DONE_INLINE];
    /* The tallies (GetElementResponse.tallies_offset): num_tally rows in
     * tally_one or malloc'd (owned), NULL unless they count every record
     * of the provenance. */
    sl_split_done_t *tally;
    size_t num_tally;
    sl_split_done_t tally_one[SL_WIRE_TALLY_INLINE]; /* most batches fall in a split or two */
    bool stocked; /* its block is the batch stock's (received.c), not a malloc of more than the batch */
    struct sl_batch *next;
};

/** Frees a batch and what it owns; NULL is ignored. */
void sl__batch_free(struct sl_batch *b);

/** @return the least epoch of the records b's provenance names (its
 *  tallies' when it has them, else its runs'); UINT64_MAX for a batch of no
 *  records, 0 for one whose provenance is not known */
uint64_t sl__batch_least_epoch(const struct sl_batch *b);

/** The least place (epoch, file, begin; count unused) at or after which
 *  every record of b lies, in the order of places (posset.h): its
 *  tallies' splits' begins when it has them, else its runs'; (0, 0, 0)
 *  for a batch whose provenance is not known.
 *  @return false for a batch of no records (*at unset then) */
bool sl__batch_least_place(const struct sl_batch *b, sl_posrun_t *at);

/** Appends n split-done notices to *arr, which holds *num of them and has
 *  room for *cap (0 with *arr NULL): the room doubles, from 16, so that a
 *  notice at a time costs no allocation. @return 0 or -ENOMEM */
int sl__notices_append(sl_split_done_t **arr, size_t *num, size_t *cap, const sl_split_done_t *add, size_t n);

/** Appends n split-done notices to batch b's (moved to the heap when they
 *  outgrow its own room). @return 0 or -ENOMEM */
int sl__batch_add_notices(struct sl_batch *b, const sl_split_done_t *add, size_t n);

/**
 * The split-done notices of a GET_ELEMENT answer whose payload is size
 * bytes: checked and decoded into *out, *n of them: into room (room_n of
 * them) when they fit, else malloc'd (NULL for none). They take at most a
 * sixth of the payload, which the frame limit bounds.
 * @return 0, SL_EPROTO or -ENOMEM with a message in err
 */
int sl__notices_from_wire(const sluice_GetElementResponse *resp, const uint8_t *payload, size_t size,
                          sl_split_done_t *room, size_t room_n, sl_split_done_t **out, size_t *n, char *err,
                          size_t errlen);

/**
 * Builds a batch from a GET_ELEMENT answer, checking every component, the
 * provenance and the notices against the payload. Takes ownership of
 * payload (freed on failure too).
 * @return the batch, or NULL with what was wrong in err
 */
struct sl_batch *sl__batch_from_wire(const sluice_GetElementResponse *resp, uint8_t *payload, size_t size, char *err,
                                     size_t errlen);

/**
 * sl__batch_from_wire() for an answer whose payload lies in a shared-memory
 * slot (GetElementResponse.shm_offset): the slot, len bytes at slot, is
 * checked as a frame's payload would be, its provenance, notices and
 * tallies copied out first (the worker could change the slot's bytes
 * after the checks) from the answer's shm_tail (the slot then holds the
 * tensor bytes alone) or from the slot after the tensor bytes, and only
 * dense components of fixed-size elements may lie there. The batch holds
 * the slot (number seq of map m); on failure it is given back. resp's
 * provenance, notices and tallies offsets are changed to count in the copy
 * (copying the whole answer instead cost 800 instructions a batch).
 * @return the batch, or NULL with what was wrong in err
 */
struct sl_batch *sl__batch_from_shm(sluice_GetElementResponse *resp, struct sl_shm_map *m, const uint8_t *slot,
                                    size_t len, uint64_t seq, char *err, size_t errlen);

#endif
