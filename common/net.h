/*
 * net.h: addresses and listening sockets.
 */
#ifndef SL_NET_H
#define SL_NET_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/**
 * Splits "host:port" ("[::1]:5050" for IPv6).
 * @return 0, or SL_EINVAL with a message naming the address in err
 */
int sl_addr_split(const char *hostport, char *host, size_t hostlen, uint16_t *port, char *err, size_t errlen);

/**
 * Resolves "host:port" to a socket address (numeric hosts and names).
 * @return 0, or SL_EINVAL / SL_ENOHOST with a message in err
 */
int sl_addr_resolve(const char *hostport, struct sockaddr_storage *ss, socklen_t *sslen, char *err,
                    size_t errlen);

/**
 * Opens a non-blocking listening TCP socket on host:port (port 0 picks one).
 * @param[out] fd the socket, closed by the caller
 * @param[out] bound_port the port it listens on
 * @return 0, or -errno with a message in err
 */
int sl_listen_tcp(const char *host, uint16_t port, int *fd, uint16_t *bound_port, char *err, size_t errlen);

/*
 * SIGPIPE in a process that is not ours (libsluice runs in the trainer): a
 * write to a peer that reset the connection must fail with EPIPE, not kill
 * the process, and the process's disposition of SIGPIPE is not ours to
 * change. conn.c's own writes pass MSG_NOSIGNAL; libevent's writev cannot,
 * so a thread that runs a libevent loop blocks SIGPIPE while it does. A
 * SIGPIPE raised meanwhile is thread-directed, stays pending on the thread,
 * and sl_sigpipe_unblock() takes it off before the mask comes back.
 */
typedef struct sl_sigpipe_guard {
    sigset_t old;
    bool was_pending;
} sl_sigpipe_guard_t;

/** Blocks SIGPIPE in the calling thread until sl_sigpipe_unblock(g). */
void sl_sigpipe_block(sl_sigpipe_guard_t *g);

/** Drops a SIGPIPE raised since sl_sigpipe_block(g), and restores the mask. */
void sl_sigpipe_unblock(const sl_sigpipe_guard_t *g);

struct evconnlistener;

/**
 * An evconnlistener's error callback for the daemons: out of descriptors
 * (or kernel memory) it stops accepting for 100 ms instead of spinning on
 * the pending connection, and it logs at most once a second (with how many
 * errors it did not log).
 */
void sl_listener_on_error(struct evconnlistener *l, void *arg);

#endif
