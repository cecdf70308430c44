/*
 * counter.h: listing and counting a file source's records off the event
 * loop. A registration whose files must be counted (a gzip file is
 * inflated through: a bomb takes as long as its inflated size) is handed
 * to one counting thread; its result comes back to the loop, which then
 * registers the dataset and answers. Each count is bounded by
 * --count-timeout-ms, and outcomes, failures included, are cached per
 * file (files.h) so that variants of a spec do not count them again.
 */
#ifndef SL_DCOUNTER_H
#define SL_DCOUNTER_H

#include <stdint.h>

#include <event2/event.h>

#include "confine.h"
#include "files.h"
#include "spec.h"

typedef struct sl_dcounter sl_dcounter_t;

/* Called on the loop's thread once a count ended: rc 0 with *files (the
 * callee takes them), or an error with its message. */
typedef void (*sl_dcount_done_fn)(int rc, sl_file_list_t *files, const char *err, void *arg);

/** Starts the counting thread. @return 0 or -errno */
int sl_dcounter_new(struct event_base *base, const sl_confine_t *roots, int max_files, int64_t timeout_ms,
                    sl_dcounter_t **out);

/**
 * Queues the count of spec's files (spec must stay valid and untouched
 * until done is called). done is called exactly once, on the loop, also
 * when the counter is freed first (then with SL_ECANCELLED).
 * @return 0, or SL_ETOOBIG when SL_DCOUNT_MAX_QUEUED counts wait already
 */
int sl_dcounter_submit(sl_dcounter_t *c, const sl_spec_t *spec, sl_dcount_done_fn done, void *arg);

#define SL_DCOUNT_MAX_QUEUED 64

/** Stops the thread (a count in progress is cancelled) and frees c. */
void sl_dcounter_free(sl_dcounter_t *c);

#endif
