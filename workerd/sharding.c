/*
 * sharding.c: what the static sharding policies change in a pipeline
 * (iter.h). The dispatcher gives each task its worker's index in
 * --worker-addresses and the number of addresses; FILE_OR_DATA arrives
 * here already resolved to FILE or DATA, HINT binds the shard ops whose
 * num_shards is "hint" (ops_basic.c).
 */
#include "iter.h"

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
