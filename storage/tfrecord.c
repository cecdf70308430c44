/* tfrecord.c: see tfrecord.h. */
#include "tfrecord.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "crc32c.h"
#include "le.h"
#include "log.h"
#include "sluice.h"

#define DEFAULT_MAX_RECORD_BYTES ((size_t)64 << 20)
#define HEADER_LEN 12 /* length and its crc */
#define FOOTER_LEN 4  /* the data's crc */
#define ZBUF_LEN ((size_t)256 << 10)
#define WALK_LEN 4096 /* bytes per pread when walking headers */

struct sl_tfrecord {
    sl_reader_t *r;
    sl_tfrecord_compression_t compression;
    sl_tfrecord_opts_t opts;
    /* gzip: inflated bytes zbuf[zpos, zlen) not yet consumed */
    z_stream zs;
    bool zinit;
    bool zmember_end; /* the last member ended; more input starts another */
    bool zeof;        /* the uncompressed stream has ended */
    uint8_t *zbuf;
    size_t zpos, zlen;
    uint64_t pos; /* bytes of the uncompressed stream consumed */
    uint64_t index;
    uint64_t skipped;
    uint8_t *rec; /* a record that does not lie whole in one view */
    size_t rec_cap;
    int state; /* 0 reading; 1 the file has ended; < 0 the error that ended it */
    char path[PATH_MAX];
    char errmsg[PATH_MAX + 256];
};

void sl_tfrecord_opts_init(sl_tfrecord_opts_t *opts)
{
    sl_reader_opts_init(&opts->io);
    opts->max_record_bytes = DEFAULT_MAX_RECORD_BYTES;
    opts->on_corrupt = SL_TFRECORD_FAIL;
}

int sl_tfrecord_compression_parse(const char *name, sl_tfrecord_compression_t *out)
{
    if (strcmp(name, "none") == 0 || name[0] == '\0')
        *out = SL_TFRECORD_NONE;
    else if (strcmp(name, "gzip") == 0 || strcmp(name, "GZIP") == 0)
        *out = SL_TFRECORD_GZIP;
    else
        return SL_EINVAL;
    return 0;
}

/* ---- the uncompressed stream ---- */

static int read_failed(sl_tfrecord_t *t, int rc)
{
    snprintf(t->errmsg, sizeof t->errmsg, "tfrecord: cannot read %s at offset %" PRIu64 ": %s",
             t->path, sl_reader_offset(t->r), strerror(-rc));
    return rc;
}

/* Inflates the next bytes into zbuf. Concatenated members are read one
 * after the other, as gzip -d does. */
static int gz_fill(sl_tfrecord_t *t)
{
    t->zpos = t->zlen = 0;
    while (t->zlen == 0 && !t->zeof) {
        const uint8_t *in;
        size_t avail;
        int rc = sl_reader_view(t->r, &in, &avail);
        if (rc < 0)
            return read_failed(t, rc);
        if (avail == 0) {
            /* An empty file is an empty stream; an unfinished member is
             * a truncated one. */
            if (t->zmember_end || sl_reader_offset(t->r) == 0) {
                t->zeof = true;
                break;
            }
            snprintf(t->errmsg, sizeof t->errmsg,
                     "tfrecord: truncated gzip stream in %s (after %" PRIu64 " uncompressed bytes)",
                     t->path, t->pos);
            return SL_EDATA;
        }
        if (t->zmember_end) {
            inflateReset(&t->zs);
            t->zmember_end = false;
        }
        uInt in_len = avail > UINT_MAX ? UINT_MAX : (uInt)avail;
        t->zs.next_in = (Bytef *)in;
        t->zs.avail_in = in_len;
        t->zs.next_out = t->zbuf;
        t->zs.avail_out = (uInt)ZBUF_LEN;
        int zrc = inflate(&t->zs, Z_NO_FLUSH);
        sl_reader_consume(t->r, in_len - t->zs.avail_in);
        t->zlen = ZBUF_LEN - t->zs.avail_out;
        if (zrc == Z_STREAM_END) {
            t->zmember_end = true;
        } else if (zrc == Z_MEM_ERROR) {
            snprintf(t->errmsg, sizeof t->errmsg, "tfrecord: out of memory inflating %s", t->path);
            return -ENOMEM;
        } else if (zrc != Z_OK && zrc != Z_BUF_ERROR) {
            snprintf(t->errmsg, sizeof t->errmsg,
                     "tfrecord: corrupt gzip stream in %s at compressed offset %" PRIu64 ": %s",
                     t->path, sl_reader_offset(t->r), t->zs.msg ? t->zs.msg : "inflate failed");
            return SL_EDATA;
        }
    }
    return 0;
}

/* Shows the next bytes of the uncompressed stream, at least one before its
 * end; valid until the next view. */
static int s_view(sl_tfrecord_t *t, const uint8_t **p, size_t *n)
{
    if (t->compression == SL_TFRECORD_NONE) {
        int rc = sl_reader_view(t->r, p, n);
        return rc < 0 ? read_failed(t, rc) : 0;
    }
    if (t->zpos == t->zlen) {
        int rc = gz_fill(t);
        if (rc < 0)
            return rc;
    }
    *p = t->zbuf + t->zpos;
    *n = t->zlen - t->zpos;
    return 0;
}

static void s_consume(sl_tfrecord_t *t, size_t n)
{
    if (t->compression == SL_TFRECORD_NONE)
        sl_reader_consume(t->r, n);
    else
        t->zpos += n;
    t->pos += n;
}

/* Copies (dst) or drops (dst NULL) the next n bytes; *got < n at the end. */
static int s_read(sl_tfrecord_t *t, uint8_t *dst, uint64_t n, uint64_t *got)
{
    *got = 0;
    while (*got < n) {
        const uint8_t *p;
        size_t avail;
        int rc = s_view(t, &p, &avail);
        if (rc < 0)
            return rc;
        if (avail == 0)
            break;
        size_t k = avail < n - *got ? avail : (size_t)(n - *got);
        if (dst)
            memcpy(dst + *got, p, k);
        s_consume(t, k);
        *got += k;
    }
    return 0;
}

/* ---- records ---- */

/* Fails the file with a message naming the record. */
static int fail_record(sl_tfrecord_t *t, int rc, const char *what, uint64_t offset)
{
    snprintf(t->errmsg, sizeof t->errmsg, "tfrecord: %s in %s at offset %" PRIu64 " (record %" PRIu64 ")",
             what, t->path, offset, t->index);
    t->state = rc;
    return rc;
}

/* A defect nothing can be read past: an error, or with SKIP the end of the
 * file, counted as one skipped record. */
static int corrupt_end(sl_tfrecord_t *t, const char *what, uint64_t offset)
{
    fail_record(t, SL_EDATA, what, offset);
    if (t->opts.on_corrupt != SL_TFRECORD_SKIP)
        return SL_EDATA;
    sl_log_warn("%s; skipping the rest of the file", t->errmsg);
    t->errmsg[0] = '\0';
    t->skipped++;
    t->state = 1;
    return 1;
}

/* Reads and checks a record header. @return 0, 1 at a clean end, or an
 * error (or 1 with SKIP) from corrupt_end */
static int read_header(sl_tfrecord_t *t, uint64_t *length)
{
    uint64_t start = t->pos, got;
    uint8_t hdr[HEADER_LEN];
    int rc = s_read(t, hdr, HEADER_LEN, &got);
    if (rc < 0)
        return t->state = rc;
    if (got == 0) {
        t->state = 1;
        return 1;
    }
    if (got < HEADER_LEN)
        return corrupt_end(t, "truncated record", start);
    if (sl_crc32c_mask(sl_crc32c(hdr, 8)) != sl_get_le32(hdr + 8))
        return corrupt_end(t, "length crc mismatch", start);
    *length = sl_get_le64(hdr);
    return 0;
}

int sl_tfrecord_next(sl_tfrecord_t *t, const uint8_t **data, size_t *len)
{
    while (t->state == 0) {
        uint64_t start = t->pos, length;
        int rc = read_header(t, &length);
        if (rc != 0)
            return rc;
        if (length > t->opts.max_record_bytes) {
            char what[96];
            snprintf(what, sizeof what, "record of %" PRIu64 " bytes over max_record_bytes %zu", length,
                     t->opts.max_record_bytes);
            return fail_record(t, SL_ETOOBIG, what, start);
        }
        size_t need = (size_t)length + FOOTER_LEN;

        /* Most records lie whole in the current view and are handed out
         * from there; the others are gathered into rec. */
        const uint8_t *p;
        size_t avail;
        rc = s_view(t, &p, &avail);
        if (rc < 0)
            return t->state = rc;
        if (avail >= need) {
            s_consume(t, need);
        } else {
            if (t->rec_cap < need) {
                uint8_t *grown = realloc(t->rec, need);
                if (!grown) {
                    snprintf(t->errmsg, sizeof t->errmsg, "tfrecord: out of memory for a record of %zu bytes",
                             need);
                    return t->state = -ENOMEM;
                }
                t->rec = grown;
                t->rec_cap = need;
            }
            uint64_t got;
            rc = s_read(t, t->rec, need, &got);
            if (rc < 0)
                return t->state = rc;
            if (got < need)
                return corrupt_end(t, "truncated record", start);
            p = t->rec;
        }
        if (sl_crc32c_mask(sl_crc32c(p, (size_t)length)) != sl_get_le32(p + length)) {
            if (t->opts.on_corrupt != SL_TFRECORD_SKIP)
                return fail_record(t, SL_EDATA, "data crc mismatch", start);
            sl_log_warn("tfrecord: data crc mismatch in %s at offset %" PRIu64 " (record %" PRIu64
                        "); skipped",
                        t->path, start, t->index);
            t->skipped++;
            t->index++;
            continue;
        }
        t->index++;
        *data = p;
        *len = (size_t)length;
        return 0;
    }
    return t->state;
}

/*
 * Walks up to n headers of an uncompressed file from *offset with pread,
 * WALK_LEN bytes at a time, so that small records cost one read per window
 * and large ones one small read each. Stops at the end, at a defect (what
 * says which, *offset is the defective record's) or after n records.
 * @return 0 after n records, 1 at a clean end, SL_EDATA, or -errno
 */
static int walk_headers(sl_reader_t *r, uint64_t *offset, uint64_t n, uint64_t *walked, const char **what)
{
    uint8_t win[WALK_LEN];
    uint64_t win_off = 0, size = sl_reader_size(r);
    size_t win_len = 0;
    *walked = 0;
    while (*walked < n) {
        uint64_t off = *offset;
        if (off < win_off || off + HEADER_LEN > win_off + win_len) {
            int rc = sl_reader_pread(r, win, sizeof win, off, &win_len);
            if (rc < 0)
                return rc;
            win_off = off;
        }
        size_t have = off >= win_off + win_len ? 0 : (size_t)(win_off + win_len - off);
        if (have == 0)
            return 1;
        if (have < HEADER_LEN) {
            *what = "truncated record";
            return SL_EDATA;
        }
        const uint8_t *hdr = win + (off - win_off);
        if (sl_crc32c_mask(sl_crc32c(hdr, 8)) != sl_get_le32(hdr + 8)) {
            *what = "length crc mismatch";
            return SL_EDATA;
        }
        uint64_t length = sl_get_le64(hdr);
        if (length > size || off + HEADER_LEN + length + FOOTER_LEN > size) {
            *what = "truncated record";
            return SL_EDATA;
        }
        *offset = off + HEADER_LEN + length + FOOTER_LEN;
        (*walked)++;
    }
    return 0;
}

int sl_tfrecord_skip_records(sl_tfrecord_t *t, uint64_t n)
{
    if (t->state != 0)
        return t->state;
    if (t->compression == SL_TFRECORD_NONE) {
        uint64_t off = t->pos, walked;
        const char *what = NULL;
        int rc = walk_headers(t->r, &off, n, &walked, &what);
        t->index += walked;
        t->pos = off;
        if (rc < 0 && !what)
            return t->state = read_failed(t, rc);
        int seek = sl_reader_seek(t->r, off);
        if (seek < 0)
            return t->state = read_failed(t, seek);
        if (rc == SL_EDATA)
            return corrupt_end(t, what, off);
        if (rc == 1)
            t->state = 1;
        return rc;
    }
    for (uint64_t i = 0; i < n; i++) {
        uint64_t start = t->pos, length, got;
        int rc = read_header(t, &length);
        if (rc != 0)
            return rc;
        if (length > UINT64_MAX - FOOTER_LEN)
            return corrupt_end(t, "truncated record", start);
        rc = s_read(t, NULL, length + FOOTER_LEN, &got);
        if (rc < 0)
            return t->state = rc;
        if (got < length + FOOTER_LEN)
            return corrupt_end(t, "truncated record", start);
        t->index++;
    }
    return 0;
}

int sl_tfrecord_open(const char *path, sl_tfrecord_compression_t compression,
                     const sl_tfrecord_opts_t *opts, sl_tfrecord_t **out, char *err, size_t errlen)
{
    *out = NULL;
    if (compression != SL_TFRECORD_NONE && compression != SL_TFRECORD_GZIP) {
        snprintf(err, errlen, "tfrecord %s: unknown compression %d", path, (int)compression);
        return SL_EINVAL;
    }
    sl_tfrecord_t *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, errlen, "tfrecord %s: out of memory", path);
        return -ENOMEM;
    }
    int rc;
    if (opts)
        t->opts = *opts;
    else
        sl_tfrecord_opts_init(&t->opts);
    if (t->opts.max_record_bytes == 0)
        t->opts.max_record_bytes = DEFAULT_MAX_RECORD_BYTES;
    t->compression = compression;
    snprintf(t->path, sizeof t->path, "%s", path);
    rc = sl_reader_open(path, &t->opts.io, &t->r, err, errlen);
    if (rc < 0)
        goto fail;
    if (compression == SL_TFRECORD_GZIP) {
        t->zbuf = malloc(ZBUF_LEN);
        if (!t->zbuf || inflateInit2(&t->zs, 16 + MAX_WBITS) != Z_OK) {
            rc = -ENOMEM;
            snprintf(err, errlen, "tfrecord %s: out of memory", path);
            goto fail;
        }
        t->zinit = true;
    }
    *out = t;
    return 0;
fail:
    free(t->zbuf);
    sl_reader_close(t->r);
    free(t);
    return rc;
}

uint64_t sl_tfrecord_record_index(const sl_tfrecord_t *t)
{
    return t->index;
}

uint64_t sl_tfrecord_skipped(const sl_tfrecord_t *t)
{
    return t->skipped;
}

sl_io_engine_t sl_tfrecord_engine(const sl_tfrecord_t *t)
{
    return sl_reader_engine(t->r);
}

const char *sl_tfrecord_errmsg(const sl_tfrecord_t *t)
{
    return t->errmsg;
}

void sl_tfrecord_close(sl_tfrecord_t *t)
{
    if (!t)
        return;
    if (t->zinit)
        inflateEnd(&t->zs);
    free(t->zbuf);
    free(t->rec);
    sl_reader_close(t->r);
    free(t);
}

int sl_tfrecord_count(const char *path, sl_tfrecord_compression_t compression, uint64_t *records,
                      char *err, size_t errlen)
{
    return sl_tfrecord_count_checked(path, compression, NULL, NULL, records, err, errlen);
}

/* Records counted between two calls of check. */
#define COUNT_STEP 4096

int sl_tfrecord_count_checked(const char *path, sl_tfrecord_compression_t compression, sl_tfrecord_check_fn check,
                              void *arg, uint64_t *records, char *err, size_t errlen)
{
    *records = 0;
    sl_tfrecord_opts_t opts;
    sl_tfrecord_opts_init(&opts);
    if (compression == SL_TFRECORD_NONE) {
        /* Only pread is used: the smallest reader will do. */
        opts.io.engine = SL_IO_PREAD;
        opts.io.block_size = 4096;
    }
    sl_tfrecord_t *t;
    int rc = sl_tfrecord_open(path, compression, &opts, &t, err, errlen);
    if (rc < 0)
        return rc;
    for (;;) {
        if (check && (rc = check(arg, err, errlen)) < 0)
            break;
        rc = sl_tfrecord_skip_records(t, check ? COUNT_STEP : UINT64_MAX);
        if (rc < 0)
            snprintf(err, errlen, "%s", t->errmsg);
        if (rc != 0)
            break;
    }
    *records = t->index;
    sl_tfrecord_close(t);
    return rc < 0 ? rc : 0;
}
