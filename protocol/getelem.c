/*
 * getelem.c: GET_ELEMENT's request and answer without nanopb's tables.
 *
 * A batch costs one request and one answer. nanopb's codec walks its field
 * descriptors for every field, about 300 instructions each (callgrind); with
 * the answer's eight DYNAMIC fields that was most of what DYNAMIC added per
 * batch (docs/sharding.md). Here each field is a switch case.
 *
 * Encoding writes nanopb's bytes: fields in tag order, proto3 zeros left
 * out, task_key always (a fixed-length bytes field), repeated int64 packed,
 * a submessage's length before it. Decoding follows pb_decode() case by
 * case, including its varint rules (a 32-bit varint may carry a sign
 * extension, a 64-bit one at most 10 bytes), last-one-wins for a field seen
 * twice, and which fields it zeroes first (a component's shape array is
 * not). test_getelem checks all of it against nanopb.
 */
#include "getelem.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "sluice.h"
#include "varint.h"

enum { WT_VARINT = 0, WT_64BIT = 1, WT_LEN = 2, WT_32BIT = 5 };

#define KEY(tag, wt) ((uint8_t)((tag) << 3 | (wt))) /* a tag below 16: one byte */
/* A tag from 16 to 2047: the key's two varint bytes, low first. */
#define KEY2(tag, wt) ((uint16_t)((((tag) << 3 | (wt)) & 0x7f) | 0x80 | ((((tag) << 3 | (wt)) >> 7) << 8)))

/* ---- encoding: the caller's buffer holds the generated maximum size ---- */

/* A proto3 uint64 or uint32 field: left out when 0. */
static inline uint8_t *put_u64(uint8_t *p, uint8_t key, uint64_t v)
{
    if (v) {
        *p++ = key;
        p = sl_put_varint(p, v);
    }
    return p;
}

/* put_u64() for a field of a two-byte key (KEY2). */
static inline uint8_t *put_u64_2(uint8_t *p, uint16_t key, uint64_t v)
{
    if (v) {
        *p++ = (uint8_t)key;
        *p++ = (uint8_t)(key >> 8);
        p = sl_put_varint(p, v);
    }
    return p;
}

static inline size_t u64_len(uint64_t v)
{
    return v ? 1 + sl_varint_len(v) : 0;
}

int sl_getelem_req_encode(const sluice_GetElementRequest *m, uint8_t *buf, size_t *len)
{
    uint8_t *p = buf;
    p = put_u64(p, KEY(sluice_GetElementRequest_task_id_tag, WT_VARINT), m->task_id);
    p = put_u64(p, KEY(sluice_GetElementRequest_client_id_tag, WT_VARINT), m->client_id);
    p = put_u64(p, KEY(sluice_GetElementRequest_coordinated_tag, WT_VARINT), m->coordinated);
    p = put_u64(p, KEY(sluice_GetElementRequest_round_tag, WT_VARINT), m->round);
    p = put_u64(p, KEY(sluice_GetElementRequest_consumer_index_tag, WT_VARINT), m->consumer_index);
    p = put_u64(p, KEY(sluice_GetElementRequest_provenance_tag, WT_VARINT), m->provenance);
    *p++ = KEY(sluice_GetElementRequest_task_key_tag, WT_LEN);
    *p++ = (uint8_t)sizeof m->task_key;
    memcpy(p, m->task_key, sizeof m->task_key);
    p += sizeof m->task_key;
    p = put_u64(p, KEY(sluice_GetElementRequest_seq_tag, WT_VARINT), m->seq);
    p = put_u64(p, KEY(sluice_GetElementRequest_acked_below_tag, WT_VARINT), m->acked_below);
    p = put_u64(p, KEY(sluice_GetElementRequest_tallies_tag, WT_VARINT), m->tallies);
    p = put_u64(p, KEY(sluice_GetElementRequest_dense_provenance_tag, WT_VARINT), m->dense_provenance);
    p = put_u64(p, KEY(sluice_GetElementRequest_shm_tag, WT_VARINT), m->shm);
    p = put_u64(p, KEY(sluice_GetElementRequest_shm_mapped_tag, WT_VARINT), m->shm_mapped);
    p = put_u64(p, KEY(sluice_GetElementRequest_shm_released_tag, WT_VARINT), m->shm_released);
    p = put_u64(p, KEY(sluice_GetElementRequest_shm_tail_in_answer_tag, WT_VARINT), m->shm_tail_in_answer);
    *len = (size_t)(p - buf);
    return 0;
}

/* The length of a component's name, -1 when it has no NUL where nanopb
 * looks for one (within the field's size less one). */
static inline int name_len(const sluice_Component *c)
{
    const char *nul = memchr(c->name, '\0', sizeof c->name);
    return nul ? (int)(nul - c->name) : -1;
}

/* The shape's packed bytes (int64 as 64-bit varints, negatives in 10). */
static size_t shape_len(const sluice_Component *c)
{
    size_t n = 0;
    for (pb_size_t i = 0; i < c->shape_count; i++)
        n += sl_varint_len((uint64_t)c->shape[i]);
    return n;
}

static size_t component_len(const sluice_Component *c, size_t name, size_t shape)
{
    size_t n = name ? 1 + sl_varint_len(name) + name : 0;
    if (c->shape_count)
        n += 1 + sl_varint_len(shape) + shape;
    return n + u64_len(c->dtype) + u64_len(c->offset) + u64_len(c->length) + u64_len(c->ragged) +
           u64_len(c->splits_offset) + u64_len(c->splits_length);
}

static uint8_t *put_component(uint8_t *p, const sluice_Component *c, size_t name, size_t shape)
{
    if (name) {
        *p++ = KEY(sluice_Component_name_tag, WT_LEN);
        p = sl_put_varint(p, name);
        memcpy(p, c->name, name);
        p += name;
    }
    p = put_u64(p, KEY(sluice_Component_dtype_tag, WT_VARINT), c->dtype);
    if (c->shape_count) {
        *p++ = KEY(sluice_Component_shape_tag, WT_LEN);
        p = sl_put_varint(p, shape);
        for (pb_size_t i = 0; i < c->shape_count; i++)
            p = sl_put_varint(p, (uint64_t)c->shape[i]);
    }
    p = put_u64(p, KEY(sluice_Component_offset_tag, WT_VARINT), c->offset);
    p = put_u64(p, KEY(sluice_Component_length_tag, WT_VARINT), c->length);
    p = put_u64(p, KEY(sluice_Component_ragged_tag, WT_VARINT), c->ragged);
    p = put_u64(p, KEY(sluice_Component_splits_offset_tag, WT_VARINT), c->splits_offset);
    p = put_u64(p, KEY(sluice_Component_splits_length_tag, WT_VARINT), c->splits_length);
    return p;
}

int sl_getelem_resp_encode(const sluice_GetElementResponse *m, uint8_t *buf, size_t *len)
{
    const size_t max_components = sizeof m->components / sizeof m->components[0];
    const size_t max_dims = sizeof m->components[0].shape / sizeof m->components[0].shape[0];
    if (m->components_count > max_components)
        return SL_ETOOBIG;
    uint8_t *p = buf;
    p = put_u64(p, KEY(sluice_GetElementResponse_task_id_tag, WT_VARINT), m->task_id);
    p = put_u64(p, KEY(sluice_GetElementResponse_end_of_sequence_tag, WT_VARINT), m->end_of_sequence);
    p = put_u64(p, KEY(sluice_GetElementResponse_num_elements_tag, WT_VARINT), m->num_elements);
    for (pb_size_t i = 0; i < m->components_count; i++) {
        const sluice_Component *c = &m->components[i];
        int name = name_len(c);
        if (name < 0 || c->shape_count > max_dims)
            return SL_ETOOBIG;
        size_t shape = shape_len(c);
        *p++ = KEY(sluice_GetElementResponse_components_tag, WT_LEN);
        p = sl_put_varint(p, component_len(c, (size_t)name, shape));
        p = put_component(p, c, (size_t)name, shape);
    }
    p = put_u64(p, KEY(sluice_GetElementResponse_provenance_offset_tag, WT_VARINT), m->provenance_offset);
    p = put_u64(p, KEY(sluice_GetElementResponse_provenance_length_tag, WT_VARINT), m->provenance_length);
    p = put_u64(p, KEY(sluice_GetElementResponse_done_below_tag, WT_VARINT), m->done_below);
    p = put_u64(p, KEY(sluice_GetElementResponse_notices_offset_tag, WT_VARINT), m->notices_offset);
    p = put_u64(p, KEY(sluice_GetElementResponse_notices_length_tag, WT_VARINT), m->notices_length);
    p = put_u64(p, KEY(sluice_GetElementResponse_num_records_tag, WT_VARINT), m->num_records);
    p = put_u64(p, KEY(sluice_GetElementResponse_tallies_offset_tag, WT_VARINT), m->tallies_offset);
    p = put_u64(p, KEY(sluice_GetElementResponse_tallies_length_tag, WT_VARINT), m->tallies_length);
    const char *nul = memchr(m->shm_socket, '\0', sizeof m->shm_socket);
    if (!nul || m->shm_ticket.size > sizeof m->shm_ticket.bytes || m->shm_tail.size > sizeof m->shm_tail.bytes)
        return SL_ETOOBIG;
    size_t socket_len = (size_t)(nul - m->shm_socket);
    if (socket_len) {
        *p++ = KEY(sluice_GetElementResponse_shm_socket_tag, WT_LEN);
        p = sl_put_varint(p, socket_len);
        memcpy(p, m->shm_socket, socket_len);
        p += socket_len;
    }
    if (m->shm_ticket.size) {
        *p++ = KEY(sluice_GetElementResponse_shm_ticket_tag, WT_LEN);
        p = sl_put_varint(p, m->shm_ticket.size);
        memcpy(p, m->shm_ticket.bytes, m->shm_ticket.size);
        p += m->shm_ticket.size;
    }
    p = put_u64_2(p, KEY2(sluice_GetElementResponse_shm_offset_tag, WT_VARINT), m->shm_offset);
    p = put_u64_2(p, KEY2(sluice_GetElementResponse_shm_length_tag, WT_VARINT), m->shm_length);
    if (m->shm_tail.size) {
        p = sl_put_varint(p, (uint64_t)sluice_GetElementResponse_shm_tail_tag << 3 | WT_LEN);
        p = sl_put_varint(p, m->shm_tail.size);
        memcpy(p, m->shm_tail.bytes, m->shm_tail.size);
        p += m->shm_tail.size;
    }
    *len = (size_t)(p - buf);
    return 0;
}

/* ---- decoding ---- */

/* What is left to read, and on failure what was wrong (a constant string)
 * and in which field. */
struct rd {
    const uint8_t *p, *end;
    const char *why;
    const char *field;
    int component; /* the component the field is of, -1: none */
};

static bool fail(struct rd *r, const char *why)
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
static bool skip(struct rd *r, unsigned wt)
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

static bool get_uint32(struct rd *r, unsigned wt, const char *field, uint32_t *v)
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
static bool get_len(struct rd *r, const uint8_t **end)
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

static bool get_name(struct rd *r, unsigned wt, const char *field, char *name, size_t size)
{
    uint32_t n;
    if (!want(r, wt, WT_LEN, field) || !get_u32(r, &n))
        return false;
    if (n == UINT32_MAX)
        return fail(r, "size too large");
    if ((size_t)n + 1 > size)
        return fail(r, "string overflow");
    name[n] = '\0';
    if ((size_t)(r->end - r->p) < n)
        return fail(r, "end-of-stream");
    memcpy(name, r->p, n);
    r->p += n;
    return true;
}

static bool get_shape(struct rd *r, unsigned wt, sluice_Component *c)
{
    const pb_size_t max = sizeof c->shape / sizeof c->shape[0];
    uint64_t v;
    r->field = "shape";
    if (wt != WT_LEN) { /* one dim, unpacked */
        if (c->shape_count >= max)
            return fail(r, "array overflow");
        if (!want(r, wt, WT_VARINT, "shape") || !get_u64(r, &v))
            return false;
        c->shape[c->shape_count++] = (int64_t)v;
        return true;
    }
    const uint8_t *end;
    if (!get_len(r, &end))
        return false;
    struct rd sub = {r->p, end, NULL, "shape", -1};
    while (sub.p < sub.end && c->shape_count < max) {
        if (!get_u64(&sub, &v))
            return fail(r, "array overflow"); /* what nanopb says when a packed value fails */
        c->shape[c->shape_count++] = (int64_t)v;
    }
    if (sub.p != sub.end)
        return fail(r, "array overflow");
    r->p = end;
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

static bool component_field(struct rd *r, uint32_t tag, unsigned wt, void *m)
{
    sluice_Component *c = m;
    switch (tag) {
    case sluice_Component_name_tag: return get_name(r, wt, "name", c->name, sizeof c->name);
    case sluice_Component_dtype_tag: return get_uint32(r, wt, "dtype", &c->dtype);
    case sluice_Component_shape_tag: return get_shape(r, wt, c);
    case sluice_Component_offset_tag: return get_uint64(r, wt, "offset", &c->offset);
    case sluice_Component_length_tag: return get_uint64(r, wt, "length", &c->length);
    case sluice_Component_ragged_tag: return get_bool(r, wt, "ragged", &c->ragged);
    case sluice_Component_splits_offset_tag: return get_uint64(r, wt, "splits_offset", &c->splits_offset);
    case sluice_Component_splits_length_tag: return get_uint64(r, wt, "splits_length", &c->splits_length);
    default: return skip(r, wt);
    }
}

static bool get_components(struct rd *r, unsigned wt, sluice_GetElementResponse *m)
{
    const pb_size_t max = sizeof m->components / sizeof m->components[0];
    r->field = "components";
    if (m->components_count >= max)
        return fail(r, "array overflow");
    const uint8_t *end;
    if (!want(r, wt, WT_LEN, "components") || !get_len(r, &end))
        return false;
    /* What pb_decode() zeroes: every field but the shape's array. */
    sluice_Component *c = &m->components[m->components_count];
    memset(c->name, 0, sizeof c->name);
    c->dtype = 0;
    c->shape_count = 0;
    c->offset = c->length = c->splits_offset = c->splits_length = 0;
    c->ragged = false;
    struct rd sub = {r->p, end, NULL, NULL, -1};
    if (!get_fields(&sub, component_field, c)) {
        r->p = sub.p;
        r->why = sub.why;
        r->field = sub.field;
        r->component = m->components_count;
        return false;
    }
    m->components_count++;
    r->p = end;
    return true;
}

/* pb_dec_fixed_length_bytes(): empty is all zeros, else the exact size. */
static bool get_task_key(struct rd *r, unsigned wt, uint8_t key[16])
{
    uint32_t n;
    if (!want(r, wt, WT_LEN, "task_key") || !get_u32(r, &n))
        return false;
    if (n > PB_SIZE_MAX)
        return fail(r, "bytes overflow");
    if (n == 0) {
        memset(key, 0, 16);
        return true;
    }
    if (n != 16)
        return fail(r, "incorrect fixed length bytes size");
    if ((size_t)(r->end - r->p) < n)
        return fail(r, "end-of-stream");
    memcpy(key, r->p, n);
    r->p += n;
    return true;
}

/* pb_dec_bytes() into a static bytes field of at most cap bytes. */
static bool get_bytes(struct rd *r, unsigned wt, const char *field, pb_size_t *size, uint8_t *bytes, size_t cap)
{
    uint32_t n;
    if (!want(r, wt, WT_LEN, field) || !get_u32(r, &n))
        return false;
    if (n > cap)
        return fail(r, "bytes overflow");
    if ((size_t)(r->end - r->p) < n)
        return fail(r, "end-of-stream");
    *size = (pb_size_t)n;
    memcpy(bytes, r->p, n);
    r->p += n;
    return true;
}

static bool request_field(struct rd *r, uint32_t tag, unsigned wt, void *msg)
{
    sluice_GetElementRequest *m = msg;
    _Static_assert(sizeof m->task_key == 16, "task_key is 16 bytes");
    switch (tag) {
    case sluice_GetElementRequest_task_id_tag: return get_uint64(r, wt, "task_id", &m->task_id);
    case sluice_GetElementRequest_client_id_tag: return get_uint64(r, wt, "client_id", &m->client_id);
    case sluice_GetElementRequest_coordinated_tag: return get_bool(r, wt, "coordinated", &m->coordinated);
    case sluice_GetElementRequest_round_tag: return get_uint64(r, wt, "round", &m->round);
    case sluice_GetElementRequest_consumer_index_tag:
        return get_uint32(r, wt, "consumer_index", &m->consumer_index);
    case sluice_GetElementRequest_provenance_tag: return get_bool(r, wt, "provenance", &m->provenance);
    case sluice_GetElementRequest_task_key_tag: return get_task_key(r, wt, m->task_key);
    case sluice_GetElementRequest_seq_tag: return get_uint64(r, wt, "seq", &m->seq);
    case sluice_GetElementRequest_acked_below_tag: return get_uint64(r, wt, "acked_below", &m->acked_below);
    case sluice_GetElementRequest_tallies_tag: return get_bool(r, wt, "tallies", &m->tallies);
    case sluice_GetElementRequest_dense_provenance_tag:
        return get_bool(r, wt, "dense_provenance", &m->dense_provenance);
    case sluice_GetElementRequest_shm_tag: return get_bool(r, wt, "shm", &m->shm);
    case sluice_GetElementRequest_shm_mapped_tag: return get_bool(r, wt, "shm_mapped", &m->shm_mapped);
    case sluice_GetElementRequest_shm_released_tag: return get_uint64(r, wt, "shm_released", &m->shm_released);
    case sluice_GetElementRequest_shm_tail_in_answer_tag:
        return get_bool(r, wt, "shm_tail_in_answer", &m->shm_tail_in_answer);
    default: return skip(r, wt);
    }
}

static bool response_field(struct rd *r, uint32_t tag, unsigned wt, void *msg)
{
    sluice_GetElementResponse *m = msg;
    switch (tag) {
    case sluice_GetElementResponse_task_id_tag: return get_uint64(r, wt, "task_id", &m->task_id);
    case sluice_GetElementResponse_end_of_sequence_tag:
        return get_bool(r, wt, "end_of_sequence", &m->end_of_sequence);
    case sluice_GetElementResponse_num_elements_tag: return get_uint64(r, wt, "num_elements", &m->num_elements);
    case sluice_GetElementResponse_components_tag: return get_components(r, wt, m);
    case sluice_GetElementResponse_provenance_offset_tag:
        return get_uint64(r, wt, "provenance_offset", &m->provenance_offset);
    case sluice_GetElementResponse_provenance_length_tag:
        return get_uint64(r, wt, "provenance_length", &m->provenance_length);
    case sluice_GetElementResponse_done_below_tag: return get_uint64(r, wt, "done_below", &m->done_below);
    case sluice_GetElementResponse_notices_offset_tag:
        return get_uint64(r, wt, "notices_offset", &m->notices_offset);
    case sluice_GetElementResponse_notices_length_tag:
        return get_uint64(r, wt, "notices_length", &m->notices_length);
    case sluice_GetElementResponse_num_records_tag: return get_uint64(r, wt, "num_records", &m->num_records);
    case sluice_GetElementResponse_tallies_offset_tag:
        return get_uint64(r, wt, "tallies_offset", &m->tallies_offset);
    case sluice_GetElementResponse_tallies_length_tag:
        return get_uint64(r, wt, "tallies_length", &m->tallies_length);
    case sluice_GetElementResponse_shm_socket_tag:
        return get_name(r, wt, "shm_socket", m->shm_socket, sizeof m->shm_socket);
    case sluice_GetElementResponse_shm_ticket_tag:
        return get_bytes(r, wt, "shm_ticket", &m->shm_ticket.size, m->shm_ticket.bytes, sizeof m->shm_ticket.bytes);
    case sluice_GetElementResponse_shm_tail_tag:
        return get_bytes(r, wt, "shm_tail", &m->shm_tail.size, m->shm_tail.bytes, sizeof m->shm_tail.bytes);
    case sluice_GetElementResponse_shm_offset_tag: return get_uint64(r, wt, "shm_offset", &m->shm_offset);
    case sluice_GetElementResponse_shm_length_tag: return get_uint64(r, wt, "shm_length", &m->shm_length);
    default: return skip(r, wt);
    }
}

/* "components[2].shape: array overflow at byte 71" */
static int failed(const struct rd *r, const uint8_t *buf, char *err, size_t errlen)
{
    char comp[32] = "";
    if (r->component >= 0)
        snprintf(comp, sizeof comp, "components[%d]%s", r->component, r->field ? "." : "");
    snprintf(err, errlen, "%s%s%s%s at byte %zu", comp, r->field ? r->field : "", r->field || comp[0] ? ": " : "",
             r->why, (size_t)(r->p - buf));
    return SL_EPROTO;
}

int sl_getelem_req_decode(const uint8_t *buf, size_t len, sluice_GetElementRequest *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    struct rd r = {buf, buf + len, NULL, NULL, -1};
    return get_fields(&r, request_field, m) ? 0 : failed(&r, buf, err, errlen);
}

int sl_getelem_resp_decode(const uint8_t *buf, size_t len, sluice_GetElementResponse *m, char *err, size_t errlen)
{
    /* What pb_decode() zeroes: every field, the components by their count. */
    m->task_id = m->num_elements = 0;
    m->end_of_sequence = false;
    m->components_count = 0;
    m->provenance_offset = m->provenance_length = m->done_below = 0;
    m->notices_offset = m->notices_length = m->num_records = 0;
    m->tallies_offset = m->tallies_length = 0;
    memset(m->shm_socket, 0, sizeof m->shm_socket);
    memset(&m->shm_ticket, 0, sizeof m->shm_ticket);
    m->shm_offset = m->shm_length = 0;
    memset(&m->shm_tail, 0, sizeof m->shm_tail);
    struct rd r = {buf, buf + len, NULL, NULL, -1};
    return get_fields(&r, response_field, m) ? 0 : failed(&r, buf, err, errlen);
}
