/*
 * fuzz_checkpoint.c: libFuzzer target for an iterator checkpoint's reader
 * (client/ledger.c, sl__checkpoint_read), which reads a file a trainer
 * hands back. The first input byte picks whether the reader holds a
 * cluster token. Beyond "no crash, no leak": only the documented results,
 * and positions only when the integrity tag matched (a version 3 or 4
 * checkpoint) or without a token (versions 1 and 2); done epochs only
 * from a version 4 one, and never past 2^32.
 * Run it with scripts/fuzz.sh (FUZZ_TARGETS=fuzz_checkpoint).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "ledger.h"
#include "sluice.h"

#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const uint8_t key[] = "fuzz-cluster-token-0123456789";
    bool keyed = data[0] & 1;
    uint8_t *pos = NULL;
    size_t plen = 0;
    char err[300];
    /* The dataset the checkpoint names, so that seeds of real checkpoints
     * get past that check. */
    uint64_t ds = 9;
    if (size >= 17) {
        ds = 0;
        for (int i = 7; i >= 0; i--)
            ds = ds << 8 | data[9 + i]; /* little-endian, at offset 8 of the checkpoint */
    }
    uint64_t done = 0;
    sl_posrun_t at;
    int rc = sl__checkpoint_read(data + 1, size - 1, ds, keyed ? key : NULL, keyed ? sizeof key - 1 : 0, 4096, &pos,
                                 &plen, &done, &at, err, sizeof err);
    CHECK(rc == 0 || done == 0);
    CHECK(done <= UINT32_MAX);
    CHECK(rc < 0 || (at.epoch == done && at.count == 0));
    CHECK(rc == 0 || rc == SL_EDATA || rc == SL_EINVAL || rc == SL_ETOOBIG || rc == -ENOMEM);
    CHECK((rc == 0) == (pos != NULL));
    free(pos);
    return 0;
}
