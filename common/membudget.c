/*
 * membudget.c: a memory budget and its accounts (membudget.h).
 */
#include "membudget.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "deadline.h"
#include "log.h"
#include "metrics.h"

void sl_membudget_init(sl_membudget_t *b, size_t limit, const char *option)
{
    *b = (sl_membudget_t){.limit = limit, .option = option};
    pthread_mutex_init(&b->wait_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&b->wait_cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&b->shares_mu, NULL);
}

void sl_membudget_init_share(sl_membudget_t *s, sl_membudget_t *parent, const char *label)
{
    *s = (sl_membudget_t){.limit = parent->limit, .option = parent->option, .parent = parent};
    snprintf(s->label, sizeof s->label, "%s", label);
    pthread_mutex_lock(&parent->shares_mu);
    s->next_share = parent->shares;
    if (parent->shares)
        parent->shares->prev_share = s;
    parent->shares = s;
    pthread_mutex_unlock(&parent->shares_mu);
}

void sl_membudget_share_done(sl_membudget_t *s)
{
    sl_membudget_t *p = s->parent;
    pthread_mutex_lock(&p->shares_mu);
    if (s->prev_share)
        s->prev_share->next_share = s->next_share;
    else
        p->shares = s->next_share;
    if (s->next_share)
        s->next_share->prev_share = s->prev_share;
    pthread_mutex_unlock(&p->shares_mu);
    size_t left = __atomic_exchange_n(&s->used, 0, __ATOMIC_RELAXED);
    if (left > 0) /* an owner's charge it never gave back: a bug, but not a lasting loss of room */
        sl_log_error("%s ends holding %zu bytes of the memory budget it did not give back; given back now", s->label,
                     left);
    sl_membudget_release(p, left);
}

/* A share's part grows by bytes its budget just took. */
static void share_add(sl_membudget_t *s, size_t bytes)
{
    __atomic_add_fetch(&s->used, bytes, __ATOMIC_RELAXED);
}

void sl_membudget_hand_over(sl_membudget_t *s, size_t bytes)
{
    if (s && s->parent && bytes > 0)
        __atomic_sub_fetch(&s->used, bytes, __ATOMIC_RELAXED);
}

/* The budget b's charges go to: its own, or a share's. */
static sl_membudget_t *top(sl_membudget_t *b)
{
    return b && b->parent ? b->parent : b;
}

/* Charges bytes, counting a refusal only when count is set (a granule
 * that does not fit is no refusal: the exact charge is tried next). */
static bool charge(sl_membudget_t *b, size_t bytes, bool count)
{
    if (!b)
        return true;
    if (b->parent) {
        if (!charge(b->parent, bytes, count))
            return false;
        share_add(b, bytes);
        return true;
    }
    size_t used = __atomic_load_n(&b->used, __ATOMIC_RELAXED);
    do {
        if (used > b->limit || bytes > b->limit - used) {
            if (count) {
                __atomic_add_fetch(&b->refusals, 1, __ATOMIC_RELAXED);
                if (b->m_refusals)
                    sl_metric_add(b->m_refusals, 1);
            }
            return false;
        }
    } while (!__atomic_compare_exchange_n(&b->used, &used, used + bytes, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    if (b->m_charged)
        sl_metric_add(b->m_charged, (double)bytes);
    return true;
}

/* A charge that does not fit at once: memory held only for reuse goes
 * first, then the charge once more, a refusal counted when count is set. */
static bool charge_reclaim(sl_membudget_t *b, size_t bytes, bool count)
{
    if (charge(b, bytes, false))
        return true;
    sl_membudget_t *root = top(b); /* a share's memory held for reuse is its budget's */
    if (root->reclaim)
        root->reclaim();
    return charge(b, bytes, count);
}

bool sl_membudget_charge(sl_membudget_t *b, size_t bytes)
{
    return charge_reclaim(b, bytes, true);
}

bool sl_membudget_try_charge(sl_membudget_t *b, size_t bytes)
{
    return charge_reclaim(b, bytes, false);
}

static bool flag_set(const bool *flag)
{
    return flag && __atomic_load_n(flag, __ATOMIC_ACQUIRE);
}

bool sl_memwait_cancelled(const sl_memwait_t *w)
{
    for (; w; w = w->up) /* as deep as prefetches nest in one spec */
        if (flag_set(w->cancel))
            return true;
    return false;
}

void sl_membudget_count_wait(sl_membudget_t *b)
{
    b = top(b);
    if (!b)
        return;
    __atomic_add_fetch(&b->waits, 1, __ATOMIC_RELAXED);
    if (b->m_waits)
        sl_metric_add(b->m_waits, 1);
}

static bool own_out(const sl_memwait_t *w)
{
    return w && w->own && __atomic_load_n(w->own, __ATOMIC_ACQUIRE) > 0;
}

static bool overdraw(const sl_memwait_t *w)
{
    return w && flag_set(w->overdraw);
}

/* Charges bytes whatever the limit (sl_memwait_t.overdraw). */
static void charge_over(sl_membudget_t *b, size_t bytes)
{
    if (b->parent) {
        charge_over(b->parent, bytes);
        share_add(b, bytes);
        return;
    }
    __atomic_add_fetch(&b->used, bytes, __ATOMIC_RELAXED);
    if (b->m_charged)
        sl_metric_add(b->m_charged, (double)bytes);
}

bool sl_membudget_charge_wait(sl_membudget_t *b, size_t bytes, const sl_memwait_t *w)
{
    if (b && b->parent) {
        if (!sl_membudget_charge_wait(b->parent, bytes, w))
            return false;
        share_add(b, bytes);
        return true;
    }
    if (!b || sl_membudget_try_charge(b, bytes))
        return true;
    if (sl_memwait_cancelled(w))
        return false; /* no refusal: its owner stops */
    if (overdraw(w)) {
        charge_over(b, bytes);
        return true;
    }
    if (b->wait_ms == 0 || bytes > b->limit)
        return charge(b, bytes, true);
    sl_membudget_count_wait(b);
    struct timespec until = sl_deadline_after(CLOCK_MONOTONIC, b->wait_ms);
    bool ok = false;
    pthread_mutex_lock(&b->wait_mu);
    /* Counted as a waiter before the charge is tried again: a release
     * after that try sees the count and wakes this thread. */
    __atomic_add_fetch(&b->waiters, 1, __ATOMIC_SEQ_CST);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    for (;;) {
        if ((ok = charge(b, bytes, false)) || sl_memwait_cancelled(w))
            break;
        if (overdraw(w)) {
            charge_over(b, bytes);
            ok = true;
            break;
        }
        if (b->reclaim) {
            /* Blocks kept for reuse (big_alloc.h) fill the budget as the
             * batches that held them come back while this waits: they go
             * first. Without wait_mu, which giving them back takes to wake
             * the waiters. */
            pthread_mutex_unlock(&b->wait_mu);
            b->reclaim();
            pthread_mutex_lock(&b->wait_mu);
            if ((ok = charge(b, bytes, false)))
                break;
        }
        if (pthread_cond_timedwait(&b->wait_cv, &b->wait_mu, &until) != 0) {
            if ((ok = charge(b, bytes, false)))
                break;
            if (!own_out(w))
                break;
            /* The owner's own batches hold memory that comes back as its
             * consumer reads them: wait on, another wait_ms. */
            until = sl_deadline_after(CLOCK_MONOTONIC, b->wait_ms);
        }
    }
    __atomic_sub_fetch(&b->waiters, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&b->wait_mu);
    return ok || (!sl_memwait_cancelled(w) && charge_reclaim(b, bytes, true));
}

void sl_membudget_wake(sl_membudget_t *b)
{
    b = top(b);
    if (!b)
        return;
    pthread_mutex_lock(&b->wait_mu);
    pthread_cond_broadcast(&b->wait_cv);
    pthread_mutex_unlock(&b->wait_mu);
}

bool sl_membudget_charge_spare(sl_membudget_t *b, size_t bytes)
{
    return charge(b, bytes, false);
}

void sl_membudget_release(sl_membudget_t *b, size_t bytes)
{
    if (!b || bytes == 0)
        return;
    if (b->parent) {
        __atomic_sub_fetch(&b->used, bytes, __ATOMIC_RELAXED);
        sl_membudget_release(b->parent, bytes);
        return;
    }
    __atomic_sub_fetch(&b->used, bytes, __ATOMIC_SEQ_CST);
    if (b->m_charged)
        sl_metric_add(b->m_charged, -(double)bytes);
    if (__atomic_load_n(&b->waiters, __ATOMIC_SEQ_CST) > 0)
        sl_membudget_wake(b);
}

size_t sl_membudget_used(const sl_membudget_t *b)
{
    return b ? __atomic_load_n(&b->used, __ATOMIC_RELAXED) : 0;
}

/* Appends to buf (len bytes, at used of them) who holds root: the three
 * shares that hold most, self among them named "this task", then the rest. */
static void holders(sl_membudget_t *root, const sl_membudget_t *self, char *buf, size_t len, size_t at)
{
    const sl_membudget_t *top3[3] = {NULL, NULL, NULL};
    size_t held[3] = {0, 0, 0}, listed = 0;
    pthread_mutex_lock(&root->shares_mu);
    for (const sl_membudget_t *s = root->shares; s; s = s->next_share) {
        size_t u = __atomic_load_n(&s->used, __ATOMIC_RELAXED);
        for (int k = 0; k < 3; k++)
            if (u > 0 && (!top3[k] || u > held[k])) {
                for (int m = 2; m > k; m--) {
                    top3[m] = top3[m - 1];
                    held[m] = held[m - 1];
                }
                top3[k] = s;
                held[k] = u;
                break;
            }
    }
    for (int k = 0; k < 3 && top3[k] && at < len; k++) {
        at += (size_t)snprintf(buf + at, len - at, "%s %s %.1f MiB", k == 0 ? "; held now by" : ",",
                               top3[k] == self ? "this task" : top3[k]->label, (double)held[k] / (1 << 20));
        listed += held[k];
    }
    pthread_mutex_unlock(&root->shares_mu);
    size_t used = sl_membudget_used(root), rest = used > listed ? used - listed : 0;
    if (at < len && listed > 0 && rest > 0)
        snprintf(buf + at, len - at, ", others %.1f MiB", (double)rest / (1 << 20));
}

void sl_membudget_refusal(sl_membudget_t *b, size_t bytes, const char *what, char *buf, size_t buflen)
{
    sl_membudget_t *root = top(b);
    size_t limit = root ? root->limit : 0, used = sl_membudget_used(root);
    size_t left = used < limit ? limit - used : 0;
    int n = snprintf(buf, buflen,
                     "needs %zu bytes (%.1f MiB) for %s, but the worker's memory budget of %zu bytes (%.1f MiB) has "
                     "%zu bytes left (%s)",
                     bytes, (double)bytes / (1 << 20), what, limit, (double)limit / (1 << 20), left,
                     root && root->option ? root->option : "the memory budget");
    if (root && n > 0 && (size_t)n < buflen)
        holders(root, b, buf, buflen, (size_t)n);
}

/* The cgroup v2 limit of this process, or 0 when there is none. */
static size_t cgroup_limit(void)
{
    FILE *f = fopen("/sys/fs/cgroup/memory.max", "r");
    if (!f)
        return 0;
    char line[64] = "";
    size_t v = 0;
    if (fgets(line, sizeof line, f)) {
        char *end;
        unsigned long long x = strtoull(line, &end, 10);
        if (end != line && (*end == '\n' || *end == '\0'))
            v = (size_t)x;
    }
    fclose(f);
    return v;
}

size_t sl_membudget_default_limit(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    size_t phys = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : (size_t)4 << 30;
    size_t cg = cgroup_limit();
    if (cg > 0 && cg < phys)
        phys = cg;
    return phys / 2;
}

static size_t round_up(size_t x)
{
    return (x + SL_MEMACCT_GRANULE - 1) & ~(SL_MEMACCT_GRANULE - 1);
}

bool sl__memacct_reserve(sl_memacct_t *a, size_t bytes, sl_memacct_how_t how, const sl_memwait_t *w)
{
    size_t want;
    if (__builtin_add_overflow(a->held, bytes, &want)) {
        if (a->budget)
            __atomic_add_fetch(&top(a->budget)->refusals, 1, __ATOMIC_RELAXED);
        return false;
    }
    if (!a->budget) {
        a->held = a->reserved = want;
        return true;
    }
    /* A granule more than needed, so that the next charges are additions;
     * near the limit exactly what is needed. */
    size_t grown = want <= SIZE_MAX - SL_MEMACCT_GRANULE ? round_up(want) : want;
    if (grown > a->reserved && charge(a->budget, grown - a->reserved, false)) {
        a->reserved = grown;
    } else if (how == SL_MEMACCT_WAIT  ? sl_membudget_charge_wait(a->budget, want - a->reserved, w)
               : how == SL_MEMACCT_TRY ? sl_membudget_try_charge(a->budget, want - a->reserved)
                                       : sl_membudget_charge(a->budget, want - a->reserved)) {
        a->reserved = want;
    } else {
        return false;
    }
    a->held = want;
    return true;
}

void sl_memacct_release(sl_memacct_t *a, size_t bytes)
{
    if (bytes > a->held)
        bytes = a->held;
    a->held -= bytes;
    if (a->reserved - a->held > 2 * SL_MEMACCT_GRANULE) {
        size_t keep = a->budget ? round_up(a->held) : a->held;
        sl_membudget_release(a->budget, a->reserved - keep);
        a->reserved = keep;
    }
}

void sl_memacct_trim(sl_memacct_t *a)
{
    if (a->reserved > a->held) {
        sl_membudget_release(a->budget, a->reserved - a->held);
        a->reserved = a->held;
    }
}

void sl_memacct_release_all(sl_memacct_t *a)
{
    sl_membudget_release(a->budget, a->reserved);
    a->held = a->reserved = 0;
}
