/* batcher_set.h - the daemon's batchers, one per registry model version.
 *
 * Ownership: the set owns its batchers and a registry reference for each;
 * the registry outlives the set.
 */
#ifndef IKBO_BATCHER_SET_H
#define IKBO_BATCHER_SET_H

#include "batcher.h"
#include "registry.h"

/* A batcher set makes a model version's batcher on its first request, with
 * the limits batcher_resolve gives for the server config and the version's
 * serving settings (registry_model_serving: model.json "serving" < the
 * model's config.json "serving"; what neither sets comes from the server's
 * "batching" config), and instance i scoring with the registry's context
 * slot i (so the registry needs CONFIG_BATCH_MAX_INSTANCES slots). A batcher
 * holds its own registry reference to its version. Once a second, a reaper
 * frees every idle batcher whose version the registry has retired (swapped
 * out or unloaded), which releases that reference: queued and in-flight
 * requests on an old version finish on it. In the same rounds a watchdog
 * reports, once, the first batcher whose oldest batch has computed past its
 * batch_timeout_ms (batcher_busy_ms) to the lost callback with hung 1.
 * Thread-safety: submit from any thread; new/free from one thread. */
typedef struct batcher_set batcher_set;

/* lost (NULL: none) is every batcher's device_lost callback (batcher.h),
 * called with lost_arg. */
batcher_set *batcher_set_new(registry *reg, const config_batching *server, metrics_server *mx,
                             batcher_lost_fn lost, void *lost_arg, ikbo_err *err);

/* Reserves a place for a request of n_cands candidates in m's batcher (made
 * on first use; m is a handle the caller holds) and returns that batcher,
 * which stays valid while the reservation or the request is outstanding;
 * NULL with *st as batcher_reserve. */
batcher *batcher_set_reserve(batcher_set *s, registry_model *m, int n_cands, rq_status *st);

/* Finishes and frees every batcher (releasing their references). NULL ok. */
void batcher_set_free(batcher_set *s);

#endif
