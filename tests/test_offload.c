/*
 * test_offload.c -- tasks, gpuarr_offload and gpuarr_map (the manual's OFFLOAD), on the device
 * GPUARR_TEST_DEVICE names and the host. The implementations use gpuarr's own calls (a widening
 * conversion to f64 on the device that is current), so they run on every backend with no kernel
 * of their own. Every test has its own cache folder (GPUARR_CACHE_DIR), so models never leak from
 * one test, or one run, into another. No assertion on a measured duration: which device wins on
 * measured times is tested with synthetic models in test_offload_models.c (white-box).
 */
#include "test_common.h"

#include <dirent.h>
#include <unistd.h>

static char cache_dir[64];
static char warnings[4096];

static void keep_warnings(gpuarr_log_level level, const char *message, void *user) {
    (void)user;
    if (level != GPUARR_LOG_WARN) return;
    size_t n = strlen(warnings);
    snprintf(warnings + n, sizeof warnings - n, "%s\n", message);
}

static void init_here(void) {
    gpuarr_desc d;
    memset(&d, 0, sizeof d);
    d.logger.fn = keep_warnings;
    TEST_OK(gpuarr_init(&d));
}

static void offload_setup(void) {
    snprintf(cache_dir, sizeof cache_dir, "/tmp/gpuarr-test-offload-XXXXXX");
    cr_assert_not_null(mkdtemp(cache_dir));
    cr_assert_eq(setenv("GPUARR_CACHE_DIR", cache_dir, 1), 0);
    init_here();
}

static void offload_teardown(void) {
    test_teardown();
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", cache_dir);
}

TestSuite(offload, .init = offload_setup, .fini = offload_teardown);

/* out[0] = in[0] as f64, made on the current device by work on s */
static gpuarr_result widen(const gpuarr_array *in, int n_in, gpuarr_array *out, int n_out, gpuarr_stream s, void *user) {
    (void)n_in, (void)n_out, (void)user;
    return gpuarr_convert_async(in[0], gpuarr_current_device(), GPUARR_F64, s, &out[0]);
}

/* widen, but an item whose first element is *(int *)user fails */
static gpuarr_result widen_or_fail(const gpuarr_array *in, int n_in, gpuarr_array *out, int n_out, gpuarr_stream s, void *user) {
    float first = 0;
    gpuarr_result r = gpuarr_read(in[0], 0, 1, GPUARR_F32, &first);
    if (r != GPUARR_OK) return r;
    if ((int)first == *(const int *)user) return GPUARR_ERROR_BACKEND;
    return widen(in, n_in, out, n_out, s, user);
}

static gpuarr_backend backend_of(gpuarr_device d) {
    gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(d, &info));
    return info.backend;
}

/* A task "name" with widen on the host and on the test device's backend. */
static gpuarr_task widen_task(const char *name) {
    gpuarr_task_desc td;
    memset(&td, 0, sizeof td);
    td.name = name;
    td.impl[GPUARR_BACKEND_HOST] = widen;
    td.impl[backend_of(test_device())] = widen;
    td.n_in = td.n_out = 1;
    gpuarr_task t;
    TEST_OK(gpuarr_task_create(&td, &t));
    return t;
}

/* "host" or "host,<the test device>" */
static const char *host_and_device(void) {
    static char list[64];
    gpuarr_device d = test_device();
    snprintf(list, sizeof list, test_device_is_host(d) ? "host" : "host,%s", test_device_spec());
    return list;
}

/* n f32 values first, first + 1, ... on device d */
static gpuarr_array ramp(gpuarr_device d, int64_t n, float first) {
    float *v = malloc(sizeof(float) * (size_t)n);
    cr_assert_not_null(v);
    for (int64_t i = 0; i < n; i++) v[i] = first + (float)(i % 1000);
    gpuarr_array a;
    TEST_OK(gpuarr_from_host_as(d, GPUARR_F32, v, 1, &n, &a));
    free(v);
    return a;
}

static void expect_ramp(gpuarr_array a, int64_t n, float first, gpuarr_dtype t) {
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(a, &info));
    cr_assert_eq(info.dtype, t, "dtype %s, expected %s", gpuarr_dtype_name(info.dtype), gpuarr_dtype_name(t));
    cr_assert_eq(info.count, n);
    double *v = malloc(sizeof(double) * (size_t)n);
    TEST_OK(gpuarr_to_host_as(a, GPUARR_F64, v, (size_t)n));
    for (int64_t i = 0; i < n; i++) cr_assert_eq(v[i], (double)(first + (float)(i % 1000)), "element %lld", (long long)i);
    free(v);
}

static gpuarr_offload_desc odesc(const char *devices, gpuarr_offload_policy policy) {
    gpuarr_offload_desc d;
    memset(&d, 0, sizeof d);
    d.devices = devices;
    d.policy = policy;
    return d;
}

static gpuarr_device offload_once(gpuarr_task t, gpuarr_array in, const gpuarr_offload_desc *d) {
    gpuarr_array out = {0};
    gpuarr_device on = {0};
    TEST_OK(gpuarr_offload(t, &in, 1, &out, 1, d, &on));
    TEST_OK(gpuarr_release(out));
    return on;
}

/* ---------------------------------------------------------------------------------------------
 * Tasks
 * ------------------------------------------------------------------------------------------- */
Test(offload, a_task_desc_is_checked_field_by_field) {
    gpuarr_task_desc td;
    gpuarr_task t = {0x5eed};
    memset(&td, 0, sizeof td);
    td.name = "ok";
    td.n_in = td.n_out = 1;
    td.impl[GPUARR_BACKEND_HOST] = widen;
    TEST_FAIL_WITH(gpuarr_task_create(NULL, &t), GPUARR_ERROR_INVALID_ARGUMENT, "desc is NULL");
    TEST_FAIL_WITH(gpuarr_task_create(&td, NULL), GPUARR_ERROR_INVALID_ARGUMENT, "out is NULL");
    gpuarr_task_desc bad = td;
    bad.name = NULL;
    TEST_FAIL_WITH(gpuarr_task_create(&bad, &t), GPUARR_ERROR_INVALID_ARGUMENT, "desc->name is NULL");
    const char *names[] = {"", "a b", "x/y", "0123456789012345678901234567890123456789012345678901234567890123"};
    for (int i = 0; i < 4; i++) {
        bad.name = names[i];
        TEST_FAIL_WITH(gpuarr_task_create(&bad, &t), GPUARR_ERROR_INVALID_ARGUMENT, "desc->name");
    }
    bad = td, bad.n_in = 0;
    TEST_FAIL_WITH(gpuarr_task_create(&bad, &t), GPUARR_ERROR_INVALID_ARGUMENT, "desc->n_in = 0");
    bad = td, bad.n_out = 9;
    TEST_FAIL_WITH(gpuarr_task_create(&bad, &t), GPUARR_ERROR_INVALID_ARGUMENT, "desc->n_out = 9");
    bad = td, bad.in_dtype[0] = (gpuarr_dtype)99;
    TEST_FAIL_WITH(gpuarr_task_create(&bad, &t), GPUARR_ERROR_INVALID_ARGUMENT, "desc->in_dtype[0]");
    bad = td, bad.in_dtype[3] = GPUARR_F32;
    TEST_FAIL_WITH(gpuarr_task_create(&bad, &t), GPUARR_ERROR_INVALID_ARGUMENT, "past n_in");
    bad = td, bad.impl[GPUARR_BACKEND_HOST] = NULL;
    TEST_FAIL_WITH(gpuarr_task_create(&bad, &t), GPUARR_ERROR_INVALID_ARGUMENT, "no implementation");
    bad = td, bad.impl[0] = widen;
    TEST_FAIL_WITH(gpuarr_task_create(&bad, &t), GPUARR_ERROR_INVALID_ARGUMENT, "desc->impl[0]");
    bad = td, bad.impl[GPUARR_TASK_MAX_BACKENDS - 1] = widen; /* room for backends to come: none has it yet */
    TEST_FAIL_WITH(gpuarr_task_create(&bad, &t), GPUARR_ERROR_INVALID_ARGUMENT, "no backend has that number");
    cr_assert_eq(t.id, 0x5eedu, "out was written by a failed call");
    TEST_OK(gpuarr_task_create(&td, &t));
    cr_assert_neq(t.id, 0u);
    TEST_OK(gpuarr_task_destroy(t));
}

Test(offload, a_destroyed_zero_or_forged_task_is_an_invalid_handle) {
    gpuarr_task t = widen_task("handles"), zero = {0}, forged = {t.id ^ 0x00ff0000u};
    gpuarr_array in = ramp(gpuarr_host(), 4, 0), out = {0};
    gpuarr_task_stats st;
    TEST_FAIL_WITH(gpuarr_task_destroy(zero), GPUARR_ERROR_INVALID_HANDLE, "zero task handle");
    TEST_FAIL_WITH(gpuarr_task_destroy(forged), GPUARR_ERROR_INVALID_HANDLE, "not a live task");
    TEST_OK(gpuarr_task_destroy(t));
    TEST_FAIL_WITH(gpuarr_task_destroy(t), GPUARR_ERROR_INVALID_HANDLE, "destroyed already");
    TEST_FAIL_WITH(gpuarr_offload(t, &in, 1, &out, 1, NULL, NULL), GPUARR_ERROR_INVALID_HANDLE, "destroyed already");
    TEST_FAIL_WITH(gpuarr_task_get_stats(t, gpuarr_host(), &st), GPUARR_ERROR_INVALID_HANDLE, "destroyed already");
    cr_assert_eq(out.id, 0u);
    TEST_OK(gpuarr_release(in));
}

Test(offload, shutdown_drops_tasks_and_a_task_from_an_earlier_init_is_stale) {
    gpuarr_task t = widen_task("dropped");
    gpuarr_shutdown();
    init_here();
    cr_assert(strstr(warnings, "dropped 1 tasks") != NULL, "no warning: \"%s\"", warnings);
    TEST_FAIL_WITH(gpuarr_task_destroy(t), GPUARR_ERROR_INVALID_HANDLE, "task");
}

/* ---------------------------------------------------------------------------------------------
 * Bad arguments of gpuarr_offload and gpuarr_map
 * ------------------------------------------------------------------------------------------- */
Test(offload, every_bad_argument_of_offload_is_named_and_nothing_is_written) {
    gpuarr_task t = widen_task("badargs");
    gpuarr_array in = ramp(gpuarr_host(), 8, 0), out = {0x5eed}, two[2] = {in, in}, gone = ramp(gpuarr_host(), 2, 0);
    TEST_OK(gpuarr_release(gone));
    gpuarr_device on = {0x5eed}, forged = {0xdead0001u};
    gpuarr_offload_desc d = odesc(NULL, GPUARR_OFFLOAD_DEFAULT);
    TEST_FAIL_WITH(gpuarr_offload(t, NULL, 1, &out, 1, NULL, &on), GPUARR_ERROR_INVALID_ARGUMENT, "in is NULL");
    TEST_FAIL_WITH(gpuarr_offload(t, &in, 1, NULL, 1, NULL, &on), GPUARR_ERROR_INVALID_ARGUMENT, "out is NULL");
    TEST_FAIL_WITH(gpuarr_offload(t, two, 2, &out, 1, NULL, &on), GPUARR_ERROR_INVALID_ARGUMENT, "n_in = 2");
    TEST_FAIL_WITH(gpuarr_offload(t, &in, 1, &out, 0, NULL, &on), GPUARR_ERROR_INVALID_ARGUMENT, "n_out = 0");
    TEST_FAIL_WITH(gpuarr_offload(t, &gone, 1, &out, 1, NULL, &on), GPUARR_ERROR_INVALID_HANDLE, "in[0]");
    d.policy = (gpuarr_offload_policy)7;
    TEST_FAIL_WITH(gpuarr_offload(t, &in, 1, &out, 1, &d, &on), GPUARR_ERROR_INVALID_ARGUMENT, "desc->policy = 7");
    d = odesc("", GPUARR_OFFLOAD_AUTO);
    TEST_FAIL_WITH(gpuarr_offload(t, &in, 1, &out, 1, &d, &on), GPUARR_ERROR_INVALID_ARGUMENT, "desc->devices is \"\"");
    d = odesc("host,bogus", GPUARR_OFFLOAD_AUTO);
    TEST_FAIL_WITH(gpuarr_offload(t, &in, 1, &out, 1, &d, &on), GPUARR_ERROR_INVALID_ARGUMENT, "bogus");
    d = odesc(NULL, GPUARR_OFFLOAD_AUTO), d.out_dtype = (gpuarr_dtype)99;
    TEST_FAIL_WITH(gpuarr_offload(t, &in, 1, &out, 1, &d, &on), GPUARR_ERROR_INVALID_ARGUMENT, "desc->out_dtype = 99");
    d = odesc(NULL, GPUARR_OFFLOAD_AUTO), d.streams = 17;
    TEST_FAIL_WITH(gpuarr_offload(t, &in, 1, &out, 1, &d, &on), GPUARR_ERROR_INVALID_ARGUMENT, "desc->streams = 17");
    d = odesc(NULL, GPUARR_OFFLOAD_AUTO), d.out_device = forged;
    TEST_FAIL_WITH(gpuarr_offload(t, &in, 1, &out, 1, &d, &on), GPUARR_ERROR_INVALID_HANDLE, "desc->out_device");
    cr_assert(out.id == 0x5eedu && on.id == 0x5eedu, "a failed call wrote its outputs");
    TEST_OK(gpuarr_release(in));
    TEST_OK(gpuarr_task_destroy(t));
}

Test(offload, every_bad_argument_of_map_is_named) {
    gpuarr_task t = widen_task("mapargs");
    gpuarr_array in[3] = {ramp(gpuarr_host(), 4, 0), ramp(gpuarr_host(), 4, 1), ramp(gpuarr_host(), 4, 2)}, out[3] = {{0}};
    int failed = -7;
    gpuarr_offload_desc d = odesc("host", GPUARR_OFFLOAD_AUTO);
    TEST_FAIL_WITH(gpuarr_map(t, NULL, 3, out, NULL, &failed), GPUARR_ERROR_INVALID_ARGUMENT, "in is NULL");
    TEST_FAIL_WITH(gpuarr_map(t, in, 3, NULL, NULL, &failed), GPUARR_ERROR_INVALID_ARGUMENT, "out is NULL");
    TEST_FAIL_WITH(gpuarr_map(t, in, 0, out, NULL, &failed), GPUARR_ERROR_INVALID_ARGUMENT, "n_items = 0");
    d.streams = -1;
    TEST_FAIL_WITH(gpuarr_map(t, in, 3, out, &d, &failed), GPUARR_ERROR_INVALID_ARGUMENT, "desc->streams = -1");
    TEST_OK(gpuarr_release(in[2]));
    TEST_FAIL_WITH(gpuarr_map(t, in, 3, out, NULL, &failed), GPUARR_ERROR_INVALID_HANDLE, "in[2]");
    cr_assert_eq(failed, -7, "failed_item written for an argument error");
    gpuarr_task zero = {0};
    TEST_FAIL_WITH(gpuarr_map(zero, in, 2, out, NULL, &failed), GPUARR_ERROR_INVALID_HANDLE, "zero task handle");
    TEST_OK(gpuarr_release(in[0]));
    TEST_OK(gpuarr_release(in[1]));
    TEST_OK(gpuarr_task_destroy(t));
}

/* ---------------------------------------------------------------------------------------------
 * Policies
 * ------------------------------------------------------------------------------------------- */
Test(offload, policy_host_runs_on_the_host_even_for_large_inputs) {
    gpuarr_task t = widen_task("forced_host");
    gpuarr_array in = ramp(test_device(), 1 << 19, 0); /* 2 MiB: the 1 MiB rule would not pick the host */
    gpuarr_offload_desc d = odesc(host_and_device(), GPUARR_OFFLOAD_HOST);
    cr_assert_eq(offload_once(t, in, &d).id, gpuarr_host().id);
    TEST_OK(gpuarr_release(in));
    TEST_OK(gpuarr_task_destroy(t));
}

Test(offload, policy_host_without_the_host_or_its_implementation_says_why) {
    gpuarr_task_desc td;
    memset(&td, 0, sizeof td);
    td.name = "no_host_impl";
    td.n_in = td.n_out = 1;
    td.impl[GPUARR_BACKEND_OPENCL] = widen;
    gpuarr_task t, t2 = widen_task("host_left_out");
    TEST_OK(gpuarr_task_create(&td, &t));
    gpuarr_array in = ramp(gpuarr_host(), 4, 0), out = {0};
    gpuarr_offload_desc d = odesc("host", GPUARR_OFFLOAD_HOST);
    TEST_FAIL_WITH(gpuarr_offload(t, &in, 1, &out, 1, &d, NULL), GPUARR_ERROR_UNSUPPORTED, "no host implementation");
    gpuarr_device dev = test_device();
    if (!test_device_is_host(dev)) {
        d = odesc(test_device_spec(), GPUARR_OFFLOAD_HOST);
        TEST_FAIL_WITH(gpuarr_offload(t2, &in, 1, &out, 1, &d, NULL), GPUARR_ERROR_NO_DEVICE, "leaves the host out");
    }
    TEST_OK(gpuarr_release(in));
    TEST_OK(gpuarr_task_destroy(t));
    TEST_OK(gpuarr_task_destroy(t2));
}

Test(offload, policy_gpu_runs_on_a_device_other_than_the_host_even_for_small_inputs) {
    gpuarr_task t = widen_task("forced_gpu");
    gpuarr_array in = ramp(gpuarr_host(), 16, 0), out = {0};
    gpuarr_offload_desc d = odesc(host_and_device(), GPUARR_OFFLOAD_GPU);
    if (test_device_is_host(test_device())) {
        TEST_FAIL_WITH(gpuarr_offload(t, &in, 1, &out, 1, &d, NULL), GPUARR_ERROR_NO_DEVICE, "the policy is GPU");
    } else {
        cr_assert_eq(offload_once(t, in, &d).id, test_device().id);
    }
    TEST_OK(gpuarr_release(in));
    TEST_OK(gpuarr_task_destroy(t));
}

static void env_policy(const char *value, bool want_host) {
    gpuarr_shutdown();
    cr_assert_eq(setenv("GPUARR_OFFLOAD", value, 1), 0);
    init_here();
    gpuarr_task t = widen_task("env_policy");
    gpuarr_array big = ramp(test_device(), 1 << 19, 0), small = ramp(gpuarr_host(), 16, 0);
    gpuarr_offload_desc d = odesc(host_and_device(), GPUARR_OFFLOAD_DEFAULT);
    gpuarr_device want = want_host ? gpuarr_host() : test_device();
    cr_assert_eq(offload_once(t, big, &d).id, want.id, "GPUARR_OFFLOAD=%s, 2 MiB", value);
    cr_assert_eq(offload_once(t, small, &d).id, want.id, "GPUARR_OFFLOAD=%s, 64 bytes", value);
    d.policy = GPUARR_OFFLOAD_HOST; /* a call's policy over the variable */
    cr_assert_eq(offload_once(t, big, &d).id, gpuarr_host().id);
    TEST_OK(gpuarr_release(big));
    TEST_OK(gpuarr_release(small));
    TEST_OK(gpuarr_task_destroy(t));
    unsetenv("GPUARR_OFFLOAD");
}

Test(offload, gpuarr_offload_env_forces_a_side) {
    env_policy("host", true);
    if (!test_device_is_host(test_device())) env_policy("GPU", false);
}

Test(offload, gpuarr_offload_env_is_checked_by_init) {
    gpuarr_shutdown();
    cr_assert_eq(setenv("GPUARR_OFFLOAD", "sometimes", 1), 0);
    TEST_FAIL_WITH(gpuarr_init(NULL), GPUARR_ERROR_INVALID_ARGUMENT, "GPUARR_OFFLOAD=\"sometimes\": expected auto, host or gpu");
    unsetenv("GPUARR_OFFLOAD");
    init_here();
}

/* ---------------------------------------------------------------------------------------------
 * The choice with nothing measured, outputs, statistics
 * ------------------------------------------------------------------------------------------- */
Test(offload, with_nothing_measured_over_1_mib_of_input_goes_to_the_device_and_the_rest_to_the_host) {
    gpuarr_device dev = test_device();
    gpuarr_offload_desc d = odesc(host_and_device(), GPUARR_OFFLOAD_AUTO);
    gpuarr_task big = widen_task("rule_big"), small = widen_task("rule_small"), edge = widen_task("rule_edge");
    gpuarr_array a = ramp(gpuarr_host(), (1 << 18) + 1, 0), b = ramp(gpuarr_host(), 1 << 18, 0), c = ramp(gpuarr_host(), 64, 0);
    cr_assert_eq(offload_once(big, a, &d).id, dev.id, "1 MiB + 4 bytes");
    cr_assert_eq(offload_once(edge, b, &d).id, gpuarr_host().id, "exactly 1 MiB");
    cr_assert_eq(offload_once(small, c, &d).id, gpuarr_host().id, "256 bytes");
    gpuarr_array x[3] = {a, b, c};
    for (int i = 0; i < 3; i++) TEST_OK(gpuarr_release(x[i]));
    gpuarr_task y[3] = {big, small, edge};
    for (int i = 0; i < 3; i++) TEST_OK(gpuarr_task_destroy(y[i]));
}

Test(offload, outputs_land_on_out_device_as_out_dtype_with_the_right_values) {
    gpuarr_device dev = test_device();
    gpuarr_task t = widen_task("outputs");
    gpuarr_array in = ramp(gpuarr_host(), 300, 5), out = {0};
    gpuarr_offload_desc d = odesc(host_and_device(), GPUARR_OFFLOAD_GPU);
    if (test_device_is_host(dev)) d.policy = GPUARR_OFFLOAD_HOST;
    d.out_device = gpuarr_host();
    d.out_dtype = GPUARR_I32;
    gpuarr_device on;
    TEST_OK(gpuarr_offload(t, &in, 1, &out, 1, &d, &on));
    cr_assert_eq(on.id, dev.id);
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(out, &info));
    cr_assert_eq(info.device.id, gpuarr_host().id, "the output is not on out_device");
    expect_ramp(out, 300, 5, GPUARR_I32);
    TEST_OK(gpuarr_release(out));
    d.out_device.id = 0, d.out_dtype = 0; /* where and as computed */
    TEST_OK(gpuarr_offload(t, &in, 1, &out, 1, &d, &on));
    TEST_OK(gpuarr_array_get_info(out, &info));
    cr_assert_eq(info.device.id, dev.id);
    expect_ramp(out, 300, 5, GPUARR_F64);
    TEST_OK(gpuarr_release(out));
    TEST_OK(gpuarr_release(in));
    TEST_OK(gpuarr_task_destroy(t));
}

Test(offload, in_dtype_converts_inputs_before_the_implementation_sees_them) {
    gpuarr_task_desc td;
    memset(&td, 0, sizeof td);
    td.name = "in_dtype";
    td.impl[GPUARR_BACKEND_HOST] = widen;
    td.n_in = td.n_out = 1;
    td.in_dtype[0] = GPUARR_I8; /* 300 does not fit: saturates to 127 */
    gpuarr_task t;
    TEST_OK(gpuarr_task_create(&td, &t));
    float v = 300;
    int64_t one = 1;
    gpuarr_array in, out;
    TEST_OK(gpuarr_from_host_as(gpuarr_host(), GPUARR_F32, &v, 1, &one, &in));
    TEST_OK(gpuarr_offload(t, &in, 1, &out, 1, NULL, NULL));
    double got;
    TEST_OK(gpuarr_to_host_as(out, GPUARR_F64, &got, 1));
    cr_assert_eq(got, 127.0);
    TEST_OK(gpuarr_release(out));
    TEST_OK(gpuarr_release(in));
    TEST_OK(gpuarr_task_destroy(t));
}

Test(offload, statistics_count_calls_and_times_per_device) {
    gpuarr_task t = widen_task("stats");
    gpuarr_array in = ramp(gpuarr_host(), 64, 0);
    gpuarr_offload_desc d = odesc("host", GPUARR_OFFLOAD_HOST);
    for (int i = 0; i < 3; i++) offload_once(t, in, &d);
    gpuarr_task_stats st;
    TEST_OK(gpuarr_task_get_stats(t, gpuarr_host(), &st));
    cr_assert_eq(st.calls, 3u);
    cr_assert_eq(st.samples, 2u, "the first run is a warm-up");
    cr_assert_eq(st.explorations, 0u);
    cr_assert(st.measured_s > 0, "measured %g", st.measured_s);
    cr_assert(st.model_b_s > 0 || st.model_a_s > 0, "no fit");
    gpuarr_device dev = test_device();
    if (!test_device_is_host(dev)) {
        TEST_OK(gpuarr_task_get_stats(t, dev, &st));
        cr_assert_eq(st.calls, 0u);
    }
    gpuarr_device forged = {0xdead0001u};
    TEST_FAIL_WITH(gpuarr_task_get_stats(t, forged, &st), GPUARR_ERROR_INVALID_HANDLE, "d");
    TEST_FAIL_WITH(gpuarr_task_get_stats(t, dev, NULL), GPUARR_ERROR_INVALID_ARGUMENT, "out is NULL");
    char buf[2048];
    TEST_OK(gpuarr_task_models_summary(buf, sizeof buf));
    cr_assert(strstr(buf, "task stats on host: t = ") && strstr(buf, "3 calls"), "summary: %s", buf);
    size_t whole = strlen(buf);
    cr_assert(whole > 0 && buf[whole - 1] == '\n', "the summary does not end with a newline: \"%s\"", buf);
    char cut[2048];
    for (size_t len = 1; len <= whole; len++) { /* cut anywhere: the whole lines that fit */
        TEST_OK(gpuarr_task_models_summary(cut, len));
        size_t n = strlen(cut);
        cr_assert(n < len && (n == 0 || cut[n - 1] == '\n') && strncmp(cut, buf, n) == 0,
                  "gpuarr_task_models_summary(buf, %zu) = \"%s\": not the whole lines of \"%s\" that fit", len, cut, buf);
    }
    TEST_FAIL_WITH(gpuarr_task_models_summary(buf, 0), GPUARR_ERROR_INVALID_ARGUMENT, "len is 0");
    TEST_OK(gpuarr_release(in));
    TEST_OK(gpuarr_task_destroy(t));
    t = widen_task("stats"); /* statistics belong to the name, like the models */
    TEST_OK(gpuarr_task_get_stats(t, gpuarr_host(), &st));
    cr_assert_eq(st.calls, 3u);
    TEST_OK(gpuarr_task_destroy(t));
}

Test(offload, the_device_measured_second_is_explored_and_counted) {
    gpuarr_device dev = test_device();
    if (test_device_is_host(dev)) test_skip("needs a device other than the host");
    /* No transfer model: the inputs' transfers cost the fallback (bytes / 1 GB/s, here 0.26 us),
       so the device's estimate stays within exploration's 10x bound on any machine. With a
       fitted model a discrete device's copy latency alone (tens of us) is more than 10x a
       64-element run on the host, and exploration rightly passes it over. */
    gpuarr_shutdown();
    cr_assert_eq(setenv("GPUARR_CALIBRATE", "off", 1), 0);
    init_here();
    unsetenv("GPUARR_CALIBRATE");
    dev = test_device();
    gpuarr_task t = widen_task("explore");
    gpuarr_array in = ramp(gpuarr_host(), 64, 0);
    gpuarr_offload_desc d = odesc(host_and_device(), GPUARR_OFFLOAD_AUTO);
    cr_assert_eq(offload_once(t, in, &d).id, gpuarr_host().id, "the 1 MiB rule");
    for (int i = 0; i < 6; i++) offload_once(t, in, &d);
    gpuarr_task_stats st;
    TEST_OK(gpuarr_task_get_stats(t, dev, &st));
    cr_assert(st.explorations >= 1 && st.explorations <= 3, "%llu explorations of %s", (unsigned long long)st.explorations,
              test_device_spec());
    cr_assert(st.samples >= 1);
    TEST_OK(gpuarr_release(in));
    TEST_OK(gpuarr_task_destroy(t));
}

/* ---------------------------------------------------------------------------------------------
 * Persistence
 * ------------------------------------------------------------------------------------------- */
static void model_file(const char *task, char *path, size_t cap) {
    DIR *dir = opendir(cache_dir);
    cr_assert_not_null(dir);
    path[0] = '\0';
    char prefix[80];
    snprintf(prefix, sizeof prefix, "task-%s-", task);
    for (struct dirent *e; (e = readdir(dir));)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0 && strstr(e->d_name, ".model")) snprintf(path, cap, "%.63s/%.255s", cache_dir, e->d_name);
    closedir(dir);
    cr_assert(path[0], "no model file of %s in %s", task, cache_dir);
}

Test(offload, models_persist_across_init_cycles) {
    gpuarr_task t = widen_task("persist");
    gpuarr_array in = ramp(gpuarr_host(), 64, 0);
    gpuarr_offload_desc d = odesc("host", GPUARR_OFFLOAD_HOST);
    for (int i = 0; i < 5; i++) offload_once(t, in, &d); /* a warm-up and 4 samples */
    gpuarr_task_stats before, after;
    TEST_OK(gpuarr_task_get_stats(t, gpuarr_host(), &before));
    TEST_OK(gpuarr_release(in));
    TEST_OK(gpuarr_task_destroy(t));
    gpuarr_shutdown();
    init_here();
    char buf[1024];
    TEST_OK(gpuarr_task_models_summary(buf, sizeof buf)); /* read from the cache folder */
    cr_assert(strstr(buf, "task persist on host: ") && strstr(buf, "(4 samples"), "summary: %s", buf);
    t = widen_task("persist");
    TEST_OK(gpuarr_task_get_stats(t, gpuarr_host(), &after));
    cr_assert_eq(after.samples, 4u);
    cr_assert_eq(after.calls, 0u, "calls are this process's");
    cr_assert(fabs(after.model_a_s - before.model_a_s) <= 1e-12 && fabs(after.model_b_s - before.model_b_s) <= 1e-15,
              "fit %g + %g n, was %g + %g n", after.model_a_s, after.model_b_s, before.model_a_s, before.model_b_s);
    TEST_OK(gpuarr_task_destroy(t));
}

/* A good model file with 1 MiB of blank lines after its end line: above the size a task model may
   have, so it is refused unread (it used to be read whole and loaded). */
Test(offload, a_model_file_over_the_size_cap_is_refused_unread) {
    gpuarr_task t = widen_task("oversized");
    gpuarr_array in = ramp(gpuarr_host(), 64, 0);
    gpuarr_offload_desc d = odesc("host", GPUARR_OFFLOAD_HOST);
    for (int i = 0; i < 3; i++) offload_once(t, in, &d); /* a warm-up and 2 samples */
    TEST_OK(gpuarr_task_destroy(t));
    TEST_OK(gpuarr_release(in));
    gpuarr_shutdown();
    char path[512];
    model_file("oversized", path, sizeof path);
    FILE *f = fopen(path, "a");
    cr_assert_not_null(f);
    for (int i = 0; i < (1 << 20); i++) fputc('\n', f);
    fclose(f);
    warnings[0] = '\0';
    init_here();
    gpuarr_task_stats st;
    t = widen_task("oversized");
    TEST_OK(gpuarr_task_get_stats(t, gpuarr_host(), &st));
    cr_assert_eq(st.samples, 0u, "an oversized model file was loaded (%llu samples)", (unsigned long long)st.samples);
    cr_assert(strstr(warnings, path) && strstr(warnings, "bytes, more than the"), "the warning does not say why %s is refused: \"%s\"", path,
              warnings);
    TEST_OK(gpuarr_task_destroy(t));
}

Test(offload, a_corrupted_model_file_is_ignored_with_a_warning_and_rebuilt) {
    gpuarr_task t = widen_task("corrupt");
    gpuarr_array in = ramp(gpuarr_host(), 64, 0);
    gpuarr_offload_desc d = odesc("host", GPUARR_OFFLOAD_HOST);
    for (int i = 0; i < 2; i++) offload_once(t, in, &d); /* a warm-up and a sample */
    TEST_OK(gpuarr_task_destroy(t));
    TEST_OK(gpuarr_release(in));
    gpuarr_shutdown();
    char path[512];
    model_file("corrupt", path, sizeof path);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("gpuarr task model 1\ntask corrupt\nkey", f); /* cut short */
    fclose(f);
    warnings[0] = '\0';
    init_here();
    t = widen_task("corrupt");
    gpuarr_task_stats st;
    TEST_OK(gpuarr_task_get_stats(t, gpuarr_host(), &st));
    cr_assert_eq(st.samples, 0u);
    cr_assert(strstr(warnings, path) && strstr(warnings, "corrupted"), "the warning does not name %s: \"%s\"", path, warnings);
    in = ramp(gpuarr_host(), 64, 0);
    for (int i = 0; i < 2; i++) offload_once(t, in, &d);
    TEST_OK(gpuarr_release(in));
    f = fopen(path, "r");
    char line[64] = "";
    cr_assert_not_null(f);
    cr_assert_not_null(fgets(line, sizeof line, f));
    fclose(f);
    cr_assert_str_eq(line, "gpuarr task model 1\n", "not rebuilt");
    gpuarr_shutdown();
    warnings[0] = '\0';
    init_here();
    TEST_OK(gpuarr_task_get_stats(widen_task("corrupt"), gpuarr_host(), &st));
    cr_assert_eq(st.samples, 1u, "the rebuilt file does not load");
    cr_assert_eq(warnings[0], '\0', "%s", warnings);
}

/* ---------------------------------------------------------------------------------------------
 * gpuarr_map
 * ------------------------------------------------------------------------------------------- */
static void map_and_check(const char *name, const char *devices, int n_items, int streams) {
    gpuarr_task t = widen_task(name);
    gpuarr_array *in = calloc((size_t)n_items, sizeof *in), *out = calloc((size_t)n_items, sizeof *out);
    for (int i = 0; i < n_items; i++) in[i] = ramp(gpuarr_host(), 100 + i, (float)(i * 10));
    gpuarr_offload_desc d = odesc(devices, GPUARR_OFFLOAD_AUTO);
    d.streams = streams;
    d.out_device = gpuarr_host();
    int failed = -7;
    TEST_OK(gpuarr_map(t, in, n_items, out, &d, &failed));
    cr_assert_eq(failed, -7, "failed_item written on success");
    for (int i = 0; i < n_items; i++) {
        expect_ramp(out[i], 100 + i, (float)(i * 10), GPUARR_F64);
        TEST_OK(gpuarr_release(out[i]));
        TEST_OK(gpuarr_release(in[i]));
    }
    uint64_t calls = 0;
    for (int k = 0; k < gpuarr_device_count(); k++) {
        gpuarr_task_stats st;
        TEST_OK(gpuarr_task_get_stats(t, gpuarr_device_at(k), &st));
        calls += st.calls;
    }
    cr_assert_eq(calls, (uint64_t)n_items, "the statistics count %llu runs", (unsigned long long)calls);
    free(in);
    free(out);
    TEST_OK(gpuarr_task_destroy(t));
}

Test(offload, map_gives_results_in_item_order) {
    map_and_check("map_two", host_and_device(), 24, 0);
    map_and_check("map_host", "host", 5, 1);
}

Test(offload, map_runs_on_the_host_and_two_opencl_devices) {
    gpuarr_device a, b;
    if (gpuarr_device_find("opencl:0", &a) != GPUARR_OK || gpuarr_device_find("opencl:1", &b) != GPUARR_OK)
        test_skip("needs opencl:0 and opencl:1 (POCL_DEVICES=\"pthread pthread\")");
    gpuarr_task_desc td;
    memset(&td, 0, sizeof td);
    td.name = "map3";
    td.impl[GPUARR_BACKEND_HOST] = td.impl[GPUARR_BACKEND_OPENCL] = widen;
    td.n_in = td.n_out = 1;
    gpuarr_task t;
    TEST_OK(gpuarr_task_create(&td, &t));
    enum { N = 30 };
    gpuarr_array in[N], out[N];
    for (int i = 0; i < N; i++) in[i] = ramp(gpuarr_host(), 1000, (float)i);
    gpuarr_offload_desc d = odesc("host,opencl:0,opencl:1", GPUARR_OFFLOAD_AUTO);
    TEST_OK(gpuarr_map(t, in, N, out, &d, NULL));
    for (int i = 0; i < N; i++) {
        expect_ramp(out[i], 1000, (float)i, GPUARR_F64);
        TEST_OK(gpuarr_release(out[i]));
        TEST_OK(gpuarr_release(in[i]));
    }
    TEST_OK(gpuarr_task_destroy(t));
}

Test(offload, a_failing_item_stops_the_map_and_reports_its_index_and_error) {
    static int fail_at = 5;
    gpuarr_task_desc td;
    memset(&td, 0, sizeof td);
    td.name = "map_fail";
    td.impl[GPUARR_BACKEND_HOST] = widen_or_fail;
    td.impl[backend_of(test_device())] = widen_or_fail;
    td.user_data = &fail_at;
    td.n_in = td.n_out = 1;
    gpuarr_task t;
    TEST_OK(gpuarr_task_create(&td, &t));
    enum { N = 12 };
    gpuarr_array in[N], out[N];
    for (int i = 0; i < N; i++) in[i] = ramp(gpuarr_host(), 50, (float)i);
    gpuarr_offload_desc d = odesc(host_and_device(), GPUARR_OFFLOAD_AUTO);
    int failed = -1;
    TEST_FAIL_WITH(gpuarr_map(t, in, N, out, &d, &failed), GPUARR_ERROR_BACKEND, "item 5: task \"map_fail\" on ");
    cr_assert_eq(failed, 5);
    cr_assert(strncmp(gpuarr_last_error(), "gpuarr_map: item 5: ", 20) == 0, "%s", gpuarr_last_error());
    for (int i = 0; i < N; i++) cr_assert_eq(out[i].id, 0u, "out[%d] was not released", i);
    fail_at = -1; /* and the task still works */
    TEST_OK(gpuarr_map(t, in, N, out, &d, &failed));
    for (int i = 0; i < N; i++) {
        TEST_OK(gpuarr_release(out[i]));
        TEST_OK(gpuarr_release(in[i]));
    }
    TEST_OK(gpuarr_task_destroy(t));
}

Test(offload, offload_reports_the_implementations_error) {
    static int fail_at = 0;
    gpuarr_task_desc td;
    memset(&td, 0, sizeof td);
    td.name = "offload_fail";
    td.impl[GPUARR_BACKEND_HOST] = widen_or_fail;
    td.user_data = &fail_at;
    td.n_in = td.n_out = 1;
    gpuarr_task t;
    TEST_OK(gpuarr_task_create(&td, &t));
    gpuarr_array in = ramp(gpuarr_host(), 8, 0), out = {0x5eed};
    TEST_FAIL_WITH(gpuarr_offload(t, &in, 1, &out, 1, NULL, NULL), GPUARR_ERROR_BACKEND,
                   "task \"offload_fail\" on host: the implementation returned GPUARR_ERROR_BACKEND");
    cr_assert_eq(out.id, 0x5eedu);
    TEST_OK(gpuarr_release(in));
    TEST_OK(gpuarr_task_destroy(t));
}

Test(offload, with_cache_dir_off_models_stay_in_the_process) {
    gpuarr_shutdown();
    cr_assert_eq(setenv("GPUARR_CACHE_DIR", "off", 1), 0);
    init_here();
    gpuarr_task t = widen_task("nowhere");
    gpuarr_array in = ramp(gpuarr_host(), 64, 0);
    gpuarr_offload_desc d = odesc("host", GPUARR_OFFLOAD_HOST);
    for (int i = 0; i < 2; i++) offload_once(t, in, &d); /* a warm-up and a sample */
    gpuarr_task_stats st;
    TEST_OK(gpuarr_task_get_stats(t, gpuarr_host(), &st));
    cr_assert_eq(st.samples, 1u);
    DIR *dir = opendir(cache_dir);
    for (struct dirent *e; dir && (e = readdir(dir));) cr_assert(e->d_name[0] == '.', "%s written", e->d_name);
    if (dir) closedir(dir);
    TEST_OK(gpuarr_release(in));
    TEST_OK(gpuarr_task_destroy(t));
}

/* destroys its own task (user = the handle) while running, then widens */
static gpuarr_result destroy_self(const gpuarr_array *in, int n_in, gpuarr_array *out, int n_out, gpuarr_stream s, void *user) {
    gpuarr_result r = gpuarr_task_destroy(*(gpuarr_task *)user);
    return r != GPUARR_OK ? r : widen(in, n_in, out, n_out, s, user);
}

Test(offload, a_task_destroyed_while_it_runs_finishes_the_call) {
    static gpuarr_task t;
    gpuarr_task_desc td;
    memset(&td, 0, sizeof td);
    td.name = "self_destroy";
    td.impl[GPUARR_BACKEND_HOST] = destroy_self;
    td.user_data = &t;
    td.n_in = td.n_out = 1;
    TEST_OK(gpuarr_task_create(&td, &t));
    gpuarr_array in = ramp(gpuarr_host(), 8, 0), out;
    TEST_OK(gpuarr_offload(t, &in, 1, &out, 1, NULL, NULL));
    expect_ramp(out, 8, 0, GPUARR_F64);
    TEST_FAIL_WITH(gpuarr_task_destroy(t), GPUARR_ERROR_INVALID_HANDLE, "destroyed already");
    TEST_OK(gpuarr_release(out));
    TEST_OK(gpuarr_release(in));
}

/* widens after checking that a slot of the current device is in use (the call's lease) */
static gpuarr_result widen_leased(const gpuarr_array *in, int n_in, gpuarr_array *out, int n_out, gpuarr_stream s, void *user) {
    int total, used;
    gpuarr_result r = gpuarr_device_get_slots(gpuarr_current_device(), &total, &used);
    if (r == GPUARR_OK && used != 1) return GPUARR_ERROR_INVALID_ARGUMENT;
    return r != GPUARR_OK ? r : widen(in, n_in, out, n_out, s, user);
}

Test(offload, with_lease_the_call_holds_a_slot_while_it_runs_on_a_device_with_one_free) {
    gpuarr_task_desc td;
    memset(&td, 0, sizeof td);
    td.name = "leased";
    td.impl[GPUARR_BACKEND_HOST] = widen_leased;
    td.impl[backend_of(test_device())] = widen_leased;
    td.n_in = td.n_out = 1;
    gpuarr_task t;
    TEST_OK(gpuarr_task_create(&td, &t));
    gpuarr_array in = ramp(gpuarr_host(), 8, 0);
    gpuarr_offload_desc d = odesc("host", GPUARR_OFFLOAD_AUTO);
    d.lease = true;
    TEST_OK(gpuarr_device_set_slots(gpuarr_host(), 1));
    cr_assert_eq(offload_once(t, in, &d).id, gpuarr_host().id);
    int total, used;
    TEST_OK(gpuarr_device_get_slots(gpuarr_host(), &total, &used));
    cr_assert_eq(used, 0, "the lease was not given back");
    gpuarr_device dev = test_device();
    if (!test_device_is_host(dev)) { /* the host's one slot held: the device, though the 1 MiB rule says host */
        TEST_OK(gpuarr_device_set_slots(dev, 1));
        gpuarr_lease_desc ld;
        memset(&ld, 0, sizeof ld);
        ld.devices = "host";
        gpuarr_lease held;
        TEST_OK(gpuarr_lease_acquire(&ld, &held));
        d = odesc(host_and_device(), GPUARR_OFFLOAD_AUTO);
        d.lease = true;
        cr_assert_eq(offload_once(t, in, &d).id, dev.id);
        TEST_OK(gpuarr_lease_release(held));
    }
    TEST_OK(gpuarr_release(in));
    TEST_OK(gpuarr_task_destroy(t));
}

/* widen; the first want_together calls wait (up to 5 s) until that many run at once (later ones
   do not wait: too few may be left); records the most at once */
static int running_now, most_at_once, want_together, calls_started, gathered;
static gpuarr_result widen_together(const gpuarr_array *in, int n_in, gpuarr_array *out, int n_out, gpuarr_stream s, void *user) {
    if (__atomic_add_fetch(&running_now, 1, __ATOMIC_SEQ_CST) >= want_together) __atomic_store_n(&gathered, 1, __ATOMIC_SEQ_CST);
    int now;
    bool wait = __atomic_add_fetch(&calls_started, 1, __ATOMIC_SEQ_CST) <= want_together;
    /* until that many ran at once: the first to see them may finish before the others look */
    for (int i = 0; wait && i < 5000 && !__atomic_load_n(&gathered, __ATOMIC_SEQ_CST); i++) usleep(1000);
    now = __atomic_load_n(&running_now, __ATOMIC_SEQ_CST);
    for (int m = __atomic_load_n(&most_at_once, __ATOMIC_SEQ_CST); now > m && !__atomic_compare_exchange_n(&most_at_once, &m, now, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);) {}
    gpuarr_result r = widen(in, n_in, out, n_out, s, user);
    __atomic_sub_fetch(&running_now, 1, __ATOMIC_SEQ_CST);
    return r;
}

static int most_at_once_with(int streams) {
    gpuarr_task_desc td;
    memset(&td, 0, sizeof td);
    td.name = "together";
    td.impl[GPUARR_BACKEND_HOST] = widen_together;
    td.n_in = td.n_out = 1;
    gpuarr_task t;
    TEST_OK(gpuarr_task_create(&td, &t));
    gpuarr_array in[4], out[4];
    for (int i = 0; i < 4; i++) in[i] = ramp(gpuarr_host(), 8, (float)i);
    gpuarr_offload_desc d = odesc("host", GPUARR_OFFLOAD_AUTO);
    d.streams = streams;
    most_at_once = calls_started = gathered = 0;
    want_together = streams ? streams : 2;
    TEST_OK(gpuarr_map(t, in, 4, out, &d, NULL));
    for (int i = 0; i < 4; i++) {
        expect_ramp(out[i], 8, (float)i, GPUARR_F64);
        TEST_OK(gpuarr_release(out[i]));
        TEST_OK(gpuarr_release(in[i]));
    }
    TEST_OK(gpuarr_task_destroy(t));
    return most_at_once;
}

Test(offload, map_runs_two_items_at_once_per_device_by_default_and_streams_sets_it) {
    cr_assert_eq(most_at_once_with(0), 2);
    cr_assert_eq(most_at_once_with(1), 1);
    cr_assert_eq(most_at_once_with(3), 3, "three streams");
}

/* gpuarr_map's streams start their first items together: every run that started before the
   first one finished is a warm-up (it shares the one-off work: PoCL building the kernel), not a
   sample of a young model. Three streams, three first items held until all three run. */
Test(offload, map_runs_that_start_before_the_first_finishes_are_warm_ups) {
    gpuarr_task_desc td;
    memset(&td, 0, sizeof td);
    td.name = "warmups";
    td.impl[GPUARR_BACKEND_HOST] = td.impl[backend_of(test_device())] = widen_together;
    td.n_in = td.n_out = 1;
    gpuarr_task t;
    TEST_OK(gpuarr_task_create(&td, &t));
    enum { N = 6 };
    gpuarr_array in[N], out[N];
    for (int i = 0; i < N; i++) in[i] = ramp(gpuarr_host(), 8, (float)i);
    gpuarr_offload_desc d = odesc(test_device_spec(), GPUARR_OFFLOAD_AUTO);
    d.streams = 3;
    most_at_once = calls_started = gathered = 0;
    want_together = 3;
    TEST_OK(gpuarr_map(t, in, N, out, &d, NULL));
    cr_assert_eq(most_at_once, 3, "the first three items did not run together");
    gpuarr_task_stats st;
    TEST_OK(gpuarr_task_get_stats(t, test_device(), &st));
    cr_assert_eq(st.calls, (uint64_t)N);
    cr_assert_eq(st.samples, (uint64_t)N - 3, "%llu samples: the three first runs are warm-ups", (unsigned long long)st.samples);
    for (int i = 0; i < N; i++) {
        expect_ramp(out[i], 8, (float)i, GPUARR_F64);
        TEST_OK(gpuarr_release(out[i]));
        TEST_OK(gpuarr_release(in[i]));
    }
    TEST_OK(gpuarr_task_destroy(t));
}
