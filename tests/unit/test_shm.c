/*
 * Shared memory between a worker and a client on its host (workerd/shm.h,
 * client/shmmap.h), both sides real: the worker's lane on an abstract Unix
 * socket, served by an event loop on its own thread, the client collecting
 * the memfd through it and mapping it. A region goes only to the ticket's
 * holder, once; what the worker copies into a slot is what the client
 * reads there; slots never overlap while lent, come back in order, and
 * every bound holds (a seeded property test). The client's collection runs
 * on its loop a step at a time: the loop does its other work while a lane
 * has not answered, and a fetch ends at its time or when cancelled.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "big_alloc.h"
#include "membudget.h"
#include "provwire.h"
#include "received.h"
#include "seed_util.h"
#include "shm.h"
#include "shmmap.h"
#include "sluice.h"
#include "sluice.pb.h"

static char err[512];

/* A collection (sl__shm_fetch()) on a loop of its own, waited for, as the
 * tests below that do not look at the loop want it. */
struct collect {
    struct event_base *base;
    sl_shm_map_t *m;
    int rc;
    bool done;
    char *err;
    size_t errlen;
};

static void collected(sl_shm_map_t *m, int rc, const char *why, void *arg)
{
    struct collect *c = arg;
    c->m = m;
    c->rc = rc;
    c->done = true;
    if (rc < 0 && c->err && c->errlen > 0)
        snprintf(c->err, c->errlen, "%s", why);
    event_base_loopbreak(c->base);
}

static int shm_collect(const char *name, const uint8_t *ticket, size_t ticket_len, int timeout_ms, size_t max_bytes,
                       sl_shm_map_t **out, char *errbuf, size_t errlen)
{
    *out = NULL;
    struct collect c = {.base = event_base_new(), .err = errbuf, .errlen = errlen};
    if (!c.base)
        return -ENOMEM;
    sl_shm_fetch_t *f;
    int rc = sl__shm_fetch(c.base, name, ticket, ticket_len, timeout_ms, max_bytes, collected, &c, &f, errbuf, errlen);
    while (rc == 0 && !c.done)
        event_base_loop(c.base, EVLOOP_ONCE);
    event_base_free(c.base);
    if (rc < 0)
        return rc;
    *out = c.m;
    return c.rc;
}

/* The worker's side: a lane whose loop runs on its own thread. The tests
 * touch lane and regions only while the loop is stopped (shm.h: one
 * thread), except for the collect, which the loop serves. */
struct side {
    struct event_base *base;
    sl_shm_lane_t *lane;
    pthread_t thread;
};

static void *loop_main(void *arg)
{
    struct side *s = arg;
    event_base_loop(s->base, EVLOOP_NO_EXIT_ON_EMPTY);
    return NULL;
}

static void side_start(struct side *s, size_t region_bytes, sl_membudget_t *budget)
{
    evthread_use_pthreads();
    s->base = event_base_new();
    cr_assert_not_null(s->base);
    s->lane = sl_shm_lane_new(s->base, region_bytes, budget, err, sizeof err);
    cr_assert_not_null(s->lane, "%s", err);
}

static void side_run(struct side *s)
{
    cr_assert_eq(pthread_create(&s->thread, NULL, loop_main, s), 0);
}

static void side_pause(struct side *s)
{
    event_base_loopbreak(s->base);
    pthread_join(s->thread, NULL);
}

static void side_stop(struct side *s)
{
    sl_shm_lane_free(s->lane);
    event_base_free(s->base);
}

/* Collects r's region as a client would, the loop serving the lane. */
static int collect(struct side *s, const uint8_t *ticket, sl_shm_map_t **m)
{
    side_run(s);
    int rc = shm_collect(sl_shm_lane_name(s->lane), ticket, SL_SHM_TICKET_LEN, 5000, (size_t)1 << 32, m, err,
                             sizeof err);
    side_pause(s);
    return rc;
}

Test(shm, a_region_goes_to_the_holder_of_its_ticket_once)
{
    struct side s;
    side_start(&s, 1 << 20, NULL);
    sl_shm_region_t *r = sl_shm_region_new(s.lane, err, sizeof err);
    cr_assert_not_null(r, "%s", err);
    cr_assert_not(sl_shm_region_collected(r));

    /* A ticket of no region: nothing handed over. */
    uint8_t wrong[SL_SHM_TICKET_LEN];
    memcpy(wrong, sl_shm_region_ticket(r), sizeof wrong);
    wrong[5] ^= 1;
    sl_shm_map_t *m = NULL;
    cr_assert_eq(collect(&s, wrong, &m), SL_EAUTH, "%s", err);
    cr_assert_not(sl_shm_region_collected(r));

    /* The right one: the region, mapped, the worker's bytes in it. */
    cr_assert_eq(collect(&s, sl_shm_region_ticket(r), &m), 0, "%s", err);
    cr_assert(sl_shm_region_collected(r));
    const char text[] = "batch bytes";
    struct iovec part = {(void *)text, sizeof text};
    uint64_t off, len;
    cr_assert_eq(sl_shm_region_put(r, &part, 1, &off, &len), 0);
    cr_assert_eq(len, sizeof text);
    uint64_t seq;
    const uint8_t *p = sl__shm_slot(m, off, len, &seq, err, sizeof err);
    cr_assert_not_null(p, "%s", err);
    cr_assert_str_eq((const char *)p, text);

    /* Once: the same ticket again gets nothing. */
    sl_shm_map_t *again = NULL;
    cr_assert_eq(collect(&s, sl_shm_region_ticket(r), &again), SL_EAUTH, "%s", err);
    cr_assert_null(again);

    /* The worker's region goes; the client's mapping keeps the pages. */
    sl_shm_region_free(r);
    cr_assert_str_eq((const char *)p, text);
    sl__shm_slot_done(m, seq);
    cr_assert_eq(sl__shm_released(m), 1);
    sl__shm_unref(m);
    side_stop(&s);
}

Test(shm, a_ticket_that_trickles_in_gets_no_more_than_its_time, .timeout = 60)
{
    /* A byte every 300 ms: the whole ticket would take 4.8 s, and the lane
     * gives a connection 2 s from its accept however its bytes come. */
    struct side s;
    side_start(&s, 1 << 20, NULL);
    sl_shm_region_t *r = sl_shm_region_new(s.lane, err, sizeof err);
    cr_assert_not_null(r, "%s", err);
    side_run(&s);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    const char *name = sl_shm_lane_name(s.lane);
    memcpy(sa.sun_path + 1, name, strlen(name));
    int c = socket(AF_UNIX, SOCK_STREAM, 0);
    cr_assert_eq(connect(c, (struct sockaddr *)&sa, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
                                                               strlen(name))),
                 0);
    const uint8_t *ticket = sl_shm_region_ticket(r);
    size_t sent = 0;
    for (; sent < SL_SHM_TICKET_LEN; sent++) {
        if (send(c, ticket + sent, 1, MSG_NOSIGNAL) != 1)
            break; /* closed on us: the time was up */
        struct timespec ms = {0, 300 * 1000000};
        nanosleep(&ms, NULL);
    }
    char byte;
    ssize_t n = recv(c, &byte, 1, 0); /* EOF: nothing handed over */
    close(c);
    side_pause(&s);
    cr_assert_leq(n, 0, "the lane handed the region over to a ticket that took %zu sends", sent);
    cr_assert_not(sl_shm_region_collected(r));
    sl_shm_region_free(r);
    side_stop(&s);
}

Test(shm, no_lane_of_that_name_is_a_refused_connect)
{
    /* What a worker on another host (or network namespace) looks like. */
    uint8_t ticket[SL_SHM_TICKET_LEN] = {0};
    sl_shm_map_t *m = NULL;
    int rc = shm_collect("sluice-shm-no-such-lane", ticket, sizeof ticket, 1000, 1 << 20, &m, err, sizeof err);
    cr_assert_eq(rc, -ECONNREFUSED, "%d: %s", rc, err);
    cr_assert_null(m);
}

/* Hands memfd fd over on connection c as a lane does: one byte with the
 * descriptor (the test's own lanes build it beside workerd/shm.c's, which
 * only ever hands over a sealed region). */
static void hand_over(int c, int fd)
{
    char byte = 'S';
    struct iovec iov = {&byte, 1};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    memset(&u, 0, sizeof u);
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    if (sendmsg(c, &msg, MSG_NOSIGNAL) != 1)
        abort();
}

/* A lane of the test's own that hands over a memfd its worker could
 * shrink under the client's mapping (no F_SEAL_SHRINK). */
static void *unsealed_lane(void *arg)
{
    int lfd = *(int *)arg;
    int c = accept(lfd, NULL, NULL);
    uint8_t ticket[SL_SHM_TICKET_LEN];
    size_t have = 0;
    while (have < sizeof ticket) {
        ssize_t n = recv(c, ticket + have, sizeof ticket - have, 0);
        if (n <= 0)
            break;
        have += (size_t)n;
    }
    int fd = memfd_create("unsealed", MFD_CLOEXEC);
    if (ftruncate(fd, 1 << 20) < 0)
        abort();
    hand_over(c, fd);
    close(fd);
    close(c);
    return NULL;
}

Test(shm, a_region_its_worker_could_shrink_is_refused)
{
    char name[64];
    snprintf(name, sizeof name, "sluice-test-unsealed-%d", (int)getpid());
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path + 1, name, strlen(name));
    int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    cr_assert_eq(bind(lfd, (struct sockaddr *)&sa, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 +
                                                                strlen(name))),
                 0);
    cr_assert_eq(listen(lfd, 1), 0);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, unsealed_lane, &lfd), 0);
    uint8_t ticket[SL_SHM_TICKET_LEN] = {0};
    sl_shm_map_t *m = NULL;
    int rc = shm_collect(name, ticket, sizeof ticket, 5000, 1 << 30, &m, err, sizeof err);
    pthread_join(th, NULL);
    close(lfd);
    cr_assert_eq(rc, SL_EPROTO, "%d: %s", rc, err);
    cr_assert(strstr(err, "not a sealed memfd"), "%s", err);
    cr_assert_null(m);
}

/* A lane of the test's own that takes the ticket, then waits for the test's
 * word on a pipe (a byte: go; EOF: never) before it hands a sealed memfd
 * over. */
struct slow_lane {
    int lfd, go[2];
    char name[64];
    pthread_t thread;
};

static void *slow_lane_main(void *arg)
{
    struct slow_lane *l = arg;
    int c = accept(l->lfd, NULL, NULL);
    uint8_t ticket[SL_SHM_TICKET_LEN];
    size_t have = 0;
    while (c >= 0 && have < sizeof ticket) {
        ssize_t n = recv(c, ticket + have, sizeof ticket - have, 0);
        if (n <= 0)
            break;
        have += (size_t)n;
    }
    char go;
    if (c >= 0 && read(l->go[0], &go, 1) == 1) {
        int fd = memfd_create("slow", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0 || ftruncate(fd, 1 << 20) < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0)
            abort();
        hand_over(c, fd);
        close(fd);
    }
    if (c >= 0)
        close(c);
    return NULL;
}

static void slow_lane_start(struct slow_lane *l, const char *tag)
{
    snprintf(l->name, sizeof l->name, "sluice-test-%s-%d", tag, (int)getpid());
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path + 1, l->name, strlen(l->name));
    l->lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    cr_assert_eq(bind(l->lfd, (struct sockaddr *)&sa,
                      (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(l->name))),
                 0);
    cr_assert_eq(listen(l->lfd, 1), 0);
    cr_assert_eq(pipe(l->go), 0);
    cr_assert_eq(pthread_create(&l->thread, NULL, slow_lane_main, l), 0);
}

static void slow_lane_stop(struct slow_lane *l)
{
    close(l->go[1]); /* EOF: a lane still waiting hands nothing over */
    pthread_join(l->thread, NULL);
    close(l->go[0]);
    close(l->lfd);
}

struct fetch_run {
    struct event_base *base;
    struct slow_lane *lane;
    int ticks, ticks_at_done, calls, rc;
    sl_shm_map_t *m;
    char why[300];
};

/* The loop's other work: a tick every millisecond; at the 20th the lane
 * is told to answer. */
static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct fetch_run *r = arg;
    if (++r->ticks == 20 && r->lane && write(r->lane->go[1], "g", 1) != 1)
        abort();
}

static void on_fetched(sl_shm_map_t *m, int rc, const char *why, void *arg)
{
    struct fetch_run *r = arg;
    r->calls++;
    r->m = m;
    r->rc = rc;
    r->ticks_at_done = r->ticks;
    snprintf(r->why, sizeof r->why, "%s", why);
    event_base_loopbreak(r->base);
}

/* A collection runs on the caller's loop a step at a time: the loop goes on
 * with its other work while the lane has not answered (here until the loop
 * has ticked 20 times, which a collection that blocked the loop would never
 * let happen), and the region is mapped once it comes. */
Test(shm, a_fetch_leaves_its_loop_to_its_other_work_until_the_region_comes, .timeout = 60)
{
    struct slow_lane lane;
    slow_lane_start(&lane, "slow");
    struct fetch_run r = {.base = event_base_new(), .lane = &lane};
    struct event *tick = event_new(r.base, -1, EV_PERSIST, on_tick, &r);
    struct timeval ms = {0, 1000};
    event_add(tick, &ms);
    uint8_t ticket[SL_SHM_TICKET_LEN] = {1, 2, 3};
    sl_shm_fetch_t *f = NULL;
    cr_assert_eq(sl__shm_fetch(r.base, lane.name, ticket, sizeof ticket, 60000, 1 << 30, on_fetched, &r, &f, err,
                               sizeof err),
                 0, "%s", err);
    cr_assert_not_null(f);
    cr_assert_eq(r.calls, 0, "done was called from the fetch's own call");
    event_base_dispatch(r.base);
    cr_assert_eq(r.calls, 1);
    cr_assert_eq(r.rc, 0, "%s", r.why);
    cr_assert_geq(r.ticks_at_done, 20, "the region came after %d ticks of the loop", r.ticks_at_done);
    uint64_t seq;
    cr_assert_not_null(sl__shm_slot(r.m, 0, 4096, &seq, err, sizeof err), "%s", err);
    sl__shm_slot_done(r.m, seq);
    sl__shm_unref(r.m);
    event_free(tick);
    event_base_free(r.base);
    slow_lane_stop(&lane);
}

/* A lane that never answers: the fetch ends at its time with the step it
 * was at named, or, cancelled, never calls back (and holds nothing: the
 * leak checker of the ASan build). */
Test(shm, a_fetch_ends_at_its_time_or_when_cancelled, .timeout = 60)
{
    struct slow_lane lane;
    slow_lane_start(&lane, "mute");
    struct fetch_run r = {.base = event_base_new()};
    uint8_t ticket[SL_SHM_TICKET_LEN] = {0};
    sl_shm_fetch_t *f = NULL;
    cr_assert_eq(sl__shm_fetch(r.base, lane.name, ticket, sizeof ticket, 50, 1 << 30, on_fetched, &r, &f, err,
                               sizeof err),
                 0, "%s", err);
    event_base_dispatch(r.base);
    cr_assert_eq(r.calls, 1);
    cr_assert_eq(r.rc, -ETIMEDOUT, "%d: %s", r.rc, r.why);
    cr_assert(strstr(r.why, "waiting for the region from @sluice-test-mute"), "%s", r.why);
    cr_assert_null(r.m);
    slow_lane_stop(&lane);

    slow_lane_start(&lane, "mute2");
    r.calls = 0;
    cr_assert_eq(sl__shm_fetch(r.base, lane.name, ticket, sizeof ticket, 60000, 1 << 30, on_fetched, &r, &f, err,
                               sizeof err),
                 0, "%s", err);
    struct timeval ms = {0, 20000};
    event_base_loopexit(r.base, &ms);
    event_base_dispatch(r.base);
    sl__shm_fetch_cancel(f);
    event_base_loopexit(r.base, &ms);
    event_base_dispatch(r.base);
    cr_assert_eq(r.calls, 0, "a cancelled fetch called back");
    event_base_free(r.base);
    slow_lane_stop(&lane);
}

Test(shm, the_worker_refuses_slots_given_back_that_it_did_not_lend)
{
    struct side s;
    side_start(&s, 1 << 20, NULL);
    sl_shm_region_t *r = sl_shm_region_new(s.lane, err, sizeof err);
    cr_assert_not_null(r, "%s", err);
    uint8_t b[100] = {0};
    struct iovec part = {b, sizeof b};
    uint64_t off, len;
    cr_assert_eq(sl_shm_region_put(r, &part, 1, &off, &len), 0);
    cr_assert_eq(sl_shm_region_put(r, &part, 1, &off, &len), 0);
    cr_assert_eq(sl_shm_region_released(r, 3, err, sizeof err), SL_EPROTO);
    cr_assert(strstr(err, "2 slots of shared memory were lent"), "%s", err);
    cr_assert_eq(sl_shm_region_released(r, 2, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_shm_region_lent(r), 0);
    cr_assert_eq(sl_shm_region_released(r, 1, err, sizeof err), SL_EPROTO); /* less than before */
    sl_shm_region_free(r);
    side_stop(&s);
}

/* Descriptors the process has open. */
static int open_fds(void)
{
    int n = 0;
    for (int fd = 0; fd < 4096; fd++)
        n += fcntl(fd, F_GETFD) >= 0;
    return n;
}

Test(shm, at_most_64_regions_wait_to_be_collected_and_a_collected_one_holds_no_descriptor)
{
    struct side s;
    side_start(&s, 1 << 20, NULL);
    static sl_shm_region_t *r[SL_SHM_MAX_WAITING + 1];
    for (int i = 0; i < SL_SHM_MAX_WAITING; i++) {
        r[i] = sl_shm_region_new(s.lane, err, sizeof err);
        cr_assert_not_null(r[i], "region %d: %s", i, err);
    }
    /* Each waiting region holds its memfd: a client that never collects
     * cannot make the worker hold more than 64. */
    cr_assert_null(sl_shm_region_new(s.lane, err, sizeof err));
    cr_assert(strstr(err, "64 regions offered wait to be collected"), "%s", err);
    int before = open_fds();
    sl_shm_map_t *m = NULL;
    cr_assert_eq(collect(&s, sl_shm_region_ticket(r[7]), &m), 0, "%s", err);
    cr_assert_eq(open_fds(), before - 1, "the collected region's memfd is closed on both sides");
    r[SL_SHM_MAX_WAITING] = sl_shm_region_new(s.lane, err, sizeof err);
    cr_assert_not_null(r[SL_SHM_MAX_WAITING], "%s", err);
    sl_shm_region_free(r[3]); /* a waiting one that goes makes room too */
    r[3] = sl_shm_region_new(s.lane, err, sizeof err);
    cr_assert_not_null(r[3], "%s", err);
    for (int i = 0; i <= SL_SHM_MAX_WAITING; i++)
        sl_shm_region_free(r[i]);
    sl__shm_unref(m);
    side_stop(&s);
}

Test(shm, pages_count_against_the_budget_and_a_refusal_is_only_a_fallback)
{
    sl_membudget_t budget;
    sl_membudget_init(&budget, 3 * SL_SHM_ALIGN, "--max-memory-mb");
    struct side s;
    side_start(&s, 16 * SL_SHM_ALIGN, &budget);
    sl_shm_region_t *r = sl_shm_region_new(s.lane, err, sizeof err);
    cr_assert_not_null(r, "%s", err);
    static uint8_t b[2 * SL_SHM_ALIGN];
    struct iovec part = {b, sizeof b};
    uint64_t off, len;
    cr_assert_eq(sl_shm_region_put(r, &part, 1, &off, &len), 0);
    cr_assert_eq(sl_membudget_used(&budget), 2 * SL_SHM_ALIGN);
    /* Two more pages are over the budget: the batch goes over TCP. */
    cr_assert_eq(sl_shm_region_put(r, &part, 1, &off, &len), -ENOSPC);
    cr_assert_eq(budget.refusals, 0, "a fallback is not a refusal");
    /* Given back, the slot's pages serve again, charged once. */
    cr_assert_eq(sl_shm_region_released(r, 1, err, sizeof err), 0);
    cr_assert_eq(sl_shm_region_put(r, &part, 1, &off, &len), 0);
    cr_assert_eq(off, 0);
    cr_assert_eq(sl_membudget_used(&budget), 2 * SL_SHM_ALIGN);
    sl_shm_region_free(r);
    cr_assert_eq(sl_membudget_used(&budget), 0);
    side_stop(&s);
}

/* A client with k batches of one size out keeps the worker to about k + 1
 * slots' pages of a large region, lap after lap: pages once written and
 * mapped serve again (a ring that wrapped only at the region's end wrote
 * and mapped every page of it once a lap). */
Test(shm, steady_batches_keep_to_the_first_pages_of_the_region)
{
    struct side s;
    side_start(&s, 1024 * SL_SHM_ALIGN, NULL);
    sl_shm_region_t *r = sl_shm_region_new(s.lane, err, sizeof err);
    cr_assert_not_null(r, "%s", err);
    static uint8_t b[3 * SL_SHM_ALIGN - 100];
    struct iovec part = {b, sizeof b};
    const uint64_t ext = 3 * SL_SHM_ALIGN;
    uint64_t lent = 0, back = 0, top = 0;
    for (unsigned k = 1; k <= 16; k++) {
        for (int i = 0; i < 2000; i++) {
            uint64_t off, len;
            cr_assert_eq(sl_shm_region_put(r, &part, 1, &off, &len), 0, "k %u, slot %lu", k, (unsigned long)lent);
            lent++;
            cr_assert_leq(off + ext, (k + 1) * ext, "k %u: slot %lu at page %lu: past %u slots' pages", k,
                          (unsigned long)lent, (unsigned long)(off / SL_SHM_ALIGN), k + 1);
            if (off + ext > top)
                top = off + ext;
            if (lent - back == k) /* the client holds k: the oldest comes back */
                cr_assert_eq(sl_shm_region_released(r, ++back, err, sizeof err), 0, "%s", err);
        }
    }
    cr_assert_leq(top, 17 * ext);
    sl_shm_region_free(r);
    side_stop(&s);
}

/* The answer to a DYNAMIC batch of 1024 int64 (8 KiB of tensor bytes)
 * whose provenance is prov_len bytes and whose tallies tally_len bytes
 * follow them: every offset counts from the tensor bytes' start. */
static sluice_GetElementResponse tail_answer(size_t prov_len, size_t tally_len)
{
    sluice_GetElementResponse resp = {.task_id = 3, .num_elements = 1024, .components_count = 1,
                                      .provenance_offset = 8192, .provenance_length = prov_len,
                                      .tallies_offset = 8192 + prov_len, .tallies_length = tally_len};
    snprintf(resp.components[0].name, sizeof resp.components[0].name, "value");
    resp.components[0].dtype = SL_DTYPE_INT64;
    resp.components[0].shape_count = 1;
    resp.components[0].shape[0] = 1024;
    resp.components[0].length = 8192;
    return resp;
}

/* What the client makes of one batch sent either way: with its
 * provenance and tallies after the tensor bytes in the slot (a worker
 * before GetElementRequest.shm_tail_in_answer, or a tail past 256 bytes:
 * a shuffled batch's runs), or in the answer's shm_tail, the slot holding
 * the tensor bytes alone, which then take two pages, not three. An offset
 * that points into the tensor bytes is refused by name. */
Test(shm, a_batchs_tail_comes_in_the_slot_or_in_the_answer_alike)
{
    struct side s;
    side_start(&s, 64 * SL_SHM_ALIGN, NULL);
    sl_shm_region_t *r = sl_shm_region_new(s.lane, err, sizeof err);
    cr_assert_not_null(r, "%s", err);
    sl_shm_map_t *m = NULL;
    cr_assert_eq(collect(&s, sl_shm_region_ticket(r), &m), 0, "%s", err);
    static int64_t values[1024];
    for (int i = 0; i < 1024; i++)
        values[i] = 5000 + i;
    sluice_GetElementResponse resp;
    for (int shuffled = 0; shuffled < 2; shuffled++) {
        /* One run, or 1024 runs of one record each (a shuffle's). */
        static sl_provenance_run_t runs[1024];
        unsigned nruns = shuffled ? 1024 : 1;
        for (unsigned i = 0; i < nruns; i++)
            runs[i] = (sl_provenance_run_t){0, 0, shuffled ? 5000 + (i * 7919) % 1024 : 5000, shuffled ? 1 : 1024};
        sl_split_done_t row = {.epoch = 0, .file_index = 0, .begin = 4096, .end = 8192, .delivered = 1024};
        uint8_t *prov = NULL, *tally = NULL;
        size_t plen = 0, tlen = 0;
        cr_assert_eq(sl_provwire_encode(runs, nruns, &prov, &plen), 0);
        cr_assert_eq(sl_provwire_encode_done(&row, 1, &tally, &tlen), 0);
        cr_assert_eq(shuffled, plen + tlen > sizeof resp.shm_tail.bytes, "tail of %zu bytes", plen + tlen);
        struct iovec parts[3] = {{values, sizeof values}, {prov, plen}, {tally, tlen}};
        for (int in_answer = 0; in_answer < 2 - shuffled; in_answer++) {
            uint64_t off, len, seq;
            cr_assert_eq(sl_shm_region_put(r, parts, in_answer ? 1 : 3, &off, &len), 0);
            cr_assert_eq(len, in_answer ? 8192 : 8192 + plen + tlen);
            /* The next slot starts past this one's pages. */
            uint64_t off2, len2;
            cr_assert_eq(sl_shm_region_put(r, parts, 1, &off2, &len2), 0);
            cr_assert_eq(off2 - off, (in_answer ? 2 : 3) * (uint64_t)SL_SHM_ALIGN, "in_answer %d", in_answer);
            const uint8_t *slot = sl__shm_slot(m, off, len, &seq, err, sizeof err);
            cr_assert_not_null(slot, "%s", err);
            uint64_t seq2;
            cr_assert_not_null(sl__shm_slot(m, off2, len2, &seq2, err, sizeof err), "%s", err);
            resp = tail_answer(plen, tlen);
            if (in_answer) {
                memcpy(resp.shm_tail.bytes, prov, plen);
                memcpy(resp.shm_tail.bytes + plen, tally, tlen);
                resp.shm_tail.size = (pb_size_t)(plen + tlen);
            }
            struct sl_batch *b = sl__batch_from_shm(&resp, m, slot, len, seq, err, sizeof err);
            cr_assert_not_null(b, "shuffled %d, in_answer %d: %s", shuffled, in_answer, err);
            cr_assert_eq(b->tail_in_answer, in_answer);
            /* Copied out of the memory the worker can still write. */
            cr_assert(b->prov_wire + b->prov_wire_len <= slot || b->prov_wire >= slot + len,
                      "shuffled %d: the provenance is read in shared memory", shuffled);
            cr_assert_eq(b->num_elements, 1024);
            cr_assert_eq(memcmp(sl_batch_find(b, "value")->data, values, sizeof values), 0);
            cr_assert_eq(b->num_records, 1024);
            cr_assert_eq(b->num_tally, 1);
            cr_assert_eq(b->tally[0].delivered, 1024);
            cr_assert_eq(b->tally[0].begin, 4096);
            sl_provenance_run_t *got = NULL;
            uint64_t ngot = 0;
            cr_assert_eq(sl_provwire_decode(b->prov_wire, b->prov_wire_len, b->num_records, &got, &ngot, err,
                                            sizeof err), 0, "%s", err);
            cr_assert_eq(ngot, nruns);
            cr_assert_eq(memcmp(got, runs, nruns * sizeof *got), 0);
            free(got);
            sl_batch_release(b);
            sl__shm_slot_done(m, seq2);
            cr_assert_eq(sl_shm_region_released(r, sl__shm_released(m), err, sizeof err), 0, "%s", err);
        }
        if (shuffled) {
            /* A long tail whose tallies count more than the batch has: the
             * batch allocated with its tail is refused and freed whole. */
            sl_split_done_t over = row;
            over.delivered = 1025;
            free(tally);
            cr_assert_eq(sl_provwire_encode_done(&over, 1, &tally, &tlen), 0);
            parts[2] = (struct iovec){tally, tlen};
            uint64_t off, len, seq;
            cr_assert_eq(sl_shm_region_put(r, parts, 3, &off, &len), 0);
            const uint8_t *slot = sl__shm_slot(m, off, len, &seq, err, sizeof err);
            cr_assert_not_null(slot, "%s", err);
            resp = tail_answer(plen, tlen);
            cr_assert_null(sl__batch_from_shm(&resp, m, slot, len, seq, err, sizeof err));
            cr_assert(strstr(err, "tally 0 (split [4096, 8192) of file 0 of epoch 0) counts 1025 records"), "%s", err);
            cr_assert_eq(sl_shm_region_released(r, sl__shm_released(m), err, sizeof err), 0, "%s", err);
        }
        free(prov);
        free(tally);
    }
    /* Provenance said to start inside the tensor bytes, the tail in the
     * answer: refused, the slot given back. */
    uint64_t off, len, seq;
    struct iovec part = {values, sizeof values};
    cr_assert_eq(sl_shm_region_put(r, &part, 1, &off, &len), 0);
    const uint8_t *slot = sl__shm_slot(m, off, len, &seq, err, sizeof err);
    cr_assert_not_null(slot, "%s", err);
    resp = tail_answer(8, 0);
    resp.provenance_offset = 100;
    resp.shm_tail.size = 8;
    cr_assert_null(sl__batch_from_shm(&resp, m, slot, len, seq, err, sizeof err));
    cr_assert(strstr(err, "has its provenance at offset 100, within its 8192 tensor bytes, not in the 8 bytes of its "
                          "shm_tail"), "%s", err);
    cr_assert_eq(sl_shm_region_released(r, sl__shm_released(m), err, sizeof err), 0, "%s", err);
    sl__shm_unref(m);
    sl_shm_region_free(r);
    side_stop(&s);
}

/* A slot lent in the model: where, how long, the byte it was filled with. */
struct lent {
    uint64_t off, len, seq;
    const uint8_t *p; /* the client's view of it */
    uint8_t fill;
    bool done;
};

/* Whether size bytes (in whole pages) fit in a gap between the n slots
 * of the model, in a region of region bytes: every page of the region,
 * marked. */
static bool fits(const struct lent *live, unsigned n, size_t region, uint64_t size)
{
    size_t pages = region / SL_SHM_ALIGN, need = (size + SL_SHM_ALIGN - 1) / SL_SHM_ALIGN;
    bool *used = calloc(pages, 1);
    cr_assert_not_null(used);
    for (unsigned i = 0; i < n; i++)
        for (uint64_t pg = live[i].off / SL_SHM_ALIGN; pg * SL_SHM_ALIGN < live[i].off + live[i].len; pg++)
            used[pg] = true;
    size_t run = 0;
    bool ok = false;
    for (size_t pg = 0; pg < pages && !ok; pg++) {
        run = used[pg] ? 0 : run + 1;
        ok = run >= need;
    }
    free(used);
    return ok;
}

Test(shm, slots_lent_never_overlap_and_come_back_in_order_property, .timeout = 120)
{
    unsigned seed = test_seed("shm slots");
    uint64_t st = seed;
    struct side s;
    for (int round = 0; round < 20; round++) {
        size_t region = SL_SHM_ALIGN * (size_t)(4 + splitmix64(&st) % 4096); /* 16 KiB to 16 MiB */
        side_start(&s, region, NULL);
        sl_shm_region_t *r = sl_shm_region_new(s.lane, err, sizeof err);
        cr_assert_not_null(r, "%s", err);
        sl_shm_map_t *m = NULL;
        cr_assert_eq(collect(&s, sl_shm_region_ticket(r), &m), 0, "%s", err);
        static struct lent live[SL_SHM_MAX_SLOTS * 4];
        unsigned n = 0;
        uint64_t told = 0, puts = 0, full = 0;
        uint8_t *buf = malloc(region);
        cr_assert_not_null(buf);
        for (int step = 0; step < 3000; step++) {
            uint64_t d = splitmix64(&st) % 10;
            if (d < 5) { /* the worker lends a slot of a random size */
                uint64_t size = 1 + splitmix64(&st) % (splitmix64(&st) % 4 == 0 ? region : region / 8);
                uint8_t fill = (uint8_t)splitmix64(&st);
                memset(buf, fill, size);
                struct iovec parts[2] = {{buf, size / 2}, {buf + size / 2, size - size / 2}};
                uint64_t off, len;
                int rc = sl_shm_region_put(r, parts, 2, &off, &len);
                if (rc == -ENOSPC) {
                    /* Refused only when it could not fit: every slot out,
                     * or no gap between the slots lent holds its pages. */
                    full++;
                    cr_assert(n == SL_SHM_MAX_SLOTS || !fits(live, n, region, size),
                              "seed %u: %lu bytes refused with %u slots lent and room for them", seed,
                              (unsigned long)size, n);
                    continue;
                }
                cr_assert_eq(rc, 0);
                cr_assert_lt(n, SL_SHM_MAX_SLOTS, "seed %u: more slots lent than the bound", seed);
                cr_assert_eq(len, size);
                cr_assert_eq(off % SL_SHM_ALIGN, 0);
                cr_assert_leq(off + len, region);
                for (unsigned i = 0; i < n; i++)
                    if (!live[i].done)
                        cr_assert(off + len <= live[i].off || live[i].off + live[i].len <= off,
                                  "seed %u: [%lu, +%lu) overlaps a lent slot [%lu, +%lu)", seed, (unsigned long)off,
                                  (unsigned long)len, (unsigned long)live[i].off, (unsigned long)live[i].len);
                uint64_t seq;
                const uint8_t *p = sl__shm_slot(m, off, len, &seq, err, sizeof err);
                cr_assert_not_null(p, "seed %u: %s", seed, err);
                cr_assert_lt(n, sizeof live / sizeof live[0]);
                live[n++] = (struct lent){off, len, seq, p, fill, false};
                puts++;
            } else if (n > 0) { /* the client is done with any slot it holds */
                unsigned i = (unsigned)(splitmix64(&st) % n);
                if (live[i].done)
                    continue;
                /* What it reads is what the worker wrote for it, whatever came after. */
                for (uint64_t k = 0; k < live[i].len; k += 1 + live[i].len / 64)
                    cr_assert_eq(live[i].p[k], live[i].fill, "seed %u: slot at %lu changed under its holder", seed,
                                 (unsigned long)live[i].off);
                cr_assert_eq(live[i].p[live[i].len - 1], live[i].fill, "seed %u", seed);
                live[i].done = true;
                sl__shm_slot_done(m, live[i].seq);
                /* In order: the first slots all done, and only they, come back. */
                uint64_t back = sl__shm_released(m);
                cr_assert_geq(back, told);
                cr_assert_eq(sl_shm_region_released(r, back, err, sizeof err), 0, "seed %u: %s", seed, err);
                told = back;
                unsigned k = 0;
                while (k < n && live[k].done)
                    k++;
                memmove(live, live + k, (n - k) * sizeof live[0]);
                n -= k;
            }
        }
        for (unsigned i = 0; i < n; i++) /* what the client still holds goes back, as its batches would */
            if (!live[i].done)
                sl__shm_slot_done(m, live[i].seq);
        cr_assert_gt(puts, 0, "seed %u", seed);
        cr_assert_gt(full, 0, "seed %u: the ring never filled: the test did not reach its bound", seed);
        free(buf);
        sl_shm_region_free(r);
        sl__shm_unref(m);
        side_stop(&s);
    }
}

/* ---- blocks made in a region and lent (shm.h) ---- */

struct made {
    sl_shm_region_t *r;
    size_t size;
    uint8_t *p;
};

static void *make_block(void *arg)
{
    struct made *m = arg;
    m->p = sl_shm_region_alloc(m->r, m->size);
    if (m->p)
        memset(m->p, 0x5a, m->size);
    return NULL;
}

static void unheld(void *hold)
{
    (*(int *)hold)++;
}

/* A block the pipeline's thread made in the region is the slot itself:
 * the client reads the bytes written there, giving the slot back lets go
 * of the hold but not of the block, the block's pages serve again only
 * once it is freed (through sl__big_free(), as a batch's data is), and the
 * region outlives its connection until its last block goes, its pages'
 * charge with it. */
Test(shm, a_block_made_in_the_region_is_lent_and_lives_until_freed)
{
    sl_membudget_t budget;
    sl_membudget_init(&budget, 64 * SL_SHM_ALIGN, "--max-memory-mb");
    struct side s;
    side_start(&s, 16 * SL_SHM_ALIGN, &budget);
    sl_shm_region_t *r = sl_shm_region_new(s.lane, err, sizeof err);
    cr_assert_not_null(r, "%s", err);
    sl_shm_map_t *m = NULL;
    cr_assert_eq(collect(&s, sl_shm_region_ticket(r), &m), 0, "%s", err);

    struct made mk = {r, 3 * SL_SHM_ALIGN - 100, NULL};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, make_block, &mk), 0);
    pthread_join(th, NULL);
    cr_assert_not_null(mk.p);
    cr_assert(sl_shm_region_holds(r, mk.p));
    cr_assert_eq(sl_membudget_used(&budget), 3 * SL_SHM_ALIGN);
    cr_assert_eq(sl_shm_region_block_room(r, mk.p), 3 * SL_SHM_ALIGN, "its pages, the room after it included");
    cr_assert_eq(sl_shm_region_block_room(r, mk.p + 1), 0, "no block starts there");

    int holds = 0;
    uint64_t off, len, seq, off2;
    cr_assert_eq(sl_shm_region_lend(r, mk.p, mk.size, unheld, &holds, &off), 0);
    const uint8_t *slot = sl__shm_slot(m, off, mk.size, &seq, err, sizeof err);
    cr_assert_not_null(slot, "%s", err);
    cr_assert_eq(slot[0], 0x5a);
    cr_assert_eq(slot[mk.size - 1], 0x5a);
    cr_assert_eq(sl_shm_region_lent(r), 1);

    /* Memory outside the region is not lent. */
    uint8_t outside[64];
    cr_assert_eq(sl_shm_region_lend(r, outside, sizeof outside, unheld, &holds, &off2), -ENOSPC);
    cr_assert(!sl_shm_region_holds(r, outside));
    cr_assert_eq(sl_shm_region_block_room(r, outside), 0);

    /* A copied slot goes past the block. */
    static uint8_t b[SL_SHM_ALIGN];
    struct iovec part = {b, sizeof b};
    cr_assert_eq(sl_shm_region_put(r, &part, 1, &off2, &len), 0);
    cr_assert_eq(off2, 3 * SL_SHM_ALIGN);

    /* Given back: the hold goes, the block stays. */
    sl__shm_slot_done(m, seq);
    cr_assert_eq(sl_shm_region_released(r, 1, err, sizeof err), 0, "%s", err);
    cr_assert_eq(holds, 1);
    struct made mk2 = {r, SL_SHM_ALIGN, NULL};
    make_block(&mk2);
    cr_assert_eq(mk2.p, (uint8_t *)mk.p + 4 * SL_SHM_ALIGN, "the block's pages are still in use");
    /* Freed, its pages serve the next block. */
    sl__big_free(mk.p);
    struct made mk3 = {r, 2 * SL_SHM_ALIGN, NULL};
    make_block(&mk3);
    cr_assert_eq(mk3.p, mk.p);

    /* The connection lets the region go with two blocks out, one lent:
     * its hold goes, no block is made any more, and the blocks stay
     * writable until freed. */
    cr_assert_eq(sl_shm_region_lend(r, mk3.p, 2 * SL_SHM_ALIGN, unheld, &holds, &off), 0);
    sl_shm_region_free(r);
    cr_assert_eq(holds, 2);
    memset(mk2.p, 1, SL_SHM_ALIGN);
    memset(mk3.p, 2, 2 * SL_SHM_ALIGN);
    cr_assert_gt(sl_membudget_used(&budget), 0);
    sl__big_free(mk2.p);
    cr_assert_gt(sl_membudget_used(&budget), 0);
    sl__big_free(mk3.p); /* the last one: the region goes */
    cr_assert_eq(sl_membudget_used(&budget), 0);
    /* The client's mapping stays, with what was written last. */
    cr_assert_eq(slot[0], 2);
    sl__shm_unref(m);
    side_stop(&s);
}

Test(shm, blocks_are_bounded_and_a_closed_region_makes_none)
{
    struct side s;
    side_start(&s, 4 * SL_SHM_MAX_BLOCKS * SL_SHM_ALIGN, NULL);
    sl_shm_region_t *r = sl_shm_region_new(s.lane, err, sizeof err);
    cr_assert_not_null(r, "%s", err);
    void *p[SL_SHM_MAX_BLOCKS];
    for (int i = 0; i < SL_SHM_MAX_BLOCKS; i++)
        cr_assert_not_null(p[i] = sl_shm_region_alloc(r, 100), "block %d", i);
    cr_assert_null(sl_shm_region_alloc(r, 100), "more than %d blocks", SL_SHM_MAX_BLOCKS);
    /* Too large for the region: NULL, the caller allocates elsewhere. */
    sl__big_free(p[0]);
    cr_assert_null(sl_shm_region_alloc(r, 4 * SL_SHM_MAX_BLOCKS * SL_SHM_ALIGN + 1));
    cr_assert_not_null(p[0] = sl_shm_region_alloc(r, 100));
    /* A task's reference keeps the region; closed, it makes no block. */
    sl_shm_region_ref(r);
    sl_shm_region_free(r);
    cr_assert_null(sl_shm_region_alloc(r, 100));
    for (int i = 0; i < SL_SHM_MAX_BLOCKS; i++)
        sl__big_free(p[i]);
    sl_shm_region_unref(r);
    side_stop(&s);
}

/* The model of the property test below: blocks a "pipeline" thread makes,
 * each filled with its own byte, handed to the loop through a queue. */
#define PROP_BLOCKS 256
struct prop {
    sl_shm_region_t *r;
    size_t region;
    uint64_t st; /* the thread's draws */
    pthread_mutex_t mu;
    struct made made[PROP_BLOCKS]; /* made, not yet taken by the loop */
    unsigned nmade;
    uint8_t *to_free[PROP_BLOCKS]; /* the loop is done with them: the thread frees them */
    unsigned nfree;
    bool stop;
    unsigned allocated, refused;
    pthread_cond_t made_one; /* after each try */
};

static void *prop_pipeline(void *arg)
{
    struct prop *pr = arg;
    for (;;) {
        pthread_mutex_lock(&pr->mu);
        bool stop = pr->stop;
        uint8_t *f = pr->nfree ? pr->to_free[--pr->nfree] : NULL;
        bool room = pr->nmade < PROP_BLOCKS;
        size_t size = 1 + splitmix64(&pr->st) % (pr->region / 6);
        pthread_mutex_unlock(&pr->mu);
        if (f)
            sl__big_free(f); /* a batch whose last reference goes on this thread */
        if (stop && !f)
            return NULL;
        if (!room || stop) {
            sched_yield();
            continue;
        }
        uint8_t *p = sl_shm_region_alloc(pr->r, size);
        pthread_mutex_lock(&pr->mu);
        if (p) {
            memset(p, (uint8_t)(pr->allocated * 7 + 1), size);
            pr->made[pr->nmade++] = (struct made){pr->r, size, p};
            pr->allocated++;
        } else {
            pr->refused++;
        }
        pthread_cond_broadcast(&pr->made_one);
        pthread_mutex_unlock(&pr->mu);
    }
}

/* What the loop holds in the model: a copied slot or a lent block, and
 * which it still must free. */
struct held_thing {
    uint8_t *worker_p; /* the block (NULL: a copied slot) */
    uint64_t off, len, seq;
    const uint8_t *client_p;
    uint8_t fill;
    bool lent, released;
};

static void check_fill(const uint8_t *p, uint64_t len, uint8_t fill, unsigned seed, const char *what)
{
    for (uint64_t k = 0; k < len; k += 1 + len / 32)
        cr_assert_eq(p[k], fill, "seed %u: %s at byte %lu changed", seed, what, (unsigned long)k);
    cr_assert_eq(p[len - 1], fill, "seed %u: %s's last byte changed", seed, what);
}

/* Blocks made on another thread while the loop copies slots, lends blocks
 * and takes slots back, in a region of a drawn size: no block or slot
 * overlaps another while in use (each keeps the byte it was filled with,
 * on both sides, until freed or given back), the region stays within its
 * bounds, and once every block is freed the region and its charge go. */
Test(shm, blocks_made_on_another_thread_and_slots_never_overlap_property, .timeout = 120)
{
    unsigned seed = test_seed("shm blocks");
    struct side s;
    sl_membudget_t budget;
    static struct held_thing things[SL_SHM_MAX_SLOTS + PROP_BLOCKS];
    for (int round = 0; round < 12; round++) {
        struct prop pr = {.st = seed + (uint64_t)round};
        pr.region = SL_SHM_ALIGN * (size_t)(16 + splitmix64(&pr.st) % 2048);
        sl_membudget_init(&budget, pr.region, "--max-memory-mb");
        side_start(&s, pr.region, &budget);
        pr.r = sl_shm_region_new(s.lane, err, sizeof err);
        cr_assert_not_null(pr.r, "%s", err);
        sl_shm_map_t *m = NULL;
        cr_assert_eq(collect(&s, sl_shm_region_ticket(pr.r), &m), 0, "%s", err);
        pthread_mutex_init(&pr.mu, NULL);
        pthread_cond_init(&pr.made_one, NULL);
        pthread_t th;
        cr_assert_eq(pthread_create(&th, NULL, prop_pipeline, &pr), 0);
        uint8_t *buf = malloc(pr.region);
        cr_assert_not_null(buf);
        unsigned n = 0, lends = 0, puts = 0;
        int holds = 0;
        uint64_t st = pr.st ^ 0x9e3779b97f4a7c15u; /* this thread's draws */
        for (int step = 0; step < 4000; step++) {
            uint64_t d = splitmix64(&st) % 10;
            if (d < 3) { /* a copied slot */
                uint64_t size = 1 + splitmix64(&st) % (pr.region / 8), off, len;
                uint8_t fill = (uint8_t)(step | 0x80);
                memset(buf, fill, size);
                struct iovec part = {buf, size};
                if (sl_shm_region_put(pr.r, &part, 1, &off, &len) < 0)
                    continue;
                uint64_t seq;
                const uint8_t *p = sl__shm_slot(m, off, len, &seq, err, sizeof err);
                cr_assert_not_null(p, "seed %u: %s", seed, err);
                things[n++] = (struct held_thing){NULL, off, len, seq, p, fill, true, false};
                puts++;
            } else if (d < 6) { /* a block the thread made: lent, or served some other way */
                pthread_mutex_lock(&pr.mu);
                /* The thread's next try, if none is at hand: however fast
                 * either thread runs, each step gets a block unless the
                 * region has no room for one. */
                unsigned tried = pr.allocated + pr.refused;
                while (pr.nmade == 0 && pr.allocated + pr.refused <= tried + 1)
                    pthread_cond_wait(&pr.made_one, &pr.mu);
                struct made mk = pr.nmade ? pr.made[--pr.nmade] : (struct made){0};
                pthread_mutex_unlock(&pr.mu);
                if (!mk.p)
                    continue;
                struct held_thing t = {mk.p, 0, mk.size, 0, NULL, mk.p[0], false, true};
                check_fill(mk.p, mk.size, t.fill, seed, "a block made");
                uint64_t off;
                if (splitmix64(&st) % 4 && sl_shm_region_lend(pr.r, mk.p, mk.size, unheld, &holds, &off) == 0) {
                    t.off = off;
                    t.lent = true;
                    t.released = false;
                    t.client_p = sl__shm_slot(m, off, mk.size, &t.seq, err, sizeof err);
                    cr_assert_not_null(t.client_p, "seed %u: %s", seed, err);
                    check_fill(t.client_p, t.len, t.fill, seed, "a block lent, as the client reads it");
                    lends++;
                }
                things[n++] = t;
            } else if (n > 0) { /* the client gives a slot back, or the loop frees a block */
                unsigned i = (unsigned)(splitmix64(&st) % n);
                struct held_thing *t = &things[i];
                if (t->lent && !t->released) {
                    check_fill(t->client_p, t->len, t->fill, seed, "a slot the client holds");
                    t->released = true;
                    sl__shm_slot_done(m, t->seq);
                    uint64_t back = sl__shm_released(m);
                    cr_assert_eq(sl_shm_region_released(pr.r, back, err, sizeof err), 0, "seed %u: %s", seed, err);
                }
                if (t->released && (!t->worker_p || splitmix64(&st) % 2)) {
                    if (t->worker_p) {
                        check_fill(t->worker_p, t->len, t->fill, seed, "a block");
                        /* Freed on the thread that made it, or on this one. */
                        pthread_mutex_lock(&pr.mu);
                        bool there = pr.nfree < PROP_BLOCKS && splitmix64(&st) % 2;
                        if (there)
                            pr.to_free[pr.nfree++] = t->worker_p;
                        pthread_mutex_unlock(&pr.mu);
                        if (!there)
                            sl__big_free(t->worker_p);
                    }
                    things[i] = things[--n];
                }
            }
        }
        pthread_mutex_lock(&pr.mu);
        pr.stop = true;
        pthread_mutex_unlock(&pr.mu);
        pthread_join(th, NULL);
        cr_assert_gt(lends, 0, "seed %u: no block lent", seed);
        cr_assert_gt(puts, 0, "seed %u: no slot copied", seed);
        /* The connection goes with slots lent and blocks out: the blocks
         * keep the region until the last is freed. */
        sl_shm_region_free(pr.r);
        for (unsigned i = 0; i < n; i++) {
            if (things[i].lent && !things[i].released)
                sl__shm_slot_done(m, things[i].seq); /* the client's batches go too */
            if (things[i].worker_p)
                sl__big_free(things[i].worker_p);
        }
        for (unsigned i = 0; i < pr.nmade; i++)
            sl__big_free(pr.made[i].p);
        cr_assert_eq(sl_membudget_used(&budget), 0, "seed %u: the region's charge outlived it", seed);
        pthread_mutex_destroy(&pr.mu);
        pthread_cond_destroy(&pr.made_one);
        free(buf);
        sl__shm_unref(m);
        side_stop(&s);
    }
}
