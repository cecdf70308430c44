/*
 * split_handout.c: DYNAMIC split hand-outs per second through a real
 * sluice-dispatcher and its durable state store, the path a worker takes
 * (bench/split_handout.py starts the dispatcher and runs this).
 *
 * W fake workers register, each gets its task of one DYNAMIC job over a
 * range source, and each keeps one GetSplit request (max_splits M, its own
 * request_seq) in flight for the measured seconds: every answer is a
 * committed change of the split cursor. The baseline, measured before on the
 * same connections, is GetDataset requests, which change nothing and so
 * commit nothing: the ratio is what durability costs a request.
 *
 * usage: bench_split_handout ADDRESS [workers [max_splits [seconds]]]
 * Prints one JSON line.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_peers.h"

#define MAX_WORKERS 256

enum phase { SETUP, BASELINE, SPLITS };

static struct {
    bench_peers_t peers;
    enum phase phase;
    unsigned max_splits;
    bench_fake_t fakes[MAX_WORKERS];
    unsigned num;
    uint64_t answers, splits;
    double window_splits_per_s; /* splits answered within the last measure()'s window */
} b;

static void send_next(bench_fake_t *f)
{
    if (b.phase == BASELINE) {
        sluice_GetDatasetRequest req = {.dataset_id = b.peers.dataset_id};
        bench_send(f, SL_MSG_GET_DATASET_REQ, &req, NULL, 0);
    } else if (b.phase == SPLITS) {
        sluice_GetSplitRequest req = {.task_id = f->task_id, .epoch = 0, .max_splits = b.max_splits,
                                      .request_seq = ++f->seq};
        bench_send(f, SL_MSG_GET_SPLIT_REQ, &req, NULL, 0);
    }
}

static void on_answer(bench_fake_t *f, const sl_frame_hdr_t *hdr, void *msg)
{
    switch (hdr->type) {
    case SL_MSG_GET_OR_CREATE_JOB_RESP:
        b.peers.job_id = ((sluice_GetOrCreateJobResponse *)msg)->job_id;
        return;
    case SL_MSG_GET_SPLIT_RESP:
        b.splits += ((sluice_GetSplitResponse *)msg)->splits_count;
        /* fall through */
    default:
        b.answers++;
        send_next(f);
    }
}

/* Keeps one request in flight on every fake for seconds: answers per second. */
static double measure(enum phase phase, double seconds)
{
    b.phase = phase;
    b.answers = 0;
    b.splits = 0;
    double elapsed = bench_run_for(&b.peers, b.fakes, b.num, send_next, seconds);
    uint64_t answers = b.answers;
    b.window_splits_per_s = (double)b.splits / elapsed;
    b.phase = SETUP; /* answers still in flight send nothing more */
    bench_drain(&b.peers, b.fakes, b.num);
    return (double)answers / elapsed;
}

int main(int argc, char **argv)
{
    bench_peers_init(&b.peers, "bench_split_handout", argc > 1 ? argv[1] : "", on_answer);
    if (argc < 2)
        bench_die(&b.peers, "usage: bench_split_handout ADDRESS [workers [max_splits [seconds]]]");
    b.num = argc > 2 ? (unsigned)atoi(argv[2]) : 64;
    b.max_splits = argc > 3 ? (unsigned)atoi(argv[3]) : 4;
    double seconds = argc > 4 ? atof(argv[4]) : 3.0;
    if (b.num < 1 || b.num > MAX_WORKERS || b.max_splits < 1 || b.max_splits > 64 || seconds <= 0)
        bench_die(&b.peers, "workers must be 1..256, max_splits 1..64, seconds > 0");

    /* A client makes the dataset and the job; the workers join it. */
    bench_fake_t client = {0};
    bench_connect(&b.peers, &client, SL_ROLE_CLIENT, 10);
    bench_register_dataset(&client, "{\"source\": {\"type\": \"range\", \"stop\": 1000000000000}}", 10);
    sluice_GetOrCreateJobRequest gj = {.dataset_id = b.peers.dataset_id, .sharding = SL_SHARDING_DYNAMIC};
    bench_send(&client, SL_MSG_GET_OR_CREATE_JOB_REQ, &gj, NULL, 0);
    bench_wait_for(&b.peers, NULL, &b.peers.job_id, 10);
    bench_join_workers(&b.peers, b.fakes, b.num, 10);

    double baseline = measure(BASELINE, seconds);
    double requests = measure(SPLITS, seconds);
    double splits = b.window_splits_per_s;
    printf("{\"bench\": \"split_handout\", \"workers\": %u, \"max_splits\": %u, \"splits_per_second\": %.0f, "
           "\"target_splits_per_second\": 50000, \"requests_per_second\": %.0f, "
           "\"baseline\": \"GetDataset requests (no commit) on the same connections\", "
           "\"baseline_requests_per_second\": %.0f, \"ratio\": %.3f}\n",
           b.num, b.max_splits, splits, requests, baseline, requests / baseline);
    bench_peers_close(&b.peers, b.fakes, b.num, &client);
    return 0;
}
