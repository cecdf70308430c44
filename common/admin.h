/*
 * admin.h: the JSON-over-HTTP admin endpoint both daemons serve
 * (docs/admin-api.md), on libevent's evhttp. A daemon registers handlers
 * by method and path prefix; unknown paths get 404, known paths with
 * another method 405, methods other than GET, POST, PUT and DELETE 501,
 * each with {"error": "..."}. libevent's own answers to requests it cannot
 * parse (400), bodies over 64 KiB (413) and other Expect headers than
 * 100-continue (417) get a JSON body too.
 */
#ifndef SL_ADMIN_H
#define SL_ADMIN_H

#include <stdbool.h>
#include <stdint.h>

#include <event2/event.h>
#include <event2/http.h>
#include <jansson.h>

typedef struct sl_admin sl_admin_t;

/* Answers one request: returns the HTTP status and sets *body (a new
 * reference, or NULL for an empty body), or returns 0 after replying itself
 * (for answers that are not JSON). path_rest is the path after the route's
 * prefix. */
typedef int (*sl_admin_handler)(struct evhttp_request *req, const char *path_rest, json_t **body, void *arg);

/**
 * Starts serving on host:port (port 0 picks one).
 * @param[out] bound_port the port it listens on
 * @return 0, or -errno with a message in err
 */
int sl_admin_start(struct event_base *base, const char *host, uint16_t port, uint16_t *bound_port,
                   sl_admin_t **out, char *err, size_t errlen);

/**
 * Serves HTTPS (TLS 1.2 or 1.3) with the PEM certificate chain and key from
 * now on; both NULL: plain HTTP. No client certificate is asked for: the
 * admin token says who may ask.
 * @return 0, or SL_EINVAL (a file unreadable, one of the two missing, a key
 *         that does not match) / -ENOMEM, with the file and reason in err
 */
int sl_admin_use_tls(sl_admin_t *a, const char *cert, const char *key, char *err, size_t errlen);

/** @return true when the endpoint serves HTTPS */
bool sl_admin_tls(const sl_admin_t *a);

/** Warns (log) when the endpoint listens beyond loopback on host without
 * a token, or with a token over plain HTTP. */
void sl_admin_warn_exposure(const sl_admin_t *a, const char *host);

/**
 * Routes method (EVHTTP_REQ_GET, ...) on path to handler. A path ending in
 * '/' is a prefix. @return 0, or -ENOMEM / SL_ETOOBIG (too many routes)
 */
int sl_admin_route(sl_admin_t *a, int method, const char *path, sl_admin_handler handler, void *arg);

/** @return a new {"error": message} object; a byte of the message that is
 *  not part of valid UTF-8 (a path may hold any) becomes '?' */
json_t *sl_admin_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/**
 * Requires "Authorization: Bearer <token>" on every request that changes
 * state (POST, PUT, DELETE); others get 401. token is copied.
 */
void sl_admin_set_token(sl_admin_t *a, const char *token);

/**
 * Parses the request body as a JSON object; an empty body gives an empty object.
 * @return the object (a new reference), or NULL with *error set to a new
 *         {"error": ...} object for a 400 answer
 */
json_t *sl_admin_body(struct evhttp_request *req, json_t **error);

/** Replies with text of content_type. */
void sl_admin_reply_text(struct evhttp_request *req, int status, const char *content_type, struct evbuffer *body);

/**
 * Reads a token file: its first line, without surrounding whitespace.
 * @return 0, or -errno / SL_EINVAL (empty) with a message naming the file in err
 */
int sl_admin_read_token(const char *path, char *token, size_t len, char *err, size_t errlen);

/**
 * With a path: reads the token there (sl_admin_read_token()) and requires
 * it of a's changes (sl_admin_set_token()); without, does nothing.
 * @return 0, or < 0 with what is wrong in err
 */
int sl_admin_use_token_file(sl_admin_t *a, const char *path, char *err, size_t errlen);

void sl_admin_free(sl_admin_t *a);

#endif
