/*
 * fuzz_batch.c: libFuzzer target for the client's check of a worker's
 * batch (client/received.c, sl__batch_from_wire, with protocol/batch.c's
 * sl_wire_batch_validate): what a GET_ELEMENT answer says of its tensors,
 * provenance, split-done notices and tallies, against the payload that came with
 * it, before the trainer gets pointers into it.
 *
 * The input: a u16 (little-endian) length, that many bytes of an encoded
 * GetElementResponse, then the frame's payload.
 *
 * Beyond "no crash, no leak": on failure a message (and the payload freed);
 * on success every tensor inside the tensor bytes of the payload and
 * aligned to its dtype, its size what its dtype and shape (or its row
 * splits) say, every string of a bytes tensor inside the tensor, row splits
 * from 0 and never decreasing, provenance runs that count the batch's
 * elements, notices in range, and tallies kept only when they count
 * every record.
 * Run it with scripts/fuzz.sh (FUZZ_TARGETS=fuzz_batch).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "le.h"
#include "received.h"
#include "sluice.h"

#include "fuzz_check.h"

static void check_tensor(const sl_batch_t *b, const sl_tensor_t *t)
{
    const uint8_t *lo = b->payload, *hi = b->payload + b->size, *td = t->data;
    CHECK(t->rank >= 0 && t->rank <= SL_MAX_RANK);
    CHECK(t->size <= b->size);
    CHECK(td >= lo && td <= hi && t->size <= (size_t)(hi - td));
    size_t align = t->dtype == SL_DTYPE_BYTES ? 8 : sl_dtype_size(t->dtype);
    CHECK(align > 0 && (size_t)(td - lo) % align == 0);
    uint64_t n = 1;
    int first = 0;
    if (t->row_splits) {
        const uint8_t *s = (const uint8_t *)t->row_splits;
        CHECK(t->rank >= 1);
        CHECK(s >= lo && s <= hi && t->num_row_splits <= (size_t)(hi - s) / 8);
        CHECK((size_t)(s - lo) % 8 == 0);
        CHECK((uint64_t)t->num_row_splits == (uint64_t)t->shape[0] + 1);
        int64_t prev = 0;
        for (size_t r = 0; r < t->num_row_splits; r++) {
            int64_t v = (int64_t)sl_get_le64(s + 8 * r);
            CHECK((r > 0 || v == 0) && v >= prev);
            prev = v;
        }
        n = (uint64_t)prev;
        first = 2;
    }
    for (int d = first; d < t->rank; d++) {
        CHECK(t->shape[d] >= 0);
        CHECK(!__builtin_mul_overflow(n, (uint64_t)t->shape[d], &n));
    }
    if (t->dtype != SL_DTYPE_BYTES) {
        CHECK(n * sl_dtype_size(t->dtype) == t->size);
        return;
    }
    CHECK(n < t->size / 8);
    const uint8_t *vals = td + (n + 1) * 8;
    uint64_t prev = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t a = sl_get_le64(td + 8 * i), z = sl_get_le64(td + 8 * (i + 1));
        CHECK(a == prev && z >= a);
        CHECK(vals + z <= td + t->size);
        prev = z;
    }
    CHECK(vals + sl_get_le64(td + 8 * n) == td + t->size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    size_t mlen = (size_t)data[0] | (size_t)data[1] << 8;
    if (mlen > size - 2)
        return 0;
    sluice_GetElementResponse *resp = calloc(1, sizeof *resp);
    CHECK(resp != NULL);
    char err[512] = "";
    if (sl_msg_decode(SL_MSG_GET_ELEMENT_RESP, data + 2, mlen, resp, err, sizeof err) < 0) {
        free(resp);
        return 0;
    }
    size_t plen = size - 2 - mlen;
    uint8_t *payload = malloc(plen ? plen : 1);
    CHECK(payload != NULL);
    memcpy(payload, data + 2 + mlen, plen);

    err[0] = '\0';
    struct sl_batch *b = sl__batch_from_wire(resp, payload, plen, err, sizeof err);
    if (!b) {
        CHECK(err[0] != '\0');
        free(resp);
        return 0;
    }
    CHECK(b->payload == payload && b->size <= plen);
    CHECK(sl_batch_num_elements(b) == resp->num_elements);
    CHECK(sl_batch_num_tensors(b) == (int)resp->components_count);
    for (int i = 0; i < sl_batch_num_tensors(b); i++) {
        const sl_tensor_t *t = sl_batch_tensor(b, i);
        CHECK(t != NULL && t->name != NULL && t->name[0] != '\0');
        CHECK(sl_batch_find(b, t->name) == t);
        check_tensor(b, t);
    }
    CHECK(sl_batch_tensor(b, sl_batch_num_tensors(b)) == NULL);

    size_t nruns = 0;
    const sl_provenance_run_t *runs = sl_batch_provenance(b, &nruns);
    CHECK((runs != NULL) == (nruns > 0));
    if (nruns > 0) {
        uint64_t sum = 0;
        for (size_t i = 0; i < nruns; i++) {
            CHECK(runs[i].count >= 1 && runs[i].begin + runs[i].count > runs[i].begin);
            sum += runs[i].count;
        }
        CHECK(sum == b->num_records); /* the records the runs count: more than the elements when batches nest */
    }
    size_t ndone = 0;
    const sl_split_done_t *done = sl_batch_splits_done(b, &ndone);
    CHECK((done != NULL) == (ndone > 0));
    CHECK(ndone <= plen / 6 + 1);
    for (size_t i = 0; i < ndone; i++)
        CHECK(done[i].end >= done[i].begin && done[i].delivered <= done[i].end - done[i].begin);
    /* Tallies are kept only when they count every record of the provenance. */
    CHECK((b->tally != NULL) == (b->num_tally > 0));
    if (b->tally) {
        uint64_t sum = 0;
        CHECK(b->num_prov > 0);
        for (size_t i = 0; i < b->num_tally; i++) {
            CHECK(b->tally[i].delivered >= 1 && b->tally[i].delivered <= b->tally[i].end - b->tally[i].begin);
            sum += b->tally[i].delivered;
        }
        CHECK(sum == b->num_records);
    }
    sl_batch_release(b);
    free(resp);
    return 0;
}
