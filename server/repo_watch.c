/* repo_watch.c - model repository on disk: listings, directory signatures,
 * per-model config, memory estimates (see repo_watch.h). */
#include "repo_watch.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "../kernels/backend.h"

/* Kept free on the host after a load, so a load never takes the last pages
 * live traffic needs. */
#define HOST_RESERVE_BYTES (64ull << 20)
#define DEVICE_RESERVE_BYTES (256ull << 20)
#define MODEL_CONFIG_MAX (1u << 20)
#define ST_HEADER_MAX (100u << 20)

static int join(char *out, size_t n, const char *a, const char *b)
{
    int k = snprintf(out, n, "%s/%s", a, b);
    return k < 0 || (size_t)k >= n ? -1 : 0;
}

/* A canonical positive version number: digits, no leading zero, fits. */
static int64_t parse_version(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 18 || s[0] == '0') return 0;
    for (size_t i = 0; i < n; i++)
        if (!isdigit((unsigned char)s[i])) return 0;
    return strtoll(s, NULL, 10);
}

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}

static int64_t change_ms(const struct stat *st)
{
    /* ctime moves on every write, rename and utimes (cp -p, rsync -t set
     * an old mtime but cannot set ctime), so it is when the entry was last
     * touched. */
    int64_t c = (int64_t)st->st_ctim.tv_sec * 1000 + st->st_ctim.tv_nsec / 1000000;
    int64_t m = (int64_t)st->st_mtim.tv_sec * 1000 + st->st_mtim.tv_nsec / 1000000;
    return c > m ? c : m;
}

/* Order-independent hash of a directory's entries (readdir order is not
 * promised to be stable), and the newest change time of the directory and
 * its entries (wall clock, ms). */
static uint64_t dir_signature(const char *dir, int *has_model_json, int64_t *last_change)
{
    *has_model_json = 0;
    *last_change = 0;
    struct stat dst;
    if (stat(dir, &dst) == 0) *last_change = change_ms(&dst);
    DIR *d = opendir(dir);
    if (!d) return 0;
    uint64_t sum = 0, count = 0;
    struct dirent *de;
    char path[PATH_MAX];
    while ((de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        if (join(path, sizeof path, dir, de->d_name)) continue;
        struct stat st;
        uint64_t h = fnv(1469598103934665603ull, de->d_name, strlen(de->d_name) + 1);
        if (stat(path, &st) == 0) {
            int64_t f[5] = {(int64_t)st.st_mode, (int64_t)st.st_size, (int64_t)st.st_mtim.tv_sec,
                            (int64_t)st.st_mtim.tv_nsec, (int64_t)st.st_ino};
            h = fnv(h, f, sizeof f);
            if (!strcmp(de->d_name, "model.json") && S_ISREG(st.st_mode)) *has_model_json = 1;
            if (change_ms(&st) > *last_change) *last_change = change_ms(&st);
        }
        sum += h * 0x9e3779b97f4a7c15ull + (h >> 29);
        count++;
    }
    closedir(d);
    return fnv(sum, &count, sizeof count) | 1; /* never 0: 0 means "not seen" */
}

static int cmp_version_desc(const void *a, const void *b)
{
    int64_t x = ((const repo_version *)a)->version, y = ((const repo_version *)b)->version;
    return x < y ? 1 : x > y ? -1 : 0;
}

int repo_list_versions(const char *model_dir, repo_version **out, ikbo_err *err)
{
    *out = NULL;
    DIR *d = opendir(model_dir);
    if (!d) {
        bk_seterr(err, "%.400s: %s", model_dir, strerror(errno));
        return -1;
    }
    repo_version *v = NULL;
    int n = 0, cap = 0;
    struct dirent *de;
    char path[PATH_MAX];
    while ((de = readdir(d)) != NULL) {
        int64_t ver = parse_version(de->d_name);
        if (ver <= 0 || join(path, sizeof path, model_dir, de->d_name) || !is_dir(path)) continue;
        int has_json;
        int64_t changed;
        uint64_t sig = dir_signature(path, &has_json, &changed);
        if (!has_json) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            repo_version *g = realloc(v, (size_t)cap * sizeof *g);
            if (!g) {
                free(v);
                closedir(d);
                bk_seterr(err, "%.400s: out of memory", model_dir);
                return -1;
            }
            v = g;
        }
        v[n].version = ver;
        v[n].sig = sig;
        v[n].changed_ms = changed;
        n++;
    }
    closedir(d);
    if (n) qsort(v, (size_t)n, sizeof *v, cmp_version_desc);
    *out = v;
    return n;
}

/* Any all-digit subdirectory (complete or not): what makes a directory a
 * model directory. */
static int has_version_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *de;
    char path[PATH_MAX];
    int found = 0;
    while (!found && (de = readdir(d)) != NULL)
        found = parse_version(de->d_name) > 0 && !join(path, sizeof path, dir, de->d_name) &&
                is_dir(path);
    closedir(d);
    return found;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void repo_free_names(char **names, int n)
{
    for (int i = 0; names && i < n; i++) free(names[i]);
    free(names);
}

int repo_list_models(const char *repo, char ***names, ikbo_err *err)
{
    *names = NULL;
    DIR *d = opendir(repo);
    if (!d) {
        bk_seterr(err, "model repository %.400s: %s", repo, strerror(errno));
        return -1;
    }
    char **v = NULL;
    int n = 0, cap = 0;
    struct dirent *de;
    char path[PATH_MAX];
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.' || join(path, sizeof path, repo, de->d_name)) continue;
        if (!is_dir(path) || !has_version_dir(path)) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            char **g = realloc(v, (size_t)cap * sizeof *g);
            if (!g) goto oom;
            v = g;
        }
        if (!(v[n] = strdup(de->d_name))) goto oom;
        n++;
    }
    closedir(d);
    if (n) qsort(v, (size_t)n, sizeof *v, cmp_str);
    *names = v;
    return n;
oom:
    closedir(d);
    repo_free_names(v, n);
    bk_seterr(err, "model repository %.400s: out of memory", repo);
    return -1;
}

/* ---- serving overrides ------------------------------------------------- */

int repo_read_model_config(const char *model_dir, ikbo_serving *out, ikbo_err *err)
{
    serving_unset(out);
    char path[PATH_MAX];
    if (join(path, sizeof path, model_dir, "config.json")) {
        bk_seterr(err, "%.400s/config.json: path too long", model_dir);
        return -1;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        if (errno == ENOENT) return 0;
        bk_seterr(err, "%.400s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > MODEL_CONFIG_MAX) {
        bk_seterr(err, "%.400s: not a regular file of at most %u bytes", path, MODEL_CONFIG_MAX);
        close(fd);
        return -1;
    }
    json_error_t je;
    json_t *root = json_loadfd(fd, JSON_REJECT_DUPLICATES, &je);
    close(fd);
    if (!root) {
        bk_seterr(err, "%.400s: invalid JSON at line %d column %d: %.200s", path, je.line,
                  je.column, je.text);
        return -1;
    }
    int rc = -1;
    const char *key;
    json_t *v;
    if (!json_is_object(root)) {
        bk_seterr(err, "%.400s: expected a JSON object", path);
        goto done;
    }
    json_object_foreach(root, key, v)
    {
        if (strcmp(key, "serving") != 0) {
            bk_seterr(err, "%.400s: %.80s: unknown key (known: serving)", path, key);
            goto done;
        }
    }
    json_t *s = json_object_get(root, "serving");
    ikbo_err e = {{0}};
    if (s && serving_apply_object(out, s, "serving", SERVING_MODEL, &e) != 0) {
        bk_seterr(err, "%.400s: %s", path, e.msg);
        goto done;
    }
    rc = 0;
done:
    json_decref(root);
    if (rc) serving_unset(out);
    return rc;
}

/* ---- memory -------------------------------------------------------------- */

static int dtype_size(const char *t)
{
    if (!strcmp(t, "F32") || !strcmp(t, "I32") || !strcmp(t, "U32")) return 4;
    if (!strcmp(t, "F16") || !strcmp(t, "BF16") || !strcmp(t, "I16") || !strcmp(t, "U16")) return 2;
    if (!strcmp(t, "F64") || !strcmp(t, "I64") || !strcmp(t, "U64")) return 8;
    if (!strcmp(t, "I8") || !strcmp(t, "U8") || !strcmp(t, "BOOL")) return 1;
    return 0;
}

/* fp32 bytes of every tensor and of the largest one, from the header; -1
 * when the header is unreadable or claims more data than the file has. */
static int header_fp32_bytes(int fd, uint64_t file_size, uint64_t *total, uint64_t *largest)
{
    unsigned char b[8];
    if (pread(fd, b, 8, 0) != 8) return -1;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | b[i];
    if (n == 0 || n > ST_HEADER_MAX || 8 + n > file_size) return -1;
    char *hdr = malloc((size_t)n);
    if (!hdr) return -1;
    ssize_t k = pread(fd, hdr, (size_t)n, 8);
    json_t *root = k == (ssize_t)n ? json_loadb(hdr, (size_t)n, 0, NULL) : NULL;
    free(hdr);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return -1;
    }
    uint64_t sum = 0, big = 0, data = 0;
    int ok = 1;
    const char *key;
    json_t *t;
    json_object_foreach(root, key, t)
    {
        if (!strcmp(key, "__metadata__")) continue;
        json_t *shape = json_object_get(t, "shape");
        const char *dt = json_string_value(json_object_get(t, "dtype"));
        int ds = dt ? dtype_size(dt) : 0;
        if (!json_is_array(shape) || !ds) {
            ok = 0;
            break;
        }
        uint64_t el = 1;
        size_t i;
        json_t *dim;
        json_array_foreach(shape, i, dim)
        {
            json_int_t x = json_integer_value(dim);
            if (!json_is_integer(dim) || x < 0 || (x && el > UINT64_MAX / 16 / (uint64_t)x)) {
                ok = 0;
                break;
            }
            el *= (uint64_t)x;
        }
        if (!ok || el > UINT64_MAX / 16 - sum) {
            ok = 0;
            break;
        }
        sum += 4 * el;
        data += (uint64_t)ds * el;
        if (4 * el > big) big = 4 * el;
    }
    json_decref(root);
    if (!ok || data > file_size - 8 - n) return -1;
    *total = sum;
    *largest = big;
    return 0;
}

int repo_estimate_memory(const char *version_dir, const char *device, uint64_t *host_bytes,
                         uint64_t *device_bytes)
{
    char path[PATH_MAX];
    if (join(path, sizeof path, version_dir, "weights.safetensors")) return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return -1;
    }
    uint64_t size = (uint64_t)st.st_size, total, largest;
    if (header_fp32_bytes(fd, size, &total, &largest) != 0) {
        total = size;
        largest = 0;
    }
    close(fd);
    int ordinal = -1;
    int cuda = bk_parse_device(device, &ordinal) == 0 && ordinal >= 0;
    /* The loader stages every weight as fp32 on the host, then the backend
     * makes its copy one weight at a time and the staging copy of that weight
     * is freed: the host peak is the staging plus one tensor (cpu), and the
     * device holds at most the fp32 weights (cuda may keep them narrower). */
    *host_bytes = total + largest;
    *device_bytes = cuda ? total : 0;
    return 0;
}

static int read_u64(const char *path, uint64_t *out)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    unsigned long long v;
    int ok = fscanf(f, "%llu", &v) == 1;
    fclose(f);
    if (!ok) return -1; /* also cgroup v2's "max" */
    *out = v;
    return 0;
}

/* A "key value" line of a cgroup memory.stat. */
static uint64_t stat_field(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256], k[128];
    unsigned long long v, found = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "%127s %llu", k, &v) == 2 && !strcmp(k, key)) {
            found = v;
            break;
        }
    fclose(f);
    return found;
}

/* Room left under the container's memory limit (cgroup v2, else v1), not
 * counting reclaimable file cache; UINT64_MAX when there is no limit. */
static uint64_t cgroup_available(void)
{
    uint64_t max, cur, cache;
    if (read_u64("/sys/fs/cgroup/memory.max", &max) == 0 &&
        read_u64("/sys/fs/cgroup/memory.current", &cur) == 0) {
        cache = stat_field("/sys/fs/cgroup/memory.stat", "inactive_file");
    } else if (read_u64("/sys/fs/cgroup/memory/memory.limit_in_bytes", &max) == 0 &&
               read_u64("/sys/fs/cgroup/memory/memory.usage_in_bytes", &cur) == 0) {
        cache = stat_field("/sys/fs/cgroup/memory/memory.stat", "total_inactive_file");
    } else {
        return UINT64_MAX;
    }
    if (max >= (1ull << 60)) return UINT64_MAX; /* v1's "unlimited" */
    uint64_t used = cur > cache ? cur - cache : 0;
    return max > used ? max - used : 0;
}

/* What a load may use on the host: MemAvailable (/proc/meminfo), capped by
 * the cgroup limit; 0 when nothing says. */
static uint64_t host_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    unsigned long long kb = 0;
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
        fclose(f);
    }
    uint64_t avail = (uint64_t)kb * 1024, cg = cgroup_available();
    if (cg != UINT64_MAX && (!avail || cg < avail)) avail = cg ? cg : 1;
    return avail;
}

#ifdef IKBO_CUDA
/* The two CUDA runtime calls used here; declared rather than included so
 * server objects need no CUDA include path (cudaError_t is an int enum). */
extern int cudaSetDevice(int device);
extern int cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);

static int device_available(const char *device, uint64_t *free_bytes)
{
    size_t fr = 0, tot = 0;
    if (cudaSetDevice(atoi(device + 5)) != 0 || cudaMemGetInfo(&fr, &tot) != 0) return -1;
    *free_bytes = fr;
    return 0;
}
#else
static int device_available(const char *device, uint64_t *free_bytes)
{
    (void)device;
    (void)free_bytes;
    return -1;
}
#endif

static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

int repo_memory_check(const char *version_dir, const char *device, ikbo_err *err)
{
    uint64_t host, dev;
    if (repo_estimate_memory(version_dir, device, &host, &dev) != 0) return 0;
    uint64_t avail = host_available();
    if (avail && host + HOST_RESERVE_BYTES > avail) {
        bk_seterr(err,
                  "%.300s: not loaded: needs about %.0f MiB of host memory (fp32 weights), "
                  "%.0f MiB available (MemAvailable or the cgroup limit, less a %.0f MiB reserve)",
                  version_dir, mib(host), mib(avail > HOST_RESERVE_BYTES ? avail - HOST_RESERVE_BYTES : 0),
                  mib(HOST_RESERVE_BYTES));
        return -1;
    }
    uint64_t dfree;
    if (dev && device_available(device, &dfree) == 0 && dev + DEVICE_RESERVE_BYTES > dfree) {
        bk_seterr(err,
                  "%.300s: not loaded: needs about %.0f MiB on %s (fp32 weights), %.0f MiB free "
                  "(less a %.0f MiB reserve)",
                  version_dir, mib(dev), device,
                  mib(dfree > DEVICE_RESERVE_BYTES ? dfree - DEVICE_RESERVE_BYTES : 0),
                  mib(DEVICE_RESERVE_BYTES));
        return -1;
    }
    return 0;
}
