/* caps.c: see caps.h. */
#include "caps.h"

#include <errno.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "taskkey.h"

_Static_assert(SL_CAP_LEN == SL_TASK_KEY_LEN, "a capability is what sl_mac16() makes");

int sl_cap_secret_new(uint8_t secret[SL_CAP_SECRET_LEN])
{
    return RAND_bytes(secret, SL_CAP_SECRET_LEN) == 1 ? 0 : -EIO;
}

int sl_cap_nonce_new(uint64_t *nonce)
{
    uint8_t b[8];
    do {
        if (RAND_bytes(b, sizeof b) != 1)
            return -EIO;
        *nonce = 0;
        for (int i = 0; i < 8; i++)
            *nonce = *nonce << 8 | b[i];
        *nonce >>= 1;
    } while (*nonce == 0);
    return 0;
}

static void put_be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

static void derive(const uint8_t secret[SL_CAP_SECRET_LEN], const uint8_t *msg, size_t len, uint8_t out[SL_CAP_LEN])
{
    sl_mac16(secret, SL_CAP_SECRET_LEN, msg, len, out);
}

void sl_cap_client_secret(const uint8_t secret[SL_CAP_SECRET_LEN], uint64_t job_id, uint64_t client_id,
                          uint64_t nonce, uint8_t out[SL_CAP_LEN])
{
    uint8_t msg[6 + 24];
    memcpy(msg, "client", 6);
    put_be64(msg + 6, job_id);
    put_be64(msg + 14, client_id);
    put_be64(msg + 22, nonce);
    derive(secret, msg, nonce ? sizeof msg : sizeof msg - 8, out);
}

void sl_cap_worker_secret(const uint8_t secret[SL_CAP_SECRET_LEN], uint64_t worker_id, uint8_t out[SL_CAP_LEN])
{
    uint8_t msg[6 + 8];
    memcpy(msg, "worker", 6);
    put_be64(msg + 6, worker_id);
    derive(secret, msg, sizeof msg, out);
}

void sl_cap_task_key(const uint8_t secret[SL_CAP_SECRET_LEN], uint64_t task_id, uint64_t nonce,
                     uint8_t out[SL_CAP_LEN])
{
    uint8_t msg[4 + 16];
    memcpy(msg, "task", 4);
    put_be64(msg + 4, task_id);
    put_be64(msg + 12, nonce);
    derive(secret, msg, nonce ? sizeof msg : sizeof msg - 8, out);
}

bool sl_cap_equal(const uint8_t a[SL_CAP_LEN], const uint8_t b[SL_CAP_LEN])
{
    return CRYPTO_memcmp(a, b, SL_CAP_LEN) == 0;
}
