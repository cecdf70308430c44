/*
 * test_autotune.c: the decision of an autotuned parallel stage
 * (pipeline/autotune.c) from given measurements and CPUs, and the CPUs
 * read from an affinity count and a cgroup cpu.max text. No timing: every
 * input is given.
 */
#include <criterion/criterion.h>

#include "autotune.h"

static sl_autotune_out_t decide(unsigned threads, unsigned cores, uint64_t elements, double work_us, double serial_us)
{
    sl_autotune_in_t in = {.threads = threads,
                           .cores = cores,
                           .elements = elements,
                           .work_ns = work_us * 1000,
                           .serial_ns = serial_us * 1000};
    return sl_autotune_decide(&in);
}

Test(autotune, before_measuring_as_wide_as_allowed)
{
    cr_assert_eq(decide(8, 0, 0, 0, 0).parallelism, 8, "no CPU bound known: --threads");
    cr_assert_eq(decide(8, 2, 0, 0, 0).parallelism, 2, "two CPUs");
    cr_assert_eq(decide(2, 16, SL_AUTOTUNE_WINDOW - 1, 5000, 1).parallelism, 2, "--threads bounds");
    cr_assert_eq(decide(1, 16, 0, 0, 0).parallelism, 1);
    cr_assert_eq(decide(0, 0, 0, 0, 0).parallelism, 1, "0 threads is taken as 1");
    cr_assert_eq(decide(1000, 0, 0, 0, 0).parallelism, 256, "at most 256, the largest num_parallel_calls");
}

Test(autotune, heavy_work_takes_every_core)
{
    /* A JPEG stage: 1 ms of decoding per image, 60 us of batching it. */
    sl_autotune_out_t d = decide(8, 4, 64, 1000, 60);
    cr_assert_eq(d.parallelism, 4);
    cr_assert_eq(d.depth, 8, "twice the parallelism in flight");
    cr_assert_eq(decide(8, 16, 64, 1000, 60).parallelism, 8, "--threads bounds");
    cr_assert_eq(decide(8, 16, 64, 1000, 0).parallelism, 8, "no serial part at all: the bound");
}

Test(autotune, serial_part_limits_the_threads_worth_having)
{
    /* (work + serial) / serial threads keep up with the pipeline thread. */
    cr_assert_eq(decide(16, 16, 64, 300, 100).parallelism, 4);
    cr_assert_eq(decide(16, 16, 64, 300, 150).parallelism, 3);
    cr_assert_eq(decide(16, 16, 64, 301, 100).parallelism, 5, "rounded up");
    cr_assert_eq(decide(16, 16, 64, 20, 1000).parallelism, 2, "any useful work: one pool thread");
    cr_assert_eq(decide(16, 3, 64, 300, 100).parallelism, 3, "the CPUs bound");
    cr_assert_eq(decide(16, 16, 64, 300, 100).depth, 8);
}

Test(autotune, cheap_work_stays_on_one_thread)
{
    sl_autotune_out_t d = decide(8, 8, 64, 2, 1);
    cr_assert_eq(d.parallelism, 1, "2 us of work: not worth a hand-off");
    cr_assert_eq(d.depth, 2);
    cr_assert_eq(decide(8, 8, 64, SL_AUTOTUNE_MIN_WORK_NS / 1000 - 0.001, 0).parallelism, 1);
    cr_assert_eq(decide(8, 8, 64, SL_AUTOTUNE_MIN_WORK_NS / 1000, 0).parallelism, 8);
}

Test(autotune, decisions_stay_within_bounds)
{
    /* Whatever the measurements, 1 <= parallelism <= min(threads, cores). */
    const double us[] = {0, 0.5, 9.9, 10, 11, 100, 1e3, 1e6, 1e9};
    for (unsigned threads = 1; threads <= 6; threads++) {
        for (unsigned cores = 0; cores <= 6; cores++) {
            unsigned bound = cores && cores < threads ? cores : threads;
            for (size_t a = 0; a < sizeof us / sizeof us[0]; a++) {
                for (size_t b = 0; b < sizeof us / sizeof us[0]; b++) {
                    sl_autotune_out_t d = decide(threads, cores, 1000, us[a], us[b]);
                    cr_assert(d.parallelism >= 1 && d.parallelism <= bound, "threads %u cores %u: %u", threads,
                              cores, d.parallelism);
                    cr_assert_eq(d.depth, 2 * d.parallelism);
                }
            }
        }
    }
}

Test(autotune, cores_from_affinity_and_cpu_max)
{
    cr_assert_eq(sl_autotune_cores_from(8, NULL), 8);
    cr_assert_eq(sl_autotune_cores_from(8, "max 100000\n"), 8, "no quota");
    cr_assert_eq(sl_autotune_cores_from(8, "200000 100000\n"), 2);
    cr_assert_eq(sl_autotune_cores_from(8, "150000 100000\n"), 2, "1.5 CPUs: 2 threads may use them");
    cr_assert_eq(sl_autotune_cores_from(8, "50000 100000\n"), 1);
    cr_assert_eq(sl_autotune_cores_from(2, "400000 100000\n"), 2, "the affinity is smaller");
    cr_assert_eq(sl_autotune_cores_from(0, "300000 100000"), 3, "affinity unknown");
    cr_assert_eq(sl_autotune_cores_from(0, NULL), 0, "nothing known");
    cr_assert_eq(sl_autotune_cores_from(4, "garbage"), 4, "text that does not parse is ignored");
    cr_assert_eq(sl_autotune_cores_from(4, "-5 100000"), 4);
    cr_assert_eq(sl_autotune_cores_from(4, "100000 0"), 4);
    cr_assert_eq(sl_autotune_cores_from(4, "12x 100000"), 4);
}

Test(autotune, cores_of_this_process)
{
    /* At least one, at most what the kernel says the affinity mask has. */
    unsigned c = sl_autotune_cores();
    cr_assert_geq(c, 1);
    cr_assert_leq(c, 4096);
}
