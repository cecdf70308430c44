/* files.c: see files.h. */
#include "files.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <zlib.h>

#include "errbuf.h"
#include "tfrecord.h"

struct collect {
    sl_file_list_t *list;
    int max_files;
    int cap;
    char *err;
    size_t errlen;
};

static int add_file(void *arg, const char *resolved)
{
    struct collect *c = arg;
    sl_file_list_t *l = c->list;
    if (l->num_files >= c->max_files) {
        snprintf(c->err, c->errlen, "more than %d files in the source", c->max_files);
        return SL_ETOOBIG;
    }
    if (l->num_files == c->cap) {
        int ncap = c->cap ? c->cap * 2 : 16;
        char **p = realloc(l->paths, (size_t)ncap * sizeof *p);
        if (!p)
            return -ENOMEM;
        l->paths = p;
        uint64_t *r = realloc(l->records, (size_t)ncap * sizeof *r);
        if (!r)
            return -ENOMEM;
        l->records = r;
        c->cap = ncap;
    }
    if (!(l->paths[l->num_files] = strdup(resolved)))
        return -ENOMEM;
    l->records[l->num_files++] = 0;
    return 0;
}

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* 0 while a count may go on; else why not, with its message. */
static int limit_check(const sl_count_limit_t *lim, const char *path, char *err, size_t errlen)
{
    if (!lim)
        return 0;
    if (lim->cancel && atomic_load(lim->cancel))
        return sl_errf(err, errlen, SL_ECANCELLED, "counting the records of %s: cancelled (shutdown)", path);
    if (lim->deadline_ms > 0 && mono_ms() >= lim->deadline_ms)
        return sl_errf(err, errlen, -ETIMEDOUT,
                       "counting the records of %s did not finish within --count-timeout-ms %" PRId64 " ms (a "
                       "file this slow to count, such as a gzip bomb, is refused until it changes)",
                       path, lim->timeout_ms);
    return 0;
}

/* Counts newline-terminated lines, and a last line without one, as the
 * workers read them: a plain file as it is (gzread would inflate a gzip
 * file given as "none", and the counts would differ), a gzip one inflated. */
static int count_lines(const char *path, bool gzip, const sl_count_limit_t *lim, uint64_t *lines, char *err,
                       size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int rc = -errno;
        return sl_errf(err, errlen, rc, "text_lines: cannot open %s: %s", path, strerror(errno));
    }
    gzFile f = gzip ? gzdopen(fd, "rb") : NULL;
    if (gzip && !f) {
        close(fd);
        return sl_errf(err, errlen, -ENOMEM, "text_lines: cannot open %s: out of memory", path);
    }
    /* On the heap: a _Thread_local array would be zeroed in every thread
     * of the dispatcher at its creation, counting or not. */
    enum { COUNT_BUF = 1 << 16 };
    char *buf = malloc(COUNT_BUF);
    if (!buf) {
        if (gzip)
            gzclose(f);
        else
            close(fd);
        return sl_errf(err, errlen, -ENOMEM, "text_lines: cannot read %s: out of memory", path);
    }
    uint64_t n = 0;
    char last = '\n';
    ssize_t got = 0;
    int rc = 0;
    for (;;) {
        if ((rc = limit_check(lim, path, err, errlen)) < 0)
            break;
        got = gzip ? gzread(f, buf, COUNT_BUF) : read(fd, buf, COUNT_BUF);
        if (got < 0 && !gzip && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        /* gzread passes a file that is not gzip through as it is. */
        if (gzip && gzdirect(f)) {
            snprintf(err, errlen, "text_lines: %s is not a gzip file (compression \"gzip\")", path);
            gzclose(f);
            free(buf);
            return SL_EDATA;
        }
        for (const char *q = buf, *e = buf + got; (q = memchr(q, '\n', (size_t)(e - q))) != NULL; q++)
            n++;
        last = buf[got - 1];
    }
    if (rc == 0 && got < 0) {
        int zerr;
        snprintf(err, errlen, "text_lines: reading %s: %s", path, gzip ? gzerror(f, &zerr) : strerror(errno));
        rc = SL_EDATA;
    }
    free(buf);
    if (gzip)
        gzclose(f);
    else
        close(fd);
    *lines = n + (last != '\n');
    return rc;
}

static int count_fixed(const char *path, const sl_spec_source_t *src, uint64_t *records, char *err, size_t errlen)
{
    struct stat st;
    if (stat(path, &st) < 0) {
        int e = errno;
        return sl_errf(err, errlen, -e, "fixed_length_records: %s: %s", path, strerror(e));
    }
    int64_t body = (int64_t)st.st_size - src->u.files.header_bytes - src->u.files.footer_bytes;
    if (body < 0 || body % src->u.files.record_bytes != 0) {
        snprintf(err, errlen,
                 "fixed_length_records: %s holds %" PRId64 " bytes, not a header of %" PRId64
                 ", records of %" PRId64 " and a footer of %" PRId64,
                 path, (int64_t)st.st_size, src->u.files.header_bytes, src->u.files.record_bytes,
                 src->u.files.footer_bytes);
        return SL_EDATA;
    }
    *records = (uint64_t)(body / src->u.files.record_bytes);
    return 0;
}

struct count_check {
    const sl_count_limit_t *lim;
    const char *path;
};

static int count_check(void *arg, char *err, size_t errlen)
{
    const struct count_check *c = arg;
    return limit_check(c->lim, c->path, err, errlen);
}

/* A TFRecord file counted with lim checked every 4096 records. */
static int count_tfrecord(const char *path, sl_tfrecord_compression_t comp, const sl_count_limit_t *lim,
                          uint64_t *records, char *err, size_t errlen)
{
    struct count_check c = {lim, path};
    return sl_tfrecord_count_checked(path, comp, lim ? count_check : NULL, &c, records, err, errlen);
}

/* Counts already made, by file identity (device, inode, size, mtime) and
 * how it was read: a spec registered in many variants over the same files
 * (attack 12 of issue 15: a 12 MB gzip bomb froze the loop 23 s for each)
 * counts each file once. A file changed since has another size or mtime.
 * A count that failed or ran out of time is remembered as well, with its
 * message: the bomb is refused at once the next time. Ring of COUNT_CACHE
 * entries under a lock (the counting thread, server.c / counter.c, and
 * the registrations that count where they are). */
#define COUNT_CACHE 4096

struct counted {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
    int how; /* source kind * 16 + compression * 2 + skip */
    uint64_t records;
    int rc;    /* the count's outcome */
    char *err; /* its message when rc < 0 */
    bool used;
};

static struct counted count_cache[COUNT_CACHE];
static unsigned count_next;
static uint64_t count_hits;
static pthread_mutex_t count_mu = PTHREAD_MUTEX_INITIALIZER;

/* Under count_mu: the cached outcome of the file, copied out. */
static bool cached(const struct stat *st, int how, uint64_t *records, int *rc, char *err, size_t errlen)
{
    for (unsigned i = 0; i < COUNT_CACHE; i++) {
        struct counted *c = &count_cache[i];
        if (c->used && c->dev == st->st_dev && c->ino == st->st_ino && c->size == st->st_size &&
            c->mtime.tv_sec == st->st_mtim.tv_sec && c->mtime.tv_nsec == st->st_mtim.tv_nsec && c->how == how) {
            *records = c->records;
            *rc = c->rc;
            if (c->rc < 0)
                snprintf(err, errlen, "%s", c->err);
            count_hits++;
            return true;
        }
    }
    return false;
}

static void remember(const struct stat *st, int how, uint64_t records, int rc, const char *err)
{
    char *msg = rc < 0 ? strdup(err) : NULL;
    if (rc < 0 && !msg)
        return;
    pthread_mutex_lock(&count_mu);
    free(count_cache[count_next].err);
    count_cache[count_next] = (struct counted){.dev = st->st_dev, .ino = st->st_ino, .size = st->st_size,
                                               .mtime = st->st_mtim, .how = how, .records = records, .rc = rc,
                                               .err = msg, .used = true};
    count_next = (count_next + 1) % COUNT_CACHE;
    pthread_mutex_unlock(&count_mu);
}

uint64_t sl_file_count_cache_hits(void)
{
    pthread_mutex_lock(&count_mu);
    uint64_t n = count_hits;
    pthread_mutex_unlock(&count_mu);
    return n;
}

int sl_file_list_resolve(const sl_spec_t *spec, const sl_confine_t *roots, int max_files, sl_file_list_t *out,
                         char *err, size_t errlen)
{
    return sl_file_list_resolve_bounded(spec, roots, max_files, NULL, out, err, errlen);
}

int sl_file_list_resolve_bounded(const sl_spec_t *spec, const sl_confine_t *roots, int max_files,
                                 const sl_count_limit_t *lim, sl_file_list_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    const sl_spec_source_t *src = sl_spec_source(spec);
    struct collect c = {.list = out, .max_files = max_files, .err = err, .errlen = errlen};
    int rc = 0;
    if (!roots) {
        return sl_errf(err, errlen, -EACCES, "$.source.files: file sources need the dispatcher's --data-root "
                       "(sluice-dispatcher --data-root DIR, the directories its files may come from); it has none");
    }
    for (int i = 0; i < sl_spec_source_num_patterns(spec); i++) {
        rc = sl_confine_glob(roots, sl_spec_source_pattern(spec, i), add_file, &c, err, errlen);
        if (rc < 0) {
            /* The JSON path of the pattern first, as for every refusal of a spec. */
            char why[1024];
            snprintf(why, sizeof why, "%s", err);
            snprintf(err, errlen, "$.source.files[%d]: %s", i, why);
            goto fail;
        }
    }
    for (int i = 0; i < out->num_files; i++) {
        const char *p = out->paths[i];
        struct stat st;
        int how = (int)src->kind * 16 + (int)src->u.files.compression * 2 +
                  (src->u.files.on_corrupt == SL_ON_CORRUPT_SKIP);
        bool known = stat(p, &st) == 0;
        if (known && !S_ISREG(st.st_mode)) {
            /* A FIFO or a device would block the count, or never end. */
            rc = sl_errf(err, errlen, SL_EDATA, "%s: not a regular file: only regular files are read", p);
            goto fail;
        }
        bool hit = false;
        if (known) {
            pthread_mutex_lock(&count_mu);
            hit = cached(&st, how, &out->records[i], &rc, err, errlen);
            pthread_mutex_unlock(&count_mu);
        }
        if (hit) {
            if (rc < 0)
                goto fail;
            out->total += out->records[i];
            continue;
        }
        switch (src->kind) {
        case SL_SOURCE_TFRECORD:
            rc = count_tfrecord(p, src->u.files.compression == SL_COMPRESSION_GZIP ? SL_TFRECORD_GZIP
                                                                                 : SL_TFRECORD_NONE,
                                lim, &out->records[i], err, errlen);
            /* A corrupt record only costs its own data when skipping, but
             * a file cut short cannot be counted past the damage. */
            if (rc < 0 && src->u.files.on_corrupt == SL_ON_CORRUPT_SKIP && rc == SL_EDATA)
                rc = 0;
            break;
        case SL_SOURCE_TEXT_LINES:
            rc = count_lines(p, src->u.files.compression == SL_COMPRESSION_GZIP, lim, &out->records[i], err,
                             errlen);
            break;
        case SL_SOURCE_FIXED_LENGTH_RECORDS:
            rc = count_fixed(p, src, &out->records[i], err, errlen);
            break;
        default:
            snprintf(err, errlen, "source %s has no files", sl_spec_source_name(src->kind));
            rc = SL_EINVAL;
        }
        /* A cancelled count (shutdown) or a lack of memory says nothing of the file. */
        if (known && src->kind != SL_SOURCE_FIXED_LENGTH_RECORDS && rc != SL_ECANCELLED && rc != -ENOMEM)
            remember(&st, how, out->records[i], rc, err);
        if (rc < 0)
            goto fail;
        out->total += out->records[i];
    }
    return 0;
fail:
    sl_file_list_clear(out);
    return rc;
}

void sl_file_list_clear(sl_file_list_t *l)
{
    for (int i = 0; i < l->num_files; i++)
        free(l->paths[i]);
    free(l->paths);
    free(l->records);
    memset(l, 0, sizeof *l);
}
