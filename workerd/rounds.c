/* rounds.c: see rounds.h. */
#include "rounds.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

struct round {
    bool open;
    bool ended;       /* the pipeline ended before the round was full */
    uint64_t round;
    uint32_t filled;  /* batches taken from the task so far */
    uint32_t served;  /* consumers that took theirs */
    sl_wire_batch_t **batches; /* num_consumers; NULL once served */
    uint8_t *taken;            /* num_consumers flags */
};

struct sl_rounds {
    uint32_t num_consumers;
    struct round open[SL_ROUNDS_OPEN];
    /* The last rounds completed, so that a late duplicate request is
     * refused instead of opening the round again. */
    uint64_t completed[SL_ROUNDS_OPEN * 4];
    unsigned completed_next;
    /* Rounds asked for while SL_ROUNDS_OPEN were open, opened lowest first
     * as places free (open_waiting()), so that a round asked for later
     * does not take a place, and its batches, before them. */
    uint64_t waiting[SL_ROUNDS_WAITING];
    unsigned num_waiting;
};

sl_rounds_t *sl_rounds_new(uint32_t num_consumers)
{
    if (num_consumers < 1 || num_consumers > SL_ROUNDS_MAX_CONSUMERS)
        return NULL;
    sl_rounds_t *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->num_consumers = num_consumers;
    for (unsigned i = 0; i < SL_ROUNDS_OPEN; i++) {
        r->open[i].batches = calloc(num_consumers, sizeof *r->open[i].batches);
        r->open[i].taken = calloc(num_consumers, 1);
        if (!r->open[i].batches || !r->open[i].taken) {
            sl_rounds_free(r);
            return NULL;
        }
    }
    for (unsigned i = 0; i < sizeof r->completed / sizeof r->completed[0]; i++)
        r->completed[i] = UINT64_MAX;
    return r;
}

void sl_rounds_free(sl_rounds_t *r)
{
    if (!r)
        return;
    for (unsigned i = 0; i < SL_ROUNDS_OPEN; i++) {
        if (r->open[i].batches)
            for (uint32_t c = 0; c < r->num_consumers; c++)
                sl_wire_batch_free(r->open[i].batches[c]);
        free(r->open[i].batches);
        free(r->open[i].taken);
    }
    free(r);
}

static bool was_completed(const sl_rounds_t *r, uint64_t round)
{
    for (unsigned i = 0; i < sizeof r->completed / sizeof r->completed[0]; i++)
        if (r->completed[i] == round)
            return true;
    return false;
}

static struct round *find_open(sl_rounds_t *r, uint64_t round)
{
    for (unsigned i = 0; i < SL_ROUNDS_OPEN; i++)
        if (r->open[i].open && r->open[i].round == round)
            return &r->open[i];
    return NULL;
}

/* Opens round in a free place. @return the round, or NULL: none is free */
static struct round *open_round(sl_rounds_t *r, uint64_t round)
{
    for (unsigned i = 0; i < SL_ROUNDS_OPEN; i++) {
        struct round *o = &r->open[i];
        if (o->open)
            continue;
        o->open = true;
        o->ended = false;
        o->round = round;
        o->filled = 0;
        o->served = 0;
        for (uint32_t c = 0; c < r->num_consumers; c++)
            o->taken[c] = 0;
        return o;
    }
    return NULL;
}

/* Opens the rounds waiting for a place, lowest first, while places are free. */
static void open_waiting(sl_rounds_t *r)
{
    while (r->num_waiting > 0) {
        unsigned low = 0;
        for (unsigned i = 1; i < r->num_waiting; i++)
            if (r->waiting[i] < r->waiting[low])
                low = i;
        if (!open_round(r, r->waiting[low]))
            return;
        r->waiting[low] = r->waiting[--r->num_waiting];
    }
}

/* Round round, open, or NULL: every place is taken (then it waits for one).
 * A place frees only when a round completes, and open_waiting() then gives
 * it to a waiting round: while any waits, no place is free. */
static struct round *find_or_open(sl_rounds_t *r, uint64_t round)
{
    struct round *o = find_open(r, round);
    if (o || (r->num_waiting == 0 && (o = open_round(r, round))))
        return o;
    bool listed = false;
    for (unsigned i = 0; i < r->num_waiting; i++)
        listed |= r->waiting[i] == round;
    if (!listed && r->num_waiting < SL_ROUNDS_WAITING)
        r->waiting[r->num_waiting++] = round;
    return NULL;
}

/* The round to fill before round o takes any batch, or NULL: the one
 * partly filled (at most one is), else the lowest open round before o that
 * is not full. Rounds are filled one at a time and in round order, so that
 * each holds C consecutive batches of the task, after those of the rounds
 * before it, whichever request finds batches ready first: a round asked
 * for while the pipeline had none ready stays empty until then, and a
 * later round must not take its batches meanwhile. */
static struct round *fill_first(sl_rounds_t *r, const struct round *o)
{
    if (o->filled > 0)
        return NULL;
    struct round *lowest = NULL;
    for (unsigned i = 0; i < SL_ROUNDS_OPEN; i++) {
        struct round *p = &r->open[i];
        if (p == o || !p->open || p->ended || p->filled == r->num_consumers)
            continue;
        if (p->filled > 0)
            return p;
        if (p->round < o->round && (!lowest || p->round < lowest->round))
            lowest = p;
    }
    return lowest;
}

/* Puts b, the task's next batch, in round o: in the place of the consumer
 * in whose region of shared memory it was made (sl_task_lent_to()), if that
 * place is free, else in the first free one. The task makes its k-th batch
 * in consumer k mod C's region, and the rounds' places line up with that
 * from the start; a batch taken outside the rounds (a stand-in's,
 * worker.c) shifts them, and without this every later batch would go to
 * the next consumer, copied out of its neighbour's region. */
static void place(sl_rounds_t *r, sl_task_t *task, struct round *o, sl_wire_batch_t *b)
{
    int64_t owner = sl_task_lent_to(task, b, o->filled);
    uint32_t at = owner >= 0 && (uint32_t)owner < r->num_consumers && !o->batches[owner] ? (uint32_t)owner : 0;
    while (o->batches[at])
        at++;
    o->batches[at] = b;
    o->filled++;
}

/* Takes batches from the task until round o holds one per consumer.
 * @return 0 (full, or ended), or what sl_task_take() said otherwise */
static int fill(sl_rounds_t *r, sl_task_t *task, struct round *o)
{
    while (!o->ended && o->filled < r->num_consumers) {
        sl_wire_batch_t *b = NULL;
        int rc = sl_task_take(task, &b);
        if (rc == SL_TASK_BATCH) {
            place(r, task, o, b);
            continue;
        }
        if (rc == SL_TASK_END) {
            o->ended = true;
            break;
        }
        return rc; /* pending, or the task's failure */
    }
    return 0;
}

int sl_rounds_take(sl_rounds_t *r, sl_task_t *task, uint64_t round, uint32_t consumer, sl_wire_batch_t **out,
                   char *err, size_t errlen)
{
    *out = NULL;
    if (consumer >= r->num_consumers) {
        snprintf(err, errlen, "consumer_index %" PRIu32 " is out of range: the job has %" PRIu32 " consumers",
                 consumer, r->num_consumers);
        return SL_EINVAL;
    }
    if (was_completed(r, round)) {
        snprintf(err, errlen, "round %" PRIu64 " was already served to every consumer", round);
        return SL_ROUNDS_TAKEN;
    }
    struct round *o = find_or_open(r, round);
    if (!o)
        return SL_TASK_PENDING;
    if (o->taken[consumer]) {
        snprintf(err, errlen, "consumer %" PRIu32 " already took its batch of round %" PRIu64, consumer, round);
        return SL_ROUNDS_TAKEN;
    }
    for (struct round *f; (f = fill_first(r, o));) {
        int rc = fill(r, task, f);
        if (rc != 0)
            return rc;
    }
    int rc = fill(r, task, o);
    if (rc != 0)
        return rc;
    if (o->ended)
        return SL_TASK_END;
    *out = o->batches[consumer];
    o->batches[consumer] = NULL;
    o->taken[consumer] = 1;
    if (++o->served == r->num_consumers) {
        o->open = false;
        r->completed[r->completed_next++ % (sizeof r->completed / sizeof r->completed[0])] = round;
        open_waiting(r);
    }
    return SL_TASK_BATCH;
}

unsigned sl_rounds_unfilled(const sl_rounds_t *r)
{
    unsigned n = 0;
    for (unsigned i = 0; i < SL_ROUNDS_OPEN; i++) {
        const struct round *o = &r->open[i];
        if (o->open && !o->ended && o->filled < r->num_consumers)
            n += o->filled;
    }
    return n;
}

void sl_rounds_info(const sl_rounds_t *r, sl_rounds_info_t *out)
{
    *out = (sl_rounds_info_t){.consumers = r->num_consumers, .waiting = r->num_waiting};
    const struct round *low = NULL;
    for (unsigned i = 0; i < SL_ROUNDS_OPEN; i++) {
        const struct round *o = &r->open[i];
        if (!o->open)
            continue;
        out->open++;
        if (!low || o->round < low->round)
            low = o;
    }
    if (!low)
        return;
    out->any_open = true;
    out->lowest = low->round;
    out->lowest_made = low->filled;
    for (uint32_t c = 0; c < r->num_consumers; c++) {
        if (low->taken[c])
            continue;
        if (out->num_missing < SL_ROUNDS_INFO_MISSING)
            out->missing[out->num_missing] = c;
        out->num_missing++;
    }
}
