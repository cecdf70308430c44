/*
 * strcopy.h: a bounded string copy without snprintf()'s format parsing,
 * for copies made per batch (a component's name, a worker's address): at
 * SL_MAX_NAME bytes snprintf() cost about 600 instructions each.
 */
#ifndef SL_STRCOPY_H
#define SL_STRCOPY_H

#include <stddef.h>
#include <string.h>

/** Copies src into dst of size bytes (size > 0), cut to size - 1 bytes and
 *  NUL-terminated, as snprintf(dst, size, "%s", src) does. @return the bytes copied */
static inline size_t sl_strcopy(char *dst, size_t size, const char *src)
{
    size_t n = strnlen(src, size - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
    return n;
}

#endif
