/* posset.c: see posset.h. */
#include "posset.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "le.h"
#include "sluice.h"

#define MAGIC "SLPS"
#define VERSION 1
#define HEADER 16
#define RUN_BYTES 24

void sl_posset_init(sl_posset_t *s, size_t max_runs)
{
    *s = (sl_posset_t){.max_runs = max_runs};
}

void sl_posset_clear(sl_posset_t *s)
{
    free(s->runs);
    s->runs = NULL;
    s->num = s->cap = 0;
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
        if (s->num + 1 > s->max_runs)
            return -ENOSPC;
        if (s->num == s->cap) {
            size_t ncap = s->cap ? s->cap * 2 : 16;
            if (ncap > s->max_runs)
                ncap = s->max_runs;
            sl_posrun_t *p = realloc(s->runs, ncap * sizeof *p);
            if (!p)
                return -ENOMEM;
            s->runs = p;
            s->cap = ncap;
        }
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

/* Orders runs by (epoch, file, begin). */
static int cmp_run(const void *a, const void *b)
{
    const sl_posrun_t *x = a, *y = b;
    int c = cmp_key(x, y->epoch, y->file);
    if (c != 0)
        return c;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Appends r to out[0..*n), merging it into the last run when it is of the
 * same (epoch, file) and overlaps or touches it. Runs come in cmp_run order. */
static void append_run(sl_posrun_t *out, size_t *n, const sl_posrun_t *r)
{
    if (*n > 0) {
        sl_posrun_t *last = &out[*n - 1];
        uint64_t end = last->begin + last->count;
        if (cmp_key(last, r->epoch, r->file) == 0 && r->begin <= end) {
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

int sl_posset_add_many(sl_posset_t *s, const void *runs, size_t n)
{
    if (n == 0)
        return 0;
    if (n > SIZE_MAX / 2 / sizeof(sl_posrun_t))
        return -ENOMEM;
    /* One buffer: the new runs, sorted and coalesced in place, then room
     * for their merge with the set's runs they reach. */
    sl_posrun_t *add = malloc(n * sizeof *add);
    sl_posrun_t *out = NULL;
    int rc = -ENOMEM;
    if (!add)
        goto done;
    memcpy(add, runs, n * sizeof *add);
    bool sorted = true;
    for (size_t i = 0; i < n; i++) {
        if (add[i].begin + add[i].count < add[i].begin) {
            rc = -EOVERFLOW;
            goto done;
        }
        if (i > 0 && sorted && cmp_run(&add[i - 1], &add[i]) > 0)
            sorted = false;
    }
    if (!sorted)
        qsort(add, n, sizeof *add, cmp_run);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (add[i].count > 0)
            append_run(add, &m, &add[i]);
    }
    rc = 0;
    if (m == 0)
        goto done;

    /* Set runs [i0, i1) may merge with the new ones: from the first that
     * reaches the first new run to the last that the last new run reaches
     * (coalesced and sorted, the last new run ends last in its key). */
    const sl_posrun_t *first = &add[0], *last = &add[m - 1];
    size_t i0 = lower(s, first->epoch, first->file, first->begin);
    size_t i1 = upper(s, last->epoch, last->file, last->begin + last->count);
    if (i1 < i0)
        i1 = i0;
    size_t reach = i1 - i0, k = 0;
    rc = -ENOMEM;
    out = malloc((reach + m) * sizeof *out);
    if (!out)
        goto done;
    size_t a = i0, b = 0;
    while (a < i1 || b < m) {
        bool take_set = b == m || (a < i1 && cmp_run(&s->runs[a], &add[b]) <= 0);
        append_run(out, &k, take_set ? &s->runs[a++] : &add[b++]);
    }
    size_t tail = s->num - i1, total = i0 + k + tail;
    rc = -ENOSPC;
    if (total > s->max_runs)
        goto done;
    if (total > s->cap) {
        size_t ncap = s->cap * 2 > total ? s->cap * 2 : total;
        if (ncap < 16)
            ncap = 16;
        if (ncap > s->max_runs)
            ncap = s->max_runs;
        sl_posrun_t *p = realloc(s->runs, ncap * sizeof *p);
        rc = -ENOMEM;
        if (!p)
            goto done;
        s->runs = p;
        s->cap = ncap;
    }
    memmove(&s->runs[i0 + k], &s->runs[i1], tail * sizeof *s->runs);
    memcpy(&s->runs[i0], out, k * sizeof *out);
    s->num = total;
    rc = 0;
done:
    free(out);
    free(add);
    return rc;
}

uint64_t sl_posset_count(const sl_posset_t *s, uint32_t epoch, uint32_t file, uint64_t begin, uint64_t end)
{
    uint64_t n = 0;
    for (size_t i = lower(s, epoch, file, begin + 1);
         i < s->num && cmp_key(&s->runs[i], epoch, file) == 0 && s->runs[i].begin < end; i++)
        n += overlap_of(&s->runs[i], begin, end);
    return n;
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

size_t sl_posset_encode(const sl_posset_t *s, uint8_t *buf, size_t cap)
{
    size_t need = HEADER + s->num * RUN_BYTES;
    if (cap < need)
        return need;
    memcpy(buf, MAGIC, 4);
    sl_put_le32(buf + 4, VERSION);
    sl_put_le64(buf + 8, s->num);
    for (size_t i = 0; i < s->num; i++) {
        uint8_t *p = buf + HEADER + i * RUN_BYTES;
        sl_put_le32(p, s->runs[i].epoch);
        sl_put_le32(p + 4, s->runs[i].file);
        sl_put_le64(p + 8, s->runs[i].begin);
        sl_put_le64(p + 16, s->runs[i].count);
    }
    return need;
}

int sl_posset_decode(sl_posset_t *s, const uint8_t *buf, size_t len, char *err, size_t errlen)
{
    if (len < HEADER || memcmp(buf, MAGIC, 4) != 0)
        return sl_errf(err, errlen, SL_EDATA, "not a position set (no \"" MAGIC "\" header)");
    if (sl_get_le32(buf + 4) != VERSION)
        return sl_errf(err, errlen, SL_EDATA, "position set version %u, this build reads version %d",
                       sl_get_le32(buf + 4), VERSION);
    uint64_t n = sl_get_le64(buf + 8);
    if (n > (len - HEADER) / RUN_BYTES || HEADER + n * RUN_BYTES != len)
        return sl_errf(err, errlen, SL_EDATA, "position set of %zu bytes cannot hold its %llu runs", len,
                       (unsigned long long)n);
    if (n > s->max_runs)
        return sl_errf(err, errlen, -ENOSPC, "position set of %llu runs, more than the limit %zu",
                       (unsigned long long)n, s->max_runs);
    sl_posrun_t *runs = n ? malloc(n * sizeof *runs) : NULL;
    if (n && !runs)
        return sl_errf(err, errlen, -ENOMEM, "out of memory");
    for (uint64_t i = 0; i < n; i++) {
        const uint8_t *p = buf + HEADER + i * RUN_BYTES;
        runs[i] = (sl_posrun_t){sl_get_le32(p), sl_get_le32(p + 4), sl_get_le64(p + 8), sl_get_le64(p + 16)};
        const sl_posrun_t *r = &runs[i], *prev = i ? &runs[i - 1] : NULL;
        bool ok = r->count > 0 && r->begin + r->count > r->begin;
        if (ok && prev) {
            int c = cmp_key(prev, r->epoch, r->file);
            ok = c < 0 || (c == 0 && prev->begin + prev->count < r->begin);
        }
        if (!ok) {
            free(runs);
            return sl_errf(err, errlen, SL_EDATA, "position set run %llu is empty, overflows, or is not after "
                           "the one before it", (unsigned long long)i);
        }
    }
    free(s->runs);
    s->runs = runs;
    s->num = s->cap = (size_t)n;
    return 0;
}
