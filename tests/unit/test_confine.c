/*
 * test_confine.c: data-root confinement (storage/confine.c) on a tree made
 * under /tmp for each test and removed after it:
 *
 *   T/data/a.tfrecord, T/data/b.tfrecord, T/data/sub/c.tfrecord
 *   T/data/in -> T/data/sub/c.tfrecord    (a symlink that stays inside)
 *   T/data/out -> T/secret                (a symlink that leads out)
 *   T/data/outdir -> T                    (a directory symlink out)
 *   T/data2/x.tfrecord                    (a sibling sharing the prefix)
 *   T/secret
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "confine.h"

static char top[64];
static char data[PATH_MAX], data2[PATH_MAX];

static void touch(const char *rel)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", top, rel);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f, "%s", p);
    fputs("x", f);
    fclose(f);
}

static void link_to(const char *target, const char *rel)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", top, rel);
    cr_assert_eq(symlink(target, p), 0, "%s", p);
}

static void setup(void)
{
    snprintf(top, sizeof top, "/tmp/sl-test-confine-XXXXXX");
    cr_assert_not_null(mkdtemp(top));
    /* mkdtemp's path may itself hold a symlink (a /tmp elsewhere): the
     * roots are compared resolved. */
    char real[PATH_MAX];
    cr_assert_not_null(realpath(top, real));
    snprintf(data, sizeof data, "%s/data", real);
    snprintf(data2, sizeof data2, "%s/data2", real);
    cr_assert_eq(mkdir(data, 0755), 0);
    cr_assert_eq(mkdir(data2, 0755), 0);
    char sub[PATH_MAX];
    snprintf(sub, sizeof sub, "%s/sub", data);
    cr_assert_eq(mkdir(sub, 0755), 0);
    touch("data/a.tfrecord");
    touch("data/b.tfrecord");
    touch("data/sub/c.tfrecord");
    touch("data2/x.tfrecord");
    touch("secret");
    link_to("sub/c.tfrecord", "data/in");
    link_to("../secret", "data/out");
    link_to("..", "data/outdir");
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", top);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(confine, .init = setup, .fini = teardown);

static sl_confine_t *make(const char *root)
{
    sl_confine_t *c;
    char err[512];
    const char *roots[] = {root};
    cr_assert_eq(sl_confine_create(roots, 1, &c, err, sizeof err), 0, "%s", err);
    return c;
}

/* @return what sl_confine_check returns for top/rel; resolved and err out */
static int check(sl_confine_t *c, const char *rel, char *resolved, char *err)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", top, rel);
    return sl_confine_check(c, p, resolved, PATH_MAX, err, 1024);
}

Test(confine, inside_is_accepted_and_resolved)
{
    sl_confine_t *c = make(data);
    char resolved[PATH_MAX], err[1024], want[PATH_MAX];
    cr_assert_eq(check(c, "data/a.tfrecord", resolved, err), 0, "%s", err);
    snprintf(want, sizeof want, "%s/a.tfrecord", data);
    cr_assert_str_eq(resolved, want);
    /* A symlink and a ".." that stay inside. */
    snprintf(want, sizeof want, "%s/sub/c.tfrecord", data);
    cr_assert_eq(check(c, "data/in", resolved, err), 0, "%s", err);
    cr_assert_str_eq(resolved, want);
    cr_assert_eq(check(c, "data/sub/../sub/c.tfrecord", resolved, err), 0, "%s", err);
    cr_assert_str_eq(resolved, want);
    /* The root itself. */
    cr_assert_eq(check(c, "data", resolved, err), 0, "%s", err);
    cr_assert_eq(sl_confine_num_roots(c), 1);
    sl_confine_destroy(c);
}

Test(confine, outside_is_refused_with_the_reason)
{
    sl_confine_t *c = make(data);
    char resolved[PATH_MAX], err[1024], want[PATH_MAX * 2];
    cr_assert_eq(sl_confine_check(c, "/etc/passwd", resolved, sizeof resolved, err, sizeof err), -EACCES);
    snprintf(want, sizeof want, "/etc/passwd is outside every --data-root (%s)", data);
    cr_assert_str_eq(err, want);
    cr_assert_eq(check(c, "secret", resolved, err), -EACCES);
    cr_assert(strstr(err, "outside every --data-root"), "%s", err);
    sl_confine_destroy(c);
}

Test(confine, dotdot_escapes_are_refused)
{
    sl_confine_t *c = make(data);
    char resolved[PATH_MAX], err[1024];
    cr_assert_eq(check(c, "data/../secret", resolved, err), -EACCES);
    cr_assert(strstr(err, "resolves to") && strstr(err, "/secret"), "%s", err);
    cr_assert_eq(check(c, "data/sub/../../data2/x.tfrecord", resolved, err), -EACCES);
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/../../../../../../etc/passwd", data);
    cr_assert_eq(sl_confine_check(c, p, resolved, sizeof resolved, err, sizeof err), -EACCES);
    cr_assert(strstr(err, "/etc/passwd"), "%s", err);
    sl_confine_destroy(c);
}

Test(confine, symlinks_out_are_refused)
{
    sl_confine_t *c = make(data);
    char resolved[PATH_MAX], err[1024];
    cr_assert_eq(check(c, "data/out", resolved, err), -EACCES);
    cr_assert(strstr(err, "data/out resolves to") && strstr(err, "/secret, outside"), "%s", err);
    cr_assert_eq(check(c, "data/outdir/secret", resolved, err), -EACCES);
    cr_assert_eq(check(c, "data/outdir/data2/x.tfrecord", resolved, err), -EACCES);
    /* Through the symlink and back in is fine. */
    cr_assert_eq(check(c, "data/outdir/data/a.tfrecord", resolved, err), 0, "%s", err);
    sl_confine_destroy(c);
}

Test(confine, prefix_is_not_a_parent)
{
    sl_confine_t *c = make(data);
    char resolved[PATH_MAX], err[1024];
    cr_assert_eq(check(c, "data2/x.tfrecord", resolved, err), -EACCES);
    cr_assert(strstr(err, "outside every --data-root"), "%s", err);
    sl_confine_destroy(c);

    /* With both roots, both are inside; the message lists them. */
    const char *roots[] = {data, data2};
    cr_assert_eq(sl_confine_create(roots, 2, &c, err, sizeof err), 0, "%s", err);
    cr_assert_eq(check(c, "data2/x.tfrecord", resolved, err), 0, "%s", err);
    cr_assert_eq(check(c, "data/a.tfrecord", resolved, err), 0, "%s", err);
    cr_assert_eq(check(c, "secret", resolved, err), -EACCES);
    char want[PATH_MAX * 3];
    snprintf(want, sizeof want, "(%s, %s)", data, data2);
    cr_assert(strstr(err, want), "%s", err);
    sl_confine_destroy(c);
}

Test(confine, missing_paths_and_roots)
{
    sl_confine_t *c = make(data);
    char resolved[PATH_MAX], err[1024];
    cr_assert_eq(check(c, "data/nope.tfrecord", resolved, err), -ENOENT);
    cr_assert(strstr(err, "data/nope.tfrecord"), "%s", err);
    sl_confine_destroy(c);

    char missing[PATH_MAX];
    snprintf(missing, sizeof missing, "%s/no-such-root", top);
    const char *roots[] = {data, missing};
    c = (sl_confine_t *)1;
    cr_assert_eq(sl_confine_create(roots, 2, &c, err, sizeof err), -ENOENT);
    cr_assert_null(c);
    cr_assert(strstr(err, missing), "%s", err);

    char file[PATH_MAX];
    snprintf(file, sizeof file, "%s/a.tfrecord", data);
    const char *file_root[] = {file};
    cr_assert_eq(sl_confine_create(file_root, 1, &c, err, sizeof err), -ENOTDIR);
}

Test(confine, no_roots_refuses_everything)
{
    sl_confine_t *c;
    char resolved[PATH_MAX], err[1024];
    cr_assert_eq(sl_confine_create(NULL, 0, &c, err, sizeof err), 0);
    cr_assert_eq(sl_confine_num_roots(c), 0);
    cr_assert_eq(check(c, "data/a.tfrecord", resolved, err), -EACCES);
    cr_assert(strstr(err, "--data-root"), "%s", err);
    sl_confine_destroy(c);
}

typedef struct {
    int n;
    char got[8][PATH_MAX];
} matches_t;

static int collect(void *arg, const char *resolved)
{
    matches_t *m = arg;
    cr_assert_lt(m->n, 8);
    snprintf(m->got[m->n++], PATH_MAX, "%s", resolved);
    return 0;
}

static int stop_at_first(void *arg, const char *resolved)
{
    (void)resolved;
    (*(int *)arg)++;
    return 42;
}

Test(confine, glob_with_matches_is_sorted_and_resolved)
{
    sl_confine_t *c = make(data);
    char pattern[PATH_MAX], err[1024], want[PATH_MAX];
    matches_t m = {0};
    snprintf(pattern, sizeof pattern, "%s/*.tfrecord", data);
    cr_assert_eq(sl_confine_glob(c, pattern, collect, &m, err, sizeof err), 0, "%s", err);
    cr_assert_eq(m.n, 2);
    snprintf(want, sizeof want, "%s/a.tfrecord", data);
    cr_assert_str_eq(m.got[0], want);
    snprintf(want, sizeof want, "%s/b.tfrecord", data);
    cr_assert_str_eq(m.got[1], want);

    /* A callback's nonzero value stops the walk and is returned. */
    int calls = 0;
    cr_assert_eq(sl_confine_glob(c, pattern, stop_at_first, &calls, err, sizeof err), 42);
    cr_assert_eq(calls, 1);
    sl_confine_destroy(c);
}

Test(confine, glob_without_matches_names_the_pattern)
{
    sl_confine_t *c = make(data);
    char pattern[PATH_MAX], err[1024], want[PATH_MAX * 2 + 64];
    matches_t m = {0};
    snprintf(pattern, sizeof pattern, "%s/*.parquet", data);
    cr_assert_eq(sl_confine_glob(c, pattern, collect, &m, err, sizeof err), -ENOENT);
    snprintf(want, sizeof want, "%s matches no file, or a file outside every --data-root (%s)", pattern, data);
    cr_assert_str_eq(err, want);
    cr_assert_eq(m.n, 0);
    sl_confine_destroy(c);
}

/* One match outside (through the symlink "out") refuses the whole pattern
 * before any callback, and is answered as no match at all: the answer does
 * not tell whether a path outside the roots exists. */
Test(confine, glob_with_a_match_outside_is_refused_as_no_match)
{
    sl_confine_t *c = make(data);
    char pattern[PATH_MAX], err[1024], want[PATH_MAX * 2 + 64];
    matches_t m = {0};
    snprintf(pattern, sizeof pattern, "%s/*", data);
    cr_assert_eq(sl_confine_glob(c, pattern, collect, &m, err, sizeof err), -ENOENT);
    cr_assert_eq(m.n, 0);
    snprintf(want, sizeof want, "%s matches no file, or a file outside every --data-root (%s)", pattern, data);
    cr_assert_str_eq(err, want);

    snprintf(pattern, sizeof pattern, "%s/../data2/*", data);
    cr_assert_eq(sl_confine_glob(c, pattern, collect, &m, err, sizeof err), -ENOENT);
    cr_assert_eq(m.n, 0);
    sl_confine_destroy(c);
}

/* A file outside that exists and one that does not get the same answer. */
Test(confine, glob_does_not_tell_whether_a_path_outside_exists)
{
    sl_confine_t *c = make(data);
    char exists[PATH_MAX], missing[PATH_MAX], e1[1024], e2[1024];
    matches_t m = {0};
    snprintf(exists, sizeof exists, "%s/../data2/x.tfrecord", data);
    snprintf(missing, sizeof missing, "%s/../data2/y.tfrecord", data);
    int r1 = sl_confine_glob(c, exists, collect, &m, e1, sizeof e1);
    int r2 = sl_confine_glob(c, missing, collect, &m, e2, sizeof e2);
    cr_assert_eq(r1, r2);
    cr_assert_eq(r1, -ENOENT);
    /* The same text but for the pattern each names. */
    cr_assert_str_eq(e1 + strlen(exists), e2 + strlen(missing));
    cr_assert_eq(m.n, 0);
    /* Through a directory symlink that leads out, alike. */
    snprintf(exists, sizeof exists, "%s/outdir/secret", data);
    snprintf(missing, sizeof missing, "%s/outdir/no-such-secret", data);
    r1 = sl_confine_glob(c, exists, collect, &m, e1, sizeof e1);
    r2 = sl_confine_glob(c, missing, collect, &m, e2, sizeof e2);
    cr_assert_eq(r1, -ENOENT);
    cr_assert_eq(r2, -ENOENT);
    cr_assert_str_eq(e1 + strlen(exists), e2 + strlen(missing));
    sl_confine_destroy(c);
}
