/*
 * persist.c: see persist.h.
 *
 * Records (key: the id as 8 big-endian bytes, so tables read in creation
 * order; value: a JSON object):
 *   datasets  {spec, fingerprint, name (when it has one), cardinality, split_size, hint_op, infinite, files: [[path, records]...],
 *             last_used: wall-clock ms of its last use, from which --dataset-gc-timeout-ms counts}
 *   workers   {address, lost, why_lost, draining}
 *   jobs      {name, dataset, sharding, effective, num_consumers, round_horizon, state, error,
 *              tasks: [{id, worker, address, state, index, start_round, end_round}...],
 *              clients: [{id, consumer_index, round, target, host, late, start_round?, aligning?}...],
 *              gone: [[consumer_index, round]...] (coordinated reads: the indexes whose client left),
 *              report_gen,
 *              repetition, collected, ended_at: wall-clock ms when it ended (ended jobs only),
 *              restore_digest: a named job a restore created, the SHA-256 of what it sent, 64 hex digits,
 *              given_floor: a named job, the least place given of the clients that left it without
 *              giving back all they had not given: its
 *              epoch, and given_floor_file, given_floor_record when either is not 0,
 *              end_epochs_done: an ended DYNAMIC job, the epochs done when it ended}
 *   cursors   per job: {epoch, file, next, seq, handed}
 *   handouts  per task: the last GetSplit answer {seq, epoch, end_of_epoch, finished, splits: [[id, file, begin,
 *             end]...]}
 *   meta      "next_id": 8 big-endian bytes; "secret": the dispatcher's 32-byte secret (caps.h), written
 *             at the first commit and never again: client secrets and task keys survive a restart
 *   exclusions per restored job: its consumed positions, posset.h's bytes (not JSON)
 *   outstanding per DYNAMIC split handed out and not confirmed, of a lost task, or given back by a
 *             leaving client (task 0, state QUEUED; outstanding.h);
 *             key: job id and split id (8 big-endian bytes each); value (not JSON, little-endian):
 *             u64 task, u64 epoch, u64 begin, u64 end, u32 file, u32 state, u32 runs, u32 form (its
 *             bit 8 set: records a leaving client gave back, OSPLIT_GIVEN_BACK), then
 *             what the consumers have of it: form 0, runs x (u64 begin, u64 count); form 1 (runs 0),
 *             posset.h's bytes, version 3 (written where a block of it holds 176 runs or more: a
 *             rank's scattered share, which a dispatcher before 2026-12-05 refuses by name)
 * A hand-out's skip runs are stored as "skips": [[begin, count]...], each
 * split's skip_offset / skip_count indexing them as in the answer payload.
 * Enums are stored as their numbers and checked at load. Fields added
 * after format 1 first shipped (a worker's why_lost, a hand-out's skips, a
 * job's repetition, collected, ended_at, restore_digest, given_floor,
 * given_floor_file, given_floor_record, gone and end_epochs_done, a
 * client's late) are optional at load, so an older store still loads. A
 * job record without repetition was written when a join of an ended job's
 * name created a new job: an ended one loads as collected, so that such a
 * join still does. The file list of a dataset is stored, not expanded
 * again, so the (file, record range)
 * numbering of splits handed out before a restart keeps its meaning.
 * A record that does not decode holds back what it is of (load_record()):
 * the job, dataset or worker is not loaded, its records are left as they
 * are, and st->quarantine says why (docs/fault-tolerance.md, Damaged
 * records); a field or form this build does not know refuses the load.
 */
#include "persist.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "errbuf.h"
#include "le.h"
#include "log.h"
#include "outstanding.h"
#include "policy.h"
#include "spec.h"
#include "state_types.h"

static const char *const table_names[SL_DT_COUNT_] = {"datasets",   "jobs",      "workers",
                                                      "splits",     "handouts",  "dispatcher",
                                                      "exclusions", "outstanding"};

const char *const *sl_dpersist_tables(int *n)
{
    *n = SL_DT_COUNT_;
    return table_names;
}

static void key_of(uint64_t id, uint8_t key[8])
{
    for (int i = 7; i >= 0; i--, id >>= 8)
        key[i] = (uint8_t)id;
}

static uint64_t id_of(const void *key, size_t klen)
{
    const uint8_t *k = key;
    uint64_t id = 0;
    for (size_t i = 0; i < klen && i < 8; i++)
        id = id << 8 | k[i];
    return klen == 8 ? id : 0;
}

/* ---- encoding ---- */

/* Milliseconds of the wall clock: a dataset's last use is stored as such,
 * the state's clock (monotonic) starting afresh with every process. */
static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static json_t *dataset_record(const sl_dstate_t *st, const struct dataset *d)
{
    json_t *files = json_array();
    for (int f = 0; f < d->files.num_files; f++)
        json_array_append_new(files, json_pack("[s,I]", d->files.paths[f], (json_int_t)d->files.records[f]));
    int64_t idle = d->last_used > 0 && st->now > d->last_used ? st->now - d->last_used : 0;
    json_t *rec = json_pack("{s:s,s:s,s:I,s:I,s:i,s:b,s:o,s:I}", "spec", d->canonical, "fingerprint", d->fingerprint,
                            "cardinality", (json_int_t)d->cardinality, "split_size", (json_int_t)d->split_size,
                            "hint_op", d->hint_op, "infinite", d->infinite, "files", files, "last_used",
                            (json_int_t)(wall_ms() - idle));
    /* Only a named dataset's record has a name: a dispatcher from before
     * names still reads the others. */
    if (rec && d->name[0])
        json_object_set_new(rec, "name", json_string(d->name));
    return rec;
}

/* What sl_policy_source_passes() says of a stored spec, which is not
 * stored itself (a dispatcher from before it reads the record as it is);
 * 1 (no hand-out ahead of a task's epoch) if it no longer parses. */
static uint64_t spec_passes(const char *canonical)
{
    sl_spec_t *spec = NULL;
    char err[256];
    if (sl_spec_parse(canonical, strlen(canonical), &spec, err, sizeof err) < 0)
        return 1;
    uint64_t passes = sl_policy_source_passes(spec);
    sl_spec_free(spec);
    return passes;
}

static json_t *worker_record(const struct worker *w)
{
    return json_pack("{s:s,s:b,s:s,s:b}", "address", w->address, "lost", w->state == WORKER_LOST, "why_lost",
                     w->why_lost, "draining", w->draining);
}

static json_t *job_record(const sl_dstate_t *st, const struct job *j)
{
    json_t *tasks = json_array(), *clients = json_array();
    for (unsigned k = 0; k < j->num_tasks; k++) {
        const struct task *t = &j->tasks[k];
        json_array_append_new(tasks, json_pack("{s:I,s:I,s:s,s:i,s:i,s:I,s:I}", "id", (json_int_t)t->id, "worker",
                                               (json_int_t)t->worker_id, "address", t->worker_address, "state",
                                               (int)t->state, "index", (int)t->worker_index, "start_round",
                                               (json_int_t)t->start_round, "end_round", (json_int_t)t->end_round));
    }
    for (unsigned k = 0; k < j->num_clients; k++) {
        const struct client *c = &j->clients[k];
        json_t *rc = json_pack("{s:I,s:i,s:I,s:i,s:s,s:b}", "id", (json_int_t)c->id, "consumer_index",
                               (int)c->consumer_index, "round", (json_int_t)c->round, "target", (int)c->target,
                               "host", c->host, "late", c->late);
        if (rc && c->replaced)
            json_object_set_new(rc, "start_round", json_integer((json_int_t)c->start_round));
        if (rc && c->aligning)
            json_object_set_new(rc, "aligning", json_true());
        json_array_append_new(clients, rc);
    }
    json_t *rec = json_pack("{s:s,s:I,s:i,s:i,s:i,s:I,s:i,s:s,s:o,s:o,s:I,s:I,s:b}", "name", j->name, "dataset",
                            (json_int_t)j->dataset->id, "sharding", (int)j->sharding, "effective", (int)j->effective,
                            "num_consumers", (int)j->num_consumers, "round_horizon", (json_int_t)j->round_horizon,
                            "state", (int)j->state, "error", j->error, "tasks", tasks, "clients", clients,
                            "report_gen", (json_int_t)j->report_gen, "repetition", (json_int_t)j->repetition,
                            "collected", j->collected);
    if (rec && j->restored) {
        char hex[65];
        for (int i = 0; i < 32; i++)
            snprintf(hex + 2 * i, 3, "%02x", j->restore_digest[i]);
        json_object_set_new(rec, "restore_digest", json_string(hex));
    }
    if (rec && j->given_floor_set)
        json_object_set_new(rec, "given_floor", json_integer((json_int_t)j->given_floor.epoch));
    if (rec && j->given_floor_set && (j->given_floor.file > 0 || j->given_floor.pos > 0)) {
        json_object_set_new(rec, "given_floor_file", json_integer((json_int_t)j->given_floor.file));
        json_object_set_new(rec, "given_floor_record", json_integer((json_int_t)j->given_floor.pos));
    }
    if (rec && j->end_epochs_known)
        json_object_set_new(rec, "end_epochs_done", json_integer((json_int_t)j->end_epochs_done));
    if (rec && j->num_gone > 0) {
        json_t *gone = json_array();
        for (unsigned g = 0; g < j->num_gone; g++)
            json_array_append_new(gone, json_pack("[i,I]", (int)j->gone[g].consumer_index,
                                                  (json_int_t)j->gone[g].round));
        json_object_set_new(rec, "gone", gone);
    }
    if (rec && j->nonce)
        json_object_set_new(rec, "nonce", json_integer((json_int_t)j->nonce));
    if (rec && j->state != SL_JOB_RUNNING) {
        int64_t ago = j->ended > 0 && st->now > j->ended ? st->now - j->ended : 0;
        json_object_set_new(rec, "ended_at", json_integer((json_int_t)(wall_ms() - ago)));
    }
    return rec;
}

static json_t *cursor_record(const struct job *j)
{
    return json_pack("{s:I,s:i,s:I,s:I,s:I}", "epoch", (json_int_t)j->split_epoch, "file", (int)j->split_file,
                     "next", (json_int_t)j->split_next, "seq", (json_int_t)j->split_seq, "handed",
                     (json_int_t)j->split_epoch_handed);
}

static json_t *handout_record(const struct task *t)
{
    const struct last_answer *r = t->last_splits;
    json_t *splits = json_array(), *skips = json_array();
    for (pb_size_t i = 0; i < r->num; i++)
        json_array_append_new(splits, json_pack("[I,i,I,I,I,I]", (json_int_t)r->splits[i].split_id,
                                                (int)r->splits[i].file_index, (json_int_t)r->splits[i].begin,
                                                (json_int_t)r->splits[i].end, (json_int_t)r->splits[i].skip_offset,
                                                (json_int_t)r->splits[i].skip_count));
    for (size_t o = 0; o + 16 <= t->last_skips_len; o += 16)
        json_array_append_new(skips, json_pack("[I,I]", (json_int_t)sl_get_le64(t->last_skips + o),
                                               (json_int_t)sl_get_le64(t->last_skips + o + 8)));
    return json_pack("{s:I,s:I,s:b,s:b,s:o,s:o}", "seq", (json_int_t)t->split_req_seq, "epoch",
                     (json_int_t)r->epoch, "end_of_epoch", r->end_of_epoch, "finished", r->finished, "splits",
                     splits, "skips", skips);
}

/* Writes one record; rec is consumed. */
static int put_json(sl_store_txn_t *txn, enum sl_dtable table, uint64_t id, json_t *rec)
{
    if (!rec)
        return -ENOMEM;
    char *text = json_dumps(rec, JSON_COMPACT);
    json_decref(rec);
    if (!text)
        return -ENOMEM;
    uint8_t key[8];
    key_of(id, key);
    int rc = sl_store_put(txn, table, key, sizeof key, text, strlen(text));
    free(text);
    return rc;
}

static int put_exclusions(sl_store_txn_t *txn, const struct job *j)
{
    uint8_t *buf;
    size_t len;
    if (sl_posbits_bytes(&j->exclude, &buf, &len) < 0)
        return -ENOMEM;
    uint8_t key[8];
    key_of(j->id, key);
    int rc = sl_store_put(txn, SL_DT_EXCLUDE, key, sizeof key, buf, len);
    free(buf);
    return rc;
}

#define OSPLIT_HEAD 48 /* bytes of an outstanding record before its runs */
/* Its form word's flag: records a leaving client gave back, which count
 * against no --max-outstanding-splits (since 2026-12-05; before, those at
 * a task counted again once loaded). */
#define OSPLIT_GIVEN_BACK (1u << 8)

static void osplit_key(uint64_t job, uint64_t split, uint8_t key[16])
{
    key_of(job, key);
    key_of(split, key + 8);
}

static int put_osplit(sl_store_txn_t *txn, uint64_t job, const struct osplit *o)
{
    sl_posrun_t *have = NULL;
    uint8_t *set = NULL;
    size_t runs = 0, set_len = 0;
    int rc = 0;
    if (o->have && sl_posbits_bitmaps(o->have, SL_POSBITS_WIRE_RUNS, NULL) > 0)
        rc = sl_posbits_encode(o->have, SL_POSBITS_WIRE_RUNS, &set, &set_len);
    else if (o->have)
        rc = sl_posbits_runs(o->have, 0, &have, &runs);
    size_t len = OSPLIT_HEAD + (set ? set_len : 16 * runs);
    uint8_t *buf = rc == 0 ? malloc(len) : NULL;
    if (!buf) {
        free(set);
        free(have);
        return -ENOMEM;
    }
    sl_put_le64(buf, o->task_id);
    sl_put_le64(buf + 8, o->epoch);
    sl_put_le64(buf + 16, o->begin);
    sl_put_le64(buf + 24, o->end);
    sl_put_le32(buf + 32, o->file);
    sl_put_le32(buf + 36, (uint32_t)o->state);
    sl_put_le32(buf + 40, (uint32_t)runs);
    sl_put_le32(buf + 44, (set ? 1u : 0u) | (o->given_back ? OSPLIT_GIVEN_BACK : 0u));
    for (size_t i = 0; i < runs; i++) {
        sl_put_le64(buf + OSPLIT_HEAD + 16 * i, have[i].begin);
        sl_put_le64(buf + OSPLIT_HEAD + 16 * i + 8, have[i].count);
    }
    if (set)
        memcpy(buf + OSPLIT_HEAD, set, set_len);
    free(set);
    free(have);
    uint8_t key[16];
    osplit_key(job, o->id, key);
    rc = sl_store_put(txn, SL_DT_OUTSTANDING, key, sizeof key, buf, len);
    free(buf);
    return rc;
}

static int write_outstanding(sl_store_txn_t *txn, const struct job *j)
{
    int rc = 0;
    for (unsigned k = 0; k < j->num_tasks && rc == 0; k++) {
        const struct task *t = &j->tasks[k];
        for (unsigned i = t->out_rewrite ? t->out_head : t->out_saved > t->out_head ? t->out_saved : t->out_head;
             i < t->out_num && rc == 0; i++)
            if (i >= t->out_saved || t->out[i].dirty)
                rc = put_osplit(txn, j->id, &t->out[i]);
    }
    for (unsigned i = 0; i < j->num_orphans && j->orphans_dirty && rc == 0; i++)
        if (j->orphans[i].dirty)
            rc = put_osplit(txn, j->id, &j->orphans[i]);
    return rc;
}

static int del_record(sl_store_txn_t *txn, const struct sl_ddel *d)
{
    uint8_t key[16];
    key_of(d->key, key);
    if (d->table != SL_DT_OUTSTANDING)
        return sl_store_del(txn, d->table, key, 8);
    if (d->key2 == UINT64_MAX)
        return sl_store_del_prefix(txn, d->table, key, 8); /* every record of the job */
    key_of(d->key2, key + 8);
    return sl_store_del(txn, d->table, key, sizeof key);
}

#ifndef NDEBUG
static bool job_changed(const struct job *j)
{
    if (j->dirty || j->cursor_dirty || j->exclude_dirty || j->orphans_dirty)
        return true;
    for (unsigned k = 0; k < j->num_tasks; k++)
        if (j->tasks[k].handout_dirty || j->tasks[k].out_saved < j->tasks[k].out_num || j->tasks[k].out_rewrite)
            return true;
    return false;
}

/* Debug builds check, while the state is small, that every job with a
 * change to write is listed (sl__dstate_touch()): a change not listed would
 * be answered and not stored. */
static void check_listed(const sl_dstate_t *st)
{
    if (st->num_jobs > 256)
        return;
    for (unsigned i = 0; i < st->num_jobs; i++) {
        if (!st->jobs[i]->listed && job_changed(st->jobs[i])) {
            sl_log_error("job %" PRIu64 " changed and is not on the dirty list", st->jobs[i]->id);
            abort();
        }
    }
    for (unsigned i = 0; i < st->num_workers; i++)
        if (st->workers[i].dirty && !st->workers_dirty)
            abort();
    for (unsigned i = 0; i < st->num_datasets; i++)
        if (st->datasets[i]->dirty && !st->datasets_dirty)
            abort();
}
#endif

bool sl_dpersist_dirty(const sl_dstate_t *st)
{
#ifndef NDEBUG
    check_listed(st);
#endif
    return st->num_dels > 0 || st->next_id != st->saved_next_id || st->secret_dirty || st->workers_dirty ||
           st->datasets_dirty || st->num_dirty_jobs > 0;
}

static int write_job(sl_dstate_t *st, sl_store_txn_t *txn, const struct job *j)
{
    int rc = 0;
    if (j->dirty)
        rc = put_json(txn, SL_DT_JOBS, j->id, job_record(st, j));
    if (j->cursor_dirty && rc == 0)
        rc = put_json(txn, SL_DT_CURSORS, j->id, cursor_record(j));
    if (j->exclude_dirty && rc == 0)
        rc = put_exclusions(txn, j);
    for (unsigned k = 0; k < j->num_tasks && rc == 0; k++)
        if (j->tasks[k].handout_dirty)
            rc = put_json(txn, SL_DT_HANDOUTS, j->tasks[k].id, handout_record(&j->tasks[k]));
    if (rc == 0)
        rc = write_outstanding(txn, j);
    return rc;
}

static int write_dirty(sl_dstate_t *st, sl_store_txn_t *txn)
{
    int rc = 0;
    for (unsigned i = 0; i < st->num_dels && rc == 0; i++)
        rc = del_record(txn, &st->dels[i]);
    for (unsigned i = 0; i < st->num_datasets && st->datasets_dirty && rc == 0; i++)
        if (st->datasets[i]->dirty)
            rc = put_json(txn, SL_DT_DATASETS, st->datasets[i]->id, dataset_record(st, st->datasets[i]));
    for (unsigned i = 0; i < st->num_workers && st->workers_dirty && rc == 0; i++)
        if (st->workers[i].dirty)
            rc = put_json(txn, SL_DT_WORKERS, st->workers[i].id, worker_record(&st->workers[i]));
    for (unsigned i = 0; i < st->num_dirty_jobs && rc == 0; i++)
        rc = write_job(st, txn, st->dirty_jobs[i]);
    if (rc == 0 && st->next_id != st->saved_next_id) {
        uint8_t val[8];
        key_of(st->next_id, val);
        rc = sl_store_put(txn, SL_DT_META, "next_id", 7, val, sizeof val);
    }
    if (rc == 0 && st->secret_dirty)
        rc = sl_store_put(txn, SL_DT_META, "secret", 6, st->secret, sizeof st->secret);
    return rc;
}

static void clear_dirty(sl_dstate_t *st)
{
    st->num_dels = 0;
    st->saved_next_id = st->next_id;
    st->secret_dirty = false;
    for (unsigned i = 0; i < st->num_datasets && st->datasets_dirty; i++) {
        if (st->datasets[i]->dirty)
            st->datasets[i]->saved_used = st->datasets[i]->last_used;
        st->datasets[i]->dirty = false;
    }
    st->datasets_dirty = false;
    for (unsigned i = 0; i < st->num_workers && st->workers_dirty; i++)
        st->workers[i].dirty = false;
    st->workers_dirty = false;
    for (unsigned i = 0; i < st->num_dirty_jobs; i++) {
        struct job *j = st->dirty_jobs[i];
        j->dirty = j->cursor_dirty = j->exclude_dirty = false;
        for (unsigned k = 0; k < j->num_tasks; k++) {
            struct task *t = &j->tasks[k];
            t->handout_dirty = false;
            for (unsigned i = t->out_head; i < t->out_num && t->out_rewrite; i++)
                t->out[i].dirty = false;
            t->out_rewrite = false;
            t->out_saved = t->out_num;
        }
        for (unsigned k = 0; k < j->num_orphans; k++)
            j->orphans[k].dirty = false;
        j->orphans_dirty = false;
        j->listed = false;
    }
    st->num_dirty_jobs = 0;
}

int sl_dpersist_save(sl_dstate_t *st, sl_store_t *store, char *err, size_t errlen)
{
    if (!sl_dpersist_dirty(st))
        return 0;
    sl_store_txn_t *txn = NULL;
    int rc = sl_store_begin(store, &txn);
    if (rc < 0)
        return sl_errf(err, errlen, rc, "state store: cannot begin a transaction: %s", sl_strerror(rc));
    rc = write_dirty(st, txn);
    if (rc < 0) {
        sl_store_abort(txn);
        return sl_errf(err, errlen, rc, "state store: cannot write the changes: %s", sl_strerror(rc));
    }
    rc = sl_store_commit(txn, err, errlen);
    if (rc == 0)
        clear_dirty(st);
    return rc;
}

/* ---- decoding ---- */

struct load {
    sl_dstate_t *st;
    int64_t now;
    enum sl_dtable t;
    const char *table;
    sl_store_visit_fn fn; /* the table's loader */
    char *err;
    size_t errlen;
};

static int bad(struct load *l, uint64_t id, const char *what)
{
    return sl_errf(l->err, l->errlen, SL_EDATA, "state store: %s record %" PRIu64 ": %s", l->table, id, what);
}

/* Parses a record's JSON; *out is NULL and the error set on failure. */
static int parse(struct load *l, const void *key, size_t klen, const void *val, size_t vlen, uint64_t *id,
                 json_t **out)
{
    json_error_t je;
    *id = id_of(key, klen);
    *out = NULL;
    if (*id == 0)
        return bad(l, 0, "a key that is not an id");
    *out = json_loadb(val, vlen, 0, &je);
    if (!*out || !json_is_object(*out)) {
        char what[300];
        snprintf(what, sizeof what, "not a JSON object: %s", *out ? "another type" : je.text);
        json_decref(*out);
        *out = NULL;
        return bad(l, *id, what);
    }
    return 0;
}

static int unpack_failed(struct load *l, uint64_t id, json_t *rec, const json_error_t *je)
{
    json_decref(rec);
    /* A field this build does not know: a newer dispatcher wrote the
     * record, which is not damaged; the start is refused. */
    if (strstr(je->text, "left unpacked"))
        return sl_errf(l->err, l->errlen, SL_EVERSION,
                       "state store: %s record %" PRIu64 ": %s: a field this dispatcher does not know (a newer one "
                       "wrote it: start the newer one, or restore the backup made before the upgrade)", l->table, id,
                       je->text);
    char what[300];
    snprintf(what, sizeof what, "%s", je->text);
    return bad(l, id, what);
}

static int load_dataset(const void *key, size_t klen, const void *val, size_t vlen, void *arg)
{
    struct load *l = arg;
    sl_dstate_t *st = l->st;
    uint64_t id;
    json_t *rec, *files;
    int rc = parse(l, key, klen, val, vlen, &id, &rec);
    if (rc < 0)
        return rc;
    const char *spec, *fp, *name = "";
    json_int_t card, split_size, last_used = -1;
    int hint_op, infinite;
    json_error_t je;
    if (json_unpack_ex(rec, &je, JSON_STRICT, "{s:s,s:s,s:I,s:I,s:i,s:b,s:o,s?I,s?s}", "spec", &spec, "fingerprint",
                       &fp, "cardinality", &card, "split_size", &split_size, "hint_op", &hint_op, "infinite",
                       &infinite, "files", &files, "last_used", &last_used, "name", &name) < 0)
        return unpack_failed(l, id, rec, &je);
    if (!json_is_array(files) || split_size <= 0 || strlen(fp) >= sizeof ((struct dataset *)0)->fingerprint ||
        strlen(name) >= SL_DATASET_NAME_MAX) {
        json_decref(rec);
        return bad(l, id, "files, split_size, fingerprint or name out of range");
    }
    struct dataset *d = calloc(1, sizeof *d);
    size_t nfiles = json_array_size(files);
    if (!d || sl__dstate_grow(&st->datasets, &st->cap_datasets, st->num_datasets, sizeof *st->datasets) < 0)
        goto nomem;
    st->datasets[st->num_datasets++] = d;
    *d = (struct dataset){.id = id, .cardinality = card, .split_size = (uint64_t)split_size, .hint_op = hint_op,
                          .infinite = infinite};
    if (last_used >= 0) {
        /* Unused for as long as the wall clock says (no time of a clock set back); a
         * record of before it was stored leaves 0, which the next tick makes now. */
        int64_t idle = wall_ms() - (int64_t)last_used;
        int64_t at = l->now - (idle > 0 ? idle : 0);
        d->last_used = d->saved_used = at > 0 ? at : 1;
    }
    snprintf(d->fingerprint, sizeof d->fingerprint, "%s", fp);
    snprintf(d->name, sizeof d->name, "%s", name);
    if (!(d->canonical = strdup(spec)))
        goto nomem_in;
    d->passes = spec_passes(spec);
    if (nfiles > 0) {
        d->files.paths = calloc(nfiles, sizeof *d->files.paths);
        d->files.records = calloc(nfiles, sizeof *d->files.records);
        if (!d->files.paths || !d->files.records)
            goto nomem_in;
        for (size_t f = 0; f < nfiles; f++) {
            const char *path;
            json_int_t n;
            if (json_unpack(json_array_get(files, f), "[s,I]", &path, &n) < 0 || n < 0) {
                json_decref(rec);
                return bad(l, id, "files: each entry must be [path, records]");
            }
            if (!(d->files.paths[f] = strdup(path)))
                goto nomem_in;
            d->files.num_files = (int)f + 1;
            d->files.records[f] = (uint64_t)n;
            d->files.total += (uint64_t)n;
        }
    }
    json_decref(rec);
    return 0;
nomem:
    free(d);
nomem_in:
    json_decref(rec);
    return sl_errf(l->err, l->errlen, -ENOMEM, "out of memory loading the state store");
}

static int load_worker(const void *key, size_t klen, const void *val, size_t vlen, void *arg)
{
    struct load *l = arg;
    sl_dstate_t *st = l->st;
    uint64_t id;
    json_t *rec;
    int rc = parse(l, key, klen, val, vlen, &id, &rec);
    if (rc < 0)
        return rc;
    const char *address, *why = "";
    int lost, draining;
    json_error_t je;
    if (json_unpack_ex(rec, &je, JSON_STRICT, "{s:s,s:b,s?s,s:b}", "address", &address, "lost", &lost, "why_lost",
                       &why, "draining", &draining) < 0)
        return unpack_failed(l, id, rec, &je);
    if (sl__dstate_grow(&st->workers, &st->cap_workers, st->num_workers, sizeof *st->workers) < 0) {
        json_decref(rec);
        return sl_errf(l->err, l->errlen, -ENOMEM, "out of memory loading the state store");
    }
    struct worker *w = &st->workers[st->num_workers++];
    *w = (struct worker){.id = id, .state = lost ? WORKER_LOST : WORKER_LIVE, .draining = draining,
                         .joined = l->now, .last_seen = l->now, .unconfirmed = true};
    snprintf(w->address, sizeof w->address, "%s", address);
    snprintf(w->why_lost, sizeof w->why_lost, "%s", why);
    json_decref(rec);
    return 0;
}

static int load_tasks(struct load *l, struct job *j, json_t *tasks)
{
    size_t n = json_array_size(tasks);
    if (n == 0)
        return 0;
    if (!(j->tasks = calloc(n, sizeof *j->tasks)))
        return -ENOMEM;
    j->cap_tasks = (unsigned)n;
    for (size_t k = 0; k < n; k++) {
        json_int_t id, worker, start, end;
        int state, index;
        const char *address;
        json_error_t je;
        if (json_unpack_ex(json_array_get(tasks, k), &je, JSON_STRICT, "{s:I,s:I,s:s,s:i,s:i,s:I,s:I}", "id", &id,
                           "worker", &worker, "address", &address, "state", &state, "index", &index, "start_round",
                           &start, "end_round", &end) < 0 ||
            state < TASK_ASSIGNED || state > TASK_LOST || index < 0)
            return bad(l, j->id, "tasks: a task with missing or out-of-range fields");
        struct task *t = &j->tasks[j->num_tasks++];
        *t = (struct task){.id = (uint64_t)id, .worker_id = (uint64_t)worker, .state = (enum task_state)state,
                           .worker_index = (uint32_t)index, .start_round = (uint64_t)start,
                           .end_round = (uint64_t)end};
        snprintf(t->worker_address, sizeof t->worker_address, "%s", address);
    }
    return 0;
}

static int load_clients(struct load *l, struct job *j, json_t *clients)
{
    size_t n = json_array_size(clients);
    if (n == 0)
        return 0;
    if (!(j->clients = calloc(n, sizeof *j->clients)))
        return -ENOMEM;
    j->cap_clients = (unsigned)n;
    for (size_t k = 0; k < n; k++) {
        json_int_t id, round, start = -1;
        int index, target, late = 0, aligning = 0;
        const char *host;
        json_error_t je;
        if (json_unpack_ex(json_array_get(clients, k), &je, JSON_STRICT, "{s:I,s:i,s:I,s:i,s:s,s?b,s?I,s?b}", "id",
                           &id, "consumer_index", &index, "round", &round, "target", &target, "host", &host, "late",
                           &late, "start_round", &start, "aligning", &aligning) < 0 ||
            index < 0 || target < 0 || target >= SL_TARGET_COUNT_ || start < -1)
            return bad(l, j->id, "clients: a client with missing or out-of-range fields");
        struct client *c = &j->clients[j->num_clients++];
        *c = (struct client){.id = (uint64_t)id, .last_seen = l->now, .progress_at = l->now, .consumer_index = (uint32_t)index,
                             .round = (uint64_t)round, .target = (sl_target_workers_t)target, .late = late,
                             .replaced = start >= 0, .aligning = start >= 0 && aligning,
                             .start_round = start >= 0 ? (uint64_t)start : 0};
        snprintf(c->host, sizeof c->host, "%s", host);
    }
    return 0;
}

/* A coordinated job's gone consumers, [[consumer_index, round]...] (NULL:
 * none), at most max_clients_per_job; gone since the load, so that a
 * restart under way when the dispatcher stopped stays one. */
static int load_gone(struct load *l, struct job *j, json_t *gone)
{
    size_t n = gone ? json_array_size(gone) : 0;
    if (gone && (!json_is_array(gone) || j->num_consumers == 0))
        return bad(l, j->id, "gone: not a list of consumers of coordinated reads");
    if (n > l->st->cfg.max_clients_per_job)
        return sl_errf(l->err, l->errlen, SL_ELIMIT,
                       "state store: %s record %" PRIu64 ": gone: %zu consumers, more than max_clients_per_job %u "
                       "(start with the value it was stored under)", l->table, j->id, n,
                       l->st->cfg.max_clients_per_job);
    if (n == 0)
        return 0;
    if (!(j->gone = calloc(n, sizeof *j->gone)))
        return -ENOMEM;
    j->cap_gone = (unsigned)n;
    for (size_t k = 0; k < n; k++) {
        int index;
        json_int_t round;
        if (json_unpack(json_array_get(gone, k), "[i,I]", &index, &round) < 0 || index < 0 ||
            (uint32_t)index >= j->num_consumers || round < 0)
            return bad(l, j->id, "gone: a consumer with missing or out-of-range fields");
        j->gone[j->num_gone++] = (struct gone_consumer){.consumer_index = (uint32_t)index,
                                                        .round = (uint64_t)round, .since = l->now};
    }
    return 0;
}

/* 64 hex digits into 32 bytes. @return 0 or -1 */
static int hex_digest(const char *hex, uint8_t out[32])
{
    if (strlen(hex) != 64)
        return -1;
    for (int i = 0; i < 32; i++) {
        unsigned v = 0;
        for (int k = 0; k < 2; k++) {
            char c = hex[2 * i + k];
            unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0') : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10) : 16;
            if (d > 15)
                return -1;
            v = v * 16 + d;
        }
        out[i] = (uint8_t)v;
    }
    return 0;
}

static int load_job(const void *key, size_t klen, const void *val, size_t vlen, void *arg)
{
    struct load *l = arg;
    sl_dstate_t *st = l->st;
    uint64_t id;
    json_t *rec, *tasks, *clients, *gone = NULL;
    int rc = parse(l, key, klen, val, vlen, &id, &rec);
    if (rc < 0)
        return rc;
    const char *name, *error, *digest = NULL;
    json_int_t dataset, horizon, report_gen = 0, repetition = -1, ended_at = -1, given_floor = -1, nonce = 0,
               end_epochs = -1, floor_file = 0, floor_record = 0;
    int sharding, effective, consumers, state, collected = 0;
    json_error_t je;
    if (json_unpack_ex(rec, &je, JSON_STRICT,
                       "{s:s,s:I,s:i,s:i,s:i,s:I,s:i,s:s,s:o,s:o,s?I,s?I,s?b,s?I,s?s,s?I,s?I,s?o,s?I,s?I,s?I}", "name",
                       &name, "dataset", &dataset, "sharding", &sharding, "effective", &effective, "num_consumers",
                       &consumers, "round_horizon", &horizon, "state", &state, "error", &error, "tasks", &tasks,
                       "clients", &clients, "report_gen", &report_gen, "repetition", &repetition, "collected",
                       &collected, "ended_at", &ended_at, "restore_digest", &digest, "given_floor", &given_floor,
                       "nonce", &nonce, "gone", &gone, "end_epochs_done", &end_epochs, "given_floor_file", &floor_file,
                       "given_floor_record", &floor_record) < 0)
        return unpack_failed(l, id, rec, &je);
    uint8_t restore_digest[32];
    if (digest && hex_digest(digest, restore_digest) < 0) {
        json_decref(rec);
        return bad(l, id, "its restore_digest is not 64 hex digits");
    }
    struct dataset *d = sl__dstate_dataset(st, (uint64_t)dataset);
    if (!d || !sl_sharding_name((sl_sharding_t)sharding) || !sl_sharding_name((sl_sharding_t)effective) ||
        state < SL_JOB_RUNNING || state > SL_JOB_FAILED || consumers < 0 || !json_is_array(tasks) ||
        !json_is_array(clients) || nonce < 0 || floor_file < 0 || floor_file > UINT32_MAX || floor_record < 0) {
        json_decref(rec);
        return bad(l, id, d ? "a field out of range"
                            : sl__dstate_held_back(st, "dataset", (uint64_t)dataset)
                                ? "its dataset is held back, its record damaged"
                                : "its dataset is not in the store");
    }
    struct job *j = calloc(1, sizeof *j);
    if (!j || sl__dstate_grow(&st->jobs, &st->cap_jobs, st->num_jobs, sizeof *st->jobs) < 0) {
        free(j);
        json_decref(rec);
        return sl_errf(l->err, l->errlen, -ENOMEM, "out of memory loading the state store");
    }
    st->jobs[st->num_jobs++] = j;
    *j = (struct job){.id = id, .nonce = (uint64_t)nonce, .dataset = d, .sharding = (sl_sharding_t)sharding,
                      .effective = (sl_sharding_t)effective, .num_consumers = (uint32_t)consumers,
                      .round_horizon = (uint64_t)horizon, .started = true, .state = (sl_job_state_t)state,
                      .idle_since = l->now, .created = l->now, .report_gen = (uint64_t)report_gen,
                      .repetition = repetition > 0 ? (uint64_t)repetition : 0, .collected = collected,
                      .restored = digest != NULL, .given_floor_set = given_floor >= 0,
                      .given_floor = {.epoch = given_floor > 0 ? (uint64_t)given_floor : 0,
                                      .file = (uint32_t)floor_file, .pos = (uint64_t)floor_record},
                      .end_epochs_known = end_epochs >= 0, .end_epochs_done = end_epochs > 0 ? (uint64_t)end_epochs : 0};
    if (digest)
        memcpy(j->restore_digest, restore_digest, sizeof restore_digest);
    if (j->state != SL_JOB_RUNNING) {
        /* Ended as long ago as the wall clock says (none of a clock set back). */
        int64_t ago = ended_at >= 0 && wall_ms() > ended_at ? wall_ms() - (int64_t)ended_at : 0;
        j->ended = l->now - ago > 0 ? l->now - ago : 1;
        /* Written before repetitions: its name made a new job at the next join. */
        j->collected |= repetition < 0 && name[0];
    }
    sl_posbits_init(&j->exclude, st->cfg.max_exclude_runs);
    snprintf(j->name, sizeof j->name, "%s", name);
    snprintf(j->error, sizeof j->error, "%s", error);
    rc = load_tasks(l, j, tasks);
    if (rc == 0)
        rc = load_clients(l, j, clients);
    if (rc == 0)
        rc = load_gone(l, j, gone);
    if (rc == 0)
        rc = sl__dstate_index_job(st, j);
    json_decref(rec);
    if (rc == -ENOMEM)
        return sl_errf(l->err, l->errlen, -ENOMEM, "out of memory loading the state store");
    return rc;
}

static int load_cursor(const void *key, size_t klen, const void *val, size_t vlen, void *arg)
{
    struct load *l = arg;
    uint64_t id;
    json_t *rec;
    int rc = parse(l, key, klen, val, vlen, &id, &rec);
    if (rc < 0)
        return rc;
    json_int_t epoch, next, seq, handed;
    int file;
    json_error_t je;
    if (json_unpack_ex(rec, &je, JSON_STRICT, "{s:I,s:i,s:I,s:I,s:I}", "epoch", &epoch, "file", &file, "next",
                       &next, "seq", &seq, "handed", &handed) < 0)
        return unpack_failed(l, id, rec, &je);
    json_decref(rec);
    struct job *j = sl__dstate_job(l->st, id);
    if (!j || file < 0)
        return bad(l, id, j ? "file out of range" : "its job is not in the store");
    j->split_epoch = (uint64_t)epoch;
    j->split_file = (uint32_t)file;
    j->split_next = (uint64_t)next;
    j->split_seq = (uint64_t)seq;
    j->split_epoch_handed = (uint64_t)handed;
    return 0;
}

static int load_handout(const void *key, size_t klen, const void *val, size_t vlen, void *arg)
{
    struct load *l = arg;
    uint64_t id;
    json_t *rec, *splits, *skips = NULL;
    int rc = parse(l, key, klen, val, vlen, &id, &rec);
    if (rc < 0)
        return rc;
    json_int_t seq, epoch;
    int eoe, finished;
    json_error_t je;
    if (json_unpack_ex(rec, &je, JSON_STRICT, "{s:I,s:I,s:b,s:b,s:o,s?o}", "seq", &seq, "epoch", &epoch,
                       "end_of_epoch", &eoe, "finished", &finished, "splits", &splits, "skips", &skips) < 0)
        return unpack_failed(l, id, rec, &je);
    if ((skips && !json_is_array(skips)) || json_array_size(skips) * 16 > l->st->cfg.max_skip_bytes) {
        json_decref(rec);
        return bad(l, id, "skips out of range");
    }
    struct job *tj;
    struct task *t = sl__dstate_task(l->st, id, &tj);
    size_t max = pb_arraysize(sluice_GetSplitResponse, splits), n = json_array_size(splits);
    if (!t || !json_is_array(splits) || n > max) {
        json_decref(rec);
        return bad(l, id, t ? "splits out of range" : "its task is not in the store");
    }
    struct last_answer *r = calloc(1, sizeof *r + n * sizeof r->splits[0]);
    if (!r) {
        json_decref(rec);
        return sl_errf(l->err, l->errlen, -ENOMEM, "out of memory loading the state store");
    }
    r->epoch = (uint64_t)epoch;
    r->end_of_epoch = eoe;
    r->finished = finished;
    size_t nskips = json_array_size(skips);
    for (size_t i = 0; i < json_array_size(splits); i++) {
        json_int_t sid, begin, end, soff = 0, scount = 0;
        int file;
        json_t *sp = json_array_get(splits, i);
        int unpacked = json_array_size(sp) == 4 ? json_unpack(sp, "[I,i,I,I]", &sid, &file, &begin, &end)
                                                : json_unpack(sp, "[I,i,I,I,I,I]", &sid, &file, &begin, &end, &soff,
                                                              &scount);
        if (unpacked < 0 ||
            file < 0 || soff < 0 || scount < 0 || (size_t)soff / 16 + (size_t)scount > nskips) {
            free(r);
            json_decref(rec);
            return bad(l, id, "splits: each must be [id, file, begin, end, skip_offset, skip_count]");
        }
        r->splits[r->num++] = (sluice_Split){.split_id = (uint64_t)sid, .file_index = (uint32_t)file,
                                                      .begin = (uint64_t)begin, .end = (uint64_t)end,
                                                      .skip_offset = (uint64_t)soff, .skip_count = (uint64_t)scount};
    }
    uint8_t *sk = nskips ? malloc(l->st->cfg.max_skip_bytes) : NULL;
    for (size_t i = 0; sk && i < nskips; i++) {
        json_int_t b, n;
        if (json_unpack(json_array_get(skips, i), "[I,I]", &b, &n) < 0) {
            free(sk);
            free(r);
            json_decref(rec);
            return bad(l, id, "skips: each must be [begin, count]");
        }
        sl_put_le64(sk + 16 * i, (uint64_t)b);
        sl_put_le64(sk + 16 * i + 8, (uint64_t)n);
    }
    json_decref(rec);
    if (nskips && !sk) {
        free(r);
        return sl_errf(l->err, l->errlen, -ENOMEM, "out of memory loading the state store");
    }
    free(t->last_skips);
    t->last_skips = sk;
    t->last_skips_len = nskips * 16;
    free(t->last_splits);
    t->last_splits = r;
    t->split_req_seq = (uint64_t)seq;
    return 0;
}

static int load_exclusions(const void *key, size_t klen, const void *val, size_t vlen, void *arg)
{
    struct load *l = arg;
    uint64_t id = id_of(key, klen);
    struct job *j = sl__dstate_job(l->st, id);
    if (!j)
        return bad(l, id, "its job is not in the store");
    if (j->state != SL_JOB_RUNNING)
        return 0; /* an ended job's, stored before they were deleted at its end: not needed */
    char why[256];
    int rc = sl_posbits_decode(&j->exclude, val, vlen, why, sizeof why);
    if (rc == -ENOSPC) {
        /* Stored under a larger --max-exclude-runs than this start has:
         * the start is refused, the record is not damaged. */
        return sl_errf(l->err, l->errlen, SL_ELIMIT,
                       "state store: %s record %" PRIu64 ": %s (--max-exclude-runs %u: start with the value it "
                       "was stored under)", l->table, id, why, l->st->cfg.max_exclude_runs);
    }
    return rc < 0 ? bad(l, id, why) : 0;
}

static int load_outstanding(const void *key, size_t klen, const void *val, size_t vlen, void *arg)
{
    struct load *l = arg;
    const uint8_t *v = val;
    uint64_t job = klen == 16 ? id_of(key, 8) : 0, split = klen == 16 ? id_of((const uint8_t *)key + 8, 8) : 0;
    if (klen != 16)
        return sl_errf(l->err, l->errlen, SL_EDATA, "state store: outstanding record with a %zu-byte key", klen);
    uint32_t word = vlen >= OSPLIT_HEAD ? sl_get_le32(v + 44) : 0, form = word & ~OSPLIT_GIVEN_BACK;
    if (form > 1)
        return sl_errf(l->err, l->errlen, SL_EVERSION,
                       "state store: outstanding record of job %" PRIu64 " split %" PRIu64 ": form %" PRIu32
                       ", which this dispatcher does not know (a newer one wrote it, or the record is damaged: "
                       "start the newer one, or restore the backup made before the upgrade)", job, split, form);
    if (vlen < OSPLIT_HEAD ||
        (form == 0 && ((vlen - OSPLIT_HEAD) % 16 != 0 || sl_get_le32(v + 40) != (vlen - OSPLIT_HEAD) / 16)) ||
        (form == 1 && sl_get_le32(v + 40) != 0))
        return sl_errf(l->err, l->errlen, SL_EDATA,
                       "state store: outstanding record of job %" PRIu64 " split %" PRIu64 ": %zu bytes of form %"
                       PRIu32 ", not the length its run count says", job, split, vlen, form);
    struct osplit o = {.id = split, .task_id = sl_get_le64(v), .epoch = sl_get_le64(v + 8),
                       .begin = sl_get_le64(v + 16), .end = sl_get_le64(v + 24), .file = sl_get_le32(v + 32)};
    uint32_t state = sl_get_le32(v + 36);
    struct job *tj = NULL;
    struct job *j = sl__dstate_job(l->st, job);
    struct task *t = sl__dstate_task(l->st, o.task_id, &tj);
    /* Records a leaving client gave back are orphans of no task until
     * handed out again (queued orphans of task 0 were all such before the
     * flag). */
    bool no_task = o.task_id == 0 && state == OS_QUEUED;
    o.given_back = no_task || (word & OSPLIT_GIVEN_BACK);
    if (!j || j->state != SL_JOB_RUNNING || (!no_task && (!t || tj != j)))
        return 0; /* left by a deletion that did not reach the store: the job or task is gone */
    if (state > OS_QUEUED || o.begin >= o.end)
        return sl_errf(l->err, l->errlen, SL_EDATA,
                       "state store: outstanding record of job %" PRIu64 " split %" PRIu64 ": state %" PRIu32
                       " or range [%" PRIu64 ", %" PRIu64 ") out of range", job, split, state, o.begin, o.end);
    o.state = (enum osplit_state)state;
    uint32_t runs = sl_get_le32(v + 40);
    int rc = 0;
    char why[200] = "";
    if (runs > 0 || form == 1) {
        o.have = malloc(sizeof *o.have);
        if (!o.have)
            return sl_errf(l->err, l->errlen, -ENOMEM, "out of memory loading the state store");
        sl_posbits_init(o.have, sl__out_have_units(o.begin, o.end));
        for (uint32_t i = 0; i < runs && rc == 0; i++) {
            uint64_t b = sl_get_le64(v + OSPLIT_HEAD + 16 * i), n = sl_get_le64(v + OSPLIT_HEAD + 16 * i + 8);
            sl_posrun_t r = {(uint32_t)o.epoch, o.file, b, n};
            rc = n == 0 || b < o.begin || b > o.end || n > o.end - b ? SL_EDATA : sl_posbits_add_many(o.have, &r, 1);
        }
        if (form == 1 && (rc = sl_posbits_decode(o.have, v + OSPLIT_HEAD, vlen - OSPLIT_HEAD, why, sizeof why)) == 0 &&
            sl_posbits_count(o.have, (uint32_t)o.epoch, o.file, o.begin, o.end) != sl_posbits_size(o.have))
            rc = SL_EDATA;
        if (rc == -ENOSPC)
            rc = SL_EDATA; /* more than the split can hold */
    }
    if (rc == 0 && o.state == OS_OUT) {
        rc = sl__dstate_grow(&t->out, &t->out_cap, t->out_num, sizeof *t->out);
        if (rc == 0) {
            t->out[t->out_num++] = o;
            t->out_saved = t->out_num;
            t->out_given_back += o.given_back;
        }
    } else if (rc == 0) {
        rc = sl__dstate_grow(&j->orphans, &j->cap_orphans, j->num_orphans, sizeof *j->orphans);
        if (rc == 0)
            j->orphans[j->num_orphans++] = o;
    }
    if (rc < 0) {
        if (o.have) {
            sl_posbits_clear(o.have);
            free(o.have);
        }
        return rc == -ENOMEM ? sl_errf(l->err, l->errlen, -ENOMEM, "out of memory loading the state store")
                             : sl_errf(l->err, l->errlen, SL_EDATA,
                                       "state store: outstanding record of job %" PRIu64 " split %" PRIu64
                                       ": %s", job, split, why[0] ? why : "a run of what the consumers have is empty, "
                                       "overlapping or outside the split");
    }
    return 0;
}

static int load_meta(const void *key, size_t klen, const void *val, size_t vlen, void *arg)
{
    struct load *l = arg;
    if (klen == 7 && memcmp(key, "next_id", 7) == 0) {
        if (vlen != 8)
            return sl_errf(l->err, l->errlen, SL_EDATA, "state store: dispatcher record next_id: not 8 bytes");
        uint64_t next = id_of(val, vlen);
        if (next > l->st->next_id)
            l->st->next_id = next;
    } else if (klen == 6 && memcmp(key, "secret", 6) == 0) {
        if (vlen != sizeof l->st->secret)
            return sl_errf(l->err, l->errlen, SL_EDATA, "state store: dispatcher record secret: not %zu bytes",
                           sizeof l->st->secret);
        memcpy(l->st->secret, val, sizeof l->st->secret);
        l->st->secret_dirty = false;
    }
    return 0;
}

/* ---- damaged records ---- */

/* What a record of l's table holds back when it cannot be read: its kind
 * and id (a hand-out's, its task's job; NULL for a hand-out of no task
 * loaded, which is not read). */
static const char *held_kind(const struct load *l, const void *key, size_t klen, uint64_t *id)
{
    *id = id_of(key, klen == 16 && l->t == SL_DT_OUTSTANDING ? 8 : klen);
    struct job *j = NULL;
    switch (l->t) {
    case SL_DT_DATASETS:
        return "dataset";
    case SL_DT_WORKERS:
        return "worker";
    case SL_DT_HANDOUTS:
        if (!sl__dstate_task(l->st, *id, &j) || !j)
            return NULL;
        *id = j->id;
        return "job";
    default:
        return "job";
    }
}

/* The name and repetition of job id, from what was read of it, or else
 * from its damaged record when that still says them. */
static void held_name(struct load *l, struct quarantined *q, const void *val, size_t vlen)
{
    for (unsigned i = 0; i < l->st->num_jobs; i++) {
        const struct job *j = l->st->jobs[i];
        if (j->id == q->id) {
            q->named = j->name[0] != 0;
            snprintf(q->name, sizeof q->name, "%s", j->name);
            q->repetition = j->repetition;
            return;
        }
    }
    json_t *rec = l->t == SL_DT_JOBS ? json_loadb(val, vlen, 0, NULL) : NULL;
    const char *name = json_string_value(json_object_get(rec, "name"));
    json_int_t rep = json_integer_value(json_object_get(rec, "repetition"));
    if (name && name[0] && strlen(name) < sizeof q->name && rep >= 0) {
        q->named = true;
        snprintf(q->name, sizeof q->name, "%s", name);
        q->repetition = (uint64_t)rep;
    }
    json_decref(rec);
}

/* A record that cannot be read (l->err says why) holds back what it is
 * of: the rest of it (a job's or dataset's) is forgotten, and every record
 * of it is left in the store as it is. @return 0, or < 0: too many */
static int hold_back(struct load *l, const char *kind, uint64_t id, const void *val, size_t vlen)
{
    sl_dstate_t *st = l->st;
    if (st->num_quarantine >= SL_QUARANTINE_MAX) {
        size_t at = strlen(l->err);
        snprintf(l->err + at, l->errlen - at, " (and %u damaged records before it, the most a start holds back: "
                 "restore the state store's backup)", st->num_quarantine);
        return SL_EDATA;
    }
    if (sl__dstate_grow(&st->quarantine, &st->cap_quarantine, st->num_quarantine, sizeof *st->quarantine) < 0)
        return sl_errf(l->err, l->errlen, -ENOMEM, "out of memory loading the state store");
    struct quarantined *q = &st->quarantine[st->num_quarantine++];
    *q = (struct quarantined){.table = l->table, .kind = kind, .id = id};
    snprintf(q->why, sizeof q->why, "%s", l->err);
    if (strcmp(kind, "job") == 0) {
        held_name(l, q, val, vlen);
        sl__dstate_forget_job(st, id);
    } else if (strcmp(kind, "dataset") == 0) {
        sl__dstate_forget_dataset(st, id);
    }
    sl_log_warn("%s: %s %" PRIu64 " is held back, its records left in the store as they are "
                "(GET /v1/quarantine; docs/fault-tolerance.md, Damaged records)", q->why, kind, id);
    l->err[0] = 0;
    return 0;
}

/* Loads one record with the table's loader; one that is damaged (SL_EDATA)
 * holds back what it is of, and the records of what is held back are not
 * read. Any other failure (memory, a bound or format of this start's) ends
 * the load. */
static int load_record(const void *key, size_t klen, const void *val, size_t vlen, void *arg)
{
    struct load *l = arg;
    if (l->t == SL_DT_META)
        return l->fn(key, klen, val, vlen, arg); /* the dispatcher's own: none is held back */
    uint64_t id;
    const char *kind = held_kind(l, key, klen, &id);
    /* A hand-out of no task loaded is of a job held back, or one whose
     * records an operator deleted (DELETE /v1/quarantine/...): it would
     * answer nothing. */
    if (!kind || sl__dstate_held_back(l->st, kind, id))
        return 0;
    int rc = l->fn(key, klen, val, vlen, arg);
    if (rc != SL_EDATA)
        return rc;
    return hold_back(l, kind, id, val, vlen);
}

int sl_dpersist_load(sl_dstate_t *st, sl_store_t *store, int64_t now, char *err, size_t errlen)
{
    struct load l = {.st = st, .now = now, .err = err, .errlen = errlen};
    if (now > st->now)
        st->now = now; /* the clock datasets' last use is loaded on */
    /* A store without a secret (new, or written before there was one)
     * gets the one st has at the next commit. */
    st->secret_dirty = true;
    static const struct {
        enum sl_dtable table;
        sl_store_visit_fn fn;
    } order[] = {{SL_DT_DATASETS, load_dataset}, {SL_DT_WORKERS, load_worker}, {SL_DT_JOBS, load_job},
                 {SL_DT_CURSORS, load_cursor},   {SL_DT_HANDOUTS, load_handout}, {SL_DT_META, load_meta},
                 {SL_DT_EXCLUDE, load_exclusions}, {SL_DT_OUTSTANDING, load_outstanding}};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        l.t = order[i].table;
        l.table = table_names[order[i].table];
        l.fn = order[i].fn;
        int rc = sl_store_foreach(store, order[i].table, load_record, &l);
        if (rc < 0)
            return rc;
    }
    /* An id below one already used would name two things (one held back
     * too). */
    uint64_t max = 0;
    for (unsigned i = 0; i < st->num_quarantine; i++)
        max = st->quarantine[i].id > max ? st->quarantine[i].id : max;
    for (unsigned i = 0; i < st->num_datasets; i++)
        max = st->datasets[i]->id > max ? st->datasets[i]->id : max;
    for (unsigned i = 0; i < st->num_workers; i++)
        max = st->workers[i].id > max ? st->workers[i].id : max;
    for (unsigned i = 0; i < st->num_jobs; i++) {
        const struct job *j = st->jobs[i];
        max = j->id > max ? j->id : max;
        for (unsigned k = 0; k < j->num_tasks; k++)
            max = j->tasks[k].id > max ? j->tasks[k].id : max;
        for (unsigned k = 0; k < j->num_clients; k++)
            max = j->clients[k].id > max ? j->clients[k].id : max;
    }
    if (st->next_id <= max)
        st->next_id = max + 1;
    /* Clients that reported before the restart are not known to have: they
     * are asked again, under a new generation. */
    for (unsigned i = 0; i < st->num_jobs; i++) {
        struct job *j = st->jobs[i];
        for (unsigned k = 0; k < j->num_orphans; k++)
            if (j->orphans[k].state == OS_AWAIT) {
                j->report_gen++;
                j->dirty = true;
                sl__dstate_touch(st, j);
                break;
            }
    }
    st->saved_next_id = st->next_id;
    if (st->num_jobs > 0 || st->num_workers > 0 || st->num_quarantine > 0)
        sl_log_info("state store loaded: %u datasets, %u workers, %u jobs", st->num_datasets, st->num_workers,
                    st->num_jobs);
    if (st->num_quarantine > 0)
        sl_log_warn("state store: %u damaged records, what they are of held back (GET /v1/quarantine)",
                    st->num_quarantine);
    return 0;
}

int sl_dpersist_reload(sl_dstate_t *st, sl_store_t *store, int64_t now, char *err, size_t errlen)
{
    sl_dstate_reset(st);
    return sl_dpersist_load(st, store, now, err, errlen);
}
