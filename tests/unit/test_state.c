/*
 * test_state.c: the dispatcher's state machine (dispatcher/state.c), driven
 * directly with nanopb structs and a hand-moved clock: datasets, jobs,
 * tasks, DYNAMIC splits, completion, timeouts and the counts.
 *
 * Each test builds its own state with start(); the suite's fini frees it and
 * the request and response buffers, also when an assertion failed.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "policy.h"
#include "seed_util.h"
#include "spec.h"
#include "state.h"
#include "taskkey.h"

#define RANGE_SPEC(stop) "{\"source\": {\"type\": \"range\", \"stop\": " #stop "}}"

static sl_dstate_t *st;
static sluice_WorkerHeartbeatRequest *wreq;
static sluice_WorkerHeartbeatResponse *wresp;
static sluice_ClientHeartbeatResponse *cresp;
static sluice_GetSplitResponse *sresp;
static char err[1024];

static void suite_init(void)
{
    sl_log_init("test_state", -1); /* nothing: the state logs every event */
    wreq = calloc(1, sizeof *wreq);
    wresp = calloc(1, sizeof *wresp);
    cresp = calloc(1, sizeof *cresp);
    sresp = calloc(1, sizeof *sresp);
    cr_assert(wreq && wresp && cresp && sresp);
}

static void suite_fini(void)
{
    sl_dstate_free(st);
    st = NULL;
    free(wreq);
    free(wresp);
    free(cresp);
    free(sresp);
}

TestSuite(state, .init = suite_init, .fini = suite_fini);

/* The defaults with small timeouts: a worker is lost after 100 ms, a client
 * after 200 ms, a job without clients is cancelled after 500 ms. */
static void test_config(sl_dstate_config_t *cfg)
{
    sl_dstate_config_init(cfg);
    cfg->worker_timeout_ms = 100;
    cfg->client_timeout_ms = 200;
    cfg->client_rejoin_ms = 0; /* released when the lease ends (the away state: test_outstanding.c) */
    cfg->job_gc_timeout_ms = 500;
    cfg->split_size = 1000;
}

static void start(const sl_dstate_config_t *cfg)
{
    st = sl_dstate_new(cfg);
    cr_assert_not_null(st);
}

static void start_default(void)
{
    sl_dstate_config_t cfg;
    test_config(&cfg);
    start(&cfg);
}

static int dataset_rc(const char *json, uint64_t *id, const char **fp)
{
    const char *unused;
    err[0] = '\0';
    return sl_dstate_dataset_register(st, json, strlen(json), id, fp ? fp : &unused, err, sizeof err);
}

static uint64_t dataset(const char *json)
{
    uint64_t id = 0;
    int rc = dataset_rc(json, &id, NULL);
    cr_assert_eq(rc, 0, "register %s: %d %s", json, rc, err);
    cr_assert_neq(id, 0);
    return id;
}

static uint64_t worker(const char *address, int64_t now)
{
    uint64_t id = 0;
    err[0] = '\0';
    int rc = sl_dstate_worker_register(st, address, now, &id, err, sizeof err);
    cr_assert_eq(rc, 0, "register worker %s: %d %s", address, rc, err);
    cr_assert_neq(id, 0);
    return id;
}

static int job_rc(uint64_t ds, const char *name, sl_sharding_t sharding, int64_t now, uint64_t *job_id,
                  uint64_t *client_id)
{
    sluice_GetOrCreateJobRequest req = {.dataset_id = ds, .sharding = (uint32_t)sharding};
    snprintf(req.job_name, sizeof req.job_name, "%s", name ? name : "");
    err[0] = '\0';
    return sl_dstate_job_get_or_create(st, &req, now, job_id, client_id, err, sizeof err);
}

static uint64_t job(uint64_t ds, const char *name, sl_sharding_t sharding, int64_t now, uint64_t *client_id)
{
    uint64_t job_id = 0, cid = 0;
    int rc = job_rc(ds, name, sharding, now, &job_id, &cid);
    cr_assert_eq(rc, 0, "get_or_create job %s: %d %s", name ? name : "(anonymous)", rc, err);
    cr_assert_neq(job_id, 0);
    cr_assert_neq(cid, 0);
    if (client_id)
        *client_id = cid;
    return job_id;
}

/* One task report of a worker heartbeat. */
typedef struct report {
    uint64_t task_id;
    sl_task_state_t state;
    const char *error;
} report_t;

/* A worker heartbeat with n reports; the answer is in *wresp. */
static int worker_hb(uint64_t worker_id, int64_t now, size_t n, const report_t *reports)
{
    memset(wreq, 0, sizeof *wreq);
    memset(wresp, 0, sizeof *wresp);
    cr_assert_leq(n, sizeof wreq->tasks / sizeof wreq->tasks[0]);
    wreq->worker_id = worker_id;
    for (size_t i = 0; i < n; i++) {
        wreq->tasks[i].task_id = reports[i].task_id;
        wreq->tasks[i].state = (uint32_t)reports[i].state;
        if (reports[i].error)
            snprintf(wreq->tasks[i].error, sizeof wreq->tasks[i].error, "%s", reports[i].error);
    }
    wreq->tasks_count = (pb_size_t)n;
    err[0] = '\0';
    return sl_dstate_worker_heartbeat(st, wreq, now, wresp, err, sizeof err);
}

/* A heartbeat that must succeed and hand the worker exactly one new task. */
static sluice_TaskDef take_task(uint64_t worker_id, int64_t now)
{
    int rc = worker_hb(worker_id, now, 0, NULL);
    cr_assert_eq(rc, 0, "worker %" PRIu64 " heartbeat: %d %s", worker_id, rc, err);
    cr_assert_eq(wresp->new_tasks_count, 1, "worker %" PRIu64 ": %u new tasks", worker_id,
                 (unsigned)wresp->new_tasks_count);
    cr_assert_eq(wresp->removed_tasks_count, 0);
    return wresp->new_tasks[0];
}

static void report(uint64_t worker_id, uint64_t task_id, sl_task_state_t state, const char *error, int64_t now)
{
    report_t r = {task_id, state, error};
    int rc = worker_hb(worker_id, now, 1, &r);
    cr_assert_eq(rc, 0, "worker %" PRIu64 " heartbeat: %d %s", worker_id, rc, err);
}

static bool removed(uint64_t task_id)
{
    for (pb_size_t i = 0; i < wresp->removed_tasks_count; i++)
        if (wresp->removed_tasks[i] == task_id)
            return true;
    return false;
}

/* Client client_id of job job_id leaves, with its secret. */
static int release(uint64_t job_id, uint64_t client_id, int64_t now)
{
    sluice_ReleaseClientRequest req = {.job_id = job_id, .client_id = client_id};
    sl_dstate_client_secret(st, job_id, client_id, req.client_secret);
    err[0] = '\0';
    return sl_dstate_client_release(st, &req, now, err, sizeof err);
}

/* A client heartbeat; the answer is in *cresp. */
static int client_hb(uint64_t job_id, uint64_t client_id, int64_t now)
{
    sluice_ClientHeartbeatRequest req = {.job_id = job_id, .client_id = client_id};
    sl_dstate_client_secret(st, job_id, client_id, req.client_secret);
    memset(cresp, 0, sizeof *cresp);
    err[0] = '\0';
    return sl_dstate_client_heartbeat(st, &req, now, cresp, err, sizeof err);
}

static uint32_t job_state(uint64_t job_id, uint64_t client_id, int64_t now)
{
    int rc = client_hb(job_id, client_id, now);
    cr_assert_eq(rc, 0, "client heartbeat: %d %s", rc, err);
    return cresp->job_state;
}

static bool client_sees_task(uint64_t task_id)
{
    for (pb_size_t i = 0; i < cresp->tasks_count; i++)
        if (cresp->tasks[i].task_id == task_id)
            return true;
    return false;
}

/* get_splits asking for splits of want records (0: no wish), numbered seq
 * (as workerd does, from 1; 0: not numbered); the answer is in *sresp. */
static int splits_seq(uint64_t task_id, uint64_t epoch, uint32_t max, uint64_t want, uint64_t seq)
{
    sluice_GetSplitRequest req = {
        .task_id = task_id, .epoch = epoch, .max_splits = max, .request_seq = seq, .split_records = want};
    memset(sresp, 0, sizeof *sresp);
    err[0] = '\0';
    return sl_dstate_get_splits(st, &req, 0, sresp, err, sizeof err);
}

/* get_splits asking for splits of want records (0: no wish); the answer is in *sresp. */
static int splits_of(uint64_t task_id, uint64_t epoch, uint32_t max, uint64_t want)
{
    return splits_seq(task_id, epoch, max, want, 0);
}

/* get_splits; the answer is in *sresp. */
static int splits(uint64_t task_id, uint64_t epoch, uint32_t max)
{
    return splits_of(task_id, epoch, max, 0);
}

/* Registers live workers w:1 ... w:live, makes a DYNAMIC job of dataset ds
 * and takes each worker's task (at time now) into tasks. */
static void dynamic_job_on(uint64_t ds, unsigned live, int64_t now, uint64_t *tasks)
{
    uint64_t *workers = calloc(live, sizeof *workers);
    cr_assert_not_null(workers);
    for (unsigned i = 0; i < live; i++) {
        char addr[32];
        snprintf(addr, sizeof addr, "w:%u", i + 1);
        workers[i] = worker(addr, 0);
    }
    job(ds, NULL, SL_SHARDING_DYNAMIC, 0, NULL);
    for (unsigned i = 0; i < live; i++)
        tasks[i] = take_task(workers[i], now).task_id;
    free(workers);
}

/* A DYNAMIC job of a dataset of spec, read by one worker: its task's id. */
static uint64_t lone_dynamic_task(const char *spec)
{
    start_default();
    uint64_t task;
    dynamic_job_on(dataset(spec), 1, 0, &task);
    return task;
}

static sl_dstate_stats_t stats(void)
{
    sl_dstate_stats_t s;
    memset(&s, 0xff, sizeof s);
    sl_dstate_stats(st, &s);
    return s;
}

/* ---- datasets ---------------------------------------------------------- */

Test(state, dataset_same_spec_any_key_order_or_whitespace_is_one_dataset)
{
    start_default();
    const char *a = "{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[{\"op\":\"batch\",\"batch_size\":4}]}";
    const char *b = "  {\n  \"ops\" : [ { \"batch_size\" : 4 ,\t\"op\" : \"batch\" } ] ,\n"
                    "  \"source\" : { \"stop\" : 10 , \"start\": 0, \"type\" : \"range\" }\n}\n";
    uint64_t ida = 0, idb = 0;
    const char *fpa = NULL, *fpb = NULL;
    cr_assert_eq(dataset_rc(a, &ida, &fpa), 0, "%s", err);
    cr_assert_eq(dataset_rc(b, &idb, &fpb), 0, "%s", err);
    cr_assert_eq(ida, idb, "same spec, ids %" PRIu64 " and %" PRIu64, ida, idb);
    cr_assert_not_null(fpa);
    cr_assert_eq(strlen(fpa), 16);
    cr_assert_str_eq(fpa, fpb);

    const char *canon = sl_dstate_dataset_spec(st, ida);
    cr_assert_not_null(canon);
    cr_assert_eq(strchr(canon, ' '), NULL, "canonical form is compact: %s", canon);
    cr_assert_not_null(strstr(canon, "\"stop\":10"), "%s", canon);
    cr_assert_eq(stats().datasets, 1);

    /* The canonical text registers as the same dataset too. */
    char *copy = strdup(canon);
    uint64_t idc = 0;
    cr_assert_eq(dataset_rc(copy, &idc, NULL), 0, "%s", err);
    free(copy);
    cr_assert_eq(idc, ida);
}

Test(state, dataset_different_spec_gets_new_id)
{
    start_default();
    uint64_t ida = 0, idb = 0;
    const char *fpa = NULL, *fpb = NULL;
    cr_assert_eq(dataset_rc(RANGE_SPEC(10), &ida, &fpa), 0, "%s", err);
    cr_assert_eq(dataset_rc(RANGE_SPEC(11), &idb, &fpb), 0, "%s", err);
    cr_assert_neq(ida, idb);
    cr_assert_str_neq(fpa, fpb);
    cr_assert_not_null(strstr(sl_dstate_dataset_spec(st, ida), "\"stop\":10"));
    cr_assert_not_null(strstr(sl_dstate_dataset_spec(st, idb), "\"stop\":11"));
    cr_assert_null(sl_dstate_dataset_spec(st, ida + idb + 100));
    cr_assert_eq(stats().datasets, 2);
}

static int named_rc(const char *json, const char *name, uint64_t *id)
{
    const char *fp;
    err[0] = '\0';
    return sl_dstate_dataset_register_counted(st, json, strlen(json), name, NULL, id, &fp, err, sizeof err);
}

Test(state, a_dataset_is_its_name_and_spec)
{
    start_default();
    uint64_t plain = 0, a = 0, again = 0, b = 0, other = 0, found = 0;
    cr_assert_eq(named_rc(RANGE_SPEC(10), NULL, &plain), 0, "%s", err);
    cr_assert_eq(named_rc(RANGE_SPEC(10), "train", &a), 0, "%s", err);
    cr_assert_eq(named_rc(RANGE_SPEC(10), "train", &again), 0, "%s", err);
    cr_assert_eq(named_rc(RANGE_SPEC(10), "eval/v2", &b), 0, "%s", err);
    cr_assert_eq(a, again);
    cr_assert(plain != a && a != b && plain != b);
    /* Unnamed registrations still find the unnamed one. */
    cr_assert_eq(dataset(RANGE_SPEC(10)), plain);
    /* A name another spec holds is refused, and nothing is added. */
    cr_assert_eq(named_rc(RANGE_SPEC(11), "train", &other), SL_ECONFLICT);
    cr_assert_not_null(strstr(err, "dataset name \"train\" is registered with another spec"), "%s", err);
    cr_assert_eq(stats().datasets, 3);
    const char *canon, *fp, *name;
    cr_assert_eq(sl_dstate_dataset_lookup(st, 0, "eval/v2", &found, &canon, &fp, &name, err, sizeof err), 0);
    cr_assert_eq(found, b);
    cr_assert_str_eq(name, "eval/v2");
    cr_assert_eq(sl_dstate_dataset_lookup(st, plain, NULL, &found, &canon, &fp, &name, err, sizeof err), 0);
    cr_assert_str_eq(name, "");
    cr_assert_eq(sl_dstate_dataset_lookup(st, 0, "nope", &found, &canon, &fp, &name, err, sizeof err),
                 SL_ENOTFOUND);
    cr_assert_eq(sl_dstate_dataset_lookup(st, 999, NULL, &found, &canon, &fp, &name, err, sizeof err), SL_ENOTFOUND);
    /* Names: characters, length, not all digits. */
    cr_assert_eq(named_rc(RANGE_SPEC(10), "12", &other), SL_EINVAL);
    cr_assert_eq(named_rc(RANGE_SPEC(10), "a\"b", &other), SL_EINVAL);
    char longname[SL_DATASET_NAME_MAX + 1];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    cr_assert_eq(named_rc(RANGE_SPEC(10), longname, &other), SL_EINVAL);
    longname[SL_DATASET_NAME_MAX - 1] = '\0';
    cr_assert_eq(named_rc(RANGE_SPEC(10), longname, &other), 0, "%s", err);
}

Test(state, dataset_bad_spec_names_the_json_path)
{
    start_default();
    uint64_t id = 0;
    cr_assert_eq(dataset_rc("{\"source\": {\"type\": \"range\", \"stop\": \"x\"}}", &id, NULL), SL_ESPEC);
    cr_assert(strncmp(err, "$.source.stop:", 14) == 0, "err: %s", err);

    cr_assert_eq(dataset_rc("{\"source\": {\"type\": \"range\", \"stop\": 5},"
                            " \"ops\": [{\"op\": \"take\", \"count\": 1}, {\"op\": \"batch\", \"batch_size\": 0}]}",
                            &id, NULL),
                 SL_ESPEC);
    cr_assert(strncmp(err, "$.ops[1].batch_size:", 20) == 0, "err: %s", err);

    cr_assert_eq(dataset_rc("{\"source\": ", &id, NULL), SL_ESPEC);
    cr_assert_neq(err[0], '\0');
    cr_assert_eq(stats().datasets, 0, "a refused spec registers nothing");
}

Test(state, dataset_limit_is_a_limit_only_for_datasets_in_use_and_known_specs_still_resolve)
{
    sl_dstate_config_t cfg;
    test_config(&cfg);
    cfg.max_datasets = 2;
    start(&cfg);
    uint64_t a = dataset(RANGE_SPEC(1));
    uint64_t b = dataset(RANGE_SPEC(2));
    uint64_t cid;
    job(a, NULL, SL_SHARDING_OFF, 0, &cid);
    job(b, NULL, SL_SHARDING_OFF, 0, &cid);
    uint64_t c = 0;
    cr_assert_eq(dataset_rc(RANGE_SPEC(3), &c, NULL), SL_ELIMIT);
    cr_assert_not_null(strstr(err, "2"), "err: %s", err);
    cr_assert_eq(stats().datasets, 2);
    /* A spec already registered is found, not refused. */
    cr_assert_eq(dataset(RANGE_SPEC(1)), a);
    cr_assert_eq(dataset(RANGE_SPEC(2)), b);
}

/* ---- jobs -------------------------------------------------------------- */

Test(state, anonymous_jobs_are_distinct)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t c1, c2;
    uint64_t j1 = job(ds, NULL, SL_SHARDING_OFF, 0, &c1);
    uint64_t j2 = job(ds, "", SL_SHARDING_OFF, 0, &c2);
    cr_assert_neq(j1, j2);
    cr_assert_neq(c1, c2);
    cr_assert_eq(stats().jobs_total, 2);
    cr_assert_eq(stats().jobs_running, 2);
    /* Each lease belongs to its own job. */
    cr_assert_eq(client_hb(j1, c1, 1), 0, "%s", err);
    cr_assert_eq(client_hb(j2, c2, 1), 0, "%s", err);
    cr_assert_eq(client_hb(j1, c2, 1), SL_ENOTFOUND);
}

Test(state, named_job_is_shared)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t c1, c2;
    uint64_t j1 = job(ds, "train", SL_SHARDING_DYNAMIC, 0, &c1);
    uint64_t j2 = job(ds, "train", SL_SHARDING_DYNAMIC, 5, &c2);
    cr_assert_eq(j1, j2);
    cr_assert_neq(c1, c2);
    cr_assert_eq(stats().jobs_total, 1);
    cr_assert_eq(job_state(j1, c1, 6), SL_JOB_RUNNING);
    cr_assert_eq(job_state(j1, c2, 6), SL_JOB_RUNNING);
    /* Another name is another job. */
    uint64_t j3 = job(ds, "eval", SL_SHARDING_DYNAMIC, 7, NULL);
    cr_assert_neq(j3, j1);
    cr_assert_eq(stats().jobs_total, 2);
}

Test(state, named_job_with_other_sharding_conflicts)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t j = job(ds, "train", SL_SHARDING_DYNAMIC, 0, NULL);
    uint64_t j2 = 0, c2 = 0;
    cr_assert_eq(job_rc(ds, "train", SL_SHARDING_OFF, 1, &j2, &c2), SL_ECONFLICT);
    cr_assert_not_null(strstr(err, "sharding dynamic, requested off"), "err: %s", err);
    cr_assert_not_null(strstr(err, "train"), "err: %s", err);
    cr_assert_eq(stats().jobs_total, 1);
    /* The job itself is untouched: joining it right still works. */
    cr_assert_eq(job(ds, "train", SL_SHARDING_DYNAMIC, 2, NULL), j);
}

Test(state, named_job_with_other_dataset_conflicts)
{
    start_default();
    uint64_t a = dataset(RANGE_SPEC(100));
    uint64_t b = dataset(RANGE_SPEC(200));
    job(a, "train", SL_SHARDING_OFF, 0, NULL);
    uint64_t j2 = 0, c2 = 0;
    cr_assert_eq(job_rc(b, "train", SL_SHARDING_OFF, 1, &j2, &c2), SL_ECONFLICT);
    char want[128];
    snprintf(want, sizeof want, "dataset %" PRIu64 ", requested dataset %" PRIu64, a, b);
    cr_assert_not_null(strstr(err, want), "err: %s (want %s)", err, want);
    cr_assert_eq(stats().jobs_total, 1);
}

Test(state, job_of_unknown_dataset_is_not_found)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t j = 0, c = 0;
    cr_assert_eq(job_rc(ds + 1000, NULL, SL_SHARDING_OFF, 0, &j, &c), SL_ENOTFOUND);
    char want[64];
    snprintf(want, sizeof want, "dataset %" PRIu64 " ", ds + 1000);
    cr_assert_not_null(strstr(err, want), "err: %s", err);
    cr_assert_eq(job_rc(ds + 1000, "train", SL_SHARDING_OFF, 0, &j, &c), SL_ENOTFOUND);
    cr_assert_eq(stats().jobs_total, 0);
}

Test(state, static_policy_without_addresses_or_unknown_policy_is_invalid)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t j = 0, c = 0;
    cr_assert_eq(job_rc(ds, NULL, SL_SHARDING_FILE, 0, &j, &c), SL_EINVAL);
    cr_assert_not_null(strstr(err, "file"), "err: %s", err);
    cr_assert_eq(job_rc(ds, "train", SL_SHARDING_HINT, 0, &j, &c), SL_EINVAL);
    cr_assert_eq(job_rc(ds, NULL, (sl_sharding_t)99, 0, &j, &c), SL_EINVAL);
    cr_assert_eq(stats().jobs_total, 0);
}

Test(state, job_limit_forgets_only_ended_jobs)
{
    sl_dstate_config_t cfg;
    test_config(&cfg);
    cfg.max_jobs = 1;
    start(&cfg);
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t w = worker("w:1", 0);
    uint64_t c1;
    uint64_t j1 = job(ds, NULL, SL_SHARDING_OFF, 0, &c1);
    uint64_t j = 0, c = 0;
    cr_assert_eq(job_rc(ds, NULL, SL_SHARDING_OFF, 1, &j, &c), SL_ETOOBIG, "a running job is never dropped");

    sluice_TaskDef t = take_task(w, 2);
    report(w, t.task_id, SL_TASK_DONE, NULL, 3);
    cr_assert_eq(job_state(j1, c1, 4), SL_JOB_FINISHED);
    uint64_t j2 = job(ds, NULL, SL_SHARDING_OFF, 5, NULL);
    cr_assert_neq(j2, j1);
    cr_assert_eq(stats().jobs_total, 1);
    cr_assert_eq(client_hb(j1, c1, 6), SL_ENOTFOUND, "the finished job was forgotten");
}

Test(state, clients_per_job_limit)
{
    sl_dstate_config_t cfg;
    test_config(&cfg);
    cfg.max_clients_per_job = 2;
    start(&cfg);
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t c1;
    uint64_t j1 = job(ds, "train", SL_SHARDING_OFF, 0, &c1);
    job(ds, "train", SL_SHARDING_OFF, 0, NULL);
    uint64_t j = 0, c = 0;
    cr_assert_eq(job_rc(ds, "train", SL_SHARDING_OFF, 0, &j, &c), SL_ETOOBIG);
    /* A released lease makes room. */
    cr_assert_eq(release(j1, c1, 1), 0);
    cr_assert_eq(job(ds, "train", SL_SHARDING_OFF, 2, NULL), j1);
}

/* ---- tasks ------------------------------------------------------------- */

Test(state, each_live_worker_gets_one_task_of_a_new_job)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t w[3] = {worker("10.0.0.1:5060", 0), worker("10.0.0.2:5060", 0), worker("10.0.0.3:5060", 0)};
    uint64_t c;
    uint64_t j = job(ds, NULL, SL_SHARDING_DYNAMIC, 1, &c);

    sluice_TaskDef t[3];
    bool index_seen[3] = {false, false, false};
    for (int i = 0; i < 3; i++) {
        t[i] = take_task(w[i], 2);
        cr_assert_eq(t[i].job_id, j);
        cr_assert_eq(t[i].dataset_id, ds);
        cr_assert_eq(t[i].sharding, SL_SHARDING_DYNAMIC);
        cr_assert_eq(t[i].num_workers, 3);
        cr_assert_lt(t[i].worker_index, 3);
        cr_assert_not(index_seen[t[i].worker_index], "worker_index %u twice", t[i].worker_index);
        index_seen[t[i].worker_index] = true;
        for (int k = 0; k < i; k++)
            cr_assert_neq(t[i].task_id, t[k].task_id);
    }

    /* The client sees the same three tasks, with their workers. */
    cr_assert_eq(client_hb(j, c, 3), 0, "%s", err);
    cr_assert_eq(cresp->tasks_count, 3);
    for (int i = 0; i < 3; i++) {
        const sluice_TaskInfo *ti = NULL;
        for (pb_size_t k = 0; k < cresp->tasks_count; k++)
            if (cresp->tasks[k].task_id == t[i].task_id)
                ti = &cresp->tasks[k];
        cr_assert_not_null(ti, "task %" PRIu64 " missing", t[i].task_id);
        cr_assert_eq(ti->worker_id, w[i]);
        char addr[32];
        snprintf(addr, sizeof addr, "10.0.0.%d:5060", i + 1);
        cr_assert_str_eq(ti->worker_address, addr);
    }
}

Test(state, task_is_resent_until_reported_then_not)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t w = worker("w:1", 0);
    job(ds, NULL, SL_SHARDING_OFF, 0, NULL);
    sluice_TaskDef t = take_task(w, 1);
    /* The answer may have been lost: without a report the task goes out again. */
    sluice_TaskDef again = take_task(w, 2);
    cr_assert_eq(again.task_id, t.task_id);
    /* Reported: not again, and not removed while the job runs. */
    report(w, t.task_id, SL_TASK_RUNNING, NULL, 3);
    cr_assert_eq(wresp->new_tasks_count, 0);
    cr_assert_eq(wresp->removed_tasks_count, 0);
    report(w, t.task_id, SL_TASK_RUNNING, NULL, 4);
    cr_assert_eq(wresp->new_tasks_count, 0);
    cr_assert_eq(wresp->removed_tasks_count, 0);
    /* A heartbeat that leaves the running task out does not get it again either. */
    cr_assert_eq(worker_hb(w, 5, 0, NULL), 0, "%s", err);
    cr_assert_eq(wresp->new_tasks_count, 0);
}

Test(state, worker_gets_one_task_per_running_job)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t w = worker("w:1", 0);
    uint64_t j1 = job(ds, NULL, SL_SHARDING_OFF, 0, NULL);
    uint64_t j2 = job(ds, NULL, SL_SHARDING_DYNAMIC, 0, NULL);
    cr_assert_eq(worker_hb(w, 1, 0, NULL), 0, "%s", err);
    cr_assert_eq(wresp->new_tasks_count, 2);
    const sluice_TaskDef *a = &wresp->new_tasks[0], *b = &wresp->new_tasks[1];
    cr_assert((a->job_id == j1 && b->job_id == j2) || (a->job_id == j2 && b->job_id == j1));
    cr_assert_eq(a->job_id == j1 ? a->sharding : b->sharding, SL_SHARDING_OFF);
    cr_assert_eq(a->job_id == j2 ? a->sharding : b->sharding, SL_SHARDING_DYNAMIC);
    cr_assert_neq(a->task_id, b->task_id);
}

Test(state, worker_joining_a_running_job_gets_a_task)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t w1 = worker("w:1", 0);
    uint64_t c;
    uint64_t j = job(ds, "train", SL_SHARDING_DYNAMIC, 0, &c);
    sluice_TaskDef t1 = take_task(w1, 1);
    cr_assert_eq(t1.num_workers, 1);

    uint64_t w2 = worker("w:2", 2);
    sluice_TaskDef t2 = take_task(w2, 3);
    cr_assert_eq(t2.job_id, j);
    cr_assert_eq(t2.dataset_id, ds);
    cr_assert_eq(t2.sharding, SL_SHARDING_DYNAMIC);
    cr_assert_neq(t2.task_id, t1.task_id);
    cr_assert_neq(t2.worker_index, t1.worker_index);
    cr_assert_eq(t2.num_workers, 2);
    cr_assert_eq(client_hb(j, c, 4), 0, "%s", err);
    cr_assert_eq(cresp->tasks_count, 2);
    cr_assert(client_sees_task(t2.task_id));
}

Test(state, worker_joining_after_the_job_ended_gets_nothing)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t w1 = worker("w:1", 0);
    uint64_t c;
    uint64_t j = job(ds, NULL, SL_SHARDING_OFF, 0, &c);
    sluice_TaskDef t = take_task(w1, 1);
    report(w1, t.task_id, SL_TASK_DONE, NULL, 2);
    cr_assert_eq(job_state(j, c, 3), SL_JOB_FINISHED);
    uint64_t w2 = worker("w:2", 4);
    cr_assert_eq(worker_hb(w2, 5, 0, NULL), 0, "%s", err);
    cr_assert_eq(wresp->new_tasks_count, 0);
    cr_assert_eq(client_hb(j, c, 6), 0, "%s", err);
    cr_assert_eq(cresp->tasks_count, 1);
}

/* ---- DYNAMIC splits ---------------------------------------------------- */

/* Drains one epoch with two tasks taking turns, max 3 splits a call, and
 * checks that the splits tile [0, total) once: split_size each, the last
 * short. Split ids go to ids[*nids]. */
static void drain_epoch(uint64_t t1, uint64_t t2, uint64_t epoch, uint64_t total, uint64_t split_size,
                        uint64_t *ids, unsigned *nids)
{
    uint64_t next = 0;
    int calls = 0;
    for (;;) {
        cr_assert_lt(calls, 100, "epoch %" PRIu64 " never ends", epoch);
        uint64_t task = calls++ % 2 ? t2 : t1;
        int rc = splits(task, epoch, 3);
        cr_assert_eq(rc, 0, "get_splits epoch %" PRIu64 ": %d %s", epoch, rc, err);
        cr_assert_eq(sresp->epoch, epoch);
        if (sresp->end_of_epoch) {
            cr_assert_eq(sresp->splits_count, 0);
            break;
        }
        /* At most 3 (asked), and at most half a task's share of what is
         * left (2 live tasks: a quarter, rounded up). */
        uint64_t left = (total - next + split_size - 1) / split_size;
        uint64_t want = left < 3 ? left : 3, share = (left + 3) / 4;
        want = want < share ? want : share;
        cr_assert_eq(sresp->splits_count, want, "%u splits with %" PRIu64 " left",
                     (unsigned)sresp->splits_count, left);
        for (pb_size_t i = 0; i < sresp->splits_count; i++) {
            const sluice_Split *s = &sresp->splits[i];
            cr_assert_eq(s->begin, next, "split [%" PRIu64 ", %" PRIu64 ") after %" PRIu64, s->begin, s->end, next);
            uint64_t want = total - next < split_size ? total - next : split_size;
            cr_assert_eq(s->end - s->begin, want, "split [%" PRIu64 ", %" PRIu64 ")", s->begin, s->end);
            next = s->end;
            for (unsigned k = 0; k < *nids; k++)
                cr_assert_neq(ids[k], s->split_id, "split id %" PRIu64 " twice", s->split_id);
            ids[(*nids)++] = s->split_id;
        }
    }
    cr_assert_eq(next, total, "epoch %" PRIu64 " covered [0, %" PRIu64 ")", epoch, next);
    /* Both tasks now hear the end of this epoch. */
    cr_assert_eq(splits(t1, epoch, 3), 0);
    cr_assert(sresp->end_of_epoch);
    cr_assert_eq(sresp->splits_count, 0);
    cr_assert_eq(splits(t2, epoch, 3), 0);
    cr_assert(sresp->end_of_epoch);
}

Test(state, dynamic_splits_tile_each_epoch_exactly_once)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(10500));
    uint64_t w1 = worker("w:1", 0), w2 = worker("w:2", 0);
    job(ds, NULL, SL_SHARDING_DYNAMIC, 0, NULL);
    uint64_t t1 = take_task(w1, 1).task_id, t2 = take_task(w2, 1).task_id;

    uint64_t ids[64];
    unsigned nids = 0;
    drain_epoch(t1, t2, 0, 10500, 1000, ids, &nids);
    cr_assert_eq(nids, 11);
    drain_epoch(t1, t2, 1, 10500, 1000, ids, &nids);
    cr_assert_eq(nids, 22, "split ids are unique across epochs");
    drain_epoch(t2, t1, 2, 10500, 1000, ids, &nids);
    cr_assert_eq(nids, 33);
}

Test(state, dynamic_epochs_open_in_order)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(10500));
    uint64_t w1 = worker("w:1", 0), w2 = worker("w:2", 0);
    job(ds, NULL, SL_SHARDING_DYNAMIC, 0, NULL);
    uint64_t t1 = take_task(w1, 1).task_id, t2 = take_task(w2, 1).task_id;

    cr_assert_eq(splits(t1, 0, 1), 0, "%s", err);
    cr_assert_eq(sresp->splits_count, 1);
    cr_assert_eq(sresp->splits[0].begin, 0);
    cr_assert_eq(sresp->splits[0].end, 1000);

    /* Epoch 1 does not open while epoch 0 has splits left... */
    cr_assert_eq(splits(t2, 1, 1), SL_EINVAL);
    cr_assert_not_null(strstr(err, "epoch 0"), "err: %s", err);
    /* ...nor does any later one... */
    cr_assert_eq(splits(t2, 2, 1), SL_EINVAL);
    /* ...and asking did not disturb epoch 0. */
    /* (Two live tasks: each answer is at most half a task's share of the
     * splits left, rounded up: 3 of the 10 left, then fewer.) */
    uint64_t next = 1000;
    while (next < 10500) {
        cr_assert_eq(splits(t2, 0, 64), 0, "%s", err);
        cr_assert_gt(sresp->splits_count, 0);
        cr_assert_lt(sresp->splits_count, 4);
        cr_assert_eq(sresp->splits[0].begin, next);
        cr_assert_not(sresp->end_of_epoch);
        next = sresp->splits[sresp->splits_count - 1].end;
    }
    cr_assert_eq(next, 10500);

    /* Epoch 0 ran out: epoch 1 opens from the start. */
    cr_assert_eq(splits(t1, 1, 2), 0, "%s", err);
    cr_assert_eq(sresp->epoch, 1);
    cr_assert_eq(sresp->splits_count, 2);
    cr_assert_eq(sresp->splits[0].begin, 0);
    cr_assert_eq(sresp->splits[1].end, 2000);

    /* A task still in epoch 0 hears that it ended. */
    cr_assert_eq(splits(t2, 0, 4), 0, "%s", err);
    cr_assert(sresp->end_of_epoch);
    cr_assert_eq(sresp->epoch, 0);
    cr_assert_eq(sresp->splits_count, 0);

    /* epoch + 2 is refused, epoch + 1 before epoch 1 ran out too. */
    cr_assert_eq(splits(t1, 3, 1), SL_EINVAL);
    cr_assert_eq(splits(t1, 2, 1), SL_EINVAL);
    cr_assert_eq(splits(t2, 1, 1), 0, "%s", err);
    cr_assert_eq(sresp->splits_count, 1);
    cr_assert_eq(sresp->splits[0].begin, 2000, "epoch 1 carries on where it was");
}

Test(state, dynamic_split_count_bounds_and_element_count)
{
    start_default();
    /* range(0, 30000, 3) yields 10000 elements: splits count elements, not values. */
    uint64_t small = dataset("{\"source\": {\"type\": \"range\", \"stop\": 30000, \"step\": 3}}");
    uint64_t big = dataset(RANGE_SPEC(600000));
    uint64_t w = worker("w:1", 0);
    uint64_t js = job(small, NULL, SL_SHARDING_DYNAMIC, 0, NULL);
    job(big, NULL, SL_SHARDING_DYNAMIC, 0, NULL);
    cr_assert_eq(worker_hb(w, 1, 0, NULL), 0, "%s", err);
    cr_assert_eq(wresp->new_tasks_count, 2);
    uint64_t ts = wresp->new_tasks[0].job_id == js ? wresp->new_tasks[0].task_id : wresp->new_tasks[1].task_id;
    uint64_t tb = wresp->new_tasks[0].job_id == js ? wresp->new_tasks[1].task_id : wresp->new_tasks[0].task_id;

    /* max_splits 0 means one. */
    cr_assert_eq(splits(ts, 0, 0), 0, "%s", err);
    cr_assert_eq(sresp->splits_count, 1);
    cr_assert_eq(splits(ts, 0, 64), 0, "%s", err);
    cr_assert_eq(sresp->splits_count, 9);
    cr_assert_eq(sresp->splits[8].end, 10000);

    /* More than a response holds (GetSplitResponse.splits' max_count) is
     * cut to what it holds. */
    cr_assert_eq(splits(tb, 0, 1000), 0, "%s", err);
    cr_assert_eq(sresp->splits_count, 512);
    cr_assert_eq(sresp->splits[511].end, 512000);
    cr_assert_eq(splits(tb, 0, 1000), 0, "%s", err);
    cr_assert_eq(sresp->splits_count, 88);
    cr_assert_eq(sresp->splits[87].end, 600000);
}

Test(state, splits_of_a_non_dynamic_job_or_unknown_task_are_refused)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(10500));
    uint64_t w = worker("w:1", 0);
    job(ds, NULL, SL_SHARDING_OFF, 0, NULL);
    sluice_TaskDef t = take_task(w, 1);
    cr_assert_eq(splits(t.task_id, 0, 1), SL_EINVAL);
    cr_assert_not_null(strstr(err, "DYNAMIC"), "err: %s", err);
    cr_assert_eq(sresp->splits_count, 0);
    cr_assert_eq(splits(t.task_id + 1000, 0, 1), SL_ENOTFOUND);
}

Test(state, splits_of_an_ended_job_are_end_of_epoch)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(10500));
    uint64_t w1 = worker("w:1", 0), w2 = worker("w:2", 0);
    uint64_t c;
    uint64_t j = job(ds, NULL, SL_SHARDING_DYNAMIC, 0, &c);
    uint64_t t1 = take_task(w1, 1).task_id, t2 = take_task(w2, 1).task_id;
    report(w1, t1, SL_TASK_FAILED, "boom", 2);
    cr_assert_eq(job_state(j, c, 3), SL_JOB_FAILED);
    cr_assert_eq(splits(t2, 0, 4), 0, "%s", err);
    cr_assert(sresp->end_of_epoch);
    cr_assert_eq(sresp->splits_count, 0);
}

/* ---- completion -------------------------------------------------------- */

Test(state, job_finishes_only_when_every_task_is_done)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t w[3] = {worker("w:1", 0), worker("w:2", 0), worker("w:3", 0)};
    uint64_t c;
    uint64_t j = job(ds, "train", SL_SHARDING_OFF, 0, &c);
    uint64_t t[3];
    for (int i = 0; i < 3; i++) {
        t[i] = take_task(w[i], 1).task_id;
        report(w[i], t[i], SL_TASK_RUNNING, NULL, 2);
    }
    cr_assert_eq(job_state(j, c, 3), SL_JOB_RUNNING);
    report(w[0], t[0], SL_TASK_DONE, NULL, 4);
    cr_assert_eq(wresp->removed_tasks_count, 0, "the job still runs");
    cr_assert_eq(job_state(j, c, 5), SL_JOB_RUNNING);
    report(w[1], t[1], SL_TASK_DONE, NULL, 6);
    report(w[2], t[2], SL_TASK_RUNNING, NULL, 6);
    cr_assert_eq(job_state(j, c, 7), SL_JOB_RUNNING);
    cr_assert_eq(stats().jobs_running, 1);
    report(w[2], t[2], SL_TASK_DONE, NULL, 8);
    cr_assert_eq(job_state(j, c, 9), SL_JOB_FINISHED);
    cr_assert_eq(cresp->error[0], '\0');
    cr_assert_eq(stats().jobs_running, 0);
    cr_assert_eq(stats().jobs_total, 1);

    /* Each worker's next report of its task gets it removed. */
    for (int i = 0; i < 3; i++) {
        report(w[i], t[i], SL_TASK_DONE, NULL, 10);
        cr_assert(removed(t[i]), "worker %d: task not removed", i);
        cr_assert_eq(wresp->removed_tasks_count, 1);
        cr_assert_eq(wresp->new_tasks_count, 0);
    }
}

Test(state, task_done_before_its_first_report_finishes_the_job)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t w = worker("w:1", 0);
    uint64_t c;
    uint64_t j = job(ds, NULL, SL_SHARDING_OFF, 0, &c);
    sluice_TaskDef t = take_task(w, 1);
    report(w, t.task_id, SL_TASK_DONE, NULL, 2); /* ASSIGNED -> DONE */
    cr_assert_eq(job_state(j, c, 3), SL_JOB_FINISHED);
}

Test(state, failed_task_fails_the_job_with_the_workers_message)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t w1 = worker("10.1.1.1:5060", 0), w2 = worker("10.1.1.2:5060", 0);
    uint64_t c;
    uint64_t j = job(ds, NULL, SL_SHARDING_OFF, 0, &c);
    uint64_t t1 = take_task(w1, 1).task_id, t2 = take_task(w2, 1).task_id;
    report(w2, t2, SL_TASK_RUNNING, NULL, 2);
    const char *msg = "tfrecord: data crc mismatch in /data/a.tfrecord at offset 7735 (record 7)";
    report(w1, t1, SL_TASK_FAILED, msg, 3);

    cr_assert_eq(job_state(j, c, 4), SL_JOB_FAILED);
    cr_assert_not_null(strstr(cresp->error, msg), "error: %s", cresp->error);
    cr_assert_not_null(strstr(cresp->error, "10.1.1.1:5060"), "error names the worker: %s", cresp->error);
    cr_assert_eq(stats().jobs_running, 0);

    /* Both workers are told to drop their tasks; a late DONE changes nothing. */
    report(w1, t1, SL_TASK_FAILED, msg, 5);
    cr_assert(removed(t1));
    report(w2, t2, SL_TASK_DONE, NULL, 5);
    cr_assert(removed(t2));
    cr_assert_eq(job_state(j, c, 6), SL_JOB_FAILED);
}

/* A worker reports only its own tasks (ids are not capabilities): a
 * heartbeat that names another worker's task is refused whole, and changes
 * nothing; an unknown task (its job collected) is one to drop. */
Test(state, reports_of_foreign_tasks_are_refused_and_of_unknown_ones_removed)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t w1 = worker("w:1", 0), w2 = worker("w:2", 0);
    uint64_t c;
    uint64_t j = job(ds, NULL, SL_SHARDING_OFF, 0, &c);
    uint64_t t1 = take_task(w1, 1).task_id;
    uint64_t t2 = take_task(w2, 1).task_id;
    /* w2 claims w1's task done, and an unknown task. */
    report_t r[2] = {{987654, SL_TASK_RUNNING, NULL}, {t1, SL_TASK_DONE, NULL}};
    cr_assert_eq(worker_hb(w2, 2, 2, r), SL_EPERM);
    char want[128];
    snprintf(want, sizeof want, "worker %" PRIu64 " reported task %" PRIu64 ", which is not one of its tasks", w2,
             t1);
    cr_assert(strstr(err, want), "%s", err);
    cr_assert_eq(wresp->new_tasks_count + wresp->removed_tasks_count, 0, "a refused heartbeat answers nothing");
    report_t failed = {t1, SL_TASK_FAILED, "forged"};
    cr_assert_eq(worker_hb(w2, 2, 1, &failed), SL_EPERM);
    cr_assert_eq(job_state(j, c, 3), SL_JOB_RUNNING, "another worker cannot finish or fail w1's task");
    /* Its own heartbeat goes on as before. */
    report_t unknown = {987654, SL_TASK_RUNNING, NULL};
    cr_assert_eq(worker_hb(w2, 4, 1, &unknown), 0, "%s", err);
    cr_assert(removed(987654));
    cr_assert_eq(wresp->new_tasks_count, 1, "its own task is still to start");
    cr_assert_eq(wresp->new_tasks[0].task_id, t2);
    report(w1, t1, SL_TASK_RUNNING, NULL, 5);
    cr_assert_eq(job_state(j, c, 6), SL_JOB_RUNNING);
}

/* Two workers and an OFF job over a range of 100: each worker's task in
 * d1 and d2, the job's client in *c. @return the job's id */
static uint64_t two_workers_one_job(uint64_t *w1, uint64_t *w2, uint64_t *c, sluice_TaskDef *d1, sluice_TaskDef *d2)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(100));
    *w1 = worker("w:1", 0);
    *w2 = worker("w:2", 0);
    uint64_t j = job(ds, NULL, SL_SHARDING_OFF, 0, c);
    *d1 = take_task(*w1, 1);
    *d2 = take_task(*w2, 1);
    return j;
}

/* A state restored from a backup gives the lost state's ids out again: a
 * worker's task of the lost state (another job nonce) under an id this
 * state gave one of its own is removed, not taken for it, and the task is
 * handed out again; a report without a nonce (a worker before nonces) is
 * taken as before; a task of another worker's id is removed too, and does
 * not make the heartbeat refused. Each job has a nonce of its own, and its
 * tasks' keys are derived with it (test_fault_tolerance.py restores a real
 * backup). */
Test(state, a_task_of_a_restored_states_lost_ids_is_removed_and_handed_out_again)
{
    uint64_t w1, w2, c;
    sluice_TaskDef d1, d2;
    uint64_t j = two_workers_one_job(&w1, &w2, &c, &d1, &d2);
    uint64_t ds = dataset(RANGE_SPEC(100)); /* the job's: one spec, one dataset */
    cr_assert_neq(d1.job_nonce, 0);
    cr_assert_eq(d1.job_nonce, d2.job_nonce, "one job, one nonce");
    /* w1 reports a task of d1's id and another nonce: removed, and d1 again. */
    memset(wreq, 0, sizeof *wreq);
    wreq->worker_id = w1;
    wreq->tasks_count = 1;
    wreq->tasks[0] = (sluice_TaskStatus){.task_id = d1.task_id, .state = SL_TASK_RUNNING,
                                         .job_nonce = d1.job_nonce ^ 1};
    memset(wresp, 0, sizeof *wresp);
    cr_assert_eq(sl_dstate_worker_heartbeat(st, wreq, 2, wresp, err, sizeof err), 0, "%s", err);
    cr_assert(removed(d1.task_id));
    cr_assert_eq(wresp->new_tasks_count, 1);
    cr_assert_eq(wresp->new_tasks[0].task_id, d1.task_id);
    cr_assert_eq(wresp->new_tasks[0].job_nonce, d1.job_nonce);
    cr_assert_arr_eq(wresp->new_tasks[0].task_key, d1.task_key, 16);
    /* w2 reports a task of w1's id with another nonce: not w1's task, so
     * not refused as another worker's; removed. */
    wreq->worker_id = w2;
    wreq->tasks[0].task_id = d1.task_id;
    memset(wresp, 0, sizeof *wresp);
    cr_assert_eq(sl_dstate_worker_heartbeat(st, wreq, 2, wresp, err, sizeof err), 0, "%s", err);
    cr_assert(removed(d1.task_id));
    /* The right nonce, and none at all, are the task itself. */
    wreq->worker_id = w1;
    wreq->tasks[0].job_nonce = d1.job_nonce;
    memset(wresp, 0, sizeof *wresp);
    cr_assert_eq(sl_dstate_worker_heartbeat(st, wreq, 3, wresp, err, sizeof err), 0, "%s", err);
    cr_assert_eq(wresp->removed_tasks_count + wresp->new_tasks_count, 0);
    report(w2, d2.task_id, SL_TASK_RUNNING, NULL, 3);
    cr_assert_eq(wresp->removed_tasks_count + wresp->new_tasks_count, 0);
    /* A second job's capabilities differ from the first's for the same ids
     * as far as the ids go: its nonce is its own. */
    uint64_t c2;
    uint64_t j2 = job(ds, NULL, SL_SHARDING_OFF, 4, &c2);
    sluice_TaskDef e1 = take_task(w1, 5);
    cr_assert_neq(e1.job_nonce, d1.job_nonce);
    uint8_t want[16];
    sl_dstate_task_key(st, e1.task_id, want);
    cr_assert_arr_eq(e1.task_key, want, 16);
    cr_assert_eq(client_hb(j2, c2, 6), 0, "%s", err);
    cr_assert_eq(client_hb(j, c, 6), 0, "%s", err);
}

/* ---- timeouts ---------------------------------------------------------- */

Test(state, silent_worker_is_lost_and_the_job_finishes_without_it)
{
    start_default(); /* worker_timeout_ms 100 */
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t w1 = worker("w:1", 0), w2 = worker("w:2", 0), w3 = worker("w:3", 0);
    uint64_t c;
    uint64_t j = job(ds, NULL, SL_SHARDING_OFF, 0, &c);
    uint64_t t1 = take_task(w1, 10).task_id, t2 = take_task(w2, 10).task_id, t3 = take_task(w3, 10).task_id;
    report(w1, t1, SL_TASK_RUNNING, NULL, 80);
    report(w2, t2, SL_TASK_RUNNING, NULL, 80);

    sl_dstate_tick(st, 110); /* w3: 100 ms since its heartbeat, not more */
    cr_assert_eq(stats().workers_live, 3);
    sl_dstate_tick(st, 111);
    cr_assert_eq(stats().workers_live, 2);

    cr_assert_eq(worker_hb(w3, 112, 0, NULL), SL_ENOTFOUND);
    cr_assert_not_null(strstr(err, "register again"), "err: %s", err);
    cr_assert_eq(client_hb(j, c, 112), 0, "%s", err);
    cr_assert_eq(cresp->tasks_count, 2);
    cr_assert(client_sees_task(t1));
    cr_assert(client_sees_task(t2));
    cr_assert_not(client_sees_task(t3));

    report(w1, t1, SL_TASK_DONE, NULL, 120);
    cr_assert_eq(job_state(j, c, 121), SL_JOB_RUNNING);
    report(w2, t2, SL_TASK_DONE, NULL, 130);
    cr_assert_eq(job_state(j, c, 131), SL_JOB_FINISHED);
}

Test(state, losing_the_last_unfinished_task_finishes_the_job)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t w1 = worker("w:1", 0), w2 = worker("w:2", 0);
    uint64_t c;
    uint64_t j = job(ds, NULL, SL_SHARDING_OFF, 0, &c);
    uint64_t t1 = take_task(w1, 1).task_id;
    take_task(w2, 1);
    report(w1, t1, SL_TASK_DONE, NULL, 90);
    cr_assert_eq(job_state(j, c, 90), SL_JOB_RUNNING);
    sl_dstate_tick(st, 102); /* w2 lost, w1 heard at 90 */
    cr_assert_eq(stats().workers_live, 1);
    cr_assert_eq(job_state(j, c, 103), SL_JOB_FINISHED);
    cr_assert_eq(cresp->tasks_count, 1);
    cr_assert_eq(cresp->tasks[0].task_id, t1);
}

Test(state, restart_of_the_last_unfinished_worker_finishes_the_job)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t w1 = worker("w:1", 0), w2 = worker("w:2", 0);
    uint64_t c;
    uint64_t j = job(ds, NULL, SL_SHARDING_OFF, 0, &c);
    uint64_t t1 = take_task(w1, 1).task_id;
    take_task(w2, 1);
    report(w1, t1, SL_TASK_DONE, NULL, 2);
    uint64_t w2b = worker("w:2", 3);
    cr_assert_eq(job_state(j, c, 4), SL_JOB_FINISHED);
    cr_assert_eq(worker_hb(w2b, 5, 0, NULL), 0, "%s", err);
    cr_assert_eq(wresp->new_tasks_count, 0, "a finished job has no task for the restarted worker");
}

Test(state, report_with_an_unknown_state_still_acknowledges_the_task)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t w = worker("w:1", 0);
    uint64_t c;
    uint64_t j = job(ds, NULL, SL_SHARDING_OFF, 0, &c);
    sluice_TaskDef t = take_task(w, 1);
    report(w, t.task_id, (sl_task_state_t)7, NULL, 2);
    cr_assert_eq(wresp->new_tasks_count, 0, "the worker has the task: it is not sent again");
    cr_assert_eq(wresp->removed_tasks_count, 0);
    cr_assert_eq(job_state(j, c, 3), SL_JOB_RUNNING);
    report(w, t.task_id, SL_TASK_DONE, NULL, 4);
    cr_assert_eq(job_state(j, c, 5), SL_JOB_FINISHED);
}

Test(state, job_whose_tasks_are_all_lost_waits_for_a_new_worker)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t w1 = worker("w:1", 0);
    uint64_t c;
    uint64_t j = job(ds, NULL, SL_SHARDING_OFF, 0, &c);
    take_task(w1, 1);
    sl_dstate_tick(st, 150);
    cr_assert_eq(stats().workers_live, 0);
    cr_assert_eq(job_state(j, c, 150), SL_JOB_RUNNING, "no task finished: the job is not done");
    cr_assert_eq(cresp->tasks_count, 0);
    uint64_t w2 = worker("w:2", 160);
    sluice_TaskDef t = take_task(w2, 161);
    cr_assert_eq(t.job_id, j);
    report(w2, t.task_id, SL_TASK_DONE, NULL, 170);
    cr_assert_eq(job_state(j, c, 171), SL_JOB_FINISHED);
}

Test(state, client_without_heartbeat_loses_its_lease)
{
    start_default(); /* client_timeout_ms 200 */
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t c1, c2;
    uint64_t j = job(ds, "train", SL_SHARDING_OFF, 0, &c1);
    job(ds, "train", SL_SHARDING_OFF, 0, &c2);
    cr_assert_eq(client_hb(j, c1, 150), 0, "%s", err);
    cr_assert_eq(client_hb(j, c2, 300), 0, "%s", err);
    sl_dstate_tick(st, 350); /* c1: 200 ms, not more */
    cr_assert_eq(client_hb(j, c1, 350), 0, "%s", err);
    sl_dstate_tick(st, 551); /* c1: 201 ms; c2: 251 ms */
    cr_assert_eq(client_hb(j, c1, 551), SL_ENOTFOUND);
    cr_assert_not_null(strstr(err, "released after 200 ms"), "err: %s", err);
    cr_assert_eq(client_hb(j, c2, 551), SL_ENOTFOUND);
    cr_assert_not_null(strstr(err, "released"), "err: %s", err);
}

Test(state, heartbeating_client_keeps_its_lease_and_job)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t c;
    uint64_t j = job(ds, NULL, SL_SHARDING_OFF, 0, &c);
    for (int64_t now = 100; now <= 5000; now += 100) {
        cr_assert_eq(client_hb(j, c, now), 0, "at %" PRId64 ": %s", now, err);
        sl_dstate_tick(st, now + 50);
    }
    cr_assert_eq(job_state(j, c, 5100), SL_JOB_RUNNING);
    cr_assert_eq(stats().jobs_running, 1);
}

/* A named job that its clients left waits job_gc_timeout_ms for one to
 * join again (a trainer restarted). */
Test(state, job_without_clients_is_cancelled_after_gc_timeout)
{
    start_default(); /* job_gc_timeout_ms 500 */
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t w = worker("w:1", 0);
    uint64_t c;
    uint64_t j = job(ds, "train", SL_SHARDING_DYNAMIC, 0, &c);
    uint64_t t = take_task(w, 1).task_id;
    cr_assert_eq(release(j, c, 10), 0);

    report(w, t, SL_TASK_RUNNING, NULL, 500);
    sl_dstate_tick(st, 510); /* idle 500 ms, not more */
    cr_assert_eq(stats().jobs_running, 1);
    report(w, t, SL_TASK_RUNNING, NULL, 510);
    cr_assert_eq(wresp->removed_tasks_count, 0);

    sl_dstate_tick(st, 511);
    cr_assert_eq(stats().jobs_running, 0);
    cr_assert_eq(stats().jobs_total, 1);
    report(w, t, SL_TASK_RUNNING, NULL, 512);
    cr_assert(removed(t), "the cancelled job's task is dropped");
    cr_assert_eq(splits(t, 0, 1), 0, "%s", err);
    cr_assert(sresp->end_of_epoch, "a cancelled job hands out no splits");
}

/* Nobody can join an anonymous job: once its one client released it, it
 * ends at once, and its workers drop its tasks (and give back the memory
 * of the batches they buffered) at their next heartbeat rather than
 * job_gc_timeout_ms later. One that ended before stays as it ended. */
Test(state, an_anonymous_job_released_by_its_client_ends_at_once)
{
    start_default(); /* job_gc_timeout_ms 500 */
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t w = worker("w:1", 0);
    uint64_t c;
    uint64_t j = job(ds, NULL, SL_SHARDING_DYNAMIC, 0, &c);
    uint64_t t = take_task(w, 1).task_id;
    cr_assert_eq(release(j, c, 10), 0);
    cr_assert_eq(stats().jobs_running, 0, "the released anonymous job still runs");
    json_t *v = sl_dstate_job_json(st, j, 10);
    cr_assert_str_eq(json_string_value(json_object_get(v, "error")), "its client released it before its end");
    cr_assert_not_null(json_object_get(json_object_get(v, "splits"), "epochs_done"),
                       "an ended DYNAMIC job says how many epochs were done when it ended");
    json_decref(v);
    report(w, t, SL_TASK_RUNNING, NULL, 11);
    cr_assert(removed(t), "the ended job's task is dropped at the worker's next heartbeat");
    cr_assert_eq(splits(t, 0, 1), 0, "%s", err);
    cr_assert(sresp->end_of_epoch, "an ended job hands out no splits");
    /* A job that finished before its client left stays FINISHED. */
    uint64_t j2 = job(ds, NULL, SL_SHARDING_OFF, 20, &c);
    uint64_t t2 = take_task(w, 21).task_id;
    report(w, t2, SL_TASK_DONE, NULL, 22);
    cr_assert_eq(job_state(j2, c, 23), SL_JOB_FINISHED);
    cr_assert_eq(release(j2, c, 24), 0);
    cr_assert_eq(stats().jobs_running, 0);
    cr_assert_eq(stats().jobs_total, 2);
}

Test(state, job_whose_client_expired_is_cancelled_after_gc_timeout)
{
    start_default(); /* client 200 ms, gc 500 ms */
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t c;
    uint64_t j = job(ds, "train", SL_SHARDING_OFF, 0, &c);
    sl_dstate_tick(st, 201); /* the lease ends here: idle from 201 */
    cr_assert_eq(client_hb(j, c, 201), SL_ENOTFOUND);
    sl_dstate_tick(st, 701);
    cr_assert_eq(stats().jobs_running, 1);
    sl_dstate_tick(st, 702);
    cr_assert_eq(stats().jobs_running, 0);
}

Test(state, client_joining_an_idle_job_saves_it)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t c1;
    uint64_t j = job(ds, "train", SL_SHARDING_OFF, 0, &c1);
    cr_assert_eq(release(j, c1, 0), 0);
    sl_dstate_tick(st, 400);
    uint64_t c2;
    cr_assert_eq(job(ds, "train", SL_SHARDING_OFF, 450, &c2), j);
    sl_dstate_tick(st, 600); /* 600 ms since the first left, but a client is there */
    cr_assert_eq(job_state(j, c2, 600), SL_JOB_RUNNING);
}

Test(state, release_ends_a_lease_and_unknown_ones_are_not_found)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t c1, c2;
    uint64_t j = job(ds, "train", SL_SHARDING_OFF, 0, &c1);
    job(ds, "train", SL_SHARDING_OFF, 0, &c2);
    cr_assert_eq(release(j, c1, 1), 0);
    cr_assert_eq(client_hb(j, c1, 2), SL_ENOTFOUND);
    cr_assert_eq(client_hb(j, c2, 2), 0, "the other lease stays: %s", err);
    cr_assert_eq(release(j, c1, 3), SL_ENOTFOUND);
    cr_assert_eq(release(j, 424242, 3), SL_ENOTFOUND);
    cr_assert_eq(release(j + 1000, c2, 3), SL_ENOTFOUND);
    cr_assert_eq(client_hb(j + 1000, c2, 3), SL_ENOTFOUND);
    cr_assert_eq(release(j, c2, 4), 0);
}

/* ---- workers ----------------------------------------------------------- */

Test(state, same_address_again_loses_the_old_worker)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t old = worker("10.0.0.9:5060", 0);
    uint64_t c;
    uint64_t j = job(ds, NULL, SL_SHARDING_OFF, 0, &c);
    uint64_t t_old = take_task(old, 1).task_id;

    uint64_t fresh = worker("10.0.0.9:5060", 2);
    cr_assert_neq(fresh, old);
    cr_assert_eq(worker_hb(old, 3, 0, NULL), SL_ENOTFOUND);
    cr_assert_eq(stats().workers_live, 1);

    sluice_TaskDef t = take_task(fresh, 3);
    cr_assert_neq(t.task_id, t_old);
    cr_assert_eq(t.job_id, j);
    cr_assert_eq(client_hb(j, c, 4), 0, "%s", err);
    cr_assert_eq(cresp->tasks_count, 1);
    cr_assert_eq(cresp->tasks[0].task_id, t.task_id);
    cr_assert_eq(cresp->tasks[0].worker_id, fresh);
    cr_assert_eq(cresp->job_state, SL_JOB_RUNNING);
}

Test(state, worker_limit_counts_live_workers_only)
{
    sl_dstate_config_t cfg;
    test_config(&cfg);
    cfg.max_workers = 2;
    start(&cfg);
    uint64_t w1 = worker("w:1", 0);
    worker("w:2", 50);
    uint64_t id = 0;
    cr_assert_eq(sl_dstate_worker_register(st, "w:3", 60, &id, err, sizeof err), SL_ETOOBIG);
    cr_assert_not_null(strstr(err, "w:3"), "err: %s", err);
    /* A restart of a known address is no new worker. */
    uint64_t w2b = worker("w:2", 70);
    sl_dstate_tick(st, 101); /* w1 lost */
    cr_assert_eq(worker_hb(w1, 101, 0, NULL), SL_ENOTFOUND);
    uint64_t w3 = worker("w:3", 102);
    cr_assert_neq(w3, w1);
    cr_assert_eq(stats().workers_live, 2);
    cr_assert_eq(worker_hb(w2b, 103, 0, NULL), 0, "%s", err);
    cr_assert_eq(worker_hb(w3, 103, 0, NULL), 0, "%s", err);
}

Test(state, unknown_worker_heartbeat_is_not_found)
{
    start_default();
    cr_assert_eq(worker_hb(77, 0, 0, NULL), SL_ENOTFOUND);
    cr_assert_not_null(strstr(err, "77"), "err: %s", err);
}

/* ---- counts ------------------------------------------------------------ */

Test(state, stats_count_live_workers_datasets_and_jobs)
{
    start_default();
    sl_dstate_stats_t s = stats();
    cr_assert_eq(s.workers_live, 0);
    cr_assert_eq(s.datasets, 0);
    cr_assert_eq(s.jobs_running, 0);
    cr_assert_eq(s.jobs_total, 0);

    uint64_t a = dataset(RANGE_SPEC(10)), b = dataset(RANGE_SPEC(20));
    dataset(RANGE_SPEC(10));
    uint64_t w1 = worker("w:1", 0), w2 = worker("w:2", 0);
    uint64_t c1, c2;
    uint64_t j1 = job(a, NULL, SL_SHARDING_OFF, 0, &c1);
    job(b, "train", SL_SHARDING_DYNAMIC, 0, &c2);
    job(b, "train", SL_SHARDING_DYNAMIC, 0, NULL);
    s = stats();
    cr_assert_eq(s.workers_live, 2);
    cr_assert_eq(s.datasets, 2);
    cr_assert_eq(s.jobs_running, 2);
    cr_assert_eq(s.jobs_total, 2);

    /* Finish j1: both workers report its task done. */
    cr_assert_eq(worker_hb(w1, 10, 0, NULL), 0, "%s", err);
    report_t r1 = {wresp->new_tasks[0].job_id == j1 ? wresp->new_tasks[0].task_id : wresp->new_tasks[1].task_id,
                   SL_TASK_DONE, NULL};
    cr_assert_eq(worker_hb(w2, 10, 0, NULL), 0, "%s", err);
    report_t r2 = {wresp->new_tasks[0].job_id == j1 ? wresp->new_tasks[0].task_id : wresp->new_tasks[1].task_id,
                   SL_TASK_DONE, NULL};
    cr_assert_eq(worker_hb(w1, 20, 1, &r1), 0, "%s", err);
    cr_assert_eq(worker_hb(w2, 20, 1, &r2), 0, "%s", err);
    s = stats();
    cr_assert_eq(s.jobs_running, 1);
    cr_assert_eq(s.jobs_total, 2);

    sl_dstate_tick(st, 110); /* w1 and w2 heard at 20: not lost yet */
    cr_assert_eq(stats().workers_live, 2);
    cr_assert_eq(worker_hb(w2, 110, 0, NULL), 0, "%s", err);
    sl_dstate_tick(st, 121);
    s = stats();
    cr_assert_eq(s.workers_live, 1);
    cr_assert_eq(s.datasets, 2);
}

Test(state, config_is_copied)
{
    sl_dstate_config_t cfg;
    test_config(&cfg);
    cfg.max_workers = 3;
    start(&cfg);
    cfg.max_workers = 99;
    const sl_dstate_config_t *got = sl_dstate_config(st);
    cr_assert_eq(got->max_workers, 3);
    cr_assert_eq(got->worker_timeout_ms, 100);
    cr_assert_eq(got->split_size, 1000);

    sl_dstate_config_t def;
    sl_dstate_config_init(&def);
    cr_assert_gt(def.worker_timeout_ms, 0);
    cr_assert_gt(def.client_timeout_ms, 0);
    cr_assert_gt(def.job_gc_timeout_ms, 0);
    cr_assert_gt(def.split_size, 0);
    cr_assert_gt(def.max_workers, 0);
    cr_assert_gt(def.max_datasets, 0);
    cr_assert_gt(def.max_jobs, 0);
    cr_assert_gt(def.max_clients_per_job, 0);
}

/* ---- bugs -------------------------------------------------------------- */

/*
 * Regression: jobs once pointed into the datasets array, which grow()
 * reallocs; registering a 9th dataset left every older job with a dangling
 * pointer (wrong dataset ids in heartbeats, freed cardinality in
 * get_splits, SL_ECONFLICT when joining the job by name).
 */
Test(state, job_survives_registration_of_more_datasets)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(10500));
    uint64_t w = worker("w:1", 0);
    uint64_t j = job(ds, "train", SL_SHARDING_DYNAMIC, 0, NULL);
    for (int i = 1; i <= 8; i++) {
        char spec[128];
        snprintf(spec, sizeof spec, "{\"source\": {\"type\": \"range\", \"stop\": %d}}", i);
        dataset(spec);
    }
    cr_assert_eq(stats().datasets, 9);

    sluice_TaskDef t = take_task(w, 1);
    cr_assert_eq(t.dataset_id, ds);
    cr_assert_eq(splits(t.task_id, 0, 64), 0, "%s", err);
    cr_assert_eq(sresp->splits_count, 11);
    cr_assert_eq(sresp->splits[10].end, 10500);
    uint64_t j2 = 0, c2 = 0;
    int rc = job_rc(ds, "train", SL_SHARDING_DYNAMIC, 2, &j2, &c2);
    cr_assert_eq(rc, 0, "joining the job on its own dataset: %d %s", rc, err);
    cr_assert_eq(j2, j);
}

/* ---- split size and batches -------------------------------------------- */

/* With split_size 1000 and a batch of 300 right after the source (a shuffle
 * between them keeps every element), splits are 1200 long: each worker
 * then builds only full batches from its run of splits. */
Test(state, dynamic_splits_are_rounded_up_to_the_batch_size)
{
    uint64_t task = lone_dynamic_task("{\"source\": {\"type\": \"range\", \"stop\": 5000}, \"ops\": ["
                                      "{\"op\": \"shuffle\", \"buffer_size\": 10}, {\"op\": \"batch\", "
                                      "\"batch_size\": 300}]}");
    cr_assert_eq(splits(task, 0, 64), 0, "%s", err);
    cr_assert_eq(sresp->splits_count, 5);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(sresp->splits[i].end - sresp->splits[i].begin, 1200, "split %d", i);
    cr_assert_eq(sresp->splits[4].begin, 4800);
    cr_assert_eq(sresp->splits[4].end, 5000);
}

/* Starts a state whose splits are at least 1024 records and at most most,
 * and never held back for clients (none confirms here). */
static void start_guided(uint64_t most)
{
    sl_dstate_config_t cfg;
    test_config(&cfg);
    cfg.split_size = 1024;
    cfg.max_split_size = most;
    cfg.max_outstanding = 1u << 30;
    start(&cfg);
}

/* The length split_length() gives a split asked for with want records
 * (0: no wish), of the least size min and --max-split-size most, with rest
 * of an epoch of total records left for live (2 or more) tasks: the wish
 * within most, at most 1/8 of a live task's share of rest but not below an
 * eighth of the wish (or the whole share, when that is less, but not below
 * a crumb: 1/live of that eighth, at most total / (2 live)), a multiple of
 * min and at least min; all of rest (rounded up to min, within most) when
 * less than a crumb would be left. */
static uint64_t expected_split(uint64_t want, uint64_t min, uint64_t most, uint64_t total, uint64_t rest,
                               unsigned live)
{
    if (want <= min)
        return min;
    uint64_t w = want > most ? most : want, guided = rest / (8 * (uint64_t)live);
    uint64_t share = rest / live, crumb = w / 8 / live;
    if (crumb > total / (2 * (uint64_t)live))
        crumb = total / (2 * (uint64_t)live);
    uint64_t at_least = w / 8 <= share ? w / 8 : share > crumb ? share : crumb;
    if (guided < at_least)
        guided = at_least;
    w = w > guided ? guided : w;
    if (w >= rest || rest - w < crumb) {
        if (rest <= most)
            return (rest + min - 1) / min * min;
        w = most;
    }
    w = w / min * min;
    return w > min ? w : min;
}

/* Splits as long as the workers ask: multiples of the least split size
 * (1100: 1024 rounded up to the batch of 100), at most --max-split-size and
 * 1/8 of a live task's share of what is left but not below an eighth of
 * the wish (within --max-split-size) or the whole share (expected_split()),
 * at most half that share in one answer, the least for a task that asks for no length; and whatever
 * they ask, the splits tile every epoch exactly once. */
Test(state, splits_sized_by_the_workers_wish_stay_in_bounds_and_tile_each_epoch_once)
{
    sl_dstate_config_t cfg;
    test_config(&cfg);
    cfg.split_size = 1024;
    cfg.max_split_size = 55000; /* 50 of the least */
    start(&cfg);
    enum { TOTAL = 2000000, MIN = 1100 };
    uint64_t ds = dataset("{\"source\": {\"type\": \"range\", \"stop\": 2000000}, \"ops\": ["
                          "{\"op\": \"batch\", \"batch_size\": 100}]}");
    uint64_t w1 = worker("w:1", 0), w2 = worker("w:2", 0);
    job(ds, NULL, SL_SHARDING_DYNAMIC, 0, NULL);
    uint64_t t[2] = {take_task(w1, 1).task_id, take_task(w2, 1).task_id};
    static const uint64_t wishes[] = {0, 1, 500, 1100, 4000, 33333, 1000000, UINT64_C(1) << 62};
    uint64_t rng = 12345;
    for (uint64_t epoch = 0; epoch < 2; epoch++) {
        uint64_t next = 0, longest = 0;
        for (int calls = 0;; calls++) {
            cr_assert_lt(calls, 10000, "epoch %" PRIu64 " never ends", epoch);
            rng = rng * 6364136223846793005u + 1442695040888963407u;
            uint64_t want = wishes[(rng >> 33) % (sizeof wishes / sizeof wishes[0])];
            uint32_t max = 1 + (uint32_t)((rng >> 20) % 8);
            cr_assert_eq(splits_of(t[calls % 2], epoch, max, want), 0, "%s", err);
            if (sresp->end_of_epoch)
                break;
            uint64_t left = TOTAL - next, share = (left + 3) / 4, given = 0;
            cr_assert_gt(sresp->splits_count, 0);
            cr_assert_leq(sresp->splits_count, max);
            for (pb_size_t i = 0; i < sresp->splits_count; i++) {
                const sluice_Split *s = &sresp->splits[i];
                uint64_t len = s->end - s->begin, rest = TOTAL - next;
                cr_assert_eq(s->begin, next, "split [%" PRIu64 ", %" PRIu64 ") after %" PRIu64, s->begin, s->end,
                             next);
                cr_assert_eq(s->epoch, epoch);
                if (s->end < TOTAL) {
                    cr_assert_eq(len % MIN, 0, "split of %" PRIu64 " records", len);
                    cr_assert_eq(len, expected_split(want, MIN, 55000, TOTAL, rest, 2),
                                 "wish %" PRIu64 ", %" PRIu64 " left: %" PRIu64, want, rest, len);
                }
                if (i > 0)
                    cr_assert_lt(given, share, "past half a task's share in one answer");
                given += len;
                next = s->end;
                longest = len > longest ? len : longest;
            }
        }
        cr_assert_eq(next, TOTAL, "epoch %" PRIu64 " covered [0, %" PRIu64 ")", epoch, next);
        cr_assert_eq(longest, 55000, "no split reached --max-split-size");
    }
}

/* The same bounds at the sizes users run, seeded: each round draws the
 * live tasks (2 to 64), the epoch (up to 2^33 records), --max-split-size
 * and, request by request, the task that asks, its wish and how many
 * splits it takes. Every split is exactly split_length()'s length (its wish
 * within --max-split-size, at most 1/8 of a live task's share of what is
 * left, not below an eighth of the wish unless that is past the share, a
 * multiple of the least), an answer past its first split stays within half
 * a task's share, and the splits tile the epoch once. SLUICE_TEST_SEED
 * repeats a run. */
Test(state, guided_splits_at_user_sizes_keep_their_bounds_and_tile_each_epoch_once)
{
    unsigned seed = test_seed("state.guided_splits_at_user_sizes_keep_their_bounds_and_tile_each_epoch_once");
    uint64_t rng = seed;
    enum { MIN = 1024 };
    for (int round = 0; round < 24; round++) {
        unsigned live = 2 + (unsigned)(splitmix64(&rng) % 63);
        uint64_t total = UINT64_C(1) << (20 + splitmix64(&rng) % 13); /* 2^20 to 2^33 */
        total += splitmix64(&rng) % total;
        uint64_t most = UINT64_C(1) << (14 + splitmix64(&rng) % 9); /* --max-split-size 2^14 to 2^22 */
        start_guided(most);
        char spec[128];
        snprintf(spec, sizeof spec, "{\"source\": {\"type\": \"range\", \"stop\": %" PRIu64 "}}", total);
        uint64_t ds = dataset(spec);
        uint64_t *tasks = calloc(live, sizeof *tasks);
        cr_assert_not_null(tasks);
        dynamic_job_on(ds, live, 0, tasks);
        /* Each task keeps one wish, at or past --max-split-size (a fast
         * pipeline) or below it; a few requests carry none. */
        uint64_t *wish = calloc(live, sizeof *wish);
        cr_assert_not_null(wish);
        for (unsigned i = 0; i < live; i++)
            wish[i] = splitmix64(&rng) % 2 ? most << (splitmix64(&rng) % 4) : MIN + splitmix64(&rng) % most;
        uint64_t next = 0, answers = 0;
        for (;;) {
            unsigned k = (unsigned)(splitmix64(&rng) % live);
            uint64_t want = splitmix64(&rng) % 50 == 0 ? 0 : wish[k];
            uint32_t max = 1 + (uint32_t)(splitmix64(&rng) % 16);
            cr_assert_eq(splits_of(tasks[k], 0, max, want), 0, "seed %u: %s", seed, err);
            if (sresp->end_of_epoch)
                break;
            answers++;
            cr_assert_lt(answers, 200000, "seed %u round %d: the epoch never ends", seed, round);
            uint64_t left = total - next, share = (left + 2 * live - 1) / (2 * live), given = 0;
            cr_assert(sresp->splits_count > 0 && sresp->splits_count <= max);
            for (pb_size_t i = 0; i < sresp->splits_count; i++) {
                const sluice_Split *sp = &sresp->splits[i];
                uint64_t len = sp->end - sp->begin, rest = total - next;
                cr_assert_eq(sp->begin, next, "seed %u round %d: a split at %" PRIu64 " after %" PRIu64, seed, round,
                             sp->begin, next);
                uint64_t expect = expected_split(want, MIN, most, total, rest, live);
                if (expect > rest)
                    expect = rest;
                cr_assert_eq(len, expect,
                             "seed %u round %d (%u tasks, %" PRIu64 " records, most %" PRIu64 "): wish %" PRIu64
                             ", %" PRIu64 " left: %" PRIu64 " records",
                             seed, round, live, total, most, want, rest, len);
                if (i > 0)
                    cr_assert_lt(given, share, "seed %u: past half a task's share in one answer", seed);
                given += len;
                next = sp->end;
            }
        }
        cr_assert_eq(next, total, "seed %u round %d: the epoch covered [0, %" PRIu64 ")", seed, round, next);
        cr_log_info("seed %u round %d: %u tasks, %" PRIu64 " records, --max-split-size %" PRIu64 ": %" PRIu64
                    " answers", seed, round, live, total, most, answers);
        free(wish);
        free(tasks);
        sl_dstate_free(st);
        st = NULL;
    }
}

/* The end of an epoch read by two tasks at full speed, as the bench reads
 * it (40,000,000 records, --max-split-size 1048576, each task asking for 4
 * splits of 4,000,000 records at a time, by turns): once less than a floor
 * split (an eighth of the wish) per task is left, no split is below a crumb
 * (1/2 of that floor) but the one that ends the epoch, and the epoch ends
 * in at most 3 answers. Bounded by the share alone, each answer took half
 * of what the one before left: 10 answers, down to 512 records. */
Test(state, the_end_of_an_epoch_is_handed_out_in_crumbs_not_halvings)
{
    start_guided(1048576);
    enum { TOTAL = 40000000, FLOOR = 1048576 / 8, CRUMB = FLOOR / 2 };
    uint64_t t[2];
    dynamic_job_on(dataset(RANGE_SPEC(40000000)), 2, 1, t);
    uint64_t next = 0;
    unsigned tail_answers = 0;
    for (unsigned calls = 0;; calls++) {
        cr_assert_lt(calls, 1000, "the epoch never ends");
        cr_assert_eq(splits_of(t[calls % 2], 0, 4, 4000000), 0, "%s", err);
        if (sresp->end_of_epoch)
            break;
        bool tail = TOTAL - next < 2 * (uint64_t)FLOOR;
        tail_answers += tail;
        for (pb_size_t i = 0; i < sresp->splits_count; i++) {
            const sluice_Split *s = &sresp->splits[i];
            cr_assert_eq(s->begin, next);
            if (tail && s->end < TOTAL)
                cr_assert_geq(s->end - s->begin, CRUMB, "a split of %" PRIu64 " records with %" PRIu64 " left",
                              s->end - s->begin, TOTAL - next);
            next = s->end;
        }
    }
    cr_assert_eq(next, TOTAL);
    cr_assert_leq(tail_answers, 3, "the last %u records took %u answers", 2 * FLOOR, tail_answers);
}

/* A small epoch (100,000 records: less than a crumb, 1/live of an eighth of
 * --max-split-size, per live task) read by fast tasks asking by turns, as
 * in the test above: every live task gets some of it. A crumb not bounded
 * by the epoch gave the first task all of it with 2 tasks, and left one of
 * 4 without any. */
Test(state, a_small_epoch_still_reaches_every_live_task)
{
    for (unsigned live = 2; live <= 4; live += 2) {
        start_guided(1048576);
        uint64_t tasks[4], got[4] = {0}, next = 0;
        dynamic_job_on(dataset(RANGE_SPEC(100000)), live, 1, tasks);
        for (unsigned calls = 0;; calls++) {
            cr_assert_lt(calls, 1000, "the epoch never ends");
            unsigned k = calls % live;
            cr_assert_eq(splits_of(tasks[k], 0, calls < live ? 8 : 4, 4000000), 0, "%s", err);
            if (sresp->end_of_epoch)
                break;
            for (pb_size_t i = 0; i < sresp->splits_count; i++) {
                cr_assert_eq(sresp->splits[i].begin, next);
                got[k] += sresp->splits[i].end - next;
                next = sresp->splits[i].end;
            }
        }
        cr_assert_eq(next, 100000);
        for (unsigned i = 0; i < live; i++)
            cr_assert_gt(got[i], 0, "task %u of %u got none of the epoch", i + 1, live);
        sl_dstate_free(st);
        st = NULL;
    }
}

/* A model of DYNAMIC workers reading one epoch through the state's
 * hand-out, in simulated time (steps of 50 µs): each task reads its splits
 * at its own rate (each split at 0.85-1.15 times it), keeps a queue as
 * workerd does (8 splits, more when they come shorter than its target of
 * 50 ms, at most 64; it asks once half are read), says its slack and rate
 * in each request, and gets each answer after a network delay of up to
 * 2 ms and, with splits, its commit's (half its slack, at most 50 ms).
 * @return how far apart the first and the last task finished (ms); *worst
 * is the longest a split of the epoch's last tenth took its task (ms). */
struct sim_task {
    double rate, left, finished_ms, retry_at, arrive_at;
    uint64_t queue[128], pending[64], last_len, seq;
    unsigned head, count, npending;
    bool asking, end_seen, end_pending;
};

static double simulate_epoch(uint64_t *rng, unsigned live, uint64_t total, uint64_t most, double *worst)
{
    start_guided(most);
    char spec[128];
    snprintf(spec, sizeof spec, "{\"source\": {\"type\": \"range\", \"stop\": %" PRIu64 "}}", total);
    uint64_t *ids = calloc(live, sizeof *ids);
    struct sim_task *tk = calloc(live, sizeof *tk);
    cr_assert(ids && tk);
    dynamic_job_on(dataset(spec), live, 0, ids);
    double base = 1e5 * (double)(1 + splitmix64(rng) % 1000); /* 10^5 to 10^8 records/s */
    for (unsigned k = 0; k < live; k++)
        tk[k].rate = base * (1 + (double)(splitmix64(rng) % 300) / 100.0); /* up to 4 times apart */
    uint64_t next = 0;
    unsigned done = 0;
    *worst = 0;
    for (double now = 0; done < live; now += 0.05) {
        cr_assert_lt(now, 600000.0, "the epoch of %" PRIu64 " records never ends", total);
        for (unsigned k = 0; k < live; k++) {
            struct sim_task *t = &tk[k];
            if (t->finished_ms > 0)
                continue;
            if (t->npending > 0 && now >= t->arrive_at) {
                for (unsigned i = 0; i < t->npending; i++)
                    t->queue[(t->head + t->count++) % 128] = t->pending[i];
                t->npending = 0;
            }
            if (t->end_pending && now >= t->arrive_at)
                t->end_seen = true;
            if (t->asking && now >= t->arrive_at)
                t->asking = false;
            /* The pipeline reads for a step: its split, then the next. */
            double budget = 0.05;
            while (budget > 0) {
                if (t->left <= 0 && t->count > 0) {
                    uint64_t len = t->queue[t->head];
                    t->head = (t->head + 1) % 128;
                    t->count--;
                    double speed = t->rate * (0.85 + (double)(splitmix64(rng) % 31) / 100.0);
                    t->left = (double)len / speed * 1000.0; /* ms */
                    t->last_len = len;
                    if (next > total - total / 10 && t->left > *worst)
                        *worst = t->left;
                }
                if (t->left <= 0)
                    break;
                double used = t->left < budget ? t->left : budget;
                t->left -= used;
                budget -= used;
            }
            if (t->left <= 0 && t->count == 0 && t->npending == 0 && t->end_seen) {
                t->finished_ms = now + 0.05 - budget;
                done++;
                continue;
            }
            /* Its queue: 8 splits, times how much shorter they come than
             * its target (workerd's rate_split_taken()). */
            double target = t->rate * 0.05;
            unsigned p = 8;
            if (t->last_len > 0 && target / (double)t->last_len >= 2)
                p *= target / (double)t->last_len >= 8 ? 8 : (unsigned)(target / (double)t->last_len);
            if (t->asking || t->end_pending || now < t->retry_at || t->count > p / 2)
                continue;
            double queued = 0;
            for (unsigned i = 0; i < t->count; i++)
                queued += (double)t->queue[(t->head + i) % 128];
            uint32_t slack = (uint32_t)(queued / t->rate * 1000.0 + (t->left > 0 ? t->left : 0));
            sluice_GetSplitRequest req = {.task_id = ids[k], .max_splits = p - t->count > 64 ? 64 : p - t->count,
                                          .request_seq = ++t->seq, .split_records = (uint64_t)target,
                                          .slack_ms = slack, .records_per_second = (uint64_t)t->rate};
            memset(sresp, 0, sizeof *sresp);
            cr_assert_eq(sl_dstate_get_splits(st, &req, (int64_t)now, sresp, err, sizeof err), 0, "%s", err);
            double delay = (double)(splitmix64(rng) % 2000) / 1000.0;
            if (sresp->splits_count > 0)
                delay += slack / 2 < 50 ? slack / 2 : 50;
            t->asking = true;
            t->arrive_at = now + delay;
            t->end_pending = sresp->end_of_epoch;
            if (sresp->retry_ms > 0)
                t->retry_at = t->arrive_at + sresp->retry_ms;
            for (pb_size_t i = 0; i < sresp->splits_count; i++) {
                cr_assert_eq(sresp->splits[i].begin, next, "a split at %" PRIu64 " after %" PRIu64,
                             sresp->splits[i].begin, next);
                next = sresp->splits[i].end;
                t->pending[t->npending++] = sresp->splits[i].end - sresp->splits[i].begin;
            }
        }
    }
    cr_assert_eq(next, total, "the epoch covered [0, %" PRIu64 ")", next);
    double first = tk[0].finished_ms, last = first;
    for (unsigned k = 1; k < live; k++) {
        first = tk[k].finished_ms < first ? tk[k].finished_ms : first;
        last = tk[k].finished_ms > last ? tk[k].finished_ms : last;
    }
    free(ids);
    free(tk);
    sl_dstate_free(st);
    st = NULL;
    return last - first;
}

/* At an epoch's end a task whose queue lasts past the others' gets no
 * split but a time to ask again (half its slack, within 1 to 50 ms), and
 * the others take what is left. A range of 100,000: a task at 10,000,000
 * records a second takes its first splits (30,720 records); then one at
 * 1,000,000 a second with 1 s queued, and 40 ms a millisecond later: both
 * outlast what the two would read of the rest together, and get none;
 * the fast task takes the rest in two answers, and the slow one hears the
 * epoch is over. */
Test(state, a_task_whose_queue_outlasts_the_others_leaves_them_the_rest)
{
    start_guided(1048576);
    uint64_t t[2];
    dynamic_job_on(dataset(RANGE_SPEC(100000)), 2, 0, t);
    sluice_GetSplitRequest fast = {
        .task_id = t[1], .max_splits = 64, .split_records = 50000, .records_per_second = 10000000};
    sluice_GetSplitRequest slow = {
        .task_id = t[0], .max_splits = 64, .split_records = 50000, .records_per_second = 1000000, .slack_ms = 1000};
    uint64_t next = 0;
    for (int answer = 0; answer < 3 && next < 100000; answer++) {
        if (answer == 1) {
            cr_assert_eq(next, 30720, "the fast task's first answer ended at %" PRIu64, next);
            for (int i = 0; i < 2; i++) {
                memset(sresp, 0, sizeof *sresp);
                cr_assert_eq(sl_dstate_get_splits(st, &slow, i, sresp, err, sizeof err), 0, "%s", err);
                cr_assert_eq(sresp->splits_count, 0, "the slow task took %u splits with %u ms queued",
                             sresp->splits_count, slow.slack_ms);
                cr_assert_not(sresp->end_of_epoch);
                cr_assert_eq(sresp->retry_ms, i == 0 ? 50 : 20, "ask again after %u ms", sresp->retry_ms);
                slow.slack_ms = 40;
            }
            cr_assert_eq(stats().split_requests_left_to_others, 2);
        }
        memset(sresp, 0, sizeof *sresp);
        cr_assert_eq(sl_dstate_get_splits(st, &fast, 2, sresp, err, sizeof err), 0, "%s", err);
        for (pb_size_t k = 0; k < sresp->splits_count; k++) {
            cr_assert_eq(sresp->splits[k].begin, next);
            next = sresp->splits[k].end;
        }
    }
    cr_assert_eq(next, 100000, "the fast task's three answers ended at %" PRIu64, next);
    memset(sresp, 0, sizeof *sresp);
    cr_assert_eq(sl_dstate_get_splits(st, &slow, 3, sresp, err, sizeof err), 0, "%s", err);
    cr_assert(sresp->end_of_epoch && sresp->splits_count == 0);
    cr_assert_eq(stats().split_requests_left_to_others, 2);
}

/* A share of what is left below one record still takes one: the last
 * record of an epoch, two tasks at one rate with nothing queued, each a
 * share of half a record. Before 2026-12-05 the share was cut to 0, both
 * were told the other takes what is left, and the job stopped for good
 * (two workers, one-record files, at the last epoch's last split). */
Test(state, a_share_below_one_record_still_takes_one)
{
    start_guided(1048576);
    uint64_t t[2];
    dynamic_job_on(dataset(RANGE_SPEC(1)), 2, 0, t);
    for (int k = 0; k < 2; k++) {
        sluice_GetSplitRequest req = {
            .task_id = t[k], .request_seq = 1, .max_splits = 64, .split_records = 1024, .records_per_second = 1000};
        memset(sresp, 0, sizeof *sresp);
        cr_assert_eq(sl_dstate_get_splits(st, &req, 0, sresp, err, sizeof err), 0, "%s", err);
        if (k == 0) {
            cr_assert_eq(sresp->splits_count, 1, "the first task to ask takes the last record");
            cr_assert_eq(sresp->splits[0].end - sresp->splits[0].begin, 1);
        } else {
            cr_assert(sresp->end_of_epoch && sresp->splits_count == 0, "the other hears the epoch is over");
        }
    }
    cr_assert_eq(stats().split_requests_left_to_others, 0);
}

/* Tasks that say their rate and their queue's slack finish an epoch
 * together: seeded, 2 to 8 tasks at rates of 10^5 to 10^8 records a
 * second, up to 4 times apart, epochs of 0.5 to 3 s, --max-split-size 2^17
 * to 2^21. How far apart the first and the last end is measured against
 * 2 of the epoch's longest late splits and 5 ms (what a task has left of
 * the split it reads, and the rates' noise over its queue): the mean over
 * the 12 rounds at most 0.6 of it, every round at most twice it. In 101
 * seeds the means read 0.09 to 0.29 and the worst round 0.91 (1.18 in 400
 * more); without the rates in the requests (each answer up to half a
 * share of what was left, whatever the task had queued) the means read
 * 1.22 to 4.48 and half the rounds past 1.6. */
Test(state, tasks_that_say_their_queues_finish_an_epoch_together)
{
    unsigned seed = test_seed("state.tasks_that_say_their_queues_finish_an_epoch_together");
    uint64_t rng = seed;
    double measured = 0;
    for (int round = 0; round < 12; round++) {
        unsigned live = 2 + (unsigned)(splitmix64(&rng) % 7);
        uint64_t most = UINT64_C(1) << (17 + splitmix64(&rng) % 5);
        /* Its length in time: total at the rates drawn comes after the draw
         * of the rates, so draw the seconds and scale inside. */
        double seconds = 0.5 + (double)(splitmix64(&rng) % 250) / 100.0;
        uint64_t probe = rng;
        double base = 1e5 * (double)(1 + splitmix64(&probe) % 1000), sum = 0;
        for (unsigned k = 0; k < live; k++)
            sum += base * (1 + (double)(splitmix64(&probe) % 300) / 100.0);
        uint64_t total = (uint64_t)(sum * seconds);
        double worst;
        double spread = simulate_epoch(&rng, live, total, most, &worst);
        cr_log_info("seed %u round %d: %u tasks, %" PRIu64 " records (%.1f s), --max-split-size %" PRIu64
                    ": finished %.1f ms apart, the longest late split %.1f ms",
                    seed, round, live, total, seconds, most, spread, worst);
        cr_assert_leq(spread, 2 * (2 * worst + 5),
                      "seed %u round %d: %u tasks, %" PRIu64 " records, --max-split-size %" PRIu64
                      ": they finished %.1f ms apart (the longest late split %.1f ms)",
                      seed, round, live, total, most, spread, worst);
        measured += spread / (2 * worst + 5) / 12;
    }
    cr_assert_leq(measured, 0.6, "seed %u: the rounds finished %.2f of two late splits and 5 ms apart on the mean",
                  seed, measured);
}

/* A lone task gets the length it asks for to the epoch's end (no guided
 * share: shorter splits would only add hand-outs to wait on). */
Test(state, a_lone_task_keeps_its_split_length_to_the_end)
{
    sl_dstate_config_t cfg;
    test_config(&cfg);
    start(&cfg);
    uint64_t ds = dataset(RANGE_SPEC(100000));
    uint64_t w = worker("w:1", 0);
    job(ds, NULL, SL_SHARDING_DYNAMIC, 0, NULL);
    uint64_t t = take_task(w, 1).task_id;
    uint64_t next = 0;
    while (next < 100000) {
        cr_assert_eq(splits_of(t, 0, 3, 30000), 0, "%s", err);
        for (pb_size_t i = 0; i < sresp->splits_count; i++) {
            const sluice_Split *s = &sresp->splits[i];
            cr_assert_eq(s->begin, next);
            cr_assert_eq(s->end, next + 30000 < 100000 ? next + 30000 : 100000, "[%" PRIu64 ", %" PRIu64 ")",
                         s->begin, s->end);
            next = s->end;
        }
    }
    cr_assert_eq(splits_of(t, 0, 3, 30000), 0, "%s", err);
    cr_assert(sresp->end_of_epoch);
}

/* Checks the answer in *sresp: n splits of len records from *next on. */
static void assert_splits_from(uint64_t *next, unsigned n, uint64_t len, const char *what)
{
    cr_assert_eq(sresp->splits_count, n, "%s: %u splits", what, (unsigned)sresp->splits_count);
    for (pb_size_t i = 0; i < sresp->splits_count; i++) {
        cr_assert_eq(sresp->splits[i].begin, *next, "%s: split %u", what, (unsigned)i);
        cr_assert_eq(sresp->splits[i].end - sresp->splits[i].begin, len, "%s: split %u", what, (unsigned)i);
        *next = sresp->splits[i].end;
    }
}

/* The one new task of each worker, its earlier ones reported running
 * (tasks[w][0 .. n)); appended there. */
static void take_new_tasks(const uint64_t *workers, unsigned nw, uint64_t tasks[][4], unsigned n, int64_t now)
{
    for (unsigned w = 0; w < nw; w++) {
        report_t r[4];
        for (unsigned k = 0; k < n; k++)
            r[k] = (report_t){tasks[w][k], SL_TASK_RUNNING, NULL};
        cr_assert_eq(worker_hb(workers[w], now, n, r), 0, "%s", err);
        cr_assert_eq(wresp->new_tasks_count, 1, "worker %u: %u new tasks", w, (unsigned)wresp->new_tasks_count);
        tasks[w][n] = wresp->new_tasks[0].task_id;
    }
}

/* A new DYNAMIC job hands each task the splits its first request will ask
 * for, of the length its worker's tasks last asked for of the dataset:
 * that request then finds its answer made (and committed with the job).
 * A worker that never asked for the dataset's splits, another dataset and
 * requests without a worker's numbering get nothing ahead; every split
 * still goes out once. */
Test(state, a_new_job_hands_each_task_the_splits_its_worker_asked_for_before)
{
    start_guided(1048576);
    uint64_t ds = dataset(RANGE_SPEC(40000000)), other = dataset(RANGE_SPEC(1000000));
    uint64_t w[3] = {worker("w:1", 0), worker("w:2", 0), worker("w:3", 0)}, t[3][4];
    job(ds, NULL, SL_SHARDING_DYNAMIC, 0, NULL);
    take_new_tasks(w, 3, t, 0, 1);
    /* w:1 and w:2 ask as workerd does, w:3 never asks; requests without a
     * numbering (request_seq 0) teach nothing. */
    cr_assert_eq(splits_seq(t[0][0], 0, 8, 0, 1), 0, "%s", err);
    cr_assert_eq(splits_seq(t[0][0], 0, 4, 300000, 2), 0, "%s", err);
    cr_assert_eq(splits_seq(t[1][0], 0, 8, 500000, 1), 0, "%s", err);
    cr_assert_eq(splits_seq(t[2][0], 0, 8, 700000, 0), 0, "%s", err);
    cr_assert_eq(stats().first_splits_with_job, 0);
    /* GET /v1/workers shows what each was heard ask. */
    char want[3][160];
    snprintf(want[0], sizeof want[0], "{\"first_request_splits\":8,\"split_lengths\":[{\"dataset_id\":%" PRIu64
             ",\"split_records\":300000}]}", ds);
    snprintf(want[1], sizeof want[1], "{\"first_request_splits\":8,\"split_lengths\":[{\"dataset_id\":%" PRIu64
             ",\"split_records\":500000}]}", ds);
    snprintf(want[2], sizeof want[2], "{}");
    json_t *ws = sl_dstate_workers_json(st, 1);
    for (unsigned k = 0; k < 3; k++) {
        json_t *asked = json_pack("{}");
        const char *key;
        json_t *v;
        json_object_foreach(json_array_get(ws, k), key, v) {
            if (!strcmp(key, "first_request_splits") || !strcmp(key, "split_lengths"))
                json_object_set(asked, key, v);
        }
        char *got = json_dumps(asked, JSON_SORT_KEYS | JSON_COMPACT);
        cr_assert_str_eq(got, want[k], "worker %u", k);
        free(got);
        json_decref(asked);
    }
    json_decref(ws);

    job(ds, NULL, SL_SHARDING_DYNAMIC, 3, NULL);
    take_new_tasks(w, 3, t, 1, 4);
    cr_assert_eq(stats().first_splits_with_job, 2);
    /* Whatever the first requests ask, they get what was handed out: 8
     * splits each (the queue w:1's and w:2's first requests asked for), of
     * the length each asked for last, rounded down to the least. */
    uint64_t next = 0;
    cr_assert_eq(splits_seq(t[0][1], 0, 8, 0, 1), 0, "%s", err);
    assert_splits_from(&next, 8, 292 * 1024, "w:1's first");
    uint64_t w1_end = next;
    cr_assert_eq(splits_seq(t[1][1], 0, 8, 2000000, 1), 0, "%s", err);
    assert_splits_from(&next, 8, 488 * 1024, "w:2's first");
    /* Asked again (the answer was lost): the same. */
    uint64_t again = w1_end - 8 * 292 * 1024;
    cr_assert_eq(splits_seq(t[0][1], 0, 8, 0, 1), 0, "%s", err);
    assert_splits_from(&again, 8, 292 * 1024, "w:1's first again");
    /* w:3 asks itself, from where the job's hand-out left off. */
    cr_assert_eq(splits_seq(t[2][1], 0, 8, 0, 1), 0, "%s", err);
    assert_splits_from(&next, 8, 1024, "w:3's first");

    /* Another dataset: nothing ahead. */
    job(other, NULL, SL_SHARDING_DYNAMIC, 5, NULL);
    take_new_tasks(w, 3, t, 2, 6);
    cr_assert_eq(stats().first_splits_with_job, 2);
    uint64_t onext = 0;
    cr_assert_eq(splits_seq(t[0][2], 0, 8, 0, 1), 0, "%s", err);
    assert_splits_from(&onext, 8, 1024, "another dataset's first");

    /* The second job's epoch still goes out once, to the end. */
    for (unsigned calls = 0;; calls++) {
        cr_assert_lt(calls, 10000, "the epoch never ends");
        cr_assert_eq(splits_seq(t[calls % 3][1], 0, 4, 1000000, 2 + calls / 3), 0, "%s", err);
        if (sresp->end_of_epoch)
            break;
        for (pb_size_t i = 0; i < sresp->splits_count; i++) {
            cr_assert_eq(sresp->splits[i].begin, next);
            next = sresp->splits[i].end;
        }
    }
    cr_assert_eq(next, 40000000);
}

/* GET /v1/workers lists the split lengths of the latest 8 datasets a
 * worker's tasks asked for, oldest first (the ring sl__dstate_first_splits()
 * reads): of 10, the first two are gone. */
Test(state, the_workers_view_lists_the_latest_datasets_asked_for_oldest_first)
{
    start_guided(1048576);
    uint64_t w = worker("w:1", 0), ds[10];
    report_t running[10];
    for (unsigned d = 0; d < 10; d++) {
        char spec[96];
        snprintf(spec, sizeof spec, "{\"source\": {\"type\": \"range\", \"stop\": %u}}", 1000000 + d);
        ds[d] = dataset(spec);
        job(ds[d], NULL, SL_SHARDING_DYNAMIC, d + 1, NULL);
        cr_assert_eq(worker_hb(w, d + 1, d, running), 0, "%s", err);
        cr_assert_eq(wresp->new_tasks_count, 1, "dataset %u: %u new tasks", d, (unsigned)wresp->new_tasks_count);
        running[d] = (report_t){wresp->new_tasks[0].task_id, SL_TASK_RUNNING, NULL};
        cr_assert_eq(splits_seq(running[d].task_id, 0, 8, 1000 * (d + 1), 1), 0, "%s", err);
    }
    json_t *ws = sl_dstate_workers_json(st, 11);
    json_t *lengths = json_object_get(json_array_get(ws, 0), "split_lengths");
    cr_assert_eq(json_array_size(lengths), 8);
    for (unsigned i = 0; i < 8; i++) {
        json_t *e = json_array_get(lengths, i);
        cr_assert_eq(json_integer_value(json_object_get(e, "dataset_id")), (json_int_t)ds[i + 2], "entry %u", i);
        cr_assert_eq(json_integer_value(json_object_get(e, "split_records")), 1000 * (i + 3), "entry %u", i);
    }
    json_decref(ws);
}

/* A take before the batch changes counts: the split size stays as set. */
Test(state, split_size_kept_when_counts_change_before_the_batch)
{
    uint64_t task = lone_dynamic_task("{\"source\": {\"type\": \"range\", \"stop\": 5000}, \"ops\": ["
                                      "{\"op\": \"take\", \"count\": 4000}, {\"op\": \"batch\", "
                                      "\"batch_size\": 300}]}");
    cr_assert_eq(splits(task, 0, 1), 0, "%s", err);
    cr_assert_eq(sresp->splits[0].end - sresp->splits[0].begin, 1000);
}

/* An op that keeps the count of elements (an element-wise one, a prefetch)
 * before the batch keeps the rounding up to the batch size (1000 -> 1200
 * for a batch of 300); a filter, which may drop elements, does not. */
Test(state, split_size_rounded_through_ops_that_keep_the_count)
{
    const char *between[] = {"{\"op\": \"cast\", \"key\": \"value\", \"dtype\": \"int32\"}",
                             "{\"op\": \"prefetch\", \"buffer_size\": 2}",
                             "{\"op\": \"filter\", \"key\": \"value\", \"cmp\": \"ge\", \"value\": 0}"};
    const uint64_t want[] = {1200, 1200, 1000};
    for (int i = 0; i < 3; i++) {
        char spec[512];
        snprintf(spec, sizeof spec,
                 "{\"source\": {\"type\": \"range\", \"stop\": 5000}, \"ops\": [%s, {\"op\": \"batch\", "
                 "\"batch_size\": 300}]}",
                 between[i]);
        uint64_t task = lone_dynamic_task(spec);
        cr_assert_eq(splits(task, 0, 1), 0, "%s", err);
        cr_assert_eq(sresp->splits[0].end - sresp->splits[0].begin, want[i], "%s", between[i]);
        sl_dstate_free(st); /* the next spec starts a state of its own */
        st = NULL;
    }
}

/* ---- static policies, coordinated reads, target workers, name reuse ---- */

static void start_with_addresses(const char *list)
{
    sl_dstate_config_t cfg;
    test_config(&cfg);
    cfg.worker_addresses = list;
    cfg.round_lookahead = 10;
    start(&cfg);
}

Test(state, worker_outside_worker_addresses_is_refused)
{
    start_with_addresses("h:1,h:2");
    uint64_t id = 0;
    cr_assert_eq(sl_dstate_worker_register(st, "h:3", 0, &id, err, sizeof err), SL_EREFUSED);
    cr_assert_str_eq(err, "worker h:3 refused: it is not in the dispatcher's --worker-addresses (h:1,h:2)");
    worker("h:2", 0);
}

Test(state, static_task_index_is_the_place_in_worker_addresses)
{
    start_with_addresses("h:1,h:2,h:3");
    uint64_t w3 = worker("h:3", 0), w1 = worker("h:1", 0);
    uint64_t ds = dataset(RANGE_SPEC(100));
    job(ds, NULL, SL_SHARDING_DATA, 0, NULL);
    sluice_TaskDef t3 = take_task(w3, 1), t1 = take_task(w1, 1);
    cr_assert_eq(t3.worker_index, 2);
    cr_assert_eq(t1.worker_index, 0);
    cr_assert_eq(t3.num_workers, 3);
    cr_assert_eq(t3.sharding, SL_SHARDING_DATA);
    /* FILE over a range, and FILE_OR_DATA over a range (resolved to DATA). */
    uint64_t j = 0, c = 0;
    cr_assert_eq(job_rc(ds, NULL, SL_SHARDING_FILE, 0, &j, &c), SL_EINVAL);
    cr_assert_not_null(strstr(err, "file sharding needs a file source"), "%s", err);
    job(ds, NULL, SL_SHARDING_FILE_OR_DATA, 0, NULL);
    report(w1, t1.task_id, SL_TASK_RUNNING, NULL, 2);
    cr_assert_eq(wresp->new_tasks_count, 1);
    cr_assert_eq(wresp->new_tasks[0].sharding, SL_SHARDING_DATA);
}

Test(state, static_job_finishes_only_when_every_index_is_done)
{
    start_with_addresses("h:1,h:2");
    uint64_t w1 = worker("h:1", 0);
    uint64_t c = 0, j = job(dataset(RANGE_SPEC(10)), NULL, SL_SHARDING_DATA, 0, &c);
    sluice_TaskDef t1 = take_task(w1, 1);
    report(w1, t1.task_id, SL_TASK_DONE, NULL, 2);
    cr_assert_eq(job_state(j, c, 3), SL_JOB_RUNNING); /* index 1 has not read its shard */
    uint64_t w2 = worker("h:2", 4);
    sluice_TaskDef t2 = take_task(w2, 5);
    cr_assert_eq(t2.worker_index, 1);
    report(w2, t2.task_id, SL_TASK_DONE, NULL, 6);
    cr_assert_eq(job_state(j, c, 7), SL_JOB_FINISHED);
}

Test(state, static_policy_without_worker_addresses_is_refused)
{
    start_default();
    uint64_t j = 0, c = 0;
    cr_assert_eq(job_rc(dataset(RANGE_SPEC(10)), NULL, SL_SHARDING_DATA, 0, &j, &c), SL_EINVAL);
    cr_assert_str_eq(err, "data sharding needs the dispatcher's --worker-addresses: a worker's index is its place in "
                          "that list");
}

/* Named jobs by (name, repetition): test_repetitions.c. */

#define FOREVER_SPEC "{\"source\": {\"type\": \"range\", \"stop\": 10}, \"ops\": [{\"op\": \"repeat\"}]}"

static int join(uint64_t ds, const char *name, uint32_t n, uint32_t i, uint32_t target, const char *host,
                int64_t now, sluice_GetOrCreateJobResponse *resp)
{
    sluice_GetOrCreateJobRequest req = {.dataset_id = ds, .num_consumers = n, .consumer_index = i,
                                        .target_workers = target};
    snprintf(req.job_name, sizeof req.job_name, "%s", name ? name : "");
    memset(resp, 0, sizeof *resp);
    err[0] = '\0';
    return sl_dstate_job_join(st, &req, host, NULL, 0, now, resp, err, sizeof err);
}

Test(state, coordinated_reads_refusals)
{
    start_default();
    worker("h:1", 0);
    uint64_t finite = dataset(RANGE_SPEC(10)), forever = dataset(FOREVER_SPEC);
    sluice_GetOrCreateJobResponse r;
    cr_assert_eq(join(forever, NULL, 2, 0, 0, "", 0, &r), SL_EINVAL);
    cr_assert_not_null(strstr(err, "need a named job"), "%s", err);
    cr_assert_eq(join(finite, "c", 2, 0, 0, "", 0, &r), SL_EINVAL);
    cr_assert_not_null(strstr(err, "need an infinite dataset"), "%s", err);
    cr_assert_eq(join(forever, "c", 2, 2, 0, "", 0, &r), SL_EINVAL);
    cr_assert_eq(join(forever, "c", 2, 0, 0, "", 0, &r), 0, "%s", err);
    cr_assert_eq(join(forever, "c", 3, 1, 0, "", 0, &r), SL_ECONFLICT);
    cr_assert_str_eq(err, "job \"c\" exists with num_consumers 2, requested 3");
    cr_assert_eq(join(forever, "c", 2, 0, 0, "", 0, &r), SL_ECONFLICT);
    cr_assert_not_null(strstr(err, "consumer_index 0 is taken"), "%s", err);
    cr_assert_eq(join(forever, "c", 2, 1, 0, "", 0, &r), 0, "%s", err);
}

/* A state whose clients are away after 200 ms and released after 100 s,
 * whose worker h:1 and jobs stay, with at most max_clients a job (0: the
 * default): @return the id of an infinite dataset for coordinated reads */
static uint64_t start_away_clients(unsigned max_clients)
{
    sl_dstate_config_t cfg;
    test_config(&cfg); /* client_timeout_ms 200 */
    cfg.client_rejoin_ms = 100000;
    if (max_clients)
        cfg.max_clients_per_job = max_clients;
    cfg.worker_timeout_ms = 1000000;
    cfg.job_gc_timeout_ms = 1000000;
    start(&cfg);
    worker("h:1", 0);
    return dataset(FOREVER_SPEC);
}

Test(state, away_clients_give_way_to_new_ones_and_are_counted)
{
    uint64_t ds = start_away_clients(2);
    sluice_GetOrCreateJobResponse r0, r1, r;
    cr_assert_eq(join(ds, "c", 2, 0, 0, "", 0, &r0), 0, "%s", err);
    cr_assert_eq(r0.first_round, 0);
    cr_assert_eq(r0.take_over_below, 0);
    cr_assert_eq(join(ds, "c", 2, 1, 0, "", 0, &r1), 0, "%s", err);
    sluice_ClientHeartbeatRequest hb = {.job_id = r0.job_id, .client_id = r0.client_id, .round = 300};
    memcpy(hb.client_secret, r0.client_secret, sizeof hb.client_secret);
    cr_assert_eq(sl_dstate_client_heartbeat(st, &hb, 0, cresp, err, sizeof err), 0, "%s", err);
    cr_assert_eq(cresp->round_horizon, 364);
    cr_assert_eq(client_hb(r1.job_id, r1.client_id, 150), 0, "%s", err);
    sl_dstate_tick(st, 201); /* consumer 0 is away */
    cr_assert_eq(stats().clients_away, 1);
    /* A trainer restarted as consumer 0 takes the away one's place, where
     * it was, and asks the rounds it may have taken up to the horizon with
     * take_over. */
    cr_assert_eq(join(ds, "c", 2, 1, 0, "", 202, &r), SL_ECONFLICT, "a present consumer keeps its index");
    cr_assert_eq(join(ds, "c", 2, 0, 0, "", 202, &r), 0, "%s", err);
    cr_assert_eq(r.first_round, 300);
    cr_assert_eq(r.take_over_below, 365);
    cr_assert_eq(stats().clients_away, 0);
    cr_assert_eq(client_hb(r0.job_id, r0.client_id, 203), SL_ENOTFOUND, "the away one was released");

    /* At the job's limit of clients, the longest away gives way. */
    uint64_t c1, c2;
    uint64_t j = job(ds, "plain", SL_SHARDING_OFF, 1000, &c1);
    job(ds, "plain", SL_SHARDING_OFF, 1100, &c2);
    sl_dstate_tick(st, 1201); /* c1 away, c2 not yet */
    uint64_t c3;
    cr_assert_eq(job(ds, "plain", SL_SHARDING_OFF, 1202, &c3), j);
    cr_assert_eq(client_hb(j, c1, 1203), SL_ENOTFOUND);
    cr_assert_eq(client_hb(j, c2, 1203), 0, "%s", err);
    cr_assert_eq(client_hb(j, c3, 1203), 0, "%s", err);
    uint64_t c4 = 0, j4 = 0;
    cr_assert_eq(job_rc(ds, "plain", SL_SHARDING_OFF, 1204, &j4, &c4), SL_ETOOBIG, "no one away: the limit holds");
}

static int coord_hb(const sluice_GetOrCreateJobResponse *r, uint64_t round, int64_t now)
{
    sluice_ClientHeartbeatRequest hb = {.job_id = r->job_id, .client_id = r->client_id, .round = round};
    memcpy(hb.client_secret, r->client_secret, sizeof hb.client_secret);
    memset(cresp, 0, sizeof *cresp);
    return sl_dstate_client_heartbeat(st, &hb, now, cresp, err, sizeof err);
}

/* A synchronous job's trainers restarted together: each consumer's
 * predecessor stopped at its own round (their windows of rounds in flight
 * differ), and each new one asks from there, but all hand their callers
 * the rounds from the largest of them, whichever comes first and however
 * far it read since. */
Test(state, consumers_restarted_together_hand_out_rounds_from_one_round)
{
    uint64_t ds = start_away_clients(0);
    sluice_GetOrCreateJobResponse old[3], r1, r0, r2, again;
    const uint64_t was[3] = {100, 131, 96};
    for (uint32_t i = 0; i < 3; i++) {
        cr_assert_eq(join(ds, "sync", 3, i, 0, "", 0, &old[i]), 0, "%s", err);
        cr_assert_eq(old[i].deliver_from, 0, "the job's first consumers read from round 0");
        cr_assert_eq(coord_hb(&old[i], was[i], 0), 0, "%s", err);
    }
    sl_dstate_tick(st, 201); /* every one away */
    cr_assert_eq(stats().clients_away, 3);

    cr_assert_eq(join(ds, "sync", 3, 1, 0, "", 202, &r1), 0, "%s", err);
    cr_assert_eq(r1.first_round, 131);
    cr_assert_eq(r1.deliver_from, 131);
    cr_assert_eq(coord_hb(&r1, 180, 203), 0, "%s", err); /* it reads on meanwhile */

    cr_assert_eq(join(ds, "sync", 3, 0, 0, "", 204, &r0), 0, "%s", err);
    cr_assert_eq(r0.first_round, 100, "it asks from where its predecessor was");
    cr_assert_eq(r0.deliver_from, 131, "and hands out from where the first one started, not where it is");
    cr_assert_eq(join(ds, "sync", 3, 2, 0, "", 205, &r2), 0, "%s", err);
    cr_assert_eq(r2.first_round, 96);
    cr_assert_eq(r2.deliver_from, 131);

    /* The view says where each new one started. */
    json_t *v = sl_dstate_job_json(st, r0.job_id, 206);
    json_t *cs = json_object_get(v, "consumers");
    cr_assert_eq(json_array_size(cs), 3);
    for (size_t i = 0; i < 3; i++)
        cr_assert_eq(json_integer_value(json_object_get(json_array_get(cs, i), "start_round")), 131);
    json_decref(v);

    /* Later one alone is restarted while the others read on: it hands out
     * from the furthest round any of them asked for. */
    cr_assert_eq(coord_hb(&r0, 400, 300), 0, "%s", err);
    cr_assert_eq(coord_hb(&r1, 410, 300), 0, "%s", err);
    cr_assert_eq(coord_hb(&r2, 405, 300), 0, "%s", err);
    cr_assert_eq(coord_hb(&r0, 400, 450), 0, "%s", err);
    cr_assert_eq(coord_hb(&r1, 410, 450), 0, "%s", err);
    sl_dstate_tick(st, 501); /* r2 away */
    cr_assert_eq(stats().clients_away, 1);
    cr_assert_eq(join(ds, "sync", 3, 2, 0, "", 502, &again), 0, "%s", err);
    cr_assert_eq(again.first_round, 405);
    cr_assert_eq(again.deliver_from, 410);
}

/* Property test of the rule above at the sizes trainers run: jobs of up
 * to 64 consumers whose rounds lie up to 64 apart (their windows in
 * flight); all of them restarted together, or some, each stopped cleanly
 * (its iterator closed) or killed (its lease runs out); the new ones come in
 * a drawn order, and those already back read on (and the others too)
 * between their joins. Every new one asks from where its predecessor was,
 * and all of one restart hand their callers the rounds from one round: the
 * largest any consumer of the job was at when the first of them came. */
Test(state, consumers_restarted_together_start_at_one_round_at_drawn_sizes)
{
    uint64_t rng = test_seed("state.consumers_restarted_together_start_at_one_round_at_drawn_sizes");
    uint64_t ds = start_away_clients(0);
    int64_t now = 0;
    enum { MAX_N = 64, TRIALS = 400 };
    static sluice_GetOrCreateJobResponse r[MAX_N];
    for (unsigned trial = 0; trial < TRIALS; trial++) {
        char name[32];
        snprintf(name, sizeof name, "sync-%u", trial);
        uint32_t n = 1 + (uint32_t)(splitmix64(&rng) % MAX_N);
        bool all = splitmix64(&rng) % 2 == 0;
        uint64_t round[MAX_N], base = splitmix64(&rng) % 100000;
        bool restarts[MAX_N], away[MAX_N];
        uint32_t restarted = 0;
        for (uint32_t i = 0; i < n; i++) {
            cr_assert_eq(join(ds, name, n, i, 0, "", now, &r[i]), 0, "trial %u: %s", trial, err);
            round[i] = base + splitmix64(&rng) % 64;
            cr_assert_eq(coord_hb(&r[i], round[i], now), 0, "%s", err);
            restarts[i] = all || splitmix64(&rng) % 3 == 0;
            restarted += restarts[i];
            away[i] = restarts[i];
        }
        if (restarted == 0) {
            restarts[0] = away[0] = true;
            restarted = 1;
        }
        /* Those that stay heartbeat; of the others, some close their
         * iterators (a trainer stopped cleanly), the others' leases run
         * out. */
        for (uint32_t i = 0; i < n; i++) {
            if (!restarts[i])
                cr_assert_eq(coord_hb(&r[i], round[i], now + 150), 0, "%s", err);
            else if (splitmix64(&rng) % 2 == 0)
                cr_assert_eq(release(r[i].job_id, r[i].client_id, now + 100), 0, "%s", err);
        }
        sl_dstate_tick(st, now + 201);
        now += 202;
        uint64_t order[MAX_N];
        shuffled_order(order, n, splitmix64(&rng));
        uint64_t from = 0;
        bool first = true;
        for (uint32_t k = 0; k < n; k++) {
            uint32_t i = (uint32_t)order[k];
            if (!restarts[i])
                continue;
            uint64_t most = 0;
            for (uint32_t o = 0; o < n; o++)
                most = round[o] > most ? round[o] : most;
            sluice_GetOrCreateJobResponse again;
            cr_assert_eq(join(ds, name, n, i, 0, "", now, &again), 0, "trial %u: %s", trial, err);
            cr_assert_eq(again.first_round, round[i], "trial %u, consumer %u of %u: asks from %" PRIu64
                         ", its predecessor was at %" PRIu64, trial, i, n, again.first_round, round[i]);
            if (first)
                from = most;
            first = false;
            cr_assert_eq(again.deliver_from, from, "trial %u (%u consumers, %u restarted): consumer %u hands out "
                         "from %" PRIu64 ", the first restarted from %" PRIu64, trial, n, restarted, i,
                         again.deliver_from, from);
            r[i] = again;
            now++;
            /* Everyone present reads on a little meanwhile (within the
             * horizon), the new ones from where they asked. */
            away[i] = false;
            for (uint32_t o = 0; o < n; o++) {
                if (away[o])
                    continue;
                round[o] += splitmix64(&rng) % 8;
                cr_assert_eq(coord_hb(&r[o], round[o], now), 0, "%s", err);
            }
        }
        now += 1000; /* this job's consumers go away; the next job is another */
    }
}

/* A consumer whose trainer stopped cleanly (its iterator closed: released
 * at once, not away) and started again takes its index where it left, as
 * one whose lease ran out does; before 2026-12-03 it started at round 0,
 * which the workers had served long before, and failed. So does one that
 * comes after its away predecessor was released (--client-rejoin-ms). */
Test(state, a_consumer_that_closed_its_iterator_comes_back_where_it_left)
{
    uint64_t ds = start_away_clients(0); /* away after 200 ms, released after 100 s */
    sluice_GetOrCreateJobResponse r0, r1, again;
    cr_assert_eq(join(ds, "sync", 2, 0, 0, "", 0, &r0), 0, "%s", err);
    cr_assert_eq(join(ds, "sync", 2, 1, 0, "", 0, &r1), 0, "%s", err);
    cr_assert_eq(coord_hb(&r0, 300, 1), 0, "%s", err);
    cr_assert_eq(coord_hb(&r1, 310, 1), 0, "%s", err);
    cr_assert_eq(release(r0.job_id, r0.client_id, 2), 0, "%s", err);
    cr_assert_eq(join(ds, "sync", 2, 0, 0, "", 3, &again), 0, "%s", err);
    cr_assert_eq(again.job_id, r0.job_id);
    cr_assert_eq(again.first_round, 300, "it asks from where its predecessor was, not round 0");
    cr_assert_eq(again.take_over_below, 375, "the rounds up to the horizon (310 + 64) it may have taken");
    cr_assert_eq(again.deliver_from, 310, "it hands out from where its peer is");
    /* Away past --client-rejoin-ms, released: the next one still starts
     * where it was. */
    cr_assert_eq(coord_hb(&again, 500, 4), 0, "%s", err);
    int64_t now = 4;
    for (; now < 100500; now += 150) {
        cr_assert_eq(coord_hb(&r1, 520, now), 0, "%s", err);
        sl_dstate_tick(st, now + 1);
    }
    json_t *v = sl_dstate_job_json(st, r1.job_id, now);
    cr_assert_eq(json_array_size(json_object_get(v, "consumers")), 1, "consumer 0 was released");
    json_decref(v);
    cr_assert_eq(join(ds, "sync", 2, 0, 0, "", now, &again), 0, "%s", err);
    cr_assert_eq(again.first_round, 500);
    cr_assert_eq(again.deliver_from, 520);
    /* Once the job ends nobody comes back: what it remembered goes. */
    cr_assert_eq(release(again.job_id, again.client_id, now + 1), 0, "%s", err);
    v = sl_dstate_job_json(st, r1.job_id, now + 1);
    cr_assert_eq(json_array_size(json_object_get(v, "gone")), 1, "consumer 0 is gone again");
    json_decref(v);
    cr_assert_eq(sl_dstate_job_cancel(st, r1.job_id, "the test is done with it", err, sizeof err), 0, "%s", err);
    v = sl_dstate_job_json(st, r1.job_id, now + 2);
    cr_assert_eq(json_array_size(json_object_get(v, "gone")), 0, "an ended job keeps no gone consumer");
    json_decref(v);
}

/* A restart that never completes (one of the consumers never comes back
 * and is released after client_rejoin_ms) is over once nobody is away: a
 * later restart of one consumer hands out from where the others are, not
 * from where the unfinished restart began. */
Test(state, a_restart_whose_last_consumer_never_came_back_is_over_when_it_is_released)
{
    uint64_t ds = start_away_clients(0); /* away after 200 ms, released after 100 s */
    sluice_GetOrCreateJobResponse r[3];
    const uint64_t was[3] = {100, 110, 105};
    for (uint32_t i = 0; i < 3; i++) {
        cr_assert_eq(join(ds, "sync", 3, i, 0, "", 0, &r[i]), 0, "%s", err);
        cr_assert_eq(coord_hb(&r[i], was[i], 0), 0, "%s", err);
    }
    cr_assert_eq(coord_hb(&r[2], 105, 150), 0, "%s", err);
    sl_dstate_tick(st, 201); /* 0 and 1 away */
    cr_assert_eq(join(ds, "sync", 3, 0, 0, "", 202, &r[0]), 0, "%s", err);
    cr_assert_eq(r[0].deliver_from, 110);
    /* 1 never comes back: released after 100 s, while 0 and 2 read on. */
    int64_t now = 202;
    for (; now < 100500; now += 150) {
        cr_assert_eq(coord_hb(&r[0], 520, now), 0, "%s", err);
        cr_assert_eq(coord_hb(&r[2], 500, now), 0, "%s", err);
        sl_dstate_tick(st, now + 1);
    }
    json_t *v = sl_dstate_job_json(st, r[0].job_id, now);
    cr_assert_eq(json_array_size(json_object_get(v, "consumers")), 2, "consumer 1 was released");
    json_decref(v);
    /* 2 is restarted alone: it starts where 0 is, not where the restart
     * that never completed began. */
    cr_assert_eq(coord_hb(&r[0], 520, now + 150), 0, "%s", err);
    sl_dstate_tick(st, now + 201);
    cr_assert_eq(stats().clients_away, 1, "2 alone is away");
    sluice_GetOrCreateJobResponse again;
    cr_assert_eq(join(ds, "sync", 3, 2, 0, "", now + 202, &again), 0, "%s", err);
    cr_assert_eq(again.first_round, 500);
    cr_assert_eq(again.deliver_from, 520);
}

Test(state, an_ended_job_keeps_no_client_away)
{
    sl_dstate_config_t cfg;
    test_config(&cfg); /* client_timeout_ms 200 */
    cfg.client_rejoin_ms = 100000;
    cfg.job_gc_timeout_ms = 1000000;
    start(&cfg);
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t c;
    uint64_t j = job(ds, "ended", SL_SHARDING_OFF, 0, &c);
    sl_dstate_tick(st, 201);
    cr_assert_eq(stats().clients_away, 1);
    cr_assert_eq(sl_dstate_job_cancel(st, j, "test", err, sizeof err), 0, "%s", err);
    sl_dstate_tick(st, 202);
    cr_assert_eq(client_hb(j, c, 203), SL_ENOTFOUND, "released once its job ended");
    cr_assert_not_null(strstr(err, "released"), "%s", err);
}

Test(state, coordinated_join_and_loss_happen_past_every_horizon_given)
{
    start_default(); /* lookahead 64 */
    worker("h:1", 0);
    uint64_t ds = dataset(FOREVER_SPEC);
    sluice_GetOrCreateJobResponse r;
    cr_assert_eq(join(ds, "c", 1, 0, 0, "", 0, &r), 0, "%s", err);
    sluice_ClientHeartbeatRequest req = {.job_id = r.job_id, .client_id = r.client_id, .round = 100};
    memcpy(req.client_secret, r.client_secret, sizeof req.client_secret);
    memset(cresp, 0, sizeof *cresp);
    cr_assert_eq(sl_dstate_client_heartbeat(st, &req, 1, cresp, err, sizeof err), 0);
    cr_assert_eq(cresp->round_horizon, 164);
    uint64_t w2 = worker("h:2", 2);
    req.round = 90; /* a client never moves the horizon back */
    memset(cresp, 0, sizeof *cresp);
    cr_assert_eq(sl_dstate_client_heartbeat(st, &req, 3, cresp, err, sizeof err), 0);
    cr_assert_eq(cresp->round_horizon, 164);
    cr_assert_eq(cresp->tasks_count, 2);
    for (pb_size_t i = 0; i < cresp->tasks_count; i++)
        cr_assert_eq(cresp->tasks[i].start_round, cresp->tasks[i].worker_id == w2 ? 165 : 0);
    /* Lost after the horizon moved to 200 + 64: it serves rounds < 265. */
    req.round = 200;
    cr_assert_eq(sl_dstate_client_heartbeat(st, &req, 50, cresp, err, sizeof err), 0);
    sl_dstate_tick(st, 150); /* both workers silent for over 100 ms: lost */
    memset(cresp, 0, sizeof *cresp);
    cr_assert_eq(sl_dstate_client_heartbeat(st, &req, 150, cresp, err, sizeof err), 0, "%s", err);
    cr_assert_eq(cresp->tasks_count, 2);
    for (pb_size_t i = 0; i < cresp->tasks_count; i++) {
        cr_assert(cresp->tasks[i].lost);
        cr_assert_eq(cresp->tasks[i].end_round, 265);
    }
}

/* A worker drained while it serves coordinated reads serves the rounds up
 * to the horizon and no more; under DYNAMIC it keeps getting splits for
 * them (a task of another job on it gets none), and once every consumer
 * asks for rounds past them its task is done, its worker told to drop it,
 * and the job, which has no end of its own, runs on. */
Test(state, a_drained_workers_coordinated_task_serves_the_rounds_given_then_is_let_go)
{
    start_default(); /* lookahead 64 */
    uint64_t w1 = worker("h:1", 0), w2 = worker("h:2", 0);
    uint64_t ds = dataset(FOREVER_SPEC);
    sluice_GetOrCreateJobResponse r[2];
    for (uint32_t i = 0; i < 2; i++) {
        sluice_GetOrCreateJobRequest req = {.dataset_id = ds, .num_consumers = 2, .consumer_index = i,
                                            .sharding = SL_SHARDING_DYNAMIC, .job_name = "c"};
        memset(&r[i], 0, sizeof r[i]);
        cr_assert_eq(sl_dstate_job_join(st, &req, "", NULL, 0, 0, &r[i], err, sizeof err), 0, "%s", err);
    }
    sluice_TaskDef d1 = take_task(w1, 1), d2 = take_task(w2, 1);
    cr_assert_eq(d1.num_consumers, 2);
    /* An anonymous DYNAMIC job's task on h:2 too. */
    job(dataset(RANGE_SPEC(100000)), NULL, SL_SHARDING_DYNAMIC, 1, NULL);
    report_t running = {d2.task_id, SL_TASK_RUNNING, NULL};
    cr_assert_eq(worker_hb(w2, 1, 1, &running), 0, "%s", err);
    cr_assert_eq(wresp->new_tasks_count, 1);
    uint64_t other = wresp->new_tasks[0].task_id;
    sluice_ClientHeartbeatRequest hb[2];
    for (uint32_t i = 0; i < 2; i++) {
        hb[i] = (sluice_ClientHeartbeatRequest){.job_id = r[i].job_id, .client_id = r[i].client_id, .round = 100};
        memcpy(hb[i].client_secret, r[i].client_secret, sizeof hb[i].client_secret);
        cr_assert_eq(sl_dstate_client_heartbeat(st, &hb[i], 2, cresp, err, sizeof err), 0, "%s", err);
    }
    cr_assert_eq(cresp->round_horizon, 164);
    cr_assert_eq(sl_dstate_worker_drain(st, "h:2", err, sizeof err), 0, "%s", err);
    memset(cresp, 0, sizeof *cresp);
    cr_assert_eq(sl_dstate_client_heartbeat(st, &hb[0], 3, cresp, err, sizeof err), 0, "%s", err);
    for (pb_size_t i = 0; i < cresp->tasks_count; i++) {
        const sluice_TaskInfo *ti = &cresp->tasks[i];
        cr_assert(!ti->lost);
        cr_assert_eq(ti->end_round, ti->task_id == d2.task_id ? 165 : 0, "task %" PRIu64, ti->task_id);
    }
    /* Its coordinated task still gets splits; a task of another job there none. */
    cr_assert_eq(splits(d2.task_id, 0, 4), 0, "%s", err);
    cr_assert_gt(sresp->splits_count, 0, "the drained coordinated task got no split");
    cr_assert(!sresp->finished);
    cr_assert_eq(splits(other, 0, 4), 0, "%s", err);
    cr_assert_eq(sresp->splits_count, 0);
    cr_assert(sresp->finished, "a drained worker's task of another job got splits");
    /* One consumer past its rounds is not enough. */
    hb[0].round = 165;
    cr_assert_eq(sl_dstate_client_heartbeat(st, &hb[0], 4, cresp, err, sizeof err), 0, "%s", err);
    cr_assert_eq(worker_hb(w2, 5, 1, &running), 0, "%s", err);
    cr_assert(!removed(d2.task_id));
    hb[1].round = 170;
    cr_assert_eq(sl_dstate_client_heartbeat(st, &hb[1], 6, cresp, err, sizeof err), 0, "%s", err);
    cr_assert_eq(worker_hb(w2, 7, 1, &running), 0, "%s", err);
    cr_assert(removed(d2.task_id), "the worker is not told to drop the task");
    cr_assert_eq(cresp->job_state, SL_JOB_RUNNING);
    /* Listed still (its rounds below 165 are its), and the job runs on with h:1 alone. */
    cr_assert(client_sees_task(d2.task_id));
    report_t running1 = {d1.task_id, SL_TASK_RUNNING, NULL};
    cr_assert_eq(worker_hb(w1, 8, 1, &running1), 0, "%s", err);
    cr_assert_eq(sl_dstate_client_heartbeat(st, &hb[1], 9, cresp, err, sizeof err), 0, "%s", err);
    cr_assert_eq(cresp->job_state, SL_JOB_RUNNING);
}

/* The workers given a task are told once, until a heartbeat answer lists
 * it (WORKER_NOTICE, sent by the server once the task is committed). */
Test(state, workers_given_a_task_are_noticed_once_until_a_heartbeat_lists_it)
{
    start_default();
    uint64_t w1 = worker("h:1", 0), w2 = worker("h:2", 0);
    worker_hb(w1, 1, 0, NULL);
    worker_hb(w2, 1, 0, NULL);
    cr_assert_not(sl_dstate_worker_take_notice(st, w1), "no task yet");
    cr_assert_not(sl_dstate_take_notices_due(st));
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t cid;
    job(ds, NULL, SL_SHARDING_OFF, 2, &cid);
    cr_assert(sl_dstate_take_notices_due(st), "the server is to look for workers to tell");
    cr_assert_not(sl_dstate_take_notices_due(st), "once");
    cr_assert(sl_dstate_worker_take_notice(st, w1), "a new job's task");
    cr_assert_not(sl_dstate_worker_take_notice(st, w1), "told once");
    /* w2's heartbeat answer lists its task: nothing left to tell it. */
    take_task(w2, 3);
    cr_assert_not(sl_dstate_worker_take_notice(st, w2), "its heartbeat answer listed the task");
    /* A second job: both are told again; a worker that registers while
     * they run gets their tasks with its first heartbeat's answer. */
    job(ds, NULL, SL_SHARDING_OFF, 4, &cid);
    uint64_t w3 = worker("h:3", 5);
    cr_assert(sl_dstate_worker_take_notice(st, w1));
    cr_assert(sl_dstate_worker_take_notice(st, w2));
    cr_assert_eq(worker_hb(w3, 6, 0, NULL), 0, "%s", err);
    cr_assert_eq(wresp->new_tasks_count, 2, "a task of each running job");
    cr_assert_not(sl_dstate_worker_take_notice(st, w3));
    cr_assert_not(sl_dstate_worker_take_notice(st, 999), "an unknown worker");
}

/* A job's answer lists the tasks its client's first heartbeat lists, with
 * the same keys (the client connects to its workers before that heartbeat). */
static void assert_job_lists_the_heartbeats_tasks(const sluice_GetOrCreateJobResponse *r)
{
    cr_assert_eq(r->tasks_count, cresp->tasks_count, "the job's answer lists %u tasks, the heartbeat's %u",
                 (unsigned)r->tasks_count, (unsigned)cresp->tasks_count);
    for (pb_size_t i = 0; i < r->tasks_count; i++) {
        cr_assert_eq(r->tasks[i].task_id, cresp->tasks[i].task_id);
        cr_assert_str_eq(r->tasks[i].worker_address, cresp->tasks[i].worker_address);
        cr_assert_eq(memcmp(r->tasks[i].task_key, cresp->tasks[i].task_key, sizeof r->tasks[i].task_key), 0,
                     "task %" PRIu64 ": not the key the heartbeat gives", r->tasks[i].task_id);
        cr_assert_eq(r->tasks[i].lost, cresp->tasks[i].lost);
    }
}

Test(state, local_target_lists_only_workers_on_the_clients_host)
{
    start_default();
    worker("10.0.0.1:5060", 0);
    worker("10.0.0.2:5060", 0);
    uint64_t ds = dataset(RANGE_SPEC(10));
    sluice_GetOrCreateJobResponse r;
    cr_assert_eq(join(ds, NULL, 0, 0, SL_TARGET_LOCAL, "10.0.0.3", 0, &r), SL_ENOTFOUND);
    cr_assert_not_null(strstr(err, "no live worker is on this client's host 10.0.0.3"), "%s", err);
    cr_assert_eq(join(ds, NULL, 0, 0, SL_TARGET_LOCAL, "10.0.0.2", 0, &r), 0, "%s", err);
    cr_assert_eq(client_hb(r.job_id, r.client_id, 1), 0);
    cr_assert_eq(cresp->tasks_count, 1);
    cr_assert_str_eq(cresp->tasks[0].worker_address, "10.0.0.2:5060");
    assert_job_lists_the_heartbeats_tasks(&r);
    cr_assert_eq(join(ds, NULL, 0, 0, SL_TARGET_ANY, "10.0.0.2", 0, &r), 0, "%s", err);
    cr_assert_eq(client_hb(r.job_id, r.client_id, 1), 0);
    cr_assert_eq(cresp->tasks_count, 2);
    assert_job_lists_the_heartbeats_tasks(&r);
    /* A second client of the job: its own keys. */
    sluice_GetOrCreateJobResponse r2;
    cr_assert_eq(join(ds, "named", 0, 0, SL_TARGET_ANY, "10.0.0.2", 0, &r2), 0, "%s", err);
    cr_assert_eq(join(ds, "named", 0, 0, SL_TARGET_ANY, "10.0.0.2", 0, &r), 0, "%s", err);
    cr_assert_eq(r.job_id, r2.job_id);
    cr_assert_eq(client_hb(r.job_id, r.client_id, 1), 0);
    assert_job_lists_the_heartbeats_tasks(&r);
    cr_assert_neq(memcmp(r.tasks[0].task_key, r2.tasks[0].task_key, sizeof r.tasks[0].task_key), 0,
                  "two clients were given one key");
}

/* ---- ownership: ids are not capabilities -------------------------------- */

/* A client request with a secret that is not the client's: SL_EPERM. */
static int client_hb_with(uint64_t job_id, uint64_t client_id, const uint8_t secret[16], int64_t now)
{
    sluice_ClientHeartbeatRequest req = {.job_id = job_id, .client_id = client_id};
    memcpy(req.client_secret, secret, sizeof req.client_secret);
    memset(cresp, 0, sizeof *cresp);
    err[0] = '\0';
    return sl_dstate_client_heartbeat(st, &req, now, cresp, err, sizeof err);
}

Test(state, a_client_secret_is_handed_out_at_join_and_differs_by_client)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(100));
    sluice_GetOrCreateJobResponse a, b;
    cr_assert_eq(join(ds, "train", 0, 0, 0, "", 0, &a), 0, "%s", err);
    cr_assert_eq(join(ds, "train", 0, 0, 0, "", 0, &b), 0, "%s", err);
    cr_assert_eq(a.job_id, b.job_id);
    uint8_t want[16], zero[16] = {0};
    sl_dstate_client_secret(st, a.job_id, a.client_id, want);
    cr_assert_arr_eq(a.client_secret, want, 16);
    cr_assert_arr_neq(a.client_secret, b.client_secret, 16);
    cr_assert_arr_neq(a.client_secret, zero, 16);
    /* Another dispatcher's secret makes other capabilities. */
    sl_dstate_t *other = sl_dstate_new(sl_dstate_config(st));
    cr_assert_not_null(other);
    uint8_t theirs[16];
    sl_dstate_client_secret(other, a.job_id, a.client_id, theirs);
    cr_assert_arr_neq(theirs, want, 16);
    sl_dstate_free(other);
}

/* Attack 8: a guessed secret neither renews nor ends another's lease. */
Test(state, client_requests_with_a_wrong_secret_are_refused_and_change_nothing)
{
    start_default(); /* client_timeout_ms 200 */
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t w = worker("w:1", 0);
    sluice_GetOrCreateJobResponse r;
    cr_assert_eq(join(ds, NULL, 0, 0, 0, "", 0, &r), 0, "%s", err);
    take_task(w, 1);
    uint8_t wrong[16] = {0};
    cr_assert_eq(client_hb_with(r.job_id, r.client_id, wrong, 1), SL_EPERM);
    cr_assert(strstr(err, "client_secret is not the one"), "%s", err);
    cr_assert_eq(cresp->tasks_count, 0, "a refused heartbeat lists no task (and no key)");
    /* Refused before any lookup: an unknown client is told the same. */
    cr_assert_eq(client_hb_with(r.job_id, 999999, wrong, 1), SL_EPERM);
    cr_assert_eq(client_hb_with(999999, r.client_id, wrong, 1), SL_EPERM);
    /* Another client's secret is wrong too. */
    sluice_GetOrCreateJobResponse other;
    cr_assert_eq(join(ds, NULL, 0, 0, 0, "", 0, &other), 0, "%s", err);
    cr_assert_eq(client_hb_with(r.job_id, r.client_id, other.client_secret, 1), SL_EPERM);

    sluice_ReleaseClientRequest rel = {.job_id = r.job_id, .client_id = r.client_id};
    cr_assert_eq(sl_dstate_client_release(st, &rel, 2, err, sizeof err), SL_EPERM);
    cr_assert(strstr(err, "RELEASE_CLIENT refused"), "%s", err);
    sluice_ReportReceivedRequest rep = {.job_id = r.job_id, .client_id = r.client_id, .report_gen = 1};
    cr_assert_eq(sl_dstate_client_report(st, &rep, NULL, 0, 2, err, sizeof err), SL_EPERM);
    cr_assert(strstr(err, "REPORT_RECEIVED refused"), "%s", err);

    /* The real client is still there, and its lease was not renewed by
     * the forged heartbeats: it expires from its own last one (join, 0). */
    cr_assert_eq(client_hb_with(r.job_id, r.client_id, r.client_secret, 150), 0, "%s", err);
    cr_assert_eq(cresp->job_state, SL_JOB_RUNNING);
    cr_assert_eq(client_hb_with(r.job_id, r.client_id, wrong, 340), SL_EPERM);
    sl_dstate_tick(st, 351);
    cr_assert_eq(client_hb_with(r.job_id, r.client_id, r.client_secret, 351), SL_ENOTFOUND);
    cr_assert(strstr(err, "released"), "%s", err);
}

Test(state, the_worker_gets_the_task_key_and_each_client_its_own)
{
    uint64_t w1, w2, c;
    sluice_TaskDef d1, d2;
    uint64_t j = two_workers_one_job(&w1, &w2, &c, &d1, &d2);
    uint8_t want[16];
    sl_dstate_task_key(st, d1.task_id, want);
    cr_assert_arr_eq(d1.task_key, want, 16);
    cr_assert_arr_neq(d1.task_key, d2.task_key, 16);
    cr_assert(d1.client_keys && d2.client_keys);
    cr_assert_eq(client_hb(j, c, 2), 0, "%s", err);
    cr_assert_eq(cresp->tasks_count, 2);
    /* The client gets its own key to each task, derived from the task's
     * key and its id, never the task's key itself. */
    for (pb_size_t i = 0; i < cresp->tasks_count; i++) {
        const sluice_TaskDef *d = cresp->tasks[i].task_id == d1.task_id ? &d1 : &d2;
        cr_assert_arr_neq(cresp->tasks[i].task_key, d->task_key, 16);
        cr_assert(sl_task_client_key_ok(d->task_key, c, cresp->tasks[i].task_key));
        cr_assert_not(sl_task_client_key_ok(d->task_key, c + 1, cresp->tasks[i].task_key));
    }
}

/* Attacks 1 and 15: a worker asks only about its own tasks, the jobs it has
 * a task of, the datasets its tasks read. */
Test(state, a_worker_may_ask_only_about_what_its_tasks_are)
{
    start_default();
    uint64_t ds = dataset(RANGE_SPEC(100)), unread = dataset(RANGE_SPEC(7));
    uint64_t w1 = worker("w:1", 0);
    uint64_t c;
    uint64_t j = job(ds, NULL, SL_SHARDING_DYNAMIC, 0, &c);
    uint64_t w2 = worker("w:2", 0); /* joins mid-job: a task of it too */
    uint64_t t1 = take_task(w1, 1).task_id, t2 = take_task(w2, 1).task_id;
    cr_assert_eq(sl_dstate_worker_may(st, w1, SL_DACCESS_TASK, t1, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_dstate_worker_may(st, w1, SL_DACCESS_TASK, t2, err, sizeof err), SL_EPERM);
    char want[128];
    snprintf(want, sizeof want, "task %" PRIu64 " is not worker %" PRIu64 "'s", t2, w1);
    cr_assert(strstr(err, want), "%s", err);
    cr_assert_eq(sl_dstate_worker_may(st, w2, SL_DACCESS_JOB, j, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_dstate_worker_may(st, w2, SL_DACCESS_JOB, j + 1000, err, sizeof err), SL_EPERM);
    cr_assert(strstr(err, "no task of that job"), "%s", err);
    cr_assert_eq(sl_dstate_worker_may(st, w2, SL_DACCESS_DATASET, ds, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_dstate_worker_may(st, w2, SL_DACCESS_DATASET, unread, err, sizeof err), SL_EPERM);
    cr_assert(strstr(err, "none of its tasks reads that dataset"), "%s", err);
    /* A connection that registered no worker may ask nothing. */
    cr_assert_eq(sl_dstate_worker_may(st, 0, SL_DACCESS_DATASET, ds, err, sizeof err), SL_EPERM);
    cr_assert(strstr(err, "WORKER_REGISTER first"), "%s", err);
    /* An unknown task is the request's to answer (SL_ENOTFOUND there). */
    cr_assert_eq(sl_dstate_worker_may(st, w1, SL_DACCESS_TASK, 987654, err, sizeof err), 0);
    /* A worker that registered again (declared lost, same address) may still
     * ask about its old id's tasks while it unwinds them: they answer
     * "finished", and its heartbeat drops them. */
    cr_assert(sl_dstate_worker_disconnected(st, w1, "test"));
    uint64_t w1b = worker("w:1", 2);
    cr_assert_eq(sl_dstate_worker_may(st, w1b, SL_DACCESS_TASK, t1, err, sizeof err), 0, "%s", err);
    report_t old = {t1, SL_TASK_RUNNING, NULL};
    cr_assert_eq(worker_hb(w1b, 3, 1, &old), 0, "%s", err);
    cr_assert(removed(t1));
    /* But not about another live worker's. */
    cr_assert_eq(sl_dstate_worker_may(st, w1b, SL_DACCESS_TASK, t2, err, sizeof err), SL_EPERM);
}

/* ---- the dataset registry's lifecycle (attack 7 of issue 15) ---- */

static bool registered(uint64_t id)
{
    json_t *j = sl_dstate_dataset_json(st, id);
    json_decref(j);
    return j != NULL;
}

Test(state, a_full_registry_drops_the_dataset_unread_for_longest)
{
    sl_dstate_config_t cfg;
    test_config(&cfg);
    cfg.max_datasets = 3;
    start(&cfg);
    sl_dstate_tick(st, 1000);
    uint64_t a = dataset("{\"source\":{\"type\":\"range\",\"stop\":1}}");
    sl_dstate_tick(st, 2000);
    uint64_t b = dataset("{\"source\":{\"type\":\"range\",\"stop\":2}}");
    sl_dstate_tick(st, 3000);
    uint64_t c = dataset("{\"source\":{\"type\":\"range\",\"stop\":3}}");
    uint64_t cid;
    job(a, NULL, SL_SHARDING_OFF, 3000, &cid); /* a is read: b is the oldest unread */
    uint64_t d = dataset("{\"source\":{\"type\":\"range\",\"stop\":4}}");
    cr_assert(registered(a) && !registered(b) && registered(c) && registered(d));
    /* Every dataset read by a running job: refused by name. */
    job(c, NULL, SL_SHARDING_OFF, 3000, &cid);
    job(d, NULL, SL_SHARDING_OFF, 3000, &cid);
    uint64_t e = 0;
    cr_assert_eq(dataset_rc("{\"source\":{\"type\":\"range\",\"stop\":5}}", &e, NULL), SL_ELIMIT);
    cr_assert(strstr(err, "3 datasets") && strstr(err, "running job"), "%s", err);
}

Test(state, unread_datasets_are_collected_and_deleted_on_request)
{
    sl_dstate_config_t cfg;
    test_config(&cfg);
    cfg.dataset_gc_timeout_ms = 10000;
    cfg.job_gc_timeout_ms = 1000000;
    cfg.client_timeout_ms = 1000000;
    start(&cfg);
    sl_dstate_tick(st, 1000);
    uint64_t idle = dataset("{\"source\":{\"type\":\"range\",\"stop\":1}}");
    uint64_t busy = dataset("{\"source\":{\"type\":\"range\",\"stop\":2}}");
    uint64_t cid;
    uint64_t j = job(busy, NULL, SL_SHARDING_OFF, 1000, &cid);
    sl_dstate_tick(st, 5000);
    cr_assert(registered(idle) && registered(busy));
    sl_dstate_tick(st, 11001);
    cr_assert(!registered(idle), "no job read it for the gc timeout");
    cr_assert(registered(busy), "a running job reads it");
    cr_assert_eq(sl_dstate_dataset_delete(st, busy, err, sizeof err), SL_ECONFLICT);
    char want[64];
    snprintf(want, sizeof want, "running job %" PRIu64, j);
    cr_assert(strstr(err, want), "%s", err);
    cr_assert_eq(sl_dstate_job_cancel(st, j, "test", err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_dstate_dataset_delete(st, busy, err, sizeof err), 0, "%s", err);
    cr_assert_null(sl_dstate_job_json(st, j, 12000), "the ended job that read it went with it");
    cr_assert(!registered(busy));
    cr_assert_eq(sl_dstate_dataset_delete(st, busy, err, sizeof err), SL_ENOTFOUND);
}

/* The dispatcher does not spend leases on its own absence: with live
 * workers but no frame from anyone (sl_dstate_heard()) for half the
 * shorter lease, nothing expires; the first frame after it gives every
 * lease a fresh start. One silent peer among talking ones still expires. */
Test(state, a_dispatcher_that_hears_no_one_expires_no_lease)
{
    sl_dstate_config_t cfg;
    test_config(&cfg); /* worker_timeout_ms 100, client_timeout_ms 200 */
    cfg.worker_heartbeat_ms = cfg.client_heartbeat_ms = 10; /* silence after max(100 / 2, 4 * 10) = 50 */
    start(&cfg);
    uint64_t ds = dataset(RANGE_SPEC(100));
    uint64_t w1 = worker("w:1", 0), w2 = worker("w:2", 0);
    uint64_t c;
    uint64_t j = job(ds, NULL, SL_SHARDING_OFF, 0, &c);
    sl_dstate_heard(st, 10);
    cr_assert_eq(worker_hb(w1, 10, 0, NULL), 0, "%s", err);
    cr_assert_eq(worker_hb(w2, 10, 0, NULL), 0, "%s", err);
    cr_assert_eq(client_hb(j, c, 10), 0, "%s", err);
    /* Cut off from 10 to 1000: far past every lease, nothing expires. */
    for (int64_t now = 20; now <= 1000; now += 10)
        sl_dstate_tick(st, now);
    cr_assert_eq(stats().workers_live, 2, "workers lost while the dispatcher heard no one");
    /* Healed: a frame from w1; the next tick starts every lease afresh. */
    sl_dstate_heard(st, 1001);
    cr_assert_eq(worker_hb(w1, 1001, 0, NULL), 0, "%s", err);
    sl_dstate_tick(st, 1002);
    cr_assert_eq(stats().workers_live, 2, "the heal expired the leases of the cut");
    cr_assert_eq(client_hb(j, c, 1050), 0, "the client's lease ran out during the cut: %s", err);
    /* Back to normal: w2 stays silent while w1 and the client talk. */
    for (int64_t now = 1010; now <= 1200; now += 10) {
        sl_dstate_heard(st, now);
        cr_assert_eq(worker_hb(w1, now, 0, NULL), 0, "%s", err);
        cr_assert_eq(client_hb(j, c, now), 0, "%s", err);
        sl_dstate_tick(st, now);
    }
    cr_assert_eq(stats().workers_live, 1, "a worker silent among talking peers was not lost");
}

/* Registrations that never heartbeat (a stranger's, attack 9 of the
 * security issue) are no evidence of a cluster: a dispatcher that hears
 * nothing else loses them on time, silence or not. */
Test(state, registrations_that_never_heartbeat_are_lost_in_silence_too)
{
    sl_dstate_config_t cfg;
    test_config(&cfg);
    cfg.worker_heartbeat_ms = cfg.client_heartbeat_ms = 10;
    start(&cfg);
    sl_dstate_heard(st, 0);
    worker("w:1", 0);
    worker("w:2", 0);
    for (int64_t now = 10; now <= 300; now += 10)
        sl_dstate_tick(st, now);
    cr_assert_eq(stats().workers_live, 0, "registrations without a heartbeat held their places");
}

/* ---- DYNAMIC splits ahead of a task's epoch (cross_epochs) -------------- */

#define REPEAT_SPEC(stop, count)                                                                                     \
    "{\"source\": {\"type\": \"range\", \"stop\": " #stop "}, \"ops\": [{\"op\": \"repeat\", \"count\": " #count "}]}"

/* sl_policy_source_passes() of a spec. */
static uint64_t passes_of(const char *json)
{
    sl_spec_t *spec = NULL;
    cr_assert_eq(sl_spec_parse(json, strlen(json), &spec, err, sizeof err), 0, "%s: %s", json, err);
    uint64_t p = sl_policy_source_passes(spec);
    sl_spec_free(spec);
    return p;
}

Test(state, the_passes_of_a_spec_count_only_epochs_every_pipeline_reads)
{
    cr_assert_eq(passes_of(RANGE_SPEC(10)), 1);
    cr_assert_eq(passes_of(REPEAT_SPEC(10, 3)), 3);
    cr_assert_eq(passes_of(REPEAT_SPEC(10, 0)), 0);
    cr_assert_eq(passes_of(REPEAT_SPEC(10, -1)), UINT64_MAX);
    cr_assert_eq(passes_of("{\"source\": {\"type\": \"range\", \"stop\": 10}, \"ops\": [{\"op\": \"shuffle\", "
                           "\"buffer_size\": 4}, {\"op\": \"repeat\", \"count\": 3}, {\"op\": \"repeat\", \"count\": "
                           "5}, {\"op\": \"batch\", \"batch_size\": 2}, {\"op\": \"skip\", \"count\": 1}]}"),
                 15);
    cr_assert_eq(passes_of("{\"source\": {\"type\": \"range\", \"stop\": 10}, \"ops\": [{\"op\": \"repeat\", "
                           "\"count\": 4611686018427387904}, {\"op\": \"repeat\", \"count\": 8}]}"),
                 UINT64_MAX, "a product past 2^64 is forever");
    /* An op that may end an iteration early, or reads the source its own
     * way: no epoch past the first is certain. */
    cr_assert_eq(passes_of("{\"source\": {\"type\": \"range\", \"stop\": 10}, \"ops\": [{\"op\": \"repeat\", "
                           "\"count\": 3}, {\"op\": \"take\", \"count\": 25}]}"),
                 1);
    cr_assert_eq(passes_of("{\"source\": {\"type\": \"range\", \"stop\": 10}, \"ops\": [{\"op\": \"take\", "
                           "\"count\": 5}, {\"op\": \"repeat\", \"count\": 3}]}"),
                 1);
    cr_assert_eq(passes_of("{\"source\": {\"type\": \"range\", \"stop\": 10}, \"ops\": [{\"op\": \"cache\"}, "
                           "{\"op\": \"repeat\", \"count\": 3}]}"),
                 1);
}

/* get_splits with cross_epochs; the answer is in *sresp. */
static int splits_ahead(uint64_t task_id, uint64_t epoch, uint32_t max)
{
    sluice_GetSplitRequest req = {.task_id = task_id, .epoch = epoch, .max_splits = max, .cross_epochs = true};
    memset(sresp, 0, sizeof *sresp);
    err[0] = '\0';
    return sl_dstate_get_splits(st, &req, 0, sresp, err, sizeof err);
}

Test(state, a_task_that_crosses_epochs_gets_later_epochs_once_its_own_ran_out_and_none_past_the_passes)
{
    start_default();
    uint64_t ds = dataset(REPEAT_SPEC(2500, 3));
    uint64_t w1 = worker("w:1", 0), w2 = worker("w:2", 0);
    job(ds, NULL, SL_SHARDING_DYNAMIC, 0, NULL);
    uint64_t t1 = take_task(w1, 1).task_id, t2 = take_task(w2, 1).task_id;
    /* 3 splits an epoch (1000, 1000 and 500): t1 takes epoch 0's first,
     * then an answer of up to 8 runs on into epoch 1, up to half of a
     * task's share of the 6,500 records left in the three passes (1,625). */
    cr_assert_eq(splits_ahead(t1, 0, 1), 0, "%s", err);
    cr_assert_eq(sresp->splits_count, 1);
    cr_assert_eq(splits_ahead(t1, 0, 8), 0, "%s", err);
    cr_assert_eq(sresp->epoch, 0);
    cr_assert_not(sresp->end_of_epoch);
    cr_assert_eq(sresp->splits_count, 3, "%u splits", (unsigned)sresp->splits_count);
    cr_assert_eq(sresp->splits[0].epoch, 0);
    cr_assert_eq(sresp->splits[1].epoch, 0);
    cr_assert_eq(sresp->splits[1].end, 2500);
    cr_assert_eq(sresp->splits[2].epoch, 1, "epoch 0 ran out: epoch 1 opened for it");
    cr_assert_eq(sresp->splits[2].begin, 0);
    /* t2, still in epoch 0, gets what the cursor has (epoch 1), not the
     * end of epoch 0; a task that does not cross does. */
    cr_assert_eq(splits(t2, 0, 8), 0, "%s", err);
    cr_assert(sresp->end_of_epoch);
    cr_assert_eq(sresp->splits_count, 0);
    uint64_t covered[3] = {2500, 1000, 0};
    for (int calls = 0; calls < 100; calls++) {
        cr_assert_eq(splits_ahead(calls % 2 ? t1 : t2, 0, 8), 0, "%s", err);
        if (sresp->end_of_epoch)
            break;
        for (pb_size_t i = 0; i < sresp->splits_count; i++) {
            const sluice_Split *s = &sresp->splits[i];
            cr_assert_lt(s->epoch, 3, "a split of epoch %" PRIu64 ": past the repeat's 3 passes", s->epoch);
            cr_assert_eq(s->begin, covered[s->epoch], "epoch %" PRIu64 " carries on where it was", s->epoch);
            covered[s->epoch] = s->end;
        }
    }
    cr_assert(sresp->end_of_epoch, "every pass handed out, the answer is the end");
    cr_assert_eq(covered[1], 2500);
    cr_assert_eq(covered[2], 2500);
    /* The last pass's end is every task's, in any epoch it asks about. */
    cr_assert_eq(splits_ahead(t1, 2, 8), 0, "%s", err);
    cr_assert(sresp->end_of_epoch);
    cr_assert_eq(splits_ahead(t2, 1, 8), 0, "%s", err);
    cr_assert(sresp->end_of_epoch);
}

Test(state, a_spec_without_certain_passes_is_handed_out_one_epoch_at_a_time_even_to_tasks_that_cross)
{
    uint64_t t1 = lone_dynamic_task("{\"source\": {\"type\": \"range\", \"stop\": 2000}, \"ops\": [{\"op\": "
                                    "\"repeat\", \"count\": 5}, {\"op\": \"take\", \"count\": 3000}]}");
    cr_assert_eq(splits_ahead(t1, 0, 8), 0, "%s", err);
    cr_assert_eq(sresp->splits_count, 2);
    cr_assert_eq(splits_ahead(t1, 0, 8), 0, "%s", err);
    cr_assert(sresp->end_of_epoch, "a take may end the pipeline in epoch 0: epoch 1 waits for it to ask");
    cr_assert_eq(splits_ahead(t1, 1, 8), 0, "%s", err);
    cr_assert_eq(sresp->splits_count, 2);
    cr_assert_eq(sresp->splits[0].epoch, 1);
}

/* The pipelines of a model of workerd's tasks (task.c): each reads its
 * queued splits of its epoch or earlier ones, asks for more (cross_epochs)
 * with an empty queue, and moves to the next epoch at a later epoch's
 * split or at its epoch's end, until the repeat's passes. */
struct model_task {
    uint64_t id, epoch;
    bool exhausted;
    sluice_Split queue[64];
    unsigned head, n;
};

Test(state, crossing_epochs_hands_every_record_of_every_pass_out_once_at_drawn_sizes)
{
    uint64_t seed = test_seed("crossing_epochs_hands_every_record_of_every_pass_out_once_at_drawn_sizes"), rng = seed;
    for (int round = 0; round < 30; round++) {
        uint64_t records = 1 + splitmix64(&rng) % 20000, passes = 1 + splitmix64(&rng) % 40;
        unsigned ntasks = 1 + (unsigned)(splitmix64(&rng) % 8), max = 1 + (unsigned)(splitmix64(&rng) % 8);
        uint64_t want = splitmix64(&rng) % 4 ? splitmix64(&rng) % 8000 : 0;
        char spec[200];
        snprintf(spec, sizeof spec,
                 "{\"source\": {\"type\": \"range\", \"stop\": %" PRIu64 "}, \"ops\": [{\"op\": \"repeat\", "
                 "\"count\": %" PRIu64 "}]}",
                 records, passes);
        sl_dstate_free(st);
        st = NULL;
        start_default();
        uint64_t ids[8];
        dynamic_job_on(dataset(spec), ntasks, 1, ids);
        struct model_task tasks[8];
        for (unsigned k = 0; k < ntasks; k++)
            tasks[k] = (struct model_task){.id = ids[k]};
        /* Per pass, the records handed out so far: splits come in order. */
        uint64_t *next = calloc(passes, sizeof *next);
        cr_assert_not_null(next);
        unsigned ended = 0;
        for (uint64_t step = 0; ended < ntasks; step++) {
            cr_assert_lt(step, 10000000, "seed %" PRIu64 " round %d: no end", seed, round);
            struct model_task *t = &tasks[splitmix64(&rng) % ntasks];
            if (t->epoch >= passes)
                continue;
            if (t->n > 0 && t->queue[t->head].epoch <= t->epoch) {
                t->head = (t->head + 1) % 64;
                t->n--;
                continue;
            }
            if (t->n > 0 || t->exhausted) {
                /* A later epoch's split, or the end: the next pass. */
                t->exhausted = false;
                if (++t->epoch == passes)
                    ended++;
                continue;
            }
            sluice_GetSplitRequest req = {.task_id = t->id, .epoch = t->epoch, .max_splits = max,
                                          .split_records = want, .cross_epochs = true};
            memset(sresp, 0, sizeof *sresp);
            cr_assert_eq(sl_dstate_get_splits(st, &req, 0, sresp, err, sizeof err), 0, "seed %" PRIu64 ": %s", seed,
                         err);
            cr_assert_leq(sresp->splits_count, max);
            t->exhausted = sresp->end_of_epoch;
            for (pb_size_t i = 0; i < sresp->splits_count; i++) {
                const sluice_Split *s = &sresp->splits[i];
                cr_assert_lt(s->epoch, passes, "seed %" PRIu64 " round %d: epoch %" PRIu64 " of %" PRIu64 " passes",
                             seed, round, s->epoch, passes);
                cr_assert_geq(s->epoch, t->epoch, "seed %" PRIu64 ": a split of an epoch its task left", seed);
                cr_assert_eq(s->begin, next[s->epoch], "seed %" PRIu64 " round %d: epoch %" PRIu64
                             " split [%" PRIu64 ", %" PRIu64 ") after %" PRIu64, seed, round, s->epoch, s->begin,
                             s->end, next[s->epoch]);
                cr_assert_gt(s->end, s->begin);
                next[s->epoch] = s->end;
                t->queue[(t->head + t->n++) % 64] = *s;
            }
        }
        for (uint64_t e = 0; e < passes; e++)
            cr_assert_eq(next[e], records, "seed %" PRIu64 " round %d: epoch %" PRIu64 " handed out up to %" PRIu64
                         " of %" PRIu64, seed, round, e, next[e], records);
        free(next);
    }
}
