/*
 * test_streams.c -- streams, events and scopes on the test device: async conversions complete
 * in order, events time and order work, the {0} stream, automatic waits, early releases, and
 * GPUARR_WITH_* / GPUARR_SCOPED_* restoring the thread's current device and stream.
 */
#include "test_common.h"

TestSuite(streams, .init = test_setup, .fini = test_teardown);

enum { BIG = 1 << 22 };

/* Values exact in every float dtype and in i16 and wider: -1000..999 */
static float big_value(size_t i) { return (float)((int)(i % 2000) - 1000); }

static gpuarr_array make_big(gpuarr_device dev) {
    float *v = malloc((size_t)BIG * sizeof *v);
    cr_assert_not_null(v);
    for (size_t i = 0; i < BIG; i++) v[i] = big_value(i);
    int64_t shape[1] = {BIG};
    gpuarr_array a = {0};
    TEST_OK(gpuarr_from_host(dev, v, 1, shape, &a));
    free(v);
    return a;
}

/* Reads a (any dtype) back as f64 and compares it with big_value. */
static void expect_big_values(gpuarr_array a, const char *what) {
    double *v = malloc((size_t)BIG * sizeof *v);
    cr_assert_not_null(v);
    TEST_OK(gpuarr_to_host_as(a, GPUARR_F64, v, BIG));
    for (size_t i = 0; i < BIG; i++)
        if (v[i] != (double)big_value(i)) {
            double got = v[i];
            free(v);
            cr_assert_fail("%s: element %zu = %g, want %g", what, i, got, (double)big_value(i));
        }
    free(v);
}

/* ---------------------------------------------------------------------------------------------
 * Streams and events
 * ------------------------------------------------------------------------------------------- */
Test(streams, create_sync_query_and_destroy) {
    gpuarr_device dev = test_device();
    gpuarr_stream s[16];
    for (int i = 0; i < 16; i++) {
        TEST_OK(gpuarr_stream_create(dev, 0, &s[i]));
        cr_assert_neq(s[i].id, 0u);
        for (int j = 0; j < i; j++) cr_assert_neq(s[i].id, s[j].id, "two live streams share an id");
        gpuarr_device d = {0};
        TEST_OK(gpuarr_stream_get_device(s[i], &d));
        cr_expect_eq(d.id, dev.id, "stream on the wrong device");
    }
    for (int i = 0; i < 16; i++) {
        TEST_OK(gpuarr_stream_sync(s[i]));
        bool done = false;
        TEST_OK(gpuarr_stream_query(s[i], &done));
        cr_expect(done, "an idle stream reports work pending");
        TEST_OK(gpuarr_stream_destroy(s[i]));
    }
    TEST_OK(gpuarr_device_sync(dev));
}

Test(streams, convert_async_then_event_record_and_sync_gives_the_values) {
    gpuarr_device dev = test_device();
    gpuarr_array a = make_big(dev);
    gpuarr_stream s = {0};
    gpuarr_event e = {0};
    TEST_OK(gpuarr_stream_create(dev, 0, &s));
    TEST_OK(gpuarr_event_create(dev, 0, &e));
    gpuarr_array b = {0}, c = {0};
    TEST_OK(gpuarr_convert_async(a, dev, GPUARR_F16, s, &b));
    TEST_OK(gpuarr_convert_async(a, dev, GPUARR_I32, s, &c));
    TEST_OK(gpuarr_event_record(e, s));
    TEST_OK(gpuarr_event_sync(e));
    bool done = false;
    TEST_OK(gpuarr_event_query(e, &done));
    cr_expect(done, "event not done after gpuarr_event_sync");
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(b, &info));
    cr_expect_eq(info.dtype, GPUARR_F16);
    cr_expect_eq(info.count, BIG);
    expect_big_values(b, "f32 -> f16 async");
    expect_big_values(c, "f32 -> i32 async");
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
    TEST_OK(gpuarr_release(c));
    TEST_OK(gpuarr_event_destroy(e));
    TEST_OK(gpuarr_stream_destroy(s));
}

Test(streams, convert_async_to_the_host_and_back) {
    gpuarr_device dev = test_device();
    gpuarr_device host = gpuarr_host();
    gpuarr_array a = make_big(dev);
    gpuarr_stream s = {0};
    TEST_OK(gpuarr_stream_create(dev, 0, &s));
    gpuarr_array h = {0}, back = {0};
    TEST_OK(gpuarr_convert_async(a, host, GPUARR_F64, s, &h));
    TEST_OK(gpuarr_stream_sync(s));
    double *p = NULL;
    TEST_OK(gpuarr_host_data(h, (void **)&p));
    for (size_t i = 0; i < BIG; i += 4099)
        cr_assert_eq(p[i], (double)big_value(i), "host copy element %zu = %g", i, p[i]);
    TEST_OK(gpuarr_convert_async(h, dev, GPUARR_I16, s, &back));
    TEST_OK(gpuarr_stream_sync(s));
    expect_big_values(back, "host f64 -> device i16 async");
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(h));
    TEST_OK(gpuarr_release(back));
    TEST_OK(gpuarr_stream_destroy(s));
}

Test(streams, synchronous_reads_wait_for_pending_async_work) {
    gpuarr_device dev = test_device();
    gpuarr_array a = make_big(dev);
    gpuarr_stream s = {0};
    TEST_OK(gpuarr_stream_create(dev, 0, &s));
    gpuarr_array b = {0}, c = {0};
    TEST_OK(gpuarr_convert_async(a, dev, GPUARR_F64, s, &b));
    expect_big_values(b, "to_host_as right after convert_async"); /* no explicit sync */
    TEST_OK(gpuarr_convert_async(a, gpuarr_host(), GPUARR_F32, s, &c));
    float *p = NULL;
    TEST_OK(gpuarr_host_data(c, (void **)&p)); /* waits for the work producing c */
    cr_assert_eq(p[BIG - 1], big_value(BIG - 1));
    cr_assert_eq(p[12345], big_value(12345));
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
    TEST_OK(gpuarr_release(c));
    TEST_OK(gpuarr_stream_destroy(s));
}

Test(streams, elapsed_ms_between_timing_events_is_non_negative) {
    gpuarr_device dev = test_device();
    gpuarr_array a = make_big(dev);
    gpuarr_stream s = {0};
    gpuarr_event start = {0}, end = {0};
    TEST_OK(gpuarr_stream_create(dev, 0, &s));
    TEST_OK(gpuarr_event_create(dev, GPUARR_EVENT_TIMING, &start));
    TEST_OK(gpuarr_event_create(dev, GPUARR_EVENT_TIMING, &end));
    TEST_OK(gpuarr_event_record(start, s));
    gpuarr_array b = {0};
    TEST_OK(gpuarr_convert_async(a, dev, GPUARR_F64, s, &b));
    TEST_OK(gpuarr_event_record(end, s));
    TEST_OK(gpuarr_event_sync(end));
    double ms = -1;
    TEST_OK(gpuarr_event_elapsed_ms(start, end, &ms));
    cr_expect(isfinite(ms) && ms >= 0, "elapsed %g ms", ms);
    cr_expect(ms < 60000, "elapsed %g ms for one conversion", ms);
    /* re-recording is allowed */
    TEST_OK(gpuarr_event_record(start, s));
    TEST_OK(gpuarr_event_record(end, s));
    TEST_OK(gpuarr_event_sync(end));
    ms = -1;
    TEST_OK(gpuarr_event_elapsed_ms(start, end, &ms));
    cr_expect(isfinite(ms) && ms >= 0, "elapsed %g ms after re-recording", ms);
    expect_big_values(b, "converted between timing events");
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
    TEST_OK(gpuarr_event_destroy(start));
    TEST_OK(gpuarr_event_destroy(end));
    TEST_OK(gpuarr_stream_destroy(s));
}

Test(streams, stream_wait_orders_work_after_an_event_of_another_stream) {
    gpuarr_device dev = test_device();
    gpuarr_array a = make_big(dev);
    gpuarr_stream s1 = {0}, s2 = {0};
    gpuarr_event e = {0};
    TEST_OK(gpuarr_stream_create(dev, 0, &s1));
    TEST_OK(gpuarr_stream_create(dev, 0, &s2));
    TEST_OK(gpuarr_event_create(dev, 0, &e));
    gpuarr_array b = {0}, c = {0};
    TEST_OK(gpuarr_convert_async(a, dev, GPUARR_F64, s1, &b));
    TEST_OK(gpuarr_event_record(e, s1));
    TEST_OK(gpuarr_stream_wait(s2, e));
    TEST_OK(gpuarr_convert_async(b, dev, GPUARR_I32, s2, &c));
    TEST_OK(gpuarr_stream_sync(s2));
    bool done = false;
    TEST_OK(gpuarr_event_query(e, &done));
    cr_expect(done, "s2 finished work that waited for e, but e is not done");
    expect_big_values(c, "f32 -s1-> f64 -s2-> i32");
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
    TEST_OK(gpuarr_release(c));
    TEST_OK(gpuarr_event_destroy(e));
    TEST_OK(gpuarr_stream_destroy(s1));
    TEST_OK(gpuarr_stream_destroy(s2));
}

Test(streams, an_array_made_on_one_stream_is_waited_for_on_another) {
    gpuarr_device dev = test_device();
    gpuarr_array a = make_big(dev);
    gpuarr_stream s1 = {0}, s2 = {0};
    TEST_OK(gpuarr_stream_create(dev, 0, &s1));
    TEST_OK(gpuarr_stream_create(dev, 0, &s2));
    gpuarr_array b = {0}, c = {0};
    TEST_OK(gpuarr_convert_async(a, dev, GPUARR_F64, s1, &b));
    TEST_OK(gpuarr_convert_async(b, dev, GPUARR_F32, s2, &c)); /* no explicit wait */
    TEST_OK(gpuarr_stream_sync(s2));
    expect_big_values(c, "f32 -s1-> f64 -s2-> f32");
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
    TEST_OK(gpuarr_release(c));
    TEST_OK(gpuarr_stream_destroy(s1));
    TEST_OK(gpuarr_stream_destroy(s2));
}

Test(streams, stream_0_uses_the_current_or_the_default_stream) {
    gpuarr_device dev = test_device();
    gpuarr_array a = make_big(dev);
    gpuarr_array b = {0}, c = {0};
    /* no current stream: the device's default stream */
    cr_assert_eq(gpuarr_current_stream().id, 0u);
    TEST_OK(gpuarr_convert_async(a, dev, GPUARR_F64, (gpuarr_stream){0}, &b));
    TEST_OK(gpuarr_device_sync(dev));
    expect_big_values(b, "default stream");
    /* with a current stream on the device: that stream */
    gpuarr_stream s = {0};
    gpuarr_event e = {0};
    TEST_OK(gpuarr_stream_create(dev, 0, &s));
    TEST_OK(gpuarr_event_create(dev, 0, &e));
    TEST_OK(gpuarr_set_current_stream(s));
    cr_expect_eq(gpuarr_current_stream().id, s.id);
    TEST_OK(gpuarr_convert_async(a, dev, GPUARR_I32, (gpuarr_stream){0}, &c));
    TEST_OK(gpuarr_event_record(e, s));
    TEST_OK(gpuarr_event_sync(e));
    expect_big_values(c, "current stream");
    TEST_OK(gpuarr_set_current_stream((gpuarr_stream){0}));
    cr_expect_eq(gpuarr_current_stream().id, 0u, "set_current_stream({0}) did not clear it");
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
    TEST_OK(gpuarr_release(c));
    TEST_OK(gpuarr_event_destroy(e));
    TEST_OK(gpuarr_stream_destroy(s));
}

Test(streams, releasing_arrays_with_async_work_queued_is_safe) {
    gpuarr_device dev = test_device();
    gpuarr_stream s = {0};
    TEST_OK(gpuarr_stream_create(dev, 0, &s));
    for (int round = 0; round < 4; round++) {
        gpuarr_array a = make_big(dev);
        gpuarr_array b = {0}, c = {0};
        TEST_OK(gpuarr_convert_async(a, dev, GPUARR_F64, s, &b));
        TEST_OK(gpuarr_release(a)); /* the source, while the cast may still read it */
        TEST_OK(gpuarr_convert_async(b, dev, GPUARR_I32, s, &c));
        TEST_OK(gpuarr_release(b)); /* an intermediate, before it is even produced */
        /* churn the allocator so freed memory would be reused and overwritten */
        for (int k = 0; k < 4; k++) {
            gpuarr_array junk = {0};
            int64_t shape[1] = {BIG};
            TEST_OK(gpuarr_zeros(dev, GPUARR_F64, 1, shape, &junk));
            TEST_OK(gpuarr_release(junk));
        }
        TEST_OK(gpuarr_stream_sync(s));
        expect_big_values(c, "after releasing source and intermediate early");
        TEST_OK(gpuarr_release(c));
    }
    TEST_OK(gpuarr_stream_destroy(s));
}

Test(streams, stream_destroy_waits_for_its_work) {
    gpuarr_device dev = test_device();
    gpuarr_array a = make_big(dev);
    gpuarr_stream s = {0};
    TEST_OK(gpuarr_stream_create(dev, 0, &s));
    gpuarr_array b = {0};
    TEST_OK(gpuarr_convert_async(a, dev, GPUARR_F64, s, &b));
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_stream_destroy(s));
    expect_big_values(b, "after stream_destroy");
    TEST_OK(gpuarr_release(b));
}

/* ---------------------------------------------------------------------------------------------
 * Scopes
 * ------------------------------------------------------------------------------------------- */
typedef struct scope_env {
    gpuarr_device dev;   /* the test device */
    gpuarr_device other; /* another device, or {0} when there is only one */
    gpuarr_stream s0;    /* made current before each check */
    gpuarr_stream s1, s2;
} scope_env;

static scope_env make_scope_env(void) {
    scope_env e;
    memset(&e, 0, sizeof e);
    e.dev = test_device();
    for (int i = 0; i < gpuarr_device_count(); i++)
        if (gpuarr_device_at(i).id != e.dev.id) e.other = gpuarr_device_at(i);
    TEST_OK(gpuarr_stream_create(e.dev, 0, &e.s0));
    TEST_OK(gpuarr_stream_create(e.dev, 0, &e.s1));
    TEST_OK(gpuarr_stream_create(e.dev, 0, &e.s2));
    TEST_OK(gpuarr_set_current_device(e.dev));
    TEST_OK(gpuarr_set_current_stream(e.s0));
    return e;
}
static void free_scope_env(scope_env *e) {
    TEST_OK(gpuarr_set_current_stream((gpuarr_stream){0}));
    TEST_OK(gpuarr_stream_destroy(e->s0));
    TEST_OK(gpuarr_stream_destroy(e->s1));
    TEST_OK(gpuarr_stream_destroy(e->s2));
}

#define EXPECT_CURRENT(dev_, stream_, when)                                                        \
    do {                                                                                           \
        cr_expect_eq(gpuarr_current_device().id, (dev_).id, "%s: current device 0x%x, want 0x%x", \
                     when, gpuarr_current_device().id, (dev_).id);                                 \
        cr_expect_eq(gpuarr_current_stream().id, (stream_).id,                                     \
                     "%s: current stream 0x%x, want 0x%x", when, gpuarr_current_stream().id,      \
                     (stream_).id);                                                                \
    } while (0)

Test(streams, with_stream_sets_and_restores_after_normal_exit_break_and_continue) {
    scope_env e = make_scope_env();
    int runs = 0;
    GPUARR_WITH_STREAM(e.s1) {
        runs++;
        EXPECT_CURRENT(e.dev, e.s1, "inside WITH_STREAM");
    }
    cr_expect_eq(runs, 1, "block ran %d times", runs);
    EXPECT_CURRENT(e.dev, e.s0, "after WITH_STREAM");

    int after = 0;
    runs = 0;
    for (int i = 0; i < 3; i++) {
        GPUARR_WITH_STREAM(e.s1) {
            runs++;
            if (runs > 0) break; /* leaves the scope, not the loop */
            cr_expect(false, "code after break ran");
        }
        after++;
        EXPECT_CURRENT(e.dev, e.s0, "after break out of WITH_STREAM");
    }
    cr_expect_eq(runs, 3, "break: block ran %d times", runs);
    cr_expect_eq(after, 3, "break left the enclosing loop (%d iterations)", after);

    after = 0;
    runs = 0;
    for (int i = 0; i < 3; i++) {
        GPUARR_WITH_STREAM(e.s2) {
            runs++;
            EXPECT_CURRENT(e.dev, e.s2, "inside WITH_STREAM before continue");
            if (runs > 0) continue;
            cr_expect(false, "code after continue ran");
        }
        after++;
        EXPECT_CURRENT(e.dev, e.s0, "after continue in WITH_STREAM");
    }
    cr_expect_eq(runs, 3);
    cr_expect_eq(after, 3, "continue skipped the rest of the enclosing loop");
    free_scope_env(&e);
}

Test(streams, with_device_sets_and_restores_after_normal_exit_break_and_continue) {
    scope_env e = make_scope_env();
    gpuarr_device target = e.other.id ? e.other : e.dev;
    int runs = 0;
    GPUARR_WITH_DEVICE(target) {
        runs++;
        cr_expect_eq(gpuarr_current_device().id, target.id, "inside WITH_DEVICE");
    }
    cr_expect_eq(runs, 1);
    EXPECT_CURRENT(e.dev, e.s0, "after WITH_DEVICE");
    int after = 0;
    runs = 0;
    for (int i = 0; i < 3; i++) {
        GPUARR_WITH_DEVICE(target) {
            runs++;
            cr_expect_eq(gpuarr_current_device().id, target.id);
            if (i % 2 == 0) break;
            continue;
        }
        after++;
        EXPECT_CURRENT(e.dev, e.s0, "after break/continue out of WITH_DEVICE");
    }
    cr_expect_eq(runs, 3);
    cr_expect_eq(after, 3);
    if (!e.other.id) cr_log_info("one device only: the device change itself is not observable");
    free_scope_env(&e);
}

Test(streams, nested_scopes_restore_in_order) {
    scope_env e = make_scope_env();
    gpuarr_device target = e.other.id ? e.other : e.dev;
    GPUARR_WITH_STREAM(e.s1) {
        EXPECT_CURRENT(e.dev, e.s1, "outer");
        GPUARR_WITH_STREAM(e.s2) {
            EXPECT_CURRENT(e.dev, e.s2, "middle");
            GPUARR_WITH_DEVICE(target) {
                cr_expect_eq(gpuarr_current_device().id, target.id, "inner device");
                GPUARR_WITH_STREAM(e.s1) { EXPECT_CURRENT(e.dev, e.s1, "innermost"); }
                cr_expect_eq(gpuarr_current_device().id, target.id, "inner device after innermost");
            }
            EXPECT_CURRENT(e.dev, e.s2, "middle again");
        }
        EXPECT_CURRENT(e.dev, e.s1, "outer again");
    }
    EXPECT_CURRENT(e.dev, e.s0, "after all");
    free_scope_env(&e);
}

Test(streams, an_invalid_device_or_stream_does_not_run_the_block) {
    scope_env e = make_scope_env();
    bool ran = false;
    GPUARR_WITH_DEVICE((gpuarr_device){999}) { ran = true; }
    cr_expect(!ran, "WITH_DEVICE({999}) ran its block");
    cr_expect(gpuarr_last_error()[0] != '\0', "no reason given for the skipped block");
    EXPECT_CURRENT(e.dev, e.s0, "after an invalid WITH_DEVICE");
    gpuarr_stream dead = {0};
    TEST_OK(gpuarr_stream_create(e.dev, 0, &dead));
    TEST_OK(gpuarr_stream_destroy(dead));
    GPUARR_WITH_STREAM(dead) { ran = true; }
    cr_expect(!ran, "WITH_STREAM(destroyed stream) ran its block");
    EXPECT_CURRENT(e.dev, e.s0, "after an invalid WITH_STREAM");
    gpuarr_scope sc = gpuarr_scope_enter_device((gpuarr_device){0});
    cr_expect(!sc.active);
    cr_expect_eq(sc.result, GPUARR_ERROR_INVALID_HANDLE, "scope result %s",
                 gpuarr_result_name(sc.result));
    gpuarr_scope_leave(&sc); /* harmless */
    EXPECT_CURRENT(e.dev, e.s0, "after leaving an inactive scope");
    free_scope_env(&e);
}

Test(streams, the_R_forms_give_the_scope_result_and_skip_the_block) {
    scope_env e = make_scope_env();
    bool ran = false;
    gpuarr_result r = GPUARR_OK;
    GPUARR_WITH_DEVICE_R((gpuarr_device){999}, &r) { ran = true; }
    cr_expect(!ran, "WITH_DEVICE_R({999}) ran its block");
    cr_expect_eq(r, GPUARR_ERROR_INVALID_HANDLE, "WITH_DEVICE_R gave %s", gpuarr_result_name(r));
    gpuarr_stream dead = {0};
    TEST_OK(gpuarr_stream_create(e.dev, 0, &dead));
    TEST_OK(gpuarr_stream_destroy(dead));
    r = GPUARR_OK;
    GPUARR_WITH_STREAM_R(dead, &r) { ran = true; }
    cr_expect(!ran, "WITH_STREAM_R(destroyed stream) ran its block");
    cr_expect_eq(r, GPUARR_ERROR_INVALID_HANDLE, "WITH_STREAM_R gave %s", gpuarr_result_name(r));
    r = GPUARR_ERROR_TIMEOUT;
    GPUARR_WITH_STREAM_R(e.s1, &r) { EXPECT_CURRENT(e.dev, e.s1, "inside a valid WITH_STREAM_R"); }
    cr_expect_eq(r, GPUARR_OK);
    EXPECT_CURRENT(e.dev, e.s0, "after the R forms");
    free_scope_env(&e);
}

/* Work in a failed GPUARR_SCOPED_* block: it must fail, never run on the device or stream the
   scope was to replace. Returns the result of syncing the current stream ({0}) there. */
static gpuarr_result scoped_device_work(gpuarr_device d, gpuarr_result *scope_result, gpuarr_device *current) {
    GPUARR_SCOPED_DEVICE_R(d, scope_result);
    *current = gpuarr_current_device();
    return gpuarr_stream_sync((gpuarr_stream){0});
}
static gpuarr_result scoped_stream_work(gpuarr_stream s, gpuarr_result *scope_result, gpuarr_array *made) {
    GPUARR_SCOPED_STREAM_R(s, scope_result);
    int64_t shape[1] = {4};
    return gpuarr_zeros(gpuarr_current_device().id ? gpuarr_current_device() : gpuarr_host(), GPUARR_F32, 1, shape, made);
}

Test(streams, a_failed_scoped_device_or_stream_leaves_the_block_without_a_device) {
    scope_env e = make_scope_env();
    gpuarr_result scope_r = GPUARR_OK;
    gpuarr_device current = {12345};
    gpuarr_result r = scoped_device_work((gpuarr_device){999}, &scope_r, &current);
    cr_expect_eq(scope_r, GPUARR_ERROR_INVALID_HANDLE, "SCOPED_DEVICE_R gave %s", gpuarr_result_name(scope_r));
    cr_expect_eq(current.id, 0u, "inside the failed scope the current device is still 0x%x", current.id);
    cr_expect_eq(r, GPUARR_ERROR_INVALID_HANDLE, "work on the current stream in a failed scope gave %s", gpuarr_result_name(r));
    cr_expect(strstr(gpuarr_last_error(), "did not start") != NULL, "%s", gpuarr_last_error());
    EXPECT_CURRENT(e.dev, e.s0, "after a failed SCOPED_DEVICE");
    TEST_OK(gpuarr_stream_sync((gpuarr_stream){0}));
    gpuarr_stream dead = {0};
    TEST_OK(gpuarr_stream_create(e.dev, 0, &dead));
    TEST_OK(gpuarr_stream_destroy(dead));
    gpuarr_array made = {0};
    r = scoped_stream_work(dead, &scope_r, &made);
    cr_expect_eq(scope_r, GPUARR_ERROR_INVALID_HANDLE);
    cr_expect_neq(r, GPUARR_OK, "an array was made in a failed SCOPED_STREAM (on another stream)");
    cr_expect_eq(made.id, 0u);
    EXPECT_CURRENT(e.dev, e.s0, "after a failed SCOPED_STREAM");
    r = scoped_stream_work(e.s1, &scope_r, &made); /* a valid one works */
    cr_expect_eq(scope_r, GPUARR_OK);
    cr_expect_eq(r, GPUARR_OK, "%s", gpuarr_last_error());
    TEST_OK(gpuarr_release(made));
    {
        GPUARR_SCOPED_DEVICE((gpuarr_device){999});
        GPUARR_WITH_DEVICE(e.dev) { TEST_OK(gpuarr_stream_sync((gpuarr_stream){0})); }
        cr_expect_neq(gpuarr_stream_sync((gpuarr_stream){0}), GPUARR_OK, "the failed scope came back after a nested one");
    }
    EXPECT_CURRENT(e.dev, e.s0, "after the nested scopes");
    free_scope_env(&e);
}

Test(streams, a_second_scope_leave_does_nothing) {
    scope_env e = make_scope_env();
    gpuarr_scope sc = gpuarr_scope_enter_stream(e.s1);
    cr_assert(sc.active);
    EXPECT_CURRENT(e.dev, e.s1, "entered");
    gpuarr_scope_leave(&sc);
    EXPECT_CURRENT(e.dev, e.s0, "left");
    TEST_OK(gpuarr_set_current_stream(e.s2));
    gpuarr_scope_leave(&sc);
    EXPECT_CURRENT(e.dev, e.s2, "after a second leave");
    free_scope_env(&e);
}

static int helper_with_scoped_stream(gpuarr_stream s, int *inside_ok) {
    GPUARR_SCOPED_STREAM(s);
    *inside_ok = gpuarr_current_stream().id == s.id;
    if (*inside_ok) return 1; /* early return: the cleanup still restores */
    return 2;
}

static int helper_with_scoped_device(gpuarr_device d, gpuarr_stream s, int *inside_ok) {
    GPUARR_SCOPED_DEVICE(d);
    *inside_ok = gpuarr_current_device().id == d.id;
    {
        GPUARR_SCOPED_STREAM(s);
        if (gpuarr_current_stream().id != s.id) *inside_ok = 0;
        return 3; /* leaves two scopes at once */
    }
}

Test(streams, scoped_device_and_stream_restore_on_return_from_a_helper) {
    scope_env e = make_scope_env();
    int ok = 0;
    cr_expect_eq(helper_with_scoped_stream(e.s1, &ok), 1);
    cr_expect(ok, "GPUARR_SCOPED_STREAM did not set the stream");
    EXPECT_CURRENT(e.dev, e.s0, "after returning from GPUARR_SCOPED_STREAM");
    gpuarr_device target = e.other.id ? e.other : e.dev;
    gpuarr_stream s_target = e.s2;
    if (e.other.id) TEST_OK(gpuarr_stream_create(target, 0, &s_target));
    ok = 0;
    cr_expect_eq(helper_with_scoped_device(target, s_target, &ok), 3);
    cr_expect(ok, "GPUARR_SCOPED_DEVICE / STREAM did not set them");
    EXPECT_CURRENT(e.dev, e.s0, "after returning from GPUARR_SCOPED_DEVICE");
    if (e.other.id) TEST_OK(gpuarr_stream_destroy(s_target));
    free_scope_env(&e);
}

Test(streams, work_inside_with_stream_runs_on_that_stream) {
    scope_env e = make_scope_env();
    gpuarr_array a = make_big(e.dev);
    gpuarr_array b = {0};
    gpuarr_event ev = {0};
    TEST_OK(gpuarr_event_create(e.dev, 0, &ev));
    GPUARR_WITH_STREAM(e.s1) {
        TEST_OK(gpuarr_convert_async(a, e.dev, GPUARR_F64, (gpuarr_stream){0}, &b));
        TEST_OK(gpuarr_event_record(ev, e.s1));
    }
    TEST_OK(gpuarr_event_sync(ev));
    expect_big_values(b, "converted inside WITH_STREAM");
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
    TEST_OK(gpuarr_event_destroy(ev));
    free_scope_env(&e);
}

/* gpuarr_scope_hold, called directly (the SCOPED_* macros call it): a failed scope held leaves
   the thread with no current device until it is left; an active scope passes through unchanged. */
Test(streams, scope_hold_keeps_a_failed_scope_without_a_device_until_it_is_left) {
    scope_env e = make_scope_env();
    gpuarr_scope held = gpuarr_scope_hold(gpuarr_scope_enter_device((gpuarr_device){999}));
    cr_expect(held.held && !held.active, "a failed scope was not held");
    cr_expect_eq(held.result, GPUARR_ERROR_INVALID_HANDLE, "%s", gpuarr_result_name(held.result));
    cr_expect_eq(gpuarr_current_device().id, 0u, "a held failed scope left device 0x%x current", gpuarr_current_device().id);
    gpuarr_array a = {0};
    int64_t shape[1] = {4};
    cr_expect_eq(gpuarr_empty(gpuarr_current_device(), GPUARR_F32, 1, shape, &a), GPUARR_ERROR_INVALID_HANDLE);
    cr_expect_neq(gpuarr_stream_sync((gpuarr_stream){0}), GPUARR_OK, "the current stream of a held failed scope worked");
    gpuarr_scope_leave(&held);
    EXPECT_CURRENT(e.dev, e.s0, "after leaving the held scope");
    gpuarr_scope ok = gpuarr_scope_hold(gpuarr_scope_enter_device(e.dev));
    cr_expect(ok.active && !ok.held, "an active scope was changed by gpuarr_scope_hold");
    cr_expect_eq(gpuarr_current_device().id, e.dev.id);
    gpuarr_scope_leave(&ok);
    EXPECT_CURRENT(e.dev, e.s0, "after leaving the active scope");
    free_scope_env(&e);
}
