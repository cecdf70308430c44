/*
 * test_persist.c: the dispatcher state's durable form (dispatcher/persist.c)
 * on a real LMDB store in a temporary dir: what is saved loads back the
 * same, a split request asked again gets the same splits across a restart,
 * a failed commit goes back to what was committed, and a damaged record
 * holds back what it is of, its table and id named.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
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
static sl_dstate_t *st, *st2;
static char err[1024];

static void setup(void)
{
    sl_log_init("test_persist", -1);
    snprintf(dir, sizeof dir, "/tmp/sl-persist-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
    sl_dstate_free(st);
    sl_dstate_free(st2);
    st = st2 = NULL;
    sl_store_close(store);
    store = NULL;
    remove_dir(dir);
}

TestSuite(persist, .init = setup, .fini = teardown);

static void open_store(size_t map_bytes)
{
    store = open_state_store(dir, map_bytes);
}

static void save(sl_dstate_t *s)
{
    cr_assert_eq(sl_dpersist_save(s, store, err, sizeof err), 0, "%s", err);
    cr_assert_not(sl_dpersist_dirty(s));
}

static sl_dstate_t *reopen(void)
{
    sl_dstate_t *s = new_state();
    cr_assert_eq(sl_dpersist_load(s, store, 1000, err, sizeof err), 0, "%s", err);
    return s;
}

static uint64_t dataset(sl_dstate_t *s, const char *spec)
{
    uint64_t id;
    const char *fp;
    cr_assert_eq(sl_dstate_dataset_register(s, spec, strlen(spec), &id, &fp, err, sizeof err), 0, "%s", err);
    return id;
}

static uint64_t worker(sl_dstate_t *s, const char *address)
{
    uint64_t id;
    cr_assert_eq(sl_dstate_worker_register(s, address, 0, &id, err, sizeof err), 0, "%s", err);
    return id;
}

static void job(sl_dstate_t *s, uint64_t ds, const char *name, uint64_t *job_id, uint64_t *client_id)
{
    sluice_GetOrCreateJobRequest req = {.dataset_id = ds, .sharding = SL_SHARDING_DYNAMIC};
    snprintf(req.job_name, sizeof req.job_name, "%s", name);
    cr_assert_eq(sl_dstate_job_get_or_create(s, &req, 0, job_id, client_id, err, sizeof err), 0, "%s", err);
}

/* The job's first task id, from its admin view. */
static uint64_t first_task(sl_dstate_t *s, uint64_t job_id)
{
    json_t *j = sl_dstate_job_json(s, job_id, 0);
    cr_assert_not_null(j);
    uint64_t id = (uint64_t)json_integer_value(json_object_get(json_array_get(json_object_get(j, "tasks"), 0),
                                                               "task_id"));
    json_decref(j);
    return id;
}

static void splits_of(sl_dstate_t *s, uint64_t task, uint64_t seq, uint32_t max, sluice_GetSplitResponse *resp,
                      int want_rc)
{
    sluice_GetSplitRequest req = {.task_id = task, .epoch = 0, .max_splits = max, .request_seq = seq};
    *resp = (sluice_GetSplitResponse)sluice_GetSplitResponse_init_zero;
    int rc = sl_dstate_get_splits(s, &req, 0, resp, err, sizeof err);
    cr_assert_eq(rc, want_rc, "get_splits seq %" PRIu64 ": %d %s", seq, rc, err);
}

static void splits(sl_dstate_t *s, uint64_t task, uint64_t seq, sluice_GetSplitResponse *resp, int want_rc)
{
    splits_of(s, task, seq, 3, resp, want_rc);
}

static void assert_same_splits(const sluice_GetSplitResponse *a, const sluice_GetSplitResponse *b, const char *what)
{
    cr_assert_eq(a->splits_count, b->splits_count, "%s: %u splits, then %u", what, a->splits_count, b->splits_count);
    cr_assert_eq(a->epoch, b->epoch, "%s", what);
    for (pb_size_t i = 0; i < a->splits_count; i++)
        cr_assert(a->splits[i].split_id == b->splits[i].split_id && a->splits[i].begin == b->splits[i].begin &&
                      a->splits[i].end == b->splits[i].end && a->splits[i].file_index == b->splits[i].file_index,
                  "%s: split %u differs", what, i);
}

/* A store, and a state with one worker and an anonymous DYNAMIC job of
 * spec: the job's task. */
static uint64_t one_task(const char *spec)
{
    open_store(0);
    st = new_state();
    worker(st, "127.0.0.1:1");
    uint64_t ds = dataset(st, spec);
    uint64_t job_id, cid;
    job(st, ds, "", &job_id, &cid);
    return first_task(st, job_id);
}

/* The admin views without what starts afresh at load (times, rates). */
static char *views(sl_dstate_t *s)
{
    json_t *all = json_pack("{s:o,s:o,s:o}", "workers", sl_dstate_workers_json(s, 0), "datasets",
                            sl_dstate_datasets_json(s), "jobs", sl_dstate_jobs_json(s, 0));
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(all, "workers"), i, v) {
        json_object_del(v, "last_heartbeat_ms_ago");
        json_object_del(v, "uptime_ms");
        json_object_del(v, "first_request_splits");
        json_object_del(v, "split_lengths");
    }
    json_array_foreach(json_object_get(all, "jobs"), i, v) {
        json_object_del(v, "age_ms");
        /* A load moves the lost splits' report generation on, so that
         * every client reports again (fault-tolerance.md). */
        json_object_del(json_object_get(v, "lost_splits"), "report_gen");
    }
    json_array_foreach(json_object_get(all, "datasets"), i, v)
        json_object_del(v, "unused_ms");
    char *text = json_dumps(all, JSON_SORT_KEYS);
    json_decref(all);
    return text;
}

/* a and b are the same views. A failed assertion's message goes to the
 * runner whole, and one of megabytes (10,000 jobs' views) hangs it: the
 * message names the first difference, with at most 120 bytes of each. */
static void assert_same_views(const char *a, const char *b, const char *what)
{
    size_t i = 0;
    while (a[i] && a[i] == b[i])
        i++;
    if (a[i] == b[i])
        return;
    size_t from = i > 40 ? i - 40 : 0;
    cr_assert_fail("%s: the views differ at byte %zu of %zu and %zu: ...%.120s... against ...%.120s...", what, i,
                   strlen(a), strlen(b), a + from, b + from);
}

Test(persist, what_is_saved_loads_back_the_same)
{
    open_store(0);
    st = new_state();
    worker(st, "127.0.0.1:1");
    worker(st, "127.0.0.1:2");
    uint64_t ds = dataset(st, "{\"source\": {\"type\": \"range\", \"stop\": 1000}}");
    uint64_t job_id, cid;
    job(st, ds, "train", &job_id, &cid);
    sluice_GetSplitResponse r;
    splits(st, first_task(st, job_id), 1, &r, 0);
    cr_assert_eq(r.splits_count, 3);
    cr_assert(sl_dpersist_dirty(st));
    save(st);

    st2 = reopen();
    char *a = views(st), *b = views(st2);
    assert_same_views(a, b, "before and after the load");
    free(a);
    free(b);
    /* The same client lease and job name carry on; new ids are new. */
    sluice_ClientHeartbeatRequest hb = {.job_id = job_id, .client_id = cid};
    /* The secret the first dispatcher gave the client is still its own. */
    sl_dstate_client_secret(st, job_id, cid, hb.client_secret);
    sluice_ClientHeartbeatResponse *hr = calloc(1, sizeof *hr);
    cr_assert_eq(sl_dstate_client_heartbeat(st2, &hb, 1000, hr, err, sizeof err), 0, "%s", err);
    cr_assert_eq(hr->tasks_count, 2);
    free(hr);
    /* So are its tasks' keys: the job's nonce, from which both are derived
     * (caps.h), was stored with it. */
    uint8_t key[16], key2[16];
    sl_dstate_task_key(st, first_task(st, job_id), key);
    sl_dstate_task_key(st2, first_task(st, job_id), key2);
    cr_assert_arr_eq(key, key2, 16);
    uint64_t ds2 = dataset(st2, "{\"source\": {\"type\": \"range\", \"stop\": 5}}");
    cr_assert_gt(ds2, cid);
}

Test(persist, a_split_request_asked_again_gets_the_same_splits_across_a_restart)
{
    uint64_t task = one_task("{\"source\": {\"type\": \"range\", \"stop\": 1000}}");
    sluice_GetSplitResponse first, again, next;
    splits(st, task, 1, &first, 0);
    save(st);
    /* The answer was lost with the dispatcher: the worker asks again. */
    st2 = reopen();
    splits(st2, task, 1, &again, 0);
    cr_assert_eq(again.splits_count, first.splits_count);
    for (pb_size_t i = 0; i < first.splits_count; i++) {
        cr_assert_eq(again.splits[i].split_id, first.splits[i].split_id);
        cr_assert_eq(again.splits[i].begin, first.splits[i].begin);
        cr_assert_eq(again.splits[i].end, first.splits[i].end);
    }
    cr_assert_not(sl_dpersist_dirty(st2), "a repeated answer changes nothing");
    /* The next request continues where the cursor was: nothing twice. */
    splits(st2, task, 2, &next, 0);
    cr_assert_eq(next.splits[0].begin, first.splits[first.splits_count - 1].end);
    cr_assert_gt(next.splits[0].split_id, first.splits[first.splits_count - 1].split_id);
    /* An older request than the last answered one is refused. */
    splits(st2, task, 1, &again, SL_EINVAL);
    cr_assert(strstr(err, "older than its last answered request 2"), "%s", err);
}

/* An answer holds up to GetSplitResponse.splits' max_count (512) splits,
 * and a task keeps only as many as its last answer holds: asked again, in
 * memory or after a restart, a full answer and then a short one come back
 * whole. */
Test(persist, an_answer_of_the_most_splits_comes_back_whole_and_a_short_one_after_it)
{
    uint64_t task = one_task("{\"source\": {\"type\": \"range\", \"stop\": 1000000}}");
    const uint32_t most = pb_arraysize(sluice_GetSplitResponse, splits);
    sluice_GetSplitResponse *full = malloc(sizeof *full), *again = malloc(sizeof *again);
    sluice_GetSplitResponse *shrt = malloc(sizeof *shrt);
    splits_of(st, task, 1, UINT32_MAX, full, 0);
    cr_assert_eq(full->splits_count, most, "%u splits of the least size, asked for all", full->splits_count);
    splits_of(st, task, 1, UINT32_MAX, again, 0);
    assert_same_splits(full, again, "asked again in memory");
    save(st);
    st2 = reopen();
    splits_of(st2, task, 1, UINT32_MAX, again, 0);
    assert_same_splits(full, again, "asked again after a restart");
    splits_of(st2, task, 2, 3, shrt, 0);
    cr_assert_eq(shrt->splits_count, 3);
    cr_assert_eq(shrt->splits[0].begin, full->splits[most - 1].end, "the cursor went on after the full answer");
    splits_of(st2, task, 2, UINT32_MAX, again, 0);
    assert_same_splits(shrt, again, "the short one asked again");
    save(st2);
    sl_dstate_t *st3 = reopen();
    splits_of(st3, task, 2, 3, again, 0);
    assert_same_splits(shrt, again, "the short one asked again after a restart");
    sl_dstate_free(st3);
    free(full);
    free(again);
    free(shrt);
}

Test(persist, a_failed_commit_goes_back_to_what_was_committed)
{
    open_store(128 << 10); /* a small map fills up quickly */
    st = new_state();
    uint64_t ds = dataset(st, "{\"source\": {\"type\": \"range\", \"stop\": 1000}}");
    save(st);
    char *committed = views(st);
    int rc = 0;
    char spec[200];
    for (int i = 0; i < 5000 && rc == 0; i++) {
        /* Each dataset its own record, with a long name to fill pages. */
        snprintf(spec, sizeof spec, "{\"source\": {\"type\": \"range\", \"stop\": %d, \"name\": \"%062d\"}}",
                 i + 1, i);
        dataset(st, spec);
        char *before = views(st);
        rc = sl_dpersist_save(st, store, err, sizeof err);
        if (rc == 0) {
            free(committed);
            committed = before;
        } else {
            free(before);
        }
    }
    cr_assert_eq(rc, -ENOSPC, "the map never filled: %d %s", rc, err);
    cr_assert(sl_dpersist_dirty(st));
    cr_assert_eq(sl_dpersist_reload(st, store, 0, err, sizeof err), 0, "%s", err);
    char *now = views(st);
    assert_same_views(now, committed, "after a failed commit the state is what was committed before");
    cr_assert_not_null(sl_dstate_dataset_spec(st, ds));
    free(now);
    free(committed);
}

static void put_be64(uint8_t *out, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        out[i] = (uint8_t)(v >> (56 - 8 * i));
}

static uint64_t get_be64(const uint8_t *in)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | in[i];
    return v;
}

struct job_record_of {
    uint64_t id;
    json_t **rec;
};

static int job_record_of(const void *key, size_t klen, const void *val, size_t vlen, void *arg)
{
    struct job_record_of *w = arg;
    uint64_t id = 0;
    for (size_t i = 0; i < klen; i++)
        id = id << 8 | ((const uint8_t *)key)[i];
    if (id != w->id)
        return 0;
    *w->rec = json_loadb(val, vlen, 0, NULL);
    return *w->rec ? 1 : -1;
}

/* A record put as it is: table, key (the id as 8 big-endian bytes), value. */
static void put_raw(int table, uint64_t id, const void *val, size_t len)
{
    uint8_t key[8];
    put_be64(key, id);
    sl_store_txn_t *t;
    cr_assert_eq(sl_store_begin(store, &t), 0);
    cr_assert_eq(sl_store_put(t, table, key, sizeof key, val, len), 0);
    cr_assert_eq(sl_store_commit(t, err, sizeof err), 0, "%s", err);
}

/* Every record of a table whose key starts with an id, as "table key-hex=value-hex;..." text. */
struct dump {
    uint64_t id;
    char *text;
    size_t len, cap;
};

static int dump_record(const void *key, size_t klen, const void *val, size_t vlen, void *arg)
{
    struct dump *d = arg;
    if (klen < 8 || get_be64(key) != d->id)
        return 0;
    size_t need = d->len + 2 * (klen + vlen) + 3;
    if (need > d->cap) {
        d->cap = 2 * need;
        cr_assert_not_null(d->text = realloc(d->text, d->cap));
    }
    for (size_t i = 0; i < klen + vlen; i++)
        d->len += (size_t)sprintf(d->text + d->len, "%02x", i < klen ? ((const uint8_t *)key)[i]
                                                                    : ((const uint8_t *)val)[i - klen]);
    d->len += (size_t)sprintf(d->text + d->len, "%s", ";");
    return 0;
}

static char *records_of(int table, uint64_t id)
{
    struct dump d = {.id = id, .cap = 1};
    cr_assert_not_null(d.text = calloc(1, 1));
    cr_assert_eq(sl_store_foreach(store, table, dump_record, &d), 0);
    return d.text;
}

/* A damaged record holds back what it is of (a job, a dataset and its
 * jobs), its table and id named; the rest is served, what is held back is
 * never written over nor deleted, its name is not made again, its clients
 * are told why, and its ids are not given again. */
Test(persist, damaged_records_hold_back_what_they_are_of_and_the_rest_is_served)
{
    open_store(0);
    st = new_state();
    worker(st, "127.0.0.1:1");
    uint64_t ds = dataset(st, "{\"source\": {\"type\": \"range\", \"stop\": 100000}}");
    uint64_t ds2 = dataset(st, "{\"source\": {\"type\": \"range\", \"stop\": 5000}}");
    uint64_t a, ca, b, cb, c, cc, d, cd;
    job(st, ds, "", &a, &ca);   /* its record damaged */
    job(st, ds, "b", &b, &cb);  /* its cursor damaged */
    job(st, ds, "c", &c, &cc);  /* served */
    job(st, ds2, "d", &d, &cd); /* its dataset's record damaged */
    sluice_GetSplitResponse r, r2;
    splits(st, first_task(st, b), 1, &r, 0); /* b has a hand-out and outstanding splits */
    splits(st, first_task(st, c), 1, &r, 0);
    save(st);
    put_raw(SL_DT_JOBS, a, "{\"name\": 7}", 11);
    put_raw(SL_DT_CURSORS, b, "[]", 2);
    put_raw(SL_DT_DATASETS, ds2, "not json", 8);
    const struct {
        int table;
        uint64_t id;
    } held[] = {{SL_DT_JOBS, a}, {SL_DT_JOBS, b}, {SL_DT_CURSORS, b}, {SL_DT_HANDOUTS, first_task(st, b)},
                {SL_DT_OUTSTANDING, b}, {SL_DT_DATASETS, ds2}, {SL_DT_JOBS, d}};
    size_t nheld = sizeof held / sizeof held[0];
    char *before[sizeof held / sizeof held[0]];
    for (size_t i = 0; i < nheld; i++) {
        before[i] = records_of(held[i].table, held[i].id);
        cr_assert(before[i][0], "record %zu is in the store", i);
    }

    st2 = new_state();
    cr_assert_eq(sl_dpersist_load(st2, store, 1000, err, sizeof err), 0, "%s", err);
    json_t *jobs = sl_dstate_jobs_json(st2, 0);
    cr_assert_eq(json_array_size(jobs), 1, "only job c is served");
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(jobs, 0), "id")), (json_int_t)c);
    json_decref(jobs);
    cr_assert_null(sl_dstate_dataset_spec(st2, ds2));
    cr_assert_not_null(sl_dstate_dataset_spec(st2, ds));
    json_t *q = sl_dstate_quarantine_json(st2);
    char *qtext = json_dumps(q, JSON_SORT_KEYS);
    json_t *list = json_object_get(q, "held_back");
    cr_assert_eq(json_array_size(list), 4, "%s", qtext);
    const struct {
        const char *table, *kind, *name;
        uint64_t id;
        const char *why;
    } want[] = {{"datasets", "dataset", NULL, ds2, "not a JSON object"},
                {"jobs", "job", NULL, a, "Expected string, got integer"},
                {"jobs", "job", "d", d, "its dataset is held back, its record damaged"},
                {"splits", "job", "b", b, "not a JSON object: another type"}};
    for (size_t i = 0; i < 4; i++) {
        json_t *e = json_array_get(list, i);
        char prefix[96];
        snprintf(prefix, sizeof prefix, "state store: %s record %" PRIu64 ": ", want[i].table, want[i].id);
        const char *why = json_string_value(json_object_get(e, "why"));
        cr_assert(strcmp(json_string_value(json_object_get(e, "table")), want[i].table) == 0 &&
                      strcmp(json_string_value(json_object_get(e, "kind")), want[i].kind) == 0 &&
                      json_integer_value(json_object_get(e, "id")) == (json_int_t)want[i].id &&
                      strncmp(why, prefix, strlen(prefix)) == 0 && strstr(why, want[i].why),
                  "entry %zu: %s", i, qtext);
        cr_assert_eq(json_object_get(e, "name") != NULL, want[i].name != NULL, "entry %zu: %s", i, qtext);
        if (want[i].name)
            cr_assert_str_eq(json_string_value(json_object_get(e, "name")), want[i].name);
    }
    free(qtext);
    json_decref(q);
    cr_assert_not_null(strstr(sl_dstate_job_held_back(st2, b), "splits record"));

    /* A named job held back is not made again under its name. */
    sluice_GetOrCreateJobRequest req = {.dataset_id = ds, .sharding = SL_SHARDING_DYNAMIC, .job_name = "b"};
    uint64_t jid, cid;
    cr_assert_eq(sl_dstate_job_get_or_create(st2, &req, 1000, &jid, &cid, err, sizeof err), SL_ECONFLICT);
    cr_assert(strstr(err, "job \"b\" repetition 0") && strstr(err, "is held back, its state store record damaged"),
              "%s", err);
    /* Its clients are told why their job cannot go on. */
    sluice_ClientHeartbeatRequest hb = {.job_id = a, .client_id = ca};
    sl_dstate_client_secret(st, a, ca, hb.client_secret);
    sluice_ClientHeartbeatResponse *hr = calloc(1, sizeof *hr);
    cr_assert_eq(sl_dstate_client_heartbeat(st2, &hb, 1000, hr, err, sizeof err), SL_EDATA);
    /* What the record held is not told to a peer that cannot show the secret. */
    cr_assert(strstr(err, "is held back since the dispatcher started") && !strstr(err, "Expected"), "%s", err);
    /* The job served goes on where it was. */
    hb = (sluice_ClientHeartbeatRequest){.job_id = c, .client_id = cc};
    sl_dstate_client_secret(st, c, cc, hb.client_secret);
    cr_assert_eq(sl_dstate_client_heartbeat(st2, &hb, 1000, hr, err, sizeof err), 0, "%s", err);
    free(hr);
    splits(st2, first_task(st2, c), 2, &r2, 0);
    cr_assert_eq(r2.splits[0].begin, r.splits[r.splits_count - 1].end);
    /* A new job's id is none held back; a commit leaves what is held back
     * as it was. */
    job(st2, ds, "e", &jid, &cid);
    cr_assert_gt(jid, d);
    cr_assert_gt(jid, ds2);
    save(st2);
    for (size_t i = 0; i < nheld; i++) {
        char *now = records_of(held[i].table, held[i].id);
        cr_assert_str_eq(now, before[i], "record %zu changed", i);
        free(now);
        free(before[i]);
    }
    /* A reload (after a failed commit) holds back the same. */
    cr_assert_eq(sl_dpersist_reload(st2, store, 2000, err, sizeof err), 0, "%s", err);
    json_t *again = sl_dstate_quarantine_json(st2);
    cr_assert_eq(json_array_size(json_object_get(again, "held_back")), 4);
    json_decref(again);

    /* An operator forgets job b and dataset ds2: their records go (not
     * b's tasks' last hand-outs, which no load reads), b's name may be
     * joined again as a new job, and d stays held back. */
    cr_assert_eq(sl_dstate_forget_held_back(st2, "job", c, err, sizeof err), SL_ENOTFOUND, "c is not held back");
    cr_assert_eq(sl_dstate_forget_held_back(st2, "job", b, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_dstate_forget_held_back(st2, "dataset", ds2, err, sizeof err), 0, "%s", err);
    save(st2);
    for (size_t i = 0; i < nheld; i++) {
        char *now = records_of(held[i].table, held[i].id);
        bool gone = held[i].id == ds2 || (held[i].id == b && held[i].table != SL_DT_HANDOUTS);
        cr_assert_eq(now[0] == 0, gone, "record %zu: %s", i, now);
        free(now);
    }
    cr_assert_eq(sl_dpersist_reload(st2, store, 3000, err, sizeof err), 0, "%s", err);
    cr_assert_null(sl_dstate_job_held_back(st2, b));
    cr_assert_not_null(strstr(sl_dstate_job_held_back(st2, d), "its dataset is not in the store"));
    cr_assert_not_null(sl_dstate_job_held_back(st2, a));
    cr_assert_eq(sl_dstate_job_get_or_create(st2, &req, 3000, &jid, &cid, err, sizeof err), 0, "%s", err);
    cr_assert_gt(jid, b, "a new job");
}

/* A damaged worker record holds back the worker: the others are served,
 * its address registers again under a new id, and forgetting it deletes
 * the record. */
Test(persist, a_damaged_worker_record_holds_back_the_worker_until_forgotten)
{
    open_store(0);
    st = new_state();
    uint64_t w1 = worker(st, "127.0.0.1:1"), w2 = worker(st, "127.0.0.1:2");
    save(st);
    put_raw(SL_DT_WORKERS, w1, "[]", 2);
    st2 = reopen();
    sl_dstate_stats_t stats;
    sl_dstate_stats(st2, &stats);
    cr_assert_eq(stats.held_back, 1);
    json_t *ws = sl_dstate_workers_json(st2, 1000);
    cr_assert_eq(json_array_size(ws), 1);
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(ws, 0), "id")), (json_int_t)w2);
    json_decref(ws);
    uint64_t again = worker(st2, "127.0.0.1:1");
    cr_assert_gt(again, w2, "a new id, none held back");
    cr_assert_eq(sl_dstate_forget_held_back(st2, "worker", w1, err, sizeof err), 0, "%s", err);
    save(st2);
    char *left = records_of(SL_DT_WORKERS, w1);
    cr_assert_str_eq(left, "", "the record is deleted");
    free(left);
    cr_assert_eq(sl_dpersist_reload(st2, store, 2000, err, sizeof err), 0, "%s", err);
    sl_dstate_stats(st2, &stats);
    cr_assert_eq(stats.held_back, 0);
}

/* Replaces the stored record of id in table with what edit makes of it. */
static void edit_record(int table, uint64_t id, void (*edit)(json_t *rec))
{
    json_t *rec = NULL;
    struct job_record_of want = {id, &rec};
    cr_assert_eq(sl_store_foreach(store, table, job_record_of, &want), 1, "record %" PRIu64 " not found", id);
    edit(rec);
    char *text = json_dumps(rec, JSON_COMPACT);
    json_decref(rec);
    put_raw(table, id, text, strlen(text));
    free(text);
}

static void bad_second_task(json_t *rec)
{
    json_array_set_new(json_object_get(rec, "tasks"), 1, json_pack("{s:s}", "id", "x"));
}

static void bad_second_file(json_t *rec)
{
    json_object_set_new(rec, "files", json_pack("[[s,i],i]", "/data/part-0", 3, 5));
}

/* A record damaged past its start (a job's second task, a dataset's second
 * file), read in part before the damage shows, holds back the whole of what
 * it is of, and nothing of that stays in memory (under ASan: nothing leaks,
 * nothing is freed twice). */
Test(persist, records_damaged_past_their_start_hold_back_the_whole)
{
    open_store(0);
    st = new_state();
    worker(st, "127.0.0.1:1");
    worker(st, "127.0.0.1:2");
    uint64_t ds = dataset(st, "{\"source\": {\"type\": \"range\", \"stop\": 1000}}");
    uint64_t ds2 = dataset(st, "{\"source\": {\"type\": \"range\", \"stop\": 2000}}");
    uint64_t j, c, j2, c2, j3, c3;
    job(st, ds, "p", &j, &c);
    job(st, ds2, "q", &j2, &c2);
    job(st, ds, "r", &j3, &c3);
    save(st);
    edit_record(SL_DT_JOBS, j, bad_second_task);
    edit_record(SL_DT_DATASETS, ds2, bad_second_file);
    st2 = reopen();
    sl_dstate_stats_t stats;
    sl_dstate_stats(st2, &stats);
    cr_assert_eq(stats.held_back, 3, "job p, dataset q's, and job q");
    cr_assert_eq(stats.jobs_total, 1);
    cr_assert_eq(stats.datasets, 1);
    cr_assert_not_null(strstr(sl_dstate_job_held_back(st2, j), "tasks: a task with missing or out-of-range fields"));
    cr_assert_not_null(strstr(sl_dstate_job_held_back(st2, j2), "its dataset is held back"));
    cr_assert_null(sl_dstate_job_held_back(st2, j3));
    cr_assert_null(sl_dstate_dataset_spec(st2, ds2));
    /* Its tasks' ids are no one's now: a worker's request for one is answered as unknown. */
    sluice_GetSplitResponse r;
    splits(st2, first_task(st, j), 1, &r, SL_ENOTFOUND);
}

/* More damaged records than a start holds back, or a field or form a
 * newer dispatcher wrote: the start is refused, by name (a record stored
 * under a bound this start lowered: the restored job's test above). */
Test(persist, a_store_beyond_what_a_start_holds_back_is_refused)
{
    uint64_t task = one_task("{\"source\": {\"type\": \"range\", \"stop\": 100000}}");
    struct job *jp = NULL;
    cr_assert_not_null(sl__dstate_task(st, task, &jp));
    uint64_t j = jp->id;
    sluice_GetSplitResponse r;
    splits(st, first_task(st, j), 1, &r, 0);
    save(st);

    /* An outstanding record of a form this dispatcher does not know. */
    uint8_t okey[16], oval[48] = {0};
    put_be64(okey, j);
    put_be64(okey + 8, r.splits[0].split_id);
    sl_put_le32(oval + 44, 2);
    sl_store_txn_t *t;
    cr_assert_eq(sl_store_begin(store, &t), 0);
    cr_assert_eq(sl_store_put(t, SL_DT_OUTSTANDING, okey, sizeof okey, oval, sizeof oval), 0);
    cr_assert_eq(sl_store_commit(t, err, sizeof err), 0, "%s", err);
    st2 = new_state();
    cr_assert_eq(sl_dpersist_load(st2, store, 0, err, sizeof err), SL_EVERSION);
    cr_assert(strstr(err, "form 2, which this dispatcher does not know"), "%s", err);
    sl_dstate_free(st2);
    st2 = NULL;
    cr_assert_eq(sl_store_begin(store, &t), 0);
    cr_assert_eq(sl_store_del(t, SL_DT_OUTSTANDING, okey, sizeof okey), 0);
    cr_assert_eq(sl_store_commit(t, err, sizeof err), 0, "%s", err);

    /* A job record with a field this dispatcher does not know. */
    json_t *rec = NULL;
    struct job_record_of want = {j, &rec};
    cr_assert_eq(sl_store_foreach(store, SL_DT_JOBS, job_record_of, &want), 1);
    char *good = json_dumps(rec, JSON_COMPACT);
    json_object_set_new(rec, "later", json_true());
    char *later = json_dumps(rec, JSON_COMPACT);
    json_decref(rec);
    put_raw(SL_DT_JOBS, j, later, strlen(later));
    st2 = new_state();
    cr_assert_eq(sl_dpersist_load(st2, store, 0, err, sizeof err), SL_EVERSION);
    cr_assert(strstr(err, "left unpacked: later: a field this dispatcher does not know"), "%s", err);
    sl_dstate_free(st2);
    st2 = NULL;
    put_raw(SL_DT_JOBS, j, good, strlen(good));
    free(good);
    free(later);

    /* More damaged records than a start holds back. */
    cr_assert_eq(sl_store_begin(store, &t), 0);
    for (uint64_t i = 0; i <= SL_QUARANTINE_MAX; i++) {
        uint8_t key[8];
        put_be64(key, j + 1000 + i);
        cr_assert_eq(sl_store_put(t, SL_DT_JOBS, key, sizeof key, "{}", 2), 0);
    }
    cr_assert_eq(sl_store_commit(t, err, sizeof err), 0, "%s", err);
    st2 = new_state();
    cr_assert_eq(sl_dpersist_load(st2, store, 0, err, sizeof err), SL_EDATA);
    cr_assert(strstr(err, "and 1024 damaged records before it, the most a start holds back"), "%s", err);
    sl_dstate_free(st2);
    st2 = NULL;

    /* One fewer: each is held back, the job is served. */
    uint8_t key[8];
    put_be64(key, j + 1000);
    cr_assert_eq(sl_store_begin(store, &t), 0);
    cr_assert_eq(sl_store_del(t, SL_DT_JOBS, key, sizeof key), 0);
    cr_assert_eq(sl_store_commit(t, err, sizeof err), 0, "%s", err);
    st2 = reopen();
    sl_dstate_stats_t stats;
    sl_dstate_stats(st2, &stats);
    cr_assert_eq(stats.held_back, SL_QUARANTINE_MAX);
    cr_assert_eq(stats.jobs_total, 1);
}

Test(persist, a_restored_jobs_splits_hold_a_splits_worth_of_records_not_consumed)
{
    /* A checkpoint whose place lags what its ranks read: past it they had
     * all but every 20th record of [0, 150000). Splits of 100 records of
     * range would deliver 5 each, and a shuffle buffer would span hundreds
     * of them; each split grows (up to 64 times) to hold 100 records not
     * consumed, and together they hand out every such record once. */
    open_store(0);
    st = new_state();
    worker(st, "127.0.0.1:1");
    uint64_t ds = dataset(st, "{\"source\": {\"type\": \"range\", \"stop\": 200000}}");
    sl_posset_t had;
    sl_posset_init(&had, 10000);
    for (uint64_t at = 0; at < 150000; at += 20)
        cr_assert_eq(sl_posset_add(&had, 0, 0, at + 1, 19, NULL), 0);
    size_t n = sl_posset_encode(&had, NULL, 0);
    uint8_t *bytes = malloc(n);
    sl_posset_encode(&had, bytes, n);
    sluice_GetOrCreateJobRequest req = {.dataset_id = ds, .sharding = SL_SHARDING_DYNAMIC};
    sluice_GetOrCreateJobResponse jr = sluice_GetOrCreateJobResponse_init_zero;
    cr_assert_eq(sl_dstate_job_join(st, &req, "", bytes, n, 0, &jr, err, sizeof err), 0, "%s", err);
    free(bytes);
    uint64_t task = first_task(st, jr.job_id), next = 0, handed = 0, seq = 1;
    for (int answers = 0; answers < 1000 && next < 200000; answers++) {
        sluice_GetSplitResponse r;
        splits_of(st, task, seq++, 8, &r, 0);
        if (r.splits_count == 0)
            break;
        for (pb_size_t i = 0; i < r.splits_count; i++) {
            const sluice_Split *sp = &r.splits[i];
            cr_assert_eq(sp->begin, next, "splits follow each other");
            uint64_t left = (sp->end - sp->begin) - sl_posset_count(&had, 0, 0, sp->begin, sp->end);
            if (sp->end < 150000)
                cr_assert_eq(left, 100, "split [%" PRIu64 ", %" PRIu64 ") holds %" PRIu64 " records not consumed",
                             sp->begin, sp->end, left);
            cr_assert_leq(sp->end - sp->begin, 64 * 100);
            handed += left;
            next = sp->end;
        }
    }
    cr_assert_eq(next, 200000);
    cr_assert_eq(handed, 150000 / 20 + 50000, "every record not consumed, once");
    sl_posset_clear(&had);
}

static sl_dstate_t *state_bounded(unsigned max_exclude_runs)
{
    sl_dstate_config_t cfg;
    sl_dstate_config_init(&cfg);
    cfg.split_size = 100;
    cfg.max_exclude_runs = max_exclude_runs;
    sl_dstate_t *s = sl_dstate_new(&cfg);
    cr_assert_not_null(s);
    return s;
}

Test(persist, a_checkpoint_of_many_shuffled_workers_restores_as_bitmaps_also_after_a_restart)
{
    /* Seeded, at user sizes: W workers (8 to 64) behind shuffle(B) (B from
     * 10,000 to 100,000) left about W x B records in their buffers, the
     * holes of a checkpoint of 2,000,000 records: one run of consumed
     * records between two holes, W x B / 2 runs, more than the
     * dispatcher's --max-exclude-runs of 50,000. As runs it refused the
     * restore; as bitmaps where the runs crowd it holds a few thousand
     * units. Restored from version 2 bytes (a client of before version 3)
     * or version 3, stored, and loaded by a restarted dispatcher, whose
     * splits hand out every record not consumed once and no other. */
    uint64_t rng = test_seed("persist::a_checkpoint_of_many_shuffled_workers_restores_as_bitmaps_also_after_a_restart");
    enum { N = 2000000, BOUND = 50000 };
    uint64_t workers = 8 + splitmix64(&rng) % 57, buffer = 10000 + splitmix64(&rng) % 90001;
    uint64_t read = N * 3 / 4, held = workers * buffer > read / 2 ? read / 2 : workers * buffer;
    bool v3 = splitmix64(&rng) % 2;
    cr_log_info("%" PRIu64 " workers, shuffle(%" PRIu64 "), %" PRIu64 " records in their buffers, version %d",
                workers, buffer, held, v3 ? 3 : 2);
    /* Record i of [0, read) is still in a buffer with odds held / read
     * times e^(-(read - i) / held) over its mean: recent records mostly,
     * and a tail far back. */
    uint8_t *consumed = calloc(N, 1);
    cr_assert_not_null(consumed);
    sl_posbits_t had;
    sl_posbits_init(&had, SL_POSSET_MAX_RUNS);
    uint64_t holes = 0;
    for (uint64_t i = 0; i < read; i++) {
        double p = exp(-(double)(read - i) / (double)held);
        if ((double)(splitmix64(&rng) >> 11) / 9007199254740992.0 < p) {
            holes++;
            continue;
        }
        consumed[i] = 1;
        sl_posrun_t r = {0, 0, i, 1};
        cr_assert_eq(sl_posbits_add_many(&had, &r, 1), 0);
    }
    size_t runs = had.runs.num;
    for (size_t k = 0; k < had.nblocks; k++)
        runs += sl_posbits_block_runs(&had.blocks[k]);
    cr_assert_gt(runs, BOUND, "%zu runs: more than the bound, or the test shows nothing", runs);
    uint8_t *bytes = NULL;
    size_t n = 0;
    /* Version 2 as a client sends it where its runs fit its bound. */
    cr_assert_eq(v3 ? sl_posbits_encode(&had, SL_POSBITS_WIRE_RUNS, &bytes, &n) : sl_posbits_bytes(&had, &bytes, &n),
                 0);
    cr_assert_eq(bytes[4], v3 ? 3 : 2);
    open_store(0);
    st = state_bounded(BOUND);
    worker(st, "127.0.0.1:1");
    uint64_t ds = dataset(st, "{\"source\": {\"type\": \"range\", \"stop\": 2000000}}");
    sluice_GetOrCreateJobRequest req = {.dataset_id = ds, .sharding = SL_SHARDING_DYNAMIC};
    sluice_GetOrCreateJobResponse jr = sluice_GetOrCreateJobResponse_init_zero;
    cr_assert_eq(sl_dstate_job_join(st, &req, "", bytes, n, 0, &jr, err, sizeof err), 0, "%s", err);
    free(bytes);
    sl_dstate_stats_t stats;
    sl_dstate_stats(st, &stats);
    cr_assert_lt(stats.exclude_runs, BOUND / 2, "%" PRIu64 " units held", stats.exclude_runs);
    uint64_t task = first_task(st, jr.job_id);
    save(st);
    /* A restart: the store holds the positions as version 3. */
    st2 = state_bounded(BOUND);
    cr_assert_eq(sl_dpersist_load(st2, store, 1000, err, sizeof err), 0, "%s", err);
    uint8_t *given = calloc(N, 1);
    cr_assert_not_null(given);
    uint64_t next = 0, handed = 0, seq = 1;
    for (int answers = 0; answers < 100000 && next < N; answers++) {
        sluice_GetSplitResponse r;
        splits_of(st2, task, seq++, 64, &r, 0);
        if (r.splits_count == 0)
            break;
        size_t len;
        const uint8_t *skips = sl_dstate_split_skips(st2, task, &len);
        for (pb_size_t i = 0; i < r.splits_count; i++) {
            const sluice_Split *sp = &r.splits[i];
            cr_assert_geq(sp->begin, next, "splits follow each other");
            uint64_t at = sp->begin;
            for (uint32_t k = 0; k <= sp->skip_count; k++) {
                uint64_t b = k < sp->skip_count ? sl_get_le64(skips + sp->skip_offset + 16 * k) : sp->end;
                uint64_t c = k < sp->skip_count ? sl_get_le64(skips + sp->skip_offset + 16 * k + 8) : 0;
                cr_assert(b >= at && b + c <= sp->end, "skip %u of split [%" PRIu64 ", %" PRIu64 ")", k, sp->begin,
                          sp->end);
                for (uint64_t x = at; x < b; x++) {
                    cr_assert_not(given[x]++, "record %" PRIu64 " handed out twice", x);
                    handed++;
                }
                for (uint64_t x = b; x < b + c; x++)
                    cr_assert(consumed[x], "record %" PRIu64 " skipped but not consumed", x);
                at = b + c;
            }
            next = sp->end;
        }
    }
    cr_assert_eq(next, N);
    for (uint64_t x = 0; x < N; x++)
        cr_assert_eq(given[x], !consumed[x], "record %" PRIu64 ": handed out %d times, consumed %d", x, given[x],
                     consumed[x]);
    cr_assert_eq(handed, N - (read - holes));
    sl_posbits_clear(&had);
    free(consumed);
    free(given);
}

Test(persist, a_restored_job_skips_what_its_checkpoint_holds_also_after_a_restart)
{
    open_store(0);
    st = new_state();
    worker(st, "127.0.0.1:1");
    uint64_t ds = dataset(st, "{\"source\": {\"type\": \"range\", \"stop\": 1000}}");
    /* The consumer had records [0, 100) (the first split, whole) and [150, 160). */
    sl_posset_t had;
    sl_posset_init(&had, 16);
    cr_assert_eq(sl_posset_add(&had, 0, 0, 0, 100, NULL), 0);
    cr_assert_eq(sl_posset_add(&had, 0, 0, 150, 10, NULL), 0);
    uint8_t bytes[256];
    size_t n = sl_posset_encode(&had, bytes, sizeof bytes);
    sl_posset_clear(&had);
    sluice_GetOrCreateJobRequest req = {.dataset_id = ds, .sharding = SL_SHARDING_DYNAMIC};
    sluice_GetOrCreateJobResponse jr = sluice_GetOrCreateJobResponse_init_zero;
    cr_assert_eq(sl_dstate_job_join(st, &req, "", bytes, n, 0, &jr, err, sizeof err), 0, "%s", err);
    uint64_t task = first_task(st, jr.job_id);
    sluice_GetSplitResponse r;
    splits(st, task, 1, &r, 0);
    cr_assert_eq(r.splits_count, 3);
    cr_assert_eq(r.splits[0].begin, 100, "the split the consumer had whole is not handed out");
    cr_assert_eq(r.splits[0].skip_count, 1);
    cr_assert_eq(r.splits[1].skip_count, 0);
    size_t len;
    const uint8_t *skips = sl_dstate_split_skips(st, task, &len);
    cr_assert_eq(len, 16);
    cr_assert_eq(sl_get_le64(skips + r.splits[0].skip_offset), 150);
    cr_assert_eq(sl_get_le64(skips + r.splits[0].skip_offset + 8), 10);
    save(st);
    /* After a restart: the same answer again, and the exclusions still apply. */
    st2 = reopen();
    sluice_GetSplitResponse again;
    splits(st2, task, 1, &again, 0);
    cr_assert_eq(again.splits[0].begin, 100);
    skips = sl_dstate_split_skips(st2, task, &len);
    cr_assert_eq(len, 16);
    cr_assert_eq(sl_get_le64(skips), 150);
    /* A start with a lower --max-exclude-runs than the job's exclusions
     * hold refuses the store and names the option. */
    sl_dstate_config_t low;
    sl_dstate_config_init(&low);
    low.split_size = 100;
    low.max_exclude_runs = 1;
    sl_dstate_t *st3 = sl_dstate_new(&low);
    cr_assert_not_null(st3);
    cr_assert_eq(sl_dpersist_load(st3, store, 1000, err, sizeof err), SL_ELIMIT);
    cr_assert(strstr(err, "position set of 2 runs, more than the limit 1 (in units: a run 1, 22 a bitmap of 4096 "
                          "positions where runs crowd) (--max-exclude-runs 1: start with the value it was stored "
                          "under)"),
              "%s", err);
    sl_dstate_free(st3);
    /* Named jobs under a static policy, coordinated reads and damaged
     * bytes are refused. */
    snprintf(req.job_name, sizeof req.job_name, "named");
    req.sharding = SL_SHARDING_FILE;
    cr_assert_eq(sl_dstate_job_join(st2, &req, "", bytes, n, 0, &jr, err, sizeof err), SL_EINVAL);
    req.sharding = SL_SHARDING_DYNAMIC;
    req.num_consumers = 2;
    cr_assert_eq(sl_dstate_job_join(st2, &req, "", bytes, n, 0, &jr, err, sizeof err), SL_EINVAL);
    req.num_consumers = 0;
    req.job_name[0] = '\0';
    bytes[0] = 'X';
    cr_assert_eq(sl_dstate_job_join(st2, &req, "", bytes, n, 0, &jr, err, sizeof err), SL_EDATA);
    cr_assert(strstr(err, "checkpoint"), "%s", err);
}

/* The ranks of a named job restore one merged checkpoint: the first makes
 * the job, the others join it; after a restart a rank with the same bytes
 * still joins it, and one with other bytes, or none, is refused. */
Test(persist, a_named_job_made_by_a_restore_takes_only_ranks_of_the_same_checkpoint)
{
    open_store(0);
    st = new_state();
    worker(st, "127.0.0.1:1");
    uint64_t ds = dataset(st, "{\"source\": {\"type\": \"range\", \"stop\": 1000}}");
    sl_posset_t had;
    sl_posset_init(&had, 16);
    cr_assert_eq(sl_posset_add(&had, 0, 0, 0, 100, NULL), 0);
    uint8_t bytes[256], other[256];
    size_t n = sl_posset_encode(&had, bytes, sizeof bytes);
    cr_assert_eq(sl_posset_add(&had, 0, 0, 300, 10, NULL), 0);
    size_t n_other = sl_posset_encode(&had, other, sizeof other);
    sl_posset_clear(&had);
    sluice_GetOrCreateJobRequest req = {.dataset_id = ds, .sharding = SL_SHARDING_DYNAMIC};
    snprintf(req.job_name, sizeof req.job_name, "train");
    sluice_GetOrCreateJobResponse a = sluice_GetOrCreateJobResponse_init_zero, b = a, c = a;
    cr_assert_eq(sl_dstate_job_join(st, &req, "", bytes, n, 0, &a, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_dstate_job_join(st, &req, "", bytes, n, 0, &b, err, sizeof err), 0, "%s", err);
    cr_assert_eq(b.job_id, a.job_id);
    cr_assert_neq(b.client_id, a.client_id);
    save(st);
    st2 = reopen();
    cr_assert_eq(sl_dstate_job_join(st2, &req, "", bytes, n, 0, &c, err, sizeof err), 0, "%s", err);
    cr_assert_eq(c.job_id, a.job_id);
    cr_assert_eq(sl_dstate_job_join(st2, &req, "", other, n_other, 0, &c, err, sizeof err), SL_ECONFLICT);
    cr_assert(strstr(err, "restored from another checkpoint"), "%s", err);
    /* The same positions with other done epochs are another checkpoint. */
    req.restore_epochs_done = 1;
    cr_assert_eq(sl_dstate_job_join(st2, &req, "", bytes, n, 0, &c, err, sizeof err), SL_ECONFLICT);
    req.restore_epochs_done = 0;
    cr_assert_eq(sl_dstate_job_join(st2, &req, "", NULL, 0, 0, &c, err, sizeof err), SL_ECONFLICT);
    cr_assert(strstr(err, "was restored from a checkpoint"), "%s", err);
    /* A named job made by a plain join takes no restore. */
    snprintf(req.job_name, sizeof req.job_name, "plain");
    cr_assert_eq(sl_dstate_job_join(st2, &req, "", NULL, 0, 0, &c, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_dstate_job_join(st2, &req, "", bytes, n, 0, &c, err, sizeof err), SL_ECONFLICT);
    cr_assert(strstr(err, "not restored from a checkpoint"), "%s", err);
}

/* The dispatcher's secret (caps.h) is written at the first commit and kept:
 * the client secrets and task keys it handed out hold after a restart, and
 * a store that has one never takes another. */
Test(persist, the_secret_survives_a_restart)
{
    open_store(0);
    st = new_state();
    cr_assert(sl_dpersist_dirty(st), "a new secret waits for its first commit");
    uint8_t key[16], key2[16], fresh[16], sec[16], sec2[16];
    sl_dstate_task_key(st, 42, key);
    sl_dstate_client_secret(st, 7, 8, sec);
    save(st);

    st2 = reopen(); /* a state of its own random secret, replaced by the store's */
    sl_dstate_task_key(st2, 42, key2);
    sl_dstate_client_secret(st2, 7, 8, sec2);
    cr_assert_arr_eq(key, key2, 16);
    cr_assert_arr_eq(sec, sec2, 16);
    cr_assert_not(sl_dpersist_dirty(st2), "the store's secret is not written again");

    /* A state never loaded has another secret. */
    sl_dstate_t *other = new_state();
    sl_dstate_task_key(other, 42, fresh);
    cr_assert_arr_neq(key, fresh, 16);
    sl_dstate_free(other);
}

/* 10,000 jobs on two workers: every job and task is found by id, before and
 * after a restart; a hand-out lists one job for its commit, not all of
 * them; and what each commit wrote loads back the same. */
Test(persist, ten_thousand_jobs_are_indexed_and_a_commit_lists_only_what_changed)
{
    enum { JOBS = 10000 };
    open_store(0);
    sl_dstate_config_t cfg;
    sl_dstate_config_init(&cfg);
    cfg.split_size = 100;
    cfg.max_jobs = JOBS;
    st = sl_dstate_new(&cfg);
    cr_assert_not_null(st);
    worker(st, "127.0.0.1:1");
    worker(st, "127.0.0.1:2");
    uint64_t ds = dataset(st, "{\"source\": {\"type\": \"range\", \"stop\": 100000}}");
    static uint64_t jobs[JOBS];
    for (unsigned i = 0; i < JOBS; i++) {
        uint64_t cid;
        job(st, ds, "", &jobs[i], &cid);
        if (i % 1000 == 999)
            save(st); /* a commit writes the jobs made since the last one */
    }
    save(st);
    cr_assert_eq(st->num_jobs, JOBS);
    /* Every job and each of its tasks are found by id. */
    for (unsigned i = 0; i < JOBS; i++) {
        struct job *j = sl__dstate_job(st, jobs[i]);
        cr_assert(j && j->id == jobs[i] && j->num_tasks == 2);
        for (unsigned k = 0; k < j->num_tasks; k++) {
            struct job *tj = NULL;
            struct task *t = sl__dstate_task(st, j->tasks[k].id, &tj);
            cr_assert(t == &j->tasks[k] && tj == j);
        }
        cr_assert_null(sl__dstate_task(st, jobs[i], &(struct job *){NULL}), "a job id is no task id");
    }
    /* A hand-out of job 5000's lists that job alone. */
    uint64_t task = sl__dstate_job(st, jobs[5000])->tasks[0].id;
    sluice_GetSplitResponse r;
    splits(st, task, 1, &r, 0);
    cr_assert_eq(r.splits_count, 3);
    cr_assert_eq(st->num_dirty_jobs, 1);
    cr_assert_eq(st->dirty_jobs[0]->id, jobs[5000]);
    save(st);
    cr_assert_eq(st->num_dirty_jobs, 0);
    /* Cancelled jobs make room for new ones: the oldest ended is dropped,
     * out of the index and out of the dirty list. */
    cr_assert_eq(sl_dstate_job_cancel(st, jobs[1], "test", err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_dstate_job_cancel(st, jobs[2], "test", err, sizeof err), 0, "%s", err);
    uint64_t extra, cid;
    job(st, ds, "", &extra, &cid); /* drops job 1, listed and not yet committed */
    cr_assert_null(sl__dstate_job(st, jobs[1]));
    cr_assert_not_null(sl__dstate_job(st, jobs[2]));
    cr_assert_not_null(sl__dstate_job(st, extra));
    cr_assert_eq(st->num_dirty_jobs, 2, "job 2 (cancelled) and the new job");
    save(st);

    st2 = reopen();
    char *a = views(st), *b = views(st2);
    assert_same_views(a, b, "before and after the load");
    free(a);
    free(b);
    struct job *tj = NULL;
    cr_assert_not_null(sl__dstate_task(st2, task, &tj));
    cr_assert_eq(tj->id, jobs[5000]);
    cr_assert_eq(st2->num_dirty_jobs, 0, "a load lists nothing");
    /* The restarted state answers the same request the same way. */
    sluice_GetSplitResponse again;
    splits(st2, task, 1, &again, 0);
    cr_assert_eq(again.splits[0].begin, r.splits[0].begin);
    cr_assert_not(sl_dpersist_dirty(st2));
}

/* Coordinated reads: joins consumer i of n of the infinite job "sync" of s. */
/* st on a new store with cfg, its workers and jobs kept for the test's
 * length, one worker: @return an infinite dataset for coordinated reads */
static uint64_t coordinated_state(sl_dstate_config_t *cfg)
{
    cfg->worker_timeout_ms = 1000000;
    cfg->job_gc_timeout_ms = 1000000;
    open_store(0);
    cr_assert_not_null(st = sl_dstate_new(cfg));
    worker(st, "127.0.0.1:1");
    return dataset(st, "{\"source\": {\"type\": \"range\", \"stop\": 10}, \"ops\": [{\"op\": \"repeat\"}]}");
}

static void coord_join(sl_dstate_t *s, uint64_t ds, uint32_t i, int64_t now, sluice_GetOrCreateJobResponse *resp)
{
    sluice_GetOrCreateJobRequest req = {.dataset_id = ds, .num_consumers = 2, .consumer_index = i};
    snprintf(req.job_name, sizeof req.job_name, "sync");
    memset(resp, 0, sizeof *resp);
    cr_assert_eq(sl_dstate_job_join(s, &req, "", NULL, 0, now, resp, err, sizeof err), 0, "%s", err);
}

static void coord_hb(sl_dstate_t *s, const sluice_GetOrCreateJobResponse *r, uint64_t round, int64_t now)
{
    sluice_ClientHeartbeatRequest hb = {.job_id = r->job_id, .client_id = r->client_id, .round = round};
    memcpy(hb.client_secret, r->client_secret, sizeof hb.client_secret);
    sluice_ClientHeartbeatResponse *hr = calloc(1, sizeof *hr);
    cr_assert_eq(sl_dstate_client_heartbeat(s, &hb, now, hr, err, sizeof err), 0, "%s", err);
    free(hr);
}

/* Consumers restarted together hand out rounds from where the first of
 * them started, also when the dispatcher restarts between them: where a
 * new consumer started, and that the others align with it, is stored. */
Test(persist, where_a_restarted_consumer_started_survives_a_restart)
{
    sl_dstate_config_t cfg;
    sl_dstate_config_init(&cfg);
    cfg.client_timeout_ms = 200;
    cfg.client_rejoin_ms = 1000000;
    uint64_t ds = coordinated_state(&cfg);
    sluice_GetOrCreateJobResponse p0, p1, n1, n0;
    coord_join(st, ds, 0, 0, &p0);
    coord_join(st, ds, 1, 0, &p1);
    coord_hb(st, &p0, 100, 0);
    coord_hb(st, &p1, 131, 0);
    sl_dstate_tick(st, 201); /* both away */
    coord_join(st, ds, 1, 202, &n1);
    cr_assert_eq(n1.deliver_from, 131);
    save(st);

    cr_assert_not_null(st2 = sl_dstate_new(&cfg));
    cr_assert_eq(sl_dpersist_load(st2, store, 1000, err, sizeof err), 0, "%s", err);
    coord_hb(st2, &n1, 180, 1100); /* the new consumer 1 reads on */
    sl_dstate_tick(st2, 1201);      /* consumer 0's predecessor is away again */
    coord_join(st2, ds, 0, 1202, &n0);
    cr_assert_eq(n0.first_round, 100);
    cr_assert_eq(n0.deliver_from, 131, "where consumer 1 started, not where it is");
}

/* Finds the stored record of job id (8 big-endian bytes) and parses it. */

/* A consumer that closed its iterator (gone: released at once) is
 * remembered with its round across a restart of the dispatcher: the next
 * client of its index starts there, not at round 0. */
Test(persist, a_gone_consumers_round_survives_a_restart)
{
    sl_dstate_config_t cfg;
    sl_dstate_config_init(&cfg);
    uint64_t ds = coordinated_state(&cfg);
    sluice_GetOrCreateJobResponse p0, p1, n0;
    coord_join(st, ds, 0, 0, &p0);
    coord_join(st, ds, 1, 0, &p1);
    coord_hb(st, &p0, 300, 0);
    coord_hb(st, &p1, 310, 0);
    sluice_ReleaseClientRequest rel = {.job_id = p0.job_id, .client_id = p0.client_id};
    memcpy(rel.client_secret, p0.client_secret, sizeof rel.client_secret);
    cr_assert_eq(sl_dstate_client_release(st, &rel, 1, err, sizeof err), 0, "%s", err);
    save(st);

    cr_assert_not_null(st2 = sl_dstate_new(&cfg));
    cr_assert_eq(sl_dpersist_load(st2, store, 1000, err, sizeof err), 0, "%s", err);
    coord_join(st2, ds, 0, 1001, &n0);
    cr_assert_eq(n0.job_id, p0.job_id);
    cr_assert_eq(n0.first_round, 300, "where its predecessor left, not round 0");
    cr_assert_eq(n0.deliver_from, 310);

    /* A stored gone consumer of an index the job does not have holds the
     * job back, naming the record and the field. */
    json_t *rec = NULL;
    struct job_record_of want = {p0.job_id, &rec};
    cr_assert_eq(sl_store_foreach(store, 1 /* jobs */, job_record_of, &want), 1, "the job's record was not found");
    json_object_set_new(rec, "gone", json_pack("[[i,i]]", 5, 1));
    char *text = json_dumps(rec, JSON_COMPACT);
    json_decref(rec);
    sl_store_txn_t *t;
    cr_assert_eq(sl_store_begin(store, &t), 0);
    uint8_t key[8];
    for (int i = 0; i < 8; i++)
        key[i] = (uint8_t)(p0.job_id >> (56 - 8 * i));
    cr_assert_eq(sl_store_put(t, 1 /* jobs */, key, sizeof key, text, strlen(text)), 0);
    cr_assert_eq(sl_store_commit(t, err, sizeof err), 0, "%s", err);
    free(text);
    sl_dstate_free(st2);
    cr_assert_not_null(st2 = sl_dstate_new(&cfg));
    cr_assert_eq(sl_dpersist_load(st2, store, 2000, err, sizeof err), 0, "%s", err);
    const char *why = sl_dstate_job_held_back(st2, p0.job_id);
    cr_assert(why && strstr(why, "gone: a consumer with missing or out-of-range fields"), "%s", why ? why : "");
}

/* ---- any store the dispatcher writes loads, at drawn operations ----
 *
 * Drawn operations on the dispatcher's state, as its clients, workers and
 * operators make them (workers registering again, heartbeats with tasks
 * done, losses, drains; datasets that end or not; jobs OFF or DYNAMIC,
 * named or not, coordinated; clients' heartbeats and releases; split
 * requests; cancels; the clock moving past leases and gc timeouts), the
 * state saved after each and loaded into a new one at drawn moments: the
 * load must take what was saved, show the same views, and go on from
 * there. A record its own save wrote that its load refuses stops a
 * restarted dispatcher for good. */

struct rt {
    uint64_t rng;
    uint64_t datasets[8], jobs[32], clients[32], tasks[64], task_job[64];
    unsigned ndatasets, njobs, ntasks;
    uint8_t secrets[32][16];
    bool endless[8];
    uint64_t seq_task[256], seq[256]; /* each task's last request_seq */
    unsigned nseqs, handed;           /* answers with splits */
    unsigned reports, accepted;       /* ReportReceived sent, accepted */
    unsigned skipped;                 /* splits handed out again with skip runs */
    struct {
        uint64_t job, epoch, begin, end;
    } got[64]; /* the latest splits handed out, which reports draw from */
    unsigned ngot;
};

static uint64_t rt_draw(struct rt *r, uint64_t below)
{
    return splitmix64(&r->rng) % below;
}

/* The tasks of every job the state knows, as its views list them. */
static void rt_tasks(struct rt *r)
{
    r->ntasks = 0;
    for (unsigned i = 0; i < r->njobs; i++) {
        json_t *j = sl_dstate_job_json(st, r->jobs[i], 0), *t;
        size_t k;
        json_array_foreach(json_object_get(j, "tasks"), k, t)
            if (r->ntasks < 64) {
                r->task_job[r->ntasks] = r->jobs[i];
                r->tasks[r->ntasks++] = (uint64_t)json_integer_value(json_object_get(t, "task_id"));
            }
        json_decref(j);
    }
}

/* A drawn client reports what it received of its job's lost splits, at the
 * job's report generation mostly: drawn runs of records inside splits
 * handed out lately (mostly its job's), a few or as many as every other record,
 * more than one answer's skip runs hold at the smaller --max-skip-bytes:
 * lost splits go out again whole, in parts or not at all. */
static void rt_report(struct rt *r, int64_t now)
{
    /* Mostly a client of a job whose lost splits await reports. */
    unsigned c = (unsigned)rt_draw(r, r->njobs);
    uint64_t gen = 0;
    for (unsigned k = 0; k < r->njobs; k++) {
        unsigned i = (c + k) % r->njobs;
        json_t *j = sl_dstate_job_json(st, r->jobs[i], 0), *lost = json_object_get(j, "lost_splits");
        bool awaiting = json_integer_value(json_object_get(lost, "awaiting_reports")) > 0;
        if (k == 0 || awaiting) {
            c = i;
            gen = (uint64_t)json_integer_value(json_object_get(lost, "report_gen"));
        }
        json_decref(j);
        if (awaiting && rt_draw(r, 8))
            break;
    }
    sl_posset_t got;
    sl_posset_init(&got, 1u << 16);
    for (unsigned k = 0; r->ngot > 0 && k < 4; k++) {
        unsigned g = (unsigned)rt_draw(r, r->ngot);
        if (r->got[g].job != r->jobs[c] && rt_draw(r, 8))
            continue; /* mostly the splits of the client's own job */
        uint64_t gap = rt_draw(r, 2) ? 1 : 1 + rt_draw(r, 40);
        for (uint64_t pos = r->got[g].begin + rt_draw(r, 3); pos < r->got[g].end; pos += 1 + gap)
            (void)sl_posset_add(&got, (uint32_t)r->got[g].epoch, 0, pos, 1, NULL);
    }
    sluice_ReportReceivedRequest req = {.job_id = r->jobs[c], .client_id = r->clients[c],
                                        .report_gen = rt_draw(r, 8) ? gen : gen + rt_draw(r, 3) - 1};
    memcpy(req.client_secret, r->secrets[c], 16);
    r->accepted += send_report(st, &req, &got, now, err, sizeof err) == 0;
    sl_posset_clear(&got);
    r->reports++;
}

static void rt_step(struct rt *r, int64_t now)
{
    char addr[32];
    uint64_t a = rt_draw(r, 100), id;
    snprintf(addr, sizeof addr, "127.0.0.%u:1", 1 + (unsigned)rt_draw(r, 5));
    if (a < 8) {
        (void)sl_dstate_worker_register(st, addr, now, &id, err, sizeof err);
    } else if (a < 12 && r->ndatasets < 8) {
        bool endless = rt_draw(r, 2);
        char spec[160];
        snprintf(spec, sizeof spec, "{\"source\": {\"type\": \"range\", \"stop\": %u}%s}",
                 1 + (unsigned)rt_draw(r, 5000), endless ? ", \"ops\": [{\"op\": \"repeat\"}]" : "");
        const char *fp;
        if (sl_dstate_dataset_register(st, spec, strlen(spec), &id, &fp, err, sizeof err) == 0) {
            r->endless[r->ndatasets] = endless;
            r->datasets[r->ndatasets++] = id;
        }
    } else if (a < 24 && r->ndatasets > 0 && r->njobs < 32) {
        unsigned d = (unsigned)rt_draw(r, r->ndatasets);
        sluice_GetOrCreateJobRequest req = {.dataset_id = r->datasets[d],
                                            .sharding = rt_draw(r, 4) ? SL_SHARDING_DYNAMIC : SL_SHARDING_OFF};
        uint64_t kind = rt_draw(r, 3);
        if (kind > 0)
            snprintf(req.job_name, sizeof req.job_name, "job%u", (unsigned)rt_draw(r, 4));
        if (kind == 2 && r->endless[d]) {
            req.num_consumers = 2;
            req.consumer_index = (uint32_t)rt_draw(r, 2);
        }
        sluice_GetOrCreateJobResponse resp = sluice_GetOrCreateJobResponse_init_zero;
        if (sl_dstate_job_join(st, &req, "", NULL, 0, now, &resp, err, sizeof err) == 0) {
            r->jobs[r->njobs] = resp.job_id;
            r->clients[r->njobs] = resp.client_id;
            memcpy(r->secrets[r->njobs], resp.client_secret, 16);
            r->njobs++;
        }
    } else if (a < 44 && r->njobs > 0) {
        unsigned c = (unsigned)rt_draw(r, r->njobs);
        sluice_ClientHeartbeatRequest *hb = calloc(1, sizeof *hb);
        sluice_ClientHeartbeatResponse *hr = calloc(1, sizeof *hr);
        hb->job_id = r->jobs[c];
        hb->client_id = r->clients[c];
        hb->round = rt_draw(r, 200);
        memcpy(hb->client_secret, r->secrets[c], 16);
        rt_tasks(r);
        for (unsigned i = 0; i < r->ntasks && i < 4; i++)
            hb->progress[hb->progress_count++] =
                (sluice_TaskProgress){.task_id = r->tasks[rt_draw(r, r->ntasks)], .done_below = rt_draw(r, 64)};
        (void)sl_dstate_client_heartbeat(st, hb, now, hr, err, sizeof err);
        free(hb);
        free(hr);
    } else if (a < 48 && r->njobs > 0) {
        unsigned c = (unsigned)rt_draw(r, r->njobs);
        sluice_ReleaseClientRequest rel = {.job_id = r->jobs[c], .client_id = r->clients[c]};
        memcpy(rel.client_secret, r->secrets[c], 16);
        (void)sl_dstate_client_release(st, &rel, now, err, sizeof err);
    } else if (a < 70) {
        rt_tasks(r);
        if (r->ntasks == 0)
            return;
        unsigned ti = (unsigned)rt_draw(r, r->ntasks);
        uint64_t task = r->tasks[ti];
        unsigned q = 0;
        while (q < r->nseqs && r->seq_task[q] != task)
            q++;
        if (q == r->nseqs && q < 256) {
            r->seq_task[q] = task;
            r->seq[q] = 0;
            r->nseqs++;
        }
        /* The next request mostly, else one asked again or out of order. */
        uint64_t seq = q < r->nseqs ? (rt_draw(r, 8) ? ++r->seq[q] : r->seq[q] + rt_draw(r, 3) - 1) : 1;
        sluice_GetSplitRequest req = {.task_id = task,
                                      .epoch = rt_draw(r, 8) ? 0 : rt_draw(r, 3),
                                      .max_splits = 1 + (uint32_t)rt_draw(r, 16),
                                      .request_seq = seq};
        sluice_GetSplitResponse *resp = calloc(1, sizeof *resp);
        if (sl_dstate_get_splits(st, &req, now, resp, err, sizeof err) == 0 && resp->splits_count > 0) {
            r->handed++;
            for (pb_size_t i = 0; i < resp->splits_count; i++) {
                const sluice_Split *sp = &resp->splits[i];
                r->skipped += sp->skip_count > 0;
                unsigned k = r->ngot < 64 ? r->ngot++ : (unsigned)rt_draw(r, 64);
                r->got[k].job = r->task_job[ti];
                r->got[k].epoch = sp->epoch;
                r->got[k].begin = sp->begin;
                r->got[k].end = sp->end;
            }
        }
        free(resp);
    } else if (a < 84) {
        json_t *ws = sl_dstate_workers_json(st, now);
        size_t n = json_array_size(ws);
        if (n > 0) {
            json_t *w = json_array_get(ws, rt_draw(r, n));
            uint64_t wid = (uint64_t)json_integer_value(json_object_get(w, "worker_id"));
            sluice_WorkerHeartbeatRequest *req = calloc(1, sizeof *req);
            sluice_WorkerHeartbeatResponse *resp = calloc(1, sizeof *resp);
            req->worker_id = wid;
            rt_tasks(r);
            if (r->ntasks > 0 && rt_draw(r, 2)) {
                req->tasks_count = 1;
                req->tasks[0] = (sluice_TaskStatus){.task_id = r->tasks[rt_draw(r, r->ntasks)],
                                                    .state = rt_draw(r, 2) ? SL_TASK_DONE : SL_TASK_RUNNING,
                                                    .done_below = rt_draw(r, 64)};
            }
            (void)sl_dstate_worker_heartbeat(st, req, now, resp, err, sizeof err);
            free(req);
            free(resp);
        }
        json_decref(ws);
    } else if (a < 88) {
        json_t *ws = sl_dstate_workers_json(st, now);
        size_t n = json_array_size(ws);
        if (n > 0)
            sl_dstate_worker_disconnected(
                st, (uint64_t)json_integer_value(json_object_get(json_array_get(ws, rt_draw(r, n)), "worker_id")),
                "killed");
        json_decref(ws);
    } else if (a < 90) {
        (void)sl_dstate_worker_drain(st, addr, err, sizeof err);
    } else if (a < 93 && r->njobs > 0) {
        (void)sl_dstate_job_cancel(st, r->jobs[rt_draw(r, r->njobs)], "by hand", err, sizeof err);
    } else if (a < 97 && r->njobs > 0) {
        rt_report(r, now);
    } else {
        sl_dstate_tick(st, now);
    }
}

/* A run of drawn operations starts: a drawn configuration (with a drawn
 * max_skip_bytes when skip_bytes), a new store, a new state and no ids
 * known yet. */
static void rt_run_begin(struct rt *r, sl_dstate_config_t *cfg, bool skip_bytes)
{
    sl_dstate_config_init(cfg);
    cfg->split_size = 1 + rt_draw(r, 300);
    cfg->client_timeout_ms = 100 + (unsigned)rt_draw(r, 2000);
    cfg->worker_timeout_ms = 100 + (unsigned)rt_draw(r, 2000);
    cfg->job_gc_timeout_ms = 100 + (unsigned)rt_draw(r, 5000);
    if (skip_bytes)
        cfg->max_skip_bytes = 16u << rt_draw(r, 15); /* 2 skip runs an answer to 2^17 */
    sl_store_close(store);
    store = NULL;
    remove_dir(dir);
    snprintf(dir, sizeof dir, "/tmp/sl-persist-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    open_store(0);
    sl_dstate_free(st);
    cr_assert_not_null(st = sl_dstate_new(cfg));
    r->ndatasets = r->njobs = r->nseqs = r->ngot = 0;
}

/* The record at position pick of a table: its key and value, copied. */
struct drawn_record {
    unsigned seen, pick;
    uint8_t key[16];
    size_t klen;
    uint8_t *val;
    size_t vlen;
};

static int draw_record(const void *key, size_t klen, const void *val, size_t vlen, void *arg)
{
    struct drawn_record *d = arg;
    if (d->seen++ != d->pick)
        return 0;
    cr_assert_leq(klen, sizeof d->key);
    memcpy(d->key, key, klen);
    d->klen = klen;
    cr_assert_not_null(d->val = malloc(vlen ? vlen : 1));
    memcpy(d->val, val, vlen);
    d->vlen = vlen;
    return 1;
}

static int count_record(const void *key, size_t klen, const void *val, size_t vlen, void *arg)
{
    (void)key, (void)klen, (void)val, (void)vlen;
    ++*(unsigned *)arg;
    return 0;
}

static void put_record(int table, const uint8_t *key, size_t klen, const void *val, size_t vlen)
{
    sl_store_txn_t *t;
    cr_assert_eq(sl_store_begin(store, &t), 0);
    cr_assert_eq(sl_store_put(t, table, key, klen, val, vlen), 0);
    cr_assert_eq(sl_store_commit(t, err, sizeof err), 0, "%s", err);
}

/* views text without what held holds back (its jobs, datasets and
 * workers) and without the workers' counts of active tasks, which a job
 * held back takes its own from. */
static char *views_without(const char *text, const sl_dstate_t *held)
{
    json_t *all = json_loads(text, 0, NULL);
    cr_assert_not_null(all);
    static const char *const lists[][2] = {{"jobs", "job"}, {"datasets", "dataset"}, {"workers", "worker"}};
    for (size_t l = 0; l < 3; l++) {
        json_t *arr = json_object_get(all, lists[l][0]);
        for (size_t i = json_array_size(arr); i-- > 0;) {
            json_object_del(json_array_get(arr, i), "active_tasks");
            uint64_t id = (uint64_t)json_integer_value(json_object_get(json_array_get(arr, i), "id"));
            if (sl__dstate_held_back(held, lists[l][1], id))
                json_array_remove(arr, i);
        }
    }
    char *out = json_dumps(all, JSON_SORT_KEYS);
    json_decref(all);
    return out;
}

/* At drawn moments of drawn operations, one drawn record of the store is
 * damaged: the load holds back what it is of (the job of a job's record,
 * cursor, task's hand-out, restored positions or outstanding split; a
 * dataset and its jobs; a worker), nothing else, and serves the rest as it
 * was. The record is then put back and the operations go on. */
Test(persist, a_damaged_record_holds_back_only_what_it_is_of_at_drawn_operations, .timeout = 600)
{
    uint64_t seed = test_seed("persist.a_damaged_record_holds_back_only_what_it_is_of_at_drawn_operations");
    struct rt r = {.rng = seed};
    static const int tables[] = {SL_DT_DATASETS, SL_DT_JOBS,    SL_DT_WORKERS,    SL_DT_CURSORS,
                                 SL_DT_HANDOUTS, SL_DT_EXCLUDE, SL_DT_OUTSTANDING};
    unsigned damaged = 0, held = 0, by_table[7] = {0};
    for (int run = 0; run < 8; run++) {
        sl_dstate_config_t cfg;
        rt_run_begin(&r, &cfg, false);
        int64_t now = 0;
        for (int step = 0; step < 400; step++) {
            now += (int64_t)rt_draw(&r, 200);
            rt_step(&r, now);
            save(st);
            if (rt_draw(&r, 8) != 0)
                continue;
            size_t ti = rt_draw(&r, 7);
            int table = tables[ti];
            unsigned n = 0;
            cr_assert_eq(sl_store_foreach(store, table, count_record, &n), 0);
            if (n == 0)
                continue;
            struct drawn_record d = {.pick = (unsigned)rt_draw(&r, n)};
            cr_assert_eq(sl_store_foreach(store, table, draw_record, &d), 1);
            const char *junk = table == SL_DT_EXCLUDE || table == SL_DT_OUTSTANDING ? "bad" : "{\"x";
            put_record(table, d.key, d.klen, junk, strlen(junk));
            char what[128];
            snprintf(what, sizeof what, "seed %" PRIu64 " run %d step %d, table %d", seed, run, step, table);
            sl_dstate_t *next = sl_dstate_new(&cfg);
            cr_assert_not_null(next);
            cr_assert_eq(sl_dpersist_load(next, store, now, err, sizeof err), 0, "%s: %s", what, err);
            /* What the record is of. */
            uint64_t id = 0;
            for (size_t i = 0; i < 8; i++)
                id = id << 8 | d.key[i];
            const char *kind = table == SL_DT_DATASETS ? "dataset" : table == SL_DT_WORKERS ? "worker" : "job";
            struct job *tj = NULL;
            if (table == SL_DT_HANDOUTS)
                id = sl__dstate_task(st, id, &tj) && tj ? tj->id : 0;
            const struct job *owner = strcmp(kind, "job") == 0 ? sl__dstate_job(st, id) : NULL;
            /* Every entry is that, or a job of that dataset; a running job's
             * restored positions, and every other record, are read. */
            for (unsigned q = 0; q < next->num_quarantine; q++) {
                const struct quarantined *e = &next->quarantine[q];
                const struct job *ej = strcmp(e->kind, "job") == 0 ? sl__dstate_job(st, e->id) : NULL;
                bool ok = (e->id == id && strcmp(e->kind, kind) == 0) ||
                          (strcmp(kind, "dataset") == 0 && ej && ej->dataset->id == id);
                cr_assert(ok, "%s: %s %" PRIu64 " held back for %s %" PRIu64 ": %s", what, e->kind, e->id, kind, id,
                          e->why);
            }
            bool read_anyway = table == SL_DT_EXCLUDE && (!owner || owner->state != SL_JOB_RUNNING);
            cr_assert(read_anyway || sl__dstate_held_back(next, kind, id), "%s: %s %" PRIu64 " not held back", what,
                      kind, id);
            char *a = views(st), *b = views(next), *want = views_without(a, next), *got = views_without(b, next);
            assert_same_views(want, got, what);
            free(a);
            free(b);
            free(want);
            free(got);
            damaged++;
            held += next->num_quarantine > 0;
            by_table[ti]++;
            sl_dstate_free(next);
            put_record(table, d.key, d.klen, d.val, d.vlen);
            free(d.val);
        }
    }
    fprintf(stderr, "  8 runs of 400 operations: %u records damaged (datasets %u, jobs %u, workers %u, cursors %u, "
            "hand-outs %u, restored positions %u, outstanding %u), %u held something back\n", damaged, by_table[0],
            by_table[1], by_table[2], by_table[3], by_table[4], by_table[5], by_table[6], held);
    cr_assert_gt(held, 0);
}

Test(persist, any_store_the_dispatcher_writes_loads_at_drawn_operations, .timeout = 600)
{
    uint64_t seed = test_seed("persist.any_store_the_dispatcher_writes_loads_at_drawn_operations");
    struct rt r = {.rng = seed};
    unsigned loads = 0;
    for (int run = 0; run < 20; run++) {
        sl_dstate_config_t cfg;
        rt_run_begin(&r, &cfg, true);
        int64_t now = 0;
        for (int step = 0; step < 600; step++) {
            now += (int64_t)rt_draw(&r, 200);
            rt_step(&r, now);
            save(st);
            if (rt_draw(&r, 10) == 0) {
                sl_dstate_t *next = sl_dstate_new(&cfg);
                cr_assert_not_null(next);
                cr_assert_eq(sl_dpersist_load(next, store, now, err, sizeof err), 0,
                             "seed %" PRIu64 " run %d step %d: %s", seed, run, step, err);
                char *a = views(st), *b = views(next);
                char what[96];
                snprintf(what, sizeof what, "seed %" PRIu64 " run %d step %d", seed, run, step);
                assert_same_views(a, b, what);
                free(a);
                free(b);
                sl_dstate_free(st);
                st = next;
                loads++;
            }
        }
    }
    fprintf(stderr, "  20 runs of 600 operations: %u loads, %u answers with splits (%u splits with skip runs), "
            "%u reports (%u accepted)\n", loads, r.handed, r.skipped, r.reports, r.accepted);
}
