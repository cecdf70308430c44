/*
 * test_idmap.c: the dispatcher's index by id (dispatcher/idmap.c) at the
 * sizes --max-jobs allows: every put is found, every delete leaves the rest
 * found, against a plain array of what it should hold.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "idmap.h"

#define N 100000

Test(idmap, holds_what_was_put_through_deletions_and_growth)
{
    sl_idmap_t m = {0};
    static char present[N + 1];
    static char marker;
    for (uint64_t id = 1; id <= N; id++) {
        cr_assert_eq(sl_idmap_put(&m, id, &marker, (uint32_t)id * 3), 0);
        present[id] = 1;
    }
    cr_assert_eq(m.num, N);
    cr_assert_leq(m.cap, 4 * (size_t)N, "the table stays within four slots an entry");
    /* Delete every third id and every id in a block: runs of probes shift back. */
    for (uint64_t id = 1; id <= N; id++) {
        if (id % 3 == 0 || (id > 5000 && id < 9000)) {
            sl_idmap_del(&m, id);
            present[id] = 0;
        }
    }
    sl_idmap_del(&m, N + 7); /* absent: nothing happens */
    size_t want = 0;
    for (uint64_t id = 1; id <= N; id++) {
        const sl_idmap_entry_t *e = sl_idmap_get(&m, id);
        if (present[id]) {
            want++;
            cr_assert_not_null(e, "id %lu lost", (unsigned long)id);
            cr_assert_eq(e->pos, (uint32_t)id * 3);
            cr_assert_eq(e->ptr, &marker);
        } else {
            cr_assert_null(e, "deleted id %lu still found", (unsigned long)id);
        }
    }
    cr_assert_eq(m.num, want);
    /* Put again replaces; id 0 is no id. */
    cr_assert_eq(sl_idmap_put(&m, 1, NULL, 7), 0);
    cr_assert_eq(sl_idmap_get(&m, 1)->pos, 7);
    cr_assert_eq(m.num, want);
    cr_assert_eq(sl_idmap_put(&m, 0, NULL, 0), -EINVAL);
    cr_assert_null(sl_idmap_get(&m, 0));
    sl_idmap_clear(&m);
    cr_assert_null(sl_idmap_get(&m, 2));
}
