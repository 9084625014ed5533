/* fault.h - fault injection into a backend, for tests: fail the N-th device
 * allocation, kernel launch or stream wait of a chosen backend.
 *
 * Why this exists: a GPU fails in ways the CPU never does (cudaMalloc out of
 * memory while a new model version loads, a launch or a stream that reports
 * an error mid-batch). The server must then fail the load cleanly and keep
 * the previous version serving, or answer the failed batch's calls INTERNAL
 * and score the next batch. Those paths only run when something fails, so
 * tests make it fail on purpose, the way SQLite's test_malloc fails the N-th
 * allocation.
 *
 * Armed by the environment variable IKBO_FAULT, read once per process:
 *     IKBO_FAULT=RULE[,RULE...]    RULE = POINT:N[@B]
 *   POINT  alloc   device memory for buffers, weights, stream scratch
 *          launch  a kernel launch check (CUDA only; never fires on the CPU)
 *          sync    a stream wait (sync, download_f32)
 *          graph   a batch graph's instantiation or launch (CUDA only); the
 *                  engine then computes that batch without the graph
 *          lost    a stream wait that fails as on a lost device (a kernel
 *                  fault that leaves the CUDA context unusable): it and
 *                  every later wait of that backend fail, and be->lost
 *                  reports the loss (backend.h)
 *          hang    a stream wait that never returns, as on a kernel that
 *                  never finishes (the server's batch_timeout_ms watchdog)
 *   N      the N-th call at that point fails (1-based, counted per backend
 *          from its creation; calls inside the constructor do not count)
 *   B      only in the B-th backend this process creates (each model version
 *          load creates one; 1-based); without @B, in every backend
 * e.g. IKBO_FAULT=alloc:3@2 fails the 3rd allocation of the second model
 * version loaded. An injected failure takes the same path a real one does;
 * its message ends in "(injected by IKBO_FAULT)". A malformed IKBO_FAULT
 * makes every backend creation fail with a message naming it. Unset, the
 * cost is one load and compare per hook.
 *
 * Thread-safety: the counters are updated atomically; a backend's state is
 * written once, in bk_backend_new, before the backend is shared.
 */
#ifndef IKBO_FAULT_H
#define IKBO_FAULT_H

enum bk_fault_point {
    BK_FAULT_ALLOC = 0,
    BK_FAULT_LAUNCH = 1,
    BK_FAULT_SYNC = 2,
    BK_FAULT_GRAPH = 3,
    BK_FAULT_LOST = 4,
    BK_FAULT_HANG = 5,
    BK_FAULT_POINTS = 6
};

/* Per-backend state, embedded in bk_backend (zero = disarmed). */
typedef struct bk_fault {
    long fail_at[BK_FAULT_POINTS]; /* the call number that fails; 0 = never  */
    long calls[BK_FAULT_POINTS];   /* calls so far (only counted when armed) */
    int lost;                      /* the lost fault has fired (atomic)       */
} bk_fault;

#define BK_FAULT_INJECTED " (injected by IKBO_FAULT)"

/* One parsed rule; backend 0 = every backend. */
typedef struct bk_fault_rule {
    enum bk_fault_point point;
    long n;
    long backend;
} bk_fault_rule;

#define BK_FAULT_MAX_RULES 16

struct bk_err;

/* Parses spec into rules[0..max): the count, or -1 with err naming the bad
 * rule. Two rules for the same point and backend are an error. */
int bk_fault_parse(const char *spec, bk_fault_rule *rules, int max, struct bk_err *err);

/* The state of the next backend this process creates, from IKBO_FAULT:
 * 0 (out zeroed when unset), -1 with err set when IKBO_FAULT is malformed. */
int bk_fault_next_backend(bk_fault *out, struct bk_err *err);

/* 1 when this call at point p must fail. */
static inline int bk_fault_hit(bk_fault *f, enum bk_fault_point p)
{
    long at = f->fail_at[p];
    return at && __atomic_add_fetch(&f->calls[p], 1, __ATOMIC_RELAXED) == at;
}

/* The hooks of a stream wait (sync, download_f32): 0, or -1 with err
 * ("<what>: ... (injected by IKBO_FAULT)") when an injected sync fault
 * fires, or when the lost fault fires or has fired before; when the hang
 * fault fires it does not return. */
int bk_fault_wait(bk_fault *f, const char *what, struct bk_err *err);

/* 1 with why set once the lost fault has fired, else 0 (why untouched). */
int bk_fault_lost(bk_fault *f, struct bk_err *why);

#endif
