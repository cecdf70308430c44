/* delta.c: see delta.h. */
#include "delta.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "auth.h"
#include "errbuf.h"
#include "le.h"
#include "provwire.h"

#define DELTA_MAGIC "SLDL"
#define DELTA_VERSION 1
#define DELTA_HEADER 16
#define REC_BATCH 'B'
#define REC_FOLD 'E'
#define BATCH_FIXED (1 + 8 + 4 + 4 + 1)
#define FOLD_FIXED (1 + 8 + 8)
#define REC_PLACE 'P'
#define PLACE_FIXED (1 + 4 + 4 + 8)

/* Room for n more bytes in the log; on failure the log is lost for good. */
static uint8_t *log_room(sl_delta_log_t *d, size_t n)
{
    if (d->rc < 0)
        return NULL;
    if (n > SL_DELTA_LOG_MAX - d->len) {
        d->rc = SL_ETOOBIG;
    } else if (d->len + n > d->cap) {
        size_t cap = d->cap * 2 > d->len + n ? d->cap * 2 : d->len + n;
        if (cap < 256)
            cap = 256;
        uint8_t *p = realloc(d->buf, cap);
        if (p) {
            d->buf = p;
            d->cap = cap;
        } else {
            d->rc = -ENOMEM;
        }
    }
    if (d->rc < 0) {
        free(d->buf);
        d->buf = NULL;
        d->len = d->cap = 0;
        return NULL;
    }
    uint8_t *at = d->buf + d->len;
    d->len += n;
    return at;
}

void sl__delta_log_batch(sl_delta_log_t *d, const uint8_t *prov, size_t prov_len, uint64_t num_records,
                         const sl_split_done_t *done, size_t ndone, bool last)
{
    if (d->rc < 0)
        return;
    uint8_t *dw = NULL;
    size_t dlen = 0;
    if (ndone > 0 && sl_provwire_encode_done(done, ndone, &dw, &dlen) < 0) {
        d->rc = -ENOMEM;
        free(d->buf);
        d->buf = NULL;
        d->len = d->cap = 0;
        return;
    }
    /* A batch's provenance and notices were bounded by max_batch_bytes
     * when they arrived; the log's own bound is SL_DELTA_LOG_MAX. */
    uint8_t *p = prov_len <= UINT32_MAX && dlen <= UINT32_MAX ? log_room(d, BATCH_FIXED + prov_len + dlen) : NULL;
    if (!p && d->rc == 0) {
        d->rc = SL_ETOOBIG;
        free(d->buf);
        d->buf = NULL;
        d->len = d->cap = 0;
    }
    if (p) {
        p[0] = REC_BATCH;
        sl_put_le64(p + 1, num_records);
        sl_put_le32(p + 9, (uint32_t)prov_len);
        sl_put_le32(p + 13, (uint32_t)dlen);
        p[17] = last ? 1 : 0;
        if (prov_len > 0)
            memcpy(p + BATCH_FIXED, prov, prov_len);
        if (dlen > 0)
            memcpy(p + BATCH_FIXED + prov_len, dw, dlen);
    }
    free(dw);
}

void sl__delta_log_epochs_done(sl_delta_log_t *d, uint64_t below, size_t waiting)
{
    uint8_t *p = log_room(d, FOLD_FIXED);
    if (!p)
        return;
    p[0] = REC_FOLD;
    sl_put_le64(p + 1, below);
    sl_put_le64(p + 9, waiting);
}

void sl__delta_log_given_below(sl_delta_log_t *d, uint32_t epoch, uint32_t file, uint64_t pos)
{
    uint8_t *p = log_room(d, PLACE_FIXED);
    if (!p)
        return;
    p[0] = REC_PLACE;
    sl_put_le32(p + 1, epoch);
    sl_put_le32(p + 5, file);
    sl_put_le64(p + 9, pos);
}

int sl__delta_log_take(sl_delta_log_t *d, uint64_t dataset_id, uint8_t **out, size_t *len, char *err, size_t errlen)
{
    *out = NULL;
    *len = 0;
    if (d->rc == SL_ETOOBIG)
        return sl_errf(err, errlen, SL_ETOOBIG,
                       "delta: more than %zu MiB recorded and not taken (take a delta after every batch or every "
                       "few); this iterator gives no deltas any more, take checkpoints",
                       SL_DELTA_LOG_MAX >> 20);
    if (d->rc < 0)
        return sl_errf(err, errlen, d->rc, "delta: out of memory while recording a batch; this iterator gives no "
                       "deltas any more, take checkpoints");
    uint8_t *buf = malloc(DELTA_HEADER + d->len);
    if (!buf)
        return sl_errf(err, errlen, -ENOMEM, "delta: out of memory");
    memcpy(buf, DELTA_MAGIC, 4);
    sl_put_le32(buf + 4, DELTA_VERSION);
    sl_put_le64(buf + 8, dataset_id);
    if (d->len > 0)
        memcpy(buf + DELTA_HEADER, d->buf, d->len);
    *out = buf;
    *len = DELTA_HEADER + d->len;
    d->len = 0;
    /* A log that grew for a caller that took late shrinks back. */
    if (d->cap > 65536) {
        free(d->buf);
        d->buf = NULL;
        d->cap = 0;
    }
    return 0;
}

void sl__delta_log_free(sl_delta_log_t *d)
{
    free(d->buf);
    *d = (sl_delta_log_t){0};
}

/* Checks one record at p (n bytes left, at offset `at` of the delta):
 * its length in *used. Notices and provenance are checked as when they
 * came off the wire. */
static int check_record(const uint8_t *p, size_t n, size_t at, size_t *used, sl_provenance_run_t **scratch,
                        size_t *cap, char *err, size_t errlen)
{
    char why[256];
    if (p[0] == REC_FOLD) {
        if (n < FOLD_FIXED)
            return sl_errf(err, errlen, SL_EDATA, "delta: a fold record cut short at byte %zu", at);
        uint64_t below = sl_get_le64(p + 1);
        if (below > UINT32_MAX)
            return sl_errf(err, errlen, SL_EDATA, "delta: epochs below %" PRIu64 " done at byte %zu: past 2^32 epochs",
                           below, at);
        *used = FOLD_FIXED;
        return 0;
    }
    if (p[0] == REC_PLACE) {
        if (n < PLACE_FIXED)
            return sl_errf(err, errlen, SL_EDATA, "delta: a place fold record cut short at byte %zu", at);
        *used = PLACE_FIXED;
        return 0;
    }
    if (p[0] != REC_BATCH)
        return sl_errf(err, errlen, SL_EDATA, "delta: unknown record kind %#x at byte %zu", p[0], at);
    if (n < BATCH_FIXED)
        return sl_errf(err, errlen, SL_EDATA, "delta: a batch record cut short at byte %zu", at);
    uint64_t num_records = sl_get_le64(p + 1);
    size_t prov_len = sl_get_le32(p + 9), dlen = sl_get_le32(p + 13);
    if (p[17] > 1)
        return sl_errf(err, errlen, SL_EDATA, "delta: a batch record's end flag is %u at byte %zu", p[17], at);
    if (prov_len > n - BATCH_FIXED || dlen > n - BATCH_FIXED - prov_len)
        return sl_errf(err, errlen, SL_EDATA,
                       "delta: a batch record at byte %zu says %zu bytes of provenance and %zu of notices, %zu "
                       "bytes are left",
                       at, prov_len, dlen, n - BATCH_FIXED);
    if (prov_len > 0) {
        /* Room by the bytes, not by what they claim, as in sl__ledger_add(). */
        uint64_t most = sl_provwire_max_runs(p + BATCH_FIXED, prov_len, num_records);
        if (most > *cap) {
            sl_provenance_run_t *r = realloc(*scratch, (size_t)most * sizeof *r);
            if (!r)
                return sl_errf(err, errlen, -ENOMEM, "delta: out of memory");
            *scratch = r;
            *cap = (size_t)most;
        }
        uint64_t got = 0;
        if (sl_provwire_read(p + BATCH_FIXED, prov_len, num_records, *scratch, &got, why, sizeof why) < 0)
            return sl_errf(err, errlen, SL_EDATA, "delta: the provenance of the batch at byte %zu: %s", at, why);
    }
    uint64_t nd = 0;
    if (dlen > 0 && sl_provwire_read_done(p + BATCH_FIXED + prov_len, dlen, NULL, 0, &nd, why, sizeof why) < 0)
        return sl_errf(err, errlen, SL_EDATA, "delta: the split-done notices of the batch at byte %zu: %s", at, why);
    *used = BATCH_FIXED + prov_len + dlen;
    return 0;
}

int sl__ledger_apply_delta(sl_ledger_t *l, uint64_t dataset_id, const uint8_t *p, size_t len, char *err,
                           size_t errlen)
{
    if (len < DELTA_HEADER || memcmp(p, DELTA_MAGIC, 4) != 0)
        return sl_errf(err, errlen, SL_EDATA, "delta: not a Sluice iterator delta (%zu bytes)", len);
    uint32_t version = sl_get_le32(p + 4);
    if (version != DELTA_VERSION)
        return sl_errf(err, errlen, SL_EDATA, "delta: version %u, this library reads version %d", (unsigned)version,
                       DELTA_VERSION);
    uint64_t ds = sl_get_le64(p + 8);
    if (ds != dataset_id)
        return sl_errf(err, errlen, SL_EINVAL, "delta of dataset %" PRIu64 ", applied to a builder of dataset %" PRIu64,
                       ds, dataset_id);
    /* Every record is checked before the first is applied. */
    sl_provenance_run_t *scratch = NULL;
    size_t cap = 0, used = 0, most_done = 0;
    int rc = 0;
    for (size_t at = DELTA_HEADER; at < len && rc == 0; at += used) {
        rc = check_record(p + at, len - at, at, &used, &scratch, &cap, err, errlen);
        if (rc == 0 && p[at] == REC_BATCH) {
            size_t dlen = sl_get_le32(p + at + 13);
            most_done = dlen / 6 > most_done ? dlen / 6 : most_done;
        }
    }
    free(scratch);
    if (rc < 0)
        return rc;
    sl_split_done_t *done = most_done > 0 ? malloc(most_done * sizeof *done) : NULL;
    if (most_done > 0 && !done)
        return sl_errf(err, errlen, -ENOMEM, "delta: out of memory");
    for (size_t at = DELTA_HEADER; at < len; at += used) {
        const uint8_t *r = p + at;
        if (r[0] == REC_FOLD) {
            sl__ledger_epochs_done(l, sl_get_le64(r + 1), (size_t)sl_get_le64(r + 9));
            used = FOLD_FIXED;
            continue;
        }
        if (r[0] == REC_PLACE) {
            sl__ledger_given_below(l, sl_get_le32(r + 1), sl_get_le32(r + 5), sl_get_le64(r + 9));
            used = PLACE_FIXED;
            continue;
        }
        size_t prov_len = sl_get_le32(r + 9), dlen = sl_get_le32(r + 13);
        uint64_t nd = 0;
        if (dlen > 0)
            sl_provwire_read_done(r + BATCH_FIXED + prov_len, dlen, done, most_done, &nd, NULL, 0);
        sl__ledger_add(l, prov_len > 0 ? r + BATCH_FIXED : NULL, prov_len, sl_get_le64(r + 1), done, (size_t)nd,
                       r[17] != 0);
        used = BATCH_FIXED + prov_len + dlen;
    }
    free(done);
    return 0;
}

struct sl_ckpt_builder {
    sl_ledger_t ledger;
    uint64_t dataset_id;
    uint8_t key[SL_AUTH_MAX_TOKEN];
    size_t key_len;
    char err[1024];
};

int sl_ckpt_builder_open(uint64_t dataset_id, const char *auth_token_file, size_t max_ledger_runs,
                         const uint8_t *ckpt, size_t len, sl_ckpt_builder_t **out)
{
    sl_ckpt_builder_t *b = calloc(1, sizeof *b);
    *out = b;
    if (!b)
        return -ENOMEM;
    b->dataset_id = dataset_id;
    /* The ledger's bound is all the builder takes of an iterator's options. */
    sl__ledger_init(&b->ledger, sl__ledger_max_runs(&(sl_iterator_opts_t){.max_ledger_runs = max_ledger_runs}));
    /* Only the token: the builder makes no connection. */
    sl_auth_t auth = {0};
    sl_auth_opts_t ao = {.token_file = auth_token_file};
    int rc = sl_auth_load(&auth, &ao, b->err, sizeof b->err);
    if (rc == 0) {
        memcpy(b->key, auth.token, auth.token_len);
        b->key_len = auth.token_len;
    }
    sl_auth_free(&auth);
    if (rc < 0 || !ckpt || len == 0)
        return rc;
    uint8_t *positions = NULL;
    size_t positions_len = 0;
    uint64_t epochs_done = 0;
    sl_posrun_t at;
    char why[512];
    rc = sl__checkpoint_read(ckpt, len, dataset_id, b->key, b->key_len, b->ledger.max_runs, &positions,
                             &positions_len, &epochs_done, &at, b->err, sizeof b->err);
    if (rc == 0) {
        rc = sl__ledger_restore(&b->ledger, positions, positions_len, at, why, sizeof why);
        if (rc < 0)
            snprintf(b->err, sizeof b->err, "checkpoint: %s", why);
    }
    free(positions);
    return rc;
}

int sl_ckpt_builder_apply(sl_ckpt_builder_t *b, const uint8_t *delta, size_t len)
{
    return sl__ledger_apply_delta(&b->ledger, b->dataset_id, delta, len, b->err, sizeof b->err);
}

int sl_ckpt_builder_checkpoint(sl_ckpt_builder_t *b, uint8_t **out, size_t *len)
{
    return sl__ledger_checkpoint(&b->ledger, b->dataset_id, b->key, b->key_len, out, len, b->err, sizeof b->err);
}

const char *sl_ckpt_builder_errmsg(const sl_ckpt_builder_t *b)
{
    return b ? b->err : "out of memory";
}

void sl_ckpt_builder_close(sl_ckpt_builder_t *b)
{
    if (!b)
        return;
    sl__ledger_free(&b->ledger);
    OPENSSL_cleanse(b->key, sizeof b->key);
    free(b);
}
