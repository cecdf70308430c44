/*
 * job_scale.c: DYNAMIC split hand-outs of one active job through a real
 * sluice-dispatcher as the number of live jobs it holds grows
 * (bench/job_scale.py starts the dispatcher and runs this).
 *
 * A client registers a range dataset and creates the active DYNAMIC job; W
 * fake workers register and each gets its task of it. Then, for each level
 * N of the list (ascending), the client creates anonymous DYNAMIC jobs
 * through the protocol until the dispatcher holds N jobs (each with a task
 * on every worker and a client lease; they stay idle), and the workers keep
 * one GetSplit request (its own request_seq) in flight each for the measured
 * seconds: hand-outs per second and the 99th percentile of a request's
 * latency. Every answer is a committed change. Then the same with every
 * request a replay of the last (answered again, nothing to commit): the
 * dispatcher's own work per request without the store's fsync. The first level is the
 * baseline, measured in the same run against the same dispatcher.
 *
 * With the dispatcher's pid it also says the CPU time its loop thread spent
 * per request (/proc/PID/schedstat), which moves far less than rates and
 * latencies with the machine's load.
 *
 * usage: bench_job_scale ADDRESS LEVELS [workers [seconds [dispatcher_pid]]]
 *   LEVELS: comma-separated job counts, ascending (e.g. 10,1000,10000)
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

#define MAX_WORKERS 64
#define MAX_LEVELS 8
#define MAX_SAMPLES (1u << 22)
#define JOBS_IN_FLIGHT 64

struct fake {
    sl_conn_t *conn;
    bool ready;
    uint64_t worker_id, task_id;
    uint64_t seq;
    bool in_flight;
    double sent_at;
};

static struct {
    struct event_base *base;
    const char *address;
    bool measuring;
    bool replay; /* GetSplit requests repeat the last request_seq */
    uint64_t dataset_id, job_id;
    struct fake fakes[MAX_WORKERS];
    unsigned num;
    uint64_t answers, splits;
    double *lat; /* seconds of each answered GetSplit of the measured window */
    size_t num_lat;
    unsigned jobs_in_flight;
    uint64_t jobs_made;
    uint32_t next_id;
    int failed;
    int dispatcher_pid; /* > 0: its loop thread's CPU time is read from /proc */
} b;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The CPU time (ns) the dispatcher's loop thread (its main thread) ran,
 * from /proc/PID/schedstat; 0 when unknown. Unlike wall-clock rates it
 * hardly moves with what else the machine runs. */
static uint64_t dispatcher_cpu_ns(void)
{
    if (b.dispatcher_pid <= 0)
        return 0;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/schedstat", b.dispatcher_pid);
    FILE *f = fopen(path, "r");
    unsigned long long ns = 0;
    if (f) {
        if (fscanf(f, "%llu", &ns) != 1)
            ns = 0;
        fclose(f);
    }
    return ns;
}

static void die(const char *what)
{
    fprintf(stderr, "bench_job_scale: %s\n", what);
    exit(1);
}

static void send_split(struct fake *f)
{
    /* Replayed: the last request again, answered from the task's last
     * answer with nothing to commit (what a worker that lost an answer
     * sends): the dispatcher's lookups without the store's fsync. */
    if (!b.replay || f->seq == 0)
        f->seq++;
    sluice_GetSplitRequest req = {.task_id = f->task_id, .epoch = 0, .max_splits = 1, .request_seq = f->seq};
    f->sent_at = now_s();
    f->in_flight = sl_conn_send(f->conn, SL_MSG_GET_SPLIT_REQ, ++b.next_id, &req, NULL, 0, NULL, NULL) == 0;
}

static void send_job(sl_conn_t *c)
{
    sluice_GetOrCreateJobRequest gj = {.dataset_id = b.dataset_id, .sharding = SL_SHARDING_DYNAMIC};
    if (sl_conn_send(c, SL_MSG_GET_OR_CREATE_JOB_REQ, ++b.next_id, &gj, NULL, 0, NULL, NULL) < 0)
        die("cannot send a job request");
    b.jobs_in_flight++;
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
        fprintf(stderr, "bench_job_scale: dispatcher: %s\n", ((sluice_Error *)msg)->message);
        b.failed = 1;
        return;
    case SL_MSG_REGISTER_DATASET_RESP:
        b.dataset_id = ((sluice_RegisterDatasetResponse *)msg)->dataset_id;
        return;
    case SL_MSG_GET_OR_CREATE_JOB_RESP:
        if (!b.job_id)
            b.job_id = ((sluice_GetOrCreateJobResponse *)msg)->job_id;
        b.jobs_in_flight--;
        b.jobs_made++;
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
    case SL_MSG_GET_SPLIT_RESP: {
        const sluice_GetSplitResponse *r = msg;
        if (r->splits_count == 0)
            die("a GetSplit answer without splits (the job ended or the task is held back)");
        if (b.measuring) {
            b.splits += r->splits_count;
            b.answers++;
            if (b.num_lat < MAX_SAMPLES)
                b.lat[b.num_lat++] = now_s() - f->sent_at;
            send_split(f);
        }
        return;
    }
    default:
        return;
    }
}

static void on_close(sl_conn_t *c, int err, const char *why, void *arg)
{
    (void)c;
    (void)err;
    ((struct fake *)arg)->conn = NULL;
    if (b.dataset_id != UINT64_MAX) {
        fprintf(stderr, "bench_job_scale: connection closed: %s\n", why);
        b.failed = 1;
    }
}

static const sl_conn_cbs_t cbs = {on_ready, on_frame, on_close};

/* Runs the loop until *flag is set by a callback (or 30 s pass). */
static void wait_for(const bool *flag, const uint64_t *value)
{
    double deadline = now_s() + 30;
    while (!b.failed && now_s() < deadline && !(flag ? *flag : *value != 0))
        event_base_loop(b.base, EVLOOP_ONCE);
    if (b.failed || now_s() >= deadline)
        die("setup did not finish");
}

static void connect_fake(struct fake *f, sl_role_t role)
{
    char err[256];
    sl_limits_t limits = {.max_payload = 1 << 20};
    if (sl_conn_connect(b.base, b.address, NULL, role, SL_ROLE_DISPATCHER, &limits, 5000, &cbs, f, &f->conn, err,
                        sizeof err) < 0)
        die(err);
    wait_for(&f->ready, NULL);
}

/* Creates jobs until total exist, JOBS_IN_FLIGHT requests at a time. */
static void make_jobs(struct fake *client, uint64_t total)
{
    double deadline = now_s() + 600;
    while (!b.failed && (b.jobs_made + b.jobs_in_flight < total || b.jobs_in_flight > 0)) {
        while (b.jobs_in_flight < JOBS_IN_FLIGHT && b.jobs_made + b.jobs_in_flight < total)
            send_job(client->conn);
        event_base_loop(b.base, EVLOOP_ONCE);
        if (now_s() > deadline)
            die("creating the jobs took more than 600 s");
    }
    if (b.failed)
        die("a job request failed");
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, c = *(const double *)y;
    return a < c ? -1 : a > c;
}

/* Keeps one GetSplit in flight on every fake for seconds. */
static void measure(bool replay, double seconds, double *per_s, double *p99_ms, double *cpu_us)
{
    b.replay = replay;
    uint64_t cpu0 = dispatcher_cpu_ns();
    b.answers = b.splits = 0;
    b.num_lat = 0;
    b.measuring = true;
    double t0 = now_s();
    for (unsigned i = 0; i < b.num; i++)
        send_split(&b.fakes[i]);
    while (!b.failed && now_s() - t0 < seconds)
        event_base_loop(b.base, EVLOOP_ONCE);
    double elapsed = now_s() - t0;
    *per_s = (double)b.splits / elapsed;
    b.measuring = false; /* answers still in flight send nothing more */
    bool busy = true;
    while (busy && !b.failed) {
        busy = false;
        for (unsigned i = 0; i < b.num; i++)
            busy |= b.fakes[i].in_flight;
        if (busy)
            event_base_loop(b.base, EVLOOP_ONCE);
    }
    if (b.failed || b.num_lat == 0)
        die("a request failed");
    *cpu_us = (double)(dispatcher_cpu_ns() - cpu0) / 1e3 / (double)b.num_lat;
    qsort(b.lat, b.num_lat, sizeof *b.lat, cmp_double);
    *p99_ms = b.lat[(size_t)((double)(b.num_lat - 1) * 0.99)] * 1e3;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        die("usage: bench_job_scale ADDRESS LEVELS [workers [seconds]]");
    b.address = argv[1];
    uint64_t levels[MAX_LEVELS];
    unsigned num_levels = 0;
    for (char *s = argv[2], *end; *s && num_levels < MAX_LEVELS; s = *end ? end + 1 : end) {
        levels[num_levels] = strtoull(s, &end, 10);
        if (end == s || (*end && *end != ',') || levels[num_levels] < 1 ||
            (num_levels > 0 && levels[num_levels] <= levels[num_levels - 1]))
            die("LEVELS: ascending job counts separated by commas, e.g. 10,1000,10000");
        num_levels++;
    }
    b.num = argc > 3 ? (unsigned)atoi(argv[3]) : 4;
    double seconds = argc > 4 ? atof(argv[4]) : 2.0;
    b.dispatcher_pid = argc > 5 ? atoi(argv[5]) : 0;
    if (num_levels == 0 || b.num < 1 || b.num > MAX_WORKERS || seconds <= 0)
        die("workers must be 1..64, seconds > 0");
    b.base = event_base_new();
    b.lat = malloc(MAX_SAMPLES * sizeof *b.lat);
    if (!b.base || !b.lat)
        die("out of memory");

    /* The client makes the dataset and the active job; the workers join it. */
    struct fake client = {0};
    connect_fake(&client, SL_ROLE_CLIENT);
    const char *spec = "{\"source\": {\"type\": \"range\", \"stop\": 1000000000000}}";
    sluice_RegisterDatasetRequest rd = sluice_RegisterDatasetRequest_init_zero;
    sl_conn_send(client.conn, SL_MSG_REGISTER_DATASET_REQ, ++b.next_id, &rd, spec, strlen(spec), NULL, NULL);
    wait_for(NULL, &b.dataset_id);
    make_jobs(&client, 1);
    for (unsigned i = 0; i < b.num; i++) {
        struct fake *f = &b.fakes[i];
        connect_fake(f, SL_ROLE_WORKER);
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

    double per_s[MAX_LEVELS], p99[MAX_LEVELS], make_s[MAX_LEVELS], replay_s[MAX_LEVELS], replay_p99[MAX_LEVELS];
    double cpu[MAX_LEVELS], replay_cpu[MAX_LEVELS], warm_cpu;
    for (unsigned l = 0; l < num_levels; l++) {
        double t0 = now_s();
        make_jobs(&client, levels[l]);
        make_s[l] = now_s() - t0;
        double warm_rate, warm_p99;
        measure(false, seconds / 4, &warm_rate, &warm_p99, &warm_cpu);
        measure(false, seconds, &per_s[l], &p99[l], &cpu[l]);
        measure(true, seconds / 2, &replay_s[l], &replay_p99[l], &replay_cpu[l]);
    }
    printf("{\"bench\": \"job_scale\", \"workers\": %u, \"levels\": [", b.num);
    for (unsigned l = 0; l < num_levels; l++)
        printf("%s{\"jobs\": %" PRIu64 ", \"handouts_per_second\": %.0f, \"p99_ms\": %.3f, "
               "\"cpu_us_per_handout\": %.1f, \"replays_per_second\": %.0f, \"replay_p99_ms\": %.3f, "
               "\"cpu_us_per_replay\": %.1f, \"seconds_to_create\": %.2f}",
               l ? ", " : "", levels[l], per_s[l], p99[l], cpu[l], replay_s[l], replay_p99[l], replay_cpu[l],
               make_s[l]);
    unsigned last = num_levels - 1;
    printf("], \"baseline\": \"the same dispatcher holding %" PRIu64 " jobs\", \"rate_ratio\": %.3f, "
           "\"p99_ratio\": %.3f, \"cpu_per_handout_ratio\": %.3f, \"replay_rate_ratio\": %.3f, "
           "\"replay_p99_ratio\": %.3f, \"cpu_per_replay_ratio\": %.3f}\n", levels[0],
           per_s[last] / per_s[0], p99[last] / p99[0], cpu[0] > 0 ? cpu[last] / cpu[0] : 0.0,
           replay_s[last] / replay_s[0], replay_p99[last] / replay_p99[0],
           replay_cpu[0] > 0 ? replay_cpu[last] / replay_cpu[0] : 0.0);
    b.dataset_id = UINT64_MAX; /* closing now */
    for (unsigned i = 0; i < b.num; i++)
        if (b.fakes[i].conn)
            sl_conn_close(b.fakes[i].conn);
    if (client.conn)
        sl_conn_close(client.conn);
    event_base_free(b.base);
    free(b.lat);
    return 0;
}
