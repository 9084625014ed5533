/* fuzz_config.c - fuzz the JSON config file parser (config_apply_json in
 * server/config.c, what `--config FILE` runs through config_resolve ->
 * config_apply_file).
 *
 * Why this exists: a config file is operator input, but a typo must give a
 * clear error, never a crash, a leak or a half-freed config. The checks, on
 * every input (applied on top of the built-in defaults):
 *   - refused: a non-empty, NUL-terminated one-line message; config_free
 *     releases the partly updated config (ASan/LSan see any leak);
 *   - accepted: the resolved config renders (config_to_json); that rendering
 *     minus its "config_file" key is itself a valid config file, and
 *     applying it to fresh defaults renders the same again (every key the
 *     parser accepts round-trips through what the startup log prints).
 * Two builds: libFuzzer (-DLIBFUZZER) and the standalone corpus replayer +
 * mutation loop (fuzz_main.h) run by make test.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "server/config.h"

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_config: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    abort();
}

static void check_err(const ikbo_err *e)
{
    size_t n = strnlen(e->msg, sizeof e->msg);
    if (n == sizeof e->msg)
        die("error message not terminated", NULL);
    if (n == 0)
        die("empty error message", NULL);
    for (size_t i = 0; i < n; i++)
        if (e->msg[i] == '\n' || e->msg[i] == '\r')
            die("multi-line error message", e->msg);
}

/* The rendering of c without "config_file", as a config document. */
static char *as_config_file(const char *rendered)
{
    json_error_t je;
    json_t *o = json_loads(rendered, 0, &je);
    if (!o || !json_is_object(o))
        die("config_to_json is not a JSON object", je.text);
    json_object_del(o, "config_file");
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!s)
        abort();
    return s;
}

static unsigned long n_ok, n_refused;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    config c;
    ikbo_err e;
    memset(&e, 0, sizeof e);
    if (config_defaults(&c, &e))
        die("config_defaults", e.msg);
    if (config_apply_json(&c, (const char *)data, size, &e)) {
        n_refused++;
        check_err(&e);
        config_free(&c);
        return 0;
    }
    n_ok++;
    char *r1 = config_to_json(&c);
    if (!r1)
        die("config_to_json failed on an accepted config", NULL);
    config_free(&c);

    char *doc = as_config_file(r1);
    if (config_defaults(&c, &e))
        die("config_defaults", e.msg);
    if (config_apply_json(&c, doc, strlen(doc), &e)) {
        fprintf(stderr, "fuzz_config: rendered config: %s\n", doc);
        die("the rendering of an accepted config is refused", e.msg);
    }
    char *r2 = config_to_json(&c);
    if (!r2)
        die("config_to_json failed on the re-applied config", NULL);
    if (strcmp(r1, r2) != 0) {
        fprintf(stderr, "fuzz_config: first:  %s\nfuzz_config: second: %s\n", r1, r2);
        die("the config does not round-trip through its rendering", NULL);
    }
    free(r1);
    free(r2);
    free(doc);
    config_free(&c);
    return 0;
}

#ifndef LIBFUZZER

#include "fuzz_main.h"

static const fz_token config_tokens[] = {
    FZ_TOK("\""), FZ_TOK("{"), FZ_TOK("}"), FZ_TOK("["), FZ_TOK("]"), FZ_TOK(","),
    FZ_TOK(":"), FZ_TOK("null"), FZ_TOK("true"), FZ_TOK("-1"), FZ_TOK("0"), FZ_TOK("1"),
    FZ_TOK("1.5"), FZ_TOK("2147483648"), FZ_TOK("9223372036854775807"), FZ_TOK("\"\""),
    FZ_TOK("\"grpc_listen\""), FZ_TOK("\"http_listen\""), FZ_TOK("\"model_repository\""),
    FZ_TOK("\"models\""), FZ_TOK("\"device\""), FZ_TOK("\"mode\""), FZ_TOK("\"threads\""),
    FZ_TOK("\"limits\""), FZ_TOK("\"log\""), FZ_TOK("\"drain_timeout_ms\""),
    FZ_TOK("\"tls\""), FZ_TOK("\"batching\""), FZ_TOK("\"repository_poll_ms\""),
    FZ_TOK("\"repository_settle_ms\""), FZ_TOK("\"version_policy\""),
    FZ_TOK("\"model_policy\""), FZ_TOK("\"admin_http\""), FZ_TOK("\"latest\""),
    FZ_TOK("\"versions\""), FZ_TOK("\"cert_file\""), FZ_TOK("\"key_file\""),
    FZ_TOK("\"client_ca_file\""), FZ_TOK("\"max_users\""), FZ_TOK("\"max_message_bytes\""),
    FZ_TOK("\"instances\""), FZ_TOK("\"max_batch_candidates\""), FZ_TOK("\"level\""),
    FZ_TOK("\"format\""), FZ_TOK("\"cuda:0\""), FZ_TOK("\"cuda:99999999999\""),
    FZ_TOK("\"cpu\""), FZ_TOK("\"broadcast\""), FZ_TOK("\"json\""), FZ_TOK("\"debug\""),
    FZ_TOK("\"local\""), FZ_TOK("\"any\""), FZ_TOK("\"off\""), FZ_TOK("\"[::1]:1\""),
    FZ_TOK("\"host:\""), FZ_TOK("\":80\""), FZ_TOK("\"a/b\""), FZ_TOK("\"..\""),
    FZ_TOK("\"\\u0000\""), FZ_TOK("\x00"),
};
static const fz_dict config_dict = {config_tokens, sizeof config_tokens / sizeof config_tokens[0]};

static void report(void) { printf(": %lu accepted, %lu refused", n_ok, n_refused); }

int main(int argc, char **argv)
{
    static const fz_target t = {"fuzz_config", &config_dict, 20000, NULL, report};
    return fz_main(argc, argv, &t);
}

#endif
