/*
 * client_internal.h: what the client library's modules share.
 */
#ifndef SL_CLIENT_INTERNAL_H
#define SL_CLIENT_INTERNAL_H

#include <stddef.h>

#include "rpc.h"
#include "sluice.h"

struct sl_client {
    char address[256];
    sl_client_opts_t opts;
    sl_auth_t auth;     /* the token and TLS of opts, loaded */
    sl_conn_env_t env;  /* .auth = &auth */
    sl_rpc_t *rpc; /* NULL until connected, and after a transport failure */
    char err[1024];
};

/**
 * One request to the dispatcher over the client's connection, reconnecting
 * first when needed. On failure c->err says why.
 * @return 0, or the error code
 */
int sl__client_call(sl_client_t *c, unsigned type, const void *req, const void *payload, size_t len,
                    unsigned resp_type, void *resp);

#endif
