/* confine.c: see confine.h. */
#include "confine.h"

#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "log.h"

struct sl_confine {
    size_t n;
    char **roots; /* resolved, without a trailing slash except for "/" */
    char *names;  /* "root1, root2": for messages */
};

void sl_confine_destroy(sl_confine_t *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n; i++)
        free(c->roots[i]);
    free(c->roots);
    free(c->names);
    free(c);
}

int sl_confine_create(const char *const *roots, size_t n, sl_confine_t **out, char *err, size_t errlen)
{
    *out = NULL;
    int rc = -ENOMEM;
    sl_confine_t *c = calloc(1, sizeof *c);
    if (!c || !(c->roots = calloc(n ? n : 1, sizeof *c->roots)))
        goto nomem;
    size_t names_len = 1;
    for (size_t i = 0; i < n; i++) {
        c->roots[i] = realpath(roots[i], NULL);
        if (!c->roots[i]) {
            rc = -errno;
            snprintf(err, errlen, "--data-root %s: cannot resolve: %s", roots[i], strerror(errno));
            goto fail;
        }
        c->n++;
        struct stat st;
        if (stat(c->roots[i], &st) < 0 || !S_ISDIR(st.st_mode)) {
            rc = -ENOTDIR;
            snprintf(err, errlen, "--data-root %s: not a directory", roots[i]);
            goto fail;
        }
        names_len += strlen(c->roots[i]) + 2;
    }
    if (!(c->names = malloc(names_len)))
        goto nomem;
    c->names[0] = '\0';
    for (size_t i = 0; i < c->n; i++) {
        if (i)
            strcat(c->names, ", ");
        strcat(c->names, c->roots[i]);
    }
    *out = c;
    return 0;
nomem:
    snprintf(err, errlen, "--data-root: out of memory");
fail:
    sl_confine_destroy(c);
    return rc;
}

size_t sl_confine_num_roots(const sl_confine_t *c)
{
    return c->n;
}

/* Whether resolved is root or below it, component by component. */
static bool below(const char *root, const char *resolved)
{
    size_t n = strlen(root);
    if (n == 1 && root[0] == '/')
        return resolved[0] == '/';
    return strncmp(resolved, root, n) == 0 && (resolved[n] == '\0' || resolved[n] == '/');
}

int sl_confine_check(const sl_confine_t *c, const char *path, char *resolved, size_t len, char *err,
                     size_t errlen)
{
    if (c->n == 0) {
        snprintf(err, errlen, "%s is refused: file sources need --data-root, and this worker has none", path);
        return -EACCES;
    }
    char real[PATH_MAX];
    if (!realpath(path, real)) {
        int rc = -errno;
        snprintf(err, errlen, "%s: cannot resolve: %s", path, strerror(errno));
        return rc;
    }
    bool inside = false;
    for (size_t i = 0; i < c->n && !inside; i++)
        inside = below(c->roots[i], real);
    if (!inside) {
        if (strcmp(real, path) == 0)
            snprintf(err, errlen, "%s is outside every --data-root (%s)", path, c->names);
        else
            snprintf(err, errlen, "%s resolves to %s, outside every --data-root (%s)", path, real,
                     c->names);
        return -EACCES;
    }
    if (snprintf(resolved, len, "%s", real) >= (int)len) {
        snprintf(err, errlen, "%s: resolved path %s is too long", path, real);
        return -ENAMETOOLONG;
    }
    return 0;
}

/* glob(3) reports a directory it cannot read through a callback without an
 * argument, so the first failure is kept per thread. */
static _Thread_local int glob_errno;
static _Thread_local char glob_epath[PATH_MAX];

static int glob_error(const char *epath, int eerrno)
{
    glob_errno = eerrno;
    snprintf(glob_epath, sizeof glob_epath, "%s", epath);
    return 1;
}

/* What a peer is told of a pattern that matches nothing it may read: the
 * same whether nothing matched, a match lies outside every root, or a
 * directory outside them could not be read, so that a pattern cannot probe
 * whether a path outside the roots exists (docs/security.md, "Ownership").
 * The log has what it was. */
static int hidden(const sl_confine_t *c, const char *pattern, const char *why, char *err, size_t errlen)
{
    if (why)
        sl_log_info("data root: %s: %s (the requester is told only that it matches nothing it may read)", pattern,
                    why);
    snprintf(err, errlen, "%s matches no file, or a file outside every --data-root (%s)", pattern, c->names);
    return -ENOENT;
}

int sl_confine_glob(const sl_confine_t *c, const char *pattern, sl_confine_glob_cb cb, void *arg,
                    char *err, size_t errlen)
{
    if (c->n == 0) {
        snprintf(err, errlen, "%s is refused: file sources need --data-root, and this worker has none",
                 pattern);
        return -EACCES;
    }
    glob_t g;
    glob_errno = 0;
    int grc = glob(pattern, GLOB_ERR, glob_error, &g);
    if (grc == GLOB_NOMATCH) {
        globfree(&g);
        return hidden(c, pattern, NULL, err, errlen);
    }
    if (grc == GLOB_ABORTED) {
        int rc = glob_errno ? -glob_errno : -EIO;
        char real[PATH_MAX], why[PATH_MAX + 128], unused[PATH_MAX * 2 + 128];
        globfree(&g);
        /* A directory inside a root that cannot be read is the operator's
         * to know; one outside is nobody's business. */
        snprintf(why, sizeof why, "cannot read %s: %s", glob_epath, strerror(-rc));
        if (sl_confine_check(c, glob_epath, real, sizeof real, unused, sizeof unused) < 0)
            return hidden(c, pattern, why, err, errlen);
        snprintf(err, errlen, "%s: %s", pattern, why);
        return rc;
    }
    if (grc != 0) {
        snprintf(err, errlen, "%s: out of memory expanding it", pattern);
        globfree(&g);
        return -ENOMEM;
    }

    /* Check every match before handing out the first. */
    int rc = 0;
    size_t n = g.gl_pathc;
    char **resolved = calloc(n, sizeof *resolved);
    if (!resolved) {
        rc = -ENOMEM;
        snprintf(err, errlen, "%s: out of memory", pattern);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        char real[PATH_MAX], why[PATH_MAX * 2 + 128];
        rc = sl_confine_check(c, g.gl_pathv[i], real, sizeof real, why, sizeof why);
        if (rc == -ENAMETOOLONG) {
            snprintf(err, errlen, "%s: %s", pattern, why);
            goto out;
        }
        if (rc < 0) {
            /* Outside every root, or not resolvable (a dangling link): the
             * same answer as no match. */
            rc = hidden(c, pattern, why, err, errlen);
            goto out;
        }
        if (!(resolved[i] = strdup(real))) {
            rc = -ENOMEM;
            snprintf(err, errlen, "%s: out of memory", pattern);
            goto out;
        }
    }
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = cb(arg, resolved[i]);
out:
    if (resolved)
        for (size_t i = 0; i < n; i++)
            free(resolved[i]);
    free(resolved);
    globfree(&g);
    return rc;
}
