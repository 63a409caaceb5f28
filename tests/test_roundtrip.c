/*
 * test_roundtrip.c -- arrays keep their bytes, layout and identity: from_host/to_host round
 * trips for every dtype and rank, zeros, the typed _Generic entry points, conversions between
 * the test device and the host, identity conversions, and gpuarr_wrap_host ownership.
 */
#include "test_common.h"

TestSuite(roundtrip, .init = test_setup, .fini = test_teardown);

/* ndim 0..4, a zero-size array and the maximum rank. */
typedef struct test_shape {
    int ndim;
    int64_t dims[GPUARR_MAX_DIMS];
} test_shape;

static const test_shape shapes[] = {
    {0, {0}},
    {1, {7}},
    {2, {3, 5}},
    {3, {2, 3, 4}},
    {4, {2, 1, 3, 2}},
    {3, {3, 0, 2}},
    {8, {1, 2, 1, 2, 1, 2, 1, 3}},
};
#define NSHAPES (sizeof shapes / sizeof shapes[0])

static void check_info(gpuarr_array a, gpuarr_device dev, gpuarr_dtype t, const test_shape *s,
                       const char *what) {
    gpuarr_array_info info;
    memset(&info, 0x5a, sizeof info);
    TEST_OK(gpuarr_array_get_info(a, &info));
    int64_t count = test_shape_count(s->ndim, s->dims);
    cr_expect_eq(info.device.id, dev.id, "%s: info.device", what);
    cr_expect_eq(info.dtype, t, "%s: info.dtype %d", what, (int)info.dtype);
    cr_expect_eq(info.ndim, s->ndim, "%s: info.ndim %d", what, info.ndim);
    for (int i = 0; i < GPUARR_MAX_DIMS; i++) {
        int64_t want = i < s->ndim ? s->dims[i] : 0;
        cr_expect_eq(info.shape[i], want, "%s: info.shape[%d] = %" PRId64 ", want %" PRId64, what,
                     i, info.shape[i], want);
    }
    cr_expect_eq(info.count, count, "%s: info.count %" PRId64, what, info.count);
    cr_expect_eq(info.itemsize, test_dtype_bytes(t), "%s: info.itemsize %zu", what,
                 info.itemsize);
    cr_expect_eq(info.nbytes, (size_t)count * test_dtype_bytes(t), "%s: info.nbytes %zu", what,
                 info.nbytes);
    cr_expect_eq(info.refcount, 1u, "%s: info.refcount %u", what, info.refcount);
    cr_expect(!info.wrapped, "%s: info.wrapped set on an array gpuarr allocated", what);
    if (test_device_is_host(dev))
        cr_expect(info.host_accessible, "%s: host array not host_accessible", what);
}

Test(roundtrip, from_host_then_to_host_gives_identical_bytes_for_every_dtype_and_rank) {
    gpuarr_device dev = test_device();
    test_rng rng = {1};
    for (int t = TEST_FIRST_DTYPE; t <= TEST_LAST_DTYPE; t++) {
        for (size_t k = 0; k < NSHAPES; k++) {
            const test_shape *s = &shapes[k];
            size_t n = (size_t)test_shape_count(s->ndim, s->dims);
            unsigned char in[64 * 8];
            test_fill_random((gpuarr_dtype)t, in, n, &rng);
            gpuarr_array a = {0};
            char what[96];
            snprintf(what, sizeof what, "%s ndim %d (shape #%zu)", test_dtype_str((gpuarr_dtype)t),
                     s->ndim, k);
            TEST_OK(gpuarr_from_host_as(dev, (gpuarr_dtype)t, in, s->ndim,
                                        s->ndim ? s->dims : NULL, &a));
            cr_assert_neq(a.id, 0u, "%s: from_host_as returned handle {0}", what);
            check_info(a, dev, (gpuarr_dtype)t, s, what);
            test_expect_array_bytes(a, (gpuarr_dtype)t, in, n, what);
            /* dtype 0 = the array's own dtype */
            unsigned char out[64 * 8 + 8];
            memset(out, 0xee, sizeof out);
            TEST_OK(gpuarr_to_host_as(a, GPUARR_DTYPE_INVALID, out, n));
            cr_expect(memcmp(out, in, n * test_dtype_bytes((gpuarr_dtype)t)) == 0,
                      "%s: to_host_as(dtype 0) differs from the input", what);
            TEST_OK(gpuarr_release(a));
        }
    }
}

Test(roundtrip, empty_has_the_requested_layout_and_zeros_are_zero_bytes) {
    gpuarr_device dev = test_device();
    for (int t = TEST_FIRST_DTYPE; t <= TEST_LAST_DTYPE; t++) {
        for (size_t k = 0; k < NSHAPES; k++) {
            const test_shape *s = &shapes[k];
            size_t n = (size_t)test_shape_count(s->ndim, s->dims);
            char what[96];
            snprintf(what, sizeof what, "%s ndim %d (shape #%zu)", test_dtype_str((gpuarr_dtype)t),
                     s->ndim, k);
            gpuarr_array e = {0}, z = {0};
            TEST_OK(gpuarr_empty(dev, (gpuarr_dtype)t, s->ndim, s->ndim ? s->dims : NULL, &e));
            check_info(e, dev, (gpuarr_dtype)t, s, what);
            TEST_OK(gpuarr_zeros(dev, (gpuarr_dtype)t, s->ndim, s->ndim ? s->dims : NULL, &z));
            check_info(z, dev, (gpuarr_dtype)t, s, what);
            cr_expect_neq(e.id, z.id, "%s: two live arrays share a handle", what);
            unsigned char zero[64 * 8];
            memset(zero, 0, sizeof zero);
            test_expect_array_bytes(z, (gpuarr_dtype)t, zero, n, what);
            TEST_OK(gpuarr_release(e));
            TEST_OK(gpuarr_release(z));
        }
    }
}

Test(roundtrip, zeros_of_a_large_array_are_zero_after_reuse_of_dirty_memory) {
    gpuarr_device dev = test_device();
    enum { N = 1 << 20 };
    int64_t shape[1] = {N};
    uint32_t *buf = malloc(N * sizeof *buf);
    cr_assert_not_null(buf);
    for (int round = 0; round < 3; round++) {
        /* dirty memory first, so that a pool reusing it would show through */
        memset(buf, 0xff, N * sizeof *buf);
        gpuarr_array dirty = {0}, z = {0};
        TEST_OK(gpuarr_from_host_as(dev, GPUARR_U32, buf, 1, shape, &dirty));
        TEST_OK(gpuarr_release(dirty));
        TEST_OK(gpuarr_zeros(dev, GPUARR_U32, 1, shape, &z));
        TEST_OK(gpuarr_to_host_as(z, GPUARR_U32, buf, N));
        for (size_t i = 0; i < N; i++)
            if (buf[i] != 0) cr_assert_fail("round %d: zeros element %zu = 0x%x", round, i, buf[i]);
        TEST_OK(gpuarr_release(z));
    }
    free(buf);
}

Test(roundtrip, to_host_with_a_larger_count_writes_only_the_array_elements) {
    gpuarr_device dev = test_device();
    int32_t in[5] = {1, -2, 3, -4, 5}, out[8];
    int64_t shape[1] = {5};
    gpuarr_array a = {0};
    TEST_OK(gpuarr_from_host_as(dev, GPUARR_I32, in, 1, shape, &a));
    for (int i = 0; i < 8; i++) out[i] = 0x77;
    TEST_OK(gpuarr_to_host_as(a, GPUARR_I32, out, 8));
    cr_expect(memcmp(out, in, sizeof in) == 0, "values differ");
    for (int i = 5; i < 8; i++) cr_expect_eq(out[i], 0x77, "out[%d] overwritten: %d", i, out[i]);
    TEST_OK(gpuarr_release(a));
}

/* ---------------------------------------------------------------------------------------------
 * Typed _Generic entry points
 * ------------------------------------------------------------------------------------------- */
static gpuarr_dtype dtype_of(gpuarr_array a) {
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(a, &info));
    return info.dtype;
}

/* For C type T: a T* argument, a const T* argument and a plain T[4] array each pick `want`, and
   gpuarr_to_host into T* / T[4] gives the values back. */
#define TYPED_ROUNDTRIP(T, want, ...)                                                              \
    do {                                                                                           \
        T in_[4] = {__VA_ARGS__};                                                                  \
        T out_[4];                                                                                 \
        T *p_ = in_;                                                                               \
        const T *cp_ = in_;                                                                        \
        int64_t shape_[1] = {4};                                                                   \
        gpuarr_array a_ = {0}, b_ = {0}, c_ = {0};                                                 \
        TEST_OK(gpuarr_from_host(dev, p_, 1, shape_, &a_));                                        \
        TEST_OK(gpuarr_from_host(dev, cp_, 1, shape_, &b_));                                       \
        TEST_OK(gpuarr_from_host(dev, in_, 1, shape_, &c_));                                       \
        cr_expect_eq(dtype_of(a_), (want), #T " *: dtype %s, want %s",                             \
                     test_dtype_str(dtype_of(a_)), test_dtype_str(want));                          \
        cr_expect_eq(dtype_of(b_), (want), "const " #T " *: dtype %s, want %s",                    \
                     test_dtype_str(dtype_of(b_)), test_dtype_str(want));                          \
        cr_expect_eq(dtype_of(c_), (want), #T "[4]: dtype %s, want %s",                            \
                     test_dtype_str(dtype_of(c_)), test_dtype_str(want));                          \
        memset(out_, 0x5a, sizeof out_);                                                           \
        T *op_ = out_;                                                                             \
        TEST_OK(gpuarr_to_host(a_, op_, 4));                                                       \
        cr_expect(memcmp(out_, in_, sizeof in_) == 0, #T ": to_host(T *) values differ");          \
        memset(out_, 0x5a, sizeof out_);                                                           \
        TEST_OK(gpuarr_to_host(b_, out_, 4));                                                      \
        cr_expect(memcmp(out_, in_, sizeof in_) == 0, #T ": to_host(T[4]) values differ");         \
        TEST_OK(gpuarr_release(a_));                                                               \
        TEST_OK(gpuarr_release(b_));                                                               \
        TEST_OK(gpuarr_release(c_));                                                               \
    } while (0)

Test(roundtrip, typed_from_host_picks_the_dtype_from_the_pointer_type) {
    gpuarr_device dev = test_device();
    gpuarr_dtype long_dt = sizeof(long) == 8 ? GPUARR_I64 : GPUARR_I32;
    gpuarr_dtype ulong_dt = sizeof(unsigned long) == 8 ? GPUARR_U64 : GPUARR_U32;
    TYPED_ROUNDTRIP(float, GPUARR_F32, 1.5f, -2.25f, 3e38f, -0.0f);
    TYPED_ROUNDTRIP(double, GPUARR_F64, 1.5, -2.25, 1e300, -0.0);
    TYPED_ROUNDTRIP(int, GPUARR_I32, 1, -2, INT32_MAX, INT32_MIN);
    TYPED_ROUNDTRIP(long, long_dt, 1, -2, LONG_MAX, LONG_MIN);
    TYPED_ROUNDTRIP(long long, GPUARR_I64, 1, -2, LLONG_MAX, LLONG_MIN);
    TYPED_ROUNDTRIP(unsigned char, GPUARR_U8, 1, 2, 200, 255);
    TYPED_ROUNDTRIP(signed char, GPUARR_I8, 1, -2, 127, -128);
    TYPED_ROUNDTRIP(short, GPUARR_I16, 1, -2, 32767, -32768);
    TYPED_ROUNDTRIP(unsigned short, GPUARR_U16, 1, 2, 40000, 65535);
    TYPED_ROUNDTRIP(unsigned, GPUARR_U32, 1, 2, 3000000000u, 4294967295u);
    TYPED_ROUNDTRIP(unsigned long, ulong_dt, 1, 2, ULONG_MAX - 1, ULONG_MAX);
    TYPED_ROUNDTRIP(unsigned long long, GPUARR_U64, 1, 2, ULLONG_MAX - 1, ULLONG_MAX);
    TYPED_ROUNDTRIP(bool, GPUARR_BOOL, true, false, true, true);
    TYPED_ROUNDTRIP(gpuarr_f16, GPUARR_F16, {0x3c00}, {0xc000}, {0x7bff}, {0x0001});
    TYPED_ROUNDTRIP(gpuarr_bf16, GPUARR_BF16, {0x3f80}, {0xc000}, {0x7f7f}, {0x0001});
    TYPED_ROUNDTRIP(int64_t, GPUARR_I64, 1, -2, INT64_MAX, INT64_MIN);
    TYPED_ROUNDTRIP(uint64_t, GPUARR_U64, 1, 2, UINT64_MAX - 1, UINT64_MAX);
    TYPED_ROUNDTRIP(int32_t, GPUARR_I32, 1, -2, INT32_MAX, INT32_MIN);
    TYPED_ROUNDTRIP(uint8_t, GPUARR_U8, 1, 2, 128, 255);
}

Test(roundtrip, typed_exact_width_helpers_use_i64_and_u64) {
    gpuarr_device dev = test_device();
    int64_t si[3] = {INT64_MIN, -1, INT64_MAX}, so[3];
    uint64_t ui[3] = {0, 1ull << 63, UINT64_MAX}, uo[3];
    int64_t shape[1] = {3};
    gpuarr_array a = {0}, b = {0};
    TEST_OK(gpuarr_from_host_i64(dev, si, 1, shape, &a));
    TEST_OK(gpuarr_from_host_u64(dev, ui, 1, shape, &b));
    cr_expect_eq(dtype_of(a), GPUARR_I64);
    cr_expect_eq(dtype_of(b), GPUARR_U64);
    TEST_OK(gpuarr_to_host_i64(a, so, 3));
    TEST_OK(gpuarr_to_host_u64(b, uo, 3));
    cr_expect(memcmp(si, so, sizeof si) == 0);
    cr_expect(memcmp(ui, uo, sizeof ui) == 0);
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
}

Test(roundtrip, typed_to_host_casts_into_the_pointer_type) {
    gpuarr_device dev = test_device();
    float in[4] = {1.75f, -2.5f, 3e10f, -0.0f};
    int64_t shape[1] = {4};
    gpuarr_array a = {0};
    TEST_OK(gpuarr_from_host(dev, in, 1, shape, &a));
    int iout[4] = {0};
    TEST_OK(gpuarr_to_host(a, iout, 4));
    cr_expect_eq(iout[0], 1);
    cr_expect_eq(iout[1], -2);
    cr_expect_eq(iout[2], INT32_MAX, "3e10f -> int saturates, got %d", iout[2]);
    cr_expect_eq(iout[3], 0);
    double dout[4] = {0};
    TEST_OK(gpuarr_to_host(a, dout, 4));
    for (int i = 0; i < 4; i++)
        cr_expect_eq(test_f64_bits(dout[i]), test_f64_bits((double)in[i]), "double[%d] = %g", i,
                     dout[i]);
    bool bout[4] = {false, false, false, true};
    TEST_OK(gpuarr_to_host(a, bout, 4));
    cr_expect(bout[0] && bout[1] && bout[2] && !bout[3], "bool: %d %d %d %d", bout[0], bout[1],
              bout[2], bout[3]);
    unsigned char ubytes[4];
    TEST_OK(gpuarr_to_host(a, ubytes, 4));
    cr_expect(ubytes[0] == 1 && ubytes[1] == 0 && ubytes[2] == 255 && ubytes[3] == 0,
              "u8: %u %u %u %u (negative saturates to 0, large to 255)", ubytes[0], ubytes[1],
              ubytes[2], ubytes[3]);
    TEST_OK(gpuarr_release(a));
}

/* ---------------------------------------------------------------------------------------------
 * Conversions between the test device and the host
 * ------------------------------------------------------------------------------------------- */
Test(roundtrip, convert_device_to_host_and_back_keeps_every_dtype) {
    gpuarr_device dev = test_device();
    gpuarr_device host = gpuarr_host();
    cr_assert_neq(host.id, 0u, "gpuarr_host() is {0} after init");
    test_rng rng = {7};
    for (int t = TEST_FIRST_DTYPE; t <= TEST_LAST_DTYPE; t++) {
        gpuarr_dtype dt = (gpuarr_dtype)t;
        int64_t shape[2] = {13, 9};
        size_t n = 13 * 9, sz = test_dtype_bytes(dt);
        unsigned char in[13 * 9 * 8];
        test_fill_random(dt, in, n, &rng);
        gpuarr_array a = {0}, h = {0}, back = {0};
        TEST_OK(gpuarr_from_host_as(dev, dt, in, 2, shape, &a));
        TEST_OK(gpuarr_convert(a, host, GPUARR_DTYPE_INVALID, &h));
        gpuarr_array_info info;
        TEST_OK(gpuarr_array_get_info(h, &info));
        cr_expect_eq(info.device.id, host.id, "%s: converted array not on the host",
                     test_dtype_str(dt));
        cr_expect_eq(info.dtype, dt);
        cr_expect(info.host_accessible, "%s: host array not host_accessible", test_dtype_str(dt));
        void *p = NULL;
        TEST_OK(gpuarr_host_data(h, &p));
        cr_assert_not_null(p);
        cr_expect(memcmp(p, in, n * sz) == 0, "%s: device -> host bytes differ", test_dtype_str(dt));
        TEST_OK(gpuarr_convert(h, dev, dt, &back));
        TEST_OK(gpuarr_array_get_info(back, &info));
        cr_expect_eq(info.device.id, dev.id);
        test_expect_array_bytes(back, dt, in, n, test_dtype_str(dt));
        TEST_OK(gpuarr_release(a));
        TEST_OK(gpuarr_release(h));
        TEST_OK(gpuarr_release(back));
    }
}

Test(roundtrip, host_data_points_at_the_elements_of_host_arrays_only) {
    gpuarr_device dev = test_device();
    gpuarr_device host = gpuarr_host();
    double in[3] = {1, 2, 3};
    int64_t shape[1] = {3};
    gpuarr_array h = {0}, d = {0};
    TEST_OK(gpuarr_from_host(host, in, 1, shape, &h));
    void *p = NULL;
    TEST_OK(gpuarr_host_data(h, &p));
    cr_assert_not_null(p);
    cr_expect(memcmp(p, in, sizeof in) == 0);
    cr_expect_eq((uintptr_t)p % 8, 0u, "host data not aligned to its itemsize: %p", p);
    TEST_OK(gpuarr_from_host(dev, in, 1, shape, &d));
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(d, &info));
    void *q = (void *)&q;
    gpuarr_result r = gpuarr_host_data(d, &q);
    if (info.host_accessible) {
        cr_expect_eq(r, GPUARR_OK, "host_accessible array: gpuarr_host_data = %s",
                     gpuarr_result_name(r));
    } else {
        cr_expect_eq(r, GPUARR_ERROR_UNSUPPORTED, "device array: gpuarr_host_data = %s",
                     gpuarr_result_name(r));
        cr_expect_eq(q, (void *)&q, "gpuarr_host_data wrote *out on failure");
    }
    TEST_OK(gpuarr_release(h));
    TEST_OK(gpuarr_release(d));
}

/* ---------------------------------------------------------------------------------------------
 * Identity conversion
 * ------------------------------------------------------------------------------------------- */
static uint32_t refcount_of(gpuarr_array a) {
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(a, &info));
    return info.refcount;
}

static void check_identity_convert(gpuarr_dtype keep) {
    gpuarr_device dev = test_device();
    float in[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    gpuarr_array a = {0}, b = {0};
    TEST_OK(gpuarr_from_host(dev, in, 1, shape, &a));
    cr_assert_eq(refcount_of(a), 1u);
    TEST_OK(gpuarr_convert(a, dev, keep, &b));
    cr_assert_eq(b.id, a.id, "convert(same device, dtype %d) made a new handle", (int)keep);
    cr_assert_eq(refcount_of(a), 2u, "identity convert did not retain: refcount %u",
                 refcount_of(a));
    TEST_OK(gpuarr_release(a));
    cr_assert_eq(refcount_of(b), 1u);
    test_expect_array_bytes(b, GPUARR_F32, in, 4, "after one release");
    TEST_OK(gpuarr_release(b));
    gpuarr_result r = gpuarr_release(b);
    cr_assert_eq(r, GPUARR_ERROR_INVALID_HANDLE, "third release = %s", gpuarr_result_name(r));
}

Test(roundtrip, identity_convert_with_dtype_0_returns_the_same_handle_retained) {
    check_identity_convert(GPUARR_DTYPE_INVALID);
}

Test(roundtrip, identity_convert_with_the_same_dtype_returns_the_same_handle_retained) {
    check_identity_convert(GPUARR_F32);
}

Test(roundtrip, convert_with_a_dtype_change_makes_a_new_array) {
    gpuarr_device dev = test_device();
    float in[4] = {1, 2, 3, 4};
    double want[4] = {1, 2, 3, 4}, got[4];
    int64_t shape[1] = {4};
    gpuarr_array a = {0}, b = {0};
    TEST_OK(gpuarr_from_host(dev, in, 1, shape, &a));
    TEST_OK(gpuarr_convert(a, dev, GPUARR_F64, &b));
    cr_assert_neq(b.id, a.id);
    cr_expect_eq(refcount_of(a), 1u);
    cr_expect_eq(refcount_of(b), 1u);
    cr_expect_eq(dtype_of(b), GPUARR_F64);
    TEST_OK(gpuarr_to_host(b, got, 4));
    cr_expect(memcmp(got, want, sizeof want) == 0);
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
}

/* ---------------------------------------------------------------------------------------------
 * gpuarr_wrap_host
 * ------------------------------------------------------------------------------------------- */
typedef struct release_log {
    int calls;
    void *data;
    void *user;
} release_log;

static void on_release(void *data, void *user) {
    release_log *log = user;
    log->calls++;
    log->data = data;
    log->user = user;
}

Test(roundtrip, wrap_host_adopts_memory_without_copying_and_releases_it_once) {
    gpuarr_device dev = test_device();
    double *buf = malloc(6 * sizeof *buf);
    cr_assert_not_null(buf);
    for (int i = 0; i < 6; i++) buf[i] = i * 1.5 - 2;
    release_log log = {0, NULL, NULL};
    int64_t shape[2] = {2, 3};
    gpuarr_array a = {0}, f = {0};
    TEST_OK(gpuarr_wrap_host(buf, GPUARR_F64, 2, shape, on_release, &log, &a));
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(a, &info));
    cr_expect(info.wrapped, "info.wrapped not set");
    cr_expect(info.host_accessible);
    cr_expect_eq(info.device.id, gpuarr_host().id);
    cr_expect_eq(info.count, 6);
    cr_expect_eq(info.nbytes, 48u);
    void *p = NULL;
    TEST_OK(gpuarr_host_data(a, &p));
    cr_expect_eq(p, (void *)buf, "gpuarr_host_data %p is not the wrapped pointer %p", p,
                 (void *)buf);
    /* a converted copy on the test device has the values */
    TEST_OK(gpuarr_convert(a, dev, GPUARR_F32, &f));
    float fv[6];
    TEST_OK(gpuarr_to_host(f, fv, 6));
    for (int i = 0; i < 6; i++) cr_expect_eq(fv[i], (float)(i * 1.5 - 2));
    /* extra references delay the callback until the last one goes */
    TEST_OK(gpuarr_retain(a));
    TEST_OK(gpuarr_release(a));
    cr_expect_eq(log.calls, 0, "release callback ran while a reference was left");
    TEST_OK(gpuarr_release(a));
    cr_expect_eq(log.calls, 1, "release callback ran %d times on the last release", log.calls);
    cr_expect_eq(log.data, (void *)buf, "callback data %p, want %p", log.data, (void *)buf);
    cr_expect_eq(log.user, (void *)&log, "callback user_data wrong");
    /* the converted array is independent of the wrapped memory */
    TEST_OK(gpuarr_release(f));
    cr_expect_eq(log.calls, 1, "release callback ran again: %d", log.calls);
    gpuarr_shutdown();
    cr_expect_eq(log.calls, 1, "release callback ran again at shutdown: %d", log.calls);
    free(buf);
    TEST_OK(gpuarr_init(NULL)); /* for the .fini shutdown */
}

Test(roundtrip, wrap_host_identity_convert_shares_the_wrapped_array) {
    float *buf = malloc(4 * sizeof *buf);
    cr_assert_not_null(buf);
    for (int i = 0; i < 4; i++) buf[i] = (float)i;
    release_log log = {0, NULL, NULL};
    int64_t shape[1] = {4};
    gpuarr_array a = {0}, b = {0};
    TEST_OK(gpuarr_wrap_host(buf, GPUARR_F32, 1, shape, on_release, &log, &a));
    TEST_OK(gpuarr_convert(a, gpuarr_host(), GPUARR_F32, &b));
    cr_expect_eq(b.id, a.id);
    TEST_OK(gpuarr_release(a));
    cr_expect_eq(log.calls, 0);
    void *p = NULL;
    TEST_OK(gpuarr_host_data(b, &p));
    cr_expect_eq(p, (void *)buf);
    TEST_OK(gpuarr_release(b));
    cr_expect_eq(log.calls, 1, "callback calls %d", log.calls);
    free(buf);
}

Test(roundtrip, wrap_host_of_an_empty_array_accepts_null_and_still_calls_release) {
    release_log log = {0, NULL, NULL};
    int64_t shape[2] = {4, 0};
    gpuarr_array a = {0};
    TEST_OK(gpuarr_wrap_host(NULL, GPUARR_F32, 2, shape, on_release, &log, &a));
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(a, &info));
    cr_expect_eq(info.count, 0);
    cr_expect_eq(info.nbytes, 0u);
    TEST_OK(gpuarr_release(a));
    cr_expect_eq(log.calls, 1);
    cr_expect_null(log.data);
}

Test(roundtrip, wrap_host_with_a_null_release_function_works) {
    int32_t buf[3] = {1, 2, 3};
    int64_t shape[1] = {3};
    gpuarr_array a = {0};
    TEST_OK(gpuarr_wrap_host(buf, GPUARR_I32, 1, shape, NULL, NULL, &a));
    test_expect_array_bytes(a, GPUARR_I32, buf, 3, "wrapped i32");
    TEST_OK(gpuarr_release(a));
}

Test(roundtrip, wrap_host_that_fails_never_calls_release) {
    release_log log = {0, NULL, NULL};
    _Alignas(8) unsigned char storage[64];
    memset(storage, 0, sizeof storage);
    int64_t shape[1] = {4};
    int64_t shape9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    int64_t negshape[2] = {2, -1};
    gpuarr_array a = {0xdeadbeefu};
    gpuarr_result r;

    r = gpuarr_wrap_host(storage, GPUARR_DTYPE_INVALID, 1, shape, on_release, &log, &a);
    cr_expect_eq(r, GPUARR_ERROR_INVALID_ARGUMENT, "dtype 0: %s", gpuarr_result_name(r));
    r = gpuarr_wrap_host(storage, (gpuarr_dtype)99, 1, shape, on_release, &log, &a);
    cr_expect_eq(r, GPUARR_ERROR_INVALID_ARGUMENT, "dtype 99: %s", gpuarr_result_name(r));
    r = gpuarr_wrap_host(storage + 1, GPUARR_F32, 1, shape, on_release, &log, &a);
    cr_expect_eq(r, GPUARR_ERROR_INVALID_ARGUMENT, "misaligned f32: %s", gpuarr_result_name(r));
    r = gpuarr_wrap_host(storage + 4, GPUARR_F64, 1, shape, on_release, &log, &a);
    cr_expect_eq(r, GPUARR_ERROR_INVALID_ARGUMENT, "f64 at 4 bytes: %s", gpuarr_result_name(r));
    r = gpuarr_wrap_host(storage, GPUARR_F32, 9, shape9, on_release, &log, &a);
    cr_expect_eq(r, GPUARR_ERROR_INVALID_ARGUMENT, "ndim 9: %s", gpuarr_result_name(r));
    r = gpuarr_wrap_host(storage, GPUARR_F32, 2, negshape, on_release, &log, &a);
    cr_expect_eq(r, GPUARR_ERROR_INVALID_ARGUMENT, "negative dim: %s", gpuarr_result_name(r));
    r = gpuarr_wrap_host(NULL, GPUARR_F32, 1, shape, on_release, &log, &a);
    cr_expect_eq(r, GPUARR_ERROR_INVALID_ARGUMENT, "NULL data: %s", gpuarr_result_name(r));
    r = gpuarr_wrap_host(storage, GPUARR_F32, 1, shape, on_release, &log, NULL);
    cr_expect_eq(r, GPUARR_ERROR_INVALID_ARGUMENT, "NULL out: %s", gpuarr_result_name(r));
    cr_expect_eq(a.id, 0xdeadbeefu, "failed wrap_host wrote *out");
    cr_expect_eq(log.calls, 0, "release callback called %d times by failed wrap_host", log.calls);
    gpuarr_shutdown();
    cr_expect_eq(log.calls, 0, "release callback called at shutdown after failed wrap_host");
    TEST_OK(gpuarr_init(NULL));
}
