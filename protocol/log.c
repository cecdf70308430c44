/* log.c: see log.h. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static const char *log_program = "sluice";
static int log_level = SL_LOG_INFO;
static const char *level_names[] = {"error", "warn", "info", "debug"};

void sl_log_init(const char *program, int level)
{
    log_program = program;
    log_level = level;
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
    fprintf(stderr, "%s.%03ldZ %s %s: %s\n", ts, (long)(tv.tv_usec / 1000), level_names[level], log_program, msg);
}
