/*
 * getelem_diff.h: the hand codecs (protocol/getelem.c, protocol/getsplit.c)
 * against nanopb, for test_getelem and fuzz_getelem. Each check runs both
 * on the same input and says what differs, NULL when nothing does. A kind
 * names the message: GET_ELEMENT's request (0) and answer (1), which have
 * both codecs, and GET_SPLIT's answer (2), which is decoded only.
 */
#ifndef SL_TEST_GETELEM_DIFF_H
#define SL_TEST_GETELEM_DIFF_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <pb_common.h>
#include <pb_decode.h>
#include <pb_encode.h>

#include "getelem.h"
#include "getsplit.h"
#include "pb_fields.h"

enum { GETELEM_DIFF_REQ, GETELEM_DIFF_RESP, GETELEM_DIFF_SPLITS, GETELEM_DIFF_KINDS };

/* The largest struct of the three kinds. */
#define GETELEM_DIFF_MAX                                                                                               \
    (sizeof(sluice_GetSplitResponse) > sizeof(sluice_GetElementResponse) ? sizeof(sluice_GetSplitResponse)            \
                                                                          : sizeof(sluice_GetElementResponse))

/* Any kind's struct, decoded by each side; an answer's encoding. */
static _Alignas(16) unsigned char getelem_diff_a[GETELEM_DIFF_MAX];
static _Alignas(16) unsigned char getelem_diff_b[GETELEM_DIFF_MAX];
static uint8_t getelem_diff_ea[sluice_GetElementResponse_size];
static uint8_t getelem_diff_eb[sluice_GetElementResponse_size];
static char getelem_diff_err[256];

static inline const pb_msgdesc_t *getelem_diff_desc(int kind)
{
    return kind == GETELEM_DIFF_SPLITS ? sluice_GetSplitResponse_fields
           : kind == GETELEM_DIFF_RESP ? sluice_GetElementResponse_fields
                                       : sluice_GetElementRequest_fields;
}

static inline size_t getelem_diff_size(int kind)
{
    return kind == GETELEM_DIFF_SPLITS ? sizeof(sluice_GetSplitResponse)
           : kind == GETELEM_DIFF_RESP ? sizeof(sluice_GetElementResponse)
                                       : sizeof(sluice_GetElementRequest);
}

static inline const char *getelem_diff_name(int kind)
{
    return kind == GETELEM_DIFF_SPLITS ? "GetSplitResponse"
           : kind == GETELEM_DIFF_RESP ? "GetElementResponse"
                                       : "GetElementRequest";
}

/* Decodes len bytes as a message of kind with pb_decode() and with the
 * hand decoder, each into a struct of the same stale bytes (as if it had
 * held another message): they must both refuse (ours with a message), or
 * both accept into the same fields, and leave the same stale bytes where
 * nanopb does (array elements past their count). On agreement *out, when
 * not NULL, points at the decoded struct (until the next check). */
static inline const char *getelem_diff_decode(int kind, const uint8_t *buf, size_t len, const void **out)
{
    size_t size = getelem_diff_size(kind);
    for (size_t i = 0; i < size; i++)
        getelem_diff_a[i] = getelem_diff_b[i] = (unsigned char)(i * 131 + len);
    pb_istream_t is = pb_istream_from_buffer(buf, len);
    bool theirs = pb_decode(&is, getelem_diff_desc(kind), getelem_diff_a);
    getelem_diff_err[0] = '\0';
    char *err = getelem_diff_err;
    size_t errlen = sizeof getelem_diff_err;
    int rc = kind == GETELEM_DIFF_SPLITS
                 ? sl_getsplit_resp_decode(buf, len, (sluice_GetSplitResponse *)getelem_diff_b, err, errlen)
             : kind == GETELEM_DIFF_RESP
                 ? sl_getelem_resp_decode(buf, len, (sluice_GetElementResponse *)getelem_diff_b, err, errlen)
                 : sl_getelem_req_decode(buf, len, (sluice_GetElementRequest *)getelem_diff_b, err, errlen);
    if (theirs && rc != 0)
        return "nanopb accepts what getelem refuses";
    if (!theirs && rc == 0)
        return "getelem accepts what nanopb refuses";
    if (rc != 0)
        return getelem_diff_err[0] ? NULL : "getelem refused without a message";
    static char differ[64];
    uint32_t tag = pb_fields_differ(getelem_diff_desc(kind), getelem_diff_a, getelem_diff_b, true);
    if (tag != 0) {
        snprintf(differ, sizeof differ, "the decoded structs differ at field %u", (unsigned)tag);
        return differ;
    }
    if (out)
        *out = getelem_diff_a;
    return NULL;
}

/* Encodes msg, GET_ELEMENT's request or answer (resp), with pb_encode() and
 * with getelem.c into buffers of the message's largest size: both must
 * refuse, or write the same bytes (kept in getelem_diff_ea until the next
 * check). */
static inline const char *getelem_diff_encode(bool resp, const void *msg)
{
    size_t cap = resp ? sluice_GetElementResponse_size : sluice_GetElementRequest_size;
    pb_ostream_t os = pb_ostream_from_buffer(getelem_diff_ea, cap);
    bool theirs = pb_encode(&os, getelem_diff_desc(resp), msg);
    size_t n = 0;
    int rc = resp ? sl_getelem_resp_encode(msg, getelem_diff_eb, &n) : sl_getelem_req_encode(msg, getelem_diff_eb, &n);
    if (theirs != (rc == 0))
        return theirs ? "getelem refuses what nanopb encodes" : "getelem encodes what nanopb refuses";
    if (theirs && (n != os.bytes_written || memcmp(getelem_diff_ea, getelem_diff_eb, n) != 0))
        return "the encodings differ";
    return NULL;
}

#endif
