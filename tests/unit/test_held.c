/*
 * Batches a worker served and holds until its client acknowledges them
 * (workerd/held.h): asked again they come again, acknowledged or past the
 * hold timeout they are let go, and every bound holds.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "big_alloc.h"
#include "held.h"
#include "seed_util.h"
#include "sluice.h"

static char err[512];

/* A served batch of `size` bytes of task 7 (one reference, the caller's). */
static sl_served_t *served(size_t size)
{
    sl_wire_batch_t *b = calloc(1, sizeof *b);
    cr_assert_not_null(b);
    b->data = calloc(1, size);
    b->size = size;
    sl_served_t *s = sl_served_new(7, b);
    cr_assert_not_null(s);
    return s;
}

/* Serves seq to client c as the worker does: ask, then keep. */
static sl_served_t *serve(sl_holders_t *h, uint64_t c, uint64_t seq, uint64_t acked, int64_t now, size_t size)
{
    sl_served_t *again;
    cr_assert_eq(sl_holders_ask(h, c, seq, acked, now, &again, err, sizeof err), SL_HELD_NEW, "%s", err);
    sl_served_t *s = served(size);
    sl_holders_keep(h, c, seq, s, 0, now);
    sl_served_unref(s); /* the holder's reference stays */
    return s;
}

static void counts(sl_holders_t *h, unsigned batches, size_t bytes)
{
    unsigned b = 0;
    size_t n = 0;
    sl_holders_count(h, &b, &n);
    cr_assert_eq(b, batches);
    cr_assert_eq(n, bytes);
    cr_assert_eq(sl_holders_empty(h), batches == 0);
}

Test(held, a_batch_asked_again_comes_again_until_acknowledged)
{
    sl_holders_t *h = sl_holders_new(NULL);
    counts(h, 0, 0);
    sl_served_t *s1 = serve(h, 5, 1, 1, 0, 100);
    sl_served_t *s2 = serve(h, 5, 2, 1, 0, 200);
    counts(h, 2, 300);
    /* The connection broke: both asked again, in order, same batches. */
    sl_served_t *again;
    cr_assert_eq(sl_holders_ask(h, 5, 1, 1, 10, &again, err, sizeof err), SL_HELD_AGAIN);
    cr_assert_eq(again, s1);
    cr_assert_eq(sl_holders_ask(h, 5, 2, 1, 10, &again, err, sizeof err), SL_HELD_AGAIN);
    cr_assert_eq(again, s2);
    /* Request 3 acknowledges 1 and 2: they go; 1 asked again is refused. */
    serve(h, 5, 3, 3, 20, 50);
    counts(h, 1, 50);
    cr_assert_eq(sl_holders_ask(h, 5, 1, 3, 30, &again, err, sizeof err), SL_ECLOSED);
    cr_assert_not_null(strstr(err, "request 1"), "%s", err);
    cr_assert_not_null(strstr(err, "lost to this client"), "%s", err);
    /* Another client's seqs are its own. */
    serve(h, 6, 1, 1, 30, 10);
    counts(h, 2, 60);
    /* Both acknowledge all: clients that hold nothing leave the holders empty. */
    sl_holders_ack(h, 5, 4);
    sl_holders_ack(h, 6, 2);
    counts(h, 0, 0);
    sl_holders_free(h);
}

/* Keeps a batch of size bytes served to client c under seq, whose request
 * was asked before. @return what sl_holders_keep() answered */
static sl_hold_t keep(sl_holders_t *h, uint64_t c, uint64_t seq, size_t size)
{
    sl_served_t *s = served(size);
    sl_hold_t r = sl_holders_keep(h, c, seq, s, 0, 0);
    sl_served_unref(s);
    return r;
}

/* A client that leaves acknowledges everything (an ack-only request with
 * acked_below UINT64_MAX); its requests that still waited for a batch are
 * served after that, and those batches must not be held for it until the
 * hold timeout. Another client is held for as before. */
Test(held, a_client_that_left_is_not_held_for)
{
    sl_holders_t *h = sl_holders_new(NULL);
    sl_served_t *again;
    serve(h, 5, 1, 1, 0, 100);
    serve(h, 6, 1, 1, 0, 100);
    /* Both ask for round 2; client 5 leaves before its answer comes. */
    cr_assert_eq(sl_holders_ask(h, 5, 2, 1, 0, &again, err, sizeof err), SL_HELD_NEW, "%s", err);
    cr_assert_eq(sl_holders_ask(h, 6, 2, 1, 0, &again, err, sizeof err), SL_HELD_NEW, "%s", err);
    sl_holders_ack(h, 5, UINT64_MAX);
    counts(h, 1, 100);
    cr_assert_eq(keep(h, 5, 2, 100), SL_HOLD_LEFT);
    cr_assert_eq(keep(h, 6, 2, 100), SL_HOLD_KEPT);
    counts(h, 2, 200);
    /* A client that left before anything was held for it, too. */
    sl_holders_ack(h, 7, UINT64_MAX);
    cr_assert_eq(keep(h, 7, 1, 100), SL_HOLD_LEFT);
    cr_assert_eq(keep(h, 8, 1, 100), SL_HOLD_KEPT);
    sl_holders_ack(h, 6, 3);
    sl_holders_ack(h, 8, 2);
    counts(h, 0, 0);
    sl_holders_free(h);
}

/* Serves seq to client c with the floor the worker gives it (the
 * done_below of the task's batch served before it) and its ceil (one past
 * the largest split id its task had). */
static sl_served_t *serve_in(sl_holders_t *h, uint64_t c, uint64_t seq, uint64_t acked, uint64_t floor, uint64_t ceil)
{
    sl_served_t *again;
    cr_assert_eq(sl_holders_ask(h, c, seq, acked, 0, &again, err, sizeof err), SL_HELD_NEW, "%s", err);
    sl_served_t *s = served(100);
    s->floor = floor;
    s->ceil = ceil;
    return s;
}

static void serve_above(sl_holders_t *h, uint64_t c, uint64_t seq, uint64_t acked, uint64_t floor, uint64_t ceil)
{
    sl_served_t *s = serve_in(h, c, seq, acked, floor, ceil);
    cr_assert_eq(sl_holders_keep(h, c, seq, s, 0, 0), SL_HOLD_KEPT);
    sl_served_unref(s);
}

/* What the holders say reached the clients, given the task's done_below. */
static uint64_t received_below_of(const sl_holders_t *h, uint64_t done_below)
{
    uint64_t lost_below, past;
    return sl_holders_received_below(h, done_below, &lost_below, &past);
}

/* What the holders say without the batches lost, and below which split
 * those may hold records (0: none lost). */
static uint64_t past_lost(const sl_holders_t *h, uint64_t done_below, uint64_t *lost_below)
{
    uint64_t past;
    (void)sl_holders_received_below(h, done_below, lost_below, &past);
    return past;
}

/* The worker tells the dispatcher below which split every record went out
 * in a batch its client acknowledged (GetSplitRequest.received_below): the
 * task's done_below, less where a batch held unacknowledged may hold records
 * of a split (its floor), and less where a batch lost may: one that went
 * out unheld or was let go of unacknowledged (a client silent past the
 * hold timeout, one that left with batches held, one the budget had no
 * room to hold). Past the splits the batches lost may hold records of
 * (below the largest ceil of them), what it would say without them
 * (received_past_lost). Before 2026-12-05 a batch lost made it 0 for good. */
Test(held, received_below_stops_at_the_oldest_batch_not_acknowledged_or_lost)
{
    uint64_t lost;
    sl_holders_t *h = sl_holders_new(NULL);
    cr_assert_eq(received_below_of(h, 4), 4, "nothing served");
    serve_above(h, 5, 1, 1, 0, 2);
    serve_above(h, 6, 1, 1, 2, 3);
    serve_above(h, 5, 2, 1, 3, 5);
    cr_assert_eq(received_below_of(h, 9), 0, "client 5's first batch may hold a record of split 0");
    cr_assert_eq(past_lost(h, 9, &lost), 0);
    cr_assert_eq(lost, 0, "none lost");
    sl_holders_ack(h, 5, 2);
    cr_assert_eq(received_below_of(h, 9), 2, "client 6's batch, after split 1 was done");
    sl_holders_ack(h, 6, 2);
    cr_assert_eq(received_below_of(h, 9), 3);
    cr_assert_eq(received_below_of(h, 1), 1, "never past the task's done_below");
    sl_holders_ack(h, 5, 3);
    cr_assert_eq(received_below_of(h, 9), 9, "every batch acknowledged");
    /* Client 5 leaves with a batch of splits 9 and 10 on its way. */
    serve_above(h, 5, 3, 3, 9, 11);
    sl_holders_ack(h, 5, UINT64_MAX);
    cr_assert(sl_holders_empty(h));
    cr_assert_eq(received_below_of(h, 12), 9, "it left with a batch that may still be on its way");
    cr_assert_eq(past_lost(h, 12, &lost), 12, "past the splits of the batch it left with");
    cr_assert_eq(lost, 11);
    /* Past them, a batch held unacknowledged stops the rest as before. */
    serve_above(h, 6, 2, 2, 12, 14);
    cr_assert_eq(past_lost(h, 15, &lost), 12);
    cr_assert_eq(received_below_of(h, 15), 9);
    sl_holders_ack(h, 6, 3);
    cr_assert_eq(past_lost(h, 15, &lost), 15);
    cr_assert_eq(lost, 11);
    /* Client 6 is silent past the hold timeout with a batch of splits 15
     * to 19: the range lost reaches from the first batch lost to the last. */
    serve_above(h, 6, 3, 3, 15, 20);
    cr_assert_eq(sl_holders_sweep(h, 2000, 1000), 1);
    cr_assert_eq(received_below_of(h, 21), 9);
    cr_assert_eq(past_lost(h, 21, &lost), 21);
    cr_assert_eq(lost, 20, "let go after the hold timeout");
    sl_holders_free(h);

    h = sl_holders_new(NULL);
    serve_above(h, 5, 1, 1, 0, 2);
    sl_holders_ack(h, 5, 2);
    sl_holders_ack(h, 5, UINT64_MAX);
    cr_assert_eq(received_below_of(h, 4), 4, "it left with nothing held");
    cr_assert_eq(past_lost(h, 4, &lost), 4);
    cr_assert_eq(lost, 0);
    sl_served_t *s = serve_in(h, 5, 2, 2, 2, 4);
    cr_assert_eq(sl_holders_keep(h, 5, 2, s, 0, 0), SL_HOLD_LEFT);
    sl_served_unref(s);
    cr_assert_eq(received_below_of(h, 4), 2, "served after it left, not held");
    cr_assert_eq(past_lost(h, 5, &lost), 5);
    cr_assert_eq(lost, 4);
    /* One of no split (its task had none when it was served) loses none. */
    s = serve_in(h, 6, 1, 1, 0, 0);
    sl_holders_unheld(h, s);
    sl_served_unref(s);
    cr_assert_eq(past_lost(h, 5, &lost), 5);
    cr_assert_eq(lost, 4);
    sl_holders_free(h);

    h = sl_holders_new(NULL);
    s = served(100);
    s->floor = 3;
    sl_holders_unheld(h, s);
    sl_served_unref(s);
    cr_assert_eq(received_below_of(h, 4), 3, "served to a request without seq");
    cr_assert_eq(past_lost(h, 4, &lost), 4);
    cr_assert_eq(lost, UINT64_MAX, "a batch whose ceil is not known holds records of any split past its floor");
    sl_holders_free(h);

    sl_membudget_t mem;
    sl_membudget_init(&mem, 1000, "--max-memory-mb");
    h = sl_holders_new(&mem);
    serve(h, 5, 1, 1, 0, 600);
    serve(h, 5, 2, 1, 0, 600); /* no room */
    sl_holders_ack(h, 5, 3);
    cr_assert(sl_holders_empty(h));
    cr_assert_eq(received_below_of(h, 4), 0, "the budget had no room to hold one");
    cr_assert_eq(past_lost(h, 4, &lost), 4);
    cr_assert_eq(lost, UINT64_MAX);
    sl_holders_free(h);
}

Test(held, at_most_SL_HELD_MAX_unacknowledged_requests_and_SL_HOLDERS_MAX_clients)
{
    sl_holders_t *h = sl_holders_new(NULL);
    for (uint64_t seq = 1; seq <= SL_HELD_MAX; seq++)
        serve(h, 5, seq, 1, 0, 1);
    sl_served_t *again;
    cr_assert_eq(sl_holders_ask(h, 5, SL_HELD_MAX + 1, 1, 0, &again, err, sizeof err), SL_ELIMIT);
    cr_assert_not_null(strstr(err, "at most 16 requests"), "%s", err);
    cr_assert_eq(sl_holders_ask(h, 5, SL_HELD_MAX + 1, 2, 0, &again, err, sizeof err), SL_HELD_NEW, "%s", err);
    for (uint64_t c = 100; c < 100 + SL_HOLDERS_MAX - 1; c++)
        cr_assert_eq(sl_holders_ask(h, c, 1, 1, 0, &again, err, sizeof err), SL_HELD_NEW, "%s", err);
    cr_assert_eq(sl_holders_ask(h, 99999, 1, 1, 0, &again, err, sizeof err), SL_ELIMIT);
    cr_assert_not_null(strstr(err, "more than 1024 clients"), "%s", err);
    sl_holders_free(h);
}

/* A request that waited beside an earlier one of the same seq (asked again
 * on a new connection while the old one, still open on the worker, waited
 * too) gets what that one got: the held batch, a refusal once it is no
 * longer held, or a batch of its own when none was served under the seq. */
Test(held, a_twin_request_gets_what_the_earlier_one_got)
{
    sl_holders_t *h = sl_holders_new(NULL);
    sl_served_t *s1 = serve(h, 5, 1, 1, 0, 100);
    serve(h, 5, 2, 1, 0, 100);
    sl_served_t *again;
    cr_assert_eq(sl_holders_recall(h, 5, 1, &again, err, sizeof err), SL_HELD_AGAIN);
    cr_assert_eq(again, s1);
    cr_assert_eq(sl_holders_recall(h, 5, 3, &again, err, sizeof err), SL_HELD_NEW, "not served yet");
    cr_assert_null(again);
    cr_assert_eq(sl_holders_recall(h, 6, 1, &again, err, sizeof err), SL_HELD_NEW, "another client's seqs");
    counts(h, 2, 200); /* a recall acknowledges nothing */
    serve(h, 5, 3, 2, 0, 100); /* acknowledges 1 */
    cr_assert_eq(sl_holders_recall(h, 5, 1, &again, err, sizeof err), SL_ECLOSED);
    cr_assert_not_null(strstr(err, "request 1"), "%s", err);
    sl_holders_free(h);
}

/* Serves round r (seq r + 1) to consumer c as the worker does for a
 * coordinated read. */
static sl_served_t *serve_round(sl_holders_t *h, uint64_t c, uint64_t r, uint64_t acked_round, size_t size)
{
    sl_served_t *again;
    cr_assert_eq(sl_holders_ask_round(h, c, r + 1, acked_round + 1, 0, &again, err, sizeof err), SL_HELD_NEW,
                 "round %llu: %s", (unsigned long long)r, err);
    sl_served_t *s = served(size);
    cr_assert_eq(sl_holders_keep(h, c, r + 1, s, 0, 0), SL_HOLD_KEPT, "round %llu", (unsigned long long)r);
    sl_served_unref(s);
    return s;
}

/* Coordinated reads number requests by round and are answered in any
 * order: a round not held is new (the rounds know whether it was taken),
 * one held comes again, and an acknowledgement lets go of every round
 * below it, whatever order they were kept in. */
Test(held, rounds_kept_in_any_order_come_again_until_acknowledged)
{
    sl_holders_t *h = sl_holders_new(NULL);
    sl_served_t *kept[SL_HELD_ROUNDS];
    /* Rounds 0 .. 63 served in a shuffled order, round 0 acknowledged
     * below (nothing received yet). */
    uint64_t order[SL_HELD_ROUNDS];
    shuffled_order(order, SL_HELD_ROUNDS, 16);
    for (unsigned i = 0; i < SL_HELD_ROUNDS; i++)
        kept[order[i]] = serve_round(h, 5, order[i], 0, 10 + order[i]);
    counts(h, SL_HELD_ROUNDS, SL_HELD_ROUNDS * 10 + SL_HELD_ROUNDS * (SL_HELD_ROUNDS - 1) / 2);
    sl_served_t *again;
    /* Round 64 is one too many ahead of round 0. */
    cr_assert_eq(sl_holders_ask_round(h, 5, SL_HELD_ROUNDS + 1, 1, 0, &again, err, sizeof err), SL_ELIMIT);
    cr_assert_not_null(strstr(err, "round 64 while 0 and later are not acknowledged: at most 64 rounds"), "%s", err);
    /* Every round asked again comes again. */
    for (unsigned r = 0; r < SL_HELD_ROUNDS; r++) {
        cr_assert_eq(sl_holders_ask_round(h, 5, r + 1, 1, 0, &again, err, sizeof err), SL_HELD_AGAIN, "round %u", r);
        cr_assert_eq(again, kept[r], "round %u", r);
        cr_assert_eq(sl_holders_find(h, 5, r + 1), kept[r], "round %u", r);
    }
    /* Rounds below 40 received: they go, and asked again they are new to
     * the holders (the rounds then say they were taken). */
    cr_assert_eq(sl_holders_ask_round(h, 5, 40 + 1, 40 + 1, 0, &again, err, sizeof err), SL_HELD_AGAIN);
    counts(h, SL_HELD_ROUNDS - 40, (SL_HELD_ROUNDS - 40) * 10 + (40 + SL_HELD_ROUNDS - 1) * (SL_HELD_ROUNDS - 40) / 2);
    cr_assert_eq(sl_holders_ask_round(h, 5, 39 + 1, 41, 0, &again, err, sizeof err), SL_HELD_NEW);
    cr_assert_null(again);
    cr_assert_null(sl_holders_find(h, 5, 39 + 1));
    /* Round 100 is within 64 of round 40; a round not yet kept below the
     * highest kept is new too (answered later than a round after it). */
    serve_round(h, 5, 100, 40, 1);
    cr_assert_eq(sl_holders_ask_round(h, 5, 70 + 1, 41, 0, &again, err, sizeof err), SL_HELD_NEW);
    cr_assert_null(sl_holders_find(h, 6, 40 + 1), "another consumer holds nothing");
    sl_holders_free(h);
}

Test(held, silent_clients_are_let_go_after_the_timeout)
{
    sl_holders_t *h = sl_holders_new(NULL);
    serve(h, 5, 1, 1, 0, 100);
    serve(h, 6, 1, 1, 500, 100);
    cr_assert_eq(sl_holders_sweep(h, 1000, 1000), 0, "1000 ms silent, not more");
    cr_assert_eq(sl_holders_sweep(h, 1001, 1000), 1);
    counts(h, 1, 100);
    sl_served_t *again;
    cr_assert_eq(sl_holders_ask(h, 6, 1, 1, 1100, &again, err, sizeof err), SL_HELD_AGAIN);
    /* Client 5 comes back: its seq 1 is gone, and the refusal says so. */
    cr_assert_eq(sl_holders_ask(h, 5, 1, 1, 1100, &again, err, sizeof err), SL_HELD_NEW,
                 "a client let go starts anew: its next request is served");
    sl_holders_free(h);
}

Test(held, held_bytes_are_charged_to_the_budget_and_what_it_refuses_is_not_held)
{
    sl_membudget_t mem;
    sl_membudget_init(&mem, 1000, "--max-memory-mb");
    sl_holders_t *h = sl_holders_new(&mem);
    serve(h, 5, 1, 1, 0, 600);
    cr_assert_eq(sl_membudget_used(&mem), 600);
    serve(h, 5, 2, 1, 0, 600); /* no room: served, not held */
    counts(h, 1, 600);
    cr_assert_eq(mem.refusals, 0, "a batch served and not held is no refusal of a charge (no task failed)");
    sl_served_t *again;
    cr_assert_eq(sl_holders_ask(h, 5, 2, 1, 0, &again, err, sizeof err), SL_ECLOSED,
                 "asked again, a batch that could not be held is refused, not served anew");
    serve(h, 5, 3, 3, 0, 100);
    cr_assert_eq(sl_membudget_used(&mem), 100, "acknowledged: given back");
    sl_holders_free(h);
    cr_assert_eq(sl_membudget_used(&mem), 0);
}

/* A served batch its task charged to the budget: the holder takes that
 * charge over, so a full budget keeps it all the same, and the budget is
 * charged once for it, not twice while its send and its hold overlap.
 * Given back when acknowledged (the task gives back only what it kept:
 * workerd/task.h, sl_task_hand_over()). */
Test(held, a_batch_its_task_charged_is_kept_on_a_full_budget_with_that_charge)
{
    sl_membudget_t mem;
    sl_membudget_init(&mem, 1000, "--max-memory-mb");
    sl_holders_t *h = sl_holders_new(&mem);
    sl_served_t *again;
    cr_assert(sl_membudget_charge(&mem, 1000), "the task's buffer fills the budget");
    cr_assert_eq(sl_holders_ask(h, 5, 1, 1, 0, &again, err, sizeof err), SL_HELD_NEW, "%s", err);
    sl_served_t *s = served(600);
    cr_assert_eq(sl_holders_keep(h, 5, 1, s, 600, 0), SL_HOLD_KEPT, "kept with its task's charge of 600 bytes");
    cr_assert_eq(s->charged, 600);
    cr_assert_eq(s->handed, 600);
    sl_served_unref(s);
    sl_membudget_release(&mem, 1000 - 600); /* the task's release: what it did not hand over */
    cr_assert_eq(sl_membudget_used(&mem), 600, "charged once");
    /* A batch whose notices came after its task charged it: only they are
     * charged anew, and on a full budget it is not kept. */
    cr_assert(sl_membudget_charge(&mem, 400));
    cr_assert_eq(sl_holders_ask(h, 5, 2, 1, 0, &again, err, sizeof err), SL_HELD_NEW, "%s", err);
    s = served(300);
    s->notices_len = 20;
    cr_assert_eq(sl_holders_keep(h, 5, 2, s, 300, 0), SL_HOLD_NO_ROOM, "20 bytes of notices have no room");
    cr_assert_eq(s->handed, 0, "nothing taken over from a batch not kept");
    sl_served_unref(s);
    sl_membudget_release(&mem, 400); /* its task's 300 and the other 100 */
    cr_assert(sl_membudget_charge(&mem, 300), "the task charges the next batch");
    cr_assert_eq(sl_holders_ask(h, 5, 3, 1, 0, &again, err, sizeof err), SL_HELD_NEW, "%s", err);
    s = served(300);
    s->notices_len = 20;
    cr_assert_eq(sl_holders_keep(h, 5, 3, s, 300, 0), SL_HOLD_KEPT);
    cr_assert_eq(s->charged, 320);
    cr_assert_eq(s->handed, 300);
    sl_served_unref(s);
    cr_assert_eq(sl_membudget_used(&mem), 920, "600 handed over, 300 handed over and 20 for the notices");
    cr_assert_eq(sl_holders_ask(h, 5, 3, 3, 0, &again, err, sizeof err), SL_HELD_AGAIN, "1 acknowledged");
    cr_assert_eq(sl_membudget_used(&mem), 320);
    sl_holders_free(h);
    cr_assert_eq(sl_membudget_used(&mem), 0, "the holder gave back what it took over");
}

static unsigned region_frees;

static void region_free(void *arg, void *p)
{
    (void)arg;
    (void)p;
    region_frees++;
}

/* A batch whose block was made in a client's shared-memory region (a
 * foreign range, workerd/shm.h) is held without charging its tensor bytes
 * again: the region charged its pages when the block was placed. Its block
 * goes back to the region when the batch is acknowledged. */
Test(held, a_batch_made_in_shared_memory_is_held_without_charging_its_block_twice)
{
    static uint8_t region[1 << 16];
    cr_assert_eq(sl__big_foreign_add(region, sizeof region, region_free, NULL), 0);
    sl_membudget_t mem;
    sl_membudget_init(&mem, 1 << 20, "--max-memory-mb");
    sl_holders_t *h = sl_holders_new(&mem);
    sl_served_t *again;
    cr_assert_eq(sl_holders_ask(h, 5, 1, 1, 0, &again, err, sizeof err), SL_HELD_NEW, "%s", err);
    sl_wire_batch_t *b = calloc(1, sizeof *b);
    cr_assert_not_null(b);
    b->data = region + 4096;
    b->size = 32768;
    cr_assert_eq(sl_wire_batch_held_bytes(b), 0);
    sl_served_t *s = sl_served_new(7, b);
    cr_assert_not_null(s);
    cr_assert_eq(sl_holders_keep(h, 5, 1, s, 0, 0), SL_HOLD_KEPT);
    sl_served_unref(s);
    counts(h, 1, 0);
    cr_assert_eq(sl_membudget_used(&mem), 0, "%zu bytes charged", sl_membudget_used(&mem));
    serve(h, 5, 2, 2, 0, 100); /* acknowledges 1 */
    cr_assert_eq(region_frees, 1, "the block went back to its region");
    cr_assert_eq(sl_membudget_used(&mem), 100);
    sl_holders_free(h);
    sl__big_foreign_remove(region);
    cr_assert_eq(sl_membudget_used(&mem), 0);
}
