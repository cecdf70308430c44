/*
 * provwire.c: see provwire.h. The layout (docs/protocol.md, "Provenance"):
 *
 *   varint P                      distinct (epoch, file) pairs, 1 <= P <= N
 *   P x (varint epoch, varint file_index)
 *   varint N                      runs, 1 <= N <= num_elements
 *   N x ([varint pair, when P > 1], varint zigzag(begin - end), varint count)
 *
 * where end is where the previous run of the same pair ended (0 before its
 * first), so that a pair's runs that follow each other cost one byte of
 * distance and a shuffle's jumps within its buffer two or three. Or, the
 * dense form (sl_provwire_encode_dense()):
 *
 *   varint 0, varint P (1..256), P x (varint epoch, varint file_index,
 *   varint least record), byte W (1..4), when P > 1 num_records x a byte
 *   (the record's pair), num_records x W-byte little-endian offsets from
 *   its pair's least record
 */
#include "provwire.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "le.h"
#include "provlanes.h"
#include "varint.h"

/* An open-addressing table of (epoch, file) -> pair index. */
struct slot {
    uint32_t epoch, file;
    uint32_t index; /* + 1; 0: free */
};

static size_t slot_of(uint32_t epoch, uint32_t file, size_t mask)
{
    uint64_t h = ((uint64_t)epoch << 32 | file) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 32) & mask;
}

/* A buffer of cap bytes with len used, given back to the allocator down to
 * len when the bound overestimated by more than SHRINK_SLACK: held batches
 * keep their encodings, but a realloc for a few bytes costs more than they
 * do (a batch of one run is a few bytes in a bound of about 50). */
#define SHRINK_SLACK 1024

static uint8_t *shrink(uint8_t *buf, size_t cap, size_t len)
{
    if (cap - len <= SHRINK_SLACK)
        return buf;
    uint8_t *shrunk = realloc(buf, len ? len : 1);
    return shrunk ? shrunk : buf;
}

/* The most bytes the runs form takes for n runs of num_pairs pairs: the two
 * counts, a pair's two fields, a run's three, each a varint. */
static size_t runs_bound(size_t num_pairs, uint64_t n)
{
    return 2 * SL_VARINT_MAX + num_pairs * 2 * SL_VARINT_MAX + (size_t)n * 3 * SL_VARINT_MAX;
}

int sl_provwire_encode(const sl_provenance_run_t *runs, uint64_t n, uint8_t **out, size_t *len)
{
    return sl_provwire_encode_in(runs, n, NULL, 0, out, len);
}

size_t sl_provwire_encode_one(const sl_provenance_run_t *run, uint8_t *room)
{
    /* What the loops of sl_provwire_encode_in() write for one run. */
    _Static_assert(SL_PROVWIRE_ONE_MAX == 6 * SL_VARINT_MAX, "one run: six varints");
    uint8_t *p = room;
    *p++ = 1; /* one pair */
    p = sl_put_varint(p, run->epoch);
    p = sl_put_varint(p, run->file_index);
    *p++ = 1; /* one run */
    p = sl_put_varint(p, sl_zigzag(run->begin));
    p = sl_put_varint(p, run->count);
    return (size_t)(p - room);
}

int sl_provwire_encode_in(const sl_provenance_run_t *runs, uint64_t n, uint8_t *room, size_t room_len, uint8_t **out,
                          size_t *len)
{
    *out = NULL;
    *len = 0;
    /* Pair indexes are u32 and the bound below must not overflow; a batch
     * has far fewer runs than that. */
    if (n == 0 || n > UINT32_MAX / 2)
        return -ENOMEM;
    if (n == 1 && room_len >= SL_PROVWIRE_ONE_MAX) {
        *out = room;
        *len = sl_provwire_encode_one(&runs[0], room);
        return 0;
    }
    bool one_pair = true;
    for (uint64_t i = 1; i < n && one_pair; i++)
        one_pair = runs[i].epoch == runs[0].epoch && runs[i].file_index == runs[0].file_index;

    size_t cap = 1, num_pairs = 1;
    struct slot *slots = NULL;
    uint32_t *pair_of = NULL, *first = NULL;
    uint64_t *ends = NULL;
    void *block = NULL;
    if (!one_pair) {
        while (cap < 2 * n)
            cap <<= 1;
        /* One block: where each pair's last run ended, the slots (at most
         * half full), the pair of each run and each pair's first run. */
        block = calloc(1, n * sizeof *ends + cap * sizeof *slots + n * 2 * sizeof *pair_of);
        if (!block)
            return -ENOMEM;
        ends = block;
        slots = (struct slot *)(ends + n);
        pair_of = (uint32_t *)(slots + cap);
        first = pair_of + n;
        num_pairs = 0;
        for (uint64_t i = 0; i < n; i++) {
            size_t k = slot_of(runs[i].epoch, runs[i].file_index, cap - 1);
            while (slots[k].index && (slots[k].epoch != runs[i].epoch || slots[k].file != runs[i].file_index))
                k = (k + 1) & (cap - 1);
            if (!slots[k].index) {
                slots[k] = (struct slot){runs[i].epoch, runs[i].file_index, (uint32_t)num_pairs + 1};
                first[num_pairs++] = (uint32_t)i;
            }
            pair_of[i] = slots[k].index - 1;
        }
    }
    size_t bound = runs_bound(num_pairs, n);
    uint8_t *buf = bound <= room_len ? room : malloc(bound);
    if (!buf) {
        free(block);
        return -ENOMEM;
    }
    uint8_t *p = sl_put_varint(buf, num_pairs);
    for (size_t k = 0; k < num_pairs; k++) {
        const sl_provenance_run_t *r = &runs[one_pair ? 0 : first[k]];
        p = sl_put_varint(p, r->epoch);
        p = sl_put_varint(p, r->file_index);
    }
    p = sl_put_varint(p, n);
    uint64_t end = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t *e = &end;
        if (!one_pair) {
            p = sl_put_varint(p, pair_of[i]);
            e = &ends[pair_of[i]];
        }
        p = sl_put_varint(p, sl_zigzag(runs[i].begin - *e));
        p = sl_put_varint(p, runs[i].count);
        *e = runs[i].begin + runs[i].count;
    }
    free(block);
    *len = (size_t)(p - buf);
    *out = buf == room ? room : shrink(buf, bound, *len);
    return 0;
}

/* The dense form's marker: a pair count of 0, which the runs form never has. */
#define DENSE_MARK 0

/* The dense form's pairs: at most DENSE_PAIRS (a shuffled batch of
 * interleaved files has a few dozen). */
#define DENSE_PAIRS 256

struct dense_pair {
    uint32_t epoch, file;
    uint64_t lo, hi;
};

#if defined(__x86_64__)
/* The dense form's offsets of n single-record runs of one pair, each
 * begin - base in w bytes at p (room for 16 bytes past the last), four
 * runs at a time: the begins gathered from the runs' 96 bytes
 * (provlanes.h), less base, narrowed to 32 bits and then to w bytes.
 * @return the byte after the last offset */
__attribute__((target("avx2"))) static uint8_t *dense_singles_avx2(const sl_provenance_run_t *runs, uint64_t n,
                                                                  uint64_t base, unsigned w, uint8_t *p)
{
    /* Bytes of each 32-bit offset kept, by width (-1: zeroed, not stored). */
    static const int8_t keep[5][16] = {
        {0},
        {0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1},
        {0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1},
        {0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1},
        {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    };
    const __m256i b64 = _mm256_set1_epi64x((long long)base);
    const __m256i low32 = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
    const __m128i narrow = _mm_loadu_si128((const __m128i *)(const void *)keep[w]);
    uint64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        __m256i pairs, beg, counts;
        sl_runs4_lanes(&runs[i], &pairs, &beg, &counts);
        beg = _mm256_permute4x64_epi64(beg, _MM_SHUFFLE(2, 3, 0, 1)); /* begins 0 1 2 3 */
        __m256i off = _mm256_permutevar8x32_epi32(_mm256_sub_epi64(beg, b64), low32);
        _mm_storeu_si128((__m128i *)(void *)p, _mm_shuffle_epi8(_mm256_castsi256_si128(off), narrow));
        p += 4 * w;
    }
    for (; i < n; i++) {
        sl_put_le32(p, (uint32_t)(runs[i].begin - base));
        p += w;
    }
    return p;
}
#endif

/* Whether every W-byte offset from least stays below 2^64: the reader
 * refuses a pair whose widest offset would not (it does not read the
 * offsets to check them), so the encoder does not use the form there. */
static bool dense_fits(uint64_t least, unsigned w)
{
    return least <= UINT64_MAX - ((UINT64_C(1) << (8 * w)) - 1);
}

int sl_provwire_encode_dense(const sl_provenance_run_t *runs, uint64_t n, uint64_t num_records, uint8_t **out,
                             size_t *len)
{
    *out = NULL;
    *len = 0;
    if (n == 0 || n * 2 <= num_records)
        return 1;
    sl_prov_span_t span;
    sl_prov_span(runs, n, &span);
    return sl_provwire_encode_dense_span(runs, n, num_records, &span, out, len);
}

int sl_provwire_encode_dense_span(const sl_provenance_run_t *runs, uint64_t n, uint64_t num_records,
                                  const sl_prov_span_t *span, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    if (n == 0 || n * 2 <= num_records || num_records > SIZE_MAX / 8)
        return 1;
    /* Every run must have a record and end below 2^64, and the counts must
     * add up. */
    if (span->wraps || span->empty || span->records != num_records)
        return 1;
    struct dense_pair pairs[DENSE_PAIRS];
    uint8_t stack_of[4096], *pair_of = NULL;
    unsigned np = 0;
    int rc = 1;
    /* One pair (most batches): the span says all, and there is no index
     * to find or keep. */
    bool one_pair = span->one_pair;
    if (one_pair) {
        pairs[np++] = (struct dense_pair){runs[0].epoch, runs[0].file_index, span->lo, span->hi};
    } else {
        /* Several: each run's pair is found in a table of twice DENSE_PAIRS
         * slots, by its file and epoch mixed cheaply (a run's file changes
         * from one run to the next when a shuffle mixes an interleave's
         * files); pairs are numbered as they first appear. */
        pair_of = n <= sizeof stack_of ? stack_of : malloc(n);
        if (!pair_of)
            return -ENOMEM;
        uint16_t table[2 * DENSE_PAIRS]; /* a pair's index + 1; 0: free */
        const size_t mask = 2 * DENSE_PAIRS - 1;
        memset(table, 0, sizeof table);
        for (uint64_t i = 0; i < n; i++) {
            const sl_provenance_run_t *r = &runs[i];
            size_t j = (r->file_index ^ r->epoch * 0x9e3779b1u) & mask;
            while (table[j] && (pairs[table[j] - 1].file != r->file_index || pairs[table[j] - 1].epoch != r->epoch))
                j = (j + 1) & mask;
            if (!table[j]) {
                if (np == DENSE_PAIRS)
                    goto done;
                table[j] = (uint16_t)(np + 1);
                pairs[np++] = (struct dense_pair){r->epoch, r->file_index, UINT64_MAX, 0};
            }
            unsigned k = table[j] - 1u;
            pair_of[i] = (uint8_t)k;
            struct dense_pair *d = &pairs[k];
            uint64_t last = r->begin + r->count - 1;
            d->lo = r->begin < d->lo ? r->begin : d->lo;
            d->hi = last > d->hi ? last : d->hi;
        }
    }
    uint64_t span_of = 0;
    for (unsigned j = 0; j < np; j++)
        span_of = pairs[j].hi - pairs[j].lo > span_of ? pairs[j].hi - pairs[j].lo : span_of;
    if (span_of > UINT32_MAX)
        goto done;
    unsigned w = 1;
    while (w < 4 && span_of >> (8 * w))
        w++;
    for (unsigned j = 0; j < np; j++)
        if (!dense_fits(pairs[j].lo, w))
            goto done;
    /* Each offset is stored as 4 bytes (four as 16 on the vector path) and
     * the pointer moves w: room for the last one's spare bytes. */
    size_t cap = (2 + 3 * (size_t)np) * SL_VARINT_MAX + 1 + (size_t)num_records * (w + (np > 1)) + 16;
    uint8_t *buf = malloc(cap);
    if (!buf) {
        rc = -ENOMEM;
        goto done;
    }
    uint8_t *p = sl_put_varint(buf, DENSE_MARK);
    p = sl_put_varint(p, np);
    for (unsigned j = 0; j < np; j++) {
        p = sl_put_varint(p, pairs[j].epoch);
        p = sl_put_varint(p, pairs[j].file);
        p = sl_put_varint(p, pairs[j].lo);
    }
    *p++ = (uint8_t)w;
    if (np > 1) {
        for (uint64_t i = 0; i < n; i++) {
            memset(p, pair_of[i], runs[i].count);
            p += runs[i].count;
        }
    }
    /* Every run has a record (checked above). */
    if (one_pair && num_records == n) {
        /* And so exactly one: a shuffled batch. */
        uint64_t base = pairs[0].lo;
#if defined(__x86_64__)
        if (n >= SL_PROV_SPAN_WIDE && sl_prov_span_vector()) {
            p = dense_singles_avx2(runs, n, base, w, p);
        } else
#endif
        {
            for (uint64_t i = 0; i < n; i++) {
                sl_put_le32(p, (uint32_t)(runs[i].begin - base));
                p += w;
            }
        }
    } else if (one_pair) {
        uint64_t base = pairs[0].lo;
        for (uint64_t i = 0; i < n; i++) {
            uint64_t from = runs[i].begin - base, count = runs[i].count;
            sl_put_le32(p, (uint32_t)from);
            p += w;
            for (uint64_t j = 1; j < count; j++) {
                sl_put_le32(p, (uint32_t)(from + j));
                p += w;
            }
        }
    } else {
        for (uint64_t i = 0; i < n; i++) {
            uint64_t from = runs[i].begin - pairs[pair_of[i]].lo, count = runs[i].count;
            for (uint64_t j = 0; j < count; j++) {
                sl_put_le32(p, (uint32_t)(from + j));
                p += w;
            }
        }
    }
    *len = (size_t)(p - buf);
    *out = buf;
    rc = 0;
done:
    if (pair_of != stack_of)
        free(pair_of);
    return rc;
}

uint64_t sl_provwire_max_runs(const uint8_t *p, size_t len, uint64_t num_records)
{
    /* Dense: one run a record, and a record takes a byte at least. */
    if (len > 0 && p[0] == DENSE_MARK)
        return num_records < len ? num_records : len;
    /* At most one run a record, and a run takes 2 bytes at least. */
    return num_records < len / 2 ? num_records : len / 2;
}

static int get_varint_slow(const uint8_t *p, size_t len, size_t *pos, uint64_t *v, const char *what, char *err,
                           size_t errlen);

/* Reads a varint at *pos of p[0..len); names what in the message. Values
 * of up to four bytes (up to 2^28: counts, distances within a shuffle
 * buffer over a few splits, a plain batch's first record in a range of a
 * hundred million) take the inline path. */
static inline int get_varint(const uint8_t *p, size_t len, size_t *pos, uint64_t *v, const char *what, char *err,
                             size_t errlen)
{
    size_t i = *pos;
    if (i < len && p[i] < 0x80) {
        *v = p[i];
        *pos = i + 1;
        return 0;
    }
    if (i + 1 < len && p[i + 1] < 0x80) {
        *v = (uint64_t)(p[i] & 0x7f) | (uint64_t)p[i + 1] << 7;
        *pos = i + 2;
        return 0;
    }
    if (i + 2 < len && p[i + 2] < 0x80) {
        *v = (uint64_t)(p[i] & 0x7f) | (uint64_t)(p[i + 1] & 0x7f) << 7 | (uint64_t)p[i + 2] << 14;
        *pos = i + 3;
        return 0;
    }
    if (i + 3 < len && p[i + 3] < 0x80) {
        *v = (uint64_t)(p[i] & 0x7f) | (uint64_t)(p[i + 1] & 0x7f) << 7 | (uint64_t)(p[i + 2] & 0x7f) << 14 |
             (uint64_t)p[i + 3] << 21;
        *pos = i + 4;
        return 0;
    }
    return get_varint_slow(p, len, pos, v, what, err, errlen);
}

static int get_varint_slow(const uint8_t *p, size_t len, size_t *pos, uint64_t *v, const char *what, char *err,
                      size_t errlen)
{
    uint64_t x = 0;
    size_t start = *pos;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*pos >= len)
            return sl_errf(err, errlen, SL_EPROTO, "provenance: %s at byte %zu runs past the end of the %zu bytes",
                           what, start, len);
        uint8_t b = p[(*pos)++];
        if (shift == 63 && b > 1)
            break;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return sl_errf(err, errlen, SL_EPROTO, "provenance: %s at byte %zu is not a varint of at most 64 bits", what,
                   start);
}

static int bad_count(uint64_t i, uint64_t count, uint64_t begin, uint64_t num_elements, uint64_t sum, char *err,
                     size_t errlen)
{
    return sl_errf(err, errlen, SL_EPROTO,
                   "provenance run %" PRIu64 " counts %" PRIu64 " records from %" PRIu64 "; the batch holds %" PRIu64
                   " records and the runs before it count %" PRIu64,
                   i, count, begin, num_elements, sum);
}

/* The dense form after its marker (at pos): P pairs (epoch, file, least
 * record), the width, then with P > 1 a pair index per record, then one
 * offset per record. Its size is fixed by num_elements, so it is checked
 * without reading the offsets (the indexes are read: each must name a
 * pair). */
static int read_dense(const uint8_t *p, size_t len, size_t pos, uint64_t num_elements, sl_provenance_run_t *out,
                      uint64_t cap, uint64_t *num_runs, char *err, size_t errlen)
{
    uint64_t np = 0;
    int rc = get_varint(p, len, &pos, &np, "the dense form's number of pairs", err, errlen);
    if (rc < 0)
        return rc;
    /* A pair takes 3 bytes at least. */
    if (np == 0 || np > DENSE_PAIRS || np > num_elements || np > (len - pos) / 3)
        return sl_errf(err, errlen, SL_EPROTO,
                       "provenance: dense form of %" PRIu64 " (epoch, file) pairs (1 to %d, at most one a record) "
                       "for %" PRIu64 " records in %zu bytes",
                       np, DENSE_PAIRS, num_elements, len);
    struct dense_pair pairs[DENSE_PAIRS];
    for (uint64_t k = 0; k < np; k++) {
        uint64_t epoch = 0, file = 0, lo = 0;
        if ((rc = get_varint(p, len, &pos, &epoch, "a dense pair's epoch", err, errlen)) < 0 ||
            (rc = get_varint(p, len, &pos, &file, "a dense pair's file index", err, errlen)) < 0 ||
            (rc = get_varint(p, len, &pos, &lo, "a dense pair's least record", err, errlen)) < 0)
            return rc;
        if (epoch > UINT32_MAX || file > UINT32_MAX)
            return sl_errf(err, errlen, SL_EPROTO,
                           "provenance: dense pair %" PRIu64 " is (epoch %" PRIu64 ", file %" PRIu64
                           "), more than 32 bits",
                           k, epoch, file);
        pairs[k] = (struct dense_pair){(uint32_t)epoch, (uint32_t)file, lo, 0};
    }
    if (pos >= len || p[pos] < 1 || p[pos] > 4)
        return sl_errf(err, errlen, SL_EPROTO, "provenance: dense form's width at byte %zu is %s, not 1 to 4 bytes",
                       pos, pos >= len ? "missing" : "out of range");
    unsigned w = p[pos++];
    size_t per = w + (np > 1);
    if ((len - pos) / per != num_elements || (len - pos) % per != 0)
        return sl_errf(err, errlen, SL_EPROTO,
                       "provenance: dense form has %zu bytes of %zu-byte records for %" PRIu64 " records", len - pos,
                       per, num_elements);
    for (uint64_t k = 0; k < np; k++)
        if (!dense_fits(pairs[k].lo, w))
            return sl_errf(err, errlen, SL_EPROTO,
                           "provenance: dense pair %" PRIu64 "'s records from %" PRIu64
                           " with %u-byte offsets run past 2^64",
                           k, pairs[k].lo, w);
    const uint8_t *idx = np > 1 ? p + pos : NULL, *q = p + pos + (np > 1 ? num_elements : 0);
    if (idx) {
        uint8_t most = 0;
        for (uint64_t i = 0; i < num_elements; i++)
            most = idx[i] > most ? idx[i] : most;
        if (most >= np)
            return sl_errf(err, errlen, SL_EPROTO, "provenance: a dense record names pair %u of %" PRIu64, most, np);
    }
    if (cap > 0) {
        uint32_t mask = w == 4 ? UINT32_MAX : (UINT32_C(1) << (8 * w)) - 1;
        /* All but the last few: 4 bytes loaded, w kept (no read past len). */
        uint64_t i = 0, safe = num_elements > 3 ? num_elements - 3 : 0, upto = cap < num_elements ? cap : num_elements;
        for (; i < upto; i++, q += w) {
            uint32_t off = 0;
            if (i < safe) {
                off = sl_get_le32(q) & mask;
            } else {
                for (unsigned k = 0; k < w; k++)
                    off |= (uint32_t)q[k] << (8 * k);
            }
            const struct dense_pair *d = &pairs[idx ? idx[i] : 0];
            out[i] = (sl_provenance_run_t){d->epoch, d->file, d->lo + off, 1};
        }
    }
    *num_runs = num_elements;
    return 0;
}

/* Pairs whose table and ends a read keeps on the stack. */
#define STACK_PAIRS 64

int sl_provwire_read(const uint8_t *p, size_t len, uint64_t num_elements, sl_provenance_run_t *out,
                     uint64_t *num_runs, char *err, size_t errlen)
{
    return sl_provwire_read_some(p, len, num_elements, out, out ? UINT64_MAX : 0, num_runs, err, errlen);
}

/* A batch of one run (most unshuffled ones), when it is well formed: one
 * pair, one run, every count and bound right, no byte left over; decoded
 * into *out. Else false, and the general reader (with its messages) has
 * it: what this accepts, it accepts the same. */
static inline bool read_one_run(const uint8_t *p, size_t len, uint64_t num_elements, sl_provenance_run_t *out)
{
    size_t pos;
    uint64_t epoch, file, n, dist, count;
    if (len >= 6 && p[0] == 1 && p[1] < 0x80 && p[2] < 0x80 && p[3] == 1) {
        /* Epoch and file index below 128, a byte each (most batches). */
        epoch = p[1];
        file = p[2];
        pos = 4;
    } else {
        pos = 1;
        if (p[0] != 1 || sl_get_varint(p, len, &pos, &epoch) < 0 || sl_get_varint(p, len, &pos, &file) < 0 ||
            sl_get_varint(p, len, &pos, &n) < 0 || n != 1)
            return false;
    }
    if (sl_get_varint(p, len, &pos, &dist) < 0 || sl_get_varint(p, len, &pos, &count) < 0 || pos != len)
        return false;
    uint64_t begin = sl_unzigzag(dist);
    if (epoch > UINT32_MAX || file > UINT32_MAX || count == 0 || count != num_elements || begin + count < begin)
        return false;
    *out = (sl_provenance_run_t){(uint32_t)epoch, (uint32_t)file, begin, count};
    return true;
}

int sl_provwire_read_some(const uint8_t *p, size_t len, uint64_t num_elements, sl_provenance_run_t *out, uint64_t cap,
                          uint64_t *num_runs, char *err, size_t errlen)
{
    sl_provenance_run_t one;
    if (len > 0 && read_one_run(p, len, num_elements, &one)) {
        if (out && cap > 0)
            *out = one;
        *num_runs = 1;
        return 0;
    }
    return sl_provwire_read_general(p, len, num_elements, out, cap, num_runs, err, errlen);
}

int sl_provwire_read_general(const uint8_t *p, size_t len, uint64_t num_elements, sl_provenance_run_t *out,
                             uint64_t cap, uint64_t *num_runs, char *err, size_t errlen)
{
    *num_runs = 0;
    if (len == 0)
        return 0;
    if (!out)
        cap = 0;
    /* The dense form's marker is the one byte 0, as sl_provwire_max_runs()
     * tells it: a longer varint of 0 is a runs form of no pairs (refused). */
    if (p[0] == DENSE_MARK)
        return read_dense(p, len, 1, num_elements, out, cap, num_runs, err, errlen);
    size_t pos = 0;
    uint64_t num_pairs = 0, n = 0;
    int rc = get_varint(p, len, &pos, &num_pairs, "the number of (epoch, file) pairs", err, errlen);
    if (rc < 0)
        return rc;
    /* A pair takes at least 2 bytes and a run as many; there are at most
     * as many pairs as runs and runs as elements. */
    if (num_pairs == 0 || num_pairs > num_elements || num_pairs > (len - pos) / 2)
        return sl_errf(err, errlen, SL_EPROTO,
                       "provenance: %" PRIu64 " (epoch, file) pairs for %" PRIu64 " elements in %zu bytes",
                       num_pairs, num_elements, len);
    /* Each pair's (epoch, file) and where its last run ended. */
    struct pair {
        uint32_t epoch, file;
        uint64_t end;
    } stack[STACK_PAIRS], *pairs = stack;
    if (num_pairs > STACK_PAIRS && !(pairs = malloc(num_pairs * sizeof *pairs)))
        return sl_errf(err, errlen, -ENOMEM, "provenance: out of memory for %" PRIu64 " pairs", num_pairs);
    for (uint64_t k = 0; k < num_pairs; k++) {
        uint64_t epoch = 0, file = 0;
        if ((rc = get_varint(p, len, &pos, &epoch, "a pair's epoch", err, errlen)) < 0 ||
            (rc = get_varint(p, len, &pos, &file, "a pair's file index", err, errlen)) < 0)
            goto done;
        if (epoch > UINT32_MAX || file > UINT32_MAX) {
            rc = sl_errf(err, errlen, SL_EPROTO,
                         "provenance: pair %" PRIu64 " is (epoch %" PRIu64 ", file %" PRIu64 "), more than 32 bits", k,
                         epoch, file);
            goto done;
        }
        pairs[k] = (struct pair){(uint32_t)epoch, (uint32_t)file, 0};
    }
    if ((rc = get_varint(p, len, &pos, &n, "the number of runs", err, errlen)) < 0)
        goto done;
    size_t min_run = num_pairs > 1 ? 3 : 2;
    if (n < num_pairs || n > num_elements || n > (len - pos) / min_run) {
        rc = sl_errf(err, errlen, SL_EPROTO,
                     "provenance: %" PRIu64 " runs of %" PRIu64 " pairs for %" PRIu64
                     " elements, in %zu bytes left of %zu",
                     n, num_pairs, num_elements, len - pos, len);
        goto done;
    }
    uint64_t sum = 0;
    if (num_pairs == 1) {
        /* One pair, no indexes (most batches): the loop below without the
         * table's loads and stores. */
        uint64_t end = 0;
        for (uint64_t i = 0; i < n; i++) {
            uint64_t dist = 0, count = 0;
            if ((rc = get_varint(p, len, &pos, &dist, "a run's begin", err, errlen)) < 0 ||
                (rc = get_varint(p, len, &pos, &count, "a run's count", err, errlen)) < 0)
                goto done;
            uint64_t begin = end + sl_unzigzag(dist);
            if (count == 0 || count > num_elements - sum || begin + count < begin) {
                rc = bad_count(i, count, begin, num_elements, sum, err, errlen);
                goto done;
            }
            if (i < cap)
                out[i] = (sl_provenance_run_t){pairs[0].epoch, pairs[0].file, begin, count};
            end = begin + count;
            sum += count;
        }
    }
    for (uint64_t i = 0; num_pairs > 1 && i < n; i++) {
        uint64_t k = 0, dist = 0, count = 0;
        if ((rc = get_varint(p, len, &pos, &k, "a run's pair", err, errlen)) < 0 ||
            (rc = get_varint(p, len, &pos, &dist, "a run's begin", err, errlen)) < 0 ||
            (rc = get_varint(p, len, &pos, &count, "a run's count", err, errlen)) < 0)
            goto done;
        if (k >= num_pairs) {
            rc = sl_errf(err, errlen, SL_EPROTO, "provenance run %" PRIu64 ": pair %" PRIu64 " of %" PRIu64, i, k,
                         num_pairs);
            goto done;
        }
        uint64_t begin = pairs[k].end + sl_unzigzag(dist);
        if (count == 0 || count > num_elements - sum || begin + count < begin) {
            rc = bad_count(i, count, begin, num_elements, sum, err, errlen);
            goto done;
        }
        if (i < cap)
            out[i] = (sl_provenance_run_t){pairs[k].epoch, pairs[k].file, begin, count};
        pairs[k].end = begin + count;
        sum += count;
    }
    if (sum != num_elements) {
        rc = sl_errf(err, errlen, SL_EPROTO, "provenance runs count %" PRIu64 " records, the batch holds %" PRIu64,
                     sum, num_elements);
        goto done;
    }
    if (pos != len) {
        rc = sl_errf(err, errlen, SL_EPROTO, "provenance: %zu bytes left over after the last run, at byte %zu of %zu",
                     len - pos, pos, len);
        goto done;
    }
    *num_runs = n;
    rc = 0;
done:
    if (pairs != stack)
        free(pairs);
    return rc;
}

int sl_provwire_decode(const uint8_t *p, size_t len, uint64_t num_elements, sl_provenance_run_t **runs,
                       uint64_t *num_runs, char *err, size_t errlen)
{
    *runs = NULL;
    int rc = sl_provwire_read(p, len, num_elements, NULL, num_runs, err, errlen);
    if (rc < 0 || *num_runs == 0)
        return rc;
    sl_provenance_run_t *out = malloc(*num_runs * sizeof *out);
    if (!out) {
        uint64_t n = *num_runs;
        *num_runs = 0;
        return sl_errf(err, errlen, -ENOMEM, "provenance: out of memory for %" PRIu64 " runs", n);
    }
    rc = sl_provwire_read(p, len, num_elements, out, num_runs, err, errlen);
    if (rc < 0) {
        free(out);
        return rc;
    }
    *runs = out;
    return 0;
}

/*
 * Split-done notices (docs/protocol.md, "Split-done notices"):
 *
 *   varint N                      notices, N >= 1
 *   N x (varint zigzag(split_id - previous split_id), varint epoch,
 *        varint file_index, varint begin, varint end - begin,
 *        varint delivered)
 *
 * with a previous split_id of 0 before the first. Every field takes at
 * least a byte, so a notice takes at least NOTICE_MIN_BYTES.
 */
#define NOTICE_MIN_BYTES 6

int sl_provwire_encode_done(const sl_split_done_t *d, size_t n, uint8_t **out, size_t *len)
{
    return sl_provwire_encode_done_in(d, n, NULL, 0, out, len);
}

int sl_provwire_encode_done_in(const sl_split_done_t *d, size_t n, uint8_t *room, size_t room_len, uint8_t **out,
                               size_t *len)
{
    *out = NULL;
    *len = 0;
    if (n == 0 || n > SIZE_MAX / (NOTICE_MIN_BYTES * SL_VARINT_MAX) - 1)
        return -ENOMEM;
    size_t cap = SL_VARINT_MAX + n * NOTICE_MIN_BYTES * SL_VARINT_MAX;
    uint8_t *buf = cap <= room_len ? room : malloc(cap);
    if (!buf)
        return -ENOMEM;
    uint8_t *p = sl_put_varint(buf, n);
    uint64_t prev = 0;
    for (size_t i = 0; i < n; i++) {
        p = sl_put_varint(p, sl_zigzag(d[i].split_id - prev));
        p = sl_put_varint(p, d[i].epoch);
        p = sl_put_varint(p, d[i].file_index);
        p = sl_put_varint(p, d[i].begin);
        p = sl_put_varint(p, d[i].end - d[i].begin);
        p = sl_put_varint(p, d[i].delivered);
        prev = d[i].split_id;
    }
    *len = (size_t)(p - buf);
    *out = buf == room ? room : shrink(buf, cap, *len);
    return 0;
}

int sl_provwire_read_done(const uint8_t *p, size_t len, sl_split_done_t *out, size_t cap, uint64_t *num, char *err,
                          size_t errlen)
{
    *num = 0;
    if (len == 0)
        return 0;
    size_t pos = 0;
    uint64_t n = 0;
    int rc = get_varint(p, len, &pos, &n, "the number of split-done notices", err, errlen);
    if (rc < 0)
        return rc;
    if (n == 0 || n > (len - pos) / NOTICE_MIN_BYTES)
        return sl_errf(err, errlen, SL_EPROTO, "split-done notices: %" PRIu64 " of them in %zu bytes", n, len);
    if (n > cap)
        out = NULL; /* counted only */
    uint64_t prev = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t id = 0, epoch = 0, file = 0, begin = 0, count = 0, delivered = 0;
        if ((rc = get_varint(p, len, &pos, &id, "a split-done notice's split id", err, errlen)) < 0 ||
            (rc = get_varint(p, len, &pos, &epoch, "a split-done notice's epoch", err, errlen)) < 0 ||
            (rc = get_varint(p, len, &pos, &file, "a split-done notice's file index", err, errlen)) < 0 ||
            (rc = get_varint(p, len, &pos, &begin, "a split-done notice's begin", err, errlen)) < 0 ||
            (rc = get_varint(p, len, &pos, &count, "a split-done notice's length", err, errlen)) < 0 ||
            (rc = get_varint(p, len, &pos, &delivered, "a split-done notice's delivered count", err, errlen)) < 0)
            return rc;
        if (epoch > UINT32_MAX || file > UINT32_MAX || begin + count < begin || delivered > count)
            return sl_errf(err, errlen, SL_EPROTO,
                           "split-done notice %" PRIu64 ": epoch %" PRIu64 ", file %" PRIu64 ", [%" PRIu64
                           ", +%" PRIu64 "), %" PRIu64 " delivered: out of range",
                           i, epoch, file, begin, count, delivered);
        prev += sl_unzigzag(id);
        if (out)
            out[i] = (sl_split_done_t){.split_id = prev,
                                       .epoch = (uint32_t)epoch,
                                       .file_index = (uint32_t)file,
                                       .begin = begin,
                                       .end = begin + count,
                                       .delivered = delivered};
    }
    if (pos != len)
        return sl_errf(err, errlen, SL_EPROTO, "split-done notices: %zu bytes left over after the last, at byte %zu",
                       len - pos, pos);
    *num = n;
    return 0;
}
