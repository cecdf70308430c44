/* reader.c: see reader.h. */
#include "reader.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "sluice.h"

/* 4 x 256 KiB in flight: the buffers then stay in the core's L2 cache, so
 * the kernel's copy into them and the caller's pass over them (a CRC, a
 * parse) both hit the cache. On page-cached files 4 x 1 MiB measured about
 * 30% slower; from disk the kernel's readahead sets the size of the I/O,
 * not these reads. */
#define DEFAULT_BLOCK_SIZE ((size_t)256 << 10)
#define DEFAULT_DEPTH 4
#define MIN_BLOCK_SIZE ((size_t)4096)
#define MAX_BLOCK_SIZE ((size_t)1 << 30) /* a read's length is an unsigned int */
#define MAX_DEPTH 64

/*
 * Block states. With io_uring every block goes IDLE -> INFLIGHT -> READY and,
 * once the consumer has taken all of it, back to INFLIGHT for the next
 * offset (or IDLE after the end of the file). Blocks are consumed in ring
 * order, which is also file order: each new read takes the offset after the
 * newest one.
 */
enum blk_state { BLK_IDLE, BLK_INFLIGHT, BLK_READY };

struct blk {
    uint8_t *buf;
    uint64_t off; /* file offset of buf[0] */
    size_t want;  /* bytes asked for: block_size */
    size_t done;  /* bytes arrived; done < want on a READY block means the end */
    int err;      /* -errno of a failed read, on a READY block */
    enum blk_state state;
};

struct sl_reader {
    int fd;
    sl_io_engine_t engine;
    size_t block_size;
    unsigned depth; /* blocks; 1 for pread */
    uint64_t size;
    struct io_uring ring;
    bool have_ring;
    uint8_t *mem; /* depth * block_size bytes, the blocks' buffers */
    struct blk *blks;
    unsigned head;     /* the block being consumed */
    size_t pos;        /* bytes of blks[head] consumed */
    uint64_t next_off; /* offset of the next read to queue */
    unsigned inflight; /* io_uring reads not yet completed */
    bool started;      /* io_uring reads are queued from the first view on */
    bool eof;          /* a read returned 0: queue no more */
    int err;           /* sticky: the first failed read */
};

static _Atomic uint64_t engine_bytes[SL_IO_ENGINES];
static atomic_flag fallback_warned = ATOMIC_FLAG_INIT;

/*
 * Idle rings, with their readers' buffers, kept for the next reader.
 * Setting a ring up (io_uring_setup and three mmaps) and tearing it down
 * (three munmaps, whose TLB flush interrupts every core the process runs
 * on) cost far more than reading a small file: a DYNAMIC job over 400 files
 * of a few bytes for 300 epochs opens 120,000 of them, and its pipeline
 * thread spent a third of its time there. The buffers (1 MiB at the
 * defaults) likewise: an allocator may map and unmap each (ASan's always
 * does). A ring goes back here only drained (no read in flight, no
 * completion left), so the next reader finds it as new and its buffers
 * written by nothing. Kept by depth and block size; at most RING_POOL, the
 * rest are torn down. A ring is the process's that set it up: a child made
 * by fork() shares the kernel's ring with its parent, so it tears its
 * copies down unused.
 */
#define RING_POOL 8

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static struct pooled_ring {
    struct io_uring ring;
    unsigned depth;
    size_t block_size;
    uint8_t *mem; /* depth * block_size bytes */
    pid_t owner;
} pool[RING_POOL];
static unsigned pool_n;
static _Atomic uint64_t rings_set_up;

/* A ring of depth entries: an idle one with its buffers (*mem), else a
 * new one (*mem NULL). 0 or -errno. */
static int ring_take(unsigned depth, size_t block_size, struct io_uring *ring, uint8_t **mem)
{
    *mem = NULL;
    pid_t me = getpid();
    pthread_mutex_lock(&pool_mu);
    for (unsigned i = pool_n; i-- > 0;) {
        if (pool[i].owner != me) {
            io_uring_queue_exit(&pool[i].ring); /* a parent's: this process's mapping and fd only */
            free(pool[i].mem);
            pool[i] = pool[--pool_n];
        } else if (pool[i].depth == depth && pool[i].block_size == block_size) {
            *ring = pool[i].ring;
            *mem = pool[i].mem;
            pool[i] = pool[--pool_n];
            pthread_mutex_unlock(&pool_mu);
            return 0;
        }
    }
    pthread_mutex_unlock(&pool_mu);
    int rc = io_uring_queue_init(depth, ring, 0);
    if (rc == 0)
        atomic_fetch_add_explicit(&rings_set_up, 1, memory_order_relaxed);
    return rc;
}

/* Keeps a drained ring and its buffers (NULL: none yet) for the next
 * reader, or tears them down. */
static void ring_give_back(struct io_uring *ring, unsigned depth, size_t block_size, uint8_t *mem)
{
    pthread_mutex_lock(&pool_mu);
    if (mem && pool_n < RING_POOL) {
        pool[pool_n++] = (struct pooled_ring){*ring, depth, block_size, mem, getpid()};
        pthread_mutex_unlock(&pool_mu);
        return;
    }
    pthread_mutex_unlock(&pool_mu);
    io_uring_queue_exit(ring);
    free(mem);
}

/* The idle rings go with the process (and its checks for leaks). */
__attribute__((destructor)) static void ring_pool_free(void)
{
    pthread_mutex_lock(&pool_mu);
    while (pool_n > 0) {
        io_uring_queue_exit(&pool[--pool_n].ring);
        free(pool[pool_n].mem);
    }
    pthread_mutex_unlock(&pool_mu);
}

uint64_t sl_reader_rings_set_up(void)
{
    return atomic_load_explicit(&rings_set_up, memory_order_relaxed);
}

void sl_reader_opts_init(sl_reader_opts_t *opts)
{
    opts->engine = SL_IO_AUTO;
    opts->block_size = DEFAULT_BLOCK_SIZE;
    opts->depth = DEFAULT_DEPTH;
}

int sl_reader_engine_parse(const char *name, sl_io_engine_t *out)
{
    if (strcmp(name, "uring") == 0 || strcmp(name, "io_uring") == 0)
        *out = SL_IO_URING;
    else if (strcmp(name, "pread") == 0)
        *out = SL_IO_PREAD;
    else if (strcmp(name, "auto") == 0)
        *out = SL_IO_AUTO;
    else
        return SL_EINVAL;
    return 0;
}

const char *sl_reader_engine_name(sl_io_engine_t engine)
{
    switch (engine) {
    case SL_IO_URING:
        return "uring";
    case SL_IO_PREAD:
        return "pread";
    default:
        return "auto";
    }
}

static void count_bytes(sl_io_engine_t engine, size_t n)
{
    atomic_fetch_add_explicit(&engine_bytes[engine], n, memory_order_relaxed);
}

uint64_t sl_reader_bytes(sl_io_engine_t engine)
{
    if (engine == SL_IO_AUTO)
        return atomic_load(&engine_bytes[SL_IO_URING]) + atomic_load(&engine_bytes[SL_IO_PREAD]);
    if ((unsigned)engine >= SL_IO_ENGINES)
        return 0;
    return atomic_load(&engine_bytes[engine]);
}

/* ---- io_uring ---- */

/* Queues the rest of b's read (all of it for a fresh block). The ring has
 * as many entries as there are blocks, so a free entry always exists. */
static void uring_queue(sl_reader_t *r, struct blk *b)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
    if (!sqe) {
        /* Cannot happen with one entry per block; flush and retry anyway,
         * and fail the block rather than lose it. */
        io_uring_submit(&r->ring);
        sqe = io_uring_get_sqe(&r->ring);
        if (!sqe) {
            b->err = -EBUSY;
            b->state = BLK_READY;
            return;
        }
    }
    io_uring_prep_read(sqe, r->fd, b->buf + b->done, (unsigned)(b->want - b->done), b->off + b->done);
    io_uring_sqe_set_data(sqe, b);
    b->state = BLK_INFLIGHT;
    r->inflight++;
}

/* Starts a fresh read of one block at the next offset. */
static void uring_queue_next(sl_reader_t *r, struct blk *b)
{
    b->off = r->next_off;
    b->want = r->block_size;
    b->done = 0;
    b->err = 0;
    r->next_off += r->block_size;
    uring_queue(r, b);
}

/*
 * Waits for one completion and files it under its block. A short read is
 * queued again for the rest; a read of 0 bytes is the end of the file.
 * Submission errors are left for io_uring_submit_and_wait, which submits
 * whatever is still queued.
 * @return 0, or -errno when the ring itself fails
 */
static int uring_reap(sl_reader_t *r)
{
    struct io_uring_cqe *cqe;
    for (;;) {
        if (io_uring_peek_cqe(&r->ring, &cqe) == 0)
            break;
        int rc = io_uring_submit_and_wait(&r->ring, 1);
        if (rc < 0 && rc != -EINTR)
            return rc;
    }
    struct blk *b = io_uring_cqe_get_data(cqe);
    int res = cqe->res;
    io_uring_cqe_seen(&r->ring, cqe);
    r->inflight--;

    if (res == -EINTR || res == -EAGAIN) {
        uring_queue(r, b);
        io_uring_submit(&r->ring);
        return 0;
    }
    if (res < 0) {
        b->err = res;
        b->state = BLK_READY;
        return 0;
    }
    count_bytes(SL_IO_URING, (size_t)res);
    b->done += (size_t)res;
    if (res == 0) {
        r->eof = true;
        b->state = BLK_READY;
    } else if (b->done < b->want) {
        uring_queue(r, b);
        io_uring_submit(&r->ring);
    } else {
        b->state = BLK_READY;
    }
    return 0;
}

/* Waits for every read in flight, dropping what they bring. */
static int uring_drain(sl_reader_t *r)
{
    while (r->inflight > 0) {
        int rc = uring_reap(r);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Forgets every block and queues depth reads from offset. */
static void uring_start(sl_reader_t *r, uint64_t offset)
{
    r->started = true;
    r->head = 0;
    r->pos = 0;
    r->eof = false;
    r->next_off = offset;
    for (unsigned i = 0; i < r->depth; i++)
        uring_queue_next(r, &r->blks[i]);
    io_uring_submit(&r->ring);
}

static int uring_view(sl_reader_t *r, const uint8_t **data, size_t *len)
{
    if (!r->started)
        uring_start(r, r->blks[0].off);
    for (;;) {
        struct blk *b = &r->blks[r->head];
        if (b->state == BLK_INFLIGHT) {
            int rc = uring_reap(r);
            if (rc < 0)
                return rc;
            continue;
        }
        if (b->state == BLK_IDLE)
            break; /* every block after the end has been consumed */
        if (b->err)
            return b->err;
        if (r->pos < b->done) {
            *data = b->buf + r->pos;
            *len = b->done - r->pos;
            return 0;
        }
        if (b->done < b->want)
            break; /* a short block is the last one */
        /* The consumer has taken all of b: read the next block into it. */
        b->state = BLK_IDLE;
        if (!r->eof) {
            uring_queue_next(r, b);
            io_uring_submit(&r->ring);
        }
        r->head = (r->head + 1) % r->depth;
        r->pos = 0;
    }
    *data = NULL;
    *len = 0;
    return 0;
}

/* ---- pread ---- */

static int pread_full(int fd, void *buf, size_t n, uint64_t offset, size_t *got)
{
    size_t done = 0;
    while (done < n) {
        ssize_t k = pread(fd, (uint8_t *)buf + done, n - done, (off_t)(offset + done));
        if (k < 0) {
            if (errno == EINTR)
                continue;
            *got = done;
            return -errno;
        }
        if (k == 0)
            break;
        done += (size_t)k;
    }
    *got = done;
    return 0;
}

static int pread_view(sl_reader_t *r, const uint8_t **data, size_t *len)
{
    struct blk *b = &r->blks[0];
    if (r->pos == b->done && !r->eof) {
        ssize_t k;
        do
            k = pread(r->fd, b->buf, r->block_size, (off_t)r->next_off);
        while (k < 0 && errno == EINTR);
        if (k < 0)
            return -errno;
        b->off = r->next_off;
        b->done = (size_t)k;
        r->pos = 0;
        r->next_off += (size_t)k;
        r->eof = k == 0;
        count_bytes(SL_IO_PREAD, (size_t)k);
    }
    *data = r->pos < b->done ? b->buf + r->pos : NULL;
    *len = b->done - r->pos;
    return 0;
}

/* ---- the stream ---- */

int sl_reader_open(const char *path, const sl_reader_opts_t *opts, sl_reader_t **out, char *err,
                   size_t errlen)
{
    *out = NULL;
    sl_reader_opts_t o;
    sl_reader_opts_init(&o);
    if (opts) {
        o.engine = opts->engine;
        if (opts->block_size)
            o.block_size = opts->block_size;
        if (opts->depth)
            o.depth = opts->depth;
    }
    if ((unsigned)o.engine >= SL_IO_ENGINES || o.block_size < MIN_BLOCK_SIZE ||
        o.block_size > MAX_BLOCK_SIZE || o.depth > MAX_DEPTH) {
        snprintf(err, errlen, "reader %s: engine %d, block size %zu or depth %u out of range", path,
                 (int)o.engine, o.block_size, o.depth);
        return SL_EINVAL;
    }

    int rc;
    sl_reader_t *r = calloc(1, sizeof *r);
    if (!r)
        return -ENOMEM;
    r->block_size = o.block_size;
    r->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0) {
        rc = -errno;
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(r->fd, &st) < 0) {
        rc = -errno;
        snprintf(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
        goto fail;
    }
    if (S_ISDIR(st.st_mode)) {
        rc = -EISDIR;
        snprintf(err, errlen, "%s: is a directory", path);
        goto fail;
    }
    r->size = (uint64_t)st.st_size;
    posix_fadvise(r->fd, 0, 0, POSIX_FADV_SEQUENTIAL);

    r->engine = o.engine == SL_IO_AUTO ? SL_IO_URING : o.engine;
    if (r->engine == SL_IO_URING) {
        rc = ring_take(o.depth, o.block_size, &r->ring, &r->mem);
        if (rc == 0) {
            r->have_ring = true;
        } else if (o.engine == SL_IO_AUTO) {
            if (!atomic_flag_test_and_set(&fallback_warned))
                sl_log_warn("reader: io_uring is not available (%s); reading files with pread",
                            strerror(-rc));
            r->engine = SL_IO_PREAD;
        } else {
            snprintf(err, errlen, "%s: cannot set up io_uring: %s", path, strerror(-rc));
            goto fail;
        }
    }
    r->depth = r->engine == SL_IO_URING ? o.depth : 1;

    rc = r->mem ? 0 : posix_memalign((void **)&r->mem, 4096, (size_t)r->depth * r->block_size);
    if (rc != 0) {
        r->mem = NULL;
        rc = -rc;
        snprintf(err, errlen, "%s: cannot allocate %u x %zu bytes of buffers", path, r->depth,
                 r->block_size);
        goto fail;
    }
    r->blks = calloc(r->depth, sizeof *r->blks);
    if (!r->blks) {
        rc = -ENOMEM;
        snprintf(err, errlen, "%s: out of memory", path);
        goto fail;
    }
    for (unsigned i = 0; i < r->depth; i++)
        r->blks[i].buf = r->mem + (size_t)i * r->block_size;
    *out = r;
    return 0;
fail:
    free(r->blks);
    if (r->have_ring)
        ring_give_back(&r->ring, r->depth, r->block_size, r->mem); /* nothing was queued on it */
    else
        free(r->mem);
    if (r->fd >= 0)
        close(r->fd);
    free(r);
    return rc;
}

int sl_reader_view(sl_reader_t *r, const uint8_t **data, size_t *len)
{
    if (r->err)
        return r->err;
    int rc = r->engine == SL_IO_URING ? uring_view(r, data, len) : pread_view(r, data, len);
    if (rc < 0) {
        r->err = rc;
        *data = NULL;
        *len = 0;
    }
    return rc;
}

void sl_reader_consume(sl_reader_t *r, size_t n)
{
    r->pos += n;
}

int sl_reader_read(sl_reader_t *r, void *buf, size_t n, size_t *got)
{
    size_t done = 0;
    int rc = 0;
    while (done < n) {
        /* A large read with nothing buffered goes straight into the
         * caller's buffer: there is nothing to gain from a copy. */
        struct blk *b = &r->blks[0];
        if (r->engine == SL_IO_PREAD && !r->err && r->pos == b->done && n - done >= r->block_size) {
            size_t k;
            size_t want = (n - done) / r->block_size * r->block_size;
            rc = pread_full(r->fd, (uint8_t *)buf + done, want, r->next_off, &k);
            count_bytes(SL_IO_PREAD, k);
            r->next_off += k;
            b->off = r->next_off;
            b->done = r->pos = 0;
            done += k;
            if (rc < 0) {
                r->err = rc;
                break;
            }
            if (k < want) {
                r->eof = true;
                break;
            }
            continue;
        }
        const uint8_t *p;
        size_t avail;
        rc = sl_reader_view(r, &p, &avail);
        if (rc < 0 || avail == 0)
            break;
        size_t k = avail < n - done ? avail : n - done;
        memcpy((uint8_t *)buf + done, p, k);
        sl_reader_consume(r, k);
        done += k;
    }
    *got = done;
    return rc;
}

uint64_t sl_reader_offset(const sl_reader_t *r)
{
    return r->blks[r->head].off + r->pos;
}

uint64_t sl_reader_size(const sl_reader_t *r)
{
    return r->size;
}

sl_io_engine_t sl_reader_engine(const sl_reader_t *r)
{
    return r->engine;
}

int sl_reader_seek(sl_reader_t *r, uint64_t offset)
{
    uint64_t cur = sl_reader_offset(r);
    if (r->engine == SL_IO_PREAD) {
        struct blk *b = &r->blks[0];
        if (offset >= b->off && offset <= b->off + b->done) {
            r->pos = (size_t)(offset - b->off);
        } else {
            b->off = r->next_off = offset;
            b->done = r->pos = 0;
            r->eof = false;
        }
        r->err = 0;
        return 0;
    }
    /* Before the first view nothing is queued: start there instead. */
    if (!r->started) {
        r->blks[0].off = offset;
        r->err = 0;
        return 0;
    }
    /* Forward within the reads already queued: consume up to the offset,
     * which keeps the blocks in flight useful. */
    if (!r->err && offset >= cur && offset < r->next_off) {
        uint64_t left = offset - cur;
        while (left > 0) {
            const uint8_t *p;
            size_t avail;
            int rc = sl_reader_view(r, &p, &avail);
            if (rc < 0)
                return rc;
            if (avail == 0)
                return 0; /* the file ends before offset */
            size_t k = avail < left ? avail : (size_t)left;
            sl_reader_consume(r, k);
            left -= k;
        }
        return 0;
    }
    int rc = uring_drain(r);
    if (rc < 0) {
        r->err = rc;
        return rc;
    }
    r->err = 0;
    uring_start(r, offset);
    return 0;
}

int sl_reader_pread(sl_reader_t *r, void *buf, size_t n, uint64_t offset, size_t *got)
{
    int rc = pread_full(r->fd, buf, n, offset, got);
    count_bytes(SL_IO_PREAD, *got);
    return rc;
}

void sl_reader_close(sl_reader_t *r)
{
    if (!r)
        return;
    if (r->have_ring) {
        if (uring_drain(r) == 0) {
            ring_give_back(&r->ring, r->depth, r->block_size, r->mem);
        } else {
            /* A read the ring could not wait for may still write into
             * the buffers: leaking them is the only safe thing left. */
            io_uring_queue_exit(&r->ring);
        }
    } else {
        free(r->mem);
    }
    free(r->blks);
    close(r->fd);
    free(r);
}
