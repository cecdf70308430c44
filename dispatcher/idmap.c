/* idmap.c: see idmap.h. */
#include "idmap.h"

#include <errno.h>
#include <stdlib.h>

static size_t slot_of(uint64_t id, size_t cap)
{
    /* splitmix64's finalizer: ids come from a counter. */
    id ^= id >> 30;
    id *= UINT64_C(0xbf58476d1ce4e5b9);
    id ^= id >> 27;
    id *= UINT64_C(0x94d049bb133111eb);
    id ^= id >> 31;
    return (size_t)id & (cap - 1);
}

static int grow(sl_idmap_t *m)
{
    size_t ncap = m->cap ? m->cap * 2 : 16;
    sl_idmap_entry_t *ns = calloc(ncap, sizeof *ns);
    if (!ns)
        return -ENOMEM;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->slots[i].id == 0)
            continue;
        size_t s = slot_of(m->slots[i].id, ncap);
        while (ns[s].id != 0)
            s = (s + 1) & (ncap - 1);
        ns[s] = m->slots[i];
    }
    free(m->slots);
    m->slots = ns;
    m->cap = ncap;
    return 0;
}

int sl_idmap_put(sl_idmap_t *m, uint64_t id, void *ptr, uint32_t pos)
{
    if (id == 0)
        return -EINVAL;
    if ((m->num + 1) * 2 > m->cap && grow(m) < 0)
        return -ENOMEM;
    size_t s = slot_of(id, m->cap);
    while (m->slots[s].id != 0 && m->slots[s].id != id)
        s = (s + 1) & (m->cap - 1);
    if (m->slots[s].id == 0)
        m->num++;
    m->slots[s] = (sl_idmap_entry_t){.id = id, .ptr = ptr, .pos = pos};
    return 0;
}

const sl_idmap_entry_t *sl_idmap_get(const sl_idmap_t *m, uint64_t id)
{
    if (id == 0 || m->cap == 0)
        return NULL;
    for (size_t s = slot_of(id, m->cap);; s = (s + 1) & (m->cap - 1)) {
        if (m->slots[s].id == id)
            return &m->slots[s];
        if (m->slots[s].id == 0)
            return NULL;
    }
}

void sl_idmap_del(sl_idmap_t *m, uint64_t id)
{
    sl_idmap_entry_t *e = (sl_idmap_entry_t *)sl_idmap_get(m, id);
    if (!e)
        return;
    size_t mask = m->cap - 1, hole = (size_t)(e - m->slots);
    m->slots[hole].id = 0;
    m->num--;
    /* Backward shift: every entry of the run after the hole that may sit
     * at the hole (its home slot is not in (hole, here]) moves into it. */
    for (size_t s = (hole + 1) & mask; m->slots[s].id != 0; s = (s + 1) & mask) {
        size_t home = slot_of(m->slots[s].id, m->cap);
        if (((s - home) & mask) >= ((s - hole) & mask)) {
            m->slots[hole] = m->slots[s];
            m->slots[s].id = 0;
            hole = s;
        }
    }
}

void sl_idmap_clear(sl_idmap_t *m)
{
    free(m->slots);
    *m = (sl_idmap_t){0};
}
