/*
 * worker.c: see worker.h.
 *
 * The dispatcher session moves through
 *   DISCONNECTED -> CONNECTING -> REGISTERING -> REGISTERED
 * and back to DISCONNECTED when the connection drops, after which it tries
 * again every RECONNECT_MS, give or take half of it. A heartbeat answered with SL_ENOTFOUND (the
 * dispatcher forgot us) goes REGISTERED -> REGISTERING; a refused
 * registration is retried every RECONNECT_MS. While REGISTERED it
 * heartbeats every heartbeat_ms, and at once when a task finishes. A
 * registration that is no resume forgets the tasks of the one before
 * (forget_registration()).
 *
 * Past 900 lines: the dispatcher session and the client connections share
 * the worker's tasks and its one loop; the task runner is task.c, rounds
 * rounds.c.
 */
#include "worker.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/listener.h>
#include <openssl/crypto.h>

#include "conn.h"
#include "held.h"
#include "log.h"
#include "metrics.h"
#include "net.h"
#include "posbits.h"
#include "provwire.h"
#include "resolve.h"
#include "rng.h"
#include "rounds.h"
#include "shm.h"
#include "strcopy.h"
#include "taskkey.h"

#define RECONNECT_MS 500
#define MAX_PARKED_PER_CONN 64
/* Requests for tasks this worker does not have yet, waiting for the
 * dispatcher's next heartbeat answer (struct awaiting): at most this many in
 * all, each at most --await-task-ms (sl_worker_config_t.await_task_ms);
 * past either the answer is SL_ENOTFOUND at once, and the client asks again. */
#define MAX_AWAITING 1024
/* Finished tasks remembered after the dispatcher dropped them, so that a
 * late request still gets its end of sequence. */
#define TOMBSTONES 4096

enum session_state { SESSION_DISCONNECTED, SESSION_CONNECTING, SESSION_REGISTERING, SESSION_REGISTERED };
static const char *session_names[] = {"DISCONNECTED", "CONNECTING", "REGISTERING", "REGISTERED"};

/* A GET_ELEMENT for a task this worker has not heard of: its client heard
 * of the task from the dispatcher first (a new job's first request reaches
 * the worker before the heartbeat that brings the task). It waits for the
 * answer to a heartbeat sent after it came, and for the task's start if
 * that answer lists the task, then is served as if it came then; a task
 * still unknown by then answers SL_ENOTFOUND. */
struct awaiting {
    struct wconn *wc;
    uint32_t request_id;
    sluice_GetElementRequest req;
    uint64_t heartbeat; /* the first heartbeat whose answer may bring the task */
    int64_t since_ms;
    bool ready; /* resolve_awaiting() answers it */
    struct awaiting *next;
};

/* A request of ours to the dispatcher that awaits its answer. */
struct outstanding {
    uint32_t id;
    unsigned type;
    sluice_TaskDef def; /* GET_DATASET, GET_EXCLUSIONS: the task it is for */
    char *spec;         /* GET_EXCLUSIONS: the task's spec (owned) */
    size_t spec_len;
    uint64_t task_id;   /* GET_SPLIT: the task it is for */
    struct outstanding *next;
};

struct wtask {
    sl_task_t *task;
    sl_rounds_t *rounds; /* coordinated reads, or NULL */
    sl_worker_t *w;
    int last_state; /* sl_task_state_t last reported */
    uint8_t key[16]; /* TaskDef.task_key: what each client's key to it is derived from */
    bool client_keys; /* TaskDef.client_keys: clients show their own keys, never this one */
    sl_holders_t *holders; /* batches served and not yet acknowledged (held.h) */
    /* DYNAMIC: the done_below of its last batch served (the floor of the
     * next, held.h), and what its last split request said reached its
     * clients (received_below, received_past_lost). */
    uint64_t batch_below, received_said, past_said;
    /* Its requests waiting for a batch, in arrival order: a request or a
     * batch of one task looks at its own, not at every task's. */
    struct parked *parked, **parked_tail;
    unsigned num_parked;
    unsigned parked_stand_ins; /* of them, coordinated reads' stand-ins */
    struct wtask *next;
};

/* What a dropped DYNAMIC task measured of its pipeline's rate through its
 * splits (sl_task_split_rate()), for the latest RATE_MEMOS datasets: a new
 * task of the dataset starts at it (known_rate()). */
#define RATE_MEMOS 32
struct rate_memo {
    uint64_t dataset_id;
    double rate; /* records/s; 0: an unused slot */
};

struct tombstone {
    uint64_t task_id;
    bool done; /* finished; otherwise cancelled */
    uint8_t key[16]; /* the task's key: a late request must still carry the client's */
    bool client_keys;
    /* A finished task's batches its clients have not acknowledged yet
     * (held.h), or NULL: a client whose connection broke with the task's
     * last answers in flight may ask again after the job ended and the
     * dispatcher took the task away. Let go as for a live task. */
    sl_holders_t *holders;
};

struct wconn {
    sl_worker_t *w;
    sl_conn_t *conn;
    unsigned parked;
    bool provenance; /* its client asks for provenance runs (GetElementRequest.provenance) */
    bool tallies;    /* and for tallies (GetElementRequest.tallies) */
    bool dense;      /* and reads the dense form (GetElementRequest.dense_provenance) */
    sl_shm_region_t *shm; /* its shared-memory region (shm.h), NULL: none */
    bool shm_none;        /* making one failed: the connection goes without */
    bool shm_offer;       /* the next answer offers it */
    bool shm_mapped;      /* its client mapped it: payloads go there when they fit */
    bool shm_tail_answer; /* and asked for small tails in the answer (GetElementRequest.shm_tail_in_answer) */
    sl_task_key_proof_t proofs[SL_TASK_KEY_PROOFS]; /* keys its requests proved */
    struct wconn *prev, *next;
};

/* A GET_ELEMENT request waiting for its task's next batch. */
struct parked {
    struct wconn *wc;
    uint32_t request_id;
    bool coordinated; /* a round of a coordinated read */
    bool stand_in;    /* for a lost worker's round: the task's next batch, outside its rounds */
    bool take_over;   /* its consumer's batch of the round may have gone to the client it replaces */
    uint64_t round;
    uint32_t consumer;
    uint64_t client_id, seq; /* redelivery (held.h): seq 0 for none */
    /* An earlier request of its client and seq waited when it came: the
     * client asked again on a new connection while the old one, still open
     * here, waited too. It gets the batch the earlier one got. */
    bool twin;
    /* Its key is a key to the task of its id that was here, or is: that
     * task's tombstone may answer it (tombstone_of()). */
    bool tomb_ok;
    int64_t since_us; /* when it started waiting: the client starves meanwhile */
    struct parked *next;
};

/* A send of a served batch in a socket's output: accounted for once written. */
struct sent {
    sl_worker_t *w;
    sl_served_t *served; /* one reference, the send's */
};

struct sl_worker {
    struct event_base *base;
    sl_worker_config_t cfg;
    char dispatcher[256];
    char address[256];
    uint16_t port;
    struct evconnlistener *listener;
    sl_shm_lane_t *lane; /* NULL: no shared memory (--shm-mb 0, or no lane) */
    struct wconn *conns;
    struct awaiting *awaiting; /* in arrival order */
    unsigned num_awaiting;
    struct wtask *tasks;
    unsigned num_tasks;
    struct tombstone tombstones[TOMBSTONES];
    unsigned tomb_next;
    struct rate_memo rates[RATE_MEMOS];
    unsigned rate_next;

    enum session_state session;
    sl_conn_t *disp;
    uint64_t worker_id;
    uint32_t next_request_id;
    struct outstanding *outstanding;
    bool heartbeat_out;
    uint64_t heartbeats_sent, heartbeats_answered; /* answered: the number of the last answered */
    /* The first heartbeat sent since the session registered: until it is
     * answered, the tasks kept from before are not vouched for (the
     * dispatcher may replace one by a task of the same id: tasks_vouched()). */
    uint64_t vouch_from;
    uint8_t worker_secret[16]; /* WorkerRegisterResponse.worker_secret: proves worker_id */
    /* A dispatcher connection given up on (heartbeats unanswered), kept open
     * until a new one has registered: closing it at once would reach the
     * dispatcher after a heal before our new registration, and it would
     * declare us lost. Frames on it are ignored. */
    sl_conn_t *old_disp;
    int64_t heartbeat_sent_ms; /* when the heartbeat in flight went */
    bool heartbeat_soon;
    struct event *heartbeat_timer;
    struct event *hold_timer; /* drops what silent clients hold (held.h) */
    struct event *reconnect_timer;
    sl_resolver_t *resolver; /* the dispatcher's address (session_connect()) */
    sl_rng_t jitter; /* draws the reconnect delays (reconnect_later()) */
    struct event *retry_register;
};

static sl_metric_t *m_awaited, *m_unknown, *m_client_wait, *m_served, *m_bytes_served, *m_forbidden;
static sl_metric_t *m_shm_served, *m_shm_lent, *m_shm_fallback, *m_notices, *m_sent_again, *m_stand_in, *m_not_held;

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void session_connect(sl_worker_t *w);
static void send_heartbeat(sl_worker_t *w);
static void heartbeat_now(sl_worker_t *w);
static void serve_parked(sl_worker_t *w, struct wtask *wt);

static void session_set_state(sl_worker_t *w, enum session_state next)
{
    sl_log_debug("dispatcher session: %s -> %s", session_names[w->session], session_names[next]);
    w->session = next;
}

static struct wtask *find_task(sl_worker_t *w, uint64_t id)
{
    for (struct wtask *wt = w->tasks; wt; wt = wt->next)
        if (sl_task_id(wt->task) == id)
            return wt;
    return NULL;
}

static const struct tombstone *find_tombstone(const sl_worker_t *w, uint64_t id)
{
    for (unsigned i = 0; i < TOMBSTONES; i++)
        if (w->tombstones[i].task_id == id)
            return &w->tombstones[i];
    return NULL;
}

/* The tombstone of the task a request names, if the request's key is a key
 * to that task: a tombstone answers (end, cancelled) only its own task's
 * clients. A request with another key may be for a new task of the id that
 * this worker has not heard of yet: a dispatcher restored from a backup
 * gives the lost state's ids out again, with other keys (the job's nonce,
 * dispatcher/caps.h). It is taken as a request for a task not here. */
static const struct tombstone *tombstone_of(struct wconn *wc, const sluice_GetElementRequest *req)
{
    const struct tombstone *tb = find_tombstone(wc->w, req->task_id);
    return tb && sl_task_key_check(wc->proofs, req->task_id, req->client_id, tb->key, tb->client_keys,
                                   req->task_key)
               ? tb
               : NULL;
}

static void tomb_clear(struct tombstone *tb)
{
    sl_holders_free(tb->holders);
    *tb = (struct tombstone){0};
}

static void tombs_clear(sl_worker_t *w)
{
    for (unsigned i = 0; i < TOMBSTONES; i++)
        tomb_clear(&w->tombstones[i]);
    w->tomb_next = 0;
}

/* A new task of id's: a tombstone of that id names another task, of a
 * state the dispatcher was restored from a backup of (it gives the lost
 * state's ids out again), and would answer the new task's requests for it. */
static void bury_no_more(sl_worker_t *w, uint64_t id)
{
    for (unsigned i = 0; i < TOMBSTONES; i++)
        if (w->tombstones[i].task_id == id)
            tomb_clear(&w->tombstones[i]);
}

/* ---- requests to the dispatcher ---- */

/* A task the dispatcher listed whose spec (or exclusions) we asked for. */
static bool starting(const sl_worker_t *w, uint64_t task_id)
{
    for (const struct outstanding *o = w->outstanding; o; o = o->next)
        if ((o->type == SL_MSG_GET_DATASET_REQ || o->type == SL_MSG_GET_EXCLUSIONS_REQ) && o->def.task_id == task_id)
            return true;
    return false;
}

static struct outstanding *expect_answer(sl_worker_t *w, unsigned type)
{
    struct outstanding *o = calloc(1, sizeof *o);
    if (!o)
        return NULL;
    o->id = ++w->next_request_id;
    o->type = type;
    o->next = w->outstanding;
    w->outstanding = o;
    return o;
}

static struct outstanding *take_answer(sl_worker_t *w, uint32_t id)
{
    for (struct outstanding **p = &w->outstanding; *p; p = &(*p)->next) {
        if ((*p)->id == id) {
            struct outstanding *o = *p;
            *p = o->next;
            return o;
        }
    }
    return NULL;
}

static void send_request(sl_worker_t *w, struct outstanding *o, const void *msg)
{
    if (sl_conn_send(w->disp, o->type, o->id, msg, NULL, 0, NULL, NULL) < 0) {
        /* The connection is going down; its close resets the session. */
        sl_log_debug("cannot send %s to the dispatcher", sl_msg_name(o->type));
    }
}

/* DYNAMIC: every split below the returned id went out in batches its
 * clients acknowledged (GetSplitRequest.received_below, held.h): the
 * dispatcher needs no client's word for those, and a task held at
 * --max-outstanding-splits goes on at its next request, not after a
 * heartbeat of every client (one that got none of its batches of late is
 * behind). Read on this thread, which alone serves batches. Not for
 * coordinated reads, whose rounds keep their own. With batches lost (held.h),
 * which hold records of splits below *lost_below alone: every split from
 * there up to *past reached its clients too (GetSplitRequest.lost_below,
 * received_past_lost), which the dispatcher counts once its clients said
 * they have every split below *lost_below. */
static uint64_t received_below(struct wtask *wt, uint64_t *lost_below, uint64_t *past)
{
    *lost_below = *past = 0;
    if (wt->rounds || !wt->holders)
        return 0;
    uint64_t below = sl_holders_received_below(wt->holders, sl_task_done_below(wt->task), lost_below, past);
    if (*lost_below == 0)
        *past = 0;
    return below;
}

/* Asks the dispatcher for the splits each DYNAMIC task wants. */
static void fetch_splits(sl_worker_t *w, struct wtask *wt)
{
    uint64_t epoch;
    uint32_t max;
    uint64_t seq, records;
    if (w->session != SESSION_REGISTERED || !sl_task_want_splits(wt->task, &epoch, &max, &seq, &records))
        return;
    uint32_t slack;
    uint64_t rate;
    sl_task_split_report(wt->task, &slack, &rate);
    struct outstanding *o = expect_answer(w, SL_MSG_GET_SPLIT_REQ);
    if (!o) {
        sl_task_splits_failed(wt->task, true, -ENOMEM, "out of memory");
        return;
    }
    o->task_id = sl_task_id(wt->task);
    uint64_t lost_below, past, received = received_below(wt, &lost_below, &past);
    wt->received_said = received;
    wt->past_said = past;
    sluice_GetSplitRequest req = {.task_id = o->task_id,
                                  .epoch = epoch,
                                  .max_splits = max,
                                  .request_seq = seq,
                                  .split_records = records,
                                  .slack_ms = slack,
                                  .records_per_second = rate,
                                  .cross_epochs = true,
                                  .for_extra = sl_task_extra_wanted(wt->task),
                                  .received_below = received,
                                  .lost_below = lost_below,
                                  .received_past_lost = past};
    send_request(w, o, &req);
}

/* ---- tasks ---- */

static void on_task_notify(sl_task_t *task, void *arg)
{
    struct wtask *wt = arg;
    sl_worker_t *w = wt->w;
    (void)task;
    serve_parked(w, wt);
    fetch_splits(w, wt);
    int state = sl_task_state(wt->task);
    if (state != wt->last_state) {
        /* The dispatcher should hear at once that a task finished. */
        wt->last_state = state;
        heartbeat_now(w);
    }
}

/* The rate a new DYNAMIC task of dataset_id starts at (0: none known): the
 * newest running task's of the dataset that measured one, else what the
 * last dropped one measured. Repeated short jobs (an evaluation pass each
 * epoch) then ask for splits of the target length from their first request
 * instead of taking a second hand-out's round trip a few batches in. Only
 * a hint: a wrong one sizes that first request alone, within
 * --max-split-size and the guided share (a new dispatcher, which gives
 * dataset ids again, finds the memo empty: forget_registration()). */
static struct rate_memo *rate_memo_of(sl_worker_t *w, uint64_t dataset_id)
{
    for (unsigned i = 0; i < RATE_MEMOS; i++)
        if (w->rates[i].rate > 0 && w->rates[i].dataset_id == dataset_id)
            return &w->rates[i];
    return NULL;
}

static double known_rate(sl_worker_t *w, uint64_t dataset_id)
{
    for (const struct wtask *wt = w->tasks; wt; wt = wt->next) {
        double r = sl_task_dataset_id(wt->task) == dataset_id ? sl_task_split_rate(wt->task) : 0;
        if (r > 0)
            return r;
    }
    const struct rate_memo *m = rate_memo_of(w, dataset_id);
    return m ? m->rate : 0;
}

static void remember_rate(sl_worker_t *w, sl_task_t *task)
{
    double r = sl_task_split_rate(task);
    uint64_t id = sl_task_dataset_id(task);
    if (r <= 0)
        return;
    struct rate_memo *m = rate_memo_of(w, id);
    if (!m)
        m = &w->rates[w->rate_next++ % RATE_MEMOS];
    *m = (struct rate_memo){.dataset_id = id, .rate = r};
}

static void start_task(sl_worker_t *w, const sluice_TaskDef *def, const char *spec, size_t len,
                       const uint8_t *exclude, size_t exclude_len)
{
    if (find_task(w, def->task_id))
        return;
    char err[1024];
    struct wtask *wt = calloc(1, sizeof *wt);
    if (!wt)
        return;
    if (!(wt->holders = sl_holders_new(w->cfg.task.mem))) {
        free(wt);
        return;
    }
    wt->w = w;
    wt->parked_tail = &wt->parked;
    wt->last_state = SL_TASK_RUNNING;
    memcpy(wt->key, def->task_key, sizeof wt->key);
    wt->client_keys = def->client_keys;
    int rc = sl_task_new(w->base, def, spec, len, exclude, exclude_len, &w->cfg.task, on_task_notify, wt, &wt->task,
                         err, sizeof err);
    if (rc < 0) {
        /* Out of memory, or the excluded positions the dispatcher sent are
         * bad (a task that cannot run otherwise is made failed, and tells
         * its clients why): said in the log, tried again at the next
         * heartbeat. */
        sl_log_error("task %" PRIu64 " of job %" PRIu64 " cannot start: %s", def->task_id, def->job_id, err);
        sl_holders_free(wt->holders);
        free(wt);
        return;
    }
    if (def->num_consumers > 0 && !(wt->rounds = sl_rounds_new(def->num_consumers))) {
        sl_log_error("task %" PRIu64 " of job %" PRIu64 " cannot start: %u consumers (at most %d) or out of memory",
                     def->task_id, def->job_id, def->num_consumers, SL_ROUNDS_MAX_CONSUMERS);
        sl_task_free(wt->task);
        sl_holders_free(wt->holders);
        free(wt);
        return;
    }
    if (def->sharding == SL_SHARDING_DYNAMIC)
        sl_task_seed_split_rate(wt->task, known_rate(w, def->dataset_id));
    /* What the worker holds of the task's batches for its clients is the
     * task's own too: its pipeline waits for it to come back. */
    sl_holders_count_own(wt->holders, sl_task_own_bytes(wt->task));
    wt->next = w->tasks;
    w->tasks = wt;
    w->num_tasks++;
    sl_log_info("task %" PRIu64 " of job %" PRIu64 " started (%s)", def->task_id, def->job_id,
                sl_sharding_name((sl_sharding_t)def->sharding));
    fetch_splits(w, wt);
}

static void drop_task(sl_worker_t *w, uint64_t task_id)
{
    for (struct wtask **p = &w->tasks; *p; p = &(*p)->next) {
        struct wtask *wt = *p;
        if (sl_task_id(wt->task) != task_id)
            continue;
        struct tombstone *tb = &w->tombstones[w->tomb_next++ % TOMBSTONES];
        tomb_clear(tb);
        tb->task_id = task_id;
        tb->done = sl_task_state(wt->task) == SL_TASK_DONE;
        memcpy(tb->key, wt->key, sizeof tb->key);
        tb->client_keys = wt->client_keys;
        if (tb->done && !sl_holders_empty(wt->holders)) {
            sl_holders_count_own(wt->holders, NULL); /* its task goes */
            tb->holders = wt->holders;
            wt->holders = NULL;
        }
        remember_rate(w, wt->task);
        *p = wt->next;
        w->num_tasks--;
        /* Requests still parked on it get the same answer a late one would. */
        serve_parked(w, wt);
        sl_rounds_free(wt->rounds);
        sl_holders_free(wt->holders);
        sl_task_free(wt->task);
        free(wt);
        sl_log_info("task %" PRIu64 " removed (%s)", task_id, tb->done ? "done" : "cancelled");
        return;
    }
}

/* A registration that is no resume (another id, or the same id under
 * another dispatcher's secret: one started on an empty work dir gives its
 * ids again, to other tasks and datasets) leaves every id this worker knows
 * naming something of the registration before. Its tasks go (a dispatcher
 * that declared it lost gave their splits to others; a new one never had
 * them), and so do the tombstones and the rate memo: a tombstone of a new
 * task's id refused that task's clients (SL_EPERM: not their key), and a
 * memo of a new dataset's id gave it another dataset's rate. */
static void forget_registration(sl_worker_t *w)
{
    while (w->tasks)
        drop_task(w, sl_task_id(w->tasks->task));
    tombs_clear(w);
    memset(w->rates, 0, sizeof w->rates);
    w->rate_next = 0;
}

/* ---- serving clients ---- */

static void on_batch_written(const void *data, size_t len, void *extra)
{
    struct sent *s = extra;
    sl_served_t *sv = s->served;
    (void)data;
    (void)len;
    /* Releasing makes room for the pipeline and may make the task DONE; the
     * task's notify event, run from the loop, acts on that. A batch held for
     * its client counts in the memory budget until acknowledged, not in the
     * task's buffer: the task gives back its room, and of its charge what
     * the holder did not take over (held.h). */
    struct wtask *wt = sv->released ? NULL : find_task(s->w, sv->task_id);
    if (wt)
        sl_task_release(wt->task, sv->batch);
    sv->released = true;
    sl_served_unref(sv);
    free(s);
}

/* Whether a batch's payload may go through shared memory: no component
 * whose bytes the client interprets (a ragged component's row splits, a
 * bytes component's offsets), which the worker could change under it
 * after its checks. */
static bool shm_fits(const sl_wire_batch_t *b)
{
    for (int i = 0; i < b->num_components; i++)
        if (b->components[i].ragged || b->components[i].dtype == SL_DTYPE_BYTES)
            return false;
    return true;
}

/* A lent slot given back (shm.h): its reference to the batch goes. */
static void unhold_served(void *hold)
{
    sl_served_unref(hold);
}

/* Sends served batch sv's answer with its payload in a slot of wc's
 * region, when its client mapped it and the payload fits there now: the
 * payload is copied, and its room goes back to the task at once. Tails
 * (provenance, notices, tallies) of at most 256 bytes go in the answer
 * when the client asked for that: a batch of 8 KiB then takes two pages,
 * not three, and the client reads no page of the slot to check them.
 * @return false when it goes over the socket instead (nothing sent) */
static bool send_in_slot(struct wconn *wc, uint32_t request_id, sl_served_t *sv, const struct iovec tails[2],
                         struct sent *s)
{
    if (!wc->shm_mapped || !shm_fits(sv->batch))
        return false;
    sluice_GetElementResponse *resp = &sv->resp;
    struct iovec parts[3] = {{sv->batch->data, sv->batch->size}, tails[0], tails[1]};
    /* A slot of no bytes is no slot: a batch without tensor bytes keeps its
     * tail there (shm_length 0 would say the payload is in the frame). */
    size_t tail_len = tails[0].iov_len + tails[1].iov_len;
    bool in_answer = wc->shm_tail_answer && tail_len > 0 && tail_len <= sizeof resp->shm_tail.bytes &&
                     sv->batch->size > 0;
    /* A block the pipeline made in this region is the slot itself, held
     * until the client gives it back; its tail in the answer, or after the
     * tensor bytes in the room the block keeps for it (task.c). */
    uint8_t *data = sv->batch->data;
    size_t lend_len = sv->batch->size;
    bool lend = lend_len > 0 && sl_shm_region_holds(wc->shm, data);
    if (lend && !in_answer && tail_len > 0) {
        lend = sl_shm_region_block_room(wc->shm, data) >= lend_len + tail_len;
        for (int i = 0; lend && i < 2; i++)
            if (tails[i].iov_len) {
                memcpy(data + lend_len, tails[i].iov_base, tails[i].iov_len);
                lend_len += tails[i].iov_len;
            }
    }
    if (lend && sl_shm_region_lend(wc->shm, data, lend_len, unhold_served, sv, &resp->shm_offset) == 0) {
        sv->refs++; /* the slot's */
        resp->shm_length = lend_len;
        sl_metric_add(m_shm_lent, 1);
    } else if (sl_shm_region_put(wc->shm, parts, in_answer ? 1 : 3, &resp->shm_offset, &resp->shm_length) < 0) {
        sl_metric_add(m_shm_fallback, 1);
        return false;
    }
    if (in_answer) {
        resp->shm_tail.size = 0;
        for (int i = 0; i < 2; i++)
            if (tails[i].iov_len) { /* a part may be NULL when empty */
                memcpy(resp->shm_tail.bytes + resp->shm_tail.size, tails[i].iov_base, tails[i].iov_len);
                resp->shm_tail.size += (pb_size_t)tails[i].iov_len;
            }
    }
    sl_metric_add(m_shm_served, 1);
    if (sl_conn_send(wc->conn, SL_MSG_GET_ELEMENT_RESP, request_id, resp, NULL, 0, NULL, NULL) < 0)
        sl_log_debug("batch for %s dropped", sl_conn_peer(wc->conn));
    on_batch_written(NULL, 0, s);
    return true;
}

/* Writes served batch sv (its answer as first made) to wc: the answer
 * offers wc's region of shared memory (once), and the payload goes in a
 * slot of it (send_in_slot()) or over the socket. The answer as first made
 * (sv->resp, what a redelivery sends) gets the fields for this send and
 * loses them again once it is encoded (sl_conn_send() encodes at once; a
 * copy of the whole answer cost 800 instructions a batch). */
static void send_served(struct wconn *wc, uint32_t request_id, sl_served_t *sv)
{
    struct sent *s = malloc(sizeof *s);
    if (!s) {
        sl_conn_send_error(wc->conn, request_id, -ENOMEM, "worker out of memory");
        return;
    }
    sv->refs++;
    *s = (struct sent){.w = wc->w, .served = sv};
    sl_metric_add(m_served, 1);
    sl_metric_add(m_bytes_served, (double)sv->batch->size);
    sluice_GetElementResponse *resp = &sv->resp;
    struct iovec tails[2] = {{sv->batch->prov_wire, (size_t)resp->provenance_length},
                             {sv->notices, sv->notices_len}};
    if (wc->shm_offer) {
        wc->shm_offer = false;
        sl_strcopy(resp->shm_socket, sizeof resp->shm_socket, sl_shm_lane_name(wc->w->lane));
        resp->shm_ticket.size = SL_SHM_TICKET_LEN;
        memcpy(resp->shm_ticket.bytes, sl_shm_region_ticket(wc->shm), SL_SHM_TICKET_LEN);
    }
    if (!send_in_slot(wc, request_id, sv, tails, s)) {
        int rc = sl_conn_send_tail(wc->conn, SL_MSG_GET_ELEMENT_RESP, request_id, resp, sv->batch->data,
                                   sv->batch->size, 0, tails, 2, on_batch_written, s);
        if (rc < 0)
            sl_log_debug("batch for %s dropped: %s", sl_conn_peer(wc->conn), sl_strerror(rc));
    }
    resp->shm_socket[0] = '\0';
    resp->shm_ticket.size = 0;
    resp->shm_offset = resp->shm_length = 0;
    resp->shm_tail.size = 0;
}

/* Settles a batch (or none: an end-of-sequence frame when end, else a
 * progress answer) handed to a client now and encodes every split-done
 * notice that is ready into
 * *buf (malloc'd, *notices_len bytes; NULL for none), followed, when the
 * client asked for them (tally), by the batch's tallies (*tally_len bytes:
 * 0 when it has none or there is no memory for them; the client then
 * decodes the provenance instead). Tallies without notices (most batches)
 * go into room, room_len bytes, when they fit.
 * @return 0 or -ENOMEM (for the notices) */
static int fill_done(sl_task_t *task, const sl_wire_batch_t *b, bool end, bool tally, uint8_t *room,
                     size_t room_len, uint8_t **buf, size_t *notices_len, size_t *tally_len, uint64_t *done_below)
{
    sl_split_done_rec_t *recs = NULL;
    unsigned n = 0;
    *buf = NULL;
    *notices_len = *tally_len = 0;
    int rc = b || end ? sl_task_batch_sent(task, b, &recs, &n, done_below)
                      : sl_task_progress_sent(task, &recs, &n, done_below);
    if (rc == 0 && n > 0)
        rc = sl_provwire_encode_done(recs, n, buf, notices_len);
    free(recs);
    uint8_t *t = NULL;
    size_t tlen = 0;
    if (rc == 0 && tally && b && b->ntally > 0 &&
        sl_provwire_encode_done_in(b->tally, b->ntally, *buf ? NULL : room, *buf ? 0 : room_len, &t, &tlen) == 0) {
        if (!*buf) {
            /* No notices (most batches): the tallies are the buffer. */
            *buf = t;
            *tally_len = tlen;
            return rc;
        }
        uint8_t *p = realloc(*buf, *notices_len + tlen);
        if (p) {
            memcpy(p + *notices_len, t, tlen);
            *buf = p;
            *tally_len = tlen;
        }
    }
    free(t);
    return rc;
}

static void send_batch(struct wconn *wc, uint32_t request_id, struct wtask *wt, sl_wire_batch_t *b,
                       const struct parked *how)
{
    sl_served_t *sv = sl_served_new(sl_task_id(wt->task), b);
    /* The provenance, encoded for the wire (docs/protocol.md) once: a
     * batch is made once. The task's producer encodes the next ones in the
     * form this consumer reads. */
    sl_task_prov_form(wt->task, wc->provenance, wc->dense);
    bool prov_nomem = wc->provenance && b->prov_n > 0 && sl_wire_batch_encode_prov(b, wc->dense) < 0;
    if (!sv || prov_nomem) {
        if (sv)
            sv->batch = NULL;
        sl_served_unref(sv);
        sl_task_release(wt->task, b);
        sl_wire_batch_free(b);
        sl_conn_send_error(wc->conn, request_id, -ENOMEM, "worker out of memory");
        return;
    }
    sluice_GetElementResponse *resp = &sv->resp;
    resp->task_id = sv->task_id;
    resp->num_elements = b->num_elements;
    resp->components_count = (pb_size_t)b->num_components;
    for (int i = 0; i < b->num_components; i++) {
        const sl_component_t *c = &b->components[i];
        sluice_Component *pc = &resp->components[i];
        sl_strcopy(pc->name, sizeof pc->name, c->name);
        pc->dtype = c->dtype;
        pc->shape_count = (pb_size_t)c->rank;
        memcpy(pc->shape, c->shape, sizeof(int64_t) * (size_t)c->rank);
        pc->offset = c->offset;
        pc->length = c->length;
        pc->ragged = c->ragged;
        pc->splits_offset = c->splits_offset;
        pc->splits_length = c->splits_length;
    }
    /* The provenance goes right after the tensor bytes; done splits ride
     * along. */
    if (wc->provenance && b->prov_wire) {
        resp->provenance_offset = b->size;
        resp->provenance_length = b->prov_wire_len;
        /* 0 says num_elements (most batches): a field fewer to write and read. */
        resp->num_records = b->prov_records != b->num_elements ? b->prov_records : 0;
    }
    /* Notices that cannot be encoded now wait in the task for a later
     * frame (done_below stays below them). */
    size_t notices_len = 0, tally_len = 0;
    /* Tallies for a batch of more than one run only: the client decodes a
     * single run as it checks it, for less than reading a tally costs. */
    (void)fill_done(wt->task, b, false, wc->provenance && wc->tallies && b->prov_wire && b->prov_n > 1, sv->notices_one,
                    sizeof sv->notices_one, &sv->notices, &notices_len, &tally_len, &resp->done_below);
    sv->floor = wt->batch_below;
    sv->ceil = sl_task_split_ceiling(wt->task);
    if (resp->done_below > wt->batch_below)
        wt->batch_below = resp->done_below;
    sv->notices_len = notices_len + tally_len;
    if (notices_len > 0) {
        resp->notices_offset = b->size + resp->provenance_length;
        resp->notices_length = notices_len;
    }
    if (tally_len > 0) {
        resp->tallies_offset = b->size + resp->provenance_length + notices_len;
        resp->tallies_length = tally_len;
    }
    /* Kept with the task's charge of the batch, which its holder takes
     * over: the batch is sure to be kept when the budget is full. */
    if (how->seq == 0)
        sl_holders_unheld(wt->holders, sv);
    else if (sl_holders_keep(wt->holders, how->client_id, how->seq, sv, b->charged, now_us() / 1000) ==
             SL_HOLD_NO_ROOM)
        sl_metric_add(m_not_held, 1);
    else if (sv->handed > 0)
        sl_task_hand_over(wt->task, b, sv->handed);
    /* A task at the bound, or waiting for the dispatcher before it asks for
     * splits again, says more of what reached its clients with each
     * acknowledgement (acknowledged()): its client sends this one at once,
     * not at its tick. */
    resp->ack_at_once = how->seq != 0 && !wt->rounds && sl_task_acks_wanted(wt->task);
    /* The tensor bytes go out from the batch's own buffer; on_batch_written
     * gives its room back to the task once the socket has taken them. */
    send_served(wc, request_id, sv);
    sl_served_unref(sv);
}

/* A client acknowledged batches of wt. A task the dispatcher told to wait
 * before it asks for splits again (held at --max-outstanding-splits,
 * mostly) asks now if it can say more reached its clients than it said:
 * a round trip after its batches reached them, not at the end of the wait. */
static void acknowledged(struct wtask *wt)
{
    if (!sl_task_split_waits(wt->task))
        return;
    uint64_t lost_below, past, received = received_below(wt, &lost_below, &past);
    if (received > wt->received_said || past > wt->past_said)
        (void)sl_task_retry_now(wt->task);
}

static void task_unknown(struct wconn *wc, uint32_t request_id, uint64_t task_id)
{
    sl_metric_add(m_unknown, 1);
    sl_conn_send_error(wc->conn, request_id, SL_ENOTFOUND, "task %" PRIu64 " is not on worker %s", task_id,
                       wc->w->address);
}

/* A batch held for its client (held.h), asked for again: sent again. */
static void send_again(struct wconn *wc, uint32_t request_id, sl_served_t *sv)
{
    sl_metric_add(m_sent_again, 1);
    send_served(wc, request_id, sv);
}

/* A consumer asked for its batch of a round it took already: sent again
 * when held for it (its request came again, on a new connection, while
 * the first one still waited on the old), else refused: SL_ECLOSED when
 * the consumer numbers its requests (the batch went out on a connection
 * that closed and is no longer held), SL_EINVAL when it does not (asked
 * twice). why: what the rounds said. */
static void round_taken(struct wconn *wc, uint32_t request_id, struct wtask *wt, const struct parked *how,
                        const char *why)
{
    uint64_t task_id = sl_task_id(wt->task);
    sl_served_t *sv = how->seq > 0 ? sl_holders_find(wt->holders, how->client_id, how->seq) : NULL;
    if (sv) {
        send_again(wc, request_id, sv);
    } else if (how->seq > 0) {
        sl_conn_send_error(wc->conn, request_id, SL_ECLOSED,
                           "task %" PRIu64 " on worker %s: %s, on a connection that closed, and it is no longer "
                           "held (acknowledged, or dropped after its client was silent past the hold timeout, or "
                           "no memory to hold it): its elements are lost to this consumer",
                           task_id, wc->w->address, why);
    } else {
        sl_conn_send_error(wc->conn, request_id, SL_EINVAL, "task %" PRIu64 " on worker %s: %s", task_id,
                           wc->w->address, why);
    }
}

/* A request whose twin (struct parked) was answered before it: the same
 * batch again, or SL_ECLOSED when it is no longer held. @return false when
 * its twin got no batch (an end, an error): it is served as any other */
static bool twin_answered(struct wconn *wc, uint32_t request_id, struct wtask *wt, const struct parked *how)
{
    sl_served_t *sv;
    char err[512];
    int rc = sl_holders_recall(wt->holders, how->client_id, how->seq, &sv, err, sizeof err);
    if (rc == SL_HELD_AGAIN) {
        send_again(wc, request_id, sv);
    } else if (rc < 0) {
        sl_conn_send_error(wc->conn, request_id, rc, "task %" PRIu64 " on worker %s: %s", sl_task_id(wt->task),
                           wc->w->address, err);
    }
    return rc != SL_HELD_NEW;
}

/* A coordinated read's batch outside the task's rounds (a stand-in's, or
 * one in place of a batch the client a consumer replaces took): the task's
 * next batch, which its rounds, holding the buffer for this very consumer,
 * must not keep from it (sl_task_take_extra()). */
static int take_outside_rounds(struct wtask *wt, sl_wire_batch_t **b)
{
    int rc = sl_task_take_extra(wt->task, b);
    if (rc == SL_TASK_BATCH)
        sl_metric_add(m_stand_in, 1);
    return rc;
}

/* Answers one GET_ELEMENT. @return false when it must wait for a batch */
static bool answer_element(sl_worker_t *w, struct wconn *wc, uint32_t request_id, uint64_t task_id,
                           const struct parked *how)
{
    struct wtask *wt = find_task(w, task_id);
    if (!wt) {
        const struct tombstone *tb = how->tomb_ok ? find_tombstone(w, task_id) : NULL;
        if (tb && tb->done) {
            sluice_GetElementResponse end = {.task_id = task_id, .end_of_sequence = true};
            sl_conn_send(wc->conn, SL_MSG_GET_ELEMENT_RESP, request_id, &end, NULL, 0, NULL, NULL);
        } else if (tb) {
            sl_conn_send_error(wc->conn, request_id, SL_ECANCELLED, "task %" PRIu64 " was cancelled", task_id);
        } else {
            task_unknown(wc, request_id, task_id);
            /* Likely a new job's task, which its client heard of first: ask
             * the dispatcher now rather than at the next tick, so that a
             * job's first batch does not wait for the heartbeat interval.
             * One heartbeat is in flight at a time, whatever clients ask. */
            heartbeat_now(w);
        }
        return true;
    }
    sl_wire_batch_t *b = NULL;
    int rc;
    if (how->coordinated != (wt->rounds != NULL)) {
        sl_conn_send_error(wc->conn, request_id, SL_EINVAL, "task %" PRIu64 " on worker %s %s", task_id, w->address,
                           wt->rounds ? "serves coordinated reads: the request names no round"
                                      : "does not serve coordinated reads");
        return true;
    }
    if (wt->rounds && how->stand_in) {
        rc = take_outside_rounds(wt, &b);
    } else if (wt->rounds) {
        char err[256];
        rc = sl_rounds_take(wt->rounds, wt->task, how->round, how->consumer, &b, err, sizeof err);
        if (rc == SL_ROUNDS_TAKEN && how->take_over &&
            !(how->seq > 0 && sl_holders_find(wt->holders, how->client_id, how->seq))) {
            /* Taken by the client this one came in place of, whose batch
             * went with it: the task's next batch instead. */
            rc = take_outside_rounds(wt, &b);
        } else if (rc == SL_ROUNDS_TAKEN) {
            round_taken(wc, request_id, wt, how, err);
            return true;
        }
        if (rc == SL_EINVAL) {
            sl_conn_send_error(wc->conn, request_id, rc, "task %" PRIu64 " on worker %s: %s", task_id, w->address,
                               err);
            return true;
        }
    } else if (how->twin && twin_answered(wc, request_id, wt, how)) {
        return true;
    } else {
        rc = sl_task_take(wt->task, &b);
    }
    if (rc == SL_TASK_PENDING)
        return false;
    if (rc == SL_TASK_BATCH) {
        send_batch(wc, request_id, wt, b, how);
    } else if (rc == SL_TASK_END) {
        /* The end carries every notice that is left, as the payload. */
        sluice_GetElementResponse end = {.task_id = task_id, .end_of_sequence = true};
        uint8_t *notices = NULL;
        size_t notices_len = 0, no_tally;
        if (fill_done(wt->task, NULL, true, false, NULL, 0, &notices, &notices_len, &no_tally, &end.done_below) < 0) {
            sl_conn_send_error(wc->conn, request_id, -ENOMEM,
                               "worker %s is out of memory for the split-done notices of task %" PRIu64, w->address,
                               task_id);
            return true;
        }
        end.notices_length = notices_len;
        sl_conn_send(wc->conn, SL_MSG_GET_ELEMENT_RESP, request_id, &end, notices, notices_len, NULL, NULL);
        free(notices);
    } else {
        sl_conn_send_error(wc->conn, request_id, rc, "task %" PRIu64 " on worker %s failed: %s", task_id, w->address,
                           sl_task_errmsg(wt->task));
    }
    return true;
}

/* Unlinks *p, a request parked on wt, and frees it. */
static void unpark(struct wtask *wt, struct parked **p)
{
    struct parked *pk = *p;
    *p = pk->next;
    if (wt->parked_tail == &pk->next)
        wt->parked_tail = p;
    wt->num_parked--;
    wt->parked_stand_ins -= pk->stand_in;
    pk->wc->parked--;
    free(pk);
}

static void serve_parked(sl_worker_t *w, struct wtask *wt)
{
    uint64_t id = sl_task_id(wt->task);
    /* Stand-ins first: a batch made past a full buffer for one
     * (sl_task_take_extra()) is its, not that of a round that waits on its
     * consumers. */
    for (int pass = wt->parked_stand_ins > 0 ? 0 : 1; pass < 2; pass++) {
        for (struct parked **p = &wt->parked; *p;) {
            struct parked *pk = *p;
            /* A dropped task answers from its tombstone. A round of a
             * coordinated read may wait on another consumer's request behind
             * it, so the ones behind are tried too. */
            if ((pass == 0 && !pk->stand_in) || !answer_element(w, pk->wc, pk->request_id, id, pk)) {
                if (pk->coordinated) {
                    p = &pk->next;
                    continue;
                }
                break; /* none ready: the ones behind wait too, in order */
            }
            sl_metric_observe(m_client_wait, (double)(now_us() - pk->since_us) / 1e6);
            unpark(wt, p);
        }
    }
}

/* A request's shared-memory fields (shm.h): a region made and offered to a
 * client that asks for one, the slots it gives back. A client that says it
 * mapped a region it did not collect, or gives back slots it was not lent,
 * breaks the protocol. @return false when the connection failed */
static bool shm_request(struct wconn *wc, const sluice_GetElementRequest *req)
{
    char err[256];
    if (req->shm && !wc->shm && !wc->shm_none && wc->w->lane) {
        wc->shm = sl_shm_region_new(wc->w->lane, err, sizeof err);
        wc->shm_offer = wc->shm != NULL;
        wc->shm_none = wc->shm == NULL; /* asked once per connection */
        if (!wc->shm)
            sl_log_debug("%s: batches go over TCP: %s", sl_conn_peer(wc->conn), err);
    }
    if (req->shm_mapped && !wc->shm_mapped) {
        if (!wc->shm || !sl_shm_region_collected(wc->shm)) {
            sl_conn_fail(wc->conn, SL_EPROTO, "shm_mapped: no shared-memory region was collected on this connection");
            return false;
        }
        wc->shm_mapped = true;
    }
    wc->shm_tail_answer |= req->shm_tail_in_answer;
    if (req->shm_released && (!wc->shm || sl_shm_region_released(wc->shm, req->shm_released, err, sizeof err) < 0)) {
        sl_conn_fail(wc->conn, SL_EPROTO, "%s",
                     wc->shm ? err : "shm_released: no shared-memory region on this connection");
        return false;
    }
    return true;
}

/* Whether the dispatcher answered a heartbeat sent since the session
 * registered: that answer removed every task kept from before that the
 * dispatcher does not know as ours (after its state was restored from a
 * backup it gives the lost state's ids out again: a new job's task of the
 * id of one kept here comes in that answer, or the next). */
static bool tasks_vouched(const sl_worker_t *w)
{
    return w->heartbeats_answered >= w->vouch_from;
}

enum key_verdict {
    KEY_OK,        /* the client's key, or no task of the id here to check it against */
    KEY_REFUSED,   /* not the client's key: answered SL_EPERM */
    KEY_UNVOUCHED, /* not the key to a task kept from before the session: ask the dispatcher first */
};

/* Refuses a GET_ELEMENT whose key is not its client's to the task here. */
static void refuse_key(struct wconn *wc, uint32_t request_id, const sluice_GetElementRequest *req)
{
    sl_metric_add(m_forbidden, 1);
    sl_conn_send_error(wc->conn, request_id, SL_EPERM,
                       "task %" PRIu64 " on worker %s: task_key is not client %" PRIu64
                       "'s key to the task (TaskInfo.task_key); nothing served",
                       req->task_id, wc->w->address, req->client_id);
}

/* The client's key to the task, which only the dispatcher hands out (to
 * each of the task's job's clients its own, taskkey.h): a task id is no
 * capability, and the client_id, which picks the batches held for it and
 * what it acknowledges, is the sender's. A task this worker does not have
 * (yet) has no key to check: such a request waits for the task
 * (await_task()) and is checked then, or answers SL_ENOTFOUND, as before
 * the worker registered, when it has none. With may_wait, a key that is
 * not the client's to a task not vouched for since the session registered
 * is KEY_UNVOUCHED, not refused: it may be a new job's key to the task of
 * that id the dispatcher's answer brings in its place (tasks_vouched()). */
static enum key_verdict key_ok(struct wconn *wc, uint32_t request_id, const sluice_GetElementRequest *req,
                               bool may_wait)
{
    sl_worker_t *w = wc->w;
    /* A tombstone's key is checked by tombstone_of(). */
    const struct wtask *kt = find_task(w, req->task_id);
    if (kt && !sl_task_key_check(wc->proofs, req->task_id, req->client_id, kt->key, kt->client_keys,
                                 req->task_key)) {
        if (may_wait && !tasks_vouched(w))
            return KEY_UNVOUCHED;
        refuse_key(wc, request_id, req);
        return KEY_REFUSED;
    }
    return KEY_OK;
}

static bool await_task(struct wconn *wc, uint32_t request_id, const sluice_GetElementRequest *req);
static void give_up_awaiting(struct wconn *wc, uint64_t task_id);

/* Serves one GET_ELEMENT whose key was checked if its task is here, once
 * the connection took its connection-wide fields (client_frame()). */
static void serve_request(struct wconn *wc, uint32_t request_id, const sluice_GetElementRequest *req)
{
    sl_worker_t *w = wc->w;
    sl_conn_t *c = wc->conn;
    struct wtask *ht = find_task(w, req->task_id);
    const struct tombstone *tb = ht ? NULL : tombstone_of(wc, req);
    bool here = ht != NULL, buried = tb != NULL;
    if (!here && !buried) {
        if (await_task(wc, request_id, req))
            return;
        /* It cannot wait (the bounds): those before it on its connection
         * are answered first, so that answers keep the requests' order,
         * which the client's redelivery counts on. */
        give_up_awaiting(wc, req->task_id);
    }
    struct parked how = {.coordinated = req->coordinated, .stand_in = req->coordinated && req->stand_in,
                         .take_over = req->coordinated && req->take_over,
                         .round = req->round, .consumer = req->consumer_index,
                         .client_id = req->client_id, .seq = req->seq,
                         .tomb_ok = here || buried};
    if (ht && wc->shm_mapped)
        sl_task_lend_region(ht->task, wc->shm, req->client_id, req->coordinated ? (int64_t)req->consumer_index : -1);
    /* A finished task taken away keeps what its clients have not
     * acknowledged in its tombstone. */
    sl_holders_t *holders = ht ? ht->holders : tb ? tb->holders : NULL;
    if (holders && how.seq > 0) {
        /* A request asked again after its connection broke gets the batch it
         * was served; what the client acknowledged is let go (held.h). */
        sl_served_t *again;
        char err[512];
        int64_t now = now_us() / 1000;
        int rc = req->coordinated ? sl_holders_ask_round(holders, req->client_id, req->seq, req->acked_below, now,
                                                         &again, err, sizeof err)
                                  : sl_holders_ask(holders, req->client_id, req->seq, req->acked_below, now, &again,
                                                   err, sizeof err);
        if (rc == SL_HELD_AGAIN) {
            send_again(wc, request_id, again);
            return;
        }
        if (rc < 0) {
            sl_conn_send_error(c, request_id, rc, "task %" PRIu64 " on worker %s: %s", req->task_id, w->address,
                               err);
            return;
        }
        if (ht)
            acknowledged(ht);
    }
    /* Requests of one task are answered in order: a new one waits behind
     * those already parked. */
    bool behind = ht && ht->parked && !req->coordinated;
    for (struct parked *pk = behind && how.seq > 0 ? ht->parked : NULL; pk && !how.twin; pk = pk->next)
        how.twin = pk->client_id == how.client_id && pk->seq == how.seq;
    if (!behind && answer_element(w, wc, request_id, req->task_id, &how))
        return;
    if (!ht) { /* answered above: only a task here makes a request wait */
        sl_conn_send_error(c, request_id, SL_EINTERNAL, "task %" PRIu64 " is gone", req->task_id);
        return;
    }
    if (wc->parked >= MAX_PARKED_PER_CONN) {
        sl_conn_send_error(c, request_id, SL_ETOOBIG, "more than %d requests waiting on one connection",
                           MAX_PARKED_PER_CONN);
        return;
    }
    struct parked *pk = calloc(1, sizeof *pk);
    if (!pk) {
        sl_conn_send_error(c, request_id, -ENOMEM, "worker out of memory");
        return;
    }
    *pk = how;
    pk->wc = wc;
    pk->request_id = request_id;
    pk->since_us = now_us();
    *ht->parked_tail = pk;
    ht->parked_tail = &pk->next;
    ht->num_parked++;
    ht->parked_stand_ins += pk->stand_in;
    wc->parked++;
}

/* An ack-only request (a client leaving the task): what it received is
 * let go, of a task here or of a finished task's tombstone. */
static void acknowledge(struct wconn *wc, const sluice_GetElementRequest *req)
{
    struct wtask *wt = find_task(wc->w, req->task_id);
    const struct tombstone *tb = wt ? NULL : tombstone_of(wc, req);
    sl_holders_t *holders = wt ? wt->holders : tb ? tb->holders : NULL;
    if (holders)
        sl_holders_ack(holders, req->client_id, req->acked_below);
    if (wt)
        acknowledged(wt);
}

/* GetElementRequest.progress: how far the task's splits are done, with
 * every notice that is ready, at once and without a batch. Written after
 * every batch this connection was sent, so the client that reads it has
 * its share of each split below done_below (docs/fault-tolerance.md). A
 * task this worker does not hold (not yet: the client heard of it first;
 * or no more), or whose key it cannot check yet (!known), gets an answer
 * that says nothing (done_below 0): the client asks again later, where
 * before it waited for an answer that never came and asked no more. */
static void answer_progress(struct wconn *wc, uint32_t request_id, uint64_t task_id, bool known)
{
    struct wtask *wt = known ? find_task(wc->w, task_id) : NULL;
    sluice_GetElementResponse resp = {.task_id = task_id};
    if (!wt) {
        sl_conn_send(wc->conn, SL_MSG_GET_ELEMENT_RESP, request_id, &resp, NULL, 0, NULL, NULL);
        return;
    }
    uint8_t *notices = NULL;
    size_t notices_len = 0, no_tally;
    if (fill_done(wt->task, NULL, false, false, NULL, 0, &notices, &notices_len, &no_tally, &resp.done_below) < 0) {
        sl_conn_send_error(wc->conn, request_id, -ENOMEM,
                           "worker %s is out of memory for the split-done notices of task %" PRIu64, wc->w->address,
                           task_id);
        return;
    }
    resp.notices_length = notices_len;
    sl_conn_send(wc->conn, SL_MSG_GET_ELEMENT_RESP, request_id, &resp, notices, notices_len, NULL, NULL);
    free(notices);
}

/* GetElementRequest.leave: the client of this connection leaves task_id.
 * Its requests for the task that wait, for a batch or for the task, are
 * dropped unanswered, so that no batch follows the answer, which says so
 * (GetElementResponse.left) also when the task is not here: the client
 * then holds every batch it will get, and gives back those its caller was
 * not given (docs/fault-tolerance.md, "A rank that leaves"). */
static void answer_leave(struct wconn *wc, uint32_t request_id, uint64_t task_id)
{
    sl_worker_t *w = wc->w;
    for (struct awaiting **p = &w->awaiting; *p;) {
        struct awaiting *a = *p;
        if (a->wc == wc && a->req.task_id == task_id) {
            *p = a->next;
            w->num_awaiting--;
            wc->parked--;
            free(a);
        } else {
            p = &a->next;
        }
    }
    struct wtask *wt = find_task(w, task_id);
    for (struct parked **p = wt ? &wt->parked : NULL; p && *p;) {
        if ((*p)->wc == wc)
            unpark(wt, p);
        else
            p = &(*p)->next;
    }
    /* No split-done notice goes with it: notices go to the clients that
     * stay, whose ledgers close their splits with them. */
    sluice_GetElementResponse resp = {.task_id = task_id, .left = true};
    sl_conn_send(wc->conn, SL_MSG_GET_ELEMENT_RESP, request_id, &resp, NULL, 0, NULL, NULL);
}

static void client_frame(sl_conn_t *c, const sl_frame_hdr_t *hdr, void *msg, uint8_t *payload, void *arg)
{
    struct wconn *wc = arg;
    free(payload);
    if (hdr->type != SL_MSG_GET_ELEMENT_REQ) {
        sl_conn_fail(c, SL_EPROTO, "a worker does not serve %s", sl_msg_name(hdr->type));
        return;
    }
    const sluice_GetElementRequest *req = msg;
    enum key_verdict v = key_ok(wc, hdr->request_id, req, true);
    if (v == KEY_REFUSED)
        return;
    if (req->ack_only) {
        if (v == KEY_OK)
            acknowledge(wc, req);
        if (req->leave && req->progress)
            answer_leave(wc, hdr->request_id, req->task_id); /* its own requests only: no key needed */
        else if (req->progress)
            answer_progress(wc, hdr->request_id, req->task_id, v == KEY_OK);
        return; /* else answered by nothing */
    }
    wc->provenance = req->provenance;
    wc->tallies = req->tallies;
    wc->dense = req->dense_provenance;
    if (!shm_request(wc, req))
        return;
    if (v == KEY_UNVOUCHED) {
        /* Checked again once the dispatcher answered (answer_ready()), or
         * refused now when it cannot wait. */
        if (!await_task(wc, hdr->request_id, req))
            refuse_key(wc, hdr->request_id, req);
        return;
    }
    serve_request(wc, hdr->request_id, req);
}

/* Parks a request for a task this worker does not have (struct awaiting)
 * and asks the dispatcher now. @return false when it cannot wait: no
 * dispatcher session, or the bounds are reached */
static bool await_task(struct wconn *wc, uint32_t request_id, const sluice_GetElementRequest *req)
{
    sl_worker_t *w = wc->w;
    if (w->session != SESSION_REGISTERED || w->num_awaiting >= MAX_AWAITING || wc->parked >= MAX_PARKED_PER_CONN)
        return false;
    struct awaiting *a = calloc(1, sizeof *a);
    if (!a)
        return false;
    a->wc = wc;
    a->request_id = request_id;
    a->req = *req;
    a->heartbeat = w->heartbeats_sent + 1; /* the next one sent: heartbeat_now() */
    a->since_ms = now_us() / 1000;
    struct awaiting **tail = &w->awaiting;
    while (*tail)
        tail = &(*tail)->next;
    *tail = a;
    w->num_awaiting++;
    wc->parked++;
    sl_metric_add(m_awaited, 1);
    heartbeat_now(w);
    return true;
}

/* Answers the waiting requests marked ready, in order of arrival: served
 * when their task is here, else SL_ENOTFOUND. One at a time from the head:
 * an answer may close a connection (a send's releases), whose requests
 * then leave the list. */
static void answer_ready(sl_worker_t *w)
{
    for (;;) {
        struct awaiting **p = &w->awaiting;
        while (*p && !(*p)->ready)
            p = &(*p)->next;
        struct awaiting *a = *p;
        if (!a)
            return;
        *p = a->next;
        w->num_awaiting--;
        a->wc->parked--;
        uint64_t id = a->req.task_id;
        if (!find_task(w, id) && !tombstone_of(a->wc, &a->req))
            task_unknown(a->wc, a->request_id, id);
        else if (key_ok(a->wc, a->request_id, &a->req, false) == KEY_OK)
            serve_request(a->wc, a->request_id, &a->req);
        free(a);
    }
}

/* The requests that waited for their task: served once it started (and,
 * for a task of that id kept from before the session, once the dispatcher
 * vouched for it or replaced it: tasks_vouched()); SL_ENOTFOUND once the
 * answer to their heartbeat came without it (and no start of it is under
 * way), after cfg.await_task_ms, or, with give_up, now (no dispatcher to ask). */
static void resolve_awaiting(sl_worker_t *w, bool give_up)
{
    int64_t now = now_us() / 1000;
    bool vouched = tasks_vouched(w);
    for (struct awaiting *a = w->awaiting; a; a = a->next)
        a->ready = give_up || now - a->since_ms >= w->cfg.await_task_ms ||
                   (vouched && (find_task(w, a->req.task_id) ||
                                (w->heartbeats_answered >= a->heartbeat && !starting(w, a->req.task_id))));
    answer_ready(w);
}

/* The requests of wc that wait for task_id, answered now. */
static void give_up_awaiting(struct wconn *wc, uint64_t task_id)
{
    bool any = false;
    for (struct awaiting *a = wc->w->awaiting; a; a = a->next) {
        a->ready = a->wc == wc && a->req.task_id == task_id;
        any |= a->ready;
    }
    if (any)
        answer_ready(wc->w);
}

static void wconn_free(struct wconn *wc)
{
    sl_worker_t *w = wc->w;
    for (struct awaiting **p = &w->awaiting; *p;) {
        struct awaiting *a = *p;
        if (a->wc == wc) {
            *p = a->next;
            w->num_awaiting--;
            free(a);
        } else {
            p = &a->next;
        }
    }
    for (struct wtask *wt = w->tasks; wt && wc->parked > 0; wt = wt->next)
        for (struct parked **p = &wt->parked; *p;) {
            if ((*p)->wc == wc)
                unpark(wt, p);
            else
                p = &(*p)->next;
        }
    if (wc->prev)
        wc->prev->next = wc->next;
    else
        w->conns = wc->next;
    if (wc->next)
        wc->next->prev = wc->prev;
    if (wc->shm)
        for (struct wtask *wt = w->tasks; wt; wt = wt->next)
            sl_task_unlend_region(wt->task, wc->shm);
    sl_shm_region_free(wc->shm);
    free(wc);
}

static void client_close(sl_conn_t *c, int err, const char *why, void *arg)
{
    (void)c;
    sl_log_debug("client connection closed (%s): %s", sl_strerror(err), why);
    wconn_free(arg);
}

static const sl_conn_cbs_t client_cbs = {NULL, client_frame, client_close};

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen, void *arg)
{
    sl_worker_t *w = arg;
    (void)l;
    (void)sa;
    (void)salen;
    struct wconn *wc = calloc(1, sizeof *wc);
    if (!wc) {
        evutil_closesocket(fd);
        return;
    }
    sl_limits_t limits = {.max_payload = 0}; /* clients send no payloads */
    wc->w = w;
    wc->conn = sl_conn_accept(w->base, fd, w->cfg.env, SL_ROLE_WORKER, 1u << SL_ROLE_CLIENT, &limits, &client_cbs, wc);
    if (!wc->conn) {
        free(wc);
        return;
    }
    /* The answers of one pass of the loop (the requests one read brought,
     * the batches a notify found ready) go out in one system call. */
    sl_conn_set_gather(wc->conn, true);
    wc->next = w->conns;
    if (w->conns)
        w->conns->prev = wc;
    w->conns = wc;
}

/* ---- the dispatcher session ---- */

static void send_heartbeat(sl_worker_t *w)
{
    if (w->session != SESSION_REGISTERED || w->heartbeat_out)
        return;
    sluice_WorkerHeartbeatRequest *req = calloc(1, sizeof *req);
    struct outstanding *o = req ? expect_answer(w, SL_MSG_WORKER_HEARTBEAT_REQ) : NULL;
    if (!o) {
        free(req);
        return;
    }
    req->worker_id = w->worker_id;
    for (struct wtask *wt = w->tasks; wt && req->tasks_count < 64; wt = wt->next) {
        if (wt->rounds)
            sl_task_set_unfilled(wt->task, sl_rounds_unfilled(wt->rounds));
        sl_task_status(wt->task, &req->tasks[req->tasks_count]);
        wt->last_state = (int)req->tasks[req->tasks_count].state;
        req->tasks_count++;
    }
    w->heartbeat_out = true;
    w->heartbeats_sent++;
    w->heartbeat_sent_ms = (now_us() / 1000);
    w->heartbeat_soon = false;
    send_request(w, o, req);
    free(req);
}

static void disp_close(sl_conn_t *c, int err, const char *why, void *arg);

/* A heartbeat now, not at the next tick; right after the answer when one
 * is in flight (one at a time). */
static void heartbeat_now(sl_worker_t *w)
{
    if (w->heartbeat_out)
        w->heartbeat_soon = true;
    else
        send_heartbeat(w);
}

static void on_heartbeat_timer(evutil_socket_t fd, short what, void *arg)
{
    sl_worker_t *w = arg;
    (void)fd;
    (void)what;
    int64_t answer_ms = sl_conn_answer_deadline_ms((uint32_t)w->cfg.heartbeat_ms);
    int64_t waited = (now_us() / 1000) - w->heartbeat_sent_ms;
    if (w->heartbeat_out && w->disp && waited > answer_ms) {
        char why[128];
        snprintf(why, sizeof why, "no heartbeat answer for %" PRId64 " ms", waited);
        sl_conn_t *c = w->disp;
        disp_close(c, -ETIMEDOUT, why, w); /* resets the session and schedules a reconnect */
        if (w->old_disp)
            sl_conn_close(w->old_disp);
        w->old_disp = c; /* closed once a new connection registered */
        return;
    }
    send_heartbeat(w);
    /* A task's pipeline that waits for splits asks through the loop: after
     * each split taken, and when the queue runs dry, after an answer, after
     * a retry's wait. Should one of those wake-ups ever be lost, the tick
     * asks, and says so: a LongRun hang had a task wait for ever with no
     * request out. */
    for (struct wtask *wt = w->tasks; wt; wt = wt->next) {
        double waited = sl_task_split_wait_unasked(wt->task);
        if (waited * 1000 > 2.0 * w->cfg.heartbeat_ms)
            sl_log_warn("task %" PRIu64 ": its pipeline waited %.2f s for splits with none asked for; asking now",
                        sl_task_id(wt->task), waited);
        fetch_splits(w, wt);
    }
}

static void send_register(sl_worker_t *w)
{
    struct outstanding *o = expect_answer(w, SL_MSG_WORKER_REGISTER_REQ);
    if (!o)
        return;
    sluice_WorkerRegisterRequest req = sluice_WorkerRegisterRequest_init_zero;
    snprintf(req.address, sizeof req.address, "%s", w->address);
    req.admin_port = w->cfg.admin_port;
    req.worker_id = w->worker_id; /* 0 at first; the id to resume with after a reconnect */
    memcpy(req.worker_secret, w->worker_secret, sizeof req.worker_secret);
    req.client_keys = true; /* sl_task_key_check() takes each client's own key */
    req.takes_notices = true; /* disp_frame() heartbeats at a WORKER_NOTICE */
    session_set_state(w, SESSION_REGISTERING);
    send_request(w, o, &req);
}

static void on_heartbeat_answer(sl_worker_t *w, const sluice_WorkerHeartbeatResponse *resp)
{
    for (pb_size_t i = 0; i < resp->removed_tasks_count; i++)
        drop_task(w, resp->removed_tasks[i]);
    for (pb_size_t i = 0; i < resp->new_tasks_count; i++) {
        const sluice_TaskDef *def = &resp->new_tasks[i];
        if (find_task(w, def->task_id) || starting(w, def->task_id))
            continue;
        bury_no_more(w, def->task_id);
        if (w->num_tasks >= w->cfg.max_tasks) {
            sl_log_warn("task %" PRIu64 " not started: %u tasks is this worker's limit", def->task_id,
                        w->cfg.max_tasks);
            continue;
        }
        struct outstanding *o = expect_answer(w, SL_MSG_GET_DATASET_REQ);
        if (!o)
            continue;
        o->def = *def;
        sluice_GetDatasetRequest req = {.dataset_id = def->dataset_id};
        send_request(w, o, &req);
    }
}

/* A task of a restored iterator's job under a static policy: its spec is
 * here; the positions its pipeline must skip come next. */
static void fetch_exclusions(sl_worker_t *w, const sluice_TaskDef *def, const char *spec, size_t len)
{
    char *copy = malloc(len ? len : 1);
    struct outstanding *o = copy ? expect_answer(w, SL_MSG_GET_EXCLUSIONS_REQ) : NULL;
    if (!o) {
        free(copy);
        sl_log_error("task %" PRIu64 ": out of memory", def->task_id);
        return; /* asked again: the heartbeat still lists the task */
    }
    memcpy(copy, spec, len);
    o->def = *def;
    o->spec = copy;
    o->spec_len = len;
    sluice_GetExclusionsRequest req = {.job_id = def->job_id};
    send_request(w, o, &req);
}

static void disp_frame(sl_conn_t *c, const sl_frame_hdr_t *hdr, void *msg, uint8_t *payload, void *arg)
{
    sl_worker_t *w = arg;
    (void)msg;
    if (c != w->disp) { /* the connection given up on: late answers */
        free(payload);
        return;
    }
    if (hdr->type == SL_MSG_WORKER_NOTICE) {
        /* Unasked: a task was added for us. Heard at once, the task starts
         * while its clients connect, not when the first of them names it. */
        free(payload);
        if (hdr->request_id != 0) {
            sl_conn_fail(c, SL_EPROTO, "WORKER_NOTICE with request id %u (a notice answers nothing)",
                         hdr->request_id);
            return;
        }
        sl_metric_add(m_notices, 1);
        heartbeat_now(w);
        return;
    }
    struct outstanding *o = take_answer(w, hdr->request_id);
    if (!o) {
        free(payload);
        sl_conn_fail(c, SL_EPROTO, "answer %s to no request of ours (id %u)", sl_msg_name(hdr->type),
                     hdr->request_id);
        return;
    }
    const sluice_Error *e = hdr->type == SL_MSG_ERROR ? msg : NULL;
    /* Every request type is followed by its response type. */
    if (!e && hdr->type != o->type + 1) {
        free(payload);
        sl_conn_fail(c, SL_EPROTO, "answer %s to %s", sl_msg_name(hdr->type), sl_msg_name(o->type));
        free(o->spec);
        free(o);
        return;
    }
    switch (o->type) {
    case SL_MSG_WORKER_REGISTER_REQ:
        if (e) {
            sl_log_error("dispatcher refused registration: %s (retrying)", e->message);
            event_add(w->retry_register, &(struct timeval){0, RECONNECT_MS * 1000});
            break;
        }
        uint64_t prev = w->worker_id;
        const sluice_WorkerRegisterResponse *reg = msg;
        bool resumed =
            prev == reg->worker_id && memcmp(w->worker_secret, reg->worker_secret, sizeof w->worker_secret) == 0;
        if (!resumed)
            forget_registration(w);
        w->worker_id = reg->worker_id;
        memcpy(w->worker_secret, reg->worker_secret, sizeof w->worker_secret);
        if (reg->heartbeat_ms)
            w->cfg.heartbeat_ms = (int)reg->heartbeat_ms;
        session_set_state(w, SESSION_REGISTERED);
        if (w->old_disp) {
            /* The dispatcher took our id over the new connection. */
            sl_conn_close(w->old_disp);
            w->old_disp = NULL;
        }
        if (resumed)
            sl_log_info("reconnected to dispatcher %s as worker %" PRIu64 ", keeping its tasks", w->dispatcher,
                        w->worker_id);
        else
            sl_log_info("registered with dispatcher %s as worker %" PRIu64 " at %s", w->dispatcher, w->worker_id,
                        w->address);
        struct timeval tv = {w->cfg.heartbeat_ms / 1000, (w->cfg.heartbeat_ms % 1000) * 1000};
        event_add(w->heartbeat_timer, &tv);
        w->vouch_from = w->heartbeats_sent + 1; /* the one sent next, here or once one in flight is answered */
        send_heartbeat(w);
        /* Split requests that the lost connection failed are asked again
         * (with the same request_seq, see task.h). */
        for (struct wtask *wt = w->tasks; wt; wt = wt->next)
            fetch_splits(w, wt);
        break;
    case SL_MSG_WORKER_HEARTBEAT_REQ:
        w->heartbeat_out = false;
        w->heartbeats_answered = w->heartbeats_sent;
        if (e && e->code == SL_ENOTFOUND) {
            sl_log_warn("dispatcher forgot this worker (%s): registering again", e->message);
            send_register(w);
        } else if (e) {
            sl_log_warn("heartbeat refused: %s", e->message);
        } else {
            on_heartbeat_answer(w, msg);
        }
        if (w->heartbeat_soon)
            send_heartbeat(w);
        resolve_awaiting(w, false);
        break;
    case SL_MSG_GET_DATASET_REQ:
        if (e)
            sl_log_error("task %" PRIu64 ": dataset %" PRIu64 " unavailable: %s", o->def.task_id,
                         o->def.dataset_id, e->message);
        else if (o->def.exclusions)
            fetch_exclusions(w, &o->def, (const char *)payload, hdr->payload_len);
        else
            start_task(w, &o->def, (const char *)payload, hdr->payload_len, NULL, 0);
        resolve_awaiting(w, false);
        break;
    case SL_MSG_GET_EXCLUSIONS_REQ:
        if (e)
            sl_log_error("task %" PRIu64 ": the excluded positions of job %" PRIu64 " are unavailable: %s",
                         o->def.task_id, o->def.job_id, e->message);
        else
            start_task(w, &o->def, o->spec, o->spec_len, payload, hdr->payload_len);
        free(o->spec);
        resolve_awaiting(w, false);
        break;
    case SL_MSG_GET_SPLIT_REQ: {
        struct wtask *wt = find_task(w, o->task_id);
        if (wt) {
            if (e)
                sl_task_splits_failed(wt->task, false, e->code < 0 ? e->code : SL_EREMOTE, e->message);
            else
                sl_task_splits_arrived_payload(wt->task, msg, payload, hdr->payload_len);
            fetch_splits(w, wt);
        }
        break;
    }
    default:
        break;
    }
    free(o);
    free(payload);
}

static void session_reset(sl_worker_t *w)
{
    while (w->outstanding) {
        struct outstanding *o = w->outstanding;
        w->outstanding = o->next;
        if (o->type == SL_MSG_GET_SPLIT_REQ) {
            struct wtask *wt = find_task(w, o->task_id);
            if (wt)
                sl_task_splits_failed(wt->task, true, SL_ECLOSED, "dispatcher connection lost");
        }
        free(o->spec);
        free(o);
    }
    w->heartbeat_out = false;
    if (w->heartbeat_timer) /* NULL when sl_worker_start() failed before making it */
        event_del(w->heartbeat_timer);
    w->disp = NULL;
    session_set_state(w, SESSION_DISCONNECTED);
    resolve_awaiting(w, true);
}

/* The next connect to the dispatcher in RECONNECT_MS, give or take half of
 * it: the workers of a fleet that lost their dispatcher (a restart, a cut)
 * do not all come back in step. */
static void reconnect_later(sl_worker_t *w)
{
    int64_t ms = sl_rng_jitter_ms(&w->jitter, RECONNECT_MS);
    struct timeval tv = {ms / 1000, (suseconds_t)(ms % 1000) * 1000};
    event_add(w->reconnect_timer, &tv);
}

static void disp_close(sl_conn_t *c, int err, const char *why, void *arg)
{
    sl_worker_t *w = arg;
    if (c == w->old_disp) {
        w->old_disp = NULL;
        return;
    }
    if (w->session == SESSION_CONNECTING)
        sl_log_warn("cannot reach dispatcher %s (%s): retrying", w->dispatcher, why);
    else
        sl_log_warn("dispatcher connection lost (%s: %s): reconnecting", sl_strerror(err), why);
    session_reset(w);
    reconnect_later(w);
}

static void disp_ready(sl_conn_t *c, void *arg)
{
    sl_worker_t *w = arg;
    if (!w->cfg.address) {
        /* Clients reach us at the interface that reaches the dispatcher. */
        char host[64];
        if (sl_conn_local_host(c, host, sizeof host) == 0)
            snprintf(w->address, sizeof w->address, strchr(host, ':') ? "[%s]:%u" : "%s:%u", host, w->port);
    }
    send_register(w);
}

static const sl_conn_cbs_t disp_cbs = {disp_ready, disp_frame, disp_close};

/* The dispatcher's address, looked up off the loop (resolve.h): with DNS
 * down the worker keeps serving what it has while it waits. */
static void session_connect(sl_worker_t *w)
{
    session_set_state(w, SESSION_CONNECTING);
    if (sl_resolver_start(w->resolver, w->dispatcher) < 0) {
        sl_log_warn("cannot look up dispatcher %s: out of memory", w->dispatcher);
        session_set_state(w, SESSION_DISCONNECTED);
        reconnect_later(w);
    }
}

static void disp_resolved(int rc, const struct sockaddr_storage *ss, socklen_t sslen, const char *why, void *arg)
{
    sl_worker_t *w = arg;
    char err[512];
    if (w->session != SESSION_CONNECTING || w->disp)
        return;
    if (rc == 0) {
        /* A dataset spec, or a restored job's excluded positions. */
        sl_limits_t limits = {.max_payload = (uint32_t)(SL_POSBITS_MAX_BYTES(SL_TASK_MAX_EXCLUDE_RUNS) + 1024)};
        rc = sl_conn_connect_to(w->base, w->dispatcher, ss, sslen, w->cfg.env, SL_ROLE_WORKER, SL_ROLE_DISPATCHER,
                                &limits, w->cfg.connect_timeout_ms, &disp_cbs, w, &w->disp, err, sizeof err);
        why = err;
    }
    if (rc < 0) {
        sl_log_warn("cannot connect to dispatcher: %s", why);
        w->disp = NULL;
        session_set_state(w, SESSION_DISCONNECTED);
        reconnect_later(w);
        return;
    }
    sl_conn_cap_connect(w->disp, SL_CONN_SYN_MS); /* a new SYN soon after a heal */
}

static void on_retry_register(evutil_socket_t fd, short what, void *arg)
{
    sl_worker_t *w = arg;
    (void)fd;
    (void)what;
    if (w->session == SESSION_REGISTERING && w->disp)
        send_register(w);
}

static void on_reconnect_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    session_connect(arg);
}

/* ---- life cycle ---- */

/* Once a second: what clients silent past the hold timeout hold is let go. */
static void on_hold_timer(evutil_socket_t fd, short what, void *arg)
{
    sl_worker_t *w = arg;
    (void)fd;
    (void)what;
    int64_t now = now_us() / 1000;
    for (struct wtask *wt = w->tasks; wt; wt = wt->next)
        sl_holders_sweep(wt->holders, now, w->cfg.hold_timeout_ms);
    for (unsigned i = 0; i < TOMBSTONES; i++) {
        struct tombstone *tb = &w->tombstones[i];
        if (!tb->holders)
            continue;
        sl_holders_sweep(tb->holders, now, w->cfg.hold_timeout_ms);
        if (sl_holders_empty(tb->holders)) {
            sl_holders_free(tb->holders);
            tb->holders = NULL;
        }
    }
    resolve_awaiting(w, false); /* those past cfg.await_task_ms */
}

void sl_worker_config_init(sl_worker_config_t *cfg)
{
    *cfg = (sl_worker_config_t){
        .bind = "0.0.0.0",
        .max_tasks = 64,
        .heartbeat_ms = 250,
        .connect_timeout_ms = 5000,
        .hold_timeout_ms = 300000,
        .await_task_ms = 2000,
        .shm_region_bytes = (size_t)256 << 20,
        .task = {.buffer_bytes = 64u << 20, .buffer_batches = 16, .max_batch_bytes = 256u << 20,
                 .split_prefetch = 8, .split_target_ms = 50},
    };
}

int sl_worker_start(struct event_base *base, const sl_worker_config_t *cfg, uint16_t *bound_port,
                    sl_worker_t **out, char *err, size_t errlen)
{
    if (!m_served) {
        m_client_wait = sl_metric_register(SL_METRIC_HISTOGRAM, "sluice_worker_client_wait_seconds", NULL,
                                           "Time a batch request waited for a batch (client starvation).",
                                           sl_metric_latency_buckets, sl_metric_latency_buckets_count);
        m_served = sl_metric_register(SL_METRIC_COUNTER, "sluice_worker_batches_served_total", NULL,
                                      "Batches sent to clients.", NULL, 0);
        m_bytes_served = sl_metric_register(SL_METRIC_COUNTER, "sluice_worker_bytes_served_total", NULL,
                                            "Tensor bytes sent to clients.", NULL, 0);
        m_sent_again = sl_metric_register(SL_METRIC_COUNTER, "sluice_worker_batches_sent_again_total", NULL,
                                          "Batches held for a client and sent again: asked for again after "
                                          "the connection that carried them broke.",
                                          NULL, 0);
        m_not_held = sl_metric_register(SL_METRIC_COUNTER, "sluice_worker_batches_not_held_total", NULL,
                                        "Batches served that could not be held until their client acknowledged "
                                        "them (the memory budget had no room): they cannot be sent again.",
                                        NULL, 0);
        m_stand_in = sl_metric_register(SL_METRIC_COUNTER, "sluice_worker_stand_in_batches_total", NULL,
                                        "Coordinated reads: batches served for a round of a lost worker "
                                        "to a consumer that worker had not served it to.",
                                        NULL, 0);
        m_shm_served = sl_metric_register(SL_METRIC_COUNTER, "sluice_worker_batches_shm_total", NULL,
                                          "Batches whose bytes went to a client on this host through shared memory.",
                                          NULL, 0);
        m_shm_lent = sl_metric_register(SL_METRIC_COUNTER, "sluice_worker_batches_shm_lent_total", NULL,
                                        "Of the batches through shared memory, those made in the client's region "
                                        "to begin with: lent to it, not copied.",
                                        NULL, 0);
        m_shm_fallback = sl_metric_register(SL_METRIC_COUNTER, "sluice_worker_shm_fallbacks_total", NULL,
                                            "Batches for a client with shared memory that went over TCP: its region "
                                            "was full (the client held its slots) or the memory budget said no.",
                                            NULL, 0);
        m_notices = sl_metric_register(SL_METRIC_COUNTER, "sluice_worker_notices_total", NULL,
                                       "WORKER_NOTICE frames from the dispatcher: a new task, heard of before "
                                       "a client named it.", NULL, 0);
        m_awaited = sl_metric_register(SL_METRIC_COUNTER, "sluice_worker_requests_awaited_task_total", NULL,
                                       "GET_ELEMENT requests that came before their task and waited for the "
                                       "dispatcher to bring it.", NULL, 0);
        m_unknown = sl_metric_register(SL_METRIC_COUNTER, "sluice_worker_requests_task_unknown_total", NULL,
                                       "GET_ELEMENT requests answered SL_ENOTFOUND: their task is not on this "
                                       "worker (nor did the dispatcher bring it while they waited).", NULL, 0);
        m_forbidden = sl_metric_register(SL_METRIC_COUNTER, "sluice_worker_requests_forbidden_total", NULL,
                                         "GET_ELEMENT requests refused with SL_EPERM: their task_key was not the "
                                         "task's.", NULL, 0);
    }
    sl_worker_t *w = calloc(1, sizeof *w);
    if (!w)
        return -ENOMEM;
    w->base = base;
    w->cfg = *cfg;
    sl_rng_seed(&w->jitter, (uint64_t)now_us() ^ ((uint64_t)getpid() << 32));
    snprintf(w->dispatcher, sizeof w->dispatcher, "%s", cfg->dispatcher);
    int fd = -1;
    int rc = sl_listen_tcp(cfg->bind, cfg->port, &fd, &w->port, err, errlen);
    if (rc < 0)
        goto fail;
    w->listener = evconnlistener_new(base, on_accept, w, LEV_OPT_CLOSE_ON_FREE, -1, fd);
    if (w->listener)
        evconnlistener_set_error_cb(w->listener, sl_listener_on_error);
    w->heartbeat_timer = event_new(base, -1, EV_PERSIST, on_heartbeat_timer, w);
    w->reconnect_timer = evtimer_new(base, on_reconnect_timer, w);
    w->resolver = sl_resolver_new(base, disp_resolved, w);
    w->retry_register = evtimer_new(base, on_retry_register, w);
    w->hold_timer = event_new(base, -1, EV_PERSIST, on_hold_timer, w);
    if (cfg->shm_region_bytes) {
        char why[256];
        w->lane = sl_shm_lane_new(base, cfg->shm_region_bytes, cfg->task.mem, why, sizeof why);
        if (!w->lane)
            sl_log_warn("batches go over TCP only: %s", why);
    }
    if (!w->listener || !w->heartbeat_timer || !w->reconnect_timer || !w->retry_register || !w->hold_timer ||
        !w->resolver) {
        if (!w->listener)
            evutil_closesocket(fd);
        snprintf(err, errlen, "out of memory");
        rc = -ENOMEM;
        goto fail;
    }
    struct timeval hold_tv = {1, 0};
    event_add(w->hold_timer, &hold_tv);
    if (cfg->address)
        snprintf(w->address, sizeof w->address, "%s", cfg->address);
    else
        snprintf(w->address, sizeof w->address, "127.0.0.1:%u", w->port);
    *bound_port = w->port;
    session_connect(w);
    *out = w;
    return 0;
fail:
    sl_worker_free(w);
    return rc;
}

void sl_worker_free(sl_worker_t *w)
{
    if (!w)
        return;
    /* Connections first: their queued batches are accounted to tasks. */
    while (w->conns) {
        struct wconn *wc = w->conns;
        sl_conn_close(wc->conn);
        wconn_free(wc);
    }
    if (w->disp)
        sl_conn_close(w->disp);
    if (w->old_disp)
        sl_conn_close(w->old_disp);
    session_reset(w);
    while (w->tasks) {
        struct wtask *wt = w->tasks;
        w->tasks = wt->next;
        sl_rounds_free(wt->rounds);
        sl_holders_free(wt->holders);
        sl_task_free(wt->task);
        free(wt);
    }
    tombs_clear(w);
    if (w->heartbeat_timer)
        event_free(w->heartbeat_timer);
    if (w->hold_timer)
        event_free(w->hold_timer);
    if (w->reconnect_timer)
        event_free(w->reconnect_timer);
    sl_resolver_free(w->resolver);
    if (w->retry_register)
        event_free(w->retry_register);
    if (w->listener)
        evconnlistener_free(w->listener);
    sl_shm_lane_free(w->lane); /* after the connections, whose regions it knows */
    free(w);
}

static int cmp_u64_pair(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b;
    return x[0] != y[0] ? (x[0] > y[0]) - (x[0] < y[0]) : (x[1] > y[1]) - (x[1] < y[1]);
}

/* The requests waiting for wt, and how many of them share their client
 * and seq with another (v->requests_waiting_again). */
static void count_waiting(const struct wtask *wt, sl_worker_task_view_t *v)
{
    unsigned n = wt->num_parked, k = 0;
    v->requests_waiting = n;
    uint64_t (*keys)[2] = n > 1 ? malloc(n * sizeof *keys) : NULL; /* n is bounded: parked per connection */
    if (!keys)
        return;
    for (const struct parked *pk = wt->parked; pk; pk = pk->next)
        if (pk->seq > 0) {
            keys[k][0] = pk->client_id;
            keys[k++][1] = pk->seq;
        }
    qsort(keys, k, sizeof *keys, cmp_u64_pair);
    for (unsigned i = 1; i < k; i++)
        v->requests_waiting_again += keys[i][0] == keys[i - 1][0] && keys[i][1] == keys[i - 1][1];
    free(keys);
}

void sl_worker_foreach_task(sl_worker_t *w,
                            void (*fn)(sl_task_t *task, const sl_worker_task_view_t *view, void *arg), void *arg)
{
    for (struct wtask *wt = w->tasks; wt; wt = wt->next) {
        sl_worker_task_view_t v = {.rounds = wt->rounds};
        count_waiting(wt, &v);
        sl_holders_count(wt->holders, &v.held_batches, &v.held_bytes);
        if (!wt->rounds)
            v.received_below = received_below(wt, &v.lost_below, &v.received_past_lost);
        fn(wt->task, &v, arg);
    }
}

void sl_worker_stats(const sl_worker_t *w, sl_worker_stats_t *out)
{
    unsigned n = 0;
    for (const struct wconn *wc = w->conns; wc; wc = wc->next)
        n++;
    *out = (sl_worker_stats_t){.tasks = w->num_tasks, .clients = n, .registered = w->session == SESSION_REGISTERED};
    for (const struct wtask *wt = w->tasks; wt; wt = wt->next)
        sl_holders_count(wt->holders, &out->held_batches, &out->held_bytes);
    for (unsigned i = 0; i < TOMBSTONES; i++)
        if (w->tombstones[i].holders)
            sl_holders_count(w->tombstones[i].holders, &out->held_batches, &out->held_bytes);
}
