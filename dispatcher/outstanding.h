/*
 * outstanding.h: DYNAMIC splits exactly once across a worker loss, for the
 * state machine (state.c) only.
 *
 * Every split handed out stays outstanding at its task until each client
 * that reads the task said it reached it whole (TaskProgress.done_below,
 * from the batches' done_below). When the task's worker is lost, its
 * outstanding splits become orphans (AWAIT) and the job's report_gen grows:
 * each client drops the lost task and reports the positions it received.
 * Once every client did, the orphans are QUEUED and handed out again
 * before any new split, with what was received as skip runs. A task that
 * ended without ever getting some of its splits (an answer it never read)
 * has them QUEUED at once: nobody can have any of their records.
 */
#ifndef SL_DOUTSTANDING_H
#define SL_DOUTSTANDING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "state_types.h"

/** Whether the job keeps outstanding splits (DYNAMIC, coordinated reads too). */
bool sl__out_tracked(const struct job *j);

/**
 * Records split s as handed to t; skips are its s->skip_count skip runs
 * (16 bytes each, docs/protocol.md), or NULL.
 * @return 0 or -ENOMEM (then nothing is recorded)
 */
int sl__out_add(sl_dstate_t *st, struct job *j, struct task *t, const sluice_Split *s, const uint8_t *skips);

/**
 * @return the units (posbits.h) of what the consumers have of a split of
 * [begin, end): as runs, half its records rounded up at most; as bitmaps
 * where a rank's scattered share crowds them, 22 for each block of 4096
 * records it reaches into
 */
static inline size_t sl__out_have_units(uint64_t begin, uint64_t end)
{
    uint64_t len = end - begin;
    return (size_t)(len / 2 + 1 + (len / SL_POSBITS_BLOCK + 2) * SL_POSBITS_BLOCK_UNITS);
}

/** @return how many splits t holds outstanding */
unsigned sl__out_count(const struct task *t);

/** @return how many splits t holds outstanding that --max-outstanding-splits
 *  bounds: all but those of records given back (a split a run, bounded by
 *  what the leaving clients held: their windows, and --max-exclude-runs) */
unsigned sl__out_bounded(const struct task *t);

/** @return the smallest id of t's outstanding splits, UINT64_MAX for none */
uint64_t sl__out_oldest(const struct task *t);

/** Whether the job has orphans, or (with clients) outstanding splits. */
bool sl__out_pending(const struct job *j);

/** A client said how far each task's splits reached it (n of them; c may
 *  be NULL when n is 0: a client left): every split that reached every
 *  client reading its task (away and stalled clients aside) is no longer
 *  outstanding. @return whether c's progress grew */
bool sl__out_progress(sl_dstate_t *st, struct job *j, struct client *c, const sluice_TaskProgress *p, unsigned n);

/** t's worker said every split below req->received_below reached the
 *  clients it went to, and every split from req->lost_below up to
 *  req->received_past_lost too (GetSplitRequest): those below the first
 *  are no longer outstanding, whatever its clients said; those past
 *  lost_below once its clients said they have every split below it. */
void sl__out_received(sl_dstate_t *st, struct job *j, struct task *t, const sluice_GetSplitRequest *req);

/** What client c is to ask task t's worker about (TaskInfo.probe_below):
 *  t holds --max-outstanding-splits splits, or is done, its worker said
 *  (its last heartbeat) that those below worker_done_below are done, past
 *  the oldest it holds, and c, neither away nor stalled, said less.
 *  @return that done_below, 0 for none */
uint64_t sl__out_probe_below(const sl_dstate_t *st, const struct task *t, const struct client *c);

/** Whether client c holds splits back from its peers: a task it reads has
 *  an outstanding split its progress has not passed. */
bool sl__out_holds_back(const struct job *j, const struct client *c);

/** Task t's worker was lost, or its task of coordinated reads was let go
 *  after a drain: its outstanding splits wait for the clients' reports (a
 *  new report generation). */
void sl__out_orphan(sl_dstate_t *st, struct job *j, struct task *t);

/** Task t ended without ever getting its splits from id below on: they are
 *  queued to be handed out again at once. */
void sl__out_unreceived(sl_dstate_t *st, struct job *j, struct task *t, uint64_t below);

/**
 * A client's answer to report generation req->report_gen: payload is a
 * position set (posset.h bytes) of what it received.
 * @return 0 (an answer for an older generation is taken and ignored),
 *         SL_EDATA with what was wrong in err, -ENOMEM
 */
int sl__out_report(sl_dstate_t *st, struct job *j, struct client *c, const sluice_ReportReceivedRequest *req,
                   const uint8_t *payload, size_t len, char *err, size_t errlen);

/**
 * Client c of job j leaves and gives back what it received and its caller
 * was not given: payload is a position set (posset.h bytes) of every
 * record it received (received_len bytes; 0: it did not say), then one of
 * those it gives back. These are checked first, each within the dataset's
 * files, at or past `floor` (the job's fold with c in it: the place before
 * which every record was given) and before the hand-out cursor, and none
 * of the restore's exclusions. What it received is added to the `have` of
 * every outstanding split and lost split that holds it (it does not come
 * again from there when that split's worker is lost), and what it gives
 * back is queued as orphans of no task (0), a split per run, skipping
 * nothing: handed out again before any new split, each to a task that
 * holds no split its range meets.
 * @return 0, SL_EDATA / SL_ELIMIT with what was wrong in err (nothing is
 *         taken then), -ENOMEM
 */
int sl__out_return(sl_dstate_t *st, struct job *j, const struct client *c, struct sl_place floor,
                   const uint8_t *payload, size_t len, size_t received_len, char *err, size_t errlen);


/** Queues the orphans waiting for reports once every client of the job
 *  answered. @return true when there are queued orphans */
bool sl__out_check_reports(sl_dstate_t *st, struct job *j);

/** The smallest epoch of an orphan waiting for reports (what clients report from). */
uint64_t sl__out_report_from(const struct job *j);

/**
 * The epoch below which every record reached every client of the job: no
 * split of those epochs is left to hand out, outstanding at a task or
 * orphaned (ClientHeartbeatResponse.epochs_done). Only grows: later splits,
 * and orphans handed out again, are of that epoch or later. 0 for a job
 * that keeps no outstanding splits, or that is not running.
 */
uint64_t sl__out_epochs_done(const struct job *j);

/**
 * Every record handed out before the place returned reached a client of
 * the job: the least split still outstanding at a task or orphaned, else
 * the hand-out cursor (GET /v1/jobs/{id} lost_splits.confirmed_below,
 * ClientHeartbeatResponse.confirmed_below). Only grows, as
 * sl__out_epochs_done() does. For a running job that keeps outstanding
 * splits.
 */
struct sl_place sl__out_confirmed_below(const struct job *j);

/** sl__out_epochs_done() of a running job whose sl__out_confirmed_below()
 *  is `at` (a caller that needs both scans once). */
uint64_t sl__out_epochs_done_at(const struct job *j, struct sl_place at);

/**
 * Whether task t, at the end of its epoch, waits for orphans rather than
 * ending: one waits for reports, or a queued one meets none of the splits
 * t holds. A queued orphan that meets one (records given back, which lie
 * among the splits a shuffle buffer holds) goes to another task: t ends
 * its epoch, which flushes its buffers, and once every task ended the job
 * gets a new one for it (state.c, job_ensure_task()).
 */
bool sl__out_waits_for(const struct job *j, const struct task *t);

/**
 * Hands out queued orphans to t: at most max splits appended to resp,
 * their skip runs appended to t's answer payload (last_skips).
 * @return 0 or -ENOMEM
 */
int sl__out_reissue(sl_dstate_t *st, struct job *j, struct task *t, sluice_GetSplitResponse *resp, unsigned max);

/** The job ended: forgets its outstanding splits and orphans, and their
 *  stored records. */
void sl__out_clear(sl_dstate_t *st, struct job *j);

/** Frees what t (a task being freed) holds. */
void sl__out_free_task(struct task *t);

/** Frees the job's orphans (a job being freed). */
void sl__out_free_job(struct job *j);

/** Frees what a client record holds (its progress). */
void sl__out_free_client(struct client *c);

#endif
