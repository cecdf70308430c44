/*
 * libslexample.so: the example plugin of docs/plugins.md (kept here so the
 * build compiles it). "to_unit" turns a uint8 component "image" of any
 * shape into float32 values in [0, 1]; "has_text" keeps elements whose
 * bytes component "text" holds a non-empty first string.
 */
#include <stdio.h>

#include "sluice_plugin.h"

static int to_unit(const sluice_element_t *in, sluice_output_t *out, char *err, size_t errlen)
{
    const sluice_component_t *img = sluice_plugin_find(in, "image");
    if (!img || img->dtype != SLUICE_DTYPE_UINT8) {
        snprintf(err, errlen, "needs a uint8 component \"image\"");
        return 1;
    }
    /* Same shape, float32: the worker allocates and bounds the memory. */
    float *dst = out->tensor(out, "image", SLUICE_DTYPE_FLOAT32, img->rank, img->shape);
    if (!dst) {
        snprintf(err, errlen, "the worker refused the output");
        return 2;
    }
    const uint8_t *src = img->data;
    for (uint64_t i = 0; i < img->count; i++)
        dst[i] = src[i] / 255.0f;
    return 0;
}

static int has_text(const sluice_element_t *in, int *keep, char *err, size_t errlen)
{
    const sluice_component_t *t = sluice_plugin_find(in, "text");
    if (!t || t->dtype != SLUICE_DTYPE_BYTES) {
        snprintf(err, errlen, "needs a bytes component \"text\"");
        return 1;
    }
    size_t len = 0;
    if (t->count > 0)
        sluice_plugin_string(t, 0, &len);
    *keep = len > 0;
    return 0;
}

static const sluice_plugin_function_t functions[] = {
    {"to_unit", SLUICE_PLUGIN_MAP, to_unit, NULL},
    {"has_text", SLUICE_PLUGIN_FILTER, NULL, has_text},
};

static const sluice_plugin_t table = {
    SLUICE_PLUGIN_ABI_VERSION,
    sizeof functions / sizeof functions[0],
    functions,
};

SLUICE_PLUGIN_EXPORT const sluice_plugin_t *sluice_plugin(void)
{
    return &table;
}
