/*
 * test_element_spec.c: the element spec derived from a spec
 * (spec/element_spec.c) and its wire form (protocol/elemspec.c). The
 * Python tests compare it with the batches real workers send.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "elemspec.h"
#include "spec.h"

/* The element spec of json as "name:dtype[d0,d1]" items joined by " ", a
 * dimension -1 as "?", an unknown rank as "[*]", ragged as "~"; "unknown"
 * when not known. */
static const char *describe(const char *json)
{
    static char out[2048];
    sl_spec_t *spec = NULL;
    char err[256] = "";
    int rc = sl_spec_parse(json, strlen(json), &spec, err, sizeof err);
    cr_assert_eq(rc, 0, "%s: %s", json, err);
    sl_elemspec_t es;
    int erc = sl_spec_element_spec(spec, &es);
    sl_spec_free(spec);
    cr_assert_eq(erc == 0, es.known == 1);
    /* The wire form gives the same back. */
    sluice_ElementSpec w;
    sl_elemspec_to_wire(&es, &w);
    sl_elemspec_t back;
    cr_assert_eq(sl_elemspec_from_wire(&w, &back, err, sizeof err), 0, "%s", err);
    cr_assert_eq(memcmp(&back, &es, sizeof es), 0, "%s: the wire form differs", json);
    if (!es.known)
        return "unknown";
    size_t n = 0;
    out[0] = '\0';
    for (int i = 0; i < es.num_components; i++) {
        const sl_component_spec_t *c = &es.components[i];
        n += (size_t)snprintf(out + n, sizeof out - n, "%s%s:%s%s", i ? " " : "", c->name, sl_dtype_name(c->dtype),
                              c->ragged ? "~" : "");
        if (c->rank < 0) {
            n += (size_t)snprintf(out + n, sizeof out - n, "[*]");
            continue;
        }
        n += (size_t)snprintf(out + n, sizeof out - n, "[");
        for (int d = 0; d < c->rank; d++) {
            if (c->shape[d] < 0)
                n += (size_t)snprintf(out + n, sizeof out - n, "%s?", d ? "," : "");
            else
                n += (size_t)snprintf(out + n, sizeof out - n, "%s%lld", d ? "," : "", (long long)c->shape[d]);
        }
        n += (size_t)snprintf(out + n, sizeof out - n, "]");
    }
    return out;
}

#define EXPECT(json, want) cr_assert_str_eq(describe(json), want, "%s", json)

Test(element_spec, sources)
{
    EXPECT("{\"source\":{\"type\":\"range\",\"stop\":10}}", "value:int64[]");
    EXPECT("{\"source\":{\"type\":\"range\",\"stop\":10,\"name\":\"id\"}}", "id:int64[]");
    EXPECT("{\"source\":{\"type\":\"tfrecord\",\"files\":[\"/d/a\"]}}", "record:bytes[]");
    EXPECT("{\"source\":{\"type\":\"text_lines\",\"files\":[\"/d/a\"]}}", "line:bytes[]");
    EXPECT("{\"source\":{\"type\":\"fixed_length_records\",\"files\":[\"/d/a\"],\"record_bytes\":4}}",
           "record:bytes[]");
}

Test(element_spec, batch)
{
    EXPECT("{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[{\"op\":\"batch\",\"batch_size\":4}]}",
           "value:int64[?]");
    EXPECT("{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[{\"op\":\"shuffle\",\"buffer_size\":4},"
           "{\"op\":\"batch\",\"batch_size\":4,\"drop_remainder\":true},{\"op\":\"batch\",\"batch_size\":2},"
           "{\"op\":\"take\",\"count\":3}]}",
           "value:int64[?,4]");
}

Test(element_spec, parse_example)
{
    const char *pe = "{\"source\":{\"type\":\"tfrecord\",\"files\":[\"/d/a\"]},\"ops\":[{\"op\":\"parse_example\","
                     "\"features\":{\"label\":{\"dtype\":\"int64\"},\"x\":{\"dtype\":\"float32\",\"shape\":[2,3]},"
                     "\"tokens\":{\"dtype\":\"int64\",\"varlen\":true}}}%s]}";
    char json[1024];
    snprintf(json, sizeof json, pe, "");
    EXPECT(json, "label:int64[] tokens:int64[?] x:float32[2,3]");
    snprintf(json, sizeof json, pe, ",{\"op\":\"batch\",\"batch_size\":8,\"drop_remainder\":true}");
    EXPECT(json, "label:int64[8] tokens:int64~[8,?] x:float32[8,2,3]");
    snprintf(json, sizeof json, pe, ",{\"op\":\"padded_batch\",\"batch_size\":8,\"padded_shapes\":{\"tokens\":[5]}}");
    EXPECT(json, "label:int64[?] tokens:int64[?,5] x:float32[?,2,3]");
    snprintf(json, sizeof json, pe, ",{\"op\":\"cast\",\"key\":\"x\",\"dtype\":\"float16\"}");
    EXPECT(json, "label:int64[] tokens:int64[?] x:float16[2,3]");
    /* A batch of a ragged batch fails the pipeline: not known. */
    snprintf(json, sizeof json, pe, ",{\"op\":\"batch\",\"batch_size\":8},{\"op\":\"batch\",\"batch_size\":2}");
    EXPECT(json, "unknown");
}

Test(element_spec, images)
{
    const char *img = "{\"source\":{\"type\":\"tfrecord\",\"files\":[\"/d/a\"]},\"ops\":[{\"op\":\"decode_jpeg\","
                      "\"key\":\"record\"%s}%s]}";
    char json[1024];
    snprintf(json, sizeof json, img, "", "");
    EXPECT(json, "record:uint8[?,?,3]");
    snprintf(json, sizeof json, img, ",\"channels\":0", "");
    EXPECT(json, "record:uint8[?,?,?]");
    snprintf(json, sizeof json, img, "",
             ",{\"op\":\"random_crop\",\"key\":\"record\",\"size\":[40,50]},{\"op\":\"random_flip\",\"key\":\"record\"}"
             ",{\"op\":\"resize\",\"key\":\"record\",\"size\":[32,32],\"dtype\":\"uint8\"},{\"op\":\"normalize\","
             "\"key\":\"record\",\"mean\":[0.5,0.5,0.5],\"std\":[0.2,0.2,0.2]},{\"op\":\"batch\",\"batch_size\":4}");
    EXPECT(json, "record:float32[?,32,32,3]");
    snprintf(json, sizeof json, img, "", ",{\"op\":\"center_crop\",\"key\":\"record\",\"size\":[7,9]}");
    EXPECT(json, "record:uint8[7,9,3]");
    snprintf(json, sizeof json, img, "",
             ",{\"op\":\"resize\",\"key\":\"record\",\"shorter_side\":256},{\"op\":\"center_crop\","
             "\"key\":\"record\",\"size\":[224,224]}");
    EXPECT(json, "record:float32[224,224,3]");
    snprintf(json, sizeof json, img, "", ",{\"op\":\"resize\",\"key\":\"record\",\"shorter_side\":256}");
    EXPECT(json, "record:float32[?,?,3]");
    snprintf(json, sizeof json, img, "", ",{\"op\":\"random_resized_crop\",\"key\":\"record\",\"size\":[24,32]}");
    EXPECT(json, "record:float32[24,32,3]");
    snprintf(json, sizeof json, img, ",\"channels\":1",
             ",{\"op\":\"random_resized_crop\",\"key\":\"record\",\"size\":[5,6],\"dtype\":\"uint8\"}");
    EXPECT(json, "record:uint8[5,6,1]");
    snprintf(json, sizeof json, img, "", ",{\"op\":\"color_jitter\",\"key\":\"record\",\"hue\":[0,0.1]}");
    EXPECT(json, "record:uint8[?,?,3]");
    snprintf(json, sizeof json, img, "", ",{\"op\":\"random_grayscale\",\"key\":\"record\",\"p\":0.2}");
    EXPECT(json, "record:uint8[?,?,3]");
    snprintf(json, sizeof json, img, ",\"channels\":1",
             ",{\"op\":\"random_solarize\",\"key\":\"record\",\"threshold\":128}");
    EXPECT(json, "record:uint8[?,?,1]");
    snprintf(json, sizeof json, img, "",
             ",{\"op\":\"resize\",\"key\":\"record\",\"size\":[8,8]},{\"op\":\"random_solarize\","
             "\"key\":\"record\",\"threshold\":128}");
    EXPECT(json, "unknown");
    snprintf(json, sizeof json, img, "",
             ",{\"op\":\"gaussian_blur\",\"key\":\"record\",\"kernel_size\":[3,3]},{\"op\":\"center_crop\","
             "\"key\":\"record\",\"size\":[8,8]}");
    EXPECT(json, "record:uint8[8,8,3]");
    /* resize and random_resized_crop take uint8 images, not float32 ones. */
    snprintf(json, sizeof json, img, "",
             ",{\"op\":\"resize\",\"key\":\"record\",\"size\":[8,8]},{\"op\":\"random_resized_crop\","
             "\"key\":\"record\",\"size\":[4,4]}");
    EXPECT(json, "unknown");
    /* resize takes uint8 images, not float32 ones. */
    snprintf(json, sizeof json, img, "",
             ",{\"op\":\"resize\",\"key\":\"record\",\"size\":[8,8]},{\"op\":\"resize\",\"key\":\"record\","
             "\"size\":[4,4]}");
    EXPECT(json, "unknown");
}

Test(element_spec, unknown_when_the_pipeline_would_fail)
{
    /* A key that names no component. */
    EXPECT("{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[{\"op\":\"cast\",\"key\":\"x\",\"dtype\":\"int8\"}]}",
           "unknown");
    /* decode_jpeg of an int64. */
    EXPECT("{\"source\":{\"type\":\"range\",\"stop\":10},\"ops\":[{\"op\":\"decode_jpeg\",\"key\":\"value\"}]}",
           "unknown");
    /* filter on a bytes component. */
    EXPECT("{\"source\":{\"type\":\"text_lines\",\"files\":[\"/d/a\"]},\"ops\":[{\"op\":\"filter\",\"key\":\"line\","
           "\"cmp\":\"eq\",\"value\":1}]}",
           "unknown");
}

Test(element_spec, plugin_map)
{
    /* The outputs' dtypes are declared, their shapes are the function's. */
    EXPECT("{\"source\":{\"type\":\"range\",\"stop\":10,\"name\":\"id\"},\"ops\":[{\"op\":\"map\",\"plugin\":\"p.so\","
           "\"function\":\"f\",\"output\":{\"z\":\"float32\",\"a\":\"bytes\"}},{\"op\":\"batch\",\"batch_size\":2}]}",
           "id:int64[?] a:bytes[*] z:float32[*]");
    EXPECT("{\"source\":{\"type\":\"range\",\"stop\":10,\"name\":\"id\"},\"ops\":[{\"op\":\"map\",\"plugin\":\"p.so\","
           "\"function\":\"f\",\"output\":{\"id\":\"float32\"},\"keep_input\":false}]}",
           "id:float32[*]");
}

Test(element_spec, wire_refusals)
{
    sluice_ElementSpec w = sluice_ElementSpec_init_zero;
    sl_elemspec_t es;
    char err[256];
    w.known = true;
    w.components_count = 2;
    snprintf(w.components[0].name, sizeof w.components[0].name, "a");
    w.components[0].dtype = SL_DTYPE_INT64;
    w.components[1] = w.components[0];
    cr_assert_eq(sl_elemspec_from_wire(&w, &es, err, sizeof err), SL_EPROTO);
    cr_assert(strstr(err, "twice"), "%s", err);
    cr_assert_eq(es.known, 0);
    w.components_count = 1;
    w.components[0].rank = 2;
    w.components[0].shape_count = 1;
    cr_assert_eq(sl_elemspec_from_wire(&w, &es, err, sizeof err), SL_EPROTO);
    w.components[0].shape_count = 2;
    w.components[0].shape[1] = -2;
    cr_assert_eq(sl_elemspec_from_wire(&w, &es, err, sizeof err), SL_EPROTO);
    w.components[0].shape[1] = -1;
    w.components[0].dtype = SL_DTYPE_COUNT_;
    cr_assert_eq(sl_elemspec_from_wire(&w, &es, err, sizeof err), SL_EPROTO);
    w.components[0].dtype = SL_DTYPE_BOOL;
    cr_assert_eq(sl_elemspec_from_wire(&w, &es, err, sizeof err), 0, "%s", err);
    cr_assert_eq(es.known, 1);
    cr_assert_eq(es.components[0].shape[1], -1);
}
