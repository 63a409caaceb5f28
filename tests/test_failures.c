/*
 * test_failures.c -- failures detected and contained: a sticky error fails its device
 * (GPUARR_ERROR_DEVICE_LOST from then on, naming the first error, without the driver), other
 * devices work on, releases work, gpuarr_device_reset brings the device back once everything of
 * it is released, and errors that are not sticky never fail a device.
 *
 * The CUDA tests run on the fake driver (tests/fake_cuda, GPUARR_CUDA_LIBRARY: two GPUs): its
 * FAKE_CUDA_STICKY (fake_cuda_sticky_set) faults an op while the stream runs it, and its
 * FAKE_CUDA_FAIL rules (fake_cuda_fail_set) fail a call. The OpenCL tests run on PoCL's two
 * devices through tests/fault_opencl (GPUARR_TEST_FAULT_OPENCL), whose FAULT_OPENCL_LOST
 * (fault_opencl_lose) loses a device. Each skips, saying why, without them; make test sets both.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include "test_common.h"

TestSuite(failures, .init = test_setup, .fini = test_teardown);

/* A function of the loaded fake driver or fault library, by name (ISO C: copied bits). */
static void *lib_function(const char *env, const char *name) {
    const char *path = getenv(env);
    if (!path || !*path) test_skip("%s is not set (make test sets it)", env);
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (!h) test_skip("%s=%s is not the loaded library", env, path);
    void *sym = dlsym(h, name);
    dlclose(h); /* still loaded: gpuarr holds it */
    if (!sym) test_skip("%s=%s has no %s: not the fake driver or fault library", env, path, name);
    return sym;
}

static gpuarr_device find(const char *spec) {
    gpuarr_device d = {0};
    gpuarr_result r = gpuarr_device_find(spec, &d);
    if (r != GPUARR_OK) test_skip("%s: %s", spec, gpuarr_last_error());
    return d;
}

static gpuarr_device_state state_of(gpuarr_device d, char *failure, size_t len) {
    gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(d, &info));
    if (failure) snprintf(failure, len, "%s", info.failure);
    return info.state;
}

enum { N = 4096 };

/* Upload, a cast on the device and back, download: the device works. */
static void round_trip(gpuarr_device d) {
    static float in[N], back[N];
    for (int i = 0; i < N; i++) in[i] = (float)i * 0.5f - 7.0f;
    int64_t shape[1] = {N};
    gpuarr_array a, h, f;
    TEST_OK(gpuarr_from_host(d, in, 1, shape, &a));
    TEST_OK(gpuarr_convert(a, d, GPUARR_F64, &f));
    TEST_OK(gpuarr_convert(f, d, GPUARR_F32, &h));
    TEST_OK(gpuarr_to_host(h, back, N));
    cr_assert_eq(memcmp(in, back, sizeof in), 0, "the round trip on a device read back wrong values");
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(f));
    TEST_OK(gpuarr_release(h));
}

/* ---------------------------------------------------------------------------------------------
 * CUDA (the fake driver)
 * ------------------------------------------------------------------------------------------- */
typedef unsigned long long (*sticky_set_fn)(unsigned long long);
typedef int (*fail_set_fn)(const char *);
typedef unsigned long long (*calls_fn)(void);

static sticky_set_fn fake_sticky_set(void) {
    sticky_set_fn f;
    void *p = lib_function("GPUARR_CUDA_LIBRARY", "fake_cuda_sticky_set");
    memcpy(&f, &p, sizeof p);
    return f;
}
static fail_set_fn fake_fail_set(void) {
    fail_set_fn f;
    void *p = lib_function("GPUARR_CUDA_LIBRARY", "fake_cuda_fail_set");
    memcpy(&f, &p, sizeof p);
    return f;
}
static calls_fn fake_calls(void) {
    calls_fn f;
    void *p = lib_function("GPUARR_CUDA_LIBRARY", "fake_cuda_calls_made");
    memcpy(&f, &p, sizeof p);
    return f;
}

Test(failures, a_sticky_cuda_error_mid_stream_loses_the_device_its_arrays_streams_and_events_and_nothing_else) {
    sticky_set_fn sticky = fake_sticky_set();
    calls_fn calls = fake_calls();
    gpuarr_device d0 = find("cuda:0"), d1 = find("cuda:1");
    static float in[N], back[N];
    for (int i = 0; i < N; i++) in[i] = (float)i;
    int64_t shape[1] = {N};
    gpuarr_array a, b, c = {0}, out = {0xA5A5A5A5u};
    gpuarr_stream s;
    gpuarr_event e;
    TEST_OK(gpuarr_from_host(d0, in, 1, shape, &a));
    TEST_OK(gpuarr_from_host(d1, in, 1, shape, &b));
    TEST_OK(gpuarr_stream_create(d0, 0, &s));
    TEST_OK(gpuarr_event_create(d0, 0, &e));
    cr_assert_eq(state_of(d0, NULL, 0), GPUARR_DEVICE_OK);

    /* the cast kernel queued on s faults when s runs it: the sync meets the error */
    sticky(1);
    TEST_OK(gpuarr_convert_async(a, d0, GPUARR_F16, s, &c));
    TEST_FAIL_WITH(gpuarr_stream_sync(s), GPUARR_ERROR_DEVICE_LOST, "CUDA_ERROR_ILLEGAL_ADDRESS");
    cr_expect(strstr(gpuarr_last_error(), "cuStreamSynchronize"), "%s", gpuarr_last_error());
    sticky(0);
    char failure[256];
    cr_assert_eq(state_of(d0, failure, sizeof failure), GPUARR_DEVICE_FAILED);
    cr_expect_str_eq(failure, "CUDA_ERROR_ILLEGAL_ADDRESS in cuStreamSynchronize");

    /* from now on: DEVICE_LOST naming the first error, at once, without one driver call */
    const char *first = "cuda:0 failed earlier: CUDA_ERROR_ILLEGAL_ADDRESS in cuStreamSynchronize";
    unsigned long long before = calls();
    gpuarr_array_info ai;
    bool done;
    TEST_FAIL_WITH(gpuarr_to_host(a, back, N), GPUARR_ERROR_DEVICE_LOST, first);
    TEST_FAIL_WITH(gpuarr_array_get_info(c, &ai), GPUARR_ERROR_DEVICE_LOST, first);
    TEST_FAIL_WITH(gpuarr_convert(a, gpuarr_host(), 0, &out), GPUARR_ERROR_DEVICE_LOST, first);
    TEST_FAIL_WITH(gpuarr_convert(b, d0, 0, &out), GPUARR_ERROR_DEVICE_LOST, first);
    TEST_FAIL_WITH(gpuarr_empty(d0, GPUARR_F32, 1, shape, &out), GPUARR_ERROR_DEVICE_LOST, first);
    TEST_FAIL_WITH(gpuarr_stream_sync(s), GPUARR_ERROR_DEVICE_LOST, first);
    TEST_FAIL_WITH(gpuarr_stream_query(s, &done), GPUARR_ERROR_DEVICE_LOST, first);
    TEST_FAIL_WITH(gpuarr_event_record(e, s), GPUARR_ERROR_DEVICE_LOST, first);
    TEST_FAIL_WITH(gpuarr_event_query(e, &done), GPUARR_ERROR_DEVICE_LOST, first);
    TEST_FAIL_WITH(gpuarr_device_sync(d0), GPUARR_ERROR_DEVICE_LOST, first);
    gpuarr_stream s2 = {0xA5A5A5A5u};
    TEST_FAIL_WITH(gpuarr_stream_create(d0, 0, &s2), GPUARR_ERROR_DEVICE_LOST, first);
    cr_expect_eq(s2.id, 0xA5A5A5A5u);
    cr_expect_eq(out.id, 0xA5A5A5A5u, "an out handle was written on an error");
    cr_expect_eq(calls(), before, "calls on the failed device reached the driver (%llu calls)", calls() - before);
    /* telemetry still answers (NVML does not go through the dead context), without the driver */
    gpuarr_telemetry t;
    TEST_OK(gpuarr_device_get_telemetry(d0, &t));
    cr_expect(t.valid & GPUARR_TELEMETRY_MEMORY_TOTAL, "valid = 0x%x", t.valid);
    cr_expect_eq(calls(), before, "telemetry of the failed device reached the driver");

    /* cuda:1 is unaffected: a conversion on it, and to the host */
    gpuarr_array b2, bh;
    TEST_OK(gpuarr_convert(b, d1, GPUARR_F64, &b2));
    TEST_OK(gpuarr_convert(b2, gpuarr_host(), GPUARR_F32, &bh));
    TEST_OK(gpuarr_to_host(bh, back, N));
    cr_assert_eq(memcmp(in, back, sizeof in), 0);
    cr_assert_eq(state_of(d1, NULL, 0), GPUARR_DEVICE_OK);

    /* a reset is refused while anything of cuda:0 is alive, saying how much */
    TEST_FAIL_WITH(gpuarr_device_reset(d0), GPUARR_ERROR_INVALID_ARGUMENT, "2 arrays, 1 streams and 1 events alive");
    cr_assert_eq(state_of(d0, NULL, 0), GPUARR_DEVICE_FAILED);
    /* releases work, without the driver */
    before = calls();
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(c));
    TEST_OK(gpuarr_stream_destroy(s));
    TEST_OK(gpuarr_event_destroy(e));
    cr_expect_eq(calls(), before, "releasing a failed device's objects called the driver");
    /* then the reset brings it back */
    TEST_OK(gpuarr_device_reset(d0));
    cr_assert_eq(state_of(d0, failure, sizeof failure), GPUARR_DEVICE_OK);
    cr_expect_str_eq(failure, "");
    round_trip(d0);
    round_trip(d1);
    /* and peer copies between the two again */
    gpuarr_array p0, back1;
    TEST_OK(gpuarr_convert(b, d0, 0, &p0));
    TEST_OK(gpuarr_convert(p0, d1, 0, &back1));
    TEST_OK(gpuarr_to_host(back1, back, N));
    cr_assert_eq(memcmp(in, back, sizeof in), 0);
    for (gpuarr_array *x = (gpuarr_array[]){b, b2, bh, p0, back1}, *end = x + 5; x < end; x++) TEST_OK(gpuarr_release(*x));
}

Test(failures, a_sticky_cuda_error_at_a_call_loses_the_device_and_names_the_call) {
    fail_set_fn fail = fake_fail_set();
    gpuarr_device d0 = find("cuda:0");
    static float in[N];
    int64_t shape[1] = {N};
    gpuarr_array a = {0xA5A5A5A5u};
    cr_assert_eq(fail("cuMemcpyHtoDAsync_v2:1:CUDA_ERROR_LAUNCH_FAILED"), 0);
    TEST_FAIL_WITH(gpuarr_from_host(d0, in, 1, shape, &a), GPUARR_ERROR_DEVICE_LOST, "cuMemcpyHtoDAsync failed: CUDA_ERROR_LAUNCH_FAILED");
    cr_assert_eq(fail(""), 0);
    cr_expect_eq(a.id, 0xA5A5A5A5u);
    char failure[256];
    cr_assert_eq(state_of(d0, failure, sizeof failure), GPUARR_DEVICE_FAILED);
    cr_expect_str_eq(failure, "CUDA_ERROR_LAUNCH_FAILED in cuMemcpyHtoDAsync");
    TEST_FAIL_WITH(gpuarr_from_host(d0, in, 1, shape, &a), GPUARR_ERROR_DEVICE_LOST, "cuda:0 failed earlier: CUDA_ERROR_LAUNCH_FAILED");
    round_trip(find("cuda:1"));
    TEST_OK(gpuarr_device_reset(d0));
    round_trip(d0);
}

/* Out of memory, an invalid value, a bad argument: errors, and the device works on. */
Test(failures, errors_that_are_not_sticky_never_fail_a_device) {
    fail_set_fn fail = fake_fail_set();
    gpuarr_device d0 = find("cuda:0");
    static float in[N];
    int64_t shape[1] = {N}, bad[1] = {-1};
    gpuarr_array a;
    TEST_OK(gpuarr_pool_inject_faults(d0, 0, 1 << 20)); /* every raw allocation above 1 MiB fails: out of memory */
    TEST_FAIL_WITH(gpuarr_empty(d0, GPUARR_F32, 1, (int64_t[]){64 << 20}, &a), GPUARR_ERROR_OUT_OF_MEMORY, "injected allocation failure");
    TEST_OK(gpuarr_pool_inject_faults(d0, 0, 0));
    cr_assert_eq(state_of(d0, NULL, 0), GPUARR_DEVICE_OK);
    char rules[512] = "";
    for (int i = 1; i <= 8; i++) /* the allocation and every retry of the out-of-memory ladder */
        snprintf(rules + strlen(rules), sizeof rules - strlen(rules), "%scuMemAlloc_v2:%d:CUDA_ERROR_OUT_OF_MEMORY", i > 1 ? "," : "", i);
    cr_assert_eq(fail(rules), 0);
    TEST_FAIL_WITH(gpuarr_empty(d0, GPUARR_F32, 1, (int64_t[]){96 << 20}, &a), GPUARR_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY");
    cr_assert_eq(fail("cuMemcpyHtoDAsync_v2:1:CUDA_ERROR_INVALID_VALUE"), 0);
    TEST_FAIL_WITH(gpuarr_from_host(d0, in, 1, shape, &a), GPUARR_ERROR_BACKEND, "CUDA_ERROR_INVALID_VALUE");
    cr_assert_eq(fail(""), 0);
    TEST_FAIL_WITH(gpuarr_empty(d0, GPUARR_F32, 1, bad, &a), GPUARR_ERROR_INVALID_ARGUMENT, "shape[0]");
    cr_assert_eq(state_of(d0, NULL, 0), GPUARR_DEVICE_OK);
    round_trip(d0);
}

Test(failures, a_healthy_device_resets_too_and_the_host_has_nothing_to_reset) {
    gpuarr_device d0 = find("cuda:0");
    round_trip(d0);
    gpuarr_stream s;
    TEST_OK(gpuarr_stream_create(d0, 0, &s));
    TEST_FAIL_WITH(gpuarr_device_reset(d0), GPUARR_ERROR_INVALID_ARGUMENT, "0 arrays, 1 streams and 0 events alive");
    TEST_OK(gpuarr_stream_destroy(s));
    TEST_OK(gpuarr_device_reset(d0));
    round_trip(d0);
    /* an array of cuda:1 made through cuda:0 (a peer copy each way) outlives cuda:0's reset */
    gpuarr_device d1 = find("cuda:1");
    static float in[N], back[N];
    for (int i = 0; i < N; i++) in[i] = (float)(3 * i);
    int64_t shape[1] = {N};
    gpuarr_array x, p, q;
    TEST_OK(gpuarr_from_host(d1, in, 1, shape, &x));
    TEST_OK(gpuarr_convert(x, d0, GPUARR_F64, &p));
    TEST_OK(gpuarr_convert(p, d1, GPUARR_F32, &q));
    TEST_OK(gpuarr_release(p));
    TEST_OK(gpuarr_device_reset(d0));
    TEST_OK(gpuarr_to_host(q, back, N));
    cr_assert_eq(memcmp(in, back, sizeof in), 0);
    TEST_OK(gpuarr_release(q));
    TEST_OK(gpuarr_release(x));
    TEST_OK(gpuarr_device_reset(d0));
    round_trip(d0);
    TEST_OK(gpuarr_device_reset(gpuarr_host()));
    round_trip(gpuarr_host());
    TEST_FAIL_WITH(gpuarr_device_reset((gpuarr_device){0}), GPUARR_ERROR_INVALID_HANDLE, "d");
}

/* A thread that worked on d before another thread's reset works on after it: its default stream
   there (cached per thread) is made anew, not used from the old context. */
typedef struct reset_worker {
    gpuarr_device d;
    pthread_barrier_t *barrier;
    gpuarr_result before, after;
    bool same;
} reset_worker;

static gpuarr_result small_round_trip(gpuarr_device d, bool *same) {
    float in[64], back[64];
    for (int i = 0; i < 64; i++) in[i] = (float)i;
    int64_t shape[1] = {64};
    gpuarr_array a;
    gpuarr_result r = gpuarr_from_host(d, in, 1, shape, &a);
    if (r != GPUARR_OK) return r;
    r = gpuarr_to_host(a, back, 64);
    *same = r == GPUARR_OK && memcmp(in, back, sizeof in) == 0;
    gpuarr_release(a);
    return r;
}

static void *reset_worker_main(void *p) {
    reset_worker *w = (reset_worker *)p;
    bool same = false;
    w->before = small_round_trip(w->d, &same); /* this thread's default stream on d */
    pthread_barrier_wait(w->barrier);          /* the main thread resets d */
    pthread_barrier_wait(w->barrier);
    w->after = small_round_trip(w->d, &w->same);
    return NULL;
}

Test(failures, a_thread_works_on_after_another_thread_reset_the_device) {
    gpuarr_device d0 = find("cuda:0");
    pthread_barrier_t barrier;
    cr_assert_eq(pthread_barrier_init(&barrier, NULL, 2), 0);
    reset_worker w = {d0, &barrier, GPUARR_ERROR_BACKEND, GPUARR_ERROR_BACKEND, false};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, reset_worker_main, &w), 0);
    pthread_barrier_wait(&barrier);
    TEST_OK(gpuarr_device_reset(d0));
    pthread_barrier_wait(&barrier);
    cr_assert_eq(pthread_join(t, NULL), 0);
    pthread_barrier_destroy(&barrier);
    cr_assert_eq(w.before, GPUARR_OK);
    cr_assert_eq(w.after, GPUARR_OK, "the other thread after the reset: %s", gpuarr_result_name(w.after));
    cr_assert(w.same);
}

/* ---------------------------------------------------------------------------------------------
 * OpenCL (PoCL's two devices through tests/fault_opencl)
 * ------------------------------------------------------------------------------------------- */
typedef void (*lose_fn)(int, unsigned long long, int);

/* gpuarr restarted on the fault library; its fault_opencl_lose. */
static lose_fn opencl_through_fault_library(void) {
    const char *lib = getenv("GPUARR_TEST_FAULT_OPENCL");
    if (!lib || !*lib) test_skip("GPUARR_TEST_FAULT_OPENCL (the library of tests/fault_opencl) is not set; make test sets it");
    gpuarr_shutdown();
    cr_assert_eq(setenv("GPUARR_OPENCL_LIBRARY", lib, 1), 0);
    gpuarr_result r = gpuarr_init(NULL);
    unsetenv("GPUARR_OPENCL_LIBRARY");
    cr_assert_eq(r, GPUARR_OK, "%s", gpuarr_last_error());
    lose_fn f;
    void *p = lib_function("GPUARR_TEST_FAULT_OPENCL", "fault_opencl_lose");
    memcpy(&f, &p, sizeof p);
    return f;
}

Test(failures, a_lost_opencl_device_fails_alone_and_comes_back_after_a_reset) {
    lose_fn lose = opencl_through_fault_library();
    gpuarr_device d0 = find("opencl:0"), d1 = find("opencl:1");
    static float in[N], back[N];
    for (int i = 0; i < N; i++) in[i] = (float)i;
    int64_t shape[1] = {N};
    gpuarr_array a, b, out = {0xA5A5A5A5u};
    TEST_OK(gpuarr_from_host(d0, in, 1, shape, &a));
    TEST_OK(gpuarr_from_host(d1, in, 1, shape, &b));
    lose(0, 1, 0); /* opencl:0 is gone from its next queue call */
    TEST_FAIL_WITH(gpuarr_to_host(a, back, N), GPUARR_ERROR_DEVICE_LOST, "CL_DEVICE_NOT_AVAILABLE");
    char failure[256];
    cr_assert_eq(state_of(d0, failure, sizeof failure), GPUARR_DEVICE_FAILED);
    cr_expect(strncmp(failure, "CL_DEVICE_NOT_AVAILABLE in clEnqueue", 36) == 0, "%s", failure);
    char first[300];
    snprintf(first, sizeof first, "opencl:0 failed earlier: %s", failure);
    TEST_FAIL_WITH(gpuarr_to_host(a, back, N), GPUARR_ERROR_DEVICE_LOST, first);
    TEST_FAIL_WITH(gpuarr_empty(d0, GPUARR_F32, 1, shape, &out), GPUARR_ERROR_DEVICE_LOST, first);
    TEST_FAIL_WITH(gpuarr_convert(b, d0, 0, &out), GPUARR_ERROR_DEVICE_LOST, first);
    cr_expect_eq(out.id, 0xA5A5A5A5u);
    /* opencl:1, in the same context, works on */
    gpuarr_array b2;
    TEST_OK(gpuarr_convert(b, d1, GPUARR_F64, &b2));
    TEST_OK(gpuarr_to_host(b2, back, N));
    cr_assert_eq(memcmp(in, back, sizeof in), 0);
    cr_assert_eq(state_of(d1, NULL, 0), GPUARR_DEVICE_OK);
    TEST_FAIL_WITH(gpuarr_device_reset(d0), GPUARR_ERROR_INVALID_ARGUMENT, "1 arrays, 0 streams and 0 events alive");
    TEST_OK(gpuarr_release(a));
    /* still gone: the reset cannot make its queue, and the device stays failed */
    TEST_FAIL_WITH(gpuarr_device_reset(d0), GPUARR_ERROR_DEVICE_LOST, "CL_DEVICE_NOT_AVAILABLE");
    cr_assert_eq(state_of(d0, NULL, 0), GPUARR_DEVICE_FAILED);
    lose(-1, 0, 0); /* back (a driver restart, a hot-plug) */
    TEST_OK(gpuarr_device_reset(d0));
    cr_assert_eq(state_of(d0, NULL, 0), GPUARR_DEVICE_OK);
    round_trip(d0);
    round_trip(d1);
    TEST_OK(gpuarr_release(b));
    TEST_OK(gpuarr_release(b2));
}

/* Leases (LEASES): a FAILED device is never leased; with no other candidate, DEVICE_LOST at once. */
Test(failures, a_failed_device_is_never_leased) {
    char dir[] = "/tmp/gpuarr-test-failures-XXXXXX"; /* slot files of its own */
    cr_assert_not_null(mkdtemp(dir));
    cr_assert_eq(setenv("GPUARR_LEASE_DIR", dir, 1), 0);
    lose_fn lose = opencl_through_fault_library();
    gpuarr_device d0 = find("opencl:0"), d1 = find("opencl:1");
    static float in[N], back[N];
    int64_t shape[1] = {N};
    gpuarr_array a;
    TEST_OK(gpuarr_from_host(d0, in, 1, shape, &a));
    lose(0, 1, 0);
    TEST_FAIL_WITH(gpuarr_to_host(a, back, N), GPUARR_ERROR_DEVICE_LOST, "CL_DEVICE_NOT_AVAILABLE");
    cr_assert_eq(state_of(d0, NULL, 0), GPUARR_DEVICE_FAILED);
    TEST_OK(gpuarr_device_set_slots(d0, 4));
    TEST_OK(gpuarr_device_set_slots(d1, 4));
    gpuarr_lease_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.devices = "opencl:*"; /* opencl:0 listed first, with as many free slots */
    gpuarr_lease l[4];
    for (int i = 0; i < 4; i++) {
        gpuarr_device on;
        TEST_OK(gpuarr_lease_acquire(&ld, &l[i]));
        TEST_OK(gpuarr_lease_device(l[i], &on));
        cr_assert_eq(on.id, d1.id, "lease %d", i);
    }
    TEST_FAIL_WITH(gpuarr_lease_acquire(&ld, &l[0]), GPUARR_ERROR_TIMEOUT, "opencl:0: failed (CL_DEVICE_NOT_AVAILABLE");
    ld.devices = "opencl:0";
    TEST_FAIL_WITH(gpuarr_lease_acquire(&ld, &l[0]), GPUARR_ERROR_DEVICE_LOST, "every candidate has failed");
    /* "local" (LOCAL RANK) keeps a failed device's place, so every rank maps alike; its lease fails, naming the rank */
    char spec[24], why[96];
    int k = -1;
    for (int i = 0; i < gpuarr_device_count() && k < 0; i++) {
        gpuarr_device on;
        snprintf(spec, sizeof spec, "local:%d", i);
        TEST_OK(gpuarr_device_find(spec, &on));
        if (on.id == d0.id) k = i;
    }
    cr_assert(k >= 0, "no local:R names the failed opencl:0");
    snprintf(spec, sizeof spec, "local:%d", k);
    snprintf(why, sizeof why, "(local rank %d from the spec: opencl:0 (", k);
    ld.devices = spec;
    TEST_FAIL_WITH(gpuarr_lease_acquire(&ld, &l[0]), GPUARR_ERROR_DEVICE_LOST, why);
    ld.devices = "opencl:0";
    for (int i = 0; i < 4; i++) TEST_OK(gpuarr_lease_release(l[i]));
    /* nor planned (PLANS) */
    gpuarr_plan_step steps[2] = {{"a", "opencl:*", 0, 0}, {"b", "opencl:*", 0, 0}};
    gpuarr_device where[2];
    TEST_OK(gpuarr_plan(steps, 2, GPUARR_PLACE_DEFAULT, where));
    cr_assert(where[0].id == d1.id && where[1].id == d1.id, "a plan on the failed opencl:0");
    steps[1].devices = "opencl:0";
    TEST_FAIL_WITH(gpuarr_plan(steps, 2, GPUARR_PLACE_DEFAULT, where), GPUARR_ERROR_NO_DEVICE, "steps[1] (\"b\"): no device can take it: opencl:0 has failed");
    TEST_OK(gpuarr_release(a));
    lose(-1, 0, 0);
    TEST_OK(gpuarr_device_reset(d0));
    TEST_OK(gpuarr_lease_acquire(&ld, &l[0]));
    TEST_OK(gpuarr_lease_release(l[0]));
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
}

/* A failed device has no transfer estimate and is not calibrated (TRANSFER MODEL); others still are. */
Test(failures, a_failed_device_gets_no_transfer_estimate) {
    lose_fn lose = opencl_through_fault_library();
    gpuarr_device d0 = find("opencl:0"), d1 = find("opencl:1"), host = gpuarr_host();
    static float in[N], back[N];
    int64_t shape[1] = {N};
    gpuarr_array a;
    TEST_OK(gpuarr_from_host(d0, in, 1, shape, &a));
    lose(0, 1, 0);
    TEST_FAIL_WITH(gpuarr_to_host(a, back, N), GPUARR_ERROR_DEVICE_LOST, "CL_DEVICE_NOT_AVAILABLE");
    double s = 42;
    TEST_FAIL_WITH(gpuarr_transfer_estimate(d0, host, GPUARR_F32, 4096, &s), GPUARR_ERROR_DEVICE_LOST, "CL_DEVICE_NOT_AVAILABLE");
    TEST_FAIL_WITH(gpuarr_transfer_estimate(host, d0, GPUARR_F32, 4096, &s), GPUARR_ERROR_DEVICE_LOST, "CL_DEVICE_NOT_AVAILABLE");
    TEST_FAIL_WITH(gpuarr_transfer_estimate(a, host, GPUARR_F32, 0, &s), GPUARR_ERROR_DEVICE_LOST, "CL_DEVICE_NOT_AVAILABLE");
    TEST_FAIL_WITH(gpuarr_calibrate(d0), GPUARR_ERROR_DEVICE_LOST, "CL_DEVICE_NOT_AVAILABLE");
    cr_expect_eq(s, 42.0, "seconds written on failure");
    TEST_OK(gpuarr_transfer_estimate(host, d1, GPUARR_F16, 4096, &s)); /* the other device works on */
    cr_expect(s >= 0);
    TEST_OK(gpuarr_release(a));
    lose(-1, 0, 0);
    TEST_OK(gpuarr_device_reset(d0));
    TEST_OK(gpuarr_transfer_estimate(d0, host, GPUARR_F32, 4096, &s));
}

/* The context's error callback cannot say which of its devices failed: all of them do. */
Test(failures, an_opencl_context_error_callback_fails_every_device_of_the_context) {
    lose_fn lose = opencl_through_fault_library();
    gpuarr_device d0 = find("opencl:0"), d1 = find("opencl:1");
    static float in[N], back[N];
    int64_t shape[1] = {N};
    gpuarr_array a, b;
    TEST_OK(gpuarr_from_host(d0, in, 1, shape, &a));
    TEST_OK(gpuarr_from_host(d1, in, 1, shape, &b));
    lose(0, 1, 1);
    TEST_FAIL_WITH(gpuarr_to_host(a, back, N), GPUARR_ERROR_DEVICE_LOST, "");
    lose(-1, 0, 0);
    char failure[256];
    cr_assert_eq(state_of(d1, failure, sizeof failure), GPUARR_DEVICE_FAILED);
    cr_expect(strstr(failure, "the OpenCL context reported \"fault-opencl: the device was lost") != NULL, "%s", failure);
    cr_assert_eq(state_of(d0, failure, sizeof failure), GPUARR_DEVICE_FAILED);
    TEST_FAIL_WITH(gpuarr_to_host(b, back, N), GPUARR_ERROR_DEVICE_LOST, "opencl:1 failed earlier: the OpenCL context reported");
    round_trip(gpuarr_host());
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
    TEST_OK(gpuarr_device_reset(d0));
    TEST_OK(gpuarr_device_reset(d1));
    round_trip(d0);
    round_trip(d1);
}

/* An allocation failure on PoCL (CL_OUT_OF_RESOURCES, as the fault matrix injects) is not a loss. */
Test(failures, opencl_out_of_resources_does_not_fail_the_device) {
    opencl_through_fault_library();
    int (*fail)(const char *);
    void *p = lib_function("GPUARR_TEST_FAULT_OPENCL", "fault_opencl_fail_set");
    memcpy(&fail, &p, sizeof p);
    gpuarr_device d0 = find("opencl:0");
    static float in[N];
    int64_t shape[1] = {N};
    gpuarr_array a;
    cr_assert_eq(fail("clEnqueueWriteBuffer:1:CL_OUT_OF_RESOURCES"), 0);
    TEST_FAIL_WITH(gpuarr_from_host(d0, in, 1, shape, &a), GPUARR_ERROR_OUT_OF_MEMORY, "CL_OUT_OF_RESOURCES");
    cr_assert_eq(fail(""), 0);
    cr_assert_eq(state_of(d0, NULL, 0), GPUARR_DEVICE_OK);
    round_trip(d0);
}
