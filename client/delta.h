/*
 * delta.h: what an iterator's ledger (ledger.h) recorded, batch by batch,
 * as bytes another process can replay: the deltas of sl_iterator_delta(),
 * and the checkpoint builder (sluice.h's sl_ckpt_builder_*) that replays
 * them into a ledger of its own and takes the checkpoints the iterator
 * would have taken (docs/fault-tolerance.md, "Checkpoints from deltas").
 *
 * A delta is the ledger's input, not its state: per batch given, its
 * provenance bytes as they came from the worker, its split-done notices
 * and whether it was the end; and each "epochs below E are done" the
 * dispatcher said that changed the ledger. Its size follows the batches it
 * covers, never the length of the run. Fed the same calls in the same
 * order, two ledgers that started from the same checkpoint hold the same
 * positions, so their checkpoints are the same bytes.
 *
 * The bytes, little-endian: "SLDL", u32 version (1), u64 the dataset id,
 * then records, each a u8 kind:
 *   'B' a batch:  u64 num_records, u32 prov_len, u32 done_len, u8 last,
 *                 prov_len bytes of provwire.h's provenance, done_len bytes
 *                 of its split-done notices (sl_provwire_encode_done()).
 *   'E' a fold:   u64 below, u64 waiting (sl__ledger_epochs_done()'s).
 *   'P' a fold by place: u32 epoch, u32 file, u64 record
 *                 (sl__ledger_given_below()'s; a named job's).
 */
#ifndef SL_CLIENT_DELTA_H
#define SL_CLIENT_DELTA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ledger.h"
#include "sluice.h"

/* The most a log holds between two takes (SL_ETOOBIG past it). */
#define SL_DELTA_LOG_MAX ((size_t)64 << 20)

/* The records since the last take. Not thread-safe (the iterator's mutex). */
typedef struct sl_delta_log {
    uint8_t *buf;
    size_t len, cap;
    int rc; /* < 0: a record was lost (memory, or past SL_DELTA_LOG_MAX): no delta from now on */
} sl_delta_log_t;

/** Records a batch as sl__ledger_add() was given it. */
void sl__delta_log_batch(sl_delta_log_t *d, const uint8_t *prov, size_t prov_len, uint64_t num_records,
                         const sl_split_done_t *done, size_t ndone, bool last);

/** Records an sl__ledger_epochs_done() call (one that changed the ledger). */
void sl__delta_log_epochs_done(sl_delta_log_t *d, uint64_t below, size_t waiting);

/** Records an sl__ledger_given_below() call (one that changed the ledger). */
void sl__delta_log_given_below(sl_delta_log_t *d, uint32_t epoch, uint32_t file, uint64_t pos);

/**
 * The records since the last take, as a delta of dataset_id; the log is
 * empty after.
 * @param[out] out the bytes, malloc'd
 * @return 0, or SL_ETOOBIG / -ENOMEM (for good: a record was lost) with a message in err
 */
int sl__delta_log_take(sl_delta_log_t *d, uint64_t dataset_id, uint8_t **out, size_t *len, char *err,
                       size_t errlen);

void sl__delta_log_free(sl_delta_log_t *d);

/**
 * Replays a delta into l: checks all of it first (its header, that it is
 * of dataset_id, every record's bounds, provenance and notices), then makes
 * the ledger calls it records; a delta refused changes nothing.
 * @return 0, or SL_EDATA / SL_EINVAL / -ENOMEM with a message in err
 */
int sl__ledger_apply_delta(sl_ledger_t *l, uint64_t dataset_id, const uint8_t *p, size_t len, char *err,
                           size_t errlen);

#endif
