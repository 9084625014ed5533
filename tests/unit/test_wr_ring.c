/* test_wr_ring.c - linear_wr.cu's ring schedule (kernels/cuda/wr_ring.h)
 * against every order in which a CTA's tile loads can land.
 *
 * Why this exists: the kernel lost the device under the daemon's concurrent
 * batches because its schedule let a consumer's parity wait pass on the
 * other consumer's pending phase (bench/RESULTS.md, 2026-12-05), and no
 * single-stream GPU check caught it: it needs loads landing out of order.
 * Here the protocol is modelled on the CPU with the kernel's own schedule
 * functions: one producer issuing tiles in order once the slot's empty
 * barrier allows, loads landing in any order, two consumers that wait on
 * their tile's full barrier, read the slot, then release it. An mbarrier is
 * its count of completed phases; a parity wait passes when that count's
 * parity differs from the one asked for, as on the device. A depth-first
 * walk over every interleaving (states memoised) fails if a consumer's wait
 * can pass before its own tile has landed in the slot, or if the ring can
 * stall. The walk must also find the race in the schedule that shipped
 * before the fix (one full barrier per slot), or the model proves nothing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/wr_ring.h"

/* A schedule: what the kernel computes for tile i (consumer i % 2 takes
 * it, as wr_consumer says and test_schedule_is_consistent checks). */
typedef struct sched {
    int (*slot)(int i);
    int (*full_bar)(int i);
    unsigned (*full_parity)(int i);
    unsigned (*empty_parity)(int i);
} sched;

static const sched shipped = {wr_slot, wr_full_bar, wr_full_parity, wr_empty_parity};

/* Before the fix: the full barrier was the slot's own. */
static int old_full_bar(int i) { return i % WR_STAGES; }
static unsigned old_full_parity(int i) { return (unsigned)(i / WR_STAGES) & 1u; }
static const sched before_fix = {wr_slot, old_full_bar, old_full_parity, wr_empty_parity};

#define NT 14 /* tiles in a CTA: more than two rounds of every full barrier */
#define NK (NT / WR_CONSUMERS + 2)

/* The state: tiles issued (p), which have landed, and where each consumer
 * is (its k-th tile, waiting or holding the slot). Barrier counts follow. */
typedef struct walk {
    const sched *s;
    unsigned char *seen;
    int p, landed[NT], k[WR_CONSUMERS], hold[WR_CONSUMERS];
    long states;
    int early, stalls, finals;
} walk;

static int tile_of(const walk *w, int c) { return c + WR_CONSUMERS * w->k[c]; }

static size_t state_index(const walk *w)
{
    size_t x = (size_t)w->p, mask = 0;
    for (int t = 0; t < NT; t++)
        mask |= (size_t)w->landed[t] << t;
    x = x * ((size_t)1 << NT) + mask;
    for (int c = 0; c < WR_CONSUMERS; c++)
        x = (x * NK + (size_t)w->k[c]) * 2 + (size_t)w->hold[c];
    return x;
}

static size_t state_count(void)
{
    size_t n = (size_t)(NT + 1) << NT;
    for (int c = 0; c < WR_CONSUMERS; c++)
        n *= (size_t)NK * 2;
    return n;
}

static int passes(int completed, unsigned parity) { return ((unsigned)completed & 1u) != parity; }

/* Completed phases of full barrier b: landed tiles that use it. */
static int full_count(const walk *w, int b)
{
    int n = 0;
    for (int t = 0; t < w->p; t++)
        n += w->landed[t] && w->s->full_bar(t) == b;
    return n;
}

/* Completed phases of slot s's empty barrier: released tiles in it. */
static int empty_count(const walk *w, int s)
{
    int n = 0;
    for (int c = 0; c < WR_CONSUMERS; c++)
        for (int j = 0; j < w->k[c]; j++) {
            int t = c + WR_CONSUMERS * j;
            n += t < NT && w->s->slot(t) == s;
        }
    return n;
}

static void visit(walk *w)
{
    size_t id = state_index(w);
    if (w->seen[id >> 3] & (1u << (id & 7)))
        return;
    w->seen[id >> 3] |= (unsigned char)(1u << (id & 7));
    w->states++;
    int moved = 0, done = 1;
    /* The producer issues tile p once its slot's previous tile is released. */
    if (w->p < NT && passes(empty_count(w, w->s->slot(w->p)), w->s->empty_parity(w->p))) {
        w->p++;
        visit(w);
        w->p--;
        moved = 1;
    }
    /* Any load in flight lands. */
    for (int t = 0; t < w->p; t++)
        if (!w->landed[t]) {
            w->landed[t] = 1;
            visit(w);
            w->landed[t] = 0;
            moved = 1;
        }
    for (int c = 0; c < WR_CONSUMERS; c++) {
        int i = tile_of(w, c);
        if (i >= NT)
            continue;
        done = 0;
        if (w->hold[c]) { /* MMAs done: release the slot, go to the next tile */
            w->hold[c] = 0;
            w->k[c]++;
            visit(w);
            w->k[c]--;
            w->hold[c] = 1;
            moved = 1;
        } else if (passes(full_count(w, w->s->full_bar(i)), w->s->full_parity(i))) {
            /* The wait passed: the slot must hold tile i, landed. */
            if (i >= w->p || !w->landed[i]) {
                w->early++;
                continue;
            }
            w->hold[c] = 1;
            visit(w);
            w->hold[c] = 0;
            moved = 1;
        }
    }
    if (done)
        w->finals++;
    else if (!moved)
        w->stalls++;
}

static walk explore(const sched *s)
{
    walk w;
    memset(&w, 0, sizeof w);
    w.s = s;
    w.seen = calloc((state_count() + 7) / 8, 1);
    assert_non_null(w.seen);
    visit(&w);
    free(w.seen);
    w.seen = NULL;
    return w;
}

static void test_schedule_is_consistent(void **state)
{
    (void)state;
    /* A barrier index names one consumer and one slot; tiles of one
     * consumer come WR_CONSUMERS apart. */
    for (int i = 0; i < 4 * WR_FULL; i++) {
        int j = i + WR_FULL;
        assert_int_equal(wr_full_bar(i), wr_full_bar(j));
        assert_int_equal(wr_consumer(i), wr_consumer(j));
        assert_int_equal(wr_slot(i), wr_slot(j));
        assert_true(wr_full_bar(i) >= 0 && wr_full_bar(i) < WR_FULL);
        assert_int_equal(wr_consumer(i + WR_CONSUMERS), wr_consumer(i));
        assert_int_equal(wr_consumer(i), i % WR_CONSUMERS); /* the walk's tile_of */
    }
}

static void test_no_early_read_in_any_order(void **state)
{
    (void)state;
    walk w = explore(&shipped);
    printf("shipped schedule: %ld states reached, %d with every tile consumed; %d early reads, "
           "%d stalls\n", w.states, w.finals, w.early, w.stalls);
    assert_int_equal(w.early, 0);
    assert_int_equal(w.stalls, 0);
    assert_true(w.finals > 0);
}

static void test_model_finds_the_old_race(void **state)
{
    (void)state;
    walk w = explore(&before_fix);
    printf("before the fix: %ld states reached, %d early reads\n", w.states, w.early);
    assert_true(w.early > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schedule_is_consistent),
        cmocka_unit_test(test_no_early_read_in_any_order),
        cmocka_unit_test(test_model_finds_the_old_race),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
