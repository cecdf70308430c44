/*
 * resolve.c: host names looked up on a thread of their own (resolve.h).
 *
 * Each lookup is a record shared by its thread and the resolver, freed by
 * whichever lets go of it last. The thread reports by activating the
 * resolver's event under the record's lock, unless the resolver abandoned
 * the record (a newer lookup, or the resolver freed): it then only drops
 * its reference.
 */
#include "resolve.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "net.h"
#include "sluice.h"

struct lookup {
    pthread_mutex_t mu;
    int refs;       /* the thread's and the resolver's */
    bool abandoned; /* the resolver let go: report nothing */
    bool finished;
    struct event *ev; /* the resolver's, activated when finished (unless abandoned) */
    char hostport[300];
    int rc;
    struct sockaddr_storage ss;
    socklen_t sslen;
    char err[300];
};

struct sl_resolver {
    struct event *ev;
    struct lookup *cur; /* the lookup under way, or NULL */
    sl_resolved_fn done;
    void *arg;
};

static void unref(struct lookup *l)
{
    pthread_mutex_lock(&l->mu);
    bool last = --l->refs == 0;
    pthread_mutex_unlock(&l->mu);
    if (last) {
        pthread_mutex_destroy(&l->mu);
        free(l);
    }
}

static void finish(struct lookup *l)
{
    pthread_mutex_lock(&l->mu);
    l->finished = true;
    if (!l->abandoned)
        event_active(l->ev, EV_READ, 0);
    pthread_mutex_unlock(&l->mu);
}

static void *lookup_main(void *arg)
{
    struct lookup *l = arg;
    l->rc = sl_addr_resolve(l->hostport, &l->ss, &l->sslen, l->err, sizeof l->err);
    finish(l);
    unref(l);
    return NULL;
}

/* A numeric host ("10.0.0.7:5050", "[::1]:5050") needs no name service. */
static bool numeric(const char *hostport)
{
    char host[256], err[8];
    uint16_t port;
    unsigned char buf[sizeof(struct in6_addr)];
    return sl_addr_split(hostport, host, sizeof host, &port, err, sizeof err) == 0 &&
           (inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1);
}

static void on_finished(evutil_socket_t fd, short what, void *arg)
{
    sl_resolver_t *r = arg;
    (void)fd;
    (void)what;
    struct lookup *l = r->cur;
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    bool finished = l->finished;
    pthread_mutex_unlock(&l->mu);
    if (!finished)
        return;
    r->cur = NULL;
    int rc = l->rc;
    struct sockaddr_storage ss = l->ss;
    socklen_t sslen = l->sslen;
    char err[sizeof l->err];
    memcpy(err, l->err, sizeof err);
    unref(l);
    r->done(rc, &ss, sslen, err, r->arg); /* may start the next lookup, or free r */
}

sl_resolver_t *sl_resolver_new(struct event_base *base, sl_resolved_fn done, void *arg)
{
    sl_resolver_t *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->done = done;
    r->arg = arg;
    if (!(r->ev = event_new(base, -1, 0, on_finished, r))) {
        free(r);
        return NULL;
    }
    return r;
}

static void abandon(sl_resolver_t *r)
{
    struct lookup *l = r->cur;
    if (!l)
        return;
    r->cur = NULL;
    pthread_mutex_lock(&l->mu);
    l->abandoned = true;
    pthread_mutex_unlock(&l->mu);
    event_del(r->ev); /* a report already made is dropped with it */
    unref(l);
}

int sl_resolver_start(sl_resolver_t *r, const char *hostport)
{
    abandon(r);
    struct lookup *l = calloc(1, sizeof *l);
    if (!l)
        return -ENOMEM;
    pthread_mutex_init(&l->mu, NULL);
    l->ev = r->ev;
    l->refs = 1;
    snprintf(l->hostport, sizeof l->hostport, "%s", hostport);
    r->cur = l;
    if (numeric(hostport)) {
        l->rc = sl_addr_resolve(l->hostport, &l->ss, &l->sslen, l->err, sizeof l->err);
        finish(l);
        return 0;
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    l->refs = 2;
    pthread_t t;
    int e = pthread_create(&t, &attr, lookup_main, l);
    pthread_attr_destroy(&attr);
    if (e) {
        l->refs = 1;
        l->rc = -EAGAIN;
        snprintf(l->err, sizeof l->err, "cannot start a thread to resolve \"%s\": %s", hostport, strerror(e));
        finish(l);
    }
    return 0;
}

int sl_resolver_busy(const sl_resolver_t *r)
{
    return r->cur != NULL;
}

void sl_resolver_free(sl_resolver_t *r)
{
    if (!r)
        return;
    abandon(r);
    event_free(r->ev);
    free(r);
}
