/* caps.c: see caps.h. */
#include "caps.h"

#include <errno.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

int sl_cap_secret_new(uint8_t secret[SL_CAP_SECRET_LEN])
{
    return RAND_bytes(secret, SL_CAP_SECRET_LEN) == 1 ? 0 : -EIO;
}

static void put_be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

static void derive(const uint8_t secret[SL_CAP_SECRET_LEN], const uint8_t *msg, size_t len, uint8_t out[SL_CAP_LEN])
{
    uint8_t mac[EVP_MAX_MD_SIZE];
    unsigned mac_len = 0;
    if (!HMAC(EVP_sha256(), secret, SL_CAP_SECRET_LEN, msg, len, mac, &mac_len) || mac_len < SL_CAP_LEN) {
        /* Never with SHA-256 in OpenSSL's default provider; fail closed:
         * the random bytes match no key a peer could show. */
        if (RAND_bytes(out, SL_CAP_LEN) != 1)
            memset(out, 0xff, SL_CAP_LEN);
        return;
    }
    memcpy(out, mac, SL_CAP_LEN);
    OPENSSL_cleanse(mac, sizeof mac);
}

void sl_cap_client_secret(const uint8_t secret[SL_CAP_SECRET_LEN], uint64_t job_id, uint64_t client_id,
                          uint8_t out[SL_CAP_LEN])
{
    uint8_t msg[6 + 16];
    memcpy(msg, "client", 6);
    put_be64(msg + 6, job_id);
    put_be64(msg + 14, client_id);
    derive(secret, msg, sizeof msg, out);
}

void sl_cap_worker_secret(const uint8_t secret[SL_CAP_SECRET_LEN], uint64_t worker_id, uint8_t out[SL_CAP_LEN])
{
    uint8_t msg[6 + 8];
    memcpy(msg, "worker", 6);
    put_be64(msg + 6, worker_id);
    derive(secret, msg, sizeof msg, out);
}

void sl_cap_task_key(const uint8_t secret[SL_CAP_SECRET_LEN], uint64_t task_id, uint8_t out[SL_CAP_LEN])
{
    uint8_t msg[4 + 8];
    memcpy(msg, "task", 4);
    put_be64(msg + 4, task_id);
    derive(secret, msg, sizeof msg, out);
}

bool sl_cap_equal(const uint8_t a[SL_CAP_LEN], const uint8_t b[SL_CAP_LEN])
{
    return CRYPTO_memcmp(a, b, SL_CAP_LEN) == 0;
}
