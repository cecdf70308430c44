/*
 * server.h: the dispatcher's protocol endpoint. Accepts workers and clients,
 * decodes their requests, applies them to the state machine and answers.
 *
 * Group commit: the answers to every request read in one pass of the event
 * loop are held (sl_conn_cork) until one commit has made their changes
 * durable; a failed commit answers none of them (their connections close,
 * the peers ask again) and the state goes back to what the store holds.
 */
#ifndef SL_DSERVER_H
#define SL_DSERVER_H

#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>

#include "conn.h"
#include "state.h"
#include "store.h"

typedef struct sl_dserver sl_dserver_t;

/**
 * Listens on host:port (0 picks a port) and serves st on base, committing
 * its changes to store. Also runs the state's clock (timeouts) on base.
 * @param[out] bound_port the port it listens on
 * @return 0, or -errno with a message in err
 */
int sl_dserver_start(struct event_base *base, sl_dstate_t *st, sl_store_t *store, sl_conn_env_t *env,
                     const char *host, uint16_t port,
                     uint16_t *bound_port, sl_dserver_t **out, char *err, size_t errlen);

/**
 * Commits the state's changes now (the admin endpoint calls it before it
 * answers). On failure the connections holding answers are closed (their
 * changes are dropped; the peers ask again), the state is reloaded from the
 * store, and when even that fails the event loop is stopped:
 * sl_dserver_failed() says so.
 * @return 0, or the commit's error with a message in err
 */
int sl_dserver_commit(sl_dserver_t *srv, char *err, size_t errlen);

/** @return the state the server serves */
sl_dstate_t *sl_dserver_state(sl_dserver_t *srv);

/** @return whether the server stopped because its state store failed */
int sl_dserver_failed(const sl_dserver_t *srv);

/** Commits a commit put off for hand-outs (a clean stop: their answers do
 *  not go out), closes every connection and the listener, and frees the
 *  server. */
void sl_dserver_free(sl_dserver_t *srv);

/** @return milliseconds of a monotonic clock */
int64_t sl_now_ms(void);

#endif
