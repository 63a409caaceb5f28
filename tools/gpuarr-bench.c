/* gpuarr-bench: measured performance, each figure next to its baseline from the same run.
 *
 *   gpuarr-bench [--mib N] [--reps N]
 *
 * Host section: casts f32->f64, f64->f32, u8->f32, f32->f16, f32->bf16 on N MiB source arrays
 * (default 64) against single-threaded memcpy of the same source bytes. Rates count bytes read
 * plus bytes written. "kernel" casts into memory that is already faulted in; "convert" is the
 * public gpuarr_convert, which also allocates (and first-touches) its output. Each repetition
 * runs memcpy, the kernel and gpuarr_convert back to back; ratios are the median over
 * repetitions of (cast rate / that repetition's memcpy rate). Then the median cost of gpuarr_empty + gpuarr_release of a 4 KiB host array.
 * Output is a Markdown table, ready for bench/results/. */
#define GPUARR_IMPLEMENTATION
#include "gpuarr.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, compare_doubles);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void die(const char *what) {
    fprintf(stderr, "gpuarr-bench: %s: %s\n", what, gpuarr_last_error());
    exit(1);
}

static void fill_source(void *p, gpuarr_dtype t, size_t n) {
    unsigned seed = 12345;
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        double v = (double)(seed >> 8) / (double)(1u << 24) * 200.0 - 100.0;
        switch (t) {
        case GPUARR_F32: ((float *)p)[i] = (float)v; break;
        case GPUARR_F64: ((double *)p)[i] = v; break;
        case GPUARR_U8: ((uint8_t *)p)[i] = (uint8_t)(seed >> 16); break;
        default: break;
        }
    }
}

typedef struct cast_case {
    gpuarr_dtype src, dst;
} cast_case;

static volatile unsigned char sink;

/* One repetition of each contender, interleaved, so that a noisy neighbour slows both alike. */
typedef struct cast_times {
    double memcpy_s[64], kernel_s[64], convert_s[64], kernel_ratio[64], convert_ratio[64];
} cast_times;

static double run_memcpy(void *dst, const void *src, size_t bytes) {
    double t0 = now_s();
    memcpy(dst, src, bytes);
    double t = now_s() - t0;
    sink = ((unsigned char *)dst)[bytes / 2];
    return t;
}

static double run_kernel(cast_case c, void *dst, const void *src, size_t n) {
    double t0 = now_s();
    gpuarr__cpu_cast(dst, c.dst, src, c.src, n);
    double t = now_s() - t0;
    sink = ((unsigned char *)dst)[n / 2];
    return t;
}

static double run_convert(cast_case c, gpuarr_array src) {
    gpuarr_array out;
    double t0 = now_s();
    if (gpuarr_convert(src, gpuarr_host(), c.dst, &out) != GPUARR_OK) die("gpuarr_convert");
    double t = now_s() - t0;
    gpuarr_release(out);
    return t;
}

static void bench_host_casts(size_t mib, int reps) {
    static const cast_case cases[] = {{GPUARR_F32, GPUARR_F64}, {GPUARR_F64, GPUARR_F32}, {GPUARR_U8, GPUARR_F32},
                                      {GPUARR_F32, GPUARR_F16}, {GPUARR_F32, GPUARR_BF16}};
    size_t src_bytes = mib << 20;
    unsigned char *a = (unsigned char *)malloc(src_bytes), *b = (unsigned char *)malloc(src_bytes * 4),
                  *m = (unsigned char *)malloc(src_bytes);
    if (!a || !b || !m) die("malloc");
    memset(a, 1, src_bytes);
    memset(b, 1, src_bytes * 4); /* fault the destinations in before timing */
    memset(m, 1, src_bytes);
    printf("| operation | source | bytes moved | median time | rate (read+written) | memcpy rate, same reps | ratio (median of reps) |\n");
    printf("|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cast_case c = cases[i];
        size_t n = src_bytes / gpuarr_dtype_size(c.src);
        size_t moved = src_bytes + n * gpuarr_dtype_size(c.dst);
        fill_source(a, c.src, n);
        int64_t shape[1] = {(int64_t)n};
        gpuarr_array src;
        if (gpuarr_from_host_as(gpuarr_host(), c.src, a, 1, shape, &src) != GPUARR_OK) die("gpuarr_from_host_as");
        cast_times t;
        for (int r = -2; r < reps; r++) { /* two warm-up rounds */
            double tm = run_memcpy(m, a, src_bytes), tk = run_kernel(c, b, a, n), tc = run_convert(c, src);
            if (r < 0) continue;
            double memcpy_rate = 2.0 * (double)src_bytes / tm;
            t.memcpy_s[r] = tm;
            t.kernel_s[r] = tk;
            t.convert_s[r] = tc;
            t.kernel_ratio[r] = (double)moved / tk / memcpy_rate;
            t.convert_ratio[r] = (double)moved / tc / memcpy_rate;
        }
        gpuarr_release(src);
        double tm = median(t.memcpy_s, reps), tk = median(t.kernel_s, reps), tc = median(t.convert_s, reps);
        double mrate = 2.0 * (double)src_bytes / tm / 1e9;
        printf("| cast %s->%s, kernel | %zu MiB | %zu MiB | %.2f ms | %.2f GB/s | %.2f GB/s | %.2f |\n", gpuarr_dtype_name(c.src),
               gpuarr_dtype_name(c.dst), mib, moved >> 20, tk * 1e3, (double)moved / tk / 1e9, mrate, median(t.kernel_ratio, reps));
        printf("| cast %s->%s, gpuarr_convert (allocates) | %zu MiB | %zu MiB | %.2f ms | %.2f GB/s | %.2f GB/s | %.2f |\n",
               gpuarr_dtype_name(c.src), gpuarr_dtype_name(c.dst), mib, moved >> 20, tc * 1e3, (double)moved / tc / 1e9, mrate,
               median(t.convert_ratio, reps));
    }
    free(a);
    free(b);
    free(m);
}

static void bench_small_alloc(void) {
    enum { BATCH = 1000, BATCHES = 101 };
    double t[BATCHES];
    int64_t shape[1] = {4096 / 4};
    double base[BATCHES];
    for (int k = 0; k < BATCHES; k++) {
        double t0 = now_s();
        for (int i = 0; i < BATCH; i++) {
            gpuarr_array a;
            if (gpuarr_empty(gpuarr_host(), GPUARR_F32, 1, shape, &a) != GPUARR_OK) die("gpuarr_empty");
            gpuarr_release(a);
        }
        t[k] = (now_s() - t0) / BATCH;
        t0 = now_s();
        for (int i = 0; i < BATCH; i++) {
            void *p = malloc(4096);
            sink = (unsigned char)(uintptr_t)p;
            free(p);
        }
        base[k] = (now_s() - t0) / BATCH;
    }
    printf("\n| operation | median per call | baseline (malloc+free 4 KiB, same run) |\n|---|---|---|\n");
    printf("| gpuarr_empty + gpuarr_release, 4 KiB host array | %.0f ns | %.0f ns |\n", median(t, BATCHES) * 1e9,
           median(base, BATCHES) * 1e9);
}

int main(int argc, char **argv) {
    size_t mib = 64;
    int reps = 11;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc) mib = (size_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--mib N] [--reps N (1..63)]\n", argv[0]);
            return 2;
        }
    }
    if (mib == 0 || reps < 1 || reps > 63) {
        fprintf(stderr, "gpuarr-bench: --mib must be > 0 and --reps 1..63\n");
        return 2;
    }
    if (gpuarr_init(NULL) != GPUARR_OK) die("gpuarr_init");
    gpuarr_device_info host;
    gpuarr_device_get_info(gpuarr_host(), &host);
    gpuarr_desc desc;
    gpuarr_query_desc(&desc);
    printf("## Host: %s, %d CPUs, gpuarr host threads: %d, cast kernels: %s\n\n", host.name, host.compute_units,
           desc.host_threads, gpuarr__g.host_isa);
    printf("memcpy: glibc, one thread, %zu MiB, interleaved with each cast in every repetition; %d repetitions.\n\n", mib, reps);
    bench_host_casts(mib, reps);
    bench_small_alloc();
    gpuarr_shutdown();
    return 0;
}
