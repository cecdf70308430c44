/*
 * fuzz_frame.c: libFuzzer target for the frame codec (protocol/frame.c).
 *
 * The input is what a peer could send on a connection: a handshake of
 * SL_HANDSHAKE_LEN bytes, then frames back to back. The handshake is
 * checked, and the frames are decoded whatever it said, so the fuzzer does
 * not have to find the magic before it reaches the frame decoder. Frames are
 * taken one at a time with a 1 MiB payload limit until the decoder wants
 * more bytes or fails.
 *
 * Beyond "no crash, no leak, no read outside the input" (ASan, UBSan), it
 * checks what sl_frame_decode promises: only its documented results, a
 * consumed length and payload pointer that agree with the header, and a
 * decoded message that encodes again within its bounds to bytes that decode
 * to the same message.
 *
 * Run it with scripts/fuzz.sh; seeds are in tests/fuzz/corpus/fuzz_frame/.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"

#define MAX_PAYLOAD (1u << 20)

/* Stops the run with a reason: libFuzzer reports the abort as a crash and
 * saves the input. */
#include "fuzz_check.h"

static uint8_t enc1[SL_MAX_MESSAGE_LEN];
static uint8_t enc2[SL_MAX_MESSAGE_LEN];

/* A decoded message encodes within SL_MAX_MESSAGE_LEN, and its encoding
 * decodes and encodes to the same bytes (nanopb's encoding is canonical). */
static void check_reencode(unsigned type, const void *msg)
{
    size_t n1 = 0, n2 = 0;
    CHECK(sl_msg_encode(type, msg, enc1, sizeof enc1, &n1) == 0);
    void *again = calloc(1, sl_msg_size(type));
    CHECK(again != NULL);
    char err[256];
    CHECK(sl_msg_decode(type, enc1, n1, again, err, sizeof err) == 0);
    CHECK(sl_msg_encode(type, again, enc2, sizeof enc2, &n2) == 0);
    CHECK(n1 == n2 && memcmp(enc1, enc2, n1) == 0);
    free(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    if (size < SL_HANDSHAKE_LEN)
        return 0;
    sl_role_t role = 0;
    int rc = sl_handshake_decode(data, &role, err, sizeof err);
    CHECK(rc == 0 || rc == SL_EPROTO || rc == SL_EVERSION);
    if (rc == 0)
        CHECK(role >= SL_ROLE_CLIENT && role <= SL_ROLE_DISPATCHER);
    else
        CHECK(err[0] != '\0');
    data += SL_HANDSHAKE_LEN;
    size -= SL_HANDSHAKE_LEN;

    const sl_limits_t limits = {.max_payload = MAX_PAYLOAD};
    for (;;) {
        sl_frame_t f;
        size_t consumed = 0;
        err[0] = '\0';
        rc = sl_frame_decode(data, size, &limits, &f, &consumed, err, sizeof err);
        if (rc != 1) {
            CHECK(rc == 0 || rc == SL_EPROTO || rc == SL_ETOOBIG || rc == -ENOMEM);
            CHECK(f.msg == NULL);
            CHECK(rc == 0 || err[0] != '\0');
            break;
        }
        /* The header the frame decoder saw is the one the header check sees. */
        sl_frame_hdr_t hdr;
        CHECK(sl_frame_hdr_decode(data, &limits, &hdr, err, sizeof err) == 0);
        CHECK(memcmp(&hdr, &f.hdr, sizeof hdr) == 0);
        CHECK(f.hdr.flags == 0 && f.hdr.msg_len <= SL_MAX_MESSAGE_LEN && f.hdr.payload_len <= MAX_PAYLOAD);
        CHECK(f.msg != NULL);
        CHECK(consumed == SL_FRAME_HEADER_LEN + (size_t)f.hdr.msg_len + f.hdr.payload_len);
        CHECK(consumed <= size);
        CHECK(f.payload == data + SL_FRAME_HEADER_LEN + f.hdr.msg_len);
        check_reencode(f.hdr.type, f.msg);
        sl_frame_clear(&f);
        CHECK(f.msg == NULL);
        data += consumed;
        size -= consumed;
    }
    return 0;
}
