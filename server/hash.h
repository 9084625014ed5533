/* hash.h - the 64-bit content hash user dedup uses.
 *
 * Why this exists: users are deduplicated per request and again across the
 * requests of a batch, both by rowset.c; the hash is kept apart from the
 * table so that it can be read (and changed) on its own. Not cryptographic:
 * a hash match is always followed by a full compare. Header-only, no state.
 *
 * History actions: absent actions mean all zero, so a user's actions are
 * hashed only when one is nonzero, and then as one block of int32s
 * (hash_actions), which keeps equal users (absent vs explicit zeros) on one
 * hash without a mix per event.
 */
#ifndef IKBO_SERVER_HASH_H
#define IKBO_SERVER_HASH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint64_t hash_mix64(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 31);
}

/* Folds n bytes into h; the length goes into the last word so that inputs
 * differing only in trailing zero bytes hash apart. Long inputs (a user's
 * 1024 history ids) run four independent lanes over 32-byte blocks, folded
 * together at the end: one lane's mix is a chain of dependent multiplies,
 * four lanes keep the multiplier busy (with hash_actions, the plan of a
 * 16 x 70 bench request went from 198 to 79 us: build/host_path). */
static inline uint64_t hash_bytes(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    size_t i = 0;
    if (n >= 64) {
        uint64_t l0 = h, l1 = h ^ 0x243f6a8885a308d3ull, l2 = h ^ 0x13198a2e03707344ull,
                 l3 = h ^ 0xa4093822299f31d0ull;
        for (; i + 32 <= n; i += 32) {
            uint64_t w[4];
            memcpy(w, b + i, 32);
            l0 = hash_mix64(l0, w[0]);
            l1 = hash_mix64(l1, w[1]);
            l2 = hash_mix64(l2, w[2]);
            l3 = hash_mix64(l3, w[3]);
        }
        h = hash_mix64(hash_mix64(hash_mix64(l0, l1), l2), l3);
    }
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = hash_mix64(h, w);
    }
    uint64_t t = 0;
    for (size_t k = 0; i + k < n; k++) t |= (uint64_t)b[i + k] << (8 * k);
    return hash_mix64(h, t ^ ((uint64_t)n << 56));
}

/* 1 when n bytes at p (any alignment) are all zero. */
static inline int hash_all_zero(const void *p, size_t n)
{
    const unsigned char *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        if (w) return 0;
    }
    for (; i < n; i++)
        if (b[i]) return 0;
    return 1;
}

/* h unchanged when every action is zero (or n == 0), else the n int32
 * actions at a (any alignment) folded in. */
static inline uint64_t hash_actions(uint64_t h, const void *a, size_t n)
{
    return hash_all_zero(a, n * 4) ? h : hash_bytes(hash_mix64(h, 0xac7105ull), a, n * 4);
}

#endif
