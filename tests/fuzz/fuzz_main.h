/* fuzz_main.h - the standalone main of a fuzz target (built without
 * libFuzzer, e.g. by gcc in `make test`): replays a corpus, then runs a
 * seeded, deterministic mutation loop over it.
 *
 * Why this exists: every target in tests/fuzz is a LLVMFuzzerTestOneInput;
 * with clang's libFuzzer it is driven by libFuzzer (-DLIBFUZZER), and
 * everywhere else by this driver, so the same checks run in `make test` on
 * any machine, with results that do not depend on its speed.
 *
 *     fuzz_X [-n ITERS] [-s SEED] PATH...
 *
 * PATH is a corpus file or directory (files read in name order). Every file
 * is run as-is, then ITERS inputs (default: the target's) are made from
 * random corpus files by 1-4 fz_mutate steps (half of them one step), sometimes with a span of
 * another file spliced in, or taken from the target's generator. Each input
 * is handed over as an exact-size heap copy, so a read past its end is seen
 * by ASan/valgrind. Exit status 0; a target's failed check aborts.
 *
 * Include once, after fuzz_mutate.h, in a target's `#ifndef LIBFUZZER`
 * part; call fz_main from main. Not thread-safe (one loop per process).
 */
#ifndef IKBO_TESTS_FUZZ_MAIN_H
#define IKBO_TESTS_FUZZ_MAIN_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_mutate.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct fz_target {
    const char *name;
    const fz_dict *dict;
    long default_iters;
    /* Optional: writes a fresh input into *out (e.g. a random valid
     * message); used for about one mutated input in four. */
    void (*generate)(fz_buf *out);
    /* Optional: prints the target's outcome counts after the loop. */
    void (*report)(void);
} fz_target;

typedef struct fz_corpus {
    fz_buf *f;
    size_t n, cap;
} fz_corpus;

static void fz_run_copy(const uint8_t *p, size_t n)
{
    uint8_t *c = malloc(n ? n : 1);
    if (!c)
        abort();
    if (n)
        memcpy(c, p, n);
    LLVMFuzzerTestOneInput(c, n);
    free(c);
}

static int fz_read_file(const char *path, fz_corpus *c)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 64;
        c->f = realloc(c->f, c->cap * sizeof *c->f);
        if (!c->f)
            abort();
    }
    fz_buf *b = &c->f[c->n];
    memset(b, 0, sizeof *b);
    uint8_t tmp[65536];
    size_t k;
    while ((k = fread(tmp, 1, sizeof tmp, f)) > 0)
        fz_splice(b, b->n, 0, tmp, k);
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        fprintf(stderr, "%s: read error\n", path);
        free(b->p);
        return -1;
    }
    c->n++;
    return 0;
}

static int fz_cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A file, or every regular file of a directory in name order. */
static int fz_load_path(const char *path, fz_corpus *c)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        perror(path);
        return -1;
    }
    if (!S_ISDIR(st.st_mode))
        return fz_read_file(path, c);
    DIR *d = opendir(path);
    if (!d) {
        perror(path);
        return -1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            names = realloc(names, cap * sizeof *names);
            if (!names)
                abort();
        }
        size_t len = strlen(path) + strlen(e->d_name) + 2;
        names[n] = malloc(len);
        if (!names[n])
            abort();
        snprintf(names[n++], len, "%s/%s", path, e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, fz_cmp_names);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        if (rc == 0 && stat(names[i], &st) == 0 && S_ISREG(st.st_mode))
            rc = fz_read_file(names[i], c);
        free(names[i]);
    }
    free(names);
    return rc;
}

/* One mutated input from the corpus (or the generator) into *b. */
static void fz_make_input(const fz_target *t, const fz_corpus *c, fz_buf *b)
{
    b->n = 0;
    if (t->generate && (c->n == 0 || fz_rndn(4) == 0)) {
        t->generate(b);
    } else if (c->n) {
        const fz_buf *src = &c->f[fz_rndn(c->n)];
        fz_set(b, src->p, src->n);
    }
    int k = fz_rndn(2) ? 1 : 2 + (int)fz_rndn(3); /* one edit keeps most text parseable */
    for (int r = 0; r < k; r++) {
        if (c->n > 1 && fz_rndn(8) == 0) { /* splice in a span of another file */
            const fz_buf *o = &c->f[fz_rndn(c->n)];
            size_t at = fz_rndn(o->n + 1), len = fz_rndn(o->n - at + 1);
            fz_splice(b, fz_rndn(b->n + 1), fz_rndn(16), o->p + at, len);
        } else {
            fz_mutate(b, 0, b->n, t->dict);
        }
    }
}

__attribute__((unused)) static int fz_main(int argc, char **argv, const fz_target *t)
{
    long iters = t->default_iters;
    uint64_t seed = 1;
    fz_corpus c = {0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-n") && i + 1 < argc)
            iters = atol(argv[++i]);
        else if (!strcmp(argv[i], "-s") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 0);
        else if (fz_load_path(argv[i], &c) != 0)
            return 2;
    }
    fz_seed(seed);
    for (size_t i = 0; i < c.n; i++)
        fz_run_copy(c.f[i].p, c.f[i].n);
    fz_buf b = {0};
    for (long it = 0; it < iters; it++) {
        b.n = 0;
        fz_make_input(t, &c, &b);
        fz_run_copy(b.p, b.n);
    }
    printf("%s: %zu corpus inputs replayed, %ld mutated inputs (seed %llu)", t->name, c.n,
           iters, (unsigned long long)seed);
    if (t->report)
        t->report();
    printf("\n");
    for (size_t i = 0; i < c.n; i++)
        free(c.f[i].p);
    free(c.f);
    free(b.p);
    return 0;
}

#endif
