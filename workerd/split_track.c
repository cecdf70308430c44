/*
 * split_track.c: see split_track.h.
 *
 * The entries are an array in the order the splits were handed out, and
 * an index sorts them by (epoch, file, begin), kept sorted as entries come
 * and go: a settle looks each run up there with a binary search, after a
 * look at the entry the previous run hit and at a cache. It runs for every
 * run of every batch (a shuffled batch of 1024 has about 1024), so it must
 * cost a few nanoseconds. A run may span two splits of one file (the
 * sources read them one after the other and batch merges the runs), so it
 * is cut at each split's end. A batch leaving the pipeline whose records
 * all lie in one split (its span's least and greatest do), or in two
 * adjacent ones, skips the walk.
 */
#include "split_track.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "provwire.h"

struct entry {
    sl_split_done_rec_t rec;
    sl_skip_run_t *skips; /* owned */
    uint64_t read;        /* records the source yielded; final once read_done */
    bool read_done;
    uint64_t dropped, out, sent;
    unsigned tally_gen, tally_ix; /* its row in the tally of the batch being counted, if tally_gen is current */
    unsigned moved_to;            /* its index after a collect, UINT_MAX when collected */
};

/* An index row: the sort key of entry e. */
struct key {
    uint64_t hi;    /* epoch << 32 | file_index */
    uint64_t begin;
    unsigned e;
};

/* A cache in front of the binary search: the entry that last held a record
 * of each block of CACHE_BLOCK records, direct-mapped. A shuffled batch's
 * runs fall in the few splits the shuffle buffer spans, so nearly every
 * lookup is one load and a containment check. A shuffle keeps some records
 * long, so a batch's records spread over about 7 times its buffer: 512
 * blocks (16 KB of rows) cover a shuffle(100000)'s batches. Rows are valid
 * while gen matches the table's (every reindex bumps it). */
#define CACHE_BITS 9
#define CACHE_SLOTS (1u << CACHE_BITS)
#define CACHE_BLOCK_BITS 10

struct cache_row {
    uint64_t hi, block;
    unsigned e, gen;
};

struct sl_split_track {
    struct entry *e;
    struct key *idx; /* n rows, sorted by (hi, begin) */
    unsigned n, cap;
    unsigned gen;
    unsigned tally_gen; /* bumped by every sl_split_track_out() that tallies */
    bool ended;
    /* What a send asks after every batch, kept as entries change rather
     * than found by a walk of the table: whether an entry is done (an
     * entry becomes done as it is read, or as its last records are sent or
     * dropped, and stays so until collected), and the least split id.
     * any_done is read and written atomically: sl_split_track_has_done()
     * may be called without the task's mutex. */
    bool any_done;
    uint64_t min_id; /* UINT64_MAX when empty */
    /* The entry the last lookup found, valid while hit_gen matches gen: a
     * plain batch's run and its sending find the split the batch before
     * found. */
    unsigned hit, hit_gen;
    struct cache_row cache[CACHE_SLOTS];
};

static uint64_t key_hi(uint32_t epoch, uint32_t file)
{
    return (uint64_t)epoch << 32 | file;
}

static bool key_less(uint64_t ahi, uint64_t abegin, const struct key *b)
{
    return ahi < b->hi || (ahi == b->hi && abegin < b->begin);
}

/* Puts the last entry's row into the index, which holds the others: a
 * binary search and one move. The order splits are handed out in is not
 * the index's (interleaved files, splits handed out again), so sorting
 * the whole index again would cost n^2 with many splits in flight. */
static void index_last(sl_split_track_t *t)
{
    unsigned i = t->n - 1, lo = 0, hi = i;
    struct key k = {key_hi(t->e[i].rec.epoch, t->e[i].rec.file_index), t->e[i].rec.begin, i};
    while (lo < hi) {
        unsigned mid = lo + (hi - lo) / 2;
        if (key_less(k.hi, k.begin, &t->idx[mid]))
            hi = mid;
        else
            lo = mid + 1;
    }
    memmove(&t->idx[lo + 1], &t->idx[lo], (i - lo) * sizeof *t->idx);
    t->idx[lo] = k;
    t->gen++;
}

sl_split_track_t *sl_split_track_new(void)
{
    sl_split_track_t *t = calloc(1, sizeof(sl_split_track_t));
    if (t)
        t->min_id = UINT64_MAX;
    return t;
}

static bool is_done(const struct entry *e)
{
    return e->read_done && e->dropped + e->sent == e->read;
}

/* Entry e may have become done. */
static inline void note_done(sl_split_track_t *t, const struct entry *e)
{
    if (is_done(e))
        __atomic_store_n(&t->any_done, true, __ATOMIC_RELAXED);
}

void sl_split_track_free(sl_split_track_t *t)
{
    if (!t)
        return;
    for (unsigned i = 0; i < t->n; i++)
        free(t->e[i].skips);
    free(t->e);
    free(t->idx);
    free(t);
}

int sl_split_track_add(sl_split_track_t *t, uint64_t epoch, sl_split_t *s, sl_skip_run_t *skips)
{
    if (t->n == t->cap) {
        unsigned cap = t->cap ? t->cap * 2 : 16;
        struct entry *p = realloc(t->e, cap * sizeof *p);
        if (p)
            t->e = p;
        struct key *k = p ? realloc(t->idx, cap * sizeof *k) : NULL;
        if (!k) {
            free(skips);
            return -ENOMEM;
        }
        t->idx = k;
        t->cap = cap;
    }
    struct entry *e = &t->e[t->n++];
    memset(e, 0, sizeof *e);
    e->rec = (sl_split_done_rec_t){.split_id = s->split_id,
                                   .epoch = (uint32_t)epoch,
                                   .file_index = s->file_index,
                                   .begin = s->begin,
                                   .end = s->end};
    e->skips = skips;
    s->skips = skips;
    if (s->split_id < t->min_id)
        t->min_id = s->split_id;
    index_last(t);
    return 0;
}

static bool is_split(const struct entry *e, uint64_t epoch, const sl_split_t *s)
{
    return !e->read_done && e->rec.split_id == s->split_id && e->rec.epoch == (uint32_t)epoch &&
           e->rec.file_index == s->file_index && e->rec.begin == s->begin && e->rec.end == s->end;
}

static struct entry *find_record(sl_split_track_t *t, uint32_t epoch, uint32_t file, uint64_t rec);

static struct entry *find_id(sl_split_track_t *t, uint64_t epoch, const sl_split_t *s)
{
    /* The index finds it, unless an empty split or one tracked twice. */
    struct entry *e = find_record(t, (uint32_t)epoch, s->file_index, s->begin);
    if (e && is_split(e, epoch, s))
        return e;
    for (unsigned i = 0; i < t->n; i++) {
        if (is_split(&t->e[i], epoch, s))
            return &t->e[i];
    }
    return NULL;
}

void sl_split_track_read(sl_split_track_t *t, uint64_t epoch, const sl_split_t *s, uint64_t records)
{
    struct entry *e = find_id(t, epoch, s);
    if (e) {
        e->read = records;
        e->read_done = true;
        note_done(t, e);
    }
}

/* Whether entry e holds record rec. */
static inline bool holds(const struct entry *e, uint64_t rec)
{
    return rec - e->rec.begin < e->rec.end - e->rec.begin;
}

/* Entry ix is the one a lookup found. */
static inline void remember(sl_split_track_t *t, unsigned ix)
{
    t->hit = ix;
    t->hit_gen = t->gen;
}

/* The entry holding record rec of file of epoch, or NULL. */
static struct entry *find_record(sl_split_track_t *t, uint32_t epoch, uint32_t file, uint64_t rec)
{
    if (t->n == 0)
        return NULL;
    uint64_t hi = key_hi(epoch, file), block = rec >> CACHE_BLOCK_BITS;
    struct entry *e = &t->e[t->hit];
    if (t->hit_gen == t->gen && e->rec.epoch == epoch && e->rec.file_index == file && holds(e, rec))
        return e;
    /* Both halves of the key mixed into the top bits: with hi only added
     * in, the same block of every file of a batch (an interleave behind a
     * shuffle) shared one slot and threw the others out. */
    uint64_t h = block * UINT64_C(0x9e3779b97f4a7c15) ^ hi * UINT64_C(0xc2b2ae3d27d4eb4f);
    struct cache_row *c = &t->cache[h >> (64 - CACHE_BITS)];
    if (c->gen == t->gen && c->hi == hi && c->block == block) {
        e = &t->e[c->e];
        if (holds(e, rec)) {
            remember(t, c->e);
            return e;
        }
    }
    /* The last index row whose key is at most (epoch, file, rec). */
    unsigned lo = 0, n = t->n;
    while (n > 1) {
        unsigned half = n / 2;
        if (!key_less(hi, rec, &t->idx[lo + half]))
            lo += half;
        n -= half;
    }
    const struct key *k = &t->idx[lo];
    if (k->hi != hi || rec < k->begin)
        return NULL;
    e = &t->e[k->e];
    if (rec >= e->rec.end)
        return NULL;
    *c = (struct cache_row){hi, block, k->e, t->gen};
    remember(t, k->e);
    return e;
}

/* Adds k records of a batch to e: to the counter how names and, with
 * tally, to e's row of it (a new row, the first time the batch reaches e). */
static inline void count_into(sl_split_track_t *t, struct entry *e, uint64_t k, enum sl_settle how,
                              sl_split_done_rec_t *tally, unsigned *nt)
{
    switch (how) {
    case SL_SETTLE_DROPPED: e->dropped += k; note_done(t, e); break;
    case SL_SETTLE_OUT: e->out += k; break;
    case SL_SETTLE_SENT: e->sent += k; note_done(t, e); break;
    }
    if (tally) {
        if (e->tally_gen != t->tally_gen) {
            e->tally_gen = t->tally_gen;
            e->tally_ix = (*nt)++;
            tally[e->tally_ix] = e->rec;
            tally[e->tally_ix].delivered = 0;
        }
        tally[e->tally_ix].delivered += k;
    }
}

/* Whether run q, of pair (sl_prov_run_pair()), lies wholly inside the
 * records [from, from + len): it has records, and none past the end. */
static inline bool inside(const sl_provenance_run_t *q, uint64_t pair, uint64_t from, uint64_t len)
{
    uint64_t off = q->begin - from;
    return sl_prov_run_pair(q) == pair && off < len && q->count - 1 < len - off;
}

/* Entry e's (epoch, file) as sl_prov_run_pair() gives a run's. */
static inline uint64_t entry_pair(const struct entry *e)
{
    sl_provenance_run_t r = {e->rec.epoch, e->rec.file_index, 0, 0};
    return sl_prov_run_pair(&r);
}

/* Settles the runs; with tally, also counts their records split by split
 * into it (*nt rows). Inlined into each caller, so that the loop of one
 * without a tally does not test for one. */
static inline __attribute__((always_inline)) void settle(sl_split_track_t *t, const sl_provenance_run_t *runs,
                                                         uint64_t n, enum sl_settle how,
                                                         sl_split_done_rec_t *tally, unsigned *nt)
{
    /* After the end, a pipeline being destroyed drops what it held; the
     * end already counted that. */
    if (t->ended && how == SL_SETTLE_DROPPED)
        return;
    /* Each run is looked up (cut at the end of each split it reaches);
     * then the runs that follow wholly inside the split it ended in are
     * added to that split at once, in a loop of a few instructions a run:
     * behind a shuffle whose window spans a split or two (splits follow
     * the pipeline's rate, so a fast one takes long splits), most runs of
     * a batch do. A batch moving from one split to the next has runs of
     * both mixed: a run that breaks that loop is first tried against the
     * split before last (other), before it is looked up. */
    uint64_t i = 0;
    struct entry *last = NULL, *other = NULL;
    while (i < n) {
        const sl_provenance_run_t *r = &runs[i++];
        uint64_t begin = r->begin, count = r->count;
        if (other && inside(r, entry_pair(other), other->rec.begin, other->rec.end - other->rec.begin)) {
            count_into(t, other, count, how, tally, nt);
            struct entry *e = other;
            other = last;
            last = e;
        } else {
            struct entry *found = NULL;
            while (count > 0) {
                struct entry *e = find_record(t, r->epoch, r->file_index, begin);
                if (!e)
                    break;
                uint64_t k = e->rec.end - begin < count ? e->rec.end - begin : count;
                count_into(t, e, k, how, tally, nt);
                begin += k;
                count -= k;
                found = e;
            }
            if (!found)
                continue;
            if (found != last) {
                other = last;
                last = found;
            }
        }
        uint64_t pair = sl_prov_run_pair(r), from = last->rec.begin, len = last->rec.end - from, held = 0;
        const sl_provenance_run_t *q = &runs[i], *end = &runs[n];
        for (; q < end && inside(q, pair, from, len); q++)
            held += q->count;
        i = (uint64_t)(q - runs);
        if (held)
            count_into(t, last, held, how, tally, nt);
    }
}

void sl_split_track_settle(sl_split_track_t *t, const sl_provenance_run_t *runs, uint64_t n, enum sl_settle how)
{
    settle(t, runs, n, how, NULL, NULL);
}

unsigned sl_split_track_out(sl_split_track_t *t, const sl_provenance_run_t *runs, uint64_t n,
                            sl_split_done_t *tally, sl_prov_span_t *span)
{
    unsigned nt = 0;
    if (tally && ++t->tally_gen == 0)
        ++t->tally_gen; /* 0 is every new entry's */
    if (n == 0)
        return 0;
    sl_prov_span_t own;
    if (!span)
        span = &own;
    sl_prov_span(runs, n, span);
    /* A batch whose records all lie in one split (behind a shuffle whose
     * window is inside a split: most batches) is that split's at once: the
     * span's least and greatest records are both in it, and no run is of
     * another pair, empty or past 2^64. */
    if (span->one_pair && !span->wraps && !span->empty) {
        struct entry *e = find_record(t, runs[0].epoch, runs[0].file_index, span->lo);
        if (e && span->hi < e->rec.end) {
            count_into(t, e, span->records, SL_SETTLE_OUT, tally, &nt);
            return nt;
        }
        /* Or in two splits, the second starting where the first ends (a
         * batch of a shuffle whose window moves from one split to the next:
         * a quarter of them behind shuffle(10000) with splits of 262,144):
         * the first's share is the records below its end, counted in one
         * pass without a lookup a run. Each has records of the batch: the
         * least below the first's end, the greatest from the second's
         * begin. */
        struct entry *f = e ? find_record(t, runs[0].epoch, runs[0].file_index, span->hi) : NULL;
        if (f && f != e && f->rec.begin == e->rec.end) {
            uint64_t in_e = sl_prov_records_below(runs, n, e->rec.end);
            count_into(t, e, in_e, SL_SETTLE_OUT, tally, &nt);
            count_into(t, f, span->records - in_e, SL_SETTLE_OUT, tally, &nt);
            return nt;
        }
    }
    settle(t, runs, n, SL_SETTLE_OUT, tally, &nt);
    return nt;
}

void sl_split_track_settle_rows(sl_split_track_t *t, const sl_split_done_t *rows, unsigned n, enum sl_settle how)
{
    for (unsigned i = 0; i < n; i++) {
        struct entry *e = find_record(t, rows[i].epoch, rows[i].file_index, rows[i].begin);
        if (e && e->rec.begin == rows[i].begin)
            count_into(t, e, rows[i].delivered, how, NULL, NULL);
    }
}

void sl_split_track_end(sl_split_track_t *t)
{
    t->ended = true;
    for (unsigned i = 0; i < t->n; i++) {
        struct entry *e = &t->e[i];
        e->read_done = true;
        e->read = e->dropped + e->out;
        note_done(t, e);
    }
}

bool sl_split_track_has_done(const sl_split_track_t *t)
{
    return __atomic_load_n(&t->any_done, __ATOMIC_RELAXED);
}

unsigned sl_split_track_collect(sl_split_track_t *t, sl_split_done_rec_t *out, unsigned max)
{
    unsigned got = 0, keep = 0;
    bool left_done = false;
    uint64_t min_id = UINT64_MAX;
    for (unsigned i = 0; i < t->n; i++) {
        struct entry *e = &t->e[i];
        bool done = is_done(e);
        if (got < max && done) {
            out[got] = e->rec;
            out[got].delivered = e->sent;
            got++;
            free(e->skips);
            e->moved_to = UINT_MAX;
        } else {
            e->moved_to = keep++;
            left_done |= done;
            if (e->rec.split_id < min_id)
                min_id = e->rec.split_id;
        }
    }
    __atomic_store_n(&t->any_done, left_done, __ATOMIC_RELAXED);
    t->min_id = min_id;
    if (got == 0)
        return 0;
    /* The index keeps its order: drop the collected rows, renumber the rest. */
    unsigned k = 0;
    for (unsigned r = 0; r < t->n; r++) {
        unsigned to = t->e[t->idx[r].e].moved_to;
        if (to != UINT_MAX) {
            t->idx[k] = t->idx[r];
            t->idx[k++].e = to;
        }
    }
    for (unsigned i = 0; i < t->n; i++)
        if (t->e[i].moved_to != UINT_MAX)
            t->e[t->e[i].moved_to] = t->e[i];
    t->n = keep;
    t->gen++;
    return got;
}

unsigned sl_split_track_size(const sl_split_track_t *t)
{
    return t->n;
}

uint64_t sl_split_track_min_id(const sl_split_track_t *t)
{
    return t->min_id;
}
