/*
 * fuzz_admin.c: libFuzzer target for the admin endpoint's request handling
 * (common/admin.c): what an HTTP client sends it, parsed by libevent's
 * evhttp, then routed, authorized ("Authorization: Bearer" or Basic with
 * the token as the password), answered with JSON, and libevent's own error
 * pages rewritten into JSON on their way out.
 *
 * The input is the bytes a client sends on one connection (any number of
 * requests). The target runs a real endpoint on 127.0.0.1 with a token and
 * routes like the dispatcher's (a probe, an exact path, a prefix, a POST
 * that reads a JSON body with sl_admin_body, a DELETE), writes the input to
 * a new connection, half-closes it and runs the event loop until the
 * endpoint closes it.
 *
 * Beyond "no crash, no leak": the endpoint closes the connection (no
 * hang); every answer it writes (up to a reset, which may cut the last) is
 * a whole HTTP response with a known
 * status and a JSON object for a body (with "error" for a failure); a
 * route that changes state runs only with the token in the Authorization
 * header; a body sl_admin_body accepts is a JSON object, and one it
 * refuses gets a message.
 * Run it with scripts/fuzz.sh (FUZZ_TARGETS=fuzz_admin).
 */
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>

#include "admin.h"

#include "fuzz_check.h"

#define TOKEN "fuzz-admin-token"

static struct event_base *base;
static sl_admin_t *admin;
static uint16_t port;

/* ---- the token, as a route that changes state must have seen it ---- */

static int b64(int c)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const char *k = c ? strchr(abc, c) : NULL;
    return k ? (int)(k - abc) : -1;
}

/* Whether h carries the token: "Bearer TOKEN", or "Basic " and base64 of
 * "user:TOKEN" (read up to a '=' or the end; a NUL ends the text). */
static bool carries_token(const char *h)
{
    if (!h)
        return false;
    if (strncmp(h, "Bearer ", 7) == 0)
        return strcmp(h + 7, TOKEN) == 0;
    if (strncmp(h, "Basic ", 6) != 0)
        return false;
    char out[600];
    size_t n = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (const char *p = h + 6; *p && *p != '='; p++) {
        int v = b64((unsigned char)*p);
        if (v < 0)
            return false;
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (n + 1 >= sizeof out)
                return false;
            out[n++] = (char)(acc >> bits & 0xff);
        }
    }
    out[n] = '\0';
    const char *colon = strchr(out, ':');
    return colon && strcmp(colon + 1, TOKEN) == 0;
}

/* ---- routes ---- */

static int get_json(struct evhttp_request *req, const char *rest, json_t **body, void *arg)
{
    (void)req;
    (void)arg;
    *body = json_pack("{s:I}", "rest", (json_int_t)strlen(rest));
    return 200;
}

static int post_json(struct evhttp_request *req, const char *rest, json_t **body, void *arg)
{
    (void)arg;
    CHECK(carries_token(evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization")));
    json_t *error = NULL;
    json_t *in = sl_admin_body(req, &error);
    if (!in) {
        CHECK(error != NULL && json_is_string(json_object_get(error, "error")));
        *body = error;
        return 400;
    }
    CHECK(error == NULL && json_is_object(in));
    *body = json_pack("{s:I,s:o}", "rest", (json_int_t)strlen(rest), "body", in);
    return 200;
}

static int delete_json(struct evhttp_request *req, const char *rest, json_t **body, void *arg)
{
    (void)arg;
    CHECK(carries_token(evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization")));
    if (!*rest) {
        *body = sl_admin_error("no id");
        return 404;
    }
    *body = json_pack("{s:I,s:b}", "id", (json_int_t)strlen(rest), "deleted", 1);
    return 200;
}

static void start(void)
{
    signal(SIGPIPE, SIG_IGN);
    CHECK((base = event_base_new()) != NULL);
    char err[256];
    CHECK(sl_admin_start(base, "127.0.0.1", 0, &port, &admin, err, sizeof err) == 0);
    sl_admin_set_token(admin, TOKEN);
    CHECK(sl_admin_route(admin, EVHTTP_REQ_GET, "/healthz", get_json, NULL) == 0);
    CHECK(sl_admin_route(admin, EVHTTP_REQ_GET, "/v1/jobs", get_json, NULL) == 0);
    CHECK(sl_admin_route(admin, EVHTTP_REQ_GET, "/v1/jobs/", get_json, NULL) == 0);
    CHECK(sl_admin_route(admin, EVHTTP_REQ_DELETE, "/v1/jobs/", delete_json, NULL) == 0);
    CHECK(sl_admin_route(admin, EVHTTP_REQ_POST, "/v1/workers/", post_json, NULL) == 0);
    CHECK(sl_admin_route(admin, EVHTTP_REQ_PUT, "/v1/put", post_json, NULL) == 0);
}

/* ---- one connection ---- */

struct conn {
    struct evbuffer *in;
    bool closed, reset, timed_out;
};

static void on_read(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;
    if (what & EV_TIMEOUT) {
        c->timed_out = true;
        event_base_loopbreak(base);
        return;
    }
    int n = evbuffer_read(c->in, fd, 65536);
    if (n <= 0) {
        /* A reset (the endpoint closed with input unread) may drop the end
         * of what it wrote. */
        c->reset = n < 0;
        c->closed = true;
        event_base_loopbreak(base);
    }
}

static bool known_status(int s)
{
    switch (s) {
    case 100: case 200: case 400: case 401: case 404: case 405: case 413: case 417: case 501: return true;
    default: return false;
    }
}

/* Every answer: a status line (libevent echoes the request's version,
 * also 0.x), headers, a JSON object of Content-Length
 * bytes (an interim 100 has none; a HEAD answer may leave the body out). */
static void check_answers(const char *p, size_t len, bool reset)
{
    while (len > 0) {
        const char *end = memmem(p, len, "\r\n\r\n", 4);
        if (!end && reset)
            return;
        CHECK(end != NULL);
        size_t hlen = (size_t)(end - p) + 4;
        char *head = strndup(p, hlen);
        CHECK(head != NULL);
        int status = 0;
        if (sscanf(head, "HTTP/%*d.%*d %3d", &status) != 1 || !known_status(status))
            fprintf(stderr, "fuzz_admin: an answer of status %d:\n%s\n", status, head);
        CHECK(known_status(status));
        p += hlen;
        len -= hlen;
        if (status == 100) {
            free(head);
            continue;
        }
        if (!strcasestr(head, "\r\nContent-Type: application/json\r\n"))
            fprintf(stderr, "fuzz_admin: an answer that is not JSON:\n%s%.*s\n", head, (int)len, p);
        CHECK(strcasestr(head, "\r\nContent-Type: application/json\r\n") != NULL);
        /* Without a Content-Length (HTTP/1.0), the body runs to the close. */
        const char *cl = strcasestr(head, "\r\nContent-Length: ");
        size_t blen = cl ? strtoul(cl + 18, NULL, 10) : len;
        free(head);
        if (blen > len) {
            /* Only a HEAD answer goes without its body, and only last. */
            CHECK(len == 0 || reset);
            return;
        }
        json_error_t jerr;
        json_t *body = json_loadb(p, blen, 0, &jerr);
        CHECK(body != NULL && json_is_object(body));
        if (status >= 400)
            CHECK(json_is_string(json_object_get(body, "error")));
        json_decref(body);
        p += blen;
        len -= blen;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!base)
        start();
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    /* Closed with a reset: no TIME_WAIT, or a run of some 100000 inputs
     * uses up the local ports. */
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    CHECK(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg) == 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(0x7f000001)};
    /* Hundreds of thousands of connections a run: the closes this side sees
     * first leave its ports in TIME_WAIT, and now and then no local port is
     * free for a moment (EADDRNOTAVAIL). Asked again, not an input's fault. */
    int rc = -1;
    for (int tries = 0; tries < 200; tries++) {
        rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
        if (rc == 0 || errno != EADDRNOTAVAIL)
            break;
        usleep(10000);
    }
    if (rc != 0)
        fprintf(stderr, "fuzz_admin: connect to 127.0.0.1:%u: %s\n", (unsigned)port, strerror(errno));
    CHECK(rc == 0);
    /* The input fits the socket's buffer: written before the loop runs. */
    size_t off = 0;
    while (off < size) {
        ssize_t w = write(fd, data + off, size - off);
        if (w <= 0)
            break; /* the endpoint closed early: what it answered is checked */
        off += (size_t)w;
    }
    shutdown(fd, SHUT_WR);
    struct conn c = {.in = evbuffer_new()};
    CHECK(c.in != NULL);
    struct event *ev = event_new(base, fd, EV_READ | EV_PERSIST, on_read, &c);
    CHECK(ev != NULL);
    struct timeval tv = {5, 0};
    event_add(ev, &tv);
    event_base_dispatch(base);
    event_free(ev);
    CHECK(!c.timed_out && c.closed);
    size_t n = evbuffer_get_length(c.in);
    const char *text = (const char *)evbuffer_pullup(c.in, -1);
    check_answers(text, n, c.reset);
    evbuffer_free(c.in);
    close(fd);
    /* Let the endpoint see the close and free the connection. */
    event_base_loop(base, EVLOOP_NONBLOCK);
    return 0;
}
