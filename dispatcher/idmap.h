/*
 * idmap.h: the dispatcher state's index of jobs and tasks by id: an open
 * addressing hash table (linear probing, deletion by backward shift) from a
 * nonzero 64-bit id to a pointer and a 32-bit position. It holds what the
 * state holds, so its size is bounded as the state's is (--max-jobs, a job's
 * tasks): at most twice its entries rounded up to a power of two, plus 16.
 */
#ifndef SL_IDMAP_H
#define SL_IDMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct sl_idmap_entry {
    uint64_t id; /* 0: empty */
    void *ptr;
    uint32_t pos;
} sl_idmap_entry_t;

typedef struct sl_idmap {
    sl_idmap_entry_t *slots;
    size_t cap; /* a power of two, or 0 */
    size_t num;
} sl_idmap_t;

/** Sets (or replaces) id's entry. @return 0, -EINVAL (id 0), -ENOMEM */
int sl_idmap_put(sl_idmap_t *m, uint64_t id, void *ptr, uint32_t pos);

/** @return id's entry (valid until the next put or del), or NULL */
const sl_idmap_entry_t *sl_idmap_get(const sl_idmap_t *m, uint64_t id);

/** Removes id's entry, if any. */
void sl_idmap_del(sl_idmap_t *m, uint64_t id);

/** Frees the table (it may be used again, empty). */
void sl_idmap_clear(sl_idmap_t *m);

#endif
