/* crc32c.c: see crc32c.h. */
#include "crc32c.h"

#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define SL_CRC32C_HW 1
#endif

#define POLY 0x82f63b78u /* reflected Castagnoli polynomial */

/* The hardware path runs three independent streams over blocks of LONG (then
 * SHORT) bytes, because the crc32 instruction has a latency of three cycles
 * but a throughput of one; the streams are joined by shifting one CRC over
 * the length of the next (tables below). */
#define LONG 8192
#define SHORT 256

static uint32_t table[8][256];      /* slicing-by-8 */
static uint32_t shift_long[4][256]; /* multiply by x^(8*LONG) mod P, byte by byte */
static uint32_t shift_short[4][256];
static bool use_hw;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

/* a * b mod P, bit 31 being the coefficient of x^0 (reflected). */
static uint32_t multmodp(uint32_t a, uint32_t b)
{
    uint32_t m = (uint32_t)1 << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0)
                break;
        }
        m >>= 1;
        b = b & 1 ? (b >> 1) ^ POLY : b >> 1;
    }
    return p;
}

/* x^(8 * n) mod P: the operator that appends n zero bytes to a raw CRC. */
static uint32_t zeros_op(size_t n)
{
    uint32_t sq = (uint32_t)1 << 30; /* x^1, squared on each step */
    uint32_t p = (uint32_t)1 << 31;  /* x^0 */
    for (size_t bits = n * 8; bits; bits >>= 1) {
        if (bits & 1)
            p = multmodp(sq, p);
        sq = multmodp(sq, sq);
    }
    return p;
}

static void shift_table_init(uint32_t t[4][256], size_t n)
{
    uint32_t op = zeros_op(n);
    for (int k = 0; k < 4; k++)
        for (uint32_t i = 0; i < 256; i++)
            t[k][i] = multmodp(op, i << (8 * k));
}

static void crc32c_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int j = 0; j < 8; j++)
            c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int k = 1; k < 8; k++)
            table[k][i] = (table[k - 1][i] >> 8) ^ table[0][table[k - 1][i] & 0xff];
    shift_table_init(shift_long, LONG);
    shift_table_init(shift_short, SHORT);
#ifdef SL_CRC32C_HW
    use_hw = __builtin_cpu_supports("sse4.2");
#endif
}

static inline uint32_t load32le(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

uint32_t sl__crc32c_portable(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&init_once, crc32c_init);
    const uint8_t *p = buf;
    crc = ~crc;
    while (len && ((uintptr_t)p & 7)) {
        crc = table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
        len--;
    }
    while (len >= 8) {
        uint32_t lo = crc ^ load32le(p), hi = load32le(p + 4);
        crc = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^ table[5][(lo >> 16) & 0xff] ^
              table[4][lo >> 24] ^ table[3][hi & 0xff] ^ table[2][(hi >> 8) & 0xff] ^
              table[1][(hi >> 16) & 0xff] ^ table[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    while (len--)
        crc = table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

#ifdef SL_CRC32C_HW
static inline uint64_t shift(const uint32_t t[4][256], uint64_t c)
{
    return t[0][c & 0xff] ^ t[1][(c >> 8) & 0xff] ^ t[2][(c >> 16) & 0xff] ^ t[3][(c >> 24) & 0xff];
}

static inline uint64_t load64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Three streams over blocks of n bytes each; the caller loops while at
 * least 3 * n bytes remain. */
#define THREE_WAY(n, t)                                                                            \
    while (len >= 3 * (n)) {                                                                       \
        uint64_t c1 = 0, c2 = 0;                                                                   \
        const uint8_t *end = p + (n);                                                              \
        do {                                                                                       \
            c0 = _mm_crc32_u64(c0, load64(p));                                                     \
            c1 = _mm_crc32_u64(c1, load64(p + (n)));                                               \
            c2 = _mm_crc32_u64(c2, load64(p + 2 * (n)));                                           \
            p += 8;                                                                                \
        } while (p < end);                                                                         \
        c0 = shift(t, c0) ^ c1;                                                                    \
        c0 = shift(t, c0) ^ c2;                                                                    \
        p += 2 * (n);                                                                              \
        len -= 3 * (n);                                                                            \
    }

__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const uint8_t *p, size_t len)
{
    uint64_t c0 = ~crc;
    while (len && ((uintptr_t)p & 7)) {
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
        len--;
    }
    THREE_WAY(LONG, shift_long)
    THREE_WAY(SHORT, shift_short)
    while (len >= 8) {
        c0 = _mm_crc32_u64(c0, load64(p));
        p += 8;
        len -= 8;
    }
    while (len--)
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    return ~(uint32_t)c0;
}
#endif

uint32_t sl_crc32c_extend(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&init_once, crc32c_init);
#ifdef SL_CRC32C_HW
    if (use_hw)
        return crc32c_hw(crc, buf, len);
#endif
    return sl__crc32c_portable(crc, buf, len);
}

uint32_t sl_crc32c(const void *buf, size_t len)
{
    return sl_crc32c_extend(0, buf, len);
}

uint32_t sl_crc32c_mask(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

uint32_t sl_crc32c_unmask(uint32_t masked)
{
    uint32_t rot = masked - 0xa282ead8u;
    return (rot >> 17) | (rot << 15);
}

const char *sl_crc32c_impl(void)
{
    pthread_once(&init_once, crc32c_init);
    return use_hw ? "sse4.2" : "slicing-by-8";
}
