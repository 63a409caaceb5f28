/* Regression tests for defects found in review: handle reuse and kinds, a destroyed current
   stream, the floating-point environment of the caller, misaligned caller buffers. (Identity
   conversions of arrays still being produced: tests/test_opencl.c, which can read natively.)
   Runs on GPUARR_TEST_DEVICE like the rest. */
#include <criterion/criterion.h>
#include <fenv.h>
#include "test_common.h"

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

TestSuite(robustness, .init = test_setup, .fini = test_teardown);

Test(robustness, a_released_handle_stays_invalid_across_thousands_of_reuses) {
    gpuarr_device dev = test_device();
    int64_t shape[1] = {4};
    gpuarr_array first;
    TEST_OK(gpuarr_empty(dev, GPUARR_F32, 1, shape, &first));
    TEST_OK(gpuarr_release(first));
    /* With one array live at a time, a naive allocator hands the same slot back every time:
       the generation counter would wrap and revive `first`. */
    for (int i = 0; i < 5000; i++) {
        gpuarr_array a;
        TEST_OK(gpuarr_empty(dev, GPUARR_F64, 1, shape, &a));
        cr_assert_neq(a.id, first.id, "iteration %d: a new array got the released handle's id", i);
        gpuarr_array_info info;
        cr_assert_eq(gpuarr_array_get_info(first, &info), GPUARR_ERROR_INVALID_HANDLE, "iteration %d: stale handle accepted", i);
        TEST_OK(gpuarr_release(a));
    }
    cr_assert_eq(gpuarr_release(first), GPUARR_ERROR_INVALID_HANDLE);
}

Test(robustness, a_stream_id_used_as_an_array_is_refused_by_kind) {
    gpuarr_device dev = test_device();
    gpuarr_stream s;
    TEST_OK(gpuarr_stream_create(dev, 0, &s));
    gpuarr_array as_array = {s.id};
    gpuarr_array_info info;
    cr_assert_eq(gpuarr_array_get_info(as_array, &info), GPUARR_ERROR_INVALID_HANDLE);
    cr_assert(strstr(gpuarr_last_error(), "stream handle, not an array handle"), "message: %s", gpuarr_last_error());
    gpuarr_event as_event = {s.id};
    cr_assert_eq(gpuarr_event_sync(as_event), GPUARR_ERROR_INVALID_HANDLE);
    TEST_OK(gpuarr_stream_destroy(s));
}

Test(robustness, destroying_the_current_stream_does_not_break_later_calls) {
    gpuarr_device dev = test_device();
    gpuarr_stream s;
    TEST_OK(gpuarr_stream_create(dev, 0, &s));
    TEST_OK(gpuarr_set_current_stream(s));
    TEST_OK(gpuarr_stream_destroy(s));
    float in[3] = {1, 2, 3}, out[3] = {0};
    int64_t shape[1] = {3};
    gpuarr_array a, b;
    TEST_OK(gpuarr_from_host(dev, in, 1, shape, &a));
    TEST_OK(gpuarr_convert_async(a, dev, GPUARR_F64, (gpuarr_stream){0}, &b));
    TEST_OK(gpuarr_stream_sync((gpuarr_stream){0}));
    TEST_OK(gpuarr_to_host(b, out, 3));
    cr_assert(out[2] == 3.0f);
    cr_assert_eq(gpuarr_current_stream().id, 0u, "the destroyed stream is still current");
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
}

/* The caller's rounding mode and flush-to-zero must not leak into casts. */
Test(robustness, casts_ignore_the_callers_rounding_mode_and_flush_to_zero) {
    gpuarr_device dev = test_device();
    enum { N = 4096 };
    static double in[N];
    static float out[N];
    for (int i = 0; i < N; i++) in[i] = 1.0 + (double)i * 0x1p-30; /* most are between two floats */
    in[0] = 0x1p-140;                                              /* an f32 subnormal */
    in[1] = -0x1.8p-149;                                            /* halfway to the smallest one */
    int64_t shape[1] = {N};
    gpuarr_array a, b;
    TEST_OK(gpuarr_from_host(dev, in, 1, shape, &a));
    int old_round = fegetround();
    fesetround(FE_UPWARD);
#if defined(__x86_64__)
    unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040u); /* FTZ + DAZ, as -ffast-math's crtfastmath sets for the process */
#endif
    gpuarr_result r = gpuarr_convert(a, gpuarr_host(), GPUARR_F32, &b);
    if (r == GPUARR_OK) r = gpuarr_to_host(b, out, N);
#if defined(__x86_64__)
    _mm_setcsr(csr);
#endif
    fesetround(old_round);
    TEST_OK(r);
    for (int i = 0; i < N; i++) {
        uint64_t want = ref_cast_bits(GPUARR_F64, test_f64_bits(in[i]), GPUARR_F32);
        cr_assert_eq(test_f32_bits(out[i]), (uint32_t)want, "element %d: got 0x%08x, want 0x%08x", i, test_f32_bits(out[i]),
                     (unsigned)want);
    }
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
}

Test(robustness, misaligned_caller_buffers_are_refused) {
    gpuarr_device dev = test_device();
    _Alignas(8) unsigned char raw[64] = {0};
    int64_t shape[1] = {4};
    gpuarr_array a = {0xdeadbeefu};
    cr_assert_eq(gpuarr_from_host_as(dev, GPUARR_F32, raw + 1, 1, shape, &a), GPUARR_ERROR_INVALID_ARGUMENT);
    cr_assert(strstr(gpuarr_last_error(), "aligned"), "message: %s", gpuarr_last_error());
    cr_assert_eq(a.id, 0xdeadbeefu);
    TEST_OK(gpuarr_from_host_as(dev, GPUARR_F32, raw, 1, shape, &a));
    cr_assert_eq(gpuarr_to_host_as(a, GPUARR_F64, raw + 4, 4), GPUARR_ERROR_INVALID_ARGUMENT);
    TEST_OK(gpuarr_to_host_as(a, GPUARR_U8, raw + 1, 4)); /* bytes have no alignment */
    TEST_OK(gpuarr_release(a));
}

/* Copies larger than the cache use streaming stores (with unaligned heads and tails): exact. */
Test(robustness, large_copies_are_exact_whatever_the_alignment) {
    gpuarr_device dev = test_device();
    enum { N = (40 << 20) / 4 + 13 }; /* over the 32 MiB threshold, not a multiple of anything */
    uint32_t *in = malloc(sizeof(uint32_t) * N), *raw = malloc(sizeof(uint32_t) * (N + 8));
    cr_assert(in && raw);
    test_rng rng = {99};
    for (int i = 0; i < N; i++) in[i] = (uint32_t)test_rng_next(&rng);
    int64_t shape[1] = {N};
    gpuarr_array a, b;
    TEST_OK(gpuarr_from_host_as(dev, GPUARR_U32, in, 1, shape, &a));
    TEST_OK(gpuarr_convert(a, gpuarr_host(), 0, &b)); /* device (or host) to host, same dtype */
    uint32_t *out = raw + 1;                           /* 4-byte aligned, not 32-byte aligned */
    TEST_OK(gpuarr_to_host_as(b, GPUARR_U32, out, N));
    cr_assert_eq(memcmp(in, out, sizeof(uint32_t) * N), 0, "a large copy changed the data");
    TEST_OK(gpuarr_to_host_as(a, GPUARR_U32, out, N));
    cr_assert_eq(memcmp(in, out, sizeof(uint32_t) * N), 0, "a large download changed the data");
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
    free(in);
    free(raw);
}

/* The public f16/bf16 scalar helpers, like the array casts, round to nearest even whatever
   rounding mode the caller set (their subnormal path lets the FPU round). */
static void expect_scalar_helpers_exact(int mode, const char *mode_name) {
    int old_round = fegetround();
    cr_assert_eq(fesetround(mode), 0, "fesetround(%s) failed", mode_name);
    unsigned bad = 0;
    char first[160] = "";
    for (uint64_t i = 0; i <= 0xffffffffull; i += 4093) { /* a strided sweep of every f32 */
        uint32_t fb = (uint32_t)i;
        float f;
        memcpy(&f, &fb, sizeof f);
        uint16_t got = gpuarr_f16_from_float(f).bits, want = (uint16_t)ref_cast_bits(GPUARR_F32, fb, GPUARR_F16);
        if (got != want && bad++ == 0) snprintf(first, sizeof first, "f16_from_float(0x%08x) = 0x%04x, want 0x%04x", fb, got, want);
        got = gpuarr_bf16_from_float(f).bits, want = (uint16_t)ref_cast_bits(GPUARR_F32, fb, GPUARR_BF16);
        if (got != want && bad++ == 0) snprintf(first, sizeof first, "bf16_from_float(0x%08x) = 0x%04x, want 0x%04x", fb, got, want);
    }
    test_rng rng = {20};
    for (int i = 0; i < 1 << 20; i++) { /* doubles: random bits, and near the f16/bf16 subnormal ranges */
        uint64_t db = test_rng_next(&rng);
        if (i & 1) db = (db & 0x800fffffffffffffull) | ((uint64_t)(0x3e0 + (i >> 1) % 48) << 52);
        if (i & 2) db = (db & 0x800fffffffffffffull) | ((uint64_t)(0x36a + (i >> 2) % 24) << 52);
        double d;
        memcpy(&d, &db, sizeof d);
        uint16_t got = gpuarr_f16_from_double(d).bits, want = (uint16_t)ref_cast_bits(GPUARR_F64, db, GPUARR_F16);
        if (got != want && bad++ == 0) snprintf(first, sizeof first, "f16_from_double(0x%016llx) = 0x%04x, want 0x%04x", (unsigned long long)db, got, want);
        got = gpuarr_bf16_from_double(d).bits, want = (uint16_t)ref_cast_bits(GPUARR_F64, db, GPUARR_BF16);
        if (got != want && bad++ == 0) snprintf(first, sizeof first, "bf16_from_double(0x%016llx) = 0x%04x, want 0x%04x", (unsigned long long)db, got, want);
    }
    uint16_t tiny = gpuarr_f16_from_float(0x1.000002p-25f).bits; /* just above half the smallest f16 */
    int now = fegetround();
    fesetround(old_round);
    cr_assert_eq(now, mode, "a helper changed the caller's rounding mode");
    cr_assert_eq(bad, 0u, "under %s: %u results differ, the first: %s", mode_name, bad, first);
    cr_assert_eq(tiny, 0x0001u, "under %s: f16_from_float(0x1.000002p-25f) = 0x%04x, want 0x0001", mode_name, tiny);
}

Test(robustness, scalar_f16_and_bf16_helpers_ignore_the_callers_rounding_mode) {
    expect_scalar_helpers_exact(FE_TONEAREST, "FE_TONEAREST");
    expect_scalar_helpers_exact(FE_TOWARDZERO, "FE_TOWARDZERO");
    expect_scalar_helpers_exact(FE_UPWARD, "FE_UPWARD");
    expect_scalar_helpers_exact(FE_DOWNWARD, "FE_DOWNWARD");
}

/* Every bf16 bit pattern widens exactly (NaNs quieted as the rules say), whatever the rounding mode. */
Test(robustness, bf16_to_float_is_exact_for_every_bit_pattern) {
    int bad = 0;
    char first[128] = "";
    for (uint32_t b = 0; b <= 0xffffu; b++) {
        gpuarr_bf16 h = {(uint16_t)b};
        float f = gpuarr_bf16_to_float(h);
        uint32_t got;
        memcpy(&got, &f, 4);
        uint32_t want = (uint32_t)ref_cast_bits(GPUARR_BF16, b, GPUARR_F32);
        if (got != want && bad++ == 0) snprintf(first, sizeof first, "bf16_to_float(0x%04x) = 0x%08x, want 0x%08x", b, got, want);
    }
    cr_expect_eq(bad, 0, "%d patterns differ, the first: %s", bad, first);
}
