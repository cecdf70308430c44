/* received.c: see received.h. */
#include "received.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "big_alloc.h"
#include "errbuf.h"
#include "provwire.h"
#include "recycle.h"
#include "shmmap.h"
#include "strcopy.h"
#include "zero.h"

/* A batch is about 6 KiB (its tensors' slots), made on the iterator's
 * thread and freed on the caller's: blocks given back go to the next batch
 * from a stock (recycle.h), not through malloc's bins and the iterator
 * thread's arena lock taken from the caller's thread. */
SL_RECYCLER_DEFINE(batch_stock, sizeof(struct sl_batch))

void sl__batch_free(struct sl_batch *b)
{
    if (!b)
        return;
    sl__big_free(b->payload); /* kept for the next batch (big_alloc.h) */
    if (b->shm)
        sl__shm_slot_done(b->shm, b->shm_seq);
    if (b->prov != &b->prov_one)
        free(b->prov);
    if (b->done != b->done_one)
        free(b->done);
    if (b->tally != b->tally_one)
        free(b->tally);
    if (b->stocked)
        sl_recycle_free(&batch_stock, b);
    else
        free(b);
}

int sl__notices_append(sl_split_done_t **arr, size_t *num, size_t *cap, const sl_split_done_t *add, size_t n)
{
    if (n == 0)
        return 0;
    if (*num + n > *cap) {
        size_t want = *cap ? *cap : 16;
        while (want < *num + n)
            want *= 2;
        sl_split_done_t *p = realloc(*arr, want * sizeof *p);
        if (!p)
            return -ENOMEM;
        *arr = p;
        *cap = want;
    }
    memcpy(*arr + *num, add, n * sizeof **arr);
    *num += n;
    return 0;
}

int sl__batch_add_notices(struct sl_batch *b, const sl_split_done_t *add, size_t n)
{
    if (n == 0)
        return 0;
    /* Rare (notices that came after the batch): a new array each time. */
    sl_split_done_t *p = malloc((b->num_done + n) * sizeof *p);
    if (!p)
        return -ENOMEM;
    if (b->num_done > 0)
        memcpy(p, b->done, b->num_done * sizeof *p);
    memcpy(p + b->num_done, add, n * sizeof *p);
    if (b->done != b->done_one)
        free(b->done);
    b->done = p;
    b->num_done += n;
    return 0;
}

/* Rows in the form of split-done notices at [off, off + len) of a
 * GET_ELEMENT answer's payload of size bytes (what: "split-done notices",
 * "tallies"): checked and decoded into *out, *n of them: into room when
 * they are at most room_n, else malloc'd (NULL for none). They take at most
 * a sixth of their bytes, which the frame limit bounds.
 * @return 0, SL_EPROTO or -ENOMEM with a message in err */
static int rows_from_wire(uint64_t task_id, uint64_t off, uint64_t len, const char *what, const uint8_t *payload,
                          size_t size, sl_split_done_t *room, size_t room_n, sl_split_done_t **out, size_t *n,
                          char *err, size_t errlen)
{
    *out = NULL;
    *n = 0;
    if (len == 0)
        return 0;
    if (off > size || len > size - off)
        return sl_errf(err, errlen, SL_EPROTO,
                       "task %" PRIu64 ": %s at [%" PRIu64 ", +%" PRIu64 ") are outside the payload of %zu bytes",
                       task_id, what, off, len, size);
    const uint8_t *p = payload + off;
    char why[300];
    uint64_t num = 0;
    int rc = sl_provwire_read_done(p, (size_t)len, room, room_n, &num, why, sizeof why);
    if (rc == 0 && num > room_n) {
        if (!(*out = malloc((size_t)num * sizeof **out)))
            return sl_errf(err, errlen, -ENOMEM, "out of memory for %" PRIu64 " %s", num, what);
        rc = sl_provwire_read_done(p, (size_t)len, *out, (size_t)num, &num, why, sizeof why);
    } else if (rc == 0 && num > 0) {
        *out = room;
    }
    if (rc < 0) {
        if (*out != room)
            free(*out);
        *out = NULL;
        return sl_errf(err, errlen, rc, "task %" PRIu64 ": %s: %s", task_id, what, why);
    }
    *n = (size_t)num;
    return 0;
}

int sl__notices_from_wire(const sluice_GetElementResponse *resp, const uint8_t *payload, size_t size,
                          sl_split_done_t *room, size_t room_n, sl_split_done_t **out, size_t *n, char *err,
                          size_t errlen)
{
    return rows_from_wire(resp->task_id, resp->notices_offset, resp->notices_length, "split-done notices", payload,
                          size, room, room_n, out, n, err, errlen);
}

/* The batch's tallies (GetElementResponse.tallies_offset), kept in b when
 * they count every record its provenance counts (else the ledger decodes
 * the provenance). @return 0, SL_EPROTO or -ENOMEM with a message in err */
static int tallies_from_wire(const sluice_GetElementResponse *resp, const uint8_t *payload, size_t size,
                             struct sl_batch *b, char *err, size_t errlen)
{
    sl_split_done_t *rows;
    size_t n;
    int rc = rows_from_wire(resp->task_id, resp->tallies_offset, resp->tallies_length, "tallies", payload, size,
                            b->tally_one, SL_WIRE_TALLY_INLINE, &rows, &n, err, errlen);
    if (rc < 0 || n == 0)
        return rc;
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        if (rows[i].delivered == 0 || rows[i].delivered > b->num_records - sum) {
            sl_split_done_t r = rows[i];
            if (rows != b->tally_one)
                free(rows);
            return sl_errf(err, errlen, SL_EPROTO,
                           "task %" PRIu64 ": tally %zu (split [%" PRIu64 ", %" PRIu64 ") of file %" PRIu32
                           " of epoch %" PRIu32 ") counts %" PRIu64 " records: %s",
                           resp->task_id, i, r.begin, r.end, r.file_index, r.epoch, r.delivered,
                           r.delivered == 0 ? "none" : "more than the batch's provenance has");
        }
        sum += rows[i].delivered;
    }
    if (sum != b->num_records || b->num_prov == 0) {
        if (rows != b->tally_one)
            free(rows); /* not every record: not usable */
        return 0;
    }
    b->tally = rows;
    b->num_tally = n;
    return 0;
}

/* Where the tensor bytes of a payload of size bytes end: where the
 * provenance, the notices or the tallies begin. */
static size_t tensors_end(const sluice_GetElementResponse *resp, size_t size)
{
    size_t tensors = size;
    if (resp->provenance_length > 0 && resp->provenance_offset < tensors)
        tensors = (size_t)resp->provenance_offset;
    if (resp->notices_length > 0 && resp->notices_offset < tensors)
        tensors = (size_t)resp->notices_offset;
    if (resp->tallies_length > 0 && resp->tallies_offset < tensors)
        tensors = (size_t)resp->tallies_offset;
    return tensors;
}

/* Builds a batch from a GET_ELEMENT answer: its components checked against
 * the tensors bytes at data, its provenance, notices and tallies against
 * payload, size bytes (which it owns when owned, and then frees on
 * failure). The batch is pre when that is not NULL (a block of at least
 * sizeof *pre bytes, taken: freed on failure too), else malloc'd. */
static struct sl_batch *batch_build(const sluice_GetElementResponse *resp, uint8_t *payload, size_t size, bool owned,
                                    const uint8_t *data, size_t tensors, struct sl_batch *pre, char *err,
                                    size_t errlen)
{
    /* A view to check, only read (sl_wire_batch_validate() takes a const
     * batch): zeroed but for the component slots past the answer's (5.6 KB
     * a batch), each used one written whole. */
    sl_wire_batch_t wb;
    sl_zero_except(&wb, sizeof wb, offsetof(sl_wire_batch_t, components), sizeof wb.components);
    wb.num_elements = resp->num_elements;
    wb.num_components = (int)resp->components_count;
    wb.data = (uint8_t *)(uintptr_t)data;
    wb.size = tensors;
    for (int i = 0; i < wb.num_components; i++) {
        const sluice_Component *pc = &resp->components[i];
        sl_component_t *c = &wb.components[i];
        *c = (sl_component_t){.dtype = (sl_dtype_t)pc->dtype, .rank = (int)pc->shape_count, .offset = pc->offset,
                              .length = pc->length, .ragged = pc->ragged, .splits_offset = pc->splits_offset,
                              .splits_length = pc->splits_length};
        sl_strcopy(c->name, sizeof c->name, pc->name);
        memcpy(c->shape, pc->shape, sizeof(int64_t) * pc->shape_count);
    }
    uint64_t num_prov = 0;
    sl_provenance_run_t first;
    char why[400];
    if (sl_wire_batch_validate(&wb, err, errlen) < 0) {
        if (owned)
            free(payload);
        free(pre);
        return NULL;
    }
    /* The provenance (docs/protocol.md): checked against the payload and
     * the batch's elements now, decoded when it is read. */
    int prc = SL_EPROTO;
    if (resp->provenance_offset > size || resp->provenance_length > size - resp->provenance_offset)
        snprintf(why, sizeof why, "provenance at [%" PRIu64 ", +%" PRIu64 ") is outside the payload of %zu bytes",
                 resp->provenance_offset, resp->provenance_length, size);
    else
        prc = sl_provwire_read_some(payload + resp->provenance_offset, (size_t)resp->provenance_length,
                                    resp->num_records ? resp->num_records : resp->num_elements, &first, 1, &num_prov,
                                    why, sizeof why);
    if (prc < 0) {
        snprintf(err, errlen, "task %" PRIu64 ": %s", resp->task_id, why);
        if (owned)
            free(payload);
        free(pre);
        return NULL;
    }
    /* Zeroed but for the tensors and their names, which are written below
     * up to num_tensors and read no further (sl_batch_tensor()). */
    struct sl_batch *b = pre ? pre : sl_recycle_alloc(&batch_stock);
    if (b) {
        sl_zero_except(b, sizeof *b, offsetof(struct sl_batch, tensors),
                       offsetof(struct sl_batch, names) + sizeof b->names - offsetof(struct sl_batch, tensors));
        b->stocked = !pre;
    }
    if (!b) {
        snprintf(err, errlen, "out of memory");
        if (owned)
            free(payload);
        return NULL;
    }
    b->num_records = resp->num_records ? resp->num_records : resp->num_elements;
    b->num_prov = (size_t)num_prov;
    if (num_prov == 1) {
        b->prov_one = first;
        b->prov = &b->prov_one;
    }
    if (sl__notices_from_wire(resp, payload, size, b->done_one, SL_BATCH_DONE_INLINE, &b->done, &b->num_done, err,
                              errlen) < 0 ||
        tallies_from_wire(resp, payload, size, b, err, errlen) < 0) {
        sl__batch_free(b);
        if (owned)
            free(payload);
        return NULL;
    }
    b->task_id = resp->task_id;
    b->num_elements = wb.num_elements;
    b->num_tensors = wb.num_components;
    b->payload = payload;
    b->prov_wire = payload + resp->provenance_offset;
    b->prov_wire_len = (size_t)resp->provenance_length;
    /* The tensors' bytes: the provenance, notices and tallies after them
     * are not counted. */
    b->size = tensors;
    for (int i = 0; i < wb.num_components; i++) {
        const sl_component_t *c = &wb.components[i];
        sl_tensor_t *t = &b->tensors[i];
        sl_strcopy(b->names[i], sizeof b->names[i], c->name);
        *t = (sl_tensor_t){.name = b->names[i], .dtype = c->dtype, .rank = c->rank, .data = data + c->offset,
                           .size = c->length};
        memcpy(t->shape, c->shape, sizeof t->shape);
        if (c->ragged) {
            t->row_splits = (const int64_t *)(data + c->splits_offset);
            t->num_row_splits = c->splits_length / sizeof(int64_t);
        }
    }
    return b;
}

struct sl_batch *sl__batch_from_wire(const sluice_GetElementResponse *resp, uint8_t *payload, size_t size,
                                     char *err, size_t errlen)
{
    return batch_build(resp, payload, size, true, payload, tensors_end(resp, size), NULL, err, errlen);
}

/* The offset of a part that follows the tensor bytes, in their copy: 0 for none. */
static uint64_t in_tail(uint64_t off, uint64_t len, size_t tensors)
{
    return len > 0 ? off - tensors : 0;
}

struct sl_batch *sl__batch_from_shm(sluice_GetElementResponse *resp, struct sl_shm_map *m, const uint8_t *slot,
                                    size_t len, uint64_t seq, char *err, size_t errlen)
{
    for (pb_size_t i = 0; i < resp->components_count; i++)
        if (resp->components[i].ragged || resp->components[i].dtype == SL_DTYPE_BYTES) {
            sl_errf(err, errlen, SL_EPROTO, "task %" PRIu64 ": component %s in shared memory is %s", resp->task_id,
                    resp->components[i].name, resp->components[i].ragged ? "ragged" : "of bytes");
            sl__shm_slot_done(m, seq);
            return NULL;
        }
    /* What follows the tensor bytes: in the answer (the slot holds the
     * tensor bytes alone), or after them in the slot, read after the
     * checks. Either is copied out, with the offsets counted in the copy. */
    _Static_assert(sizeof resp->shm_tail.bytes <= SL_BATCH_TAIL_INLINE, "an answer's tail fits a batch's room");
    bool in_answer = resp->shm_tail.size > 0;
    size_t tensors = in_answer ? len : tensors_end(resp, len);
    size_t tail_len = in_answer ? resp->shm_tail.size : len - tensors;
    if (in_answer) {
        struct {
            const char *name;
            uint64_t offset, length;
        } parts[] = {{"provenance", resp->provenance_offset, resp->provenance_length},
                     {"notices", resp->notices_offset, resp->notices_length},
                     {"tallies", resp->tallies_offset, resp->tallies_length}};
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
            if (parts[i].length > 0 && parts[i].offset < tensors) {
                sl_errf(err, errlen, SL_EPROTO,
                        "task %" PRIu64 ": a batch in shared memory has its %s at offset %" PRIu64
                        ", within its %zu tensor bytes, not in the %zu bytes of its shm_tail",
                        resp->task_id, parts[i].name, parts[i].offset, tensors, tail_len);
                sl__shm_slot_done(m, seq);
                return NULL;
            }
    }
    /* A tail of a few bytes (most unshuffled batches': their provenance
     * and tallies) is copied to the stack and then into the batch; a
     * longer one (a shuffled batch's provenance, kilobytes) straight to
     * the bytes after the batch, allocated with it: one malloc and one
     * free a batch, not two. */
    uint8_t room[SL_BATCH_TAIL_INLINE];
    struct sl_batch *pre = tail_len <= sizeof room ? NULL : malloc(sizeof *pre + tail_len);
    uint8_t *tail = pre ? (uint8_t *)(pre + 1) : room;
    if (tail_len > sizeof room && !pre) {
        sl_errf(err, errlen, -ENOMEM, "out of memory");
        sl__shm_slot_done(m, seq);
        return NULL;
    }
    memcpy(tail, in_answer ? resp->shm_tail.bytes : slot + tensors, tail_len);
    resp->provenance_offset = in_tail(resp->provenance_offset, resp->provenance_length, tensors);
    resp->notices_offset = in_tail(resp->notices_offset, resp->notices_length, tensors);
    resp->tallies_offset = in_tail(resp->tallies_offset, resp->tallies_length, tensors);
    struct sl_batch *b = batch_build(resp, tail, tail_len, false, slot, tensors, pre, err, errlen);
    if (!b) {
        sl__shm_slot_done(m, seq);
        return NULL;
    }
    b->payload = NULL; /* the tail is the batch's own: in tail_one or after it */
    if (tail == room) {
        memcpy(b->tail_one, room, tail_len);
        b->prov_wire = b->tail_one + (b->prov_wire - room);
    }
    b->shm = m;
    b->shm_seq = seq;
    b->tail_in_answer = in_answer;
    return b;
}

/* Lowers *least to (epoch, file, begin) when that comes first. */
static void lower(sl_posrun_t *least, uint64_t epoch, uint32_t file, uint64_t begin)
{
    if (sl_place_before(epoch, file, begin, least->epoch, least->file, least->begin))
        *least = (sl_posrun_t){.epoch = (uint32_t)epoch, .file = file, .begin = begin};
}

bool sl__batch_least_place(const struct sl_batch *b, sl_posrun_t *at)
{
    sl_posrun_t least = {.epoch = UINT32_MAX, .file = UINT32_MAX, .begin = UINT64_MAX};
    if (b->num_tally > 0) {
        /* A split's begin: none of its records comes before it. */
        for (size_t i = 0; i < b->num_tally; i++)
            lower(&least, b->tally[i].epoch, b->tally[i].file_index, b->tally[i].begin);
    } else if (b->num_prov == 1) {
        lower(&least, b->prov_one.epoch, b->prov_one.file_index, b->prov_one.begin);
    } else if (b->num_prov == 0) {
        if (b->num_records > 0)
            least = (sl_posrun_t){0}; /* not known */
    } else {
        sl_provenance_run_t *runs;
        uint64_t n;
        char why[200];
        if (sl_provwire_decode(b->prov_wire, b->prov_wire_len, b->num_records, &runs, &n, why, sizeof why) < 0) {
            least = (sl_posrun_t){0}; /* checked as it came, so out of memory: not known */
        } else {
            for (uint64_t i = 0; i < n; i++)
                lower(&least, runs[i].epoch, runs[i].file_index, runs[i].begin);
            free(runs);
        }
    }
    *at = least;
    return least.epoch != UINT32_MAX || least.file != UINT32_MAX || least.begin != UINT64_MAX;
}

uint64_t sl__batch_least_epoch(const struct sl_batch *b)
{
    sl_posrun_t at;
    return sl__batch_least_place(b, &at) ? at.epoch : UINT64_MAX;
}

/* ---- sluice.h's accessors ---- */

uint64_t sl_batch_num_elements(const sl_batch_t *b)
{
    return b->num_elements;
}

int sl_batch_num_tensors(const sl_batch_t *b)
{
    return b->num_tensors;
}

const sl_tensor_t *sl_batch_tensor(const sl_batch_t *b, int i)
{
    return i >= 0 && i < b->num_tensors ? &b->tensors[i] : NULL;
}

const sl_tensor_t *sl_batch_find(const sl_batch_t *b, const char *name)
{
    for (int i = 0; i < b->num_tensors; i++)
        if (strcmp(b->names[i], name) == 0)
            return &b->tensors[i];
    return NULL;
}

size_t sl_batch_size(const sl_batch_t *b)
{
    return b->size;
}

uint64_t sl_batch_task_id(const sl_batch_t *b)
{
    return b->task_id;
}

const char *sl_batch_worker(const sl_batch_t *b)
{
    return b->worker;
}

uint64_t sl_batch_round(const sl_batch_t *b)
{
    return b->round;
}

void sl_batch_release(sl_batch_t *b)
{
    sl__batch_free(b);
}

const sl_provenance_run_t *sl_batch_provenance(const sl_batch_t *b, size_t *num_runs)
{
    /* Decoded on first use; the bytes were checked when the batch came. */
    struct sl_batch *mb = (struct sl_batch *)b;
    *num_runs = 0;
    if (b->num_prov == 0)
        return NULL;
    if (!mb->prov) {
        uint64_t n = 0;
        mb->prov = malloc(b->num_prov * sizeof *mb->prov);
        if (!mb->prov || sl_provwire_read(b->prov_wire, b->prov_wire_len, b->num_records, mb->prov, &n, NULL, 0) < 0) {
            free(mb->prov);
            mb->prov = NULL;
            return NULL;
        }
    }
    *num_runs = b->num_prov;
    return b->prov;
}

const sl_split_done_t *sl_batch_splits_done(const sl_batch_t *b, size_t *num)
{
    *num = b->num_done;
    return b->num_done ? b->done : NULL;
}
