/*
 * tlsio.c: see tlsio.h. The gathering BIO holds the records OpenSSL writes
 * in an evbuffer and writes them with sendmsg() (MSG_NOSIGNAL: a closed
 * peer is an error, not a signal) once SL_TLS_GATHER_BYTES are there, or
 * when OpenSSL or conn.c flushes. It takes a record only while less than
 * SL_TLS_GATHER_BYTES wait, so a connection holds at most that plus one
 * record; over it, the write is retried when the socket is writable.
 */
#include "tlsio.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <event2/buffer.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "sluice.h"

struct gather {
    int fd;
    struct evbuffer *buf;
};

void sl_tls_tune(SSL_CTX *ctx)
{
    SSL_CTX_set_read_ahead(ctx, 1);
    SSL_CTX_set_default_read_buffer_len(ctx, SL_TLS_READ_BUFFER);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
}

/* Writes what the socket takes. @return 1 all written, 0 the socket is
 * full, -errno */
static int gather_out(struct gather *g)
{
    while (evbuffer_get_length(g->buf) > 0) {
        struct evbuffer_iovec v[64];
        int n = evbuffer_peek(g->buf, -1, NULL, v, 64);
        if (n > 64)
            n = 64;
        struct iovec iov[64];
        for (int i = 0; i < n; i++)
            iov[i] = (struct iovec){.iov_base = v[i].iov_base, .iov_len = v[i].iov_len};
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t w = sendmsg(g->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (w < 0)
            return -errno;
        evbuffer_drain(g->buf, (size_t)w);
    }
    return 1;
}

static int gather_write(BIO *b, const char *data, size_t len, size_t *written)
{
    struct gather *g = BIO_get_data(b);
    BIO_clear_retry_flags(b);
    if (evbuffer_get_length(g->buf) >= SL_TLS_GATHER_BYTES) {
        int rc = gather_out(g);
        if (rc < 0) {
            errno = -rc;
            return 0;
        }
        if (evbuffer_get_length(g->buf) >= SL_TLS_GATHER_BYTES) {
            BIO_set_retry_write(b);
            return 0;
        }
    }
    if (evbuffer_add(g->buf, data, len) < 0) {
        errno = ENOMEM;
        return 0;
    }
    *written = len;
    return 1;
}

static long gather_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    struct gather *g = BIO_get_data(b);
    (void)num;
    switch (cmd) {
    case BIO_CTRL_FLUSH: {
        BIO_clear_retry_flags(b);
        int rc = gather_out(g);
        if (rc == 0)
            BIO_set_retry_write(b);
        if (rc < 0)
            errno = -rc;
        return rc > 0 ? 1 : rc == 0 ? 0 : -1;
    }
    case BIO_CTRL_WPENDING:
        return (long)evbuffer_get_length(g->buf);
    case BIO_C_GET_FD:
        if (ptr)
            *(int *)ptr = g->fd;
        return g->fd;
    default:
        return 0;
    }
}

static int gather_create(BIO *b)
{
    BIO_set_init(b, 1);
    return 1;
}

static int gather_destroy(BIO *b)
{
    struct gather *g = BIO_get_data(b);
    if (g) {
        evbuffer_free(g->buf);
        free(g);
        BIO_set_data(b, NULL);
    }
    return 1;
}

static BIO_METHOD *gather_method;
static int gather_type;
static pthread_once_t gather_once = PTHREAD_ONCE_INIT;

static void gather_method_init(void)
{
    gather_type = BIO_get_new_index() | BIO_TYPE_SOURCE_SINK;
    BIO_METHOD *m = BIO_meth_new(gather_type, "sluice gathering socket");
    if (m && BIO_meth_set_write_ex(m, gather_write) && BIO_meth_set_ctrl(m, gather_ctrl) &&
        BIO_meth_set_create(m, gather_create) && BIO_meth_set_destroy(m, gather_destroy)) {
        gather_method = m;
        return;
    }
    BIO_meth_free(m);
}

int sl_tls_gather(SSL *ssl)
{
    pthread_once(&gather_once, gather_method_init);
    BIO *old = SSL_get_wbio(ssl);
    int fd = old ? (int)BIO_get_fd(old, NULL) : -1;
    if (!gather_method || fd < 0)
        return -ENOMEM;
    struct gather *g = calloc(1, sizeof *g);
    BIO *b = g ? BIO_new(gather_method) : NULL;
    if (!b || !(g->buf = evbuffer_new())) {
        BIO_free(b);
        free(g);
        return -ENOMEM;
    }
    g->fd = fd;
    BIO_set_data(b, g);
    /* The socket BIO stays as the read BIO (SSL_set0_wbio drops the
     * write side's reference to it). */
    SSL_set0_wbio(ssl, b);
    return 0;
}

static struct gather *gather_of(SSL *ssl)
{
    BIO *b = SSL_get_wbio(ssl);
    return b && gather_method && BIO_method_type(b) == gather_type ? BIO_get_data(b) : NULL;
}

int sl_tls_flush(SSL *ssl)
{
    struct gather *g = gather_of(ssl);
    return g ? gather_out(g) : 1;
}

size_t sl_tls_unflushed(SSL *ssl)
{
    struct gather *g = gather_of(ssl);
    return g ? evbuffer_get_length(g->buf) : 0;
}

bool sl_tls_has_pending(SSL *ssl)
{
    return SSL_has_pending(ssl) == 1;
}

long sl_tls_read(SSL *ssl, void *buf, size_t len, char *why, size_t whylen)
{
    size_t got = 0;
    ERR_clear_error();
    errno = 0;
    if (SSL_read_ex(ssl, buf, len, &got) == 1)
        return (long)got;
    int e = SSL_get_error(ssl, 0);
    switch (e) {
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE:
        return 0;
    case SSL_ERROR_ZERO_RETURN:
        snprintf(why, whylen, "closed the connection (TLS close_notify)");
        return SL_ECLOSED;
    case SSL_ERROR_SYSCALL: {
        int err = errno;
        ERR_clear_error();
        if (err == 0) {
            snprintf(why, whylen, "closed the connection");
            return SL_ECLOSED;
        }
        snprintf(why, whylen, "%s", strerror(err));
        return -err;
    }
    default: {
        char reason[256] = "unknown TLS error";
        unsigned long ssl_err = ERR_peek_error();
        if (ERR_GET_LIB(ssl_err) == ERR_LIB_SSL && ERR_GET_REASON(ssl_err) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
            /* A peer that closed without close_notify (a killed process). */
            ERR_clear_error();
            snprintf(why, whylen, "closed the connection");
            return SL_ECLOSED;
        }
        ssl_err = ERR_get_error();
        if (ssl_err)
            ERR_error_string_n(ssl_err, reason, sizeof reason);
        ERR_clear_error();
        snprintf(why, whylen, "sent a TLS record that failed: %s", reason);
        return SL_EPROTO;
    }
    }
}
