/*
 * auth.c: see auth.h.
 */
#include "auth.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/ssl.h>

#include "log.h"
#include "sluice.h"
#include "tlsio.h"

/* The largest token file read: a token is one line. */
#define TOKEN_FILE_MAX 65536

static int load_token(sl_auth_t *a, const char *path, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "auth token file %s: %s", path, strerror(errno));
        return SL_EINVAL;
    }
    struct stat st;
    if (fstat(fd, &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO)))
        sl_log_warn("auth token file %s can be read by others than its owner (mode %03o): chmod 600 it",
                    path, (unsigned)(st.st_mode & 0777));
    static char buf[TOKEN_FILE_MAX + 1];
    size_t have = 0;
    for (;;) {
        ssize_t r = read(fd, buf + have, TOKEN_FILE_MAX - have);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            snprintf(err, errlen, "auth token file %s: %s", path, strerror(errno));
            close(fd);
            return SL_EINVAL;
        }
        if (r == 0 || (have += (size_t)r) == TOKEN_FILE_MAX)
            break;
    }
    close(fd);
    buf[have] = '\0';
    /* The token is the first line, whitespace trimmed at both ends. */
    char *p = buf;
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
        p++;
    size_t n = strcspn(p, "\r\n");
    while (n > 0 && (p[n - 1] == ' ' || p[n - 1] == '\t'))
        n--;
    if (n < SL_AUTH_MIN_TOKEN || n > SL_AUTH_MAX_TOKEN) {
        snprintf(err, errlen,
                 "auth token file %s: the token (its first line) has %zu bytes; it needs %d to %d "
                 "(e.g. openssl rand -hex 32 > %s)",
                 path, n, SL_AUTH_MIN_TOKEN, SL_AUTH_MAX_TOKEN, path);
        OPENSSL_cleanse(buf, sizeof buf);
        return SL_EINVAL;
    }
    memcpy(a->token, p, n);
    a->token_len = n;
    snprintf(a->token_from, sizeof a->token_from, "%s", path);
    OPENSSL_cleanse(buf, sizeof buf);
    return 0;
}

static void tls_error(char *err, size_t errlen, const char *what, const char *path)
{
    char ssl[256] = "unknown error";
    unsigned long e = ERR_peek_last_error();
    if (e)
        ERR_error_string_n(e, ssl, sizeof ssl);
    ERR_clear_error();
    snprintf(err, errlen, "TLS %s %s: %s", what, path, ssl);
}

static struct ssl_ctx_st *tls_ctx(bool server, const sl_auth_opts_t *o, char *err, size_t errlen)
{
    SSL_CTX *ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
    if (!ctx) {
        tls_error(err, errlen, "context", "");
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    /* AES-128-GCM first: with AES-NI it is the fastest suite, and batches
     * are bulk data. */
    SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256");
    /* No session tickets: nothing but our frames follows the handshake. */
    SSL_CTX_set_num_tickets(ctx, 0);
    SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
    /* Batches in few system calls (tlsio.h). */
    sl_tls_tune(ctx);
    if (SSL_CTX_use_certificate_chain_file(ctx, o->tls_cert) != 1) {
        tls_error(err, errlen, "certificate", o->tls_cert);
        goto fail;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, o->tls_key, SSL_FILETYPE_PEM) != 1) {
        tls_error(err, errlen, "key", o->tls_key);
        goto fail;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        tls_error(err, errlen, "key does not match the certificate:", o->tls_key);
        goto fail;
    }
    if (SSL_CTX_load_verify_locations(ctx, o->tls_ca, NULL) != 1) {
        tls_error(err, errlen, "CA", o->tls_ca);
        goto fail;
    }
    /* Mutual: each side shows a certificate the cluster's CA signed. */
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    return ctx;
fail:
    SSL_CTX_free(ctx);
    return NULL;
}

int sl_auth_load(sl_auth_t *a, const sl_auth_opts_t *o, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    const char *token_file = o->token_file;
    if (!token_file || !*token_file)
        token_file = getenv("SLUICE_AUTH_TOKEN_FILE");
    if (token_file && *token_file) {
        int rc = load_token(a, token_file, err, errlen);
        if (rc < 0)
            return rc;
    }
    int given = !!(o->tls_cert && *o->tls_cert) + !!(o->tls_key && *o->tls_key) + !!(o->tls_ca && *o->tls_ca);
    if (given == 0)
        return 0;
    if (given != 3) {
        snprintf(err, errlen, "TLS needs all three of --tls-cert, --tls-key and --tls-ca");
        sl_auth_free(a);
        return SL_EINVAL;
    }
    if (!(a->tls_accept = tls_ctx(true, o, err, errlen)) || !(a->tls_connect = tls_ctx(false, o, err, errlen))) {
        sl_auth_free(a);
        return SL_EINVAL;
    }
    return 0;
}

void sl_auth_copy(sl_auth_t *dst, const sl_auth_t *src)
{
    *dst = *src;
    if (dst->tls_accept)
        SSL_CTX_up_ref(dst->tls_accept);
    if (dst->tls_connect)
        SSL_CTX_up_ref(dst->tls_connect);
}

void sl_auth_free(sl_auth_t *a)
{
    SSL_CTX_free(a->tls_accept);
    SSL_CTX_free(a->tls_connect);
    OPENSSL_cleanse(a->token, sizeof a->token);
    memset(a, 0, sizeof *a);
}

bool sl_auth_protects(const sl_auth_t *a)
{
    return a && (a->token_len > 0 || a->tls_accept);
}

void sl_auth_proof(const sl_auth_t *a, bool acceptor, const uint8_t *hello_c, const uint8_t *hello_s, size_t hello_len,
                   uint8_t out[SL_AUTH_PROOF_LEN])
{
    static const char lc[] = "sluice connector", la[] = "sluice acceptor";
    const char *label = acceptor ? la : lc;
    size_t label_len = acceptor ? sizeof la : sizeof lc; /* with its NUL: no label is a prefix of another */
    uint8_t msg[64 + 2 * 128];
    if (hello_len > 128)
        hello_len = 128;
    memcpy(msg, label, label_len);
    memcpy(msg + label_len, hello_c, hello_len);
    memcpy(msg + label_len + hello_len, hello_s, hello_len);
    unsigned int n = SL_AUTH_PROOF_LEN;
    HMAC(EVP_sha256(), a->token, (int)a->token_len, msg, label_len + 2 * hello_len, out, &n);
}

bool sl_auth_proof_eq(const uint8_t a[SL_AUTH_PROOF_LEN], const uint8_t b[SL_AUTH_PROOF_LEN])
{
    return CRYPTO_memcmp(a, b, SL_AUTH_PROOF_LEN) == 0;
}

int sl_auth_random(uint8_t *out, size_t n)
{
    while (n > 0) {
        ssize_t r = getrandom(out, n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        out += r;
        n -= (size_t)r;
    }
    return 0;
}
