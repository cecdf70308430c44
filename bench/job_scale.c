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

#include "fake_peers.h"

#define MAX_WORKERS 64
#define MAX_LEVELS 8
#define MAX_SAMPLES (1u << 22)
#define JOBS_IN_FLIGHT 64

static struct {
    bench_peers_t peers;
    bool measuring;
    bool replay; /* GetSplit requests repeat the last request_seq */
    bench_fake_t fakes[MAX_WORKERS];
    unsigned num;
    uint64_t answers, splits;
    double *lat; /* seconds of each answered GetSplit of the measured window */
    size_t num_lat;
    unsigned jobs_in_flight;
    uint64_t jobs_made;
    int dispatcher_pid; /* > 0: its loop thread's CPU time is read from /proc */
} b;

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

static void send_split(bench_fake_t *f)
{
    /* Replayed: the last request again, answered from the task's last
     * answer with nothing to commit (what a worker that lost an answer
     * sends): the dispatcher's lookups without the store's fsync. */
    if (!b.replay || f->seq == 0)
        f->seq++;
    sluice_GetSplitRequest req = {.task_id = f->task_id, .epoch = 0, .max_splits = 1, .request_seq = f->seq};
    bench_send(f, SL_MSG_GET_SPLIT_REQ, &req, NULL, 0);
}

static void send_job(bench_fake_t *client)
{
    sluice_GetOrCreateJobRequest gj = {.dataset_id = b.peers.dataset_id, .sharding = SL_SHARDING_DYNAMIC};
    if (!bench_send(client, SL_MSG_GET_OR_CREATE_JOB_REQ, &gj, NULL, 0))
        bench_die(&b.peers, "cannot send a job request");
    b.jobs_in_flight++;
}

static void on_answer(bench_fake_t *f, const sl_frame_hdr_t *hdr, void *msg)
{
    switch (hdr->type) {
    case SL_MSG_GET_OR_CREATE_JOB_RESP:
        if (!b.peers.job_id)
            b.peers.job_id = ((sluice_GetOrCreateJobResponse *)msg)->job_id;
        b.jobs_in_flight--;
        b.jobs_made++;
        return;
    case SL_MSG_GET_SPLIT_RESP: {
        const sluice_GetSplitResponse *r = msg;
        if (r->splits_count == 0)
            bench_die(&b.peers, "a GetSplit answer without splits (the job ended or the task is held back)");
        if (b.measuring) {
            b.splits += r->splits_count;
            b.answers++;
            if (b.num_lat < MAX_SAMPLES)
                b.lat[b.num_lat++] = bench_now_s() - f->sent_at;
            send_split(f);
        }
        return;
    }
    default:
        return;
    }
}

/* Creates jobs until total exist, JOBS_IN_FLIGHT requests at a time. */
static void make_jobs(bench_fake_t *client, uint64_t total)
{
    double deadline = bench_now_s() + 600;
    while (b.jobs_made + b.jobs_in_flight < total || b.jobs_in_flight > 0) {
        while (b.jobs_in_flight < JOBS_IN_FLIGHT && b.jobs_made + b.jobs_in_flight < total)
            send_job(client);
        event_base_loop(b.peers.base, EVLOOP_ONCE);
        if (bench_now_s() > deadline)
            bench_die(&b.peers, "creating the jobs took more than 600 s");
    }
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
    double elapsed = bench_run_for(&b.peers, b.fakes, b.num, send_split, seconds);
    *per_s = (double)b.splits / elapsed;
    b.measuring = false; /* answers still in flight send nothing more */
    bench_drain(&b.peers, b.fakes, b.num);
    if (b.num_lat == 0)
        bench_die(&b.peers, "no GetSplit request was answered");
    *cpu_us = (double)(dispatcher_cpu_ns() - cpu0) / 1e3 / (double)b.num_lat;
    qsort(b.lat, b.num_lat, sizeof *b.lat, cmp_double);
    *p99_ms = b.lat[(size_t)((double)(b.num_lat - 1) * 0.99)] * 1e3;
}

int main(int argc, char **argv)
{
    bench_peers_init(&b.peers, "bench_job_scale", argc > 1 ? argv[1] : "", on_answer);
    if (argc < 3)
        bench_die(&b.peers, "usage: bench_job_scale ADDRESS LEVELS [workers [seconds [dispatcher_pid]]]");
    uint64_t levels[MAX_LEVELS];
    unsigned num_levels = 0;
    for (char *s = argv[2], *end; *s && num_levels < MAX_LEVELS; s = *end ? end + 1 : end) {
        levels[num_levels] = strtoull(s, &end, 10);
        if (end == s || (*end && *end != ',') || levels[num_levels] < 1 ||
            (num_levels > 0 && levels[num_levels] <= levels[num_levels - 1]))
            bench_die(&b.peers, "LEVELS: ascending job counts separated by commas, e.g. 10,1000,10000");
        num_levels++;
    }
    b.num = argc > 3 ? (unsigned)atoi(argv[3]) : 4;
    double seconds = argc > 4 ? atof(argv[4]) : 2.0;
    b.dispatcher_pid = argc > 5 ? atoi(argv[5]) : 0;
    if (num_levels == 0 || b.num < 1 || b.num > MAX_WORKERS || seconds <= 0)
        bench_die(&b.peers, "workers must be 1..64, seconds > 0");
    b.lat = malloc(MAX_SAMPLES * sizeof *b.lat);
    if (!b.lat)
        bench_die(&b.peers, "out of memory");

    /* The client makes the dataset and the active job; the workers join it. */
    bench_fake_t client = {0};
    bench_connect(&b.peers, &client, SL_ROLE_CLIENT, 30);
    bench_register_dataset(&client, "{\"source\": {\"type\": \"range\", \"stop\": 1000000000000}}", 30);
    make_jobs(&client, 1);
    bench_join_workers(&b.peers, b.fakes, b.num, 30);

    double per_s[MAX_LEVELS], p99[MAX_LEVELS], make_s[MAX_LEVELS], replay_s[MAX_LEVELS], replay_p99[MAX_LEVELS];
    double cpu[MAX_LEVELS], replay_cpu[MAX_LEVELS], warm_cpu;
    for (unsigned l = 0; l < num_levels; l++) {
        double t0 = bench_now_s();
        make_jobs(&client, levels[l]);
        make_s[l] = bench_now_s() - t0;
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
    bench_peers_close(&b.peers, b.fakes, b.num, &client);
    free(b.lat);
    return 0;
}
