/*
 * replay_main.c: runs a fuzz target's LLVMFuzzerTestOneInput() once on
 * every file of the directories (or files) given, without libFuzzer, so
 * that the seeds and the inputs of fixed findings (tests/fuzz/corpus/
 * <target>/) are replayed by every build's ctest as replay_<target>: a
 * check that fails aborts, ASan and UBSan report as in the fuzzer.
 * Files are taken in name order; an empty or missing directory is an
 * error, so that a corpus cannot silently stop being replayed.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    size_t cap = 4096, len = 0;
    uint8_t *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            uint8_t *grown = realloc(buf, cap * 2);
            if (!grown) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = grown;
            cap *= 2;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        fprintf(stderr, "%s: cannot read\n", path);
        free(buf);
        return -1;
    }
    /* A copy of exactly len bytes, so that ASan sees a read past the input. */
    uint8_t *input = malloc(len ? len : 1);
    if (!input) {
        free(buf);
        return -1;
    }
    memcpy(input, buf, len);
    free(buf);
    LLVMFuzzerTestOneInput(input, len);
    free(input);
    return 0;
}

static int replay_dir(const char *dir, size_t *count)
{
    DIR *d = opendir(dir);
    if (!d)
        return replay_file(dir) == 0 ? (++*count, 0) : -1;
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **grown = realloc(names, cap * sizeof *names);
            if (!grown)
                abort();
            names = grown;
        }
        size_t len = strlen(dir) + strlen(e->d_name) + 2;
        if (!(names[n] = malloc(len)))
            abort();
        snprintf(names[n], len, "%s/%s", dir, e->d_name);
        n++;
    }
    closedir(d);
    if (n > 0)
        qsort(names, n, sizeof *names, by_name);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        if (replay_file(names[i]) < 0)
            rc = -1;
        free(names[i]);
    }
    free(names);
    *count += n;
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
        return 2;
    }
    size_t count = 0;
    int rc = 0;
    for (int i = 1; i < argc; i++)
        if (replay_dir(argv[i], &count) < 0)
            rc = 1;
    if (count == 0) {
        fprintf(stderr, "%s: no inputs to replay\n", argv[0]);
        return 1;
    }
    printf("%s: replayed %zu input(s)\n", argv[0], count);
    return rc;
}
