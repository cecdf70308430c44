/*
 * workdir.h: a daemon's work directory, created if missing and locked so
 * that two daemons never share one.
 */
#ifndef SL_WORKDIR_H
#define SL_WORKDIR_H

#include <stddef.h>

typedef struct sl_workdir sl_workdir_t;

/**
 * Creates path (and its parents) if missing, checks it is a writable
 * directory and takes an exclusive lock on path/LOCK.
 * @param[out] out the open work dir, released by sl_workdir_close()
 * @return 0; -EBUSY when another process holds the lock; -EACCES, -ENOTDIR,
 *         ... with a message naming the path in err
 */
int sl_workdir_open(const char *path, sl_workdir_t **out, char *err, size_t errlen);

/** @return the directory's path, valid until sl_workdir_close() */
const char *sl_workdir_path(const sl_workdir_t *wd);

/** Releases the lock and frees wd. */
void sl_workdir_close(sl_workdir_t *wd);

#endif
