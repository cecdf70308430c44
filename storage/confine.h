/*
 * confine.h: keeps the files a worker reads inside its --data-root
 * directories.
 *
 * A dataset spec names files, and a worker opens them with its own rights,
 * so a spec must not be able to make it read /etc/shadow. Every path is
 * resolved with realpath(3) (symlinks, "..", "." and relative paths, the
 * last against the working directory) and accepted only when the result is
 * a root or lies below one, compared component by component: /data2/x is
 * not below /data. A symlink inside a root that leads out of every root is
 * refused.
 *
 * With no roots configured every path is refused, with a message saying
 * that file sources need --data-root: a worker reads no file by accident.
 *
 * Callers should open the resolved path, not the one they were given. A
 * process that can change the tree below a root between the check and the
 * open can still race it; the roots are meant to hold data the operator
 * controls.
 */
#ifndef SL_CONFINE_H
#define SL_CONFINE_H

#include <stddef.h>

typedef struct sl_confine sl_confine_t;

/**
 * Resolves each root with realpath(3).
 * @param[in] roots n directory paths (n may be 0: every path is refused);
 *            copied
 * @param[out] out freed by sl_confine_destroy()
 * @param[out] err names the root that failed and why
 * @return 0; -ENOENT, -EACCES, ... for a root that cannot be resolved;
 *         -ENOTDIR for a root that is not a directory; -ENOMEM
 */
int sl_confine_create(const char *const *roots, size_t n, sl_confine_t **out, char *err, size_t errlen);

/** Frees c (NULL is a no-op). */
void sl_confine_destroy(sl_confine_t *c);

/** @return the number of roots */
size_t sl_confine_num_roots(const sl_confine_t *c);

/**
 * Resolves path and checks that it lies inside a root.
 * @param[out] resolved the resolved path, len bytes (PATH_MAX is enough)
 * @param[out] err why it was refused, naming path (and what it resolves to)
 *             and the roots: "/etc/passwd is outside every --data-root
 *             (/srv/data)"
 * @return 0; -EACCES outside every root or with no roots; -ENOENT, ...
 *         when path cannot be resolved; -ENAMETOOLONG when resolved is too
 *         small
 */
int sl_confine_check(const sl_confine_t *c, const char *path, char *resolved, size_t len, char *err,
                     size_t errlen);

/**
 * Called once per match of a pattern, in sorted order.
 * @param[in] resolved the match, resolved and checked; valid during the call
 * @return 0 to go on; anything else stops sl_confine_glob(), which returns it
 */
typedef int (*sl_confine_glob_cb)(void *arg, const char *resolved);

/**
 * Expands a glob(3) pattern and checks every match; all of them are checked
 * before the first callback, so either every match is handed out or none.
 * A pattern that matches nothing, one with a match outside every root (or
 * that cannot be resolved), and one that meets a directory outside the roots
 * it cannot read all fail alike, with -ENOENT and the same message ("P
 * matches no file, or a file outside every --data-root (R)"), so that the
 * answer does not tell whether a path outside the roots exists; the log
 * says which it was.
 * @param[out] err names the pattern (and, for a directory inside a root it
 *             cannot read, that directory)
 * @return 0; -ENOENT (as above); -EACCES when no root is configured; -EIO,
 *         ... when a directory inside a root cannot be read; -ENAMETOOLONG;
 *         -ENOMEM; or the callback's nonzero value
 */
int sl_confine_glob(const sl_confine_t *c, const char *pattern, sl_confine_glob_cb cb, void *arg,
                    char *err, size_t errlen);

#endif
