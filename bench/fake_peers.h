/*
 * fake_peers.h: a client and fake workers of one DYNAMIC job, talking the
 * protocol to a real sluice-dispatcher, for the benches that drive its
 * split hand-out (split_handout.c, job_scale.c). One event loop, one
 * thread; any failure ends the program with a message.
 */
#ifndef SL_BENCH_FAKE_PEERS_H
#define SL_BENCH_FAKE_PEERS_H

#include <stdbool.h>
#include <stdint.h>

#include <event2/event.h>

#include "conn.h"
#include "frame.h"
#include "sluice.h"

typedef struct bench_peers bench_peers_t;

/* One connection to the dispatcher: the client's or a fake worker's. */
typedef struct bench_fake {
    bench_peers_t *peers;
    sl_conn_t *conn;
    bool ready;
    uint64_t worker_id, task_id; /* a fake worker's, once registered and given its task */
    uint64_t seq;                /* the request_seq of its last GetSplit request */
    bool in_flight;              /* a request of it waits for its answer */
    double sent_at;
} bench_fake_t;

struct bench_peers {
    const char *name;   /* the program's, for messages */
    struct event_base *base;
    const char *address;
    uint64_t dataset_id, job_id;
    uint32_t next_id;
    bool closing;       /* connections closing now are no failure */
    /* Every answer but an error, a dataset's, a worker registration's and a
     * heartbeat's, which the peers take themselves (the heartbeat gives a
     * fake worker its task of job_id). */
    void (*on_answer)(bench_fake_t *f, const sl_frame_hdr_t *hdr, void *msg);
};

double bench_now_s(void);

/* Prints "NAME: what" and exits 1. */
_Noreturn void bench_die(const bench_peers_t *p, const char *what);

/* Makes the event base; dies without memory. */
void bench_peers_init(bench_peers_t *p, const char *name, const char *address,
                      void (*on_answer)(bench_fake_t *, const sl_frame_hdr_t *, void *));

/* Sends msg of type on f's connection with the next request id; f then has
 * a request in flight. @return false when the send failed */
bool bench_send(bench_fake_t *f, unsigned type, const void *msg, const void *payload, size_t len);

/* Runs the loop until *flag, or *value != 0 (flag NULL), or dies after
 * seconds. */
void bench_wait_for(bench_peers_t *p, const bool *flag, const uint64_t *value, double seconds);

/* Connects f to the dispatcher in role and waits for its handshake. */
void bench_connect(bench_peers_t *p, bench_fake_t *f, sl_role_t role, double seconds);

/* The client registers a dataset of spec (JSON) and waits for its id. */
void bench_register_dataset(bench_fake_t *client, const char *spec, double seconds);

/* Each of the n fakes connects as a worker (at 127.0.0.1:20000 + i), registers and
 * heartbeats until it has its task of the peers' job_id. */
void bench_join_workers(bench_peers_t *p, bench_fake_t *fakes, unsigned n, double seconds);

/* Calls start() for each of the n fakes (it sends the fake's first request;
 * the answers send the next ones), runs the loop for seconds and returns
 * how long it ran. */
double bench_run_for(bench_peers_t *p, bench_fake_t *fakes, unsigned n, void (*start)(bench_fake_t *),
                     double seconds);

/* Runs the loop until none of the n fakes has a request in flight. */
void bench_drain(bench_peers_t *p, const bench_fake_t *fakes, unsigned n);

/* Closes the n fakes' connections and the client's, and frees the base. */
void bench_peers_close(bench_peers_t *p, bench_fake_t *fakes, unsigned n, bench_fake_t *client);

#endif
