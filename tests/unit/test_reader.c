/*
 * test_reader.c: the sequential file reader (storage/reader.c) with both
 * engines: files of awkward sizes read back byte for byte, through copies
 * and through views, with seeks forward and back, and the byte counters.
 * The files live in a temp dir under /tmp, removed by each test.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "reader.h"
#include "sluice.h"

#define BLOCK 65536u

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/sl-test-reader-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(reader, .init = setup, .fini = teardown);

static uint64_t rng_state = 42;
static uint64_t rng(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

/* Writes n random bytes to dir/name. @return the bytes (free them) */
static uint8_t *make_file(const char *name, size_t n, char *path, size_t pathlen)
{
    snprintf(path, pathlen, "%s/%s", dir, name);
    uint8_t *data = malloc(n ? n : 1);
    cr_assert_not_null(data);
    for (size_t i = 0; i < n; i++)
        data[i] = (uint8_t)rng();
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
    return data;
}

static sl_reader_t *open_reader(const char *path, sl_io_engine_t engine, size_t block, unsigned depth)
{
    sl_reader_opts_t o;
    sl_reader_opts_init(&o);
    o.engine = engine;
    o.block_size = block;
    o.depth = depth;
    sl_reader_t *r;
    char err[512];
    int rc = sl_reader_open(path, &o, &r, err, sizeof err);
    cr_assert_eq(rc, 0, "open %s: %s", path, err);
    cr_assert_eq(sl_reader_engine(r), engine == SL_IO_AUTO ? SL_IO_URING : engine);
    return r;
}

/* Reads the whole file with sl_reader_read in pieces of `piece` bytes. */
static void check_read(const char *path, const uint8_t *want, size_t n, sl_io_engine_t engine, size_t piece)
{
    sl_reader_t *r = open_reader(path, engine, BLOCK, 3);
    uint8_t *got = malloc(n + piece);
    cr_assert_not_null(got);
    size_t total = 0;
    for (;;) {
        size_t k;
        cr_assert_eq(sl_reader_read(r, got + total, piece, &k), 0);
        cr_assert_eq(sl_reader_offset(r), total + k);
        total += k;
        if (k < piece)
            break;
    }
    size_t k = 1;
    cr_assert_eq(sl_reader_read(r, got, piece, &k), 0);
    cr_assert_eq(k, 0, "more bytes after the end");
    cr_assert_eq(total, n, "%s (%s, pieces of %zu): read %zu of %zu bytes", path,
                 sl_reader_engine_name(engine), piece, total, n);
    cr_assert(n == 0 || memcmp(got, want, n) == 0, "%s: bytes differ", path);
    free(got);
    sl_reader_close(r);
}

/* Reads the whole file through views, consuming an odd amount each time. */
static void check_view(const char *path, const uint8_t *want, size_t n, sl_io_engine_t engine)
{
    sl_reader_t *r = open_reader(path, engine, BLOCK, 4);
    size_t total = 0;
    for (;;) {
        const uint8_t *p;
        size_t avail;
        cr_assert_eq(sl_reader_view(r, &p, &avail), 0);
        if (avail == 0)
            break;
        cr_assert_leq(avail, BLOCK);
        size_t k = avail > 7777 ? 7777 : avail;
        cr_assert_leq(total + k, n);
        cr_assert(memcmp(p, want + total, k) == 0, "bytes differ at %zu", total);
        sl_reader_consume(r, k);
        total += k;
    }
    cr_assert_eq(total, n);
    sl_reader_close(r);
}

static const size_t sizes[] = {0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 17, 10u << 20};

static void check_sizes(sl_io_engine_t engine)
{
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        char path[128], name[32];
        snprintf(name, sizeof name, "f%zu", sizes[i]);
        uint8_t *want = make_file(name, sizes[i], path, sizeof path);
        check_read(path, want, sizes[i], engine, 1 << 20);
        check_read(path, want, sizes[i], engine, 4093);
        check_read(path, want, sizes[i], engine, 3 * BLOCK);
        check_view(path, want, sizes[i], engine);
        free(want);
        cr_assert_eq(unlink(path), 0);
    }
}

Test(reader, odd_sizes_uring)
{
    check_sizes(SL_IO_URING);
}

Test(reader, odd_sizes_pread)
{
    check_sizes(SL_IO_PREAD);
}

Test(reader, odd_sizes_auto)
{
    char path[128];
    uint8_t *want = make_file("auto", BLOCK + 1, path, sizeof path);
    check_read(path, want, BLOCK + 1, SL_IO_AUTO, 1000);
    free(want);
}

/* The default options: 256 KiB blocks, 4 in flight. */
Test(reader, defaults_read_10mib)
{
    char path[128];
    size_t n = (10u << 20) + 12345;
    uint8_t *want = make_file("big", n, path, sizeof path);
    uint8_t *got = malloc(n);
    cr_assert_not_null(got);
    char err[256];
    sl_reader_t *r;
    cr_assert_eq(sl_reader_open(path, NULL, &r, err, sizeof err), 0, "%s", err);
    cr_assert_eq(sl_reader_size(r), n);
    size_t k;
    cr_assert_eq(sl_reader_read(r, got, n, &k), 0);
    cr_assert_eq(k, n);
    cr_assert(memcmp(got, want, n) == 0);
    sl_reader_close(r);
    free(got);
    free(want);
}

static void check_seek(sl_io_engine_t engine)
{
    char path[128];
    size_t n = 20 * BLOCK + 99;
    uint8_t *want = make_file("seek", n, path, sizeof path);
    sl_reader_t *r = open_reader(path, engine, BLOCK, 4);
    /* Before the first read, within the queued window, far ahead, back,
     * and past the end. */
    static const uint64_t offs[] = {5, 100, BLOCK + 3, 2 * BLOCK, 15 * BLOCK + 1, 7, 0, 20 * BLOCK + 98};
    uint8_t got[300];
    for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++) {
        cr_assert_eq(sl_reader_seek(r, offs[i]), 0);
        cr_assert_eq(sl_reader_offset(r), offs[i]);
        size_t k, expect = n - offs[i] < sizeof got ? n - offs[i] : sizeof got;
        cr_assert_eq(sl_reader_read(r, got, sizeof got, &k), 0);
        cr_assert_eq(k, expect, "at %llu", (unsigned long long)offs[i]);
        cr_assert(memcmp(got, want + offs[i], k) == 0, "at %llu", (unsigned long long)offs[i]);
    }
    cr_assert_eq(sl_reader_seek(r, n + 1000), 0);
    size_t k = 1;
    cr_assert_eq(sl_reader_read(r, got, sizeof got, &k), 0);
    cr_assert_eq(k, 0);
    /* pread leaves the stream where it is. */
    cr_assert_eq(sl_reader_seek(r, 10), 0);
    cr_assert_eq(sl_reader_pread(r, got, 50, 1000, &k), 0);
    cr_assert_eq(k, 50);
    cr_assert(memcmp(got, want + 1000, 50) == 0);
    cr_assert_eq(sl_reader_read(r, got, 50, &k), 0);
    cr_assert(memcmp(got, want + 10, 50) == 0);
    cr_assert_eq(sl_reader_pread(r, got, 50, n - 20, &k), 0);
    cr_assert_eq(k, 20);
    sl_reader_close(r);
    free(want);
}

Test(reader, seek_uring)
{
    check_seek(SL_IO_URING);
}

Test(reader, seek_pread)
{
    check_seek(SL_IO_PREAD);
}

Test(reader, counts_bytes_per_engine)
{
    char path[128];
    size_t n = 3 * BLOCK + 5;
    uint8_t *want = make_file("count", n, path, sizeof path);
    uint8_t *got = malloc(n);
    cr_assert_not_null(got);
    uint64_t u0 = sl_reader_bytes(SL_IO_URING), p0 = sl_reader_bytes(SL_IO_PREAD);
    size_t k;
    sl_reader_t *r = open_reader(path, SL_IO_URING, BLOCK, 2);
    cr_assert_eq(sl_reader_read(r, got, n, &k), 0);
    sl_reader_close(r);
    cr_assert_eq(sl_reader_bytes(SL_IO_URING) - u0, n);
    r = open_reader(path, SL_IO_PREAD, BLOCK, 2);
    cr_assert_eq(sl_reader_read(r, got, n, &k), 0);
    sl_reader_close(r);
    cr_assert_eq(sl_reader_bytes(SL_IO_PREAD) - p0, n);
    cr_assert_eq(sl_reader_bytes(SL_IO_AUTO), sl_reader_bytes(SL_IO_URING) + sl_reader_bytes(SL_IO_PREAD));
    free(got);
    free(want);
}

/* Closing with reads still in flight must wait for them (ASan sees it). */
Test(reader, close_with_reads_in_flight)
{
    char path[128];
    uint8_t *want = make_file("inflight", 8 * BLOCK, path, sizeof path);
    sl_reader_t *r = open_reader(path, SL_IO_URING, BLOCK, 8);
    uint8_t b[10];
    size_t k;
    cr_assert_eq(sl_reader_read(r, b, sizeof b, &k), 0);
    cr_assert_eq(k, sizeof b);
    sl_reader_close(r);
    free(want);
}

/* A closed reader's ring serves the next one: 500 small files read one
 * after the other set up one ring, not 500. Every other file is closed
 * with its reads in flight (its rest unread), so the next reader on that
 * ring would see their completions if the ring came back undrained: it
 * reads its own file byte for byte all the same. Readers of another depth
 * take a ring of their own; two open at once never share one. */
Test(reader, a_closed_readers_ring_serves_the_next_one)
{
    enum { FILES = 500 };
    char path[128];
    uint8_t *small = make_file("small", 37, path, sizeof path);
    char big_path[128];
    uint8_t *big = make_file("big", 6 * BLOCK + 5, big_path, sizeof big_path);
    /* Once a ring of depth 3 and one of depth 5 are in the pool (or new). */
    sl_reader_close(open_reader(path, SL_IO_URING, BLOCK, 3));
    sl_reader_close(open_reader(path, SL_IO_URING, BLOCK, 5));
    uint64_t before = sl_reader_rings_set_up();
    for (int i = 0; i < FILES; i++) {
        if (i % 2) {
            sl_reader_t *r = open_reader(big_path, SL_IO_URING, BLOCK, 3);
            uint8_t b[10];
            size_t k;
            cr_assert_eq(sl_reader_read(r, b, sizeof b, &k), 0);
            cr_assert(k == sizeof b && memcmp(b, big, k) == 0, "file %d: first bytes", i);
            sl_reader_close(r); /* reads of the rest in flight */
        } else {
            check_read(path, small, 37, SL_IO_URING, 5);
        }
    }
    cr_assert_eq(sl_reader_rings_set_up(), before, "%" PRIu64 " rings set up for %d files one after the other",
                 sl_reader_rings_set_up() - before, FILES);
    check_view(path, small, 37, SL_IO_URING); /* depth 4: a new ring (or one left by another test) */
    uint64_t after_view = sl_reader_rings_set_up();
    check_view(big_path, big, 6 * BLOCK + 5, SL_IO_URING);
    cr_assert_eq(sl_reader_rings_set_up(), after_view, "a ring of depth 4 was there to take");
    /* Two readers of one depth open at once: two rings. */
    sl_reader_t *a = open_reader(path, SL_IO_URING, BLOCK, 5);
    uint64_t one = sl_reader_rings_set_up();
    sl_reader_t *b = open_reader(big_path, SL_IO_URING, BLOCK, 5);
    cr_assert_eq(sl_reader_rings_set_up(), one + 1, "the second reader took a ring in use");
    uint8_t x[37], y[37];
    size_t kx, ky;
    cr_assert_eq(sl_reader_read(a, x, sizeof x, &kx), 0);
    cr_assert_eq(sl_reader_read(b, y, sizeof y, &ky), 0);
    cr_assert(kx == 37 && memcmp(x, small, 37) == 0);
    cr_assert(ky == 37 && memcmp(y, big, 37) == 0);
    sl_reader_close(a);
    sl_reader_close(b);
    free(small);
    free(big);
}

/* A child made by fork() shares its parent's kernel rings: it sets up its
 * own and tears down its copies of the idle ones, which leaves the
 * parent's working. */
Test(reader, a_forked_child_takes_no_ring_of_its_parent)
{
    char path[128];
    uint8_t *want = make_file("forked", 3 * BLOCK + 1, path, sizeof path);
    check_read(path, want, 3 * BLOCK + 1, SL_IO_URING, 1000); /* a ring of depth 3 idle */
    uint64_t before = sl_reader_rings_set_up();
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        sl_reader_t *r;
        sl_reader_opts_t o;
        sl_reader_opts_init(&o);
        o.engine = SL_IO_URING;
        o.block_size = BLOCK;
        o.depth = 3;
        char err[256];
        uint8_t b[100];
        size_t k = 0;
        int ok = sl_reader_open(path, &o, &r, err, sizeof err) == 0 && sl_reader_read(r, b, sizeof b, &k) == 0 &&
                 k == sizeof b && memcmp(b, want, k) == 0 && sl_reader_rings_set_up() == before + 1;
        sl_reader_close(r);
        _exit(ok ? 0 : 1);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child took its parent's ring or misread");
    check_read(path, want, 3 * BLOCK + 1, SL_IO_URING, 999);
    cr_assert_eq(sl_reader_rings_set_up(), before, "the parent's idle ring was gone");
    free(want);
}

Test(reader, open_errors_name_the_path)
{
    char err[512], path[128];
    sl_reader_t *r = (sl_reader_t *)1;
    snprintf(path, sizeof path, "%s/missing", dir);
    cr_assert_eq(sl_reader_open(path, NULL, &r, err, sizeof err), -ENOENT);
    cr_assert_null(r);
    cr_assert(strstr(err, path), "%s", err);
    cr_assert_eq(sl_reader_open(dir, NULL, &r, err, sizeof err), -EISDIR);
    cr_assert(strstr(err, dir), "%s", err);
    sl_reader_opts_t o;
    sl_reader_opts_init(&o);
    o.block_size = 100;
    cr_assert_eq(sl_reader_open("/etc/hostname", &o, &r, err, sizeof err), SL_EINVAL);
}

Test(reader, engine_names)
{
    sl_io_engine_t e;
    cr_assert_eq(sl_reader_engine_parse("uring", &e), 0);
    cr_assert_eq(e, SL_IO_URING);
    cr_assert_eq(sl_reader_engine_parse("pread", &e), 0);
    cr_assert_eq(e, SL_IO_PREAD);
    cr_assert_eq(sl_reader_engine_parse("auto", &e), 0);
    cr_assert_eq(e, SL_IO_AUTO);
    cr_assert_eq(sl_reader_engine_parse("mmap", &e), SL_EINVAL);
    cr_assert_str_eq(sl_reader_engine_name(SL_IO_URING), "uring");
    cr_assert_str_eq(sl_reader_engine_name(SL_IO_PREAD), "pread");
}

/*
 * A kernel that refuses io_uring (here a seccomp filter answering ENOSYS to
 * io_uring_setup, as container runtimes do): SL_IO_URING is an error naming
 * the file, SL_IO_AUTO reads with pread and warns once per process. Runs in
 * a child, which the filter cannot outlive; its stderr goes to a file.
 */
static int refused_uring_child(const char *path, const uint8_t *want, size_t n, const char *log)
{
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || dup2(fd, 2) < 0)
        return 10;
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof filter / sizeof filter[0], .filter = filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) < 0)
        return 11;

    sl_reader_opts_t o;
    sl_reader_opts_init(&o);
    o.engine = SL_IO_URING;
    sl_reader_t *r;
    char err[512];
    if (sl_reader_open(path, &o, &r, err, sizeof err) != -ENOSYS || !strstr(err, path) || !strstr(err, "io_uring"))
        return 12;
    o.engine = SL_IO_AUTO;
    uint8_t *got = malloc(n);
    for (int i = 0; i < 2; i++) {
        if (sl_reader_open(path, &o, &r, err, sizeof err) != 0)
            return 13;
        if (sl_reader_engine(r) != SL_IO_PREAD)
            return 14;
        size_t k;
        if (sl_reader_read(r, got, n, &k) != 0 || k != n || memcmp(got, want, n) != 0)
            return 15;
        sl_reader_close(r);
    }
    free(got);
    return 0;
}

Test(reader, auto_falls_back_to_pread_when_io_uring_is_refused)
{
    char path[128], log[128];
    size_t n = 2 * BLOCK + 3;
    uint8_t *want = make_file("fallback", n, path, sizeof path);
    snprintf(log, sizeof log, "%s/stderr", dir);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0)
        _exit(refused_uring_child(path, want, n, log));
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status), "child died");
    cr_assert_eq(WEXITSTATUS(status), 0, "child failed at step %d", WEXITSTATUS(status));

    FILE *f = fopen(log, "r");
    cr_assert_not_null(f);
    char line[1024];
    int warnings = 0;
    while (fgets(line, sizeof line, f))
        warnings += strstr(line, "io_uring is not available") != NULL;
    fclose(f);
    cr_assert_eq(warnings, 1, "the fallback warned %d times", warnings);
    free(want);
}
