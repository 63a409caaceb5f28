/*
 * test_casts.c -- the 13x13 cast table against an independent reference (test_common.h), on
 * edge values of every source dtype (every one of the 65536 f16 and bf16 bit patterns), through
 * every route a cast can take: on the test device, device -> host, host -> device, and
 * gpuarr_to_host_as with a dtype. Plus hand-computed expectations (which also check the
 * reference itself) and large arrays for the threaded / vectorized paths.
 */
#include "test_common.h"

TestSuite(casts, .init = test_setup, .fini = test_teardown);

/* ---------------------------------------------------------------------------------------------
 * Edge inputs
 * ------------------------------------------------------------------------------------------- */
#define P2(n) (1ull << (n))
/* Raw 64-bit values; each integer dtype takes them truncated to its width (so every type sees
   its own 0, 1, -1, max, min, max+1 ...). */
static const uint64_t int_edges[] = {
    0, 1, (uint64_t)-1, 2, (uint64_t)-2, 3, 100, (uint64_t)-100, 127, 128, (uint64_t)-128,
    (uint64_t)-129, 255, 256, 257, 1000, 2047, 2048, 2049, 2050, 2051, 4097, 32767, 32768,
    (uint64_t)-32767, (uint64_t)-32768, (uint64_t)-32769, 65503, 65504, 65505, 65519, 65520, 65535,
    65536, (uint64_t)-65520, 0x00ffffff, 0x01000000, 0x01000001, 0x01000003, 0x01010000,
    0x01010001, 0x01030000, 0x0101ffff, 0x12345680, 0x7fffff80, 0x7fffffc0, 0x7fffffff,
    0x80000000, 0x80000001, 0xffffff80, 0xfffffffe, 0xffffffff, P2(32), P2(32) + 1,
    P2(53) - 1, P2(53), P2(53) + 1, P2(53) + 3, P2(53) + P2(29) + 1, P2(62) + P2(54),
    P2(62) + P2(54) + 1, P2(63) - 1, P2(63), P2(63) + 1, P2(63) + 1024, 0xfffffffffffff800ull,
    0xffffff7fffffffffull, 0xffffffff80000000ull, 0xffffffffffffffffull, 0x123456789abcdef0ull,
    0xfedcba9876543210ull, 0x8000008000000001ull,
};

static const double f64_edges[] = {
    0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 2.9, -2.9, 0.1, -0.1, 0.9999999,
    127.9, 128.0, -128.5, -129.0, 255.5, 256.0, -0.9, 32767.5, 32768.0, -32768.9, -32769.0,
    65535.9, 65536.0, 2147483647.5, 2147483648.0, -2147483648.5, -2147483649.0, 4294967295.5,
    4294967296.0, 0x1p63, -0x1p63, -0x1.0000000000001p63, 0x1p64, 0x1.fffffffffffffp63,
    -0x1p64, 9.2e18, -9.3e18, 1e19, 1e20, -1e20, 1e300, -1e300, 123456.789, 3.14159265358979,
    65504.0, 65519.99, 65520.0, -65520.0, 65536.0, 0x1p-24, 0x1p-25, -0x1p-25, 0x1.8p-24,
    0x1.0000000000001p-25, 0x1p-14, 0x1.ffcp-15, 0x1.ff8p-15, 0x1p-133, 0x1p-134, 0x1.8p-133,
    0x1p-126, 0x1p-149, 0x1p-150, 0x1.8p-149, 0x1.0000000000001p-150, 0x1.002p0, 0x1.006p0,
    0x1.0020000001p0, 0x1.01p0, 0x1.03p0, 0x1.0100004p0, 0x1.000001p0, 0x1.000003p0,
    0x1.0000010000001p0, 0x1.ffffffp127, 0x1.fffffefffffffp127, 0x1.fffffep127, 0x1p128,
    0x1.fep127, 0x1.ffp127, 16777217.0, 16777219.0, 0x1.0000000000001p0, 0x1.fffffffffffffp1023,
    -0x1.fffffffffffffp1023, 0x1p-1022, 0x1p-1074, -0x1p-1074, 0x0.fffffffffffffp-1022,
    1.0 / 3.0, -2.0 / 3.0, 1e-10, 6e-8, 3e-8, 1e10, -1e10,
};

static const uint64_t f64_nan_bits[] = {
    0x7ff0000000000000ull, 0xfff0000000000000ull, 0x7ff8000000000000ull, 0xfff8000000000000ull,
    0x7ff4000000000001ull, 0xfff0000000dead00ull, 0x7ffabcdef0123456ull, 0x7ff0000000000001ull,
    0xfff7ffffffffffffull, 0x7fffffffffffffffull,
};

static const uint32_t f32_bits_edges[] = {
    0x7fc00000, 0xffc00000, 0x7f800001, 0xff812345, 0x7fbfffff, 0x7fe00001, 0x7f800000,
    0xff800000, 0x7f7fffff, 0xff7fffff, 0x00000001, 0x80000001, 0x00400000, 0x807fffff,
    0x00800000, 0x3f808000, 0x3f818000, 0x3f808001, 0x7f7f8000, 0x7f7f7fff, 0x00008000,
    0x00018000, 0x00010000, 0x80008001, 0x3f801000, 0x3f803000, 0x3f801001, 0x477fefff,
    0x477ff000, 0x33800000, 0x33000000, 0x33000001, 0x33400000, 0x33c00000, 0x387fc000, 0x4f000000,
    0xcf000000, 0xcf000001, 0x4effffff, 0x5f800000, 0x5f7fffff, 0xdf000000, 0x5f000000,
    0xdf000001, 0x4f800000, 0x437f8000, 0x43000000, 0xc3010000, 0x477fffff, 0x80000000,
};

/* Every input of source dtype t: malloc'd, *n elements. */
static void *make_inputs(gpuarr_dtype t, size_t *n) {
    if (t == GPUARR_F16 || t == GPUARR_BF16) { /* exhaustive */
        uint16_t *v = malloc(65536 * 2);
        cr_assert_not_null(v);
        for (uint32_t i = 0; i < 65536; i++) v[i] = (uint16_t)i;
        *n = 65536;
        return v;
    }
    size_t sz = test_dtype_bytes(t), cap = 512, k = 0;
    unsigned char *v = malloc(cap * sz);
    cr_assert_not_null(v);
    if (t == GPUARR_BOOL) {
        static const unsigned char b[] = {0, 1, 2, 255, 0x80, 1, 0};
        for (size_t i = 0; i < sizeof b; i++) test_store_bits(t, v, k++, b[i]);
    } else if (t == GPUARR_F64) {
        for (size_t i = 0; i < sizeof f64_edges / sizeof f64_edges[0]; i++)
            test_store_bits(t, v, k++, test_f64_bits(f64_edges[i]));
        for (size_t i = 0; i < sizeof f64_nan_bits / sizeof f64_nan_bits[0]; i++)
            test_store_bits(t, v, k++, f64_nan_bits[i]);
        for (size_t i = 0; i < sizeof int_edges / sizeof int_edges[0]; i++) {
            test_store_bits(t, v, k++, test_f64_bits((double)int_edges[i]));
            test_store_bits(t, v, k++, test_f64_bits((double)(int64_t)int_edges[i]));
        }
    } else if (t == GPUARR_F32) {
        for (size_t i = 0; i < sizeof f64_edges / sizeof f64_edges[0]; i++)
            test_store_bits(t, v, k++, test_f32_bits((float)f64_edges[i]));
        for (size_t i = 0; i < sizeof f32_bits_edges / sizeof f32_bits_edges[0]; i++)
            test_store_bits(t, v, k++, f32_bits_edges[i]);
        for (size_t i = 0; i < sizeof int_edges / sizeof int_edges[0]; i++) {
            test_store_bits(t, v, k++, test_f32_bits((float)int_edges[i]));
            test_store_bits(t, v, k++, test_f32_bits((float)(int64_t)int_edges[i]));
        }
    } else {
        for (size_t i = 0; i < sizeof int_edges / sizeof int_edges[0]; i++)
            test_store_bits(t, v, k++, int_edges[i]);
    }
    cr_assert(k <= cap);
    *n = k;
    return v;
}

/* ---------------------------------------------------------------------------------------------
 * Comparison against the reference
 * ------------------------------------------------------------------------------------------- */
enum { MAX_PRINTED = 40 };

/* Number of elements of `got` (dtype d) that differ from the reference cast of `in` (dtype s).
   The first few are reported with src/dst dtype, input, got and expected bits. */
static size_t compare_with_reference(gpuarr_dtype s, const void *in, gpuarr_dtype d,
                                     const void *got, size_t n, const char *route,
                                     int *printed) {
    size_t bad = 0;
    int sw = (int)test_dtype_bytes(s) * 2, dw = (int)test_dtype_bytes(d) * 2;
    for (size_t i = 0; i < n; i++) {
        uint64_t sb = test_load_bits(s, in, i), gb = test_load_bits(d, got, i);
        uint64_t eb = ref_cast_bits(s, sb, d);
        /* A same-dtype bool copy of a non-canonical byte may keep it or normalize it to 1. */
        if (s == GPUARR_BOOL && d == GPUARR_BOOL && sb > 1 && (gb == sb || gb == 1)) continue;
        if (gb == eb) continue;
        bad++;
        if (*printed < MAX_PRINTED) {
            (*printed)++;
            cr_expect(false, "%s: %s -> %s: input 0x%0*" PRIx64 " got 0x%0*" PRIx64
                             " expected 0x%0*" PRIx64,
                      route, test_dtype_str(s), test_dtype_str(d), sw, sb, dw, gb, dw, eb);
        }
    }
    return bad;
}

static void expect_layout(gpuarr_array a, gpuarr_device dev, gpuarr_dtype t, int64_t n,
                          const char *what) {
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(a, &info));
    cr_expect_eq(info.device.id, dev.id, "%s: result on the wrong device", what);
    cr_expect_eq(info.dtype, t, "%s: result dtype %s, want %s", what, test_dtype_str(info.dtype),
                 test_dtype_str(t));
    cr_expect_eq(info.count, n, "%s: count %" PRId64, what, info.count);
}

typedef enum route {
    ROUTE_ON_DEVICE,      /* a on dev -> convert(dev, d) */
    ROUTE_DEVICE_TO_HOST, /* a on dev -> convert(host, d) */
    ROUTE_HOST_TO_DEVICE, /* a on host -> convert(dev, d) */
    ROUTE_TO_HOST_AS,     /* a on dev -> to_host_as(d) */
} route;

static const char *route_name(route r) {
    switch (r) {
    case ROUTE_ON_DEVICE: return "on device";
    case ROUTE_DEVICE_TO_HOST: return "device->host";
    case ROUTE_HOST_TO_DEVICE: return "host->device";
    default: return "to_host_as";
    }
}

/* Casts `in` (n elements of s) to d by route r; returns the bits in a malloc'd buffer. */
static void *cast_by_route(route r, gpuarr_device dev, gpuarr_dtype s, const void *in, size_t n,
                           gpuarr_dtype d) {
    gpuarr_device host = gpuarr_host();
    int64_t shape[1] = {(int64_t)n};
    size_t dsz = test_dtype_bytes(d);
    unsigned char *out = malloc(n * dsz + 8);
    cr_assert_not_null(out);
    memset(out, 0xcd, n * dsz + 8);
    char what[96];
    snprintf(what, sizeof what, "%s %s -> %s", route_name(r), test_dtype_str(s),
             test_dtype_str(d));
    gpuarr_array a = {0}, b = {0};
    gpuarr_device src_dev = r == ROUTE_HOST_TO_DEVICE ? host : dev;
    gpuarr_result res = gpuarr_from_host_as(src_dev, s, in, 1, shape, &a);
    cr_assert_eq(res, GPUARR_OK, "%s: from_host_as = %s: %s", what, gpuarr_result_name(res),
                 gpuarr_last_error());
    if (r == ROUTE_TO_HOST_AS) {
        res = gpuarr_to_host_as(a, d, out, n);
        cr_assert_eq(res, GPUARR_OK, "%s: to_host_as = %s: %s", what, gpuarr_result_name(res),
                     gpuarr_last_error());
    } else {
        gpuarr_device dst_dev = r == ROUTE_DEVICE_TO_HOST ? host : dev;
        res = gpuarr_convert(a, dst_dev, d, &b);
        cr_assert_eq(res, GPUARR_OK, "%s: convert = %s: %s", what, gpuarr_result_name(res),
                     gpuarr_last_error());
        expect_layout(b, dst_dev, d, (int64_t)n, what);
        res = gpuarr_to_host_as(b, d, out, n);
        cr_assert_eq(res, GPUARR_OK, "%s: to_host_as = %s: %s", what, gpuarr_result_name(res),
                     gpuarr_last_error());
        TEST_OK(gpuarr_release(b));
    }
    /* the source is untouched by the cast */
    test_expect_array_bytes(a, s, in, n, what);
    TEST_OK(gpuarr_release(a));
    for (int i = 0; i < 8; i++)
        cr_assert_eq(out[n * dsz + (size_t)i], 0xcd, "%s: wrote past the end of the output", what);
    return out;
}

static void check_full_table(route r) {
    gpuarr_device dev = test_device();
    int printed = 0;
    size_t total_bad = 0, pairs_bad = 0;
    for (int s = TEST_FIRST_DTYPE; s <= TEST_LAST_DTYPE; s++) {
        size_t n = 0;
        void *in = make_inputs((gpuarr_dtype)s, &n);
        for (int d = TEST_FIRST_DTYPE; d <= TEST_LAST_DTYPE; d++) {
            void *out = cast_by_route(r, dev, (gpuarr_dtype)s, in, n, (gpuarr_dtype)d);
            size_t bad = compare_with_reference((gpuarr_dtype)s, in, (gpuarr_dtype)d, out, n,
                                                route_name(r), &printed);
            if (bad) {
                pairs_bad++;
                total_bad += bad;
                cr_log_error("%s: %s -> %s: %zu of %zu elements differ from the reference",
                             route_name(r), test_dtype_str((gpuarr_dtype)s),
                             test_dtype_str((gpuarr_dtype)d), bad, n);
            }
            free(out);
        }
        free(in);
    }
    cr_assert_eq(total_bad, 0, "%s: %zu elements in %zu of 169 dtype pairs differ",
                 route_name(r), total_bad, pairs_bad);
}

Test(casts, table_13x13_on_the_test_device_matches_the_reference) {
    check_full_table(ROUTE_ON_DEVICE);
}

Test(casts, table_13x13_device_to_host_matches_the_reference) {
    check_full_table(ROUTE_DEVICE_TO_HOST);
}

Test(casts, table_13x13_host_to_device_matches_the_reference) {
    check_full_table(ROUTE_HOST_TO_DEVICE);
}

Test(casts, table_13x13_to_host_as_with_a_dtype_matches_the_reference) {
    check_full_table(ROUTE_TO_HOST_AS);
}

Test(casts, bool_bytes_other_than_0_count_as_1) {
    gpuarr_device dev = test_device();
    unsigned char in[6] = {0, 1, 2, 0x80, 0xff, 0x7f};
    int64_t shape[1] = {6};
    gpuarr_array a = {0}, b = {0};
    TEST_OK(gpuarr_from_host_as(dev, GPUARR_BOOL, in, 1, shape, &a));
    TEST_OK(gpuarr_convert(a, dev, GPUARR_I32, &b));
    int32_t v[6];
    TEST_OK(gpuarr_to_host_as(b, GPUARR_I32, v, 6));
    int32_t want[6] = {0, 1, 1, 1, 1, 1};
    for (int i = 0; i < 6; i++)
        cr_expect_eq(v[i], want[i], "bool byte 0x%02x -> i32 %d", in[i], v[i]);
    double dv[6];
    TEST_OK(gpuarr_to_host_as(a, GPUARR_F64, dv, 6));
    for (int i = 0; i < 6; i++)
        cr_expect_eq(dv[i], (double)want[i], "bool byte 0x%02x -> f64 %g", in[i], dv[i]);
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
}

/* ---------------------------------------------------------------------------------------------
 * Hand-computed expectations: each one also checks the reference.
 * ------------------------------------------------------------------------------------------- */
typedef struct hand_case {
    gpuarr_dtype s;
    uint64_t sbits;
    double sval; /* used instead of sbits when s is F64 and use_val */
    bool use_val;
    gpuarr_dtype d;
    uint64_t want;
} hand_case;

#define HB(s, bits, d, want) {GPUARR_##s, (bits), 0.0, false, GPUARR_##d, (want)}
#define HV(val, d, want) {GPUARR_F64, 0, (val), true, GPUARR_##d, (want)}

static const hand_case hand_cases[] = {
    /* f64 -> f16: ties, no double rounding through f32, overflow, subnormals */
    HV(0x1.0020000001p0, F16, 0x3c01), HV(0x1.002p0, F16, 0x3c00), HV(0x1.006p0, F16, 0x3c02),
    HV(65504.0, F16, 0x7bff), HV(65519.99, F16, 0x7bff), HV(65520.0, F16, 0x7c00),
    HV(65536.0, F16, 0x7c00), HV(-65520.0, F16, 0xfc00), HV(0x1p-24, F16, 0x0001),
    HV(0x1p-25, F16, 0x0000), HV(0x1.8p-24, F16, 0x0002), HV(-0x1p-25, F16, 0x8000),
    HV(0x1.0000000000001p-25, F16, 0x0001), HV(0x1.ffcp-15, F16, 0x0400), HV(-0.0, F16, 0x8000),
    HV(1e300, F16, 0x7c00), HV(0x1p-1074, F16, 0x0000),
    /* f64 -> bf16 */
    HV(0x1.0100004p0, BF16, 0x3f81), HV(0x1.01p0, BF16, 0x3f80), HV(0x1.03p0, BF16, 0x3f82),
    HV(0x1.ffffffp127, BF16, 0x7f80), HV(-0.0, BF16, 0x8000), HV(0x1p-133, BF16, 0x0001),
    HV(0x1p-134, BF16, 0x0000), HV(0x1.8p-133, BF16, 0x0002),
    /* f64 -> f32 */
    HV(0x1.000001p0, F32, 0x3f800000), HV(0x1.000003p0, F32, 0x3f800002),
    HV(0x1.0000010000001p0, F32, 0x3f800001), HV(0x1p-150, F32, 0x00000000),
    HV(0x1.8p-149, F32, 0x00000002), HV(0x1.0000000000001p-150, F32, 0x00000001),
    HV(0x1p-149, F32, 0x00000001), HV(0x1.ffffffp127, F32, 0x7f800000),
    HV(0x1.fffffefffffffp127, F32, 0x7f7fffff), HV(-0.0, F32, 0x80000000),
    HV(-0x1p-1074, F32, 0x80000000),
    /* f64 -> integers: truncation, saturation */
    HV(255.5, U8, 255), HV(256.0, U8, 255), HV(-1.0, U8, 0), HV(-0.9, U8, 0), HV(127.9, I8, 127),
    HV(128.0, I8, 127), HV(-128.5, I8, 0x80), HV(-129.0, I8, 0x80),
    HV(2147483647.5, I32, 0x7fffffff), HV(2147483648.0, I32, 0x7fffffff),
    HV(-2147483648.5, I32, 0x80000000), HV(-2147483649.0, I32, 0x80000000),
    HV(4294967295.5, U32, 0xffffffff), HV(4294967296.0, U32, 0xffffffff),
    HV(0x1p63, I64, 0x7fffffffffffffffull), HV(-0x1p63, I64, 0x8000000000000000ull),
    HV(-0x1.0000000000001p63, I64, 0x8000000000000000ull), HV(0x1p64, U64, 0xffffffffffffffffull),
    HV(0x1.fffffffffffffp63, U64, 0xfffffffffffff800ull), HV(-0x1p63, U64, 0),
    HV(-2.5, I16, 0xfffe), HV(2.5, U16, 2), HV(65535.9, U16, 0xffff), HV(-32768.9, I16, 0x8000),
    HV(1e300, I32, 0x7fffffff), HV(-1e300, U32, 0), HV(-1e300, I64, 0x8000000000000000ull),
    HV(-0.0, I32, 0), HV(-0.0, BOOL, 0), HV(0x1p-1074, BOOL, 1), HV(0.5, I32, 0),
    HV(-0.5, I32, 0), HV(1.5, I32, 1), HV(-1.5, I32, 0xffffffff),
    /* f64 NaN / inf */
    HB(F64, 0x7ff4000000000001ull, F32, 0x7fe00000), HB(F64, 0x7ff4000000000001ull, F16, 0x7f00),
    HB(F64, 0x7ff4000000000001ull, BF16, 0x7fe0), HB(F64, 0x7ff4000000000001ull, I32, 0),
    HB(F64, 0x7ff4000000000001ull, BOOL, 1), HB(F64, 0xfff0000000000001ull, F32, 0xffc00000),
    HB(F64, 0xfff0000000000001ull, F16, 0xfe00), HB(F64, 0xfff8000000000000ull, U64, 0),
    HB(F64, 0x7ff0000000000000ull, U64, 0xffffffffffffffffull),
    HB(F64, 0xfff0000000000000ull, I64, 0x8000000000000000ull),
    HB(F64, 0xfff0000000000000ull, F16, 0xfc00), HB(F64, 0x7ff0000000000000ull, BF16, 0x7f80),
    HB(F64, 0x7ffabcdef0123456ull, F32, 0x7fd5e6f7),
    /* f32 -> bf16 */
    HB(F32, 0x3f808000, BF16, 0x3f80), HB(F32, 0x3f818000, BF16, 0x3f82),
    HB(F32, 0x3f808001, BF16, 0x3f81), HB(F32, 0x7f7f8000, BF16, 0x7f80),
    HB(F32, 0x7f7fffff, BF16, 0x7f80), HB(F32, 0xff7fffff, BF16, 0xff80),
    HB(F32, 0x00008000, BF16, 0x0000), HB(F32, 0x00018000, BF16, 0x0002),
    HB(F32, 0x00010000, BF16, 0x0001), HB(F32, 0x80008001, BF16, 0x8001),
    HB(F32, 0x7f800001, BF16, 0x7fc0), HB(F32, 0xff812345, BF16, 0xffc1),
    /* f32 -> f16 */
    HB(F32, 0x477ff000, F16, 0x7c00), HB(F32, 0x477fefff, F16, 0x7bff),
    HB(F32, 0x33000000, F16, 0x0000), HB(F32, 0x33000001, F16, 0x0001),
    HB(F32, 0x33400000, F16, 0x0001), HB(F32, 0x33c00000, F16, 0x0002), HB(F32, 0x3f801000, F16, 0x3c00),
    HB(F32, 0x3f803000, F16, 0x3c02), HB(F32, 0x3f801001, F16, 0x3c01),
    HB(F32, 0x7f800001, F16, 0x7e00), HB(F32, 0x00000001, F16, 0x0000),
    HB(F32, 0x80000001, F16, 0x8000),
    /* f32 -> integers */
    HB(F32, 0x4f000000, I32, 0x7fffffff), HB(F32, 0xcf000000, I32, 0x80000000),
    HB(F32, 0xcf000001, I32, 0x80000000), HB(F32, 0x7fc00000, I32, 0),
    HB(F32, 0xbfc00000, I32, 0xffffffff), HB(F32, 0x4039999a, I32, 2),
    HB(F32, 0x7f800000, U8, 0xff), HB(F32, 0xff800000, U8, 0),
    HB(F32, 0x5f800000, U64, 0xffffffffffffffffull), HB(F32, 0x5f7fffff, U64, 0xffffff0000000000ull),
    HB(F32, 0xdf000000, I64, 0x8000000000000000ull), HB(F32, 0x5f000000, I64, 0x7fffffffffffffffull),
    HB(F32, 0x80000000, BOOL, 0), HB(F32, 0x00000001, BOOL, 1), HB(F32, 0xffc00000, BOOL, 1),
    /* f32 -> f64 */
    HB(F32, 0xff812345, F64, 0xfff82468a0000000ull), HB(F32, 0x7f800001, F64, 0x7ff8000020000000ull),
    HB(F32, 0x00000001, F64, 0x36a0000000000000ull), HB(F32, 0x80000000, F64, 0x8000000000000000ull),
    /* f16 sources */
    HB(F16, 0x7bff, I16, 0x7fff), HB(F16, 0x7bff, U16, 0xffe0), HB(F16, 0x7bff, I8, 0x7f),
    HB(F16, 0x7bff, U8, 0xff), HB(F16, 0x7bff, I32, 0xffe0), HB(F16, 0xfbff, I16, 0x8000),
    HB(F16, 0xfbff, U32, 0), HB(F16, 0xfc00, I32, 0x80000000), HB(F16, 0x7e00, I32, 0),
    HB(F16, 0x7e00, BOOL, 1), HB(F16, 0x8000, BOOL, 0), HB(F16, 0x0001, F32, 0x33800000),
    HB(F16, 0x0001, F64, 0x3e70000000000000ull), HB(F16, 0x0001, BF16, 0x3380),
    HB(F16, 0x7d01, F32, 0x7fe02000), HB(F16, 0x7d01, BF16, 0x7fe0),
    HB(F16, 0xfd01, F64, 0xfffc040000000000ull), HB(F16, 0x3c01, BF16, 0x3f80),
    HB(F16, 0x3c04, BF16, 0x3f80), HB(F16, 0x3c0c, BF16, 0x3f82), HB(F16, 0x3c06, BF16, 0x3f81),
    HB(F16, 0x3e00, I32, 1), HB(F16, 0x4100, I32, 2), HB(F16, 0xc100, I32, 0xfffffffe),
    HB(F16, 0x3800, U8, 0), HB(F16, 0xb800, I8, 0), HB(F16, 0x8000, F32, 0x80000000),
    /* bf16 sources */
    HB(BF16, 0x4780, F16, 0x7c00), HB(BF16, 0x477f, F16, 0x7bf8), HB(BF16, 0x3380, F16, 0x0001),
    HB(BF16, 0x3300, F16, 0x0000), HB(BF16, 0x3340, F16, 0x0001), HB(BF16, 0xff81, F32, 0xffc10000),
    HB(BF16, 0x7f80, F16, 0x7c00), HB(BF16, 0x0001, F32, 0x00010000), HB(BF16, 0x0001, F16, 0x0000),
    HB(BF16, 0x4f00, I32, 0x7fffffff), HB(BF16, 0xcf00, I32, 0x80000000),
    HB(BF16, 0x5f80, U64, 0xffffffffffffffffull), HB(BF16, 0xdf00, I64, 0x8000000000000000ull),
    HB(BF16, 0x4f80, U32, 0xffffffff), HB(BF16, 0x4f7f, U32, 0xff000000),
    HB(BF16, 0x4f7f, I32, 0x7fffffff),
    /* integers -> floats, more bits than the target keeps */
    HB(I32, 0x01010001, BF16, 0x4b81), HB(U32, 0x01010000, BF16, 0x4b80),
    HB(U32, 0x01030000, BF16, 0x4b82), HB(I64, P2(62) + P2(54) + 1, BF16, 0x5e81),
    HB(I64, P2(62) + P2(54) + 1, F16, 0x7c00), HB(I64, P2(53) + P2(29) + 1, F32, 0x5a000001),
    HB(U64, P2(53) + P2(29) + 1, F32, 0x5a000001), HB(I32, 16777217, F32, 0x4b800000),
    HB(I32, 16777219, F32, 0x4b800002), HB(I64, P2(53) + 1, F64, 0x4340000000000000ull),
    HB(I64, P2(53) + 3, F64, 0x4340000000000002ull),
    HB(U64, 0xffffffffffffffffull, F32, 0x5f800000),
    HB(U64, 0xffffffffffffffffull, F64, 0x43f0000000000000ull),
    HB(U64, 0xffffffffffffffffull, F16, 0x7c00), HB(U64, 0xffffffffffffffffull, BF16, 0x5f80),
    HB(I64, 0x8000000000000000ull, F32, 0xdf000000), HB(I64, 0x8000000000000000ull, BF16, 0xdf00),
    HB(I64, 0x8000000000000000ull, F64, 0xc3e0000000000000ull), HB(I32, 2049, F16, 0x6800),
    HB(I32, 2051, F16, 0x6802), HB(I32, 65519, F16, 0x7bff), HB(I32, 65520, F16, 0x7c00),
    HB(I32, (uint32_t)-65520, F16, 0xfc00), HB(U8, 255, F16, 0x5bf8), HB(I8, 0x80, BF16, 0xc300),
    /* integers -> integers wrap */
    HB(I32, 0x12345680, I8, 0x80), HB(I32, 300, U8, 44), HB(I32, (uint32_t)-129, I8, 0x7f),
    HB(U64, 0xffffffff80000000ull, I32, 0x80000000), HB(I8, 0xff, U64, 0xffffffffffffffffull),
    HB(I8, 0xff, U16, 0xffff), HB(I16, 0x8000, I64, 0xffffffffffff8000ull),
    HB(U16, 0x8000, I64, 0x8000), HB(U32, 0xffffffff, I64, 0xffffffff),
    HB(I64, P2(32), I32, 0), HB(I64, P2(32), BOOL, 1), HB(I32, 256, BOOL, 1), HB(I32, 256, U8, 0),
    HB(U64, P2(63), I64, 0x8000000000000000ull), HB(I64, 0xffffffffffffffffull, U8, 0xff),
    /* bool sources */
    HB(BOOL, 2, I32, 1), HB(BOOL, 2, F32, 0x3f800000), HB(BOOL, 0x80, F16, 0x3c00),
    HB(BOOL, 255, BF16, 0x3f80), HB(BOOL, 255, F64, 0x3ff0000000000000ull), HB(BOOL, 0, F32, 0),
    HB(BOOL, 255, I64, 1), HB(BOOL, 1, I8, 1),
};
#define NHAND (sizeof hand_cases / sizeof hand_cases[0])

static uint64_t hand_src_bits(const hand_case *c) {
    return c->use_val ? test_f64_bits(c->sval) : c->sbits;
}

Test(casts, reference_agrees_with_hand_computed_values) {
    for (size_t i = 0; i < NHAND; i++) {
        const hand_case *c = &hand_cases[i];
        uint64_t got = ref_cast_bits(c->s, hand_src_bits(c), c->d);
        cr_expect_eq(got, c->want, "reference: case %zu %s 0x%" PRIx64 " -> %s: 0x%" PRIx64
                                   ", hand value 0x%" PRIx64,
                     i, test_dtype_str(c->s), hand_src_bits(c), test_dtype_str(c->d), got,
                     c->want);
    }
}

/* Compares the reference with the C compiler's own conversions where those are exactly
   specified on this platform (IEEE binary32/binary64, round to nearest, in-range integers). */
Test(casts, reference_agrees_with_c_conversions_on_random_values) {
    test_rng rng = {99};
    for (int i = 0; i < 200000; i++) {
        uint64_t b = test_rng_next(&rng);
        double x = test_f64_from_bits(b >> (i % 3 ? 0 : (i % 13)));
        if (isnan(x)) continue;
        uint64_t xb = test_f64_bits(x);
        float f = (float)x;
        cr_assert_eq(ref_cast_bits(GPUARR_F64, xb, GPUARR_F32), test_f32_bits(f),
                     "reference f64 0x%016" PRIx64 " -> f32", xb);
        cr_assert_eq(ref_cast_bits(GPUARR_F32, test_f32_bits(f), GPUARR_F64),
                     test_f64_bits((double)f), "reference f32 -> f64");
        int64_t iv = (int64_t)b >> (i % 64);
        uint64_t uv = b >> (i % 64);
        cr_assert_eq(ref_cast_bits(GPUARR_I64, (uint64_t)iv, GPUARR_F64), test_f64_bits((double)iv),
                     "reference i64 %" PRId64 " -> f64", iv);
        cr_assert_eq(ref_cast_bits(GPUARR_I64, (uint64_t)iv, GPUARR_F32), test_f32_bits((float)iv),
                     "reference i64 %" PRId64 " -> f32", iv);
        cr_assert_eq(ref_cast_bits(GPUARR_U64, uv, GPUARR_F64), test_f64_bits((double)uv),
                     "reference u64 %" PRIu64 " -> f64", uv);
        if (fabs(x) < 9e18)
            cr_assert_eq(ref_cast_bits(GPUARR_F64, xb, GPUARR_I64), (uint64_t)(int64_t)x,
                         "reference f64 %g -> i64", x);
        if (fabs(x) < 2e9)
            cr_assert_eq(ref_cast_bits(GPUARR_F64, xb, GPUARR_I32), (uint64_t)(uint32_t)(int32_t)x,
                         "reference f64 %g -> i32", x);
    }
}

Test(casts, hand_computed_values_on_every_route) {
    gpuarr_device dev = test_device();
    int printed = 0;
    size_t bad = 0;
    for (size_t i = 0; i < NHAND; i++) {
        const hand_case *c = &hand_cases[i];
        unsigned char in[8];
        test_store_bits(c->s, in, 0, hand_src_bits(c));
        for (int r = ROUTE_ON_DEVICE; r <= ROUTE_TO_HOST_AS; r++) {
            void *out = cast_by_route((route)r, dev, c->s, in, 1, c->d);
            uint64_t got = test_load_bits(c->d, out, 0);
            free(out);
            if (got == c->want) continue;
            bad++;
            if (printed++ < MAX_PRINTED)
                cr_expect(false, "%s: case %zu: %s 0x%" PRIx64 " -> %s: got 0x%" PRIx64
                                 ", expected 0x%" PRIx64,
                          route_name((route)r), i, test_dtype_str(c->s), hand_src_bits(c),
                          test_dtype_str(c->d), got, c->want);
        }
    }
    cr_assert_eq(bad, 0, "%zu hand-computed conversions wrong", bad);
}

/* ---------------------------------------------------------------------------------------------
 * Large arrays: the threaded, vectorized host path and the device kernels
 * ------------------------------------------------------------------------------------------- */
enum { LARGE_N = 3000000 };

static uint32_t random_f32_bits(test_rng *rng) {
    static const uint32_t specials[] = {
        0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001,
        0xff812345, 0x00000001, 0x807fffff, 0x3f808000, 0x3f818000, 0x477ff000, 0x477fefff,
        0x33000000, 0x33400000, 0x33c00000, 0x4f000000, 0xcf000000, 0xcf000001, 0x7f7fffff, 0x3f801000,
    };
    uint64_t r = test_rng_next(rng);
    switch (r & 7) {
    case 0: return (uint32_t)(r >> 32); /* any bit pattern */
    case 1: return specials[(r >> 8) % (sizeof specials / sizeof specials[0])];
    case 2: { /* ties and near-ties for f16 / bf16: low bits 1000.. or 0111.. or 1000..1 */
        uint32_t x = (uint32_t)(r >> 32);
        uint32_t low = (r >> 8) & 1 ? 0x8000u : 0x1000u; /* bf16 / f16 half ulp of normals */
        uint32_t m = (r >> 9) & 3;
        x = (x & ~(2 * low - 1)) | (m == 0 ? low : m == 1 ? low - 1 : low + 1);
        return x;
    }
    default: { /* magnitudes across the f16 / i32 ranges */
        int e = (int)((r >> 8) % 80) - 30; /* 2^-30 .. 2^49 */
        uint32_t mant = (uint32_t)(r >> 40) & 0x7fffff;
        uint32_t sign = (uint32_t)((r >> 16) & 1) << 31;
        return sign | (uint32_t)(e + 127) << 23 | mant;
    }
    }
}

static void check_large(gpuarr_device dev, gpuarr_dtype s, const void *in, gpuarr_dtype d,
                        const char *devname) {
    int64_t shape[1] = {LARGE_N};
    size_t dsz = test_dtype_bytes(d);
    char what[96];
    snprintf(what, sizeof what, "large %s -> %s on %s", test_dtype_str(s), test_dtype_str(d),
             devname);
    void *expected = malloc((size_t)LARGE_N * dsz);
    void *got = malloc((size_t)LARGE_N * dsz);
    cr_assert(expected && got);
    for (size_t i = 0; i < LARGE_N; i++)
        test_store_bits(d, expected, i, ref_cast_bits(s, test_load_bits(s, in, i), d));
    gpuarr_array a = {0}, b = {0};
    TEST_OK(gpuarr_from_host_as(dev, s, in, 1, shape, &a));
    /* convert on the device, then read back */
    TEST_OK(gpuarr_convert(a, dev, d, &b));
    memset(got, 0xcd, (size_t)LARGE_N * dsz);
    TEST_OK(gpuarr_to_host_as(b, d, got, LARGE_N));
    int printed = 0;
    size_t bad = compare_with_reference(s, in, d, got, LARGE_N, what, &printed);
    cr_expect_eq(bad, 0, "%s (convert): %zu of %d elements differ", what, bad, LARGE_N);
    /* cast while reading back */
    memset(got, 0xcd, (size_t)LARGE_N * dsz);
    TEST_OK(gpuarr_to_host_as(a, d, got, LARGE_N));
    bad = compare_with_reference(s, in, d, got, LARGE_N, what, &printed);
    cr_expect_eq(bad, 0, "%s (to_host_as): %zu of %d elements differ", what, bad, LARGE_N);
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
    free(expected);
    free(got);
}

static void large_on_test_device_and_host(gpuarr_dtype s, const void *in, gpuarr_dtype d) {
    gpuarr_device dev = test_device();
    check_large(dev, s, in, d, test_device_spec());
    if (!test_device_is_host(dev)) check_large(gpuarr_host(), s, in, d, "host");
}

static void large_f32_casts(void) {
    (void)test_device();
    uint32_t *in = malloc((size_t)LARGE_N * 4);
    cr_assert_not_null(in);
    test_rng rng = {2024};
    for (size_t i = 0; i < LARGE_N; i++) in[i] = random_f32_bits(&rng);
    large_on_test_device_and_host(GPUARR_F32, in, GPUARR_F16);
    large_on_test_device_and_host(GPUARR_F32, in, GPUARR_BF16);
    large_on_test_device_and_host(GPUARR_F32, in, GPUARR_I32);
    free(in);
}

static void large_f64_casts(void) {
    (void)test_device();
    uint64_t *in = malloc((size_t)LARGE_N * 8);
    cr_assert_not_null(in);
    test_rng rng = {77};
    for (size_t i = 0; i < LARGE_N; i++) {
        uint64_t r = test_rng_next(&rng);
        if ((r & 3) == 0) {
            in[i] = test_rng_next(&rng); /* any pattern */
        } else { /* magnitudes around the f32 range, subnormals included, many near-ties */
            int e = (int)((r >> 8) % 320) - 160;
            uint64_t mant = test_rng_next(&rng) & 0xfffffffffffffull;
            if ((r >> 20) & 1) mant = (mant & ~0x1fffffffull) | 0x10000000ull; /* f32 tie */
            in[i] = ((r >> 30) & 1) << 63 | (uint64_t)(e + 1023) << 52 | mant;
        }
    }
    large_on_test_device_and_host(GPUARR_F64, in, GPUARR_F32);
    free(in);
}

static void large_u8_casts(void) {
    (void)test_device();
    uint8_t *in = malloc(LARGE_N);
    cr_assert_not_null(in);
    test_rng rng = {5};
    for (size_t i = 0; i < LARGE_N; i++) in[i] = (uint8_t)test_rng_next(&rng);
    large_on_test_device_and_host(GPUARR_U8, in, GPUARR_F32);
    free(in);
}

Test(casts, large_f32_to_f16_bf16_and_i32_match_the_reference_element_by_element) {
    large_f32_casts();
}

Test(casts, large_f64_to_f32_matches_the_reference_element_by_element) { large_f64_casts(); }

Test(casts, large_u8_to_f32_matches_the_reference_element_by_element) { large_u8_casts(); }

/* Odd lengths around vector widths and thread chunk boundaries. */
Test(casts, lengths_around_vector_and_chunk_boundaries_convert_every_element) {
    gpuarr_device dev = test_device();
    static const size_t lens[] = {1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 63, 65, 127, 129, 255,
                                  257, 1023, 1025, 4095, 4097, 65535, 65537, 262143, 262145,
                                  1048575, 1048577};
    test_rng rng = {3};
    uint32_t *in = malloc(1048577 * 4);
    cr_assert_not_null(in);
    for (size_t i = 0; i < 1048577; i++) in[i] = random_f32_bits(&rng);
    int printed = 0;
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        size_t n = lens[k];
        static const gpuarr_dtype targets[] = {GPUARR_F16, GPUARR_BF16, GPUARR_F64, GPUARR_I16,
                                               GPUARR_U8};
        for (size_t j = 0; j < sizeof targets / sizeof targets[0]; j++) {
            void *out = cast_by_route(ROUTE_ON_DEVICE, dev, GPUARR_F32, in, n, targets[j]);
            char what[64];
            snprintf(what, sizeof what, "length %zu", n);
            size_t bad = compare_with_reference(GPUARR_F32, in, targets[j], out, n, what, &printed);
            cr_expect_eq(bad, 0, "length %zu f32 -> %s: %zu wrong", n,
                         test_dtype_str(targets[j]), bad);
            free(out);
        }
    }
    free(in);
}

/* Views at odd element offsets on both sides (gpuarr_copy between slices casts on the device):
   device kernels that convert several elements per work-item (OpenCL CPUs) start their runs at
   any offset, end in a partial run, and must not write outside the destination slice. */
static void check_slice_cast(gpuarr_device dev, gpuarr_dtype s, const void *in, size_t soff,
                             gpuarr_dtype d, size_t doff, size_t n, int *printed) {
    size_t ssz = test_dtype_bytes(s), dsz = test_dtype_bytes(d), dtotal = doff + n + 37;
    int64_t sshape[1] = {(int64_t)(soff + n + 21)}, dshape[1] = {(int64_t)dtotal};
    unsigned char *pattern = malloc(dtotal * dsz), *got = malloc(dtotal * dsz);
    cr_assert(pattern && got);
    memset(pattern, 0x5b, dtotal * dsz);
    gpuarr_array a, b, sa, sb;
    TEST_OK(gpuarr_from_host_as(dev, s, in, 1, sshape, &a));
    TEST_OK(gpuarr_from_host_as(dev, d, pattern, 1, dshape, &b));
    TEST_OK(gpuarr_slice(a, (int64_t)soff, (int64_t)(soff + n), &sa));
    TEST_OK(gpuarr_slice(b, (int64_t)doff, (int64_t)(doff + n), &sb));
    TEST_OK(gpuarr_copy(sb, sa));
    TEST_OK(gpuarr_to_host_as(b, d, got, dtotal));
    char what[96];
    snprintf(what, sizeof what, "slice [%zu, +%zu) -> [%zu, +%zu)", soff, n, doff, n);
    size_t bad = compare_with_reference(s, (const unsigned char *)in + soff * ssz, d, got + doff * dsz, n, what,
                                        printed);
    cr_expect_eq(bad, 0, "%s %s -> %s: %zu of %zu elements wrong", what, test_dtype_str(s),
                 test_dtype_str(d), bad, n);
    cr_expect(memcmp(got, pattern, doff * dsz) == 0, "%s: written before the destination slice", what);
    cr_expect(memcmp(got + (doff + n) * dsz, pattern, (dtotal - doff - n) * dsz) == 0,
              "%s: written after the destination slice", what);
    TEST_OK(gpuarr_release(sa));
    TEST_OK(gpuarr_release(sb));
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
    free(pattern);
    free(got);
}

Test(casts, slices_at_odd_offsets_convert_every_element_and_nothing_around_them) {
    gpuarr_device dev = test_device();
    enum { MAX_N = 70000, MAX_OFF = 64 };
    test_rng rng = {11};
    uint32_t *f32 = malloc((MAX_N + MAX_OFF) * 4);
    uint64_t *f64 = malloc((MAX_N + MAX_OFF) * 8);
    cr_assert(f32 && f64);
    for (size_t i = 0; i < MAX_N + MAX_OFF; i++) {
        f32[i] = random_f32_bits(&rng);
        f64[i] = (i & 1) ? test_rng_next(&rng) : (uint64_t)f32[i] << 29 ^ 0x3800000000000000ull;
    }
    static const size_t lens[] = {1, 2, 7, 15, 16, 17, 31, 33, 255, 4095, 4097, 65537};
    static const size_t offs[][2] = {{1, 0}, {0, 3}, {3, 5}, {17, 1}, {15, 16}, {33, 31}};
    static const gpuarr_dtype pairs[][2] = {{GPUARR_F32, GPUARR_F16}, {GPUARR_F32, GPUARR_F64},
                                            {GPUARR_F64, GPUARR_F32}, {GPUARR_F64, GPUARR_F16},
                                            {GPUARR_F32, GPUARR_BF16}, {GPUARR_F32, GPUARR_U8}};
    int printed = 0;
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++)
        for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
            const size_t *o = offs[(p + k) % (sizeof offs / sizeof offs[0])];
            const void *in = pairs[p][0] == GPUARR_F32 ? (const void *)f32 : (const void *)f64;
            check_slice_cast(dev, pairs[p][0], in, o[0], pairs[p][1], o[1], lens[k], &printed);
        }
    free(f32);
    free(f64);
}

/* ---------------------------------------------------------------------------------------------
 * The same checks with each host kernel set (GPUARR_HOST_ISA) and other worker thread counts
 * ------------------------------------------------------------------------------------------- */
TestSuite(casts_config, .fini = test_teardown);

static void init_with_env(const char *isa, const char *threads) {
    if (isa) setenv("GPUARR_HOST_ISA", isa, 1);
    if (threads) setenv("GPUARR_THREADS", threads, 1);
    gpuarr_result r = gpuarr_init(NULL);
    unsetenv("GPUARR_HOST_ISA");
    unsetenv("GPUARR_THREADS");
    if (r == GPUARR_ERROR_UNSUPPORTED)
        test_skip("GPUARR_HOST_ISA=%s is not available here: %s", isa ? isa : "(unset)",
                     gpuarr_last_error());
    cr_assert_eq(r, GPUARR_OK, "gpuarr_init with GPUARR_HOST_ISA=%s GPUARR_THREADS=%s: %s: %s",
                 isa ? isa : "(unset)", threads ? threads : "(unset)", gpuarr_result_name(r),
                 gpuarr_last_error());
}

static void all_checks(void) {
    check_full_table(ROUTE_ON_DEVICE);
    check_full_table(ROUTE_DEVICE_TO_HOST);
    check_full_table(ROUTE_TO_HOST_AS);
    large_f32_casts();
    large_f64_casts();
    large_u8_casts();
}

Test(casts_config, baseline_host_kernels_match_the_reference) {
    init_with_env("baseline", NULL);
    all_checks();
}

Test(casts_config, avx2_host_kernels_match_the_reference) {
    init_with_env("avx2", NULL);
    all_checks();
}

Test(casts_config, one_worker_thread_matches_the_reference) {
    init_with_env(NULL, "1");
    large_f32_casts();
    large_f64_casts();
}

Test(casts_config, seven_worker_threads_match_the_reference) {
    init_with_env(NULL, "7");
    large_f32_casts();
    large_u8_casts();
}
