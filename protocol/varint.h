/*
 * varint.h: unsigned LEB128 varints (7 bits a byte, low bits first, the
 * high bit set on every byte but the last, at most 10 bytes) and zig-zag
 * differences, as the compact wire forms use them (provwire.c, posset.c;
 * docs/protocol.md).
 */
#ifndef SL_VARINT_H
#define SL_VARINT_H

#include <stddef.h>
#include <stdint.h>

#define SL_VARINT_MAX 10

/** Writes v at p. @return the byte after it */
static inline uint8_t *sl_put_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

/** @return how many bytes sl_put_varint() writes for v */
static inline size_t sl_varint_len(uint64_t v)
{
    return v ? (size_t)(64 - __builtin_clzll(v) + 6) / 7 : 1; /* 7 bits a byte */
}

/**
 * Reads a varint at *pos of p[0..len) and moves *pos past it.
 * @return 0, or -1 when it runs past len or past 64 bits
 */
static inline int sl_get_varint(const uint8_t *p, size_t len, size_t *pos, uint64_t *v)
{
    uint64_t x = 0;
    size_t i = *pos;
    for (int shift = 0; shift < 64; shift += 7) {
        if (i >= len)
            return -1;
        uint8_t b = p[i++];
        if (shift == 63 && b > 1)
            return -1;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            *pos = i;
            return 0;
        }
    }
    return -1;
}

/** A difference of two u64 (mod 2^64) as a signed number, small ones small. */
static inline uint64_t sl_zigzag(uint64_t d)
{
    return (d << 1) ^ (0 - (d >> 63));
}

static inline uint64_t sl_unzigzag(uint64_t z)
{
    return (z >> 1) ^ (0 - (z & 1));
}

#endif
