/*
 * test_repetitions.c: named jobs keyed by (name, repetition) in the
 * dispatcher's state machine (dispatcher/state.c) and its store
 * (dispatcher/persist.c, on a real LMDB store in a temporary dir): a join of
 * a running repetition joins it, of an ended one sees its end and never the
 * data again, of a new one creates it beside the others; an ended one is
 * collected after the gc timeout and then created again, with a notice
 * each time; the keys survive a restart, and a store written before
 * repetitions existed still loads.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "dstate_util.h"
#include "log.h"
#include "persist.h"
#include "sluice.h"
#include "state.h"
#include "store.h"

#define SPEC "{\"source\": {\"type\": \"range\", \"stop\": 10}}"
#define GC_MS 500

static char dir[64];
static sl_store_t *store;
static sl_dstate_t *st;
static sluice_WorkerHeartbeatRequest *wreq;
static sluice_WorkerHeartbeatResponse *wresp;
static sluice_ClientHeartbeatResponse *cresp;
static char err[1024];

static void setup(void)
{
    sl_log_init("test_repetitions", -1);
    wreq = calloc(1, sizeof *wreq);
    wresp = calloc(1, sizeof *wresp);
    cresp = calloc(1, sizeof *cresp);
    cr_assert(wreq && wresp && cresp);
    dir[0] = '\0';
}

static void teardown(void)
{
    sl_dstate_free(st);
    st = NULL;
    sl_store_close(store);
    store = NULL;
    if (dir[0])
        remove_dir(dir);
    free(wreq);
    free(wresp);
    free(cresp);
}

TestSuite(repetitions, .init = setup, .fini = teardown);

static sl_dstate_t *state(void)
{
    sl_dstate_config_t cfg;
    sl_dstate_config_init(&cfg);
    cfg.client_timeout_ms = 1000000; /* leases end by release here */
    cfg.job_gc_timeout_ms = GC_MS;
    sl_dstate_t *s = sl_dstate_new(&cfg);
    cr_assert_not_null(s);
    return s;
}

static uint64_t dataset(void)
{
    uint64_t id;
    const char *fp;
    cr_assert_eq(sl_dstate_dataset_register(st, SPEC, strlen(SPEC), &id, &fp, err, sizeof err), 0, "%s", err);
    return id;
}

static uint64_t worker(const char *address, int64_t now)
{
    uint64_t id;
    cr_assert_eq(sl_dstate_worker_register(st, address, now, &id, err, sizeof err), 0, "%s", err);
    return id;
}

/* A join of (name, repetition) that must succeed; the answer in *resp. */
static void join(uint64_t ds, const char *name, uint64_t repetition, int64_t now, sluice_GetOrCreateJobResponse *resp)
{
    sluice_GetOrCreateJobRequest req = {.dataset_id = ds, .sharding = SL_SHARDING_OFF, .repetition = repetition};
    snprintf(req.job_name, sizeof req.job_name, "%s", name);
    *resp = (sluice_GetOrCreateJobResponse)sluice_GetOrCreateJobResponse_init_zero;
    int rc = sl_dstate_job_join(st, &req, "127.0.0.1", NULL, 0, now, resp, err, sizeof err);
    cr_assert_eq(rc, 0, "join %s repetition %" PRIu64 ": %d %s", name, repetition, rc, err);
    cr_assert_neq(resp->job_id, 0);
    cr_assert_neq(resp->client_id, 0);
}

static int client_hb(uint64_t job_id, uint64_t client_id, int64_t now)
{
    sluice_ClientHeartbeatRequest req = {.job_id = job_id, .client_id = client_id};
    sl_dstate_client_secret(st, job_id, client_id, req.client_secret);
    memset(cresp, 0, sizeof *cresp);
    return sl_dstate_client_heartbeat(st, &req, now, cresp, err, sizeof err);
}

static void release(uint64_t job_id, uint64_t client_id, int64_t now)
{
    sluice_ReleaseClientRequest req = {.job_id = job_id, .client_id = client_id};
    sl_dstate_client_secret(st, job_id, client_id, req.client_secret);
    cr_assert_eq(sl_dstate_client_release(st, &req, now, err, sizeof err), 0, "%s", err);
}

/* The worker's heartbeat reports every task it was given DONE (sharding
 * OFF: the jobs end with it). */
static void finish_tasks(uint64_t worker_id, int64_t now)
{
    memset(wreq, 0, sizeof *wreq);
    wreq->worker_id = worker_id;
    cr_assert_eq(sl_dstate_worker_heartbeat(st, wreq, now, wresp, err, sizeof err), 0, "%s", err);
    pb_size_t n = wresp->new_tasks_count;
    uint64_t ids[64];
    for (pb_size_t i = 0; i < n; i++)
        ids[i] = wresp->new_tasks[i].task_id;
    memset(wreq, 0, sizeof *wreq);
    wreq->worker_id = worker_id;
    for (pb_size_t i = 0; i < n; i++) {
        wreq->tasks[i].task_id = ids[i];
        wreq->tasks[i].state = SL_TASK_DONE;
    }
    wreq->tasks_count = n;
    cr_assert_eq(sl_dstate_worker_heartbeat(st, wreq, now, wresp, err, sizeof err), 0, "%s", err);
}

/* A job's admin view field. */
static json_int_t job_field_int(uint64_t job_id, const char *field)
{
    json_t *j = sl_dstate_job_json(st, job_id, 0);
    cr_assert_not_null(j, "job %" PRIu64 " is not in the state", job_id);
    json_t *v = json_object_get(j, field);
    cr_assert(json_is_integer(v) || json_is_boolean(v), "job %" PRIu64 ": no %s", job_id, field);
    json_int_t out = json_is_boolean(v) ? json_is_true(v) : json_integer_value(v);
    json_decref(j);
    return out;
}

static const char *state_name(uint32_t s)
{
    static const char *const names[] = {"RUNNING", "FINISHED", "CANCELLED", "FAILED"};
    return s < 4 ? names[s] : "?";
}

Test(repetitions, a_join_of_an_ended_repetition_sees_its_end_and_never_its_data)
{
    st = state();
    uint64_t w = worker("127.0.0.1:1", 0);
    uint64_t ds = dataset();
    sluice_GetOrCreateJobResponse a, b, late;
    join(ds, "train", 0, 0, &a);
    join(ds, "train", 0, 1, &b);
    cr_assert_eq(b.job_id, a.job_id, "a running repetition is joined");
    cr_assert_str_eq(b.notice, "");
    cr_assert_eq(b.tasks_count, 1, "a client of a running repetition is listed its task with the job");
    finish_tasks(w, 10);
    cr_assert_eq(client_hb(a.job_id, a.client_id, 11), 0, "%s", err);
    cr_assert_eq(cresp->job_state, SL_JOB_FINISHED, "%s", state_name(cresp->job_state));
    cr_assert_gt(cresp->tasks_count, 0, "a client that read it still sees its tasks");

    join(ds, "train", 0, 111, &late);
    cr_assert_eq(late.job_id, a.job_id, "no new job for a late client");
    cr_assert_eq(late.tasks_count, 0, "a late client's job answer lists no task: it reads nothing");
    char want[200];
    snprintf(want, sizeof want, "job \"train\" repetition 0 (id %" PRIu64 ") had already ended (FINISHED) 101 ms ago",
             a.job_id);
    cr_assert(strstr(late.notice, want), "%s", late.notice);
    cr_assert(strstr(late.notice, "the next epoch is repetition 1"), "%s", late.notice);
    cr_assert_eq(client_hb(late.job_id, late.client_id, 112), 0, "%s", err);
    cr_assert_eq(cresp->job_state, SL_JOB_FINISHED);
    cr_assert_eq(cresp->tasks_count, 0, "a late client is listed no task: it reads nothing");
    release(late.job_id, late.client_id, 113);

    json_t *names = sl_dstate_job_names_json(st, 200);
    json_t *reps = json_object_get(names, "train");
    cr_assert_eq(json_array_size(reps), 1);
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(reps, 0), "job_id")), (json_int_t)a.job_id);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(reps, 0), "state")), "FINISHED");
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(reps, 0), "ended_ms_ago")), 190);
    json_decref(names);
}

Test(repetitions, repetitions_of_one_name_run_side_by_side)
{
    st = state();
    worker("127.0.0.1:1", 0);
    uint64_t ds = dataset();
    sluice_GetOrCreateJobResponse r0, r1, r0b, r1b;
    join(ds, "train", 0, 0, &r0);
    join(ds, "train", 1, 1, &r1);
    cr_assert_neq(r1.job_id, r0.job_id, "repetition 1 is a job of its own");
    cr_assert_str_eq(r1.notice, "");
    join(ds, "train", 0, 2, &r0b);
    join(ds, "train", 1, 3, &r1b);
    cr_assert_eq(r0b.job_id, r0.job_id);
    cr_assert_eq(r1b.job_id, r1.job_id);
    cr_assert_eq(job_field_int(r0.job_id, "repetition"), 0);
    cr_assert_eq(job_field_int(r1.job_id, "repetition"), 1);
    cr_assert_eq(client_hb(r0.job_id, r0.client_id, 4), 0, "%s", err);
    cr_assert_eq(cresp->job_state, SL_JOB_RUNNING);
    cr_assert_eq(client_hb(r1.job_id, r1.client_id, 4), 0, "%s", err);
    cr_assert_eq(cresp->job_state, SL_JOB_RUNNING);
    /* Repetition 1 asked for another dataset: a conflict, as for any named job. */
    const char *other = "{\"source\": {\"type\": \"range\", \"stop\": 11}}";
    uint64_t ds2;
    const char *fp;
    cr_assert_eq(sl_dstate_dataset_register(st, other, strlen(other), &ds2, &fp, err, sizeof err), 0, "%s", err);
    sluice_GetOrCreateJobRequest req = {.dataset_id = ds2, .sharding = SL_SHARDING_OFF, .repetition = 1};
    snprintf(req.job_name, sizeof req.job_name, "train");
    sluice_GetOrCreateJobResponse resp = sluice_GetOrCreateJobResponse_init_zero;
    cr_assert_eq(sl_dstate_job_join(st, &req, "", NULL, 0, 5, &resp, err, sizeof err), SL_ECONFLICT);
    /* The names view lists both, in repetition order. */
    json_t *names = sl_dstate_job_names_json(st, 6);
    json_t *reps = json_object_get(names, "train");
    cr_assert_eq(json_array_size(reps), 2);
    for (size_t i = 0; i < 2; i++)
        cr_assert_eq(json_integer_value(json_object_get(json_array_get(reps, i), "repetition")), (json_int_t)i);
    json_decref(names);
}

Test(repetitions, an_ended_repetition_is_collected_after_the_gc_timeout_and_then_created_again)
{
    st = state();
    uint64_t w = worker("127.0.0.1:1", 0);
    uint64_t ds = dataset();
    sluice_GetOrCreateJobResponse a, late, again;
    join(ds, "eval", 0, 0, &a);
    finish_tasks(w, 10);
    /* A late client holds it: no collection while it is there. */
    join(ds, "eval", 0, 20, &late);
    cr_assert_eq(late.job_id, a.job_id);
    release(a.job_id, a.client_id, 30);
    sl_dstate_tick(st, 30 + GC_MS + 1);
    cr_assert_eq(job_field_int(a.job_id, "collected"), 0, "a client still holds it");
    release(late.job_id, late.client_id, 600);
    sl_dstate_tick(st, 600 + GC_MS);
    cr_assert_eq(job_field_int(a.job_id, "collected"), 0, "not before the gc timeout");
    sl_dstate_tick(st, 600 + GC_MS + 1);
    cr_assert_eq(job_field_int(a.job_id, "collected"), 1);

    join(ds, "eval", 0, 1500, &again);
    cr_assert_neq(again.job_id, a.job_id, "a collected repetition is created again");
    char want[300];
    snprintf(want, sizeof want, "job \"eval\" repetition 0 (id %" PRIu64 ") ended (FINISHED) 1490 ms ago and was "
             "collected (no client for --job-gc-timeout-ms %d ms); a new job %" PRIu64 " was created for the "
             "repetition, reading the dataset from the start", a.job_id, GC_MS, again.job_id);
    cr_assert_str_eq(again.notice, want);
    cr_assert_null(sl_dstate_job_json(st, a.job_id, 0), "the collected record is replaced");
    cr_assert_eq(client_hb(again.job_id, again.client_id, 1501), 0, "%s", err);
    cr_assert_eq(cresp->job_state, SL_JOB_RUNNING);
    cr_assert_gt(cresp->tasks_count, 0, "it reads the data again");
}

Test(repetitions, a_running_repetition_without_clients_is_cancelled_and_collected)
{
    st = state();
    worker("127.0.0.1:1", 0);
    uint64_t ds = dataset();
    sluice_GetOrCreateJobResponse a, again;
    join(ds, "r", 3, 0, &a);
    release(a.job_id, a.client_id, 1);
    sl_dstate_tick(st, 1 + GC_MS + 1);
    cr_assert_eq(job_field_int(a.job_id, "collected"), 1);
    join(ds, "r", 3, 600, &again);
    cr_assert_neq(again.job_id, a.job_id);
    cr_assert(strstr(again.notice, "repetition 3"), "%s", again.notice);
    cr_assert(strstr(again.notice, "ended (CANCELLED)"), "%s", again.notice);
    cr_assert(strstr(again.notice, "was collected"), "%s", again.notice);
}

Test(repetitions, a_late_client_of_a_cancelled_repetition_hears_why)
{
    st = state();
    worker("127.0.0.1:1", 0);
    uint64_t ds = dataset();
    sluice_GetOrCreateJobResponse a, late;
    join(ds, "c", 0, 0, &a);
    cr_assert_eq(sl_dstate_job_cancel(st, a.job_id, "stopped by hand", err, sizeof err), 0, "%s", err);
    join(ds, "c", 0, 5, &late);
    cr_assert_eq(late.job_id, a.job_id);
    cr_assert(strstr(late.notice, "had already ended (CANCELLED)"), "%s", late.notice);
    cr_assert_eq(client_hb(late.job_id, late.client_id, 6), 0, "%s", err);
    cr_assert_eq(cresp->job_state, SL_JOB_CANCELLED);
    cr_assert_str_eq(cresp->error, "stopped by hand");
}

Test(repetitions, an_anonymous_job_ignores_the_repetition)
{
    st = state();
    worker("127.0.0.1:1", 0);
    uint64_t ds = dataset();
    sluice_GetOrCreateJobRequest req = {.dataset_id = ds, .sharding = SL_SHARDING_DYNAMIC, .repetition = 4};
    sluice_GetOrCreateJobResponse r1 = sluice_GetOrCreateJobResponse_init_zero, r2 = r1;
    cr_assert_eq(sl_dstate_job_join(st, &req, "", NULL, 0, 0, &r1, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_dstate_job_join(st, &req, "", NULL, 0, 0, &r2, err, sizeof err), 0, "%s", err);
    cr_assert_neq(r1.job_id, r2.job_id);
    json_t *j = sl_dstate_job_json(st, r1.job_id, 0);
    cr_assert_null(json_object_get(j, "repetition"));
    json_decref(j);
}

/* ---- the store ---- */

static void open_store(void)
{
    snprintf(dir, sizeof dir, "/tmp/sl-reps-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    store = open_state_store(dir, 0);
}

static void save(void)
{
    cr_assert_eq(sl_dpersist_save(st, store, err, sizeof err), 0, "%s", err);
}

/* The state as a new dispatcher process loads it, at its clock's now. */
static void restart(int64_t now)
{
    sl_dstate_free(st);
    st = state();
    cr_assert_eq(sl_dpersist_load(st, store, now, err, sizeof err), 0, "%s", err);
}

Test(repetitions, repetitions_their_ends_and_late_clients_survive_a_restart)
{
    open_store();
    st = state();
    uint64_t w = worker("127.0.0.1:1", 0);
    uint64_t ds = dataset();
    sluice_GetOrCreateJobResponse r0, r1, late, gone;
    join(ds, "train", 0, 0, &r0);
    join(ds, "train", 1, 1, &r1);
    finish_tasks(w, 10); /* both end */
    join(ds, "train", 0, 20, &late);
    join(ds, "gone", 2, 20, &gone);
    release(gone.job_id, gone.client_id, 21);
    sl_dstate_tick(st, 21 + GC_MS + 1);
    cr_assert_eq(job_field_int(gone.job_id, "collected"), 1);
    save();
    restart(100000);
    cr_assert_eq(job_field_int(r0.job_id, "repetition"), 0);
    cr_assert_eq(job_field_int(r1.job_id, "repetition"), 1);
    cr_assert_eq(job_field_int(gone.job_id, "repetition"), 2);
    cr_assert_eq(job_field_int(gone.job_id, "collected"), 1);
    /* The late client still gets no task. */
    cr_assert_eq(client_hb(late.job_id, late.client_id, 100001), 0, "%s", err);
    cr_assert_eq(cresp->tasks_count, 0);
    cr_assert_eq(cresp->job_state, SL_JOB_FINISHED);
    /* Ended repetitions are still ended; the collected one is created again. */
    sluice_GetOrCreateJobResponse again;
    join(ds, "train", 1, 100002, &again);
    cr_assert_eq(again.job_id, r1.job_id);
    cr_assert(strstr(again.notice, "had already ended (FINISHED)"), "%s", again.notice);
    join(ds, "gone", 2, 100003, &again);
    cr_assert_neq(again.job_id, gone.job_id);
    cr_assert(strstr(again.notice, "was collected"), "%s", again.notice);
}

/* Writes a job record as the dispatcher before repetitions wrote it. */
static void put_old_job_record(uint64_t job_id, uint64_t ds, int state)
{
    char rec[512];
    snprintf(rec, sizeof rec,
             "{\"name\":\"old\",\"dataset\":%" PRIu64 ",\"sharding\":0,\"effective\":0,\"num_consumers\":0,"
             "\"round_horizon\":64,\"state\":%d,\"error\":\"\",\"tasks\":[],\"clients\":[{\"id\":99,"
             "\"consumer_index\":0,\"round\":0,\"target\":0,\"host\":\"127.0.0.1\"}],\"report_gen\":0}",
             ds, state);
    sl_store_txn_t *t;
    cr_assert_eq(sl_store_begin(store, &t), 0);
    uint8_t key[8];
    for (int i = 0; i < 8; i++)
        key[i] = (uint8_t)(job_id >> (56 - 8 * i));
    cr_assert_eq(sl_store_put(t, 1 /* jobs */, key, sizeof key, rec, strlen(rec)), 0);
    cr_assert_eq(sl_store_commit(t, err, sizeof err), 0, "%s", err);
}

Test(repetitions, a_store_of_the_previous_version_loads_and_keeps_its_rule_for_ended_names)
{
    open_store();
    st = state();
    uint64_t ds = dataset();
    sluice_GetOrCreateJobResponse a;
    join(ds, "old", 0, 0, &a);
    save();
    /* Ended under the old rule: the next join of its name made a new job. */
    put_old_job_record(a.job_id, ds, SL_JOB_FINISHED);
    restart(5000);
    cr_assert_eq(job_field_int(a.job_id, "repetition"), 0);
    cr_assert_eq(job_field_int(a.job_id, "collected"), 1);
    sluice_GetOrCreateJobResponse b;
    join(ds, "old", 0, 5001, &b);
    cr_assert_neq(b.job_id, a.job_id);
    cr_assert(strstr(b.notice, "was collected"), "%s", b.notice);
    /* A running job of the old store is repetition 0: joined. */
    put_old_job_record(a.job_id, ds, SL_JOB_RUNNING);
    restart(6000);
    cr_assert_eq(job_field_int(a.job_id, "collected"), 0);
    sluice_GetOrCreateJobResponse c;
    join(ds, "old", 0, 6001, &c);
    cr_assert_eq(c.job_id, a.job_id);
    cr_assert_str_eq(c.notice, "");
}
