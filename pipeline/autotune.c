/*
 * autotune.c: the decision of an autotuned parallel stage and the CPUs the
 * worker may use (autotune.h).
 */
#include "autotune.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PARALLELISM 256 /* SL_SPEC_MAX_PARALLEL */

sl_autotune_out_t sl_autotune_decide(const sl_autotune_in_t *in)
{
    unsigned bound = in->threads ? in->threads : 1;
    if (in->cores && in->cores < bound)
        bound = in->cores;
    if (bound > MAX_PARALLELISM)
        bound = MAX_PARALLELISM;
    unsigned p = bound;
    if (in->elements >= SL_AUTOTUNE_WINDOW) {
        if (!(in->work_ns >= SL_AUTOTUNE_MIN_WORK_NS)) {
            p = 1;
        } else if (in->serial_ns > 0) {
            double need = ceil((in->work_ns + in->serial_ns) / in->serial_ns);
            p = need >= (double)bound ? bound : need < 1 ? 1 : (unsigned)need;
        }
    }
    return (sl_autotune_out_t){p, 2 * p};
}

unsigned sl_autotune_cores_from(unsigned affinity, const char *cpu_max)
{
    unsigned cores = affinity;
    if (cpu_max) {
        char quota[32];
        unsigned long long period;
        if (sscanf(cpu_max, "%31s %llu", quota, &period) == 2 && period > 0 && strcmp(quota, "max") != 0) {
            char *end;
            errno = 0;
            unsigned long long q = strtoull(quota, &end, 10);
            if (errno == 0 && *end == '\0' && q > 0 && quota[0] != '-') {
                unsigned long long c = (q + period - 1) / period;
                if (c > 65536)
                    c = 65536;
                if (!cores || c < cores)
                    cores = (unsigned)c;
            }
        }
    }
    return cores;
}

static unsigned cores_of_cgroup_file(unsigned cores, const char *path)
{
    char buf[128];
    FILE *f = fopen(path, "re");
    if (!f)
        return cores;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return sl_autotune_cores_from(cores, buf);
}

unsigned sl_autotune_cores(void)
{
    unsigned cores = 0;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        cores = (unsigned)CPU_COUNT(&set);
    /* cgroup v2: "0::/path" in /proc/self/cgroup; the quota of the cgroup
     * and of each ancestor applies. */
    char line[512], path[700];
    FILE *f = fopen("/proc/self/cgroup", "re");
    bool found = false;
    if (f) {
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "0::", 3) != 0)
                continue;
            line[strcspn(line, "\n")] = '\0';
            char *rel = line + 3;
            for (;;) {
                snprintf(path, sizeof path, "/sys/fs/cgroup%s/cpu.max", strcmp(rel, "/") == 0 ? "" : rel);
                cores = cores_of_cgroup_file(cores, path);
                char *slash = strrchr(rel, '/');
                if (!slash || slash == rel)
                    break;
                *slash = '\0';
            }
            found = true;
            break;
        }
        fclose(f);
    }
    if (!found)
        cores = cores_of_cgroup_file(cores, "/sys/fs/cgroup/cpu.max");
    return cores;
}
