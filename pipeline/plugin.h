/*
 * plugin.h: the worker's plugin registry (docs/plugins.md). A worker
 * started with --plugin-dir DIR (repeatable) loads a plugin the first time
 * a pipeline names it, from those directories only, and keeps it loaded
 * until the registry is destroyed at exit, shared by every task.
 */
#ifndef SL_PLUGIN_H
#define SL_PLUGIN_H

#include <stddef.h>

#include "sluice_plugin.h"

#define SL_PLUGINS_MAX_DIRS 16 /* most --plugin-dir directories */
#define SL_PLUGINS_MAX 64      /* most plugins loaded at once */

typedef struct sl_plugins sl_plugins_t;

/**
 * Makes a registry over dirs (each resolved with realpath() now).
 * @param[in] dirs n directories, 1 .. SL_PLUGINS_MAX_DIRS; only read during the call
 * @param[out] out the registry, freed by sl_plugins_destroy()
 * @return 0; -errno (a directory that does not resolve, with err naming it),
 *         SL_EINVAL (too many directories), -ENOMEM
 */
int sl_plugins_create(const char *const *dirs, int n, sl_plugins_t **out, char *err, size_t errlen);

/** Unloads every plugin and frees the registry; NULL is ignored. Call it
 *  when no pipeline uses a plugin any more. */
void sl_plugins_destroy(sl_plugins_t *reg);

/**
 * Finds function `function` of kind `kind` (SLUICE_PLUGIN_MAP or
 * SLUICE_PLUGIN_FILTER) in plugin `file`, loading it on first use.
 * Thread-safe. reg may be NULL (no --plugin-dir): every lookup is refused.
 * @param[in] file a file name (no '/'), looked up in the directories in order;
 *            the file found must resolve (symlinks followed) inside its
 *            directory
 * @param[out] out the function's entry, valid until sl_plugins_destroy()
 * @param[out] err why not, naming the plugin and the path
 * @return 0; SL_EINVAL (no registry, a bad name, not found, outside the
 *         directory, not loadable, no entry point, another ABI version,
 *         no such function or one of the other kind); -ENOMEM
 */
int sl_plugins_find(sl_plugins_t *reg, const char *file, const char *function, int kind,
                    const sluice_plugin_function_t **out, char *err, size_t errlen);

#endif
