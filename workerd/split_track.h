/*
 * split_track.h: which DYNAMIC splits of a task are done (task.c).
 *
 * A split is done when its source has read all it will of it and every
 * record it read has settled: left the pipeline in a batch that was handed
 * to a client connection, or been dropped inside it. The table holds one
 * entry per split handed to the pipeline and not yet reported done, so it
 * is bounded by the splits in flight: those the pipeline is reading (one,
 * or interleave's cycle_length) plus those whose records its buffers still
 * hold (a shuffle buffer may hold records of many) plus those whose batches
 * wait in the task's buffer. docs/architecture.md, "Provenance and
 * split-done notices", says what the notices are for.
 *
 * Not thread-safe: the task calls it under its mutex.
 */
#ifndef SL_SPLIT_TRACK_H
#define SL_SPLIT_TRACK_H

#include <stdbool.h>
#include <stdint.h>

#include "pipeline.h"
#include "provwire.h"

typedef struct sl_split_track sl_split_track_t;

/** How records settle. */
enum sl_settle {
    SL_SETTLE_DROPPED = 0, /* dropped inside the pipeline */
    SL_SETTLE_OUT = 1,     /* left the pipeline in a batch, now in the task's buffer */
    SL_SETTLE_SENT = 2,    /* that batch was handed to a client connection */
};

/** @return a new empty table, freed by sl_split_track_free(); NULL without memory */
sl_split_track_t *sl_split_track_new(void);

/** Frees the table and the skip runs it owns; NULL is ignored. */
void sl_split_track_free(sl_split_track_t *t);

/**
 * Starts tracking split s of epoch, handed to the pipeline now; takes
 * ownership of skips (malloc'd, s->num_skips runs, may be NULL), which
 * stay valid until the split is reported done, and points s->skips at them.
 * @return 0, -ENOMEM (skips freed)
 */
int sl_split_track_add(sl_split_track_t *t, uint64_t epoch, sl_split_t *s, sl_skip_run_t *skips);

/** The source read all it will of split s of epoch: records of it. */
void sl_split_track_read(sl_split_track_t *t, uint64_t epoch, const sl_split_t *s, uint64_t records);

/** Records of the runs settled as how says. Runs of no tracked split are ignored. */
void sl_split_track_settle(sl_split_track_t *t, const sl_provenance_run_t *runs, uint64_t n, enum sl_settle how);

/**
 * Settles the runs of a batch that left the pipeline (SL_SETTLE_OUT) and,
 * when tally is not NULL, counts its records split by split into it: one
 * row per split the runs reach, its `delivered` the batch's records of that
 * split (the batch's tallies, which the client may ask for:
 * GetElementResponse.tallies_offset). tally has room for
 * sl_split_track_size() rows. It finds the runs' sl_prov_span() first and
 * settles a batch whose records all lie in one split from it alone; when
 * span is not NULL and n > 0, *span is that span.
 * @return the rows written (0 without tally)
 */
unsigned sl_split_track_out(sl_split_track_t *t, const sl_provenance_run_t *runs, uint64_t n,
                            sl_split_done_t *tally, sl_prov_span_t *span);

/** Settles, as how says (SL_SETTLE_OUT or SL_SETTLE_SENT), records
 *  counted split by split in tally rows (a row a split, its `delivered`
 *  the records), not a run a record: a batch's send by the rows
 *  sl_split_track_out() gave it, or what a task counted itself of the
 *  batches that lay wholly in one split (task.c). A row of a split no
 *  longer tracked is ignored. A task settles its SL_SETTLE_OUT rows before
 *  sl_split_track_end(), which counts out what left the pipeline. */
void sl_split_track_settle_rows(sl_split_track_t *t, const sl_split_done_t *rows, unsigned n, enum sl_settle how);

/** The pipeline ended: whatever it still held was dropped, so every split
 *  is read, and its records are those that settled or wait in batches. */
void sl_split_track_end(sl_split_track_t *t);

/** One done split, as a split-done notice says it (the client's type:
 *  protocol/provwire.c encodes it). */
typedef sl_split_done_t sl_split_done_rec_t;

/**
 * Takes up to max done splits out of the table into out, oldest first.
 * @return how many
 */
unsigned sl_split_track_collect(sl_split_track_t *t, sl_split_done_rec_t *out, unsigned max);

/** @return whether a split is done and not yet collected. It may also be
 *  called without the task's mutex, by the thread that sends (then the
 *  answer may be late: a split done since may not show yet). */
bool sl_split_track_has_done(const sl_split_track_t *t);

/** @return the splits tracked (for the bound's test) */
unsigned sl_split_track_size(const sl_split_track_t *t);

/** @return the smallest split id in the table (a split not done, or done
 *  and not collected yet), or UINT64_MAX when it is empty */
uint64_t sl_split_track_min_id(const sl_split_track_t *t);

#endif
