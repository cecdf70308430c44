/*
 * netenv.h: a daemon's connection environment (conn.h's sl_conn_env_t and
 * its credentials) made from the options both daemons take (cli.h).
 */
#ifndef SL_NETENV_H
#define SL_NETENV_H

#include <stddef.h>

#include "auth.h"
#include "cli.h"
#include "conn.h"

/**
 * Loads the token and TLS files of o into auth and sets env's limits from
 * o, env->auth pointing at auth. Without a token or TLS and without
 * --insecure the daemon is in protected mode (loopback peers only); the
 * log says which mode it runs in. env's counters are registered on
 * /metrics as sluice_conn_* (once per process).
 * @return 0, or SL_EINVAL with a message in err (a file that cannot be
 *         read, a token too short, TLS files that do not fit together)
 */
int sl_netenv_init(const sl_daemon_opts_t *o, sl_auth_t *auth, sl_conn_env_t *env, char *err, size_t errlen);


#endif
