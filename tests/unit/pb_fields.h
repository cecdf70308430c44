/*
 * pb_fields.h: where two nanopb messages of one type differ, field by
 * field (not the padding between fields), for the tests that compare
 * decoded structs: test_frame, test_getelem and fuzz_getelem.
 */
#ifndef SL_TEST_PB_FIELDS_H
#define SL_TEST_PB_FIELDS_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <pb_common.h>

/* The tag of the first field, as desc describes them, whose bytes differ
 * between messages a and b, 0 when none does: a repeated field's count,
 * then its elements up to the count, or with past_count every element,
 * used or not (what a decoder leaves there). */
static inline uint32_t pb_fields_differ(const pb_msgdesc_t *desc, const void *a, const void *b, bool past_count)
{
    pb_field_iter_t ia, ib;
    if (!pb_field_iter_begin(&ia, desc, (void *)a) || !pb_field_iter_begin(&ib, desc, (void *)b))
        return 0;
    do {
        size_t n = 1;
        if (PB_HTYPE(ia.type) == PB_HTYPE_REPEATED) {
            if (*(const pb_size_t *)ia.pSize != *(const pb_size_t *)ib.pSize)
                return ia.tag;
            n = past_count ? ia.array_size : *(const pb_size_t *)ia.pSize;
        }
        for (size_t i = 0; i < n; i++) {
            const char *pa = (const char *)ia.pData + i * ia.data_size;
            const char *pb = (const char *)ib.pData + i * ib.data_size;
            if (PB_LTYPE_IS_SUBMSG(ia.type) ? pb_fields_differ(ia.submsg_desc, pa, pb, past_count) != 0
                                            : memcmp(pa, pb, ia.data_size) != 0)
                return ia.tag;
        }
    } while (pb_field_iter_next(&ia) && pb_field_iter_next(&ib));
    return 0;
}

#endif
