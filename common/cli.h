/*
 * cli.h: helpers for the daemons' and tools' command lines: bounded number
 * options, --config files, the options both daemons take, and the
 * "listening" line.
 */
#ifndef SL_CLI_H
#define SL_CLI_H

#include <getopt.h>
#include <stdint.h>

#include <event2/event.h>

/* Exit codes of every Sluice program. */
#define SL_EXIT_OK 0
#define SL_EXIT_FAILURE 1
#define SL_EXIT_USAGE 2

/**
 * Parses an integer option value within [min, max].
 * @return 0, or -1 after printing "PROGRAM: --OPT: ..." to stderr
 */
int sl_cli_int(const char *program, const char *opt, const char *val, int64_t min, int64_t max, int64_t *out);

/**
 * Finds --config FILE (or --config=FILE) in argv, reads the JSON object of
 * options in it ({"worker-timeout-ms": 5000, ...}) and turns it into
 * "--key value" arguments that go before argv[1..], so that the command
 * line overrides the file.
 * @param[out] out_argc, out_argv the combined arguments, free with
 *             sl_cli_free_argv(); 0 and NULL when there is no --config
 * @return 0, or -1 after printing what is wrong (file, key) to stderr
 */
int sl_cli_config_argv(const char *program, int argc, char **argv, int *out_argc, char ***out_argv);

/**
 * Makes SIGINT and SIGTERM end base's loop (a clean shutdown).
 * @param[out] events the two signal events, freed by the caller with event_free()
 * @return 0, or -ENOMEM
 */
int sl_cli_stop_on_signals(struct event_base *base, struct event *events[2]);

void sl_cli_free_argv(int argc, char **argv);

#define SL_CLI_MAX_DATA_ROOTS 16

/* The options both daemons take (their --help says what each does). */
typedef struct sl_daemon_opts {
    int64_t port, admin_port; /* -1 until given: both are required */
    const char *bind;         /* protocol address, default 0.0.0.0 */
    const char *admin_bind;   /* admin address, default 127.0.0.1 */
    const char *admin_token_file;
    const char *data_roots[SL_CLI_MAX_DATA_ROOTS];
    int num_data_roots;
    int log_level;  /* SL_LOG_INFO unless given */
    int log_format; /* text unless given */
} sl_daemon_opts_t;

/* Their getopt codes, above any daemon's own, and their long options, which
 * a daemon's table of long options starts with. --config is read before
 * getopt runs (sl_cli_config_argv()). */
enum {
    SL_CLI_O_PORT = 1000,
    SL_CLI_O_ADMIN_PORT,
    SL_CLI_O_BIND,
    SL_CLI_O_ADMIN_BIND,
    SL_CLI_O_TOKEN,
    SL_CLI_O_ROOT,
    SL_CLI_O_LOG_LEVEL,
    SL_CLI_O_LOG_FORMAT,
    SL_CLI_O_CONFIG,
};
#define SL_CLI_DAEMON_LONGOPTS                                                                                      \
    {"port", required_argument, NULL, SL_CLI_O_PORT}, {"admin-port", required_argument, NULL, SL_CLI_O_ADMIN_PORT}, \
        {"bind", required_argument, NULL, SL_CLI_O_BIND},                                                           \
        {"admin-bind", required_argument, NULL, SL_CLI_O_ADMIN_BIND},                                               \
        {"admin-token-file", required_argument, NULL, SL_CLI_O_TOKEN},                                              \
        {"data-root", required_argument, NULL, SL_CLI_O_ROOT},                                                      \
        {"log-level", required_argument, NULL, SL_CLI_O_LOG_LEVEL},                                                 \
        {"log-format", required_argument, NULL, SL_CLI_O_LOG_FORMAT},                                               \
        {"config", required_argument, NULL, SL_CLI_O_CONFIG}

/** The defaults: no ports yet, 0.0.0.0 and 127.0.0.1, info logs as text. */
void sl_daemon_opts_init(sl_daemon_opts_t *o);

/**
 * Takes getopt's option c with its argument when it is one of SL_CLI_O_*.
 * @return 1 taken, 0 not one of them, -1 a bad value (said on stderr as
 *         "PROGRAM: --OPT: ...")
 */
int sl_daemon_opt(const char *program, int c, const char *arg, sl_daemon_opts_t *o);

/** Prints the line tests and scripts wait for, "PROGRAM listening port=P
 *  admin_port=Q", on stdout, flushed. */
void sl_cli_announce(const char *program, unsigned port, unsigned admin_port);

#endif
