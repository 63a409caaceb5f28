/*
 * test_common.h -- helpers shared by the gpuarr Criterion tests (static inline functions only).
 *
 * Every test that makes arrays uses test_device(): the device named by the environment variable
 * GPUARR_TEST_DEVICE ("host" when unset), so the same suite runs on "host", "opencl:0", "cuda:0".
 * A device that is not present skips the test with the reason; a malformed name fails it.
 *
 * The second half is an independent scalar reference of the conversion rules of gpuarr.h,
 * written from the doc block only (it never calls the library's f16/bf16 helpers): every source
 * value is decoded to an exact form (sign, 64-bit integer mantissa, binary exponent), then
 * rounded to the target with explicit round-to-nearest-even on the bits.
 */
#ifndef GPUARR_TEST_COMMON_H
#define GPUARR_TEST_COMMON_H

#if !defined(_POSIX_C_SOURCE) && !defined(_GNU_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif
/* test_registry.c has the implementation after these headers (see HOW TO USE IT) */
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE 1
#endif

#include <criterion/criterion.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpuarr.h"

/* Dtypes are the enum values 1..13 in the order of the public X-macro list. */
#define TEST_FIRST_DTYPE GPUARR_BOOL
#define TEST_LAST_DTYPE GPUARR_F64
#define TEST_NDTYPES 13

/* ---------------------------------------------------------------------------------------------
 * Device selection and setup
 * ------------------------------------------------------------------------------------------- */
static inline const char *test_device_spec(void) {
    const char *s = getenv("GPUARR_TEST_DEVICE");
    return (s && *s) ? s : "host";
}

/* Skips the running test. The reason is also written to stderr, because Criterion prints its
   [SKIP] lines only with --verbose (and cr_log_warn would turn the exit status into a failure). */
static inline void test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static inline void test_skip(const char *fmt, ...) {
    char reason[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    const struct criterion_test *t = criterion_current_test;
    fprintf(stderr, "[SKIP] %s::%s: %s\n", t && t->category ? t->category : "?",
            t && t->name ? t->name : "?", reason);
    cr_skip_test("%s", reason);
}

/* GPUARR_TEST_REQUIRE=1 (set by `make test` where it installed PoCL) turns "device absent" from
   a skip into a failure, so a broken runtime cannot pass as skipped tests. */
static inline bool test_devices_required(void) {
    const char *s = getenv("GPUARR_TEST_REQUIRE");
    return s && strcmp(s, "1") == 0;
}

/* The device under test. Must be called after gpuarr_init. Skips when the device is absent. */
static inline gpuarr_device test_device(void) {
    const char *spec = test_device_spec();
    gpuarr_device d = {0};
    gpuarr_result r = gpuarr_device_find(spec, &d);
    if (r == GPUARR_ERROR_NO_DEVICE && test_devices_required())
        cr_assert_fail("GPUARR_TEST_DEVICE=%s is absent but GPUARR_TEST_REQUIRE=1: %s", spec, gpuarr_last_error());
    if (r == GPUARR_ERROR_NO_DEVICE)
        test_skip("GPUARR_TEST_DEVICE=%s: no such device on this machine (%s: %s)", spec,
                  gpuarr_result_name(r), gpuarr_last_error());
    cr_assert_eq(r, GPUARR_OK, "gpuarr_device_find(\"%s\") (from GPUARR_TEST_DEVICE) = %s: %s",
                 spec, gpuarr_result_name(r), gpuarr_last_error());
    cr_assert_neq(d.id, 0u, "gpuarr_device_find(\"%s\") returned the invalid handle {0}", spec);
    return d;
}

static inline bool test_device_is_host(gpuarr_device d) { return d.id == gpuarr_host().id; }

/* Fixtures: .init = test_setup, .fini = test_teardown */
static inline void test_setup(void) {
    gpuarr_result r = gpuarr_init(NULL);
    cr_assert_eq(r, GPUARR_OK, "gpuarr_init(NULL) = %s: %s", gpuarr_result_name(r),
                 gpuarr_last_error());
}
static inline void test_teardown(void) { gpuarr_shutdown(); }

/* Asserts a call returned GPUARR_OK, printing the name and last error otherwise. */
#define TEST_OK(call)                                                                              \
    do {                                                                                           \
        gpuarr_result test__r = (call);                                                            \
        cr_assert_eq(test__r, GPUARR_OK, "%s = %s: %s", #call, gpuarr_result_name(test__r),        \
                     gpuarr_last_error());                                                         \
    } while (0)

/* Expects a call to fail with `code` and a last error containing `substr`. */
#define TEST_FAIL_WITH(call, code, substr)                                                         \
    do {                                                                                           \
        gpuarr_result test__r = (call);                                                            \
        cr_expect_eq(test__r, (code), "%s = %s, want %s (%s)", #call, gpuarr_result_name(test__r), \
                     gpuarr_result_name(code), gpuarr_last_error());                               \
        cr_expect(strstr(gpuarr_last_error(), (substr)) != NULL,                                   \
                  "%s: last error \"%s\" does not name the problem (\"%s\")", #call,               \
                  gpuarr_last_error(), (substr));                                                  \
    } while (0)

/* ---------------------------------------------------------------------------------------------
 * Independent dtype facts (not read from the library)
 * ------------------------------------------------------------------------------------------- */
static inline size_t test_dtype_bytes(gpuarr_dtype t) {
    switch (t) {
    case GPUARR_BOOL: case GPUARR_I8: case GPUARR_U8: return 1;
    case GPUARR_I16: case GPUARR_U16: case GPUARR_F16: case GPUARR_BF16: return 2;
    case GPUARR_I32: case GPUARR_U32: case GPUARR_F32: return 4;
    case GPUARR_I64: case GPUARR_U64: case GPUARR_F64: return 8;
    default: return 0;
    }
}
static inline const char *test_dtype_str(gpuarr_dtype t) {
    switch (t) {
    case GPUARR_BOOL: return "bool"; case GPUARR_I8: return "i8"; case GPUARR_U8: return "u8";
    case GPUARR_I16: return "i16"; case GPUARR_U16: return "u16"; case GPUARR_I32: return "i32";
    case GPUARR_U32: return "u32"; case GPUARR_I64: return "i64"; case GPUARR_U64: return "u64";
    case GPUARR_F16: return "f16"; case GPUARR_BF16: return "bf16"; case GPUARR_F32: return "f32";
    case GPUARR_F64: return "f64"; default: return "invalid";
    }
}
static inline bool test_dtype_is_float(gpuarr_dtype t) {
    return t == GPUARR_F16 || t == GPUARR_BF16 || t == GPUARR_F32 || t == GPUARR_F64;
}
static inline bool test_dtype_is_signed_int(gpuarr_dtype t) {
    return t == GPUARR_I8 || t == GPUARR_I16 || t == GPUARR_I32 || t == GPUARR_I64;
}
static inline bool test_dtype_is_unsigned_int(gpuarr_dtype t) {
    return t == GPUARR_U8 || t == GPUARR_U16 || t == GPUARR_U32 || t == GPUARR_U64;
}

static inline int64_t test_shape_count(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

/* Raw element bits, zero-extended, little-endian host. */
static inline uint64_t test_load_bits(gpuarr_dtype t, const void *base, size_t i) {
    size_t sz = test_dtype_bytes(t);
    const unsigned char *p = (const unsigned char *)base + i * sz;
    switch (sz) {
    case 1: return *p;
    case 2: { uint16_t v; memcpy(&v, p, 2); return v; }
    case 4: { uint32_t v; memcpy(&v, p, 4); return v; }
    default: { uint64_t v; memcpy(&v, p, 8); return v; }
    }
}
static inline void test_store_bits(gpuarr_dtype t, void *base, size_t i, uint64_t bits) {
    size_t sz = test_dtype_bytes(t);
    unsigned char *p = (unsigned char *)base + i * sz;
    switch (sz) {
    case 1: *p = (unsigned char)bits; break;
    case 2: { uint16_t v = (uint16_t)bits; memcpy(p, &v, 2); break; }
    case 4: { uint32_t v = (uint32_t)bits; memcpy(p, &v, 4); break; }
    default: memcpy(p, &bits, 8); break;
    }
}
static inline uint64_t test_f64_bits(double x) { uint64_t b; memcpy(&b, &x, 8); return b; }
static inline uint32_t test_f32_bits(float x) { uint32_t b; memcpy(&b, &x, 4); return b; }
static inline double test_f64_from_bits(uint64_t b) { double x; memcpy(&x, &b, 8); return x; }
static inline float test_f32_from_bits(uint32_t b) { float x; memcpy(&x, &b, 4); return x; }

/* ---------------------------------------------------------------------------------------------
 * Deterministic random numbers (splitmix64)
 * ------------------------------------------------------------------------------------------- */
typedef struct test_rng { uint64_t s; } test_rng;
static inline uint64_t test_rng_next(test_rng *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline uint32_t test_rng_below(test_rng *r, uint32_t n) {
    return (uint32_t)(test_rng_next(r) % n);
}
/* count random elements of dtype t: random bit patterns (bool: 0 or 1). */
static inline void test_fill_random(gpuarr_dtype t, void *buf, size_t count, test_rng *r) {
    for (size_t i = 0; i < count; i++) {
        uint64_t b = test_rng_next(r);
        test_store_bits(t, buf, i, t == GPUARR_BOOL ? (b & 1) : b);
    }
}

/* Reads the whole array back with the same dtype and compares bytes. */
static inline void test_expect_array_bytes(gpuarr_array a, gpuarr_dtype t, const void *expected,
                                           size_t count, const char *what) {
    size_t sz = test_dtype_bytes(t);
    unsigned char *got = malloc(count * sz + 1);
    cr_assert_not_null(got);
    memset(got, 0xa5, count * sz + 1);
    gpuarr_result r = gpuarr_to_host_as(a, t, got, count);
    cr_assert_eq(r, GPUARR_OK, "%s: gpuarr_to_host_as(%s, %zu) = %s: %s", what,
                 test_dtype_str(t), count, gpuarr_result_name(r), gpuarr_last_error());
    for (size_t i = 0; i < count; i++) {
        uint64_t g = test_load_bits(t, got, i), e = test_load_bits(t, expected, i);
        if (g != e) {
            free(got);
            cr_assert_fail("%s: element %zu of %zu (%s): got 0x%" PRIx64 ", expected 0x%" PRIx64,
                           what, i, count, test_dtype_str(t), g, e);
        }
    }
    cr_assert_eq(got[count * sz], 0xa5, "%s: gpuarr_to_host_as wrote past %zu elements", what,
                 count);
    free(got);
}

/* ---------------------------------------------------------------------------------------------
 * Reference conversion (independent of the library)
 * ------------------------------------------------------------------------------------------- */
enum { REF_ZERO, REF_FINITE, REF_INF, REF_NAN };

typedef struct ref_value {
    int cls;          /* REF_ZERO, REF_FINITE, REF_INF, REF_NAN */
    bool neg;         /* sign (also of zero, infinity and NaN) */
    uint64_t mant;    /* REF_FINITE: value = mant * 2^exp, mant != 0 */
    int exp;
    uint64_t payload; /* REF_NAN: the fraction field left-aligned at bit 63 (bit 63 = quiet bit) */
    bool is_int;      /* integer or bool source: integer targets wrap instead of saturate */
    uint64_t ibits;   /* integer source as a 64-bit two's complement value */
} ref_value;

/* Float format parameters: exponent bits, fraction bits. */
static inline void ref_float_format(gpuarr_dtype t, int *expbits, int *fracbits) {
    switch (t) {
    case GPUARR_F16: *expbits = 5; *fracbits = 10; break;
    case GPUARR_BF16: *expbits = 8; *fracbits = 7; break;
    case GPUARR_F32: *expbits = 8; *fracbits = 23; break;
    default: *expbits = 11; *fracbits = 52; break;
    }
}

static inline int ref_msb(uint64_t x) { /* x != 0 */
    int m = 63;
    while (!(x >> m)) m--;
    return m;
}

static inline ref_value ref_decode(gpuarr_dtype t, uint64_t bits) {
    ref_value v;
    memset(&v, 0, sizeof v);
    if (t == GPUARR_BOOL) {
        v.is_int = true;
        v.ibits = bits != 0;
        v.cls = bits ? REF_FINITE : REF_ZERO;
        v.mant = 1;
        return v;
    }
    if (test_dtype_is_signed_int(t) || test_dtype_is_unsigned_int(t)) {
        int nb = (int)test_dtype_bytes(t) * 8;
        uint64_t mask = nb == 64 ? ~0ull : ((1ull << nb) - 1);
        uint64_t u = bits & mask;
        bool neg = false;
        if (test_dtype_is_signed_int(t) && nb < 64 && (u >> (nb - 1))) u |= ~mask; /* sign-extend */
        if (test_dtype_is_signed_int(t) && (u >> 63)) neg = true;
        v.is_int = true;
        v.ibits = u;
        v.neg = neg;
        uint64_t mag = neg ? (0 - u) : u;
        v.cls = mag ? REF_FINITE : REF_ZERO;
        v.mant = mag;
        v.exp = 0;
        if (!mag) v.neg = false;
        return v;
    }
    int eb, fb;
    ref_float_format(t, &eb, &fb);
    uint64_t fmask = (1ull << fb) - 1;
    uint64_t emax = (1ull << eb) - 1;
    int bias = (1 << (eb - 1)) - 1;
    uint64_t f = bits & fmask, e = (bits >> fb) & emax;
    v.neg = (bits >> (fb + eb)) & 1;
    if (e == emax) {
        if (f == 0) {
            v.cls = REF_INF;
        } else {
            v.cls = REF_NAN;
            v.payload = f << (64 - fb);
        }
    } else if (e == 0) {
        if (f == 0) {
            v.cls = REF_ZERO;
        } else {
            v.cls = REF_FINITE;
            v.mant = f;
            v.exp = 1 - bias - fb;
        }
    } else {
        v.cls = REF_FINITE;
        v.mant = f | (1ull << fb);
        v.exp = (int)e - bias - fb;
    }
    return v;
}

/* round(mant / 2^s) to nearest, ties to even; s >= 1 */
static inline uint64_t ref_round_shift(uint64_t mant, int s) {
    if (s > 64) return 0;
    if (s == 64) return mant > (1ull << 63) ? 1 : 0; /* exactly half: tie to the even 0 */
    uint64_t r = mant >> s, rem = mant & ((1ull << s) - 1), half = 1ull << (s - 1);
    if (rem > half || (rem == half && (r & 1))) r++;
    return r;
}

static inline uint64_t ref_encode_float(gpuarr_dtype t, ref_value v) {
    int eb, fb;
    ref_float_format(t, &eb, &fb);
    uint64_t sign = (uint64_t)v.neg << (eb + fb);
    uint64_t expall = ((1ull << eb) - 1) << fb;
    int bias = (1 << (eb - 1)) - 1, emin = 1 - bias;
    switch (v.cls) {
    case REF_ZERO: return sign;
    case REF_INF: return sign | expall;
    case REF_NAN: return sign | expall | (v.payload >> (64 - fb)) | (1ull << (fb - 1));
    default: break;
    }
    int E = ref_msb(v.mant) + v.exp; /* value in [2^E, 2^(E+1)) */
    if (E > bias + 1) return sign | expall; /* far beyond the largest finite value */
    int q = (E >= emin ? E : emin) - fb;   /* exponent of the last kept bit */
    uint64_t r;
    if (v.exp >= q)
        r = v.mant << (v.exp - q);
    else
        r = ref_round_shift(v.mant, q - v.exp);
    if (r == 0) return sign;
    if (r >> (fb + 1)) { /* rounding carried into a new bit */
        r >>= 1;
        q++;
    }
    if (r >> fb) { /* normal */
        int be = q + fb + bias;
        if (be >= (1 << eb) - 1) return sign | expall;
        return sign | ((uint64_t)be << fb) | (r & ((1ull << fb) - 1));
    }
    return sign | r; /* subnormal */
}

static inline uint64_t ref_encode_int(gpuarr_dtype t, ref_value v) {
    int nb = (int)test_dtype_bytes(t) * 8;
    uint64_t mask = nb == 64 ? ~0ull : ((1ull << nb) - 1);
    bool sgn = test_dtype_is_signed_int(t);
    if (v.is_int) return v.ibits & mask; /* wraps modulo 2^bits */
    if (v.cls == REF_NAN || v.cls == REF_ZERO) return 0;
    uint64_t smax = (1ull << (nb - 1)) - 1;      /* signed max */
    uint64_t smin_mag = 1ull << (nb - 1);         /* |signed min| */
    uint64_t umax = mask;
    bool huge = v.cls == REF_INF;
    uint64_t mag = 0;
    if (!huge) {
        if (v.exp >= 0) {
            if (ref_msb(v.mant) + v.exp >= 64)
                huge = true;
            else
                mag = v.mant << v.exp;
        } else {
            mag = (-v.exp >= 64) ? 0 : (v.mant >> -v.exp); /* truncation toward zero */
        }
    }
    if (sgn) {
        if (!v.neg) return (huge || mag > smax) ? smax : mag;
        if (huge || mag > smin_mag) return smin_mag & mask; /* the minimum: 100..0 */
        return (0 - mag) & mask;
    }
    if (v.neg) return 0;
    return (huge || mag > umax) ? umax : mag;
}

/* The expected bits of converting one element from dtype s (bits sbits) to dtype d. */
static inline uint64_t ref_cast_bits(gpuarr_dtype s, uint64_t sbits, gpuarr_dtype d) {
    if (s == d) return sbits; /* same dtype: a copy */
    ref_value v = ref_decode(s, sbits);
    if (d == GPUARR_BOOL) return v.cls != REF_ZERO;
    if (test_dtype_is_float(d)) return ref_encode_float(d, v);
    return ref_encode_int(d, v);
}

#endif /* GPUARR_TEST_COMMON_H */
