/*
 * ops_cache.c: cache keeps the elements of its input's first complete
 * epoch and yields them again in every later epoch without running its
 * input, as tf.data's cache does: the second epoch opens no source file.
 *
 * storage "memory": the elements, serialized, live with the pipeline.
 * Together the in-memory caches of a worker hold at most --cache-mb
 * (sl_cache_env_t.mem_limit).
 * storage "disk": the elements go to the worker's LMDB cache
 * (storage/cachedb.h, --cache-dir, at most --cache-disk-mb), under a key
 * that hashes the spec's source and the ops before the cache (its canonical
 * form) and the sharding policy: pipelines of the same prefix share one
 * entry, also across jobs and worker restarts, and different prefixes never
 * mix. An entry becomes readable only when the epoch that wrote it ended
 * (its completion marker is committed with its last records); a pipeline
 * that finds a complete entry reads it from its first epoch on. While one
 * pipeline writes an entry, another of the same key reads its input
 * without caching (it finds the entry complete in its next epoch).
 *
 * An epoch cut short (a reset before the input's end: take above, a task
 * stopped) leaves nothing: what it cached is dropped, and the next epoch
 * fills the cache again. A cache that would exceed its bound (memory
 * budget, disk map full) gives up: it drops what it holds, logs a warning
 * once, counts it (sl_pipeline_cache_overflows, the worker's
 * cache_overflows), and from then on reads its input in every epoch. No
 * element is lost: the one that did not fit is still yielded. An in-memory
 * cache is charged to the worker's memory budget too (opts.mem,
 * --max-memory-mb): a charge it refuses makes the cache give up the same
 * way, counted as a refusal of the budget.
 *
 * Elements are serialized with their component layout and a CRC32C, and
 * checked when read back (the components, dtypes and sizes must match the
 * pipeline's): a damaged record fails the pipeline, naming the cache.
 *
 * Under DYNAMIC sharding the splits a worker gets differ from epoch to
 * epoch, so a whole-epoch cache would yield the wrong elements: there the
 * cache keeps a disk entry per split ("per split" below).
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cachedb.h"
#include "crc32c.h"
#include "iter.h"
#include "log.h"
#include "metrics.h"
#include "provenance.h"

/* A cached element's blob. Version 2 ("SLC2") ends with the element's
 * provenance; version 1 ("SLCE") had none. The version is part of the
 * cache's key too, so entries of version 1 are never looked up again. */
#define BLOB_MAGIC 0x32434c53u /* "SLC2" */
#define BLOB_VERSION 2
#define ALIGN8(x) (((x) + 7) & ~(size_t)7)

enum mode {
    M_FRESH,   /* an epoch is about to start */
    M_FILLING, /* reading the input, caching what it yields */
    M_PASS,    /* reading the input, not caching (this epoch) */
    M_READING, /* yielding the cache */
    M_ENDED,   /* the epoch is over */
    M_GAVE_UP, /* over its bound: reading the input in every epoch */
};

struct blob {
    uint8_t *p;
    size_t len;
};

struct cache_iter {
    sl_iter_t base;
    sl_cache_storage_t storage;
    sl_cache_env_t *env;
    char key[20];
    enum mode mode;
    /* memory */
    struct blob *blobs;
    uint64_t n, cap, pos;
    size_t bytes; /* charged to env->mem_used, and to mem */
    sl_memacct_t mem; /* the worker's memory budget */
    bool complete;
    /* disk */
    sl_cachedb_writer_t *w;
    sl_cachedb_reader_t *r;
    uint8_t *buf; /* serialization */
    size_t buf_cap;
    bool dirty; /* the input was read since it last started over */
    /* DYNAMIC: one entry per split, see "per split" below. */
    bool dynamic;
    uint64_t hash;            /* of the prefix and sharding; split keys derive from it */
    sl_split_source_t real;   /* the task's split source; the chain below asks wrap_next_split */
    sl_split_t replaying;     /* DYNAMIC: the cached split c->r reads */
    uint64_t replayed;        /* and the elements of it yielded so far */
    uint64_t epoch;
    bool epoch_over;          /* the dispatcher said the epoch has no split left */
    bool source_active;       /* the source reads a split this cache handed it or let it take */
    bool has_pending;
    sl_split_t pending;       /* a split for the source, taken by the cache */
    sl_split_t *queue;        /* cached splits taken while the source asked, to serve */
    size_t qhead, qn, qcap;
    bool gave_up;
};

/* ---- serialization ---- */

struct comp_hdr {
    uint32_t dtype;
    uint8_t rank, ragged;
    uint16_t pad;
    uint64_t size, splits_bytes;
    int64_t shape[SL_MAX_RANK];
};

static size_t splits_bytes(const sl_value_t *v)
{
    return v->ragged ? ((size_t)v->shape[0] + 1) * sizeof(int64_t) : 0;
}

/* Serializes e into c->buf; *len its bytes. */
static int serialize(struct cache_iter *c, sl_element_t *e, size_t *len)
{
    size_t n = 16;
    for (uint32_t i = 0; i < e->num_components; i++)
        n += sizeof(struct comp_hdr) + ALIGN8(e->v[i].size) + ALIGN8(splits_bytes(&e->v[i]));
    n += 8 + (size_t)sl_prov_count(e) * SL_PROV_RUN_BYTES; /* the provenance */
    n += 8;
    if (n > c->buf_cap) {
        uint8_t *p = realloc(c->buf, n);
        if (!p)
            return -ENOMEM;
        c->buf = p;
        c->buf_cap = n;
    }
    uint8_t *p = c->buf;
    memset(p, 0, n);
    uint32_t magic = BLOB_MAGIC, nc = e->num_components;
    memcpy(p, &magic, 4);
    memcpy(p + 4, &nc, 4);
    memcpy(p + 8, &e->num_elements, 8);
    size_t off = 16;
    for (uint32_t i = 0; i < e->num_components; i++) {
        sl_value_t *v = &e->v[i];
        struct comp_hdr h = {.dtype = (uint32_t)v->dtype, .rank = v->rank, .ragged = v->ragged, .size = v->size,
                             .splits_bytes = splits_bytes(v)};
        for (int d = 0; d < v->rank; d++)
            h.shape[d] = v->shape[d];
        memcpy(p + off, &h, sizeof h);
        off += sizeof h;
        memcpy(p + off, sl_value_data(v), v->size);
        off += ALIGN8(v->size);
        if (v->ragged)
            memcpy(p + off, v->u.splits, h.splits_bytes);
        off += ALIGN8(h.splits_bytes);
    }
    uint64_t prov_n = sl_prov_count(e);
    memcpy(p + off, &prov_n, 8);
    off += 8;
    memcpy(p + off, sl_prov_runs(e), prov_n * SL_PROV_RUN_BYTES);
    off += prov_n * SL_PROV_RUN_BYTES;
    uint32_t crc = sl_crc32c(p, off);
    memcpy(p + off, &crc, 4);
    *len = off + 8;
    return 0;
}

static int bad_blob(struct cache_iter *c, const char *why)
{
    return sl__iter_fail(&c->base, SL_EDATA, "cache %s %s: a cached element is damaged (%s)",
                         c->storage == SL_CACHE_DISK ? "entry" : "in memory,", c->key, why);
}

/* Checks a bytes value's offsets: n strings in size bytes. */
static bool bytes_ok(const uint8_t *data, size_t size, uint64_t n)
{
    if (n > size / 8 || (n + 1) * 8 > size)
        return false;
    uint64_t prev = 0;
    for (uint64_t i = 0; i <= n; i++) {
        uint64_t o;
        memcpy(&o, data + 8 * i, 8);
        if (o < prev)
            return false;
        prev = o;
    }
    return prev == size - (n + 1) * 8;
}

/* Makes out, an empty element, from a blob, checking it against the spec. */
static int deserialize(struct cache_iter *c, const uint8_t *p, size_t len, sl_element_t *out)
{
    const sl_element_spec_t *spec = &c->base.spec;
    uint32_t magic, nc, crc;
    if (len < 24 || len % 8 != 0)
        return bad_blob(c, "bad length");
    memcpy(&crc, p + len - 8, 4);
    if (sl_crc32c(p, len - 8) != crc)
        return bad_blob(c, "checksum mismatch");
    memcpy(&magic, p, 4);
    memcpy(&nc, p + 4, 4);
    if (magic != BLOB_MAGIC || nc != spec->num_components || nc != out->num_components)
        return bad_blob(c, "not an element of this pipeline");
    memcpy(&out->num_elements, p + 8, 8);
    size_t off = 16, end = len - 8, block = 0;
    /* First pass: check, and size the block the ragged values need. */
    for (uint32_t i = 0; i < nc; i++) {
        struct comp_hdr h;
        if (end - off < sizeof h)
            return bad_blob(c, "truncated");
        memcpy(&h, p + off, sizeof h);
        off += sizeof h;
        if (h.dtype != (uint32_t)spec->c[i].dtype || h.rank > SL_MAX_RANK || h.ragged > 1 ||
            (h.ragged && (h.rank < 2 || h.shape[0] < 0 || h.splits_bytes != ((uint64_t)h.shape[0] + 1) * 8)) ||
            (!h.ragged && h.splits_bytes != 0) || h.size > end - off ||
            ALIGN8(h.size) + ALIGN8(h.splits_bytes) > end - off)
            return bad_blob(c, "bad component layout");
        uint64_t count = 1;
        for (int d = h.ragged ? 1 : 0; d < h.rank; d++) {
            if (h.ragged && d == 1)
                continue;
            if (h.shape[d] < 0)
                return bad_blob(c, "bad shape");
            count *= (uint64_t)h.shape[d];
        }
        if (!h.ragged) {
            if (h.dtype == SL_DTYPE_BYTES ? !bytes_ok(p + off, h.size, count)
                                           : sl_value_dense_size((sl_dtype_t)h.dtype, h.rank, h.shape) != h.size)
                return bad_blob(c, "size does not match the shape");
        } else {
            block += ALIGN8(h.size) + ALIGN8(h.splits_bytes);
        }
        off += ALIGN8(h.size) + ALIGN8(h.splits_bytes);
    }
    uint64_t prov_n;
    if (end - off < 8)
        return bad_blob(c, "truncated");
    memcpy(&prov_n, p + off, 8);
    off += 8;
    size_t prov_at = off;
    if (prov_n > out->num_elements || prov_n > (end - off) / SL_PROV_RUN_BYTES)
        return bad_blob(c, "bad provenance");
    off += prov_n * SL_PROV_RUN_BYTES;
    if (off != end)
        return bad_blob(c, "trailing bytes");
    if (block > 0) {
        out->block = malloc(block);
        if (!out->block)
            return sl__iter_fail(&c->base, -ENOMEM, "out of memory reading the cache");
        out->block_size = block;
    }
    off = 16;
    size_t boff = 0;
    for (uint32_t i = 0; i < nc; i++) {
        struct comp_hdr h;
        memcpy(&h, p + off, sizeof h);
        off += sizeof h;
        sl_value_t *v = &out->v[i];
        if (!h.ragged) {
            uint8_t *d = sl_value_alloc(v, (sl_dtype_t)h.dtype, h.rank, h.shape, (size_t)h.size);
            if (!d) {
                sl_element_clear(out);
                return sl__iter_fail(&c->base, -ENOMEM, "out of memory reading the cache");
            }
            memcpy(d, p + off, (size_t)h.size);
        } else {
            v->dtype = (sl_dtype_t)h.dtype;
            v->rank = h.rank;
            v->ragged = 1;
            v->storage = SL_VALUE_BLOCK;
            v->size = (size_t)h.size;
            for (int d = 0; d < h.rank; d++)
                v->shape[d] = h.shape[d];
            v->u.splits = (int64_t *)(out->block + boff);
            memcpy(v->u.splits, p + off + ALIGN8(h.size), (size_t)h.splits_bytes);
            boff += ALIGN8(h.splits_bytes);
            v->u.ptr = out->block + boff;
            memcpy(v->u.ptr, p + off, (size_t)h.size);
            boff += ALIGN8(h.size);
        }
        off += ALIGN8(h.size) + ALIGN8(h.splits_bytes);
    }
    /* The provenance, with the epoch it is replayed in: a replay is that
     * epoch's reading of those records. */
    for (uint64_t i = 0; i < prov_n; i++) {
        sl_provenance_run_t r;
        memcpy(&r, p + prov_at + i * SL_PROV_RUN_BYTES, sizeof r);
        r.epoch = (uint32_t)(c->dynamic ? c->replaying.epoch : c->epoch);
        if (sl_prov_append(out, &r, 1) < 0) {
            sl_element_clear(out);
            return sl__iter_fail(&c->base, -ENOMEM, "out of memory reading the cache");
        }
    }
    return 0;
}

/* ---- the cache ---- */

static void drop_memory(struct cache_iter *c)
{
    for (uint64_t i = 0; i < c->n; i++)
        free(c->blobs[i].p);
    free(c->blobs);
    c->blobs = NULL;
    c->n = c->cap = c->pos = 0;
    if (c->bytes)
        __atomic_sub_fetch(&c->env->mem_used, c->bytes, __ATOMIC_RELAXED);
    c->bytes = 0;
    sl_memacct_release_all(&c->mem);
    c->complete = false;
}

static sl_metric_t *m_overflows;
static pthread_once_t metrics_once = PTHREAD_ONCE_INIT;

static void metrics_init(void)
{
    m_overflows = sl_metric_register(SL_METRIC_COUNTER, "sluice_worker_cache_overflows_total", NULL,
                                     "Cache ops that stopped caching because they would exceed their bound.", NULL, 0);
}

static void give_up(struct cache_iter *c, const char *why)
{
    if (c->w) {
        sl_cachedb_writer_abort(c->w);
        c->w = NULL;
    }
    drop_memory(c);
    if (c->dynamic)
        c->gave_up = true; /* splits already cached are still served */
    else
        c->mode = M_GAVE_UP;
    c->base.ctx->cache_overflows++;
    __atomic_add_fetch(&c->env->overflows, 1, __ATOMIC_RELAXED);
    if (m_overflows)
        sl_metric_add(m_overflows, 1);
    sl_log_warn("%s: cache %s gives up and reads its input in every epoch: %s", c->base.label, c->key, why);
}

/* Keeps a copy of e. 0, or an error that fails the pipeline. */
static int keep(struct cache_iter *c, sl_element_t *e)
{
    size_t len;
    if (serialize(c, e, &len) < 0)
        return sl__iter_fail(&c->base, -ENOMEM, "out of memory caching an element");
    char err[512];
    if (c->storage == SL_CACHE_DISK) {
        int rc = sl_cachedb_writer_put(c->w, c->buf, len, err, sizeof err);
        if (rc == -ENOSPC) {
            give_up(c, err);
            return 0;
        }
        return rc < 0 ? sl__iter_fail(&c->base, rc, "%s", err) : 0;
    }
    size_t charge = len + sizeof(struct blob);
    size_t used = __atomic_add_fetch(&c->env->mem_used, charge, __ATOMIC_RELAXED);
    if (used > c->env->mem_limit) {
        __atomic_sub_fetch(&c->env->mem_used, charge, __ATOMIC_RELAXED);
        snprintf(err, sizeof err, "the in-memory caches of this worker would hold more than %zu bytes (--cache-mb)",
                 c->env->mem_limit);
        give_up(c, err);
        return 0;
    }
    if (!sl_memacct_charge(&c->mem, charge)) {
        __atomic_sub_fetch(&c->env->mem_used, charge, __ATOMIC_RELAXED);
        sl_membudget_refusal(c->mem.budget, charge, "an element of an in-memory cache", err, sizeof err);
        give_up(c, err);
        return 0;
    }
    c->bytes += charge;
    if (c->n == c->cap) {
        uint64_t cap = c->cap ? c->cap * 2 : 1024;
        struct blob *b = realloc(c->blobs, cap * sizeof *b);
        if (!b)
            return sl__iter_fail(&c->base, -ENOMEM, "out of memory caching an element");
        c->blobs = b;
        c->cap = cap;
    }
    uint8_t *p = malloc(len);
    if (!p)
        return sl__iter_fail(&c->base, -ENOMEM, "out of memory caching an element");
    memcpy(p, c->buf, len);
    c->blobs[c->n++] = (struct blob){p, len};
    return 0;
}

static int input_next(struct cache_iter *c, sl_element_t *out)
{
    c->dirty = true;
    return c->base.input->vt->next(c->base.input, out);
}

/* Starts the input over if it was read since it last was. */
static int input_rewind(struct cache_iter *c)
{
    if (!c->dirty)
        return 0;
    c->dirty = false;
    return c->base.input->vt->reset(c->base.input);
}

/* Decides how the epoch is served. */
static int start_epoch(struct cache_iter *c)
{
    char err[512];
    if (c->storage == SL_CACHE_MEMORY) {
        c->pos = 0;
        c->mode = c->complete ? M_READING : M_FILLING;
        return c->complete ? 0 : input_rewind(c);
    }
    sl_cachedb_t *db = c->env->db;
    int rc = sl_cachedb_reader_open(db, c->key, &c->r, err, sizeof err);
    if (rc == 0) {
        c->mode = M_READING;
        return 0;
    }
    if (rc < 0)
        return sl__iter_fail(&c->base, rc, "%s", err);
    rc = sl_cachedb_writer_begin(db, c->key, &c->w, err, sizeof err);
    if (rc == -EBUSY) {
        sl_log_debug("%s: %s; reading the input without caching", c->base.label, err);
        c->mode = M_PASS;
        return input_rewind(c);
    }
    if (rc < 0)
        return sl__iter_fail(&c->base, rc, "%s", err);
    c->mode = M_FILLING;
    return input_rewind(c);
}

/* ---- per split (DYNAMIC) ----
 *
 * Under DYNAMIC a cache keeps one disk entry per split (file, [begin,
 * end)), keyed by the prefix hash and the split: a split this worker read
 * in an earlier epoch (or job) is served from the cache, any other one is
 * read by the source and cached as it passes. This needs every element
 * reaching the cache to belong to the split the source is reading, so only
 * element-wise ops may come between the source and the cache (checked when
 * the pipeline is built), and the chain below is pulled one element at a
 * time: when the source asks for its next split, every element of the
 * previous one has passed the cache, and that entry is complete.
 *
 * The cache replaces the pipeline's split source with wrap_next_split. It
 * asks the dispatcher itself while it has nothing to read: a cached split
 * is served from the cache, any other one is handed to the source as the
 * answer to its next request. When the source asks on its own (its split
 * is used up), the wrapper finishes that split's entry and asks the
 * dispatcher until it gets a split that is not cached (those that are
 * cached are queued and served after the source's) or the epoch's end.
 */

static void split_key(const struct cache_iter *c, const sl_split_t *s, char *key, size_t keylen)
{
    uint64_t h = c->hash, v[3] = {s->file_index, s->begin, s->end};
    const uint8_t *p = (const uint8_t *)v;
    for (size_t i = 0; i < sizeof v; i++)
        h = (h ^ p[i]) * UINT64_C(0x100000001b3);
    snprintf(key, keylen, "%016" PRIx64, h);
}

/* Commits the entry of the split the source finished. */
static void finish_split(struct cache_iter *c)
{
    char err[512];
    if (!c->w)
        return;
    int rc = sl_cachedb_writer_finish(c->w, err, sizeof err);
    c->w = NULL;
    if (rc < 0)
        give_up(c, err);
}

/* Starts caching the split the source is about to read. */
static void begin_split(struct cache_iter *c, const sl_split_t *s)
{
    char key[20], err[512];
    /* A split with skip runs is read without them, not whole: no entry. */
    if (c->gave_up || s->num_skips > 0)
        return;
    split_key(c, s, key, sizeof key);
    int rc = sl_cachedb_writer_begin(c->env->db, key, &c->w, err, sizeof err);
    if (rc == -EBUSY)
        sl_log_debug("%s: %s; reading the split without caching", c->base.label, err);
    else if (rc < 0)
        give_up(c, err);
}

/* 0 and *r open when split s is cached; 1 when not; or an error. */
static int open_split(struct cache_iter *c, const sl_split_t *s, sl_cachedb_reader_t **r)
{
    char key[20], err[512];
    *r = NULL;
    /* A split handed out again with skip runs is read from the source,
     * which skips them; its whole entry would yield them all. */
    if (c->gave_up || s->num_skips > 0)
        return 1;
    split_key(c, s, key, sizeof key);
    int rc = sl_cachedb_reader_open(c->env->db, key, r, err, sizeof err);
    return rc < 0 ? sl__iter_fail(&c->base, rc, "%s", err) : rc;
}

static int real_next_split(struct cache_iter *c, sl_split_t *s)
{
    *s = (sl_split_t){.epoch = c->epoch};
    int rc = c->real.next_split(c->real.arg, c->epoch, s);
    if (rc == 1)
        c->epoch_over = true;
    return rc;
}

static int wrap_next_split(void *arg, uint64_t epoch, sl_split_t *out)
{
    struct cache_iter *c = arg;
    (void)epoch; /* the cache's epoch, which the source's follows */
    finish_split(c);
    if (c->has_pending) {
        c->has_pending = false;
        *out = c->pending;
        begin_split(c, out);
        return 0;
    }
    if (c->epoch_over)
        return 1;
    for (;;) {
        sl_split_t s;
        int rc = real_next_split(c, &s);
        if (rc != 0)
            return rc;
        sl_cachedb_reader_t *r;
        rc = open_split(c, &s, &r);
        if (rc < 0)
            return rc;
        if (rc == 0) {
            sl_cachedb_reader_close(r);
            if (c->qn == c->qcap) {
                size_t cap = c->qcap ? c->qcap * 2 : 16;
                sl_split_t *q = realloc(c->queue, cap * sizeof *q);
                if (!q)
                    return -ENOMEM;
                c->queue = q;
                c->qcap = cap;
            }
            c->queue[c->qn++] = s;
            continue;
        }
        *out = s;
        begin_split(c, out);
        return 0;
    }
}

/* The chain below tells the task's split source through the cache. */
static void wrap_split_read(void *arg, uint64_t epoch, const sl_split_t *split, uint64_t records)
{
    struct cache_iter *c = arg;
    if (c->real.split_read)
        c->real.split_read(c->real.arg, epoch, split, records);
}

static void wrap_dropped(void *arg, const sl_provenance_run_t *runs, uint64_t n)
{
    struct cache_iter *c = arg;
    if (c->real.dropped)
        c->real.dropped(c->real.arg, runs, n);
}

static bool wrap_finished(void *arg)
{
    struct cache_iter *c = arg;
    return c->real.finished && c->real.finished(c->real.arg);
}

static int dynamic_next(struct cache_iter *c, sl_element_t *out)
{
    sl_iter_t *it = &c->base;
    char err[512];
    for (;;) {
        if (c->r) {
            const void *data;
            size_t len;
            int rc = sl_cachedb_reader_next(c->r, &data, &len, err, sizeof err);
            if (rc == 0) {
                rc = deserialize(c, data, len, out);
                if (rc == 0)
                    c->replayed += sl_prov_count(out) ? 1 : 0;
                return rc;
            }
            sl_cachedb_reader_close(c->r);
            c->r = NULL;
            /* The cached split is read: the task's split source hears it,
             * as it hears of the splits the source reads. */
            if (rc == 1 && c->real.split_read)
                c->real.split_read(c->real.arg, c->replaying.epoch, &c->replaying, c->replayed);
            if (rc < 0)
                return sl__iter_fail(it, rc, "%s", err);
            continue;
        }
        if (c->source_active) {
            int rc = input_next(c, out);
            if (rc == 0) {
                if (c->w && (rc = keep(c, out)) < 0)
                    sl_element_clear(out);
                return rc;
            }
            if (rc < 0)
                return rc;
            /* The source's epoch is over: the dispatcher said so. */
            c->source_active = false;
            finish_split(c);
        }
        if (c->qhead < c->qn) {
            sl_split_t s = c->queue[c->qhead++];
            c->replaying = s;
            c->replayed = 0;
            int rc = open_split(c, &s, &c->r);
            if (rc < 0)
                return rc;
            if (rc == 1)
                return sl__iter_fail(it, SL_EINTERNAL, "cached split [%" PRIu64 ", %" PRIu64 ") of file %" PRIu32
                                     " is gone", s.begin, s.end, s.file_index);
            continue;
        }
        if (c->epoch_over)
            return 1;
        /* Nothing to read: ask the dispatcher. */
        sl_split_t s;
        it->ctx->split_requests++;
        int rc = real_next_split(c, &s);
        if (rc == 1)
            return 1;
        if (rc < 0)
            return sl__iter_fail(it, rc, "next_split for epoch %" PRIu64 " failed: %s", c->epoch, sl_strerror(rc));
        c->replaying = s;
        c->replayed = 0;
        rc = open_split(c, &s, &c->r);
        if (rc < 0)
            return rc;
        if (rc == 1) {
            c->pending = s;
            c->has_pending = true;
            c->source_active = true;
        }
    }
}

static int dynamic_reset(struct cache_iter *c)
{
    sl_cachedb_writer_abort(c->w); /* a split cut short is not cached */
    c->w = NULL;
    sl_cachedb_reader_close(c->r);
    c->r = NULL;
    c->epoch++;
    c->epoch_over = false;
    c->source_active = false;
    c->has_pending = false;
    c->qhead = c->qn = 0;
    return c->base.input->vt->reset(c->base.input);
}

/* Only element-wise ops may come between the source and a cache under
 * DYNAMIC, and the source must read one split at a time. */
static int dynamic_check(const sl_spec_t *spec, int index, sl_iter_ctx_t *ctx, const char *label)
{
    for (int j = 0; j < index; j++) {
        const sl_spec_op_t *op = sl_spec_op(spec, j);
        if (!sl_spec_op_elementwise(op->kind))
            return sl__ctx_fail(ctx, SL_EINVAL, label,
                                "under DYNAMIC sharding only element-wise ops (parse_example, image ops, cast, map, "
                                "filter) may come between the source and a cache, so that each element belongs to "
                                "the split it was read from; ops[%d] is %s",
                                j, sl_spec_op_name(op->kind));
        /* A parallel stage reads ahead of the cache, across splits. */
        if (op->has_num_parallel_calls && op->num_parallel_calls != 1)
            return sl__ctx_fail(ctx, SL_EINVAL, label,
                                "under DYNAMIC sharding the ops between the source and a cache must run one "
                                "element at a time, so that each element belongs to the split being read; "
                                "ops[%d] (%s) has num_parallel_calls",
                                j, sl_spec_op_name(op->kind));
    }
    return 0;
}

static int cache_next(sl_iter_t *it, sl_element_t *out)
{
    struct cache_iter *c = (struct cache_iter *)it;
    char err[512];
    int rc;
    if (c->dynamic)
        return dynamic_next(c, out);
    if (c->mode == M_FRESH && (rc = start_epoch(c)) < 0)
        return rc;
    switch (c->mode) {
    case M_READING:
        if (c->storage == SL_CACHE_MEMORY) {
            if (c->pos == c->n) {
                c->mode = M_ENDED;
                return 1;
            }
            rc = deserialize(c, c->blobs[c->pos].p, c->blobs[c->pos].len, out);
            c->pos++;
            return rc;
        } else {
            const void *data;
            size_t len;
            rc = sl_cachedb_reader_next(c->r, &data, &len, err, sizeof err);
            if (rc == 1) {
                sl_cachedb_reader_close(c->r);
                c->r = NULL;
                c->mode = M_ENDED;
                return 1;
            }
            if (rc < 0)
                return sl__iter_fail(it, rc, "%s", err);
            return deserialize(c, data, len, out);
        }
    case M_FILLING:
        rc = input_next(c, out);
        if (rc == 0)
            return (rc = keep(c, out)) < 0 ? (sl_element_clear(out), rc) : 0;
        if (rc < 0)
            return rc;
        c->mode = M_ENDED;
        if (c->storage == SL_CACHE_MEMORY) {
            c->complete = true;
            return 1;
        }
        rc = sl_cachedb_writer_finish(c->w, err, sizeof err);
        c->w = NULL;
        if (rc == -ENOSPC)
            give_up(c, err);
        else if (rc < 0)
            return sl__iter_fail(it, rc, "%s", err);
        return 1;
    case M_PASS:
    case M_GAVE_UP: return input_next(c, out);
    case M_ENDED: return 1;
    case M_FRESH: break;
    }
    return sl__iter_fail(it, SL_EINTERNAL, "cache in mode %d", (int)c->mode);
}

static int cache_reset(sl_iter_t *it)
{
    struct cache_iter *c = (struct cache_iter *)it;
    if (c->dynamic)
        return dynamic_reset(c);
    c->epoch++; /* the epoch replayed elements carry in their provenance */
    if (c->mode == M_FILLING) {
        /* Cut short: what this epoch cached is not a whole epoch. */
        sl_cachedb_writer_abort(c->w);
        c->w = NULL;
        if (c->storage == SL_CACHE_MEMORY)
            drop_memory(c);
    }
    sl_cachedb_reader_close(c->r);
    c->r = NULL;
    if (c->mode == M_GAVE_UP)
        return input_rewind(c);
    /* The input is rewound only when an epoch reads it. */
    c->mode = M_FRESH;
    return 0;
}

static void cache_destroy(sl_iter_t *it)
{
    struct cache_iter *c = (struct cache_iter *)it;
    sl_cachedb_writer_abort(c->w);
    sl_cachedb_reader_close(c->r);
    drop_memory(c);
    free(c->queue);
    free(c->buf);
    free(c);
}

static const sl_iter_vtbl_t cache_vtbl = {cache_next, cache_reset, cache_destroy};

/* The key of the cache: FNV-1a 64 of the format, the sharding (policy,
 * worker index, number of workers) and the canonical spec cut before op
 * index. */
static int make_key(const sl_spec_t *spec, int index, const sl_pipeline_opts_t *opts, char *key, size_t keylen,
                    uint64_t *hash)
{
    json_error_t jerr;
    const char *canonical = sl_spec_canonical(spec);
    json_t *root = json_loads(canonical, 0, &jerr);
    if (!root)
        return -ENOMEM;
    json_t *ops = json_object_get(root, "ops");
    while (ops && json_array_size(ops) > (size_t)index)
        json_array_remove(ops, json_array_size(ops) - 1);
    char *text = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(root);
    if (!text)
        return -ENOMEM;
    char head[64];
    /* The static policies read a share that depends on the worker's index
     * and the number of workers: those are part of the key too. */
    int n = snprintf(head, sizeof head, "sluice-cache/%u.%u/%d/%u/%u\n", SL_CACHEDB_FORMAT, BLOB_VERSION,
                     (int)opts->sharding, opts->worker_index, opts->num_workers);
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (int i = 0; i < n; i++)
        h = (h ^ (uint8_t)head[i]) * UINT64_C(0x100000001b3);
    for (const char *p = text; *p; p++)
        h = (h ^ (uint8_t)*p) * UINT64_C(0x100000001b3);
    free(text);
    *hash = h;
    snprintf(key, keylen, "%016" PRIx64, h);
    return 0;
}

int sl__op_cache_create(const sl_spec_op_t *op, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label,
                        sl_iter_t **out)
{
    bool dynamic = ctx->opts.sharding == SL_SHARDING_DYNAMIC;
    if (dynamic && op->u.cache.storage != SL_CACHE_DISK)
        return sl__ctx_fail(ctx, SL_EINVAL, label,
                            "under DYNAMIC sharding a cache keeps one entry per split on disk: give \"storage\": "
                            "\"disk\" (the splits a worker gets differ from epoch to epoch)");
    if (op->u.cache.storage == SL_CACHE_DISK && !ctx->opts.cache->db)
        return sl__ctx_fail(ctx, SL_EINVAL, label,
                            "storage \"disk\" needs a worker started with --cache-dir, and this one has none");
    if (!ctx->spec)
        return sl__ctx_fail(ctx, SL_EINTERNAL, label, "no spec to key the cache with");
    int index = (int)(op - sl_spec_op(ctx->spec, 0));
    if (dynamic && dynamic_check(ctx->spec, index, ctx, label) < 0)
        return SL_EINVAL;
    pthread_once(&metrics_once, metrics_init);
    struct cache_iter *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    sl__iter_init(&c->base, &cache_vtbl, input, ctx, label);
    c->storage = op->u.cache.storage;
    c->env = ctx->opts.cache;
    sl_memacct_init(&c->mem, ctx->opts.mem);
    if (make_key(ctx->spec, index, &ctx->opts, c->key, sizeof c->key, &c->hash) < 0) {
        free(c);
        return -ENOMEM;
    }
    if (dynamic) {
        /* The chain below asks this cache for splits (see "per split"). */
        c->dynamic = true;
        c->real = ctx->opts.splits;
        ctx->opts.splits = (sl_split_source_t){wrap_next_split, c, wrap_split_read, wrap_dropped, wrap_finished};
    }
    *out = &c->base;
    return 0;
}
