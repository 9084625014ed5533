/* batch_graph.h - which batches share a recorded graph (engine-internal).
 *
 * Why this exists: on a GPU a small batch is bound by its ~30 launches, not
 * by its math; a recorded graph replays them as one (backend.h graph_*).
 * A graph is only valid for a batch whose every buffer address, size and
 * scalar equals the recorded batch's. The engine lays a batch out
 * deterministically (its arenas are bump-allocated in a fixed order), so
 * the batch's *key* - users, padded candidates, history events, broadcast
 * events and the size of every arena take, in order - decides it. The key
 * is kept as a 128-bit hash of that sequence (bg_key_add: two independent
 * 64-bit lanes; an accidental match of two different sequences is not a
 * practical event, and a replay still checks every staged copy's address
 * and size). This file is the per-context cache from key to graph: a fixed number of
 * entries, least recently used evicted. A key's first batch runs normally
 * (it sizes every buffer and cuBLASLt plan), its second is recorded, later
 * ones replay; a key whose recording or replay failed twice is never
 * recorded again.
 *
 * Buckets: to let batches of nearby sizes share a key, the engine pads the
 * candidates of batches up to BG_PAD_MAX (bg_bucket: at most 1/8 more,
 * rows mapped to the last user,
 * zero dense features, empty bags; their scores are dropped) and give each
 * sparse feature's ids a power-of-two room (bg_room). Users and history events are not
 * padded: they are part of the key as they are.
 *
 * Ownership: a bg_cache belongs to one ikbo_ctx and frees its graphs with
 * the context's backend. Thread-safety: none; one thread at a time, like
 * the context.
 */
#ifndef IKBO_BATCH_GRAPH_H
#define IKBO_BATCH_GRAPH_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"

/* A key's failures (recording or replay) before it is never recorded again. */
#define BG_MAX_FAILS 2

/* A batch key being built (bg_key_add), or complete. */
typedef struct bg_key {
    uint64_t a, b;
} bg_key;
#define BG_KEY_INIT ((bg_key){0x9e3779b97f4a7c15ull, 0xd1b54a32d192ed03ull})
void bg_key_add(bg_key *k, int64_t v);

typedef struct bg_entry {
    bg_key key;
    int in_use; /* 0: a free slot */
    int seen;      /* batches run normally under this key */
    int fails;
    bk_graph *g;   /* NULL until recorded */
    void *logits;  /* the logits buffer of the recorded batch */
    uint64_t used; /* LRU tick */
} bg_entry;

typedef struct bg_cache {
    bk_backend *be;
    bg_entry *e;
    int cap;
    uint64_t tick;
    uint64_t evictions;
} bg_cache;

/* Candidates past which batches are not padded: large batches are not
 * launch-bound, and their padding would cost more than a graph saves. */
#define BG_PAD_MAX 1024

/* Candidates' bucket: n rounded up to a multiple of 2^floor(log2 n) / 8;
 * n <= 8 and n > BG_PAD_MAX unchanged: 70 -> 72, 600 -> 640, 1120 -> 1120. */
int bg_bucket(int n);

/* Room for n ids of one sparse feature: the next power of two, at least
 * 64, so a feature's varying id count rarely changes the key. */
size_t bg_room(size_t n);

/* cap entries (>= 1). NULL on out of memory. */
bg_cache *bg_new(bk_backend *be, int cap);
void bg_free(bg_cache *c);
/* Frees every graph and forgets every key (the arenas moved). */
void bg_flush(bg_cache *c);
/* The entry of key, inserted (evicting the least recently used) when
 * absent. */
bg_entry *bg_get(bg_cache *c, bg_key key);
/* Drops e's graph after a failure; `counts`: the failure counts toward
 * BG_MAX_FAILS (not when the graph was only stale: the stream's buffers
 * grew since, which stops once they reach the traffic's high-water). */
void bg_fail(bg_cache *c, bg_entry *e, int counts);
/* Graphs held now. */
int bg_held(const bg_cache *c);

#endif
