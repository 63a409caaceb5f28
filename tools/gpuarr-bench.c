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
 *
 * OpenCL section (each OpenCL device, or --device opencl:N): 64 MiB f32 uploads through
 * gpuarr_from_host (which allocates the array) against a raw blocking clEnqueueWriteBuffer into
 * a buffer that already exists, downloads through gpuarr_to_host against clEnqueueReadBuffer,
 * both against memcpy; on-device casts f32->f64, f64->f32, f32->f16 timed by events around the
 * kernel, against memcpy's rate; the first cast's kernel build time cold (empty caches, PoCL's
 * own cache off) and warm (gpuarr's binary cache), each in a fresh process.
 *
 * Pool section (--pool): the median cost of a cached allocate+free pair (the pool alone, and
 * gpuarr_empty + gpuarr_release) against the raw allocation it replaces (malloc + free on the
 * host; clCreateBuffer + making it resident + clReleaseMemObject on OpenCL); and an RMM-style
 * replay: 100,000 allocations of random sizes between 1 KiB and 4 MiB with at most 1,000 live,
 * timed against the same sequence of raw allocations, with fragmentation = peak reserved /
 * peak requested.
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

/* ---------------------------------------------------------------------------------------------
 * Pools
 * ------------------------------------------------------------------------------------------- */
/* The raw allocation the pool replaces, for the baselines. */
static void *raw_alloc(gpuarr__dev *d, size_t bytes) {
    void *mem = NULL;
    if (d->backend->mem_alloc(d, bytes, &mem) != GPUARR_OK) die("raw allocation");
    return mem;
}

static double time_pairs(gpuarr__dev *d, size_t bytes, int mode, int n) {
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        if (mode == 0) { /* the pool alone */
            gpuarr__block *b;
            if (gpuarr__pool_alloc(&d->pool, bytes, NULL, &b) != GPUARR_OK) die("gpuarr__pool_alloc");
            gpuarr__pool_free(&d->pool, b, NULL, 0);
        } else if (mode == 1) { /* the public calls */
            int64_t shape[1] = {(int64_t)bytes};
            gpuarr_array a;
            if (gpuarr_empty(d->info.device, GPUARR_U8, 1, shape, &a) != GPUARR_OK) die("gpuarr_empty");
            gpuarr_release(a);
        } else { /* the raw device allocation */
            d->backend->mem_free(d, raw_alloc(d, bytes));
        }
    }
    return (now_s() - t0) / n;
}

static void bench_pool_pairs(gpuarr__dev *d) {
    static const size_t sizes[] = {4096, (size_t)1 << 20, (size_t)64 << 20};
    printf("\n| %s: allocate + free, median per pair | pool alone | gpuarr_empty + gpuarr_release | raw %s (baseline) | raw / pool |\n|---|---|---|---|---|\n",
           d->info.spec, d->backend->id == GPUARR_BACKEND_HOST ? "malloc + free" : "clCreateBuffer + resident + release");
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t bytes = sizes[k];
        int raw_n = d->backend->id == GPUARR_BACKEND_HOST ? 2000 : 200, n = 20000;
        double pool[15], pub[15], raw[15];
        time_pairs(d, bytes, 0, 100); /* warm: the segment is cached */
        for (int r = 0; r < 15; r++) {
            pool[r] = time_pairs(d, bytes, 0, n);
            pub[r] = time_pairs(d, bytes, 1, n);
            raw[r] = time_pairs(d, bytes, 2, raw_n);
        }
        double tp = median(pool, 15), tu = median(pub, 15), tr = median(raw, 15);
        char label[32];
        gpuarr__format_bytes(label, sizeof label, bytes);
        printf("| %s | %.0f ns | %.0f ns | %.0f ns | %.0fx |\n", label, tp * 1e9, tu * 1e9, tr * 1e9, tr / tp);
    }
}

/* RMM-style replay: the same random sequence through the pool and through raw allocations. */
static void bench_pool_replay(gpuarr__dev *d) {
    enum { STEPS = 100000, LIVE = 1000 };
    static size_t sizes[STEPS];
    static int frees[STEPS];
    unsigned seed = 777;
    for (int i = 0; i < STEPS; i++) {
        seed = seed * 1103515245u + 12345u;
        sizes[i] = 1024 + (size_t)(seed >> 4) % ((size_t)4 << 20);
        seed = seed * 1103515245u + 12345u;
        frees[i] = (int)((seed >> 8) % LIVE);
    }
    void **live = (void **)calloc(LIVE, sizeof(void *));
    if (!live) die("calloc");
    gpuarr_device dev = d->info.device;
    gpuarr_pool_trim(dev);
    gpuarr_pool_reset_peaks(dev);
    uint64_t requested_now = 0, requested_peak = 0;
    size_t live_size[LIVE] = {0};
    double t0 = now_s();
    for (int i = 0; i < STEPS; i++) { /* pool */
        int slot = frees[i];
        if (live[slot]) {
            gpuarr__pool_free(&d->pool, (gpuarr__block *)live[slot], NULL, 0);
            requested_now -= live_size[slot];
        }
        gpuarr__block *b;
        if (gpuarr__pool_alloc(&d->pool, sizes[i], NULL, &b) != GPUARR_OK) die("replay: gpuarr__pool_alloc");
        live[slot] = b;
        live_size[slot] = sizes[i];
        requested_now += sizes[i];
        if (requested_now > requested_peak) requested_peak = requested_now;
    }
    double t_pool = now_s() - t0;
    gpuarr_pool_stats st;
    gpuarr_pool_get_stats(dev, &st);
    for (int s = 0; s < LIVE; s++)
        if (live[s]) gpuarr__pool_free(&d->pool, (gpuarr__block *)live[s], NULL, 0), live[s] = NULL;
    gpuarr_pool_trim(dev);
    t0 = now_s();
    for (int i = 0; i < STEPS; i++) { /* raw */
        int slot = frees[i];
        if (live[slot]) d->backend->mem_free(d, live[slot]);
        live[slot] = raw_alloc(d, sizes[i]);
    }
    double t_raw = now_s() - t0;
    for (int s = 0; s < LIVE; s++)
        if (live[s]) d->backend->mem_free(d, live[s]);
    free(live);
    printf("\n| %s replay: 100,000 allocations, 1 KiB..4 MiB, <= 1,000 live | time | per allocation |\n|---|---|---|\n", d->info.spec);
    printf("| pool | %.1f ms | %.2f us |\n| raw allocations (baseline) | %.1f ms | %.2f us |\n", t_pool * 1e3, t_pool * 1e6 / STEPS,
           t_raw * 1e3, t_raw * 1e6 / STEPS);
    printf("| pool speed-up | %.1fx | |\n", t_raw / t_pool);
    printf("| fragmentation: peak reserved / peak requested | %.3f (%.1f MiB / %.1f MiB) | |\n",
           (double)st.peak_reserved_bytes / (double)requested_peak, (double)st.peak_reserved_bytes / 1048576.0,
           (double)requested_peak / 1048576.0);
    gpuarr_pool_trim(dev);
}

static void bench_pools(const char *only) {
    for (int i = 0; i < gpuarr_device_count(); i++) {
        gpuarr__dev *d = &gpuarr__g.devices[i];
        if (only && strcmp(only, d->info.spec) != 0) continue;
        if (!only && d->backend->id == GPUARR_BACKEND_OPENCL && d->info.index > 0) continue;
        bench_pool_pairs(d);
        bench_pool_replay(d);
    }
}

/* ---------------------------------------------------------------------------------------------
 * OpenCL
 * ------------------------------------------------------------------------------------------- */
#ifndef GPUARR_NO_OPENCL
typedef struct cl_times {
    double memcpy_s[64], write_s[64], map_s[64], upload_s[64], read_s[64], download_s[64];
} cl_times;

/* One repetition of the raw baselines and gpuarr's calls, back to back. */
static void cl_transfer_rep(gpuarr_device dev, gpuarr__cl_command_queue q, gpuarr__cl_mem buf, float *src, float *dst,
                            float *scratch, size_t bytes, cl_times *t, int r) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    int64_t shape[1] = {(int64_t)(bytes / 4)};
    double t0 = now_s();
    memcpy(scratch, src, bytes);
    t->memcpy_s[r] = now_s() - t0;
    t0 = now_s();
    cl->clEnqueueWriteBuffer(q, buf, GPUARR__CL_TRUE, 0, bytes, src, 0, NULL, NULL);
    t->write_s[r] = now_s() - t0;
    t0 = now_s();
    gpuarr__cl_int e = 0;
    void *p = cl->clEnqueueMapBuffer(q, buf, GPUARR__CL_TRUE, GPUARR__CL_MAP_WRITE_INVALIDATE_REGION, 0, bytes, 0, NULL, NULL, &e);
    memcpy(p, src, bytes);
    cl->clEnqueueUnmapMemObject(q, buf, p, 0, NULL, NULL);
    cl->clFinish(q);
    t->map_s[r] = now_s() - t0;
    gpuarr_array a;
    t0 = now_s();
    if (gpuarr_from_host_as(dev, GPUARR_F32, src, 1, shape, &a) != GPUARR_OK) die("gpuarr_from_host_as");
    t->upload_s[r] = now_s() - t0;
    t0 = now_s();
    cl->clEnqueueReadBuffer(q, buf, GPUARR__CL_TRUE, 0, bytes, dst, 0, NULL, NULL);
    t->read_s[r] = now_s() - t0;
    t0 = now_s();
    if (gpuarr_to_host_as(a, GPUARR_F32, dst, bytes / 4) != GPUARR_OK) die("gpuarr_to_host_as");
    t->download_s[r] = now_s() - t0;
    gpuarr_release(a);
}

static void bench_opencl_transfers(gpuarr_device dev, size_t mib, int reps) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    size_t bytes = mib << 20;
    void *ctx, *queue;
    gpuarr_stream s;
    if (gpuarr_stream_create(dev, 0, &s) != GPUARR_OK || gpuarr_opencl_context_raw(dev, &ctx) != GPUARR_OK ||
        gpuarr_opencl_queue_raw(s, &queue) != GPUARR_OK)
        die("opencl setup");
    gpuarr__cl_int e = 0;
    gpuarr__cl_mem buf = cl->clCreateBuffer((gpuarr__cl_context)ctx, GPUARR__CL_MEM_READ_WRITE, bytes, NULL, &e);
    float *src = (float *)malloc(bytes), *dst = (float *)malloc(bytes), *scratch = (float *)malloc(bytes);
    if (!buf || !src || !dst || !scratch) die("allocating the buffers");
    fill_source(src, GPUARR_F32, bytes / 4);
    memset(dst, 0, bytes);
    memset(scratch, 0, bytes);
    cl_times t;
    for (int r = -2; r < reps; r++) cl_transfer_rep(dev, (gpuarr__cl_command_queue)queue, buf, src, dst, scratch, bytes, &t, r < 0 ? 0 : r);
    double tm = median(t.memcpy_s, reps), tw = median(t.write_s, reps), tmap = median(t.map_s, reps), tu = median(t.upload_s, reps);
    double tr = median(t.read_s, reps), td = median(t.download_s, reps);
    double gb = (double)bytes / 1e9;
    printf("| operation (%zu MiB f32) | median time | rate | vs clEnqueueWriteBuffer / ReadBuffer | vs memcpy |\n|---|---|---|---|---|\n", mib);
    printf("| memcpy, 1 thread (baseline) | %.2f ms | %.2f GB/s | | 1.00 |\n", tm * 1e3, gb / tm);
    printf("| clEnqueueWriteBuffer, blocking, existing buffer (baseline) | %.2f ms | %.2f GB/s | 1.00 | %.2f |\n", tw * 1e3, gb / tw, tm / tw);
    printf("| map + memcpy + unmap, existing buffer (1 thread) | %.2f ms | %.2f GB/s | %.2f | %.2f |\n", tmap * 1e3, gb / tmap, tw / tmap, tm / tmap);
    printf("| **gpuarr_from_host_as** (allocates the array) | %.2f ms | %.2f GB/s | **%.2f** | %.2f |\n", tu * 1e3, gb / tu, tw / tu, tm / tu);
    printf("| clEnqueueReadBuffer, blocking (baseline) | %.2f ms | %.2f GB/s | 1.00 | %.2f |\n", tr * 1e3, gb / tr, tm / tr);
    printf("| **gpuarr_to_host_as** into the caller's buffer | %.2f ms | %.2f GB/s | **%.2f** | %.2f |\n", td * 1e3, gb / td, tr / td, tm / td);
    cl->clReleaseMemObject(buf);
    gpuarr_stream_destroy(s);
    free(src);
    free(dst);
    free(scratch);
}

static void bench_opencl_casts(gpuarr_device dev, size_t mib, int reps) {
    static const cast_case cases[] = {{GPUARR_F32, GPUARR_F64}, {GPUARR_F64, GPUARR_F32}, {GPUARR_F32, GPUARR_F16}};
    size_t src_bytes = mib << 20;
    unsigned char *a = (unsigned char *)malloc(src_bytes), *m = (unsigned char *)malloc(src_bytes);
    if (!a || !m) die("malloc");
    memset(m, 1, src_bytes);
    gpuarr_event e0, e1;
    if (gpuarr_event_create(dev, GPUARR_EVENT_TIMING, &e0) != GPUARR_OK || gpuarr_event_create(dev, GPUARR_EVENT_TIMING, &e1) != GPUARR_OK)
        die("gpuarr_event_create");
    printf("\n| on-device cast (%zu MiB source) | bytes moved | kernel time (events) | rate | memcpy rate, same reps | ratio (median of reps) | gpuarr_convert with allocation |\n|---|---|---|---|---|---|---|\n", mib);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cast_case c = cases[i];
        size_t n = src_bytes / gpuarr_dtype_size(c.src), moved = src_bytes + n * gpuarr_dtype_size(c.dst);
        fill_source(a, c.src, n);
        int64_t shape[1] = {(int64_t)n};
        gpuarr_array src;
        if (gpuarr_from_host_as(dev, c.src, a, 1, shape, &src) != GPUARR_OK) die("gpuarr_from_host_as");
        double kernel[64], ratio[64], memcpy_s[64], total[64];
        for (int r = -2; r < reps; r++) {
            double t0 = now_s();
            memcpy(m, a, src_bytes);
            double tm = now_s() - t0;
            gpuarr_array out;
            t0 = now_s();
            if (gpuarr_event_record(e0, (gpuarr_stream){0}) != GPUARR_OK ||
                gpuarr_convert_async(src, dev, c.dst, (gpuarr_stream){0}, &out) != GPUARR_OK ||
                gpuarr_event_record(e1, (gpuarr_stream){0}) != GPUARR_OK || gpuarr_event_sync(e1) != GPUARR_OK)
                die("cast");
            double tt = now_s() - t0, ms = 0;
            if (gpuarr_event_elapsed_ms(e0, e1, &ms) != GPUARR_OK) die("gpuarr_event_elapsed_ms");
            gpuarr_release(out);
            if (r < 0) continue;
            kernel[r] = ms * 1e-3;
            memcpy_s[r] = tm;
            total[r] = tt;
            ratio[r] = ((double)moved / kernel[r]) / (2.0 * (double)src_bytes / tm);
        }
        gpuarr_release(src);
        double tk = median(kernel, reps), tm = median(memcpy_s, reps), tt = median(total, reps);
        printf("| %s->%s | %zu MiB | %.2f ms | %.2f GB/s | %.2f GB/s | %.2f | %.2f ms |\n", gpuarr_dtype_name(c.src),
               gpuarr_dtype_name(c.dst), moved >> 20, tk * 1e3, (double)moved / tk / 1e9, 2.0 * (double)src_bytes / tm / 1e9,
               median(ratio, reps), tt * 1e3);
    }
    gpuarr_event_destroy(e0);
    gpuarr_event_destroy(e1);
    free(a);
    free(m);
}

/* In this (fresh) process: the time of the first cast on dev, which builds the kernels. */
static int probe_build_time(const char *spec) {
    if (gpuarr_init(NULL) != GPUARR_OK) die("gpuarr_init");
    gpuarr_device dev;
    if (gpuarr_device_find(spec, &dev) != GPUARR_OK) die("gpuarr_device_find");
    float x[64] = {0};
    int64_t shape[1] = {64};
    gpuarr_array a, b;
    if (gpuarr_from_host(dev, x, 1, shape, &a) != GPUARR_OK) die("from_host");
    double t0 = now_s();
    if (gpuarr_convert(a, dev, GPUARR_F16, &b) != GPUARR_OK) die("first cast");
    printf("%.1f\n", (now_s() - t0) * 1e3);
    gpuarr_release(a);
    gpuarr_release(b);
    gpuarr_shutdown();
    return 0;
}

static double run_probe(const char *self, const char *spec, const char *cache_dir) {
    char cmd[1024], line[64] = "";
    snprintf(cmd, sizeof cmd, "POCL_KERNEL_CACHE=0 GPUARR_CACHE_DIR='%s' '%s' --probe-build '%s'", cache_dir, self, spec);
    FILE *p = popen(cmd, "r");
    if (!p || !fgets(line, sizeof line, p)) die("build-time probe");
    pclose(p);
    return strtod(line, NULL);
}

static void bench_opencl_build(const char *self, const char *spec) {
    char dir[] = "/tmp/gpuarr-bench-cache-XXXXXX";
    if (!mkdtemp(dir)) die("mkdtemp");
    double cold = run_probe(self, spec, dir), warm = run_probe(self, spec, dir);
    printf("\n| first f32->f16 cast on %s (builds that pair's kernel) | time |\n|---|---|\n", spec);
    printf("| cold: empty gpuarr cache, PoCL's kernel cache off | %.1f ms |\n| warm: gpuarr's binary cache | %.1f ms |\n", cold, warm);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static void bench_opencl(const char *self, size_t mib, int reps, const char *only) {
    for (int i = 0; i < gpuarr_device_count(); i++) {
        gpuarr_device_info info;
        gpuarr_device_get_info(gpuarr_device_at(i), &info);
        if (info.backend != GPUARR_BACKEND_OPENCL || (only && strcmp(only, info.spec) != 0)) continue;
        printf("\n## %s: %s (%s), %s\n\n", info.spec, info.name, info.vendor, info.version);
        bench_opencl_transfers(info.device, mib, reps);
        bench_opencl_casts(info.device, mib, reps);
        bench_opencl_build(self, info.spec);
        if (!only) break; /* one device per platform kind is enough unless asked */
    }
}
#endif

int main(int argc, char **argv) {
    size_t mib = 64;
    int reps = 11;
    const char *only = NULL;
    bool host = true, opencl = true, pools = true;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc) mib = (size_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) only = argv[++i];
        else if (strcmp(argv[i], "--host-only") == 0) opencl = pools = false;
        else if (strcmp(argv[i], "--opencl-only") == 0) host = pools = false;
        else if (strcmp(argv[i], "--pool-only") == 0) host = opencl = false;
#ifndef GPUARR_NO_OPENCL
        else if (strcmp(argv[i], "--probe-build") == 0 && i + 1 < argc) return probe_build_time(argv[i + 1]);
#endif
        else {
            fprintf(stderr, "usage: %s [--mib N] [--reps N (1..63)] [--host-only | --opencl-only | --pool-only] [--device SPEC]\n", argv[0]);
            return 2;
        }
    }
    if (mib == 0 || reps < 1 || reps > 63) {
        fprintf(stderr, "gpuarr-bench: --mib must be > 0 and --reps 1..63\n");
        return 2;
    }
    if (gpuarr_init(NULL) != GPUARR_OK) die("gpuarr_init");
    gpuarr_device_info host_info;
    gpuarr_device_get_info(gpuarr_host(), &host_info);
    gpuarr_desc desc;
    gpuarr_query_desc(&desc);
    printf("## Host: %s, %d CPUs, gpuarr host threads: %d, cast kernels: %s\n\n", host_info.name, host_info.compute_units,
           desc.host_threads, gpuarr__g.host_isa);
    printf("memcpy: glibc, one thread, %zu MiB, interleaved with the measured calls in every repetition; %d repetitions.\n\n", mib, reps);
    if (host) {
        bench_host_casts(mib, reps);
        bench_small_alloc();
    }
    if (pools) bench_pools(only);
#ifndef GPUARR_NO_OPENCL
    if (opencl) bench_opencl(argv[0], mib, reps, only);
#else
    GPUARR__UNUSED(only);
    GPUARR__UNUSED(opencl);
#endif
    gpuarr_shutdown();
    return 0;
}
