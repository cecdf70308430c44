/*
 * tfrecord_read.c: bench_tfrecord reads every record of the files it is
 * given, one file after the other, checking both CRCs of each record, and
 * prints one JSON line with what it read and how fast:
 *
 *   bench_tfrecord [--engine uring|pread|auto] [--compression none|gzip]
 *                  [--block-size BYTES] [--depth N] FILE...
 *
 *   {"records": N, "record_bytes": R, "file_bytes": F, "seconds": S,
 *    "GBps": F / S / 1e9, "engine": "uring", "crc32c": "sse4.2"}
 *
 * Exit codes: 0 ok, 2 usage, 1 a file could not be read (reason on stderr).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "crc32c.h"
#include "tfrecord.h"

static int usage(void)
{
    fprintf(stderr, "usage: bench_tfrecord [--engine uring|pread|auto] [--compression none|gzip] "
                    "[--block-size BYTES] [--depth N] FILE...\n");
    return 2;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    sl_tfrecord_opts_t opts;
    sl_tfrecord_opts_init(&opts);
    sl_tfrecord_compression_t comp = SL_TFRECORD_NONE;
    int i = 1;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i += 2) {
        if (i + 1 >= argc)
            return usage();
        const char *v = argv[i + 1];
        if (strcmp(argv[i], "--engine") == 0) {
            if (sl_reader_engine_parse(v, &opts.io.engine) != 0)
                return usage();
        } else if (strcmp(argv[i], "--compression") == 0) {
            if (sl_tfrecord_compression_parse(v, &comp) != 0)
                return usage();
        } else if (strcmp(argv[i], "--block-size") == 0) {
            opts.io.block_size = strtoull(v, NULL, 10);
        } else if (strcmp(argv[i], "--depth") == 0) {
            opts.io.depth = (unsigned)strtoul(v, NULL, 10);
        } else {
            return usage();
        }
    }
    if (i >= argc)
        return usage();

    uint64_t records = 0, record_bytes = 0, file_bytes = 0;
    sl_io_engine_t engine = opts.io.engine;
    double t0 = now();
    for (; i < argc; i++) {
        char err[1024];
        sl_tfrecord_t *t;
        if (sl_tfrecord_open(argv[i], comp, &opts, &t, err, sizeof err) != 0) {
            fprintf(stderr, "bench_tfrecord: %s\n", err);
            return 1;
        }
        engine = sl_tfrecord_engine(t);
        const uint8_t *data;
        size_t len;
        int rc;
        while ((rc = sl_tfrecord_next(t, &data, &len)) == 0) {
            records++;
            record_bytes += len;
            file_bytes += len + 16;
        }
        if (rc < 0) {
            fprintf(stderr, "bench_tfrecord: %s\n", sl_tfrecord_errmsg(t));
            sl_tfrecord_close(t);
            return 1;
        }
        sl_tfrecord_close(t);
    }
    double secs = now() - t0;
    printf("{\"records\": %" PRIu64 ", \"record_bytes\": %" PRIu64 ", \"file_bytes\": %" PRIu64
           ", \"seconds\": %.6f, \"GBps\": %.4f, \"engine\": \"%s\", \"crc32c\": \"%s\"}\n",
           records, record_bytes, file_bytes, secs, secs > 0 ? (double)file_bytes / secs / 1e9 : 0.0,
           sl_reader_engine_name(engine), sl_crc32c_impl());
    return 0;
}
