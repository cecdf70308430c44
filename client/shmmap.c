/* shmmap.c: see shmmap.h. */
#include "shmmap.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "errbuf.h"
#include "sluice.h"

struct sl_shm_map {
    pthread_mutex_t mu;
    uint8_t *base;
    size_t size;
    unsigned refs;
    /* Slots lent, from 1: lent of them; the first released given back;
     * done[seq % max] marks a later one given back out of order. */
    uint64_t lent, released;
    bool done[SL_SHM_CLIENT_MAX_SLOTS];
};

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits for fd to be ready for events, until deadline. @return 0 or -ETIMEDOUT / -errno */
static int wait_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - mono_ms();
        if (left <= 0)
            return -ETIMEDOUT;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, (int)left);
        if (n > 0)
            return 0;
        if (n < 0 && errno != EINTR)
            return -errno;
    }
}

/* Connects to the lane, shows the ticket and receives the memfd. */
static int fetch_fd(const char *name, const uint8_t *ticket, size_t ticket_len, int timeout_ms, int *out, char *err,
                    size_t errlen)
{
    int64_t deadline = mono_ms() + timeout_ms;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t nlen = strlen(name);
    if (nlen == 0 || nlen + 1 > sizeof sa.sun_path)
        return sl_errf(err, errlen, SL_EPROTO, "the lane's name \"%s\" is not a socket name", name);
    memcpy(sa.sun_path + 1, name, nlen);
    socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + nlen);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0)
        return sl_errf(err, errlen, -errno, "socket: %s", strerror(errno));
    int rc;
    if (connect(s, (struct sockaddr *)&sa, salen) < 0 && errno != EAGAIN && errno != EINPROGRESS) {
        /* ECONNREFUSED: no such lane here (another host or network namespace) */
        rc = sl_errf(err, errlen, -errno, "connect to @%s: %s", name, strerror(errno));
        goto out;
    }
    size_t sent = 0;
    while (sent < ticket_len) {
        if ((rc = wait_fd(s, POLLOUT, deadline)) < 0) {
            sl_errf(err, errlen, rc, "sending the ticket to @%s: %s", name, strerror(-rc));
            goto out;
        }
        ssize_t n = send(s, ticket + sent, ticket_len - sent, MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN && errno != EINTR) {
            rc = sl_errf(err, errlen, -errno, "sending the ticket to @%s: %s", name, strerror(errno));
            goto out;
        }
        if (n > 0)
            sent += (size_t)n;
    }
    for (;;) {
        if ((rc = wait_fd(s, POLLIN, deadline)) < 0) {
            sl_errf(err, errlen, rc, "waiting for the region from @%s: %s", name, strerror(-rc));
            goto out;
        }
        char byte;
        struct iovec iov = {&byte, 1};
        union {
            char buf[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } u;
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
        ssize_t n = recvmsg(s, &msg, MSG_CMSG_CLOEXEC);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        struct cmsghdr *cm = n == 1 && !(msg.msg_flags & MSG_CTRUNC) ? CMSG_FIRSTHDR(&msg) : NULL;
        if (!cm || cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS ||
            cm->cmsg_len != CMSG_LEN(sizeof(int))) {
            rc = sl_errf(err, errlen, SL_EAUTH, "@%s handed no region over (a ticket it did not take)", name);
            goto out;
        }
        memcpy(out, CMSG_DATA(cm), sizeof *out);
        rc = 0;
        goto out;
    }
out:
    close(s);
    return rc;
}

int sl__shm_collect(const char *name, const uint8_t *ticket, size_t ticket_len, int timeout_ms, size_t max_bytes,
                    sl_shm_map_t **out, char *err, size_t errlen)
{
    int fd = -1;
    int rc = fetch_fd(name, ticket, ticket_len, timeout_ms, &fd, err, errlen);
    if (rc < 0)
        return rc;
    struct stat st;
    int seals = fcntl(fd, F_GET_SEALS);
    if (fstat(fd, &st) < 0 || seals < 0 || !(seals & F_SEAL_SHRINK) || st.st_size <= 0 ||
        (uint64_t)st.st_size > max_bytes) {
        rc = sl_errf(err, errlen, SL_EPROTO,
                     "the region from @%s is not a sealed memfd of at most %zu bytes (size %lld, seals %#x)", name,
                     max_bytes, (long long)st.st_size, seals < 0 ? 0 : (unsigned)seals);
        close(fd);
        return rc;
    }
    /* Writable, as a batch that came over the socket is: a caller may
     * change its tensors in place (a slot is the client's until it gives it
     * back; the worker never reads the region). */
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

const uint8_t *sl__shm_slot(sl_shm_map_t *m, uint64_t off, uint64_t len, uint64_t *seq, char *err, size_t errlen)
{
    if (off > m->size || len > m->size - off || len == 0) {
        sl_errf(err, errlen, SL_EPROTO,
                "shared-memory slot [%" PRIu64 ", +%" PRIu64 ") is outside the region of %zu bytes", off, len, m->size);
        return NULL;
    }
    pthread_mutex_lock(&m->mu);
    bool full = m->lent - m->released >= SL_SHM_CLIENT_MAX_SLOTS;
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

void sl__shm_slot_done(sl_shm_map_t *m, uint64_t seq)
{
    pthread_mutex_lock(&m->mu);
    m->done[seq % SL_SHM_CLIENT_MAX_SLOTS] = true;
    while (m->released < m->lent && m->done[(m->released + 1) % SL_SHM_CLIENT_MAX_SLOTS])
        m->released++;
    pthread_mutex_unlock(&m->mu);
    sl__shm_unref(m);
}

uint64_t sl__shm_released(sl_shm_map_t *m)
{
    pthread_mutex_lock(&m->mu);
    uint64_t n = m->released;
    pthread_mutex_unlock(&m->mu);
    return n;
}

void sl__shm_unref(sl_shm_map_t *m)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->mu);
    bool last = --m->refs == 0;
    pthread_mutex_unlock(&m->mu);
    if (!last)
        return;
    munmap(m->base, m->size);
    pthread_mutex_destroy(&m->mu);
    free(m);
}
