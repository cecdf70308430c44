/*
 * task.c: see task.h.
 *
 * The producer (the pipeline thread) is RUNNING, then ENDED (end of
 * sequence) or FAILED (the pipeline's error). While RUNNING it may sleep on
 * `wake` for room in a full buffer or, under DYNAMIC, for a split; a stop
 * request (sl_task_free) wakes it and it exits, leaving the state RUNNING.
 * The network thread (the consumer) takes batches out and puts splits in.
 * One mutex guards everything the two share but the DYNAMIC split table,
 * which has its own (track_mu): the producer counts each batch into the
 * table under that alone, so that the network thread taking batches out
 * does not wait for the count. Whoever holds both took mu first. The
 * producer sleeps on `wake`, and wakes the consumer through an event on
 * its loop.
 */
#include "task.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "metrics.h"
#include "posbits.h"
#include "posset.h"
#include "pipeline.h"
#include "shm.h"
#include "spec.h"
#include "split_track.h"

#define MAX_SPLITS 512 /* GetSplitResponse.splits' max_count: an answer fills an empty queue */

struct split {
    uint32_t file_index;
    uint64_t begin, end;
    uint64_t split_id;
    sl_skip_run_t *skips; /* owned until handed to the tracker */
    uint32_t num_skips;
    uint64_t epoch; /* whose reading of the records this is (sl_split_t.epoch) */
    uint64_t asked; /* the records a split the request that brought it asked for (0: no length) */
};

enum producer_state { PRODUCER_RUNNING, PRODUCER_ENDED, PRODUCER_FAILED };

/* The provenance's form on the wire that the consumers read. */
enum prov_form { PROV_NONE, PROV_RUNS, PROV_DENSE };

struct sl_task {
    sluice_TaskDef def;
    sl_task_config_t cfg;
    /* The task's share of the worker's memory budget (cfg.mem), which its
     * pipeline and its buffer charge: a refusal names who holds the budget
     * (membudget.h), GET /v1/tasks shows it. NULL without a budget. */
    sl_membudget_t share, *mem;
    sl_spec_t *spec;
    sl_pipeline_t *pipeline;
    pthread_t thread;
    bool thread_started;
    struct event *notify_ev;
    sl_task_notify_fn notify;
    void *notify_arg;

    /* How the consumers last asked for provenance (enum prov_form), set by
     * the network thread, read by the producer: sl_task_prov_form(). */
    atomic_int prov_form;

    /* Shared memory (sl_task_lend_region()): the region the pipeline
     * makes its batch blocks in (a reference), read by the pipeline under
     * lend_mu, written by the network thread under it; the client it is
     * for; and whether a second client ended it. A task of coordinated
     * reads has a region per consumer instead (lend_by, num_consumers of
     * them): its k-th batch goes to consumer k mod num_consumers (rounds.h). */
    pthread_mutex_t lend_mu;
    sl_shm_region_t *lend;
    uint64_t lend_client;
    bool lend_client_set, lend_off;
    struct lend_slot {
        sl_shm_region_t *region;
        uint64_t client; /* the client that first claimed this consumer index (0: none yet) */
    } *lend_by;
    uint32_t lend_n;

    pthread_mutex_t mu;
    pthread_cond_t wake; /* the producer waits here for room or splits */
    bool stop;
    enum producer_state producer;
    int error_code;
    char error[512];
    /* Finished batches, a ring of cfg.buffer_batches. */
    sl_wire_batch_t **ring;
    unsigned head, count;
    size_t held_bytes; /* in the ring, plus taken and not yet released */
    /* held_bytes and what the worker holds of the task's batches until its
     * clients acknowledge them (sl_task_own_bytes()); atomic: read by the
     * pipeline's charges (sl_memwait_t.own). */
    size_t own_bytes;
    unsigned taken;    /* batches taken and not yet released */
    unsigned unfilled; /* of them, those that wait for the next ones (sl_task_set_unfilled()) */
    /* Of held_bytes, the budget's charges that holders of sent batches
     * took over (sl_task_hand_over()): not the task's to give back. */
    size_t handed_bytes;
    /* The producer sleeps on `wake` for room in the ring; it is woken once
     * the ring has drained to half (room_to_wake()), so that it makes
     * several batches per wake-up rather than one. */
    bool room_wait;
    /* The producer sleeps on `wake` for the worker's memory budget to have
     * room for its finished batch, which the task's own batches give back
     * as they are written (sl_task_release()). */
    bool budget_wait;
    /* sl_task_take() found nothing: the network thread has a request
     * parked, and the next batch made must tell its loop. Batches made
     * while nobody waits go into the ring without waking the loop. */
    bool taker_waiting;
    /* sl_task_take_extra() found nothing: the next batch may go past the
     * buffer's bytes (cleared once a batch is made). */
    bool extra_wanted;
    /* DYNAMIC splits for want_epoch, and once crossing also for later
     * epochs, each read in its own epoch or later. */
    struct split splits[MAX_SPLITS];
    unsigned split_head;
    /* Written under mu, atomically: sl_task_want_splits() reads it without
     * mu first (the loop asks after every batch it gives back). */
    unsigned split_count;
    /* Whether a queued split has a smaller id than one queued before it (a
     * lost worker's split handed out again): else the head holds the least
     * id, and done_below_of() need not walk a queue of up to 512 for every
     * split taken (under mu; false again once the queue is empty). */
    bool queue_unsorted;
    uint64_t want_epoch;
    /* Written under mu, atomically: sl_task_want_splits() reads it without
     * mu first. */
    bool epoch_exhausted;
    /* The dispatcher handed this task splits of a later epoch than it asked
     * for (GetSplitRequest.cross_epochs): queued splits then outlive the
     * pipeline's epoch, and a split of a later epoch at the queue's head
     * ends the one it is in (its cursor ran out to hand that one out). */
    bool crossing;
    /* The splits a request keeps queued: split_prefetch, times as many as
     * the target length is of the last split taken when splits come
     * shorter (rate_split_taken()), at most MAX_SPLITS. Written under mu,
     * atomically: sl_task_want_splits() reads it without mu first. */
    unsigned prefetch_now;
    bool splits_finished; /* the dispatcher has no split for any epoch (drained) */
    bool split_request_out; /* network thread only; an ended task answers no end while it is out */
    uint64_t split_next_id; /* one more than the largest split id received (network thread, under mu) */
    /* done_below_of() without the tracker: split_next_id or a queued
     * split's id, the least. Under track_mu, written also under mu as the
     * queue changes, in the same hold of track_mu as a split taken from
     * the queue goes into the tracker: a batch's send reads it with the
     * tracker's least id under track_mu alone (sl_task_batch_sent()). */
    uint64_t queued_below;
    /* The dispatcher said to ask again later (retry_ms): no request while
     * it is pending. Its own state, not a flag beside it that could
     * disagree with it and hold the task back for ever. */
    struct event *retry_ev;
    /* Network thread only: a hint that retry_ev is pending, set as it is
     * added and cleared as it fires, read for every request a client sends
     * (sl_task_split_waits()) without the event base's lock. Only a hint:
     * what holds a request back, and sl_task_retry_now(), read the timer. */
    bool retry_armed;
    /* Network thread only: the last answer said the task is at
     * --max-outstanding-splits (GetSplitResponse.at_bound). */
    bool at_bound;
    uint64_t split_seq;     /* network thread only: request_seq of the last answered split request */
    /* The pipeline's rate through its splits (records/s, 0: not measured
     * yet), from which a split request asks for splits of split_target_ms
     * (docs/sharding.md): records of the splits it finished in the current
     * window, and the time it spent on them, not waiting for a split. */
    double split_rate;
    double split_taken_at;   /* when the pipeline took its last split; 0: none yet */
    uint64_t split_taken_records;
    uint64_t asked_records; /* what the split request out asked a split to hold (under mu) */
    unsigned asked_splits;  /* and how many splits it asked for (under mu) */
    /* 0, or the splits queued after an answer that held fewer than its
     * request asked for (a task's share of what is left of the job, or its
     * balanced share): the next request goes once half of them are read
     * (or half of split_prefetch, whichever is more), not at half of
     * prefetch_now (under mu). A queue of up to 512 splits asked again
     * after every answer cut short: hundreds of requests a job where the
     * epochs are short and the job is not much longer than the queue. */
    unsigned answer_cap;
    double split_waited;     /* seconds waited in next_split() since then */
    double split_wait_total; /* seconds waited in next_split() in all, but the wait under way */
    double split_wait_since; /* when the wait under way (split_wait) began */
    double window_seconds;
    uint64_t window_records;
    unsigned rate_windows; /* windows measured into split_rate (RATE_SAID_WINDOWS once seeded) */
    /* Counters for the status. */
    uint64_t batches, elements, bytes;
    uint64_t produced;
    double pipeline_seconds;
    uint64_t records_skipped;
    /* Stall detection: the pipeline is in sl_pipeline_next() and not
     * waiting in next_split() since working_since (CLOCK_MONOTONIC s). */
    bool working;
    double working_since;
    bool split_wait; /* the pipeline waits in next_split() with no split queued */
    /* DYNAMIC: the splits handed to the pipeline and not yet reported done
     * (split_track.h); NULL under the other policies. Under track_mu, not
     * mu (taken inside mu where both are held). */
    sl_split_track_t *track;
    pthread_mutex_t track_mu;
    /* The producer's room for a batch's tally rows when the table holds
     * more splits than a batch keeps inline (tally_rows()); its thread's
     * alone. */
    sl_split_done_t *tally_scratch;
    unsigned tally_cap;
    /* The split the producer's last batch counted under track_mu lay in
     * wholly, when it did (one_split_known): a batch wholly in it too (an
     * unshuffled split's next batches) takes its tally row from here,
     * without track_mu or a lookup (out_in_one_split()). Its `delivered`
     * is what such batches counted since it went into the tracker, which
     * gets it (sl_split_track_settle_rows()) in the producer's next hold of
     * track_mu for a batch, and before the end counts out what left the
     * pipeline: that count is read nowhere else. Its thread's alone. */
    sl_split_done_t one_split;
    bool one_split_known;
    /* The sending thread's like of it: the split the last batch sent under
     * track_mu lay in wholly (sent_split_known), and what batches wholly in
     * it sent since (its `delivered`). Those batches are settled without
     * track_mu (sl_task_batch_sent()); the table gets their count with the
     * next send under track_mu: a batch with the split's last record (an
     * unshuffled split's last batch), of another split, a done split
     * waiting for its notice, or an end of sequence. Until then that split
     * is not done (behind a shuffle its notice may go with a later frame
     * than its last batch's), and a frame's done_below is the last one
     * found under track_mu (sent_below): both say less than is true, never
     * more. The network thread's alone. */
    sl_split_done_t sent_split;
    bool sent_split_known;
    uint64_t sent_below;
    bool end_sent; /* an end-of-sequence answer went out (sl_task_batch_sent(NULL)) */
    /* Static policies, a restored iterator's job: positions not to yield. */
    sl_posbits_t exclude;
};

/* A split this task got but its pipeline will never read (the pipeline
 * left the epoch or ended): it is done at once, with nothing read, so that
 * it too gets its notice. Takes s's skip runs. */
static void split_unread(sl_task_t *t, struct split *s)
{
    sl_split_t ss = {.file_index = s->file_index, .begin = s->begin, .end = s->end, .split_id = s->split_id,
                     .epoch = s->epoch};
    sl_skip_run_t *skips = s->skips;
    s->skips = NULL;
    if (!t->track) {
        free(skips);
        return;
    }
    pthread_mutex_lock(&t->track_mu);
    if (sl_split_track_add(t->track, s->epoch, &ss, skips) == 0)
        sl_split_track_read(t->track, s->epoch, &ss, 0);
    pthread_mutex_unlock(&t->track_mu);
}

/* Every split with a smaller id is done: the smallest id the tracker
 * (tracked: sl_split_track_min_id()) or the queue still holds, else the
 * next one to come (under t->mu). */
static uint64_t done_below_of(const sl_task_t *t, uint64_t tracked)
{
    uint64_t below = t->split_next_id;
    if (tracked < below)
        below = tracked;
    /* The queue's head alone while the ids queued rise; else all of it. */
    unsigned walk = t->queue_unsorted ? t->split_count : t->split_count > 0;
    for (unsigned i = 0; i < walk; i++) {
        uint64_t id = t->splits[(t->split_head + i) % MAX_SPLITS].split_id;
        if (id < below)
            below = id;
    }
    return below;
}

/* Sets queued_below after the queue changed (under t->mu; not track_mu). */
static void queue_changed(sl_task_t *t)
{
    if (!t->track)
        return;
    uint64_t below = done_below_of(t, UINT64_MAX);
    pthread_mutex_lock(&t->track_mu);
    t->queued_below = below;
    pthread_mutex_unlock(&t->track_mu);
}

/* Empties the queue of splits, each one done unread (under t->mu). Until
 * queued_below is set again, a send still counts them as queued. */
static void splits_clear(sl_task_t *t)
{
    for (unsigned i = 0; i < t->split_count; i++)
        split_unread(t, &t->splits[(t->split_head + i) % MAX_SPLITS]);
    t->split_head = 0;
    __atomic_store_n(&t->split_count, 0, __ATOMIC_RELAXED);
    t->queue_unsorted = false;
    queue_changed(t);
}

/* The pipeline's split_read and dropped (pipeline.h): any pipeline thread. */
static void on_split_read(void *arg, uint64_t epoch, const sl_split_t *split, uint64_t records)
{
    sl_task_t *t = arg;
    pthread_mutex_lock(&t->track_mu);
    sl_split_track_read(t->track, epoch, split, records);
    pthread_mutex_unlock(&t->track_mu);
}

static void on_dropped(void *arg, const sl_provenance_run_t *runs, uint64_t n)
{
    sl_task_t *t = arg;
    pthread_mutex_lock(&t->track_mu);
    sl_split_track_settle(t->track, runs, n, SL_SETTLE_DROPPED);
    pthread_mutex_unlock(&t->track_mu);
}

static void notify_loop(sl_task_t *t)
{
    event_active(t->notify_ev, EV_READ, 0);
}

/* Whether a producer waiting for room should be woken now (under mu): the
 * ring has drained to half its batches and, unless it is empty, to half its
 * bytes. A producer never waits on more than that, so it cannot be left
 * asleep while the ring drains (an empty ring always has room). */
static bool room_to_wake(const sl_task_t *t)
{
    if (!t->room_wait || t->count > t->cfg.buffer_batches / 2)
        return false;
    return t->count + t->taken == 0 || t->held_bytes <= t->cfg.buffer_bytes / 2;
}

/* The wait the dispatcher asked for is over: ask for splits again. */
static void on_retry(evutil_socket_t fd, short what, void *arg)
{
    sl_task_t *t = arg;
    (void)fd;
    (void)what;
    t->retry_armed = false;
    t->notify(t, t->notify_arg);
}

static void on_notify(evutil_socket_t fd, short what, void *arg)
{
    sl_task_t *t = arg;
    (void)fd;
    (void)what;
    t->notify(t, t->notify_arg);
}

static double seconds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The rate is taken over windows of at least this long, so that splits of
 * a fraction of a millisecond (the first ones) still measure it well; the
 * first rate is taken from the first split read, so that the second request
 * already asks for splits of the target length. */
#define RATE_WINDOW_S 0.005

/* A split request says the rate (GetSplitRequest.records_per_second) once
 * this many windows went into it, or it was seeded from a task before: the
 * first window is one split of the least length, and a rate taken from it
 * was off by half (114,000,000 records a second, then 65,000,000). With
 * it the dispatcher counted a task's 370 ms of queued splits as 200 ms and
 * left the epoch's end to the others, which then waited on it. */
#define RATE_SAID_WINDOWS 4

/* The records a split should hold: what the pipeline reads in
 * split_target_ms at its measured rate (0 before it has one; under mu). */
static double target_records(const sl_task_t *t)
{
    return t->split_rate * t->cfg.split_target_ms / 1000.0;
}

/* The pipeline takes a split of records records, whose request asked for
 * splits of asked records (0: no length), at now (under mu): the one it
 * took before is read, in the time since less the time it waited. */
static void rate_split_taken(sl_task_t *t, double now, uint64_t records, uint64_t asked)
{
    if (t->split_taken_at > 0) {
        double busy = now - t->split_taken_at - t->split_waited;
        t->window_seconds += busy > 0 ? busy : 0;
        t->window_records += t->split_taken_records;
        if (t->window_seconds >= RATE_WINDOW_S || (t->split_rate == 0 && t->window_seconds > 0)) {
            double r = (double)t->window_records / t->window_seconds;
            /* Smoothed: half the last window, half what came before. */
            t->split_rate = t->split_rate > 0 ? (t->split_rate + r) / 2 : r;
            t->rate_windows++;
            t->window_seconds = 0;
            t->window_records = 0;
        }
    }
    t->split_taken_at = now;
    t->split_taken_records = records;
    /* Splits shorter than the length asked for (a small dataset's files or
     * epochs end them, or --max-split-size does) come in more at a time:
     * a request's answer then still lasts about as long as split_prefetch
     * splits of the target length, and a small epoch repeated does not
     * cost a hand-out and its commit every few splits. Not the splits of a
     * request that asked for no length (before a rate): compared with the
     * target the rate gave since, its first splits of the least length made
     * the next request ask for 64, and a dataset's first job handed its
     * first worker half the range at once. */
    unsigned p = t->cfg.split_prefetch, most = MAX_SPLITS / p;
    double shorter = records > 0 ? (double)asked / (double)records : 0;
    if (shorter >= 2.0)
        p *= shorter >= most ? most : (unsigned)shorter;
    __atomic_store_n(&t->prefetch_now, p, __ATOMIC_RELAXED);
    t->split_waited = 0;
}

/* The pipeline's split source: blocks the pipeline thread until the network
 * thread has a split of `epoch`, or knows that the epoch has none left. */
static int next_split(void *arg, uint64_t epoch, sl_split_t *out)
{
    sl_task_t *t = arg;
    int rc;
    uint64_t asked = 0;
    pthread_mutex_lock(&t->mu);
    if (epoch != t->want_epoch) {
        /* The pipeline moved to a new epoch (repeat): the old one is done,
         * and so are its splits left queued (an iteration a take cut
         * short); but not those of later epochs, nor lost workers' handed
         * out behind them (crossing: an iteration ends only at a later
         * epoch's split or with every epoch's cursor run out). */
        if (!t->crossing)
            splits_clear(t);
        t->want_epoch = epoch;
        __atomic_store_n(&t->epoch_exhausted, t->splits_finished, __ATOMIC_RELAXED);
    }
    for (;;) {
        if (t->stop) {
            rc = SL_ECANCELLED;
            break;
        }
        if (t->error_code) {
            rc = t->error_code;
            break;
        }
        if (t->split_count > 0 && t->crossing && t->splits[t->split_head].epoch > epoch) {
            rc = 1; /* the epoch's cursor ran out: the split waits for its own */
            break;
        }
        if (t->split_count > 0) {
            struct split *s = &t->splits[t->split_head];
            asked = s->asked;
            *out = (sl_split_t){.file_index = s->file_index,
                                .begin = s->begin,
                                .end = s->end,
                                .split_id = s->split_id,
                                .num_skips = s->num_skips,
                                .epoch = s->epoch};
            t->split_head = (t->split_head + 1) % MAX_SPLITS;
            __atomic_store_n(&t->split_count, t->split_count - 1, __ATOMIC_RELAXED);
            if (t->split_count == 0)
                t->queue_unsorted = false;
            /* The tracker owns the skip runs from now on. */
            rc = 0;
            if (t->track) {
                pthread_mutex_lock(&t->track_mu);
                rc = sl_split_track_add(t->track, out->epoch, out, s->skips);
                t->queued_below = done_below_of(t, UINT64_MAX); /* in the tracker now */
                pthread_mutex_unlock(&t->track_mu);
            }
            s->skips = NULL;
            break;
        }
        if (t->epoch_exhausted) {
            rc = 1;
            break;
        }
        notify_loop(t);
        /* Waiting for the dispatcher is not being stuck. */
        t->working = false;
        t->split_wait = true;
        double w0 = seconds_now();
        t->split_wait_since = w0;
        pthread_cond_wait(&t->wake, &t->mu);
        double waited = seconds_now() - w0;
        t->split_waited += waited;
        t->split_wait_total += waited;
        t->split_wait = false;
    }
    t->working = true;
    t->working_since = seconds_now();
    if (rc == 0)
        rate_split_taken(t, t->working_since, out->end - out->begin, asked);
    pthread_mutex_unlock(&t->mu);
    /* Ask for the next splits while this one is read. */
    if (rc == 0)
        notify_loop(t);
    return rc;
}

/* The pipeline's split source says whether the dispatcher has no split for
 * any epoch any more (drained, or lost): its repeat then stops at an empty
 * iteration instead of spinning through empty epochs. */
static bool splits_finished(void *arg)
{
    sl_task_t *t = arg;
    pthread_mutex_lock(&t->mu);
    bool finished = t->splits_finished;
    pthread_mutex_unlock(&t->mu);
    return finished;
}

static sl_metric_t *m_batch_latency, *m_produced;
static pthread_once_t metrics_once = PTHREAD_ONCE_INIT;

static void metrics_init(void)
{
    m_batch_latency = sl_metric_register(SL_METRIC_HISTOGRAM, "sluice_worker_batch_latency_seconds", NULL,
                                         "Time the pipeline takes to make one batch.", sl_metric_latency_buckets,
                                         sl_metric_latency_buckets_count);
    m_produced = sl_metric_register(SL_METRIC_COUNTER, "sluice_worker_batches_produced_total", NULL,
                                    "Batches the pipelines made.", NULL, 0);
}

void sl_task_prov_form(sl_task_t *task, bool provenance, bool dense)
{
    int form = !provenance ? PROV_NONE : dense ? PROV_DENSE : PROV_RUNS;
    /* Stored only when it changes: called for every batch sent, it would
     * otherwise take the line from the producer's core each time. */
    if (atomic_load_explicit(&task->prov_form, memory_order_relaxed) != form)
        atomic_store_explicit(&task->prov_form, form, memory_order_relaxed);
}

/* Encodes b's provenance for the wire in the form the consumers read, on
 * the producer's thread, where b's runs were just written and still are
 * in the cache: the network thread then sends the encoded bytes without
 * reading the runs (a shuffled batch of 1024 has 24 KB of them), and the
 * runs' memory, reused by the next batch, does not bounce between the two
 * threads' cores. Not done while the consumers said they read no
 * provenance (a DYNAMIC task starts in the dense form: sl_task_new()); a
 * consumer that reads another form gets it encoded at the send
 * (sl_wire_batch_encode_prov() keeps a form that serves it). Without
 * memory it is left to the send, which answers the consumer with the
 * error. */
static void encode_prov(sl_task_t *t, sl_wire_batch_t *b)
{
    int form = atomic_load_explicit(&t->prov_form, memory_order_relaxed);
    if (b->prov_n > 0 && form != PROV_NONE)
        (void)sl_wire_batch_encode_prov(b, form == PROV_DENSE);
}

/* Where sl_split_track_out() writes b's tally rows, room for size: the
 * batch's own rows when they fit, else the task's scratch (grown to size),
 * so that a batch whose rows fit in the batch, most of them, costs no
 * allocation however many splits the table holds. NULL without memory. */
static sl_split_done_t *tally_rows(sl_task_t *t, sl_wire_batch_t *b, unsigned size)
{
    if (size <= SL_WIRE_TALLY_INLINE)
        return b->tally_one;
    if (size > t->tally_cap) {
        sl_split_done_t *p = realloc(t->tally_scratch, size * sizeof *p);
        if (!p)
            return NULL;
        t->tally_scratch = p;
        t->tally_cap = size;
    }
    return t->tally_scratch;
}

/* Puts b's n tally rows, written at rows, in the batch: its own rows, or a
 * copy of just those on the heap. Without memory for the copy the batch
 * carries none (ntally 0, tally NULL), as when there was no room to count
 * them into: its send settles run by run. */
static void tally_keep(sl_wire_batch_t *b, const sl_split_done_t *rows, unsigned n)
{
    b->ntally = n;
    b->tally = NULL;
    if (n == 0)
        return;
    if (n <= SL_WIRE_TALLY_INLINE)
        b->tally = b->tally_one;
    else if (!(b->tally = malloc(n * sizeof *b->tally)))
        b->ntally = 0;
    if (b->tally && b->tally != rows)
        memcpy(b->tally, rows, n * sizeof *b->tally);
}

/* Whether b lies wholly in the producer's one_split: then b's tally row is
 * that split's, counted there, and b's span is found. */
static bool out_in_one_split(sl_task_t *t, sl_wire_batch_t *b)
{
    if (!t->one_split_known || b->prov_n == 0)
        return false;
    sl_prov_span_t *span = &b->prov_span;
    sl_prov_span(sl_wire_batch_prov(b), b->prov_n, span);
    sl_split_done_t *one = &t->one_split;
    sl_provenance_run_t pair = {one->epoch, one->file_index, 0, 0};
    if (!span->one_pair || span->wraps || span->empty || span->pair != sl_prov_run_pair(&pair) ||
        span->lo < one->begin || span->hi >= one->end)
        return false;
    b->tally_one[0] = *one;
    b->tally_one[0].delivered = span->records;
    b->tally = b->tally_one;
    b->ntally = 1;
    one->delivered += span->records;
    return true;
}

/* The records a thread counted in its own copy of a split's row (row,
 * when known) go into the tracker as how says (under track_mu): the
 * pipeline's one_split (SL_SETTLE_OUT), the send's sent_split
 * (SL_SETTLE_SENT). */
static void own_row_flush(sl_task_t *t, bool known, sl_split_done_t *row, enum sl_settle how)
{
    if (known && row->delivered > 0) {
        sl_split_track_settle_rows(t->track, row, 1, how);
        row->delivered = 0;
    }
}

/* Whether tally rows a and b are of one split. */
static bool same_split(const sl_split_done_t *a, const sl_split_done_t *b)
{
    return a->split_id == b->split_id && a->epoch == b->epoch && a->file_index == b->file_index &&
           a->begin == b->begin && a->end == b->end;
}

/* Counts b, which left the pipeline, split by split into its tally rows
 * (DYNAMIC): from one_split, or under track_mu. */
static void count_out(sl_task_t *t, sl_wire_batch_t *b)
{
    if (out_in_one_split(t, b))
        return;
    /* Counted split by split once, here: the send settles by these rows,
     * and they are the batch's tallies on the wire. Up to
     * SL_WIRE_TALLY_INLINE rows live in the batch itself. Without memory
     * for them the send settles run by run. The same walk finds the span
     * the provenance's encoding needs. Under track_mu alone: the batch is
     * not in the ring yet, so the network thread has nothing of it to
     * see. */
    pthread_mutex_lock(&t->track_mu);
    own_row_flush(t, t->one_split_known, &t->one_split, SL_SETTLE_OUT);
    sl_split_done_t *rows = tally_rows(t, b, sl_split_track_size(t->track));
    unsigned n = sl_split_track_out(t->track, sl_wire_batch_prov(b), b->prov_n, rows, &b->prov_span);
    pthread_mutex_unlock(&t->track_mu);
    tally_keep(b, rows, n);
    /* Wholly in one split: the next batches likely are too. */
    t->one_split_known = b->ntally == 1 && b->prov_n > 0 && b->tally[0].delivered == b->prov_span.records;
    if (t->one_split_known) {
        t->one_split = b->tally[0];
        t->one_split.delivered = 0;
    }
}

static void *producer_main(void *arg)
{
    sl_task_t *t = arg;
    for (;;) {
        sl_wire_batch_t *b = NULL;
        double t0 = seconds_now();
        pthread_mutex_lock(&t->mu);
        t->working = true;
        t->working_since = t0;
        pthread_mutex_unlock(&t->mu);
        int rc = sl_pipeline_next(t->pipeline, &b);
        double spent = seconds_now() - t0;
        if (rc == 0 && t->track) {
            count_out(t, b);
            b->prov_span_known = b->prov_n > 0;
            encode_prov(t, b);
            /* Counted split by split, the batch is settled by its tally
             * when sent: once encoded, its runs are not read again. */
            if (b->tally)
                sl_wire_batch_drop_runs(b);
        }
        pthread_mutex_lock(&t->mu);
        t->working = false;
        t->pipeline_seconds += spent;
        t->records_skipped = sl_pipeline_records_skipped(t->pipeline);
        if (rc != 0) {
            if (rc == 1) {
                t->producer = PRODUCER_ENDED;
                if (t->track) {
                    splits_clear(t);
                    pthread_mutex_lock(&t->track_mu);
                    own_row_flush(t, t->one_split_known, &t->one_split, SL_SETTLE_OUT);
                    sl_split_track_end(t->track);
                    pthread_mutex_unlock(&t->track_mu);
                }
            } else if (!t->stop) {
                t->producer = PRODUCER_FAILED;
                if (!t->error_code)
                    t->error_code = rc;
                if (!t->error[0])
                    snprintf(t->error, sizeof t->error, "%s", sl_pipeline_errmsg(t->pipeline));
                sl_log_error("task %" PRIu64 ": pipeline failed: %s", t->def.task_id, t->error);
            }
            pthread_mutex_unlock(&t->mu);
            notify_loop(t);
            return NULL;
        }
        /* Backpressure: wait while the buffer is full. A task always gets
         * room for one batch, whatever its size, so it cannot deadlock.
         * A batch counts with its provenance. */
        b->charged = sl_wire_batch_held_bytes(b);
        b->handed = 0;
        while (!t->stop && (t->count == t->cfg.buffer_batches ||
                            (t->count + t->taken > 0 && t->held_bytes + b->charged > t->cfg.buffer_bytes &&
                             !t->extra_wanted))) {
            t->room_wait = true;
            pthread_cond_wait(&t->wake, &t->mu);
        }
        t->room_wait = false;
        if (t->stop) {
            pthread_mutex_unlock(&t->mu);
            sl_wire_batch_free(b);
            return NULL;
        }
        /* The buffered batches are charged to the worker's memory budget
         * (released in sl_task_release()). Whether a tight budget is full
         * at this moment depends on timing, and a task must not fail on
         * that. While the task holds batches of its own, the charge waits
         * for them to be written, as it waits for room in the ring. */
        bool charged;
        while (!(charged = sl_membudget_try_charge(t->mem, b->charged)) && !t->stop &&
               t->count + t->taken > 0 && !t->extra_wanted) {
            if (!t->budget_wait)
                sl_membudget_count_wait(t->mem);
            t->budget_wait = true;
            pthread_cond_wait(&t->wake, &t->mu);
        }
        t->budget_wait = false;
        if (!charged && !t->stop) {
            /* With none of its own in the buffer, for what others give
             * back (a finished job's task before the worker drops it,
             * batches on their way to clients) and what the task's clients
             * acknowledge (own_bytes: batches held for them, which fill
             * the budget while a trainer pauses with a prefetch's queue
             * taking the room its batches gave back): without the task's
             * lock, which the loop takes to give room back. A batch wanted
             * past the buffer (sl_task_take_extra()) is charged past the
             * budget too: its own batches wait for it. */
            pthread_mutex_unlock(&t->mu);
            charged = sl_membudget_charge_wait(
                t->mem, b->charged,
                &(sl_memwait_t){.cancel = &t->stop, .own = &t->own_bytes, .overdraw = &t->extra_wanted});
            pthread_mutex_lock(&t->mu);
        }
        if (t->stop) {
            if (charged)
                sl_membudget_release(t->mem, b->charged);
            pthread_mutex_unlock(&t->mu);
            sl_wire_batch_free(b);
            return NULL;
        }
        if (!charged) {
            char msg[512];
            sl_membudget_refusal(t->mem, b->charged, "a finished batch in the task's buffer", msg, sizeof msg);
            t->producer = PRODUCER_FAILED;
            t->error_code = SL_ETOOBIG;
            snprintf(t->error, sizeof t->error, "task buffer: %s", msg);
            sl_log_error("task %" PRIu64 ": pipeline failed: %s", t->def.task_id, t->error);
            pthread_mutex_unlock(&t->mu);
            sl_wire_batch_free(b);
            notify_loop(t);
            return NULL;
        }
        t->ring[(t->head + t->count) % t->cfg.buffer_batches] = b;
        t->count++;
        t->produced++;
        sl_metric_observe(m_batch_latency, spent);
        sl_metric_add(m_produced, 1);
        t->held_bytes += b->charged;
        __atomic_add_fetch(&t->own_bytes, b->charged, __ATOMIC_RELEASE);
        __atomic_store_n(&t->extra_wanted, false, __ATOMIC_RELEASE);
        bool waiting = t->taker_waiting;
        t->taker_waiting = false;
        pthread_mutex_unlock(&t->mu);
        if (waiting)
            notify_loop(t);
    }
}

/* A task that cannot run fails at once and says why, as a pipeline that
 * failed while running: its clients get the error, not a task that never
 * produces. */
static int task_failed(sl_task_t *t, const sluice_TaskDef *def, int code, const char *why, sl_task_t **out)
{
    if (def->sharding == SL_SHARDING_DYNAMIC && !t->track && !(t->track = sl_split_track_new())) {
        sl_task_free(t);
        return -ENOMEM;
    }
    t->producer = PRODUCER_FAILED;
    t->error_code = code;
    snprintf(t->error, sizeof t->error, "%s", why);
    sl_log_error("task %" PRIu64 ": pipeline failed: %s", t->def.task_id, t->error);
    *out = t;
    return 0;
}

/* Room a block in the region keeps after a batch of size bytes for what
 * the answer's slot carries after the tensor bytes when it does not fit
 * in the answer (a shuffled DYNAMIC batch's provenance, a fixed width per
 * record in the dense form, and its tallies): the batch is then lent with
 * them. A tail that does not fit there is copied with the batch instead. */
static size_t tail_room(size_t size)
{
    return (size < ((size_t)1 << 20) ? size : (size_t)1 << 20) + SL_SHM_ALIGN;
}

/* sl_pipeline_opts_t.block_alloc: a block in the region of the client
 * that batch `index` goes to, if known and any (the pipeline's thread). */
static void *lend_alloc(void *arg, size_t size, uint64_t index)
{
    sl_task_t *t = arg;
    void *p = NULL;
    pthread_mutex_lock(&t->lend_mu);
    sl_shm_region_t *r = !t->lend_n ? t->lend : index != SL_PIPELINE_UNORDERED ? t->lend_by[index % t->lend_n].region : NULL;
    if (r)
        p = sl_shm_region_alloc(r, size + tail_room(size));
    pthread_mutex_unlock(&t->lend_mu);
    return p;
}

/* Makes r the region at *at (NULL: none); the network thread. */
static void lend_set(sl_task_t *t, sl_shm_region_t **at, sl_shm_region_t *r)
{
    if (r)
        sl_shm_region_ref(r);
    pthread_mutex_lock(&t->lend_mu);
    sl_shm_region_t *old = *at;
    *at = r;
    pthread_mutex_unlock(&t->lend_mu);
    sl_shm_region_unref(old);
}

void sl_task_lend_region(sl_task_t *t, sl_shm_region_t *r, uint64_t client_id, int64_t consumer)
{
    if (t->lend_off) /* only this thread writes these */
        return;
    if (t->lend_n) {
        if (consumer < 0 || consumer >= t->lend_n || client_id == 0)
            return;
        struct lend_slot *slot = &t->lend_by[consumer];
        if (slot->client && slot->client != client_id) {
            /* A second client for one consumer index (a trainer started
             * again, or one that says another's index): as for a second
             * client below, no block is made in any region again. */
            t->lend_off = true;
            for (uint32_t i = 0; i < t->lend_n; i++)
                lend_set(t, &t->lend_by[i].region, NULL);
            return;
        }
        slot->client = client_id;
        if (slot->region != r)
            lend_set(t, &slot->region, r);
        return;
    }
    if (t->lend_client_set && t->lend_client != client_id) {
        t->lend_off = true;
        lend_set(t, &t->lend, NULL);
        return;
    }
    if (t->lend == r)
        return;
    t->lend_client = client_id;
    t->lend_client_set = true;
    lend_set(t, &t->lend, r);
}

int64_t sl_task_lent_to(sl_task_t *t, const sl_wire_batch_t *b, uint32_t guess)
{
    int64_t owner = -1;
    if (!t->lend_n || !b->data || b->size == 0)
        return -1;
    pthread_mutex_lock(&t->lend_mu);
    for (uint32_t i = 0; i < t->lend_n && owner < 0; i++) {
        uint32_t k = (guess + i) % t->lend_n;
        if (t->lend_by[k].region && sl_shm_region_holds(t->lend_by[k].region, b->data))
            owner = k;
    }
    pthread_mutex_unlock(&t->lend_mu);
    return owner;
}

void sl_task_unlend_region(sl_task_t *t, sl_shm_region_t *r)
{
    if (!r)
        return;
    if (t->lend == r)
        lend_set(t, &t->lend, NULL);
    for (uint32_t i = 0; i < t->lend_n; i++)
        if (t->lend_by[i].region == r)
            lend_set(t, &t->lend_by[i].region, NULL);
}

int sl_task_new(struct event_base *base, const sluice_TaskDef *def, const char *spec_json, size_t len,
                const uint8_t *exclude, size_t exclude_len, const sl_task_config_t *cfg, sl_task_notify_fn notify,
                void *arg, sl_task_t **out, char *err, size_t errlen)
{
    *out = NULL;
    pthread_once(&metrics_once, metrics_init);
    sl_task_t *t = calloc(1, sizeof *t);
    if (!t)
        return -ENOMEM;
    t->def = *def;
    t->cfg = *cfg;
    if (cfg->mem) {
        char label[48];
        snprintf(label, sizeof label, "task %" PRIu64 " of job %" PRIu64, def->task_id, def->job_id);
        sl_membudget_init_share(&t->share, cfg->mem, label);
        t->mem = &t->share;
    }
    t->notify = notify;
    t->notify_arg = arg;
    if (t->cfg.split_prefetch > MAX_SPLITS)
        t->cfg.split_prefetch = MAX_SPLITS;
    if (t->cfg.split_prefetch == 0)
        t->cfg.split_prefetch = 1;
    t->prefetch_now = t->cfg.split_prefetch;
    if (t->cfg.buffer_batches == 0)
        t->cfg.buffer_batches = 1;
    /* A DYNAMIC consumer asks for provenance, in the dense form where it
     * applies, unless told otherwise: its first batches, made before it
     * asks, are encoded so and keep no runs (producer_main()); a consumer
     * that reads another form has them encoded again at the send. */
    atomic_init(&t->prov_form, def->sharding == SL_SHARDING_DYNAMIC ? PROV_DENSE : PROV_NONE);
    pthread_mutex_init(&t->mu, NULL);
    pthread_mutex_init(&t->track_mu, NULL);
    pthread_mutex_init(&t->lend_mu, NULL);
    pthread_cond_init(&t->wake, NULL);
    int rc = -ENOMEM;
    t->ring = calloc(cfg->buffer_batches, sizeof *t->ring);
    t->notify_ev = event_new(base, -1, 0, on_notify, t);
    t->retry_ev = evtimer_new(base, on_retry, t);
    if (!t->ring || !t->notify_ev || !t->retry_ev)
        goto fail;
    /* Coordinated reads: a region per consumer to make blocks in. */
    if (def->num_consumers > 0 && def->num_consumers <= SL_TASK_MAX_CONSUMERS) {
        if (!(t->lend_by = calloc(def->num_consumers, sizeof *t->lend_by)))
            goto fail;
        t->lend_n = def->num_consumers;
    }
    rc = sl_spec_parse(spec_json, len, &t->spec, err, errlen);
    if (rc == -ENOMEM)
        goto fail;
    if (rc < 0) {
        /* The dispatcher parsed it: this worker's parser is another's, most
         * likely older (an op it does not know, during a rolling upgrade). */
        char why[sizeof t->error];
        snprintf(why, sizeof why, "this worker cannot read the job's dataset spec, which the dispatcher accepted "
                                  "(is the worker older than the dispatcher?): %s", err);
        return task_failed(t, def, rc, why, out);
    }
    sl_posbits_init(&t->exclude, SL_TASK_MAX_EXCLUDE_RUNS);
    if (exclude && exclude_len > 0) {
        char why[256];
        rc = sl_posbits_decode(&t->exclude, exclude, exclude_len, why, sizeof why);
        if (rc < 0) {
            snprintf(err, errlen, "the job's excluded positions: %s", rc == -ENOSPC ? "too many runs and bitmaps" : why);
            rc = rc == -ENOMEM ? rc : SL_EDATA;
            goto fail;
        }
    }
    if (def->sharding == SL_SHARDING_DYNAMIC && !(t->track = sl_split_track_new())) {
        rc = -ENOMEM;
        goto fail;
    }
    sl_pipeline_opts_t po = {
        .sharding = (sl_sharding_t)def->sharding,
        .splits = {.next_split = next_split,
                   .arg = t,
                   .split_read = t->track ? on_split_read : NULL,
                   .dropped = t->track ? on_dropped : NULL,
                   .finished = splits_finished},
        .worker_index = def->worker_index,
        .num_workers = def->num_workers,
        .max_batch_bytes = cfg->max_batch_bytes,
        .roots = cfg->roots,
        .io_engine = cfg->io_engine,
        .plugins = cfg->plugins,
        .threads = cfg->threads,
        .cache = cfg->cache,
        .exclude = sl_posbits_units(&t->exclude) > 0 ? &t->exclude : NULL,
        .mem = t->mem,
        /* A charge waits on while the task holds batches of its own:
         * they come back as its clients read them. */
        .mem_wait = {.cancel = &t->stop, .own = &t->own_bytes, .overdraw = &t->extra_wanted},
        .block_alloc = lend_alloc,
        .block_arg = t,
    };
    rc = sl_pipeline_create(t->spec, &po, &t->pipeline, err, errlen);
    if (rc == -ENOMEM)
        goto fail;
    if (rc < 0) {
        /* The dispatcher accepted the spec, but this worker cannot run it
         * (its files differ, a component is missing). */
        return task_failed(t, def, rc, err, out);
    }
    rc = -pthread_create(&t->thread, NULL, producer_main, t);
    if (rc < 0) {
        snprintf(err, errlen, "cannot start the pipeline thread: %s", strerror(-rc));
        goto fail;
    }
    pthread_setname_np(t->thread, "sl-task"); /* top -H, perf, gdb (docs/operations.md) */
    t->thread_started = true;
    *out = t;
    return 0;
fail:
    sl_task_free(t);
    return rc;
}

void sl_task_free(sl_task_t *t)
{
    if (!t)
        return;
    if (t->thread_started) {
        pthread_mutex_lock(&t->mu);
        __atomic_store_n(&t->stop, true, __ATOMIC_RELEASE); /* also read by a wait for the budget */
        pthread_cond_broadcast(&t->wake);
        pthread_mutex_unlock(&t->mu);
        sl_membudget_wake(t->mem);
        pthread_join(t->thread, NULL);
    }
    for (unsigned i = 0; i < t->count; i++)
        sl_wire_batch_free(t->ring[(t->head + i) % t->cfg.buffer_batches]);
    free(t->ring);
    /* The buffered batches, and those taken and not released, but for
     * the charges their holders took over. */
    sl_membudget_release(t->mem, t->held_bytes - t->handed_bytes);
    /* The pipeline may tell the tracker of drops while it is destroyed. */
    sl_pipeline_destroy(t->pipeline);
    splits_clear(t);
    sl_split_track_free(t->track);
    free(t->tally_scratch);
    sl_posbits_clear(&t->exclude);
    sl_spec_free(t->spec);
    if (t->notify_ev)
        event_free(t->notify_ev);
    if (t->retry_ev)
        event_free(t->retry_ev);
    sl_shm_region_unref(t->lend); /* after the pipeline: its blocks hold their own */
    for (uint32_t i = 0; i < t->lend_n; i++)
        sl_shm_region_unref(t->lend_by[i].region);
    free(t->lend_by);
    if (t->mem)
        sl_membudget_share_done(t->mem); /* after the pipeline, which charged it */
    pthread_cond_destroy(&t->wake);
    pthread_mutex_destroy(&t->lend_mu);
    pthread_mutex_destroy(&t->track_mu);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

uint64_t sl_task_id(const sl_task_t *t)
{
    return t->def.task_id;
}

size_t *sl_task_own_bytes(sl_task_t *t)
{
    return &t->own_bytes;
}

uint64_t sl_task_job_id(const sl_task_t *t)
{
    return t->def.job_id;
}

uint64_t sl_task_dataset_id(const sl_task_t *t)
{
    return t->def.dataset_id;
}

double sl_task_split_rate(sl_task_t *t)
{
    pthread_mutex_lock(&t->mu);
    double r = t->split_rate;
    pthread_mutex_unlock(&t->mu);
    return r;
}

void sl_task_seed_split_rate(sl_task_t *t, double records_per_s)
{
    pthread_mutex_lock(&t->mu);
    if (t->split_rate == 0 && records_per_s > 0) {
        t->split_rate = records_per_s;
        t->rate_windows = RATE_SAID_WINDOWS;
    }
    pthread_mutex_unlock(&t->mu);
}

int sl_task_take(sl_task_t *t, sl_wire_batch_t **out)
{
    int rc;
    pthread_mutex_lock(&t->mu);
    if (t->count > 0) {
        sl_wire_batch_t *b = t->ring[t->head];
        t->head = (t->head + 1) % t->cfg.buffer_batches;
        t->count--;
        t->taken++;
        t->batches++;
        t->elements += b->num_elements;
        t->bytes += b->size;
        *out = b;
        if (room_to_wake(t))
            pthread_cond_broadcast(&t->wake);
        rc = SL_TASK_BATCH;
    } else if (t->producer == PRODUCER_ENDED && !t->split_request_out) {
        rc = SL_TASK_END;
    } else if (t->producer == PRODUCER_FAILED) {
        rc = t->error_code;
    } else {
        t->taker_waiting = true;
        rc = SL_TASK_PENDING;
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

bool sl_task_extra_wanted(sl_task_t *t)
{
    return __atomic_load_n(&t->extra_wanted, __ATOMIC_ACQUIRE);
}

int sl_task_take_extra(sl_task_t *t, sl_wire_batch_t **out)
{
    int rc = sl_task_take(t, out);
    if (rc == SL_TASK_PENDING) {
        pthread_mutex_lock(&t->mu);
        __atomic_store_n(&t->extra_wanted, true, __ATOMIC_RELEASE); /* read by the pipeline's charges */
        if (t->room_wait || t->budget_wait)
            pthread_cond_broadcast(&t->wake);
        pthread_mutex_unlock(&t->mu);
        sl_membudget_wake(t->mem); /* a charge of the pipeline waiting for room may overdraw */
    }
    return rc;
}

void sl_task_hand_over(sl_task_t *t, sl_wire_batch_t *b, size_t bytes)
{
    pthread_mutex_lock(&t->mu);
    b->handed = bytes;
    t->handed_bytes += bytes;
    sl_membudget_hand_over(t->mem, bytes); /* its holder gives them back to the worker's budget */
    pthread_mutex_unlock(&t->mu);
}

void sl_task_release(sl_task_t *t, const sl_wire_batch_t *b)
{
    pthread_mutex_lock(&t->mu);
    t->held_bytes -= b->charged;
    t->handed_bytes -= b->handed;
    __atomic_sub_fetch(&t->own_bytes, b->charged, __ATOMIC_RELEASE);
    sl_membudget_release(t->mem, b->charged - b->handed);
    t->taken--;
    if (t->budget_wait || room_to_wake(t))
        pthread_cond_broadcast(&t->wake);
    pthread_mutex_unlock(&t->mu);
    notify_loop(t);
}

const char *sl_task_errmsg(sl_task_t *t)
{
    /* Written once by the producer before it reports FAILED, so reading it
     * after seeing FAILED under the mutex is safe. */
    return t->error;
}

/* done_below_of() with the tracker's smallest id (under t->mu). */
static uint64_t done_below(sl_task_t *t)
{
    pthread_mutex_lock(&t->track_mu);
    uint64_t tracked = sl_split_track_min_id(t->track);
    pthread_mutex_unlock(&t->track_mu);
    return done_below_of(t, tracked);
}

uint64_t sl_task_done_below(sl_task_t *t)
{
    if (!t->track)
        return 0;
    pthread_mutex_lock(&t->mu);
    uint64_t below = done_below(t);
    pthread_mutex_unlock(&t->mu);
    return below;
}

/* Whether the split table is empty (under t->mu). */
static bool track_empty(sl_task_t *t)
{
    pthread_mutex_lock(&t->track_mu);
    bool empty = sl_split_track_size(t->track) == 0;
    pthread_mutex_unlock(&t->track_mu);
    return empty;
}

/* The task's state; the caller holds t->mu. */
static sl_task_state_t state_locked(sl_task_t *t)
{
    if (t->producer == PRODUCER_FAILED)
        return SL_TASK_FAILED;
    if (t->producer == PRODUCER_ENDED && t->count == 0 && t->taken == 0 && !t->split_request_out &&
        (!t->track || t->end_sent || track_empty(t)))
        return SL_TASK_DONE; /* DYNAMIC: done once every split's notice went out too, or an
                              * end-of-sequence answer did (which carries what is left): a
                              * client asks until it gets one, and no longer. */
    return SL_TASK_RUNNING;
}

int sl_task_state(sl_task_t *t)
{
    pthread_mutex_lock(&t->mu);
    sl_task_state_t state = state_locked(t);
    pthread_mutex_unlock(&t->mu);
    return (int)state;
}

void sl_task_set_unfilled(sl_task_t *t, unsigned n)
{
    pthread_mutex_lock(&t->mu);
    t->unfilled = n;
    pthread_mutex_unlock(&t->mu);
}

void sl_task_status(sl_task_t *t, sluice_TaskStatus *out)
{
    pthread_mutex_lock(&t->mu);
    out->task_id = t->def.task_id;
    out->job_nonce = t->def.job_nonce;
    out->batches = t->batches;
    out->elements = t->elements;
    out->bytes = t->bytes;
    out->state = state_locked(t);
    if (out->state == SL_TASK_FAILED)
        snprintf(out->error, sizeof out->error, "%s", t->error);
    if (t->working)
        out->stalled_ms = (uint64_t)((seconds_now() - t->working_since) * 1000);
    if (t->track) {
        out->done_below = done_below(t);
        /* Nothing waits for a client: the pipeline alone holds its splits
         * (and the rounds that wait for its next batches). */
        out->starved = t->split_wait && t->count == 0 && t->taken <= t->unfilled;
    }
    pthread_mutex_unlock(&t->mu);
}

void sl_task_info(sl_task_t *t, sl_task_info_t *out)
{
    sluice_TaskStatus ts = sluice_TaskStatus_init_zero;
    sl_task_status(t, &ts);
    pthread_mutex_lock(&t->mu);
    *out = (sl_task_info_t){
        .task_id = t->def.task_id,
        .job_id = t->def.job_id,
        .sharding = (sl_sharding_t)t->def.sharding,
        .state = (int)ts.state,
        .batches_produced = t->produced,
        .batches_served = t->batches,
        .elements_served = t->elements,
        .bytes_served = t->bytes,
        .buffered_batches = t->count,
        .buffered_bytes = t->held_bytes,
        .memory_bytes = sl_membudget_used(t->mem),
        .buffer_full = t->room_wait,
        .budget_wait = t->budget_wait,
        .buffer_capacity_batches = t->cfg.buffer_batches,
        .buffer_capacity_bytes = t->cfg.buffer_bytes,
        .pipeline_seconds = t->pipeline_seconds,
        .split_wait_seconds = t->split_wait_total + (t->split_wait ? seconds_now() - t->split_wait_since : 0),
        .split_rate = t->split_rate,
        .records_skipped = t->records_skipped,
    };
    pthread_mutex_unlock(&t->mu);
    /* The pipeline lives as long as the task; its counters are atomics. */
    if (t->pipeline)
        out->num_stages = sl_pipeline_op_stats(t->pipeline, out->stages, SL_TASK_MAX_STAGES);
}

/* No split request now, whatever the queue (network thread): not DYNAMIC,
 * one is out, or the wait the dispatcher asked for runs. */
static bool split_ask_held(sl_task_t *t)
{
    return t->def.sharding != SL_SHARDING_DYNAMIC || t->split_request_out || evtimer_pending(t->retry_ev, NULL);
}

bool sl_task_want_splits(sl_task_t *t, uint64_t *epoch, uint32_t *max, uint64_t *seq, uint64_t *records)
{
    *seq = t->split_seq + 1;
    *records = 0;
    /* Most batches find the queue more than half full: no need for mu, nor
     * for the timer's lock in split_ask_held(), to say no. The count falls
     * only as the pipeline takes a split, and it tells the loop after each
     * (next_split()), which asks again. */
    if (__atomic_load_n(&t->split_count, __ATOMIC_RELAXED) > __atomic_load_n(&t->prefetch_now, __ATOMIC_RELAXED) / 2)
        return false;
    /* Nor once the epoch has no split left, the batches of a job's end: a
     * new epoch clears it and its first split tells the loop. */
    if (__atomic_load_n(&t->epoch_exhausted, __ATOMIC_RELAXED))
        return false;
    if (split_ask_held(t))
        return false;
    bool want = false;
    pthread_mutex_lock(&t->mu);
    /* At half the queue; after an answer cut short, at half (rounded up)
     * of what it left, but never later than at half of split_prefetch. */
    unsigned at = t->prefetch_now / 2;
    if (t->answer_cap && (t->answer_cap + 1) / 2 < at) {
        unsigned base = t->cfg.split_prefetch / 2;
        at = (t->answer_cap + 1) / 2 > base ? (t->answer_cap + 1) / 2 : base;
    }
    if (!t->stop && !t->epoch_exhausted && t->producer == PRODUCER_RUNNING && t->split_count <= at) {
        /* Asked for only once half the queue is used, so that each request
         * (and the dispatcher's commit behind it) carries several splits. */
        *epoch = t->want_epoch;
        *max = t->prefetch_now - t->split_count;
        /* Splits long enough that each takes the pipeline split_target_ms:
         * fewer hand-outs (each a commit in the dispatcher's store), and a
         * queue that covers an answer's round trip however fast it runs. */
        double r = target_records(t);
        *records = r >= 1e15 ? (uint64_t)1e15 : (uint64_t)r;
        t->asked_records = *records;
        t->asked_splits = *max;
        want = true;
        t->split_request_out = true;
    }
    pthread_mutex_unlock(&t->mu);
    return want;
}

bool sl_task_split_waits(sl_task_t *t)
{
    return t->retry_armed;
}

uint64_t sl_task_split_ceiling(sl_task_t *t)
{
    /* Written on this thread alone (sl_task_splits_arrived_payload()), so
     * read here without mu, which the readers on other threads take. */
    return t->split_next_id;
}

bool sl_task_acks_wanted(sl_task_t *t)
{
    return t->at_bound || t->retry_armed;
}

bool sl_task_retry_now(sl_task_t *t)
{
    if (t->def.sharding != SL_SHARDING_DYNAMIC || !evtimer_pending(t->retry_ev, NULL))
        return false;
    /* Run as the timer would, from the loop: not inside the caller's
     * handling of a request. Still pending until then. */
    evtimer_del(t->retry_ev);
    event_active(t->retry_ev, EV_TIMEOUT, 0);
    return true;
}

double sl_task_split_wait_unasked(sl_task_t *t)
{
    if (split_ask_held(t))
        return 0;
    pthread_mutex_lock(&t->mu);
    double waited = t->split_wait ? seconds_now() - t->split_wait_since : 0;
    pthread_mutex_unlock(&t->mu);
    return waited;
}

void sl_task_split_report(sl_task_t *t, uint32_t *slack_ms, uint64_t *records_per_second)
{
    double now = seconds_now();
    pthread_mutex_lock(&t->mu);
    double records = 0;
    for (unsigned i = 0; i < t->split_count; i++) {
        const struct split *s = &t->splits[(t->split_head + i) % MAX_SPLITS];
        records += (double)(s->end - s->begin);
    }
    double ms = 0;
    if (t->split_rate > 0) {
        ms = records / t->split_rate * 1000.0;
        /* And what is left of the split the pipeline reads, at its rate
         * since it took it (none while it waits for the next). */
        double read_s = now - t->split_taken_at - t->split_waited;
        double left_s = (double)t->split_taken_records / t->split_rate - read_s;
        if (t->split_taken_at > 0 && !t->split_wait && left_s > 0)
            ms += left_s * 1000.0;
    }
    double rate = t->rate_windows >= RATE_SAID_WINDOWS ? t->split_rate : 0;
    pthread_mutex_unlock(&t->mu);
    *slack_ms = ms >= (double)UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
    *records_per_second = rate >= 1e18 ? (uint64_t)1e18 : (uint64_t)rate;
}

void sl_task_splits_arrived(sl_task_t *t, const sluice_GetSplitResponse *resp)
{
    sl_task_splits_arrived_payload(t, resp, NULL, 0);
}

int sl_task_read_skips(const sluice_Split *s, const uint8_t *payload, size_t len, sl_skip_run_t **out, char *err,
                       size_t errlen)
{
    *out = NULL;
    if (s->skip_count == 0)
        return 0;
    if (s->skip_count > len / 16 || s->skip_offset > len || s->skip_count * 16 > len - s->skip_offset) {
        snprintf(err, errlen,
                 "split %" PRIu64 " has %" PRIu64 " skip runs at offset %" PRIu64 ", outside the %zu bytes of payload",
                 s->split_id, s->skip_count, s->skip_offset, len);
        return SL_EPROTO;
    }
    sl_skip_run_t *k = malloc(s->skip_count * sizeof *k);
    if (!k) {
        snprintf(err, errlen, "out of memory for %" PRIu64 " skip runs", s->skip_count);
        return -ENOMEM;
    }
    /* sl_skip_run_t is two u64, the wire's little-endian layout. */
    memcpy(k, payload + s->skip_offset, s->skip_count * 16);
    uint64_t at = s->begin;
    for (uint64_t i = 0; i < s->skip_count; i++) {
        if (k[i].count == 0 || k[i].begin < at || k[i].begin > s->end || k[i].count > s->end - k[i].begin) {
            snprintf(err, errlen,
                     "skip run %" PRIu64 " [%" PRIu64 ", +%" PRIu64 ") of split %" PRIu64 " [%" PRIu64 ", %" PRIu64
                     ") is empty, out of order, overlapping or outside the split",
                     i, k[i].begin, k[i].count, s->split_id, s->begin, s->end);
            free(k);
            return SL_EPROTO;
        }
        at = k[i].begin + k[i].count;
    }
    *out = k;
    return 0;
}

void sl_task_splits_arrived_payload(sl_task_t *t, const sluice_GetSplitResponse *resp, const uint8_t *payload,
                                    size_t len)
{
    t->split_request_out = false;
    t->split_seq++;
    t->at_bound = resp->at_bound;
    /* A pipeline that ended (a take) while this request was out: its end of
     * sequence and its DONE waited for the answer (sl_task_take(),
     * state_locked()), so that the splits in it, never read, get their
     * notices with the end instead of going out again to another task. */
    notify_loop(t);
    if (resp->splits_count == 0 && !resp->end_of_epoch && resp->retry_ms > 0) {
        /* Nothing now, the epoch is not over: ask again after the wait. */
        uint32_t ms = resp->retry_ms > 10000 ? 10000 : resp->retry_ms;
        struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
        t->retry_armed = evtimer_add(t->retry_ev, &tv) == 0;
        if (!t->retry_armed)
            sl_log_error("task %" PRIu64 ": cannot wait %u ms to ask for splits again; asking at the next heartbeat",
                         t->def.task_id, ms);
        return;
    }
    for (pb_size_t i = 0; i < resp->splits_count; i++) {
        const sluice_Split *s = &resp->splits[i];
        if (s->skip_count == 0)
            continue;
        char err[300];
        sl_skip_run_t *k;
        int rc = sl_task_read_skips(s, payload, len, &k, err, sizeof err);
        free(k);
        if (rc < 0) {
            sl_task_splits_failed(t, false, rc, err);
            return;
        }
    }
    pthread_mutex_lock(&t->mu);
    for (pb_size_t i = 0; i < resp->splits_count; i++)
        if (resp->splits[i].epoch > resp->epoch)
            t->crossing = true;
    /* An answer for an epoch the pipeline has left is stale. It holds no
     * split (the dispatcher ends an epoch only when none is left), unless
     * the task is crossing: then the pipeline left it for a later epoch's
     * split while this request was out, and its splits are of that epoch or
     * later ones, or lost workers' (any epoch). They are queued; its end of
     * epoch is of an epoch the pipeline has left. */
    bool current = resp->epoch == t->want_epoch;
    if (current || (t->crossing && resp->epoch < t->want_epoch)) {
        if (resp->splits_count > MAX_SPLITS - t->split_count)
            sl_log_error("task %" PRIu64 ": dispatcher sent %u splits, more than asked for; the rest are lost",
                         t->def.task_id, (unsigned)resp->splits_count);
        for (pb_size_t i = 0; i < resp->splits_count && t->split_count < MAX_SPLITS; i++) {
            struct split *s = &t->splits[(t->split_head + t->split_count) % MAX_SPLITS];
            if (t->split_count > 0 &&
                resp->splits[i].split_id < t->splits[(t->split_head + t->split_count - 1) % MAX_SPLITS].split_id)
                t->queue_unsorted = true;
            s->skips = NULL;
            s->file_index = resp->splits[i].file_index;
            s->begin = resp->splits[i].begin;
            s->end = resp->splits[i].end;
            s->split_id = resp->splits[i].split_id;
            s->num_skips = (uint32_t)resp->splits[i].skip_count;
            s->epoch = resp->splits[i].epoch;
            s->asked = t->asked_records;
            if (s->split_id >= t->split_next_id)
                t->split_next_id = s->split_id + 1;
            char err[300];
            /* Checked above: only memory can fail here. */
            if (sl_task_read_skips(&resp->splits[i], payload, len, &s->skips, err, sizeof err) < 0) {
                if (!t->error_code) {
                    t->error_code = -ENOMEM;
                    snprintf(t->error, sizeof t->error, "getting splits: %s", err);
                }
                break;
            }
            __atomic_store_n(&t->split_count, t->split_count + 1, __ATOMIC_RELAXED);
        }
        /* Splits that came after the pipeline ended are never read. Until
         * queued_below is set again, its old value is below every split
         * just queued: a split request is answered with ids the job's
         * counter gives after every id this task received (one request is
         * out at a time). */
        if (t->producer != PRODUCER_RUNNING)
            splits_clear(t);
        else
            queue_changed(t);
        t->answer_cap = resp->splits_count > 0 && resp->splits_count < t->asked_splits ? t->split_count : 0;
        if (resp->end_of_epoch && current)
            __atomic_store_n(&t->epoch_exhausted, true, __ATOMIC_RELAXED);
        if (resp->finished)
            t->splits_finished = true;
    }
    pthread_cond_broadcast(&t->wake);
    pthread_mutex_unlock(&t->mu);
}

void sl_task_splits_failed(sl_task_t *t, bool retry, int code, const char *msg)
{
    t->split_request_out = false;
    pthread_mutex_lock(&t->mu);
    /* An ended pipeline's end of sequence waited for this request
     * (sl_task_take()): it goes now. Not while the pipeline runs: a retry
     * failing at once (no memory) would wake the loop to ask again. */
    bool ended = t->producer != PRODUCER_RUNNING;
    if (!retry && !t->error_code) {
        t->error_code = code;
        snprintf(t->error, sizeof t->error, "getting splits: %s", msg);
    }
    if (!retry)
        pthread_cond_broadcast(&t->wake);
    pthread_mutex_unlock(&t->mu);
    if (ended)
        notify_loop(t);
}

static int settle_sent(sl_task_t *t, const sl_wire_batch_t *b, bool end, sl_split_done_rec_t **out, unsigned *num,
                       uint64_t *below);

int sl_task_batch_sent(sl_task_t *t, const sl_wire_batch_t *b, sl_split_done_rec_t **out, unsigned *num,
                       uint64_t *below)
{
    return settle_sent(t, b, b == NULL, out, num, below);
}

int sl_task_progress_sent(sl_task_t *t, sl_split_done_rec_t **out, unsigned *num, uint64_t *below)
{
    return settle_sent(t, NULL, false, out, num, below);
}

/* sl_task_batch_sent(), or with neither a batch nor an end (b NULL, end
 * false): a progress answer. */
static int settle_sent(sl_task_t *t, const sl_wire_batch_t *b, bool end, sl_split_done_rec_t **out, unsigned *num,
                       uint64_t *below)
{
    *out = NULL;
    *num = 0;
    *below = 0;
    if (!t->track)
        return 0;
    /* A batch wholly in the split the last one sent under track_mu lay in,
     * without that split's last record, while no done split waits for its
     * notice: counted here alone. A split read in order is then done with
     * the batch that holds its last record, and its notice goes with it. */
    if (b && b->ntally == 1 && t->sent_split_known && same_split(&b->tally[0], &t->sent_split) &&
        b->prov_span_known && b->prov_span.hi < b->tally[0].end - 1 && !sl_split_track_has_done(t->track)) {
        t->sent_split.delivered += b->tally[0].delivered;
        *below = t->sent_below;
        return 0;
    }
    int rc = 0;
    /* Under track_mu alone: what done_below needs of the queue is there
     * too (queued_below), and the producer's thread takes t->mu twice a
     * batch. */
    pthread_mutex_lock(&t->track_mu);
    own_row_flush(t, t->sent_split_known, &t->sent_split, SL_SETTLE_SENT);
    if (b && b->tally)
        sl_split_track_settle_rows(t->track, b->tally, b->ntally, SL_SETTLE_SENT);
    else if (b)
        sl_split_track_settle(t->track, sl_wire_batch_prov(b), b->prov_n, SL_SETTLE_SENT);
    t->sent_split_known = b && b->tally && b->ntally == 1;
    if (t->sent_split_known) {
        t->sent_split = b->tally[0];
        t->sent_split.delivered = 0;
    }
    /* Every notice that is ready goes with this frame: the table bounds
     * how many there can be. */
    unsigned room = sl_split_track_has_done(t->track) ? sl_split_track_size(t->track) : 0;
    if (room > 0 && !(*out = malloc(room * sizeof **out)))
        rc = -ENOMEM; /* they wait in the table for a later frame */
    else if (room > 0)
        *num = sl_split_track_collect(t->track, *out, room);
    uint64_t tracked = sl_split_track_min_id(t->track), queued = t->queued_below;
    pthread_mutex_unlock(&t->track_mu);
    /* An end-of-sequence answer makes the task DONE only once it carried
     * every notice: then none is left in the table. */
    if (end && rc == 0) {
        pthread_mutex_lock(&t->mu);
        t->end_sent = true;
        pthread_mutex_unlock(&t->mu);
    }
    *below = tracked < queued ? tracked : queued;
    t->sent_below = *below;
    if (*num == 0) {
        free(*out);
        *out = NULL;
    }
    return rc;
}
