/*
 * test_kernels.c -- portable kernels (GPUARR_KERNEL) on the test device: every parameter kind
 * and element type with scalars of each, views at odd offsets, 2-D and 3-D launches (a 3x3 box
 * blur against plain C), the same bits as the host for + - * / and sqrt in float and double,
 * `return` and gpuarr_size in a body, the order of a launch among streams, and every refusal
 * (which names its parameter and leaves the output as it was).
 */
#include "test_common.h"

#include <float.h>
#include <tgmath.h> /* a kernel file needs it: sqrt of a float is sqrtf, as on the devices */

TestSuite(kernels, .init = test_setup, .fini = test_teardown);

/* ---------------------------------------------------------------------------------------------
 * The kernels
 * ------------------------------------------------------------------------------------------- */
/* Every kind at once, for one element type: y = x + a, z = z - x (integer results kept in range
   of the type by the test's values, so that no conversion is implementation-defined). */
#define KINDS_KERNEL(T, sfx)                                                                   \
    GPUARR_KERNEL(kinds_##sfx, (GPUARR_SCALAR(T, a), GPUARR_IN(T, x), GPUARR_OUT(T, y), GPUARR_INOUT(T, z)), { \
        int64_t i = gpuarr_index(0);                                                           \
        y[i] = (T)(x[i] + a);                                                                  \
        z[i] = (T)(z[i] - x[i]);                                                               \
    })
KINDS_KERNEL(int8_t, i8)
KINDS_KERNEL(uint8_t, u8)
KINDS_KERNEL(int16_t, i16)
KINDS_KERNEL(uint16_t, u16)
KINDS_KERNEL(int32_t, i32)
KINDS_KERNEL(uint32_t, u32)
KINDS_KERNEL(int64_t, i64)
KINDS_KERNEL(uint64_t, u64)
KINDS_KERNEL(float, f32)
KINDS_KERNEL(double, f64)

/* f16 and bf16 through the load/store helpers; the scalar read the same way */
GPUARR_KERNEL(kinds_f16, (GPUARR_SCALAR(gpuarr_f16, a), GPUARR_IN(gpuarr_f16, x), GPUARR_OUT(gpuarr_f16, y), GPUARR_INOUT(gpuarr_f16, z)), {
    int64_t i = gpuarr_index(0);
    gpuarr_store_f16(y, i, gpuarr_load_f16(x, i) + gpuarr_load_f16(&a, 0));
    gpuarr_store_f16(z, i, gpuarr_load_f16(z, i) * 3.0f - gpuarr_load_f16(x, i));
})
GPUARR_KERNEL(kinds_bf16, (GPUARR_SCALAR(gpuarr_bf16, a), GPUARR_IN(gpuarr_bf16, x), GPUARR_OUT(gpuarr_bf16, y), GPUARR_INOUT(gpuarr_bf16, z)), {
    int64_t i = gpuarr_index(0);
    gpuarr_store_bf16(y, i, gpuarr_load_bf16(x, i) + gpuarr_load_bf16(&a, 0));
    gpuarr_store_bf16(z, i, gpuarr_load_bf16(z, i) * 3.0f - gpuarr_load_bf16(x, i));
})

/* scalars of every width side by side (argument packing and alignment), read back exactly */
GPUARR_KERNEL(mixed_scalars, (GPUARR_SCALAR(int8_t, c), GPUARR_SCALAR(uint64_t, u), GPUARR_SCALAR(uint16_t, h), GPUARR_SCALAR(double, d),
                              GPUARR_SCALAR(int32_t, w), GPUARR_SCALAR(gpuarr_bf16, b), GPUARR_SCALAR(float, f), GPUARR_SCALAR(int64_t, q),
                              GPUARR_SCALAR(uint8_t, e), GPUARR_OUT(uint64_t, bits)), {
    int64_t i = gpuarr_index(0);
    if (i == 0) bits[0] = (uint64_t)(int64_t)c;
    if (i == 1) bits[1] = u;
    if (i == 2) bits[2] = h;
    if (i == 3) bits[3] = (uint64_t)(int64_t)(d * 4.0);
    if (i == 4) bits[4] = (uint64_t)(int64_t)w;
    if (i == 5) bits[5] = (uint64_t)(int64_t)(gpuarr_load_bf16(&b, 0) * 2.0f);
    if (i == 6) bits[6] = (uint64_t)(int64_t)(f * 8.0f);
    if (i == 7) bits[7] = (uint64_t)q;
    if (i == 8) bits[8] = e;
})

/* the most parameters a kernel may have */
GPUARR_KERNEL(sixteen, (GPUARR_IN(int32_t, a0), GPUARR_SCALAR(int32_t, s0), GPUARR_IN(int32_t, a1), GPUARR_SCALAR(int32_t, s1),
                        GPUARR_IN(int32_t, a2), GPUARR_SCALAR(int32_t, s2), GPUARR_IN(int32_t, a3), GPUARR_SCALAR(int32_t, s3),
                        GPUARR_IN(int32_t, a4), GPUARR_SCALAR(int32_t, s4), GPUARR_IN(int32_t, a5), GPUARR_SCALAR(int32_t, s5),
                        GPUARR_IN(int32_t, a6), GPUARR_SCALAR(int32_t, s6), GPUARR_IN(int32_t, a7), GPUARR_OUT(int32_t, out)), {
    int64_t i = gpuarr_index(0);
    out[i] = a0[i] * s0 + a1[i] * s1 + a2[i] * s2 + a3[i] * s3 + a4[i] * s4 + a5[i] * s5 + a6[i] * s6 + a7[i];
})

/* views: y = 2x + 1 in three widths */
GPUARR_KERNEL(twice_u8, (GPUARR_IN(uint8_t, x), GPUARR_OUT(uint8_t, y)), {
    int64_t i = gpuarr_index(0);
    y[i] = (uint8_t)(x[i] * 2 + 1);
})
GPUARR_KERNEL(twice_f16, (GPUARR_IN(gpuarr_f16, x), GPUARR_OUT(gpuarr_f16, y)), {
    int64_t i = gpuarr_index(0);
    gpuarr_store_f16(y, i, gpuarr_load_f16(x, i) * 2.0f + 1.0f);
})
GPUARR_KERNEL(twice_f32, (GPUARR_IN(float, x), GPUARR_OUT(float, y)), {
    int64_t i = gpuarr_index(0);
    y[i] = x[i] * 2.0f + 1.0f;
})
GPUARR_KERNEL(twice_f64, (GPUARR_IN(double, x), GPUARR_OUT(double, y)), {
    int64_t i = gpuarr_index(0);
    y[i] = x[i] * 2.0 + 1.0;
})

/* a 3x3 box blur, the border clamped; the same order of additions as blur_reference */
GPUARR_KERNEL(blur3, (GPUARR_IN(float, in), GPUARR_OUT(float, out)), {
    int64_t x = gpuarr_index(0), y = gpuarr_index(1), w = gpuarr_size(0), h = gpuarr_size(1);
    float s = 0.0f;
    for (int64_t dy = -1; dy <= 1; dy++)
        for (int64_t dx = -1; dx <= 1; dx++) {
            int64_t yy = y + dy < 0 ? 0 : y + dy >= h ? h - 1 : y + dy;
            int64_t xx = x + dx < 0 ? 0 : x + dx >= w ? w - 1 : x + dx;
            s += in[yy * w + xx];
        }
    out[y * w + x] = s / 9.0f;
})

/* every index of a 1-, 2- or 3-D space: its coordinates, and a count of visits */
GPUARR_KERNEL(coords, (GPUARR_OUT(int64_t, where), GPUARR_INOUT(int32_t, visits)), {
    int64_t i = gpuarr_index(0), j = gpuarr_index(1), k = gpuarr_index(2);
    int64_t at = (k * gpuarr_size(1) + j) * gpuarr_size(0) + i;
    where[at] = i + 1000 * j + 1000000 * k + 1000000000 * (gpuarr_size(0) + 10 * gpuarr_size(1) + 100 * gpuarr_size(2));
    visits[at] = visits[at] + 1;
})

/* `return` ends its own index only */
GPUARR_KERNEL(early_return, (GPUARR_OUT(int64_t, y)), {
    int64_t i = gpuarr_index(0);
    if (i % 3 == 0) return;
    y[i] = gpuarr_size(0);
})

/* + - * / sqrt and a * b + c, which an fma would round once instead of twice */
GPUARR_KERNEL(arith_f32, (GPUARR_IN(float, a), GPUARR_IN(float, b), GPUARR_IN(float, c), GPUARR_OUT(float, r)), {
    int64_t i = gpuarr_index(0);
    r[7 * i + 0] = a[i] + b[i];
    r[7 * i + 1] = a[i] - b[i];
    r[7 * i + 2] = a[i] * b[i];
    r[7 * i + 3] = a[i] / b[i];
    r[7 * i + 4] = sqrt(fabs(a[i]));
    r[7 * i + 5] = a[i] * b[i] + c[i];
    r[7 * i + 6] = a[i] * b[i] - c[i] * c[i];
})
GPUARR_KERNEL(arith_f64, (GPUARR_IN(double, a), GPUARR_IN(double, b), GPUARR_IN(double, c), GPUARR_OUT(double, r)), {
    int64_t i = gpuarr_index(0);
    r[7 * i + 0] = a[i] + b[i];
    r[7 * i + 1] = a[i] - b[i];
    r[7 * i + 2] = a[i] * b[i];
    r[7 * i + 3] = a[i] / b[i];
    r[7 * i + 4] = sqrt(fabs(a[i]));
    r[7 * i + 5] = a[i] * b[i] + c[i];
    r[7 * i + 6] = a[i] * b[i] - c[i] * c[i];
})

/* the refusals' kernel: a scalar, an input, an output */
GPUARR_KERNEL(scale, (GPUARR_SCALAR(float, s), GPUARR_IN(float, x), GPUARR_OUT(float, y)), {
    int64_t i = gpuarr_index(0);
    y[i] = s * x[i];
})

/* C that is neither OpenCL C nor CUDA C++: `private` is a keyword of both */
GPUARR_KERNEL(not_device_code, (GPUARR_OUT(int32_t, y)), {
    int private = 2;
    y[gpuarr_index(0)] = private;
})

/* ---------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------- */
static gpuarr_device_info device_info(gpuarr_device d) {
    gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(d, &info));
    return info;
}

static gpuarr_array make_1d(gpuarr_device d, gpuarr_dtype t, int64_t n, const void *data) {
    gpuarr_array a = {0};
    if (data) TEST_OK(gpuarr_from_host_as(d, t, data, 1, &n, &a));
    else TEST_OK(gpuarr_zeros(d, t, 1, &n, &a));
    return a;
}

/* a's nbytes bytes into buf */
static void read_bytes(gpuarr_array a, void *buf, size_t nbytes) {
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(a, &info));
    cr_assert_eq(info.nbytes, nbytes, "read_bytes: the array has %zu bytes, want %zu", info.nbytes, nbytes);
    TEST_OK(gpuarr_read(a, 0, info.count, GPUARR_DTYPE_INVALID, buf));
}

/* ---------------------------------------------------------------------------------------------
 * What GPUARR_KERNEL makes
 * ------------------------------------------------------------------------------------------- */
Test(kernels, the_macro_describes_the_parameters_and_keeps_the_body) {
    const gpuarr_kernel *k = &kinds_i16_gpuarr_kernel;
    cr_expect_str_eq(k->name, "kinds_i16");
    cr_assert_eq(k->nparams, 4);
    static const gpuarr_param_kind kinds[4] = {GPUARR_PARAM_SCALAR, GPUARR_PARAM_IN, GPUARR_PARAM_OUT, GPUARR_PARAM_INOUT};
    static const char *const names[4] = {"a", "x", "y", "z"};
    for (int i = 0; i < 4; i++) {
        cr_expect_eq(k->params[i].kind, kinds[i], "parameter %d", i);
        cr_expect_eq(k->params[i].dtype, GPUARR_I16, "parameter %d", i);
        cr_expect_str_eq(k->params[i].type, "int16_t");
        cr_expect_str_eq(k->params[i].name, names[i]);
    }
    cr_expect(strstr(k->body, "gpuarr_index(0)") != NULL, "the body's text is kept unexpanded: %s", k->body);
    cr_expect(strstr(k->body, "(int16_t)(x[i] + a)") != NULL, "the body's text: %s", k->body);
    cr_expect_not_null(k->host);
    cr_expect_eq(kinds_f16_gpuarr_kernel.params[0].dtype, GPUARR_F16);
    cr_expect_eq(kinds_bf16_gpuarr_kernel.params[3].dtype, GPUARR_BF16);
    cr_expect_eq(sixteen_gpuarr_kernel.nparams, GPUARR_KERNEL_MAX_PARAMS);
}

/* ---------------------------------------------------------------------------------------------
 * Every kind and element type
 * ------------------------------------------------------------------------------------------- */
enum { KN = 1000 };

/* kinds_<sfx> over KN elements: x[i] and z[i] from the given functions, a scalar; checks y and z
   against the same expressions in plain C. */
#define CHECK_KINDS(T, sfx, dt, xval, zval, aval)                                              \
    do {                                                                                       \
        T *xs = malloc(KN * sizeof(T)), *zs = malloc(KN * sizeof(T)), *ys = malloc(KN * sizeof(T)); \
        cr_assert(xs && zs && ys);                                                             \
        for (int64_t i = 0; i < KN; i++) xs[i] = (T)(xval), zs[i] = (T)(zval);                 \
        const T a = (T)(aval);                                                                 \
        gpuarr_array x = make_1d(dev, dt, KN, xs), y = make_1d(dev, dt, KN, NULL), z = make_1d(dev, dt, KN, zs); \
        TEST_OK(kinds_##sfx(NULL, a, x, y, z));                                                \
        read_bytes(y, ys, KN * sizeof(T));                                                     \
        for (int64_t i = 0; i < KN; i++) {                                                     \
            T want = (T)(xs[i] + a);                                                           \
            cr_assert(memcmp(&ys[i], &want, sizeof(T)) == 0, #T ": y[%lld] is wrong", (long long)i); \
        }                                                                                      \
        read_bytes(z, ys, KN * sizeof(T));                                                     \
        for (int64_t i = 0; i < KN; i++) {                                                     \
            T want = (T)(zs[i] - xs[i]);                                                       \
            cr_assert(memcmp(&ys[i], &want, sizeof(T)) == 0, #T ": z[%lld] is wrong", (long long)i); \
        }                                                                                      \
        TEST_OK(gpuarr_release(x));                                                            \
        TEST_OK(gpuarr_release(y));                                                            \
        TEST_OK(gpuarr_release(z));                                                            \
        free(xs), free(ys), free(zs);                                                          \
    } while (0)

Test(kernels, every_kind_and_integer_type_with_its_scalar) {
    gpuarr_device dev = test_device();
    CHECK_KINDS(int8_t, i8, GPUARR_I8, i % 101 - 50, i % 77 - 38, -27);
    CHECK_KINDS(uint8_t, u8, GPUARR_U8, i * 7, i * 13, 200); /* wraps: defined for unsigned */
    CHECK_KINDS(int16_t, i16, GPUARR_I16, i * 31 - 15000, 7 - i * 11, 1234);
    CHECK_KINDS(uint16_t, u16, GPUARR_U16, i * 977, i * 65, 65000);
    CHECK_KINDS(int32_t, i32, GPUARR_I32, i * 1000003 - 500000000, -i * 999, -123456789);
    CHECK_KINDS(uint32_t, u32, GPUARR_U32, (uint32_t)i * 2654435761u, (uint32_t)i * 40503u, 0xfffffff0u);
    /* above 2^53, where a trip through double would lose the low bits */
    CHECK_KINDS(int64_t, i64, GPUARR_I64, (int64_t)0x0123456789abcdefll - i * 0x100000001ll, i * 3 - (int64_t)0x4000000000000001ll,
                (int64_t)0x1000000000000003ll);
    CHECK_KINDS(uint64_t, u64, GPUARR_U64, 0xfedcba9876543210ull + (uint64_t)i * 0x9e3779b97f4a7c15ull, (uint64_t)i * 0x100000001ull,
                0x8000000000000001ull);
}

Test(kernels, every_kind_in_float_and_double_with_its_scalar) {
    gpuarr_device dev = test_device();
    CHECK_KINDS(float, f32, GPUARR_F32, (float)i * 0.37f - 100.0f, 1.0f / (float)(i + 1), 0.1f);
    CHECK_KINDS(double, f64, GPUARR_F64, (double)i * 0.37 - 100.0, 1.0 / (double)(i + 1), 0.1);
}

/* f16 and bf16: y = x + a and z = 3z - x, in float, rounded as gpuarr's conversions round */
#define CHECK_HALF(T, sfx, dt, from_float, to_float)                                           \
    do {                                                                                       \
        T xs[KN], zs[KN], ys[KN];                                                              \
        for (int i = 0; i < KN; i++) xs[i] = from_float((float)i * 0.731f - 300.0f), zs[i] = from_float(1.0f / (float)(i + 3)); \
        xs[5] = from_float(65504.0f), xs[6] = from_float(-1e-7f), xs[7] = from_float(1e30f);    \
        const T a = from_float(0.3f);                                                          \
        gpuarr_array x = make_1d(dev, dt, KN, xs), y = make_1d(dev, dt, KN, NULL), z = make_1d(dev, dt, KN, zs); \
        TEST_OK(kinds_##sfx(NULL, a, x, y, z));                                                \
        read_bytes(y, ys, sizeof ys);                                                          \
        for (int i = 0; i < KN; i++) {                                                         \
            float sum = to_float(xs[i]) + to_float(a);                                         \
            T want = from_float(sum);                                                          \
            cr_assert_eq(ys[i].bits, want.bits, #T ": y[%d] = 0x%04x, want 0x%04x", i, ys[i].bits, want.bits); \
        }                                                                                      \
        read_bytes(z, ys, sizeof ys);                                                          \
        for (int i = 0; i < KN; i++) {                                                         \
            volatile float t = to_float(zs[i]) * 3.0f; /* volatile: two roundings, as the kernel */ \
            T want = from_float(t - to_float(xs[i]));                                          \
            cr_assert_eq(ys[i].bits, want.bits, #T ": z[%d] = 0x%04x, want 0x%04x", i, ys[i].bits, want.bits); \
        }                                                                                      \
        TEST_OK(gpuarr_release(x));                                                            \
        TEST_OK(gpuarr_release(y));                                                            \
        TEST_OK(gpuarr_release(z));                                                            \
    } while (0)

Test(kernels, every_kind_in_f16_and_bf16_through_load_and_store) {
    gpuarr_device dev = test_device();
    CHECK_HALF(gpuarr_f16, f16, GPUARR_F16, gpuarr_f16_from_float, gpuarr_f16_to_float);
    CHECK_HALF(gpuarr_bf16, bf16, GPUARR_BF16, gpuarr_bf16_from_float, gpuarr_bf16_to_float);
}

Test(kernels, scalars_of_every_width_side_by_side) {
    gpuarr_device dev = test_device();
    gpuarr_array bits = make_1d(dev, GPUARR_U64, 9, NULL);
    TEST_OK(mixed_scalars(NULL, (int8_t)-100, 0xfedcba9876543211ull, (uint16_t)0xbeef, -1234.75, -2000000001, gpuarr_bf16_from_float(-96.5f),
                          3.125f, (int64_t)-0x7123456789abcdefll, (uint8_t)250, bits));
    uint64_t got[9];
    read_bytes(bits, got, sizeof got);
    const uint64_t want[9] = {(uint64_t)-100ll, 0xfedcba9876543211ull, 0xbeef, (uint64_t)-4939ll, (uint64_t)-2000000001ll, (uint64_t)-193ll, 25,
                              (uint64_t)-0x7123456789abcdefll, 250};
    for (int i = 0; i < 9; i++) cr_expect_eq(got[i], want[i], "scalar %d arrived as 0x%llx, want 0x%llx", i, (unsigned long long)got[i], (unsigned long long)want[i]);
    TEST_OK(gpuarr_release(bits));
}

Test(kernels, sixteen_parameters) {
    gpuarr_device dev = test_device();
    enum { N = 300 };
    int32_t v[8][N], out[N];
    gpuarr_array a[8];
    for (int k = 0; k < 8; k++) {
        for (int i = 0; i < N; i++) v[k][i] = (i + 1) * (k + 3) - 400;
        a[k] = make_1d(dev, GPUARR_I32, N, v[k]);
    }
    gpuarr_array o = make_1d(dev, GPUARR_I32, N, NULL);
    TEST_OK(sixteen(NULL, a[0], 1, a[1], -2, a[2], 3, a[3], -5, a[4], 7, a[5], -11, a[6], 13, a[7], o));
    read_bytes(o, out, sizeof out);
    static const int32_t s[7] = {1, -2, 3, -5, 7, -11, 13};
    for (int i = 0; i < N; i++) {
        int32_t want = v[7][i];
        for (int k = 0; k < 7; k++) want += v[k][i] * s[k];
        cr_assert_eq(out[i], want, "out[%d] = %d, want %d", i, out[i], want);
    }
    for (int k = 0; k < 8; k++) TEST_OK(gpuarr_release(a[k]));
    TEST_OK(gpuarr_release(o));
}

/* ---------------------------------------------------------------------------------------------
 * Views at odd offsets, as IN and as OUT
 * ------------------------------------------------------------------------------------------- */
enum { VN = 64, VLEN = 23 };

/* For each offset: twice_<T>(slice(x, off), slice(y, 7 - off + 1 ...)); y outside the view
   keeps its sentinel. */
#define CHECK_VIEWS(T, sfx, dt, val, twice)                                                    \
    do {                                                                                       \
        static const int64_t offs[3] = {1, 3, 7};                                              \
        T xs[VN], ys[VN], sentinel[VN];                                                        \
        for (int i = 0; i < VN; i++) xs[i] = val(i), sentinel[i] = val(200 + i);               \
        gpuarr_array x = make_1d(dev, dt, VN, xs);                                             \
        for (int o = 0; o < 3; o++) {                                                          \
            int64_t xo = offs[o], yo = offs[2 - o];                                            \
            gpuarr_array y = make_1d(dev, dt, VN, sentinel), xv, yv;                           \
            TEST_OK(gpuarr_slice(x, xo, xo + VLEN, &xv));                                      \
            TEST_OK(gpuarr_slice(y, yo, yo + VLEN, &yv));                                      \
            TEST_OK(twice_##sfx(NULL, xv, yv));                                                \
            read_bytes(y, ys, sizeof ys);                                                      \
            for (int64_t i = 0; i < VN; i++) {                                                 \
                T want = i >= yo && i < yo + VLEN ? twice(xs[i - yo + xo]) : sentinel[i];      \
                cr_assert(memcmp(&ys[i], &want, sizeof(T)) == 0, #T ": x at %lld, y at %lld: y[%lld] is wrong", (long long)xo, \
                          (long long)yo, (long long)i);                                        \
            }                                                                                  \
            TEST_OK(gpuarr_release(xv));                                                       \
            TEST_OK(gpuarr_release(yv));                                                       \
            TEST_OK(gpuarr_release(y));                                                        \
        }                                                                                      \
        TEST_OK(gpuarr_release(x));                                                            \
    } while (0)

static uint8_t u8_val(int i) { return (uint8_t)(i * 37 + 5); }
static uint8_t u8_twice(uint8_t v) { return (uint8_t)(v * 2 + 1); }
static gpuarr_f16 f16_val(int i) { return gpuarr_f16_from_float((float)i * 0.25f - 3.0f); }
static gpuarr_f16 f16_twice(gpuarr_f16 v) { return gpuarr_f16_from_float(gpuarr_f16_to_float(v) * 2.0f + 1.0f); }
static float f32_val(int i) { return (float)i * 0.1f - 2.0f; }
static float f32_twice(float v) {
    volatile float t = v * 2.0f;
    return t + 1.0f;
}
static double f64_val(int i) { return (double)i * 0.1 - 2.0; }
static double f64_twice(double v) {
    volatile double t = v * 2.0;
    return t + 1.0;
}

Test(kernels, views_at_odd_offsets_as_in_and_out) {
    gpuarr_device dev = test_device();
    CHECK_VIEWS(uint8_t, u8, GPUARR_U8, u8_val, u8_twice);
    CHECK_VIEWS(gpuarr_f16, f16, GPUARR_F16, f16_val, f16_twice);
    CHECK_VIEWS(float, f32, GPUARR_F32, f32_val, f32_twice);
    CHECK_VIEWS(double, f64, GPUARR_F64, f64_val, f64_twice);
}

Test(kernels, a_view_of_a_2d_array_and_the_same_view_in_and_out) {
    gpuarr_device dev = test_device();
    float v[9 * 5], back[9 * 5];
    for (int i = 0; i < 45; i++) v[i] = (float)i;
    int64_t shape[2] = {9, 5};
    gpuarr_array a, rows;
    TEST_OK(gpuarr_from_host_as(dev, GPUARR_F32, v, 2, shape, &a));
    TEST_OK(gpuarr_slice(a, 3, 7, &rows)); /* rows 3..6: 20 elements from element 15 */
    TEST_OK(twice_f32(NULL, rows, rows));  /* default launch: rows' 20 elements */
    read_bytes(a, back, sizeof back);
    for (int i = 0; i < 45; i++) {
        float want = i >= 15 && i < 35 ? f32_twice(v[i]) : v[i];
        cr_assert_eq(back[i], want, "element %d = %g, want %g", i, (double)back[i], (double)want);
    }
    TEST_OK(gpuarr_release(rows));
    TEST_OK(gpuarr_release(a));
}

/* ---------------------------------------------------------------------------------------------
 * 2-D and 3-D launches
 * ------------------------------------------------------------------------------------------- */
static void blur_reference(const float *in, float *out, int64_t w, int64_t h) {
    for (int64_t y = 0; y < h; y++)
        for (int64_t x = 0; x < w; x++) {
            volatile float s = 0.0f; /* volatile: no vectorized reassociation of the sum */
            for (int64_t dy = -1; dy <= 1; dy++)
                for (int64_t dx = -1; dx <= 1; dx++) {
                    int64_t yy = y + dy < 0 ? 0 : y + dy >= h ? h - 1 : y + dy;
                    int64_t xx = x + dx < 0 ? 0 : x + dx >= w ? w - 1 : x + dx;
                    s = s + in[yy * w + xx];
                }
            out[y * w + x] = s / 9.0f;
        }
}

Test(kernels, a_3x3_box_blur_in_2d_matches_plain_c) {
    gpuarr_device dev = test_device();
    enum { W = 67, H = 41 };
    float *img = malloc(W * H * sizeof *img), *want = malloc(W * H * sizeof *want), *got = malloc(W * H * sizeof *got);
    cr_assert(img && want && got);
    test_rng rng = {42};
    for (int i = 0; i < W * H; i++) img[i] = (float)(test_rng_next(&rng) % 256) / 7.0f;
    blur_reference(img, want, W, H);
    int64_t shape[2] = {H, W};
    gpuarr_array in, out;
    TEST_OK(gpuarr_from_host_as(dev, GPUARR_F32, img, 2, shape, &in));
    TEST_OK(gpuarr_zeros(dev, GPUARR_F32, 2, shape, &out));
    gpuarr_launch l = {.ndim = 2, .global = {W, H}};
    TEST_OK(blur3(&l, in, out));
    read_bytes(out, got, W * H * sizeof *got);
    for (int i = 0; i < W * H; i++)
        cr_assert(memcmp(&got[i], &want[i], sizeof(float)) == 0, "pixel (%d, %d) = %a, want %a", i % W, i / W, (double)got[i], (double)want[i]);
    TEST_OK(gpuarr_release(in));
    TEST_OK(gpuarr_release(out));
    free(img), free(want), free(got);
}

/* coords over g[0] x g[1] x g[2] in ndim dimensions: every index once, with its coordinates and
   the space's sizes */
static void check_coords(gpuarr_device dev, int ndim, int64_t g0, int64_t g1, int64_t g2) {
    int64_t n = g0 * g1 * g2;
    gpuarr_array where = make_1d(dev, GPUARR_I64, n, NULL), visits = make_1d(dev, GPUARR_I32, n, NULL);
    gpuarr_launch l = {.ndim = ndim, .global = {g0, ndim > 1 ? g1 : 0, ndim > 2 ? g2 : 0}};
    TEST_OK(coords(&l, where, visits));
    int64_t *w = malloc((size_t)n * sizeof *w);
    int32_t *v = malloc((size_t)n * sizeof *v);
    cr_assert(w && v);
    read_bytes(where, w, (size_t)n * sizeof *w);
    read_bytes(visits, v, (size_t)n * sizeof *v);
    int64_t sizes = 1000000000 * (g0 + 10 * g1 + 100 * g2);
    for (int64_t k = 0; k < g2; k++)
        for (int64_t j = 0; j < g1; j++)
            for (int64_t i = 0; i < g0; i++) {
                int64_t at = (k * g1 + j) * g0 + i;
                cr_assert_eq(v[at], 1, "%d-D %lldx%lldx%lld: index (%lld, %lld, %lld) ran %d times", ndim, (long long)g0, (long long)g1,
                             (long long)g2, (long long)i, (long long)j, (long long)k, v[at]);
                cr_assert_eq(w[at], i + 1000 * j + 1000000 * k + sizes, "%d-D: index (%lld, %lld, %lld) saw %lld", ndim, (long long)i,
                             (long long)j, (long long)k, (long long)w[at]);
            }
    free(w), free(v);
    TEST_OK(gpuarr_release(where));
    TEST_OK(gpuarr_release(visits));
}

Test(kernels, launches_in_1d_2d_and_3d_visit_every_index_once) {
    gpuarr_device dev = test_device();
    check_coords(dev, 1, 1001, 1, 1);
    check_coords(dev, 2, 37, 19, 1);
    check_coords(dev, 2, 1, 300, 1);
    check_coords(dev, 3, 13, 7, 5);
    check_coords(dev, 3, 1, 1, 77);
    check_coords(dev, 3, 300, 1, 2);
}

Test(kernels, return_ends_its_index_only_and_gpuarr_size_is_the_launch_size) {
    gpuarr_device dev = test_device();
    enum { N = 500 };
    gpuarr_array y = make_1d(dev, GPUARR_I64, N, NULL);
    gpuarr_launch l = {.ndim = 1, .global = {N - 100}}; /* the space, not the array, is the size */
    TEST_OK(early_return(&l, y));
    int64_t got[N];
    read_bytes(y, got, sizeof got);
    for (int i = 0; i < N; i++) {
        int64_t want = i >= N - 100 || i % 3 == 0 ? 0 : N - 100;
        cr_assert_eq(got[i], want, "y[%d] = %lld, want %lld", i, (long long)got[i], (long long)want);
    }
    TEST_OK(early_return(NULL, y)); /* default: 1-D over y's elements */
    read_bytes(y, got, sizeof got);
    for (int i = 0; i < N; i++) cr_assert_eq(got[i], i % 3 == 0 ? 0 : N, "y[%d] = %lld", i, (long long)got[i]);
    TEST_OK(gpuarr_release(y));
}

/* ---------------------------------------------------------------------------------------------
 * The same bits as the host for + - * / and sqrt
 * ------------------------------------------------------------------------------------------- */
enum { AN = 4096 };

/* NaN payloads are not specified (x86 and GPUs make different ones): every NaN counts as one */
static void canonical_nans_f32(float *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (isnan(v[i])) v[i] = NAN;
}
static void canonical_nans_f64(double *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (isnan(v[i])) v[i] = (double)NAN;
}

/* Awkward operands: denormals, the smallest and largest normals, magnitudes far apart, values
   near 1 whose products round (a * b + c differs from fma(a, b, c)), random bits. */
static uint64_t awkward_bits(test_rng *r, int i, int mant_bits, int exp_bits) {
    uint64_t mant = test_rng_next(r) & ((1ull << mant_bits) - 1), top = (1ull << exp_bits) - 1, e;
    switch (i % 8) {
    case 0: e = 0; break;                                      /* denormal */
    case 1: e = 1 + test_rng_below(r, 3); break;               /* the smallest normals */
    case 2: e = top - 1 - test_rng_below(r, 3); break;         /* the largest finite */
    case 3: e = (top >> 1) + (test_rng_below(r, 2)); mant &= ~((1ull << (mant_bits / 2)) - 1); break; /* near 1, half the bits */
    case 4: e = (top >> 1); break;                              /* [1, 2) */
    default: e = 1 + test_rng_below(r, (uint32_t)top - 1); break; /* any finite */
    }
    uint64_t sign = test_rng_next(r) & 1;
    return sign << (mant_bits + exp_bits) | e << mant_bits | mant;
}

static float ref_f32(int op, float a, float b, float c) {
    volatile float t, u; /* one rounding per operation, as the kernel must */
    switch (op) {
    case 0: return a + b;
    case 1: return a - b;
    case 2: return a * b;
    case 3: return a / b;
    case 4: return (float)sqrt(fabs((double)a)); /* the double root rounds to the float one */
    case 5: t = a * b; return t + c;
    default: t = a * b, u = c * c; return t - u;
    }
}
static double ref_f64(int op, double a, double b, double c) {
    volatile double t, u;
    switch (op) {
    case 0: return a + b;
    case 1: return a - b;
    case 2: return a * b;
    case 3: return a / b;
    case 4: return sqrt(fabs(a));
    case 5: t = a * b; return t + c;
    default: t = a * b, u = c * c; return t - u;
    }
}
static const char *const arith_ops[7] = {"a + b", "a - b", "a * b", "a / b", "sqrt(fabs(a))", "a * b + c", "a * b - c * c"};

/* runs k on dev and on the host over the same inputs; returns both results */
static void arith_on(gpuarr_result (*k)(const gpuarr_launch *, gpuarr_array, gpuarr_array, gpuarr_array, gpuarr_array), gpuarr_device dev,
                     gpuarr_dtype t, const void *a, const void *b, const void *c, void *out) {
    size_t sz = test_dtype_bytes(t);
    gpuarr_array x = make_1d(dev, t, AN, a), y = make_1d(dev, t, AN, b), z = make_1d(dev, t, AN, c), r = make_1d(dev, t, 7 * AN, NULL);
    TEST_OK(k(NULL, x, y, z, r));
    read_bytes(r, out, 7 * AN * sz);
    TEST_OK(gpuarr_release(x));
    TEST_OK(gpuarr_release(y));
    TEST_OK(gpuarr_release(z));
    TEST_OK(gpuarr_release(r));
}

Test(kernels, float_arithmetic_is_the_same_bits_as_the_host_and_plain_c) {
    gpuarr_device dev = test_device();
    gpuarr_device_info info = device_info(dev);
    float *in = malloc(3 * AN * sizeof *in), *got = malloc(7 * AN * sizeof *got), *host = malloc(7 * AN * sizeof *host),
          *want = malloc(7 * AN * sizeof *want);
    cr_assert(in && got && host && want);
    test_rng rng = {7};
    for (int i = 0; i < 3 * AN; i++) in[i] = test_f32_from_bits((uint32_t)awkward_bits(&rng, (int)test_rng_below(&rng, 8), 23, 8));
    float *a = in, *b = in + AN, *c = in + 2 * AN;
    for (int i = 2; i < AN; i += 5) { /* c = -(a * b) rounded: a * b + c is 0, an fma gives the rounding error */
        volatile float p = a[i] * b[i];
        c[i] = -p;
    }
    /* two pairs that an fma would round differently: (1 + 2^-12)^2 - (1 + 2^-11) is 0, not 2^-24 */
    a[0] = b[0] = 1.0f + 0x1p-12f, c[0] = -(1.0f + 0x1p-11f);
    a[1] = 0x1.000002p0f, b[1] = 0x1.fffffcp-1f, c[1] = -1.0f;
    for (int i = 0; i < AN; i++)
        for (int op = 0; op < 7; op++) want[7 * i + op] = ref_f32(op, a[i], b[i], c[i]);
    cr_expect_eq(want[5], 0.0f, "the test's reference contracted a * b + c into an fma");
    arith_on(arith_f32, dev, GPUARR_F32, a, b, c, got);
    arith_on(arith_f32, gpuarr_host(), GPUARR_F32, a, b, c, host);
    canonical_nans_f32(got, 7 * AN), canonical_nans_f32(host, 7 * AN), canonical_nans_f32(want, 7 * AN);
    for (int i = 0; i < 7 * AN; i++) {
        cr_assert(memcmp(&host[i], &want[i], sizeof(float)) == 0, "host: %s of a = %a, b = %a, c = %a gave %a, plain C %a", arith_ops[i % 7],
                  (double)a[i / 7], (double)b[i / 7], (double)c[i / 7], (double)host[i], (double)want[i]);
        cr_assert(memcmp(&got[i], &host[i], sizeof(float)) == 0, "%s: %s of a = %a, b = %a, c = %a gave %a, the host %a", info.spec,
                  arith_ops[i % 7], (double)a[i / 7], (double)b[i / 7], (double)c[i / 7], (double)got[i], (double)host[i]);
    }
    cr_expect(memcmp(got, host, 7 * AN * sizeof *got) == 0);
    free(in), free(got), free(host), free(want);
}

Test(kernels, double_arithmetic_is_the_same_bits_as_the_host_and_plain_c) {
    gpuarr_device dev = test_device();
    gpuarr_device_info info = device_info(dev);
    double *in = malloc(3 * AN * sizeof *in), *got = malloc(7 * AN * sizeof *got), *host = malloc(7 * AN * sizeof *host),
           *want = malloc(7 * AN * sizeof *want);
    cr_assert(in && got && host && want);
    test_rng rng = {8};
    for (int i = 0; i < 3 * AN; i++) in[i] = test_f64_from_bits(awkward_bits(&rng, (int)test_rng_below(&rng, 8), 52, 11));
    double *a = in, *b = in + AN, *c = in + 2 * AN;
    for (int i = 2; i < AN; i += 5) {
        volatile double p = a[i] * b[i];
        c[i] = -p;
    }
    a[0] = b[0] = 1.0 + 0x1p-27, c[0] = -(1.0 + 0x1p-26);
    a[1] = 0x1.0000000000001p0, b[1] = 0x1.ffffffffffffep-1, c[1] = -1.0;
    for (int i = 0; i < AN; i++)
        for (int op = 0; op < 7; op++) want[7 * i + op] = ref_f64(op, a[i], b[i], c[i]);
    cr_expect_eq(want[5], 0.0, "the test's reference contracted a * b + c into an fma");
    arith_on(arith_f64, dev, GPUARR_F64, a, b, c, got);
    arith_on(arith_f64, gpuarr_host(), GPUARR_F64, a, b, c, host);
    canonical_nans_f64(got, 7 * AN), canonical_nans_f64(host, 7 * AN), canonical_nans_f64(want, 7 * AN);
    for (int i = 0; i < 7 * AN; i++) {
        cr_assert(memcmp(&host[i], &want[i], sizeof(double)) == 0, "host: %s of a = %a, b = %a, c = %a gave %a, plain C %a", arith_ops[i % 7],
                  a[i / 7], b[i / 7], c[i / 7], host[i], want[i]);
        cr_assert(memcmp(&got[i], &host[i], sizeof(double)) == 0, "%s: %s of a = %a, b = %a, c = %a gave %a, the host %a", info.spec,
                  arith_ops[i % 7], a[i / 7], b[i / 7], c[i / 7], got[i], host[i]);
    }
    free(in), free(got), free(host), free(want);
}

/* ---------------------------------------------------------------------------------------------
 * Order among streams: no record_stream calls
 * ------------------------------------------------------------------------------------------- */
enum { SN = 1 << 20 };

Test(kernels, a_launch_on_a_stream_sees_async_writes_and_copies_of_other_streams) {
    gpuarr_device dev = test_device();
    gpuarr_stream s1, s2, s3;
    TEST_OK(gpuarr_stream_create(dev, 0, &s1));
    TEST_OK(gpuarr_stream_create(dev, 0, &s2));
    TEST_OK(gpuarr_stream_create(dev, 0, &s3));
    float *v = malloc(SN * sizeof *v), *w = malloc(SN * sizeof *w), *back = malloc(SN * sizeof *back);
    cr_assert(v && w && back);
    for (int i = 0; i < SN; i++) v[i] = (float)(i % 1000), w[i] = -1.0f;
    gpuarr_array x = make_1d(dev, GPUARR_F32, SN, NULL), y = make_1d(dev, GPUARR_F32, SN, NULL), x2 = make_1d(dev, GPUARR_F32, SN, NULL);
    /* a write on s1, the kernel on s2 reading it */
    TEST_OK(gpuarr_write_async(x, 0, SN, GPUARR_F32, v, s1));
    gpuarr_launch l = {.stream = s2};
    TEST_OK(twice_f32(&l, x, y));
    /* a later write of x on s1 must wait for the kernel's reads */
    TEST_OK(gpuarr_write_async(x, 0, SN, GPUARR_F32, w, s1));
    /* the result read on a third stream */
    TEST_OK(gpuarr_read_async(y, 0, SN, GPUARR_F32, back, s3));
    TEST_OK(gpuarr_stream_sync(s3));
    for (int i = 0; i < SN; i++) cr_assert_eq(back[i], f32_twice(v[i]), "after write_async on s1: y[%d] = %g", i, (double)back[i]);
    /* a copy on s1, the kernel on s2, a plain read (the current stream) */
    TEST_OK(gpuarr_copy_async(x2, x, s1));
    TEST_OK(twice_f32(&l, x2, y));
    TEST_OK(gpuarr_read(y, 0, SN, GPUARR_F32, back));
    for (int i = 0; i < SN; i++) cr_assert_eq(back[i], f32_twice(-1.0f), "after copy_async on s1: y[%d] = %g", i, (double)back[i]);
    TEST_OK(gpuarr_stream_sync(s1));
    TEST_OK(gpuarr_release(x));
    TEST_OK(gpuarr_release(x2));
    TEST_OK(gpuarr_release(y));
    TEST_OK(gpuarr_stream_destroy(s1));
    TEST_OK(gpuarr_stream_destroy(s2));
    TEST_OK(gpuarr_stream_destroy(s3));
    free(v), free(w), free(back);
}

Test(kernels, back_to_back_launches_on_two_streams_chain) {
    gpuarr_device dev = test_device();
    gpuarr_stream s[2];
    TEST_OK(gpuarr_stream_create(dev, 0, &s[0]));
    TEST_OK(gpuarr_stream_create(dev, 0, &s[1]));
    enum { N = 1 << 18 };
    gpuarr_array a = make_1d(dev, GPUARR_U8, N, NULL), b = make_1d(dev, GPUARR_U8, N, NULL);
    uint8_t want = 0;
    for (int k = 0; k < 8; k++) { /* a -> b on one stream, b -> a on the other */
        gpuarr_launch l = {.stream = s[k & 1]};
        TEST_OK(k & 1 ? twice_u8(&l, b, a) : twice_u8(&l, a, b));
        want = u8_twice(want);
    }
    uint8_t *back = malloc(N);
    cr_assert_not_null(back);
    TEST_OK(gpuarr_read(a, 0, N, GPUARR_U8, back));
    for (int i = 0; i < N; i++) cr_assert_eq(back[i], want, "a[%d] = %d, want %d", i, back[i], want);
    free(back);
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
    TEST_OK(gpuarr_stream_destroy(s[0]));
    TEST_OK(gpuarr_stream_destroy(s[1]));
}

/* ---------------------------------------------------------------------------------------------
 * Refusals: each names its parameter, and nothing runs
 * ------------------------------------------------------------------------------------------- */
enum { EN = 16 };

typedef struct err_fixture {
    gpuarr_device dev;
    gpuarr_array x, y; /* f32 inputs 1..16, y a sentinel of 7s */
} err_fixture;

static err_fixture err_setup(void) {
    err_fixture f;
    f.dev = test_device();
    float v[EN], s[EN];
    for (int i = 0; i < EN; i++) v[i] = (float)(i + 1), s[i] = 7.0f;
    f.x = make_1d(f.dev, GPUARR_F32, EN, v);
    f.y = make_1d(f.dev, GPUARR_F32, EN, s);
    return f;
}
static void expect_untouched(gpuarr_array y, const char *after) {
    float back[EN];
    read_bytes(y, back, sizeof back);
    for (int i = 0; i < EN; i++) cr_assert_eq(back[i], 7.0f, "after %s: y[%d] = %g: a refused launch ran", after, i, (double)back[i]);
}
static void err_teardown(err_fixture *f) {
    TEST_OK(gpuarr_release(f->x));
    TEST_OK(gpuarr_release(f->y));
}

/* a refused call: its result, its message naming what, and y as it was */
#define REFUSED(f, call, code, what)                                                           \
    do {                                                                                       \
        TEST_FAIL_WITH(call, code, what);                                                      \
        cr_expect(strncmp(gpuarr_last_error(), "gpuarr_kernel_", 14) == 0, "%s: the message names no call: %s", #call, gpuarr_last_error()); \
        expect_untouched((f).y, #call);                                                        \
    } while (0)

Test(kernels, refused_launch_shapes) {
    err_fixture f = err_setup();
    gpuarr_launch l4 = {.ndim = 4, .global = {EN, 1, 1}};
    REFUSED(f, scale(&l4, 2.0f, f.x, f.y), GPUARR_ERROR_INVALID_ARGUMENT, "l->ndim = 4");
    gpuarr_launch lneg = {.ndim = -1, .global = {EN}};
    REFUSED(f, scale(&lneg, 2.0f, f.x, f.y), GPUARR_ERROR_INVALID_ARGUMENT, "l->ndim = -1");
    gpuarr_launch g = {.ndim = 2, .global = {EN, -3}};
    REFUSED(f, scale(&g, 2.0f, f.x, f.y), GPUARR_ERROR_INVALID_ARGUMENT, "l->global[1] = -3");
    gpuarr_launch g0 = {.ndim = 1, .global = {-1}};
    REFUSED(f, scale(&g0, 2.0f, f.x, f.y), GPUARR_ERROR_INVALID_ARGUMENT, "l->global[0]");
    gpuarr_launch big = {.ndim = 3, .global = {INT64_MAX / 2, 3, 1}};
    REFUSED(f, scale(&big, 2.0f, f.x, f.y), GPUARR_ERROR_OVERFLOW, "overflows");
    err_teardown(&f);
}

Test(kernels, an_empty_launch_does_nothing_and_succeeds) {
    err_fixture f = err_setup();
    gpuarr_launch l = {.ndim = 1, .global = {0}};
    TEST_OK(scale(&l, 2.0f, f.x, f.y));
    gpuarr_launch l2 = {.ndim = 3, .global = {EN, 0, 4}};
    TEST_OK(scale(&l2, 2.0f, f.x, f.y));
    expect_untouched(f.y, "an empty launch");
    gpuarr_array none, nothing;
    int64_t zero = 0;
    TEST_OK(gpuarr_empty(f.dev, GPUARR_F32, 1, &zero, &none));
    TEST_OK(gpuarr_empty(f.dev, GPUARR_F32, 1, &zero, &nothing));
    TEST_OK(scale(NULL, 2.0f, none, nothing)); /* the default over an empty first array */
    TEST_OK(gpuarr_release(none));
    TEST_OK(gpuarr_release(nothing));
    err_teardown(&f);
}

Test(kernels, refused_arguments_name_their_parameter) {
    err_fixture f = err_setup();
    /* a dtype that is not the parameter's */
    gpuarr_array i32 = make_1d(f.dev, GPUARR_I32, EN, NULL), f64 = make_1d(f.dev, GPUARR_F64, EN, NULL);
    REFUSED(f, scale(NULL, 2.0f, i32, f.y), GPUARR_ERROR_INVALID_ARGUMENT, "parameter x (IN f32) was given an array of i32");
    REFUSED(f, scale(NULL, 2.0f, f.x, f64), GPUARR_ERROR_INVALID_ARGUMENT, "parameter y (OUT f32) was given an array of f64");
    /* a released array, and the zero handle */
    gpuarr_array gone = make_1d(f.dev, GPUARR_F32, EN, NULL), zero = {0};
    TEST_OK(gpuarr_release(gone));
    REFUSED(f, scale(NULL, 2.0f, gone, f.y), GPUARR_ERROR_INVALID_HANDLE, "parameter x");
    REFUSED(f, scale(NULL, 2.0f, f.x, zero), GPUARR_ERROR_INVALID_HANDLE, "parameter y");
    /* the stream of another device */
    gpuarr_device other = {0};
    static const char *const specs[] = {"host", "opencl:0", "opencl:1", "cuda:0"};
    for (int i = 0; i < 4 && !other.id; i++)
        if (gpuarr_device_find(specs[i], &other) != GPUARR_OK || other.id == f.dev.id) other.id = 0;
    if (other.id) {
        gpuarr_stream s;
        TEST_OK(gpuarr_stream_create(other, 0, &s));
        gpuarr_launch l = {.stream = s};
        REFUSED(f, scale(&l, 2.0f, f.x, f.y), GPUARR_ERROR_INVALID_ARGUMENT, "l->stream is on");
        TEST_OK(gpuarr_stream_destroy(s));
    }
    TEST_OK(gpuarr_release(i32));
    TEST_OK(gpuarr_release(f64));
    err_teardown(&f);
}

Test(kernels, refused_direct_calls_of_gpuarr_kernel_launch) {
    err_fixture f = err_setup();
    const gpuarr_kernel *k = &scale_gpuarr_kernel;
    float s = 2.0f;
    gpuarr_kernel_arg args[3] = {{{0}, &s}, {f.x, NULL}, {f.y, NULL}};
    TEST_OK(gpuarr_kernel_launch(k, NULL, args)); /* the arguments are right: y = 2x */
    float back[EN];
    read_bytes(f.y, back, sizeof back);
    for (int i = 0; i < EN; i++) cr_assert_eq(back[i], 2.0f * (float)(i + 1));
    float sevens[EN];
    for (int i = 0; i < EN; i++) sevens[i] = 7.0f;
    TEST_OK(gpuarr_write(f.y, 0, EN, GPUARR_F32, sevens));
    args[0].scalar = NULL;
    REFUSED(f, gpuarr_kernel_launch(k, NULL, args), GPUARR_ERROR_INVALID_ARGUMENT, "scalar parameter s has no value");
    args[0].scalar = &s;
    REFUSED(f, gpuarr_kernel_launch(k, NULL, NULL), GPUARR_ERROR_INVALID_ARGUMENT, "args is NULL");
    REFUSED(f, gpuarr_kernel_launch(NULL, NULL, args), GPUARR_ERROR_INVALID_ARGUMENT, "k is NULL");
    /* a description GPUARR_KERNEL did not make */
    gpuarr_kernel forged = *k;
    forged.nparams = 0;
    REFUSED(f, gpuarr_kernel_launch(&forged, NULL, args), GPUARR_ERROR_INVALID_ARGUMENT, "nparams = 0");
    forged.nparams = GPUARR_KERNEL_MAX_PARAMS + 1;
    REFUSED(f, gpuarr_kernel_launch(&forged, NULL, args), GPUARR_ERROR_INVALID_ARGUMENT, "nparams = 17");
    gpuarr_kernel_param bad[3] = {k->params[0], k->params[1], k->params[2]};
    bad[1].kind = (gpuarr_param_kind)9;
    forged = *k;
    forged.params = bad;
    REFUSED(f, gpuarr_kernel_launch(&forged, NULL, args), GPUARR_ERROR_INVALID_ARGUMENT, "parameter 1");
    bad[1] = k->params[1], bad[2].dtype = GPUARR_BOOL;
    REFUSED(f, gpuarr_kernel_launch(&forged, NULL, args), GPUARR_ERROR_INVALID_ARGUMENT, "parameter 2");
    bad[2] = k->params[2], bad[1].kind = bad[2].kind = GPUARR_PARAM_SCALAR;
    REFUSED(f, gpuarr_kernel_launch(&forged, NULL, args), GPUARR_ERROR_INVALID_ARGUMENT, "no array parameter");
    forged = *k;
    forged.host = NULL;
    REFUSED(f, gpuarr_kernel_launch(&forged, NULL, args), GPUARR_ERROR_INVALID_ARGUMENT, "not a kernel GPUARR_KERNEL made");
    /* gpuarr_kernel_build and _build_log refuse the same */
    TEST_FAIL_WITH(gpuarr_kernel_build(NULL, f.dev), GPUARR_ERROR_INVALID_ARGUMENT, "k is NULL");
    gpuarr_device nodev = {0};
    TEST_FAIL_WITH(gpuarr_kernel_build(k, nodev), GPUARR_ERROR_INVALID_HANDLE, "d");
    char log[64];
    TEST_FAIL_WITH(gpuarr_kernel_build_log(k, f.dev, NULL, 10), GPUARR_ERROR_INVALID_ARGUMENT, "buf");
    TEST_FAIL_WITH(gpuarr_kernel_build_log(k, f.dev, log, 0), GPUARR_ERROR_INVALID_ARGUMENT, "len is 0");
    TEST_FAIL_WITH(gpuarr_kernel_build_log(NULL, f.dev, log, sizeof log), GPUARR_ERROR_INVALID_ARGUMENT, "k is NULL");
    err_teardown(&f);
}

Test(kernels, arrays_on_two_devices_are_refused) {
    err_fixture f = err_setup();
    gpuarr_device other = {0};
    static const char *const specs[] = {"host", "opencl:0", "opencl:1", "cuda:0", "cuda:1"};
    for (int i = 0; i < 5 && !other.id; i++)
        if (gpuarr_device_find(specs[i], &other) != GPUARR_OK || other.id == f.dev.id) other.id = 0;
    if (!other.id) {
        err_teardown(&f);
        test_skip("no second device beside %s to put an array on", test_device_spec());
    }
    gpuarr_device_info oi = device_info(other), di = device_info(f.dev);
    float v[EN] = {0};
    gpuarr_array there = make_1d(other, GPUARR_F32, EN, v);
    char want[160];
    snprintf(want, sizeof want, "parameter y is on %s, but ", oi.spec);
    REFUSED(f, scale(NULL, 2.0f, f.x, there), GPUARR_ERROR_INVALID_ARGUMENT, want);
    cr_expect(strstr(gpuarr_last_error(), di.spec) != NULL, "the message names the other device: %s", gpuarr_last_error());
    snprintf(want, sizeof want, "parameter y is on %s, but ", di.spec);
    TEST_FAIL_WITH(scale(NULL, 2.0f, there, f.y), GPUARR_ERROR_INVALID_ARGUMENT, want);
    cr_expect(strstr(gpuarr_last_error(), oi.spec) != NULL, "the message names the other device: %s", gpuarr_last_error());
    expect_untouched(f.y, "arrays on two devices");
    TEST_OK(gpuarr_release(there));
    err_teardown(&f);
}

Test(kernels, a_read_only_array_is_refused_as_out_and_inout_but_read_as_in) {
    err_fixture f = err_setup();
    DLManagedTensorVersioned *m = NULL;
    TEST_OK(gpuarr_to_dlpack(f.y, GPUARR_DLPACK_READ_ONLY, &m));
    gpuarr_array ro;
    TEST_OK(gpuarr_from_dlpack(m, &ro));
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(ro, &info));
    cr_assert(info.read_only, "the import of a read-only export is read-only");
    cr_assert_eq(info.device.id, f.dev.id);
    REFUSED(f, scale(NULL, 2.0f, f.x, ro), GPUARR_ERROR_INVALID_ARGUMENT, "parameter y is OUT but its array is read-only");
    int32_t zs[EN] = {0};
    gpuarr_array i32 = make_1d(f.dev, GPUARR_I32, EN, zs), out = make_1d(f.dev, GPUARR_I32, EN, NULL);
    DLManagedTensorVersioned *m2 = NULL;
    TEST_OK(gpuarr_to_dlpack(i32, GPUARR_DLPACK_READ_ONLY, &m2));
    gpuarr_array ro2;
    TEST_OK(gpuarr_from_dlpack(m2, &ro2));
    TEST_FAIL_WITH(kinds_i32(NULL, 1, i32, out, ro2), GPUARR_ERROR_INVALID_ARGUMENT, "parameter z is INOUT but its array is read-only");
    /* as IN it is read */
    gpuarr_array y2 = make_1d(f.dev, GPUARR_F32, EN, NULL);
    TEST_OK(scale(NULL, 3.0f, ro, y2));
    float back[EN];
    read_bytes(y2, back, sizeof back);
    for (int i = 0; i < EN; i++) cr_assert_eq(back[i], 21.0f, "y2[%d] = %g", i, (double)back[i]);
    TEST_OK(gpuarr_release(y2));
    TEST_OK(gpuarr_release(ro));
    TEST_OK(gpuarr_release(ro2));
    TEST_OK(gpuarr_release(i32));
    TEST_OK(gpuarr_release(out));
    err_teardown(&f);
}

Test(kernels, a_body_the_device_cannot_compile_is_a_build_error_with_its_log) {
    gpuarr_device dev = test_device();
    gpuarr_device_info info = device_info(dev);
    int32_t init[EN];
    for (int i = 0; i < EN; i++) init[i] = 7;
    gpuarr_array y = make_1d(dev, GPUARR_I32, EN, init);
    if (info.backend == GPUARR_BACKEND_HOST) { /* the program's compiler built it: it runs */
        TEST_OK(not_device_code(NULL, y));
        TEST_OK(gpuarr_release(y));
        test_skip("the host runs the body its compiler built; `int private` is C (a build error only on OpenCL and CUDA)");
    }
    char want[128];
    snprintf(want, sizeof want, "kernel not_device_code did not compile for %s", info.spec);
    TEST_FAIL_WITH(not_device_code(NULL, y), GPUARR_ERROR_BUILD, want);
    cr_expect(strncmp(gpuarr_last_error(), "gpuarr_kernel_launch", 20) == 0, "the message names the call: %s", gpuarr_last_error());
    int32_t back[EN];
    read_bytes(y, back, sizeof back);
    for (int i = 0; i < EN; i++) cr_assert_eq(back[i], 7, "y[%d] = %d after a failed build", i, back[i]);
    TEST_FAIL_WITH(gpuarr_kernel_build(&not_device_code_gpuarr_kernel, dev), GPUARR_ERROR_BUILD, want);
    char log[8192];
    TEST_OK(gpuarr_kernel_build_log(&not_device_code_gpuarr_kernel, dev, log, sizeof log));
    cr_expect(strlen(log) > 0, "the whole log is kept");
    cr_expect(strstr(log, "error") != NULL, "the log says what failed: %s", log);
    char small[8];
    TEST_OK(gpuarr_kernel_build_log(&not_device_code_gpuarr_kernel, dev, small, sizeof small));
    cr_expect_eq(strlen(small), sizeof small - 1, "a short buffer gets the log's start");
    cr_expect(strncmp(small, log, sizeof small - 1) == 0);
    /* a kernel that built has an empty log or one without errors, and launches */
    TEST_OK(gpuarr_kernel_build(&twice_f32_gpuarr_kernel, dev));
    TEST_OK(gpuarr_release(y));
}

Test(kernels, a_double_kernel_on_a_device_without_fp64_is_unsupported) {
    gpuarr_device dev = test_device();
    gpuarr_device_info info = device_info(dev);
    if (info.backend != GPUARR_BACKEND_OPENCL)
        test_skip("%s has fp64 and nothing turns it off (GPUARR_OPENCL_FP64=off is OpenCL's)", info.spec);
    gpuarr_shutdown(); /* an OpenCL device can be made to lack fp64 */
    cr_assert_eq(setenv("GPUARR_OPENCL_FP64", "off", 1), 0);
    gpuarr_result r = gpuarr_init(NULL);
    unsetenv("GPUARR_OPENCL_FP64");
    TEST_OK(r);
    dev = test_device();
    double init[EN];
    for (int i = 0; i < EN; i++) init[i] = 7.0;
    gpuarr_array x = make_1d(dev, GPUARR_F64, EN, init), y = make_1d(dev, GPUARR_F64, EN, init);
    TEST_FAIL_WITH(twice_f64(NULL, x, y), GPUARR_ERROR_UNSUPPORTED, "twice_f64");
    cr_expect(strstr(gpuarr_last_error(), info.spec) != NULL, "the message names the device: %s", gpuarr_last_error());
    cr_expect(strstr(gpuarr_last_error(), "double") || strstr(gpuarr_last_error(), "f64"), "the message says why: %s", gpuarr_last_error());
    TEST_FAIL_WITH(gpuarr_kernel_build(&twice_f64_gpuarr_kernel, dev), GPUARR_ERROR_UNSUPPORTED, "twice_f64");
    double back[EN];
    read_bytes(y, back, sizeof back);
    for (int i = 0; i < EN; i++) cr_assert_eq(back[i], 7.0, "y[%d] = %g after a refused launch", i, back[i]);
    /* float kernels still run */
    float v[EN], out[EN];
    for (int i = 0; i < EN; i++) v[i] = (float)i;
    gpuarr_array fx = make_1d(dev, GPUARR_F32, EN, v), fy = make_1d(dev, GPUARR_F32, EN, NULL);
    TEST_OK(twice_f32(NULL, fx, fy));
    read_bytes(fy, out, sizeof out);
    for (int i = 0; i < EN; i++) cr_assert_eq(out[i], f32_twice(v[i]));
    TEST_OK(gpuarr_release(x));
    TEST_OK(gpuarr_release(y));
    TEST_OK(gpuarr_release(fx));
    TEST_OK(gpuarr_release(fy));
}

/* Without NVRTC a CUDA launch says what to install; a kernel whose binary is in the cache folder
   loads without NVRTC (the cache is keyed by the driver, not by NVRTC's version). */
Test(kernels, cuda_without_nvrtc_is_unsupported_saying_what_to_install) {
    gpuarr_device dev = test_device();
    gpuarr_device_info info = device_info(dev);
    if (info.backend != GPUARR_BACKEND_CUDA) test_skip("%s is not a CUDA device: NVRTC is CUDA's compiler", info.spec);
    float v[EN], out[EN];
    for (int i = 0; i < EN; i++) v[i] = (float)i;
    gpuarr_array x = make_1d(dev, GPUARR_F32, EN, v), y = make_1d(dev, GPUARR_F32, EN, NULL);
    TEST_OK(twice_f32(NULL, x, y)); /* built with NVRTC: its cubin is now in the cache folder */
    TEST_OK(gpuarr_release(x));
    TEST_OK(gpuarr_release(y));
    gpuarr_shutdown();
    cr_assert_eq(setenv("GPUARR_NVRTC_LIBRARY", "/nonexistent/libnvrtc.so.13", 1), 0);
    TEST_OK(gpuarr_init(NULL));
    dev = test_device();
    x = make_1d(dev, GPUARR_F32, EN, v);
    y = make_1d(dev, GPUARR_F32, EN, NULL);
    TEST_OK(twice_f32(NULL, x, y)); /* this process cannot load NVRTC: the cached cubin served */
    read_bytes(y, out, sizeof out);
    for (int i = 0; i < EN; i++) cr_assert_eq(out[i], f32_twice(v[i]));
    TEST_OK(gpuarr_release(x));
    TEST_OK(gpuarr_release(y));
    gpuarr_shutdown();
    cr_assert_eq(setenv("GPUARR_CACHE_DIR", "off", 1), 0); /* nothing cached: NVRTC is needed */
    TEST_OK(gpuarr_init(NULL));
    dev = test_device();
    x = make_1d(dev, GPUARR_F32, EN, v);
    y = make_1d(dev, GPUARR_F32, EN, NULL);
    TEST_FAIL_WITH(twice_f32(NULL, x, y), GPUARR_ERROR_UNSUPPORTED, "twice_f32");
    cr_expect(strstr(gpuarr_last_error(), "GPUARR_NVRTC_LIBRARY") && strstr(gpuarr_last_error(), "install"),
              "the message says what to install: %s", gpuarr_last_error());
    TEST_OK(gpuarr_release(x));
    TEST_OK(gpuarr_release(y));
}
