/*
 * test_crc32c.c: CRC-32C (storage/crc32c.c) against published test vectors
 * (RFC 3720 B.4 and the usual check value), the portable path against the
 * one in use over every length and alignment, and TFRecord's mask.
 */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"

/* xorshift64*: a seeded generator, so failures reproduce. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

Test(crc32c, check_value)
{
    cr_assert_eq(sl_crc32c("123456789", 9), 0xe3069283u);
    cr_assert_eq(sl__crc32c_portable(0, "123456789", 9), 0xe3069283u);
    cr_assert_eq(sl_crc32c("", 0), 0u);
    cr_assert_eq(sl_crc32c("a", 1), 0xc1d04330u);
}

/* RFC 3720, appendix B.4. */
Test(crc32c, rfc3720_vectors)
{
    uint8_t buf[48];
    memset(buf, 0, 32);
    cr_assert_eq(sl_crc32c(buf, 32), 0x8a9136aau);
    memset(buf, 0xff, 32);
    cr_assert_eq(sl_crc32c(buf, 32), 0x62a8ab43u);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)i;
    cr_assert_eq(sl_crc32c(buf, 32), 0x46dd794eu);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)(31 - i);
    cr_assert_eq(sl_crc32c(buf, 32), 0x113fdb5cu);
    static const uint8_t iscsi_read[48] = {
        0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18,
        0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
    cr_assert_eq(sl_crc32c(iscsi_read, sizeof iscsi_read), 0xd9963a56u);
}

Test(crc32c, implementation_is_named)
{
    const char *impl = sl_crc32c_impl();
    cr_assert(strcmp(impl, "sse4.2") == 0 || strcmp(impl, "slicing-by-8") == 0, "impl %s", impl);
#if defined(__x86_64__)
    if (__builtin_cpu_supports("sse4.2"))
        cr_assert_str_eq(impl, "sse4.2");
#endif
}

/* Lengths around the hardware path's block sizes (256 and 8192, three
 * streams each), at every alignment. */
Test(crc32c, fast_path_matches_portable)
{
    size_t cap = 3 * 8192 * 2 + 64;
    uint8_t *buf = malloc(cap);
    cr_assert_not_null(buf);
    for (size_t i = 0; i < cap; i++)
        buf[i] = (uint8_t)rng();
    static const size_t lens[] = {0,   1,   7,   8,   9,    63,   255,  256,  767,  768,   769,
                                  1000, 4096, 8191, 24575, 24576, 24577, 25000, 3 * 8192 * 2};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        for (size_t align = 0; align < 8; align++) {
            size_t n = lens[li];
            cr_assert_leq(align + n, cap);
            uint32_t want = sl__crc32c_portable(0, buf + align, n);
            cr_assert_eq(sl_crc32c(buf + align, n), want, "len %zu align %zu", n, align);
        }
    }
    free(buf);
}

Test(crc32c, extend_is_concatenation)
{
    uint8_t buf[10000];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (uint8_t)rng();
    uint32_t whole = sl_crc32c(buf, sizeof buf);
    for (size_t cut = 0; cut <= sizeof buf; cut += 997) {
        uint32_t crc = sl_crc32c_extend(sl_crc32c(buf, cut), buf + cut, sizeof buf - cut);
        cr_assert_eq(crc, whole, "cut at %zu", cut);
        crc = sl__crc32c_portable(sl__crc32c_portable(0, buf, cut), buf + cut, sizeof buf - cut);
        cr_assert_eq(crc, whole, "portable, cut at %zu", cut);
    }
}

Test(crc32c, tfrecord_mask)
{
    /* The header of a 3-byte record as TensorFlow writes it. */
    uint8_t len8[8] = {3, 0, 0, 0, 0, 0, 0, 0};
    uint32_t crc = sl_crc32c(len8, 8);
    cr_assert_eq(sl_crc32c_mask(crc), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
    cr_assert_eq(sl_crc32c_mask(0), 0xa282ead8u);
    cr_assert_eq(sl_crc32c_mask(0xe3069283u), (uint32_t)(((0xe3069283u >> 15) | (0xe3069283u << 17)) + 0xa282ead8u));
    for (int i = 0; i < 1000; i++) {
        uint32_t v = (uint32_t)rng();
        cr_assert_eq(sl_crc32c_unmask(sl_crc32c_mask(v)), v);
    }
}
