/*
 * getelem.h: GET_ELEMENT's request and answer, the two messages of every
 * batch, encoded and decoded without nanopb's descriptor tables.
 *
 * The bytes are those pb_encode() writes, and a decode accepts exactly what
 * pb_decode() accepts into the same struct (frame.c calls these for the two
 * types; every other message goes through nanopb). test_getelem and
 * fuzz_getelem hold both to nanopb, walking its descriptors, so a field added
 * to sluice.proto and not here fails them.
 */
#ifndef SL_GETELEM_H
#define SL_GETELEM_H

#include <stddef.h>
#include <stdint.h>

#include "sluice.pb.h"

/**
 * Encodes m into buf, which holds at least sluice_GetElementRequest_size bytes.
 * @param[out] len the encoded length
 * @return 0
 */
int sl_getelem_req_encode(const sluice_GetElementRequest *m, uint8_t *buf, size_t *len);

/**
 * Encodes m into buf, which holds at least sluice_GetElementResponse_size bytes.
 * @param[out] len the encoded length
 * @return 0, or SL_ETOOBIG for a message nanopb cannot encode either (more
 * components or dims than sluice.options allows, a name without its NUL)
 */
int sl_getelem_resp_encode(const sluice_GetElementResponse *m, uint8_t *buf, size_t *len);

/**
 * Decodes len bytes into m, as pb_decode() would.
 * @return 0, or SL_EPROTO with what was wrong, and at which field, in err
 */
int sl_getelem_req_decode(const uint8_t *buf, size_t len, sluice_GetElementRequest *m, char *err, size_t errlen);

/** The same for an answer. */
int sl_getelem_resp_decode(const uint8_t *buf, size_t len, sluice_GetElementResponse *m, char *err,
                           size_t errlen);

#endif
