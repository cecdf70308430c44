/*
 * admin_api.c: the dispatcher's JSON admin endpoint (docs/admin-api.md):
 * views of workers, datasets and jobs, cancel and drain, health, readiness,
 * metrics and the status page.
 */
#include "admin_api.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "log.h"
#include "metrics.h"
#include "server.h"
#include "status_page.h"

static sl_metric_t *m_workers, *m_jobs, *m_datasets, *m_first_splits, *m_left_to_others, *m_held_back;
static sl_metric_t *m_given_back, *m_returns_refused;
/* The limits (docs/security.md, "Limits"). */
static sl_metric_t *m_clients_away, *m_datasets_collected, *m_exclude_runs, *m_datasets_refused, *m_jobs_refused, *m_workers_refused, *m_excl_refused;

/* Parses the decimal id at the start of s; rest points after it. */
static int parse_id(const char *s, uint64_t *id, const char **rest)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *s == '-')
        return -1;
    *id = v;
    *rest = end;
    return 0;
}

static int healthz(struct evhttp_request *req, const char *rest, json_t **body, void *arg)
{
    sl_dstate_stats_t s;
    (void)req;
    (void)rest;
    sl_dstate_stats(arg, &s);
    *body = json_pack("{s:s,s:I,s:I,s:I,s:I}", "status", "ok", "workers", (json_int_t)s.workers_live, "datasets",
                      (json_int_t)s.datasets, "jobs_running", (json_int_t)s.jobs_running, "held_back",
                      (json_int_t)s.held_back);
    return 200;
}

/* Ready when a job could make progress: at least one live worker. */
static int readyz(struct evhttp_request *req, const char *rest, json_t **body, void *arg)
{
    sl_dstate_stats_t s;
    (void)req;
    (void)rest;
    sl_dstate_stats(arg, &s);
    if (s.workers_live == 0) {
        *body = json_pack("{s:b,s:s}", "ready", 0, "error", "no live worker");
        return 503;
    }
    *body = json_pack("{s:b,s:I}", "ready", 1, "workers", (json_int_t)s.workers_live);
    return 200;
}

static int workers(struct evhttp_request *req, const char *rest, json_t **body, void *arg)
{
    (void)req;
    (void)rest;
    *body = json_pack("{s:o}", "workers", sl_dstate_workers_json(arg, sl_now_ms()));
    return 200;
}

static int datasets(struct evhttp_request *req, const char *rest, json_t **body, void *arg)
{
    (void)req;
    (void)rest;
    *body = json_pack("{s:o}", "datasets", sl_dstate_datasets_json(arg));
    return 200;
}

static int dataset(struct evhttp_request *req, const char *rest, json_t **body, void *arg)
{
    uint64_t id;
    const char *after;
    (void)req;
    if (parse_id(rest, &id, &after) < 0 || *after) {
        *body = sl_admin_error("no such endpoint: /v1/datasets/%s (expected a dataset id)", rest);
        return 404;
    }
    *body = sl_dstate_dataset_json(arg, id);
    if (!*body) {
        *body = sl_admin_error("dataset %" PRIu64 " is not registered", id);
        return 404;
    }
    return 200;
}

static int dataset_delete(struct evhttp_request *req, const char *rest, json_t **body, void *arg)
{
    uint64_t id;
    const char *after;
    char err[256];
    (void)req;
    if (parse_id(rest, &id, &after) < 0 || *after) {
        *body = sl_admin_error("no such endpoint: /v1/datasets/%s (expected a dataset id)", rest);
        return 404;
    }
    int rc = sl_dstate_dataset_delete(sl_dserver_state(arg), id, err, sizeof err);
    if (rc < 0) {
        *body = sl_admin_error("%s", err);
        return rc == SL_ENOTFOUND ? 404 : 409;
    }
    if (sl_dserver_commit(arg, err, sizeof err) < 0) {
        *body = sl_admin_error("the deletion was not stored, the dataset is still registered: %s", err);
        return 503;
    }
    *body = json_pack("{s:I,s:b}", "id", (json_int_t)id, "deleted", 1);
    return 200;
}

static int jobs(struct evhttp_request *req, const char *rest, json_t **body, void *arg)
{
    (void)req;
    (void)rest;
    int64_t now = sl_now_ms();
    *body = json_pack("{s:o,s:o}", "jobs", sl_dstate_jobs_json(arg, now), "names", sl_dstate_job_names_json(arg, now));
    return 200;
}

static int quarantine(struct evhttp_request *req, const char *rest, json_t **body, void *arg)
{
    (void)req;
    (void)rest;
    *body = sl_dstate_quarantine_json(arg);
    return 200;
}

static int quarantine_forget(struct evhttp_request *req, const char *rest, json_t **body, void *arg)
{
    static const char *const kinds[] = {"job", "dataset", "worker"};
    const char *kind = NULL;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0] && !kind; i++)
        if (strncmp(rest, kinds[i], strlen(kinds[i])) == 0 && rest[strlen(kinds[i])] == '/')
            kind = kinds[i];
    uint64_t id;
    const char *after;
    char err[512];
    (void)req;
    if (!kind || parse_id(rest + strlen(kind) + 1, &id, &after) < 0 || *after) {
        *body = sl_admin_error("no such endpoint: /v1/quarantine/%s "
                               "(expected /v1/quarantine/{job,dataset,worker}/{id})", rest);
        return 404;
    }
    if (sl_dstate_forget_held_back(sl_dserver_state(arg), kind, id, err, sizeof err) < 0) {
        *body = sl_admin_error("%s", err);
        return 404;
    }
    if (sl_dserver_commit(arg, err, sizeof err) < 0) {
        *body = sl_admin_error("the deletion was not stored, the %s is still held back: %s", kind, err);
        return 503;
    }
    *body = json_pack("{s:s,s:I,s:b}", "kind", kind, "id", (json_int_t)id, "deleted", 1);
    return 200;
}

static int job(struct evhttp_request *req, const char *rest, json_t **body, void *arg)
{
    uint64_t id;
    const char *after;
    (void)req;
    if (parse_id(rest, &id, &after) < 0 || *after) {
        *body = sl_admin_error("no such endpoint: /v1/jobs/%s (expected a job id)", rest);
        return 404;
    }
    *body = sl_dstate_job_json(arg, id, sl_now_ms());
    const char *held = *body ? NULL : sl_dstate_job_held_back(arg, id);
    if (held) {
        *body = sl_admin_error("job %" PRIu64 " is held back: %s", id, held);
        return 404;
    }
    if (!*body) {
        *body = sl_admin_error("job %" PRIu64 " is unknown", id);
        return 404;
    }
    return 200;
}

static int job_cancel(struct evhttp_request *req, const char *rest, json_t **body, void *arg)
{
    uint64_t id;
    const char *after;
    char err[256];
    if (parse_id(rest, &id, &after) < 0 || *after) {
        *body = sl_admin_error("no such endpoint: /v1/jobs/%s (expected a job id)", rest);
        return 404;
    }
    json_t *in = sl_admin_body(req, body);
    if (!in)
        return 400;
    const char *reason = "cancelled by the operator";
    json_t *r = json_object_get(in, "reason");
    if (r && !json_is_string(r)) {
        json_decref(in);
        *body = sl_admin_error("\"reason\" must be a string");
        return 400;
    }
    char why[300];
    snprintf(why, sizeof why, "%s", r ? json_string_value(r) : reason);
    json_decref(in);
    sl_dstate_t *st = sl_dserver_state(arg);
    int rc = sl_dstate_job_cancel(st, id, why, err, sizeof err);
    if (rc == SL_ENOTFOUND) {
        *body = sl_admin_error("%s", err);
        return 404;
    }
    if (rc < 0) {
        *body = sl_admin_error("%s", err);
        return 409;
    }
    if (sl_dserver_commit(arg, err, sizeof err) < 0) {
        *body = sl_admin_error("the cancellation was not stored, the job is not cancelled: %s", err);
        return 503;
    }
    sl_log_info("job %" PRIu64 " cancelled through the admin endpoint: %s", id, why);
    *body = sl_dstate_job_json(st, id, sl_now_ms());
    return 200;
}

static int worker_drain(struct evhttp_request *req, const char *rest, json_t **body, void *arg)
{
    char address[200], err[256];
    const char *slash = strrchr(rest, '/');
    if (!slash || strcmp(slash, "/drain") != 0 || slash == rest || (size_t)(slash - rest) >= sizeof address) {
        *body = sl_admin_error("no such endpoint: /v1/workers/%s (expected /v1/workers/{address}/drain)", rest);
        return 404;
    }
    json_t *in = sl_admin_body(req, body);
    if (!in)
        return 400;
    json_decref(in);
    /* The path is decoded: "127.0.0.1%3A5060" is accepted as well. */
    char raw[200];
    snprintf(raw, sizeof raw, "%.*s", (int)(slash - rest), rest);
    char *decoded = evhttp_uridecode(raw, 0, NULL);
    snprintf(address, sizeof address, "%s", decoded ? decoded : raw);
    free(decoded);
    if (sl_dstate_worker_drain(sl_dserver_state(arg), address, err, sizeof err) < 0) {
        *body = sl_admin_error("%s", err);
        return 404;
    }
    if (sl_dserver_commit(arg, err, sizeof err) < 0) {
        *body = sl_admin_error("the drain was not stored, the worker is not draining: %s", err);
        return 503;
    }
    *body = json_pack("{s:s,s:s}", "address", address, "state", "DRAINING");
    return 200;
}

static int metrics(struct evhttp_request *req, const char *rest, json_t **body, void *arg)
{
    sl_dstate_stats_t s;
    (void)rest;
    (void)body;
    sl_dstate_stats(arg, &s);
    sl_metric_set(m_workers, s.workers_live);
    sl_metric_set(m_jobs, s.jobs_running);
    sl_metric_set(m_datasets, s.datasets);
    sl_metric_set(m_exclude_runs, (double)s.exclude_runs);
    sl_metric_set(m_clients_away, s.clients_away);
    sl_metric_set(m_datasets_collected, (double)s.datasets_collected);
    sl_metric_set(m_datasets_refused, (double)s.datasets_refused);
    sl_metric_set(m_jobs_refused, (double)s.jobs_refused);
    sl_metric_set(m_workers_refused, (double)s.workers_refused);
    sl_metric_set(m_excl_refused, (double)s.exclusions_refused);
    sl_metric_set(m_first_splits, (double)s.first_splits_with_job);
    sl_metric_set(m_left_to_others, (double)s.split_requests_left_to_others);
    sl_metric_set(m_held_back, s.held_back);
    sl_metric_set(m_given_back, (double)s.records_given_back);
    sl_metric_set(m_returns_refused, (double)s.returns_refused);
    struct evbuffer *out = evbuffer_new();
    sl_metrics_render(out);
    sl_admin_reply_text(req, 200, "text/plain; version=0.0.4", out);
    evbuffer_free(out);
    return 0;
}

static int status_page(struct evhttp_request *req, const char *rest, json_t **body, void *arg)
{
    (void)rest;
    (void)body;
    (void)arg;
    struct evbuffer *out = evbuffer_new();
    evbuffer_add_reference(out, sl_status_page_html, strlen(sl_status_page_html), NULL, NULL);
    sl_admin_reply_text(req, 200, "text/html; charset=utf-8", out);
    evbuffer_free(out);
    return 0;
}

int sl_dadmin_register(sl_admin_t *a, sl_dserver_t *srv)
{
    sl_dstate_t *st = sl_dserver_state(srv);
    m_workers = sl_metric_register(SL_METRIC_GAUGE, "sluice_dispatcher_workers", NULL, "Live workers.", NULL, 0);
    m_jobs = sl_metric_register(SL_METRIC_GAUGE, "sluice_dispatcher_jobs_running", NULL, "Running jobs.", NULL, 0);
    m_datasets = sl_metric_register(SL_METRIC_GAUGE, "sluice_dispatcher_datasets", NULL, "Registered datasets.",
                                    NULL, 0);
    static const char refusals[] = "Requests refused at a configured limit (docs/security.md).";
    m_datasets_collected = sl_metric_register(SL_METRIC_COUNTER, "sluice_dispatcher_datasets_collected_total",
                                              NULL, "Datasets deleted by --dataset-gc-timeout-ms.", NULL, 0);
    m_clients_away = sl_metric_register(SL_METRIC_GAUGE, "sluice_dispatcher_clients_away", NULL,
                                        "Clients of running jobs whose lease ran out, not yet released "
                                        "(--client-rejoin-ms).", NULL, 0);
    m_exclude_runs = sl_metric_register(SL_METRIC_GAUGE, "sluice_dispatcher_exclude_runs", NULL,
                                        "Runs of restored checkpoints' positions the running jobs hold.", NULL, 0);
    m_datasets_refused = sl_metric_register(SL_METRIC_COUNTER, "sluice_dispatcher_limit_refusals_total",
                                            "limit=\"max_datasets\"", refusals, NULL, 0);
    m_jobs_refused = sl_metric_register(SL_METRIC_COUNTER, "sluice_dispatcher_limit_refusals_total",
                                        "limit=\"max_jobs\"", refusals, NULL, 0);
    m_workers_refused = sl_metric_register(SL_METRIC_COUNTER, "sluice_dispatcher_limit_refusals_total",
                                           "limit=\"max_workers\"", refusals, NULL, 0);
    m_excl_refused = sl_metric_register(SL_METRIC_COUNTER, "sluice_dispatcher_limit_refusals_total",
                                        "limit=\"max_exclude_runs\"", refusals, NULL, 0);
    m_first_splits = sl_metric_register(SL_METRIC_COUNTER, "sluice_dispatcher_first_splits_with_job_total", NULL,
                                        "DYNAMIC tasks handed their first splits with their job's creation: their "
                                        "first request is answered without a commit (docs/sharding.md).", NULL, 0);
    m_left_to_others = sl_metric_register(SL_METRIC_COUNTER, "sluice_dispatcher_split_requests_left_to_others_total",
                                          NULL, "DYNAMIC split requests answered with no split, the task's queue "
                                          "lasting past its job's other tasks' at the end of an epoch: they take "
                                          "what is left (docs/sharding.md).", NULL, 0);
    m_held_back = sl_metric_register(SL_METRIC_GAUGE, "sluice_dispatcher_held_back_records", NULL,
                                     "Damaged records of the state store the dispatcher held back at start, what "
                                     "they are of not served (GET /v1/quarantine).", NULL, 0);
    m_given_back = sl_metric_register(SL_METRIC_COUNTER, "sluice_dispatcher_records_given_back_total", NULL,
                                      "Records that clients of named DYNAMIC jobs received and had not given their "
                                      "callers when they left, handed out again (docs/fault-tolerance.md).", NULL, 0);
    m_returns_refused = sl_metric_register(SL_METRIC_COUNTER, "sluice_dispatcher_returns_refused_total", NULL,
                                           "Leaving clients' records not taken back, each logged with why.", NULL, 0);
    int rc = 0;
    rc |= sl_admin_route(a, EVHTTP_REQ_GET, "/", status_page, st);
    rc |= sl_admin_route(a, EVHTTP_REQ_GET, "/healthz", healthz, st);
    rc |= sl_admin_route(a, EVHTTP_REQ_GET, "/readyz", readyz, st);
    rc |= sl_admin_route(a, EVHTTP_REQ_GET, "/metrics", metrics, st);
    rc |= sl_admin_route(a, EVHTTP_REQ_GET, "/v1/workers", workers, st);
    rc |= sl_admin_route(a, EVHTTP_REQ_POST, "/v1/workers/", worker_drain, srv);
    rc |= sl_admin_route(a, EVHTTP_REQ_GET, "/v1/datasets", datasets, st);
    rc |= sl_admin_route(a, EVHTTP_REQ_GET, "/v1/datasets/", dataset, st);
    rc |= sl_admin_route(a, EVHTTP_REQ_DELETE, "/v1/datasets/", dataset_delete, srv);
    rc |= sl_admin_route(a, EVHTTP_REQ_GET, "/v1/jobs", jobs, st);
    rc |= sl_admin_route(a, EVHTTP_REQ_GET, "/v1/jobs/", job, st);
    rc |= sl_admin_route(a, EVHTTP_REQ_DELETE, "/v1/jobs/", job_cancel, srv);
    rc |= sl_admin_route(a, EVHTTP_REQ_GET, "/v1/quarantine", quarantine, st);
    rc |= sl_admin_route(a, EVHTTP_REQ_DELETE, "/v1/quarantine/", quarantine_forget, srv);
    return rc ? SL_ETOOBIG : 0;
}
