/* OpenCL-specific behaviour, run on PoCL with two devices: POCL_DEVICES="pthread pthread".
   (The whole generic suite also runs on opencl:0 through GPUARR_TEST_DEVICE.) */
#define _POSIX_C_SOURCE 200809L /* setenv */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h> /* alarm */
#include "test_common.h"

TestSuite(opencl, .init = test_setup, .fini = test_teardown);

/* opencl:N, or a skip (a failure under GPUARR_TEST_REQUIRE=1) when it is absent. */
static gpuarr_device cl_device(int n) {
    char spec[32];
    snprintf(spec, sizeof spec, "opencl:%d", n);
    gpuarr_device d = {0};
    gpuarr_result r = gpuarr_device_find(spec, &d);
    if (r != GPUARR_OK && test_devices_required()) cr_assert_fail("%s is absent but GPUARR_TEST_REQUIRE=1: %s", spec, gpuarr_last_error());
    if (r != GPUARR_OK) test_skip("%s is absent (run with POCL_DEVICES=\"pthread pthread\"): %s", spec, gpuarr_last_error());
    return d;
}

static void fill_values(gpuarr_dtype t, void *buf, size_t n, uint64_t seed) {
    test_rng rng = {seed};
    test_fill_random(t, buf, n, &rng);
}

/* Checks every element of out (dtype t) against the reference chain src -> mid -> t. */
static void expect_chain(gpuarr_array out, gpuarr_dtype src_t, const void *src, gpuarr_dtype mid_t, gpuarr_dtype t, size_t n) {
    unsigned char *got = malloc(n * 8);
    cr_assert(got);
    TEST_OK(gpuarr_to_host_as(out, t, got, n));
    for (size_t i = 0; i < n; i++) {
        uint64_t s = test_load_bits(src_t, src, i);
        uint64_t m = ref_cast_bits(src_t, s, mid_t);
        uint64_t want = ref_cast_bits(mid_t, m, t);
        uint64_t have = test_load_bits(t, got, i);
        cr_assert_eq(have, want, "element %zu: %s 0x%llx -> %s 0x%llx -> %s: got 0x%llx, want 0x%llx", i, gpuarr_dtype_name(src_t),
                     (unsigned long long)s, gpuarr_dtype_name(mid_t), (unsigned long long)m, gpuarr_dtype_name(t),
                     (unsigned long long)have, (unsigned long long)want);
    }
    free(got);
}

Test(opencl, hops_opencl0_to_opencl1_to_host_with_a_dtype_change_on_each) {
    gpuarr_device d0 = cl_device(0), d1 = cl_device(1);
    static const gpuarr_dtype chains[][3] = {
        {GPUARR_F64, GPUARR_F32, GPUARR_F16}, {GPUARR_F32, GPUARR_F64, GPUARR_I32}, {GPUARR_I64, GPUARR_BF16, GPUARR_F32},
        {GPUARR_U8, GPUARR_F16, GPUARR_F64},  {GPUARR_F16, GPUARR_U16, GPUARR_BOOL}, {GPUARR_I32, GPUARR_I8, GPUARR_U64},
    };
    enum { N = 100003 }; /* not a multiple of any block or work-group size */
    static unsigned char src[N * 8];
    for (size_t c = 0; c < sizeof chains / sizeof chains[0]; c++) {
        gpuarr_dtype a_t = chains[c][0], b_t = chains[c][1], h_t = chains[c][2];
        fill_values(a_t, src, N, 1000 + c);
        int64_t shape[2] = {7, N / 7};
        int64_t count = shape[0] * shape[1];
        gpuarr_array a, b, h;
        TEST_OK(gpuarr_from_host_as(d0, a_t, src, 2, shape, &a));
        TEST_OK(gpuarr_convert(a, d1, b_t, &b));           /* opencl:0 -> opencl:1 */
        TEST_OK(gpuarr_convert(b, gpuarr_host(), h_t, &h)); /* opencl:1 -> host */
        gpuarr_array_info info;
        TEST_OK(gpuarr_array_get_info(b, &info));
        cr_assert_eq(info.device.id, d1.id);
        expect_chain(h, a_t, src, b_t, h_t, (size_t)count);
        TEST_OK(gpuarr_release(a));
        TEST_OK(gpuarr_release(b));
        TEST_OK(gpuarr_release(h));
    }
}

Test(opencl, async_work_on_two_devices_ordered_by_events) {
    gpuarr_device d0 = cl_device(0), d1 = cl_device(1);
    enum { N = 1 << 20 };
    float *in = malloc(sizeof(float) * N);
    cr_assert(in);
    fill_values(GPUARR_F32, in, N, 7);
    int64_t shape[1] = {N};
    gpuarr_stream s0, s1;
    gpuarr_event produced;
    TEST_OK(gpuarr_stream_create(d0, 0, &s0));
    TEST_OK(gpuarr_stream_create(d1, 0, &s1));
    TEST_OK(gpuarr_event_create(d0, 0, &produced));
    gpuarr_array a, wide, moved, back;
    TEST_OK(gpuarr_from_host(d0, in, 1, shape, &a));
    TEST_OK(gpuarr_convert_async(a, d0, GPUARR_F64, s0, &wide)); /* on opencl:0 */
    TEST_OK(gpuarr_event_record(produced, s0));
    TEST_OK(gpuarr_stream_wait(s1, produced)); /* opencl:1's stream waits for opencl:0's */
    TEST_OK(gpuarr_convert_async(wide, d1, GPUARR_BF16, s1, &moved));
    TEST_OK(gpuarr_convert_async(moved, gpuarr_host(), GPUARR_F32, s1, &back));
    TEST_OK(gpuarr_release(a)); /* released with work queued: must stay valid until done */
    TEST_OK(gpuarr_release(wide));
    TEST_OK(gpuarr_stream_sync(s1));
    expect_chain(back, GPUARR_F32, in, GPUARR_BF16, GPUARR_F32, N);
    bool done = false;
    TEST_OK(gpuarr_event_query(produced, &done));
    cr_assert(done);
    TEST_OK(gpuarr_release(moved));
    TEST_OK(gpuarr_release(back));
    TEST_OK(gpuarr_event_destroy(produced));
    TEST_OK(gpuarr_stream_destroy(s0));
    TEST_OK(gpuarr_stream_destroy(s1));
    free(in);
}

Test(opencl, timing_events_measure_elapsed_time) {
    gpuarr_device d0 = cl_device(0);
    gpuarr_event t0, t1;
    TEST_OK(gpuarr_event_create(d0, GPUARR_EVENT_TIMING, &t0));
    TEST_OK(gpuarr_event_create(d0, GPUARR_EVENT_TIMING, &t1));
    int64_t shape[1] = {1 << 22};
    gpuarr_array a, b;
    TEST_OK(gpuarr_zeros(d0, GPUARR_F32, 1, shape, &a));
    TEST_OK(gpuarr_event_record(t0, (gpuarr_stream){0}));
    TEST_OK(gpuarr_convert_async(a, d0, GPUARR_F16, (gpuarr_stream){0}, &b));
    TEST_OK(gpuarr_event_record(t1, (gpuarr_stream){0}));
    TEST_OK(gpuarr_event_sync(t1));
    double ms = -1;
    TEST_OK(gpuarr_event_elapsed_ms(t0, t1, &ms));
    cr_assert(ms > 0 && ms < 60000, "elapsed %f ms", ms);
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
    TEST_OK(gpuarr_event_destroy(t0));
    TEST_OK(gpuarr_event_destroy(t1));
}

Test(opencl, allocations_above_the_device_limit_say_requested_and_available) {
    gpuarr_device d0 = cl_device(0);
    gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(d0, &info));
    /* above the largest single allocation */
    int64_t big[1] = {(int64_t)(info.max_alloc_bytes / 4 + 1)};
    gpuarr_array a = {0xdeadbeefu};
    cr_assert_eq(gpuarr_empty(d0, GPUARR_F32, 1, big, &a), GPUARR_ERROR_OUT_OF_MEMORY);
    cr_assert(strstr(gpuarr_last_error(), "CL_DEVICE_MAX_MEM_ALLOC_SIZE"), "%s", gpuarr_last_error());
    cr_assert_eq(a.id, 0xdeadbeefu);
    /* allocations up to the global memory size, then one more: refused with the numbers */
    int64_t chunk[1] = {(int64_t)(info.max_alloc_bytes / 4)};
    gpuarr_array held[64];
    int n = 0;
    gpuarr_result r = GPUARR_OK;
    while (n < 64 && (r = gpuarr_empty(d0, GPUARR_F32, 1, chunk, &held[n])) == GPUARR_OK) n++;
    cr_assert_eq(r, GPUARR_ERROR_OUT_OF_MEMORY, "allocations never ran out: %s", gpuarr_result_name(r));
    cr_assert_eq((uint64_t)n, info.total_memory / info.max_alloc_bytes, "%d blocks of %llu fit in %llu", n,
                 (unsigned long long)info.max_alloc_bytes, (unsigned long long)info.total_memory);
    char want[64];
    snprintf(want, sizeof want, "%llu bytes requested", (unsigned long long)info.max_alloc_bytes);
    cr_assert(strstr(gpuarr_last_error(), want) && strstr(gpuarr_last_error(), "available"), "%s", gpuarr_last_error());
    gpuarr_device_info now;
    TEST_OK(gpuarr_device_get_info(d0, &now));
    cr_assert(now.free_memory < info.max_alloc_bytes, "free memory %llu while full", (unsigned long long)now.free_memory);
    for (int i = 0; i < n; i++) TEST_OK(gpuarr_release(held[i]));
    /* released arrays stay cached in the pool until trimmed */
    gpuarr_pool_stats st;
    TEST_OK(gpuarr_pool_get_stats(d0, &st));
    cr_assert_eq(st.allocated_bytes, 0u);
    cr_assert_geq(st.reserved_bytes, (uint64_t)n * info.max_alloc_bytes);
    TEST_OK(gpuarr_pool_trim(d0));
    TEST_OK(gpuarr_pool_get_stats(d0, &st));
    cr_assert_eq(st.reserved_bytes, 0u);
    TEST_OK(gpuarr_device_get_info(d0, &now));
    cr_assert(now.free_memory >= info.max_alloc_bytes, "memory not given back: %llu free", (unsigned long long)now.free_memory);
}

static void setenv_or_die(const char *k, const char *v) { cr_assert_eq(setenv(k, v, 1), 0); }

Test(opencl, a_kernel_build_failure_is_a_backend_error_with_the_log) {
    gpuarr_shutdown(); /* re-initialize with the injection */
    setenv_or_die("GPUARR_OPENCL_BUILD_OPTIONS", "-DGPUARR_KERNEL_INJECT_ERROR");
    setenv_or_die("GPUARR_CACHE_DIR", "off");
    TEST_OK(gpuarr_init(NULL));
    gpuarr_device d0 = cl_device(0);
    float in[4] = {1, 2, 3, 4}, out[4] = {0};
    int64_t shape[1] = {4};
    gpuarr_array a, b = {0xdeadbeefu};
    TEST_OK(gpuarr_from_host(d0, in, 1, shape, &a)); /* copies need no kernels */
    for (int attempt = 0; attempt < 2; attempt++) { /* remembered: the second call fails alike */
        cr_assert_eq(gpuarr_convert(a, d0, GPUARR_F16, &b), GPUARR_ERROR_BACKEND);
        cr_assert(strstr(gpuarr_last_error(), "injected"), "no build log in: %s", gpuarr_last_error());
        cr_assert_eq(b.id, 0xdeadbeefu);
    }
    TEST_OK(gpuarr_to_host(a, out, 4));
    cr_assert(out[3] == 4.0f);
    TEST_OK(gpuarr_release(a));
    unsetenv("GPUARR_OPENCL_BUILD_OPTIONS");
    unsetenv("GPUARR_CACHE_DIR");
}

/* On a device that shares the host's memory, a synchronous copy below 4 MiB is the driver's one
   write or read call; from 4 MiB the buffer is mapped and the host's threads copy. Shown through
   tests/fault_opencl (GPUARR_TEST_FAULT_OPENCL, set by make test) failing every map. */
Test(opencl, small_copies_on_a_host_unified_device_are_one_driver_call_and_large_ones_a_map) {
    const char *lib = getenv("GPUARR_TEST_FAULT_OPENCL");
    if (!lib || !*lib) test_skip("GPUARR_TEST_FAULT_OPENCL (the library of tests/fault_opencl) is not set; make test sets it");
    gpuarr_shutdown();
    setenv_or_die("GPUARR_OPENCL_LIBRARY", lib);
    TEST_OK(gpuarr_init(NULL));
    unsetenv("GPUARR_OPENCL_LIBRARY");
    gpuarr_device d = cl_device(0);
    gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(d, &info));
    if (!info.host_unified) test_skip("%s has its own memory: its copies never map", info.spec);
    void *handle = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
    cr_assert(handle, "%s is not the loaded OpenCL library", lib);
    void *sym = dlsym(handle, "fault_opencl_fail_set");
    cr_assert(sym);
    int (*fail_set)(const char *);
    memcpy(&fail_set, &sym, sizeof sym); /* ISO C has no object-to-function pointer cast */
    enum { SMALL = 1024, LARGE = 1 << 20 }; /* 4 KiB and 4 MiB of f32 */
    float *host = malloc(LARGE * sizeof *host), *back = malloc(LARGE * sizeof *back);
    cr_assert(host && back);
    for (int i = 0; i < LARGE; i++) host[i] = (float)i;
    int64_t small_shape[1] = {SMALL}, large_shape[1] = {LARGE};
    gpuarr_array small, large;
    TEST_OK(gpuarr_from_host_as(d, GPUARR_F32, host, 1, large_shape, &large)); /* before the maps fail */
    /* the next four maps fail (the count restarts with the rules) */
    cr_assert_eq(fail_set("clEnqueueMapBuffer:1,clEnqueueMapBuffer:2,clEnqueueMapBuffer:3,clEnqueueMapBuffer:4"), 0);
    TEST_OK(gpuarr_from_host_as(d, GPUARR_F32, host, 1, small_shape, &small));
    TEST_OK(gpuarr_to_host_as(small, GPUARR_F32, back, SMALL));
    cr_assert_eq(memcmp(back, host, SMALL * sizeof *host), 0);
    gpuarr_array other = {0xA5A5A5A5u};
    gpuarr_result r = gpuarr_from_host_as(d, GPUARR_F32, host, 1, large_shape, &other);
    cr_assert_neq(r, GPUARR_OK, "a 4 MiB upload did not map the buffer");
    cr_assert(strstr(gpuarr_last_error(), "clEnqueueMapBuffer"), "%s", gpuarr_last_error());
    cr_assert_eq(other.id, 0xA5A5A5A5u);
    cr_assert_neq(gpuarr_to_host_as(large, GPUARR_F32, back, LARGE), GPUARR_OK, "a 4 MiB download did not map the buffer");
    cr_assert(strstr(gpuarr_last_error(), "clEnqueueMapBuffer"), "%s", gpuarr_last_error());
    cr_assert_eq(fail_set(""), 0);
    TEST_OK(gpuarr_to_host_as(large, GPUARR_F32, back, LARGE));
    cr_assert_eq(memcmp(back, host, LARGE * sizeof *host), 0);
    TEST_OK(gpuarr_release(small));
    TEST_OK(gpuarr_release(large));
    free(host);
    free(back);
    dlclose(handle);
}

Test(opencl, without_the_loader_there_are_no_opencl_devices_and_the_rest_works) {
    gpuarr_shutdown();
    setenv_or_die("GPUARR_OPENCL_LIBRARY", "/nonexistent/libOpenCL.so.1");
    TEST_OK(gpuarr_init(NULL));
    unsetenv("GPUARR_OPENCL_LIBRARY");
    for (int i = 0; i < gpuarr_device_count(); i++) {
        gpuarr_device_info info;
        TEST_OK(gpuarr_device_get_info(gpuarr_device_at(i), &info));
        cr_assert_neq(info.backend, GPUARR_BACKEND_OPENCL, "%s listed without a loader", info.spec);
    }
    gpuarr_device d;
    cr_assert_eq(gpuarr_device_find("opencl:0", &d), GPUARR_ERROR_NO_DEVICE);
    cr_assert(strstr(gpuarr_last_error(), "not available"), "%s", gpuarr_last_error());
    double in[3] = {1.5, -2.5, 3.25};
    float out[3];
    int64_t shape[1] = {3};
    gpuarr_array a;
    TEST_OK(gpuarr_from_host(gpuarr_host(), in, 1, shape, &a));
    TEST_OK(gpuarr_to_host(a, out, 3));
    cr_assert(out[1] == -2.5f);
    TEST_OK(gpuarr_release(a));
}

Test(opencl, without_fp64_casts_to_and_from_f64_are_unsupported) {
    gpuarr_shutdown();
    setenv_or_die("GPUARR_OPENCL_FP64", "off");
    TEST_OK(gpuarr_init(NULL));
    unsetenv("GPUARR_OPENCL_FP64");
    gpuarr_device d0 = cl_device(0);
    enum { N = 4096 };
    static uint64_t src[N];
    fill_values(GPUARR_I32, src, N, 11);
    int64_t shape[1] = {N};
    gpuarr_array a, b = {0xdeadbeefu}, c;
    TEST_OK(gpuarr_from_host_as(d0, GPUARR_I32, src, 1, shape, &a));
    cr_assert_eq(gpuarr_convert(a, d0, GPUARR_F64, &b), GPUARR_ERROR_UNSUPPORTED);
    cr_assert(strstr(gpuarr_last_error(), "cl_khr_fp64"), "%s", gpuarr_last_error());
    cr_assert_eq(b.id, 0xdeadbeefu);
    /* i32 -> bf16 takes the path without doubles on such devices: still correctly rounded */
    TEST_OK(gpuarr_convert(a, d0, GPUARR_BF16, &c));
    expect_chain(c, GPUARR_I32, src, GPUARR_BF16, GPUARR_BF16, N);
    /* f64 data still moves, and casts to f64 happen on the host side of a transfer */
    gpuarr_array h;
    TEST_OK(gpuarr_convert(a, gpuarr_host(), GPUARR_F64, &h));
    expect_chain(h, GPUARR_I32, src, GPUARR_F64, GPUARR_F64, N);
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(c));
    TEST_OK(gpuarr_release(h));
}

/* Every pool a conversion between host, opencl:0 and opencl:1 could draw from. */
typedef struct pool_counts {
    unsigned long long allocations[6], backend_allocs[6];
} pool_counts;

static pool_counts count_pools(gpuarr_device d0, gpuarr_device d1) {
    gpuarr_device devs[3] = {gpuarr_host(), d0, d1};
    pool_counts c;
    for (int i = 0; i < 3; i++) {
        gpuarr_pool_stats st, pin;
        TEST_OK(gpuarr_pool_get_stats(devs[i], &st));
        TEST_OK(gpuarr_pool_get_pinned_stats(devs[i], &pin));
        c.allocations[2 * i] = st.total_allocations;
        c.backend_allocs[2 * i] = st.backend_allocs;
        c.allocations[2 * i + 1] = pin.total_allocations;
        c.backend_allocs[2 * i + 1] = pin.backend_allocs;
    }
    return c;
}

static void expect_unsupported_untouched(gpuarr_result r, gpuarr_device d0, gpuarr_device d1, pool_counts before, const char *what) {
    cr_assert_eq(r, GPUARR_ERROR_UNSUPPORTED, "%s: %s (%s)", what, gpuarr_result_name(r), gpuarr_last_error());
    cr_assert(strstr(gpuarr_last_error(), "cl_khr_fp64"), "%s: %s", what, gpuarr_last_error());
    static const char *const pools[6] = {"host", "host pinned", "opencl:0", "opencl:0 pinned", "opencl:1", "opencl:1 pinned"};
    pool_counts after = count_pools(d0, d1);
    for (int i = 0; i < 6; i++) {
        cr_assert_eq(after.allocations[i], before.allocations[i], "%s: %llu allocations from the %s pool before the refusal", what,
                     after.allocations[i] - before.allocations[i], pools[i]);
        cr_assert_eq(after.backend_allocs[i], before.backend_allocs[i], "%s: %llu backend allocations (%s) before the refusal", what,
                     after.backend_allocs[i] - before.backend_allocs[i], pools[i]);
    }
}

/* What a device cannot do is known before any data moves: a cast it cannot run fails with no
   memory taken from any pool, pinned staging included, in every direction. */
Test(opencl, an_unsupported_cast_fails_before_any_memory_is_used) {
    gpuarr_shutdown();
    setenv_or_die("GPUARR_OPENCL_FP64", "off");
    setenv_or_die("GPUARR_OPENCL_UNIFIED", "off"); /* a discrete device: large transfers are staged */
    TEST_OK(gpuarr_init(NULL));
    unsetenv("GPUARR_OPENCL_FP64");
    unsetenv("GPUARR_OPENCL_UNIFIED");
    gpuarr_device d0 = cl_device(0), d1 = cl_device(1), host = gpuarr_host();
    enum { N = 1 << 20 }; /* 4 MiB of f32 */
    float *f32 = malloc(sizeof(float) * N);
    double *f64 = malloc(sizeof(double) * N);
    cr_assert(f32 && f64);
    fill_values(GPUARR_F32, f32, N, 21);
    fill_values(GPUARR_F64, f64, N, 22);
    int64_t shape[1] = {N};
    gpuarr_array h32, a32, a64, out = {0xdeadbeefu};
    TEST_OK(gpuarr_from_host(host, f32, 1, shape, &h32));
    TEST_OK(gpuarr_from_host(d0, f32, 1, shape, &a32));
    TEST_OK(gpuarr_from_host(d0, f64, 1, shape, &a64)); /* f64 bytes need no fp64 to be copied */
    pool_counts before = count_pools(d0, d1);
    expect_unsupported_untouched(gpuarr_convert(h32, d0, GPUARR_F64, &out), d0, d1, before, "host f32 -> opencl:0 f64");
    expect_unsupported_untouched(gpuarr_convert_async(h32, d0, GPUARR_F64, (gpuarr_stream){0}, &out), d0, d1, before,
                                 "async host f32 -> opencl:0 f64");
    expect_unsupported_untouched(gpuarr_convert(a64, host, GPUARR_F32, &out), d0, d1, before, "opencl:0 f64 -> host f32");
    expect_unsupported_untouched(gpuarr_to_host_as(a64, GPUARR_F32, f32, N), d0, d1, before, "gpuarr_to_host_as f64 -> f32");
    expect_unsupported_untouched(gpuarr_convert(a32, d1, GPUARR_F64, &out), d0, d1, before, "opencl:0 f32 -> opencl:1 f64");
    expect_unsupported_untouched(gpuarr_convert(a64, d1, GPUARR_F32, &out), d0, d1, before, "opencl:0 f64 -> opencl:1 f32");
    expect_unsupported_untouched(gpuarr_convert(a32, d0, GPUARR_F64, &out), d0, d1, before, "opencl:0 f32 -> f64");
    cr_assert_eq(out.id, 0xdeadbeefu, "*out was written by a failed call");
    TEST_OK(gpuarr_release(h32));
    TEST_OK(gpuarr_release(a32));
    TEST_OK(gpuarr_release(a64));
    free(f32);
    free(f64);
}

Test(opencl, native_handles_and_wrapping_do_not_take_ownership) {
    gpuarr_device d0 = cl_device(0);
    cl_context ctx = NULL;
    cl_device_id dev_id = NULL;
    TEST_OK(gpuarr_opencl_context(d0, &ctx));
    TEST_OK(gpuarr_opencl_device_id(d0, &dev_id));
    cl_int e = 0;
    cl_command_queue q = clCreateCommandQueue(ctx, dev_id, 0, &e);
    cr_assert_eq(e, CL_SUCCESS);
    enum { N = 1000 };
    float in[N], out[N];
    for (int i = 0; i < N; i++) in[i] = (float)i - 500.5f;
    cl_mem mine = clCreateBuffer(ctx, CL_MEM_READ_WRITE, sizeof in + 64, NULL, &e);
    cr_assert_eq(e, CL_SUCCESS);
    cr_assert_eq(clEnqueueWriteBuffer(q, mine, CL_TRUE, 64, sizeof in, in, 0, NULL, NULL), CL_SUCCESS);
    /* Reference counts include the runtime's own (PoCL keeps one for a queue's last command),
       so they are compared with the same state before gpuarr ever saw the objects. */
    cl_uint mem_refs_before = 0, queue_refs_before = 0, refs = 0;
    clGetMemObjectInfo(mine, CL_MEM_REFERENCE_COUNT, sizeof mem_refs_before, &mem_refs_before, NULL);
    clGetCommandQueueInfo(q, CL_QUEUE_REFERENCE_COUNT, sizeof queue_refs_before, &queue_refs_before, NULL);
    /* wrap the caller's buffer (elements at byte offset 64) and queue */
    int64_t shape[1] = {N};
    gpuarr_array wrapped, as_f16;
    gpuarr_stream s;
    TEST_OK(gpuarr_opencl_wrap_mem(d0, mine, 64, GPUARR_F32, 1, shape, &wrapped));
    TEST_OK(gpuarr_opencl_wrap_queue(d0, q, &s));
    TEST_OK(gpuarr_convert_async(wrapped, d0, GPUARR_F16, s, &as_f16));
    TEST_OK(gpuarr_stream_sync(s));
    expect_chain(as_f16, GPUARR_F32, in, GPUARR_F16, GPUARR_F16, N);
    /* gpuarr's buffer, read natively on gpuarr's queue */
    cl_mem theirs = NULL;
    size_t offset = 99;
    cl_command_queue gq = NULL;
    TEST_OK(gpuarr_opencl_mem(wrapped, &theirs, &offset));
    cr_assert(theirs == mine && offset == 64);
    TEST_OK(gpuarr_opencl_queue(s, &gq));
    cr_assert(gq == q);
    TEST_OK(gpuarr_release(wrapped));
    TEST_OK(gpuarr_release(as_f16));
    TEST_OK(gpuarr_stream_destroy(s));
    /* the caller's objects survive gpuarr's release and hold their data; work in flight may
       keep a reference for a while, but none survives gpuarr_shutdown */
    gpuarr_shutdown();
    cr_assert_eq(clEnqueueReadBuffer(q, mine, CL_TRUE, 64, sizeof out, out, 0, NULL, NULL), CL_SUCCESS);
    cr_assert(out[N - 1] == in[N - 1]);
    cr_assert_eq(clGetMemObjectInfo(mine, CL_MEM_REFERENCE_COUNT, sizeof refs, &refs, NULL), CL_SUCCESS);
    cr_assert_eq(refs, mem_refs_before, "the caller's buffer had %u references, now %u", mem_refs_before, refs);
    cr_assert_eq(clGetCommandQueueInfo(q, CL_QUEUE_REFERENCE_COUNT, sizeof refs, &refs, NULL), CL_SUCCESS);
    cr_assert_eq(refs, queue_refs_before, "the caller's queue had %u references, now %u", queue_refs_before, refs);
    clReleaseMemObject(mine);
    clReleaseCommandQueue(q);
}

/* gpuarr's steps on a stream (staging, temporaries, a cast after a copy) rely on queue order. */
Test(opencl, wrapping_an_out_of_order_queue_is_refused) {
    gpuarr_device d0 = cl_device(0);
    cl_context ctx = NULL;
    cl_device_id dev_id = NULL;
    TEST_OK(gpuarr_opencl_context(d0, &ctx));
    TEST_OK(gpuarr_opencl_device_id(d0, &dev_id));
    cl_int e = 0;
    cl_command_queue q = clCreateCommandQueue(ctx, dev_id, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &e);
    if (e == CL_INVALID_QUEUE_PROPERTIES) test_skip("opencl:0 cannot make out-of-order queues");
    cr_assert_eq(e, CL_SUCCESS);
    gpuarr_stream s = {0xdeadbeefu};
    cr_assert_eq(gpuarr_opencl_wrap_queue(d0, q, &s), GPUARR_ERROR_INVALID_ARGUMENT);
    cr_assert(strstr(gpuarr_last_error(), "gpuarr_opencl_wrap_queue_raw") && strstr(gpuarr_last_error(), "out of order"), "%s",
              gpuarr_last_error());
    cr_assert_eq(s.id, 0xdeadbeefu);
    cl_uint refs = 0;
    clGetCommandQueueInfo(q, CL_QUEUE_REFERENCE_COUNT, sizeof refs, &refs, NULL);
    cr_assert_eq(refs, 1u, "a refused wrap changed the queue's references");
    clReleaseCommandQueue(q);
}

Test(opencl, wrapping_a_foreign_or_short_buffer_is_refused) {
    gpuarr_device d0 = cl_device(0);
    cl_context ctx = NULL;
    cl_device_id dev_id = NULL;
    TEST_OK(gpuarr_opencl_context(d0, &ctx));
    TEST_OK(gpuarr_opencl_device_id(d0, &dev_id));
    cl_int e = 0;
    cl_context other = clCreateContext(NULL, 1, &dev_id, NULL, NULL, &e);
    cr_assert_eq(e, CL_SUCCESS);
    cl_mem foreign = clCreateBuffer(other, CL_MEM_READ_WRITE, 4096, NULL, &e);
    cl_mem small = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 100, NULL, &e);
    int64_t shape[1] = {64};
    gpuarr_array a = {0xdeadbeefu};
    cr_assert_eq(gpuarr_opencl_wrap_mem(d0, foreign, 0, GPUARR_F32, 1, shape, &a), GPUARR_ERROR_INVALID_ARGUMENT);
    cr_assert(strstr(gpuarr_last_error(), "context"), "%s", gpuarr_last_error());
    cr_assert_eq(gpuarr_opencl_wrap_mem(d0, small, 0, GPUARR_F32, 1, shape, &a), GPUARR_ERROR_INVALID_ARGUMENT);
    cr_assert(strstr(gpuarr_last_error(), "100 bytes"), "%s", gpuarr_last_error());
    cr_assert_eq(gpuarr_opencl_wrap_mem(d0, small, 2, GPUARR_F32, 1, (int64_t[]){4}, &a), GPUARR_ERROR_INVALID_ARGUMENT);
    cr_assert_eq(gpuarr_opencl_wrap_mem(gpuarr_host(), small, 0, GPUARR_F32, 1, (int64_t[]){4}, &a), GPUARR_ERROR_INVALID_ARGUMENT);
    cr_assert_eq(a.id, 0xdeadbeefu);
    cl_uint refs = 0;
    clGetMemObjectInfo(small, CL_MEM_REFERENCE_COUNT, sizeof refs, &refs, NULL);
    cr_assert_eq(refs, 1u, "a refused wrap changed the buffer's references");
    clReleaseMemObject(foreign);
    clReleaseMemObject(small);
    clReleaseContext(other);
}

/* convert_async to the same device and dtype returns the source itself. When the source is the
   pending result of work on another stream, native work on the caller's stream must still see
   it complete once that stream is synchronized. */
Test(opencl, an_identity_conversion_of_a_pending_array_is_ready_with_its_stream) {
    gpuarr_device d0 = cl_device(0);
    enum { N = 1 << 20 };
    float *in = malloc(sizeof(float) * N), *out = malloc(sizeof(float) * N);
    cr_assert(in && out);
    for (int i = 0; i < N; i++) in[i] = (float)i;
    int64_t shape[1] = {N};
    gpuarr_stream s1, s2;
    TEST_OK(gpuarr_stream_create(d0, 0, &s1));
    TEST_OK(gpuarr_stream_create(d0, 0, &s2));
    gpuarr_array a, pending, same;
    TEST_OK(gpuarr_from_host(d0, in, 1, shape, &a));
    for (int k = 0; k < 16; k++) { /* keep s1 busy, so that `pending` is written late */
        gpuarr_array busy;
        TEST_OK(gpuarr_convert_async(a, d0, k % 2 ? GPUARR_F16 : GPUARR_F64, s1, &busy));
        TEST_OK(gpuarr_release(busy));
    }
    TEST_OK(gpuarr_convert_async(a, d0, GPUARR_I32, s1, &pending));
    TEST_OK(gpuarr_convert_async(pending, d0, 0, s2, &same)); /* identity, on s2 */
    cr_assert_eq(same.id, pending.id);
    TEST_OK(gpuarr_stream_sync(s2));
    /* read it natively right now: s2 has completed, so `same` must be complete */
    cl_mem mem = NULL;
    size_t offset = 0;
    cl_command_queue reader = NULL;
    TEST_OK(gpuarr_opencl_mem(same, &mem, &offset));
    TEST_OK(gpuarr_opencl_queue(s2, &reader));
    bool s1_done = false;
    TEST_OK(gpuarr_stream_query(s1, &s1_done));
    cr_assert(s1_done, "s2 completed while the work producing the identity result was still running on s1");
    int32_t *vals = (int32_t *)out;
    cr_assert_eq(clEnqueueReadBuffer(reader, mem, CL_TRUE, offset, sizeof(int32_t) * N, vals, 0, NULL, NULL), CL_SUCCESS);
    for (int i = 0; i < N; i += 4093) cr_assert_eq(vals[i], i, "element %d", i);
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(pending));
    TEST_OK(gpuarr_release(same));
    TEST_OK(gpuarr_stream_destroy(s1));
    TEST_OK(gpuarr_stream_destroy(s2));
    free(in);
    free(out);
}

/* ---- staging through pinned memory: PoCL handled as a discrete device ----------------------
   GPUARR_OPENCL_UNIFIED=off gives the device its own memory, so transfers of 1 MiB and more go
   through the ring of pinned chunks, as they do on a discrete GPU. */
static gpuarr_device discrete_device(const char *faults) {
    gpuarr_shutdown();
    setenv_or_die("GPUARR_OPENCL_UNIFIED", "off");
    if (faults) setenv_or_die("GPUARR_FAULTS", faults);
    TEST_OK(gpuarr_init(NULL));
    unsetenv("GPUARR_OPENCL_UNIFIED");
    unsetenv("GPUARR_FAULTS");
    gpuarr_device d = cl_device(0);
    gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(d, &info));
    cr_assert(!info.host_unified, "GPUARR_OPENCL_UNIFIED=off left %s unified", info.spec);
    return d;
}

/* host (dtype h) -> device (dtype t) -> host (dtype back), N elements, checked element by element:
   each pair takes one of the paths (same dtype; narrowed or widened on the host side of the
   chunks; narrowed or widened on the device). */
static void staged_round_trips(gpuarr_device d, size_t n) {
    static const gpuarr_dtype chains[][3] = {
        {GPUARR_F32, GPUARR_F32, GPUARR_F32}, /* plain copies both ways */
        {GPUARR_F64, GPUARR_F32, GPUARR_F64}, /* narrowed into the chunks, widened out of them */
        {GPUARR_F16, GPUARR_F32, GPUARR_BF16}, /* widened on the device after arrival, narrowed before leaving */
        {GPUARR_U8, GPUARR_I64, GPUARR_I16},
    };
    unsigned char *src = malloc(n * 8);
    cr_assert(src);
    int64_t shape[1] = {(int64_t)n};
    for (size_t c = 0; c < sizeof chains / sizeof chains[0]; c++) {
        fill_values(chains[c][0], src, n, 500 + c);
        gpuarr_array h, a;
        TEST_OK(gpuarr_wrap_host(src, chains[c][0], 1, shape, NULL, NULL, &h));
        TEST_OK(gpuarr_convert(h, d, chains[c][1], &a));
        expect_chain(a, chains[c][0], src, chains[c][1], chains[c][2], n);
        TEST_OK(gpuarr_release(a));
        TEST_OK(gpuarr_release(h));
    }
    free(src);
}

Test(opencl, staged_transfers_are_exact_and_reuse_their_pinned_chunks) {
    gpuarr_device d = discrete_device(NULL);
    staged_round_trips(d, 5000003); /* several 8 MiB chunks, the last one partial */
    gpuarr_pool_stats pin;
    TEST_OK(gpuarr_pool_get_pinned_stats(d, &pin));
    cr_assert_gt(pin.total_allocations, 8, "the transfers were not staged: %llu chunks handed out",
                 (unsigned long long)pin.total_allocations);
    cr_assert_leq(pin.backend_allocs, 3, "the ring's chunks were not reused: %llu pinned allocations",
                  (unsigned long long)pin.backend_allocs);
    cr_assert_gt(pin.cache_hits, 0);
    cr_assert_eq(pin.allocated_bytes, 0, "chunks still held after the transfers");
    char summary[2048];
    TEST_OK(gpuarr_pool_summary(d, summary, sizeof summary));
    cr_assert(strstr(summary, "pinned staging memory"), "%s", summary);
    TEST_OK(gpuarr_pool_trim(d));
    TEST_OK(gpuarr_pool_get_pinned_stats(d, &pin));
    cr_assert_eq(pin.reserved_bytes, 0, "trim kept %llu pinned bytes", (unsigned long long)pin.reserved_bytes);
    /* below the staging size the copies are direct */
    staged_round_trips(d, 1000);
    TEST_OK(gpuarr_pool_get_pinned_stats(d, &pin));
    cr_assert_eq(pin.reserved_bytes, 0);
}

Test(opencl, without_pinned_memory_transfers_copy_directly_and_stay_exact) {
    gpuarr_device d = discrete_device("opencl:0:pinned_above=1");
    staged_round_trips(d, 3000001);
    gpuarr_pool_stats pin;
    TEST_OK(gpuarr_pool_get_pinned_stats(d, &pin));
    cr_assert_eq(pin.total_allocations, 0);
    cr_assert_gt(pin.oom_trims, 0, "the pinned pool was never asked");
}

/* Async uploads on two streams (each a copy the queue reads when it runs it) are exact. */
Test(opencl, async_uploads_on_two_streams_do_not_overwrite_each_other) {
    gpuarr_device d = discrete_device(NULL);
    enum { N = 6000001, ROUNDS = 3 };
    float *in[2];
    gpuarr_stream s[2];
    gpuarr_array h[2], a[2][ROUNDS];
    int64_t shape[1] = {N};
    for (int k = 0; k < 2; k++) {
        in[k] = malloc(sizeof(float) * N);
        cr_assert(in[k]);
        fill_values(GPUARR_F32, in[k], N, 900 + (uint64_t)k);
        TEST_OK(gpuarr_stream_create(d, 0, &s[k]));
        TEST_OK(gpuarr_wrap_host(in[k], GPUARR_F32, 1, shape, NULL, NULL, &h[k]));
    }
    for (int r = 0; r < ROUNDS; r++)
        for (int k = 0; k < 2; k++) TEST_OK(gpuarr_convert_async(h[k], d, GPUARR_F32, s[k], &a[k][r]));
    for (int k = 0; k < 2; k++) TEST_OK(gpuarr_stream_sync(s[k]));
    for (int r = 0; r < ROUNDS; r++)
        for (int k = 0; k < 2; k++) {
            expect_chain(a[k][r], GPUARR_F32, in[k], GPUARR_F32, GPUARR_F32, N);
            TEST_OK(gpuarr_release(a[k][r]));
        }
    for (int k = 0; k < 2; k++) {
        TEST_OK(gpuarr_release(h[k]));
        TEST_OK(gpuarr_stream_destroy(s[k]));
        free(in[k]);
    }
}

/* GPUARR_PEER_COPIES=off: opencl:0 -> opencl:1 goes through pinned host chunks, pipelined (the
   path of two GPUs without peer access, or of CUDA <-> OpenCL), with a cast on either side. */
/* No async call waits for device work: with the stream's queue held shut by a user event, every
   direction returns (a call that waited would hang: the alarm turns that into a failure), and
   the results are exact once the queue is let go. */
static void async_conversions_return_while_held(gpuarr_device d) {
    gpuarr_device d1 = cl_device(1), host = gpuarr_host();
    enum { N = (3 << 20) + 5 }; /* 3 MiB even as u8: where synchronous calls stage */
    unsigned char *u8 = malloc(N);
    double *f64 = malloc(sizeof(double) * N);
    cr_assert(u8 && f64);
    fill_values(GPUARR_U8, u8, N, 31);
    fill_values(GPUARR_F64, f64, N, 32);
    int64_t shape[1] = {N};
    gpuarr_array h8, h64, a8, a64, out[8];
    TEST_OK(gpuarr_from_host(host, u8, 1, shape, &h8));
    TEST_OK(gpuarr_from_host(host, f64, 1, shape, &h64));
    TEST_OK(gpuarr_from_host(d, u8, 1, shape, &a8));
    TEST_OK(gpuarr_from_host(d, f64, 1, shape, &a64));
    gpuarr_stream s;
    cl_command_queue q = NULL;
    cl_context ctx = NULL;
    cl_int e = CL_SUCCESS;
    TEST_OK(gpuarr_stream_create(d, 0, &s));
    TEST_OK(gpuarr_opencl_queue(s, &q));
    cr_assert_eq(clGetCommandQueueInfo(q, CL_QUEUE_CONTEXT, sizeof ctx, &ctx, NULL), CL_SUCCESS);
    cl_event gate = clCreateUserEvent(ctx, &e);
    cr_assert_eq(e, CL_SUCCESS);
    cr_assert_eq(clEnqueueMarkerWithWaitList(q, 1, &gate, NULL), CL_SUCCESS);
    clFlush(q);
    alarm(60);
    TEST_OK(gpuarr_convert_async(a8, host, GPUARR_F64, s, &out[0]));  /* widened on the host after arrival */
    TEST_OK(gpuarr_convert_async(a8, host, GPUARR_U8, s, &out[1]));   /* a plain copy */
    TEST_OK(gpuarr_convert_async(a64, host, GPUARR_F32, s, &out[2])); /* narrowed on the device */
    TEST_OK(gpuarr_convert_async(h64, d, GPUARR_F32, s, &out[3]));    /* narrowed on the host before leaving */
    TEST_OK(gpuarr_convert_async(h8, d, GPUARR_F64, s, &out[4]));     /* widened on the device */
    TEST_OK(gpuarr_convert_async(a8, d1, GPUARR_F64, s, &out[5]));    /* to the other device */
    TEST_OK(gpuarr_convert_async(out[0], d, GPUARR_F32, s, &out[6])); /* a host array still pending */
    TEST_OK(gpuarr_convert_async(h64, d, GPUARR_I64, s, &out[7]));    /* cast on the host, 24 MiB: pinned chunks reused */
    bool done = true;
    TEST_OK(gpuarr_stream_query(s, &done));
    cr_assert(!done, "the stream ran past a marker that waits for an incomplete user event");
    cr_assert_eq(clSetUserEventStatus(gate, CL_COMPLETE), CL_SUCCESS);
    TEST_OK(gpuarr_stream_sync(s));
    alarm(0);
    expect_chain(out[0], GPUARR_U8, u8, GPUARR_F64, GPUARR_F64, N);
    expect_chain(out[1], GPUARR_U8, u8, GPUARR_U8, GPUARR_U8, N);
    expect_chain(out[2], GPUARR_F64, f64, GPUARR_F32, GPUARR_F32, N);
    expect_chain(out[3], GPUARR_F64, f64, GPUARR_F32, GPUARR_F32, N);
    expect_chain(out[4], GPUARR_U8, u8, GPUARR_F64, GPUARR_F64, N);
    expect_chain(out[5], GPUARR_U8, u8, GPUARR_F64, GPUARR_F64, N);
    expect_chain(out[6], GPUARR_U8, u8, GPUARR_F64, GPUARR_F32, N);
    expect_chain(out[7], GPUARR_F64, f64, GPUARR_I64, GPUARR_I64, N);
    for (int i = 0; i < 8; i++) TEST_OK(gpuarr_release(out[i]));
    clReleaseEvent(gate);
    TEST_OK(gpuarr_stream_destroy(s));
    TEST_OK(gpuarr_release(h8));
    TEST_OK(gpuarr_release(h64));
    TEST_OK(gpuarr_release(a8));
    TEST_OK(gpuarr_release(a64));
    free(u8);
    free(f64);
}

Test(opencl, async_conversions_return_while_their_queue_is_held) { async_conversions_return_while_held(discrete_device(NULL)); }

/* The same where the device shares the host's memory (PoCL as it is): copies there map the
   buffer, which must not block in an async call either. */
Test(opencl, async_conversions_on_a_host_unified_device_return_while_their_queue_is_held) {
    gpuarr_device d = cl_device(0);
    gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(d, &info));
    cr_assert(info.host_unified, "%s is not host-unified: this test needs PoCL as it is", info.spec);
    async_conversions_return_while_held(d);
}

Test(opencl, device_to_device_through_pinned_chunks_is_exact_with_a_cast_on_either_side) {
    gpuarr_shutdown();
    setenv_or_die("GPUARR_PEER_COPIES", "off");
    setenv_or_die("GPUARR_OPENCL_UNIFIED", "off");
    TEST_OK(gpuarr_init(NULL));
    unsetenv("GPUARR_PEER_COPIES");
    unsetenv("GPUARR_OPENCL_UNIFIED");
    gpuarr_device d0 = cl_device(0), d1 = cl_device(1);
    static const gpuarr_dtype chains[][3] = {
        {GPUARR_F32, GPUARR_F32, GPUARR_F32}, /* plain */
        {GPUARR_F64, GPUARR_F16, GPUARR_F32}, /* narrowed on opencl:0 before leaving */
        {GPUARR_I16, GPUARR_F64, GPUARR_F64}, /* widened on opencl:1 after arrival */
    };
    enum { N = 2500001 }; /* 2 to 20 MB: one to three chunks, the last partial */
    unsigned char *src = malloc((size_t)N * 8);
    cr_assert(src);
    int64_t shape[1] = {N};
    for (size_t c = 0; c < sizeof chains / sizeof chains[0]; c++) {
        fill_values(chains[c][0], src, N, 70 + c);
        gpuarr_array a, b;
        TEST_OK(gpuarr_from_host_as(d0, chains[c][0], src, 1, shape, &a));
        TEST_OK(gpuarr_convert(a, d1, chains[c][1], &b));
        expect_chain(b, chains[c][0], src, chains[c][1], chains[c][2], N);
        TEST_OK(gpuarr_release(a));
        TEST_OK(gpuarr_release(b));
    }
    gpuarr_pool_stats pin;
    TEST_OK(gpuarr_pool_get_pinned_stats(d0, &pin));
    cr_assert_gt(pin.total_allocations, 0, "the device-to-device copies were not staged");
    cr_assert_eq(pin.allocated_bytes, 0);
    free(src);
    gpuarr_device d;
    gpuarr_shutdown();
    setenv_or_die("GPUARR_PEER_COPIES", "sometimes");
    cr_assert_eq(gpuarr_init(NULL), GPUARR_ERROR_INVALID_ARGUMENT);
    cr_assert(strstr(gpuarr_last_error(), "GPUARR_PEER_COPIES"), "%s", gpuarr_last_error());
    unsetenv("GPUARR_PEER_COPIES");
    TEST_OK(gpuarr_init(NULL));
    TEST_OK(gpuarr_device_find("host", &d));
}

/* {0} is the calling thread's own default stream: a different queue on each thread, the same one
   for every call on a thread. */
typedef struct queue_probe {
    gpuarr_device dev;
    void *queue, *again;
    gpuarr_result r1, r2, r3;
} queue_probe;

static void *probe_default_queue(void *arg) {
    queue_probe *p = arg;
    p->r1 = gpuarr_set_current_device(p->dev);
    p->r2 = gpuarr_opencl_queue_raw((gpuarr_stream){0}, &p->queue);
    p->r3 = gpuarr_opencl_queue_raw((gpuarr_stream){0}, &p->again);
    return NULL;
}

Test(opencl, each_thread_has_its_own_default_queue) {
    queue_probe p[2] = {{.dev = cl_device(0)}, {.dev = cl_device(0)}};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, probe_default_queue, &p[0]), 0);
    pthread_join(t, NULL); /* its queue went with it: queues are compared with main's only */
    cr_assert_eq(pthread_create(&t, NULL, probe_default_queue, &p[1]), 0);
    pthread_join(t, NULL);
    void *mine = NULL, *mine_again = NULL;
    TEST_OK(gpuarr_set_current_device(p[0].dev));
    TEST_OK(gpuarr_opencl_queue_raw((gpuarr_stream){0}, &mine));
    TEST_OK(gpuarr_opencl_queue_raw((gpuarr_stream){0}, &mine_again));
    TEST_OK(gpuarr_set_current_device((gpuarr_device){0}));
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(p[i].r1, GPUARR_OK);
        cr_assert_eq(p[i].r2, GPUARR_OK, "thread %d: %s", i, gpuarr_result_name(p[i].r2));
        cr_assert_eq(p[i].r3, GPUARR_OK);
        cr_expect_eq(p[i].queue, p[i].again, "thread %d got two default queues", i);
        cr_expect_neq(p[i].queue, mine, "thread %d shares main's default queue", i);
    }
    cr_expect_eq(mine, mine_again, "main got two default queues");
}

/* gpuarr_stream_wait_array: a second stream waits, on the device, for an array still being made
   on a first one whose queue is held shut; it finishes once the first is let go. */
Test(opencl, stream_wait_array_orders_another_stream_after_a_pending_array) {
    gpuarr_device d = cl_device(0), host = gpuarr_host();
    enum { N = 1 << 16 };
    static float v[N];
    for (int i = 0; i < N; i++) v[i] = (float)i * 0.5f;
    int64_t shape[1] = {N};
    gpuarr_array h, out;
    TEST_OK(gpuarr_from_host(host, v, 1, shape, &h));
    gpuarr_stream s1, s2;
    TEST_OK(gpuarr_stream_create(d, 0, &s1));
    TEST_OK(gpuarr_stream_create(d, 0, &s2));
    cl_command_queue q = NULL;
    cl_context ctx = NULL;
    cl_int e = CL_SUCCESS;
    TEST_OK(gpuarr_opencl_queue(s1, &q));
    cr_assert_eq(clGetCommandQueueInfo(q, CL_QUEUE_CONTEXT, sizeof ctx, &ctx, NULL), CL_SUCCESS);
    cl_event gate = clCreateUserEvent(ctx, &e);
    cr_assert_eq(e, CL_SUCCESS);
    cr_assert_eq(clEnqueueMarkerWithWaitList(q, 1, &gate, NULL), CL_SUCCESS);
    clFlush(q);
    alarm(60);
    TEST_OK(gpuarr_convert_async(h, d, GPUARR_F64, s1, &out));
    TEST_OK(gpuarr_stream_wait_array(s2, out));
    bool done = true;
    TEST_OK(gpuarr_stream_query(s2, &done));
    cr_expect(!done, "s2 is done although the array it waits for is held on s1");
    cr_assert_eq(clSetUserEventStatus(gate, CL_COMPLETE), CL_SUCCESS);
    TEST_OK(gpuarr_stream_sync(s2));
    alarm(0);
    double back[N];
    TEST_OK(gpuarr_to_host(out, back, N));
    for (int i = 0; i < N; i++) cr_assert_eq(back[i], (double)v[i], "element %d", i);
    gpuarr_array dead = out;
    TEST_OK(gpuarr_release(out));
    cr_expect_eq(gpuarr_stream_wait_array(s2, dead), GPUARR_ERROR_INVALID_HANDLE);
    clReleaseEvent(gate);
    TEST_OK(gpuarr_stream_destroy(s1));
    TEST_OK(gpuarr_stream_destroy(s2));
    TEST_OK(gpuarr_release(h));
}

Test(opencl, queue_of_the_current_stream_on_the_host_says_to_create_a_stream) {
    cl_command_queue q = NULL;
    TEST_FAIL_WITH(gpuarr_opencl_queue((gpuarr_stream){0}, &q), GPUARR_ERROR_INVALID_ARGUMENT,
                   "s = {0} is the thread's current stream, which belongs to host, not to an OpenCL device: create a stream of "
                   "an OpenCL device with gpuarr_stream_create");
    cr_expect_null(q, "the queue was written on failure");
}

/* ---------------------------------------------------------------------------------------------
 * The kernel cache: what another user, a crash or a damaged disk may leave in it. A cache file is
 * a header (gpuarr.h's manual, FILES AND FOLDERS) and the driver's binary.
 * ------------------------------------------------------------------------------------------- */
static char kc_dir[64];
static char kc_log[16384];

static void kc_keep_log(gpuarr_log_level level, const char *message, void *user) {
    (void)level, (void)user;
    size_t n = strlen(kc_log);
    snprintf(kc_log + n, sizeof kc_log - n, "%s\n", message);
}

static void kc_restart(void) {
    gpuarr_shutdown();
    gpuarr_desc d;
    memset(&d, 0, sizeof d);
    d.logger.fn = kc_keep_log;
    d.log_level = GPUARR_LOG_INFO;
    kc_log[0] = '\0';
    TEST_OK(gpuarr_init(&d));
}

static void kc_remove(const char *dir) {
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static void kc_setup(void) {
    snprintf(kc_dir, sizeof kc_dir, "/tmp/gpuarr-test-kcache-XXXXXX");
    cr_assert_not_null(mkdtemp(kc_dir));
    cr_assert_eq(setenv("GPUARR_CACHE_DIR", kc_dir, 1), 0);
    kc_restart();
}

static void kc_teardown(void) {
    gpuarr_shutdown();
    unsetenv("GPUARR_CACHE_DIR");
    if (kc_dir[0]) kc_remove(kc_dir);
}

TestSuite(kernel_cache, .init = kc_setup, .fini = kc_teardown);

/* f32 -> i32 on opencl:0 gives the values of the conversion rules. */
static void kc_cast_right(void) {
    gpuarr_device d0 = cl_device(0);
    float in[4] = {1.5f, -2.5f, 3.9f, 3e9f};
    int32_t out[4] = {0}, want[4] = {1, -2, 3, INT32_MAX};
    int64_t shape[1] = {4};
    gpuarr_array a, b;
    TEST_OK(gpuarr_from_host(d0, in, 1, shape, &a));
    TEST_OK(gpuarr_convert(a, d0, GPUARR_I32, &b));
    TEST_OK(gpuarr_to_host(b, out, 4));
    for (int i = 0; i < 4; i++) cr_assert_eq(out[i], want[i], "element %d: %d, want %d (log: %s)", i, out[i], want[i], kc_log);
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
}

static void kc_cast_other(void) { /* f32 -> f16: another kernel, another cache file */
    gpuarr_device d0 = cl_device(0);
    float in[2] = {1, 2};
    int64_t shape[1] = {2};
    gpuarr_array a, b;
    TEST_OK(gpuarr_from_host(d0, in, 1, shape, &a));
    TEST_OK(gpuarr_convert(a, d0, GPUARR_F16, &b));
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
}

/* The path of a cache file "opencl-<key>.bin" in dir other than `not` ("" = any). */
static void kc_find(const char *dir, const char *not, char *out, size_t cap) {
    DIR *dd = opendir(dir);
    cr_assert_not_null(dd, "%s", dir);
    out[0] = '\0';
    for (struct dirent *e; (e = readdir(dd));) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (strncmp(e->d_name, "opencl-", 7) == 0 && strcmp(path, not) != 0) snprintf(out, cap, "%s", path);
    }
    closedir(dd);
    cr_assert(out[0], "no kernel cache file in %s", dir);
}

static uint64_t kc_key(const char *path) { return strtoull(strrchr(path, '/') + 1 + 7, NULL, 16); }

/* The whole file (the caller frees it). */
static unsigned char *kc_read(const char *path, size_t *size) {
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "%s", path);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    unsigned char *buf = malloc((size_t)st.st_size + 1);
    cr_assert_not_null(buf);
    *size = fread(buf, 1, (size_t)st.st_size, f);
    fclose(f);
    return buf;
}

static void kc_write(const char *path, const void *a, size_t na, const void *b, size_t nb) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fwrite(a, 1, na, f), na);
    if (nb) cr_assert_eq(fwrite(b, 1, nb, f), nb);
    fclose(f);
}

/* The header the manual describes: magic, version 1, header size, payload size, FNV-1a of the
   payload, the key of the file's name. */
typedef struct kc_header {
    char magic[16];
    uint32_t version, header_size;
    uint64_t size, hash, key;
} kc_header;

static uint64_t kc_fnv(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static kc_header kc_header_for(uint64_t key, const unsigned char *payload, size_t n) {
    kc_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, "gpuarr-cache\n\0\0", 16);
    h.version = 1;
    h.header_size = sizeof h;
    h.size = n;
    h.hash = kc_fnv(payload, n);
    h.key = key;
    return h;
}

/* path is a regular file of this user with a good header for its name: its payload's size. */
static size_t kc_expect_valid(const char *path) {
    struct stat st;
    cr_assert_eq(lstat(path, &st), 0, "%s is gone", path);
    cr_assert(S_ISREG(st.st_mode), "%s is not a regular file (mode %o): not replaced", path, st.st_mode);
    cr_assert_eq(st.st_uid, geteuid(), "%s is still owned by uid %u: not replaced", path, st.st_uid);
    size_t size;
    unsigned char *data = kc_read(path, &size);
    cr_assert_geq(size, sizeof(kc_header), "%s has %zu bytes", path, size);
    kc_header want = kc_header_for(kc_key(path), data + sizeof want, size - sizeof want), have;
    memcpy(&have, data, sizeof have);
    cr_assert(memcmp(&have, &want, sizeof have) == 0, "%s has no good header: not replaced", path);
    free(data);
    return size - sizeof have;
}

/* Builds the f32->i32 kernel (file a) and the f32->f16 one (file b) into the cache. */
static void kc_two_files(char *a, char *b, size_t cap) {
    kc_cast_right();
    kc_find(kc_dir, "", a, cap);
    kc_cast_other();
    kc_find(kc_dir, a, b, cap);
}

Test(kernel_cache, a_binary_without_the_header_is_not_loaded_but_rebuilt_and_replaced) {
    char a[512], b[512];
    kc_two_files(a, b, sizeof a);
    size_t n;
    unsigned char *payload = kc_read(b, &n);
    kc_write(a, payload + sizeof(kc_header), n - sizeof(kc_header), NULL, 0); /* a binary planted bare */
    free(payload);
    kc_restart();
    kc_cast_right();
    kc_expect_valid(a);
}

Test(kernel_cache, a_truncated_binary_is_rebuilt_and_replaced) {
    char a[512], b[512];
    kc_two_files(a, b, sizeof a);
    struct stat st;
    cr_assert_eq(stat(a, &st), 0);
    cr_assert_eq(truncate(a, st.st_size / 2), 0);
    kc_restart();
    kc_cast_right();
    size_t n = kc_expect_valid(a);
    cr_assert_eq((off_t)(n + sizeof(kc_header)), st.st_size, "the rebuilt file has %zu bytes, the first %lld", n, (long long)st.st_size);
}

Test(kernel_cache, a_loadable_binary_without_the_kernel_is_rebuilt_and_replaced) {
    char a[512], b[512];
    kc_two_files(a, b, sizeof a);
    size_t n;
    unsigned char *file_b = kc_read(b, &n), *bin = file_b + sizeof(kc_header); /* the f32->f16 binary, with a good header for a */
    n -= sizeof(kc_header);
    kc_header h = kc_header_for(kc_key(a), bin, n);
    kc_write(a, &h, sizeof h, bin, n);
    free(file_b);
    kc_restart();
    kc_cast_right();
    cr_assert(strstr(kc_log, "clCreateKernel failed"), "the log does not say why the binary was not taken: %s", kc_log);
    kc_expect_valid(a);
}

Test(kernel_cache, a_fifo_in_place_of_a_binary_does_not_hang_and_is_replaced) {
    char a[512], b[512];
    kc_two_files(a, b, sizeof a);
    cr_assert_eq(unlink(a), 0);
    cr_assert_eq(mkfifo(a, 0600), 0);
    kc_restart();
    alarm(120); /* a hang ends the test (SIGALRM) */
    kc_cast_right();
    alarm(0);
    kc_expect_valid(a);
}

Test(kernel_cache, a_symlink_in_place_of_a_binary_is_not_followed_and_is_replaced) {
    char a[512], b[512], victim[600];
    kc_two_files(a, b, sizeof a);
    snprintf(victim, sizeof victim, "%s/victim.txt", kc_dir);
    kc_write(victim, "my notes\n", 9, NULL, 0);
    cr_assert_eq(unlink(a), 0);
    cr_assert_eq(symlink(victim, a), 0);
    kc_restart();
    kc_cast_right();
    kc_expect_valid(a);
    size_t n;
    unsigned char *notes = kc_read(victim, &n);
    cr_assert(n == 9 && memcmp(notes, "my notes\n", 9) == 0, "the symlink's target was written");
    free(notes);
}

Test(kernel_cache, a_symlink_at_a_likely_temporary_name_is_not_written_through) {
    char a[512], b[512], victim[600], tmp[700];
    kc_two_files(a, b, sizeof a);
    snprintf(victim, sizeof victim, "%s/victim.txt", kc_dir);
    kc_write(victim, "my notes\n", 9, NULL, 0);
    cr_assert_eq(unlink(a), 0);
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", a, (long)getpid()); /* the name it used to write through */
    cr_assert_eq(symlink(victim, tmp), 0);
    kc_restart();
    kc_cast_right();
    size_t n;
    unsigned char *notes = kc_read(victim, &n);
    cr_assert(n == 9 && memcmp(notes, "my notes\n", 9) == 0, "%s was written through the planted %s (%zu bytes now)", victim, tmp, n);
    free(notes);
    kc_expect_valid(a);
}

static void kc_skip_unless_root(void) {
    if (geteuid() != 0) test_skip("needs root to plant files of another user (uid 65534); make test runs as root");
}

Test(kernel_cache, a_binary_of_another_user_is_not_loaded_but_replaced) {
    kc_skip_unless_root();
    char a[512], b[512];
    kc_two_files(a, b, sizeof a);
    cr_assert_eq(chown(a, 65534, 65534), 0);
    kc_restart();
    kc_cast_right();
    kc_expect_valid(a);
}

/* A cache folder another user made first, holding a good-looking file of the name gpuarr
   computes: the folder is not used at all (said once), and kernels build from source. */
Test(kernel_cache, a_cache_folder_of_another_user_is_not_used) {
    kc_skip_unless_root();
    char a[512], b[512], parent[64], dir[128], planted[700];
    kc_two_files(a, b, sizeof a);
    snprintf(parent, sizeof parent, "/tmp/gpuarr-test-kcache-other-XXXXXX");
    cr_assert_not_null(mkdtemp(parent));
    cr_assert_eq(chmod(parent, 0755), 0);
    snprintf(dir, sizeof dir, "%s/cache", parent);
    cr_assert_eq(mkdir(dir, 0755), 0);
    snprintf(planted, sizeof planted, "%s/%s", dir, strrchr(a, '/') + 1);
    size_t n;
    unsigned char *file_b = kc_read(b, &n), *bin = file_b + sizeof(kc_header); /* another kernel under a's name, */
    n -= sizeof(kc_header);                                                    /* with a header that checks out */
    kc_header h = kc_header_for(kc_key(a), bin, n);
    kc_write(planted, &h, sizeof h, bin, n);
    free(file_b);
    cr_assert_eq(chown(planted, 65534, 65534), 0);
    cr_assert_eq(chown(dir, 65534, 65534), 0);
    cr_assert_eq(setenv("GPUARR_CACHE_DIR", dir, 1), 0);
    kc_restart();
    kc_cast_right();
    kc_cast_other();
    char *said = strstr(kc_log, "is owned by uid 65534, not by this user (uid 0): not used");
    cr_assert(said && strstr(kc_log, dir), "the log does not say why %s is not used: %s", dir, kc_log);
    cr_assert_null(strstr(said + 1, "is owned by uid 65534, not by this user"), "said more than once: %s", kc_log);
    cr_assert(strstr(kc_log, "clCreateKernel") == NULL, "the planted binary reached the driver: %s", kc_log);
    kc_remove(parent);
}

/* A cache folder that is a symlink, or that others can write, holding another kernel under the
   name gpuarr computes: not used (said once), kernels build from source. */
Test(kernel_cache, a_cache_folder_that_is_a_symlink_or_writable_by_others_is_not_used) {
    char a[512], b[512], real[128], link[128], planted[700];
    kc_two_files(a, b, sizeof a);
    snprintf(real, sizeof real, "%s/real", kc_dir);
    snprintf(link, sizeof link, "%s/link", kc_dir);
    cr_assert_eq(mkdir(real, 0700), 0);
    cr_assert_eq(symlink(real, link), 0);
    snprintf(planted, sizeof planted, "%s/%s", real, strrchr(a, '/') + 1);
    size_t n;
    unsigned char *file_b = kc_read(b, &n);
    kc_write(planted, file_b + sizeof(kc_header), n - sizeof(kc_header), NULL, 0); /* another kernel, bare */
    free(file_b);
    const char *cases[2][2] = {{link, "is a symlink (not followed): not used"}, {real, "is writable by others (mode 0777): not used"}};
    for (int i = 0; i < 2; i++) {
        if (i == 1) cr_assert_eq(chmod(real, 0777), 0);
        cr_assert_eq(setenv("GPUARR_CACHE_DIR", cases[i][0], 1), 0);
        kc_restart();
        kc_cast_right();
        cr_assert(strstr(kc_log, cases[i][1]) && strstr(kc_log, cases[i][0]), "the log does not say why %s is not used: %s", cases[i][0],
                  kc_log);
    }
    cr_assert_eq(setenv("GPUARR_CACHE_DIR", kc_dir, 1), 0);
}
