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
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    const char *reason = status == 200 ? "OK" : status == 404 ? "Not Found" : status == 405 ? "Method Not Allowed"
                       : status == 400 ? "Bad Request" : status == 401 ? "Unauthorized" : "Error";
    evhttp_send_reply(req, status, reason, out);
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
        json_t *body = NULL;
        int status = r->handler(req, rest, &body, r->arg);
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

void sl_admin_free(sl_admin_t *a)
{
    if (!a)
        return;
    if (a->http)
        evhttp_free(a->http);
    free(a);
}
