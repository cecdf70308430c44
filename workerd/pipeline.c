/*
 * pipeline.c: builds the iterator chain of a spec and turns what its last
 * iterator yields into finished batches (pipeline.h).
 */
#include "pipeline.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "iter.h"

struct sl_pipeline {
    sl_iter_ctx_t ctx; /* the iterators point here, so the pipeline never moves */
    sl_iter_t *top;    /* the last op, or the source */
    sl_element_t *out; /* the slot top fills */
    int state;         /* 0 running, 1 ended, < 0 failed with that code */
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
    [SL_OP_INTERLEAVE] = sl__op_interleave_create,
    [SL_OP_PREFETCH] = sl__op_prefetch_create,
    [SL_OP_CACHE] = sl__op_cache_create,
};

void sl__iter_init(sl_iter_t *it, const sl_iter_vtbl_t *vt, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label)
{
    it->vt = vt;
    it->next_bulk = NULL;
    it->input = input;
    it->ctx = ctx;
    snprintf(it->label, sizeof it->label, "%s", label);
    if (input)
        it->spec = input->spec;
}

int sl__iter_fail(sl_iter_t *it, int code, const char *fmt, ...)
{
    /* The first failure is the cause; the iterators above it only pass
     * its code on. */
    if (it->ctx->errmsg[0] == '\0') {
        char msg[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        snprintf(it->ctx->errmsg, sizeof it->ctx->errmsg, "%s: %s", it->label, msg);
    }
    return code;
}

int sl__ctx_fail(sl_iter_ctx_t *ctx, int code, const char *label, const char *fmt, ...)
{
    if (ctx->errmsg[0] == '\0') {
        char msg[900];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        snprintf(ctx->errmsg, sizeof ctx->errmsg, "%s: %s", label, msg);
    }
    return code;
}

int sl__spec_find(const sl_element_spec_t *spec, const char *name)
{
    for (uint32_t i = 0; i < spec->num_components; i++) {
        if (strcmp(spec->c[i].name, name) == 0)
            return (int)i;
    }
    return -1;
}

void sl__spec_names(const sl_element_spec_t *spec, char *buf, size_t buflen)
{
    size_t o = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < spec->num_components && o < buflen; i++)
        o += (size_t)snprintf(buf + o, buflen - o, "%s%s", i ? ", " : "", spec->c[i].name);
}

void sl__shape_str(const int64_t *shape, int rank, char *buf, size_t buflen)
{
    size_t o = (size_t)snprintf(buf, buflen, "[");
    for (int d = 0; d < rank && o < buflen; d++)
        o += (size_t)snprintf(buf + o, buflen - o, "%s%" PRId64, d > 0 ? ", " : "", shape[d]);
    if (o < buflen)
        snprintf(buf + o, buflen - o, "]");
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

uint64_t sl__random_seed(const void *salt)
{
    uint64_t x;
    if (getrandom(&x, sizeof x, GRND_NONBLOCK) == (ssize_t)sizeof x)
        return x;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    x = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    x ^= (uint64_t)(uintptr_t)salt;
    return splitmix64(&x);
}

uint64_t sl__epoch_seed(uint64_t seed, uint64_t epoch)
{
    return seed + epoch * UINT64_C(0xd1342543de82ef95);
}

void sl__iter_destroy(sl_iter_t *it)
{
    while (it) {
        sl_iter_t *input = it->input;
        it->vt->destroy(it);
        it = input;
    }
}

static int fail(char *err, size_t errlen, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
    if (err && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
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
    if (opts && opts->sharding != SL_SHARDING_OFF && opts->sharding != SL_SHARDING_DYNAMIC) {
        const char *name = sl_sharding_name(opts->sharding);
        return fail(err, errlen, SL_EINVAL, "pipeline: sharding policy %s is not supported yet",
                    name ? name : "(invalid)");
    }
    if (opts && opts->sharding == SL_SHARDING_DYNAMIC && !opts->splits.next_split)
        return fail(err, errlen, SL_EINVAL, "pipeline: DYNAMIC sharding needs a split source");

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
    if (p->ctx.opts.autotune_threads == 0)
        p->ctx.opts.autotune_threads = 2;
    p->ctx.spec = spec;

    const sl_spec_source_t *src = sl_spec_source(spec);
    snprintf(label, sizeof label, "source (%s)", sl_spec_source_name(src->kind));
    switch (src->kind) {
    case SL_SOURCE_RANGE: rc = sl__source_range_create(spec, &p->ctx, label, &it); break;
    case SL_SOURCE_TFRECORD:
    case SL_SOURCE_TEXT_LINES:
    case SL_SOURCE_FIXED_LENGTH_RECORDS: rc = sl__source_files_create(spec, &p->ctx, label, &it); break;
    default:
        rc = fail(err, errlen, SL_EINTERNAL, "pipeline: source kind %d has no iterator", (int)src->kind);
        goto fail;
    }
    if (rc < 0)
        goto failed;

    for (int i = 0; i < sl_spec_num_ops(spec); i++) {
        const sl_spec_op_t *op = sl_spec_op(spec, i);
        sl_iter_t *next = NULL;
        if ((unsigned)op->kind >= SL_OP_COUNT_ || !op_create[op->kind]) {
            rc = fail(err, errlen, SL_EINTERNAL, "pipeline: op kind %d has no iterator", (int)op->kind);
            goto fail;
        }
        snprintf(label, sizeof label, "ops[%d] (%s)", i, sl_spec_op_name(op->kind));
        rc = op_create[op->kind](op, it, &p->ctx, label, &next);
        if (rc < 0)
            goto failed;
        it = next;
    }

    p->ctx.spec = NULL;
    p->out = sl_element_new(it->spec.num_components);
    if (!p->out)
        goto nomem;
    p->top = it;
    *out = p;
    return 0;
nomem:
    rc = -ENOMEM;
failed:
    /* A constructor says why it failed in errmsg; without memory it may not. */
    if (p && p->ctx.errmsg[0])
        fail(err, errlen, rc, "%s", p->ctx.errmsg);
    else
        fail(err, errlen, rc, "pipeline: %s", rc == -ENOMEM ? "out of memory" : sl_strerror(rc));
fail:
    sl__iter_destroy(it);
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

const char *sl_pipeline_errmsg(const sl_pipeline_t *p)
{
    return p->ctx.errmsg;
}

void sl_pipeline_destroy(sl_pipeline_t *p)
{
    if (!p)
        return;
    sl__iter_destroy(p->top);
    sl_element_free(p->out);
    free(p);
}
