/*
 * sharding.c: what the static sharding policies change in a pipeline
 * (iter.h). The dispatcher gives each task its worker's index in
 * --worker-addresses and the number of addresses; FILE_OR_DATA arrives
 * here already resolved to FILE or DATA, HINT binds the shard ops whose
 * num_shards is "hint" (ops_basic.c).
 */
#include "iter.h"

#include <errno.h>
#include <stdlib.h>

#include "posbits.h"

/* Static policies, a restored iterator's job: the source's elements whose
 * position the checkpoint holds are dropped before the shard, so that every
 * worker's stream loses the same elements and the shard still splits the
 * rest between them. */
struct exclude_iter {
    sl_iter_t base;
    const sl_posbits_t *ex;
};

static bool excluded(const sl_posbits_t *ex, const sl_element_t *e)
{
    uint32_t n = sl_prov_count(e);
    if (n == 0)
        return false;
    const sl_provenance_run_t *r = sl_prov_runs(e);
    for (uint32_t i = 0; i < n; i++)
        if (sl_posbits_count(ex, r[i].epoch, r[i].file_index, r[i].begin, r[i].begin + r[i].count) != r[i].count)
            return false;
    return true;
}

static int exclude_next(sl_iter_t *it, sl_element_t *out)
{
    struct exclude_iter *x = (struct exclude_iter *)it;
    for (;;) {
        int rc = it->input->vt->next(it->input, out);
        if (rc != 0 || !excluded(x->ex, out))
            return rc;
        sl__iter_drop(it, out);
    }
}

static int exclude_reset(sl_iter_t *it)
{
    return it->input->vt->reset(it->input);
}

static void exclude_destroy(sl_iter_t *it)
{
    free(it);
}

static const sl_iter_vtbl_t exclude_vtbl = {exclude_next, exclude_reset, exclude_destroy};

int sl__static_exclude_wrap(sl_iter_ctx_t *ctx, sl_iter_t **it)
{
    struct exclude_iter *x = calloc(1, sizeof *x);
    if (!x)
        return -ENOMEM;
    sl__iter_init(&x->base, &exclude_vtbl, *it, ctx, "restored job's exclusions");
    x->ex = ctx->opts.exclude;
    *it = &x->base;
    return 0;
}

int sl__static_shard_wrap(sl_iter_ctx_t *ctx, sl_iter_t **it)
{
    sl_spec_op_t op = {.kind = SL_OP_SHARD};
    op.u.shard.num_shards = (int64_t)ctx->opts.num_workers;
    op.u.shard.index = (int64_t)ctx->opts.worker_index;
    sl_iter_t *out = NULL;
    int rc = sl__op_shard_create(&op, *it, ctx, "DATA sharding", &out);
    if (rc < 0)
        return rc;
    *it = out;
    return 0;
}

bool sl__static_file_is_mine(const sl_iter_ctx_t *ctx, uint64_t file_index)
{
    if (ctx->opts.sharding != SL_SHARDING_FILE)
        return true;
    return file_index % ctx->opts.num_workers == ctx->opts.worker_index;
}
