/* metrics.c: see metrics.h. */
#include "metrics.h"

#include <math.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#define MAX_METRICS 128

/* Values are doubles kept as their bit patterns in 64-bit atomics, so that
 * a reader never sees a torn value. */
struct sl_metric {
    enum sl_metric_kind kind;
    char name[96];
    char labels[96];
    char help[160];
    _Atomic uint64_t value; /* counter, gauge: a double's bits */
    int num_buckets;
    double bounds[SL_METRIC_MAX_BUCKETS];
    _Atomic uint64_t buckets[SL_METRIC_MAX_BUCKETS + 1]; /* the last is +Inf */
    _Atomic uint64_t sum;                                 /* a double's bits */
};

static struct sl_metric metrics[MAX_METRICS];
static int num_metrics;
static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;

const double sl_metric_latency_buckets[] = {0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10};
const int sl_metric_latency_buckets_count = sizeof sl_metric_latency_buckets / sizeof sl_metric_latency_buckets[0];

static double bits_to_double(uint64_t b)
{
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

static uint64_t double_to_bits(double d)
{
    uint64_t b;
    memcpy(&b, &d, sizeof b);
    return b;
}

static void atomic_add_double(_Atomic uint64_t *p, double v)
{
    uint64_t old = atomic_load_explicit(p, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(p, &old, double_to_bits(bits_to_double(old) + v),
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
}

sl_metric_t *sl_metric_register(enum sl_metric_kind kind, const char *name, const char *labels, const char *help,
                                const double *buckets, int num_buckets)
{
    if (num_buckets > SL_METRIC_MAX_BUCKETS)
        return NULL;
    pthread_mutex_lock(&registry_mu);
    sl_metric_t *m = NULL;
    if (num_metrics < MAX_METRICS) {
        m = &metrics[num_metrics++];
        memset(m, 0, sizeof *m);
        m->kind = kind;
        snprintf(m->name, sizeof m->name, "%s", name);
        snprintf(m->labels, sizeof m->labels, "%s", labels ? labels : "");
        snprintf(m->help, sizeof m->help, "%s", help);
        m->num_buckets = buckets ? num_buckets : 0;
        if (buckets)
            memcpy(m->bounds, buckets, sizeof(double) * (size_t)num_buckets);
    }
    pthread_mutex_unlock(&registry_mu);
    return m;
}

void sl_metric_add(sl_metric_t *m, double v)
{
    if (m)
        atomic_add_double(&m->value, v);
}

void sl_metric_set(sl_metric_t *m, double v)
{
    if (m)
        atomic_store_explicit(&m->value, double_to_bits(v), memory_order_relaxed);
}

void sl_metric_observe(sl_metric_t *m, double v)
{
    if (!m)
        return;
    int i = 0;
    while (i < m->num_buckets && v > m->bounds[i])
        i++;
    atomic_fetch_add_explicit(&m->buckets[i], 1, memory_order_relaxed);
    atomic_add_double(&m->sum, v);
}

double sl_metric_value(const sl_metric_t *m)
{
    return m ? bits_to_double(atomic_load_explicit(&m->value, memory_order_relaxed)) : 0;
}

static void print_number(struct evbuffer *out, double v)
{
    if (isinf(v))
        evbuffer_add_printf(out, v > 0 ? "+Inf" : "-Inf");
    else
        evbuffer_add_printf(out, "%.17g", v);
}

/* name{labels,extra} */
static void print_series(struct evbuffer *out, const sl_metric_t *m, const char *suffix, const char *extra)
{
    evbuffer_add_printf(out, "%s%s", m->name, suffix);
    if (m->labels[0] || extra)
        evbuffer_add_printf(out, "{%s%s%s}", m->labels, m->labels[0] && extra ? "," : "", extra ? extra : "");
    evbuffer_add_printf(out, " ");
}

void sl_metrics_render(struct evbuffer *out)
{
    static const char *types[] = {"counter", "gauge", "histogram"};
    pthread_mutex_lock(&registry_mu);
    int n = num_metrics;
    pthread_mutex_unlock(&registry_mu);
    for (int i = 0; i < n; i++) {
        const sl_metric_t *m = &metrics[i];
        bool first = true;
        for (int k = 0; k < i; k++)
            first &= strcmp(metrics[k].name, m->name) != 0;
        if (first)
            evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s %s\n", m->name, m->help, m->name, types[m->kind]);
        if (m->kind != SL_METRIC_HISTOGRAM) {
            print_series(out, m, "", NULL);
            print_number(out, sl_metric_value(m));
            evbuffer_add_printf(out, "\n");
            continue;
        }
        uint64_t cum = 0;
        for (int b = 0; b <= m->num_buckets; b++) {
            char le[48];
            cum += atomic_load_explicit(&m->buckets[b], memory_order_relaxed);
            if (b < m->num_buckets)
                snprintf(le, sizeof le, "le=\"%.6g\"", m->bounds[b]);
            else
                snprintf(le, sizeof le, "le=\"+Inf\"");
            print_series(out, m, "_bucket", le);
            evbuffer_add_printf(out, "%llu\n", (unsigned long long)cum);
        }
        print_series(out, m, "_sum", NULL);
        print_number(out, bits_to_double(atomic_load_explicit(&m->sum, memory_order_relaxed)));
        evbuffer_add_printf(out, "\n");
        print_series(out, m, "_count", NULL);
        evbuffer_add_printf(out, "%llu\n", (unsigned long long)cum);
    }
}
