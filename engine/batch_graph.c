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

/* A 64-bit finalizer (splitmix64's): every input bit reaches every output bit. */
static uint64_t mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void bg_key_add(bg_key *k, int64_t v)
{
    k->a = mix(k->a ^ (uint64_t)v) + 0x9e3779b97f4a7c15ull;
    k->b = mix(k->b + (uint64_t)v * 0xff51afd7ed558ccdull) ^ 0xc4ceb9fe1a85ec53ull;
}

bg_entry *bg_get(bg_cache *c, bg_key key)
{
    bg_entry *victim = &c->e[0];
    c->tick++;
    for (int i = 0; i < c->cap; i++) {
        bg_entry *e = &c->e[i];
        if (e->in_use && e->key.a == key.a && e->key.b == key.b) {
            e->used = c->tick;
            return e;
        }
        if (!victim->in_use) continue; /* a free slot wins */
        if (!e->in_use || e->used < victim->used) victim = e;
    }
    if (victim->in_use) c->evictions++;
    clear(c, victim);
    victim->key = key;
    victim->in_use = 1;
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
