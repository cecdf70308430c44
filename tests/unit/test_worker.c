/*
 * test_worker.c: the worker's dispatcher session (workerd/worker.c) against
 * a real dispatcher (its state on an LMDB store and its server) on the same
 * event loop, over loopback: the worker registers, takes the task of a job
 * created meanwhile, drops it when the job is cancelled, and after the
 * dispatcher restarts on its store reconnects and resumes its id.
 */
#include <criterion/criterion.h>
#include <event2/event.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dstate_util.h"
#include "server.h"
#include "worker.h"

struct rig {
    char dir[64];
    struct event_base *base;
    sl_store_t *store;
    sl_dstate_t *st;
    sl_dserver_t *srv;
    uint16_t dport;
    sl_worker_t *w;
};

static void dispatcher_start(struct rig *r, uint16_t port)
{
    char err[512];
    r->st = new_state();
    cr_assert_eq(sl_dpersist_load(r->st, r->store, sl_now_ms(), err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_dserver_start(r->base, r->st, r->store, NULL, "127.0.0.1", port, &r->dport, &r->srv, err, sizeof err),
                 0, "%s", err);
}

static void dispatcher_stop(struct rig *r)
{
    sl_dserver_free(r->srv);
    sl_dstate_free(r->st);
    r->srv = NULL;
    r->st = NULL;
}

static void rig_start(struct rig *r)
{
    /* As the daemons' main() (workerd/main.c): a client that goes with
     * answers in flight fails the worker's next write with EPIPE, which
     * the process must outlive. */
    signal(SIGPIPE, SIG_IGN);
    snprintf(r->dir, sizeof r->dir, "/tmp/sl-test-worker-XXXXXX");
    cr_assert_not_null(mkdtemp(r->dir));
    r->base = event_base_new();
    r->store = open_state_store(r->dir, 0);
    dispatcher_start(r, 0);
    char addr[64], err[512];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", r->dport);
    sl_worker_config_t cfg;
    sl_worker_config_init(&cfg);
    cfg.dispatcher = addr; /* copied by the worker */
    cfg.bind = "127.0.0.1";
    uint16_t port;
    cr_assert_eq(sl_worker_start(r->base, &cfg, &port, &r->w, err, sizeof err), 0, "%s", err);
}

static void rig_stop(struct rig *r)
{
    sl_worker_free(r->w);
    dispatcher_stop(r);
    sl_store_close(r->store);
    event_base_free(r->base);
    remove_dir(r->dir);
}

/* Runs the loop until done(r) holds, at most 30 s (a hang fails the test). */
static bool run_until(struct rig *r, bool (*done)(struct rig *))
{
    for (int i = 0; i < 3000; i++) {
        if (done(r))
            return true;
        struct timeval tv = {0, 10000};
        event_base_loopexit(r->base, &tv);
        event_base_dispatch(r->base);
    }
    return done(r);
}

static bool registered(struct rig *r)
{
    sl_worker_stats_t ws;
    sl_dstate_stats_t ds;
    sl_worker_stats(r->w, &ws);
    sl_dstate_stats(r->st, &ds);
    return ws.registered && ds.workers_live == 1;
}

static bool one_task(struct rig *r)
{
    sl_worker_stats_t ws;
    sl_worker_stats(r->w, &ws);
    return ws.tasks == 1;
}

static bool no_task(struct rig *r)
{
    sl_worker_stats_t ws;
    sl_worker_stats(r->w, &ws);
    return ws.tasks == 0;
}

/* The id of the one worker the dispatcher knows live. */
static uint64_t live_worker_id(struct rig *r)
{
    json_t *ws = sl_dstate_workers_json(r->st, sl_now_ms());
    uint64_t id = 0;
    size_t i;
    json_t *w;
    json_array_foreach(ws, i, w) {
        if (strcmp(json_string_value(json_object_get(w, "state")), "LIVE") == 0)
            id = (uint64_t)json_integer_value(json_object_get(w, "id"));
    }
    json_decref(ws);
    return id;
}

Test(worker, registers_takes_a_jobs_task_and_drops_it_when_the_job_is_cancelled)
{
    struct rig r = {0};
    rig_start(&r);
    cr_assert(run_until(&r, registered), "the worker never registered");
    char err[512];
    const char *spec = "{\"source\":{\"type\":\"range\",\"stop\":1000},\"ops\":[{\"op\":\"repeat\"}]}";
    uint64_t dataset, job, client;
    const char *fp;
    cr_assert_eq(sl_dstate_dataset_register(r.st, spec, strlen(spec), &dataset, &fp, err, sizeof err), 0, "%s", err);
    sluice_GetOrCreateJobRequest req = {.dataset_id = dataset, .sharding = SL_SHARDING_OFF};
    cr_assert_eq(sl_dstate_job_get_or_create(r.st, &req, sl_now_ms(), &job, &client, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_dserver_commit(r.srv, err, sizeof err), 0, "%s", err);
    cr_assert(run_until(&r, one_task), "the worker never started the job's task");
    cr_assert_eq(sl_dstate_job_cancel(r.st, job, "the test is done with it", err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_dserver_commit(r.srv, err, sizeof err), 0, "%s", err);
    cr_assert(run_until(&r, no_task), "the worker kept the cancelled job's task");
    rig_stop(&r);
}

Test(worker, reconnects_to_a_restarted_dispatcher_and_resumes_its_id)
{
    struct rig r = {0};
    rig_start(&r);
    cr_assert(run_until(&r, registered), "the worker never registered");
    uint64_t id = live_worker_id(&r);
    cr_assert_neq(id, 0);
    /* The dispatcher goes away and comes back on its store and its port,
     * as a supervisor restarts it. */
    uint16_t port = r.dport;
    dispatcher_stop(&r);
    dispatcher_start(&r, port);
    cr_assert(run_until(&r, registered), "the worker never came back");
    cr_assert_eq(live_worker_id(&r), id, "the worker came back as %lu, not as %lu", (unsigned long)live_worker_id(&r),
                 (unsigned long)id);
    rig_stop(&r);
}
