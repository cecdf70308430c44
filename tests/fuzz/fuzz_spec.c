/*
 * fuzz_spec.c: libFuzzer target for the dataset spec parser (spec/spec.c),
 * which reads the JSON every client registers. Beyond "no crash, no leak"
 * (ASan, UBSan): only the documented results, a message on failure, and on
 * success a canonical text that parses again to itself (same fingerprint).
 * Run it with scripts/fuzz.sh (FUZZ_TARGETS=fuzz_spec).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sluice.h"
#include "spec.h"

#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sl_spec_t *spec = NULL;
    char err[512] = "";
    int rc = sl_spec_parse((const char *)data, size, &spec, err, sizeof err);
    CHECK(rc == 0 || rc == SL_ESPEC || rc == -12 /* -ENOMEM */);
    if (rc < 0) {
        CHECK(spec == NULL && err[0] != '\0');
        return 0;
    }
    const char *canon = sl_spec_canonical(spec);
    sl_spec_t *again = NULL;
    CHECK(sl_spec_parse(canon, strlen(canon), &again, err, sizeof err) == 0);
    CHECK(strcmp(sl_spec_canonical(again), canon) == 0);
    CHECK(strcmp(sl_spec_fingerprint(again), sl_spec_fingerprint(spec)) == 0);
    sl_spec_free(again);
    sl_spec_free(spec);
    return 0;
}
