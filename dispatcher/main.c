/*
 * main.c: sluice-dispatcher's command line, start-up and shutdown.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <event2/event.h>
#include <jansson.h>

#include "admin.h"
#include "admin_api.h"
#include "cli.h"
#include "log.h"
#include "net.h"
#include "netenv.h"
#include "server.h"
#include "state.h"
#include "confine.h"
#include "persist.h"
#include "store.h"
#include "workdir.h"


static const char *program = "sluice-dispatcher";

static void usage(FILE *f)
{
    fprintf(f,
            "usage: %s --port PORT --admin-port PORT --work-dir DIR [options]\n"
            "       %s --work-dir DIR --check-store [--state-store-mb N] [--max-exclude-runs N]\n"
            "  --port PORT              protocol port (0 picks a free one)\n"
            "  --admin-port PORT        JSON admin endpoint port (0 picks a free one)\n"
            "  --work-dir DIR           state directory (created if missing, locked)\n"
            "  --bind HOST              protocol address to listen on (default 0.0.0.0)\n"
            "  --admin-bind HOST        admin address to listen on (default 127.0.0.1)\n"
            "  --worker-addresses LIST  H:P,... workers of the static sharding policies\n"
            "                           (their order gives each worker its shard index)\n"
            "  --worker-timeout-ms N    a worker without heartbeat this long is lost (10000)\n"
            "  --worker-heartbeat-ms N  how often workers heartbeat (250; at most half of --worker-timeout-ms)\n"
            "  --stall-timeout-ms N     a worker whose pipeline makes no batch this long while\n"
            "                           not waiting for input is lost as stuck (60000; 0: never)\n"
            "  --client-timeout-ms N    a client without heartbeat this long is away (30000)\n"
            "  --client-heartbeat-ms N  how often clients heartbeat (250; when given, at most half of\n"
            "                           --client-timeout-ms)\n"
            "  --client-rejoin-ms N     an away client is released after this long; until then\n"
            "                           it may come back and go on exactly once (300000; 0: at once)\n"
            "  --client-stall-ms N      DYNAMIC: a client that heartbeats but received nothing new\n"
            "                           this long while its peers wait for it holds them back no\n"
            "                           more, until it reads again (60000; 0: never)\n"
            "  --job-gc-timeout-ms N    a job without clients this long is cancelled; an ended\n"
            "                           named job's repetition is then collected (60000)\n"
            "  --dataset-gc-timeout-ms N  a dataset no running job read this long is deleted\n"
            "                           (86400000; 0: never; a full registry drops the oldest such)\n"
            "  --split-size N           elements (records) per DYNAMIC split at least (1024)\n"
            "  --max-split-size N       elements (records) per DYNAMIC split at most (1048576);\n"
            "                           between the two, splits follow each worker's rate\n"
            "  --max-outstanding-splits N  DYNAMIC splits a task may hold that its clients have\n"
            "                           not all confirmed; past it the task waits (16384), but for\n"
            "                           coordinated reads' stand-ins (64 more a consumer at most) and\n"
            "                           a task that cannot finish one without another (64 more at most)\n"
            "  --handout-commit-delay-ms N  a DYNAMIC hand-out whose worker has splits queued waits\n"
            "                           this long at most (and half of what its queue lasts) for\n"
            "                           its commit, shared with what comes meanwhile (50; 0: at once)\n"
            "  --max-exclude-total-runs N  runs of restored checkpoints' positions all running\n"
            "                           jobs hold together (8388608; memory, and the state store)\n"
            "  --max-exclude-runs N     runs of positions a restored checkpoint (a bitmap of 4096\n"
            "                           positions, kept where its runs crowd, counts 22) or a\n"
            "                           client's report may hold (2097152, the most; 24 bytes a run)\n"
            "  --data-root DIR          a directory file sources may name (repeatable);\n"
            "                           their files are listed and counted at registration\n"
            "  --max-workers N          live workers at most (256); more are refused\n"
            "  --state-store-mb N       the state store's largest size (1024); past 3/4 of it new\n"
            "                           datasets and restored checkpoints are refused\n"
            "  --max-datasets N         registered datasets at most (4096)\n"
            "  --max-jobs N             running jobs at most (4096); ended ones make room\n"
            "  --count-timeout-ms N     listing and counting a new file source's records, off\n"
            "                           the event loop (60000; 0: no limit)\n"
            "  --check-store            with --work-dir alone: load its state store as a start would,\n"
            "                           print what it holds and what a start would hold back (JSON),\n"
            "                           and exit, serving nothing: 0 when every record loads, else 1;\n"
            "                           read-only, also beside a running dispatcher\n"
            SL_CLI_DAEMON_TAIL_USAGE,
            program, program);
}

struct options {
    sl_daemon_opts_t d; /* what both daemons take */
    const char *work_dir;
    const char *worker_addresses;
    sl_dstate_config_t state;
    int64_t store_mb; /* the state store's map size; 0: the store's default (1 GiB) */
    bool client_beat_given; /* --client-heartbeat-ms: checked against the client timeout */
    bool check_store;       /* --check-store: load the store, say what it holds, and exit */
};

/* Whether a heartbeat of beat_ms fits twice in a lease of timeout_ms (who:
 * "worker" or "client"): else a peer would be lost between two heartbeats. */
static bool beat_fits(const char *prog, const char *who, uint32_t beat_ms, int64_t timeout_ms)
{
    if ((int64_t)beat_ms * 2 <= timeout_ms)
        return true;
    fprintf(stderr,
            "%s: --%s-heartbeat-ms %u is more than half of --%s-timeout-ms %" PRId64
            ": a %s would be lost between two heartbeats\n",
            prog, who, beat_ms, who, timeout_ms, who);
    return false;
}

static int parse_args(int argc, char **argv, void *opts)
{
    struct options *o = opts;
    enum { O_WORK_DIR = 1, O_WORKERS, O_WORKER_TO, O_STALL_TO, O_CLIENT_TO, O_CLIENT_REJOIN, O_CLIENT_STALL, O_GC_TO, O_DS_GC_TO, O_SPLIT, O_MAX_SPLIT, O_MAX_OUT, O_MAX_EXCL, O_MAX_EXCL_TOTAL,
           O_COUNT_TO, O_WORKER_HB, O_CLIENT_HB, O_MAX_WORKERS, O_MAX_DATASETS, O_MAX_JOBS, O_STORE_MB, O_HELP,
           O_HANDOUT_DELAY, O_CHECK_STORE };
    static const struct option longopts[] = {
        SL_CLI_DAEMON_LONGOPTS,
        {"work-dir", required_argument, NULL, O_WORK_DIR},
        {"worker-addresses", required_argument, NULL, O_WORKERS},
        {"worker-timeout-ms", required_argument, NULL, O_WORKER_TO},
        {"worker-heartbeat-ms", required_argument, NULL, O_WORKER_HB},
        {"stall-timeout-ms", required_argument, NULL, O_STALL_TO},
        {"client-timeout-ms", required_argument, NULL, O_CLIENT_TO},
        {"client-heartbeat-ms", required_argument, NULL, O_CLIENT_HB},
        {"client-rejoin-ms", required_argument, NULL, O_CLIENT_REJOIN},
        {"client-stall-ms", required_argument, NULL, O_CLIENT_STALL},
        {"job-gc-timeout-ms", required_argument, NULL, O_GC_TO},
        {"dataset-gc-timeout-ms", required_argument, NULL, O_DS_GC_TO},
        {"split-size", required_argument, NULL, O_SPLIT},
        {"max-split-size", required_argument, NULL, O_MAX_SPLIT},
        {"max-outstanding-splits", required_argument, NULL, O_MAX_OUT},
        {"handout-commit-delay-ms", required_argument, NULL, O_HANDOUT_DELAY},
        {"max-exclude-runs", required_argument, NULL, O_MAX_EXCL},
        {"max-exclude-total-runs", required_argument, NULL, O_MAX_EXCL_TOTAL},
        {"count-timeout-ms", required_argument, NULL, O_COUNT_TO},
        {"max-workers", required_argument, NULL, O_MAX_WORKERS},
        {"max-datasets", required_argument, NULL, O_MAX_DATASETS},
        {"max-jobs", required_argument, NULL, O_MAX_JOBS},
        {"state-store-mb", required_argument, NULL, O_STORE_MB},
        {"check-store", no_argument, NULL, O_CHECK_STORE},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    int64_t v;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        int taken = sl_daemon_opt(program, c, optarg, &o->d);
        if (taken < 0)
            return -1;
        if (taken)
            continue;
        switch (c) {
        case O_WORK_DIR: o->work_dir = optarg; break;
        case O_WORKERS: o->worker_addresses = optarg; break;
        case O_WORKER_TO:
            if (sl_cli_int(program, "worker-timeout-ms", optarg, 100, 86400000, &o->state.worker_timeout_ms) < 0)
                return -1;
            break;
        case O_WORKER_HB:
            if (sl_cli_int(program, "worker-heartbeat-ms", optarg, 10, 3600000, &v) < 0)
                return -1;
            o->state.worker_heartbeat_ms = (uint32_t)v;
            break;
        case O_STALL_TO:
            if (sl_cli_int(program, "stall-timeout-ms", optarg, 0, 86400000, &o->state.stall_timeout_ms) < 0)
                return -1;
            break;
        case O_CLIENT_TO:
            if (sl_cli_int(program, "client-timeout-ms", optarg, 100, 86400000, &o->state.client_timeout_ms) < 0)
                return -1;
            break;
        case O_CLIENT_HB:
            if (sl_cli_int(program, "client-heartbeat-ms", optarg, 10, 3600000, &v) < 0)
                return -1;
            o->state.client_heartbeat_ms = (uint32_t)v;
            o->client_beat_given = true;
            break;
        case O_CLIENT_REJOIN:
            if (sl_cli_int(program, "client-rejoin-ms", optarg, 0, 86400000, &o->state.client_rejoin_ms) < 0)
                return -1;
            break;
        case O_CLIENT_STALL:
            if (sl_cli_int(program, "client-stall-ms", optarg, 0, 86400000, &o->state.client_stall_ms) < 0)
                return -1;
            break;
        case O_GC_TO:
            if (sl_cli_int(program, "job-gc-timeout-ms", optarg, 0, 86400000, &o->state.job_gc_timeout_ms) < 0)
                return -1;
            break;
        case O_DS_GC_TO:
            if (sl_cli_int(program, "dataset-gc-timeout-ms", optarg, 0, INT64_C(1) << 40,
                           &o->state.dataset_gc_timeout_ms) < 0)
                return -1;
            break;
        case O_SPLIT:
            if (sl_cli_int(program, "split-size", optarg, 1, INT64_C(1) << 40, &v) < 0)
                return -1;
            o->state.split_size = (uint64_t)v;
            break;
        case O_MAX_SPLIT:
            if (sl_cli_int(program, "max-split-size", optarg, 1, INT64_C(1) << 40, &v) < 0)
                return -1;
            o->state.max_split_size = (uint64_t)v;
            break;
        case O_MAX_OUT:
            if (sl_cli_int(program, "max-outstanding-splits", optarg, 1, 1 << 24, &v) < 0)
                return -1;
            o->state.max_outstanding = (unsigned)v;
            break;
        case O_HANDOUT_DELAY:
            if (sl_cli_int(program, "handout-commit-delay-ms", optarg, 0, 3600000, &v) < 0)
                return -1;
            o->state.handout_commit_delay_ms = (uint32_t)v;
            break;
        case O_MAX_EXCL_TOTAL:
            if (sl_cli_int(program, "max-exclude-total-runs", optarg, 1, INT64_C(1) << 32, &v) < 0)
                return -1;
            o->state.max_exclude_total = (uint64_t)v;
            break;
        case O_MAX_EXCL:
            if (sl_cli_int(program, "max-exclude-runs", optarg, 1, SL_POSSET_MAX_RUNS, &v) < 0)
                return -1;
            o->state.max_exclude_runs = (unsigned)v;
            break;
        case O_COUNT_TO:
            if (sl_cli_int(program, "count-timeout-ms", optarg, 0, 86400000, &o->state.count_timeout_ms) < 0)
                return -1;
            break;
        case O_MAX_WORKERS: /* a client heartbeat answer lists at most 256 tasks */
            if (sl_cli_int(program, "max-workers", optarg, 1, 256, &v) < 0)
                return -1;
            o->state.max_workers = (unsigned)v;
            break;
        case O_MAX_DATASETS:
            if (sl_cli_int(program, "max-datasets", optarg, 1, 1 << 20, &v) < 0)
                return -1;
            o->state.max_datasets = (unsigned)v;
            break;
        case O_MAX_JOBS:
            if (sl_cli_int(program, "max-jobs", optarg, 1, 1 << 20, &v) < 0)
                return -1;
            o->state.max_jobs = (unsigned)v;
            break;
        case O_STORE_MB:
            if (sl_cli_int(program, "state-store-mb", optarg, 1, 1 << 20, &o->store_mb) < 0)
                return -1;
            break;
        case O_CHECK_STORE: o->check_store = true; break;
        case O_HELP: usage(stdout); exit(SL_EXIT_OK);
        default: usage(stderr); return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument \"%s\"\n", program, argv[optind]);
        return -1;
    }
    if (o->check_store && !o->work_dir) {
        fprintf(stderr, "%s: --check-store needs --work-dir\n", program);
        return -1;
    }
    if (!o->check_store && (o->d.port < 0 || o->d.admin_port < 0 || !o->work_dir)) {
        fprintf(stderr, "%s: --port, --admin-port and --work-dir are required\n", program);
        usage(stderr);
        return -1;
    }
    /* The client's default interval is not checked: a --client-timeout-ms
     * below 500 with it was taken before the flag existed, and still is. */
    if (!beat_fits(program, "worker", o->state.worker_heartbeat_ms, o->state.worker_timeout_ms) ||
        (o->client_beat_given &&
         !beat_fits(program, "client", o->state.client_heartbeat_ms, o->state.client_timeout_ms)))
        return -1;
    if (o->worker_addresses) {
        /* Checked now so that a typo fails at start, not at the first job. */
        char list[4096], host[256], err[300];
        uint16_t p;
        if (strlen(o->worker_addresses) >= sizeof list) {
            fprintf(stderr, "%s: --worker-addresses: longer than %zu bytes\n", program, sizeof list - 1);
            return -1;
        }
        snprintf(list, sizeof list, "%s", o->worker_addresses);
        /* A worker's index is its one place in the list: an address given
         * twice would leave an index no worker can take. */
        const char *seen[512];
        unsigned n = 0;
        for (char *save = NULL, *a = strtok_r(list, ",", &save); a; a = strtok_r(NULL, ",", &save)) {
            if (sl_addr_split(a, host, sizeof host, &p, err, sizeof err) < 0) {
                fprintf(stderr, "%s: --worker-addresses: %s\n", program, err);
                return -1;
            }
            if (strlen(a) >= 128 || n >= o->state.max_workers || n >= sizeof seen / sizeof seen[0]) {
                fprintf(stderr, "%s: --worker-addresses: %s: addresses are at most 127 bytes, and at most %u\n",
                        program, a, o->state.max_workers);
                return -1;
            }
            for (unsigned i = 0; i < n; i++) {
                if (strcmp(seen[i], a) == 0) {
                    fprintf(stderr, "%s: --worker-addresses: %s is listed twice\n", program, a);
                    return -1;
                }
            }
            seen[n++] = a;
        }
        if (strchr(o->worker_addresses, ' ') || strstr(o->worker_addresses, ",,") ||
            o->worker_addresses[0] == ',' || o->worker_addresses[strlen(o->worker_addresses) - 1] == ',') {
            fprintf(stderr, "%s: --worker-addresses: \"%s\": give H:P,H:P without spaces or empty entries\n",
                    program, o->worker_addresses);
            return -1;
        }
    }
    return 0;
}

/* The state store's options: the dispatcher's tables, --state-store-mb. */
static sl_store_opts_t store_opts(const struct options *o, bool read_only)
{
    int num_tables;
    const char *const *tables = sl_dpersist_tables(&num_tables);
    return (sl_store_opts_t){.tables = tables, .num_tables = num_tables, .map_bytes = (size_t)o->store_mb << 20,
                             .read_only = read_only};
}

/* Opens and locks the work dir, then its state store, checked, as a start
 * does. @return 0, or < 0 with err set */
static int open_state_store(const struct options *o, sl_workdir_t **wd, sl_store_t **store, char *err,
                            size_t errlen)
{
    sl_store_opts_t so = store_opts(o, false);
    if (sl_workdir_open(o->work_dir, wd, err, errlen) < 0)
        return -1;
    return sl_store_open(sl_workdir_path(*wd), &so, store, err, errlen) < 0 ? -1 : 0;
}

/* --check-store: loads the work dir's state store as a start would and
 * prints on stdout, as JSON, what it holds and what a start would hold
 * back, without serving or writing the store (an operator's check of a
 * backup): opened read-only, without the work dir's lock, so it reads a
 * store on read-only media and beside a dispatcher that serves from it
 * (LMDB's readers see its last commit). @return SL_EXIT_OK when every
 * record loads, SL_EXIT_FAILURE when a start would refuse the store or
 * hold something back */
static int check_store(struct options *o)
{
    char path[4096], err[1024];
    struct stat sb;
    snprintf(path, sizeof path, "%s/state.mdb", o->work_dir);
    if (stat(path, &sb) < 0) {
        fprintf(stderr, "%s: --check-store: %s: %s (no state store to check)\n", program, path, strerror(errno));
        return SL_EXIT_FAILURE;
    }
    int status = SL_EXIT_FAILURE;
    sl_store_t *store = NULL;
    sl_dstate_t *st = NULL;
    json_t *out = NULL;
    sl_store_opts_t so = store_opts(o, true);
    if (sl_store_open(o->work_dir, &so, &store, err, sizeof err) < 0) {
        out = json_pack("{s:b,s:s}", "loads", 0, "error", err);
    } else if (!(st = sl_dstate_new(&o->state))) {
        snprintf(err, sizeof err, "out of memory");
        out = json_pack("{s:b,s:s}", "loads", 0, "error", err);
    } else if (sl_dpersist_load(st, store, sl_now_ms(), err, sizeof err) < 0) {
        out = json_pack("{s:b,s:s}", "loads", 0, "error", err);
    } else {
        sl_dstate_stats_t stats;
        sl_dstate_stats(st, &stats);
        json_t *held = sl_dstate_quarantine_json(st), *workers = sl_dstate_workers_json(st, 0);
        out = json_pack("{s:b,s:i,s:i,s:i,s:O}", "loads", 1, "datasets", stats.datasets, "jobs", stats.jobs_total,
                        "workers", (int)json_array_size(workers), "held_back", json_object_get(held, "held_back"));
        json_decref(workers);
        json_decref(held);
        if (stats.held_back == 0)
            status = SL_EXIT_OK;
        else
            snprintf(err, sizeof err, "%u damaged records: a start would hold back what they are of",
                     stats.held_back);
    }
    char *text = out ? json_dumps(out, JSON_COMPACT) : NULL;
    if (text)
        printf("%s\n", text);
    if (status != SL_EXIT_OK)
        fprintf(stderr, "%s: --check-store: %s\n", program, err);
    free(text);
    json_decref(out);
    sl_dstate_free(st);
    sl_store_close(store);
    return status;
}

int main(int argc, char **argv)
{
    struct options o = {0};
    sl_daemon_opts_init(&o.d);
    sl_dstate_config_init(&o.state);
    int cargc;
    char **cargv;
    if (sl_cli_daemon_begin(program, argc, argv, parse_args, &o, &o.d, &cargc, &cargv) < 0)
        return SL_EXIT_USAGE;
    if (o.check_store) {
        int rc = check_store(&o);
        sl_cli_free_argv(cargc, cargv);
        return rc;
    }

    int status = SL_EXIT_FAILURE;
    char err[1024];
    sl_workdir_t *wd = NULL;
    sl_store_t *store = NULL;
    sl_confine_t *roots = NULL;
    sl_dstate_t *st = NULL;
    struct event_base *base = NULL;
    sl_dserver_t *srv = NULL;
    sl_admin_t *admin = NULL;
    struct event *sigs[2] = {NULL, NULL};
    uint16_t port = 0, admin_port = 0;
    sl_auth_t auth = {0};
    sl_conn_env_t env;

    /* Credentials first: a token file that cannot be read stops the start. */
    if (sl_netenv_init(&o.d, &auth, &env, err, sizeof err) < 0) {
        fprintf(stderr, "%s: %s\n", program, err);
        goto out;
    }

    /* The state store is opened and checked at start, so that a work dir
     * the dispatcher must not use (unwritable, full, corrupt, of a newer
     * format) is refused before it serves; docs/fault-tolerance.md. */
    if (open_state_store(&o, &wd, &store, err, sizeof err) < 0) {
        fprintf(stderr, "%s: %s\n", program, err);
        goto out;
    }
    if (o.d.num_data_roots > 0 &&
        sl_confine_create(o.d.data_roots, (size_t)o.d.num_data_roots, &roots, err, sizeof err) < 0) {
        fprintf(stderr, "%s: --data-root: %s\n", program, err);
        goto out;
    }
    o.state.roots = roots;
    o.state.worker_addresses = o.worker_addresses;
    st = sl_dstate_new(&o.state);
    base = event_base_new();
    if (!st || !base) {
        fprintf(stderr, "%s: out of memory\n", program);
        goto out;
    }
    /* What the last run committed: its workers, datasets, jobs, leases
     * and split cursors (docs/fault-tolerance.md). */
    if (sl_dpersist_load(st, store, sl_now_ms(), err, sizeof err) < 0) {
        fprintf(stderr, "%s: %s\n", program, err);
        goto out;
    }
    if (sl_dserver_start(base, st, store, &env, o.d.bind, (uint16_t)o.d.port, &port, &srv, err, sizeof err) < 0 ||
        sl_cli_admin_start(base, &o.d, &admin_port, &admin, err, sizeof err) < 0) {
        fprintf(stderr, "%s: %s\n", program, err);
        goto out;
    }
    sl_dadmin_register(admin, srv);
    if (sl_cli_stop_on_signals(base, sigs) < 0) {
        fprintf(stderr, "%s: out of memory\n", program);
        goto out;
    }

    sl_cli_announce(program, port, admin_port);
    sl_log_info("serving on %s:%u, admin on %s:%u, work dir %s", o.d.bind, port, o.d.admin_bind, admin_port,
                sl_workdir_path(wd));
    event_base_dispatch(base);
    status = sl_dserver_failed(srv) ? SL_EXIT_FAILURE : SL_EXIT_OK;
out:
    for (int i = 0; i < 2; i++)
        if (sigs[i])
            event_free(sigs[i]);
    sl_admin_free(admin);
    sl_dserver_free(srv);
    sl_dstate_free(st);
    sl_confine_destroy(roots);
    if (base)
        event_base_free(base);
    sl_store_close(store);
    sl_workdir_close(wd);
    sl_auth_free(&auth);
    sl_cli_free_argv(cargc, cargv);
    return status;
}
