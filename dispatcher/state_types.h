/*
 * state_types.h: the dispatcher state's records, shared by the state
 * machine (state.c) and its durable form (persist.c) only. Everything else
 * goes through state.h.
 *
 * Durability: a change that must survive a restart marks what it changed
 * dirty (a job, its split cursor, a task's last split hand-out, a worker,
 * a dataset) or queues a deletion; persist.c writes exactly that in the
 * next commit. A job that is marked (or whose task's hand-out or outstanding
 * splits are) goes on the state's list of dirty jobs (sl__dstate_touch()),
 * and a dirty worker or dataset sets workers_dirty or datasets_dirty: a
 * commit looks at what changed, not at every job. What is not written (heartbeat times, progress counts,
 * rates) starts afresh at load.
 */
#ifndef SL_DSTATE_TYPES_H
#define SL_DSTATE_TYPES_H

#include <stdbool.h>
#include <stdint.h>

#include "caps.h"
#include "files.h"
#include "idmap.h"
#include "posbits.h"
#include "posset.h"
#include "state.h"

enum worker_state { WORKER_LIVE, WORKER_LOST };
enum task_state { TASK_ASSIGNED, TASK_RUNNING, TASK_DONE, TASK_FAILED, TASK_LOST };

/* The store's tables (persist.c names them). */
enum sl_dtable {
    SL_DT_DATASETS, SL_DT_JOBS, SL_DT_WORKERS, SL_DT_CURSORS, SL_DT_HANDOUTS, SL_DT_META, SL_DT_EXCLUDE,
    SL_DT_OUTSTANDING, SL_DT_COUNT_
};

/* A DYNAMIC split handed out and not yet known to have reached the
 * consumers whole (outstanding.c). OUT: its task holds it. AWAIT: its
 * task was lost; the consumers are asked what they received of it. QUEUED:
 * they answered; it is handed out again without what they have. */
enum osplit_state { OS_OUT, OS_AWAIT, OS_QUEUED };

struct osplit {
    uint64_t id;      /* the split id (unique within its job) */
    uint64_t task_id; /* the task it was handed to */
    uint64_t epoch;
    uint32_t file;
    enum osplit_state state;
    uint64_t begin, end;
    sl_posbits_t *have; /* positions of it the consumers already have (its skip runs; bitmaps where
                           a rank's scattered share crowds them), or NULL */
    bool dirty;         /* the stored record is not up to date (an orphan, or a split before out_saved) */
    bool given_back;    /* of records a leaving client gave back: not counted against --max-outstanding-splits */
};

/* Datasets whose split length a worker's tasks asked for that the
 * dispatcher keeps (struct worker's rates). */
#define SL_WORKER_RATES 8

struct worker {
    uint64_t id;
    char address[128];
    enum worker_state state;
    bool draining; /* no new tasks or splits (POST /v1/workers/{address}/drain) */
    int64_t joined;
    int64_t last_seen;
    char why_lost[200]; /* LOST: the reason */
    bool unconfirmed;   /* loaded from the store and not heard from since: gets no new tasks */
    bool dirty;
    /* DYNAMIC: what its tasks asked for (sl_dstate_get_splits()), so that
     * a new job hands its task the splits it would ask for first
     * (sl__dstate_first_splits()): the splits a task's first request asks
     * for (its queue, workerd's split_prefetch; 0: not seen yet), and the
     * records a split its tasks asked for last of the latest datasets they
     * read (a ring). In memory only: after a restart the workers ask. */
    uint32_t first_max_splits;
    bool cross_epochs; /* its tasks asked with GetSplitRequest.cross_epochs */
    struct worker_rate {
        uint64_t dataset_id;
        uint64_t split_records;
    } rates[SL_WORKER_RATES];
    unsigned rates_next;
    /* A task was added for it that no heartbeat answer has listed yet: the
     * server sends it a WORKER_NOTICE once that is committed
     * (sl_dstate_worker_take_notice()). In memory only. */
    bool notice;
};

struct dataset {
    uint64_t id;
    char fingerprint[17];
    char name[SL_DATASET_NAME_MAX]; /* given at registration ("" none): the dataset is (name, spec) */
    char *canonical;
    int64_t cardinality;
    /* File sources: the files and their record counts, split by file.
     * Other sources count as one file of cardinality elements. */
    sl_file_list_t files;
    uint64_t split_size;  /* elements per DYNAMIC split at least, see split_size_for(); every
                             split but a file's last is a multiple of it */
    uint64_t *records_from; /* records of files f.. (num_files + 1), made at the first hand-out; NULL: not yet */
    int hint_op;         /* the first shard op with num_shards "hint", or -1 */
    bool infinite;       /* the pipeline never ends (coordinated reads need it) */
    uint64_t passes;     /* epochs every pipeline certainly reads (sl_policy_source_passes()):
                            DYNAMIC hand-outs may run ahead of a task's epoch below it;
                            not stored, derived from the spec again when loaded */
    int64_t last_used;   /* registered, or a job of it created or running, on the state's clock;
                            stored (as wall-clock time, persist.c) when it moved a minute or more
                            past saved_used, so --dataset-gc-timeout-ms counts across restarts; 0:
                            not known (the next tick sets it to its time) */
    int64_t saved_used;  /* last_used as last stored */
    bool dirty;
};

/* A task's last GetSplit answer with splits, without the answer's fixed
 * array of GetSplitResponse.splits' max_count: as many splits as it holds
 * (64 bytes each), so that a task keeps what it was given, not the most an
 * answer may hold. */
struct last_answer {
    uint64_t epoch;
    bool end_of_epoch, finished;
    pb_size_t num;
    sluice_Split splits[];
};

struct task {
    uint64_t id;
    uint64_t worker_id;
    /* Its task_key (caps.h), derived on first use (sl__dstate_task_key());
     * not stored. Each client heartbeat derives every listed task's client
     * keys from it, one HMAC each instead of two. */
    uint8_t key[16];
    bool keyed;
    char worker_address[128];
    enum task_state state;
    uint32_t worker_index;
    /* As the worker last reported them. */
    uint64_t batches, elements, bytes;
    int64_t reported_at;
    double bytes_per_s; /* smoothed over heartbeats */
    uint64_t start_round, end_round; /* coordinated reads; end_round 0: none */
    /* DYNAMIC: the last GetSplit answer, kept (and stored) so that a worker
     * that asks again with the same request_seq gets the same splits. */
    uint64_t split_req_seq;
    struct last_answer *last_splits; /* malloc'd for the splits it holds */
    uint8_t *last_skips;                  /* its splits' skip runs (the answer's payload) */
    size_t last_skips_len;
    bool handout_dirty;
    /* DYNAMIC: its outstanding splits, by id: out[out_head, out_num);
     * those from out_saved on are not stored yet, nor those before it
     * marked dirty while out_rewrite is set (records a leaving client gave
     * back were added to their `have`). */
    struct osplit *out;
    unsigned out_head, out_num, out_cap, out_saved;
    bool out_rewrite;
    unsigned out_given_back; /* of them, given_back ones */
    /* DYNAMIC: held back at --max-outstanding-splits since the last
     * heartbeat, and since when every split it holds is one its worker has
     * not finished (0: not so); neither is stored. */
    bool held;
    int64_t held_full_since;
    /* DYNAMIC: the done_below of its worker's last heartbeat (TaskStatus;
     * not stored): what a client behind it asks the worker for when the
     * task is held (sl__out_probe_below()). */
    uint64_t worker_done_below;
    /* DYNAMIC: the largest GetSplitRequest.received_below of its worker
     * (not stored): every split below it reached its clients, whatever
     * they said (sl__out_received()); and its last lost_below and
     * received_past_lost (0, 0: none lost): every split from lost_below up
     * to received_past reached them, counted once the clients said they
     * have every split below lost_below. */
    uint64_t received_below, lost_below, received_past;
    /* DYNAMIC, in memory only: its rate through its splits (records/s, 0:
     * not said) and the records it held queued after its last answer, at
     * queued_at (ms), for the shares of the epoch's end (balanced_share()
     * in handout.c). */
    uint64_t split_rate;
    uint64_t queued_records;
    int64_t queued_at;
};

/* Whether t still reads its job: assigned or running, not ended or lost. */
static inline bool sl__task_live(const struct task *t)
{
    return t->state == TASK_ASSIGNED || t->state == TASK_RUNNING;
}

/* A place in the order DYNAMIC hands records out: epoch, file, record. */
struct sl_place {
    uint64_t epoch, pos;
    uint32_t file;
};

/* Whether a comes before b in that order. */
static inline bool sl__place_before(struct sl_place a, struct sl_place b)
{
    return sl_place_before(a.epoch, a.file, a.pos, b.epoch, b.file, b.pos);
}

struct client {
    uint64_t id;
    int64_t last_seen;
    int64_t away_since;        /* its lease ran out then (not stored); 0: present */
    int64_t progress_at;       /* DYNAMIC: when its progress last grew, or it joined (not stored) */
    int64_t stalled_since;     /* DYNAMIC: stalled then (--client-stall-ms, not stored); 0: reading */
    uint32_t consumer_index;   /* coordinated reads */
    uint64_t round;            /* the next round it asks for, as it last said */
    /* It came in place of an away client of its consumer index, and hands
     * its caller the rounds from start_round (GetOrCreateJobResponse.deliver_from);
     * aligning while away clients of the job remain (consumers restarted
     * together: the next ones start where it started). */
    bool replaced, aligning;
    uint64_t start_round;
    sl_target_workers_t target;
    char host[64];             /* its IP address as the dispatcher sees it */
    bool late;                 /* it joined after the job had ended: it is listed no task */
    /* DYNAMIC: the report generation it answered, and for each task the
     * largest done_below it said (TaskProgress); neither is stored. */
    uint64_t reported_gen;
    /* A named job's: the furthest place its heartbeats said its caller was
     * given every record it had received before (epochs_given as (E, 0, 0),
     * place_given; not stored). */
    struct sl_place given;
    /* DYNAMIC: the runs its record of what reached it held at its last
     * heartbeat, and the most it may hold (ledger_runs, ledger_max_runs;
     * 0: not said; not stored). */
    uint64_t ledger_runs, ledger_max_runs;
    struct client_progress {
        uint64_t task_id, done_below;
    } *progress;
    unsigned num_progress, cap_progress;
};

struct job {
    uint64_t id;
    /* Drawn at random when the job is made (0: a job stored before nonces):
     * part of its clients' secrets and its tasks' keys (caps.h), and told to
     * its workers in each TaskDef, which report it back, so that a state
     * restored from a backup, which gives the lost state's ids out again,
     * takes no task nor client of that state for one of its own. */
    uint64_t nonce;
    char name[129];
    uint64_t repetition;     /* a named job is keyed by (name, repetition) */
    struct dataset *dataset;
    sl_sharding_t sharding;
    sl_sharding_t effective; /* what the tasks run: FILE_OR_DATA resolved to FILE or DATA */
    uint32_t num_consumers;  /* > 0: coordinated reads */
    uint64_t round_horizon;  /* coordinated reads: the largest round a consumer was allowed */
    bool started;            /* the tasks of its creation are made: later ones join mid-job */
    sl_job_state_t state;
    char error[1024]; /* why it failed or was cancelled (ClientHeartbeatResponse.error holds as much) */
    struct task *tasks;
    unsigned num_tasks, cap_tasks;
    struct client *clients;
    unsigned num_clients, cap_clients;
    /* Coordinated reads: each consumer index whose client left while the
     * job ran (it closed its iterator, or was away past client_rejoin_ms),
     * with the round it last said it would ask next, and since when it is
     * gone (when it went away, for an away one; the load, after a restart):
     * the next client of that index starts there (at most
     * max_clients_per_job; stored without since). */
    struct gone_consumer {
        uint32_t consumer_index;
        uint64_t round;
        int64_t since;
    } *gone;
    unsigned num_gone, cap_gone;
    int64_t idle_since; /* when the last client left; valid when num_clients == 0 */
    int64_t created;
    int64_t ended;      /* when it left RUNNING, on the state's clock (0: running) */
    /* DYNAMIC: the epochs done (sl__out_epochs_done()) when it ended, for
     * its view (stored). */
    bool end_epochs_known;
    uint64_t end_epochs_done;
    bool collected;     /* a named job ended and without clients for job_gc_timeout_ms: a join of
                           its (name, repetition) creates it again */
    /* DYNAMIC split cursor. */
    uint64_t split_epoch;
    uint32_t split_file; /* the file split_next counts in */
    uint64_t split_next; /* first element (record) of split_file not yet handed out */
    uint64_t split_seq;  /* split ids, unique within the job */
    uint64_t split_epoch_handed; /* splits handed out in split_epoch */
    /* A restored iterator's job: positions its consumer already has,
     * which no split hands out (written once, with the job). */
    sl_posbits_t exclude; /* a restored job's consumed positions: runs, and bitmaps where they crowd */
    bool exclude_dirty;
    /* A named job created by a restore: the SHA-256 of what the restore
     * sent (restore_epochs_done and the positions), which every rank that
     * joins it must send too (all restore the same merged checkpoint). */
    bool restored;
    uint8_t restore_digest[32];
    /* A named job: the least place given of the clients that left it
     * without giving back every record they had received and not given
     * (given_floor_set; leave_given() in state.c): those may never have
     * been given, so no later fold passes its place. */
    bool given_floor_set;
    struct sl_place given_floor;
    /* DYNAMIC: lost tasks' splits, AWAIT or QUEUED (outstanding.c); every
     * client must answer report_gen before the AWAIT ones are queued. */
    struct osplit *orphans;
    unsigned num_orphans, cap_orphans;
    bool orphans_dirty;
    uint64_t report_gen;
    bool dirty;        /* the job record: everything above but the cursor */
    bool cursor_dirty; /* the split cursor */
    bool listed;       /* on the state's dirty_jobs */
    bool indexed;      /* it and its tasks are in the state's index */
};

/* A record of the state store that a start could not read (persist.c):
 * what it held back stays in the store as it is, never written over or
 * deleted, and everything else is served (docs/fault-tolerance.md,
 * "Damaged records"). */
#define SL_QUARANTINE_MAX 1024 /* more damaged records than this: the start is refused */
struct quarantined {
    const char *table; /* the table of the record (persist.c's names) */
    const char *kind;  /* what it holds back: "job", "dataset" or "worker" */
    uint64_t id;       /* that job's, dataset's or worker's id */
    bool named;        /* a job whose record still says its name: a join of (name, repetition) is refused */
    uint64_t repetition;
    char name[129];
    char why[320];
};

struct sl_dstate {
    sl_dstate_config_t cfg;
    int64_t now; /* the last tick's time (0 before the first) */
    /* The key of every capability it hands out (caps.h): random at the
     * first start, then the one the store keeps. */
    uint8_t secret[SL_CAP_SECRET_LEN];
    bool secret_dirty; /* not in the store yet */
    uint64_t next_id; /* ids of every kind come from one counter */
    struct worker *workers;
    unsigned num_workers, cap_workers;
    struct dataset **datasets; /* each its own allocation: jobs point at them */
    unsigned num_datasets, cap_datasets;
    struct job **jobs; /* oldest first */
    unsigned num_jobs, cap_jobs;
    /* Jobs and their tasks by id (idmap.h): a job's entry has pos
     * UINT32_MAX, a task's its job and its place in the job's tasks (a
     * job's tasks are only ever appended). */
    sl_idmap_t index;
    char (*addresses)[128]; /* --worker-addresses, in order */
    unsigned num_addresses;
    /* Durability (see the top of this file). */
    uint64_t saved_next_id; /* next_id as last committed */
    struct job **dirty_jobs; /* jobs the next commit writes (sl__dstate_touch()); room for num_jobs */
    unsigned num_dirty_jobs, cap_dirty_jobs;
    bool workers_dirty, datasets_dirty; /* some worker's, some dataset's dirty is set */
    bool notices_due; /* some worker's notice was set since sl_dstate_take_notices_due() */
    struct sl_ddel {
        enum sl_dtable table;
        uint64_t key, key2; /* key2: the outstanding table's second half (a split id) */
    } *dels;                /* records to delete in the next commit */
    unsigned num_dels, cap_dels;
    /* Requests refused at the configured limits, since start (metrics). */
    uint64_t datasets_refused, jobs_refused, workers_refused, exclusions_refused;
    uint64_t first_splits_with_job; /* answers sl__dstate_first_splits() made, since start */
    uint64_t split_requests_left_to_others; /* answered with none: the task's queue outlasts the others' */
    uint64_t datasets_collected; /* by --dataset-gc-timeout-ms */
    uint64_t records_given_back, returns_refused; /* by leaving clients, since start (sl__out_return()) */
    /* Heard from no live worker and no client for a while: the dispatcher
     * itself is probably cut off, and leases do not run out meanwhile
     * (sl_dstate_tick()). silent_since: the last time it heard anyone. */
    int64_t last_rx; /* the last frame from any peer (sl_dstate_heard()); 0: never told */
    bool silent;
    int64_t silent_since;
    uint64_t silences; /* stretches of silence, since start */
    /* Records the last load could not read, and what each holds back. */
    struct quarantined *quarantine;
    unsigned num_quarantine, cap_quarantine;
};

/* Shared by the parts of the state (state_base.c). */

/** The names of enum task_state and sl_job_state_t values. */
extern const char *const sl__task_state_names[];
extern const char *const sl__job_state_names[];

/** Grows *arr (of elem bytes each) to hold one more than num when full.
 *  @return 0 or -ENOMEM */
int sl__dstate_grow(void *arr, unsigned *cap, unsigned num, size_t elem);

/** The worker, dataset, job or task of an id, or NULL (a task's job in *job). */
struct worker *sl__dstate_worker(sl_dstate_t *st, uint64_t id);
struct dataset *sl__dstate_dataset(const sl_dstate_t *st, uint64_t id);
struct job *sl__dstate_job(const sl_dstate_t *st, uint64_t id);

/** The most splits a DYNAMIC task held at --max-outstanding-splits gets
 *  while its pipeline cannot finish one without another (handout.c): the
 *  bound and SL_HELD_EXTRA more, at most twice the bound. A split behind a
 *  shuffle holds at least 1/64 of its buffer (split_size_for(), state.c):
 *  64 fresh splits refill any buffer that sparse splits left starved, and
 *  past that more would not help, only put off the failure of a pipeline
 *  that drops everything. Held there, its job fails by name (state.c). */
#define SL_HELD_EXTRA 64
unsigned sl__held_cap(const sl_dstate_t *st);

/** Forget job (dataset) id in memory, the store untouched: a load that
 *  holds it back (persist.c), after it was read in part. */
void sl__dstate_forget_job(sl_dstate_t *st, uint64_t id);
void sl__dstate_forget_dataset(sl_dstate_t *st, uint64_t id);
/** What the last load held back of kind ("job", "dataset", ...) and id, or NULL. */
const struct quarantined *sl__dstate_held_back(const sl_dstate_t *st, const char *kind, uint64_t id);

/** A named job's fold (ClientHeartbeatResponse.place_folded): the least
 *  place given of its clients and of those that left it; (0, 0, 0) for
 *  none. */
struct sl_place sl__job_folded(const struct job *j);
struct task *sl__dstate_task(const sl_dstate_t *st, uint64_t id, struct job **job);

/** A dataset's files (a source without files counts as one file of
 *  cardinality records), and the records of file f. */
uint32_t sl__dataset_num_files(const struct dataset *d);
uint64_t sl__dataset_file_records(const struct dataset *d, uint32_t f);

/** A dataset's records per epoch. */
uint64_t sl__dataset_records(const struct dataset *d);

/** The records of job j's epoch its split cursor has not handed out yet. */
uint64_t sl__job_records_left(const struct job *j);

/** Frees a dataset and what it holds. */
void sl__dataset_free(struct dataset *d);

/**
 * A split [begin, *end) of file f in epoch: its records in ex (a restored
 * job's positions, or what the consumers of a lost split already have)
 * become skip runs in t's answer payload (16 bytes
 * each, docs/protocol.md). When they do not all fit, the split ends where
 * the first that does not fit begins.
 * @return 0 (*nskips runs added), 1 (ex holds all of it: hand nothing out),
 *         2 (no room left in this answer), -ENOMEM
 */
int sl__dstate_split_skips(sl_dstate_t *st, struct task *t, const sl_posbits_t *ex, uint32_t epoch, uint32_t f,
                           uint64_t begin, uint64_t *end, uint32_t *nskips);

/**
 * DYNAMIC, a job j just created (its epoch 0, nothing excluded): hands each
 * task whose worker's tasks asked for splits of j's dataset before the
 * splits of that length its first request will ask for (request_seq 1),
 * committed with the job, so that its first request is answered without a
 * commit of its own and the workers' first requests do not wait for each
 * other's. A task whose worker asked for none of the dataset asks itself.
 * handout.c
 */
void sl__dstate_first_splits(sl_dstate_t *st, struct job *j, int64_t now);

/** Whether task t is worker w's: given to it, or to the id it had before it
 *  registered again (a worker no longer live at w's address). ownership.c */
bool sl__dstate_worker_owns_task(sl_dstate_t *st, const struct worker *w, const struct task *t);

/** @return 0 when secret is client client_id of job job_id's, else SL_EPERM
 *  with a message naming the request (what) in err. ownership.c */
int sl__dstate_check_client_secret(const sl_dstate_t *st, const char *what, uint64_t job_id, uint64_t client_id,
                                   const uint8_t secret[SL_CAP_LEN], char *err, size_t errlen);

/** Task t's task_key (caps.h), derived once with its job j's nonce. ownership.c */
const uint8_t *sl__dstate_task_key(const sl_dstate_t *st, const struct job *j, struct task *t);

/** Puts job j on the list of jobs the next commit writes: whatever sets one
 *  of j's dirty flags, one of its tasks' handout_dirty or adds to a task's
 *  outstanding splits calls it. Never fails: the list has room for every
 *  job (sl__dstate_index_job()). */
void sl__dstate_touch(sl_dstate_t *st, struct job *j);

/** Adds job j (just appended to st->jobs) and its tasks to the index, and
 *  makes room for it on the dirty list. @return 0 or -ENOMEM (then j is in
 *  neither: the caller takes it out of st->jobs) */
int sl__dstate_index_job(sl_dstate_t *st, struct job *j);

/** Adds j's task k to the index when j is indexed. @return 0 or -ENOMEM */
int sl__dstate_index_task(sl_dstate_t *st, struct job *j, unsigned k);

/** Takes job j (about to be freed) and its tasks out of the index and off
 *  the dirty list. */
void sl__dstate_unindex_job(sl_dstate_t *st, struct job *j);

/** Queues the deletion of a record (key2 only for SL_DT_OUTSTANDING). */
void sl__dstate_del(sl_dstate_t *st, enum sl_dtable table, uint64_t key, uint64_t key2);

#endif
