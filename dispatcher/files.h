/*
 * files.h: the files of a file source as the dispatcher sees them: the
 * spec's patterns expanded below the data roots, in order, with the number
 * of records of each, from which DYNAMIC splits of (file, record range)
 * are cut. Workers expand the same patterns the same way (sorted glob).
 */
#ifndef SL_FILES_H
#define SL_FILES_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "confine.h"
#include "spec.h"

typedef struct sl_file_list {
    int num_files;
    char **paths;      /* resolved, malloc'd */
    uint64_t *records; /* records (lines, fixed-length records) of each file */
    uint64_t total;
} sl_file_list_t;

/**
 * Expands a file source's patterns below the roots and counts the records
 * of every file. Patterns match in spec order, each pattern's matches
 * sorted; a pattern that matches nothing, a path outside every root, an
 * unreadable or corrupt file is an error naming it. A pattern that matches
 * nothing and one with a match outside every root get the same answer
 * (sl_confine_glob()), so that it does not tell whether a path outside the
 * roots exists.
 * @param[out] out filled; release with sl_file_list_clear()
 * @return 0; -ENOENT (no match, or a match outside the roots), -EACCES (no
 *         --data-root), SL_EDATA, SL_ETOOBIG (more than max_files files),
 *         with a message in err
 */
int sl_file_list_resolve(const sl_spec_t *spec, const sl_confine_t *roots, int max_files, sl_file_list_t *out,
                         char *err, size_t errlen);

/* Bounds on a count off the event loop (counter.h): it stops at
 * deadline_ms (CLOCK_MONOTONIC milliseconds; 0: none) or once *cancel is
 * set, checked at least every 64 KiB read or 4096 records. */
typedef struct sl_count_limit {
    int64_t deadline_ms;
    int64_t timeout_ms; /* what deadline_ms came from, for the message */
    const atomic_int *cancel;
} sl_count_limit_t;

/**
 * sl_file_list_resolve() bounded by lim (NULL: none). Counts, their
 * failures and time-outs included, are cached per file (device, inode,
 * size, mtime) and how it is read; only regular files are counted. Safe
 * to call from any one thread at a time per spec.
 * @return as sl_file_list_resolve(); -ETIMEDOUT past lim's deadline (and
 *         at once for that file until it changes), SL_ECANCELLED
 */
int sl_file_list_resolve_bounded(const sl_spec_t *spec, const sl_confine_t *roots, int max_files,
                                 const sl_count_limit_t *lim, sl_file_list_t *out, char *err, size_t errlen);

/** @return how many file counts were answered from the cache, ever */
uint64_t sl_file_count_cache_hits(void);

void sl_file_list_clear(sl_file_list_t *list);

#endif
