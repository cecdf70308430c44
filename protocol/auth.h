/*
 * auth.h: what proves a peer belongs to the cluster (docs/security.md).
 *
 * A cluster token (a secret shared by every daemon and trainer, read from
 * --auth-token-file or SLUICE_AUTH_TOKEN_FILE) proven in the handshake by
 * HMAC-SHA256 over both sides' hellos (nonces included): the token never
 * crosses the wire. TLS 1.3 with mutual verification against a CA, under
 * the handshake, when a certificate, its key and a CA are given.
 */
#ifndef SL_AUTH_H
#define SL_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SL_AUTH_PROOF_LEN 32
/* A token shorter than this is refused: it could be guessed. */
#define SL_AUTH_MIN_TOKEN 16
#define SL_AUTH_MAX_TOKEN 1024

typedef struct sl_auth_opts {
    const char *token_file; /* NULL: SLUICE_AUTH_TOKEN_FILE, if set */
    const char *tls_cert;   /* PEM; the three together or none */
    const char *tls_key;
    const char *tls_ca;
} sl_auth_opts_t;

typedef struct sl_auth {
    uint8_t token[SL_AUTH_MAX_TOKEN];
    size_t token_len;        /* 0: no token */
    char token_from[256];    /* the file the token came from */
    struct ssl_ctx_st *tls_accept;  /* NULL: no TLS */
    struct ssl_ctx_st *tls_connect;
} sl_auth_t;

/**
 * Reads the token file and the TLS files of o into a.
 * @return 0, or SL_EINVAL with a message in err naming the file and what
 *         is wrong with it
 */
int sl_auth_load(sl_auth_t *a, const sl_auth_opts_t *o, char *err, size_t errlen);

/** Makes dst hold what src holds (the TLS contexts shared, counted). */
void sl_auth_copy(sl_auth_t *dst, const sl_auth_t *src);

/** Frees what sl_auth_load() made; a may be zeroed or loaded. */
void sl_auth_free(sl_auth_t *a);

/** @return whether a has a token or TLS (the daemon is not in protected mode) */
bool sl_auth_protects(const sl_auth_t *a);

/**
 * The proof of one side: HMAC-SHA256(token, label || hello_c || hello_s),
 * label "sluice connector" or "sluice acceptor" so that neither side's
 * proof can be played back as the other's.
 */
void sl_auth_proof(const sl_auth_t *a, bool acceptor, const uint8_t *hello_c, const uint8_t *hello_s, size_t hello_len,
                   uint8_t out[SL_AUTH_PROOF_LEN]);

/** @return whether two proofs are equal, in time that does not depend on where they differ */
bool sl_auth_proof_eq(const uint8_t a[SL_AUTH_PROOF_LEN], const uint8_t b[SL_AUTH_PROOF_LEN]);

/** Fills out with n random bytes (the handshake's nonce). @return 0 or -errno */
int sl_auth_random(uint8_t *out, size_t n);

#endif
