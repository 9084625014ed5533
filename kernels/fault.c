/* fault.c - IKBO_FAULT parsing and per-backend arming (see fault.h). */
#include "fault.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"

static const char *const point_names[BK_FAULT_POINTS] = {"alloc", "launch", "sync", "graph", "lost",
                                                          "hang"};

/* A decimal in [1, LONG_MAX] spanning exactly [s, end); -1 otherwise. */
static long positive(const char *s, const char *end)
{
    if (s == end || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    char *stop;
    long v = strtol(s, &stop, 10);
    return errno || stop != end || v < 1 ? -1 : v;
}

static int parse_rule(const char *s, size_t len, bk_fault_rule *r, bk_err *err)
{
    const char *end = s + len, *colon = memchr(s, ':', len);
    int p = 0;
    while (colon && p < BK_FAULT_POINTS &&
           !((size_t)(colon - s) == strlen(point_names[p]) && !memcmp(s, point_names[p], colon - s)))
        p++;
    if (!colon || p == BK_FAULT_POINTS) {
        bk_seterr(err, "IKBO_FAULT: rule \"%.*s\": expected POINT:N[@B] with POINT alloc, launch, "
                  "sync, graph, lost or hang", (int)len, s);
        return -1;
    }
    const char *at = memchr(colon + 1, '@', end - colon - 1);
    r->point = (enum bk_fault_point)p;
    r->n = positive(colon + 1, at ? at : end);
    r->backend = at ? positive(at + 1, end) : 0;
    if (r->n < 0 || r->backend < 0) {
        bk_seterr(err, "IKBO_FAULT: rule \"%.*s\": N and B must be integers >= 1", (int)len, s);
        return -1;
    }
    return 0;
}

int bk_fault_parse(const char *spec, bk_fault_rule *rules, int max, bk_err *err)
{
    int n = 0;
    for (const char *s = spec; *s;) {
        size_t len = strcspn(s, ",");
        if (n == max) {
            bk_seterr(err, "IKBO_FAULT: more than %d rules", max);
            return -1;
        }
        if (parse_rule(s, len, &rules[n], err))
            return -1;
        for (int i = 0; i < n; i++)
            if (rules[i].point == rules[n].point && rules[i].backend == rules[n].backend) {
                bk_seterr(err, "IKBO_FAULT: two rules for %s@%ld", point_names[rules[n].point],
                          rules[n].backend);
                return -1;
            }
        n++;
        s += len;
        if (*s == ',' && *++s == '\0') {
            bk_seterr(err, "IKBO_FAULT: empty rule after the last ','");
            return -1;
        }
    }
    return n;
}

static struct {
    pthread_once_t once;
    int n;           /* rules, or -1: malformed */
    bk_err err;      /* the parse error */
    long backends;   /* backends created so far (atomic) */
    bk_fault_rule rules[BK_FAULT_MAX_RULES];
} g = {.once = PTHREAD_ONCE_INIT};

static void read_env(void)
{
    const char *spec = getenv("IKBO_FAULT");
    g.n = spec && *spec ? bk_fault_parse(spec, g.rules, BK_FAULT_MAX_RULES, &g.err) : 0;
}

int bk_fault_next_backend(bk_fault *out, bk_err *err)
{
    memset(out, 0, sizeof *out);
    pthread_once(&g.once, read_env);
    if (g.n < 0) {
        bk_seterr(err, "%s", g.err.msg);
        return -1;
    }
    if (g.n == 0)
        return 0;
    long b = __atomic_add_fetch(&g.backends, 1, __ATOMIC_RELAXED);
    /* A rule for this backend wins over one for every backend. */
    for (int i = 0; i < g.n; i++)
        if (g.rules[i].backend == b || (g.rules[i].backend == 0 && !out->fail_at[g.rules[i].point]))
            out->fail_at[g.rules[i].point] = g.rules[i].n;
    return 0;
}

#define LOST_MSG "the device is lost (a fault left it unusable for the rest of this process)"

int bk_fault_wait(bk_fault *f, const char *what, bk_err *err)
{
    if (bk_fault_hit(f, BK_FAULT_HANG))
        for (;;)
            sleep(3600); /* a kernel that never finishes; the process ends around it */
    if (bk_fault_hit(f, BK_FAULT_LOST))
        __atomic_store_n(&f->lost, 1, __ATOMIC_RELEASE);
    if (__atomic_load_n(&f->lost, __ATOMIC_ACQUIRE)) {
        bk_seterr(err, "%s: " LOST_MSG BK_FAULT_INJECTED, what);
        return -1;
    }
    if (bk_fault_hit(f, BK_FAULT_SYNC)) {
        bk_seterr(err, "%s: stream failed" BK_FAULT_INJECTED, what);
        return -1;
    }
    return 0;
}

int bk_fault_lost(bk_fault *f, bk_err *why)
{
    if (!__atomic_load_n(&f->lost, __ATOMIC_ACQUIRE))
        return 0;
    bk_seterr(why, LOST_MSG BK_FAULT_INJECTED);
    return 1;
}
