/*
 * test_plugin.c: the plugin registry (pipeline/plugin.c), the map and filter
 * ops (pipeline/ops_map.c) and their spec fields (spec/spec.c), with the
 * test plugins built under BUILD/tests/plugins (tests/plugins/).
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pipeline_util.h"
#include "element.h"
#include "plugin.h"

static sl_plugins_t *plugins;

static void setup(void)
{
    const char *dirs[] = {SL_TEST_PLUGIN_DIR};
    char err[512];
    cr_assert_eq(sl_plugins_create(dirs, 1, &plugins, err, sizeof err), 0, "%s", err);
}

static void teardown(void)
{
    sl_plugins_destroy(plugins);
    plugins = NULL;
}

TestSuite(plugin, .init = setup, .fini = teardown);

/* Runs range(0, n) through ops, one element per batch. */
static batches_t run_range(int n, const char *ops)
{
    sl_pipeline_opts_t o = {.plugins = plugins};
    return run_spec(specf("{\"source\":{\"type\":\"range\",\"stop\":%d},\"ops\":[%s]}", n, ops), &o);
}

/* The pipeline error of range(0, 4) through ops, which must fail to build. */
static void build_fails(sl_plugins_t *reg, const char *ops, const char *want)
{
    sl_pipeline_opts_t o = {.plugins = reg};
    sl_pipeline_t *p = NULL;
    char err[1024] = "";
    int rc = pipeline_try(specf("{\"source\":{\"type\":\"range\",\"stop\":4},\"ops\":[%s]}", ops), &o, &p, err,
                          sizeof err);
    cr_assert_lt(rc, 0, "built %s", ops);
    cr_assert_null(p);
    cr_assert_not_null(strstr(err, want), "error \"%s\" does not say \"%s\"", err, want);
}

static void spec_fails(const char *ops, const char *want)
{
    const char *json = specf("{\"source\":{\"type\":\"range\",\"stop\":4},\"ops\":[%s]}", ops);
    sl_spec_t *spec = NULL;
    char err[512] = "";
    cr_assert_eq(sl_spec_parse(json, strlen(json), &spec, err, sizeof err), SL_ESPEC, "accepted %s", ops);
    cr_assert_not_null(strstr(err, want), "error \"%s\" does not say \"%s\"", err, want);
}

Test(plugin, map_adds_a_component)
{
    batches_t bs = run_range(5, "{\"op\":\"map\",\"plugin\":\"libsltest.so\",\"function\":\"add_double\","
                                "\"output\":{\"double\":\"int64\"}}");
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    cr_assert_eq(bs.n, 5);
    for (size_t i = 0; i < bs.n; i++) {
        cr_assert_eq(bs.b[i]->num_components, 2);
        cr_assert_eq(i64_at(bs.b[i], comp_of(bs.b[i], "value"), 0), (int64_t)i);
        cr_assert_eq(i64_at(bs.b[i], comp_of(bs.b[i], "double"), 0), 2 * (int64_t)i);
    }
    batches_free(&bs);
}

Test(plugin, map_bytes_and_tensor_outputs_then_batch)
{
    batches_t bs = run_range(4, "{\"op\":\"map\",\"plugin\":\"libsltest.so\",\"function\":\"add_name\","
                                "\"output\":{\"name\":\"bytes\",\"pair\":\"float32\"},\"keep_input\":false},"
                                "{\"op\":\"batch\",\"batch_size\":4}");
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    cr_assert_eq(bs.n, 1);
    const sl_wire_batch_t *b = bs.b[0];
    cr_assert_eq(b->num_components, 2, "keep_input false drops \"value\"");
    const sl_component_t *pair = comp_of(b, "pair");
    cr_assert_eq(pair->rank, 2);
    cr_assert_eq(pair->shape[0], 4);
    cr_assert_eq(pair->shape[1], 2);
    cr_assert_float_eq(f32_at(b, pair, 5), -2.0f, 0);
    const sl_component_t *name = comp_of(b, "name");
    cr_assert_eq(name->dtype, SL_DTYPE_BYTES);
    size_t len;
    const uint8_t *s = sl_bytes_at(b->data + name->offset, 4, 3, &len);
    cr_assert_eq(len, 2);
    cr_assert_eq(memcmp(s, "v3", 2), 0);
    batches_free(&bs);
}

Test(plugin, map_errors_name_the_op_and_the_plugins_message)
{
    batches_t bs = run_range(10, "{\"op\":\"map\",\"plugin\":\"libsltest.so\",\"function\":\"fail_on_7\","
                                 "\"output\":{\"double\":\"int64\"}}");
    cr_assert_eq(bs.rc, SL_EDATA);
    cr_assert_eq(bs.n, 7, "the elements before the failing one arrive");
    cr_assert_not_null(strstr(bs.errmsg, "ops[0] (map)"), "%s", bs.errmsg);
    cr_assert_not_null(strstr(bs.errmsg, "value 7 is unlucky"), "%s", bs.errmsg);
    batches_free(&bs);

    bs = run_range(3, "{\"op\":\"map\",\"plugin\":\"libsltest.so\",\"function\":\"wrong_dtype\","
                      "\"output\":{\"double\":\"int64\"}}");
    cr_assert_eq(bs.rc, SL_EDATA);
    cr_assert_not_null(strstr(bs.errmsg, "declared int64, the plugin set it as float32"), "%s", bs.errmsg);
    batches_free(&bs);

    bs = run_range(3, "{\"op\":\"map\",\"plugin\":\"libsltest.so\",\"function\":\"sets_nothing\","
                      "\"output\":{\"double\":\"int64\"}}");
    cr_assert_eq(bs.rc, SL_EDATA);
    cr_assert_not_null(strstr(bs.errmsg, "did not set output \"double\""), "%s", bs.errmsg);
    batches_free(&bs);
}

Test(plugin, filter_by_plugin_predicate)
{
    batches_t bs = run_range(9, "{\"op\":\"filter\",\"plugin\":\"libsltest.so\",\"function\":\"is_even\"}");
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    cr_assert_eq(bs.n, 5);
    for (size_t i = 0; i < bs.n; i++)
        cr_assert_eq(i64_at(bs.b[i], comp_of(bs.b[i], "value"), 0), 2 * (int64_t)i);
    batches_free(&bs);
}

/* Counts the elements of range(0, 10) a comparison keeps, and their sum. */
static void filter_keeps(const char *cmp, const char *value, size_t n, int64_t sum)
{
    char op[256];
    snprintf(op, sizeof op, "{\"op\":\"filter\",\"key\":\"value\",\"cmp\":\"%s\",\"value\":%s}", cmp, value);
    batches_t bs = run_range(10, op);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    cr_assert_eq(bs.n, n, "cmp %s %s kept %zu", cmp, value, bs.n);
    int64_t s = 0;
    for (size_t i = 0; i < bs.n; i++)
        s += i64_at(bs.b[i], comp_of(bs.b[i], "value"), 0);
    cr_assert_eq(s, sum, "cmp %s %s", cmp, value);
    batches_free(&bs);
}

Test(plugin, filter_builtin_comparisons)
{
    filter_keeps("eq", "3", 1, 3);
    filter_keeps("ne", "3", 9, 42);
    filter_keeps("lt", "3", 3, 3);
    filter_keeps("le", "3", 4, 6);
    filter_keeps("gt", "7", 2, 17);
    filter_keeps("ge", "7.5", 2, 17);
    filter_keeps("in", "[1, 4, 4.0, 11]", 2, 5);
    filter_keeps("eq", "3.5", 0, 0);
}

Test(plugin, filter_then_map_with_batch)
{
    batches_t bs = run_range(10, "{\"op\":\"filter\",\"key\":\"value\",\"cmp\":\"ge\",\"value\":4},"
                                 "{\"op\":\"map\",\"plugin\":\"libsltest.so\",\"function\":\"add_double\","
                                 "\"output\":{\"double\":\"int64\"}},{\"op\":\"batch\",\"batch_size\":3}");
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    cr_assert_eq(bs.n, 2);
    cr_assert_eq(i64_at(bs.b[1], comp_of(bs.b[1], "double"), 2), 18);
    batches_free(&bs);
}

Test(plugin, refusals_at_build)
{
    build_fails(plugins, "{\"op\":\"map\",\"plugin\":\"libnothere.so\",\"function\":\"f\",\"output\":{\"x\":\"int64\"}}",
                "ops[0] (map): plugin \"libnothere.so\": not found (looked for " SL_TEST_PLUGIN_DIR "/libnothere.so)");
    build_fails(plugins, "{\"op\":\"map\",\"plugin\":\"libsltest.so\",\"function\":\"nope\",\"output\":{\"x\":\"int64\"}}",
                "has no function \"nope\"");
    build_fails(plugins, "{\"op\":\"map\",\"plugin\":\"libsltest.so\",\"function\":\"is_even\",\"output\":{\"x\":\"int64\"}}",
                "function \"is_even\" in " SL_TEST_PLUGIN_DIR "/libsltest.so is not a map function");
    build_fails(plugins, "{\"op\":\"filter\",\"plugin\":\"libslbadabi.so\",\"function\":\"f\"}",
                "ops[0] (filter): plugin \"libslbadabi.so\": " SL_TEST_PLUGIN_DIR "/libslbadabi.so has ABI version 99, "
                "this worker takes version 1");
    build_fails(plugins, "{\"op\":\"filter\",\"plugin\":\"libslnoentry.so\",\"function\":\"f\"}",
                "does not export sluice_plugin");
    build_fails(NULL, "{\"op\":\"filter\",\"plugin\":\"libsltest.so\",\"function\":\"is_even\"}",
                "ops[0] (filter): plugin \"libsltest.so\": this worker loads no plugins (start sluice-workerd with "
                "--plugin-dir DIR)");
    build_fails(plugins, "{\"op\":\"filter\",\"key\":\"nope\",\"cmp\":\"eq\",\"value\":1}",
                "ops[0] (filter): component \"nope\" is not in its input (value)");
}

Test(plugin, symlink_out_of_the_dir_is_refused)
{
    char dir[] = "/tmp/sl-plugin-XXXXXX", link[PATH_MAX], real[PATH_MAX];
    cr_assert_not_null(mkdtemp(dir));
    /* A symlink in the plugin dir to the real plugin outside it. */
    snprintf(link, sizeof link, "%s/libescape.so", dir);
    cr_assert_not_null(realpath(SL_TEST_PLUGIN_DIR "/libsltest.so", real));
    cr_assert_eq(symlink(real, link), 0);
    const char *dirs[] = {dir};
    sl_plugins_t *reg = NULL;
    char err[1024];
    cr_assert_eq(sl_plugins_create(dirs, 1, &reg, err, sizeof err), 0, "%s", err);
    const sluice_plugin_function_t *fn = NULL;
    cr_assert_eq(sl_plugins_find(reg, "libescape.so", "is_even", SLUICE_PLUGIN_FILTER, &fn, err, sizeof err),
                 SL_EINVAL);
    cr_assert_not_null(strstr(err, "outside the --plugin-dir"), "%s", err);
    cr_assert_eq(sl_plugins_find(reg, "../libsltest.so", "is_even", SLUICE_PLUGIN_FILTER, &fn, err, sizeof err),
                 SL_EINVAL);
    cr_assert_not_null(strstr(err, "no '/'"), "%s", err);
    sl_plugins_destroy(reg);
    unlink(link);
    rmdir(dir);
}

Test(plugin, loaded_once_and_shared)
{
    const sluice_plugin_function_t *a = NULL, *b = NULL;
    char err[512];
    cr_assert_eq(sl_plugins_find(plugins, "libsltest.so", "is_even", SLUICE_PLUGIN_FILTER, &a, err, sizeof err), 0,
                 "%s", err);
    cr_assert_eq(sl_plugins_find(plugins, "libsltest.so", "is_even", SLUICE_PLUGIN_FILTER, &b, err, sizeof err), 0,
                 "%s", err);
    cr_assert_eq(a, b, "one load, one table");
}

Test(plugin, spec_refusals_with_json_paths)
{
    spec_fails("{\"op\":\"map\",\"plugin\":\"../x.so\",\"function\":\"f\",\"output\":{\"x\":\"int64\"}}",
               "$.ops[0].plugin: must be a file name in the worker's --plugin-dir (no '/', no \"..\"), got \"../x.so\"");
    spec_fails("{\"op\":\"map\",\"plugin\":\"/lib/x.so\",\"function\":\"f\",\"output\":{\"x\":\"int64\"}}",
               "$.ops[0].plugin: must be a file name");
    spec_fails("{\"op\":\"map\",\"plugin\":\"x.so\",\"function\":\"1f\",\"output\":{\"x\":\"int64\"}}",
               "$.ops[0].function: must be a function name");
    spec_fails("{\"op\":\"map\",\"plugin\":\"x.so\",\"function\":\"f\"}", "$.ops[0].output: required field missing");
    spec_fails("{\"op\":\"map\",\"plugin\":\"x.so\",\"function\":\"f\",\"output\":{\"x\":\"int3\"}}",
               "$.ops[0].output.x: must be \"bool\"");
    spec_fails("{\"op\":\"filter\",\"key\":\"value\",\"cmp\":\"eq\"}", "$.ops[0].value: required field missing");
    spec_fails("{\"op\":\"filter\",\"key\":\"value\",\"cmp\":\"about\",\"value\":1}", "$.ops[0].cmp: must be \"eq\"");
    spec_fails("{\"op\":\"filter\",\"key\":\"value\",\"cmp\":\"in\",\"value\":1}",
               "$.ops[0].value: must be a list of numbers for cmp \"in\"");
    spec_fails("{\"op\":\"filter\",\"key\":\"value\",\"cmp\":\"eq\",\"value\":[1]}",
               "$.ops[0].value: must be a number (a list goes with cmp \"in\")");
    spec_fails("{\"op\":\"filter\",\"plugin\":\"x.so\",\"function\":\"f\",\"key\":\"value\"}",
               "$.ops[0].key: a filter takes a plugin predicate or a comparison, not both");
    spec_fails("{\"op\":\"filter\",\"plugin\":\"x.so\"}", "$.ops[0].function: required field missing");
    spec_fails("{\"op\":\"filter\"}", "$.ops[0].key: required field missing (or give plugin and function)");
    spec_fails("{\"op\":\"filter\",\"key\":\"value\",\"cmp\":\"eq\",\"value\":1,\"num_parallel_calls\":0}",
               "$.ops[0].num_parallel_calls: must be an integer from 1 to 256 or \"autotune\", got 0");
    spec_fails("{\"op\":\"cast\",\"key\":\"value\",\"dtype\":\"float32\",\"num_parallel_calls\":\"fast\"}",
               "$.ops[0].num_parallel_calls: must be an integer from 1 to 256 or \"autotune\", got \"fast\"");
    spec_fails("{\"op\":\"cast\",\"key\":\"value\",\"dtype\":\"float32\",\"deterministic\":1}",
               "$.ops[0].deterministic: must be true or false");
    spec_fails("{\"op\":\"batch\",\"batch_size\":2,\"num_parallel_calls\":2}",
               "$.ops[0].num_parallel_calls: unknown field");
}

Test(plugin, canonical_forms)
{
    const char *json = "{\"source\":{\"type\":\"range\",\"stop\":4},\"ops\":["
                       "{\"op\":\"filter\",\"key\":\"value\",\"cmp\":\"in\",\"value\":[1,2.5]},"
                       "{\"op\":\"map\",\"plugin\":\"a.so\",\"function\":\"f\",\"output\":{\"y\":\"bytes\",\"x\":\"int64\"},"
                       "\"num_parallel_calls\":\"autotune\",\"deterministic\":false},"
                       "{\"op\":\"cast\",\"key\":\"x\",\"dtype\":\"float32\"}]}";
    sl_spec_t *spec = NULL;
    char err[512];
    cr_assert_eq(sl_spec_parse(json, strlen(json), &spec, err, sizeof err), 0, "%s", err);
    const char *want = "{\"ops\":[{\"cmp\":\"in\",\"key\":\"value\",\"op\":\"filter\",\"value\":[1,2.5]},"
                       "{\"deterministic\":false,\"function\":\"f\",\"keep_input\":true,\"num_parallel_calls\":"
                       "\"autotune\",\"op\":\"map\",\"output\":{\"x\":\"int64\",\"y\":\"bytes\"},\"plugin\":\"a.so\"},"
                       "{\"dtype\":\"float32\",\"key\":\"x\",\"op\":\"cast\"}],"
                       "\"source\":{\"name\":\"value\",\"start\":0,\"step\":1,\"stop\":4,\"type\":\"range\"}}";
    cr_assert_str_eq(sl_spec_canonical(spec), want);
    const char *again = sl_spec_canonical(spec);
    sl_spec_t *spec2 = NULL;
    cr_assert_eq(sl_spec_parse(again, strlen(again), &spec2, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(sl_spec_canonical(spec2), want);
    sl_spec_free(spec2);
    sl_spec_free(spec);
}
