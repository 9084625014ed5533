/* health.c - grpc.health.v1 Check semantics (see health.h). */
#include "health.h"

#include <ctype.h>
#include <stdio.h>

int health_check(registry *reg, int draining, const Grpc__Health__V1__HealthCheckRequest *req,
                 Grpc__Health__V1__HealthCheckResponse *out, rq_status *st)
{
    const char *service = req && req->service ? req->service : "";
    if (!*service) {
        out->status = draining ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
                               : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
        rq_status_ok(st);
        return 0;
    }
    int ready = registry_model_ready(reg, service);
    if (ready < 0) {
        char sn[132];
        size_t j = 0;
        for (const char *s = service; *s && j + 1 < sizeof sn; s++)
            sn[j++] = isprint((unsigned char)*s) ? *s : '?';
        sn[j] = '\0';
        return rq_status_set(st, RQ_NOT_FOUND, "unknown service '%s' (a model name, or \"\")",
                             sn);
    }
    out->status = ready && !draining
                      ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                      : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
    rq_status_ok(st);
    return 0;
}
