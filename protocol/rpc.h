/*
 * rpc.h: blocking request/response calls for tools and the client API. Each
 * sl_rpc_t owns one connection on a private event loop that runs only inside
 * its calls, so it uses the same codec and checks as the daemons.
 * One sl_rpc_t is used by one thread at a time.
 */
#ifndef SL_RPC_H
#define SL_RPC_H

#include <stddef.h>
#include <stdint.h>

#include "conn.h"
#include "frame.h"

typedef struct sl_rpc sl_rpc_t;

/**
 * Connects and handshakes with the peer of role expect at address, waiting
 * at most timeout_ms.
 * @param[out] out the connection, freed by sl_rpc_close()
 * @return 0, -ECONNREFUSED, -ETIMEDOUT, SL_EVERSION, SL_EPROTO, SL_EINVAL,
 *         with a message naming the address in err
 */
int sl_rpc_open(const char *address, const sl_conn_env_t *env, sl_role_t self, sl_role_t expect, const sl_limits_t *limits,
                int timeout_ms, sl_rpc_t **out, char *err, size_t errlen);

/**
 * Sends a request and waits at most timeout_ms for its response.
 * @param[in] req the request message of type, payload_len bytes of payload
 * @param[out] resp a zeroed struct of resp_type to decode the response into
 * @param[out] resp_payload if not NULL, the response payload (malloc'd, the
 *             caller frees it; NULL when empty) and its length
 * @return 0; the peer's error code with its message in err when it answers
 *         with an error frame; -ETIMEDOUT, SL_ECLOSED, SL_EPROTO. After a
 *         transport failure the connection is closed and every later call
 *         fails with SL_ECLOSED.
 */
int sl_rpc_call(sl_rpc_t *rpc, unsigned type, const void *req, const void *payload, size_t payload_len,
                unsigned resp_type, void *resp, uint8_t **resp_payload, size_t *resp_payload_len,
                int timeout_ms, char *err, size_t errlen);

void sl_rpc_close(sl_rpc_t *rpc);

#endif
