/*
 * ops_interleave.c: interleave over the files of a file source, as
 * tf.data's Dataset.from_tensor_slices(files).interleave(reader,
 * cycle_length, block_length) does.
 *
 * The inputs are the source's files in order under OFF (under FILE
 * sharding, the files of this worker's index), or the splits (file, record
 * range) the dispatcher hands out under DYNAMIC; DATA sharding is refused. Up to
 * cycle_length of them are open at once, one per slot of the cycle. The
 * iterator yields block_length records from the slot at the cycle index,
 * then moves to the next slot; a slot whose input is used up is emptied and
 * the cycle moves on; an empty slot reached by the cycle takes the next
 * input (the next file, or the next split). This is tf.data's
 * InterleaveDatasetOp order exactly, so the order is fixed by cycle_length
 * and block_length and does not depend on num_parallel_calls. Every input
 * is read by one slot from its first to its last record, so every record
 * is yielded once per epoch under OFF and once per split under DYNAMIC.
 *
 * interleave must be the source's first op (the spec refuses it anywhere
 * else): it reads the files itself through readers that
 * sources_files.c makes from the source (sl__files_reader_create), and never
 * calls the source's next().
 *
 * num_parallel_calls > 1 (or "autotune": the worker's --threads) starts
 * min(num_parallel_calls, cycle_length) threads when the first element is
 * asked for; thread t reads ahead the slots t, t + T, ... into each slot's
 * bounded ring (SLOT_RECORDS records or SLOT_BYTES bytes, whichever is
 * reached first, and the record being read). New inputs are still taken on
 * the pipeline's thread (next_split is called there), and the order of the
 * output is the sequential one. A reader fills its slot in bursts
 * (BURST_RECORDS) without the lock, and once the slot is full it waits
 * until it has drained to half, so that threads are not woken for every
 * record; the pipeline's thread claims every queued record of a slot at
 * once and takes them without the lock. The memory an interleave holds is thus at most cycle_length *
 * SLOT_RECORDS records and cycle_length * (SLOT_BYTES + one record).
 *
 * Each reader has a context of its own (its reads may run on another
 * thread); what it counts (records skipped, files opened) is added to the
 * pipeline's on the pipeline's thread, and its failure message is copied
 * there when the failure is yielded, in order, after the records read
 * before it.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "iter.h"

#define SLOT_RECORDS 256
#define SLOT_BYTES ((size_t)4 << 20)
/* A reader publishes what it read after at most this many records or
 * bytes, so the pipeline's thread need not wait for a whole refill. */
#define BURST_RECORDS 32
#define BURST_BYTES ((size_t)256 << 10)

struct slot {
    sl_iter_t *reader; /* owned */
    sl_iter_ctx_t ctx; /* the reader's */
    bool active;       /* holds an input */
    uint64_t folded_skipped, folded_opened;
    /* Read ahead (threads > 0); under mu. */
    bool eof, busy;
    bool full; /* its reader found it full and waits for it to drain to half */
    int err;
    uint64_t pub_skipped;  /* ctx.records_skipped, as of the last read */
    sl_element_t **ring;   /* SLOT_RECORDS elements */
    unsigned head, count;
    size_t bytes;
    /* The pipeline's thread's own (no lock): records it claimed and may
     * take from mhead on, and what it took since it last handed back. */
    unsigned claimed, mhead, consumed;
    size_t consumed_bytes;
};

struct interleave_iter {
    sl_iter_t base;
    int cycle;
    int64_t block;
    unsigned threads; /* 0: read on the pipeline's thread */
    int num_files;
    bool dynamic;
    uint64_t epoch;
    int next_file;
    bool end_of_input;
    int num_open;
    int cycle_index;
    int64_t block_index;
    struct slot *slots;

    pthread_t *tids;
    unsigned started;
    pthread_mutex_t mu;
    pthread_cond_t *fill; /* per thread: one of its slots has room or a new input; or stop */
    pthread_cond_t taken; /* a slot has a record, or ended, or a thread finished a read */
    bool stop;
    bool main_waiting; /* the pipeline's thread waits on taken: only then is it signalled */
};

struct thread_arg {
    struct interleave_iter *il;
    unsigned t;
};

static size_t element_bytes(const sl_element_t *e)
{
    size_t n = 0;
    for (uint32_t c = 0; c < e->num_components; c++)
        n += e->v[c].size;
    return n;
}

/* Adds what a slot's reader counted to the pipeline's context. skipped is
 * the reader's records_skipped as the pipeline's thread may see it. */
static void fold(struct interleave_iter *il, struct slot *s, uint64_t skipped)
{
    sl_iter_ctx_t *ctx = il->base.ctx;
    ctx->records_skipped += skipped - s->folded_skipped;
    s->folded_skipped = skipped;
    /* Files are opened by sl__files_assign, on this thread. */
    ctx->files_opened += s->ctx.files_opened - s->folded_opened;
    s->folded_opened = s->ctx.files_opened;
}

/* Passes a reader's failure on, with its own message. */
static int slot_failed(struct interleave_iter *il, struct slot *s, int rc)
{
    sl_iter_ctx_t *ctx = il->base.ctx;
    if (ctx->errmsg[0] == '\0') {
        if (s->ctx.errmsg[0])
            snprintf(ctx->errmsg, sizeof ctx->errmsg, "%s", s->ctx.errmsg);
        else
            sl__iter_fail(&il->base, rc, "reading a file failed: %s", sl_strerror(rc));
    }
    return rc;
}

static void *reader_main(void *arg)
{
    struct thread_arg *ta = arg;
    struct interleave_iter *il = ta->il;
    /* Thread t reads slots t, t + T, ...: each slot has one reader, so
     * only its thread waits on fill[t] for it. */
    unsigned t = ta->t, T = il->threads;
    int rr = 0; /* where the last search ended: the thread's slots take turns */
    pthread_mutex_lock(&il->mu);
    while (!il->stop) {
        struct slot *pick = NULL;
        int mine = (il->cycle - (int)t + (int)T - 1) / (int)T;
        for (int k = 0; k < mine && !pick; k++) {
            int i = (int)t + (int)T * ((rr + k) % mine);
            struct slot *s = &il->slots[i];
            if (!s->active || s->eof || s->err || s->busy)
                continue;
            if (s->count >= SLOT_RECORDS || s->bytes >= SLOT_BYTES) {
                s->full = true;
                continue;
            }
            /* A full slot is refilled once it drained to half, in a burst,
             * so that the threads are not woken for every record. */
            if (s->full)
                continue;
            pick = s;
            rr = (rr + k + 1) % mine;
        }
        if (!pick) {
            pthread_cond_wait(&il->fill[t], &il->mu);
            continue;
        }
        /* The ring positions past the queued records belong to the
         * reader until it publishes them: it fills them without the lock,
         * a burst at a time, and publishes them at once. */
        pick->busy = true;
        unsigned room = SLOT_RECORDS - pick->count, tail = (pick->head + pick->count) % SLOT_RECORDS, n = 0;
        size_t bytes = pick->bytes, added = 0;
        pthread_mutex_unlock(&il->mu);
        int rc = 0;
        if (room > BURST_RECORDS)
            room = BURST_RECORDS;
        while (n < room && bytes + added < SLOT_BYTES && added < BURST_BYTES) {
            sl_element_t *dst = pick->ring[(tail + n) % SLOT_RECORDS];
            rc = pick->reader->vt->next(pick->reader, dst);
            if (rc != 0)
                break;
            added += element_bytes(dst);
            n++;
        }
        pthread_mutex_lock(&il->mu);
        pick->busy = false;
        pick->count += n;
        pick->bytes += added;
        if (rc == 1)
            pick->eof = true;
        else if (rc < 0)
            pick->err = rc;
        pick->pub_skipped = pick->ctx.records_skipped;
        /* Waking costs a system call: only when it waits. */
        if (il->main_waiting)
            pthread_cond_broadcast(&il->taken);
    }
    pthread_mutex_unlock(&il->mu);
    free(ta);
    return NULL;
}

static int start_threads(struct interleave_iter *il)
{
    for (unsigned t = 0; t < il->threads; t++) {
        struct thread_arg *ta = malloc(sizeof *ta);
        if (!ta)
            return sl__iter_fail(&il->base, -ENOMEM, "out of memory starting reader threads");
        *ta = (struct thread_arg){il, t};
        int rc = pthread_create(&il->tids[t], NULL, reader_main, ta);
        if (rc != 0) {
            free(ta);
            return sl__iter_fail(&il->base, -rc, "cannot start a reader thread: %s", strerror(rc));
        }
        pthread_setname_np(il->tids[t], "sl-interleave"); /* top -H, perf, gdb (docs/operations.md) */
        il->started++;
    }
    return 0;
}

/* The next record of the slot's input into out: 0, 1 at its end, or an error.
 *
 * With reader threads, the pipeline's thread takes the lock only when the
 * records it claimed are used up: it then hands back what it consumed and
 * claims every record queued. The claimed records stay counted in the
 * slot (so the reader never writes over them) until they are handed back. */
static int slot_take(struct interleave_iter *il, struct slot *s, sl_element_t *out)
{
    if (il->threads == 0) {
        int rc = s->reader->vt->next(s->reader, out);
        fold(il, s, s->ctx.records_skipped);
        return rc < 0 ? slot_failed(il, s, rc) : rc;
    }
    if (s->claimed == 0) {
        pthread_mutex_lock(&il->mu);
        s->head = (s->head + s->consumed) % SLOT_RECORDS;
        s->count -= s->consumed;
        s->bytes -= s->consumed_bytes;
        s->consumed = 0;
        s->consumed_bytes = 0;
        if (s->full && s->count <= SLOT_RECORDS / 2 && s->bytes <= SLOT_BYTES / 2) {
            s->full = false;
            pthread_cond_signal(&il->fill[(s - il->slots) % il->threads]);
        }
        while (s->count == 0 && !s->eof && !s->err) {
            il->main_waiting = true;
            pthread_cond_wait(&il->taken, &il->mu);
            il->main_waiting = false;
        }
        int rc = 0;
        if (s->count > 0) {
            s->claimed = s->count;
            s->mhead = s->head;
        } else {
            rc = s->err ? s->err : 1;
        }
        fold(il, s, s->pub_skipped);
        pthread_mutex_unlock(&il->mu);
        if (rc != 0)
            return rc < 0 ? slot_failed(il, s, rc) : rc;
    }
    sl_element_t *e = s->ring[s->mhead];
    s->consumed_bytes += element_bytes(e);
    sl_element_move(out, e);
    s->mhead = (s->mhead + 1) % SLOT_RECORDS;
    s->claimed--;
    s->consumed++;
    return 0;
}

/* The next input: 0 with *split set, 1 when there is none left. */
static int next_input(struct interleave_iter *il, sl_split_t *split)
{
    sl_iter_ctx_t *ctx = il->base.ctx;
    if (!il->dynamic) {
        /* FILE sharding: only the files of this worker's index. */
        while (il->next_file < il->num_files && !sl__static_file_is_mine(ctx, (uint64_t)il->next_file))
            il->next_file++;
        if (il->next_file >= il->num_files)
            return 1;
        *split = (sl_split_t){.file_index = (uint32_t)il->next_file++, .begin = 0, .end = UINT64_MAX};
        return 0;
    }
    for (;;) {
        sl_split_t s = {.file_index = 0, .epoch = il->epoch};
        ctx->split_requests++;
        int rc = ctx->opts.splits.next_split(ctx->opts.splits.arg, il->epoch, &s);
        if (rc == 1)
            return 1;
        if (rc < 0)
            return sl__iter_fail(&il->base, rc, "next_split for epoch %" PRIu64 " failed: %s", il->epoch,
                                 sl_strerror(rc));
        if (rc != 0)
            return sl__iter_fail(&il->base, SL_EINTERNAL, "next_split returned %d", rc);
        if (s.begin == s.end && s.file_index < (uint32_t)il->num_files) {
            sl__split_read(ctx, s.epoch, &s, 0); /* nothing to read: read */
            continue;
        }
        *split = s;
        return 0;
    }
}

/* Gives an empty slot the input split. */
static int slot_open(struct interleave_iter *il, struct slot *s, const sl_split_t *split)
{
    /* No thread touches an inactive slot. */
    int rc = sl__files_assign(s->reader, il->epoch, split);
    fold(il, s, s->ctx.records_skipped);
    if (rc < 0)
        return slot_failed(il, s, rc);
    if (il->threads > 0) {
        pthread_mutex_lock(&il->mu);
        s->active = true;
        s->eof = false;
        s->err = 0;
        s->full = false;
        s->pub_skipped = s->ctx.records_skipped;
        pthread_cond_signal(&il->fill[(s - il->slots) % il->threads]);
        pthread_mutex_unlock(&il->mu);
    } else {
        s->active = true;
    }
    return 0;
}

static void slot_close(struct interleave_iter *il, struct slot *s)
{
    if (il->threads > 0) {
        pthread_mutex_lock(&il->mu);
        s->active = false;
        pthread_mutex_unlock(&il->mu);
    } else {
        s->active = false;
    }
}

static void advance(struct interleave_iter *il)
{
    il->block_index = 0;
    il->cycle_index = (il->cycle_index + 1) % il->cycle;
}

static int interleave_next(sl_iter_t *it, sl_element_t *out)
{
    struct interleave_iter *il = (struct interleave_iter *)it;
    if (il->threads > 0 && il->started < il->threads) {
        int rc = start_threads(il);
        if (rc < 0)
            return rc;
    }
    while (!il->end_of_input || il->num_open > 0) {
        struct slot *s = &il->slots[il->cycle_index];
        if (s->active) {
            int rc = slot_take(il, s, out);
            if (rc == 0) {
                if (++il->block_index == il->block)
                    advance(il);
                return 0;
            }
            if (rc < 0)
                return rc;
            slot_close(il, s);
            il->num_open--;
            advance(il);
        } else if (!il->end_of_input) {
            sl_split_t split;
            int rc = next_input(il, &split);
            if (rc < 0)
                return rc;
            if (rc == 1) {
                il->end_of_input = true;
                continue;
            }
            rc = slot_open(il, s, &split);
            if (rc < 0)
                return rc;
            il->num_open++;
        } else {
            advance(il);
        }
    }
    return 1;
}

static int interleave_reset(sl_iter_t *it)
{
    struct interleave_iter *il = (struct interleave_iter *)it;
    if (il->threads > 0)
        pthread_mutex_lock(&il->mu);
    for (int i = 0; i < il->cycle; i++) {
        struct slot *s = &il->slots[i];
        while (s->busy) {
            il->main_waiting = true;
            pthread_cond_wait(&il->taken, &il->mu);
            il->main_waiting = false;
        }
        s->active = false;
        s->eof = false;
        s->err = 0;
        s->full = false;
        for (; s->count > 0; s->count--, s->head = (s->head + 1) % SLOT_RECORDS)
            sl__iter_drop(&il->base, s->ring[s->head]);
        s->head = 0;
        s->bytes = 0;
        s->claimed = s->mhead = s->consumed = 0;
        s->consumed_bytes = 0;
    }
    if (il->threads > 0)
        pthread_mutex_unlock(&il->mu);
    /* The readers close their files; the next epoch opens them again. */
    for (int i = 0; i < il->cycle; i++) {
        struct slot *s = &il->slots[i];
        s->reader->vt->reset(s->reader);
        fold(il, s, s->ctx.records_skipped);
        s->pub_skipped = s->ctx.records_skipped;
    }
    il->epoch++;
    il->next_file = 0;
    il->end_of_input = false;
    il->num_open = 0;
    il->cycle_index = 0;
    il->block_index = 0;
    return it->input->vt->reset(it->input);
}

static void interleave_destroy(sl_iter_t *it)
{
    struct interleave_iter *il = (struct interleave_iter *)it;
    if (il->threads > 0) {
        pthread_mutex_lock(&il->mu);
        il->stop = true;
        for (unsigned t = 0; t < il->threads; t++)
            pthread_cond_signal(&il->fill[t]);
        pthread_mutex_unlock(&il->mu);
        for (unsigned t = 0; t < il->started; t++)
            pthread_join(il->tids[t], NULL);
        pthread_mutex_destroy(&il->mu);
        for (unsigned t = 0; t < il->threads; t++)
            pthread_cond_destroy(&il->fill[t]);
        pthread_cond_destroy(&il->taken);
    }
    for (int i = 0; il->slots && i < il->cycle; i++) {
        struct slot *s = &il->slots[i];
        if (s->reader)
            s->reader->vt->destroy(s->reader);
        if (s->ring) {
            for (unsigned k = 0; k < SLOT_RECORDS; k++)
                sl_element_free(s->ring[k]);
            free(s->ring);
        }
    }
    free(il->slots);
    free(il->tids);
    free(il->fill);
    free(il);
}

static const sl_iter_vtbl_t interleave_vtbl = {interleave_next, interleave_reset, interleave_destroy};

int sl__op_interleave_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                             sl_iter_t **out)
{
    /* DATA sharding wraps the source in a shard of its elements, which
     * interleave would bypass: it reads the files itself. */
    if (ctx->opts.sharding == SL_SHARDING_DATA)
        return sl__ctx_fail(ctx, SL_EINVAL, label,
                            "interleave is not supported under DATA sharding (it reads the files itself, past "
                            "the DATA shard of the source's elements); use FILE or DYNAMIC sharding");
    /* The spec puts interleave first after a file source; this holds it. */
    if (!sl__files_is_source(input))
        return sl__ctx_fail(ctx, SL_EINVAL, label, "interleave must come directly after a file source");
    struct interleave_iter *il = calloc(1, sizeof *il);
    if (!il)
        return -ENOMEM;
    sl__iter_init(&il->base, &interleave_vtbl, input, ctx, label);
    il->cycle = (int)op->u.interleave.cycle_length;
    il->block = op->u.interleave.block_length;
    int64_t n = op->u.interleave.num_parallel_calls;
    if (n == 0)
        n = ctx->opts.threads ? ctx->opts.threads : 2;
    il->threads = n > 1 ? (unsigned)(n < il->cycle ? n : il->cycle) : 0;
    il->num_files = sl__files_count(input);
    il->dynamic = ctx->opts.sharding == SL_SHARDING_DYNAMIC;
    il->slots = calloc((size_t)il->cycle, sizeof *il->slots);
    if (!il->slots)
        goto nomem;
    for (int i = 0; i < il->cycle; i++) {
        struct slot *s = &il->slots[i];
        s->ctx.opts = ctx->opts;
        int rc = sl__files_reader_create(input, &s->ctx, input->label, &s->reader);
        if (rc < 0)
            goto nomem;
        if (il->threads > 0) {
            s->ring = calloc(SLOT_RECORDS, sizeof *s->ring);
            if (!s->ring)
                goto nomem;
            for (unsigned k = 0; k < SLOT_RECORDS; k++)
                if (!(s->ring[k] = sl_element_new(1)))
                    goto nomem;
        }
    }
    if (il->threads > 0) {
        il->tids = calloc(il->threads, sizeof *il->tids);
        il->fill = calloc(il->threads, sizeof *il->fill);
        if (!il->tids || !il->fill)
            goto nomem;
        pthread_mutex_init(&il->mu, NULL);
        for (unsigned t = 0; t < il->threads; t++)
            pthread_cond_init(&il->fill[t], NULL);
        pthread_cond_init(&il->taken, NULL);
    }
    *out = &il->base;
    return 0;
nomem:
    il->threads = 0; /* no thread started, no mutex made */
    interleave_destroy(&il->base);
    return -ENOMEM;
}
