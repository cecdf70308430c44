/*
 * test_ops_image.c: the image ops and cast (pipeline/ops_image.c) in
 * pipelines over the JPEG fixtures of tests/data/tfrecord: decoded means
 * against PIL's (MANIFEST.json), crops and flips against the decoded
 * pixels, seeded randomness, resize, normalize, cast, and the refusals.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena_util.h"
#include "image.h"
#include "iter.h"
#include "pipeline_util.h"

static sl_confine_t *roots;

static void setup(void)
{
    roots = roots_at(FIXTURES);
}

static void teardown(void)
{
    sl_confine_destroy(roots);
}

TestSuite(image_ops, .init = setup, .fini = teardown);

#define IMAGES_SRC "{\"type\":\"tfrecord\",\"files\":\"" FIXTURES "/images-*.tfrecord\"}"
#define PARSE                                                                                                        \
    "{\"op\":\"parse_example\",\"features\":{\"id\":{\"dtype\":\"int64\"},\"image/encoded\":{\"dtype\":\"bytes\"}," \
    "\"label\":{\"dtype\":\"int64\"}},\"key\":\"record\"}"
#define PARSE_AS_IMAGE                                                                                               \
    "{\"op\":\"parse_example\",\"features\":{\"id\":{\"dtype\":\"int64\"},\"image/encoded\":{\"dtype\":\"bytes\"}}}"
#define DECODE "{\"op\":\"decode_jpeg\",\"key\":\"image/encoded\"}"

/* Runs the image pipeline with ops after decoding, one image per batch. */
static batches_t run_images(const char *ops)
{
    sl_pipeline_opts_t o = {.roots = roots};
    return run_spec(specf("{\"source\":" IMAGES_SRC ",\"ops\":[" PARSE_AS_IMAGE "," DECODE "%s%s]}", *ops ? "," : "",
                          ops),
                    &o);
}

static const sl_component_t *image_of(const sl_wire_batch_t *b, int64_t *h, int64_t *w)
{
    const sl_component_t *c = comp_of(b, "image/encoded");
    cr_assert_eq(c->rank, 3);
    cr_assert_eq(c->shape[2], 3);
    *h = c->shape[0];
    *w = c->shape[1];
    return c;
}

Test(image_ops, decoded_means_match_pil)
{
    json_t *m = manifest_load();
    batches_t bs = run_images("");
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    cr_assert_eq(bs.n, 32);
    for (size_t k = 0; k < bs.n; k++) {
        const sl_wire_batch_t *b = bs.b[k];
        int64_t id = i64_at(b, comp_of(b, "id"), 0), h, w;
        cr_assert_eq(id, (int64_t)k);
        json_t *im = json_array_get(json_object_get(manifest_file(m, k < 16 ? "images-00000-of-00002.tfrecord"
                                                                             : "images-00001-of-00002.tfrecord"),
                                                    "images"),
                                    k % 16);
        const sl_component_t *c = image_of(b, &h, &w);
        cr_assert_eq(c->dtype, SL_DTYPE_UINT8);
        cr_assert_eq(h, json_integer_value(json_object_get(im, "height")));
        cr_assert_eq(w, json_integer_value(json_object_get(im, "width")));
        const uint8_t *px = b->data + c->offset;
        double sum[3] = {0, 0, 0};
        for (int64_t i = 0; i < h * w; i++)
            for (int ch = 0; ch < 3; ch++)
                sum[ch] += px[3 * i + ch];
        for (int ch = 0; ch < 3; ch++) {
            double mean = sum[ch] / (double)(h * w);
            double want = json_number_value(json_array_get(json_object_get(im, "mean_rgb_pil"), (size_t)ch));
            cr_assert(fabs(mean - want) <= 1.0, "image %zu channel %d: mean %.3f, PIL %.3f", k, ch, mean, want);
        }
    }
    batches_free(&bs);
    json_decref(m);
}

Test(image_ops, grayscale_decode)
{
    batches_t bs = run_images("{\"op\":\"take\",\"count\":1}");
    sl_pipeline_opts_t o = {.roots = roots};
    batches_t gs = run_spec("{\"source\":" IMAGES_SRC ",\"ops\":[" PARSE_AS_IMAGE ",{\"op\":\"decode_jpeg\","
                            "\"key\":\"image/encoded\",\"channels\":1},{\"op\":\"take\",\"count\":1}]}",
                            &o);
    cr_assert_eq(gs.rc, 1, "%s", gs.errmsg);
    const sl_component_t *c = comp_of(gs.b[0], "image/encoded"), *rgb = comp_of(bs.b[0], "image/encoded");
    cr_assert_eq(c->rank, 3);
    cr_assert_eq(c->shape[2], 1);
    cr_assert(c->shape[0] == rgb->shape[0] && c->shape[1] == rgb->shape[1]);
    batches_free(&gs);
    batches_free(&bs);
}

/* The decoded images, for comparing what later ops make of them. */
static batches_t decoded(void)
{
    batches_t bs = run_images("");
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    cr_assert_eq(bs.n, 32);
    return bs;
}

Test(image_ops, center_crop_is_the_middle)
{
    batches_t src = decoded();
    batches_t bs = run_images("{\"op\":\"center_crop\",\"key\":\"image/encoded\",\"size\":[30,36]}");
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    for (size_t k = 0; k < bs.n; k++) {
        int64_t h, w, sh, sw;
        const sl_component_t *c = image_of(bs.b[k], &h, &w), *s = image_of(src.b[k], &sh, &sw);
        cr_assert(h == 30 && w == 36);
        int64_t y = (sh - 30) / 2, x = (sw - 36) / 2;
        const uint8_t *a = bs.b[k]->data + c->offset, *b = src.b[k]->data + s->offset;
        for (int64_t r = 0; r < 30; r++)
            cr_assert_eq(memcmp(a + r * 36 * 3, b + ((y + r) * sw + x) * 3, 36 * 3), 0, "image %zu row %" PRId64, k, r);
    }
    batches_free(&bs);
    batches_free(&src);
}

/* Whether the h x w image a is a window of the image b (bh x bw). */
static bool is_window(const uint8_t *a, int64_t h, int64_t w, const uint8_t *b, int64_t bh, int64_t bw)
{
    for (int64_t y = 0; y + h <= bh; y++) {
        for (int64_t x = 0; x + w <= bw; x++) {
            bool same = true;
            for (int64_t r = 0; r < h && same; r++)
                same = memcmp(a + r * w * 3, b + ((y + r) * bw + x) * 3, (size_t)w * 3) == 0;
            if (same)
                return true;
        }
    }
    return false;
}

Test(image_ops, random_crop_is_a_window_and_seeded)
{
    batches_t src = decoded();
    const char *ops = "{\"op\":\"random_crop\",\"key\":\"image/encoded\",\"size\":[38,40],\"seed\":11}";
    batches_t a = run_images(ops), b = run_images(ops);
    cr_assert_eq(a.rc, 1, "%s", a.errmsg);
    for (size_t k = 0; k < a.n; k++) {
        int64_t h, w, sh, sw;
        const sl_component_t *c = image_of(a.b[k], &h, &w), *s = image_of(src.b[k], &sh, &sw);
        cr_assert(h == 38 && w == 40);
        cr_assert(is_window(a.b[k]->data + c->offset, h, w, src.b[k]->data + s->offset, sh, sw), "image %zu", k);
        cr_assert_eq(memcmp(a.b[k]->data, b.b[k]->data, a.b[k]->size), 0, "same seed, same crop");
    }
    batches_free(&a);
    batches_free(&b);

    /* The smallest image is 38 high: a crop of 39 fails, naming it. */
    a = run_images("{\"op\":\"random_crop\",\"key\":\"image/encoded\",\"size\":[39,40]}");
    cr_assert_eq(a.rc, SL_EDATA);
    cr_assert(strstr(a.errmsg, "ops[2] (random_crop): component \"image/encoded\" has shape [38, 56, 3], smaller than "
                               "the crop [39, 40]") == a.errmsg,
              "%s", a.errmsg);
    batches_free(&a);
    batches_free(&src);
}

/* random_resized_crop gives, for image k of the first epoch, the window
 * its own generator (seed, epoch 0, ordinal k) draws, resized: the kernels
 * applied by hand to the decoded image, to the bit, float32 and uint8; and
 * the windows vary in size. The output, 48 x 40, is more than half of every
 * window (the fixtures have 95 rows at most), so no decode is scaled
 * (random_resized_crop_decodes_at_a_dct_scale, below, for that). */
Test(image_ops, random_resized_crop_is_a_window_resized)
{
    batches_t src = decoded();
    const double scale[2] = {0.3, 0.9}, ratio[2] = {0.5, 2.0};
    const char *ops[] = {"{\"op\":\"random_resized_crop\",\"key\":\"image/encoded\",\"size\":[48,40],\"seed\":13,"
                         "\"scale\":[0.3,0.9],\"ratio\":[0.5,2]}",
                         "{\"op\":\"random_resized_crop\",\"key\":\"image/encoded\",\"size\":[48,40],\"seed\":13,"
                         "\"scale\":[0.3,0.9],\"ratio\":[0.5,2],\"dtype\":\"uint8\"}"};
    /* The third run: decode_jpeg and the crop both in a parallel stage of 2
     * threads, still fused, each thread with its own decoder. */
    sl_pipeline_opts_t po = {.roots = roots, .threads = 2};
    for (int run = 0; run < 3; run++) {
        int u8 = run == 1;
        batches_t a = run < 2 ? run_images(ops[u8])
                              : run_spec(specf("{\"source\":" IMAGES_SRC ",\"ops\":[" PARSE_AS_IMAGE ","
                                               "{\"op\":\"decode_jpeg\",\"key\":\"image/encoded\","
                                               "\"num_parallel_calls\":2},{\"op\":\"random_resized_crop\","
                                               "\"key\":\"image/encoded\",\"size\":[48,40],\"seed\":13,"
                                               "\"scale\":[0.3,0.9],\"ratio\":[0.5,2],\"num_parallel_calls\":2}]}"),
                                         &po);
        cr_assert_eq(a.rc, 1, "%s", a.errmsg);
        cr_assert_eq(a.n, src.n);
        size_t smallest = SIZE_MAX, largest = 0;
        for (size_t k = 0; k < a.n; k++) {
            int64_t h, w, sh, sw;
            const sl_component_t *c = image_of(a.b[k], &h, &w), *s = image_of(src.b[k], &sh, &sw);
            cr_assert(h == 48 && w == 40);
            cr_assert_eq(c->dtype, u8 ? SL_DTYPE_UINT8 : SL_DTYPE_FLOAT32);
            sl_image_shape_t in = {(size_t)sh, (size_t)sw, 3};
            sl_rng_t rng;
            sl_rng_seed(&rng, sl__element_seed(13, 0, k));
            size_t y, x, wh, ww;
            char err[256];
            cr_assert_eq(sl_image_random_resized_crop_window(&rng, in, scale, ratio, &y, &x, &wh, &ww, err, sizeof err),
                         0, "%s", err);
            smallest = wh * ww < smallest ? wh * ww : smallest;
            largest = wh * ww > largest ? wh * ww : largest;
            uint8_t *win = malloc(wh * ww * 3);
            size_t bytes = 48 * 40 * 3 * (u8 ? 1 : sizeof(float));
            uint8_t *want = malloc(bytes);
            cr_assert(win && want);
            cr_assert_eq(sl_image_crop(src.b[k]->data + s->offset, in, y, x, wh, ww, win, err, sizeof err), 0);
            sl_image_shape_t ws = {wh, ww, 3};
            int rc = u8 ? sl_image_resize_u8(win, ws, 48, 40, want, err, sizeof err)
                        : sl_image_resize_f32(win, ws, 48, 40, (float *)want, err, sizeof err);
            cr_assert_eq(rc, 0, "%s", err);
            cr_assert_eq(memcmp(a.b[k]->data + c->offset, want, bytes), 0, "image %zu (%s)", k,
                         u8 ? "uint8" : "float32");
            free(win);
            free(want);
        }
        cr_assert_lt(smallest * 2, largest, "windows from %zu to %zu pixels", smallest, largest);
        batches_free(&a);
    }
    batches_free(&src);

    /* It takes uint8 images only: after a float32 resize it is refused. */
    sl_pipeline_opts_t o = {.roots = roots};
    sl_pipeline_t *p;
    char err[1024];
    int rc = pipeline_try("{\"source\":" IMAGES_SRC ",\"ops\":[" PARSE "," DECODE ",{\"op\":\"resize\",\"key\":"
                          "\"image/encoded\",\"size\":[30,30]},{\"op\":\"random_resized_crop\","
                          "\"key\":\"image/encoded\",\"size\":[4,4]}]}",
                          &o, &p, err, sizeof err);
    cr_assert_eq(rc, SL_EINVAL);
    cr_assert_str_eq(err, "ops[3] (random_resized_crop): component \"image/encoded\" is float32; random_resized_crop "
                          "takes uint8 images (decode_jpeg makes them)");
}

/* resize with shorter_side: torchvision's Resize(int), the shorter side to
 * that length and the longer in proportion, rounded down; the pixels those
 * of resize to that size. Decoded at a reduced DCT scale when fused (the
 * size from the whole image's header), close to the unfused result. And an
 * output over the per-image limit fails, naming it. */
Test(image_ops, resize_shorter_side_keeps_the_aspect_ratio)
{
    batches_t src = decoded();
    /* Apart from decode_jpeg (a cast between): resized from the decoded pixels. */
    batches_t a = run_images("{\"op\":\"cast\",\"key\":\"image/encoded\",\"dtype\":\"uint8\"},"
                             "{\"op\":\"resize\",\"key\":\"image/encoded\",\"shorter_side\":30,\"dtype\":\"uint8\"}");
    cr_assert_eq(a.rc, 1, "%s", a.errmsg);
    cr_assert_eq(a.n, src.n);
    int portrait = 0, landscape = 0;
    for (size_t k = 0; k < a.n; k++) {
        int64_t h, w, sh, sw;
        const sl_component_t *c = image_of(a.b[k], &h, &w), *s = image_of(src.b[k], &sh, &sw);
        int64_t want_h = sw <= sh ? (int64_t)(30.0 * (double)sh / (double)sw) : 30;
        int64_t want_w = sw <= sh ? 30 : (int64_t)(30.0 * (double)sw / (double)sh);
        cr_assert(h == want_h && w == want_w, "image %zu: %" PRId64 " x %" PRId64 " -> %" PRId64 " x %" PRId64, k, sh,
                  sw, h, w);
        portrait += sw < sh;
        landscape += sw > sh;
        uint8_t *want = malloc((size_t)(h * w * 3));
        char err[256];
        cr_assert_eq(sl_image_resize_u8(src.b[k]->data + s->offset, (sl_image_shape_t){(size_t)sh, (size_t)sw, 3},
                                        (size_t)h, (size_t)w, want, err, sizeof err),
                     0, "%s", err);
        cr_assert_eq(memcmp(a.b[k]->data + c->offset, want, (size_t)(h * w * 3)), 0, "image %zu", k);
        free(want);
    }
    cr_assert(landscape > 0, "the fixtures have landscape images (%d portrait)", portrait);
    batches_free(&a);

    /* Portrait and square: crops of 36 x 30 and 30 x 30. */
    const char *shapes[] = {"[36,30]", "[30,30]"};
    const int64_t want[][2] = {{24, 20}, {20, 20}}; /* int(20 * 36 / 30) = 24 */
    for (int i = 0; i < 2; i++) {
        char ops[256];
        snprintf(ops, sizeof ops,
                 "{\"op\":\"center_crop\",\"key\":\"image/encoded\",\"size\":%s},"
                 "{\"op\":\"resize\",\"key\":\"image/encoded\",\"shorter_side\":20}",
                 shapes[i]);
        batches_t t = run_images(ops);
        cr_assert_eq(t.rc, 1, "%s", t.errmsg);
        for (size_t k = 0; k < t.n; k++) {
            int64_t h, w;
            image_of(t.b[k], &h, &w);
            cr_assert(h == want[i][0] && w == want[i][1], "%s: %" PRId64 " x %" PRId64, shapes[i], h, w);
        }
        batches_free(&t);
    }

    /* Fused with decode_jpeg, at 12 (at most half of each side here: a DCT
     * scale of 1/2 or less): the same sizes, pixels within DCT scaling's
     * documented tolerance of the unfused ones. */
    batches_t fused =
        run_images("{\"op\":\"resize\",\"key\":\"image/encoded\",\"shorter_side\":12,\"dtype\":\"uint8\"}");
    batches_t apart = run_images("{\"op\":\"cast\",\"key\":\"image/encoded\",\"dtype\":\"uint8\"},"
                                 "{\"op\":\"resize\",\"key\":\"image/encoded\",\"shorter_side\":12,"
                                 "\"dtype\":\"uint8\"}");
    cr_assert_eq(fused.rc, 1, "%s", fused.errmsg);
    cr_assert_eq(apart.rc, 1, "%s", apart.errmsg);
    int differ = 0;
    for (size_t k = 0; k < fused.n; k++) {
        int64_t h, w, ah, aw;
        const sl_component_t *c = image_of(fused.b[k], &h, &w), *d = image_of(apart.b[k], &ah, &aw);
        cr_assert(h == ah && w == aw, "image %zu: %" PRId64 " x %" PRId64 " fused, %" PRId64 " x %" PRId64, k, h, w,
                  ah, aw);
        const uint8_t *p = fused.b[k]->data + c->offset, *q = apart.b[k]->data + d->offset;
        double sum = 0;
        for (int64_t i = 0; i < h * w * 3; i++)
            sum += abs((int)p[i] - (int)q[i]);
        cr_assert_leq(sum / (double)(h * w * 3), 9.0, "image %zu", k);
        differ += memcmp(p, q, (size_t)(h * w * 3)) != 0;
    }
    cr_assert_gt(differ, 0, "the fused decode was scaled");
    batches_free(&fused);
    batches_free(&apart);
    batches_free(&src);

    /* 65536 on the shorter side of the first image, 51 x 81: far over the limit. */
    batches_t big = run_images("{\"op\":\"resize\",\"key\":\"image/encoded\",\"shorter_side\":65536}");
    cr_assert_eq(big.rc, SL_ETOOBIG);
    cr_assert(strstr(big.errmsg, "ops[2] (resize): component \"image/encoded\": a resize of 51 x 81 to 65536 x ") ==
                      big.errmsg &&
                  strstr(big.errmsg, "over the per-image limit"),
              "%s", big.errmsg);
    batches_free(&big);
    /* After a crop that it takes over, the crop's size is named. */
    big = run_images("{\"op\":\"center_crop\",\"key\":\"image/encoded\",\"size\":[30,36]},"
                     "{\"op\":\"resize\",\"key\":\"image/encoded\",\"shorter_side\":65536}");
    cr_assert_eq(big.rc, SL_ETOOBIG);
    cr_assert(strstr(big.errmsg, "ops[3] (resize): component \"image/encoded\": a resize of 30 x 36 to 65536 x ") ==
                  big.errmsg,
              "%s", big.errmsg);
    batches_free(&big);
}

/* Runs each of the n image op specs twice over the decoded images: every
 * image comes out either as it was or as kernel makes it, the same on both
 * runs. changed[i][k]: whether spec i changed image k; counts[i]: how many. */
typedef int (*image_kernel_fn)(uint8_t *img, sl_image_shape_t s, char *err, size_t errlen);

static void changed_by_chance(const char *const *ops, int n, image_kernel_fn kernel, bool changed[][64], int *counts)
{
    batches_t src = decoded();
    for (int i = 0; i < n; i++) {
        batches_t a = run_images(ops[i]), b = run_images(ops[i]);
        cr_assert_eq(a.rc, 1, "%s", a.errmsg);
        cr_assert_leq(a.n, 64);
        counts[i] = 0;
        for (size_t k = 0; k < a.n; k++) {
            int64_t h, w, sh, sw;
            const sl_component_t *c = image_of(a.b[k], &h, &w), *s = image_of(src.b[k], &sh, &sw);
            size_t bytes = (size_t)(h * w * 3);
            uint8_t *want = malloc(bytes);
            memcpy(want, src.b[k]->data + s->offset, bytes);
            char err[256];
            cr_assert_eq(kernel(want, (sl_image_shape_t){(size_t)h, (size_t)w, 3}, err, sizeof err), 0, "%s", err);
            const uint8_t *got = a.b[k]->data + c->offset;
            bool is_new = memcmp(got, want, bytes) == 0, is_src = memcmp(got, src.b[k]->data + s->offset, bytes) == 0;
            cr_assert(is_new || is_src, "%s: image %zu is neither itself nor the kernel's", ops[i], k);
            changed[i][k] = is_new && !is_src;
            counts[i] += changed[i][k];
            cr_assert_eq(memcmp(got, b.b[k]->data + c->offset, bytes), 0, "%s: image %zu differs between runs", ops[i],
                         k);
            free(want);
        }
        batches_free(&a);
        batches_free(&b);
    }
    batches_free(&src);
}

/* random_grayscale: p 1 turns every image to its grayscale (the kernel's),
 * p 0 none; p 0.5 with a seed some, the same ones on every run. */
Test(image_ops, random_grayscale_by_its_probability)
{
    const char *ops[] = {"{\"op\":\"random_grayscale\",\"key\":\"image/encoded\",\"p\":1}",
                         "{\"op\":\"random_grayscale\",\"key\":\"image/encoded\",\"p\":0}",
                         "{\"op\":\"random_grayscale\",\"key\":\"image/encoded\",\"p\":0.5,\"seed\":4}"};
    bool changed[3][64];
    int grayed[3];
    changed_by_chance(ops, 3, sl_image_grayscale, changed, grayed);
    cr_assert_eq(grayed[0], 32);
    cr_assert_eq(grayed[1], 0);
    cr_assert(grayed[2] > 4 && grayed[2] < 28, "p 0.5: %d of 32", grayed[2]);
}

static int solarize_100(uint8_t *img, sl_image_shape_t s, char *err, size_t errlen)
{
    return sl_image_solarize(img, s, 100, err, errlen);
}

/* random_solarize: p 1 solarizes every image (the kernel's), p 0 none; a
 * seeded p 0.5 some, the same ones on every run, and another seed others. */
Test(image_ops, random_solarize_by_its_probability)
{
    const char *ops[] = {"{\"op\":\"random_solarize\",\"key\":\"image/encoded\",\"threshold\":100,\"p\":1}",
                         "{\"op\":\"random_solarize\",\"key\":\"image/encoded\",\"threshold\":100,\"p\":0}",
                         "{\"op\":\"random_solarize\",\"key\":\"image/encoded\",\"threshold\":100,\"seed\":4}",
                         "{\"op\":\"random_solarize\",\"key\":\"image/encoded\",\"threshold\":100,\"seed\":5}"};
    bool changed[4][64] = {{false}};
    int counts[4];
    changed_by_chance(ops, 4, solarize_100, changed, counts);
    cr_assert_eq(counts[0], 32);
    cr_assert_eq(counts[1], 0);
    cr_assert(counts[2] > 4 && counts[2] < 28, "p 0.5: %d of 32", counts[2]);
    cr_assert(memcmp(changed[2], changed[3], sizeof changed[2]) != 0, "seeds 4 and 5 solarize the same images");
}

/* gaussian_blur in a pipeline: a seed repeats its sigmas, each epoch draws
 * anew, and an image too small for the kernel fails, naming the op. */
Test(image_ops, gaussian_blur_seeded_and_refused)
{
    const char *ops = "{\"op\":\"gaussian_blur\",\"key\":\"image/encoded\",\"kernel_size\":[9,9],\"sigma\":[0.5,3],"
                      "\"seed\":6}";
    batches_t a = run_images(ops), b = run_images(ops), src = decoded();
    cr_assert_eq(a.rc, 1, "%s", a.errmsg);
    int changed = 0;
    for (size_t k = 0; k < a.n; k++) {
        cr_assert_eq(memcmp(a.b[k]->data, b.b[k]->data, a.b[k]->size), 0, "image %zu differs between runs", k);
        changed += memcmp(a.b[k]->data, src.b[k]->data, a.b[k]->size) != 0;
    }
    cr_assert_eq(changed, (int)a.n);
    batches_free(&a);
    batches_free(&b);
    batches_free(&src);
    /* p: color_jitter and gaussian_blur apply to an image with probability
     * p (RandomApply): none at 0, some at 0.5 with a seed, the same ones on
     * every run. */
    const char *maybe[] = {"{\"op\":\"gaussian_blur\",\"key\":\"image/encoded\",\"kernel_size\":[5,5],\"sigma\":[2,2],"
                           "\"p\":%s,\"seed\":8}",
                           "{\"op\":\"color_jitter\",\"key\":\"image/encoded\",\"brightness\":[1.5,1.5],\"p\":%s,"
                           "\"seed\":8}"};
    src = decoded();
    for (int m = 0; m < 2; m++) {
        for (int half = 0; half < 2; half++) {
            char op[256];
            snprintf(op, sizeof op, maybe[m], half ? "0.5" : "0");
            batches_t x = run_images(op), y = run_images(op);
            cr_assert_eq(x.rc, 1, "%s", x.errmsg);
            int changed = 0;
            for (size_t k = 0; k < x.n; k++) {
                changed += memcmp(x.b[k]->data, src.b[k]->data, x.b[k]->size) != 0;
                cr_assert_eq(memcmp(x.b[k]->data, y.b[k]->data, x.b[k]->size), 0, "%s: image %zu", op, k);
            }
            if (half)
                cr_assert(changed > 4 && changed < 28, "%s: %d of 32 changed", op, changed);
            else
                cr_assert_eq(changed, 0, "%s", op);
            batches_free(&x);
            batches_free(&y);
        }
    }
    batches_free(&src);

    a = run_images("{\"op\":\"gaussian_blur\",\"key\":\"image/encoded\",\"kernel_size\":[77,3]}");
    cr_assert_eq(a.rc, SL_EDATA);
    cr_assert(strstr(a.errmsg, "ops[2] (gaussian_blur): component \"image/encoded\": an image of ") == a.errmsg &&
                  strstr(a.errmsg, "is too small for a kernel of 77 x 3"),
              "%s", a.errmsg);
    batches_free(&a);
}

Test(image_ops, random_flip_mirrors_some)
{
    batches_t src = decoded();
    const char *ops = "{\"op\":\"random_flip\",\"key\":\"image/encoded\",\"seed\":3}";
    batches_t a = run_images(ops);
    cr_assert_eq(a.rc, 1, "%s", a.errmsg);
    int flipped = 0;
    for (size_t k = 0; k < a.n; k++) {
        int64_t h, w, sh, sw;
        const sl_component_t *c = image_of(a.b[k], &h, &w), *s = image_of(src.b[k], &sh, &sw);
        const uint8_t *p = a.b[k]->data + c->offset, *q = src.b[k]->data + s->offset;
        if (memcmp(p, q, (size_t)(h * w * 3)) == 0)
            continue;
        for (int64_t y = 0; y < h; y++)
            for (int64_t x = 0; x < w; x++)
                cr_assert_eq(memcmp(p + (y * w + x) * 3, q + (y * w + (w - 1 - x)) * 3, 3), 0,
                             "image %zu is neither itself nor its mirror", k);
        flipped++;
    }
    cr_assert(flipped > 0 && flipped < 32, "%d of 32 flipped", flipped);

    /* Up-down. */
    batches_t ud = run_images("{\"op\":\"random_flip\",\"key\":\"image/encoded\",\"seed\":3,\"direction\":\"up_down\"}");
    cr_assert_eq(ud.rc, 1, "%s", ud.errmsg);
    for (size_t k = 0; k < ud.n; k++) {
        int64_t h, w, sh, sw;
        const sl_component_t *c = image_of(ud.b[k], &h, &w), *s = image_of(src.b[k], &sh, &sw);
        const uint8_t *p = ud.b[k]->data + c->offset, *q = src.b[k]->data + s->offset;
        if (memcmp(p, q, (size_t)(h * w * 3)) != 0)
            cr_assert_eq(memcmp(p, q + (h - 1) * w * 3, (size_t)w * 3), 0, "image %zu: first row is the last", k);
    }
    batches_free(&ud);
    batches_free(&a);
    batches_free(&src);
}

Test(image_ops, seeded_draws_differ_per_epoch)
{
    /* Two epochs of one pipeline with a seed: each epoch draws anew, and
     * the whole run is the same every time. */
    const char *ops = "{\"op\":\"random_crop\",\"key\":\"image/encoded\",\"size\":[20,20],\"seed\":5},"
                      "{\"op\":\"repeat\",\"count\":2}";
    sl_pipeline_opts_t o = {.roots = roots};
    const char *json = specf("{\"source\":" IMAGES_SRC ",\"ops\":[" PARSE_AS_IMAGE "," DECODE ",%s]}", ops);
    char spec[4096];
    snprintf(spec, sizeof spec, "%s", json);
    batches_t a = run_spec(spec, &o), b = run_spec(spec, &o);
    cr_assert_eq(a.rc, 1, "%s", a.errmsg);
    cr_assert_eq(a.n, 64);
    int same_across_epochs = 0;
    for (size_t k = 0; k < 64; k++) {
        cr_assert_eq(memcmp(a.b[k]->data, b.b[k]->data, a.b[k]->size), 0);
        if (k < 32)
            same_across_epochs += memcmp(a.b[k]->data, a.b[k + 32]->data, a.b[k]->size) == 0;
    }
    cr_assert_lt(same_across_epochs, 32);
    batches_free(&a);
    batches_free(&b);
}

Test(image_ops, resize_normalize_cast)
{
    batches_t src = decoded();
    batches_t f = run_images("{\"op\":\"resize\",\"key\":\"image/encoded\",\"size\":[32,24]}");
    batches_t u = run_images("{\"op\":\"resize\",\"key\":\"image/encoded\",\"size\":[32,24],\"dtype\":\"uint8\"}");
    cr_assert_eq(f.rc, 1, "%s", f.errmsg);
    cr_assert_eq(u.rc, 1, "%s", u.errmsg);
    for (size_t k = 0; k < f.n; k++) {
        const sl_component_t *fc = comp_of(f.b[k], "image/encoded"), *uc = comp_of(u.b[k], "image/encoded");
        cr_assert_eq(fc->dtype, SL_DTYPE_FLOAT32);
        cr_assert_eq(uc->dtype, SL_DTYPE_UINT8);
        cr_assert(fc->rank == 3 && fc->shape[0] == 32 && fc->shape[1] == 24 && fc->shape[2] == 3);
        for (uint64_t i = 0; i < 32 * 24 * 3; i++) {
            float v = f32_at(f.b[k], fc, i);
            cr_assert(v >= 0.0f && v <= 255.0f);
            cr_assert_eq(u.b[k]->data[uc->offset + i], (uint8_t)nearbyintf(v));
        }
    }
    batches_free(&f);
    batches_free(&u);

    /* normalize: (x / 255 - mean) / std per channel. */
    batches_t n = run_images("{\"op\":\"normalize\",\"key\":\"image/encoded\",\"mean\":[0.485,0.456,0.406],"
                             "\"std\":[0.229,0.224,0.225],\"scale\":true}");
    cr_assert_eq(n.rc, 1, "%s", n.errmsg);
    const float mean[3] = {0.485f, 0.456f, 0.406f}, sd[3] = {0.229f, 0.224f, 0.225f};
    for (size_t k = 0; k < n.n; k += 7) {
        const sl_component_t *c = comp_of(n.b[k], "image/encoded"), *s = comp_of(src.b[k], "image/encoded");
        cr_assert_eq(c->dtype, SL_DTYPE_FLOAT32);
        uint64_t count = count_of(n.b[k], c);
        for (uint64_t i = 0; i < count; i += 97) {
            float x = src.b[k]->data[s->offset + i];
            float want = (x / 255.0f - mean[i % 3]) / sd[i % 3];
            cr_assert_eq(f32_at(n.b[k], c, i), want, "image %zu value %" PRIu64, k, i);
        }
    }
    batches_free(&n);

    /* cast there and back. */
    batches_t c = run_images("{\"op\":\"cast\",\"key\":\"image/encoded\",\"dtype\":\"float32\"},"
                             "{\"op\":\"cast\",\"key\":\"image/encoded\",\"dtype\":\"int16\"},"
                             "{\"op\":\"cast\",\"key\":\"image/encoded\",\"dtype\":\"uint8\"}");
    cr_assert_eq(c.rc, 1, "%s", c.errmsg);
    for (size_t k = 0; k < c.n; k++) {
        const sl_component_t *a = comp_of(c.b[k], "image/encoded"), *s = comp_of(src.b[k], "image/encoded");
        cr_assert_eq(a->dtype, SL_DTYPE_UINT8);
        cr_assert_eq(a->length, s->length);
        cr_assert_eq(memcmp(c.b[k]->data + a->offset, src.b[k]->data + s->offset, a->length), 0);
    }
    batches_free(&c);
    batches_free(&src);
}

Test(image_ops, cast_saturates_and_rounds)
{
    sl_pipeline_opts_t o = {.roots = roots};
    batches_t bs = run_spec("{\"source\":{\"type\":\"range\",\"start\":-40000,\"stop\":40001,\"step\":20000},"
                            "\"ops\":[{\"op\":\"cast\",\"key\":\"value\",\"dtype\":\"int16\"},"
                            "{\"op\":\"batch\",\"batch_size\":5}]}",
                            &o);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    const sl_component_t *c = comp_of(bs.b[0], "value");
    cr_assert_eq(c->dtype, SL_DTYPE_INT16);
    int16_t v[5];
    memcpy(v, bs.b[0]->data + c->offset, sizeof v);
    cr_assert(v[0] == INT16_MIN && v[1] == -20000 && v[2] == 0 && v[3] == 20000 && v[4] == INT16_MAX);
    batches_free(&bs);

    bs = run_spec("{\"source\":{\"type\":\"range\",\"start\":-3,\"stop\":4},"
                  "\"ops\":[{\"op\":\"cast\",\"key\":\"value\",\"dtype\":\"float64\"},"
                  "{\"op\":\"cast\",\"key\":\"value\",\"dtype\":\"bool\"},{\"op\":\"batch\",\"batch_size\":7}]}",
                  &o);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    c = comp_of(bs.b[0], "value");
    cr_assert_eq(c->dtype, SL_DTYPE_BOOL);
    const uint8_t want[7] = {1, 1, 1, 0, 1, 1, 1};
    cr_assert_eq(memcmp(bs.b[0]->data + c->offset, want, 7), 0);
    batches_free(&bs);
}

Test(image_ops, the_end_to_end_spec)
{
    /* parse, decode, random crop, flip, resize to 32x32, normalize, batch. */
    sl_pipeline_opts_t o = {.roots = roots};
    batches_t bs = run_spec("{\"source\":" IMAGES_SRC ",\"ops\":[" PARSE ","
                            "{\"op\":\"decode_jpeg\",\"key\":\"image/encoded\",\"channels\":3},"
                            "{\"op\":\"random_crop\",\"key\":\"image/encoded\",\"size\":[36,36]},"
                            "{\"op\":\"random_flip\",\"key\":\"image/encoded\"},"
                            "{\"op\":\"resize\",\"key\":\"image/encoded\",\"size\":[32,32]},"
                            "{\"op\":\"normalize\",\"key\":\"image/encoded\",\"mean\":[127.5,127.5,127.5],\"std\":[127.5,127.5,127.5]},"
                            "{\"op\":\"batch\",\"batch_size\":5}]}",
                            &o);
    cr_assert_eq(bs.rc, 1, "%s", bs.errmsg);
    cr_assert_eq(bs.n, 7);
    size_t n;
    int64_t *ids = all_i64(&bs, "id", &n);
    cr_assert_eq(n, 32);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(ids[i], (int64_t)i);
    for (size_t k = 0; k < bs.n; k++) {
        const sl_component_t *c = comp_of(bs.b[k], "image/encoded");
        cr_assert_eq(c->dtype, SL_DTYPE_FLOAT32);
        cr_assert(c->rank == 4 && c->shape[0] == (k < 6 ? 5 : 2) && c->shape[1] == 32 && c->shape[2] == 32 &&
                  c->shape[3] == 3);
        for (uint64_t i = 0; i < count_of(bs.b[k], c); i++) {
            float v = f32_at(bs.b[k], c, i);
            cr_assert(v >= -1.0f && v <= 1.0f);
        }
        cr_assert_eq(comp_of(bs.b[k], "label")->dtype, SL_DTYPE_INT64);
    }
    free(ids);
    batches_free(&bs);
}

Test(image_ops, refusals)
{
    sl_pipeline_opts_t o = {.roots = roots};
    sl_pipeline_t *p;
    char err[1024];
    int rc = pipeline_try("{\"source\":" IMAGES_SRC ",\"ops\":[" PARSE ",{\"op\":\"resize\",\"key\":\"image/encoded\","
                          "\"size\":[4,4]}]}",
                          &o, &p, err, sizeof err);
    cr_assert_eq(rc, SL_EINVAL);
    cr_assert_str_eq(err, "ops[1] (resize): component \"image/encoded\" is bytes; resize takes uint8 images (decode_jpeg makes "
                          "them)");
    rc = pipeline_try("{\"source\":" IMAGES_SRC ",\"ops\":[" PARSE ",{\"op\":\"decode_jpeg\",\"key\":\"img\"}]}", &o,
                      &p, err, sizeof err);
    cr_assert_eq(rc, SL_EINVAL);
    cr_assert_str_eq(err, "ops[1] (decode_jpeg): component \"img\" is not in its input (id, image/encoded, label)");
    rc = pipeline_try("{\"source\":" IMAGES_SRC ",\"ops\":[" PARSE ",{\"op\":\"decode_jpeg\",\"key\":\"id\"}]}", &o,
                      &p, err, sizeof err);
    cr_assert_eq(rc, SL_EINVAL);
    cr_assert_str_eq(err, "ops[1] (decode_jpeg): component \"id\" is int64; decode_jpeg takes encoded images (bytes)");
    rc = pipeline_try("{\"source\":" IMAGES_SRC ",\"ops\":[" PARSE ",{\"op\":\"cast\",\"key\":\"image/encoded\","
                      "\"dtype\":\"int32\"}]}",
                      &o, &p, err, sizeof err);
    cr_assert_eq(rc, SL_EINVAL);
    cr_assert_str_eq(err, "ops[1] (cast): component \"image/encoded\" is bytes; cast takes numbers");

    /* Found while running. */
    batches_t bs = run_images("{\"op\":\"normalize\",\"key\":\"image/encoded\",\"mean\":[0.5],\"std\":[0.5]}");
    cr_assert_eq(bs.rc, SL_EDATA);
    cr_assert_str_eq(bs.errmsg, "ops[2] (normalize): component \"image/encoded\" has 3 channels, but mean and std have "
                                "1 values");
    batches_free(&bs);
    bs = run_images("{\"op\":\"batch\",\"batch_size\":2}");
    cr_assert_eq(bs.rc, SL_EDATA);
    cr_assert(strstr(bs.errmsg, "ops[2] (batch): component \"image/encoded\" has shape [44, 108, 3] in element 1 of "
                                "the batch but [51, 81, 3] in element 0; batch needs equal shapes (padded_batch pads "
                                "them)"),
              "%s", bs.errmsg);
    batches_free(&bs);
    bs = run_spec("{\"source\":{\"type\":\"tfrecord\",\"files\":\"" FIXTURES "/basic-00000-of-00004.tfrecord\"},"
                  "\"ops\":[{\"op\":\"parse_example\",\"features\":{\"name\":{\"dtype\":\"bytes\"}}},"
                  "{\"op\":\"decode_jpeg\",\"key\":\"name\"}]}",
                  &o);
    cr_assert_eq(bs.rc, SL_EDATA);
    cr_assert(strstr(bs.errmsg, "ops[1] (decode_jpeg): component \"name\" (9 bytes): ") == bs.errmsg, "%s", bs.errmsg);
    batches_free(&bs);
    bs = run_images("{\"op\":\"batch\",\"batch_size\":1},{\"op\":\"random_flip\",\"key\":\"image/encoded\"}");
    cr_assert_eq(bs.rc, SL_EDATA);
    cr_assert(strstr(bs.errmsg, "ops[3] (random_flip): component \"image/encoded\" has shape [1, 51, 81, 3]; "
                                "random_flip takes one image of shape [height, width, 1 or 3] per element (put it "
                                "before batch)"),
              "%s", bs.errmsg);
    batches_free(&bs);
}

/* decode_jpeg straight before a crop decodes only the window (fused);
 * anything in between (a cast to what it already is) keeps them apart. Both
 * must give the same bytes, draws included. */
Test(image_ops, fused_decode_crop_equals_decode_then_crop)
{
    const char *crops[] = {
        "{\"op\":\"random_crop\",\"key\":\"image/encoded\",\"size\":[36,36],\"seed\":3}",
        "{\"op\":\"random_crop\",\"key\":\"image/encoded\",\"size\":[17,29],\"seed\":9}",
        "{\"op\":\"center_crop\",\"key\":\"image/encoded\",\"size\":[30,36]}",
        "{\"op\":\"center_crop\",\"key\":\"image/encoded\",\"size\":[38,40]}",
        /* More than half of every window (95 rows at most): not scaled. */
        "{\"op\":\"random_resized_crop\",\"key\":\"image/encoded\",\"size\":[48,48],\"seed\":3}",
        "{\"op\":\"random_resized_crop\",\"key\":\"image/encoded\",\"size\":[64,48],\"seed\":4,"
        "\"scale\":[0.05,0.5],\"ratio\":[0.2,5],\"dtype\":\"uint8\"}",
    };
    for (size_t i = 0; i < sizeof crops / sizeof crops[0]; i++) {
        char apart[512];
        snprintf(apart, sizeof apart, "{\"op\":\"cast\",\"key\":\"image/encoded\",\"dtype\":\"uint8\"},%s", crops[i]);
        batches_t fused = run_images(crops[i]), unfused = run_images(apart);
        cr_assert_eq(fused.rc, 1, "%s", fused.errmsg);
        cr_assert_eq(unfused.rc, 1, "%s", unfused.errmsg);
        cr_assert_eq(fused.n, unfused.n);
        cr_assert_gt(fused.n, 0);
        for (size_t k = 0; k < fused.n; k++) {
            cr_assert_eq(fused.b[k]->size, unfused.b[k]->size);
            cr_assert_eq(memcmp(fused.b[k]->data, unfused.b[k]->data, fused.b[k]->size), 0, "%s: image %zu",
                         crops[i], k);
        }
        batches_free(&fused);
        batches_free(&unfused);
    }
}

/* random_flip then resize then a uint8 resize's normalize run as one pass
 * (fused); casts to what each already is keep them apart. Both must give the
 * same bytes, draws included, sequential and in a parallel stage. A cast
 * after the decode keeps it apart in both: fused with them it may decode at
 * a DCT scale (decode_flip_resize_scales_the_dct). */
Test(image_ops, fused_flip_resize_normalize_equals_apart)
{
    const char *flips[] = {"{\"op\":\"random_flip\",\"key\":\"image/encoded\",\"seed\":5%s}",
                           "{\"op\":\"random_flip\",\"key\":\"image/encoded\",\"seed\":8,"
                           "\"direction\":\"up_down\"%s}"};
    const char *resizes[] = {"{\"op\":\"resize\",\"key\":\"image/encoded\",\"size\":[29,37],\"dtype\":\"uint8\"%s}",
                             "{\"op\":\"resize\",\"key\":\"image/encoded\",\"size\":[64,50]%s}"};
    const char *norm = "{\"op\":\"normalize\",\"key\":\"image/encoded\",\"mean\":[0.485,0.456,0.406],"
                       "\"std\":[0.229,0.224,0.225],\"scale\":true%s}";
    for (int par = 0; par < 2; par++)
        for (size_t f = 0; f < 2; f++)
            for (size_t r = 0; r < 2; r++) {
                const char *pc = par ? ",\"num_parallel_calls\":2" : "";
                char fl[256], rs[256], nm[256], cast_u8[128], cast_r[128], fused[1024], apart[1024];
                snprintf(fl, sizeof fl, flips[f], pc);
                snprintf(rs, sizeof rs, resizes[r], pc);
                snprintf(nm, sizeof nm, norm, pc);
                snprintf(cast_u8, sizeof cast_u8, "{\"op\":\"cast\",\"key\":\"image/encoded\",\"dtype\":\"uint8\"%s}",
                         pc);
                snprintf(cast_r, sizeof cast_r, "{\"op\":\"cast\",\"key\":\"image/encoded\",\"dtype\":\"%s\"%s}",
                         r == 0 ? "uint8" : "float32", pc);
                snprintf(fused, sizeof fused, "%s,%s,%s,%s", cast_u8, fl, rs, nm);
                snprintf(apart, sizeof apart, "%s,%s,%s,%s,%s,%s", cast_u8, fl, cast_u8, rs, cast_r, nm);
                sl_pipeline_opts_t o = {.roots = roots, .threads = par ? 2 : 0};
                batches_t a = run_spec(specf("{\"source\":" IMAGES_SRC ",\"ops\":[" PARSE_AS_IMAGE "," DECODE
                                             ",%s]}",
                                             fused),
                                       &o),
                          b = run_spec(specf("{\"source\":" IMAGES_SRC ",\"ops\":[" PARSE_AS_IMAGE "," DECODE
                                             ",%s]}",
                                             apart),
                                       &o);
                cr_assert_eq(a.rc, 1, "%s", a.errmsg);
                cr_assert_eq(b.rc, 1, "%s", b.errmsg);
                cr_assert_eq(a.n, 32);
                cr_assert_eq(a.n, b.n);
                for (size_t k = 0; k < a.n; k++) {
                    const sl_component_t *ca = comp_of(a.b[k], "image/encoded"), *cb = comp_of(b.b[k], "image/encoded");
                    cr_assert_eq(ca->dtype, SL_DTYPE_FLOAT32);
                    cr_assert_eq(a.b[k]->size, b.b[k]->size);
                    cr_assert_eq(memcmp(a.b[k]->data + ca->offset, b.b[k]->data + cb->offset,
                                        (size_t)(ca->shape[0] * ca->shape[1] * ca->shape[2]) * sizeof(float)),
                                 0, "%s: image %zu", fused, k);
                }
                batches_free(&a);
                batches_free(&b);
            }
}

/* The images through ops (after parsing) with opts o: every one of the
 * 32, or the pipeline's error. */
static batches_t images_through(const char *ops, const sl_pipeline_opts_t *o)
{
    batches_t bs = run_spec(specf("{\"source\":" IMAGES_SRC ",\"ops\":[" PARSE_AS_IMAGE ",%s]}", ops), o);
    cr_assert_eq(bs.rc, 1, "%s: %s", ops, bs.errmsg);
    cr_assert_eq(bs.n, 32, "%s", ops);
    return bs;
}

/* Asserts that ops fused and apart give the same batches, byte for byte. */
static void assert_same_batches(const batches_t *a, const batches_t *b, const char *fused)
{
    cr_assert_eq(a->n, b->n);
    for (size_t k = 0; k < a->n; k++) {
        cr_assert_eq(a->b[k]->size, b->b[k]->size);
        cr_assert_eq(memcmp(a->b[k]->data, b->b[k]->data, a->b[k]->size), 0, "%s: image %zu", fused, k);
    }
}

/* random_resized_crop then random_flip, normalize (after a uint8 crop), or
 * both, run as one pass (fused: the flip writes the resized pixels
 * mirrored); casts to what each already is keep them apart. Both must give
 * the same bytes, draws included, sequential and in a parallel stage with
 * the decode; and the flips draw both ways. */
Test(image_ops, fused_random_resized_crop_flip_normalize_equals_apart)
{
    const char *rrcs[] = {"{\"op\":\"random_resized_crop\",\"key\":\"image/encoded\",\"size\":[24,20],\"seed\":3,"
                          "\"dtype\":\"uint8\"%s}",
                          "{\"op\":\"random_resized_crop\",\"key\":\"image/encoded\",\"size\":[33,41],\"seed\":4,"
                          "\"scale\":[0.05,0.5],\"ratio\":[0.2,5]%s}"};
    const char *dirs[] = {"left_right", "up_down"};
    for (int par = 0; par < 2; par++)
        for (size_t r = 0; r < 2; r++)
            for (size_t d = 0; d < 2; d++)
                for (int with = 1; with < 4; with++) { /* 1: the flip, 2: normalize, 3: both */
                    bool flip = with & 1, norm = with & 2;
                    if (norm && r == 1)
                        continue; /* normalize after a float32 crop is its own op */
                    const char *pc = par ? ",\"num_parallel_calls\":2" : "";
                    const char *dt = r == 0 ? "uint8" : "float32";
                    char dec[128], rc[256], fl[256], nm[256], cast[128], fused[1024], apart[1024], plain[512];
                    snprintf(dec, sizeof dec, "{\"op\":\"decode_jpeg\",\"key\":\"image/encoded\"%s}", pc);
                    snprintf(rc, sizeof rc, rrcs[r], pc);
                    snprintf(fl, sizeof fl, "{\"op\":\"random_flip\",\"key\":\"image/encoded\",\"seed\":5,"
                             "\"direction\":\"%s\"%s}", dirs[d], pc);
                    snprintf(nm, sizeof nm, "{\"op\":\"normalize\",\"key\":\"image/encoded\",\"mean\":[0.485,0.456,"
                             "0.406],\"std\":[0.229,0.224,0.225],\"scale\":true%s}", pc);
                    snprintf(cast, sizeof cast, "{\"op\":\"cast\",\"key\":\"image/encoded\",\"dtype\":\"%s\"%s}", dt,
                             pc);
                    snprintf(fused, sizeof fused, "%s,%s%s%s%s%s", dec, rc, flip ? "," : "", flip ? fl : "",
                             norm ? "," : "", norm ? nm : "");
                    snprintf(apart, sizeof apart, "%s,%s,%s%s%s%s%s%s%s", dec, rc, cast, flip ? "," : "",
                             flip ? fl : "", flip ? "," : "", flip ? cast : "", norm ? "," : "", norm ? nm : "");
                    snprintf(plain, sizeof plain, "%s,%s", dec, rc);
                    sl_pipeline_opts_t o = {.roots = roots, .threads = par ? 2 : 0};
                    batches_t a = images_through(fused, &o), b = images_through(apart, &o),
                              c = images_through(plain, &o);
                    assert_same_batches(&a, &b, fused);
                    size_t unflipped = 0;
                    for (size_t k = 0; k < a.n; k++) {
                        const sl_component_t *ca = comp_of(a.b[k], "image/encoded");
                        cr_assert_eq(ca->dtype, norm || r == 1 ? SL_DTYPE_FLOAT32 : SL_DTYPE_UINT8);
                        unflipped += c.b[k]->size == a.b[k]->size &&
                                     memcmp(c.b[k]->data, a.b[k]->data, a.b[k]->size) == 0;
                    }
                    if (flip && !norm)
                        cr_assert(unflipped > 0 && unflipped < a.n, "%s: %zu of %zu images unflipped", fused,
                                  unflipped, a.n);
                    batches_free(&a);
                    batches_free(&b);
                    batches_free(&c);
                }
}

/* A crop fused with its decode_jpeg, then a random_flip or not, then a
 * resize and a normalize or not, run as one pass (the resize reads the
 * crop's window in the decoded rows); casts to what each already is keep
 * them apart. Both must give the same bytes, draws included, sequential
 * and in a parallel stage with the decode. */
Test(image_ops, fused_crop_flip_resize_normalize_equals_apart)
{
    const char *crops[] = {"{\"op\":\"random_crop\",\"key\":\"image/encoded\",\"size\":[36,33],\"seed\":3%s}",
                           "{\"op\":\"center_crop\",\"key\":\"image/encoded\",\"size\":[30,36]%s}"};
    const char *resizes[] = {"{\"op\":\"resize\",\"key\":\"image/encoded\",\"size\":[29,37],\"dtype\":\"uint8\"%s}",
                             "{\"op\":\"resize\",\"key\":\"image/encoded\",\"size\":[20,18]%s}"};
    for (int par = 0; par < 2; par++)
        for (size_t cr = 0; cr < 2; cr++)
            for (size_t r = 0; r < 2; r++)
                for (int with = 0; with < 4; with++) { /* bit 0: the flip, bit 1: normalize */
                    bool flip = with & 1, norm = with & 2;
                    if (norm && r == 1)
                        continue; /* normalize after a float32 resize is its own op */
                    const char *pc = par ? ",\"num_parallel_calls\":2" : "";
                    char dec[128], c[256], fl[256], rs[256], nm[256], cast_u8[128], cast_r[128];
                    char fused[1024], apart[1280];
                    snprintf(dec, sizeof dec, "{\"op\":\"decode_jpeg\",\"key\":\"image/encoded\"%s}", pc);
                    snprintf(c, sizeof c, crops[cr], pc);
                    snprintf(fl, sizeof fl, "{\"op\":\"random_flip\",\"key\":\"image/encoded\",\"seed\":5%s}", pc);
                    snprintf(rs, sizeof rs, resizes[r], pc);
                    snprintf(nm, sizeof nm, "{\"op\":\"normalize\",\"key\":\"image/encoded\",\"mean\":[0.485,0.456,"
                             "0.406],\"std\":[0.229,0.224,0.225],\"scale\":true%s}", pc);
                    snprintf(cast_u8, sizeof cast_u8,
                             "{\"op\":\"cast\",\"key\":\"image/encoded\",\"dtype\":\"uint8\"%s}", pc);
                    snprintf(cast_r, sizeof cast_r, "{\"op\":\"cast\",\"key\":\"image/encoded\",\"dtype\":\"%s\"%s}",
                             r == 0 ? "uint8" : "float32", pc);
                    snprintf(fused, sizeof fused, "%s,%s%s%s,%s%s%s", dec, c, flip ? "," : "", flip ? fl : "", rs,
                             norm ? "," : "", norm ? nm : "");
                    snprintf(apart, sizeof apart, "%s,%s,%s%s%s%s%s,%s,%s%s%s", dec, c, cast_u8, flip ? "," : "",
                             flip ? fl : "", flip ? "," : "", flip ? cast_u8 : "", rs, cast_r, norm ? "," : "",
                             norm ? nm : "");
                    sl_pipeline_opts_t o = {.roots = roots, .threads = par ? 2 : 0};
                    batches_t a = images_through(fused, &o), b = images_through(apart, &o);
                    assert_same_batches(&a, &b, fused);
                    batches_free(&a);
                    batches_free(&b);
                }
}

/* A flip that draws the same for every image would make the test above
 * vacuous: both outcomes occur with its seeds. */
Test(image_ops, fused_flip_draws_both_ways)
{
    batches_t plain = run_images("{\"op\":\"resize\",\"key\":\"image/encoded\",\"size\":[29,37],\"dtype\":\"uint8\"}");
    batches_t fl = run_images("{\"op\":\"random_flip\",\"key\":\"image/encoded\",\"seed\":5},"
                              "{\"op\":\"resize\",\"key\":\"image/encoded\",\"size\":[29,37],\"dtype\":\"uint8\"}");
    cr_assert_eq(plain.rc, 1, "%s", plain.errmsg);
    cr_assert_eq(fl.rc, 1, "%s", fl.errmsg);
    size_t same = 0;
    for (size_t k = 0; k < fl.n; k++)
        same += plain.b[k]->size == fl.b[k]->size && memcmp(plain.b[k]->data, fl.b[k]->data, fl.b[k]->size) == 0;
    cr_assert(same > 0 && same < fl.n, "%zu of %zu images unflipped", same, fl.n);
    batches_free(&plain);
    batches_free(&fl);
}

/* The 32 fixture images still encoded (parsed only), and a decoder for
 * their headers and the kernels by hand. */
static batches_t encoded_images(sl_image_decoder_t **dec)
{
    sl_pipeline_opts_t o = {.roots = roots};
    batches_t raw = run_spec("{\"source\":" IMAGES_SRC ",\"ops\":[" PARSE_AS_IMAGE "]}", &o);
    cr_assert_eq(raw.rc, 1, "%s", raw.errmsg);
    cr_assert_eq(raw.n, 32);
    char err[256];
    *dec = NULL;
    cr_assert_eq(sl_image_decoder_new(dec, err, sizeof err), 0, "%s", err);
    return raw;
}

/* The 32 fixture images through ops (fused) into *a and through apart
 * (the same ops kept apart) into *b: both must yield every image. */
static void run_fused_and_apart(const char *ops, const char *apart, const sl_pipeline_opts_t *o, batches_t *a,
                                batches_t *b)
{
    *a = run_spec(specf("{\"source\":" IMAGES_SRC ",\"ops\":[" PARSE_AS_IMAGE ",%s]}", ops), o);
    *b = run_spec(specf("{\"source\":" IMAGES_SRC ",\"ops\":[" PARSE_AS_IMAGE ",%s]}", apart), o);
    cr_assert_eq(a->rc, 1, "%s: %s", ops, a->errmsg);
    cr_assert_eq(b->rc, 1, "%s: %s", apart, b->errmsg);
    cr_assert_eq(a->n, 32, "%s", ops);
    cr_assert_eq(b->n, 32, "%s", apart);
}

/* decode_jpeg directly followed by a resize to at most half of each side
 * decodes at 1/2, 1/4 or 1/8 (DCT scaling) and resizes the rest: the same
 * bytes as the kernels (sl_image_decode_jpeg_scaled, then the resize mapped
 * onto the span the scaled image covers), sequential or parallel, with or
 * without a fused normalize; an op between them (a cast) gives the
 * unscaled result, and so does a resize that keeps more than half. */
Test(image_ops, decode_resize_scales_the_dct)
{
    sl_pipeline_opts_t o = {.roots = roots};
    sl_image_decoder_t *dec;
    batches_t raw = encoded_images(&dec);
    char err[256];
    const size_t sizes[][2] = {{16, 16}, {9, 20}, {50, 60}};
    for (size_t z = 0; z < 3; z++)
        for (int par = 0; par < 2; par++)
            for (int norm = 0; norm < 2; norm++) {
                size_t oh = sizes[z][0], ow = sizes[z][1];
                const char *pc = par ? ",\"num_parallel_calls\":2" : "";
                char dc[256], rs[256], nm[256], ops[1024], apart[1024];
                snprintf(dc, sizeof dc, "{\"op\":\"decode_jpeg\",\"key\":\"image/encoded\"%s}", pc);
                snprintf(rs, sizeof rs, "{\"op\":\"resize\",\"key\":\"image/encoded\",\"size\":[%zu,%zu],"
                         "\"dtype\":\"uint8\"%s}", oh, ow, pc);
                snprintf(nm, sizeof nm, "%s{\"op\":\"normalize\",\"key\":\"image/encoded\",\"mean\":[0.485,0.456,0.406],"
                         "\"std\":[0.229,0.224,0.225],\"scale\":true%s}", norm ? "," : "", pc);
                snprintf(ops, sizeof ops, "%s,%s%s", dc, rs, norm ? nm : "");
                snprintf(apart, sizeof apart, "%s,{\"op\":\"cast\",\"key\":\"image/encoded\",\"dtype\":\"uint8\"%s},%s%s",
                         dc, pc, rs, norm ? nm : "");
                o.threads = par ? 2 : 0;
                batches_t a, b;
                run_fused_and_apart(ops, apart, &o, &a, &b);
                size_t scaled = 0;
                for (size_t k = 0; k < a.n; k++) {
                    size_t len;
                    const uint8_t *jpeg = str_at(raw.b[k], comp_of(raw.b[k], "image/encoded"), 0, &len);
                    sl_image_shape_t fs, ss;
                    cr_assert_eq(sl_image_jpeg_header(dec, jpeg, len, 3, &fs, err, sizeof err), 0, "%s", err);
                    unsigned d = sl_image_jpeg_scale_denom(fs, oh, ow);
                    uint8_t *img = NULL;
                    cr_assert_eq(sl_image_decode_jpeg_scaled(dec, jpeg, len, 3, SIZE_MAX, d, &img, &ss, err, sizeof err),
                                 0, "%s", err);
                    float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
                    sl_image_resize_fuse_t f = {.mean = norm ? mean : NULL, .std = norm ? std : NULL, .scale = true};
                    if (d > 1) {
                        f.extent_h = (float)fs.h / (float)d;
                        f.extent_w = (float)fs.w / (float)d;
                        scaled++;
                    }
                    size_t n = oh * ow * 3, bytes = n * (norm ? sizeof(float) : 1);
                    uint8_t *want = malloc(bytes);
                    cr_assert_eq(sl_image_resize_fused(img, ss, &f, oh, ow, want, err, sizeof err), 0, "%s", err);
                    const sl_component_t *ca = comp_of(a.b[k], "image/encoded"), *cb = comp_of(b.b[k], "image/encoded");
                    cr_assert_eq(ca->shape[0], (int64_t)oh);
                    cr_assert_eq(ca->shape[1], (int64_t)ow);
                    cr_assert_eq(memcmp(a.b[k]->data + ca->offset, want, bytes), 0, "%s: image %zu (1/%u)", ops, k, d);
                    int same = memcmp(b.b[k]->data + cb->offset, want, bytes) == 0;
                    cr_assert_eq(same, d == 1, "%s: image %zu at 1/%u: apart, %s", ops, k, d,
                                 d == 1 ? "unscaled, the same" : "unscaled, different");
                    free(want);
                    free(img);
                }
                /* 16 x 16 and 9 x 20 are at most half of every fixture
                 * (39 x 44 the smallest); 50 x 60 keeps more than half of
                 * every one (95 rows the most). */
                cr_assert_eq(scaled, z < 2 ? 32 : 0, "%s", ops);
                batches_free(&a);
                batches_free(&b);
            }
    sl_image_decoder_free(dec);
    batches_free(&raw);
}

/* The fused scaled path by hand (scaled_window() in ops_image.c): the
 * window (y, x, h, w) of the JPEG at 1/d (d from the window and oh x ow),
 * resized from where it lies in the scaled rows with f's other settings
 * (dtype, normalize, flip after), into a malloc'd *want of *bytes.
 * @return d */
static unsigned scaled_window_by_hand(sl_image_decoder_t *dec, const uint8_t *jpeg, size_t len, size_t y, size_t x,
                                      size_t h, size_t w, size_t oh, size_t ow, sl_image_resize_fuse_t f,
                                      uint8_t **want, size_t *bytes)
{
    char err[256];
    unsigned d = sl_image_jpeg_scale_denom((sl_image_shape_t){h, w, 3}, oh, ow);
    uint8_t *img = NULL;
    sl_image_shape_t ss;
    cr_assert_eq(sl_image_decode_jpeg_scaled(dec, jpeg, len, 3, SIZE_MAX, d, &img, &ss, err, sizeof err), 0, "%s",
                 err);
    size_t y0 = y / d, x0 = x / d, y1 = (y + h + d - 1) / d, x1 = (x + w + d - 1) / d;
    f.stride = ss.w * 3;
    if (d > 1) {
        f.origin_h = (float)(y % d) / (float)d;
        f.origin_w = (float)(x % d) / (float)d;
        f.extent_h = (float)h / (float)d;
        f.extent_w = (float)w / (float)d;
    }
    *bytes = oh * ow * 3 * (f.out_f32 || f.mean ? sizeof(float) : 1);
    *want = malloc(*bytes);
    cr_assert_not_null(*want);
    sl_image_shape_t ws = {y1 - y0, x1 - x0, 3};
    cr_assert_eq(sl_image_resize_fused(img + (y0 * ss.w + x0) * 3, ws, &f, oh, ow, *want, err, sizeof err), 0, "%s",
                 err);
    free(img);
    return d;
}

/* decode_jpeg, random_flip, resize: the resize runs the three, decoding at
 * 1/2, 1/4 or 1/8 when it keeps at most half of each side, and then the
 * flip mirrors the resized image (the same bytes as the kernels by hand:
 * the scaled decode, the resize mapped onto its span, flipped after); a
 * resize that keeps more than half gives the bytes of the ops apart (a cast
 * between the decode and the flip), the flip mirroring the rows as before. */
Test(image_ops, decode_flip_resize_scales_the_dct)
{
    sl_pipeline_opts_t o = {.roots = roots};
    sl_image_decoder_t *dec;
    batches_t raw = encoded_images(&dec);
    char err[256];
    const size_t sizes[][2] = {{16, 16}, {50, 60}};
    for (size_t z = 0; z < 2; z++)
        for (int par = 0; par < 2; par++) {
            size_t oh = sizes[z][0], ow = sizes[z][1];
            const char *pc = par ? ",\"num_parallel_calls\":2" : "";
            char dc[256], fl[256], rs[256], ops[1024], apart[1024];
            snprintf(dc, sizeof dc, "{\"op\":\"decode_jpeg\",\"key\":\"image/encoded\"%s}", pc);
            snprintf(fl, sizeof fl, "{\"op\":\"random_flip\",\"key\":\"image/encoded\",\"seed\":5%s}", pc);
            snprintf(rs, sizeof rs, "{\"op\":\"resize\",\"key\":\"image/encoded\",\"size\":[%zu,%zu],"
                     "\"dtype\":\"uint8\"%s}", oh, ow, pc);
            snprintf(ops, sizeof ops, "%s,%s,%s", dc, fl, rs);
            snprintf(apart, sizeof apart, "%s,{\"op\":\"cast\",\"key\":\"image/encoded\",\"dtype\":\"uint8\"%s},%s,%s",
                     dc, pc, fl, rs);
            o.threads = par ? 2 : 0;
            batches_t a, b;
            run_fused_and_apart(ops, apart, &o, &a, &b);
            size_t scaled = 0, flipped = 0;
            for (size_t k = 0; k < a.n; k++) {
                size_t len, bytes = oh * ow * 3;
                const uint8_t *jpeg = str_at(raw.b[k], comp_of(raw.b[k], "image/encoded"), 0, &len);
                const sl_component_t *ca = comp_of(a.b[k], "image/encoded"), *cb = comp_of(b.b[k], "image/encoded");
                cr_assert(ca->shape[0] == (int64_t)oh && ca->shape[1] == (int64_t)ow);
                sl_image_shape_t fs;
                cr_assert_eq(sl_image_jpeg_header(dec, jpeg, len, 3, &fs, err, sizeof err), 0, "%s", err);
                unsigned d = sl_image_jpeg_scale_denom(fs, oh, ow);
                if (d == 1) {
                    cr_assert_eq(memcmp(a.b[k]->data + ca->offset, b.b[k]->data + cb->offset, bytes), 0,
                                 "%s: image %zu, unscaled: as apart", ops, k);
                    continue;
                }
                scaled++;
                sl_rng_t frng;
                sl_rng_seed(&frng, sl__element_seed(5, 0, k));
                sl_image_resize_fuse_t f = {.flip_after = (sl_rng_next(&frng) >> 63) != 0,
                                            .flip_after_dir = SL_IMAGE_FLIP_LEFT_RIGHT};
                flipped += f.flip_after;
                uint8_t *want;
                cr_assert_eq(scaled_window_by_hand(dec, jpeg, len, 0, 0, fs.h, fs.w, oh, ow, f, &want, &bytes), d);
                cr_assert_eq(memcmp(a.b[k]->data + ca->offset, want, bytes), 0, "%s: image %zu at 1/%u", ops, k, d);
                free(want);
            }
            /* 16 x 16 is at most half of every fixture, 50 x 60 more than
             * half of every one (decode_resize_scales_the_dct). */
            cr_assert_eq(scaled, z == 0 ? a.n : 0, "%s", ops);
            if (z == 0)
                cr_assert(flipped > 0 && flipped < a.n, "%s: %zu of %zu flipped", ops, flipped, a.n);
            batches_free(&a);
            batches_free(&b);
        }
    sl_image_decoder_free(dec);
    batches_free(&raw);
}

/* random_resized_crop fused with its decode_jpeg decodes a window at least
 * twice the output each way at 1/2, 1/4 or 1/8: the same bytes as the
 * kernels (sl_image_decode_jpeg_scaled, then the resize reading the scaled
 * rows the window reaches into, from where it starts in them), float32 and
 * uint8, sequential or parallel; apart (a cast between the decode and the
 * crop) the same window decoded whole gives other bytes exactly when it
 * was scaled. Windows smaller than that are not scaled. */
Test(image_ops, random_resized_crop_decodes_at_a_dct_scale)
{
    sl_pipeline_opts_t o = {.roots = roots};
    sl_image_decoder_t *dec;
    batches_t raw = encoded_images(&dec);
    char err[256];
    const double scale[2] = {0.2, 1.0}, ratio[2] = {0.75, 4.0 / 3.0};
    const size_t sizes[][2] = {{16, 16}, {9, 20}};
    for (size_t z = 0; z < 2; z++)
        for (int par = 0; par < 2; par++)
            for (int u8 = 0; u8 < 2; u8++) {
                size_t oh = sizes[z][0], ow = sizes[z][1];
                const char *pc = par ? ",\"num_parallel_calls\":2" : "";
                char dc[256], rc[512], ops[1024], apart[1024];
                snprintf(dc, sizeof dc, "{\"op\":\"decode_jpeg\",\"key\":\"image/encoded\"%s}", pc);
                snprintf(rc, sizeof rc, "{\"op\":\"random_resized_crop\",\"key\":\"image/encoded\",\"size\":[%zu,%zu],"
                         "\"seed\":11,\"scale\":[0.2,1.0],\"dtype\":\"%s\"%s}", oh, ow, u8 ? "uint8" : "float32", pc);
                snprintf(ops, sizeof ops, "%s,%s", dc, rc);
                snprintf(apart, sizeof apart, "%s,{\"op\":\"cast\",\"key\":\"image/encoded\",\"dtype\":\"uint8\"%s},%s",
                         dc, pc, rc);
                o.threads = par ? 2 : 0;
                batches_t a, b;
                run_fused_and_apart(ops, apart, &o, &a, &b);
                size_t scaled = 0;
                unsigned seen = 0;
                for (size_t k = 0; k < a.n; k++) {
                    size_t len;
                    const uint8_t *jpeg = str_at(raw.b[k], comp_of(raw.b[k], "image/encoded"), 0, &len);
                    sl_image_shape_t fs;
                    cr_assert_eq(sl_image_jpeg_header(dec, jpeg, len, 3, &fs, err, sizeof err), 0, "%s", err);
                    sl_rng_t rng;
                    sl_rng_seed(&rng, sl__element_seed(11, 0, k));
                    size_t y, x, h, w;
                    cr_assert_eq(sl_image_random_resized_crop_window(&rng, fs, scale, ratio, &y, &x, &h, &w, err,
                                                                     sizeof err),
                                 0, "%s", err);
                    uint8_t *want;
                    size_t bytes;
                    unsigned d = scaled_window_by_hand(dec, jpeg, len, y, x, h, w, oh, ow,
                                                       (sl_image_resize_fuse_t){.out_f32 = !u8}, &want, &bytes);
                    seen |= d;
                    scaled += d > 1;
                    const sl_component_t *ca = comp_of(a.b[k], "image/encoded"), *cb = comp_of(b.b[k], "image/encoded");
                    cr_assert_eq(ca->shape[0], (int64_t)oh);
                    cr_assert_eq(ca->shape[1], (int64_t)ow);
                    cr_assert_eq(memcmp(a.b[k]->data + ca->offset, want, bytes), 0,
                                 "%s: image %zu, window %zu x %zu at (%zu, %zu) at 1/%u", ops, k, h, w, y, x, d);
                    int same = memcmp(b.b[k]->data + cb->offset, want, bytes) == 0;
                    cr_assert_eq(same, d == 1, "%s: image %zu at 1/%u: apart, %s", ops, k, d,
                                 d == 1 ? "unscaled, the same" : "unscaled, different");
                    free(want);
                }
                /* Windows of 20% to all of images of 39 to 95 rows: some
                 * under twice the output, some at 1/2 and at 1/4. */
                cr_assert(scaled > 0 && scaled < a.n, "%s: %zu of %zu scaled", ops, scaled, a.n);
                cr_assert_eq(seen & (2 | 4), 2 | 4, "%s: scales seen %u", ops, seen);
                batches_free(&a);
                batches_free(&b);
            }
    sl_image_decoder_free(dec);
    batches_free(&raw);
}

/* A crop fused with its decode_jpeg, a random_flip or not, then a resize
 * that keeps at most half of the crop each way: the window is decoded at
 * 1/2 or 1/4 and resized from where it lies in the scaled rows, then
 * flipped (the same bytes as the kernels by hand, sequential or parallel,
 * with or without a fused normalize); apart (a cast before the resize) it
 * is decoded whole and differs. */
Test(image_ops, crop_then_resize_decodes_at_a_dct_scale)
{
    sl_pipeline_opts_t o = {.roots = roots};
    sl_image_decoder_t *dec;
    batches_t raw = encoded_images(&dec);
    char err[256];
    /* Crops within the smallest fixture (39 x 44), resized to 1/2 and 1/4. */
    const struct {
        const char *crop;
        size_t ch, cw, oh, ow;
        unsigned d;
    } cases[] = {{"random_crop", 36, 40, 18, 20, 2}, {"center_crop", 38, 40, 9, 10, 4}};
    for (size_t z = 0; z < 2; z++)
        for (int par = 0; par < 2; par++)
            for (int with = 0; with < 4; with++) { /* 1: a flip, 2: normalize */
                bool flip = with & 1, norm = with & 2;
                const char *pc = par ? ",\"num_parallel_calls\":2" : "";
                char ops[1536], apart[1536], crop[256], fl[256], rs[256], nm[256];
                snprintf(crop, sizeof crop, "{\"op\":\"%s\",\"key\":\"image/encoded\",\"size\":[%zu,%zu]%s%s}",
                         cases[z].crop, cases[z].ch, cases[z].cw, z == 0 ? ",\"seed\":3" : "", pc);
                snprintf(fl, sizeof fl, ",{\"op\":\"random_flip\",\"key\":\"image/encoded\",\"seed\":5%s}", pc);
                snprintf(rs, sizeof rs, "{\"op\":\"resize\",\"key\":\"image/encoded\",\"size\":[%zu,%zu],"
                         "\"dtype\":\"uint8\"%s}", cases[z].oh, cases[z].ow, pc);
                snprintf(nm, sizeof nm, ",{\"op\":\"normalize\",\"key\":\"image/encoded\",\"mean\":[0.485,0.456,"
                         "0.406],\"std\":[0.229,0.224,0.225],\"scale\":true%s}", pc);
                snprintf(ops, sizeof ops, "{\"op\":\"decode_jpeg\",\"key\":\"image/encoded\"%s},%s%s,%s%s", pc, crop,
                         flip ? fl : "", rs, norm ? nm : "");
                snprintf(apart, sizeof apart, "{\"op\":\"decode_jpeg\",\"key\":\"image/encoded\"%s},%s%s,"
                         "{\"op\":\"cast\",\"key\":\"image/encoded\",\"dtype\":\"uint8\"%s},%s%s", pc, crop,
                         flip ? fl : "", pc, rs, norm ? nm : "");
                o.threads = par ? 2 : 0;
                batches_t a, b;
                run_fused_and_apart(ops, apart, &o, &a, &b);
                size_t flipped = 0;
                for (size_t k = 0; k < a.n; k++) {
                    size_t len, ch = cases[z].ch, cw = cases[z].cw, oh = cases[z].oh, ow = cases[z].ow, y, x;
                    const uint8_t *jpeg = str_at(raw.b[k], comp_of(raw.b[k], "image/encoded"), 0, &len);
                    sl_image_shape_t fs;
                    cr_assert_eq(sl_image_jpeg_header(dec, jpeg, len, 3, &fs, err, sizeof err), 0, "%s", err);
                    if (z == 0) {
                        sl_rng_t rng;
                        sl_rng_seed(&rng, sl__element_seed(3, 0, k));
                        cr_assert_eq(sl_image_random_crop_offsets(&rng, fs, ch, cw, &y, &x, err, sizeof err), 0);
                    } else {
                        cr_assert_eq(sl_image_center_crop_offsets(fs, ch, cw, &y, &x, err, sizeof err), 0);
                    }
                    float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
                    sl_image_resize_fuse_t f = {.mean = norm ? mean : NULL, .std = norm ? std : NULL, .scale = true};
                    if (flip) {
                        sl_rng_t frng;
                        sl_rng_seed(&frng, sl__element_seed(5, 0, k));
                        f.flip_after = (sl_rng_next(&frng) >> 63) != 0;
                        f.flip_after_dir = SL_IMAGE_FLIP_LEFT_RIGHT;
                        flipped += f.flip_after;
                    }
                    uint8_t *want;
                    size_t bytes;
                    unsigned d = scaled_window_by_hand(dec, jpeg, len, y, x, ch, cw, oh, ow, f, &want, &bytes);
                    cr_assert_eq(d, cases[z].d);
                    const sl_component_t *ca = comp_of(a.b[k], "image/encoded"), *cb = comp_of(b.b[k], "image/encoded");
                    cr_assert(ca->shape[0] == (int64_t)oh && ca->shape[1] == (int64_t)ow);
                    cr_assert_eq(memcmp(a.b[k]->data + ca->offset, want, bytes), 0,
                                 "%s: image %zu, crop at (%zu, %zu) at 1/%u", ops, k, y, x, d);
                    cr_assert_neq(memcmp(b.b[k]->data + cb->offset, want, bytes), 0, "%s: image %zu apart", ops, k);
                    free(want);
                }
                if (flip)
                    cr_assert(flipped > 0 && flipped < a.n, "%s: %zu of %zu flipped", ops, flipped, a.n);
                batches_free(&a);
                batches_free(&b);
            }
    sl_image_decoder_free(dec);
    batches_free(&raw);
}

/* The crop pipeline (crop of crop_h x 33, flip, resize to 40 x 40,
 * normalize: 19,200 bytes an image) with pc after each op (a parallel
 * stage right below the batch, or not), after the parse and ops before,
 * then the batch and ops after. */
static const char *crop_batch_mid(int crop_h, const char *pc, const char *before, const char *mid, const char *batch,
                                  const char *after)
{
    static char s[4096];
    snprintf(s, sizeof s,
             "{\"source\":" IMAGES_SRC ",\"ops\":[" PARSE_AS_IMAGE "%s,{\"op\":\"decode_jpeg\",\"key\":"
             "\"image/encoded\"%s},{\"op\":\"random_crop\",\"key\":\"image/encoded\",\"size\":[%d,33],\"seed\":3%s},"
             "{\"op\":\"random_flip\",\"key\":\"image/encoded\",\"seed\":5%s},{\"op\":\"resize\",\"key\":"
             "\"image/encoded\",\"size\":[40,40],\"dtype\":\"uint8\"%s},%s{\"op\":\"normalize\",\"key\":"
             "\"image/encoded\",\"mean\":[0.485,0.456,0.406],\"std\":[0.229,0.224,0.225],\"scale\":true%s},%s%s]}",
             before, pc, crop_h, pc, pc, pc, mid, pc, batch, after);
    return s;
}

static const char *crop_batch(int crop_h, const char *pc, const char *before, const char *batch, const char *after)
{
    return crop_batch_mid(crop_h, pc, before, "", batch, after);
}

/* Map-and-batch fusion: a batch right above an ordered parallel stage has
 * the stage's last op write each image into its row of the batch's block.
 * Whatever the batch size against the stage's depth (4 here: rows of the
 * next batch ahead, or none ahead), a short or dropped last batch, epochs
 * before the stage or after the batch (a reset), and the ids beside the
 * images, the batches are byte for byte those of the same ops run one at a
 * time, and rows were written in place. */
Test(image_ops, map_and_batch_writes_rows_in_place_and_equals_apart)
{
    const char *batches[] = {"{\"op\":\"batch\",\"batch_size\":5}", "{\"op\":\"batch\",\"batch_size\":4}",
                             "{\"op\":\"batch\",\"batch_size\":7,\"drop_remainder\":true}",
                             "{\"op\":\"batch\",\"batch_size\":1}", "{\"op\":\"batch\",\"batch_size\":32}"};
    const char *befores[] = {"", ",{\"op\":\"repeat\",\"count\":3}"};
    const char *afters[] = {"", ",{\"op\":\"repeat\",\"count\":2}", ",{\"op\":\"take\",\"count\":3}"};
    for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++)
        for (size_t be = 0; be < 2; be++)
            for (size_t af = 0; af < 3; af++) {
                sl_pipeline_opts_t o = {.roots = roots, .threads = 2};
                sl_pipeline_t *p = pipeline_make(
                    crop_batch(36, ",\"num_parallel_calls\":2", befores[be], batches[bi], afters[af]), &o);
                batches_t fused = run_pipeline(p);
                uint64_t in_place = sl_pipeline_rows_in_place(p);
                sl_pipeline_destroy(p);
                batches_t apart = run_spec(crop_batch(36, "", befores[be], batches[bi], afters[af]), &o);
                cr_assert_eq(fused.rc, 1, "%s", fused.errmsg);
                cr_assert_eq(apart.rc, 1, "%s", apart.errmsg);
                cr_assert_gt(fused.n, 0);
                assert_same_batches(&fused, &apart, batches[bi]);
                /* Rows go in place from the second batch on, with room
                 * ahead for them: not with batches of one. */
                if (bi != 3 && fused.n > 2)
                    cr_assert_gt(in_place, 0, "%s%s%s: no row written in place", befores[be], batches[bi],
                                 afters[af]);
                batches_free(&fused);
                batches_free(&apart);
            }
    /* An op between the resize and the normalize: the normalize makes the
     * float32 image on its own, into the row, a row at a time past the
     * cache. */
    sl_pipeline_opts_t o = {.roots = roots, .threads = 2};
    const char *gray = "{\"op\":\"random_grayscale\",\"key\":\"image/encoded\",\"p\":0.5,\"seed\":9";
    char mid[256];
    snprintf(mid, sizeof mid, "%s%s},", gray, ",\"num_parallel_calls\":2");
    sl_pipeline_t *p = pipeline_make(crop_batch_mid(36, ",\"num_parallel_calls\":2", "", mid, batches[0], ""), &o);
    batches_t fused = run_pipeline(p);
    uint64_t in_place = sl_pipeline_rows_in_place(p);
    sl_pipeline_destroy(p);
    snprintf(mid, sizeof mid, "%s},", gray);
    batches_t apart = run_spec(crop_batch_mid(36, "", "", mid, batches[0], ""), &o);
    cr_assert_eq(fused.rc, 1, "%s", fused.errmsg);
    assert_same_batches(&fused, &apart, "resize, random_grayscale, normalize");
    cr_assert_gt(in_place, 0);
    batches_free(&fused);
    batches_free(&apart);
}

/* Fused, the blocks made ahead for the next batches are asked for with
 * their batches' places among the outputs too (sl_pipeline_opts_t.
 * block_alloc), across a short batch dropped at an epoch's end, a repeat
 * and a take after the batch. */
Test(image_ops, map_and_batch_asks_for_each_block_with_its_place_among_the_outputs)
{
    const char *batches[] = {"{\"op\":\"batch\",\"batch_size\":5}",
                             "{\"op\":\"batch\",\"batch_size\":7,\"drop_remainder\":true}"};
    const char *afters[] = {"", ",{\"op\":\"repeat\",\"count\":3}", ",{\"op\":\"take\",\"count\":3}"};
    for (size_t bi = 0; bi < 2; bi++)
        for (size_t af = 0; af < 3; af++) {
            sl_pipeline_opts_t o = arena_open(false);
            o.roots = roots;
            o.threads = 2;
            const char *json = crop_batch(36, ",\"num_parallel_calls\":2", "", batches[bi], afters[af]);
            sl_pipeline_t *p = pipeline_make(json, &o);
            uint64_t k = 0;
            sl_wire_batch_t *b;
            int rc;
            while ((rc = sl_pipeline_next(p, &b)) == 0) {
                cr_assert_eq(arena_index_of(b->data), k, "%s%s: output %lu", batches[bi], afters[af],
                             (unsigned long)k);
                sl_wire_batch_free(b);
                k++;
            }
            cr_assert_eq(rc, 1, "%s", sl_pipeline_errmsg(p));
            cr_assert_gt(k, 2);
            cr_assert_gt(sl_pipeline_rows_in_place(p), 0, "%s%s: no block made ahead", batches[bi], afters[af]);
            sl_pipeline_destroy(p);
            arena_close(json);
        }
}

/* A pipeline that ends mid-batch (destroyed, or failing at an image that
 * does not decode) while the stage writes rows of the batch's block: the
 * stage lets go first (ASan would see a write after the free). */
Test(image_ops, map_and_batch_stops_cleanly_mid_batch)
{
    sl_pipeline_opts_t o = {.roots = roots, .threads = 2};
    for (size_t limit = 1; limit < 5; limit++) {
        sl_pipeline_t *p = pipeline_make(crop_batch(36, ",\"num_parallel_calls\":2", ",{\"op\":\"repeat\"}",
                                                    "{\"op\":\"batch\",\"batch_size\":6}", ""),
                                         &o);
        batches_t some = run_pipeline_n(p, limit);
        cr_assert_eq(some.n, limit);
        sl_pipeline_destroy(p);
        batches_free(&some);
    }
    /* Image 26 (38 high) is smaller than a crop 39 high: the fifth batch
     * fails, with rows ahead on offer, after four whole ones. */
    sl_pipeline_t *p = pipeline_make(
        crop_batch(39, ",\"num_parallel_calls\":2", "", "{\"op\":\"batch\",\"batch_size\":6}", ""), &o);
    batches_t all = run_pipeline(p);
    cr_assert_eq(all.rc, SL_EDATA, "%d %s", all.rc, all.errmsg);
    cr_assert(strstr(all.errmsg, "smaller than the crop"), "%s", all.errmsg);
    cr_assert_eq(all.n, 4);
    cr_assert_gt(sl_pipeline_rows_in_place(p), 0);
    sl_pipeline_destroy(p);
    batches_free(&all);
}
