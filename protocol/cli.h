/*
 * cli.h: helpers for the daemons' and tools' command lines: bounded number
 * options, --config files, and the "listening" line.
 */
#ifndef SL_CLI_H
#define SL_CLI_H

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

#endif
