/*
 * test_outstanding.c: DYNAMIC splits exactly once across a worker loss
 * (dispatcher/outstanding.c), through the state machine's public calls and
 * a real LMDB store: a lost task's splits wait for every client's report,
 * go out again first without what the clients have, are forgotten once
 * every client confirmed them, survive a restart, and keep the job from
 * finishing until nothing is left.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "dstate_util.h"
#include "le.h"
#include "log.h"
#include "persist.h"
#include "posbits.h"
#include "posset.h"
#include "seed_util.h"
#include "sluice.h"
#include "state.h"
#include "state_types.h"
#include "store.h"

static char dir[64];
static sl_store_t *store;
static sl_dstate_t *st;
static char err[1024];
static sluice_ClientHeartbeatResponse *hb;
static sluice_WorkerHeartbeatRequest *wreq;
static sluice_WorkerHeartbeatResponse *wresp;

static void setup(void)
{
    sl_log_init("test_outstanding", -1);
    snprintf(dir, sizeof dir, "/tmp/sl-out-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    store = open_state_store(dir, 0);
    hb = calloc(1, sizeof *hb);
    wreq = calloc(1, sizeof *wreq);
    wresp = calloc(1, sizeof *wresp);
}

static void teardown(void)
{
    sl_dstate_free(st);
    st = NULL;
    sl_store_close(store);
    store = NULL;
    free(hb);
    free(wreq);
    free(wresp);
    remove_dir(dir);
}

TestSuite(outstanding, .init = setup, .fini = teardown);

static uint64_t worker(const char *address)
{
    uint64_t id;
    cr_assert_eq(sl_dstate_worker_register(st, address, 0, &id, err, sizeof err), 0, "%s", err);
    return id;
}

/* A named DYNAMIC job over range(1000) with two clients. */
static uint64_t job(uint64_t *c1, uint64_t *c2)
{
    const char *spec = "{\"source\": {\"type\": \"range\", \"stop\": 1000}}";
    uint64_t ds, job_id;
    const char *fp;
    cr_assert_eq(sl_dstate_dataset_register(st, spec, strlen(spec), &ds, &fp, err, sizeof err), 0, "%s", err);
    sluice_GetOrCreateJobRequest req = {.dataset_id = ds, .sharding = SL_SHARDING_DYNAMIC, .job_name = "shared"};
    cr_assert_eq(sl_dstate_job_get_or_create(st, &req, 0, &job_id, c1, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_dstate_job_get_or_create(st, &req, 0, &job_id, c2, err, sizeof err), 0, "%s", err);
    return job_id;
}

/* A named DYNAMIC job over range(n) with nclients clients, ids *first,
 * *first + 1, ... */
static uint64_t big_job(uint64_t n, unsigned nclients, uint64_t *first)
{
    char spec[128];
    snprintf(spec, sizeof spec, "{\"source\": {\"type\": \"range\", \"stop\": %" PRIu64 "}}", n);
    uint64_t ds, job_id, c;
    const char *fp;
    cr_assert_eq(sl_dstate_dataset_register(st, spec, strlen(spec), &ds, &fp, err, sizeof err), 0, "%s", err);
    sluice_GetOrCreateJobRequest req = {.dataset_id = ds, .sharding = SL_SHARDING_DYNAMIC, .job_name = "shared"};
    for (unsigned i = 0; i < nclients; i++) {
        cr_assert_eq(sl_dstate_job_get_or_create(st, &req, 0, &job_id, &c, err, sizeof err), 0, "%s", err);
        if (i == 0)
            *first = c;
        else
            cr_assert_eq(c, *first + i, "client ids follow each other");
    }
    return job_id;
}

static json_t *job_view(uint64_t job_id)
{
    json_t *j = sl_dstate_job_json(st, job_id, 0);
    cr_assert_not_null(j);
    return j;
}

/* The id of the job's task on worker w (the last one, when it has two). */
static uint64_t task_of(uint64_t job_id, uint64_t w)
{
    json_t *j = job_view(job_id);
    uint64_t id = 0;
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(j, "tasks"), i, t)
        if ((uint64_t)json_integer_value(json_object_get(t, "worker_id")) == w)
            id = (uint64_t)json_integer_value(json_object_get(t, "task_id"));
    json_decref(j);
    cr_assert_neq(id, 0);
    return id;
}

static json_int_t lost_splits(uint64_t job_id, const char *field)
{
    json_t *j = job_view(job_id);
    json_int_t v = json_integer_value(json_object_get(json_object_get(j, "lost_splits"), field));
    json_decref(j);
    return v;
}

static const char *job_state(uint64_t job_id)
{
    static char state[32];
    json_t *j = job_view(job_id);
    snprintf(state, sizeof state, "%s", json_string_value(json_object_get(j, "state")));
    json_decref(j);
    return state;
}

static void get_splits_for(uint64_t task, uint64_t seq, uint32_t max, bool for_extra, sluice_GetSplitResponse *r)
{
    sluice_GetSplitRequest req = {.task_id = task, .epoch = 0, .max_splits = max, .request_seq = seq,
                                  .for_extra = for_extra};
    *r = (sluice_GetSplitResponse)sluice_GetSplitResponse_init_zero;
    cr_assert_eq(sl_dstate_get_splits(st, &req, 0, r, err, sizeof err), 0, "%s", err);
}

static void get_splits(uint64_t task, uint64_t seq, uint32_t max, sluice_GetSplitResponse *r)
{
    get_splits_for(task, seq, max, false, r);
}

/* A client heartbeat at `now` saying how far each of n tasks reached it. */
static void heartbeat_at(int64_t now, uint64_t job_id, uint64_t client, unsigned n, const uint64_t *tasks,
                         const uint64_t *below)
{
    sluice_ClientHeartbeatRequest *req = calloc(1, sizeof *req);
    req->job_id = job_id;
    req->client_id = client;
    sl_dstate_client_secret(st, job_id, client, req->client_secret);
    for (unsigned i = 0; i < n; i++)
        req->progress[req->progress_count++] = (sluice_TaskProgress){.task_id = tasks[i], .done_below = below[i]};
    memset(hb, 0, sizeof *hb);
    cr_assert_eq(sl_dstate_client_heartbeat(st, req, now, hb, err, sizeof err), 0, "%s", err);
    free(req);
}

static void heartbeat(uint64_t job_id, uint64_t client, unsigned n, const uint64_t *tasks, const uint64_t *below)
{
    heartbeat_at(0, job_id, client, n, tasks, below);
}

/* Client's report of the records in set for job_id's lost splits at
 * generation gen. @return what the dispatcher answered */
static int client_report(uint64_t job_id, uint64_t client, uint64_t gen, const sl_posset_t *set)
{
    sluice_ReportReceivedRequest req = {.job_id = job_id, .client_id = client, .report_gen = gen};
    sl_dstate_client_secret(st, job_id, client, req.client_secret);
    return send_report(st, &req, set, 0, err, sizeof err);
}

/* A client's report: the runs (begin, count) of file 0, epoch 0 it received. */
static int report(uint64_t job_id, uint64_t client, uint64_t gen, unsigned n, const uint64_t (*runs)[2])
{
    sl_posset_t s;
    sl_posset_init(&s, 1000);
    for (unsigned i = 0; i < n; i++)
        cr_assert_eq(sl_posset_add(&s, 0, 0, runs[i][0], runs[i][1], NULL), 0);
    int rc = client_report(job_id, client, gen, &s);
    sl_posset_clear(&s);
    return rc;
}

/* Worker w's heartbeat: task DONE with done_below (task 0: it reports no
 * task). @return the answer, valid until the next call */
static const sluice_WorkerHeartbeatResponse *worker_hb(uint64_t w, uint64_t task, uint64_t done_below)
{
    memset(wreq, 0, sizeof *wreq);
    memset(wresp, 0, sizeof *wresp);
    wreq->worker_id = w;
    if (task) {
        wreq->tasks_count = 1;
        wreq->tasks[0] = (sluice_TaskStatus){.task_id = task, .state = SL_TASK_DONE, .done_below = done_below};
    }
    cr_assert_eq(sl_dstate_worker_heartbeat(st, wreq, 0, wresp, err, sizeof err), 0, "%s", err);
    return wresp;
}

static void save(void)
{
    cr_assert_eq(sl_dpersist_save(st, store, err, sizeof err), 0, "%s", err);
}

static void restart(void)
{
    sl_dstate_free(st);
    st = new_state();
    cr_assert_eq(sl_dpersist_load(st, store, 0, err, sizeof err), 0, "%s", err);
}

Test(outstanding, a_lost_tasks_splits_go_again_without_what_the_clients_received)
{
    st = new_state();
    uint64_t wa = worker("127.0.0.1:1"), wb = worker("127.0.0.1:2");
    uint64_t c1, c2, j = job(&c1, &c2);
    uint64_t ta = task_of(j, wa), tb = task_of(j, wb);
    sluice_GetSplitResponse r;
    get_splits(ta, 1, 3, &r); /* [0,100) [100,200) [200,300) */
    cr_assert_eq(r.splits_count, 3);
    cr_assert_eq(r.splits[2].end, 300);
    cr_assert_eq(lost_splits(j, "outstanding"), 3);

    cr_assert(sl_dstate_worker_disconnected(st, wa, "reset by peer"));
    cr_assert_eq(lost_splits(j, "awaiting_reports"), 3);
    /* The lost task's worker may still be alive: it gets nothing more,
     * not even its last answer again. */
    get_splits(ta, 2, 3, &r);
    cr_assert_eq(r.splits_count, 0);
    cr_assert(r.finished);
    get_splits(ta, 1, 3, &r);
    cr_assert_eq(r.splits_count, 0);
    heartbeat(j, c1, 0, NULL, NULL);
    cr_assert_eq(hb->report_gen, 1);
    cr_assert_eq(hb->report_from_epoch, 0);
    for (pb_size_t i = 0; i < hb->tasks_count; i++)
        cr_assert_neq(hb->tasks[i].task_id, ta, "a client no longer reads the lost task");

    /* Until every client reported, the lost splits wait; new ones go out. */
    const uint64_t got1[][2] = {{0, 50}, {120, 10}, {900, 5}};
    cr_assert_eq(report(j, c1, 1, 3, got1), 0, "%s", err);
    cr_assert_eq(lost_splits(j, "awaiting_reports"), 3);
    get_splits(tb, 1, 1, &r);
    cr_assert_eq(r.splits_count, 1);
    cr_assert_eq(r.splits[0].begin, 300);
    /* A report for an older generation changes nothing. */
    const uint64_t none[][2] = {{0, 1}};
    cr_assert_eq(report(j, c2, 0, 1, none), 0);
    cr_assert_eq(lost_splits(j, "awaiting_reports"), 3);
    const uint64_t got2[][2] = {{50, 50}};
    cr_assert_eq(report(j, c2, 1, 1, got2), 0, "%s", err);
    cr_assert_eq(lost_splits(j, "queued"), 3);

    /* [0,100) arrived whole: dropped. [100,200) goes out again without
     * [120,130), in its own epoch; then [200,300) whole. */
    get_splits(tb, 2, 8, &r);
    cr_assert_eq(r.splits_count, 2);
    cr_assert_eq(r.splits[0].begin, 100);
    cr_assert_eq(r.splits[0].end, 200);
    cr_assert_eq(r.splits[0].epoch, 0);
    cr_assert_eq(r.splits[0].skip_count, 1);
    size_t len;
    const uint8_t *skips = sl_dstate_split_skips(st, tb, &len);
    cr_assert_eq(len, 16);
    uint64_t k[2];
    memcpy(k, skips + r.splits[0].skip_offset, sizeof k);
    cr_assert_eq(k[0], 120);
    cr_assert_eq(k[1], 10);
    cr_assert_eq(r.splits[1].begin, 200);
    cr_assert_eq(r.splits[1].end, 300);
    cr_assert_eq(r.splits[1].skip_count, 0);
    cr_assert_eq(lost_splits(j, "queued"), 0);
    cr_assert_gt(r.splits[0].split_id, 3, "a split handed out again gets a new id");
}

/* lost_splits.confirmed_below's record (epoch 0, file 0 asserted). */
static json_int_t confirmed_below(uint64_t job_id)
{
    json_t *j = job_view(job_id);
    json_t *at = json_object_get(json_object_get(j, "lost_splits"), "confirmed_below");
    cr_assert_eq(json_array_size(at), 3);
    cr_assert_eq(json_integer_value(json_array_get(at, 0)), 0);
    cr_assert_eq(json_integer_value(json_array_get(at, 1)), 0);
    json_int_t v = json_integer_value(json_array_get(at, 2));
    json_decref(j);
    return v;
}

/* Coordinated consumer `client` says it asks for `round` next. */
static void round_heartbeat(uint64_t job_id, uint64_t client, uint64_t round)
{
    sluice_ClientHeartbeatRequest *req = calloc(1, sizeof *req);
    *req = (sluice_ClientHeartbeatRequest){.job_id = job_id, .client_id = client, .round = round};
    sl_dstate_client_secret(st, job_id, client, req->client_secret);
    memset(hb, 0, sizeof *hb);
    cr_assert_eq(sl_dstate_client_heartbeat(st, req, 0, hb, err, sizeof err), 0, "%s", err);
    free(req);
}

/* A named DYNAMIC job of coordinated reads over range(1000) repeated, with
 * consumers c[0] and c[1]. */
static uint64_t coord_job(uint64_t c[2])
{
    const char *spec = "{\"source\": {\"type\": \"range\", \"stop\": 1000}, \"ops\": [{\"op\": \"repeat\"}]}";
    uint64_t ds, j;
    const char *fp;
    cr_assert_eq(sl_dstate_dataset_register(st, spec, strlen(spec), &ds, &fp, err, sizeof err), 0, "%s", err);
    for (uint32_t i = 0; i < 2; i++) {
        sluice_GetOrCreateJobRequest req = {.dataset_id = ds, .sharding = SL_SHARDING_DYNAMIC, .job_name = "coord",
                                            .num_consumers = 2, .consumer_index = i};
        cr_assert_eq(sl_dstate_job_get_or_create(st, &req, 0, &j, &c[i], err, sizeof err), 0, "%s", err);
    }
    return j;
}

Test(outstanding, coordinated_reads_hand_out_again_what_a_drained_or_lost_worker_did_not_serve)
{
    st = new_state();
    uint64_t wa = worker("127.0.0.1:1"), wb = worker("127.0.0.1:2");
    uint64_t c[2], j = coord_job(c);
    uint64_t ta = task_of(j, wa), tb = task_of(j, wb);
    sluice_GetSplitResponse r;
    get_splits(ta, 1, 2, &r);
    cr_assert_eq(r.splits_count, 2);
    uint64_t first_end = r.splits[0].end, a_id = r.splits[0].split_id;
    get_splits(tb, 1, 1, &r);
    cr_assert_eq(r.splits_count, 1);
    uint64_t b_begin = r.splits[0].begin, b_end = r.splits[0].end;
    cr_assert_eq(lost_splits(j, "outstanding"), 3, "coordinated reads keep their splits outstanding");
    cr_assert_eq(confirmed_below(j), 0);

    /* Both consumers received ta's first split whole: it is forgotten. */
    const uint64_t below = a_id + 1;
    heartbeat(j, c[0], 1, &ta, &below);
    cr_assert_eq(lost_splits(j, "outstanding"), 3, "one consumer alone confirms nothing");
    heartbeat(j, c[1], 1, &ta, &below);
    cr_assert_eq(lost_splits(j, "outstanding"), 2);
    cr_assert_eq(confirmed_below(j), (json_int_t)first_end);
    /* The consumers are told so: their ledgers drop what lies before it. */
    cr_assert(hb->has_confirmed_below);
    cr_assert_eq(hb->confirmed_below.epoch, 0);
    cr_assert_eq(hb->confirmed_below.file, 0);
    cr_assert_eq(hb->confirmed_below.record, first_end);

    /* wb is drained: its task serves the rounds below its end, then, once
     * both consumers are past them, is done, and what it did not serve
     * waits for the consumers' reports. */
    cr_assert_eq(sl_dstate_worker_drain(st, "127.0.0.1:2", err, sizeof err), 0, "%s", err);
    json_t *v = job_view(j);
    uint64_t end = 0;
    json_t *tasks = json_object_get(v, "tasks");
    for (size_t i = 0; i < json_array_size(tasks); i++)
        if ((uint64_t)json_integer_value(json_object_get(json_array_get(tasks, i), "task_id")) == tb)
            end = (uint64_t)json_integer_value(json_object_get(json_object_get(json_array_get(tasks, i), "rounds"),
                                                               "end"));
    json_decref(v);
    cr_assert_gt(end, 0);
    round_heartbeat(j, c[0], end);
    cr_assert_eq(lost_splits(j, "awaiting_reports"), 0, "consumer 1 may still need the drained task's rounds");
    round_heartbeat(j, c[1], end);
    cr_assert_eq(lost_splits(j, "awaiting_reports"), 1);
    cr_assert_eq(hb->report_gen, 1);
    cr_assert(hb->has_confirmed_below);
    cr_assert_eq((json_int_t)hb->confirmed_below.record, confirmed_below(j));
    const uint64_t got0[][2] = {{b_begin, 10}}, got1[][2] = {{b_begin + 10, 5}};
    cr_assert_eq(report(j, c[0], 1, 1, got0), 0, "%s", err);
    cr_assert_eq(lost_splits(j, "queued"), 0, "consumer 1 has not reported");
    cr_assert_eq(report(j, c[1], 1, 1, got1), 0, "%s", err);
    cr_assert_eq(lost_splits(j, "queued"), 1);
    get_splits(ta, 2, 1, &r);
    cr_assert_eq(r.splits_count, 1);
    cr_assert_eq(r.splits[0].begin, b_begin);
    cr_assert_eq(r.splits[0].end, b_end);
    cr_assert_eq(r.splits[0].skip_count, 1, "what the consumers received is not handed out again");
    size_t len;
    const uint8_t *skips = sl_dstate_split_skips(st, ta, &len);
    uint64_t k[2];
    cr_assert_eq(len, 16);
    memcpy(k, skips + r.splits[0].skip_offset, sizeof k);
    cr_assert_eq(k[0], b_begin);
    cr_assert_eq(k[1], 15);

    /* wa is lost: its splits, the one it got again too, wait for reports. */
    unsigned held = (unsigned)lost_splits(j, "outstanding");
    cr_assert_eq(held, 2);
    cr_assert(sl_dstate_worker_disconnected(st, wa, "reset by peer"));
    cr_assert_eq(lost_splits(j, "awaiting_reports"), held);
    cr_assert_eq(confirmed_below(j), (json_int_t)first_end);
}

/* ClientHeartbeatResponse.epochs_done and confirmed_below come from one
 * place: the least split not confirmed, else the cursor, whose epoch is
 * done once it is past the epoch's last file. */
Test(outstanding, an_epoch_is_done_once_its_last_split_reached_every_consumer)
{
    st = new_state();
    uint64_t wa = worker("127.0.0.1:1");
    uint64_t c[2], j = coord_job(c);
    uint64_t ta = task_of(j, wa);
    sluice_GetSplitResponse r;
    uint64_t last = 0;
    for (uint64_t seq = 1;; seq++) {
        get_splits(ta, seq, 64, &r);
        if (r.splits_count == 0)
            break;
        last = r.splits[r.splits_count - 1].split_id;
        cr_assert_eq(r.splits[0].epoch, 0, "no task asked for epoch 1");
    }
    cr_assert(r.end_of_epoch);
    const uint64_t below = last + 1;
    heartbeat(j, c[0], 1, &ta, &below);
    cr_assert_eq(hb->epochs_done, 0, "consumer 1 has not confirmed epoch 0's splits");
    cr_assert(hb->has_confirmed_below);
    cr_assert_eq(hb->confirmed_below.epoch, 0);
    cr_assert_eq(hb->confirmed_below.file, 0);
    cr_assert_eq(hb->confirmed_below.record, 0);
    heartbeat(j, c[1], 1, &ta, &below);
    cr_assert_eq(hb->epochs_done, 1);
    cr_assert_eq(hb->confirmed_below.epoch, 0);
    cr_assert_eq(hb->confirmed_below.file, 1, "the cursor, past the only file");
    cr_assert_eq(hb->confirmed_below.record, 0);
}

Test(outstanding, splits_are_forgotten_once_every_client_has_them)
{
    st = new_state();
    uint64_t wa = worker("127.0.0.1:1");
    uint64_t c1, c2, j = job(&c1, &c2);
    uint64_t ta = task_of(j, wa);
    sluice_GetSplitResponse r;
    get_splits(ta, 1, 4, &r);
    uint64_t first = r.splits[0].split_id;
    save();
    uint64_t below = first + 2;
    heartbeat(j, c1, 1, &ta, &below);
    cr_assert_eq(lost_splits(j, "outstanding"), 4, "one client is not all of them");
    heartbeat(j, c2, 1, &ta, &below);
    cr_assert_eq(lost_splits(j, "outstanding"), 2);
    cr_assert(hb->has_confirmed_below, "a named job's clients are told too (they say how far they gave it)");
    /* A smaller done_below later changes nothing (it only grows). */
    uint64_t less = first;
    heartbeat(j, c2, 1, &ta, &less);
    cr_assert_eq(lost_splits(j, "outstanding"), 2);
    save();
    restart();
    cr_assert_eq(lost_splits(j, "outstanding"), 2, "the forgotten ones are gone from the store too");
    /* A client that leaves is no longer waited for. */
    below = first + 4;
    heartbeat(j, c1, 1, &ta, &below);
    cr_assert_eq(lost_splits(j, "outstanding"), 2);
    sluice_ReleaseClientRequest rel = {.job_id = j, .client_id = c2};
    sl_dstate_client_secret(st, j, c2, rel.client_secret);
    cr_assert_eq(sl_dstate_client_release(st, &rel, 0, err, sizeof err), 0, "%s", err);
    cr_assert_eq(lost_splits(j, "outstanding"), 0);
}

Test(outstanding, lost_splits_and_reports_survive_a_restart)
{
    st = new_state();
    uint64_t wa = worker("127.0.0.1:1"), wb = worker("127.0.0.1:2");
    uint64_t c1, c2, j = job(&c1, &c2);
    uint64_t ta = task_of(j, wa), tb = task_of(j, wb);
    sluice_GetSplitResponse r;
    get_splits(ta, 1, 2, &r); /* [0,100) [100,200) */
    save();
    cr_assert(sl_dstate_worker_disconnected(st, wa, "gone"));
    const uint64_t got1[][2] = {{10, 20}};
    cr_assert_eq(report(j, c1, 1, 1, got1), 0, "%s", err);
    save();
    restart();
    cr_assert_eq(lost_splits(j, "awaiting_reports"), 2);
    /* The generation moved on: who reported before the restart is asked again. */
    cr_assert_eq(lost_splits(j, "report_gen"), 2);
    cr_assert_eq(report(j, c1, 2, 0, NULL), 0, "%s", err);
    cr_assert_eq(report(j, c2, 2, 0, NULL), 0, "%s", err);
    get_splits(tb, 1, 8, &r);
    cr_assert_eq(r.splits_count, 2);
    cr_assert_eq(r.splits[0].begin, 0);
    cr_assert_eq(r.splits[0].skip_count, 1, "what c1 said before the restart is kept");
}

/* A lost split whose skips fill an answer goes out in parts: the rest
 * waits as a lost split from the first part's end. Its stored record held
 * the runs of the part handed out too, before its begin, and the next
 * start refused the store ("a run of what the consumers have is empty,
 * overlapping or outside the split"): a dispatcher restarted after such an
 * answer did not start. */
Test(outstanding, a_lost_split_handed_out_in_parts_survives_a_restart)
{
    sl_dstate_config_t cfg;
    sl_dstate_config_init(&cfg);
    cfg.split_size = 100;
    cfg.max_skip_bytes = 32; /* two skip runs an answer */
    st = sl_dstate_new(&cfg);
    cr_assert_not_null(st);
    uint64_t wa = worker("127.0.0.1:1"), wb = worker("127.0.0.1:2");
    uint64_t c1, c2, j = job(&c1, &c2);
    uint64_t ta = task_of(j, wa), tb = task_of(j, wb);
    sluice_GetSplitResponse r;
    get_splits(ta, 1, 1, &r); /* [0,100) */
    cr_assert_eq(r.splits_count, 1);
    save();
    cr_assert(sl_dstate_worker_disconnected(st, wa, "gone"));
    const uint64_t got[][2] = {{10, 5}, {30, 5}, {50, 5}, {70, 5}};
    cr_assert_eq(report(j, c1, 1, 4, got), 0, "%s", err);
    cr_assert_eq(report(j, c2, 1, 0, NULL), 0, "%s", err);
    get_splits(tb, 1, 8, &r);
    cr_assert_eq(r.splits_count, 1, "no room for the rest's skips in this answer");
    cr_assert_eq(r.splits[0].begin, 0);
    cr_assert_eq(r.splits[0].end, 50);
    cr_assert_eq(r.splits[0].skip_count, 2);
    save();
    restart();
    cr_assert_eq(lost_splits(j, "queued"), 1);
    get_splits(tb, 2, 8, &r);
    cr_assert_eq(r.splits_count, 1);
    cr_assert_eq(r.splits[0].begin, 50);
    cr_assert_eq(r.splits[0].end, 100);
    cr_assert_eq(r.splits[0].skip_count, 2);
    size_t len;
    const uint8_t *skips = sl_dstate_split_skips(st, tb, &len);
    cr_assert_eq(len, 32);
    uint64_t k[4];
    memcpy(k, skips + r.splits[0].skip_offset, sizeof k);
    cr_assert_eq(k[0], 50);
    cr_assert_eq(k[1], 5);
    cr_assert_eq(k[2], 70);
    cr_assert_eq(k[3], 5);
    cr_assert_eq(lost_splits(j, "queued"), 0);
}

Test(outstanding, the_job_waits_for_lost_splits_and_a_live_worker_takes_them)
{
    st = new_state();
    uint64_t wa = worker("127.0.0.1:1"), wb = worker("127.0.0.1:2");
    uint64_t c1, c2, j = job(&c1, &c2);
    uint64_t ta = task_of(j, wa), tb = task_of(j, wb);
    sluice_GetSplitResponse r;
    get_splits(ta, 1, 5, &r); /* the guided hand-out gives it [0,300) of 10 splits for 2 tasks */
    pb_size_t held = r.splits_count;
    cr_assert_eq(held, 3);
    get_splits(tb, 1, 8, &r);
    uint64_t seq = 2;
    while (!r.end_of_epoch)
        get_splits(tb, seq++, 8, &r);
    /* b ended its pipeline and its clients have all of its splits. */
    worker_hb(wb, tb, 1000);
    uint64_t below = 1000;
    heartbeat(j, c1, 1, &tb, &below);
    heartbeat(j, c2, 1, &tb, &below);
    cr_assert_str_eq(job_state(j), "RUNNING", "a's splits are not confirmed");
    /* a dies: its splits wait for reports, then b's worker gets a new task. */
    cr_assert(sl_dstate_worker_disconnected(st, wa, "gone"));
    cr_assert_eq(report(j, c1, 1, 0, NULL), 0, "%s", err);
    cr_assert_eq(report(j, c2, 1, 0, NULL), 0, "%s", err);
    cr_assert_str_eq(job_state(j), "RUNNING");
    uint64_t tc = task_of(j, wb);
    cr_assert_neq(tc, tb, "a second task on b's worker takes the lost splits");
    const sluice_WorkerHeartbeatResponse *wp = worker_hb(wb, 0, 0);
    cr_assert_eq(wp->new_tasks_count, 1);
    cr_assert_eq(wp->new_tasks[0].task_id, tc);
    /* It asks for epoch 0 and gets a's splits back, then the epoch's end. */
    get_splits(tc, 1, 8, &r);
    cr_assert_eq(r.splits_count, held);
    cr_assert_eq(r.splits[0].begin, 0);
    get_splits(tc, 2, 8, &r);
    cr_assert(r.end_of_epoch);
    worker_hb(wb, tc, r.splits_count + 1000);
    cr_assert_str_eq(job_state(j), "RUNNING", "the clients have not confirmed c's splits");
    below = UINT64_MAX;
    heartbeat(j, c1, 1, &tc, &below);
    heartbeat(j, c2, 1, &tc, &below);
    cr_assert_str_eq(job_state(j), "FINISHED");
}

Test(outstanding, splits_a_task_never_read_go_out_again_at_once)
{
    st = new_state();
    uint64_t wa = worker("127.0.0.1:1"), wb = worker("127.0.0.1:2");
    uint64_t c1, c2, j = job(&c1, &c2);
    uint64_t ta = task_of(j, wa), tb = task_of(j, wb);
    sluice_GetSplitResponse r;
    get_splits(ta, 1, 3, &r);
    uint64_t last = r.splits[2].split_id;
    /* Its pipeline ended having read only the first two (the answer with
     * the third was lost, say): the third goes out again, no report needed. */
    worker_hb(wa, ta, last);
    cr_assert_eq(lost_splits(j, "queued"), 1);
    get_splits(tb, 1, 8, &r);
    cr_assert_eq(r.splits[0].begin, 200);
    cr_assert_eq(r.splits[0].end, 300);
}

Test(outstanding, a_damaged_report_is_refused_with_what_was_wrong)
{
    st = new_state();
    uint64_t wa = worker("127.0.0.1:1");
    uint64_t c1, c2, j = job(&c1, &c2);
    sluice_GetSplitResponse r;
    get_splits(task_of(j, wa), 1, 1, &r);
    cr_assert(sl_dstate_worker_disconnected(st, wa, "gone"));
    sluice_ReportReceivedRequest req = {.job_id = j, .client_id = c1, .report_gen = 1};
    sl_dstate_client_secret(st, j, c1, req.client_secret);
    const uint8_t junk[] = "not a position set";
    cr_assert_eq(sl_dstate_client_report(st, &req, junk, sizeof junk, 0, err, sizeof err), SL_EDATA);
    cr_assert(strstr(err, "report of client"), "%s", err);
    cr_assert_eq(lost_splits(j, "awaiting_reports"), 1, "the client must report again");
    req.client_id = 999;
    sl_dstate_client_secret(st, j, 999, req.client_secret);
    cr_assert_eq(sl_dstate_client_report(st, &req, NULL, 0, 0, err, sizeof err), SL_ENOTFOUND);
}

/* The state of client c in the job's view: "present" or "away". */
static const char *client_state(uint64_t job_id, uint64_t c)
{
    static char state[16];
    json_t *j = job_view(job_id);
    size_t i;
    json_t *o;
    state[0] = 0;
    json_array_foreach(json_object_get(j, "consumers"), i, o)
        if ((uint64_t)json_integer_value(json_object_get(o, "client_id")) == c)
            snprintf(state, sizeof state, "%s", json_string_value(json_object_get(o, "state")));
    json_decref(j);
    return state;
}

Test(outstanding, an_away_client_holds_no_split_back_but_a_worker_loss_waits_for_what_it_received)
{
    sl_dstate_config_t cfg;
    sl_dstate_config_init(&cfg); /* client_timeout_ms 30000, client_rejoin_ms 300000 */
    cfg.split_size = 100;
    cfg.worker_timeout_ms = 1000000; /* the workers send no heartbeat here */
    st = sl_dstate_new(&cfg);
    uint64_t wa = worker("127.0.0.1:1"), wb = worker("127.0.0.1:2");
    uint64_t c1, c2, j = job(&c1, &c2);
    uint64_t ta = task_of(j, wa), tb = task_of(j, wb);
    sluice_GetSplitResponse r;
    get_splits(ta, 1, 3, &r); /* [0,100) [100,200) [200,300) */
    uint64_t first = r.splits[0].split_id;
    heartbeat_at(25000, j, c1, 0, NULL, NULL);
    sl_dstate_tick(st, 30000);
    cr_assert_str_eq(client_state(j, c2), "present", "30000 ms without heartbeat, not more");
    sl_dstate_tick(st, 30001);
    cr_assert_str_eq(client_state(j, c2), "away");
    cr_assert_str_eq(client_state(j, c1), "present");
    sl_dstate_stats_t s;
    sl_dstate_stats(st, &s);
    cr_assert_eq(s.clients_away, 1);

    /* Its peer alone says how far the splits went: c2 holds none back. */
    uint64_t below = first + 1;
    heartbeat_at(30002, j, c1, 1, &ta, &below);
    cr_assert_eq(lost_splits(j, "outstanding"), 2);

    /* A worker lost meanwhile: its splits wait for the away client too. */
    cr_assert(sl_dstate_worker_disconnected(st, wa, "gone"));
    const uint64_t got1[][2] = {{150, 10}};
    cr_assert_eq(report(j, c1, 1, 1, got1), 0, "%s", err);
    get_splits(tb, 1, 8, &r);
    for (pb_size_t i = 0; i < r.splits_count; i++)
        cr_assert_geq(r.splits[i].begin, 300, "no lost split goes out before the away client said what it has");
    cr_assert_eq(lost_splits(j, "awaiting_reports"), 2);

    /* It comes back (a heartbeat with its id and secret), is asked, says. */
    heartbeat_at(40000, j, c2, 0, NULL, NULL);
    cr_assert_str_eq(client_state(j, c2), "present");
    cr_assert_eq(hb->report_gen, 1);
    const uint64_t got2[][2] = {{100, 20}, {250, 5}};
    cr_assert_eq(report(j, c2, 1, 2, got2), 0, "%s", err);
    cr_assert_eq(lost_splits(j, "queued"), 2);
    get_splits(tb, 2, 8, &r);
    cr_assert_eq(r.splits_count, 2);
    cr_assert_eq(r.splits[0].begin, 100);
    cr_assert_eq(r.splits[0].skip_count, 2, "without what either client has: [100,120) and [150,160)");
    cr_assert_eq(r.splits[1].begin, 200);
    cr_assert_eq(r.splits[1].skip_count, 1, "without [250,255)");
}

Test(outstanding, an_away_client_is_released_after_the_rejoin_window_and_then_waited_for_no_more)
{
    sl_dstate_config_t cfg;
    sl_dstate_config_init(&cfg);
    cfg.split_size = 100;
    cfg.client_timeout_ms = 1000;
    cfg.client_rejoin_ms = 5000;
    cfg.worker_timeout_ms = 1000000;
    st = sl_dstate_new(&cfg);
    uint64_t wa = worker("127.0.0.1:1"), wb = worker("127.0.0.1:2");
    uint64_t c1, c2, j = job(&c1, &c2);
    uint64_t ta = task_of(j, wa), tb = task_of(j, wb);
    sluice_GetSplitResponse r;
    get_splits(ta, 1, 2, &r); /* [0,100) [100,200) */
    heartbeat_at(900, j, c1, 0, NULL, NULL);
    sl_dstate_tick(st, 1001); /* c2 away from 1001 */
    cr_assert_str_eq(client_state(j, c2), "away");
    cr_assert(sl_dstate_worker_disconnected(st, wa, "gone"));
    for (int64_t now = 1100; now <= 6001; now += 100) {
        heartbeat_at(now, j, c1, 0, NULL, NULL);
        if (hb->report_gen == 1 && now == 1100)
            cr_assert_eq(report(j, c1, 1, 0, NULL), 0, "%s", err);
        sl_dstate_tick(st, now);
    }
    cr_assert_str_eq(client_state(j, c2), "away", "5000 ms away, not more");
    cr_assert_eq(lost_splits(j, "awaiting_reports"), 2);
    heartbeat_at(6002, j, c1, 0, NULL, NULL);
    sl_dstate_tick(st, 6002);
    cr_assert_str_eq(client_state(j, c2), "", "released");
    get_splits(tb, 1, 8, &r);
    cr_assert_eq(r.splits_count, 2, "nobody else to wait for: the lost splits go out again");
    cr_assert_eq(r.splits[0].begin, 0);

    sluice_ClientHeartbeatRequest *req = calloc(1, sizeof *req);
    req->job_id = j;
    req->client_id = c2;
    sl_dstate_client_secret(st, j, c2, req->client_secret);
    cr_assert_eq(sl_dstate_client_heartbeat(st, req, 6003, hb, err, sizeof err), SL_ENOTFOUND);
    cr_assert_not_null(strstr(err, "released after 6000 ms"), "%s", err);
    cr_assert_not_null(strstr(err, "--client-rejoin-ms 5000"), "%s", err);
    free(req);
}

/* A state whose clients are stalled after 5000 ms without progress. */
static void stall_state(void)
{
    sl_dstate_config_t cfg;
    sl_dstate_config_init(&cfg);
    cfg.split_size = 100;
    cfg.worker_timeout_ms = 1000000; /* the workers send no heartbeat here */
    cfg.client_stall_ms = 5000;
    st = sl_dstate_new(&cfg);
}

/* stall_state(), a worker, and a job of clients c1 and c2 whose task ta
 * holds 4 splits. @return the first one's id */
static uint64_t stall_job(uint64_t *wa, uint64_t *j, uint64_t *ta, uint64_t *c1, uint64_t *c2)
{
    stall_state();
    *wa = worker("127.0.0.1:1");
    *j = job(c1, c2);
    *ta = task_of(*j, *wa);
    sluice_GetSplitResponse r;
    get_splits(*ta, 1, 4, &r);
    return r.splits[0].split_id;
}

Test(outstanding, a_client_that_stops_reading_is_stalled_and_holds_no_split_back_until_it_reads_again)
{
    uint64_t wa, j, ta, c1, c2, first = stall_job(&wa, &j, &ta, &c1, &c2);
    uint64_t below = first + 1, ahead = first + 3;
    heartbeat_at(1000, j, c1, 1, &ta, &below);
    heartbeat_at(1000, j, c2, 1, &ta, &below);
    cr_assert_eq(lost_splits(j, "outstanding"), 3);
    /* c1 reads on; c2 heartbeats and receives nothing new. */
    heartbeat_at(4000, j, c1, 1, &ta, &ahead);
    heartbeat_at(4000, j, c2, 1, &ta, &below);
    cr_assert_eq(lost_splits(j, "outstanding"), 3, "c2 holds them back");
    sl_dstate_tick(st, 6000);
    cr_assert_str_eq(client_state(j, c2), "present", "5000 ms without progress, not more");
    sl_dstate_tick(st, 6001);
    cr_assert_str_eq(client_state(j, c2), "stalled");
    cr_assert_str_eq(client_state(j, c1), "present", "c1's progress grew 2001 ms ago");
    cr_assert_eq(lost_splits(j, "outstanding"), 1, "c1's progress alone decides");
    /* A heartbeat without new progress does not end it; progress does. */
    heartbeat_at(7000, j, c2, 1, &ta, &below);
    cr_assert_str_eq(client_state(j, c2), "stalled");
    uint64_t caught_up = first + 4;
    heartbeat_at(8000, j, c2, 1, &ta, &caught_up);
    cr_assert_str_eq(client_state(j, c2), "present");
    heartbeat_at(8000, j, c1, 1, &ta, &caught_up);
    cr_assert_eq(lost_splits(j, "outstanding"), 0);
    /* Holding nothing back, a client that receives nothing is not stalled. */
    heartbeat_at(20000, j, c1, 1, &ta, &caught_up);
    heartbeat_at(20000, j, c2, 1, &ta, &caught_up);
    sl_dstate_tick(st, 20001);
    cr_assert_str_eq(client_state(j, c1), "present");
    cr_assert_str_eq(client_state(j, c2), "present");
}

/* Both clients stalled, one reads again and reaches the task's last split
 * in one heartbeat: what it has is no longer outstanding at that heartbeat,
 * the other being stalled. Before 2026-12-05 the prune ran while it still
 * counted as stalled, no reader was left, and the splits stayed
 * outstanding: its job waited for the stalled one. */
Test(outstanding, a_stalled_client_that_reads_to_the_end_in_one_heartbeat_releases_the_splits)
{
    uint64_t wa, j, ta, c1, c2, first = stall_job(&wa, &j, &ta, &c1, &c2);
    uint64_t below = first + 1, end = first + 4;
    heartbeat_at(1000, j, c1, 1, &ta, &below);
    heartbeat_at(1000, j, c2, 1, &ta, &below);
    sl_dstate_tick(st, 6001);
    cr_assert_str_eq(client_state(j, c1), "stalled");
    cr_assert_str_eq(client_state(j, c2), "stalled");
    cr_assert_eq(lost_splits(j, "outstanding"), 3);
    /* Done, the task is listed with probe_below to a client behind it, but
     * not to a stalled one: asked, it would count as reading again. */
    worker_hb(wa, ta, end);
    heartbeat_at(6500, j, c2, 1, &ta, &below);
    cr_assert_eq(hb->tasks_count, 1);
    cr_assert_eq(hb->tasks[0].probe_below, 0, "a stalled client asked");
    heartbeat_at(7000, j, c1, 1, &ta, &end);
    cr_assert_str_eq(client_state(j, c1), "present");
    cr_assert_eq(lost_splits(j, "outstanding"), 0, "c1 has every split, c2 is stalled");
}

Test(outstanding, a_coordinated_consumer_that_stops_reading_is_not_stalled)
{
    /* Its peers cannot read on without it (every round needs its batch),
     * so nothing is gained by letting its splits go: they stay outstanding
     * for a worker loss to hand out again. */
    stall_state();
    uint64_t wa = worker("127.0.0.1:1");
    uint64_t c[2], j = coord_job(c);
    uint64_t ta = task_of(j, wa);
    sluice_GetSplitResponse r;
    get_splits(ta, 1, 4, &r);
    cr_assert_eq(r.splits_count, 4);
    uint64_t below = r.splits[0].split_id + 1, ahead = r.splits[0].split_id + 3;
    heartbeat_at(1000, j, c[0], 1, &ta, &below);
    heartbeat_at(1000, j, c[1], 1, &ta, &below);
    heartbeat_at(4000, j, c[0], 1, &ta, &ahead);
    heartbeat_at(4000, j, c[1], 1, &ta, &below);
    sl_dstate_tick(st, 10000);
    cr_assert_str_eq(client_state(j, c[1]), "present");
    cr_assert_eq(lost_splits(j, "outstanding"), 3, "c[1] still holds them back");
}

/* A state of splits of 100 records and --max-outstanding-splits 5, loaded
 * from the store when load. */
static sl_dstate_t *bounded_state(bool load)
{
    sl_dstate_config_t cfg;
    sl_dstate_config_init(&cfg);
    cfg.split_size = 100;
    cfg.max_outstanding = 5;
    sl_dstate_t *s = sl_dstate_new(&cfg);
    if (load)
        cr_assert_eq(sl_dpersist_load(s, store, 0, err, sizeof err), 0, "%s", err);
    return s;
}

/* A state of splits of 100 records and --max-outstanding-splits 5, a
 * worker at addr and job()'s job: its id; the worker's task in *ta, the
 * clients in c1 and c2. */
static uint64_t bounded_job(const char *addr, uint64_t *wa, uint64_t *ta, uint64_t *c1, uint64_t *c2)
{
    st = bounded_state(false);
    *wa = worker(addr);
    uint64_t j = job(c1, c2);
    *ta = task_of(j, *wa);
    return j;
}

/* What a heartbeat of the first of nclients clients of a named job hears
 * as confirm_every, under --max-outstanding-splits bound. */
static uint32_t confirm_every_of(unsigned bound, unsigned nclients)
{
    sl_dstate_config_t cfg;
    sl_dstate_config_init(&cfg);
    cfg.max_outstanding = bound;
    st = sl_dstate_new(&cfg);
    worker("127.0.0.1:1");
    uint64_t first, j = big_job(1000, nclients, &first);
    heartbeat(j, first, 0, NULL, NULL);
    uint32_t every = hb->confirm_every;
    sl_dstate_free(st);
    st = NULL;
    return every;
}

/* A client hears the split-done notices of the frames it reads, about one
 * in n of them with n clients: each confirms at its share of a quarter of
 * the bound, so that together they confirm every quarter of it (at a
 * quarter each, six clients confirmed every 384 splits of a bound of 256,
 * and the task held there waited for their tick). */
Test(outstanding, each_client_confirms_at_its_share_of_a_quarter_of_the_bound)
{
    cr_assert_eq(confirm_every_of(256, 1), 64);
    cr_assert_eq(confirm_every_of(256, 6), 10);
    cr_assert_eq(confirm_every_of(16384, 32), 128);
    cr_assert_eq(confirm_every_of(8, 3), 1, "at least 1");
}

/* An answer that leaves the task at the bound, and one that holds it
 * there, say so (GetSplitResponse.at_bound): its worker has its clients
 * acknowledge batches at once from then on. */
Test(outstanding, no_answer_takes_a_task_past_max_outstanding_splits)
{
    uint64_t wa, ta, c1, c2, j = bounded_job("127.0.0.1:1", &wa, &ta, &c1, &c2);
    sluice_GetSplitResponse r;
    get_splits(ta, 1, 3, &r);
    cr_assert_eq(r.splits_count, 3);
    cr_assert_not(r.at_bound, "3 of 5");
    uint64_t first = r.splits[0].split_id;
    get_splits(ta, 2, 8, &r);
    cr_assert_eq(r.splits_count, 2, "8 asked, 2 more reach the bound of 5");
    cr_assert(r.at_bound, "5 of 5");
    uint64_t second = r.splits[0].split_id;
    /* The answer lost on the way and asked for again: the same splits, and
     * at the bound still. */
    get_splits(ta, 2, 8, &r);
    cr_assert_eq(r.splits_count, 2);
    cr_assert_eq(r.splits[0].split_id, second);
    cr_assert(r.at_bound, "the kept answer, 5 of 5");
    cr_assert_eq(lost_splits(j, "outstanding"), 5);
    get_splits(ta, 3, 8, &r);
    cr_assert_eq(r.splits_count, 0);
    cr_assert_gt(r.retry_ms, 0, "held at the bound until its clients confirm splits");
    cr_assert(r.at_bound);
    /* Its worker says every batch of the first two splits was acknowledged:
     * 3 of 5 again, room for 2. */
    sluice_GetSplitRequest req = {.task_id = ta, .max_splits = 1, .request_seq = 4, .received_below = first + 2};
    r = (sluice_GetSplitResponse)sluice_GetSplitResponse_init_zero;
    cr_assert_eq(sl_dstate_get_splits(st, &req, 0, &r, err, sizeof err), 0, "%s", err);
    cr_assert_eq(r.splits_count, 1);
    cr_assert_not(r.at_bound, "4 of 5");
}

/* A coordinated task at the bound whose pipeline waits for a split to make
 * a batch outside its rounds (a stand-in's: GetSplitRequest.for_extra)
 * gets one an answer past it, up to a split more for each round every
 * consumer may ask ahead; the consumer that waits for that batch may be
 * the one whose confirmations would free the task. A request not for one,
 * and one of a job without rounds, stays held. */
Test(outstanding, a_stand_in_gets_splits_past_the_bound_up_to_the_rounds_consumers_may_ask)
{
    sl_dstate_config_t cfg;
    sl_dstate_config_init(&cfg);
    cfg.split_size = 100;
    cfg.max_outstanding = 5;
    cfg.round_lookahead = 2; /* 9 splits in all: one epoch holds 10 */
    st = sl_dstate_new(&cfg);
    uint64_t wa = worker("127.0.0.1:1");
    uint64_t c[2], j = coord_job(c);
    uint64_t ta = task_of(j, wa), seq = 1;
    sluice_GetSplitResponse r;
    get_splits(ta, seq++, 8, &r);
    cr_assert_eq(r.splits_count, 5);
    get_splits(ta, seq++, 8, &r);
    cr_assert_eq(r.splits_count, 0, "held at the bound");
    for (unsigned k = 0; k < 2 * 2; k++) {
        get_splits_for(ta, seq++, 8, true, &r);
        cr_assert_eq(r.splits_count, 1, "extra split %u of 4", k);
    }
    get_splits_for(ta, seq++, 8, true, &r);
    cr_assert_eq(r.splits_count, 0, "5 + 2 rounds x 2 consumers");
    cr_assert_gt(r.retry_ms, 0);
    cr_assert_eq(lost_splits(j, "outstanding"), 9);
    json_t *v = job_view(j);
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(json_object_get(v, "tasks"), 0),
                                                    "outstanding_splits")), 9);
    json_decref(v);
}

Test(outstanding, a_job_without_rounds_gets_no_split_past_the_bound)
{
    uint64_t wa, ta, c1, c2;
    bounded_job("127.0.0.1:1", &wa, &ta, &c1, &c2);
    sluice_GetSplitResponse r;
    get_splits(ta, 1, 8, &r);
    cr_assert_eq(r.splits_count, 5);
    get_splits_for(ta, 2, 8, true, &r);
    cr_assert_eq(r.splits_count, 0, "no stand-ins: held at the bound");
}

/* The worker of task ta says at `now` that it runs with its splits done
 * below done_below, its pipeline waiting for a split if starved. */
static void running_at(int64_t now, uint64_t wa, uint64_t ta, uint64_t done_below, bool starved)
{
    memset(wreq, 0, sizeof *wreq);
    memset(wresp, 0, sizeof *wresp);
    wreq->worker_id = wa;
    wreq->tasks_count = 1;
    wreq->tasks[0] = (sluice_TaskStatus){.task_id = ta, .state = SL_TASK_RUNNING, .done_below = done_below,
                                         .starved = starved};
    cr_assert_eq(sl_dstate_worker_heartbeat(st, wreq, now, wresp, err, sizeof err), 0, "%s", err);
}

static void running(uint64_t wa, uint64_t ta, uint64_t done_below)
{
    running_at(0, wa, ta, done_below, false);
}

/* Client c's heartbeat saying task ta reached it below `below` (0: says
 * nothing of it). @return the probe_below its answer lists ta with */
static uint64_t probe_below_after(uint64_t j, uint64_t c, uint64_t ta, uint64_t below)
{
    heartbeat(j, c, below > 0, &ta, &below);
    for (pb_size_t i = 0; i < hb->tasks_count; i++)
        if (hb->tasks[i].task_id == ta)
            return hb->tasks[i].probe_below;
    cr_assert_fail("task %" PRIu64 " is not listed", ta);
    return 0;
}

/* A task held at the bound makes no batch, and a client whose last batch
 * of it came before splits it shares were done (or that got none) learns
 * from no frame that they are: the dispatcher lists the task to such a
 * client with how far its worker said they are done (TaskInfo.probe_below),
 * so that it asks the worker. Not below the bound (but for a done task),
 * not to a client that said as much, not when the worker has finished none it holds (a pipeline
 * that drops every record: asking would confirm its empty splits a few at
 * a time, where the bound fails it). */
Test(outstanding, a_client_behind_a_held_task_is_told_to_ask_its_worker)
{
    uint64_t wa, ta, c1, c2, j = bounded_job("127.0.0.1:1", &wa, &ta, &c1, &c2);
    sluice_GetSplitResponse r;
    get_splits(ta, 1, 4, &r);
    cr_assert_eq(r.splits[0].split_id, 0);
    running(wa, ta, 3);
    cr_assert_eq(probe_below_after(j, c1, ta, 0), 0, "4 splits, below the bound of 5");
    probe_below_after(j, c1, ta, 1);
    probe_below_after(j, c2, ta, 1);
    get_splits(ta, 2, 4, &r);
    cr_assert_eq(lost_splits(j, "outstanding"), 5, "splits 1 to 5: at the bound");
    /* A client that joins late has said nothing. */
    uint64_t c3, again;
    const char *spec = "{\"source\": {\"type\": \"range\", \"stop\": 1000}}", *fp;
    sluice_GetOrCreateJobRequest req = {.sharding = SL_SHARDING_DYNAMIC, .job_name = "shared"};
    cr_assert_eq(sl_dstate_dataset_register(st, spec, strlen(spec), &req.dataset_id, &fp, err, sizeof err), 0);
    cr_assert_eq(sl_dstate_job_get_or_create(st, &req, 0, &again, &c3, err, sizeof err), 0, "%s", err);
    cr_assert_eq(again, j);
    running(wa, ta, 1);
    cr_assert_eq(probe_below_after(j, c3, ta, 0), 0, "the worker finished none it holds");
    running(wa, ta, 4);
    cr_assert_eq(probe_below_after(j, c3, ta, 0), 4, "a client that said nothing");
    cr_assert_eq(probe_below_after(j, c2, ta, 2), 4, "a client behind");
    cr_assert_eq(lost_splits(j, "outstanding"), 5, "c3 said nothing: no split is confirmed");
    /* The job's view says who holds the task back. */
    json_t *v = job_view(j), *task = json_array_get(json_object_get(v, "tasks"), 0);
    cr_assert_eq(json_integer_value(json_object_get(task, "oldest_outstanding")), 1);
    cr_assert_eq(json_integer_value(json_object_get(task, "worker_done_below")), 4);
    json_t *consumers = json_object_get(v, "consumers");
    cr_assert_eq(json_array_size(consumers), 3);
    char id[24];
    snprintf(id, sizeof id, "%" PRIu64, ta);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(json_array_get(consumers, 1), "done_below"), id)),
                 2, "c2's");
    cr_assert_eq(json_object_size(json_object_get(json_array_get(consumers, 2), "done_below")), 0, "c3 said nothing");
    json_decref(v);
    cr_assert_eq(probe_below_after(j, c3, ta, 4), 0, "a client that said as much");
    cr_assert_eq(probe_below_after(j, c1, ta, 4), 0);
    cr_assert_eq(lost_splits(j, "outstanding"), 4, "c2 had said 2");
    cr_assert_eq(probe_below_after(j, c2, ta, 2), 0, "below the bound again");
    /* A done task asks for no more splits, so its worker says no more of
     * what reached its clients: a client behind it is told to ask whatever
     * the bound (before 2026-12-05 a client whose trainer paused held the
     * job's end until it read on). */
    worker_hb(wa, ta, 6);
    cr_assert_eq(probe_below_after(j, c2, ta, 2), 6, "a client behind a done task");
    cr_assert_eq(probe_below_after(j, c1, ta, 6), 0, "a client that said as much");
}

/* A task held at the bound whose worker says every split below
 * received_below reached the clients it went to (each batch acknowledged:
 * GetSplitRequest.received_below) has those confirmed at that request,
 * whatever its clients said, and gets splits again in the same answer; a
 * smaller value later confirms nothing back. Before, it waited for a
 * heartbeat of every client, and a client that got none of its batches
 * (more clients than batches between two holds) held it a client heartbeat
 * interval at each hold. */
Test(outstanding, a_held_task_whose_worker_saw_its_batches_received_goes_on)
{
    uint64_t wa, ta, c1, c2, j = bounded_job("127.0.0.1:1", &wa, &ta, &c1, &c2);
    sluice_GetSplitResponse r;
    get_splits(ta, 1, 5, &r);
    cr_assert_eq(r.splits_count, 5);
    get_splits(ta, 2, 4, &r);
    cr_assert_eq(r.splits_count, 0, "held at the bound of 5");
    cr_assert_gt(r.retry_ms, 0);
    /* Its worker's next request: splits 0 to 2 reached their clients. */
    sluice_GetSplitRequest req = {.task_id = ta, .max_splits = 4, .request_seq = 2, .received_below = 3};
    r = (sluice_GetSplitResponse)sluice_GetSplitResponse_init_zero;
    cr_assert_eq(sl_dstate_get_splits(st, &req, 0, &r, err, sizeof err), 0, "%s", err);
    cr_assert_eq(r.splits_count, 3, "3 confirmed by the worker, 3 more within the bound");
    cr_assert_eq(r.splits[0].split_id, 5);
    cr_assert_eq(lost_splits(j, "outstanding"), 5, "splits 3 to 7");
    json_t *v = job_view(j), *task = json_array_get(json_object_get(v, "tasks"), 0);
    cr_assert_eq(json_integer_value(json_object_get(task, "worker_received_below")), 3);
    cr_assert_eq(json_integer_value(json_object_get(task, "oldest_outstanding")), 3);
    json_decref(v);
    /* A smaller value confirms nothing; the clients' word still counts. */
    req.request_seq = 3;
    req.received_below = 1;
    r = (sluice_GetSplitResponse)sluice_GetSplitResponse_init_zero;
    cr_assert_eq(sl_dstate_get_splits(st, &req, 0, &r, err, sizeof err), 0, "%s", err);
    cr_assert_eq(r.splits_count, 0, "still at the bound");
    cr_assert_eq(lost_splits(j, "outstanding"), 5);
    uint64_t below = 5;
    heartbeat(j, c1, 1, &ta, &below);
    cr_assert_eq(lost_splits(j, "outstanding"), 5, "c2 said nothing");
    heartbeat(j, c2, 1, &ta, &below);
    cr_assert_eq(lost_splits(j, "outstanding"), 3, "both clients have splits 3 and 4");
}

/* A task whose worker lost batches (let go of unacknowledged, or sent
 * unheld) says how far its splits reached their clients below the first
 * of them (received_below) and past them (lost_below, received_past_lost):
 * the splits past lost_below are confirmed on the worker's word once every
 * client said it has every split below lost_below. Before 2026-12-05 such
 * a task moved at its clients' word for the rest of its life. */
Test(outstanding, a_task_whose_worker_lost_batches_goes_on_past_them_once_its_clients_have_them)
{
    uint64_t wa, ta, c1, c2, j = bounded_job("127.0.0.1:1", &wa, &ta, &c1, &c2);
    sluice_GetSplitResponse r;
    get_splits(ta, 1, 5, &r);
    cr_assert_eq(r.splits_count, 5);
    /* A batch of splits 0 and 1 was lost; every other split below 4 went
     * out whole in batches acknowledged. */
    sluice_GetSplitRequest req = {.task_id = ta, .max_splits = 4, .request_seq = 2, .lost_below = 2,
                                  .received_past_lost = 4};
    r = (sluice_GetSplitResponse)sluice_GetSplitResponse_init_zero;
    cr_assert_eq(sl_dstate_get_splits(st, &req, 0, &r, err, sizeof err), 0, "%s", err);
    cr_assert_eq(r.splits_count, 0, "held at the bound: the clients said nothing");
    json_t *v = job_view(j), *task = json_array_get(json_object_get(v, "tasks"), 0);
    cr_assert_eq(json_integer_value(json_object_get(task, "worker_lost_below")), 2);
    cr_assert_eq(json_integer_value(json_object_get(task, "worker_received_past_lost")), 4);
    json_decref(v);
    uint64_t below = 2;
    heartbeat(j, c1, 1, &ta, &below);
    cr_assert_eq(lost_splits(j, "outstanding"), 5, "c2 said nothing");
    below = 1;
    heartbeat(j, c2, 1, &ta, &below);
    cr_assert_eq(lost_splits(j, "outstanding"), 4, "c2 has split 0, may not have split 1");
    below = 2;
    heartbeat(j, c2, 1, &ta, &below);
    cr_assert_eq(lost_splits(j, "outstanding"), 1, "both have the lost splits: 2 and 3 on the worker's word");
    /* A worker that loses more says a larger lost_below: the clients' word
     * again up to it, whatever it says past it. */
    req.request_seq = 3;
    req.max_splits = 2;
    req.lost_below = 6;
    req.received_past_lost = 7;
    r = (sluice_GetSplitResponse)sluice_GetSplitResponse_init_zero;
    cr_assert_eq(sl_dstate_get_splits(st, &req, 0, &r, err, sizeof err), 0, "%s", err);
    cr_assert_eq(r.splits_count, 2, "splits 5 and 6");
    below = 5;
    heartbeat(j, c1, 1, &ta, &below);
    heartbeat(j, c2, 1, &ta, &below);
    cr_assert_eq(lost_splits(j, "outstanding"), 2, "splits 5 and 6: the clients are below the new lost_below");
    below = 6;
    heartbeat(j, c1, 1, &ta, &below);
    heartbeat(j, c2, 1, &ta, &below);
    cr_assert_eq(lost_splits(j, "outstanding"), 0, "split 6 on the worker's word");
}

/* The worker of task ta says its pipeline waits for a split and has
 * finished none it holds (done_below 0). */
static void starved(uint64_t wa, uint64_t ta, int64_t now)
{
    running_at(now, wa, ta, 0, true);
}

/* A task held at the bound whose pipeline cannot finish a split gets a
 * split past the bound each time its heartbeat shows it so (its splits may
 * hold too few records for its buffers: a lost worker's, handed out again
 * without what the clients had), up to 64 more, at most twice the bound
 * (5 more here); held there, it
 * fails the job with a reason that names the bound and what to do: whole
 * in the job's view and in its clients' heartbeat answers, with a worker
 * address as long as a Kubernetes service name (before 2026-12-04 the
 * reason was cut at 511 bytes, the advice at its end first). */
Test(outstanding, a_held_task_fails_the_job_with_the_whole_reason)
{
    const char *addr = "sluice-worker-0.sluice-worker.training-data-pipelines.svc.cluster.local:5051";
    uint64_t wa, ta, c1, c2, j = bounded_job(addr, &wa, &ta, &c1, &c2);
    sluice_GetSplitResponse r;
    get_splits(ta, 1, 8, &r);
    cr_assert_eq(r.splits_count, 5);
    get_splits(ta, 2, 8, &r);
    cr_assert_eq(r.splits_count, 0, "held at the bound");
    int64_t now = 1000;
    uint64_t seq = 3;
    for (unsigned held = 5; held < 10; held++, now += 250) {
        starved(wa, ta, now);
        get_splits(ta, seq++, 8, &r);
        cr_assert_eq(r.splits_count, 1, "a split past the bound, holding %u", held);
        get_splits(ta, seq++, 8, &r);
        cr_assert_eq(r.splits_count, 0, "one a heartbeat: held again, holding %u", held + 1);
    }
    cr_assert_str_eq(job_state(j), "RUNNING");
    for (int64_t end = now + 6000; now <= end; now += 3000) {
        starved(wa, ta, now);
        if (now < end) {
            get_splits(ta, seq++, 8, &r);
            cr_assert_eq(r.splits_count, 0, "held at the most past the bound");
        }
    }
    cr_assert_str_eq(job_state(j), "FAILED");
    json_t *v = job_view(j);
    const char *why = json_string_value(json_object_get(v, "error"));
    cr_assert_not_null(why);
    cr_assert_gt(strlen(why), 511);
    cr_assert(strstr(why, addr) && strstr(why, "holds 10 splits") &&
                  strstr(why, "--max-outstanding-splits 5 and the most"),
              "%s", why);
    /* At a larger bound, 64 more at most. */
    sl_dstate_config_t cfg;
    sl_dstate_config_init(&cfg);
    cfg.max_outstanding = 16384;
    sl_dstate_t *big = sl_dstate_new(&cfg);
    cr_assert_eq(sl__held_cap(big), 16384 + 64);
    sl_dstate_free(big);
    size_t n = strlen(why);
    const char *tail = "raise --max-outstanding-splits or --split-size, or correct the spec";
    cr_assert(n > strlen(tail) && strcmp(why + n - strlen(tail), tail) == 0, "cut: %s", why);
    heartbeat(j, c1, 0, NULL, NULL);
    cr_assert_eq(hb->job_state, SL_JOB_FAILED);
    cr_assert_str_eq(hb->error, why, "the client hears the whole reason");
    json_decref(v);
}

/* ---- exactly once through losses, parts and restarts, at drawn sizes ----
 *
 * A named DYNAMIC job over range(n), its splits asked for by the live
 * tasks in answers of drawn sizes, the records of each split received by
 * the clients in drawn parts, workers lost with a drawn part of what they
 * held received (the clients report every record they have), new workers
 * joining once none is left, answers whose skip runs are cut by a drawn
 * max_skip_bytes, and the state saved after every change and restarted
 * from the store at drawn moments. Every record must be handed out to one
 * task at a time, never once received (a skipped one must have been), and
 * be received exactly once in the end. */

struct pt_task {
    uint64_t id, worker, seq;
    bool alive;
};

struct pt {
    uint64_t n, job, c1, c2;
    uint8_t *owner;     /* per record: 1 + the task holding it, 0: none */
    uint8_t *received;  /* per record: times the clients received it */
    struct pt_task tasks[16];
    unsigned num_tasks, workers;
    uint64_t rng;
    const char *where;
};

static uint64_t pt_draw(struct pt *p, uint64_t below)
{
    return splitmix64(&p->rng) % below;
}

/* Every client reports: c1 every record received, c2 nothing. */
static void pt_report(struct pt *p)
{
    uint64_t gen = (uint64_t)lost_splits(p->job, "report_gen");
    sl_posset_t all, none;
    sl_posset_init(&all, (size_t)p->n);
    sl_posset_init(&none, 1);
    for (uint64_t i = 0; i < p->n; i++)
        if (p->received[i])
            cr_assert_eq(sl_posset_add(&all, 0, 0, i, 1, NULL), 0);
    cr_assert_eq(client_report(p->job, p->c1, gen, &all), 0, "%s: %s", p->where, err);
    cr_assert_eq(client_report(p->job, p->c2, gen, &none), 0, "%s: %s", p->where, err);
    sl_posset_clear(&all);
    sl_posset_clear(&none);
}

static void pt_add_worker(struct pt *p)
{
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.%u:1", ++p->workers);
    uint64_t w = worker(addr);
    worker_hb(w, 0, 0);
    cr_assert_lt(p->num_tasks, 16);
    p->tasks[p->num_tasks++] = (struct pt_task){.id = task_of(p->job, w), .worker = w, .alive = true};
}

static void pt_ask(struct pt *p, unsigned k)
{
    struct pt_task *t = &p->tasks[k];
    sluice_GetSplitResponse r;
    get_splits(t->id, ++t->seq, 1 + (uint32_t)pt_draw(p, 24), &r);
    size_t len = 0;
    const uint8_t *skips = sl_dstate_split_skips(st, t->id, &len);
    for (pb_size_t i = 0; i < r.splits_count; i++) {
        const sluice_Split *s = &r.splits[i];
        cr_assert(s->begin < s->end && s->end <= p->n, "%s: split [%" PRIu64 ", %" PRIu64 ")", p->where, s->begin,
                  s->end);
        uint64_t at = s->begin;
        for (uint64_t q = 0; q <= s->skip_count; q++) {
            uint64_t kb = s->end, kn = 0;
            if (q < s->skip_count) {
                cr_assert_leq(s->skip_offset + 16 * (q + 1), len, "%s", p->where);
                memcpy(&kb, skips + s->skip_offset + 16 * q, 8);
                memcpy(&kn, skips + s->skip_offset + 16 * q + 8, 8);
                cr_assert(kb >= at && kn > 0 && kb + kn <= s->end, "%s: skip run %" PRIu64 "+%" PRIu64, p->where, kb,
                          kn);
            }
            for (uint64_t x = at; x < kb; x++) {
                cr_assert_eq(p->received[x], 0, "%s: record %" PRIu64 " handed out again once received", p->where, x);
                cr_assert_eq(p->owner[x], 0, "%s: record %" PRIu64 " handed to task %" PRIu64 " while another holds it",
                             p->where, x, t->id);
                p->owner[x] = (uint8_t)(k + 1);
            }
            for (uint64_t x = kb; x < kb + kn; x++)
                cr_assert_eq(p->received[x], 1, "%s: record %" PRIu64 " skipped but never received", p->where, x);
            at = kb + kn;
        }
    }
}

/* The clients receive each record task k holds with probability 1/2^shift. */
static void pt_receive(struct pt *p, unsigned k, unsigned shift)
{
    for (uint64_t x = 0; x < p->n; x++)
        if (p->owner[x] == k + 1 && pt_draw(p, (uint64_t)1 << shift) == 0) {
            p->owner[x] = 0;
            p->received[x]++;
        }
}

Test(outstanding, every_record_once_through_losses_parts_and_restarts_at_drawn_sizes, .timeout = 600)
{
    uint64_t seed = test_seed("outstanding.every_record_once_through_losses_parts_and_restarts_at_drawn_sizes");
    struct pt p = {.rng = seed};
    unsigned restarts = 0, lost = 0;
    for (int round = 0; round < 24; round++) {
        sl_dstate_config_t cfg;
        sl_dstate_config_init(&cfg);
        static const unsigned sizes[] = {1, 7, 64, 500}, skip_bytes[] = {16, 48, 400, 256u << 10};
        cfg.split_size = sizes[pt_draw(&p, 4)];
        cfg.max_skip_bytes = skip_bytes[pt_draw(&p, 4)];
        cfg.max_outstanding = 1u << 20;
        p.n = 100 + pt_draw(&p, 20000);
        unsigned workers = 1 + (unsigned)pt_draw(&p, 4), losses = 1 + (unsigned)pt_draw(&p, 5);
        char where[256];
        snprintf(where, sizeof where,
                 "seed %" PRIu64 " round %d: %" PRIu64 " records, splits of %" PRIu64
                 ", %u skip bytes, %u workers, %u losses",
                 seed, round, p.n, (uint64_t)cfg.split_size, cfg.max_skip_bytes, workers, losses);
        p.where = where;
        /* A fresh store for each round. */
        sl_store_close(store);
        remove_dir(dir);
        snprintf(dir, sizeof dir, "/tmp/sl-out-XXXXXX");
        cr_assert_not_null(mkdtemp(dir));
        store = open_state_store(dir, 0);
        sl_dstate_free(st);
        st = sl_dstate_new(&cfg);
        cr_assert_not_null(st);
        p.owner = calloc(p.n, 1);
        p.received = calloc(p.n, 1);
        cr_assert(p.owner && p.received);
        p.num_tasks = 0;
        p.workers = 0;
        char spec[128];
        snprintf(spec, sizeof spec, "{\"source\": {\"type\": \"range\", \"stop\": %" PRIu64 "}}", p.n);
        uint64_t ds;
        const char *fp;
        cr_assert_eq(sl_dstate_dataset_register(st, spec, strlen(spec), &ds, &fp, err, sizeof err), 0, "%s", err);
        uint64_t wid[4];
        for (unsigned w = 0; w < workers; w++) {
            char addr[32];
            snprintf(addr, sizeof addr, "127.0.0.%u:1", ++p.workers);
            wid[w] = worker(addr);
        }
        sluice_GetOrCreateJobRequest req = {.dataset_id = ds, .sharding = SL_SHARDING_DYNAMIC, .job_name = "pt"};
        cr_assert_eq(sl_dstate_job_get_or_create(st, &req, 0, &p.job, &p.c1, err, sizeof err), 0, "%s", err);
        cr_assert_eq(sl_dstate_job_get_or_create(st, &req, 0, &p.job, &p.c2, err, sizeof err), 0, "%s", err);
        for (unsigned w = 0; w < workers; w++)
            p.tasks[p.num_tasks++] = (struct pt_task){.id = task_of(p.job, wid[w]), .worker = wid[w], .alive = true};
        save();
        uint64_t done = 0;
        int steps = 0;
        for (; done < p.n; steps++) {
            cr_assert_lt(steps, 200000, "%s: not every record came (%" PRIu64 " of %" PRIu64 ")", where, done, p.n);
            unsigned live[16], nl = 0;
            for (unsigned k = 0; k < p.num_tasks; k++)
                if (p.tasks[k].alive)
                    live[nl++] = k;
            unsigned k = live[pt_draw(&p, nl)];
            uint64_t a = pt_draw(&p, 100);
            if (a < 45) {
                pt_ask(&p, k);
                save();
            } else if (a < 90) {
                pt_receive(&p, k, (unsigned)pt_draw(&p, 3));
            } else if (a < 95 && losses > 0) {
                losses--;
                lost++;
                pt_receive(&p, k, 1);
                for (uint64_t x = 0; x < p.n; x++)
                    if (p.owner[x] == k + 1)
                        p.owner[x] = 0; /* lost with the worker */
                cr_assert(sl_dstate_worker_disconnected(st, p.tasks[k].worker, "killed"), "%s", where);
                p.tasks[k].alive = false;
                pt_report(&p);
                if (nl == 1)
                    pt_add_worker(&p);
                save();
            } else {
                save();
                sl_dstate_free(st);
                st = sl_dstate_new(&cfg); /* the same options, as a dispatcher restarted is given */
                cr_assert_not_null(st);
                cr_assert_eq(sl_dpersist_load(st, store, 0, err, sizeof err), 0, "%s: %s", where, err);
                restarts++;
                if (lost_splits(p.job, "awaiting_reports") > 0)
                    pt_report(&p);
            }
            done = 0;
            for (uint64_t x = 0; x < p.n; x++) {
                cr_assert_leq(p.received[x], 1, "%s: record %" PRIu64 " received twice", where, x);
                done += p.received[x];
            }
        }
        free(p.owner);
        free(p.received);
    }
    fprintf(stderr, "  24 jobs: %u workers lost, %u restarts\n", lost, restarts);
}

/* A named job's client heartbeat: done_below of task, and that its caller
 * was given every record before (0, 0, given) that reached it. */
static void given_heartbeat(uint64_t job_id, uint64_t client, uint64_t task, uint64_t below, uint64_t given)
{
    sluice_ClientHeartbeatRequest *req = calloc(1, sizeof *req);
    req->job_id = job_id;
    req->client_id = client;
    sl_dstate_client_secret(st, job_id, client, req->client_secret);
    req->progress[req->progress_count++] = (sluice_TaskProgress){.task_id = task, .done_below = below};
    req->has_place_given = true;
    req->place_given = (sluice_Place){.epoch = 0, .file = 0, .record = given};
    /* Its record's size, for the view: a run more than the place. */
    req->ledger_runs = given + 1;
    req->ledger_max_runs = 1000;
    memset(hb, 0, sizeof *hb);
    cr_assert_eq(sl_dstate_client_heartbeat(st, req, 0, hb, err, sizeof err), 0, "%s", err);
    free(req);
}

/* The place the last heartbeat answer folded at: its record (epoch and file 0), or -1 for none. */
static int64_t folded_at(void)
{
    if (!hb->has_place_folded)
        return -1;
    cr_assert_eq(hb->place_folded.epoch, 0);
    cr_assert_eq(hb->place_folded.file, 0);
    cr_assert_eq(hb->epochs_folded, 0);
    return (int64_t)hb->place_folded.record;
}

Test(outstanding, a_named_job_folds_at_the_least_place_its_clients_were_given)
{
    st = new_state();
    uint64_t wa = worker("127.0.0.1:1");
    uint64_t c1, c2, j = job(&c1, &c2);
    uint64_t ta = task_of(j, wa);
    sluice_GetSplitResponse r;
    get_splits(ta, 1, 4, &r); /* [0, 400) in splits of 100 */
    uint64_t first = r.splits[0].split_id;
    /* What a client says is taken no further than what is confirmed: no
     * split is until both clients have it. */
    given_heartbeat(j, c1, ta, first + 2, 150);
    cr_assert(hb->has_confirmed_below);
    cr_assert_eq(hb->confirmed_below.record, 0);
    cr_assert_eq(folded_at(), -1, "nothing is confirmed: client 1's 150 counts as 0");
    given_heartbeat(j, c2, ta, first + 2, 250);
    cr_assert_eq(hb->confirmed_below.record, 200);
    cr_assert_eq(folded_at(), -1, "client 1 said nothing since");
    given_heartbeat(j, c1, ta, first + 2, 150);
    cr_assert_eq(folded_at(), 150, "the least of client 1's 150 and client 2's 200 (its 250, confirmed to 200)");
    given_heartbeat(j, c1, ta, first + 2, 50);
    cr_assert_eq(folded_at(), 150, "a client's word only grows");
    given_heartbeat(j, c2, ta, first + 2, 250);
    given_heartbeat(j, c1, ta, first + 2, 200);
    cr_assert_eq(folded_at(), 200);
    /* The admin view shows the fold and each client's word. */
    json_t *v = sl_dstate_job_json(st, j, 0);
    cr_assert_not_null(v);
    json_t *f = json_object_get(json_object_get(v, "lost_splits"), "folded_below");
    cr_assert_eq(json_integer_value(json_array_get(f, 2)), 200, "folded_below");
    json_t *co = json_array_get(json_object_get(v, "consumers"), 1);
    cr_assert_eq(json_integer_value(json_array_get(json_object_get(co, "given_below"), 2)), 200, "given_below");
    /* And each client's record against its bound, as its last heartbeat said. */
    cr_assert_eq(json_integer_value(json_object_get(co, "ledger_runs")), 251, "client 2 said 250 last");
    cr_assert_eq(json_integer_value(json_object_get(co, "ledger_max_runs")), 1000);
    co = json_array_get(json_object_get(v, "consumers"), 0);
    cr_assert_eq(json_integer_value(json_object_get(co, "ledger_runs")), 201, "client 1 said 200 last");
    json_decref(v);
    /* A client that leaves holds the fold at what it was given: records it
     * had and never gave went with it. */
    sluice_ReleaseClientRequest rel = {.job_id = j, .client_id = c2};
    sl_dstate_client_secret(st, j, c2, rel.client_secret);
    cr_assert_eq(sl_dstate_client_release(st, &rel, 0, err, sizeof err), 0, "%s", err);
    given_heartbeat(j, c1, ta, first + 4, 350);
    cr_assert_eq(hb->confirmed_below.record, 400, "client 1 is all the job's clients now");
    cr_assert_eq(folded_at(), 200, "held where client 2 left");
    /* The floor of those that left survives a restart (a client's own word
     * is said again at its next heartbeat). */
    save();
    restart();
    given_heartbeat(j, c1, ta, first + 4, 350);
    cr_assert_eq(folded_at(), 200, "the stored floor");
}

Test(outstanding, a_restore_with_a_place_starts_the_job_there)
{
    st = new_state();
    uint64_t wa = worker("127.0.0.1:1");
    const char *spec = "{\"source\": {\"type\": \"range\", \"stop\": 1000}}";
    uint64_t ds, job_id, client;
    const char *fp;
    cr_assert_eq(sl_dstate_dataset_register(st, spec, strlen(spec), &ds, &fp, err, sizeof err), 0, "%s", err);
    /* Past the end of the epoch's only file, or under a static policy: refused by name. */
    sluice_GetOrCreateJobRequest req = {.dataset_id = ds, .sharding = SL_SHARDING_DYNAMIC, .job_name = "placed",
                                        .restore_record = 1001};
    cr_assert_eq(sl_dstate_job_get_or_create(st, &req, 0, &job_id, &client, err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "restore place (file 0, record 1001) is past the end of dataset"), "%s", err);
    req.restore_record = 250;
    req.sharding = SL_SHARDING_FILE;
    cr_assert_eq(sl_dstate_job_get_or_create(st, &req, 0, &job_id, &client, err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "only a restored iterator of a DYNAMIC job starts within an epoch"), "%s", err);
    req.sharding = SL_SHARDING_DYNAMIC;
    sluice_GetOrCreateJobResponse resp = sluice_GetOrCreateJobResponse_init_zero;
    cr_assert_eq(sl_dstate_job_join(st, &req, "", NULL, 0, 0, &resp, err, sizeof err), 0, "%s", err);
    cr_assert(resp.restore_place_taken);
    uint64_t ta = task_of(resp.job_id, wa);
    sluice_GetSplitResponse r;
    get_splits(ta, 1, 64, &r);
    cr_assert_geq(r.splits_count, 1);
    cr_assert_eq(r.splits[0].begin, 250, "the first split starts at the place, not at %" PRIu64, r.splits[0].begin);
    uint64_t covered = 0;
    for (pb_size_t i = 0; i < r.splits_count; i++)
        covered += r.splits[i].end - r.splits[i].begin;
    cr_assert_eq(covered, 750, "the rest of the epoch, once");
    /* A rank that joins must bring the same place: another is another checkpoint. */
    req.restore_record = 300;
    cr_assert_eq(sl_dstate_job_get_or_create(st, &req, 0, &job_id, &client, err, sizeof err), SL_ECONFLICT);
    cr_assert(strstr(err, "restored from another checkpoint"), "%s", err);
    req.restore_record = 250;
    cr_assert_eq(sl_dstate_job_get_or_create(st, &req, 0, &job_id, &client, err, sizeof err), 0, "%s", err);
    cr_assert_eq(job_id, resp.job_id);
}

/* Client's report at gen of the positions of epoch 0, file 0 in [0, end)
 * that keep(pos) picks, as posbits, in the bytes a client sends
 * (sl__report_encode()'s choice made here: version 3 when asked). */
static int scattered_report(uint64_t job_id, uint64_t client, uint64_t gen, uint64_t end, bool (*keep)(uint64_t),
                            bool v3)
{
    sl_posbits_t b;
    sl_posbits_init(&b, SL_POSSET_MAX_RUNS);
    sl_posrun_t runs[4096];
    for (uint64_t at = 0; at < end;) {
        size_t n = 0;
        for (; at < end && n < 4096; at++)
            if (keep(at))
                runs[n++] = (sl_posrun_t){0, 0, at, 1};
        cr_assert_eq(sl_posbits_add_many(&b, runs, n), 0);
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    /* Version 2 as a client sends it where its runs fit its bound. */
    cr_assert_eq(v3 ? sl_posbits_encode(&b, SL_POSBITS_WIRE_RUNS, &buf, &len) : sl_posbits_bytes(&b, &buf, &len), 0);
    cr_assert_eq(buf[4], v3 ? 3 : 2);
    sluice_ReportReceivedRequest req = {.job_id = job_id, .client_id = client, .report_gen = gen};
    sl_dstate_client_secret(st, job_id, client, req.client_secret);
    int rc = sl_dstate_client_report(st, &req, buf, len, 0, err, sizeof err);
    free(buf);
    sl_posbits_clear(&b);
    return rc;
}

/* Records [0, 100) and every fourth after, and the others. */
static bool front_and_fourths(uint64_t p)
{
    return p < 100 || p % 4 == 0;
}

static bool the_rest(uint64_t p)
{
    return !front_and_fourths(p);
}

/* One record in 178: 23 a block of 4096 (24 in the first), too few to make
 * it a bitmap; 137 units in [0, 24576). */
static bool sparse(uint64_t p)
{
    return p % 178 == 0;
}

Test(outstanding, a_ranks_scattered_report_is_kept_only_within_the_lost_splits)
{
    /* Two ranks of a named job report a million scattered records each
     * (their shares behind a shuffle), one as bitmaps (version 3), one as
     * runs, against a bound of 135 units: the dispatcher keeps what lies
     * in the lost splits, [0, 24576), six blocks of 4096 records, each
     * share as six bitmaps (132 units), and refuses by name a report with
     * more units than the bound there (sparse(): 137 units). */
    sl_dstate_config_t cfg;
    sl_dstate_config_init(&cfg);
    cfg.split_size = 8192;
    cfg.max_exclude_runs = 135;
    st = sl_dstate_new(&cfg);
    uint64_t wa = worker("127.0.0.1:1"), wb = worker("127.0.0.1:2");
    uint64_t c1 = 0, c2, j = big_job(20000000, 2, &c1);
    c2 = c1 + 1;
    uint64_t ta = task_of(j, wa), tb = task_of(j, wb);
    sluice_GetSplitResponse r;
    get_splits(ta, 1, 3, &r);
    cr_assert_eq(r.splits[2].end, 24576);
    cr_assert(sl_dstate_worker_disconnected(st, wa, "reset by peer"));
    cr_assert_eq(lost_splits(j, "awaiting_reports"), 3);
    cr_assert_eq(scattered_report(j, c1, 1, 2000000, sparse, true), SL_ELIMIT);
    cr_assert(strstr(err, "more than 135 units of positions within the lost splits (a unit a run, 22 a bitmap of "
                          "4096 positions; --max-exclude-runs)"), "%s", err);
    cr_assert_eq(scattered_report(j, c1, 1, 2000000, front_and_fourths, true), 0, "%s", err);
    cr_assert_eq(lost_splits(j, "awaiting_reports"), 3);
    cr_assert_eq(scattered_report(j, c2, 1, 2000000, the_rest, false), 0, "%s", err);
    cr_assert_eq(lost_splits(j, "queued"), 3);
    /* Together they had every record of the lost splits: none goes again. */
    get_splits(tb, 1, 8, &r);
    cr_assert_gt(r.splits_count, 0);
    cr_assert_eq(r.splits[0].begin, 24576, "split [%" PRIu64 ", %" PRIu64 ") went again", r.splits[0].begin,
                 r.splits[0].end);
    cr_assert_eq(lost_splits(j, "queued"), 0);
}

/* Rank share_rank of share_ranks: the records a shuffle gave it, drawn by
 * position; those of class share_ranks went to nobody (they were in the
 * lost worker's buffers). */
static unsigned share_rank, share_ranks;
static uint64_t share_seed;

static bool share_of(uint64_t p)
{
    uint64_t x = share_seed ^ p;
    return splitmix64(&x) % (share_ranks + 1) == share_rank;
}

Test(outstanding, ranks_scattered_reports_past_the_bound_in_runs_are_kept_as_bitmaps_through_a_restart)
{
    /* Seeded, at user sizes: a worker lost with 3 splits of 1,000,000
     * records handed out; 2 to 4 ranks of a named job had scattered shares
     * of them (behind a shuffle, a record each here and there), a run a
     * record: hundreds of thousands of runs a report, against a bound of
     * 20,000 units. As runs each report was refused, and the rank's
     * iterator failed on a worker loss; as bitmaps a share takes about
     * 16,000 units. The reports go as version 2 or 3 (drawn), the
     * dispatcher restarts before the splits go again (its store holds what
     * the ranks had as bitmaps), and they go out with exactly what no rank
     * had. */
    uint64_t rng =
        test_seed("outstanding::ranks_scattered_reports_past_the_bound_in_runs_are_kept_as_bitmaps_through_a_restart");
    share_ranks = 2 + (unsigned)(splitmix64(&rng) % 3);
    share_seed = splitmix64(&rng);
    bool v3 = splitmix64(&rng) % 2;
    cr_log_info("%u ranks, reports as version %d", share_ranks, v3 ? 3 : 2);
    enum { SPLIT = 1000000, LOST = 3 * SPLIT };
    sl_dstate_config_t cfg;
    sl_dstate_config_init(&cfg);
    cfg.split_size = SPLIT;
    cfg.max_split_size = SPLIT;
    cfg.max_exclude_runs = 20000;
    st = sl_dstate_new(&cfg);
    uint64_t wa = worker("127.0.0.1:1"), wb = worker("127.0.0.1:2");
    uint64_t first = 0, j = big_job(20000000, share_ranks, &first);
    uint64_t ta = task_of(j, wa), tb = task_of(j, wb);
    sluice_GetSplitResponse r;
    get_splits(ta, 1, 3, &r);
    cr_assert_eq(r.splits[2].end, LOST);
    cr_assert(sl_dstate_worker_disconnected(st, wa, "reset by peer"));
    for (share_rank = 0; share_rank < share_ranks; share_rank++)
        cr_assert_eq(scattered_report(j, first + share_rank, 1, LOST + 100000, share_of, v3), 0, "rank %u: %s",
                     share_rank, err);
    cr_assert_eq(lost_splits(j, "queued"), 3);
    save();
    restart();
    uint8_t *given = calloc(LOST, 1);
    cr_assert_not_null(given);
    for (uint64_t seq = 1; seq < 100 && lost_splits(j, "queued") > 0; seq++) {
        get_splits(tb, seq, 8, &r);
        size_t len;
        const uint8_t *skips = sl_dstate_split_skips(st, tb, &len);
        for (pb_size_t i = 0; i < r.splits_count; i++) {
            const sluice_Split *sp = &r.splits[i];
            if (sp->begin >= LOST)
                continue; /* the cursor's */
            uint64_t at = sp->begin;
            for (uint32_t k = 0; k <= sp->skip_count; k++) {
                uint64_t b = k < sp->skip_count ? sl_get_le64(skips + sp->skip_offset + 16 * k) : sp->end;
                uint64_t c = k < sp->skip_count ? sl_get_le64(skips + sp->skip_offset + 16 * k + 8) : 0;
                cr_assert(b >= at && b + c <= sp->end);
                for (uint64_t x = at; x < b; x++)
                    cr_assert_not(given[x]++, "record %" PRIu64 " handed out twice", x);
                at = b + c;
            }
        }
    }
    cr_assert_eq(lost_splits(j, "queued"), 0);
    share_rank = share_ranks; /* nobody's */
    for (uint64_t x = 0; x < LOST; x++)
        cr_assert_eq(given[x], share_of(x), "record %" PRIu64 ": handed out %d times, had by a rank %d", x, given[x],
                     !share_of(x));
    free(given);
}

/* Appends the position set of the n runs (file, begin, count; epoch 0)
 * to buf (*len bytes so far). @return the bytes appended */
static size_t posset_append(uint8_t **buf, size_t *len, unsigned n, const uint64_t (*runs)[3])
{
    sl_posset_t s;
    sl_posset_init(&s, 1000);
    for (unsigned i = 0; i < n; i++)
        cr_assert_eq(sl_posset_add(&s, 0, (uint32_t)runs[i][0], runs[i][1], runs[i][2], NULL), 0);
    size_t add = sl_posset_encode(&s, NULL, 0);
    *buf = realloc(*buf, *len + add);
    cr_assert_not_null(*buf);
    sl_posset_encode(&s, *buf + *len, add);
    *len += add;
    sl_posset_clear(&s);
    return add;
}

/* Client `client` of job_id leaves giving back the n runs (file, begin,
 * count; epoch 0) its caller was not given, after saying it received the
 * nr runs of received (none: it does not say). The answer in *resp. */
/* Client leaves job_id giving back n runs (file, begin, count) of epoch
 * 0, having received nr runs; whole: every worker answered its leave. */
static void leave_part(uint64_t job_id, uint64_t client, unsigned nr, const uint64_t (*received)[3], unsigned n,
                       const uint64_t (*runs)[3], bool whole, sluice_ReleaseClientResponse *resp)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    sluice_ReleaseClientRequest rel = {.job_id = job_id, .client_id = client, .returns = true, .returns_whole = whole};
    if (received)
        rel.received_length = posset_append(&buf, &len, nr, received);
    posset_append(&buf, &len, n, runs);
    sl_dstate_client_secret(st, job_id, client, rel.client_secret);
    *resp = (sluice_ReleaseClientResponse)sluice_ReleaseClientResponse_init_zero;
    cr_assert_eq(sl_dstate_client_leave(st, &rel, buf, len, 0, resp, err, sizeof err), 0, "%s", err);
    free(buf);
}

static void leave_with(uint64_t job_id, uint64_t client, unsigned nr, const uint64_t (*received)[3], unsigned n,
                       const uint64_t (*runs)[3], sluice_ReleaseClientResponse *resp)
{
    leave_part(job_id, client, nr, received, n, runs, true, resp);
}

static void give_back(uint64_t job_id, uint64_t client, unsigned n, const uint64_t (*runs)[3],
                      sluice_ReleaseClientResponse *resp)
{
    leave_with(job_id, client, 0, NULL, n, runs, resp);
}

/* The skip runs of split i of answer r to task (begin, count pairs), n of them at most. */
static unsigned skips_of(uint64_t task, const sluice_GetSplitResponse *r, unsigned i, uint64_t (*out)[2], unsigned n)
{
    size_t len;
    const uint8_t *skips = sl_dstate_split_skips(st, task, &len);
    cr_assert_leq(r->splits[i].skip_count, n);
    for (unsigned k = 0; k < r->splits[i].skip_count; k++) {
        out[k][0] = sl_get_le64(skips + r->splits[i].skip_offset + 16 * k);
        out[k][1] = sl_get_le64(skips + r->splits[i].skip_offset + 16 * k + 8);
    }
    return r->splits[i].skip_count;
}

Test(outstanding, what_a_leaving_client_gives_back_goes_out_again_once_and_nothing_else)
{
    st = new_state();
    uint64_t wa = worker("127.0.0.1:1"), wb = worker("127.0.0.1:2");
    uint64_t c0 = 0, j = big_job(200000, 4, &c0);
    uint64_t ta = task_of(j, wa), tb = task_of(j, wb);
    sluice_GetSplitResponse r;
    get_splits(ta, 1, 4, &r); /* [0, 400) in splits of 100 */
    cr_assert_eq(r.splits[3].end, 400);
    uint64_t first = r.splits[0].split_id;
    /* Every client has [0, 100) and was given what it got before 100: the fold. */
    for (uint64_t c = c0; c < c0 + 4; c++)
        given_heartbeat(j, c, ta, first + 1, 100);
    for (uint64_t c = c0; c < c0 + 4; c++)
        given_heartbeat(j, c, ta, first + 1, 100);
    cr_assert_eq(folded_at(), 100);
    save(); /* the splits handed out are stored as they were */

    /* Refused by name, and the client released all the same: a record
     * before the fold, one not handed out, a file the dataset lacks. */
    sluice_ReleaseClientResponse resp;
    const uint64_t before_fold[][3] = {{0, 150, 5}, {0, 99, 1}};
    give_back(j, c0 + 3, 2, before_fold, &resp);
    cr_assert_not(resp.returns_taken);
    cr_assert(strstr(resp.returns_error, "record 99 of file 0 (epoch 0) lies before the job's fold"), "%s",
              resp.returns_error);
    cr_assert_eq(lost_splits(j, "queued"), 0, "nothing of a refused return is taken");
    json_t *v = job_view(j);
    cr_assert_eq(json_array_size(json_object_get(v, "consumers")), 3, "the client left all the same");
    json_decref(v);
    const uint64_t unread[][3] = {{0, 390, 20}};
    give_back(j, c0 + 2, 1, unread, &resp);
    cr_assert_not(resp.returns_taken);
    cr_assert(strstr(resp.returns_error, "record 409 of file 0 (epoch 0) was not handed out yet"), "%s",
              resp.returns_error);
    const uint64_t no_file[][3] = {{1, 150, 5}};
    give_back(j, c0 + 1, 1, no_file, &resp);
    cr_assert_not(resp.returns_taken);
    cr_assert(strstr(resp.returns_error, "the dataset has 1 files"), "%s", resp.returns_error);

    /* Client c0 + 4 joins; c0 leaves with [150, 160), [170, 171) and
     * [390, 400) not given: a split each, skipping nothing (a rank that
     * gets every record of a split counts its whole range as its own). It
     * received [100, 110) too, and [320, 330), given to its caller. */
    sluice_GetOrCreateJobRequest join = {.dataset_id = 1, .sharding = SL_SHARDING_DYNAMIC, .job_name = "shared"};
    uint64_t c4, jid;
    v = job_view(j);
    join.dataset_id = (uint64_t)json_integer_value(json_object_get(v, "dataset_id"));
    json_decref(v);
    cr_assert_eq(sl_dstate_job_get_or_create(st, &join, 0, &jid, &c4, err, sizeof err), 0, "%s", err);
    const uint64_t back[][3] = {{0, 150, 10}, {0, 170, 1}, {0, 390, 10}};
    const uint64_t received[][3] = {{0, 100, 10}, {0, 150, 10}, {0, 170, 1}, {0, 320, 10}, {0, 390, 10}};
    leave_with(j, c0, 5, received, 3, back, &resp);
    cr_assert(resp.returns_taken, "%s", resp.returns_error);
    cr_assert_eq(lost_splits(j, "queued"), 3);
    cr_assert_eq(hb->confirmed_below.record, 100, "the answer before");
    given_heartbeat(j, c4, ta, first + 1, 0);
    cr_assert_eq(folded_at(), -1, "the new client said nothing was given yet: the fold is at the start");

    /* The records given back stay out of the splits that hold them, also
     * once stored and loaded again: [100, 200) and [300, 400) of the task
     * whose worker is now lost come again without them (nobody reports
     * having any of them). */
    save();
    restart();
    cr_assert(sl_dstate_worker_disconnected(st, wa, "reset by peer"));
    heartbeat(j, c4, 0, NULL, NULL);
    cr_assert_eq(report(j, c4, hb->report_gen, 0, NULL), 0, "%s", err);
    cr_assert_eq(lost_splits(j, "queued"), 6, "the three given back and three lost splits");

    /* Saved and loaded: the split given back belongs to no task. */
    save();
    restart();
    cr_assert_eq(lost_splits(j, "queued"), 6);
    get_splits(tb, 1, 8, &r);
    cr_assert_eq(r.splits_count, 3);
    /* After the load in the order of their ids: the lost task's first. The
     * splits given back meet their ranges, and wait: a worker tells a
     * record's split by its place. */
    uint64_t k[4][2];
    cr_assert_eq(r.splits[0].begin, 100);
    cr_assert_eq(r.splits[0].end, 200);
    cr_assert_eq(skips_of(tb, &r, 0, k, 4), 3, "without what was received");
    cr_assert_eq(k[0][0], 100);
    cr_assert_eq(k[0][1], 10);
    cr_assert_eq(k[1][0], 150);
    cr_assert_eq(k[1][1], 10);
    cr_assert_eq(k[2][0], 170);
    cr_assert_eq(k[2][1], 1);
    cr_assert_eq(r.splits[1].begin, 200);
    cr_assert_eq(skips_of(tb, &r, 1, k, 4), 0);
    cr_assert_eq(r.splits[2].begin, 300);
    cr_assert_eq(r.splits[2].end, 400);
    cr_assert_eq(skips_of(tb, &r, 2, k, 4), 2);
    cr_assert_eq(k[0][0], 320);
    cr_assert_eq(k[0][1], 10);
    cr_assert_eq(k[1][0], 390);
    cr_assert_eq(k[1][1], 10);
    for (unsigned i = 0; i < r.splits_count; i++)
        cr_assert_gt(r.splits[i].split_id, first + 3, "new ids");
    cr_assert_eq(lost_splits(j, "queued"), 3);
    /* tb's next answer goes on from the cursor; the new worker's task
     * takes it. */
    sluice_GetSplitResponse rc;
    get_splits(tb, 2, 1, &rc);
    cr_assert_eq(rc.splits_count, 1);
    cr_assert_eq(rc.splits[0].begin, 400);
    uint64_t tc = task_of(j, worker("127.0.0.1:3"));
    get_splits(tc, 1, 8, &rc);
    cr_assert_eq(rc.splits_count, 3);
    const uint64_t want[3][2] = {{150, 160}, {170, 171}, {390, 400}};
    for (unsigned i = 0; i < 3; i++) {
        cr_assert_eq(rc.splits[i].begin, want[i][0]);
        cr_assert_eq(rc.splits[i].end, want[i][1]);
        cr_assert_eq(rc.splits[i].skip_count, 0);
    }
    cr_assert_eq(lost_splits(j, "queued"), 0);
}

/* The place the job view shows as lost_splits' field (folded_below,
 * held_below): its record, epoch and file 0; -1 without it. */
static json_int_t view_place(uint64_t job_id, const char *field)
{
    json_t *v = job_view(job_id);
    json_t *f = json_object_get(json_object_get(v, "lost_splits"), field);
    if (!f) {
        json_decref(v);
        return -1;
    }
    cr_assert_eq(json_integer_value(json_array_get(f, 0)), 0);
    cr_assert_eq(json_integer_value(json_array_get(f, 1)), 0);
    json_int_t at = json_integer_value(json_array_get(f, 2));
    json_decref(v);
    return at;
}

Test(outstanding, a_rank_that_gave_back_what_waited_for_it_holds_the_fold_only_until_that_is_given_again)
{
    st = new_state();
    uint64_t wa = worker("127.0.0.1:1");
    uint64_t c0 = 0, j = big_job(200000, 4, &c0);
    uint64_t ta = task_of(j, wa);
    sluice_GetSplitResponse r;
    get_splits(ta, 1, 4, &r); /* [0, 400) in splits of 100 */
    uint64_t first = r.splits[0].split_id;
    /* Every client has all four; c0's caller waits for [150, 160), the
     * others were given everything. Twice: a split is confirmed once
     * every client has it. */
    const uint64_t given[4] = {150, 400, 400, 400};
    for (int round = 0; round < 2; round++)
        for (uint64_t c = c0; c < c0 + 4; c++)
            given_heartbeat(j, c, ta, first + 4, given[c - c0]);
    cr_assert_eq(hb->confirmed_below.record, 400);
    cr_assert_eq(folded_at(), 150);

    /* c0 leaves and gives [150, 160) back, every worker having answered:
     * it goes out again, before the place confirmed now, and no client's
     * word of what it was given counts past it until it is given again. */
    sluice_ReleaseClientResponse resp;
    const uint64_t received[][3] = {{0, 100, 100}}, back[][3] = {{0, 150, 10}};
    leave_with(j, c0, 1, received, 1, back, &resp);
    cr_assert(resp.returns_taken, "%s", resp.returns_error);
    cr_assert_eq(view_place(j, "folded_below"), 150, "the others' 400 counts to the record given back");
    given_heartbeat(j, c0 + 1, ta, first + 4, 400);
    cr_assert_eq(hb->confirmed_below.record, 150);
    cr_assert_eq(folded_at(), 150);

    /* It goes out to the task, before any new split; c0 + 1 gets it and
     * its caller is given it, c0 + 2 and c0 + 3 get none of it. Once
     * every client said so, the fold passes the place c0 left at. */
    get_splits(ta, 2, 1, &r);
    cr_assert_eq(r.splits_count, 1);
    cr_assert_eq(r.splits[0].begin, 150);
    cr_assert_eq(r.splits[0].end, 160);
    uint64_t again = r.splits[0].split_id;
    given_heartbeat(j, c0 + 1, ta, again + 1, 400);
    given_heartbeat(j, c0 + 2, ta, again + 1, 400);
    cr_assert_eq(folded_at(), 150, "c0 + 3 has not said it has the split given back");
    given_heartbeat(j, c0 + 3, ta, again + 1, 400);
    cr_assert_eq(hb->confirmed_below.record, 400);
    for (uint64_t c = c0 + 1; c < c0 + 4; c++)
        given_heartbeat(j, c, ta, again + 1, 400);
    cr_assert_eq(folded_at(), 400, "no floor where c0 left");
    cr_assert_eq(view_place(j, "held_below"), -1);
    cr_assert_eq(view_place(j, "folded_below"), 400);

    /* A rank whose worker did not answer its leave may lose what was on
     * its way: it holds the fold where it was given, as one that gives
     * nothing back does. */
    get_splits(ta, 3, 1, &r); /* [400, 500) */
    for (int round = 0; round < 2; round++)
        for (uint64_t c = c0 + 1; c < c0 + 4; c++)
            given_heartbeat(j, c, ta, r.splits[0].split_id + 1, c == c0 + 3 ? 450 : 500);
    cr_assert_eq(folded_at(), 450);
    const uint64_t waiting[][3] = {{0, 450, 20}};
    leave_part(j, c0 + 3, 0, NULL, 1, waiting, false, &resp);
    cr_assert(resp.returns_taken, "%s", resp.returns_error);
    get_splits(ta, 4, 1, &r);
    cr_assert_eq(r.splits[0].begin, 450);
    for (int round = 0; round < 2; round++)
        for (uint64_t c = c0 + 1; c < c0 + 3; c++)
            given_heartbeat(j, c, ta, r.splits[0].split_id + 1, 500);
    cr_assert_eq(hb->confirmed_below.record, 500);
    cr_assert_eq(folded_at(), 450, "held where c0 + 3 left");
    cr_assert_eq(view_place(j, "held_below"), 450, "the view says where");
}

/* Splits given back count against no --max-outstanding-splits, also once
 * stored at the task they went to and loaded again. */
Test(outstanding, splits_given_back_count_against_no_bound_also_after_a_restart)
{
    st = bounded_state(false);
    uint64_t wa = worker("127.0.0.1:1");
    uint64_t c0 = 0, j = big_job(200000, 2, &c0);
    uint64_t ta = task_of(j, wa);
    sluice_GetSplitResponse r;
    get_splits(ta, 1, 5, &r);
    cr_assert_eq(r.splits_count, 5, "[0, 500): at the bound");
    sluice_ReleaseClientResponse resp;
    const uint64_t back[][3] = {{0, 120, 1}, {0, 310, 1}, {0, 455, 1}};
    give_back(j, c0, 3, back, &resp);
    cr_assert(resp.returns_taken, "%s", resp.returns_error);
    uint64_t tb = task_of(j, worker("127.0.0.1:2"));
    get_splits(tb, 1, 3, &r);
    cr_assert_eq(r.splits_count, 3);
    for (unsigned i = 0; i < 3; i++)
        cr_assert_eq(r.splits[i].begin, back[i][1]);
    save();
    sl_dstate_free(st);
    st = bounded_state(true);
    get_splits(tb, 2, 8, &r);
    cr_assert_eq(r.splits_count, 5, "the three given back at it are not of its bound of 5: %u", r.splits_count);
    cr_assert_eq(r.splits[0].begin, 500);
}
