/*
 * test_tfrecord.c: the TFRecord reader (storage/tfrecord.c) on the fixtures
 * of tests/data/tfrecord, written by an independent writer and described by
 * MANIFEST.json, with both engines; then on files made here for what the
 * fixtures do not cover (records larger than a block, bad length CRCs,
 * oversized lengths, concatenated and truncated gzip). Made files live in a
 * temp dir under /tmp, removed by each test.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "crc32c.h"
#include "sluice.h"
#include "tfrecord.h"

#define DATA SL_TEST_DATA "/tfrecord/"

static const sl_io_engine_t engines[] = {SL_IO_URING, SL_IO_PREAD};

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/sl-test-tfrecord-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(tfrecord, .init = setup, .fini = teardown);

/* Every record of a file, copied out. */
typedef struct {
    size_t n;
    uint8_t **data;
    size_t *len;
    uint64_t *offset; /* of each record in the uncompressed stream */
} records_t;

static void records_free(records_t *rs)
{
    for (size_t i = 0; i < rs->n; i++)
        free(rs->data[i]);
    free(rs->data);
    free(rs->len);
    free(rs->offset);
    memset(rs, 0, sizeof *rs);
}

static void records_add(records_t *rs, const uint8_t *p, size_t len, uint64_t offset)
{
    rs->data = realloc(rs->data, (rs->n + 1) * sizeof *rs->data);
    rs->len = realloc(rs->len, (rs->n + 1) * sizeof *rs->len);
    rs->offset = realloc(rs->offset, (rs->n + 1) * sizeof *rs->offset);
    cr_assert(rs->data && rs->len && rs->offset);
    rs->data[rs->n] = malloc(len ? len : 1);
    cr_assert_not_null(rs->data[rs->n]);
    memcpy(rs->data[rs->n], p, len);
    rs->len[rs->n] = len;
    rs->offset[rs->n] = offset;
    rs->n++;
}

static sl_tfrecord_t *open_file(const char *path, sl_tfrecord_compression_t comp, const sl_tfrecord_opts_t *o)
{
    sl_tfrecord_t *t;
    char err[512];
    int rc = sl_tfrecord_open(path, comp, o, &t, err, sizeof err);
    cr_assert_eq(rc, 0, "open %s: %s", path, err);
    return t;
}

static sl_tfrecord_opts_t opts_for(sl_io_engine_t engine)
{
    sl_tfrecord_opts_t o;
    sl_tfrecord_opts_init(&o);
    o.io.engine = engine;
    return o;
}

/* Reads until the end or an error. @return what the last next() returned */
static int read_all(const char *path, sl_tfrecord_compression_t comp, const sl_tfrecord_opts_t *o, records_t *rs,
                    char *errmsg, size_t errlen, uint64_t *skipped)
{
    sl_tfrecord_t *t = open_file(path, comp, o);
    uint64_t offset = 0;
    int rc;
    for (;;) {
        const uint8_t *p;
        size_t len;
        cr_assert_eq(sl_tfrecord_record_index(t), rs->n + sl_tfrecord_skipped(t));
        rc = sl_tfrecord_next(t, &p, &len);
        if (rc != 0)
            break;
        records_add(rs, p, len, offset);
        offset += len + 16;
    }
    if (errmsg)
        snprintf(errmsg, errlen, "%s", sl_tfrecord_errmsg(t));
    if (skipped)
        *skipped = sl_tfrecord_skipped(t);
    /* The end (or the error) stays. */
    const uint8_t *p;
    size_t len;
    cr_assert_eq(sl_tfrecord_next(t, &p, &len), rc);
    sl_tfrecord_close(t);
    return rc;
}

static json_t *manifest_files(json_t **root)
{
    json_error_t jerr;
    *root = json_load_file(DATA "MANIFEST.json", 0, &jerr);
    cr_assert_not_null(*root, "MANIFEST.json: %s", jerr.text);
    json_t *files = json_object_get(*root, "files");
    cr_assert(json_is_object(files));
    return files;
}

static uint64_t manifest_records(const char *name)
{
    json_t *root, *files = manifest_files(&root);
    json_t *f = json_object_get(files, name);
    cr_assert_not_null(f, "%s not in the manifest", name);
    uint64_t n = (uint64_t)json_integer_value(json_object_get(f, "records"));
    json_decref(root);
    return n;
}

Test(tfrecord, basic_files_read_with_both_engines)
{
    static const char *names[] = {"basic-00000-of-00004.tfrecord", "basic-00001-of-00004.tfrecord",
                                  "basic-00002-of-00004.tfrecord", "basic-00003-of-00004.tfrecord",
                                  "images-00000-of-00002.tfrecord", "images-00001-of-00002.tfrecord",
                                  "varlen-00000-of-00001.tfrecord"};
    for (size_t e = 0; e < 2; e++) {
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            char path[512];
            snprintf(path, sizeof path, DATA "%s", names[i]);
            sl_tfrecord_opts_t o = opts_for(engines[e]);
            records_t rs = {0};
            char err[512];
            int rc = read_all(path, SL_TFRECORD_NONE, &o, &rs, err, sizeof err, NULL);
            cr_assert_eq(rc, 1, "%s: %d %s", names[i], rc, err);
            cr_assert_str_eq(err, "");
            cr_assert_eq(rs.n, manifest_records(names[i]), "%s (%s): %zu records", names[i],
                         sl_reader_engine_name(engines[e]), rs.n);
            for (size_t k = 0; k < rs.n; k++)
                cr_assert_gt(rs.len[k], 0);
            records_free(&rs);
        }
    }
}

/* The engine in use is the one asked for. */
Test(tfrecord, engine_is_reported)
{
    for (size_t e = 0; e < 2; e++) {
        sl_tfrecord_opts_t o = opts_for(engines[e]);
        sl_tfrecord_t *t = open_file(DATA "basic-00000-of-00004.tfrecord", SL_TFRECORD_NONE, &o);
        cr_assert_eq(sl_tfrecord_engine(t), engines[e]);
        sl_tfrecord_close(t);
    }
}

Test(tfrecord, gzip_file_holds_the_first_basic_file)
{
    for (size_t e = 0; e < 2; e++) {
        sl_tfrecord_opts_t o = opts_for(engines[e]);
        records_t plain = {0}, gz = {0};
        char err[512];
        cr_assert_eq(read_all(DATA "basic-00000-of-00004.tfrecord", SL_TFRECORD_NONE, &o, &plain, err, sizeof err,
                              NULL),
                     1, "%s", err);
        cr_assert_eq(read_all(DATA "basic-gzip-00000-of-00001.tfrecord.gz", SL_TFRECORD_GZIP, &o, &gz, err,
                              sizeof err, NULL),
                     1, "%s", err);
        cr_assert_eq(gz.n, 250);
        cr_assert_eq(plain.n, 250);
        for (size_t k = 0; k < gz.n; k++) {
            cr_assert_eq(gz.len[k], plain.len[k], "record %zu", k);
            cr_assert(memcmp(gz.data[k], plain.data[k], gz.len[k]) == 0, "record %zu differs", k);
        }
        records_free(&plain);
        records_free(&gz);
    }
}

Test(tfrecord, data_crc_mismatch_is_reported_where_it_is)
{
    const char *path = DATA "corrupt-datacrc.tfrecord";
    for (size_t e = 0; e < 2; e++) {
        sl_tfrecord_opts_t o = opts_for(engines[e]);
        records_t rs = {0};
        char err[512], want[600];
        cr_assert_eq(read_all(path, SL_TFRECORD_NONE, &o, &rs, err, sizeof err, NULL), SL_EDATA);
        cr_assert_eq(rs.n, 7);
        snprintf(want, sizeof want, "tfrecord: data crc mismatch in %s at offset 679 (record 7)", path);
        cr_assert_str_eq(err, want);
        records_free(&rs);

        uint64_t skipped;
        o.on_corrupt = SL_TFRECORD_SKIP;
        cr_assert_eq(read_all(path, SL_TFRECORD_NONE, &o, &rs, err, sizeof err, &skipped), 1, "%s", err);
        cr_assert_eq(rs.n, 19);
        cr_assert_eq(skipped, 1);
        records_free(&rs);
    }
}

Test(tfrecord, truncated_file_is_reported_where_it_ends)
{
    const char *path = DATA "corrupt-truncated.tfrecord";
    for (size_t e = 0; e < 2; e++) {
        sl_tfrecord_opts_t o = opts_for(engines[e]);
        records_t rs = {0};
        char err[512], want[600];
        cr_assert_eq(read_all(path, SL_TFRECORD_NONE, &o, &rs, err, sizeof err, NULL), SL_EDATA);
        cr_assert_eq(rs.n, 19);
        uint64_t end = rs.offset[18] + rs.len[18] + 16;
        snprintf(want, sizeof want, "tfrecord: truncated record in %s at offset %" PRIu64 " (record 19)", path, end);
        cr_assert_str_eq(err, want);
        records_free(&rs);

        uint64_t skipped;
        o.on_corrupt = SL_TFRECORD_SKIP;
        cr_assert_eq(read_all(path, SL_TFRECORD_NONE, &o, &rs, err, sizeof err, &skipped), 1, "%s", err);
        cr_assert_eq(rs.n, 19);
        cr_assert_eq(skipped, 1);
        records_free(&rs);
    }
}

Test(tfrecord, count_matches_the_manifest)
{
    json_t *root, *files = manifest_files(&root);
    const char *name;
    json_t *f;
    int checked = 0;
    json_object_foreach(files, name, f)
    {
        char path[512], err[512];
        snprintf(path, sizeof path, DATA "%s", name);
        const char *comp = json_string_value(json_object_get(f, "compression"));
        sl_tfrecord_compression_t c = SL_TFRECORD_NONE;
        if (comp)
            cr_assert_eq(sl_tfrecord_compression_parse(comp, &c), 0);
        uint64_t n = 0, want = (uint64_t)json_integer_value(json_object_get(f, "records"));
        int rc = sl_tfrecord_count(path, c, &n, err, sizeof err);
        if (strcmp(name, "corrupt-truncated.tfrecord") == 0) {
            /* 20 records were written, the file ends inside the last. */
            cr_assert_eq(rc, SL_EDATA);
            cr_assert_eq(n, (uint64_t)json_integer_value(json_object_get(f, "complete_records")));
            cr_assert(strstr(err, "truncated record") && strstr(err, "(record 19)"), "%s", err);
        } else {
            /* corrupt-datacrc counts 20: counting checks no data CRC. */
            cr_assert_eq(rc, 0, "%s: %s", name, err);
            cr_assert_eq(n, want, "%s: %" PRIu64 " records, manifest says %" PRIu64, name, n, want);
        }
        checked++;
    }
    cr_assert_geq(checked, 10);
    json_decref(root);
}

/* skip_records(k) then next gives what reading k + 1 records gives. */
static void check_skip(const char *path, sl_tfrecord_compression_t comp, sl_io_engine_t engine)
{
    sl_tfrecord_opts_t o = opts_for(engine);
    records_t rs = {0};
    char err[512];
    cr_assert_eq(read_all(path, comp, &o, &rs, err, sizeof err, NULL), 1, "%s", err);
    uint64_t ks[] = {0, 1, 2, 17, rs.n / 2, rs.n - 1};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        sl_tfrecord_t *t = open_file(path, comp, &o);
        cr_assert_eq(sl_tfrecord_skip_records(t, ks[i]), 0);
        cr_assert_eq(sl_tfrecord_record_index(t), ks[i]);
        const uint8_t *p;
        size_t len;
        cr_assert_eq(sl_tfrecord_next(t, &p, &len), 0, "%s", sl_tfrecord_errmsg(t));
        cr_assert_eq(len, rs.len[ks[i]]);
        cr_assert(memcmp(p, rs.data[ks[i]], len) == 0, "record %" PRIu64, ks[i]);
        /* And again from the middle of the file. */
        if (ks[i] + 3 < rs.n) {
            cr_assert_eq(sl_tfrecord_skip_records(t, 2), 0);
            cr_assert_eq(sl_tfrecord_next(t, &p, &len), 0);
            cr_assert(len == rs.len[ks[i] + 3] && memcmp(p, rs.data[ks[i] + 3], len) == 0);
        }
        sl_tfrecord_close(t);
    }
    /* Past the end: 1, with the index at the number of records. */
    sl_tfrecord_t *t = open_file(path, comp, &o);
    cr_assert_eq(sl_tfrecord_skip_records(t, rs.n + 5), 1);
    cr_assert_eq(sl_tfrecord_record_index(t), rs.n);
    const uint8_t *p;
    size_t len;
    cr_assert_eq(sl_tfrecord_next(t, &p, &len), 1);
    sl_tfrecord_close(t);
    records_free(&rs);
}

Test(tfrecord, skip_records_then_next)
{
    for (size_t e = 0; e < 2; e++) {
        check_skip(DATA "basic-00002-of-00004.tfrecord", SL_TFRECORD_NONE, engines[e]);
        check_skip(DATA "varlen-00000-of-00001.tfrecord", SL_TFRECORD_NONE, engines[e]);
        check_skip(DATA "basic-gzip-00000-of-00001.tfrecord.gz", SL_TFRECORD_GZIP, engines[e]);
    }
}

/* Skipping over the corrupt record needs no data CRC; the truncated one
 * stops a skip. */
Test(tfrecord, skip_records_over_corrupt_files)
{
    sl_tfrecord_opts_t o = opts_for(SL_IO_URING);
    sl_tfrecord_t *t = open_file(DATA "corrupt-datacrc.tfrecord", SL_TFRECORD_NONE, &o);
    cr_assert_eq(sl_tfrecord_skip_records(t, 8), 0);
    const uint8_t *p;
    size_t len;
    cr_assert_eq(sl_tfrecord_next(t, &p, &len), 0);
    cr_assert_eq(sl_tfrecord_record_index(t), 9);
    sl_tfrecord_close(t);

    t = open_file(DATA "corrupt-truncated.tfrecord", SL_TFRECORD_NONE, &o);
    cr_assert_eq(sl_tfrecord_skip_records(t, 25), SL_EDATA);
    cr_assert(strstr(sl_tfrecord_errmsg(t), "truncated record"), "%s", sl_tfrecord_errmsg(t));
    cr_assert(strstr(sl_tfrecord_errmsg(t), "(record 19)"), "%s", sl_tfrecord_errmsg(t));
    sl_tfrecord_close(t);
}

Test(tfrecord, compression_names)
{
    sl_tfrecord_compression_t c;
    cr_assert_eq(sl_tfrecord_compression_parse("none", &c), 0);
    cr_assert_eq(c, SL_TFRECORD_NONE);
    cr_assert_eq(sl_tfrecord_compression_parse("gzip", &c), 0);
    cr_assert_eq(c, SL_TFRECORD_GZIP);
    cr_assert_eq(sl_tfrecord_compression_parse("zstd", &c), SL_EINVAL);
}

/* ---- files made here ---- */

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Appends one record to a buffer; a nonzero `claimed` writes that length
 * (with a good CRC) instead of len. */
static size_t put_record(uint8_t *out, const uint8_t *data, size_t len, uint64_t claimed)
{
    put_le64(out, claimed ? claimed : len);
    put_le32(out + 8, sl_crc32c_mask(sl_crc32c(out, 8)));
    memcpy(out + 12, data, len);
    put_le32(out + 12 + len, sl_crc32c_mask(sl_crc32c(data, len)));
    return len + 16;
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

/* Records of 0 bytes to three blocks, read with 4 KiB blocks: many lie
 * across blocks. */
Test(tfrecord, records_across_blocks)
{
    static const size_t lens[] = {0, 1, 4000, 4080, 4096, 5000, 12288, 3, 9000, 70000, 0, 4079};
    size_t total = 0;
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
        total += lens[i] + 16;
    /* Record i holds payload[i, i + len): one byte more per record. */
    size_t payload_len = 70000 + sizeof lens / sizeof lens[0];
    uint8_t *file = malloc(total), *payload = malloc(payload_len);
    cr_assert(file && payload);
    for (size_t i = 0; i < payload_len; i++)
        payload[i] = (uint8_t)(i * 131 + 7);
    size_t off = 0;
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
        off += put_record(file + off, payload + i, lens[i], 0);
    char path[128];
    snprintf(path, sizeof path, "%s/blocks.tfrecord", dir);
    write_file(path, file, total);

    for (size_t e = 0; e < 2; e++) {
        sl_tfrecord_opts_t o = opts_for(engines[e]);
        o.io.block_size = 4096;
        o.io.depth = 2;
        records_t rs = {0};
        char err[512];
        cr_assert_eq(read_all(path, SL_TFRECORD_NONE, &o, &rs, err, sizeof err, NULL), 1, "%s", err);
        cr_assert_eq(rs.n, sizeof lens / sizeof lens[0]);
        for (size_t i = 0; i < rs.n; i++) {
            cr_assert_eq(rs.len[i], lens[i]);
            cr_assert(memcmp(rs.data[i], payload + i, lens[i]) == 0, "record %zu", i);
        }
        records_free(&rs);
    }
    uint64_t n;
    char err[256];
    cr_assert_eq(sl_tfrecord_count(path, SL_TFRECORD_NONE, &n, err, sizeof err), 0, "%s", err);
    cr_assert_eq(n, sizeof lens / sizeof lens[0]);
    free(file);
    free(payload);
}

Test(tfrecord, length_crc_mismatch)
{
    uint8_t file[3 * 32];
    const uint8_t *data = (const uint8_t *)"sixteen bytes!!!";
    size_t off = 0;
    off += put_record(file + off, data, 16, 0);
    size_t bad = off;
    off += put_record(file + off, data, 16, 0);
    off += put_record(file + off, data, 16, 0);
    file[bad + 9] ^= 0x40; /* the length's CRC */
    char path[128];
    snprintf(path, sizeof path, "%s/lencrc.tfrecord", dir);
    write_file(path, file, off);

    sl_tfrecord_opts_t o = opts_for(SL_IO_URING);
    records_t rs = {0};
    char err[512], want[600];
    cr_assert_eq(read_all(path, SL_TFRECORD_NONE, &o, &rs, err, sizeof err, NULL), SL_EDATA);
    cr_assert_eq(rs.n, 1);
    snprintf(want, sizeof want, "tfrecord: length crc mismatch in %s at offset %zu (record 1)", path, bad);
    cr_assert_str_eq(err, want);
    records_free(&rs);

    /* Skipping cannot go past a length it cannot trust: the file ends. */
    uint64_t skipped;
    o.on_corrupt = SL_TFRECORD_SKIP;
    cr_assert_eq(read_all(path, SL_TFRECORD_NONE, &o, &rs, err, sizeof err, &skipped), 1);
    cr_assert_eq(rs.n, 1);
    cr_assert_eq(skipped, 1);
    records_free(&rs);

    uint64_t n;
    cr_assert_eq(sl_tfrecord_count(path, SL_TFRECORD_NONE, &n, err, sizeof err), SL_EDATA);
    cr_assert_eq(n, 1);
    cr_assert_str_eq(err, want);
}

/* A length the file cannot back, with a good CRC: refused before any
 * allocation, whatever the mode. */
Test(tfrecord, length_over_max_record_bytes)
{
    uint8_t file[64];
    const uint8_t *data = (const uint8_t *)"12345678";
    size_t off = put_record(file, data, 8, 0);
    off += put_record(file + off, data, 8, (uint64_t)1 << 40);
    char path[128];
    snprintf(path, sizeof path, "%s/huge.tfrecord", dir);
    write_file(path, file, off);
    for (int skip = 0; skip < 2; skip++) {
        sl_tfrecord_opts_t o = opts_for(SL_IO_PREAD);
        o.on_corrupt = skip ? SL_TFRECORD_SKIP : SL_TFRECORD_FAIL;
        records_t rs = {0};
        char err[512];
        cr_assert_eq(read_all(path, SL_TFRECORD_NONE, &o, &rs, err, sizeof err, NULL), SL_ETOOBIG);
        cr_assert_eq(rs.n, 1);
        cr_assert(strstr(err, "max_record_bytes") && strstr(err, path) && strstr(err, "(record 1)"), "%s", err);
        records_free(&rs);
    }
    /* A real record over a small limit. */
    sl_tfrecord_opts_t o = opts_for(SL_IO_URING);
    o.max_record_bytes = 10;
    records_t rs = {0};
    cr_assert_eq(read_all(DATA "basic-00000-of-00004.tfrecord", SL_TFRECORD_NONE, &o, &rs, NULL, 0, NULL),
                 SL_ETOOBIG);
    records_free(&rs);
    /* Counting allocates nothing; the claimed length runs past the end. */
    uint64_t n;
    char err[512];
    cr_assert_eq(sl_tfrecord_count(path, SL_TFRECORD_NONE, &n, err, sizeof err), SL_EDATA);
    cr_assert_eq(n, 1);
}

/* Gzips n bytes as one member. @return the compressed length */
static size_t gzip_member(const uint8_t *in, size_t n, uint8_t *out, size_t cap)
{
    z_stream zs = {0};
    cr_assert_eq(deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
    zs.next_in = (Bytef *)in;
    zs.avail_in = (uInt)n;
    zs.next_out = out;
    zs.avail_out = (uInt)cap;
    cr_assert_eq(deflate(&zs, Z_FINISH), Z_STREAM_END);
    size_t len = cap - zs.avail_out;
    deflateEnd(&zs);
    return len;
}

static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(*n);
    cr_assert_not_null(buf);
    cr_assert_eq(fread(buf, 1, *n, f), *n);
    fclose(f);
    return buf;
}

/* The first basic file gzipped as three members, cut inside records; then
 * the same cut short, and with a corrupt byte. */
Test(tfrecord, gzip_members_and_damage)
{
    size_t n;
    uint8_t *plain = slurp(DATA "basic-00000-of-00004.tfrecord", &n);
    size_t cap = n + 4096;
    uint8_t *gz = malloc(cap);
    cr_assert_not_null(gz);
    size_t cut1 = n / 3 + 5, cut2 = 2 * n / 3 + 11, gzlen = 0;
    gzlen += gzip_member(plain, cut1, gz, cap);
    gzlen += gzip_member(plain + cut1, cut2 - cut1, gz + gzlen, cap - gzlen);
    gzlen += gzip_member(plain + cut2, n - cut2, gz + gzlen, cap - gzlen);
    char path[128], err[512];
    snprintf(path, sizeof path, "%s/members.tfrecord.gz", dir);
    write_file(path, gz, gzlen);

    sl_tfrecord_opts_t o = opts_for(SL_IO_URING);
    o.io.block_size = 4096; /* so that members end inside blocks */
    records_t rs = {0}, ref = {0};
    cr_assert_eq(read_all(DATA "basic-00000-of-00004.tfrecord", SL_TFRECORD_NONE, &o, &ref, err, sizeof err, NULL), 1);
    cr_assert_eq(read_all(path, SL_TFRECORD_GZIP, &o, &rs, err, sizeof err, NULL), 1, "%s", err);
    cr_assert_eq(rs.n, ref.n);
    for (size_t k = 0; k < rs.n; k++)
        cr_assert(rs.len[k] == ref.len[k] && memcmp(rs.data[k], ref.data[k], rs.len[k]) == 0, "record %zu", k);
    records_free(&rs);
    uint64_t count;
    cr_assert_eq(sl_tfrecord_count(path, SL_TFRECORD_GZIP, &count, err, sizeof err), 0, "%s", err);
    cr_assert_eq(count, 250);

    /* Cut short inside the compressed stream. */
    write_file(path, gz, gzlen - 100);
    int rc = read_all(path, SL_TFRECORD_GZIP, &o, &rs, err, sizeof err, NULL);
    cr_assert_eq(rc, SL_EDATA);
    cr_assert(strstr(err, path), "%s", err);
    cr_assert_lt(rs.n, 250);
    records_free(&rs);

    /* A corrupt byte in the deflate data of the first member. */
    gz[200] ^= 0xff;
    write_file(path, gz, gzlen);
    rc = read_all(path, SL_TFRECORD_GZIP, &o, &rs, err, sizeof err, NULL);
    cr_assert_eq(rc, SL_EDATA, "%d %s", rc, err);
    cr_assert(strstr(err, path), "%s", err);
    records_free(&rs);

    /* Not gzip at all. */
    rc = read_all(DATA "basic-00000-of-00004.tfrecord", SL_TFRECORD_GZIP, &o, &rs, err, sizeof err, NULL);
    cr_assert_eq(rc, SL_EDATA);
    cr_assert(strstr(err, "gzip"), "%s", err);
    records_free(&rs);
    records_free(&ref);
    free(gz);
    free(plain);
}

Test(tfrecord, empty_file_has_no_records)
{
    char path[128], err[256];
    snprintf(path, sizeof path, "%s/empty.tfrecord", dir);
    write_file(path, "", 0);
    for (int c = 0; c < 2; c++) {
        records_t rs = {0};
        sl_tfrecord_opts_t o = opts_for(SL_IO_URING);
        cr_assert_eq(read_all(path, (sl_tfrecord_compression_t)c, &o, &rs, err, sizeof err, NULL), 1, "%s", err);
        cr_assert_eq(rs.n, 0);
        uint64_t n = 7;
        cr_assert_eq(sl_tfrecord_count(path, (sl_tfrecord_compression_t)c, &n, err, sizeof err), 0);
        cr_assert_eq(n, 0);
    }
}

Test(tfrecord, open_error_names_the_file)
{
    sl_tfrecord_t *t;
    char err[512];
    cr_assert_eq(sl_tfrecord_open(DATA "nope.tfrecord", SL_TFRECORD_NONE, NULL, &t, err, sizeof err), -ENOENT);
    cr_assert(strstr(err, "nope.tfrecord"), "%s", err);
}
