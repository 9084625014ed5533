/* fuzz_mutate.h - the deterministic mutator shared by the standalone builds
 * of the fuzz targets (tests/fuzz/fuzz_*.c).
 *
 * Why this exists: `make test` must exercise every fuzz target even where
 * clang's libFuzzer runtime is missing, so each target also builds with gcc
 * as a corpus replayer plus a seeded mutation loop. This header is that
 * loop's mutator, written once: a seeded xorshift generator, a growable byte
 * buffer, and byte-level mutations (bit flips, edge bytes, span deletes and
 * duplicates, dictionary inserts, quoted-token and digit-run replacement).
 * Each target passes its own dictionary (fz_dict), text or binary.
 *
 * Header-only (static functions), one include per fuzz binary. State: one
 * generator per binary (fz_rng); not thread-safe, nothing here is shared.
 */
#ifndef IKBO_TESTS_FUZZ_MUTATE_H
#define IKBO_TESTS_FUZZ_MUTATE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t fz_rng = 1;

static uint64_t fz_rnd(void)
{
    uint64_t x = fz_rng; /* xorshift64* */
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    fz_rng = x;
    return x * 2685821657736338717ull;
}

static void fz_seed(uint64_t s) { fz_rng = s ? s : 1; }

static size_t fz_rndn(size_t n) { return n ? (size_t)(fz_rnd() % n) : 0; }

/* ---- a growable byte buffer ---- */

typedef struct fz_buf {
    uint8_t *p;
    size_t n, cap;
} fz_buf;

static void fz_reserve(fz_buf *b, size_t n)
{
    if (n + 1 <= b->cap)
        return;
    b->cap = (n + 1) * 2;
    b->p = realloc(b->p, b->cap);
    if (!b->p)
        abort();
}

static void fz_set(fz_buf *b, const void *p, size_t n)
{
    fz_reserve(b, n);
    if (n)
        memcpy(b->p, p, n);
    b->n = n;
}

/* Replaces [at, at+del) with ins[0..k). */
static void fz_splice(fz_buf *b, size_t at, size_t del, const void *ins, size_t k)
{
    if (at > b->n)
        at = b->n;
    if (del > b->n - at)
        del = b->n - at;
    size_t n = b->n - del + k;
    fz_reserve(b, n);
    memmove(b->p + at + k, b->p + at + del, b->n - at - del);
    if (k)
        memcpy(b->p + at, ins, k);
    b->n = n;
}

/* ---- dictionaries ---- */

typedef struct fz_token {
    const char *s;
    size_t n; /* binary tokens may hold NUL bytes */
} fz_token;

/* FZ_TOK("...") for a string literal, NUL bytes included. */
#define FZ_TOK(lit) {(lit), sizeof(lit) - 1}

typedef struct fz_dict {
    const fz_token *t;
    size_t n;
} fz_dict;

/* A quoted run from the first '"' at or after i to the next '"' (usually a
 * JSON string; sometimes the text between two strings - also fine). */
static int fz_quoted_at(const fz_buf *b, size_t i, size_t *s, size_t *e)
{
    size_t a = i;
    while (a < b->n && b->p[a] != '"')
        a++;
    if (a >= b->n)
        return -1;
    size_t z = a + 1;
    while (z < b->n && b->p[z] != '"')
        z++;
    if (z >= b->n)
        return -1;
    *s = a;
    *e = z + 1;
    return 0;
}

/* One random mutation inside [lo, hi) (an empty range inserts at lo). */
static void fz_mutate(fz_buf *b, size_t lo, size_t hi, const fz_dict *d)
{
    if (hi > b->n)
        hi = b->n;
    if (lo > hi)
        lo = hi;
    if (lo == hi) {
        if (d->n) {
            const fz_token *t = &d->t[fz_rndn(d->n)];
            fz_splice(b, lo, 0, t->s, t->n);
        }
        return;
    }
    size_t i = lo + fz_rndn(hi - lo);
    switch (fz_rndn(8)) {
    case 0:
        b->p[i] ^= (uint8_t)(1u << fz_rndn(8));
        break;
    case 1: {
        static const uint8_t v[] = {0, 0xff, 0x7f, 0x80, 0x01, '"', '{', '}', '[', ']',
                                    '9', '-', '.', '\\', ' ', ',', ':'};
        b->p[i] = v[fz_rndn(sizeof v)];
        break;
    }
    case 2: /* delete a span */
        fz_splice(b, i, 1 + fz_rndn(16), NULL, 0);
        break;
    case 3: { /* duplicate a span */
        size_t k = 1 + fz_rndn(24);
        if (k > b->n - i)
            k = b->n - i;
        uint8_t tmp[32];
        memcpy(tmp, b->p + i, k);
        fz_splice(b, lo + fz_rndn(hi - lo), 0, tmp, k);
        break;
    }
    case 4: /* insert a dictionary token */
        if (d->n) {
            const fz_token *t = &d->t[fz_rndn(d->n)];
            fz_splice(b, i, 0, t->s, t->n);
        }
        break;
    case 5: { /* replace a quoted token with a dictionary token */
        size_t s, e;
        if (d->n && fz_quoted_at(b, i, &s, &e) == 0 && e <= hi) {
            const fz_token *t = &d->t[fz_rndn(d->n)];
            fz_splice(b, s, e - s, t->s, t->n);
        }
        break;
    }
    case 6: { /* replace a digit run with an edge number */
        size_t a = i;
        while (a < hi && !(b->p[a] >= '0' && b->p[a] <= '9'))
            a++;
        if (a >= hi)
            break;
        size_t z = a;
        while (z < hi && b->p[z] >= '0' && b->p[z] <= '9')
            z++;
        static const char *const nums[] = {"0", "1", "2", "3", "7", "8", "16", "65535",
                                           "2147483647", "2147483648", "4294967296",
                                           "18446744073709551615", "9223372036854775808",
                                           "1.0", "-3", "1e400", "-0"};
        const char *t = nums[fz_rndn(sizeof nums / sizeof nums[0])];
        fz_splice(b, a, z - a, t, strlen(t));
        break;
    }
    default: /* cut the rest of the range */
        fz_splice(b, i, hi - i, NULL, 0);
        break;
    }
}

#endif
