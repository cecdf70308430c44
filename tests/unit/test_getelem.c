/*
 * test_getelem.c: the hand codecs of GET_ELEMENT (protocol/getelem.c) and of
 * GET_SPLIT's answer (protocol/getsplit.c) against nanopb. Messages are filled, and wire bytes generated, by walking nanopb's
 * field descriptors, so a field added to sluice.proto that getelem.c does
 * not know fails here. Seeded: SLUICE_TEST_SEED repeats a run.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "frame.h"
#include "getelem_diff.h"
#include "rng.h"

static sl_rng_t rng;

static uint64_t below(uint64_t n)
{
    return sl_rng_below(&rng, n);
}

static unsigned seed_from_env(const char *test)
{
    const char *env = getenv("SLUICE_TEST_SEED");
    unsigned seed = env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)time(NULL);
    fprintf(stderr, "getelem.%s: seed %u (SLUICE_TEST_SEED=%u repeats it)\n", test, seed, seed);
    sl_rng_seed(&rng, seed);
    return seed;
}

/* A value of a random width (0 a third of the time: proto3 leaves it out). */
static uint64_t value(void)
{
    switch (below(6)) {
    case 0:
    case 1:
        return 0;
    case 2:
        return below(128);
    case 3:
        return ~(uint64_t)0 - below(3);
    default:
        return sl_rng_next(&rng) >> below(64);
    }
}

/* Fills a message of desc at msg with random values, field by field as
 * nanopb describes them. Now and then a count one past its array or a name
 * without its NUL, which both encoders must refuse. */
static void fill(const pb_msgdesc_t *desc, void *msg)
{
    pb_field_iter_t it;
    if (!pb_field_iter_begin(&it, desc, msg))
        return;
    do {
        size_t count = 1;
        if (PB_HTYPE(it.type) == PB_HTYPE_REPEATED) {
            count = below(4) == 0 ? 0 : below(it.array_size + 1);
            if (below(500) == 0)
                count = it.array_size + 1u;
            *(pb_size_t *)it.pSize = (pb_size_t)count;
            if (count > it.array_size)
                count = it.array_size;
        } else {
            cr_assert(PB_HTYPE(it.type) == PB_HTYPE_SINGULAR && it.pSize == NULL,
                      "field %u: not a proto3 singular field nor repeated, which getelem.c does not write", it.tag);
        }
        for (size_t i = 0; i < count; i++) {
            unsigned char *p = (unsigned char *)it.pData + i * it.data_size;
            uint64_t v = value();
            switch (PB_LTYPE(it.type)) {
            case PB_LTYPE_BOOL:
                *(bool *)p = v & 1;
                break;
            case PB_LTYPE_UVARINT:
            case PB_LTYPE_VARINT:
                if (it.data_size == 8)
                    memcpy(p, &v, 8);
                else if (it.data_size == 4)
                    *(uint32_t *)p = (uint32_t)v;
                else
                    cr_assert_fail("field %u: a varint of %u bytes", it.tag, (unsigned)it.data_size);
                break;
            case PB_LTYPE_FIXED_LENGTH_BYTES:
                for (size_t k = 0; k < it.data_size; k++)
                    p[k] = v ? (unsigned char)sl_rng_next(&rng) : 0;
                break;
            case PB_LTYPE_STRING: {
                size_t n = below(3) == 0 ? 0 : below(it.data_size);
                for (size_t k = 0; k < n; k++)
                    p[k] = (unsigned char)(1 + below(255));
                p[n] = '\0';
                if (below(400) == 0)
                    memset(p, 'x', it.data_size); /* no NUL */
                break;
            }
            case PB_LTYPE_BYTES: { /* a static bytes field: its size, then its bytes */
                pb_bytes_array_t *ba = (pb_bytes_array_t *)p;
                size_t max = it.data_size - offsetof(pb_bytes_array_t, bytes);
                size_t n = below(3) == 0 ? 0 : below(max + 1);
                if (below(400) == 0)
                    n = max + 1; /* over its bound */
                ba->size = (pb_size_t)n;
                for (size_t k = 0; k < n && k < max; k++)
                    ba->bytes[k] = (uint8_t)sl_rng_next(&rng);
                break;
            }
            case PB_LTYPE_SUBMESSAGE:
                fill(it.submsg_desc, p);
                break;
            default:
                cr_assert_fail("field %u is of a type (ltype %u) this test and getelem.c do not know", it.tag,
                        (unsigned)PB_LTYPE(it.type));
            }
        }
    } while (pb_field_iter_next(&it));
}

/* ---- wire bytes near the valid ones ---- */

struct out {
    uint8_t *p, *end;
};

static void put(struct out *o, uint8_t b)
{
    if (o->p < o->end)
        *o->p++ = b;
}

/* v as a varint: minimal mostly; else padded with 0x80 bytes (up to 11 in
 * all, past what either decoder allows), or, for a 32-bit field whose bit
 * 31 is set, sign-extended to 10 bytes as protobuf writes an int32. */
static void put_varint(struct out *o, uint64_t v)
{
    unsigned pad = below(8) == 0 ? (unsigned)below(11) : 0;
    if (below(16) == 0 && (v >> 31 & 1) && v <= UINT32_MAX)
        v = (uint64_t)(int64_t)(int32_t)(uint32_t)v;
    unsigned n = 0;
    while (v >= 0x80 || pad) {
        put(o, (uint8_t)(v | 0x80));
        v >>= 7;
        if (v == 0 && pad)
            pad--;
        if (++n == 10)
            break;
    }
    put(o, (uint8_t)v);
}

static void gen_msg(const pb_msgdesc_t *desc, struct out *o, int depth);

/* A value of wire type wt for a field of no use to the decoder. */
static void gen_raw(struct out *o, unsigned wt)
{
    switch (wt) {
    case 0:
        put_varint(o, value());
        break;
    case 1:
    case 5:
        for (unsigned k = 0; k < (wt == 1 ? 8u : 4u); k++)
            put(o, (uint8_t)sl_rng_next(&rng));
        break;
    case 2: {
        unsigned n = (unsigned)below(12);
        put_varint(o, below(10) == 0 ? n + below(4) : n);
        for (unsigned k = 0; k < n; k++)
            put(o, (uint8_t)sl_rng_next(&rng));
        break;
    }
    default:
        break; /* groups and wire types 6, 7: refused before their value */
    }
}

/* One field of desc (or of no tag it knows), with its wire type right
 * most of the time. */
static void gen_field(const pb_msgdesc_t *desc, struct out *o, int depth)
{
    pb_field_iter_t it;
    static uint8_t dummy[GETELEM_DIFF_MAX]; /* only walked: the descriptors' offsets */
    if (below(8) == 0 || !pb_field_iter_begin(&it, desc, dummy)) {
        uint32_t tag = below(50) == 0 ? 0 : (uint32_t)(1 + below(40));
        unsigned wt = (unsigned)below(8);
        put_varint(o, (uint64_t)tag << 3 | wt);
        gen_raw(o, wt);
        return;
    }
    for (uint64_t k = below(16); k > 0; k--)
        if (!pb_field_iter_next(&it))
            break;
    pb_type_t lt = PB_LTYPE(it.type);
    bool repeated = PB_HTYPE(it.type) == PB_HTYPE_REPEATED;
    unsigned wt = lt <= PB_LTYPE_LAST_PACKABLE ? (repeated && below(2) ? 2u : 0u) : 2u;
    if (below(20) == 0)
        wt = (unsigned)below(8);
    put_varint(o, (uint64_t)it.tag << 3 | wt);
    if (wt != 2 || lt <= PB_LTYPE_LAST_PACKABLE) {
        if (wt == 2) { /* packed */
            uint8_t body[128];
            struct out b = {body, body + sizeof body};
            for (uint64_t k = below(11); k > 0; k--)
                put_varint(&b, value());
            size_t n = (size_t)(b.p - body);
            put_varint(o, below(10) == 0 ? n + below(3) - 1 : n);
            for (size_t k = 0; k < n; k++)
                put(o, body[k]);
        } else if (wt == 0 && lt == PB_LTYPE_BOOL && below(2)) {
            put_varint(o, below(3)); /* 0, 1 or 2: true too */
        } else {
            gen_raw(o, wt);
        }
        return;
    }
    uint8_t body[2048];
    struct out b = {body, body + sizeof body};
    size_t n;
    if (lt == PB_LTYPE_SUBMESSAGE && depth < 2) {
        gen_msg(it.submsg_desc, &b, depth + 1);
    } else if (lt == PB_LTYPE_FIXED_LENGTH_BYTES || lt == PB_LTYPE_STRING || lt == PB_LTYPE_BYTES) {
        /* Mostly a length that fits (a string's NUL, a key's exact size,
         * a bytes field's bound), else any. */
        uint64_t fits = lt == PB_LTYPE_STRING  ? below(it.data_size)
                        : lt == PB_LTYPE_BYTES ? below(it.data_size - offsetof(pb_bytes_array_t, bytes) + 1)
                                               : it.data_size;
        uint64_t len = below(3) == 0 ? below(it.data_size + 4) : fits;
        for (uint64_t k = 0; k < len; k++)
            put(&b, below(10) == 0 ? 0 : (uint8_t)(1 + below(255)));
    }
    n = (size_t)(b.p - body);
    put_varint(o, below(12) == 0 ? n + below(3) - 1 : n);
    for (size_t k = 0; k < n; k++)
        put(o, body[k]);
}

static void gen_msg(const pb_msgdesc_t *desc, struct out *o, int depth)
{
    for (uint64_t k = below(depth ? 10 : 24); k > 0; k--)
        gen_field(desc, o, depth);
}

/* Changes a byte or two, or cuts the end, now and then. */
static size_t mutate(uint8_t *buf, size_t n, size_t cap)
{
    switch (below(6)) {
    case 0:
        if (n)
            buf[below(n)] = (uint8_t)sl_rng_next(&rng);
        break;
    case 1:
        if (n)
            n = below(n);
        break;
    case 2:
        if (n && n < cap) {
            size_t at = below(n);
            memmove(buf + at + 1, buf + at, n - at);
            buf[at] = (uint8_t)sl_rng_next(&rng);
            n++;
        }
        break;
    default:
        break;
    }
    return n;
}

Test(getelem, encodes_what_nanopb_encodes, .timeout = 300)
{
    seed_from_env("encodes_what_nanopb_encodes");
    static sluice_GetElementResponse m;
    unsigned refused = 0;
    for (int i = 0; i < 200000; i++) {
        bool resp = i & 1;
        memset(&m, 0, sizeof m);
        fill(getelem_diff_desc(resp), &m);
        const char *d = getelem_diff_encode(resp, &m);
        cr_assert(d == NULL, "%s message %d: %s", resp ? "GetElementResponse" : "GetElementRequest", i, d);
        /* What nanopb encodes decodes back the same on both sides. */
        pb_ostream_t os = pb_ostream_from_buffer(getelem_diff_ea, sizeof getelem_diff_ea);
        if (!pb_encode(&os, getelem_diff_desc(resp), &m)) {
            refused++;
            continue;
        }
        uint8_t wire[sluice_GetElementResponse_size];
        memcpy(wire, getelem_diff_ea, os.bytes_written);
        const void *back = NULL;
        d = getelem_diff_decode(resp, wire, os.bytes_written, &back);
        cr_assert(d == NULL, "message %d decoded: %s", i, d);
        cr_assert_not_null(back, "message %d: its own encoding refused", i);
    }
    cr_assert(refused > 0, "no message too big to encode was drawn: the refusals went untested");
}

Test(getelem, decodes_what_nanopb_decodes, .timeout = 300)
{
    seed_from_env("decodes_what_nanopb_decodes");
    unsigned accepted[GETELEM_DIFF_KINDS] = {0}, refused[GETELEM_DIFF_KINDS] = {0};
    static uint8_t buf[16384];
    for (int i = 0; i < 600000; i++) {
        int kind = i % GETELEM_DIFF_KINDS;
        struct out o = {buf, buf + sizeof buf - 1};
        gen_msg(getelem_diff_desc(kind), &o, 0);
        size_t n = (size_t)(o.p - buf);
        if (below(4) == 0)
            n = mutate(buf, n, sizeof buf);
        const void *got = NULL;
        const char *d = getelem_diff_decode(kind, buf, n, &got);
        cr_assert(d == NULL, "%s input %d (%zu bytes): %s", getelem_diff_name(kind), i, n, d);
        if (got && kind != GETELEM_DIFF_SPLITS) {
            accepted[kind]++;
            /* What both accept, both encode alike. */
            static sluice_GetElementResponse copy;
            memcpy(&copy, got, getelem_diff_size(kind));
            d = getelem_diff_encode(kind == GETELEM_DIFF_RESP, &copy);
            cr_assert(d == NULL, "input %d re-encoded: %s", i, d);
        } else if (got) {
            accepted[kind]++;
        } else {
            refused[kind]++;
        }
    }
    /* Both sides of the verdict seen, for each message. */
    for (int k = 0; k < GETELEM_DIFF_KINDS; k++)
        cr_assert(accepted[k] > 10000 && refused[k] > 10000, "%s: %u accepted, %u refused", getelem_diff_name(k),
                  accepted[k], refused[k]);
}

/* Inputs worth naming, each held to nanopb. */
Test(getelem, the_corners_of_the_wire_agree_with_nanopb)
{
    static const struct {
        int kind; /* 0, 1: GET_ELEMENT's request, answer; 2: GET_SPLIT's answer */
        const char *hex;
        bool ok;
    } cases[] = {
        {true, "", true},
        {true, "0801", true},                           /* task_id 1 */
        {true, "08010802", true},                       /* a field twice: the last wins */
        {true, "08ffffffffffffffffff01", true},         /* 2^64 - 1 in 10 bytes */
        {true, "08ffffffffffffffffff02", false},        /* the 10th byte past 1 */
        {true, "088080808080808080808000", false},      /* 11 bytes */
        {true, "1002", true},                           /* end_of_sequence 2: true */
        {true, "10ffffffff0f", true},                   /* a bool of 2^32 - 1 */
        {true, "10ffffffffffffffffff01", true},         /* a bool sign-extended */
        {true, "1080808080808080808001", false},        /* a bool too wide */
        {true, "0a00", false},                          /* task_id as bytes */
        {true, "3800", true},                           /* tag 7, reserved: skipped */
        {true, "f80100", true},                         /* tag 31: skipped */
        {true, "0b", false},                            /* wire type 3 */
        {true, "0400", false},                          /* tag 0 */
        {true, "2200", true},                           /* an empty component */
        {true, "22021803", true},                       /* a component of 1 dim, unpacked... */
        {true, "22041a020102", true},                   /* ...and packed */
        {true, "22021a05", false},                      /* packed past its component */
        {true, "220c1a0a0102030405060708090a", false},  /* 10 dims packed */
        {true, "22030a0161", true},                     /* name "a" */
        {true, "22030a0261", false},                    /* name past its end */
        {true, "22021080", false},                      /* dtype cut */
        {true, "220610ffffffff1f", false},              /* dtype over 32 bits */
        {false, "3a00", true},                          /* task_key empty: zeros... */
        {false, "3a10000102030405060708090a0b0c0d0e0f3a00", true}, /* ...also after a key */
        {false, "3a0f000102030405060708090a0b0c0d0e", false}, /* task_key of 15 */
        {false, "28ffffffff0f", true},                  /* consumer_index 2^32 - 1 */
        {false, "50ffffffff7f", true},                  /* a bool's 5th byte: a sign extension */
        {false, "50ffffffff1f", false},                 /* a bool's 5th byte: an overflow */
        {2, "", true},                                  /* no split, nothing said */
        {2, "0a00", true},                              /* a split of zeros */
        {2, "0a0408011002", true},                      /* split_id 1, begin 2 */
        {2, "0a0208010a021003", true},                  /* two splits */
        {2, "0a03080110", false},                       /* begin cut */
        {2, "0a0620ffffffff0f", true},                  /* file_index 2^32 - 1 */
        {2, "0a0620ffffffff1f", false},                 /* file_index over 32 bits */
        {2, "0801", false},                             /* splits as a varint */
        {2, "28ffffffff0f", true},                      /* retry_ms 2^32 - 1 */
        {2, "2880808080808080808002", false},           /* retry_ms's 10th byte past 1 */
        {2, "1002", true},                              /* end_of_epoch 2: true */
        {2, "0a023800", true},                          /* epoch 0 in a split */
        {2, "0a024800", true},                          /* a split's tag 9: skipped */
        {2, "0a020b00", false},                         /* a split's wire type 3 */
    };
    uint8_t buf[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = strlen(cases[i].hex) / 2;
        for (size_t k = 0; k < n; k++)
            sscanf(cases[i].hex + 2 * k, "%2hhx", &buf[k]);
        const void *got = NULL;
        const char *d = getelem_diff_decode(cases[i].kind, buf, n, &got);
        cr_assert(d == NULL, "case %zu (%s): %s", i, cases[i].hex, d);
        cr_expect((got != NULL) == cases[i].ok, "case %zu (%s): %s", i, cases[i].hex,
                  got ? "accepted" : getelem_diff_err);
    }
}

Test(getelem, a_bad_answer_names_its_field_and_byte)
{
    /* A second component whose name claims 64 bytes. */
    const uint8_t bad[] = {0x08, 0x07, 0x22, 0x00, 0x22, 0x02, 0x0a, 0x40};
    sluice_GetElementResponse *m = calloc(1, sizeof *m);
    char err[256];
    cr_assert_eq(sl_msg_decode(SL_MSG_GET_ELEMENT_RESP, bad, sizeof bad, m, err, sizeof err), SL_EPROTO);
    cr_assert_str_eq(err, "frame: bad GET_ELEMENT_RESP message: components[1].name: string overflow at byte 8");
    free(m);
}

Test(getelem, a_split_answer_holds_512_splits_and_no_more)
{
    /* Each split: split_id k (one byte), so that the entries differ. */
    static uint8_t buf[513 * 4];
    for (int k = 0; k < 513; k++) {
        buf[4 * k] = 0x0a;
        buf[4 * k + 1] = 0x02;
        buf[4 * k + 2] = 0x08;
        buf[4 * k + 3] = (uint8_t)(k & 0x7f);
    }
    const void *got = NULL;
    const char *d = getelem_diff_decode(GETELEM_DIFF_SPLITS, buf, 512 * 4, &got);
    cr_assert(d == NULL, "512 splits: %s", d);
    cr_assert_not_null(got, "512 splits refused: %s", getelem_diff_err);
    const sluice_GetSplitResponse *m = got;
    cr_assert_eq(m->splits_count, 512);
    cr_assert_eq(m->splits[511].split_id, 511 & 0x7f);
    got = NULL;
    d = getelem_diff_decode(GETELEM_DIFF_SPLITS, buf, sizeof buf, &got);
    cr_assert(d == NULL, "513 splits: %s", d);
    cr_assert_null(got, "513 splits accepted");
    cr_assert_str_eq(getelem_diff_err, "splits: array overflow at byte 2049");
}

Test(getelem, a_bad_split_answer_names_its_split_field_and_byte)
{
    /* A second split whose begin is cut. */
    const uint8_t bad[] = {0x0a, 0x00, 0x0a, 0x03, 0x08, 0x01, 0x10};
    sluice_GetSplitResponse *m = calloc(1, sizeof *m);
    char err[256];
    cr_assert_eq(sl_msg_decode(SL_MSG_GET_SPLIT_RESP, bad, sizeof bad, m, err, sizeof err), SL_EPROTO);
    cr_assert_str_eq(err, "frame: bad GET_SPLIT_RESP message: splits[1].begin: end-of-stream at byte 7");
    free(m);
}
