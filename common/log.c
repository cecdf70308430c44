/* log.c: see log.h. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include <jansson.h>

static const char *log_program = "sluice";
static int log_level = SL_LOG_INFO;
static int log_format = SL_LOG_TEXT;
static const char *level_names[] = {"error", "warn", "info", "debug"};

void sl_log_init(const char *program, int level)
{
    log_program = program;
    log_level = level;
}

void sl_log_set_format(int format)
{
    log_format = format;
}

int sl_log_format_parse(const char *name)
{
    if (strcmp(name, "text") == 0)
        return SL_LOG_TEXT;
    if (strcmp(name, "json") == 0)
        return SL_LOG_JSON;
    return -1;
}

int sl_log_level_parse(const char *name)
{
    for (int i = 0; i < (int)(sizeof level_names / sizeof level_names[0]); i++)
        if (strcmp(name, level_names[i]) == 0)
            return i;
    return -1;
}

void sl_log(int level, const char *fmt, ...)
{
    if (level > log_level)
        return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);

    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    char ts[32];
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
    /* One fprintf per line: stdio locks the stream, so lines of different
     * threads do not interleave. */
    if (log_format == SL_LOG_JSON) {
        char when[48];
        snprintf(when, sizeof when, "%s.%03ldZ", ts, (long)(tv.tv_usec / 1000));
        json_t *o = json_pack("{s:s,s:s,s:s,s:s}", "ts", when, "level", level_names[level], "program", log_program,
                              "msg", msg);
        char *line = o ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
        if (line)
            fprintf(stderr, "%s\n", line);
        free(line);
        json_decref(o);
        return;
    }
    fprintf(stderr, "%s.%03ldZ %s %s: %s\n", ts, (long)(tv.tv_usec / 1000), level_names[level], log_program, msg);
}
