/*
 * test_mutable.c -- arrays you write into: gpuarr_copy / _async between any two
 * devices with a cast, gpuarr_write / gpuarr_read (+ _async) of element ranges, gpuarr_fill_as
 * and the typed gpuarr_fill, reshape / slice views (views of views, memory kept alive by a view,
 * pool stats balanced), gpuarr_empty_pinned, gpuarr_array_query / _sync, the ordering of async
 * calls across streams, overlapping copies, and every bad input with its code and message.
 * Every cast is checked bit for bit against the independent reference in test_common.h.
 */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdlib.h>
#include "test_common.h"

TestSuite(mutable, .init = test_setup, .fini = test_teardown);

/* ---------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------- */
enum { N = 64 }; /* elements of the cast inputs */

static const uint64_t int_edges[] = {
    0, 1, (uint64_t)-1, 2, (uint64_t)-2, 100, (uint64_t)-100, 127, 128, (uint64_t)-128,
    (uint64_t)-129, 255, 256, 257, 2049, 32767, 32768, (uint64_t)-32768, (uint64_t)-32769, 65504,
    65520, 65535, 65536, 0x01000001, 0x7fffffff, 0x80000000, 0xffffffff, 1ull << 32,
    (1ull << 53) + 1, (1ull << 63) - 1, 1ull << 63, 0xfffffffffffff800ull, 0x123456789abcdef0ull,
};
static const double f64_edges[] = {
    0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 2.9, -2.9, 127.9, 128.0, -129.0, 255.5, 256.0, 32768.0,
    -32769.0, 65504.0, 65520.0, 4294967296.0, 0x1p63, -0x1p63, 0x1p64, 1e300, -1e300, 0x1p-24,
    0x1p-25, 0x1p-126, 0x1p-149, 0x1p-1074, 1.0 / 3.0, -2.0 / 3.0, 0x1.002p0, 0x1.0100004p0,
    16777217.0, 0x1.ffffffp127,
};
static const uint64_t f64_special_bits[] = {
    0x7ff0000000000000ull, 0xfff0000000000000ull, 0x7ff8000000000000ull, 0xfff4000000000001ull,
    0x7ffabcdef0123456ull,
};

/* N edge values of dtype t: integers from int_edges, floats from f64_edges / specials rounded
   by the reference, then deterministic random bits. Bools are canonical 0 / 1. */
static void make_inputs(gpuarr_dtype t, void *out) {
    size_t k = 0;
    test_rng rng = {(uint64_t)t * 977u + 5u};
    if (t == GPUARR_BOOL) {
        for (; k < N; k++) test_store_bits(t, out, k, (k * 7 + 3) % 5 < 2);
        return;
    }
    if (test_dtype_is_float(t)) {
        for (size_t i = 0; i < sizeof f64_edges / sizeof f64_edges[0] && k < N; i++)
            test_store_bits(t, out, k++, ref_cast_bits(GPUARR_F64, test_f64_bits(f64_edges[i]), t));
        for (size_t i = 0; i < sizeof f64_special_bits / sizeof f64_special_bits[0] && k < N; i++)
            test_store_bits(t, out, k++, ref_cast_bits(GPUARR_F64, f64_special_bits[i], t));
    } else {
        for (size_t i = 0; i < sizeof int_edges / sizeof int_edges[0] && k < N; i++)
            test_store_bits(t, out, k++, int_edges[i]);
    }
    for (; k < N; k++) test_store_bits(t, out, k, test_rng_next(&rng));
}

/* Whether r is the one accepted failure of a pair: f64 on a device without fp64. */
static bool f64_unsupported(gpuarr_result r, gpuarr_dtype s, gpuarr_dtype d) {
    return r == GPUARR_ERROR_UNSUPPORTED && (s == GPUARR_F64 || d == GPUARR_F64);
}

/* got (dtype d, n elements) against the reference cast of in (dtype s). */
static void expect_reference(gpuarr_dtype s, const void *in, gpuarr_dtype d, const void *got, size_t n,
                             const char *what) {
    for (size_t i = 0; i < n; i++) {
        uint64_t sb = test_load_bits(s, in, i), gb = test_load_bits(d, got, i), eb = ref_cast_bits(s, sb, d);
        if (gb != eb)
            cr_assert_fail("%s: %s -> %s element %zu: input 0x%" PRIx64 " got 0x%" PRIx64 " expected 0x%" PRIx64, what,
                           test_dtype_str(s), test_dtype_str(d), i, sb, gb, eb);
    }
}

/* The raw bytes of a (dtype t, n elements), through the long-standing gpuarr_to_host_as. */
static void raw_read(gpuarr_array a, gpuarr_dtype t, void *out, size_t n) {
    TEST_OK(gpuarr_to_host_as(a, t, out, n));
}

static gpuarr_array make_i32(gpuarr_device d, int ndim, const int64_t *shape, int32_t first_value) {
    int64_t n = test_shape_count(ndim, shape);
    int32_t *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    cr_assert_not_null(v);
    for (int64_t i = 0; i < n; i++) v[i] = first_value + (int32_t)i;
    gpuarr_array a = {0};
    TEST_OK(gpuarr_from_host_as(d, GPUARR_I32, v, ndim, shape, &a));
    free(v);
    return a;
}

static void expect_i32_values(gpuarr_array a, const int32_t *want, size_t n, const char *what) {
    int32_t got[256];
    cr_assert(n <= 256);
    raw_read(a, GPUARR_I32, got, n);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(got[i], want[i], "%s: element %zu = %d, want %d", what, i, got[i], want[i]);
}

static void expect_info_view(gpuarr_array v, bool is_view, size_t offset, int ndim, const int64_t *shape, const char *what) {
    gpuarr_array_info info;
    memset(&info, 0x5a, sizeof info);
    TEST_OK(gpuarr_array_get_info(v, &info));
    cr_expect_eq(info.is_view, is_view, "%s: is_view = %d", what, info.is_view);
    cr_expect_eq(info.offset, offset, "%s: offset = %zu, want %zu", what, info.offset, offset);
    cr_expect_eq(info.ndim, ndim, "%s: ndim = %d, want %d", what, info.ndim, ndim);
    for (int i = 0; i < ndim; i++)
        cr_expect_eq(info.shape[i], shape[i], "%s: shape[%d] = %" PRId64 ", want %" PRId64, what, i, info.shape[i], shape[i]);
    cr_expect_eq(info.count, test_shape_count(ndim, shape), "%s: count = %" PRId64, what, info.count);
}

static uint64_t allocated_bytes(gpuarr_device d) {
    gpuarr_pool_stats st;
    TEST_OK(gpuarr_pool_get_stats(d, &st));
    return st.allocated_bytes;
}

/* A device that is neither the test device nor the host, preferring one of the same backend
   (opencl:1 next to opencl:0, cuda:1 next to cuda:0); {0} when there is none. */
static gpuarr_device other_device(gpuarr_device dev, bool same_backend_only) {
    gpuarr_device_info di;
    TEST_OK(gpuarr_device_get_info(dev, &di));
    gpuarr_device best = {0};
    for (int i = 0; i < gpuarr_device_count(); i++) {
        gpuarr_device o = gpuarr_device_at(i);
        if (!o.id || o.id == dev.id || o.id == gpuarr_host().id) continue;
        gpuarr_device_info oi;
        TEST_OK(gpuarr_device_get_info(o, &oi));
        if (oi.backend == di.backend) return o;
        if (!best.id && !same_backend_only) best = o;
    }
    return best;
}

/* ---------------------------------------------------------------------------------------------
 * 1. Every dtype pair against the reference
 * ------------------------------------------------------------------------------------------- */
Test(mutable, copy_casts_every_dtype_pair_like_the_reference) {
    gpuarr_device dev = test_device();
    int64_t shape[1] = {N}, shape2[2] = {8, 8};
    int skipped = 0;
    for (int s = TEST_FIRST_DTYPE; s <= TEST_LAST_DTYPE; s++) {
        unsigned char in[N * 8];
        make_inputs((gpuarr_dtype)s, in);
        gpuarr_array src = {0};
        gpuarr_result r = gpuarr_from_host_as(dev, (gpuarr_dtype)s, in, 1, shape, &src);
        if (f64_unsupported(r, (gpuarr_dtype)s, 0)) { skipped++; continue; }
        cr_assert_eq(r, GPUARR_OK, "from_host_as %s: %s", test_dtype_str((gpuarr_dtype)s), gpuarr_last_error());
        for (int d = TEST_FIRST_DTYPE; d <= TEST_LAST_DTYPE; d++) {
            char what[64];
            snprintf(what, sizeof what, "gpuarr_copy %s -> %s", test_dtype_str((gpuarr_dtype)s), test_dtype_str((gpuarr_dtype)d));
            gpuarr_array dst = {0};
            r = gpuarr_empty(dev, (gpuarr_dtype)d, 2, shape2, &dst); /* another shape, same count */
            if (f64_unsupported(r, 0, (gpuarr_dtype)d)) { skipped++; continue; }
            cr_assert_eq(r, GPUARR_OK, "%s: empty: %s", what, gpuarr_last_error());
            r = gpuarr_copy(dst, src);
            if (f64_unsupported(r, (gpuarr_dtype)s, (gpuarr_dtype)d)) {
                skipped++;
            } else {
                cr_assert_eq(r, GPUARR_OK, "%s = %s: %s", what, gpuarr_result_name(r), gpuarr_last_error());
                unsigned char got[N * 8];
                raw_read(dst, (gpuarr_dtype)d, got, N);
                expect_reference((gpuarr_dtype)s, in, (gpuarr_dtype)d, got, N, what);
                gpuarr_array_info info;
                TEST_OK(gpuarr_array_get_info(dst, &info));
                cr_expect(info.dtype == (gpuarr_dtype)d && info.ndim == 2 && info.shape[0] == 8, "%s: dst's layout changed", what);
            }
            TEST_OK(gpuarr_release(dst));
        }
        test_expect_array_bytes(src, (gpuarr_dtype)s, in, N, "copy source after the copies");
        TEST_OK(gpuarr_release(src));
    }
    if (skipped) fprintf(stderr, "copy pairs: %d skipped as f64 unsupported on %s\n", skipped, test_device_spec());
}

Test(mutable, write_casts_every_dtype_pair_into_a_range) {
    gpuarr_device dev = test_device();
    enum { PAD = 3, TOTAL = N + 8 };
    int64_t shape[1] = {TOTAL};
    for (int d = TEST_FIRST_DTYPE; d <= TEST_LAST_DTYPE; d++) {
        unsigned char init[TOTAL * 8];
        memset(init, 0x5a, sizeof init);
        if (d == GPUARR_BOOL) memset(init, 1, sizeof init);
        for (int t = TEST_FIRST_DTYPE; t <= TEST_LAST_DTYPE; t++) {
            char what[64];
            snprintf(what, sizeof what, "gpuarr_write %s -> %s", test_dtype_str((gpuarr_dtype)t), test_dtype_str((gpuarr_dtype)d));
            gpuarr_array a = {0};
            gpuarr_result r = gpuarr_from_host_as(dev, (gpuarr_dtype)d, init, 1, shape, &a);
            if (f64_unsupported(r, 0, (gpuarr_dtype)d)) continue;
            cr_assert_eq(r, GPUARR_OK, "%s: from_host_as: %s", what, gpuarr_last_error());
            unsigned char in[N * 8], in_copy[N * 8];
            make_inputs((gpuarr_dtype)t, in);
            memcpy(in_copy, in, sizeof in);
            r = gpuarr_write(a, PAD, N, (gpuarr_dtype)t, in);
            if (!f64_unsupported(r, (gpuarr_dtype)t, (gpuarr_dtype)d)) {
                cr_assert_eq(r, GPUARR_OK, "%s = %s: %s", what, gpuarr_result_name(r), gpuarr_last_error());
                cr_assert(memcmp(in, in_copy, sizeof in) == 0, "%s changed the source host memory", what);
                unsigned char got[TOTAL * 8];
                raw_read(a, (gpuarr_dtype)d, got, TOTAL);
                size_t sz = test_dtype_bytes((gpuarr_dtype)d);
                cr_assert(memcmp(got, init, PAD * sz) == 0, "%s: elements before the range changed", what);
                cr_assert(memcmp(got + (PAD + N) * sz, init, (TOTAL - PAD - N) * sz) == 0, "%s: elements after the range changed", what);
                expect_reference((gpuarr_dtype)t, in, (gpuarr_dtype)d, got + PAD * sz, N, what);
            }
            TEST_OK(gpuarr_release(a));
        }
    }
}

Test(mutable, read_casts_every_dtype_pair_from_a_range) {
    gpuarr_device dev = test_device();
    enum { PAD = 5, TOTAL = N + 8 };
    int64_t shape[1] = {TOTAL};
    for (int s = TEST_FIRST_DTYPE; s <= TEST_LAST_DTYPE; s++) {
        unsigned char all[TOTAL * 8];
        size_t ssz = test_dtype_bytes((gpuarr_dtype)s);
        memset(all, 0, sizeof all);
        make_inputs((gpuarr_dtype)s, all + PAD * ssz);
        gpuarr_array a = {0};
        gpuarr_result r = gpuarr_from_host_as(dev, (gpuarr_dtype)s, all, 1, shape, &a);
        if (f64_unsupported(r, (gpuarr_dtype)s, 0)) continue;
        cr_assert_eq(r, GPUARR_OK, "from_host_as %s: %s", test_dtype_str((gpuarr_dtype)s), gpuarr_last_error());
        for (int t = TEST_FIRST_DTYPE; t <= TEST_LAST_DTYPE; t++) {
            char what[64];
            snprintf(what, sizeof what, "gpuarr_read %s -> %s", test_dtype_str((gpuarr_dtype)s), test_dtype_str((gpuarr_dtype)t));
            size_t tsz = test_dtype_bytes((gpuarr_dtype)t);
            unsigned char out[(N + 2) * 8];
            memset(out, 0xcd, sizeof out);
            r = gpuarr_read(a, PAD, N, (gpuarr_dtype)t, out);
            if (f64_unsupported(r, (gpuarr_dtype)s, (gpuarr_dtype)t)) continue;
            cr_assert_eq(r, GPUARR_OK, "%s = %s: %s", what, gpuarr_result_name(r), gpuarr_last_error());
            expect_reference((gpuarr_dtype)s, all + PAD * ssz, (gpuarr_dtype)t, out, N, what);
            for (size_t i = N * tsz; i < sizeof out; i++)
                cr_assert_eq(out[i], 0xcd, "%s wrote past its %d elements (byte %zu)", what, N, i);
        }
        test_expect_array_bytes(a, (gpuarr_dtype)s, all, TOTAL, "read source after the reads");
        TEST_OK(gpuarr_release(a));
    }
}

Test(mutable, fill_casts_every_dtype_pair_like_the_reference) {
    gpuarr_device dev = test_device();
    enum { M = 7 };
    static const size_t picks[] = {1, 3, 9, 28, 31}; /* -1 / -0.0, -2 / 0.5, ..., 1/3, NaN */
    int64_t shape[2] = {M, 1};
    for (int d = TEST_FIRST_DTYPE; d <= TEST_LAST_DTYPE; d++) {
        gpuarr_array a = {0};
        gpuarr_result r = gpuarr_empty(dev, (gpuarr_dtype)d, 2, shape, &a);
        if (f64_unsupported(r, 0, (gpuarr_dtype)d)) continue;
        cr_assert_eq(r, GPUARR_OK, "empty %s: %s", test_dtype_str((gpuarr_dtype)d), gpuarr_last_error());
        for (int t = TEST_FIRST_DTYPE; t <= TEST_LAST_DTYPE; t++) {
            unsigned char in[N * 8];
            make_inputs((gpuarr_dtype)t, in);
            size_t tsz = test_dtype_bytes((gpuarr_dtype)t);
            for (size_t p = 0; p < sizeof picks / sizeof picks[0]; p++) {
                char what[80];
                snprintf(what, sizeof what, "gpuarr_fill_as %s -> %s, value #%zu", test_dtype_str((gpuarr_dtype)t),
                         test_dtype_str((gpuarr_dtype)d), picks[p]);
                uint64_t value_store[1]; /* aligned for every dtype */
                memcpy(value_store, in + picks[p] * tsz, tsz);
                r = gpuarr_fill_as(a, (gpuarr_dtype)t, value_store);
                if (f64_unsupported(r, (gpuarr_dtype)t, (gpuarr_dtype)d)) continue;
                cr_assert_eq(r, GPUARR_OK, "%s = %s: %s", what, gpuarr_result_name(r), gpuarr_last_error());
                unsigned char got[M * 8], want_in[M * 8];
                for (size_t i = 0; i < M; i++) memcpy(want_in + i * tsz, value_store, tsz);
                raw_read(a, (gpuarr_dtype)d, got, M);
                expect_reference((gpuarr_dtype)t, want_in, (gpuarr_dtype)d, got, M, what);
            }
        }
        TEST_OK(gpuarr_release(a));
    }
}

/* ---------------------------------------------------------------------------------------------
 * 2. Across devices
 * ------------------------------------------------------------------------------------------- */
static void copy_between(gpuarr_device from, gpuarr_device to, gpuarr_dtype s, gpuarr_dtype d, const char *what) {
    unsigned char in[N * 8], got[N * 8];
    make_inputs(s, in);
    int64_t shape[1] = {N}, shape2[2] = {4, 16};
    gpuarr_array src = {0}, dst = {0};
    TEST_OK(gpuarr_from_host_as(from, s, in, 1, shape, &src));
    TEST_OK(gpuarr_zeros(to, d, 2, shape2, &dst));
    gpuarr_result r = gpuarr_copy(dst, src);
    cr_assert_eq(r, GPUARR_OK, "%s: gpuarr_copy = %s: %s", what, gpuarr_result_name(r), gpuarr_last_error());
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(dst, &info));
    cr_expect_eq(info.device.id, to.id, "%s: dst moved to another device", what);
    raw_read(dst, d, got, N);
    expect_reference(s, in, d, got, N, what);
    /* and asynchronously, on a stream of the destination */
    gpuarr_stream st;
    TEST_OK(gpuarr_fill_as(dst, GPUARR_U8, &(uint8_t){0}));
    TEST_OK(gpuarr_stream_create(to, 0, &st));
    r = gpuarr_copy_async(dst, src, st);
    cr_assert_eq(r, GPUARR_OK, "%s: gpuarr_copy_async = %s: %s", what, gpuarr_result_name(r), gpuarr_last_error());
    TEST_OK(gpuarr_stream_sync(st));
    raw_read(dst, d, got, N);
    expect_reference(s, in, d, got, N, what);
    TEST_OK(gpuarr_stream_destroy(st));
    /* and on a stream of the source's device */
    TEST_OK(gpuarr_fill_as(dst, GPUARR_U8, &(uint8_t){0}));
    TEST_OK(gpuarr_stream_create(from, 0, &st));
    r = gpuarr_copy_async(dst, src, st);
    cr_assert_eq(r, GPUARR_OK, "%s: gpuarr_copy_async on the source's stream = %s: %s", what, gpuarr_result_name(r), gpuarr_last_error());
    TEST_OK(gpuarr_array_sync(dst));
    raw_read(dst, d, got, N);
    expect_reference(s, in, d, got, N, what);
    TEST_OK(gpuarr_stream_destroy(st));
    TEST_OK(gpuarr_release(src));
    TEST_OK(gpuarr_release(dst));
}

Test(mutable, copy_with_a_cast_between_the_host_and_the_test_device) {
    gpuarr_device dev = test_device(), host = gpuarr_host();
    copy_between(host, dev, GPUARR_I16, GPUARR_F32, "host i16 -> device f32");
    copy_between(dev, host, GPUARR_F32, GPUARR_BF16, "device f32 -> host bf16");
    copy_between(dev, host, GPUARR_U8, GPUARR_I64, "device u8 -> host i64");
    copy_between(host, dev, GPUARR_I64, GPUARR_F16, "host i64 -> device f16");
}

Test(mutable, copy_into_wrapped_host_memory) {
    gpuarr_device dev = test_device();
    unsigned char in[N * 4];
    make_inputs(GPUARR_F32, in);
    int64_t shape[1] = {N};
    int32_t *mem = calloc(N + 1, sizeof *mem);
    cr_assert_not_null(mem);
    mem[N] = 0x1234567;
    gpuarr_array src = {0}, w = {0};
    TEST_OK(gpuarr_from_host_as(dev, GPUARR_F32, in, 1, shape, &src));
    TEST_OK(gpuarr_wrap_host(mem, GPUARR_I32, 1, shape, NULL, NULL, &w));
    TEST_OK(gpuarr_copy(w, src));
    expect_reference(GPUARR_F32, in, GPUARR_I32, mem, N, "device f32 -> wrapped host i32");
    cr_expect_eq(mem[N], 0x1234567, "the copy wrote past the wrapped memory");
    TEST_OK(gpuarr_release(w));
    TEST_OK(gpuarr_release(src));
    free(mem);
}

Test(mutable, copy_with_a_cast_to_a_second_device) {
    gpuarr_device dev = test_device();
    gpuarr_device other = other_device(dev, false);
    if (!other.id) test_skip("no device besides %s and the host", test_device_spec());
    gpuarr_device_info oi;
    TEST_OK(gpuarr_device_get_info(other, &oi));
    char what[96];
    snprintf(what, sizeof what, "%s u16 -> %s f32", test_device_spec(), oi.spec);
    copy_between(dev, other, GPUARR_U16, GPUARR_F32, what);
    snprintf(what, sizeof what, "%s f32 -> %s i8", oi.spec, test_device_spec());
    copy_between(other, dev, GPUARR_F32, GPUARR_I8, what);
    snprintf(what, sizeof what, "%s bf16 -> %s f16", test_device_spec(), oi.spec);
    copy_between(dev, other, GPUARR_BF16, GPUARR_F16, what);
}

/* ---------------------------------------------------------------------------------------------
 * 3. Views
 * ------------------------------------------------------------------------------------------- */
Test(mutable, views_of_views_see_the_right_elements_and_report_offsets) {
    gpuarr_device dev = test_device();
    int64_t pshape[2] = {6, 4};
    gpuarr_array p = make_i32(dev, 2, pshape, 0), s = {0}, rs = {0}, srs = {0}, r0 = {0}, sr0 = {0};
    expect_info_view(p, false, 0, 2, pshape, "parent");
    TEST_OK(gpuarr_slice(p, 1, 5, &s));
    int64_t sshape[2] = {4, 4};
    expect_info_view(s, true, 16, 2, sshape, "slice(p, 1, 5)");
    int32_t want[24];
    for (int i = 0; i < 16; i++) want[i] = 4 + i;
    expect_i32_values(s, want, 16, "slice(p, 1, 5)");
    int64_t rshape[2] = {2, 8};
    TEST_OK(gpuarr_reshape(s, 2, rshape, &rs));
    expect_info_view(rs, true, 16, 2, rshape, "reshape(slice)");
    expect_i32_values(rs, want, 16, "reshape(slice)");
    TEST_OK(gpuarr_slice(rs, 1, 2, &srs));
    int64_t srshape[2] = {1, 8};
    expect_info_view(srs, true, 48, 2, srshape, "slice(reshape(slice), 1, 2)");
    for (int i = 0; i < 8; i++) want[i] = 12 + i;
    expect_i32_values(srs, want, 8, "slice(reshape(slice), 1, 2)");
    int64_t flat[1] = {24};
    TEST_OK(gpuarr_reshape(p, 1, flat, &r0));
    expect_info_view(r0, true, 0, 1, flat, "reshape(p, 24)");
    TEST_OK(gpuarr_slice(r0, 5, 9, &sr0));
    int64_t s4[1] = {4};
    expect_info_view(sr0, true, 20, 1, s4, "slice(reshape(p), 5, 9)");
    for (int i = 0; i < 4; i++) want[i] = 5 + i;
    expect_i32_values(sr0, want, 4, "slice(reshape(p), 5, 9)");
    /* an empty slice and the full slice */
    gpuarr_array e = {0}, full = {0};
    TEST_OK(gpuarr_slice(p, 6, 6, &e));
    int64_t eshape[2] = {0, 4};
    expect_info_view(e, true, 96, 2, eshape, "slice(p, 6, 6)");
    TEST_OK(gpuarr_slice(p, 0, 6, &full));
    expect_info_view(full, true, 0, 2, pshape, "slice(p, 0, 6)");
    gpuarr_array v[] = {p, s, rs, srs, r0, sr0, e, full};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) TEST_OK(gpuarr_release(v[i]));
}

Test(mutable, write_into_a_slice_changes_only_those_rows_of_the_parent) {
    gpuarr_device dev = test_device();
    int64_t pshape[2] = {6, 4};
    gpuarr_array p = make_i32(dev, 2, pshape, 1000), s = {0}, v = {0};
    TEST_OK(gpuarr_slice(p, 2, 4, &s)); /* elements 8..15 */
    int32_t in[5] = {-1, -2, -3, -4, -5};
    TEST_OK(gpuarr_write(s, 2, 5, GPUARR_I32, in)); /* parent elements 10..14 */
    int32_t want[24];
    for (int i = 0; i < 24; i++) want[i] = 1000 + i;
    for (int i = 0; i < 5; i++) want[10 + i] = in[i];
    expect_i32_values(p, want, 24, "parent after gpuarr_write into slice(p, 2, 4)");
    /* a cast write through a reshaped view of a slice */
    int64_t flat[1] = {8};
    TEST_OK(gpuarr_reshape(s, 1, flat, &v));
    float fv[2] = {7.9f, -8.9f};
    TEST_OK(gpuarr_write(v, 6, 2, GPUARR_F32, fv)); /* truncated toward zero */
    want[14] = 7;
    want[15] = -8;
    expect_i32_values(p, want, 24, "parent after a cast gpuarr_write into reshape(slice)");
    /* a read through the view */
    int16_t r16[3];
    TEST_OK(gpuarr_read(v, 1, 3, GPUARR_I16, r16));
    cr_expect(r16[0] == 1009 && r16[1] == -1 && r16[2] == -2, "read through the view: %d %d %d", r16[0], r16[1], r16[2]);
    /* gpuarr_copy into a slice */
    gpuarr_array src = {0}, s2 = {0};
    int64_t sshape[2] = {1, 4};
    src = make_i32(dev, 2, sshape, -500);
    TEST_OK(gpuarr_slice(p, 5, 6, &s2));
    TEST_OK(gpuarr_copy(s2, src));
    for (int i = 0; i < 4; i++) want[20 + i] = -500 + i;
    expect_i32_values(p, want, 24, "parent after gpuarr_copy into slice(p, 5, 6)");
    TEST_OK(gpuarr_release(src));
    TEST_OK(gpuarr_release(s2));
    TEST_OK(gpuarr_release(v));
    TEST_OK(gpuarr_release(s));
    TEST_OK(gpuarr_release(p));
}

Test(mutable, a_view_keeps_the_memory_after_its_parent_is_released) {
    gpuarr_device dev = test_device();
    uint64_t start = allocated_bytes(dev);
    int64_t pshape[2] = {64, 16};
    gpuarr_array p = make_i32(dev, 2, pshape, 0), s = {0}, r = {0};
    TEST_OK(gpuarr_slice(p, 10, 12, &s));
    int64_t rshape[1] = {32};
    TEST_OK(gpuarr_reshape(s, 1, rshape, &r));
    uint64_t with_all = allocated_bytes(dev);
    cr_assert_gt(with_all, start, "allocated_bytes did not grow with a 4 KiB array");
    TEST_OK(gpuarr_release(p));
    cr_expect_eq(allocated_bytes(dev), with_all, "the parent's memory was freed while views of it live");
    /* a view of a view whose parent handle is gone */
    gpuarr_array ss = {0};
    TEST_OK(gpuarr_slice(s, 1, 2, &ss));
    expect_info_view(ss, true, 10 * 64 + 64, 2, (int64_t[]){1, 16}, "slice(slice) after the parent was released");
    /* new arrays made now must not take the memory the views still use */
    gpuarr_array junk = make_i32(dev, 2, pshape, 77777);
    int32_t want[32];
    for (int i = 0; i < 32; i++) want[i] = 160 + i;
    expect_i32_values(r, want, 32, "reshape(slice) after the parent was released");
    expect_i32_values(s, want, 32, "slice after the parent was released");
    expect_i32_values(ss, want + 16, 16, "slice(slice) after the parent was released");
    TEST_OK(gpuarr_release(ss));
    /* the views still share: a write through one is seen by the other */
    TEST_OK(gpuarr_write(s, 31, 1, GPUARR_I32, &(int32_t){-9}));
    want[31] = -9;
    expect_i32_values(r, want, 32, "reshape(slice) after a write through the slice");
    TEST_OK(gpuarr_release(junk));
    TEST_OK(gpuarr_release(s));
    cr_expect_eq(allocated_bytes(dev), with_all, "the memory was freed while one view lives");
    expect_i32_values(r, want, 32, "the last view");
    TEST_OK(gpuarr_release(r));
    cr_expect_eq(allocated_bytes(dev), start, "allocated_bytes after releasing parent first, then views: %" PRIu64 ", start %" PRIu64,
                 allocated_bytes(dev), start);
}

Test(mutable, stats_balance_when_views_go_before_the_parent) {
    gpuarr_device dev = test_device();
    uint64_t start = allocated_bytes(dev);
    int64_t pshape[2] = {32, 8};
    gpuarr_array p = make_i32(dev, 2, pshape, 0), v[4];
    TEST_OK(gpuarr_slice(p, 0, 16, &v[0]));
    int64_t r[3] = {16, 4, 2};
    TEST_OK(gpuarr_reshape(v[0], 3, r, &v[1]));
    TEST_OK(gpuarr_slice(v[1], 3, 5, &v[2]));
    TEST_OK(gpuarr_reshape(p, 1, (int64_t[]){256}, &v[3]));
    uint64_t with_all = allocated_bytes(dev);
    for (int i = 0; i < 4; i++) TEST_OK(gpuarr_release(v[i]));
    cr_expect_eq(allocated_bytes(dev), with_all, "releasing the views changed allocated_bytes (views own no memory)");
    TEST_OK(gpuarr_release(p));
    cr_expect_eq(allocated_bytes(dev), start, "allocated_bytes after views, then parent: %" PRIu64 ", start %" PRIu64,
                 allocated_bytes(dev), start);
}

/* ---------------------------------------------------------------------------------------------
 * 4. Fill
 * ------------------------------------------------------------------------------------------- */
Test(mutable, fill_rounds_one_third_into_f16_and_bf16_like_the_reference) {
    gpuarr_device dev = test_device();
    int64_t shape[1] = {9};
    double third = 1.0 / 3.0;
    float third_f = 1.0f / 3.0f;
    static const gpuarr_dtype ts[] = {GPUARR_F16, GPUARR_BF16};
    for (size_t k = 0; k < 2; k++) {
        gpuarr_dtype t = ts[k];
        gpuarr_array a = {0};
        TEST_OK(gpuarr_empty(dev, t, 1, shape, &a));
        uint16_t got[9];
        gpuarr_result r = gpuarr_fill(a, third); /* double */
        if (!f64_unsupported(r, GPUARR_F64, t)) {
            cr_assert_eq(r, GPUARR_OK, "gpuarr_fill(%s, 1/3 as double) = %s: %s", test_dtype_str(t), gpuarr_result_name(r), gpuarr_last_error());
            raw_read(a, t, got, 9);
            uint64_t want = ref_cast_bits(GPUARR_F64, test_f64_bits(third), t);
            cr_assert_eq(want, t == GPUARR_F16 ? 0x3555u : 0x3eabu, "the reference itself rounds 1/3 unexpectedly");
            for (int i = 0; i < 9; i++)
                cr_assert_eq(got[i], want, "fill %s with 1/3 (double): element %d = 0x%04x, want 0x%04" PRIx64, test_dtype_str(t), i, got[i], want);
        }
        TEST_OK(gpuarr_fill(a, third_f)); /* float */
        raw_read(a, t, got, 9);
        uint64_t want = ref_cast_bits(GPUARR_F32, test_f32_bits(third_f), t);
        for (int i = 0; i < 9; i++)
            cr_assert_eq(got[i], want, "fill %s with 1/3 (float): element %d = 0x%04x, want 0x%04" PRIx64, test_dtype_str(t), i, got[i], want);
        /* 65519 in f16 rounds down to 65504, 65520 overflows to infinity */
        TEST_OK(gpuarr_fill(a, 65520.0f));
        raw_read(a, t, got, 9);
        want = ref_cast_bits(GPUARR_F32, test_f32_bits(65520.0f), t);
        for (int i = 0; i < 9; i++)
            cr_assert_eq(got[i], want, "fill %s with 65520.0f: element %d = 0x%04x, want 0x%04" PRIx64, test_dtype_str(t), i, got[i], want);
        TEST_OK(gpuarr_release(a));
    }
}

Test(mutable, typed_fill_picks_the_dtype_from_the_c_type) {
    gpuarr_device dev = test_device();
    int64_t shape[1] = {5};
    gpuarr_array u8 = {0}, i32 = {0}, f32 = {0};
    TEST_OK(gpuarr_empty(dev, GPUARR_U8, 1, shape, &u8));
    TEST_OK(gpuarr_empty(dev, GPUARR_I32, 1, shape, &i32));
    TEST_OK(gpuarr_empty(dev, GPUARR_F32, 1, shape, &f32));
    uint8_t b[5];
    int32_t i[5];
    float f[5];
    TEST_OK(gpuarr_fill(u8, -7)); /* int: wraps to 249 */
    raw_read(u8, GPUARR_U8, b, 5);
    for (int k = 0; k < 5; k++) cr_expect_eq(b[k], 249, "u8 filled with (int)-7: %d", b[k]);
    TEST_OK(gpuarr_fill(i32, -2.75f)); /* float: truncates to -2 */
    raw_read(i32, GPUARR_I32, i, 5);
    for (int k = 0; k < 5; k++) cr_expect_eq(i[k], -2, "i32 filled with -2.75f: %d", i[k]);
    TEST_OK(gpuarr_fill(i32, 1e20)); /* double: saturates */
    raw_read(i32, GPUARR_I32, i, 5);
    for (int k = 0; k < 5; k++) cr_expect_eq(i[k], INT32_MAX, "i32 filled with 1e20: %d", i[k]);
    TEST_OK(gpuarr_fill(f32, (gpuarr_f16){0x3c01})); /* f16 1.0009765625 */
    raw_read(f32, GPUARR_F32, f, 5);
    for (int k = 0; k < 5; k++) cr_expect_eq(f[k], 1.0009765625f, "f32 filled with f16 0x3c01: %a", (double)f[k]);
    TEST_OK(gpuarr_fill(f32, (gpuarr_bf16){0xc0a0})); /* bf16 -5 */
    raw_read(f32, GPUARR_F32, f, 5);
    for (int k = 0; k < 5; k++) cr_expect_eq(f[k], -5.0f, "f32 filled with bf16 0xc0a0: %a", (double)f[k]);
    TEST_OK(gpuarr_fill(u8, true));
    raw_read(u8, GPUARR_U8, b, 5);
    for (int k = 0; k < 5; k++) cr_expect_eq(b[k], 1, "u8 filled with true: %d", b[k]);
    TEST_OK(gpuarr_release(u8));
    TEST_OK(gpuarr_release(i32));
    TEST_OK(gpuarr_release(f32));
}

Test(mutable, fill_of_a_slice_leaves_the_other_rows_unchanged) {
    gpuarr_device dev = test_device();
    int64_t pshape[2] = {5, 3};
    gpuarr_array p = make_i32(dev, 2, pshape, 10), s = {0}, e = {0};
    TEST_OK(gpuarr_slice(p, 1, 3, &s));
    TEST_OK(gpuarr_fill(s, (int)0x01020304)); /* a pattern whose bytes differ */
    int32_t want[15];
    for (int i = 0; i < 15; i++) want[i] = 10 + i;
    for (int i = 3; i < 9; i++) want[i] = 0x01020304;
    expect_i32_values(p, want, 15, "parent after filling slice(p, 1, 3)");
    TEST_OK(gpuarr_slice(p, 4, 5, &e));
    TEST_OK(gpuarr_fill(e, 0)); /* zero: a one-byte pattern */
    for (int i = 12; i < 15; i++) want[i] = 0;
    expect_i32_values(p, want, 15, "parent after filling slice(p, 4, 5) with 0");
    TEST_OK(gpuarr_release(e));
    gpuarr_array none = {0};
    TEST_OK(gpuarr_slice(p, 2, 2, &none)); /* an empty slice: nothing to fill */
    TEST_OK(gpuarr_fill(none, 99));
    expect_i32_values(p, want, 15, "parent after filling an empty slice");
    TEST_OK(gpuarr_release(none));
    TEST_OK(gpuarr_release(s));
    TEST_OK(gpuarr_release(p));
}

Test(mutable, fill_as_with_dtype_0_takes_the_value_as_the_arrays_dtype) {
    gpuarr_device dev = test_device();
    int64_t shape[1] = {4};
    gpuarr_array f = {0}, h = {0};
    TEST_OK(gpuarr_empty(dev, GPUARR_F32, 1, shape, &f));
    TEST_OK(gpuarr_empty(dev, GPUARR_I16, 1, shape, &h));
    float v = 2.5f;
    TEST_OK(gpuarr_fill_as(f, GPUARR_DTYPE_INVALID, &v));
    float got[4];
    raw_read(f, GPUARR_F32, got, 4);
    for (int i = 0; i < 4; i++) cr_expect_eq(got[i], 2.5f, "f32 fill_as(t = 0, 2.5f): %a", (double)got[i]);
    int16_t hv = -2, hg[4];
    TEST_OK(gpuarr_fill_as(h, 0, &hv));
    raw_read(h, GPUARR_I16, hg, 4);
    for (int i = 0; i < 4; i++) cr_expect_eq(hg[i], -2, "i16 fill_as(t = 0, -2): %d", hg[i]);
    TEST_OK(gpuarr_release(f));
    TEST_OK(gpuarr_release(h));
}

/* ---------------------------------------------------------------------------------------------
 * 5. Async ordering across streams
 * ------------------------------------------------------------------------------------------- */
typedef unsigned long long (*ops_run_fn)(void);

/* The fake driver's count of operations run by this thread, or NULL on any other device. */
static ops_run_fn fake_ops_counter(gpuarr_device dev) {
    gpuarr_device_info di;
    TEST_OK(gpuarr_device_get_info(dev, &di));
    if (di.backend != GPUARR_BACKEND_CUDA) return NULL;
    const char *lib = getenv("GPUARR_CUDA_LIBRARY");
    void *driver = dlopen(lib ? lib : "libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    ops_run_fn fn = NULL;
    if (driver) *(void **)&fn = dlsym(driver, "fake_cuda_ops_run");
    if (!fn && lib && strstr(lib, "fake-cuda"))
        cr_assert_fail("GPUARR_CUDA_LIBRARY=%s is the fake driver, but fake_cuda_ops_run was not found", lib);
    return fn;
}

Test(mutable, write_copy_read_on_three_streams_are_ordered_without_waiting) {
    gpuarr_device dev = test_device();
    ops_run_fn ops_run = fake_ops_counter(dev);
    enum { M = 4096 };
    int64_t shape[1] = {M}, shape2[2] = {64, 64};
    int16_t *in = malloc(M * sizeof *in);
    int64_t *out = malloc(M * sizeof *out);
    cr_assert(in && out);
    for (int i = 0; i < M; i++) in[i] = (int16_t)(i * 37 - 30000);
    for (int i = 0; i < M; i++) out[i] = -1;
    gpuarr_array x = {0}, y = {0};
    TEST_OK(gpuarr_zeros(dev, GPUARR_F32, 1, shape, &x));
    TEST_OK(gpuarr_zeros(dev, GPUARR_I32, 2, shape2, &y));
    TEST_OK(gpuarr_device_sync(dev));
    gpuarr_stream a, b, c;
    TEST_OK(gpuarr_stream_create(dev, 0, &a));
    TEST_OK(gpuarr_stream_create(dev, 0, &b));
    TEST_OK(gpuarr_stream_create(dev, 0, &c));
    unsigned long long before = ops_run ? ops_run() : 0;
    TEST_OK(gpuarr_write_async(x, 0, M, GPUARR_I16, in, a)); /* i16 -> f32 */
    TEST_OK(gpuarr_copy_async(y, x, b));                     /* f32 -> i32, waits for a by itself */
    TEST_OK(gpuarr_read_async(y, 0, M, GPUARR_I64, out, c)); /* i32 -> i64, waits for b by itself */
    if (ops_run) {
        unsigned long long after = ops_run();
        cr_expect_eq(after, before, "%llu operations ran inside write_async / copy_async / read_async (one of them waited)", after - before);
        bool done = true;
        TEST_OK(gpuarr_stream_query(c, &done));
        cr_expect(!done, "stream C reports its read done before anything was waited for");
    }
    TEST_OK(gpuarr_stream_sync(c));
    for (int i = 0; i < M; i++)
        cr_assert_eq(out[i], (int64_t)in[i], "element %d after write(A) -> copy(B) -> read(C): %" PRId64 ", want %d", i, out[i], in[i]);
    TEST_OK(gpuarr_stream_destroy(a));
    TEST_OK(gpuarr_stream_destroy(b));
    TEST_OK(gpuarr_stream_destroy(c));
    TEST_OK(gpuarr_release(x));
    TEST_OK(gpuarr_release(y));
    free(in);
    free(out);
}

Test(mutable, an_async_write_after_an_async_read_does_not_overtake_it) {
    gpuarr_device dev = test_device();
    enum { M = 2048 };
    int64_t shape[1] = {M};
    int32_t *first = malloc(M * 4), *second = malloc(M * 4), *out = malloc(M * 4);
    cr_assert(first && second && out);
    for (int i = 0; i < M; i++) {
        first[i] = i;
        second[i] = -i - 1;
        out[i] = 0;
    }
    gpuarr_array x = {0};
    TEST_OK(gpuarr_from_host_as(dev, GPUARR_I32, first, 1, shape, &x));
    gpuarr_stream a, b;
    TEST_OK(gpuarr_stream_create(dev, 0, &a));
    TEST_OK(gpuarr_stream_create(dev, 0, &b));
    TEST_OK(gpuarr_read_async(x, 0, M, GPUARR_I32, out, a));
    TEST_OK(gpuarr_write_async(x, 0, M, GPUARR_I32, second, b)); /* must wait for the read on a */
    TEST_OK(gpuarr_stream_sync(b));
    TEST_OK(gpuarr_stream_sync(a));
    for (int i = 0; i < M; i++) cr_assert_eq(out[i], i, "the read on A saw element %d = %d: the write on B overtook it", i, out[i]);
    int32_t got[M];
    raw_read(x, GPUARR_I32, got, M);
    cr_assert(memcmp(got, second, sizeof got) == 0, "the write on B did not land");
    TEST_OK(gpuarr_stream_destroy(a));
    TEST_OK(gpuarr_stream_destroy(b));
    TEST_OK(gpuarr_release(x));
    free(first);
    free(second);
    free(out);
}

/* The same between device arrays only (no staging through the pinned pool, which can order
   streams by itself): a copy out of x on A, then a copy into x on B; B is synced first. */
Test(mutable, an_async_copy_into_an_array_waits_for_an_earlier_copy_out_of_it_on_another_stream) {
    gpuarr_device dev = test_device();
    enum { M = 2048 };
    int64_t shape[1] = {M};
    gpuarr_array x = make_i32(dev, 1, shape, 0), z = make_i32(dev, 1, shape, -100000), y = {0}, w = {0};
    TEST_OK(gpuarr_zeros(dev, GPUARR_I64, 1, shape, &y));
    TEST_OK(gpuarr_zeros(dev, GPUARR_I32, 1, shape, &w));
    TEST_OK(gpuarr_device_sync(dev));
    gpuarr_stream a, b;
    TEST_OK(gpuarr_stream_create(dev, 0, &a));
    TEST_OK(gpuarr_stream_create(dev, 0, &b));
    TEST_OK(gpuarr_copy_async(y, x, a)); /* reads x (i32 -> i64) */
    TEST_OK(gpuarr_copy_async(x, z, b)); /* writes x: must wait for the read on a */
    TEST_OK(gpuarr_copy_async(w, x, a)); /* reads x again on a: must see z's values */
    TEST_OK(gpuarr_stream_sync(b));
    TEST_OK(gpuarr_stream_sync(a));
    int64_t got[M];
    int32_t got2[M];
    raw_read(y, GPUARR_I64, got, M);
    for (int i = 0; i < M; i++) cr_assert_eq(got[i], i, "the copy out of x on A saw element %d = %" PRId64 ": the copy into x on B overtook it", i, got[i]);
    raw_read(w, GPUARR_I32, got2, M);
    for (int i = 0; i < M; i++) cr_assert_eq(got2[i], -100000 + i, "the second copy out of x on A: element %d = %d", i, got2[i]);
    TEST_OK(gpuarr_stream_destroy(a));
    TEST_OK(gpuarr_stream_destroy(b));
    gpuarr_array v[] = {x, y, z, w};
    for (size_t i = 0; i < 4; i++) TEST_OK(gpuarr_release(v[i]));
}

/* ---------------------------------------------------------------------------------------------
 * 6. Overlap
 * ------------------------------------------------------------------------------------------- */
Test(mutable, copy_between_overlapping_slices_is_refused_and_the_same_elements_are_a_no_op) {
    gpuarr_device dev = test_device();
    int64_t shape[1] = {8};
    gpuarr_array p = make_i32(dev, 1, shape, 100), lo = {0}, hi = {0}, lo2 = {0}, lor = {0}, tail = {0}, lo8 = {0};
    TEST_OK(gpuarr_slice(p, 0, 4, &lo));
    TEST_OK(gpuarr_slice(p, 2, 6, &hi));
    int32_t want[8];
    for (int i = 0; i < 8; i++) want[i] = 100 + i;
    TEST_FAIL_WITH(gpuarr_copy(lo, hi), GPUARR_ERROR_INVALID_ARGUMENT, "share memory");
    expect_i32_values(p, want, 8, "after a refused overlapping copy");
    TEST_FAIL_WITH(gpuarr_copy(hi, lo), GPUARR_ERROR_INVALID_ARGUMENT, "share memory");
    TEST_FAIL_WITH(gpuarr_copy_async(hi, lo, (gpuarr_stream){0}), GPUARR_ERROR_INVALID_ARGUMENT, "share memory");
    expect_i32_values(p, want, 8, "after refused overlapping copies");
    /* a view onto the very same elements: nothing to do */
    TEST_OK(gpuarr_copy(lo, lo));
    TEST_OK(gpuarr_slice(p, 0, 4, &lo2));
    TEST_OK(gpuarr_copy(lo2, lo));
    TEST_OK(gpuarr_reshape(lo, 2, (int64_t[]){2, 2}, &lor));
    TEST_OK(gpuarr_copy(lor, lo2));
    TEST_OK(gpuarr_copy_async(lo, lor, (gpuarr_stream){0}));
    TEST_OK(gpuarr_device_sync(dev));
    expect_i32_values(p, want, 8, "after copies of the same elements");
    /* the parent and its view of all of it overlap but are the same elements too */
    TEST_OK(gpuarr_slice(p, 0, 8, &lo8));
    TEST_OK(gpuarr_copy(p, lo8));
    /* disjoint slices of one array do copy */
    TEST_OK(gpuarr_slice(p, 4, 8, &tail));
    TEST_OK(gpuarr_copy(tail, lo));
    for (int i = 0; i < 4; i++) want[4 + i] = 100 + i;
    expect_i32_values(p, want, 8, "after copying slice [0, 4) onto [4, 8)");
    gpuarr_array v[] = {p, lo, hi, lo2, lor, tail, lo8};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) TEST_OK(gpuarr_release(v[i]));
}

/* ---------------------------------------------------------------------------------------------
 * 7. Bad inputs: the code, the message, and nothing of the caller's changed
 * ------------------------------------------------------------------------------------------- */
#define SENTINEL_ID 0xdeadbeefu

Test(mutable, reshape_and_slice_refuse_bad_shapes_and_rows) {
    gpuarr_device dev = test_device();
    int64_t shape[2] = {4, 3};
    gpuarr_array p = make_i32(dev, 2, shape, 0), out = {SENTINEL_ID}, scalar = {0};
    TEST_FAIL_WITH(gpuarr_reshape(p, 2, (int64_t[]){5, 3}, &out), GPUARR_ERROR_INVALID_ARGUMENT, "15 elements, a holds 12");
    cr_expect_eq(out.id, SENTINEL_ID, "reshape changed *out on failure");
    TEST_FAIL_WITH(gpuarr_slice(p, -1, 2, &out), GPUARR_ERROR_INVALID_ARGUMENT, "rows [-1, 2)");
    TEST_FAIL_WITH(gpuarr_slice(p, 3, 2, &out), GPUARR_ERROR_INVALID_ARGUMENT, "rows [3, 2)");
    TEST_FAIL_WITH(gpuarr_slice(p, 0, 5, &out), GPUARR_ERROR_INVALID_ARGUMENT, "rows [0, 5)");
    cr_expect_eq(out.id, SENTINEL_ID, "slice changed *out on failure");
    TEST_OK(gpuarr_from_host_as(dev, GPUARR_I32, &(int32_t){5}, 0, NULL, &scalar));
    TEST_FAIL_WITH(gpuarr_slice(scalar, 0, 0, &out), GPUARR_ERROR_INVALID_ARGUMENT, "scalar");
    cr_expect_eq(out.id, SENTINEL_ID, "slice of a scalar changed *out");
    TEST_FAIL_WITH(gpuarr_reshape(p, GPUARR_MAX_DIMS + 1, (int64_t[GPUARR_MAX_DIMS + 1]){12, 1, 1, 1, 1, 1, 1, 1, 1}, &out),
                GPUARR_ERROR_INVALID_ARGUMENT, "ndim");
    TEST_FAIL_WITH(gpuarr_reshape(p, 1, NULL, &out), GPUARR_ERROR_INVALID_ARGUMENT, "shape");
    TEST_FAIL_WITH(gpuarr_reshape(p, 2, (int64_t[]){-3, -4}, &out), GPUARR_ERROR_INVALID_ARGUMENT, "-3");
    cr_expect_eq(out.id, SENTINEL_ID, "a refused reshape changed *out");
    /* reshape of a scalar into [1] is fine, and the failures made no views */
    gpuarr_array one = {0};
    TEST_OK(gpuarr_reshape(scalar, 1, (int64_t[]){1}, &one));
    TEST_OK(gpuarr_release(one));
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(p, &info));
    cr_expect_eq(info.refcount, 1u, "failed views left references on p: %u", info.refcount);
    TEST_OK(gpuarr_release(scalar));
    TEST_OK(gpuarr_release(p));
}

Test(mutable, write_and_read_refuse_bad_ranges_pointers_and_dtypes) {
    gpuarr_device dev = test_device();
    int64_t shape[1] = {10};
    gpuarr_array a = make_i32(dev, 1, shape, 50);
    int32_t want[10];
    for (int i = 0; i < 10; i++) want[i] = 50 + i;
    int32_t buf[12], orig[12];
    for (int i = 0; i < 12; i++) buf[i] = orig[i] = 0x11111111 * (i % 7 + 1);
    /* write */
    TEST_FAIL_WITH(gpuarr_write(a, -1, 2, 0, buf), GPUARR_ERROR_INVALID_ARGUMENT, "first = -1");
    TEST_FAIL_WITH(gpuarr_write(a, 0, -1, 0, buf), GPUARR_ERROR_INVALID_ARGUMENT, "count = -1");
    TEST_FAIL_WITH(gpuarr_write(a, 8, 3, 0, buf), GPUARR_ERROR_INVALID_ARGUMENT, "[8, 11)");
    TEST_FAIL_WITH(gpuarr_write(a, 2, INT64_MAX, 0, buf), GPUARR_ERROR_OVERFLOW, "overflows");
    TEST_FAIL_WITH(gpuarr_write(a, 0, 1, 0, NULL), GPUARR_ERROR_INVALID_ARGUMENT, "NULL");
    TEST_FAIL_WITH(gpuarr_write(a, 0, 2, 0, (char *)buf + 1), GPUARR_ERROR_INVALID_ARGUMENT, "aligned");
    TEST_FAIL_WITH(gpuarr_write(a, 0, 2, (gpuarr_dtype)99, buf), GPUARR_ERROR_INVALID_ARGUMENT, "99");
    TEST_FAIL_WITH(gpuarr_write_async(a, 9, 2, 0, buf, (gpuarr_stream){0}), GPUARR_ERROR_INVALID_ARGUMENT, "[9, 11)");
    expect_i32_values(a, want, 10, "the array after refused writes");
    TEST_OK(gpuarr_write(a, 3, 0, 0, NULL)); /* NULL with count 0 */
    TEST_OK(gpuarr_write(a, 10, 0, 0, NULL)); /* an empty range at the end */
    /* read */
    TEST_FAIL_WITH(gpuarr_read(a, -1, 2, 0, buf), GPUARR_ERROR_INVALID_ARGUMENT, "first = -1");
    TEST_FAIL_WITH(gpuarr_read(a, 0, -3, 0, buf), GPUARR_ERROR_INVALID_ARGUMENT, "count = -3");
    TEST_FAIL_WITH(gpuarr_read(a, 0, 11, 0, buf), GPUARR_ERROR_INVALID_ARGUMENT, "[0, 11)");
    TEST_FAIL_WITH(gpuarr_read(a, INT64_MAX, 1, 0, buf), GPUARR_ERROR_OVERFLOW, "overflows");
    TEST_FAIL_WITH(gpuarr_read(a, 0, 1, 0, NULL), GPUARR_ERROR_INVALID_ARGUMENT, "NULL");
    TEST_FAIL_WITH(gpuarr_read(a, 0, 2, GPUARR_I16, (char *)buf + 1), GPUARR_ERROR_INVALID_ARGUMENT, "aligned");
    TEST_FAIL_WITH(gpuarr_read(a, 0, 2, (gpuarr_dtype)99, buf), GPUARR_ERROR_INVALID_ARGUMENT, "99");
    TEST_FAIL_WITH(gpuarr_read_async(a, 0, 11, 0, buf, (gpuarr_stream){0}), GPUARR_ERROR_INVALID_ARGUMENT, "[0, 11)");
    cr_expect(memcmp(buf, orig, sizeof buf) == 0, "a refused read changed the caller's buffer");
    TEST_OK(gpuarr_read(a, 0, 0, 0, NULL));
    cr_expect(memcmp(buf, orig, sizeof buf) == 0, "a read of 0 elements changed the caller's buffer");
    /* dtype 0 is a's dtype */
    TEST_OK(gpuarr_read(a, 1, 3, 0, buf));
    cr_expect(buf[0] == 51 && buf[1] == 52 && buf[2] == 53 && buf[3] == orig[3], "read(t = 0): %d %d %d %d", buf[0], buf[1], buf[2], buf[3]);
    TEST_OK(gpuarr_write(a, 0, 2, 0, (int32_t[]){-1, -2}));
    want[0] = -1;
    want[1] = -2;
    expect_i32_values(a, want, 10, "after write(t = 0)");
    TEST_OK(gpuarr_release(a));
}

Test(mutable, copy_and_fill_refuse_bad_counts_values_and_dtypes) {
    gpuarr_device dev = test_device();
    gpuarr_array a = make_i32(dev, 1, (int64_t[]){6}, 0), b = make_i32(dev, 2, (int64_t[]){2, 4}, 10);
    int32_t want_a[6] = {0, 1, 2, 3, 4, 5};
    TEST_FAIL_WITH(gpuarr_copy(a, b), GPUARR_ERROR_INVALID_ARGUMENT, "6 elements and src 8");
    TEST_FAIL_WITH(gpuarr_copy_async(a, b, (gpuarr_stream){0}), GPUARR_ERROR_INVALID_ARGUMENT, "same count");
    TEST_FAIL_WITH(gpuarr_fill_as(a, GPUARR_I32, NULL), GPUARR_ERROR_INVALID_ARGUMENT, "NULL");
    int32_t v = 9;
    TEST_FAIL_WITH(gpuarr_fill_as(a, (gpuarr_dtype)99, &v), GPUARR_ERROR_INVALID_ARGUMENT, "99");
    TEST_FAIL_WITH(gpuarr_fill_as(a, GPUARR_I32, (char *)&(int64_t[2]){0}[0] + 2), GPUARR_ERROR_INVALID_ARGUMENT, "aligned");
    expect_i32_values(a, want_a, 6, "a after refused copies and fills");
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
}

Test(mutable, released_handles_are_refused_by_every_call) {
    gpuarr_device dev = test_device();
    int64_t shape[1] = {4};
    gpuarr_array alive1 = make_i32(dev, 1, shape, 1), dead = make_i32(dev, 1, shape, 2);
    gpuarr_array alive2 = make_i32(dev, 1, shape, 3);
    TEST_OK(gpuarr_release(dead));
    gpuarr_array alive3 = make_i32(dev, 1, shape, 4); /* made after the release */
    int32_t buf[4] = {7, 7, 7, 7}, v = 5;
    gpuarr_array out = {SENTINEL_ID};
    bool ready = false;
    TEST_FAIL_WITH(gpuarr_copy(dead, alive1), GPUARR_ERROR_INVALID_HANDLE, "dst");
    TEST_FAIL_WITH(gpuarr_copy(alive1, dead), GPUARR_ERROR_INVALID_HANDLE, "src");
    TEST_FAIL_WITH(gpuarr_copy_async(alive2, dead, (gpuarr_stream){0}), GPUARR_ERROR_INVALID_HANDLE, "src");
    TEST_FAIL_WITH(gpuarr_write(dead, 0, 4, 0, buf), GPUARR_ERROR_INVALID_HANDLE, "a");
    TEST_FAIL_WITH(gpuarr_write_async(dead, 0, 4, 0, buf, (gpuarr_stream){0}), GPUARR_ERROR_INVALID_HANDLE, "a");
    TEST_FAIL_WITH(gpuarr_read(dead, 0, 4, 0, buf), GPUARR_ERROR_INVALID_HANDLE, "a");
    TEST_FAIL_WITH(gpuarr_read_async(dead, 0, 4, 0, buf, (gpuarr_stream){0}), GPUARR_ERROR_INVALID_HANDLE, "a");
    TEST_FAIL_WITH(gpuarr_fill_as(dead, GPUARR_I32, &v), GPUARR_ERROR_INVALID_HANDLE, "a");
    TEST_FAIL_WITH(gpuarr_fill(dead, 5), GPUARR_ERROR_INVALID_HANDLE, "gpuarr_fill");
    TEST_FAIL_WITH(gpuarr_reshape(dead, 1, shape, &out), GPUARR_ERROR_INVALID_HANDLE, "a");
    TEST_FAIL_WITH(gpuarr_slice(dead, 0, 1, &out), GPUARR_ERROR_INVALID_HANDLE, "a");
    TEST_FAIL_WITH(gpuarr_array_query(dead, &ready), GPUARR_ERROR_INVALID_HANDLE, "a");
    TEST_FAIL_WITH(gpuarr_array_sync(dead), GPUARR_ERROR_INVALID_HANDLE, "a");
    cr_expect_eq(out.id, SENTINEL_ID, "a refused view changed *out");
    cr_expect(!ready, "a refused query set *ready");
    for (int i = 0; i < 4; i++) cr_expect_eq(buf[i], 7, "a refused read changed the buffer");
    int32_t w1[4] = {1, 2, 3, 4}, w2[4] = {3, 4, 5, 6}, w3[4] = {4, 5, 6, 7};
    expect_i32_values(alive1, w1, 4, "alive1");
    expect_i32_values(alive2, w2, 4, "alive2");
    expect_i32_values(alive3, w3, 4, "alive3");
    TEST_OK(gpuarr_release(alive1));
    TEST_OK(gpuarr_release(alive2));
    TEST_OK(gpuarr_release(alive3));
}

Test(mutable, empty_pinned_and_array_query_refuse_bad_arguments) {
    gpuarr_device dev = test_device();
    gpuarr_array out = {SENTINEL_ID};
    int64_t shape[1] = {4};
    TEST_FAIL_WITH(gpuarr_empty_pinned(dev, GPUARR_DTYPE_INVALID, 1, shape, &out), GPUARR_ERROR_INVALID_ARGUMENT, "dtype");
    TEST_FAIL_WITH(gpuarr_empty_pinned(dev, (gpuarr_dtype)99, 1, shape, &out), GPUARR_ERROR_INVALID_ARGUMENT, "99");
    TEST_FAIL_WITH(gpuarr_empty_pinned(dev, GPUARR_F32, 1, (int64_t[]){-2}, &out), GPUARR_ERROR_INVALID_ARGUMENT, "-2");
    cr_expect_eq(out.id, SENTINEL_ID, "a refused empty_pinned changed *out");
    gpuarr_pool_stats st;
    TEST_OK(gpuarr_pool_get_pinned_stats(dev, &st));
    cr_expect_eq(st.allocated_bytes, 0u, "refused empty_pinned calls left %" PRIu64 " pinned bytes allocated", st.allocated_bytes);
    gpuarr_array a = make_i32(dev, 1, shape, 0);
    TEST_FAIL_WITH(gpuarr_array_query(a, NULL), GPUARR_ERROR_INVALID_ARGUMENT, "ready");
    TEST_OK(gpuarr_release(a));
}

Test(mutable, a_stream_of_a_third_device_is_refused) {
    gpuarr_device dev = test_device(), host = gpuarr_host();
    gpuarr_device third = other_device(dev, false);
    if (!third.id) test_skip("no device besides %s and the host", test_device_spec());
    int64_t shape[1] = {4};
    gpuarr_array a = make_i32(dev, 1, shape, 0), h = make_i32(host, 1, shape, 20);
    gpuarr_stream s;
    TEST_OK(gpuarr_stream_create(third, 0, &s));
    int32_t buf[4] = {9, 9, 9, 9}, zero[4] = {0, 1, 2, 3}, hv[4] = {20, 21, 22, 23};
    TEST_FAIL_WITH(gpuarr_copy_async(a, h, s), GPUARR_ERROR_INVALID_ARGUMENT, "s belongs to");
    TEST_FAIL_WITH(gpuarr_copy_async(h, a, s), GPUARR_ERROR_INVALID_ARGUMENT, "s belongs to");
    TEST_FAIL_WITH(gpuarr_write_async(a, 0, 4, 0, buf, s), GPUARR_ERROR_INVALID_ARGUMENT, "s belongs to");
    TEST_FAIL_WITH(gpuarr_read_async(a, 0, 4, 0, buf, s), GPUARR_ERROR_INVALID_ARGUMENT, "s belongs to");
    TEST_OK(gpuarr_stream_sync(s));
    for (int i = 0; i < 4; i++) cr_expect_eq(buf[i], 9, "a refused read_async changed the buffer");
    expect_i32_values(a, zero, 4, "a after refused calls");
    expect_i32_values(h, hv, 4, "h after refused calls");
    TEST_OK(gpuarr_stream_destroy(s));
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(h));
}

/* ---------------------------------------------------------------------------------------------
 * 8. empty_pinned
 * ------------------------------------------------------------------------------------------- */
Test(mutable, empty_pinned_is_a_host_array_that_round_trips_with_the_device) {
    gpuarr_device dev = test_device(), host = gpuarr_host();
    enum { M = 1000 };
    int64_t shape[2] = {10, 100};
    gpuarr_pool_stats st0, st1, st2;
    TEST_OK(gpuarr_pool_get_pinned_stats(dev, &st0));
    gpuarr_array p = {0}, q = {0}, d = {0};
    TEST_OK(gpuarr_empty_pinned(dev, GPUARR_F32, 2, shape, &p));
    TEST_OK(gpuarr_empty_pinned(dev, GPUARR_I32, 2, shape, &q));
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(p, &info));
    cr_expect_eq(info.device.id, host.id, "a pinned array lives on the host");
    cr_expect(info.host_accessible, "a pinned array is host accessible");
    cr_expect_eq(info.pinned, !test_device_is_host(dev), "info.pinned = %d on %s", info.pinned, test_device_spec());
    cr_expect(!info.is_view && info.count == M && info.dtype == GPUARR_F32, "pinned array layout");
    float *hp = NULL;
    TEST_OK(gpuarr_host_data(p, (void **)&hp));
    cr_assert_not_null(hp);
    for (int i = 0; i < M; i++) hp[i] = (float)i * 0.75f - 100.0f;
    TEST_OK(gpuarr_pool_get_pinned_stats(dev, &st1));
    if (!test_device_is_host(dev))
        cr_expect_geq(st1.allocated_bytes, st0.allocated_bytes + 2 * M * 4, "pinned allocated_bytes %" PRIu64 " -> %" PRIu64 " with 8000 pinned bytes live",
                      st0.allocated_bytes, st1.allocated_bytes);
    TEST_OK(gpuarr_empty(dev, GPUARR_F16, 1, (int64_t[]){M}, &d));
    TEST_OK(gpuarr_copy(d, p));  /* pinned f32 -> device f16 */
    TEST_OK(gpuarr_copy(q, d));  /* device f16 -> pinned i32 */
    int32_t *qp = NULL;
    TEST_OK(gpuarr_host_data(q, (void **)&qp));
    for (int i = 0; i < M; i++) {
        uint64_t h16 = ref_cast_bits(GPUARR_F32, test_f32_bits(hp[i]), GPUARR_F16);
        int32_t want = (int32_t)ref_cast_bits(GPUARR_F16, h16, GPUARR_I32);
        cr_assert_eq(qp[i], want, "pinned -> device f16 -> pinned i32, element %d: %d, want %d", i, qp[i], want);
    }
    /* async, on a stream of the device */
    gpuarr_stream s;
    TEST_OK(gpuarr_stream_create(dev, 0, &s));
    memset(qp, 0, M * 4);
    TEST_OK(gpuarr_copy_async(d, p, s));
    TEST_OK(gpuarr_copy_async(q, d, s));
    TEST_OK(gpuarr_array_sync(q));
    TEST_OK(gpuarr_host_data(q, (void **)&qp));
    for (int i = 0; i < M; i++) {
        int32_t want = (int32_t)ref_cast_bits(GPUARR_F16, ref_cast_bits(GPUARR_F32, test_f32_bits(hp[i]), GPUARR_F16), GPUARR_I32);
        cr_assert_eq(qp[i], want, "async round trip, element %d: %d, want %d", i, qp[i], want);
    }
    TEST_OK(gpuarr_stream_destroy(s));
    TEST_OK(gpuarr_release(p));
    TEST_OK(gpuarr_release(q));
    TEST_OK(gpuarr_release(d));
    TEST_OK(gpuarr_device_sync(dev));
    TEST_OK(gpuarr_pool_get_pinned_stats(dev, &st2));
    cr_expect_eq(st2.allocated_bytes, 0u, "pinned allocated_bytes after release: %" PRIu64 " (before %" PRIu64 ")", st2.allocated_bytes,
                 st0.allocated_bytes);
}

Test(mutable, empty_pinned_on_the_host_is_an_ordinary_host_array) {
    gpuarr_device host = gpuarr_host();
    (void)test_device();
    gpuarr_array p = {0};
    TEST_OK(gpuarr_empty_pinned(host, GPUARR_U16, 1, (int64_t[]){5}, &p));
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(p, &info));
    cr_expect(!info.pinned, "empty_pinned(host) says pinned");
    cr_expect_eq(info.device.id, host.id, "empty_pinned(host) not on the host");
    cr_expect(info.host_accessible && info.count == 5 && info.dtype == GPUARR_U16, "layout");
    uint16_t *hp = NULL;
    TEST_OK(gpuarr_host_data(p, (void **)&hp));
    cr_assert_not_null(hp);
    for (int i = 0; i < 5; i++) hp[i] = (uint16_t)(i * 1000);
    uint16_t back[5];
    TEST_OK(gpuarr_read(p, 0, 5, 0, back));
    for (int i = 0; i < 5; i++) cr_expect_eq(back[i], i * 1000, "element %d", i);
    TEST_OK(gpuarr_release(p));
}

/* ---------------------------------------------------------------------------------------------
 * 9. array_query / array_sync
 * ------------------------------------------------------------------------------------------- */
Test(mutable, array_sync_after_an_async_write_makes_it_ready_with_the_data) {
    gpuarr_device dev = test_device();
    ops_run_fn ops_run = fake_ops_counter(dev);
    enum { M = 3000 };
    int64_t shape[1] = {M};
    double *in = malloc(M * sizeof *in);
    cr_assert_not_null(in);
    for (int i = 0; i < M; i++) in[i] = (double)i / 7.0 - 200.0;
    gpuarr_array a = {0};
    TEST_OK(gpuarr_zeros(dev, GPUARR_BF16, 1, shape, &a));
    bool ready = false;
    TEST_OK(gpuarr_array_query(a, &ready));
    cr_expect(ready, "a fresh, synchronously made array is not ready");
    gpuarr_stream s;
    TEST_OK(gpuarr_stream_create(dev, 0, &s));
    gpuarr_result r = gpuarr_write_async(a, 0, M, GPUARR_F64, in, s);
    if (r == GPUARR_ERROR_UNSUPPORTED) test_skip("f64 unsupported on %s", test_device_spec());
    TEST_OK(r);
    if (ops_run) { /* nothing ran yet: the write is still pending */
        ready = true;
        TEST_OK(gpuarr_array_query(a, &ready));
        cr_expect(!ready, "array_query says ready before the deferred write ran");
    }
    TEST_OK(gpuarr_array_sync(a));
    ready = false;
    TEST_OK(gpuarr_array_query(a, &ready));
    cr_expect(ready, "array_query after array_sync says not ready");
    uint16_t got[M];
    raw_read(a, GPUARR_BF16, got, M);
    expect_reference(GPUARR_F64, in, GPUARR_BF16, got, M, "write_async f64 -> bf16 then array_sync");
    /* a view is ready with its base */
    gpuarr_array v = {0};
    TEST_OK(gpuarr_slice(a, 10, 20, &v));
    TEST_OK(gpuarr_write_async(v, 0, 10, GPUARR_F64, in, s));
    TEST_OK(gpuarr_array_sync(a));
    ready = false;
    TEST_OK(gpuarr_array_query(v, &ready));
    cr_expect(ready, "a view is not ready after its base was synced");
    raw_read(a, GPUARR_BF16, got, M);
    expect_reference(GPUARR_F64, in, GPUARR_BF16, got + 10, 10, "write_async through a view");
    TEST_OK(gpuarr_release(v));
    TEST_OK(gpuarr_stream_destroy(s));
    TEST_OK(gpuarr_release(a));
    free(in);
}

/* ---------------------------------------------------------------------------------------------
 * More: ordering through views and fill, large chunked ranges, views across devices, pending
 * copies into host arrays, empty arrays
 * ------------------------------------------------------------------------------------------- */
Test(mutable, a_synchronous_fill_comes_after_a_pending_async_write) {
    gpuarr_device dev = test_device();
    enum { M = 4096 };
    int64_t shape[1] = {M};
    int32_t *in = malloc(M * 4), *got = malloc(M * 4);
    cr_assert(in && got);
    for (int i = 0; i < M; i++) in[i] = i + 1;
    gpuarr_array x = {0};
    TEST_OK(gpuarr_zeros(dev, GPUARR_I32, 1, shape, &x));
    TEST_OK(gpuarr_device_sync(dev));
    gpuarr_stream a;
    TEST_OK(gpuarr_stream_create(dev, 0, &a));
    TEST_OK(gpuarr_write_async(x, 0, M, GPUARR_I32, in, a));
    TEST_OK(gpuarr_fill(x, 5)); /* must wait for the write on a */
    raw_read(x, GPUARR_I32, got, M);
    for (int i = 0; i < M; i++) cr_assert_eq(got[i], 5, "element %d = %d after write_async then fill: the write landed after the fill", i, got[i]);
    /* and a pending async write into a slice after the fill lands on top of it */
    gpuarr_array s = {0};
    TEST_OK(gpuarr_slice(x, 100, 200, &s));
    TEST_OK(gpuarr_write_async(s, 0, 100, GPUARR_I32, in, a));
    raw_read(x, GPUARR_I32, got, M); /* a synchronous read of the base waits for the view's write */
    for (int i = 0; i < M; i++) {
        int32_t want = i >= 100 && i < 200 ? in[i - 100] : 5;
        cr_assert_eq(got[i], want, "element %d = %d, want %d after write_async into slice(x, 100, 200)", i, got[i], want);
    }
    TEST_OK(gpuarr_stream_destroy(a));
    TEST_OK(gpuarr_release(s));
    TEST_OK(gpuarr_release(x));
    free(in);
    free(got);
}

Test(mutable, a_copy_out_of_a_view_waits_for_a_pending_write_through_another_view) {
    gpuarr_device dev = test_device();
    int64_t pshape[2] = {64, 32};
    gpuarr_array p = make_i32(dev, 2, pshape, 0), s = {0}, flat = {0}, d = {0};
    TEST_OK(gpuarr_slice(p, 8, 16, &s)); /* elements 256..511 */
    TEST_OK(gpuarr_reshape(p, 1, (int64_t[]){2048}, &flat));
    TEST_OK(gpuarr_zeros(dev, GPUARR_I64, 2, (int64_t[]){32, 64}, &d));
    TEST_OK(gpuarr_device_sync(dev));
    int32_t in[256];
    for (int i = 0; i < 256; i++) in[i] = -7 * i - 1;
    gpuarr_stream a, b;
    TEST_OK(gpuarr_stream_create(dev, 0, &a));
    TEST_OK(gpuarr_stream_create(dev, 0, &b));
    TEST_OK(gpuarr_write_async(s, 0, 256, GPUARR_I32, in, a));
    TEST_OK(gpuarr_copy_async(d, flat, b)); /* reads all of p: must wait for the write on a */
    TEST_OK(gpuarr_stream_sync(b));
    int64_t got[2048];
    raw_read(d, GPUARR_I64, got, 2048);
    for (int i = 0; i < 2048; i++) {
        int64_t want = i >= 256 && i < 512 ? in[i - 256] : i;
        cr_assert_eq(got[i], want, "element %d = %" PRId64 ", want %" PRId64 ": the copy out of reshape(p) did not wait for the write through slice(p)", i, got[i], want);
    }
    TEST_OK(gpuarr_stream_destroy(a));
    TEST_OK(gpuarr_stream_destroy(b));
    gpuarr_array v[] = {p, s, flat, d};
    for (size_t i = 0; i < 4; i++) TEST_OK(gpuarr_release(v[i]));
}

Test(mutable, large_ranges_at_an_offset_are_written_and_read_exactly) {
    gpuarr_device dev = test_device();
    enum { M = (1 << 20) + 333, FIRST = 12345, COUNT = M - 20000 }; /* 4 MiB of i32: staged in chunks */
    int64_t shape[1] = {M};
    int16_t *in = malloc(COUNT * sizeof *in);
    int32_t *all = malloc(M * sizeof *all);
    float *back = malloc((COUNT + 1) * sizeof *back);
    cr_assert(in && all && back);
    for (int i = 0; i < COUNT; i++) in[i] = (int16_t)(i * 7919);
    gpuarr_array a = {0};
    TEST_OK(gpuarr_zeros(dev, GPUARR_I32, 1, shape, &a));
    TEST_OK(gpuarr_fill(a, -3));
    TEST_OK(gpuarr_write(a, FIRST, COUNT, GPUARR_I16, in)); /* i16 -> i32 */
    raw_read(a, GPUARR_I32, all, M);
    for (int i = 0; i < M; i++) {
        int32_t want = i >= FIRST && i < FIRST + COUNT ? in[i - FIRST] : -3;
        if (all[i] != want) cr_assert_fail("large write: element %d = %d, want %d", i, all[i], want);
    }
    back[COUNT] = 1234.5f;
    TEST_OK(gpuarr_read(a, FIRST - 1, COUNT, GPUARR_F32, back)); /* i32 -> f32 */
    for (int i = 0; i < COUNT; i++) {
        float want = i == 0 ? -3.0f : (float)in[i - 1];
        if (back[i] != want) cr_assert_fail("large read: element %d = %g, want %g", i, (double)back[i], (double)want);
    }
    cr_expect_eq(back[COUNT], 1234.5f, "the large read wrote past its count");
    /* the same through a slice of a 2-D view */
    gpuarr_array r = {0}, s = {0};
    TEST_OK(gpuarr_reshape(a, 2, (int64_t[]){M, 1}, &r));
    TEST_OK(gpuarr_slice(r, FIRST, FIRST + COUNT, &s));
    TEST_OK(gpuarr_read(s, 1, COUNT - 1, GPUARR_F32, back));
    for (int i = 0; i < COUNT - 1; i++)
        if (back[i] != (float)in[i + 1]) cr_assert_fail("large read through a slice: element %d = %g, want %d", i, (double)back[i], in[i + 1]);
    TEST_OK(gpuarr_release(s));
    TEST_OK(gpuarr_release(r));
    TEST_OK(gpuarr_release(a));
    free(in);
    free(all);
    free(back);
}

static void copy_views_between(gpuarr_device from, gpuarr_device to, const char *what) {
    int64_t s1[2] = {10, 6}, s2[1] = {90};
    gpuarr_array p = make_i32(from, 2, s1, 0), q = {0}, sp = {0}, sq = {0}, rsq = {0};
    TEST_OK(gpuarr_zeros(to, GPUARR_F32, 1, s2, &q));
    TEST_OK(gpuarr_fill(q, 0.5f));
    TEST_OK(gpuarr_slice(p, 3, 7, &sp));  /* elements 18..41 */
    TEST_OK(gpuarr_slice(q, 50, 74, &sq)); /* 24 elements */
    TEST_OK(gpuarr_reshape(sq, 2, (int64_t[]){4, 6}, &rsq));
    gpuarr_result r = gpuarr_copy(rsq, sp);
    cr_assert_eq(r, GPUARR_OK, "%s: copy slice -> reshape(slice) = %s: %s", what, gpuarr_result_name(r), gpuarr_last_error());
    float got[90];
    raw_read(q, GPUARR_F32, got, 90);
    for (int i = 0; i < 90; i++) {
        float want = i >= 50 && i < 74 ? (float)(18 + i - 50) : 0.5f;
        cr_assert_eq(got[i], want, "%s: q element %d = %g, want %g", what, i, (double)got[i], (double)want);
    }
    gpuarr_array v[] = {p, q, sp, sq, rsq};
    for (size_t i = 0; i < 5; i++) TEST_OK(gpuarr_release(v[i]));
}

Test(mutable, copies_between_views_on_different_devices) {
    gpuarr_device dev = test_device();
    for (int i = 0; i < gpuarr_device_count(); i++) { /* the host and every other device, any backend */
        gpuarr_device o = gpuarr_device_at(i);
        gpuarr_device_info oi;
        TEST_OK(gpuarr_device_get_info(o, &oi));
        char what[96];
        snprintf(what, sizeof what, "%s -> %s", test_device_spec(), oi.spec);
        copy_views_between(dev, o, what);
        snprintf(what, sizeof what, "%s -> %s", oi.spec, test_device_spec());
        copy_views_between(o, dev, what);
    }
}

Test(mutable, a_pending_async_copy_into_a_host_array_is_waited_for_by_host_data) {
    gpuarr_device dev = test_device();
    enum { M = 5000 };
    int64_t shape[1] = {M};
    gpuarr_array src = make_i32(dev, 1, shape, -2500), pin = {0}, plain = {0};
    TEST_OK(gpuarr_empty_pinned(dev, GPUARR_I64, 1, shape, &pin));
    TEST_OK(gpuarr_zeros(gpuarr_host(), GPUARR_F64, 1, shape, &plain));
    gpuarr_stream s;
    TEST_OK(gpuarr_stream_create(dev, 0, &s));
    TEST_OK(gpuarr_copy_async(pin, src, s));
    TEST_OK(gpuarr_copy_async(plain, src, s));
    int64_t *pp = NULL;
    double *dp = NULL;
    TEST_OK(gpuarr_host_data(pin, (void **)&pp));
    for (int i = 0; i < M; i++) cr_assert_eq(pp[i], -2500 + i, "pinned element %d = %" PRId64 " read through host_data after copy_async", i, pp[i]);
    TEST_OK(gpuarr_host_data(plain, (void **)&dp));
    for (int i = 0; i < M; i++) cr_assert_eq(dp[i], (double)(-2500 + i), "host element %d = %g read through host_data after copy_async", i, dp[i]);
    /* a slice of the pinned array is pinned too and shares it */
    gpuarr_array ps = {0};
    TEST_OK(gpuarr_slice(pin, 10, 20, &ps));
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(ps, &info));
    cr_expect_eq(info.pinned, !test_device_is_host(dev), "a slice of a pinned array: pinned = %d", info.pinned);
    cr_expect(info.is_view && info.offset == 80, "a slice of a pinned array: is_view %d offset %zu", info.is_view, info.offset);
    int64_t *sp = NULL;
    TEST_OK(gpuarr_host_data(ps, (void **)&sp));
    cr_expect_eq(sp, pp + 10, "host_data of slice(pin, 10, 20) is not 10 elements into pin's");
    TEST_OK(gpuarr_release(ps));
    TEST_OK(gpuarr_stream_destroy(s));
    TEST_OK(gpuarr_release(src));
    TEST_OK(gpuarr_release(pin));
    TEST_OK(gpuarr_release(plain));
}

Test(mutable, empty_arrays_copy_fill_and_take_empty_ranges) {
    gpuarr_device dev = test_device();
    int64_t z[2] = {0, 5}, z2[1] = {0};
    gpuarr_array a = {0}, b = {0}, s = {0};
    TEST_OK(gpuarr_empty(dev, GPUARR_F32, 2, z, &a));
    TEST_OK(gpuarr_empty(gpuarr_host(), GPUARR_I8, 1, z2, &b));
    TEST_OK(gpuarr_copy(a, b));
    TEST_OK(gpuarr_copy(b, a));
    TEST_OK(gpuarr_fill(a, 1.0));
    TEST_OK(gpuarr_write(a, 0, 0, 0, NULL));
    TEST_OK(gpuarr_read(a, 0, 0, 0, NULL));
    TEST_FAIL_WITH(gpuarr_read(a, 0, 1, 0, (float[1]){0}), GPUARR_ERROR_INVALID_ARGUMENT, "[0, 1)");
    TEST_OK(gpuarr_slice(a, 0, 0, &s));
    gpuarr_array r = {0};
    TEST_OK(gpuarr_reshape(a, 3, (int64_t[]){5, 0, 7}, &r));
    bool ready = false;
    TEST_OK(gpuarr_array_query(r, &ready));
    cr_expect(ready, "an empty view is not ready");
    TEST_OK(gpuarr_array_sync(s));
    gpuarr_array v[] = {a, b, s, r};
    for (size_t i = 0; i < 4; i++) TEST_OK(gpuarr_release(v[i]));
}

Test(mutable, range_io_on_a_stream_of_the_host_and_query_after_the_stream_is_destroyed) {
    gpuarr_device dev = test_device(), host = gpuarr_host();
    enum { M = 3000 };
    int64_t shape[1] = {M};
    int32_t *in = malloc(M * 4);
    float *out = malloc(M * 4);
    cr_assert(in && out);
    for (int i = 0; i < M; i++) {
        in[i] = 3 * i - 4000;
        out[i] = -1.0f;
    }
    gpuarr_array a = {0};
    TEST_OK(gpuarr_zeros(dev, GPUARR_I32, 1, shape, &a));
    gpuarr_stream hs, s;
    TEST_OK(gpuarr_stream_create(host, 0, &hs));
    TEST_OK(gpuarr_write_async(a, 0, M, 0, in, hs));
    TEST_OK(gpuarr_read_async(a, 0, M, GPUARR_F32, out, hs));
    TEST_OK(gpuarr_stream_sync(hs));
    for (int i = 0; i < M; i++) cr_assert_eq(out[i], (float)in[i], "write then read on a stream of the host: element %d = %g", i, (double)out[i]);
    TEST_OK(gpuarr_stream_destroy(hs));
    TEST_OK(gpuarr_stream_create(dev, 0, &s));
    TEST_OK(gpuarr_write_async(a, 0, M, GPUARR_F32, out, s));
    TEST_OK(gpuarr_stream_destroy(s)); /* waits for its work */
    for (int i = 0; i < M; i++) out[i] = 12345.0f; /* the write's source may be reused now */
    bool ready = false;
    TEST_OK(gpuarr_array_query(a, &ready));
    cr_expect(ready, "not ready after the stream it was written on was destroyed");
    TEST_OK(gpuarr_array_sync(a));
    int32_t got[M];
    raw_read(a, GPUARR_I32, got, M);
    for (int i = 0; i < M; i++) cr_assert_eq(got[i], in[i], "element %d = %d, want %d: the write queued before gpuarr_stream_destroy ran after it returned", i, got[i], in[i]);
    TEST_OK(gpuarr_release(a));
    free(in);
    free(out);
}

Test(mutable, bool_sources_are_0_or_1_and_fill_writes_wrapped_memory) {
    gpuarr_device dev = test_device();
    unsigned char b[4] = {0, 1, 2, 255};
    gpuarr_array a = {0}, f = {0};
    TEST_OK(gpuarr_zeros(dev, GPUARR_I32, 1, (int64_t[]){4}, &a));
    TEST_OK(gpuarr_zeros(dev, GPUARR_F32, 1, (int64_t[]){4}, &f));
    TEST_OK(gpuarr_write(a, 0, 4, GPUARR_BOOL, b));
    TEST_OK(gpuarr_write(f, 0, 4, GPUARR_BOOL, b));
    int32_t gi[4];
    float gf[4];
    raw_read(a, GPUARR_I32, gi, 4);
    raw_read(f, GPUARR_F32, gf, 4);
    for (int i = 0; i < 4; i++) {
        cr_expect_eq(gi[i], b[i] != 0, "bool byte 0x%02x written into i32: %d", b[i], gi[i]);
        cr_expect_eq(gf[i], b[i] != 0 ? 1.0f : 0.0f, "bool byte 0x%02x written into f32: %g", b[i], (double)gf[i]);
    }
    unsigned char two = 2;
    TEST_OK(gpuarr_fill_as(a, GPUARR_BOOL, &two));
    raw_read(a, GPUARR_I32, gi, 4);
    for (int i = 0; i < 4; i++) cr_expect_eq(gi[i], 1, "i32 filled with bool byte 0x02: %d", gi[i]);
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(f));
    /* fill of wrapped host memory writes the caller's memory, and no further */
    uint16_t mem[9];
    for (int i = 0; i < 9; i++) mem[i] = 0xeeee;
    gpuarr_array w = {0}, ws = {0};
    TEST_OK(gpuarr_wrap_host(mem, GPUARR_F16, 2, (int64_t[]){4, 2}, NULL, NULL, &w));
    TEST_OK(gpuarr_slice(w, 1, 3, &ws));
    TEST_OK(gpuarr_fill(ws, -0.1));
    uint16_t want = (uint16_t)ref_cast_bits(GPUARR_F64, test_f64_bits(-0.1), GPUARR_F16);
    for (int i = 0; i < 9; i++) {
        uint16_t e = i >= 2 && i < 6 ? want : 0xeeee;
        cr_expect_eq(mem[i], e, "wrapped memory element %d = 0x%04x, want 0x%04x after filling slice(w, 1, 3)", i, mem[i], e);
    }
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(ws, &info));
    cr_expect(info.wrapped && info.is_view && info.offset == 4, "slice of wrapped memory: wrapped %d is_view %d offset %zu", info.wrapped,
              info.is_view, info.offset);
    TEST_OK(gpuarr_release(ws));
    TEST_OK(gpuarr_release(w));
}

/* Host arrays with device work still pending into them: host-side calls (read, copy, fill,
   write) on them must come after it. */
Test(mutable, host_side_calls_on_a_host_array_wait_for_pending_device_copies_into_it) {
    gpuarr_device dev = test_device(), host = gpuarr_host();
    enum { M = 6000 };
    int64_t shape[1] = {M};
    gpuarr_array src = make_i32(dev, 1, shape, 1), pin = {0}, plain = {0}, other = {0};
    TEST_OK(gpuarr_empty_pinned(dev, GPUARR_I32, 1, shape, &pin));
    TEST_OK(gpuarr_zeros(host, GPUARR_I32, 1, shape, &plain));
    TEST_OK(gpuarr_zeros(host, GPUARR_I32, 1, shape, &other));
    TEST_OK(gpuarr_fill(pin, 0));
    gpuarr_stream s;
    TEST_OK(gpuarr_stream_create(dev, 0, &s));
    int32_t *got = malloc(M * 4), *want = malloc(M * 4);
    cr_assert(got && want);
    for (int i = 0; i < M; i++) want[i] = 1 + i;
    gpuarr_array targets[2] = {pin, plain};
    for (int k = 0; k < 2; k++) {
        const char *name = k ? "a plain host array" : "a pinned host array";
        gpuarr_array t = targets[k];
        /* read */
        TEST_OK(gpuarr_copy_async(t, src, s));
        memset(got, 0, M * 4);
        TEST_OK(gpuarr_read(t, 0, M, 0, got));
        cr_assert(memcmp(got, want, M * 4) == 0, "%s: gpuarr_read right after copy_async into it saw element 0 = %d", name, got[0]);
        /* copy to another host array */
        TEST_OK(gpuarr_fill(t, -1));
        TEST_OK(gpuarr_copy_async(t, src, s));
        TEST_OK(gpuarr_copy(other, t));
        raw_read(other, GPUARR_I32, got, M);
        cr_assert(memcmp(got, want, M * 4) == 0, "%s: gpuarr_copy out of it right after copy_async into it saw element 0 = %d", name, got[0]);
        /* fill: lands after the pending copy */
        TEST_OK(gpuarr_copy_async(t, src, s));
        TEST_OK(gpuarr_fill(t, 7));
        TEST_OK(gpuarr_stream_sync(s));
        raw_read(t, GPUARR_I32, got, M);
        for (int i = 0; i < M; i++) cr_assert_eq(got[i], 7, "%s: fill after a pending copy_async: element %d = %d", name, i, got[i]);
        /* write_async on the {0} stream: lands after the pending copy */
        TEST_OK(gpuarr_copy_async(t, src, s));
        int32_t w[3] = {-5, -6, -7};
        TEST_OK(gpuarr_write_async(t, 10, 3, 0, w, (gpuarr_stream){0}));
        TEST_OK(gpuarr_array_sync(t));
        TEST_OK(gpuarr_stream_sync(s));
        raw_read(t, GPUARR_I32, got, M);
        for (int i = 0; i < M; i++) {
            int32_t e = i >= 10 && i < 13 ? w[i - 10] : want[i];
            cr_assert_eq(got[i], e, "%s: write_async after a pending copy_async: element %d = %d, want %d", name, i, got[i], e);
        }
    }
    TEST_OK(gpuarr_stream_destroy(s));
    gpuarr_array v[] = {src, pin, plain, other};
    for (size_t i = 0; i < 4; i++) TEST_OK(gpuarr_release(v[i]));
    free(got);
    free(want);
}

Test(mutable, copies_between_wrapped_arrays_over_overlapping_memory_are_refused) {
    (void)test_device();
    int32_t mem[8] = {0, 1, 2, 3, 4, 5, 6, 7}, orig[8];
    memcpy(orig, mem, sizeof mem);
    gpuarr_array a = {0}, b = {0}, c = {0};
    TEST_OK(gpuarr_wrap_host(mem, GPUARR_I32, 1, (int64_t[]){4}, NULL, NULL, &a));
    TEST_OK(gpuarr_wrap_host(mem + 2, GPUARR_I32, 1, (int64_t[]){4}, NULL, NULL, &b));
    TEST_OK(gpuarr_wrap_host(mem + 4, GPUARR_I32, 1, (int64_t[]){4}, NULL, NULL, &c));
    TEST_FAIL_WITH(gpuarr_copy(a, b), GPUARR_ERROR_INVALID_ARGUMENT, "share memory");
    TEST_FAIL_WITH(gpuarr_copy(b, a), GPUARR_ERROR_INVALID_ARGUMENT, "share memory");
    cr_expect(memcmp(mem, orig, sizeof mem) == 0, "a refused copy changed the memory");
    TEST_OK(gpuarr_copy(c, a)); /* adjacent, not overlapping */
    int32_t want[8] = {0, 1, 2, 3, 0, 1, 2, 3};
    cr_expect(memcmp(mem, want, sizeof mem) == 0, "copy between adjacent wrapped arrays");
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
    TEST_OK(gpuarr_release(c));
}

/* The calls that take any array take views too: convert (same device, host, every other
   device, with a cast, sync and async) reads the view's elements, not the base's first ones. */
Test(mutable, convert_of_a_view_reads_the_views_elements) {
    gpuarr_device dev = test_device();
    int64_t pshape[2] = {40, 5};
    gpuarr_array p = make_i32(dev, 2, pshape, -100), s = {0}, r = {0};
    TEST_OK(gpuarr_slice(p, 7, 19, &s)); /* elements 35..94 */
    TEST_OK(gpuarr_reshape(s, 2, (int64_t[]){6, 10}, &r));
    gpuarr_stream st;
    TEST_OK(gpuarr_stream_create(dev, 0, &st));
    for (int i = 0; i < gpuarr_device_count(); i++) {
        gpuarr_device o = gpuarr_device_at(i);
        gpuarr_device_info oi;
        TEST_OK(gpuarr_device_get_info(o, &oi));
        for (int async = 0; async < 2; async++) {
            gpuarr_array out = {0};
            gpuarr_result res = async ? gpuarr_convert_async(r, o, GPUARR_F32, st, &out) : gpuarr_convert(r, o, GPUARR_F32, &out);
            cr_assert_eq(res, GPUARR_OK, "convert%s(reshape(slice), %s, f32) = %s: %s", async ? "_async" : "", oi.spec, gpuarr_result_name(res),
                         gpuarr_last_error());
            gpuarr_array_info info;
            TEST_OK(gpuarr_array_get_info(out, &info));
            cr_expect(info.count == 60 && info.ndim == 2 && info.shape[0] == 6 && !info.is_view && info.offset == 0,
                      "convert of a view to %s: count %" PRId64 " ndim %d is_view %d offset %zu", oi.spec, info.count, info.ndim, info.is_view,
                      info.offset);
            float got[60];
            raw_read(out, GPUARR_F32, got, 60);
            for (int k = 0; k < 60; k++)
                cr_assert_eq(got[k], (float)(-100 + 35 + k), "convert%s of a view to %s: element %d = %g", async ? "_async" : "", oi.spec, k,
                             (double)got[k]);
            TEST_OK(gpuarr_release(out));
        }
    }
    /* identity convert of a view */
    gpuarr_array same = {0};
    TEST_OK(gpuarr_convert(s, dev, 0, &same));
    int32_t want[60];
    for (int k = 0; k < 60; k++) want[k] = -65 + k;
    expect_i32_values(same, want, 60, "identity convert of a slice");
    TEST_OK(gpuarr_release(same));
    TEST_OK(gpuarr_stream_destroy(st));
    TEST_OK(gpuarr_release(r));
    TEST_OK(gpuarr_release(s));
    TEST_OK(gpuarr_release(p));
}

Test(mutable, a_slice_of_a_pinned_array_keeps_it_and_the_pinned_pool_balances) {
    gpuarr_device dev = test_device();
    gpuarr_pool_stats st;
    TEST_OK(gpuarr_pool_get_pinned_stats(dev, &st));
    uint64_t start = st.allocated_bytes;
    gpuarr_array pin = {0}, s = {0};
    TEST_OK(gpuarr_empty_pinned(dev, GPUARR_U16, 2, (int64_t[]){100, 10}, &pin));
    uint16_t *hp = NULL;
    TEST_OK(gpuarr_host_data(pin, (void **)&hp));
    for (int i = 0; i < 1000; i++) hp[i] = (uint16_t)(i * 3);
    TEST_OK(gpuarr_slice(pin, 50, 60, &s));
    TEST_OK(gpuarr_release(pin));
    TEST_OK(gpuarr_pool_get_pinned_stats(dev, &st));
    if (!test_device_is_host(dev))
        cr_expect_geq(st.allocated_bytes, start + 2000, "the pinned block went back while a slice of it lives (%" PRIu64 ")", st.allocated_bytes);
    gpuarr_array d = {0};
    TEST_OK(gpuarr_empty(dev, GPUARR_U16, 1, (int64_t[]){100}, &d));
    TEST_OK(gpuarr_copy(d, s));
    uint16_t got[100];
    raw_read(d, GPUARR_U16, got, 100);
    for (int i = 0; i < 100; i++) cr_assert_eq(got[i], (uint16_t)((500 + i) * 3), "slice of a released pinned array, element %d = %d", i, got[i]);
    TEST_OK(gpuarr_release(d));
    TEST_OK(gpuarr_release(s));
    TEST_OK(gpuarr_pool_get_pinned_stats(dev, &st));
    cr_expect_eq(st.allocated_bytes, start, "pinned allocated_bytes %" PRIu64 " after the last view went, start %" PRIu64, st.allocated_bytes, start);
}

/* Fill of slices at odd element offsets and odd lengths, every dtype, with values whose bytes
   differ (so the backend fills a 2-, 4- or 8-byte pattern at an address aligned only to the
   element size), then with a one-byte pattern; the rows around keep their bytes. */
Test(mutable, fill_of_odd_slices_of_every_dtype_keeps_the_rows_around) {
    gpuarr_device dev = test_device();
    static const double values[] = {-1.75, 3.0, 1e10, -0.0};
    for (int d = TEST_FIRST_DTYPE; d <= TEST_LAST_DTYPE; d++) {
        gpuarr_dtype t = (gpuarr_dtype)d;
        unsigned char init[7 * 3 * 8], got[7 * 3 * 8];
        test_rng rng = {(uint64_t)d};
        test_fill_random(t, init, 21, &rng);
        gpuarr_array a = {0};
        gpuarr_result r = gpuarr_from_host_as(dev, t, init, 2, (int64_t[]){7, 3}, &a);
        if (f64_unsupported(r, 0, t)) continue;
        cr_assert_eq(r, GPUARR_OK, "from_host_as %s: %s", test_dtype_str(t), gpuarr_last_error());
        gpuarr_array s = {0};
        TEST_OK(gpuarr_slice(a, 1, 4, &s)); /* elements 3..11 */
        for (size_t k = 0; k < sizeof values / sizeof values[0]; k++) {
            r = gpuarr_fill(s, values[k]);
            if (f64_unsupported(r, GPUARR_F64, t)) continue;
            cr_assert_eq(r, GPUARR_OK, "fill %s slice with %g = %s: %s", test_dtype_str(t), values[k], gpuarr_result_name(r), gpuarr_last_error());
            uint64_t v = ref_cast_bits(GPUARR_F64, test_f64_bits(values[k]), t);
            for (size_t i = 3; i < 12; i++) test_store_bits(t, init, i, v);
            raw_read(a, t, got, 21);
            for (size_t i = 0; i < 21; i++)
                cr_assert_eq(test_load_bits(t, got, i), test_load_bits(t, init, i),
                             "%s: after filling slice(a, 1, 4) with %g, element %zu = 0x%" PRIx64 ", want 0x%" PRIx64, test_dtype_str(t),
                             values[k], i, test_load_bits(t, got, i), test_load_bits(t, init, i));
        }
        TEST_OK(gpuarr_release(s));
        TEST_OK(gpuarr_release(a));
    }
}
