/* shmmap.c: see shmmap.h. */
#include "shmmap.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "errbuf.h"
#include "sluice.h"

struct sl_shm_map {
    pthread_mutex_t mu;
    uint8_t *base;
    size_t size;
    unsigned refs;
    /* Slots lent, from 1: lent of them; the first released given back;
     * done[seq % max] marks a later one given back out of order. Both
     * change under mu; released is also read without it, for each request
     * (sl__shm_released()): stored with release order after the slots'
     * bytes were read, so that a value read says those reads are over. */
    uint64_t lent;
    _Atomic uint64_t released;
    bool done[SL_SHM_CLIENT_MAX_SLOTS];
};

/* Checks and maps the region's memfd (taking fd). 0 or < 0 with why in err */
static int map_fd(const char *name, int fd, size_t max_bytes, sl_shm_map_t **out, char *err, size_t errlen)
{
    struct stat st;
    int seals = fcntl(fd, F_GET_SEALS);
    if (fstat(fd, &st) < 0 || seals < 0 || !(seals & F_SEAL_SHRINK) || st.st_size <= 0 ||
        (uint64_t)st.st_size > max_bytes) {
        int rc = sl_errf(err, errlen, SL_EPROTO,
                         "the region from @%s is not a sealed memfd of at most %zu bytes (size %lld, seals %#x)", name,
                         max_bytes, (long long)st.st_size, seals < 0 ? 0 : (unsigned)seals);
        close(fd);
        return rc;
    }
    /* Writable, as a batch that came over the socket is: a caller may
     * change its tensors in place (a slot is the client's until it gives it
     * back; the worker reads a slot's bytes only to send that batch again,
     * on another connection, and never interprets them). */
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return sl_errf(err, errlen, -errno, "mapping the region from @%s: %s", name, strerror(errno));
    sl_shm_map_t *m = calloc(1, sizeof *m);
    if (!m) {
        munmap(p, (size_t)st.st_size);
        return sl_errf(err, errlen, -ENOMEM, "out of memory");
    }
    pthread_mutex_init(&m->mu, NULL);
    m->base = p;
    m->size = (size_t)st.st_size;
    m->refs = 1;
    *out = m;
    return 0;
}

/* A collection under way: the ticket being sent, then the memfd awaited,
 * each step when the socket is ready, on the caller's loop. */
struct sl_shm_fetch {
    struct event_base *base;
    struct event *io;
    int fd;
    bool receiving;   /* the ticket went out: the region is awaited */
    int64_t deadline; /* CLOCK_MONOTONIC, ms */
    uint8_t ticket[SL_SHM_TICKET_MAX];
    size_t ticket_len, sent;
    size_t max_bytes;
    char name[108];
    sl_shm_fetched_fn done;
    void *arg;
};

static void fetch_free(sl_shm_fetch_t *f)
{
    event_free(f->io);
    close(f->fd);
    free(f);
}

/* Ends the fetch: its callback with the map or why not; f is gone after. */
static void fetch_end(sl_shm_fetch_t *f, sl_shm_map_t *m, int rc, const char *why)
{
    sl_shm_fetched_fn done = f->done;
    void *arg = f->arg;
    fetch_free(f);
    done(m, rc, why, arg);
}

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void on_fetch_io(evutil_socket_t fd, short what, void *arg);

/* Waits for the socket to be ready for the next step, until the deadline.
 * 0 or < 0 */
static int fetch_wait(sl_shm_fetch_t *f)
{
    int64_t ms = f->deadline - mono_ms();
    struct timeval left = {ms > 0 ? ms / 1000 : 0, ms > 0 ? (ms % 1000) * 1000 : 0};
    if (event_assign(f->io, f->base, f->fd, f->receiving ? EV_READ : EV_WRITE, on_fetch_io, f) < 0)
        return -ENOMEM;
    return event_add(f->io, &left) < 0 ? -ENOMEM : 0;
}

static void on_fetch_io(evutil_socket_t fd, short what, void *arg)
{
    sl_shm_fetch_t *f = arg;
    char why[300];
    int rc;
    if (what & EV_TIMEOUT) {
        sl_errf(why, sizeof why, -ETIMEDOUT, "%s @%s: %s", f->receiving ? "waiting for the region from" :
                "sending the ticket to", f->name, strerror(ETIMEDOUT));
        fetch_end(f, NULL, -ETIMEDOUT, why);
        return;
    }
    if (!f->receiving) {
        ssize_t n = send(fd, f->ticket + f->sent, f->ticket_len - f->sent, MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN && errno != EINTR) {
            rc = sl_errf(why, sizeof why, -errno, "sending the ticket to @%s: %s", f->name, strerror(errno));
            fetch_end(f, NULL, rc, why);
            return;
        }
        if (n > 0)
            f->sent += (size_t)n;
        f->receiving = f->sent == f->ticket_len;
    } else {
        char byte;
        struct iovec iov = {&byte, 1};
        union {
            char buf[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } u;
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
        ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
        if (!(n < 0 && (errno == EAGAIN || errno == EINTR))) {
            struct cmsghdr *cm = n == 1 && !(msg.msg_flags & MSG_CTRUNC) ? CMSG_FIRSTHDR(&msg) : NULL;
            if (!cm || cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS ||
                cm->cmsg_len != CMSG_LEN(sizeof(int))) {
                rc = sl_errf(why, sizeof why, SL_EAUTH, "@%s handed no region over (a ticket it did not take)",
                             f->name);
                fetch_end(f, NULL, rc, why);
                return;
            }
            int region;
            memcpy(&region, CMSG_DATA(cm), sizeof region);
            sl_shm_map_t *m = NULL;
            rc = map_fd(f->name, region, f->max_bytes, &m, why, sizeof why);
            fetch_end(f, m, rc, why);
            return;
        }
    }
    if ((rc = fetch_wait(f)) < 0) {
        sl_errf(why, sizeof why, rc, "collecting the region from @%s: out of memory", f->name);
        fetch_end(f, NULL, rc, why);
    }
}

int sl__shm_fetch(struct event_base *base, const char *name, const uint8_t *ticket, size_t ticket_len, int timeout_ms,
                  size_t max_bytes, sl_shm_fetched_fn done, void *arg, sl_shm_fetch_t **out, char *err, size_t errlen)
{
    *out = NULL;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t nlen = strlen(name);
    if (nlen == 0 || nlen + 1 > sizeof sa.sun_path)
        return sl_errf(err, errlen, SL_EPROTO, "the lane's name \"%s\" is not a socket name", name);
    if (ticket_len == 0 || ticket_len > SL_SHM_TICKET_MAX)
        return sl_errf(err, errlen, SL_EPROTO, "a ticket of %zu bytes (1 to %d)", ticket_len, SL_SHM_TICKET_MAX);
    memcpy(sa.sun_path + 1, name, nlen);
    socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + nlen);
    sl_shm_fetch_t *f = calloc(1, sizeof *f);
    if (!f)
        return sl_errf(err, errlen, -ENOMEM, "out of memory");
    f->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (f->fd < 0) {
        int rc = sl_errf(err, errlen, -errno, "socket: %s", strerror(errno));
        free(f);
        return rc;
    }
    f->io = event_new(base, -1, 0, on_fetch_io, f);
    if (!f->io) {
        close(f->fd);
        free(f);
        return sl_errf(err, errlen, -ENOMEM, "out of memory");
    }
    f->base = base;
    memcpy(f->ticket, ticket, ticket_len);
    f->ticket_len = ticket_len;
    f->max_bytes = max_bytes;
    memcpy(f->name, name, nlen + 1);
    f->done = done;
    f->arg = arg;
    f->deadline = mono_ms() + timeout_ms;
    int rc = 0;
    if (connect(f->fd, (struct sockaddr *)&sa, salen) < 0 && errno != EAGAIN && errno != EINPROGRESS)
        /* ECONNREFUSED: no such lane here (another host or network namespace) */
        rc = sl_errf(err, errlen, -errno, "connect to @%s: %s", name, strerror(errno));
    else if ((rc = fetch_wait(f)) < 0)
        sl_errf(err, errlen, rc, "collecting the region from @%s: out of memory", name);
    if (rc < 0) {
        fetch_free(f);
        return rc;
    }
    *out = f;
    return 0;
}

void sl__shm_fetch_cancel(sl_shm_fetch_t *f)
{
    if (f)
        fetch_free(f);
}

const uint8_t *sl__shm_slot(sl_shm_map_t *m, uint64_t off, uint64_t len, uint64_t *seq, char *err, size_t errlen)
{
    if (off > m->size || len > m->size - off || len == 0) {
        sl_errf(err, errlen, SL_EPROTO,
                "shared-memory slot [%" PRIu64 ", +%" PRIu64 ") is outside the region of %zu bytes", off, len, m->size);
        return NULL;
    }
    pthread_mutex_lock(&m->mu);
    bool full = m->lent - atomic_load_explicit(&m->released, memory_order_relaxed) >= SL_SHM_CLIENT_MAX_SLOTS;
    if (!full) {
        *seq = ++m->lent;
        m->done[*seq % SL_SHM_CLIENT_MAX_SLOTS] = false;
        m->refs++;
    }
    pthread_mutex_unlock(&m->mu);
    if (full) {
        sl_errf(err, errlen, SL_EPROTO, "more than %d shared-memory slots lent at once", SL_SHM_CLIENT_MAX_SLOTS);
        return NULL;
    }
    return m->base + off;
}

/* Unmaps and frees m, whose last reference was just dropped. */
static void shm_destroy(sl_shm_map_t *m)
{
    munmap(m->base, m->size);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void sl__shm_slot_done(sl_shm_map_t *m, uint64_t seq)
{
    /* The slot's reference goes in the same hold of the mutex: one lock a
     * batch, not two. */
    pthread_mutex_lock(&m->mu);
    m->done[seq % SL_SHM_CLIENT_MAX_SLOTS] = true;
    uint64_t released = atomic_load_explicit(&m->released, memory_order_relaxed);
    while (released < m->lent && m->done[(released + 1) % SL_SHM_CLIENT_MAX_SLOTS])
        released++;
    atomic_store_explicit(&m->released, released, memory_order_release);
    bool last = --m->refs == 0;
    pthread_mutex_unlock(&m->mu);
    if (last)
        shm_destroy(m);
}

uint64_t sl__shm_released(sl_shm_map_t *m)
{
    return atomic_load_explicit(&m->released, memory_order_acquire);
}

void sl__shm_unref(sl_shm_map_t *m)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->mu);
    bool last = --m->refs == 0;
    pthread_mutex_unlock(&m->mu);
    if (last)
        shm_destroy(m);
}
