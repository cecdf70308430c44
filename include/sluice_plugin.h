/*
 * sluice_plugin.h: the C ABI of Sluice worker plugins (docs/plugins.md).
 *
 * A plugin is a shared object that a worker loads from one of its
 * --plugin-dir directories when a dataset spec names it:
 *
 *   {"op": "map", "plugin": "libnorm.so", "function": "normalize",
 *    "output": {"image": "float32"}}
 *   {"op": "filter", "plugin": "libnorm.so", "function": "is_valid"}
 *
 * It exports one function, SLUICE_PLUGIN_ENTRY ("sluice_plugin"), which
 * returns a table: the ABI version the plugin was built against and its
 * functions by name. A map function reads one element and writes the
 * components the spec's "output" declares through the sluice_output_t the
 * worker passes in: the worker allocates (and bounds) every byte, so a
 * plugin never allocates what it hands back. A filter function says keep
 * or drop.
 *
 * Functions run on several threads at once (num_parallel_calls) and must
 * be thread-safe: keep no mutable global state, or guard it. They must not
 * keep pointers to the input or output past their return.
 *
 * This header depends on nothing but the C standard library; it does not
 * need sluice.h.
 */
#ifndef SLUICE_PLUGIN_H
#define SLUICE_PLUGIN_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/** The ABI version this header describes. A worker refuses a plugin whose
 *  table says another. */
#define SLUICE_PLUGIN_ABI_VERSION 1u

/** The name of the entry point every plugin exports. */
#define SLUICE_PLUGIN_ENTRY "sluice_plugin"

/** Makes a symbol visible from a shared object built with
 *  -fvisibility=hidden. */
#if defined(__GNUC__)
#define SLUICE_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define SLUICE_PLUGIN_EXPORT
#endif

/** Component dtypes; the values are those of sl_dtype_t in sluice.h. */
enum sluice_plugin_dtype {
    SLUICE_DTYPE_BOOL = 1,
    SLUICE_DTYPE_INT8 = 2,
    SLUICE_DTYPE_INT16 = 3,
    SLUICE_DTYPE_INT32 = 4,
    SLUICE_DTYPE_INT64 = 5,
    SLUICE_DTYPE_UINT8 = 6,
    SLUICE_DTYPE_UINT16 = 7,
    SLUICE_DTYPE_UINT32 = 8,
    SLUICE_DTYPE_UINT64 = 9,
    SLUICE_DTYPE_FLOAT16 = 10,
    SLUICE_DTYPE_BFLOAT16 = 11,
    SLUICE_DTYPE_FLOAT32 = 12,
    SLUICE_DTYPE_FLOAT64 = 13,
    SLUICE_DTYPE_BYTES = 14,
};

#define SLUICE_PLUGIN_MAX_RANK 8 /* the most dimensions of a shape */
#define SLUICE_PLUGIN_ERR_BYTES 512 /* the size of the err buffer a function gets */

/**
 * One component of an input element, valid during the call only.
 *
 * Numbers (every dtype but bytes): data holds count values of the dtype,
 * little-endian, row-major; size is count times the dtype's size.
 * Bytes: a list of count byte strings; string i is
 * data[offsets[i] .. offsets[i + 1]) (use sluice_plugin_string()), and size
 * is the total length of the strings. offsets is NULL for numbers.
 */
typedef struct sluice_component {
    const char *name;       /* NUL-terminated */
    int32_t dtype;          /* enum sluice_plugin_dtype */
    int32_t rank;           /* 0 .. SLUICE_PLUGIN_MAX_RANK; 0 is a scalar */
    const int64_t *shape;   /* rank dimensions */
    uint64_t count;         /* values (or strings): the product of shape */
    const void *data;       /* the values, or the strings' bytes */
    size_t size;            /* bytes at data */
    const uint64_t *offsets; /* bytes: count + 1 offsets into data; else NULL */
} sluice_component_t;

/** An input element: its components in the pipeline's order. */
typedef struct sluice_element {
    uint32_t num_components;
    const sluice_component_t *components;
} sluice_element_t;

/**
 * Where a map function writes its output, passed in by the worker. A map
 * must set every component the spec's "output" declares, each once, with
 * the dtype declared there. The worker owns the memory; it refuses (returns
 * NULL or non-zero) a name not declared, a dtype other than declared, a
 * component set twice, a shape over SLUICE_PLUGIN_MAX_RANK or with a
 * negative dimension, more bytes than its batch limit, or when out of
 * memory. After a refusal the map should return an error (the worker
 * reports its own reason with the map's message).
 */
typedef struct sluice_output sluice_output_t;
struct sluice_output {
    /** Allocates a numeric component of dtype and shape.
     * @return where to write its values (product of shape times the dtype's
     *         size bytes, 8-byte aligned, uninitialised), valid until the
     *         map returns; NULL when refused */
    void *(*tensor)(sluice_output_t *out, const char *name, int32_t dtype, int32_t rank, const int64_t *shape);
    /** Sets a bytes component of shape to the product-of-shape strings
     *  strings[i] (lengths[i] bytes each; copied).
     * @return 0, or non-zero when refused */
    int (*bytes)(sluice_output_t *out, const char *name, int32_t rank, const int64_t *shape,
                 const void *const *strings, const size_t *lengths);
    void *host; /* the worker's; do not touch */
};

/**
 * A map function.
 * @param[in] in the element, valid during the call
 * @param[in] out where to write the output components
 * @param[out] err on failure a NUL-terminated message (errlen bytes)
 * @return 0 on success; any other value fails the pipeline with err
 */
typedef int (*sluice_map_fn)(const sluice_element_t *in, sluice_output_t *out, char *err, size_t errlen);

/**
 * A filter function (a predicate).
 * @param[out] keep set to non-zero to keep the element, 0 to drop it
 * @return 0 on success; any other value fails the pipeline with err
 */
typedef int (*sluice_filter_fn)(const sluice_element_t *in, int *keep, char *err, size_t errlen);

/** What a table entry is. */
enum sluice_plugin_kind { SLUICE_PLUGIN_MAP = 1, SLUICE_PLUGIN_FILTER = 2 };

/** One function of a plugin. */
typedef struct sluice_plugin_function {
    const char *name;      /* what a spec's "function" names */
    int32_t kind;          /* enum sluice_plugin_kind */
    sluice_map_fn map;     /* kind MAP */
    sluice_filter_fn filter; /* kind FILTER */
} sluice_plugin_function_t;

/** The table the entry point returns; it must stay valid while the plugin
 *  is loaded (a static const object). */
typedef struct sluice_plugin {
    uint32_t abi_version; /* SLUICE_PLUGIN_ABI_VERSION */
    uint32_t num_functions;
    const sluice_plugin_function_t *functions;
} sluice_plugin_t;

/** The entry point's type: `SLUICE_PLUGIN_EXPORT const sluice_plugin_t *sluice_plugin(void);` */
typedef const sluice_plugin_t *(*sluice_plugin_entry_fn)(void);

/** @return the component of in named name, or NULL */
static inline const sluice_component_t *sluice_plugin_find(const sluice_element_t *in, const char *name)
{
    for (uint32_t i = 0; i < in->num_components; i++) {
        if (strcmp(in->components[i].name, name) == 0)
            return &in->components[i];
    }
    return NULL;
}

/** @return string i of a bytes component c, *len its length */
static inline const uint8_t *sluice_plugin_string(const sluice_component_t *c, uint64_t i, size_t *len)
{
    *len = (size_t)(c->offsets[i + 1] - c->offsets[i]);
    return (const uint8_t *)c->data + c->offsets[i];
}

#ifdef __cplusplus
}
#endif

#endif
