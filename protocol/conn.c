/*
 * conn.c: see conn.h. A connection lives in one of five states:
 *
 *   HANDSHAKE -> [PROOF] -> OPEN -> DRAINING (our error frame is being written) -> DEAD
 *   HANDSHAKE, PROOF --------------> DRAINING (we refused the peer's handshake)
 *   HANDSHAKE, PROOF ---------------------------------------------------------->  DEAD
 *   OPEN ---------------------------------------------------------------------->  DEAD
 *
 * HANDSHAKE: TLS (if any), then the hellos. The connector sends its hello;
 * the acceptor answers with its own, and with its proof when it holds the
 * cluster token; the connector checks that proof and sends its own
 * (PROOF: the acceptor waits for it). Nothing but the handshake may be
 * sent before OPEN.
 *
 * DEAD connections are freed as soon as no callback of theirs is on the
 * stack, so a callback may close its own connection.
 */
#include "conn.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "big_alloc.h"
#include "gather.h"
#include "log.h"
#include "metrics.h"
#include "net.h"
#include "tlsio.h"

/* How long an accepted peer may take for its whole handshake (unless the
 * env says), and how long we wait for our last error frame to be written
 * before closing anyway. */
#define HANDSHAKE_TIMEOUT_MS 10000
#define DRAIN_TIMEOUT_MS 2000
/* After our error frame is out: how long the peer must have been quiet
 * before we close (see drained()). */
#define LINGER_MS 100
/* Under TLS, how much one read callback takes from what OpenSSL read
 * ahead before it lets the loop run other work (tls_pump()). */
#define PUMP_BUDGET (4u << 20)
/* A plaintext connection we opened reads a frame whose payload is smaller
 * than RX_DIRECT through its input, many frames to a system call: what the
 * socket holds, up to RX_CHUNK, in one recv() (rx_fill()), at most
 * RX_BUDGET a read callback before the loop serves other connections.
 * libevent 2.1 reads at most 4 KiB a call, so a stream of 8 KiB batches
 * took three system calls a batch. A payload of RX_DIRECT or more goes
 * straight from the socket into its buffer (read_payload()), uncopied. */
#define RX_DIRECT (32u << 10)
#define RX_CHUNK (128u << 10)
#define RX_BUDGET (1u << 20)
/* A connection that held this much in unfinished frames gives the freed
 * memory back to the system when it goes (malloc_trim). */
#define TRIM_AFTER_BYTES (1u << 20)

enum conn_state { CONN_HANDSHAKE, CONN_PROOF, CONN_OPEN, CONN_DRAINING, CONN_DEAD };

struct sl_conn {
    struct bufferevent *bev;
    enum conn_state state;
    bool outgoing;
    bool tls;
    bool counted;           /* accepted: counted in env->conns */
    bool prefix_checked;    /* the peer's hello prefix (magic, version, role) was checked */
    bool hello_sent;        /* connector: our hello went out */
    bool error_queued;      /* DRAINING: our error frame is on its way */
    bool lingering;         /* DRAINING: it is out, we half-closed and drop what still comes */
    sl_conn_env_t *env;     /* accepted connections update its counters */
    const sl_auth_t *auth;  /* NULL: no token */
    uint8_t hello_self[SL_HANDSHAKE_LEN];
    uint8_t hello_peer[SL_HANDSHAKE_LEN];
    struct event *deadline; /* the handshake's, from connect or accept */
    struct event *pump;     /* TLS: records OpenSSL read ahead wait (read_cb again) */
    struct event *flush;    /* TLS: gathered records wait for the socket (tlsio.h) */
    int deadline_ms;
    int syn_ms;             /* outgoing: the deadline is the TCP connect's, at syn_ms (0: none) */
    struct event *idle;     /* accepted connections with env->idle_ms */
    int64_t last_active_ms;
    unsigned owed;          /* accepted: the peer's requests not answered yet */
    size_t partial;         /* accepted: bytes of the input counted in env->partial_bytes */
    size_t partial_peak;
    sl_role_t self;
    sl_role_t peer;
    sl_role_t expect;      /* outgoing: the role the peer must have */
    unsigned accept_roles; /* incoming: the roles we accept */
    sl_limits_t limits;
    sl_conn_cbs_t cbs;
    void *arg;
    int depth;          /* callbacks of ours on the stack */
    bool free_pending;  /* DEAD while depth > 0: free when it drops to 0 */
    int fail_code;      /* DRAINING: the code on_close will get */
    char fail_why[512]; /* DRAINING: the reason on_close will get */
    char peer_addr[80];
    struct evbuffer *held; /* corked: frames wait here (sl_conn_cork) */
    /* Empty buffers kept for the next cork and the next frame queued
     * (queue_parts()): an evbuffer_new() and its free cost about 600
     * instructions, on a request or an answer's path. */
    struct evbuffer *spare_held, *spare_frame;
    /* The last GET_ELEMENT message decoded, kept for the next (msg_new()):
     * an answer's is 5 KB and more, past malloc's per-thread cache. */
    void *spare_msg;
    unsigned spare_type;
    bool gathers;          /* sl_conn_set_gather() */
    sl_gather_t *gather;   /* frames of this pass of the loop, once it gathered one */
    struct event *gather_ev; /* writes them at the end of the pass (on_gather) */
    bool pass_open;          /* a frame went out in this pass: the next are gathered */
    /* A frame whose header and message are in and whose payload is not:
     * the payload is read into its own buffer, straight from the socket
     * (read_payload()), or, on an incoming connection, waits in the input
     * until it is whole (rx_payload NULL till then). rx_msg is NULL when
     * no frame is part-read. */
    sl_frame_hdr_t rx_hdr;
    void *rx_msg;
    uint8_t *rx_payload;
    size_t rx_have;
};

/* Counts one refusal of env's (counter and metric). */
static void count(uint64_t *counter, struct sl_metric *m)
{
    (*counter)++;
    if (m)
        sl_metric_add(m, 1);
}

static void publish(const sl_conn_env_t *env)
{
    if (env->m_conns)
        sl_metric_set(env->m_conns, env->conns);
    if (env->m_partial_bytes)
        sl_metric_set(env->m_partial_bytes, (double)env->partial_bytes);
}

static int conn_fd(const sl_conn_t *c)
{
    return bufferevent_getfd(c->bev);
}

static SSL *tls_of(const sl_conn_t *c)
{
    return bufferevent_openssl_get_ssl(c->bev);
}

static void on_flush(evutil_socket_t fd, short what, void *arg);

/* A TLS connection that has its socket: records gather (tlsio.h), and
 * what the socket does not take waits for it to be writable. */
static bool tls_socket_ready(sl_conn_t *c, struct event_base *base)
{
    return sl_tls_gather(tls_of(c)) == 0 && (c->flush = event_new(base, conn_fd(c), EV_WRITE, on_flush, c));
}

static const char *state_names[] = {"HANDSHAKE", "PROOF", "OPEN", "DRAINING", "DEAD"};

static void set_state(sl_conn_t *c, enum conn_state next)
{
    /* Connections only move forward; DEAD is final. */
    assert(next > c->state || (next == CONN_DEAD && c->state != CONN_DEAD));
    (void)state_names;
    c->state = next;
}

static void conn_free(sl_conn_t *c)
{
    free(c->rx_msg);
    free(c->rx_payload);
    if (c->held)
        evbuffer_free(c->held);
    if (c->spare_held)
        evbuffer_free(c->spare_held);
    if (c->spare_frame)
        evbuffer_free(c->spare_frame);
    free(c->spare_msg);
    if (c->gather_ev)
        event_free(c->gather_ev);
    sl_gather_free(c->gather);
    if (c->deadline)
        event_free(c->deadline);
    if (c->idle)
        event_free(c->idle);
    if (c->pump)
        event_free(c->pump);
    if (c->flush)
        event_free(c->flush);
    if (c->bev)
        bufferevent_free(c->bev);
    if (c->env && !c->outgoing) {
        c->env->partial_bytes -= c->partial;
        if (c->counted)
            c->env->conns--;
        publish(c->env);
    }
    /* The input's chains are freed; a peer that made us hold a lot must not
     * leave the process that much larger. */
    if (c->partial_peak >= TRIM_AFTER_BYTES)
        malloc_trim(0);
    free(c);
}

static void gather_flush(sl_conn_t *c);

static void leave(sl_conn_t *c)
{
    if (--c->depth == 0 && c->free_pending)
        conn_free(c);
}

/* Marks the connection dead and tells the owner (notify). The entry point
 * on the stack frees it in leave(): every entry point (a libevent callback
 * or a public function that may end the connection) brackets its work with
 * c->depth++ and leave(c). */
static void conn_die(sl_conn_t *c, bool notify, int err, const char *why)
{
    if (c->state == CONN_DEAD)
        return;
    set_state(c, CONN_DEAD);
    bufferevent_disable(c->bev, EV_READ | EV_WRITE);
    if (c->deadline)
        event_del(c->deadline);
    if (c->idle)
        event_del(c->idle);
    if (c->pump)
        event_del(c->pump);
    if (c->flush)
        event_del(c->flush);
    c->free_pending = true;
    if (notify && c->cbs.on_close)
        c->cbs.on_close(c, err, why, c->arg);
}

static void set_timeout(sl_conn_t *c, int ms)
{
    if (ms <= 0) {
        bufferevent_set_timeouts(c->bev, NULL, NULL);
        return;
    }
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    bufferevent_set_timeouts(c->bev, &tv, &tv);
}

static int send_error_frame(sl_conn_t *c, uint32_t request_id, int code, const char *msg)
{
    sluice_Error e = sluice_Error_init_zero;
    e.code = code;
    snprintf(e.message, sizeof e.message, "%s", msg);
    return sl_conn_send(c, SL_MSG_ERROR, request_id, &e, NULL, 0, NULL, NULL);
}

/* Our side found the peer at fault: say why in an error frame, stop reading
 * and close once the frame is out (or DRAIN_TIMEOUT_MS passed). */
static void arm_ms(struct event *ev, int ms);

/* The error frame of a failing connection is written. Without TLS we
 * half-close and read (and drop) what the peer still sends until it has
 * been quiet for LINGER_MS (DRAIN_TIMEOUT_MS at most): closing with unread
 * bytes would make the kernel reset the connection, and a reset can
 * destroy the error frame before the peer reads it. */
static void drained(sl_conn_t *c)
{
    if (c->tls || !c->error_queued) {
        conn_die(c, true, c->fail_code, c->fail_why);
        return;
    }
    if (!c->lingering) {
        c->lingering = true;
        shutdown(conn_fd(c), SHUT_WR);
    }
    arm_ms(c->deadline, LINGER_MS);
}

static void conn_fail(sl_conn_t *c, int code, const char *why)
{
    if (c->state == CONN_DEAD || c->state == CONN_DRAINING)
        return;
    /* A corked connection's held answers wait for a commit that this
     * connection will not see through; they are dropped, and the error
     * frame goes to the output, not behind them into the cork. */
    if (c->held) {
        evbuffer_free(c->held);
        c->held = NULL;
    }
    /* Gathered frames were sent before the failure: they go first. */
    gather_flush(c);
    c->error_queued = send_error_frame(c, 0, code, why) == 0;
    c->fail_code = code;
    snprintf(c->fail_why, sizeof c->fail_why, "%s", why);
    set_state(c, CONN_DRAINING);
    set_timeout(c, DRAIN_TIMEOUT_MS);
    if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
        drained(c);
}

static bool has_token(const sl_conn_t *c)
{
    return c->auth && c->auth->token_len > 0;
}

static int64_t loop_ms(const sl_conn_t *c)
{
    struct timeval tv;
    event_base_gettimeofday_cached(bufferevent_get_base(c->bev), &tv);
    return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

static void arm_ms(struct event *ev, int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    event_add(ev, &tv);
}

/* The handshake is done: frames flow. */
static void open_conn(sl_conn_t *c)
{
    set_state(c, CONN_OPEN);
    event_del(c->deadline);
    c->last_active_ms = loop_ms(c);
    if (c->idle)
        arm_ms(c->idle, c->env->idle_ms);
    if (c->outgoing && c->cbs.on_ready)
        c->cbs.on_ready(c, c->arg);
}

static void refuse_auth(sl_conn_t *c, const char *why)
{
    if (c->env && !c->outgoing)
        count(&c->env->refused_auth, c->env->m_refused_auth);
    conn_fail(c, SL_EAUTH, why);
}

/* Our hello: role, whether we prove a token, a fresh nonce. @return 0 or -errno */
static int make_hello(sl_conn_t *c)
{
    uint8_t nonce[SL_HELLO_NONCE_LEN];
    int rc = sl_auth_random(nonce, sizeof nonce);
    if (rc < 0)
        return rc;
    sl_handshake_encode(c->hello_self, c->self, has_token(c) ? SL_HELLO_TOKEN : 0, nonce);
    return 0;
}

/* The peer's whole hello is in c->hello_peer (its role checked by
 * check_prefix()), and, on a connector facing a token, its proof. */
static void on_hello(sl_conn_t *c, const uint8_t *proof)
{
    char err[512];
    bool theirs = sl_handshake_flags(c->hello_peer) & SL_HELLO_TOKEN;
    const char *self = sl_role_name(c->self);
    if (!c->outgoing) {
        if (has_token(c) && !theirs) {
            snprintf(err, sizeof err,
                     "authentication required: this %s needs the cluster token (--auth-token-file or "
                     "SLUICE_AUTH_TOKEN_FILE)",
                     self);
            refuse_auth(c, err);
            return;
        }
        if (!has_token(c) && theirs) {
            snprintf(err, sizeof err,
                     "this %s runs without a cluster token, the peer has one: start the %s with the same "
                     "--auth-token-file",
                     self, self);
            refuse_auth(c, err);
            return;
        }
        int rc = make_hello(c);
        if (rc < 0) {
            conn_fail(c, rc, "no random bytes for the handshake's nonce");
            return;
        }
        bufferevent_write(c->bev, c->hello_self, sizeof c->hello_self);
        if (!has_token(c)) {
            open_conn(c);
            return;
        }
        uint8_t mine[SL_AUTH_PROOF_LEN];
        sl_auth_proof(c->auth, true, c->hello_peer, c->hello_self, SL_HANDSHAKE_LEN, mine);
        bufferevent_write(c->bev, mine, sizeof mine);
        set_state(c, CONN_PROOF);
        return;
    }
    if (has_token(c) && !theirs) {
        snprintf(err, sizeof err,
                 "%s does not prove the cluster token: it runs without --auth-token-file (refusing to talk to "
                 "it with ours)",
                 c->peer_addr);
        refuse_auth(c, err);
        return;
    }
    if (!has_token(c) && theirs) {
        snprintf(err, sizeof err, "%s requires the cluster token: give --auth-token-file or SLUICE_AUTH_TOKEN_FILE",
                 c->peer_addr);
        refuse_auth(c, err);
        return;
    }
    if (has_token(c)) {
        uint8_t want[SL_AUTH_PROOF_LEN];
        sl_auth_proof(c->auth, true, c->hello_self, c->hello_peer, SL_HANDSHAKE_LEN, want);
        if (!sl_auth_proof_eq(want, proof)) {
            snprintf(err, sizeof err,
                     "%s did not prove it holds the cluster token: its token differs from the one in %s",
                     c->peer_addr, c->auth->token_from);
            refuse_auth(c, err);
            return;
        }
        uint8_t mine[SL_AUTH_PROOF_LEN];
        sl_auth_proof(c->auth, false, c->hello_self, c->hello_peer, SL_HANDSHAKE_LEN, mine);
        bufferevent_write(c->bev, mine, sizeof mine);
    }
    open_conn(c);
}

/* The acceptor has the connector's proof. */
static void on_proof(sl_conn_t *c, const uint8_t *proof)
{
    uint8_t want[SL_AUTH_PROOF_LEN];
    sl_auth_proof(c->auth, false, c->hello_peer, c->hello_self, SL_HANDSHAKE_LEN, want);
    if (!sl_auth_proof_eq(want, proof)) {
        char err[256];
        snprintf(err, sizeof err,
                 "authentication failed: the peer's proof does not match this %s's cluster token (another "
                 "token?)",
                 sl_role_name(c->self));
        refuse_auth(c, err);
        return;
    }
    open_conn(c);
}

/* Checks the start of the peer's hello as soon as it is in, so that a peer
 * of another version or role is told at once. @return true to go on */
static bool check_prefix(sl_conn_t *c, const uint8_t *hs)
{
    char err[256];
    sl_role_t role;
    if (c->outgoing && memcmp(hs, "HTTP/", 5) == 0) {
        snprintf(err, sizeof err, "handshake: %s answered in HTTP: that is an HTTP port, such as a sluice "
                 "daemon's admin port (--admin-port); give its protocol port (--port)", c->peer_addr);
        conn_fail(c, SL_EPROTO, err);
        return false;
    }
    int rc = sl_handshake_decode(hs, &role, err, sizeof err);
    if (rc < 0) {
        conn_fail(c, rc, err);
        return false;
    }
    if (c->outgoing && role != c->expect) {
        snprintf(err, sizeof err, "handshake: %s is a %s, expected a %s", c->peer_addr, sl_role_name(role),
                 sl_role_name(c->expect));
        conn_fail(c, SL_EPROTO, err);
        return false;
    }
    if (!c->outgoing && !(c->accept_roles & (1u << role))) {
        snprintf(err, sizeof err, "handshake: a %s does not serve %ss", sl_role_name(c->self), sl_role_name(role));
        conn_fail(c, SL_EPROTO, err);
        return false;
    }
    c->peer = role;
    c->prefix_checked = true;
    return true;
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    sl_conn_t *c = arg;
    (void)fd;
    (void)what;
    if (c->state == CONN_DRAINING) {
        /* The peer was quiet for LINGER_MS after our error frame. */
        c->depth++;
        conn_die(c, true, c->fail_code, c->fail_why);
        leave(c);
        return;
    }
    if (c->state >= CONN_OPEN)
        return;
    char why[256];
    if (c->outgoing && c->syn_ms) {
        int ms = c->syn_ms;
        c->syn_ms = 0;
        struct sockaddr_storage peer;
        socklen_t len = sizeof peer;
        if (getpeername(conn_fd(c), (struct sockaddr *)&peer, &len) == 0) {
            arm_ms(c->deadline, c->deadline_ms - ms); /* connected: the handshake's time goes on */
            return;
        }
        snprintf(why, sizeof why, "%s: no answer to the connect within %d ms (the network may be cut)",
                 c->peer_addr, ms);
        c->depth++;
        conn_die(c, true, -ETIMEDOUT, why);
        leave(c);
        return;
    }
    if (c->outgoing) {
        snprintf(why, sizeof why, "%s: connect and handshake timed out after %d ms", c->peer_addr, c->deadline_ms);
    } else {
        if (c->env)
            count(&c->env->expired_handshakes, c->env->m_expired_handshakes);
        snprintf(why, sizeof why, "%s: no whole handshake within %d ms", c->peer_addr, c->deadline_ms);
    }
    c->depth++;
    conn_die(c, true, -ETIMEDOUT, why);
    leave(c);
}

/* Closes an accepted connection on which nothing moved for env->idle_ms
 * while it owed the peer nothing. */
static void on_idle(evutil_socket_t fd, short what, void *arg)
{
    sl_conn_t *c = arg;
    (void)fd;
    (void)what;
    if (c->state != CONN_OPEN)
        return;
    int64_t quiet = loop_ms(c) - c->last_active_ms;
    int idle_ms = c->env->idle_ms;
    if (c->owed > 0 || quiet < idle_ms) {
        arm_ms(c->idle, c->owed > 0 ? idle_ms : (int)(idle_ms - quiet));
        return;
    }
    count(&c->env->closed_idle, c->env->m_closed_idle);
    c->depth++;
    char why[256];
    snprintf(why, sizeof why, "closed after %d ms without a frame either way (the %s's --idle-timeout-ms)", idle_ms,
             sl_role_name(c->self));
    conn_fail(c, -ETIMEDOUT, why);
    leave(c);
}

/* A message of type to decode into: the spare if it is of that type. */
static void *msg_new(sl_conn_t *c, unsigned type)
{
    if (c->spare_msg && c->spare_type == type) {
        void *m = c->spare_msg;
        c->spare_msg = NULL;
        return m;
    }
    return sl_msg_new(type);
}

/* Done with msg, of type: kept as the spare if it is a GET_ELEMENT one
 * (every batch has two; sl_msg_decode() sets every field of them, as
 * pb_decode() would), else freed. */
static void msg_done(sl_conn_t *c, unsigned type, void *msg)
{
    if (!c->spare_msg && (type == SL_MSG_GET_ELEMENT_REQ || type == SL_MSG_GET_ELEMENT_RESP)) {
        c->spare_msg = msg;
        c->spare_type = type;
    } else {
        free(msg);
    }
}

/* Hands a whole frame over (owning msg and payload). @return true to go on */
static bool deliver(sl_conn_t *c, const sl_frame_hdr_t *hdr, void *msg, uint8_t *payload)
{
    if (hdr->type == SL_MSG_ERROR && hdr->request_id == 0) {
        /* The peer gives up on the connection and says why. */
        const sluice_Error *e = msg;
        char why[1100];
        snprintf(why, sizeof why, "%s closed the connection: %s", c->peer_addr, e->message);
        int code = e->code < 0 ? e->code : SL_EREMOTE;
        free(msg);
        free(payload);
        conn_die(c, true, code, why);
        return false;
    }
    c->last_active_ms = loop_ms(c);
    if (!c->outgoing && hdr->request_id != 0)
        c->owed++;
    c->cbs.on_frame(c, hdr, msg, payload, c->arg);
    msg_done(c, hdr->type, msg);
    return true;
}

/* sl_tls_read() into buf; a failure ends the connection with the peer's
 * address, the reason and `where` (" in the middle of a frame").
 * @return the bytes read, 0 to wait for the socket, -1 when it died */
static long conn_tls_read(sl_conn_t *c, void *buf, size_t len, const char *where)
{
    char why[256], full[480];
    long r = sl_tls_read(tls_of(c), buf, len, why, sizeof why);
    if (r >= 0)
        return r;
    snprintf(full, sizeof full, "%s %s%s", c->peer_addr, why, where);
    conn_die(c, true, (int)r, full);
    return -1;
}

/* Moves the part-read frame's payload on, its buffer allocated first: what
 * libevent already read into the input, then straight from the socket into
 * the payload's buffer (libevent reads at most 4096 bytes per call, an epoll_wait and two system
 * calls each: a 1 MiB batch would take 256 turns of the loop). It reads no
 * further than the frame's end, so the next frame stays for libevent.
 * @return true once the frame was delivered and the input may hold more */
/* A recv() mid-frame that returned r <= 0 (not EINTR, EAGAIN): the
 * connection ends, saying the peer closed it or why the read failed. */
static void recv_failed(sl_conn_t *c, ssize_t r)
{
    char why[256];
    int err = r == 0 ? SL_ECLOSED : -errno;
    snprintf(why, sizeof why, "%s %s in the middle of a frame", c->peer_addr,
             r == 0 ? "closed the connection" : strerror(errno));
    conn_die(c, true, err, why);
}

static bool read_payload(sl_conn_t *c, struct evbuffer *in)
{
    if (!c->rx_payload) {
        /* The payload's buffer, within c->limits (checked on the header).
         * On a connection we opened (to a dispatcher, or a worker the
         * dispatcher named) it is allocated at once (and, RX_DIRECT or
         * larger, read into straight from the socket); on one a peer opened
         * to us, only once the peer
         * sent all of it, so that a peer cannot make us hold more than it
         * sent. */
        if (!c->outgoing && evbuffer_get_length(in) < c->rx_hdr.payload_len)
            return false; /* read_cb runs on every read: count_partial() sees what it holds */
        c->rx_payload = sl__big_alloc(c->rx_hdr.payload_len); /* a batch: huge pages, far fewer faults */
        if (!c->rx_payload) {
            conn_fail(c, -ENOMEM, "out of memory for a frame payload");
            return false;
        }
        c->rx_have = 0;
    }
    size_t need = c->rx_hdr.payload_len - c->rx_have;
    size_t from_in = evbuffer_get_length(in);
    if (from_in > need)
        from_in = need;
    if (from_in > 0) {
        evbuffer_remove(in, c->rx_payload + c->rx_have, from_in);
        c->rx_have += from_in;
        need -= from_in;
    }
    /* Under TLS, decrypted straight into the payload (tlsio.h). */
    while (c->tls && need > 0) {
        long r = conn_tls_read(c, c->rx_payload + c->rx_have, need, " in the middle of a frame");
        if (r <= 0)
            return false; /* the rest comes with the next read event, or the connection died */
        c->rx_have += (size_t)r;
        need -= (size_t)r;
    }
    if (need > 0 && c->rx_hdr.payload_len < RX_DIRECT)
        return false; /* read_cb() reads it into the input, with what follows it (rx_fill()) */
    int fd = conn_fd(c);
    while (need > 0) {
        ssize_t r = recv(fd, c->rx_payload + c->rx_have, need, MSG_DONTWAIT);
        if (r > 0) {
            c->rx_have += (size_t)r;
            need -= (size_t)r;
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return false; /* the rest comes with the next read event */
        recv_failed(c, r);
        return false;
    }
    sl_frame_hdr_t hdr = c->rx_hdr;
    void *msg = c->rx_msg;
    uint8_t *payload = c->rx_payload;
    c->rx_msg = NULL;
    c->rx_payload = NULL;
    c->rx_have = 0;
    return deliver(c, &hdr, msg, payload);
}

/* Takes one frame off the input if a whole one is there; a frame whose
 * header and message are in goes on with read_payload(). @return true to go on */
static bool read_frame(sl_conn_t *c, struct evbuffer *in)
{
    if (c->rx_msg)
        return read_payload(c, in);
    size_t avail = evbuffer_get_length(in);
    if (avail < SL_FRAME_HEADER_LEN)
        return false;
    uint8_t h[SL_FRAME_HEADER_LEN];
    evbuffer_copyout(in, h, sizeof h);
    sl_frame_hdr_t hdr;
    char err[256];
    int rc = sl_frame_hdr_decode(h, &c->limits, &hdr, err, sizeof err);
    if (rc < 0) {
        conn_fail(c, rc, err);
        return false;
    }
    if (c->state == CONN_OPEN && !sl_msg_allowed(c->peer, hdr.type)) {
        snprintf(err, sizeof err, "a %s may not send %s", sl_role_name(c->peer), sl_msg_name(hdr.type));
        conn_fail(c, SL_EPROTO, err);
        return false;
    }
    size_t head = SL_FRAME_HEADER_LEN + (size_t)hdr.msg_len;
    if (avail < head) {
        /* Wake us only when the whole message is in; an accepted peer's
         * reads wake us each, for count_partial(). */
        if (c->outgoing && !c->tls)
            bufferevent_setwatermark(c->bev, EV_READ, head, 0);
        return false;
    }
    if (c->outgoing)
        bufferevent_setwatermark(c->bev, EV_READ, 0, 0);
    void *msg = msg_new(c, hdr.type);
    if (!msg) {
        conn_fail(c, -ENOMEM, "out of memory decoding a frame");
        return false;
    }
    const uint8_t *m = evbuffer_pullup(in, (ssize_t)head);
    rc = sl_msg_decode(hdr.type, m + SL_FRAME_HEADER_LEN, hdr.msg_len, msg, err, sizeof err);
    if (rc < 0) {
        free(msg);
        conn_fail(c, rc, err);
        return false;
    }
    evbuffer_drain(in, head);
    if (hdr.payload_len == 0)
        return deliver(c, &hdr, msg, NULL);
    c->rx_hdr = hdr;
    c->rx_msg = msg;
    return read_payload(c, in);
}

/* Accepted connections: what the input holds counts against the env's
 * bound on unfinished frames; the connection that crosses it is refused. */
static void count_partial(sl_conn_t *c, struct evbuffer *in)
{
    sl_conn_env_t *env = c->env;
    size_t now = c->state == CONN_DEAD ? 0 : evbuffer_get_length(in);
    if (c->rx_msg && c->rx_payload)
        now += c->rx_have;
    env->partial_bytes = env->partial_bytes - c->partial + now;
    c->partial = now;
    if (now > c->partial_peak)
        c->partial_peak = now;
    publish(env);
    if (env->max_partial_bytes && env->partial_bytes > env->max_partial_bytes && c->state < CONN_DRAINING &&
        now > 0) {
        count(&env->refused_partial, env->m_refused_partial);
        char why[256];
        snprintf(why, sizeof why,
                 "this %s holds %zu bytes of unfinished frames from its peers, over its limit of %zu "
                 "(--max-partial-frame-mb): this connection's %zu are dropped",
                 sl_role_name(c->self), env->partial_bytes, env->max_partial_bytes, now);
        conn_fail(c, SL_ELIMIT, why);
        /* What the input held is no longer held. */
        evbuffer_drain(in, evbuffer_get_length(in));
        env->partial_bytes -= c->partial;
        c->partial = 0;
        publish(env);
    }
}

/* One step of reading: a hello, a proof or a frame off the input.
 * @return true to take another */
static bool read_step(sl_conn_t *c, struct evbuffer *in)
{
    if (c->state == CONN_DRAINING) {
        /* Nothing it sends now is read; see drained(). */
        evbuffer_drain(in, evbuffer_get_length(in));
        if (c->lingering)
            arm_ms(c->deadline, LINGER_MS);
        return false;
    }
    if (c->state == CONN_HANDSHAKE) {
        uint8_t first[2];
        /* A peer that refuses our handshake answers with an error frame
         * (type 1) instead of its own: read it for the reason. */
        if (c->outgoing && evbuffer_copyout(in, first, 2) == 2 && first[0] == 0 && first[1] == SL_MSG_ERROR)
            return read_frame(c, in);
        size_t have = evbuffer_get_length(in);
        if (!c->prefix_checked) {
            if (have < SL_HANDSHAKE_PREFIX_LEN)
                return false;
            uint8_t prefix[SL_HANDSHAKE_PREFIX_LEN];
            evbuffer_copyout(in, prefix, sizeof prefix);
            if (!check_prefix(c, prefix))
                return false;
        }
        if (have < SL_HANDSHAKE_LEN)
            return false;
        size_t need = SL_HANDSHAKE_LEN;
        if (c->outgoing) {
            evbuffer_copyout(in, c->hello_peer, SL_HANDSHAKE_LEN);
            if (sl_handshake_flags(c->hello_peer) & SL_HELLO_TOKEN)
                need += SL_AUTH_PROOF_LEN;
        }
        if (have < need)
            return false;
        uint8_t proof[SL_AUTH_PROOF_LEN] = {0};
        evbuffer_remove(in, c->hello_peer, SL_HANDSHAKE_LEN);
        if (need > SL_HANDSHAKE_LEN)
            evbuffer_remove(in, proof, sizeof proof);
        on_hello(c, proof);
        return true;
    } else if (c->state == CONN_PROOF) {
        if (evbuffer_get_length(in) < SL_AUTH_PROOF_LEN)
            return false;
        uint8_t proof[SL_AUTH_PROOF_LEN];
        evbuffer_remove(in, proof, sizeof proof);
        on_proof(c, proof);
        return true;
    }
    return c->state == CONN_OPEN && read_frame(c, in);
}

/* Under TLS with read-ahead: moves what OpenSSL holds into the input (a
 * record at a time), since the socket will not signal it again.
 * @return the bytes moved, 0 when there were none, -1 when the connection died */
static long tls_pump(sl_conn_t *c, struct evbuffer *in)
{
    if (!sl_tls_has_pending(tls_of(c)))
        return 0;
    struct evbuffer_iovec v;
    if (evbuffer_reserve_space(in, 16384, &v, 1) < 1) {
        conn_die(c, true, -ENOMEM, "out of memory reading a TLS record");
        return -1;
    }
    long r = conn_tls_read(c, v.iov_base, v.iov_len, "");
    if (r > 0) {
        v.iov_len = (size_t)r;
        evbuffer_commit_space(in, &v, 1);
    }
    return r;
}

/* Plaintext: reads what the socket holds, up to RX_CHUNK, into the input
 * in one call. The socket bufferevent keeps its input's end frozen but
 * while it reads itself; so does this. @return the bytes read, 0 when it
 * held none, -1 when the connection died */
static long rx_fill(sl_conn_t *c, struct evbuffer *in)
{
    struct evbuffer_iovec v;
    evbuffer_unfreeze(in, 0);
    if (evbuffer_reserve_space(in, RX_CHUNK, &v, 1) < 1) {
        evbuffer_freeze(in, 0);
        conn_die(c, true, -ENOMEM, "out of memory reading a frame");
        return -1;
    }
    if (v.iov_len > RX_CHUNK)
        v.iov_len = RX_CHUNK;
    ssize_t r;
    do
        r = recv(conn_fd(c), v.iov_base, v.iov_len, MSG_DONTWAIT);
    while (r < 0 && errno == EINTR);
    int err = errno;
    if (r > 0) {
        v.iov_len = (size_t)r;
        evbuffer_commit_space(in, &v, 1);
    }
    evbuffer_freeze(in, 0);
    if (r > 0)
        return r;
    errno = err;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 0;
    recv_failed(c, r);
    return -1;
}

/* A frame of ours is waiting for the rest of a small payload, which
 * rx_fill() brings. */
static bool wants_fill(const sl_conn_t *c)
{
    return c->outgoing && !c->tls && c->state == CONN_OPEN && c->rx_msg && c->rx_payload &&
           c->rx_hdr.payload_len < RX_DIRECT;
}

static void read_cb(struct bufferevent *bev, void *arg)
{
    sl_conn_t *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    size_t pumped = 0, filled = 0;
    bool drained = false; /* a short read: the socket held no more then */
    c->depth++;
    for (;;) {
        if (read_step(c, in))
            continue;
        if (!c->tls) {
            if (drained || filled >= RX_BUDGET || !wants_fill(c))
                break;
            long n = rx_fill(c, in);
            if (n <= 0)
                break;
            filled += (size_t)n;
            drained = (size_t)n < RX_CHUNK;
            continue;
        }
        if (c->state >= CONN_DRAINING)
            break;
        if (pumped >= PUMP_BUDGET) {
            /* The rest on the loop's next turn, after other work. */
            if (sl_tls_has_pending(tls_of(c)))
                event_active(c->pump, EV_READ, 0);
            break;
        }
        long n = tls_pump(c, in);
        if (n <= 0)
            break;
        pumped += (size_t)n;
    }
    if (c->env && !c->outgoing)
        count_partial(c, in);
    leave(c);
}

static void on_pump(evutil_socket_t fd, short what, void *arg)
{
    sl_conn_t *c = arg;
    (void)fd;
    (void)what;
    read_cb(c->bev, c);
}

/* The output is written (libevent calls this when it is empty). Under
 * TLS the records it became may still be gathered (tlsio.h): they go now,
 * and what the socket does not take goes when it is writable (c->flush). */
static void write_cb(struct bufferevent *bev, void *arg)
{
    sl_conn_t *c = arg;
    (void)bev;
    c->depth++;
    bool out = true;
    if (c->tls && c->state != CONN_DEAD) {
        int rc = sl_tls_flush(tls_of(c));
        if (rc < 0) {
            char why[256];
            snprintf(why, sizeof why, "%s: %s", c->peer_addr, strerror(-rc));
            conn_die(c, true, rc, why);
            leave(c);
            return;
        }
        out = rc == 1;
        if (!out)
            event_add(c->flush, NULL);
    }
    if (out && c->state == CONN_DRAINING && !c->lingering &&
        evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
        drained(c);
    leave(c);
}

static void on_flush(evutil_socket_t fd, short what, void *arg)
{
    sl_conn_t *c = arg;
    (void)fd;
    (void)what;
    write_cb(c->bev, c);
}

static void event_cb(struct bufferevent *bev, short what, void *arg)
{
    sl_conn_t *c = arg;
    (void)bev;
    if (what & BEV_EVENT_CONNECTED) {
        /* What OpenSSL read ahead with the end of the TLS handshake (the
         * peer's hello) is not signalled by the socket again. */
        if (c->tls && c->state < CONN_DRAINING && SSL_is_init_finished(tls_of(c)) == 1 &&
            sl_tls_has_pending(tls_of(c)))
            event_active(c->pump, EV_READ, 0);
        /* A TLS connection reports the TCP connect and the TLS handshake
         * both, and an accepted one its TLS handshake: the connector's
         * hello goes once, after the last. */
        if (!c->outgoing || c->hello_sent ||
            (c->tls && SSL_is_init_finished(bufferevent_openssl_get_ssl(c->bev)) != 1))
            return;
        c->hello_sent = true;
        int rc = make_hello(c);
        if (rc < 0) {
            c->depth++;
            conn_die(c, true, rc, "no random bytes for the handshake's nonce");
            leave(c);
            return;
        }
        bufferevent_write(c->bev, c->hello_self, sizeof c->hello_self);
        return;
    }
    char why[512];
    int err;
    unsigned long ssl_err = c->tls ? bufferevent_get_openssl_error(c->bev) : 0;
    if (c->state == CONN_DRAINING) {
        err = c->fail_code;
        snprintf(why, sizeof why, "%s", c->fail_why);
    } else if (ssl_err) {
        char reason[256];
        ERR_error_string_n(ssl_err, reason, sizeof reason);
        while (bufferevent_get_openssl_error(c->bev))
            ;
        err = SL_EAUTH;
        if (c->env && !c->outgoing)
            count(&c->env->refused_auth, c->env->m_refused_auth);
        snprintf(why, sizeof why, "TLS with %s failed: %s", c->peer_addr, reason);
    } else if (what & BEV_EVENT_TIMEOUT) {
        err = -ETIMEDOUT;
        snprintf(why, sizeof why, "%s: %s timed out", c->peer_addr,
                 c->state == CONN_HANDSHAKE ? "connect and handshake" : "i/o");
    } else if (what & BEV_EVENT_EOF) {
        err = SL_ECLOSED;
        snprintf(why, sizeof why, "%s closed the connection%s", c->peer_addr,
                 c->state == CONN_HANDSHAKE ? " during the handshake" : "");
    } else {
        int e = EVUTIL_SOCKET_ERROR();
        err = e ? -e : SL_ECLOSED;
        snprintf(why, sizeof why, "%s: %s", c->peer_addr, e ? strerror(e) : "connection error");
    }
    c->depth++;
    conn_die(c, true, err, why);
    leave(c);
}

static sl_conn_t *conn_new(struct event_base *base, int fd, const sl_conn_env_t *env, bool outgoing, sl_role_t self,
                           const sl_limits_t *limits, const sl_conn_cbs_t *cbs, void *arg)
{
    sl_conn_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->outgoing = outgoing;
    c->auth = env && env->auth && env->auth->token_len > 0 ? env->auth : NULL;
    struct ssl_ctx_st *tls = env && env->auth ? (outgoing ? env->auth->tls_connect : env->auth->tls_accept) : NULL;
    if (tls) {
        /* libevent's bufferevent_openssl on the socket. (As a filter over a
         * socket bufferevent it measured half as fast in bench/tls_stream.py.) */
        SSL *ssl = SSL_new(tls);
        if (ssl)
            c->bev = bufferevent_openssl_socket_new(
                base, fd, ssl, outgoing ? BUFFEREVENT_SSL_CONNECTING : BUFFEREVENT_SSL_ACCEPTING,
                BEV_OPT_CLOSE_ON_FREE);
        c->tls = true;
        if (c->bev)
            /* A peer that closes without close_notify ends the stream like EOF. */
            bufferevent_openssl_set_allow_dirty_shutdown(c->bev, 1);
        else if (ssl)
            SSL_free(ssl);
    } else {
        c->bev = bufferevent_socket_new(base, fd, BEV_OPT_CLOSE_ON_FREE);
    }
    /* An accepted socket's records gather now; a connector's once it has
     * its socket (sl_conn_connect()). */
    bool ok = c->bev && (!c->tls || ((c->pump = event_new(base, -1, 0, on_pump, c)) &&
                                     (fd < 0 || tls_socket_ready(c, base))));
    if (!ok || !(c->deadline = evtimer_new(base, on_deadline, c))) {
        if (c->pump)
            event_free(c->pump);
        if (c->flush)
            event_free(c->flush);
        if (c->bev)
            bufferevent_free(c->bev);
        else if (fd >= 0)
            close(fd);
        free(c);
        return NULL;
    }
    c->self = self;
    c->limits = *limits;
    c->cbs = *cbs;
    c->arg = arg;
    /* libevent moves at most 16 KiB per read or write call by default:
     * far too little for MiB-sized batches. */
    bufferevent_set_max_single_read(c->bev, 1 << 20);
    bufferevent_set_max_single_write(c->bev, 1 << 20);
    bufferevent_setcb(c->bev, read_cb, write_cb, event_cb, c);
    return c;
}

static void peer_name(int fd, char *out, size_t len, bool *loopback)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char host[INET6_ADDRSTRLEN] = "?";
    uint16_t port = 0;
    *loopback = false;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET) {
            const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
            inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
            port = ntohs(a->sin_port);
            *loopback = (ntohl(a->sin_addr.s_addr) >> 24) == 127;
        } else if (ss.ss_family == AF_INET6) {
            const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
            inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
            port = ntohs(a->sin6_port);
            *loopback = IN6_IS_ADDR_LOOPBACK(&a->sin6_addr) ||
                        (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr) && a->sin6_addr.s6_addr[12] == 127);
        } else if (ss.ss_family == AF_UNIX) {
            *loopback = true;
        }
    }
    snprintf(out, len, "%s:%u", host, port);
}

/* Frames go out as soon as they are written: a frame written in parts
 * (under TLS, a record each) must not wait for the peer's delayed ACK.
 * And a peer gone silent (a partition that neither heals nor resets, a
 * machine that vanished) ends the connection in about SL_CONN_DEAD_MS,
 * whether or not data waits on it: keepalive probes on an idle connection
 * (a trainer waiting for a batch), TCP_USER_TIMEOUT on unacknowledged data
 * (and, under it, on keepalive), set to match. The peers then connect again
 * and ask again for what was in flight (workerd/held.h). */
static void set_socket_options(int fd)
{
    int one = 1, idle = SL_CONN_KEEPIDLE_S, intvl = SL_CONN_KEEPINTVL_S, cnt = SL_CONN_KEEPCNT;
    unsigned user_timeout = SL_CONN_DEAD_MS;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout);
}

/* A refused socket half-closed after its error frame, read and dropped
 * until its peer is quiet (as drained() does for connections), so that the
 * close does not reset the connection before the peer reads why. */
struct linger_sock {
    struct event *ev;
    int fd;
    int rounds;
};

/* Refused sockets lingering at once; past it they close at once. */
#define MAX_LINGERING 256
static _Thread_local int lingering_socks;

static void linger_cb(evutil_socket_t fd, short what, void *arg)
{
    struct linger_sock *l = arg;
    char sink[4096];
    ssize_t r = (what & EV_READ) ? recv(fd, sink, sizeof sink, MSG_DONTWAIT) : 0;
    if (r > 0 && ++l->rounds < 256) {
        struct timeval tv = {0, LINGER_MS * 1000};
        event_add(l->ev, &tv);
        return;
    }
    event_free(l->ev);
    close(l->fd);
    free(l);
    lingering_socks--;
}

/* Refuses an accepted socket before any handshake: an error frame (a
 * connector reads one in place of a hello), then close. */
static void refuse_socket(struct event_base *base, int fd, int code, const char *why)
{
    sluice_Error e = sluice_Error_init_zero;
    e.code = code;
    snprintf(e.message, sizeof e.message, "%s", why);
    uint8_t buf[SL_FRAME_HEADER_LEN + 1100];
    size_t len;
    if (sl_frame_encode(SL_MSG_ERROR, 0, &e, 0, buf, sizeof buf, &len) == 0) {
        ssize_t w;
        do
            w = send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        while (w < 0 && errno == EINTR);
    }
    struct linger_sock *l = lingering_socks < MAX_LINGERING ? calloc(1, sizeof *l) : NULL;
    if (l && (l->ev = event_new(base, fd, EV_READ, linger_cb, l))) {
        shutdown(fd, SHUT_WR);
        l->fd = fd;
        lingering_socks++;
        struct timeval tv = {0, LINGER_MS * 1000};
        event_add(l->ev, &tv);
        return;
    }
    free(l);
    close(fd);
}

sl_conn_t *sl_conn_accept(struct event_base *base, int fd, sl_conn_env_t *env, sl_role_t self, unsigned accept_roles,
                          const sl_limits_t *limits, const sl_conn_cbs_t *cbs, void *arg)
{
    evutil_make_socket_nonblocking(fd);
    set_socket_options(fd);
    char peer[80];
    bool loopback;
    peer_name(fd, peer, sizeof peer, &loopback);
    if (env && env->loopback_only && !loopback) {
        count(&env->refused_remote, env->m_refused_remote);
        char why[512];
        snprintf(why, sizeof why,
                 "this %s is in protected mode: it runs without --auth-token-file and TLS, so it serves peers on "
                 "loopback only; start it with a token (or TLS), or with --insecure to serve %s",
                 sl_role_name(self), peer);
        sl_log_warn("refused %s: protected mode (no --auth-token-file, no TLS, no --insecure)", peer);
        refuse_socket(base, fd, SL_EAUTH, why);
        return NULL;
    }
    if (env && env->max_conns && env->conns >= env->max_conns) {
        count(&env->refused_conns, env->m_refused_conns);
        char why[256];
        snprintf(why, sizeof why, "this %s has %u connections open, its limit (--max-connections): try again later",
                 sl_role_name(self), env->conns);
        refuse_socket(base, fd, SL_ELIMIT, why);
        return NULL;
    }
    sl_conn_t *c = conn_new(base, fd, env, false, self, limits, cbs, arg);
    if (!c)
        return NULL;
    c->accept_roles = accept_roles;
    snprintf(c->peer_addr, sizeof c->peer_addr, "%s", peer);
    if (env) {
        c->env = env;
        env->conns++;
        c->counted = true;
        publish(env);
        if (env->idle_ms > 0 && !(c->idle = evtimer_new(base, on_idle, c))) {
            conn_free(c);
            return NULL;
        }
    }
    c->deadline_ms = env && env->handshake_ms > 0 ? env->handshake_ms : HANDSHAKE_TIMEOUT_MS;
    arm_ms(c->deadline, c->deadline_ms);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    return c;
}

int sl_conn_connect(struct event_base *base, const char *address, const sl_conn_env_t *env, sl_role_t self,
                    sl_role_t expect, const sl_limits_t *limits, int timeout_ms, const sl_conn_cbs_t *cbs,
                    void *arg, sl_conn_t **out, char *err, size_t errlen)
{
    struct sockaddr_storage ss;
    socklen_t sslen;
    int rc = sl_addr_resolve(address, &ss, &sslen, err, errlen);
    if (rc < 0)
        return rc;
    return sl_conn_connect_to(base, address, &ss, sslen, env, self, expect, limits, timeout_ms, cbs, arg, out, err,
                              errlen);
}

int sl_conn_connect_to(struct event_base *base, const char *address, const struct sockaddr_storage *addr,
                       socklen_t addrlen, const sl_conn_env_t *env, sl_role_t self, sl_role_t expect,
                       const sl_limits_t *limits, int timeout_ms, const sl_conn_cbs_t *cbs, void *arg,
                       sl_conn_t **out, char *err, size_t errlen)
{
    struct sockaddr_storage ss = *addr;
    socklen_t sslen = addrlen;
    sl_conn_t *c = conn_new(base, -1, env, true, self, limits, cbs, arg);
    if (!c) {
        snprintf(err, errlen, "out of memory connecting to %s", address);
        return -ENOMEM;
    }
    c->expect = expect;
    snprintf(c->peer_addr, sizeof c->peer_addr, "%s", address);
    c->deadline_ms = timeout_ms > 0 ? timeout_ms : HANDSHAKE_TIMEOUT_MS;
    arm_ms(c->deadline, c->deadline_ms);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    if (bufferevent_socket_connect(c->bev, (struct sockaddr *)&ss, (int)sslen) < 0) {
        int e = EVUTIL_SOCKET_ERROR();
        snprintf(err, errlen, "cannot connect to %s: %s", address, strerror(e ? e : ECONNREFUSED));
        conn_free(c);
        return e ? -e : -ECONNREFUSED;
    }
    if (c->tls && !tls_socket_ready(c, base)) {
        snprintf(err, errlen, "out of memory connecting to %s", address);
        conn_free(c);
        return -ENOMEM;
    }
    set_socket_options(conn_fd(c));
    /* A non-blocking connect fails later through event_cb. */
    *out = c;
    return 0;
}

void sl_conn_cap_connect(sl_conn_t *c, int ms)
{
    if (!c->outgoing || c->state != CONN_HANDSHAKE || c->hello_sent || ms <= 0 || ms >= c->deadline_ms)
        return;
    c->syn_ms = ms;
    arm_ms(c->deadline, ms);
}

/* One part of a frame to send: copied when queued (copy) or referenced. */
typedef sl_gather_part_t part_t;

/* The parts of a frame at most: header, payload, pad and two tails. */
#define MAX_PARTS SL_GATHER_PARTS

/* The release of a frame queued in part: free_fn gets the payload and
 * length it was given, whatever part of the frame is the last to go. */
struct release {
    sl_conn_free_fn free_fn;
    const void *payload;
    size_t payload_len;
    void *extra;
};

static void run_release(const void *data, size_t len, void *arg)
{
    struct release *r = arg;
    (void)data;
    (void)len;
    r->free_fn(r->payload, r->payload_len, r->extra);
    free(r);
}

static void no_free(const void *data, size_t len, void *extra)
{
    (void)data;
    (void)len;
    (void)extra;
}

/* One non-blocking sendmsg() of n iovecs, without SIGPIPE. Errors are left
 * to the bufferevent, which meets them on its own next write.
 * @return the bytes written (0 on any error) */
static size_t send_iov(sl_conn_t *c, struct iovec *iov, int n)
{
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t w;
    do
        w = sendmsg(conn_fd(c), &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (w < 0 && errno == EINTR);
    return w > 0 ? (size_t)w : 0;
}

/* Writes what it can of the parts straight to the socket: when nothing is
 * queued before them, a frame costs one system call rather than a trip
 * through the loop (enable the write event, wait for it, write, disable
 * it). @return the bytes written */
static size_t write_now(sl_conn_t *c, const part_t *parts, int n)
{
    struct iovec iov[MAX_PARTS];
    int k = 0;
    for (int i = 0; i < n; i++)
        if (parts[i].n > 0)
            iov[k++] = (struct iovec){.iov_base = (void *)parts[i].p, .iov_len = parts[i].n};
    return send_iov(c, iov, k);
}

/* Queues a frame of n parts, of which the first skip bytes were written,
 * to out (the output or the cork's buffer): all of the rest or, without
 * memory, none of it. free_fn(payload, payload_len, extra), if given, runs
 * once no part is needed any more, also on failure. */
static int queue_parts(sl_conn_t *c, struct evbuffer *out, const part_t *parts, int n, size_t skip,
                       sl_conn_free_fn free_fn, const void *payload, size_t payload_len, void *extra)
{
    size_t written = skip;
    int last = n - 1;
    while (last > 0 && parts[last].n == 0)
        last--;
    /* The release rides on the last part if it is referenced; when it is
     * copied, nothing refers to the payload once the frame is queued. */
    bool ride = free_fn && !parts[last].copy;
    struct release *r = NULL;
    /* The frame is put together aside, and moved to out whole. The spare
     * is taken while in use: a release that runs meanwhile and queues a
     * frame on this connection gets a buffer of its own. */
    struct evbuffer *frame = c->spare_frame ? c->spare_frame : evbuffer_new();
    c->spare_frame = NULL;
    if (!frame || (ride && !(r = malloc(sizeof *r)))) {
        if (frame)
            evbuffer_free(frame);
        goto nomem;
    }
    if (r)
        *r = (struct release){.free_fn = free_fn, .payload = payload, .payload_len = payload_len, .extra = extra};
    for (int i = 0; i <= last; i++) {
        size_t from = skip < parts[i].n ? skip : parts[i].n;
        skip -= from;
        const uint8_t *p = (const uint8_t *)parts[i].p + from;
        size_t len = parts[i].n - from;
        int rc;
        if (i == last && r)
            rc = evbuffer_add_reference(frame, p, len, run_release, r);
        else if (len == 0)
            rc = 0;
        else if (parts[i].copy)
            rc = evbuffer_add(frame, p, len);
        else
            rc = evbuffer_add_reference(frame, p, len, no_free, NULL);
        if (rc < 0) {
            /* The release is not in the frame: it runs below. */
            evbuffer_free(frame);
            free(r);
            goto nomem;
        }
    }
    /* The parts keep their order when moved; the release rides on the
     * last, and runs when it is written or dropped. */
    int rc = evbuffer_add_buffer(out, frame) < 0 ? -ENOMEM : 0;
    if (rc == 0 && !c->spare_frame && evbuffer_get_length(frame) == 0)
        c->spare_frame = frame;
    else
        evbuffer_free(frame);
    if (free_fn && !ride)
        free_fn(payload, payload_len, extra);
    return rc;
nomem:
    /* Part of the frame may have gone out: the stream cannot go on. The
     * bufferevent meets the shut-down socket on its next turn and closes. */
    if (written > 0)
        shutdown(conn_fd(c), SHUT_RDWR);
    if (free_fn)
        free_fn(payload, payload_len, extra);
    return -ENOMEM;
}

/* ---- gathering (sl_conn_set_gather(), gather.h) ---- */

/* A gathered frame the socket did not take whole goes to the output, from
 * where the write stopped; on a connection that died, it is let go. */
static void gather_rest(void *arg, const part_t *parts, int n, size_t skip, const sl_gather_release_t *r)
{
    sl_conn_t *c = arg;
    if (c->state == CONN_DEAD) {
        if (r->fn)
            r->fn(r->payload, r->payload_len, r->extra);
        return;
    }
    queue_parts(c, bufferevent_get_output(c->bev), parts, n, skip, r->fn, r->payload, r->payload_len, r->extra);
}

/* Writes the gathered frames in one sendmsg() when nothing is queued
 * before them, and queues what the socket did not take behind what is.
 * Every other way into the output flushes first, so the order holds. */
static void gather_flush(sl_conn_t *c)
{
    if (!c->gather || sl_gather_frames(c->gather) == 0)
        return;
    size_t w = 0;
    if (c->state == CONN_OPEN && evbuffer_get_length(bufferevent_get_output(c->bev)) == 0) {
        const struct iovec *iov;
        int n = sl_gather_iov(c->gather, &iov);
        w = send_iov(c, (struct iovec *)iov, n);
    }
    sl_gather_drain(c->gather, w, gather_rest, c);
}

/* The end of the loop's pass in which the first frame was gathered. */
static void on_gather(evutil_socket_t fd, short what, void *arg)
{
    sl_conn_t *c = arg;
    (void)fd;
    (void)what;
    c->pass_open = false;
    c->depth++;
    gather_flush(c);
    leave(c);
}

/* Gathers a frame to be written at the end of the loop's pass, writing
 * what is gathered first when it has no room for it; the first frame of a
 * pass is not gathered (it opens the pass).
 * @return 0, 1 when the frame is not gathered (send it as without a
 *         gather, behind whatever the output holds), SL_ECLOSED when a
 *         release run meanwhile closed the connection (free_fn has run) */
static int gather_frame(sl_conn_t *c, const part_t *parts, int n, sl_conn_free_fn free_fn, const void *payload,
                        size_t payload_len, void *extra)
{
    if (!c->gather) {
        c->gather = sl_gather_new();
        c->gather_ev = c->gather ? event_new(bufferevent_get_base(c->bev), -1, 0, on_gather, c) : NULL;
        if (!c->gather_ev) {
            sl_gather_free(c->gather);
            c->gather = NULL;
            return 1;
        }
    }
    if (!c->pass_open) {
        /* The pass's first frame goes at once: the peer starts on it while
         * the pass makes the rest. */
        c->pass_open = true;
        event_active(c->gather_ev, EV_WRITE, 0);
        return 1;
    }
    sl_gather_release_t r = {free_fn, payload, payload_len, extra};
    if (sl_gather_add(c->gather, parts, n, &r) == 0) {
        if (sl_gather_frames(c->gather) == 1)
            event_active(c->gather_ev, EV_WRITE, 0);
        return 0;
    }
    if (sl_gather_frames(c->gather) == 0)
        return 1; /* more than a gather holds: on its own */
    /* Full: what it holds goes now. Its releases may close the connection. */
    c->depth++;
    gather_flush(c);
    bool dead = c->state == CONN_DEAD;
    leave(c);
    if (dead) {
        if (free_fn)
            free_fn(payload, payload_len, extra);
        return SL_ECLOSED;
    }
    return gather_frame(c, parts, n, free_fn, payload, payload_len, extra);
}

/* Sends a frame of n (<= MAX_PARTS) parts, the first its header: gathered
 * when the connection gathers; else straight to the socket when the
 * connection is open, not corked and has nothing queued, and what that did
 * not take (all of it otherwise) to the output, or to the cork's buffer.
 * The output gets the rest of the frame or nothing of it.
 * free_fn(payload, payload_len, extra), if given, runs once no part is
 * needed any more, also on failure. */
static int send_parts(sl_conn_t *c, const part_t *parts, int n, sl_conn_free_fn free_fn, const void *payload,
                      size_t payload_len, void *extra)
{
    struct evbuffer *output = bufferevent_get_output(c->bev);
    /* Error frames of a failing connection are not held: it closes once
     * its output is written. */
    struct evbuffer *out = c->held && c->state == CONN_OPEN ? c->held : output;
    bool direct = out == output && c->state == CONN_OPEN && !c->tls && evbuffer_get_length(output) == 0;
    if (direct && c->gathers) {
        int rc = gather_frame(c, parts, n, free_fn, payload, payload_len, extra);
        if (rc <= 0)
            return rc;
        /* Not gathered: a flush to make room may have left part of what it
         * held in the output, and this frame goes behind that. */
        direct = evbuffer_get_length(output) == 0;
    } else if (out == output) {
        /* Frames gathered before this one go before it. */
        gather_flush(c);
        direct = direct && evbuffer_get_length(output) == 0;
    }
    size_t skip = 0;
    if (direct) {
        skip = write_now(c, parts, n);
        size_t total = 0;
        for (int i = 0; i < n; i++)
            total += parts[i].n;
        if (skip == total) {
            if (free_fn)
                free_fn(payload, payload_len, extra);
            return 0;
        }
    }
    return queue_parts(c, out, parts, n, skip, free_fn, payload, payload_len, extra);
}

/* A frame goes out: on an accepted connection, one with a request id
 * answers one of the peer's requests. */
static void answered(sl_conn_t *c, uint32_t request_id)
{
    if (c->outgoing)
        return;
    if (request_id != 0 && c->owed > 0)
        c->owed--;
    if (c->idle)
        c->last_active_ms = loop_ms(c);
}

/* Where a frame's header and message are encoded before they are sent,
 * large enough for any message within the bounds of sluice.options: one for
 * sl_conn_send() and one for sl_conn_send_tail(), per thread that sends,
 * allocated at its first frame (malloc: only the pages frames reach are
 * touched) and freed when the thread ends. As _Thread_local arrays they were
 * in every thread of every process that links the protocol (a trainer's
 * thread pools, the iterator's address lookups), which zeroed their 256 KiB
 * at its creation, on a virtual machine 0.8 ms of page faults, and kept them
 * resident. */
#define ENCODE_LEN (SL_FRAME_HEADER_LEN + SL_MAX_MESSAGE_LEN)
enum { ENCODE_SEND, ENCODE_TAIL };
static pthread_key_t encode_key;
static pthread_once_t encode_once = PTHREAD_ONCE_INIT;
static bool encode_key_made;

static void encode_key_init(void)
{
    encode_key_made = pthread_key_create(&encode_key, free) == 0;
}

/* @return the calling thread's buffer which (ENCODE_LEN bytes), or NULL
 * when out of memory */
static uint8_t *encode_buf(int which)
{
    static _Thread_local uint8_t *bufs;
    if (!bufs) {
        pthread_once(&encode_once, encode_key_init);
        uint8_t *b = encode_key_made ? malloc(2 * ENCODE_LEN) : NULL;
        if (!b || pthread_setspecific(encode_key, b) != 0) {
            free(b);
            return NULL;
        }
        bufs = b;
    }
    return bufs + (size_t)which * ENCODE_LEN;
}

int sl_conn_send(sl_conn_t *c, unsigned type, uint32_t request_id, const void *msg, const void *payload,
                 size_t payload_len, sl_conn_free_fn free_fn, void *extra)
{
    uint8_t *buf = encode_buf(ENCODE_SEND);
    int rc = 0;
    if (!buf) {
        rc = -ENOMEM;
        goto fail;
    }
    if (c->state == CONN_DEAD || (c->state == CONN_DRAINING && type != SL_MSG_ERROR)) {
        rc = SL_ECLOSED;
        goto fail;
    }
    /* A frame queued before our handshake would reach the peer first. */
    if (c->state < CONN_OPEN && !(type == SL_MSG_ERROR && !c->outgoing)) {
        rc = -EAGAIN;
        goto fail;
    }
    answered(c, request_id);
    if (payload_len > UINT32_MAX) {
        rc = SL_ETOOBIG;
        goto fail;
    }
    size_t len;
    rc = sl_frame_encode(type, request_id, msg, (uint32_t)payload_len, buf, ENCODE_LEN, &len);
    if (rc < 0)
        goto fail;
    /* Without free_fn the payload is copied, if it is queued at all. */
    part_t parts[2] = {{buf, len, true}, {payload, payload_len, !free_fn}};
    return send_parts(c, parts, 2, free_fn, payload, payload_len, extra);
fail:
    if (free_fn)
        free_fn(payload, payload_len, extra);
    return rc;
}

int sl_conn_send_tail(sl_conn_t *c, unsigned type, uint32_t request_id, const void *msg, const void *payload,
                      size_t payload_len, size_t pad, const struct iovec *tail, int ntail, sl_conn_free_fn free_fn,
                      void *extra)
{
    static const uint8_t zeros[8];
    int rc = 0;
    size_t tail_len = 0;
    bool too_big = ntail < 0 || ntail > MAX_PARTS - 3;
    for (int i = 0; i < ntail && !too_big; i++) {
        too_big = tail[i].iov_len > UINT32_MAX - tail_len;
        tail_len += tail[i].iov_len;
    }
    if (!too_big && tail_len == 0)
        return sl_conn_send(c, type, request_id, msg, payload, payload_len, free_fn, extra);
    if (c->state == CONN_DEAD || c->state == CONN_DRAINING) {
        rc = SL_ECLOSED;
        goto fail;
    }
    if (c->state < CONN_OPEN) {
        rc = -EAGAIN;
        goto fail;
    }
    answered(c, request_id);
    if (too_big || pad >= sizeof zeros || payload_len > UINT32_MAX || tail_len > UINT32_MAX - payload_len - pad) {
        rc = SL_ETOOBIG;
        goto fail;
    }
    uint8_t *buf = encode_buf(ENCODE_TAIL);
    if (!buf) {
        rc = -ENOMEM;
        goto fail;
    }
    size_t len;
    rc = sl_frame_encode(type, request_id, msg, (uint32_t)(payload_len + pad + tail_len), buf, ENCODE_LEN, &len);
    if (rc < 0)
        goto fail;
    /* Nothing is copied but the header: payload and tails are referenced. */
    part_t parts[MAX_PARTS] = {{buf, len, true}, {payload, payload_len, false}, {zeros, pad, false}};
    for (int i = 0; i < ntail; i++)
        parts[3 + i] = (part_t){tail[i].iov_base, tail[i].iov_len, false};
    return send_parts(c, parts, 3 + ntail, free_fn, payload, payload_len, extra);
fail:
    if (free_fn)
        free_fn(payload, payload_len, extra);
    return rc;
}

int sl_conn_send_error(sl_conn_t *c, uint32_t request_id, int code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return send_error_frame(c, request_id, code, msg);
}

void sl_conn_fail(sl_conn_t *c, int code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->depth++;
    conn_fail(c, code, msg);
    leave(c);
}

void sl_conn_close(sl_conn_t *c)
{
    if (!c)
        return;
    c->depth++;
    conn_die(c, false, 0, NULL);
    leave(c);
}

int sl_conn_cork(sl_conn_t *c)
{
    /* What was gathered goes before what the cork holds. */
    gather_flush(c);
    if (!c->held) {
        c->held = c->spare_held ? c->spare_held : evbuffer_new();
        c->spare_held = NULL;
    }
    return c->held ? 0 : -ENOMEM;
}

/* Writes what it can of buf straight to the socket in one sendmsg() and
 * drains that from buf (write_now() for frames gathered in a buffer).
 * Errors are left to the bufferevent, as there. */
static void write_held_now(sl_conn_t *c, struct evbuffer *buf)
{
    struct iovec iov[64];
    struct evbuffer_iovec v[64];
    int n = evbuffer_peek(buf, -1, NULL, v, 64);
    if (n > 64)
        n = 64; /* the rest goes through the output */
    for (int i = 0; i < n; i++)
        iov[i] = (struct iovec){.iov_base = v[i].iov_base, .iov_len = v[i].iov_len};
    size_t w = send_iov(c, iov, n);
    if (w > 0)
        evbuffer_drain(buf, w);
}

void sl_conn_uncork(sl_conn_t *c)
{
    if (!c->held)
        return;
    struct evbuffer *held = c->held;
    c->held = NULL;
    if (c->state == CONN_OPEN && evbuffer_get_length(held) > 0) {
        struct evbuffer *output = bufferevent_get_output(c->bev);
        /* With nothing queued before them, the held frames go out in one
         * system call rather than a trip through the loop. */
        if (!c->tls && evbuffer_get_length(output) == 0)
            write_held_now(c, held);
        if (evbuffer_get_length(held) > 0)
            evbuffer_add_buffer(output, held);
    }
    if (!c->spare_held && evbuffer_get_length(held) == 0)
        c->spare_held = held;
    else
        evbuffer_free(held);
}

void sl_conn_set_gather(sl_conn_t *c, bool on)
{
    if (!on)
        gather_flush(c);
    c->gathers = on;
}

size_t sl_conn_pending(const sl_conn_t *c)
{
    size_t n = evbuffer_get_length(bufferevent_get_output(c->bev)) + (c->gather ? sl_gather_bytes(c->gather) : 0);
    return c->tls ? n + sl_tls_unflushed(tls_of(c)) : n;
}

sl_role_t sl_conn_peer_role(const sl_conn_t *c)
{
    return c->peer;
}

const char *sl_conn_peer(const sl_conn_t *c)
{
    return c->peer_addr;
}

void sl_conn_set_arg(sl_conn_t *c, void *arg)
{
    c->arg = arg;
}

int sl_conn_local_host(const sl_conn_t *c, char *host, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(conn_fd(c), (struct sockaddr *)&ss, &sl) < 0)
        return -errno;
    const void *a = ss.ss_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
                                             : (const void *)&((struct sockaddr_in *)&ss)->sin_addr;
    if (!inet_ntop(ss.ss_family, a, host, (socklen_t)len))
        return -errno;
    return 0;
}
