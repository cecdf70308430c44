/*
 * bench_parallel_map: runs one dataset spec's pipeline in this process to
 * its end and prints {"elements": N, "batches": B, "seconds": S,
 * "rows_in_place": R, "stages": [...]} (the driver is
 * bench/parallel_map.py); R: rows the batch found written in its block
 * (map-and-batch fusion, sl_pipeline_rows_in_place()); each stage is a
 * parallel stage's parallelism at the end, the least and most it had, its
 * bound and its autotune decisions.
 *
 *   bench_parallel_map SPEC.json DATA_ROOT THREADS
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "confine.h"
#include "pipeline.h"
#include "spec.h"

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s SPEC.json DATA_ROOT THREADS\n", argv[0]);
        return 2;
    }
    static char json[1 << 20];
    FILE *f = fopen(argv[1], "r");
    size_t n = f ? fread(json, 1, sizeof json - 1, f) : 0;
    if (f)
        fclose(f);
    char err[1024];
    sl_spec_t *spec = NULL;
    sl_confine_t *roots = NULL;
    const char *dirs[] = {argv[2]};
    if (sl_spec_parse(json, n, &spec, err, sizeof err) < 0 ||
        sl_confine_create(dirs, 1, &roots, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    sl_pipeline_opts_t o = {.roots = roots, .threads = (unsigned)atoi(argv[3])};
    sl_pipeline_t *p = NULL;
    if (sl_pipeline_create(spec, &o, &p, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    uint64_t elements = 0, batches = 0;
    sl_wire_batch_t *wb;
    int rc;
    while ((rc = sl_pipeline_next(p, &wb)) == 0) {
        elements += wb->num_elements;
        batches++;
        sl_wire_batch_free(wb);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    if (rc < 0) {
        fprintf(stderr, "%s\n", sl_pipeline_errmsg(p));
        return 1;
    }
    printf("{\"elements\": %llu, \"batches\": %llu, \"seconds\": %.6f, \"rows_in_place\": %llu, \"stages\": [",
           (unsigned long long)elements, (unsigned long long)batches,
           (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9,
           (unsigned long long)sl_pipeline_rows_in_place(p));
    sl_pipeline_parallel_stats_t st[16];
    int ns = sl_pipeline_parallel_stats(p, st, 16);
    for (int i = 0; i < ns; i++)
        printf("%s{\"label\": \"%s\", \"autotune\": %s, \"parallelism\": %u, \"min\": %u, \"max\": %u, "
               "\"bound\": %u, \"decisions\": %llu}",
               i ? ", " : "", st[i].label, st[i].autotune ? "true" : "false", st[i].parallelism,
               st[i].min_parallelism, st[i].max_parallelism, st[i].bound, (unsigned long long)st[i].decisions);
    printf("]}\n");
    sl_pipeline_destroy(p);
    sl_spec_free(spec);
    sl_confine_destroy(roots);
    return 0;
}
