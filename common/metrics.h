/*
 * metrics.h: counters, gauges and histograms, rendered in the Prometheus
 * text format for GET /metrics. Metrics are registered once at start-up
 * into a fixed-size registry; updating one is a relaxed atomic operation,
 * safe from any thread.
 */
#ifndef SL_METRICS_H
#define SL_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include <event2/buffer.h>

typedef struct sl_metric sl_metric_t;

enum sl_metric_kind { SL_METRIC_COUNTER, SL_METRIC_GAUGE, SL_METRIC_HISTOGRAM };

/* Histogram buckets: upper bounds in the metric's unit, ascending. */
#define SL_METRIC_MAX_BUCKETS 16

/**
 * Registers a metric. name must follow Prometheus rules; labels is either
 * NULL or a label set written as in the text format ("engine=\"uring\"").
 * Metrics that share a name (and differ in labels) share HELP and TYPE.
 * @param[in] buckets histogram upper bounds (num_buckets of them), else NULL
 * @return the metric, valid for the life of the process, or NULL when the
 *         registry is full
 */
sl_metric_t *sl_metric_register(enum sl_metric_kind kind, const char *name, const char *labels, const char *help,
                                const double *buckets, int num_buckets);

/** Adds v to a counter or gauge. */
void sl_metric_add(sl_metric_t *m, double v);

/** Sets a gauge. */
void sl_metric_set(sl_metric_t *m, double v);

/** Records one observation in a histogram. */
void sl_metric_observe(sl_metric_t *m, double v);

/** @return a counter's or gauge's current value */
double sl_metric_value(const sl_metric_t *m);

/** Appends every registered metric in the Prometheus text format (0.0.4). */
void sl_metrics_render(struct evbuffer *out);

/** Bucket bounds for latencies in seconds, 100 us to 10 s. */
extern const double sl_metric_latency_buckets[];
extern const int sl_metric_latency_buckets_count;

#endif
