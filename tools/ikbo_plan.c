/* ikbo_plan.c - build/ikbo-plan: what the engine's planner makes of a model.
 *
 * Why this exists: a model written in broadcast form ("planning": "auto")
 * is rewritten at load; before deploying it, an engineer wants to see, per
 * model.json layer, where it runs (U or C rows), the rewrite applied or why
 * it broadcasts, the weight split, and FLOPs and bytes per candidate before
 * and after. The same report is in GET /v1/models/{name}. Loads the model
 * without a backend (no device needed).
 *
 *     ikbo-plan [--json] [--ratio R] MODEL_VERSION_DIR
 *
 * Exit 0 and the report on stdout; exit 2 and one line on stderr for a bad
 * model (the load error, naming the file, layer or tensor) or bad flags.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/ikbo.h"

#define DEFAULT_RATIO 70.0 /* the bench shape: 16 users x 70 candidates */

static int usage(FILE *f, int rc)
{
    fprintf(f, "usage: ikbo-plan [--json] [--ratio R] MODEL_VERSION_DIR\n"
               "Prints the engine's plan of the model: per model.json layer its domain, rows\n"
               "(U or C), the rewrite applied or why it broadcasts, the weight split, FLOPs and\n"
               "bytes per candidate before (broadcast form) and after; then the totals.\n"
               "  --json     the report as JSON (README, \"Plan report\", lists the keys)\n"
               "  --ratio R  candidates per user for the per-candidate figures (default %.0f)\n"
               "  --help     print this help\n",
            DEFAULT_RATIO);
    return rc;
}

int main(int argc, char **argv)
{
    int json = 0;
    double ratio = DEFAULT_RATIO;
    const char *dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (strcmp(argv[i], "--ratio") == 0 && i + 1 < argc) {
            char *end;
            ratio = strtod(argv[++i], &end);
            if (*end || !(ratio >= 1 && ratio <= 1e9)) {
                fprintf(stderr, "ikbo-plan: --ratio must be a number in [1, 1e9], got '%s'\n",
                        argv[i]);
                return 2;
            }
        } else if (strcmp(argv[i], "--help") == 0) {
            return usage(stdout, 0);
        } else if (argv[i][0] == '-' || dir) {
            fprintf(stderr, "ikbo-plan: unexpected argument '%s'\n", argv[i]);
            return usage(stderr, 2);
        } else {
            dir = argv[i];
        }
    }
    if (!dir) return usage(stderr, 2);
    char *out;
    ikbo_err err = {{0}};
    if (ikbo_plan_dir(dir, json, ratio, &out, &err)) {
        fprintf(stderr, "ikbo-plan: %s\n", err.msg);
        return 2;
    }
    fputs(out, stdout);
    if (json) fputc('\n', stdout);
    free(out);
    return 0;
}
