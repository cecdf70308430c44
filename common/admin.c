/* admin.c: see admin.h. */
#include "admin.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/keyvalq_struct.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "log.h"
#include "net.h"
#include "sluice.h"

#define MAX_ROUTES 32
#define MAX_BODY_BYTES (64 * 1024)
#define MAX_HEADERS_BYTES (16 * 1024)

struct route {
    int method;
    char path[96];
    bool prefix;
    sl_admin_handler handler;
    void *arg;
};

struct sl_admin {
    struct evhttp *http;
    SSL_CTX *tls;    /* NULL: plain HTTP */
    char token[256]; /* empty: no authentication */
    struct route routes[MAX_ROUTES];
    int num_routes;
};

/* The length of the valid UTF-8 sequence at p (what jansson accepts: no
 * overlong forms, no surrogates, at most U+10FFFF), 0 if there is none. */
static size_t utf8_seq(const unsigned char *p)
{
    unsigned c = p[0];
    size_t n;
    uint32_t cp;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2;
        cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80) /* also the terminating NUL */
            return 0;
        cp = cp << 6 | (p[i] & 0x3f);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n;
}

json_t *sl_admin_error(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* Messages quote what the client sent (a path may hold any byte) and
     * may be cut inside a character: JSON strings are UTF-8, and jansson
     * makes no string of anything else, which left the answer without a
     * body. Each byte that starts no valid sequence becomes '?'. */
    for (unsigned char *p = (unsigned char *)msg; *p;) {
        size_t n = utf8_seq(p);
        if (n == 0) {
            *p++ = '?';
            continue;
        }
        p += n;
    }
    return json_pack("{s:s}", "error", msg);
}

static const char *reason(int status)
{
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 409: return "Conflict";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "Error";
    }
}

void sl_admin_reply_text(struct evhttp_request *req, int status, const char *content_type, struct evbuffer *body)
{
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", content_type);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Cache-Control", "no-store");
    evhttp_send_reply(req, status, reason(status), body);
}

static void send_json(struct evhttp_request *req, int status, json_t *body)
{
    /* An error answer always says what went wrong, also when building its
     * message failed (out of memory). */
    if (!body && status >= 400)
        body = json_pack("{s:s}", "error", reason(status));
    struct evbuffer *out = evbuffer_new();
    if (body) {
        char *text = json_dumps(body, JSON_COMPACT);
        if (text) {
            evbuffer_add_printf(out, "%s\n", text);
            free(text);
        }
        json_decref(body);
    }
    sl_admin_reply_text(req, status, "application/json", out);
    evbuffer_free(out);
}

static bool route_matches(const struct route *r, const char *path, const char **rest)
{
    size_t n = strlen(r->path);
    if (r->prefix ? strncmp(path, r->path, n) != 0 : strcmp(path, r->path) != 0)
        return false;
    *rest = path + n;
    return true;
}

/* Compares in time independent of where the strings differ. */
static bool token_equal(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    unsigned char diff = (unsigned char)(la != lb);
    for (size_t i = 0; i < la; i++)
        diff |= (unsigned char)(a[i] ^ b[i % (lb ? lb : 1)]);
    return diff == 0;
}

/* Decodes base64 text into out (NUL-terminated). @return false when it is
 * not base64 or does not fit */
static bool base64_decode(const char *in, char *out, size_t cap)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t n = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (const char *p = in; *p && *p != '='; p++) {
        const char *k = strchr(abc, *p);
        if (!k || !*p)
            return false;
        acc = (acc << 6) | (uint32_t)(k - abc);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (n + 1 >= cap)
                return false;
            out[n++] = (char)((acc >> bits) & 0xff);
        }
    }
    out[n] = '\0';
    return true;
}

/* "Bearer <token>", or HTTP Basic with the token as the password (what a
 * browser sends for the status page: any user name). */
static bool authorized(const sl_admin_t *a, struct evhttp_request *req)
{
    if (!a->token[0])
        return true;
    const char *h = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
    if (!h)
        return false;
    if (strncmp(h, "Bearer ", 7) == 0)
        return token_equal(h + 7, a->token);
    char cred[600];
    if (strncmp(h, "Basic ", 6) != 0 || !base64_decode(h + 6, cred, sizeof cred))
        return false;
    const char *colon = strchr(cred, ':');
    return colon && token_equal(colon + 1, a->token);
}

static const char *method_name(int method)
{
    switch (method) {
    case EVHTTP_REQ_GET: return "GET";
    case EVHTTP_REQ_POST: return "POST";
    case EVHTTP_REQ_HEAD: return "HEAD";
    case EVHTTP_REQ_PUT: return "PUT";
    case EVHTTP_REQ_DELETE: return "DELETE";
    case EVHTTP_REQ_OPTIONS: return "OPTIONS";
    case EVHTTP_REQ_TRACE: return "TRACE";
    case EVHTTP_REQ_CONNECT: return "CONNECT";
    case EVHTTP_REQ_PATCH: return "PATCH";
    default: return NULL;
    }
}

static void on_request(struct evhttp_request *req, void *arg)
{
    sl_admin_t *a = arg;
    int method = evhttp_request_get_command(req);
    if (method != EVHTTP_REQ_GET && method != EVHTTP_REQ_POST && method != EVHTTP_REQ_PUT &&
        method != EVHTTP_REQ_DELETE) {
        /* Every method reaches us (see sl_admin_start), so that this answer
         * is JSON too. libevent read no body for a method it does not know:
         * the connection closes rather than read it as the next request. */
        const char *name = method_name(method);
        evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
        send_json(req, 501, sl_admin_error("method %s is not implemented: the admin API serves GET, POST, PUT "
                                           "and DELETE", name ? name : "(unknown)"));
        return;
    }
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    if (!path || !*path)
        path = "/";
    bool path_known = false;
    for (int i = 0; i < a->num_routes; i++) {
        const struct route *r = &a->routes[i];
        const char *rest;
        if (!route_matches(r, path, &rest))
            continue;
        path_known = true;
        if (r->method != method)
            continue;
        /* With a token, only the probes answer without it: an orchestrator
         * asks them, and they tell nothing about jobs or data. */
        bool probe = method == EVHTTP_REQ_GET && (!strcmp(path, "/healthz") || !strcmp(path, "/readyz"));
        if (!probe && !authorized(a, req)) {
            /* A browser asks its user for the token (as the password). */
            evhttp_add_header(evhttp_request_get_output_headers(req), "WWW-Authenticate",
                              "Basic realm=\"sluice admin\", charset=\"UTF-8\"");
            send_json(req, 401, sl_admin_error("%s needs \"Authorization: Bearer <token>\" with the admin token",
                                               path));
            return;
        }
        json_t *body = NULL;
        int status = r->handler(req, rest, &body, r->arg);
        if (status > 0)
            send_json(req, status, body);
        return;
    }
    if (path_known)
        send_json(req, 405, sl_admin_error("method not allowed on %s", path));
    else
        send_json(req, 404, sl_admin_error("no such endpoint: %s", path));
}

/* libevent answers some requests itself, before any callback of ours runs,
 * with an HTML page from evhttp_send_error(): 400 for a request line or
 * headers it cannot parse (also headers over MAX_HEADERS_BYTES, or a bad
 * Content-Length), 413 for a body over MAX_BODY_BYTES or a chunked body it
 * cannot parse, 417 for an Expect header other than 100-continue. libevent
 * 2.1 has no hook for those answers, so each connection's output buffer is
 * watched (on_output), and such a page, which always ends the connection
 * ("Connection: close"), is replaced by the same status with a JSON body
 * before a byte of it is written. */
static const char html_head[] = "<HTML><HEAD>\n<TITLE>";
static const char html_tail[] = "</BODY></HTML>\n";

static json_t *own_error(int status)
{
    switch (status) {
    case 400:
        return sl_admin_error("bad request: the request line or the headers (at most %d bytes) cannot be parsed",
                              MAX_HEADERS_BYTES);
    case 413:
        return sl_admin_error("request body too large (at most %d bytes), or its chunked encoding cannot be "
                              "parsed", MAX_BODY_BYTES);
    case 417: return sl_admin_error("expectation failed: the only Expect accepted is 100-continue");
    default: return sl_admin_error("the HTTP server refused the request");
    }
}

/* Finds the last occurrence of what (n bytes) in [p, p + len). */
static const char *find_last(const char *p, size_t len, const char *what, size_t n)
{
    for (size_t i = len >= n ? len - n + 1 : 0; i-- > 0;)
        if (memcmp(p + i, what, n) == 0)
            return p + i;
    return NULL;
}

static void on_output(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
    (void)arg;
    size_t tail_len = sizeof html_tail - 1;
    size_t len = evbuffer_get_length(buf);
    if (info->n_added == 0 || len < tail_len)
        return;
    char tail[sizeof html_tail];
    struct evbuffer_ptr at;
    if (evbuffer_ptr_set(buf, &at, len - tail_len, EVBUFFER_PTR_SET) < 0 ||
        evbuffer_copyout_from(buf, &at, tail, tail_len) != (ev_ssize_t)tail_len ||
        memcmp(tail, html_tail, tail_len) != 0)
        return; /* the usual case: not one of libevent's pages, or not whole yet */
    /* The page is the last response in the buffer (libevent serves one
     * request of a connection at a time, so it is the only one). */
    const char *all = (const char *)evbuffer_pullup(buf, -1);
    if (!all)
        return;
    const char *body = find_last(all, len, html_head, sizeof html_head - 1);
    /* libevent writes the request's version back, whatever it was: 1.0,
     * 0.9, also -1.1 (it reads the version with %d). */
    const char *status_line = body ? find_last(all, (size_t)(body - all), "HTTP/", 5) : NULL;
    const char *eol = status_line ? memchr(status_line, '\r', (size_t)(body - status_line)) : NULL;
    char line[128];
    int status = 0;
    if (!eol || (size_t)(eol - status_line) >= sizeof line)
        return;
    memcpy(line, status_line, (size_t)(eol - status_line));
    line[eol - status_line] = '\0';
    if (sscanf(line, "HTTP/%*d.%*d %3d", &status) != 1 || status < 400)
        return;
    json_t *err = own_error(status);
    char *text = err ? json_dumps(err, JSON_COMPACT) : NULL;
    json_decref(err);
    if (!text)
        return;
    size_t keep = (size_t)(status_line - all);
    struct evbuffer *out = evbuffer_new();
    if (out && evbuffer_remove_buffer(buf, out, keep) == (int)keep) {
        evbuffer_add_printf(out,
                            "%s\r\nContent-Type: application/json\r\nCache-Control: no-store\r\n"
                            "Connection: close\r\nContent-Length: %zu\r\n\r\n%s\n",
                            line, strlen(text) + 1, text);
        evbuffer_drain(buf, evbuffer_get_length(buf));
        evbuffer_add_buffer(buf, out); /* runs this callback again: no page ends the buffer now */
    }
    if (out)
        evbuffer_free(out);
    free(text);
}

/* A sluice hello (the protocol's magic "SLUC" first) on this port: a client
 * or worker given the admin port for the protocol port. evhttp would wait
 * for a request line that never comes, and the peer for a hello, until a
 * timeout; answer at once in HTTP instead, which the peer's handshake
 * recognises and names (protocol/conn.c), and drop what it sent. Plain
 * HTTP only: under TLS the hello never gets past the TLS handshake. */
static void on_input(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
    struct bufferevent *bev = arg;
    size_t len = evbuffer_get_length(buf);
    if (info->n_added == 0 || info->orig_size >= 4 || len < 4)
        return;
    char head[4];
    if (evbuffer_copyout(buf, head, sizeof head) != (ev_ssize_t)sizeof head || memcmp(head, "SLUC", 4) != 0)
        return;
    static const char body[] = "{\"error\":\"this is the HTTP admin port of a sluice daemon; sluice clients "
                               "and workers connect to its protocol port (--port)\"}\n";
    char resp[512];
    int n = snprintf(resp, sizeof resp,
                     "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nCache-Control: no-store\r\n"
                     "Connection: close\r\nContent-Length: %zu\r\n\r\n%s", sizeof body - 1, body);
    evutil_socket_t fd = bufferevent_getfd(bev);
    /* A fresh connection's send buffer takes these few hundred bytes. */
    if (fd >= 0 && n > 0 && (size_t)n < sizeof resp && send(fd, resp, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
        return;
    evbuffer_drain(buf, len);
}

static struct bufferevent *make_bufferevent(struct event_base *base, void *arg)
{
    /* What evhttp makes when given none (under TLS, its OpenSSL form),
     * plus the watch on its output. */
    sl_admin_t *a = arg;
    struct bufferevent *bev = NULL;
    if (a->tls) {
        SSL *ssl = SSL_new(a->tls);
        if (ssl && !(bev = bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_ACCEPTING,
                                                          BEV_OPT_CLOSE_ON_FREE)))
            SSL_free(ssl);
        if (bev)
            bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    } else {
        bev = bufferevent_socket_new(base, -1, 0);
        if (bev)
            evbuffer_add_cb(bufferevent_get_input(bev), on_input, bev);
    }
    if (bev)
        evbuffer_add_cb(bufferevent_get_output(bev), on_output, arg);
    return bev;
}

int sl_admin_start(struct event_base *base, const char *host, uint16_t port, uint16_t *bound_port,
                   sl_admin_t **out, char *err, size_t errlen)
{
    sl_admin_t *a = calloc(1, sizeof *a);
    if (!a)
        return -ENOMEM;
    int fd = -1;
    int rc = sl_listen_tcp(host, port, &fd, bound_port, err, errlen);
    if (rc < 0)
        goto fail;
    a->http = evhttp_new(base);
    if (!a->http || !evhttp_accept_socket_with_handle(a->http, fd)) {
        evutil_closesocket(fd);
        snprintf(err, errlen, "cannot start the admin endpoint on %s:%u", host, *bound_port);
        rc = -ENOMEM;
        goto fail;
    }
    /* Every method, also one libevent does not know (its 1 << 15), reaches
     * on_request, which answers the ones not served with a JSON 501;
     * libevent's own 501 is an HTML page. */
    evhttp_set_allowed_methods(a->http, 0xffff);
    evhttp_set_max_body_size(a->http, MAX_BODY_BYTES);
    evhttp_set_max_headers_size(a->http, MAX_HEADERS_BYTES);
    /* A body over the limit is read and dropped before the 413, so that the
     * client, still sending it, gets the answer rather than a reset. */
    evhttp_set_flags(a->http, EVHTTP_SERVER_LINGERING_CLOSE);
    evhttp_set_bevcb(a->http, make_bufferevent, a);
    evhttp_set_gencb(a->http, on_request, a);
    *out = a;
    return 0;
fail:
    sl_admin_free(a);
    return rc;
}

int sl_admin_route(sl_admin_t *a, int method, const char *path, sl_admin_handler handler, void *arg)
{
    if (a->num_routes >= MAX_ROUTES)
        return SL_ETOOBIG;
    struct route *r = &a->routes[a->num_routes++];
    r->method = method;
    snprintf(r->path, sizeof r->path, "%s", path);
    size_t n = strlen(r->path);
    r->prefix = n > 1 && r->path[n - 1] == '/';
    r->handler = handler;
    r->arg = arg;
    return 0;
}

void sl_admin_set_token(sl_admin_t *a, const char *token)
{
    snprintf(a->token, sizeof a->token, "%s", token ? token : "");
}

json_t *sl_admin_body(struct evhttp_request *req, json_t **error)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t n = evbuffer_get_length(in);
    if (n == 0)
        return json_object();
    json_error_t jerr;
    json_t *body = json_loadb((const char *)evbuffer_pullup(in, (ssize_t)n), n, 0, &jerr);
    if (!body) {
        *error = sl_admin_error("bad JSON body: line %d column %d: %s", jerr.line, jerr.column, jerr.text);
        return NULL;
    }
    if (!json_is_object(body)) {
        json_decref(body);
        *error = sl_admin_error("the body must be a JSON object");
        return NULL;
    }
    return body;
}

int sl_admin_read_token(const char *path, char *token, size_t len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        int rc = -errno;
        snprintf(err, errlen, "admin token file %s: %s", path, strerror(errno));
        return rc;
    }
    char line[512] = "";
    if (!fgets(line, sizeof line, f))
        line[0] = '\0';
    fclose(f);
    char *p = line;
    while (*p == ' ' || *p == '\t')
        p++;
    size_t n = strlen(p);
    while (n && (p[n - 1] == '\n' || p[n - 1] == '\r' || p[n - 1] == ' ' || p[n - 1] == '\t'))
        p[--n] = '\0';
    if (n == 0 || n >= len) {
        snprintf(err, errlen, "admin token file %s: %s", path, n ? "token too long" : "empty");
        return SL_EINVAL;
    }
    memcpy(token, p, n + 1);
    return 0;
}

void sl_admin_free(sl_admin_t *a)
{
    if (!a)
        return;
    if (a->http)
        evhttp_free(a->http);
    SSL_CTX_free(a->tls);
    free(a);
}

/* The reason OpenSSL gives for what just failed. */
static void tls_reason(char *out, size_t len)
{
    unsigned long e = ERR_get_error();
    snprintf(out, len, "unknown error");
    if (e)
        ERR_error_string_n(e, out, len);
    ERR_clear_error();
}

int sl_admin_use_tls(sl_admin_t *a, const char *cert, const char *key, char *err, size_t errlen)
{
    if (!cert && !key)
        return 0;
    if (!cert || !key) {
        snprintf(err, errlen, "--admin-tls-cert and --admin-tls-key go together: %s is missing",
                 cert ? "--admin-tls-key" : "--admin-tls-cert");
        return SL_EINVAL;
    }
    char why[256];
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) {
        tls_reason(why, sizeof why);
        snprintf(err, errlen, "admin TLS: %s", why);
        return -ENOMEM;
    }
    /* Browsers, curl and scrapers: TLS 1.2 and 1.3; the admin token, not a
     * client certificate, says who may ask. */
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
    const char *what = "certificate", *path = cert;
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) == 1) {
        what = "key";
        path = key;
        if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) == 1) {
            what = "key that matches the certificate";
            if (SSL_CTX_check_private_key(ctx) == 1) {
                SSL_CTX_free(a->tls);
                a->tls = ctx;
                return 0;
            }
        }
    }
    tls_reason(why, sizeof why);
    snprintf(err, errlen, "admin TLS %s %s: %s%s", what, path, why,
             path == key ? " (is it the key of --admin-tls-cert?)" : "");
    SSL_CTX_free(ctx);
    return SL_EINVAL;
}

bool sl_admin_tls(const sl_admin_t *a)
{
    return a->tls != NULL;
}

void sl_admin_warn_exposure(const sl_admin_t *a, const char *host)
{
    bool loopback = host && (!strncmp(host, "127.", 4) || !strcmp(host, "::1") || !strcmp(host, "localhost"));
    if (loopback)
        return;
    if (!a->token[0])
        sl_log_warn("the admin endpoint on %s has no --admin-token-file: anyone who reaches it can read the "
                    "cluster's state (and, on the dispatcher, cancel jobs)",
                    host);
    else if (!a->tls)
        sl_log_warn("the admin endpoint on %s speaks plain HTTP: the admin token crosses the network in the "
                    "clear; give it --admin-tls-cert and --admin-tls-key",
                    host);
}

int sl_admin_use_token_file(sl_admin_t *a, const char *path, char *err, size_t errlen)
{
    if (!path)
        return 0;
    char token[256];
    int rc = sl_admin_read_token(path, token, sizeof token, err, errlen);
    if (rc < 0)
        return rc;
    sl_admin_set_token(a, token);
    return 0;
}
