/*
 * client_rate.c: bench_client_rate reads one job to its end through
 * libsluice (the shared library, as Python's ctypes layer loads it) and
 * prints how fast the batches came, measured as bench/python_vs_c.py
 * measures the Python client: from the first batch to the last, so that
 * neither side counts the wait for the worker to start the job.
 *
 *   bench_client_rate DISPATCHER SPEC_JSON [SHARDING [MAX_OUTSTANDING [PER_WORKER]]]
 *
 *   {"batches": N, "elements": E, "seconds": S, "cpu_seconds": C}
 *
 * N counts the batches after the first one and S the seconds from the first
 * batch to the end, so N / S is batches per second; C is the CPU time of the
 * process (all its threads, libsluice's too) over those S seconds. Each batch is touched as
 * the Python benchmark touches its arrays: every tensor's first dimension is
 * read. Exit codes: 0 ok, 2 usage, 1 a failure (its message on stderr).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sluice.h"

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    if (argc < 3 || argc > 6) {
        fprintf(stderr, "usage: bench_client_rate DISPATCHER SPEC_JSON [SHARDING [MAX_OUTSTANDING [PER_WORKER]]]\n");
        return 2;
    }
    sl_iterator_opts_t io;
    sl_iterator_opts_init(&io);
    if (argc > 3 && sl_sharding_parse(argv[3], &io.sharding) < 0) {
        fprintf(stderr, "bench_client_rate: sharding \"%s\" is unknown\n", argv[3]);
        return 2;
    }
    if (argc > 4)
        io.max_outstanding = atoi(argv[4]);
    if (argc > 5)
        io.per_worker_outstanding = atoi(argv[5]);

    int status = 1;
    sl_client_t *cl = NULL;
    sl_iterator_t *it = NULL;
    uint64_t ds;
    int rc = sl_client_open(argv[1], NULL, &cl);
    if (rc < 0) {
        fprintf(stderr, "bench_client_rate: dispatcher %s: %s\n", argv[1], sl_client_errmsg(cl));
        goto out;
    }
    rc = sl_client_register_dataset(cl, argv[2], strlen(argv[2]), &ds);
    if (rc < 0) {
        fprintf(stderr, "bench_client_rate: dataset refused: %s\n", sl_client_errmsg(cl));
        goto out;
    }
    rc = sl_iterator_open(cl, ds, &io, &it);
    if (rc < 0) {
        fprintf(stderr, "bench_client_rate: cannot open an iterator: %s\n", sl_iterator_errmsg(it));
        goto out;
    }
    double t0 = 0, cpu0 = 0;
    uint64_t batches = 0, elements = 0;
    for (;;) {
        sl_batch_t *b;
        rc = sl_iterator_next(it, &b);
        if (rc != 0)
            break;
        if (batches++ == 0) {
            t0 = clock_s(CLOCK_MONOTONIC);
            cpu0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
        }
        for (int i = 0; i < sl_batch_num_tensors(b); i++) {
            const sl_tensor_t *t = sl_batch_tensor(b, i);
            elements += t->rank > 0 ? (uint64_t)t->shape[0] : 1;
        }
        sl_batch_release(b);
    }
    double seconds = clock_s(CLOCK_MONOTONIC) - t0, cpu = clock_s(CLOCK_PROCESS_CPUTIME_ID) - cpu0;
    if (rc < 0) {
        fprintf(stderr, "bench_client_rate: %s\n", sl_iterator_errmsg(it));
        goto out;
    }
    printf("{\"batches\": %" PRIu64 ", \"elements\": %" PRIu64 ", \"seconds\": %.6f, \"cpu_seconds\": %.6f}\n",
           batches ? batches - 1 : 0, elements, seconds, cpu);
    status = 0;
out:
    sl_iterator_close(it);
    sl_client_close(cl);
    return status;
}
