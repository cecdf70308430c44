/*
 * taskkey.h: a client's key to a task. The dispatcher derives a task's key
 * (dispatcher/caps.c) and gives it to the task's worker only; each client
 * of the job gets its own key, derived from the task's key and its client
 * id, so that a GET_ELEMENT proves which client sends it, not only that
 * the sender is one of the job's clients (docs/protocol.md, "Ownership"):
 *
 *   client_task_key(task_key, client_id)
 *       = HMAC-SHA256(task_key, "client task" || be64(client_id))[0..16)
 *
 * The worker derives it again from the request's client_id to check it.
 */
#ifndef SL_TASKKEY_H
#define SL_TASKKEY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SL_TASK_KEY_LEN 16

/**
 * The first 16 bytes of HMAC-SHA256 under key over msg, the form of every
 * capability (these keys, and the dispatcher's secrets: dispatcher/caps.c).
 * Should OpenSSL fail (never with SHA-256 in its default provider), random
 * bytes, which match no key a peer could show: it fails closed.
 */
void sl_mac16(const uint8_t *key, size_t key_len, const uint8_t *msg, size_t len, uint8_t out[SL_TASK_KEY_LEN]);

/** Client client_id's key to the task whose key is task_key. */
void sl_task_client_key(const uint8_t task_key[SL_TASK_KEY_LEN], uint64_t client_id, uint8_t out[SL_TASK_KEY_LEN]);

/** @return whether shown is client client_id's key to the task whose key
 *  is task_key (compared in constant time) */
bool sl_task_client_key_ok(const uint8_t task_key[SL_TASK_KEY_LEN], uint64_t client_id,
                           const uint8_t shown[SL_TASK_KEY_LEN]);

/* A client's key to a task that a request proved (sl_task_key_check()). */
typedef struct sl_task_key_proof {
    uint64_t task_id, client_id;
    uint8_t task_key[SL_TASK_KEY_LEN], shown[SL_TASK_KEY_LEN];
} sl_task_key_proof_t;

/* Proofs a connection remembers: a client asks for batch after batch of a
 * few tasks with the same key, and proving one costs an HMAC. */
#define SL_TASK_KEY_PROOFS 4

/**
 * The worker's check of a GET_ELEMENT's key: whether shown is client
 * client_id's key to task task_id, whose key is task_key. A task whose
 * dispatcher gave its clients the task's key itself (before client keys:
 * TaskDef.client_keys unset) also takes that key. Remembers what it proved
 * in proofs (zeroed at first; one connection's), and takes a remembered
 * proof only for the same task, task key, client and key shown.
 */
bool sl_task_key_check(sl_task_key_proof_t proofs[SL_TASK_KEY_PROOFS], uint64_t task_id, uint64_t client_id,
                       const uint8_t task_key[SL_TASK_KEY_LEN], bool client_keys,
                       const uint8_t shown[SL_TASK_KEY_LEN]);

#endif
