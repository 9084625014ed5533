/* http.h - the HTTP side door (libevent evhttp on its own thread).
 *
 * Why this exists: Prometheus scrapes, Kubernetes probes and humans with curl
 * speak HTTP, not gRPC. Routes:
 *   GET  /metrics                 Prometheus text exposition 0.0.4
 *   GET  /healthz                 200 "ok" while the process runs
 *   GET  /readyz                  200 "ready" when every model has a READY
 *                                 version (registry_all_ready: admin-unloaded
 *                                 models and models added while serving that
 *                                 have not loaded yet do not count) and the
 *                                 server is not draining; else 503 with the
 *                                 reason
 *   GET  /v1/models               models, versions, states, inputs, tasks (JSON)
 *   GET  /v1/models/{name}        one model (404 JSON when unknown)
 *   POST /v1/models/{name}:rank   a RankRequest in proto3 JSON -> RankResponse
 *                                 JSON; errors as request.h's JSON error body
 *                                 with rq_code_http's status (400, 404, 429,
 *                                 503, 504, 500). The body's "model" may be
 *                                 empty or must equal {name}. Optional
 *                                 header X-Request-Timeout-Ms: a deadline in
 *                                 ms from receipt (504 DEADLINE_EXCEEDED once
 *                                 passed, like a gRPC deadline).
 *   POST /v1/models/{name}/load   admin: (re)load the model now in the
 *                                 background (registry_admin_load); optional
 *                                 ?version=N loads that version and keeps it
 *                                 served on top of the version policy. 202
 *                                 {"model","version","status"}; 404 when the
 *                                 repository has no such model/version. Watch
 *                                 GET /v1/models/{name} for the result.
 *   POST /v1/models/{name}/unload admin: unload every version (requests get
 *                                 NOT_FOUND, health NOT_SERVING) or, with
 *                                 ?version=N, that version; 200 with the
 *                                 model's JSON. Held requests finish.
 *                                 Admin routes answer loopback peers only by
 *                                 default (403 otherwise; opts.admin), and
 *                                 only calls that a browser page of another
 *                                 site cannot make: header X-Ikbo-Admin: 1
 *                                 required, a foreign Origin or Sec-Fetch-Site
 *                                 refused (403 PERMISSION_DENIED naming why).
 *   anything else                 404 JSON (405 JSON for a known path with the
 *                                 wrong method)
 * HEAD on a GET route: GET's status and headers, Content-Length included,
 * no body. A body over max_body_bytes is refused by evhttp itself (413);
 * chunked bodies are decoded by http_chunked.h (extensions accepted, a
 * malformed chunk is 400 and closes the connection).
 * :rank goes through the model's batcher like gRPC (it may be merged with
 * gRPC requests) and is asynchronous: the HTTP thread hands it to
 * rank_submit and answers it from its event loop when the batcher is done,
 * serving other requests meanwhile (see http.c, "asynchronous :rank").
 *
 * Ownership: the pointers in opts must outlive the server. Thread-safety:
 * http_start/http_stop from one controlling thread; handlers run on the HTTP
 * thread only. http_stop lets the ranks in flight finish for up to wait_ms,
 * then cancels those still queued, and waits for every rank to be answered
 * before it frees anything, so it must run while the batchers still run
 * (before batcher_set_free).
 */
#ifndef IKBO_SERVER_HTTP_H
#define IKBO_SERVER_HTTP_H

#include <stdatomic.h>
#include <stdint.h>

#include "../engine/ikbo.h"
#include "metrics.h"
#include "rank.h"
#include "registry.h"

typedef struct http_server http_server;

/* Who may use the admin routes (config key admin_http). */
enum http_admin { HTTP_ADMIN_LOCAL = 0, HTTP_ADMIN_ANY = 1, HTTP_ADMIN_OFF = 2 };

typedef struct http_opts {
    const char *listen; /* "host:port" (IPv6 as "[::1]:8080"); port 0 = any free */
    uint32_t max_body_bytes;
    const rank_env *rank;
    registry *reg;
    metrics_server *metrics;
    const atomic_int *draining;
    enum http_admin admin;
} http_opts;

/* Binds and starts the HTTP thread. NULL with *err when it cannot bind. */
http_server *http_start(const http_opts *opts, ikbo_err *err);
int http_port(const http_server *h);
/* Refuses new ranks (503), lets those in flight finish for up to wait_ms
 * (0: cancels the queued ones at once), stops the loop, joins and frees. */
void http_stop(http_server *h, int wait_ms);

#endif
