/* ikbo_score.c - offline scorer: one JSON request through the same request
 * path as the daemon (validate, dedup, plan) and the engine, scores printed
 * in the request's candidate order. The golden tests compare it with the
 * PyTorch reference; it is also a quick way to try a model without a server.
 *
 * Exit status: 0 ok, 1 usage, 2 any error (printed as
 * `ikbo-score: <CODE>: <message>` on stderr).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/ikbo.h"
#include "server/request.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ikbo-score [--mode ikbo|broadcast] [--device cpu|cuda:N] [--no-fold] [--no-lane] "
            "MODEL_VERSION_DIR "
            "REQUEST.json\n"
            "Scores one JSON RankRequest (proto3 JSON) with the model in MODEL_VERSION_DIR\n"
            "(<repo>/<name>/<version>) and prints {\"scores\": [...], \"task_scores\": [[...], ...]}\n"
            "in the request's candidate order (top_k is ignored). REQUEST.json may be - for stdin.\n"
            "  --mode MODE     ikbo (default) or broadcast\n"
            "  --device DEV    cpu (default) or cuda:N\n"
            "  --no-fold       run lce -> flatten -> linear chains as written (engine/fold.h)\n"
            "  --no-lane       every layer on one stream (engine/lane.h; cuda)\n"
            "  --help          print this help\n");
}

/* %.9g round-trips a float; non-finite as Python's json spells them. */
static void put_float(const char *sep, float f)
{
    if (f != f)
        printf("%sNaN", sep);
    else if (f > 3.4028235e38f || f < -3.4028235e38f)
        printf("%s%sInfinity", sep, f < 0 ? "-" : "");
    else
        printf("%s%.9g", sep, (double)f);
}

static int die(int code, const char *msg)
{
    fprintf(stderr, "ikbo-score: %s: %s\n", rq_code_name(code), msg);
    return 2;
}

static char *read_all(const char *path, size_t *len, rq_status *st)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        rq_status_set(st, RQ_INVALID_ARGUMENT, "%s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? 2 * cap : 1 << 16;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                if (f != stdin)
                    fclose(f);
                rq_status_set(st, RQ_INTERNAL, "out of memory");
                return NULL;
            }
            buf = nb;
        }
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (!k)
            break;
    }
    int bad = ferror(f);
    if (f != stdin)
        fclose(f);
    if (bad) {
        free(buf);
        rq_status_set(st, RQ_INVALID_ARGUMENT, "%s: read error", path);
        return NULL;
    }
    *len = n;
    return buf;
}

int main(int argc, char **argv)
{
    ikbo_load_opts lo = {.device = "cpu", .mode = IKBO_MODE_IKBO};
    const char *pos[2];
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--mode") || !strcmp(a, "--device")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "ikbo-score: %s needs a value\n", a);
                usage(stderr);
                return 1;
            }
            const char *v = argv[++i];
            if (!strcmp(a, "--device")) {
                lo.device = v;
            } else if (ikbo_mode_parse(v, &lo.mode) != 0) {
                fprintf(stderr, "ikbo-score: --mode: expected ikbo or broadcast, got \"%s\"\n", v);
                return 1;
            }
        } else if (!strcmp(a, "--no-fold")) {
            lo.no_fold = 1;
        } else if (!strcmp(a, "--no-lane")) {
            lo.no_lane = 1;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "ikbo-score: unknown flag %s\n", a);
            usage(stderr);
            return 1;
        } else if (npos < 2) {
            pos[npos++] = a;
        } else {
            fprintf(stderr, "ikbo-score: too many arguments\n");
            usage(stderr);
            return 1;
        }
    }
    if (npos != 2) {
        usage(stderr);
        return 1;
    }

    rq_status st;
    ikbo_err err = {{0}};
    size_t len = 0;
    char *text = read_all(pos[1], &len, &st);
    if (!text)
        return die(st.code, st.msg);
    Ikbo__V1__RankRequest *req = rq_request_from_json(text, len, &st);
    free(text);
    if (!req)
        return die(st.code, st.msg);

    int rc = 2;
    ikbo_model *m = ikbo_model_load(pos[0], &lo, &err);
    ikbo_ctx *ctx = NULL;
    rq_plan *plan = NULL;
    float *task = NULL, *scores = NULL;
    if (!m) {
        die(RQ_INTERNAL, err.msg);
        goto out;
    }
    const ikbo_model_info *mi = ikbo_model_get_info(m);
    rq_limits lim;
    rq_limits_default(&lim);
    if (!(plan = rq_prepare(req, mi, &lim, &st))) {
        die(st.code, st.msg);
        goto out;
    }
    ctx = ikbo_ctx_new(m, &err);
    if (!ctx) {
        die(RQ_INTERNAL, err.msg);
        goto out;
    }
    const size_t C = (size_t)plan->batch.n_cands, T = (size_t)mi->n_tasks;
    task = malloc((C * T + 1) * sizeof *task);
    scores = malloc((C + 1) * sizeof *scores);
    if (!task || !scores) {
        die(RQ_INTERNAL, "out of memory");
        goto out;
    }
    if (ikbo_score(ctx, &plan->batch, task, scores, &err)) {
        die(RQ_INTERNAL, err.msg);
        goto out;
    }

    /* batch row of each request position */
    size_t *inv = malloc((C + 1) * sizeof *inv);
    if (!inv) {
        die(RQ_INTERNAL, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < C; i++)
        inv[plan->order[i]] = i;
    printf("{\"scores\": [");
    for (size_t k = 0; k < C; k++)
        put_float(k ? ", " : "", scores[inv[k]]);
    printf("], \"task_scores\": [");
    for (size_t k = 0; k < C; k++) {
        printf("%s[", k ? ", " : "");
        for (size_t t = 0; t < T; t++)
            put_float(t ? ", " : "", task[inv[k] * T + t]);
        printf("]");
    }
    printf("]}\n");
    free(inv);
    rc = fflush(stdout) ? die(RQ_INTERNAL, "write error on stdout") : 0;
out:
    free(task);
    free(scores);
    rq_plan_free(plan);
    ikbo_ctx_free(ctx);
    ikbo_model_free(m);
    rq_request_free(req);
    return rc;
}
