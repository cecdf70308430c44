/*
 * errbuf.h: the one way a function here says why it failed: a message
 * written into the caller's buffer, next to the returned code.
 */
#ifndef SL_ERRBUF_H
#define SL_ERRBUF_H

#include <stddef.h>

/** Writes the formatted message into err (when err and errlen are given)
 *  and returns code, so that a failure is one statement:
 *  `return sl_errf(err, errlen, -ENOENT, "%s: no such file", path);` */
int sl_errf(char *err, size_t errlen, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#endif
