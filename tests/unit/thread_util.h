/*
 * thread_util.h: whether a thread of this test process goes by a name
 * (pthread_setname_np(), /proc/self/task/TID/comm), for the tests of the
 * names that top -H, perf and gdb show (docs/operations.md).
 */
#ifndef SL_TEST_THREAD_UTIL_H
#define SL_TEST_THREAD_UTIL_H

#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/** @return how many threads of this process are named name */
static inline int threads_named(const char *name)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
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

/** Waits (up to 10 s) until no thread of this process is named name: a
 *  thread just joined may still be listed for a moment. @return how many are */
static inline int threads_named_gone(const char *name)
{
    int n = threads_named(name);
    for (int i = 0; i < 1000 && n > 0; i++) {
        struct timespec ms10 = {0, 10 * 1000 * 1000};
        nanosleep(&ms10, NULL);
        n = threads_named(name);
    }
    return n;
}

#endif
