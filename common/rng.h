/*
 * rng.h: the one random-number generator: xoshiro256** (Blackman and
 * Vigna), its state seeded through splitmix64 so that any seed, 0 included,
 * gives a good state. Deterministic for a seed, so a spec's seed fixes every
 * shuffle order, crop and flip. Not for secrets.
 */
#ifndef SL_RNG_H
#define SL_RNG_H

#include <stdint.h>

typedef struct sl_rng {
    uint64_t s[4];
} sl_rng_t;

/** splitmix64's finalizer: a bijection of 64 bits that scatters near values. */
static inline uint64_t sl_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/** splitmix64: the next value of the sequence whose state is *x. */
static inline uint64_t sl_splitmix64(uint64_t *x)
{
    return sl_mix64(*x += UINT64_C(0x9e3779b97f4a7c15));
}

/** Sets r's four state words to splitmix64 outputs of seed. */
static inline void sl_rng_seed(sl_rng_t *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = sl_splitmix64(&seed);
}

static inline uint64_t sl_rotl64(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

/** @return the next 64 random bits of r (xoshiro256**; the high bits are its best) */
static inline uint64_t sl_rng_next(sl_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t result = sl_rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = sl_rotl64(s[3], 45);
    return result;
}

/** @return what sl_rng_below_by() needs for n > 0: 2^64 mod n, the values
 *  below which a draw is made again (they would make low residues likelier) */
static inline uint64_t sl_rng_threshold(uint64_t n)
{
    return (0 - n) % n;
}

/** sl_rng_below(r, n) for n > 0 with its threshold computed once: the same
 *  value from the same state, one division fewer (a shuffle's every draw) */
static inline uint64_t sl_rng_below_by(sl_rng_t *r, uint64_t n, uint64_t threshold)
{
    /* Drawing again is rare (less than n / 2^64 of the time). */
    for (;;) {
        uint64_t v = sl_rng_next(r);
        if (v >= threshold)
            return v % n;
    }
}

/** @return a uniform value in [0, n) without modulo bias (0 when n is 0) */
static inline uint64_t sl_rng_below(sl_rng_t *r, uint64_t n)
{
    if (n == 0)
        return 0;
    return sl_rng_below_by(r, n, sl_rng_threshold(n));
}

/** @return a uniform double in [lo, hi): lo + (hi - lo) u, u of 53 random bits in [0, 1) */
static inline double sl_rng_uniform(sl_rng_t *r, double lo, double hi)
{
    return lo + (hi - lo) * ((double)(sl_rng_next(r) >> 11) * 0x1p-53);
}

/** A delay of ms, give or take half of it, drawn from r: peers that lost the
 * same server do not all come back in step. @return in [ms/2, ms/2 + ms) */
static inline int64_t sl_rng_jitter_ms(sl_rng_t *r, int64_t ms)
{
    return ms / 2 + (int64_t)sl_rng_below(r, ms > 0 ? (uint64_t)ms : 0);
}

#endif
