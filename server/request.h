/* request.h - the request path shared by the gRPC handler, the HTTP JSON
 * endpoint and ikbo-score: JSON <-> proto mapping, validation against a
 * model, user dedup + candidate grouping into an ikbo_batch, and building the
 * response. One implementation so an invalid request gets the same status
 * code and message on every transport.
 *
 * Typical use (one request):
 *     rq_status st;
 *     Ikbo__V1__RankRequest *req = rq_request_from_json(body, len, &st);
 *     rq_plan *p = req ? rq_prepare(req, info, &limits, &st) : NULL;  // validate + plan
 *     if (!p) -> reply st
 *     ikbo_score(ctx, &p->batch, task_scores, scores, &err);   // [C, T], [C]
 *     Ikbo__V1__RankResponse *resp = rq_response_build(req, p, name, version,
 *                                         info, task_scores, scores, &st);
 *     ... send resp ...; rq_response_free(resp); rq_plan_free(p);
 *     rq_request_free(req);
 *
 * Ownership
 * - rq_request_from_json returns a message built entirely with malloc: free it
 *   with rq_request_free (which is protobuf_c_message_free_unpacked(req, NULL),
 *   so either works). A request unpacked by protobuf-c is freed the same way.
 * - rq_prepare / rq_plan_build copy everything they need out of the
 *   request: the plan does not point into the request, which may be freed
 *   before the plan.
 * - rq_response_build returns a malloc'd message (free with
 *   rq_response_free, also == protobuf_c_message_free_unpacked(resp, NULL)).
 * - Strings returned by the *_json functions are malloc'd; the caller free()s.
 * Thread-safety: no global mutable state; every function is reentrant and may
 * run concurrently on different objects. Inputs are only read.
 *
 * Policies (decided here, tested in tests/unit/test_request.c)
 * - Every string field (model, request_id, users[].key, sparse[].name) must
 *   be valid UTF-8 without NUL, on every transport: INVALID_ARGUMENT
 *   `model: string contains NUL at byte 4` (pb_check.h has the check and
 *   the wording; JSON bodies that are not UTF-8 are invalid JSON).
 * - Non-finite dense values (NaN, +-Inf) are INVALID_ARGUMENT naming the field
 *   and index (`candidates[3].dense[2] is NaN`): a NaN would poison every
 *   score of the user's candidates silently.
 * - User dedup scope is one request (the batcher may re-dedup across
 *   requests). Only users referenced by at least one candidate get a row;
 *   unreferenced users are validated but not scored.
 *   Two users share a row iff they have the same key (possibly empty) and the
 *   same content: dense bits (so -0.0 != 0.0, NaN never reaches here),
 *   sparse features as a set keyed by name (feature order does not matter,
 *   an absent feature equals an empty bag), ids within a bag in order
 *   (order-sensitive, to be safe for any future pooling), history ids and
 *   actions in order (absent actions equal all-zero actions). Same key with
 *   different content -> separate rows, never merged.
 *   Empty-key users are found by a content hash with a full compare on match.
 * - History: the plan passes each user's whole history (oldest first); the
 *   engine keeps the most recent hist_max_len. hist_actions is NULL when no
 *   referenced user gave actions, else users without actions get zeros.
 * - top_k > number of candidates returns all candidates, sorted.
 * - Encodings: a request gives users/candidates (classic) or packed_users
 *   and packed_candidates (ranker.proto), never a mix. Both are held to the
 *   same rules with the same messages, naming the entity by its index
 *   (`users[2].history_ids has ...`); what only a packed column can get
 *   wrong names the column (`packed_candidates.dense has 100 bytes,
 *   expected 280 ...`).
 */
#ifndef IKBO_SERVER_REQUEST_H
#define IKBO_SERVER_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "../engine/ikbo.h"
#include "ikbo/v1/ranker.pb-c.h"
#include "status.h"

/* ---- limits ---------------------------------------------------------- */

/* Defaults (rq_limits_default); config.json "limits" overrides them. */
#define RQ_DEFAULT_MAX_USERS 1024u
#define RQ_DEFAULT_MAX_CANDIDATES 10000u
#define RQ_DEFAULT_MAX_IDS_PER_BAG 1024u
#define RQ_DEFAULT_MAX_HISTORY 10000u            /* events per user in a request */
#define RQ_DEFAULT_MAX_SPARSE_FEATURES 64u       /* sparse features per user/candidate */
#define RQ_DEFAULT_MAX_MESSAGE_BYTES (4u << 20)  /* 4 MiB; enforced by the transports */

typedef struct rq_limits {
    uint32_t max_users;           /* users in a request */
    uint32_t max_candidates;      /* candidates in a request */
    uint32_t max_ids_per_bag;     /* ids in one SparseFeature */
    uint32_t max_history;         /* history events of one user in a request */
    uint32_t max_sparse_features; /* SparseFeature entries per user/candidate */
    uint32_t max_message_bytes;   /* request body / gRPC message size */
} rq_limits;

void rq_limits_default(rq_limits *l);

/* Candidates in the request, in either encoding. */
size_t rq_request_candidates(const Ikbo__V1__RankRequest *req);

/* ---- JSON mapping ------------------------------------------------------ */

/* Parses a proto3-JSON RankRequest (lowerCamelCase or original field names,
 * int64 as a JSON integer or a decimal string, uint32/int32 as integers,
 * floats as numbers, bytes (the packed encoding's columns) as base64,
 * standard or URL-safe, padding optional; null = field absent). Errors are INVALID_ARGUMENT with
 * the path: `users[2].sparse[0].idz: unknown field`, `candidates[1].id:
 * expected int64 (number or decimal string)`, `invalid JSON at line 3 column
 * 7: ...`. Returns NULL on error. */
Ikbo__V1__RankRequest *rq_request_from_json(const char *text, size_t len, rq_status *st);
void rq_request_free(Ikbo__V1__RankRequest *req);

/* RankResponse as proto3 JSON (lowerCamelCase; int64 as decimal strings, per
 * the proto3 mapping; uint32 and floats as numbers, floats with %.9g;
 * non-finite floats as "NaN"/"Infinity"/"-Infinity"). Returns a malloc'd
 * NUL-terminated string, or NULL on allocation failure. */
char *rq_response_to_json(const Ikbo__V1__RankResponse *resp);
/* {"error": {"code": "INVALID_ARGUMENT", "message": "..."}} (malloc'd). */
char *rq_error_json(const rq_status *st);

/* ---- validation ------------------------------------------------------ */

/* Everything that can be checked before any work: counts vs limits
 * (RESOURCE_EXHAUSTED naming the limit and the value), candidate -> user
 * indices, dense lengths vs the model, finite dense values, sparse feature
 * names known and unique per entity, ids per bag, history vs the model
 * (actions length, range). Model name/version resolution (NOT_FOUND) is the
 * caller's. Returns 0, or -1 with *st set. lim NULL = defaults. */
int rq_validate(const Ikbo__V1__RankRequest *req, const ikbo_model_info *mi,
                const rq_limits *lim, rq_status *st);

/* ---- plan: dedup + grouping ------------------------------------------ */

/* A request as an engine batch. Candidates are grouped by user row in order
 * of each row's first referencing candidate, stable within a user, so
 * batch.map is non-decreasing. All arrays are owned by the plan. */
typedef struct rq_plan {
    ikbo_batch batch;        /* n_users = unique users (rows), n_cands = C */
    int32_t *order;          /* [C] request index of batch candidate i */
    int32_t *user_row;       /* [request users] row of request user j, or -1
                                when no candidate references it */
    int32_t *row_user;       /* [rows] first request user index with that row */
    const char **row_key;    /* [rows] that user's key ("" = none) */
    int64_t *cand_ids;       /* [C] Candidate.id in request order */
    int n_request_users;
    void *priv_;             /* owned storage; freed by rq_plan_free */
} rq_plan;

typedef struct rq_plan_opts {
    /* Test hook, rs_table_new's collide_hashes: 1 makes every content hash
     * the same value (the full-compare path for collisions), 2 only the
     * short hash (the full-hash chains). */
    int collide_hashes;
} rq_plan_opts;

/* rq_validate and the plan in one pass over the request (the server's
 * path): the plan, or NULL with *st set as rq_validate or rq_plan_build
 * would. lim NULL = defaults. */
rq_plan *rq_prepare(const Ikbo__V1__RankRequest *req, const ikbo_model_info *mi,
                    const rq_limits *lim, rq_status *st);

/* Builds the plan for a request that passed rq_validate against the same
 * model (it re-checks nothing it does not need to stay memory-safe; a bad
 * request gets INVALID_ARGUMENT, never a crash). Returns NULL with *st set
 * (RQ_INTERNAL on allocation failure). opts may be NULL. */
rq_plan *rq_plan_build(const Ikbo__V1__RankRequest *req, const ikbo_model_info *mi,
                       rq_status *st);
rq_plan *rq_plan_build_opts(const Ikbo__V1__RankRequest *req, const ikbo_model_info *mi,
                            const rq_plan_opts *opts, rq_status *st);
void rq_plan_free(rq_plan *p); /* NULL ok */

/* ---- response -------------------------------------------------------- */

/* Builds the RankResponse from the engine's outputs in batch order:
 * task_scores [C, mi->n_tasks] (may be NULL: empty task_scores) and scores
 * [C]. With req->top_k == 0, scores are in request order (index = request
 * position); else the top_k by score descending, ties by request index
 * ascending (top_k > C = all, sorted). model_name/request_id are copied;
 * tasks from mi; unique_users = plan rows. NULL with *st (INTERNAL) only on
 * allocation failure. */
Ikbo__V1__RankResponse *rq_response_build(const Ikbo__V1__RankRequest *req,
                                          const rq_plan *p, const char *model_name,
                                          int64_t model_version, const ikbo_model_info *mi,
                                          const float *task_scores, const float *scores,
                                          rq_status *st);
void rq_response_free(Ikbo__V1__RankResponse *resp); /* NULL ok */

#endif
