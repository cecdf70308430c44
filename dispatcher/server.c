/* server.c: see server.h. */
#include "server.h"

#include <errno.h>
#include <pthread.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/listener.h>

#include "caps.h"
#include "conn.h"
#include "counter.h"
#include "elemspec.h"
#include "errbuf.h"
#include "log.h"
#include "metrics.h"
#include "net.h"
#include "persist.h"
#include "posbits.h"
#include "policy.h"
#include "spec.h"

/* The largest payload a dispatcher accepts: a dataset spec, or a position
 * set of the most units any dispatcher takes (a restored iterator's
 * consumed positions, a client's report). Not of --max-exclude-runs: a set
 * of more runs than a lowered bound, sent as runs (a client's version 2),
 * may fit it as bitmaps; the decode holds it to the bound, and refuses it
 * by name past it. */
static uint32_t max_payload(void)
{
    size_t excl = SL_POSBITS_MAX_BYTES(SL_POSSET_MAX_RUNS);
    return (uint32_t)((SL_SPEC_MAX_BYTES > excl ? SL_SPEC_MAX_BYTES : excl) + 1024);
}

#define TICK_MS 100

struct dconn {
    sl_dserver_t *srv;
    sl_conn_t *conn;
    uint64_t worker_id; /* the worker registered over this connection, 0 if none */
    bool takes_notices; /* that worker takes WORKER_NOTICE frames */
    bool corked;        /* its answers wait for the next commit */
    struct dconn *prev, *next;
};

struct sl_dserver {
    struct event_base *base;
    sl_dstate_t *st;
    struct evconnlistener *listener;
    sl_conn_env_t *env; /* credentials and connection limits, the caller's */
    struct event *tick;
    struct event *commit; /* activated by the first request of a loop pass */
    bool commit_active;   /* it is, for this pass */
    /* A commit put off for hand-outs whose workers can wait (schedule_commit()):
     * commit_later is due at commit_due_ms (0: none pending). */
    struct event *commit_later;
    int64_t commit_due_ms;
    struct dconn *conns;
    sl_store_t *store;
    bool failed; /* the store failed and could not be reloaded */
    sl_dcounter_t *counter;   /* counts file sources' records off the loop */
    struct pending_reg *regs; /* registrations waiting for their count */
};

/* A REGISTER_DATASET whose files are being counted (counter.h). */
struct pending_reg {
    sl_dserver_t *srv;
    struct dconn *dc; /* NULL once its connection closed */
    uint32_t request_id;
    char *text;
    size_t len;
    sl_spec_t *spec;
    char name[SL_DATASET_NAME_MAX];
    struct pending_reg *prev, *next;
};

int64_t sl_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void dconn_unlink(struct dconn *dc)
{
    for (struct pending_reg *r = dc->srv->regs; r; r = r->next)
        if (r->dc == dc)
            r->dc = NULL; /* its count's answer has nobody to go to */
    if (dc->prev)
        dc->prev->next = dc->next;
    else
        dc->srv->conns = dc->next;
    if (dc->next)
        dc->next->prev = dc->prev;
    free(dc);
}

static sl_metric_t *m_requests[SL_MSG_COUNT_], *m_refused, *m_forbidden, *m_splits, *m_commits, *m_commit_failures;
static sl_metric_t *m_handouts_delayed;
static sl_metric_t *m_store_refusals, *m_store_live, *m_notices;

static void metrics_init(void)
{
    for (unsigned t = 1; t < SL_MSG_COUNT_; t++) {
        const char *name = sl_msg_name(t);
        size_t n = strlen(name);
        if (n < 4 || strcmp(name + n - 4, "_REQ") != 0)
            continue;
        char labels[96];
        snprintf(labels, sizeof labels, "type=\"%.*s\"", (int)(n - 4), name);
        m_requests[t] = sl_metric_register(SL_METRIC_COUNTER, "sluice_dispatcher_requests_total", labels,
                                           "Requests received, by type.", NULL, 0);
    }
    m_refused = sl_metric_register(SL_METRIC_COUNTER, "sluice_dispatcher_requests_refused_total", NULL,
                                   "Requests answered with an error frame.", NULL, 0);
    m_forbidden = sl_metric_register(SL_METRIC_COUNTER, "sluice_dispatcher_requests_forbidden_total", NULL,
                                     "Requests refused with SL_EPERM: they named what their sender does not own "
                                     "(a wrong client secret, another worker's task, job or dataset).", NULL, 0);
    m_splits = sl_metric_register(SL_METRIC_COUNTER, "sluice_dispatcher_splits_handed_out_total", NULL,
                                  "DYNAMIC splits handed out.", NULL, 0);
    m_commits = sl_metric_register(SL_METRIC_COUNTER, "sluice_dispatcher_state_commits_total", NULL,
                                   "Commits of state changes to the state store (one per group).", NULL, 0);
    m_handouts_delayed = sl_metric_register(SL_METRIC_COUNTER, "sluice_dispatcher_handouts_delayed_total", NULL,
                                            "DYNAMIC hand-outs whose commit was put off, to be shared with what "
                                            "came meanwhile (--handout-commit-delay-ms).", NULL, 0);
    m_commit_failures = sl_metric_register(SL_METRIC_COUNTER, "sluice_dispatcher_state_commit_failures_total",
                                           NULL, "Commits that failed; their answers were not sent.", NULL, 0);
    m_store_refusals = sl_metric_register(SL_METRIC_COUNTER, "sluice_dispatcher_limit_refusals_total",
                                          "limit=\"state_store\"",
                                          "Requests refused at a configured limit (docs/security.md).", NULL, 0);
    m_notices = sl_metric_register(SL_METRIC_COUNTER, "sluice_dispatcher_worker_notices_total", NULL,
                                   "WORKER_NOTICE frames sent: a worker told of a new task once it was committed, "
                                   "so that it starts it before a client names it.", NULL, 0);
    m_store_live = sl_metric_register(SL_METRIC_GAUGE, "sluice_dispatcher_state_store_live_bytes", NULL,
                                      "Bytes the state store's tables hold, as of the last request that grows it.",
                                      NULL, 0);
}

/* Requests that grow the state store by about need bytes are refused once
 * its tables would hold more than three quarters of its map: the last
 * quarter is kept for the small commits of running jobs (a store filled to
 * the brim fails every commit, deletions included, as LMDB copies the
 * pages a commit changes). @return 0, or SL_ELIMIT with a message in err */
static int store_room(sl_dserver_t *srv, size_t need, const char *what, char *err, size_t errlen)
{
    if (!srv->store)
        return 0;
    sl_store_stats_t ss;
    sl_store_stats(srv->store, &ss);
    sl_metric_set(m_store_live, (double)ss.live_bytes);
    size_t cap = ss.map_bytes / 4 * 3;
    if (ss.live_bytes <= cap && need <= cap - ss.live_bytes)
        return 0;
    sl_metric_add(m_store_refusals, 1);
    sl_errf(err, errlen, SL_ELIMIT,
            "%s refused: the state store holds %zu of its %zu bytes and keeps the last quarter for running jobs; "
            "delete unused datasets (DELETE /v1/datasets/{id}) or end jobs", what, ss.live_bytes, ss.map_bytes);
    sl_log_warn("%s", err);
    return SL_ELIMIT;
}

int sl_dserver_commit(sl_dserver_t *srv, char *err, size_t errlen)
{
    if (!srv->store || !sl_dpersist_dirty(srv->st))
        return 0;
    int rc = sl_dpersist_save(srv->st, srv->store, err, errlen);
    if (rc == 0) {
        sl_metric_add(m_commits, 1);
        return 0;
    }
    sl_metric_add(m_commit_failures, 1);
    sl_log_error("%s: the changes since the last commit are dropped and the state is reloaded", err);
    /* Answers held for the dropped changes must never go out: their
     * connections close and the peers ask again. */
    for (struct dconn *dc = srv->conns, *next; dc; dc = next) {
        next = dc->next;
        if (dc->corked) {
            sl_conn_close(dc->conn);
            dconn_unlink(dc);
        }
    }
    char rerr[512];
    if (sl_dpersist_reload(srv->st, srv->store, sl_now_ms(), rerr, sizeof rerr) < 0) {
        sl_log_error("%s: stopping", rerr);
        srv->failed = true;
        event_base_loopbreak(srv->base);
    }
    return rc;
}

sl_dstate_t *sl_dserver_state(sl_dserver_t *srv)
{
    return srv->st;
}

int sl_dserver_failed(const sl_dserver_t *srv)
{
    return srv->failed;
}

/* Tells the workers given a task by what was just committed (a new job's,
 * mostly), over their connections, so that each heartbeats now and starts
 * it while the job's clients connect, not when the first of them names it. */
static void send_notices(sl_dserver_t *srv)
{
    if (!sl_dstate_take_notices_due(srv->st))
        return; /* O(1) for most commits; the pass below looks each worker up */
    for (struct dconn *dc = srv->conns; dc; dc = dc->next) {
        if (!dc->worker_id || !dc->takes_notices || !sl_dstate_worker_take_notice(srv->st, dc->worker_id))
            continue;
        sluice_WorkerNotice n = {.new_tasks = true};
        if (sl_conn_send(dc->conn, SL_MSG_WORKER_NOTICE, 0, &n, NULL, 0, NULL, NULL) == 0)
            sl_metric_add(m_notices, 1);
    }
}

/* Runs once the requests of a loop pass are handled, or when a commit put
 * off for hand-outs is due: one commit for all of them, then their answers
 * go out; after a failed commit none do. */
static void on_commit(evutil_socket_t fd, short what, void *arg)
{
    sl_dserver_t *srv = arg;
    (void)fd;
    (void)what;
    srv->commit_active = false;
    if (srv->commit_due_ms) {
        event_del(srv->commit_later);
        srv->commit_due_ms = 0;
    }
    char err[512];
    int rc = sl_dserver_commit(srv, err, sizeof err); /* a failure closed the corked connections */
    for (struct dconn *dc = srv->conns; dc; dc = dc->next) {
        if (dc->corked) {
            dc->corked = false;
            sl_conn_uncork(dc->conn);
        }
    }
    if (rc == 0)
        send_notices(srv);
}

/* The answers corked in this pass go out after a commit: at the pass's end
 * (delay_ms 0), or, when what they wait for may wait (hand-outs whose
 * workers have splits queued), up to delay_ms later, so that hand-outs of
 * several workers share one commit and its syncs. A commit due sooner, or
 * any request that cannot wait, commits everything pending with it. An
 * answer never goes out before the state it tells of is committed. */
static void schedule_commit(sl_dserver_t *srv, uint32_t delay_ms)
{
    if (srv->commit_active)
        return;
    if (delay_ms == 0 || !sl_dpersist_dirty(srv->st)) {
        srv->commit_active = true;
        event_active(srv->commit, EV_TIMEOUT, 0);
        return;
    }
    sl_metric_add(m_handouts_delayed, 1);
    int64_t due = sl_now_ms() + delay_ms;
    if (srv->commit_due_ms && srv->commit_due_ms <= due)
        return;
    struct timeval tv = {(time_t)(delay_ms / 1000), (suseconds_t)(delay_ms % 1000) * 1000};
    if (event_add(srv->commit_later, &tv) < 0) {
        srv->commit_active = true;
        event_active(srv->commit, EV_TIMEOUT, 0);
        return;
    }
    srv->commit_due_ms = due;
}

/* How long a GET_SPLIT answered with splits may wait for its commit: half
 * of what its worker says its queue lasts, at most --handout-commit-delay-ms. */
static uint32_t handout_delay(const sl_dstate_t *st, const sluice_GetSplitRequest *req,
                              const sluice_GetSplitResponse *resp, int rc)
{
    if (rc < 0 || resp->splits_count == 0)
        return 0;
    uint32_t most = sl_dstate_config(st)->handout_commit_delay_ms, half = req->slack_ms / 2;
    return half < most ? half : most;
}

/* Answers a request: resp of type, or an error frame when rc < 0. */
static void reply(sl_conn_t *c, const sl_frame_hdr_t *hdr, int rc, unsigned type, const void *resp,
                  const char *err)
{
    if (rc < 0) {
        sl_metric_add(m_refused, 1);
        if (rc == SL_EPERM)
            sl_metric_add(m_forbidden, 1);
        sl_log_debug("%s from %s refused: %s", sl_msg_name(hdr->type), sl_conn_peer(c), err);
        sl_conn_send_error(c, hdr->request_id, rc, "%s", err);
        return;
    }
    sl_conn_send(c, type, hdr->request_id, resp, NULL, 0, NULL, NULL);
}

/* The connection other than dc that holds worker worker_id, or NULL. */
static struct dconn *worker_bound_elsewhere(const struct dconn *dc, uint64_t worker_id)
{
    for (struct dconn *o = dc->srv->conns; o; o = o->next)
        if (o != dc && o->worker_id == worker_id)
            return o;
    return NULL;
}

/* The element spec of a registered dataset's spec, into its answer. */
static void element_spec(const sl_spec_t *spec, sluice_RegisterDatasetResponse *resp)
{
    sl_elemspec_t es;
    sl_spec_element_spec(spec, &es);
    sl_elemspec_to_wire(&es, &resp->element_spec);
    resp->has_element_spec = true;
}

/* A count ended (on the loop): the dataset is registered with the files
 * it counted, and the request answered once that is committed. */
static void on_counted(int rc, sl_file_list_t *files, const char *cerr, void *arg)
{
    struct pending_reg *r = arg;
    sl_dserver_t *srv = r->srv;
    if (r->prev)
        r->prev->next = r->next;
    else
        srv->regs = r->next;
    if (r->next)
        r->next->prev = r->prev;
    struct dconn *dc = r->dc;
    if (dc) {
        sluice_RegisterDatasetResponse resp = sluice_RegisterDatasetResponse_init_zero;
        sl_frame_hdr_t hdr = {.type = SL_MSG_REGISTER_DATASET_REQ, .request_id = r->request_id};
        char err[1024];
        const char *fp = NULL;
        snprintf(err, sizeof err, "%s", cerr);
        size_t need = r->len + 4096;
        for (int f = 0; rc == 0 && f < files->num_files; f++)
            need += strlen(files->paths[f]) + 32;
        if (rc == 0 && !sl_dstate_dataset_known(srv->st, r->spec, r->name))
            rc = store_room(srv, need, "dataset", err, sizeof err);
        if (rc == 0)
            rc = sl_dstate_dataset_register_counted(srv->st, r->text, r->len, r->name, files, &resp.dataset_id, &fp,
                                                    err, sizeof err);
        if (rc == 0) {
            snprintf(resp.fingerprint, sizeof resp.fingerprint, "%s", fp);
            element_spec(r->spec, &resp);
        }
        /* The answer waits for the commit of the new dataset. */
        if (!dc->corked && srv->store) {
            if (sl_conn_cork(dc->conn) < 0) {
                sl_conn_fail(dc->conn, -ENOMEM, "out of memory");
                goto out;
            }
            dc->corked = true;
        }
        if (srv->store)
            schedule_commit(srv, 0);
        reply(dc->conn, &hdr, rc, SL_MSG_REGISTER_DATASET_RESP, &resp, err);
    }
out:
    sl_spec_free(r->spec);
    free(r->text);
    free(r);
}

/* REGISTER_DATASET: a new file source's files are listed and counted off
 * the loop (counter.h: a gzip bomb takes as long as its inflated size) and
 * the request is answered when that is done; anything else at once. */
static void register_dataset(struct dconn *dc, const sl_frame_hdr_t *hdr, const sluice_RegisterDatasetRequest *req,
                             const uint8_t *payload)
{
    sl_dserver_t *srv = dc->srv;
    sluice_RegisterDatasetResponse resp = sluice_RegisterDatasetResponse_init_zero;
    char err[1024] = "";
    const char *fp = NULL;
    sl_spec_t *spec = NULL;
    const char *name = req->name;
    int rc = sl_dstate_dataset_name_check(name, err, sizeof err);
    if (rc == 0)
        rc = sl_spec_parse((const char *)payload, hdr->payload_len, &spec, err, sizeof err);
    if (rc == 0 && srv->counter && sl_spec_source_num_patterns(spec) > 0 &&
        !sl_dstate_dataset_known(srv->st, spec, name)) {
        struct pending_reg *r = calloc(1, sizeof *r);
        char *text = malloc(hdr->payload_len + 1);
        if (!r || !text) {
            free(r);
            free(text);
            rc = sl_errf(err, sizeof err, -ENOMEM, "out of memory");
        } else {
            memcpy(text, payload, hdr->payload_len);
            text[hdr->payload_len] = '\0';
            *r = (struct pending_reg){.srv = srv, .dc = dc, .request_id = hdr->request_id, .text = text,
                                      .len = hdr->payload_len, .spec = spec};
            snprintf(r->name, sizeof r->name, "%s", name);
            rc = sl_dcounter_submit(srv->counter, spec, on_counted, r);
            if (rc == 0) {
                r->next = srv->regs;
                if (srv->regs)
                    srv->regs->prev = r;
                srv->regs = r;
                return; /* on_counted() answers */
            }
            free(text);
            free(r);
            snprintf(err, sizeof err,
                     "dataset refused: %d registrations wait for their files to be counted already, the most at "
                     "a time; retry later", SL_DCOUNT_MAX_QUEUED);
        }
    }
    if (rc == 0 && !sl_dstate_dataset_known(srv->st, spec, name))
        rc = store_room(srv, hdr->payload_len + 4096, "dataset", err, sizeof err);
    if (rc == 0)
        rc = sl_dstate_dataset_register_counted(srv->st, (const char *)payload, hdr->payload_len, name, NULL,
                                                &resp.dataset_id, &fp, err, sizeof err);
    if (rc == 0) {
        snprintf(resp.fingerprint, sizeof resp.fingerprint, "%s", fp);
        element_spec(spec, &resp);
    }
    sl_spec_free(spec);
    reply(dc->conn, hdr, rc, SL_MSG_REGISTER_DATASET_RESP, &resp, err);
}

static void on_frame(sl_conn_t *c, const sl_frame_hdr_t *hdr, void *msg, uint8_t *payload, void *arg)
{
    struct dconn *dc = arg;
    sl_dserver_t *srv = dc->srv; /* dc may be gone after the request (a failed connection) */
    sl_dstate_t *st = srv->st;
    int64_t now = sl_now_ms();
    char err[1024] = "";
    int rc;
    sl_role_t role = sl_conn_peer_role(c);
    sl_metric_add(m_requests[hdr->type], 1);
    sl_dstate_heard(st, now);
    if (!dc->corked && dc->srv->store) {
        if (sl_conn_cork(c) < 0) {
            sl_conn_fail(c, -ENOMEM, "out of memory");
            free(payload);
            return;
        }
        dc->corked = true;
    }
    uint32_t delay_ms = 0; /* how long its answer may wait for the commit (schedule_commit()) */

    switch (hdr->type) {
    case SL_MSG_WORKER_REGISTER_REQ: {
        const sluice_WorkerRegisterRequest *req = msg;
        sluice_WorkerRegisterResponse resp = sluice_WorkerRegisterResponse_init_zero;
        if (role != SL_ROLE_WORKER || !req->address[0]) {
            rc = SL_EINVAL;
            snprintf(err, sizeof err, "worker registration needs a worker role and an address");
        } else if (!req->client_keys) {
            /* A worker before client keys takes only the task's own key,
             * which this dispatcher gives no client: it would refuse them
             * all. Said here, to both sides, rather than to every client. */
            rc = SL_EINVAL;
            snprintf(err, sizeof err,
                     "worker %.*s is older than this dispatcher: it does not check clients' own task keys "
                     "(WorkerRegisterRequest.client_keys), so it would refuse every client; upgrade it "
                     "(docs/security.md, Tasks)",
                     (int)sizeof req->address, req->address);
        } else {
            rc = SL_ENOTFOUND;
            /* An id is no capability: a worker resumes an id that no other
             * open connection holds (after a dispatcher restart none does),
             * or one whose secret it shows: it left a connection that we
             * have not seen close (a cut it gave up on), which is closed
             * now; else it registers anew. */
            struct dconn *old = req->worker_id ? worker_bound_elsewhere(dc, req->worker_id) : NULL;
            uint8_t secret[16];
            sl_dstate_worker_secret(st, req->worker_id, secret);
            bool proven = sl_cap_equal(secret, req->worker_secret);
            if (req->worker_id != 0 && (!old || proven) &&
                sl_dstate_worker_resume(st, req->address, req->worker_id, now) == 0) {
                if (old) {
                    old->worker_id = 0; /* its close loses nothing now */
                    sl_log_info("worker %" PRIu64 " reconnected from %s; its connection from %s is closed",
                                req->worker_id, sl_conn_peer(c), sl_conn_peer(old->conn));
                    sl_conn_fail(old->conn, SL_ECLOSED, "worker %" PRIu64 " reconnected over another connection",
                                 req->worker_id);
                }
                resp.worker_id = req->worker_id;
                rc = 0;
            }
            if (rc < 0)
                rc = sl_dstate_worker_register(st, req->address, now, &resp.worker_id, err, sizeof err);
        }
        if (rc == 0) {
            /* One worker a connection: one it registered before is gone. */
            if (dc->worker_id && dc->worker_id != resp.worker_id)
                sl_dstate_worker_disconnected(st, dc->worker_id, "its connection registered another worker");
            dc->worker_id = resp.worker_id;
            dc->takes_notices = req->takes_notices;
            /* It heartbeats as soon as it is registered: that answer lists
             * the tasks of the running jobs it joined, no notice needed. */
            sl_dstate_worker_take_notice(st, resp.worker_id);
            resp.heartbeat_ms = sl_dstate_config(st)->worker_heartbeat_ms;
            sl_dstate_worker_secret(st, resp.worker_id, resp.worker_secret);
        }
        reply(c, hdr, rc, SL_MSG_WORKER_REGISTER_RESP, &resp, err);
        break;
    }
    case SL_MSG_WORKER_HEARTBEAT_REQ: {
        sluice_WorkerHeartbeatResponse *resp = calloc(1, sizeof *resp);
        if (!resp) {
            sl_conn_send_error(c, hdr->request_id, -ENOMEM, "out of memory");
            break;
        }
        const sluice_WorkerHeartbeatRequest *req = msg;
        if (dc->worker_id == 0) {
            rc = SL_EPERM;
            snprintf(err, sizeof err, "WORKER_HEARTBEAT refused: no worker registered over this connection "
                     "(WORKER_REGISTER first)");
        } else if (req->worker_id != dc->worker_id) {
            rc = SL_EPERM;
            snprintf(err, sizeof err, "WORKER_HEARTBEAT refused: worker_id %" PRIu64 " is not the worker registered "
                     "over this connection (%" PRIu64 ")", req->worker_id, dc->worker_id);
        } else {
            rc = sl_dstate_worker_heartbeat(st, req, now, resp, err, sizeof err);
        }
        reply(c, hdr, rc, SL_MSG_WORKER_HEARTBEAT_RESP, resp, err);
        free(resp);
        break;
    }
    case SL_MSG_GET_DATASET_REQ: {
        const sluice_GetDatasetRequest *req = msg;
        rc = sl_dstate_worker_may(st, dc->worker_id, SL_DACCESS_DATASET, req->dataset_id, err, sizeof err);
        if (rc < 0) {
            reply(c, hdr, rc, 0, NULL, err);
            break;
        }
        const char *spec = sl_dstate_dataset_spec(st, req->dataset_id);
        if (!spec) {
            sl_conn_send_error(c, hdr->request_id, SL_ENOTFOUND, "dataset %" PRIu64 " is not registered",
                               req->dataset_id);
            break;
        }
        sluice_GetDatasetResponse resp = {.dataset_id = req->dataset_id};
        sl_conn_send(c, SL_MSG_GET_DATASET_RESP, hdr->request_id, &resp, spec, strlen(spec), NULL, NULL);
        break;
    }
    case SL_MSG_GET_SPLIT_REQ: {
        sluice_GetSplitResponse resp = sluice_GetSplitResponse_init_zero;
        rc = sl_dstate_worker_may(st, dc->worker_id, SL_DACCESS_TASK, ((const sluice_GetSplitRequest *)msg)->task_id,
                                  err, sizeof err);
        if (rc < 0) {
            reply(c, hdr, rc, 0, NULL, err);
            break;
        }
        rc = sl_dstate_get_splits(st, msg, now, &resp, err, sizeof err);
        sl_metric_add(m_splits, resp.splits_count);
        delay_ms = handout_delay(st, msg, &resp, rc);
        size_t skips_len = 0;
        const uint8_t *skips = rc == 0 ? sl_dstate_split_skips(st, ((const sluice_GetSplitRequest *)msg)->task_id,
                                                               &skips_len) : NULL;
        if (skips)
            sl_conn_send(c, SL_MSG_GET_SPLIT_RESP, hdr->request_id, &resp, skips, skips_len, NULL, NULL);
        else
            reply(c, hdr, rc, SL_MSG_GET_SPLIT_RESP, &resp, err);
        break;
    }
    case SL_MSG_REGISTER_DATASET_REQ:
        register_dataset(dc, hdr, msg, payload);
        break;
    case SL_MSG_LOOKUP_DATASET_REQ: {
        const sluice_LookupDatasetRequest *req = msg;
        sluice_LookupDatasetResponse resp = sluice_LookupDatasetResponse_init_zero;
        const char *canon = NULL, *fp = NULL, *name = NULL;
        sl_spec_t *spec = NULL;
        rc = sl_dstate_dataset_lookup(st, req->dataset_id, req->name, &resp.dataset_id, &canon, &fp, &name, err,
                                      sizeof err);
        if (rc == 0)
            rc = sl_spec_parse(canon, strlen(canon), &spec, err, sizeof err);
        if (rc == 0) {
            sl_elemspec_t es;
            sl_spec_element_spec(spec, &es);
            sl_elemspec_to_wire(&es, &resp.element_spec);
            resp.has_element_spec = true;
            snprintf(resp.fingerprint, sizeof resp.fingerprint, "%s", fp);
            snprintf(resp.name, sizeof resp.name, "%s", name);
        }
        sl_spec_free(spec);
        reply(c, hdr, rc, SL_MSG_LOOKUP_DATASET_RESP, &resp, err);
        break;
    }
    case SL_MSG_GET_OR_CREATE_JOB_REQ: {
        /* On the heap: it lists up to 256 tasks (about 48 KiB). */
        sluice_GetOrCreateJobResponse *resp = calloc(1, sizeof *resp);
        if (!resp) {
            sl_conn_send_error(c, hdr->request_id, -ENOMEM, "out of memory");
            break;
        }
        char host[128] = "";
        if (sl_policy_host(sl_conn_peer(c), host, sizeof host) < 0)
            host[0] = '\0';
        /* A restored iterator's positions are stored with its job. */
        rc = hdr->payload_len > 0 ? store_room(dc->srv, hdr->payload_len + 4096, "job", err, sizeof err) : 0;
        if (rc == 0)
            rc = sl_dstate_job_join(st, msg, host, payload, hdr->payload_len, now, resp, err, sizeof err);
        resp->heartbeat_ms = sl_dstate_config(st)->client_heartbeat_ms;
        reply(c, hdr, rc, SL_MSG_GET_OR_CREATE_JOB_RESP, resp, err);
        free(resp);
        break;
    }
    case SL_MSG_CLIENT_HEARTBEAT_REQ: {
        sluice_ClientHeartbeatResponse *resp = calloc(1, sizeof *resp);
        if (!resp) {
            sl_conn_send_error(c, hdr->request_id, -ENOMEM, "out of memory");
            break;
        }
        rc = sl_dstate_client_heartbeat(st, msg, now, resp, err, sizeof err);
        reply(c, hdr, rc, SL_MSG_CLIENT_HEARTBEAT_RESP, resp, err);
        free(resp);
        break;
    }
    case SL_MSG_RELEASE_CLIENT_REQ: {
        const sluice_ReleaseClientRequest *req = msg;
        sluice_ReleaseClientResponse resp = sluice_ReleaseClientResponse_init_zero;
        rc = sl_dstate_client_leave(st, req, payload, hdr->payload_len, now, &resp, err, sizeof err);
        reply(c, hdr, rc, SL_MSG_RELEASE_CLIENT_RESP, &resp, err);
        break;
    }
    case SL_MSG_GET_EXCLUSIONS_REQ: {
        const sluice_GetExclusionsRequest *req = msg;
        rc = sl_dstate_worker_may(st, dc->worker_id, SL_DACCESS_JOB, req->job_id, err, sizeof err);
        if (rc < 0) {
            reply(c, hdr, rc, 0, NULL, err);
            break;
        }
        const sl_posbits_t *ex = sl_dstate_job_exclusions(st, req->job_id);
        if (!ex) {
            sl_conn_send_error(c, hdr->request_id, SL_ENOTFOUND, "job %" PRIu64 " is unknown", req->job_id);
            break;
        }
        uint8_t *buf;
        size_t len;
        if (sl_posbits_bytes(ex, &buf, &len) < 0) {
            sl_conn_send_error(c, hdr->request_id, -ENOMEM, "out of memory");
            break;
        }
        sluice_GetExclusionsResponse resp = {.job_id = req->job_id};
        sl_conn_send(c, SL_MSG_GET_EXCLUSIONS_RESP, hdr->request_id, &resp, buf, len, NULL, NULL);
        free(buf);
        break;
    }
    case SL_MSG_REPORT_RECEIVED_REQ: {
        sluice_ReportReceivedResponse resp = sluice_ReportReceivedResponse_init_zero;
        rc = sl_dstate_client_report(st, msg, payload, hdr->payload_len, now, err, sizeof err);
        reply(c, hdr, rc, SL_MSG_REPORT_RECEIVED_RESP, &resp, err);
        break;
    }
    default:
        /* A known type that is no request of a dispatcher's. */
        sl_conn_fail(c, SL_EPROTO, "a dispatcher does not serve %s", sl_msg_name(hdr->type));
        break;
    }
    if (srv->store)
        schedule_commit(srv, delay_ms);
    free(payload);
}

static void on_close(sl_conn_t *c, int err, const char *why, void *arg)
{
    struct dconn *dc = arg;
    (void)c;
    sl_log_debug("connection closed (%s): %s", sl_strerror(err), why);
    /* A worker's session ended: its process died (or the network broke;
     * then it registers again). Its tasks' splits go to the others. */
    if (dc->worker_id && sl_dstate_worker_disconnected(dc->srv->st, dc->worker_id, why)) {
        if (dc->srv->store)
            schedule_commit(dc->srv, 0);
    }
    dconn_unlink(dc);
}

static const sl_conn_cbs_t dispatcher_cbs = {NULL, on_frame, on_close};

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen, void *arg)
{
    sl_dserver_t *srv = arg;
    (void)l;
    (void)sa;
    (void)salen;
    struct dconn *dc = calloc(1, sizeof *dc);
    if (!dc) {
        evutil_closesocket(fd);
        return;
    }
    sl_limits_t limits = {.max_payload = max_payload()};
    dc->srv = srv;
    dc->conn = sl_conn_accept(srv->base, fd, srv->env, SL_ROLE_DISPATCHER, (1u << SL_ROLE_CLIENT) | (1u << SL_ROLE_WORKER),
                              &limits, &dispatcher_cbs, dc);
    if (!dc->conn) {
        free(dc);
        return;
    }
    dc->next = srv->conns;
    if (srv->conns)
        srv->conns->prev = dc;
    srv->conns = dc;
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    sl_dserver_t *srv = arg;
    (void)fd;
    (void)what;
    sl_dstate_tick(srv->st, sl_now_ms());
    /* A commit put off for hand-outs commits what the tick changed too,
     * soon: nobody waits for it. */
    if (srv->commit_due_ms)
        return;
    char err[512];
    if (sl_dserver_commit(srv, err, sizeof err) == 0) /* logged there; nobody waits for an answer */
        send_notices(srv);
}

int sl_dserver_start(struct event_base *base, sl_dstate_t *st, sl_store_t *store, sl_conn_env_t *env,
                     const char *host, uint16_t port, uint16_t *bound_port, sl_dserver_t **out, char *err,
                     size_t errlen)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, metrics_init);
    sl_dserver_t *srv = calloc(1, sizeof *srv);
    if (!srv)
        return -ENOMEM;
    srv->base = base;
    srv->st = st;
    srv->store = store;
    srv->env = env;
    int fd = -1;
    int rc = sl_listen_tcp(host, port, &fd, bound_port, err, errlen);
    if (rc < 0)
        goto fail;
    srv->listener = evconnlistener_new(base, on_accept, srv, LEV_OPT_CLOSE_ON_FREE, -1, fd);
    if (!srv->listener) {
        evutil_closesocket(fd);
        rc = -ENOMEM;
        snprintf(err, errlen, "cannot start the listener");
        goto fail;
    }
    evconnlistener_set_error_cb(srv->listener, sl_listener_on_error);
    const sl_dstate_config_t *cfg = sl_dstate_config(st);
    if ((rc = sl_dcounter_new(base, cfg->roots, (int)cfg->max_files, cfg->count_timeout_ms, &srv->counter)) < 0) {
        snprintf(err, errlen, "cannot start the record counting thread: %s", strerror(-rc));
        goto fail;
    }
    srv->tick = event_new(base, -1, EV_PERSIST, on_tick, srv);
    struct timeval tv = {0, TICK_MS * 1000};
    srv->commit = event_new(base, -1, 0, on_commit, srv);
    srv->commit_later = evtimer_new(base, on_commit, srv);
    if (!srv->tick || !srv->commit || !srv->commit_later || event_add(srv->tick, &tv) < 0) {
        rc = -ENOMEM;
        goto fail;
    }
    *out = srv;
    return 0;
fail:
    sl_dserver_free(srv);
    return rc;
}

void sl_dserver_free(sl_dserver_t *srv)
{
    if (!srv)
        return;
    if (srv->store && srv->commit_due_ms) {
        /* A clean stop with a commit put off: what it holds is made
         * durable now. Its answers do not go out (the connections close),
         * and a worker asks again with the same request_seq, which the
         * store then answers with the same splits. */
        char err[512];
        (void)sl_dserver_commit(srv, err, sizeof err); /* a failure is logged there */
        srv->commit_due_ms = 0;
    }
    while (srv->conns) {
        struct dconn *dc = srv->conns;
        sl_conn_close(dc->conn);
        dconn_unlink(dc);
    }
    sl_dcounter_free(srv->counter); /* after the connections: its answers have nobody to go to */
    if (srv->tick)
        event_free(srv->tick);
    if (srv->commit)
        event_free(srv->commit);
    if (srv->commit_later)
        event_free(srv->commit_later);
    if (srv->listener)
        evconnlistener_free(srv->listener);
    free(srv);
}
