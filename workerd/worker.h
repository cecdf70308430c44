/*
 * worker.h: a data worker. It registers with the dispatcher and heartbeats,
 * starts and drops tasks as the dispatcher says, fetches DYNAMIC splits ahead
 * of its pipelines, and serves finished batches to clients. Everything runs
 * on one event loop; pipelines run on their tasks' threads (task.h).
 */
#ifndef SL_WORKER_H
#define SL_WORKER_H

#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>

#include "conn.h"
#include "rounds.h"
#include "task.h"

typedef struct sl_worker sl_worker_t;

typedef struct sl_worker_config {
    const char *dispatcher; /* host:port */
    const char *address;    /* host:port clients use; NULL: the local address
                               that reaches the dispatcher, and our port */
    const char *bind;       /* protocol listen address */
    uint16_t port;          /* 0 picks one */
    uint16_t admin_port;    /* told to the dispatcher, for operators */
    unsigned max_tasks;
    int heartbeat_ms;       /* until the dispatcher says otherwise */
    int connect_timeout_ms;
    int64_t hold_timeout_ms; /* batches served and not acknowledged are held this long
                                after their client's last request (held.h) */
    int64_t await_task_ms;   /* a request for a task not heard of waits at most this long
                                for the dispatcher to bring it (worker.c, struct awaiting) */
    sl_conn_env_t *env;     /* credentials and connection limits (NULL: none), the caller's */
    size_t shm_region_bytes; /* a client on this host gets its batches through a region this
                                large (shm.h; --shm-mb); 0: over TCP only */
    sl_task_config_t task;
} sl_worker_config_t;

void sl_worker_config_init(sl_worker_config_t *cfg);

/* How long a pipeline's charge that does not fit the memory budget waits
 * for memory others give back (a finished job's task until the worker
 * drops it, about a heartbeat; batches until their client acknowledges
 * them) before its task fails (membudget.h, wait_ms). */
#define SL_WORKER_MEMORY_WAIT_MS 2000

/**
 * Starts listening and connecting to the dispatcher (retrying until it
 * answers).
 * @param[out] bound_port the port clients connect to
 * @return 0, or -errno / SL_EINVAL with a message in err
 */
int sl_worker_start(struct event_base *base, const sl_worker_config_t *cfg, uint16_t *bound_port,
                    sl_worker_t **out, char *err, size_t errlen);

/** Closes every connection, stops every task and frees the worker. */
void sl_worker_free(sl_worker_t *w);

/** Counts for the admin endpoint. */
typedef struct sl_worker_stats {
    unsigned tasks;
    unsigned clients;
    int registered;
    unsigned held_batches; /* served, not yet acknowledged (held.h) */
    size_t held_bytes;
} sl_worker_stats_t;

void sl_worker_stats(const sl_worker_t *w, sl_worker_stats_t *out);

/** What the worker keeps of a task besides the task itself. */
typedef struct sl_worker_task_view {
    const sl_rounds_t *rounds;  /* its coordinated reads' rounds (NULL: it has none) */
    unsigned requests_waiting;  /* GET_ELEMENT requests parked until it has a batch for them */
    /* Of those, the ones of a client and seq an earlier one waiting has too:
     * asked again on a new connection while the old one, still open here,
     * waits (a connection broken at the client's end only). */
    unsigned requests_waiting_again;
    unsigned held_batches;      /* served, not yet acknowledged (held.h) */
    size_t held_bytes;
    /* DYNAMIC, not coordinated: how far its splits reached its clients
     * (GetSplitRequest.received_below), and past the batches it lost
     * (lost_below, received_past_lost; 0, 0: none lost) */
    uint64_t received_below, lost_below, received_past_lost;
} sl_worker_task_view_t;

/** Calls fn for every task the worker runs, on the worker's loop thread. */
void sl_worker_foreach_task(sl_worker_t *w,
                            void (*fn)(sl_task_t *task, const sl_worker_task_view_t *view, void *arg), void *arg);

#endif
