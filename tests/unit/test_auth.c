/*
 * test_auth.c: the cluster token, TLS and the connection limits of
 * protocol/conn.c (sl_conn_env_t), between a server that accepts with an env
 * on its own thread and sl_rpc_open() (or a raw socket) as the peer.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/listener.h>

#include "auth.h"
#include "conn.h"
#include "frame.h"
#include "net.h"
#include "rpc.h"

#define WAIT_MS 5000

/* ---- a server on its own loop ---------------------------------------------- */

static struct {
    struct event_base *base;
    struct evconnlistener *lis;
    uint16_t port;
    sl_conn_env_t env;
    sl_auth_t auth;
    sl_limits_t limits;
    pthread_t thread;
    atomic_bool stop;
    bool answer;               /* answer GET_SPLIT_REQ (else leave requests unanswered) */
    bool stream;               /* answer GET_SPLIT_REQ with the frames of stream_sizes() */
    atomic_long queued;        /* stream: what the socket did not take once all were sent, +1 */
    int sndbuf;                /* > 0: SO_SNDBUF of accepted sockets */
    sl_conn_t *open[256];      /* accepted and not closed: closed by server_stop() */
    atomic_int closed;
    char close_why[1200];
    int close_err;
} S;

static void stream_send(sl_conn_t *c, const sluice_GetSplitRequest *q);

static void srv_frame(sl_conn_t *c, const sl_frame_hdr_t *hdr, void *msg, uint8_t *payload, void *arg)
{
    (void)arg;
    free(payload);
    if (S.stream && hdr->type == SL_MSG_GET_SPLIT_REQ) {
        stream_send(c, msg);
        return;
    }
    if (S.answer && hdr->type == SL_MSG_GET_SPLIT_REQ) {
        sluice_GetSplitResponse resp = sluice_GetSplitResponse_init_zero;
        resp.epoch = 7;
        sl_conn_send(c, SL_MSG_GET_SPLIT_RESP, hdr->request_id, &resp, NULL, 0, NULL, NULL);
    }
}

static void srv_close(sl_conn_t *c, int err, const char *why, void *arg)
{
    (void)arg;
    for (size_t i = 0; i < sizeof S.open / sizeof S.open[0]; i++)
        if (S.open[i] == c)
            S.open[i] = NULL;
    S.close_err = err;
    snprintf(S.close_why, sizeof S.close_why, "%s", why ? why : "");
    atomic_fetch_add(&S.closed, 1);
}

static const sl_conn_cbs_t srv_cbs = {NULL, srv_frame, srv_close};

static void srv_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen, void *arg)
{
    (void)l;
    (void)sa;
    (void)salen;
    (void)arg;
    if (S.sndbuf > 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &S.sndbuf, sizeof S.sndbuf);
    sl_conn_t *c = sl_conn_accept(S.base, fd, &S.env, SL_ROLE_DISPATCHER,
                                  (1u << SL_ROLE_CLIENT) | (1u << SL_ROLE_WORKER), &S.limits, &srv_cbs, NULL);
    for (size_t i = 0; c && i < sizeof S.open / sizeof S.open[0]; i++)
        if (!S.open[i]) {
            S.open[i] = c;
            break;
        }
}

static void on_poll(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    if (atomic_load(&S.stop))
        event_base_loopbreak(arg);
}

static void *srv_thread(void *arg)
{
    (void)arg;
    struct event *t = event_new(S.base, -1, EV_PERSIST, on_poll, S.base);
    struct timeval tv = {0, 10000};
    event_add(t, &tv);
    event_base_dispatch(S.base);
    event_free(t);
    return NULL;
}

/* Starts the server with S.env and S.auth as the test set them. */
static void server_start(const char *bind_host)
{
    S.limits.max_payload = 1u << 20;
    S.env.auth = &S.auth;
    S.base = event_base_new();
    int fd;
    char err[256];
    cr_assert_eq(sl_listen_tcp(bind_host, 0, &fd, &S.port, err, sizeof err), 0, "%s", err);
    S.lis = evconnlistener_new(S.base, srv_accept, NULL, LEV_OPT_CLOSE_ON_FREE, -1, fd);
    cr_assert_not_null(S.lis);
    cr_assert_eq(pthread_create(&S.thread, NULL, srv_thread, NULL), 0);
}

static void server_stop(void)
{
    atomic_store(&S.stop, true);
    pthread_join(S.thread, NULL);
    /* Connections still open (a peer the test left open, or whose close the
     * loop had not read yet) close with the server, and the loop runs what
     * their close deferred, so that nothing leaks. */
    for (size_t i = 0; i < sizeof S.open / sizeof S.open[0]; i++)
        if (S.open[i]) {
            sl_conn_close(S.open[i]);
            S.open[i] = NULL;
        }
    event_base_loop(S.base, EVLOOP_NONBLOCK);
    evconnlistener_free(S.lis);
    event_base_free(S.base);
    sl_auth_free(&S.auth);
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static bool wait_closed(int n)
{
    long long end = now_ms() + WAIT_MS;
    while (atomic_load(&S.closed) < n && now_ms() < end)
        usleep(2000);
    return atomic_load(&S.closed) >= n;
}

/* ---- files --------------------------------------------------------------------- */

static char dir[64];

static void make_dir(void)
{
    snprintf(dir, sizeof dir, "/tmp/sluice-auth-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void remove_dir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

static const char *token_file(const char *name, const char *token)
{
    static char paths[4][128];
    static int next;
    char *p = paths[next++ % 4];
    snprintf(p, 128, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f);
    fprintf(f, "%s\n", token);
    fclose(f);
    chmod(p, 0600);
    return p;
}

static void load(sl_auth_t *a, const char *token_path)
{
    char err[512];
    sl_auth_opts_t o = {.token_file = token_path};
    cr_assert_eq(sl_auth_load(a, &o, err, sizeof err), 0, "%s", err);
}

/* Opens an rpc as a worker with auth a; @return its code, err filled. */
static int open_as_worker(const sl_auth_t *a, char *err, size_t errlen, sl_rpc_t **out)
{
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", S.port);
    sl_conn_env_t env = {.auth = a};
    sl_limits_t lim = {.max_payload = 1u << 20};
    return sl_rpc_open(addr, &env, SL_ROLE_WORKER, SL_ROLE_DISPATCHER, &lim, WAIT_MS, out, err, errlen);
}

static void expect_call_works(sl_rpc_t *r)
{
    char err[512] = "";
    sluice_GetSplitRequest q = {.task_id = 1, .max_splits = 1};
    sluice_GetSplitResponse *resp = calloc(1, sizeof *resp);
    int rc = sl_rpc_call(r, SL_MSG_GET_SPLIT_REQ, &q, NULL, 0, SL_MSG_GET_SPLIT_RESP, resp, NULL, NULL, WAIT_MS, err,
                         sizeof err);
    cr_assert_eq(rc, 0, "rc %d: %s", rc, err);
    cr_assert_eq(resp->epoch, 7);
    free(resp);
}

/* ---- the token ------------------------------------------------------------------ */

Test(auth, same_token_both_sides_serves)
{
    make_dir();
    const char *tok = token_file("t", "0123456789abcdef0123456789abcdef");
    load(&S.auth, tok);
    S.answer = true;
    server_start("127.0.0.1");
    sl_auth_t mine;
    load(&mine, tok);
    char err[512] = "";
    sl_rpc_t *r = NULL;
    int rc = open_as_worker(&mine, err, sizeof err, &r);
    cr_assert_eq(rc, 0, "rc %d: %s", rc, err);
    expect_call_works(r);
    sl_rpc_close(r);
    sl_auth_free(&mine);
    server_stop();
    cr_assert_eq(S.env.refused_auth, 0);
    remove_dir();
}

Test(auth, a_peer_without_the_token_is_refused)
{
    make_dir();
    load(&S.auth, token_file("t", "0123456789abcdef0123456789abcdef"));
    server_start("127.0.0.1");
    sl_auth_t none = {0};
    char err[512] = "";
    sl_rpc_t *r = NULL;
    int rc = open_as_worker(&none, err, sizeof err, &r);
    cr_assert_eq(rc, SL_EAUTH, "rc %d (%s): %s", rc, sl_strerror(rc), err);
    cr_assert(strstr(err, "authentication required") && strstr(err, "--auth-token-file"), "%s", err);
    cr_assert(wait_closed(1));
    server_stop();
    cr_assert_eq(S.env.refused_auth, 1);
    remove_dir();
}

Test(auth, a_server_without_a_token_is_refused_by_a_client_with_one)
{
    make_dir();
    server_start("127.0.0.1"); /* no token */
    sl_auth_t mine;
    load(&mine, token_file("t", "0123456789abcdef0123456789abcdef"));
    char err[512] = "";
    sl_rpc_t *r = NULL;
    int rc = open_as_worker(&mine, err, sizeof err, &r);
    cr_assert_eq(rc, SL_EAUTH, "rc %d: %s", rc, err);
    cr_assert(strstr(err, "without a cluster token"), "%s", err);
    sl_auth_free(&mine);
    server_stop();
    remove_dir();
}

Test(auth, another_token_is_refused_on_both_sides)
{
    make_dir();
    load(&S.auth, token_file("t", "0123456789abcdef0123456789abcdef"));
    server_start("127.0.0.1");
    sl_auth_t other;
    load(&other, token_file("u", "0123456789abcdef0123456789abcdeX"));
    char err[512] = "";
    sl_rpc_t *r = NULL;
    int rc = open_as_worker(&other, err, sizeof err, &r);
    cr_assert_eq(rc, SL_EAUTH, "rc %d: %s", rc, err);
    cr_assert(strstr(err, "did not prove it holds the cluster token"), "%s", err);
    sl_auth_free(&other);
    server_stop();
    remove_dir();
}

/* The proof is bound to the hellos: the same token over other nonces, or
 * the acceptor's proof played back as the connector's, does not match. */
Test(auth, proofs_are_bound_to_nonces_and_sides)
{
    sl_auth_t a = {0};
    memcpy(a.token, "0123456789abcdef", 16);
    a.token_len = 16;
    uint8_t hc[SL_HANDSHAKE_LEN], hs[SL_HANDSHAKE_LEN], n1[SL_HELLO_NONCE_LEN] = {1}, n2[SL_HELLO_NONCE_LEN] = {2};
    sl_handshake_encode(hc, SL_ROLE_CLIENT, SL_HELLO_TOKEN, n1);
    sl_handshake_encode(hs, SL_ROLE_DISPATCHER, SL_HELLO_TOKEN, n2);
    uint8_t p1[SL_AUTH_PROOF_LEN], p2[SL_AUTH_PROOF_LEN], p3[SL_AUTH_PROOF_LEN];
    sl_auth_proof(&a, true, hc, hs, SL_HANDSHAKE_LEN, p1);
    sl_auth_proof(&a, false, hc, hs, SL_HANDSHAKE_LEN, p2);
    cr_assert_not(sl_auth_proof_eq(p1, p2), "an acceptor's proof is no connector's");
    sl_handshake_encode(hs, SL_ROLE_DISPATCHER, SL_HELLO_TOKEN, n1);
    sl_auth_proof(&a, true, hc, hs, SL_HANDSHAKE_LEN, p3);
    cr_assert_not(sl_auth_proof_eq(p1, p3), "another nonce, another proof");
    sl_auth_proof(&a, true, hc, hs, SL_HANDSHAKE_LEN, p2);
    cr_assert(sl_auth_proof_eq(p3, p2), "the same hellos, the same proof");
}

Test(auth, token_files_are_checked)
{
    make_dir();
    sl_auth_t a;
    char err[512];
    sl_auth_opts_t o = {.token_file = token_file("short", "abc")};
    cr_assert_eq(sl_auth_load(&a, &o, err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "3 bytes") && strstr(err, "short"), "%s", err);
    o.token_file = "/nonexistent/token";
    cr_assert_eq(sl_auth_load(&a, &o, err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "/nonexistent/token"), "%s", err);
    /* SLUICE_AUTH_TOKEN_FILE stands in for a missing option. */
    setenv("SLUICE_AUTH_TOKEN_FILE", token_file("env", "  0123456789abcdefXYZ  \nsecond line"), 1);
    o.token_file = NULL;
    cr_assert_eq(sl_auth_load(&a, &o, err, sizeof err), 0, "%s", err);
    cr_assert_eq(a.token_len, 19, "the first line, trimmed");
    cr_assert(sl_auth_protects(&a));
    sl_auth_free(&a);
    unsetenv("SLUICE_AUTH_TOKEN_FILE");
    sl_auth_opts_t partial = {.tls_cert = "x.pem"};
    cr_assert_eq(sl_auth_load(&a, &partial, err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "all three"), "%s", err);
    remove_dir();
}

/* ---- TLS ----------------------------------------------------------------------- */

/* A CA and a certificate it signed, with the openssl command. */
static void make_cert(const char *ca, const char *name)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "cd %s && { [ -e %s.pem ] || openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
             "-days 2 -keyout %s.key -out %s.pem -subj /CN=%s; } && "
             "openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout %s.key -out %s.csr "
             "-subj /CN=%s && openssl x509 -req -in %s.csr -CA %s.pem -CAkey %s.key -CAcreateserial -days 2 "
             "-out %s.pem",
             dir, ca, ca, ca, ca, name, name, name, name, ca, ca, name);
    char quiet[2200];
    snprintf(quiet, sizeof quiet, "(%s) >/dev/null 2>&1", cmd);
    cr_assert_eq(system(quiet), 0, "openssl could not make %s (scripts/install-deps.sh installs openssl)", name);
}

static void load_tls(sl_auth_t *a, const char *ca, const char *name)
{
    char cert[128], key[128], cap[128], err[512];
    snprintf(cert, sizeof cert, "%s/%s.pem", dir, name);
    snprintf(key, sizeof key, "%s/%s.key", dir, name);
    snprintf(cap, sizeof cap, "%s/%s.pem", dir, ca);
    sl_auth_opts_t o = {.tls_cert = cert, .tls_key = key, .tls_ca = cap};
    cr_assert_eq(sl_auth_load(a, &o, err, sizeof err), 0, "%s", err);
}

Test(auth, tls_with_certificates_of_the_cluster_ca_serves)
{
    make_dir();
    make_cert("ca", "server");
    make_cert("ca", "client");
    load_tls(&S.auth, "ca", "server");
    S.answer = true;
    server_start("127.0.0.1");
    sl_auth_t mine;
    load_tls(&mine, "ca", "client");
    char err[512] = "";
    sl_rpc_t *r = NULL;
    int rc = open_as_worker(&mine, err, sizeof err, &r);
    cr_assert_eq(rc, 0, "rc %d: %s", rc, err);
    for (int i = 0; i < 3; i++)
        expect_call_works(r);
    sl_rpc_close(r);
    sl_auth_free(&mine);
    server_stop();
    remove_dir();
}

Test(auth, tls_refuses_a_certificate_of_another_ca)
{
    make_dir();
    make_cert("ca", "server");
    make_cert("evil", "intruder");
    load_tls(&S.auth, "ca", "server");
    server_start("127.0.0.1");
    sl_auth_t mine;
    load_tls(&mine, "ca", "intruder"); /* trusts our CA, shows another's certificate */
    char err[512] = "";
    sl_rpc_t *r = NULL;
    int rc = open_as_worker(&mine, err, sizeof err, &r);
    cr_assert_neq(rc, 0, "a certificate of another CA was accepted");
    cr_assert(wait_closed(1));
    cr_assert(strstr(S.close_why, "TLS") && strstr(S.close_why, "certificate"), "%s", S.close_why);
    sl_rpc_close(r);
    sl_auth_free(&mine);
    server_stop();
    cr_assert_eq(S.env.refused_auth, 1);
    remove_dir();
}

/* ---- TLS bulk path (protocol/tlsio.c) ------------------------------------------------- */

/* Frames of random sizes from 0 to the 1 MiB limit, tiny ones (many to a
 * TLS record) most often: frame i of seed's stream has stream_sizes()[i]
 * bytes of pattern from offset i % 4093. */
#define STREAM_FRAMES 1000
static uint8_t pattern[(1u << 20) + 4096];
static uint32_t stream_size[STREAM_FRAMES];

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void stream_plan(uint64_t seed)
{
    uint64_t x = seed;
    for (size_t i = 0; i < sizeof pattern; i++)
        pattern[i] = (uint8_t)(splitmix(&x) >> 56);
    for (int i = 0; i < STREAM_FRAMES; i++) {
        uint64_t r = splitmix(&x) % 100;
        stream_size[i] = r < 70   ? (uint32_t)(splitmix(&x) % 65)
                         : r < 93 ? (uint32_t)(65 + splitmix(&x) % 40000)
                                  : (1u << 20);
    }
    /* It ends with more than a small socket buffer takes at once. */
    stream_size[STREAM_FRAMES - 1] = 1u << 20;
}

static void no_release(const void *data, size_t len, void *extra)
{
    (void)data;
    (void)len;
    (void)extra;
}

/* Server: every frame of the stream at once, then how much waits. */
static void stream_send(sl_conn_t *c, const sluice_GetSplitRequest *q)
{
    (void)q;
    sluice_GetSplitResponse resp = sluice_GetSplitResponse_init_zero;
    for (int i = 0; i < STREAM_FRAMES; i++) {
        resp.epoch = (uint64_t)i;
        int rc = sl_conn_send(c, SL_MSG_GET_SPLIT_RESP, 0, &resp, pattern + i % 4093, stream_size[i], no_release,
                              NULL);
        cr_assert_eq(rc, 0, "frame %d: %d", i, rc);
    }
    atomic_store(&S.queued, (long)sl_conn_pending(c) + 1);
}

struct stream_client {
    sl_conn_t *conn;
    bool ready, closed;
    int frames;
    uint64_t seed;
    char why[600];
};

static void cl_ready(sl_conn_t *c, void *arg)
{
    (void)arg;
    sluice_GetSplitRequest q = {.task_id = 1, .max_splits = 1};
    cr_assert_eq(sl_conn_send(c, SL_MSG_GET_SPLIT_REQ, 1, &q, NULL, 0, NULL, NULL), 0);
    ((struct stream_client *)arg)->ready = true;
}

static void cl_frame(sl_conn_t *c, const sl_frame_hdr_t *hdr, void *msg, uint8_t *payload, void *arg)
{
    struct stream_client *k = arg;
    (void)c;
    const sluice_GetSplitResponse *resp = msg;
    int i = k->frames++;
    cr_assert_lt(i, STREAM_FRAMES, "seed %llu: more frames than were sent", (unsigned long long)k->seed);
    cr_assert_eq(resp->epoch, (uint64_t)i, "seed %llu: frame %llu where %d was next", (unsigned long long)k->seed,
                 (unsigned long long)resp->epoch, i);
    cr_assert_eq(hdr->payload_len, stream_size[i], "seed %llu: frame %d has %u bytes, not %u",
                 (unsigned long long)k->seed, i, hdr->payload_len, stream_size[i]);
    cr_assert(stream_size[i] == 0 || memcmp(payload, pattern + i % 4093, stream_size[i]) == 0,
              "seed %llu: frame %d's payload differs", (unsigned long long)k->seed, i);
    free(payload);
}

static void cl_close(sl_conn_t *c, int err, const char *why, void *arg)
{
    struct stream_client *k = arg;
    (void)c;
    k->closed = true;
    snprintf(k->why, sizeof k->why, "%d: %s", err, why);
}

/* Under TLS, frames of every size from none to the limit arrive whole and
 * in order, also when the server queued far more than the sockets hold
 * before the client read any of it (records gathered and written as the
 * socket takes them; records read ahead many at a time). The server's send
 * buffer is small, so that what was gathered last waits for the socket. */
Test(auth, tls_streams_frames_of_every_size_whole_and_in_order, .timeout = 120)
{
    uint64_t seed = (uint64_t)time(NULL);
    const char *env_seed = getenv("SL_TEST_SEED");
    if (env_seed)
        seed = strtoull(env_seed, NULL, 10);
    cr_log_info("tls stream: seed %llu (SL_TEST_SEED=%llu repeats it)", (unsigned long long)seed,
                (unsigned long long)seed);
    stream_plan(seed);
    make_dir();
    make_cert("ca", "server");
    make_cert("ca", "client");
    load_tls(&S.auth, "ca", "server");
    S.stream = true;
    S.sndbuf = 65536;
    server_start("127.0.0.1");
    sl_auth_t mine;
    load_tls(&mine, "ca", "client");
    struct event_base *base = event_base_new();
    struct stream_client k = {.seed = seed};
    char addr[64], err[512] = "";
    snprintf(addr, sizeof addr, "127.0.0.1:%u", S.port);
    sl_conn_env_t env = {.auth = &mine};
    sl_limits_t lim = {.max_payload = 1u << 20};
    static const sl_conn_cbs_t cbs = {cl_ready, cl_frame, cl_close};
    cr_assert_eq(sl_conn_connect(base, addr, &env, SL_ROLE_WORKER, SL_ROLE_DISPATCHER, &lim, WAIT_MS, &cbs, &k,
                                 &k.conn, err, sizeof err),
                 0, "%s", err);
    /* Until the request is out; then the client reads nothing until the
     * server queued the whole stream. */
    long long end = now_ms() + WAIT_MS;
    while (!k.closed && !(k.ready && sl_conn_pending(k.conn) == 0) && now_ms() < end)
        event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
    cr_assert(k.ready && !k.closed, "seed %llu: no handshake: %s", (unsigned long long)seed, k.why);
    while (atomic_load(&S.queued) == 0 && now_ms() < end)
        usleep(2000);
    long queued = atomic_load(&S.queued) - 1;
    cr_assert_gt(queued, 0, "seed %llu: the sockets took the whole stream: nothing was left to gather",
                 (unsigned long long)seed);
    end = now_ms() + 60000;
    while (!k.closed && k.frames < STREAM_FRAMES && now_ms() < end)
        event_base_loop(base, EVLOOP_ONCE);
    cr_assert_eq(k.frames, STREAM_FRAMES, "seed %llu: %d of %d frames (%s)", (unsigned long long)seed, k.frames,
                 STREAM_FRAMES, k.closed ? k.why : "still open");
    cr_assert(!k.closed, "seed %llu: %s", (unsigned long long)seed, k.why);
    sl_conn_close(k.conn);
    event_base_loop(base, EVLOOP_NONBLOCK);
    event_base_free(base);
    sl_auth_free(&mine);
    /* The server sees the close on its own thread: wait for it, then stop. */
    cr_assert(wait_closed(1), "the server did not see the client close");
    server_stop();
    cr_assert_eq(atomic_load(&S.closed), 1, "%s", S.close_why);
    remove_dir();
}

/* ---- limits on accepted connections --------------------------------------------- */

static int raw_connect(const char *host)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(S.port)};
    inet_pton(AF_INET, host, &a.sin_addr);
    struct timeval tv = {WAIT_MS / 1000, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "connect: %s", strerror(errno));
    return fd;
}

/* Reads until EOF and returns the error frame's message (id 0) and code. */
static int read_refusal(int fd, size_t skip, char *msg, size_t len)
{
    static uint8_t buf[1 << 16];
    size_t have = 0;
    for (;;) {
        ssize_t r = recv(fd, buf + have, sizeof buf - have, 0);
        if (r <= 0)
            break;
        have += (size_t)r;
    }
    cr_assert_gt(have, skip + SL_FRAME_HEADER_LEN, "no error frame (%zu bytes)", have);
    sl_limits_t lim = {0};
    sl_frame_t f;
    size_t used;
    char err[256];
    cr_assert_eq(sl_frame_decode(buf + skip, have - skip, &lim, &f, &used, err, sizeof err), 1, "%s", err);
    cr_assert_eq(f.hdr.type, SL_MSG_ERROR);
    const sluice_Error *e = f.msg;
    int code = e->code;
    snprintf(msg, len, "%s", e->message);
    sl_frame_clear(&f);
    return code;
}

static void send_hello(int fd, sl_role_t role)
{
    uint8_t hs[SL_HANDSHAKE_LEN], nonce[SL_HELLO_NONCE_LEN] = {0};
    sl_handshake_encode(hs, role, 0, nonce);
    cr_assert_eq(send(fd, hs, sizeof hs, MSG_NOSIGNAL), (ssize_t)sizeof hs);
}

Test(limits, connections_past_the_limit_are_refused_with_the_reason)
{
    S.env.max_conns = 2;
    S.answer = true;
    server_start("127.0.0.1");
    int a = raw_connect("127.0.0.1"), b = raw_connect("127.0.0.1");
    send_hello(a, SL_ROLE_CLIENT);
    send_hello(b, SL_ROLE_CLIENT);
    uint8_t hs[SL_HANDSHAKE_LEN];
    cr_assert_eq(recv(a, hs, sizeof hs, MSG_WAITALL), (ssize_t)sizeof hs, "the first two are served");
    cr_assert_eq(recv(b, hs, sizeof hs, MSG_WAITALL), (ssize_t)sizeof hs);
    int c = raw_connect("127.0.0.1");
    char msg[1100];
    cr_assert_eq(read_refusal(c, 0, msg, sizeof msg), SL_ELIMIT);
    cr_assert(strstr(msg, "--max-connections"), "%s", msg);
    close(c);
    /* One goes, and a new one is served again. */
    close(a);
    cr_assert(wait_closed(1));
    int d = raw_connect("127.0.0.1");
    send_hello(d, SL_ROLE_CLIENT);
    cr_assert_eq(recv(d, hs, sizeof hs, MSG_WAITALL), (ssize_t)sizeof hs, "a slot that came free is used again");
    close(b);
    close(d);
    server_stop();
    cr_assert_eq(S.env.refused_conns, 1);
}

/* A peer that sends a byte now and then does not keep its handshake alive. */
Test(limits, handshake_deadline_counts_from_the_accept)
{
    S.env.handshake_ms = 300;
    server_start("127.0.0.1");
    int fd = raw_connect("127.0.0.1");
    uint8_t hs[SL_HANDSHAKE_LEN], nonce[SL_HELLO_NONCE_LEN] = {0};
    sl_handshake_encode(hs, SL_ROLE_CLIENT, 0, nonce);
    size_t sent = 0;
    /* One byte every 20 ms would take 880 ms for the hello; the server
     * must close first. Bounded: stops at the hello's last byte but one. */
    while (sent + 1 < sizeof hs && atomic_load(&S.closed) == 0) {
        if (send(fd, hs + sent, 1, MSG_NOSIGNAL) != 1)
            break;
        sent++;
        usleep(20000);
    }
    cr_assert(wait_closed(1), "a trickling handshake outlived its deadline (%zu bytes sent)", sent);
    cr_assert(strstr(S.close_why, "no whole handshake within 300 ms"), "%s", S.close_why);
    close(fd);
    server_stop();
    cr_assert_eq(S.env.expired_handshakes, 1);
}

Test(limits, unfinished_frames_past_the_bound_are_dropped)
{
    S.env.max_partial_bytes = 256 * 1024;
    server_start("127.0.0.1");
    int fd = raw_connect("127.0.0.1");
    send_hello(fd, SL_ROLE_WORKER);
    uint8_t hs[SL_HANDSHAKE_LEN];
    cr_assert_eq(recv(fd, hs, sizeof hs, MSG_WAITALL), (ssize_t)sizeof hs);
    /* A frame that claims 1 MiB (within max_payload) and sends 512 KiB. */
    uint8_t head[SL_FRAME_HEADER_LEN + 64];
    size_t len;
    sluice_GetSplitRequest q = {.task_id = 1};
    cr_assert_eq(sl_frame_encode(SL_MSG_GET_SPLIT_REQ, 1, &q, 1u << 20, head, sizeof head, &len), 0);
    cr_assert_eq(send(fd, head, len, MSG_NOSIGNAL), (ssize_t)len);
    static uint8_t junk[512 * 1024];
    size_t off = 0;
    while (off < sizeof junk) {
        ssize_t w = send(fd, junk + off, sizeof junk - off, MSG_NOSIGNAL);
        if (w <= 0)
            break; /* the server closed on us */
        off += (size_t)w;
    }
    char msg[1100];
    cr_assert_eq(read_refusal(fd, 0, msg, sizeof msg), SL_ELIMIT);
    cr_assert(strstr(msg, "--max-partial-frame-mb"), "%s", msg);
    cr_assert(wait_closed(1));
    close(fd);
    server_stop();
    cr_assert_eq(S.env.refused_partial, 1);
    cr_assert_eq(S.env.partial_bytes, 0, "%zu bytes still counted", S.env.partial_bytes);
}

Test(limits, idle_connections_close_unless_owed_an_answer)
{
    S.env.idle_ms = 200;
    S.answer = false; /* requests stay unanswered: the connection is owed one */
    server_start("127.0.0.1");
    int quiet = raw_connect("127.0.0.1"), waiting = raw_connect("127.0.0.1");
    send_hello(quiet, SL_ROLE_WORKER);
    send_hello(waiting, SL_ROLE_WORKER);
    uint8_t hs[SL_HANDSHAKE_LEN];
    cr_assert_eq(recv(quiet, hs, sizeof hs, MSG_WAITALL), (ssize_t)sizeof hs);
    cr_assert_eq(recv(waiting, hs, sizeof hs, MSG_WAITALL), (ssize_t)sizeof hs);
    uint8_t f[SL_FRAME_HEADER_LEN + 64];
    size_t len;
    sluice_GetSplitRequest q = {.task_id = 1};
    cr_assert_eq(sl_frame_encode(SL_MSG_GET_SPLIT_REQ, 9, &q, 0, f, sizeof f, &len), 0);
    cr_assert_eq(send(waiting, f, len, MSG_NOSIGNAL), (ssize_t)len);
    char msg[1100];
    cr_assert_eq(read_refusal(quiet, 0, msg, sizeof msg), -ETIMEDOUT);
    cr_assert(strstr(msg, "--idle-timeout-ms"), "%s", msg);
    /* Five idle periods later the one owed an answer is still open. */
    usleep(5 * 200 * 1000);
    cr_assert_eq(atomic_load(&S.closed), 1, "a connection waiting for its answer was closed: %s", S.close_why);
    close(quiet);
    close(waiting);
    server_stop();
    cr_assert_eq(S.env.closed_idle, 1);
}

/* A local address that is not loopback, or false when the host has none. */
static bool outside_address(char *out, size_t len)
{
    struct ifaddrs *ifs, *i;
    bool found = false;
    if (getifaddrs(&ifs) != 0)
        return false;
    for (i = ifs; i && !found; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET)
            continue;
        const struct sockaddr_in *a = (const struct sockaddr_in *)i->ifa_addr;
        if ((ntohl(a->sin_addr.s_addr) >> 24) == 127)
            continue;
        inet_ntop(AF_INET, &a->sin_addr, out, (socklen_t)len);
        found = true;
    }
    freeifaddrs(ifs);
    return found;
}

Test(limits, protected_mode_serves_loopback_only)
{
    char outside[64];
    if (!outside_address(outside, sizeof outside)) {
        cr_skip_test("this host has no address but loopback: protected mode cannot be tried from outside");
    }
    S.env.loopback_only = true;
    server_start("0.0.0.0");
    int in = raw_connect("127.0.0.1");
    send_hello(in, SL_ROLE_CLIENT);
    uint8_t hs[SL_HANDSHAKE_LEN];
    cr_assert_eq(recv(in, hs, sizeof hs, MSG_WAITALL), (ssize_t)sizeof hs, "a loopback peer is served");
    int out = raw_connect(outside);
    char msg[1100];
    cr_assert_eq(read_refusal(out, 0, msg, sizeof msg), SL_EAUTH);
    cr_assert(strstr(msg, "protected mode") && strstr(msg, "--insecure"), "%s", msg);
    close(in);
    close(out);
    server_stop();
    cr_assert_eq(S.env.refused_remote, 1);
}
