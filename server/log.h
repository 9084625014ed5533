/* log.h - the daemon's event log: one line per event on stderr.
 *
 * Why this exists: operators grep and ship these lines, so every event has the
 * same shape in both formats, and a line is never interleaved with another:
 *   plain: 2026-11-29T12:00:00.123Z info rank model=demo request_id=abc code=OK ms=1.2
 *   json:  {"ts":"2026-11-29T12:00:00.123Z","level":"info","event":"rank","model":"demo",...}
 * A line is built field by field (log_begin, log_str/log_int/log_num,
 * log_end), so values are quoted (plain: "a b" with \" and \\) or escaped
 * (JSON) by one function, never by the caller.
 *
 * Thread-safety: log_setup runs once at startup, before threads start; every
 * other function may be called from any thread. A log_line lives on the
 * caller's stack and belongs to one thread. Lines longer than the line buffer
 * are cut (marked with "..." in plain mode; JSON stays valid).
 */
#ifndef IKBO_SERVER_LOG_H
#define IKBO_SERVER_LOG_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

/* Same numbering as config_log_level. */
enum log_level { LOG_LEVEL_DEBUG = 0, LOG_LEVEL_INFO = 1, LOG_LEVEL_WARN = 2, LOG_LEVEL_ERROR = 3 };

/* Minimum level written, format (json != 0: one JSON object per line), and
 * where lines go (NULL = stderr; tests pass a tmpfile). */
void log_setup(enum log_level min_level, int json, FILE *out);

int log_enabled(enum log_level level);

#define LOG_LINE_MAX 2048

typedef struct log_line {
    int on; /* 0 when the level is filtered: every call is then a no-op */
    int json;
    size_t len;
    int truncated;
    enum log_level level;
    char buf[LOG_LINE_MAX];
} log_line;

/* Starts a line for `event` (a short word: "rank", "listening", "model_load"). */
void log_begin(log_line *ln, enum log_level level, const char *event);
/* Adds key=value. log_str skips the field when value is NULL or "". */
void log_str(log_line *ln, const char *key, const char *value);
void log_int(log_line *ln, const char *key, int64_t value);
/* A number with up to `decimals` digits after the point (ms=1.25). */
void log_num(log_line *ln, const char *key, double value, int decimals);
/* key=value with a printf-formatted value (quoted/escaped like log_str). */
void log_fmt(log_line *ln, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Writes the line (with the trailing newline) in one write. */
void log_end(log_line *ln);

/* One-call form for simple events: `event msg="<formatted>"`. */
void log_msg(enum log_level level, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

const char *log_level_name(enum log_level level);

/* Names the calling thread "<prefix><index>" (index < 0: no number; cut to
 * the kernel's 15 bytes), so top -H, ps -L and /proc/<pid>/task/<tid>/comm
 * tell the server's threads apart. Best effort: failure is ignored. */
void log_thread_name(const char *prefix, int index);

#endif
