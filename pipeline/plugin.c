/*
 * plugin.c: loading plugins from the --plugin-dir directories (plugin.h).
 *
 * A name is looked up as DIR/NAME in each directory in turn; the first that
 * exists is resolved with realpath() and must still lie inside DIR (a
 * symlink pointing out of the directory is refused, not followed). The
 * resolved path is opened with dlopen(RTLD_NOW | RTLD_LOCAL) once and the
 * handle kept, keyed by that path, until the registry is destroyed.
 */
#include "plugin.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "errbuf.h"
#include "sluice.h"

_Static_assert((int)SLUICE_DTYPE_BOOL == (int)SL_DTYPE_BOOL && (int)SLUICE_DTYPE_INT64 == (int)SL_DTYPE_INT64 &&
                   (int)SLUICE_DTYPE_FLOAT32 == (int)SL_DTYPE_FLOAT32 && (int)SLUICE_DTYPE_BYTES == (int)SL_DTYPE_BYTES &&
                   (int)SLUICE_DTYPE_FLOAT64 == (int)SL_DTYPE_FLOAT64 && SLUICE_PLUGIN_MAX_RANK == SL_MAX_RANK,
               "sluice_plugin.h and sluice.h agree");

struct loaded {
    char path[PATH_MAX]; /* resolved */
    void *handle;
    const sluice_plugin_t *table;
};

struct sl_plugins {
    pthread_mutex_t mu;
    int num_dirs;
    char dirs[SL_PLUGINS_MAX_DIRS][PATH_MAX]; /* resolved */
    int num_loaded;
    struct loaded loaded[SL_PLUGINS_MAX];
};

int sl_plugins_create(const char *const *dirs, int n, sl_plugins_t **out, char *err, size_t errlen)
{
    *out = NULL;
    if (n < 1 || n > SL_PLUGINS_MAX_DIRS)
        return sl_errf(err, errlen, SL_EINVAL, "--plugin-dir: 1 to %d directories, got %d", SL_PLUGINS_MAX_DIRS, n);
    sl_plugins_t *reg = calloc(1, sizeof *reg);
    if (!reg)
        return -ENOMEM;
    for (int i = 0; i < n; i++) {
        struct stat st;
        if (!realpath(dirs[i], reg->dirs[i])) {
            int e = errno;
            free(reg);
            return sl_errf(err, errlen, -e, "--plugin-dir %s: %s", dirs[i], strerror(e));
        }
        if (stat(reg->dirs[i], &st) < 0 || !S_ISDIR(st.st_mode)) {
            free(reg);
            return sl_errf(err, errlen, -ENOTDIR, "--plugin-dir %s: not a directory", dirs[i]);
        }
    }
    reg->num_dirs = n;
    pthread_mutex_init(&reg->mu, NULL);
    *out = reg;
    return 0;
}

void sl_plugins_destroy(sl_plugins_t *reg)
{
    if (!reg)
        return;
    for (int i = 0; i < reg->num_loaded; i++)
        dlclose(reg->loaded[i].handle);
    pthread_mutex_destroy(&reg->mu);
    free(reg);
}

/* Whether path lies below dir (both resolved). */
static bool inside(const char *dir, const char *path)
{
    size_t n = strlen(dir);
    if (strcmp(dir, "/") == 0)
        return path[0] == '/';
    return strncmp(dir, path, n) == 0 && path[n] == '/';
}

/* Resolves file in the directories: 0 with real set, or a refusal. */
static int resolve(sl_plugins_t *reg, const char *file, char *real, char *err, size_t errlen)
{
    char cand[PATH_MAX + 256];
    if (!file[0] || strchr(file, '/') || strstr(file, ".."))
        return sl_errf(err, errlen, SL_EINVAL,
                       "plugin \"%s\": must be a file name in a --plugin-dir (no '/', no \"..\")",
                       file);
    for (int i = 0; i < reg->num_dirs; i++) {
        snprintf(cand, sizeof cand, "%s/%s", reg->dirs[i], file);
        struct stat st;
        if (lstat(cand, &st) < 0)
            continue;
        if (!realpath(cand, real))
            return sl_errf(err, errlen, SL_EINVAL, "plugin \"%s\": %s: %s", file, cand, strerror(errno));
        if (!inside(reg->dirs[i], real))
            return sl_errf(err, errlen, SL_EINVAL, "plugin \"%s\": %s resolves to %s, outside the --plugin-dir %s",
                           file, cand, real, reg->dirs[i]);
        if (stat(real, &st) < 0 || !S_ISREG(st.st_mode))
            return sl_errf(err, errlen, SL_EINVAL, "plugin \"%s\": %s is not a regular file", file, real);
        return 0;
    }
    size_t o = 0;
    char where[1024] = "";
    for (int i = 0; i < reg->num_dirs && o < sizeof where; i++)
        o += (size_t)snprintf(where + o, sizeof where - o, "%s%s/%s", i ? ", " : "", reg->dirs[i], file);
    return sl_errf(err, errlen, SL_EINVAL, "plugin \"%s\": not found (looked for %s)", file, where);
}

/* Loads the plugin at real (resolved) unless loaded; called under mu. */
static int load(sl_plugins_t *reg, const char *file, const char *real, const sluice_plugin_t **table, char *err,
                size_t errlen)
{
    for (int i = 0; i < reg->num_loaded; i++) {
        if (strcmp(reg->loaded[i].path, real) == 0) {
            *table = reg->loaded[i].table;
            return 0;
        }
    }
    if (reg->num_loaded == SL_PLUGINS_MAX)
        return sl_errf(err, errlen, SL_EINVAL, "plugin \"%s\": at most %d plugins can be loaded", file, SL_PLUGINS_MAX);
    void *h = dlopen(real, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        return sl_errf(err, errlen, SL_EINVAL,
                       "plugin \"%s\": cannot load %s: %s", file, real, why ? why : "dlopen failed");
    }
    sluice_plugin_entry_fn entry;
    /* POSIX lets a data pointer carry a function's address; dlsym returns one. */
    void *sym = dlsym(h, SLUICE_PLUGIN_ENTRY);
    memcpy(&entry, &sym, sizeof entry);
    const sluice_plugin_t *t = sym ? entry() : NULL;
    if (!sym || !t) {
        dlclose(h);
        return sl_errf(err, errlen, SL_EINVAL, "plugin \"%s\": %s %s", file, real,
                       sym ? "returned no table from " SLUICE_PLUGIN_ENTRY "()"
                        : "does not export " SLUICE_PLUGIN_ENTRY " (see sluice_plugin.h)");
    }
    if (t->abi_version != SLUICE_PLUGIN_ABI_VERSION) {
        unsigned v = t->abi_version;
        dlclose(h);
        return sl_errf(err, errlen, SL_EINVAL,
                       "plugin \"%s\": %s has ABI version %u, this worker takes version %u", file,
                       real, v, SLUICE_PLUGIN_ABI_VERSION);
    }
    struct loaded *l = &reg->loaded[reg->num_loaded++];
    snprintf(l->path, sizeof l->path, "%s", real);
    l->handle = h;
    l->table = t;
    *table = t;
    return 0;
}

int sl_plugins_find(sl_plugins_t *reg, const char *file, const char *function, int kind,
                    const sluice_plugin_function_t **out, char *err, size_t errlen)
{
    char real[PATH_MAX];
    const sluice_plugin_t *t = NULL;
    *out = NULL;
    if (!reg)
        return sl_errf(err, errlen, SL_EINVAL,
                       "plugin \"%s\": this worker loads no plugins (start sluice-workerd with --plugin-dir DIR)",
                       file);
    int rc = resolve(reg, file, real, err, errlen);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&reg->mu);
    rc = load(reg, file, real, &t, err, errlen);
    pthread_mutex_unlock(&reg->mu);
    if (rc < 0)
        return rc;
    const char *want = kind == SLUICE_PLUGIN_MAP ? "map" : "filter";
    for (uint32_t i = 0; i < t->num_functions; i++) {
        const sluice_plugin_function_t *f = &t->functions[i];
        if (!f->name || strcmp(f->name, function) != 0)
            continue;
        if (f->kind != kind || (kind == SLUICE_PLUGIN_MAP ? !f->map : !f->filter))
            return sl_errf(err, errlen, SL_EINVAL, "plugin \"%s\": function \"%s\" in %s is not a %s function", file,
                           function, real, want);
        *out = f;
        return 0;
    }
    return sl_errf(err, errlen, SL_EINVAL, "plugin \"%s\": %s has no function \"%s\"", file, real, function);
}
