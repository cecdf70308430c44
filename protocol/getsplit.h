/*
 * getsplit.h: GET_SPLIT's answer decoded without nanopb's descriptor tables.
 *
 * A DYNAMIC worker decodes one for every request for splits: with epochs of
 * a few thousand records, a split every two batches. nanopb walked its
 * descriptors for each field of each split, about 2,600 instructions a split
 * (callgrind). A decode accepts exactly what pb_decode() accepts into the
 * same struct (frame.c calls it for this type); test_getelem and
 * fuzz_getelem hold it to nanopb, walking its descriptors, so a field added
 * to sluice.proto and not here fails them.
 */
#ifndef SL_GETSPLIT_H
#define SL_GETSPLIT_H

#include <stddef.h>
#include <stdint.h>

#include "sluice.pb.h"

/**
 * Decodes len bytes into m, as pb_decode() would.
 * @return 0, or SL_EPROTO with what was wrong, and at which field, in err
 * ("splits[3].begin: varint overflow at byte 40")
 */
int sl_getsplit_resp_decode(const uint8_t *buf, size_t len, sluice_GetSplitResponse *m, char *err, size_t errlen);

#endif
