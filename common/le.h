/*
 * le.h: little-endian loads and stores of the wire's and the stores' byte
 * layouts (batch row splits, provenance and skip runs, position sets,
 * checkpoints, TFRecord headers, Example encodings). The frame header is
 * big-endian and has its own in frame.c.
 */
#ifndef SL_LE_H
#define SL_LE_H

#include <stdint.h>

static inline void sl_put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void sl_put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint32_t sl_get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t sl_get_le64(const uint8_t *p)
{
    return (uint64_t)sl_get_le32(p) | (uint64_t)sl_get_le32(p + 4) << 32;
}

#endif
