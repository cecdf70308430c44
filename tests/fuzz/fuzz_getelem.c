/*
 * fuzz_getelem.c: libFuzzer target holding the hand codecs of GET_ELEMENT
 * (protocol/getelem.c) and of GET_SPLIT's answer (protocol/getsplit.c) to
 * nanopb.
 *
 * The first byte modulo 3 picks the message (0: GetElementRequest, 1:
 * GetElementResponse, 2: GetSplitResponse), the rest is its wire bytes.
 * Both decoders must give the same verdict, and on acceptance the same
 * fields; what both accept of GET_ELEMENT, both encoders must write to the
 * same bytes.
 *
 * Run it with scripts/fuzz.sh; seeds are in tests/fuzz/corpus/fuzz_getelem/.
 */
#include <stdint.h>
#include <string.h>

#include "../unit/getelem_diff.h"
#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static sluice_GetElementResponse copy;
    if (size < 1)
        return 0;
    int kind = data[0] % GETELEM_DIFF_KINDS;
    const void *got = NULL;
    const char *d = getelem_diff_decode(kind, data + 1, size - 1, &got);
    if (d)
        fprintf(stderr, "decode: %s\n", d);
    CHECK(d == NULL);
    if (got && kind != GETELEM_DIFF_SPLITS) {
        memcpy(&copy, got, getelem_diff_size(kind));
        d = getelem_diff_encode(kind == GETELEM_DIFF_RESP, &copy);
        if (d)
            fprintf(stderr, "encode: %s\n", d);
        CHECK(d == NULL);
    }
    return 0;
}
