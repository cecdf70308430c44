/*
 * Host names looked up off the event loop (common/resolve.h): every lookup
 * reports once, on the loop and never from within its start, a newer one
 * or a free abandons the one under way, and bad addresses say what is wrong.
 */
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <string.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "resolve.h"
#include "sluice.h"

struct got {
    int calls, rc;
    struct sockaddr_storage ss;
    char err[300];
};

static void on_done(int rc, const struct sockaddr_storage *ss, socklen_t sslen, const char *err, void *arg)
{
    struct got *g = arg;
    (void)sslen;
    g->calls++;
    g->rc = rc;
    if (rc == 0)
        g->ss = *ss;
    snprintf(g->err, sizeof g->err, "%s", err);
}

static struct event_base *base;

static void setup(void)
{
    evthread_use_pthreads();
    base = event_base_new();
    cr_assert_not_null(base);
}

static void teardown(void)
{
    event_base_free(base);
}

/* Runs the loop until g has a report (bounded: a lookup of localhost reads
 * /etc/hosts, a numeric one nothing). */
static void wait_for(struct got *g)
{
    for (int i = 0; i < 2000 && g->calls == 0; i++) {
        struct timeval tv = {0, 10000};
        event_base_loopexit(base, &tv);
        event_base_dispatch(base);
    }
}

static uint16_t port_of(const struct sockaddr_storage *ss)
{
    return ntohs(ss->ss_family == AF_INET6 ? ((const struct sockaddr_in6 *)ss)->sin6_port
                                           : ((const struct sockaddr_in *)ss)->sin_port);
}

TestSuite(resolve, .init = setup, .fini = teardown);

Test(resolve, numeric_addresses_report_on_the_loop_not_in_the_start)
{
    struct got g = {0};
    sl_resolver_t *r = sl_resolver_new(base, on_done, &g);
    cr_assert_not_null(r);
    cr_assert_eq(sl_resolver_start(r, "127.0.0.1:5050"), 0);
    cr_assert_eq(g.calls, 0, "the report came from within the start");
    cr_assert(sl_resolver_busy(r));
    wait_for(&g);
    cr_assert_eq(g.calls, 1);
    cr_assert_eq(g.rc, 0, "%s", g.err);
    cr_assert_eq(g.ss.ss_family, AF_INET);
    cr_assert_eq(port_of(&g.ss), 5050);
    cr_assert_not(sl_resolver_busy(r));

    memset(&g, 0, sizeof g);
    cr_assert_eq(sl_resolver_start(r, "[::1]:6060"), 0);
    wait_for(&g);
    cr_assert_eq(g.calls, 1);
    cr_assert_eq(g.rc, 0, "%s", g.err);
    cr_assert_eq(g.ss.ss_family, AF_INET6);
    cr_assert_eq(port_of(&g.ss), 6060);
    sl_resolver_free(r);
}

Test(resolve, a_name_is_looked_up_on_a_thread)
{
    struct got g = {0};
    sl_resolver_t *r = sl_resolver_new(base, on_done, &g);
    cr_assert_eq(sl_resolver_start(r, "localhost:7070"), 0);
    wait_for(&g);
    cr_assert_eq(g.calls, 1);
    cr_assert_eq(g.rc, 0, "%s", g.err);
    cr_assert_eq(port_of(&g.ss), 7070);
    sl_resolver_free(r);
}

Test(resolve, bad_addresses_say_what_is_wrong)
{
    struct got g = {0};
    sl_resolver_t *r = sl_resolver_new(base, on_done, &g);
    cr_assert_eq(sl_resolver_start(r, "no-port-here"), 0);
    wait_for(&g);
    cr_assert_eq(g.calls, 1);
    cr_assert_eq(g.rc, SL_EINVAL, "%d: %s", g.rc, g.err);
    cr_assert(strstr(g.err, "no-port-here"), "%s", g.err);
    sl_resolver_free(r);
}

Test(resolve, a_newer_lookup_abandons_the_one_under_way)
{
    struct got g = {0};
    sl_resolver_t *r = sl_resolver_new(base, on_done, &g);
    for (int i = 0; i < 50; i++)
        cr_assert_eq(sl_resolver_start(r, i % 2 ? "localhost:1" : "127.0.0.1:2"), 0);
    cr_assert_eq(sl_resolver_start(r, "localhost:4242"), 0);
    wait_for(&g);
    /* Let any abandoned thread finish and try to report. */
    for (int i = 0; i < 20; i++) {
        struct timeval tv = {0, 10000};
        event_base_loopexit(base, &tv);
        event_base_dispatch(base);
    }
    cr_assert_eq(g.calls, 1, "abandoned lookups reported");
    cr_assert_eq(g.rc, 0, "%s", g.err);
    cr_assert_eq(port_of(&g.ss), 4242);
    sl_resolver_free(r);
}

Test(resolve, a_free_abandons_the_lookup_under_way)
{
    struct got g = {0};
    for (int i = 0; i < 50; i++) {
        sl_resolver_t *r = sl_resolver_new(base, on_done, &g);
        cr_assert_eq(sl_resolver_start(r, "localhost:1"), 0);
        sl_resolver_free(r);
    }
    for (int i = 0; i < 20; i++) {
        struct timeval tv = {0, 10000};
        event_base_loopexit(base, &tv);
        event_base_dispatch(base);
    }
    cr_assert_eq(g.calls, 0);
}
