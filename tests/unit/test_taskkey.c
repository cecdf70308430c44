/*
 * test_taskkey.c: clients' keys to tasks (protocol/taskkey.c): each client
 * of a job gets its own, derived from the task's key and its id; the
 * worker's check takes a client's key only with that client's id, the
 * task's key itself only from a task whose dispatcher gave it out (before
 * client keys), and a remembered proof only for the same task, task key,
 * client and key.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "taskkey.h"

static void fill(uint8_t key[SL_TASK_KEY_LEN], uint8_t v)
{
    for (int i = 0; i < SL_TASK_KEY_LEN; i++)
        key[i] = (uint8_t)(v + i * 7);
}

Test(taskkey, each_client_gets_its_own_key_and_only_it_passes)
{
    uint8_t task[SL_TASK_KEY_LEN], other_task[SL_TASK_KEY_LEN], a[SL_TASK_KEY_LEN], b[SL_TASK_KEY_LEN];
    fill(task, 1);
    fill(other_task, 2);
    sl_task_client_key(task, 10, a);
    sl_task_client_key(task, 11, b);
    cr_assert_arr_neq(a, b, SL_TASK_KEY_LEN);
    cr_assert_arr_neq(a, task, SL_TASK_KEY_LEN);
    uint8_t again[SL_TASK_KEY_LEN];
    sl_task_client_key(task, 10, again);
    cr_assert_arr_eq(a, again, SL_TASK_KEY_LEN, "derived again, the same");
    cr_assert(sl_task_client_key_ok(task, 10, a));
    cr_assert_not(sl_task_client_key_ok(task, 11, a), "client 10's key with client 11's id");
    cr_assert_not(sl_task_client_key_ok(other_task, 10, a), "client 10's key to another task");
    /* Client ids differ in one bit, in the high byte: still other keys. */
    sl_task_client_key(task, 10 | (UINT64_C(1) << 63), b);
    cr_assert_arr_neq(a, b, SL_TASK_KEY_LEN);
}

Test(taskkey, the_worker_takes_a_clients_key_with_its_id_only)
{
    sl_task_key_proof_t proofs[SL_TASK_KEY_PROOFS];
    memset(proofs, 0, sizeof proofs);
    uint8_t task[SL_TASK_KEY_LEN], mine[SL_TASK_KEY_LEN], zero[SL_TASK_KEY_LEN] = {0};
    fill(task, 3);
    sl_task_client_key(task, 20, mine);
    for (int round = 0; round < 3; round++) { /* the first proves, the others are remembered */
        cr_assert(sl_task_key_check(proofs, 7, 20, task, true, mine));
        cr_assert_not(sl_task_key_check(proofs, 7, 21, task, true, mine), "another client's id");
        cr_assert_not(sl_task_key_check(proofs, 7, 20, task, true, task), "the task's own key");
        cr_assert_not(sl_task_key_check(proofs, 7, 20, task, true, zero), "no key");
        cr_assert(sl_task_key_check(proofs, 7, 20, task, true, mine));
    }
    /* A remembered proof is of that task and task key: the same id of a
     * task with another key (a dispatcher with a new secret) proves again. */
    uint8_t renewed[SL_TASK_KEY_LEN];
    fill(renewed, 4);
    cr_assert_not(sl_task_key_check(proofs, 7, 20, renewed, true, mine));
    /* Task 11 shares task 7's slot: each proves on its own. */
    uint8_t task11[SL_TASK_KEY_LEN], mine11[SL_TASK_KEY_LEN];
    fill(task11, 5);
    sl_task_client_key(task11, 20, mine11);
    cr_assert_not(sl_task_key_check(proofs, 11, 20, task11, true, mine));
    cr_assert(sl_task_key_check(proofs, 11, 20, task11, true, mine11));
    cr_assert(sl_task_key_check(proofs, 7, 20, task, true, mine));
    cr_assert_not(sl_task_key_check(proofs, 7, 20, task, true, mine11));
}

Test(taskkey, a_task_from_a_dispatcher_before_client_keys_also_takes_its_own_key)
{
    sl_task_key_proof_t proofs[SL_TASK_KEY_PROOFS];
    memset(proofs, 0, sizeof proofs);
    uint8_t task[SL_TASK_KEY_LEN], mine[SL_TASK_KEY_LEN], wrong[SL_TASK_KEY_LEN];
    fill(task, 6);
    fill(wrong, 9);
    sl_task_client_key(task, 30, mine);
    cr_assert(sl_task_key_check(proofs, 2, 30, task, false, task), "the key its clients were given");
    cr_assert(sl_task_key_check(proofs, 2, 99, task, false, task), "by any client id, as before");
    cr_assert(sl_task_key_check(proofs, 2, 30, task, false, mine), "a client's key, once the dispatcher is new");
    cr_assert_not(sl_task_key_check(proofs, 2, 30, task, false, wrong));
    cr_assert_not(sl_task_key_check(proofs, 2, 31, task, false, mine));
}
