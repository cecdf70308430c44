/* posset.c: see posset.h. */
#include "posset.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "le.h"
#include "varint.h"
#include "sluice.h"

#define MAGIC "SLPS"
#define VERSION 2         /* what sl_posset_encode() writes */
#define HEADER 16
#define RUN_BYTES_V1 24   /* version 1: every run in full */
#define RUN_MIN_BYTES 3   /* version 2: a run takes three varints at least */

void sl_posset_init(sl_posset_t *s, size_t max_runs)
{
    *s = (sl_posset_t){.max_runs = max_runs};
}

void sl_posset_clear(sl_posset_t *s)
{
    free(s->runs);
    free(s->scratch);
    s->runs = NULL;
    s->scratch = NULL;
    s->num = s->cap = s->scratch_cap = 0;
}

/* -1, 0, 1 as (epoch, file) of r is before, equal to or after (e, f). */
static int cmp_key(const sl_posrun_t *r, uint32_t e, uint32_t f)
{
    if (r->epoch != e)
        return r->epoch < e ? -1 : 1;
    if (r->file != f)
        return r->file < f ? -1 : 1;
    return 0;
}

/* The first run that is after (e, f) or of (e, f) and ends at or after pos. */
static size_t lower(const sl_posset_t *s, uint32_t e, uint32_t f, uint64_t pos)
{
    size_t lo = 0, hi = s->num;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const sl_posrun_t *r = &s->runs[mid];
        int c = cmp_key(r, e, f);
        if (c > 0 || (c == 0 && r->begin + r->count >= pos))
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

static uint64_t overlap_of(const sl_posrun_t *r, uint64_t begin, uint64_t end)
{
    uint64_t b = r->begin > begin ? r->begin : begin;
    uint64_t e = r->begin + r->count < end ? r->begin + r->count : end;
    return e > b ? e - b : 0;
}

/* Room for one more run in *runs (num of *cap used, at most max): the
 * array doubles, from first. @return 0, -ENOSPC, -ENOMEM */
static int room_for_one(sl_posrun_t **runs, size_t *cap, size_t num, size_t first, size_t max)
{
    if (num + 1 > max)
        return -ENOSPC;
    if (num == *cap) {
        size_t ncap = *cap ? *cap * 2 : first;
        if (ncap > max)
            ncap = max;
        sl_posrun_t *p = realloc(*runs, ncap * sizeof *p);
        if (!p)
            return -ENOMEM;
        *runs = p;
        *cap = ncap;
    }
    return 0;
}

int sl_posset_add(sl_posset_t *s, uint32_t epoch, uint32_t file, uint64_t begin, uint64_t count, uint64_t *overlap)
{
    if (overlap)
        *overlap = 0;
    if (count == 0)
        return 0;
    uint64_t end = begin + count;
    size_t i = lower(s, epoch, file, begin), j = i;
    uint64_t lo = begin, hi = end, seen = 0;
    /* Runs i..j-1 overlap or touch [begin, end): they merge into one. */
    while (j < s->num && cmp_key(&s->runs[j], epoch, file) == 0 && s->runs[j].begin <= end) {
        const sl_posrun_t *r = &s->runs[j];
        seen += overlap_of(r, begin, end);
        lo = r->begin < lo ? r->begin : lo;
        hi = r->begin + r->count > hi ? r->begin + r->count : hi;
        j++;
    }
    size_t merged = j - i;
    if (merged == 0) {
        int rc = room_for_one(&s->runs, &s->cap, s->num, 16, s->max_runs);
        if (rc < 0)
            return rc;
        memmove(&s->runs[i + 1], &s->runs[i], (s->num - i) * sizeof *s->runs);
        s->num++;
    } else if (merged > 1) {
        memmove(&s->runs[i + 1], &s->runs[j], (s->num - j) * sizeof *s->runs);
        s->num -= merged - 1;
    }
    s->runs[i] = (sl_posrun_t){epoch, file, lo, hi - lo};
    if (overlap)
        *overlap = seen;
    return 0;
}

/* Trims the run that holds pos of (epoch, file), if one does, to start
 * there: @return the index of the first run left at or after the place. */
static size_t cut_at(sl_posset_t *s, uint32_t epoch, uint32_t file, uint64_t pos)
{
    size_t j = lower(s, epoch, file, pos);
    /* Run j, if of (epoch, file), ends at pos or after; runs are apart, so
     * only run j can hold pos. */
    if (j < s->num && cmp_key(&s->runs[j], epoch, file) == 0) {
        sl_posrun_t *r = &s->runs[j];
        if (r->begin + r->count == pos)
            j++;
        else if (r->begin < pos) {
            r->count -= pos - r->begin;
            r->begin = pos;
        }
    }
    return j;
}

/* Removes runs [i, j). */
static void remove_runs(sl_posset_t *s, size_t i, size_t j)
{
    if (j > i) {
        memmove(&s->runs[i], &s->runs[j], (s->num - j) * sizeof *s->runs);
        s->num -= j - i;
    }
}

void sl_posset_drop_before(sl_posset_t *s, uint32_t epoch, uint32_t file, uint64_t pos)
{
    remove_runs(s, 0, cut_at(s, epoch, file, pos));
}

/* Orders runs by (epoch, file, begin). */
static int cmp_run(const void *a, const void *b)
{
    const sl_posrun_t *x = a, *y = b;
    int c = cmp_key(x, y->epoch, y->file);
    if (c != 0)
        return c;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static inline uint64_t key_of(const sl_posrun_t *r)
{
    return (uint64_t)r->epoch << 32 | r->file;
}

/* cmp_run(a, b) <= 0, inline for the merge's searches. */
static inline bool not_after(const sl_posrun_t *a, const sl_posrun_t *b)
{
    uint64_t ka = key_of(a), kb = key_of(b);
    return ka < kb || (ka == kb && a->begin <= b->begin);
}

/* Appends r to out[0..*n), merging it into the last run when it is of the
 * same (epoch, file) and overlaps or touches it. Runs come in cmp_run order. */
static inline void append_run(sl_posrun_t *out, size_t *n, const sl_posrun_t *r)
{
    if (*n > 0) {
        sl_posrun_t *last = &out[*n - 1];
        uint64_t end = last->begin + last->count;
        if (key_of(last) == key_of(r) && r->begin <= end) {
            if (r->begin + r->count > end)
                last->count = r->begin + r->count - last->begin;
            return;
        }
    }
    out[(*n)++] = *r;
}

/* The first run after every position that [begin, end) of (e, f) overlaps
 * or touches. */
static size_t upper(const sl_posset_t *s, uint32_t e, uint32_t f, uint64_t end)
{
    size_t lo = 0, hi = s->num;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const sl_posrun_t *r = &s->runs[mid];
        int c = cmp_key(r, e, f);
        if (c > 0 || (c == 0 && r->begin > end))
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* Coalescing by bitmap: positions in blocks of BLOCK, one bitmap each, at
 * most MAX_BLOCKS of them (for all the (epoch, file) pairs of a batch). A
 * shuffle's buffer holds records of a few splits, each within a few blocks;
 * a client's ledger merges several batches of each of its workers at once,
 * and each worker reads its own part of the source (far from the others'
 * when splits are long), so the blocks are those of every worker's shuffle
 * window: MAX_BLOCKS is enough for buffers of 10^4 elements at 8 workers
 * (a 128 KiB bitmap). */
#define BLOCK_BITS 12
#define BLOCK_WORDS ((1u << BLOCK_BITS) / 64)
#define MAX_BLOCKS 256
#define BITMAP_WORDS (MAX_BLOCKS * BLOCK_WORDS)
#define FEW_RUNS 16 /* runs to add that are sorted, not put through the bitmaps */

struct block {
    uint32_t epoch, file;
    uint64_t no; /* positions [no << BLOCK_BITS, (no + 1) << BLOCK_BITS) */
};

static int cmp_block(const struct block *a, const struct block *b)
{
    if (a->epoch != b->epoch)
        return a->epoch < b->epoch ? -1 : 1;
    if (a->file != b->file)
        return a->file < b->file ? -1 : 1;
    return a->no < b->no ? -1 : a->no > b->no;
}

/* Sets bits [lo, hi) of w (hi - lo <= 64 * words of w). */
static void set_bits(uint64_t *w, uint64_t lo, uint64_t hi)
{
    while (lo < hi) {
        uint64_t off = lo & 63, nb = 64 - off < hi - lo ? 64 - off : hi - lo;
        w[lo >> 6] |= (nb == 64 ? ~(uint64_t)0 : (((uint64_t)1 << nb) - 1)) << off;
        lo += nb;
    }
}

/* Where block_to_runs() appends: runs of a block of (epoch, file) from base on. */
struct block_out {
    sl_posrun_t *out;
    size_t *m;
    uint32_t epoch, file;
    uint64_t base;
};

static int block_out_run(void *ctx, uint64_t off, uint64_t count)
{
    struct block_out *o = ctx;
    sl_posrun_t r = {o->epoch, o->file, o->base + off, count};
    append_run(o->out, o->m, &r);
    return 0;
}

/* Appends the runs of set bits of a block's bitmap w, as runs of the
 * block's (epoch, file), to out[0..*m) (append_run: a run that goes on
 * from the block before merges with it). */
static void block_to_runs(const uint64_t *w, const struct block *bk, sl_posrun_t *out, size_t *m)
{
    struct block_out o = {out, m, bk->epoch, bk->file, bk->no << BLOCK_BITS};
    sl_bitmap_runs(w, block_out_run, &o);
}

/* Sorts and coalesces add[0..n) into add[0..*m) through bitmaps of the
 * blocks the runs touch (w: BITMAP_WORDS): O(n + blocks) where a sort
 * compares n log n times through a function pointer. @return false when
 * the runs touch more than MAX_BLOCKS blocks (add is unchanged then) */
struct blocks {
    struct block bk[MAX_BLOCKS];
    size_t nb;
    uint16_t slot[4 * MAX_BLOCKS]; /* a hash of the blocks: index + 1, 0 free */
    uint16_t recent[16];           /* by no % 16: index + 1 of a block seen lately, 0 none */
    uint64_t *w;
};

/* The index of block no of (e, f), made (its bitmap cleared) if new.
 * @return it, or -1 when there would be more than MAX_BLOCKS */
static inline long find_block(struct blocks *t, uint32_t e, uint32_t f, uint64_t no)
{
    uint16_t c = t->recent[no % 16];
    if (c && t->bk[c - 1].no == no && t->bk[c - 1].epoch == e && t->bk[c - 1].file == f)
        return c - 1;
    uint64_t h = (no ^ ((uint64_t)e << 32 | f) * 0x9E3779B97F4A7C15ull) * 0x9E3779B97F4A7C15ull;
    const size_t slots = sizeof t->slot / sizeof t->slot[0];
    size_t k = (size_t)(h >> 48) % slots;
    while (t->slot[k] &&
           (t->bk[t->slot[k] - 1].no != no || t->bk[t->slot[k] - 1].epoch != e || t->bk[t->slot[k] - 1].file != f))
        k = (k + 1) % slots;
    if (!t->slot[k]) {
        if (t->nb == MAX_BLOCKS)
            return -1;
        t->bk[t->nb] = (struct block){e, f, no};
        memset(t->w + t->nb * BLOCK_WORDS, 0, BLOCK_WORDS * sizeof *t->w);
        t->slot[k] = (uint16_t)++t->nb;
    }
    t->recent[no % 16] = t->slot[k];
    return t->slot[k] - 1;
}

/* Sorts and coalesces add[0..n) into add[0..*m) through bitmaps of the
 * blocks the runs touch (w: BITMAP_WORDS): O(n + blocks) where a sort
 * compares n log n times through a function pointer. @return false when
 * the runs touch more than MAX_BLOCKS blocks (add is unchanged then) */
static bool coalesce_by_bitmap(sl_posrun_t *add, size_t n, uint64_t *w, size_t *m)
{
    struct blocks t;
    t.nb = 0;
    t.w = w;
    memset(t.slot, 0, sizeof t.slot);
    memset(t.recent, 0, sizeof t.recent);
    struct block *bk = t.bk;
    for (size_t i = 0; i < n; i++) {
        const sl_posrun_t *r = &add[i];
        if (r->count == 1) {
            /* A shuffled element: one bit. */
            long b = find_block(&t, r->epoch, r->file, r->begin >> BLOCK_BITS);
            if (b < 0)
                return false;
            uint64_t off = r->begin & ((1u << BLOCK_BITS) - 1);
            w[(size_t)b * BLOCK_WORDS + off / 64] |= (uint64_t)1 << (off % 64);
            continue;
        }
        uint64_t end = r->begin + r->count;
        for (uint64_t no = r->begin >> BLOCK_BITS; r->count > 0 && no <= (end - 1) >> BLOCK_BITS; no++) {
            long b = find_block(&t, r->epoch, r->file, no);
            if (b < 0)
                return false;
            uint64_t base = no << BLOCK_BITS, lo = r->begin > base ? r->begin : base;
            uint64_t hi = end - base < ((uint64_t)1 << BLOCK_BITS) ? end : base + ((uint64_t)1 << BLOCK_BITS);
            set_bits(w + (size_t)b * BLOCK_WORDS, lo - base, hi - base);
        }
    }
    size_t nb = t.nb;
    /* The blocks in order (few: an insertion sort of their indexes), then
     * each one's runs. */
    size_t order[MAX_BLOCKS];
    for (size_t k = 0; k < nb; k++) {
        size_t j = k;
        for (; j > 0 && cmp_block(&bk[order[j - 1]], &bk[k]) > 0; j--)
            order[j] = order[j - 1];
        order[j] = k;
    }
    *m = 0;
    for (size_t k = 0; k < nb; k++)
        block_to_runs(w + order[k] * BLOCK_WORDS, &bk[order[k]], add, m);
    return true;
}

/* At least bytes of scratch memory, kept in s for the next call. */
static void *scratch(sl_posset_t *s, size_t bytes)
{
    if (bytes > s->scratch_cap) {
        free(s->scratch);
        s->scratch = malloc(bytes);
        s->scratch_cap = s->scratch ? bytes : 0;
    }
    return s->scratch;
}

int sl_posset_add_many(sl_posset_t *s, const void *runs, size_t n)
{
    /* First, what the runs reach without moving them: the first (least
     * (epoch, file, begin)) and the last (greatest (epoch, file, end)). */
    sl_posrun_t first = {0}, last = {0};
    bool sorted = true, any = false;
    sl_posrun_t prev = {0};
    for (size_t i = 0; i < n; i++) {
        sl_posrun_t r;
        memcpy(&r, (const uint8_t *)runs + i * sizeof r, sizeof r);
        if (r.begin + r.count < r.begin)
            return -EOVERFLOW;
        if (i > 0 && sorted && cmp_run(&prev, &r) > 0)
            sorted = false;
        prev = r;
        if (r.count == 0)
            continue;
        if (!any || cmp_run(&r, &first) < 0)
            first = r;
        int c = any ? cmp_key(&r, last.epoch, last.file) : 1;
        if (c > 0 || (c == 0 && r.begin + r.count > last.begin + last.count))
            last = r;
        any = true;
    }
    if (!any)
        return 0;
    /* Set runs [i0, i1) may merge with the new ones: from the first that
     * reaches the first new run to the last that the last new run reaches. */
    size_t i0 = lower(s, first.epoch, first.file, first.begin);
    size_t i1 = upper(s, last.epoch, last.file, last.begin + last.count);
    if (i1 < i0)
        i1 = i0;
    size_t reach = i1 - i0;

    /* Scratch: the new runs, sorted and coalesced in place; their merge
     * with set runs [i0, i1); the bitmaps. */
    if (n > SIZE_MAX / 8 / sizeof(sl_posrun_t) || reach > SIZE_MAX / 8 / sizeof(sl_posrun_t))
        return -ENOMEM;
    /* A few runs (the long ones of unshuffled batches) sort for less than
     * clearing the bitmaps' tables costs. */
    bool by_bitmap = !sorted && n > FEW_RUNS;
    size_t words = by_bitmap ? BITMAP_WORDS : 0;
    sl_posrun_t *add = scratch(s, (2 * n + reach) * sizeof(sl_posrun_t) + words * sizeof(uint64_t));
    if (!add)
        return -ENOMEM;
    sl_posrun_t *out = add + n;
    uint64_t *w = (uint64_t *)(out + n + reach);
    memcpy(add, runs, n * sizeof *add);
    size_t m = 0;
    if (!by_bitmap || !coalesce_by_bitmap(add, n, w, &m)) {
        if (!sorted)
            qsort(add, n, sizeof *add, cmp_run);
        for (size_t i = 0; i < n; i++) {
            if (add[i].count > 0)
                append_run(add, &m, &add[i]);
        }
    }

    /* The merge, in one pass: the smaller run of either side goes out
     * next (chosen without a branch: which one is as good as random), and
     * append_run() joins it to the last one out when they touch. */
    size_t a = i0, b = 0, k = 0;
    const sl_posrun_t *set = s->runs;
    while (a < i1 && b < m) {
        bool take_set = not_after(&set[a], &add[b]);
        const sl_posrun_t *r = take_set ? &set[a] : &add[b];
        a += take_set;
        b += !take_set;
        append_run(out, &k, r);
    }
    while (b < m)
        append_run(out, &k, &add[b++]);
    /* The set's runs left: those the last run out reaches join it, the
     * rest (apart from each other) are copied as they are. */
    while (a < i1 && key_of(&out[k - 1]) == key_of(&set[a]) && set[a].begin <= out[k - 1].begin + out[k - 1].count)
        append_run(out, &k, &set[a++]);
    if (a < i1) { /* (an empty set has no runs to copy from) */
        memcpy(&out[k], &set[a], (i1 - a) * sizeof *out);
        k += i1 - a;
    }
    size_t tail = s->num - i1, total = i0 + k + tail;
    if (total > s->max_runs)
        return -ENOSPC;
    if (total > s->cap) {
        size_t ncap = s->cap * 2 > total ? s->cap * 2 : total;
        if (ncap < 16)
            ncap = 16;
        if (ncap > s->max_runs)
            ncap = s->max_runs;
        sl_posrun_t *p = realloc(s->runs, ncap * sizeof *p);
        if (!p)
            return -ENOMEM;
        s->runs = p;
        s->cap = ncap;
    }
    memmove(&s->runs[i0 + k], &s->runs[i1], tail * sizeof *s->runs);
    memcpy(&s->runs[i0], out, k * sizeof *out);
    s->num = total;
    return 0;
}

uint64_t sl_posset_count(const sl_posset_t *s, uint32_t epoch, uint32_t file, uint64_t begin, uint64_t end)
{
    uint64_t n = 0;
    for (size_t i = lower(s, epoch, file, begin + 1);
         i < s->num && cmp_key(&s->runs[i], epoch, file) == 0 && s->runs[i].begin < end; i++)
        n += overlap_of(&s->runs[i], begin, end);
    return n;
}

uint64_t sl_posset_covered_to(const sl_posset_t *s, uint32_t epoch, uint32_t file, uint64_t pos)
{
    size_t i = lower(s, epoch, file, pos + 1);
    if (i < s->num && cmp_key(&s->runs[i], epoch, file) == 0 && s->runs[i].begin <= pos &&
        s->runs[i].begin + s->runs[i].count > pos)
        return s->runs[i].begin + s->runs[i].count;
    return pos;
}

size_t sl_posset_within(const sl_posset_t *s, uint32_t epoch, uint32_t file, uint64_t begin, uint64_t end,
                        sl_posrun_t *out, size_t max)
{
    size_t n = 0;
    for (size_t i = lower(s, epoch, file, begin + 1);
         i < s->num && cmp_key(&s->runs[i], epoch, file) == 0 && s->runs[i].begin < end; i++) {
        const sl_posrun_t *r = &s->runs[i];
        uint64_t b = r->begin > begin ? r->begin : begin;
        uint64_t len = overlap_of(r, begin, end);
        if (len == 0)
            continue;
        if (n < max)
            out[n] = (sl_posrun_t){epoch, file, b, len};
        n++;
    }
    return n;
}

uint64_t sl_posset_size(const sl_posset_t *s)
{
    uint64_t n = 0;
    for (size_t i = 0; i < s->num; i++)
        n += s->runs[i].count;
    return n;
}

/*
 * Version 2 (docs/protocol.md, "Position sets"): after the header, per run
 *
 *   varint sel     0: the same (epoch, file) as the run before; else the
 *                  epoch is the previous one + sel - 1, followed by
 *   varint file    when sel > 0: the file, counted from 0 when the epoch
 *                  moved, else from the previous file + 1
 *   varint begin   when sel > 0: the begin; else its distance - 1 from
 *                  where the run before ended (runs never touch)
 *   varint count - 1
 *
 * so the holes a shuffle leaves in what a client received cost about three
 * bytes a run rather than 24.
 */
struct v2_run {
    uint64_t sel, file, begin;
    bool pair;
};

static struct v2_run v2_of(const sl_posrun_t *r, const sl_posrun_t *prev)
{
    if (prev && prev->epoch == r->epoch && prev->file == r->file)
        return (struct v2_run){0, 0, r->begin - (prev->begin + prev->count) - 1, false};
    uint64_t de = prev ? (uint64_t)(r->epoch - prev->epoch) : r->epoch;
    uint64_t file = prev && de == 0 ? (uint64_t)(r->file - prev->file - 1) : r->file;
    return (struct v2_run){de + 1, file, r->begin, true};
}

/* Version 2's items of n runs at p (NULL: counts only). @return their bytes */
static size_t put_runs(const sl_posrun_t *runs, size_t n, uint8_t *p)
{
    size_t need = 0;
    for (size_t i = 0; i < n; i++) {
        struct v2_run v = v2_of(&runs[i], i ? &runs[i - 1] : NULL);
        if (!p) {
            need += sl_varint_len(v.sel) + (v.pair ? sl_varint_len(v.file) : 0) + sl_varint_len(v.begin) +
                    sl_varint_len(runs[i].count - 1);
            continue;
        }
        uint8_t *q = p + need;
        q = sl_put_varint(q, v.sel);
        if (v.pair)
            q = sl_put_varint(q, v.file);
        q = sl_put_varint(q, v.begin);
        q = sl_put_varint(q, runs[i].count - 1);
        need = (size_t)(q - p);
    }
    return need;
}

size_t sl_posset_encode(const sl_posset_t *s, uint8_t *buf, size_t cap)
{
    size_t need = HEADER + put_runs(s->runs, s->num, NULL);
    if (cap < need)
        return need;
    memcpy(buf, MAGIC, 4);
    sl_put_le32(buf + 4, VERSION);
    sl_put_le64(buf + 8, s->num);
    put_runs(s->runs, s->num, buf + HEADER);
    return need;
}

size_t sl_posset_encode_v3(const sl_posrun_t *runs, size_t n, const sl_posset_bitmap_t *bitmaps, size_t nb,
                           uint8_t *buf, size_t cap)
{
    size_t at = HEADER + 8 + nb * SL_POSSET_BITMAP_BYTES;
    size_t need = at + put_runs(runs, n, NULL);
    if (cap < need)
        return need;
    memcpy(buf, MAGIC, 4);
    sl_put_le32(buf + 4, 3);
    sl_put_le64(buf + 8, n);
    sl_put_le64(buf + HEADER, nb);
    sl_posset_put_bitmaps(bitmaps, nb, buf + HEADER + 8);
    put_runs(runs, n, buf + at);
    return need;
}

void sl_posset_put_bitmaps(const sl_posset_bitmap_t *bitmaps, size_t nb, uint8_t *p)
{
    for (size_t i = 0; i < nb; i++, p += SL_POSSET_BITMAP_BYTES) {
        sl_put_le32(p, bitmaps[i].epoch);
        sl_put_le32(p + 4, bitmaps[i].file);
        sl_put_le64(p + 8, bitmaps[i].no);
        for (unsigned k = 0; k < SL_POSSET_BITMAP_SPAN / 64; k++)
            sl_put_le64(p + 16 + 8 * k, bitmaps[i].w[k]);
    }
}

int sl_posset_get_bitmaps(const uint8_t *p, uint64_t nb, int (*fn)(void *ctx, const sl_posset_bitmap_t *b), void *ctx,
                          char *err, size_t errlen)
{
    uint64_t w[SL_POSSET_BITMAP_SPAN / 64];
    sl_posset_bitmap_t prev = {0};
    for (uint64_t i = 0; i < nb; i++, p += SL_POSSET_BITMAP_BYTES) {
        sl_posset_bitmap_t b = {sl_get_le32(p), sl_get_le32(p + 4), sl_get_le64(p + 8), w};
        bool any = false;
        for (unsigned k = 0; k < SL_POSSET_BITMAP_SPAN / 64; k++) {
            w[k] = sl_get_le64(p + 16 + 8 * k);
            any |= w[k] != 0;
        }
        bool after = i == 0 || sl_place_before(prev.epoch, prev.file, prev.no, b.epoch, b.file, b.no);
        if (!any || !after || b.no > UINT64_MAX / SL_POSSET_BITMAP_SPAN - 1)
            return sl_errf(err, errlen, SL_EDATA, "bitmap %llu of %llu is %s", (unsigned long long)i + 1,
                           (unsigned long long)nb,
                           !any ? "empty" : !after ? "not after the one before it" : "past position 2^64");
        int rc = fn(ctx, &b);
        if (rc < 0)
            return rc;
        prev = b;
    }
    return 0;
}

static int bad_run(char *err, size_t errlen, uint64_t i)
{
    return sl_errf(err, errlen, SL_EDATA,
                   "position set run %llu is empty, overflows, is cut short, or is not after the one before it",
                   (unsigned long long)i);
}

/* Reads version 2's runs one at a time (and version 3's, which follow its
 * bitmaps): every run is after the one before it by construction; what is
 * checked is that nothing overflows. */
struct v2_reader {
    const uint8_t *buf;
    size_t len, pos;
    sl_posrun_t prev;
    bool any;
};

static int v2_next(struct v2_reader *rd, uint64_t i, sl_posrun_t *out, char *err, size_t errlen)
{
    const sl_posrun_t *prev = rd->any ? &rd->prev : NULL;
    uint64_t sel = 0, file = 0, begin = 0, count = 0;
    if (sl_get_varint(rd->buf, rd->len, &rd->pos, &sel) < 0 ||
        (sel > 0 && sl_get_varint(rd->buf, rd->len, &rd->pos, &file) < 0) ||
        sl_get_varint(rd->buf, rd->len, &rd->pos, &begin) < 0 || sl_get_varint(rd->buf, rd->len, &rd->pos, &count) < 0)
        return bad_run(err, errlen, i);
    sl_posrun_t r;
    if (sel == 0) {
        if (!prev)
            return bad_run(err, errlen, i);
        uint64_t end = prev->begin + prev->count;
        if (end == UINT64_MAX || begin > UINT64_MAX - end - 1)
            return bad_run(err, errlen, i);
        r = (sl_posrun_t){prev->epoch, prev->file, end + 1 + begin, 0};
    } else {
        uint64_t epoch = prev ? (uint64_t)prev->epoch + (sel - 1) : sel - 1;
        if (sel - 1 > UINT32_MAX || epoch > UINT32_MAX)
            return bad_run(err, errlen, i);
        if (prev && sel == 1) {
            if (file > (uint64_t)UINT32_MAX - prev->file - 1)
                return bad_run(err, errlen, i);
            file += (uint64_t)prev->file + 1;
        }
        if (file > UINT32_MAX)
            return bad_run(err, errlen, i);
        r = (sl_posrun_t){(uint32_t)epoch, (uint32_t)file, begin, 0};
    }
    if (count >= UINT64_MAX - r.begin) /* the run's end, begin + count + 1, must not pass 2^64 - 1 */
        return bad_run(err, errlen, i);
    r.count = count + 1;
    rd->prev = *out = r;
    rd->any = true;
    return 0;
}

static int left_over(size_t left, uint64_t n, char *err, size_t errlen)
{
    return sl_errf(err, errlen, SL_EDATA, "position set: %zu bytes left over after its %llu runs", left,
                   (unsigned long long)n);
}

/*
 * Version 3: after the header (its count the runs'), u64 the number of
 * bitmaps, each u32 epoch, u32 file, u64 block and 64 u64 words
 * (bit i of word k: position V3_SPAN block + 64 k + i), in order and
 * none empty; then the runs as version 2 has them. What a rank of a named
 * job received past its job's fold is a scattered share of the records: a
 * bit a position there, where a run takes about three bytes a record
 * (posbits.h writes it).
 */
#define V3_SPAN SL_POSSET_BITMAP_SPAN
#define V3_BITMAP SL_POSSET_BITMAP_BYTES
#define V3_HEADER (HEADER + 8)

/* A version 3 set's bitmaps passed on as runs to fn(ctx, run). */
struct bitmap_out {
    const sl_posset_bitmap_t *b;
    int (*fn)(void *, const sl_posrun_t *);
    void *ctx;
};

static int bitmap_out_run(void *ctx, uint64_t off, uint64_t count)
{
    struct bitmap_out *o = ctx;
    sl_posrun_t r = {o->b->epoch, o->b->file, o->b->no * V3_SPAN + off, count};
    return o->fn(o->ctx, &r);
}

static int bitmap_runs(void *ctx, const sl_posset_bitmap_t *b)
{
    struct bitmap_out *o = ctx;
    o->b = b;
    return sl_bitmap_runs(b->w, bitmap_out_run, o);
}

/* Calls fn(ctx, run) for every run of a version 1, 2 or 3 set whose header
 * was checked (n runs): a version 3 set's bitmaps first, as runs, then its
 * runs (each part in order). Checks what decode checks. */
static int each_run(const uint8_t *buf, size_t len, uint32_t version, uint64_t n, int (*fn)(void *, const sl_posrun_t *),
                    void *ctx, char *err, size_t errlen)
{
    if (version == 1) {
        sl_posrun_t prev = {0};
        for (uint64_t i = 0; i < n; i++) {
            const uint8_t *p = buf + HEADER + i * RUN_BYTES_V1;
            sl_posrun_t r = {sl_get_le32(p), sl_get_le32(p + 4), sl_get_le64(p + 8), sl_get_le64(p + 16)};
            bool ok = r.count > 0 && r.begin + r.count > r.begin;
            if (ok && i > 0) {
                int c = cmp_key(&prev, r.epoch, r.file);
                ok = c < 0 || (c == 0 && prev.begin + prev.count < r.begin);
            }
            if (!ok)
                return bad_run(err, errlen, i);
            int rc = fn(ctx, &r);
            if (rc < 0)
                return rc;
            prev = r;
        }
        return 0;
    }
    size_t from = HEADER;
    if (version == 3) {
        uint64_t nb = sl_get_le64(buf + HEADER);
        struct bitmap_out o = {NULL, fn, ctx};
        char why[128];
        int rc = sl_posset_get_bitmaps(buf + V3_HEADER, nb, bitmap_runs, &o, why, sizeof why);
        if (rc == SL_EDATA)
            return sl_errf(err, errlen, rc, "position set %s", why);
        if (rc < 0)
            return rc;
        from = V3_HEADER + (size_t)nb * V3_BITMAP;
    }
    struct v2_reader rd = {.buf = buf, .len = len, .pos = from};
    for (uint64_t i = 0; i < n; i++) {
        sl_posrun_t r;
        int rc = v2_next(&rd, i, &r, err, errlen);
        if (rc == 0)
            rc = fn(ctx, &r);
        if (rc < 0)
            return rc;
    }
    return rd.pos == len ? 0 : left_over(len - rd.pos, n, err, errlen);
}

/* Checks a set's header: its version, and that its bytes can hold its
 * counts (before anything is allocated). */
static int check_header(const uint8_t *buf, size_t len, uint32_t *version, uint64_t *n, char *err, size_t errlen)
{
    if (len < HEADER || memcmp(buf, MAGIC, 4) != 0)
        return sl_errf(err, errlen, SL_EDATA, "not a position set (no \"" MAGIC "\" header)");
    *version = sl_get_le32(buf + 4);
    if (*version < 1 || *version > 3)
        return sl_errf(err, errlen, SL_EDATA, "position set version %u, this build reads versions 1 to 3", *version);
    *n = sl_get_le64(buf + 8);
    size_t from = HEADER;
    if (*version == 3) {
        uint64_t nb = len >= V3_HEADER ? sl_get_le64(buf + HEADER) : 0;
        if (len < V3_HEADER || nb > (len - V3_HEADER) / V3_BITMAP)
            return sl_errf(err, errlen, SL_EDATA, "position set of %zu bytes cannot hold its %llu bitmaps", len,
                           (unsigned long long)nb);
        from = V3_HEADER + (size_t)nb * V3_BITMAP;
    }
    bool fits = *version == 1 ? *n <= (len - HEADER) / RUN_BYTES_V1 && HEADER + *n * RUN_BYTES_V1 == len
                              : *n <= (len - from) / RUN_MIN_BYTES;
    if (!fits)
        return sl_errf(err, errlen, SL_EDATA, "position set of %zu bytes cannot hold its %llu runs", len,
                       (unsigned long long)*n);
    return 0;
}

/* Runs gathered for one add: at most max of them. */
struct gather {
    sl_posrun_t *runs;
    size_t n, cap, max;
};

static int gather_run(void *ctx, const sl_posrun_t *r)
{
    struct gather *g = ctx;
    int rc = room_for_one(&g->runs, &g->cap, g->n, 1024, g->max);
    if (rc < 0)
        return rc;
    g->runs[g->n++] = *r;
    return 0;
}

/* A walk of runs against ranges (sorted and apart): the first range that
 * may reach the next run of each part (runs come in order within one),
 * and the run before (a run before it starts another part). */
struct within {
    const sl_posrun_t *ranges;
    size_t nranges, at;
    sl_posrun_t last;
};

/* fn(ctx, piece) for each piece of r that lies in the ranges. The bitmaps'
 * runs, then the runs, come in order: the first range that may reach r is
 * found from where the last run's search left off (back at the start for
 * the runs). */
static int each_piece(struct within *w, const sl_posrun_t *r, int (*fn)(void *, const sl_posrun_t *), void *ctx)
{
    if (sl_posrun_before(*r, w->last))
        w->at = 0;
    w->last = *r;
    while (w->at < w->nranges) {
        const sl_posrun_t *k = &w->ranges[w->at];
        int c = cmp_key(k, r->epoch, r->file);
        if (c < 0 || (c == 0 && k->begin + k->count <= r->begin))
            w->at++;
        else
            break;
    }
    for (size_t i = w->at; i < w->nranges; i++) {
        const sl_posrun_t *k = &w->ranges[i];
        if (cmp_key(k, r->epoch, r->file) != 0 || k->begin >= r->begin + r->count)
            break;
        uint64_t lo = k->begin > r->begin ? k->begin : r->begin;
        uint64_t hi = k->begin + k->count < r->begin + r->count ? k->begin + k->count : r->begin + r->count;
        sl_posrun_t piece = {r->epoch, r->file, lo, hi - lo};
        int rc = fn(ctx, &piece);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Decodes buf into s: at most s->max_runs runs kept. */
static int decode(sl_posset_t *s, const uint8_t *buf, size_t len, char *err, size_t errlen)
{
    uint32_t version = 0;
    uint64_t n = 0;
    int rc = check_header(buf, len, &version, &n, err, errlen);
    if (rc < 0)
        return rc;
    if (n > s->max_runs)
        return sl_errf(err, errlen, -ENOSPC, "position set of %llu runs, more than the limit %zu",
                       (unsigned long long)n, s->max_runs);
    struct gather g = {.max = s->max_runs};
    /* Version 1 and 2 runs come sorted and apart, n of them: they are the set. */
    bool as_they_are = version < 3;
    if (as_they_are && n > 0 && !(g.runs = malloc((size_t)n * sizeof *g.runs)))
        return sl_errf(err, errlen, -ENOMEM, "out of memory");
    g.cap = as_they_are ? (size_t)n : 0;
    rc = each_run(buf, len, version, n, gather_run, &g, err, errlen);
    sl_posset_t set;
    sl_posset_init(&set, s->max_runs);
    if (rc == 0 && as_they_are) {
        set.runs = g.runs;
        set.num = set.cap = g.n;
        g.runs = NULL;
    } else if (rc == 0 && g.n > 0) {
        rc = sl_posset_add_many(&set, g.runs, g.n);
    }
    free(g.runs);
    if (rc == -ENOSPC || rc == -ENOMEM)
        rc = rc == -ENOMEM ? sl_errf(err, errlen, rc, "out of memory")
                           : sl_errf(err, errlen, rc, "position set of more than %zu runs, the limit", s->max_runs);
    if (rc < 0) {
        sl_posset_clear(&set);
        return rc;
    }
    sl_posset_clear(s);
    set.max_runs = s->max_runs;
    *s = set;
    return 0;
}

/* sl_posset_read()'s runs, passed on a chunk at a time. */
#define CHUNK 1024
struct chunk {
    sl_posrun_t runs[CHUNK];
    size_t n;
    int (*fn)(void *, const sl_posrun_t *, size_t);
    void *ctx;
    struct within w; /* sl_posset_read_within()'s ranges */
};

static int chunk_run(void *ctx, const sl_posrun_t *r)
{
    struct chunk *c = ctx;
    c->runs[c->n++] = *r;
    if (c->n < CHUNK)
        return 0;
    c->n = 0;
    return c->fn(c->ctx, c->runs, CHUNK);
}

static int clip_run(void *ctx, const sl_posrun_t *r)
{
    struct chunk *c = ctx;
    return each_piece(&c->w, r, chunk_run, c);
}

int sl_posset_read_within(const uint8_t *buf, size_t len, const sl_posrun_t *ranges, size_t nranges,
                          int (*fn)(void *ctx, const sl_posrun_t *runs, size_t n), void *ctx, char *err, size_t errlen)
{
    uint32_t version = 0;
    uint64_t n = 0;
    int rc = check_header(buf, len, &version, &n, err, errlen);
    if (rc < 0)
        return rc;
    struct chunk *c = malloc(sizeof *c);
    if (!c)
        return sl_errf(err, errlen, -ENOMEM, "out of memory");
    *c = (struct chunk){.n = 0, .fn = fn, .ctx = ctx, .w = {.ranges = ranges, .nranges = nranges}};
    rc = each_run(buf, len, version, n, ranges ? clip_run : chunk_run, c, err, errlen);
    if (rc == 0 && c->n > 0)
        rc = fn(ctx, c->runs, c->n);
    free(c);
    return rc;
}

int sl_posset_read(const uint8_t *buf, size_t len, int (*fn)(void *ctx, const sl_posrun_t *runs, size_t n), void *ctx,
                   char *err, size_t errlen)
{
    return sl_posset_read_within(buf, len, NULL, 0, fn, ctx, err, errlen);
}

int sl_posset_decode(sl_posset_t *s, const uint8_t *buf, size_t len, char *err, size_t errlen)
{
    return decode(s, buf, len, err, errlen);
}
