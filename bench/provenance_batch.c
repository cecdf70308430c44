/*
 * provenance_batch.c: what DYNAMIC provenance costs per shuffled batch, in
 * its three steps, against one pass over the batch's runs that adds up
 * their counts (the baseline: the least a step that looks at every run
 * costs):
 *   tally:   the worker counts the batch's records split by split as it
 *            leaves the pipeline (sl_split_track_out());
 *   encode:  the worker encodes the runs for the wire (sl_provwire_encode());
 *   check:   the client checks them at receipt (sl_provwire_read() without
 *            out);
 *   dense_encode, dense_check: the same in the dense form, which a
 *            client that reads it gets for such batches
 *            (sl_provwire_encode_dense()).
 * The batches are a range cut into splits of --split records behind a
 * shuffle(--buffer) (random replacement, as the shuffle op draws), runs
 * merged as the batch op merges them. Alternating rounds, median of each;
 * prints one JSON line: nanoseconds per batch of each step and the ratio
 * of each to the baseline.
 *
 *   build-release/bench/bench_provenance_batch [--buffer 10000] [--split 65536] [--files 1]
 *
 * --files N spreads the records over N files read in turn (interleave):
 * batches of records of many (epoch, file) pairs.
 */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "provwire.h"
#include "split_track.h"

/* BATCHES batches (1.5 MB of runs: in cache, as a batch just made is),
 * REPEAT times a pass. */
enum { BATCH = 1024, BATCHES = 64, REPEAT = 40, ROUNDS = 9 };

struct batch {
    sl_provenance_run_t runs[BATCH];
    uint64_t n;
};

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rng(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The batches a shuffle of buffer records draws from the range, its
 * record r file r % files's record r / files (an interleave of that many
 * files, one record from each in turn); *records how far they reach. */
static struct batch *make_batches(uint64_t buffer, uint64_t files, uint64_t *records)
{
    struct batch *bs = calloc(BATCHES, sizeof *bs);
    uint64_t *buf = malloc(buffer * sizeof *buf), next = 0;
    if (!bs || !buf)
        exit(1);
    for (; next < buffer; next++)
        buf[next] = next;
    for (int k = 0; k < BATCHES; k++) {
        struct batch *b = &bs[k];
        for (int i = 0; i < BATCH; i++) {
            uint64_t j = rng() % buffer, rec = buf[j] / files;
            uint32_t file = (uint32_t)(buf[j] % files);
            buf[j] = next++;
            sl_provenance_run_t *last = b->n ? &b->runs[b->n - 1] : NULL;
            if (last && last->file_index == file && last->begin + last->count == rec)
                last->count++;
            else
                b->runs[b->n++] = (sl_provenance_run_t){0, file, rec, 1};
        }
    }
    free(buf);
    *records = next;
    return bs;
}

static volatile uint64_t sink;

enum step { SUM, TALLY, ENCODE, CHECK, DENSE_ENCODE, DENSE_CHECK, STEPS };
static const char *const step_name[STEPS] = {"sum", "tally", "encode", "check", "dense_encode", "dense_check"};

/* One pass of step over the batches: ns per batch. wire[0] holds the runs
 * form, wire[1] the dense form. */
static double pass(enum step step, const struct batch *bs, sl_split_track_t *track, uint8_t **wires[2],
                   size_t *wire_lens[2])
{
    bool dense = step == DENSE_ENCODE || step == DENSE_CHECK;
    uint8_t **wire = wires[dense];
    size_t *wire_len = wire_lens[dense];
    sl_split_done_t tally[4096];
    double t0 = now_ns();
    for (int x = 0; x < BATCHES * REPEAT; x++) {
        int k = x % BATCHES;
        const struct batch *b = &bs[k];
        uint64_t runs = 0;
        switch (step) {
        case SUM:
            for (uint64_t i = 0; i < b->n; i++)
                runs += b->runs[i].count;
            break;
        case TALLY:
            runs = sl_split_track_out(track, b->runs, b->n, tally, NULL);
            break;
        case ENCODE:
            free(wire[k]);
            if (sl_provwire_encode(b->runs, b->n, &wire[k], &wire_len[k]) != 0)
                exit(1);
            break;
        case DENSE_ENCODE:
            free(wire[k]);
            if (sl_provwire_encode_dense(b->runs, b->n, BATCH, &wire[k], &wire_len[k]) != 0)
                exit(1);
            break;
        case CHECK:
        case DENSE_CHECK:
            if (sl_provwire_read(wire[k], wire_len[k], BATCH, NULL, &runs, NULL, 0) != 0)
                exit(1);
            break;
        default:
            break;
        }
        sink += runs;
    }
    return (now_ns() - t0) / (BATCHES * REPEAT);
}

int main(int argc, char **argv)
{
    uint64_t buffer = 10000, split = 65536, files = 1;
    static const struct option longs[] = {{"buffer", required_argument, NULL, 'b'},
                                          {"split", required_argument, NULL, 's'},
                                          {"files", required_argument, NULL, 'f'},
                                          {NULL, 0, NULL, 0}};
    for (int c; (c = getopt_long(argc, argv, "", longs, NULL)) != -1;) {
        if (c == 'b')
            buffer = strtoull(optarg, NULL, 10);
        else if (c == 's')
            split = strtoull(optarg, NULL, 10);
        else if (c == 'f')
            files = strtoull(optarg, NULL, 10);
        else
            return 2;
    }
    if (buffer < BATCH || split < BATCH || files < 1 || files > 4096) {
        fprintf(stderr, "--buffer and --split must be at least %d, --files 1 to 4096\n", BATCH);
        return 2;
    }
    uint64_t records;
    struct batch *bs = make_batches(buffer, files, &records);
    /* The splits the batches reach, tracked as a worker tracks them. */
    sl_split_track_t *track = sl_split_track_new();
    uint64_t id = 1;
    for (uint32_t f = 0; f < files; f++)
        for (uint64_t begin = 0; begin < records / files + 1; begin += split, id++) {
            sl_split_t s = {.file_index = f, .begin = begin, .end = begin + split, .split_id = id};
            if (!track || sl_split_track_add(track, 0, &s, NULL) != 0)
                return 1;
        }
    uint8_t **wire[2] = {calloc(BATCHES, sizeof(uint8_t *)), calloc(BATCHES, sizeof(uint8_t *))};
    size_t *wire_len[2] = {calloc(BATCHES, sizeof(size_t)), calloc(BATCHES, sizeof(size_t))}, bytes[2] = {0, 0};
    if (!wire[0] || !wire[1] || !wire_len[0] || !wire_len[1])
        return 1;
    double ns[STEPS][ROUNDS];
    for (int r = 0; r < ROUNDS; r++)
        for (int s = 0; s < STEPS; s++)
            ns[s][r] = pass((enum step)s, bs, track, wire, wire_len);
    for (int f = 0; f < 2; f++) {
        for (int k = 0; k < BATCHES; k++) {
            bytes[f] += wire_len[f][k];
            free(wire[f][k]);
        }
        free(wire[f]);
        free(wire_len[f]);
    }
    printf("{\"bench\": \"provenance_batch\", \"buffer\": %llu, \"split\": %llu, \"files\": %llu, \"batch\": %d, "
           "\"baseline\": \"a pass adding up the runs' counts\", \"wire_bytes\": %zu, \"dense_wire_bytes\": %zu",
           (unsigned long long)buffer, (unsigned long long)split, (unsigned long long)files, BATCH, bytes[0] / BATCHES,
           bytes[1] / BATCHES);
    double base = 0;
    for (int s = 0; s < STEPS; s++) {
        qsort(ns[s], ROUNDS, sizeof ns[s][0], cmp_double);
        double med = ns[s][ROUNDS / 2];
        if (s == SUM)
            base = med;
        printf(", \"%s_ns\": %.0f", step_name[s], med);
        if (s != SUM)
            printf(", \"%s_ratio\": %.2f", step_name[s], med / base);
    }
    printf("}\n");
    sl_split_track_free(track);
    free(bs);
    return 0;
}
