/*
 * sluice_cat.c: sluice-cat prints what a trainer would receive from a job:
 * jsonl (one JSON object per batch), count (nothing per batch) or raw (the
 * tensor bytes), and a summary line on stderr.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <time.h>

#include "sluice.h"

static const char *program = "sluice-cat";

enum format { FMT_JSONL, FMT_COUNT, FMT_RAW };

#define MAX_SPEC_BYTES (1024 * 1024)

static void usage(FILE *f)
{
    fprintf(f,
            "usage: %s --dispatcher HOST:PORT (--dataset SPEC.json | --dataset-id ID) [options]\n"
            "       %s --merge-checkpoints --checkpoint-out OUT [--auth-token-file FILE] CKPT...\n"
            "                           merge the checkpoints of a named job's ranks (stopped at a\n"
            "                           common step) into one that every rank resumes from\n"
            "  --dataset-id ID          read a dataset registered before, by its id or by the name it\n"
            "                           was registered under (--dataset-name), instead of --dataset\n"
            "  --dataset-name NAME      register --dataset under NAME (1 to 127 of [A-Za-z0-9_.:/-],\n"
            "                           not all digits); a name another spec holds is refused\n"
            "  --describe               print the dataset's id and element spec as one JSON line\n"
            "                           ({\"dataset_id\": N, \"element_spec\": {name: {\"shape\": [...],\n"
            "                           \"dtype\": ...}} or null) and read nothing\n"
            "  --sharding POLICY        off (default), dynamic, file, data, file_or_data, hint\n"
            "  --job-name NAME          join or create the named (shared) job\n"
            "  --repetition N           which pass (epoch) of the named job to join (default 0);\n"
            "                           one that already ended gives its end at once\n"
            "  --num-consumers N --consumer-index I   coordinated reads (a named job, an infinite dataset)\n"
            "  --target-workers T       any (default) or local (workers on this host only)\n"
            "  --with-worker            jsonl: add \"_worker\" (the worker's address) and, for\n"
            "                           coordinated reads, \"_round\" to every batch\n"
            "  --with-provenance        jsonl: add \"_provenance\" ([[epoch, file, begin, count], ...])\n"
            "                           and, under dynamic sharding, \"_splits_done\" (the splits the\n"
            "                           worker finished with that batch); notices after the last\n"
            "                           batch come as a last line {\"_splits_done\": [...]}\n"
            "  --no-provenance          dynamic sharding: workers send no provenance and the client\n"
            "                           keeps no record of what it received (cheaper; after a\n"
            "                           worker loss some elements may come twice; no checkpoints)\n"
            "  --no-shm                 every batch over the worker's socket, also from a worker on\n"
            "                           this host (which otherwise hands them over in shared memory)\n"
            "  --checkpoint-out FILE    at the end (or --limit), write the iterator's checkpoint\n"
            "                           (dynamic sharding; turns provenance on)\n"
            "  --resume-from FILE       continue from a checkpoint: every element it does not\n"
            "                           hold, exactly once (same dataset, dynamic sharding)\n"
            "  --max-ledger-runs N      runs of positions the record of what arrived may hold\n"
            "                           (default and most 2097152; past it: no checkpoint, and a\n"
            "                           worker loss may repeat elements, said on stderr)\n"
            "  --auth-token-file FILE   the cluster token (default: SLUICE_AUTH_TOKEN_FILE, if set)\n"
            "  --tls-cert FILE --tls-key FILE --tls-ca FILE\n"
            "                           TLS 1.3 to the dispatcher and workers, verified against the CA\n"
            "  --format FMT             jsonl (default), count or raw\n"
            "  --limit N                stop after N batches\n"
            "  --max-outstanding N      batch requests in flight and queued (default: as many\n"
            "                           batches as --window-mb holds, 8 to 32)\n"
            "  --per-worker-outstanding N  batch requests in flight to one worker, at most 16\n"
            "                           (default: half the window, 4 to 16)\n"
            "  --window-mb N            MiB of batches the default window holds (default 32)\n"
            "  --timeout-ms N           longest wait for an unresponsive worker (default 30000)\n"
            "  --dispatcher-timeout-ms N  how long to ride through an unreachable dispatcher,\n"
            "                           reading what the workers serve (default 3600000)\n"
            "  --progress               a progress line on stderr\n"
            "  --version                print the version and exit\n",
            program, program);
}

/* SIGINT or SIGTERM: the loop stops at its next wait (at most INTERRUPT_POLL_MS). */
static volatile sig_atomic_t interrupted;
#define INTERRUPT_POLL_MS 100

static void on_signal(int sig)
{
    interrupted = sig;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static float half_to_float(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    float v;
    if (exp == 0)
        v = ldexpf((float)mant, -24);
    else if (exp == 31)
        v = mant ? NAN : INFINITY;
    else
        v = ldexpf((float)(mant | 0x400), exp - 25);
    return sign ? -v : v;
}

static void print_float(FILE *out, double v)
{
    if (isnan(v) || isinf(v))
        fputs("null", out); /* JSON has no NaN or infinity */
    else
        fprintf(out, "%.9g", v);
}

/* Bytes as a JSON string: valid JSON for any bytes, read as Latin-1. */
static void print_bytes(FILE *out, const uint8_t *p, size_t n)
{
    fputc('"', out);
    for (size_t i = 0; i < n; i++) {
        uint8_t ch = p[i];
        if (ch == '"' || ch == '\\')
            fprintf(out, "\\%c", ch);
        else if (ch < 0x20 || ch >= 0x7f)
            fprintf(out, "\\u%04x", ch);
        else
            fputc(ch, out);
    }
    fputc('"', out);
}

static void print_value(FILE *out, const sl_tensor_t *t, const uint8_t *base, size_t i)
{
    switch (t->dtype) {
    case SL_DTYPE_BOOL: fputs(base[i] ? "true" : "false", out); break;
    case SL_DTYPE_INT8: fprintf(out, "%d", ((const int8_t *)base)[i]); break;
    case SL_DTYPE_INT16: fprintf(out, "%d", ((const int16_t *)base)[i]); break;
    case SL_DTYPE_INT32: fprintf(out, "%" PRId32, ((const int32_t *)base)[i]); break;
    case SL_DTYPE_INT64: fprintf(out, "%" PRId64, ((const int64_t *)base)[i]); break;
    case SL_DTYPE_UINT8: fprintf(out, "%u", base[i]); break;
    case SL_DTYPE_UINT16: fprintf(out, "%u", ((const uint16_t *)base)[i]); break;
    case SL_DTYPE_UINT32: fprintf(out, "%" PRIu32, ((const uint32_t *)base)[i]); break;
    case SL_DTYPE_UINT64: fprintf(out, "%" PRIu64, ((const uint64_t *)base)[i]); break;
    case SL_DTYPE_FLOAT16: print_float(out, half_to_float(((const uint16_t *)base)[i])); break;
    case SL_DTYPE_BFLOAT16: {
        uint32_t bits = (uint32_t)((const uint16_t *)base)[i] << 16;
        float f;
        memcpy(&f, &bits, sizeof f);
        print_float(out, f);
        break;
    }
    case SL_DTYPE_FLOAT32: print_float(out, ((const float *)base)[i]); break;
    case SL_DTYPE_FLOAT64: print_float(out, ((const double *)base)[i]); break;
    default: fputs("null", out); break; /* bytes are printed by print_nested */
    }
}

/* Prints values [first, first + count) of dims[0..rank) as nested lists. */
static void print_nested(FILE *out, const sl_tensor_t *t, const uint8_t *base, const int64_t *dims, int rank,
                         size_t first, const uint64_t *offsets, const uint8_t *strings)
{
    if (rank == 0) {
        if (t->dtype == SL_DTYPE_BYTES)
            print_bytes(out, strings + offsets[first], (size_t)(offsets[first + 1] - offsets[first]));
        else
            print_value(out, t, base, first);
        return;
    }
    size_t inner = 1;
    for (int d = 1; d < rank; d++)
        inner *= (size_t)dims[d];
    fputc('[', out);
    for (int64_t i = 0; i < dims[0]; i++) {
        if (i)
            fputc(',', out);
        print_nested(out, t, base, dims + 1, rank - 1, first + (size_t)i * inner, offsets, strings);
    }
    fputc(']', out);
}

static void print_tensor(FILE *out, const sl_tensor_t *t)
{
    const uint8_t *base = t->data;
    const uint64_t *offsets = NULL;
    const uint8_t *strings = NULL;
    if (t->dtype == SL_DTYPE_BYTES) {
        size_t n = 1;
        if (t->row_splits)
            n = (size_t)t->row_splits[t->num_row_splits - 1];
        else
            for (int d = 0; d < t->rank; d++)
                n *= (size_t)t->shape[d];
        offsets = (const uint64_t *)t->data;
        strings = base + (n + 1) * sizeof(uint64_t);
    }
    if (!t->row_splits) {
        print_nested(out, t, base, t->shape, t->rank, 0, offsets, strings);
        return;
    }
    /* Ragged: row r holds the values [splits[r], splits[r+1]), each of the
     * fixed inner shape shape[2..]. */
    size_t inner = 1;
    for (int d = 2; d < t->rank; d++)
        inner *= (size_t)t->shape[d];
    fputc('[', out);
    for (size_t r = 0; r + 1 < t->num_row_splits; r++) {
        if (r)
            fputc(',', out);
        int64_t dims[SL_MAX_RANK];
        dims[0] = t->row_splits[r + 1] - t->row_splits[r];
        for (int d = 2; d < t->rank; d++)
            dims[d - 1] = t->shape[d];
        print_nested(out, t, base, dims, t->rank - 1, (size_t)t->row_splits[r] * inner, offsets, strings);
    }
    fputc(']', out);
}

static void print_splits_done(FILE *out, const sl_split_done_t *d, size_t n)
{
    fputs("\"_splits_done\":[", out);
    for (size_t i = 0; i < n; i++)
        fprintf(out,
                "%s{\"split_id\":%" PRIu64 ",\"epoch\":%" PRIu32 ",\"file_index\":%" PRIu32 ",\"begin\":%" PRIu64
                ",\"end\":%" PRIu64 ",\"delivered\":%" PRIu64 "}",
                i ? "," : "", d[i].split_id, d[i].epoch, d[i].file_index, d[i].begin, d[i].end, d[i].delivered);
    fputc(']', out);
}

/* "_provenance" and "_splits_done" of --with-provenance, then a comma when
 * the batch has tensors to follow. */
static void print_provenance(FILE *out, const sl_batch_t *b)
{
    size_t n, nd;
    const sl_provenance_run_t *r = sl_batch_provenance(b, &n);
    const sl_split_done_t *d = sl_batch_splits_done(b, &nd);
    fputs("\"_provenance\":[", out);
    for (size_t i = 0; i < n; i++)
        fprintf(out, "%s[%" PRIu32 ",%" PRIu32 ",%" PRIu64 ",%" PRIu64 "]", i ? "," : "", r[i].epoch,
                r[i].file_index, r[i].begin, r[i].count);
    fputc(']', out);
    if (nd > 0) {
        fputc(',', out);
        print_splits_done(out, d, nd);
    }
    if (sl_batch_num_tensors(b) > 0)
        fputc(',', out);
}

static bool with_provenance;

static void print_batch_json(FILE *out, const sl_batch_t *b, bool with_worker, bool coordinated)
{
    fputc('{', out);
    if (with_provenance)
        print_provenance(out, b);
    if (with_worker) {
        fputs("\"_worker\":", out);
        print_bytes(out, (const uint8_t *)sl_batch_worker(b), strlen(sl_batch_worker(b)));
        if (coordinated)
            fprintf(out, ",\"_round\":%" PRIu64, sl_batch_round(b));
        if (sl_batch_num_tensors(b) > 0)
            fputc(',', out);
    }
    for (int i = 0; i < sl_batch_num_tensors(b); i++) {
        const sl_tensor_t *t = sl_batch_tensor(b, i);
        if (i)
            fputc(',', out);
        print_bytes(out, (const uint8_t *)t->name, strlen(t->name));
        fputc(':', out);
        print_tensor(out, t);
    }
    fputs("}\n", out);
}

/* A checkpoint holds at most 2,097,152 runs (max_ledger_runs) of at most
 * 30 bytes in the compact form (provwire.h; about 3 a run), and headers. */
#define MAX_CKPT_BYTES ((size_t)2097152 * 30 + 128)

static char *read_file(const char *opt, const char *path, size_t max, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: --%s %s: %s\n", program, opt, path, strerror(errno));
        return NULL;
    }
    /* Room for what the file holds now (and one byte to see it grew past max). */
    struct stat sb;
    size_t room = fstat(fileno(f), &sb) == 0 && sb.st_size >= 0 && (uint64_t)sb.st_size < max ? (size_t)sb.st_size : max;
    char *buf = malloc(room + 2);
    size_t n = buf ? fread(buf, 1, room + 1, f) : 0;
    fclose(f);
    if (!buf || n > room) {
        fprintf(stderr, "%s: --%s %s: %s %zu bytes\n", program, opt, path,
                !buf ? "out of memory for" : room < max ? "grew while read, past" : "larger than", room);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* Writes a checkpoint (takes ckpt) to path: to path.tmp, synced, then
 * renamed, so path is the old checkpoint or the new one, never half. */
static int write_bytes(uint8_t *ckpt, size_t len, const char *path)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    bool ok = f && fwrite(ckpt, 1, len, f) == len && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (f && fclose(f) != 0)
        ok = false;
    if (ok && rename(tmp, path) != 0)
        ok = false;
    free(ckpt);
    if (!ok) {
        fprintf(stderr, "%s: --checkpoint-out %s: %s\n", program, path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* The element spec as JSON: {name: {"shape": [d or null...] or null, "dtype": name[, "ragged": true]}}, or null. */
static void print_element_spec(FILE *out, const sl_elemspec_t *es)
{
    if (!es->known) {
        fputs("null", out);
        return;
    }
    fputc('{', out);
    for (int i = 0; i < es->num_components; i++) {
        const sl_component_spec_t *c = &es->components[i];
        fprintf(out, "%s\"%s\": {\"shape\": ", i ? ", " : "", c->name); /* names are [A-Za-z0-9_./-] */
        if (c->rank < 0) {
            fputs("null", out);
        } else {
            fputc('[', out);
            for (int d = 0; d < c->rank; d++) {
                if (c->shape[d] < 0)
                    fprintf(out, "%snull", d ? ", " : "");
                else
                    fprintf(out, "%s%" PRId64, d ? ", " : "", c->shape[d]);
            }
            fputc(']', out);
        }
        fprintf(out, ", \"dtype\": \"%s\"%s}", sl_dtype_name(c->dtype), c->ragged ? ", \"ragged\": true" : "");
    }
    fputc('}', out);
}

static int write_checkpoint(sl_iterator_t *it, const char *path)
{
    uint8_t *ckpt;
    size_t len;
    int rc = sl_iterator_checkpoint(it, &ckpt, &len);
    if (rc < 0) {
        fprintf(stderr, "%s: --checkpoint-out: %s\n", program, sl_iterator_errmsg(it));
        return rc;
    }
    return write_bytes(ckpt, len, path);
}

/* --merge-checkpoints: the n files' checkpoints merged into out. @return the exit status */
static int merge_checkpoints(char **files, int n, const char *token_file, const char *out)
{
    uint8_t **ckpts = calloc((size_t)n, sizeof *ckpts);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    int status = 1;
    if (!ckpts || !lens) {
        fprintf(stderr, "%s: --merge-checkpoints: out of memory\n", program);
        goto out;
    }
    for (int i = 0; i < n; i++) {
        if (!(ckpts[i] = (uint8_t *)read_file("merge-checkpoints", files[i], MAX_CKPT_BYTES, &lens[i])))
            goto out;
    }
    uint8_t *merged;
    size_t len;
    char err[512];
    if (sl_checkpoint_merge((const uint8_t *const *)ckpts, lens, (size_t)n, token_file, &merged, &len, err,
                            sizeof err) < 0) {
        fprintf(stderr, "%s: --merge-checkpoints: %s\n", program, err);
        goto out;
    }
    if (write_bytes(merged, len, out) == 0)
        status = 0;
out:
    for (int i = 0; ckpts && i < n; i++)
        free(ckpts[i]);
    free(ckpts);
    free(lens);
    return status;
}

static long parse_long(const char *opt, const char *v, long min, long max)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v || x < min || x > max) {
        fprintf(stderr, "%s: --%s: \"%s\" is not an integer in [%ld, %ld]\n", program, opt, v, min, max);
        exit(2);
    }
    return x;
}

int main(int argc, char **argv)
{
    enum { O_DISP = 1, O_DATASET, O_SHARDING, O_JOB, O_NCONS, O_CIDX, O_FORMAT, O_LIMIT, O_OUT, O_TIMEOUT, O_DISP_TIMEOUT,
           O_PROGRESS, O_HELP, O_TARGET, O_WITH_WORKER, O_WITH_PROV, O_CKPT_OUT, O_RESUME, O_NO_PROV, O_LEDGER, O_AUTH, O_CERT, O_KEY, O_CA, O_REP,
           O_VERSION, O_DATASET_ID, O_DATASET_NAME, O_DESCRIBE, O_MERGE, O_PER_WORKER, O_NO_SHM,
           O_WINDOW };
    static const struct option longopts[] = {
        {"dispatcher", required_argument, NULL, O_DISP},
        {"dataset", required_argument, NULL, O_DATASET},
        {"dataset-id", required_argument, NULL, O_DATASET_ID},
        {"dataset-name", required_argument, NULL, O_DATASET_NAME},
        {"describe", no_argument, NULL, O_DESCRIBE},
        {"sharding", required_argument, NULL, O_SHARDING},
        {"job-name", required_argument, NULL, O_JOB},
        {"repetition", required_argument, NULL, O_REP},
        {"num-consumers", required_argument, NULL, O_NCONS},
        {"consumer-index", required_argument, NULL, O_CIDX},
        {"format", required_argument, NULL, O_FORMAT},
        {"limit", required_argument, NULL, O_LIMIT},
        {"max-outstanding", required_argument, NULL, O_OUT},
        {"per-worker-outstanding", required_argument, NULL, O_PER_WORKER},
        {"window-mb", required_argument, NULL, O_WINDOW},
        {"timeout-ms", required_argument, NULL, O_TIMEOUT},
        {"dispatcher-timeout-ms", required_argument, NULL, O_DISP_TIMEOUT},
        {"progress", no_argument, NULL, O_PROGRESS},
        {"target-workers", required_argument, NULL, O_TARGET},
        {"with-worker", no_argument, NULL, O_WITH_WORKER},
        {"with-provenance", no_argument, NULL, O_WITH_PROV},
        {"no-provenance", no_argument, NULL, O_NO_PROV},
        {"no-shm", no_argument, NULL, O_NO_SHM},
        {"checkpoint-out", required_argument, NULL, O_CKPT_OUT},
        {"resume-from", required_argument, NULL, O_RESUME},
        {"max-ledger-runs", required_argument, NULL, O_LEDGER},
        {"auth-token-file", required_argument, NULL, O_AUTH},
        {"tls-cert", required_argument, NULL, O_CERT},
        {"tls-key", required_argument, NULL, O_KEY},
        {"tls-ca", required_argument, NULL, O_CA},
        {"merge-checkpoints", no_argument, NULL, O_MERGE},
        {"help", no_argument, NULL, O_HELP},
        {"version", no_argument, NULL, O_VERSION},
        {NULL, 0, NULL, 0},
    };
    const char *dispatcher = NULL, *dataset = NULL, *checkpoint_out = NULL, *resume_from = NULL;
    const char *dataset_ref = NULL, *dataset_name = NULL;
    bool describe = false;
    enum format fmt = FMT_JSONL;
    long limit = -1, num_consumers = 0;
    bool progress = false, with_worker = false, have_index = false, no_provenance = false, merge = false;
    bool no_shm = false;
    sl_iterator_opts_t io;
    sl_iterator_opts_init(&io);
    sl_client_opts_t co;
    sl_client_opts_init(&co);
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case O_DISP: dispatcher = optarg; break;
        case O_DATASET: dataset = optarg; break;
        case O_DATASET_ID: dataset_ref = optarg; break;
        case O_DATASET_NAME: dataset_name = optarg; break;
        case O_DESCRIBE: describe = true; break;
        case O_SHARDING:
            if (sl_sharding_parse(optarg, &io.sharding) < 0) {
                fprintf(stderr, "%s: --sharding: \"%s\" is not off, dynamic, file, data, file_or_data or hint\n",
                        program, optarg);
                return 2;
            }
            break;
        case O_JOB: io.job_name = optarg; break;
        case O_REP: io.repetition = (uint64_t)parse_long("repetition", optarg, 0, __LONG_MAX__); break;
        case O_NCONS: num_consumers = parse_long("num-consumers", optarg, 1, 1 << 16); break;
        case O_CIDX:
            io.consumer_index = (int)parse_long("consumer-index", optarg, 0, 1 << 16);
            have_index = true;
            break;
        case O_TARGET:
            if (sl_target_workers_parse(optarg, &io.target_workers) < 0) {
                fprintf(stderr, "%s: --target-workers: \"%s\" is not any or local\n", program, optarg);
                return 2;
            }
            break;
        case O_WITH_WORKER: with_worker = true; break;
        case O_WITH_PROV:
            with_provenance = true;
            io.provenance = 1;
            break;
        case O_NO_PROV: no_provenance = true; break;
        case O_NO_SHM: no_shm = true; break;
        case O_CKPT_OUT:
            checkpoint_out = optarg;
            io.provenance = 1;
            break;
        case O_RESUME:
            resume_from = optarg;
            io.provenance = 1;
            break;
        case O_FORMAT:
            if (strcmp(optarg, "jsonl") == 0)
                fmt = FMT_JSONL;
            else if (strcmp(optarg, "count") == 0)
                fmt = FMT_COUNT;
            else if (strcmp(optarg, "raw") == 0)
                fmt = FMT_RAW;
            else {
                fprintf(stderr, "%s: --format: \"%s\" is not jsonl, count or raw\n", program, optarg);
                return 2;
            }
            break;
        case O_LIMIT: limit = parse_long("limit", optarg, 0, __LONG_MAX__); break;
        case O_OUT: io.max_outstanding = (int)parse_long("max-outstanding", optarg, 1, 4096); break;
        case O_PER_WORKER:
            io.per_worker_outstanding = (int)parse_long("per-worker-outstanding", optarg, 1, 16);
            break;
        case O_WINDOW: io.window_bytes = (size_t)parse_long("window-mb", optarg, 1, 1L << 20) << 20; break;
        case O_TIMEOUT: io.timeout_ms = (int)parse_long("timeout-ms", optarg, 1, 86400000); break;
        case O_DISP_TIMEOUT:
            io.dispatcher_timeout_ms = (int)parse_long("dispatcher-timeout-ms", optarg, 1, 86400000);
            break;
        case O_PROGRESS: progress = true; break;
        case O_LEDGER: io.max_ledger_runs = (size_t)parse_long("max-ledger-runs", optarg, 1, 1L << 21); break;
        case O_AUTH: co.auth_token_file = optarg; break;
        case O_CERT: co.tls_cert = optarg; break;
        case O_KEY: co.tls_key = optarg; break;
        case O_CA: co.tls_ca = optarg; break;
        case O_MERGE: merge = true; break;
        case O_HELP: usage(stdout); return 0;
        case O_VERSION: printf("%s %s\n", program, sl_version()); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (merge) {
        if (!checkpoint_out || optind >= argc || dispatcher || dataset || dataset_ref || resume_from) {
            fprintf(stderr, "%s: --merge-checkpoints takes --checkpoint-out OUT and the checkpoint files, and no "
                    "--dispatcher, --dataset, --dataset-id or --resume-from\n", program);
            return 2;
        }
        return merge_checkpoints(argv + optind, argc - optind, co.auth_token_file, checkpoint_out);
    }
    if (!dispatcher || (!dataset == !dataset_ref) || optind < argc) {
        if (dataset && dataset_ref)
            fprintf(stderr, "%s: --dataset and --dataset-id: give one of them\n", program);
        usage(stderr);
        return 2;
    }
    if (dataset_name && !dataset) {
        fprintf(stderr, "%s: --dataset-name names the --dataset it registers\n", program);
        return 2;
    }
    uint64_t ref_id = 0;
    if (dataset_ref) {
        const char *p = dataset_ref;
        while (*p >= '0' && *p <= '9')
            p++;
        if (!*dataset_ref) {
            fprintf(stderr, "%s: --dataset-id: give an id or a name\n", program);
            return 2;
        }
        if (!*p) /* all digits: an id */
            ref_id = (uint64_t)parse_long("dataset-id", dataset_ref, 1, __LONG_MAX__);
    }
    if ((num_consumers > 0) != have_index) {
        fprintf(stderr, "%s: --num-consumers and --consumer-index go together\n", program);
        return 2;
    }
    if (num_consumers > 0 && io.consumer_index >= num_consumers) {
        fprintf(stderr, "%s: --consumer-index: %d is not below --num-consumers %ld\n", program, io.consumer_index,
                num_consumers);
        return 2;
    }
    io.num_consumers = (int)num_consumers;
    if (io.repetition > 0 && !io.job_name) {
        fprintf(stderr, "%s: --repetition counts the passes over a named job: give --job-name too\n", program);
        return 2;
    }
    if (no_provenance && (with_provenance || checkpoint_out || resume_from)) {
        fprintf(stderr, "%s: --no-provenance cannot go with --with-provenance, --checkpoint-out or --resume-from\n",
                program);
        return 2;
    }
    if (no_provenance)
        io.provenance = -1;
    if (no_shm)
        io.shm = -1;
    size_t spec_len = 0;
    char *spec = dataset ? read_file("dataset", dataset, MAX_SPEC_BYTES, &spec_len) : NULL;
    if (dataset && !spec)
        return 2;
    if (io.timeout_ms < io.connect_timeout_ms)
        io.connect_timeout_ms = io.timeout_ms;

    int status = 1;
    sl_client_t *cl = NULL;
    sl_iterator_t *it = NULL;
    if (co.connect_timeout_ms > io.timeout_ms)
        co.connect_timeout_ms = io.timeout_ms;
    if (co.request_timeout_ms > io.timeout_ms)
        co.request_timeout_ms = io.timeout_ms;
    uint64_t ds;
    int rc = sl_client_open(dispatcher, &co, &cl);
    if (rc < 0) {
        fprintf(stderr, "%s: dispatcher %s: %s\n", program, dispatcher, sl_client_errmsg(cl));
        goto out;
    }
    sl_elemspec_t es;
    if (dataset)
        rc = sl_client_register_dataset_as(cl, spec, spec_len, dataset_name, &ds, &es);
    else
        rc = sl_client_lookup_dataset(cl, ref_id, ref_id ? NULL : dataset_ref, &ds, &es);
    if (rc < 0) {
        if (dataset)
            fprintf(stderr, "%s: dataset %s refused: %s\n", program, dataset, sl_client_errmsg(cl));
        else
            fprintf(stderr, "%s: --dataset-id %s: %s\n", program, dataset_ref, sl_client_errmsg(cl));
        goto out;
    }
    if (describe) {
        printf("{\"dataset_id\": %" PRIu64 ", \"element_spec\": ", ds);
        print_element_spec(stdout, &es);
        printf("}\n");
        status = fflush(stdout) == 0 ? 0 : 1;
        goto out;
    }
    if (resume_from) {
        size_t ckpt_len;
        char *ckpt = read_file("resume-from", resume_from, MAX_CKPT_BYTES, &ckpt_len);
        if (!ckpt)
            goto out;
        rc = sl_iterator_restore(cl, ds, &io, (const uint8_t *)ckpt, ckpt_len, &it);
        free(ckpt);
    } else {
        rc = sl_iterator_open(cl, ds, &io, &it);
    }
    if (rc < 0) {
        fprintf(stderr, "%s: cannot open an iterator: %s\n", program, sl_iterator_errmsg(it));
        goto out;
    }
    if (sl_iterator_notice(it)[0])
        fprintf(stderr, "%s: %s\n", program, sl_iterator_notice(it));
    /* Ctrl-C ends the read at once, with the summary line and exit 130
     * (SIGTERM: 143), also while it waits on a job no worker serves. */
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    double t0 = now_s(), last_progress = t0, first_batch = -1, last_batch = -1;
    uint64_t elements = 0, batches = 0, bytes = 0;
    for (;;) {
        if (limit >= 0 && batches >= (uint64_t)limit) {
            rc = 1;
            break;
        }
        sl_batch_t *b;
        rc = sl_iterator_next_wait(it, &b, INTERRUPT_POLL_MS);
        if (rc == -EAGAIN && !interrupted)
            continue;
        if (interrupted && rc == 0)
            sl_batch_release(b);
        if (interrupted)
            break;
        if (rc != 0)
            break;
        last_batch = now_s() - t0;
        if (batches++ == 0)
            first_batch = last_batch;
        elements += sl_batch_num_elements(b);
        bytes += sl_batch_size(b);
        if (fmt == FMT_JSONL) {
            print_batch_json(stdout, b, with_worker, num_consumers > 0);
        } else if (fmt == FMT_RAW) {
            for (int i = 0; i < sl_batch_num_tensors(b); i++) {
                const sl_tensor_t *t = sl_batch_tensor(b, i);
                fwrite(t->data, 1, t->size, stdout);
            }
        }
        sl_batch_release(b);
        double now = now_s();
        if (progress && now - last_progress >= 0.2) {
            fprintf(stderr, "\r%" PRIu64 " elements, %" PRIu64 " batches, %.1f MB, %.0f elements/s   ", elements,
                    batches, bytes / 1e6, elements / (now - t0));
            last_progress = now;
        }
    }
    if (progress) {
        /* The last line says what arrived in all, not what had at the last
         * tick (a line short of the total looks like loss). */
        double now = now_s();
        fprintf(stderr, "\r%" PRIu64 " elements, %" PRIu64 " batches, %.1f MB, %.0f elements/s%s\n", elements, batches,
                bytes / 1e6, now > t0 ? elements / (now - t0) : 0.0, rc == 1 ? ", the end" : "   ");
    }
    if (rc == 1 && with_provenance && fmt == FMT_JSONL) {
        size_t nd;
        const sl_split_done_t *d = sl_iterator_splits_done(it, &nd);
        if (nd > 0) {
            fputc('{', stdout);
            print_splits_done(stdout, d, nd);
            fputs("}\n", stdout);
        }
    }
    if (interrupted) {
        char waiting[512];
        sl_iterator_waiting(it, waiting, sizeof waiting);
        fprintf(stderr, "%s: interrupted (%s) after %" PRIu64 " batches%s%s\n", program,
                interrupted == SIGINT ? "SIGINT" : "SIGTERM", batches, waiting[0] ? ", waiting on: " : "", waiting);
        status = 128 + interrupted;
    } else if (rc < 0) {
        fprintf(stderr, "%s: %s\n", program, sl_iterator_errmsg(it));
    } else if (checkpoint_out && write_checkpoint(it, checkpoint_out) < 0) {
        rc = -1;
    } else {
        status = 0;
    }
    fflush(stdout);
    /* When the first and the last batch came, from the open: the wait for
     * a job's start and for its end after its last batch are in seconds. */
    fprintf(stderr,
            "{\"elements\": %" PRIu64 ", \"batches\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"seconds\": %.4f, "
            "\"first_batch_seconds\": %.4f, \"last_batch_seconds\": %.4f, \"records_missing\": %" PRIu64 "}\n",
            elements, batches, bytes, now_s() - t0, first_batch, last_batch, sl_iterator_records_missing(it));
out:
    sl_iterator_close(it);
    sl_client_close(cl);
    free(spec);
    return status;
}
