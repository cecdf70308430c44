/*
 * sluice.h: the public interface of libsluice, the trainer-side client of the
 * Sluice data service.
 *
 * A trainer connects to a dispatcher, registers a dataset from its JSON spec,
 * opens an iterator over a job and pulls batches of named tensors:
 *
 *     sl_client_t *c;
 *     sl_client_open("127.0.0.1:5050", NULL, &c);
 *     uint64_t ds;
 *     sl_client_register_dataset(c, spec_json, strlen(spec_json), &ds);
 *     sl_iterator_opts_t o;
 *     sl_iterator_opts_init(&o);
 *     o.sharding = SL_SHARDING_DYNAMIC;
 *     sl_iterator_t *it;
 *     sl_iterator_open(c, ds, &o, &it);
 *     sl_batch_t *b;
 *     while (sl_iterator_next(it, &b) == 0) {
 *         ... sl_batch_tensor(b, i) ...
 *         sl_batch_release(b);
 *     }
 *     sl_iterator_close(it);
 *     sl_client_close(c);
 *
 * Every function returns 0 on success or a negative code: -errno for system
 * failures, SL_E* below for the service's own. sl_strerror() names the code;
 * the handle's errmsg function gives the full message of the last failure.
 *
 * This header also fixes the vocabulary shared by all of Sluice (error codes,
 * dtypes, sharding policies, job states): the daemons include it for that.
 */
#ifndef SLUICE_H
#define SLUICE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(SL_BUILDING_LIBRARY)
#define SL_EXPORT __attribute__((visibility("default")))
#else
#define SL_EXPORT
#endif

/* Errors of the service itself; system failures are -errno (> -4096). */
#define SL_EPROTO    (-5001) /* the peer broke the wire protocol */
#define SL_EVERSION  (-5002) /* the peer speaks another protocol version */
#define SL_ETOOBIG   (-5003) /* a length exceeds its configured limit */
#define SL_ESPEC     (-5004) /* the dataset spec is invalid */
#define SL_ENOTFOUND (-5005) /* no such dataset, job, task or worker */
#define SL_ECONFLICT (-5006) /* a named job exists with other parameters */
#define SL_EREMOTE   (-5007) /* the peer reported an error of its own */
#define SL_ECANCELLED (-5008) /* the job was cancelled or collected */
#define SL_ECLOSED   (-5009) /* the connection was closed */
#define SL_EINTERNAL (-5010) /* a bug: an invariant did not hold */
#define SL_EDATA     (-5011) /* the pipeline failed on its data */
#define SL_EINVAL    (-5012) /* an argument is out of its range */
#define SL_EREFUSED  (-5013) /* the peer refused the request */
#define SL_EPERM     (-5014) /* the request names what its sender does not own (a wrong
                                client secret or task key, another worker's task) */
#define SL_EAUTH     (-5015) /* the peer did not prove it holds the cluster token or certificate */
#define SL_ELIMIT    (-5016) /* a configured limit of the daemon was reached */
#define SL_ENOHOST   (-5017) /* the host name of an address cannot be resolved */

/** Element dtypes, as numbered on the wire. */
typedef enum sl_dtype {
    SL_DTYPE_INVALID = 0,
    SL_DTYPE_BOOL = 1,
    SL_DTYPE_INT8 = 2,
    SL_DTYPE_INT16 = 3,
    SL_DTYPE_INT32 = 4,
    SL_DTYPE_INT64 = 5,
    SL_DTYPE_UINT8 = 6,
    SL_DTYPE_UINT16 = 7,
    SL_DTYPE_UINT32 = 8,
    SL_DTYPE_UINT64 = 9,
    SL_DTYPE_FLOAT16 = 10,
    SL_DTYPE_BFLOAT16 = 11,
    SL_DTYPE_FLOAT32 = 12,
    SL_DTYPE_FLOAT64 = 13,
    SL_DTYPE_BYTES = 14,
    SL_DTYPE_COUNT_
} sl_dtype_t;

/** Sharding policies (see docs/architecture.md), as numbered on the wire. */
typedef enum sl_sharding {
    SL_SHARDING_OFF = 0,
    SL_SHARDING_DYNAMIC = 1,
    SL_SHARDING_FILE = 2,
    SL_SHARDING_DATA = 3,
    SL_SHARDING_FILE_OR_DATA = 4,
    SL_SHARDING_HINT = 5,
    SL_SHARDING_COUNT_
} sl_sharding_t;

/** Which workers an iterator reads from (see docs/sharding.md), as numbered on the wire. */
typedef enum sl_target_workers {
    SL_TARGET_ANY = 0,   /* every worker of the job */
    SL_TARGET_LOCAL = 1, /* only workers whose address has the host this client
                            connects to the dispatcher from; refused when none */
    SL_TARGET_COUNT_
} sl_target_workers_t;

/** Job states (see docs/architecture.md), as numbered on the wire. */
typedef enum sl_job_state {
    SL_JOB_RUNNING = 0,
    SL_JOB_FINISHED = 1,
    SL_JOB_CANCELLED = 2,
    SL_JOB_FAILED = 3
} sl_job_state_t;

#define SL_MAX_RANK 8        /* dimensions of a tensor */
#define SL_MAX_NAME 64       /* bytes of a component's name, with its NUL */
#define SL_MAX_COMPONENTS 32 /* components of an element, tensors of a batch */

/**
 * One component of the elements a dataset yields (what each batch on the
 * wire holds), as far as the spec says: docs/dataset-spec.md, "Element spec".
 */
typedef struct sl_component_spec {
    char name[SL_MAX_NAME];
    sl_dtype_t dtype;
    int rank;                   /* dimensions; -1: not known (a plugin map's output) */
    int64_t shape[SL_MAX_RANK]; /* -1: a dimension not known before the data (an image's
                                   size, a short last batch, a varlen feature) */
    int ragged;                 /* travels as values plus row splits: its dimension 1 varies
                                   from row to row (a batch of a varlen feature) */
} sl_component_spec_t;

/** What every element of a dataset holds, derived from its spec. */
typedef struct sl_elemspec {
    int known;          /* 0: the spec does not say (e.g. an op's key names no component,
                           which fails the pipeline when a worker builds it) */
    int num_components; /* in the order batches hold them */
    sl_component_spec_t components[SL_MAX_COMPONENTS];
} sl_elemspec_t;

typedef struct sl_client sl_client_t;
typedef struct sl_iterator sl_iterator_t;
typedef struct sl_batch sl_batch_t;

/**
 * One tensor of a batch. Valid until sl_batch_release() of its batch.
 * Dense: data holds shape[0] * ... * shape[rank-1] values of dtype,
 * little-endian, row-major. Bytes (SL_DTYPE_BYTES): data holds n + 1 uint64
 * offsets into the bytes that follow them, n = product of shape.
 * Ragged (row_splits != NULL): shape[0] rows; row i holds the values
 * [row_splits[i], row_splits[i+1]) of data.
 */
typedef struct sl_tensor {
    const char *name;
    sl_dtype_t dtype;
    int rank;
    int64_t shape[SL_MAX_RANK];
    const void *data;
    size_t size;               /* bytes at data */
    const int64_t *row_splits; /* NULL unless ragged */
    size_t num_row_splits;
} sl_tensor_t;

/**
 * Where a batch's elements came from: records [begin, begin + count) of
 * file file_index of the source, read in epoch epoch. Files are numbered as
 * DYNAMIC splits number them (the source's patterns expanded in order, each
 * sorted; a range source is file 0 and its elements' ordinals are the
 * records), records from each file's first. A batch's runs follow its
 * elements in order; adjacent runs are merged when contiguous.
 * docs/protocol.md gives the wire layout.
 */
typedef struct sl_provenance_run {
    uint32_t epoch;
    uint32_t file_index;
    uint64_t begin;
    uint64_t count;
} sl_provenance_run_t;

/**
 * A worker's notice that a DYNAMIC split is done: it read all of the split
 * it will ever read, and every record it read has left its pipeline, in a
 * batch handed to a client or dropped (filter, drop_remainder, a buffer
 * discarded at the end). delivered is how many of the split's records went
 * out in batches (to this or another consumer of the task).
 */
typedef struct sl_split_done {
    uint64_t split_id;
    uint32_t epoch;
    uint32_t file_index;
    uint64_t begin, end;
    uint64_t delivered;
} sl_split_done_t;

/** Client options. sl_client_opts_init() fills the defaults. */
typedef struct sl_client_opts {
    int connect_timeout_ms; /* connect + handshake, default 5000 */
    int request_timeout_ms; /* a dispatcher request, default 10000 */
    /* Security (docs/security.md); iterators of the client use the same. */
    const char *auth_token_file; /* the cluster token; NULL: SLUICE_AUTH_TOKEN_FILE if set, else none */
    const char *tls_cert;        /* TLS 1.3 with this certificate and key, peers verified */
    const char *tls_key;         /* against tls_ca; all three or none */
    const char *tls_ca;
} sl_client_opts_t;

/** Iterator options. sl_iterator_opts_init() fills the defaults. */
typedef struct sl_iterator_opts {
    sl_sharding_t sharding;     /* default SL_SHARDING_OFF */
    const char *job_name;       /* NULL: an anonymous job of its own */
    int max_outstanding;        /* batch requests in flight and buffered; 0 (default):
                                   sized by window_bytes at the largest batch received so
                                   far, 8 to 32 (8 until the first batch); < 0 refused */
    int per_worker_outstanding; /* requests in flight to one worker, at most 16; 0
                                   (default): half the window in effect, 4 to 16; and,
                                   with two or more live tasks, at most what leaves each
                                   other one a slot of the window (docs/protocol.md) */
    int connect_timeout_ms;     /* to a worker, default 5000 */
    int timeout_ms;             /* longest wait for a worker that does not answer, and
                                   for a job that no live worker serves (none registered,
                                   every one lost; said on stderr after 3 s), default 30000
                                   (the dispatcher: dispatcher_timeout_ms) */
    size_t max_batch_bytes;     /* largest batch accepted, default 256 MiB */
    int num_consumers;          /* > 0: coordinated reads (a named job over an infinite
                                   dataset); 0 (default): each batch to whoever asks first */
    int consumer_index;         /* 0 .. num_consumers - 1 */
    sl_target_workers_t target_workers; /* default SL_TARGET_ANY */
    int provenance;             /* whether workers send each batch's provenance
                                   (sl_batch_provenance): 0 (default) under
                                   SL_SHARDING_DYNAMIC (without coordinated reads) only,
                                   where the iterator also keeps what it received, for
                                   checkpoints and exactly once across a worker loss;
                                   > 0 under every policy; < 0 never (DYNAMIC is then at
                                   least once across a worker loss, and takes no
                                   checkpoints) */
    size_t max_ledger_runs;     /* runs of positions the record of what the iterator
                                   received may hold (what checkpoints and worker-loss
                                   reports say); a shuffle buffer of B elements on each
                                   of W workers leaves about W * B / 2 holes, 24 bytes a
                                   run in memory. 0 (default) and anything larger mean
                                   2,097,152, the most a dispatcher takes. From half of
                                   it DYNAMIC asks the dispatcher which epochs are done
                                   (past three quarters next() waits for the answer, a
                                   round trip) and folds them, and says on stderr once
                                   that it holds over half; its heartbeats say the size
                                   (GET /v1/jobs/{id}, consumers' ledger_runs). Where runs
                                   crowd (a rank of a named job holds every R-th record
                                   past the job's fold) 4096 positions go as a bitmap,
                                   counted as 22 runs. Past it the iterator says
                                   so on stderr once, takes no checkpoint, and a worker
                                   loss is at least once */
    int dispatcher_timeout_ms;  /* how long the iterator rides through a dispatcher it
                                   cannot reach (killed and restarted, cut off), reading
                                   what known workers serve and reconnecting with backoff,
                                   before it fails: default 3600000 (60 minutes, as
                                   tf.data service); 0 means the default */
    uint64_t repetition;        /* a named job: which pass over the dataset (epoch) to join,
                                   default 0. The dispatcher keys named jobs by (job_name,
                                   repetition): a repetition that is running is joined, one
                                   that already ended gives its end at once (with a notice,
                                   sl_iterator_notice()), one never seen (or collected after
                                   --job-gc-timeout-ms) is created. Count it up per epoch, as
                                   tf.data service does; must be 0 without a job_name */
    int ledger_deltas;          /* > 0: keep what the iterator records of each batch it
                                   returns for sl_iterator_delta(); only an iterator that
                                   takes checkpoints (SL_EINVAL otherwise); 0 (default): not */
    int shm;                    /* a worker on this host hands its batches over in shared
                                   memory (docs/protocol.md): 0 (default) where the worker
                                   offers it (sluice-workerd --shm-mb); < 0 never: every
                                   batch over the socket.
                                   A batch then holds its slot until released */
    size_t window_bytes;        /* with max_outstanding 0: the bytes of batches requested
                                   and buffered the window is sized by; 0 (default) means
                                   32 MiB. Memory then held is at most the larger of 8
                                   batches and window_bytes, at the largest batch received
                                   (requests in flight when a larger one comes stay) */
} sl_iterator_opts_t;

/** @return a static description of an error code (negative) */
SL_EXPORT const char *sl_strerror(int err);

/** The library's version, "MAJOR.MINOR.PATCH" (what the daemons' --version say). */
SL_EXPORT const char *sl_version(void);

/** @return the name of a dtype ("int64"), or "invalid" */
SL_EXPORT const char *sl_dtype_name(sl_dtype_t dtype);

/** @return the size in bytes of one value of a fixed-width dtype, 0 for bytes */
SL_EXPORT size_t sl_dtype_size(sl_dtype_t dtype);

/** @return the policy's name ("dynamic"), or NULL when out of range */
SL_EXPORT const char *sl_sharding_name(sl_sharding_t sharding);

/**
 * Parses a policy name as sluice-cat's --sharding takes it.
 * @param[in] name "off", "dynamic", "file", "data", "file_or_data" or "hint"
 * @param[out] out the policy
 * @return 0, or SL_EINVAL for an unknown name
 */
SL_EXPORT int sl_sharding_parse(const char *name, sl_sharding_t *out);

SL_EXPORT void sl_client_opts_init(sl_client_opts_t *opts);

/**
 * Creates a client of the dispatcher at address and checks that it answers.
 * @param[in] address "host:port" of the dispatcher
 * @param[in] opts NULL for the defaults
 * @param[out] out the client, freed by sl_client_close(); on failure a client
 *             is still returned (unless out of memory) so that
 *             sl_client_errmsg() can say why, and must be closed too
 * @return 0, -ECONNREFUSED, -ETIMEDOUT, SL_EVERSION, SL_EPROTO, -ENOMEM
 */
SL_EXPORT int sl_client_open(const char *address, const sl_client_opts_t *opts, sl_client_t **out);

/** Closes the client and frees it. Its iterators must be closed first. */
SL_EXPORT void sl_client_close(sl_client_t *client);

/** @return the message of the client's last failure, valid until the next call on it */
SL_EXPORT const char *sl_client_errmsg(const sl_client_t *client);

/**
 * Registers a dataset, or finds the one with the same canonical spec.
 * @param[in] spec_json the spec, docs/dataset-spec.md; len bytes
 * @param[out] dataset_id the dataset's id
 * @return 0, SL_ESPEC (sl_client_errmsg names the offending field), or a
 *         transport error
 */
SL_EXPORT int sl_client_register_dataset(sl_client_t *client, const char *spec_json, size_t len,
                                         uint64_t *dataset_id);

/**
 * sl_client_register_dataset() under a name, the way tf.data service's
 * register_dataset(dataset_id=...) names one: other processes find it with
 * sl_client_lookup_dataset(). A dataset is its (name, canonical spec): the
 * same pair gives the same id every time; a name registered with another
 * spec is refused.
 * @param[in] name NULL or "": none (as sl_client_register_dataset()); else 1 to
 *            127 of [A-Za-z0-9_.:/-], not all digits
 * @param[out] element_spec NULL, or what the dataset's elements hold
 * @return 0, SL_ESPEC, SL_EINVAL (the name), SL_ECONFLICT (the name is
 *         another spec's), or a transport error
 */
SL_EXPORT int sl_client_register_dataset_as(sl_client_t *client, const char *spec_json, size_t len,
                                            const char *name, uint64_t *dataset_id, sl_elemspec_t *element_spec);

/**
 * Asks the dispatcher for a registered dataset, by id (name NULL) or by the
 * name it was registered under (dataset_id 0), and what its elements hold.
 * @param[out] id_out NULL, or the dataset's id
 * @param[out] element_spec NULL, or the element spec (known 0 when the spec
 *             does not say)
 * @return 0, SL_ENOTFOUND, SL_EINVAL, or a transport error
 */
SL_EXPORT int sl_client_lookup_dataset(sl_client_t *client, uint64_t dataset_id, const char *name,
                                       uint64_t *id_out, sl_elemspec_t *element_spec);

SL_EXPORT void sl_iterator_opts_init(sl_iterator_opts_t *opts);

/**
 * Opens an iterator over a job of dataset_id: joins the named job, or
 * creates an anonymous one.
 * @param[in] opts NULL for the defaults; copied, job_name too
 * @param[out] out the iterator, freed by sl_iterator_close(); on failure an
 *             iterator is still returned (unless out of memory) so that
 *             sl_iterator_errmsg() can say why, and must be closed too
 * @return 0, SL_ECONFLICT (a job of that name has other parameters),
 *         SL_ENOTFOUND, SL_EINVAL, or a transport error
 */
SL_EXPORT int sl_iterator_open(sl_client_t *client, uint64_t dataset_id, const sl_iterator_opts_t *opts,
                               sl_iterator_t **out);

/**
 * Waits for the next batch.
 * @param[out] out the batch, owned by the caller until sl_batch_release()
 * @return 0 with a batch; 1 at the end of the job (every task done); or an
 *         error: -ETIMEDOUT, SL_ECANCELLED, SL_EDATA, SL_ECLOSED, ... with
 *         sl_iterator_errmsg() saying which peer and why. After an error the
 *         iterator can only be closed.
 */
SL_EXPORT int sl_iterator_next(sl_iterator_t *it, sl_batch_t **out);

/**
 * sl_iterator_next() that waits at most wait_ms (< 0: for ever), so that a
 * caller can see to its signals (Ctrl-C) and say what it waits for.
 * @return as sl_iterator_next(), or -EAGAIN when nothing came within
 *         wait_ms; the iterator stays usable then
 */
SL_EXPORT int sl_iterator_next_wait(sl_iterator_t *it, sl_batch_t **out, int wait_ms);

/**
 * What the iterator waits on, when it knows (e.g. "no live worker for job
 * 7: ..."), said once it waited a few seconds; libsluice says the same on
 * stderr. Copied into buf (NUL-terminated, cut to len).
 * @return the length of the whole text; 0 when it waits on nothing known
 */
SL_EXPORT size_t sl_iterator_waiting(sl_iterator_t *it, char *buf, size_t len);

/**
 * @return the batches received and waiting for the caller (prefetched,
 * not yet returned by sl_iterator_next()): a training loop that finds 0
 * at each step waits on its input. A named DYNAMIC job's iterator gives
 * these back to the job's other consumers when it is closed
 * (docs/fault-tolerance.md, "A rank that leaves").
 */
SL_EXPORT unsigned sl_iterator_queued(sl_iterator_t *it);

/** @return the message of the iterator's last failure */
SL_EXPORT const char *sl_iterator_errmsg(const sl_iterator_t *it);

/** @return the job's id */
SL_EXPORT uint64_t sl_iterator_job_id(const sl_iterator_t *it);

/** Stops the iterator's requests, leaves the job and frees the iterator.
 *  Batches not yet released stay valid until released. */
SL_EXPORT void sl_iterator_close(sl_iterator_t *it);

/** @return the number of elements in the batch (its first dimension when batched) */
SL_EXPORT uint64_t sl_batch_num_elements(const sl_batch_t *b);

/** @return the number of tensors (components) of the batch */
SL_EXPORT int sl_batch_num_tensors(const sl_batch_t *b);

/** @return tensor i, valid until sl_batch_release(); NULL when out of range */
SL_EXPORT const sl_tensor_t *sl_batch_tensor(const sl_batch_t *b, int i);

/** @return the tensor named name, or NULL */
SL_EXPORT const sl_tensor_t *sl_batch_find(const sl_batch_t *b, const char *name);

/** @return the bytes of the batch's tensors on the wire */
SL_EXPORT size_t sl_batch_size(const sl_batch_t *b);

/** @return the id of the worker task the batch came from */
SL_EXPORT uint64_t sl_batch_task_id(const sl_batch_t *b);

/** @return the address ("host:port") of the worker that made the batch,
 *  valid until sl_batch_release() */
SL_EXPORT const char *sl_batch_worker(const sl_batch_t *b);

/** @return the round of a coordinated read the batch belongs to (0 otherwise) */
SL_EXPORT uint64_t sl_batch_round(const sl_batch_t *b);

/** @return what the dispatcher said when the iterator joined its job, for
 *  the user to see (e.g. that the repetition of a named job had already
 *  ended, or was collected and is created again), or "";
 *  valid until sl_iterator_close() */
SL_EXPORT const char *sl_iterator_notice(const sl_iterator_t *it);

/** @return the name of a target ("any", "local"), or NULL when out of range */
SL_EXPORT const char *sl_target_workers_name(sl_target_workers_t t);

/** Parses a target's name. @return 0, or SL_EINVAL */
SL_EXPORT int sl_target_workers_parse(const char *name, sl_target_workers_t *out);

/**
 * The provenance of the batch's elements, in element order. Contiguous
 * records come merged into one run, except in a batch the worker sent in
 * the dense form (a shuffled one, docs/protocol.md): there each record is
 * a run of its own.
 * @param[in] b the batch
 * @param[out] num_runs how many runs; 0 when the worker sent none (an older
 *             worker), else between 1 and the batch's source records (its
 *             elements, unless batches nest: GetElementResponse.num_records),
 *             their counts summing to those records
 * @return the runs, valid until sl_batch_release(b); NULL when there are none
 *         (or, with *num_runs 0, when there was no memory to decode them:
 *         the first call decodes them from the wire's form, so calls on one
 *         batch must not race each other)
 */
SL_EXPORT const sl_provenance_run_t *sl_batch_provenance(const sl_batch_t *b, size_t *num_runs);

/**
 * The split-done notices (DYNAMIC sharding) that reached the iterator with
 * this batch or, from end-of-sequence frames, since the previous batch it
 * returned. A notice comes after every batch that holds records of its split.
 * @param[out] num how many
 * @return the notices, valid until sl_batch_release(b); NULL when none
 */
SL_EXPORT const sl_split_done_t *sl_batch_splits_done(const sl_batch_t *b, size_t *num);

/**
 * The split-done notices that arrived after the last batch the iterator
 * returned (with end-of-sequence frames): read them once sl_iterator_next()
 * has returned the end of the sequence.
 * @param[out] num how many
 * @return the notices, valid until the next sl_iterator_next() or
 *         sl_iterator_close(); NULL when none
 */
SL_EXPORT const sl_split_done_t *sl_iterator_splits_done(const sl_iterator_t *it, size_t *num);

/**
 * Records of the job a worker delivered to this iterator that never reached
 * its caller, as far as the iterator knows now (DYNAMIC with provenance, an
 * anonymous job: each split's notice says how many records its worker
 * delivered, and the iterator counts those its caller was given; the count
 * is brought up to date at the end of the sequence and at each
 * checkpoint). 0 unless a batch was lost on the way, which no path should
 * do: the first loss is also said on stderr. Always 0 for an iterator that
 * keeps no record of what it received, and for a named job's (its
 * consumers share the splits' records).
 */
SL_EXPORT uint64_t sl_iterator_records_missing(sl_iterator_t *it);

/**
 * Takes a checkpoint of the iterator: which elements the batches returned
 * so far held (and, for a restored iterator, those of its checkpoint), as
 * opaque bytes. sl_iterator_restore() in any process continues right after
 * the last batch returned: every other element of the job, exactly once,
 * also mid-epoch and with shuffle and filter in the pipeline. Needs an
 * iterator that is not coordinated (num_consumers 0), with
 * SL_SHARDING_DYNAMIC and opts.provenance not below 0, or of its own
 * anonymous job with a static policy (FILE, DATA, FILE_OR_DATA, HINT) and
 * opts.provenance above 0. At most opts.max_ledger_runs runs of positions
 * (contiguous records make one run). An iterator of a named job (one rank
 * of several) holds what its own caller was given: merge the ranks'
 * checkpoints with sl_checkpoint_merge(); the ranks checkpoint after
 * their batch of a common step (its checkpoint starts at the place every
 * rank had been given up to when it got that batch: ranks that all-reduce
 * every step need no barrier; others take no batch past the step until
 * every rank has checkpointed). A DYNAMIC iterator first asks the dispatcher
 * which epochs are done (one heartbeat's round trip, waited for at most a
 * heartbeat interval), so that the checkpoint holds only the epochs still
 * open.
 * @param[out] out the bytes, malloc'd: free() or sl_free() them
 * @return 0; SL_EINVAL (not such an iterator), SL_ETOOBIG, -ENOMEM; the
 *         message in sl_iterator_errmsg()
 */
SL_EXPORT int sl_iterator_checkpoint(sl_iterator_t *it, uint8_t **out, size_t *len);

/**
 * Opens an iterator that continues from a checkpoint: a new job over
 * dataset_id (the checkpoint's dataset) whose splits skip every element the
 * checkpoint holds. opts as for sl_iterator_checkpoint(). *out is set also
 * on failure (close it). Takes the checkpoints of this library (versions
 * 1 to 6; a version 5 or 6 one may start within an epoch and then needs a
 * dispatcher that starts a job there, SL_EVERSION otherwise; a version 6
 * one holds bitmaps, and when its runs pass opts.max_ledger_runs it goes
 * to the dispatcher as a position set of version 3, which a dispatcher of
 * 2026-12-04 or later reads).
 *
 * With opts.job_name (DYNAMIC): every rank restores the same (merged)
 * checkpoint with the same job name and repetition; the first creates the
 * named job skipping what the checkpoint holds, the others join it, any
 * number of them (elastic resume). A running job of that name and
 * repetition made otherwise (another checkpoint, or none) refuses the
 * rank with SL_ECONFLICT; an ended one of another checkpoint is replaced.
 * @return as sl_iterator_open(); SL_EDATA (not a checkpoint, or damaged),
 *         SL_EINVAL (options, or another dataset's checkpoint), SL_ETOOBIG,
 *         SL_ECONFLICT (a named job of another checkpoint is running)
 */
SL_EXPORT int sl_iterator_restore(sl_client_t *client, uint64_t dataset_id, const sl_iterator_opts_t *opts,
                                  const uint8_t *ckpt, size_t len, sl_iterator_t **out);

/**
 * Takes what the iterator recorded since the last call (or since it was
 * opened or restored): a delta, small opaque bytes that an
 * sl_ckpt_builder_t in any process replays to take the checkpoint this
 * iterator would take, without the iterator sending a whole checkpoint.
 * Per batch returned, a delta holds that batch's provenance and split-done
 * notices (about 3 bytes an element shuffled, far fewer in order) and
 * nothing that grows with the run. Needs opts.ledger_deltas > 0 and an
 * iterator that takes checkpoints (see sl_iterator_checkpoint()). Take it
 * after each batch, or every few: past 64 MiB not taken, the iterator
 * keeps no deltas any more (SL_ETOOBIG from then on).
 * @param[out] out the delta, malloc'd: free() or sl_free() it
 * @param[out] ckpt NULL, or the iterator's checkpoint at the same moment
 *             (what a builder that applied every delta up to this one
 *             gives), malloc'd
 * @return 0; SL_EINVAL (not such an iterator, or no opts.ledger_deltas),
 *         SL_ETOOBIG, -ENOMEM; the message in sl_iterator_errmsg()
 */
SL_EXPORT int sl_iterator_delta(sl_iterator_t *it, uint8_t **out, size_t *len, uint8_t **ckpt, size_t *ckpt_len);

/** Replays an iterator's deltas into checkpoints (sl_ckpt_builder_open()). */
typedef struct sl_ckpt_builder sl_ckpt_builder_t;

/**
 * Opens a checkpoint builder for the iterator that was opened over
 * dataset_id, or restored from ckpt: a record of its own of what the
 * iterator returned, fed with the iterator's deltas in the order it gave
 * them (sl_ckpt_builder_apply()). Needs no dispatcher.
 * @param[in] auth_token_file the cluster token of the iterator's client
 *            (checkpoints are MAC'd with it); NULL: SLUICE_AUTH_TOKEN_FILE
 *            if set, else none
 * @param[in] max_ledger_runs the iterator's opts.max_ledger_runs
 * @param[in] ckpt the checkpoint the iterator was restored from, or NULL
 *            (len 0) for an iterator opened anew
 * @param[out] out the builder; set also on failure (close it)
 * @return 0; SL_EDATA / SL_EINVAL (ckpt refused, as by
 *         sl_iterator_restore(); the token file), SL_ETOOBIG, -ENOMEM; the
 *         message in sl_ckpt_builder_errmsg()
 */
SL_EXPORT int sl_ckpt_builder_open(uint64_t dataset_id, const char *auth_token_file, size_t max_ledger_runs,
                                   const uint8_t *ckpt, size_t len, sl_ckpt_builder_t **out);

/**
 * Applies a delta of sl_iterator_delta(). All of it is checked before any
 * of it is applied: a delta refused changes nothing, and the builder takes
 * the next one as if it had not come (the caller decides whether a lost
 * delta matters; a skipped one makes later checkpoints wrong).
 * @return 0; SL_EDATA (not a delta, damaged), SL_EINVAL (another
 *         dataset's), -ENOMEM; the message in sl_ckpt_builder_errmsg()
 */
SL_EXPORT int sl_ckpt_builder_apply(sl_ckpt_builder_t *b, const uint8_t *delta, size_t len);

/**
 * The checkpoint of what the deltas applied so far record: the same bytes
 * as the iterator's sl_iterator_checkpoint() right after it gave the last
 * of them.
 * @param[out] out the bytes, malloc'd: free() or sl_free() them
 * @return as sl_iterator_checkpoint(); the message in sl_ckpt_builder_errmsg()
 */
SL_EXPORT int sl_ckpt_builder_checkpoint(sl_ckpt_builder_t *b, uint8_t **out, size_t *len);

/** @return the message of the builder's last failure ("out of memory" for NULL) */
SL_EXPORT const char *sl_ckpt_builder_errmsg(const sl_ckpt_builder_t *b);

/** Frees the builder. NULL is ignored. */
SL_EXPORT void sl_ckpt_builder_close(sl_ckpt_builder_t *b);

/**
 * Merges the checkpoints of the ranks of one named DYNAMIC job, taken when
 * all of them stopped at a common step, into one: the union of what their
 * callers were given. A rank that left the job mid-run took its last
 * checkpoint as it left: add it to the merges until the job's fold passes
 * it (docs/fault-tolerance.md, "A rank that leaves"). Everything else (in
 * flight, buffered in a client, not yet read) is read again by the job
 * restored from it
 * (sl_iterator_restore() with the job name), with any number of ranks.
 * Each checkpoint's tag is checked under the cluster token, and the result
 * tagged under it. Needs no dispatcher.
 * @param[in] ckpts n checkpoints of lens[i] bytes, of one dataset
 * @param[in] auth_token_file the cluster token the checkpoints were made
 *   with; NULL: SLUICE_AUTH_TOKEN_FILE if set, else none
 * @param[out] out the merged checkpoint, malloc'd: free() or sl_free() it
 * @param[out] err a message on failure (errlen bytes at most)
 * @return 0; SL_EDATA (not a checkpoint, damaged, another token), SL_EINVAL
 *         (no checkpoints, other datasets), SL_ETOOBIG
 *         (more than 2097152 runs), -ENOMEM, or the token file's error
 */
SL_EXPORT int sl_checkpoint_merge(const uint8_t *const *ckpts, const size_t *lens, size_t n,
                                  const char *auth_token_file, uint8_t **out, size_t *out_len, char *err,
                                  size_t errlen);

/** free(), for callers that cannot reach libsluice's C library (Python's
 *  ctypes): frees what sl_iterator_checkpoint() returned. NULL is ignored. */
SL_EXPORT void sl_free(void *p);

/** Frees the batch and every tensor in it. */
SL_EXPORT void sl_batch_release(sl_batch_t *b);

#ifdef __cplusplus
}
#endif
#endif /* SLUICE_H */
