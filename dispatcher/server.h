/*
 * server.h: the dispatcher's protocol endpoint. Accepts workers and clients,
 * decodes their requests, applies them to the state machine and answers.
 */
#ifndef SL_DSERVER_H
#define SL_DSERVER_H

#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>

#include "state.h"

typedef struct sl_dserver sl_dserver_t;

/**
 * Listens on host:port (0 picks a port) and serves st on base. Also runs the
 * state's clock (timeouts) on base.
 * @param[out] bound_port the port it listens on
 * @return 0, or -errno with a message in err
 */
int sl_dserver_start(struct event_base *base, sl_dstate_t *st, const char *host, uint16_t port,
                     uint16_t *bound_port, sl_dserver_t **out, char *err, size_t errlen);

/** Closes every connection and the listener, and frees the server. */
void sl_dserver_free(sl_dserver_t *srv);

/** @return milliseconds of a monotonic clock */
int64_t sl_now_ms(void);

#endif
