/*
 * gather.c: see gather.h. The frames' parts are one iovec list, in order;
 * a frame knows its first iovec, how many it has, which of them point into
 * the copied bytes, and its release.
 */
#include "gather.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct frame {
    unsigned iov0, niov;
    uint32_t copied; /* bit k: iovec iov0 + k points into bytes[] */
    size_t len;
    sl_gather_release_t release;
};

struct sl_gather {
    unsigned nframes, niov;
    size_t used; /* of bytes[] */
    size_t len;  /* of the frames together */
    struct frame f[SL_GATHER_FRAMES];
    struct iovec iov[SL_GATHER_IOV];
    uint8_t bytes[SL_GATHER_BYTES];
};

sl_gather_t *sl_gather_new(void)
{
    return calloc(1, sizeof(sl_gather_t));
}

static void run(const sl_gather_release_t *r)
{
    if (r->fn)
        r->fn(r->payload, r->payload_len, r->extra);
}

void sl_gather_free(sl_gather_t *g)
{
    if (!g)
        return;
    /* Released as if written: a drain of all its bytes hands nothing on. */
    sl_gather_drain(g, g->len, NULL, NULL);
    free(g);
}

int sl_gather_add(sl_gather_t *g, const sl_gather_part_t *parts, int n, const sl_gather_release_t *release)
{
    unsigned niov = 0;
    size_t copy = 0;
    for (int i = 0; i < n; i++) {
        if (parts[i].n == 0)
            continue;
        niov++;
        if (parts[i].copy)
            copy += parts[i].n;
    }
    if (n > SL_GATHER_PARTS || g->nframes == SL_GATHER_FRAMES || g->niov + niov > SL_GATHER_IOV ||
        copy > SL_GATHER_BYTES - g->used)
        return -ENOSPC;
    struct frame *f = &g->f[g->nframes++];
    *f = (struct frame){.iov0 = g->niov, .release = *release};
    for (int i = 0; i < n; i++) {
        if (parts[i].n == 0)
            continue;
        void *p = (void *)parts[i].p;
        if (parts[i].copy) {
            p = memcpy(g->bytes + g->used, parts[i].p, parts[i].n);
            g->used += parts[i].n;
            f->copied |= UINT32_C(1) << f->niov;
        }
        g->iov[g->niov++] = (struct iovec){.iov_base = p, .iov_len = parts[i].n};
        f->niov++;
        f->len += parts[i].n;
    }
    g->len += f->len;
    return 0;
}

unsigned sl_gather_frames(const sl_gather_t *g)
{
    return g->nframes;
}

size_t sl_gather_bytes(const sl_gather_t *g)
{
    return g->len;
}

int sl_gather_iov(const sl_gather_t *g, const struct iovec **iov)
{
    *iov = g->iov;
    return (int)g->niov;
}

void sl_gather_drain(sl_gather_t *g, size_t written, sl_gather_rest_fn rest, void *arg)
{
    sl_gather_release_t done[SL_GATHER_FRAMES];
    unsigned ndone = 0, n = g->nframes;
    for (unsigned i = 0; i < n; i++) {
        struct frame *f = &g->f[i];
        if (written >= f->len) {
            written -= f->len;
            done[ndone++] = f->release;
            continue;
        }
        sl_gather_part_t parts[SL_GATHER_PARTS];
        for (unsigned k = 0; k < f->niov; k++) {
            const struct iovec *v = &g->iov[f->iov0 + k];
            parts[k] = (sl_gather_part_t){v->iov_base, v->iov_len, (f->copied >> k) & 1};
        }
        rest(arg, parts, (int)f->niov, written, &f->release);
        written = 0;
    }
    g->nframes = g->niov = 0;
    g->used = g->len = 0;
    for (unsigned i = 0; i < ndone; i++)
        run(&done[i]);
}
