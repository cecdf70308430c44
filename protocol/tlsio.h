/*
 * tlsio.h: the bulk path of TLS connections (docs/security.md, "TLS").
 *
 * libevent's bufferevent_openssl reads one record per turn of the loop, in
 * two read() calls, and writes each record (at most 15000 bytes) with its
 * own write(): a MiB-sized batch costs hundreds of system calls. These
 * helpers let conn.c move batches in few calls:
 * - records OpenSSL writes gather in a buffer and go to the socket in
 *   writes of up to SL_TLS_GATHER_BYTES (sl_tls_gather(), sl_tls_flush());
 * - with read-ahead (sl_tls_tune()), OpenSSL reads up to
 *   SL_TLS_READ_BUFFER bytes of records per read(), and sl_tls_read()
 *   decrypts them straight into the caller's buffer.
 * Read-ahead has a price the caller must pay: records OpenSSL already read
 * are no longer signalled by the socket. Whoever reads must go on while
 * sl_tls_has_pending() says so.
 */
#ifndef SL_TLSIO_H
#define SL_TLSIO_H

#include <stdbool.h>
#include <stddef.h>

struct ssl_st;
struct ssl_ctx_st;

/** Records gathered before they are written: a write takes up to this. */
#define SL_TLS_GATHER_BYTES (64u * 1024)
/** OpenSSL's read buffer under read-ahead. */
#define SL_TLS_READ_BUFFER (256u * 1024)

/** Sets read-ahead with a SL_TLS_READ_BUFFER buffer, and buffers released
 * while empty (an idle connection holds none). */
void sl_tls_tune(struct ssl_ctx_st *ctx);

/** Replaces ssl's write BIO (the socket BIO libevent gave it) by one that
 * gathers records for the same socket. @return 0, or -ENOMEM */
int sl_tls_gather(struct ssl_st *ssl);

/** Writes the gathered records to the socket.
 * @return 1 when none is left, 0 when the socket took part of them (again
 *         when it is writable), or -errno */
int sl_tls_flush(struct ssl_st *ssl);

/** Bytes gathered and not written yet. */
size_t sl_tls_unflushed(struct ssl_st *ssl);

/** True when OpenSSL holds bytes (decrypted, or records read ahead) that
 * the socket will not signal again. */
bool sl_tls_has_pending(struct ssl_st *ssl);

/** Reads up to len decrypted bytes into buf.
 * @return the bytes read (> 0); 0 when nothing more is there before the
 *         socket is readable again; or SL_ECLOSED, SL_EPROTO, -errno with
 *         why filled */
long sl_tls_read(struct ssl_st *ssl, void *buf, size_t len, char *why, size_t whylen);

#endif
