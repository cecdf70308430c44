/*
 * state.h: the dispatcher's state machine: workers, datasets, jobs, tasks,
 * client leases and DYNAMIC split cursors. No I/O: the server feeds it
 * requests and the clock, and sends what it answers. States and transitions
 * are written down in state.c and docs/architecture.md.
 */
#ifndef SL_DSTATE_H
#define SL_DSTATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "confine.h"
#include "files.h"
#include "frame.h"
#include "posbits.h"
#include "posset.h"
#include "spec.h"

typedef struct sl_dstate sl_dstate_t;


typedef struct sl_dstate_config {
    int64_t worker_timeout_ms; /* a worker without heartbeat this long is lost */
    int64_t stall_timeout_ms;  /* a worker reporting a task stalled this long is lost; 0: never */
    int64_t client_timeout_ms; /* a client without heartbeat this long is away */
    int64_t client_rejoin_ms;  /* an away client is released after this long; until then it
                                  may come back (docs/fault-tolerance.md); 0: at once */
    int64_t client_stall_ms;   /* DYNAMIC: a client that heartbeats but has received nothing new
                                  this long while it holds splits back from its peers is stalled:
                                  like an away client it holds none back until it reads again;
                                  0: never */
    int64_t job_gc_timeout_ms; /* a running job without clients this long is cancelled; an ended
                                  named job without clients this long is collected (a join of its
                                  repetition creates it again) */
    int64_t dataset_gc_timeout_ms; /* a dataset no running job read for this long is deleted (0: never) */
    uint64_t split_size;       /* elements per DYNAMIC split at least (rounded up to the batch size,
                                  see state.c), and for a worker that asks for no size */
    uint64_t max_split_size;   /* elements per DYNAMIC split at most (below split_size: split_size) */
    uint32_t worker_heartbeat_ms;
    uint32_t client_heartbeat_ms;
    unsigned max_workers;
    unsigned max_datasets;
    unsigned max_jobs;            /* jobs kept, finished ones included */
    unsigned max_clients_per_job;
    unsigned max_files;           /* files of one file source */
    const sl_confine_t *roots;    /* where file sources may read; NULL: nowhere */
    const char *worker_addresses; /* "host:port,..." (--worker-addresses) or NULL: the only
                                     workers accepted, each one's index for the static
                                     policies its place here; copied by sl_dstate_new() */
    uint64_t round_lookahead;     /* coordinated reads: rounds a consumer may run ahead of
                                     the dispatcher's last answer (see docs/sharding.md) */
    unsigned max_exclude_runs;    /* runs of a restored iterator's consumed positions, and
                                     of a client's report (at most SL_POSSET_MAX_RUNS) */
    int64_t count_timeout_ms;     /* listing and counting a new file source's records at registration
                                     (off the event loop, counter.h); 0: no limit */
    uint64_t max_exclude_total;   /* runs of restored iterators' positions all running jobs
                                     hold together (memory and the state store; attack 6) */
    unsigned max_skip_bytes;      /* skip runs in one GetSplit answer's payload */
    unsigned max_outstanding;     /* DYNAMIC splits a task may hold that its clients have not all
                                     confirmed; past it the task waits (GetSplitResponse.retry_ms) */
    uint32_t handout_commit_delay_ms; /* a hand-out whose worker can wait (GetSplitRequest.slack_ms)
                                         is committed this long later at most (and within half its
                                         slack), with whatever else comes meanwhile (server.c); 0:
                                         at once, as every other change */
} sl_dstate_config_t;

/** Fills the defaults. */
void sl_dstate_config_init(sl_dstate_config_t *cfg);

/** @return a new empty state (config copied) with a new random secret (the
 *  key of the capabilities it hands out, caps.h; a store's replaces it at
 *  load), or NULL when out of memory, when cfg->worker_addresses lists more
 *  than max_workers addresses, or when the system has no random bytes */
sl_dstate_t *sl_dstate_new(const sl_dstate_config_t *cfg);

void sl_dstate_free(sl_dstate_t *st);

/** Drops every worker, dataset and job (the configuration stays): what a
 *  reload from the state store starts from (persist.h). */
void sl_dstate_reset(sl_dstate_t *st);

/** @return the state's configuration */
const sl_dstate_config_t *sl_dstate_config(const sl_dstate_t *st);

/**
 * A worker (re-)registers. A live worker already registered at the same
 * address is taken as restarted: it is marked lost first.
 * @return 0, or SL_ETOOBIG (max_workers) with a message in err
 */
int sl_dstate_worker_register(sl_dstate_t *st, const char *address, int64_t now, uint64_t *worker_id,
                              char *err, size_t errlen);

/**
 * A worker that reconnects under the id it had: when that id is a live
 * worker at the same address (the dispatcher restarted, or the connection
 * broke), the worker carries on with its tasks.
 * @return 0, or SL_ENOTFOUND: it must register as a new worker
 */
int sl_dstate_worker_resume(sl_dstate_t *st, const char *address, uint64_t worker_id, int64_t now);

/**
 * A worker's heartbeat: takes its task reports and answers the tasks it must
 * start (each TaskDef with its task_key) and the tasks it must drop. The
 * caller checks that req->worker_id is the worker registered over the
 * connection it came on.
 * @return 0, or SL_ENOTFOUND when the worker is unknown or was declared lost
 *         (it must register again), or SL_EPERM when it reports a task that
 *         is another worker's (nothing changes)
 */
int sl_dstate_worker_heartbeat(sl_dstate_t *st, const sluice_WorkerHeartbeatRequest *req, int64_t now,
                               sluice_WorkerHeartbeatResponse *resp, char *err, size_t errlen);

/** What a worker asks the dispatcher about (sl_dstate_worker_may()). */
typedef enum sl_daccess {
    SL_DACCESS_TASK,    /* GET_SPLIT: the task */
    SL_DACCESS_JOB,     /* GET_EXCLUSIONS: the job */
    SL_DACCESS_DATASET, /* GET_DATASET: the dataset */
} sl_daccess_t;

/**
 * Whether the worker registered over a connection (worker_id, 0 for none)
 * may ask about id: a task that is its own (or of the id it had before it
 * registered again, at the same address), a job it has a task of, a
 * dataset one of its tasks reads. Changes nothing.
 * @return 0; SL_EPERM with what was wrong in err; SL_ENOTFOUND when the
 *         worker is unknown (it must register again)
 */
int sl_dstate_worker_may(sl_dstate_t *st, uint64_t worker_id, sl_daccess_t what, uint64_t id, char *err,
                         size_t errlen);

/**
 * Finds or registers the dataset of spec (same canonical spec, same id).
 * @param[out] fingerprint valid while the state is
 * @return 0, SL_ESPEC with the offending field's JSON path in err, SL_ETOOBIG
 */
/**
 * Deletes a dataset that no running job reads, with the ended jobs that
 * read it (the admin endpoint's DELETE /v1/datasets/{id}).
 * @return 0, SL_ENOTFOUND, or SL_ECONFLICT (a running job reads it), with a
 *         message in err
 */
int sl_dstate_dataset_delete(sl_dstate_t *st, uint64_t id, char *err, size_t errlen);

int sl_dstate_dataset_register(sl_dstate_t *st, const char *spec, size_t len, uint64_t *dataset_id,
                               const char **fingerprint, char *err, size_t errlen);

/**
 * As sl_dstate_dataset_register(), with a file source's files already
 * listed and counted (off the event loop, counter.h): *files is taken (and
 * zeroed) when the dataset is new; counted NULL: counted here.
 */
int sl_dstate_dataset_register_counted(sl_dstate_t *st, const char *spec, size_t len, const char *name,
                                       sl_file_list_t *files, uint64_t *dataset_id, const char **fingerprint,
                                       char *err, size_t errlen);

#define SL_DATASET_NAME_MAX 128 /* bytes of a dataset's name, with its NUL */

/**
 * Whether name may name a dataset: 1 to 127 bytes of [A-Za-z0-9_.:/-], not
 * all digits (those are ids). NULL and "" mean no name and pass.
 * @return 0, or SL_EINVAL with the reason in err
 */
int sl_dstate_dataset_name_check(const char *name, char *err, size_t errlen);

/** @return whether the dataset of spec and name (NULL or "": none) is
 *  registered (its registration needs no count of its files), or the name
 *  names another spec's (the registration is refused) */
bool sl_dstate_dataset_known(const sl_dstate_t *st, const sl_spec_t *spec, const char *name);

/**
 * Finds a dataset by id, or (id 0) by name.
 * @param[out] canonical, fingerprint, name_out valid while the state is
 * @return 0, SL_ENOTFOUND with a message in err
 */
int sl_dstate_dataset_lookup(const sl_dstate_t *st, uint64_t id, const char *name, uint64_t *id_out,
                             const char **canonical, const char **fingerprint, const char **name_out, char *err,
                             size_t errlen);

/** @return the canonical spec of a dataset, or NULL; valid while the state is */
const char *sl_dstate_dataset_spec(const sl_dstate_t *st, uint64_t dataset_id);

/**
 * Joins the job named req->job_name, or creates it (or an anonymous job),
 * and leases a client id for the caller (its secret: sl_dstate_job_join()).
 * @return 0, SL_ENOTFOUND (dataset), SL_ECONFLICT (the named job has other
 *         parameters; err names the parameter), SL_EINVAL, SL_ETOOBIG
 */
int sl_dstate_job_get_or_create(sl_dstate_t *st, const sluice_GetOrCreateJobRequest *req, int64_t now,
                                uint64_t *job_id, uint64_t *client_id, char *err, size_t errlen);

/**
 * As sl_dstate_job_get_or_create(), for a client that reaches the
 * dispatcher from client_host (its IP address as the connection shows it;
 * what SL_TARGET_LOCAL compares worker hosts with). Fills resp's job_id,
 * client_id, client_secret and notice. exclude (may be NULL) is a restored iterator's
 * consumed positions (posset.h bytes): they make a new anonymous DYNAMIC job
 * whose splits never hand them out.
 * @return as sl_dstate_job_get_or_create(), and SL_ENOTFOUND when
 *         target_workers is local and no live worker is on client_host;
 *         SL_EINVAL, SL_EDATA for exclusions that do not fit the request
 */
int sl_dstate_job_join(sl_dstate_t *st, const sluice_GetOrCreateJobRequest *req, const char *client_host,
                       const uint8_t *exclude, size_t exclude_len, int64_t now, sluice_GetOrCreateJobResponse *resp,
                       char *err, size_t errlen);

/** The secret of client client_id of job job_id (what job_join answers and
 *  the client's requests must carry), the key of task task_id (what a
 *  TaskDef and a TaskInfo carry), and the secret of worker worker_id (what
 *  its registration answer carries and a reconnect shows): caps.h. */
void sl_dstate_client_secret(const sl_dstate_t *st, uint64_t job_id, uint64_t client_id, uint8_t out[16]);
void sl_dstate_task_key(const sl_dstate_t *st, uint64_t task_id, uint8_t out[16]);
void sl_dstate_worker_secret(const sl_dstate_t *st, uint64_t worker_id, uint8_t out[16]);

/**
 * A client's heartbeat: renews its lease, answers the job's tasks and state
 * (each TaskInfo with its task_key).
 * @return 0; SL_EPERM when req->client_secret is not the client's (checked
 *         first: nothing is looked up, nothing changes); SL_ENOTFOUND when
 *         the job or the lease is gone
 */
int sl_dstate_client_heartbeat(sl_dstate_t *st, const sluice_ClientHeartbeatRequest *req, int64_t now,
                               sluice_ClientHeartbeatResponse *resp, char *err, size_t errlen);

/**
 * A client's report of what it received (DYNAMIC, after a worker loss; the
 * payload is posset.h bytes, see outstanding.h).
 * @return 0, SL_EPERM (a wrong client_secret, as for the heartbeat),
 *         SL_ENOTFOUND (job or lease gone), SL_EDATA with what was wrong in
 *         err, -ENOMEM
 */
int sl_dstate_client_report(sl_dstate_t *st, const sluice_ReportReceivedRequest *req, const uint8_t *payload,
                            size_t len, int64_t now, char *err, size_t errlen);

/** Ends a client's lease. @return 0, SL_EPERM (a wrong client_secret, as
 *  for the heartbeat: the client stays), SL_ENOTFOUND; err says which */
int sl_dstate_client_release(sl_dstate_t *st, const sluice_ReleaseClientRequest *req, int64_t now, char *err,
                             size_t errlen);

/**
 * sl_dstate_client_release() with what a client of a named DYNAMIC job
 * gives back (req->returns; payload is posset.h bytes of the records it
 * received and its caller was not given): they are handed out again to the
 * job's other clients (outstanding.h, sl__out_return()). Returns that
 * cannot be taken are said in resp->returns_error and logged; the client
 * is released all the same. resp may be NULL without returns.
 * @return as sl_dstate_client_release()
 */
int sl_dstate_client_leave(sl_dstate_t *st, const sluice_ReleaseClientRequest *req, const uint8_t *payload,
                           size_t len, int64_t now, sluice_ReleaseClientResponse *resp, char *err, size_t errlen);

/**
 * Hands out DYNAMIC splits of the task's job for an epoch, at now (ms: the
 * other tasks' queues drain from their last answers at their rates).
 * @return 0, SL_ENOTFOUND (task), SL_EINVAL (not DYNAMIC, or an epoch the
 *         job cannot be at)
 */
int sl_dstate_get_splits(sl_dstate_t *st, const sluice_GetSplitRequest *req, int64_t now,
                         sluice_GetSplitResponse *resp, char *err, size_t errlen);

/** The positions a restored iterator's job excludes (empty for any other
 *  job), or NULL when the job is unknown; valid while the state is. */
const sl_posbits_t *sl_dstate_job_exclusions(const sl_dstate_t *st, uint64_t job_id);

/** The skip runs (the payload) of the task's last GetSplit answer, valid
 *  until its next request; NULL when there are none. */
const uint8_t *sl_dstate_split_skips(sl_dstate_t *st, uint64_t task_id, size_t *len);

/** Whether live worker worker_id was given a task that no heartbeat answer
 *  has listed yet, since the last call: the server tells it so once that is
 *  committed (WORKER_NOTICE), so that it heartbeats now rather than at its
 *  interval or when a client first names the task. */
bool sl_dstate_worker_take_notice(sl_dstate_t *st, uint64_t worker_id);

/** Whether some worker was given such a task since the last call: most
 *  commits (a hand-out, a heartbeat) give none, and the server looks for the
 *  workers to tell only when this says so. */
bool sl_dstate_take_notices_due(sl_dstate_t *st);

/** The connection a live worker registered over closed (why): it is lost.
 *  @return whether it was live (the state changed) */
bool sl_dstate_worker_disconnected(sl_dstate_t *st, uint64_t worker_id, const char *why);

/** A frame arrived from some peer at now (what tells the dispatcher it is
 *  not cut off; see sl_dstate_tick()). */
void sl_dstate_heard(sl_dstate_t *st, int64_t now);

/** Applies timeouts: lost workers, expired clients, jobs without clients.
 *  With a live worker that has heartbeated but no frame from any peer
 *  (sl_dstate_heard()) for half the shorter of --worker-timeout-ms and
 *  --client-timeout-ms (at least 4 heartbeat intervals), the
 *  dispatcher takes itself to be cut off: nothing expires until a frame
 *  comes, and then every live worker's and client's lease starts afresh. */
void sl_dstate_tick(sl_dstate_t *st, int64_t now);

/**
 * Cancels a running job: its clients get SL_ECANCELLED with why, its
 * workers drop its tasks.
 * @return 0, SL_ENOTFOUND, SL_EINVAL (the job already ended)
 */
int sl_dstate_job_cancel(sl_dstate_t *st, uint64_t job_id, const char *why, char *err, size_t errlen);

/**
 * Drains the live worker at address: it gets no new task and no more
 * DYNAMIC splits; the splits it has not taken go to the other workers.
 * @return 0 or SL_ENOTFOUND
 */
int sl_dstate_worker_drain(sl_dstate_t *st, const char *address, char *err, size_t errlen);

/* Admin views: new JSON values (the caller owns the reference) describing
 * the state at time now, as docs/admin-api.md shows them. The single-item
 * views return NULL when there is no such item. */
json_t *sl_dstate_workers_json(const sl_dstate_t *st, int64_t now);
json_t *sl_dstate_datasets_json(const sl_dstate_t *st);
json_t *sl_dstate_dataset_json(const sl_dstate_t *st, uint64_t id);
json_t *sl_dstate_jobs_json(const sl_dstate_t *st, int64_t now);
json_t *sl_dstate_job_json(const sl_dstate_t *st, uint64_t id, int64_t now);
/* {name: [{repetition, job_id, state, collected, num_consumers, ended_ms_ago?}...]}: each named
 * job's repetitions, in repetition order. */
json_t *sl_dstate_job_names_json(const sl_dstate_t *st, int64_t now);

/* {held_back: [{table, kind, id, name?, repetition?, why}...], limit}: what
 * the last load held back, each for a record of the store it could not
 * read (docs/fault-tolerance.md, Damaged records). */
json_t *sl_dstate_quarantine_json(const sl_dstate_t *st);
/* An operator's decision: what the last load held back as kind ("job",
 * "dataset", "worker") and id is deleted from the store at the next commit
 * (a job: its record, cursor, restored positions and outstanding splits),
 * and a named job's (name, repetition) may be joined again, as a new job.
 * @return 0, SL_ENOTFOUND (nothing of that kind and id is held back) */
int sl_dstate_forget_held_back(sl_dstate_t *st, const char *kind, uint64_t id, char *err, size_t errlen);
/* Why job id was held back at load, or NULL when it was not. */
const char *sl_dstate_job_held_back(const sl_dstate_t *st, uint64_t id);

/** Counts for logs and the admin endpoint. */
typedef struct sl_dstate_stats {
    unsigned workers_live;
    unsigned datasets;
    unsigned jobs_running;
    unsigned jobs_total;
    uint64_t exclude_runs; /* runs of restored positions the running jobs hold */
    unsigned clients_away; /* clients of running jobs whose lease ran out, not yet released */
    /* Requests refused at a configured limit, since start. */
    uint64_t datasets_refused, jobs_refused, workers_refused, exclusions_refused;
    uint64_t datasets_collected; /* by --dataset-gc-timeout-ms, since start */
    uint64_t first_splits_with_job; /* DYNAMIC tasks handed their first splits with their job, since start */
    uint64_t split_requests_left_to_others; /* DYNAMIC split requests answered with none (balanced_share()) */
    unsigned held_back; /* damaged records of the state store the last load held back */
    /* Records leaving clients of named jobs gave back that were handed out
     * again, and returns refused, since start (sl_dstate_client_leave()). */
    uint64_t records_given_back, returns_refused;
} sl_dstate_stats_t;

void sl_dstate_stats(const sl_dstate_t *st, sl_dstate_stats_t *out);

#endif
