/*
 * sltest.c: the plugin the unit and integration tests load (libsltest.so,
 * built under BUILD/tests/plugins). Its functions work on a range source's
 * int64 scalar component "value".
 */
#include <inttypes.h>
#include <stdio.h>
#include <time.h>

#include "sluice_plugin.h"

static int get_value(const sluice_element_t *in, int64_t *v, char *err, size_t errlen)
{
    const sluice_component_t *c = sluice_plugin_find(in, "value");
    if (!c || c->dtype != SLUICE_DTYPE_INT64 || c->rank != 0) {
        snprintf(err, errlen, "no int64 scalar \"value\"");
        return 1;
    }
    *v = *(const int64_t *)c->data;
    return 0;
}

/* "double": value * 2, int64. */
static int add_double(const sluice_element_t *in, sluice_output_t *out, char *err, size_t errlen)
{
    int64_t v;
    if (get_value(in, &v, err, errlen))
        return 1;
    int64_t *d = out->tensor(out, "double", SLUICE_DTYPE_INT64, 0, NULL);
    if (!d) {
        snprintf(err, errlen, "tensor() refused \"double\"");
        return 2;
    }
    *d = 2 * v;
    return 0;
}

/* "name": the bytes "v<value>"; "pair": float32 [2] {value, -value}. */
static int add_name(const sluice_element_t *in, sluice_output_t *out, char *err, size_t errlen)
{
    int64_t v;
    if (get_value(in, &v, err, errlen))
        return 1;
    char buf[32];
    int n = snprintf(buf, sizeof buf, "v%" PRId64, v);
    const void *strings[1] = {buf};
    size_t lengths[1] = {(size_t)n};
    if (out->bytes(out, "name", 0, NULL, strings, lengths) != 0) {
        snprintf(err, errlen, "bytes() refused \"name\"");
        return 2;
    }
    int64_t shape[1] = {2};
    float *p = out->tensor(out, "pair", SLUICE_DTYPE_FLOAT32, 1, shape);
    if (!p) {
        snprintf(err, errlen, "tensor() refused \"pair\"");
        return 2;
    }
    p[0] = (float)v;
    p[1] = (float)-v;
    return 0;
}

/* Fails on value 7. */
static int fail_on_7(const sluice_element_t *in, sluice_output_t *out, char *err, size_t errlen)
{
    int64_t v;
    if (get_value(in, &v, err, errlen))
        return 1;
    if (v == 7) {
        snprintf(err, errlen, "value 7 is unlucky");
        return 7;
    }
    return add_double(in, out, err, errlen);
}

/* Hangs for 3 s on value 5, the first time in this process only (a stuck
 * pipeline, for stall detection; the worker's next task runs through). */
static int sleep_once_on_5(const sluice_element_t *in, sluice_output_t *out, char *err, size_t errlen)
{
    static _Atomic int slept;
    int64_t v;
    if (get_value(in, &v, err, errlen))
        return 1;
    if (v == 5 && !slept++)
        nanosleep(&(struct timespec){3, 0}, NULL);
    return add_double(in, out, err, errlen);
}

/* Sets "double" as float32, which the spec declares int64. */
static int wrong_dtype(const sluice_element_t *in, sluice_output_t *out, char *err, size_t errlen)
{
    (void)in;
    float *p = out->tensor(out, "double", SLUICE_DTYPE_FLOAT32, 0, NULL);
    if (!p) {
        snprintf(err, errlen, "tensor() refused");
        return 3;
    }
    *p = 0;
    return 0;
}

/* Returns success without setting anything. */
static int sets_nothing(const sluice_element_t *in, sluice_output_t *out, char *err, size_t errlen)
{
    (void)in, (void)out, (void)err, (void)errlen;
    return 0;
}

/* Keeps even values. */
static int is_even(const sluice_element_t *in, int *keep, char *err, size_t errlen)
{
    int64_t v;
    if (get_value(in, &v, err, errlen))
        return 1;
    *keep = v % 2 == 0;
    return 0;
}

static const sluice_plugin_function_t functions[] = {
    {"add_double", SLUICE_PLUGIN_MAP, add_double, NULL},
    {"add_name", SLUICE_PLUGIN_MAP, add_name, NULL},
    {"fail_on_7", SLUICE_PLUGIN_MAP, fail_on_7, NULL},
    {"sleep_once_on_5", SLUICE_PLUGIN_MAP, sleep_once_on_5, NULL},
    {"wrong_dtype", SLUICE_PLUGIN_MAP, wrong_dtype, NULL},
    {"sets_nothing", SLUICE_PLUGIN_MAP, sets_nothing, NULL},
    {"is_even", SLUICE_PLUGIN_FILTER, NULL, is_even},
};

static const sluice_plugin_t table = {SLUICE_PLUGIN_ABI_VERSION, sizeof functions / sizeof functions[0], functions};

SLUICE_PLUGIN_EXPORT const sluice_plugin_t *sluice_plugin(void)
{
    return &table;
}
