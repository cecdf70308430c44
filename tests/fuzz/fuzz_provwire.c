/*
 * fuzz_provwire.c: libFuzzer target for the provenance decoder
 * (protocol/provwire.c), which reads what a worker sends with a batch.
 *
 * The input: a u16 (little-endian) number of elements, then the encoded
 * provenance. Beyond "no crash, no leak, no read outside the input" (ASan,
 * UBSan), it checks what sl_provwire_decode promises: only its documented
 * results; on success at most num_elements runs, each of count >= 1 and
 * not wrapping, counting num_elements in all; and that the runs encode to
 * bytes that decode to the same runs, and in the dense form to the same
 * records, one run each. The bytes after the u16 are also
 * read as split-done notices (sl_provwire_read_done).
 *
 * Run it with scripts/fuzz.sh (FUZZ_TARGETS=fuzz_provwire); seeds are in
 * tests/fuzz/corpus/fuzz_provwire/.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "provwire.h"

#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The same bytes as split-done notices (what a batch or an end of sequence
 * carries after the provenance): only the documented results, at most one
 * notice per 6 bytes, each in range, and they encode to bytes that decode
 * to the same notices. */
static void check_notices(const uint8_t *p, size_t len)
{
    uint64_t n = 0;
    char err[256];
    /* Into a room of 4: decoded when they fit, else only counted. */
    sl_split_done_t room[4];
    memset(room, 0xa5, sizeof room);
    int rc = sl_provwire_read_done(p, len, room, 4, &n, err, sizeof err);
    CHECK(rc == 0 || rc == SL_EPROTO);
    if (rc < 0 || n == 0) {
        CHECK(n == 0);
        return;
    }
    CHECK(n <= len / 6);
    sl_split_done_t *d = malloc(n * sizeof *d);
    CHECK(d != NULL);
    CHECK(sl_provwire_read_done(p, len, d, (size_t)n, &n, err, sizeof err) == 0);
    if (n <= 4)
        CHECK(memcmp(room, d, n * sizeof *d) == 0);
    else
        for (size_t i = 0; i < sizeof room; i++)
            CHECK(((const uint8_t *)room)[i] == 0xa5);
    for (uint64_t i = 0; i < n; i++)
        CHECK(d[i].end >= d[i].begin && d[i].delivered <= d[i].end - d[i].begin);
    uint8_t *wire;
    size_t wlen;
    CHECK(sl_provwire_encode_done(d, n, &wire, &wlen) == 0);
    sl_split_done_t *again = malloc(n * sizeof *again);
    uint64_t m = 0;
    CHECK(again != NULL && sl_provwire_read_done(wire, wlen, again, (size_t)n, &m, err, sizeof err) == 0);
    CHECK(m == n && memcmp(again, d, n * sizeof *d) == 0);
    free(again);
    free(wire);
    free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    uint64_t elements = (uint64_t)data[0] | (uint64_t)data[1] << 8;
    sl_provenance_run_t *runs = NULL;
    uint64_t n = 0;
    char err[256];
    int rc = sl_provwire_decode(data + 2, size - 2, elements, &runs, &n, err, sizeof err);
    CHECK(rc == 0 || rc == SL_EPROTO || rc == -ENOMEM);
    if (rc < 0) {
        CHECK(runs == NULL && n == 0 && err[0] != '\0');
        return 0;
    }
    CHECK(n <= elements && (n == 0) == (runs == NULL) && (n == 0) == (size == 2));
    uint64_t sum = 0;
    for (uint64_t i = 0; i < n; i++) {
        CHECK(runs[i].count >= 1 && runs[i].begin + runs[i].count > runs[i].begin);
        sum += runs[i].count;
    }
    CHECK(n == 0 || sum == elements);
    if (n > 0) {
        uint8_t *wire;
        size_t len;
        CHECK(sl_provwire_encode(runs, n, &wire, &len) == 0);
        sl_provenance_run_t *again;
        uint64_t m;
        CHECK(sl_provwire_decode(wire, len, elements, &again, &m, err, sizeof err) == 0);
        CHECK(m == n && memcmp(again, runs, n * sizeof *runs) == 0);
        free(again);
        free(wire);
        /* In the dense form, where it applies: one run a record, the same
         * records in the same order. */
        int drc = sl_provwire_encode_dense(runs, n, elements, &wire, &len);
        CHECK(drc == 0 || drc == 1 || drc == -ENOMEM);
        if (drc == 0) {
            CHECK(sl_provwire_decode(wire, len, elements, &again, &m, err, sizeof err) == 0);
            CHECK(m == elements);
            uint64_t k = 0;
            for (uint64_t i = 0; i < n; i++)
                for (uint64_t j = 0; j < runs[i].count; j++, k++)
                    CHECK(again[k].epoch == runs[i].epoch && again[k].file_index == runs[i].file_index &&
                          again[k].begin == runs[i].begin + j && again[k].count == 1);
            free(again);
            free(wire);
        }
    }
    CHECK(n <= sl_provwire_max_runs(data + 2, size - 2, elements));
    free(runs);
    check_notices(data + 2, size - 2);
    return 0;
}
