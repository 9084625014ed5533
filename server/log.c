/* log.c - one-line event log on stderr, plain or JSON (see log.h). */
#include "log.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

/* Process log settings: written once by log_setup before threads start,
 * read-only afterwards. The mutex keeps lines whole when stderr is a file. */
static enum log_level g_min_level = LOG_LEVEL_INFO;
static int g_json;
static FILE *g_out;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

/* Room kept at the end of the buffer for the truncation mark, "}" and "\n". */
#define RESERVE 32

void log_setup(enum log_level min_level, int json, FILE *out)
{
    g_min_level = min_level;
    g_json = json != 0;
    g_out = out;
}

int log_enabled(enum log_level level) { return level >= g_min_level; }

const char *log_level_name(enum log_level level)
{
    switch (level) {
    case LOG_LEVEL_DEBUG: return "debug";
    case LOG_LEVEL_INFO: return "info";
    case LOG_LEVEL_WARN: return "warn";
    case LOG_LEVEL_ERROR: return "error";
    }
    return "info";
}

/* Scratch for one field, built before it is known to fit. */
typedef struct field {
    char s[LOG_LINE_MAX];
    size_t n;
} field;

static void f_putc(field *f, char c)
{
    if (f->n + 1 < sizeof f->s) f->s[f->n++] = c;
}

static void f_puts(field *f, const char *s)
{
    while (*s) f_putc(f, *s++);
}

/* v in double quotes, with " \\ \n \r \t escaped by a backslash and other
 * control bytes as \u00XX (json) or \xXX (plain, which escapes DEL too). */
static void f_quoted(field *f, const char *v, int json)
{
    static const char hex[] = "0123456789abcdef";
    f_putc(f, '"');
    for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
        switch (*p) {
        case '"': f_puts(f, "\\\""); break;
        case '\\': f_puts(f, "\\\\"); break;
        case '\n': f_puts(f, "\\n"); break;
        case '\r': f_puts(f, "\\r"); break;
        case '\t': f_puts(f, "\\t"); break;
        default:
            if (*p < 0x20 || (!json && *p == 0x7f)) {
                f_puts(f, json ? "\\u00" : "\\x");
                f_putc(f, hex[*p >> 4]);
                f_putc(f, hex[*p & 15]);
            } else {
                f_putc(f, (char)*p);
            }
        }
    }
    f_putc(f, '"');
}

static void f_json_string(field *f, const char *v) { f_quoted(f, v, 1); }

static int plain_needs_quotes(const char *v)
{
    if (!*v) return 1;
    for (const unsigned char *p = (const unsigned char *)v; *p; p++)
        if (*p <= ' ' || *p == '"' || *p == '=' || *p == '\\' || *p == 0x7f) return 1;
    return 0;
}

static void f_plain_value(field *f, const char *v)
{
    if (plain_needs_quotes(v))
        f_quoted(f, v, 0);
    else
        f_puts(f, v);
}

/* Appends a finished field when it fits; otherwise marks the line cut and
 * drops this and every later field. */
static void line_add(log_line *ln, const field *f)
{
    if (ln->truncated) return;
    if (ln->len + f->n + RESERVE >= sizeof ln->buf) {
        ln->truncated = 1;
        return;
    }
    memcpy(ln->buf + ln->len, f->s, f->n);
    ln->len += f->n;
}

static void field_key(field *f, int json, const char *key)
{
    if (json) {
        f_putc(f, ',');
        f_json_string(f, key);
        f_putc(f, ':');
    } else {
        f_putc(f, ' ');
        f_puts(f, key);
        f_putc(f, '=');
    }
}

void log_begin(log_line *ln, enum log_level level, const char *event)
{
    ln->on = log_enabled(level);
    ln->len = 0;
    ln->truncated = 0;
    ln->level = level;
    ln->json = g_json;
    if (!ln->on) return;

    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[96];
    snprintf(when, sizeof when, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
             (int)(ts.tv_nsec / 1000000));

    field f;
    f.n = 0;
    if (ln->json) {
        f_puts(&f, "{\"ts\":");
        f_json_string(&f, when);
        f_puts(&f, ",\"level\":");
        f_json_string(&f, log_level_name(level));
        f_puts(&f, ",\"event\":");
        f_json_string(&f, event);
    } else {
        f_puts(&f, when);
        f_putc(&f, ' ');
        f_puts(&f, log_level_name(level));
        f_putc(&f, ' ');
        f_puts(&f, event);
    }
    line_add(ln, &f);
}

void log_str(log_line *ln, const char *key, const char *value)
{
    if (!ln->on || !value || !*value) return;
    field f;
    f.n = 0;
    field_key(&f, ln->json, key);
    if (ln->json)
        f_json_string(&f, value);
    else
        f_plain_value(&f, value);
    line_add(ln, &f);
}

void log_int(log_line *ln, const char *key, int64_t value)
{
    if (!ln->on) return;
    char num[32];
    snprintf(num, sizeof num, "%lld", (long long)value);
    field f;
    f.n = 0;
    field_key(&f, ln->json, key);
    f_puts(&f, num);
    line_add(ln, &f);
}

void log_num(log_line *ln, const char *key, double value, int decimals)
{
    if (!ln->on) return;
    if (!isfinite(value)) {
        log_str(ln, key, isnan(value) ? "NaN" : value > 0 ? "Inf" : "-Inf");
        return;
    }
    if (decimals < 0) decimals = 0;
    if (decimals > 9) decimals = 9;
    char num[64];
    snprintf(num, sizeof num, "%.*f", decimals, value);
    field f;
    f.n = 0;
    field_key(&f, ln->json, key);
    f_puts(&f, num);
    line_add(ln, &f);
}

void log_fmt(log_line *ln, const char *key, const char *fmt, ...)
{
    if (!ln->on) return;
    char v[LOG_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v, sizeof v, fmt, ap);
    va_end(ap);
    log_str(ln, key, v);
}

void log_end(log_line *ln)
{
    if (!ln->on) return;
    /* RESERVE guarantees room for the tail. */
    if (ln->json) {
        if (ln->truncated) {
            memcpy(ln->buf + ln->len, ",\"truncated\":true", 17);
            ln->len += 17;
        }
        ln->buf[ln->len++] = '}';
    } else if (ln->truncated) {
        memcpy(ln->buf + ln->len, " ...", 4);
        ln->len += 4;
    }
    ln->buf[ln->len++] = '\n';

    FILE *out = g_out ? g_out : stderr;
    pthread_mutex_lock(&g_mu);
    fwrite(ln->buf, 1, ln->len, out);
    fflush(out);
    pthread_mutex_unlock(&g_mu);
    ln->on = 0;
}

void log_msg(enum log_level level, const char *event, const char *fmt, ...)
{
    log_line ln;
    log_begin(&ln, level, event);
    if (!ln.on) return;
    char v[LOG_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v, sizeof v, fmt, ap);
    va_end(ap);
    log_str(&ln, "msg", v);
    log_end(&ln);
}

void log_thread_name(const char *prefix, int index)
{
    char name[16];
    if (index < 0)
        snprintf(name, sizeof name, "%s", prefix);
    else
        snprintf(name, sizeof name, "%s%d", prefix, index);
    (void)prctl(PR_SET_NAME, name, 0, 0, 0);
}
