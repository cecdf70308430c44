/*
 * sluicectl.c: the operator's tool over the dispatcher's admin endpoint:
 * tables of workers, datasets and jobs, cancel, drain, and a live progress
 * bar of a job.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

static const char *program = "sluicectl";
static int timeout_ms = 10000;
static const char *ca_file; /* --ca: the CA an https:// admin's certificate must chain to */

#define MAX_RESPONSE (16 * 1024 * 1024)

static void usage(FILE *f)
{
    fprintf(f,
            "usage: %s --admin [https://]HOST:PORT [--ca FILE] [--json] [--token-file FILE] COMMAND\n"
            "  https://HOST:PORT speaks TLS to an admin endpoint started with --admin-tls-cert;\n"
            "  --ca FILE is the CA its certificate must chain to (default: the system's)\n"
            "commands:\n"
            "  workers          the workers and their state\n"
            "  datasets         the registered datasets\n"
            "  jobs             the jobs and their progress\n"
            "  job ID           one job in detail: tasks, consumers, rates\n"
            "  cancel ID        cancel a job; its clients get an error\n"
            "  drain ADDR       no new tasks or splits for the worker at ADDR\n"
            "  tasks            a worker's tasks (--admin is the worker's): job, state, buffer,\n"
            "                   its share of the memory budget, requests waiting\n"
            "  watch ID         a live progress bar of a job, until it ends\n"
            "  held-back        what the dispatcher held back at start: damaged records of its\n"
            "                   state store, what each is of and why\n"
            "  forget KIND/ID   delete what is held back (job/12) from the state store for good\n"
            "--version prints the version and exits\n",
            program);
}

/* TLS over fd to the admin endpoint at name, its certificate checked
 * against --ca (or the system's CAs). @return the SSL, or NULL said on stderr */
static SSL *tls_open(int fd, const char *name, SSL_CTX **ctx_out)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    SSL *ssl = NULL;
    const char *step = "setting up TLS";
    if (ctx) {
        SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
        /* The endpoint closes after its answer without close_notify; the
         * answer's Content-Length says whether all of it came. */
        SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
        step = "loading --ca";
        if ((ca_file ? SSL_CTX_load_verify_locations(ctx, ca_file, NULL) : SSL_CTX_set_default_verify_paths(ctx)) ==
                1 &&
            (ssl = SSL_new(ctx)) && SSL_set_fd(ssl, fd) == 1) {
            step = "the TLS handshake";
            if (SSL_connect(ssl) == 1) {
                *ctx_out = ctx;
                return ssl;
            }
        }
    }
    unsigned long e = ERR_get_error();
    char why[256] = "";
    if (e)
        ERR_error_string_n(e, why, sizeof why);
    long v = ssl ? SSL_get_verify_result(ssl) : X509_V_OK;
    fprintf(stderr, "%s: %s with %s failed: %s%s%s\n", program, step, name, why[0] ? why : "connection closed",
            v != X509_V_OK ? ": " : "", v != X509_V_OK ? X509_verify_cert_error_string(v) : "");
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    return NULL;
}

static ssize_t tls_read(SSL *ssl, char *buf, size_t len)
{
    size_t got = 0;
    if (SSL_read_ex(ssl, buf, len, &got) == 1)
        return (ssize_t)got;
    int e = SSL_get_error(ssl, 0);
    if (e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_SYSCALL && errno == 0))
        return 0; /* the server closes after its answer, with or without close_notify */
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
        errno = EAGAIN; /* SO_RCVTIMEO ran out */
    else if (e != SSL_ERROR_SYSCALL)
        errno = EPROTO;
    return -1;
}

static void tls_close(SSL *ssl, SSL_CTX *ctx)
{
    SSL_free(ssl);
    SSL_CTX_free(ctx);
}

/* One HTTP/1.0 request; *body gets the response body (malloc'd). @return the status, or -1 */
static int http(const char *admin, const char *method, const char *path, const char *token, char **body)
{
    char host[256], port[16];
    bool tls = !strncmp(admin, "https://", 8);
    if (tls)
        admin += 8;
    else if (!strncmp(admin, "http://", 7))
        admin += 7;
    const char *colon = strrchr(admin, ':');
    if (!colon || colon == admin || (size_t)(colon - admin) >= sizeof host) {
        fprintf(stderr, "%s: --admin \"%s\": expected host:port\n", program, admin);
        return -1;
    }
    snprintf(host, sizeof host, "%.*s", (int)(colon - admin), admin);
    snprintf(port, sizeof port, "%s", colon + 1);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, port, &hints, &res) != 0 || !res) {
        fprintf(stderr, "%s: cannot resolve %s\n", program, admin);
        return -1;
    }
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) < 0) {
        fprintf(stderr, "%s: cannot connect to %s: %s\n", program, admin, strerror(errno));
        freeaddrinfo(res);
        if (fd >= 0)
            close(fd);
        return -1;
    }
    freeaddrinfo(res);
    SSL_CTX *ctx = NULL;
    SSL *ssl = NULL;
    if (tls && !(ssl = tls_open(fd, admin, &ctx))) {
        close(fd);
        return -1;
    }
    char req[1024], auth[300] = "";
    if (token)
        snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", token);
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.0\r\nHost: %s\r\n%sContent-Length: 0\r\n\r\n", method, path,
                     admin, auth);
    if ((ssl ? SSL_write(ssl, req, n) : write(fd, req, (size_t)n)) != n) {
        fprintf(stderr, "%s: sending to %s: %s\n", program, admin, strerror(errno));
        tls_close(ssl, ctx);
        close(fd);
        return -1;
    }
    size_t len = 0, cap = 65536;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (len == cap) {
            if (cap >= MAX_RESPONSE)
                break;
            cap *= 2;
            buf = realloc(buf, cap + 1);
        }
        ssize_t r = ssl ? tls_read(ssl, buf + len, cap - len) : read(fd, buf + len, cap - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            fprintf(stderr, "%s: reading from %s: %s\n", program, admin,
                    errno == EAGAIN ? "no answer within the timeout" : strerror(errno));
            free(buf);
            tls_close(ssl, ctx);
            close(fd);
            return -1;
        }
        if (r == 0)
            break;
        len += (size_t)r;
    }
    tls_close(ssl, ctx);
    close(fd);
    buf[len] = '\0';
    int status = 0;
    char *sep = strstr(buf, "\r\n\r\n");
    if (sscanf(buf, "HTTP/%*d.%*d %d", &status) != 1 || !sep) {
        fprintf(stderr, "%s: %s answered something that is not HTTP\n", program, admin);
        free(buf);
        return -1;
    }
    const char *cl = strcasestr(buf, "\r\nContent-Length:");
    if (cl && cl < sep && strtoul(cl + 17, NULL, 10) != strlen(sep + 4)) {
        fprintf(stderr, "%s: %s's answer was cut short (%zu of %lu bytes)\n", program, admin, strlen(sep + 4),
                strtoul(cl + 17, NULL, 10));
        free(buf);
        return -1;
    }
    *body = strdup(sep + 4);
    free(buf);
    return status;
}

/* GET/POST/DELETE path and parse the JSON answer; prints the error and returns NULL on failure. */
static json_t *call(const char *admin, const char *method, const char *path, const char *token, bool raw)
{
    char *text = NULL;
    int status = http(admin, method, path, token, &text);
    if (status < 0)
        return NULL;
    json_error_t jerr;
    json_t *j = json_loads(text, 0, &jerr);
    if (status != 200) {
        json_t *e = j ? json_object_get(j, "error") : NULL;
        fprintf(stderr, "%s: %s %s: HTTP %d: %s\n", program, method, path, status,
                e && json_is_string(e) ? json_string_value(e) : text);
        free(text);
        json_decref(j);
        return NULL;
    }
    if (!j)
        fprintf(stderr, "%s: %s %s: bad JSON: %s\n", program, method, path, jerr.text);
    else if (raw)
        printf("%s", text);
    free(text);
    return j;
}

/* ---- tables ---- */

#define MAX_COLS 12
#define MAX_ROWS 4096

struct table {
    int cols, rows;
    char *cell[MAX_ROWS + 1][MAX_COLS];
};

static void table_cell(struct table *t, int row, int col, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void table_cell(struct table *t, int row, int col, const char *fmt, ...)
{
    if (row > MAX_ROWS || col >= MAX_COLS)
        return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    t->cell[row][col] = strdup(buf);
}

/* Starts t over with one header row of the cols names in head. */
static void table_head(struct table *t, const char *const *head, int cols)
{
    t->cols = cols;
    t->rows = 0;
    for (int c = 0; c < cols; c++)
        table_cell(t, 0, c, "%s", head[c]);
}

static void table_print(struct table *t)
{
    size_t width[MAX_COLS] = {0};
    for (int r = 0; r <= t->rows; r++)
        for (int c = 0; c < t->cols; c++)
            if (t->cell[r][c] && strlen(t->cell[r][c]) > width[c])
                width[c] = strlen(t->cell[r][c]);
    for (int r = 0; r <= t->rows; r++) {
        for (int c = 0; c < t->cols; c++) {
            const char *s = t->cell[r][c] ? t->cell[r][c] : "";
            printf(c + 1 < t->cols ? "%-*s  " : "%-*s", c + 1 < t->cols ? (int)width[c] : 0, s);
            free(t->cell[r][c]);
        }
        printf("\n");
    }
}

static const char *str(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return json_is_string(v) ? json_string_value(v) : "";
}

static long long num(json_t *o, const char *k)
{
    return (long long)json_integer_value(json_object_get(o, k));
}

static void human_bytes(char *buf, size_t len, double b)
{
    const char *units[] = {"B", "KB", "MB", "GB", "TB"};
    int u = 0;
    while (b >= 1000 && u < 4) {
        b /= 1000;
        u++;
    }
    snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", b, units[u]);
}

static double job_progress(json_t *j)
{
    json_t *s = json_object_get(j, "splits");
    if (strcmp(str(j, "state"), "FINISHED") == 0)
        return 1;
    if (s && num(s, "records") > 0)
        return (double)num(s, "records_handed_out") / (double)num(s, "records");
    return num(j, "tasks") ? (double)num(j, "tasks_done") / (double)num(j, "tasks") : 0;
}

static void print_workers(json_t *j)
{
    static struct table t;
    const char *head[] = {"ID", "ADDRESS", "STATE", "TASKS", "LAST HEARTBEAT"};
    table_head(&t, head, (int)(sizeof head / sizeof *head));
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(j, "workers"), i, w) {
        int r = ++t.rows;
        table_cell(&t, r, 0, "%lld", num(w, "id"));
        table_cell(&t, r, 1, "%s", str(w, "address"));
        table_cell(&t, r, 2, "%s", str(w, "state"));
        table_cell(&t, r, 3, "%lld", num(w, "active_tasks"));
        table_cell(&t, r, 4, "%lld ms ago", num(w, "last_heartbeat_ms_ago"));
    }
    table_print(&t);
}

/* A worker's GET /v1/tasks: what each task serves and holds. */
static void print_tasks(json_t *j)
{
    static struct table t;
    const char *head[] = {"TASK", "JOB", "SHARDING", "STATE", "BATCHES SERVED", "BUFFER", "MEMORY", "WAITING"};
    table_head(&t, head, (int)(sizeof head / sizeof *head));
    size_t i;
    json_t *k;
    json_array_foreach(json_object_get(j, "tasks"), i, k) {
        int r = ++t.rows;
        json_t *b = json_object_get(k, "buffer");
        table_cell(&t, r, 0, "%lld", num(k, "task_id"));
        table_cell(&t, r, 1, "%lld", num(k, "job_id"));
        table_cell(&t, r, 2, "%s", str(k, "sharding"));
        table_cell(&t, r, 3, "%s", str(k, "state"));
        table_cell(&t, r, 4, "%lld", num(k, "batches_served"));
        table_cell(&t, r, 5, "%lld/%lld%s", num(b, "batches"), num(b, "capacity_batches"),
                   json_is_true(json_object_get(b, "memory_full")) ? " (memory full)"
                   : json_is_true(json_object_get(b, "full"))      ? " (full)"
                                                                   : "");
        table_cell(&t, r, 6, "%.1f MiB", (double)num(k, "memory_bytes") / (1 << 20)); /* as refusals say */
        table_cell(&t, r, 7, "%lld", num(k, "requests_waiting"));
    }
    table_print(&t);
}

static void print_datasets(json_t *j)
{
    static struct table t;
    const char *head[] = {"ID", "FINGERPRINT", "CARDINALITY", "NAME"};
    table_head(&t, head, (int)(sizeof head / sizeof *head));
    size_t i;
    json_t *d;
    json_array_foreach(json_object_get(j, "datasets"), i, d) {
        int r = ++t.rows;
        table_cell(&t, r, 0, "%lld", num(d, "id"));
        table_cell(&t, r, 1, "%s", str(d, "fingerprint"));
        if (num(d, "cardinality") < 0)
            table_cell(&t, r, 2, "unknown");
        else
            table_cell(&t, r, 2, "%lld", num(d, "cardinality"));
        table_cell(&t, r, 3, "%s", str(d, "name")[0] ? str(d, "name") : "-");
    }
    table_print(&t);
}

static void print_held_back(json_t *j)
{
    static struct table t;
    const char *head[] = {"KIND", "ID", "NAME", "REP", "WHY"};
    table_head(&t, head, (int)(sizeof head / sizeof *head));
    size_t i;
    json_t *q;
    json_array_foreach(json_object_get(j, "held_back"), i, q) {
        int r = ++t.rows;
        bool named = json_object_get(q, "name") != NULL;
        table_cell(&t, r, 0, "%s", str(q, "kind"));
        table_cell(&t, r, 1, "%lld", num(q, "id"));
        table_cell(&t, r, 2, "%s", named ? str(q, "name") : "-");
        if (named)
            table_cell(&t, r, 3, "%lld", num(q, "repetition"));
        else
            table_cell(&t, r, 3, "-");
        table_cell(&t, r, 4, "%s", str(q, "why"));
    }
    table_print(&t);
    if (t.rows == 0)
        printf("(none: every record of the state store loaded)\n");
}

static void print_jobs(json_t *j)
{
    static struct table t;
    const char *head[] = {"ID", "NAME", "REP", "DATASET", "SHARDING", "STATE", "PROGRESS", "CONSUMERS", "ELEMENTS",
                          "BYTES"};
    table_head(&t, head, (int)(sizeof head / sizeof *head));
    size_t i;
    json_t *o;
    json_array_foreach(json_object_get(j, "jobs"), i, o) {
        int r = ++t.rows;
        char b[32];
        human_bytes(b, sizeof b, (double)num(o, "bytes_served"));
        table_cell(&t, r, 0, "%lld", num(o, "id"));
        table_cell(&t, r, 1, "%s", *str(o, "name") ? str(o, "name") : "-");
        if (json_object_get(o, "repetition")) /* a named job */
            table_cell(&t, r, 2, "%lld%s", num(o, "repetition"),
                       json_is_true(json_object_get(o, "collected")) ? " (collected)" : "");
        else
            table_cell(&t, r, 2, "-");
        table_cell(&t, r, 3, "%lld", num(o, "dataset_id"));
        table_cell(&t, r, 4, "%s", str(o, "sharding"));
        table_cell(&t, r, 5, "%s", str(o, "state"));
        table_cell(&t, r, 6, "%.0f%%", 100 * job_progress(o));
        table_cell(&t, r, 7, "%lld", num(o, "num_consumers"));
        table_cell(&t, r, 8, "%lld", num(o, "elements_served"));
        table_cell(&t, r, 9, "%s", b);
    }
    table_print(&t);
}

static void print_job(json_t *o)
{
    char b[32];
    human_bytes(b, sizeof b, (double)num(o, "bytes_served"));
    printf("job %lld%s%s%s", num(o, "id"), *str(o, "name") ? " \"" : "", str(o, "name"), *str(o, "name") ? "\"" : "");
    if (json_object_get(o, "repetition"))
        printf(" repetition %lld%s", num(o, "repetition"), json_is_true(json_object_get(o, "collected")) ? " (collected)" : "");
    printf(": %s, %s sharding, dataset %lld\n", str(o, "state"), str(o, "sharding"), num(o, "dataset_id"));
    printf("progress %.0f%%, %lld elements, %lld batches, %s served\n", 100 * job_progress(o),
           num(o, "elements_served"), num(o, "batches_served"), b);
    if (*str(o, "error"))
        printf("error: %s\n", str(o, "error"));
    json_t *s = json_object_get(o, "splits");
    if (s)
        printf("splits: epoch %lld, %lld handed out, %lld of %lld records\n", num(s, "epoch"),
               num(s, "handed_out"), num(s, "records_handed_out"), num(s, "records"));
    static struct table t;
    const char *head[] = {"TASK", "WORKER", "STATE", "BATCHES", "ELEMENTS", "BYTES", "RATE"};
    table_head(&t, head, (int)(sizeof head / sizeof *head));
    size_t i;
    json_t *k;
    json_array_foreach(json_object_get(o, "tasks"), i, k) {
        int r = ++t.rows;
        char by[32], rate[32];
        human_bytes(by, sizeof by, (double)num(k, "bytes"));
        human_bytes(rate, sizeof rate, json_number_value(json_object_get(k, "bytes_per_second")));
        table_cell(&t, r, 0, "%lld", num(k, "task_id"));
        table_cell(&t, r, 1, "%s", str(k, "worker_address"));
        table_cell(&t, r, 2, "%s", str(k, "state"));
        table_cell(&t, r, 3, "%lld", num(k, "batches"));
        table_cell(&t, r, 4, "%lld", num(k, "elements"));
        table_cell(&t, r, 5, "%s", by);
        table_cell(&t, r, 6, "%s/s", rate);
    }
    printf("\n");
    table_print(&t);
    printf("\nconsumers:\n");
    json_t *lowest = NULL; /* coordinated reads: the consumer furthest behind */
    json_array_foreach(json_object_get(o, "consumers"), i, k) {
        /* away: no heartbeat past its lease; stalled: its peers wait for it (admin-api.md) */
        const char *state = str(k, "state");
        printf("  client %lld, ", num(k, "client_id"));
        if (json_object_get(k, "consumer_index")) {
            printf("consumer %lld, next round %lld, ", num(k, "consumer_index"), num(k, "round"));
            if (!lowest || num(k, "round") < num(lowest, "round"))
                lowest = k;
        }
        printf("%s", state);
        if (strcmp(state, "away") == 0)
            printf(" for %lld ms", num(k, "away_ms"));
        else if (strcmp(state, "stalled") == 0)
            printf(" for %lld ms", num(k, "stalled_ms"));
        printf(", last heartbeat %lld ms ago\n", num(k, "last_heartbeat_ms_ago"));
    }
    if (lowest)
        printf("furthest behind: consumer %lld (client %lld), next round %lld; the workers' GET /v1/tasks say "
               "which consumers each open round waits for\n",
               num(lowest, "consumer_index"), num(lowest, "client_id"), num(lowest, "round"));
}

/* Redraws a progress bar until the job ends. @return 0 when it finished */
static int watch(const char *admin, const char *path, const char *token)
{
    for (;;) {
        json_t *o = call(admin, "GET", path, token, false);
        if (!o)
            return 1;
        double f = job_progress(o);
        int filled = (int)(f * 40 + 0.5);
        char bar[41];
        memset(bar, '#', (size_t)filled);
        memset(bar + filled, '.', (size_t)(40 - filled));
        bar[40] = '\0';
        char b[32];
        human_bytes(b, sizeof b, (double)num(o, "bytes_served"));
        printf("\rjob %lld [%s] %3.0f%% %lld elements %s %s   ", num(o, "id"), bar, 100 * f,
               num(o, "elements_served"), b, str(o, "state"));
        fflush(stdout);
        bool running = strcmp(str(o, "state"), "RUNNING") == 0;
        bool finished = strcmp(str(o, "state"), "FINISHED") == 0;
        if (!running) {
            printf("\n");
            if (*str(o, "error"))
                printf("%s\n", str(o, "error"));
        }
        json_decref(o);
        if (!running)
            return finished ? 0 : 1;
        struct timespec ts = {0, 500 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

static char *read_token(const char *file)
{
    FILE *f = fopen(file, "r");
    if (!f) {
        fprintf(stderr, "%s: --token-file %s: %s\n", program, file, strerror(errno));
        return NULL;
    }
    char line[512] = "";
    if (!fgets(line, sizeof line, f))
        line[0] = '\0';
    fclose(f);
    line[strcspn(line, "\r\n")] = '\0';
    return strdup(line);
}

static bool valid_id(const char *s)
{
    if (!*s)
        return false;
    for (const char *p = s; *p; p++)
        if (*p < '0' || *p > '9')
            return false;
    return true;
}

/* KIND/ID of what the dispatcher holds back: job/12, dataset/3, worker/5. */
static bool held_back_name(const char *s)
{
    const char *slash = strchr(s, '/');
    if (!slash)
        return false;
    size_t n = (size_t)(slash - s);
    bool kind = (n == 3 && !strncmp(s, "job", 3)) || (n == 7 && !strncmp(s, "dataset", 7)) ||
                (n == 6 && !strncmp(s, "worker", 6));
    return kind && valid_id(slash + 1);
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"admin", required_argument, NULL, 'a'}, {"json", no_argument, NULL, 'j'},
        {"token-file", required_argument, NULL, 't'}, {"ca", required_argument, NULL, 'c'},
        {"help", no_argument, NULL, 'h'},         {"version", no_argument, NULL, 'v'},
        {NULL, 0, NULL, 0},
    };
    const char *admin = NULL, *token_file = NULL;
    bool raw = false;
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'a': admin = optarg; break;
        case 'j': raw = true; break;
        case 't': token_file = optarg; break;
        case 'c': ca_file = optarg; break;
        case 'h': usage(stdout); return 0;
        case 'v': printf("%s %s\n", program, SLUICE_VERSION); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!admin || optind >= argc) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[optind];
    const char *arg = optind + 1 < argc ? argv[optind + 1] : NULL;
    bool needs_arg = !strcmp(cmd, "job") || !strcmp(cmd, "cancel") || !strcmp(cmd, "drain") || !strcmp(cmd, "watch") ||
                     !strcmp(cmd, "forget");
    if ((needs_arg && (!arg || optind + 2 != argc)) || (!needs_arg && optind + 1 != argc)) {
        fprintf(stderr, "%s: %s takes %s\n", program, cmd, needs_arg ? "one argument" : "no argument");
        return 2;
    }
    if (!strcmp(cmd, "forget") && !held_back_name(arg)) {
        fprintf(stderr, "%s: forget: \"%s\" is not KIND/ID (job/12, dataset/3, worker/5: held-back lists them)\n",
                program, arg);
        return 2;
    }
    if (needs_arg && strcmp(cmd, "drain") != 0 && strcmp(cmd, "forget") != 0 && !valid_id(arg)) {
        fprintf(stderr, "%s: %s: \"%s\" is not a job id\n", program, cmd, arg);
        return 2;
    }
    char *token = token_file ? read_token(token_file) : NULL;
    if (token_file && !token)
        return 2;
    char path[512];
    json_t *j = NULL;
    int status = 1;
    if (!strcmp(cmd, "workers")) {
        if ((j = call(admin, "GET", "/v1/workers", token, raw)) && !raw)
            print_workers(j);
    } else if (!strcmp(cmd, "tasks")) {
        if ((j = call(admin, "GET", "/v1/tasks", token, raw)) && !raw)
            print_tasks(j);
    } else if (!strcmp(cmd, "datasets")) {
        if ((j = call(admin, "GET", "/v1/datasets", token, raw)) && !raw)
            print_datasets(j);
    } else if (!strcmp(cmd, "jobs")) {
        if ((j = call(admin, "GET", "/v1/jobs", token, raw)) && !raw)
            print_jobs(j);
    } else if (!strcmp(cmd, "held-back")) {
        if ((j = call(admin, "GET", "/v1/quarantine", token, raw)) && !raw)
            print_held_back(j);
    } else if (!strcmp(cmd, "forget")) {
        snprintf(path, sizeof path, "/v1/quarantine/%s", arg);
        if ((j = call(admin, "DELETE", path, token, raw)) && !raw)
            printf("%s forgotten: its records are deleted from the state store\n", arg);
    } else if (!strcmp(cmd, "job")) {
        snprintf(path, sizeof path, "/v1/jobs/%s", arg);
        if ((j = call(admin, "GET", path, token, raw)) && !raw)
            print_job(j);
    } else if (!strcmp(cmd, "cancel")) {
        snprintf(path, sizeof path, "/v1/jobs/%s", arg);
        if ((j = call(admin, "DELETE", path, token, raw)) && !raw)
            printf("job %s cancelled\n", arg);
    } else if (!strcmp(cmd, "drain")) {
        snprintf(path, sizeof path, "/v1/workers/%s/drain", arg);
        if ((j = call(admin, "POST", path, token, raw)) && !raw)
            printf("worker %s draining: no new tasks or splits\n", arg);
    } else if (!strcmp(cmd, "watch")) {
        snprintf(path, sizeof path, "/v1/jobs/%s", arg);
        status = watch(admin, path, token);
        free(token);
        return status;
    } else {
        fprintf(stderr, "%s: unknown command \"%s\"\n", program, cmd);
        usage(stderr);
        free(token);
        return 2;
    }
    if (j)
        status = 0;
    json_decref(j);
    free(token);
    return status;
}
