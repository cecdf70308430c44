/*
 * getsplit.c: GET_SPLIT's answer without nanopb's tables (getsplit.h).
 *
 * Each field is a switch case over pbread.h's reader. As pb_decode() does,
 * the message's scalars and its count of splits are zeroed first (the
 * array past the count is not), each split is zeroed before its fields are
 * read, a field seen twice keeps the last value, and a 513th split is an
 * array overflow.
 */
#include "getsplit.h"

#include <stdbool.h>

#include "pbread.h"

static bool split_field(struct rd *r, uint32_t tag, unsigned wt, void *m)
{
    sluice_Split *s = m;
    switch (tag) {
    case sluice_Split_split_id_tag: return get_uint64(r, wt, "split_id", &s->split_id);
    case sluice_Split_begin_tag: return get_uint64(r, wt, "begin", &s->begin);
    case sluice_Split_end_tag: return get_uint64(r, wt, "end", &s->end);
    case sluice_Split_file_index_tag: return get_uint32(r, wt, "file_index", &s->file_index);
    case sluice_Split_skip_offset_tag: return get_uint64(r, wt, "skip_offset", &s->skip_offset);
    case sluice_Split_skip_count_tag: return get_uint64(r, wt, "skip_count", &s->skip_count);
    case sluice_Split_epoch_tag: return get_uint64(r, wt, "epoch", &s->epoch);
    default: return skip(r, wt);
    }
}

static bool get_split(struct rd *r, unsigned wt, sluice_GetSplitResponse *m)
{
    const pb_size_t max = sizeof m->splits / sizeof m->splits[0];
    r->field = "splits";
    if (m->splits_count >= max)
        return fail(r, "array overflow");
    const uint8_t *end;
    if (!want(r, wt, WT_LEN, "splits") || !get_len(r, &end))
        return false;
    sluice_Split *s = &m->splits[m->splits_count];
    *s = (sluice_Split)sluice_Split_init_zero;
    if (!get_sub(r, end, split_field, s, m->splits_count))
        return false;
    m->splits_count++;
    return true;
}

static bool response_field(struct rd *r, uint32_t tag, unsigned wt, void *msg)
{
    sluice_GetSplitResponse *m = msg;
    switch (tag) {
    case sluice_GetSplitResponse_splits_tag: return get_split(r, wt, m);
    case sluice_GetSplitResponse_end_of_epoch_tag: return get_bool(r, wt, "end_of_epoch", &m->end_of_epoch);
    case sluice_GetSplitResponse_epoch_tag: return get_uint64(r, wt, "epoch", &m->epoch);
    case sluice_GetSplitResponse_finished_tag: return get_bool(r, wt, "finished", &m->finished);
    case sluice_GetSplitResponse_retry_ms_tag: return get_uint32(r, wt, "retry_ms", &m->retry_ms);
    case sluice_GetSplitResponse_at_bound_tag: return get_bool(r, wt, "at_bound", &m->at_bound);
    default: return skip(r, wt);
    }
}

int sl_getsplit_resp_decode(const uint8_t *buf, size_t len, sluice_GetSplitResponse *m, char *err, size_t errlen)
{
    m->splits_count = 0;
    m->end_of_epoch = m->finished = m->at_bound = false;
    m->epoch = 0;
    m->retry_ms = 0;
    struct rd r = {buf, buf + len, NULL, NULL, -1};
    return get_fields(&r, response_field, m) ? 0 : failed(&r, buf, "splits", err, errlen);
}
