/* test_tally.c: client/tally.c, the per-split counts of lazy provenance,
 * against a plain array at random: adds, lookups, removals and drops of
 * done epochs, and of the splits before a place, in any order. Seeded: SLUICE_TEST_SEED repeats a run. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tally.h"

enum { KEYS = 3000 };

struct ref {
    uint32_t epoch, file;
    uint64_t begin, count; /* count 0: absent */
};

Test(tally, agrees_with_a_plain_array_under_random_use)
{
    const char *env = getenv("SLUICE_TEST_SEED");
    unsigned seed = env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)time(NULL);
    fprintf(stderr, "tally.agrees...: seed %u (SLUICE_TEST_SEED=%u repeats it)\n", seed, seed);
    srand(seed);
    static struct ref ref[KEYS];
    for (size_t i = 0; i < KEYS; i++)
        /* Few epochs and files, begins close together: keys that collide. */
        ref[i] = (struct ref){(uint32_t)(i % 7), (uint32_t)(i % 13), (uint64_t)(i / 91) * 1024, 0};
    sl_tally_t t;
    sl__tally_init(&t, 2000);
    size_t live = 0;
    for (int step = 0; step < 400000; step++) {
        struct ref *r = &ref[(size_t)rand() % KEYS];
        int op = rand() % 100;
        if (op < 55) {
            uint64_t add = 1 + (uint64_t)(rand() % 1000);
            int rc = sl__tally_add(&t, r->epoch, r->file, r->begin, add);
            if (r->count == 0 && live == 2000) {
                cr_assert_eq(rc, -ENOSPC, "seed %u: a key past the bound", seed);
                continue;
            }
            cr_assert_eq(rc, 0, "seed %u", seed);
            live += r->count == 0;
            r->count += add;
        } else if (op < 85) {
            sl__tally_remove(&t, r->epoch, r->file, r->begin);
            live -= r->count != 0;
            r->count = 0;
        } else if (op < 86) {
            uint32_t below = (uint32_t)(rand() % 4);
            sl__tally_drop_below(&t, below);
            for (size_t i = 0; i < KEYS; i++)
                if (ref[i].epoch < below && ref[i].count) {
                    ref[i].count = 0;
                    live--;
                }
        } else if (op < 87) {
            /* Before a place: earlier epochs, earlier files, lower begins. */
            uint32_t e = (uint32_t)(rand() % 4), f = (uint32_t)(rand() % 13);
            uint64_t b = (uint64_t)(rand() % 40) * 1024;
            sl__tally_drop_before(&t, e, f, b);
            for (size_t i = 0; i < KEYS; i++) {
                const struct ref *k = &ref[i];
                bool before = k->epoch != e ? k->epoch < e : k->file != f ? k->file < f : k->begin < b;
                if (before && k->count) {
                    ref[i].count = 0;
                    live--;
                }
            }
        } else {
            uint64_t count = 0;
            bool has = sl__tally_get(&t, r->epoch, r->file, r->begin, &count);
            cr_assert_eq(has, r->count != 0, "seed %u, step %d", seed, step);
            if (has)
                cr_assert_eq(count, r->count, "seed %u, step %d", seed, step);
        }
        cr_assert_eq(t.num, live, "seed %u, step %d", seed, step);
    }
    /* Every key, at the end. */
    for (size_t i = 0; i < KEYS; i++) {
        uint64_t count = 0;
        bool has = sl__tally_get(&t, ref[i].epoch, ref[i].file, ref[i].begin, &count);
        cr_assert_eq(has, ref[i].count != 0, "seed %u: key %zu", seed, i);
        if (has)
            cr_assert_eq(count, ref[i].count, "seed %u: key %zu", seed, i);
    }
    sl__tally_clear(&t);
    cr_assert_eq(t.num, 0);
    uint64_t c;
    cr_assert_not(sl__tally_get(&t, ref[0].epoch, ref[0].file, ref[0].begin, &c));
    sl__tally_free(&t);
}
