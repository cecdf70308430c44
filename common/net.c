/* net.c: see net.h. */
#include "net.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

#include <event2/event.h>
#include <event2/listener.h>

#include "log.h"
#include "sluice.h"

int sl_addr_split(const char *hostport, char *host, size_t hostlen, uint16_t *port, char *err, size_t errlen)
{
    /* tf.data service's addresses carry their protocol ("grpc://host:port"):
     * taken as host:port. Any other scheme is refused by name. */
    const char *scheme = strstr(hostport, "://");
    if (scheme && (size_t)(scheme - hostport) == 4 && strncasecmp(hostport, "grpc", 4) == 0) {
        hostport = scheme + 3;
    } else if (scheme) {
        snprintf(err, errlen, "bad address \"%s\": sluice peers speak their own protocol, not %.*s: give "
                 "host:port (a grpc:// prefix, as tf.data service writes it, is accepted and dropped)", hostport,
                 (int)(scheme - hostport < 16 ? scheme - hostport : 16), hostport);
        return SL_EINVAL;
    }
    const char *colon = strrchr(hostport, ':');
    const char *h = hostport;
    size_t hl = colon ? (size_t)(colon - hostport) : 0;
    if (!colon || hl == 0 || colon[1] == '\0')
        goto bad;
    if (h[0] == '[') {
        if (hl < 2 || h[hl - 1] != ']')
            goto bad;
        h++;
        hl -= 2;
    }
    if (hl >= hostlen)
        goto bad;
    char *end;
    errno = 0;
    long p = strtol(colon + 1, &end, 10);
    if (errno || *end || p < 0 || p > 65535)
        goto bad;
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = (uint16_t)p;
    return 0;
bad:
    snprintf(err, errlen, "bad address \"%s\": expected host:port", hostport);
    return SL_EINVAL;
}

int sl_addr_resolve(const char *hostport, struct sockaddr_storage *ss, socklen_t *sslen, char *err,
                    size_t errlen)
{
    char host[256];
    uint16_t port;
    int rc = sl_addr_split(hostport, host, sizeof host, &port, err, errlen);
    if (rc < 0)
        return rc;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    char ports[8];
    snprintf(ports, sizeof ports, "%u", port);
    int gai = getaddrinfo(host, ports, &hints, &res);
    if (gai != 0 || !res) {
        snprintf(err, errlen, "cannot resolve the host name \"%s\" of \"%s\": %s", host, hostport,
                 gai == EAI_SYSTEM ? strerror(errno) : gai_strerror(gai));
        return SL_ENOHOST;
    }
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *sslen = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

int sl_listen_tcp(const char *host, uint16_t port, int *fd, uint16_t *bound_port, char *err, size_t errlen)
{
    char hp[300];
    snprintf(hp, sizeof hp, strchr(host, ':') ? "[%s]:%u" : "%s:%u", host, port);
    struct sockaddr_storage ss;
    socklen_t sslen;
    int rc = sl_addr_resolve(hp, &ss, &sslen, err, errlen);
    if (rc < 0)
        return rc;
    int s = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0) {
        rc = -errno;
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return rc;
    }
    int one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(s, (struct sockaddr *)&ss, sslen) < 0 || listen(s, 512) < 0) {
        rc = -errno;
        snprintf(err, errlen, "cannot listen on %s: %s", hp, strerror(errno));
        close(s);
        return rc;
    }
    struct sockaddr_storage got;
    socklen_t gl = sizeof got;
    getsockname(s, (struct sockaddr *)&got, &gl);
    *bound_port = ntohs(got.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&got)->sin6_port
                                                  : ((struct sockaddr_in *)&got)->sin_port);
    *fd = s;
    return 0;
}

void sl_sigpipe_block(sl_sigpipe_guard_t *g)
{
    sigset_t pipe, pending;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    g->was_pending = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe, &g->old);
}

void sl_sigpipe_unblock(const sl_sigpipe_guard_t *g)
{
    sigset_t pipe, pending;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    if (!g->was_pending && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
        const struct timespec now = {0, 0};
        while (sigtimedwait(&pipe, NULL, &now) < 0 && errno == EINTR) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

static void listener_resume(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    evconnlistener_enable(arg);
}

void sl_listener_on_error(struct evconnlistener *l, void *arg)
{
    static _Thread_local time_t logged_at;
    static _Thread_local unsigned unlogged;
    int e = EVUTIL_SOCKET_ERROR();
    (void)arg;
    time_t now = time(NULL);
    if (now != logged_at) {
        if (unlogged)
            sl_log_warn("accept: %s (and %u more accept errors in the last second)", strerror(e), unlogged);
        else
            sl_log_warn("accept: %s", strerror(e));
        logged_at = now;
        unlogged = 0;
    } else {
        unlogged++;
    }
    if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
        evconnlistener_disable(l);
        struct timeval tv = {0, 100000};
        event_base_once(evconnlistener_get_base(l), -1, EV_TIMEOUT, listener_resume, l, &tv);
    }
}
