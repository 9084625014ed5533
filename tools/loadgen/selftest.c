/* selftest.c - `ikbo-loadgen --self-test`: checks of the parts that need no
 * server (histogram precision, distributions, JSON spec, request bodies, the
 * packed encoding), so tests/integration/test_loadgen.py can run them
 * without a unit framework.
 *
 * The packed checks decode both encodings of each generated request with
 * protobuf-c and compare them field by field; the packed columns are read
 * here with their own little-endian readers (not with packed.c's code), so
 * a layout mistake in the writer cannot cancel out. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hist.h"
#include "ikbo/v1/ranker.pb-c.h"
#include "packed.h"
#include "shape.h"

int lg_self_test(void);

static int n_checks, n_failed;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        n_checks++;                                                        \
        if (!(cond)) {                                                     \
            n_failed++;                                                    \
            fprintf(stderr, "self-test FAILED %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fputc('\n', stderr);                                           \
        }                                                                  \
    } while (0)

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void test_hist(void)
{
    /* every index's range is contiguous with the next and at most 1/128 wide */
    uint64_t prev_hi = 0;
    int bad = 0;
    for (int i = 0; i < HIST_BUCKETS; i++) {
        uint64_t lo, hi;
        hist_bounds(i, &lo, &hi);
        if (i > 0 && lo != prev_hi + 1) bad++;
        if (lo >= 256 && (double)(hi - lo + 1) > (double)lo / 128.0 + 1e-9) bad++;
        if (hist_index(lo) != i || hist_index(hi) != i) bad++;
        prev_hi = hi;
    }
    CHECK(bad == 0, "%d bucket boundary errors", bad);
    CHECK(prev_hi == UINT64_MAX, "buckets end at %llu", (unsigned long long)prev_hi);

    /* quantiles of a wide log-normal sample within 0.5% of the exact ones */
    enum { N = 200000 };
    uint64_t *v = malloc(N * sizeof *v);
    hist *h = malloc(sizeof *h), *h1 = malloc(sizeof *h1), *h2 = malloc(sizeof *h2);
    if (!v || !h || !h1 || !h2) {
        CHECK(0, "out of memory");
        return;
    }
    hist_init(h);
    hist_init(h1);
    hist_init(h2);
    lg_rng r;
    lg_rng_seed(&r, 42);
    for (int i = 0; i < N; i++) {
        double u1 = lg_rng_unit(&r) + 1e-12, u2 = lg_rng_unit(&r);
        double z = sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
        v[i] = (uint64_t)(exp(13.0 + 1.5 * z)); /* ~0.4 ms median, tails to seconds */
        hist_add(h, v[i]);
        hist_add(i % 2 ? h1 : h2, v[i]);
    }
    qsort(v, N, sizeof *v, cmp_u64);
    const double qs[] = {0.5, 0.9, 0.99, 0.999, 0.0001};
    for (size_t k = 0; k < sizeof qs / sizeof *qs; k++) {
        size_t rank = (size_t)ceil(qs[k] * N);
        double exact = (double)v[rank - 1], got = hist_quantile(h, qs[k]);
        CHECK(fabs(got - exact) <= 0.005 * exact, "q%.4f: %.1f vs exact %.1f", qs[k], got, exact);
    }
    CHECK(hist_quantile(h, 0) == (double)v[0] && hist_quantile(h, 1) == (double)v[N - 1], "min/max");
    hist_merge(h1, h2);
    CHECK(h1->count == h->count && h1->min == h->min && h1->max == h->max &&
              !memcmp(h1->b, h->b, sizeof h->b),
          "merge of halves differs from the whole");
    hist_init(h2);
    CHECK(hist_quantile(h2, 0.5) == 0 && hist_mean(h2) == 0, "empty histogram");
    hist_add(h2, 12345678);
    CHECK(hist_quantile(h2, 0.5) == 12345678.0, "single value is exact (clamped to min/max)");
    free(v);
    free(h);
    free(h1);
    free(h2);
}

static void test_dist(void)
{
    dist d;
    char err[256], buf[256];
    CHECK(!dist_parse(&d, "70", 0, 1000, err, sizeof err) && d.kind == DIST_FIXED && d.a == 70, "fixed");
    CHECK(!dist_parse(&d, "10..500", 0, 1000, err, sizeof err) && d.kind == DIST_UNIFORM &&
              d.a == 10 && d.b == 500 && dist_mean(&d) == 255,
          "uniform");
    lg_rng r;
    lg_rng_seed(&r, 7);
    int lo = 1 << 30, hi = -1;
    for (int i = 0; i < 10000; i++) {
        int x = (int)dist_sample(&d, &r);
        if (x < lo) lo = x;
        if (x > hi) hi = x;
    }
    CHECK(lo == 10 && hi == 500, "uniform sample range %d..%d", lo, hi);
    CHECK(!dist_parse(&d, "10,70,500", 0, 1000, err, sizeof err) && d.kind == DIST_CHOICE && d.n == 3 &&
              dist_max(&d) == 500,
          "choice");
    dist_format(&d, buf, sizeof buf);
    CHECK(!strcmp(buf, "10,70,500"), "format %s", buf);
    int seen[3] = {0};
    for (int i = 0; i < 3000; i++) {
        int64_t x = dist_sample(&d, &r);
        seen[x == 10 ? 0 : x == 70 ? 1 : 2]++;
    }
    CHECK(seen[0] > 800 && seen[1] > 800 && seen[2] > 800, "choice is uniform: %d %d %d", seen[0],
          seen[1], seen[2]);
    const char *bad[] = {"", "a", "5..2", "1,,2", "1..", "2000", "-1", "3x", "1,2,x", NULL};
    for (int i = 0; bad[i]; i++)
        CHECK(dist_parse(&d, bad[i], 0, 1000, err, sizeof err) == -1 && err[0], "'%s' accepted", bad[i]);
}

static void test_spec(void)
{
    char path[] = "/tmp/ikbo-loadgen-spec-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        CHECK(0, "mkstemp");
        return;
    }
    const char *doc = "{\"users\": 16, \"candidates\": {\"uniform\": [10, 500]}, \"history\": [0, 64],"
                      " \"ids_per_bag\": \"1..4\", \"repeat_users\": 0.25, \"user_pool\": 50,"
                      " \"model\": \"bench\", \"model_version\": 3, \"shuffle\": true}";
    if (write(fd, doc, strlen(doc)) != (ssize_t)strlen(doc)) CHECK(0, "write");
    close(fd);
    shape s;
    shape_defaults(&s);
    char *model = NULL, err[512];
    int64_t ver;
    int rc = shape_apply_json_file(&s, path, &model, &ver, err, sizeof err);
    CHECK(rc == 0, "spec: %s", err);
    CHECK(s.users == 16 && s.candidates.kind == DIST_UNIFORM && s.candidates.b == 500 &&
              s.has_history && s.history.kind == DIST_CHOICE && s.cand_ids.b == 4 &&
              s.repeat_users == 0.25 && s.user_pool == 50 && s.shuffle && model &&
              !strcmp(model, "bench") && ver == 3,
          "spec values");
    free(model);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs("{\"users\": 2, \"candidatez\": 3}", f);
        fclose(f);
    }
    rc = shape_apply_json_file(&s, path, &model, &ver, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "candidatez: unknown key"), "unknown key: %s", err);
    f = fopen(path, "w");
    if (f) {
        fputs("{\"users\": 0}", f);
        fclose(f);
    }
    rc = shape_apply_json_file(&s, path, &model, &ver, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "users"), "users 0: %s", err);
    unlink(path);
}

static void test_bodies(void)
{
    char *us[] = {"country", "lang"}, *cs[] = {"item"};
    lg_model m = {.name = "demo", .version = 1, .req_version = 0, .user_dense = 3, .cand_dense = 2,
                  .user_sparse = us, .n_user_sparse = 2, .cand_sparse = cs, .n_cand_sparse = 1,
                  .has_history = 1, .hist_max_len = 8, .hist_actions = 3, .n_tasks = 2};
    shape s;
    shape_defaults(&s);
    s.users = 4;
    char err[256];
    dist_parse(&s.candidates, "2..5", 0, 100, err, sizeof err);
    dist_parse(&s.user_ids, "1..3", 0, 100, err, sizeof err);
    s.repeat_users = 0.5;
    s.user_pool = 6;
    s.distinct = 20;
    s.top_k = 3;
    lg_bodies b;
    CHECK(lg_bodies_build(&b, &s, &m, err, sizeof err) == 0 && b.n == 20, "build: %s", err);
    int pool_seen = 0, bad = 0;
    uint8_t *pool_pack[6] = {0};
    size_t pool_len[6] = {0};
    for (int i = 0; i < b.n; i++) {
        Ikbo__V1__RankRequest *q = ikbo__v1__rank_request__unpack(NULL, b.b[i].len, b.b[i].data);
        if (!q) {
            bad++;
            continue;
        }
        bad += strcmp(q->model, "demo") != 0 || q->model_version != 0 || q->n_users != 4 || q->top_k != 3;
        bad += b.b[i].n_cands != q->n_candidates || b.b[i].n_expected_scores != 3;
        int per_user[4] = {0};
        for (size_t c = 0; c < q->n_candidates; c++) {
            Ikbo__V1__Candidate *cd = q->candidates[c];
            bad += cd->user >= 4 || cd->n_dense != 2 || cd->n_sparse != 1 || cd->sparse[0]->n_ids != 1;
            if (cd->user < 4) per_user[cd->user]++;
        }
        for (int j = 0; j < 4; j++) bad += per_user[j] < 2 || per_user[j] > 5;
        for (size_t j = 0; j < q->n_users; j++) {
            Ikbo__V1__User *u = q->users[j];
            bad += u->n_dense != 3 || u->n_sparse != 2 || u->n_history_ids != 8 || u->n_history_actions != 8;
            for (size_t k = 0; k < u->n_history_actions; k++) bad += u->history_actions[k] < 0 || u->history_actions[k] > 2;
            for (size_t k = 0; k < u->n_sparse; k++) bad += u->sparse[k]->n_ids < 1 || u->sparse[k]->n_ids > 3;
            int p;
            if (sscanf(u->key, "pool-%d", &p) == 1 && p >= 0 && p < 6) {
                pool_seen++;
                for (size_t k = 0; k < j; k++) bad += !strcmp(q->users[k]->key, u->key); /* distinct */
                size_t len = ikbo__v1__user__get_packed_size(u);
                uint8_t *pk = malloc(len);
                ikbo__v1__user__pack(u, pk);
                if (!pool_pack[p]) {
                    pool_pack[p] = pk;
                    pool_len[p] = len;
                } else {
                    bad += pool_len[p] != len || memcmp(pool_pack[p], pk, len); /* same content */
                    free(pk);
                }
            }
        }
        ikbo__v1__rank_request__free_unpacked(q, NULL);
    }
    CHECK(bad == 0, "%d malformed fields in generated requests", bad);
    CHECK(pool_seen > 10 && pool_seen < 70, "pool users %d of 80 slots (expected ~40)", pool_seen);
    for (int p = 0; p < 6; p++) free(pool_pack[p]);
    lg_bodies_free(&b);
    /* a model without history and sparse inputs gets neither */
    lg_model m2 = {.name = "plain", .user_dense = 1, .cand_dense = 1};
    shape_defaults(&s);
    s.distinct = 2;
    CHECK(lg_bodies_build(&b, &s, &m2, err, sizeof err) == 0, "build plain: %s", err);
    Ikbo__V1__RankRequest *q = ikbo__v1__rank_request__unpack(NULL, b.b[0].len, b.b[0].data);
    CHECK(q && q->n_users == 1 && q->users[0]->n_history_ids == 0 && q->users[0]->n_sparse == 0 &&
              q->n_candidates == 70 && b.b[0].n_expected_scores == 70,
          "plain model request");
    if (q) ikbo__v1__rank_request__free_unpacked(q, NULL);
    lg_bodies_free(&b);
}

/* ---- packed encoding --------------------------------------------------- */

static uint32_t rd_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int64_t rd_i64(const uint8_t *p) { return (int64_t)((uint64_t)rd_u32(p) | (uint64_t)rd_u32(p + 4) << 32); }

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

#define DIFF(...) (snprintf(why, n, __VA_ARGS__), -1)

/* count rows of `width` float32 in col against the classic rows. */
static int same_dense(const ProtobufCBinaryData *col, size_t count, float *const *rows,
                      const size_t *lens, const char *what, char *why, size_t n)
{
    size_t width = count ? lens[0] : 0;
    if (col->len != 4 * count * width) return DIFF("%s dense: %zu bytes for %zu x %zu", what, col->len, count, width);
    for (size_t i = 0; i < count; i++) {
        if (lens[i] != width) return DIFF("%s[%zu].dense: classic width %zu, packed %zu", what, i, lens[i], width);
        for (size_t k = 0; k < width; k++)
            if (rd_u32(col->data + 4 * (i * width + k)) != f32_bits(rows[i][k]))
                return DIFF("%s[%zu].dense[%zu] differs", what, i, k);
    }
    return 0;
}

typedef struct ent_bags {
    Ikbo__V1__SparseFeature **bags;
    size_t n;
} ent_bags;

static const Ikbo__V1__SparseFeature *bag_named(const ent_bags *e, const char *name)
{
    for (size_t j = 0; j < e->n; j++)
        if (!strcmp(e->bags[j]->name, name)) return e->bags[j];
    return NULL;
}

/* Every entity's bag of every feature (absent = empty) is the same. */
static int same_sparse(const ent_bags *e, size_t count, Ikbo__V1__PackedSparse *const *ps, size_t nps,
                       const char *what, char *why, size_t n)
{
    for (size_t f = 0; f < nps; f++) {
        const ProtobufCBinaryData *L = &ps[f]->lengths, *I = &ps[f]->ids;
        for (size_t g = 0; g < f; g++)
            if (!strcmp(ps[g]->name, ps[f]->name)) return DIFF("%s: packed feature '%s' twice", what, ps[f]->name);
        if (L->len != 4 * count) return DIFF("%s '%s': %zu length bytes for %zu", what, ps[f]->name, L->len, count);
        size_t off = 0;
        for (size_t i = 0; i < count; i++) {
            uint32_t k = rd_u32(L->data + 4 * i);
            const Ikbo__V1__SparseFeature *sf = bag_named(&e[i], ps[f]->name);
            if (k != (sf ? sf->n_ids : 0)) return DIFF("%s[%zu] '%s': %u ids packed", what, i, ps[f]->name, k);
            if (8 * (off + k) > I->len) return DIFF("%s '%s': ids shorter than the lengths", what, ps[f]->name);
            for (uint32_t x = 0; x < k; x++)
                if (rd_i64(I->data + 8 * (off + x)) != sf->ids[x])
                    return DIFF("%s[%zu] '%s' id %u differs", what, i, ps[f]->name, x);
            off += k;
        }
        if (8 * off != I->len) return DIFF("%s '%s': %zu id bytes for %zu ids", what, ps[f]->name, I->len, off);
    }
    for (size_t i = 0; i < count; i++)
        for (size_t j = 0; j < e[i].n; j++) {
            size_t f = 0;
            while (f < nps && strcmp(ps[f]->name, e[i].bags[j]->name)) f++;
            if (f == nps && e[i].bags[j]->n_ids)
                return DIFF("%s[%zu]: feature '%s' lost", what, i, e[i].bags[j]->name);
        }
    return 0;
}

static int same_history(const Ikbo__V1__RankRequest *c, const Ikbo__V1__PackedUsers *pu, char *why, size_t n)
{
    size_t total = 0;
    for (size_t i = 0; i < c->n_users; i++) total += c->users[i]->n_history_ids;
    if (!pu->history_lengths.len) return total ? DIFF("history: no lengths for %zu ids", total) : 0;
    if (pu->history_lengths.len != 4 * c->n_users || pu->history_ids.len != 8 * total)
        return DIFF("history: %zu length bytes, %zu id bytes", pu->history_lengths.len, pu->history_ids.len);
    if (pu->history_actions.len && pu->history_actions.len != 4 * total)
        return DIFF("history_actions: %zu bytes for %zu ids", pu->history_actions.len, total);
    size_t off = 0;
    for (size_t i = 0; i < c->n_users; i++) {
        const Ikbo__V1__User *u = c->users[i];
        if (rd_u32(pu->history_lengths.data + 4 * i) != u->n_history_ids) return DIFF("users[%zu] history length", i);
        for (size_t k = 0; k < u->n_history_ids; k++, off++) {
            int32_t act = pu->history_actions.len ? (int32_t)rd_u32(pu->history_actions.data + 4 * off) : 0;
            if (rd_i64(pu->history_ids.data + 8 * off) != u->history_ids[k] ||
                act != (u->n_history_actions ? u->history_actions[k] : 0))
                return DIFF("users[%zu] history event %zu differs", i, k);
        }
    }
    return 0;
}

static int same_users(const Ikbo__V1__RankRequest *c, const Ikbo__V1__PackedUsers *pu, char *why, size_t n)
{
    size_t count = c->n_users;
    if (pu->count != count) return DIFF("users: %u packed, %zu classic", pu->count, count);
    if (pu->n_keys && pu->n_keys != count) return DIFF("users: %zu keys for %zu", pu->n_keys, count);
    float **rows = calloc(count + 1, sizeof *rows);
    size_t *lens = calloc(count + 1, sizeof *lens);
    ent_bags *e = calloc(count + 1, sizeof *e);
    int rc = rows && lens && e ? 0 : DIFF("out of memory");
    for (size_t i = 0; !rc && i < count; i++) {
        const char *key = pu->n_keys ? pu->keys[i] : "";
        if (strcmp(key, c->users[i]->key)) rc = DIFF("users[%zu].key '%s' vs '%s'", i, key, c->users[i]->key);
        rows[i] = c->users[i]->dense;
        lens[i] = c->users[i]->n_dense;
        e[i] = (ent_bags){c->users[i]->sparse, c->users[i]->n_sparse};
    }
    if (!rc) rc = same_dense(&pu->dense, count, rows, lens, "users", why, n);
    if (!rc) rc = same_sparse(e, count, pu->sparse, pu->n_sparse, "users", why, n);
    if (!rc) rc = same_history(c, pu, why, n);
    free(rows);
    free(lens);
    free(e);
    return rc;
}

static int same_candidates(const Ikbo__V1__RankRequest *c, const Ikbo__V1__PackedCandidates *pc,
                           char *why, size_t n)
{
    size_t count = c->n_candidates;
    if (pc->count != count) return DIFF("candidates: %u packed, %zu classic", pc->count, count);
    if ((pc->ids.len && pc->ids.len != 8 * count) || pc->users.len != 4 * count)
        return DIFF("candidates: %zu id bytes, %zu user bytes for %zu", pc->ids.len, pc->users.len, count);
    float **rows = calloc(count + 1, sizeof *rows);
    size_t *lens = calloc(count + 1, sizeof *lens);
    ent_bags *e = calloc(count + 1, sizeof *e);
    int rc = rows && lens && e ? 0 : DIFF("out of memory");
    for (size_t i = 0; !rc && i < count; i++) {
        const Ikbo__V1__Candidate *cd = c->candidates[i];
        int64_t id = pc->ids.len ? rd_i64(pc->ids.data + 8 * i) : 0;
        if (id != cd->id || rd_u32(pc->users.data + 4 * i) != cd->user)
            rc = DIFF("candidates[%zu]: id or user differs", i);
        rows[i] = cd->dense;
        lens[i] = cd->n_dense;
        e[i] = (ent_bags){cd->sparse, cd->n_sparse};
    }
    if (!rc) rc = same_dense(&pc->dense, count, rows, lens, "candidates", why, n);
    if (!rc) rc = same_sparse(e, count, pc->sparse, pc->n_sparse, "candidates", why, n);
    free(rows);
    free(lens);
    free(e);
    return rc;
}

/* 0 when the classic request c and the packed request p carry the same
 * logical request; -1 with the first difference in why. */
static int same_request(const Ikbo__V1__RankRequest *c, const Ikbo__V1__RankRequest *p, char *why, size_t n)
{
    if (strcmp(c->model, p->model) || c->model_version != p->model_version || c->top_k != p->top_k ||
        strcmp(c->request_id, p->request_id))
        return DIFF("model, model_version, top_k or request_id differs");
    if (c->packed_users || c->packed_candidates) return DIFF("classic request has packed fields");
    if (p->n_users || p->n_candidates || !p->packed_users || !p->packed_candidates)
        return DIFF("packed request: %zu users, %zu candidates, packed_users %s, packed_candidates %s",
                    p->n_users, p->n_candidates, p->packed_users ? "set" : "absent",
                    p->packed_candidates ? "set" : "absent");
    if (same_users(c, p->packed_users, why, n)) return -1;
    return same_candidates(c, p->packed_candidates, why, n);
}

/* Both encodings of every body of (s, m) carry the same requests. */
static void check_encodings(shape *s, const lg_model *m, const char *label)
{
    lg_bodies bc, bp;
    char err[256], why[256];
    s->encoding = LG_ENC_CLASSIC;
    int rc = lg_bodies_build(&bc, s, m, err, sizeof err);
    CHECK(rc == 0, "%s: build classic: %s", label, err);
    if (rc) return;
    s->encoding = LG_ENC_PACKED;
    rc = lg_bodies_build(&bp, s, m, err, sizeof err);
    CHECK(rc == 0 && bp.n == bc.n, "%s: build packed: %s", label, err);
    if (rc) {
        lg_bodies_free(&bc);
        return;
    }
    int bad = 0;
    for (int i = 0; i < bc.n; i++) {
        Ikbo__V1__RankRequest *c = ikbo__v1__rank_request__unpack(NULL, bc.b[i].len, bc.b[i].data);
        Ikbo__V1__RankRequest *p = ikbo__v1__rank_request__unpack(NULL, bp.b[i].len, bp.b[i].data);
        if (!c || !p) {
            snprintf(why, sizeof why, "body does not unpack");
            rc = -1;
        } else {
            rc = same_request(c, p, why, sizeof why);
        }
        if (!rc && (bc.b[i].n_users != bp.b[i].n_users || bc.b[i].n_cands != bp.b[i].n_cands ||
                    bc.b[i].n_expected_scores != bp.b[i].n_expected_scores)) {
            snprintf(why, sizeof why, "body counts differ");
            rc = -1;
        }
        if (rc && !bad++) CHECK(0, "%s: request %d: %s", label, i, why);
        if (c) ikbo__v1__rank_request__free_unpacked(c, NULL);
        if (p) ikbo__v1__rank_request__free_unpacked(p, NULL);
    }
    CHECK(bad == 0, "%s: %d of %d packed requests differ from the classic ones", label, bad, bc.n);
    lg_bodies_free(&bc);
    lg_bodies_free(&bp);
    s->encoding = LG_ENC_CLASSIC;
}

/* Packs q, unpacks the result; NULL (err set) when packing fails. */
static Ikbo__V1__RankRequest *pack_unpack(const Ikbo__V1__RankRequest *q, char *err, size_t n)
{
    uint8_t *buf;
    size_t len;
    if (lg_pack_columnar(q, &buf, &len, err, n)) return NULL;
    Ikbo__V1__RankRequest *p = ikbo__v1__rank_request__unpack(NULL, len, buf);
    free(buf);
    if (!p) snprintf(err, n, "packed body does not unpack");
    return p;
}

/* Hand-built requests: the rules for optional columns and the errors. */
static void test_packed_edges(void)
{
    int64_t ids_a[] = {-5, INT64_MAX, 0}, ids_b[] = {INT64_MIN}, hist[] = {7, -8, 9};
    int32_t acts[] = {3, -1, 2};
    float d0[] = {1.5f, -0.0f}, d1[] = {NAN, 1e30f}, d2[] = {0.25f}, cd[] = {2.0f};
    Ikbo__V1__SparseFeature fa = IKBO__V1__SPARSE_FEATURE__INIT, fb = IKBO__V1__SPARSE_FEATURE__INIT,
                            fa2 = IKBO__V1__SPARSE_FEATURE__INIT;
    fa.name = "country", fa.n_ids = 3, fa.ids = ids_a;
    fb.name = "lang", fb.n_ids = 1, fb.ids = ids_b;
    fa2.name = "country", fa2.n_ids = 0;
    Ikbo__V1__SparseFeature *s0[] = {&fb, &fa}, *s1[] = {&fa2}, *dup[] = {&fa, &fa2};
    Ikbo__V1__User u[3] = {IKBO__V1__USER__INIT, IKBO__V1__USER__INIT, IKBO__V1__USER__INIT};
    /* user 0: actions; user 1: history without actions; user 2: no history */
    u[0].n_dense = 2, u[0].dense = d0, u[0].n_sparse = 2, u[0].sparse = s0;
    u[0].n_history_ids = 2, u[0].history_ids = hist, u[0].n_history_actions = 2, u[0].history_actions = acts;
    u[1].n_dense = 2, u[1].dense = d1, u[1].n_sparse = 1, u[1].sparse = s1;
    u[1].n_history_ids = 3, u[1].history_ids = hist;
    u[2].n_dense = 2, u[2].dense = d0;
    Ikbo__V1__User *up[] = {&u[0], &u[1], &u[2]};
    Ikbo__V1__Candidate c[2] = {IKBO__V1__CANDIDATE__INIT, IKBO__V1__CANDIDATE__INIT};
    c[0].id = -1, c[0].user = 2, c[0].n_dense = 1, c[0].dense = cd;
    c[1].id = 0, c[1].user = 7, c[1].n_dense = 1, c[1].dense = cd, c[1].n_sparse = 1, c[1].sparse = s0 + 1;
    Ikbo__V1__Candidate *cp[] = {&c[0], &c[1]};
    Ikbo__V1__RankRequest q = IKBO__V1__RANK_REQUEST__INIT;
    q.model = "demo", q.model_version = 4, q.top_k = 1, q.request_id = "edge";
    q.n_users = 3, q.users = up, q.n_candidates = 2, q.candidates = cp;
    char err[256] = "", why[256] = "";
    Ikbo__V1__RankRequest *p = pack_unpack(&q, err, sizeof err);
    CHECK(p && !same_request(&q, p, why, sizeof why), "edges: %s%s", err, why);
    CHECK(p && p->packed_users->n_keys == 0 && p->packed_users->history_actions.len == 4 * 5 &&
              p->packed_users->n_sparse == 2 && !strcmp(p->packed_users->sparse[0]->name, "lang"),
          "edges: no keys, actions zero-filled to 5 events, features in first appearance order");
    if (p) ikbo__v1__rank_request__free_unpacked(p, NULL);
    /* keys, no history, no candidates */
    u[1].key = "k1";
    u[0].n_history_ids = u[0].n_history_actions = u[1].n_history_ids = 0;
    q.n_candidates = 0;
    p = pack_unpack(&q, err, sizeof err);
    CHECK(p && !same_request(&q, p, why, sizeof why), "keys/no history/no candidates: %s%s", err, why);
    CHECK(p && p->packed_users->n_keys == 3 && !p->packed_users->history_lengths.len &&
              p->packed_candidates && p->packed_candidates->count == 0,
          "keys listed, no history column, empty packed_candidates present");
    if (p) ikbo__v1__rank_request__free_unpacked(p, NULL);
    /* what the packed encoding cannot carry */
    u[2].n_dense = 1, u[2].dense = d2;
    CHECK(!pack_unpack(&q, err, sizeof err) && strstr(err, "users[2].dense: 1 values, users[0] has 2"),
          "ragged user dense: %s", err);
    u[2].n_dense = 2, u[2].dense = d0;
    u[0].n_history_ids = 3, u[0].n_history_actions = 2;
    CHECK(!pack_unpack(&q, err, sizeof err) && strstr(err, "users[0].history_actions: 2 values for 3"),
          "actions not one per event: %s", err);
    u[0].n_history_ids = 2;
    q.n_candidates = 2;
    c[1].n_sparse = 2, c[1].sparse = dup;
    CHECK(!pack_unpack(&q, err, sizeof err) &&
              strstr(err, "candidates[1].sparse[1]: feature 'country' is also sparse[0]"),
          "feature twice: %s", err);
}

static void test_packed(void)
{
    char *us[] = {"country", "lang"}, *cs[] = {"item", "author"};
    lg_model m = {.name = "demo", .version = 1, .req_version = 3, .user_dense = 3, .cand_dense = 2,
                  .user_sparse = us, .n_user_sparse = 2, .cand_sparse = cs, .n_cand_sparse = 2,
                  .has_history = 1, .hist_max_len = 8, .hist_actions = 3, .n_tasks = 2};
    shape s;
    shape_defaults(&s);
    char err[256];
    s.users = 5;
    dist_parse(&s.candidates, "0..6", 0, 100, err, sizeof err);
    dist_parse(&s.history, "0..8", 0, 100, err, sizeof err);
    s.has_history = 1;
    dist_parse(&s.user_ids, "0..3", 0, 100, err, sizeof err); /* 0: the feature is absent */
    dist_parse(&s.cand_ids, "0,1,4", 0, 100, err, sizeof err);
    s.repeat_users = 0.4;
    s.user_pool = 7;
    s.shuffle = 1;
    s.top_k = 4;
    s.distinct = 40;
    s.seed = 99;
    check_encodings(&s, &m, "demo-like");
    lg_model m2 = {.name = "plain", .user_dense = 1, .cand_dense = 0};
    shape_defaults(&s);
    s.distinct = 3;
    check_encodings(&s, &m2, "plain");
    m.hist_actions = 0;
    shape_defaults(&s);
    s.users = 16;
    s.distinct = 4;
    check_encodings(&s, &m, "16 users, no actions");
    test_packed_edges();
}

int lg_self_test(void)
{
    test_hist();
    test_dist();
    test_spec();
    test_bodies();
    test_packed();
    printf("self-test: %d checks, %d failed\n", n_checks, n_failed);
    return n_failed ? 1 : 0;
}
