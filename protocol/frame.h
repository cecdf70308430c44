/*
 * frame.h: the frame codec of the Sluice wire protocol (docs/protocol.md).
 *
 * A connection opens with a hello of SL_HANDSHAKE_LEN bytes each way:
 * magic "SLUC", protocol version (u16), role (u16), flags (u32), all
 * big-endian, and a 32-byte random nonce; with a cluster token, each side's
 * proof follows (auth.h, docs/protocol.md). Then
 * frames: a header of SL_FRAME_HEADER_LEN bytes, a nanopb message of
 * msg_len bytes, and payload_len raw bytes (batch tensors, dataset specs).
 *
 * Header, big-endian: type u16 | flags u16 | request_id u32 | msg_len u32 |
 * payload_len u32. msg_len is checked against SL_MAX_MESSAGE_LEN and
 * payload_len against sl_limits_t before a byte is allocated for either.
 */
#ifndef SL_FRAME_H
#define SL_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <pb.h>

#include "sluice.h"
#include "sluice.pb.h"

#define SL_PROTOCOL_VERSION 3
#define SL_HANDSHAKE_LEN 44
/* The part of a hello that every protocol version starts with: magic,
 * version, role. A peer of another version is told so after these. */
#define SL_HANDSHAKE_PREFIX_LEN 8
#define SL_HELLO_NONCE_LEN 32
/* Hello flags. */
#define SL_HELLO_TOKEN 1u /* this side holds a cluster token and proves it */
#define SL_FRAME_HEADER_LEN 16
/* No message of sluice.proto encodes larger than this with the bounds of
 * sluice.options; larger msg_len is a protocol violation. */
#define SL_MAX_MESSAGE_LEN (128 * 1024)

typedef enum sl_role {
    SL_ROLE_CLIENT = 1,     /* a trainer's libsluice */
    SL_ROLE_WORKER = 2,     /* sluice-workerd */
    SL_ROLE_DISPATCHER = 3, /* sluice-dispatcher */
} sl_role_t;

/* Frame types. A request's response has the request's id; SL_MSG_ERROR may
 * answer any request, or arrive with id 0 before the peer closes. */
typedef enum sl_msg_type {
    SL_MSG_ERROR = 1,
    SL_MSG_WORKER_REGISTER_REQ,
    SL_MSG_WORKER_REGISTER_RESP,
    SL_MSG_WORKER_HEARTBEAT_REQ,
    SL_MSG_WORKER_HEARTBEAT_RESP,
    SL_MSG_GET_DATASET_REQ,
    SL_MSG_GET_DATASET_RESP,
    SL_MSG_GET_SPLIT_REQ,
    SL_MSG_GET_SPLIT_RESP,
    SL_MSG_REGISTER_DATASET_REQ,
    SL_MSG_REGISTER_DATASET_RESP,
    SL_MSG_GET_OR_CREATE_JOB_REQ,
    SL_MSG_GET_OR_CREATE_JOB_RESP,
    SL_MSG_CLIENT_HEARTBEAT_REQ,
    SL_MSG_CLIENT_HEARTBEAT_RESP,
    SL_MSG_RELEASE_CLIENT_REQ,
    SL_MSG_RELEASE_CLIENT_RESP,
    SL_MSG_GET_ELEMENT_REQ,
    SL_MSG_GET_ELEMENT_RESP,
    SL_MSG_REPORT_RECEIVED_REQ,
    SL_MSG_REPORT_RECEIVED_RESP,
    SL_MSG_GET_EXCLUSIONS_REQ,
    SL_MSG_GET_EXCLUSIONS_RESP,
    SL_MSG_LOOKUP_DATASET_REQ,
    SL_MSG_LOOKUP_DATASET_RESP,
    SL_MSG_WORKER_NOTICE, /* dispatcher -> worker, request id 0, no answer: to workers that take it */
    SL_MSG_COUNT_
} sl_msg_type_t;

/* A task's state as a worker reports it in TaskStatus.state. */
typedef enum sl_task_state {
    SL_TASK_RUNNING = 0, /* producing, or holding batches not yet served */
    SL_TASK_DONE = 1,    /* end of sequence, and every batch served */
    SL_TASK_FAILED = 2,  /* the pipeline failed; TaskStatus.error says why */
} sl_task_state_t;

typedef struct sl_limits {
    uint32_t max_payload; /* largest payload accepted from the peer */
} sl_limits_t;

typedef struct sl_frame_hdr {
    uint16_t type;
    uint16_t flags;
    uint32_t request_id;
    uint32_t msg_len;
    uint32_t payload_len;
} sl_frame_hdr_t;

/** A decoded frame; see sl_frame_decode(). */
typedef struct sl_frame {
    sl_frame_hdr_t hdr;
    void *msg;              /* the decoded message, malloc'd; freed by sl_frame_clear() */
    const uint8_t *payload; /* points into the decoder's input; valid while it is */
} sl_frame_t;

/** @return the nanopb descriptor of a frame type, NULL if unknown */
const pb_msgdesc_t *sl_msg_desc(unsigned type);

/** @return the size of the C struct of a frame type's message, 0 if unknown */
size_t sl_msg_size(unsigned type);

/** Room for a frame type's message (sl_msg_size(type) bytes) to decode into
 *  with sl_msg_decode(), or NULL: zeroed, but for GET_ELEMENT's request and
 *  answer, whose decoders set every field as pb_decode() does (the answer's
 *  6 KB, most of them component slots past components_count, are made per
 *  batch). free() it. */
void *sl_msg_new(unsigned type);

/** @return a frame type's name for messages ("GET_ELEMENT_REQ"), "unknown" if unknown */
const char *sl_msg_name(unsigned type);

/**
 * @return whether a peer of role may send frames of type: a client only
 * its requests, a worker its requests to the dispatcher and its answers to
 * clients, a dispatcher its answers (conn.c refuses any other frame)
 */
bool sl_msg_allowed(unsigned role, unsigned type);

/** @return a role's name ("worker"), "unknown" if unknown */
const char *sl_role_name(unsigned role);

/** Writes our hello for role into out: flags SL_HELLO_*, nonce SL_HELLO_NONCE_LEN bytes. */
void sl_handshake_encode(uint8_t out[SL_HANDSHAKE_LEN], sl_role_t role, uint32_t flags, const uint8_t *nonce);

/**
 * Checks the first SL_HANDSHAKE_PREFIX_LEN bytes of a peer's hello.
 * @param[out] role the peer's role
 * @return 0, SL_EPROTO (bad magic or role) or SL_EVERSION, with a message in err
 */
int sl_handshake_decode(const uint8_t in[SL_HANDSHAKE_PREFIX_LEN], sl_role_t *role, char *err, size_t errlen);

/** @return the flags of a whole hello */
uint32_t sl_handshake_flags(const uint8_t in[SL_HANDSHAKE_LEN]);

void sl_frame_hdr_encode(const sl_frame_hdr_t *hdr, uint8_t out[SL_FRAME_HEADER_LEN]);

/**
 * Decodes and checks a header: known type, no flags, msg_len within
 * SL_MAX_MESSAGE_LEN, payload_len within limits->max_payload.
 * @return 0, SL_EPROTO or SL_ETOOBIG, with a message in err
 */
int sl_frame_hdr_decode(const uint8_t in[SL_FRAME_HEADER_LEN], const sl_limits_t *limits,
                        sl_frame_hdr_t *hdr, char *err, size_t errlen);

/**
 * Encodes a message of type into buf.
 * @param[out] len the encoded length
 * @return 0, SL_ETOOBIG when it does not fit in cap, SL_EINVAL for an unknown type
 */
int sl_msg_encode(unsigned type, const void *msg, uint8_t *buf, size_t cap, size_t *len);

/**
 * Decodes a message of type from buf into msg (a zeroed struct of
 * sl_msg_size(type) bytes). Strings are NUL-terminated by nanopb.
 * @return 0, or SL_EPROTO with a message in err
 */
int sl_msg_decode(unsigned type, const uint8_t *buf, size_t len, void *msg, char *err, size_t errlen);

/**
 * Decodes one whole frame from the start of a byte stream.
 * @param[out] frame on 1, the frame; its msg is malloc'd (release it with
 *             sl_frame_clear()), its payload points into buf
 * @param[out] consumed bytes of buf the frame takes, on 1
 * @return 1 with a frame, 0 when buf holds only part of one, or SL_EPROTO /
 *         SL_ETOOBIG / -ENOMEM with a message in err
 */
int sl_frame_decode(const uint8_t *buf, size_t len, const sl_limits_t *limits, sl_frame_t *frame,
                    size_t *consumed, char *err, size_t errlen);

/** Frees a decoded frame's message. */
void sl_frame_clear(sl_frame_t *frame);

/**
 * Encodes a whole frame (header and message, not the payload) into buf.
 * @param[out] len bytes written
 * @return 0, SL_ETOOBIG, SL_EINVAL
 */
int sl_frame_encode(unsigned type, uint32_t request_id, const void *msg, uint32_t payload_len,
                    uint8_t *buf, size_t cap, size_t *len);

#endif
