/*
 * test_frame.c: the frame codec (protocol/frame.c): handshake, header,
 * nanopb messages at and beyond their bounds, and sl_frame_decode over
 * truncated, corrupt and random input.
 *
 * Buffers handed to the decoder are malloc'd to their exact length, so that
 * AddressSanitizer catches any read past the end.
 */
#include <criterion/criterion.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "pb_fields.h"

#define BUFCAP (SL_FRAME_HEADER_LEN + SL_MAX_MESSAGE_LEN)

/* Every message must fit in SL_MAX_MESSAGE_LEN with the bounds of
 * sluice.options, or a peer could not send a legal message. */
_Static_assert(sluice_Error_size <= SL_MAX_MESSAGE_LEN, "Error");
_Static_assert(sluice_WorkerHeartbeatRequest_size <= SL_MAX_MESSAGE_LEN, "WorkerHeartbeatRequest");
_Static_assert(sluice_WorkerHeartbeatResponse_size <= SL_MAX_MESSAGE_LEN, "WorkerHeartbeatResponse");
_Static_assert(sluice_GetSplitResponse_size <= SL_MAX_MESSAGE_LEN, "GetSplitResponse");
_Static_assert(sluice_ClientHeartbeatResponse_size <= SL_MAX_MESSAGE_LEN, "ClientHeartbeatResponse");
_Static_assert(sluice_GetElementResponse_size <= SL_MAX_MESSAGE_LEN, "GetElementResponse");

static uint8_t buf[BUFCAP];

/* A copy of n bytes in a heap block of exactly n bytes (at least 1), freed by the caller. */
static uint8_t *exact_copy(const void *src, size_t n)
{
    uint8_t *p = malloc(n ? n : 1);
    cr_assert_not_null(p);
    if (n)
        memcpy(p, src, n);
    return p;
}

/* xorshift64*: a seeded generator, so failures reproduce. */
static uint64_t rng_state;
static uint64_t rng(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

static void fill_string(char *s, size_t n, char base)
{
    for (size_t i = 0; i < n; i++)
        s[i] = (char)(base + (char)(i % 26));
    s[n] = '\0';
}

/* Encodes msg as a whole frame, decodes it back into a fresh struct and
 * checks header and consumed length. @return the decoded message (free it) */
static void *roundtrip(unsigned type, uint32_t id, const void *msg, size_t *msg_len)
{
    size_t len = 0;
    cr_assert_eq(sl_frame_encode(type, id, msg, 0, buf, sizeof buf, &len), 0, "encode %s", sl_msg_name(type));
    cr_assert_geq(len, SL_FRAME_HEADER_LEN);
    uint8_t *in = exact_copy(buf, len);
    sl_limits_t lim = {.max_payload = 0};
    sl_frame_t f;
    size_t consumed = 0;
    char err[256] = "";
    int rc = sl_frame_decode(in, len, &lim, &f, &consumed, err, sizeof err);
    cr_assert_eq(rc, 1, "decode %s: rc %d: %s", sl_msg_name(type), rc, err);
    cr_assert_eq(consumed, len);
    cr_assert_eq(f.hdr.type, type);
    cr_assert_eq(f.hdr.flags, 0);
    cr_assert_eq(f.hdr.request_id, id);
    cr_assert_eq(f.hdr.msg_len, len - SL_FRAME_HEADER_LEN);
    cr_assert_eq(f.hdr.payload_len, 0);
    cr_assert_eq(f.payload, in + len);
    cr_assert_not_null(f.msg);
    void *out = f.msg;
    f.msg = NULL;
    sl_frame_clear(&f);
    free(in);
    if (msg_len)
        *msg_len = len - SL_FRAME_HEADER_LEN;
    return out;
}

/* ---- message table ---------------------------------------------------- */

Test(frame, every_type_has_a_message)
{
    for (unsigned t = 1; t < SL_MSG_COUNT_; t++) {
        cr_assert_not_null(sl_msg_desc(t), "type %u", t);
        cr_assert_gt(sl_msg_size(t), 0, "type %u", t);
        cr_assert_str_neq(sl_msg_name(t), "unknown", "type %u", t);
        /* A message of all defaults encodes and decodes. */
        void *zero = calloc(1, sl_msg_size(t));
        void *back = roundtrip(t, t, zero, NULL);
        cr_assert_eq(pb_fields_differ(sl_msg_desc(t), zero, back, false), 0, "type %u", t);
        if (t != SL_MSG_GET_ELEMENT_REQ && t != SL_MSG_GET_ELEMENT_RESP)
            cr_assert_eq(memcmp(zero, back, sl_msg_size(t)), 0, "type %u: zeroed whole (sl_msg_new())", t);
        free(back);
        free(zero);
    }
    cr_assert_eq(sl_msg_size(SL_MSG_GET_ELEMENT_RESP), sizeof(sluice_GetElementResponse));
    cr_assert_str_eq(sl_msg_name(SL_MSG_GET_ELEMENT_REQ), "GET_ELEMENT_REQ");
    cr_assert_null(sl_msg_desc(0));
    cr_assert_null(sl_msg_desc(SL_MSG_COUNT_));
    cr_assert_eq(sl_msg_size(0), 0);
    cr_assert_eq(sl_msg_size(SL_MSG_COUNT_), 0);
    cr_assert_str_eq(sl_msg_name(0), "unknown");
    cr_assert_str_eq(sl_msg_name(0xffff), "unknown");
    cr_assert_str_eq(sl_role_name(SL_ROLE_WORKER), "worker");
    cr_assert_str_eq(sl_role_name(0), "unknown");
}

/* ---- round trips -------------------------------------------------------- */

Test(frame, roundtrip_error_longest_message)
{
    sluice_Error e = sluice_Error_init_zero;
    e.code = SL_ETOOBIG;
    fill_string(e.message, sizeof e.message - 1, 'a');
    size_t mlen;
    sluice_Error *d = roundtrip(SL_MSG_ERROR, 0, &e, &mlen);
    cr_assert_eq(d->code, SL_ETOOBIG);
    cr_assert_str_eq(d->message, e.message);
    cr_assert_eq(strlen(d->message), 1023);
    cr_assert_leq(mlen, sluice_Error_size);
    free(d);
}

Test(frame, roundtrip_scalars_at_extremes)
{
    sluice_GetSplitRequest r = {.task_id = UINT64_MAX, .epoch = 1ull << 63, .max_splits = UINT32_MAX};
    sluice_GetSplitRequest *d = roundtrip(SL_MSG_GET_SPLIT_REQ, UINT32_MAX, &r, NULL);
    cr_assert_eq(d->task_id, UINT64_MAX);
    cr_assert_eq(d->epoch, 1ull << 63);
    cr_assert_eq(d->max_splits, UINT32_MAX);
    free(d);

    sluice_GetOrCreateJobRequest j = sluice_GetOrCreateJobRequest_init_zero;
    j.dataset_id = 0xfeedfacecafebeefull;
    fill_string(j.job_name, sizeof j.job_name - 1, 'A');
    j.sharding = 5;
    sluice_GetOrCreateJobRequest *dj = roundtrip(SL_MSG_GET_OR_CREATE_JOB_REQ, 9, &j, NULL);
    cr_assert_eq(dj->dataset_id, j.dataset_id);
    cr_assert_str_eq(dj->job_name, j.job_name);
    cr_assert_eq(dj->sharding, 5);
    free(dj);
}

/* Every repeated field at its max_count, every string at its max_size. */
Test(frame, roundtrip_worker_heartbeat_at_max_count)
{
    sluice_WorkerHeartbeatRequest *h = calloc(1, sizeof *h);
    h->worker_id = 77;
    h->tasks_count = 64;
    for (unsigned i = 0; i < 64; i++) {
        sluice_TaskStatus *t = &h->tasks[i];
        t->task_id = UINT64_MAX - i;
        t->state = SL_TASK_FAILED;
        t->batches = i;
        t->elements = (uint64_t)i << 40;
        t->bytes = UINT64_MAX;
        fill_string(t->error, sizeof t->error - 1, (char)('a' + i % 20));
    }
    size_t mlen;
    sluice_WorkerHeartbeatRequest *d = roundtrip(SL_MSG_WORKER_HEARTBEAT_REQ, 123456, h, &mlen);
    cr_assert_eq(d->tasks_count, 64);
    cr_assert_eq(d->worker_id, 77);
    for (unsigned i = 0; i < 64; i++) {
        cr_assert_eq(d->tasks[i].task_id, UINT64_MAX - i);
        cr_assert_eq(d->tasks[i].elements, (uint64_t)i << 40);
        cr_assert_str_eq(d->tasks[i].error, h->tasks[i].error);
    }
    cr_assert_eq(memcmp(h, d, sizeof *h), 0);
    cr_assert_leq(mlen, sluice_WorkerHeartbeatRequest_size);
    free(d);
    free(h);
}

Test(frame, roundtrip_client_heartbeat_response_at_max_count)
{
    sluice_ClientHeartbeatResponse *r = calloc(1, sizeof *r);
    r->tasks_count = 256;
    for (unsigned i = 0; i < 256; i++) {
        r->tasks[i].task_id = i + 1;
        r->tasks[i].worker_id = 1000 + i;
        snprintf(r->tasks[i].worker_address, sizeof r->tasks[i].worker_address, "10.0.%u.%u:5060", i / 8, i);
    }
    r->job_state = 3;
    fill_string(r->error, sizeof r->error - 1, 'k');
    sluice_ClientHeartbeatResponse *d = roundtrip(SL_MSG_CLIENT_HEARTBEAT_RESP, 5, r, NULL);
    cr_assert_eq(d->tasks_count, 256);
    cr_assert_str_eq(d->tasks[255].worker_address, "10.0.31.255:5060");
    cr_assert_eq(d->tasks[17].worker_id, 1017);
    cr_assert_eq(memcmp(r, d, sizeof *r), 0);
    free(d);
    free(r);
}

Test(frame, roundtrip_get_element_response_with_payload)
{
    sluice_GetElementResponse *r = calloc(1, sizeof *r);
    r->task_id = 4;
    r->num_elements = 64;
    r->components_count = 32;
    for (unsigned i = 0; i < 32; i++) {
        sluice_Component *c = &r->components[i];
        fill_string(c->name, sizeof c->name - 1, (char)('a' + i % 26));
        c->dtype = i % 15;
        c->shape_count = 8;
        for (unsigned k = 0; k < 8; k++)
            c->shape[k] = k % 2 ? -(int64_t)k : (int64_t)(k * 1000 + i);
        c->offset = i * 10;
        c->length = 10;
        c->ragged = i % 2;
        c->splits_offset = UINT64_MAX;
        c->splits_length = 8;
    }
    /* Frame plus 320 payload bytes plus 5 bytes of the next frame. */
    size_t hlen = 0;
    cr_assert_eq(sl_frame_encode(SL_MSG_GET_ELEMENT_RESP, 8, r, 320, buf, sizeof buf, &hlen), 0);
    size_t total = hlen + 320 + 5;
    uint8_t *in = malloc(total);
    memcpy(in, buf, hlen);
    for (size_t i = 0; i < 325; i++)
        in[hlen + i] = (uint8_t)(i * 7);
    sl_limits_t lim = {.max_payload = 320};
    sl_frame_t f;
    size_t consumed = 0;
    char err[256] = "";
    cr_assert_eq(sl_frame_decode(in, total, &lim, &f, &consumed, err, sizeof err), 1, "%s", err);
    cr_assert_eq(consumed, hlen + 320);
    cr_assert_eq(f.hdr.payload_len, 320);
    cr_assert_eq(f.payload, in + hlen, "payload points right after the message");
    cr_assert_eq(f.payload[319], (uint8_t)(319 * 7));
    sluice_GetElementResponse *d = f.msg;
    cr_assert_eq(d->components_count, 32);
    cr_assert_eq(d->components[31].shape[7], -7);
    cr_assert_eq(d->components[30].shape[6], 6030);
    cr_assert_eq(pb_fields_differ(sluice_GetElementResponse_fields, r, d, false), 0);
    /* The comparison sees a field inside a component, and the count. */
    d->components[5].splits_length++;
    cr_assert_neq(pb_fields_differ(sluice_GetElementResponse_fields, r, d, false), 0);
    d->components[5].splits_length--;
    d->components_count--;
    cr_assert_neq(pb_fields_differ(sluice_GetElementResponse_fields, r, d, false), 0);
    sl_frame_clear(&f);
    cr_assert_null(f.msg);
    free(in);
    free(r);
}

/* ---- beyond the bounds -------------------------------------------------- */

Test(frame, over_max_count_does_not_encode)
{
    sluice_GetSplitResponse *r = calloc(1, sizeof *r);
    r->splits_count = pb_arraysize(sluice_GetSplitResponse, splits) + 1; /* one more than splits[] holds:
                                                                          must be refused before it is read */
    size_t len = 0;
    cr_assert_eq(sl_msg_encode(SL_MSG_GET_SPLIT_RESP, r, buf, sizeof buf, &len), SL_ETOOBIG);
    cr_assert_eq(sl_frame_encode(SL_MSG_GET_SPLIT_RESP, 1, r, 0, buf, sizeof buf, &len), SL_ETOOBIG);
    free(r);

    sluice_Component c = sluice_Component_init_zero;
    c.shape_count = 9;
    sluice_GetElementResponse *e = calloc(1, sizeof *e);
    e->components_count = 1;
    e->components[0] = c;
    cr_assert_eq(sl_msg_encode(SL_MSG_GET_ELEMENT_RESP, e, buf, sizeof buf, &len), SL_ETOOBIG);
    free(e);
}

/* Protobuf concatenation merges repeated fields: the most splits (max_count)
 * then one more decode as one too many, which the bounds must refuse. */
Test(frame, over_max_count_fails_to_decode)
{
    sluice_GetSplitResponse *r = calloc(1, sizeof *r);
    const unsigned most = pb_arraysize(sluice_GetSplitResponse, splits);
    cr_assert_eq(most, 512);
    r->splits_count = (pb_size_t)most;
    for (unsigned i = 0; i < most; i++)
        r->splits[i] = (sluice_Split){.split_id = i, .begin = i * 10, .end = i * 10 + 10};
    size_t n64 = 0, n1 = 0;
    static uint8_t m[BUFCAP];
    cr_assert_eq(sl_msg_encode(SL_MSG_GET_SPLIT_RESP, r, m + SL_FRAME_HEADER_LEN, sizeof m - SL_FRAME_HEADER_LEN, &n64), 0);
    r->splits_count = 1;
    cr_assert_eq(sl_msg_encode(SL_MSG_GET_SPLIT_RESP, r, m + SL_FRAME_HEADER_LEN + n64,
                               sizeof m - SL_FRAME_HEADER_LEN - n64, &n1), 0);

    /* The most alone decode. */
    char err[256] = "";
    sluice_GetSplitResponse *d = calloc(1, sizeof *d);
    cr_assert_eq(sl_msg_decode(SL_MSG_GET_SPLIT_RESP, m + SL_FRAME_HEADER_LEN, n64, d, err, sizeof err), 0, "%s", err);
    cr_assert_eq(d->splits_count, most);

    /* One more do not, as a message or as a frame. */
    memset(d, 0, sizeof *d);
    cr_assert_eq(sl_msg_decode(SL_MSG_GET_SPLIT_RESP, m + SL_FRAME_HEADER_LEN, n64 + n1, d, err, sizeof err), SL_EPROTO);
    cr_assert(strstr(err, "GET_SPLIT_RESP"), "err names the message: %s", err);
    sl_frame_hdr_t h = {.type = SL_MSG_GET_SPLIT_RESP, .request_id = 3, .msg_len = (uint32_t)(n64 + n1)};
    sl_frame_hdr_encode(&h, m);
    size_t total = SL_FRAME_HEADER_LEN + n64 + n1;
    uint8_t *in = exact_copy(m, total);
    sl_limits_t lim = {.max_payload = 0};
    sl_frame_t f;
    size_t consumed = 12345;
    cr_assert_eq(sl_frame_decode(in, total, &lim, &f, &consumed, err, sizeof err), SL_EPROTO);
    cr_assert_null(f.msg, "a failed decode frees its message");
    cr_assert_eq(consumed, 12345);
    free(in);
    free(d);
    free(r);
}

/* A string one byte over max_size (the NUL needs the last byte). */
Test(frame, over_max_size_string_fails_to_decode)
{
    uint8_t m[4 + 1024];
    m[0] = 0x12; /* field 2 (message), length-delimited */
    m[1] = 0x80 | (1024 & 0x7f);
    m[2] = 1024 >> 7;
    memset(m + 3, 'x', 1024);
    char err[256] = "";
    sluice_Error *e = calloc(1, sizeof *e);
    cr_assert_eq(sl_msg_decode(SL_MSG_ERROR, m, 3 + 1024, e, err, sizeof err), SL_EPROTO);
    /* 1023 bytes fit. */
    m[1] = 0x80 | (1023 & 0x7f);
    m[2] = 1023 >> 7;
    memset(e, 0, sizeof *e);
    cr_assert_eq(sl_msg_decode(SL_MSG_ERROR, m, 3 + 1023, e, err, sizeof err), 0, "%s", err);
    cr_assert_eq(strlen(e->message), 1023);
    free(e);

    /* Nine packed shape values where eight are allowed. */
    uint8_t c[] = {0x22, 13, /* GetElementResponse.components */
                   0x1a, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, /* Component.shape, packed */
                   0x10, 1};
    sluice_GetElementResponse *g = calloc(1, sizeof *g);
    cr_assert_eq(sl_msg_decode(SL_MSG_GET_ELEMENT_RESP, c, sizeof c, g, err, sizeof err), SL_EPROTO);
    memset(g, 0, sizeof *g);
    uint8_t c8[] = {0x22, 12, 0x1a, 8, 1, 2, 3, 4, 5, 6, 7, 8, 0x10, 1};
    cr_assert_eq(sl_msg_decode(SL_MSG_GET_ELEMENT_RESP, c8, sizeof c8, g, err, sizeof err), 0, "%s", err);
    cr_assert_eq(g->components[0].shape_count, 8);
    cr_assert_eq(g->components[0].dtype, 1);
    free(g);
}

Test(frame, encode_refuses_small_buffer_and_unknown_type)
{
    sluice_Error e = sluice_Error_init_zero;
    snprintf(e.message, sizeof e.message, "%s", "a message of some length");
    size_t len = 0;
    cr_assert_eq(sl_msg_encode(SL_MSG_ERROR, &e, buf, 10, &len), SL_ETOOBIG);
    cr_assert_eq(sl_frame_encode(SL_MSG_ERROR, 1, &e, 0, buf, SL_FRAME_HEADER_LEN - 1, &len), SL_ETOOBIG);
    cr_assert_eq(sl_frame_encode(SL_MSG_ERROR, 1, &e, 0, buf, SL_FRAME_HEADER_LEN + 5, &len), SL_ETOOBIG);
    cr_assert_eq(sl_msg_encode(0, &e, buf, sizeof buf, &len), SL_EINVAL);
    cr_assert_eq(sl_frame_encode(SL_MSG_COUNT_, 1, &e, 0, buf, sizeof buf, &len), SL_EINVAL);
}

/* ---- handshake ---------------------------------------------------------- */

Test(frame, handshake_good)
{
    uint8_t hs[SL_HANDSHAKE_LEN], nonce[SL_HELLO_NONCE_LEN];
    for (size_t i = 0; i < sizeof nonce; i++)
        nonce[i] = (uint8_t)(0xa0 + i);
    sl_handshake_encode(hs, SL_ROLE_DISPATCHER, SL_HELLO_TOKEN, nonce);
    const uint8_t want[12] = {'S', 'L', 'U', 'C', 0, SL_PROTOCOL_VERSION, 0, 3, 0, 0, 0, 1};
    cr_assert_eq(memcmp(hs, want, sizeof want), 0, "magic, version, role and flags are big-endian");
    cr_assert_eq(memcmp(hs + 12, nonce, sizeof nonce), 0, "the nonce follows the flags");
    cr_assert_eq(sl_handshake_flags(hs), SL_HELLO_TOKEN);
    for (sl_role_t r = SL_ROLE_CLIENT; r <= SL_ROLE_DISPATCHER; r++) {
        sl_handshake_encode(hs, r, 0, nonce);
        cr_assert_eq(sl_handshake_flags(hs), 0);
        sl_role_t got = 0;
        char err[128] = "";
        cr_assert_eq(sl_handshake_decode(hs, &got, err, sizeof err), 0, "%s", err);
        cr_assert_eq(got, r);
    }
}

Test(frame, handshake_bad_magic)
{
    const char *bad[] = {"GET / HT", "SLUc\0\1\0\1", "\0\0\0\0\0\1\0\1", "\x16\x03\x01\x02\0\1\0\1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        sl_role_t got = 0;
        char err[128] = "";
        cr_assert_eq(sl_handshake_decode((const uint8_t *)bad[i], &got, err, sizeof err), SL_EPROTO, "case %zu", i);
        cr_assert(strstr(err, "magic"), "%s", err);
        cr_assert_eq(got, 0, "role untouched on failure");
    }
}

Test(frame, handshake_other_version)
{
    const uint16_t versions[] = {0, SL_PROTOCOL_VERSION + 1, 0x0100, 0xffff};
    for (size_t i = 0; i < sizeof versions / sizeof *versions; i++) {
        uint8_t hs[SL_HANDSHAKE_LEN], nonce[SL_HELLO_NONCE_LEN] = {0};
        sl_handshake_encode(hs, SL_ROLE_CLIENT, 0, nonce);
        hs[4] = (uint8_t)(versions[i] >> 8);
        hs[5] = (uint8_t)versions[i];
        sl_role_t got = 0;
        char err[128] = "";
        cr_assert_eq(sl_handshake_decode(hs, &got, err, sizeof err), SL_EVERSION);
        char num[16];
        snprintf(num, sizeof num, "%u", versions[i]);
        cr_assert(strstr(err, "version") && strstr(err, num), "message names the version %s: %s", num, err);
    }
}

/* Which frames each role may send: a client only its requests. */
Test(frame, roles_and_messages)
{
    cr_assert(sl_msg_allowed(SL_ROLE_CLIENT, SL_MSG_GET_ELEMENT_REQ));
    cr_assert(sl_msg_allowed(SL_ROLE_CLIENT, SL_MSG_CLIENT_HEARTBEAT_REQ));
    cr_assert_not(sl_msg_allowed(SL_ROLE_CLIENT, SL_MSG_WORKER_HEARTBEAT_REQ), "a client posing as a worker");
    cr_assert_not(sl_msg_allowed(SL_ROLE_CLIENT, SL_MSG_GET_SPLIT_REQ), "a client stealing splits");
    cr_assert_not(sl_msg_allowed(SL_ROLE_CLIENT, SL_MSG_GET_ELEMENT_RESP), "a client serving batches");
    cr_assert(sl_msg_allowed(SL_ROLE_WORKER, SL_MSG_GET_SPLIT_REQ));
    cr_assert(sl_msg_allowed(SL_ROLE_WORKER, SL_MSG_GET_ELEMENT_RESP));
    cr_assert_not(sl_msg_allowed(SL_ROLE_WORKER, SL_MSG_GET_OR_CREATE_JOB_REQ));
    cr_assert_not(sl_msg_allowed(SL_ROLE_DISPATCHER, SL_MSG_GET_SPLIT_REQ));
    cr_assert(sl_msg_allowed(SL_ROLE_DISPATCHER, SL_MSG_GET_SPLIT_RESP));
    /* Only a dispatcher tells a worker of a new task unasked. */
    cr_assert(sl_msg_allowed(SL_ROLE_DISPATCHER, SL_MSG_WORKER_NOTICE));
    cr_assert_not(sl_msg_allowed(SL_ROLE_CLIENT, SL_MSG_WORKER_NOTICE), "a client prodding workers");
    cr_assert_not(sl_msg_allowed(SL_ROLE_WORKER, SL_MSG_WORKER_NOTICE), "a worker prodding workers");
    /* Any role may answer with an error. */
    for (unsigned r = SL_ROLE_CLIENT; r <= SL_ROLE_DISPATCHER; r++)
        cr_assert(sl_msg_allowed(r, SL_MSG_ERROR));
}

Test(frame, handshake_unknown_role)
{
    const uint16_t roles[] = {0, 4, 0x0100, 0xffff};
    for (size_t i = 0; i < sizeof roles / sizeof *roles; i++) {
        uint8_t hs[SL_HANDSHAKE_LEN], nonce[SL_HELLO_NONCE_LEN] = {0};
        sl_handshake_encode(hs, SL_ROLE_CLIENT, 0, nonce);
        hs[6] = (uint8_t)(roles[i] >> 8);
        hs[7] = (uint8_t)roles[i];
        sl_role_t got = 0;
        char err[128] = "";
        cr_assert_eq(sl_handshake_decode(hs, &got, err, sizeof err), SL_EPROTO);
        cr_assert(strstr(err, "role"), "%s", err);
    }
}

/* ---- header ------------------------------------------------------------- */

Test(frame, header_layout_and_roundtrip)
{
    sl_frame_hdr_t h = {.type = SL_MSG_GET_ELEMENT_RESP, .request_id = 0x01020304, .msg_len = 0x0000abcd,
                        .payload_len = 0x00fedcba};
    uint8_t out[SL_FRAME_HEADER_LEN];
    sl_frame_hdr_encode(&h, out);
    const uint8_t want[SL_FRAME_HEADER_LEN] = {0, SL_MSG_GET_ELEMENT_RESP, 0, 0, 1, 2, 3, 4,
                                               0, 0, 0xab, 0xcd, 0, 0xfe, 0xdc, 0xba};
    cr_assert_eq(memcmp(out, want, sizeof out), 0);
    sl_limits_t lim = {.max_payload = 0x00fedcba};
    sl_frame_hdr_t d;
    char err[128] = "";
    cr_assert_eq(sl_frame_hdr_decode(out, &lim, &d, err, sizeof err), 0, "%s", err);
    cr_assert_eq(d.type, h.type);
    cr_assert_eq(d.flags, 0);
    cr_assert_eq(d.request_id, h.request_id);
    cr_assert_eq(d.msg_len, h.msg_len);
    cr_assert_eq(d.payload_len, h.payload_len);
}

static int hdr_check(sl_frame_hdr_t h, uint32_t max_payload, char *err, size_t errlen)
{
    uint8_t out[SL_FRAME_HEADER_LEN];
    sl_frame_hdr_encode(&h, out);
    sl_limits_t lim = {.max_payload = max_payload};
    sl_frame_hdr_t d;
    err[0] = '\0';
    int rc = sl_frame_hdr_decode(out, &lim, &d, err, errlen);
    /* sl_frame_decode must agree with the header check. */
    uint8_t *in = exact_copy(out, sizeof out);
    sl_frame_t f;
    size_t consumed;
    char err2[256];
    int rc2 = sl_frame_decode(in, sizeof out, &lim, &f, &consumed, err2, sizeof err2);
    free(in);
    /* A header alone is a whole frame when the frame has no body. */
    int want = rc < 0 ? rc : h.msg_len == 0 && h.payload_len == 0 ? 1 : 0;
    cr_assert_eq(rc2, want, "sl_frame_decode %d, sl_frame_hdr_decode %d", rc2, rc);
    if (rc2 == 1) {
        cr_assert_eq(consumed, SL_FRAME_HEADER_LEN);
        sl_frame_clear(&f);
    }
    cr_assert_null(f.msg);
    return rc;
}

Test(frame, header_unknown_type)
{
    char err[256];
    const unsigned types[] = {0, SL_MSG_COUNT_, SL_MSG_COUNT_ + 1, 0xffff};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        cr_assert_eq(hdr_check((sl_frame_hdr_t){.type = (uint16_t)types[i]}, 100, err, sizeof err), SL_EPROTO,
                     "type %u", types[i]);
        char num[16];
        snprintf(num, sizeof num, "%u", types[i]);
        cr_assert(strstr(err, "type") && strstr(err, num), "%s", err);
    }
    cr_assert_eq(hdr_check((sl_frame_hdr_t){.type = SL_MSG_COUNT_ - 1}, 100, err, sizeof err), 0, "%s", err);
    cr_assert_eq(hdr_check((sl_frame_hdr_t){.type = 1}, 100, err, sizeof err), 0, "%s", err);
}

Test(frame, header_nonzero_flags)
{
    char err[256];
    const uint16_t flags[] = {1, 0x8000, 0xffff};
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) {
        cr_assert_eq(hdr_check((sl_frame_hdr_t){.type = SL_MSG_ERROR, .flags = flags[i]}, 100, err, sizeof err),
                     SL_EPROTO);
        cr_assert(strstr(err, "flags"), "%s", err);
    }
}

Test(frame, header_msg_len_over_limit)
{
    char err[256];
    sl_frame_hdr_t h = {.type = SL_MSG_GET_SPLIT_REQ, .msg_len = SL_MAX_MESSAGE_LEN};
    cr_assert_eq(hdr_check(h, 0, err, sizeof err), 0, "%s", err);
    h.msg_len = SL_MAX_MESSAGE_LEN + 1;
    cr_assert_eq(hdr_check(h, 0, err, sizeof err), SL_ETOOBIG);
    char lim[32];
    snprintf(lim, sizeof lim, "%u", SL_MAX_MESSAGE_LEN);
    cr_assert(strstr(err, lim) && strstr(err, "limit"), "message names the limit: %s", err);
    h.msg_len = UINT32_MAX;
    cr_assert_eq(hdr_check(h, 0, err, sizeof err), SL_ETOOBIG);
    cr_assert(strstr(err, "4294967295"), "message names the length: %s", err);
}

Test(frame, header_payload_len_over_limit)
{
    char err[256];
    sl_frame_hdr_t h = {.type = SL_MSG_REGISTER_DATASET_REQ, .payload_len = 1000};
    cr_assert_eq(hdr_check(h, 1000, err, sizeof err), 0, "%s", err);
    h.payload_len = 1001;
    cr_assert_eq(hdr_check(h, 1000, err, sizeof err), SL_ETOOBIG);
    cr_assert(strstr(err, "limit of 1000"), "message names the limit: %s", err);
    cr_assert(strstr(err, "1001"), "message names the length: %s", err);
    h.payload_len = UINT32_MAX;
    cr_assert_eq(hdr_check(h, 256u * 1024 * 1024, err, sizeof err), SL_ETOOBIG);
    h.payload_len = 1;
    cr_assert_eq(hdr_check(h, 0, err, sizeof err), SL_ETOOBIG);
    cr_assert(strstr(err, "limit of 0"), "%s", err);
}

/* ---- sl_frame_decode ---------------------------------------------------- */

/* A valid frame: a message of a few fields and a payload. */
static uint8_t *valid_frame(size_t *len, size_t *mlen, size_t payload)
{
    sluice_WorkerHeartbeatRequest *h = calloc(1, sizeof *h);
    h->worker_id = 31;
    h->tasks_count = 3;
    for (unsigned i = 0; i < 3; i++) {
        h->tasks[i].task_id = 100 + i;
        h->tasks[i].batches = 1u << (7 * i);
        snprintf(h->tasks[i].error, sizeof h->tasks[i].error, "task %u", i);
    }
    size_t hl = 0;
    cr_assert_eq(sl_frame_encode(SL_MSG_WORKER_HEARTBEAT_REQ, 77, h, (uint32_t)payload, buf, sizeof buf, &hl), 0);
    free(h);
    uint8_t *f = malloc(hl + payload);
    memcpy(f, buf, hl);
    for (size_t i = 0; i < payload; i++)
        f[hl + i] = (uint8_t)(0xa5 ^ i);
    *len = hl + payload;
    *mlen = hl - SL_FRAME_HEADER_LEN;
    return f;
}

Test(frame, decode_every_truncated_prefix_needs_more)
{
    size_t len, mlen;
    uint8_t *full = valid_frame(&len, &mlen, 37);
    sl_limits_t lim = {.max_payload = 1 << 20};
    for (size_t n = 0; n < len; n++) {
        uint8_t *in = exact_copy(full, n);
        sl_frame_t f;
        size_t consumed = 999;
        char err[256] = "";
        int rc = sl_frame_decode(in, n, &lim, &f, &consumed, err, sizeof err);
        cr_assert_eq(rc, 0, "prefix of %zu of %zu bytes: rc %d %s", n, len, rc, err);
        cr_assert_null(f.msg);
        cr_assert_eq(consumed, 999);
        free(in);
    }
    uint8_t *in = exact_copy(full, len);
    sl_frame_t f;
    size_t consumed = 0;
    char err[256] = "";
    cr_assert_eq(sl_frame_decode(in, len, &lim, &f, &consumed, err, sizeof err), 1, "%s", err);
    cr_assert_eq(consumed, len);
    cr_assert_eq(f.hdr.request_id, 77);
    cr_assert_eq(f.hdr.msg_len, mlen);
    cr_assert_eq(f.payload, in + SL_FRAME_HEADER_LEN + mlen);
    cr_assert_eq(memcmp(f.payload, full + SL_FRAME_HEADER_LEN + mlen, 37), 0);
    const sluice_WorkerHeartbeatRequest *d = f.msg;
    cr_assert_eq(d->tasks_count, 3);
    cr_assert_eq(d->tasks[2].batches, 1u << 14);
    cr_assert_str_eq(d->tasks[1].error, "task 1");
    sl_frame_clear(&f);
    sl_frame_clear(&f); /* idempotent */
    free(in);
    free(full);
}

/* Three frames back to back in one buffer are taken one at a time. */
Test(frame, decode_consumes_one_frame_at_a_time)
{
    size_t len, mlen;
    uint8_t *one = valid_frame(&len, &mlen, 5);
    sluice_GetElementRequest g = {.task_id = 1, .client_id = 2};
    size_t glen = 0;
    cr_assert_eq(sl_frame_encode(SL_MSG_GET_ELEMENT_REQ, 2, &g, 0, buf, sizeof buf, &glen), 0);
    size_t total = len + glen + len;
    uint8_t *in = malloc(total);
    memcpy(in, one, len);
    memcpy(in + len, buf, glen);
    memcpy(in + len + glen, one, len);
    sl_limits_t lim = {.max_payload = 5};
    size_t off = 0;
    const uint32_t want_ids[] = {77, 2, 77};
    const size_t want_len[] = {len, glen, len};
    for (int i = 0; i < 3; i++) {
        sl_frame_t f;
        size_t consumed = 0;
        char err[256] = "";
        cr_assert_eq(sl_frame_decode(in + off, total - off, &lim, &f, &consumed, err, sizeof err), 1, "%s", err);
        cr_assert_eq(f.hdr.request_id, want_ids[i]);
        cr_assert_eq(consumed, want_len[i]);
        cr_assert_eq(f.payload, in + off + consumed - f.hdr.payload_len);
        sl_frame_clear(&f);
        off += consumed;
    }
    cr_assert_eq(off, total);
    sl_frame_t f;
    size_t consumed;
    char err[256];
    cr_assert_eq(sl_frame_decode(in + off, 0, &lim, &f, &consumed, err, sizeof err), 0);
    free(in);
    free(one);
}

/* A good header with a message body that is not valid protobuf. */
Test(frame, decode_corrupt_message_body)
{
    const struct {
        unsigned type;
        uint8_t body[12];
        uint32_t len;
    } cases[] = {
        {SL_MSG_GET_SPLIT_REQ, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 11}, /* bad varint key */
        {SL_MSG_GET_SPLIT_REQ, {0x08, 0x80}, 2},        /* truncated varint value */
        {SL_MSG_ERROR, {0x12, 0x0a, 'a', 'b'}, 4},      /* string longer than the message */
        {SL_MSG_GET_SPLIT_RESP, {0x0a, 0x05, 0x08}, 3}, /* submessage longer than the message */
        {SL_MSG_GET_SPLIT_REQ, {0x0b}, 1},              /* wire type 3 (group start) */
        {SL_MSG_GET_ELEMENT_RESP, {0x22, 0x03, 0x1a, 0x05, 0x01}, 5}, /* packed run past its submessage */
    };
    sl_limits_t lim = {.max_payload = 64};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        sl_frame_hdr_t h = {.type = (uint16_t)cases[i].type, .request_id = 5, .msg_len = cases[i].len, .payload_len = 4};
        size_t total = SL_FRAME_HEADER_LEN + cases[i].len + 4;
        uint8_t *in = malloc(total);
        sl_frame_hdr_encode(&h, in);
        memcpy(in + SL_FRAME_HEADER_LEN, cases[i].body, cases[i].len);
        memset(in + SL_FRAME_HEADER_LEN + cases[i].len, 0x08, 4);
        sl_frame_t f;
        size_t consumed = 0;
        char err[256] = "";
        int rc = sl_frame_decode(in, total, &lim, &f, &consumed, err, sizeof err);
        cr_assert_eq(rc, SL_EPROTO, "case %zu: rc %d", i, rc);
        cr_assert(strstr(err, sl_msg_name(cases[i].type)), "case %zu: err names the message: %s", i, err);
        cr_assert_null(f.msg);
        free(in);
    }
}

/* Random bytes, and random message bodies behind valid headers: the decoder
 * answers 0, 1 or an error, and never reads outside the buffer. */
Test(frame, decode_random_garbage)
{
    rng_state = 0x5eed5eed12345678ull;
    sl_limits_t lim = {.max_payload = 4096};
    int got[3] = {0, 0, 0};
    for (int iter = 0; iter < 20000; iter++) {
        size_t n = rng() % 600;
        uint8_t *in = malloc(n ? n : 1);
        for (size_t i = 0; i < n; i++)
            in[i] = (uint8_t)rng();
        bool framed = iter % 2 && n >= SL_FRAME_HEADER_LEN;
        if (framed) {
            /* A legal header; the body stays random. */
            sl_frame_hdr_t h = {.type = (uint16_t)(1 + rng() % (SL_MSG_COUNT_ - 1)),
                                .request_id = (uint32_t)rng(),
                                .msg_len = (uint32_t)(rng() % (n - SL_FRAME_HEADER_LEN + 1)),
                                .payload_len = 0};
            h.payload_len = (uint32_t)(rng() % (n - SL_FRAME_HEADER_LEN - h.msg_len + 1));
            sl_frame_hdr_encode(&h, in);
        }
        sl_frame_t f;
        size_t consumed = 0;
        char err[256] = "";
        int rc = sl_frame_decode(in, n, &lim, &f, &consumed, err, sizeof err);
        cr_assert(rc == 1 || rc == 0 || rc == SL_EPROTO || rc == SL_ETOOBIG, "iter %d: rc %d", iter, rc);
        if (framed)
            cr_assert(rc == 1 || rc == SL_EPROTO, "iter %d: a whole frame: rc %d", iter, rc);
        if (rc == 1) {
            cr_assert_not_null(f.msg);
            cr_assert_leq(consumed, n);
            cr_assert_eq(consumed, SL_FRAME_HEADER_LEN + f.hdr.msg_len + f.hdr.payload_len);
            cr_assert_eq(f.payload, in + SL_FRAME_HEADER_LEN + f.hdr.msg_len);
            /* Whatever decoded re-encodes within the bounds. */
            size_t len;
            cr_assert_eq(sl_msg_encode(f.hdr.type, f.msg, buf, sizeof buf, &len), 0, "iter %d", iter);
            got[2]++;
        } else {
            cr_assert_null(f.msg);
            if (rc < 0)
                cr_assert_neq(err[0], '\0', "iter %d: an error has a message", iter);
            got[rc < 0 ? 1 : 0]++;
        }
        sl_frame_clear(&f);
        free(in);
    }
    /* The generator reached each outcome, or the test tests nothing. */
    cr_assert_gt(got[0], 0);
    cr_assert_gt(got[1], 0);
    cr_assert_gt(got[2], 100);
}
