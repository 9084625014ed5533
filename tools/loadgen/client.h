/* client.h - the gRPC core client pieces ikbo-loadgen shares: channels,
 * waiting for a connection, one blocking unary call (ModelInfo), status
 * names.
 *
 * Why on gRPC core's C API: the project is C, and the core API lets one
 * thread keep thousands of calls in flight on one completion queue with no
 * per-call thread or allocation beyond the call itself.
 *
 * Ownership: channels are the caller's (grpc_channel_destroy); *details and
 * *resp from lg_unary are malloc'd (free()). Thread-safety: gRPC channels may
 * be shared by threads; everything here is reentrant. grpc_init must have
 * been called.
 */
#ifndef IKBO_LOADGEN_CLIENT_H
#define IKBO_LOADGEN_CLIENT_H

#include <grpc/grpc.h>
#include <stddef.h>
#include <stdint.h>

#define LG_N_CODES 17 /* gRPC status codes 0..16 */

/* An insecure channel to target ("host:port", "unix:PATH", ...) with its own
 * connection (a local subchannel pool: channels made here never share a TCP
 * connection) and unlimited message sizes. */
grpc_channel *lg_channel_new(const char *target, int id);

/* Waits until the channel is READY. Returns 0, or -1 after timeout_ms. */
int lg_channel_wait_ready(grpc_channel *ch, int timeout_ms);

/* One unary call, blocking. Returns 0 when a status came back (*code set,
 * *details malloc'd, *resp and *resp_len the response bytes when OK), -1 when the
 * call could not be started. */
int lg_unary(grpc_channel *ch, const char *method, const uint8_t *req, size_t req_len,
             int timeout_ms, int *code, char **details, uint8_t **resp, size_t *resp_len);

/* "OK", "CANCELLED", ... "UNAUTHENTICATED"; "CODE_<n>" beyond 16 (static
 * storage for the known names; a thread-local buffer otherwise). */
const char *lg_code_name(int code);

/* Copies a byte buffer's contents into one malloc'd array (NULL on failure
 * or a NULL buffer; *len 0). */
uint8_t *lg_byte_buffer_read(grpc_byte_buffer *bb, size_t *len);

#endif
