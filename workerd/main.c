/*
 * main.c: sluice-workerd's command line, start-up and shutdown.
 */
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <event2/thread.h>
#include <jansson.h>

#include "admin.h"
#include "admin_api.h"
#include "cachedb.h"
#include "big_alloc.h"
#include "cli.h"
#include "confine.h"
#include "log.h"
#include "membudget.h"
#include "metrics.h"
#include "plugin.h"
#include "net.h"
#include "netenv.h"
#include "reader.h"
#include "worker.h"

static const char *program = "sluice-workerd";


static void usage(FILE *f)
{
    fprintf(f,
            "usage: %s --dispatcher HOST:PORT --port PORT --admin-port PORT [options]\n"
            "  --dispatcher H:P         the dispatcher to register with\n"
            "  --port PORT              port clients fetch batches from (0 picks a free one)\n"
            "  --admin-port PORT        JSON admin endpoint port (0 picks a free one)\n"
            "  --worker-address H:P     address clients use to reach this worker\n"
            "                           (default: the local address that reaches the dispatcher)\n"
            "  --bind HOST              protocol address to listen on (default 0.0.0.0)\n"
            "  --admin-bind HOST        admin address to listen on (default 127.0.0.1)\n"
            "  --data-root DIR          a directory file sources may read below (repeatable;\n"
            "                           without one every file source is refused)\n"
            "  --threads N              threads that run a task's ops with num_parallel_calls:\n"
            "                           its pipeline thread and N-1 more (default 2;\n"
            "                           num_parallel_calls \"autotune\" chooses up to N,\n"
            "                           and no more than the CPUs the worker may use)\n"
            "  --plugin-dir DIR         a directory map and filter load plugins from, by file\n"
            "                           name (repeatable; without one every plugin op is refused)\n"
            "  --buffer-mb N            finished batches buffered per task, in MiB (default 64)\n"
            "  --split-target-ms N      DYNAMIC: ask for splits that take the pipeline this long at\n"
            "                           its measured rate (default 50; 0: the dispatcher's --split-size)\n"
            "  --max-batch-mb N         largest batch a pipeline may build, in MiB (default 256)\n"
            "  --shm-mb N               a client on this host gets its batches through a region of\n"
            "                           shared memory of N MiB per connection (default 256; 0: over\n"
            "                           TCP only; its pages count against the memory budget)\n"
            "  --io-engine uring|pread  how files are read (default: io_uring, or pread where\n"
            "                           io_uring cannot be set up, logged once)\n"
            "  --cache-mb N             memory all in-memory cache ops together may hold, in MiB\n"
            "                           (default 256; a cache over it stops caching, logged)\n"
            "  --cache-dir DIR          the LMDB disk cache of cache ops with storage \"disk\"\n"
            "                           (one worker per directory; default: none, refused)\n"
            "  --cache-disk-mb N        the most the disk cache holds, in MiB (default 1024)\n"
            "  --max-memory-mb N        memory all tasks together may hold in buffers and images,\n"
            "                           in MiB (default: half of physical memory or of the\n"
            "                           cgroup's memory.max; a task over it fails, others go on)\n"
            "  --hold-timeout-ms N      a batch served and not yet acknowledged is held this long\n"
            "                           after its client's last request, to be sent again if its\n"
            "                           connection broke (300000)\n"
            "  --await-task-ms N        a request for a task this worker has not heard of waits at\n"
            "                           most this long for the dispatcher to bring it, then is\n"
            "                           answered \"not found\" and asked again (default 2000)\n"
            SL_CLI_DAEMON_TAIL_USAGE,
            program);
}

struct options {
    sl_daemon_opts_t d; /* what both daemons take */
    sl_worker_config_t worker;
    const char *plugin_dirs[SL_PLUGINS_MAX_DIRS];
    int num_plugin_dirs;
    int64_t threads;
    sl_io_engine_t io_engine;
    int64_t cache_mb, cache_disk_mb;
    const char *cache_dir;
    int64_t max_memory_mb; /* 0: sl_membudget_default_limit() */
};

static int parse_args(int argc, char **argv, void *opts)
{
    struct options *o = opts;
    enum { O_DISP = 1, O_ADDR, O_THREADS, O_BUFFER, O_SPLIT_TARGET, O_MAXBATCH, O_IO, O_HELP, O_PLUGIN_DIR, O_CACHE_MB,
           O_CACHE_DIR, O_CACHE_DISK_MB, O_MAX_MEMORY_MB, O_HOLD_TIMEOUT, O_SHM_MB,
           O_AWAIT_TASK };
    static const struct option longopts[] = {
        SL_CLI_DAEMON_LONGOPTS,
        {"dispatcher", required_argument, NULL, O_DISP},
        {"worker-address", required_argument, NULL, O_ADDR},
        {"threads", required_argument, NULL, O_THREADS},
        {"buffer-mb", required_argument, NULL, O_BUFFER},
        {"split-target-ms", required_argument, NULL, O_SPLIT_TARGET},
        {"max-batch-mb", required_argument, NULL, O_MAXBATCH},
        {"io-engine", required_argument, NULL, O_IO},
        {"help", no_argument, NULL, O_HELP},
        {"plugin-dir", required_argument, NULL, O_PLUGIN_DIR},
        {"cache-mb", required_argument, NULL, O_CACHE_MB},
        {"cache-dir", required_argument, NULL, O_CACHE_DIR},
        {"cache-disk-mb", required_argument, NULL, O_CACHE_DISK_MB},
        {"max-memory-mb", required_argument, NULL, O_MAX_MEMORY_MB},
        {"hold-timeout-ms", required_argument, NULL, O_HOLD_TIMEOUT},
        {"shm-mb", required_argument, NULL, O_SHM_MB},
        {"await-task-ms", required_argument, NULL, O_AWAIT_TASK},
        {NULL, 0, NULL, 0},
    };
    char err[300], host[256];
    uint16_t p;
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
        case O_DISP:
        case O_ADDR:
            if (sl_addr_split(optarg, host, sizeof host, &p, err, sizeof err) < 0) {
                fprintf(stderr, "%s: --%s: %s\n", program, c == O_DISP ? "dispatcher" : "worker-address", err);
                return -1;
            }
            if (strlen(optarg) >= 128) {
                fprintf(stderr, "%s: --%s: longer than 127 bytes\n", program,
                        c == O_DISP ? "dispatcher" : "worker-address");
                return -1;
            }
            if (c == O_DISP)
                o->worker.dispatcher = optarg;
            else
                o->worker.address = optarg;
            break;
        case O_PLUGIN_DIR:
            if (o->num_plugin_dirs == SL_PLUGINS_MAX_DIRS) {
                fprintf(stderr, "%s: --plugin-dir: at most %d directories\n", program, SL_PLUGINS_MAX_DIRS);
                return -1;
            }
            o->plugin_dirs[o->num_plugin_dirs++] = optarg;
            break;
        case O_THREADS:
            if (sl_cli_int(program, "threads", optarg, 1, 256, &o->threads) < 0)
                return -1;
            break;
        case O_SPLIT_TARGET:
            if (sl_cli_int(program, "split-target-ms", optarg, 0, 3600000, &v) < 0)
                return -1;
            o->worker.task.split_target_ms = (unsigned)v;
            break;
        case O_BUFFER:
            if (sl_cli_int(program, "buffer-mb", optarg, 1, 1 << 20, &v) < 0)
                return -1;
            o->worker.task.buffer_bytes = (size_t)v << 20;
            break;
        case O_MAXBATCH:
            if (sl_cli_int(program, "max-batch-mb", optarg, 1, 4095, &v) < 0)
                return -1;
            o->worker.task.max_batch_bytes = (size_t)v << 20;
            break;
        case O_IO:
            if ((strcmp(optarg, "uring") != 0 && strcmp(optarg, "pread") != 0) ||
                sl_reader_engine_parse(optarg, &o->io_engine) < 0) {
                fprintf(stderr, "%s: --io-engine: \"%s\" is not uring or pread\n", program, optarg);
                return -1;
            }
            break;
        case O_HELP: usage(stdout); exit(SL_EXIT_OK);
        case O_CACHE_MB:
            if (sl_cli_int(program, "cache-mb", optarg, 0, 1 << 24, &o->cache_mb) < 0)
                return -1;
            break;
        case O_CACHE_DIR: o->cache_dir = optarg; break;
        case O_CACHE_DISK_MB:
            if (sl_cli_int(program, "cache-disk-mb", optarg, 1, 1 << 24, &o->cache_disk_mb) < 0)
                return -1;
            break;
        case O_HOLD_TIMEOUT:
            if (sl_cli_int(program, "hold-timeout-ms", optarg, 1000, 86400000, &o->worker.hold_timeout_ms) < 0)
                return -1;
            break;
        case O_AWAIT_TASK:
            if (sl_cli_int(program, "await-task-ms", optarg, 1, 3600000, &o->worker.await_task_ms) < 0)
                return -1;
            break;
        case O_SHM_MB:
            if (sl_cli_int(program, "shm-mb", optarg, 0, 65536, &v) < 0)
                return -1;
            o->worker.shm_region_bytes = (size_t)v << 20;
            break;
        case O_MAX_MEMORY_MB:
            if (sl_cli_int(program, "max-memory-mb", optarg, 16, (int64_t)1 << 30, &o->max_memory_mb) < 0)
                return -1;
            break;
        default: usage(stderr); return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument \"%s\"\n", program, argv[optind]);
        return -1;
    }
    if (!o->worker.dispatcher || o->d.port < 0 || o->d.admin_port < 0) {
        fprintf(stderr, "%s: --dispatcher, --port and --admin-port are required\n", program);
        usage(stderr);
        return -1;
    }
    o->worker.bind = o->d.bind;
    for (int i = 0; i < o->d.num_data_roots; i++) {
        char real[PATH_MAX];
        if (!realpath(o->d.data_roots[i], real)) {
            fprintf(stderr, "%s: --data-root %s: %s\n", program, o->d.data_roots[i], strerror(errno));
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct options o = {.threads = 2, .io_engine = SL_IO_AUTO, .cache_mb = 256, .cache_disk_mb = 1024};
    sl_daemon_opts_init(&o.d);
    sl_worker_config_init(&o.worker);
    int cargc;
    char **cargv;
    if (sl_cli_daemon_begin(program, argc, argv, parse_args, &o, &o.d, &cargc, &cargv) < 0)
        return SL_EXIT_USAGE;
    /* Pipeline threads wake the loop through events. */
    evthread_use_pthreads();
    /* Batch blocks reuse freed memory rather than fault in fresh pages. */
    sl__big_alloc_setup(o.worker.task.max_batch_bytes);

    int status = SL_EXIT_FAILURE;
    char err[1024];
    sl_confine_t *roots = NULL;
    if (o.d.num_data_roots > 0 &&
        sl_confine_create(o.d.data_roots, (size_t)o.d.num_data_roots, &roots, err, sizeof err) < 0) {
        fprintf(stderr, "%s: %s\n", program, err);
        sl_cli_free_argv(cargc, cargv);
        return SL_EXIT_USAGE;
    }
    o.worker.task.roots = roots;
    sl_plugins_t *plugins = NULL;
    if (o.num_plugin_dirs > 0 &&
        sl_plugins_create(o.plugin_dirs, o.num_plugin_dirs, &plugins, err, sizeof err) < 0) {
        fprintf(stderr, "%s: %s\n", program, err);
        sl_confine_destroy(roots);
        sl_cli_free_argv(cargc, cargv);
        return SL_EXIT_USAGE;
    }
    o.worker.task.plugins = plugins;
    o.worker.task.threads = (unsigned)o.threads;
    o.worker.task.io_engine = o.io_engine;
    sl_cache_env_t cache = {.mem_limit = (size_t)o.cache_mb << 20};
    if (o.cache_dir &&
        sl_cachedb_open(o.cache_dir, (size_t)o.cache_disk_mb << 20, &cache.db, err, sizeof err) < 0) {
        fprintf(stderr, "%s: --cache-dir: %s\n", program, err);
        sl_plugins_destroy(plugins);
        sl_confine_destroy(roots);
        sl_cli_free_argv(cargc, cargv);
        return SL_EXIT_USAGE;
    }
    o.worker.task.cache = &cache;
    /* What every task's buffers and images are charged to (membudget.h). */
    sl_membudget_t mem;
    sl_membudget_init(&mem, o.max_memory_mb > 0 ? (size_t)o.max_memory_mb << 20 : sl_membudget_default_limit(),
                      "sluice-workerd --max-memory-mb");
    sl_metric_set(sl_metric_register(SL_METRIC_GAUGE, "sluice_worker_memory_budget_bytes", NULL,
                                     "The worker's memory budget (--max-memory-mb).", NULL, 0),
                  (double)mem.limit);
    mem.m_charged = sl_metric_register(SL_METRIC_GAUGE, "sluice_worker_memory_charged_bytes", NULL,
                                       "Bytes the tasks' buffers and images, and batch blocks kept for reuse, hold "
                                       "against the memory budget.",
                                       NULL, 0);
    mem.m_refusals = sl_metric_register(SL_METRIC_COUNTER, "sluice_worker_memory_refusals_total", NULL,
                                        "Charges the memory budget refused (a task failed or a cache gave up).",
                                        NULL, 0);
    mem.m_waits = sl_metric_register(SL_METRIC_COUNTER, "sluice_worker_memory_waits_total", NULL,
                                     "Charges that waited for the memory budget to have room (memory a task's own "
                                     "batches, a finished job or batches on their way to clients give back).",
                                     NULL, 0);
    /* A pipeline's charge that does not fit waits this long for others
     * to give memory back before its task fails (membudget.h). */
    mem.wait_ms = SL_WORKER_MEMORY_WAIT_MS;
    o.worker.task.mem = &mem;
    /* Sent batches' blocks kept for the next batch are charged too, and
     * freed first when a task needs the room (big_alloc.h). */
    mem.reclaim = sl__big_cache_drain;
    sl__big_cache_set_budget(&mem);
    sl_log_info("memory budget: %zu MiB for all tasks (--max-memory-mb)", mem.limit >> 20);
    struct event_base *base = event_base_new();
    sl_worker_t *w = NULL;
    sl_admin_t *admin = NULL;
    struct event *sigs[2] = {NULL, NULL};
    uint16_t port = 0, admin_port = 0;
    sl_auth_t auth = {0};
    sl_conn_env_t env;
    if (sl_netenv_init(&o.d, &auth, &env, err, sizeof err) < 0) {
        fprintf(stderr, "%s: %s\n", program, err);
        goto out;
    }
    o.worker.env = &env;
    if (!base) {
        fprintf(stderr, "%s: cannot create the event loop\n", program);
        goto out;
    }
    o.worker.port = (uint16_t)o.d.port;
    if (sl_cli_admin_start(base, &o.d, &admin_port, &admin, err, sizeof err) < 0 ||
        (o.worker.admin_port = admin_port, sl_worker_start(base, &o.worker, &port, &w, err, sizeof err) < 0)) {
        fprintf(stderr, "%s: %s\n", program, err);
        goto out;
    }
    sl_wadmin_register(admin, w);
    if (sl_cli_stop_on_signals(base, sigs) < 0) {
        fprintf(stderr, "%s: out of memory\n", program);
        goto out;
    }

    sl_cli_announce(program, port, admin_port);
    event_base_dispatch(base);
    status = SL_EXIT_OK;
out:
    for (int i = 0; i < 2; i++)
        if (sigs[i])
            event_free(sigs[i]);
    sl_admin_free(admin);
    sl_worker_free(w);
    sl__big_cache_set_budget(NULL); /* mem goes out of scope */
    /* After every task (and its pipeline) is gone. */
    sl_plugins_destroy(plugins);
    sl_cachedb_close(cache.db);
    sl_confine_destroy(roots);
    if (base)
        event_base_free(base);
    sl_auth_free(&auth);
    sl_cli_free_argv(cargc, cargv);
    libevent_global_shutdown();
    return status;
}
