/*
 * fuzz_delta.c: libFuzzer target for the delta reader of the checkpoint
 * builder (client/delta.c, sl__ledger_apply_delta), which replays bytes
 * another process sent. Beyond "no crash, no leak": only the documented
 * results, a refused delta changes nothing, and after an accepted one a
 * checkpoint is taken or refused by name.
 * Run it with scripts/fuzz.sh (FUZZ_TARGETS=fuzz_delta).
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "delta.h"
#include "ledger.h"
#include "sluice.h"

#include "fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* The dataset the delta names, so that seeds get past that check. */
    uint64_t ds = 9;
    if (size >= 16) {
        ds = 0;
        for (int i = 7; i >= 0; i--)
            ds = ds << 8 | data[8 + i];
    }
    sl_ledger_t l;
    sl__ledger_init(&l, 4096);
    char err[300];
    int rc = sl__ledger_apply_delta(&l, ds, data, size, err, sizeof err);
    CHECK(rc == 0 || rc == SL_EDATA || rc == SL_EINVAL || rc == -ENOMEM);
    if (rc < 0) {
        CHECK(l.given == 0 && l.num == 0 && l.ndone == 0 && l.epochs_done == 0 && l.fold_below == 0);
    } else {
        uint8_t *ck = NULL;
        size_t len = 0;
        int crc = sl__ledger_checkpoint(&l, ds, NULL, 0, &ck, &len, err, sizeof err);
        CHECK(crc == 0 || crc == SL_ETOOBIG || crc == SL_EPROTO || crc == -ENOMEM);
        CHECK((crc == 0) == (ck != NULL));
        free(ck);
    }
    sl__ledger_free(&l);
    return 0;
}
