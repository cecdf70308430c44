/*
 * tfrecord_write.c: bench_tfrecord_write frames records as TFRecord (length,
 * masked CRC-32C of the length, data, masked CRC-32C of the data) with
 * storage/crc32c.c, for the benchmark drivers that make their own data:
 *
 *   bench_tfrecord_write OUT.tfrecord < records
 *
 * The input on stdin is a sequence of records, each an 8-byte little-endian
 * length and that many bytes; a record is at most 64 MiB. Exit codes: 0 ok,
 * 2 usage, 1 bad input or a write that failed (reason on stderr).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"

#define MAX_RECORD (64u << 20)

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: bench_tfrecord_write OUT.tfrecord < records (8-byte LE length, bytes)...\n");
        return 2;
    }
    FILE *out = fopen(argv[1], "wb");
    if (!out) {
        fprintf(stderr, "bench_tfrecord_write: %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    uint8_t *buf = NULL;
    int status = 1;
    uint64_t n = 0;
    for (;;) {
        uint8_t hdr[12], lenb[8];
        size_t got = fread(lenb, 1, sizeof lenb, stdin);
        if (got == 0 && feof(stdin))
            break;
        if (got != sizeof lenb) {
            fprintf(stderr, "bench_tfrecord_write: record %llu: truncated length\n", (unsigned long long)n);
            goto out;
        }
        uint64_t len = 0;
        for (int i = 0; i < 8; i++)
            len |= (uint64_t)lenb[i] << (8 * i);
        if (len > MAX_RECORD) {
            fprintf(stderr, "bench_tfrecord_write: record %llu: %llu bytes, over the limit of %u\n",
                    (unsigned long long)n, (unsigned long long)len, MAX_RECORD);
            goto out;
        }
        uint8_t *nb = realloc(buf, len ? len : 1);
        if (!nb) {
            fprintf(stderr, "bench_tfrecord_write: out of memory\n");
            goto out;
        }
        buf = nb;
        if (fread(buf, 1, len, stdin) != len) {
            fprintf(stderr, "bench_tfrecord_write: record %llu: truncated data\n", (unsigned long long)n);
            goto out;
        }
        put_le64(hdr, len);
        put_le32(hdr + 8, sl_crc32c_mask(sl_crc32c(hdr, 8)));
        uint8_t crc[4];
        put_le32(crc, sl_crc32c_mask(sl_crc32c(buf, len)));
        if (fwrite(hdr, 1, 12, out) != 12 || fwrite(buf, 1, len, out) != len || fwrite(crc, 1, 4, out) != 4) {
            fprintf(stderr, "bench_tfrecord_write: %s: %s\n", argv[1], strerror(errno));
            goto out;
        }
        n++;
    }
    status = 0;
out:
    free(buf);
    if (fclose(out) != 0 && status == 0) {
        fprintf(stderr, "bench_tfrecord_write: %s: %s\n", argv[1], strerror(errno));
        status = 1;
    }
    return status;
}
