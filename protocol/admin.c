/* admin.c: see admin.h. */
#include "admin.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/keyvalq_struct.h>

#include "net.h"
#include "sluice.h"

#define MAX_ROUTES 32

struct route {
    int method;
    char path[96];
    bool prefix;
    sl_admin_handler handler;
    void *arg;
};

struct sl_admin {
    struct evhttp *http;
    char token[256]; /* empty: no authentication */
    struct route routes[MAX_ROUTES];
    int num_routes;
};

json_t *sl_admin_error(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
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

static bool authorized(const sl_admin_t *a, struct evhttp_request *req)
{
    if (!a->token[0])
        return true;
    const char *h = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
    return h && strncmp(h, "Bearer ", 7) == 0 && token_equal(h + 7, a->token);
}

static void on_request(struct evhttp_request *req, void *arg)
{
    sl_admin_t *a = arg;
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    if (!path || !*path)
        path = "/";
    int method = evhttp_request_get_command(req);
    bool path_known = false;
    for (int i = 0; i < a->num_routes; i++) {
        const struct route *r = &a->routes[i];
        const char *rest;
        if (!route_matches(r, path, &rest))
            continue;
        path_known = true;
        if (r->method != method)
            continue;
        if (method != EVHTTP_REQ_GET && !authorized(a, req)) {
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
    evhttp_set_allowed_methods(a->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_DELETE | EVHTTP_REQ_PUT);
    evhttp_set_max_body_size(a->http, 64 * 1024);
    evhttp_set_max_headers_size(a->http, 16 * 1024);
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
    free(a);
}
