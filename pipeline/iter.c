/*
 * iter.c: the iterator base every source and op builds on (iter.h): init
 * and destroy, failures with the op's label, component lookups, seeds. The
 * chain builder is pipeline.c.
 */
#include "iter.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "rng.h"

/* Set by a parallel stage around an element's work on a pool thread
 * (parallel.c); NULL elsewhere. */
_Thread_local char *sl__iter_errbuf;

void sl__iter_init(sl_iter_t *it, const sl_iter_vtbl_t *vt, sl_iter_t *input, sl_iter_ctx_t *ctx, const char *label)
{
    it->vt = vt;
    it->next_bulk = NULL;
    it->input = input;
    it->ctx = ctx;
    snprintf(it->label, sizeof it->label, "%s", label);
    if (input)
        it->spec = input->spec;
    it->elem = NULL;
    it->par_calls = 0;
    it->deterministic = true;
    it->dest = NULL;
    it->dest_stage = NULL;
}

int sl__iter_fail(sl_iter_t *it, int code, const char *fmt, ...)
{
    /* The first failure is the cause; the iterators above it only pass
     * its code on. */
    char *dst = sl__iter_errbuf ? sl__iter_errbuf : it->ctx->errmsg;
    size_t dstlen = sl__iter_errbuf ? SL_ITER_ERRBUF : sizeof it->ctx->errmsg;
    if (dst[0] == '\0') {
        char msg[640];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        snprintf(dst, dstlen, "%s: %s", it->label, msg);
    }
    return code;
}

int sl__iter_charge(sl_iter_t *it, sl_memacct_t *a, size_t bytes, const char *fmt, ...)
{
    if (sl_memacct_charge_wait(a, bytes, &it->ctx->opts.mem_wait))
        return 0;
    char what[160], msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    sl_membudget_refusal(a->budget, bytes, what, msg, sizeof msg);
    return sl__iter_fail(it, SL_ETOOBIG, "%s", msg);
}

int sl__ctx_fail(sl_iter_ctx_t *ctx, int code, const char *label, const char *fmt, ...)
{
    if (ctx->errmsg[0] == '\0') {
        char msg[900];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        snprintf(ctx->errmsg, sizeof ctx->errmsg, "%s: %s", label, msg);
    }
    return code;
}

int sl__spec_find(const sl_element_spec_t *spec, const char *name)
{
    for (uint32_t i = 0; i < spec->num_components; i++) {
        if (strcmp(spec->c[i].name, name) == 0)
            return (int)i;
    }
    return -1;
}

void sl__spec_names(const sl_element_spec_t *spec, char *buf, size_t buflen)
{
    size_t o = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < spec->num_components && o < buflen; i++)
        o += (size_t)snprintf(buf + o, buflen - o, "%s%s", i ? ", " : "", spec->c[i].name);
}

void sl__shape_str(const int64_t *shape, int rank, char *buf, size_t buflen)
{
    size_t o = (size_t)snprintf(buf, buflen, "[");
    for (int d = 0; d < rank && o < buflen; d++)
        o += (size_t)snprintf(buf + o, buflen - o, "%s%" PRId64, d > 0 ? ", " : "", shape[d]);
    if (o < buflen)
        snprintf(buf + o, buflen - o, "]");
}

uint64_t sl__random_seed(const void *salt)
{
    uint64_t x;
    if (getrandom(&x, sizeof x, GRND_NONBLOCK) == (ssize_t)sizeof x)
        return x;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    x = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    x ^= (uint64_t)(uintptr_t)salt;
    return sl_splitmix64(&x);
}

uint64_t sl__epoch_seed(uint64_t seed, uint64_t epoch)
{
    return seed + epoch * UINT64_C(0xd1342543de82ef95);
}

void sl__iter_destroy(sl_iter_t *it)
{
    while (it) {
        sl_iter_t *input = it->input;
        it->vt->destroy(it);
        it = input;
    }
}
