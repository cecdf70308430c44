/*
 * netenv.c: see netenv.h.
 */
#include "netenv.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "metrics.h"

int sl_netenv_init(const sl_daemon_opts_t *o, sl_auth_t *auth, sl_conn_env_t *env, char *err, size_t errlen)
{
    sl_auth_opts_t ao = {
        .token_file = o->auth_token_file, .tls_cert = o->tls_cert, .tls_key = o->tls_key, .tls_ca = o->tls_ca};
    int rc = sl_auth_load(auth, &ao, err, errlen);
    if (rc < 0)
        return rc;
    memset(env, 0, sizeof *env);
    env->auth = auth;
    env->handshake_ms = (int)o->handshake_timeout_ms;
    env->idle_ms = (int)o->idle_timeout_ms;
    env->max_partial_bytes = (size_t)o->max_partial_frame_mb << 20;
    env->max_conns = (unsigned)o->max_connections;
    env->m_conns = sl_metric_register(SL_METRIC_GAUGE, "sluice_conn_open", NULL,
                                      "protocol connections accepted and open", NULL, 0);
    env->m_partial_bytes = sl_metric_register(SL_METRIC_GAUGE, "sluice_conn_partial_frame_bytes", NULL,
                                              "bytes received from peers that are not yet a whole frame", NULL, 0);
    env->m_refused_auth = sl_metric_register(SL_METRIC_COUNTER, "sluice_conn_refused_total", "reason=\"auth\"",
                                             "protocol connections refused or closed, by reason", NULL, 0);
    env->m_refused_remote = sl_metric_register(SL_METRIC_COUNTER, "sluice_conn_refused_total",
                                               "reason=\"protected_mode\"", NULL, NULL, 0);
    env->m_refused_conns = sl_metric_register(SL_METRIC_COUNTER, "sluice_conn_refused_total",
                                              "reason=\"max_connections\"", NULL, NULL, 0);
    env->m_refused_partial = sl_metric_register(SL_METRIC_COUNTER, "sluice_conn_refused_total",
                                                "reason=\"max_partial_frame_bytes\"", NULL, NULL, 0);
    env->m_expired_handshakes = sl_metric_register(SL_METRIC_COUNTER, "sluice_conn_refused_total",
                                                   "reason=\"handshake_timeout\"", NULL, NULL, 0);
    env->m_closed_idle = sl_metric_register(SL_METRIC_COUNTER, "sluice_conn_refused_total", "reason=\"idle\"",
                                            NULL, NULL, 0);
    if (sl_auth_protects(auth)) {
        sl_log_info("protocol connections: %s%s%s", auth->token_len ? "cluster token from " : "",
                    auth->token_len ? auth->token_from : "",
                    auth->tls_accept ? (auth->token_len ? ", TLS 1.3 with peer certificates" : "TLS 1.3 with peer certificates")
                                     : "");
    } else if (o->insecure) {
        sl_log_warn("insecure: no --auth-token-file and no TLS, and --insecure: anyone who reaches %s can read, "
                    "change and forge jobs' data",
                    o->bind);
    } else {
        env->loopback_only = true;
        sl_log_warn("protected mode: no --auth-token-file and no TLS, so only peers on loopback are served; give a "
                    "token (or TLS) to serve other hosts, or --insecure");
    }
    return 0;
}
