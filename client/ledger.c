/* ledger.c: see ledger.h. */
#include "ledger.h"

#include <errno.h>
#include <stdbool.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/sha.h>

#include "errbuf.h"
#include "le.h"
#include "provwire.h"
#include "received.h"

#define LEDGER_BATCHES 8 /* batches whose runs wait at least before they go into got at once */

/* Lazy provenance's bounds: the splits whose notice has not come (a
 * shuffle buffer spans a few dozen; more only when notices are lost with a
 * worker), and log's bytes: about 3 a shuffled record, so 6 a run of
 * max_runs is more than the runs a ledger may hold anyway. */
#define LAZY_MAX_KEYS 65536
#define LAZY_LOG_MIN (1u << 20)

struct sl_lazy_entry {
    uint64_t num_records;
    size_t off;     /* its bytes in log: [off, off + len) */
    uint32_t len;
    uint32_t nkeys; /* its keys in keys */
};

struct sl_lazy_key {
    uint32_t epoch, file;
    uint64_t begin;
};

/* A checkpoint: "SLCK", u32 version, u64 dataset id (little-endian), then
 * the positions given to the caller. Version 6 (written when a block of
 * 4096 positions holds CKPT_BITMAP_RUNS runs or more: a rank's share past a
 * named job's fold, posbits.h): as version 5 (its place may be an epoch's
 * start), with u64 the number of positions, u64 the number of bitmaps,
 * each u32 epoch, u32 file, u64 block number and 64 u64 words (bit i of
 * word k: record 4096 block + 64 k + i), then the runs of the positions in
 * no bitmap as version 2 has them. Version 5 (written when the ledger's
 * record starts within an epoch: a named job's fold by place, ledger.h):
 * as version 4 with u32 file, u32 0, u64 record after epochs_done: every
 * record before (epochs_done, file, record) was given, and the positions
 * that follow lie at or past it. Version 4 (written otherwise): as version 3
 * with a u64 after the flags: every epoch below it was given whole, and
 * the positions that follow are of later epochs only (so a checkpoint's
 * size follows the open epochs, not the run's length). Version 3: u32
 * flags (CKPT_MAC), u32 0, then as version 2, then a 32-byte tag over all
 * that comes before it: HMAC-SHA256 under the cluster token when the
 * client has one (CKPT_MAC), else SHA-256. Version 2 (read only without a token): u64
 * the number of positions, then their runs in provwire.h's compact form,
 * about 3 bytes a run where posset.h's version 1 bytes take 24 (a shuffle
 * leaves thousands of short runs near the stream's front). Version 1 (read
 * only without a token): posset.h's bytes. */
#define CKPT_MAGIC "SLCK"
#define CKPT_VERSION 6
#define CKPT_V5 5
#define CKPT_V4 4
#define CKPT_V3 3
#define CKPT_V2 2
#define CKPT_V1 1
#define CKPT_HEADER 16
#define CKPT_V3_FLAGS 8 /* flags and a reserved u32 after the header */
#define CKPT_TAG 32
#define CKPT_MAC 1u
#define CKPT_V4_DONE 8   /* epochs_done after the flags */
#define CKPT_V5_PLACE 16 /* u32 file, u32 0, u64 record after epochs_done */
#define CKPT_V6_COUNTS 16 /* u64 positions, u64 bitmaps */
#define CKPT_BITMAP SL_POSSET_BITMAP_BYTES /* a version 6 bitmap on the wire */
/* The runs in a block that make it a bitmap on the wire: the 528 bytes of
 * one against about 3 a run. */
#define CKPT_BITMAP_RUNS SL_POSBITS_WIRE_RUNS

/* The tag of a version 3 checkpoint's bytes before it: HMAC-SHA256 under
 * key over a label and the bytes, or SHA-256 without a key. @return 0 or -ENOMEM */
static int ckpt_tag(const uint8_t *key, size_t key_len, const uint8_t *p, size_t len, uint8_t tag[CKPT_TAG])
{
    static const char label[] = "sluice checkpoint v3";
    if (key_len == 0)
        return SHA256(p, len, tag) ? 0 : -ENOMEM;
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", (char *)"SHA256", 0), OSSL_PARAM_construct_end()};
    size_t n = 0;
    int ok = ctx && EVP_MAC_init(ctx, key, key_len, params) && EVP_MAC_update(ctx, (const uint8_t *)label, sizeof label) &&
             EVP_MAC_update(ctx, p, len) && EVP_MAC_final(ctx, tag, &n, CKPT_TAG) && n == CKPT_TAG;
    EVP_MAC_CTX_free(ctx);
    EVP_MAC_free(mac);
    return ok ? 0 : -ENOMEM;
}

size_t sl__ledger_max_runs(const sl_iterator_opts_t *opts)
{
    return opts->max_ledger_runs == 0 || opts->max_ledger_runs > SL_POSSET_MAX_RUNS ? SL_POSSET_MAX_RUNS
                                                                                    : opts->max_ledger_runs;
}

void sl__ledger_init(sl_ledger_t *l, size_t max_runs)
{
    *l = (sl_ledger_t){.max_runs = max_runs, .log_max = 6 * max_runs > LAZY_LOG_MIN ? 6 * max_runs : LAZY_LOG_MIN};
    sl_posbits_init(&l->restored, max_runs);
    sl_posbits_init(&l->got, max_runs);
    sl__tally_init(&l->open, LAZY_MAX_KEYS);
}

void sl__ledger_free(sl_ledger_t *l)
{
    sl_posbits_clear(&l->restored);
    sl_posbits_clear(&l->got);
    free(l->runs);
    free(l->done);
    l->runs = NULL;
    l->done = NULL;
    l->num = l->cap = l->ndone = l->done_cap = 0;
    free(l->ent);
    free(l->log);
    free(l->keys);
    l->ent = NULL;
    l->log = NULL;
    l->keys = NULL;
    l->ent_head = l->ent_num = l->ent_cap = l->log_tail = l->log_kept = l->log_cap = 0;
    l->key_head = l->key_num = l->key_cap = 0;
    sl__tally_free(&l->open);
}

/* Drops the positions of epochs below `below` from s (so that the set's
 * memory follows the open epochs too). */
static void drop_epochs(sl_posbits_t *s, uint64_t below)
{
    if (below > UINT32_MAX)
        sl_posbits_clear(s); /* every epoch a position can name */
    else
        sl_posbits_drop_before(s, (uint32_t)below, 0, 0);
}

/* Whether (epoch, file, pos) lies before the ledger's floor. */
static bool below_floor(const sl_ledger_t *l, uint32_t epoch, uint32_t file, uint64_t pos)
{
    const sl_posrun_t *f = &l->floor;
    return l->floor_set && sl_place_before(epoch, file, pos, f->epoch, f->file, f->begin);
}

/* Whether (epoch, file, pos) lies past the ledger's floor (or there is none). */
static bool past_floor(const sl_ledger_t *l, uint32_t epoch, uint32_t file, uint64_t pos)
{
    const sl_posrun_t *f = &l->floor;
    return !l->floor_set || sl_place_before(f->epoch, f->file, f->begin, epoch, file, pos);
}

static void lazy_drop(sl_ledger_t *l);
static void given_now(sl_ledger_t *l, uint32_t epoch, uint32_t file, uint64_t pos);

/* Every epoch below `below` was given whole: only the number is kept. */
static void fold(sl_ledger_t *l, uint64_t below)
{
    if (below <= l->epochs_done)
        return;
    l->epochs_done = below;
    drop_epochs(&l->restored, below);
    drop_epochs(&l->got, below);
    /* The waiting batches' records of those epochs matter no more. */
    sl__tally_drop_below(&l->open, below);
    l->lazy_blocked = false;
    lazy_drop(l);
}

int sl__ledger_restore(sl_ledger_t *l, const uint8_t *posset, size_t len, sl_posrun_t at, char *err, size_t errlen)
{
    int rc = len > 0 ? sl_posbits_decode(&l->restored, posset, len, err, errlen) : 0;
    if (rc == 0)
        given_now(l, at.epoch, at.file, at.begin);
    return rc;
}

void sl__ledger_epochs_done(sl_ledger_t *l, uint64_t below, size_t waiting)
{
    if (below <= l->epochs_done)
        return;
    if (waiting == 0) {
        fold(l, below);
        if (l->fold_below != 0 && l->fold_below <= l->epochs_done)
            l->fold_below = 0; /* what waited is done with it */
        return;
    }
    if (l->fold_below != 0)
        return;
    l->fold_below = below;
    l->fold_at = l->given + waiting;
}

/* Drops what the ledger holds before (epoch, file, pos), and what comes
 * before it later: the ledger's floor. A place not past the floor changes
 * nothing. @return whether it moved the floor */
static bool raise_floor(sl_ledger_t *l, uint32_t epoch, uint32_t file, uint64_t pos)
{
    if (!past_floor(l, epoch, file, pos))
        return false;
    l->floor = (sl_posrun_t){.epoch = epoch, .file = file, .begin = pos};
    l->floor_set = true;
    sl_posbits_drop_before(&l->restored, epoch, file, pos);
    sl_posbits_drop_before(&l->got, epoch, file, pos);
    /* Their notices may never come (a peer got them): the batches that
     * wait for them go without being decoded. */
    sl__tally_drop_before(&l->open, epoch, file, pos);
    l->lazy_blocked = false;
    lazy_drop(l);
    return true;
}

void sl__ledger_confirmed_below(sl_ledger_t *l, uint32_t epoch, uint32_t file, uint64_t pos)
{
    if (raise_floor(l, epoch, file, pos))
        l->floor_given = false;
}

/* sl__ledger_given_below()'s fold, made now. */
static void given_now(sl_ledger_t *l, uint32_t epoch, uint32_t file, uint64_t pos)
{
    if (l->floor_set && !l->floor_given)
        return; /* a coordinated ledger's floor is further, and takes no checkpoint */
    sl__ledger_epochs_done(l, epoch, 0);
    if ((file > 0 || pos > 0) && raise_floor(l, epoch, file, pos))
        l->floor_given = true;
}

bool sl__ledger_given_below(sl_ledger_t *l, uint32_t epoch, uint32_t file, uint64_t pos)
{
    sl_posrun_t at = {.epoch = epoch, .file = file, .begin = pos};
    if ((l->floor_set && !l->floor_given) || !past_floor(l, epoch, file, pos) ||
        (l->fold_next_set && !sl_posrun_before(l->fold_next, at)) || (file == 0 && pos == 0 && epoch <= l->epochs_done))
        return false;
    l->fold_next = at;
    l->fold_next_set = true;
    return true;
}

/* Where the ledger's record starts: the floor when it lies in the epoch
 * epochs_done or later, else that epoch's start. */
static sl_posrun_t ledger_place(const sl_ledger_t *l)
{
    if (l->floor_set && l->floor.epoch >= l->epochs_done)
        return l->floor;
    return (sl_posrun_t){.epoch = (uint32_t)l->epochs_done};
}

size_t sl__ledger_runs(const sl_ledger_t *l)
{
    return sl_posbits_units(&l->restored) + sl_posbits_units(&l->got);
}

size_t sl__ledger_runs_held(const sl_ledger_t *l)
{
    return sl__ledger_runs(l) + l->num;
}

/* Why a ledger outgrows its bound, for the messages that say it did: a
 * rank of a named job keeps what it was given past the fold, which lags
 * the hand-out by the shuffles' tails (a split's last record leaves a
 * buffer of B records about B ln(split size) records after its first,
 * on each worker); an anonymous job's ledger keeps the holes of its
 * splits not done. */
static const char *why_runs(const sl_ledger_t *l)
{
    return !l->named ? "a shuffle buffer leaves about half its size in holes per worker"
                     : "a rank of a named job keeps what it was given past the job's fold, which behind a shuffle of "
                       "B records lags about 12 x B records per worker: more ranks, fewer workers or a smaller "
                       "buffer hold less";
}

/* What the ledger received no longer fits (or there was no memory for
 * it): nothing is recorded from now on. */
static void fail(sl_ledger_t *l, int rc)
{
    if (l->rc < 0)
        return;
    l->rc = rc == -ENOSPC ? SL_ETOOBIG : rc;
    /* Nothing else would tell the trainer before a checkpoint fails or a
     * worker dies. */
    fprintf(stderr,
            "sluice: iterator of job %" PRIu64 ": what it received no longer fits its ledger (%s; at most %zu "
            "runs of positions, max_ledger_runs; %s): it takes no checkpoint from now on, and a worker lost "
            "from now on may deliver some elements twice\n",
            l->job_id, rc == -ENOSPC ? "more runs than that" : sl_strerror(rc), l->max_runs, why_runs(l));
}

/* Said once, when the record first holds more than half its bound (the
 * runs that wait to go in counted), while the trainer can still act. */
static void half_full(sl_ledger_t *l)
{
    size_t runs = sl__ledger_runs_held(l);
    if (l->half_said || runs <= l->max_runs / 2)
        return;
    l->half_said = true;
    fprintf(stderr,
            "sluice: iterator of job %" PRIu64 ": its record of what reached it holds %zu runs of positions, over "
            "half its bound of %zu (max_ledger_runs; %s): past the bound it takes no checkpoint\n",
            l->job_id, runs, l->max_runs, why_runs(l));
}

/* Grows *arr (of *cap elements of size bytes) to hold want. 0 or -ENOMEM */
static int room(void **arr, size_t *cap, size_t want, size_t size)
{
    if (want <= *cap)
        return 0;
    size_t n = *cap * 2 > want ? *cap * 2 : want;
    void *p = realloc(*arr, n * size);
    if (!p)
        return -ENOMEM;
    *arr = p;
    *cap = n;
    return 0;
}

/* Room for n runs in l->runs. 0 or -ENOMEM */
static int runs_room(sl_ledger_t *l, size_t n)
{
    return room((void **)&l->runs, &l->cap, n, sizeof *l->runs);
}

/* Decodes a batch's provenance into the runs that wait. 0 or < 0 */
static int decode_into_runs(sl_ledger_t *l, const uint8_t *prov, size_t prov_len, uint64_t num_records)
{
    /* Room by what arrived, not by what it claims (provwire.h). */
    uint64_t n = 0, most = sl_provwire_max_runs(prov, prov_len, num_records);
    int rc = runs_room(l, l->num + (size_t)most);
    if (rc == 0)
        rc = sl_provwire_read(prov, prov_len, num_records, l->runs + l->num, &n, NULL, 0);
    l->num += (size_t)n;
    return rc;
}

/* Lazy provenance keeps nothing (its memory stays for later batches). */
static void lazy_reset(sl_ledger_t *l)
{
    l->ent_head = l->ent_num = l->log_tail = l->log_kept = l->key_head = l->key_num = 0;
    l->lazy_records = 0;
    l->lazy_blocked = false;
}

/* Decodes every batch lazy provenance keeps into the runs that wait. The
 * splits' counts stay (notices still to come check them). 0 or < 0 */
static int lazy_flush(sl_ledger_t *l)
{
    int rc = 0;
    for (size_t i = l->ent_head; i < l->ent_num && rc == 0; i++)
        rc = decode_into_runs(l, l->log + l->ent[i].off, l->ent[i].len, l->ent[i].num_records);
    lazy_reset(l);
    return rc;
}

/* Lets go of the oldest batches whose every split was given whole (its key
 * gone from open): their records are in the whole splits' runs. */
static void lazy_drop(sl_ledger_t *l)
{
    /* Only a key leaving open lets the head go: until one does (most
     * batches bring no notice), there is nothing to look at; nor when
     * nothing is kept (batches of one run, whose provenance is decoded at
     * once), and lazy_reset() would change nothing. */
    if (l->lazy_blocked || (l->ent_num == 0 && l->log_tail == 0))
        return;
    while (l->ent_head < l->ent_num) {
        const struct sl_lazy_entry *e = &l->ent[l->ent_head];
        uint64_t count;
        for (uint32_t k = 0; k < e->nkeys; k++) {
            const struct sl_lazy_key *key = &l->keys[l->key_head + k];
            if (sl__tally_get(&l->open, key->epoch, key->file, key->begin, &count)) {
                l->lazy_blocked = true;
                return;
            }
        }
        l->log_kept -= e->len;
        l->lazy_records -= e->num_records;
        l->key_head += e->nkeys;
        l->ent_head++;
    }
    lazy_reset(l);
}

/* Moves the entries and keys kept to the front once the part let go is
 * half of them (24 and 16 bytes a batch; the log's bytes stay put). */
static void lazy_compact(sl_ledger_t *l)
{
    if (l->ent_head > 0 && l->ent_head >= l->ent_num / 2) {
        memmove(l->ent, l->ent + l->ent_head, (l->ent_num - l->ent_head) * sizeof *l->ent);
        l->ent_num -= l->ent_head;
        l->ent_head = 0;
        memmove(l->keys, l->keys + l->key_head, (l->key_num - l->key_head) * sizeof *l->keys);
        l->key_num -= l->key_head;
        l->key_head = 0;
    }
}

/* Where len bytes fit in the log ring as it is, or SIZE_MAX. Its bytes run
 * from the head entry's offset to log_tail, through the end and 0 when
 * log_tail is at or below the head (wrapped). */
static size_t log_fit(const sl_ledger_t *l, size_t len)
{
    if (l->ent_head == l->ent_num)
        return len <= l->log_cap ? 0 : SIZE_MAX;
    size_t head = l->ent[l->ent_head].off, tail = l->log_tail;
    if (tail <= head)
        return len <= head - tail ? tail : SIZE_MAX;
    if (len <= l->log_cap - tail)
        return tail;
    return len <= head ? 0 : SIZE_MAX;
}

bool sl__ledger_log_wrapped(const sl_ledger_t *l)
{
    return l->ent_head < l->ent_num && l->log_tail <= l->ent[l->ent_head].off;
}

/* Room for len more bytes in the log: when they do not fit, the ring grows
 * in place to twice its size or more (realloc: a large one's pages move
 * with mremap, not copied to pages touched for the first time, each a page
 * fault), and the bytes of a wrapped ring's front, [0, log_tail), move to
 * follow its old end, so that what is kept runs from the head entry on in
 * order. Behind a shuffle, what is kept is the batches since the oldest
 * split still open, megabytes with long splits: copying them into a new
 * ring at each doubling touched twice the pages the ring ends with.
 * 0 or -ENOMEM */
static int log_room(sl_ledger_t *l, size_t len)
{
    if (log_fit(l, len) != SIZE_MAX)
        return 0;
    size_t old = l->log_cap;
    bool kept = l->ent_head < l->ent_num;
    size_t head = kept ? l->ent[l->ent_head].off : 0;
    bool wrapped = kept && l->log_tail <= head;
    /* Where the kept bytes will end: the new free room starts there. */
    size_t end = !kept ? 0 : wrapped ? old + l->log_tail : l->log_tail;
    size_t cap = old ? 2 * old : 4096;
    while (cap < end + len)
        cap *= 2;
    uint8_t *p = realloc(l->log, cap);
    if (!p)
        return -ENOMEM;
    l->log = p;
    l->log_cap = cap;
    if (!kept) {
        l->log_tail = 0;
        return 0;
    }
    if (wrapped) {
        /* The entries past the wrap are those below the head's offset. */
        memcpy(p + old, p, l->log_tail);
        for (size_t i = l->ent_head; i < l->ent_num; i++)
            if (l->ent[i].off < head)
                l->ent[i].off += old;
        l->log_tail = end;
    }
    return 0;
}

/* Keeps a tallied batch undecoded and counts its records into open. 0 or < 0 */
static int lazy_append(sl_ledger_t *l, const uint8_t *prov, size_t prov_len, uint64_t num_records,
                       const sl_split_done_t *tally, size_t ntally)
{
    if (prov_len > UINT32_MAX || ntally > UINT32_MAX)
        return decode_into_runs(l, prov, prov_len, num_records);
    lazy_compact(l);
    int rc = room((void **)&l->ent, &l->ent_cap, l->ent_num + 1, sizeof *l->ent);
    if (rc == 0)
        rc = log_room(l, prov_len);
    if (rc == 0)
        rc = room((void **)&l->keys, &l->key_cap, l->key_num + ntally, sizeof *l->keys);
    for (size_t i = 0; i < ntally && rc == 0; i++) {
        const sl_split_done_t *t = &tally[i];
        rc = sl__tally_add(&l->open, t->epoch, t->file_index, t->begin, t->delivered);
        if (rc == -ENOSPC) {
            /* Too many splits wait for their notices (notices lost with a
             * worker): the counts go, and what they would have let go is
             * decoded. Splits counted from here on are counted from here,
             * so they do not look whole; the rows before i are kept. */
            rc = lazy_flush(l);
            if (rc == 0) {
                sl__tally_clear(&l->open);
                for (size_t j = 0; j <= i && rc == 0; j++)
                    rc = sl__tally_add(&l->open, tally[j].epoch, tally[j].file_index, tally[j].begin,
                                       tally[j].delivered);
            }
        }
    }
    if (rc < 0)
        return rc;
    /* It fits (a flush above only made more room). */
    size_t at = log_fit(l, prov_len);
    memcpy(l->log + at, prov, prov_len);
    l->log_tail = at + prov_len;
    l->log_kept += prov_len;
    for (size_t i = 0; i < ntally; i++)
        l->keys[l->key_num + i] = (struct sl_lazy_key){tally[i].epoch, tally[i].file_index, tally[i].begin};
    l->key_num += ntally;
    l->ent[l->ent_num++] = (struct sl_lazy_entry){num_records, at, (uint32_t)prov_len, (uint32_t)ntally};
    l->lazy_records += num_records;
    return 0;
}

/* The notices of a batch given: a split lazy provenance counts is checked
 * now (given whole: its run waits in runs, and the batches it kept may go);
 * the others wait for the sync's check against got. So does a split whose
 * count falls short: a batch of one run carries no tallies, so its records
 * were not counted (the last of a split may come that way), and the kept
 * batches are decoded for that check. 0 or < 0 */
static int notices_add(sl_ledger_t *l, const sl_split_done_t *done, size_t ndone)
{
    int rc = 0;
    bool flush = false;
    for (size_t i = 0; i < ndone && rc == 0; i++) {
        const sl_split_done_t *d = &done[i];
        uint64_t count;
        if (!sl__tally_get(&l->open, d->epoch, d->file_index, d->begin, &count)) {
            rc = sl__notices_append(&l->done, &l->ndone, &l->done_cap, d, 1);
            continue;
        }
        sl__tally_remove(&l->open, d->epoch, d->file_index, d->begin);
        l->lazy_blocked = false;
        if (count == d->delivered && d->end > d->begin && d->epoch >= l->epochs_done) {
            rc = runs_room(l, l->num + 1);
            if (rc == 0)
                l->runs[l->num++] = (sl_provenance_run_t){d->epoch, d->file_index, d->begin, d->end - d->begin};
        } else {
            flush = true;
            rc = sl__notices_append(&l->done, &l->ndone, &l->done_cap, d, 1);
        }
    }
    if (rc == 0 && flush)
        rc = lazy_flush(l);
    return rc;
}

/* Split d's notice says its worker delivered more of its records than the
 * caller, the task's only client, was given (count), though every batch
 * holding them came before it: a batch was lost on the way. More records
 * than delivered is no loss (a lost worker's split handed out again
 * without what was received). */
static void note_missing(sl_ledger_t *l, const sl_split_done_t *d, uint64_t count)
{
    if (l->missing == 0)
        fprintf(stderr,
                "sluice: iterator of job %" PRIu64 ": split %" PRIu64 " (epoch %" PRIu32 ", file %" PRIu32
                ", records %" PRIu64 " to %" PRIu64 "): its worker delivered %" PRIu64 " records and %" PRIu64
                " arrived: a batch was lost on the way (a bug: please report it)\n",
                l->job_id, d->split_id, d->epoch, d->file_index, d->begin, d->end, d->delivered, count);
    l->missing += d->delivered - count;
}

/* The waiting runs go in at once, sorted and merged in one pass
 * (sl_provenance_run_t has sl_posrun_t's layout); then each waiting notice
 * whose split the caller was given every delivered record of fills the
 * split's holes, all in one more merge. A notice comes after every batch
 * with records of its split, so counting now is as counting when it came
 * (a split whose records lazy provenance keeps undecoded was checked when
 * its notice came: notices_add()). */
static void merge(sl_ledger_t *l, int rc)
{
    if (l->rc < 0)
        return;
    if (l->epochs_done > 0 || l->floor_set) {
        /* Runs of done epochs (a batch that waited while its epoch was
         * folded) are in the number already; no report asks for records
         * before the floor. */
        size_t k = 0;
        for (size_t i = 0; i < l->num; i++) {
            sl_provenance_run_t r = l->runs[i];
            if (r.epoch < l->epochs_done || below_floor(l, r.epoch, r.file_index, r.begin + r.count - 1))
                continue;
            if (below_floor(l, r.epoch, r.file_index, r.begin)) {
                r.count -= l->floor.begin - r.begin; /* it holds the floor */
                r.begin = l->floor.begin;
            }
            l->runs[k++] = r;
        }
        l->num = k;
    }
    if (rc == 0)
        rc = sl_posbits_add_many(&l->got, l->runs, l->num);
    /* The runs' buffer is free again: it takes the filled splits. */
    if (rc == 0)
        rc = runs_room(l, l->ndone);
    size_t fill = 0;
    for (size_t i = 0; i < l->ndone && rc == 0; i++) {
        const sl_split_done_t *d = &l->done[i];
        if (d->end <= d->begin || d->epoch < l->epochs_done || below_floor(l, d->epoch, d->file_index, d->begin))
            continue;
        uint64_t count = sl_posbits_count(&l->got, d->epoch, d->file_index, d->begin, d->end);
        if (count == d->delivered)
            l->runs[fill++] = (sl_provenance_run_t){d->epoch, d->file_index, d->begin, d->end - d->begin};
        else if (count < d->delivered && l->sole)
            note_missing(l, d, count);
    }
    if (rc == 0 && fill > 0)
        rc = sl_posbits_add_many(&l->got, l->runs, fill);
    if (rc < 0)
        fail(l, rc);
    l->num = l->ndone = 0;
    l->batches = 0;
}

void sl__ledger_sync(sl_ledger_t *l)
{
    if (l->rc < 0)
        return;
    merge(l, lazy_flush(l));
}

void sl__ledger_add(sl_ledger_t *l, const uint8_t *prov, size_t prov_len, uint64_t num_records,
                    const sl_split_done_t *done, size_t ndone, bool last)
{
    sl__ledger_add_tallied(l, prov, prov_len, num_records, NULL, 0, done, ndone, last);
}

/* What every batch given does after its provenance went in (rc: how that
 * went): its notices, letting go of what lazy provenance kept, a fold that
 * waited for it, a merge once enough waits. */
static void added(sl_ledger_t *l, int rc, const sl_split_done_t *done, size_t ndone, bool last)
{
    if (rc == 0)
        rc = notices_add(l, done, ndone);
    if (rc == 0) {
        lazy_drop(l);
        /* A rank of a named job gets few notices, so its batches seldom
         * go undecoded: decoded every max_runs / 16 records, its runs are
         * known (the heartbeat says them, half_full() warns) before they
         * near the bound, not a log's worth later. */
        if (l->log_kept > l->log_max || (l->named && l->lazy_records > l->max_runs / 16))
            rc = lazy_flush(l);
    }
    if (rc < 0) {
        fail(l, rc);
        return;
    }
    /* A named job's fold heard before this batch was given. */
    if (l->fold_next_set) {
        l->fold_next_set = false;
        given_now(l, l->fold_next.epoch, l->fold_next.file, l->fold_next.begin);
    }
    /* The caller now has every batch that waited when the dispatcher said
     * the epochs below fold_below were done. */
    if (++l->given >= l->fold_at && l->fold_below != 0) {
        fold(l, l->fold_below);
        l->fold_below = 0;
    }
    /* A merge costs a pass over the part of got the runs reach, which
     * behind a large shuffle is most of it (its holes): so the runs wait
     * until they are a quarter of got, for a constant cost a run, and at
     * least LEDGER_BATCHES batches, when the holes between them have mostly
     * filled. Unshuffled batches continue the runs that wait (a run a
     * split, sl__ledger_add_run()): a few runs wait until there are
     * LEDGER_BATCHES of them or a notice waits to be checked, a merge a
     * few splits rather than every LEDGER_BATCHES batches. The end decodes
     * what lazy provenance keeps too. */
    if (last)
        sl__ledger_sync(l);
    else if (++l->batches >= LEDGER_BATCHES && l->num * 4 >= l->got.runs.num && (l->num >= LEDGER_BATCHES || l->ndone > 0))
        merge(l, 0);
    if (l->rc == 0)
        half_full(l);
}

void sl__ledger_add_tallied(sl_ledger_t *l, const uint8_t *prov, size_t prov_len, uint64_t num_records,
                            const sl_split_done_t *tally, size_t ntally, const sl_split_done_t *done, size_t ndone,
                            bool last)
{
    if (l->rc < 0)
        return;
    int rc = 0;
    if (prov_len > 0 && ntally > 0)
        rc = lazy_append(l, prov, prov_len, num_records, tally, ntally);
    else if (prov_len > 0)
        rc = decode_into_runs(l, prov, prov_len, num_records);
    added(l, rc, done, ndone, last);
}

/* Runs back from the newest that a batch's run may continue: one per
 * worker whose batches interleave, a few. */
#define CONTINUE_BACK 4

void sl__ledger_add_run(sl_ledger_t *l, const sl_provenance_run_t *run, const sl_split_done_t *done, size_t ndone,
                        bool last)
{
    if (l->rc < 0)
        return;
    int rc = 0;
    size_t k = l->num, stop = l->num > CONTINUE_BACK ? l->num - CONTINUE_BACK : 0;
    while (k > stop && !(sl_prov_run_pair(&l->runs[k - 1]) == sl_prov_run_pair(run) &&
                         l->runs[k - 1].begin + l->runs[k - 1].count == run->begin))
        k--;
    if (k > stop)
        l->runs[k - 1].count += run->count; /* ends where the run ends: no wrap (provwire.h) */
    else if ((rc = runs_room(l, l->num + 1)) == 0)
        l->runs[l->num++] = *run;
    added(l, rc, done, ndone, last);
}

int sl__ledger_report(sl_ledger_t *l, uint64_t from, sl_posbits_t *set)
{
    sl_posbits_init(set, l->max_runs);
    /* The dispatcher asks from its oldest lost split's epoch, or 0 when it
     * has none (then the report is empty of lost splits anyway): no split
     * of an epoch it said was done can be outstanding or lost. */
    if (from < l->epochs_done)
        from = l->epochs_done;
    sl__ledger_sync(l);
    int rc = l->rc;
    if (rc == 0)
        rc = sl_posbits_add_set(set, &l->restored, from);
    if (rc == 0)
        rc = sl_posbits_add_set(set, &l->got, from);
    return rc;
}

int sl__report_add_wire(sl_posbits_t *set, const uint8_t *prov, size_t prov_len, uint64_t num_records,
                        uint64_t from, sl_provenance_run_t **scratch, size_t *cap)
{
    if (prov_len == 0)
        return 0;
    uint64_t most = sl_provwire_max_runs(prov, prov_len, num_records); /* as in sl__ledger_add() */
    if (most > *cap) {
        sl_provenance_run_t *p = realloc(*scratch, (size_t)most * sizeof *p);
        if (!p)
            return -ENOMEM;
        *scratch = p;
        *cap = (size_t)most;
    }
    uint64_t n = 0;
    int rc = sl_provwire_read(prov, prov_len, num_records, *scratch, &n, NULL, 0);
    size_t k = 0;
    for (uint64_t i = 0; i < n && rc == 0; i++)
        if ((*scratch)[i].epoch >= from)
            (*scratch)[k++] = (*scratch)[i];
    /* sl_provenance_run_t has sl_posrun_t's layout (posset.h). */
    return rc == 0 && k > 0 ? sl_posbits_add_many(set, *scratch, k) : rc;
}

int sl__ledger_checkpoint(sl_ledger_t *l, uint64_t dataset_id, const uint8_t *key, size_t key_len, uint8_t **out,
                          size_t *len, char *err, size_t errlen)
{
    *out = NULL;
    *len = 0;
    if (l->floor_set && !l->floor_given)
        return sl_errf(err, errlen, SL_EINVAL, "checkpoint: the ledger dropped what was given before epoch %" PRIu32
                       " file %" PRIu32 " record %" PRIu64 " (it serves reports of coordinated reads only)",
                       l->floor.epoch, l->floor.file, l->floor.begin);
    sl__ledger_sync(l);
    if (l->rc < 0)
        return sl_errf(err, errlen, l->rc,
                       "checkpoint: what was consumed needs more than %zu runs of positions (max_ledger_runs; %s)",
                       l->max_runs, why_runs(l));
    sl_posbits_t all;
    sl_posbits_init(&all, l->max_runs);
    int rc = sl_posbits_add_set(&all, &l->restored, 0);
    if (rc == 0)
        rc = sl_posbits_add_set(&all, &l->got, 0);
    /* The runs of what no bitmap on the wire holds. sl_posrun_t has
     * sl_provenance_run_t's layout (posset.h). */
    sl_posrun_t *left = NULL;
    size_t nleft = 0;
    if (rc == 0)
        rc = sl_posbits_runs(&all, CKPT_BITMAP_RUNS, &left, &nleft);
    uint8_t *runs = NULL;
    size_t n = 0;
    if (rc == 0 && nleft > 0)
        rc = sl_provwire_encode((const sl_provenance_run_t *)left, nleft, &runs, &n);
    free(left);
    /* Version 5 only when the record starts within an epoch, and 6 only
     * with bitmaps, so that older libraries still read every other
     * checkpoint. */
    sl_posrun_t at = ledger_place(l);
    bool placed = at.file > 0 || at.begin > 0;
    size_t bitmaps = sl_posbits_bitmaps(&all, CKPT_BITMAP_RUNS, NULL);
    sl_posset_bitmap_t *bm = bitmaps > 0 ? malloc(bitmaps * sizeof *bm) : NULL;
    if (bitmaps > 0 && !bm && rc == 0)
        rc = -ENOMEM;
    uint32_t version = bitmaps > 0 ? CKPT_VERSION : placed ? CKPT_V5 : CKPT_V4;
    size_t fixed = CKPT_HEADER + CKPT_V3_FLAGS + CKPT_V4_DONE + (version >= CKPT_V5 ? CKPT_V5_PLACE : 0);
    size_t counts = version >= CKPT_VERSION ? CKPT_V6_COUNTS + bitmaps * CKPT_BITMAP : 8;
    size_t body = fixed + counts + n;
    uint8_t *buf = rc == 0 ? malloc(body + CKPT_TAG) : NULL;
    if (rc == 0 && !buf)
        rc = -ENOMEM;
    if (rc == 0) {
        memcpy(buf, CKPT_MAGIC, 4);
        sl_put_le32(buf + 4, version);
        sl_put_le64(buf + 8, dataset_id);
        sl_put_le32(buf + CKPT_HEADER, key_len > 0 ? CKPT_MAC : 0);
        sl_put_le32(buf + CKPT_HEADER + 4, 0);
        sl_put_le64(buf + CKPT_HEADER + CKPT_V3_FLAGS, at.epoch);
        if (version >= CKPT_V5) {
            uint8_t *p = buf + CKPT_HEADER + CKPT_V3_FLAGS + CKPT_V4_DONE;
            sl_put_le32(p, at.file);
            sl_put_le32(p + 4, 0);
            sl_put_le64(p + 8, at.begin);
        }
        sl_put_le64(buf + fixed, sl_posbits_size(&all));
        if (version >= CKPT_VERSION) {
            sl_put_le64(buf + fixed + 8, bitmaps);
            sl_posbits_bitmaps(&all, CKPT_BITMAP_RUNS, bm);
            sl_posset_put_bitmaps(bm, bitmaps, buf + fixed + CKPT_V6_COUNTS);
        }
        if (n > 0)
            memcpy(buf + fixed + counts, runs, n);
        rc = ckpt_tag(key, key_len, buf, body, buf + body);
    }
    if (rc == 0) {
        *out = buf;
        *len = body + CKPT_TAG;
    } else if (rc == -ENOSPC) {
        rc = sl_errf(err, errlen, SL_ETOOBIG, "checkpoint: more than %zu runs of positions (max_ledger_runs)",
                     l->max_runs);
    } else {
        rc = sl_errf(err, errlen, rc, "checkpoint: %s", sl_strerror(rc));
    }
    if (rc < 0)
        free(buf);
    free(bm);
    free(runs);
    sl_posbits_clear(&all);
    return rc;
}

/* read_bitmaps()'s: each bitmap into set, its positions counted. */
struct bitmaps_in {
    sl_posbits_t *set;
    uint64_t bits;
};

static int bitmap_in(void *ctx, const sl_posset_bitmap_t *b)
{
    struct bitmaps_in *in = ctx;
    for (unsigned k = 0; k < SL_POSBITS_WORDS; k++)
        in->bits += (uint64_t)__builtin_popcountll(b->w[k]);
    return sl_posbits_add_block(in->set, b->epoch, b->file, b->no, b->w);
}

/* A version 6 checkpoint's bitmaps (after its two counts, nb of them, at
 * most len bytes at p) into set, checked as a version 3 position set's
 * are (sl_posset_get_bitmaps()). @return the bytes they took, or < 0 with
 * a message in err */
static long read_bitmaps(const uint8_t *p, size_t len, uint64_t nb, sl_posbits_t *set, uint64_t *bits, char *err,
                         size_t errlen)
{
    if (nb > len / CKPT_BITMAP)
        return sl_errf(err, errlen, SL_EDATA, "checkpoint: %" PRIu64 " bitmaps do not fit its %zu bytes", nb, len);
    struct bitmaps_in in = {set, 0};
    char why[128];
    int rc = sl_posset_get_bitmaps(p, nb, bitmap_in, &in, why, sizeof why);
    if (rc == SL_EDATA)
        return sl_errf(err, errlen, rc, "checkpoint: %s", why);
    if (rc < 0)
        return rc;
    *bits = in.bits;
    return (long)(nb * CKPT_BITMAP);
}

/* rc of putting a checkpoint's positions in a set of max_units, with a
 * message in err (SL_EDATA: there already). */
static int positions_failed(int rc, size_t max_units, char *err, size_t errlen)
{
    if (rc == -ENOSPC)
        return sl_errf(err, errlen, SL_ETOOBIG, "checkpoint: more than %zu runs of positions (max_ledger_runs)",
                       max_units);
    if (rc == -ENOMEM)
        return sl_errf(err, errlen, rc, "checkpoint: out of memory");
    if (rc < 0 && rc != SL_EDATA)
        return sl_errf(err, errlen, SL_EDATA, "checkpoint: its positions do not make a set (%s)", sl_strerror(rc));
    return rc;
}

/* A checkpoint's positions (len bytes at p, after its fixed fields) into
 * set: version 2 to 5 hold a u64 count and runs; version 6, its bitmaps
 * between the two. The decoder bounds what it allocates by the bytes it is
 * given; the set, by its max_units. */
static int read_positions(const uint8_t *p, size_t len, uint32_t version, sl_posbits_t *set, char *err,
                          size_t errlen)
{
    size_t counts = version >= CKPT_VERSION ? CKPT_V6_COUNTS : 8;
    if (len < counts)
        return sl_errf(err, errlen, SL_EDATA, "checkpoint: cut short (%zu bytes after the header)", len);
    uint64_t positions = sl_get_le64(p), bits = 0;
    if (version >= CKPT_VERSION) {
        long took = read_bitmaps(p + counts, len - counts, sl_get_le64(p + 8), set, &bits, err, errlen);
        if (took < 0)
            return positions_failed((int)took, set->max_units, err, errlen);
        counts += (size_t)took;
        if (bits > positions)
            return sl_errf(err, errlen, SL_EDATA, "checkpoint: its bitmaps hold %" PRIu64 " positions, more than the %"
                           PRIu64 " it says it holds", bits, positions);
        positions -= bits;
    }
    sl_provenance_run_t *runs = NULL;
    uint64_t n = 0;
    char why[256];
    int rc = positions > 0 ? sl_provwire_decode(p + counts, len - counts, positions, &runs, &n, why, sizeof why)
                           : (len > counts ? sl_errf(why, sizeof why, SL_EPROTO, "%zu bytes after no positions",
                                                     len - counts)
                                           : 0);
    if (rc < 0) {
        free(runs);
        return rc == -ENOMEM ? sl_errf(err, errlen, rc, "checkpoint: out of memory")
                             : sl_errf(err, errlen, SL_EDATA, "checkpoint: its positions: %s", why);
    }
    rc = n > 0 ? sl_posbits_add_many(set, runs, n) : 0;
    free(runs);
    return positions_failed(rc, set->max_units, err, errlen);
}

/* Checks a checkpoint as sl__checkpoint_read() does and puts its positions
 * in set (version 1: its posset bytes, checked, in *v1 and *v1_len). */
static int open_checkpoint(const uint8_t *ckpt, size_t len, uint64_t dataset_id, const uint8_t *key, size_t key_len,
                           sl_posbits_t *set, const uint8_t **v1, size_t *v1_len, uint64_t *epochs_done,
                           sl_posrun_t *at, char *err, size_t errlen)
{
    *v1 = NULL;
    *v1_len = 0;
    *epochs_done = 0;
    if (at)
        *at = (sl_posrun_t){0};
    if (len < CKPT_HEADER || memcmp(ckpt, CKPT_MAGIC, 4) != 0)
        return sl_errf(err, errlen, SL_EDATA, "checkpoint: not a Sluice iterator checkpoint");
    uint32_t version = sl_get_le32(ckpt + 4);
    if (version < CKPT_V1 || version > CKPT_VERSION)
        return sl_errf(err, errlen, SL_EDATA, "checkpoint: version %u, this library reads versions %d to %d",
                       (unsigned)version, CKPT_V1, CKPT_VERSION);
    size_t fixed = CKPT_HEADER + CKPT_V3_FLAGS + (version >= CKPT_V4 ? CKPT_V4_DONE : 0) +
                   (version >= CKPT_V5 ? CKPT_V5_PLACE : 0);
    if (version >= CKPT_V3) {
        /* The tag first: nothing of a damaged or forged checkpoint is used. */
        if (len < fixed + CKPT_TAG)
            return sl_errf(err, errlen, SL_EDATA, "checkpoint: cut short (%zu bytes)", len);
        uint32_t flags = sl_get_le32(ckpt + CKPT_HEADER);
        bool mac = flags & CKPT_MAC;
        if (mac && key_len == 0)
            return sl_errf(err, errlen, SL_EDATA,
                           "checkpoint: it was made with a cluster token (its integrity tag is a MAC), or it is "
                           "damaged: restore it with the same --auth-token-file");
        /* Without a MAC the tag is SHA-256, which anyone can check. */
        uint8_t tag[CKPT_TAG];
        size_t body = len - CKPT_TAG;
        if (ckpt_tag(mac ? key : NULL, mac ? key_len : 0, ckpt, body, tag) < 0)
            return sl_errf(err, errlen, -ENOMEM, "checkpoint: out of memory");
        if (CRYPTO_memcmp(tag, ckpt + body, CKPT_TAG) != 0)
            return sl_errf(err, errlen, SL_EDATA, "checkpoint: it is damaged: its %s does not match its bytes%s",
                           mac ? "MAC" : "SHA-256 checksum", mac ? " (or it was made with another cluster token)" : "");
        if (!mac && key_len > 0)
            return sl_errf(err, errlen, SL_EDATA,
                           "checkpoint: it was made without a cluster token, and this client has one: a client "
                           "with a token restores only checkpoints MAC'd with it");
        if ((flags & ~CKPT_MAC) != 0 || sl_get_le32(ckpt + CKPT_HEADER + 4) != 0)
            return sl_errf(err, errlen, SL_EDATA, "checkpoint: unknown flags %#x (a newer library wrote it)",
                           (unsigned)flags);
    } else if (key_len > 0) {
        return sl_errf(err, errlen, SL_EDATA,
                       "checkpoint: version %u carries no integrity tag; a client with a cluster token restores "
                       "only versions %d to %d MAC'd with it",
                       (unsigned)version, CKPT_V3, CKPT_VERSION);
    }
    uint64_t ds = sl_get_le64(ckpt + 8);
    if (ds != dataset_id)
        return sl_errf(err, errlen, SL_EINVAL, "checkpoint of dataset %" PRIu64 ", restored over dataset %" PRIu64,
                       ds, dataset_id);
    sl_posrun_t place = {0};
    if (version >= CKPT_V4) {
        /* Epochs are 32 bits wide in positions; a larger number is no
         * checkpoint this library wrote. */
        uint64_t done = sl_get_le64(ckpt + CKPT_HEADER + CKPT_V3_FLAGS);
        if (done > UINT32_MAX)
            return sl_errf(err, errlen, SL_EDATA, "checkpoint: every epoch below %" PRIu64 " done: past 2^32 epochs",
                           done);
        place.epoch = (uint32_t)done;
    }
    if (version >= CKPT_V5) {
        const uint8_t *p = ckpt + CKPT_HEADER + CKPT_V3_FLAGS + CKPT_V4_DONE;
        place.file = sl_get_le32(p);
        place.begin = sl_get_le64(p + 8);
        /* Version 5 is written only for a place within an epoch; 6 also
         * for one at its start. */
        if (sl_get_le32(p + 4) != 0 || (version == CKPT_V5 && place.file == 0 && place.begin == 0))
            return sl_errf(err, errlen, SL_EDATA, "checkpoint: version 5 without a place within epoch %" PRIu32
                           " (a newer library wrote it, or it is damaged)", place.epoch);
        if (!at && (place.file > 0 || place.begin > 0))
            return sl_errf(err, errlen, SL_EINVAL,
                           "checkpoint: it starts at epoch %" PRIu32 " file %" PRIu32 " record %" PRIu64
                           " (version %u), which this reader cannot resume from", place.epoch, place.file,
                           place.begin, (unsigned)version);
    }
    if (version >= CKPT_V2) {
        bool tagged = version >= CKPT_V3;
        size_t from = tagged ? fixed : CKPT_HEADER;
        int rc = read_positions(ckpt + from, len - from - (tagged ? CKPT_TAG : 0), version, set, err, errlen);
        if (rc == 0) {
            *epochs_done = place.epoch;
            if (at)
                *at = place;
        }
        return rc;
    }
    /* Version 1: posset bytes as they are, checked here as the restore
     * will (a version 3 checkpoint whose version bits were damaged into 1
     * must not pass this function). */
    sl_posset_t check;
    sl_posset_init(&check, set->max_units);
    char why[256];
    int rc = sl_posset_decode(&check, ckpt + CKPT_HEADER, len - CKPT_HEADER, why, sizeof why);
    if (rc == 0 && check.num > 0 && (rc = sl_posbits_add_many(set, check.runs, check.num)) < 0)
        snprintf(why, sizeof why, "%s", sl_strerror(rc));
    sl_posset_clear(&check);
    if (rc < 0)
        return sl_errf(err, errlen, SL_EDATA, "checkpoint: version 1 positions: %s", why);
    *v1 = ckpt + CKPT_HEADER;
    *v1_len = len - CKPT_HEADER;
    return 0;
}

int sl__checkpoint_read(const uint8_t *ckpt, size_t len, uint64_t dataset_id, const uint8_t *key, size_t key_len,
                        size_t max_runs, uint8_t **posset, size_t *posset_len, uint64_t *epochs_done,
                        sl_posrun_t *at, char *err, size_t errlen)
{
    *posset = NULL;
    *posset_len = 0;
    sl_posbits_t set;
    sl_posbits_init(&set, max_runs);
    const uint8_t *v1 = NULL;
    size_t v1_len = 0;
    int rc = open_checkpoint(ckpt, len, dataset_id, key, key_len, &set, &v1, &v1_len, epochs_done, at, err, errlen);
    if (rc == 0 && v1) {
        /* Version 1's bytes go as they are. */
        if ((*posset = malloc(v1_len > 0 ? v1_len : 1)) != NULL) {
            memcpy(*posset, v1, v1_len);
            *posset_len = v1_len;
        } else {
            rc = sl_errf(err, errlen, -ENOMEM, "checkpoint: out of memory");
        }
    } else if (rc == 0 && sl_posbits_bytes(&set, posset, posset_len) < 0) {
        rc = sl_errf(err, errlen, -ENOMEM, "checkpoint: out of memory");
    }
    sl_posbits_clear(&set);
    return rc;
}

int sl__checkpoint_merge(const uint8_t *const *ckpts, const size_t *lens, size_t n, const uint8_t *key,
                         size_t key_len, size_t max_runs, uint8_t **out, size_t *out_len, char *err, size_t errlen)
{
    *out = NULL;
    *out_len = 0;
    if (n == 0)
        return sl_errf(err, errlen, SL_EINVAL, "merge: no checkpoints to merge");
    /* Their union, bitmaps OR'd: each rank's share past the fold is
     * sparse, what they were given together is not. */
    sl_ledger_t all;
    sl__ledger_init(&all, max_runs);
    uint64_t dataset_id = 0;
    sl_posrun_t top = {0}; /* the furthest place of them */
    int rc = 0;
    char why[300];
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (lens[i] < CKPT_HEADER || memcmp(ckpts[i], CKPT_MAGIC, 4) != 0) {
            rc = sl_errf(err, errlen, SL_EDATA, "merge: checkpoint %zu of %zu: not a Sluice iterator checkpoint",
                         i + 1, n);
            break;
        }
        uint64_t ds = sl_get_le64(ckpts[i] + 8);
        if (i == 0) {
            dataset_id = ds;
        } else if (ds != dataset_id) {
            rc = sl_errf(err, errlen, SL_EINVAL,
                         "merge: checkpoint %zu of %zu is of dataset %" PRIu64 ", checkpoint 1 of dataset %" PRIu64,
                         i + 1, n, ds, dataset_id);
            break;
        }
        const uint8_t *v1;
        size_t v1_len;
        uint64_t e = 0;
        sl_posrun_t at;
        rc = open_checkpoint(ckpts[i], lens[i], ds, key, key_len, &all.got, &v1, &v1_len, &e, &at, why, sizeof why);
        if (rc == SL_ETOOBIG)
            rc = sl_errf(err, errlen, SL_ETOOBIG, "merge: more than %zu runs of positions in all (max_ledger_runs)",
                         max_runs);
        else if (rc < 0)
            rc = sl_errf(err, errlen, rc, "merge: checkpoint %zu of %zu: %s", i + 1, n, why);
        /* A rank of a named job folds only once every client of the job was
         * given the records before the place (epochs_folded, place_folded):
         * those before the furthest place of any rank were given to them
         * all. */
        if (rc == 0 && sl_posrun_before(top, at))
            top = at;
    }
    if (rc == 0) {
        given_now(&all, top.epoch, top.file, top.begin);
        rc = sl__ledger_checkpoint(&all, dataset_id, key, key_len, out, out_len, err, errlen);
    }
    sl__ledger_free(&all);
    return rc;
}
