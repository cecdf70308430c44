/*
 * test_split_track.c: workerd/split_track.c against a model, at the sizes
 * users run. Each round draws a stream from the seed: hundreds of files over
 * one or two epochs, split lengths from 1 to 65,536 records, several splits
 * read at once (interleave), skip runs (splits handed out again), a shuffle
 * buffer of up to 100,000 records, a filter, batches with or without
 * drop_remainder, a queue of batches waiting to be sent, and pipelines that
 * end early. After every batch the table's tally must be the batch's own
 * count split by split, and the splits it reports done must be exactly those
 * the model says are: read to their end and every record dropped or sent,
 * with the right count delivered. Seeded: SLUICE_TEST_SEED repeats a run.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "seed_util.h"
#include "split_track.h"

/* cr_assert() counts every pass, which costs more than the checks here:
 * this one goes to Criterion only to fail. */
#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        if (!(cond))                                                                                                   \
            cr_assert_fail(__VA_ARGS__);                                                                               \
    } while (0)

static uint64_t rng_state;

static uint64_t draw(void)
{
    return splitmix64(&rng_state);
}

/* Uniform in [lo, hi]. */
static uint64_t between(uint64_t lo, uint64_t hi)
{
    return lo + draw() % (hi - lo + 1);
}

/* Log-uniform in [1, hi]: small and large sizes alike. */
static uint64_t log_between(uint64_t hi)
{
    unsigned bits = 0;
    while ((UINT64_C(1) << bits) < hi)
        bits++;
    uint64_t v = UINT64_C(1) << between(0, bits);
    v = between(v / 2 + 1 > v ? v : v / 2 + 1, v);
    return v > hi ? hi : v;
}

struct msplit {
    sl_split_t s;
    uint32_t epoch;
    uint64_t cursor;              /* next record to read */
    uint64_t read, dropped, out, sent;
    bool added, read_done, collected;
};

struct rec {
    uint32_t epoch, file;
    uint64_t pos;
    uint32_t split; /* index into the model's splits */
};

struct model {
    sl_split_track_t *t;
    struct msplit *sp;
    size_t ns;
    size_t *live; /* the splits added and not reported done yet */
    size_t nlive;
    uint64_t *count; /* a batch's records of each split, zero between batches */
    unsigned seed, round;
    uint64_t one_split, several; /* batches whose records lie in one split, in more */
};

/* Both kinds of batch, over all rounds: sl_split_track_out() tallies the
 * first from the span alone and walks the second run by run. */
static uint64_t batches_in_one_split, batches_in_more;

/* The runs of records r[0..n): consecutive positions of one file and epoch
 * merge, as batch merges them (a run may span two splits of a file). */
static size_t runs_of(const struct rec *r, size_t n, sl_provenance_run_t *runs)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (k > 0 && runs[k - 1].epoch == r[i].epoch && runs[k - 1].file_index == r[i].file &&
            runs[k - 1].begin + runs[k - 1].count == r[i].pos) {
            runs[k - 1].count++;
            continue;
        }
        runs[k++] = (sl_provenance_run_t){r[i].epoch, r[i].file, r[i].pos, 1};
    }
    return k;
}

/* Collects what the table says is done and checks it against the model. */
static void check_done(struct model *m)
{
    static sl_split_done_rec_t out[4096];
    unsigned got;
    /* What a send asks of the table after every batch: whether a split is
     * done, and the least id it holds (kept as entries change, not walked). */
    bool any_done = false;
    uint64_t min_id = UINT64_MAX;
    for (size_t l = 0; l < m->nlive; l++) {
        const struct msplit *s = &m->sp[m->live[l]];
        any_done |= s->read_done && s->dropped + s->sent == s->read;
        if (s->s.split_id < min_id)
            min_id = s->s.split_id;
    }
    CHECK(sl_split_track_has_done(m->t) == any_done, "seed %u round %u: the table says a split is %sdone",
          m->seed, m->round, any_done ? "not " : "");
    CHECK(sl_split_track_min_id(m->t) == min_id, "seed %u round %u: the least split id is %lu, not %lu", m->seed,
          m->round, (unsigned long)sl_split_track_min_id(m->t), (unsigned long)min_id);
    while ((got = sl_split_track_collect(m->t, out, 4096)) > 0) {
        for (unsigned i = 0; i < got; i++) {
            size_t ix = out[i].split_id - 1;
            CHECK(ix < m->ns, "seed %u round %u: a split id never handed out", m->seed, m->round);
            struct msplit *s = &m->sp[ix];
            CHECK(!s->collected, "seed %u round %u: split %zu reported done twice", m->seed, m->round, ix);
            CHECK(s->read_done && s->dropped + s->sent == s->read,
                      "seed %u round %u: split %zu [%lu, %lu) of file %u reported done early: "
                      "read %lu%s, dropped %lu, sent %lu",
                      m->seed, m->round, ix, (unsigned long)s->s.begin, (unsigned long)s->s.end,
                      s->s.file_index, (unsigned long)s->read, s->read_done ? "" : " (still reading)",
                      (unsigned long)s->dropped, (unsigned long)s->sent);
            CHECK(out[i].delivered == s->sent, "seed %u round %u: split %zu delivered %lu, sent %lu",
                         m->seed, m->round, ix, (unsigned long)out[i].delivered, (unsigned long)s->sent);
            CHECK(out[i].epoch == s->epoch && out[i].file_index == s->s.file_index &&
                          out[i].begin == s->s.begin && out[i].end == s->s.end,
                      "seed %u round %u: split %zu reported with another key", m->seed, m->round, ix);
            s->collected = true;
        }
    }
    unsigned tracked = 0;
    for (size_t l = 0; l < m->nlive; l++) {
        size_t i = m->live[l];
        struct msplit *s = &m->sp[i];
        if (s->collected)
            continue;
        m->live[tracked] = i;
        CHECK(!(s->read_done && s->dropped + s->sent == s->read),
                  "seed %u round %u: split %zu is done (read %lu, dropped %lu, sent %lu) but not reported",
                  m->seed, m->round, i, (unsigned long)s->read, (unsigned long)s->dropped,
                  (unsigned long)s->sent);
        tracked++;
    }
    m->nlive = tracked;
    CHECK(!sl_split_track_has_done(m->t), "seed %u round %u: a split done after all were collected", m->seed,
          m->round);
    CHECK(sl_split_track_size(m->t) == tracked, "seed %u round %u: the table holds %u splits, not %u",
                 m->seed, m->round, sl_split_track_size(m->t), tracked);
}

/* Settles n records as how says, in the table and the model. */
static void settle(struct model *m, const struct rec *r, size_t n, enum sl_settle how, sl_provenance_run_t *runs,
                   bool ended)
{
    if (n == 0)
        return;
    size_t k = runs_of(r, n, runs);
    sl_split_track_settle(m->t, runs, k, how);
    if (how == SL_SETTLE_DROPPED && ended)
        return; /* the end counted them already */
    for (size_t i = 0; i < n; i++) {
        struct msplit *s = &m->sp[r[i].split];
        if (how == SL_SETTLE_DROPPED)
            s->dropped++;
        else
            s->sent++;
    }
}

struct queued {
    struct rec *r;
    size_t n;
    sl_split_done_t *rows;
    unsigned nrows;
};

static bool same_span(const sl_prov_span_t *a, const sl_prov_span_t *b)
{
    return a->pair == b->pair && a->one_pair == b->one_pair && a->wraps == b->wraps && a->empty == b->empty &&
           a->records == b->records && a->lo == b->lo && a->hi == b->hi;
}

/* A batch leaves the pipeline: tallied, checked, queued to be sent. */
static void out_batch(struct model *m, struct rec *r, size_t n, sl_provenance_run_t *runs, struct queued *q)
{
    size_t k = runs_of(r, n, runs);
    unsigned rows_max = sl_split_track_size(m->t);
    sl_split_done_t *tally = malloc((rows_max + 1) * sizeof *tally);
    cr_assert(tally);
    /* The span it finds for the batch is sl_prov_span()'s. */
    bool spans = draw() % 2;
    sl_prov_span_t span, want;
    memset(&span, 0xa5, sizeof span);
    unsigned nt = sl_split_track_out(m->t, runs, k, tally, spans ? &span : NULL);
    cr_assert_leq(nt, rows_max);
    if (spans && k > 0) {
        sl_prov_span_scalar(runs, k, &want);
        CHECK(same_span(&span, &want), "seed %u round %u: the batch's span is not sl_prov_span()'s", m->seed,
              m->round);
    }
    /* The batch's own count, split by split. */
    uint64_t *count = m->count;
    unsigned reached = 0;
    for (size_t i = 0; i < n; i++) {
        if (count[r[i].split]++ == 0)
            reached++;
        m->sp[r[i].split].out++;
    }
    cr_assert_eq(nt, reached, "seed %u round %u: %u tally rows for a batch reaching %u splits", m->seed, m->round,
                 nt, reached);
    if (reached == 1)
        m->one_split++;
    else if (reached > 1)
        m->several++;
    for (unsigned i = 0; i < nt; i++) {
        size_t ix = tally[i].split_id - 1;
        CHECK(ix < m->ns, "seed %u round %u: a tally row of a split never handed out", m->seed, m->round);
        CHECK(tally[i].delivered == count[ix], "seed %u round %u: split %zu tallied %lu of the batch's %lu",
                     m->seed, m->round, ix, (unsigned long)tally[i].delivered, (unsigned long)count[ix]);
        CHECK(tally[i].begin == m->sp[ix].s.begin && tally[i].end == m->sp[ix].s.end,
              "seed %u round %u: split %zu tallied with another key", m->seed, m->round, ix);
        count[ix] = 0; /* a second row for it would now fail */
    }
    for (size_t i = 0; i < n; i++)
        count[r[i].split] = 0;
    q->r = malloc(n * sizeof *r);
    cr_assert(q->r);
    memcpy(q->r, r, n * sizeof *r);
    q->n = n;
    q->rows = tally;
    q->nrows = nt;
}

/* The queued batch is handed to a client connection: by its tally rows (as
 * the worker does when the client takes tallies) or run by run. */
static void send_batch(struct model *m, struct queued *q, sl_provenance_run_t *runs)
{
    if (draw() % 2)
        sl_split_track_settle_rows(m->t, q->rows, q->nrows, SL_SETTLE_SENT);
    else
        sl_split_track_settle(m->t, runs, runs_of(q->r, q->n, runs), SL_SETTLE_SENT);
    for (size_t i = 0; i < q->n; i++)
        m->sp[q->r[i].split].sent++;
    free(q->r);
    free(q->rows);
}

/* What comes out of the shuffle buffer: dropped by the filter, or into
 * the batch being built; a full batch leaves the pipeline into the queue
 * of batches waiting to be sent, whose oldest is sent when it is full. */
struct stream {
    struct model *m;
    unsigned drop_pct;
    struct rec *pending;
    size_t npending, batch;
    struct queued *queue;
    size_t nqueue, qhead, queue_max;
    sl_provenance_run_t *runs;
};

/* The batch being built leaves the pipeline (it may be short: the last). */
static void emit(struct stream *st)
{
    if (st->nqueue == st->queue_max) {
        send_batch(st->m, &st->queue[st->qhead], st->runs);
        st->qhead = (st->qhead + 1) % st->queue_max;
        st->nqueue--;
    }
    out_batch(st->m, st->pending, st->npending, st->runs, &st->queue[(st->qhead + st->nqueue) % st->queue_max]);
    st->nqueue++;
    st->npending = 0;
}

static void pass_on(struct stream *st, struct rec r)
{
    if (draw() % 100 < st->drop_pct) {
        settle(st->m, &r, 1, SL_SETTLE_DROPPED, st->runs, false);
        return;
    }
    st->pending[st->npending++] = r;
    if (st->npending == st->batch) {
        emit(st);
        check_done(st->m);
    }
}

/* like_range: one reader, splits of up to 65,536 records and batches of
 * 1024, as behind a range source (most batches then lie in one split). */
static void one_round(unsigned seed, unsigned round, uint64_t max_records, size_t buffer, bool like_range)
{
    /* The stream's shape. */
    uint32_t epochs = (uint32_t)between(1, 2);
    uint32_t files = (uint32_t)log_between(300);
    if (files > max_records / epochs)
        files = (uint32_t)(max_records / epochs > 0 ? max_records / epochs : 1);
    uint64_t per_file = max_records / epochs / files;
    /* Splits are at least 1/64 of the shuffle buffer (split_size_for()
     * in dispatcher/state.c); a file's last one may be shorter. */
    uint64_t split_min = (buffer + 63) / 64, split_max = log_between(65536);
    if (split_max < split_min)
        split_max = split_min;
    unsigned cycle = (unsigned)between(1, 8), block = (unsigned)log_between(16);
    unsigned drop_pct = (unsigned)(draw() % 3 == 0 ? 0 : between(1, 60));
    size_t batch = (size_t)log_between(2048);
    if (like_range) {
        /* A range is one file, read to its end, nothing filtered: many
         * batches then lie in one split (the path the other rounds reach
         * only now and then; a seed once drew 20 such batches in all). */
        files = 1;
        per_file = max_records / epochs;
        cycle = 1;
        /* Splits as a worker asks for them at full speed (50 ms of its
         * pipeline: 262,144 records): a batch's records come from one split
         * once the records of the one before are out of the buffer. */
        split_min = split_max = 262144;
        batch = 1024;
        drop_pct = 0;
    }
    bool drop_remainder = draw() % 2;
    size_t queue_max = (size_t)between(1, 16);
    unsigned skip_pct = (unsigned)between(0, 30);
    /* Ends early at this record read (or reads everything). */
    uint64_t stop_at = draw() % 3 == 0 ? between(0, max_records) : UINT64_MAX;
    if (like_range)
        stop_at = UINT64_MAX;

    /* The splits, file by file, each epoch's in an order of its own (a
     * split handed out again comes late). */
    struct model m = {.t = sl_split_track_new(), .seed = seed, .round = round};
    cr_assert(m.t);
    size_t cap = 1024;
    m.sp = calloc(cap, sizeof *m.sp);
    cr_assert(m.sp);
    uint64_t total = 0;
    for (uint32_t e = 0; e < epochs; e++) {
        size_t first = m.ns;
        for (uint32_t f = 0; f < files; f++) {
            uint64_t len = draw() % 50 == 0 && !like_range ? 0 : between(per_file / 2, per_file + per_file / 2);
            for (uint64_t b = 0; b < len;) {
                uint64_t l = between(split_min, split_max);
                if (l > len - b)
                    l = len - b;
                if (m.ns == cap) {
                    m.sp = realloc(m.sp, 2 * cap * sizeof *m.sp);
                    cr_assert(m.sp);
                    memset(m.sp + cap, 0, cap * sizeof *m.sp);
                    cap *= 2;
                }
                m.sp[m.ns] = (struct msplit){.s = {.file_index = f, .begin = b, .end = b + l}, .epoch = e};
                m.ns++;
                b += l;
                total += l;
            }
        }
        for (size_t i = m.ns - first; i > 1; i--) {
            size_t j = first + (size_t)(draw() % i);
            struct msplit tmp = m.sp[first + i - 1];
            m.sp[first + i - 1] = m.sp[j];
            m.sp[j] = tmp;
        }
    }
    for (size_t i = 0; i < m.ns; i++)
        m.sp[i].s.split_id = i + 1;
    m.live = malloc((m.ns + 1) * sizeof *m.live);
    m.count = calloc(m.ns + 1, sizeof *m.count);
    cr_assert(m.live && m.count);
    fprintf(stderr,
            "  round %u: %zu splits (up to %lu records) over %u files x %u epochs, %lu records, cycle %u block %u, "
            "shuffle(%zu), %u%% dropped, batch %zu%s, queue %zu, %u%% skipping, %s\n",
            round, m.ns, (unsigned long)split_max, files, epochs, (unsigned long)total, cycle, block, buffer,
            drop_pct, batch, drop_remainder ? " drop_remainder" : "", queue_max, skip_pct,
            stop_at == UINT64_MAX ? "read to the end" : "ends early");

    struct rec *buf = malloc(buffer * sizeof *buf);
    struct rec *pending = malloc(batch * sizeof *pending);
    sl_provenance_run_t *runs = malloc((buffer > batch ? buffer : batch) * sizeof *runs + sizeof *runs);
    struct queued *queue = calloc(queue_max, sizeof *queue);
    cr_assert(buf && pending && runs && queue);
    struct stream st = {&m, drop_pct, pending, 0, batch, queue, 0, 0, queue_max, runs};
    size_t nbuf = 0;
    size_t next_split = 0;
    size_t active[8];
    unsigned nactive = 0, turn = 0;
    uint64_t records_read = 0;
    bool ended = false;

    for (;;) {
        /* Hand splits to the readers as interleave does. */
        while (nactive < cycle && next_split < m.ns && !ended) {
            struct msplit *s = &m.sp[next_split];
            sl_skip_run_t *skips = NULL;
            uint32_t nskips = 0;
            if (draw() % 100 < skip_pct && s->s.end - s->s.begin >= 2) {
                /* Sorted, disjoint runs, as the dispatcher sends them. */
                skips = malloc(3 * sizeof *skips);
                cr_assert(skips);
                uint32_t want = (uint32_t)between(1, 3);
                for (uint64_t at = s->s.begin; nskips < want && at < s->s.end;) {
                    uint64_t b = between(at, s->s.end - 1);
                    uint64_t c = between(1, s->s.end - b);
                    skips[nskips++] = (sl_skip_run_t){b, c};
                    at = b + c + 1;
                }
            }
            s->s.num_skips = nskips;
            cr_assert_eq(sl_split_track_add(m.t, s->epoch, &s->s, skips), 0);
            cr_assert(s->s.skips == skips);
            s->added = true;
            m.live[m.nlive++] = next_split;
            s->cursor = s->s.begin;
            active[nactive++] = next_split++;
        }
        if (nactive == 0 || records_read >= stop_at)
            break;
        /* Read a block from the next reader in turn, past its skips. */
        turn %= nactive;
        struct msplit *s = &m.sp[active[turn]];
        for (unsigned b = 0; b < block && s->cursor < s->s.end && records_read < stop_at; s->cursor++) {
            bool skipped = false;
            for (uint32_t k = 0; k < s->s.num_skips; k++)
                if (s->cursor >= s->s.skips[k].begin && s->cursor - s->s.skips[k].begin < s->s.skips[k].count)
                    skipped = true;
            if (skipped)
                continue;
            b++;
            records_read++;
            s->read++;
            struct rec r = {s->epoch, s->s.file_index, s->cursor, (uint32_t)active[turn]};
            /* Into the shuffle buffer; when full, one at random goes on. */
            if (nbuf < buffer) {
                buf[nbuf++] = r;
                continue;
            }
            size_t j = (size_t)(draw() % buffer);
            struct rec outr = buf[j];
            buf[j] = r;
            pass_on(&st, outr);
        }
        if (s->cursor == s->s.end) {
            sl_split_track_read(m.t, s->epoch, &s->s, s->read);
            s->read_done = true;
            active[turn] = active[--nactive];
        } else {
            turn++;
        }
    }

    if (records_read >= stop_at && (nactive > 0 || next_split < m.ns || nbuf > 0 || st.npending > 0)) {
        /* The pipeline ends with records in its buffers and splits half
         * read: the end takes each split as read up to what settled or went
         * out, and what the pipeline drops after it is not counted again. */
        sl_split_track_end(m.t);
        ended = true;
        for (size_t i = 0; i < m.ns; i++) {
            struct msplit *sp = &m.sp[i];
            if (sp->added && !sp->collected) {
                sp->read_done = true;
                sp->read = sp->dropped + sp->out;
            }
        }
        settle(&m, buf, nbuf, SL_SETTLE_DROPPED, runs, true);
        settle(&m, pending, st.npending, SL_SETTLE_DROPPED, runs, true);
    } else {
        /* The input ran out: the buffer drains in a random order, and the
         * last partial batch goes out or is dropped. */
        for (size_t left = nbuf; left > 0; left--) {
            size_t j = (size_t)(draw() % left);
            struct rec r = buf[j];
            buf[j] = buf[left - 1];
            pass_on(&st, r);
        }
        if (st.npending > 0 && drop_remainder)
            settle(&m, pending, st.npending, SL_SETTLE_DROPPED, runs, false);
        else if (st.npending > 0)
            emit(&st);
        st.npending = 0;
    }
    check_done(&m);
    /* The queued batches go out; then every split handed out is done. */
    for (; st.nqueue > 0; st.nqueue--, st.qhead = (st.qhead + 1) % queue_max) {
        send_batch(&m, &queue[st.qhead], runs);
        check_done(&m);
    }
    cr_assert_eq(sl_split_track_size(m.t), 0, "seed %u round %u: %u splits never done", seed, round,
                 sl_split_track_size(m.t));
    uint64_t delivered = 0, dropped = 0;
    for (size_t i = 0; i < m.ns; i++) {
        CHECK(m.sp[i].collected == m.sp[i].added, "seed %u round %u: split %zu never reported done", seed, round, i);
        delivered += m.sp[i].sent;
        dropped += m.sp[i].dropped;
    }
    fprintf(stderr, "    %lu read, %lu delivered, %lu dropped%s; batches in one split %lu, in more %lu\n",
            (unsigned long)records_read, (unsigned long)delivered, (unsigned long)dropped,
            ended ? ", ended early" : "", (unsigned long)m.one_split, (unsigned long)m.several);
    batches_in_one_split += m.one_split;
    batches_in_more += m.several;
    if (!ended)
        cr_assert_eq(delivered + dropped, records_read, "seed %u round %u", seed, round);
    sl_split_track_free(m.t);
    free(m.sp);
    free(m.live);
    free(m.count);
    free(buf);
    free(pending);
    free(runs);
    free(queue);
}

Test(split_track, agrees_with_a_model_at_user_sizes, .timeout = 600)
{
    unsigned seed = test_seed("split_track.agrees_with_a_model_at_user_sizes");
    rng_state = seed;
    /* Rounds 0 and 1 always run a million records through a
     * shuffle(100000), round 2 as behind a range through a shuffle(10000);
     * the rest draw their sizes. */
    for (unsigned round = 0; round < 30; round++) {
        uint64_t max_records = round < 3 ? 1000000 : log_between(1000000);
        size_t buffer = round < 2 ? 100000 : round == 2 ? 10000 : (size_t)log_between(100000);
        one_round(seed, round, max_records, buffer, round == 2);
    }
    cr_assert(batches_in_one_split > 100 && batches_in_more > 1000,
              "seed %u: %lu batches in one split, %lu in more: the draws miss a path", seed,
              (unsigned long)batches_in_one_split, (unsigned long)batches_in_more);
}

/* A run that starts inside the split the run before fell in and goes on
 * into the next split of the file (records read one split after the other,
 * after a gap a filter left) is cut at the split's end, in the tally too. */
Test(split_track, a_run_past_the_split_before_is_cut_at_its_end)
{
    sl_split_track_t *t = sl_split_track_new();
    cr_assert_not_null(t);
    sl_split_t a = {.file_index = 3, .begin = 0, .end = 100, .split_id = 1};
    sl_split_t b = {.file_index = 3, .begin = 100, .end = 200, .split_id = 2};
    cr_assert_eq(sl_split_track_add(t, 0, &a, NULL), 0);
    cr_assert_eq(sl_split_track_add(t, 0, &b, NULL), 0);
    const sl_provenance_run_t runs[] = {{0, 3, 10, 5}, {0, 3, 90, 20}, {0, 3, 150, 3}, {0, 3, 20, 1}};
    sl_split_done_t tally[2];
    cr_assert_eq(sl_split_track_out(t, runs, 4, tally, NULL), 2);
    cr_assert(tally[0].split_id == 1 && tally[0].delivered == 16, "split 1 tallied %lu of 16",
              (unsigned long)tally[0].delivered);
    cr_assert(tally[1].split_id == 2 && tally[1].delivered == 13, "split 2 tallied %lu of 13",
              (unsigned long)tally[1].delivered);
    sl_split_track_free(t);
}

/* Records a task counted out itself (a row a split) count as the walk's
 * do: at the end, a split is read as far as what left the pipeline, and
 * done once that much was sent; a row of a split no longer tracked is
 * ignored. */
Test(split_track, rows_counted_out_count_at_the_end)
{
    sl_split_track_t *t = sl_split_track_new();
    cr_assert_not_null(t);
    sl_split_t a = {.file_index = 2, .begin = 0, .end = 100, .split_id = 1};
    cr_assert_eq(sl_split_track_add(t, 0, &a, NULL), 0);
    sl_split_done_t row = {.split_id = 1, .epoch = 0, .file_index = 2, .begin = 0, .end = 100, .delivered = 30};
    sl_split_track_settle_rows(t, &row, 1, SL_SETTLE_OUT);
    sl_split_track_settle_rows(t, &row, 1, SL_SETTLE_OUT);
    sl_split_done_t gone = {.split_id = 9, .epoch = 0, .file_index = 5, .begin = 0, .end = 10, .delivered = 10};
    sl_split_track_settle_rows(t, &gone, 1, SL_SETTLE_OUT);
    /* The pipeline ends having read 60 of the split's records into batches. */
    sl_split_track_end(t);
    row.delivered = 59;
    sl_split_track_settle_rows(t, &row, 1, SL_SETTLE_SENT);
    cr_assert(!sl_split_track_has_done(t), "done with 59 of the 60 records that left the pipeline sent");
    row.delivered = 1;
    sl_split_track_settle_rows(t, &row, 1, SL_SETTLE_SENT);
    cr_assert(sl_split_track_has_done(t), "not done with all 60 sent");
    sl_split_done_rec_t out[1];
    cr_assert_eq(sl_split_track_collect(t, out, 1), 1);
    cr_assert_eq(out[0].delivered, 60);
    sl_split_track_free(t);
}

/* The least split id and whether one is done, which a send asks after
 * every batch, follow splits that come out of id order (the model above
 * adds them in order) and go as they are collected. */
Test(split_track, the_least_id_follows_splits_out_of_order)
{
    sl_split_track_t *t = sl_split_track_new();
    cr_assert_not_null(t);
    cr_assert_eq(sl_split_track_min_id(t), UINT64_MAX);
    sl_split_t s[3] = {{.file_index = 0, .begin = 0, .end = 10, .split_id = 7},
                       {.file_index = 0, .begin = 10, .end = 20, .split_id = 4},
                       {.file_index = 0, .begin = 20, .end = 30, .split_id = 9}};
    for (int i = 0; i < 3; i++)
        cr_assert_eq(sl_split_track_add(t, 0, &s[i], NULL), 0);
    cr_assert_eq(sl_split_track_min_id(t), 4);
    cr_assert(!sl_split_track_has_done(t));
    /* Split 4 read and sent whole: done, collected, and 7 is the least. */
    sl_split_track_read(t, 0, &s[1], 10);
    cr_assert(!sl_split_track_has_done(t), "split 4 done before its records were sent");
    const sl_provenance_run_t run = {0, 0, 10, 10};
    sl_split_track_settle(t, &run, 1, SL_SETTLE_SENT);
    cr_assert(sl_split_track_has_done(t));
    sl_split_done_rec_t out[3];
    cr_assert_eq(sl_split_track_collect(t, out, 3), 1);
    cr_assert_eq(out[0].split_id, 4);
    cr_assert(!sl_split_track_has_done(t));
    cr_assert_eq(sl_split_track_min_id(t), 7);
    /* Two done, one collected at a time: the other is still done. */
    sl_split_track_read(t, 0, &s[0], 0);
    sl_split_track_read(t, 0, &s[2], 0);
    cr_assert_eq(sl_split_track_collect(t, out, 1), 1);
    cr_assert(sl_split_track_has_done(t), "split %lu left done but not said so", (unsigned long)(16 - out[0].split_id));
    cr_assert_eq(sl_split_track_collect(t, out + 1, 1), 1);
    cr_assert(!sl_split_track_has_done(t));
    cr_assert_eq(sl_split_track_min_id(t), UINT64_MAX);
    sl_split_track_free(t);
}

/* What the walk tallies, run by run and split by split: each run's records
 * from its begin, cut at each split's end, until one falls in no split. */
struct ref_split {
    uint32_t epoch, file;
    uint64_t begin, end, id, count;
};

static void ref_tally(struct ref_split *sp, unsigned ns, const sl_provenance_run_t *runs, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        uint64_t at = runs[i].begin, left = runs[i].count;
        while (left > 0) {
            struct ref_split *hit = NULL;
            for (unsigned j = 0; j < ns && !hit; j++)
                if (sp[j].epoch == runs[i].epoch && sp[j].file == runs[i].file_index && at >= sp[j].begin &&
                    at < sp[j].end)
                    hit = &sp[j];
            if (!hit)
                break;
            uint64_t k = hit->end - at < left ? hit->end - at : left;
            hit->count += k;
            at += k;
            left -= k;
        }
    }
}

/* Makes one of the n runs reach a record past the splits first to last
 * (adjacent, of one epoch and file; the same split for one): it starts
 * before them, or ends past them, or is of another pair at the same
 * records, or ends past 2^64 and wraps around to their first record. */
static void one_past(sl_provenance_run_t *runs, uint64_t n, const struct ref_split *first,
                     const struct ref_split *last)
{
    sl_provenance_run_t *r = &runs[draw() % n];
    unsigned how = (unsigned)(draw() % 4);
    if (how == 0 && first->begin > 0)
        *r = (sl_provenance_run_t){first->epoch, first->file, first->begin - 1, between(1, 2)};
    else if (how == 1 && last->end < UINT64_MAX)
        *r = (sl_provenance_run_t){first->epoch, first->file, last->end - between(0, 1), 2};
    else if (how == 2)
        r->file_index ^= 1;
    else if (last->end - first->begin >= 2)
        *r = (sl_provenance_run_t){first->epoch, first->file, last->end - 1, first->begin - last->end + 2};
}

/* sl_split_track_out() tallies a batch as the walk run by run does,
 * whatever the runs: inside one split (which it tallies from the span
 * alone), with one run a record past either end of it, of another pair or
 * wrapping past 2^64 back into it; across two adjacent splits (which it
 * tallies from a count below the first's end), with a run crossing from
 * one into the other or a run a record past both; of no record, ending at
 * or past 2^64, outside every split, across two splits, of several
 * (epoch, file) pairs.
 * The span it gives is sl_prov_span_scalar()'s. Seeded, like the model
 * above. */
Test(split_track, a_batch_is_tallied_as_the_walk_tallies_it)
{
    unsigned seed = test_seed("split_track.a_batch_is_tallied_as_the_walk_tallies_it");
    rng_state = seed;
    static sl_provenance_run_t runs[2048];
    static sl_split_done_t tally[64];
    struct ref_split sp[32];
    /* Rounds of runs inside one split, and with one record past it; across
     * two adjacent ones, and with one record past them. */
    unsigned inside = 0, edge = 0, across = 0, across_edge = 0;
    for (unsigned round = 0; round < 3000; round++) {
        sl_split_track_t *t = sl_split_track_new();
        cr_assert_not_null(t);
        /* Splits of files 0 and 1 of epochs 0 and 1, from 0 or near 2^64,
         * some with gaps between them. */
        uint64_t base = draw() % 2 ? 0 : UINT64_MAX - between(0, 3000);
        unsigned ns = 0;
        for (uint32_t pair = 0; pair < 4; pair++) {
            uint64_t at = base;
            for (unsigned j = 0; j < 8 && ns < 32; j++) {
                uint64_t len = between(1, 400);
                sl_split_t s = {.file_index = pair & 1, .begin = at, .split_id = ns + 1};
                s.end = at + len < at ? UINT64_MAX : at + len;
                if (s.begin < s.end) {
                    cr_assert_eq(sl_split_track_add(t, pair >> 1, &s, NULL), 0);
                    sp[ns++] = (struct ref_split){pair >> 1, pair & 1, s.begin, s.end, s.split_id, 0};
                }
                at = s.end + (draw() % 3 == 0 ? between(1, 50) : 0);
                if (at < s.end)
                    break;
            }
        }
        uint64_t n = between(1, sizeof runs / sizeof runs[0]);
        unsigned shape = (unsigned)(draw() % 5);
        /* Two adjacent splits (one ends where the next begins), for shapes
         * 3 and 4; without any, shape 0. */
        unsigned adj[32], nadj = 0;
        for (unsigned j = 0; j + 1 < ns; j++)
            if (sp[j].epoch == sp[j + 1].epoch && sp[j].file == sp[j + 1].file && sp[j].end == sp[j + 1].begin)
                adj[nadj++] = j;
        if (shape >= 3 && (nadj == 0 || n < 2))
            shape = 0;
        if (shape >= 3) {
            /* Across the two (shape 3), with one run a record past them
             * (shape 4) as in shape 2. Both are reached; a run may cross
             * from the first into the second. */
            const struct ref_split *a = &sp[adj[draw() % nadj]], *b = a + 1;
            for (uint64_t i = 0; i < n; i++) {
                uint64_t x = between(a->begin, b->end - 1), c = between(1, b->end - x < 3 ? b->end - x : 3);
                runs[i] = (sl_provenance_run_t){a->epoch, a->file, x, c};
            }
            uint64_t i0 = draw() % n, i1 = (i0 + 1 + draw() % (n - 1)) % n;
            runs[i0] = (sl_provenance_run_t){a->epoch, a->file, between(a->begin, a->end - 1), 1};
            runs[i1] = (sl_provenance_run_t){a->epoch, a->file, between(b->begin, b->end - 1), 1};
            if (draw() % 2)
                runs[draw() % n] = (sl_provenance_run_t){a->epoch, a->file, a->end - 1, between(2, 3)};
            if (shape == 4)
                one_past(runs, n, a, b);
            across += shape == 3;
            across_edge += shape == 4;
        } else if (shape > 0 && ns > 0) {
            /* Inside one split (shape 1), or with one run a record past it
             * (shape 2): before its begin or at its end. */
            const struct ref_split *in = &sp[draw() % ns];
            for (uint64_t i = 0; i < n; i++) {
                uint64_t b = between(in->begin, in->end - 1), c = between(1, in->end - b < 3 ? in->end - b : 3);
                runs[i] = (sl_provenance_run_t){in->epoch, in->file, b, c};
            }
            if (shape == 2)
                one_past(runs, n, in, in);
            inside += shape == 1;
            edge += shape == 2;
        } else {
            /* Mostly single records of one pair, near each other. */
            uint32_t pairs = draw() % 4 == 0 ? (uint32_t)between(2, 4) : 1;
            uint64_t near = base + between(0, 1500);
            for (uint64_t i = 0; i < n; i++) {
                uint32_t pair = (uint32_t)(draw() % pairs);
                sl_provenance_run_t *r = &runs[i];
                *r = (sl_provenance_run_t){pair >> 1, pair & 1, near + between(0, 800) - 400, 1};
                unsigned odd = (unsigned)(draw() % 100);
                if (odd < 2)
                    r->count = 0;
                else if (odd < 4)
                    r->count = ~r->begin + between(0, 2); /* ends at 2^64 - 1, 2^64 or past it */
                else if (odd < 10)
                    r->count = between(2, 600);
            }
        }
        sl_prov_span_t got, want;
        memset(&got, 0xa5, sizeof got);
        cr_assert_leq(sl_split_track_size(t), sizeof tally / sizeof tally[0]);
        unsigned nt = sl_split_track_out(t, runs, n, tally, &got);
        sl_prov_span_scalar(runs, n, &want);
        cr_assert(same_span(&got, &want),
                  "seed %u round %u: span {pair %#lx one %d wraps %d empty %d records %lu lo %lu "
                  "hi %lu}, sl_prov_span_scalar() {pair %#lx one %d wraps %d empty %d records %lu lo %lu hi %lu}",
                  seed, round, (unsigned long)got.pair, got.one_pair, got.wraps, got.empty,
                  (unsigned long)got.records, (unsigned long)got.lo, (unsigned long)got.hi,
                  (unsigned long)want.pair, want.one_pair, want.wraps, want.empty, (unsigned long)want.records,
                  (unsigned long)want.lo, (unsigned long)want.hi);
        ref_tally(sp, ns, runs, n);
        unsigned reached = 0;
        for (unsigned j = 0; j < ns; j++)
            reached += sp[j].count > 0;
        cr_assert_eq(nt, reached, "seed %u round %u (shape %u): %u tally rows, the walk reaches %u splits", seed,
                     round, shape, nt, reached);
        for (unsigned i = 0; i < nt; i++) {
            cr_assert(tally[i].split_id >= 1 && tally[i].split_id <= ns, "seed %u round %u: row of split %lu", seed,
                      round, (unsigned long)tally[i].split_id);
            struct ref_split *r = &sp[tally[i].split_id - 1];
            cr_assert_eq(tally[i].delivered, r->count, "seed %u round %u (shape %u): split %lu tallied %lu, the walk %lu",
                         seed, round, shape, (unsigned long)r->id, (unsigned long)tally[i].delivered,
                         (unsigned long)r->count);
            r->count = 0; /* a second row of it would now fail */
        }
        sl_split_track_free(t);
    }
    cr_assert(inside > 500 && edge > 500 && across > 300 && across_edge > 300,
              "seed %u: %u rounds inside one split, %u past it, %u across two, %u past those: the draws are off", seed,
              inside, edge, across, across_edge);
}
