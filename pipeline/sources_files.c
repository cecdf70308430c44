/*
 * sources_files.c: the sources that read files: tfrecord, text_lines and
 * fixed_length_records. Each yields one bytes scalar per record (a
 * serialized record, a line without its "\n" or "\r\n", the bytes of one
 * fixed-length record).
 *
 * Files. The spec's patterns are expanded once, when the pipeline is
 * built, below the worker's data roots exactly as the dispatcher expands
 * them (sl_confine_glob: patterns in spec order, each one's matches
 * sorted), so that file i is the same file on both sides. A path outside
 * every root, or a pattern that matches nothing, fails the build.
 *
 * Under OFF every file is read in order, whole, in every epoch. Under
 * DYNAMIC the source asks for splits (file i, records [begin, end)) until
 * its epoch has none left, and reads exactly those records: it keeps the
 * file it read last open and moves forward in it when the next split
 * starts at or after where it is (skipping records: headers only for an
 * uncompressed TFRecord, a seek for fixed-length records), and opens the
 * file again otherwise. A split past the end of a file, or naming a file
 * the worker does not have, means the dispatcher and the worker see
 * different files: the pipeline fails saying so.
 *
 * All reads go through storage/reader.h (io_uring or pread, as the worker's
 * --io-engine says); gzip text is inflated here, gzip TFRecords by
 * storage/tfrecord.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "iter.h"
#include "metrics.h"
#include "tfrecord.h"

#define MAX_LINE_BYTES ((size_t)64 << 20)
#define ZBUF_LEN ((size_t)256 << 10)

/* A file's bytes as a stream, inflated when gzip (concatenated members are
 * read one after the other, as gzip -d does). */
struct stream {
    sl_reader_t *r;
    bool gzip;
    z_stream zs;
    bool zinit, zmember_end, zeof;
    uint8_t *zbuf;
    size_t zpos, zlen;
};

struct file_iter {
    sl_iter_t base;
    sl_source_kind_t kind;
    char **paths; /* resolved */
    int num_files, cap_files;
    sl_compression_t compression;
    sl_on_corrupt_t on_corrupt;
    uint64_t record_bytes, header_bytes, footer_bytes;
    bool dynamic;
    uint64_t epoch;
    bool epoch_over;
    int next_file; /* OFF: the file to open next */

    /* The open file, if file >= 0. */
    int file;
    uint64_t index;   /* the number of the record read next */
    uint64_t end;     /* DYNAMIC: the end of the current split; OFF: UINT64_MAX */
    uint64_t records; /* fixed_length_records: records in the file */
    sl_tfrecord_t *tf;
    uint64_t tf_skipped; /* sl_tfrecord_skipped() already counted */
    struct stream s;
    uint8_t *line; /* text_lines: a line spanning views */
    size_t line_cap;
    bool assigned; /* an interleave reader: reads what sl__files_assign() gave it, nothing else */
    /* DYNAMIC: the split being read, the records of it yielded so far, and
     * its next skip run. */
    bool have_split;
    sl_split_t split;
    uint64_t yielded;
    uint32_t skip_i;
};

/* DYNAMIC: the split being read is read; the split source hears it. */
static void files_split_done(struct file_iter *f)
{
    if (f->have_split) {
        f->have_split = false;
        sl__split_read(f->base.ctx, f->split.epoch, &f->split, f->yielded);
    }
}

/* Starts reading split s (already checked). */
static void files_split_start(struct file_iter *f, const sl_split_t *s)
{
    f->split = *s;
    f->have_split = true;
    f->yielded = 0;
    f->skip_i = 0;
}

/* Whether record i of the current split is in one of its skip runs;
 * records come in increasing order. */
static bool files_skipped(struct file_iter *f, uint64_t i)
{
    while (f->skip_i < f->split.num_skips) {
        const sl_skip_run_t *k = &f->split.skips[f->skip_i];
        if (i < k->begin)
            return false;
        if (i < k->begin + k->count)
            return true;
        f->skip_i++;
    }
    return false;
}

static sl_metric_t *m_files_opened;
static pthread_once_t metrics_once = PTHREAD_ONCE_INIT;

static void metrics_init(void)
{
    m_files_opened = sl_metric_register(SL_METRIC_COUNTER, "sluice_worker_files_opened_total", NULL,
                                        "Files the pipelines' file sources opened (a cached epoch opens none).",
                                        NULL, 0);
}

/* ---- files ---- */

static int add_path(void *arg, const char *resolved)
{
    struct file_iter *f = arg;
    if (f->num_files == INT_MAX)
        return SL_ETOOBIG;
    if (f->num_files == f->cap_files) {
        int cap = f->cap_files ? f->cap_files * 2 : 16;
        char **p = realloc(f->paths, (size_t)cap * sizeof *p);
        if (!p)
            return -ENOMEM;
        f->paths = p;
        f->cap_files = cap;
    }
    if (!(f->paths[f->num_files] = strdup(resolved)))
        return -ENOMEM;
    f->num_files++;
    return 0;
}

static const char *what(const struct file_iter *f)
{
    return sl_spec_source_name(f->kind);
}

static void stream_close(struct stream *s)
{
    if (s->zinit)
        inflateEnd(&s->zs);
    free(s->zbuf);
    sl_reader_close(s->r);
    memset(s, 0, sizeof *s);
}

static void file_close(struct file_iter *f)
{
    if (f->tf) {
        /* What was skipped as corrupt counts once. */
        f->base.ctx->records_skipped += sl_tfrecord_skipped(f->tf) - f->tf_skipped;
        sl_tfrecord_close(f->tf);
        f->tf = NULL;
    }
    stream_close(&f->s);
    f->file = -1;
}

static int read_failed(struct file_iter *f, int rc)
{
    return sl__iter_fail(&f->base, rc, "%s: cannot read %s at offset %" PRIu64 ": %s", what(f), f->paths[f->file],
                         sl_reader_offset(f->s.r), sl_strerror(rc));
}

/* Opens file i at its first record. */
static int file_open(struct file_iter *f, int i)
{
    char err[PATH_MAX + 256];
    int rc;
    file_close(f);
    f->file = i;
    f->index = 0;
    if (f->kind == SL_SOURCE_TFRECORD) {
        sl_tfrecord_opts_t o;
        sl_tfrecord_opts_init(&o);
        o.io.engine = f->base.ctx->opts.io_engine;
        o.on_corrupt = f->on_corrupt == SL_ON_CORRUPT_SKIP ? SL_TFRECORD_SKIP : SL_TFRECORD_FAIL;
        rc = sl_tfrecord_open(f->paths[i], f->compression == SL_COMPRESSION_GZIP ? SL_TFRECORD_GZIP : SL_TFRECORD_NONE,
                              &o, &f->tf, err, sizeof err);
        f->tf_skipped = 0;
    } else {
        sl_reader_opts_t o;
        sl_reader_opts_init(&o);
        o.engine = f->base.ctx->opts.io_engine;
        rc = sl_reader_open(f->paths[i], &o, &f->s.r, err, sizeof err);
    }
    if (rc < 0) {
        f->file = -1;
        return sl__iter_fail(&f->base, rc, "%s", err);
    }
    f->base.ctx->files_opened++;
    pthread_once(&metrics_once, metrics_init);
    if (m_files_opened)
        sl_metric_add(m_files_opened, 1);
    if (f->kind == SL_SOURCE_TEXT_LINES && f->compression == SL_COMPRESSION_GZIP) {
        f->s.gzip = true;
        f->s.zbuf = malloc(ZBUF_LEN);
        if (!f->s.zbuf || inflateInit2(&f->s.zs, 16 + MAX_WBITS) != Z_OK) {
            file_close(f);
            return sl__iter_fail(&f->base, -ENOMEM, "out of memory opening %s", f->paths[i]);
        }
        f->s.zinit = true;
    }
    if (f->kind == SL_SOURCE_FIXED_LENGTH_RECORDS) {
        /* The dispatcher counted the file the same way at registration. */
        uint64_t size = sl_reader_size(f->s.r), edges = f->header_bytes + f->footer_bytes;
        if (size < edges || (size - edges) % f->record_bytes != 0) {
            rc = sl__iter_fail(&f->base, SL_EDATA,
                               "fixed_length_records: %s holds %" PRIu64 " bytes, not a header of %" PRIu64
                               ", records of %" PRIu64 " and a footer of %" PRIu64,
                               f->paths[i], size, f->header_bytes, f->record_bytes, f->footer_bytes);
            file_close(f);
            return rc;
        }
        f->records = (size - edges) / f->record_bytes;
        rc = sl_reader_seek(f->s.r, f->header_bytes);
        if (rc < 0)
            return read_failed(f, rc);
    }
    return 0;
}

/* ---- the stream of a text file ---- */

static int gz_fill(struct file_iter *f)
{
    struct stream *s = &f->s;
    s->zpos = s->zlen = 0;
    while (s->zlen == 0 && !s->zeof) {
        const uint8_t *in;
        size_t avail;
        int rc = sl_reader_view(s->r, &in, &avail);
        if (rc < 0)
            return read_failed(f, rc);
        if (avail == 0) {
            /* An empty file is an empty stream; an unfinished member is a
             * truncated one. */
            if (s->zmember_end || sl_reader_offset(s->r) == 0) {
                s->zeof = true;
                break;
            }
            return sl__iter_fail(&f->base, SL_EDATA, "%s: truncated gzip stream in %s", what(f), f->paths[f->file]);
        }
        if (s->zmember_end) {
            inflateReset(&s->zs);
            s->zmember_end = false;
        }
        uInt in_len = avail > UINT_MAX ? UINT_MAX : (uInt)avail;
        s->zs.next_in = (Bytef *)in;
        s->zs.avail_in = in_len;
        s->zs.next_out = s->zbuf;
        s->zs.avail_out = (uInt)ZBUF_LEN;
        int zrc = inflate(&s->zs, Z_NO_FLUSH);
        sl_reader_consume(s->r, in_len - s->zs.avail_in);
        s->zlen = ZBUF_LEN - s->zs.avail_out;
        if (zrc == Z_STREAM_END)
            s->zmember_end = true;
        else if (zrc == Z_MEM_ERROR)
            return sl__iter_fail(&f->base, -ENOMEM, "out of memory inflating %s", f->paths[f->file]);
        else if (zrc != Z_OK && zrc != Z_BUF_ERROR)
            return sl__iter_fail(&f->base, SL_EDATA, "%s: corrupt gzip stream in %s at compressed offset %" PRIu64 ": %s",
                                 what(f), f->paths[f->file], sl_reader_offset(s->r),
                                 s->zs.msg ? s->zs.msg : "inflate failed");
    }
    return 0;
}

/* Shows the next bytes of the file's (inflated) stream; *n is 0 at its end. */
static int stream_view(struct file_iter *f, const uint8_t **p, size_t *n)
{
    struct stream *s = &f->s;
    if (!s->gzip) {
        int rc = sl_reader_view(s->r, p, n);
        return rc < 0 ? read_failed(f, rc) : 0;
    }
    if (s->zpos == s->zlen) {
        int rc = gz_fill(f);
        if (rc < 0)
            return rc;
    }
    *p = s->zbuf + s->zpos;
    *n = s->zlen - s->zpos;
    return 0;
}

static void stream_consume(struct stream *s, size_t n)
{
    if (s->gzip)
        s->zpos += n;
    else
        sl_reader_consume(s->r, n);
}

/* ---- records ---- */

/* Reads the next line into out (NULL: skips it). Returns 0, 1 at the end
 * of the file, or an error. A last line without "\n" is a line; an empty
 * file has none (as the dispatcher counts). */
static int next_line(struct file_iter *f, sl_value_t *out)
{
    size_t have = 0;
    bool any = false;
    for (;;) {
        const uint8_t *p;
        size_t n;
        int rc = stream_view(f, &p, &n);
        if (rc < 0)
            return rc;
        if (n == 0) {
            if (!any)
                return 1;
            break;
        }
        any = true;
        const uint8_t *nl = memchr(p, '\n', n);
        size_t take = nl ? (size_t)(nl - p) : n;
        if (have == 0 && nl) {
            /* The common case: the whole line in one view. */
            size_t len = take > 0 && p[take - 1] == '\r' ? take - 1 : take;
            rc = out ? sl_value_set_bytes(out, p, len) : 0;
            stream_consume(&f->s, take + 1);
            f->index++;
            return rc < 0 ? sl__iter_fail(&f->base, rc, "out of memory for a line") : 0;
        }
        if (have + take > MAX_LINE_BYTES)
            return sl__iter_fail(&f->base, SL_ETOOBIG, "text_lines: line %" PRIu64 " of %s is longer than %zu bytes",
                                 f->index, f->paths[f->file], MAX_LINE_BYTES);
        if (out && have + take > f->line_cap) {
            size_t cap = (have + take) * 2;
            uint8_t *g = realloc(f->line, cap);
            if (!g)
                return sl__iter_fail(&f->base, -ENOMEM, "out of memory for a line of %zu bytes", have + take);
            f->line = g;
            f->line_cap = cap;
        }
        if (out)
            memcpy(f->line + have, p, take);
        have += take;
        stream_consume(&f->s, nl ? take + 1 : take);
        if (nl)
            break;
    }
    f->index++;
    if (!out)
        return 0;
    size_t len = have > 0 && f->line[have - 1] == '\r' ? have - 1 : have;
    return sl_value_set_bytes(out, f->line, len) < 0 ? sl__iter_fail(&f->base, -ENOMEM, "out of memory for a line") : 0;
}

/* Reads record index of a fixed-length file, at the stream's position. */
static int next_fixed(struct file_iter *f, sl_value_t *out)
{
    if (f->index >= f->records)
        return 1;
    size_t len = (size_t)f->record_bytes, got = 0;
    uint64_t offsets[2] = {0, len};
    uint8_t *p = sl_value_alloc(out, SL_DTYPE_BYTES, 0, NULL, sizeof offsets + len);
    if (!p)
        return sl__iter_fail(&f->base, -ENOMEM, "out of memory for a record of %zu bytes", len);
    memcpy(p, offsets, sizeof offsets);
    int rc = sl_reader_read(f->s.r, p + sizeof offsets, len, &got);
    if (rc < 0 || got < len) {
        sl_value_clear(out);
        if (rc < 0)
            return read_failed(f, rc);
        return sl__iter_fail(&f->base, SL_EDATA, "fixed_length_records: %s ended inside record %" PRIu64
                             " (it shrank while it was read)", f->paths[f->file], f->index);
    }
    f->index++;
    return 0;
}

/* Reads the next record of the open file into out. 0, 1 at the end of the
 * file, or an error. */
static int next_record(struct file_iter *f, sl_value_t *out)
{
    switch (f->kind) {
    case SL_SOURCE_TFRECORD: {
        const uint8_t *data;
        size_t len;
        int rc = sl_tfrecord_next(f->tf, &data, &len);
        uint64_t skipped = sl_tfrecord_skipped(f->tf);
        f->base.ctx->records_skipped += skipped - f->tf_skipped;
        f->tf_skipped = skipped;
        if (rc < 0)
            return sl__iter_fail(&f->base, rc, "%s", sl_tfrecord_errmsg(f->tf));
        /* The record read is the one before the index: corrupt records
         * skipped on the way count too. */
        f->index = sl_tfrecord_record_index(f->tf);
        if (rc == 1)
            return 1;
        if (sl_value_set_bytes(out, data, len) < 0)
            return sl__iter_fail(&f->base, -ENOMEM, "out of memory for a record of %zu bytes", len);
        return 0;
    }
    case SL_SOURCE_TEXT_LINES: return next_line(f, out);
    default: return next_fixed(f, out);
    }
}

/* Moves the open file forward to record `to` (>= index). 0, or 1 when the
 * file ends first, or an error. */
static int skip_to(struct file_iter *f, uint64_t to)
{
    switch (f->kind) {
    case SL_SOURCE_TFRECORD: {
        int rc = sl_tfrecord_skip_records(f->tf, to - f->index);
        f->index = sl_tfrecord_record_index(f->tf);
        if (rc < 0)
            return sl__iter_fail(&f->base, rc, "%s", sl_tfrecord_errmsg(f->tf));
        return rc;
    }
    case SL_SOURCE_TEXT_LINES:
        while (f->index < to) {
            int rc = next_line(f, NULL);
            if (rc != 0)
                return rc;
        }
        return 0;
    default: {
        if (to > f->records)
            return 1;
        int rc = sl_reader_seek(f->s.r, f->header_bytes + to * f->record_bytes);
        if (rc < 0)
            return read_failed(f, rc);
        f->index = to;
        return 0;
    }
    }
}

/* ---- DYNAMIC ---- */

static int different_files(struct file_iter *f, const sl_split_t *s, const char *why)
{
    return sl__iter_fail(&f->base, SL_EDATA,
                         "split [%" PRIu64 ", %" PRIu64 ") of file %" PRIu32 " of epoch %" PRIu64
                         ": %s; the dispatcher and this worker see different files",
                         s->begin, s->end, s->file_index, f->epoch, why);
}

/* Asks for splits until one is not empty and positions the file at its
 * first record. 0: records [index, end) of the open file are to be read;
 * 1: the epoch is over. */
static int take_split(struct file_iter *f)
{
    sl_iter_ctx_t *ctx = f->base.ctx;
    char why[PATH_MAX + 128];
    files_split_done(f);
    if (f->epoch_over)
        return 1;
    for (;;) {
        sl_split_t s = {.file_index = 0, .epoch = f->epoch};
        ctx->split_requests++;
        int rc = ctx->opts.splits.next_split(ctx->opts.splits.arg, f->epoch, &s);
        if (rc == 1) {
            f->epoch_over = true;
            return 1;
        }
        if (rc < 0)
            return sl__iter_fail(&f->base, rc, "next_split for epoch %" PRIu64 " failed: %s", f->epoch,
                                 sl_strerror(rc));
        if (rc != 0)
            return sl__iter_fail(&f->base, SL_EINTERNAL, "next_split returned %d", rc);
        if (s.begin > s.end)
            return sl__iter_fail(&f->base, SL_EPROTO,
                                 "split [%" PRIu64 ", %" PRIu64 ") of file %" PRIu32 " of epoch %" PRIu64 " is reversed",
                                 s.begin, s.end, s.file_index, f->epoch);
        if (s.file_index >= (uint32_t)f->num_files) {
            snprintf(why, sizeof why, "this worker's patterns match %d files", f->num_files);
            return different_files(f, &s, why);
        }
        rc = sl__split_check_skips(&f->base, s.epoch, &s);
        if (rc < 0)
            return rc;
        if (s.begin == s.end) {
            files_split_start(f, &s);
            files_split_done(f);
            continue;
        }
        /* Forward in the open file when the split starts at or after where
         * it is; from its start otherwise. */
        if (f->file != (int)s.file_index || f->index > s.begin) {
            rc = file_open(f, (int)s.file_index);
            if (rc < 0)
                return rc;
        }
        rc = s.begin > f->index ? skip_to(f, s.begin) : 0;
        if (rc < 0)
            return rc;
        if (rc == 1) {
            snprintf(why, sizeof why, "%s has only %" PRIu64 " records", f->paths[f->file], f->index);
            return different_files(f, &s, why);
        }
        f->end = s.end;
        files_split_start(f, &s);
        return 0;
    }
}

/* ---- the iterator ---- */

static int files_next(sl_iter_t *it, sl_element_t *out)
{
    struct file_iter *f = (struct file_iter *)it;
    for (;;) {
        if (f->file < 0 || f->index >= f->end) {
            if (f->assigned) {
                files_split_done(f);
                return 1;
            }
            if (f->dynamic) {
                int rc = take_split(f);
                if (rc != 0)
                    return rc;
            } else {
                /* FILE sharding: only the files of this worker's index. */
                while (f->next_file < f->num_files && !sl__static_file_is_mine(it->ctx, (uint64_t)f->next_file))
                    f->next_file++;
                if (f->next_file >= f->num_files)
                    return 1;
                int rc = file_open(f, f->next_file++);
                if (rc < 0)
                    return rc;
                f->end = UINT64_MAX;
            }
        }
        uint64_t at = f->index;
        int rc = next_record(f, &out->v[0]);
        if (rc < 0)
            return rc;
        if (rc == 1) {
            /* Under DYNAMIC the split must be read whole, unless what is
             * left of it were corrupt records skipped on the way. */
            if (f->dynamic && f->index < f->end) {
                sl_split_t s = {.file_index = (uint32_t)f->file, .begin = at, .end = f->end};
                char why[PATH_MAX + 128];
                snprintf(why, sizeof why, "%s ends after record %" PRIu64, f->paths[f->file], f->index);
                return different_files(f, &s, why);
            }
            if (!f->dynamic)
                file_close(f);
            f->end = 0;
            continue;
        }
        /* A TFRecord read with on_corrupt "skip" steps over corrupt
         * records; the record it gives may then lie past the split, and
         * belongs to another one. */
        if (f->index > f->end) {
            sl_value_clear(&out->v[0]);
            continue;
        }
        /* The record just read is index - 1 (at, unless corrupt ones
         * were stepped over). A skipped one is read past, not yielded. */
        uint64_t rec = f->index - 1;
        if (f->dynamic) {
            if (files_skipped(f, rec)) {
                sl_value_clear(&out->v[0]);
                continue;
            }
            f->yielded++;
        }
        sl_prov_set(out, f->dynamic ? f->split.epoch : f->epoch, (uint32_t)f->file, rec);
        out->num_elements = 1;
        /* The split's last record: it is read now, not at the next call,
         * so the batch holding that record may carry its done notice
         * (range_after_yield() in sources.c). */
        if (f->dynamic && f->index == f->end)
            files_split_done(f);
        return 0;
    }
}

static int files_reset(sl_iter_t *it)
{
    struct file_iter *f = (struct file_iter *)it;
    files_split_done(f);
    file_close(f);
    f->epoch++;
    f->epoch_over = false;
    f->next_file = 0;
    f->end = 0;
    return 0;
}

static void files_destroy(sl_iter_t *it)
{
    struct file_iter *f = (struct file_iter *)it;
    file_close(f);
    for (int i = 0; i < f->num_files; i++)
        free(f->paths[i]);
    free(f->paths);
    free(f->line);
    free(f);
}

static const sl_iter_vtbl_t files_vtbl = {files_next, files_reset, files_destroy};

int sl__source_files_create(const sl_spec_t *spec, sl_iter_ctx_t *ctx, const char *label, sl_iter_t **out)
{
    const sl_spec_source_t *src = sl_spec_source(spec);
    char err[2 * PATH_MAX + 256];
    int rc;
    if (!ctx->opts.roots)
        return sl__ctx_fail(ctx, -EACCES, label, "file sources need --data-root, and this worker has none");
    struct file_iter *f = calloc(1, sizeof *f);
    if (!f)
        return -ENOMEM;
    sl__iter_init(&f->base, &files_vtbl, NULL, ctx, label);
    f->base.spec.num_components = 1;
    memcpy(f->base.spec.c[0].name, src->name, SL_MAX_NAME);
    f->base.spec.c[0].dtype = SL_DTYPE_BYTES;
    f->kind = src->kind;
    f->compression = src->u.files.compression;
    f->on_corrupt = src->u.files.on_corrupt;
    f->record_bytes = (uint64_t)src->u.files.record_bytes;
    f->header_bytes = (uint64_t)src->u.files.header_bytes;
    f->footer_bytes = (uint64_t)src->u.files.footer_bytes;
    f->dynamic = ctx->opts.sharding == SL_SHARDING_DYNAMIC;
    f->file = -1;
    for (int i = 0; i < sl_spec_source_num_patterns(spec); i++) {
        rc = sl_confine_glob(ctx->opts.roots, sl_spec_source_pattern(spec, i), add_path, f, err, sizeof err);
        if (rc < 0) {
            if (rc != -ENOMEM)
                rc = sl__ctx_fail(ctx, rc, label, "%s", err);
            files_destroy(&f->base);
            return rc;
        }
    }
    *out = &f->base;
    return 0;
}

/* ---- readers for interleave ---- */

bool sl__files_is_source(const sl_iter_t *it)
{
    return it->vt == &files_vtbl;
}

int sl__files_count(const sl_iter_t *src)
{
    return ((const struct file_iter *)src)->num_files;
}

int sl__files_reader_create(const sl_iter_t *src, sl_iter_ctx_t *ctx, const char *label, sl_iter_t **out)
{
    const struct file_iter *s = (const struct file_iter *)src;
    struct file_iter *f = calloc(1, sizeof *f);
    if (!f)
        return -ENOMEM;
    sl__iter_init(&f->base, &files_vtbl, NULL, ctx, label);
    f->base.spec = s->base.spec;
    f->kind = s->kind;
    f->compression = s->compression;
    f->on_corrupt = s->on_corrupt;
    f->record_bytes = s->record_bytes;
    f->header_bytes = s->header_bytes;
    f->footer_bytes = s->footer_bytes;
    f->dynamic = s->dynamic;
    f->assigned = true;
    f->file = -1;
    for (int i = 0; i < s->num_files; i++) {
        int rc = add_path(f, s->paths[i]);
        if (rc < 0) {
            files_destroy(&f->base);
            return rc;
        }
    }
    *out = &f->base;
    return 0;
}

int sl__files_assign(sl_iter_t *reader, uint64_t epoch, const sl_split_t *s)
{
    struct file_iter *f = (struct file_iter *)reader;
    char why[PATH_MAX + 128];
    files_split_done(f);
    f->epoch = epoch;
    f->end = 0;
    if (s->begin > s->end)
        return sl__iter_fail(&f->base, SL_EPROTO,
                             "split [%" PRIu64 ", %" PRIu64 ") of file %" PRIu32 " of epoch %" PRIu64 " is reversed",
                             s->begin, s->end, s->file_index, epoch);
    if (s->file_index >= (uint32_t)f->num_files) {
        snprintf(why, sizeof why, "this worker's patterns match %d files", f->num_files);
        return different_files(f, s, why);
    }
    /* As take_split: forward in the open file when the split starts at or
     * after where it is; from its start otherwise. */
    if (f->file != (int)s->file_index || f->index > s->begin) {
        int rc = file_open(f, (int)s->file_index);
        if (rc < 0)
            return rc;
    }
    int rc = s->begin > f->index ? skip_to(f, s->begin) : 0;
    if (rc < 0)
        return rc;
    if (rc == 1) {
        snprintf(why, sizeof why, "%s has only %" PRIu64 " records", f->paths[f->file], f->index);
        return different_files(f, s, why);
    }
    rc = sl__split_check_skips(&f->base, s->epoch, s);
    if (rc < 0)
        return rc;
    f->end = s->end;
    if (f->dynamic)
        files_split_start(f, s);
    return 0;
}
