/*
 * test_tlsio.c: the gathering write BIO of protocol/tlsio.c over a real
 * socket pair. Records are written through the BIO as OpenSSL writes them
 * (BIO_write); the peer reads the socket. No handshake is needed: the BIO
 * moves bytes, whatever they are.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/ssl.h>

#include "tlsio.h"

struct pair {
    SSL_CTX *ctx;
    SSL *ssl;
    int fd[2]; /* fd[0] is the SSL's (non-blocking), fd[1] the peer's */
};

static void pair_open(struct pair *p, int sndbuf)
{
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, p->fd), 0);
    if (sndbuf > 0)
        setsockopt(p->fd[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    fcntl(p->fd[0], F_SETFL, fcntl(p->fd[0], F_GETFL) | O_NONBLOCK);
    p->ctx = SSL_CTX_new(TLS_client_method());
    cr_assert_not_null(p->ctx);
    p->ssl = SSL_new(p->ctx);
    cr_assert_not_null(p->ssl);
    cr_assert_eq(SSL_set_fd(p->ssl, p->fd[0]), 1);
    cr_assert_eq(sl_tls_gather(p->ssl), 0);
}

static void pair_close(struct pair *p)
{
    SSL_free(p->ssl);
    SSL_CTX_free(p->ctx);
    close(p->fd[0]);
    close(p->fd[1]);
}

static uint8_t byte_at(size_t i)
{
    return (uint8_t)(i * 131 + (i >> 9));
}

/* Writes a record of n bytes of the stream from *off; @return what BIO_write did */
static int write_record(struct pair *p, size_t *off, size_t n)
{
    uint8_t *rec = malloc(n);
    for (size_t i = 0; i < n; i++)
        rec[i] = byte_at(*off + i);
    int w = BIO_write(SSL_get_wbio(p->ssl), rec, (int)n);
    free(rec);
    if (w > 0)
        *off += (size_t)w;
    return w;
}

/* Reads what the peer has, checking it is the stream from *got on. */
static void peer_drain(struct pair *p, size_t *got)
{
    uint8_t buf[65536];
    for (;;) {
        ssize_t r = recv(p->fd[1], buf, sizeof buf, MSG_DONTWAIT);
        if (r <= 0)
            return;
        for (ssize_t i = 0; i < r; i++)
            cr_assert_eq(buf[i], byte_at(*got + (size_t)i), "byte %zu differs", *got + (size_t)i);
        *got += (size_t)r;
    }
}

/* Small records wait in the buffer until it holds SL_TLS_GATHER_BYTES or
 * is flushed: no system call per record. */
Test(tlsio, records_gather_until_the_threshold_or_a_flush)
{
    struct pair p;
    pair_open(&p, 0);
    size_t off = 0, got = 0;
    for (int i = 0; i < 10; i++)
        cr_assert_eq(write_record(&p, &off, 1000), 1000);
    cr_assert_eq(sl_tls_unflushed(p.ssl), 10000);
    peer_drain(&p, &got);
    cr_assert_eq(got, 0, "a record went out before the threshold");
    cr_assert_eq(BIO_wpending(SSL_get_wbio(p.ssl)), 10000);
    cr_assert_eq(sl_tls_flush(p.ssl), 1);
    cr_assert_eq(sl_tls_unflushed(p.ssl), 0);
    peer_drain(&p, &got);
    cr_assert_eq(got, 10000);
    /* Past the threshold the next record writes what was gathered first. */
    while (sl_tls_unflushed(p.ssl) < SL_TLS_GATHER_BYTES)
        cr_assert_eq(write_record(&p, &off, 16384), 16384);
    cr_assert_eq(write_record(&p, &off, 100), 100);
    cr_assert_eq(sl_tls_unflushed(p.ssl), 100);
    cr_assert_eq(BIO_flush(SSL_get_wbio(p.ssl)), 1);
    peer_drain(&p, &got);
    cr_assert_eq(got, off);
    pair_close(&p);
}

/* A socket that takes nothing more: the BIO holds at most the threshold
 * plus one record, then asks for a retry; a flush says what is left; once
 * the peer reads, flushes move the rest, in order. */
Test(tlsio, a_full_socket_bounds_what_is_held_and_flushes_resume)
{
    struct pair p;
    pair_open(&p, 4096);
    BIO *b = SSL_get_wbio(p.ssl);
    size_t off = 0, got = 0;
    int w;
    while ((w = write_record(&p, &off, 16384)) > 0)
        cr_assert_leq(sl_tls_unflushed(p.ssl), SL_TLS_GATHER_BYTES + 16384);
    cr_assert(BIO_should_retry(b) && BIO_should_write(b), "a refused record must be retried, not fail");
    size_t held = sl_tls_unflushed(p.ssl);
    cr_assert_geq(held, SL_TLS_GATHER_BYTES);
    cr_assert_eq(sl_tls_flush(p.ssl), 0, "the full socket took everything");
    cr_assert_eq(BIO_flush(b), 0);
    cr_assert(BIO_should_retry(b));
    /* The peer reads; each flush moves more until none is left. */
    for (int round = 0; round < 10000 && sl_tls_unflushed(p.ssl) > 0; round++) {
        peer_drain(&p, &got);
        cr_assert_geq(sl_tls_flush(p.ssl), 0);
    }
    cr_assert_eq(sl_tls_unflushed(p.ssl), 0);
    peer_drain(&p, &got);
    cr_assert_eq(got, off, "%zu of %zu bytes arrived", got, off);
    pair_close(&p);
}

/* A closed peer is an error with errno, not a signal and not a retry. */
Test(tlsio, a_closed_peer_is_an_error)
{
    struct pair p;
    pair_open(&p, 0);
    size_t off = 0;
    cr_assert_eq(write_record(&p, &off, 100), 100);
    close(p.fd[1]);
    p.fd[1] = open("/dev/null", O_RDONLY);
    int rc = sl_tls_flush(p.ssl);
    cr_assert_eq(rc, -EPIPE, "flush to a closed peer: %d", rc);
    pair_close(&p);
}
