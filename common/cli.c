/* cli.c: see cli.h. */
#include "cli.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "admin.h"
#include "log.h"
#include "sluice.h"

int sl_cli_int(const char *program, const char *opt, const char *val, int64_t min, int64_t max, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(val, &end, 10);
    if (errno || end == val || *end) {
        fprintf(stderr, "%s: --%s: \"%s\" is not an integer\n", program, opt, val);
        return -1;
    }
    if (v < min || v > max) {
        fprintf(stderr, "%s: --%s: %lld is out of range [%" PRId64 ", %" PRId64 "]\n", program, opt, v, min, max);
        return -1;
    }
    *out = v;
    return 0;
}

void sl_cli_free_argv(int argc, char **argv)
{
    for (int i = 0; i < argc; i++)
        free(argv[i]);
    free(argv);
}

static int config_argv(const char *program, const char *file, int argc, char **argv, int *out_argc,
                       char ***out_argv)
{
    json_error_t jerr;
    json_t *root = json_load_file(file, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        fprintf(stderr, "%s: --config %s: line %d: %s\n", program, file, jerr.line, jerr.text);
        return -1;
    }
    if (!json_is_object(root)) {
        fprintf(stderr, "%s: --config %s: expected a JSON object of options\n", program, file);
        json_decref(root);
        return -1;
    }
    size_t n = 1 + 2 * json_object_size(root) + (size_t)(argc - 1);
    char **av = calloc(n + 1, sizeof *av);
    int k = 0;
    if (!av)
        goto oom;
    if (!(av[k++] = strdup(argv[0])))
        goto oom;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        char opt[128], val[4096];
        snprintf(opt, sizeof opt, "--%s", key);
        if (json_is_string(v)) {
            snprintf(val, sizeof val, "%s", json_string_value(v));
        } else if (json_is_integer(v)) {
            snprintf(val, sizeof val, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        } else if (json_is_array(v)) {
            /* A list becomes the comma-separated form the option takes. */
            size_t i, off = 0;
            json_t *e;
            val[0] = '\0';
            json_array_foreach(v, i, e) {
                if (!json_is_string(e)) {
                    fprintf(stderr, "%s: --config %s: \"%s\"[%zu] must be a string\n", program, file, key, i);
                    goto bad;
                }
                off += (size_t)snprintf(val + off, off < sizeof val ? sizeof val - off : 0, "%s%s", i ? "," : "",
                                        json_string_value(e));
            }
        } else {
            fprintf(stderr, "%s: --config %s: \"%s\" must be a string, an integer or a list\n", program, file, key);
            goto bad;
        }
        if (!(av[k++] = strdup(opt)) || !(av[k++] = strdup(val)))
            goto oom;
    }
    for (int i = 1; i < argc; i++)
        if (!(av[k++] = strdup(argv[i])))
            goto oom;
    json_decref(root);
    *out_argc = k;
    *out_argv = av;
    return 0;
oom:
    fprintf(stderr, "%s: out of memory\n", program);
bad:
    json_decref(root);
    if (av)
        sl_cli_free_argv(k, av);
    return -1;
}

int sl_cli_config_argv(const char *program, int argc, char **argv, int *out_argc, char ***out_argv)
{
    *out_argc = 0;
    *out_argv = NULL;
    for (int i = 1; i < argc; i++) {
        const char *file = NULL;
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
            file = argv[i + 1];
        else if (strncmp(argv[i], "--config=", 9) == 0)
            file = argv[i] + 9;
        if (file)
            return config_argv(program, file, argc, argv, out_argc, out_argv);
    }
    return 0;
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    (void)what;
    sl_log_info("signal %d: shutting down", (int)sig);
    event_base_loopexit(arg, NULL);
}

int sl_cli_stop_on_signals(struct event_base *base, struct event *events[2])
{
    events[0] = evsignal_new(base, SIGINT, on_signal, base);
    events[1] = evsignal_new(base, SIGTERM, on_signal, base);
    if (!events[0] || !events[1] || event_add(events[0], NULL) < 0 || event_add(events[1], NULL) < 0)
        return -ENOMEM;
    return 0;
}

int sl_cli_daemon_begin(const char *program, int argc, char **argv, int (*parse)(int argc, char **argv, void *opts),
                        void *opts, const sl_daemon_opts_t *d, int *cargc, char ***cargv)
{
    if (sl_cli_config_argv(program, argc, argv, cargc, cargv) < 0)
        return -1;
    if ((*cargv ? parse(*cargc, *cargv, opts) : parse(argc, argv, opts)) < 0) {
        sl_cli_free_argv(*cargc, *cargv);
        *cargc = 0;
        *cargv = NULL;
        return -1;
    }
    sl_log_init(program, d->log_level);
    sl_log_set_format(d->log_format);
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

int sl_cli_admin_start(struct event_base *base, const sl_daemon_opts_t *d, uint16_t *bound_port, sl_admin_t **out,
                       char *err, size_t errlen)
{
    int rc = sl_admin_start(base, d->admin_bind, (uint16_t)d->admin_port, bound_port, out, err, errlen);
    if (rc == 0 && (rc = sl_admin_use_token_file(*out, d->admin_token_file, err, errlen)) == 0 &&
        (rc = sl_admin_use_tls(*out, d->admin_tls_cert, d->admin_tls_key, err, errlen)) == 0)
        sl_admin_warn_exposure(*out, d->admin_bind);
    return rc;
}

void sl_daemon_opts_init(sl_daemon_opts_t *o)
{
    *o = (sl_daemon_opts_t){.port = -1,
                            .admin_port = -1,
                            .bind = "0.0.0.0",
                            .admin_bind = "127.0.0.1",
                            .max_connections = 4096,
                            .max_partial_frame_mb = 512,
                            .handshake_timeout_ms = 10000,
                            .idle_timeout_ms = 600000,
                            .log_level = SL_LOG_INFO};
}

void sl_cli_version(const char *program)
{
    printf("%s %s\n", program, sl_version());
    fflush(stdout);
}

int sl_daemon_opt(const char *program, int c, const char *arg, sl_daemon_opts_t *o)
{
    switch (c) {
    case SL_CLI_O_PORT: return sl_cli_int(program, "port", arg, 0, 65535, &o->port) < 0 ? -1 : 1;
    case SL_CLI_O_ADMIN_PORT: return sl_cli_int(program, "admin-port", arg, 0, 65535, &o->admin_port) < 0 ? -1 : 1;
    case SL_CLI_O_BIND: o->bind = arg; return 1;
    case SL_CLI_O_ADMIN_BIND: o->admin_bind = arg; return 1;
    case SL_CLI_O_TOKEN: o->admin_token_file = arg; return 1;
    case SL_CLI_O_ADMIN_TLS_CERT: o->admin_tls_cert = arg; return 1;
    case SL_CLI_O_ADMIN_TLS_KEY: o->admin_tls_key = arg; return 1;
    case SL_CLI_O_ROOT:
        if (o->num_data_roots == SL_CLI_MAX_DATA_ROOTS) {
            fprintf(stderr, "%s: --data-root: at most %d directories\n", program, SL_CLI_MAX_DATA_ROOTS);
            return -1;
        }
        o->data_roots[o->num_data_roots++] = arg;
        return 1;
    case SL_CLI_O_LOG_LEVEL:
        if ((o->log_level = sl_log_level_parse(arg)) < 0) {
            fprintf(stderr, "%s: --log-level: \"%s\" is not error, warn, info or debug\n", program, arg);
            return -1;
        }
        return 1;
    case SL_CLI_O_LOG_FORMAT:
        if ((o->log_format = sl_log_format_parse(arg)) < 0) {
            fprintf(stderr, "%s: --log-format: \"%s\" is not text or json\n", program, arg);
            return -1;
        }
        return 1;
    case SL_CLI_O_CONFIG: return 1; /* read before getopt runs */
    case SL_CLI_O_AUTH_TOKEN: o->auth_token_file = arg; return 1;
    case SL_CLI_O_TLS_CERT: o->tls_cert = arg; return 1;
    case SL_CLI_O_TLS_KEY: o->tls_key = arg; return 1;
    case SL_CLI_O_TLS_CA: o->tls_ca = arg; return 1;
    case SL_CLI_O_INSECURE: o->insecure = true; return 1;
    case SL_CLI_O_VERSION: sl_cli_version(program); exit(0);
    case SL_CLI_O_MAX_CONNS:
        return sl_cli_int(program, "max-connections", arg, 1, 1000000, &o->max_connections) < 0 ? -1 : 1;
    case SL_CLI_O_MAX_PARTIAL:
        return sl_cli_int(program, "max-partial-frame-mb", arg, 1, 1 << 20, &o->max_partial_frame_mb) < 0 ? -1 : 1;
    case SL_CLI_O_HANDSHAKE_MS:
        return sl_cli_int(program, "handshake-timeout-ms", arg, 100, 600000, &o->handshake_timeout_ms) < 0 ? -1 : 1;
    case SL_CLI_O_IDLE_MS:
        return sl_cli_int(program, "idle-timeout-ms", arg, 0, INT32_MAX, &o->idle_timeout_ms) < 0 ? -1 : 1;
    default: return 0;
    }
}

void sl_cli_announce(const char *program, unsigned port, unsigned admin_port)
{
    printf("%s listening port=%u admin_port=%u\n", program, port, admin_port);
    fflush(stdout);
}
