/* pb_arena.c - chunked bump allocation for protobuf-c (see pb_arena.h). */
#include "pb_arena.h"

#include <stdint.h>
#include <stdlib.h>

#define ARENA_ALIGN 16 /* malloc's alignment on x86-64: any field type */
#define ARENA_MIN_CHUNK 4096

typedef struct chunk {
    struct chunk *next;
    size_t cap, used;
    /* data follows, ARENA_ALIGN-aligned */
} chunk;

#define CHUNK_HDR ((sizeof(chunk) + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1))

struct pb_arena {
    ProtobufCAllocator alloc;
    chunk *head; /* the chunk being filled; older ones follow */
    size_t next_cap, used;
    int failed; /* an allocation ran out of memory */
};

static chunk *chunk_new(size_t cap)
{
    if (cap > SIZE_MAX - CHUNK_HDR) return NULL;
    chunk *c = malloc(CHUNK_HDR + cap);
    if (!c) return NULL;
    c->next = NULL;
    c->cap = cap;
    c->used = 0;
    return c;
}

static void *arena_alloc(void *data, size_t n)
{
    pb_arena *a = data;
    if (n == 0) n = 1;
    if (n > SIZE_MAX - ARENA_ALIGN) return NULL;
    size_t need = (n + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    chunk *c = a->head;
    if (!c || c->cap - c->used < need) {
        size_t cap = a->next_cap;
        while (cap < need) cap = cap > SIZE_MAX / 2 ? need : 2 * cap;
        chunk *nc = chunk_new(cap);
        if (!nc) {
            a->failed = 1;
            return NULL;
        }
        nc->next = c;
        a->head = c = nc;
        a->next_cap = cap > SIZE_MAX / 2 ? cap : 2 * cap;
    }
    void *p = (char *)c + CHUNK_HDR + c->used;
    c->used += need;
    a->used += need;
    return p;
}

static void arena_nofree(void *data, void *p)
{
    (void)data;
    (void)p;
}

pb_arena *pb_arena_new(size_t first)
{
    pb_arena *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->alloc.alloc = arena_alloc;
    a->alloc.free = arena_nofree;
    a->alloc.allocator_data = a;
    a->next_cap = first < ARENA_MIN_CHUNK ? ARENA_MIN_CHUNK : first;
    return a;
}

ProtobufCAllocator *pb_arena_allocator(pb_arena *a) { return &a->alloc; }

size_t pb_arena_used(const pb_arena *a) { return a->used; }

int pb_arena_failed(const pb_arena *a) { return a->failed; }

void pb_arena_free(pb_arena *a)
{
    if (!a) return;
    for (chunk *c = a->head; c;) {
        chunk *n = c->next;
        free(c);
        c = n;
    }
    free(a);
}
