/*
 * iterator.c: sl_iterator_t. Each iterator runs a thread with an event loop
 * that keeps the job's client lease alive with heartbeats, learns the job's
 * tasks, keeps GET_ELEMENT requests in flight to every task's worker, and
 * queues the batches that arrive. sl_iterator_next() only waits on that
 * queue, so the trainer never blocks on one worker while others have data.
 *
 * Flow control: requests in flight plus batches queued never exceed the
 * window (max_outstanding, or by default as many batches as window_bytes
 * holds at the largest batch received so far, 8 to 32), and per worker
 * never exceed per_worker_outstanding (by default half the window, 4 to 16)
 * nor what leaves each other live task a slot (share_cap()).
 *
 * A task's connection moves IDLE -> CONNECTING -> OPEN -> ENDED (its end of
 * sequence arrived); a lost connection goes back to IDLE and is retried
 * until the dispatcher stops listing the task or timeout_ms passes.
 *
 * Coordinated reads (num_consumers > 0) ask for rounds instead: round r
 * comes from the r mod n-th (by task id) of the n tasks that serve round r
 * (start_round <= r < end_round), never past the horizon the dispatcher
 * last answered, and batches are handed out in round order; a round of a
 * lost worker comes from another that stands in. See docs/sharding.md for
 * why every consumer picks the same worker.
 *
 * What arrives is checked and kept by received.c; what was handed to the
 * caller is recorded by ledger.c. The rest stays in one file, past 900
 * lines, because it is one loop's state: tasks, rounds and the dispatcher
 * session read and change the same fields of sl_iterator under the same
 * mutex, and splitting them would put those fields in a header for all.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "batch.h"
#include "big_alloc.h"
#include "client_internal.h"
#include "conn.h"
#include "deadline.h"
#include "delta.h"
#include "errbuf.h"
#include "frame.h"
#include "ledger.h"
#include "net.h"
#include "posset.h"
#include "provwire.h"
#include "received.h"
#include "resolve.h"
#include "retry.h"
#include "shmmap.h"
#include "strcopy.h"

#define RETRY_MS 200
/* A worker that does not know a task yet (it hears of a new job's tasks
 * from the dispatcher, which it asks at once when a client names one):
 * asked again after 5 ms, doubling up to RETRY_MS, not at the next tick. */
#define UNKNOWN_RETRY_MS 5
#define MAX_WINDOW 64 /* coordinated reads: rounds asked for ahead of the caller (SL_HELD_ROUNDS, the worker holds) */
/* sl_iterator_opts_t.dispatcher_timeout_ms unless given: an hour, as tf.data service. */
#define DISPATCHER_TIMEOUT_MS 3600000
#define RELEASE_WAIT_MS 1000
/* A named job's client that closes waits this long at most for its
 * workers' answers to its leaves, then for the dispatcher's to its
 * release: what it gives back is lost if the release never arrives. A
 * worker answers at once, after what it sent before; a worker or
 * dispatcher that does not answer within it is not well. */
#define LEAVE_WAIT_MS 10000
#define END_PROBE_MIN_MS 2 /* the ask after the first (at once) when every task ended, doubled each time */
/* DYNAMIC: answers no request acknowledged within this long are
 * acknowledged on their own (ack_alone()), whatever the heartbeat. */
#define ACK_DELAY_MS 50
/* DYNAMIC: a heartbeat goes before the tick once this many splits were
 * done since the last went (their split-done notices came), one at a time:
 * the dispatcher forgets a split only when every client says it has it,
 * and holds a task back past --max-outstanding-splits (16,384 by default)
 * of them, which a reader of many small files outran within one heartbeat
 * interval; and the epochs it then says done fold. Fewer when the
 * dispatcher's answers say so (a quarter of a lower bound). */
#define EARLY_HB_NOTICES 1024
/* A job with no live worker for this long is said on stderr (and by
 * sl_iterator_waiting()); past timeout_ms the iterator fails. */
#define NO_WORKER_NOTICE_MS 3000

enum tc_state { TC_IDLE, TC_CONNECTING, TC_OPEN, TC_ENDED };

/* The most requests of one task in flight (per_worker_outstanding): what a
 * worker holds for redelivery per client and task (SL_HELD_MAX there). */
#define MAX_PER_WORKER 16
/* The window sized by bytes (max_outstanding 0, window_size()): 8 batches
 * of 8 KiB make each batch wait for a round trip (one worker 40-52 million
 * int64 a second, 86-145 with 32 and 16 per worker), while 32 batches of
 * ImageNet's size would hold 1.2 GB. */
#define WINDOW_MIN 8
#define WINDOW_MAX 32 /* within MAX_WINDOW: coordinated reads' rounds */
#define PER_WORKER_MIN 4
#define WINDOW_BYTES ((size_t)32 << 20) /* window_bytes 0 */
_Static_assert(WINDOW_MAX <= MAX_WINDOW, "a sized window must fit the rounds of coordinated reads");

struct itask {
    sl_iterator_t *it;
    uint64_t task_id;
    uint8_t key[16]; /* TaskInfo.task_key: every GET_ELEMENT for the task carries it */
    char address[128];
    sl_conn_t *conn;
    bool corked; /* send_requests() gathers its requests */
    enum tc_state state;
    unsigned in_flight;
    bool listed;
    int64_t unreachable_since; /* 0 while reachable */
    char last_error[512];
    int64_t retry_at;
    sl_resolver_t *resolver;  /* the worker's address, looked up off the loop (resolve.h) */
    int64_t resolving_since;  /* TC_CONNECTING without conn: the lookup under way since */
    /* The worker said it does not have the task (not yet, or no more):
     * asked again from unknown.not_before on (retry.h). */
    sl_retry_t unknown;
    uint64_t start_round, end_round; /* coordinated reads */
    bool lost;
    bool stand_in_said; /* coordinated reads: that others stand in for it, said on stderr */
    uint64_t done_below; /* DYNAMIC: the largest its batches carried (TaskProgress) */
    /* Coordinated DYNAMIC: a progress request (GetElementRequest.progress) in flight,
     * under probe_id; frames counts what the connection brought, seen at
     * the last tick frames_at_tick (progress_probe()). */
    bool probe_out;
    uint32_t probe_id;
    uint64_t frames, frames_at_tick;
    /* DYNAMIC: the dispatcher's last listing said the task is held at its
     * bound with its splits done below this, past what this client said
     * (TaskInfo.probe_below): any read asks, not only coordinated ones. */
    uint64_t probe_below;
    /* The iterator closes (leave_tasks()): a leave (GetElementRequest.leave)
     * in flight under leave_id, or (leave_id 0) one that could not go, its
     * connection gone: what the worker sent on it may not have reached us,
     * so its answer is that the dispatcher no longer lists the task. */
    bool leave_out;
    uint32_t leave_id;
    bool opened; /* a connection to it opened once: it may hold what it sent us */
    /* Redelivery: requests are numbered from 1 (GetElementRequest.seq; a
     * coordinated read numbers them by round instead, coord_pump());
     * fly[0..fly_n) are the seqs not answered yet,
     * in order, and the first fly_sent of them went on the current
     * connection. A connection that breaks with answers in flight has them
     * asked again, same seqs, on the next one: the worker holds what it
     * served until acknowledged (workerd/held.h). */
    uint64_t next_seq;
    uint64_t fly[MAX_PER_WORKER];
    unsigned fly_n, fly_sent;
    /* The largest acked_below sent, and the seq of the last answer that was
     * a batch: at the task's end a batch not acknowledged yet is
     * acknowledged by one more request (end_acked()). */
    uint64_t acked_sent, batch_seq;
    /* A batch came marked GetElementResponse.ack_at_once: acknowledged at
     * the next pass of requests, with a request or alone (ack_alone()). */
    bool ack_soon;
    /* The shared-memory region of the current connection (shmmap.h), NULL:
     * none; shm_off: it was offered and could not be collected. */
    sl_shm_map_t *shm;
    bool shm_off;
    sl_shm_fetch_t *shm_fetch; /* its collection, under way on the loop */
    struct itask *next;
};

/* Coordinated reads: one round asked for or received, at index round % MAX_WINDOW. */
enum slot_state { SLOT_EMPTY, SLOT_SENT, SLOT_HAVE };

struct slot {
    enum slot_state state;
    uint64_t round;
    uint32_t request_id;
    struct itask *task;
    struct sl_batch *batch;
};

struct sl_iterator {
    sl_iterator_opts_t opts;
    char job_name[129];
    char dispatcher[256];
    sl_auth_t auth;     /* the client's token and TLS, copied */
    sl_conn_env_t env;  /* .auth = &auth */
    uint64_t job_id, client_id;
    uint8_t client_secret[16]; /* GetOrCreateJobResponse.client_secret: our requests carry it */
    uint32_t heartbeat_ms;

    pthread_t thread;
    bool thread_started;
    struct event_base *base;
    struct event *kick;
    struct event *tick;
    struct event *release_timer;
    /* Every task ended and the job is not known finished yet: the
     * dispatcher hears of the last task's end from its worker about when
     * we do, so ask at once and again soon, backing off from
     * END_PROBE_MIN_MS to the heartbeat interval, instead of waiting out a
     * whole heartbeat. */
    struct event *end_probe;
    struct event *retry_timer; /* asks again a worker that did not know its task yet */
    struct event *ack_timer;   /* answers wait for their acknowledgement: ack_alone() */
    int64_t retry_due;         /* when retry_timer fires, while pending (retry_at()) */
    uint32_t end_probe_ms;

    sl_conn_t *disp;
    bool disp_open; /* handshake done */
    bool hb_out;
    uint32_t hb_id, release_id;
    /* A named job's client that closes waits for its workers' answers to
     * its leaves (leave_tasks()) before it releases its lease and gives
     * back what its caller was not given: leaving while they are out,
     * leave_whole while every answer said `left` (nothing more comes). */
    bool leaving, leave_whole;
    bool release_due; /* leaving, it waits for the dispatcher's connection to send its release */
    uint64_t returned; /* the records given back, for the message if they are refused */
    int64_t disp_last_ok;
    int64_t hb_sent_ms;     /* when the heartbeat in flight (hb_out) went */
    uint64_t notices_since_hb; /* split-done notices received since the last heartbeat went */
    /* A heartbeat before the tick at this many notices: EARLY_HB_NOTICES,
     * or fewer when the dispatcher says (ClientHeartbeatResponse.confirm_every). */
    uint32_t confirm_every;
    int64_t disp_retry_at;  /* no connect to the dispatcher before */
    sl_resolver_t *disp_resolver; /* its address, looked up off the loop */
    unsigned disp_attempts; /* connects since the last answer: the backoff */
    int64_t disp_lost_ms;   /* when it stopped answering (0: it answers), for the notice */
    char disp_error[512];
    struct itask *tasks;
    unsigned rr; /* send_requests(): the position in tasks its next pass starts at */
    uint32_t next_id;
    unsigned in_flight;
    sl_job_state_t job_state;
    bool job_state_known;
    char notice[512];
    /* Since when the dispatcher's answers list no live task for the job
     * (no worker registered, or every one lost): 0 while one is listed. */
    int64_t no_worker_since;
    bool no_worker_said;
    bool repeat_said; /* sharding OFF over several workers: said once */
    bool shm_said;    /* a region offered could not be collected: said once */
    /* Coordinated reads. */
    bool coord;
    uint64_t deliver_round; /* the next round handed to the caller */
    /* Rounds below this one the client this one came in place of may have
     * taken: asked with take_over (GetOrCreateJobResponse). */
    uint64_t take_over_below;
    /* Rounds below this one are read and dropped, not handed to the caller:
     * consumers restarted together hand out rounds from the same one
     * (GetOrCreateJobResponse.deliver_from). */
    uint64_t deliver_from;
    uint64_t horizon;       /* rounds up to this one may be asked for */
    struct slot slots[MAX_WINDOW];

    /* Shared with the caller's thread. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct sl_batch *ready, **ready_tail;
    unsigned ready_count;
    sl_split_done_t *pending_done; /* end-of-sequence notices no waiting batch took (end_notices) */
    size_t num_pending_done, pending_done_cap;
    /* What the caller was given, as positions (ledger.h): what checkpoints
     * hold and reports say. */
    uint64_t dataset_id;
    sl_ledger_t ledger;
    /* With opts.ledger_deltas: the ledger's calls since the caller last
     * took them (sl_iterator_delta()). */
    sl_delta_log_t deltas;
    /* DYNAMIC (not coordinated), unless opts.provenance < 0: the ledger is
     * kept and workers send provenance, so that after a worker loss the
     * dispatcher can learn what this client received (send_report). */
    bool track;
    /* A named job's fold: every record before `heard` reached some client
     * of the job, the dispatcher said (epochs_done, confirmed_below), so
     * each that reached this one was given to the caller or waits for it;
     * a heartbeat says how far that holds (given_place()). */
    bool named;
    sl_posrun_t heard;
    /* A checkpoint's round trip (sync_dispatcher()): the caller counts up
     * sync_asked and waits until sync_done reaches it, which an answer to a
     * heartbeat sent after the ask sets (hb_sync, on the loop: the
     * sync_asked the heartbeat in flight carries the progress of). */
    uint64_t sync_asked, sync_done, hb_sync;
    size_t ledger_ask_at; /* ledger_crowded(): the ledger's runs at which it asks again */
    uint64_t reported_gen; /* the last report generation answered */
    uint64_t report_gen_out;
    uint32_t report_id;
    bool report_out;
    int error;
    char err[1024];
    char waiting[512]; /* what sl_iterator_next() waits on, when it is known (sl_iterator_waiting) */
    bool finished;
    bool stop;
    /* pump() stopped at max_outstanding: the caller's next batch taken makes
     * room, and sl_iterator_next() wakes the loop for it. Otherwise the
     * caller does not wake the loop: a wake-up per batch costs the caller
     * and the loop a system call each. */
    bool budget_full;
    /* On the loop only: batches were queued for the caller since on_kick()
     * last woke it (worker_frame()). */
    bool wake_caller;
    /* The window in effect (window_size()), read and set on the loop only:
     * max_outstanding and per_worker_outstanding, or sized by largest, the
     * tensor bytes of the largest batch received (0: none yet). */
    unsigned window, per_worker;
    size_t largest;
};

static int checkpointable(const sl_iterator_opts_t *o, char *err, size_t errlen);

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void iterator_fail(sl_iterator_t *it, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void iterator_fail(sl_iterator_t *it, int code, const char *fmt, ...)
{
    pthread_mutex_lock(&it->mu);
    if (!it->error) {
        it->error = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(it->err, sizeof it->err, fmt, ap);
        va_end(ap);
    }
    pthread_cond_broadcast(&it->cv);
    pthread_mutex_unlock(&it->mu);
}

/* wait_ms from now on the clock it->cv waits on: CLOCK_REALTIME (the
 * default; a clock step makes one wait shorter or longer). */
static struct timespec cv_deadline(int wait_ms)
{
    return sl_deadline_after(CLOCK_REALTIME, (unsigned long)wait_ms);
}

static bool failed(sl_iterator_t *it)
{
    pthread_mutex_lock(&it->mu);
    bool f = it->error != 0;
    pthread_mutex_unlock(&it->mu);
    return f;
}

/* ---- the loop thread ---- */

/* Sets the window from the options and the largest batch received: as
 * many batches as window_bytes holds (WINDOW_MIN before the first), unless
 * max_outstanding says; per worker half of it, unless
 * per_worker_outstanding says. */
static void window_size(sl_iterator_t *it)
{
    if (it->opts.max_outstanding > 0) {
        it->window = (unsigned)it->opts.max_outstanding;
    } else {
        size_t bytes = it->opts.window_bytes ? it->opts.window_bytes : WINDOW_BYTES;
        size_t n = it->largest ? bytes / it->largest : WINDOW_MIN;
        it->window = n < WINDOW_MIN ? WINDOW_MIN : n > WINDOW_MAX ? WINDOW_MAX : (unsigned)n;
    }
    if (it->opts.per_worker_outstanding > 0) {
        it->per_worker = (unsigned)it->opts.per_worker_outstanding;
    } else {
        unsigned half = it->window / 2;
        it->per_worker = half < PER_WORKER_MIN ? PER_WORKER_MIN : half > MAX_PER_WORKER ? MAX_PER_WORKER : half;
    }
}

/* A batch of size tensor bytes arrived (one of none counts as a byte: a
 * batch came): the window may change. Its caller pumps next, which sends
 * the requests a larger window has room for. */
static void window_note(sl_iterator_t *it, size_t size)
{
    if (size < 1)
        size = 1;
    if (size > it->largest) {
        it->largest = size;
        window_size(it);
    }
}

static void pump(sl_iterator_t *it);
static void check_finished(sl_iterator_t *it);
static void leave_check(sl_iterator_t *it);
static void send_heartbeat(sl_iterator_t *it);
static void sync_answered(sl_iterator_t *it);

/* The connection to a task's worker is gone: so is its region, which the
 * batches built on it keep mapped until they are released. */
static void task_conn_gone(struct itask *t)
{
    t->conn = NULL;
    t->probe_out = false;
    sl__shm_unref(t->shm);
    t->shm = NULL;
    t->shm_off = false;
    sl__shm_fetch_cancel(t->shm_fetch);
    t->shm_fetch = NULL;
}

static void task_drop_conn(struct itask *t)
{
    if (t->conn) {
        sl_conn_close(t->conn);
        task_conn_gone(t);
    }
    t->it->in_flight -= t->in_flight;
    t->in_flight = 0;
    t->fly_n = t->fly_sent = 0; /* nothing to ask again of a task left */
}

/* The region could not be collected (why): not asked for again on this
 * connection, its batches come over the socket. */
static void shm_failed(struct itask *t, int rc, const char *why)
{
    t->shm_off = true;
    /* No such lane here is the worker on another host: nothing to say. */
    if (rc != -ECONNREFUSED && rc != -ENOENT && !t->it->shm_said) {
        t->it->shm_said = true;
        fprintf(stderr, "sluice: worker %s: its batches come over TCP: shared memory: %s\n", t->address, why);
    }
}

static void shm_fetched(sl_shm_map_t *m, int rc, const char *why, void *arg)
{
    struct itask *t = arg;
    t->shm_fetch = NULL;
    if (rc < 0)
        shm_failed(t, rc, why);
    else
        t->shm = m; /* the next request says so */
    pump(t->it); /* the requests held for it */
}

/* A region offered on the task's connection (GetElementResponse.shm_socket):
 * collected and mapped on the loop, which serves every other worker
 * meanwhile (no request goes to this one until it is done: only those
 * already in flight come over the socket), or, when that fails (the worker
 * is on another host or network namespace, mostly), not asked for again on
 * this connection: its batches come over the socket. */
static void shm_collect(struct itask *t, const sluice_GetElementResponse *resp)
{
    sl_iterator_t *it = t->it;
    if (t->shm || t->shm_off || t->shm_fetch || it->opts.shm < 0)
        return;
    if (resp->shm_ticket.size != SL_SHM_TICKET_BYTES) {
        t->shm_off = true; /* not an offer this client can take: the socket serves */
        return;
    }
    char why[300];
    size_t max = it->opts.max_batch_bytes * SL_SHM_CLIENT_MAX_SLOTS;
    int rc = sl__shm_fetch(it->base, resp->shm_socket, resp->shm_ticket.bytes, resp->shm_ticket.size,
                           SL_SHM_COLLECT_MS, max, shm_fetched, t, &t->shm_fetch, why, sizeof why);
    if (rc < 0)
        shm_failed(t, rc, why);
}

/* A request's shared-memory fields on t's connection: ask for a region
 * until one is mapped or could not be, then say it is mapped and how many
 * of its slots are back. */
static void shm_fields(const struct itask *t, sluice_GetElementRequest *req)
{
    req->shm = t->it->opts.shm >= 0 && !t->shm && !t->shm_off && !t->shm_fetch;
    req->shm_mapped = t->shm != NULL;
    req->shm_tail_in_answer = t->shm != NULL;
    req->shm_released = t->shm ? sl__shm_released(t->shm) : 0;
}

/* A batch whose payload lies in the connection's region: the frame carries
 * none (payload is freed). resp is the frame's own message, changed
 * (sl__batch_from_shm()). */
static struct sl_batch *batch_from_shm(struct itask *t, sluice_GetElementResponse *resp, uint8_t *payload,
                                       size_t payload_len, char *err, size_t errlen)
{
    free(payload);
    uint64_t seq;
    const uint8_t *slot = NULL;
    if (!t->shm || payload_len > 0)
        sl_errf(err, errlen, SL_EPROTO, "a batch in shared memory %s",
                !t->shm ? "on a connection with no region mapped" : "with a payload in the frame too");
    else if (resp->shm_length > t->it->opts.max_batch_bytes)
        sl_errf(err, errlen, SL_ETOOBIG, "a batch of %" PRIu64 " bytes in shared memory is over max_batch_bytes (%zu)",
                resp->shm_length, t->it->opts.max_batch_bytes);
    else
        slot = sl__shm_slot(t->shm, resp->shm_offset, resp->shm_length, &seq, err, errlen);
    if (!slot)
        return NULL;
    return sl__batch_from_shm(resp, t->shm, slot, (size_t)resp->shm_length, seq, err, errlen);
}

/* Whether a request may go to task t now (either kind of read): its
 * connection is open, its region is not being collected, and the worker
 * did not just say it lacks the task (retry.h). */
static bool askable(const struct itask *t, int64_t now)
{
    return t->state == TC_OPEN && !t->shm_fetch && now >= t->unknown.not_before;
}

/* ---- coordinated reads ---- */

static struct slot *slot_of_request(sl_iterator_t *it, const struct itask *t, uint32_t request_id)
{
    for (unsigned i = 0; i < MAX_WINDOW; i++)
        if (it->slots[i].state == SLOT_SENT && it->slots[i].task == t && it->slots[i].request_id == request_id)
            return &it->slots[i];
    return NULL;
}

/* The task that serves round r: the (r mod n)-th by id of the n tasks whose
 * rounds include r. Every consumer knows the same tasks up to its horizon,
 * so every consumer picks the same one. When its worker was lost, another
 * stands in for the consumers it had not served the round to: the first
 * live one after it in that order, or, when none of the n is live (or no
 * task's rounds include r: the rounds between a drained or lost worker's
 * last and the start of one that joined later), the live task with the
 * least id of those whose rounds have no end. Consumers that learn of
 * losses at different moments may pick different ones; whichever serves a
 * consumer, it gets one batch of the round.
 * @param[out] owner the task whose round r is (the one returned unless it
 *             stands in), or NULL: no task's rounds include r
 * @return the task to ask, or NULL: none is known, or none is live */
static struct itask *task_for_round(sl_iterator_t *it, uint64_t r, struct itask **owner)
{
    struct itask *serving[256];
    unsigned n = 0;
    struct itask *least_live = NULL;
    for (struct itask *t = it->tasks; t; t = t->next) {
        if (!t->lost && t->end_round == 0 && (!least_live || t->task_id < least_live->task_id))
            least_live = t;
        if (n < 256 && t->start_round <= r && (t->end_round == 0 || r < t->end_round))
            serving[n++] = t;
    }
    *owner = NULL;
    if (n == 0)
        return least_live;
    /* Insertion sort by task id: n is small. */
    for (unsigned i = 1; i < n; i++)
        for (unsigned k = i; k > 0 && serving[k - 1]->task_id > serving[k]->task_id; k--) {
            struct itask *x = serving[k];
            serving[k] = serving[k - 1];
            serving[k - 1] = x;
        }
    unsigned k = (unsigned)(r % n);
    *owner = serving[k];
    if (!serving[k]->lost)
        return serving[k];
    for (unsigned i = 1; i < n; i++)
        if (!serving[(k + i) % n]->lost)
            return serving[(k + i) % n];
    return least_live;
}

/* Hands the rounds that are complete, in order, to the caller's queue. */
static void coord_deliver(sl_iterator_t *it)
{
    struct sl_batch *dropped = NULL;
    pthread_mutex_lock(&it->mu);
    for (;;) {
        struct slot *sl = &it->slots[it->deliver_round % MAX_WINDOW];
        if (sl->round != it->deliver_round)
            break;
        if (sl->state != SLOT_HAVE)
            break;
        if (it->deliver_round < it->deliver_from) {
            sl->batch->next = dropped;
            dropped = sl->batch;
        } else {
            *it->ready_tail = sl->batch;
            it->ready_tail = &sl->batch->next;
            it->ready_count++;
        }
        *sl = (struct slot){.state = SLOT_EMPTY};
        it->deliver_round++;
    }
    pthread_mutex_unlock(&it->mu);
    pthread_cond_broadcast(&it->cv); /* after the unlock: see on_kick() */
    while (dropped) {
        struct sl_batch *next = dropped->next;
        sl__batch_free(dropped);
        dropped = next;
    }
}

/* The split-done notices of an end-of-sequence frame, its payload of size
 * bytes: they go with the last batch waiting for the caller, which came
 * before them, or, when none waits, with the next batch the caller gets
 * (sl_iterator_splits_done() shows them after the end). @return false when
 * the iterator failed */
static bool end_notices(sl_iterator_t *it, struct itask *t, const sluice_GetElementResponse *resp,
                        const uint8_t *payload, size_t size)
{
    sl_split_done_t *done = NULL;
    size_t n = 0;
    char err[512];
    int rc = sl__notices_from_wire(resp, payload, size, NULL, 0, &done, &n, err, sizeof err);
    if (rc < 0) {
        iterator_fail(it, rc, "worker %s sent a bad end of sequence: %s", t->address, err);
        return false;
    }
    if (n == 0)
        return true;
    pthread_mutex_lock(&it->mu);
    struct sl_batch *last = NULL;
    for (struct sl_batch *b = it->ready; b; b = b->next)
        last = b;
    rc = last ? sl__batch_add_notices(last, done, n)
              : sl__notices_append(&it->pending_done, &it->num_pending_done, &it->pending_done_cap, done, n);
    pthread_mutex_unlock(&it->mu);
    free(done);
    if (rc < 0) {
        iterator_fail(it, -ENOMEM, "out of memory for %zu split-done notices", n);
        return false;
    }
    return true;
}

static void notices_came(sl_iterator_t *it, size_t n);

static void coord_arrived(sl_iterator_t *it, struct itask *t, struct slot *sl, sluice_GetElementResponse *resp,
                          uint8_t *payload, size_t size)
{
    if (!sl) {
        free(payload); /* an answer for a round forgotten meanwhile */
        uint64_t seq;
        if (resp->shm_length && t->shm &&
            sl__shm_slot(t->shm, resp->shm_offset, resp->shm_length, &seq, NULL, 0)) /* its slot goes back */
            sl__shm_slot_done(t->shm, seq);
        pump(it);
        return;
    }
    t->unknown.since = 0;
    /* How far t's splits reached this consumer (outstanding.h in the
     * dispatcher): its answers come on one connection, in the order sent. */
    if (resp->done_below > t->done_below)
        t->done_below = resp->done_below;
    if (resp->end_of_sequence) {
        /* Coordinated reads are over a dataset without end (the dispatcher
         * refuses others), so an end is never the job's: ending here would
         * stop a synchronous trainer early without a word. */
        free(payload);
        iterator_fail(it, SL_EDATA,
                      "worker %s ended task %" PRIu64 " at round %" PRIu64 ", but coordinated reads have no end: "
                      "every round needs a batch for every consumer (a repeat whose input yields nothing ends)",
                      t->address, t->task_id, sl->round);
        return;
    }
    char err[512];
    struct sl_batch *b = resp->shm_length ? batch_from_shm(t, resp, payload, size, err, sizeof err)
                                          : sl__batch_from_wire(resp, payload, size, err, sizeof err);
    if (!b) {
        iterator_fail(it, SL_EPROTO, "worker %s sent a bad batch: %s", t->address, err);
        return;
    }
    sl_strcopy(b->worker, sizeof b->worker, t->address);
    b->round = sl->round;
    sl->batch = b;
    sl->state = SLOT_HAVE;
    window_note(it, b->size);
    if (b->num_done > 0)
        notices_came(it, b->num_done);
    coord_deliver(it);
    pump(it);
}

/* Rounds asked of t and not answered are asked again (reconnected), or of
 * nobody (gone: forget it too). */
static void coord_forget_task(sl_iterator_t *it, struct itask *t, bool gone)
{
    if (!it->coord)
        return;
    for (unsigned i = 0; i < MAX_WINDOW; i++) {
        struct slot *sl = &it->slots[i];
        if (sl->task != t)
            continue;
        if (sl->state == SLOT_SENT)
            sl->state = SLOT_EMPTY;
        if (gone)
            sl->task = NULL;
    }
}

/* Says once per lost worker, on stderr, that the rounds it was to serve
 * and had not served to this consumer come from others, from round r on. */
static void stand_in_note(sl_iterator_t *it, uint64_t r, struct itask *owner, const struct itask *t)
{
    if (owner->stand_in_said)
        return;
    owner->stand_in_said = true;
    fprintf(stderr, "sluice: job %" PRIu64 ": worker %s was lost; the rounds it was to serve and had not served to "
            "consumer %d come from the other workers (from round %" PRIu64 ", of worker %s)\n",
            it->job_id, owner->address, it->opts.consumer_index, r, t->address);
}

static void coord_pump(sl_iterator_t *it, unsigned queued)
{
    int64_t now = now_ms();
    unsigned budget = it->window > queued ? it->window - queued : 0;
    if (budget > MAX_WINDOW)
        budget = MAX_WINDOW;
    for (uint64_t r = it->deliver_round; r < it->deliver_round + budget; r++) {
        if (r > it->horizon) {
            /* Ask the dispatcher to move the horizon instead of waiting
             * for the next tick. */
            send_heartbeat(it);
            break;
        }
        struct slot *sl = &it->slots[r % MAX_WINDOW];
        if (sl->state != SLOT_EMPTY)
            continue;
        struct itask *owner;
        struct itask *t = task_for_round(it, r, &owner);
        if (!t)
            break; /* no (live) task known yet: the next heartbeat tells */
        bool stand_in = t != owner;
        if (stand_in && owner)
            stand_in_note(it, r, owner, t);
        if (!askable(t, now))
            continue;
        uint32_t id = ++it->next_id;
        /* Numbered by round for redelivery (workerd/held.h): every round
         * below deliver_round was received, and the worker lets their
         * batches go; one asked again after a broken connection is sent
         * again. */
        sluice_GetElementRequest req = {.task_id = t->task_id, .client_id = it->client_id,
                                        .provenance = it->opts.provenance > 0 || it->track,
                                        .tallies = it->track, .coordinated = true,
                                        .round = r, .consumer_index = (uint32_t)it->opts.consumer_index,
                                        .seq = r + 1, .acked_below = it->deliver_round + 1, .stand_in = stand_in,
                                        .take_over = !stand_in && r < it->take_over_below};
        memcpy(req.task_key, t->key, sizeof req.task_key);
        shm_fields(t, &req);
        if (sl_conn_send(t->conn, SL_MSG_GET_ELEMENT_REQ, id, &req, NULL, 0, NULL, NULL) < 0)
            continue;
        *sl = (struct slot){.state = SLOT_SENT, .round = r, .request_id = id, .task = t};
        t->in_flight++;
        it->in_flight++;
    }
}

/* The retry timer (one for all tasks) fires at `at` (now_ms() time) or
 * earlier (retry.h). */
static void retry_at(sl_iterator_t *it, int64_t at)
{
    int64_t now = now_ms();
    at = sl__retry_timer_due(evtimer_pending(it->retry_timer, NULL), it->retry_due, at, now);
    int64_t wait = at > now ? at - now : 0;
    struct timeval tv = {(time_t)(wait / 1000), (suseconds_t)(wait % 1000) * 1000};
    it->retry_due = at;
    evtimer_add(it->retry_timer, &tv);
}

/* Whether enough split-done notices came since the last heartbeat went
 * for one before the tick (confirm_every). */
static bool notices_due(const sl_iterator_t *it)
{
    return it->track && it->notices_since_hb >= it->confirm_every;
}

/* n split-done notices came: a heartbeat now when enough did and none is
 * out (else sync_answered() sends it when the one out is answered). */
static void notices_came(sl_iterator_t *it, size_t n)
{
    it->notices_since_hb += n;
    if (notices_due(it) && !it->hb_out)
        send_heartbeat(it);
}

/* Sends req, with the task's id and key and the client's id, at once (not
 * at the next pass of the loop, which may not come: the iterator may be
 * closing). */
static int send_now(struct itask *t, sluice_GetElementRequest *req)
{
    req->task_id = t->task_id;
    req->client_id = t->it->client_id;
    memcpy(req->task_key, t->key, sizeof req->task_key);
    bool corked = sl_conn_cork(t->conn) == 0;
    int rc = sl_conn_send(t->conn, SL_MSG_GET_ELEMENT_REQ, ++t->it->next_id, req, NULL, 0, NULL, NULL);
    if (corked)
        sl_conn_uncork(t->conn);
    return rc;
}

/* The task's end came: every batch of it was received (answers on a
 * connection come in order, and those after the end are ends too). The
 * worker holds the batches its requests have not acknowledged until they
 * are, or until the hold timeout (5 min), also once the job ended and the
 * task went (workerd/held.h): one more request acknowledges them all (its
 * answer is the end again), written at once, before the caller may free
 * the iterator; the connection stays until its answer. */
static void end_acked(struct itask *t)
{
    if (t->batch_seq == 0 || t->acked_sent > t->batch_seq || !t->conn)
        return;
    uint64_t seq = t->next_seq++;
    sluice_GetElementRequest req = {.seq = seq, .acked_below = seq};
    if (send_now(t, &req) < 0)
        return;
    t->acked_sent = seq;
    t->in_flight++;
    t->it->in_flight++;
}

/* A task held at --max-outstanding-splits makes no batch until its
 * clients confirm splits, and a client that received its share of some of
 * them before they were done (their last records went to others), or none
 * (it joined late), has a done_below behind. It asks how far the task's
 * splits are done (GetElementRequest.progress), once every request whose
 * answer a broken connection may have lost was asked again on this
 * connection: the worker answers those from what it holds before the
 * progress, so the done_below it says covers what this client received
 * (docs/fault-tolerance.md). Not while it leaves the task. */
static void probe_send(sl_iterator_t *it, struct itask *t)
{
    if (!it->track || t->probe_out || t->leave_out || !t->conn || t->state != TC_OPEN || t->fly_sent < t->fly_n)
        return;
    for (unsigned i = 0; i < MAX_WINDOW; i++)
        if (it->slots[i].task == t && it->slots[i].state == SLOT_EMPTY)
            return; /* forgotten with a broken connection, not asked again yet */
    sluice_GetElementRequest req = {.ack_only = true, .progress = true};
    if (send_now(t, &req) < 0)
        return;
    t->probe_out = true;
    t->probe_id = it->next_id;
}

/* On the tick: asks (probe_send()) where the dispatcher said this client
 * is behind a held task (TaskInfo.probe_below) and, under coordinated
 * reads, where the task's requests wait (no frame came since the last
 * tick). Other reads ask only when told: a pipeline that drops every
 * record (a skip under a repeat) holds its splits unfinished, and asking
 * on every wait confirmed its empty splits a few at a time for hours, where
 * the dispatcher fails it at the bound. */
static void progress_probe(sl_iterator_t *it, struct itask *t)
{
    bool waits = t->in_flight > 0 && t->frames == t->frames_at_tick;
    t->frames_at_tick = t->frames;
    if (t->probe_below > t->done_below || (it->coord && waits))
        probe_send(it, t);
}

static void progress_arrived(sl_iterator_t *it, struct itask *t, const sl_frame_hdr_t *hdr, void *msg,
                             uint8_t *payload)
{
    t->probe_out = false;
    const sluice_GetElementResponse *resp = msg;
    if (hdr->type != SL_MSG_GET_ELEMENT_RESP || resp->end_of_sequence || resp->components_count > 0) {
        free(payload); /* an error (out of memory): asked again at a later tick */
        return;
    }
    bool ok = end_notices(it, t, resp, payload, hdr->payload_len);
    free(payload);
    if (ok && resp->done_below > t->done_below) {
        t->done_below = resp->done_below;
        if (!it->hb_out)
            send_heartbeat(it); /* what frees the task's splits */
    }
}

static void worker_frame(sl_conn_t *c, const sl_frame_hdr_t *hdr, void *msg, uint8_t *payload, void *arg)
{
    struct itask *t = arg;
    sl_iterator_t *it = t->it;
    (void)c;
    if (t->probe_out && hdr->request_id == t->probe_id) {
        progress_arrived(it, t, hdr, msg, payload);
        return;
    }
    if (t->leave_out && t->leave_id != 0 && hdr->request_id == t->leave_id) {
        free(payload);
        t->leave_out = false;
        if (hdr->type != SL_MSG_GET_ELEMENT_RESP || !((const sluice_GetElementResponse *)msg)->left)
            it->leave_whole = false; /* an older worker: a request of ours may still be answered */
        leave_check(it);
        return;
    }
    t->frames++;
    if (t->in_flight > 0) {
        t->in_flight--;
        it->in_flight--;
    }
    uint64_t answered = 0; /* its seq */
    if (t->fly_sent > 0) {
        answered = t->fly[0];
        memmove(t->fly, t->fly + 1, (t->fly_n - 1) * sizeof *t->fly);
        t->fly_n--;
        t->fly_sent--;
    }
    struct slot *slot = it->coord ? slot_of_request(it, t, hdr->request_id) : NULL;
    if (hdr->type == SL_MSG_ERROR) {
        const sluice_Error *e = msg;
        free(payload);
        int64_t now = now_ms();
        /* A worker that does not know the task (yet), or dropped it because
         * the dispatcher took it away (the worker was declared lost, or the
         * job ended), does not end the read: the dispatcher's next answer
         * says what became of the task, and the loop asks again until then,
         * for at most timeout_ms. */
        bool gone = e->code == SL_ENOTFOUND || e->code == SL_ECANCELLED;
        /* Of a job the dispatcher says is FINISHED, such a task ended: with
         * provenance tracked (DYNAMIC) the job finishes only once every
         * split reached its clients, so nothing of the task is missing, but
         * its end of sequence can be: the task was done (it reports that
         * before its clients ask for the end) and its worker was lost, or
         * started again without it, before this client asked. */
        if (gone && it->track && it->job_state_known && it->job_state == SL_JOB_FINISHED) {
            t->state = TC_ENDED;
            task_drop_conn(t);
            check_finished(it);
            return;
        }
        if (gone && (!t->unknown.since || now - t->unknown.since <= it->opts.timeout_ms)) {
            if (sl__retry_note(&t->unknown, now, UNKNOWN_RETRY_MS, RETRY_MS))
                retry_at(it, t->unknown.not_before);
            if (slot)
                slot->state = SLOT_EMPTY; /* asked again once the worker knows the task */
            return;
        }
        iterator_fail(it, e->code < 0 ? e->code : SL_EREMOTE, "worker %s: %s%s", t->address, e->message,
                      gone ? " (for longer than the timeout)" : "");
        return;
    }
    t->unknown.since = 0;
    if (hdr->type != SL_MSG_GET_ELEMENT_RESP) {
        free(payload);
        iterator_fail(it, SL_EPROTO, "worker %s answered with %s", t->address, sl_msg_name(hdr->type));
        return;
    }
    const sluice_GetElementResponse *resp = msg;
    if (resp->shm_socket[0])
        shm_collect(t, resp);
    if (it->coord) {
        coord_arrived(it, t, slot, msg, payload, hdr->payload_len);
        return;
    }
    if (resp->done_below > t->done_below)
        t->done_below = resp->done_below;
    if (resp->end_of_sequence) {
        bool ok = end_notices(it, t, resp, payload, hdr->payload_len);
        free(payload);
        if (!ok)
            return;
        if (t->state != TC_ENDED)
            end_acked(t);
        t->state = TC_ENDED;
        if (t->in_flight == 0)
            task_drop_conn(t);
        check_finished(it);
        return;
    }
    if (answered > t->batch_seq)
        t->batch_seq = answered;
    t->ack_soon |= resp->ack_at_once;
    char err[512];
    struct sl_batch *b = resp->shm_length ? batch_from_shm(t, msg, payload, hdr->payload_len, err, sizeof err)
                                          : sl__batch_from_wire(resp, payload, hdr->payload_len, err, sizeof err);
    if (!b) {
        iterator_fail(it, SL_EPROTO, "worker %s sent a bad batch: %s", t->address, err);
        return;
    }
    sl_strcopy(b->worker, sizeof b->worker, t->address);
    window_note(it, b->size);
    if (b->num_done > 0)
        notices_came(it, b->num_done);
    pthread_mutex_lock(&it->mu);
    *it->ready_tail = b;
    it->ready_tail = &b->next;
    it->ready_count++;
    pthread_mutex_unlock(&it->mu);
    /* The caller is woken once the loop has read what else arrived
     * (on_kick()), not for each batch: a caller faster than its workers
     * then drains the batches of a pass at once. Woken per batch, it took
     * each as it came and waited again, a futex wait and wake a batch
     * more than half the time (0.55-0.75 futex calls a batch; 0.19-0.30
     * now), and a quarter of the consumer's CPU went to it (a range of
     * 40,000,000 from 2 workers through sluice-cat: 5.4-6.5 µs a batch,
     * 4.2-4.7 now). */
    it->wake_caller = true;
    /* The next requests once the loop has read what else arrived: the
     * answers read together are asked again for together, one system call
     * per worker (send_requests()). */
    event_active(it->kick, EV_READ, 0);
}

static void worker_ready(sl_conn_t *c, void *arg)
{
    struct itask *t = arg;
    (void)c;
    t->state = TC_OPEN;
    t->opened = true;
    t->unreachable_since = 0;
    pump(t->it);
}

static void worker_close(sl_conn_t *c, int err, const char *why, void *arg)
{
    struct itask *t = arg;
    (void)c;
    if (t->leave_out)
        t->leave_id = 0; /* what it sent may be lost with the connection: leave_tasks() */
    task_conn_gone(t);
    t->it->in_flight -= t->in_flight;
    t->in_flight = 0;
    t->fly_sent = 0; /* what was in flight is asked again on the next connection */
    coord_forget_task(t->it, t, false);
    if (t->state == TC_ENDED)
        return;
    /* A batch over max_batch_bytes, or a frame we could not read, is lost
     * for good: the worker counts it as sent. Say so instead of retrying. */
    if (err == SL_ETOOBIG || err == SL_EPROTO) {
        iterator_fail(t->it, err, "worker %s: %s", t->address, why);
        return;
    }
    /* Retried from the tick until the worker answers or timeout_ms passed. */
    t->state = TC_IDLE;
    if (!t->unreachable_since)
        t->unreachable_since = now_ms();
    t->retry_at = now_ms() + RETRY_MS;
    snprintf(t->last_error, sizeof t->last_error, "%s", why);
}

static const sl_conn_cbs_t worker_cbs = {worker_ready, worker_frame, worker_close};

/* A connect to the task's worker failed before it began (the lookup, the
 * socket): retried from the tick. */
static void task_connect_failed(struct itask *t)
{
    t->state = TC_IDLE;
    t->conn = NULL;
    if (!t->unreachable_since)
        t->unreachable_since = now_ms();
    t->retry_at = now_ms() + RETRY_MS;
}

static void task_resolved(int rc, const struct sockaddr_storage *ss, socklen_t sslen, const char *why, void *arg)
{
    struct itask *t = arg;
    sl_iterator_t *it = t->it;
    if (t->state != TC_CONNECTING || t->conn)
        return;
    t->resolving_since = 0;
    if (rc < 0) {
        snprintf(t->last_error, sizeof t->last_error, "%s", why);
        task_connect_failed(t);
        return;
    }
    size_t maxp = it->opts.max_batch_bytes > UINT32_MAX ? UINT32_MAX : it->opts.max_batch_bytes;
    sl_limits_t limits = {.max_payload = (uint32_t)maxp};
    if (sl_conn_connect_to(it->base, t->address, ss, sslen, &it->env, SL_ROLE_CLIENT, SL_ROLE_WORKER, &limits,
                           it->opts.connect_timeout_ms, &worker_cbs, t, &t->conn, t->last_error,
                           sizeof t->last_error) < 0) {
        task_connect_failed(t);
        return;
    }
    sl_conn_cap_connect(t->conn, SL_CONN_SYN_MS); /* a new SYN soon after a heal */
}

/* Looks the worker's address up off the loop, then connects (task_resolved()). */
static void task_connect(struct itask *t)
{
    sl_iterator_t *it = t->it;
    t->state = TC_CONNECTING;
    t->resolving_since = now_ms();
    if ((!t->resolver && !(t->resolver = sl_resolver_new(it->base, task_resolved, t))) ||
        sl_resolver_start(t->resolver, t->address) < 0) {
        snprintf(t->last_error, sizeof t->last_error, "out of memory looking up %s", t->address);
        task_connect_failed(t);
    }
}

/* The most requests one of live tasks may hold: per_worker, but no more
 * than leaves every other live task one of the window's slots. A worker
 * answers a task's requests in order and parks those it has no batch for:
 * one with nothing to give (waiting for splits, or stopped) would
 * otherwise hold the whole window while another has batches ready: the
 * reader waits on the first, and the second, its buffer full, stops
 * reading the splits it holds, which under DYNAMIC the first may wait for
 * at the end of an epoch. A window smaller than the live tasks cannot
 * leave each one a slot: each then holds at most one. */
static unsigned share_cap(unsigned per_worker, unsigned window, unsigned live)
{
    if (live < 2)
        return per_worker;
    unsigned fair = window > 1 ? (window - 1) / (live - 1) : 0;
    if (fair < 1)
        fair = 1;
    return fair < per_worker ? fair : per_worker;
}

/* DYNAMIC: whether t has answers that no request acknowledged yet (its
 * share of the window waits at other tasks, held ones mostly, or at the
 * caller), and what would acknowledge them (*acked). */
static bool ack_due(const sl_iterator_t *it, const struct itask *t, int64_t now, uint64_t *acked)
{
    *acked = t->fly_n ? t->fly[0] : t->next_seq;
    return it->track && !it->coord && askable(t, now) && t->next_seq != 0 && *acked > t->acked_sent;
}

/* DYNAMIC: t's answers that no request acknowledged yet are acknowledged
 * on their own (GetElementRequest.ack_only, answered by nothing): the
 * worker lets them go, and can tell the dispatcher that the splits in them
 * reached their clients (GetSplitRequest.received_below), which a task
 * held at --max-outstanding-splits waits for. At once for the answers the
 * worker marks (GetElementResponse.ack_at_once: its task is at the bound),
 * at the end of the pass of requests that did not acknowledge them
 * (send_requests()); the others at most ACK_DELAY_MS later (on_ack_timer(),
 * armed by the pass that left them): a read whose caller is slower than
 * its workers would send one for most batches at once, and a request
 * usually goes to the task before. Before
 * 2026-12-05 they waited for the heartbeat's tick: 300 s with a slow
 * heartbeat, at each hold. */
static void ack_alone(sl_iterator_t *it, struct itask *t, int64_t now)
{
    uint64_t acked;
    if (!ack_due(it, t, now, &acked))
        return;
    sluice_GetElementRequest req = {.ack_only = true, .acked_below = acked};
    if (send_now(t, &req) == 0)
        t->acked_sent = acked;
}

static void on_ack_timer(evutil_socket_t fd, short what, void *arg)
{
    sl_iterator_t *it = arg;
    (void)fd;
    (void)what;
    int64_t now = now_ms();
    for (struct itask *t = it->tasks; t; t = t->next)
        ack_alone(it, t, now);
}

/* Asks for batches within the budget (queued of it taken by batches
 * waiting for the caller): round-robin, one request per task per pass,
 * each pass starting after the task the last request went to, so that
 * every worker gets its share also when the budget is smaller than the
 * windows of all the tasks together (a pass from the first task each time
 * gave every freed slot to the first tasks with room, and none to the
 * rest). The requests to one worker go out together, in one system call
 * (sl_conn_cork()). */
static void send_requests(sl_iterator_t *it, unsigned queued)
{
    unsigned n = 0, live = 0;
    for (struct itask *t = it->tasks; t; t = t->next) {
        n++;
        live += t->state != TC_ENDED;
    }
    unsigned cap = share_cap(it->per_worker, it->window, live);
    bool sent = n > 0;
    int64_t now = now_ms();
    while (sent && it->in_flight + queued < it->window) {
        sent = false;
        unsigned at = it->rr % n;
        struct itask *t = it->tasks;
        for (unsigned i = 0; i < at; i++)
            t = t->next;
        for (unsigned k = 0; k < n; k++, at = at + 1 < n ? at + 1 : 0, t = t->next ? t->next : it->tasks) {
            if (!askable(t, now) || t->in_flight >= cap)
                continue;
            if (it->in_flight + queued >= it->window)
                break;
            /* Asked again first: answers lost with a broken connection. */
            bool again = t->fly_sent < t->fly_n;
            if (!t->next_seq)
                t->next_seq = 1;
            sluice_GetElementRequest req = {.task_id = t->task_id, .client_id = it->client_id,
                                            .provenance = it->opts.provenance > 0 || it->track,
                                            .tallies = it->track,
                                            .dense_provenance = true,
                                            .seq = again ? t->fly[t->fly_sent] : t->next_seq,
                                            .acked_below = t->fly_n ? t->fly[0] : t->next_seq};
            memcpy(req.task_key, t->key, sizeof req.task_key);
            shm_fields(t, &req);
            if (!t->corked)
                t->corked = sl_conn_cork(t->conn) == 0; /* its first request of this call */
            if (sl_conn_send(t->conn, SL_MSG_GET_ELEMENT_REQ, ++it->next_id, &req, NULL, 0, NULL, NULL) < 0)
                continue;
            if (req.acked_below > t->acked_sent)
                t->acked_sent = req.acked_below;
            if (!again)
                t->fly[t->fly_n++] = t->next_seq++;
            t->fly_sent++;
            t->in_flight++;
            it->in_flight++;
            it->rr = at + 1;
            sent = true;
        }
    }
    bool due = false;
    for (struct itask *t = it->tasks; t; t = t->next) {
        if (t->ack_soon) {
            t->ack_soon = false;
            ack_alone(it, t, now);
        }
        uint64_t acked;
        due |= ack_due(it, t, now, &acked);
        if (t->corked) {
            t->corked = false;
            sl_conn_uncork(t->conn);
        }
    }
    if (due && !evtimer_pending(it->ack_timer, NULL)) {
        struct timeval tv = {0, ACK_DELAY_MS * 1000};
        evtimer_add(it->ack_timer, &tv);
    }
}

static void pump(sl_iterator_t *it)
{
    if (failed(it))
        return;
    for (;;) {
        pthread_mutex_lock(&it->mu);
        unsigned queued = it->ready_count;
        bool stop = it->stop;
        /* Coordinated reads count their budget in rounds: every batch taken
         * may let them ask for one more. */
        it->budget_full = it->coord;
        pthread_mutex_unlock(&it->mu);
        if (stop)
            return;
        if (it->coord) {
            coord_pump(it, queued);
            return;
        }
        send_requests(it, queued);
        if (it->in_flight + queued < it->window)
            return; /* held back by the workers, not by the budget */
        /* Held back by the budget: the caller wakes the loop when it takes a
         * batch, unless it took one meanwhile, which makes room now. */
        pthread_mutex_lock(&it->mu);
        bool took = it->ready_count < queued;
        it->budget_full = !took;
        pthread_mutex_unlock(&it->mu);
        if (!took)
            return;
    }
}

static void check_finished(sl_iterator_t *it)
{
    /* A client of local workers only is done once each of them ended: the
     * job itself may wait on workers it does not read from. */
    bool local = it->opts.target_workers == SL_TARGET_LOCAL && it->tasks;
    for (struct itask *t = it->tasks; t; t = t->next)
        if (t->state != TC_ENDED)
            return;
    if (!local && (!it->job_state_known || it->job_state != SL_JOB_FINISHED)) {
        if (it->tasks && it->end_probe && !evtimer_pending(it->end_probe, NULL)) {
            if (!it->end_probe_ms && !it->hb_out) {
                /* The first ask goes at once: the worker told the dispatcher
                 * as it told us, and usually first. */
                it->end_probe_ms = END_PROBE_MIN_MS / 2;
                send_heartbeat(it);
                return;
            }
            it->end_probe_ms = it->end_probe_ms ? it->end_probe_ms * 2 : END_PROBE_MIN_MS;
            if (it->end_probe_ms > it->heartbeat_ms)
                it->end_probe_ms = it->heartbeat_ms;
            struct timeval tv = {it->end_probe_ms / 1000, (it->end_probe_ms % 1000) * 1000};
            evtimer_add(it->end_probe, &tv);
        }
        return;
    }
    pthread_mutex_lock(&it->mu);
    it->finished = true;
    pthread_cond_broadcast(&it->cv);
    pthread_mutex_unlock(&it->mu);
}

static void on_end_probe(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    send_heartbeat(arg);
}

/* What this client received of the epochs from `from` on, as posset bytes
 * (malloc'd): what the caller was given, the batches waiting for it, and,
 * under coordinated reads, those of rounds waiting for an earlier round.
 * @return 0, or < 0 when it does not know (the ledger overflowed) */
static int report_add_batch(sl_posbits_t *set, const struct sl_batch *b, uint64_t from, sl_provenance_run_t **runs,
                            size_t *cap)
{
    return sl__report_add_wire(set, b->prov_wire, b->num_prov > 0 ? b->prov_wire_len : 0, b->num_records, from, runs,
                               cap);
}

static int report_positions(sl_iterator_t *it, uint64_t from, uint8_t **buf, size_t *len)
{
    sl_posbits_t set;
    sl_provenance_run_t *runs = NULL;
    size_t cap = 0;
    pthread_mutex_lock(&it->mu);
    int rc = sl__ledger_report(&it->ledger, from, &set);
    for (const struct sl_batch *b = it->ready; b && rc == 0; b = b->next)
        rc = report_add_batch(&set, b, from, &runs, &cap);
    pthread_mutex_unlock(&it->mu);
    /* The slots are the loop's (this runs on it). */
    for (unsigned i = 0; it->coord && i < MAX_WINDOW && rc == 0; i++)
        if (it->slots[i].state == SLOT_HAVE)
            rc = report_add_batch(&set, it->slots[i].batch, from, &runs, &cap);
    free(runs);
    if (rc == 0)
        rc = sl_posbits_bytes(&set, buf, len);
    sl_posbits_clear(&set);
    return rc;
}

/* A worker of the job was lost: the tasks it served are dropped already
 * (the heartbeat no longer lists them), so nothing more can arrive from
 * them; say what arrived, so that the dispatcher hands out the rest of
 * their splits again, and nothing twice. */
static void send_report(sl_iterator_t *it, uint64_t gen, uint64_t from)
{
    if (it->report_out || !it->disp || !it->disp_open)
        return;
    sluice_ReportReceivedRequest req = {.job_id = it->job_id, .client_id = it->client_id, .report_gen = gen};
    memcpy(req.client_secret, it->client_secret, sizeof req.client_secret);
    uint8_t *buf = NULL;
    size_t len = 0;
    if (!it->track || report_positions(it, from, &buf, &len) < 0) {
        req.untracked = true; /* the dispatcher warns: some of it may come again */
        len = 0;
    }
    it->report_id = ++it->next_id;
    if (sl_conn_send(it->disp, SL_MSG_REPORT_RECEIVED_REQ, it->report_id, &req, buf, len, NULL, NULL) == 0) {
        it->report_out = true;
        it->report_gen_out = gen;
    }
    free(buf);
}

static void set_waiting(sl_iterator_t *it, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* What sl_iterator_next() waits on, for sl_iterator_waiting(); fmt NULL: nothing known. */
static void set_waiting(sl_iterator_t *it, const char *fmt, ...)
{
    pthread_mutex_lock(&it->mu);
    it->waiting[0] = '\0';
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(it->waiting, sizeof it->waiting, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&it->mu);
}

/* After a heartbeat answer: whether any worker serves the job (a wait on
 * none is said after NO_WORKER_NOTICE_MS and fails after timeout_ms, in
 * on_tick), and whether sharding OFF repeats the data over several. */
static void workers_seen(sl_iterator_t *it)
{
    unsigned live = 0;
    for (struct itask *t = it->tasks; t; t = t->next)
        live += !t->lost;
    bool done = it->job_state == SL_JOB_FINISHED;
    if (live == 0 && !done) {
        if (!it->no_worker_since)
            it->no_worker_since = now_ms();
    } else if (it->no_worker_since) {
        if (it->no_worker_said)
            fprintf(stderr, "sluice: job %" PRIu64 ": a worker serves it now, after %" PRId64 " ms with none\n",
                    it->job_id, now_ms() - it->no_worker_since);
        it->no_worker_since = 0;
        it->no_worker_said = false;
        set_waiting(it, NULL);
    }
    if (live >= 2 && !it->repeat_said && it->opts.sharding == SL_SHARDING_OFF && !it->coord) {
        it->repeat_said = true;
        fprintf(stderr, "sluice: job %" PRIu64 " reads with sharding off from %u workers: each of them reads the "
                        "whole dataset, so every element comes once per worker (%u times); for each element once, "
                        "use sharding dynamic (sluice-cat --sharding dynamic, distribute(..., sharding=\"dynamic\"))\n",
                it->job_id, live, live);
    }
}

/* On every tick: a job with no live worker is said once after
 * NO_WORKER_NOTICE_MS, and fails after timeout_ms. Only counted while the
 * dispatcher answers (its absence has dispatcher_timeout_ms). @return
 * false when the iterator failed */
static bool no_worker_check(sl_iterator_t *it, int64_t now)
{
    if (!it->no_worker_since || it->disp_lost_ms)
        return true;
    int64_t waited = now - it->no_worker_since;
    if (waited > it->opts.timeout_ms) {
        iterator_fail(it, -ETIMEDOUT, "job %" PRIu64 ": no live worker for %d ms (timeout_ms): the dispatcher %s "
                      "lists none for it; start sluice-workerd --dispatcher %s, or wait longer with a larger "
                      "timeout_ms (sluice-cat --timeout-ms)", it->job_id, it->opts.timeout_ms, it->dispatcher,
                      it->dispatcher);
        return false;
    }
    if (waited >= NO_WORKER_NOTICE_MS && !it->no_worker_said) {
        it->no_worker_said = true;
        set_waiting(it, "no live worker for job %" PRIu64 ": the dispatcher %s lists none for it (is a "
                    "sluice-workerd running with --dispatcher %s?); waiting up to timeout_ms = %d ms",
                    it->job_id, it->dispatcher, it->dispatcher, it->opts.timeout_ms);
        pthread_mutex_lock(&it->mu);
        fprintf(stderr, "sluice: %s\n", it->waiting);
        pthread_mutex_unlock(&it->mu);
    }
    return true;
}

/* The dispatcher's word that the epochs below `below` are done, `waiting`
 * batches still waiting for the caller (sl__ledger_epochs_done()), logged
 * for deltas when it changed the ledger: one call per epoch or so, not one
 * per heartbeat. Under it->mu. */
static void ledger_fold(sl_iterator_t *it, uint64_t below, size_t waiting)
{
    sl_ledger_t *l = &it->ledger;
    uint64_t was_done = l->epochs_done, was_below = l->fold_below, was_at = l->fold_at;
    sl__ledger_epochs_done(l, below, waiting);
    if (it->opts.ledger_deltas > 0 &&
        (l->epochs_done != was_done || l->fold_below != was_below || l->fold_at != was_at))
        sl__delta_log_epochs_done(&it->deltas, below, waiting);
}

/* The dispatcher's word that every record before `at` was given to some
 * caller of the named job (sl__ledger_given_below(): made when the caller
 * is next given a batch), logged for deltas when it changed the ledger.
 * Under it->mu. */
static void ledger_given_below(sl_iterator_t *it, sl_posrun_t at)
{
    if (sl__ledger_given_below(&it->ledger, at.epoch, at.file, at.begin) && it->opts.ledger_deltas > 0)
        sl__delta_log_given_below(&it->deltas, at.epoch, at.file, at.begin);
}

/* Takes a list of the job's tasks from the dispatcher (a heartbeat's
 * answer, or the job's at the open): connects to each it did not know
 * (unless lost), and marks each listed with its key and rounds.
 * @return 0, or -ENOMEM */
static int take_tasks(sl_iterator_t *it, const sluice_TaskInfo *tasks, pb_size_t n)
{
    for (pb_size_t i = 0; i < n; i++) {
        const sluice_TaskInfo *ti = &tasks[i];
        struct itask *t = it->tasks;
        while (t && t->task_id != ti->task_id)
            t = t->next;
        if (!t) {
            t = calloc(1, sizeof *t);
            if (!t)
                return -ENOMEM;
            t->it = it;
            t->task_id = ti->task_id;
            memcpy(t->key, ti->task_key, sizeof t->key);
            snprintf(t->address, sizeof t->address, "%s", ti->worker_address);
            t->next = it->tasks;
            it->tasks = t;
            if (!ti->lost)
                task_connect(t);
        }
        t->listed = true;
        memcpy(t->key, ti->task_key, sizeof t->key);
        t->start_round = ti->start_round;
        t->end_round = ti->end_round;
        t->probe_below = ti->probe_below;
        if (ti->lost && !t->lost) {
            t->lost = true;
            task_drop_conn(t);
            coord_forget_task(it, t, false);
            t->state = TC_ENDED;
        }
    }
    return 0;
}

/* The least epoch of a record in the batches waiting for the caller
 * (UINT64_MAX: none waits). Under it->mu; at most a window of batches. */
static uint64_t ready_least_epoch(const sl_iterator_t *it)
{
    uint64_t least = UINT64_MAX;
    for (const struct sl_batch *b = it->ready; b && least > 0; b = b->next) {
        uint64_t e = sl__batch_least_epoch(b);
        if (e < least)
            least = e;
    }
    return least;
}

/* A named job's ClientHeartbeatRequest.place_given (and epochs_given, its
 * epoch): every record before `heard` that reached this client was given
 * to the caller, but those in batches that wait for it (ready, or in a
 * coordinated round's slot), so the least place of those if it comes
 * first. A record before `heard` comes later only when a rank that left
 * gave it back: the dispatcher's confirmed place went back before it then,
 * and it takes this no further than that place until every client says,
 * with the same heartbeat, that it has what it gets of the record's split
 * (a lost worker's splits are handed out again past `heard`). Under it->mu,
 * on the loop. */
static sl_posrun_t given_place(const sl_iterator_t *it)
{
    sl_posrun_t g = it->heard, p;
    for (const struct sl_batch *b = it->ready; b; b = b->next)
        if (sl__batch_least_place(b, &p) && sl_posrun_before(p, g))
            g = p;
    for (unsigned i = 0; it->coord && i < MAX_WINDOW; i++) {
        const struct slot *sl = &it->slots[i];
        if (sl->state == SLOT_HAVE && sl->batch && sl__batch_least_place(sl->batch, &p) && sl_posrun_before(p, g))
            g = p;
    }
    return g;
}

static void on_heartbeat(sl_iterator_t *it, const sluice_ClientHeartbeatResponse *resp)
{
    it->confirm_every = resp->confirm_every > 0 && resp->confirm_every < EARLY_HB_NOTICES ? resp->confirm_every
                                                                                          : EARLY_HB_NOTICES;
    it->disp_last_ok = now_ms();
    it->disp_attempts = 0;
    it->disp_retry_at = 0;
    if (it->disp_lost_ms) {
        fprintf(stderr, "sluice: dispatcher %s answers again after %" PRId64 " ms\n", it->dispatcher,
                it->disp_last_ok - it->disp_lost_ms);
        it->disp_lost_ms = 0;
        /* A wait on no worker counts from now: a dispatcher back from its
         * absence lists workers as they register again. */
        if (it->no_worker_since)
            it->no_worker_since = it->disp_last_ok;
    }
    it->job_state = (sl_job_state_t)resp->job_state;
    it->job_state_known = true;
    if (resp->job_state == SL_JOB_CANCELLED) {
        iterator_fail(it, SL_ECANCELLED, "job %" PRIu64 " was cancelled: %s", it->job_id, resp->error);
        return;
    }
    if (resp->job_state == SL_JOB_FAILED) {
        iterator_fail(it, SL_EDATA, "job %" PRIu64 " failed: %s", it->job_id, resp->error);
        return;
    }
    for (struct itask *t = it->tasks; t; t = t->next)
        t->listed = false;
    if (it->coord && resp->round_horizon > it->horizon)
        it->horizon = resp->round_horizon;
    if (take_tasks(it, resp->tasks, resp->tasks_count) < 0) {
        iterator_fail(it, -ENOMEM, "out of memory");
        return;
    }
    /* A task the dispatcher no longer lists lost its worker. */
    for (struct itask **p = &it->tasks; *p;) {
        struct itask *t = *p;
        if (t->listed) {
            p = &t->next;
            continue;
        }
        /* Its worker was lost: a leave waiting for it is answered, as its
         * splits go out again without what we received (the release says
         * it). */
        task_drop_conn(t);
        coord_forget_task(it, t, true);
        *p = t->next;
        sl_resolver_free(t->resolver);
        free(t);
    }
    for (struct itask *t = it->tasks; t; t = t->next)
        if (t->probe_below > t->done_below)
            probe_send(it, t);
    leave_check(it);
    if (it->track && it->named) {
        /* Its peers may still hold records of a done epoch, not given: the
         * ledger folds only what every client of the job was given. */
        pthread_mutex_lock(&it->mu);
        const sluice_Place *at = &resp->confirmed_below;
        sl_posrun_t heard = {.epoch = resp->epochs_done <= UINT32_MAX ? (uint32_t)resp->epochs_done : 0};
        sl_posrun_t confirmed = {.epoch = (uint32_t)at->epoch, .file = at->file, .begin = at->record};
        if (resp->has_confirmed_below && at->epoch <= UINT32_MAX && sl_posrun_before(heard, confirmed))
            heard = confirmed;
        if (sl_posrun_before(it->heard, heard))
            it->heard = heard;
        const sluice_Place *folded = &resp->place_folded;
        if (!it->coord && resp->has_place_folded && folded->epoch <= UINT32_MAX)
            ledger_given_below(it, (sl_posrun_t){.epoch = (uint32_t)folded->epoch, .file = folded->file,
                                                 .begin = folded->record});
        else if (resp->epochs_folded > 0)
            ledger_fold(it, resp->epochs_folded, 0);
        /* Coordinated reads take no checkpoints: the ledger serves reports
         * only, and keeps nothing of what every client has. */
        if (it->coord && resp->has_confirmed_below && at->epoch <= UINT32_MAX)
            sl__ledger_confirmed_below(&it->ledger, (uint32_t)at->epoch, at->file, at->record);
        pthread_mutex_unlock(&it->mu);
    } else if (it->track && resp->epochs_done > 0) {
        /* Every record of the epochs below epochs_done reached us, so those
         * not in a batch still waiting for the caller were given: the
         * epochs below the waiting batches' least fold at once, the rest
         * once the caller was given the batches that wait. */
        pthread_mutex_lock(&it->mu);
        uint64_t least = ready_least_epoch(it);
        ledger_fold(it, least < resp->epochs_done ? least : resp->epochs_done, 0);
        if (least < resp->epochs_done)
            ledger_fold(it, resp->epochs_done, it->ready_count);
        pthread_mutex_unlock(&it->mu);
    }
    if (resp->report_gen > it->reported_gen)
        send_report(it, resp->report_gen, resp->report_from_epoch);
    workers_seen(it);
    check_finished(it);
    pump(it);
}

static void disp_frame(sl_conn_t *c, const sl_frame_hdr_t *hdr, void *msg, uint8_t *payload, void *arg)
{
    sl_iterator_t *it = arg;
    (void)c;
    free(payload);
    if (hdr->request_id == it->release_id) {
        const sluice_ReleaseClientResponse *r = msg;
        if (it->returned > 0 && hdr->type == SL_MSG_RELEASE_CLIENT_RESP && !r->returns_taken)
            fprintf(stderr, "sluice: iterator of job %" PRIu64 ": dispatcher %s did not take back the %" PRIu64
                            " records the caller was not given: %s\n", it->job_id, it->dispatcher, it->returned,
                    r->returns_error[0] ? r->returns_error : "it is older than giving back");
        event_base_loopbreak(it->base);
        return;
    }
    if (it->report_out && hdr->request_id == it->report_id) {
        it->report_out = false;
        if (hdr->type == SL_MSG_ERROR) {
            const sluice_Error *e = msg;
            iterator_fail(it, e->code < 0 ? e->code : SL_EREMOTE, "dispatcher %s refused what this client "
                          "received: %s", it->dispatcher, e->message);
        } else {
            it->reported_gen = it->report_gen_out;
        }
        return;
    }
    if (hdr->request_id != it->hb_id)
        return;
    it->hb_out = false;
    if (hdr->type == SL_MSG_ERROR) {
        const sluice_Error *e = msg;
        iterator_fail(it, e->code < 0 ? e->code : SL_EREMOTE, "dispatcher %s: %s", it->dispatcher, e->message);
        return;
    }
    if (hdr->type == SL_MSG_CLIENT_HEARTBEAT_RESP)
        on_heartbeat(it, msg);
    sync_answered(it);
}

/* A heartbeat was answered: a checkpoint that asked before it went has its
 * round trip (sync_dispatcher()); one that asked while it was in flight
 * gets a heartbeat of its own now, and so do the notices that came
 * meanwhile when they are enough (notices_came()). */
static void sync_answered(sl_iterator_t *it)
{
    pthread_mutex_lock(&it->mu);
    bool woke = it->hb_sync > it->sync_done, more = it->sync_asked > it->hb_sync || notices_due(it);
    if (woke)
        it->sync_done = it->hb_sync;
    pthread_mutex_unlock(&it->mu);
    if (woke)
        pthread_cond_broadcast(&it->cv);
    if (more)
        send_heartbeat(it);
}

static void send_heartbeat(sl_iterator_t *it)
{
    if (!it->disp || !it->disp_open || it->hb_out)
        return;
    sluice_ClientHeartbeatRequest *req = calloc(1, sizeof *req);
    if (!req)
        return; /* the next tick tries again */
    *req = (sluice_ClientHeartbeatRequest){.job_id = it->job_id, .client_id = it->client_id,
                                           .round = it->deliver_round};
    pthread_mutex_lock(&it->mu);
    if (it->track && it->named) {
        sl_posrun_t given = given_place(it);
        req->epochs_given = given.epoch;
        req->has_place_given = given.file > 0 || given.begin > 0;
        req->place_given = (sluice_Place){.epoch = given.epoch, .file = given.file, .record = given.begin};
    }
    if (it->track) {
        /* An overflowed record holds nothing it can use: said full. */
        req->ledger_max_runs = it->ledger.max_runs;
        req->ledger_runs = it->ledger.rc < 0 ? it->ledger.max_runs : sl__ledger_runs_held(&it->ledger);
    }
    uint64_t sync = it->sync_asked;
    pthread_mutex_unlock(&it->mu);
    memcpy(req->client_secret, it->client_secret, sizeof req->client_secret);
    /* How far each task's splits reached us: what lets the dispatcher
     * forget them (outstanding.h). */
    for (struct itask *t = it->tasks; t; t = t->next) {
        if (t->done_below == 0 || req->progress_count >= sizeof req->progress / sizeof req->progress[0])
            continue;
        req->progress[req->progress_count++] = (sluice_TaskProgress){.task_id = t->task_id,
                                                                     .done_below = t->done_below};
    }
    it->hb_id = ++it->next_id;
    if (sl_conn_send(it->disp, SL_MSG_CLIENT_HEARTBEAT_REQ, it->hb_id, req, NULL, 0, NULL, NULL) == 0) {
        it->hb_out = true;
        it->hb_sent_ms = now_ms();
        it->hb_sync = sync;
        it->notices_since_hb = 0;
    }
    free(req);
}

static void send_release(sl_iterator_t *it);

static void disp_ready(sl_conn_t *c, void *arg)
{
    sl_iterator_t *it = arg;
    (void)c;
    it->disp_open = true;
    if (it->release_due) {
        send_release(it);
        return;
    }
    send_heartbeat(it);
}

/* The dispatcher connection is gone (closed, or closed here): nothing
 * asked on it will be answered. A report in flight is sent again when the
 * next heartbeat answer asks for it, on the next connection. */
static void disp_forget(sl_iterator_t *it)
{
    it->disp = NULL;
    it->disp_open = false;
    it->hb_out = false;
    it->report_out = false;
}

static void disp_close(sl_conn_t *c, int err, const char *why, void *arg)
{
    sl_iterator_t *it = arg;
    (void)c;
    (void)err;
    disp_forget(it);
    snprintf(it->disp_error, sizeof it->disp_error, "%s", why);
    if (it->release_id)
        event_base_loopbreak(it->base);
}

static const sl_conn_cbs_t disp_cbs = {disp_ready, disp_frame, disp_close};

/* Reconnects to the dispatcher back off from 100 ms, doubling, to about a second. */
#define DISP_BACKOFF_MIN_MS 100
#define DISP_BACKOFF_MAX_MS 1000

static void disp_resolved(int rc, const struct sockaddr_storage *ss, socklen_t sslen, const char *why, void *arg)
{
    sl_iterator_t *it = arg;
    if (it->disp)
        return;
    if (rc < 0) {
        snprintf(it->disp_error, sizeof it->disp_error, "%s", why);
        return;
    }
    sl_limits_t limits = {.max_payload = 1024 * 1024};
    if (sl_conn_connect_to(it->base, it->dispatcher, ss, sslen, &it->env, SL_ROLE_CLIENT, SL_ROLE_DISPATCHER, &limits,
                           it->opts.connect_timeout_ms, &disp_cbs, it, &it->disp, it->disp_error,
                           sizeof it->disp_error) < 0)
        it->disp = NULL;
    else
        sl_conn_cap_connect(it->disp, SL_CONN_SYN_MS); /* a new SYN soon after a heal */
}

/* Looks the dispatcher's address up off the loop (a DNS outage must not
 * stop the reads from the workers), then connects (disp_resolved()). */
static void disp_connect(sl_iterator_t *it)
{
    int64_t now = now_ms();
    if (now < it->disp_retry_at || sl_resolver_busy(it->disp_resolver))
        return;
    int64_t wait = sl__retry_doubled(DISP_BACKOFF_MIN_MS, DISP_BACKOFF_MAX_MS, it->disp_attempts);
    /* Jitter: trainers that lost one dispatcher do not come back in step. */
    it->disp_retry_at = now + wait / 2 + (int64_t)(((uint64_t)now * 2654435761u + it->client_id) % (uint64_t)(wait / 2 + 1));
    it->disp_attempts++;
    if (sl_resolver_start(it->disp_resolver, it->dispatcher) < 0)
        snprintf(it->disp_error, sizeof it->disp_error, "out of memory looking up %s", it->dispatcher);
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    sl_iterator_t *it = arg;
    (void)fd;
    (void)what;
    if (failed(it))
        return;
    int64_t now = now_ms();
    if (now - it->disp_last_ok > it->opts.dispatcher_timeout_ms) {
        iterator_fail(it, -ETIMEDOUT, "dispatcher %s: no heartbeat answer for %d ms (dispatcher_timeout_ms)%s%s",
                      it->dispatcher, it->opts.dispatcher_timeout_ms, it->disp_error[0] ? ": " : "",
                      it->disp_error);
        return;
    }
    int64_t answer_ms = sl_conn_answer_deadline_ms(it->heartbeat_ms);
    if (it->disp && it->hb_out && now - it->hb_sent_ms > answer_ms) {
        snprintf(it->disp_error, sizeof it->disp_error, "no heartbeat answer for %" PRId64 " ms",
                 now - it->hb_sent_ms);
        sl_conn_close(it->disp);
        disp_forget(it);
    }
    if (!it->disp_lost_ms && now - it->disp_last_ok > answer_ms) {
        it->disp_lost_ms = it->disp_last_ok;
        fprintf(stderr, "sluice: dispatcher %s does not answer (%s); reading what the workers serve and "
                        "reconnecting for up to %d ms\n",
                it->dispatcher, it->disp_error[0] ? it->disp_error : "no answer", it->opts.dispatcher_timeout_ms);
    }
    if (!no_worker_check(it, now))
        return;
    if (!it->disp)
        disp_connect(it);
    else
        send_heartbeat(it);
    for (struct itask *t = it->tasks; t; t = t->next) {
        if (t->state == TC_CONNECTING && !t->conn && t->resolving_since &&
            now - t->resolving_since > it->opts.timeout_ms) {
            iterator_fail(it, -ETIMEDOUT, "worker %s: its address did not resolve within %d ms (timeout_ms)",
                          t->address, it->opts.timeout_ms);
            return;
        }
        progress_probe(it, t);
        if (t->state != TC_IDLE)
            continue;
        if (now - t->unreachable_since > it->opts.timeout_ms) {
            iterator_fail(it, -ETIMEDOUT, "worker %s unreachable for %d ms: %s", t->address, it->opts.timeout_ms,
                          t->last_error);
            return;
        }
        if (now >= t->retry_at)
            task_connect(t);
    }
    pump(it);
}

static void on_retry_timer(evutil_socket_t fd, short what, void *arg)
{
    sl_iterator_t *it = arg;
    (void)fd;
    (void)what;
    if (!failed(it))
        pump(it);
}

static void on_release_timeout(evutil_socket_t fd, short what, void *arg)
{
    sl_iterator_t *it = arg;
    (void)fd;
    (void)what;
    if (it->leaving && !it->release_id && !it->release_due) {
        it->leave_whole = false; /* a worker did not answer in time */
        send_release(it);
        return;
    }
    if (it->release_due) {
        pthread_mutex_lock(&it->mu);
        unsigned n = it->ready_count;
        pthread_mutex_unlock(&it->mu);
        fprintf(stderr, "sluice: iterator of job %" PRIu64 ": dispatcher %s unreachable for %d ms: the %u batches "
                        "that waited for the caller are not given back (its lease runs out)\n", it->job_id,
                it->dispatcher, LEAVE_WAIT_MS, n);
    }
    event_base_loopbreak(it->base);
}

/* The iterator closes: each worker lets go of every batch it holds for
 * this client (workerd/held.h), received or still on its way, now rather
 * than at the hold timeout: the client will not ask again. One ack-only
 * request a task, written at once; nothing answers it. */
static void leave_workers(sl_iterator_t *it)
{
    for (struct itask *t = it->tasks; t; t = t->next) {
        if (!t->conn || t->state != TC_OPEN)
            continue;
        sluice_GetElementRequest req = {.acked_below = UINT64_MAX, .ack_only = true};
        (void)send_now(t, &req);
    }
}

/* A named job's client that closes gives back what its caller was not
 * given (ReleaseClientRequest.returns): it first asks each worker to
 * leave (GetElementRequest.leave), whose answer comes after every batch
 * the worker sent it and says that no request of it waits there any more,
 * so that what it holds then is all it got. A worker whose connection is
 * gone holds nothing for us once the dispatcher no longer lists its task
 * (on_heartbeat(): it was lost). @return whether it waits for answers
 * (leave_check() releases once they came; LEAVE_WAIT_MS at most, past
 * which the release says the batches given back may not be all) */
static bool leave_tasks(sl_iterator_t *it)
{
    if (!it->named || !it->track || it->coord)
        return false;
    pthread_mutex_lock(&it->mu);
    bool waiting = it->ready_count > 0;
    pthread_mutex_unlock(&it->mu);
    bool open = false;
    for (struct itask *t = it->tasks; t && !open; t = t->next)
        open = t->state != TC_ENDED;
    if (!waiting && !open)
        return false; /* at the end: nothing to give back */
    it->leaving = it->leave_whole = true;
    bool any = false;
    for (struct itask *t = it->tasks; t; t = t->next) {
        if (t->state == TC_ENDED || !t->opened)
            continue; /* its end came, or it never served us: nothing more of it can */
        sluice_GetElementRequest req = {.acked_below = UINT64_MAX, .ack_only = true, .progress = true, .leave = true};
        t->leave_out = true;
        any = true;
        /* Not on a connection other than the one it sent on: the worker lets
         * go of what it holds for us, which may not have reached us. */
        t->leave_id = t->conn && t->state == TC_OPEN && send_now(t, &req) == 0 ? it->next_id : 0;
    }
    if (!any)
        return false;
    struct timeval tv = {LEAVE_WAIT_MS / 1000, (LEAVE_WAIT_MS % 1000) * 1000};
    evtimer_add(it->release_timer, &tv);
    return true;
}

static void leave_check(sl_iterator_t *it)
{
    if (!it->leaving || it->release_id)
        return;
    for (struct itask *t = it->tasks; t; t = t->next)
        if (t->leave_out)
            return;
    evtimer_del(it->release_timer);
    send_release(it);
}

/* The positions of the batches that wait for the caller, as posset bytes
 * (malloc'd). @return 0 or < 0 */
static int returned_positions(sl_iterator_t *it, uint8_t **buf, size_t *len)
{
    sl_posbits_t set;
    sl_posbits_init(&set, sl__ledger_max_runs(&it->opts));
    sl_provenance_run_t *runs = NULL;
    size_t cap = 0;
    int rc = 0;
    pthread_mutex_lock(&it->mu);
    for (const struct sl_batch *b = it->ready; b && rc == 0; b = b->next)
        rc = b->num_records > 0 && b->num_prov == 0 ? -ENOENT : report_add_batch(&set, b, 0, &runs, &cap);
    pthread_mutex_unlock(&it->mu);
    free(runs);
    it->returned = sl_posbits_size(&set);
    if (rc == 0)
        rc = sl_posbits_bytes(&set, buf, len);
    sl_posbits_clear(&set);
    return rc;
}

/* Releases the lease (once); a named job's client gives back what waits
 * for its caller. */
static void send_release(sl_iterator_t *it)
{
    if (it->release_id)
        return;
    if (it->leaving && !it->disp_open) {
        /* A dispatcher away (restarted): the tick connects again. */
        if (!it->release_due) {
            it->release_due = true;
            struct timeval tv = {LEAVE_WAIT_MS / 1000, (LEAVE_WAIT_MS % 1000) * 1000};
            evtimer_add(it->release_timer, &tv);
        }
        if (!it->disp)
            disp_connect(it);
        return;
    }
    it->release_due = false;
    sluice_ReleaseClientRequest req = {.job_id = it->job_id, .client_id = it->client_id};
    memcpy(req.client_secret, it->client_secret, sizeof req.client_secret);
    uint8_t *buf = NULL, *back = NULL;
    size_t len = 0, back_len = 0;
    if (it->leaving && returned_positions(it, &back, &back_len) == 0) {
        req.returns = true;
        req.returns_whole = it->leave_whole;
        /* What it received goes first: it does not come again from a
         * split whose worker is lost later. Without it (the ledger
         * overflowed) the records given back go alone. */
        uint8_t *both = NULL;
        if (report_positions(it, 0, &buf, &len) == 0 && (both = realloc(buf, len + back_len)) != NULL) {
            memcpy(both + len, back, back_len);
            req.received_length = len;
            buf = both;
            len += back_len;
            free(back);
        } else {
            free(buf);
            buf = back;
            len = back_len;
        }
    } else if (it->leaving) {
        fprintf(stderr, "sluice: iterator of job %" PRIu64 ": the batches that waited for the caller are not "
                        "given back: their provenance is not known\n", it->job_id);
    }
    it->release_id = ++it->next_id;
    int rc = it->disp ? sl_conn_send(it->disp, SL_MSG_RELEASE_CLIENT_REQ, it->release_id, &req, buf, len, NULL, NULL)
                      : -1;
    free(buf);
    if (rc < 0) {
        event_base_loopbreak(it->base);
        return;
    }
    int wait_ms = req.returns ? LEAVE_WAIT_MS : RELEASE_WAIT_MS;
    struct timeval tv = {wait_ms / 1000, (wait_ms % 1000) * 1000};
    evtimer_add(it->release_timer, &tv);
}

/* The caller's thread asked for more (it took a batch) or to stop, or the
 * loop queued batches for it (worker_frame(): it is woken here, once a pass
 * of the loop). */
static void on_kick(evutil_socket_t fd, short what, void *arg)
{
    sl_iterator_t *it = arg;
    (void)fd;
    (void)what;
    if (it->wake_caller) {
        /* After the unlock of the batches' queue: woken before it, the
         * caller would block on the mutex and have to be woken again. The
         * condvar's waiters check it->ready under the mutex, so nothing is
         * missed; close() joins this thread before it destroys the condvar. */
        it->wake_caller = false;
        pthread_cond_broadcast(&it->cv);
    }
    pthread_mutex_lock(&it->mu);
    bool stop = it->stop, sync = it->sync_asked > it->hb_sync;
    pthread_mutex_unlock(&it->mu);
    if (!stop) {
        if (sync && !it->hb_out)
            send_heartbeat(it); /* else sync_answered() sends one */
        pump(it);
        return;
    }
    if (it->release_id || it->leaving)
        return; /* asked already (a batch that came meanwhile kicked again) */
    if (leave_tasks(it))
        return;
    leave_workers(it);
    /* Leave the job politely; do not wait long for the answer. */
    send_release(it);
}

static void *loop_main(void *arg)
{
    sl_iterator_t *it = arg;
    /* A worker or dispatcher that resets its connection must not kill the
     * trainer's process with SIGPIPE (net.h): blocked in this thread for
     * its whole life; one raised is dropped when the thread ends. */
    sl_sigpipe_guard_t guard;
    sl_sigpipe_block(&guard);
    it->disp_last_ok = now_ms();
    disp_connect(it);
    event_base_dispatch(it->base);
    sl_sigpipe_unblock(&guard);
    return NULL;
}

/* ---- the public interface ---- */

void sl_iterator_opts_init(sl_iterator_opts_t *o)
{
    *o = (sl_iterator_opts_t){
        .sharding = SL_SHARDING_OFF,
        /* 0: the window is sized by window_bytes (window_size()), at the
         * least 8 batches and, per worker, 4 (not two: a worker's answers
         * then come in runs the loop takes in fewer wake-ups,
         * docs/protocol.md). */
        .max_outstanding = 0,
        .per_worker_outstanding = 0,
        .window_bytes = 0,
        .connect_timeout_ms = 5000,
        .timeout_ms = 30000,
        .max_batch_bytes = 256u << 20,
        .dispatcher_timeout_ms = DISPATCHER_TIMEOUT_MS,
    };
}

static pthread_once_t evthread_once = PTHREAD_ONCE_INIT;

static void evthread_init(void)
{
    evthread_use_pthreads();
}

/* sl_iterator_open(), and sl_iterator_restore() with the checkpoint's
 * positions (posset bytes) in exclude and its done epochs. */
static int iterator_open(sl_client_t *c, uint64_t dataset_id, const sl_iterator_opts_t *opts, const uint8_t *exclude,
                         size_t exclude_len, sl_posrun_t at, sl_iterator_t **out)
{
    sl_iterator_t *it = calloc(1, sizeof *it);
    *out = it;
    if (!it)
        return -ENOMEM;
    sluice_GetOrCreateJobResponse *resp = NULL; /* on the heap: up to 256 tasks, about 48 KiB */
    pthread_mutex_init(&it->mu, NULL);
    pthread_cond_init(&it->cv, NULL);
    it->ready_tail = &it->ready;
    it->dataset_id = dataset_id;
    sl_auth_copy(&it->auth, &c->auth);
    it->env.auth = &it->auth;
    if (opts)
        it->opts = *opts;
    else
        sl_iterator_opts_init(&it->opts);
    sl__ledger_init(&it->ledger, sl__ledger_max_runs(&it->opts));
    if (exclude_len > 0 || at.epoch > 0 || at.file > 0 || at.begin > 0) {
        char why[256];
        int drc = sl__ledger_restore(&it->ledger, exclude, exclude_len, at, why, sizeof why);
        if (drc < 0) {
            snprintf(it->err, sizeof it->err, "checkpoint: %s", why);
            it->error = drc;
            return drc;
        }
    }
    int rc = SL_EINVAL;
    if (it->opts.job_name && strlen(it->opts.job_name) >= sizeof ((sluice_GetOrCreateJobRequest *)0)->job_name) {
        snprintf(it->err, sizeof it->err, "job name longer than %zu bytes",
                 sizeof ((sluice_GetOrCreateJobRequest *)0)->job_name - 1);
        goto fail;
    }
    if (it->opts.dispatcher_timeout_ms == 0)
        it->opts.dispatcher_timeout_ms = DISPATCHER_TIMEOUT_MS;
    if (it->opts.per_worker_outstanding < 0 || it->opts.per_worker_outstanding > MAX_PER_WORKER) {
        snprintf(it->err, sizeof it->err, "per_worker_outstanding %d is out of range: 1 to %d, or 0 for half the "
                 "window", it->opts.per_worker_outstanding, MAX_PER_WORKER);
        goto fail;
    }
    if (it->opts.max_outstanding < 0) {
        snprintf(it->err, sizeof it->err, "max_outstanding %d is out of range: 1 or more, or 0 for a window sized "
                 "by window_bytes", it->opts.max_outstanding);
        goto fail;
    }
    if (it->opts.timeout_ms < 1 || it->opts.dispatcher_timeout_ms < 1 || it->opts.connect_timeout_ms < 1 ||
        it->opts.max_batch_bytes < 1 || !sl_sharding_name(it->opts.sharding)) {
        snprintf(it->err, sizeof it->err, "options out of range: timeouts and max_batch_bytes must be positive");
        goto fail;
    }
    if (it->opts.num_consumers < 0 || (it->opts.num_consumers > 0 && (it->opts.consumer_index < 0 ||
                                                                        it->opts.consumer_index >= it->opts.num_consumers)) ||
        (it->opts.num_consumers == 0 && it->opts.consumer_index != 0)) {
        snprintf(it->err, sizeof it->err, "consumer_index %d is out of range for num_consumers %d",
                 it->opts.consumer_index, it->opts.num_consumers);
        goto fail;
    }
    if (it->opts.repetition > 0 && !(it->opts.job_name && it->opts.job_name[0])) {
        snprintf(it->err, sizeof it->err, "repetition %" PRIu64 " needs a job_name: repetitions are the passes over "
                 "a named job", it->opts.repetition);
        goto fail;
    }
    /* Deltas are of the ledger a checkpoint is made of: none to keep otherwise. */
    if (it->opts.ledger_deltas > 0 && checkpointable(&it->opts, it->err, sizeof it->err) < 0) {
        char why[sizeof it->err - 64];
        snprintf(why, sizeof why, "%s", it->err);
        snprintf(it->err, sizeof it->err, "ledger_deltas: %s", why);
        goto fail;
    }
    if (!sl_target_workers_name(it->opts.target_workers)) {
        snprintf(it->err, sizeof it->err, "target_workers %d is unknown", (int)it->opts.target_workers);
        goto fail;
    }
    it->coord = it->opts.num_consumers > 0;
    window_size(it);
    it->track = it->opts.sharding == SL_SHARDING_DYNAMIC && it->opts.provenance >= 0;
    it->confirm_every = EARLY_HB_NOTICES;
    it->named = it->opts.job_name && it->opts.job_name[0];
    it->ledger.sole = !it->named; /* an anonymous job's tasks serve this iterator alone */
    it->ledger.named = it->named;
    snprintf(it->job_name, sizeof it->job_name, "%s", it->opts.job_name ? it->opts.job_name : "");
    it->opts.job_name = it->job_name;
    snprintf(it->dispatcher, sizeof it->dispatcher, "%s", c->address);

    sluice_GetOrCreateJobRequest req = sluice_GetOrCreateJobRequest_init_zero;
    rc = -ENOMEM;
    if (!(resp = calloc(1, sizeof *resp)))
        goto fail;
    req.dataset_id = dataset_id;
    req.sharding = it->opts.sharding;
    req.num_consumers = (uint32_t)it->opts.num_consumers;
    req.consumer_index = (uint32_t)it->opts.consumer_index;
    req.target_workers = (uint32_t)it->opts.target_workers;
    req.repetition = it->opts.repetition;
    req.restore_epochs_done = at.epoch;
    req.restore_file = at.file;
    req.restore_record = at.begin;
    snprintf(req.job_name, sizeof req.job_name, "%s", it->job_name);
    rc = sl__client_call(c, SL_MSG_GET_OR_CREATE_JOB_REQ, &req, exclude, exclude_len, SL_MSG_GET_OR_CREATE_JOB_RESP,
                         resp);
    if (rc < 0) {
        snprintf(it->err, sizeof it->err, "%s", c->err);
        goto fail;
    }
    if ((at.file > 0 || at.begin > 0) && !resp->restore_place_taken) {
        /* Leave the job it made at once: an anonymous one ends with its
         * only client (a named one stays until its gc timeout), so that
         * its tasks do not read on for nobody. Best effort. */
        sluice_ReleaseClientRequest rel = {.job_id = resp->job_id, .client_id = resp->client_id};
        memcpy(rel.client_secret, resp->client_secret, sizeof rel.client_secret);
        sluice_ReleaseClientResponse rel_resp;
        (void)sl__client_call(c, SL_MSG_RELEASE_CLIENT_REQ, &rel, NULL, 0, SL_MSG_RELEASE_CLIENT_RESP, &rel_resp);
        rc = SL_EVERSION;
        snprintf(it->err, sizeof it->err, "checkpoint: it starts at epoch %" PRIu32 " file %" PRIu32 " record %"
                 PRIu64 " (within the epoch), and dispatcher %s does not start a job there (it is older): restore it "
                 "against a dispatcher of this release", at.epoch, at.file, at.begin, it->dispatcher);
        goto fail;
    }
    it->job_id = resp->job_id;
    it->ledger.job_id = resp->job_id;
    it->client_id = resp->client_id;
    memcpy(it->client_secret, resp->client_secret, sizeof it->client_secret);
    snprintf(it->notice, sizeof it->notice, "%s", resp->notice);
    it->heartbeat_ms = resp->heartbeat_ms ? resp->heartbeat_ms : 250;
    /* Coordinated reads in place of a consumer that went away: where it was. */
    it->deliver_round = resp->first_round;
    it->take_over_below = resp->take_over_below;
    it->deliver_from = resp->deliver_from;
    if (it->deliver_from > it->deliver_round)
        fprintf(stderr, "sluice: job %" PRIu64 ": consumer %d starts at round %" PRIu64 " with the job's other "
                "consumers; rounds %" PRIu64 " to %" PRIu64 ", which its predecessor had not read, are dropped\n",
                resp->job_id, opts->consumer_index, it->deliver_from, it->deliver_round, it->deliver_from - 1);

    pthread_once(&evthread_once, evthread_init);
    rc = -ENOMEM;
    it->base = event_base_new();
    if (!it->base)
        goto fail;
    it->kick = event_new(it->base, -1, 0, on_kick, it);
    it->tick = event_new(it->base, -1, EV_PERSIST, on_tick, it);
    it->release_timer = evtimer_new(it->base, on_release_timeout, it);
    it->end_probe = evtimer_new(it->base, on_end_probe, it);
    it->retry_timer = evtimer_new(it->base, on_retry_timer, it);
    it->ack_timer = evtimer_new(it->base, on_ack_timer, it);
    it->disp_resolver = sl_resolver_new(it->base, disp_resolved, it);
    if (!it->kick || !it->tick || !it->release_timer || !it->end_probe || !it->retry_timer || !it->ack_timer ||
        !it->disp_resolver)
        goto fail;
    struct timeval tv = {it->heartbeat_ms / 1000, (it->heartbeat_ms % 1000) * 1000};
    event_add(it->tick, &tv);
    /* The job's tasks came with it: their connections start with the
     * loop, beside the dispatcher's, not after its first heartbeat. */
    if (take_tasks(it, resp->tasks, resp->tasks_count) < 0)
        goto fail;
    rc = -pthread_create(&it->thread, NULL, loop_main, it);
    if (rc < 0) {
        snprintf(it->err, sizeof it->err, "cannot start the iterator thread: %s", strerror(-rc));
        goto fail;
    }
    pthread_setname_np(it->thread, "sl-iterator"); /* top -H, perf, gdb (docs/operations.md) */
    it->thread_started = true;
    free(resp);
    return 0;
fail:
    free(resp);
    if (!it->err[0])
        snprintf(it->err, sizeof it->err, "%s", sl_strerror(rc));
    it->error = rc;
    return rc;
}

/* Before a checkpoint of a DYNAMIC iterator: a heartbeat sent now and its
 * answer, so that the epochs the dispatcher knows done are folded
 * (on_heartbeat()) and the checkpoint holds the open epochs only, however
 * many the caller read since the last tick (a process that reads for less
 * than a heartbeat interval and checkpoints held every epoch it read, and
 * a chain of them restored from each other held more and more). Waits at
 * most a heartbeat interval: without an answer the checkpoint holds what
 * it held before, which resumes as well. */
static void sync_dispatcher(sl_iterator_t *it)
{
    if (!it->track)
        return;
    pthread_mutex_lock(&it->mu);
    if (!it->thread_started || it->error || it->finished) {
        pthread_mutex_unlock(&it->mu);
        return;
    }
    uint64_t want = ++it->sync_asked;
    pthread_mutex_unlock(&it->mu);
    event_active(it->kick, EV_READ, 0);
    struct timespec until = cv_deadline((int)it->heartbeat_ms);
    pthread_mutex_lock(&it->mu);
    while (it->sync_done < want && !it->error && !it->finished)
        if (pthread_cond_timedwait(&it->cv, &it->mu, &until) == ETIMEDOUT)
            break;
    pthread_mutex_unlock(&it->mu);
}

/* Whether the ledger is crowded (under mu): its runs (with those that
 * wait to be merged) reach half its bound, max_ledger_runs, and grew a
 * sixteenth of it since it last asked (or fell below half since). Then it
 * asks the dispatcher which epochs are done before the tick, and folds
 * them on the answer: a caller that read many epochs of many files between
 * two heartbeats otherwise filled it, and a ledger that overflows takes no
 * checkpoint again.
 * @return 0: not crowded; 1: ask (the loop sends a heartbeat, as for a
 *         checkpoint, without anyone waiting for it); 2: past three
 *         quarters, ask and wait for the answer (sync_dispatcher(): one
 *         round trip, at most a heartbeat interval), since the caller may
 *         read faster than a round trip */
static int ledger_crowded(sl_iterator_t *it)
{
    size_t runs = sl__ledger_runs_held(&it->ledger), max = it->ledger.max_runs;
    if (runs < max / 2) {
        it->ledger_ask_at = 0; /* a fold made room: the next crossing asks */
        return 0;
    }
    if (!it->track || it->ledger.rc < 0 || runs < it->ledger_ask_at)
        return 0;
    it->ledger_ask_at = runs + max / 16 + 1;
    if (runs >= max - max / 4)
        return 2; /* sync_dispatcher() asks */
    it->sync_asked++;
    return 1;
}

/* Records what the caller is given, batch b (or none: the end) and done
 * notices (under it->mu). */
static void ledger_add(sl_iterator_t *it, const struct sl_batch *b, const sl_split_done_t *done, size_t ndone)
{
    if (it->opts.provenance <= 0 && !it->track)
        return;
    const uint8_t *prov = b ? b->prov_wire : NULL;
    size_t prov_len = b && b->num_prov > 0 ? b->prov_wire_len : 0;
    uint64_t num_records = b ? b->num_records : 0;
    if (b && b->num_prov == 1)
        sl__ledger_add_run(&it->ledger, b->prov, done, ndone, false); /* decoded as it was checked */
    else
        sl__ledger_add_tallied(&it->ledger, prov, prov_len, num_records, b ? b->tally : NULL,
                               b ? b->num_tally : 0, done, ndone, !b);
    if (it->opts.ledger_deltas > 0)
        sl__delta_log_batch(&it->deltas, prov, prov_len, num_records, done, ndone, !b);
}

int sl_iterator_next(sl_iterator_t *it, sl_batch_t **out)
{
    return sl_iterator_next_wait(it, out, -1);
}

int sl_iterator_next_wait(sl_iterator_t *it, sl_batch_t **out, int wait_ms)
{
    *out = NULL;
    struct timespec until = {0};
    if (wait_ms >= 0)
        until = cv_deadline(wait_ms);
    pthread_mutex_lock(&it->mu);
    int rc, crowded = 0;
    bool kick = false;
    for (;;) {
        if (it->ready) {
            struct sl_batch *b = it->ready;
            it->ready = b->next;
            if (!it->ready)
                it->ready_tail = &it->ready;
            it->ready_count--;
            b->next = NULL;
            /* Notices that came after the batches before this one. */
            if (it->num_pending_done > 0 &&
                sl__batch_add_notices(b, it->pending_done, it->num_pending_done) < 0) {
                sl__batch_free(b);
                rc = -ENOMEM;
                break;
            }
            it->num_pending_done = 0;
            ledger_add(it, b, b->done, b->num_done);
            *out = b;
            rc = 0;
            crowded = ledger_crowded(it);
            kick = it->budget_full || crowded == 1;
            it->budget_full = false;
            break;
        }
        if (it->error) {
            rc = it->error;
            break;
        }
        if (it->finished) {
            ledger_add(it, NULL, it->pending_done, it->num_pending_done);
            rc = 1;
            break;
        }
        if (!it->thread_started) {
            rc = SL_EINVAL;
            break;
        }
        if (wait_ms < 0) {
            pthread_cond_wait(&it->cv, &it->mu);
        } else if (pthread_cond_timedwait(&it->cv, &it->mu, &until) == ETIMEDOUT) {
            rc = -EAGAIN;
            break;
        }
    }
    pthread_mutex_unlock(&it->mu);
    /* Room freed in a full budget: let the loop ask for more; or a
     * crowded ledger: let it ask the dispatcher (on_kick()). */
    if (kick)
        event_active(it->kick, EV_READ, 0);
    if (crowded == 2)
        sync_dispatcher(it);
    return rc;
}

int sl_iterator_open(sl_client_t *c, uint64_t dataset_id, const sl_iterator_opts_t *opts, sl_iterator_t **out)
{
    return iterator_open(c, dataset_id, opts, NULL, 0, (sl_posrun_t){0}, out);
}

/* A rank of a named job checkpoints what its own caller was given; the
 * ranks' checkpoints merge into what the job's callers were given, since
 * DYNAMIC hands each split to one worker and each batch to one client.
 * Coordinated reads keep no such record (a round's batch lost with a
 * connection is not sent again), and a static policy's named job shares
 * its tasks' streams without split-done notices: both stay refused. */
static int checkpointable(const sl_iterator_opts_t *o, char *err, size_t errlen)
{
    bool dynamic = o->sharding == SL_SHARDING_DYNAMIC;
    bool named = o->job_name && o->job_name[0];
    if (o->num_consumers > 0)
        return sl_errf(err, errlen, SL_EINVAL, "checkpoints of coordinated reads (num_consumers %d) are not "
                       "supported", o->num_consumers);
    if (named && !dynamic)
        return sl_errf(err, errlen, SL_EINVAL, "checkpoints of a named job need dynamic sharding, not %s",
                       sl_sharding_name(o->sharding) ? sl_sharding_name(o->sharding) : "an unknown policy");
    if (o->sharding == SL_SHARDING_OFF || o->provenance < 0 || (!dynamic && o->provenance == 0))
        return sl_errf(err, errlen, SL_EINVAL, "checkpoints need an iterator with a sharding policy: dynamic "
                       "(provenance not turned off, opts.provenance >= 0), or a static one of its own anonymous "
                       "job with opts.provenance > 0");
    return 0;
}

int sl_checkpoint_merge(const uint8_t *const *ckpts, const size_t *lens, size_t n, const char *auth_token_file,
                        uint8_t **out, size_t *out_len, char *err, size_t errlen)
{
    *out = NULL;
    *out_len = 0;
    sl_auth_t auth;
    sl_auth_opts_t ao = {.token_file = auth_token_file};
    int rc = sl_auth_load(&auth, &ao, err, errlen);
    if (rc < 0)
        return rc;
    rc = sl__checkpoint_merge(ckpts, lens, n, auth.token, auth.token_len, SL_POSSET_MAX_RUNS, out, out_len, err,
                              errlen);
    sl_auth_free(&auth);
    return rc;
}

int sl_iterator_checkpoint(sl_iterator_t *it, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    int rc = checkpointable(&it->opts, it->err, sizeof it->err);
    if (rc < 0)
        return rc;
    sync_dispatcher(it);
    pthread_mutex_lock(&it->mu);
    rc = sl__ledger_checkpoint(&it->ledger, it->dataset_id, it->auth.token, it->auth.token_len, out, len, it->err,
                               sizeof it->err);
    pthread_mutex_unlock(&it->mu);
    return rc;
}

int sl_iterator_delta(sl_iterator_t *it, uint8_t **out, size_t *len, uint8_t **ckpt, size_t *ckpt_len)
{
    *out = NULL;
    *len = 0;
    if (ckpt) {
        *ckpt = NULL;
        *ckpt_len = 0;
    }
    int rc = checkpointable(&it->opts, it->err, sizeof it->err);
    if (rc < 0)
        return rc;
    if (it->opts.ledger_deltas <= 0)
        return sl_errf(it->err, sizeof it->err, SL_EINVAL,
                       "deltas need an iterator opened with opts.ledger_deltas > 0");
    if (ckpt)
        sync_dispatcher(it);
    pthread_mutex_lock(&it->mu);
    /* Under one lock: no heartbeat's fold comes between the two. The
     * checkpoint first, so that a failed one leaves the records in the log. */
    if (ckpt)
        rc = sl__ledger_checkpoint(&it->ledger, it->dataset_id, it->auth.token, it->auth.token_len, ckpt, ckpt_len,
                                   it->err, sizeof it->err);
    if (rc == 0)
        rc = sl__delta_log_take(&it->deltas, it->dataset_id, out, len, it->err, sizeof it->err);
    if (rc < 0 && ckpt) {
        free(*ckpt);
        *ckpt = NULL;
        *ckpt_len = 0;
    }
    pthread_mutex_unlock(&it->mu);
    return rc;
}

void sl_free(void *p)
{
    free(p);
}

int sl_iterator_restore(sl_client_t *c, uint64_t dataset_id, const sl_iterator_opts_t *opts, const uint8_t *ckpt,
                        size_t len, sl_iterator_t **out)
{
    char err[300];
    int rc = opts ? checkpointable(opts, err, sizeof err) : sl_errf(err, sizeof err, SL_EINVAL, "restore needs "
                                                                     "options: dynamic sharding");
    uint8_t *positions = NULL;
    size_t positions_len = 0;
    uint64_t epochs_done = 0;
    sl_posrun_t at = {0};
    if (rc == 0)
        rc = sl__checkpoint_read(ckpt, len, dataset_id, c->auth.token, c->auth.token_len, sl__ledger_max_runs(opts),
                                 &positions, &positions_len, &epochs_done, &at, err, sizeof err);
    if (rc < 0) {
        sl_iterator_t *it = calloc(1, sizeof *it);
        *out = it;
        if (!it)
            return -ENOMEM;
        pthread_mutex_init(&it->mu, NULL);
        pthread_cond_init(&it->cv, NULL);
        it->ready_tail = &it->ready;
        snprintf(it->err, sizeof it->err, "%s", err);
        it->error = rc;
        return rc;
    }
    rc = iterator_open(c, dataset_id, opts, positions, positions_len, at, out);
    free(positions);
    return rc;
}

const char *sl_iterator_errmsg(const sl_iterator_t *it)
{
    return it ? it->err : "out of memory";
}

uint64_t sl_iterator_job_id(const sl_iterator_t *it)
{
    return it->job_id;
}

void sl_iterator_close(sl_iterator_t *it)
{
    if (!it)
        return;
    if (it->thread_started) {
        pthread_mutex_lock(&it->mu);
        it->stop = true;
        pthread_mutex_unlock(&it->mu);
        event_active(it->kick, EV_READ, 0);
        pthread_join(it->thread, NULL);
    }
    while (it->tasks) {
        struct itask *t = it->tasks;
        it->tasks = t->next;
        if (t->conn)
            sl_conn_close(t->conn);
        task_conn_gone(t);
        sl_resolver_free(t->resolver);
        free(t);
    }
    if (it->disp)
        sl_conn_close(it->disp);
    while (it->ready) {
        struct sl_batch *b = it->ready;
        it->ready = b->next;
        sl__batch_free(b);
    }
    free(it->pending_done);
    sl__ledger_free(&it->ledger);
    sl__delta_log_free(&it->deltas);
    sl_auth_free(&it->auth);
    for (unsigned i = 0; i < MAX_WINDOW; i++)
        sl__batch_free(it->slots[i].batch);
    if (it->kick)
        event_free(it->kick);
    if (it->tick)
        event_free(it->tick);
    if (it->release_timer)
        event_free(it->release_timer);
    if (it->end_probe)
        event_free(it->end_probe);
    if (it->retry_timer)
        event_free(it->retry_timer);
    if (it->ack_timer)
        event_free(it->ack_timer);
    sl_resolver_free(it->disp_resolver);
    if (it->base)
        event_base_free(it->base);
    pthread_cond_destroy(&it->cv);
    pthread_mutex_destroy(&it->mu);
    free(it);
}

size_t sl_iterator_waiting(sl_iterator_t *it, char *buf, size_t len)
{
    pthread_mutex_lock(&it->mu);
    size_t n = strlen(it->waiting);
    if (len > 0)
        snprintf(buf, len, "%s", it->waiting);
    pthread_mutex_unlock(&it->mu);
    return n;
}

unsigned sl_iterator_queued(sl_iterator_t *it)
{
    pthread_mutex_lock(&it->mu);
    unsigned n = it->ready_count;
    pthread_mutex_unlock(&it->mu);
    return n;
}

uint64_t sl_iterator_records_missing(sl_iterator_t *it)
{
    pthread_mutex_lock(&it->mu);
    uint64_t n = it->ledger.missing;
    pthread_mutex_unlock(&it->mu);
    return n;
}

const char *sl_iterator_notice(const sl_iterator_t *it)
{
    return it ? it->notice : "";
}

const sl_split_done_t *sl_iterator_splits_done(const sl_iterator_t *it, size_t *num)
{
    *num = it->num_pending_done;
    return it->num_pending_done ? it->pending_done : NULL;
}
