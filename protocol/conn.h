/*
 * conn.h: one protocol connection on a libevent loop. It does the handshake,
 * cuts the byte stream into frames with every length checked against
 * sl_limits_t, decodes messages, and sends frames whose payload goes out
 * straight from the caller's buffer (evbuffer references, no copy).
 *
 * A protocol violation by the peer (unknown type, bad length, bad message,
 * wrong version or role) is answered with an error frame, after which the
 * connection closes. sl_conn_close() is the one function that tears a
 * connection down; it may be called from inside any callback.
 */
#ifndef SL_CONN_H
#define SL_CONN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <event2/event.h>

#include "auth.h"
#include "frame.h"

typedef struct sl_conn sl_conn_t;

/*
 * What a process's connections share: how peers prove themselves, and the
 * limits on what accepted peers can make us hold. One per event loop (the
 * counters are not atomic). NULL where a function takes one: no token, no
 * TLS, no limits.
 */
typedef struct sl_conn_env {
    const sl_auth_t *auth;    /* the token and TLS contexts; NULL or empty: none */
    bool loopback_only;       /* protected mode: accept peers on loopback addresses only */
    int handshake_ms;         /* an accepted peer's whole handshake, TLS included (0: 10000) */
    int idle_ms;              /* accepted connections: closed after this long with no frame either
                                 way and no request of the peer's unanswered (0: never) */
    size_t max_partial_bytes; /* accepted connections together: bytes received and not yet a
                                 whole frame (0: no bound) */
    unsigned max_conns;       /* accepted connections open at once (0: no bound) */
    /* What is held now, and what was refused. */
    size_t partial_bytes;
    unsigned conns;
    uint64_t refused_auth, refused_partial, refused_conns, refused_remote, closed_idle, expired_handshakes;
    /* The same on /metrics (netenv.c registers them; NULL: not published). */
    struct sl_metric *m_partial_bytes, *m_conns, *m_refused_auth, *m_refused_partial, *m_refused_conns,
        *m_refused_remote, *m_closed_idle, *m_expired_handshakes;
} sl_conn_env_t;

typedef struct sl_conn_cbs {
    /* The handshake is done; the connection can send. May be NULL. */
    void (*on_ready)(sl_conn_t *c, void *arg);
    /* A frame arrived. msg (the decoded message) is valid during the call;
     * payload (payload_len bytes, NULL when empty) is malloc'd and owned by
     * the callee, who must free it. */
    void (*on_frame)(sl_conn_t *c, const sl_frame_hdr_t *hdr, void *msg, uint8_t *payload, void *arg);
    /* The connection failed or the peer closed it: err is a negative code,
     * why says what happened. The connection is freed after the call
     * returns. Not called for sl_conn_close(). */
    void (*on_close)(sl_conn_t *c, int err, const char *why, void *arg);
} sl_conn_cbs_t;

/**
 * Takes over an accepted socket; the peer speaks first. A peer env does
 * not admit (not on loopback in protected mode, env->max_conns open) is
 * sent an error frame that says why, and closed.
 * @param[in] env the limits and credentials (may be NULL)
 * @param[in] accept_roles bit (1 << role) for each peer role to accept
 * @return the connection, or NULL (fd closed) when refused or out of memory
 */
sl_conn_t *sl_conn_accept(struct event_base *base, int fd, sl_conn_env_t *env, sl_role_t self, unsigned accept_roles,
                          const sl_limits_t *limits, const sl_conn_cbs_t *cbs, void *arg);

/**
 * Connects to a peer of role expect at address ("host:port"), with the
 * token and TLS of env->auth (env may be NULL). on_ready fires once the
 * handshake is done; on_close if that does not happen within timeout_ms
 * (connect, TLS and hellos together) or the peer refuses.
 * @param[out] out the connection
 * @return 0, or SL_EINVAL / SL_ENOHOST / -ENOMEM with a message in err
 */
int sl_conn_connect(struct event_base *base, const char *address, const sl_conn_env_t *env, sl_role_t self,
                    sl_role_t expect, const sl_limits_t *limits, int timeout_ms, const sl_conn_cbs_t *cbs,
                    void *arg, sl_conn_t **out, char *err, size_t errlen);

/**
 * sl_conn_connect() to an address already resolved (resolve.h, off the
 * loop); address ("host:port") names the peer in messages.
 */
int sl_conn_connect_to(struct event_base *base, const char *address, const struct sockaddr_storage *addr,
                       socklen_t addrlen, const sl_conn_env_t *env, sl_role_t self, sl_role_t expect,
                       const sl_limits_t *limits, int timeout_ms, const sl_conn_cbs_t *cbs, void *arg,
                       sl_conn_t **out, char *err, size_t errlen);

/**
 * For a caller that tries again when an attempt fails (a worker or a client
 * reconnecting): the TCP connect of c (just made by sl_conn_connect()) must
 * be answered within ms, else c closes with "no answer to the connect". The
 * rest of the handshake keeps the whole timeout. A SYN sent while the
 * network was cut is retransmitted by the kernel only after 1, 3, 7 s...;
 * a new attempt sends a new one, so that a healed network carries the
 * connection within about ms and a retry interval, not a backoff's step.
 */
void sl_conn_cap_connect(sl_conn_t *c, int ms);

/* What reconnecting callers give sl_conn_cap_connect(): past the kernel's
 * first SYN retransmission (1 s), so one lost SYN costs no attempt. */
#define SL_CONN_SYN_MS 1500

/** Payload release callback: called once the bytes are written or dropped. */
typedef void (*sl_conn_free_fn)(const void *data, size_t len, void *extra);

/**
 * Queues a frame once the connection is open (on_ready, or any frame
 * received): the message msg of type, then payload_len bytes at
 * payload. With free_fn, payload is referenced, not copied, and free_fn(payload,
 * payload_len, extra) runs when it is no longer needed (also on failure);
 * without, it is copied.
 * @return 0, SL_ETOOBIG, SL_ECLOSED, -EAGAIN (the handshake is not done), -ENOMEM
 */
int sl_conn_send(sl_conn_t *c, unsigned type, uint32_t request_id, const void *msg, const void *payload,
                 size_t payload_len, sl_conn_free_fn free_fn, void *extra);

/**
 * sl_conn_send() with a payload in parts: payload_len bytes at payload,
 * pad (< 8) zero bytes, then the ntail (<= 2) tails in order (a batch's
 * tensor bytes, then its encoded provenance and split-done notices).
 * payload and tails are referenced, not copied; free_fn(payload,
 * payload_len, extra), if given, runs once none is needed any more (also
 * on failure).
 * @return as sl_conn_send(); SL_ETOOBIG for more than 2 tails
 */
int sl_conn_send_tail(sl_conn_t *c, unsigned type, uint32_t request_id, const void *msg, const void *payload,
                      size_t payload_len, size_t pad, const struct iovec *tail, int ntail, sl_conn_free_fn free_fn,
                      void *extra);

/** Sends an error frame answering request_id (0: the connection). */
int sl_conn_send_error(sl_conn_t *c, uint32_t request_id, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/** Sends an error frame, then closes once it is written; on_close runs with code. */
void sl_conn_fail(sl_conn_t *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/** Closes the connection now and frees it; on_close is not called. */
void sl_conn_close(sl_conn_t *c);

/**
 * Corks the connection: frames sent from now on are held, not written,
 * until sl_conn_uncork() (the dispatcher holds its answers until their
 * changes are committed). A connection that fails or closes meanwhile
 * drops what it held.
 * @return 0 or -ENOMEM
 */
int sl_conn_cork(sl_conn_t *c);

/** Writes what the cork held, in order (in one system call when nothing
 * else is queued), and sends directly again. */
void sl_conn_uncork(sl_conn_t *c);

/**
 * Gathers (on) or not (off, the default). A connection that gathers writes
 * the first frame of a pass of its loop at once (the peer starts on it),
 * holds the next, up to SL_GATHER_FRAMES of them (gather.h), and writes
 * those together at the end of the pass, in one system call when nothing
 * is queued before them. A worker gathers its answers to a client. Order,
 * releases and failures are as without: only fewer, larger writes. No
 * effect under TLS, which gathers its records anyway; turned off, what is
 * gathered is written.
 */
void sl_conn_set_gather(sl_conn_t *c, bool on);

/** @return the bytes queued for the peer and not written yet (under TLS,
 * with the records gathered for the socket; with sl_conn_set_gather(),
 * with the frames gathered) */
size_t sl_conn_pending(const sl_conn_t *c);

/** @return the peer's role (after the handshake) */
sl_role_t sl_conn_peer_role(const sl_conn_t *c);

/** @return the peer's address "host:port", valid while the connection is */
const char *sl_conn_peer(const sl_conn_t *c);

void sl_conn_set_arg(sl_conn_t *c, void *arg);

/**
 * Writes the numeric address of our end of the connection (the local
 * interface that reaches the peer) into host.
 * @return 0, or -errno
 */
int sl_conn_local_host(const sl_conn_t *c, char *host, size_t len);

/* TCP liveness on every protocol connection (conn.c, set_socket_options()):
 * an idle connection is probed after SL_CONN_KEEPIDLE_S, every
 * SL_CONN_KEEPINTVL_S, and a connection whose data or probes go
 * unacknowledged for SL_CONN_DEAD_MS is closed (TCP_USER_TIMEOUT, which also
 * bounds the keepalive probes): idle + count * interval = the same 20 s. */
#define SL_CONN_KEEPIDLE_S 10
#define SL_CONN_KEEPINTVL_S 2
#define SL_CONN_KEEPCNT 5
#define SL_CONN_DEAD_MS 20000

/**
 * How long a heartbeat may go unanswered before its connection counts as
 * dead, whatever TCP thinks: 8 intervals, and at least 2 s. The worker and
 * the client then close it and open a new one, so that a healed network
 * carries heartbeats at once rather than after TCP's retransmission backoff
 * (docs/fault-tolerance.md, "Dispatcher outages").
 */
static inline int64_t sl_conn_answer_deadline_ms(uint32_t heartbeat_ms)
{
    int64_t ms = (int64_t)heartbeat_ms * 8;
    return ms < 2000 ? 2000 : ms;
}

#endif
