/*
 * state_base.c: what every part of the dispatcher's state shares
 * (state_types.h): its tables' growth and lookups, the names of task and job
 * states, deletions queued for the next commit, the skip runs of a split
 * (a restored iterator's exclusions, a lost split's received records), what
 * the load held back, and the most splits a held task gets. Below
 * state.c, handout.c, outstanding.c, views.c and persist.c, and includes none
 * of them.
 */
#include "state_types.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "le.h"
#include "log.h"

const char *const sl__task_state_names[] = {"ASSIGNED", "RUNNING", "DONE", "FAILED", "LOST"};
const char *const sl__job_state_names[] = {"RUNNING", "FINISHED", "CANCELLED", "FAILED"};

int sl__dstate_grow(void *arr, unsigned *cap, unsigned num, size_t elem)
{
    if (num < *cap)
        return 0;
    unsigned ncap = *cap ? *cap * 2 : 8;
    void *p = realloc(*(void **)arr, (size_t)ncap * elem);
    if (!p)
        return -ENOMEM;
    *(void **)arr = p;
    *cap = ncap;
    return 0;
}

/* Queues the deletion of a stored record for the next commit. The queue is
 * bounded by what one request can remove (a job and its tasks' hand-outs,
 * the lost workers forgotten at one registration); on out of memory the
 * record stays in the store and is dropped again at the next load. */
void sl__dstate_del(sl_dstate_t *st, enum sl_dtable table, uint64_t key, uint64_t key2)
{
    if (sl__dstate_grow(&st->dels, &st->cap_dels, st->num_dels, sizeof *st->dels) < 0) {
        sl_log_warn("out of memory: stored record %" PRIu64 " stays until the next restart", key);
        return;
    }
    st->dels[st->num_dels++] = (struct sl_ddel){table, key, key2};
}

struct worker *sl__dstate_worker(sl_dstate_t *st, uint64_t id)
{
    for (unsigned i = 0; i < st->num_workers; i++)
        if (st->workers[i].id == id)
            return &st->workers[i];
    return NULL;
}

struct dataset *sl__dstate_dataset(const sl_dstate_t *st, uint64_t id)
{
    for (unsigned i = 0; i < st->num_datasets; i++)
        if (st->datasets[i]->id == id)
            return st->datasets[i];
    return NULL;
}

struct job *sl__dstate_job(const sl_dstate_t *st, uint64_t id)
{
    const sl_idmap_entry_t *e = sl_idmap_get(&st->index, id);
    return e && e->pos == UINT32_MAX ? e->ptr : NULL;
}

struct task *sl__dstate_task(const sl_dstate_t *st, uint64_t id, struct job **job)
{
    const sl_idmap_entry_t *e = sl_idmap_get(&st->index, id);
    if (!e || e->pos == UINT32_MAX)
        return NULL;
    struct job *j = e->ptr;
    *job = j;
    return &j->tasks[e->pos];
}

int sl__dstate_index_task(sl_dstate_t *st, struct job *j, unsigned k)
{
    return j->indexed ? sl_idmap_put(&st->index, j->tasks[k].id, j, k) : 0;
}

int sl__dstate_index_job(sl_dstate_t *st, struct job *j)
{
    /* The dirty list has room for every job: touching one never fails. */
    if (st->cap_dirty_jobs < st->num_jobs) {
        unsigned ncap = st->cap_jobs > st->num_jobs ? st->cap_jobs : st->num_jobs;
        struct job **p = realloc(st->dirty_jobs, (size_t)ncap * sizeof *p);
        if (!p)
            return -ENOMEM;
        st->dirty_jobs = p;
        st->cap_dirty_jobs = ncap;
    }
    int rc = sl_idmap_put(&st->index, j->id, j, UINT32_MAX);
    for (unsigned k = 0; k < j->num_tasks && rc == 0; k++)
        rc = sl_idmap_put(&st->index, j->tasks[k].id, j, k);
    if (rc < 0) {
        sl_idmap_del(&st->index, j->id);
        for (unsigned k = 0; k < j->num_tasks; k++)
            sl_idmap_del(&st->index, j->tasks[k].id);
        return rc;
    }
    j->indexed = true;
    if (j->dirty || j->cursor_dirty || j->exclude_dirty || j->orphans_dirty)
        sl__dstate_touch(st, j);
    return 0;
}

void sl__dstate_unindex_job(sl_dstate_t *st, struct job *j)
{
    if (j->indexed) {
        sl_idmap_del(&st->index, j->id);
        for (unsigned k = 0; k < j->num_tasks; k++)
            sl_idmap_del(&st->index, j->tasks[k].id);
        j->indexed = false;
    }
    if (j->listed) {
        for (unsigned i = 0; i < st->num_dirty_jobs; i++) {
            if (st->dirty_jobs[i] == j) {
                st->dirty_jobs[i] = st->dirty_jobs[--st->num_dirty_jobs];
                break;
            }
        }
        j->listed = false;
    }
}

void sl__dstate_touch(sl_dstate_t *st, struct job *j)
{
    if (j->listed || !j->indexed)
        return; /* a job not in st->jobs yet is listed when it is added */
    if (st->num_dirty_jobs >= st->cap_dirty_jobs) {
        /* Cannot be: every listed job is one of st->jobs, and the list has
         * room for all of them. A change left unlisted would be answered
         * and never stored, so stop rather than go on. */
        sl_log_error("job %" PRIu64 ": the dirty list is full (%u of %u jobs)", j->id, st->num_dirty_jobs,
                     st->num_jobs);
        abort();
    }
    st->dirty_jobs[st->num_dirty_jobs++] = j;
    j->listed = true;
}

int sl__dstate_split_skips(sl_dstate_t *st, struct task *t, const sl_posbits_t *ex, uint32_t epoch, uint32_t f,
                           uint64_t begin, uint64_t *end, uint32_t *nskips)
{
    uint64_t have = sl_posbits_count(ex, epoch, f, begin, *end);
    *nskips = 0;
    if (have == *end - begin)
        return 1;
    if (have == 0)
        return 0;
    size_t room = (st->cfg.max_skip_bytes - t->last_skips_len) / 16;
    size_t n = sl_posbits_within(ex, epoch, f, begin, *end, NULL, 0);
    if (room == 0)
        return 2;
    if (!t->last_skips && !(t->last_skips = malloc(st->cfg.max_skip_bytes)))
        return -ENOMEM;
    size_t take = n > room ? room : n;
    sl_posrun_t *runs = malloc((take + 1) * sizeof *runs);
    if (!runs)
        return -ENOMEM;
    sl_posbits_within(ex, epoch, f, begin, *end, runs, take + 1);
    if (n > room)
        *end = runs[room].begin;
    for (size_t i = 0; i < take; i++) {
        sl_put_le64(t->last_skips + t->last_skips_len, runs[i].begin);
        sl_put_le64(t->last_skips + t->last_skips_len + 8, runs[i].count);
        t->last_skips_len += 16;
    }
    free(runs);
    *nskips = (uint32_t)take;
    return 0;
}

uint32_t sl__dataset_num_files(const struct dataset *d)
{
    return d->files.num_files > 0 ? (uint32_t)d->files.num_files : 1;
}

uint64_t sl__dataset_file_records(const struct dataset *d, uint32_t f)
{
    return d->files.num_files > 0 ? d->files.records[f] : (uint64_t)d->cardinality;
}

uint64_t sl__dataset_records(const struct dataset *d)
{
    return d->files.num_files > 0 ? d->files.total : (uint64_t)d->cardinality;
}

/* The records of files f and after: from a table made once per dataset (a
 * file source may have up to --max-files files, and this is asked for at
 * every hand-out), or counted file by file when there is no memory for it. */
static uint64_t records_from(struct dataset *d, uint32_t f)
{
    uint32_t n = sl__dataset_num_files(d);
    if (f >= n)
        return 0;
    if (n == 1)
        return sl__dataset_file_records(d, 0);
    if (!d->records_from && (d->records_from = malloc(((size_t)n + 1) * sizeof *d->records_from))) {
        d->records_from[n] = 0;
        for (uint32_t g = n; g-- > 0;)
            d->records_from[g] = d->records_from[g + 1] + sl__dataset_file_records(d, g);
    }
    if (d->records_from)
        return d->records_from[f];
    uint64_t sum = 0;
    for (uint32_t g = f; g < n; g++)
        sum += sl__dataset_file_records(d, g);
    return sum;
}

uint64_t sl__job_records_left(const struct job *j)
{
    uint64_t from = records_from(j->dataset, j->split_file);
    return from > j->split_next ? from - j->split_next : 0;
}

void sl__dataset_free(struct dataset *d)
{
    if (!d)
        return;
    free(d->canonical);
    sl_file_list_clear(&d->files);
    free(d->records_from);
    free(d);
}

const struct quarantined *sl__dstate_held_back(const sl_dstate_t *st, const char *kind, uint64_t id)
{
    for (unsigned i = 0; i < st->num_quarantine; i++)
        if (st->quarantine[i].id == id && strcmp(st->quarantine[i].kind, kind) == 0)
            return &st->quarantine[i];
    return NULL;
}

unsigned sl__held_cap(const sl_dstate_t *st)
{
    unsigned bound = st->cfg.max_outstanding;
    unsigned more = bound < SL_HELD_EXTRA ? bound : SL_HELD_EXTRA;
    return more > UINT32_MAX - bound ? UINT32_MAX : bound + more;
}
