/* grpc_args.h - the channel arguments every gRPC server here is created
 * with: ikbo-serve (grpc_server.c) and the transport floor it is measured
 * against (bench/e2e/echo_server.c), so the two never drift apart.
 *
 * What is set and why (bench/RESULTS.md, "gRPC channel arguments", has the
 * measurements):
 * - max receive message = limits.max_message_bytes; max send unlimited;
 * - GRPC_ARG_MAX_METADATA_SIZE = the connection-wide ceiling (the per-call
 *   limit is the server's own check, grpc_server.h);
 * - GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES (the stream window the server
 *   advertises) and GRPC_ARG_HTTP2_MAX_FRAME_SIZE, both 4 MiB: a 16 x 70
 *   bench request (186 KB classic, 315 KB packed) then arrives without
 *   waiting for window updates. On the H200 host, 8 calls in flight against
 *   the echo floor: 4.8k instead of 4.0k requests/s classic, 4.5k instead of
 *   3.4k packed, p99 1.6 instead of 2.7 ms; one call in flight and 1 x 70
 *   unchanged within noise. Either alone gains less; BDP probing off loses.
 *   A stream buffers at most its window, and the server reads each request
 *   whole as soon as the call starts.
 * IKBO_GRPC_ARGS (environment) adds or overrides integer arguments for
 * tuning experiments: "grpc.http2.lookahead_bytes=1048576,grpc.http2.bdp_probe=0".
 *
 * Ownership: everything lives in the caller's grpc_args. Thread-safety:
 * reentrant; reads the environment.
 */
#ifndef IKBO_SERVER_GRPC_ARGS_H
#define IKBO_SERVER_GRPC_ARGS_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/grpc.h>

#define GRPCARGS_MAX 16
#define GRPCARGS_LOOKAHEAD_BYTES (4 << 20)
#define GRPCARGS_MAX_FRAME_SIZE (4 << 20)

typedef struct grpc_args {
    grpc_arg a[GRPCARGS_MAX];
    char keys[GRPCARGS_MAX][64];
    grpc_channel_args ch; /* pass &ch to grpc_server_create */
} grpc_args;

/* Fills g. max_message_bytes 0 = no limit. 0, or -1 with a one-line message
 * in err (a malformed IKBO_GRPC_ARGS, naming the entry). */
int grpc_args_server(grpc_args *g, uint32_t max_message_bytes, int metadata_ceiling, char *err,
                     size_t err_n);

#endif
