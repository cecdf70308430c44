/* files.c: see files.h. */
#include "files.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
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
