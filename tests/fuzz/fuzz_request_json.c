/* fuzz_request_json.c - fuzz the proto3-JSON RankRequest mapper of the HTTP
 * :rank endpoint (rq_request_from_json in server/request_json.c) and what runs
 * after it on an accepted request: validation, the plan, the response.
 *
 * Why this exists: the HTTP body is untrusted; the mapper must never crash,
 * leak or hit UB, and a request it accepts must be a well-formed message
 * that every later step treats consistently. The checks, on every input:
 *   - refused: INVALID_ARGUMENT with a one-line, non-empty message;
 *   - accepted: the message packs, protobuf-c unpacks it, and both re-pack
 *     to the same bytes; the fast wire decoder (rank_wire.c) answers on
 *     those canonical bytes with the same message bytes;
 *   - rq_validate gives the same code and message for the mapped message
 *     and its protobuf-c copy, against two models (the demo model's inputs,
 *     with history, and one without history);
 *   - a valid request plans; the plan maps every candidate to its user's
 *     row (batch.map non-decreasing, order a permutation) and is the same
 *     with every content hash colliding (rq_plan_opts.collide_hashes);
 *   - the response has one score per candidate (or top_k, sorted) and
 *     renders as valid JSON.
 * Two builds: libFuzzer (-DLIBFUZZER) and the standalone corpus replayer +
 * mutation loop (fuzz_main.h) run by make test.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "server/pb_arena.h"
#include "server/rank_wire.h"
#include "server/request.h"

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_request_json: %s%s%s\n", what, detail ? ": " : "",
            detail ? detail : "");
    abort();
}

/* The inputs of models/demo/1/model.json (the seeds are requests for it). */
static const char *const user_sparse[] = {"country", "lang"};
static const char *const cand_sparse[] = {"item", "author"};
static const char *const tasks[] = {"click", "like"};
static const float weights[] = {1.0f, 0.5f};
static const ikbo_model_info demo = {
    .dir = "models/demo/1", .user_dense = 8, .cand_dense = 4,
    .user_sparse = user_sparse, .n_user_sparse = 2, .cand_sparse = cand_sparse,
    .n_cand_sparse = 2, .has_history = 1, .hist_max_len = 64, .hist_actions = 4,
    .tasks = tasks, .n_tasks = 2, .score_weights = weights, .mode = IKBO_MODE_IKBO,
    .device = "cpu"};
/* The same without history and with one sparse feature per side. */
static const ikbo_model_info flat = {
    .dir = "flat/1", .user_dense = 8, .cand_dense = 4, .user_sparse = user_sparse,
    .n_user_sparse = 1, .cand_sparse = cand_sparse, .n_cand_sparse = 1, .tasks = tasks,
    .n_tasks = 2, .score_weights = weights, .mode = IKBO_MODE_BROADCAST, .device = "cpu"};

static unsigned long n_refused, n_invalid, n_valid;

static void check_status_msg(const rq_status *st)
{
    size_t n = strnlen(st->msg, sizeof st->msg);
    if (n == sizeof st->msg)
        die("status message not terminated", NULL);
    if (n == 0)
        die("empty status message", NULL);
    for (size_t i = 0; i < n; i++)
        if (st->msg[i] == '\n' || st->msg[i] == '\r')
            die("multi-line status message", st->msg);
}

static uint8_t *pack_req(const Ikbo__V1__RankRequest *r, size_t *n)
{
    *n = ikbo__v1__rank_request__get_packed_size(r);
    uint8_t *b = malloc(*n + 1);
    if (!b)
        abort();
    if (ikbo__v1__rank_request__pack(r, b) != *n)
        die("pack wrote a different size than get_packed_size", NULL);
    return b;
}

static void same_plan(const rq_plan *a, const rq_plan *b, size_t n_cands)
{
    if (a->batch.n_users != b->batch.n_users || a->batch.n_cands != b->batch.n_cands)
        die("plan differs with colliding hashes", "row/candidate counts");
    if (memcmp(a->batch.map, b->batch.map, n_cands * sizeof *a->batch.map) ||
        memcmp(a->order, b->order, n_cands * sizeof *a->order) ||
        memcmp(a->user_row, b->user_row, (size_t)a->n_request_users * sizeof *a->user_row))
        die("plan differs with colliding hashes", "map/order/user_row");
}

/* Little-endian fixed-width column values (ranker.proto's packed encoding). */
static uint64_t le_at(const ProtobufCBinaryData *b, size_t i, size_t width)
{
    uint64_t x = 0;
    for (size_t k = 0; k < width; k++)
        x |= (uint64_t)b->data[i * width + k] << (8 * k);
    return x;
}

/* Users, candidate i's user index and id, in either encoding (the request
 * is valid: the columns have their sizes). */
static size_t req_users(const Ikbo__V1__RankRequest *req)
{
    return req->packed_users ? req->packed_users->count : req->n_users;
}
static uint32_t cand_user(const Ikbo__V1__RankRequest *req, size_t i)
{
    const Ikbo__V1__PackedCandidates *pc = req->packed_candidates;
    return pc ? (uint32_t)le_at(&pc->users, i, 4) : req->candidates[i]->user;
}
static int64_t cand_id(const Ikbo__V1__RankRequest *req, size_t i)
{
    const Ikbo__V1__PackedCandidates *pc = req->packed_candidates;
    if (!pc)
        return req->candidates[i]->id;
    return pc->ids.len ? (int64_t)le_at(&pc->ids, i, 8) : 0;
}

static void check_plan(const Ikbo__V1__RankRequest *req, const rq_plan *p)
{
    size_t c = rq_request_candidates(req), nu = req_users(req);
    if ((size_t)p->batch.n_cands != c || p->n_request_users != (int)nu ||
        p->batch.n_users < 1 || p->batch.n_users > (int)nu)
        die("plan counts", NULL);
    char *seen = calloc(c, 1);
    if (!seen)
        abort();
    for (size_t i = 0; i < c; i++) {
        int32_t o = p->order[i], row = p->batch.map[i];
        if (o < 0 || (size_t)o >= c || seen[o]++)
            die("plan order is not a permutation", NULL);
        if (row < 0 || row >= p->batch.n_users || (i && row < p->batch.map[i - 1]))
            die("plan map out of range or decreasing", NULL);
        if (p->user_row[cand_user(req, (size_t)o)] != row)
            die("candidate not on its user's row", NULL);
    }
    free(seen);
}

static void check_response(const Ikbo__V1__RankRequest *req, const rq_plan *p,
                           const ikbo_model_info *mi)
{
    size_t c = rq_request_candidates(req);
    float *ts = malloc(c * (size_t)mi->n_tasks * sizeof *ts), *s = malloc(c * sizeof *s);
    if (!ts || !s)
        abort();
    for (size_t i = 0; i < c; i++) {
        s[i] = (float)((i * 7) % 5); /* ties on purpose */
        for (int t = 0; t < mi->n_tasks; t++)
            ts[i * (size_t)mi->n_tasks + (size_t)t] = (float)t;
    }
    rq_status st;
    Ikbo__V1__RankResponse *r = rq_response_build(req, p, "demo", 1, mi, ts, s, &st);
    if (!r)
        die("response build failed", st.msg);
    size_t want = req->top_k && req->top_k < c ? req->top_k : c;
    if (r->n_scores != want)
        die("response score count", NULL);
    for (size_t i = 0; i < r->n_scores; i++) {
        const Ikbo__V1__Score *x = r->scores[i];
        if (x->index >= c || x->id != cand_id(req, x->index) ||
            x->n_task_scores != (size_t)mi->n_tasks)
            die("response score does not match its candidate", NULL);
        if (req->top_k && i && x->score > r->scores[i - 1]->score)
            die("top_k scores not sorted", NULL);
    }
    char *js = rq_response_to_json(r);
    if (!js)
        die("response to JSON failed", NULL);
    json_error_t je;
    json_t *parsed = json_loads(js, 0, &je);
    if (!parsed)
        die("response JSON does not parse", je.text);
    json_decref(parsed);
    free(js);
    rq_response_free(r);
    free(ts);
    free(s);
}

/* Validation of the mapped message and of its protobuf-c copy agree; a valid
 * request plans, the same with colliding hashes, and builds a response. */
static void check_model(const Ikbo__V1__RankRequest *req, const Ikbo__V1__RankRequest *copy,
                        const ikbo_model_info *mi, const rq_limits *lim)
{
    rq_status s1, s2;
    memset(&s1, 0, sizeof s1);
    memset(&s2, 0, sizeof s2);
    int v1 = rq_validate(req, mi, lim, &s1), v2 = rq_validate(copy, mi, lim, &s2);
    if (v1 != v2 || s1.code != s2.code || (v1 && strcmp(s1.msg, s2.msg) != 0))
        die("validation differs between the mapped message and its copy", s1.msg);
    n_invalid += v1 != 0;
    n_valid += v1 == 0;
    if (v1) {
        if (s1.code != RQ_INVALID_ARGUMENT && s1.code != RQ_RESOURCE_EXHAUSTED)
            die("validation failed with an unexpected code", s1.msg);
        check_status_msg(&s1);
        return;
    }
    rq_plan *p = rq_plan_build(req, mi, &s1);
    if (!p)
        die("a valid request does not plan", s1.msg);
    check_plan(req, p);
    rq_plan_opts o = {.collide_hashes = 1};
    rq_plan *q = rq_plan_build_opts(copy, mi, &o, &s2);
    if (!q)
        die("a valid request does not plan with colliding hashes", s2.msg);
    same_plan(p, q, rq_request_candidates(req));
    rq_plan_free(q);
    check_response(req, p, mi);
    rq_plan_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rq_status st;
    memset(&st, 0, sizeof st);
    Ikbo__V1__RankRequest *req = rq_request_from_json((const char *)data, size, &st);
    if (!req) {
        n_refused++;
        if (st.code != RQ_INVALID_ARGUMENT)
            die("refused with a code other than INVALID_ARGUMENT", st.msg);
        check_status_msg(&st);
        return 0;
    }
    size_t n1, n2;
    uint8_t *w1 = pack_req(req, &n1);
    Ikbo__V1__RankRequest *copy = ikbo__v1__rank_request__unpack(NULL, n1, w1);
    if (!copy)
        die("protobuf-c refuses the packed mapped message", NULL);
    uint8_t *w2 = pack_req(copy, &n2);
    if (n1 != n2 || memcmp(w1, w2, n1) != 0)
        die("mapped message and its protobuf-c copy pack differently", NULL);
    pb_arena *a = pb_arena_new(2 * n1 + 64);
    if (!a)
        abort();
    rq_status fst;
    Ikbo__V1__RankRequest *fast = rank_wire_decode(w1, n1, a, &fst);
    if (!fast)
        die("fast wire decoder did not answer a canonical encoding of an accepted request",
            fst.code == RQ_OK ? "declined" : fst.msg);
    uint8_t *w3 = pack_req(fast, &n2);
    if (n1 != n2 || memcmp(w1, w3, n1) != 0)
        die("fast wire decoder's message packs differently", NULL);
    free(w3);
    pb_arena_free(a);

    rq_limits lim;
    rq_limits_default(&lim);
    lim.max_users = 16;
    lim.max_candidates = 256;
    lim.max_ids_per_bag = 16;
    lim.max_history = 128;
    lim.max_sparse_features = 4;
    check_model(req, copy, &demo, &lim);
    check_model(req, copy, &flat, NULL);
    ikbo__v1__rank_request__free_unpacked(copy, NULL);
    rq_request_free(req);
    free(w1);
    free(w2);
    return 0;
}

#ifndef LIBFUZZER

#include "fuzz_main.h"

static const fz_token json_tokens[] = {
    FZ_TOK("\""), FZ_TOK("{"), FZ_TOK("}"), FZ_TOK("["), FZ_TOK("]"), FZ_TOK(","),
    FZ_TOK(":"), FZ_TOK("null"), FZ_TOK("true"), FZ_TOK("false"), FZ_TOK("-1"), FZ_TOK("0"),
    FZ_TOK("1"), FZ_TOK("1.5"), FZ_TOK("1e39"), FZ_TOK("-0"), FZ_TOK("\"NaN\""),
    FZ_TOK("\"Infinity\""), FZ_TOK("\"-Infinity\""), FZ_TOK("\"9223372036854775807\""),
    FZ_TOK("\"-9223372036854775808\""), FZ_TOK("\"9223372036854775808\""),
    FZ_TOK("9223372036854775807"), FZ_TOK("18446744073709551616"), FZ_TOK("4294967295"),
    FZ_TOK("4294967296"), FZ_TOK("\"12\""), FZ_TOK("\" 12\""), FZ_TOK("\"1e3\""),
    FZ_TOK("\"model\""), FZ_TOK("\"modelVersion\""), FZ_TOK("\"model_version\""),
    FZ_TOK("\"users\""), FZ_TOK("\"candidates\""), FZ_TOK("\"topK\""), FZ_TOK("\"top_k\""),
    FZ_TOK("\"requestId\""), FZ_TOK("\"key\""), FZ_TOK("\"dense\""), FZ_TOK("\"sparse\""),
    FZ_TOK("\"historyIds\""), FZ_TOK("\"history_actions\""), FZ_TOK("\"historyActions\""),
    FZ_TOK("\"name\""), FZ_TOK("\"ids\""), FZ_TOK("\"id\""), FZ_TOK("\"user\""),
    FZ_TOK("\"country\""), FZ_TOK("\"lang\""), FZ_TOK("\"item\""), FZ_TOK("\"author\""),
    FZ_TOK("\"\\u0000\""), FZ_TOK("\"\\ud800\""), FZ_TOK("\"\xc3\x28\""), FZ_TOK("[]"),
    FZ_TOK("{}"), FZ_TOK("[0,0,0,0]"), FZ_TOK("\x00"),
    FZ_TOK("\"packedUsers\""), FZ_TOK("\"packed_candidates\""), FZ_TOK("\"count\""),
    FZ_TOK("\"keys\""), FZ_TOK("\"lengths\""), FZ_TOK("\"historyLengths\""),
    FZ_TOK("\"users\""), FZ_TOK("\"AAAAAA==\""), FZ_TOK("\"AAAAAAAAAAA\""),
    FZ_TOK("\"_-+/\""), FZ_TOK("="), FZ_TOK("\"\""),
};
static const fz_dict json_dict = {json_tokens, sizeof json_tokens / sizeof json_tokens[0]};

static void report(void)
{
    printf(": %lu refused by the mapper; validations (two models each): %lu valid, %lu invalid",
           n_refused, n_valid, n_invalid);
}

int main(int argc, char **argv)
{
    static const fz_target t = {"fuzz_request_json", &json_dict, 20000, NULL, report};
    return fz_main(argc, argv, &t);
}

#endif
