/*
 * test_strcopy.c: sl_strcopy() (common/strcopy.h) copies as
 * snprintf(dst, size, "%s", src) does: whole when it fits, cut to size - 1
 * bytes when not, always NUL-terminated, nothing written past size.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>

#include "strcopy.h"

Test(strcopy, copies_as_snprintf_does_at_every_length)
{
    char src[80];
    for (size_t len = 0; len < sizeof src; len++) {
        memset(src, 'a' + (int)(len % 26), len);
        src[len] = '\0';
        for (size_t size = 1; size <= 40; size++) {
            char got[48], want[48];
            memset(got, 0x7f, sizeof got);
            memset(want, 0x7f, sizeof want);
            size_t n = sl_strcopy(got, size, src);
            snprintf(want, size, "%s", src);
            cr_assert(memcmp(got, want, sizeof got) == 0, "length %zu into %zu bytes: \"%s\" where snprintf gave \"%s\"",
                      len, size, got, want);
            cr_assert_eq(n, strlen(want));
        }
    }
}
