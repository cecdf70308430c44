/*
 * autotune.h: how a parallel stage whose ops say num_parallel_calls
 * "autotune" chooses its parallelism and its read-ahead depth
 * (docs/dataset-spec.md, "autotune").
 *
 * The decision is a pure function of what the stage measured and what the
 * worker may use, so that it can be tested without timing: parallel.c
 * measures, calls sl_autotune_decide() every SL_AUTOTUNE_WINDOW elements
 * and applies the answer while the stage runs. The CPUs the worker may use
 * are the smaller of its affinity mask and its cgroup's cpu.max quota
 * (rounded up), read again at every decision.
 */
#ifndef SL_AUTOTUNE_H
#define SL_AUTOTUNE_H

#include <stdint.h>

/* Elements between two decisions of a stage. */
#define SL_AUTOTUNE_WINDOW 32
/* Below this work per element (ns), handing an element to another thread
 * and back costs about as much as the work: one thread. */
#define SL_AUTOTUNE_MIN_WORK_NS 10000.0

/** What one decision is made of. */
typedef struct sl_autotune_in {
    unsigned threads;  /* the configured bound: the worker's --threads (>= 1) */
    unsigned cores;    /* CPUs the worker may use; 0: unknown (no bound) */
    uint64_t elements; /* elements behind the means below; fewer than SL_AUTOTUNE_WINDOW: none yet */
    double work_ns;    /* the stage's ops, per element (on whichever thread ran them) */
    double serial_ns;  /* the pipeline thread's other work per element: pulling the stage's
                          input and what the ops after the stage do with its output */
} sl_autotune_in_t;

/** A decision. */
typedef struct sl_autotune_out {
    unsigned parallelism; /* threads that run the stage's ops, the pipeline's own included */
    unsigned depth;       /* elements in flight (pulled, not yet yielded): 2 x parallelism */
} sl_autotune_out_t;

/**
 * The rule. bound = min(threads, cores, 256), at least 1. Before any
 * measurement: bound. Work under SL_AUTOTUNE_MIN_WORK_NS: 1. Else the
 * smallest p with p / (work + serial) >= 1 / serial, i.e.
 * ceil((work + serial) / serial) (p threads cannot yield faster than the
 * pipeline thread's serial part lets them), clamped to [1, bound].
 */
sl_autotune_out_t sl_autotune_decide(const sl_autotune_in_t *in);

/**
 * CPUs from an affinity count and the text of a cgroup v2 cpu.max file
 * ("max 100000", or "QUOTA PERIOD": ceil(QUOTA / PERIOD) CPUs).
 * @param[in] affinity CPUs in the affinity mask; 0: unknown
 * @param[in] cpu_max the file's text, or NULL when there is none; text that
 *            does not parse is ignored
 * @return the smaller of the two, at least 1; 0 when both are unknown
 */
unsigned sl_autotune_cores_from(unsigned affinity, const char *cpu_max);

/** The CPUs this process may use now: sched_getaffinity() and the
 *  cpu.max of its cgroup and every ancestor (the smallest); 0 when
 *  unknown. */
unsigned sl_autotune_cores(void);

#endif
