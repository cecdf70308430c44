/*
 * test_conn.c: connections (protocol/conn.c) and the blocking RPC helper
 * (protocol/rpc.c) over real loopback TCP sockets.
 *
 * The server side is a listener on 127.0.0.1 port 0 whose connections are
 * sl_conn_accept()ed as a dispatcher that serves clients. Its event loop
 * runs in the test's own thread, always for a bounded time (run_until());
 * the peer is a raw blocking socket with receive and send timeouts, which
 * writes into the kernel's buffers and reads what the server wrote once the
 * loop has run. The RPC tests run the server loop in a second thread,
 * because sl_rpc_* block.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/listener.h>

#include "conn.h"
#include "frame.h"
#include "gather.h"
#include "net.h"
#include "rpc.h"
#include "seed_util.h"

/* The nonce of the hellos this file writes by hand. */
static const uint8_t zero_nonce[SL_HELLO_NONCE_LEN];

#define MAX_PAYLOAD (1u << 20)
#define LOOP_MS 3000 /* the longest any step may take */

/* ---- the server ----------------------------------------------------------- */

struct server {
    struct event_base *base;
    struct evconnlistener *lis;
    uint16_t port;
    sl_limits_t limits;
    unsigned accept_roles;
    sl_conn_t *conn; /* the last accepted connection, NULL once closed */
    int accepted;
    int ready;
    /* on_close */
    int closed;
    int close_err;
    char close_why[1200];
    /* on_frame */
    int frames;
    sl_frame_hdr_t hdr[8];
    uint8_t *payload[8];
    sluice_GetSplitRequest req[8]; /* for GET_SPLIT_REQ frames */
    sluice_GetElementRequest ereq[8]; /* for GET_ELEMENT_REQ frames */
    bool answer;                   /* answer GET_SPLIT_REQ */
};

static struct server S;

static void srv_on_frame(sl_conn_t *c, const sl_frame_hdr_t *hdr, void *msg, uint8_t *payload, void *arg)
{
    struct server *s = arg;
    int i = s->frames++;
    if (i >= 8) {
        free(payload);
        return;
    }
    s->hdr[i] = *hdr;
    s->payload[i] = payload;
    if (hdr->type == SL_MSG_GET_SPLIT_REQ)
        memcpy(&s->req[i], msg, sizeof s->req[i]);
    if (hdr->type == SL_MSG_GET_ELEMENT_REQ)
        memcpy(&s->ereq[i], msg, sizeof s->ereq[i]);
    if (!s->answer || hdr->type != SL_MSG_GET_SPLIT_REQ)
        return;
    const sluice_GetSplitRequest *r = msg;
    if (r->max_splits == 0) {
        sl_conn_send_error(c, hdr->request_id, SL_ENOTFOUND, "no task %llu", (unsigned long long)r->task_id);
        return;
    }
    /* Answer with max_splits splits and the request's payload echoed back. */
    sluice_GetSplitResponse resp = sluice_GetSplitResponse_init_zero;
    resp.epoch = r->epoch;
    resp.splits_count = (pb_size_t)(r->max_splits > pb_arraysize(sluice_GetSplitResponse, splits)
                                        ? pb_arraysize(sluice_GetSplitResponse, splits)
                                        : r->max_splits);
    for (pb_size_t k = 0; k < resp.splits_count; k++)
        resp.splits[k] = (sluice_Split){.split_id = r->task_id + k, .begin = k, .end = k + 1};
    sl_conn_send(c, SL_MSG_GET_SPLIT_RESP, hdr->request_id, &resp, payload, hdr->payload_len, NULL, NULL);
}

static void srv_on_close(sl_conn_t *c, int err, const char *why, void *arg)
{
    struct server *s = arg;
    if (s->conn == c)
        s->conn = NULL;
    s->closed++;
    s->close_err = err;
    snprintf(s->close_why, sizeof s->close_why, "%s", why ? why : "");
}

static const sl_conn_cbs_t srv_cbs = {NULL, srv_on_frame, srv_on_close};

static void srv_on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen, void *arg)
{
    struct server *s = arg;
    (void)l;
    (void)sa;
    (void)salen;
    sl_conn_t *c = sl_conn_accept(s->base, fd, NULL, SL_ROLE_DISPATCHER, s->accept_roles, &s->limits, &srv_cbs, s);
    cr_assert_not_null(c);
    s->conn = c;
    s->accepted++;
}

static void server_start(unsigned accept_roles)
{
    memset(&S, 0, sizeof S);
    S.limits.max_payload = MAX_PAYLOAD;
    S.accept_roles = accept_roles;
    S.base = event_base_new();
    cr_assert_not_null(S.base);
    int fd;
    char err[256];
    cr_assert_eq(sl_listen_tcp("127.0.0.1", 0, &fd, &S.port, err, sizeof err), 0, "%s", err);
    cr_assert_gt(S.port, 0);
    S.lis = evconnlistener_new(S.base, srv_on_accept, &S, LEV_OPT_CLOSE_ON_FREE, -1, fd);
    cr_assert_not_null(S.lis);
}

static void server_stop(void)
{
    if (S.conn)
        sl_conn_close(S.conn);
    S.conn = NULL;
    for (int i = 0; i < 8; i++)
        free(S.payload[i]);
    evconnlistener_free(S.lis);
    event_base_free(S.base);
    memset(&S, 0, sizeof S);
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    event_base_loopbreak(arg);
}

/* Runs the server loop until *flag >= want or ms passed. @return whether it got there */
static bool run_until(const int *flag, int want, int ms)
{
    struct event *t = evtimer_new(S.base, on_deadline, S.base);
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(t, &tv);
    while (*flag < want && evtimer_pending(t, NULL))
        event_base_loop(S.base, EVLOOP_ONCE);
    event_free(t);
    return *flag >= want;
}

/* Runs whatever is ready now, a few times. */
static void run_briefly(void)
{
    for (int i = 0; i < 4; i++)
        event_base_loop(S.base, EVLOOP_NONBLOCK);
}

/* Runs the server loop until what it queued on its connection is written. */
static void run_until_flushed(void)
{
    long long end = now_ms() + LOOP_MS;
    while (S.conn && sl_conn_pending(S.conn) > 0 && now_ms() < end)
        event_base_loop(S.base, EVLOOP_NONBLOCK);
    cr_assert(!S.conn || sl_conn_pending(S.conn) == 0, "the server could not write its frames");
    run_briefly();
}

/* ---- the raw peer --------------------------------------------------------- */

static int peer_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0);
    struct timeval tv = {LOOP_MS / 1000, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sin, sizeof sin), 0, "connect: %s", strerror(errno));
    return fd;
}

/* Writes all of buf; small writes go straight to the kernel's buffer. */
static void peer_send(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        cr_assert_gt(n, 0, "send: %s", strerror(errno));
        p += n;
        len -= (size_t)n;
    }
}

/* Writes all of buf without blocking, running the server loop whenever the
 * socket is full, so that payloads larger than the kernel's buffers pass. */
static void peer_send_pumping(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    long long end = now_ms() + LOOP_MS;
    while (len > 0) {
        cr_assert_lt(now_ms(), end, "send did not finish in time");
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            event_base_loop(S.base, EVLOOP_NONBLOCK);
            continue;
        }
        cr_assert_gt(n, 0, "send: %s", strerror(errno));
        p += n;
        len -= (size_t)n;
    }
}

static void peer_handshake(int fd, sl_role_t role, uint16_t version)
{
    uint8_t hs[SL_HANDSHAKE_LEN];
    sl_handshake_encode(hs, role, 0, zero_nonce);
    hs[4] = (uint8_t)(version >> 8);
    hs[5] = (uint8_t)version;
    peer_send(fd, hs, sizeof hs);
}

static void peer_frame(int fd, unsigned type, uint32_t id, const void *msg, const void *payload, uint32_t payload_len)
{
    static uint8_t b[SL_FRAME_HEADER_LEN + SL_MAX_MESSAGE_LEN];
    size_t len = 0;
    cr_assert_eq(sl_frame_encode(type, id, msg, payload_len, b, sizeof b, &len), 0);
    peer_send(fd, b, len);
    if (payload_len)
        peer_send(fd, payload, payload_len);
}

static void peer_header(int fd, sl_frame_hdr_t h)
{
    uint8_t b[SL_FRAME_HEADER_LEN];
    sl_frame_hdr_encode(&h, b);
    peer_send(fd, b, sizeof b);
}

/* Reads until EOF. @return the bytes (free them), with their count in len and
 * in eof whether the stream ended with a clean EOF (not a reset or timeout) */
static uint8_t *peer_read_all(int fd, size_t *len, bool *eof)
{
    size_t cap = 4096, n = 0;
    uint8_t *b = malloc(cap);
    *eof = false;
    for (;;) {
        if (n == cap)
            b = realloc(b, cap *= 2);
        ssize_t r = recv(fd, b + n, cap - n, 0);
        if (r == 0) {
            *eof = true;
            break;
        }
        if (r < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        n += (size_t)r;
    }
    *len = n;
    return b;
}

/* Reads exactly len bytes. */
static void peer_read(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t r = recv(fd, p, len, 0);
        cr_assert_gt(r, 0, "recv: %s", r == 0 ? "EOF" : strerror(errno));
        p += r;
        len -= (size_t)r;
    }
}

/* The server's handshake: a dispatcher of our version. */
static void peer_expect_handshake(const uint8_t *b, size_t len)
{
    cr_assert_geq(len, SL_HANDSHAKE_LEN, "no handshake from the server");
    sl_role_t role;
    char err[128] = "";
    cr_assert_eq(sl_handshake_decode(b, &role, err, sizeof err), 0, "%s", err);
    cr_assert_eq(role, SL_ROLE_DISPATCHER);
}

/* Checks that b holds exactly one error frame with request id 0, code and a
 * message containing each of the NULL-terminated needles. */
static void expect_error_frame(const uint8_t *b, size_t len, int code, ...)
{
    sl_limits_t lim = {.max_payload = 0};
    sl_frame_t f;
    size_t consumed = 0;
    char err[256] = "";
    cr_assert_eq(sl_frame_decode(b, len, &lim, &f, &consumed, err, sizeof err), 1,
                 "no whole frame in %zu bytes: %s", len, err);
    cr_assert_eq(consumed, len, "more than the error frame arrived");
    cr_assert_eq(f.hdr.type, SL_MSG_ERROR);
    cr_assert_eq(f.hdr.request_id, 0);
    const sluice_Error *e = f.msg;
    cr_assert_eq(e->code, code, "code %d (%s), want %d: %s", e->code, sl_strerror(e->code), code, e->message);
    va_list ap;
    va_start(ap, code);
    for (const char *s; (s = va_arg(ap, const char *));)
        cr_assert(strstr(e->message, s), "error message \"%s\" does not mention \"%s\"", e->message, s);
    va_end(ap);
    sl_frame_clear(&f);
}

/* The end of every violation test: the server closed with code, and the
 * peer read (handshake if any) one error frame and a clean EOF. */
static void expect_failed_with(int fd, bool handshake, int code, const char *needle)
{
    cr_assert(run_until(&S.closed, 1, LOOP_MS), "the server did not close the connection");
    cr_assert_eq(S.close_err, code, "on_close: %d (%s): %s", S.close_err, sl_strerror(S.close_err), S.close_why);
    cr_assert_null(S.conn);
    size_t len;
    bool eof;
    uint8_t *b = peer_read_all(fd, &len, &eof);
    cr_assert(eof, "the server did not close cleanly after %zu bytes: %s", len, strerror(errno));
    size_t off = 0;
    if (handshake) {
        peer_expect_handshake(b, len);
        off = SL_HANDSHAKE_LEN;
    }
    expect_error_frame(b + off, len - off, code, needle, (const char *)NULL);
    free(b);
    cr_assert_eq(S.frames, 0, "no frame reached on_frame");
}

/* ---- protocol violations -------------------------------------------------- */

Test(conn, wrong_version_gets_error_frame_and_close)
{
    server_start(1u << SL_ROLE_WORKER);
    int fd = peer_connect(S.port);
    peer_handshake(fd, SL_ROLE_WORKER, SL_PROTOCOL_VERSION + 1);
    cr_assert(run_until(&S.accepted, 1, LOOP_MS));
    char v[16];
    snprintf(v, sizeof v, "%u", SL_PROTOCOL_VERSION + 1);
    expect_failed_with(fd, false, SL_EVERSION, "version");
    cr_assert(strstr(S.close_why, v), "on_close names the version: %s", S.close_why);
    close(fd);
    server_stop();
}

Test(conn, bad_magic_gets_error_frame_and_close)
{
    server_start(1u << SL_ROLE_WORKER);
    int fd = peer_connect(S.port);
    peer_send(fd, "GET / HTTP/1.0\r\n\r\n", 18);
    expect_failed_with(fd, false, SL_EPROTO, "magic");
    close(fd);
    server_stop();
}

Test(conn, role_not_served_gets_error_frame_and_close)
{
    server_start(1u << SL_ROLE_CLIENT);
    int fd = peer_connect(S.port);
    peer_handshake(fd, SL_ROLE_WORKER, SL_PROTOCOL_VERSION);
    expect_failed_with(fd, false, SL_EPROTO, "worker");
    close(fd);
    server_stop();
}

Test(conn, unknown_role_gets_error_frame_and_close)
{
    server_start(1u << SL_ROLE_WORKER);
    int fd = peer_connect(S.port);
    peer_handshake(fd, 9, SL_PROTOCOL_VERSION);
    expect_failed_with(fd, false, SL_EPROTO, "role");
    close(fd);
    server_stop();
}

Test(conn, unknown_type_gets_error_frame_and_close)
{
    const unsigned types[] = {0, SL_MSG_COUNT_, 0xffff};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        server_start(1u << SL_ROLE_WORKER);
        int fd = peer_connect(S.port);
        peer_handshake(fd, SL_ROLE_WORKER, SL_PROTOCOL_VERSION);
        peer_header(fd, (sl_frame_hdr_t){.type = (uint16_t)types[i], .request_id = 1});
        char t[16];
        snprintf(t, sizeof t, "type %u", types[i]);
        expect_failed_with(fd, true, SL_EPROTO, t);
        close(fd);
        server_stop();
    }
}

Test(conn, nonzero_flags_get_error_frame_and_close)
{
    server_start(1u << SL_ROLE_WORKER);
    int fd = peer_connect(S.port);
    peer_handshake(fd, SL_ROLE_WORKER, SL_PROTOCOL_VERSION);
    peer_header(fd, (sl_frame_hdr_t){.type = SL_MSG_GET_SPLIT_REQ, .flags = 0x10, .request_id = 1});
    expect_failed_with(fd, true, SL_EPROTO, "flags");
    close(fd);
    server_stop();
}

/* The header alone claims more than the limit; the server must refuse it
 * at once rather than wait for (or buffer) the payload. */
Test(conn, payload_over_limit_gets_error_frame_and_close)
{
    const uint32_t lens[] = {MAX_PAYLOAD + 1, UINT32_MAX};
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
        server_start(1u << SL_ROLE_WORKER);
        int fd = peer_connect(S.port);
        peer_handshake(fd, SL_ROLE_WORKER, SL_PROTOCOL_VERSION);
        peer_header(fd, (sl_frame_hdr_t){.type = SL_MSG_REGISTER_DATASET_REQ, .request_id = 3, .payload_len = lens[i]});
        char lim[32];
        snprintf(lim, sizeof lim, "limit of %u", MAX_PAYLOAD);
        expect_failed_with(fd, true, SL_ETOOBIG, lim);
        close(fd);
        server_stop();
    }
}

Test(conn, message_over_limit_gets_error_frame_and_close)
{
    server_start(1u << SL_ROLE_WORKER);
    int fd = peer_connect(S.port);
    peer_handshake(fd, SL_ROLE_WORKER, SL_PROTOCOL_VERSION);
    peer_header(fd, (sl_frame_hdr_t){.type = SL_MSG_GET_SPLIT_REQ, .request_id = 3, .msg_len = SL_MAX_MESSAGE_LEN + 1});
    char lim[32];
    snprintf(lim, sizeof lim, "limit of %u", SL_MAX_MESSAGE_LEN);
    expect_failed_with(fd, true, SL_ETOOBIG, lim);
    close(fd);
    server_stop();
}

Test(conn, corrupt_message_gets_error_frame_and_close)
{
    server_start(1u << SL_ROLE_WORKER);
    int fd = peer_connect(S.port);
    peer_handshake(fd, SL_ROLE_WORKER, SL_PROTOCOL_VERSION);
    peer_header(fd, (sl_frame_hdr_t){.type = SL_MSG_GET_SPLIT_REQ, .request_id = 3, .msg_len = 3});
    peer_send(fd, "\x08\xff\xff", 3); /* a varint cut short */
    expect_failed_with(fd, true, SL_EPROTO, "GET_SPLIT_REQ");
    close(fd);
    server_stop();
}

/* The peer keeps sending after a bad header. The server stops reading, so
 * its close may turn into a reset (unread data), but the error frame it
 * wrote before must still reach the peer. */
Test(conn, error_frame_survives_peer_that_keeps_sending)
{
    server_start(1u << SL_ROLE_WORKER);
    int fd = peer_connect(S.port);
    peer_handshake(fd, SL_ROLE_WORKER, SL_PROTOCOL_VERSION);
    peer_header(fd, (sl_frame_hdr_t){.type = 0, .request_id = 1});
    size_t n = 256 * 1024, left = n;
    uint8_t *junk = calloc(1, n);
    const uint8_t *p = junk;
    long long end = now_ms() + LOOP_MS;
    while (left > 0 && now_ms() < end) {
        ssize_t k = send(fd, p, left, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            p += k;
            left -= (size_t)k;
        } else if (k < 0 && errno == EAGAIN) {
            event_base_loop(S.base, EVLOOP_NONBLOCK);
        } else {
            break; /* the server closed: a reset is fine here */
        }
    }
    free(junk);
    cr_assert(run_until(&S.closed, 1, LOOP_MS), "the server did not close the connection");
    cr_assert_eq(S.close_err, SL_EPROTO, "%s", S.close_why);
    size_t len;
    bool eof;
    uint8_t *b = peer_read_all(fd, &len, &eof);
    peer_expect_handshake(b, len);
    expect_error_frame(b + SL_HANDSHAKE_LEN, len - SL_HANDSHAKE_LEN, SL_EPROTO, "type 0", (const char *)NULL);
    free(b);
    cr_assert_eq(S.frames, 0);
    close(fd);
    server_stop();
}

/* ---- frames that are fine ------------------------------------------------- */

static const sluice_GetSplitRequest req42 = {.task_id = 7, .epoch = 3, .max_splits = 5};

static void expect_req42(int i, uint32_t id, const uint8_t *payload, uint32_t payload_len)
{
    cr_assert_eq(S.hdr[i].type, SL_MSG_GET_SPLIT_REQ);
    cr_assert_eq(S.hdr[i].request_id, id);
    cr_assert_eq(S.hdr[i].flags, 0);
    cr_assert_eq(S.hdr[i].payload_len, payload_len);
    cr_assert_eq(S.req[i].task_id, 7);
    cr_assert_eq(S.req[i].epoch, 3);
    cr_assert_eq(S.req[i].max_splits, 5);
    if (payload_len == 0) {
        cr_assert_null(S.payload[i]);
    } else {
        cr_assert_not_null(S.payload[i]);
        cr_assert_eq(memcmp(S.payload[i], payload, payload_len), 0, "payload bytes differ");
    }
}

Test(conn, request_reaches_on_frame)
{
    server_start(1u << SL_ROLE_WORKER);
    int fd = peer_connect(S.port);
    uint8_t payload[3000];
    for (size_t i = 0; i < sizeof payload; i++)
        payload[i] = (uint8_t)(i * 13 + 1);
    peer_handshake(fd, SL_ROLE_WORKER, SL_PROTOCOL_VERSION);
    peer_frame(fd, SL_MSG_GET_SPLIT_REQ, 42, &req42, payload, sizeof payload);
    cr_assert(run_until(&S.frames, 1, LOOP_MS), "on_frame not called");
    expect_req42(0, 42, payload, sizeof payload);
    cr_assert_eq(S.closed, 0);
    cr_assert_not_null(S.conn);
    cr_assert_eq(sl_conn_peer_role(S.conn), SL_ROLE_WORKER);
    cr_assert(strncmp(sl_conn_peer(S.conn), "127.0.0.1:", 10) == 0, "peer %s", sl_conn_peer(S.conn));
    char host[64];
    cr_assert_eq(sl_conn_local_host(S.conn, host, sizeof host), 0);
    cr_assert_str_eq(host, "127.0.0.1");
    run_until_flushed();
    uint8_t hs[SL_HANDSHAKE_LEN];
    peer_read(fd, hs, sizeof hs);
    peer_expect_handshake(hs, sizeof hs);
    close(fd);
    cr_assert(run_until(&S.closed, 1, LOOP_MS), "the server did not notice the close");
    cr_assert_eq(S.close_err, SL_ECLOSED, "%s", S.close_why);
    server_stop();
}

/* A connection decodes each GET_ELEMENT message into the struct of the one
 * before (msg_new()): a field the next one leaves out reads as unset, not
 * as what the one before said. */
Test(conn, a_message_decoded_into_the_last_ones_struct_keeps_nothing_of_it)
{
    server_start(1u << SL_ROLE_CLIENT);
    int fd = peer_connect(S.port);
    peer_handshake(fd, SL_ROLE_CLIENT, SL_PROTOCOL_VERSION);
    sluice_GetElementRequest full = {.task_id = 9, .client_id = 4, .coordinated = true, .round = 77,
                                     .consumer_index = 3, .provenance = true, .seq = 12, .acked_below = 11,
                                     .tallies = true, .dense_provenance = true, .shm = true, .shm_mapped = true,
                                     .shm_released = 5};
    memset(full.task_key, 0xab, sizeof full.task_key);
    sluice_GetElementRequest bare = {.task_id = 10};
    const sluice_GetElementRequest *sent[] = {&full, &bare, &full, &bare};
    for (uint32_t i = 0; i < 4; i++)
        peer_frame(fd, SL_MSG_GET_ELEMENT_REQ, i + 1, sent[i], NULL, 0);
    cr_assert(run_until(&S.frames, 4, LOOP_MS), "%d of 4 frames", S.frames);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(S.hdr[i].type, SL_MSG_GET_ELEMENT_REQ);
        const sluice_GetElementRequest *a = &S.ereq[i], *b = sent[i];
        /* Field by field: the structs' padding is not the message's. */
        cr_assert(a->task_id == b->task_id && a->client_id == b->client_id && a->coordinated == b->coordinated &&
                      a->round == b->round && a->consumer_index == b->consumer_index &&
                      a->provenance == b->provenance && a->seq == b->seq && a->acked_below == b->acked_below &&
                      a->tallies == b->tallies && a->dense_provenance == b->dense_provenance && a->shm == b->shm &&
                      a->shm_mapped == b->shm_mapped && a->shm_released == b->shm_released &&
                      memcmp(a->task_key, b->task_key, sizeof a->task_key) == 0,
                  "frame %d decoded other fields than sent", i);
    }
    cr_assert_eq(S.closed, 0);
    close(fd);
    server_stop();
}

/* The server answers on the same connection: frames, error frames for one
 * request, and a payload sent from the caller's buffer. */
Test(conn, server_answers_requests)
{
    server_start(1u << SL_ROLE_WORKER);
    S.answer = true;
    int fd = peer_connect(S.port);
    peer_handshake(fd, SL_ROLE_WORKER, SL_PROTOCOL_VERSION);
    peer_frame(fd, SL_MSG_GET_SPLIT_REQ, 42, &req42, "abc", 3);
    sluice_GetSplitRequest none = {.task_id = 9, .max_splits = 0};
    peer_frame(fd, SL_MSG_GET_SPLIT_REQ, 43, &none, NULL, 0);
    cr_assert(run_until(&S.frames, 2, LOOP_MS));
    run_until_flushed();

    uint8_t hs[SL_HANDSHAKE_LEN];
    peer_read(fd, hs, sizeof hs);
    peer_expect_handshake(hs, sizeof hs);
    /* Response to 42: a GET_SPLIT_RESP with five splits and "abc". */
    uint8_t h[SL_FRAME_HEADER_LEN];
    peer_read(fd, h, sizeof h);
    sl_limits_t lim = {.max_payload = 16};
    sl_frame_hdr_t hdr;
    char err[256];
    cr_assert_eq(sl_frame_hdr_decode(h, &lim, &hdr, err, sizeof err), 0, "%s", err);
    cr_assert_eq(hdr.type, SL_MSG_GET_SPLIT_RESP);
    cr_assert_eq(hdr.request_id, 42);
    cr_assert_eq(hdr.payload_len, 3);
    uint8_t *rest = malloc(hdr.msg_len + 3);
    peer_read(fd, rest, hdr.msg_len + 3);
    sluice_GetSplitResponse resp = sluice_GetSplitResponse_init_zero;
    cr_assert_eq(sl_msg_decode(hdr.type, rest, hdr.msg_len, &resp, err, sizeof err), 0, "%s", err);
    cr_assert_eq(resp.splits_count, 5);
    cr_assert_eq(resp.epoch, 3);
    cr_assert_eq(resp.splits[4].split_id, 11);
    cr_assert_eq(memcmp(rest + hdr.msg_len, "abc", 3), 0);
    free(rest);
    /* Response to 43: an error frame with the request's id. */
    peer_read(fd, h, sizeof h);
    cr_assert_eq(sl_frame_hdr_decode(h, &lim, &hdr, err, sizeof err), 0, "%s", err);
    cr_assert_eq(hdr.type, SL_MSG_ERROR);
    cr_assert_eq(hdr.request_id, 43);
    rest = malloc(hdr.msg_len);
    peer_read(fd, rest, hdr.msg_len);
    sluice_Error e = sluice_Error_init_zero;
    cr_assert_eq(sl_msg_decode(hdr.type, rest, hdr.msg_len, &e, err, sizeof err), 0, "%s", err);
    cr_assert_eq(e.code, SL_ENOTFOUND);
    cr_assert_str_eq(e.message, "no task 9");
    free(rest);
    cr_assert_eq(S.closed, 0, "an error frame for a request keeps the connection: %s", S.close_why);
    close(fd);
    server_stop();
}

/* A frame that trickles in one byte at a time reaches on_frame once, whole. */
Test(conn, frame_in_single_bytes)
{
    server_start(1u << SL_ROLE_WORKER);
    int fd = peer_connect(S.port);
    uint8_t b[SL_HANDSHAKE_LEN + SL_FRAME_HEADER_LEN + 64 + 10];
    sl_handshake_encode(b, SL_ROLE_WORKER, 0, zero_nonce);
    size_t len = 0;
    cr_assert_eq(sl_frame_encode(SL_MSG_GET_SPLIT_REQ, 5, &req42, 10, b + SL_HANDSHAKE_LEN, 64 + 16, &len), 0);
    len += SL_HANDSHAKE_LEN;
    memcpy(b + len, "0123456789", 10);
    len += 10;
    for (size_t i = 0; i < len; i++) {
        peer_send(fd, b + i, 1);
        run_briefly();
        if (i + 1 < len)
            cr_assert_eq(S.frames, 0, "on_frame after %zu of %zu bytes", i + 1, len);
    }
    cr_assert(run_until(&S.frames, 1, LOOP_MS));
    expect_req42(0, 5, (const uint8_t *)"0123456789", 10);
    cr_assert_eq(S.closed, 0);
    close(fd);
    server_stop();
}

/* Frames back to back in one write, and a payload larger than the socket
 * buffers, arrive in order and whole. */
Test(conn, pipelined_frames_and_large_payload)
{
    server_start(1u << SL_ROLE_WORKER);
    int fd = peer_connect(S.port);
    size_t big = MAX_PAYLOAD; /* exactly the limit */
    uint8_t *payload = malloc(big);
    for (size_t i = 0; i < big; i++)
        payload[i] = (uint8_t)(i ^ (i >> 8));
    static uint8_t b[4 * 1024];
    size_t off = 0, len;
    sl_handshake_encode(b, SL_ROLE_WORKER, 0, zero_nonce);
    off += SL_HANDSHAKE_LEN;
    for (uint32_t id = 1; id <= 3; id++) {
        cr_assert_eq(sl_frame_encode(SL_MSG_GET_SPLIT_REQ, id, &req42, 0, b + off, sizeof b - off, &len), 0);
        off += len;
    }
    cr_assert_eq(sl_frame_encode(SL_MSG_GET_SPLIT_REQ, 4, &req42, (uint32_t)big, b + off, sizeof b - off, &len), 0);
    off += len;
    peer_send(fd, b, off);
    peer_send_pumping(fd, payload, big);
    cr_assert_eq(sl_frame_encode(SL_MSG_GET_SPLIT_REQ, 5, &req42, 0, b, sizeof b, &len), 0);
    peer_send(fd, b, len);
    cr_assert(run_until(&S.frames, 5, LOOP_MS), "%d of 5 frames", S.frames);
    for (int i = 0; i < 3; i++)
        expect_req42(i, (uint32_t)i + 1, NULL, 0);
    expect_req42(3, 4, payload, (uint32_t)big);
    expect_req42(4, 5, NULL, 0);
    cr_assert_eq(S.closed, 0);
    free(payload);
    close(fd);
    server_stop();
}

/* ---- sending: straight to the socket, or queued behind what waits ------- */

struct released {
    int calls;
    const void *data;
    size_t len;
};

static void on_released(const void *data, size_t len, void *extra)
{
    struct released *r = extra;
    r->calls++;
    r->data = data;
    r->len = len;
}

/* Reads exactly len bytes without blocking the server: its loop runs
 * whenever the socket has nothing, so that what it queued gets written. */
static void peer_read_pumping(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    long long end = now_ms() + LOOP_MS;
    while (len > 0) {
        cr_assert_lt(now_ms(), end, "%zu bytes still missing", len);
        ssize_t r = recv(fd, p, len, MSG_DONTWAIT);
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            event_base_loop(S.base, EVLOOP_NONBLOCK);
            continue;
        }
        cr_assert_gt(r, 0, "recv: %s", r == 0 ? "EOF" : strerror(errno));
        p += r;
        len -= (size_t)r;
    }
}

/* Reads one frame: its header (type and request id checked) and its
 * payload, which must be want (want_len bytes). */
static void peer_expect_frame(int fd, unsigned type, uint32_t id, const uint8_t *want, size_t want_len)
{
    uint8_t h[SL_FRAME_HEADER_LEN];
    peer_read_pumping(fd, h, sizeof h);
    sl_limits_t lim = {.max_payload = UINT32_MAX};
    sl_frame_hdr_t hdr;
    char err[256];
    cr_assert_eq(sl_frame_hdr_decode(h, &lim, &hdr, err, sizeof err), 0, "%s", err);
    cr_assert_eq(hdr.type, type);
    cr_assert_eq(hdr.request_id, id, "frame %u where %u was next", hdr.request_id, id);
    cr_assert_eq(hdr.payload_len, want_len, "frame %u: payload of %u bytes, want %zu", id, hdr.payload_len, want_len);
    uint8_t *rest = malloc(hdr.msg_len + want_len + 1);
    peer_read_pumping(fd, rest, hdr.msg_len + want_len);
    cr_assert(memcmp(rest + hdr.msg_len, want, want_len) == 0, "frame %u: the payload differs", id);
    free(rest);
}

/* More than loopback's socket buffers take at once. */
#define BIG_PAYLOAD (16u << 20)

/* A payload of BIG_PAYLOAD bytes that differ from their neighbours (so a
 * piece out of place shows); the caller frees it. */
static uint8_t *big_payload(void)
{
    uint8_t *p = malloc(BIG_PAYLOAD);
    cr_assert_not_null(p);
    for (size_t i = 0; i < BIG_PAYLOAD; i++)
        p[i] = (uint8_t)(i * 31 + (i >> 12));
    return p;
}

/* Frames go straight to the socket while nothing waits before them; a
 * payload the socket cannot take at once is queued from where the write
 * stopped, and frames sent meanwhile queue behind it. Every frame arrives
 * whole and in order, and each referenced payload's release runs once,
 * with the payload and length it was given, only once all of it is out. */
/* A client peer whose connection the server holds open, after one request. */
static int peer_open(void)
{
    server_start(1u << SL_ROLE_WORKER);
    int fd = peer_connect(S.port);
    peer_handshake(fd, SL_ROLE_WORKER, SL_PROTOCOL_VERSION);
    peer_frame(fd, SL_MSG_GET_SPLIT_REQ, 1, &req42, NULL, 0);
    cr_assert(run_until(&S.frames, 1, LOOP_MS));
    return fd;
}

Test(conn, sends_in_order_whether_written_at_once_or_queued)
{
    int fd = peer_open();
    run_until_flushed();
    uint8_t hs[SL_HANDSHAKE_LEN];
    peer_read(fd, hs, sizeof hs);
    peer_expect_handshake(hs, sizeof hs);

    size_t big = BIG_PAYLOAD;
    uint8_t *payload = big_payload();
    static const uint8_t tail[5] = {'t', 'a', 'i', 'l', '!'};
    sluice_GetSplitResponse resp = sluice_GetSplitResponse_init_zero;
    struct released small = {0}, large = {0}, with_tail = {0};

    /* Nothing waits: written at once, released at once. */
    cr_assert_eq(sl_conn_send(S.conn, SL_MSG_GET_SPLIT_RESP, 10, &resp, payload, 100, on_released, &small), 0);
    cr_assert_eq(small.calls, 1, "a frame the socket took whole is released at once");
    cr_assert(small.data == payload && small.len == 100);
    cr_assert_eq(sl_conn_pending(S.conn), 0);
    /* Too large for the socket: the rest waits, and so does its release. */
    cr_assert_eq(sl_conn_send(S.conn, SL_MSG_GET_SPLIT_RESP, 11, &resp, payload, big, on_released, &large), 0);
    cr_assert_gt(sl_conn_pending(S.conn), 0, "the socket took %zu bytes at once", big);
    cr_assert_eq(large.calls, 0, "released while part of it was still to be written");
    /* Behind it: a copied payload, then a frame of payload, pad and two
     * tails (a batch's provenance and its split-done notices). */
    cr_assert_eq(sl_conn_send(S.conn, SL_MSG_GET_SPLIT_RESP, 12, &resp, "copied", 6, NULL, NULL), 0);
    struct iovec tails[2] = {{(void *)tail, 2}, {(void *)(tail + 2), sizeof tail - 2}};
    cr_assert_eq(sl_conn_send_tail(S.conn, SL_MSG_GET_SPLIT_RESP, 13, &resp, payload + 7, 3, 5, tails, 2,
                                   on_released, &with_tail),
                 0);
    cr_assert_eq(with_tail.calls, 0);

    peer_expect_frame(fd, SL_MSG_GET_SPLIT_RESP, 10, payload, 100);
    peer_expect_frame(fd, SL_MSG_GET_SPLIT_RESP, 11, payload, big);
    peer_expect_frame(fd, SL_MSG_GET_SPLIT_RESP, 12, (const uint8_t *)"copied", 6);
    uint8_t want[3 + 5 + sizeof tail] = {0};
    memcpy(want, payload + 7, 3);
    memcpy(want + 8, tail, sizeof tail);
    peer_expect_frame(fd, SL_MSG_GET_SPLIT_RESP, 13, want, sizeof want);
    run_until_flushed();
    cr_assert_eq(large.calls, 1);
    cr_assert(large.data == payload && large.len == big, "released with %p and %zu", large.data, large.len);
    cr_assert_eq(with_tail.calls, 1);
    cr_assert(with_tail.data == payload + 7 && with_tail.len == 3);
    /* The queue drained: the next frame goes straight out again. */
    cr_assert_eq(sl_conn_send(S.conn, SL_MSG_GET_SPLIT_RESP, 14, &resp, payload, 1, on_released, &small), 0);
    cr_assert_eq(small.calls, 2);
    peer_expect_frame(fd, SL_MSG_GET_SPLIT_RESP, 14, payload, 1);
    cr_assert_eq(S.closed, 0, "%s", S.close_why);
    free(payload);
    close(fd);
    server_stop();
}

/* A frame queued on a connection that then closes is released once. */
Test(conn, queued_frame_released_when_the_connection_closes)
{
    int fd = peer_open();
    size_t big = BIG_PAYLOAD;
    uint8_t *payload = calloc(1, big);
    sluice_GetSplitResponse resp = sluice_GetSplitResponse_init_zero;
    struct released r = {0};
    cr_assert_eq(sl_conn_send(S.conn, SL_MSG_GET_SPLIT_RESP, 2, &resp, payload, big, on_released, &r), 0);
    cr_assert_gt(sl_conn_pending(S.conn), 0);
    cr_assert_eq(r.calls, 0);
    sl_conn_close(S.conn);
    S.conn = NULL;
    run_briefly(); /* libevent frees a bufferevent's buffers from its loop */
    cr_assert_eq(r.calls, 1, "the queued payload was not released on close");
    cr_assert(r.data == payload && r.len == big);
    free(payload);
    close(fd);
    server_stop();
}

/* ---- gathering (sl_conn_set_gather()) ---- */

/* An open connection whose peer read the handshake, gathering. */
static int gather_open(void)
{
    int fd = peer_open();
    run_until_flushed();
    uint8_t hs[SL_HANDSHAKE_LEN];
    peer_read(fd, hs, sizeof hs);
    peer_expect_handshake(hs, sizeof hs);
    sl_conn_set_gather(S.conn, true);
    return fd;
}

/* Whether the peer's socket has anything to read now. */
static bool peer_has_data(int fd)
{
    uint8_t b;
    ssize_t r = recv(fd, &b, 1, MSG_DONTWAIT | MSG_PEEK);
    return r > 0;
}

/* The first frame of a pass of the loop goes at once; the next wait for
 * the pass's end and then go together, in order, each released once, after
 * it was written. */
Test(conn, gathered_frames_go_out_at_the_end_of_the_pass)
{
    int fd = gather_open();
    uint8_t payload[3000];
    for (size_t i = 0; i < sizeof payload; i++)
        payload[i] = (uint8_t)(i * 7);
    sluice_GetSplitResponse resp = sluice_GetSplitResponse_init_zero;
    struct released r[4] = {{0}};
    static const uint8_t tail[4] = {'t', 'a', 'i', 'l'};
    struct iovec tails[1] = {{(void *)tail, sizeof tail}};
    cr_assert_eq(sl_conn_send(S.conn, SL_MSG_GET_SPLIT_RESP, 19, &resp, payload, 500, on_released, &r[3]), 0);
    cr_assert_eq(r[3].calls, 1, "the pass's first frame was not written at once");
    cr_assert_eq(sl_conn_send(S.conn, SL_MSG_GET_SPLIT_RESP, 20, &resp, payload, 1000, on_released, &r[0]), 0);
    cr_assert_eq(sl_conn_send(S.conn, SL_MSG_GET_SPLIT_RESP, 21, &resp, "copied", 6, NULL, NULL), 0);
    cr_assert_eq(sl_conn_send_tail(S.conn, SL_MSG_GET_SPLIT_RESP, 22, &resp, payload + 1000, 2000, 3, tails, 1,
                                   on_released, &r[1]),
                 0);
    cr_assert_eq(r[0].calls + r[1].calls, 0, "released before the end of the pass");
    cr_assert_gt(sl_conn_pending(S.conn), 3000, "the gathered frames do not count as pending");
    peer_expect_frame(fd, SL_MSG_GET_SPLIT_RESP, 19, payload, 500);
    cr_assert(!peer_has_data(fd), "a gathered frame was written before the end of the pass");
    run_until_flushed();
    cr_assert_eq(r[0].calls, 1);
    cr_assert(r[0].data == payload && r[0].len == 1000);
    cr_assert_eq(r[1].calls, 1);
    cr_assert(r[1].data == payload + 1000 && r[1].len == 2000);
    peer_expect_frame(fd, SL_MSG_GET_SPLIT_RESP, 20, payload, 1000);
    peer_expect_frame(fd, SL_MSG_GET_SPLIT_RESP, 21, (const uint8_t *)"copied", 6);
    uint8_t want[2000 + 3 + sizeof tail] = {0};
    memcpy(want, payload + 1000, 2000);
    memcpy(want + 2003, tail, sizeof tail);
    peer_expect_frame(fd, SL_MSG_GET_SPLIT_RESP, 22, want, sizeof want);
    /* A new pass: its first frame goes at once again. */
    cr_assert_eq(sl_conn_send(S.conn, SL_MSG_GET_SPLIT_RESP, 23, &resp, payload, 10, on_released, &r[2]), 0);
    cr_assert_eq(r[2].calls, 1, "the next pass's first frame was not written at once");
    peer_expect_frame(fd, SL_MSG_GET_SPLIT_RESP, 23, payload, 10);
    /* Turned off: what was gathered goes, and frames go straight out. */
    cr_assert_eq(sl_conn_send(S.conn, SL_MSG_GET_SPLIT_RESP, 24, &resp, payload, 20, on_released, &r[2]), 0);
    cr_assert_eq(r[2].calls, 1);
    sl_conn_set_gather(S.conn, false);
    cr_assert_eq(r[2].calls, 2, "turning gathering off did not write what was gathered");
    cr_assert_eq(sl_conn_send(S.conn, SL_MSG_GET_SPLIT_RESP, 25, &resp, payload, 30, on_released, &r[2]), 0);
    cr_assert_eq(r[2].calls, 3, "written at once, released at once");
    peer_expect_frame(fd, SL_MSG_GET_SPLIT_RESP, 24, payload, 20);
    peer_expect_frame(fd, SL_MSG_GET_SPLIT_RESP, 25, payload, 30);
    cr_assert_eq(S.closed, 0, "%s", S.close_why);
    close(fd);
    server_stop();
}

/* More frames in one pass than a gather holds, some too large for its
 * room, one far larger than the socket takes at once: what is gathered
 * goes whenever the next does not fit, and everything arrives whole and in
 * order, every release once. Sizes are drawn from a printed seed. */
Test(conn, gathered_frames_past_the_room_and_the_socket_arrive_whole_and_in_order)
{
    uint64_t st = test_seed("conn.gathered_frames_past_the_room_and_the_socket_arrive_whole_and_in_order");
    int fd = gather_open();
    enum { N = 3 * SL_GATHER_FRAMES + 5 };
    size_t big = BIG_PAYLOAD;
    uint8_t *payload = big_payload();
    sluice_GetSplitResponse resp = sluice_GetSplitResponse_init_zero;
    struct released r[N];
    memset(r, 0, sizeof r);
    size_t size[N];
    bool copied[N];
    for (int i = 0; i < N; i++) {
        uint64_t d = splitmix64(&st);
        copied[i] = d & 1;
        /* Copied payloads up to twice the room; one frame of 16 MiB. */
        size[i] = i == N / 2 ? big : copied[i] ? (d >> 1) % (2 * SL_GATHER_BYTES) : (d >> 1) % 100000;
        cr_assert_eq(sl_conn_send(S.conn, SL_MSG_GET_SPLIT_RESP, 100 + (uint32_t)i, &resp, payload, size[i],
                                  copied[i] ? NULL : on_released, &r[i]),
                     0, "frame %d", i);
    }
    for (int i = 0; i < N; i++)
        peer_expect_frame(fd, SL_MSG_GET_SPLIT_RESP, 100 + (uint32_t)i, payload, size[i]);
    run_until_flushed();
    for (int i = 0; i < N; i++) {
        cr_assert_eq(r[i].calls, copied[i] ? 0 : 1, "frame %d (%zu bytes) released %d times", i, size[i], r[i].calls);
        cr_assert(copied[i] || (r[i].data == payload && r[i].len == size[i]));
    }
    cr_assert_eq(S.closed, 0, "%s", S.close_why);
    free(payload);
    close(fd);
    server_stop();
}

/* A gather that is full when the socket is too: its flush writes part of
 * it and queues the rest, and a frame too large for the emptied gather then
 * goes behind that rest, not straight to the socket ahead of it. (Here the
 * socket stays full, so a frame sent straight would write nothing and go
 * behind anyway; with a peer reading meanwhile it would have gone ahead.
 * This checks the order and the releases, not that race.) */
Test(conn, a_frame_after_a_partial_flush_goes_behind_what_it_left)
{
    int fd = gather_open();
    size_t big = BIG_PAYLOAD;
    uint8_t *payload = big_payload();
    sluice_GetSplitResponse resp = sluice_GetSplitResponse_init_zero;
    struct released r[SL_GATHER_FRAMES + 2];
    memset(r, 0, sizeof r);
    uint32_t id = 40;
    /* The pass's first frame goes at once; then 16 MiB, gathered (it is
     * referenced), and small frames until the gather is full. */
    cr_assert_eq(sl_conn_send(S.conn, SL_MSG_GET_SPLIT_RESP, id++, &resp, payload, 10, on_released, &r[0]), 0);
    cr_assert_eq(sl_conn_send(S.conn, SL_MSG_GET_SPLIT_RESP, id++, &resp, payload, big, on_released, &r[1]), 0);
    for (int i = 2; i <= SL_GATHER_FRAMES; i++)
        cr_assert_eq(sl_conn_send(S.conn, SL_MSG_GET_SPLIT_RESP, id++, &resp, payload + i, 100, on_released, &r[i]),
                     0);
    cr_assert_eq(r[1].calls, 0, "the 16 MiB frame was written before the gather was full");
    /* Full, and copied bytes beyond its room: the flush cannot write it all. */
    size_t copied = SL_GATHER_BYTES + 100;
    cr_assert_eq(sl_conn_send(S.conn, SL_MSG_GET_SPLIT_RESP, id++, &resp, payload + 5, copied, NULL, NULL), 0);
    cr_assert_gt(sl_conn_pending(S.conn), copied, "the socket took 16 MiB at once");
    uint32_t expect = 40;
    peer_expect_frame(fd, SL_MSG_GET_SPLIT_RESP, expect++, payload, 10);
    peer_expect_frame(fd, SL_MSG_GET_SPLIT_RESP, expect++, payload, big);
    for (int i = 2; i <= SL_GATHER_FRAMES; i++)
        peer_expect_frame(fd, SL_MSG_GET_SPLIT_RESP, expect++, payload + i, 100);
    peer_expect_frame(fd, SL_MSG_GET_SPLIT_RESP, expect++, payload + 5, copied);
    run_until_flushed();
    for (int i = 0; i <= SL_GATHER_FRAMES; i++)
        cr_assert_eq(r[i].calls, 1, "frame %d released %d times", i, r[i].calls);
    cr_assert_eq(S.closed, 0, "%s", S.close_why);
    free(payload);
    close(fd);
    server_stop();
}

/* Gathered frames of a connection closed before the end of the pass are
 * released once; frames gathered before a cork go before what it holds. */
Test(conn, gathered_frames_are_released_on_close_and_go_before_a_cork)
{
    int fd = gather_open();
    uint8_t payload[100] = {1, 2, 3};
    sluice_GetSplitResponse resp = sluice_GetSplitResponse_init_zero;
    struct released first = {0}, a = {0}, b = {0}, c = {0};
    cr_assert_eq(sl_conn_send(S.conn, SL_MSG_GET_SPLIT_RESP, 29, &resp, payload, 40, on_released, &first), 0);
    cr_assert_eq(sl_conn_send(S.conn, SL_MSG_GET_SPLIT_RESP, 30, &resp, payload, 50, on_released, &a), 0);
    cr_assert_eq(a.calls, 0, "not gathered");
    cr_assert_eq(sl_conn_cork(S.conn), 0);
    cr_assert_eq(a.calls, 1, "the cork did not write what was gathered");
    cr_assert_eq(sl_conn_send(S.conn, SL_MSG_GET_SPLIT_RESP, 31, &resp, payload, 60, on_released, &b), 0);
    cr_assert_eq(b.calls, 0, "a corked frame was written");
    sl_conn_uncork(S.conn);
    peer_expect_frame(fd, SL_MSG_GET_SPLIT_RESP, 29, payload, 40);
    peer_expect_frame(fd, SL_MSG_GET_SPLIT_RESP, 30, payload, 50);
    peer_expect_frame(fd, SL_MSG_GET_SPLIT_RESP, 31, payload, 60);
    run_until_flushed();
    cr_assert_eq(b.calls, 1);
    cr_assert_eq(sl_conn_send(S.conn, SL_MSG_GET_SPLIT_RESP, 32, &resp, payload, 70, on_released, &first), 0);
    cr_assert_eq(sl_conn_send(S.conn, SL_MSG_GET_SPLIT_RESP, 33, &resp, payload, 80, on_released, &c), 0);
    cr_assert_eq(c.calls, 0);
    sl_conn_close(S.conn);
    S.conn = NULL;
    cr_assert_eq(c.calls, 1, "a gathered frame was not released when its connection closed");
    cr_assert(c.data == payload && c.len == 80);
    run_briefly();
    cr_assert_eq(c.calls, 1, "released twice");
    close(fd);
    server_stop();
}

/* An error frame with request id 0 is the peer giving up: on_close gets its
 * code and message. */
Test(conn, peer_error_frame_closes_with_its_code)
{
    server_start(1u << SL_ROLE_WORKER);
    int fd = peer_connect(S.port);
    peer_handshake(fd, SL_ROLE_WORKER, SL_PROTOCOL_VERSION);
    sluice_Error e = {.code = SL_EDATA, .message = "bye now"};
    peer_frame(fd, SL_MSG_ERROR, 0, &e, NULL, 0);
    cr_assert(run_until(&S.closed, 1, LOOP_MS));
    cr_assert_eq(S.close_err, SL_EDATA);
    cr_assert(strstr(S.close_why, "bye now"), "%s", S.close_why);
    cr_assert_eq(S.frames, 0);
    close(fd);
    server_stop();
}

Test(conn, eof_during_handshake_closes)
{
    server_start(1u << SL_ROLE_WORKER);
    int fd = peer_connect(S.port);
    peer_send(fd, "SLU", 3);
    cr_assert(run_until(&S.accepted, 1, LOOP_MS));
    run_briefly();
    cr_assert_eq(S.closed, 0, "a partial handshake is no failure yet");
    close(fd);
    cr_assert(run_until(&S.closed, 1, LOOP_MS));
    cr_assert_eq(S.close_err, SL_ECLOSED);
    cr_assert(strstr(S.close_why, "handshake"), "%s", S.close_why);
    server_stop();
}

/* ---- sl_rpc_open failures --------------------------------------------------- */

Test(rpc, open_closed_port_is_refused)
{
    /* A port that was free a moment ago: bind, read it, close. */
    int fd;
    uint16_t port;
    char err[256] = "";
    cr_assert_eq(sl_listen_tcp("127.0.0.1", 0, &fd, &port, err, sizeof err), 0, "%s", err);
    close(fd);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", port);
    sl_limits_t lim = {.max_payload = MAX_PAYLOAD};
    sl_rpc_t *r = (sl_rpc_t *)&lim; /* any non-NULL value: sl_rpc_open must reset it */
    long long t0 = now_ms();
    int rc = sl_rpc_open(addr, NULL, SL_ROLE_WORKER, SL_ROLE_DISPATCHER, &lim, 2000, &r, err, sizeof err);
    long long took = now_ms() - t0;
    cr_assert_eq(rc, -ECONNREFUSED, "rc %d (%s): %s", rc, sl_strerror(rc), err);
    cr_assert_null(r);
    cr_assert_lt(took, 1000, "refusal took %lld ms", took);
    cr_assert(strstr(err, addr), "the message names the address: %s", err);
}

Test(rpc, open_silent_peer_times_out)
{
    /* A listening socket that nobody accepts on: the kernel completes the TCP
     * handshake, but no Sluice handshake ever comes back. */
    int fd;
    uint16_t port;
    char err[256] = "";
    cr_assert_eq(sl_listen_tcp("127.0.0.1", 0, &fd, &port, err, sizeof err), 0, "%s", err);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", port);
    sl_limits_t lim = {.max_payload = MAX_PAYLOAD};
    sl_rpc_t *r = NULL;
    long long t0 = now_ms();
    int rc = sl_rpc_open(addr, NULL, SL_ROLE_WORKER, SL_ROLE_DISPATCHER, &lim, 300, &r, err, sizeof err);
    long long took = now_ms() - t0;
    close(fd);
    cr_assert_eq(rc, -ETIMEDOUT, "rc %d (%s): %s", rc, sl_strerror(rc), err);
    cr_assert_null(r);
    cr_assert_geq(took, 250, "timed out after only %lld ms", took);
    cr_assert_lt(took, 1500, "300 ms timeout took %lld ms", took);
    cr_assert(strstr(err, addr), "the message names the address: %s", err);
}

Test(rpc, open_bad_address)
{
    sl_limits_t lim = {.max_payload = MAX_PAYLOAD};
    sl_rpc_t *r = NULL;
    char err[256] = "";
    cr_assert_eq(sl_rpc_open("no-port-here", NULL, SL_ROLE_WORKER, SL_ROLE_DISPATCHER, &lim, 300, &r, err, sizeof err),
                 SL_EINVAL);
    cr_assert_null(r);
    cr_assert(strstr(err, "no-port-here"), "%s", err);
}

/* ---- sl_rpc against the server, whose loop runs in a thread -------------- */

static atomic_bool stop_server;

static void on_poll_stop(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    if (atomic_load(&stop_server))
        event_base_loopbreak(arg);
}

static void *server_thread(void *arg)
{
    (void)arg;
    struct event *t = event_new(S.base, -1, EV_PERSIST, on_poll_stop, S.base);
    struct timeval tv = {0, 10 * 1000};
    event_add(t, &tv);
    long long end = now_ms() + 10 * LOOP_MS;
    while (!atomic_load(&stop_server) && now_ms() < end)
        event_base_loop(S.base, EVLOOP_ONCE);
    event_free(t);
    return NULL;
}

Test(rpc, calls_against_a_live_server)
{
    server_start(1u << SL_ROLE_WORKER);
    S.answer = true;
    atomic_store(&stop_server, false);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, server_thread, NULL), 0);

    char addr[64], err[256] = "";
    snprintf(addr, sizeof addr, "127.0.0.1:%u", S.port);
    sl_limits_t lim = {.max_payload = MAX_PAYLOAD};
    sl_rpc_t *r = NULL;
    int rc = sl_rpc_open(addr, NULL, SL_ROLE_WORKER, SL_ROLE_DISPATCHER, &lim, 2000, &r, err, sizeof err);
    cr_assert_eq(rc, 0, "rc %d: %s", rc, err);
    cr_assert_not_null(r);

    /* A call with a payload: the response echoes it. */
    sluice_GetSplitRequest q = {.task_id = 100, .epoch = 2, .max_splits = 64};
    sluice_GetSplitResponse *resp = calloc(1, sizeof *resp);
    uint8_t *pl = NULL;
    size_t pl_len = 0;
    rc = sl_rpc_call(r, SL_MSG_GET_SPLIT_REQ, &q, "payload!", 8, SL_MSG_GET_SPLIT_RESP, resp, &pl, &pl_len, 2000,
                     err, sizeof err);
    cr_assert_eq(rc, 0, "rc %d: %s", rc, err);
    cr_assert_eq(resp->splits_count, 64);
    cr_assert_eq(resp->splits[63].split_id, 163);
    cr_assert_eq(resp->epoch, 2);
    cr_assert_eq(pl_len, 8);
    cr_assert_eq(memcmp(pl, "payload!", 8), 0);
    free(pl);

    /* An error frame answering the request comes back as its code. */
    sluice_GetSplitRequest none = {.task_id = 5, .max_splits = 0};
    memset(resp, 0, sizeof *resp);
    rc = sl_rpc_call(r, SL_MSG_GET_SPLIT_REQ, &none, NULL, 0, SL_MSG_GET_SPLIT_RESP, resp, &pl, &pl_len, 2000, err,
                     sizeof err);
    cr_assert_eq(rc, SL_ENOTFOUND, "rc %d: %s", rc, err);
    cr_assert_str_eq(err, "no task 5");
    cr_assert_null(pl);

    /* The connection survives it. */
    memset(resp, 0, sizeof *resp);
    q.max_splits = 1;
    rc = sl_rpc_call(r, SL_MSG_GET_SPLIT_REQ, &q, NULL, 0, SL_MSG_GET_SPLIT_RESP, resp, NULL, NULL, 2000, err,
                     sizeof err);
    cr_assert_eq(rc, 0, "rc %d: %s", rc, err);
    cr_assert_eq(resp->splits_count, 1);

    /* A request the server does not answer times out, and closes the rpc. */
    sluice_GetExclusionsResponse *never = calloc(1, sizeof *never);
    long long t0 = now_ms();
    rc = sl_rpc_call(r, SL_MSG_GET_EXCLUSIONS_REQ, &(sluice_GetExclusionsRequest){.job_id = 1}, NULL, 0,
                     SL_MSG_GET_EXCLUSIONS_RESP, never, NULL, NULL, 200, err, sizeof err);
    free(never);
    long long took = now_ms() - t0;
    cr_assert_eq(rc, -ETIMEDOUT, "rc %d: %s", rc, err);
    cr_assert_lt(took, 1500);
    rc = sl_rpc_call(r, SL_MSG_GET_SPLIT_REQ, &q, NULL, 0, SL_MSG_GET_SPLIT_RESP, resp, NULL, NULL, 2000, err,
                     sizeof err);
    cr_assert_eq(rc, SL_ECLOSED, "rc %d: %s", rc, err);
    free(resp);
    sl_rpc_close(r);

    atomic_store(&stop_server, true);
    pthread_join(th, NULL);
    server_stop();
}

/* A client whose role the server does not serve learns why. The server's
 * refusal is an error frame sent in place of its handshake. */
Test(rpc, open_refused_role_reports_server_reason)
{
    server_start(1u << SL_ROLE_CLIENT);
    atomic_store(&stop_server, false);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, server_thread, NULL), 0);
    char addr[64], err[256] = "";
    snprintf(addr, sizeof addr, "127.0.0.1:%u", S.port);
    sl_limits_t lim = {.max_payload = MAX_PAYLOAD};
    sl_rpc_t *r = NULL;
    int rc = sl_rpc_open(addr, NULL, SL_ROLE_WORKER, SL_ROLE_DISPATCHER, &lim, 2000, &r, err, sizeof err);
    atomic_store(&stop_server, true);
    pthread_join(th, NULL);
    cr_assert_eq(rc, SL_EPROTO, "rc %d: %s", rc, err);
    cr_assert(strstr(err, "does not serve workers"), "the server's reason is lost: %s", err);
    server_stop();
}

/* ---- receiving on a connection we opened: payloads straight from the socket */

struct out_side {
    int ready, frames, closed, close_err;
    char close_why[512];
    sl_frame_hdr_t hdr;
    uint8_t *payload;
};

static void out_on_ready(sl_conn_t *c, void *arg)
{
    (void)c;
    ((struct out_side *)arg)->ready++;
}

static void out_on_frame(sl_conn_t *c, const sl_frame_hdr_t *hdr, void *msg, uint8_t *payload, void *arg)
{
    struct out_side *o = arg;
    (void)c;
    (void)msg;
    o->frames++;
    o->hdr = *hdr;
    free(o->payload);
    o->payload = payload;
}

static void out_on_close(sl_conn_t *c, int err, const char *why, void *arg)
{
    struct out_side *o = arg;
    (void)c;
    o->closed++;
    o->close_err = err;
    snprintf(o->close_why, sizeof o->close_why, "%s", why);
}

/* Runs base until *flag >= want or LOOP_MS passed, writing [p, p+len) to fd
 * in between as the socket takes it (all of it written on return when it
 * got there). */
static bool pump_out(struct event_base *base, const int *flag, int want, int fd, const uint8_t *p, size_t len)
{
    long long end = now_ms() + LOOP_MS;
    while ((*flag < want || len > 0) && now_ms() < end) {
        if (len > 0) {
            ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0) {
                p += n;
                len -= (size_t)n;
            }
        }
        event_base_loop(base, EVLOOP_NONBLOCK);
    }
    return *flag >= want && len == 0;
}

/* A connection we open (as a worker) to a listener standing in for a
 * dispatcher, through its handshake: its frames go to cbs with arg, and
 * the peer's socket is *fd (the listener *lfd). */
static void out_connect(struct event_base *base, const sl_conn_cbs_t *cbs, struct out_side *o, int *fd, int *lfd)
{
    uint16_t port;
    char err[256];
    cr_assert_eq(sl_listen_tcp("127.0.0.1", 0, lfd, &port, err, sizeof err), 0, "%s", err);
    int fl = fcntl(*lfd, F_GETFL);
    fcntl(*lfd, F_SETFL, fl & ~O_NONBLOCK);
    sl_limits_t limits = {.max_payload = 32u << 20};
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", port);
    sl_conn_t *c;
    cr_assert_eq(sl_conn_connect(base, addr, NULL, SL_ROLE_WORKER, SL_ROLE_DISPATCHER, &limits, LOOP_MS, cbs, o, &c, err,
                                 sizeof err),
                 0, "%s", err);
    *fd = accept(*lfd, NULL, NULL);
    cr_assert_geq(*fd, 0, "accept: %s", strerror(errno));
    uint8_t hs[SL_HANDSHAKE_LEN];
    sl_handshake_encode(hs, SL_ROLE_DISPATCHER, 0, zero_nonce);
    cr_assert(pump_out(base, &o->ready, 1, *fd, hs, sizeof hs), "the handshake did not complete");
}

/* A payload larger than the socket's buffers, arriving in pieces on a
 * connection we opened, reaches on_frame once, whole; a peer that closes in
 * the middle of the next frame's payload closes the connection, and the
 * part-read frame is dropped. */
Test(conn, outgoing_payload_read_in_pieces_and_cut_short)
{
    int lfd, fd;
    struct event_base *base = event_base_new();
    struct out_side o = {0};
    const sl_conn_cbs_t cbs = {out_on_ready, out_on_frame, out_on_close};
    out_connect(base, &cbs, &o, &fd, &lfd);

    size_t big = 16u << 20;
    uint8_t *frame = malloc(SL_FRAME_HEADER_LEN + SL_MAX_MESSAGE_LEN + big);
    sluice_GetSplitResponse resp = sluice_GetSplitResponse_init_zero;
    size_t head;
    cr_assert_eq(sl_frame_encode(SL_MSG_GET_SPLIT_RESP, 7, &resp, (uint32_t)big, frame,
                                 SL_FRAME_HEADER_LEN + SL_MAX_MESSAGE_LEN, &head),
                 0);
    for (size_t i = 0; i < big; i++)
        frame[head + i] = (uint8_t)(i * 7 + (i >> 16));
    cr_assert(pump_out(base, &o.frames, 1, fd, frame, head + big), "%d frames", o.frames);
    cr_assert_eq(o.hdr.request_id, 7);
    cr_assert_eq(o.hdr.payload_len, big);
    cr_assert(memcmp(o.payload, frame + head, big) == 0, "the payload differs");
    cr_assert_eq(o.closed, 0, "%s", o.close_why);

    /* The next frame: header, half its payload, then the peer goes. */
    cr_assert_eq(sl_frame_encode(SL_MSG_GET_SPLIT_RESP, 8, &resp, (uint32_t)big, frame,
                                 SL_FRAME_HEADER_LEN + SL_MAX_MESSAGE_LEN, &head),
                 0);
    int zero = 0;
    cr_assert(pump_out(base, &zero, 0, fd, frame, head + big / 2));
    uint8_t theirs[SL_HANDSHAKE_LEN];
    peer_read(fd, theirs, sizeof theirs); /* read, so that the close is a FIN, not a reset */
    close(fd);
    cr_assert(pump_out(base, &o.closed, 1, -1, NULL, 0), "the close went unnoticed");
    cr_assert_eq(o.frames, 1, "a cut frame was delivered");
    cr_assert_eq(o.close_err, SL_ECLOSED, "%d: %s", o.close_err, o.close_why);
    /* Whichever read met the end first (libevent's, or the payload's own,
     * which adds "in the middle of a frame"), it says the peer closed. */
    cr_assert(strstr(o.close_why, "closed the connection"), "%s", o.close_why);
    free(o.payload);
    free(frame);
    event_base_loop(base, EVLOOP_NONBLOCK); /* frees the closed connection */
    event_base_free(base);
    close(lfd);
}

/* Payload bytes of frame i, at j: what the peer sends and the test expects. */
static uint8_t mix_byte(uint32_t i, size_t j)
{
    return (uint8_t)(i * 131u + j * 7u + (j >> 12));
}

struct mix_side {
    struct out_side o; /* first: the callbacks above see it */
    uint32_t next;     /* the request id the next frame must have */
    const uint32_t *sizes;
    int bad;
    char why[200];
};

static void mix_on_frame(sl_conn_t *c, const sl_frame_hdr_t *hdr, void *msg, uint8_t *payload, void *arg)
{
    struct mix_side *m = arg;
    (void)c;
    (void)msg;
    uint32_t i = m->next++;
    bool ok = hdr->request_id == i + 1 && hdr->payload_len == m->sizes[i];
    for (size_t j = 0; ok && j < hdr->payload_len; j++)
        ok = payload[j] == mix_byte(i, j);
    if (!ok && !m->bad++)
        snprintf(m->why, sizeof m->why, "frame %u (id %u, %u bytes, want %u) arrived wrong", i, hdr->request_id,
                 hdr->payload_len, m->sizes[i]);
    free(payload);
    m->o.frames++;
}

/* Frames of every size around the read paths' bounds (a payload under
 * 32 KiB comes through the input, many frames to a recv() of up to 128 KiB;
 * a larger one straight from the socket into its buffer), back to back, in
 * seeded pieces: each reaches on_frame once, in order, whole. */
Test(conn, outgoing_frames_of_mixed_sizes_arrive_whole_and_in_order)
{
    uint64_t st = test_seed("conn::outgoing_frames_of_mixed_sizes_arrive_whole_and_in_order");
    static const uint32_t edges[] = {0, 1, 100, 4000, 4096, 8192, 32767, 32768, 32769, 131072, 131089, 300000,
                                     1u << 20};
    enum { N = 400 };
    uint32_t sizes[N];
    size_t total = 0;
    for (int i = 0; i < N; i++) {
        uint64_t r = splitmix64(&st);
        sizes[i] = r % 3 == 0 ? edges[(r >> 8) % (sizeof edges / sizeof edges[0])] : (uint32_t)((r >> 8) % 70000);
        total += SL_FRAME_HEADER_LEN + SL_MAX_MESSAGE_LEN + sizes[i];
    }
    uint8_t *stream = malloc(total);
    size_t len = 0;
    sluice_GetSplitResponse resp = sluice_GetSplitResponse_init_zero;
    for (uint32_t i = 0; i < N; i++) {
        size_t head;
        cr_assert_eq(sl_frame_encode(SL_MSG_GET_SPLIT_RESP, i + 1, &resp, sizes[i], stream + len,
                                     SL_FRAME_HEADER_LEN + SL_MAX_MESSAGE_LEN, &head),
                     0);
        for (size_t j = 0; j < sizes[i]; j++)
            stream[len + head + j] = mix_byte(i, j);
        len += head + sizes[i];
    }
    int lfd, fd;
    struct event_base *base = event_base_new();
    struct mix_side m = {.sizes = sizes};
    const sl_conn_cbs_t cbs = {out_on_ready, mix_on_frame, out_on_close};
    out_connect(base, &cbs, &m.o, &fd, &lfd);
    int zero = 0;
    for (size_t at = 0; at < len;) {
        size_t piece = 1 + splitmix64(&st) % (256u << 10);
        if (piece > len - at)
            piece = len - at;
        cr_assert(pump_out(base, &zero, 0, fd, stream + at, piece), "the connection stopped taking bytes");
        at += piece;
    }
    cr_assert(pump_out(base, &m.o.frames, N, -1, NULL, 0), "%d of %d frames arrived", m.o.frames, N);
    cr_assert_eq(m.bad, 0, "%d frames wrong, the first: %s", m.bad, m.why);
    cr_assert_eq(m.o.closed, 0, "%s", m.o.close_why);
    uint8_t theirs[SL_HANDSHAKE_LEN];
    peer_read(fd, theirs, sizeof theirs); /* read, so that the close is a FIN, not a reset */
    close(fd);
    cr_assert(pump_out(base, &m.o.closed, 1, -1, NULL, 0), "the close went unnoticed");
    event_base_loop(base, EVLOOP_NONBLOCK); /* frees the closed connection */
    event_base_free(base);
    close(lfd);
    free(stream);
}

/* ---- SIGPIPE (net.h) ------------------------------------------------------ */

/* A write to a closed peer inside the guard fails with EPIPE and leaves
 * nothing behind: the process lives on (SIGPIPE's default would end it) and
 * no SIGPIPE is pending once the mask is back. */
Test(net, sigpipe_guard_turns_a_broken_pipe_into_epipe)
{
    signal(SIGPIPE, SIG_DFL);
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    close(sv[1]);
    sl_sigpipe_guard_t g;
    sl_sigpipe_block(&g);
    ssize_t n = write(sv[0], "x", 1);
    int e = errno;
    sl_sigpipe_unblock(&g);
    cr_assert_eq(n, -1);
    cr_assert_eq(e, EPIPE, "%s", strerror(e));
    sigset_t pending;
    cr_assert_eq(sigpending(&pending), 0);
    cr_assert_eq(sigismember(&pending, SIGPIPE), 0, "a SIGPIPE is still pending");
    sigset_t now;
    pthread_sigmask(SIG_SETMASK, NULL, &now);
    cr_assert_eq(sigismember(&now, SIGPIPE), 0, "SIGPIPE is still blocked");
    close(sv[0]);
}

/* ---- thread-local storage ------------------------------------------------- */

/* Every thread of a process gets the thread-local storage of the program
 * and of the libraries it was linked with, zeroed, at its creation, and
 * keeps it resident. Frame buffers of 128 KiB there made each thread of a
 * trainer (its thread pools, the iterator's own, an address lookup's)
 * 256 KiB heavier and 0.8 ms slower to start on a virtual machine. */
#define TLS_MOST (16 * 1024)

static int add_main_tls(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    if (info->dlpi_name && info->dlpi_name[0])
        return 0; /* a shared library: not this program's own code */
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_TLS)
            *(size_t *)arg += info->dlpi_phdr[i].p_memsz;
    return 0;
}

/* PT_TLS's size in the ELF file at path (64-bit). */
static size_t file_tls(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "%s: %s", path, strerror(errno));
    Elf64_Ehdr eh;
    cr_assert_eq(fread(&eh, sizeof eh, 1, f), 1u);
    cr_assert_eq(memcmp(eh.e_ident, ELFMAG, SELFMAG), 0, "%s is not an ELF file", path);
    cr_assert_eq(eh.e_ident[EI_CLASS], ELFCLASS64);
    size_t tls = 0;
    for (unsigned i = 0; i < eh.e_phnum; i++) {
        Elf64_Phdr ph;
        cr_assert_eq(fseek(f, (long)(eh.e_phoff + (Elf64_Off)i * eh.e_phentsize), SEEK_SET), 0);
        cr_assert_eq(fread(&ph, sizeof ph, 1, f), 1u);
        if (ph.p_type == PT_TLS)
            tls += ph.p_memsz;
    }
    fclose(f);
    return tls;
}

Test(conn, a_thread_carries_no_frame_buffer_of_its_own)
{
    size_t own = 0;
    dl_iterate_phdr(add_main_tls, &own);
    cr_assert_lt(own, TLS_MOST, "this program's threads each carry %zu bytes of thread-local storage", own);
    size_t lib = file_tls(SL_LIBSLUICE);
    cr_assert_lt(lib, TLS_MOST, "%s gives every thread of a trainer %zu bytes of thread-local storage", SL_LIBSLUICE,
                 lib);
}
