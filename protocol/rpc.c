/* rpc.c: see rpc.h. */
#include "rpc.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "conn.h"
#include "net.h"

struct sl_rpc {
    struct event_base *base;
    sl_conn_t *conn;     /* NULL once closed */
    uint32_t next_id;
    /* The call in progress. */
    bool done;
    int rc;
    uint32_t want_id;
    unsigned resp_type;
    void *resp;
    uint8_t **resp_payload;
    size_t *resp_payload_len;
    char *err;
    size_t errlen;
};

static void on_ready(sl_conn_t *c, void *arg)
{
    sl_rpc_t *r = arg;
    (void)c;
    r->done = true;
    r->rc = 0;
    event_base_loopbreak(r->base);
}

static void on_frame(sl_conn_t *c, const sl_frame_hdr_t *hdr, void *msg, uint8_t *payload, void *arg)
{
    sl_rpc_t *r = arg;
    if (r->done || hdr->request_id != r->want_id) {
        /* A late answer to a call that timed out: drop it. */
        free(payload);
        return;
    }
    r->done = true;
    if (hdr->type == SL_MSG_ERROR) {
        const sluice_Error *e = msg;
        r->rc = e->code < 0 ? e->code : SL_EREMOTE;
        snprintf(r->err, r->errlen, "%s", e->message);
        free(payload);
    } else if (hdr->type != r->resp_type) {
        r->rc = SL_EPROTO;
        snprintf(r->err, r->errlen, "%s answered with %s instead of %s", sl_conn_peer(c), sl_msg_name(hdr->type),
                 sl_msg_name(r->resp_type));
        free(payload);
    } else {
        memcpy(r->resp, msg, sl_msg_size(hdr->type));
        if (r->resp_payload) {
            *r->resp_payload = payload;
            *r->resp_payload_len = hdr->payload_len;
        } else {
            free(payload);
        }
        r->rc = 0;
    }
    event_base_loopbreak(r->base);
}

static void on_close(sl_conn_t *c, int err, const char *why, void *arg)
{
    sl_rpc_t *r = arg;
    (void)c;
    r->conn = NULL;
    if (!r->done) {
        r->done = true;
        r->rc = err;
        snprintf(r->err, r->errlen, "%s", why);
    }
    event_base_loopbreak(r->base);
}

static const sl_conn_cbs_t rpc_cbs = {on_ready, on_frame, on_close};

static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
    sl_rpc_t *r = arg;
    (void)fd;
    (void)what;
    event_base_loopbreak(r->base);
}

/* Runs the private loop until the call is done or timeout_ms passed. */
static int wait_done(sl_rpc_t *r, int timeout_ms, const char *what)
{
    struct event *t = evtimer_new(r->base, on_timeout, r);
    if (!t)
        return -ENOMEM;
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    evtimer_add(t, &tv);
    /* The caller's thread: a peer's reset must not kill its process (net.h). */
    sl_sigpipe_guard_t guard;
    sl_sigpipe_block(&guard);
    while (!r->done && evtimer_pending(t, NULL))
        event_base_loop(r->base, EVLOOP_ONCE);
    sl_sigpipe_unblock(&guard);
    event_free(t);
    if (!r->done) {
        snprintf(r->err, r->errlen, "%s: no answer within %d ms", what, timeout_ms);
        r->done = true;
        r->rc = -ETIMEDOUT;
    }
    return r->rc;
}

int sl_rpc_open(const char *address, const sl_conn_env_t *env, sl_role_t self, sl_role_t expect, const sl_limits_t *limits,
                int timeout_ms, sl_rpc_t **out, char *err, size_t errlen)
{
    *out = NULL;
    sl_rpc_t *r = calloc(1, sizeof *r);
    if (!r)
        return -ENOMEM;
    r->base = event_base_new();
    if (!r->base) {
        free(r);
        return -ENOMEM;
    }
    r->err = err;
    r->errlen = errlen;
    int rc = sl_conn_connect(r->base, address, env, self, expect, limits, timeout_ms, &rpc_cbs, r, &r->conn, err, errlen);
    if (rc < 0)
        goto fail;
    char what[200];
    snprintf(what, sizeof what, "connecting to %s %s", sl_role_name(expect), address);
    rc = wait_done(r, timeout_ms, what);
    if (rc < 0)
        goto fail;
    *out = r;
    return 0;
fail:
    sl_rpc_close(r);
    return rc;
}

int sl_rpc_call(sl_rpc_t *r, unsigned type, const void *req, const void *payload, size_t payload_len,
                unsigned resp_type, void *resp, uint8_t **resp_payload, size_t *resp_payload_len,
                int timeout_ms, char *err, size_t errlen)
{
    if (resp_payload) {
        *resp_payload = NULL;
        *resp_payload_len = 0;
    }
    if (!r->conn) {
        snprintf(err, errlen, "connection closed by an earlier failure");
        return SL_ECLOSED;
    }
    r->done = false;
    r->want_id = ++r->next_id;
    r->resp_type = resp_type;
    r->resp = resp;
    r->resp_payload = resp_payload;
    r->resp_payload_len = resp_payload_len;
    r->err = err;
    r->errlen = errlen;
    int rc = sl_conn_send(r->conn, type, r->want_id, req, payload, payload_len, NULL, NULL);
    if (rc < 0) {
        snprintf(err, errlen, "sending %s: %s", sl_msg_name(type), sl_strerror(rc));
        return rc;
    }
    char what[200];
    snprintf(what, sizeof what, "%s to %s", sl_msg_name(type), sl_conn_peer(r->conn));
    rc = wait_done(r, timeout_ms, what);
    if (rc == -ETIMEDOUT && r->conn) {
        /* The peer may still answer; a fresh connection is the only way to
         * be sure the answer is not taken for the next call's. */
        sl_conn_close(r->conn);
        r->conn = NULL;
    }
    return rc;
}

void sl_rpc_close(sl_rpc_t *r)
{
    if (!r)
        return;
    if (r->conn)
        sl_conn_close(r->conn);
    /* A bufferevent with a callback still deferred (a TLS one after a failed
     * handshake) is freed when that callback has run: let the loop run
     * what is pending, or freeing the base would leak it. */
    if (r->base)
        event_base_loop(r->base, EVLOOP_NONBLOCK);
    if (r->base)
        event_base_free(r->base);
    free(r);
}
