/*
 * pipeline.h: one dataset pipeline as a worker task runs it: the spec's
 * source and ops as a chain of iterators, pulled one finished batch at a
 * time (docs/dataset-spec.md says what each op does).
 *
 * A pipeline is driven by one thread at a time, and may block in it: the
 * DYNAMIC split source is called on that thread and waits for the
 * dispatcher.
 */
#ifndef SL_PIPELINE_H
#define SL_PIPELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "batch.h"
#include "confine.h"
#include "membudget.h"
#include "reader.h"
#include "spec.h"
#include "sluice.h"

struct sl_posbits;

/* The largest batch when sl_pipeline_opts_t.max_batch_bytes is 0. */
#define SL_PIPELINE_DEFAULT_MAX_BATCH_BYTES ((size_t)256 << 20)

typedef struct sl_pipeline sl_pipeline_t;

/** Records [begin, begin + count) of a split that a source skips. */
typedef struct sl_skip_run {
    uint64_t begin, count;
} sl_skip_run_t;

/** One DYNAMIC split: the records [begin, end) of file file_index of the
 *  source's file list (0-based, the files in the order the patterns expand
 *  to), or the elements [begin, end) of a range source (file_index 0). */
typedef struct sl_split {
    uint32_t file_index;
    uint64_t begin, end;
    uint64_t split_id;           /* the dispatcher's id of the split */
    const sl_skip_run_t *skips;  /* records of [begin, end) the source must not yield (a split
                                    handed out again: a consumer already has them), sorted,
                                    disjoint; owned by the split source, valid until it hears
                                    split_read for the split or the pipeline is destroyed */
    uint32_t num_skips;
    uint64_t epoch;              /* the epoch whose reading of the records this is (their
                                    provenance): set by the source to the epoch it asks for,
                                    which a split source may change (a lost worker's split of
                                    an earlier epoch, handed out again) */
} sl_split_t;

/**
 * How a source learns which elements to read under DYNAMIC sharding.
 * next_split blocks until the dispatcher answers: it returns 0 with *split
 * set, 1 when epoch `epoch` has no split left, or a negative code on error
 * (the pipeline then fails with that code). Called on the pipeline's thread.
 */
typedef struct sl_split_source {
    int (*next_split)(void *arg, uint64_t epoch, sl_split_t *split);
    void *arg;
    /* Optional (NULL: not told). The source has read all it will of split
     * (its end, or a reset moved it on) and yielded records of it. Called
     * on the pipeline's thread, once per split next_split handed out,
     * except for the splits being read when the pipeline ends. */
    void (*split_read)(void *arg, uint64_t epoch, const sl_split_t *split, uint64_t records);
    /* Optional (NULL: not told). The pipeline dropped elements whose
     * provenance is runs[0..n): a filter, skip or shard, drop_remainder, a
     * buffer discarded by a reset. Called on any of the pipeline's threads. */
    void (*dropped)(void *arg, const sl_provenance_run_t *runs, uint64_t n);
    /* Optional (NULL: never). Whether no split of any epoch will come any
     * more (the task was drained, or declared lost): a repeat then ends at
     * an iteration that yielded nothing, where it would otherwise start
     * another one just as empty, and another, without end under repeat(-1).
     * Called on the pipeline's thread as an iteration ends. */
    bool (*finished)(void *arg);
} sl_split_source_t;

/** What the cache ops of every pipeline of a worker share: the memory
 *  budget of in-memory caches (--cache-mb) and the LMDB environment of disk
 *  caches (--cache-dir). Created by the worker, outlives its pipelines. */
typedef struct sl_cache_env {
    size_t mem_limit;          /* bytes all in-memory caches may hold together */
    size_t mem_used;           /* updated atomically by the cache ops */
    struct sl_cachedb *db;     /* NULL: no --cache-dir, disk caches are refused */
    uint64_t overflows;        /* caches that gave up (atomic) */
} sl_cache_env_t;

/* The memory budget of a pipeline built without a cache env. */
#define SL_PIPELINE_DEFAULT_CACHE_BYTES ((size_t)256 << 20)
/* The least block sl_pipeline_opts_t.block_alloc is asked for: below it a
 * copy costs less than a shared block's bookkeeping. */
#define SL_PIPELINE_LEND_MIN ((size_t)64 << 10)
/* block_alloc's index when the batch's place among the outputs is not known. */
#define SL_PIPELINE_UNORDERED UINT64_MAX

/* Under DYNAMIC a forever repeat goes on through iterations that yield
 * nothing (other workers may have taken their splits); this many in a row
 * that took splits fail the pipeline with SL_EDATA instead. */
#define SL_REPEAT_EMPTY_MAX ((uint64_t)1 << 20)

typedef struct sl_pipeline_opts {
    sl_sharding_t sharding;             /* OFF: read the whole source; DYNAMIC: read only the
                                           splits next_split hands out; others: refused for now */
    sl_split_source_t splits;           /* used under DYNAMIC */
    uint32_t worker_index, num_workers; /* for the static policies, not used yet */
    size_t max_batch_bytes;             /* a larger batch fails with SL_ETOOBIG; 0: the default */
    const sl_confine_t *roots;          /* file sources read only below these (--data-root);
                                           NULL: every file source is refused. Must outlive
                                           the pipeline. */
    sl_io_engine_t io_engine;           /* how file sources read (default SL_IO_AUTO) */
    struct sl_plugins *plugins;         /* where map and filter find plugins (--plugin-dir);
                                           NULL: every plugin op is refused. Must outlive
                                           the pipeline. */
    unsigned threads;                   /* most threads for parallel ops, the pipeline's own
                                           included (--threads);
                                           0: 2; interleave's "autotune" */
    sl_cache_env_t *cache;              /* shared by the worker's pipelines; NULL: the pipeline's
                                           own, SL_PIPELINE_DEFAULT_CACHE_BYTES, no disk */
    const struct sl_posbits *exclude;   /* static policies: positions (epoch, file, record) the
                                           source must not yield, dropped before the shard (a
                                           restored iterator's job); NULL: none. Must outlive
                                           the pipeline. */
    sl_membudget_t *mem;                /* the worker's memory budget (--max-memory-mb), shared
                                           by every pipeline of the worker: shuffle, batch,
                                           prefetch and cache charge what they hold, and
                                           decode_jpeg an image while it decodes it; a charge
                                           over it fails the pipeline with SL_ETOOBIG (a cache
                                           gives up instead). NULL: no limit. Must outlive
                                           the pipeline. Shuffle's, batch's, prefetch's and
                                           decode_jpeg's charges wait for room as
                                           sl_membudget_charge_wait() does. */
    sl_memwait_t mem_wait;              /* what such a wait looks at: its cancel flag, the
                                           bytes the pipeline's owner holds for its consumer
                                           (while not 0 it waits on), and whether a charge
                                           goes past the limit ({0}: none of them) */
    void *(*block_alloc)(void *arg, size_t size, uint64_t index); /* where the pipeline's
                                           last batch (after it only prefetch, take, skip,
                                           repeat, shard: ops that pass elements on unread)
                                           makes a block of at least SL_PIPELINE_LEND_MIN bytes:
                                           memory its consumer reads in place (a worker's shared
                                           memory, workerd/shm.h), freed by sl__big_free();
                                           called on the pipeline's thread with block_arg and
                                           the batch's index among the pipeline's outputs (from
                                           0; its blocks may be asked for ahead of it, one
                                           batch's twice if the first is dropped), or
                                           SL_PIPELINE_UNORDERED when the ops after it do not
                                           keep outputs one for one (skip, shard). NULL, or NULL
                                           from it: sl__big_alloc() */
    void *block_arg;
} sl_pipeline_opts_t;

/**
 * Builds the pipeline of a parsed spec.
 * @param[in] spec the spec; only read during the call, it may be freed after
 * @param[in] opts copied; NULL means OFF sharding and the default limit
 * @param[out] out the pipeline, freed by sl_pipeline_destroy()
 * @param[out] err on failure a message saying why, naming the op
 *         ("ops[2] (resize): component \"img\" is not in its input (id, image)")
 * @return 0, SL_EINVAL (a sharding policy the pipeline does not run,
 *         DYNAMIC without next_split, an op whose input lacks a component
 *         it needs or has it of another dtype), -EACCES / -ENOENT (a file
 *         pattern outside the roots or matching nothing), -ENOMEM
 */
int sl_pipeline_create(const sl_spec_t *spec, const sl_pipeline_opts_t *opts, sl_pipeline_t **out, char *err,
                       size_t errlen);

/**
 * Runs the pipeline until its next output element and returns it as a
 * finished batch. An element made by batch has a leading batch dimension on
 * every component and num_elements is that dimension; any other element is
 * sent as it is with num_elements 1.
 * @param[out] out the batch, owned by the caller, freed by sl_wire_batch_free()
 * @return 0 with *out set; 1 at the end of the sequence (and on every later
 *         call); or an error, which every later call returns too:
 *         SL_ETOOBIG (a batch over max_batch_bytes), SL_EDATA (bad data: a
 *         corrupt record, an undecodable image, unequal shapes in a batch),
 *         SL_EPROTO (a split outside the source), -errno (a failed read),
 *         the code next_split returned, -ENOMEM;
 *         sl_pipeline_errmsg() names the op, e.g. "ops[2] (batch): ..."
 */
int sl_pipeline_next(sl_pipeline_t *p, sl_wire_batch_t **out);

/** @return the corrupt records the pipeline's source skipped so far
 *  (tfrecord with on_corrupt "skip"); call it on the pipeline's thread */
uint64_t sl_pipeline_records_skipped(const sl_pipeline_t *p);

/** @return the rows its batches found written in their blocks by the
 *  parallel stage below them (map-and-batch fusion: parallel.c), not copied */
uint64_t sl_pipeline_rows_in_place(const sl_pipeline_t *p);

/** The time one stage of the pipeline (the source or an op) took. */
typedef struct sl_pipeline_op_stats {
    char label[48];      /* "source (tfrecord)", "ops[2] (resize)" */
    uint64_t calls;      /* calls of its next (or bulk next) */
    uint64_t elements;   /* elements it yielded (rows, for a bulk call) */
    double seconds;      /* time in those calls, its inputs' included; estimated
                            from one call in 16 timed */
    double self_seconds; /* seconds less its input's: its own work, an estimate
                            (an op that waits on a thread of its own, or on the
                            dispatcher, counts the wait) */
} sl_pipeline_op_stats_t;

/**
 * Copies the time per stage, source first, into out[0..max).
 * Safe to call from any thread while the pipeline runs.
 * @return how many stages were written: min(max, the number of stages)
 */
int sl_pipeline_op_stats(const sl_pipeline_t *p, sl_pipeline_op_stats_t *out, int max);
/** A parallel stage of the pipeline (docs/dataset-spec.md, "Parallel ops"). */
typedef struct sl_pipeline_parallel_stats {
    char label[48];           /* "ops[1..5] (parallel)" */
    bool autotune;            /* an op of the stage says num_parallel_calls "autotune" */
    unsigned parallelism;     /* threads that may run its elements now, the pipeline's included */
    unsigned depth;           /* elements it may keep in flight now */
    unsigned min_parallelism, max_parallelism; /* the least and most parallelism it had so far */
    unsigned bound;           /* the most it may have: min(--threads, the largest num_parallel_calls),
                                 or with autotune min(--threads, the worker's CPUs) at the last decision */
    uint64_t decisions;       /* autotune decisions made so far */
} sl_pipeline_parallel_stats_t;

/**
 * Copies what the pipeline's parallel stages run with, first stage (nearest
 * the source) last, into out[0..max). Safe to call from any thread while the
 * pipeline runs.
 * @return how many stages were written: min(max, the number of stages)
 */
int sl_pipeline_parallel_stats(const sl_pipeline_t *p, sl_pipeline_parallel_stats_t *out, int max);

/** @return the files the pipeline opened so far (file sources, interleave);
 *  a cached epoch opens none. Call it on the pipeline's thread. */
uint64_t sl_pipeline_files_opened(const sl_pipeline_t *p);

/** @return the cache ops of this pipeline that gave up caching because
 *  their cache would have exceeded its bound; call it on the pipeline's thread */
uint64_t sl_pipeline_cache_overflows(const sl_pipeline_t *p);

/** @return the message of the pipeline's failure, or ""; valid until sl_pipeline_destroy() */
const char *sl_pipeline_errmsg(const sl_pipeline_t *p);

/** Frees the pipeline and every element it still holds; NULL is ignored. */
void sl_pipeline_destroy(sl_pipeline_t *p);

#endif
