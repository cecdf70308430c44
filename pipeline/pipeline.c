/*
 * pipeline.c: builds the iterator chain of a spec and turns what its last
 * iterator yields into finished batches (pipeline.h).
 */
#include "pipeline.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "errbuf.h"
#include "iter.h"

/*
 * Time per op. Each iterator of the chain is reached through a timing
 * stage inserted above it once the chain is built (so constructors see the
 * bare chain): the op above calls the stage, the stage calls the iterator.
 * A stage counts every call and times one in SL_STAGE_SAMPLE (two clock
 * reads cost ~30 ns on a VM each, more than a cheap op's whole call: at one
 * in 16 they were 8% of a shuffled range's time, a stage above each op
 * called once an element); the time of all calls is estimated from the
 * sampled ones, and the first call of each stage is always timed. One
 * thread at a time calls a stage; any thread may read its counters, hence
 * the atomics.
 */
#define SL_STAGE_SAMPLE 64

struct stage {
    sl_iter_t it; /* it.input is the timed iterator */
    _Atomic uint64_t calls, elements, sampled_calls, sampled_ns;
};

struct sl_pipeline {
    sl_iter_ctx_t ctx;     /* the iterators point here, so the pipeline never moves */
    sl_iter_t *top;        /* the timing stage of the last op, or of the source */
    sl_element_t *out;     /* the slot top fills */
    int state;             /* 0 running, 1 ended, < 0 failed with that code */
    int num_stages;        /* 1 + the number of ops */
    struct stage **stages; /* source first; owned by the chain */
    sl_cache_env_t own_cache; /* opts.cache when none was given */
};

static const sl_op_create_fn op_create[SL_OP_COUNT_] = {
    [SL_OP_BATCH] = sl__op_batch_create,
    [SL_OP_SHUFFLE] = sl__op_shuffle_create,
    [SL_OP_TAKE] = sl__op_take_create,
    [SL_OP_SKIP] = sl__op_skip_create,
    [SL_OP_REPEAT] = sl__op_repeat_create,
    [SL_OP_PARSE_EXAMPLE] = sl__op_parse_example_create,
    [SL_OP_DECODE_JPEG] = sl__op_image_create,
    [SL_OP_RESIZE] = sl__op_image_create,
    [SL_OP_RANDOM_CROP] = sl__op_image_create,
    [SL_OP_CENTER_CROP] = sl__op_image_create,
    [SL_OP_RANDOM_FLIP] = sl__op_image_create,
    [SL_OP_NORMALIZE] = sl__op_image_create,
    [SL_OP_CAST] = sl__op_image_create,
    [SL_OP_SHARD] = sl__op_shard_create,
    [SL_OP_PADDED_BATCH] = sl__op_padded_batch_create,
    [SL_OP_MAP] = sl__op_map_create,
    [SL_OP_FILTER] = sl__op_filter_create,
    [SL_OP_INTERLEAVE] = sl__op_interleave_create,
    [SL_OP_PREFETCH] = sl__op_prefetch_create,
    [SL_OP_CACHE] = sl__op_cache_create,
    [SL_OP_RANDOM_RESIZED_CROP] = sl__op_image_create,
    [SL_OP_COLOR_JITTER] = sl__op_image_create,
    [SL_OP_RANDOM_GRAYSCALE] = sl__op_image_create,
    [SL_OP_GAUSSIAN_BLUR] = sl__op_image_create,
    [SL_OP_RANDOM_SOLARIZE] = sl__op_image_create,
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void add(_Atomic uint64_t *c, uint64_t n)
{
    /* One writer: a load and a store, no locked instruction. */
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + n, memory_order_relaxed);
}

/* Whether this call is one of the timed ones; counts it. */
static bool stage_sample(struct stage *s)
{
    uint64_t n = atomic_load_explicit(&s->calls, memory_order_relaxed);
    atomic_store_explicit(&s->calls, n + 1, memory_order_relaxed);
    return n % SL_STAGE_SAMPLE == 0;
}

static void stage_timed(struct stage *s, uint64_t t0)
{
    add(&s->sampled_ns, now_ns() - t0);
    add(&s->sampled_calls, 1);
}

static int stage_next(sl_iter_t *it, sl_element_t *out)
{
    struct stage *s = (struct stage *)it;
    int rc;
    if (stage_sample(s)) {
        uint64_t t0 = now_ns();
        rc = it->input->vt->next(it->input, out);
        stage_timed(s, t0);
    } else {
        rc = it->input->vt->next(it->input, out);
    }
    if (rc == 0)
        add(&s->elements, 1);
    return rc;
}

static int stage_next_bulk(sl_iter_t *it, uint8_t *const *dst, uint64_t max_rows, uint64_t *rows)
{
    struct stage *s = (struct stage *)it;
    int rc;
    if (stage_sample(s)) {
        uint64_t t0 = now_ns();
        rc = it->input->next_bulk(it->input, dst, max_rows, rows);
        stage_timed(s, t0);
    } else {
        rc = it->input->next_bulk(it->input, dst, max_rows, rows);
    }
    if (rc == 0)
        add(&s->elements, *rows);
    return rc;
}

static int stage_reset(sl_iter_t *it)
{
    return it->input->vt->reset(it->input);
}

static void stage_destroy(sl_iter_t *it)
{
    free(it);
}

static const sl_iter_vtbl_t stage_vtbl = {stage_next, stage_reset, stage_destroy};

/* A timing stage over it, which it becomes the input of; NULL without memory. */
static struct stage *stage_new(sl_iter_t *it)
{
    struct stage *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    sl__iter_init(&s->it, &stage_vtbl, it, it->ctx, it->label);
    if (it->next_bulk)
        s->it.next_bulk = stage_next_bulk;
    return s;
}

/*
 * Puts a timing stage above every one of the n iterators of the chain
 * under top, source first into stages[0..n). Returns the new top, or NULL
 * without memory (the chain is then untouched).
 */
static sl_iter_t *add_stages(sl_iter_t *top, struct stage **stages, int n)
{
    sl_iter_t *it = top;
    for (int i = n - 1; i >= 0; i--, it = it->input) {
        stages[i] = stage_new(it);
        if (!stages[i]) {
            while (++i < n)
                free(stages[i]);
            return NULL;
        }
    }
    for (int i = n - 1; i > 0; i--)
        stages[i]->it.input->input = &stages[i - 1]->it;
    return &stages[n - 1]->it;
}

int sl_pipeline_create(const sl_spec_t *spec, const sl_pipeline_opts_t *opts, sl_pipeline_t **out, char *err,
                       size_t errlen)
{
    sl_pipeline_t *p = NULL;
    sl_iter_t *it = NULL;
    char label[48];
    int rc;

    *out = NULL;
    if (err && errlen > 0)
        err[0] = '\0';
    if (opts && (opts->sharding == SL_SHARDING_FILE_OR_DATA || !sl_sharding_name(opts->sharding))) {
        /* The dispatcher resolves FILE_OR_DATA to FILE or DATA per job. */
        const char *name = sl_sharding_name(opts->sharding);
        return sl_errf(err, errlen, SL_EINVAL, "pipeline: sharding policy %s is resolved by the dispatcher, not run",
                       name ? name : "(invalid)");
    }
    if (opts && (opts->sharding == SL_SHARDING_FILE || opts->sharding == SL_SHARDING_DATA ||
                 opts->sharding == SL_SHARDING_HINT) &&
        (opts->num_workers == 0 || opts->worker_index >= opts->num_workers))
        return sl_errf(err, errlen, SL_EINVAL, "pipeline: worker index %u is not below the %u workers of %s sharding",
                       opts->worker_index, opts->num_workers, sl_sharding_name(opts->sharding));
    if (opts && opts->sharding == SL_SHARDING_DYNAMIC && !opts->splits.next_split)
        return sl_errf(err, errlen, SL_EINVAL, "pipeline: DYNAMIC sharding needs a split source");

    p = calloc(1, sizeof *p);
    if (!p)
        goto nomem;
    if (opts)
        p->ctx.opts = *opts;
    if (p->ctx.opts.max_batch_bytes == 0)
        p->ctx.opts.max_batch_bytes = SL_PIPELINE_DEFAULT_MAX_BATCH_BYTES;
    if (!p->ctx.opts.cache) {
        p->own_cache.mem_limit = SL_PIPELINE_DEFAULT_CACHE_BYTES;
        p->ctx.opts.cache = &p->own_cache;
    }
    p->ctx.spec = spec;

    const sl_spec_source_t *src = sl_spec_source(spec);
    snprintf(label, sizeof label, "source (%s)", sl_spec_source_name(src->kind));
    switch (src->kind) {
    case SL_SOURCE_RANGE: rc = sl__source_range_create(spec, &p->ctx, label, &it); break;
    case SL_SOURCE_TFRECORD:
    case SL_SOURCE_TEXT_LINES:
    case SL_SOURCE_FIXED_LENGTH_RECORDS: rc = sl__source_files_create(spec, &p->ctx, label, &it); break;
    default:
        rc = sl_errf(err, errlen, SL_EINTERNAL, "pipeline: source kind %d has no iterator", (int)src->kind);
        goto fail;
    }
    if (rc < 0)
        goto failed;
    if (p->ctx.opts.exclude && p->ctx.opts.sharding != SL_SHARDING_OFF &&
        p->ctx.opts.sharding != SL_SHARDING_DYNAMIC) {
        rc = sl__static_exclude_wrap(&p->ctx, &it);
        if (rc < 0)
            goto failed;
    }
    if (p->ctx.opts.sharding == SL_SHARDING_DATA) {
        rc = sl__static_shard_wrap(&p->ctx, &it);
        if (rc < 0)
            goto failed;
    }

    for (int i = 0; i < sl_spec_num_ops(spec); i++) {
        const sl_spec_op_t *op = sl_spec_op(spec, i);
        sl_iter_t *next = NULL;
        if ((unsigned)op->kind >= SL_OP_COUNT_ || !op_create[op->kind]) {
            rc = sl_errf(err, errlen, SL_EINTERNAL, "pipeline: op kind %d has no iterator", (int)op->kind);
            goto fail;
        }
        snprintf(label, sizeof label, "ops[%d] (%s)", i, sl_spec_op_name(op->kind));
        rc = op_create[op->kind](op, it, &p->ctx, label, &next);
        if (rc < 0)
            goto failed;
        it = next;
        sl__parallel_opts(it, op, &p->ctx);
    }
    rc = sl__parallel_build(&p->ctx, &it);
    if (rc < 0)
        goto failed;

    p->ctx.spec = NULL;
    p->out = sl_element_new(it->spec.num_components);
    if (!p->out)
        goto nomem;
    for (sl_iter_t *i = it; i; i = i->input)
        p->num_stages++;
    p->stages = calloc((size_t)p->num_stages, sizeof *p->stages);
    if (!p->stages)
        goto nomem;
    {
        sl_iter_t *top = add_stages(it, p->stages, p->num_stages);
        if (!top)
            goto nomem;
        it = top;
    }
    p->top = it;
    *out = p;
    return 0;
nomem:
    rc = -ENOMEM;
failed:
    /* A constructor says why it failed in errmsg; without memory it may not. */
    if (p && p->ctx.errmsg[0])
        sl_errf(err, errlen, rc, "%s", p->ctx.errmsg);
    else
        sl_errf(err, errlen, rc, "pipeline: %s", rc == -ENOMEM ? "out of memory" : sl_strerror(rc));
fail:
    sl__iter_destroy(it);
    if (p) {
        sl__parallel_pool_destroy(&p->ctx);
        sl_element_free(p->out);
        free(p->stages);
    }
    free(p);
    return rc;
}

int sl_pipeline_next(sl_pipeline_t *p, sl_wire_batch_t **out)
{
    *out = NULL;
    if (p->state != 0)
        return p->state;
    int rc = p->top->vt->next(p->top, p->out);
    if (rc == 1) {
        p->state = 1;
        return 1;
    }
    if (rc < 0)
        goto fail;

    sl_wire_batch_t *b = NULL;
    rc = sl_element_to_wire(p->out, &p->top->spec, &b);
    if (rc < 0) {
        sl_element_clear(p->out);
        rc = sl__iter_fail(p->top, rc, "out of memory for a batch");
        goto fail;
    }
    /* batch refuses a batch over the limit before it allocates one; this
     * catches elements that are sent unbatched. */
    if (b->size > p->ctx.opts.max_batch_bytes) {
        size_t size = b->size;
        sl_wire_batch_free(b);
        rc = sl__iter_fail(p->top, SL_ETOOBIG, "an element of %zu bytes exceeds max_batch_bytes %zu", size,
                           p->ctx.opts.max_batch_bytes);
        goto fail;
    }
    *out = b;
    return 0;
fail:
    if (p->ctx.errmsg[0] == '\0')
        snprintf(p->ctx.errmsg, sizeof p->ctx.errmsg, "pipeline: %s", sl_strerror(rc));
    p->state = rc;
    return rc;
}

uint64_t sl_pipeline_rows_in_place(const sl_pipeline_t *p)
{
    return p->ctx.rows_in_place;
}

uint64_t sl_pipeline_records_skipped(const sl_pipeline_t *p)
{
    return p->ctx.records_skipped;
}

uint64_t sl_pipeline_files_opened(const sl_pipeline_t *p)
{
    return p->ctx.files_opened;
}

uint64_t sl_pipeline_cache_overflows(const sl_pipeline_t *p)
{
    return p->ctx.cache_overflows;
}

int sl_pipeline_parallel_stats(const sl_pipeline_t *p, sl_pipeline_parallel_stats_t *out, int max)
{
    return sl__parallel_stats(&p->ctx, out, max);
}

int sl_pipeline_op_stats(const sl_pipeline_t *p, sl_pipeline_op_stats_t *out, int max)
{
    double below = 0;
    int n = 0;
    for (; n < p->num_stages && n < max; n++) {
        struct stage *s = p->stages[n];
        uint64_t calls = atomic_load_explicit(&s->calls, memory_order_relaxed);
        uint64_t sampled = atomic_load_explicit(&s->sampled_calls, memory_order_relaxed);
        uint64_t ns = atomic_load_explicit(&s->sampled_ns, memory_order_relaxed);
        double seconds = sampled ? (double)ns * 1e-9 * ((double)calls / (double)sampled) : 0;
        out[n] = (sl_pipeline_op_stats_t){
            .calls = calls,
            .elements = atomic_load_explicit(&s->elements, memory_order_relaxed),
            .seconds = seconds,
            /* Estimates of two stages sampled apart: never below 0. */
            .self_seconds = seconds > below ? seconds - below : 0,
        };
        snprintf(out[n].label, sizeof out[n].label, "%s", s->it.label);
        below = seconds;
    }
    return n;
}

const char *sl_pipeline_errmsg(const sl_pipeline_t *p)
{
    return p->ctx.errmsg;
}

void sl_pipeline_destroy(sl_pipeline_t *p)
{
    if (!p)
        return;
    sl__iter_destroy(p->top);
    sl__parallel_pool_destroy(&p->ctx);
    sl_element_free(p->out);
    free(p->stages);
    free(p);
}
