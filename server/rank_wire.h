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
 * for singular fields, as protobuf-c does. It gives up (declines) on
 * anything else: unknown fields, unexpected wire types, malformed bytes,
 * field numbers outside 1..2^29-1. The caller then unpacks with protobuf-c
 * and checks with pb_check_unpack (pb_check.h), whose result or refusal is
 * the reference. Every string it decodes is checked as pb_check does (valid
 * UTF-8, no NUL); a bad one is refused here with the same message.
 * tests/unit/test_rank_wire.c checks that both paths agree wherever this
 * decoder answers or refuses.
 *
 * Ownership: the message and everything it points to live in the arena,
 * except the packed encoding's `bytes` fields, which point into buf (that is
 * what makes the packed encoding cheap: its columns are never copied or
 * converted here); buf must outlive the message. Free the arena, never the
 * message.
 */
#ifndef IKBO_SERVER_RANK_WIRE_H
#define IKBO_SERVER_RANK_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "ikbo/v1/ranker.pb-c.h"
#include "pb_arena.h"
#include "request.h"

/* The request (st OK), or NULL with:
 * - st OK: declined, fall back to pb_check_unpack (the arena may hold
 *   partial allocations, so use a fresh one for the fallback);
 * - st INVALID_ARGUMENT: refused, a string field is not valid UTF-8 or
 *   holds a NUL (`users[2].key: string contains NUL at byte 3`); protobuf-c
 *   with pb_check would refuse it with the same status.
 * st NULL: no way to tell the two apart (both NULL). */
Ikbo__V1__RankRequest *rank_wire_decode(const uint8_t *buf, size_t len, pb_arena *a,
                                        rq_status *st);

/* A request message's bytes as the server decodes them (grpc_server.c; the
 * allocation-failure tests call it too). With arena: the message lives in a
 * new arena returned in *arena (free that, not the message); a RankRequest
 * goes through rank_wire_decode first, and what it declines through
 * pb_check_unpack in a fresh arena. Without (arena NULL): pb_check_unpack
 * with malloc (free with protobuf_c_message_free_unpacked). NULL with *st
 * set: INVALID_ARGUMENT for bad bytes, INTERNAL when memory ran out.
 * As with rank_wire_decode, buf must outlive the message. */
ProtobufCMessage *rank_wire_unpack(const ProtobufCMessageDescriptor *d, const uint8_t *buf,
                                   size_t len, pb_arena **arena, rq_status *st);

/* A RankResponse's bytes exactly as protobuf-c packs them (the test holds the
 * two equal), written without the descriptor walk: the size, then the bytes
 * into out[size] (returns the count written). Little-endian hosts only. */
size_t rank_wire_response_size(const Ikbo__V1__RankResponse *r);
size_t rank_wire_pack_response(const Ikbo__V1__RankResponse *r, uint8_t *out);

#endif
