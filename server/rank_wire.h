/* rank_wire.h - a fast decoder for the common encoding of a RankRequest.
 *
 * Why this exists: protobuf-c's generic unpack walks each field through the
 * message descriptor and allocates every submessage separately; for a
 * seed-scale request (1120 candidates, two sparse bags each, 16 users with
 * 1024 history events) that costs ~0.4 ms of a gRPC worker even with the
 * arena (bench/e2e/host_path.c), a third of the forward pass on the H200.
 * This decoder knows the five messages of a RankRequest and fills the same
 * protobuf-c structs from the wire directly, into the request's arena.
 *
 * Scope: every known field in either encoding protobuf allows (repeated
 * scalars packed or not, in any order, repeated or split), last value wins
 * for singular fields, as protobuf-c does. It gives up (returns NULL) on
 * anything else: unknown fields, unexpected wire types, malformed bytes.
 * The caller then unpacks with protobuf-c, whose result or refusal is the
 * reference; tests/unit/test_rank_wire.c checks that both agree wherever
 * this decoder answers.
 *
 * Ownership: the message and everything it points to live in the arena;
 * free the arena, never the message.
 */
#ifndef IKBO_SERVER_RANK_WIRE_H
#define IKBO_SERVER_RANK_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "ikbo/v1/ranker.pb-c.h"
#include "pb_arena.h"

/* The request, or NULL (fall back to protobuf-c; the arena may hold partial
 * allocations, so use a fresh one for the fallback). */
Ikbo__V1__RankRequest *rank_wire_decode(const uint8_t *buf, size_t len, pb_arena *a);

#endif
