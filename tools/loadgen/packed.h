/* packed.h - the packed (columnar) encoding of a RankRequest for
 * ikbo-loadgen (--encoding packed).
 *
 * Why it is a conversion: the generator builds the classic message tree
 * either way, so both encodings of request i carry the same users,
 * candidates, ids, dense values and histories from the same seed; this file
 * only re-lays them out as ranker.proto's PackedUsers/PackedCandidates
 * (little-endian fixed-width numbers in bytes fields). It runs before the
 * load, so its cost does not matter; what it must get right is the rules in
 * the proto comments:
 *   - users/candidates are left empty, both packed messages are present;
 *   - keys: none when every key is empty, else one per user;
 *   - one PackedSparse per feature name (first appearance order), an entity
 *     without that feature gets an empty bag;
 *   - history_lengths empty when no user has history; history_actions empty
 *     when no user has actions (users without them get zeros otherwise);
 *   - every user has the same dense width, every candidate too (the model's).
 *
 * Ownership: *out is malloc'd, the caller frees it; q is not changed.
 * Errors go to errbuf (256+ bytes), never printed. Thread-safe (no state).
 */
#ifndef IKBO_LOADGEN_PACKED_H
#define IKBO_LOADGEN_PACKED_H

#include <stddef.h>
#include <stdint.h>

#include "ikbo/v1/ranker.pb-c.h"

/* Serializes the request q (classic users/candidates) in the packed
 * encoding: model, model_version, top_k and request_id copied. Returns 0;
 * -1 with errbuf when q has a shape the packed encoding cannot carry (ragged
 * dense rows, a feature twice in one entity, history_actions not one per
 * history id; the message names the field and index) or memory runs out. */
int lg_pack_columnar(const Ikbo__V1__RankRequest *q, uint8_t **out, size_t *len, char *errbuf,
                     size_t n);

#endif
