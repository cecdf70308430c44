/* counter.c: see counter.h. */
#include "counter.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "metrics.h"

struct count_job {
    const sl_spec_t *spec;
    sl_dcount_done_fn done;
    void *arg;
    int rc;
    sl_file_list_t files;
    char err[1024];
    struct count_job *next;
};

struct sl_dcounter {
    struct event_base *base;
    const sl_confine_t *roots;
    int max_files;
    int64_t timeout_ms;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct count_job *queue, **queue_tail; /* waiting for the thread */
    struct count_job *done;                /* ended, for the loop */
    unsigned pending;                      /* queued, counting or done but not yet answered */
    atomic_int stop;
    int pipe[2]; /* the thread wakes the loop through it */
    struct event *wake;
};

static sl_metric_t *m_in_progress, *m_timeouts, *m_cache_hits;

static void metrics_init(void)
{
    m_in_progress = sl_metric_register(SL_METRIC_GAUGE, "sluice_dispatcher_record_counts_in_progress", NULL,
                                       "Registrations whose file records are being counted or wait for it "
                                       "(off the event loop).", NULL, 0);
    m_timeouts = sl_metric_register(SL_METRIC_COUNTER, "sluice_dispatcher_record_count_timeouts_total", NULL,
                                    "Record counts stopped at --count-timeout-ms.", NULL, 0);
    m_cache_hits = sl_metric_register(SL_METRIC_COUNTER, "sluice_dispatcher_record_count_cache_hits_total", NULL,
                                      "Files whose record count came from the cache (same path, size, mtime).",
                                      NULL, 0);
}

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void *count_main(void *arg)
{
    sl_dcounter_t *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->queue && !atomic_load(&c->stop))
            pthread_cond_wait(&c->cv, &c->mu);
        if (atomic_load(&c->stop))
            break;
        struct count_job *j = c->queue;
        c->queue = j->next;
        if (!c->queue)
            c->queue_tail = &c->queue;
        pthread_mutex_unlock(&c->mu);

        sl_count_limit_t lim = {.timeout_ms = c->timeout_ms, .cancel = &c->stop};
        if (c->timeout_ms > 0)
            lim.deadline_ms = mono_ms() + c->timeout_ms;
        uint64_t hits = sl_file_count_cache_hits();
        j->rc = sl_file_list_resolve_bounded(j->spec, c->roots, c->max_files, &lim, &j->files, j->err,
                                             sizeof j->err);
        hits = sl_file_count_cache_hits() - hits;
        sl_metric_add(m_cache_hits, (double)hits);
        if (j->rc == -ETIMEDOUT && hits == 0) { /* not an earlier timeout remembered */
            sl_metric_add(m_timeouts, 1);
            sl_log_warn("%s", j->err);
        }

        pthread_mutex_lock(&c->mu);
        j->next = c->done;
        c->done = j;
        char b = 1;
        if (write(c->pipe[1], &b, 1) < 0) {
            /* Full: a wake-up is pending already. */
        }
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

static struct count_job *reverse(struct count_job *list)
{
    struct count_job *rev = NULL;
    while (list) {
        struct count_job *n = list->next;
        list->next = rev;
        rev = list;
        list = n;
    }
    return rev;
}

/* Answers the ended counts, in the order they ended. */
static void deliver(sl_dcounter_t *c, struct count_job *list)
{
    struct count_job *rev = reverse(list);
    while (rev) {
        struct count_job *j = rev;
        rev = j->next;
        c->pending--;
        sl_metric_add(m_in_progress, -1);
        j->done(j->rc, &j->files, j->err, j->arg);
        sl_file_list_clear(&j->files); /* what the callee did not take */
        free(j);
    }
}

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    sl_dcounter_t *c = arg;
    (void)what;
    char buf[64];
    while (read(fd, buf, sizeof buf) > 0) {
    }
    pthread_mutex_lock(&c->mu);
    struct count_job *list = c->done;
    c->done = NULL;
    pthread_mutex_unlock(&c->mu);
    deliver(c, list);
}

int sl_dcounter_new(struct event_base *base, const sl_confine_t *roots, int max_files, int64_t timeout_ms,
                    sl_dcounter_t **out)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, metrics_init);
    sl_dcounter_t *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    c->base = base;
    c->roots = roots;
    c->max_files = max_files;
    c->timeout_ms = timeout_ms;
    c->queue_tail = &c->queue;
    c->pipe[0] = c->pipe[1] = -1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    int rc = -ENOMEM;
    if (pipe2(c->pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
        rc = -errno;
        goto fail;
    }
    if (!(c->wake = event_new(base, c->pipe[0], EV_READ | EV_PERSIST, on_wake, c)) || event_add(c->wake, NULL) < 0)
        goto fail;
    if ((rc = -pthread_create(&c->thread, NULL, count_main, c)) < 0)
        goto fail;
    pthread_setname_np(c->thread, "sl-count"); /* top -H, perf, gdb (docs/operations.md) */
    c->started = true;
    *out = c;
    return 0;
fail:
    sl_dcounter_free(c);
    return rc;
}

int sl_dcounter_submit(sl_dcounter_t *c, const sl_spec_t *spec, sl_dcount_done_fn done, void *arg)
{
    if (c->pending >= SL_DCOUNT_MAX_QUEUED)
        return SL_ETOOBIG;
    struct count_job *j = calloc(1, sizeof *j);
    if (!j)
        return -ENOMEM;
    *j = (struct count_job){.spec = spec, .done = done, .arg = arg};
    c->pending++;
    sl_metric_add(m_in_progress, 1);
    pthread_mutex_lock(&c->mu);
    *c->queue_tail = j;
    c->queue_tail = &j->next;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return 0;
}

void sl_dcounter_free(sl_dcounter_t *c)
{
    if (!c)
        return;
    if (c->started) {
        pthread_mutex_lock(&c->mu);
        atomic_store(&c->stop, 1); /* also cancels the count in progress (files.h) */
        pthread_cond_signal(&c->cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->thread, NULL);
    }
    /* What never ran is answered as cancelled, after what ended. */
    for (struct count_job *j = c->queue; j; j = j->next) {
        j->rc = SL_ECANCELLED;
        snprintf(j->err, sizeof j->err, "the dispatcher is shutting down");
    }
    struct count_job *ended = c->done, *queued = c->queue;
    c->done = c->queue = NULL;
    deliver(c, ended);
    /* deliver() answers a list in reverse: reverse the queue first. */
    deliver(c, reverse(queued));
    if (c->wake)
        event_free(c->wake);
    for (int i = 0; i < 2; i++)
        if (c->pipe[i] >= 0)
            close(c->pipe[i]);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}
