/*
 * test_admin.c: the admin endpoint (common/admin.c): error objects and
 * answers stay JSON whatever the client sent.
 */
#include <criterion/criterion.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "admin.h"

static const char *error_text(json_t *o)
{
    cr_assert_not_null(o, "no error object");
    cr_assert(json_is_object(o));
    json_t *e = json_object_get(o, "error");
    cr_assert(json_is_string(e));
    return json_string_value(e);
}

/* A path of bytes that are not UTF-8 made jansson refuse the message, and
 * the 404 went out without a body (found by tests/fuzz/fuzz_admin.c). */
Test(admin_error, bytes_that_are_not_utf8_become_question_marks)
{
    json_t *o = sl_admin_error("no such endpoint: %s", "/v1/j\xff\xfe" "obs");
    cr_assert_str_eq(error_text(o), "no such endpoint: /v1/j??obs");
    json_decref(o);

    /* Overlong forms, surrogates, a lone continuation and a cut sequence. */
    o = sl_admin_error("%s|%s|%s|%s|%s", "\xc0\xaf", "\xed\xa0\x80", "\x80", "\xe2\x82", "\xf4\x90\x80\x80");
    cr_assert_str_eq(error_text(o), "??|???|?|??|????");
    json_decref(o);

    /* Valid UTF-8 stays as it is. */
    o = sl_admin_error("%s", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
    cr_assert_str_eq(error_text(o), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
    json_decref(o);
}

/* A long message is cut to its buffer, possibly inside a character. */
Test(admin_error, a_message_cut_inside_a_character_is_still_json)
{
    char path[1200];
    size_t n = 0;
    path[n++] = 'x';
    while (n + 2 < sizeof path) {
        path[n++] = '\xc3';
        path[n++] = '\xa9';
    }
    path[n] = '\0';
    for (int shift = 0; shift < 2; shift++) {
        json_t *o = sl_admin_error("%s", path + shift);
        const char *t = error_text(o);
        cr_assert(strlen(t) > 400);
        json_decref(o);
    }
}

/* ---- a real endpoint on 127.0.0.1 ---- */

struct answer {
    struct event_base *base;
    struct evbuffer *in;
    bool done;
};

static void on_read(evutil_socket_t fd, short what, void *arg)
{
    struct answer *a = arg;
    if ((what & EV_TIMEOUT) || evbuffer_read(a->in, fd, 65536) <= 0) {
        a->done = true;
        event_base_loopbreak(a->base);
    }
}

/* Sends req on one connection to an endpoint with no routes and returns
 * everything it answered until it closed (malloc'd, NUL-terminated). */
static char *ask(const char *req, size_t len)
{
    struct answer a = {.base = event_base_new(), .in = evbuffer_new()};
    cr_assert(a.base && a.in);
    sl_admin_t *admin;
    uint16_t port;
    char e[256];
    cr_assert_eq(sl_admin_start(a.base, "127.0.0.1", 0, &port, &admin, e, sizeof(e)), 0, "%s", e);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(0x7f000001)};
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    cr_assert_eq(write(fd, req, len), (ssize_t)len);
    shutdown(fd, SHUT_WR);
    struct event *ev = event_new(a.base, fd, EV_READ | EV_PERSIST, on_read, &a);
    struct timeval tv = {10, 0};
    event_add(ev, &tv);
    event_base_dispatch(a.base);
    cr_assert(a.done);
    size_t n = evbuffer_get_length(a.in);
    char *text = malloc(n + 1);
    evbuffer_remove(a.in, text, n);
    text[n] = '\0';
    event_free(ev);
    close(fd);
    evbuffer_free(a.in);
    sl_admin_free(admin);
    event_base_free(a.base);
    return text;
}

/* libevent's own error page (here a 400 for a header line it cannot
 * parse) is rewritten into JSON, also when the request's version is one
 * libevent writes back oddly: "HTTP/-1.1" kept the HTML page (found by
 * tests/fuzz/fuzz_admin.c). */
Test(admin_endpoint, libevent_error_pages_are_json_whatever_the_version)
{
    static const char *const versions[] = {"1.1", "1.0", "-1.1", "0.9"};
    for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++) {
        char req[128];
        int n = snprintf(req, sizeof(req), "GET / HTTP/%s\r\n\x0c\r\n\r\n", versions[i]);
        char *text = ask(req, (size_t)n);
        cr_assert(strstr(text, " 400 "), "HTTP/%s: %s", versions[i], text);
        cr_assert(strstr(text, "\r\nContent-Type: application/json\r\n"), "HTTP/%s: %s", versions[i], text);
        cr_assert_null(strstr(text, "<HTML>"), "HTTP/%s: %s", versions[i], text);
        const char *body = strstr(text, "\r\n\r\n");
        cr_assert_not_null(body);
        json_error_t jerr;
        json_t *o = json_loads(body + 4, 0, &jerr);
        cr_assert(strstr(error_text(o), "bad request"), "HTTP/%s: %s", versions[i], text);
        json_decref(o);
        free(text);
    }
}

/* The 404 of a path that is not UTF-8 has its JSON body. */
Test(admin_endpoint, unknown_path_not_utf8_gets_a_json_404)
{
    static const char req[] = "GET /v1/j\xff\xff HTTP/1.1\r\nHost: x\r\n\r\n";
    char *text = ask(req, sizeof(req) - 1);
    cr_assert(strstr(text, " 404 "), "%s", text);
    const char *body = strstr(text, "\r\n\r\n");
    cr_assert_not_null(body);
    json_error_t jerr;
    json_t *o = json_loads(body + 4, 0, &jerr);
    cr_assert_str_eq(error_text(o), "no such endpoint: /v1/j??");
    json_decref(o);
    free(text);
}
