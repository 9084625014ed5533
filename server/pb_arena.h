/* pb_arena.h - a bump allocator for protobuf-c messages.
 *
 * Why this exists: protobuf_c_message_unpack allocates every submessage,
 * string and repeated array separately. A seed-scale RankRequest (16 users
 * with 1024 history events, 1120 candidates with two sparse bags each) is
 * ~10,000 malloc calls to unpack and as many frees afterwards, which cost
 * more than its whole forward pass on the GPU (bench/e2e/host_path.c). With
 * this allocator the unpack takes its memory from a few large chunks and
 * the whole message is released with one pb_arena_free.
 *
 * Ownership: the arena owns every allocation made through its allocator;
 * the allocator's free is a no-op, so never pass it to
 * protobuf_c_message_free_unpacked: free the arena instead. Not thread-safe
 * while allocating; a finished message may be read from any thread.
 */
#ifndef IKBO_PB_ARENA_H
#define IKBO_PB_ARENA_H

#include <stddef.h>

#include <protobuf-c/protobuf-c.h>

typedef struct pb_arena pb_arena;

/* first: bytes of the first chunk (e.g. twice the wire size of the message
 * to unpack); later chunks double. NULL when out of memory. */
pb_arena *pb_arena_new(size_t first);
/* The allocator to pass to protobuf-c; valid until pb_arena_free. */
ProtobufCAllocator *pb_arena_allocator(pb_arena *a);
/* Bytes handed out so far (tests, metrics). */
size_t pb_arena_used(const pb_arena *a);
/* 1 once an allocation from it failed for want of memory: an unpack that
 * returned NULL then ran out of memory rather than met malformed bytes. */
int pb_arena_failed(const pb_arena *a);
void pb_arena_free(pb_arena *a); /* NULL ok */

#endif
