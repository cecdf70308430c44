/*
 * cli.h: helpers for the daemons' and tools' command lines: bounded number
 * options, --config files, the options both daemons take, and the
 * "listening" line.
 */
#ifndef SL_CLI_H
#define SL_CLI_H

#include <getopt.h>
#include <stdbool.h>
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
    const char *admin_tls_cert, *admin_tls_key; /* HTTPS on the admin port */
    /* Security (docs/security.md). */
    const char *auth_token_file; /* NULL: SLUICE_AUTH_TOKEN_FILE */
    const char *tls_cert, *tls_key, *tls_ca;
    bool insecure;               /* serve any peer without a token or TLS */
    int64_t max_connections;     /* protocol connections open at once */
    int64_t max_partial_frame_mb; /* unfinished frames of all peers together */
    int64_t handshake_timeout_ms; /* a peer's whole handshake */
    int64_t idle_timeout_ms;     /* 0: never */
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
    SL_CLI_O_AUTH_TOKEN,
    SL_CLI_O_TLS_CERT,
    SL_CLI_O_TLS_KEY,
    SL_CLI_O_TLS_CA,
    SL_CLI_O_INSECURE,
    SL_CLI_O_MAX_CONNS,
    SL_CLI_O_MAX_PARTIAL,
    SL_CLI_O_HANDSHAKE_MS,
    SL_CLI_O_IDLE_MS,
    SL_CLI_O_ADMIN_TLS_CERT,
    SL_CLI_O_ADMIN_TLS_KEY,
    SL_CLI_O_VERSION,
};
#define SL_CLI_DAEMON_LONGOPTS                                                                                      \
    {"port", required_argument, NULL, SL_CLI_O_PORT}, {"admin-port", required_argument, NULL, SL_CLI_O_ADMIN_PORT}, \
        {"bind", required_argument, NULL, SL_CLI_O_BIND},                                                           \
        {"admin-bind", required_argument, NULL, SL_CLI_O_ADMIN_BIND},                                               \
        {"admin-token-file", required_argument, NULL, SL_CLI_O_TOKEN},                                              \
        {"data-root", required_argument, NULL, SL_CLI_O_ROOT},                                                      \
        {"log-level", required_argument, NULL, SL_CLI_O_LOG_LEVEL},                                                 \
        {"log-format", required_argument, NULL, SL_CLI_O_LOG_FORMAT},                                               \
        {"config", required_argument, NULL, SL_CLI_O_CONFIG},                                                       \
        {"auth-token-file", required_argument, NULL, SL_CLI_O_AUTH_TOKEN},                                          \
        {"tls-cert", required_argument, NULL, SL_CLI_O_TLS_CERT},                                                   \
        {"tls-key", required_argument, NULL, SL_CLI_O_TLS_KEY}, {"tls-ca", required_argument, NULL, SL_CLI_O_TLS_CA}, \
        {"insecure", no_argument, NULL, SL_CLI_O_INSECURE},                                                         \
        {"max-connections", required_argument, NULL, SL_CLI_O_MAX_CONNS},                                           \
        {"max-partial-frame-mb", required_argument, NULL, SL_CLI_O_MAX_PARTIAL},                                    \
        {"handshake-timeout-ms", required_argument, NULL, SL_CLI_O_HANDSHAKE_MS},                                   \
        {"idle-timeout-ms", required_argument, NULL, SL_CLI_O_IDLE_MS},                                             \
        {"admin-tls-cert", required_argument, NULL, SL_CLI_O_ADMIN_TLS_CERT},                                       \
        {"admin-tls-key", required_argument, NULL, SL_CLI_O_ADMIN_TLS_KEY},                                       \
        {"version", no_argument, NULL, SL_CLI_O_VERSION}

/* The usage lines of the options above that concern security and limits. */
#define SL_CLI_DAEMON_SECURITY_USAGE                                                                                \
    "  --auth-token-file FILE   cluster token every peer must prove (also SLUICE_AUTH_TOKEN_FILE)\n"               \
    "  --tls-cert FILE --tls-key FILE --tls-ca FILE\n"                                                              \
    "                           TLS 1.3 on every protocol connection, peers verified against the CA\n"            \
    "  --insecure               without a token or TLS, serve non-loopback peers too (default: loopback only)\n"   \
    "  --max-connections N      protocol connections open at once (default 4096)\n"                               \
    "  --max-partial-frame-mb N bytes of unfinished frames from all peers together (default 512)\n"              \
    "  --handshake-timeout-ms N a peer's whole handshake, TLS included (default 10000)\n"                        \
    "  --idle-timeout-ms N      close a connection quiet this long that is owed nothing (default 600000, 0 never)\n" \
    "  --admin-tls-cert FILE --admin-tls-key FILE\n"                                                               \
    "                           HTTPS on the admin port (default: plain HTTP)\n"

/* The usage lines every daemon's --help ends with: the admin token, the
 * lines above, logs, --config and --version. */
#define SL_CLI_DAEMON_TAIL_USAGE                                                                                    \
    "  --admin-token-file FILE  require \"Authorization: Bearer <token>\" for admin changes\n"                       \
    SL_CLI_DAEMON_SECURITY_USAGE                                                                                    \
    "  --log-level LEVEL        error, warn, info (default) or debug\n"                                            \
    "  --log-format FORMAT      text (default) or json, one line per event\n"                                      \
    "  --config FILE.json       options as a JSON object; the command line wins\n"                                 \
    "  --version                print the version and exit\n"

/** The defaults: no ports yet, 0.0.0.0 and 127.0.0.1, info logs as text. */
void sl_daemon_opts_init(sl_daemon_opts_t *o);

/**
 * Takes getopt's option c with its argument when it is one of SL_CLI_O_*
 * (--version prints the version and exits 0).
 * @return 1 taken, 0 not one of them, -1 a bad value (said on stderr as
 *         "PROGRAM: --OPT: ...")
 */
int sl_daemon_opt(const char *program, int c, const char *arg, sl_daemon_opts_t *o);

/** Prints "PROGRAM VERSION" (the project's version) on stdout: what
 *  --version says, in every daemon and tool. */
void sl_cli_version(const char *program);

/**
 * The start both daemons share: their arguments (a --config file's first,
 * sl_cli_config_argv()) through parse(), then logging as d says (d points
 * into what parse() fills) and SIGPIPE ignored (a peer that hangs up is an
 * error on its socket, not the end of the daemon).
 * @param[out] cargc, cargv as sl_cli_config_argv() gives them: the caller
 *             frees them with sl_cli_free_argv() at exit (the options point
 *             into them)
 * @return 0, or -1 after the file or parse() said on stderr what is wrong
 *         (the daemon exits SL_EXIT_USAGE); nothing is left to free then
 */
int sl_cli_daemon_begin(const char *program, int argc, char **argv, int (*parse)(int argc, char **argv, void *opts),
                        void *opts, const sl_daemon_opts_t *d, int *cargc, char ***cargv);

struct sl_admin;

/**
 * The admin endpoint as d says: its address and port, its token file, its
 * TLS, and a warning in the log when it listens beyond the host.
 * @param[out] bound_port the port it listens on
 * @param[out] out the endpoint, freed by the caller with sl_admin_free()
 *             (also after a failure; left as it was when none started)
 * @return 0, or < 0 with err set
 */
int sl_cli_admin_start(struct event_base *base, const sl_daemon_opts_t *d, uint16_t *bound_port,
                       struct sl_admin **out, char *err, size_t errlen);

/** Prints the line tests and scripts wait for, "PROGRAM listening port=P
 *  admin_port=Q", on stdout, flushed. */
void sl_cli_announce(const char *program, unsigned port, unsigned admin_port);

#endif
