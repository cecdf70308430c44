/*
 * caps.h: the capabilities the dispatcher hands out, so that ids are not
 * capabilities: a client's secret, which its later requests must carry, and
 * a task's key, which a GET_ELEMENT for the task must carry. Each is the
 * first 16 bytes of HMAC-SHA256 under the dispatcher's 32-byte secret
 * (made at its first start, kept in its state store), so the dispatcher
 * keeps none of them: it derives them again to check one.
 *
 *   client_secret = HMAC-SHA256(secret, "client" || job_id || client_id [|| nonce])[0..16)
 *   task_key      = HMAC-SHA256(secret, "task" || task_id [|| nonce])[0..16)
 *   worker_secret = HMAC-SHA256(secret, "worker" || worker_id)[0..16)
 *
 * ids as 8 big-endian bytes each (docs/protocol.md, "Ownership"). The
 * task key goes to the task's worker only; each client gets its own key to
 * the task, derived from it (protocol/taskkey.h). nonce is the job's, drawn
 * at random when the job is made: a dispatcher whose state was restored
 * from a backup gives the ids of the lost state out again, and the nonce
 * keeps the capabilities of those ids apart (a job stored before nonces
 * has none, 0, and its capabilities are derived without it).
 */
#ifndef SL_DCAPS_H
#define SL_DCAPS_H

#include <stdbool.h>
#include <stdint.h>

#define SL_CAP_SECRET_LEN 32 /* the dispatcher's secret */
#define SL_CAP_LEN 16        /* a client secret, a task key */

/** Fills secret with bytes from the system's random source.
 *  @return 0, or -EIO when there are none */
int sl_cap_secret_new(uint8_t secret[SL_CAP_SECRET_LEN]);

/** A job's nonce: random, 1 to 2^63 - 1 (a JSON integer). @return 0, or -EIO */
int sl_cap_nonce_new(uint64_t *nonce);

/** The secret of client client_id of job job_id, whose nonce is nonce. */
void sl_cap_client_secret(const uint8_t secret[SL_CAP_SECRET_LEN], uint64_t job_id, uint64_t client_id,
                          uint64_t nonce, uint8_t out[SL_CAP_LEN]);

/** The secret of worker worker_id (it proves the id on a reconnect). */
void sl_cap_worker_secret(const uint8_t secret[SL_CAP_SECRET_LEN], uint64_t worker_id, uint8_t out[SL_CAP_LEN]);

/** The key of task task_id of a job whose nonce is nonce. */
void sl_cap_task_key(const uint8_t secret[SL_CAP_SECRET_LEN], uint64_t task_id, uint64_t nonce,
                     uint8_t out[SL_CAP_LEN]);

/** @return whether a and b are equal, in time that does not depend on where they differ */
bool sl_cap_equal(const uint8_t a[SL_CAP_LEN], const uint8_t b[SL_CAP_LEN]);

#endif
