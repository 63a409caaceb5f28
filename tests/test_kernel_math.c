/*
 * test_kernel_math.c -- the math functions a portable kernel's body may call, measured: the
 * largest error in ulp of each, in float and double, on the device under test, against a
 * reference computed on the host in a wider type (double for float, long double for double).
 * Each must stay within the bound KERNELS documents for its backend (the table below is that
 * table; the test prints what it measured). The exact functions (fabs, floor, ceil, round,
 * trunc, fmin, fmax, fmod, sqrt) must be exact everywhere: 0 ulp, or 0.5 for sqrt (correctly
 * rounded), the same bits as the host. On the fake CUDA driver (tests/fake_cuda) the kernels
 * run their host form, so the host's bounds apply there; CUDA's own are checked only on a GPU.
 */
#include "test_common.h"
#include <tgmath.h> /* in C, a file that defines kernels needs it (see KERNELS) */

#define UNARY_KERNELS(fn)                                                                                  \
    GPUARR_KERNEL(math_##fn##_f32, (GPUARR_IN(float, x), GPUARR_OUT(float, y)), {                          \
        int64_t i = gpuarr_index(0);                                                                       \
        y[i] = fn(x[i]);                                                                                   \
    })                                                                                                     \
    GPUARR_KERNEL(math_##fn##_f64, (GPUARR_IN(double, x), GPUARR_OUT(double, y)), {                        \
        int64_t i = gpuarr_index(0);                                                                       \
        y[i] = fn(x[i]);                                                                                   \
    })
#define BINARY_KERNELS(fn)                                                                                 \
    GPUARR_KERNEL(math_##fn##_f32, (GPUARR_IN(float, x), GPUARR_IN(float, z), GPUARR_OUT(float, y)), {     \
        int64_t i = gpuarr_index(0);                                                                       \
        y[i] = fn(x[i], z[i]);                                                                             \
    })                                                                                                     \
    GPUARR_KERNEL(math_##fn##_f64, (GPUARR_IN(double, x), GPUARR_IN(double, z), GPUARR_OUT(double, y)), {  \
        int64_t i = gpuarr_index(0);                                                                       \
        y[i] = fn(x[i], z[i]);                                                                             \
    })

/* X(fn, arity, lo, hi, lo2, hi2, log-spaced, bound host, bound opencl, bound cuda): the documented list and each
   backend's bound in ulp (float, the same for double unless noted in KERNELS). */
#define MATH_LIST(X)                                                                                       \
    X(sqrt, 1, 0, 1e6, 0, 0, 0)                                                                            \
    X(fabs, 1, -1e3, 1e3, 0, 0, 0)                                                                         \
    X(floor, 1, -1e3, 1e3, 0, 0, 0)                                                                        \
    X(ceil, 1, -1e3, 1e3, 0, 0, 0)                                                                         \
    X(round, 1, -1e3, 1e3, 0, 0, 0)                                                                        \
    X(trunc, 1, -1e3, 1e3, 0, 0, 0)                                                                        \
    X(exp, 1, -80, 80, 0, 0, 0)                                                                            \
    X(exp2, 1, -120, 120, 0, 0, 0)                                                                         \
    X(log, 1, 1e-30, 1e30, 0, 0, 1)                                                                        \
    X(log2, 1, 1e-30, 1e30, 0, 0, 1)                                                                       \
    X(log10, 1, 1e-30, 1e30, 0, 0, 1)                                                                      \
    X(sin, 1, -100, 100, 0, 0, 0)                                                                          \
    X(cos, 1, -100, 100, 0, 0, 0)                                                                          \
    X(tan, 1, -100, 100, 0, 0, 0)                                                                          \
    X(atan, 1, -1e3, 1e3, 0, 0, 0)                                                                         \
    X(tanh, 1, -20, 20, 0, 0, 0)                                                                           \
    X(pow, 2, 0.01, 10, -20, 20, 0)                                                                        \
    X(atan2, 2, -10, 10, -10, 10, 0)                                                                       \
    X(hypot, 2, -1e3, 1e3, -1e3, 1e3, 0)                                                                   \
    X(fmod, 2, -1e3, 1e3, 0.1, 10, 0)                                                                      \
    X(fmin, 2, -1e3, 1e3, -1e3, 1e3, 0)                                                                    \
    X(fmax, 2, -1e3, 1e3, -1e3, 1e3, 0)

UNARY_KERNELS(sqrt) UNARY_KERNELS(fabs) UNARY_KERNELS(floor) UNARY_KERNELS(ceil) UNARY_KERNELS(round)
UNARY_KERNELS(trunc) UNARY_KERNELS(exp) UNARY_KERNELS(exp2) UNARY_KERNELS(log) UNARY_KERNELS(log2)
UNARY_KERNELS(log10) UNARY_KERNELS(sin) UNARY_KERNELS(cos) UNARY_KERNELS(tan) UNARY_KERNELS(atan)
UNARY_KERNELS(tanh) BINARY_KERNELS(pow) BINARY_KERNELS(atan2) BINARY_KERNELS(hypot) BINARY_KERNELS(fmod)
BINARY_KERNELS(fmin) BINARY_KERNELS(fmax)

enum { COUNT = 20000 };

/* Error of got against the exact value ref (a long double holding the wider reference), in
   units of the last place of got's type at ref (mant: 24 or 53 bits). Same infinities and NaNs: 0. */
static double ulp_error(long double got, long double ref, int mant) {
    if (isnan(got) && isnan(ref)) return 0;
    if (isinf(ref) || isinf(got)) return got == ref ? 0 : INFINITY;
    if (isnan(got) || isnan(ref)) return INFINITY;
    int e;
    frexpl(ref == 0 ? (mant == 24 ? 1.17549435e-38L : 2.2250738585072014e-308L) : ref, &e); /* ref = m * 2^e, 0.5 <= |m| < 1 */
    int min_e = mant == 24 ? -125 : -1021; /* below: subnormal spacing */
    if (e < min_e) e = min_e;
    return (double)(fabsl(got - ref) / ldexpl(1.0L, e - mant));
}

/* A deterministic input in [lo, hi], uniform or spread over the exponents (log-spaced). */
static double input(uint64_t *state, double lo, double hi, bool log_spaced) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    double u = (double)(*state >> 11) / 9007199254740992.0;
    return log_spaced ? exp(log(lo) + u * (log(hi) - log(lo))) : lo + u * (hi - lo);
}

typedef struct math_case {
    const char *name;
    int arity;
    double lo, hi, lo2, hi2;
    bool log_spaced;
    const gpuarr_kernel *k32, *k64;
    long double (*ref)(long double, long double);
} math_case;

#define REF_FN(fn, arity, ...)                                                                             \
    static long double ref_##fn(long double a, long double b) {                                           \
        (void)b;                                                                                           \
        return arity == 1 ? REF_CALL1(fn, a) : REF_CALL2(fn, a, b);                                        \
    }
/* the long double functions of <math.h> (fabsl, sinl ...), named without tgmath's help */
#define REF_CALL1(fn, a) fn##l_wrap(a)
#define REF_CALL2(fn, a, b) fn##l_wrap2(a, b)
#define WRAP1(fn) static long double fn##l_wrap(long double a) { return fn(a); } static long double fn##l_wrap2(long double a, long double b) { (void)b; return fn(a); }
#define WRAP2(fn) static long double fn##l_wrap(long double a) { return fn(a, a); } static long double fn##l_wrap2(long double a, long double b) { return fn(a, b); }
WRAP1(sqrt) WRAP1(fabs) WRAP1(floor) WRAP1(ceil) WRAP1(round) WRAP1(trunc) WRAP1(exp) WRAP1(exp2) WRAP1(log) WRAP1(log2)
WRAP1(log10) WRAP1(sin) WRAP1(cos) WRAP1(tan) WRAP1(atan) WRAP1(tanh) WRAP2(pow) WRAP2(atan2) WRAP2(hypot) WRAP2(fmod)
WRAP2(fmin) WRAP2(fmax)
MATH_LIST(REF_FN)

#define CASE(fn, arity, lo, hi, lo2, hi2, log_spaced) \
    {#fn, arity, lo, hi, lo2, hi2, log_spaced, &math_##fn##_f32_gpuarr_kernel, &math_##fn##_f64_gpuarr_kernel, ref_##fn},
static const math_case cases[] = {MATH_LIST(CASE)};

/* The documented bounds (KERNELS), in ulp: [backend][case]{float, double}. */
typedef struct bound { const char *fn; double host32, host64, cl32, cl64, cu32, cu64; } bound;
static const bound bounds[] = {
#include "kernel_math_bounds.h"
};

static const bound *bound_of(const char *fn) {
    for (size_t i = 0; i < sizeof bounds / sizeof bounds[0]; i++)
        if (strcmp(bounds[i].fn, fn) == 0) return &bounds[i];
    return NULL;
}

/* Runs one case at one precision on d; returns the largest error in ulp. */
static double measure(gpuarr_device d, const math_case *c, bool f64) {
    static double x[COUNT], z[COUNT];
    uint64_t state = 12345;
    for (int i = 0; i < COUNT; i++) {
        x[i] = input(&state, c->lo, c->hi, c->log_spaced);
        z[i] = input(&state, c->lo2, c->hi2, false);
    }
    gpuarr_dtype t = f64 ? GPUARR_F64 : GPUARR_F32;
    int64_t n = COUNT;
    gpuarr_array ax, az, ay;
    gpuarr_array hx, hz; /* the inputs rounded to t by gpuarr's conversion, on d */
    cr_assert_eq(gpuarr_from_host_as(gpuarr_host(), GPUARR_F64, x, 1, &n, &hx), GPUARR_OK, "%s", gpuarr_last_error());
    cr_assert_eq(gpuarr_from_host_as(gpuarr_host(), GPUARR_F64, z, 1, &n, &hz), GPUARR_OK, "%s", gpuarr_last_error());
    cr_assert_eq(gpuarr_convert(hx, d, t, &ax), GPUARR_OK, "%s", gpuarr_last_error());
    cr_assert_eq(gpuarr_convert(hz, d, t, &az), GPUARR_OK, "%s", gpuarr_last_error());
    gpuarr_release(hx);
    gpuarr_release(hz);
    cr_assert_eq(gpuarr_empty(d, t, 1, &n, &ay), GPUARR_OK, "%s", gpuarr_last_error());
    const gpuarr_kernel *k = f64 ? c->k64 : c->k32;
    gpuarr_kernel_arg args3[3] = {{ax, NULL}, {az, NULL}, {ay, NULL}}, args2[2] = {{ax, NULL}, {ay, NULL}};
    gpuarr_result r = gpuarr_kernel_launch(k, NULL, c->arity == 1 ? args2 : args3);
    cr_assert_eq(r, GPUARR_OK, "%s %s: %s", c->name, f64 ? "f64" : "f32", gpuarr_last_error());
    static double got[COUNT], xin[COUNT], zin[COUNT];
    cr_assert_eq(gpuarr_to_host_as(ay, GPUARR_F64, got, COUNT), GPUARR_OK, "%s", gpuarr_last_error());
    cr_assert_eq(gpuarr_to_host_as(ax, GPUARR_F64, xin, COUNT), GPUARR_OK, "%s", gpuarr_last_error());
    cr_assert_eq(gpuarr_to_host_as(az, GPUARR_F64, zin, COUNT), GPUARR_OK, "%s", gpuarr_last_error());
    double worst = 0;
    for (int i = 0; i < COUNT; i++) { /* the reference from the inputs as the device saw them (rounded to t) */
        long double ref = c->ref((long double)xin[i], (long double)zin[i]);
        if (!f64 && isfinite(ref) && fabsl(ref) > 3.4028234663852886e38L) ref = ref > 0 ? INFINITY : -INFINITY;
        double e = ulp_error((long double)got[i], ref, f64 ? 53 : 24);
        if (e > worst) worst = e;
    }
    gpuarr_release(ax);
    gpuarr_release(az);
    gpuarr_release(ay);
    return worst;
}

Test(kernel_math, within_documented_ulp) {
    cr_assert_eq(gpuarr_init(NULL), GPUARR_OK, "%s", gpuarr_last_error());
    gpuarr_device d = test_device();
    gpuarr_device_info info;
    cr_assert_eq(gpuarr_device_get_info(d, &info), GPUARR_OK);
    bool fp64 = gpuarr_kernel_build(&math_sqrt_f64_gpuarr_kernel, d) == GPUARR_OK;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const bound *b = bound_of(cases[i].name);
        cr_assert(b, "%s has no documented bound", cases[i].name);
        /* the fake CUDA driver runs a kernel's host form: the host's bounds hold there */
        bool host_code = info.backend == GPUARR_BACKEND_HOST || strncmp(info.name, "Fake CUDA Device", 16) == 0;
        double lim32 = host_code ? b->host32 : info.backend == GPUARR_BACKEND_OPENCL ? b->cl32 : b->cu32;
        double lim64 = host_code ? b->host64 : info.backend == GPUARR_BACKEND_OPENCL ? b->cl64 : b->cu64;
        double e32 = measure(d, &cases[i], false), e64 = fp64 ? measure(d, &cases[i], true) : 0;
        fprintf(stderr, "kernel math on %s: %-6s f32 %.3f ulp (bound %g), f64 %.3f ulp (bound %g)%s\n", info.spec, cases[i].name, e32, lim32, e64,
                lim64, fp64 ? "" : " (no fp64: not measured)");
        cr_expect_leq(e32, lim32, "%s on %s: f32 error %.3f ulp, documented bound %g", cases[i].name, info.spec, e32, lim32);
        cr_expect_leq(e64, lim64, "%s on %s: f64 error %.3f ulp, documented bound %g", cases[i].name, info.spec, e64, lim64);
    }
    gpuarr_shutdown();
}
