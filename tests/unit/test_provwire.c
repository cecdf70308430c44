/*
 * test_provwire.c: the wire encoding of provenance runs (protocol/provwire.c):
 * random runs round-trip, a shuffled batch takes a few bytes a run, and
 * every kind of bad encoding is refused with SL_EPROTO and a message naming
 * what was wrong; the same for the dense form, and a batch is encoded in
 * the form its client reads (protocol/batch.c).
 */
#include <criterion/criterion.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch.h"
#include "provwire.h"
#include "seed_util.h"

static void round_trip(const sl_provenance_run_t *runs, uint64_t n, uint64_t elements, size_t *len_out)
{
    uint8_t *wire;
    size_t len;
    cr_assert_eq(sl_provwire_encode(runs, n, &wire, &len), 0);
    sl_provenance_run_t *got;
    uint64_t m;
    char err[256];
    cr_assert_eq(sl_provwire_decode(wire, len, elements, &got, &m, err, sizeof err), 0, "%s", err);
    cr_assert_eq(m, n);
    for (uint64_t i = 0; i < n; i++)
        cr_assert(memcmp(&got[i], &runs[i], sizeof got[i]) == 0, "run %lu: (%u, %u, %lu, +%lu) came back as "
                  "(%u, %u, %lu, +%lu)", (unsigned long)i, runs[i].epoch, runs[i].file_index,
                  (unsigned long)runs[i].begin, (unsigned long)runs[i].count, got[i].epoch, got[i].file_index,
                  (unsigned long)got[i].begin, (unsigned long)got[i].count);
    /* Read with room for a few: the first ones written, none past them,
     * the same count. */
    uint64_t cap = n / 2 ? n / 2 : 1;
    sl_provenance_run_t *some = malloc((size_t)(cap + 1) * sizeof *some);
    memset(some, 0xa5, (size_t)(cap + 1) * sizeof *some);
    cr_assert_eq(sl_provwire_read_some(wire, len, elements, some, cap, &m, err, sizeof err), 0, "%s", err);
    cr_assert_eq(m, n);
    cr_assert(memcmp(some, got, (size_t)cap * sizeof *some) == 0, "the first %lu runs read differently",
              (unsigned long)cap);
    for (size_t i = 0; i < sizeof *some; i++)
        cr_assert_eq(((const uint8_t *)&some[cap])[i], 0xa5, "a run written past room for %lu", (unsigned long)cap);
    free(some);
    free(got);
    free(wire);
    if (len_out)
        *len_out = len;
}

Test(provwire, random_runs_round_trip)
{
    srand(5);
    sl_provenance_run_t runs[500];
    for (int round = 0; round < 200; round++) {
        uint64_t n = 1 + (uint64_t)(rand() % 500), elements = 0;
        int pairs = 1 + rand() % 6;
        for (uint64_t i = 0; i < n; i++) {
            int k = rand() % pairs;
            /* Epochs and files up to 2^32 - 1, begins anywhere in u64
             * (jumps forward and back), counts up to 2^40. */
            runs[i].epoch = k == 5 ? UINT32_MAX : (uint32_t)k;
            runs[i].file_index = k == 4 ? UINT32_MAX : (uint32_t)(k * 1000);
            uint64_t big = (uint64_t)rand() << 33 | (uint64_t)rand();
            runs[i].begin = rand() % 3 ? (uint64_t)(rand() % 100000) : big;
            runs[i].count = 1 + (rand() % 4 ? (uint64_t)(rand() % 5) : (uint64_t)rand() << 9);
            if (runs[i].begin + runs[i].count < runs[i].begin)
                runs[i].begin = 0;
            elements += runs[i].count;
        }
        round_trip(runs, n, elements, NULL);
    }
}

Test(provwire, many_pairs_round_trip)
{
    /* More pairs than the decoder keeps on the stack: 300 files, each
     * element of another, as a shuffle over an interleave makes them. */
    enum { N = 900 };
    static sl_provenance_run_t runs[N];
    for (int i = 0; i < N; i++)
        runs[i] = (sl_provenance_run_t){(uint32_t)(i % 2), (uint32_t)((i * 7) % 300), (uint64_t)(i / 3), 1};
    size_t len;
    round_trip(runs, N, N, &len);
    cr_assert_leq(len, (size_t)N * 4 + 300 * 4, "%zu bytes", len);
}

Test(provwire, a_shuffled_batch_takes_a_few_bytes_a_run)
{
    /* A shuffle buffer of 4096 over one file: one run per element, each
     * within the buffer of the one before. No pair index (one pair). */
    srand(9);
    enum { N = 1024 };
    sl_provenance_run_t runs[N];
    for (int i = 0; i < N; i++)
        runs[i] = (sl_provenance_run_t){0, 0, 1000000 + (uint64_t)i * 4 + (uint64_t)(rand() % 4096), 1};
    size_t len;
    round_trip(runs, N, N, &len);
    cr_assert_leq(len, (size_t)N * 4, "%zu bytes for %d runs", len, N);
    /* Two files alternating, each in order: a pair index, a distance of
     * 0 and a count, 3 bytes a run. */
    for (int i = 0; i < N; i++)
        runs[i] = (sl_provenance_run_t){2, (uint32_t)(i % 2), (uint64_t)(i / 2) * 3, 3};
    round_trip(runs, N, 3 * N, &len);
    cr_assert_leq(len, (size_t)N * 3 + 16, "%zu bytes for %d runs", len, N);
    /* One run: a handful of bytes. */
    sl_provenance_run_t one = {0, 0, 5, 1024};
    round_trip(&one, 1, 1024, &len);
    cr_assert_leq(len, 8);
}

Test(provwire, nothing_is_no_runs)
{
    sl_provenance_run_t *runs = (sl_provenance_run_t *)1;
    uint64_t n = 7;
    char err[256];
    cr_assert_eq(sl_provwire_decode(NULL, 0, 10, &runs, &n, err, sizeof err), 0);
    cr_assert_null(runs);
    cr_assert_eq(n, 0);
}

static uint8_t *put(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

/* Decodes len bytes of buf for elements elements; expects SL_EPROTO with
 * want in the message. */
static void refused(const uint8_t *buf, size_t len, uint64_t elements, const char *want)
{
    sl_provenance_run_t *runs = NULL;
    uint64_t n = 0;
    char err[256] = "";
    cr_assert_eq(sl_provwire_decode(buf, len, elements, &runs, &n, err, sizeof err), SL_EPROTO,
                 "accepted, expected \"%s\"", want);
    cr_assert_null(runs);
    cr_assert_eq(n, 0);
    cr_assert(strstr(err, want), "\"%s\" does not say \"%s\"", err, want);
    cr_assert(strncmp(err, "provenance", 10) == 0, "\"%s\" does not name the provenance", err);
}

Test(provwire, bad_encodings_are_refused_with_what_was_wrong)
{
    uint8_t b[64], *p;
    /* Good: 2 pairs (0, 0) and (1, 7); 2 runs: pair 1 at 4 +3, pair 0 at 2 +1. */
    p = put(put(put(put(put(b, 2), 0), 0), 1), 7);
    p = put(p, 2);
    p = put(put(put(p, 1), 8), 3);
    p = put(put(put(p, 0), 4), 1);
    size_t good = (size_t)(p - b);
    sl_provenance_run_t *runs;
    uint64_t n;
    char err[256];
    cr_assert_eq(sl_provwire_decode(b, good, 4, &runs, &n, err, sizeof err), 0, "%s", err);
    cr_assert_eq(n, 2);
    cr_assert(runs[0].epoch == 1 && runs[0].file_index == 7 && runs[0].begin == 4 && runs[0].count == 3);
    cr_assert(runs[1].epoch == 0 && runs[1].file_index == 0 && runs[1].begin == 2 && runs[1].count == 1);
    free(runs);

    refused(b, good - 1, 4, "2 runs of 2 pairs for 4 elements, in 5 bytes left of 11");
    uint8_t cut = 0x80;
    refused(&cut, 1, 4, "the number of (epoch, file) pairs at byte 0 runs past the end of the 1 bytes");
    refused(b, good, 5, "runs count 4 records, the batch holds 5");
    refused(b, good, 3, "run 1 counts 1 records from 2; the batch holds 3 records and the runs before it count 3");
    uint8_t extra[64];
    memcpy(extra, b, good);
    extra[good] = 0;
    refused(extra, good + 1, 4, "1 bytes left over after the last run, at byte 12 of 13");

    /* No pairs (the dense form's marker, with nothing after it); more
     * pairs than elements; more runs than elements. */
    p = put(b, 0);
    refused(b, (size_t)(p - b), 4, "the dense form's number of pairs at byte 1 runs past the end");
    p = put(put(put(put(put(b, 2), 0), 0), 1), 7);
    refused(b, (size_t)(p - b), 1, "2 (epoch, file) pairs for 1 elements");
    p = put(put(put(b, 1), 0), 0);
    p = put(p, 3);
    for (int i = 0; i < 3; i++)
        p = put(put(p, 0), 1);
    refused(b, (size_t)(p - b), 2, "3 runs of 1 pairs for 2 elements");

    /* A pair index past the table; an epoch over 32 bits; a count of 0. */
    p = put(put(put(put(put(b, 2), 0), 0), 1), 7);
    p = put(p, 2);
    p = put(put(put(p, 2), 0), 1);
    p = put(put(put(p, 0), 0), 1);
    refused(b, (size_t)(p - b), 2, "run 0: pair 2 of 2");
    p = put(put(put(b, 1), 1ull << 32), 0);
    p = put(put(put(p, 1), 0), 1);
    refused(b, (size_t)(p - b), 1, "pair 0 is (epoch 4294967296, file 0)");
    p = put(put(put(b, 1), 0), 0);
    p = put(put(put(p, 1), 0), 0);
    refused(b, (size_t)(p - b), 1, "run 0 counts 0 records");

    /* A run ending past 2^64: begin 2^64 - 1 (zig-zag of -1 is 1), count 2. */
    p = put(put(put(b, 1), 0), 0);
    p = put(put(put(p, 1), 1), 2);
    refused(b, (size_t)(p - b), 2, "run 0 counts 2 records from 18446744073709551615");

    /* A varint of 11 bytes. */
    memset(b, 0xff, 11);
    b[11] = 0;
    refused(b, 12, 4, "the number of (epoch, file) pairs at byte 0 is not a varint of at most 64 bits");
}

/* ---- split-done notices ---- */

static sl_split_done_t *notices_decode(const uint8_t *wire, size_t len, uint64_t *n, int *rc, char *err,
                                       size_t errlen)
{
    *rc = sl_provwire_read_done(wire, len, NULL, 0, n, err, errlen);
    if (*rc < 0 || *n == 0)
        return NULL;
    sl_split_done_t *d = malloc(*n * sizeof *d);
    cr_assert_not_null(d);
    *rc = sl_provwire_read_done(wire, len, d, (size_t)*n, n, err, errlen);
    return d;
}

Test(provwire, notices_round_trip_however_many_there_are)
{
    /* A large shuffle buffer finishes hundreds of splits in its last
     * batches; an end of sequence carries every one that is left. */
    srand(11);
    static sl_split_done_t d[5000];
    for (int round = 0; round < 20; round++) {
        size_t n = 1 + (size_t)(rand() % 5000);
        uint64_t id = (uint64_t)rand();
        for (size_t i = 0; i < n; i++) {
            /* Ids mostly rising, sometimes falling (a lost task's split
             * handed out again); any epoch, file and range. */
            id = rand() % 8 ? id + 1 + (uint64_t)(rand() % 3) : id - (uint64_t)(rand() % 1000);
            uint64_t begin = rand() % 4 ? (uint64_t)rand() * 1024 : UINT64_MAX - 5000;
            uint64_t len = (uint64_t)(rand() % 5000);
            d[i] = (sl_split_done_t){.split_id = id,
                                     .epoch = rand() % 5 ? (uint32_t)(rand() % 3) : UINT32_MAX,
                                     .file_index = rand() % 5 ? (uint32_t)(rand() % 400) : UINT32_MAX,
                                     .begin = begin,
                                     .end = begin + len,
                                     .delivered = len ? (uint64_t)rand() % (len + 1) : 0};
        }
        uint8_t *wire;
        size_t len;
        cr_assert_eq(sl_provwire_encode_done(d, n, &wire, &len), 0);
        uint64_t m = 0;
        int rc;
        char err[256];
        sl_split_done_t *got = notices_decode(wire, len, &m, &rc, err, sizeof err);
        cr_assert_eq(rc, 0, "%s", err);
        cr_assert_eq(m, n);
        cr_assert(memcmp(got, d, n * sizeof *d) == 0, "round %d: %zu notices did not come back", round, n);
        free(got);
        free(wire);
    }
}

Test(provwire, notices_read_into_a_room_only_when_they_fit)
{
    sl_split_done_t d[5];
    for (uint64_t i = 0; i < 5; i++)
        d[i] = (sl_split_done_t){.split_id = 40 + i, .epoch = 1, .file_index = 2, .begin = 1024 * i,
                                 .end = 1024 * i + 1000, .delivered = 7 * i};
    for (size_t n = 1; n <= 5; n++) {
        uint8_t *wire;
        size_t len;
        cr_assert_eq(sl_provwire_encode_done(d, n, &wire, &len), 0);
        sl_split_done_t room[4];
        memset(room, 0xa5, sizeof room);
        uint64_t m = 0;
        char err[256];
        cr_assert_eq(sl_provwire_read_done(wire, len, room, 4, &m, err, sizeof err), 0, "%s", err);
        cr_assert_eq(m, n, "%zu notices counted as %" PRIu64, n, m);
        if (n <= 4) {
            cr_assert(memcmp(room, d, n * sizeof *d) == 0, "%zu notices did not come back in one call", n);
        } else {
            for (size_t i = 0; i < sizeof room; i++)
                cr_assert_eq(((const uint8_t *)room)[i], 0xa5, "5 notices written into a room of 4");
        }
        free(wire);
    }
}

Test(provwire, encodings_into_a_room_are_the_allocated_ones)
{
    /* One run fits a room of 128 bytes (the bound is 70), three do not;
     * one notice fits (70), two do not in 128 (130). */
    sl_provenance_run_t runs[3] = {{1, 2, 5000000, 1024}, {1, 2, 6000000, 7}, {1, 3, 0, 1}};
    sl_split_done_t notices[2] = {{.split_id = 9, .epoch = 1, .file_index = 2, .begin = 0, .end = 4096, .delivered = 4},
                                  {.split_id = 10, .epoch = 1, .file_index = 2, .begin = 4096, .end = 8192}};
    uint8_t room[128];
    for (uint64_t n = 1; n <= 3; n++) {
        uint8_t *heap, *in;
        size_t heap_len, in_len;
        cr_assert_eq(sl_provwire_encode(runs, n, &heap, &heap_len), 0);
        cr_assert_eq(sl_provwire_encode_in(runs, n, room, sizeof room, &in, &in_len), 0);
        cr_assert_eq(in == room, n <= 2, "%" PRIu64 " runs: %s the room", n, in == room ? "in" : "not in");
        cr_assert(in_len == heap_len && memcmp(in, heap, in_len) == 0, "%" PRIu64 " runs encode differently", n);
        if (in != room)
            free(in);
        free(heap);
    }
    for (size_t n = 1; n <= 2; n++) {
        uint8_t *heap, *in;
        size_t heap_len, in_len;
        cr_assert_eq(sl_provwire_encode_done(notices, n, &heap, &heap_len), 0);
        cr_assert_eq(sl_provwire_encode_done_in(notices, n, room, sizeof room, &in, &in_len), 0);
        cr_assert_eq(in == room, n == 1, "%zu notices: %s the room", n, in == room ? "in" : "not in");
        cr_assert(in_len == heap_len && memcmp(in, heap, in_len) == 0, "%zu notices encode differently", n);
        if (in != room)
            free(in);
        free(heap);
    }
}

Test(provwire, one_run_into_a_room_is_the_general_encoding)
{
    /* A room of exactly the bound takes one run; the allocated encoding
     * goes through the general loops. Extremes of every field. */
    unsigned seed = test_seed("one_run_into_a_room_is_the_general_encoding");
    srand(seed);
    const uint64_t edges[] = {0, 1, 127, 128, 16383, 16384, UINT32_MAX, (uint64_t)1 << 63, UINT64_MAX - 1};
    uint8_t room[70];
    for (int round = 0; round < 2000; round++) {
        sl_provenance_run_t r = {
            .epoch = rand() % 4 ? (uint32_t)rand() % 300 : UINT32_MAX,
            .file_index = rand() % 4 ? (uint32_t)rand() : UINT32_MAX,
            .begin = rand() % 2 ? edges[rand() % 9] : (uint64_t)rand() << 31 | (uint64_t)rand(),
            .count = 1 + (rand() % 2 ? edges[rand() % 7] : (uint64_t)rand() % 5000),
        };
        if (r.begin + r.count < r.begin)
            r.begin = UINT64_MAX - r.count;
        uint8_t *heap, *in;
        size_t heap_len, in_len;
        cr_assert_eq(sl_provwire_encode(&r, 1, &heap, &heap_len), 0);
        cr_assert_eq(sl_provwire_encode_in(&r, 1, room, sizeof room, &in, &in_len), 0);
        cr_assert_eq(in, room);
        cr_assert(in_len == heap_len && memcmp(in, heap, in_len) == 0,
                  "seed %u: (%u, %u, %" PRIu64 ", +%" PRIu64 ") encodes differently in a room", seed, r.epoch,
                  r.file_index, r.begin, r.count);
        sl_provenance_run_t back;
        uint64_t m = 0;
        char err[256];
        cr_assert_eq(sl_provwire_read_some(in, in_len, r.count, &back, 1, &m, err, sizeof err), 0, "%s", err);
        cr_assert(m == 1 && memcmp(&back, &r, sizeof r) == 0, "seed %u: the run came back changed", seed);
        free(heap);
    }
}

/* The one-run path of sl_provwire_read_some() against the general reader:
 * one-run encodings, well formed and then with bytes changed, cut, added,
 * and read for the wrong number of records: the same result, run, count
 * and message every time. */
Test(provwire, one_run_reads_as_the_general_reader_does)
{
    unsigned seed = test_seed("one_run_reads_as_the_general_reader_does");
    srand(seed);
    uint8_t room[80];
    unsigned accepted = 0, refused = 0;
    for (int round = 0; round < 20000; round++) {
        sl_provenance_run_t r = {.epoch = rand() % 8 ? (uint32_t)rand() % 50 : UINT32_MAX,
                                 .file_index = rand() % 8 ? (uint32_t)rand() % 1000 : UINT32_MAX,
                                 .begin = rand() % 4 ? (uint64_t)rand() : UINT64_MAX - 2000,
                                 .count = 1 + (uint64_t)(rand() % 1500)};
        uint8_t *wire;
        size_t len;
        cr_assert_eq(sl_provwire_encode_in(&r, 1, room, sizeof room, &wire, &len), 0);
        uint64_t elements = r.count;
        switch (rand() % 6) {
        case 0: /* as it is */
            break;
        case 1: /* a byte changed */
            wire[rand() % len] ^= (uint8_t)(1 + rand() % 255);
            break;
        case 2: /* cut */
            len = (size_t)rand() % len;
            break;
        case 3: /* a byte more */
            wire[len++] = (uint8_t)rand();
            break;
        case 4: /* the wrong number of records */
            elements = rand() % 2 ? elements + 1 : elements - 1;
            break;
        default: /* a varint made longer than it need be, or past 64 bits */
            for (size_t i = 0, k = (size_t)rand() % 6; i < k && len < sizeof room; i++) {
                size_t at = (size_t)rand() % len;
                memmove(wire + at + 1, wire + at, len - at);
                wire[at] = 0x80 | (uint8_t)rand();
                len++;
            }
            break;
        }
        sl_provenance_run_t a = {5, 5, 5, 5}, b = {5, 5, 5, 5};
        uint64_t na = 9, nb = 9;
        char ea[256] = "", eb[256] = "";
        int rca = sl_provwire_read_some(wire, len, elements, &a, 1, &na, ea, sizeof ea);
        int rcb = sl_provwire_read_general(wire, len, elements, &b, 1, &nb, eb, sizeof eb);
        cr_assert(rca == rcb && na == nb && memcmp(&a, &b, sizeof a) == 0 && strcmp(ea, eb) == 0,
                  "seed %u, round %d: %d %lu (%s) against the general reader's %d %lu (%s)", seed, round, rca,
                  (unsigned long)na, ea, rcb, (unsigned long)nb, eb);
        if (rca == 0)
            accepted++;
        else
            refused++;
    }
    cr_assert(accepted > 2000 && refused > 2000, "seed %u: %u accepted, %u refused", seed, accepted, refused);
}

Test(provwire, notices_take_a_few_bytes_each)
{
    static sl_split_done_t d[1000];
    for (uint64_t i = 0; i < 1000; i++)
        d[i] = (sl_split_done_t){.split_id = 5000 + i, .epoch = 2, .file_index = 7, .begin = i * 1024,
                                 .end = i * 1024 + 1024, .delivered = 1024};
    uint8_t *wire;
    size_t len;
    cr_assert_eq(sl_provwire_encode_done(d, 1000, &wire, &len), 0);
    cr_assert_lt(len, 1000 * 10, "1000 notices took %zu bytes", len);
    free(wire);
}

Test(provwire, bad_notices_are_refused_by_name)
{
    char err[256];
    uint64_t n = 99;
    /* Empty: no notices. */
    cr_assert_eq(sl_provwire_read_done(NULL, 0, NULL, 0, &n, err, sizeof err), 0);
    cr_assert_eq(n, 0);
    struct {
        const char *what;
        uint8_t bytes[16];
        size_t len;
        const char *says;
    } bad[] = {
        {"a count of zero", {0}, 1, "0 of them"},
        {"more notices than the bytes hold", {3, 0, 0, 0, 0, 0, 0}, 7, "3 of them in 7 bytes"},
        {"cut short", {1, 2, 0, 0, 0, 0, 0x80}, 7, "runs past the end"},
        {"an epoch past 32 bits", {1, 0, 0x80, 0x80, 0x80, 0x80, 0x10, 0, 0, 0, 0}, 11, "out of range"},
        {"more delivered than the split holds", {1, 0, 0, 0, 0, 4, 5}, 7, "5 delivered"},
        {"bytes left over", {1, 0, 0, 0, 0, 4, 4, 9}, 8, "left over"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        int rc = sl_provwire_read_done(bad[i].bytes, bad[i].len, NULL, 0, &n, err, sizeof err);
        cr_assert_eq(rc, SL_EPROTO, "%s: accepted", bad[i].what);
        cr_assert(strstr(err, bad[i].says), "%s: the message \"%s\" does not say \"%s\"", bad[i].what, err,
                  bad[i].says);
    }
}

/* Expands runs to one record each, as the dense form decodes. */
static uint64_t records_of(const sl_provenance_run_t *runs, uint64_t n, sl_provenance_run_t *out)
{
    uint64_t k = 0;
    for (uint64_t i = 0; i < n; i++)
        for (uint64_t j = 0; j < runs[i].count; j++)
            out[k++] = (sl_provenance_run_t){runs[i].epoch, runs[i].file_index, runs[i].begin + j, 1};
    return k;
}

/* A shuffled batch of one (epoch, file): each record a 1- to 4-byte offset
 * from the least, read back one run a record in element order, at every
 * width and at the top of u64; batches of single records only (which the
 * encoder writes four at a time where the CPU has AVX2) and with some runs
 * of two, of every count of runs up to 1024 (the vector path's tail). */
Test(provwire, dense_batches_round_trip_at_every_width)
{
    srand(9);
    static sl_provenance_run_t runs[1024], want[2048], got[2048];
    const uint64_t spans[] = {200, 60000, 9000000, 4000000000u};
    const uint64_t bases[] = {0, 123456789, UINT64_MAX - 4000000001u};
    for (int s = 0; s < 4; s++)
        for (int b = 0; b < 3; b++)
            for (uint64_t n = 1; n <= 1024; n = n < 40 ? n + 1 : n * 3 + 1) {
                bool singles = n % 2;
                uint64_t records = 0;
                for (uint64_t i = 0; i < n; i++) {
                    uint64_t at = ((uint64_t)rand() << 31 | (uint64_t)rand()) % spans[s];
                    uint64_t count = singles || rand() % 8 ? 1 : 2;
                    if (at + count > spans[s])
                        at = spans[s] - count;
                    runs[i] = (sl_provenance_run_t){7, 3, bases[b] + at, count};
                    records += count;
                }
                uint8_t *wire;
                size_t len;
                int rc = sl_provwire_encode_dense(runs, n, records, &wire, &len);
                uint64_t lo = UINT64_MAX, hi = 0;
                for (uint64_t i = 0; i < n; i++) {
                    lo = runs[i].begin < lo ? runs[i].begin : lo;
                    hi = runs[i].begin + runs[i].count - 1 > hi ? runs[i].begin + runs[i].count - 1 : hi;
                }
                unsigned w = hi - lo < 256 ? 1 : hi - lo < 65536 ? 2 : hi - lo < 16777216 ? 3 : 4;
                /* At the top of u64 4-byte offsets could run past 2^64:
                 * the reader would refuse that, so the encoder does not
                 * use the form. */
                if (n * 2 <= records || (b == 2 && w == 4)) {
                    cr_assert_eq(rc, 1, "dense for %lu runs of %lu records", (unsigned long)n,
                                 (unsigned long)records);
                    continue;
                }
                cr_assert_eq(rc, 0);
                cr_assert_leq(len, 16 + records * w, "%zu bytes for %lu records of a span of %lu", len,
                              (unsigned long)records, (unsigned long)spans[s]);
                cr_assert_eq(sl_provwire_max_runs(wire, len, records), records);
                uint64_t m = 0;
                char err[256];
                cr_assert_eq(sl_provwire_read(wire, len, records, NULL, &m, err, sizeof err), 0, "%s", err);
                cr_assert_eq(m, records);
                cr_assert_eq(sl_provwire_read(wire, len, records, got, &m, err, sizeof err), 0, "%s", err);
                sl_provenance_run_t first[2] = {{0}, {5, 5, 5, 5}};
                cr_assert_eq(sl_provwire_read_some(wire, len, records, first, 1, &m, err, sizeof err), 0, "%s", err);
                cr_assert(m == records && memcmp(&first[0], &got[0], sizeof got[0]) == 0 && first[1].epoch == 5,
                          "the dense form read for one record");
                uint64_t k = records_of(runs, n, want);
                cr_assert_eq(m, k);
                for (uint64_t i = 0; i < k; i++)
                    cr_assert(memcmp(&got[i], &want[i], sizeof got[i]) == 0,
                              "span %lu base %d: record %lu is %lu, not %lu", (unsigned long)spans[s], b,
                              (unsigned long)i, (unsigned long)got[i].begin, (unsigned long)want[i].begin);
                /* The wrong number of records is refused. */
                cr_assert_eq(sl_provwire_read(wire, len, records + 1, NULL, &m, err, sizeof err), SL_EPROTO);
                free(wire);
            }
}

/* Interleaved files behind a shuffle: each record names its pair, and its
 * offset is from that pair's least record. */
Test(provwire, dense_batches_of_many_files_round_trip)
{
    srand(11);
    static sl_provenance_run_t runs[1024], got[1024];
    for (unsigned pairs = 2; pairs <= 256; pairs *= 2) {
        for (int i = 0; i < 1024; i++) {
            unsigned k = (unsigned)rand() % pairs;
            /* Files far apart in their records, each within 60000. */
            runs[i] = (sl_provenance_run_t){k % 3, k, (uint64_t)k * 1000000007u + (uint64_t)(rand() % 60000), 1};
        }
        uint8_t *wire;
        size_t len;
        cr_assert_eq(sl_provwire_encode_dense(runs, 1024, 1024, &wire, &len), 0, "%u pairs", pairs);
        cr_assert_leq(len, pairs * 15 + 8 + 1024 * 3, "%zu bytes for %u pairs", len, pairs);
        uint64_t m = 0;
        char err[256];
        cr_assert_eq(sl_provwire_read(wire, len, 1024, got, &m, err, sizeof err), 0, "%s", err);
        cr_assert_eq(m, 1024);
        cr_assert(memcmp(got, runs, sizeof got) == 0, "%u pairs: the records came back otherwise", pairs);
        /* A record naming a pair past the table is refused. */
        size_t first_index = len - 1024 * 3;
        wire[first_index + 500] = (uint8_t)pairs;
        if (pairs < 256) {
            cr_assert_eq(sl_provwire_read(wire, len, 1024, NULL, &m, err, sizeof err), SL_EPROTO);
            cr_assert(strstr(err, "a dense record names pair"), "%s", err);
        }
        free(wire);
    }
    /* 257 pairs: the runs form. */
    for (int i = 0; i < 1024; i++)
        runs[i] = (sl_provenance_run_t){0, (uint32_t)(i % 257), (uint64_t)i, 1};
    uint8_t *wire = NULL;
    size_t len = 0;
    cr_assert_eq(sl_provwire_encode_dense(runs, 1024, 1024, &wire, &len), 1);
    cr_assert_null(wire);
}

/* The dense form is for at most 256 (epoch, file) pairs, each within 2^32,
 * mostly single records: otherwise the encoder says so and the runs form
 * is used. */
Test(provwire, dense_form_only_where_it_applies)
{
    uint8_t *wire = NULL;
    size_t len = 0;
    sl_provenance_run_t far[] = {{0, 0, 0, 1}, {0, 0, UINT64_C(1) << 33, 1}, {0, 0, 7, 1}};
    cr_assert_eq(sl_provwire_encode_dense(far, 3, 3, &wire, &len), 1);
    sl_provenance_run_t long_runs[] = {{0, 0, 0, 100}, {0, 0, 500, 100}};
    cr_assert_eq(sl_provwire_encode_dense(long_runs, 2, 200, &wire, &len), 1);
    sl_provenance_run_t miscounted[] = {{0, 0, 0, 1}, {0, 0, 5, 1}, {0, 0, 9, 1}};
    cr_assert_eq(sl_provwire_encode_dense(miscounted, 3, 4, &wire, &len), 1);
    /* Runs of no records (at record 0 too, where count - 1 and ~begin are
     * both the largest word) and runs that reach record 2^64 - 1, of the
     * first pair and of a later one. */
    const uint64_t top = UINT64_MAX;
    sl_provenance_run_t odd[][3] = {
        {{0, 0, 0, 0}, {0, 0, 5, 1}, {0, 0, 9, 2}},   {{0, 0, 4, 1}, {0, 0, 5, 0}, {0, 0, 9, 2}},
        {{0, 0, 4, 1}, {1, 0, 0, 0}, {0, 0, 9, 2}},   {{0, 0, 4, 1}, {0, 3, 5, 0}, {0, 0, 9, 2}},
        {{0, 0, top, 1}, {0, 0, 5, 1}, {0, 0, 9, 1}}, {{0, 0, top - 5, 1}, {0, 0, top - 2, 2}, {0, 0, 9, 0}},
        {{0, 0, 4, 1}, {0, 1, top, 1}, {0, 0, 9, 1}}, {{0, 1, 4, 1}, {0, 0, top - 1, 2}, {0, 1, 9, 0}},
    };
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        uint64_t records = odd[i][0].count + odd[i][1].count + odd[i][2].count;
        cr_assert_eq(sl_provwire_encode_dense(odd[i], 3, records, &wire, &len), 1, "case %zu", i);
    }
    /* A run that wraps past 2^64 among many single records (so that the
     * batch is mostly single records) from a least record whose byte
     * offsets fit, as the first pair's and as a later one's. */
    sl_provenance_run_t wraps[400];
    for (int later = 0; later < 2; later++) {
        for (size_t i = 0; i < 400; i++)
            wraps[i] = (sl_provenance_run_t){0, 0, top - 255, 1};
        wraps[1].begin = top - 100;
        wraps[1].count = 300;
        if (later)
            wraps[0].file_index = 1;
        cr_assert_eq(sl_provwire_encode_dense(wraps, 400, 699, &wire, &len), 1, "later pair: %d", later);
    }
    cr_assert_null(wire);
    /* The record just below stays in the dense form (offsets of a byte from
     * 2^64 - 256, the highest least record they fit). */
    sl_provenance_run_t high[] = {{0, 0, top - 255, 1}, {0, 0, top - 1, 1}, {0, 0, top - 2, 1}};
    cr_assert_eq(sl_provwire_encode_dense(high, 3, 3, &wire, &len), 0);
    uint64_t m = 0;
    sl_provenance_run_t back[3];
    char err[256] = "";
    cr_assert_eq(sl_provwire_read(wire, len, 3, back, &m, err, sizeof err), 0, "%s", err);
    cr_assert_eq(m, 3);
    cr_assert_eq(back[1].begin, top - 1);
    free(wire);
}

static void refused_dense(const uint8_t *wire, size_t len, uint64_t records, const char *says)
{
    char err[256] = "";
    uint64_t m = 99;
    cr_assert_eq(sl_provwire_read(wire, len, records, NULL, &m, err, sizeof err), SL_EPROTO, "accepted: %s", says);
    cr_assert(strstr(err, says), "\"%s\" does not say \"%s\"", err, says);
    cr_assert_eq(m, 0);
}

Test(provwire, bad_dense_forms_are_refused_with_what_was_wrong)
{
    /* 0 marker, 1 pair: epoch 1, file 2, least 10; width 1, offsets 0 and 5. */
    const uint8_t good[] = {0, 1, 1, 2, 10, 1, 0, 5};
    uint64_t m;
    char err[256];
    cr_assert_eq(sl_provwire_read(good, sizeof good, 2, NULL, &m, err, sizeof err), 0, "%s", err);
    cr_assert_eq(m, 2);
    const uint8_t width0[] = {0, 1, 1, 2, 10, 0, 0, 5};
    refused_dense(width0, sizeof width0, 2, "width at byte 5 is out of range");
    const uint8_t width5[] = {0, 1, 1, 2, 10, 5, 0, 0, 0, 0, 0};
    refused_dense(width5, sizeof width5, 1, "width at byte 5 is out of range");
    refused_dense(good, 5, 2, "width at byte 5 is missing");
    refused_dense(good, sizeof good - 1, 2, "1 bytes of 1-byte records for 2 records");
    refused_dense(good, sizeof good, 3, "2 bytes of 1-byte records for 3 records");
    const uint8_t odd[] = {0, 1, 1, 2, 10, 2, 0, 5, 1};
    refused_dense(odd, sizeof odd, 1, "3 bytes of 2-byte records for 1 records");
    /* Two pairs: an index byte a record, then the offsets. */
    const uint8_t two[] = {0, 2, 0, 0, 10, 0, 1, 7, 1, 1, 0, 3, 4};
    sl_provenance_run_t r2[2];
    cr_assert_eq(sl_provwire_read(two, sizeof two, 2, r2, &m, err, sizeof err), 0, "%s", err);
    cr_assert(m == 2 && r2[0].file_index == 1 && r2[0].begin == 10 && r2[1].file_index == 0 && r2[1].begin == 14);
    refused_dense(two, sizeof two, 1, "dense form of 2 (epoch, file) pairs");
    const uint8_t no_pairs[] = {0, 0, 1, 0};
    refused_dense(no_pairs, sizeof no_pairs, 1, "dense form of 0 (epoch, file) pairs");
    /* Epoch past 32 bits: 2^32 as a varint. */
    const uint8_t big_epoch[] = {0, 1, 0x80, 0x80, 0x80, 0x80, 0x10, 2, 10, 1, 0};
    refused_dense(big_epoch, sizeof big_epoch, 1, "more than 32 bits");
    /* Least record 2^64 - 2 with 1-byte offsets: runs past 2^64. */
    const uint8_t top[] = {0, 1, 1, 2, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 1, 0};
    refused_dense(top, sizeof top, 1, "run past 2^64");
    const uint8_t cut[] = {0, 1, 1};
    refused_dense(cut, sizeof cut, 1, "dense form of 1 (epoch, file) pairs");
    /* The marker is the one byte 0: a longer varint of 0 is a runs form of
     * no pairs, refused (found by fuzz_provwire: its records would have
     * been more than a reader makes room for by sl_provwire_max_runs()). */
    const uint8_t long_zero[] = {0x80, 0, 1, 6, 10, 1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
    cr_assert_eq(sl_provwire_max_runs(long_zero, sizeof long_zero, 14), 10);
    char e2[256];
    uint64_t m2 = 0;
    cr_assert_eq(sl_provwire_read(long_zero, sizeof long_zero, 14, NULL, &m2, e2, sizeof e2), SL_EPROTO);
    cr_assert(strstr(e2, "0 (epoch, file) pairs"), "%s", e2);
}

/* What a worker sends: the dense form to a client that reads it, the runs
 * form to one that does not, also for a batch encoded dense before (sent
 * again after a reconnect); a runs encoding serves both. */
Test(provwire, a_batch_is_encoded_in_the_form_its_client_reads)
{
    sl_wire_batch_t b = {0};
    b.prov_heap = malloc(64 * sizeof *b.prov_heap);
    cr_assert_not_null(b.prov_heap);
    for (int i = 0; i < 64; i++)
        b.prov_heap[i] = (sl_provenance_run_t){0, 2, 1000 + (uint64_t)((i * 37) % 64) * 3, 1};
    b.prov_n = 64;
    cr_assert_eq(sl_wire_batch_encode_prov(&b, true), 0);
    cr_assert(b.prov_wire && b.prov_wire_dense && b.prov_wire[0] == 0, "a shuffled batch not sent dense");
    uint8_t *dense = b.prov_wire;
    cr_assert_eq(sl_wire_batch_encode_prov(&b, true), 0);
    cr_assert_eq(b.prov_wire, dense, "encoded again for the same client");
    cr_assert_eq(sl_wire_batch_encode_prov(&b, false), 0);
    cr_assert(b.prov_wire && !b.prov_wire_dense && b.prov_wire[0] == 1, "a client without the form got it");
    uint8_t *runs = b.prov_wire;
    cr_assert_eq(sl_wire_batch_encode_prov(&b, true), 0);
    cr_assert_eq(b.prov_wire, runs, "the runs form serves a dense client too");
    sl_provenance_run_t got[64];
    uint64_t m;
    char err[256];
    cr_assert_eq(sl_provwire_read(b.prov_wire, b.prov_wire_len, 64, got, &m, err, sizeof err), 0, "%s", err);
    cr_assert(m == 64 && memcmp(got, b.prov_heap, sizeof got) == 0);
    /* Records of two files (an interleave behind the shuffle): dense, with
     * two pairs, read back record by record. */
    sl_wire_batch_t two = {0};
    two.prov_heap = malloc(64 * sizeof *two.prov_heap);
    cr_assert_not_null(two.prov_heap);
    for (int i = 0; i < 64; i++)
        two.prov_heap[i] = (sl_provenance_run_t){1, (uint32_t)(i % 2), 500 + (uint64_t)((i * 37) % 64) * 3, 1};
    two.prov_n = 64;
    cr_assert_eq(sl_wire_batch_encode_prov(&two, true), 0);
    cr_assert(two.prov_wire_dense && two.prov_wire[0] == 0 && two.prov_wire[1] == 2, "not dense with two pairs");
    cr_assert_eq(sl_provwire_read(two.prov_wire, two.prov_wire_len, 64, got, &m, err, sizeof err), 0, "%s", err);
    cr_assert(m == 64 && memcmp(got, two.prov_heap, sizeof got) == 0);
    free(two.prov_wire);
    free(two.prov_heap);
    /* An ordered batch is one run: the runs form, whatever the client reads. */
    sl_wire_batch_t o = {.prov_n = 1, .prov_one = {0, 0, 0, 64}};
    cr_assert_eq(sl_wire_batch_encode_prov(&o, true), 0);
    cr_assert(o.prov_wire && !o.prov_wire_dense && o.prov_wire[0] == 1);
    cr_assert(o.prov_wire == o.prov_wire_one, "one run not kept in the batch itself");
    free(b.prov_wire);
    free(b.prov_heap);
}

/* A worker frees a shuffled batch's runs once they are encoded (they are
 * three times its int64 tensors): the batch then counts without them, and
 * a client that does not read the dense form it was encoded in still gets
 * its records, decoded back from that form. Runs form, dense form, and
 * nothing dropped without an encoding or with one run. */
Test(provwire, a_batch_drops_its_runs_once_encoded_and_can_still_be_sent_as_runs)
{
    sl_provenance_run_t want[64];
    for (int i = 0; i < 64; i++)
        want[i] = (sl_provenance_run_t){3, 1, 7000 + (uint64_t)((i * 37) % 64) * 2, 1};
    for (int dense = 0; dense < 2; dense++) {
        sl_wire_batch_t b = {0};
        b.prov_heap = malloc(sizeof want);
        cr_assert_not_null(b.prov_heap);
        memcpy(b.prov_heap, want, sizeof want);
        b.prov_n = 64;
        size_t before = sl_wire_batch_held_bytes(&b);
        sl_wire_batch_drop_runs(&b); /* not encoded: kept */
        cr_assert_not_null(b.prov_heap);
        cr_assert_eq(sl_wire_batch_encode_prov(&b, dense), 0);
        cr_assert_eq(b.prov_wire_dense, dense);
        sl_wire_batch_drop_runs(&b);
        cr_assert_null(b.prov_heap);
        cr_assert_null(sl_wire_batch_prov(&b));
        cr_assert_eq(b.prov_n, 64);
        cr_assert_eq(sl_wire_batch_held_bytes(&b), before - sizeof want + b.prov_wire_len);
        /* Sent again to a client of each form. */
        cr_assert_eq(sl_wire_batch_encode_prov(&b, true), 0);
        cr_assert_eq(sl_wire_batch_encode_prov(&b, false), 0);
        cr_assert(!b.prov_wire_dense && b.prov_wire[0] == 1, "dense %d: not the runs form", dense);
        sl_provenance_run_t got[64];
        uint64_t m;
        char err[256];
        cr_assert_eq(sl_provwire_read(b.prov_wire, b.prov_wire_len, 64, got, &m, err, sizeof err), 0, "%s", err);
        cr_assert(m == 64 && memcmp(got, want, sizeof got) == 0, "dense %d: other records", dense);
        free(b.prov_wire);
        free(b.prov_heap);
    }
    sl_wire_batch_t o = {.prov_n = 1, .prov_one = {0, 0, 0, 64}};
    cr_assert_eq(sl_wire_batch_encode_prov(&o, false), 0);
    sl_wire_batch_drop_runs(&o);
    cr_assert_eq(sl_wire_batch_prov(&o), &o.prov_one, "one run is kept in the batch");
}

/* A batch of one run (most unshuffled ones) is encoded by a path of its
 * own: the same bytes as sl_provwire_encode() of that run, the same
 * records, in the batch itself, for any fields: epochs and files up to
 * 2^32 - 1, begins up to 2^64 - 1, counts from 1 (which may take the dense
 * form) to 2^63. Seeded: SLUICE_TEST_SEED repeats a run. */
Test(provwire, a_batch_of_one_run_is_encoded_as_the_runs_form_says)
{
    unsigned seed = test_seed("provwire.a_batch_of_one_run_is_encoded_as_the_runs_form_says");
    uint64_t rng = seed;
    for (unsigned round = 0; round < 100000; round++) {
        /* Shifts of 1 to 63 bits: counts of up to 2^63, fields of 32 bits down to 1. */
        unsigned shift = 1 + (unsigned)(splitmix64(&rng) % 63);
        uint64_t count = round % 16 == 0 ? 1 + round / 16 % 3 : 1 + (splitmix64(&rng) >> shift);
        sl_provenance_run_t run = {(uint32_t)(splitmix64(&rng) >> (32 + splitmix64(&rng) % 32)),
                                   (uint32_t)(splitmix64(&rng) >> (32 + splitmix64(&rng) % 32)),
                                   splitmix64(&rng) >> (splitmix64(&rng) % 64), count};
        uint8_t *want;
        size_t want_len;
        cr_assert_eq(sl_provwire_encode(&run, 1, &want, &want_len), 0);
        for (int dense = 0; dense < 2; dense++) {
            sl_wire_batch_t b = {.prov_n = 1, .prov_one = run};
            cr_assert_eq(sl_wire_batch_encode_prov(&b, dense), 0);
            if (dense && b.prov_wire_dense) {
                cr_assert_eq(count, 1, "seed %u round %u: %lu records sent dense", seed, round, (unsigned long)count);
            } else {
                cr_assert(b.prov_wire_len == want_len && memcmp(b.prov_wire, want, want_len) == 0,
                          "seed %u round %u: run (%u, %u, %lu, %lu) encoded unlike the runs form", seed, round,
                          run.epoch, run.file_index, (unsigned long)run.begin, (unsigned long)run.count);
                cr_assert(b.prov_wire == b.prov_wire_one, "one run not kept in the batch itself");
            }
            cr_assert_eq(b.prov_records, count);
            if (b.prov_wire != b.prov_wire_one)
                free(b.prov_wire);
        }
        free(want);
    }
}

static uint64_t span_rng;

static uint64_t span_draw(void)
{
    return splitmix64(&span_rng);
}

/* sl_prov_span(), four runs at a time where the CPU has AVX2, finds what
 * the scalar reference finds, for every count of runs around the vector
 * path's threshold and its width, and every field: pairs that differ in
 * the epoch or the file alone, runs of no record, runs ending at 2^64 - 1,
 * at 2^64 or past it, records from 0 and from near 2^64, and counts that
 * add up past 2^64. sl_prov_records_below() likewise, at bounds below,
 * inside and above the runs, and at 0 and 2^64 - 1. Seeded:
 * SLUICE_TEST_SEED repeats a run. */
Test(provwire, the_vector_span_and_count_below_are_the_scalar_ones)
{
    unsigned seed = test_seed("provwire.the_vector_span_and_count_below_are_the_scalar_ones");
    fprintf(stderr, "  %s\n", sl_prov_span_vector() ? "vector path (AVX2)" : "no vector path on this CPU");
    span_rng = seed;
    static sl_provenance_run_t runs[1100];
    for (unsigned round = 0; round < 20000; round++) {
        /* One run an eighth of the time: sl_prov_span() has a path of its own for it. */
        uint64_t n = round < 64        ? round + 1
                     : round % 8 == 0 ? 1
                                      : 1 + span_draw() % (sizeof runs / sizeof runs[0]);
        uint64_t base = span_draw() % 3 == 0 ? UINT64_MAX - span_draw() % 5000 : span_draw() % 5000;
        unsigned odd_pct = (unsigned)(span_draw() % 4) * 2; /* 0 to 6% of runs odd */
        bool many_pairs = span_draw() % 4 == 0;
        for (uint64_t i = 0; i < n; i++) {
            sl_provenance_run_t *r = &runs[i];
            *r = (sl_provenance_run_t){7, 3, base + span_draw() % 4000 - 2000, 1};
            if (many_pairs && span_draw() % 8 == 0) {
                if (span_draw() % 2)
                    r->epoch ^= 1u << (span_draw() % 32);
                else
                    r->file_index ^= 1u << (span_draw() % 32);
            }
            if (span_draw() % 100 < odd_pct) {
                switch (span_draw() % 4) {
                case 0: r->count = 0; break;
                case 1: r->count = ~r->begin + span_draw() % 3; break; /* ends at 2^64 - 1, 2^64 or past */
                case 2: r->count = UINT64_MAX - span_draw() % 3; break; /* the sum goes past 2^64 */
                default: r->count = 2 + span_draw() % 600; break;
                }
            }
        }
        sl_prov_span_t got, want;
        memset(&got, 0x5a, sizeof got);
        memset(&want, 0xa5, sizeof want);
        sl_prov_span(runs, n, &got);
        sl_prov_span_scalar(runs, n, &want);
        cr_assert(got.pair == want.pair && got.one_pair == want.one_pair && got.wraps == want.wraps &&
                      got.empty == want.empty && got.records == want.records && got.lo == want.lo &&
                      got.hi == want.hi,
                  "seed %u round %u (%" PRIu64 " runs): span {pair %#" PRIx64 " one %d wraps %d empty %d records %" PRIu64
                  " lo %" PRIu64 " hi %" PRIu64 "}, scalar {pair %#" PRIx64 " one %d wraps %d empty %d records %" PRIu64
                  " lo %" PRIu64 " hi %" PRIu64 "}",
                  seed, round, n, got.pair, got.one_pair, got.wraps, got.empty, got.records, got.lo, got.hi, want.pair,
                  want.one_pair, want.wraps, want.empty, want.records, want.lo, want.hi);
        uint64_t bounds[] = {0, UINT64_MAX, want.lo, want.lo + 1, want.hi, want.hi + 1, base,
                             base + span_draw() % 4000 - 2000, runs[span_draw() % n].begin};
        for (size_t k = 0; k < sizeof bounds / sizeof bounds[0]; k++) {
            uint64_t vec = sl_prov_records_below(runs, n, bounds[k]);
            uint64_t ref = sl_prov_records_below_scalar(runs, n, bounds[k]);
            cr_assert_eq(vec, ref, "seed %u round %u (%" PRIu64 " runs): %" PRIu64 " records below %" PRIu64
                         ", the scalar count %" PRIu64, seed, round, n, vec, bounds[k], ref);
        }
    }
    /* The reference itself: runs below, across and above the bound. */
    sl_provenance_run_t few[] = {{0, 0, 5, 3}, {0, 0, 9, 1}, {0, 0, 2, 1}, {0, 0, 6, 4}, {0, 0, 20, 2}};
    cr_assert_eq(sl_prov_records_below_scalar(few, 5, 7), 2 + 0 + 1 + 1);
    cr_assert_eq(sl_prov_records_below_scalar(few, 5, 0), 0);
    cr_assert_eq(sl_prov_records_below_scalar(few, 5, 100), 3 + 1 + 1 + 4 + 2);
    cr_assert_eq(sl_prov_records_below_scalar(few, 5, 21), 3 + 1 + 1 + 4 + 1);
}
