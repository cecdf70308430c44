/*
 * crc32c.h: CRC-32C (Castagnoli, reflected polynomial 0x82f63b78), as
 * TFRecord, iSCSI and ext4 use it, and TFRecord's masking of it.
 *
 * On x86-64 processors with SSE4.2 the crc32 instruction is used, three
 * streams at a time; elsewhere a portable slicing-by-8 table. The choice is
 * made at run time; both give the same results. Every function is pure and
 * safe to call from any thread.
 */
#ifndef SL_CRC32C_H
#define SL_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/**
 * Extends a CRC-32C over more bytes: sl_crc32c_extend(sl_crc32c_extend(0, a),
 * b) is the CRC of a followed by b.
 * @param[in] crc the CRC of the bytes before buf (0 for none)
 * @param[in] buf len bytes, any alignment
 * @return the CRC of everything so far (sl_crc32c("123456789") = 0xe3069283)
 */
uint32_t sl_crc32c_extend(uint32_t crc, const void *buf, size_t len);

/** @return the CRC-32C of len bytes at buf */
uint32_t sl_crc32c(const void *buf, size_t len);

/**
 * TFRecord's mask, which keeps a CRC stored inside data from being the CRC
 * of that data: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
 * @return the masked CRC
 */
uint32_t sl_crc32c_mask(uint32_t crc);

/** @return the CRC that sl_crc32c_mask() turned into masked */
uint32_t sl_crc32c_unmask(uint32_t masked);

/** @return "sse4.2" or "slicing-by-8": the implementation in use */
const char *sl_crc32c_impl(void);

/* Internal, for the tests: the portable implementation, whatever the CPU. */
uint32_t sl__crc32c_portable(uint32_t crc, const void *buf, size_t len);

#endif
