/* shm.c: see shm.h. */
#include "shm.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/listener.h>
#include <openssl/crypto.h>

#include "auth.h"
#include "big_alloc.h"
#include "sluice.h"
#include "copy.h"
#include "errbuf.h"
#include "log.h"
#include "membudget.h"

struct range {
    uint64_t off, ext; /* ext: the length rounded up to SL_SHM_ALIGN */
};

/* A slot lent to the client: a range of its own at off (a copy, hold
 * NULL), or a block of the pipeline's (hold: what keeps it, given to
 * unhold when it comes back; the block's range goes when it is freed). */
struct slot {
    uint64_t off;
    void (*unhold)(void *hold);
    void *hold;
};

struct sl_shm_region {
    sl_shm_lane_t *lane; /* NULL once the lane is gone or the connection let go */
    int fd;
    uint8_t *base;
    size_t size;
    uint8_t ticket[SL_SHM_TICKET_LEN];
    bool collected;
    sl_membudget_t *budget; /* the lane's, kept for the last reference's release */
    /* The slots lent and not given back, in the order lent (which is the
     * order they come back in): ring[(first + i) % SL_SHM_MAX_SLOTS] for
     * i < count. Only the loop thread touches these. */
    struct slot ring[SL_SHM_MAX_SLOTS];
    unsigned first, count;
    uint64_t lent, released; /* slots lent ever, and the first of them given back */
    /* Under mu, which the pipeline threads placing blocks take too: the
     * ranges in use (copied slots and blocks), sorted by offset (where the
     * next one goes: place()); the bytes from the start charged to the
     * budget (the pages written); references (the connection's, the
     * tasks' that place blocks here, one a block); blocks placed. */
    pthread_mutex_t mu;
    struct range by_off[SL_SHM_MAX_RANGES];
    unsigned nranges;
    size_t charged;
    unsigned refs, blocks;
    bool closed;     /* the connection let go: no more blocks */
    bool registered; /* a foreign range of big_alloc.h, from the first block on */
    struct sl_shm_region *prev, *next;
};

/* A lane connection waiting for its ticket. */
struct pending {
    sl_shm_lane_t *lane;
    int fd;
    struct event *ev;
    struct timeval deadline; /* the whole ticket by then, however it trickles in */
    uint8_t got[SL_SHM_TICKET_LEN];
    size_t have;
    struct pending *next;
};

struct sl_shm_lane {
    struct event_base *base;
    struct evconnlistener *listener;
    char name[SL_SHM_NAME_MAX];
    size_t region_bytes;
    sl_membudget_t *budget;
    sl_shm_region_t *regions;
    unsigned waiting; /* regions not collected yet */
    struct pending *pending;
    unsigned num_pending;
};

/* ---- the lane ---- */

static void pending_free(struct pending *p)
{
    sl_shm_lane_t *l = p->lane;
    for (struct pending **pp = &l->pending; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    l->num_pending--;
    event_free(p->ev);
    close(p->fd);
    free(p);
}

/* The region whose ticket t is, not collected yet (constant time per region). */
static sl_shm_region_t *region_of(sl_shm_lane_t *l, const uint8_t *t)
{
    sl_shm_region_t *found = NULL;
    for (sl_shm_region_t *r = l->regions; r; r = r->next)
        if (!r->collected && CRYPTO_memcmp(r->ticket, t, SL_SHM_TICKET_LEN) == 0)
            found = r;
    return found;
}

/* Hands the region's memfd over, with one byte (a message must carry one). */
static int send_fd(int sock, int fd)
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
    return sendmsg(sock, &msg, MSG_NOSIGNAL) == 1 ? 0 : -errno;
}

/* Waits for more of the ticket, until the deadline set at the accept (the
 * event is not persistent: a ticket sent a byte at a time gets no more
 * time). @return false when the time is up */
static bool rearm(struct pending *p)
{
    struct timeval now, left;
    event_base_gettimeofday_cached(p->lane->base, &now);
    if (!evutil_timercmp(&now, &p->deadline, <))
        return false;
    evutil_timersub(&p->deadline, &now, &left);
    return event_add(p->ev, &left) == 0;
}

static void on_pending(evutil_socket_t fd, short what, void *arg)
{
    struct pending *p = arg;
    if (what & EV_TIMEOUT) {
        sl_log_debug("shared memory: a lane connection sent no ticket within %d ms", SL_SHM_TICKET_MS);
        pending_free(p);
        return;
    }
    ssize_t n = recv(fd, p->got + p->have, sizeof p->got - p->have, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        if (!rearm(p))
            pending_free(p);
        return;
    }
    if (n <= 0) {
        pending_free(p);
        return;
    }
    p->have += (size_t)n;
    if (p->have < sizeof p->got) {
        if (!rearm(p))
            pending_free(p);
        return;
    }
    sl_shm_region_t *r = region_of(p->lane, p->got);
    if (!r) {
        /* Closed without a word: the client goes on over TCP. */
        sl_log_debug("shared memory: a lane connection showed a ticket of no region waiting");
    } else if (send_fd(fd, r->fd) == 0) {
        r->collected = true;
        p->lane->waiting--;
        close(r->fd); /* both mappings keep the memory */
        r->fd = -1;
    } else {
        sl_log_debug("shared memory: handing a region over failed: %s", strerror(errno));
    }
    pending_free(p);
}

static void on_lane_accept(struct evconnlistener *lst, evutil_socket_t fd, struct sockaddr *sa, int salen, void *arg)
{
    sl_shm_lane_t *l = arg;
    (void)lst;
    (void)sa;
    (void)salen;
    struct pending *p = l->num_pending < SL_SHM_MAX_PENDING ? calloc(1, sizeof *p) : NULL;
    if (!p) {
        close(fd);
        return;
    }
    p->lane = l;
    p->fd = fd;
    p->ev = event_new(l->base, fd, EV_READ, on_pending, p);
    struct timeval tv = {SL_SHM_TICKET_MS / 1000, (SL_SHM_TICKET_MS % 1000) * 1000}, now;
    event_base_gettimeofday_cached(l->base, &now);
    evutil_timeradd(&now, &tv, &p->deadline);
    if (!p->ev || event_add(p->ev, &tv) < 0) {
        if (p->ev)
            event_free(p->ev);
        close(fd);
        free(p);
        return;
    }
    p->next = l->pending;
    l->pending = p;
    l->num_pending++;
}

static void on_lane_error(struct evconnlistener *lst, void *arg)
{
    (void)lst;
    (void)arg;
    sl_log_warn("shared memory: accepting on the lane failed: %s", strerror(errno));
}

sl_shm_lane_t *sl_shm_lane_new(struct event_base *base, size_t region_bytes, struct sl_membudget *budget, char *err,
                               size_t errlen)
{
    sl_shm_lane_t *l = calloc(1, sizeof *l);
    uint8_t rnd[16];
    if (!l) {
        sl_errf(err, errlen, -ENOMEM, "out of memory");
        return NULL;
    }
    if (sl_auth_random(rnd, sizeof rnd) < 0) {
        sl_errf(err, errlen, -EIO, "shared memory: no random bytes for the lane's name");
        free(l);
        return NULL;
    }
    int off = snprintf(l->name, sizeof l->name, "sluice-shm-");
    for (size_t i = 0; i < sizeof rnd; i++)
        off += snprintf(l->name + off, sizeof l->name - (size_t)off, "%02x", rnd[i]);
    l->base = base;
    l->region_bytes = (region_bytes + SL_SHM_ALIGN - 1) / SL_SHM_ALIGN * SL_SHM_ALIGN;
    l->budget = budget;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t nlen = strlen(l->name);
    memcpy(sa.sun_path + 1, l->name, nlen); /* abstract: sun_path[0] is NUL */
    socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + nlen);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, salen) < 0 || listen(fd, SL_SHM_MAX_PENDING) < 0) {
        sl_errf(err, errlen, -errno, "shared memory: the lane's socket @%s: %s", l->name, strerror(errno));
        if (fd >= 0)
            close(fd);
        free(l);
        return NULL;
    }
    l->listener = evconnlistener_new(base, on_lane_accept, l, LEV_OPT_CLOSE_ON_FREE, -1, fd);
    if (!l->listener) {
        sl_errf(err, errlen, -ENOMEM, "shared memory: no listener for the lane");
        close(fd);
        free(l);
        return NULL;
    }
    evconnlistener_set_error_cb(l->listener, on_lane_error);
    return l;
}

void sl_shm_lane_free(sl_shm_lane_t *l)
{
    if (!l)
        return;
    while (l->pending)
        pending_free(l->pending);
    for (sl_shm_region_t *r = l->regions; r; r = r->next)
        r->lane = NULL;
    evconnlistener_free(l->listener);
    free(l);
}

const char *sl_shm_lane_name(const sl_shm_lane_t *l)
{
    return l->name;
}

/* ---- regions ---- */

sl_shm_region_t *sl_shm_region_new(sl_shm_lane_t *l, char *err, size_t errlen)
{
    if (l->waiting >= SL_SHM_MAX_WAITING) {
        sl_errf(err, errlen, SL_ELIMIT, "shared memory: %d regions offered wait to be collected", SL_SHM_MAX_WAITING);
        return NULL;
    }
    sl_shm_region_t *r = calloc(1, sizeof *r);
    if (!r) {
        sl_errf(err, errlen, -ENOMEM, "out of memory");
        return NULL;
    }
    r->lane = l;
    r->budget = l->budget;
    r->size = l->region_bytes;
    r->refs = 1;
    r->fd = memfd_create("sluice-batches", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    /* Sealed: neither side can shrink it under the other's mapping (a
     * read past a file's end is SIGBUS), nor grow it. */
    if (r->fd < 0 || ftruncate(r->fd, (off_t)r->size) < 0 ||
        fcntl(r->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0 ||
        sl_auth_random(r->ticket, sizeof r->ticket) < 0) {
        sl_errf(err, errlen, -errno, "shared memory: a region of %zu bytes: %s", r->size, strerror(errno));
        goto fail;
    }
    r->base = mmap(NULL, r->size, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
    if (r->base == MAP_FAILED) {
        r->base = NULL;
        sl_errf(err, errlen, -errno, "shared memory: mapping a region of %zu bytes: %s", r->size, strerror(errno));
        goto fail;
    }
    pthread_mutex_init(&r->mu, NULL);
    r->next = l->regions;
    if (l->regions)
        l->regions->prev = r;
    l->regions = r;
    l->waiting++;
    return r;
fail:
    if (r->fd >= 0)
        close(r->fd);
    free(r);
    return NULL;
}

/* The last reference went: nothing of the region is in use any more. */
static void region_destroy(sl_shm_region_t *r)
{
    if (r->registered)
        sl__big_foreign_remove(r->base);
    sl_membudget_release(r->budget, r->charged);
    munmap(r->base, r->size);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

void sl_shm_region_ref(sl_shm_region_t *r)
{
    pthread_mutex_lock(&r->mu);
    r->refs++;
    pthread_mutex_unlock(&r->mu);
}

void sl_shm_region_unref(sl_shm_region_t *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    bool last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    if (last)
        region_destroy(r);
}

/* The index in by_off of the first range at off or after it (mu held). */
static unsigned range_at(const sl_shm_region_t *r, uint64_t off)
{
    unsigned lo = 0, hi = r->nranges;
    while (lo < hi) {
        unsigned mid = (lo + hi) / 2;
        if (r->by_off[mid].off < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Takes the range at off out of by_off (mu held): found by its offset,
 * which no other range has. */
static void range_remove(sl_shm_region_t *r, uint64_t off)
{
    unsigned lo = range_at(r, off);
    memmove(&r->by_off[lo], &r->by_off[lo + 1], (r->nranges - 1 - lo) * sizeof r->by_off[0]);
    r->nranges--;
}

/* The oldest slot lent comes back: a copy's range is free again, a
 * block's hold goes (which may free the block: mu is not held). */
static void give_back_oldest(sl_shm_region_t *r)
{
    struct slot sl = r->ring[r->first];
    r->first = (r->first + 1) % SL_SHM_MAX_SLOTS;
    r->count--;
    if (sl.hold) {
        sl.unhold(sl.hold);
    } else {
        pthread_mutex_lock(&r->mu);
        range_remove(r, sl.off);
        pthread_mutex_unlock(&r->mu);
    }
}

void sl_shm_region_free(sl_shm_region_t *r)
{
    if (!r)
        return;
    sl_shm_lane_t *l = r->lane;
    if (l) {
        if (r->prev)
            r->prev->next = r->next;
        else
            l->regions = r->next;
        if (r->next)
            r->next->prev = r->prev;
        if (!r->collected)
            l->waiting--;
        r->lane = NULL;
    }
    if (r->fd >= 0)
        close(r->fd);
    r->fd = -1;
    while (r->count > 0) /* as a client done with them would give them back */
        give_back_oldest(r);
    pthread_mutex_lock(&r->mu);
    r->closed = true;
    pthread_mutex_unlock(&r->mu);
    sl_shm_region_unref(r);
}

const uint8_t *sl_shm_region_ticket(const sl_shm_region_t *r)
{
    return r->ticket;
}

bool sl_shm_region_collected(const sl_shm_region_t *r)
{
    return r->collected;
}

unsigned sl_shm_region_lent(const sl_shm_region_t *r)
{
    return r->count;
}

/* Where a range of ext bytes fits now (mu held): the lowest gap between
 * the ranges in use that holds it, so that slots keep to the region's
 * first pages (written once, mapped by both sides once); *pos: its index
 * in by_off. The ranges are kept sorted by offset as they come and go,
 * not sorted here: that took more instructions than the rest of a put.
 * false when no gap holds it. */
static bool place(const sl_shm_region_t *r, uint64_t ext, uint64_t *at, unsigned *pos)
{
    uint64_t cur = 0;
    if (r->nranges == SL_SHM_MAX_RANGES)
        return false;
    for (unsigned i = 0; i < r->nranges; i++) {
        if (r->by_off[i].off - cur >= ext) { /* ranges do not overlap: off >= cur */
            *at = cur;
            *pos = i;
            return true;
        }
        cur = r->by_off[i].off + r->by_off[i].ext;
    }
    if (cur <= r->size && r->size - cur >= ext) {
        *at = cur;
        *pos = r->nranges;
        return true;
    }
    return false;
}

/* Takes a range of ext bytes (mu held), its pages charged if written for
 * the first time. @return false when none fits or the budget refuses */
static bool range_take(sl_shm_region_t *r, uint64_t ext, uint64_t *at)
{
    unsigned pos;
    if (ext == 0 || ext > r->size || !place(r, ext, at, &pos))
        return false;
    if (*at + ext > r->charged) {
        size_t more = (size_t)(*at + ext - r->charged);
        if (!sl_membudget_charge_spare(r->budget, more)) /* not a failure: the caller does without */
            return false;
        r->charged += more;
    }
    memmove(&r->by_off[pos + 1], &r->by_off[pos], (r->nranges - pos) * sizeof r->by_off[0]);
    r->by_off[pos] = (struct range){*at, ext};
    r->nranges++;
    return true;
}

static uint64_t extent(uint64_t len)
{
    return (len + SL_SHM_ALIGN - 1) / SL_SHM_ALIGN * SL_SHM_ALIGN;
}

int sl_shm_region_put(sl_shm_region_t *r, const struct iovec *parts, int n, uint64_t *off, uint64_t *len)
{
    uint64_t total = 0;
    for (int i = 0; i < n; i++)
        total += parts[i].iov_len;
    uint64_t ext = extent(total), at;
    if (!r->lane || r->count == SL_SHM_MAX_SLOTS || total == 0)
        return -ENOSPC;
    pthread_mutex_lock(&r->mu);
    bool took = range_take(r, ext, &at);
    pthread_mutex_unlock(&r->mu);
    if (!took)
        return -ENOSPC;
    uint8_t *p = r->base + at;
    for (int i = 0; i < n; i++) {
        if (parts[i].iov_len)
            sl_copy_far(p, parts[i].iov_base, parts[i].iov_len); /* the client reads it */
        p += parts[i].iov_len;
    }
    r->ring[(r->first + r->count) % SL_SHM_MAX_SLOTS] = (struct slot){at, NULL, NULL};
    r->count++;
    r->lent++;
    *off = at;
    *len = total;
    return 0;
}

/* sl__big_free() of a block placed in r. */
static void block_free(void *arg, void *p)
{
    sl_shm_region_t *r = arg;
    pthread_mutex_lock(&r->mu);
    range_remove(r, (uint64_t)((uint8_t *)p - r->base));
    r->blocks--;
    bool last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    if (last)
        region_destroy(r);
}

void *sl_shm_region_alloc(sl_shm_region_t *r, size_t size)
{
    uint64_t at;
    void *p = NULL;
    pthread_mutex_lock(&r->mu);
    if (!r->registered && !r->closed)
        r->registered = sl__big_foreign_add(r->base, r->size, block_free, r) == 0;
    if (r->registered && !r->closed && r->blocks < SL_SHM_MAX_BLOCKS && range_take(r, extent(size), &at)) {
        r->blocks++;
        r->refs++;
        p = r->base + at;
    }
    pthread_mutex_unlock(&r->mu);
    return p;
}

size_t sl_shm_region_block_room(sl_shm_region_t *r, const void *p)
{
    if (!sl_shm_region_holds(r, p))
        return 0;
    uint64_t off = (uint64_t)((const uint8_t *)p - r->base), room = 0;
    pthread_mutex_lock(&r->mu);
    unsigned lo = range_at(r, off);
    if (lo < r->nranges && r->by_off[lo].off == off)
        room = r->by_off[lo].ext;
    pthread_mutex_unlock(&r->mu);
    return (size_t)room;
}

bool sl_shm_region_holds(const sl_shm_region_t *r, const void *p)
{
    return (const uint8_t *)p >= r->base && (const uint8_t *)p < r->base + r->size;
}

int sl_shm_region_lend(sl_shm_region_t *r, const void *p, size_t len, void (*unhold)(void *hold), void *hold,
                       uint64_t *off)
{
    if (!r->lane || r->count == SL_SHM_MAX_SLOTS || len == 0 || !sl_shm_region_holds(r, p))
        return -ENOSPC;
    uint64_t at = (uint64_t)((const uint8_t *)p - r->base);
    r->ring[(r->first + r->count) % SL_SHM_MAX_SLOTS] = (struct slot){at, unhold, hold};
    r->count++;
    r->lent++;
    *off = at;
    return 0;
}

int sl_shm_region_released(sl_shm_region_t *r, uint64_t n, char *err, size_t errlen)
{
    if (n < r->released || n > r->lent)
        return sl_errf(err, errlen, SL_EPROTO,
                       "shm_released %" PRIu64 ": %" PRIu64 " slots of shared memory were lent on this connection and "
                       "%" PRIu64 " given back before",
                       n, r->lent, r->released);
    for (; r->released < n; r->released++)
        give_back_oldest(r);
    return 0;
}
