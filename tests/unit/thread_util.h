/*
 * thread_util.h: the threads of this test process, all of them or those
 * that go by a name (pthread_setname_np(), /proc/self/task/TID/comm): for
 * the tests of pools that must join their threads and of the names that
 * top -H, perf and gdb show (docs/operations.md).
 */
#ifndef SL_TEST_THREAD_UTIL_H
#define SL_TEST_THREAD_UTIL_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/** @return how many threads this process has named name (NULL: any name) */
static inline int threads_named(const char *name)
{
    DIR *d = opendir("/proc/self/task");
    cr_assert_not_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (!name) {
            n++;
            continue;
        }
        char path[300], comm[32] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue; /* the thread ended meanwhile */
        if (fgets(comm, sizeof comm, f))
            comm[strcspn(comm, "\n")] = '\0';
        fclose(f);
        n += strcmp(comm, name) == 0;
    }
    closedir(d);
    return n;
}

/* Threads named name (NULL: any) once there are want of them again, after
 * joins. pthread_join() returns when a thread has exited, but the kernel
 * may list it under /proc/self/task a moment longer (it is reaped after
 * the join's wake-up): so this waits for the count, at most 10 s, and
 * returns the last count it saw (the caller's assert then says how many
 * are left). */
static inline int threads_settle_to(const char *name, int want)
{
    int n = threads_named(name);
    for (int i = 0; i < 10000 && n != want; i++) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
        n = threads_named(name);
    }
    return n;
}

#endif
