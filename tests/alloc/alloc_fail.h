/* alloc_fail.h - allocation-failure injection for tests (SQLite's
 * test_malloc.c is the model): fail the N-th allocation on purpose, or
 * every one from the N-th on ("persistent"), count the blocks still live so
 * a test can assert that a failed operation leaked nothing, and record each
 * allocation call site so a sweep can say which out-of-memory branches it
 * reached.
 *
 * How it hooks in: the test binary is linked with
 *   -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=free,--wrap=strdup,
 *   --wrap=strndup,--wrap=posix_memalign,--wrap=aligned_alloc,
 *   --wrap=protobuf_c_message_unpack,--wrap=protobuf_c_message_free_unpacked,
 *   --wrap=log_thread_name
 * so only calls made from our own objects (engine, kernels, server, the
 * generated protobuf code, the test) go through alloc_fail.c; libraries keep
 * the real allocator, with two hand-offs routed here so that ownership
 * crossing the boundary stays accounted:
 * - jansson: af_init() installs the counting allocator with
 *   json_set_alloc_funcs, so a json_dumps() string our code free()s, and
 *   every jansson allocation, is counted (and can fail) like ours;
 * - protobuf-c: a message our code builds with malloc is freed by
 *   protobuf_c_message_free_unpacked(msg, NULL) inside the library; the
 *   wrapper passes a counting allocator where our code passes NULL (and to
 *   protobuf_c_message_unpack the same way).
 * A free() of a block the table does not know (libc's own, e.g. from
 * getline) goes to the real free and is counted in af_foreign_frees().
 *
 * Which allocations count: only those made on threads whose role is in the
 * armed mask. A thread's role comes from its log_thread_name() prefix
 * (ikbo-sweep: sweeper, ikbo-inst: instance, ikbo-done: completer,
 * ikbo-reaper, others), the calling thread is AF_MAIN after af_init(), so a
 * sweep over a multi-threaded path stays deterministic: the counted threads
 * hand one request to each other in turn.
 *
 * Thread-safety: every function may be called from any thread.
 */
#ifndef IKBO_TEST_ALLOC_FAIL_H
#define IKBO_TEST_ALLOC_FAIL_H

#include <stddef.h>
#include <stdio.h>

enum af_role {
    AF_MAIN = 1u << 0,     /* the test's thread(s) */
    AF_SWEEP = 1u << 1,    /* batcher sweeper (ikbo-sweep) */
    AF_INSTANCE = 1u << 2, /* batcher instance (ikbo-inst) */
    AF_COMPLETE = 1u << 3, /* batcher completer (ikbo-done) */
    AF_REAPER = 1u << 4,   /* batcher set reaper (ikbo-reaper) */
    AF_OTHER = 1u << 5,    /* any other thread */
    AF_ALL = (1u << 6) - 1,
    /* Not a thread: also count the allocations jansson and protobuf-c make
     * inside themselves (without it they pass through uncounted, which keeps
     * the sweeps of our own branches short). */
    AF_LIBS = 1u << 8,
};

/* Installs the jansson hook and makes the calling thread AF_MAIN. Call
 * first thing in main(), before any jansson object exists. */
void af_init(void);

/* The calling thread's role from now on. */
void af_set_role(unsigned role);

/* Starts counting allocations on threads in `roles`: the n-th (n >= 1) and,
 * when persistent, every later one fails. n == 0 counts without failing. */
void af_arm(long n, int persistent, unsigned roles);
/* Stops failing and counting; returns the number of failures injected. */
long af_disarm(void);
/* Allocations counted since af_arm. */
long af_count(void);

/* The call site of the last failure injected (0: none), and the same as
 * "exe+0xOFFSET" (for addr2line) or "lib+0xOFFSET" into buf. */
const char *af_last_failure(char *buf, size_t n);
/* 1 when the last failure injected was inside jansson. */
int af_last_failure_in_jansson(void);

/* Blocks (and bytes) allocated through the wrappers and not yet freed. */
long af_live(void);
size_t af_live_bytes(void);
/* A mark in the allocation sequence; af_dump_live writes up to max blocks
 * still live that were allocated after the mark (size, call site): what
 * leaked since. */
unsigned long af_mark(void);
void af_dump_live(FILE *f, unsigned long since, int max);
long af_foreign_frees(void);

/* The real allocator, for the test's own buffers (never counted). */
void *af_sys_malloc(size_t n);
void af_sys_free(void *p);

/* Call sites seen since the start, with how often each allocated while
 * counted and how often it was made to fail. Sites in the test binary are
 * written as "file:line calls failed" (addr2line, innermost inlined frame),
 * library-internal ones (jansson, protobuf-c) are summed per library.
 * Returns 0, or -1 when addr2line cannot be run. */
int af_write_sites(FILE *f);

#endif
