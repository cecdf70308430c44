/*
 * seed_util.h: seeded draws for property tests. test_seed() takes
 * SLUICE_TEST_SEED when it is set (to repeat a run), else the time, and
 * prints it under the test's name; splitmix64() draws the same numbers on
 * every machine for one seed; shuffled_order() draws a permutation with it.
 */
#ifndef SL_TEST_SEED_UTIL_H
#define SL_TEST_SEED_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static inline unsigned test_seed(const char *test)
{
    const char *env = getenv("SLUICE_TEST_SEED");
    unsigned seed = env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)time(NULL);
    fprintf(stderr, "%s: seed %u (SLUICE_TEST_SEED=%u repeats it)\n", test, seed, seed);
    return seed;
}

static inline uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* order[0..n) = 0 .. n-1 in an order drawn from seed (Fisher-Yates). */
static inline void shuffled_order(uint64_t *order, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(splitmix64(&seed) % i);
        uint64_t t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
    }
}

#endif
