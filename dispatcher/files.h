/*
 * files.h: the files of a file source as the dispatcher sees them: the
 * spec's patterns expanded below the data roots, in order, with the number
 * of records of each, from which DYNAMIC splits of (file, record range)
 * are cut. Workers expand the same patterns the same way (sorted glob).
 */
#ifndef SL_FILES_H
#define SL_FILES_H

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

void sl_file_list_clear(sl_file_list_t *list);

#endif
