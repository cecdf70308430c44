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
#include <time.h>

#include <event2/event.h>

#include "conn.h"
#include "frame.h"
#include "sluice.h"

#define MAX_WORKERS 256

enum phase { SETUP, BASELINE, SPLITS, STOPPING };

struct fake {
    sl_conn_t *conn;
    bool ready;
    uint64_t worker_id, task_id;
    uint64_t seq;
    bool in_flight;
};

static struct {
    struct event_base *base;
    const char *address;
    enum phase phase;
    uint64_t dataset_id, job_id;
    unsigned max_splits;
    struct fake fakes[MAX_WORKERS];
    unsigned num;
    uint64_t answers, splits;
    double window_splits_per_s; /* splits answered within the last measure()'s window */
    uint32_t next_id;
    int failed;
} b;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what)
{
    fprintf(stderr, "bench_split_handout: %s\n", what);
    exit(1);
}

static void send_next(struct fake *f)
{
    if (b.phase == BASELINE) {
        sluice_GetDatasetRequest req = {.dataset_id = b.dataset_id};
        f->in_flight = sl_conn_send(f->conn, SL_MSG_GET_DATASET_REQ, ++b.next_id, &req, NULL, 0, NULL, NULL) == 0;
    } else if (b.phase == SPLITS) {
        sluice_GetSplitRequest req = {.task_id = f->task_id, .epoch = 0, .max_splits = b.max_splits,
                                      .request_seq = ++f->seq};
        f->in_flight = sl_conn_send(f->conn, SL_MSG_GET_SPLIT_REQ, ++b.next_id, &req, NULL, 0, NULL, NULL) == 0;
    }
}

static void on_ready(sl_conn_t *c, void *arg)
{
    (void)c;
    ((struct fake *)arg)->ready = true;
}

static void on_frame(sl_conn_t *c, const sl_frame_hdr_t *hdr, void *msg, uint8_t *payload, void *arg)
{
    struct fake *f = arg;
    (void)c;
    free(payload);
    f->in_flight = false;
    switch (hdr->type) {
    case SL_MSG_ERROR:
        fprintf(stderr, "bench_split_handout: dispatcher: %s\n", ((sluice_Error *)msg)->message);
        b.failed = 1;
        return;
    case SL_MSG_REGISTER_DATASET_RESP:
        b.dataset_id = ((sluice_RegisterDatasetResponse *)msg)->dataset_id;
        return;
    case SL_MSG_GET_OR_CREATE_JOB_RESP:
        b.job_id = ((sluice_GetOrCreateJobResponse *)msg)->job_id;
        return;
    case SL_MSG_WORKER_REGISTER_RESP:
        f->worker_id = ((sluice_WorkerRegisterResponse *)msg)->worker_id;
        return;
    case SL_MSG_WORKER_HEARTBEAT_RESP: {
        const sluice_WorkerHeartbeatResponse *r = msg;
        for (pb_size_t i = 0; i < r->new_tasks_count; i++)
            if (r->new_tasks[i].job_id == b.job_id)
                f->task_id = r->new_tasks[i].task_id;
        return;
    }
    case SL_MSG_GET_SPLIT_RESP:
        b.splits += ((sluice_GetSplitResponse *)msg)->splits_count;
        /* fall through */
    default:
        b.answers++;
        send_next(f);
    }
}

static void on_close(sl_conn_t *c, int err, const char *why, void *arg)
{
    (void)c;
    (void)err;
    ((struct fake *)arg)->conn = NULL;
    if (b.phase != STOPPING) {
        fprintf(stderr, "bench_split_handout: connection closed: %s\n", why);
        b.failed = 1;
    }
}

static const sl_conn_cbs_t cbs = {on_ready, on_frame, on_close};

/* Runs the loop until *flag is set by a callback (or 10 s pass). */
static void wait_for(const bool *flag, const uint64_t *value)
{
    double deadline = now_s() + 10;
    while (!b.failed && now_s() < deadline && !(flag ? *flag : *value != 0))
        event_base_loop(b.base, EVLOOP_ONCE);
    if (b.failed || now_s() >= deadline)
        die("setup did not finish");
}

static struct fake *connect_fake(struct fake *f, sl_role_t role)
{
    char err[256];
    sl_limits_t limits = {.max_payload = 1 << 20};
    if (sl_conn_connect(b.base, b.address, NULL, role, SL_ROLE_DISPATCHER, &limits, 5000, &cbs, f, &f->conn, err,
                        sizeof err) < 0)
        die(err);
    wait_for(&f->ready, NULL);
    return f;
}

/* Keeps one request in flight on every fake for seconds: answers per second. */
static double measure(enum phase phase, double seconds)
{
    b.phase = phase;
    b.answers = 0;
    b.splits = 0;
    double t0 = now_s();
    for (unsigned i = 0; i < b.num; i++)
        send_next(&b.fakes[i]);
    while (!b.failed && now_s() - t0 < seconds)
        event_base_loop(b.base, EVLOOP_ONCE);
    double elapsed = now_s() - t0;
    uint64_t answers = b.answers;
    b.window_splits_per_s = (double)b.splits / elapsed;
    b.phase = SETUP; /* answers still in flight send nothing more */
    bool busy = true;
    while (busy && !b.failed) {
        busy = false;
        for (unsigned i = 0; i < b.num; i++)
            busy |= b.fakes[i].in_flight;
        if (busy)
            event_base_loop(b.base, EVLOOP_ONCE);
    }
    if (b.failed)
        die("a request failed");
    return (double)answers / elapsed;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        die("usage: bench_split_handout ADDRESS [workers [max_splits [seconds]]]");
    b.address = argv[1];
    b.num = argc > 2 ? (unsigned)atoi(argv[2]) : 64;
    b.max_splits = argc > 3 ? (unsigned)atoi(argv[3]) : 4;
    double seconds = argc > 4 ? atof(argv[4]) : 3.0;
    if (b.num < 1 || b.num > MAX_WORKERS || b.max_splits < 1 || b.max_splits > 64 || seconds <= 0)
        die("workers must be 1..256, max_splits 1..64, seconds > 0");
    b.base = event_base_new();
    if (!b.base)
        die("out of memory");

    /* A client makes the dataset and the job; the workers join it. */
    struct fake client = {0};
    connect_fake(&client, SL_ROLE_CLIENT);
    const char *spec = "{\"source\": {\"type\": \"range\", \"stop\": 1000000000000}}";
    sluice_RegisterDatasetRequest rd = sluice_RegisterDatasetRequest_init_zero;
    sl_conn_send(client.conn, SL_MSG_REGISTER_DATASET_REQ, ++b.next_id, &rd, spec, strlen(spec), NULL, NULL);
    wait_for(NULL, &b.dataset_id);
    sluice_GetOrCreateJobRequest gj = {.dataset_id = b.dataset_id, .sharding = SL_SHARDING_DYNAMIC};
    sl_conn_send(client.conn, SL_MSG_GET_OR_CREATE_JOB_REQ, ++b.next_id, &gj, NULL, 0, NULL, NULL);
    wait_for(NULL, &b.job_id);
    for (unsigned i = 0; i < b.num; i++) {
        struct fake *f = connect_fake(&b.fakes[i], SL_ROLE_WORKER);
        sluice_WorkerRegisterRequest wr = sluice_WorkerRegisterRequest_init_zero;
        wr.client_keys = true;
        snprintf(wr.address, sizeof wr.address, "127.0.0.1:%u", 20000 + i);
        sl_conn_send(f->conn, SL_MSG_WORKER_REGISTER_REQ, ++b.next_id, &wr, NULL, 0, NULL, NULL);
        wait_for(NULL, &f->worker_id);
        sluice_WorkerHeartbeatRequest hb = sluice_WorkerHeartbeatRequest_init_zero;
        hb.worker_id = f->worker_id;
        sl_conn_send(f->conn, SL_MSG_WORKER_HEARTBEAT_REQ, ++b.next_id, &hb, NULL, 0, NULL, NULL);
        wait_for(NULL, &f->task_id);
    }

    double baseline = measure(BASELINE, seconds);
    double requests = measure(SPLITS, seconds);
    double splits = b.window_splits_per_s;
    printf("{\"bench\": \"split_handout\", \"workers\": %u, \"max_splits\": %u, \"splits_per_second\": %.0f, "
           "\"target_splits_per_second\": 50000, \"requests_per_second\": %.0f, "
           "\"baseline\": \"GetDataset requests (no commit) on the same connections\", "
           "\"baseline_requests_per_second\": %.0f, \"ratio\": %.3f}\n",
           b.num, b.max_splits, splits, requests, baseline, requests / baseline);
    b.phase = STOPPING;
    for (unsigned i = 0; i < b.num; i++)
        if (b.fakes[i].conn)
            sl_conn_close(b.fakes[i].conn);
    if (client.conn)
        sl_conn_close(client.conn);
    event_base_free(b.base);
    return 0;
}
