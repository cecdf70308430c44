/*
 * dstate_util.h: helpers the tests of the dispatcher's state on a real LMDB
 * store share (test_persist.c, test_outstanding.c): a state machine with
 * 100-record splits, a store with the dispatcher's tables in a temporary
 * directory, removing that directory, and a client's report of what it
 * received. Static inline, so a test file
 * that does not use one gets no warning.
 */
#ifndef SL_TEST_DSTATE_UTIL_H
#define SL_TEST_DSTATE_UTIL_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "persist.h"
#include "posset.h"
#include "state.h"
#include "store.h"

/* A state machine whose splits are 100 records. */
static inline sl_dstate_t *new_state(void)
{
    sl_dstate_config_t cfg;
    sl_dstate_config_init(&cfg);
    cfg.split_size = 100;
    sl_dstate_t *s = sl_dstate_new(&cfg);
    cr_assert_not_null(s);
    return s;
}

/* Opens (creating) a store with the dispatcher's tables in dir; map_bytes 0
 * is the store's default. */
static inline sl_store_t *open_state_store(const char *dir, size_t map_bytes)
{
    int n;
    const char *const *tables = sl_dpersist_tables(&n);
    sl_store_opts_t o = {.tables = tables, .num_tables = n, .map_bytes = map_bytes};
    sl_store_t *store = NULL;
    char err[1024];
    cr_assert_eq(sl_store_open(dir, &o, &store, err, sizeof err), 0, "%s", err);
    return store;
}

static inline void remove_dir(const char *dir)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

/* Sends req (job, client, secret and report generation set) with the
 * records in set, encoded, to s at now. @return what s answered (err: why) */
static inline int send_report(sl_dstate_t *s, const sluice_ReportReceivedRequest *req, const sl_posset_t *set,
                              int64_t now, char *err, size_t errlen)
{
    size_t len = sl_posset_encode(set, NULL, 0);
    uint8_t *buf = malloc(len);
    cr_assert_not_null(buf);
    sl_posset_encode(set, buf, len);
    int rc = sl_dstate_client_report(s, req, buf, len, now, err, errlen);
    free(buf);
    return rc;
}

#endif
