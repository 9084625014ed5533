/* health.h - grpc.health.v1 Health/Check answers.
 *
 * Why this exists: load balancers and orchestrators probe gRPC servers with
 * the standard health protocol. ikbo-serve answers for the whole server
 * (service "") and for each model by name, so a probe can wait for the model
 * it routes to:
 *   ""          SERVING, or NOT_SERVING while draining
 *   "<model>"   SERVING when the model has a READY version and the server
 *               is not draining, else NOT_SERVING
 *   unknown     status NOT_FOUND (as the health spec asks), no response
 * Watch is not implemented (answered UNIMPLEMENTED by the gRPC server).
 *
 * Thread-safety: health_check only reads the registry; call it from any
 * thread. Ownership: nothing is retained.
 */
#ifndef IKBO_SERVER_HEALTH_H
#define IKBO_SERVER_HEALTH_H

#include "grpc/health/v1/health.pb-c.h"
#include "registry.h"
#include "request.h"

/* Fills *out (initialized by the caller) and returns 0, or returns -1 with
 * *st = NOT_FOUND for an unknown service name. */
int health_check(registry *reg, int draining, const Grpc__Health__V1__HealthCheckRequest *req,
                 Grpc__Health__V1__HealthCheckResponse *out, rq_status *st);

#endif
