/*
 * fuzz_getelem.c: libFuzzer target holding GET_ELEMENT's hand codec
 * (protocol/getelem.c) to nanopb.
 *
 * The first byte's low bit picks the message (1: GetElementResponse, 0:
 * GetElementRequest), the rest is its wire bytes. Both decoders must give
 * the same verdict, and on acceptance the same fields; what both accept,
 * both encoders must write to the same bytes.
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
    bool resp = data[0] & 1;
    const void *got = NULL;
    const char *d = getelem_diff_decode(resp, data + 1, size - 1, &got);
    if (d)
        fprintf(stderr, "decode: %s\n", d);
    CHECK(d == NULL);
    if (got) {
        memcpy(&copy, got, getelem_diff_size(resp));
        d = getelem_diff_encode(resp, &copy);
        if (d)
            fprintf(stderr, "encode: %s\n", d);
        CHECK(d == NULL);
    }
    return 0;
}
