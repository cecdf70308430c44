/*
 * client.c: sl_client_t, the trainer's handle on a dispatcher: one blocking
 * RPC connection for registering datasets and joining jobs.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "elemspec.h"
#include "rpc.h"
#include "sluice.h"

void sl_client_opts_init(sl_client_opts_t *opts)
{
    *opts = (sl_client_opts_t){.connect_timeout_ms = 5000, .request_timeout_ms = 10000};
}

static const sl_limits_t client_limits = {.max_payload = 1024 * 1024};

/* Connects (again) when the last call left no connection. */
static int client_connect(sl_client_t *c)
{
    if (c->rpc)
        return 0;
    return sl_rpc_open(c->address, &c->env, SL_ROLE_CLIENT, SL_ROLE_DISPATCHER, &client_limits, c->opts.connect_timeout_ms,
                       &c->rpc, c->err, sizeof c->err);
}

int sl__client_call(sl_client_t *c, unsigned type, const void *req, const void *payload, size_t len,
                    unsigned resp_type, void *resp)
{
    int rc = client_connect(c);
    if (rc < 0)
        return rc;
    rc = sl_rpc_call(c->rpc, type, req, payload, len, resp_type, resp, NULL, NULL, c->opts.request_timeout_ms,
                     c->err, sizeof c->err);
    if (rc == -ETIMEDOUT || rc == SL_ECLOSED || rc == SL_EPROTO) {
        /* The next call starts on a fresh connection. */
        sl_rpc_close(c->rpc);
        c->rpc = NULL;
    }
    return rc;
}

int sl_client_open(const char *address, const sl_client_opts_t *opts, sl_client_t **out)
{
    sl_client_t *c = calloc(1, sizeof *c);
    *out = c;
    if (!c)
        return -ENOMEM;
    if (opts)
        c->opts = *opts;
    else
        sl_client_opts_init(&c->opts);
    snprintf(c->address, sizeof c->address, "%s", address ? address : "");
    if (c->opts.connect_timeout_ms <= 0 || c->opts.request_timeout_ms <= 0) {
        snprintf(c->err, sizeof c->err, "timeouts must be positive");
        return SL_EINVAL;
    }
    sl_auth_opts_t ao = {.token_file = c->opts.auth_token_file,
                         .tls_cert = c->opts.tls_cert,
                         .tls_key = c->opts.tls_key,
                         .tls_ca = c->opts.tls_ca};
    int rc = sl_auth_load(&c->auth, &ao, c->err, sizeof c->err);
    if (rc < 0)
        return rc;
    /* The caller's strings need not outlive this call. */
    c->opts.auth_token_file = c->opts.tls_cert = c->opts.tls_key = c->opts.tls_ca = NULL;
    c->env.auth = &c->auth;
    return client_connect(c);
}

void sl_client_close(sl_client_t *c)
{
    if (!c)
        return;
    sl_rpc_close(c->rpc);
    sl_auth_free(&c->auth);
    free(c);
}

const char *sl_client_errmsg(const sl_client_t *c)
{
    return c ? c->err : "out of memory";
}

int sl_client_register_dataset(sl_client_t *c, const char *spec_json, size_t len, uint64_t *dataset_id)
{
    return sl_client_register_dataset_as(c, spec_json, len, NULL, dataset_id, NULL);
}

/* A name as the dispatcher takes it (it checks the characters). */
static int name_fits(sl_client_t *c, const char *name, size_t room)
{
    if (name && strlen(name) >= room) {
        snprintf(c->err, sizeof c->err, "dataset name of %zu bytes: at most %zu", strlen(name), room - 1);
        return SL_EINVAL;
    }
    return 0;
}

int sl_client_register_dataset_as(sl_client_t *c, const char *spec_json, size_t len, const char *name,
                                  uint64_t *dataset_id, sl_elemspec_t *element_spec)
{
    sluice_RegisterDatasetRequest req = sluice_RegisterDatasetRequest_init_zero;
    sluice_RegisterDatasetResponse resp = sluice_RegisterDatasetResponse_init_zero;
    if (len > client_limits.max_payload) {
        snprintf(c->err, sizeof c->err, "dataset spec of %zu bytes exceeds the limit of %u", len,
                 client_limits.max_payload);
        return SL_ETOOBIG;
    }
    int rc = name_fits(c, name, sizeof req.name);
    if (rc < 0)
        return rc;
    if (name)
        memcpy(req.name, name, strlen(name) + 1);
    rc = sl__client_call(c, SL_MSG_REGISTER_DATASET_REQ, &req, spec_json, len, SL_MSG_REGISTER_DATASET_RESP, &resp);
    if (rc < 0)
        return rc;
    if (element_spec) {
        /* A dispatcher before element specs sends none: not known. */
        rc = sl_elemspec_from_wire(&resp.element_spec, element_spec, c->err, sizeof c->err);
        if (rc < 0)
            return rc;
    }
    *dataset_id = resp.dataset_id;
    return 0;
}

int sl_client_lookup_dataset(sl_client_t *c, uint64_t dataset_id, const char *name, uint64_t *id_out,
                             sl_elemspec_t *element_spec)
{
    sluice_LookupDatasetRequest req = sluice_LookupDatasetRequest_init_zero;
    sluice_LookupDatasetResponse resp = sluice_LookupDatasetResponse_init_zero;
    if ((dataset_id != 0) == (name && name[0])) {
        snprintf(c->err, sizeof c->err, "a dataset is looked up by its id or by its name: give one of them");
        return SL_EINVAL;
    }
    int rc = name_fits(c, name, sizeof req.name);
    if (rc < 0)
        return rc;
    req.dataset_id = dataset_id;
    if (name)
        memcpy(req.name, name, strlen(name) + 1);
    rc = sl__client_call(c, SL_MSG_LOOKUP_DATASET_REQ, &req, NULL, 0, SL_MSG_LOOKUP_DATASET_RESP, &resp);
    if (rc < 0)
        return rc;
    if (resp.dataset_id == 0 || (dataset_id && resp.dataset_id != dataset_id)) {
        snprintf(c->err, sizeof c->err, "the dispatcher answered a lookup of dataset %" PRIu64 " with dataset %" PRIu64,
                 dataset_id, resp.dataset_id);
        return SL_EPROTO;
    }
    if (element_spec) {
        rc = sl_elemspec_from_wire(&resp.element_spec, element_spec, c->err, sizeof c->err);
        if (rc < 0)
            return rc;
    }
    if (id_out)
        *id_out = resp.dataset_id;
    return 0;
}
