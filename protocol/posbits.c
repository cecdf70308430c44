/* posbits.c: see posbits.h. */
#include "posbits.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "le.h"

_Static_assert(SL_POSBITS_BLOCK == SL_POSSET_BITMAP_SPAN, "a block is a version 3 bitmap");

#define COMPACT_MIN 4096 /* runs below which an add does not look for crowded blocks */
#define LAST_NO ((UINT64_MAX >> SL_POSBITS_BLOCK_BITS) - 1) /* the last block whose end is below 2^64 */

void sl_posbits_init(sl_posbits_t *b, size_t max_units)
{
    *b = (sl_posbits_t){.max_units = max_units, .compact_at = COMPACT_MIN};
    sl_posset_init(&b->runs, max_units);
}

void sl_posbits_clear(sl_posbits_t *b)
{
    sl_posset_clear(&b->runs);
    free(b->blocks);
    free(b->scratch);
    free(b->inside);
    size_t max = b->max_units;
    sl_posbits_init(b, max);
}

size_t sl_posbits_units(const sl_posbits_t *b)
{
    return b->runs.num + b->nblocks * SL_POSBITS_BLOCK_UNITS;
}

/* -1, 0, 1 as block (e1, f1, n1) is before, the same as or after (e2, f2, n2). */
static int cmp_no(uint32_t e1, uint32_t f1, uint64_t n1, uint32_t e2, uint32_t f2, uint64_t n2)
{
    if (e1 != e2)
        return e1 < e2 ? -1 : 1;
    if (f1 != f2)
        return f1 < f2 ? -1 : 1;
    return n1 < n2 ? -1 : n1 > n2;
}

/* The first block at (e, f, no) or after it. */
static size_t block_at(const sl_posbits_t *b, uint32_t e, uint32_t f, uint64_t no)
{
    size_t lo = 0, hi = b->nblocks;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const sl_posblock_t *k = &b->blocks[mid];
        if (cmp_no(k->epoch, k->file, k->no, e, f, no) >= 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

static bool is_block(const sl_posbits_t *b, size_t i, uint32_t e, uint32_t f, uint64_t no)
{
    return i < b->nblocks && b->blocks[i].epoch == e && b->blocks[i].file == f && b->blocks[i].no == no;
}

/* Sets (or, with on false, clears) bits [lo, hi) of w. */
static void put_bits(uint64_t *w, uint64_t lo, uint64_t hi, bool on)
{
    while (lo < hi) {
        uint64_t off = lo & 63, nb = 64 - off < hi - lo ? 64 - off : hi - lo;
        uint64_t m = (nb == 64 ? ~(uint64_t)0 : (((uint64_t)1 << nb) - 1)) << off;
        w[lo >> 6] = on ? w[lo >> 6] | m : w[lo >> 6] & ~m;
        lo += nb;
    }
}

static uint64_t count_bits(const uint64_t *w, uint64_t lo, uint64_t hi)
{
    uint64_t n = 0;
    while (lo < hi) {
        uint64_t off = lo & 63, nb = 64 - off < hi - lo ? 64 - off : hi - lo;
        uint64_t m = (nb == 64 ? ~(uint64_t)0 : (((uint64_t)1 << nb) - 1)) << off;
        n += (uint64_t)__builtin_popcountll(w[lo >> 6] & m);
        lo += nb;
    }
    return n;
}

static bool block_full(const sl_posblock_t *k)
{
    for (unsigned i = 0; i < SL_POSBITS_WORDS; i++)
        if (k->w[i] != ~(uint64_t)0)
            return false;
    return true;
}

static bool block_empty(const sl_posblock_t *k)
{
    for (unsigned i = 0; i < SL_POSBITS_WORDS; i++)
        if (k->w[i] != 0)
            return false;
    return true;
}

size_t sl_posbits_block_runs(const sl_posblock_t *blk)
{
    size_t n = 0;
    uint64_t carry = 0; /* the bit before word i's first */
    for (unsigned i = 0; i < SL_POSBITS_WORDS; i++) {
        uint64_t x = blk->w[i];
        n += (size_t)__builtin_popcountll(x & ~(x << 1 | carry));
        carry = x >> 63;
    }
    return n;
}

static int room(sl_posrun_t **p, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t ncap = *cap * 2 > need ? *cap * 2 : need;
    if (ncap < 64)
        ncap = 64;
    if (ncap > SIZE_MAX / sizeof **p)
        return -ENOMEM;
    sl_posrun_t *q = realloc(*p, ncap * sizeof *q);
    if (!q)
        return -ENOMEM;
    *p = q;
    *cap = ncap;
    return 0;
}

/* Appends r to out[0..*n), joined to the last run when it touches it. */
static void append(sl_posrun_t *out, size_t *n, const sl_posrun_t *r)
{
    if (*n > 0) {
        sl_posrun_t *last = &out[*n - 1];
        if (last->epoch == r->epoch && last->file == r->file && r->begin <= last->begin + last->count) {
            if (r->begin + r->count > last->begin + last->count)
                last->count = r->begin + r->count - last->begin;
            return;
        }
    }
    out[(*n)++] = *r;
}

/* Where block_runs() appends. */
struct runs_out {
    sl_posrun_t *out;
    size_t *n;
    const sl_posblock_t *k;
};

static int runs_out_run(void *ctx, uint64_t off, uint64_t count)
{
    struct runs_out *o = ctx;
    sl_posrun_t r = {o->k->epoch, o->k->file, (o->k->no << SL_POSBITS_BLOCK_BITS) + off, count};
    append(o->out, o->n, &r);
    return 0;
}

/* A block's runs of set bits, appended to out (room for sl_posbits_block_runs() more). */
static void block_runs(const sl_posblock_t *k, sl_posrun_t *out, size_t *n)
{
    struct runs_out o = {out, n, k};
    sl_bitmap_runs(k->w, runs_out_run, &o);
}

/* Inserts blocks add[0..m) (sorted, none of them in b) among b's. */
static int insert_blocks(sl_posbits_t *b, const sl_posblock_t *add, size_t m)
{
    if (m == 0)
        return 0;
    size_t total = b->nblocks + m;
    if (total > b->cap) {
        size_t ncap = b->cap * 2 > total ? b->cap * 2 : total;
        sl_posblock_t *p = realloc(b->blocks, ncap * sizeof *p);
        if (!p)
            return -ENOMEM;
        b->blocks = p;
        b->cap = ncap;
    }
    /* Merge from the back. */
    size_t i = b->nblocks, j = m, k = total;
    while (j > 0) {
        const sl_posblock_t *x = i > 0 ? &b->blocks[i - 1] : NULL, *y = &add[j - 1];
        if (x && cmp_no(x->epoch, x->file, x->no, y->epoch, y->file, y->no) > 0)
            b->blocks[--k] = b->blocks[--i];
        else
            b->blocks[--k] = add[--j];
    }
    b->nblocks = total;
    return 0;
}

/* Appends block (e, f, no) to *dense (of *nd, room *dcap), with its bits clear. */
static int add_dense(sl_posblock_t **dense, size_t *nd, size_t *dcap, uint32_t e, uint32_t f, uint64_t no)
{
    if (no > LAST_NO)
        return 0; /* its end is not a position: left as runs */
    if (*nd == *dcap) {
        size_t ncap = *dcap ? *dcap * 2 : 16;
        sl_posblock_t *p = realloc(*dense, ncap * sizeof *p);
        if (!p)
            return -ENOMEM;
        *dense = p;
        *dcap = ncap;
    }
    (*dense)[(*nd)++] = (sl_posblock_t){.epoch = e, .file = f, .no = no};
    return 0;
}

/* The block ranges that SL_POSBITS_DENSE runs or more reach into, in
 * order, their bits clear. A run reaches the block of its first position
 * and that of its last; the blocks between, it fills (one run each: never
 * crowded). Those of run i + 1 are never before those of run i, so one
 * counter follows them. */
static int crowded(const sl_posset_t *s, sl_posblock_t **dense, size_t *nd)
{
    size_t dcap = 0, cnt = 0;
    uint32_t ce = 0, cf = 0;
    uint64_t cno = 0;
    *dense = NULL;
    *nd = 0;
    for (size_t i = 0; i < s->num; i++) {
        const sl_posrun_t *r = &s->runs[i];
        uint64_t first = r->begin >> SL_POSBITS_BLOCK_BITS, last = (r->begin + r->count - 1) >> SL_POSBITS_BLOCK_BITS;
        for (unsigned q = 0; q < (last != first ? 2u : 1u); q++) {
            uint64_t no = q ? last : first;
            if (cnt > 0 && ce == r->epoch && cf == r->file && cno == no) {
                cnt++;
                continue;
            }
            if (cnt >= SL_POSBITS_DENSE && add_dense(dense, nd, &dcap, ce, cf, cno) < 0)
                return -ENOMEM;
            ce = r->epoch;
            cf = r->file;
            cno = no;
            cnt = 1;
        }
    }
    if (cnt >= SL_POSBITS_DENSE && add_dense(dense, nd, &dcap, ce, cf, cno) < 0)
        return -ENOMEM;
    return 0;
}

/* The next piece of x (taken off its front) that lies wholly in one block
 * of blocks[0..n) (*in: its index) or wholly outside them (*in: n). */
static sl_posrun_t next_piece(const sl_posblock_t *blocks, size_t n, size_t *d, sl_posrun_t *x, size_t *in)
{
    uint64_t no = x->begin >> SL_POSBITS_BLOCK_BITS, end = x->begin + x->count;
    while (*d < n && cmp_no(blocks[*d].epoch, blocks[*d].file, blocks[*d].no, x->epoch, x->file, no) < 0)
        ++*d;
    uint64_t hi = end;
    *in = n;
    if (*d < n && blocks[*d].epoch == x->epoch && blocks[*d].file == x->file) {
        uint64_t at = blocks[*d].no << SL_POSBITS_BLOCK_BITS;
        if (blocks[*d].no == no) {
            *in = *d;
            if (end - at > SL_POSBITS_BLOCK)
                hi = at + SL_POSBITS_BLOCK;
        } else if (at < hi) {
            hi = at;
        }
    }
    sl_posrun_t piece = {x->epoch, x->file, x->begin, hi - x->begin};
    x->count = end - hi;
    x->begin = hi;
    return piece;
}

/* Sets a piece's bits in its block. */
static void set_piece(sl_posblock_t *blk, const sl_posrun_t *piece)
{
    uint64_t base = blk->no << SL_POSBITS_BLOCK_BITS;
    put_bits(blk->w, piece->begin - base, piece->begin + piece->count - base, true);
}

/* Moves the runs that crowd a block's range into a bitmap, and full
 * blocks back into runs. Changes nothing when memory runs out. */
static void compact(sl_posbits_t *b)
{
    sl_posblock_t *dense = NULL;
    size_t nd = 0;
    if (crowded(&b->runs, &dense, &nd) < 0) {
        free(dense);
        return;
    }
    if (nd > 0) {
        /* The runs outside those ranges stay, the rest are bits; a run
         * leaves a piece before each range it crosses and one after. */
        size_t n = b->runs.num, cap = n + nd + 1, nk = 0, d = 0;
        sl_posrun_t *keep = malloc(cap * sizeof *keep);
        if (!keep) {
            free(dense);
            return;
        }
        for (size_t i = 0; i < n; i++) {
            sl_posrun_t x = b->runs.runs[i];
            while (x.count > 0) {
                size_t in;
                sl_posrun_t piece = next_piece(dense, nd, &d, &x, &in);
                if (in < nd)
                    set_piece(&dense[in], &piece);
                else
                    keep[nk++] = piece;
            }
        }
        if (insert_blocks(b, dense, nd) < 0) {
            free(keep);
            free(dense);
            return;
        }
        free(b->runs.runs);
        b->runs.runs = keep;
        b->runs.num = nk;
        b->runs.cap = cap;
    }
    free(dense);
    /* Full blocks: one run each is less. */
    size_t full = 0;
    for (size_t i = 0; i < b->nblocks; i++)
        full += block_full(&b->blocks[i]);
    if (full > 0 && room(&b->scratch, &b->scratch_cap, full) == 0) {
        size_t m = 0;
        for (size_t i = 0; i < b->nblocks; i++)
            if (block_full(&b->blocks[i]))
                b->scratch[m++] = (sl_posrun_t){b->blocks[i].epoch, b->blocks[i].file,
                                                b->blocks[i].no << SL_POSBITS_BLOCK_BITS, SL_POSBITS_BLOCK};
        b->runs.max_runs = b->max_units - (b->nblocks - m) * SL_POSBITS_BLOCK_UNITS;
        if (sl_posset_add_many(&b->runs, b->scratch, m) == 0) {
            size_t k = 0;
            for (size_t i = 0; i < b->nblocks; i++)
                if (!block_full(&b->blocks[i]))
                    b->blocks[k++] = b->blocks[i];
            b->nblocks = k;
        }
    }
}

/* The runs' bound: what the blocks leave of max_units. */
static void bound_runs(sl_posbits_t *b)
{
    size_t used = b->nblocks * SL_POSBITS_BLOCK_UNITS;
    b->runs.max_runs = used < b->max_units ? b->max_units - used : 0;
}

/* The blocks an add looked up lately, by block number: a shuffled batch's
 * records fall in the few blocks of its workers' buffers. */
#define RECENT 64
struct recent {
    uint64_t no[RECENT];
    uint32_t epoch[RECENT], file[RECENT];
    size_t at[RECENT]; /* block_at()'s answer + 1; 0: none */
};

/* block_at(), remembered in r (valid while no block is added or removed). */
static size_t find(const sl_posbits_t *b, struct recent *r, uint32_t e, uint32_t f, uint64_t no)
{
    unsigned k = (unsigned)(no % RECENT);
    if (r->at[k] && r->no[k] == no && r->epoch[k] == e && r->file[k] == f)
        return r->at[k] - 1;
    size_t i = block_at(b, e, f, no);
    r->no[k] = no;
    r->epoch[k] = e;
    r->file[k] = f;
    r->at[k] = i + 1;
    return i;
}

/* A part of a run inside block blk: its bits [lo, hi) there. */
struct sl_posbits_piece {
    size_t blk;
    uint64_t lo, hi;
};

/* add_many() once: the runs' parts outside blocks go into the runs (which
 * may fail, changing nothing), then those inside are set as bits. */
static int add_once(sl_posbits_t *b, const void *runs, size_t n)
{
    bound_runs(b);
    if (b->nblocks == 0)
        return sl_posset_add_many(&b->runs, runs, n);
    struct recent r;
    memset(r.at, 0, sizeof r.at);
    size_t out = 0, in = 0;
    for (size_t i = 0; i < n; i++) {
        sl_posrun_t x;
        memcpy(&x, (const uint8_t *)runs + i * sizeof x, sizeof x);
        if (x.begin + x.count < x.begin)
            return -EOVERFLOW;
        while (x.count > 0) {
            size_t d = find(b, &r, x.epoch, x.file, x.begin >> SL_POSBITS_BLOCK_BITS), blk;
            sl_posrun_t piece = next_piece(b->blocks, b->nblocks, &d, &x, &blk);
            if (blk == b->nblocks) {
                if (out == b->scratch_cap && room(&b->scratch, &b->scratch_cap, out + 1 > n ? out + 1 : n) < 0)
                    return -ENOMEM;
                b->scratch[out++] = piece;
                continue;
            }
            if (in == b->inside_cap) {
                size_t ncap = b->inside_cap ? b->inside_cap * 2 : (n > 64 ? n : 64);
                struct sl_posbits_piece *p = realloc(b->inside, ncap * sizeof *p);
                if (!p)
                    return -ENOMEM;
                b->inside = p;
                b->inside_cap = ncap;
            }
            uint64_t base = b->blocks[blk].no << SL_POSBITS_BLOCK_BITS;
            b->inside[in++] = (struct sl_posbits_piece){blk, piece.begin - base, piece.begin + piece.count - base};
        }
    }
    int rc = out > 0 ? sl_posset_add_many(&b->runs, b->scratch, out) : 0;
    if (rc < 0)
        return rc;
    for (size_t k = 0; k < in; k++) {
        const struct sl_posbits_piece *q = &b->inside[k];
        if (q->hi - q->lo == 1)
            b->blocks[q->blk].w[q->lo >> 6] |= (uint64_t)1 << (q->lo & 63);
        else
            put_bits(b->blocks[q->blk].w, q->lo, q->hi, true);
    }
    return 0;
}

int sl_posbits_add_many(sl_posbits_t *b, const void *runs, size_t n)
{
    int rc = add_once(b, runs, n);
    if (rc == -ENOSPC) {
        /* Crowded runs may fit as bitmaps. */
        size_t before = sl_posbits_units(b);
        compact(b);
        if (sl_posbits_units(b) < before)
            rc = add_once(b, runs, n);
    }
    if (rc == 0 && b->runs.num >= b->compact_at) {
        compact(b);
        b->compact_at = b->runs.num * 2 > COMPACT_MIN ? b->runs.num * 2 : COMPACT_MIN;
    }
    return rc;
}

int sl_posbits_add_block(sl_posbits_t *b, uint32_t epoch, uint32_t file, uint64_t no,
                         const uint64_t w[SL_POSBITS_WORDS])
{
    if (no > LAST_NO)
        return -EOVERFLOW;
    sl_posblock_t blk = {.epoch = epoch, .file = file, .no = no};
    memcpy(blk.w, w, sizeof blk.w);
    if (block_empty(&blk))
        return 0;
    size_t k = block_at(b, epoch, file, no);
    if (is_block(b, k, epoch, file, no)) {
        for (unsigned i = 0; i < SL_POSBITS_WORDS; i++)
            b->blocks[k].w[i] |= w[i];
        return 0;
    }
    uint64_t base = no << SL_POSBITS_BLOCK_BITS;
    if (sl_posset_count(&b->runs, epoch, file, base, base + SL_POSBITS_BLOCK) == 0 && !block_full(&blk) &&
        sl_posbits_units(b) + SL_POSBITS_BLOCK_UNITS <= b->max_units) {
        int rc = insert_blocks(b, &blk, 1);
        bound_runs(b);
        return rc;
    }
    /* Runs reach into its range (or it is full): as runs, which crowding turns back into a block. */
    if (room(&b->scratch, &b->scratch_cap, sl_posbits_block_runs(&blk)) < 0)
        return -ENOMEM;
    size_t m = 0;
    block_runs(&blk, b->scratch, &m);
    /* add_many() uses scratch too: the runs go from a copy. */
    sl_posrun_t *copy = malloc(m * sizeof *copy);
    if (!copy)
        return -ENOMEM;
    memcpy(copy, b->scratch, m * sizeof *copy);
    int rc = sl_posbits_add_many(b, copy, m);
    free(copy);
    return rc;
}

int sl_posbits_add_set(sl_posbits_t *b, const sl_posbits_t *src, uint64_t from)
{
    /* Sorted by epoch first: those of earlier epochs lead. */
    size_t first = 0;
    while (first < src->runs.num && src->runs.runs[first].epoch < from)
        first++;
    int rc = src->runs.num > first ? sl_posbits_add_many(b, src->runs.runs + first, src->runs.num - first) : 0;
    for (size_t k = 0; k < src->nblocks && rc == 0; k++)
        if (src->blocks[k].epoch >= from)
            rc = sl_posbits_add_block(b, src->blocks[k].epoch, src->blocks[k].file, src->blocks[k].no,
                                      src->blocks[k].w);
    return rc;
}

/* Gives back what an array p of *cap elements of size bytes, num of them
 * used, no longer needs after a drop (keeping room for least). @return it */
static void *shrink(void *p, size_t *cap, size_t num, size_t size, size_t least)
{
    if (*cap > 4 * least && num < *cap / 4) {
        size_t ncap = num * 2 > least ? num * 2 : least;
        void *q = realloc(p, ncap * size);
        if (q) {
            *cap = ncap;
            return q;
        }
    }
    return p;
}

void sl_posbits_drop_before(sl_posbits_t *b, uint32_t epoch, uint32_t file, uint64_t pos)
{
    sl_posset_drop_before(&b->runs, epoch, file, pos);
    b->runs.runs = shrink(b->runs.runs, &b->runs.cap, b->runs.num, sizeof *b->runs.runs, 16);
    /* The blocks before the place's go; its own keeps what lies from pos on. */
    uint64_t no = pos >> SL_POSBITS_BLOCK_BITS;
    size_t k = block_at(b, epoch, file, no);
    if (is_block(b, k, epoch, file, no)) {
        put_bits(b->blocks[k].w, 0, pos - (no << SL_POSBITS_BLOCK_BITS), false);
        k += block_empty(&b->blocks[k]);
    }
    if (k > 0) {
        memmove(b->blocks, b->blocks + k, (b->nblocks - k) * sizeof *b->blocks);
        b->nblocks -= k;
    }
    b->blocks = shrink(b->blocks, &b->cap, b->nblocks, sizeof *b->blocks, 4);
    bound_runs(b);
}

/* Whether block k is one of (e, f) that starts before position upto: with
 * k from block_at() of a range's begin, the blocks that reach into it. */
static bool block_before(const sl_posbits_t *b, size_t k, uint32_t e, uint32_t f, uint64_t upto)
{
    return k < b->nblocks && b->blocks[k].epoch == e && b->blocks[k].file == f &&
           (b->blocks[k].no << SL_POSBITS_BLOCK_BITS) < upto;
}

/* Block k's bits [*lo, *hi) that lie in [begin, end). */
static void block_cut(const sl_posbits_t *b, size_t k, uint64_t begin, uint64_t end, uint64_t *lo, uint64_t *hi)
{
    uint64_t base = b->blocks[k].no << SL_POSBITS_BLOCK_BITS;
    *lo = begin > base ? begin - base : 0;
    *hi = end - base < SL_POSBITS_BLOCK ? end - base : SL_POSBITS_BLOCK;
}

/* fn(ctx, runs, n) for the runs of s inside [begin, end) of (e, f), clipped
 * to it, in order, up to 64 at a time. */
static int each_run_within(const sl_posset_t *s, uint32_t e, uint32_t f, uint64_t begin, uint64_t end,
                           int (*fn)(void *ctx, const sl_posrun_t *runs, size_t n), void *ctx)
{
    sl_posrun_t chunk[64];
    for (uint64_t at = begin; at < end;) {
        size_t got = sl_posset_within(s, e, f, at, end, chunk, 64);
        size_t use = got < 64 ? got : 64;
        int rc = use > 0 ? fn(ctx, chunk, use) : 0;
        if (rc < 0 || got <= 64)
            return rc;
        at = chunk[63].begin + chunk[63].count;
    }
    return 0;
}

uint64_t sl_posbits_count(const sl_posbits_t *b, uint32_t epoch, uint32_t file, uint64_t begin, uint64_t end)
{
    if (end <= begin)
        return 0;
    uint64_t n = sl_posset_count(&b->runs, epoch, file, begin, end), lo, hi;
    for (size_t k = block_at(b, epoch, file, begin >> SL_POSBITS_BLOCK_BITS); block_before(b, k, epoch, file, end);
         k++) {
        block_cut(b, k, begin, end, &lo, &hi);
        n += count_bits(b->blocks[k].w, lo, hi);
    }
    return n;
}

static int add_runs(void *ctx, const sl_posrun_t *runs, size_t n)
{
    return sl_posbits_add_many(ctx, runs, n);
}

int sl_posbits_add_within(sl_posbits_t *b, const sl_posbits_t *src, uint32_t epoch, uint32_t file, uint64_t begin,
                          uint64_t end)
{
    if (end <= begin)
        return 0;
    /* The runs, then the blocks, each cut to the range. */
    int rc = each_run_within(&src->runs, epoch, file, begin, end, add_runs, b);
    for (size_t k = block_at(src, epoch, file, begin >> SL_POSBITS_BLOCK_BITS);
         rc == 0 && block_before(src, k, epoch, file, end); k++) {
        uint64_t lo, hi, w[SL_POSBITS_WORDS];
        block_cut(src, k, begin, end, &lo, &hi);
        memcpy(w, src->blocks[k].w, sizeof w);
        put_bits(w, 0, lo, false);
        put_bits(w, hi, SL_POSBITS_BLOCK, false);
        rc = sl_posbits_add_block(b, epoch, file, src->blocks[k].no, w);
    }
    return rc;
}

/* Runs given in order, coalesced where they touch, counted past max. */
struct within_out {
    sl_posrun_t *out;
    size_t max, n;
    sl_posrun_t last;
};

static void within_put(struct within_out *o, sl_posrun_t r)
{
    if (o->n > 0 && r.begin == o->last.begin + o->last.count) {
        o->last.count += r.count;
    } else {
        o->last = r;
        o->n++;
    }
    if (o->n <= o->max)
        o->out[o->n - 1] = o->last;
}

struct within_block {
    struct within_out *o;
    const sl_posblock_t *k;
    uint64_t lo, hi; /* the block's offsets inside the range */
};

static int within_block_run(void *ctx, uint64_t off, uint64_t count)
{
    struct within_block *x = ctx;
    uint64_t b = off > x->lo ? off : x->lo, e = off + count < x->hi ? off + count : x->hi;
    if (b < e)
        within_put(x->o, (sl_posrun_t){x->k->epoch, x->k->file, (x->k->no << SL_POSBITS_BLOCK_BITS) + b, e - b});
    return 0;
}

/* sl_posbits_within() under way: the blocks from k on are not given yet. */
struct within {
    struct within_out o;
    const sl_posbits_t *b;
    uint32_t epoch, file;
    uint64_t begin, end;
    size_t k;
};

/* Gives the runs of the blocks that start before upto (no run reaches into
 * a block, so they all come before a run that begins at upto). */
static void within_blocks(struct within *w, uint64_t upto)
{
    for (; block_before(w->b, w->k, w->epoch, w->file, upto); w->k++) {
        struct within_block x = {&w->o, &w->b->blocks[w->k], 0, 0};
        block_cut(w->b, w->k, w->begin, w->end, &x.lo, &x.hi);
        sl_bitmap_runs(x.k->w, within_block_run, &x);
    }
}

static int within_runs(void *ctx, const sl_posrun_t *runs, size_t n)
{
    struct within *w = ctx;
    for (size_t i = 0; i < n; i++) {
        within_blocks(w, runs[i].begin);
        within_put(&w->o, runs[i]);
    }
    return 0;
}

size_t sl_posbits_within(const sl_posbits_t *b, uint32_t epoch, uint32_t file, uint64_t begin, uint64_t end,
                         sl_posrun_t *out, size_t max)
{
    if (end <= begin)
        return 0;
    struct within w = {{out, max, 0, {0}}, b, epoch, file, begin, end,
                       block_at(b, epoch, file, begin >> SL_POSBITS_BLOCK_BITS)};
    each_run_within(&b->runs, epoch, file, begin, end, within_runs, &w);
    within_blocks(&w, end);
    return w.o.n;
}

uint64_t sl_posbits_covered_to(const sl_posbits_t *b, uint32_t epoch, uint32_t file, uint64_t pos)
{
    for (;;) {
        uint64_t to = sl_posset_covered_to(&b->runs, epoch, file, pos);
        if (to > pos) {
            pos = to;
            continue;
        }
        uint64_t no = pos >> SL_POSBITS_BLOCK_BITS;
        size_t k = block_at(b, epoch, file, no);
        if (!is_block(b, k, epoch, file, no))
            return pos;
        /* The block's first clear bit at pos or after. */
        uint64_t off = pos & (SL_POSBITS_BLOCK - 1), clear = SL_POSBITS_BLOCK;
        for (uint64_t i = off >> 6; i < SL_POSBITS_WORDS; i++) {
            uint64_t x = ~b->blocks[k].w[i] & (i == off >> 6 ? ~(uint64_t)0 << (off & 63) : ~(uint64_t)0);
            if (x) {
                clear = i * 64 + (uint64_t)__builtin_ctzll(x);
                break;
            }
        }
        if (clear == off)
            return pos;
        if (clear == SL_POSBITS_BLOCK && no == UINT64_MAX >> SL_POSBITS_BLOCK_BITS)
            return UINT64_MAX; /* the last block of the file's positions */
        pos = (no << SL_POSBITS_BLOCK_BITS) + clear;
    }
}

uint64_t sl_posbits_size(const sl_posbits_t *b)
{
    uint64_t n = sl_posset_size(&b->runs);
    for (size_t k = 0; k < b->nblocks; k++)
        n += count_bits(b->blocks[k].w, 0, SL_POSBITS_BLOCK);
    return n;
}

int sl_posbits_runs(const sl_posbits_t *b, size_t keep_runs, sl_posrun_t **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    size_t need = b->runs.num;
    for (size_t k = 0; k < b->nblocks; k++) {
        size_t br = sl_posbits_block_runs(&b->blocks[k]);
        if (keep_runs == 0 || br < keep_runs)
            need += br;
    }
    if (need == 0)
        return 0;
    sl_posrun_t *o = malloc(need * sizeof *o);
    if (!o)
        return -ENOMEM;
    /* The runs and the blocks in the order of places (apart: no run
     * reaches into a block), joined where they touch. */
    size_t m = 0, i = 0, k = 0;
    const sl_posset_t *s = &b->runs;
    while (i < s->num || k < b->nblocks) {
        bool run_first = k == b->nblocks ||
                         (i < s->num && cmp_no(s->runs[i].epoch, s->runs[i].file, s->runs[i].begin, b->blocks[k].epoch,
                                               b->blocks[k].file, b->blocks[k].no << SL_POSBITS_BLOCK_BITS) < 0);
        if (run_first) {
            append(o, &m, &s->runs[i++]);
        } else {
            if (keep_runs == 0 || sl_posbits_block_runs(&b->blocks[k]) < keep_runs)
                block_runs(&b->blocks[k], o, &m);
            k++;
        }
    }
    *out = o;
    *n = m;
    return 0;
}

size_t sl_posbits_bitmaps(const sl_posbits_t *b, size_t keep_runs, sl_posset_bitmap_t *out)
{
    size_t nb = 0;
    for (size_t k = 0; k < b->nblocks; k++) {
        const sl_posblock_t *x = &b->blocks[k];
        if (sl_posbits_block_runs(x) < keep_runs)
            continue;
        if (out)
            out[nb] = (sl_posset_bitmap_t){x->epoch, x->file, x->no, x->w};
        nb++;
    }
    return nb;
}

int sl_posbits_encode(const sl_posbits_t *b, size_t keep_runs, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    sl_posrun_t *runs = NULL;
    size_t n = 0, nb = 0;
    if (keep_runs == 0)
        keep_runs = 1; /* every block (none is empty) */
    int rc = sl_posbits_runs(b, keep_runs, &runs, &n);
    sl_posset_bitmap_t *bm = rc == 0 && b->nblocks > 0 ? malloc(b->nblocks * sizeof *bm) : NULL;
    if (rc == 0 && b->nblocks > 0 && !bm)
        rc = -ENOMEM;
    if (rc == 0)
        nb = sl_posbits_bitmaps(b, keep_runs, bm);
    if (rc == 0) {
        *len = sl_posset_encode_v3(runs, n, bm, nb, NULL, 0);
        if ((*out = malloc(*len)) != NULL)
            sl_posset_encode_v3(runs, n, bm, nb, *out, *len);
        else
            rc = -ENOMEM;
    }
    free(bm);
    free(runs);
    return rc;
}

int sl_posbits_bytes(const sl_posbits_t *b, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    sl_posset_t runs;
    sl_posset_init(&runs, b->max_units);
    int rc = sl_posbits_to_posset(b, 0, &runs);
    if (rc == 0) {
        *len = sl_posset_encode(&runs, NULL, 0);
        if ((*out = malloc(*len)) != NULL)
            sl_posset_encode(&runs, *out, *len);
        else
            rc = -ENOMEM;
    } else if (rc == -ENOSPC) {
        rc = sl_posbits_encode(b, SL_POSBITS_WIRE_RUNS, out, len);
    }
    sl_posset_clear(&runs);
    return rc;
}

/* A decode's chunk of runs: when it does not fit as a whole, its halves
 * one after the other, so that the set makes bitmaps of crowded runs as
 * they come (an add makes them of what it holds before the add). */
static int add_chunk(void *ctx, const sl_posrun_t *runs, size_t n)
{
    int rc = sl_posbits_add_many(ctx, runs, n);
    if (rc == -ENOSPC && n > 1) {
        rc = add_chunk(ctx, runs, n / 2);
        if (rc == 0)
            rc = add_chunk(ctx, runs + n / 2, n - n / 2);
    }
    return rc;
}

static int decode(sl_posbits_t *b, const uint8_t *buf, size_t len, const sl_posrun_t *ranges, size_t nranges,
                  char *err, size_t errlen)
{
    int rc = sl_posset_read_within(buf, len, ranges, nranges, add_chunk, b, err, errlen);
    uint32_t version = len >= 16 ? sl_get_le32(buf + 4) : 0;
    if (rc == -ENOSPC && version != 3 && !ranges) /* runs alone take no more units than they are */
        return sl_errf(err, errlen, rc, "position set of %llu runs, more than the limit %zu (in units: a run 1, 22 "
                       "a bitmap of 4096 positions where runs crowd)", (unsigned long long)sl_get_le64(buf + 8),
                       b->max_units);
    if (rc == -ENOSPC)
        return sl_errf(err, errlen, rc, "position set of more than %zu units%s, the limit (a unit a run, 22 a bitmap "
                       "of 4096 positions)", b->max_units, ranges ? " within the ranges asked for" : "");
    if (rc == -EOVERFLOW || rc == -ENOMEM)
        return sl_errf(err, errlen, rc, "%s", rc == -ENOMEM ? "out of memory" : "a run passes position 2^64");
    return rc;
}

int sl_posbits_decode(sl_posbits_t *b, const uint8_t *buf, size_t len, char *err, size_t errlen)
{
    return decode(b, buf, len, NULL, 0, err, errlen);
}

int sl_posbits_decode_within(sl_posbits_t *b, const uint8_t *buf, size_t len, const sl_posrun_t *ranges,
                             size_t nranges, char *err, size_t errlen)
{
    /* No range: nothing kept, but the bytes are checked all the same. */
    static const sl_posrun_t none;
    return decode(b, buf, len, nranges > 0 ? ranges : &none, nranges, err, errlen);
}

int sl_posbits_to_posset(const sl_posbits_t *b, uint64_t from, sl_posset_t *set)
{
    sl_posrun_t *runs = NULL;
    size_t n = 0;
    int rc = sl_posbits_runs(b, 0, &runs, &n);
    size_t first = 0;
    while (first < n && runs[first].epoch < from)
        first++;
    if (rc == 0 && n > first)
        rc = sl_posset_add_many(set, runs + first, n - first);
    free(runs);
    return rc;
}
