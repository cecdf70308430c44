/*
 * pipeline_ops.c: interleave, prefetch and cache against their baselines,
 * measured in the same run on files this program writes (a temp dir,
 * removed at the end). Prints one JSON line per measurement:
 *   interleave: 8 gzip text files of long random lines read with
 *               num_parallel_calls 1 (baseline) and 2 (inflate runs on the
 *               reader threads; short records gain nothing, as handing a
 *               record between threads costs more than reading it);
 *   cache:      the same files, epoch 1 (reading and inflating, baseline)
 *               against epoch 2 from a memory cache and from the LMDB cache;
 *   shuffle:    a range of 10^7 int64s in batches of 1024 behind
 *               shuffle(10^4) and shuffle(10^5): what the shuffle adds per
 *               element (the time less the range's alone), against the
 *               same buffer algorithm on a bare array of int64s, with the
 *               same generator (the least a shuffle can cost; ratio =
 *               that over ours).
 * Ratios above 1 mean faster than the baseline. "bench_pipeline_ops
 * shuffle" runs the shuffle measurements alone (for a profiler).
 */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "cachedb.h"
#include "confine.h"
#include "pipeline.h"
#include "rng.h"
#include "spec.h"

#define FILES 8
#define LINES 40000      /* short lines: the cache measurements */
#define BIG_LINES 1500   /* long, barely compressible lines: the interleave measurement */
#define BIG_LINE 8000

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static sl_pipeline_t *make(const char *json, const sl_pipeline_opts_t *o)
{
    sl_spec_t *spec = NULL;
    sl_pipeline_t *p = NULL;
    char err[1024];
    if (sl_spec_parse(json, strlen(json), &spec, err, sizeof err) < 0 ||
        sl_pipeline_create(spec, o, &p, err, sizeof err) < 0) {
        fprintf(stderr, "pipeline_ops: %s\n", err);
        exit(1);
    }
    sl_spec_free(spec);
    return p;
}

/* The buffer algorithm shuffle does, on bare int64s; returns the
 * seconds, and a checksum in *sum so that the work is not dropped. */
static double bare_shuffle(uint64_t n, uint64_t buffer, int64_t *sum)
{
    int64_t *buf = malloc(buffer * sizeof *buf);
    if (!buf)
        exit(1);
    sl_rng_t rng;
    sl_rng_seed(&rng, 7);
    double t0 = now();
    uint64_t next = 0, held = 0;
    int64_t acc = 0;
    for (;;) {
        while (next < n && held < buffer)
            buf[held++] = (int64_t)next++;
        if (held == 0)
            break;
        uint64_t i = sl_rng_below(&rng, held);
        acc = acc * 31 + buf[i];
        buf[i] = buf[--held];
    }
    double t = now() - t0;
    free(buf);
    *sum = acc;
    return t;
}

/* Runs n batches (or to the end); returns the seconds and the rows. */
static double drain(sl_pipeline_t *p, size_t n, uint64_t *rows)
{
    double t0 = now();
    *rows = 0;
    for (size_t i = 0; i < n; i++) {
        sl_wire_batch_t *b;
        int rc = sl_pipeline_next(p, &b);
        if (rc == 1)
            break;
        if (rc < 0) {
            fprintf(stderr, "pipeline_ops: %s\n", sl_pipeline_errmsg(p));
            exit(1);
        }
        *rows += b->num_elements;
        sl_wire_batch_free(b);
    }
    return now() - t0;
}

/* shuffle: the range alone, then behind two buffer sizes; 0 or 1. */
static int shuffle_benches(void)
{
    sl_pipeline_opts_t o = {0};
    char json[1024];
    uint64_t rows;
    const uint64_t elements = 10000000;
    double base = 0;
    const unsigned buffers[] = {0, 10000, 100000};
    for (int k = 0; k < 3; k++) {
        char shuffle[128] = "";
        if (k)
            snprintf(shuffle, sizeof shuffle, "{\"op\":\"shuffle\",\"seed\":7,\"buffer_size\":%u},", buffers[k]);
        snprintf(json, sizeof json,
                 "{\"source\":{\"type\":\"range\",\"start\":0,\"stop\":%" PRIu64 "},\"ops\":[%s"
                 "{\"op\":\"batch\",\"batch_size\":1024}]}",
                 elements, shuffle);
        sl_pipeline_t *p = make(json, &o);
        double secs = drain(p, SIZE_MAX, &rows);
        sl_pipeline_destroy(p);
        if (rows != elements) {
            fprintf(stderr, "pipeline_ops: shuffle: %" PRIu64 " rows, expected %" PRIu64 "\n", rows, elements);
            return 1;
        }
        if (k == 0) {
            base = secs;
            continue;
        }
        int64_t sum;
        double bare = bare_shuffle(elements, buffers[k], &sum);
        double added = secs - base;
        printf("{\"bench\": \"shuffle_%u\", \"elements\": %" PRIu64
               ", \"baseline\": \"the buffer algorithm on a bare int64 array\", \"baseline_ns_per_element\": %.1f, "
               "\"ns_per_element\": %.1f, \"range_alone_s\": %.3f, \"shuffled_s\": %.3f, \"ratio\": %.3f, "
               "\"checksum\": %" PRId64 "}\n",
               buffers[k], elements, bare / (double)elements * 1e9, added / (double)elements * 1e9, base, secs,
               bare / added, sum);
    }
    return 0;
}

int main(int argc, char **argv)
{
    bool only_shuffle = argc > 1 && strcmp(argv[1], "shuffle") == 0;
    if (argc > 1 && !only_shuffle) {
        fprintf(stderr, "usage: bench_pipeline_ops [shuffle]\n");
        return 2;
    }
    if (only_shuffle)
        return shuffle_benches();
    char dir[] = "/tmp/sl-bench-ops-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    char line[128];
    memset(line, 'x', sizeof line);
    for (int f = 0; f < FILES; f++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/f%d.gz", dir, f);
        gzFile g = gzopen(path, "wb6");
        for (int i = 0; i < LINES; i++)
            gzprintf(g, "%d-%07d %.90s\n", f, i, line);
        gzclose(g);
        snprintf(path, sizeof path, "%s/big%d.gz", dir, f);
        g = gzopen(path, "wb6");
        uint64_t x = (uint64_t)f * 0x9e3779b97f4a7c15u + 1;
        static char big[BIG_LINE + 1];
        for (int i = 0; i < BIG_LINES; i++) {
            for (int k = 0; k < BIG_LINE; k++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                big[k] = (char)('!' + (x % 90));
            }
            big[BIG_LINE] = '\n';
            gzwrite(g, big, BIG_LINE + 1);
        }
        gzclose(g);
    }
    const char *roots_list[] = {dir};
    sl_confine_t *roots = NULL;
    char err[1024];
    if (sl_confine_create(roots_list, 1, &roots, err, sizeof err) < 0)
        return 1;
    char cdir[PATH_MAX];
    snprintf(cdir, sizeof cdir, "%s/cache", dir);
    sl_cache_env_t env = {.mem_limit = (size_t)1 << 30};
    if (sl_cachedb_open(cdir, (size_t)1 << 30, &env.db, err, sizeof err) < 0) {
        fprintf(stderr, "pipeline_ops: %s\n", err);
        return 1;
    }
    sl_pipeline_opts_t o = {.roots = roots, .cache = &env};
    char json[1024];
    uint64_t rows;

    /* interleave: 1 reader against 2. */
    double t[2];
    for (int k = 0; k < 2; k++) {
        snprintf(json, sizeof json,
                 "{\"source\":{\"type\":\"text_lines\",\"compression\":\"gzip\",\"files\":[\"%s/big*.gz\"]},"
                 "\"ops\":[{\"op\":\"interleave\",\"cycle_length\":4,\"num_parallel_calls\":%d},"
                 "{\"op\":\"batch\",\"batch_size\":16}]}",
                 dir, k ? 2 : 1);
        sl_pipeline_t *p = make(json, &o);
        t[k] = drain(p, SIZE_MAX, &rows);
        sl_pipeline_destroy(p);
    }
    printf("{\"bench\": \"interleave_parallel_reads\", \"records\": %" PRIu64
           ", \"baseline\": \"num_parallel_calls 1\", \"baseline_s\": %.3f, \"parallel_2_s\": %.3f, \"ratio\": %.2f}\n",
           rows, t[0], t[1], t[0] / t[1]);

    /* The same with short lines: the handoff between threads dominates. */
    for (int k = 0; k < 2; k++) {
        snprintf(json, sizeof json,
                 "{\"source\":{\"type\":\"text_lines\",\"compression\":\"gzip\",\"files\":[\"%s/f?.gz\"]},"
                 "\"ops\":[{\"op\":\"interleave\",\"cycle_length\":4,\"num_parallel_calls\":%d},"
                 "{\"op\":\"batch\",\"batch_size\":256}]}",
                 dir, k ? 2 : 1);
        sl_pipeline_t *p = make(json, &o);
        t[k] = drain(p, SIZE_MAX, &rows);
        sl_pipeline_destroy(p);
    }
    printf("{\"bench\": \"interleave_parallel_reads_short_records\", \"records\": %" PRIu64
           ", \"baseline\": \"num_parallel_calls 1\", \"baseline_s\": %.3f, \"parallel_2_s\": %.3f, \"ratio\": %.2f}\n",
           rows, t[0], t[1], t[0] / t[1]);

    /* cache: epoch 1 from the files against epoch 2 from the cache. */
    for (int disk = 0; disk < 2; disk++) {
        snprintf(json, sizeof json,
                 "{\"source\":{\"type\":\"text_lines\",\"compression\":\"gzip\",\"files\":[\"%s/f?.gz\"]},"
                 "\"ops\":[{\"op\":\"cache\",\"storage\":\"%s\"},{\"op\":\"repeat\",\"count\":2},"
                 "{\"op\":\"batch\",\"batch_size\":250}]}",
                 dir, disk ? "disk" : "memory");
        sl_pipeline_t *p = make(json, &o);
        size_t per_epoch = FILES * LINES / 250;
        double first = drain(p, per_epoch, &rows);
        double second = drain(p, per_epoch, &rows);
        uint64_t opened = sl_pipeline_files_opened(p);
        sl_pipeline_destroy(p);
        printf("{\"bench\": \"cache_%s_second_epoch\", \"records\": %" PRIu64
               ", \"baseline\": \"first epoch (gzip files)\", \"baseline_s\": %.3f, \"cached_s\": %.3f, \"ratio\": %.2f, "
               "\"files_opened\": %" PRIu64 "}\n",
               disk ? "disk" : "memory", rows, first, second, first / second, opened);
    }

    if (shuffle_benches() != 0)
        return 1;

    sl_cachedb_close(env.db);
    sl_confine_destroy(roots);
    char cmd[PATH_MAX + 32];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : 1;
}
