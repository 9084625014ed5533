/* grpc_server.h - the gRPC front end on gRPC core's C API.
 *
 * Why this exists: ikbo.v1.Ranker (Rank, ModelInfo) and grpc.health.v1
 * Health/Check are served without the C++ library: one grpc_server, N worker
 * threads, each with its own completion queue on which it requests calls for
 * every registered method (with the request message read up front) plus a
 * generic request that answers unknown methods UNIMPLEMENTED. A worker
 * unpacks, validates and plans a Rank call and submits it to the model's
 * batcher (rank_submit), then goes back to its queue: it never waits for
 * compute. The answer (message + status in one batch) is sent by the batcher
 * instance thread that scored the request (grpc_call_start_batch may be
 * called from any thread). A close op started when each call arrives tells
 * the batcher when the client has gone away (cancelled calls are not
 * computed). ModelInfo and Health are answered on the worker.
 *
 * Functions use the prefix grpcsrv_: grpc_server_* is gRPC core's namespace.
 *
 * Limits: a request over max_message_bytes is refused by gRPC core with
 * RESOURCE_EXHAUSTED before it reaches a worker. Request metadata is limited
 * per call: gRPC core 1.51's own limit (GRPC_ARG_MAX_METADATA_SIZE) fails
 * the whole connection when one header block exceeds it (the HPACK parser's
 * error carries no stream id, so chttp2 closes the transport and every call
 * on it), so core's is set to GRPCSRV_METADATA_CEILING, a hard ceiling, and
 * a worker refuses a call whose metadata (name + value + 32 per entry, as
 * HTTP/2 counts a header list, over what core hands the application) is
 * over max_metadata_bytes with RESOURCE_EXHAUSTED, alone. A header block over
 * the ceiling still closes its connection.
 * Compression: core decompresses gzip and deflate. A message whose
 * compressed flag is set but which core did not decompress (grpc-encoding
 * absent or identity; core 1.51 also reads a grpc-encoding it does not know,
 * e.g. snappy, as identity) is refused INTERNAL. The flag is read through
 * core's test-only grpc_call_test_only_get_message_flags, the only place the
 * C API exposes it. A message with flag 0 is served whatever grpc-encoding
 * says (flag 0 means not compressed).
 * Deadlines: core rounds grpc-timeout up to whole milliseconds (1n, 1u ->
 * 1m) on a millisecond clock, so a sub-millisecond timeout leaves the call up
 * to 1 ms; a Rank whose deadline passed when it is submitted, before scoring
 * or while queued is answered DEADLINE_EXCEEDED without being computed.
 * Draining: once *draining is set, Rank and ModelInfo calls that reach a
 * worker are answered UNAVAILABLE; Health/Check keeps answering
 * (NOT_SERVING). grpcsrv_shutdown first waits, with the port still open,
 * until no call has arrived for 200 ms (at most half of drain_timeout_ms):
 * gRPC core answers CANCELLED, not UNAVAILABLE, to a stream that reaches it
 * after grpc_server_shutdown_and_notify, and the C API cannot send GOAWAY
 * first. Then it stops accepting, lets in-flight calls finish for the rest of
 * drain_timeout_ms, and cancels what is left; once none is in flight, client
 * connections still open (idle channels) are closed after a 1 s settle
 * rather than left to hold core's shutdown until its own timer. A client that ignores
 * UNAVAILABLE and keeps sending until the very end can still see CANCELLED
 * for a call racing the shutdown.
 *
 * Ownership: grpcsrv_start copies what it needs from opts except the
 * pointers (rank env, registry, metrics, draining flag), which must outlive
 * the server. Thread-safety: start, shutdown and free are called from one
 * controlling thread; the workers are internal. gRPC core must be
 * initialized (grpc_init) for the server's whole life.
 */
#ifndef IKBO_SERVER_GRPC_SERVER_H
#define IKBO_SERVER_GRPC_SERVER_H

#include <stdatomic.h>
#include <stdint.h>

#include "../engine/ikbo.h"
#include "metrics.h"
#include "rank.h"
#include "registry.h"

/* gRPC core's metadata limit (GRPC_ARG_MAX_METADATA_SIZE, HTTP/2
 * SETTINGS_MAX_HEADER_LIST_SIZE): a header block over it closes the
 * connection. A quarter of it at most is left to max_metadata_bytes, the
 * rest to the headers core consumes itself (:path, grpc-timeout, ...). */
#define GRPCSRV_METADATA_CEILING (1u << 20)

typedef struct grpcsrv grpcsrv;

typedef struct grpcsrv_opts {
    const char *listen; /* "host:port"; port 0 picks a free port */
    int threads;        /* worker threads (receive, validate, plan, submit) */
    uint32_t max_message_bytes;
    /* Request metadata per call, 1..GRPCSRV_METADATA_CEILING / 4 (0 = 8192). */
    uint32_t max_metadata_bytes;
    /* TLS: both NULL = plaintext; cert+key = TLS; + client CA = mutual TLS. */
    const char *tls_cert_file, *tls_key_file, *tls_client_ca_file;
    const rank_env *rank;
    registry *reg;
    metrics_server *metrics;
    const atomic_int *draining;
} grpcsrv_opts;

/* Binds, starts the server and its workers. NULL with *err when the port
 * cannot be bound, a TLS file cannot be read or max_metadata_bytes is out of
 * range. */
grpcsrv *grpcsrv_start(const grpcsrv_opts *opts, ikbo_err *err);

/* The bound port (useful with port 0). */
int grpcsrv_port(const grpcsrv *s);

/* Stops accepting and waits for in-flight calls, at most drain_timeout_ms;
 * then cancels what is left. Returns the number of milliseconds the drain
 * took, or -1 when calls had to be cancelled. Call once. */
int grpcsrv_shutdown(grpcsrv *s, int drain_timeout_ms);

/* Stops the workers and frees everything (shuts down first if needed). */
void grpcsrv_free(grpcsrv *s);

#endif
