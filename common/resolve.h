/*
 * resolve.h: host names looked up off the event loop.
 *
 * getaddrinfo() blocks for as long as the name service takes: with DNS
 * down, resolv.conf's timeout times its attempts (5 s x 2 by default, up to
 * 150 s). A daemon or a client loop that resolved its peer's name on its own
 * thread stopped serving for that long, at the very moment (a dispatcher
 * restart during a DNS outage) it should ride through. A resolver looks a
 * name up on a thread of its own and reports on the loop. A numeric address
 * needs no thread and no name service.
 *
 * The loop's base must be made after evthread_use_pthreads().
 */
#ifndef SL_RESOLVE_H
#define SL_RESOLVE_H

#include <stddef.h>
#include <sys/socket.h>

struct event_base;

typedef struct sl_resolver sl_resolver_t;

/* What a lookup found: rc 0 with the address, or < 0 (SL_EINVAL,
 * SL_ENOHOST, -ENOMEM, -EAGAIN: no thread) with err saying why. */
typedef void (*sl_resolved_fn)(int rc, const struct sockaddr_storage *ss, socklen_t sslen, const char *err,
                               void *arg);

/** A resolver whose lookups report to done(…, arg) on base's loop. @return it, or NULL (no memory) */
sl_resolver_t *sl_resolver_new(struct event_base *base, sl_resolved_fn done, void *arg);

/**
 * Starts looking up hostport ("host:port"); done runs on the loop once it
 * ends, never from within this call. One lookup at a time: a lookup still
 * under way is abandoned (its result is dropped).
 * @return 0, or -ENOMEM
 */
int sl_resolver_start(sl_resolver_t *r, const char *hostport);

/** Whether a lookup is under way (started, done not run yet). */
int sl_resolver_busy(const sl_resolver_t *r);

/** Frees r; a lookup under way is abandoned, its thread ends on its own. */
void sl_resolver_free(sl_resolver_t *r);

#endif
