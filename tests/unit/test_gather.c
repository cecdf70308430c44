/*
 * test_gather.c: frames held for one system call (protocol/gather.c). A
 * seeded property test adds random frames (copied and referenced parts,
 * empty ones, sizes around the room's bounds), "writes" a random prefix of
 * their bytes and checks that the iovec list is the frames' bytes in
 * order, that what rest() gets is exactly the unwritten suffix, frame by
 * frame, and that every release runs once. Then the room's bounds, the
 * copies, a release that gathers again, and freeing a full gather.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gather.h"
#include "seed_util.h"

#define MAX_STREAM (1u << 22)

/* The test's side of one round: the bytes the frames make, in order. */
struct round {
    const uint8_t *src; /* where referenced parts point; copied ones point elsewhere */
    uint8_t *stream;    /* the frames' bytes as added */
    size_t len;
    uint8_t *tail; /* what rest() got, concatenated */
    size_t tail_len;
    int released[SL_GATHER_FRAMES * 2];
    int rests;
};

static void on_release(const void *payload, size_t len, void *extra)
{
    int *count = extra;
    (void)payload;
    (void)len;
    (*count)++;
}

static void on_rest(void *arg, const sl_gather_part_t *parts, int n, size_t skip, const sl_gather_release_t *r)
{
    struct round *rd = arg;
    rd->rests++;
    for (int i = 0; i < n; i++) {
        cr_assert_gt(parts[i].n, 0, "an empty part was handed on");
        const uint8_t *p = parts[i].p;
        bool in_src = p >= rd->src && p < rd->src + MAX_STREAM;
        cr_assert_eq(parts[i].copy, !in_src, "a %s part was handed on as %s", in_src ? "referenced" : "copied",
                     parts[i].copy ? "copied" : "referenced");
        size_t from = skip < parts[i].n ? skip : parts[i].n;
        skip -= from;
        memcpy(rd->tail + rd->tail_len, (const uint8_t *)parts[i].p + from, parts[i].n - from);
        rd->tail_len += parts[i].n - from;
    }
    cr_assert_eq(skip, 0, "skip past the frame's end");
    /* The queue rest() stands for releases it once the frame is out. */
    if (r->fn)
        r->fn(r->payload, r->payload_len, r->extra);
}

Test(gather, random_frames_and_partial_writes_hand_on_exactly_the_rest)
{
    uint64_t st = test_seed("gather.random_frames_and_partial_writes_hand_on_exactly_the_rest");
    static uint8_t src[MAX_STREAM];
    for (size_t i = 0; i < sizeof src; i++)
        src[i] = (uint8_t)splitmix64(&st);
    struct round rd = {.src = src, .stream = malloc(MAX_STREAM * 2), .tail = malloc(MAX_STREAM * 2)};
    sl_gather_t *g = sl_gather_new();
    cr_assert_not_null(g);
    for (int round = 0; round < 2000; round++) {
        memset(rd.released, 0, sizeof rd.released);
        rd.len = rd.tail_len = 0;
        rd.rests = 0;
        unsigned frames = 0;
        int want = 1 + (int)(splitmix64(&st) % (SL_GATHER_FRAMES + 4));
        for (int f = 0; f < want; f++) {
            int n = 1 + (int)(splitmix64(&st) % SL_GATHER_PARTS);
            sl_gather_part_t parts[SL_GATHER_PARTS];
            size_t flen = 0;
            for (int k = 0; k < n; k++) {
                uint64_t d = splitmix64(&st);
                bool copy = d & 1;
                /* Empty parts, small ones, and some around the room's size. */
                size_t size = (d >> 1) % 4 == 0 ? 0
                              : (d >> 3) % 8 == 0 ? SL_GATHER_BYTES - 64 + (d >> 8) % 128
                              : copy ? (d >> 8) % 300 : (d >> 8) % 70000;
                size_t at = (d >> 24) % (MAX_STREAM - size);
                parts[k] = (sl_gather_part_t){src + at, size, copy};
                flen += size;
            }
            size_t before = sl_gather_bytes(g);
            int rc = sl_gather_add(g, parts, n, &(sl_gather_release_t){on_release, NULL, 0, &rd.released[f]});
            if (rc == -ENOSPC) {
                cr_assert_eq(sl_gather_bytes(g), before, "a refused frame changed the gather");
                cr_assert_eq(sl_gather_frames(g), frames);
                continue;
            }
            cr_assert_eq(rc, 0);
            frames++;
            for (int k = 0; k < n; k++) {
                memcpy(rd.stream + rd.len, parts[k].p, parts[k].n);
                rd.len += parts[k].n;
            }
            cr_assert_eq(sl_gather_bytes(g), before + flen);
        }
        cr_assert_eq(sl_gather_frames(g), frames);
        cr_assert_leq(frames, SL_GATHER_FRAMES);
        /* The iovec list is the frames' bytes in order. */
        const struct iovec *iov;
        int niov = sl_gather_iov(g, &iov);
        size_t at = 0;
        for (int i = 0; i < niov; i++) {
            cr_assert_gt(iov[i].iov_len, 0);
            cr_assert(memcmp(iov[i].iov_base, rd.stream + at, iov[i].iov_len) == 0, "round %d: iovec %d differs",
                      round, i);
            at += iov[i].iov_len;
        }
        cr_assert_eq(at, rd.len);
        /* Written: none, all, or any prefix. */
        uint64_t d = splitmix64(&st);
        size_t written = d % 4 == 0 ? 0 : d % 4 == 1 ? rd.len : (d >> 2) % (rd.len + 1);
        sl_gather_drain(g, written, on_rest, &rd);
        cr_assert_eq(sl_gather_frames(g), 0);
        cr_assert_eq(sl_gather_bytes(g), 0);
        cr_assert_eq(rd.tail_len, rd.len - written, "round %d: %zu of %zu written, %zu handed on", round, written,
                     rd.len, rd.tail_len);
        cr_assert(rd.tail_len == 0 || memcmp(rd.tail, rd.stream + written, rd.tail_len) == 0,
                  "round %d: what was handed on is not the unwritten rest", round);
        int total = 0;
        for (int f = 0; f < want; f++) {
            cr_assert_leq(rd.released[f], 1, "frame %d released %d times", f, rd.released[f]);
            total += rd.released[f];
        }
        cr_assert_eq(total, (int)frames, "round %d: %d releases for %u frames", round, total, frames);
    }
    sl_gather_free(g);
    free(rd.stream);
    free(rd.tail);
}

Test(gather, room_is_bounded_and_a_refused_frame_leaves_it_as_it_was)
{
    sl_gather_t *g = sl_gather_new();
    static uint8_t big[SL_GATHER_BYTES + 1];
    int released = 0;
    sl_gather_release_t r = {on_release, NULL, 0, &released};
    /* More copied bytes than the room: refused whole, though it has room. */
    sl_gather_part_t too_big = {big, sizeof big, true};
    cr_assert_eq(sl_gather_add(g, &too_big, 1, &r), -ENOSPC);
    cr_assert_eq(sl_gather_frames(g), 0);
    /* Referenced bytes take no room: any size. */
    sl_gather_part_t ref = {big, sizeof big, false};
    cr_assert_eq(sl_gather_add(g, &ref, 1, &r), 0);
    /* The room fills to the byte. */
    sl_gather_part_t fill = {big, SL_GATHER_BYTES, true};
    cr_assert_eq(sl_gather_add(g, &fill, 1, &r), 0);
    sl_gather_part_t one = {big, 1, true};
    cr_assert_eq(sl_gather_add(g, &one, 1, &r), -ENOSPC);
    /* Frames fill to SL_GATHER_FRAMES. */
    for (unsigned i = sl_gather_frames(g); i < SL_GATHER_FRAMES; i++)
        cr_assert_eq(sl_gather_add(g, &ref, 1, &r), 0);
    cr_assert_eq(sl_gather_add(g, &ref, 1, &r), -ENOSPC);
    cr_assert_eq(sl_gather_frames(g), SL_GATHER_FRAMES);
    cr_assert_eq(released, 0);
    /* Freed unwritten: every frame released once. */
    sl_gather_free(g);
    cr_assert_eq(released, SL_GATHER_FRAMES);
}

Test(gather, copied_parts_are_copies_and_referenced_ones_are_not)
{
    sl_gather_t *g = sl_gather_new();
    uint8_t head[4] = {1, 2, 3, 4}, body[4] = {5, 6, 7, 8};
    sl_gather_part_t parts[3] = {{head, 4, true}, {NULL, 0, false}, {body, 4, false}};
    cr_assert_eq(sl_gather_add(g, parts, 3, &(sl_gather_release_t){0}), 0);
    head[0] = 99;
    body[0] = 77;
    const struct iovec *iov;
    cr_assert_eq(sl_gather_iov(g, &iov), 2, "the empty part took an iovec");
    cr_assert_eq(((const uint8_t *)iov[0].iov_base)[0], 1, "a copied part changed with its source");
    cr_assert(iov[1].iov_base == body, "a referenced part was copied");
    sl_gather_free(g);
}

/* A release may send again: the gather is empty by then, and what it
 * gathers is kept. */
static sl_gather_t *regather;
static int regathered;

static void release_and_gather(const void *payload, size_t len, void *extra)
{
    (void)payload;
    (void)len;
    (void)extra;
    static const uint8_t b[3] = {7, 7, 7};
    sl_gather_part_t p = {b, sizeof b, true};
    cr_assert_eq(sl_gather_frames(regather), (unsigned)regathered, "released before the gather was emptied");
    cr_assert_eq(sl_gather_add(regather, &p, 1, &(sl_gather_release_t){0}), 0);
    regathered++;
}

static void no_rest(void *arg, const sl_gather_part_t *parts, int n, size_t skip, const sl_gather_release_t *r)
{
    (void)arg;
    (void)parts;
    (void)n;
    (void)skip;
    (void)r;
    cr_assert_fail("a wholly written frame was handed on");
}

Test(gather, a_release_may_gather_the_next_frames)
{
    regather = sl_gather_new();
    regathered = 0;
    uint8_t b[10] = {0};
    sl_gather_part_t p = {b, sizeof b, true};
    for (int i = 0; i < 3; i++)
        cr_assert_eq(sl_gather_add(regather, &p, 1, &(sl_gather_release_t){release_and_gather, NULL, 0, NULL}), 0);
    sl_gather_drain(regather, 30, no_rest, NULL);
    cr_assert_eq(regathered, 3);
    cr_assert_eq(sl_gather_frames(regather), 3);
    cr_assert_eq(sl_gather_bytes(regather), 9);
    sl_gather_free(regather);
}
