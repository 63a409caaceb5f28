/*
 * gpuarr_kernels.h -- the one source of gpuarr's conversion rules, compiled three ways:
 *   - as C by gpuarr.h's implementation: the host reference and the host cast loops;
 *   - as OpenCL C by the OpenCL backend, and as CUDA C++ by the CUDA backend, which receive it
 *     as text (generated/gpuarr_kernels_source.h, generated from this file by
 *     tools/embed-kernels.sh; `make test` fails if the two differ).
 *
 * The includer first defines the dialect:
 *   GPUARR_K_FN                 qualifiers of helper functions (static inline, __device__ ...)
 *   GPUARR_K_F32_BITS(x)        float <-> uint32_t and double <-> uint64_t bit casts
 *   GPUARR_K_BITS_F32(u)  GPUARR_K_F64_BITS(x)  GPUARR_K_BITS_F64(u)
 *   GPUARR_K_CLZ64(x)           leading zeros of a nonzero uint64_t, as int
 *   GPUARR_K_U64(c)             a 64-bit unsigned constant
 *   GPUARR_K_HAVE_F64           defined when double arithmetic is available
 * and, for kernels (devices only):
 *   GPUARR_K_KERNEL  GPUARR_K_GLOBAL  GPUARR_K_INDEX (the global work-item index)  GPUARR_K_SIZE
 *   GPUARR_K_PER_ITEM           optional: elements per work-item (below; default 1)
 * Integer types are the <stdint.h> names; device preambles typedef them.
 *
 * Everything is branch-free (selects on masks), so host loops vectorize and GPU warps do not
 * diverge. Denormal inputs and results follow IEEE on devices that support f32 denormals (the
 * host, CUDA, PoCL); comparisons with zero look at the bits, so they are exact everywhere.
 */
#ifndef GPUARR_KERNELS_INCLUDED
#define GPUARR_KERNELS_INCLUDED

GPUARR_K_FN uint32_t gpuarr_k_mask32(bool c) { return (uint32_t)0 - (uint32_t)c; }
GPUARR_K_FN uint64_t gpuarr_k_mask64(bool c) { return (uint64_t)0 - (uint64_t)c; }
GPUARR_K_FN uint32_t gpuarr_k_select32(uint32_t m, uint32_t a, uint32_t b) { return (a & m) | (b & ~m); }
GPUARR_K_FN uint64_t gpuarr_k_select64(uint64_t m, uint64_t a, uint64_t b) { return (a & m) | (b & ~m); }

/* f16 -> f32 is exact: rebias normals, scale subnormals by 2^-24 (the results are f32 normals),
   keep infinities; a NaN keeps its payload and gets the quiet bit. */
GPUARR_K_FN float gpuarr_k_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = (uint32_t)h & 0x7fffu;
    uint32_t normal = (em << 13) + 0x38000000u;
    uint32_t special = (em << 13) | 0x7f800000u | (gpuarr_k_mask32(em > 0x7c00u) & 0x00400000u);
    uint32_t subnormal = GPUARR_K_F32_BITS((float)(int32_t)em * 5.9604644775390625e-08f);
    uint32_t r = gpuarr_k_select32(gpuarr_k_mask32(em >= 0x7c00u), special, normal);
    r = gpuarr_k_select32(gpuarr_k_mask32(em < 0x0400u), subnormal, r);
    return GPUARR_K_BITS_F32(r | sign);
}

GPUARR_K_FN float gpuarr_k_bf16_to_f32(uint16_t h) {
    uint32_t quiet = gpuarr_k_mask32((h & 0x7fffu) > 0x7f80u) & 0x00400000u; /* NaN: quiet bit */
    return GPUARR_K_BITS_F32(((uint32_t)h << 16) | quiet);
}

/* f32 -> f16, nearest-even. Normals: rebias and round on the 13 dropped bits. Results below
   2^-14 are subnormal: adding 0.5f (whose ulp is 2^-24, the f16 subnormal step) lets the FPU
   round. >= 65520 rounds to infinity. Equal to x86 F16C on all 2^32 inputs. */
GPUARR_K_FN uint16_t gpuarr_k_f32_to_f16(float x) {
    uint32_t f = GPUARR_K_F32_BITS(x);
    uint32_t sign = (f >> 16) & 0x8000u;
    uint32_t a = f & 0x7fffffffu;
    int32_t ai = (int32_t)a; /* non-negative; signed compares vectorize on plain SSE2 */
    uint32_t normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
    uint32_t subnormal = GPUARR_K_F32_BITS(GPUARR_K_BITS_F32(a) + 0.5f) - 0x3f000000u;
    uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
    uint32_t h = gpuarr_k_select32(gpuarr_k_mask32(ai < 0x38800000), subnormal, normal);
    h = gpuarr_k_select32(gpuarr_k_mask32(ai >= 0x477ff000), 0x7c00u, h);
    h = gpuarr_k_select32(gpuarr_k_mask32(ai > 0x7f800000), nan, h);
    return (uint16_t)(h | sign);
}

/* f32 -> bf16, nearest-even on the 16 dropped bits (carries into the exponent, up to inf). */
GPUARR_K_FN uint16_t gpuarr_k_f32_to_bf16(float x) {
    uint32_t f = GPUARR_K_F32_BITS(x);
    uint32_t rounded = (f + 0x7fffu + ((f >> 16) & 1u)) >> 16;
    uint32_t nan = (f >> 16) | 0x40u;
    int32_t a = (int32_t)(f & 0x7fffffffu);
    return (uint16_t)gpuarr_k_select32(gpuarr_k_mask32(a > 0x7f800000), nan, rounded);
}

/* x != 0 on the bits: exact even where the hardware treats denormals as zero. */
GPUARR_K_FN uint8_t gpuarr_k_f32_nonzero(float x) { return (uint8_t)((GPUARR_K_F32_BITS(x) & 0x7fffffffu) != 0); }

/* 64-bit integers to f32 "to odd": truncate, then set the last bit if anything was dropped.
   A later nearest-even rounding to <= 22 bits (bf16) is then exact: no double rounding. */
GPUARR_K_FN float gpuarr_k_u64_to_f32_odd(uint64_t m) {
    int shift = 40 - GPUARR_K_CLZ64(m | 1u);
    shift = shift < 0 ? 0 : shift;
    uint64_t top = (m >> shift) | (uint64_t)((m & ((GPUARR_K_U64(1) << shift) - 1u)) != 0);
    return (float)top * GPUARR_K_BITS_F32((uint32_t)(127 + shift) << 23);
}
GPUARR_K_FN float gpuarr_k_i64_to_f32_odd(int64_t v) {
    uint64_t m = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    float r = gpuarr_k_u64_to_f32_odd(m);
    return v < 0 ? -r : r;
}

#ifdef GPUARR_K_HAVE_F64
/* f64 -> f16 directly (going through f32 would round twice). Same scheme on 64 bits; the
   subnormal magic is 2^28, whose ulp in double is 2^-24. */
GPUARR_K_FN uint16_t gpuarr_k_f64_to_f16(double x) {
    uint64_t d = GPUARR_K_F64_BITS(x);
    uint64_t sign = (d >> 48) & 0x8000u;
    uint64_t a = d & GPUARR_K_U64(0x7fffffffffffffff);
    int64_t ai = (int64_t)a;
    uint64_t normal = (a - (GPUARR_K_U64(1008) << 52) + GPUARR_K_U64(0x1ffffffffff) + ((a >> 42) & 1u)) >> 42;
    uint64_t subnormal = GPUARR_K_F64_BITS(GPUARR_K_BITS_F64(a) + 268435456.0) - GPUARR_K_U64(0x41b0000000000000);
    uint64_t nan = 0x7e00u | ((a >> 42) & 0x3ffu);
    uint64_t h = gpuarr_k_select64(gpuarr_k_mask64(ai < (int64_t)GPUARR_K_U64(0x3f10000000000000)), subnormal, normal);
    h = gpuarr_k_select64(gpuarr_k_mask64(ai >= (int64_t)GPUARR_K_U64(0x40effe0000000000)), 0x7c00u, h); /* 65520 */
    h = gpuarr_k_select64(gpuarr_k_mask64(ai > (int64_t)GPUARR_K_U64(0x7ff0000000000000)), nan, h);
    return (uint16_t)(h | sign);
}

/* f64 -> bf16 directly. Below 2^-126 the result is subnormal: magic 2^-81 (ulp 2^-133). At or
   above (2 - 2^-8) * 2^127 it rounds to infinity. */
GPUARR_K_FN uint16_t gpuarr_k_f64_to_bf16(double x) {
    uint64_t d = GPUARR_K_F64_BITS(x);
    uint64_t sign = (d >> 48) & 0x8000u;
    uint64_t a = d & GPUARR_K_U64(0x7fffffffffffffff);
    int64_t ai = (int64_t)a;
    uint64_t normal = (a - (GPUARR_K_U64(896) << 52) + GPUARR_K_U64(0xfffffffffff) + ((a >> 45) & 1u)) >> 45;
    uint64_t subnormal = GPUARR_K_F64_BITS(GPUARR_K_BITS_F64(a) + 0x1p-81) - GPUARR_K_U64(0x3ae0000000000000);
    uint64_t nan = 0x7fc0u | ((a >> 45) & 0x7fu);
    uint64_t h = gpuarr_k_select64(gpuarr_k_mask64(ai < (int64_t)GPUARR_K_U64(0x3810000000000000)), subnormal, normal);
    h = gpuarr_k_select64(gpuarr_k_mask64(ai >= (int64_t)GPUARR_K_U64(0x47eff00000000000)), 0x7f80u, h);
    h = gpuarr_k_select64(gpuarr_k_mask64(ai > (int64_t)GPUARR_K_U64(0x7ff0000000000000)), nan, h);
    return (uint16_t)(h | sign);
}

GPUARR_K_FN uint8_t gpuarr_k_f64_nonzero(double x) {
    return (uint8_t)((GPUARR_K_F64_BITS(x) & GPUARR_K_U64(0x7fffffffffffffff)) != 0);
}
#endif

/* ---------------------------------------------------------------------------------------------
 * The cast of one value. It is read into its category type (the dtype table's `cat` column:
 * exact for every source), then written by the destination kind:
 *     GPUARR_K_STORE_<kind>_<cat>(T, lo, hi, v)
 * Integer sources of <= 32 bits read as int32_t, so u8 -> f32 is one signed conversion.
 * ------------------------------------------------------------------------------------------- */
#define GPUARR_K_LOAD_gpuarr__k_bool(x) ((int32_t)((x) != 0))
#define GPUARR_K_LOAD_gpuarr__k_int(x) (x)
#define GPUARR_K_LOAD_gpuarr__k_f16(x) gpuarr_k_f16_to_f32(x)
#define GPUARR_K_LOAD_gpuarr__k_bf16(x) gpuarr_k_bf16_to_f32(x)
#define GPUARR_K_LOAD_gpuarr__k_f32(x) (x)
#define GPUARR_K_LOAD_gpuarr__k_f64(x) (x)

#define GPUARR_K_TO_BOOL(T, lo, hi, v) ((T)((v) != 0))
#define GPUARR_K_TO_INT_WRAP(T, lo, hi, v) ((T)(v))
/* truncate toward zero, saturate, NaN -> 0; (hi/2+1)*2 is 2^bits (unsigned) or 2^(bits-1) */
#define GPUARR_K_TO_INT_SAT(T, lo, hi, v, F)                                                   \
    ((v) != (v)                        ? (T)0                                                  \
     : (v) <= (F)(lo)                  ? (T)(lo)                                               \
     : (v) >= (F)((hi) / 2 + 1) * (F)2 ? (T)(hi)                                               \
                                       : (T)(v))

#define GPUARR_K_STORE_gpuarr__k_bool_int32_t GPUARR_K_TO_BOOL
#define GPUARR_K_STORE_gpuarr__k_bool_uint32_t GPUARR_K_TO_BOOL
#define GPUARR_K_STORE_gpuarr__k_bool_int64_t GPUARR_K_TO_BOOL
#define GPUARR_K_STORE_gpuarr__k_bool_uint64_t GPUARR_K_TO_BOOL
#define GPUARR_K_STORE_gpuarr__k_bool_float(T, lo, hi, v) gpuarr_k_f32_nonzero(v)
#define GPUARR_K_STORE_gpuarr__k_bool_double(T, lo, hi, v) gpuarr_k_f64_nonzero(v)
#define GPUARR_K_STORE_gpuarr__k_int_int32_t GPUARR_K_TO_INT_WRAP
#define GPUARR_K_STORE_gpuarr__k_int_uint32_t GPUARR_K_TO_INT_WRAP
#define GPUARR_K_STORE_gpuarr__k_int_int64_t GPUARR_K_TO_INT_WRAP
#define GPUARR_K_STORE_gpuarr__k_int_uint64_t GPUARR_K_TO_INT_WRAP
#define GPUARR_K_STORE_gpuarr__k_int_float(T, lo, hi, v) GPUARR_K_TO_INT_SAT(T, lo, hi, v, float)
#define GPUARR_K_STORE_gpuarr__k_int_double(T, lo, hi, v) GPUARR_K_TO_INT_SAT(T, lo, hi, v, double)
/* integers -> f16: exact in f32 below 2^24, and anything larger overflows f16 to inf anyway */
#define GPUARR_K_STORE_gpuarr__k_f16_int32_t(T, lo, hi, v) gpuarr_k_f32_to_f16((float)(v))
#define GPUARR_K_STORE_gpuarr__k_f16_uint32_t(T, lo, hi, v) gpuarr_k_f32_to_f16((float)(v))
#define GPUARR_K_STORE_gpuarr__k_f16_int64_t(T, lo, hi, v) gpuarr_k_f32_to_f16((float)(v))
#define GPUARR_K_STORE_gpuarr__k_f16_uint64_t(T, lo, hi, v) gpuarr_k_f32_to_f16((float)(v))
#define GPUARR_K_STORE_gpuarr__k_f16_float(T, lo, hi, v) gpuarr_k_f32_to_f16(v)
#define GPUARR_K_STORE_gpuarr__k_f16_double(T, lo, hi, v) gpuarr_k_f64_to_f16(v)
/* integers -> bf16: 32-bit ones are exact in double where there is one (vectorizes on the host),
   else rounded to f32 "to odd" like the 64-bit ones; both are correctly rounded */
#ifdef GPUARR_K_HAVE_F64
#define GPUARR_K_STORE_gpuarr__k_bf16_int32_t(T, lo, hi, v) gpuarr_k_f64_to_bf16((double)(v))
#define GPUARR_K_STORE_gpuarr__k_bf16_uint32_t(T, lo, hi, v) gpuarr_k_f64_to_bf16((double)(v))
#else
#define GPUARR_K_STORE_gpuarr__k_bf16_int32_t(T, lo, hi, v) gpuarr_k_f32_to_bf16(gpuarr_k_i64_to_f32_odd((int64_t)(v)))
#define GPUARR_K_STORE_gpuarr__k_bf16_uint32_t(T, lo, hi, v) gpuarr_k_f32_to_bf16(gpuarr_k_u64_to_f32_odd((uint64_t)(v)))
#endif
#define GPUARR_K_STORE_gpuarr__k_bf16_int64_t(T, lo, hi, v) gpuarr_k_f32_to_bf16(gpuarr_k_i64_to_f32_odd(v))
#define GPUARR_K_STORE_gpuarr__k_bf16_uint64_t(T, lo, hi, v) gpuarr_k_f32_to_bf16(gpuarr_k_u64_to_f32_odd(v))
#define GPUARR_K_STORE_gpuarr__k_bf16_float(T, lo, hi, v) gpuarr_k_f32_to_bf16(v)
#define GPUARR_K_STORE_gpuarr__k_bf16_double(T, lo, hi, v) gpuarr_k_f64_to_bf16(v)
#define GPUARR_K_STORE_gpuarr__k_f32_int32_t(T, lo, hi, v) ((float)(v))
#define GPUARR_K_STORE_gpuarr__k_f32_uint32_t(T, lo, hi, v) ((float)(v))
#define GPUARR_K_STORE_gpuarr__k_f32_int64_t(T, lo, hi, v) ((float)(v))
#define GPUARR_K_STORE_gpuarr__k_f32_uint64_t(T, lo, hi, v) ((float)(v))
#define GPUARR_K_STORE_gpuarr__k_f32_float(T, lo, hi, v) (v)
#define GPUARR_K_STORE_gpuarr__k_f32_double(T, lo, hi, v) ((float)(v))
#define GPUARR_K_STORE_gpuarr__k_f64_int32_t(T, lo, hi, v) ((double)(v))
#define GPUARR_K_STORE_gpuarr__k_f64_uint32_t(T, lo, hi, v) ((double)(v))
#define GPUARR_K_STORE_gpuarr__k_f64_int64_t(T, lo, hi, v) ((double)(v))
#define GPUARR_K_STORE_gpuarr__k_f64_uint64_t(T, lo, hi, v) ((double)(v))
#define GPUARR_K_STORE_gpuarr__k_f64_float(T, lo, hi, v) ((double)(v))
#define GPUARR_K_STORE_gpuarr__k_f64_double(T, lo, hi, v) (v)

#define GPUARR_K_CONVERT_ONE(skind, scat, dkind, dstore, dlo, dhi, x)                          \
    GPUARR_K_STORE_##dkind##_##scat(dstore, dlo, dhi, (scat)GPUARR_K_LOAD_##skind(x))

/* ---------------------------------------------------------------------------------------------
 * Device kernels. One cast kernel per dtype pair, instantiated by the backend from the dtype
 * table; offsets are in elements. GPUARR_K_PER_ITEM (the includer's, default 1) elements per
 * work-item:
 *   1  work-item i casts element i: neighbouring work-items touch neighbouring elements, the
 *      coalesced pattern GPUs want (CUDA, OpenCL GPUs).
 *   K  work-item i casts elements [iK, iK + K), the last one fewer: each work-item streams one
 *      contiguous run, which a CPU compiler (PoCL) turns into full-width vector loads, converts
 *      and stores, for any pair; a run of K elements per work-item also makes the work-groups K
 *      times larger, so fewer of them are scheduled. (vloadK/vstoreK through private arrays,
 *      tried on PoCL 3.1, were slower for f32->f16: the per-lane conversion stayed scalar; a
 *      dialect may give a pair its own run, below.)
 * ------------------------------------------------------------------------------------------- */
#ifndef GPUARR_K_PER_ITEM
#define GPUARR_K_PER_ITEM 1
#endif
#if GPUARR_K_PER_ITEM == 1
#define GPUARR_K_CAST_KERNEL(S, sstore, skind, scat, D, dstore, dkind, dlo, dhi)               \
    GPUARR_K_KERNEL void gpuarr_k_cast_##S##_##D(GPUARR_K_GLOBAL const sstore *src, GPUARR_K_SIZE src_off, \
                                                 GPUARR_K_GLOBAL dstore *dst, GPUARR_K_SIZE dst_off,     \
                                                 GPUARR_K_SIZE n) {                            \
        GPUARR_K_SIZE i = GPUARR_K_INDEX;                                                      \
        if (i < n) dst[dst_off + i] = GPUARR_K_CONVERT_ONE(skind, scat, dkind, dstore, dlo, dhi, src[src_off + i]); \
    }
#else
/* A full run: GPUARR_K_RUN_<skind>_<dkind>, where the dialect defines it as "~, MACRO" (a faster
   form of that pair with the same bits, e.g. a device's vector half store), else element by
   element with a constant trip count, which the compiler unrolls and vectorizes. */
#define GPUARR_K_SECOND_(a, b, ...) b
#define GPUARR_K_SECOND(...) GPUARR_K_SECOND_(__VA_ARGS__)
#define GPUARR_K_RUN(skind, dkind) GPUARR_K_SECOND(GPUARR_K_RUN_##skind##_##dkind, GPUARR_K_RUN_EACH, ~)
#define GPUARR_K_RUN_EACH(skind, scat, dkind, dstore, dlo, dhi, s, d)                          \
    for (int j = 0; j < GPUARR_K_PER_ITEM; j++) d[j] = GPUARR_K_CONVERT_ONE(skind, scat, dkind, dstore, dlo, dhi, s[j])
/* the last, partial run is scalar */
#define GPUARR_K_CAST_KERNEL(S, sstore, skind, scat, D, dstore, dkind, dlo, dhi)               \
    GPUARR_K_KERNEL void gpuarr_k_cast_##S##_##D(GPUARR_K_GLOBAL const sstore *src, GPUARR_K_SIZE src_off, \
                                                 GPUARR_K_GLOBAL dstore *dst, GPUARR_K_SIZE dst_off,     \
                                                 GPUARR_K_SIZE n) {                            \
        GPUARR_K_SIZE first = GPUARR_K_INDEX * (GPUARR_K_SIZE)GPUARR_K_PER_ITEM;               \
        GPUARR_K_GLOBAL const sstore *s = src + src_off + first;                               \
        GPUARR_K_GLOBAL dstore *d = dst + dst_off + first;                                     \
        if (first + (GPUARR_K_SIZE)GPUARR_K_PER_ITEM <= n) {                                   \
            GPUARR_K_RUN(skind, dkind)(skind, scat, dkind, dstore, dlo, dhi, s, d);            \
        } else {                                                                               \
            for (GPUARR_K_SIZE j = 0; first + j < n; j++)                                      \
                d[j] = GPUARR_K_CONVERT_ONE(skind, scat, dkind, dstore, dlo, dhi, s[j]);       \
        }                                                                                      \
    }
#endif

#ifdef GPUARR_KERNEL_INJECT_ERROR /* lets the tests drive a build failure */
#error "gpuarr: kernel build failure injected by GPUARR_KERNEL_INJECT_ERROR"
#endif

#endif /* GPUARR_KERNELS_INCLUDED */
