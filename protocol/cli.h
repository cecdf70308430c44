/*
 * cli.h: helpers for the daemons' and tools' command lines: bounded number
 * options, --config files, and the "listening" line.
 */
#ifndef SL_CLI_H
#define SL_CLI_H

#include <stdint.h>

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
 * Reads a JSON object of options ({"worker-timeout-ms": 5000, ...}) and
 * turns it into "--key value" arguments that go before argv[1..], so that
 * the command line overrides the file.
 * @param[out] out_argc, out_argv the combined arguments; free with sl_cli_free_argv()
 * @return 0, or -1 after printing what is wrong (file, key) to stderr
 */
int sl_cli_config_argv(const char *program, const char *file, int argc, char **argv, int *out_argc,
                       char ***out_argv);

void sl_cli_free_argv(int argc, char **argv);

#endif
