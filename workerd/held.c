/* held.c: see held.h. */
#include "held.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "log.h"
#include "recycle.h"
#include "sluice.h"
#include "zero.h"

/* An answer is made for every batch sent and is 6 KiB or more (its
 * components): from a stock of those given back (recycle.h). */
SL_RECYCLER_DEFINE(served_stock, sizeof(sl_served_t))

sl_served_t *sl_served_new(uint64_t task_id, sl_wire_batch_t *batch)
{
    /* Zeroed but for the answer's component slots, which the sender
     * writes up to components_count, and the encoder reads no further. */
    sl_served_t *s = sl_recycle_alloc(&served_stock);
    if (s) {
        sl_zero_except(s, sizeof *s, offsetof(sl_served_t, resp.components), sizeof s->resp.components);
        s->task_id = task_id;
        s->batch = batch;
        s->ceil = UINT64_MAX;
        s->refs = 1;
    }
    return s;
}

/* What a served batch holds: its tensors with its provenance, and the
 * notices its answer carries. */
static size_t served_bytes(const sl_served_t *s)
{
    return sl_wire_batch_held_bytes(s->batch) + s->notices_len;
}

void sl_served_unref(sl_served_t *s)
{
    if (!s || --s->refs > 0)
        return;
    sl_wire_batch_free(s->batch);
    if (s->notices != s->notices_one)
        free(s->notices);
    sl_recycle_free(&served_stock, s);
}

/* What one client of the task holds: its seqs below next_seq were served
 * (in order; coordinated reads serve rounds in any order and leave it
 * aside); held[0..n) are those not acknowledged yet that could be kept,
 * sorted by seq. */
struct holder {
    uint64_t client_id;
    uint64_t next_seq;
    int64_t last_ms;
    sl_served_t *held[SL_HELD_ROUNDS];
    unsigned n;
    bool warned; /* the budget refused to keep one of its batches (logged once) */
    bool left;   /* it acknowledged everything as its iterator closed: it will not ask again */
};

struct sl_holders {
    sl_membudget_t *budget;
    size_t *own; /* sl_holders_count_own() */
    struct holder *v;
    unsigned n, cap;
    /* The batches that went out unheld, or were let go of unacknowledged,
     * hold records of splits in [lost_floor, lost_ceil) alone
     * (sl_holders_received_below()); lost_ceil 0: none. */
    uint64_t lost_floor, lost_ceil;
};

sl_holders_t *sl_holders_new(sl_membudget_t *budget)
{
    sl_holders_t *h = calloc(1, sizeof *h);
    if (h)
        h->budget = budget;
    return h;
}

void sl_holders_count_own(sl_holders_t *h, size_t *own)
{
    h->own = own;
}

static void drop(sl_holders_t *h, sl_served_t *s)
{
    if (h->budget && s->charged)
        sl_membudget_release(h->budget, s->charged);
    if (h->own && s->charged)
        __atomic_sub_fetch(h->own, s->charged, __ATOMIC_RELEASE);
    s->charged = 0;
    sl_served_unref(s);
}

/* s may not have reached its client: the splits it holds records of are
 * its clients' word from now on (sl_holders_received_below()). */
static void lose(sl_holders_t *h, const sl_served_t *s)
{
    if (s->ceil <= s->floor)
        return; /* of no split */
    if (h->lost_ceil == 0 || s->floor < h->lost_floor)
        h->lost_floor = s->floor;
    if (s->ceil > h->lost_ceil)
        h->lost_ceil = s->ceil;
}

/* Every batch c holds may not have reached it. */
static void lose_held(sl_holders_t *h, const struct holder *c)
{
    for (unsigned k = 0; k < c->n; k++)
        lose(h, c->held[k]);
}

/* Drops what holder c holds below seq `below`. */
static void ack(sl_holders_t *h, struct holder *c, uint64_t below)
{
    unsigned k = 0;
    while (k < c->n && c->held[k]->seq < below)
        drop(h, c->held[k++]);
    memmove(c->held, c->held + k, (c->n - k) * sizeof *c->held);
    c->n -= k;
}

static void holder_remove(sl_holders_t *h, unsigned i)
{
    ack(h, &h->v[i], UINT64_MAX);
    h->v[i] = h->v[--h->n];
}

void sl_holders_free(sl_holders_t *h)
{
    if (!h)
        return;
    while (h->n > 0)
        holder_remove(h, h->n - 1);
    free(h->v);
    free(h);
}

static struct holder *find(sl_holders_t *h, uint64_t client_id)
{
    for (unsigned i = 0; i < h->n; i++)
        if (h->v[i].client_id == client_id)
            return &h->v[i];
    return NULL;
}

/* The holder of client_id, made if it has none. @return it, or NULL at
 * SL_HOLDERS_MAX or out of memory */
static struct holder *get(sl_holders_t *h, uint64_t client_id)
{
    struct holder *c = find(h, client_id);
    if (c || h->n >= SL_HOLDERS_MAX)
        return c;
    if (h->n == h->cap) {
        unsigned cap = h->cap ? 2 * h->cap : 4;
        struct holder *v = realloc(h->v, cap * sizeof *v);
        if (!v)
            return NULL;
        h->v = v;
        h->cap = cap;
    }
    c = &h->v[h->n++];
    *c = (struct holder){.client_id = client_id, .next_seq = 1};
    return c;
}

static sl_served_t *held_at(const struct holder *c, uint64_t seq)
{
    for (unsigned k = 0; k < c->n; k++)
        if (c->held[k]->seq == seq)
            return c->held[k];
    return NULL;
}

/* SL_ELIMIT when seq is max or more ahead of acked_below, else
 * SL_HELD_NEW; the message counts from base (rounds: seq 1 is round 0). */
static int ahead(uint64_t seq, uint64_t acked_below, unsigned max, uint64_t base, const char *what, char *err,
                 size_t errlen)
{
    if (seq - (acked_below < seq ? acked_below : seq) < max)
        return SL_HELD_NEW;
    return sl_errf(err, errlen, SL_ELIMIT,
                   "%s %" PRIu64 " while %" PRIu64 " and later are not acknowledged: at most %u %ss of one task may "
                   "be in flight", what, seq - base, acked_below > base ? acked_below - base : 0, max, what);
}

/* SL_ECLOSED: request seq was served and its batch is no longer held. */
static int lost(uint64_t seq, char *err, size_t errlen)
{
    return sl_errf(err, errlen, SL_ECLOSED,
                   "the batch answered to request %" PRIu64 " was sent on a connection that closed and is no "
                   "longer held (acknowledged, or dropped after its client was silent past the hold timeout, "
                   "or no memory to hold it): its elements are lost to this client",
                   seq);
}

/* sl_holders_ask() and, with rounds, sl_holders_ask_round(). */
static int ask(sl_holders_t *h, uint64_t client_id, uint64_t seq, uint64_t acked_below, int64_t now_ms, bool rounds,
               sl_served_t **again, char *err, size_t errlen)
{
    *again = NULL;
    struct holder *c = get(h, client_id);
    if (!c)
        return h->n >= SL_HOLDERS_MAX
                   ? sl_errf(err, errlen, SL_ELIMIT,
                             "more than %d clients of the task hold batches not yet acknowledged", SL_HOLDERS_MAX)
                   : sl_errf(err, errlen, -ENOMEM, "out of memory");
    c->last_ms = now_ms;
    ack(h, c, acked_below);
    if (!rounds && seq >= c->next_seq)
        return ahead(seq, acked_below, SL_HELD_MAX, 0, "request", err, errlen);
    if ((*again = held_at(c, seq)))
        return SL_HELD_AGAIN;
    if (rounds)
        return ahead(seq, acked_below, SL_HELD_ROUNDS, 1, "round", err, errlen);
    return lost(seq, err, errlen);
}

int sl_holders_ask(sl_holders_t *h, uint64_t client_id, uint64_t seq, uint64_t acked_below, int64_t now_ms,
                   sl_served_t **again, char *err, size_t errlen)
{
    return ask(h, client_id, seq, acked_below, now_ms, false, again, err, errlen);
}

int sl_holders_ask_round(sl_holders_t *h, uint64_t client_id, uint64_t seq, uint64_t acked_below, int64_t now_ms,
                         sl_served_t **again, char *err, size_t errlen)
{
    return ask(h, client_id, seq, acked_below, now_ms, true, again, err, errlen);
}

int sl_holders_recall(sl_holders_t *h, uint64_t client_id, uint64_t seq, sl_served_t **again, char *err,
                      size_t errlen)
{
    const struct holder *c = find(h, client_id);
    if ((*again = c ? held_at(c, seq) : NULL))
        return SL_HELD_AGAIN;
    return !c || seq >= c->next_seq ? SL_HELD_NEW : lost(seq, err, errlen);
}

void sl_holders_ack(sl_holders_t *h, uint64_t client_id, uint64_t acked_below)
{
    /* A client that leaves: its requests that still wait for a batch are
     * served after this, and what they send is not held either. */
    struct holder *c = acked_below == UINT64_MAX ? get(h, client_id) : find(h, client_id);
    if (!c)
        return;
    if (acked_below == UINT64_MAX)
        lose_held(h, c); /* what it said it has may still be on its way */
    ack(h, c, acked_below);
    if (acked_below == UINT64_MAX)
        c->left = true;
}

sl_served_t *sl_holders_find(sl_holders_t *h, uint64_t client_id, uint64_t seq)
{
    const struct holder *c = find(h, client_id);
    return c ? held_at(c, seq) : NULL;
}

sl_hold_t sl_holders_keep(sl_holders_t *h, uint64_t client_id, uint64_t seq, sl_served_t *s, size_t charged,
                          int64_t now_ms)
{
    struct holder *c = get(h, client_id); /* swept while its request waited */
    if (!c || c->left)
        lose(h, s);
    if (!c)
        return SL_HOLD_NO_ROOM;
    if (c->left)
        return SL_HOLD_LEFT;
    if (seq >= c->next_seq)
        c->next_seq = seq + 1;
    c->last_ms = now_ms;
    size_t bytes = served_bytes(s);
    size_t handed = !h->budget ? 0 : charged < bytes ? charged : bytes;
    /* Not a refusal of the budget's (sluice_worker_memory_refusals_total):
     * the batch is served all the same (the caller counts it not held). */
    if (c->n == SL_HELD_ROUNDS ||
        (h->budget && bytes > handed && !sl_membudget_try_charge(h->budget, bytes - handed))) {
        if (!c->warned)
            sl_log_warn("task %" PRIu64 ": no room to hold batch %" PRIu64 " of client %" PRIu64 " (%zu bytes) "
                        "until it is acknowledged: if its connection breaks first, it cannot be sent again",
                        s->task_id, seq, client_id, bytes);
        c->warned = true;
        lose(h, s);
        return SL_HOLD_NO_ROOM;
    }
    s->charged = h->budget ? bytes : 0;
    s->handed = handed;
    if (h->own && s->charged)
        __atomic_add_fetch(h->own, s->charged, __ATOMIC_RELEASE);
    s->seq = seq;
    s->refs++;
    /* In seq order, which ack() counts on: the end, but for a round
     * answered before one asked earlier. */
    unsigned k = c->n;
    for (; k > 0 && c->held[k - 1]->seq > seq; k--)
        c->held[k] = c->held[k - 1];
    c->held[k] = s;
    c->n++;
    return SL_HOLD_KEPT;
}

unsigned sl_holders_sweep(sl_holders_t *h, int64_t now_ms, int64_t timeout_ms)
{
    unsigned dropped = 0;
    for (unsigned i = 0; i < h->n;) {
        if (now_ms - h->v[i].last_ms > timeout_ms) {
            dropped += h->v[i].n;
            lose_held(h, &h->v[i]);
            if (h->v[i].n > 0)
                sl_log_info("dropped %u batches held for client %" PRIu64 ", silent for %" PRId64 " ms",
                            h->v[i].n, h->v[i].client_id, now_ms - h->v[i].last_ms);
            holder_remove(h, i);
        } else {
            i++;
        }
    }
    return dropped;
}

bool sl_holders_empty(const sl_holders_t *h)
{
    for (unsigned i = 0; i < h->n; i++)
        if (h->v[i].n > 0)
            return false;
    return true;
}

uint64_t sl_holders_received_below(const sl_holders_t *h, uint64_t done_below, uint64_t *lost_below, uint64_t *past)
{
    uint64_t below = done_below;
    for (unsigned i = 0; i < h->n; i++)
        for (unsigned k = 0; k < h->v[i].n; k++)
            if (h->v[i].held[k]->floor < below)
                below = h->v[i].held[k]->floor;
    *lost_below = h->lost_ceil;
    *past = below;
    return h->lost_ceil != 0 && h->lost_floor < below ? h->lost_floor : below;
}

void sl_holders_unheld(sl_holders_t *h, const sl_served_t *s)
{
    lose(h, s);
}

void sl_holders_count(const sl_holders_t *h, unsigned *batches, size_t *bytes)
{
    for (unsigned i = 0; i < h->n; i++) {
        *batches += h->v[i].n;
        for (unsigned k = 0; k < h->v[i].n; k++)
            *bytes += served_bytes(h->v[i].held[k]);
    }
}
