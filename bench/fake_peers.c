/*
 * fake_peers.c: see fake_peers.h.
 */
#include "fake_peers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void bench_die(const bench_peers_t *p, const char *what)
{
    fprintf(stderr, "%s: %s\n", p->name, what);
    exit(1);
}

void bench_peers_init(bench_peers_t *p, const char *name, const char *address,
                      void (*on_answer)(bench_fake_t *, const sl_frame_hdr_t *, void *))
{
    memset(p, 0, sizeof *p);
    p->name = name;
    p->address = address;
    p->on_answer = on_answer;
    if (!(p->base = event_base_new()))
        bench_die(p, "out of memory");
}

bool bench_send(bench_fake_t *f, unsigned type, const void *msg, const void *payload, size_t len)
{
    f->sent_at = bench_now_s();
    f->in_flight = sl_conn_send(f->conn, type, ++f->peers->next_id, msg, payload, len, NULL, NULL) == 0;
    return f->in_flight;
}

static void on_ready(sl_conn_t *c, void *arg)
{
    (void)c;
    ((bench_fake_t *)arg)->ready = true;
}

static void on_frame(sl_conn_t *c, const sl_frame_hdr_t *hdr, void *msg, uint8_t *payload, void *arg)
{
    bench_fake_t *f = arg;
    bench_peers_t *p = f->peers;
    (void)c;
    free(payload);
    f->in_flight = false;
    switch (hdr->type) {
    case SL_MSG_ERROR: {
        char what[600];
        snprintf(what, sizeof what, "dispatcher: %s", ((sluice_Error *)msg)->message);
        bench_die(p, what);
    }
    case SL_MSG_REGISTER_DATASET_RESP:
        p->dataset_id = ((sluice_RegisterDatasetResponse *)msg)->dataset_id;
        return;
    case SL_MSG_WORKER_REGISTER_RESP:
        f->worker_id = ((sluice_WorkerRegisterResponse *)msg)->worker_id;
        return;
    case SL_MSG_WORKER_HEARTBEAT_RESP: {
        const sluice_WorkerHeartbeatResponse *r = msg;
        for (pb_size_t i = 0; i < r->new_tasks_count; i++)
            if (r->new_tasks[i].job_id == p->job_id)
                f->task_id = r->new_tasks[i].task_id;
        return;
    }
    default:
        p->on_answer(f, hdr, msg);
    }
}

static void on_close(sl_conn_t *c, int err, const char *why, void *arg)
{
    bench_fake_t *f = arg;
    (void)c;
    (void)err;
    f->conn = NULL;
    if (!f->peers->closing) {
        char what[600];
        snprintf(what, sizeof what, "connection closed: %s", why);
        bench_die(f->peers, what);
    }
}

static const sl_conn_cbs_t cbs = {on_ready, on_frame, on_close};

void bench_wait_for(bench_peers_t *p, const bool *flag, const uint64_t *value, double seconds)
{
    double deadline = bench_now_s() + seconds;
    while (bench_now_s() < deadline && !(flag ? *flag : *value != 0))
        event_base_loop(p->base, EVLOOP_ONCE);
    if (bench_now_s() >= deadline)
        bench_die(p, "setup did not finish");
}

void bench_connect(bench_peers_t *p, bench_fake_t *f, sl_role_t role, double seconds)
{
    char err[256];
    sl_limits_t limits = {.max_payload = 1 << 20};
    f->peers = p;
    if (sl_conn_connect(p->base, p->address, NULL, role, SL_ROLE_DISPATCHER, &limits, 5000, &cbs, f, &f->conn, err,
                        sizeof err) < 0)
        bench_die(p, err);
    bench_wait_for(p, &f->ready, NULL, seconds);
}

void bench_register_dataset(bench_fake_t *client, const char *spec, double seconds)
{
    sluice_RegisterDatasetRequest rd = sluice_RegisterDatasetRequest_init_zero;
    if (!bench_send(client, SL_MSG_REGISTER_DATASET_REQ, &rd, spec, strlen(spec)))
        bench_die(client->peers, "cannot send the dataset");
    bench_wait_for(client->peers, NULL, &client->peers->dataset_id, seconds);
}

void bench_join_workers(bench_peers_t *p, bench_fake_t *fakes, unsigned n, double seconds)
{
    for (unsigned i = 0; i < n; i++) {
        bench_fake_t *f = &fakes[i];
        bench_connect(p, f, SL_ROLE_WORKER, seconds);
        sluice_WorkerRegisterRequest wr = sluice_WorkerRegisterRequest_init_zero;
        wr.client_keys = true;
        snprintf(wr.address, sizeof wr.address, "127.0.0.1:%u", 20000 + i);
        if (!bench_send(f, SL_MSG_WORKER_REGISTER_REQ, &wr, NULL, 0))
            bench_die(p, "cannot send a worker registration");
        bench_wait_for(p, NULL, &f->worker_id, seconds);
        sluice_WorkerHeartbeatRequest hb = sluice_WorkerHeartbeatRequest_init_zero;
        hb.worker_id = f->worker_id;
        if (!bench_send(f, SL_MSG_WORKER_HEARTBEAT_REQ, &hb, NULL, 0))
            bench_die(p, "cannot send a heartbeat");
        bench_wait_for(p, NULL, &f->task_id, seconds);
    }
}

double bench_run_for(bench_peers_t *p, bench_fake_t *fakes, unsigned n, void (*start)(bench_fake_t *),
                     double seconds)
{
    double t0 = bench_now_s();
    for (unsigned i = 0; i < n; i++)
        start(&fakes[i]);
    while (bench_now_s() - t0 < seconds)
        event_base_loop(p->base, EVLOOP_ONCE);
    return bench_now_s() - t0;
}

void bench_drain(bench_peers_t *p, const bench_fake_t *fakes, unsigned n)
{
    for (bool busy = true; busy;) {
        busy = false;
        for (unsigned i = 0; i < n; i++)
            busy |= fakes[i].in_flight;
        if (busy)
            event_base_loop(p->base, EVLOOP_ONCE);
    }
}

void bench_peers_close(bench_peers_t *p, bench_fake_t *fakes, unsigned n, bench_fake_t *client)
{
    p->closing = true;
    for (unsigned i = 0; i < n; i++)
        if (fakes[i].conn)
            sl_conn_close(fakes[i].conn);
    if (client->conn)
        sl_conn_close(client->conn);
    event_base_free(p->base);
}
