/*
 * fuzz_tfrecord.c: libFuzzer target for the TFRecord reader
 * (storage/tfrecord.c), plain and gzip, which reads the dataset's files:
 * data from anywhere.
 *
 * The input: one mode byte, a byte that says where to cut the gzip members,
 * then the file. Mode bits 0-1: 0 the file as is, 1 the file is gzip as is,
 * 2 and 3 the target gzips the file (as two members, cut where the second
 * byte says) so that the fuzzer explores the records inside a valid
 * stream; bit 2: on_corrupt "skip"; bits 3-5: how many records the skip
 * check skips; bit 6: count a gzip file with sl_tfrecord_count() itself
 * (else with the same walk on the small reader). The file goes through a memfd (no disk), read with pread in
 * 4 KiB blocks, max_record_bytes 1024.
 *
 * Beyond "no crash, no leak": only the documented results, a message with
 * every error, the same error again on the next call, records within
 * max_record_bytes; read without gzip and "fail", the records written again
 * are the file's first bytes; a file read to its clean end counts as many
 * records (sl_tfrecord_count); skipping k records then reading gives record
 * k; and a stream the target gzipped reads as the same records, and ends
 * the same way, as the bytes it compressed.
 * Run it with scripts/fuzz.sh (FUZZ_TARGETS=fuzz_tfrecord).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include "crc32c.h"
#include "le.h"
#include "sluice.h"
#include "tfrecord.h"

#include "fuzz_check.h"

#define MAX_RECORD 1024

typedef struct {
    uint8_t *data;
    size_t len;
} rec_t;

typedef struct {
    rec_t *recs;
    size_t n;
    int end; /* what ended the file: 1, or an error */
    uint64_t skipped;
} result_t;

/* A memfd holding bytes, and the path that opens it. */
static int memfile(const uint8_t *p, size_t n, char *path, size_t pathlen)
{
    int fd = memfd_create("fuzz_tfrecord", MFD_CLOEXEC);
    CHECK(fd >= 0);
    size_t off = 0;
    while (off < n) {
        ssize_t w = write(fd, p + off, n - off);
        CHECK(w > 0);
        off += (size_t)w;
    }
    snprintf(path, pathlen, "/proc/self/fd/%d", fd);
    return fd;
}

static void opts_for(sl_tfrecord_opts_t *o, bool skip)
{
    sl_tfrecord_opts_init(o);
    o->io.engine = SL_IO_PREAD;
    o->io.block_size = 4096;
    o->max_record_bytes = MAX_RECORD;
    o->on_corrupt = skip ? SL_TFRECORD_SKIP : SL_TFRECORD_FAIL;
}

static void read_all(const char *path, sl_tfrecord_compression_t comp, bool skip, result_t *r)
{
    memset(r, 0, sizeof *r);
    sl_tfrecord_opts_t o;
    opts_for(&o, skip);
    sl_tfrecord_t *t;
    char err[512];
    CHECK(sl_tfrecord_open(path, comp, &o, &t, err, sizeof err) == 0);
    for (;;) {
        const uint8_t *d;
        size_t len;
        uint64_t index = sl_tfrecord_record_index(t);
        int rc = sl_tfrecord_next(t, &d, &len);
        if (rc != 0) {
            CHECK(rc == 1 || rc == SL_EDATA || rc == SL_ETOOBIG);
            CHECK((rc == 1) == (sl_tfrecord_errmsg(t)[0] == '\0'));
            CHECK(sl_tfrecord_next(t, &d, &len) == rc);
            r->end = rc;
            break;
        }
        CHECK(len <= MAX_RECORD);
        CHECK(sl_tfrecord_record_index(t) > index);
        r->recs = realloc(r->recs, (r->n + 1) * sizeof *r->recs);
        CHECK(r->recs != NULL);
        rec_t *c = &r->recs[r->n++];
        c->data = malloc(len ? len : 1);
        CHECK(c->data != NULL);
        memcpy(c->data, d, len);
        c->len = len;
    }
    r->skipped = sl_tfrecord_skipped(t);
    if (!skip)
        CHECK(r->skipped == 0);
    sl_tfrecord_close(t);
}

static void result_free(result_t *r)
{
    for (size_t i = 0; i < r->n; i++)
        free(r->recs[i].data);
    free(r->recs);
}

/* The records written again are the first bytes of the file. */
static void check_rewrite(const result_t *r, const uint8_t *file, size_t len)
{
    size_t off = 0;
    for (size_t i = 0; i < r->n; i++) {
        uint8_t hdr[12], foot[4];
        sl_put_le64(hdr, r->recs[i].len);
        sl_put_le32(hdr + 8, sl_crc32c_mask(sl_crc32c(hdr, 8)));
        sl_put_le32(foot, sl_crc32c_mask(sl_crc32c(r->recs[i].data, r->recs[i].len)));
        CHECK(off + 16 + r->recs[i].len <= len);
        CHECK(memcmp(file + off, hdr, 12) == 0);
        CHECK(memcmp(file + off + 12, r->recs[i].data, r->recs[i].len) == 0);
        CHECK(memcmp(file + off + 12 + r->recs[i].len, foot, 4) == 0);
        off += 16 + r->recs[i].len;
    }
    if (r->end == 1)
        CHECK(off == len);
}

/* Skipping k records, then reading, gives record k (a file read with
 * "fail": every record before k was whole). */
static void check_skip(const char *path, sl_tfrecord_compression_t comp, const result_t *r, uint64_t k)
{
    if (k > r->n || (k == r->n && r->end != 1))
        return;
    sl_tfrecord_opts_t o;
    opts_for(&o, false);
    sl_tfrecord_t *t;
    char err[512];
    CHECK(sl_tfrecord_open(path, comp, &o, &t, err, sizeof err) == 0);
    int rc = sl_tfrecord_skip_records(t, k);
    CHECK(rc == 0);
    CHECK(sl_tfrecord_record_index(t) == k);
    const uint8_t *d;
    size_t len;
    rc = sl_tfrecord_next(t, &d, &len);
    if (k < r->n) {
        CHECK(rc == 0 && len == r->recs[k].len && memcmp(d, r->recs[k].data, len) == 0);
    } else {
        CHECK(rc == 1);
    }
    sl_tfrecord_close(t);
}

/* sl_tfrecord_count() reads a gzip file with the default reader (io_uring,
 * 1 MiB of buffers), which costs more than the rest of an input; without
 * full, the same walk (skipping every record) runs on the small reader. */
static void check_count(const char *path, sl_tfrecord_compression_t comp, const result_t *r, bool full)
{
    uint64_t n = 0;
    char err[512] = "";
    int rc;
    if (full || comp == SL_TFRECORD_NONE) {
        rc = sl_tfrecord_count(path, comp, &n, err, sizeof err);
    } else {
        sl_tfrecord_opts_t o;
        opts_for(&o, false);
        sl_tfrecord_t *t;
        CHECK(sl_tfrecord_open(path, comp, &o, &t, err, sizeof err) == 0);
        rc = sl_tfrecord_skip_records(t, UINT64_MAX);
        CHECK(rc == 1 || rc == SL_EDATA);
        n = sl_tfrecord_record_index(t);
        if (rc < 0)
            snprintf(err, sizeof err, "%s", sl_tfrecord_errmsg(t));
        else
            rc = 0;
        sl_tfrecord_close(t);
    }
    CHECK(rc == 0 || rc == SL_EDATA);
    CHECK(rc == 0 || err[0] != '\0');
    if (r->end == 1) {
        CHECK(rc == 0 && n == r->n);
    }
}

/* gzip of p as two members, cut at cut. */
static uint8_t *gzip2(const uint8_t *p, size_t n, size_t cut, size_t *out_len)
{
    size_t cap = compressBound(n) * 2 + 128;
    uint8_t *out = malloc(cap);
    CHECK(out != NULL);
    size_t len = 0;
    size_t parts[2][2] = {{0, cut}, {cut, n}};
    for (int m = 0; m < 2; m++) {
        z_stream zs;
        memset(&zs, 0, sizeof zs);
        /* A small window and hash: inputs are at most a few KiB. */
        CHECK(deflateInit2(&zs, 6, Z_DEFLATED, 16 + 12, 1, Z_DEFAULT_STRATEGY) == Z_OK);
        zs.next_in = (Bytef *)(p + parts[m][0]);
        zs.avail_in = (uInt)(parts[m][1] - parts[m][0]);
        zs.next_out = out + len;
        zs.avail_out = (uInt)(cap - len);
        CHECK(deflate(&zs, Z_FINISH) == Z_STREAM_END);
        len = cap - zs.avail_out;
        deflateEnd(&zs);
    }
    *out_len = len;
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    int mode = data[0] & 3;
    bool skip = data[0] & 4;
    uint64_t k = (data[0] >> 3) & 7;
    const uint8_t *body = data + 2;
    size_t len = size - 2;
    char path[64];

    if (mode == 0 || mode == 1) {
        sl_tfrecord_compression_t comp = mode ? SL_TFRECORD_GZIP : SL_TFRECORD_NONE;
        int fd = memfile(body, len, path, sizeof path);
        result_t r;
        read_all(path, comp, skip, &r);
        if (!skip) {
            if (mode == 0)
                check_rewrite(&r, body, len);
            check_count(path, comp, &r, data[0] & 0x40);
            check_skip(path, comp, &r, k);
        }
        result_free(&r);
        close(fd);
        return 0;
    }

    /* The target's own gzip of the body reads as the body does. */
    size_t glen;
    uint8_t *gz = gzip2(body, len, len ? data[1] % (len + 1) : 0, &glen);
    char plain_path[64];
    int gfd = memfile(gz, glen, path, sizeof path);
    int pfd = memfile(body, len, plain_path, sizeof plain_path);
    free(gz);
    result_t g, p;
    read_all(path, SL_TFRECORD_GZIP, skip, &g);
    read_all(plain_path, SL_TFRECORD_NONE, skip, &p);
    CHECK(g.n == p.n && g.end == p.end && g.skipped == p.skipped);
    for (size_t i = 0; i < g.n; i++)
        CHECK(g.recs[i].len == p.recs[i].len && memcmp(g.recs[i].data, p.recs[i].data, g.recs[i].len) == 0);
    if (!skip) {
        check_count(path, SL_TFRECORD_GZIP, &g, data[0] & 0x40);
        check_skip(path, SL_TFRECORD_GZIP, &g, k);
    }
    result_free(&g);
    result_free(&p);
    close(gfd);
    close(pfd);
    return 0;
}
