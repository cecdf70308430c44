/*
 * admin_api.c: the worker's JSON admin endpoint: its tasks, health and
 * metrics.
 */
#include "admin_api.h"

#include <event2/buffer.h>

#include "metrics.h"
#include "reader.h"
#include "task.h"

static sl_metric_t *m_tasks, *m_buffered_batches, *m_buffered_bytes, *m_read_uring, *m_read_pread, *m_held_batches, *m_held_bytes;

static const char *task_state_name(int state)
{
    return state == SL_TASK_DONE ? "DONE" : state == SL_TASK_FAILED ? "FAILED" : "RUNNING";
}

/* A coordinated task's rounds: how many are open and waiting for a place,
 * and what the lowest open one waits for (its batches, consumers). */
static json_t *rounds_json(const sl_rounds_t *rounds)
{
    sl_rounds_info_t ri;
    sl_rounds_info(rounds, &ri);
    json_t *o = json_pack("{s:I,s:I,s:I}", "consumers", (json_int_t)ri.consumers, "open", (json_int_t)ri.open,
                          "waiting", (json_int_t)ri.waiting);
    if (!ri.any_open)
        return o;
    json_t *missing = json_array();
    for (uint32_t i = 0; i < ri.num_missing && i < SL_ROUNDS_INFO_MISSING; i++)
        json_array_append_new(missing, json_integer(ri.missing[i]));
    json_object_set_new(o, "lowest_open", json_pack("{s:I,s:I,s:I,s:o}", "round", (json_int_t)ri.lowest,
                                                     "batches_made", (json_int_t)ri.lowest_made, "consumers_missing",
                                                     (json_int_t)ri.num_missing, "missing", missing));
    return o;
}

static void add_task(sl_task_t *task, const sl_worker_task_view_t *view, void *arg)
{
    sl_task_info_t ti;
    sl_task_info(task, &ti);
    json_t *o = json_pack("{s:I,s:I,s:s,s:s,s:I,s:I,s:I,s:I,s:{s:I,s:I,s:I,s:I},s:f,s:f,s:I}", "task_id",
                          (json_int_t)ti.task_id, "job_id", (json_int_t)ti.job_id, "sharding",
                          sl_sharding_name(ti.sharding), "state", task_state_name(ti.state), "batches_produced",
                          (json_int_t)ti.batches_produced, "batches_served", (json_int_t)ti.batches_served,
                          "elements_served", (json_int_t)ti.elements_served, "bytes_served",
                          (json_int_t)ti.bytes_served, "buffer", "batches", (json_int_t)ti.buffered_batches, "bytes",
                          (json_int_t)ti.buffered_bytes, "capacity_batches", (json_int_t)ti.buffer_capacity_batches,
                          "capacity_bytes", (json_int_t)ti.buffer_capacity_bytes, "pipeline_seconds",
                          ti.pipeline_seconds, "split_wait_seconds", ti.split_wait_seconds, "records_skipped",
                          (json_int_t)ti.records_skipped);
    if (ti.sharding == SL_SHARDING_DYNAMIC)
        json_object_set_new(o, "split_records_per_second", json_real(ti.split_rate));
    json_t *ops = json_array();
    for (int i = 0; i < ti.num_stages; i++) {
        const sl_pipeline_op_stats_t *st = &ti.stages[i];
        json_array_append_new(ops, json_pack("{s:s,s:I,s:I,s:f,s:f}", "stage", st->label, "calls",
                                             (json_int_t)st->calls, "elements", (json_int_t)st->elements,
                                             "seconds", st->seconds, "self_seconds", st->self_seconds));
    }
    json_object_set_new(o, "ops", ops);
    /* The pipeline waits for room: its batches, buffered or taken and not
     * yet written (held for a round's consumers, for instance), fill it. */
    json_object_set_new(json_object_get(o, "buffer"), "full", json_boolean(ti.buffer_full));
    /* Or for the worker's memory budget (--max-memory-mb), which its own
     * batches fill. */
    json_object_set_new(json_object_get(o, "buffer"), "memory_full", json_boolean(ti.budget_wait));
    /* Its share of the worker's memory budget: what a refusal names. */
    json_object_set_new(o, "memory_bytes", json_integer((json_int_t)ti.memory_bytes));
    json_object_set_new(o, "requests_waiting", json_integer(view->requests_waiting));
    json_object_set_new(o, "requests_waiting_again", json_integer(view->requests_waiting_again));
    json_object_set_new(o, "held", json_pack("{s:I,s:I}", "batches", (json_int_t)view->held_batches, "bytes",
                                             (json_int_t)view->held_bytes));
    /* DYNAMIC: how far its splits reached its clients, as it tells the
     * dispatcher, and past the batches it lost (null: none lost). */
    if (ti.sharding == SL_SHARDING_DYNAMIC && !view->rounds) {
        bool lost = view->lost_below != 0;
        json_object_set_new(o, "received_below", json_integer((json_int_t)view->received_below));
        json_object_set_new(o, "lost_below", lost ? json_integer((json_int_t)view->lost_below) : json_null());
        json_object_set_new(o, "received_past_lost",
                            lost ? json_integer((json_int_t)view->received_past_lost) : json_null());
    }
    if (view->rounds)
        json_object_set_new(o, "rounds", rounds_json(view->rounds));
    if (ti.state == SL_TASK_FAILED)
        json_object_set_new(o, "error", json_string(sl_task_errmsg(task)));
    json_array_append_new(arg, o);
}

static int tasks(struct evhttp_request *req, const char *rest, json_t **body, void *arg)
{
    (void)req;
    (void)rest;
    json_t *arr = json_array();
    sl_worker_foreach_task(arg, add_task, arr);
    *body = json_pack("{s:o}", "tasks", arr);
    return 200;
}

static int healthz(struct evhttp_request *req, const char *rest, json_t **body, void *arg)
{
    sl_worker_stats_t s;
    (void)req;
    (void)rest;
    sl_worker_stats(arg, &s);
    *body = json_pack("{s:s,s:b,s:I,s:I}", "status", "ok", "registered", s.registered, "tasks",
                      (json_int_t)s.tasks, "clients", (json_int_t)s.clients);
    return 200;
}

/* Ready when registered with the dispatcher: it can be given tasks. While the
 * dispatcher is away the worker keeps serving the tasks it has, unready. */
static int readyz(struct evhttp_request *req, const char *rest, json_t **body, void *arg)
{
    sl_worker_stats_t s;
    (void)req;
    (void)rest;
    sl_worker_stats(arg, &s);
    if (!s.registered) {
        *body = json_pack("{s:b,s:s}", "ready", 0, "error", "not registered with the dispatcher");
        return 503;
    }
    *body = json_pack("{s:b,s:I}", "ready", 1, "tasks", (json_int_t)s.tasks);
    return 200;
}

static void sum_buffers(sl_task_t *task, const sl_worker_task_view_t *view, void *arg)
{
    (void)view;
    double *sums = arg;
    sl_task_info_t ti;
    sl_task_info(task, &ti);
    sums[0] += 1;
    sums[1] += ti.buffered_batches;
    sums[2] += (double)ti.buffered_bytes;
}

static int metrics(struct evhttp_request *req, const char *rest, json_t **body, void *arg)
{
    (void)rest;
    (void)body;
    double sums[3] = {0, 0, 0};
    sl_worker_foreach_task(arg, sum_buffers, sums);
    sl_metric_set(m_tasks, sums[0]);
    sl_metric_set(m_buffered_batches, sums[1]);
    sl_metric_set(m_buffered_bytes, sums[2]);
    sl_worker_stats_t s;
    sl_worker_stats(arg, &s);
    sl_metric_set(m_held_batches, s.held_batches);
    sl_metric_set(m_held_bytes, (double)s.held_bytes);
    /* The reader counts in its own atomics; the counters mirror them. */
    sl_metric_set(m_read_uring, (double)sl_reader_bytes(SL_IO_URING));
    sl_metric_set(m_read_pread, (double)sl_reader_bytes(SL_IO_PREAD));
    struct evbuffer *out = evbuffer_new();
    sl_metrics_render(out);
    sl_admin_reply_text(req, 200, "text/plain; version=0.0.4", out);
    evbuffer_free(out);
    return 0;
}

int sl_wadmin_register(sl_admin_t *a, sl_worker_t *w)
{
    m_tasks = sl_metric_register(SL_METRIC_GAUGE, "sluice_worker_tasks", NULL, "Tasks the worker runs.", NULL, 0);
    m_buffered_batches = sl_metric_register(SL_METRIC_GAUGE, "sluice_worker_buffer_batches", NULL,
                                            "Finished batches waiting in task buffers.", NULL, 0);
    m_buffered_bytes = sl_metric_register(SL_METRIC_GAUGE, "sluice_worker_buffer_bytes", NULL,
                                          "Bytes held by task buffers, sent or not yet.", NULL, 0);
    m_held_batches = sl_metric_register(SL_METRIC_GAUGE, "sluice_worker_held_batches", NULL,
                                        "Batches served and held until their client acknowledges them.", NULL, 0);
    m_held_bytes = sl_metric_register(SL_METRIC_GAUGE, "sluice_worker_held_bytes", NULL,
                                      "Bytes of the batches held until acknowledged (--hold-timeout-ms).", NULL, 0);
    m_read_uring = sl_metric_register(SL_METRIC_COUNTER, "sluice_worker_read_bytes_total", "engine=\"uring\"",
                                      "Bytes read from files, by io engine.", NULL, 0);
    m_read_pread = sl_metric_register(SL_METRIC_COUNTER, "sluice_worker_read_bytes_total", "engine=\"pread\"",
                                      "Bytes read from files, by io engine.", NULL, 0);
    int rc = 0;
    rc |= sl_admin_route(a, EVHTTP_REQ_GET, "/healthz", healthz, w);
    rc |= sl_admin_route(a, EVHTTP_REQ_GET, "/readyz", readyz, w);
    rc |= sl_admin_route(a, EVHTTP_REQ_GET, "/metrics", metrics, w);
    rc |= sl_admin_route(a, EVHTTP_REQ_GET, "/v1/tasks", tasks, w);
    return rc ? SL_ETOOBIG : 0;
}
