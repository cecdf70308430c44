/*
 * log.h: one line per event on stderr, "TIME LEVEL PROGRAM: message" or a
 * JSON object.
 * Safe to call from any thread.
 */
#ifndef SL_LOG_H
#define SL_LOG_H

enum sl_log_level { SL_LOG_ERROR = 0, SL_LOG_WARN = 1, SL_LOG_INFO = 2, SL_LOG_DEBUG = 3 };

/** Sets the program name printed on each line and the most verbose level printed. */
void sl_log_init(const char *program, int level);

enum sl_log_format { SL_LOG_TEXT = 0, SL_LOG_JSON = 1 };

/** Chooses text lines or one JSON object per line
 *  ({"ts": ..., "level": ..., "program": ..., "msg": ...}). */
void sl_log_set_format(int format);

/** Parses "text" or "json". @return the format, or -1 */
int sl_log_format_parse(const char *name);

/** Parses "error", "warn", "info" or "debug". @return the level, or -1 */
int sl_log_level_parse(const char *name);

void sl_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define sl_log_error(...) sl_log(SL_LOG_ERROR, __VA_ARGS__)
#define sl_log_warn(...) sl_log(SL_LOG_WARN, __VA_ARGS__)
#define sl_log_info(...) sl_log(SL_LOG_INFO, __VA_ARGS__)
#define sl_log_debug(...) sl_log(SL_LOG_DEBUG, __VA_ARGS__)

#endif
