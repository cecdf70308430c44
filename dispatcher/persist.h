/*
 * persist.h: the dispatcher state's durable form in the state store
 * (storage/store.h): what a change marked dirty is written as, and how a
 * restarted dispatcher loads it back. docs/fault-tolerance.md lists the
 * records and what starts afresh at load.
 */
#ifndef SL_DPERSIST_H
#define SL_DPERSIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "state.h"
#include "store.h"

/** @return the store's table names for sl_store_opts_t, *n of them */
const char *const *sl_dpersist_tables(int *n);

/**
 * Loads what the store holds into st, which must be empty (new, or reset).
 * Times start at now: every worker and client lease gets its full timeout
 * again, an idle job its full gc timeout.
 * A record that does not decode (damaged) holds back what it is of: the
 * job, dataset or worker is left out of st and listed in st->quarantine,
 * and its records are left in the store as they are.
 * @return 0; SL_EDATA past SL_QUARANTINE_MAX damaged records, or a
 *         dispatcher record that does not decode; SL_EVERSION for a field
 *         or form a newer dispatcher wrote; SL_ELIMIT for a record stored
 *         under a larger bound than st's (err names the table, the record
 *         and the field); -ENOMEM
 */
int sl_dpersist_load(sl_dstate_t *st, sl_store_t *store, int64_t now, char *err, size_t errlen);

/** @return whether st has changes not yet committed */
bool sl_dpersist_dirty(const sl_dstate_t *st);

/**
 * Writes every change marked since the last save in one transaction and
 * commits it: once this returns 0 the changes survive a crash.
 * @return 0; -ENOSPC, -EIO, -ENOMEM with a message in err. After a failure
 *         st holds changes the store does not: the caller must not answer
 *         them, and brings st back to the store with sl_dpersist_reload().
 */
int sl_dpersist_save(sl_dstate_t *st, sl_store_t *store, char *err, size_t errlen);

/** Drops st's contents and loads the store again (after a failed save). */
int sl_dpersist_reload(sl_dstate_t *st, sl_store_t *store, int64_t now, char *err, size_t errlen);

#endif
