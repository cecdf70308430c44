/* files.c: see files.h. */
#include "files.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

/* Counts newline-terminated lines, and a last line without one, as the
 * workers read them: a plain file as it is (gzread would inflate a gzip
 * file given as "none", and the counts would differ), a gzip one inflated. */
static int count_lines(const char *path, bool gzip, uint64_t *lines, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int rc = -errno;
        return sl_errf(err, errlen, rc, "text_lines: cannot open %s: %s", path, strerror(errno));
    }
    gzFile f = gzip ? gzdopen(fd, "rb") : NULL;
    if (gzip && !f) {
        close(fd);
        return sl_errf(err, errlen, -ENOMEM, "text_lines: cannot open %s: out of memory", path);
    }
    static _Thread_local char buf[1 << 16];
    uint64_t n = 0;
    char last = '\n';
    ssize_t got;
    for (;;) {
        got = gzip ? gzread(f, buf, sizeof buf) : read(fd, buf, sizeof buf);
        if (got < 0 && !gzip && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        /* gzread passes a file that is not gzip through as it is. */
        if (gzip && gzdirect(f)) {
            snprintf(err, errlen, "text_lines: %s is not a gzip file (compression \"gzip\")", path);
            gzclose(f);
            return SL_EDATA;
        }
        for (ssize_t i = 0; i < got; i++)
            n += buf[i] == '\n';
        last = buf[got - 1];
    }
    int rc = 0;
    if (got < 0) {
        int zerr;
        snprintf(err, errlen, "text_lines: reading %s: %s", path, gzip ? gzerror(f, &zerr) : strerror(errno));
        rc = SL_EDATA;
    }
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

/* Counts already made, by file identity (device, inode, size, mtime) and
 * how it was read: a spec registered in many variants over the same files
 * (attack 12 of issue 15: a 12 MB gzip bomb froze the loop 23 s for each)
 * counts each file once. A file changed since has another size or mtime.
 * Ring of COUNT_CACHE entries; the dispatcher's one thread uses it. */
#define COUNT_CACHE 4096

struct counted {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
    int how; /* source kind * 16 + compression * 2 + skip */
    uint64_t records;
    bool used;
};

static struct counted count_cache[COUNT_CACHE];
static unsigned count_next;

static struct counted *cached(const struct stat *st, int how)
{
    for (unsigned i = 0; i < COUNT_CACHE; i++) {
        struct counted *c = &count_cache[i];
        if (c->used && c->dev == st->st_dev && c->ino == st->st_ino && c->size == st->st_size &&
            c->mtime.tv_sec == st->st_mtim.tv_sec && c->mtime.tv_nsec == st->st_mtim.tv_nsec && c->how == how)
            return c;
    }
    return NULL;
}

static void remember(const struct stat *st, int how, uint64_t records)
{
    count_cache[count_next] = (struct counted){.dev = st->st_dev, .ino = st->st_ino, .size = st->st_size,
                                               .mtime = st->st_mtim, .how = how, .records = records, .used = true};
    count_next = (count_next + 1) % COUNT_CACHE;
}

int sl_file_list_resolve(const sl_spec_t *spec, const sl_confine_t *roots, int max_files, sl_file_list_t *out,
                         char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    const sl_spec_source_t *src = sl_spec_source(spec);
    struct collect c = {.list = out, .max_files = max_files, .err = err, .errlen = errlen};
    int rc = 0;
    if (!roots) {
        return sl_errf(err, errlen, -EACCES, "file sources need the dispatcher's --data-root");
    }
    for (int i = 0; i < sl_spec_source_num_patterns(spec); i++) {
        rc = sl_confine_glob(roots, sl_spec_source_pattern(spec, i), add_file, &c, err, errlen);
        if (rc < 0)
            goto fail;
    }
    for (int i = 0; i < out->num_files; i++) {
        const char *p = out->paths[i];
        struct stat st;
        int how = (int)src->kind * 16 + (int)src->u.files.compression * 2 +
                  (src->u.files.on_corrupt == SL_ON_CORRUPT_SKIP);
        bool known = stat(p, &st) == 0;
        const struct counted *hit = known ? cached(&st, how) : NULL;
        if (hit) {
            out->records[i] = hit->records;
            out->total += out->records[i];
            continue;
        }
        switch (src->kind) {
        case SL_SOURCE_TFRECORD:
            rc = sl_tfrecord_count(p, src->u.files.compression == SL_COMPRESSION_GZIP ? SL_TFRECORD_GZIP
                                                                                    : SL_TFRECORD_NONE,
                                   &out->records[i], err, errlen);
            /* A corrupt record only costs its own data when skipping, but
             * a file cut short cannot be counted past the damage. */
            if (rc < 0 && src->u.files.on_corrupt == SL_ON_CORRUPT_SKIP && rc == SL_EDATA)
                rc = 0;
            break;
        case SL_SOURCE_TEXT_LINES:
            rc = count_lines(p, src->u.files.compression == SL_COMPRESSION_GZIP, &out->records[i], err, errlen);
            break;
        case SL_SOURCE_FIXED_LENGTH_RECORDS:
            rc = count_fixed(p, src, &out->records[i], err, errlen);
            break;
        default:
            snprintf(err, errlen, "source %s has no files", sl_spec_source_name(src->kind));
            rc = SL_EINVAL;
        }
        if (rc < 0)
            goto fail;
        if (known && src->kind != SL_SOURCE_FIXED_LENGTH_RECORDS)
            remember(&st, how, out->records[i]);
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
