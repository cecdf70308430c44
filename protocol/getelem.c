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

#include "pbread.h"
#include "sluice.h"
#include "varint.h"


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
    p = put_u64_2(p, KEY2(sluice_GetElementRequest_ack_only_tag, WT_VARINT), m->ack_only);
    p = put_u64_2(p, KEY2(sluice_GetElementRequest_stand_in_tag, WT_VARINT), m->stand_in);
    p = put_u64_2(p, KEY2(sluice_GetElementRequest_take_over_tag, WT_VARINT), m->take_over);
    p = put_u64_2(p, KEY2(sluice_GetElementRequest_progress_tag, WT_VARINT), m->progress);
    p = put_u64_2(p, KEY2(sluice_GetElementRequest_leave_tag, WT_VARINT), m->leave);
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
    p = put_u64_2(p, KEY2(sluice_GetElementResponse_left_tag, WT_VARINT), m->left);
    p = put_u64_2(p, KEY2(sluice_GetElementResponse_ack_at_once_tag, WT_VARINT), m->ack_at_once);
    *len = (size_t)(p - buf);
    return 0;
}

/* ---- decoding: pbread.h reads, the fields are here ---- */

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
    if (!get_sub(r, end, component_field, c, m->components_count))
        return false;
    m->components_count++;
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
    case sluice_GetElementRequest_ack_only_tag: return get_bool(r, wt, "ack_only", &m->ack_only);
    case sluice_GetElementRequest_stand_in_tag: return get_bool(r, wt, "stand_in", &m->stand_in);
    case sluice_GetElementRequest_take_over_tag: return get_bool(r, wt, "take_over", &m->take_over);
    case sluice_GetElementRequest_progress_tag: return get_bool(r, wt, "progress", &m->progress);
    case sluice_GetElementRequest_leave_tag: return get_bool(r, wt, "leave", &m->leave);
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
    case sluice_GetElementResponse_left_tag: return get_bool(r, wt, "left", &m->left);
    case sluice_GetElementResponse_ack_at_once_tag: return get_bool(r, wt, "ack_at_once", &m->ack_at_once);
    default: return skip(r, wt);
    }
}

int sl_getelem_req_decode(const uint8_t *buf, size_t len, sluice_GetElementRequest *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    struct rd r = {buf, buf + len, NULL, NULL, -1};
    return get_fields(&r, request_field, m) ? 0 : failed(&r, buf, "components", err, errlen);
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
    m->left = m->ack_at_once = false;
    struct rd r = {buf, buf + len, NULL, NULL, -1};
    return get_fields(&r, response_field, m) ? 0 : failed(&r, buf, "components", err, errlen);
}
