/* alloc_fail.c - the allocation wrappers behind alloc_fail.h.
 *
 * Why this exists: out-of-memory branches are the least exercised code in
 * the server; the sweep in test_alloc_fail.c drives every one it can reach
 * through these wrappers (linked with -Wl,--wrap=..., see alloc_fail.h).
 *
 * Bookkeeping: a table of live blocks (pointer -> size, call site) and a
 * table of call sites (address -> calls, failures), both open-addressed and
 * grown with the real allocator, under one mutex. The blocks themselves are
 * the real allocator's, unchanged (no header), so a block may be freed by a
 * library that never saw the wrapper without corrupting anything; it then
 * stays in the table and shows up as a leak, which is how a missing
 * hand-off (alloc_fail.h) is found.
 */
#define _GNU_SOURCE
#include "alloc_fail.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);
int __real_posix_memalign(void **out, size_t align, size_t n);
void *__real_aligned_alloc(size_t align, size_t n);
ProtobufCMessage *__real_protobuf_c_message_unpack(const ProtobufCMessageDescriptor *d,
                                                   ProtobufCAllocator *a, size_t len,
                                                   const uint8_t *data);
void __real_protobuf_c_message_free_unpacked(ProtobufCMessage *m, ProtobufCAllocator *a);
void __real_log_thread_name(const char *prefix, int index);

/* ---- state -------------------------------------------------------------- */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_long g_target;     /* 0: not failing */
static atomic_int g_persistent;
static atomic_uint g_roles;      /* 0: not counting */
static atomic_long g_count, g_fired, g_foreign;
static uintptr_t g_last_site;
static _Thread_local unsigned t_role = AF_OTHER;

typedef struct blk {
    void *p; /* NULL: empty slot */
    size_t size;
    uintptr_t site;
    unsigned long seq; /* allocation order */
} blk;
static blk *g_blk;
static size_t g_blk_cap, g_blk_n, g_blk_bytes;
static unsigned long g_seq;

typedef struct site {
    uintptr_t addr; /* 0: empty slot */
    unsigned long calls, failed;
} site;
static site *g_site;
static size_t g_site_cap, g_site_n;

static size_t hash_ptr(uintptr_t x, size_t cap)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x & (cap - 1);
}

/* Both tables double at half load; a failed growth only loses bookkeeping
 * precision, never a block (the test then reports the table as full). */
static int blk_grow(void)
{
    size_t cap = g_blk_cap ? 2 * g_blk_cap : 1 << 14;
    blk *t = __real_calloc(cap, sizeof *t);
    if (!t) return -1;
    for (size_t i = 0; i < g_blk_cap; i++) {
        if (!g_blk[i].p) continue;
        size_t j = hash_ptr((uintptr_t)g_blk[i].p, cap);
        while (t[j].p) j = (j + 1) & (cap - 1);
        t[j] = g_blk[i];
    }
    __real_free(g_blk);
    g_blk = t;
    g_blk_cap = cap;
    return 0;
}

static void blk_add(void *p, size_t size, uintptr_t where)
{
    if (2 * (g_blk_n + 1) > g_blk_cap && blk_grow()) abort();
    size_t j = hash_ptr((uintptr_t)p, g_blk_cap);
    while (g_blk[j].p) j = (j + 1) & (g_blk_cap - 1);
    g_blk[j] = (blk){p, size, where, ++g_seq};
    g_blk_n++;
    g_blk_bytes += size;
}

/* Removes p; 0 when it was not in the table. Backward-shift deletion keeps
 * every probe chain unbroken without tombstones. */
static int blk_del(void *p)
{
    if (!g_blk_cap) return 0;
    size_t mask = g_blk_cap - 1, j = hash_ptr((uintptr_t)p, g_blk_cap);
    while (g_blk[j].p && g_blk[j].p != p) j = (j + 1) & mask;
    if (!g_blk[j].p) return 0;
    g_blk_bytes -= g_blk[j].size;
    g_blk_n--;
    size_t hole = j;
    for (size_t k = (j + 1) & mask; g_blk[k].p; k = (k + 1) & mask) {
        size_t home = hash_ptr((uintptr_t)g_blk[k].p, g_blk_cap);
        /* k's entry may move into the hole when its home is not in (hole, k] */
        if (((k - home) & mask) >= ((k - hole) & mask)) {
            g_blk[hole] = g_blk[k];
            hole = k;
        }
    }
    g_blk[hole].p = NULL;
    return 1;
}

static site *site_get(uintptr_t addr)
{
    if (2 * (g_site_n + 1) > g_site_cap) {
        size_t cap = g_site_cap ? 2 * g_site_cap : 1 << 10;
        site *t = __real_calloc(cap, sizeof *t);
        if (!t) abort();
        for (size_t i = 0; i < g_site_cap; i++) {
            if (!g_site[i].addr) continue;
            size_t j = hash_ptr(g_site[i].addr, cap);
            while (t[j].addr) j = (j + 1) & (cap - 1);
            t[j] = g_site[i];
        }
        __real_free(g_site);
        g_site = t;
        g_site_cap = cap;
    }
    size_t j = hash_ptr(addr, g_site_cap);
    while (g_site[j].addr && g_site[j].addr != addr) j = (j + 1) & (g_site_cap - 1);
    if (!g_site[j].addr) {
        g_site[j].addr = addr;
        g_site_n++;
    }
    return &g_site[j];
}

/* Decides whether this allocation fails, and notes the site. lib: made
 * inside jansson or protobuf-c. Locked. */
static int should_fail_in(uintptr_t where, int lib)
{
    site *s = site_get(where);
    s->calls++;
    unsigned roles = atomic_load(&g_roles);
    if (!(roles & t_role) || (lib && !(roles & AF_LIBS))) return 0;
    long n = atomic_fetch_add(&g_count, 1) + 1, target = atomic_load(&g_target);
    if (!target || (n != target && !(atomic_load(&g_persistent) && n > target))) return 0;
    s->failed++;
    atomic_fetch_add(&g_fired, 1);
    g_last_site = where;
    return 1;
}

static int should_fail(uintptr_t where) { return should_fail_in(where, 0); }

/* ---- the allocators ----------------------------------------------------- */

static void *track(void *p, size_t size, uintptr_t where)
{
    if (p) blk_add(p, size, where);
    return p;
}

static void *do_malloc_in(size_t n, uintptr_t where, int lib)
{
    pthread_mutex_lock(&g_mu);
    void *p = should_fail_in(where, lib) ? NULL : track(__real_malloc(n), n, where);
    pthread_mutex_unlock(&g_mu);
    if (!p) errno = ENOMEM;
    return p;
}

static void *do_malloc(size_t n, uintptr_t where) { return do_malloc_in(n, where, 0); }

static void do_free(void *p)
{
    if (!p) return;
    pthread_mutex_lock(&g_mu);
    if (!blk_del(p)) atomic_fetch_add(&g_foreign, 1);
    __real_free(p);
    pthread_mutex_unlock(&g_mu);
}

#define CALLER ((uintptr_t)__builtin_return_address(0))

__attribute__((noinline)) void *__wrap_malloc(size_t n) { return do_malloc(n, CALLER); }

__attribute__((noinline)) void *__wrap_calloc(size_t k, size_t n)
{
    uintptr_t where = CALLER;
    pthread_mutex_lock(&g_mu);
    void *p = should_fail(where) ? NULL : track(__real_calloc(k, n), k * n, where);
    pthread_mutex_unlock(&g_mu);
    if (!p) errno = ENOMEM;
    return p;
}

__attribute__((noinline)) void *__wrap_realloc(void *old, size_t n)
{
    uintptr_t where = CALLER;
    if (!old) return do_malloc(n, where);
    pthread_mutex_lock(&g_mu);
    void *p = NULL;
    if (n == 0 || !should_fail(where)) {
        /* Keep the old entry until the real realloc succeeded: on failure
         * the old block is still the caller's. */
        p = __real_realloc(old, n);
        if (p || n == 0) {
            if (!blk_del(old)) atomic_fetch_add(&g_foreign, 1);
            track(p, n, where);
        }
    }
    pthread_mutex_unlock(&g_mu);
    if (!p && n) errno = ENOMEM;
    return p;
}

void __wrap_free(void *p) { do_free(p); }

__attribute__((noinline)) char *__wrap_strdup(const char *s)
{
    uintptr_t where = CALLER;
    pthread_mutex_lock(&g_mu);
    char *p = should_fail(where) ? NULL : track(__real_strdup(s), strlen(s) + 1, where);
    pthread_mutex_unlock(&g_mu);
    if (!p) errno = ENOMEM;
    return p;
}

__attribute__((noinline)) char *__wrap_strndup(const char *s, size_t n)
{
    uintptr_t where = CALLER;
    pthread_mutex_lock(&g_mu);
    char *p = should_fail(where) ? NULL : track(__real_strndup(s, n), strnlen(s, n) + 1, where);
    pthread_mutex_unlock(&g_mu);
    if (!p) errno = ENOMEM;
    return p;
}

__attribute__((noinline)) int __wrap_posix_memalign(void **out, size_t align, size_t n)
{
    uintptr_t where = CALLER;
    pthread_mutex_lock(&g_mu);
    int rc = ENOMEM;
    if (!should_fail(where)) {
        rc = __real_posix_memalign(out, align, n);
        if (!rc) track(*out, n, where);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

__attribute__((noinline)) void *__wrap_aligned_alloc(size_t align, size_t n)
{
    uintptr_t where = CALLER;
    pthread_mutex_lock(&g_mu);
    void *p = should_fail(where) ? NULL : track(__real_aligned_alloc(align, n), n, where);
    pthread_mutex_unlock(&g_mu);
    if (!p) errno = ENOMEM;
    return p;
}

/* ---- library hand-offs -------------------------------------------------- */

/* jansson's allocations: the site is inside libjansson. */
__attribute__((noinline)) static void *json_alloc(size_t n) { return do_malloc_in(n, CALLER, 1); }
static void json_release(void *p) { do_free(p); }

__attribute__((noinline)) static void *pb_alloc(void *data, size_t n)
{
    (void)data;
    return do_malloc_in(n, CALLER, 1);
}
static void pb_release(void *data, void *p)
{
    (void)data;
    do_free(p);
}
static ProtobufCAllocator g_pb = {pb_alloc, pb_release, NULL};

ProtobufCMessage *__wrap_protobuf_c_message_unpack(const ProtobufCMessageDescriptor *d,
                                                   ProtobufCAllocator *a, size_t len,
                                                   const uint8_t *data)
{
    return __real_protobuf_c_message_unpack(d, a ? a : &g_pb, len, data);
}

void __wrap_protobuf_c_message_free_unpacked(ProtobufCMessage *m, ProtobufCAllocator *a)
{
    __real_protobuf_c_message_free_unpacked(m, a ? a : &g_pb);
}

void __wrap_log_thread_name(const char *prefix, int index)
{
    static const struct {
        const char *prefix;
        unsigned role;
    } roles[] = {{"ikbo-sweep", AF_SWEEP},
                 {"ikbo-inst", AF_INSTANCE},
                 {"ikbo-done", AF_COMPLETE},
                 {"ikbo-reaper", AF_REAPER}};
    t_role = AF_OTHER;
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        if (!strcmp(prefix, roles[i].prefix)) t_role = roles[i].role;
    __real_log_thread_name(prefix, index);
}

/* ---- control ------------------------------------------------------------ */

void af_init(void)
{
    json_set_alloc_funcs(json_alloc, json_release);
    t_role = AF_MAIN;
}

void af_set_role(unsigned role) { t_role = role; }

void af_arm(long n, int persistent, unsigned roles)
{
    pthread_mutex_lock(&g_mu);
    atomic_store(&g_count, 0);
    atomic_store(&g_fired, 0);
    g_last_site = 0;
    atomic_store(&g_target, n);
    atomic_store(&g_persistent, persistent);
    atomic_store(&g_roles, roles);
    pthread_mutex_unlock(&g_mu);
}

long af_disarm(void)
{
    pthread_mutex_lock(&g_mu);
    atomic_store(&g_target, 0);
    atomic_store(&g_roles, 0);
    long fired = atomic_load(&g_fired);
    pthread_mutex_unlock(&g_mu);
    return fired;
}

long af_count(void) { return atomic_load(&g_count); }

long af_live(void)
{
    pthread_mutex_lock(&g_mu);
    long n = (long)g_blk_n;
    pthread_mutex_unlock(&g_mu);
    return n;
}

size_t af_live_bytes(void)
{
    pthread_mutex_lock(&g_mu);
    size_t n = g_blk_bytes;
    pthread_mutex_unlock(&g_mu);
    return n;
}

long af_foreign_frees(void) { return atomic_load(&g_foreign); }

void *af_sys_malloc(size_t n) { return __real_malloc(n); }
void af_sys_free(void *p) { __real_free(p); }

/* "file:line" of addr - 1 (the call instruction) in the executable; "" on
 * failure. Offsets are relative to the load base (a PIE executable). */
static int exe_path(char *buf, size_t n)
{
    ssize_t k = readlink("/proc/self/exe", buf, n - 1);
    if (k <= 0) return -1;
    buf[k] = 0;
    return 0;
}

static void af_dump_site(FILE *f, uintptr_t addr, const char *what)
{
    Dl_info di;
    if (dladdr((void *)addr, &di) && di.dli_fname)
        fprintf(f, "  %s at %s+0x%lx\n", what, di.dli_fname,
                (unsigned long)(addr - (uintptr_t)di.dli_fbase));
    else
        fprintf(f, "  %s at 0x%lx\n", what, (unsigned long)addr);
}

const char *af_last_failure(char *buf, size_t n)
{
    pthread_mutex_lock(&g_mu);
    uintptr_t a = g_last_site;
    pthread_mutex_unlock(&g_mu);
    Dl_info di;
    if (!a)
        snprintf(buf, n, "none");
    else if (dladdr((void *)a, &di) && di.dli_fname)
        snprintf(buf, n, "%s+0x%lx", di.dli_fname, (unsigned long)(a - 1 - (uintptr_t)di.dli_fbase));
    else
        snprintf(buf, n, "0x%lx", (unsigned long)a);
    return buf;
}

int af_last_failure_in_jansson(void)
{
    char b[PATH_MAX];
    return strstr(af_last_failure(b, sizeof b), "libjansson") != NULL;
}

unsigned long af_mark(void)
{
    pthread_mutex_lock(&g_mu);
    unsigned long s = g_seq;
    pthread_mutex_unlock(&g_mu);
    return s;
}

void af_dump_live(FILE *f, unsigned long since, int max)
{
    pthread_mutex_lock(&g_mu);
    int k = 0;
    for (size_t i = 0; i < g_blk_cap && k < max; i++) {
        if (!g_blk[i].p || g_blk[i].seq <= since) continue;
        char what[64];
        snprintf(what, sizeof what, "%zu bytes", g_blk[i].size);
        af_dump_site(f, g_blk[i].site, what);
        k++;
    }
    pthread_mutex_unlock(&g_mu);
}

int af_write_sites(FILE *f)
{
    char exe[PATH_MAX];
    Dl_info self;
    if (exe_path(exe, sizeof exe) || !dladdr((void *)af_init, &self)) return -1;
    pthread_mutex_lock(&g_mu);
    size_t n = g_site_n;
    site *copy = __real_malloc((n + 1) * sizeof *copy);
    size_t k = 0;
    for (size_t i = 0; copy && i < g_site_cap; i++)
        if (g_site[i].addr) copy[k++] = g_site[i];
    pthread_mutex_unlock(&g_mu);
    if (!copy) return -1;
    /* addr2line reads addresses from stdin, one line out per address. */
    char tmp[] = "/tmp/af_sitesXXXXXX";
    int fd = mkstemp(tmp);
    if (fd < 0) {
        __real_free(copy);
        return -1;
    }
    FILE *in = fdopen(fd, "w");
    unsigned long lib_calls[2] = {0, 0}, lib_failed[2] = {0, 0};
    size_t n_exe = 0;
    for (size_t i = 0; i < k; i++) {
        Dl_info di;
        if (dladdr((void *)copy[i].addr, &di) && di.dli_fbase == self.dli_fbase) {
            fprintf(in, "0x%lx\n", (unsigned long)(copy[i].addr - 1 - (uintptr_t)di.dli_fbase));
            copy[n_exe++] = copy[i];
        } else {
            int lib = di.dli_fname && strstr(di.dli_fname, "protobuf") ? 1 : 0;
            lib_calls[lib] += copy[i].calls;
            lib_failed[lib] += copy[i].failed;
        }
    }
    fclose(in);
    char cmd[PATH_MAX + 128];
    snprintf(cmd, sizeof cmd, "addr2line -e '%s' < %s", exe, tmp);
    FILE *out = popen(cmd, "r");
    int rc = out ? 0 : -1;
    for (size_t i = 0; out && i < n_exe; i++) {
        char line[PATH_MAX];
        if (!fgets(line, sizeof line, out)) {
            rc = -1;
            break;
        }
        line[strcspn(line, " \n")] = 0; /* drop " (discriminator N)" */
        fprintf(f, "%s %lu %lu\n", line, copy[i].calls, copy[i].failed);
    }
    if (out && pclose(out) != 0) rc = -1;
    unlink(tmp);
    fprintf(f, "[libjansson] %lu %lu\n[libprotobuf-c] %lu %lu\n", lib_calls[0], lib_failed[0],
            lib_calls[1], lib_failed[1]);
    __real_free(copy);
    return rc;
}
