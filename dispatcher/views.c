/*
 * views.c: the dispatcher's state as the admin API shows it (JSON for
 * GET /v1/workers, /v1/datasets, /v1/jobs; docs/admin-api.md). Reads the
 * state, changes nothing.
 */
#include "state.h"
#include "state_types.h"

#include <inttypes.h>
#include <stdbool.h>
#include <string.h>

#include <jansson.h>

#include "outstanding.h"

static const char *worker_state_name(const struct worker *w)
{
    return w->state == WORKER_LOST ? "LOST" : w->draining ? "DRAINING" : "LIVE";
}

/* DYNAMIC: what w's tasks asked for, which a new job of one of these
 * datasets hands out ahead (sl__dstate_first_splits()); in memory only. */
static void add_split_lengths(json_t *o, const struct worker *w)
{
    if (w->first_max_splits)
        json_object_set_new(o, "first_request_splits", json_integer(w->first_max_splits));
    json_t *lengths = json_array();
    for (unsigned i = 0; i < SL_WORKER_RATES; i++) {
        const struct worker_rate *r = &w->rates[(w->rates_next + i) % SL_WORKER_RATES];
        if (r->split_records > 0)
            json_array_append_new(lengths, json_pack("{s:I,s:I}", "dataset_id", (json_int_t)r->dataset_id,
                                                     "split_records", (json_int_t)r->split_records));
    }
    if (json_array_size(lengths) > 0)
        json_object_set_new(o, "split_lengths", lengths);
    else
        json_decref(lengths);
}

json_t *sl_dstate_workers_json(const sl_dstate_t *st, int64_t now)
{
    json_t *arr = json_array();
    for (unsigned i = 0; i < st->num_workers; i++) {
        const struct worker *w = &st->workers[i];
        unsigned tasks = 0;
        for (unsigned k = 0; k < st->num_jobs; k++) {
            const struct job *j = st->jobs[k];
            for (unsigned t = 0; t < j->num_tasks; t++)
                tasks += j->state == SL_JOB_RUNNING && j->tasks[t].worker_id == w->id && sl__task_live(&j->tasks[t]);
        }
        json_array_append_new(arr, json_pack("{s:I,s:s,s:s,s:I,s:I,s:I}", "id", (json_int_t)w->id, "address",
                                             w->address, "state", worker_state_name(w), "active_tasks",
                                             (json_int_t)tasks, "last_heartbeat_ms_ago",
                                             (json_int_t)(now - w->last_seen), "uptime_ms",
                                             (json_int_t)(now - w->joined)));
        json_t *o = json_array_get(arr, json_array_size(arr) - 1);
        if (w->state == WORKER_LOST)
            json_object_set_new(o, "lost_reason", json_string(w->why_lost));
        add_split_lengths(o, w);
    }
    return arr;
}

static json_t *dataset_json(const sl_dstate_t *st, const struct dataset *d, bool with_spec)
{
    /* unused_ms: since a running job last read it (--dataset-gc-timeout-ms). */
    json_t *o = json_pack("{s:I,s:s,s:I,s:I}", "id", (json_int_t)d->id, "fingerprint", d->fingerprint, "cardinality",
                          (json_int_t)d->cardinality, "unused_ms",
                          (json_int_t)(d->last_used > 0 && st->now > d->last_used ? st->now - d->last_used : 0));
    if (d->name[0])
        json_object_set_new(o, "name", json_string(d->name));
    if (with_spec) {
        json_t *spec = json_loads(d->canonical, 0, NULL);
        json_object_set_new(o, "spec", spec ? spec : json_null());
    }
    return o;
}

json_t *sl_dstate_datasets_json(const sl_dstate_t *st)
{
    json_t *arr = json_array();
    for (unsigned i = 0; i < st->num_datasets; i++)
        json_array_append_new(arr, dataset_json(st, st->datasets[i], false));
    return arr;
}

json_t *sl_dstate_dataset_json(const sl_dstate_t *st, uint64_t id)
{
    const struct dataset *d = sl__dstate_dataset(st, id);
    return d ? dataset_json(st, d, true) : NULL;
}

/* A count a peer said, as JSON's integer: past INT64_MAX it reads INT64_MAX. */
static json_int_t as_json_int(uint64_t v)
{
    return v > INT64_MAX ? INT64_MAX : (json_int_t)v;
}

static json_t *job_json(const struct job *j, int64_t now, bool detail)
{
    uint64_t elements = 0, bytes = 0, batches = 0;
    unsigned done = 0;
    for (unsigned t = 0; t < j->num_tasks; t++) {
        elements += j->tasks[t].elements;
        bytes += j->tasks[t].bytes;
        batches += j->tasks[t].batches;
        done += j->tasks[t].state == TASK_DONE;
    }
    json_t *o = json_pack("{s:I,s:s,s:I,s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "id", (json_int_t)j->id, "name",
                          j->name, "dataset_id", (json_int_t)j->dataset->id, "sharding",
                          sl_sharding_name(j->sharding), "state", sl__job_state_names[j->state], "tasks",
                          (json_int_t)j->num_tasks, "tasks_done", (json_int_t)done, "num_consumers",
                          (json_int_t)j->num_clients, "elements_served", (json_int_t)elements, "bytes_served",
                          (json_int_t)bytes, "batches_served", (json_int_t)batches, "age_ms",
                          (json_int_t)(now - j->created));
    if (j->error[0])
        json_object_set_new(o, "error", json_string(j->error));
    if (j->name[0]) {
        json_object_set_new(o, "repetition", json_integer((json_int_t)j->repetition));
        json_object_set_new(o, "collected", json_boolean(j->collected));
    }
    if (j->state != SL_JOB_RUNNING && j->ended > 0)
        json_object_set_new(o, "ended_ms_ago", json_integer((json_int_t)(now > j->ended ? now - j->ended : 0)));
    if (j->effective != j->sharding)
        json_object_set_new(o, "sharding_resolved", json_string(sl_sharding_name(j->effective)));
    if (j->num_consumers > 0)
        json_object_set_new(o, "coordinated", json_pack("{s:I,s:I}", "num_consumers", (json_int_t)j->num_consumers,
                                                        "round_horizon", (json_int_t)j->round_horizon));
    if (j->sharding == SL_SHARDING_DYNAMIC) {
        uint64_t records = sl__dataset_records(j->dataset);
        uint64_t left = sl__job_records_left(j);
        json_t *splits = json_pack("{s:I,s:I,s:I,s:I,s:I}", "epoch", (json_int_t)j->split_epoch, "handed_out",
                                   (json_int_t)j->split_epoch_handed, "handed_out_all_epochs", (json_int_t)j->split_seq,
                                   "records_handed_out", (json_int_t)(records - left), "records", (json_int_t)records);
        if (sl__out_tracked(j) && j->state == SL_JOB_RUNNING)
            json_object_set_new(splits, "epochs_done", json_integer((json_int_t)sl__out_epochs_done(j)));
        else if (j->end_epochs_known)
            json_object_set_new(splits, "epochs_done", json_integer((json_int_t)j->end_epochs_done));
        json_object_set_new(o, "splits", splits);
    }
    if (sl__out_tracked(j)) {
        /* Exactly once across worker losses (docs/fault-tolerance.md). */
        unsigned outstanding = 0, waiting = 0, queued = 0;
        for (unsigned t = 0; t < j->num_tasks; t++)
            outstanding += sl__out_count(&j->tasks[t]);
        for (unsigned i = 0; i < j->num_orphans; i++) {
            waiting += j->orphans[i].state == OS_AWAIT;
            queued += j->orphans[i].state == OS_QUEUED;
        }
        json_t *lost = json_pack("{s:I,s:I,s:I,s:I}", "outstanding", (json_int_t)outstanding, "awaiting_reports",
                                 (json_int_t)waiting, "queued", (json_int_t)queued, "report_gen",
                                 (json_int_t)j->report_gen);
        if (j->state == SL_JOB_RUNNING) {
            struct sl_place at = sl__out_confirmed_below(j);
            json_object_set_new(lost, "confirmed_below", json_pack("[I,I,I]", (json_int_t)at.epoch,
                                                                   (json_int_t)at.file, (json_int_t)at.pos));
        }
        if (j->state == SL_JOB_RUNNING && j->name[0]) {
            /* A named job's fold: what its clients' ledgers keep nothing before. */
            struct sl_place f = sl__job_folded(j);
            json_object_set_new(lost, "folded_below", json_pack("[I,I,I]", (json_int_t)f.epoch, (json_int_t)f.file,
                                                                (json_int_t)f.pos));
            /* The place no fold passes: a client left without giving back
             * every record it had not given (state.c, leave_given()). */
            if (j->given_floor_set)
                json_object_set_new(lost, "held_below",
                                    json_pack("[I,I,I]", (json_int_t)j->given_floor.epoch,
                                              (json_int_t)j->given_floor.file, (json_int_t)j->given_floor.pos));
        }
        json_object_set_new(o, "lost_splits", lost);
    }
    if (!detail)
        return o;
    json_t *consumers = json_array();
    for (unsigned c = 0; c < j->num_clients; c++) {
        const struct client *cl = &j->clients[c];
        json_t *co = json_pack("{s:I,s:I,s:s}", "client_id", (json_int_t)cl->id, "last_heartbeat_ms_ago",
                               (json_int_t)(now - cl->last_seen), "state",
                               cl->away_since ? "away" : cl->stalled_since ? "stalled" : "present");
        if (j->num_consumers > 0) {
            /* Coordinated reads: the consumer with the lowest round is the
             * one the others wait for once they reach the open rounds'
             * bound on the workers. */
            json_object_set_new(co, "consumer_index", json_integer(cl->consumer_index));
            json_object_set_new(co, "round", json_integer((json_int_t)cl->round));
            if (cl->replaced) /* the first round it handed its caller */
                json_object_set_new(co, "start_round", json_integer((json_int_t)cl->start_round));
        }
        if (j->name[0] && sl__out_tracked(j)) /* how far it said its caller was given what reached it */
            json_object_set_new(co, "given_below", json_pack("[I,I,I]", (json_int_t)cl->given.epoch,
                                                             (json_int_t)cl->given.file, (json_int_t)cl->given.pos));
        if (cl->ledger_max_runs > 0) { /* its record of what reached it, against its bound */
            json_object_set_new(co, "ledger_runs", json_integer(as_json_int(cl->ledger_runs)));
            json_object_set_new(co, "ledger_max_runs", json_integer(as_json_int(cl->ledger_max_runs)));
        }
        if (sl__out_tracked(j)) { /* how far each task's splits reached it, as it said (TaskProgress) */
            json_t *db = json_object();
            for (unsigned k = 0; k < cl->num_progress; k++) {
                char id[24];
                snprintf(id, sizeof id, "%" PRIu64, cl->progress[k].task_id);
                json_object_set_new(db, id, json_integer(as_json_int(cl->progress[k].done_below)));
            }
            json_object_set_new(co, "done_below", db);
        }
        if (cl->away_since)
            json_object_set_new(co, "away_ms", json_integer(now - cl->away_since));
        else if (cl->stalled_since)
            json_object_set_new(co, "stalled_ms", json_integer(now - cl->stalled_since));
        json_array_append_new(consumers, co);
    }
    json_object_set_new(o, "consumers", consumers);
    if (j->num_consumers > 0) {
        /* Consumer indexes whose client left while the job ran: the next
         * client of one starts at its round. */
        json_t *gone = json_array();
        for (unsigned g = 0; g < j->num_gone; g++)
            json_array_append_new(gone, json_pack("{s:I,s:I,s:I}", "consumer_index",
                                                  (json_int_t)j->gone[g].consumer_index, "round",
                                                  (json_int_t)j->gone[g].round, "gone_ms",
                                                  (json_int_t)(now - j->gone[g].since)));
        json_object_set_new(o, "gone", gone);
    }
    json_t *tasks = json_array();
    for (unsigned t = 0; t < j->num_tasks; t++) {
        const struct task *tk = &j->tasks[t];
        json_array_append_new(tasks, json_pack("{s:I,s:I,s:s,s:s,s:I,s:I,s:I,s:f}", "task_id", (json_int_t)tk->id,
                                               "worker_id", (json_int_t)tk->worker_id, "worker_address",
                                               tk->worker_address, "state", sl__task_state_names[tk->state], "batches",
                                               (json_int_t)tk->batches, "elements", (json_int_t)tk->elements, "bytes",
                                               (json_int_t)tk->bytes, "bytes_per_second", tk->bytes_per_s));
        json_object_set_new(json_array_get(tasks, t), "worker_index", json_integer(tk->worker_index));
        if (j->sharding == SL_SHARDING_DYNAMIC)
            json_object_set_new(json_array_get(tasks, t), "split_requests",
                                json_integer((json_int_t)tk->split_req_seq));
        if (sl__out_tracked(j)) {
            json_t *to = json_array_get(tasks, t);
            json_object_set_new(to, "outstanding_splits", json_integer(sl__out_count(tk)));
            /* Which client holds it back: each consumer's done_below
             * against the oldest it holds and what its worker finished. */
            if (sl__out_count(tk) > 0)
                json_object_set_new(to, "oldest_outstanding", json_integer(as_json_int(sl__out_oldest(tk))));
            json_object_set_new(to, "worker_done_below", json_integer(as_json_int(tk->worker_done_below)));
            json_object_set_new(to, "worker_received_below", json_integer(as_json_int(tk->received_below)));
            /* Past the batches its worker lost (null: none lost). */
            json_object_set_new(to, "worker_lost_below",
                                tk->lost_below ? json_integer(as_json_int(tk->lost_below)) : json_null());
            json_object_set_new(to, "worker_received_past_lost",
                                tk->lost_below ? json_integer(as_json_int(tk->received_past)) : json_null());
        }
        if (j->num_consumers > 0) {
            /* The rounds it serves, [start, end); a lost worker's end is set
             * when it is lost (docs/sharding.md, "Coordinated reads"). */
            json_t *rounds = json_pack("{s:I}", "start", (json_int_t)tk->start_round);
            if (tk->end_round > 0)
                json_object_set_new(rounds, "end", json_integer((json_int_t)tk->end_round));
            json_object_set_new(json_array_get(tasks, t), "rounds", rounds);
        }
    }
    json_object_set_new(o, "tasks", tasks);
    return o;
}

json_t *sl_dstate_jobs_json(const sl_dstate_t *st, int64_t now)
{
    json_t *arr = json_array();
    for (unsigned i = 0; i < st->num_jobs; i++)
        json_array_append_new(arr, job_json(st->jobs[i], now, false));
    return arr;
}

json_t *sl_dstate_quarantine_json(const sl_dstate_t *st)
{
    json_t *arr = json_array();
    for (unsigned i = 0; i < st->num_quarantine; i++) {
        const struct quarantined *q = &st->quarantine[i];
        json_t *o = json_pack("{s:s,s:s,s:I,s:s}", "table", q->table, "kind", q->kind, "id", (json_int_t)q->id,
                              "why", q->why);
        if (q->named) {
            json_object_set_new(o, "name", json_string(q->name));
            json_object_set_new(o, "repetition", json_integer((json_int_t)q->repetition));
        }
        json_array_append_new(arr, o);
    }
    return json_pack("{s:o,s:i}", "held_back", arr, "limit", SL_QUARANTINE_MAX);
}

json_t *sl_dstate_job_names_json(const sl_dstate_t *st, int64_t now)
{
    json_t *names = json_object();
    for (unsigned i = 0; i < st->num_jobs; i++) {
        const struct job *j = st->jobs[i];
        if (!j->name[0])
            continue;
        json_t *reps = json_object_get(names, j->name);
        if (!reps) {
            reps = json_array();
            json_object_set_new(names, j->name, reps);
        }
        /* In repetition order (jobs are oldest first; a later repetition may
         * have been created first). */
        size_t at = json_array_size(reps);
        while (at > 0 && json_integer_value(json_object_get(json_array_get(reps, at - 1), "repetition")) >
                             (json_int_t)j->repetition)
            at--;
        json_t *r = json_pack("{s:I,s:I,s:s,s:b,s:I}", "repetition", (json_int_t)j->repetition, "job_id",
                              (json_int_t)j->id, "state", sl__job_state_names[j->state], "collected", j->collected,
                              "num_consumers", (json_int_t)j->num_clients);
        if (j->state != SL_JOB_RUNNING && j->ended > 0)
            json_object_set_new(r, "ended_ms_ago", json_integer((json_int_t)(now > j->ended ? now - j->ended : 0)));
        json_array_insert_new(reps, at, r);
    }
    return names;
}

json_t *sl_dstate_job_json(const sl_dstate_t *st, uint64_t id, int64_t now)
{
    for (unsigned i = 0; i < st->num_jobs; i++)
        if (st->jobs[i]->id == id)
            return job_json(st->jobs[i], now, true);
    return NULL;
}
