/* test_fault.c - IKBO_FAULT (kernels/fault.h): the rule grammar and its
 * errors, which backend gets which rule, that exactly the N-th call fails,
 * and that the CPU backend's hooks fail the call they are armed for with
 * the injected message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend.h"
#include "kernels/fault.h"

static int parse(const char *spec, bk_fault_rule *r, bk_err *err)
{
    memset(err, 0, sizeof *err);
    return bk_fault_parse(spec, r, BK_FAULT_MAX_RULES, err);
}

static void test_grammar(void **state)
{
    (void)state;
    bk_fault_rule r[BK_FAULT_MAX_RULES];
    bk_err err;
    assert_int_equal(parse("", r, &err), 0);
    assert_int_equal(parse("alloc:3", r, &err), 1);
    assert_int_equal(r[0].point, BK_FAULT_ALLOC);
    assert_int_equal(r[0].n, 3);
    assert_int_equal(r[0].backend, 0);
    assert_int_equal(parse("sync:12@2,launch:1,alloc:7@1", r, &err), 3);
    assert_int_equal(r[0].point, BK_FAULT_SYNC);
    assert_int_equal(r[0].n, 12);
    assert_int_equal(r[0].backend, 2);
    assert_int_equal(r[1].point, BK_FAULT_LAUNCH);
    assert_int_equal(r[2].backend, 1);
    assert_int_equal(parse("lost:4@2", r, &err), 1);
    assert_int_equal(r[0].point, BK_FAULT_LOST);
    assert_int_equal(r[0].n, 4);
    assert_int_equal(r[0].backend, 2);
    assert_int_equal(parse("hang:3", r, &err), 1);
    assert_int_equal(r[0].point, BK_FAULT_HANG);
    assert_int_equal(r[0].n, 3);
    assert_int_equal(parse("graph:2@3", r, &err), 1);
    assert_int_equal(r[0].point, BK_FAULT_GRAPH);
    assert_int_equal(r[0].n, 2);
    assert_int_equal(r[0].backend, 3);
    /* The same point for two different backends is fine. */
    assert_int_equal(parse("sync:1@1,sync:2@2,sync:3", r, &err), 3);
}

static void test_grammar_errors(void **state)
{
    (void)state;
    static const struct {
        const char *spec, *msg;
    } bad[] = {
        {"alloc", "rule \"alloc\": expected POINT:N[@B]"},
        {"free:1", "rule \"free:1\": expected POINT:N[@B]"},
        {"allocx:1", "rule \"allocx:1\""},
        {"alloc:0", "N and B must be integers >= 1"},
        {"alloc:-1", "N and B must be integers >= 1"},
        {"alloc:", "N and B must be integers >= 1"},
        {"alloc:3@", "N and B must be integers >= 1"},
        {"alloc:3@0", "N and B must be integers >= 1"},
        {"alloc:3x", "N and B must be integers >= 1"},
        {"alloc:99999999999999999999", "N and B must be integers >= 1"},
        {"alloc:1,", "empty rule after the last ','"},
        {"alloc:1,,sync:2", "rule \"\""},
        {"sync:1@2,sync:4@2", "two rules for sync@2"},
        {"launch:1,launch:2", "two rules for launch@0"},
        {"lose:1", "with POINT alloc, launch, sync, graph, lost or hang"},
    };
    bk_fault_rule r[BK_FAULT_MAX_RULES];
    bk_err err;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(parse(bad[i].spec, r, &err), -1);
        if (!strstr(err.msg, bad[i].msg) || strncmp(err.msg, "IKBO_FAULT: ", 12))
            fail_msg("%s: got \"%s\", want \"%s\"", bad[i].spec, err.msg, bad[i].msg);
    }
    char many[256] = "";
    for (int i = 1; i <= BK_FAULT_MAX_RULES + 1; i++)
        snprintf(many + strlen(many), sizeof many - strlen(many), "%salloc:1@%d", i > 1 ? "," : "", i);
    assert_int_equal(parse(many, r, &err), -1);
    assert_non_null(strstr(err.msg, "more than 16 rules"));
}

static int wait_returned;

typedef struct waiter {
    bk_backend *be;
    bk_stream *s;
} waiter;

/* A stream wait on its own thread; sets wait_returned when it returns. */
static void *wait_once(void *arg)
{
    waiter *w = arg;
    bk_err err = {{0}};
    (void)w->be->sync(w->s, &err);
    __atomic_store_n(&wait_returned, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* IKBO_FAULT is read once per process: this test owns it. */
static void test_backends_and_counts(void **state)
{
    (void)state;
    setenv("IKBO_FAULT", "sync:3,alloc:2@2,sync:5@2,lost:2@5,hang:2@6", 1);
    bk_fault f[3];
    bk_err err;
    for (int i = 0; i < 3; i++)
        assert_int_equal(bk_fault_next_backend(&f[i], &err), 0);
    assert_int_equal(f[0].fail_at[BK_FAULT_SYNC], 3);
    assert_int_equal(f[0].fail_at[BK_FAULT_ALLOC], 0);
    assert_int_equal(f[1].fail_at[BK_FAULT_SYNC], 5); /* its own rule wins */
    assert_int_equal(f[1].fail_at[BK_FAULT_ALLOC], 2);
    assert_int_equal(f[2].fail_at[BK_FAULT_SYNC], 3);
    assert_int_equal(f[2].fail_at[BK_FAULT_LAUNCH], 0);
    int hits[8];
    for (int i = 0; i < 8; i++)
        hits[i] = bk_fault_hit(&f[1], BK_FAULT_SYNC);
    for (int i = 0; i < 8; i++)
        assert_int_equal(hits[i], i == 4); /* exactly the 5th */
    for (int i = 0; i < 8; i++)
        assert_int_equal(bk_fault_hit(&f[0], BK_FAULT_LAUNCH), 0);

    /* Through the CPU backend: the 4th backend gets "sync:3" - its warm
     * sync calls 1 and 2 pass, the 3rd fails with the injected message,
     * the 4th passes again. */
    bk_backend *be = bk_backend_new("cpu", &err);
    assert_non_null(be);
    bk_stream *s = be->stream_new(be, &err);
    assert_non_null(s);
    float x = 1, y = 0;
    void *buf = be->alloc(be, sizeof x, BK_TAG_CAND, &err);
    assert_non_null(buf);
    assert_int_equal(be->upload_f32(s, buf, &x, 1, &err), 0);
    assert_int_equal(be->sync(s, &err), 0);
    assert_int_equal(be->download_f32(s, &y, buf, 1, &err), 0);
    memset(&err, 0, sizeof err);
    assert_int_equal(be->sync(s, &err), -1);
    assert_non_null(strstr(err.msg, "stream failed" BK_FAULT_INJECTED));
    assert_int_equal(be->download_f32(s, &y, buf, 1, &err), 0);
    assert_true(y == 1.0f);
    assert_int_equal(be->lost(be, &err), 0);

    /* The 5th backend also gets "lost:2": its 1st wait passes, the 2nd and
     * every later one fail as on a lost device (the sync:3 rule never gets
     * its turn), and lost reports it; the 4th backend is not lost. */
    bk_backend *gone = bk_backend_new("cpu", &err);
    assert_non_null(gone);
    bk_stream *gs = gone->stream_new(gone, &err);
    assert_non_null(gs);
    bk_err why = {{0}};
    assert_int_equal(gone->lost(gone, &why), 0);
    assert_int_equal(gone->sync(gs, &err), 0);
    for (int i = 0; i < 3; i++) {
        memset(&err, 0, sizeof err);
        int rc = i == 1 ? gone->download_f32(gs, &y, buf, 1, &err) : gone->sync(gs, &err);
        assert_int_equal(rc, -1);
        assert_non_null(strstr(err.msg, "the device is lost"));
        assert_non_null(strstr(err.msg, BK_FAULT_INJECTED));
    }
    assert_int_equal(gone->lost(gone, &why), 1);
    assert_non_null(strstr(why.msg, "the device is lost"));
    assert_int_equal(be->lost(be, &err), 0);
    gone->stream_free(gs);
    gone->destroy(gone);

    /* The 6th backend gets "hang:2": its 2nd wait never returns. A thread
     * makes it and is left blocked (the process ends around it); a wait
     * that returned would set the flag at once, so 200 ms is only how long
     * a wrong implementation has to show itself. */
    bk_backend *hung = bk_backend_new("cpu", &err);
    assert_non_null(hung);
    bk_stream *hs = hung->stream_new(hung, &err);
    assert_non_null(hs);
    assert_int_equal(hung->sync(hs, &err), 0);
    static waiter w;
    w = (waiter){hung, hs};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, wait_once, &w), 0);
    pthread_detach(th);
    struct timespec ts = {0, 200 * 1000000};
    nanosleep(&ts, NULL);
    assert_int_equal(__atomic_load_n(&wait_returned, __ATOMIC_ACQUIRE), 0);
    be->free(be, buf, sizeof x, BK_TAG_CAND);
    be->stream_free(s);
    be->destroy(be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grammar),
        cmocka_unit_test(test_grammar_errors),
        cmocka_unit_test(test_backends_and_counts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
