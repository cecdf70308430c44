/*
 * fuzz_skips.c: libFuzzer target for a split's skip runs as a worker reads
 * them from the dispatcher's GetSplit answer (workerd/task.c,
 * sl_task_read_skips): records of a split handed out again that a
 * consumer already has, which the source must not yield.
 *
 * The input: the split's begin and end, the runs' skip_offset and
 * skip_count (u64 little-endian each, taken as they come, so that any
 * value reaches the decoder), then the answer's payload.
 *
 * Beyond "no crash, no leak": only the documented results, a message and
 * no runs on failure; on success the runs the payload holds, each of
 * count >= 1, sorted, disjoint and inside the split; and, through the
 * dispatcher's side of it (a position set, as the dispatcher keeps what
 * consumers have, and sl_posset_within, which makes the runs it sends),
 * runs written again as the dispatcher writes them that read back to the
 * same positions.
 * Run it with scripts/fuzz.sh (FUZZ_TARGETS=fuzz_skips).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "le.h"
#include "posset.h"
#include "sluice.h"
#include "task.h"

#include "fuzz_check.h"

#define HEADER 32
#define MAX_RUNS 4096

/* The positions of runs as a set, and its runs within the split. */
static void to_set(sl_posset_t *set, const sl_skip_run_t *k, uint64_t n)
{
    sl_posset_init(set, MAX_RUNS);
    for (uint64_t i = 0; i < n; i++)
        CHECK(sl_posset_add(set, 7, 3, k[i].begin, k[i].count, NULL) == 0);
}

static void same_set(const sl_posset_t *a, const sl_posset_t *b)
{
    size_t na = sl_posset_encode(a, NULL, 0), nb = sl_posset_encode(b, NULL, 0);
    CHECK(na == nb);
    uint8_t *ea = malloc(na), *eb = malloc(nb);
    CHECK(ea && eb);
    CHECK(sl_posset_encode(a, ea, na) == na && sl_posset_encode(b, eb, nb) == nb);
    CHECK(memcmp(ea, eb, na) == 0);
    free(ea);
    free(eb);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < HEADER)
        return 0;
    sluice_Split s = sluice_Split_init_zero;
    s.split_id = 42;
    s.begin = sl_get_le64(data);
    s.end = sl_get_le64(data + 8);
    s.skip_offset = sl_get_le64(data + 16);
    s.skip_count = sl_get_le64(data + 24);
    const uint8_t *payload = data + HEADER;
    size_t len = size - HEADER;

    sl_skip_run_t *k = (sl_skip_run_t *)1;
    char err[512] = "";
    int rc = sl_task_read_skips(&s, payload, len, &k, err, sizeof err);
    CHECK(rc == 0 || rc == SL_EPROTO || rc == -ENOMEM);
    if (rc < 0) {
        CHECK(k == NULL && err[0] != '\0');
        return 0;
    }
    CHECK((k == NULL) == (s.skip_count == 0));
    if (!k)
        return 0;
    CHECK(s.skip_count <= len / 16 && s.skip_offset + 16 * s.skip_count <= len);
    uint64_t at = s.begin, sum = 0;
    for (uint64_t i = 0; i < s.skip_count; i++) {
        CHECK(k[i].begin == sl_get_le64(payload + s.skip_offset + 16 * i));
        CHECK(k[i].count == sl_get_le64(payload + s.skip_offset + 16 * i + 8));
        CHECK(k[i].count >= 1 && k[i].begin >= at && k[i].begin < s.end && k[i].count <= s.end - k[i].begin);
        at = k[i].begin + k[i].count;
        sum += k[i].count;
    }
    CHECK(sum <= s.end - s.begin);

    /* The dispatcher's side: what the set holds of the split, and the runs
     * it sends for it. */
    sl_posset_t set;
    to_set(&set, k, s.skip_count);
    CHECK(sl_posset_count(&set, 7, 3, s.begin, s.end) == sum);
    CHECK(sl_posset_size(&set) == sum);
    size_t nw = sl_posset_within(&set, 7, 3, s.begin, s.end, NULL, 0);
    CHECK(nw >= 1 && nw <= s.skip_count);
    sl_posrun_t *w = malloc(nw * sizeof *w);
    CHECK(w != NULL);
    CHECK(sl_posset_within(&set, 7, 3, s.begin, s.end, w, nw) == nw);
    uint8_t *wire = malloc(16 * nw);
    CHECK(wire != NULL);
    for (size_t i = 0; i < nw; i++) {
        CHECK(w[i].epoch == 7 && w[i].file == 3);
        CHECK(sl_posset_covered_to(&set, 7, 3, w[i].begin) == w[i].begin + w[i].count);
        sl_put_le64(wire + 16 * i, w[i].begin);
        sl_put_le64(wire + 16 * i + 8, w[i].count);
    }
    sluice_Split again = s;
    again.skip_offset = 0;
    again.skip_count = nw;
    sl_skip_run_t *k2 = NULL;
    CHECK(sl_task_read_skips(&again, wire, 16 * nw, &k2, err, sizeof err) == 0);
    sl_posset_t set2;
    to_set(&set2, k2, nw);
    same_set(&set, &set2);
    sl_posset_clear(&set2);
    sl_posset_clear(&set);
    free(k2);
    free(wire);
    free(w);
    free(k);
    return 0;
}
