/*
 * test_files.c: the dispatcher's expansion and counting of a file source
 * (dispatcher/files.c), in particular the cache that counts a file once
 * however many spec variants name it (attack 12 of issue 15).
 */
#include <criterion/criterion.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "confine.h"
#include "files.h"
#include "spec.h"

static char dir[64];

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
}

static uint64_t resolve(sl_confine_t *roots, const char *spec_text)
{
    sl_spec_t *spec;
    char err[512];
    cr_assert_eq(sl_spec_parse(spec_text, strlen(spec_text), &spec, err, sizeof err), 0, "%s", err);
    sl_file_list_t l;
    cr_assert_eq(sl_file_list_resolve(spec, roots, 100, &l, err, sizeof err), 0, "%s", err);
    uint64_t n = l.total;
    sl_file_list_clear(&l);
    sl_spec_free(spec);
    return n;
}

Test(files, a_file_is_counted_once_for_every_spec_that_names_it)
{
    snprintf(dir, sizeof dir, "/tmp/sluice-files-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/lines.txt", dir);
    write_file(path, "a\nb\nc\n");
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    const char *roots_list[] = {dir};
    sl_confine_t *roots;
    char err[512];
    cr_assert_eq(sl_confine_create(roots_list, 1, &roots, err, sizeof err), 0, "%s", err);
    char spec1[512], spec2[512];
    snprintf(spec1, sizeof spec1, "{\"source\":{\"type\":\"text_lines\",\"files\":[\"%s\"]}}", path);
    snprintf(spec2, sizeof spec2,
             "{\"source\":{\"type\":\"text_lines\",\"files\":[\"%s\"]},\"ops\":[{\"op\":\"batch\",\"batch_size\":2}]}",
             path);
    cr_assert_eq(resolve(roots, spec1), 3);
    /* The same size and mtime, other lines: a variant of the spec gets the
     * count made before, not a new one. */
    write_file(path, "abcde\n");
    struct timespec times[2] = {st.st_atim, st.st_mtim};
    cr_assert_eq(utimensat(AT_FDCWD, path, times, 0), 0);
    cr_assert_eq(resolve(roots, spec2), 3, "counted again");
    /* A file that changed (its mtime) is counted again. */
    times[1].tv_sec += 10;
    cr_assert_eq(utimensat(AT_FDCWD, path, times, 0), 0);
    cr_assert_eq(resolve(roots, spec2), 1);
    sl_confine_destroy(roots);
    unlink(path);
    rmdir(dir);
}
