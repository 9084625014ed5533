/* repo_watch.h - what a model repository holds on disk, for the registry's
 * poller: model and version directories, whether a version directory has
 * stopped changing, the per-model config file, and how much memory loading a
 * version would take.
 *
 * Why a module of its own: these are the file-system questions (readdir,
 * stat, a safetensors header, /proc/meminfo) behind the registry's state
 * machine; keeping them here keeps registry.c about states, references and
 * threads, and makes each rule testable on a plain directory.
 *
 * Layout: <repo>/<name>/<N>/model.json + weights.safetensors, N a positive
 * integer written in digits. Optional <repo>/<name>/config.json: per-model
 * overrides for every version of that model (see repo_read_model_config).
 *
 * Completeness rule (the registry applies it; here are its inputs): a version
 * directory counts only once it holds model.json; repo_list_versions gives a
 * signature of the directory (each entry's name, type, size and mtime) that
 * the poller compares across looks, and the newest change time in it, to
 * see that the directory is at rest.
 *
 * Thread-safety: no state; every function may run on any thread.
 * Ownership: arrays returned are malloc'd and the caller's.
 */
#ifndef IKBO_SERVER_REPO_WATCH_H
#define IKBO_SERVER_REPO_WATCH_H

#include <stdint.h>

#include "../engine/serving.h" /* ikbo_serving; serving_unset, serving_merge */

typedef struct repo_version {
    int64_t version;
    uint64_t sig;       /* changes when any entry of the directory changes */
    int64_t changed_ms; /* newest ctime/mtime of the directory and its entries
                           (CLOCK_REALTIME, ms) */
} repo_version;

/* Version directories of model_dir holding model.json, newest first, into
 * *out (count returned; free(*out)). A directory whose name is all digits but
 * that lacks model.json is not listed (incomplete). Returns -1 with *err when
 * model_dir cannot be read (named, with the system's reason). */
int repo_list_versions(const char *model_dir, repo_version **out, ikbo_err *err);

/* Names of the model directories of repo: subdirectories (symlinks
 * followed) not starting with '.' that hold at least one all-digit
 * directory. Sorted; free each and the array with repo_free_names. -1 with
 * *err when repo cannot be read. */
int repo_list_models(const char *repo, char ***names, ikbo_err *err);
void repo_free_names(char **names, int n);

/* <model_dir>/config.json, the per-model override file:
 *   {"serving": {"max_batch_candidates": N, "max_batch_users": N,
 *                "max_queue_delay_us": N, "instances": N,
 *                "mode": "ikbo"|"broadcast", "device": "cpu"|"cuda:N"}}
 * every key optional, read by the key table model.json's "serving" uses
 * (engine/serving.h: same keys, ranges and messages); unknown keys are
 * errors. A missing file is no overrides (returns 0, *out unset: see
 * serving_unset; serving_merge applies it). -1 with *err naming the file
 * and key ("<file>: serving.instances: expected integer 0..64, got 65"). */
int repo_read_model_config(const char *model_dir, ikbo_serving *out, ikbo_err *err);

/* Bytes loading version_dir on device needs: host (the fp32 staging copy
 * of every weight the loader makes, plus the largest tensor) and device
 * (fp32 weights; 0 for cpu). From the safetensors header; when the header
 * cannot be read the file size stands in (the load will then report the
 * real problem). Returns 0, -1 when weights.safetensors cannot be stat'd
 * (no estimate; the load will fail and say why). */
int repo_estimate_memory(const char *version_dir, const char *device, uint64_t *host_bytes,
                         uint64_t *device_bytes);

/* Refuses a load that would not fit: the estimate against MemAvailable
 * (/proc/meminfo) or the room under the cgroup memory limit (v2 or v1, file
 * cache not counted), less a reserve, and for cuda:N against the GPU's free
 * memory when the CUDA runtime answers. 0 = go ahead (also when nothing can
 * be measured); -1 with *err like "<dir>: not loaded: needs about 4096 MiB
 * of host memory, 1200 MiB available". */
int repo_memory_check(const char *version_dir, const char *device, ikbo_err *err);

#endif
