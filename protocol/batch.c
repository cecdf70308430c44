/*
 * batch.c: freeing and checking a finished batch (batch.h).
 *
 * sl_wire_batch_validate() is what a receiver runs on a batch decoded from
 * the wire before it hands out pointers into it, so it trusts nothing:
 * every count is multiplied with an overflow check and every offset is
 * compared with the buffer before a byte is read.
 *
 * Ragged components: shape[0] is the number of rows and shape[1] the ragged
 * dimension (its value is not used; -1 by convention); the row splits are
 * rows + 1 int64 that start at 0 and never decrease, and the data holds
 * splits[rows] * (shape[2] * ... * shape[rank-1]) values.
 */
#include "batch.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "big_alloc.h"
#include "le.h"
#include "provwire.h"
#include "recycle.h"

SL_RECYCLER_DEFINE(batches, sizeof(sl_wire_batch_t))

sl_wire_batch_t *sl_wire_batch_alloc(void)
{
    return sl_recycle_alloc(&batches);
}

void sl_wire_batch_free(sl_wire_batch_t *b)
{
    if (!b)
        return;
    /* Kept for the pipeline's next batch where it is large: freed, a
     * worker's batch block would go back to the kernel with its heap and
     * the next one be faulted in and zeroed again (big_alloc.h). */
    sl__big_free(b->data);
    free(b->prov_heap);
    if (b->prov_wire != b->prov_wire_one)
        free(b->prov_wire);
    if (b->tally != b->tally_one)
        free(b->tally);
    sl_recycle_free(&batches, b);
}

size_t sl_wire_batch_held_bytes(const sl_wire_batch_t *b)
{
    size_t n = b->size && sl__big_is_foreign(b->data) ? 0 : b->size;
    if (b->prov_heap)
        n += (size_t)b->prov_n * sizeof *b->prov_heap;
    if (b->prov_wire && b->prov_wire != b->prov_wire_one)
        n += b->prov_wire_len;
    if (b->tally && b->tally != b->tally_one)
        n += (size_t)b->ntally * sizeof *b->tally;
    return n;
}

void sl_wire_batch_drop_runs(sl_wire_batch_t *b)
{
    if (!b->prov_heap || b->prov_n < 2 || !b->prov_wire)
        return;
    free(b->prov_heap);
    b->prov_heap = NULL;
}

int sl__wire_batch_encode_prov(sl_wire_batch_t *b, bool dense)
{
    if (b->prov_n > 1 && !b->prov_heap) {
        /* Dropped once encoded in the dense form, and now wanted as runs:
         * decoded back from that form, one run a record (the same
         * records). */
        sl_provenance_run_t *runs = NULL;
        uint64_t n = 0;
        char err[256];
        if (!b->prov_wire || sl_provwire_decode(b->prov_wire, b->prov_wire_len, b->prov_records, &runs, &n, err,
                                                sizeof err) < 0 || n < 2) {
            free(runs);
            return -ENOMEM; /* cannot be: this worker encoded them */
        }
        b->prov_heap = runs;
        b->prov_n = n;
    }
    if (b->prov_wire && b->prov_wire != b->prov_wire_one)
        free(b->prov_wire);
    b->prov_wire = NULL;
    b->prov_wire_len = 0;
    b->prov_wire_dense = false;
    if (b->prov_n == 0)
        return 0;
    const sl_provenance_run_t *runs = sl_wire_batch_prov(b);
    if (b->prov_n == 1 && runs[0].count > 1) {
        /* One run of records (most unshuffled batches): the dense form,
         * an offset a record, never applies. */
        _Static_assert(sizeof b->prov_wire_one >= SL_PROVWIRE_ONE_MAX, "a batch holds one run's encoding");
        b->prov_records = runs[0].count;
        b->prov_wire = b->prov_wire_one;
        b->prov_wire_len = sl_provwire_encode_one(&runs[0], b->prov_wire_one);
        return 0;
    }
    if (!b->prov_span_known) {
        sl_prov_span(runs, b->prov_n, &b->prov_span);
        b->prov_span_known = true;
    }
    b->prov_records = b->prov_span.records;
    if (dense) {
        int rc = sl_provwire_encode_dense_span(runs, b->prov_n, b->prov_records, &b->prov_span, &b->prov_wire,
                                               &b->prov_wire_len);
        if (rc <= 0) {
            b->prov_wire_dense = rc == 0;
            return rc;
        }
    }
    return sl_provwire_encode_in(runs, b->prov_n, b->prov_wire_one, sizeof b->prov_wire_one, &b->prov_wire,
                                 &b->prov_wire_len);
}

static int bad(char *err, size_t errlen, int i, const sl_component_t *c, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static int bad(char *err, size_t errlen, int i, const sl_component_t *c, const char *fmt, ...)
{
    if (err && errlen > 0) {
        char msg[200];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        if (c && memchr(c->name, '\0', sizeof c->name))
            snprintf(err, errlen, "component %d (\"%s\"): %s", i, c->name, msg);
        else if (c)
            snprintf(err, errlen, "component %d: %s", i, msg);
        else
            snprintf(err, errlen, "batch: %s", msg);
    }
    return SL_EPROTO;
}

/* Checks that [off, off + len) lies inside a buffer of size bytes. */
static bool inside(uint64_t off, uint64_t len, size_t size)
{
    return off <= size && len <= size - off;
}

/* Checks n values of c's dtype at [c->offset, c->offset + c->length). */
static int check_values(const sl_wire_batch_t *b, int i, const sl_component_t *c, uint64_t n, char *err,
                        size_t errlen)
{
    uint64_t want;
    if (c->dtype != SL_DTYPE_BYTES) {
        if (__builtin_mul_overflow(n, (uint64_t)sl_dtype_size(c->dtype), &want) || want != c->length)
            return bad(err, errlen, i, c, "%llu bytes for %llu values of %s", (unsigned long long)c->length,
                       (unsigned long long)n, sl_dtype_name(c->dtype));
        return 0;
    }
    /* Bytes: n + 1 offsets relative to the end of the offsets, from 0 up
     * to the length of the values. */
    uint64_t head;
    if (__builtin_add_overflow(n, 1, &head) || __builtin_mul_overflow(head, 8, &head) || head > c->length)
        return bad(err, errlen, i, c, "%llu bytes cannot hold the offsets of %llu strings",
                   (unsigned long long)c->length, (unsigned long long)n);
    const uint8_t *p = b->data + c->offset;
    uint64_t prev = 0;
    for (uint64_t k = 0; k <= n; k++) {
        uint64_t o = sl_get_le64(p + 8 * k);
        if ((k == 0 && o != 0) || o < prev)
            return bad(err, errlen, i, c, "string offset %llu is %llu, after %llu", (unsigned long long)k,
                       (unsigned long long)o, (unsigned long long)prev);
        prev = o;
    }
    if (prev != c->length - head)
        return bad(err, errlen, i, c, "string offsets end at %llu, the values hold %llu bytes",
                   (unsigned long long)prev, (unsigned long long)(c->length - head));
    return 0;
}

static int check_component(const sl_wire_batch_t *b, int i, char *err, size_t errlen)
{
    const sl_component_t *c = &b->components[i];
    if (!memchr(c->name, '\0', sizeof c->name) || c->name[0] == '\0')
        return bad(err, errlen, i, c, "name empty or not terminated");
    for (int k = 0; k < i; k++) {
        if (strcmp(b->components[k].name, c->name) == 0)
            return bad(err, errlen, i, c, "name also used by component %d", k);
    }
    if (c->dtype <= SL_DTYPE_INVALID || c->dtype >= SL_DTYPE_COUNT_)
        return bad(err, errlen, i, c, "invalid dtype %d", (int)c->dtype);
    if (c->rank < 0 || c->rank > SL_MAX_RANK)
        return bad(err, errlen, i, c, "rank %d out of [0, %d]", c->rank, SL_MAX_RANK);
    if (c->ragged && c->rank < 1)
        return bad(err, errlen, i, c, "ragged with rank 0");
    for (int d = 0; d < c->rank; d++) {
        if (c->shape[d] < 0 && !(c->ragged && d == 1))
            return bad(err, errlen, i, c, "dimension %d is %lld", d, (long long)c->shape[d]);
    }
    if (!inside(c->offset, c->length, b->size))
        return bad(err, errlen, i, c, "bytes [%llu, +%llu) outside the %zu bytes of the batch",
                   (unsigned long long)c->offset, (unsigned long long)c->length, b->size);
    /* Readers take values, string offsets and row splits in place from a
     * malloc'd buffer, so each must sit at a multiple of its size. */
    uint64_t align = c->dtype == SL_DTYPE_BYTES ? 8 : sl_dtype_size(c->dtype);
    if (c->offset % align != 0)
        return bad(err, errlen, i, c, "offset %llu is not aligned to %llu bytes", (unsigned long long)c->offset,
                   (unsigned long long)align);
    if (c->ragged && c->splits_offset % 8 != 0)
        return bad(err, errlen, i, c, "row splits offset %llu is not aligned to 8 bytes",
                   (unsigned long long)c->splits_offset);

    /* n counts the values the data must hold. */
    uint64_t n = 1;
    int first = 0;
    if (c->ragged) {
        uint64_t rows = (uint64_t)c->shape[0], want;
        if (__builtin_add_overflow(rows, 1, &want) || __builtin_mul_overflow(want, 8, &want) ||
            want != c->splits_length)
            return bad(err, errlen, i, c, "%llu bytes of row splits for %llu rows",
                       (unsigned long long)c->splits_length, (unsigned long long)rows);
        if (!inside(c->splits_offset, c->splits_length, b->size))
            return bad(err, errlen, i, c, "row splits [%llu, +%llu) outside the %zu bytes of the batch",
                       (unsigned long long)c->splits_offset, (unsigned long long)c->splits_length, b->size);
        const uint8_t *s = b->data + c->splits_offset;
        int64_t prev = 0;
        for (uint64_t r = 0; r <= rows; r++) {
            int64_t v = (int64_t)sl_get_le64(s + 8 * r);
            if ((r == 0 && v != 0) || v < prev)
                return bad(err, errlen, i, c, "row split %llu is %lld, after %lld", (unsigned long long)r,
                           (long long)v, (long long)prev);
            prev = v;
        }
        n = (uint64_t)prev;
        first = 2;
    }
    for (int d = first; d < c->rank; d++) {
        if (__builtin_mul_overflow(n, (uint64_t)c->shape[d], &n))
            return bad(err, errlen, i, c, "shape overflows");
    }
    return check_values(b, i, c, n, err, errlen);
}

int sl_wire_batch_validate(const sl_wire_batch_t *b, char *err, size_t errlen)
{
    if (b->num_components < 0 || b->num_components > SL_MAX_COMPONENTS)
        return bad(err, errlen, 0, NULL, "%d components, at most %d allowed", b->num_components, SL_MAX_COMPONENTS);
    if (b->size > 0 && !b->data)
        return bad(err, errlen, 0, NULL, "%zu bytes but no data", b->size);
    for (int i = 0; i < b->num_components; i++) {
        int rc = check_component(b, i, err, errlen);
        if (rc < 0)
            return rc;
    }
    return 0;
}
