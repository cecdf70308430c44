/*
 * test_files.c: the dispatcher's expansion and counting of a file source
 * (dispatcher/files.c), in particular the cache that counts a file once
 * however many spec variants name it (attack 12 of issue 15).
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "confine.h"
#include "files.h"
#include "sluice.h"
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

/* The bounded count off the event loop (dispatcher/counter.c): a count past
 * its deadline fails naming the file and the option, that failure is
 * remembered for the unchanged file, and a FIFO is refused, not opened. */
Test(files, a_count_past_its_deadline_is_refused_and_remembered)
{
    snprintf(dir, sizeof dir, "/tmp/sluice-files-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    char path[128], fifo[128];
    snprintf(path, sizeof path, "%s/slow.txt", dir);
    snprintf(fifo, sizeof fifo, "%s/fifo.txt", dir);
    write_file(path, "a\nb\n");
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    const char *roots_list[] = {dir};
    sl_confine_t *roots;
    char err[512], text[512];
    cr_assert_eq(sl_confine_create(roots_list, 1, &roots, err, sizeof err), 0, "%s", err);
    snprintf(text, sizeof text, "{\"source\":{\"type\":\"text_lines\",\"files\":[\"%s\"]}}", path);
    sl_spec_t *spec;
    cr_assert_eq(sl_spec_parse(text, strlen(text), &spec, err, sizeof err), 0, "%s", err);
    sl_count_limit_t past = {.deadline_ms = 1, .timeout_ms = 5};
    sl_file_list_t l;
    cr_assert_eq(sl_file_list_resolve_bounded(spec, roots, 100, &past, &l, err, sizeof err), -ETIMEDOUT, "%s", err);
    cr_assert(strstr(err, path) && strstr(err, "--count-timeout-ms 5"), "%s", err);
    uint64_t hits = sl_file_count_cache_hits();
    err[0] = '\0';
    cr_assert_eq(sl_file_list_resolve(spec, roots, 100, &l, err, sizeof err), -ETIMEDOUT, "not remembered");
    cr_assert(strstr(err, "--count-timeout-ms 5"), "%s", err);
    cr_assert_eq(sl_file_count_cache_hits(), hits + 1);
    sl_spec_free(spec);

    snprintf(text, sizeof text, "{\"source\":{\"type\":\"text_lines\",\"files\":[\"%s\"]}}", fifo);
    cr_assert_eq(sl_spec_parse(text, strlen(text), &spec, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_file_list_resolve(spec, roots, 100, &l, err, sizeof err), SL_EDATA);
    cr_assert(strstr(err, "not a regular file"), "%s", err);
    sl_spec_free(spec);
    sl_confine_destroy(roots);
    unlink(path);
    unlink(fifo);
    rmdir(dir);
}
