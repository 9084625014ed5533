/* batch_graph.c - the per-context cache from batch key to recorded graph.
 * See batch_graph.h. */
#include "batch_graph.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int bg_bucket(int n)
{
    if (n <= 8 || n > BG_PAD_MAX) return n;
    int p = 1;
    while (p <= n / 2) p *= 2; /* largest power of two <= n */
    int step = p / 8;
    return (n + step - 1) / step * step;
}

size_t bg_room(size_t n)
{
    size_t r = 64;
    while (r < n && r <= SIZE_MAX / 2) r *= 2;
    return r < n ? n : r;
}

bg_cache *bg_new(bk_backend *be, int cap)
{
    bg_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    if (!(c->e = calloc((size_t)cap, sizeof *c->e))) {
        free(c);
        return NULL;
    }
    c->be = be;
    c->cap = cap;
    return c;
}

static void clear(bg_cache *c, bg_entry *e)
{
    if (e->g) c->be->graph_free(e->g);
    free(e->key);
    memset(e, 0, sizeof *e);
}

void bg_flush(bg_cache *c)
{
    for (int i = 0; i < c->cap; i++) clear(c, &c->e[i]);
}

void bg_free(bg_cache *c)
{
    if (!c) return;
    bg_flush(c);
    free(c->e);
    free(c);
}

static uint64_t hash(const int64_t *k, int n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < n; i++) {
        h ^= (uint64_t)k[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

bg_entry *bg_get(bg_cache *c, const int64_t *key, int n)
{
    uint64_t h = hash(key, n);
    bg_entry *victim = &c->e[0];
    c->tick++;
    for (int i = 0; i < c->cap; i++) {
        bg_entry *e = &c->e[i];
        if (e->key && e->hash == h && e->nkey == n && !memcmp(e->key, key, (size_t)n * sizeof *key)) {
            e->used = c->tick;
            return e;
        }
        if (!victim->key) continue; /* a free slot wins */
        if (!e->key || e->used < victim->used) victim = e;
    }
    int64_t *k = malloc((size_t)n * sizeof *k);
    if (!k) return NULL;
    if (victim->key) c->evictions++;
    clear(c, victim);
    memcpy(k, key, (size_t)n * sizeof *k);
    victim->key = k;
    victim->nkey = n;
    victim->hash = h;
    victim->used = c->tick;
    return victim;
}

void bg_fail(bg_cache *c, bg_entry *e, int counts)
{
    if (e->g) c->be->graph_free(e->g);
    e->g = NULL;
    e->logits = NULL;
    e->fails += counts != 0;
}

int bg_held(const bg_cache *c)
{
    int n = 0;
    for (int i = 0; i < c->cap; i++) n += c->e[i].g != NULL;
    return n;
}
