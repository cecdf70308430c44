/*
 * frame.c: handshake, frame header and message codec. Pure functions over
 * byte buffers, so that the evented connection, the blocking RPC helper,
 * the tests and the fuzzer all decode with the same checks.
 */
#include "frame.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pb_decode.h>
#include <pb_encode.h>

#include "getelem.h"
#include "getsplit.h"

static const uint8_t magic[4] = {'S', 'L', 'U', 'C'};

struct msg_info {
    const char *name;
    const pb_msgdesc_t *desc;
    size_t size;
};

#define MSG(type, name, msg) [type] = {name, &sluice_##msg##_msg, sizeof(sluice_##msg)}
static const struct msg_info msg_table[SL_MSG_COUNT_] = {
    MSG(SL_MSG_ERROR, "ERROR", Error),
    MSG(SL_MSG_WORKER_REGISTER_REQ, "WORKER_REGISTER_REQ", WorkerRegisterRequest),
    MSG(SL_MSG_WORKER_REGISTER_RESP, "WORKER_REGISTER_RESP", WorkerRegisterResponse),
    MSG(SL_MSG_WORKER_HEARTBEAT_REQ, "WORKER_HEARTBEAT_REQ", WorkerHeartbeatRequest),
    MSG(SL_MSG_WORKER_HEARTBEAT_RESP, "WORKER_HEARTBEAT_RESP", WorkerHeartbeatResponse),
    MSG(SL_MSG_GET_DATASET_REQ, "GET_DATASET_REQ", GetDatasetRequest),
    MSG(SL_MSG_GET_DATASET_RESP, "GET_DATASET_RESP", GetDatasetResponse),
    MSG(SL_MSG_GET_SPLIT_REQ, "GET_SPLIT_REQ", GetSplitRequest),
    MSG(SL_MSG_GET_SPLIT_RESP, "GET_SPLIT_RESP", GetSplitResponse),
    MSG(SL_MSG_REGISTER_DATASET_REQ, "REGISTER_DATASET_REQ", RegisterDatasetRequest),
    MSG(SL_MSG_REGISTER_DATASET_RESP, "REGISTER_DATASET_RESP", RegisterDatasetResponse),
    MSG(SL_MSG_GET_OR_CREATE_JOB_REQ, "GET_OR_CREATE_JOB_REQ", GetOrCreateJobRequest),
    MSG(SL_MSG_GET_OR_CREATE_JOB_RESP, "GET_OR_CREATE_JOB_RESP", GetOrCreateJobResponse),
    MSG(SL_MSG_CLIENT_HEARTBEAT_REQ, "CLIENT_HEARTBEAT_REQ", ClientHeartbeatRequest),
    MSG(SL_MSG_CLIENT_HEARTBEAT_RESP, "CLIENT_HEARTBEAT_RESP", ClientHeartbeatResponse),
    MSG(SL_MSG_RELEASE_CLIENT_REQ, "RELEASE_CLIENT_REQ", ReleaseClientRequest),
    MSG(SL_MSG_RELEASE_CLIENT_RESP, "RELEASE_CLIENT_RESP", ReleaseClientResponse),
    MSG(SL_MSG_GET_ELEMENT_REQ, "GET_ELEMENT_REQ", GetElementRequest),
    MSG(SL_MSG_GET_ELEMENT_RESP, "GET_ELEMENT_RESP", GetElementResponse),
    MSG(SL_MSG_REPORT_RECEIVED_REQ, "REPORT_RECEIVED_REQ", ReportReceivedRequest),
    MSG(SL_MSG_REPORT_RECEIVED_RESP, "REPORT_RECEIVED_RESP", ReportReceivedResponse),
    MSG(SL_MSG_GET_EXCLUSIONS_REQ, "GET_EXCLUSIONS_REQ", GetExclusionsRequest),
    MSG(SL_MSG_GET_EXCLUSIONS_RESP, "GET_EXCLUSIONS_RESP", GetExclusionsResponse),
    MSG(SL_MSG_LOOKUP_DATASET_REQ, "LOOKUP_DATASET_REQ", LookupDatasetRequest),
    MSG(SL_MSG_LOOKUP_DATASET_RESP, "LOOKUP_DATASET_RESP", LookupDatasetResponse),
    MSG(SL_MSG_WORKER_NOTICE, "WORKER_NOTICE", WorkerNotice),
};
#undef MSG

static const struct msg_info *msg_info(unsigned type)
{
    if (type == 0 || type >= SL_MSG_COUNT_)
        return NULL;
    return &msg_table[type];
}

const pb_msgdesc_t *sl_msg_desc(unsigned type)
{
    const struct msg_info *mi = msg_info(type);
    return mi ? mi->desc : NULL;
}

size_t sl_msg_size(unsigned type)
{
    const struct msg_info *mi = msg_info(type);
    return mi ? mi->size : 0;
}

void *sl_msg_new(unsigned type)
{
    size_t size = sl_msg_size(type);
    if (type == SL_MSG_GET_ELEMENT_REQ || type == SL_MSG_GET_ELEMENT_RESP)
        return malloc(size);
    return calloc(1, size);
}

const char *sl_msg_name(unsigned type)
{
    const struct msg_info *mi = msg_info(type);
    return mi ? mi->name : "unknown";
}

/* The requests a peer of each role may send; any peer may answer one of
 * ours and send ERROR. */
bool sl_msg_allowed(unsigned role, unsigned type)
{
    switch (type) {
    case SL_MSG_ERROR:
        return true;
    case SL_MSG_WORKER_REGISTER_REQ:
    case SL_MSG_WORKER_HEARTBEAT_REQ:
    case SL_MSG_GET_DATASET_REQ:
    case SL_MSG_GET_SPLIT_REQ:
    case SL_MSG_GET_EXCLUSIONS_REQ:
        return role == SL_ROLE_WORKER;
    case SL_MSG_REGISTER_DATASET_REQ:
    case SL_MSG_GET_OR_CREATE_JOB_REQ:
    case SL_MSG_CLIENT_HEARTBEAT_REQ:
    case SL_MSG_RELEASE_CLIENT_REQ:
    case SL_MSG_GET_ELEMENT_REQ:
    case SL_MSG_REPORT_RECEIVED_REQ:
    case SL_MSG_LOOKUP_DATASET_REQ:
        return role == SL_ROLE_CLIENT;
    case SL_MSG_WORKER_NOTICE:
        return role == SL_ROLE_DISPATCHER;
    default:
        /* A response: only the side that serves requests sends them. */
        return role == SL_ROLE_DISPATCHER || role == SL_ROLE_WORKER;
    }
}

const char *sl_role_name(unsigned role)
{
    switch (role) {
    case SL_ROLE_CLIENT: return "client";
    case SL_ROLE_WORKER: return "worker";
    case SL_ROLE_DISPATCHER: return "dispatcher";
    default: return "unknown";
    }
}

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)((p[0] << 8) | p[1]);
}

static uint32_t get32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

void sl_handshake_encode(uint8_t out[SL_HANDSHAKE_LEN], sl_role_t role, uint32_t flags, const uint8_t *nonce)
{
    memcpy(out, magic, sizeof magic);
    put16(out + 4, SL_PROTOCOL_VERSION);
    put16(out + 6, (uint16_t)role);
    put32(out + 8, flags);
    memcpy(out + 12, nonce, SL_HELLO_NONCE_LEN);
}

uint32_t sl_handshake_flags(const uint8_t in[SL_HANDSHAKE_LEN])
{
    return get32(in + 8);
}

int sl_handshake_decode(const uint8_t in[SL_HANDSHAKE_PREFIX_LEN], sl_role_t *role, char *err, size_t errlen)
{
    if (memcmp(in, magic, sizeof magic) != 0) {
        snprintf(err, errlen, "handshake: bad magic %02x%02x%02x%02x (not a sluice peer)", in[0], in[1],
                 in[2], in[3]);
        return SL_EPROTO;
    }
    uint16_t version = get16(in + 4);
    if (version != SL_PROTOCOL_VERSION) {
        snprintf(err, errlen, "handshake: protocol version %u, this side speaks %u", version,
                 SL_PROTOCOL_VERSION);
        return SL_EVERSION;
    }
    uint16_t r = get16(in + 6);
    if (r < SL_ROLE_CLIENT || r > SL_ROLE_DISPATCHER) {
        snprintf(err, errlen, "handshake: unknown role %u", r);
        return SL_EPROTO;
    }
    *role = (sl_role_t)r;
    return 0;
}

void sl_frame_hdr_encode(const sl_frame_hdr_t *hdr, uint8_t out[SL_FRAME_HEADER_LEN])
{
    put16(out, hdr->type);
    put16(out + 2, hdr->flags);
    put32(out + 4, hdr->request_id);
    put32(out + 8, hdr->msg_len);
    put32(out + 12, hdr->payload_len);
}

int sl_frame_hdr_decode(const uint8_t in[SL_FRAME_HEADER_LEN], const sl_limits_t *limits,
                        sl_frame_hdr_t *hdr, char *err, size_t errlen)
{
    hdr->type = get16(in);
    hdr->flags = get16(in + 2);
    hdr->request_id = get32(in + 4);
    hdr->msg_len = get32(in + 8);
    hdr->payload_len = get32(in + 12);
    if (!msg_info(hdr->type)) {
        snprintf(err, errlen, "frame: unknown message type %u", hdr->type);
        return SL_EPROTO;
    }
    if (hdr->flags != 0) {
        snprintf(err, errlen, "frame: unknown flags 0x%x on %s", hdr->flags, sl_msg_name(hdr->type));
        return SL_EPROTO;
    }
    if (hdr->msg_len > SL_MAX_MESSAGE_LEN) {
        snprintf(err, errlen, "frame: %s message of %u bytes exceeds the limit of %u", sl_msg_name(hdr->type),
                 hdr->msg_len, SL_MAX_MESSAGE_LEN);
        return SL_ETOOBIG;
    }
    if (hdr->payload_len > limits->max_payload) {
        snprintf(err, errlen, "frame: %s payload of %u bytes exceeds the limit of %u", sl_msg_name(hdr->type),
                 hdr->payload_len, limits->max_payload);
        return SL_ETOOBIG;
    }
    return 0;
}

int sl_msg_encode(unsigned type, const void *msg, uint8_t *buf, size_t cap, size_t *len)
{
    const struct msg_info *mi = msg_info(type);
    if (!mi)
        return SL_EINVAL;
    /* A batch's two messages skip nanopb's tables (getelem.c) when the
     * buffer holds their largest encoding, as every frame buffer does. */
    if (type == SL_MSG_GET_ELEMENT_REQ && cap >= sluice_GetElementRequest_size)
        return sl_getelem_req_encode(msg, buf, len);
    if (type == SL_MSG_GET_ELEMENT_RESP && cap >= sluice_GetElementResponse_size)
        return sl_getelem_resp_encode(msg, buf, len);
    pb_ostream_t os = pb_ostream_from_buffer(buf, cap);
    if (!pb_encode(&os, mi->desc, msg))
        return SL_ETOOBIG;
    *len = os.bytes_written;
    return 0;
}

int sl_msg_decode(unsigned type, const uint8_t *buf, size_t len, void *msg, char *err, size_t errlen)
{
    const struct msg_info *mi = msg_info(type);
    if (!mi) {
        snprintf(err, errlen, "frame: unknown message type %u", type);
        return SL_EPROTO;
    }
    /* A batch's two messages and a worker's splits skip nanopb's tables
     * (getelem.c, getsplit.c). */
    if (type == SL_MSG_GET_ELEMENT_REQ || type == SL_MSG_GET_ELEMENT_RESP || type == SL_MSG_GET_SPLIT_RESP) {
        char why[160];
        int rc = type == SL_MSG_GET_ELEMENT_REQ    ? sl_getelem_req_decode(buf, len, msg, why, sizeof why)
                 : type == SL_MSG_GET_ELEMENT_RESP ? sl_getelem_resp_decode(buf, len, msg, why, sizeof why)
                                                   : sl_getsplit_resp_decode(buf, len, msg, why, sizeof why);
        if (rc < 0)
            snprintf(err, errlen, "frame: bad %s message: %s", mi->name, why);
        return rc;
    }
    pb_istream_t is = pb_istream_from_buffer(buf, len);
    if (!pb_decode(&is, mi->desc, msg)) {
        snprintf(err, errlen, "frame: bad %s message: %s", mi->name, PB_GET_ERROR(&is));
        return SL_EPROTO;
    }
    return 0;
}

int sl_frame_decode(const uint8_t *buf, size_t len, const sl_limits_t *limits, sl_frame_t *frame,
                    size_t *consumed, char *err, size_t errlen)
{
    memset(frame, 0, sizeof *frame);
    if (len < SL_FRAME_HEADER_LEN)
        return 0;
    int rc = sl_frame_hdr_decode(buf, limits, &frame->hdr, err, errlen);
    if (rc < 0)
        return rc;
    size_t total = SL_FRAME_HEADER_LEN + (size_t)frame->hdr.msg_len + frame->hdr.payload_len;
    if (len < total)
        return 0;
    frame->msg = sl_msg_new(frame->hdr.type);
    if (!frame->msg) {
        snprintf(err, errlen, "frame: out of memory");
        return -ENOMEM;
    }
    rc = sl_msg_decode(frame->hdr.type, buf + SL_FRAME_HEADER_LEN, frame->hdr.msg_len, frame->msg, err, errlen);
    if (rc < 0) {
        sl_frame_clear(frame);
        return rc;
    }
    frame->payload = buf + SL_FRAME_HEADER_LEN + frame->hdr.msg_len;
    *consumed = total;
    return 1;
}

void sl_frame_clear(sl_frame_t *frame)
{
    free(frame->msg);
    frame->msg = NULL;
}

int sl_frame_encode(unsigned type, uint32_t request_id, const void *msg, uint32_t payload_len, uint8_t *buf,
                    size_t cap, size_t *len)
{
    if (cap < SL_FRAME_HEADER_LEN)
        return SL_ETOOBIG;
    size_t mlen = 0;
    int rc = sl_msg_encode(type, msg, buf + SL_FRAME_HEADER_LEN, cap - SL_FRAME_HEADER_LEN, &mlen);
    if (rc < 0)
        return rc;
    sl_frame_hdr_t hdr = {
        .type = (uint16_t)type, .request_id = request_id, .msg_len = (uint32_t)mlen, .payload_len = payload_len};
    sl_frame_hdr_encode(&hdr, buf);
    *len = SL_FRAME_HEADER_LEN + mlen;
    return 0;
}
