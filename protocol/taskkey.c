/* taskkey.c: see taskkey.h. */
#include "taskkey.h"

#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

void sl_mac16(const uint8_t *key, size_t key_len, const uint8_t *msg, size_t len, uint8_t out[SL_TASK_KEY_LEN])
{
    uint8_t mac[EVP_MAX_MD_SIZE];
    unsigned mac_len = 0;
    if (!HMAC(EVP_sha256(), key, (int)key_len, msg, len, mac, &mac_len) || mac_len < SL_TASK_KEY_LEN) {
        if (RAND_bytes(out, SL_TASK_KEY_LEN) != 1)
            memset(out, 0xff, SL_TASK_KEY_LEN);
        return;
    }
    memcpy(out, mac, SL_TASK_KEY_LEN);
    OPENSSL_cleanse(mac, sizeof mac);
}

void sl_task_client_key(const uint8_t task_key[SL_TASK_KEY_LEN], uint64_t client_id, uint8_t out[SL_TASK_KEY_LEN])
{
    static const char label[] = "client task";
    uint8_t msg[sizeof label - 1 + 8];
    memcpy(msg, label, sizeof label - 1);
    for (int i = 7; i >= 0; i--, client_id >>= 8)
        msg[sizeof label - 1 + i] = (uint8_t)client_id;
    sl_mac16(task_key, SL_TASK_KEY_LEN, msg, sizeof msg, out);
}

bool sl_task_client_key_ok(const uint8_t task_key[SL_TASK_KEY_LEN], uint64_t client_id,
                           const uint8_t shown[SL_TASK_KEY_LEN])
{
    uint8_t want[SL_TASK_KEY_LEN];
    sl_task_client_key(task_key, client_id, want);
    bool ok = CRYPTO_memcmp(want, shown, SL_TASK_KEY_LEN) == 0;
    OPENSSL_cleanse(want, sizeof want);
    return ok;
}

bool sl_task_key_check(sl_task_key_proof_t proofs[SL_TASK_KEY_PROOFS], uint64_t task_id, uint64_t client_id,
                       const uint8_t task_key[SL_TASK_KEY_LEN], bool client_keys,
                       const uint8_t shown[SL_TASK_KEY_LEN])
{
    if (!client_keys && CRYPTO_memcmp(task_key, shown, SL_TASK_KEY_LEN) == 0)
        return true;
    sl_task_key_proof_t *pv = &proofs[task_id % SL_TASK_KEY_PROOFS];
    if (pv->task_id == task_id && pv->client_id == client_id &&
        CRYPTO_memcmp(pv->task_key, task_key, SL_TASK_KEY_LEN) == 0 &&
        CRYPTO_memcmp(pv->shown, shown, SL_TASK_KEY_LEN) == 0)
        return true;
    if (!sl_task_client_key_ok(task_key, client_id, shown))
        return false;
    pv->task_id = task_id;
    pv->client_id = client_id;
    memcpy(pv->task_key, task_key, SL_TASK_KEY_LEN);
    memcpy(pv->shown, shown, SL_TASK_KEY_LEN);
    return true;
}
