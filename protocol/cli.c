/* cli.c: see cli.h. */
#include "cli.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "log.h"

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
