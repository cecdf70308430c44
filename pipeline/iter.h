/*
 * iter.h: the iterator interface inside a pipeline (private to workerd/).
 *
 * A pipeline is a chain of iterators, the source first, each op pulling
 * from the one before it (its input), as in tf.data. pipeline.c builds the
 * chain and owns what the iterators share. The families:
 *   sources.c        range
 *   sources_files.c  tfrecord, text_lines, fixed_length_records
 *   ops_basic.c      ops that only move elements: shuffle, take, skip,
 *                    repeat, shard
 *   ops_batch.c      batch, padded_batch
 *   ops_example.c    parse_example
 *   ops_image.c      decode_jpeg, resize, random_crop, center_crop,
 *                    random_flip, normalize, cast
 *   ops_map.c        map, filter (plugins: plugin.h)
 *   parallel.c       parallel stages of element-wise ops (num_parallel_calls)
 *   ops_interleave.c interleave (over the files of a file source)
 *   ops_prefetch.c   prefetch
 *   ops_cache.c      cache (in memory, or on disk through storage/cachedb.h)
 * A new op family is a new file with its constructors declared here and a
 * row in pipeline.c's table.
 */
#ifndef SL_ITER_H
#define SL_ITER_H

#include <stdbool.h>
#include <stdint.h>

#include "element.h"
#include "pipeline.h"
#include "spec.h"

typedef struct sl_iter sl_iter_t;

/* What the iterators of one pipeline share. */
typedef struct sl_iter_ctx {
    sl_pipeline_opts_t opts;  /* max_batch_bytes is never 0 here */
    uint64_t split_requests;  /* next_split calls so far; repeat reads it */
    uint64_t records_skipped; /* corrupt records a source skipped (on_corrupt "skip") */
    uint64_t rows_in_place;   /* rows a batch found written in its block (map-and-batch fusion) */
    char errmsg[1024];        /* the first failure, "label: why" */
    struct sl_pool *pool;     /* the pipeline's threads for parallel stages (parallel.c); NULL: none */
    uint64_t files_opened;    /* files the file sources and interleave opened */
    uint64_t cache_overflows; /* cache ops that gave up caching (over their bound) */
    const sl_spec_t *spec;    /* the spec, while the pipeline is built only; else NULL */
    sl_provenance_run_t bulk_prov; /* the rows of the last next_bulk that returned 0 (iter.h) */
    sl_iter_t *par_stages[SL_SPEC_MAX_OPS]; /* the parallel stages (parallel.c), owned by the chain */
    int num_par_stages;
} sl_iter_ctx_t;

typedef struct sl_iter_vtbl {
    /* Yields the next element into out, an empty element of the
     * iterator's spec.num_components. Returns 0 with out filled (the caller
     * owns what it holds), 1 at the end of the sequence (again on every
     * later call until reset), or a negative code with ctx->errmsg set;
     * out is left empty unless 0 is returned. */
    int (*next)(sl_iter_t *it, sl_element_t *out);
    /* Starts the sequence over, as tf.data re-creating an iterator does:
     * drops what the iterator holds and resets its input. A source moves
     * on to its next epoch. */
    int (*reset)(sl_iter_t *it);
    /* Frees what the iterator holds and the iterator, not its input. */
    void (*destroy)(sl_iter_t *it);
} sl_iter_vtbl_t;

/*
 * The bulk path, an optional method of an iterator whose elements are all
 * alike: every element it yields has, for each component, the same dtype,
 * shape and size (a fixed-size scalar or dense tensor, never bytes), so a
 * consumer can learn the layout from one element taken with next() and then
 * take the following elements as raw rows, with no sl_element_t in between.
 * batch uses it to fill its block at memory speed.
 *
 * next_bulk yields the same elements next() would, in the same order and
 * with the same side effects (split requests, counts), only without the
 * element: it writes up to max_rows (>= 1) of them, component c of the i-th
 * into dst[c] + i * size_c, where size_c is the bytes of component c of
 * every element. It returns 0 with *rows in [1, max_rows] (fewer than asked
 * is normal, e.g. at the end of a DYNAMIC split: ask again), 1 at the end of
 * the sequence, or a negative code with ctx->errmsg set; *rows is 0 unless 0
 * is returned. It may use the dst rows past *rows as scratch (skip does), up
 * to max_rows. next() and next_bulk may be mixed freely, and reset() starts
 * both over.
 *
 * Whether an op can offer it depends on its input (take, skip and repeat
 * forward it when their input has it), so it sits in the head, not the
 * vtable: NULL when not offered, which sl__iter_init sets.
 */
/* Provenance on the bulk path: the rows of one next_bulk call are always
 * consecutive records of one file (a source stops a call at the end of a
 * split and before a skip run), and after a call that returned 0,
 * ctx->bulk_prov is their one run. An op that passes rows through leaves
 * it; one that drops leading rows (skip) moves its begin. */
typedef int (*sl_iter_bulk_fn)(sl_iter_t *it, uint8_t *const *dst, uint64_t max_rows, uint64_t *rows);

/* The head of every iterator; each kind embeds it as its first member. */
struct sl_iter {
    const sl_iter_vtbl_t *vt;
    sl_iter_bulk_fn next_bulk; /* optional, see above; NULL when not offered */
    sl_iter_t *input;          /* owned; NULL for a source */
    sl_iter_ctx_t *ctx;        /* the pipeline's, outlives the iterator */
    char label[48];            /* "ops[2] (batch)", "source (range)" for messages */
    sl_element_spec_t spec;    /* what next() yields */
    /* Element-wise ops (see sl_iter_elem_t below); sl__iter_init clears them. */
    const struct sl_iter_elem *elem; /* the per-element method, or NULL */
    int64_t par_calls;               /* num_parallel_calls, resolved: 0 runs in next() */
    bool autotune;                   /* num_parallel_calls "autotune" (par_calls is then --threads) */
    bool deterministic;              /* a parallel stage keeps the order */
    /* Map-and-batch fusion (parallel.c): an iterator that takes its input's
     * elements into rows of memory of its own says where the element of
     * ordinal n (since the last reset) of its input goes: component *c,
     * at *p, *size bytes; false for none. NULL: it offers none. Called on
     * the pipeline's thread. dest_stage: the parallel stage that asks it
     * (set by the stage's build), which it detaches before its rows go. */
    bool (*dest)(sl_iter_t *it, uint64_t n, uint32_t *c, uint8_t **p, size_t *size);
    sl_iter_t *dest_stage;
};

/*
 * The per-element method of an element-wise op (parse_example, the image
 * ops, cast, map, filter): what next() does to one element, without the
 * pulling, so that parallel.c can run it on pool threads for several
 * elements at once (num_parallel_calls) and fuse adjacent element-wise ops
 * into one parallel stage.
 *
 * apply gets el, an element of the op's input spec in a slot with room for
 * SL_MAX_COMPONENTS values, and the element's ordinal (its index in the
 * op's input sequence since the last reset, which seeded random ops draw
 * from). It returns 0 with el turned into an element of the op's spec
 * (num_components set), 1 when the op drops the element (a filter; el left
 * empty), or a negative code with the reason recorded through
 * sl__iter_fail() (el left empty). apply runs on several threads at once:
 * it may only read the iterator, and keeps what it must change per call in
 * local (one per thread, made by local_new, NULL when local_new is NULL).
 * next() calls apply on the pipeline's thread with a local of its own.
 */
typedef struct sl_iter_elem {
    int (*apply)(sl_iter_t *it, void *local, uint64_t ordinal, sl_element_t *el);
    int (*local_new)(sl_iter_t *it, void **local); /* optional; 0 or -ENOMEM */
    void (*local_free)(sl_iter_t *it, void *local);
    bool drops; /* may return 1: ends a fused stage (ordinals stay those of each op's input) */
} sl_iter_elem_t;

/* On a pool thread, where sl__iter_fail() records a failure instead of
 * ctx->errmsg (a buffer of SL_ITER_ERRBUF bytes per element, so that
 * errors surface in order); NULL on the pipeline's thread. */
#define SL_ITER_ERRBUF 1024
extern _Thread_local char *sl__iter_errbuf;

/* A per-element generator state for the random ops: the seed of element
 * ordinal of epoch epoch of an op seeded with seed, the same whichever
 * thread draws it. */
uint64_t sl__element_seed(uint64_t seed, uint64_t epoch, uint64_t ordinal);

/* parallel.c: records an op's num_parallel_calls and deterministic on its
 * iterator (autotune: opts.threads, the most a stage may choose; see
 * autotune.h); then, once the chain is built,
 * replaces every run of adjacent element-wise ops with parallelism by one
 * parallel stage on the pipeline's pool (made here, opts.threads - 1
 * threads at most: the pipeline thread works too). *top is updated. 0,
 * -ENOMEM or -errno with ctx->errmsg set. */
void sl__parallel_opts(sl_iter_t *it, const sl_spec_op_t *op, const sl_iter_ctx_t *ctx);
int sl__parallel_build(sl_iter_ctx_t *ctx, sl_iter_t **top);
/* What sl_pipeline_parallel_stats() returns. */
int sl__parallel_stats(const sl_iter_ctx_t *ctx, sl_pipeline_parallel_stats_t *out, int max);
/* The stage's consumer (sl_iter_t.dest) lets its rows go: the stage's
 * elements in flight are dropped and it offers no more rows. */
void sl__parallel_detach(sl_iter_t *stage);
/* Stops and frees ctx->pool, after every iterator is destroyed. */
void sl__parallel_pool_destroy(sl_iter_ctx_t *ctx);

/* Fills in an iterator's head, without a bulk method; its spec is its
 * input's (a source sets its own). */
void sl__iter_init(sl_iter_t *it, const sl_iter_vtbl_t *vt, sl_iter_t *input, sl_iter_ctx_t *ctx,
                   const char *label);

/* Records the iterator's failure as "label: message" unless an earlier one
 * was recorded, and returns code. */
int sl__iter_fail(sl_iter_t *it, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Charges bytes that the iterator is about to hold to a, an account of the
 * pipeline's memory budget (opts.mem). Returns 0, or SL_ETOOBIG with the
 * refusal recorded as its failure: "label: needs N bytes for WHAT, but the
 * worker's memory budget of L bytes has F bytes left (--max-memory-mb)",
 * WHAT formatted from fmt (only then). Any thread. */
int sl__iter_charge(sl_iter_t *it, sl_memacct_t *a, size_t bytes, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Records a constructor's failure as "label: message" (the pipeline is not
 * built) and returns code. */
int sl__ctx_fail(sl_iter_ctx_t *ctx, int code, const char *label, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Destroys it and its inputs; NULL is ignored. */
void sl__iter_destroy(sl_iter_t *it);

/* The index of the component named name in spec, or -1. */
int sl__spec_find(const sl_element_spec_t *spec, const char *name);

/* Writes "a, b, c", the names of spec's components, for messages. */
void sl__spec_names(const sl_element_spec_t *spec, char *buf, size_t buflen);

/* Writes "[2, 3]" for messages. */
void sl__shape_str(const int64_t *shape, int rank, char *buf, size_t buflen);

/* Random numbers for ops that draw them (shuffle, random_crop,
 * random_flip): a seed for an op without one, different for every
 * pipeline, as tf.data draws one per iterator; and the seed of epoch e (the
 * e-th reset) of an op seeded with seed, so that each epoch draws anew and
 * every run with the same seed draws the same. */
uint64_t sl__random_seed(const void *salt);
uint64_t sl__epoch_seed(uint64_t seed, uint64_t epoch);

/* Converts n values of dtype from at src into dtype to at dst (any
 * dtypes but bytes; dst may not overlap src). Floats to integers round
 * half to even and saturate, NaN becomes 0; anything to bool is "not 0". */
void sl__cast_values(sl_dtype_t from, const void *src, size_t n, sl_dtype_t to, void *dst);

/* Constructors. A source starts the chain; an op takes over input on
 * success only. Each returns 0 with *out the new iterator labelled label
 * (copied), -ENOMEM, or another code with the reason in ctx->errmsg (a
 * component the op needs is missing or of another dtype, a file pattern
 * matches nothing). */
int sl__source_range_create(const sl_spec_t *spec, sl_iter_ctx_t *ctx, const char *label, sl_iter_t **out);
int sl__source_files_create(const sl_spec_t *spec, sl_iter_ctx_t *ctx, const char *label, sl_iter_t **out);

typedef int (*sl_op_create_fn)(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                               sl_iter_t **out);
int sl__op_batch_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                        sl_iter_t **out);
int sl__op_shuffle_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                          sl_iter_t **out);
int sl__op_take_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                       sl_iter_t **out);
int sl__op_skip_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                       sl_iter_t **out);
int sl__op_repeat_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                         sl_iter_t **out);
int sl__op_shard_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                        sl_iter_t **out);
int sl__op_padded_batch_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                               sl_iter_t **out);
int sl__op_parse_example_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                                sl_iter_t **out);
/* decode_jpeg, resize, random_crop, center_crop, random_flip, normalize, cast */
int sl__op_image_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                        sl_iter_t **out);
/* ops_map.c: map (a plugin function) and filter (a comparison or a plugin predicate) */
int sl__op_map_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                      sl_iter_t **out);
int sl__op_filter_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                         sl_iter_t **out);

/* Static sharding (sharding.c). DATA: wraps the source *it in a shard that
 * keeps element k when k mod num_workers = worker_index, before any op (so
 * before any shuffle); on failure *it is left as it was. FILE: whether the
 * file source reads file i (i mod num_workers = worker_index). */
int sl__static_shard_wrap(sl_iter_ctx_t *ctx, sl_iter_t **it);

/** Static policies with opts.exclude: wraps *it (the source) in an iterator
 *  that drops the elements whose positions are excluded. */
int sl__static_exclude_wrap(sl_iter_ctx_t *ctx, sl_iter_t **it);
bool sl__static_file_is_mine(const sl_iter_ctx_t *ctx, uint64_t file_index);

int sl__op_interleave_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                             sl_iter_t **out);
int sl__op_prefetch_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                           sl_iter_t **out);
int sl__op_cache_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                        sl_iter_t **out);

/* What interleave needs of a file source (sources_files.c). A reader is a
 * file source of its own, made from the source src, that reads only what it
 * is assigned: sl__files_assign() opens file s->file_index and positions it
 * at record s->begin; next() then yields records [begin, end) (the whole
 * file when end is UINT64_MAX) and 1 after them, until it is assigned
 * again. Its reads count in ctx. */
bool sl__files_is_source(const sl_iter_t *it);
int sl__files_count(const sl_iter_t *src);
int sl__files_reader_create(const sl_iter_t *src, sl_iter_ctx_t *ctx, const char *label, sl_iter_t **out);
/* Returns 0, or an error in the reader's ctx (a split outside the file). */
int sl__files_assign(sl_iter_t *reader, uint64_t epoch, const sl_split_t *s);

/* Provenance and splits (provenance.c). */

/* Drops e: tells the split source's dropped (if any) about its provenance,
 * then clears it. Any thread. */
void sl__iter_drop(sl_iter_t *it, sl_element_t *e);
/* The same for runs without an element (rows of the bulk path). */
void sl__ctx_dropped(sl_iter_ctx_t *ctx, const sl_provenance_run_t *runs, uint64_t n);
/* Tells the split source's split_read (if any) that split s of epoch is read. */
void sl__split_read(sl_iter_ctx_t *ctx, uint64_t epoch, const sl_split_t *s, uint64_t records);
/* Checks a split's skip runs: each of count >= 1, sorted, disjoint, inside
 * [begin, end). 0, or SL_EPROTO with the reason recorded on it. */
int sl__split_check_skips(sl_iter_t *it, uint64_t epoch, const sl_split_t *s);

#endif
