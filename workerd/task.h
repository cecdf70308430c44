/*
 * task.h: the worker's task runner. A task runs its pipeline on a thread of
 * its own and keeps a bounded buffer of finished batches; the network thread
 * takes batches out to serve them and feeds DYNAMIC splits in. A full buffer
 * stops the pipeline (backpressure); memory never grows with a slow client.
 *
 * Every function here but sl_task_new()'s pipeline thread is called from the
 * network thread. The task tells that thread that something changed (a
 * batch is ready, splits are wanted, the pipeline ended) through the notify
 * callback, which runs on the network thread's event loop.
 */
#ifndef SL_TASK_H
#define SL_TASK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>

#include "batch.h"
#include "confine.h"
#include "frame.h"
#include "pipeline.h"
#include "reader.h"
#include "posset.h"
#include "spec.h"
#include "split_track.h"

/* The most pipeline stages sl_task_info() reports: the source and every op,
 * with room for iterators an op adds of its own. */
#define SL_TASK_MAX_STAGES (2 * SL_SPEC_MAX_OPS + 2)
/* Runs of excluded positions a task takes: as many as a dispatcher keeps. */
#define SL_TASK_MAX_EXCLUDE_RUNS SL_POSSET_MAX_RUNS

typedef struct sl_task sl_task_t;
struct sl_shm_region;

typedef void (*sl_task_notify_fn)(sl_task_t *task, void *arg);

typedef struct sl_task_config {
    size_t buffer_bytes;    /* finished batches held before the pipeline waits */
    unsigned buffer_batches; /* and at most this many */
    size_t max_batch_bytes; /* the largest batch the pipeline may make */
    unsigned split_prefetch; /* DYNAMIC splits kept ahead of the pipeline */
    unsigned split_target_ms; /* DYNAMIC: how long a split should take the pipeline (the
                                 length it asks for: its measured rate times this; 0: the
                                 dispatcher's --split-size) */
    const sl_confine_t *roots; /* where file sources may read (--data-root); NULL: nowhere.
                                  Must outlive every task. */
    sl_io_engine_t io_engine;  /* how file sources read (--io-engine) */
    struct sl_plugins *plugins; /* --plugin-dir's registry, shared by every task; NULL: no
                                   plugins. Must outlive every task. */
    unsigned threads;          /* threads per task for parallel ops, its pipeline thread included (--threads) */
    sl_cache_env_t *cache;     /* what cache ops share (--cache-mb, --cache-dir); NULL: per pipeline */
    sl_membudget_t *mem;       /* the worker's memory budget (--max-memory-mb), shared by every
                                  task: its pipeline charges what it holds, the task its
                                  finished batches; NULL: no limit. Must outlive every task. */
} sl_task_config_t;

/**
 * Parses the task's dataset spec, builds its pipeline and starts its thread.
 * That thread activates an event on base (the notify callback), so base
 * must be made after evthread_use_pthreads(), as workerd's is. A pipeline
 * that cannot be built for this worker (a file pattern outside
 * its data roots or matching nothing here, an op whose component is
 * missing) still gives a task: one that is FAILED from the start, with the
 * reason as its error, so that the dispatcher and the clients hear it.
 * @param[in] spec_json the canonical spec, len bytes (copied)
 * @param[in] exclude static policies (def->exclusions): the positions the
 *            pipeline must not yield, a position set's bytes (posset.h,
 *            GET_EXCLUSIONS); NULL otherwise
 * @param[out] out the task, freed by sl_task_free()
 * @return 0; SL_ESPEC with a message in err; SL_EDATA (exclude is damaged);
 *         -ENOMEM; -errno
 */
int sl_task_new(struct event_base *base, const sluice_TaskDef *def, const char *spec_json, size_t len,
                const uint8_t *exclude, size_t exclude_len, const sl_task_config_t *cfg, sl_task_notify_fn notify,
                void *arg, sl_task_t **out, char *err, size_t errlen);

/** Stops the pipeline thread, frees buffered batches and the task. */
void sl_task_free(sl_task_t *task);

/* The most consumers a task of coordinated reads serves (rounds.h). */
#define SL_TASK_MAX_CONSUMERS 1024

/**
 * Shared memory (shm.h): client_id reads the task on a connection whose
 * region r its client mapped. The task's next batch blocks of
 * SL_PIPELINE_LEND_MIN bytes or more are made in r when they can be, so
 * that serving them to that connection copies nothing: r is the task's
 * region from now on (a reference), in place of the one before. Only while
 * the task has had one client: a second client's request ends it for good
 * (a region's client can read every block made in it, and write into its
 * mapping: another client's batches are never made there). A task of
 * coordinated reads (num_consumers in its def) keeps a region per consumer
 * instead, consumer (its request's consumer_index; -1 for none) naming
 * which: its k-th batch, which round k / num_consumers gives consumer k mod
 * num_consumers (rounds.h), is made in that consumer's region, when the
 * ops after the pipeline's last batch keep its outputs in order
 * (sl_pipeline_opts_t.block_alloc); a second client for one consumer index
 * ends it for good, as above. Blocks made before keep their region until
 * they are freed.
 */
void sl_task_lend_region(sl_task_t *task, struct sl_shm_region *r, uint64_t client_id, int64_t consumer);
/** The connection of r closes: the task makes no more blocks in it. */
void sl_task_unlend_region(sl_task_t *task, struct sl_shm_region *r);

/**
 * Coordinated reads: the consumer in whose region batch b was made (its
 * tensor bytes lie in a region sl_task_lend_region() gave for that consumer
 * index), looked for at guess first; -1 when in none. Any thread.
 */
int64_t sl_task_lent_to(sl_task_t *task, const sl_wire_batch_t *b, uint32_t guess);

uint64_t sl_task_id(const sl_task_t *task);

/**
 * The count of bytes held for the task's clients: its buffered and taken
 * batches, to which the worker adds what it holds of them until its
 * clients acknowledge them (sl_holders_count_own()). Updated atomically;
 * while not 0 a charge of the task's pipeline that finds the memory budget
 * full waits on rather than fails (sl_memwait_t.own). Lives as the task.
 */
size_t *sl_task_own_bytes(sl_task_t *task);
uint64_t sl_task_job_id(const sl_task_t *task);
uint64_t sl_task_dataset_id(const sl_task_t *task);

/** @return the pipeline's measured rate through its DYNAMIC splits
 *  (records/s), 0 until it has one. Any thread. */
double sl_task_split_rate(sl_task_t *task);

/**
 * Starts a DYNAMIC task that has no rate yet at records_per_s (what an
 * earlier task of its dataset measured on this worker): its first split
 * request then asks for splits of the target length, not the least, and
 * the pipeline does not wait for a second hand-out a few batches in. Its
 * own measure takes over from its first window. Any thread; does nothing
 * once the task has a rate, or for records_per_s <= 0.
 */
void sl_task_seed_split_rate(sl_task_t *task, double records_per_s);

enum sl_task_take {
    SL_TASK_BATCH = 0,   /* *out is a batch, owned by the caller */
    SL_TASK_END = 1,     /* end of sequence: no batch will come */
    SL_TASK_PENDING = 2, /* none ready yet: the notify callback fires when one is */
};

/**
 * Takes the next finished batch. Frees room in the buffer once the caller
 * reports it gone with sl_task_release().
 * @return enum sl_task_take, or the pipeline's error code (negative) with
 *         sl_task_errmsg() saying why
 */
int sl_task_take(sl_task_t *task, sl_wire_batch_t **out);

/**
 * sl_task_take() for a request that must not wait on batches others took
 * and hold (a coordinated read's stand-in, worker.c: the task's rounds may
 * hold its buffer for a consumer that waits on this request): when none is
 * ready, the pipeline makes its next batch now. One that waits for room,
 * which it otherwise does until the buffer drains to half, goes on, past
 * the buffer's bytes if need be (one batch per call that found none; the
 * ring's count and the worker's memory budget still bound it).
 */
int sl_task_take_extra(sl_task_t *task, sl_wire_batch_t **out);

/** Whether a sl_task_take_extra() found no batch and the pipeline has not
 *  made one since: its split requests say so (GetSplitRequest.for_extra). */
bool sl_task_extra_wanted(sl_task_t *task);

/** The caller is done with batch b it took (sent or dropped; call it before
 *  freeing b): its room goes back, as much as it was charged when buffered
 *  (sl_wire_batch_t.charged: its tensors and provenance). The notify
 *  callback runs afterwards from the loop, never inside this call. */
void sl_task_release(sl_task_t *task, const sl_wire_batch_t *b);

/**
 * A holder of taken batch b, sent and kept until its client acknowledges
 * it (held.h), took over bytes (at most b->charged) of the task's charge to
 * the memory budget: the holder gives them back when it lets b go, and
 * sl_task_release() and the task's end give back only the rest. The room b
 * takes in the task's buffer is still given back by sl_task_release().
 */
void sl_task_hand_over(sl_task_t *task, sl_wire_batch_t *b, size_t bytes);

/**
 * Says how the task's consumers read provenance, as the latest request for
 * a batch asked (GetElementRequest.provenance and dense_provenance): the
 * producer's thread encodes each new batch's provenance in that form
 * (docs/architecture.md). Any thread.
 */
void sl_task_prov_form(sl_task_t *task, bool provenance, bool dense);

/** @return the pipeline's error message, or "" */
const char *sl_task_errmsg(sl_task_t *task);

/**
 * Reports the task as its worker tells the dispatcher: RUNNING, DONE (end of
 * sequence and every batch taken and released) or FAILED.
 */
void sl_task_status(sl_task_t *task, sluice_TaskStatus *out);

/** Of the batches taken and not released, n wait for the task's next ones,
 *  not for a client: a coordinated round's that is not full yet
 *  (sl_rounds_unfilled()). A task whose pipeline waits for a split with
 *  none other taken reports itself starved (TaskStatus.starved). */
void sl_task_set_unfilled(sl_task_t *task, unsigned n);

/** @return the state sl_task_status() reports (sl_task_state_t), without the rest */
int sl_task_state(sl_task_t *task);

/** What GET /v1/tasks shows of a task. */
typedef struct sl_task_info {
    uint64_t task_id, job_id;
    sl_sharding_t sharding;
    int state;                 /* sl_task_state_t */
    uint64_t batches_produced; /* by the pipeline */
    uint64_t batches_served, elements_served, bytes_served;
    unsigned buffered_batches; /* finished, not yet taken */
    size_t buffered_bytes;     /* held: buffered, and taken but not yet written; a batch
                                  counts with its provenance (sl_wire_batch_held_bytes()) */
    size_t memory_bytes;       /* its share of the worker's memory budget (pipeline and
                                  buffer; batches held for a reconnect not counted) */
    bool buffer_full;          /* the pipeline waits for room in the buffer */
    bool budget_wait;          /* its finished batch waits for the memory budget (its own batches give it back) */
    unsigned buffer_capacity_batches;
    size_t buffer_capacity_bytes;
    double pipeline_seconds;   /* time spent in the pipeline making batches */
    double split_wait_seconds; /* DYNAMIC: of that, waiting for the dispatcher's splits */
    double split_rate;         /* DYNAMIC: records/s through its splits (sl_task_split_rate()) */
    uint64_t records_skipped;  /* corrupt records skipped (tfrecord, on_corrupt "skip") */
    int num_stages;            /* time per pipeline stage, source first (0 when the
                                  pipeline could not be built) */
    sl_pipeline_op_stats_t stages[SL_TASK_MAX_STAGES];
} sl_task_info_t;

void sl_task_info(sl_task_t *task, sl_task_info_t *out);

/**
 * DYNAMIC: whether the task wants more splits now.
 * @param[out] epoch the epoch to ask for
 * @param[out] max how many to ask for
 * @param[out] seq the request's request_seq: one more than the last answered
 *             request's, the same again after a failed request, so that the
 *             dispatcher answers a repeated request with the same splits
 * @param[out] records the split length to ask for: the pipeline's measured
 *             rate through its splits times split_target_ms; 0 before it
 *             was measured
 * @return true when a request should go out; the caller then calls
 *         sl_task_splits_arrived() or sl_task_splits_failed() exactly once
 */
bool sl_task_want_splits(sl_task_t *task, uint64_t *epoch, uint32_t *max, uint64_t *seq, uint64_t *records);

/**
 * DYNAMIC: how long, in seconds, the pipeline has waited for a split while
 * no split request is out and no wait the dispatcher asked for is pending:
 * 0 when it does not wait or a request or a retry will wake it. Past a
 * moment, a wake-up was lost (the network thread only; the worker asks
 * again at each heartbeat tick, sl_task_want_splits() willing).
 */
double sl_task_split_wait_unasked(sl_task_t *task);

/**
 * DYNAMIC: what a split request says of the task's splits
 * (GetSplitRequest.slack_ms, records_per_second): *slack_ms, how long the
 * splits it has queued, and what is left of the one its pipeline reads
 * (its length at the rate, less the time since it took it), last at its
 * measured rate, in ms, at most UINT32_MAX (0 when it has none or no rate
 * is known); *records_per_second, that rate once measured over a few
 * windows of its reading or seeded from a task of the dataset before (0
 * until then).
 */
void sl_task_split_report(sl_task_t *task, uint32_t *slack_ms, uint64_t *records_per_second);

/** DYNAMIC, network thread: whether the task waits as the dispatcher asked
 *  before its next split request (GetSplitResponse.retry_ms). */
bool sl_task_split_waits(sl_task_t *task);

/** DYNAMIC, network thread: one past the largest split id the task was
 *  given: no batch served now holds a record of a split at or past it. */
uint64_t sl_task_split_ceiling(sl_task_t *task);

/** DYNAMIC, network thread: whether the task's clients are to acknowledge
 *  its batches at once (GetElementResponse.ack_at_once): the dispatcher's
 *  last answer left it at --max-outstanding-splits (GetSplitResponse.
 *  at_bound), or it waits before it asks again (a dispatcher before
 *  at_bound holds it there so). */
bool sl_task_acks_wanted(sl_task_t *task);

/** DYNAMIC, network thread: the wait the dispatcher asked for before the
 *  next split request (GetSplitResponse.retry_ms) ends now; the task asks
 *  from the loop as at the wait's end. @return whether it was waiting */
bool sl_task_retry_now(sl_task_t *task);

/** DYNAMIC: every split of the task with a smaller id is done, its records
 *  sent (TaskStatus.done_below); 0 without provenance tracking. */
uint64_t sl_task_done_below(sl_task_t *task);

/** DYNAMIC: the dispatcher's answer to the request sl_task_want_splits() asked for. */
void sl_task_splits_arrived(sl_task_t *task, const sluice_GetSplitResponse *resp);

/**
 * Reads split s's skip runs from a GetSplit answer's payload (len bytes):
 * s->skip_count runs of (u64 begin, u64 count), little-endian, at
 * s->skip_offset, each of count >= 1, sorted, disjoint and inside
 * [s->begin, s->end).
 * @param[out] out the runs (malloc'd; NULL when there are none)
 * @return 0; SL_EPROTO (runs outside the payload, empty, out of order,
 *         overlapping or outside the split) or -ENOMEM with a message in err
 */
int sl_task_read_skips(const sluice_Split *s, const uint8_t *payload, size_t len, sl_skip_run_t **out, char *err,
                       size_t errlen);

/** DYNAMIC: the same with the frame's payload, where the splits' skip
 *  runs lie (sluice.proto's Split); runs outside it or not sorted, disjoint
 *  and inside their split fail the task with SL_EPROTO. */
void sl_task_splits_arrived_payload(sl_task_t *task, const sluice_GetSplitResponse *resp, const uint8_t *payload,
                                    size_t len);

/**
 * A batch the task gave out (sl_task_take) is handed to a client connection
 * now (b NULL: no batch, an end-of-sequence frame): its records settle, and
 * the splits that are done with that are taken out of the task's table,
 * all of them: a frame carries every notice that is ready.
 * @param[out] out the done splits, malloc'd (the caller frees them), NULL
 *             for none
 * @param[out] num how many
 * @param[out] done_below every split with a smaller id is done and went out
 *             with this frame or before (GetElementResponse.done_below)
 * @return 0, or -ENOMEM: nothing was taken out, and for an end-of-sequence
 *         frame the task is not done (its notices are still to be sent)
 */
int sl_task_batch_sent(sl_task_t *task, const sl_wire_batch_t *b, sl_split_done_rec_t **out, unsigned *num,
                       uint64_t *done_below);

/** The same for a frame with neither a batch nor an end: a progress answer
 *  (GetElementRequest.progress), which takes out every notice that is ready
 *  and says how far the task's splits are done. */
int sl_task_progress_sent(sl_task_t *task, sl_split_done_rec_t **out, unsigned *num, uint64_t *below);

/** DYNAMIC: the split request failed: the request may be retried (retry)
 *  or the task fails with code and msg. */
void sl_task_splits_failed(sl_task_t *task, bool retry, int code, const char *msg);

#endif
