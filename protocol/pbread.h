/*
 * pbread.h: the protobuf reader of the hand decoders (getelem.c,
 * getsplit.c), which accept exactly what pb_decode() accepts into the same
 * struct: its varint rules (a 32-bit varint may carry a sign extension, a
 * 64-bit one at most 10 bytes), its wire type checks, its skipping of
 * unknown fields. On a failure the reader says what was wrong, in which
 * field, and where (the caller formats it).
 */
#ifndef SL_PBREAD_H
#define SL_PBREAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "sluice.h"
#include "varint.h"

enum { WT_VARINT = 0, WT_64BIT = 1, WT_LEN = 2, WT_32BIT = 5 };

/* What is left to read, and on failure what was wrong (a constant string)
 * and in which field. */
struct rd {
    const uint8_t *p, *end;
    const char *why;
    const char *field;
    int component; /* the element of a repeated submessage the field is in, -1: none */
};

static inline bool fail(struct rd *r, const char *why)
{
    r->why = why;
    return false;
}

/* pb_decode_varint(): at most 10 bytes, the 10th 0 or 1, which are
 * sl_get_varint()'s rules too. It fails at the 10th byte or at the end:
 * with 10 bytes left it was the 10th. */
static inline bool get_u64(struct rd *r, uint64_t *v)
{
    if (r->p < r->end && *r->p < 0x80) {
        *v = *r->p++;
        return true;
    }
    /* Two bytes (offsets and counts of a batch of a few KB) inline too. */
    if (r->end - r->p >= 2 && r->p[1] < 0x80) {
        *v = (uint64_t)(r->p[0] & 0x7f) | (uint64_t)r->p[1] << 7;
        r->p += 2;
        return true;
    }
    size_t pos = 0, left = (size_t)(r->end - r->p);
    if (sl_get_varint(r->p, left, &pos, v) < 0)
        return fail(r, left >= SL_VARINT_MAX ? "varint overflow" : "end-of-stream");
    r->p += pos;
    return true;
}

/* pb_decode_varint32(): bits past the 32nd must be zero, or a sign
 * extension of a value whose bit 31 is set. */
static inline bool get_u32(struct rd *r, uint32_t *v)
{
    if (r->p == r->end)
        return fail(r, "end-of-stream");
    uint8_t b = *r->p++;
    if (!(b & 0x80)) {
        *v = b;
        return true;
    }
    uint32_t x = b & 0x7F;
    unsigned bitpos = 7;
    do {
        if (r->p == r->end)
            return fail(r, "end-of-stream");
        b = *r->p++;
        if (bitpos >= 32) {
            uint8_t sign = bitpos < 63 ? 0xFF : 0x01;
            bool valid = (b & 0x7F) == 0 || ((x >> 31) != 0 && b == sign);
            if (bitpos >= 64 || !valid)
                return fail(r, "varint overflow");
        } else if (bitpos == 28) {
            if ((b & 0x70) != 0 && (b & 0x78) != 0x78)
                return fail(r, "varint overflow");
            x |= (uint32_t)(b & 0x0F) << 28;
        } else {
            x |= (uint32_t)(b & 0x7F) << bitpos;
        }
        bitpos += 7;
    } while (b & 0x80);
    *v = x;
    return true;
}

/* A field of no tag here: skipped as pb_skip_field() does. */
static inline bool skip(struct rd *r, unsigned wt)
{
    uint32_t n;
    switch (wt) {
    case WT_VARINT:
        do {
            if (r->p == r->end)
                return fail(r, "end-of-stream");
        } while (*r->p++ & 0x80);
        return true;
    case WT_64BIT:
        n = 8;
        break;
    case WT_32BIT:
        n = 4;
        break;
    case WT_LEN:
        if (!get_u32(r, &n))
            return false;
        break;
    default:
        return fail(r, "invalid wire_type");
    }
    if ((size_t)(r->end - r->p) < n)
        return fail(r, "end-of-stream");
    r->p += n;
    return true;
}

static inline bool want(struct rd *r, unsigned wt, unsigned expect, const char *field)
{
    r->field = field;
    return wt == expect || fail(r, "wrong wire type");
}

static inline bool get_uint64(struct rd *r, unsigned wt, const char *field, uint64_t *v)
{
    return want(r, wt, WT_VARINT, field) && get_u64(r, v);
}

static inline bool get_uint32(struct rd *r, unsigned wt, const char *field, uint32_t *v)
{
    uint64_t x;
    if (!get_uint64(r, wt, field, &x))
        return false;
    if (x > UINT32_MAX)
        return fail(r, "integer too large");
    *v = (uint32_t)x;
    return true;
}

static inline bool get_bool(struct rd *r, unsigned wt, const char *field, bool *v)
{
    uint32_t x;
    if (!want(r, wt, WT_VARINT, field) || !get_u32(r, &x))
        return false;
    *v = x != 0;
    return true;
}

/* A length-delimited field's bounds: [r->p, *end). */
static inline bool get_len(struct rd *r, const uint8_t **end)
{
    uint32_t n;
    if (!get_u32(r, &n))
        return false;
    if ((size_t)(r->end - r->p) < n)
        return fail(r, "parent stream too short");
    *end = r->p + n;
    return true;
}

/* The next field's tag and wire type; false at a failure (r->why set). */
static inline bool get_key(struct rd *r, uint32_t *tag, unsigned *wt)
{
    uint32_t k;
    if (r->p < r->end && *r->p < 0x80)
        k = *r->p++;
    else if (!get_u32(r, &k))
        return false;
    *tag = k >> 3;
    *wt = k & 7;
    if (*tag == 0)
        return fail(r, "zero tag");
    return true;
}

/* One field of a message, its tag and wire type read: false at a failure. */
typedef bool (*field_fn)(struct rd *r, uint32_t tag, unsigned wt, void *m);

/* Reads a message's fields to r's end, each by field(): inlined into each
 * caller, so that field() is a direct call there. */
static inline __attribute__((always_inline)) bool get_fields(struct rd *r, field_fn field, void *m)
{
    while (r->p < r->end) {
        uint32_t tag;
        unsigned wt;
        r->field = NULL;
        if (!get_key(r, &tag, &wt) || !field(r, tag, wt, m))
            return false;
    }
    return true;
}

/* Reads a submessage, [r->p, end), into m by field(); on a failure the
 * reader's place and reason become r's, in element `index` of its array. */
static inline __attribute__((always_inline)) bool get_sub(struct rd *r, const uint8_t *end, field_fn field, void *m,
                                                          int index)
{
    struct rd sub = {r->p, end, NULL, NULL, -1};
    if (!get_fields(&sub, field, m)) {
        r->p = sub.p;
        r->why = sub.why;
        r->field = sub.field;
        r->component = index;
        return false;
    }
    r->p = end;
    return true;
}

/* SL_EPROTO, with r's failure in err: "components[2].shape: array overflow
 * at byte 71", array naming the repeated submessage. */
static inline int failed(const struct rd *r, const uint8_t *buf, const char *array, char *err, size_t errlen)
{
    char at[40] = "";
    if (r->component >= 0)
        snprintf(at, sizeof at, "%s[%d]%s", array, r->component, r->field ? "." : "");
    snprintf(err, errlen, "%s%s%s%s at byte %zu", at, r->field ? r->field : "", r->field || at[0] ? ": " : "", r->why,
             (size_t)(r->p - buf));
    return SL_EPROTO;
}

#endif
