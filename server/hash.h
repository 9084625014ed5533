/* hash.h - the 64-bit content hash user dedup uses.
 *
 * Why this exists: users are deduplicated twice, per request (request.c,
 * over protobuf users) and across the requests of a batch (batcher.c, over
 * plan rows); both hash user content with the same function, so it lives
 * once here. Not cryptographic: a hash match is always followed by a full
 * compare. Header-only, no state.
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

/* Folds n bytes into h, 8 at a time; the length goes into the last word so
 * that inputs differing only in trailing zero bytes hash apart. */
static inline uint64_t hash_bytes(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = hash_mix64(h, w);
    }
    uint64_t t = 0;
    for (size_t k = 0; i + k < n; k++) t |= (uint64_t)b[i + k] << (8 * k);
    return hash_mix64(h, t ^ ((uint64_t)n << 56));
}

#endif
