/*
 * ledger.h: the record of what an iterator handed its caller, as source
 * positions (posset.h), and the checkpoints made of it (iterator.c uses it;
 * docs/fault-tolerance.md, "Iterator checkpoints").
 *
 * What a checkpoint holds and what a worker-loss report says come from here:
 * `restored` (what the checkpoint the iterator was restored from held) and
 * `got` (what the caller was given since), with a split's holes (records its
 * pipeline dropped) filled once its split-done notice says every record it
 * delivered was given. A shuffled batch is one run per element and merging
 * them costs a pass over the part of `got` they reach, so runs and notices
 * wait in the ledger and go in together (sl__ledger_sync()).
 *
 * Over a long run the ledger stays the size of the open epochs: once the
 * dispatcher says every record of the epochs below E reached this client
 * (ClientHeartbeatResponse.epochs_done) and the caller was given every batch
 * that had arrived by then, the runs of those epochs are dropped and the
 * ledger keeps only "every epoch below E done" (epochs_done), which
 * checkpoints (version 4) and the restore carry as one number.
 *
 * Not thread-safe: the iterator calls it under its mutex.
 */
#ifndef SL_CLIENT_LEDGER_H
#define SL_CLIENT_LEDGER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "posbits.h"
#include "posset.h"
#include "sluice.h"
#include "tally.h"

typedef struct sl_ledger {
    /* Positions of epochs from epochs_done on only, as runs and, where runs
     * crowd (a rank's share past the fold, a shuffle's holes), bitmaps. */
    sl_posbits_t restored, got;
    uint64_t epochs_done;      /* every epoch below this one was given whole (or restored so) */
    uint64_t given;            /* batches recorded (sl__ledger_add() calls) */
    /* A fold waiting for the caller: epochs below fold_below are done once
     * given reaches fold_at (fold_below 0: none waits). */
    uint64_t fold_below, fold_at;
    /* Runs and notices of the batches given since the last sync. */
    sl_provenance_run_t *runs;
    size_t num, cap;
    sl_split_done_t *done;
    size_t ndone, done_cap;
    unsigned batches;
    /* Lazy provenance: the batches that came with tallies, oldest first,
     * one entry a batch, their provenance kept as the wire had it (log)
     * with the keys of the splits their tallies name (keys), until every
     * split an entry reaches is whole; then the entry goes undecoded, the
     * splits being in got (or runs) as whole runs. Decoded into runs when
     * the ledger syncs (a checkpoint, a report, a fold), when a split's
     * notice finds it was not given whole, and when log passes log_max. */
    struct sl_lazy_entry *ent;
    size_t ent_head, ent_num, ent_cap; /* entries [ent_head, ent_num) */
    bool lazy_blocked; /* the head entry has a key in open, and none left open since */
    /* A ring: each entry's bytes lie whole at its offset, oldest first from
     * the head entry's; a batch that does not fit at the end starts again
     * at 0 (what is let go is never moved). */
    uint8_t *log;
    size_t log_tail, log_kept, log_cap, log_max; /* where the next goes; bytes kept; size; bound */
    uint64_t lazy_records;                       /* of the entries kept */
    struct sl_lazy_key *keys;
    size_t key_head, key_num, key_cap;
    sl_tally_t open; /* records given of each split whose notice has not come */
    size_t max_runs; /* of restored, got, a report, a checkpoint */
    uint64_t job_id; /* named in the overflow's message */
    int rc;          /* < 0: got overflowed or ran out of memory; nothing is recorded any more */
    bool half_said;  /* it said on stderr that it holds over half max_runs (once) */
    /* Coordinated reads: every record before this place (epoch, file,
     * begin; count unused) reached a client of the job, the dispatcher
     * says (ClientHeartbeatResponse.confirmed_below), so no report asks for
     * it and the ledger keeps nothing before it. floor_set false: none. A
     * ledger with such a floor makes no checkpoint. floor_given: the floor
     * is a place before which every record was given to some caller of the
     * job (a named job's fold by place, sl__ledger_given_below(), or a
     * restored checkpoint's place): checkpoints start there (version 5). */
    sl_posrun_t floor;
    bool floor_set, floor_given;
    /* A named job's fold heard since the caller was last given a batch
     * (fold_next_set): made when the next one is given, so that a
     * checkpoint taken between two batches holds the fold as it stood when
     * the caller got the last one (sl__ledger_given_below()). */
    sl_posrun_t fold_next;
    bool fold_next_set;
    /* The only client of its tasks (an anonymous job): a split's records
     * all go to it. Set by the owner; without it nothing is missing below
     * (a named job's consumers share its tasks' batches). */
    bool sole;
    /* A rank of a named job (set by the owner; a checkpoint builder's
     * ledger, which mirrors an iterator's, is not): its messages name the
     * job's fold as the cause of its size, and it decodes the batches
     * lazy provenance keeps as it goes (added()). */
    bool named;
    /* Records a worker delivered that never reached the caller: a split's
     * notice counted more delivered records than the caller was given of
     * it (found when the ledger syncs; said once on stderr). 0 unless a
     * batch was lost on the way: every path that loses one is a bug. */
    uint64_t missing;
} sl_ledger_t;

/** The runs a ledger keeps with opts.max_ledger_runs (0: the most). */
size_t sl__ledger_max_runs(const sl_iterator_opts_t *opts);

/** An empty ledger of at most max_runs runs. */
void sl__ledger_init(sl_ledger_t *l, size_t max_runs);

void sl__ledger_free(sl_ledger_t *l);

/**
 * Sets what a restored checkpoint held: every record before `at` (its
 * epochs_done, and a version 5 one's place within that epoch:
 * sl__checkpoint_read()'s), and the positions past it (posset bytes; runs
 * before it are dropped).
 * @return 0, or < 0 with the decoder's message in err
 */
int sl__ledger_restore(sl_ledger_t *l, const uint8_t *posset, size_t len, sl_posrun_t at, char *err, size_t errlen);

/**
 * The dispatcher says every record of the epochs below `below` reached this
 * client, and `waiting` batches wait for the caller: once the caller was
 * given those (below's records are among them or given already), the
 * ledger drops the runs of those epochs and keeps "epochs below `below`
 * done". A fold already waiting is kept (a later one comes with a later
 * heartbeat), so that a caller always behind still sees folds; one with
 * waiting 0 is made at once all the same, and ends a waiting one it covers.
 */
void sl__ledger_epochs_done(sl_ledger_t *l, uint64_t below, size_t waiting);

/**
 * The dispatcher says every record handed out before (epoch, file, pos)
 * reached a client of the job: for a ledger that serves reports only (the
 * iterator of coordinated reads, which takes no checkpoints), what it holds
 * before that place goes, and so do the counts of splits before it (their
 * notices went to a peer, maybe), letting lazy provenance's batches go
 * undecoded. Runs and notices before it that come later go too. A place
 * not past the last one changes nothing. Over a long epoch behind a
 * shuffle, the ledger then follows the splits not yet confirmed, not the
 * records received (one run each). Checkpoints fail from then on.
 */
void sl__ledger_confirmed_below(sl_ledger_t *l, uint32_t epoch, uint32_t file, uint64_t pos);

/**
 * A named job's fold by place (ClientHeartbeatResponse.place_folded):
 * every record before (epoch, file, pos) was given to some caller of the
 * job. It takes effect when the caller is next given a batch (or the end):
 * a rank checkpoints after its batch of a step and before the next, and a
 * fold heard in between may count a peer's batch of the next step, which
 * that peer's checkpoint does not hold (ranks that all-reduce every step
 * take their next batch only after every rank took this one, so a fold
 * heard before a batch was given counts only batches up to its step). Then
 * the epochs below `epoch` fold; within it the ledger drops what it holds
 * before the place, and what comes before it later, as
 * sl__ledger_confirmed_below() does, but its checkpoints start at the
 * place (version 5) and hold what lies past it. Over a long shuffled epoch
 * read by several ranks, each ledger then follows the splits not yet
 * given, not every record it got. A restored checkpoint's place is made at
 * once (sl__ledger_restore()).
 * @return false when it changes nothing: a place not past the last one
 *   (made or waiting), or a coordinated ledger's
 */
bool sl__ledger_given_below(sl_ledger_t *l, uint32_t epoch, uint32_t file, uint64_t pos);

/** @return the runs the ledger holds (restored and got; what a checkpoint's size follows) */
size_t sl__ledger_runs(const sl_ledger_t *l);

/** @return sl__ledger_runs() and the runs waiting to be merged in, at
 *  most what the next merge leaves (what the heartbeat says, and what
 *  the warnings and the fold's asks follow) */
size_t sl__ledger_runs_held(const sl_ledger_t *l);

/**
 * Records a batch given to the caller: its provenance (prov_len bytes of
 * provwire.h's form at prov, counting num_records source records; none when prov_len
 * is 0) and split-done notices; last when nothing more will come (the end).
 * Syncs once enough waits. Does nothing once rc < 0.
 */
void sl__ledger_add(sl_ledger_t *l, const uint8_t *prov, size_t prov_len, uint64_t num_records,
                    const sl_split_done_t *done, size_t ndone, bool last);

/**
 * sl__ledger_add() for a batch that came with tallies (ntally rows counting
 * every one of its num_records records split by split;
 * GetElementResponse.tallies_offset): its provenance is kept undecoded
 * until a sync needs it, and goes without being decoded once every split it
 * reaches was given whole. ntally 0 is sl__ledger_add().
 */
void sl__ledger_add_tallied(sl_ledger_t *l, const uint8_t *prov, size_t prov_len, uint64_t num_records,
                            const sl_split_done_t *tally, size_t ntally, const sl_split_done_t *done, size_t ndone,
                            bool last);

/**
 * sl__ledger_add() for a batch whose provenance is one run, decoded (a
 * batch of an unshuffled pipeline): the run goes straight to the runs that
 * wait, continuing one of the last few there when it starts where that one
 * ends, so that a split read in order waits as one run.
 */
void sl__ledger_add_run(sl_ledger_t *l, const sl_provenance_run_t *run, const sl_split_done_t *done, size_t ndone,
                        bool last);

/** Whether lazy provenance's kept bytes go round the end of its log now
 *  (the ring has wrapped): for tests. */
bool sl__ledger_log_wrapped(const sl_ledger_t *l);

/** Merges what waits into got (decoding what lazy provenance kept). On
 *  overflow says so once on stderr and sets rc. */
void sl__ledger_sync(sl_ledger_t *l);

/**
 * Starts a report of what was received of epochs from `from` on (from
 * epochs_done on when `from` is below it: no split of a done epoch can be
 * outstanding, so no report asks for it): syncs, then puts restored and
 * got's positions of those epochs in set (initialised here with the
 * ledger's bound). Add what waits elsewhere with sl__report_add_wire(),
 * then encode it with sl_posbits_bytes() (version 2 where it fits, which
 * every dispatcher reads).
 * @return 0, or < 0 when the ledger does not know (it overflowed)
 */
int sl__ledger_report(sl_ledger_t *l, uint64_t from, sl_posbits_t *set);

/**
 * Adds the runs of a batch's provenance (provwire.h's form) of epochs from
 * `from` on to set; *scratch (of *cap runs) is grown as needed, freed by
 * the caller. @return 0 or < 0
 */
int sl__report_add_wire(sl_posbits_t *set, const uint8_t *prov, size_t prov_len, uint64_t num_records,
                        uint64_t from, sl_provenance_run_t **scratch, size_t *cap);

/**
 * A checkpoint of the ledger for dataset_id: "SLCK", u32 version 4, u64
 * dataset id, u32 flags, u32 0, u64 epochs_done, (version 5, when the
 * ledger's floor lies within that epoch: u32 file, u32 0, u64 record, the
 * place its record starts at), u64 the number of positions (of epochs
 * from epochs_done on, at or past the place), (version 6, when a block of
 * 4096 positions is crowded with runs: the place, even an epoch's start;
 * u64 the number of bitmaps and the bitmaps, posbits.h), the runs of the
 * positions in no bitmap in provwire.h's compact form (little-endian),
 * then a 32-byte tag over all
 * of it: HMAC-SHA256 under key (the cluster token) when key_len > 0, else
 * SHA-256 (docs/fault-tolerance.md).
 * @param[out] out the bytes, malloc'd
 * @return 0, or SL_ETOOBIG / -ENOMEM with a message in err
 */
int sl__ledger_checkpoint(sl_ledger_t *l, uint64_t dataset_id, const uint8_t *key, size_t key_len, uint8_t **out,
                          size_t *len, char *err, size_t errlen);

/**
 * Reads a checkpoint: checks its tag under key (a MAC with a cluster token,
 * a SHA-256 checksum without) before anything else, its header (and that
 * it is of dataset_id), and turns its positions into posset bytes (version
 * 1 holds them as they are), which the restore sends the dispatcher; at
 * most max_runs runs. Versions 1 and 2 (no tag) are read only without a
 * key; versions 1 to 3 hold no epochs_done (0).
 * @param[out] posset the bytes, malloc'd
 * @param[out] epochs_done every epoch below it was consumed whole
 * @param[out] at where its record starts: (epochs_done, file, record) of
 *   a version 5 checkpoint, else (epochs_done, 0, 0); NULL refuses a
 *   version 5 one (SL_EINVAL: a reader that cannot start within an epoch)
 * @return 0, or SL_EDATA / SL_EINVAL / SL_ETOOBIG / -ENOMEM with a message in err
 */
int sl__checkpoint_read(const uint8_t *ckpt, size_t len, uint64_t dataset_id, const uint8_t *key, size_t key_len,
                        size_t max_runs, uint8_t **posset, size_t *posset_len, uint64_t *epochs_done,
                        sl_posrun_t *at, char *err, size_t errlen);

/**
 * Merges the checkpoints of several iterators of one named job (its ranks,
 * stopped at a common step) into one: the union of their positions, which
 * is what the job's callers were given. Each is checked as
 * sl__checkpoint_read() does (its tag under key); they must be of one
 * dataset. The result starts at the furthest place of them (epochs_done,
 * and a version 5 one's place within it: a named job's client folds only
 * what every client of the job was given) and holds their positions past
 * it; a version 4 or 5 checkpoint tagged under key.
 * @param[out] out the bytes, malloc'd
 * @return 0, or SL_EDATA / SL_EINVAL / SL_ETOOBIG / -ENOMEM with a message in err
 */
int sl__checkpoint_merge(const uint8_t *const *ckpts, const size_t *lens, size_t n, const uint8_t *key,
                         size_t key_len, size_t max_runs, uint8_t **out, size_t *out_len, char *err, size_t errlen);

#endif
