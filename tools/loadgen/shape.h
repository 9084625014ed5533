/* shape.h - request shapes for ikbo-loadgen: integer distributions, the
 * shape spec (flags or a JSON file), the model's inputs (from ModelInfo) and
 * the pre-serialized RankRequest bodies that the load loop sends.
 *
 * Why requests are pre-built: building and packing a request with thousands
 * of candidates costs about as much as a small model's forward pass; doing it
 * on the send path would make the client the bottleneck and skew latency. A
 * set of `distinct` bodies is built up front and sent round-robin.
 *
 * Repeated users: each user slot of a request is, with probability
 * repeat_users, one of user_pool fixed users (key "pool-<i>", same content
 * every time it appears), else a fresh user (key "u<request>-<slot>"). Pool
 * users are distinct within one request, so a request has exactly `users`
 * users. Fresh users recur only when the distinct bodies cycle.
 *
 * Encoding: every body is request i of the set in the classic fields
 * (users, candidates) or, with encoding LG_ENC_PACKED, the same request in
 * the packed columnar fields (packed.h); the content does not depend on it.
 *
 * Ownership: shape_* fill caller-owned structs; lg_bodies_free frees bodies.
 * Errors are written into a caller buffer (errbuf, 256+ bytes), never
 * printed. Thread-safety: building is single-threaded; built bodies are
 * read-only and shared by the sender threads.
 */
#ifndef IKBO_LOADGEN_SHAPE_H
#define IKBO_LOADGEN_SHAPE_H

#include <stddef.h>
#include <stdint.h>

#include "ikbo/v1/ranker.pb-c.h"

/* Formats an error into buf (n bytes); returns -1, for `return lg_seterr(...)`.
 * Shared by shape.c and packed.c. */
int lg_seterr(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- integer distribution ---------------------------------------------- */

enum dist_kind { DIST_FIXED = 0, DIST_UNIFORM = 1, DIST_CHOICE = 2 };

#define DIST_MAX_CHOICES 64

typedef struct dist {
    enum dist_kind kind;
    int64_t a, b;          /* FIXED: a; UNIFORM: a..b inclusive */
    int n;                 /* CHOICE: values[0..n) picked uniformly */
    int64_t values[DIST_MAX_CHOICES];
} dist;

/* "70" fixed, "10..500" uniform (inclusive), "10,70,500" one of the list.
 * Values must be in [min, max]. Returns 0, or -1 with errbuf set. */
int dist_parse(dist *d, const char *text, int64_t min, int64_t max, char *errbuf, size_t n);
/* The text form above, into buf. */
void dist_format(const dist *d, char *buf, size_t n);
double dist_mean(const dist *d);
int64_t dist_max(const dist *d);

/* ---- rng (splitmix64 seeding xoshiro256**) ----------------------------- */

typedef struct lg_rng {
    uint64_t s[4];
} lg_rng;

void lg_rng_seed(lg_rng *r, uint64_t seed);
uint64_t lg_rng_next(lg_rng *r);
double lg_rng_unit(lg_rng *r);                    /* [0, 1) */
int64_t lg_rng_range(lg_rng *r, int64_t lo, int64_t hi); /* inclusive */
int64_t dist_sample(const dist *d, lg_rng *r);

/* ---- shape spec ---------------------------------------------------------- */

enum lg_encoding { LG_ENC_CLASSIC = 0, LG_ENC_PACKED = 1 };

/* "classic" or "packed"; -1 for anything else. */
int lg_encoding_parse(const char *text);
const char *lg_encoding_name(int encoding);

typedef struct shape {
    int users;             /* users per request, >= 1 */
    dist candidates;       /* candidates per user */
    dist history;          /* history events per user; has_history == 0: model max_len */
    int has_history;
    dist user_ids;         /* ids per user sparse bag */
    dist cand_ids;         /* ids per candidate sparse bag */
    double repeat_users;   /* 0..1 */
    int user_pool;         /* pool size for repeated users */
    int64_t id_range;      /* sparse / history ids drawn from [0, id_range) */
    int distinct;          /* distinct request bodies */
    int shuffle;           /* interleave candidates of different users */
    uint32_t top_k;
    uint64_t seed;
    int encoding;          /* enum lg_encoding; not a spec key (a flag only) */
} shape;

void shape_defaults(shape *s);

/* Applies a JSON spec file on top of *s. Keys (all optional): users,
 * candidates, history, ids_per_bag (both sides), user_ids_per_bag,
 * candidate_ids_per_bag, repeat_users, user_pool, id_range, distinct,
 * shuffle, top_k, seed; and the run keys model, model_version, which are
 * returned through *model (malloc'd, NULL if absent) and *version (-1 if
 * absent). Distributions are a number, a string in dist_parse's syntax, an
 * array (one of the list) or {"uniform": [a, b]}. Unknown keys are errors. */
int shape_apply_json_file(shape *s, const char *path, char **model, int64_t *version,
                          char *errbuf, size_t n);

/* ---- model inputs -------------------------------------------------------- */

typedef struct lg_model {
    char *name;
    int64_t version;       /* the version that will serve: newest READY, or the requested */
    int64_t req_version;   /* what requests ask for: 0 (newest ready) or --model-version */
    char *mode, *device;
    uint32_t user_dense, cand_dense;
    char **user_sparse;
    int n_user_sparse;
    char **cand_sparse;
    int n_cand_sparse;
    int has_history;
    uint32_t hist_max_len, hist_actions;
    int n_tasks;
} lg_model;

/* Copies what the generator needs from a ModelInfo description. version:
 * the requested version (0 = newest READY). Returns 0; -1 with errbuf when no
 * matching version is READY (the message lists the states). */
int lg_model_from_desc(lg_model *m, const Ikbo__V1__ModelDescription *d, int64_t version,
                       char *errbuf, size_t n);
void lg_model_free(lg_model *m);

/* ---- request bodies ------------------------------------------------------ */

typedef struct lg_body {
    uint8_t *data;
    size_t len;
    uint32_t n_users, n_cands;
    uint32_t n_expected_scores; /* top_k applied */
} lg_body;

typedef struct lg_bodies {
    lg_body *b;
    int n;
    double mean_cands, mean_bytes;
} lg_bodies;

/* Builds s->distinct request bodies for model m (model_version 0 in the
 * request = newest ready). Returns 0, -1 with errbuf (allocation failure). */
int lg_bodies_build(lg_bodies *out, const shape *s, const lg_model *m, char *errbuf, size_t n);
void lg_bodies_free(lg_bodies *b);

#endif
