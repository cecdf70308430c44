/*
 * net.h: addresses and listening sockets.
 */
#ifndef SL_NET_H
#define SL_NET_H

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
 * @return 0, or SL_EINVAL / -EHOSTUNREACH with a message in err
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

#endif
