/* policy.c: see policy.h. */
#include "policy.h"

#include <stdio.h>
#include <string.h>

int sl_policy_hint_op(const sl_spec_t *spec)
{
    for (int i = 0; i < sl_spec_num_ops(spec); i++) {
        const sl_spec_op_t *op = sl_spec_op(spec, i);
        if (op->kind == SL_OP_SHARD && op->u.shard.num_shards == SL_SPEC_SHARD_HINT)
            return i;
    }
    return -1;
}

bool sl_policy_infinite(const sl_spec_t *spec, long long known_elements)
{
    if (known_elements == 0)
        return false;
    bool infinite = false;
    for (int i = 0; i < sl_spec_num_ops(spec); i++) {
        const sl_spec_op_t *op = sl_spec_op(spec, i);
        if (op->kind == SL_OP_REPEAT && op->u.repeat.count < 0)
            infinite = true;
        else if (op->kind == SL_OP_TAKE && op->u.take.count >= 0)
            infinite = false;
    }
    return infinite;
}

uint64_t sl_policy_source_passes(const sl_spec_t *spec)
{
    uint64_t passes = 1;
    for (int i = 0; i < sl_spec_num_ops(spec); i++) {
        const sl_spec_op_t *op = sl_spec_op(spec, i);
        if (sl_spec_op_elementwise(op->kind))
            continue; /* one element at a time: its iteration ends with its input's */
        switch (op->kind) {
        case SL_OP_REPEAT: {
            /* Nothing repeated is nothing; forever, or a product past
             * 2^64, is without end (UINT64_MAX). */
            int64_t count = op->u.repeat.count;
            if (count == 0 || passes == 0)
                passes = 0;
            else if (count < 0 || __builtin_mul_overflow(passes, (uint64_t)count, &passes))
                passes = UINT64_MAX;
            break;
        }
        case SL_OP_BATCH:
        case SL_OP_PADDED_BATCH:
        case SL_OP_SHUFFLE:
        case SL_OP_SKIP:
        case SL_OP_SHARD:
        case SL_OP_PREFETCH:
            /* Each passes on, groups or drops what comes, and its
             * iteration ends when its input's does. */
            break;
        default:
            /* take, interleave, cache, and any op not known here. */
            return 1;
        }
    }
    return passes;
}

int sl_policy_host(const char *addr, char *host, size_t hostlen)
{
    const char *colon = strrchr(addr, ':');
    if (!colon || hostlen == 0)
        return -1;
    const char *start = addr, *end = colon;
    if (*start == '[' && end > start && end[-1] == ']') {
        start++;
        end--;
    }
    size_t n = (size_t)(end - start);
    if (n >= hostlen)
        n = hostlen - 1;
    memcpy(host, start, n);
    host[n] = '\0';
    return 0;
}

bool sl_policy_is_local(const char *waddr, const char *host)
{
    char h[128];
    return host && host[0] && sl_policy_host(waddr, h, sizeof h) == 0 && strcmp(h, host) == 0;
}
