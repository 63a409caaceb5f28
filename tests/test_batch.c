/*
 * test_batch.c -- gpuarr_stack and gpuarr_convert_many: host arrays onto the test device with
 * and without a cast, device arrays onto the host, mixed sources, bad inputs (code, message,
 * outputs untouched), pool stats after injected faults and after releases in any order.
 * Results are compared bit for bit with the sources through the independent reference casts.
 */
#include "test_common.h"

TestSuite(batch, .init = test_setup, .fini = test_teardown);

#define SENTINEL 0xdeadbeefu

/* n arrays of `count` elements of t with random bits, on d (host data kept in data[i]). */
static void make_sources(gpuarr_device d, gpuarr_dtype t, int n, int ndim, const int64_t *shape, gpuarr_array *a, void **data,
                         uint64_t seed) {
    test_rng rng = {seed};
    size_t count = (size_t)test_shape_count(ndim, shape);
    for (int i = 0; i < n; i++) {
        data[i] = malloc(count * test_dtype_bytes(t) + 1);
        cr_assert_not_null(data[i]);
        test_fill_random(t, data[i], count, &rng);
        TEST_OK(gpuarr_from_host_as(d, t, data[i], ndim, shape, &a[i]));
    }
}

static void free_sources(gpuarr_array *a, void **data, int n) {
    for (int i = 0; i < n; i++) {
        if (a) TEST_OK(gpuarr_release(a[i]));
        free(data[i]);
    }
}

/* The expected bits of count elements of st cast to dt, written into out at element `at`. */
static void expect_cast(void *out, size_t at, gpuarr_dtype dt, const void *src, gpuarr_dtype st, size_t count) {
    for (size_t i = 0; i < count; i++) test_store_bits(dt, out, at + i, ref_cast_bits(st, test_load_bits(st, src, i), dt));
}

static uint64_t allocated(gpuarr_device d) {
    gpuarr_pool_stats s;
    TEST_OK(gpuarr_pool_get_stats(d, &s));
    return s.allocated_bytes;
}

/* A cast the device cannot run (no fp64): the test says so and skips that case. */
static bool cast_runs(gpuarr_device src_dev, gpuarr_device dst, gpuarr_dtype st, gpuarr_dtype dt) {
    int64_t shape[1] = {4};
    gpuarr_array a, b;
    TEST_OK(gpuarr_zeros(src_dev, st, 1, shape, &a));
    gpuarr_result r = gpuarr_convert(a, dst, dt, &b);
    TEST_OK(gpuarr_release(a));
    if (r == GPUARR_OK) TEST_OK(gpuarr_release(b));
    else cr_assert_eq(r, GPUARR_ERROR_UNSUPPORTED, "convert %s -> %s = %s: %s", test_dtype_str(st), test_dtype_str(dt),
                      gpuarr_result_name(r), gpuarr_last_error());
    return r == GPUARR_OK;
}

/* Stacks n sources placed on where[i] (0: the host, 1: the test device) onto dst in dtype t. */
static void check_stack(gpuarr_device dev, const int *where, int n, gpuarr_device dst, gpuarr_dtype st, gpuarr_dtype t,
                        const char *what) {
    int64_t shape[2] = {3, 5};
    size_t count = 15;
    gpuarr_dtype dt = t ? t : st;
    if (!cast_runs(dev, dst, st, dt) || !cast_runs(gpuarr_host(), dst, st, dt)) {
        fprintf(stderr, "[INFO] batch: %s: %s -> %s not supported here, skipped\n", what, test_dtype_str(st), test_dtype_str(dt));
        return;
    }
    gpuarr_array *src = calloc((size_t)n, sizeof *src);
    void **data = calloc((size_t)n, sizeof *data);
    for (int i = 0; i < n; i++) make_sources(where[i] ? dev : gpuarr_host(), st, 1, 2, shape, &src[i], &data[i], 77u + (uint64_t)i);
    unsigned char *want = malloc((size_t)n * count * 8);
    for (int i = 0; i < n; i++) expect_cast(want, (size_t)i * count, dt, data[i], st, count);
    gpuarr_array out = {SENTINEL};
    gpuarr_result r = gpuarr_stack(src, n, dst, t, &out);
    cr_assert_eq(r, GPUARR_OK, "%s: gpuarr_stack = %s: %s", what, gpuarr_result_name(r), gpuarr_last_error());
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(out, &info));
    cr_assert_eq(info.ndim, 3, "%s", what);
    cr_assert(info.shape[0] == n && info.shape[1] == 3 && info.shape[2] == 5, "%s", what);
    cr_assert_eq(info.dtype, dt, "%s", what);
    cr_assert_eq(info.device.id, dst.id, "%s", what);
    cr_assert(!info.is_view, "%s", what);
    test_expect_array_bytes(out, dt, want, (size_t)n * count, what);
    TEST_OK(gpuarr_release(out));
    free_sources(src, data, n);
    free(src);
    free(data);
    free(want);
}

/* convert_many of sources on where[i], of dtype dts[i] and count i + 1 (some larger than the
   batch threshold when big), onto dst in dtype t. */
static void check_convert_many(gpuarr_device dev, const int *where, const gpuarr_dtype *dts, int n, gpuarr_device dst, gpuarr_dtype t,
                               bool big, const char *what) {
    for (int i = 0; i < n; i++)
        if (!cast_runs(where[i] ? dev : gpuarr_host(), dst, dts[i], t ? t : dts[i])) {
            fprintf(stderr, "[INFO] batch: %s: %s -> %s not supported here, skipped\n", what, test_dtype_str(dts[i]),
                    test_dtype_str(t ? t : dts[i]));
            return;
        }
    size_t items = n > 0 ? (size_t)n : 1; /* n > 0 (said so for gcc's allocation-size check at -O1) */
    gpuarr_array *src = calloc(items, sizeof *src), *out = calloc(items + 1, sizeof *out);
    void **data = calloc(items, sizeof *data);
    size_t *counts = calloc(items, sizeof *counts);
    for (int i = 0; i < n; i++) {
        int64_t shape[2] = {i + 1, (big && i % 3 == 0) ? 300000 : 7};
        counts[i] = (size_t)(shape[0] * shape[1]);
        make_sources(where[i] ? dev : gpuarr_host(), dts[i], 1, 2, shape, &src[i], &data[i], 900u + (uint64_t)i);
    }
    for (int i = 0; i <= n; i++) out[i].id = SENTINEL;
    gpuarr_result r = gpuarr_convert_many(src, n, dst, t, out);
    cr_assert_eq(r, GPUARR_OK, "%s: gpuarr_convert_many = %s: %s", what, gpuarr_result_name(r), gpuarr_last_error());
    cr_assert_eq(out[n].id, SENTINEL, "%s: wrote past out[n - 1]", what);
    /* the outputs outlive their sources */
    for (int i = 0; i < n; i++) TEST_OK(gpuarr_release(src[i]));
    for (int k = 0; k < n; k++) {
        int i = k;
        gpuarr_dtype dt = t ? t : dts[i];
        gpuarr_array_info info;
        TEST_OK(gpuarr_array_get_info(out[i], &info));
        cr_assert_eq(info.dtype, dt, "%s: out[%d]", what, i);
        cr_assert_eq(info.device.id, dst.id, "%s: out[%d]", what, i);
        cr_assert_eq(info.count, (int64_t)counts[i], "%s: out[%d]", what, i);
        cr_assert(!info.is_view && info.offset == 0, "%s: out[%d] reported as a view", what, i);
        void *want = malloc(counts[i] * 8);
        expect_cast(want, 0, dt, data[i], dts[i], counts[i]);
        char name[128];
        snprintf(name, sizeof name, "%s: out[%d]", what, i);
        test_expect_array_bytes(out[i], dt, want, counts[i], name);
        free(want);
    }
    /* releasing some outputs leaves the others intact: the odd ones first, then re-check */
    for (int i = 1; i < n; i += 2) TEST_OK(gpuarr_release(out[i]));
    for (int i = 0; i < n; i += 2) {
        gpuarr_dtype dt = t ? t : dts[i];
        void *want = malloc(counts[i] * 8);
        expect_cast(want, 0, dt, data[i], dts[i], counts[i]);
        test_expect_array_bytes(out[i], dt, want, counts[i], what);
        free(want);
    }
    for (int i = n - 1 - ((n - 1) % 2); i >= 0; i -= 2) TEST_OK(gpuarr_release(out[i]));
    free_sources(NULL, data, n);
    free(src);
    free(out);
    free(data);
    free(counts);
}

static const int ALL_HOST[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};
static const int ALL_DEV[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
static const int MIXED[9] = {0, 1, 1, 0, 1, 0, 0, 1, 0};

Test(batch, stack_of_host_arrays_onto_the_device_with_and_without_a_cast) {
    gpuarr_device dev = test_device();
    uint64_t start = allocated(dev);
    check_stack(dev, ALL_HOST, 9, dev, GPUARR_F32, 0, "stack host f32");
    check_stack(dev, ALL_HOST, 9, dev, GPUARR_F32, GPUARR_F16, "stack host f32 -> f16");
    check_stack(dev, ALL_HOST, 9, dev, GPUARR_I32, GPUARR_F64, "stack host i32 -> f64");
    check_stack(dev, ALL_HOST, 1, dev, GPUARR_F32, GPUARR_BF16, "stack of one host array");
    cr_assert_eq(allocated(dev), start, "allocated bytes not back after the releases");
}

Test(batch, stack_of_device_arrays_onto_the_host_and_the_device) {
    gpuarr_device dev = test_device();
    check_stack(dev, ALL_DEV, 9, gpuarr_host(), GPUARR_F32, 0, "stack device f32 onto the host");
    check_stack(dev, ALL_DEV, 9, gpuarr_host(), GPUARR_F32, GPUARR_F16, "stack device f32 -> f16 onto the host");
    check_stack(dev, ALL_DEV, 9, gpuarr_host(), GPUARR_I32, GPUARR_F64, "stack device i32 -> f64 onto the host");
    check_stack(dev, ALL_DEV, 9, dev, GPUARR_F32, 0, "stack device f32 in place on the device");
    check_stack(dev, ALL_DEV, 9, dev, GPUARR_F32, GPUARR_F16, "stack device f32 -> f16 on the device");
}

Test(batch, stack_of_mixed_sources) {
    gpuarr_device dev = test_device();
    check_stack(dev, MIXED, 9, dev, GPUARR_F32, 0, "stack mixed onto the device");
    check_stack(dev, MIXED, 9, dev, GPUARR_F32, GPUARR_F16, "stack mixed f32 -> f16 onto the device");
    check_stack(dev, MIXED, 9, dev, GPUARR_I32, GPUARR_F64, "stack mixed i32 -> f64 onto the device");
    check_stack(dev, MIXED, 9, gpuarr_host(), GPUARR_F32, GPUARR_F16, "stack mixed f32 -> f16 onto the host");
}

Test(batch, convert_many_of_host_device_and_mixed_sources) {
    gpuarr_device dev = test_device();
    uint64_t start = allocated(dev), hstart = allocated(gpuarr_host());
    gpuarr_dtype f32[9], mix[9];
    for (int i = 0; i < 9; i++) {
        f32[i] = GPUARR_F32;
        mix[i] = i % 4 == 1 ? GPUARR_I32 : GPUARR_F32;
    }
    check_convert_many(dev, ALL_HOST, f32, 9, dev, 0, false, "convert_many host f32 (identity on the host)");
    check_convert_many(dev, ALL_HOST, f32, 9, dev, GPUARR_F16, false, "convert_many host f32 -> f16");
    check_convert_many(dev, ALL_HOST, mix, 9, dev, GPUARR_F64, false, "convert_many host f32/i32 -> f64");
    check_convert_many(dev, ALL_HOST, mix, 9, dev, 0, false, "convert_many host f32/i32, dtype kept");
    check_convert_many(dev, ALL_DEV, f32, 9, gpuarr_host(), 0, false, "convert_many device f32 onto the host");
    check_convert_many(dev, ALL_DEV, mix, 9, gpuarr_host(), GPUARR_F16, false, "convert_many device f32/i32 -> f16 onto the host");
    check_convert_many(dev, MIXED, mix, 9, dev, GPUARR_F16, false, "convert_many mixed -> f16 onto the device");
    check_convert_many(dev, MIXED, mix, 9, dev, 0, false, "convert_many mixed onto the device, dtype kept");
    check_convert_many(dev, MIXED, f32, 9, dev, GPUARR_F16, true, "convert_many mixed with large arrays -> f16");
    check_convert_many(dev, MIXED, f32, 1, dev, GPUARR_F16, false, "convert_many of one");
    cr_assert_eq(allocated(dev), start, "allocated bytes not back after the releases");
    cr_assert_eq(allocated(gpuarr_host()), hstart, "host allocated bytes not back after the releases");
}

Test(batch, convert_many_identity_returns_the_sources_retained) {
    gpuarr_device dev = test_device();
    int64_t shape[1] = {16};
    gpuarr_array src[3], out[3];
    void *data[3];
    for (int i = 0; i < 3; i++) make_sources(dev, GPUARR_F32, 1, 1, shape, &src[i], &data[i], 5u + (uint64_t)i);
    TEST_OK(gpuarr_convert_many(src, 3, dev, GPUARR_F32, out));
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(out[i].id, src[i].id);
        gpuarr_array_info info;
        TEST_OK(gpuarr_array_get_info(src[i], &info));
        cr_assert_eq(info.refcount, 2u);
        TEST_OK(gpuarr_release(out[i]));
    }
    free_sources(src, data, 3);
}

/* ---------------------------------------------------------------------------------------------
 * Bad inputs: the code, the argument named, outputs untouched, nothing allocated
 * ------------------------------------------------------------------------------------------- */
static void expect_fail(gpuarr_result r, gpuarr_result want, const char *fn, const char *needle, const gpuarr_array *out, int nout,
                        const char *what) {
    cr_assert_eq(r, want, "%s: %s, want %s (%s)", what, gpuarr_result_name(r), gpuarr_result_name(want), gpuarr_last_error());
    const char *msg = gpuarr_last_error();
    cr_assert(strstr(msg, fn) != NULL, "%s: message \"%s\" does not name %s", what, msg, fn);
    cr_assert(strstr(msg, needle) != NULL, "%s: message \"%s\" does not say \"%s\"", what, msg, needle);
    for (int i = 0; i < nout; i++) cr_assert_eq(out[i].id, SENTINEL, "%s: out[%d] written on failure", what, i);
}

Test(batch, bad_inputs_are_refused_naming_the_argument_and_leave_out_untouched) {
    gpuarr_device dev = test_device();
    int64_t shape[2] = {4, 2}, other[2] = {2, 4};
    gpuarr_array src[6], out[6];
    void *data[6];
    make_sources(gpuarr_host(), GPUARR_F32, 5, 2, shape, src, data, 11u);
    make_sources(dev, GPUARR_F32, 1, 2, other, &src[5], &data[5], 12u);
    gpuarr_device bad_dev = {12345};
    for (int i = 0; i < 6; i++) out[i].id = SENTINEL;
#define BOTH(call_args, want, needle, what)                                                                                      \
    do {                                                                                                                         \
        expect_fail(gpuarr_stack call_args, want, "gpuarr_stack", needle, out, 1, what);                                         \
        expect_fail(gpuarr_convert_many call_args, want, "gpuarr_convert_many", needle, out, 6, what);                          \
    } while (0)
    BOTH((src, -1, dev, 0, out), GPUARR_ERROR_INVALID_ARGUMENT, "n = -1", "n < 0");
    BOTH((NULL, 2, dev, 0, out), GPUARR_ERROR_INVALID_ARGUMENT, "src is NULL", "src NULL");
    BOTH((src, 2, dev, 0, NULL), GPUARR_ERROR_INVALID_ARGUMENT, "out is NULL", "out NULL");
    BOTH((src, 2, bad_dev, 0, out), GPUARR_ERROR_INVALID_HANDLE, "dst", "invalid device");
    BOTH((src, 2, dev, (gpuarr_dtype)99, out), GPUARR_ERROR_INVALID_ARGUMENT, "t = 99", "dtype 99");
    expect_fail(gpuarr_stack(src, 0, dev, 0, out), GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_stack", "n = 0", out, 1, "stack of none");
    TEST_OK(gpuarr_convert_many(src, 0, dev, 0, out));
    cr_assert_eq(out[0].id, SENTINEL, "convert_many with n = 0 wrote out[0]");
    TEST_OK(gpuarr_convert_many(NULL, 0, dev, 0, out));
    /* a released handle at index 3, a forged one at 4 */
    gpuarr_array stale = src[3];
    gpuarr_array keep;
    TEST_OK(gpuarr_convert(src[3], gpuarr_host(), 0, &keep)); /* the identity: a second reference */
    TEST_OK(gpuarr_release(src[3]));
    TEST_OK(gpuarr_release(keep));
    gpuarr_array f64;
    TEST_OK(gpuarr_zeros(gpuarr_host(), GPUARR_F64, 2, shape, &f64));
    int64_t eight[8] = {1, 1, 1, 1, 1, 1, 1, 2};
    gpuarr_array deep;
    TEST_OK(gpuarr_zeros(gpuarr_host(), GPUARR_F32, 8, eight, &deep));
    uint64_t start = allocated(dev), hstart = allocated(gpuarr_host());
    gpuarr_array with_stale[5] = {src[0], src[1], src[2], stale, src[4]};
    BOTH((with_stale, 5, dev, 0, out), GPUARR_ERROR_INVALID_HANDLE, "src[3]", "released handle");
    BOTH((with_stale, 5, dev, GPUARR_F16, out), GPUARR_ERROR_INVALID_HANDLE, "src[3]", "released handle, with a cast");
    gpuarr_array forged[3] = {src[0], src[1], {src[1].id + 1}};
    BOTH((forged, 3, dev, 0, out), GPUARR_ERROR_INVALID_HANDLE, "src[2]", "forged handle");
    /* stack: shapes and dtypes must match (convert_many takes them) */
    gpuarr_array shapes[3] = {src[0], src[1], src[5]}, dtypes[3] = {src[0], f64, src[1]};
    expect_fail(gpuarr_stack(shapes, 3, dev, 0, out), GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_stack", "src[2]", out, 1, "shape");
    expect_fail(gpuarr_stack(dtypes, 3, dev, 0, out), GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_stack", "src[1]", out, 1, "dtype");
    expect_fail(gpuarr_stack(&deep, 1, dev, 0, out), GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_stack", "src[0]", out, 1, "8 dims");
    cr_assert_eq(allocated(dev), start, "allocated bytes changed by refused calls");
    cr_assert_eq(allocated(gpuarr_host()), hstart, "host allocated bytes changed by refused calls");
    TEST_OK(gpuarr_release(deep));
    TEST_OK(gpuarr_release(f64));
    TEST_OK(gpuarr_release(src[5]));
    for (int i = 0; i < 5; i++)
        if (i != 3) TEST_OK(gpuarr_release(src[i]));
    free_sources(NULL, data, 6);
#undef BOTH
}

Test(batch, a_cast_the_device_cannot_run_is_unsupported_before_anything_is_allocated) {
    gpuarr_device dev = test_device();
    gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(dev, &info));
    if (info.backend == GPUARR_BACKEND_OPENCL) { /* an OpenCL device can be made to lack fp64 */
        gpuarr_shutdown();
        cr_assert_eq(setenv("GPUARR_OPENCL_FP64", "off", 1), 0);
        gpuarr_result r = gpuarr_init(NULL);
        unsetenv("GPUARR_OPENCL_FP64");
        TEST_OK(r);
        dev = test_device();
    }
    /* widening to f64 runs on the destination: unsupported there when it lacks fp64 */
    if (cast_runs(gpuarr_host(), dev, GPUARR_F32, GPUARR_F64)) test_skip("the device runs every cast (it has fp64)");
    int64_t shape[1] = {8};
    gpuarr_array src[2], out[2] = {{SENTINEL}, {SENTINEL}};
    void *data[2];
    make_sources(gpuarr_host(), GPUARR_F32, 2, 1, shape, src, data, 3u);
    uint64_t start = allocated(dev);
    expect_fail(gpuarr_stack(src, 2, dev, GPUARR_F64, out), GPUARR_ERROR_UNSUPPORTED, "gpuarr_stack", "src[0]", out, 1, "no fp64");
    expect_fail(gpuarr_convert_many(src, 2, dev, GPUARR_F64, out), GPUARR_ERROR_UNSUPPORTED, "gpuarr_convert_many", "src[0]", out, 2,
                "no fp64");
    cr_assert_eq(allocated(dev), start);
    free_sources(src, data, 2);
}

/* ---------------------------------------------------------------------------------------------
 * Faults mid-batch: every raw allocation of the test device above `above` bytes fails (a failed
 * nth allocation is retried by the pool's out-of-memory ladder, so a size is what makes a batch
 * fail). The failure leaves the pool stats where they were and out untouched; the same call
 * works once the fault is lifted, and its outputs give everything back when released.
 * ------------------------------------------------------------------------------------------- */
static void faults_mid_batch(bool stack, const int *where, gpuarr_dtype t, bool onto_host, bool big0, uint64_t above, const char *what) {
    gpuarr_device dev = test_device(), dst = onto_host ? gpuarr_host() : dev;
    enum { N = 24 };
    gpuarr_array src[N], out[N + 1];
    void *data[N];
    for (int i = 0; i < N; i++) {
        int64_t shape[1] = {big0 && i == 0 ? 2 << 20 : 32768}; /* 128 KiB each; 8 MiB for a big first one */
        make_sources(where[i % 9] ? dev : gpuarr_host(), GPUARR_F32, 1, 1, shape, &src[i], &data[i], 40u + (uint64_t)i);
    }
    TEST_OK(gpuarr_pool_trim(dev)); /* nothing cached: the batch must allocate */
    TEST_OK(gpuarr_pool_trim(gpuarr_host()));
    uint64_t start = allocated(dev), hstart = allocated(gpuarr_host());
    for (int i = 0; i <= N; i++) out[i].id = SENTINEL;
    TEST_OK(gpuarr_pool_inject_faults(dev, 0, above));
    gpuarr_result r = stack ? gpuarr_stack(src, N, dst, t, out) : gpuarr_convert_many(src, N, dst, t, out);
    TEST_OK(gpuarr_pool_inject_faults(dev, 0, 0));
    cr_assert_eq(r, GPUARR_ERROR_OUT_OF_MEMORY, "%s: %s: %s", what, gpuarr_result_name(r), gpuarr_last_error());
    cr_assert(strstr(gpuarr_last_error(), "injected") != NULL, "%s: %s", what, gpuarr_last_error());
    for (int i = 0; i <= N; i++) cr_assert_eq(out[i].id, SENTINEL, "%s: out[%d] written on failure", what, i);
    cr_assert_eq(allocated(dev), start, "%s: allocated bytes %llu, were %llu", what, (unsigned long long)allocated(dev),
                 (unsigned long long)start);
    cr_assert_eq(allocated(gpuarr_host()), hstart, "%s: host allocated bytes changed", what);
    r = stack ? gpuarr_stack(src, N, dst, t, out) : gpuarr_convert_many(src, N, dst, t, out);
    cr_assert_eq(r, GPUARR_OK, "%s, without the fault: %s: %s", what, gpuarr_result_name(r), gpuarr_last_error());
    int nout = stack ? 1 : N;
    for (int i = nout - 1; i >= 0; i--) TEST_OK(gpuarr_release(out[i])); /* last first */
    cr_assert_eq(allocated(dev), start, "%s: allocated bytes not back after the release", what);
    cr_assert_eq(allocated(gpuarr_host()), hstart, "%s: host allocated bytes not back after the release", what);
    free_sources(src, data, N);
}

Test(batch, a_fault_in_a_stack_leaves_nothing_allocated) {
    /* the output's own allocation */
    faults_mid_batch(true, ALL_HOST, GPUARR_F16, false, false, 1u << 20, "stack host -> f16, output refused");
    /* onto the host: the output is made, then the device's packing temporary is refused */
    faults_mid_batch(true, MIXED, 0, true, false, 1u << 20, "stack mixed onto the host, device temporary refused");
}

Test(batch, a_fault_mid_convert_many_leaves_nothing_allocated) {
    /* the small ones' block is made and filled, then the large one's array is refused */
    faults_mid_batch(false, ALL_HOST, GPUARR_F16, false, true, 3u << 20, "convert_many host -> f16, large one refused");
    faults_mid_batch(false, MIXED, GPUARR_F16, false, true, 3u << 20, "convert_many mixed -> f16, large one refused");
    faults_mid_batch(false, ALL_HOST, GPUARR_F16, false, false, 1u << 20, "convert_many host -> f16, block refused");
}
