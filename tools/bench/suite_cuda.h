/* suite_cuda.h -- transfers, casts, kernel loads and the pool on CUDA (gpuarr-bench --cuda-only)
 *
 * CUDA section (the first CUDA device, or --device cuda:N; --cuda-mib N, default 256), every
 * baseline a raw driver call in the same run: uploads and downloads from pinned memory against
 * cuMemcpyHtoDAsync/DtoHAsync + sync; from pageable malloc memory against cuMemcpyHtoD/DtoH (and
 * cuMemHostRegister + copy + unregister, the other way to reach DMA speed); the same by size from
 * 4 KiB to 1 GiB; on-device casts f64->f32, f32->f16, f32->f64 timed by events against
 * cuMemcpyDtoDAsync's rate (bytes read + written); f64 on the GPU to f32 on the host against
 * cuMemcpyDtoH + a host cast loop; the latency of a 4 KiB upload against cuMemcpyHtoDAsync +
 * cuStreamSynchronize; the first cast's kernel load (committed PTX through the driver's JIT, and
 * NVRTC, each with its cache empty and filled); the pool against cuMemAlloc + cuMemFree and
 * against cuMemAllocAsync + cuMemFreeAsync with the release threshold at its maximum, pairs and
 * the replay.
 *
 * Part of gpuarr-bench's one translation unit: gpuarr-bench.c includes it once, after
 * bench_common.h and suite_pools.h (whose pair and replay timings it runs on CUDA). */

/* ---------------------------------------------------------------------------------------------
 * CUDA. The baselines are raw driver calls through gpuarr's own entry-point table (the same
 * driver gpuarr uses), on the device's primary context, made current for the section.
 * ------------------------------------------------------------------------------------------- */
#ifndef GPUARR_NO_CUDA
#define CU (GPUARR__CU)

static void cu_check(gpuarr__cu_result e, const char *what) {
    if (e != GPUARR__CUDA_SUCCESS) {
        fprintf(stderr, "gpuarr-bench: %s failed: CUDA error %u\n", what, e);
        exit(1);
    }
}

typedef struct cu_bufs {
    size_t bytes;
    gpuarr__cu_ptr dev;
    void *pinned, *pageable;
    gpuarr__cu_stream stream;
    gpuarr__cu_event e0, e1;
} cu_bufs;

static void cu_bufs_open(cu_bufs *b, size_t bytes) {
    memset(b, 0, sizeof *b);
    b->bytes = bytes;
    cu_check(CU.p_cuMemAlloc_v2(&b->dev, bytes), "cuMemAlloc");
    cu_check(CU.p_cuMemHostAlloc(&b->pinned, bytes, 0), "cuMemHostAlloc");
    b->pageable = malloc(bytes);
    if (!b->pageable) die("malloc");
    fill_source(b->pageable, GPUARR_F32, bytes / 4);
    memcpy(b->pinned, b->pageable, bytes);
    cu_check(CU.p_cuStreamCreate(&b->stream, GPUARR__CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    cu_check(CU.p_cuEventCreate(&b->e0, 0), "cuEventCreate");
    cu_check(CU.p_cuEventCreate(&b->e1, 0), "cuEventCreate");
}

static void cu_bufs_close(cu_bufs *b) {
    CU.p_cuEventDestroy_v2(b->e0);
    CU.p_cuEventDestroy_v2(b->e1);
    CU.p_cuStreamDestroy_v2(b->stream);
    CU.p_cuMemFree_v2(b->dev);
    CU.p_cuMemFreeHost(b->pinned);
    free(b->pageable);
}

/* Raw copies, timed on the host around the call and its completion. */
static double cu_h2d_async(cu_bufs *b, const void *src, size_t bytes) {
    double t0 = now_s();
    cu_check(CU.p_cuMemcpyHtoDAsync_v2(b->dev, src, bytes, b->stream), "cuMemcpyHtoDAsync");
    cu_check(CU.p_cuStreamSynchronize(b->stream), "cuStreamSynchronize");
    return now_s() - t0;
}
static double cu_d2h_async(cu_bufs *b, void *dst, size_t bytes) {
    double t0 = now_s();
    cu_check(CU.p_cuMemcpyDtoHAsync_v2(dst, b->dev, bytes, b->stream), "cuMemcpyDtoHAsync");
    cu_check(CU.p_cuStreamSynchronize(b->stream), "cuStreamSynchronize");
    return now_s() - t0;
}
static double cu_h2d_sync(cu_bufs *b, const void *src, size_t bytes) {
    double t0 = now_s();
    cu_check(CU.p_cuMemcpyHtoD_v2(b->dev, src, bytes), "cuMemcpyHtoD");
    return now_s() - t0;
}
static double cu_d2h_sync(cu_bufs *b, void *dst, size_t bytes) {
    double t0 = now_s();
    cu_check(CU.p_cuMemcpyDtoH_v2(dst, b->dev, bytes), "cuMemcpyDtoH");
    return now_s() - t0;
}
/* The other way to use pageable memory at DMA speed: register it for the copy. */
static double cu_h2d_registered(cu_bufs *b, void *src, size_t bytes) {
    if (!CU.p_cuMemHostRegister_v2) return 0;
    double t0 = now_s();
    cu_check(CU.p_cuMemHostRegister_v2(src, bytes, 0), "cuMemHostRegister");
    cu_check(CU.p_cuMemcpyHtoDAsync_v2(b->dev, src, bytes, b->stream), "cuMemcpyHtoDAsync");
    cu_check(CU.p_cuStreamSynchronize(b->stream), "cuStreamSynchronize");
    cu_check(CU.p_cuMemHostUnregister(src), "cuMemHostUnregister");
    return now_s() - t0;
}

/* gpuarr's: an upload that allocates its array (from the warm pool) and returns when the data
   is there; a download into the caller's buffer. */
static double ga_upload(gpuarr_device d, const void *src, size_t bytes) {
    int64_t shape[1] = {(int64_t)(bytes / 4)};
    gpuarr_array a;
    double t0 = now_s();
    if (gpuarr_from_host_as(d, GPUARR_F32, src, 1, shape, &a) != GPUARR_OK) die("gpuarr_from_host_as");
    double t = now_s() - t0;
    gpuarr_release(a);
    return t;
}
static double ga_download(gpuarr_array a, void *dst, size_t bytes) {
    double t0 = now_s();
    if (gpuarr_to_host_as(a, GPUARR_F32, dst, bytes / 4) != GPUARR_OK) die("gpuarr_to_host_as");
    return now_s() - t0;
}

static double rate(size_t bytes, double s) { return (double)bytes / s / 1e9; }

static void bench_cuda_transfers(gpuarr_device d, size_t mib, int reps) {
    size_t bytes = mib << 20;
    cu_bufs b;
    cu_bufs_open(&b, bytes);
    int64_t shape[1] = {(int64_t)(bytes / 4)};
    gpuarr_array a;
    if (gpuarr_from_host_as(d, GPUARR_F32, b.pageable, 1, shape, &a) != GPUARR_OK) die("gpuarr_from_host_as");
    double pin_raw[64], pin_ga[64], pg_raw[64], pg_ga[64], reg[64], dpin_raw[64], dpin_ga[64], dpg_raw[64], dpg_ga[64];
    for (int r = -2; r < reps; r++) {
        int k = r < 0 ? 0 : r;
        pin_raw[k] = cu_h2d_async(&b, b.pinned, bytes);
        pin_ga[k] = ga_upload(d, b.pinned, bytes);
        pg_raw[k] = cu_h2d_sync(&b, b.pageable, bytes);
        pg_ga[k] = ga_upload(d, b.pageable, bytes);
        reg[k] = cu_h2d_registered(&b, b.pageable, bytes);
        dpin_raw[k] = cu_d2h_async(&b, b.pinned, bytes);
        dpin_ga[k] = ga_download(a, b.pinned, bytes);
        dpg_raw[k] = cu_d2h_sync(&b, b.pageable, bytes);
        dpg_ga[k] = ga_download(a, b.pageable, bytes);
    }
    double tpr = median(pin_raw, reps), tpg = median(pin_ga, reps), tgr = median(pg_raw, reps), tgg = median(pg_ga, reps);
    double treg = median(reg, reps), dpr = median(dpin_raw, reps), dpg = median(dpin_ga, reps), dgr = median(dpg_raw, reps),
           dgg = median(dpg_ga, reps);
    printf("\n| transfer (%zu MiB f32) | median time | rate | gpuarr / its baseline | vs pinned raw |\n|---|---|---|---|---|\n", mib);
    printf("| cuMemcpyHtoDAsync + sync from pinned (baseline) | %.2f ms | %.2f GB/s | | 1.00 |\n", tpr * 1e3, rate(bytes, tpr));
    printf("| **gpuarr_from_host_as from pinned** (allocates) | %.2f ms | %.2f GB/s | **%.3f** (target >= 0.97) | %.3f |\n", tpg * 1e3,
           rate(bytes, tpg), tpr / tpg, tpr / tpg);
    printf("| cuMemcpyHtoD from pageable malloc memory (baseline) | %.2f ms | %.2f GB/s | | %.3f |\n", tgr * 1e3, rate(bytes, tgr), tpr / tgr);
    printf("| **gpuarr_from_host_as from pageable** (staged) | %.2f ms | %.2f GB/s | **%.2f** (target >= 1.5) | **%.3f** (target >= 0.85) |\n",
           tgg * 1e3, rate(bytes, tgg), tgr / tgg, tpr / tgg);
    if (treg > 0)
        printf("| cuMemHostRegister + async copy + unregister, pageable | %.2f ms | %.2f GB/s | | %.3f |\n", treg * 1e3, rate(bytes, treg),
               tpr / treg);
    printf("| cuMemcpyDtoHAsync + sync to pinned (baseline) | %.2f ms | %.2f GB/s | | 1.00 |\n", dpr * 1e3, rate(bytes, dpr));
    printf("| **gpuarr_to_host_as to pinned** | %.2f ms | %.2f GB/s | **%.3f** (target >= 0.97) | %.3f |\n", dpg * 1e3, rate(bytes, dpg),
           dpr / dpg, dpr / dpg);
    printf("| cuMemcpyDtoH to pageable (baseline) | %.2f ms | %.2f GB/s | | %.3f |\n", dgr * 1e3, rate(bytes, dgr), dpr / dgr);
    printf("| **gpuarr_to_host_as to pageable** (staged) | %.2f ms | %.2f GB/s | **%.2f** | %.3f |\n", dgg * 1e3, rate(bytes, dgg), dgr / dgg,
           dpr / dgg);
    gpuarr_release(a);
    cu_bufs_close(&b);
}

/* Upload and download rates by size, raw and through gpuarr, 4 KiB to --cuda-mib. */
static void bench_cuda_sweep(gpuarr_device d, size_t max_mib) {
    size_t max_bytes = max_mib << 20;
    cu_bufs b;
    cu_bufs_open(&b, max_bytes);
    printf("\n| size | H2D pinned raw | H2D pageable raw | gpuarr H2D pageable | gpuarr H2D pinned | D2H pinned raw | D2H pageable raw | gpuarr D2H pageable | gpuarr D2H pinned |\n"
           "|---|---|---|---|---|---|---|---|---|\n");
    for (size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
        int reps = bytes <= ((size_t)1 << 20) ? 51 : bytes <= ((size_t)64 << 20) ? 15 : 5;
        double v[8][51];
        int64_t shape[1] = {(int64_t)(bytes / 4)};
        gpuarr_array a;
        if (gpuarr_from_host_as(d, GPUARR_F32, b.pageable, 1, shape, &a) != GPUARR_OK) die("gpuarr_from_host_as");
        for (int r = -1; r < reps; r++) {
            int k = r < 0 ? 0 : r;
            v[0][k] = cu_h2d_async(&b, b.pinned, bytes);
            v[1][k] = cu_h2d_sync(&b, b.pageable, bytes);
            v[2][k] = ga_upload(d, b.pageable, bytes);
            v[3][k] = ga_upload(d, b.pinned, bytes);
            v[4][k] = cu_d2h_async(&b, b.pinned, bytes);
            v[5][k] = cu_d2h_sync(&b, b.pageable, bytes);
            v[6][k] = ga_download(a, b.pageable, bytes);
            v[7][k] = ga_download(a, b.pinned, bytes);
        }
        gpuarr_release(a);
        char label[32];
        gpuarr__format_bytes(label, sizeof label, bytes);
        printf("| %s", label);
        for (int c = 0; c < 8; c++) printf(" | %.2f GB/s", rate(bytes, median(v[c], reps)));
        printf(" |\n");
    }
    cu_bufs_close(&b);
}

/* On-device casts timed by events, against a device-to-device copy of the source's bytes. */
static void bench_cuda_casts(gpuarr_device d, size_t mib, int reps) {
    static const cast_case cases[] = {{GPUARR_F64, GPUARR_F32}, {GPUARR_F32, GPUARR_F16}, {GPUARR_F32, GPUARR_F64}};
    size_t src_bytes = mib << 20;
    cu_bufs b;
    cu_bufs_open(&b, src_bytes);
    gpuarr__cu_ptr scratch = 0;
    cu_check(CU.p_cuMemAlloc_v2(&scratch, src_bytes), "cuMemAlloc");
    gpuarr_event e0, e1;
    gpuarr_stream s;
    if (gpuarr_stream_create(d, 0, &s) != GPUARR_OK || gpuarr_event_create(d, GPUARR_EVENT_TIMING, &e0) != GPUARR_OK ||
        gpuarr_event_create(d, GPUARR_EVENT_TIMING, &e1) != GPUARR_OK)
        die("streams and events");
    printf("\n| on-device cast (%zu MiB source) | bytes read + written | time (events) | rate | cuMemcpyDtoDAsync rate, same reps | ratio (target >= 0.85) |\n"
           "|---|---|---|---|---|---|\n", mib);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cast_case c = cases[i];
        size_t n = src_bytes / gpuarr_dtype_size(c.src), moved = src_bytes + n * gpuarr_dtype_size(c.dst);
        int64_t shape[1] = {(int64_t)n};
        gpuarr_array src;
        if (gpuarr_from_host_as(d, c.src, b.pageable, 1, shape, &src) != GPUARR_OK) die("gpuarr_from_host_as");
        void *sp = NULL;
        gpuarr_cuda_ptr(src, &sp);
        double kernel[64], copy[64], ratio[64];
        for (int r = -2; r < reps; r++) {
            float ms = 0;
            cu_check(CU.p_cuEventRecord(b.e0, b.stream), "cuEventRecord");
            cu_check(CU.p_cuMemcpyDtoDAsync_v2(scratch, (gpuarr__cu_ptr)(uintptr_t)sp, src_bytes, b.stream), "cuMemcpyDtoDAsync");
            cu_check(CU.p_cuEventRecord(b.e1, b.stream), "cuEventRecord");
            cu_check(CU.p_cuEventSynchronize(b.e1), "cuEventSynchronize");
            cu_check(CU.p_cuEventElapsedTime(&ms, b.e0, b.e1), "cuEventElapsedTime");
            gpuarr_array out;
            double gms = 0;
            if (gpuarr_event_record(e0, s) != GPUARR_OK || gpuarr_convert_async(src, d, c.dst, s, &out) != GPUARR_OK ||
                gpuarr_event_record(e1, s) != GPUARR_OK || gpuarr_event_sync(e1) != GPUARR_OK || gpuarr_event_elapsed_ms(e0, e1, &gms) != GPUARR_OK)
                die("cast");
            gpuarr_release(out);
            if (r < 0) continue;
            copy[r] = ms * 1e-3;
            kernel[r] = gms * 1e-3;
            ratio[r] = ((double)moved / kernel[r]) / (2.0 * (double)src_bytes / copy[r]);
        }
        gpuarr_release(src);
        double tk = median(kernel, reps), tc = median(copy, reps);
        printf("| %s->%s | %zu MiB | %.3f ms | %.1f GB/s | %.1f GB/s | **%.2f** |\n", gpuarr_dtype_name(c.src), gpuarr_dtype_name(c.dst),
               moved >> 20, tk * 1e3, (double)moved / tk / 1e9, 2.0 * (double)src_bytes / tc / 1e9, median(ratio, reps));
    }
    gpuarr_event_destroy(e0);
    gpuarr_event_destroy(e1);
    gpuarr_stream_destroy(s);
    CU.p_cuMemFree_v2(scratch);
    cu_bufs_close(&b);
}

/* f64 on the GPU to f32 in host memory: gpuarr narrows on the device and moves half the bytes;
   the baseline is what a user writes: download the f64 and cast in a loop. */
static void bench_cuda_narrow_download(gpuarr_device d, size_t mib, int reps) {
    size_t bytes = mib << 20, n = bytes / 8;
    double *wide = (double *)malloc(bytes);
    float *out = (float *)malloc(n * 4);
    if (!wide || !out) die("malloc");
    fill_source(wide, GPUARR_F64, n);
    int64_t shape[1] = {(int64_t)n};
    gpuarr_array a;
    if (gpuarr_from_host(d, wide, 1, shape, &a) != GPUARR_OK) die("gpuarr_from_host");
    void *p = NULL;
    gpuarr_cuda_ptr(a, &p);
    double base[64], ga[64];
    for (int r = -2; r < reps; r++) {
        int k = r < 0 ? 0 : r;
        double t0 = now_s();
        cu_check(CU.p_cuMemcpyDtoH_v2(wide, (gpuarr__cu_ptr)(uintptr_t)p, bytes), "cuMemcpyDtoH");
        for (size_t i = 0; i < n; i++) out[i] = (float)wide[i];
        base[k] = now_s() - t0;
        sink = ((unsigned char *)out)[n];
        t0 = now_s();
        if (gpuarr_to_host_as(a, GPUARR_F32, out, n) != GPUARR_OK) die("gpuarr_to_host_as");
        ga[k] = now_s() - t0;
    }
    double tb = median(base, reps), tg = median(ga, reps);
    printf("\n| f64 on the GPU -> f32 on the host (%zu MiB of f64) | median time | speed-up |\n|---|---|---|\n", mib);
    printf("| cuMemcpyDtoH of the f64 + a cast loop on the host (baseline) | %.2f ms | 1.00 |\n", tb * 1e3);
    printf("| **gpuarr_to_host_as(a, GPUARR_F32, ...)** (cast on the GPU) | %.2f ms | **%.2f** (target >= 1.8) |\n", tg * 1e3, tb / tg);
    gpuarr_release(a);
    free(wide);
    free(out);
}

/* Small uploads: latency of 4 KiB, median over many. */
static void bench_cuda_latency(gpuarr_device d) {
    enum { N = 2001 };
    cu_bufs b;
    cu_bufs_open(&b, 4096);
    static double raw[N], ga[N];
    for (int i = 0; i < 50; i++) ga_upload(d, b.pageable, 4096); /* warm */
    for (int i = 0; i < N; i++) {
        raw[i] = cu_h2d_async(&b, b.pageable, 4096);
        ga[i] = ga_upload(d, b.pageable, 4096);
    }
    double tr = median(raw, N), tg = median(ga, N);
    printf("\n| 4 KiB upload from pageable memory, median of %d | latency | ratio |\n|---|---|---|\n", N);
    printf("| cuMemcpyHtoDAsync + cuStreamSynchronize (baseline) | %.1f us | 1.00 |\n", tr * 1e6);
    printf("| **gpuarr_from_host_as** (allocates from the pool) | %.1f us | **%.2f** (target <= 1.5) |\n", tg * 1e6, tg / tr);
    cu_bufs_close(&b);
}

/* The pool against cuMemAllocAsync/cuMemFreeAsync with the release threshold at its maximum. */
static double cu_async_pairs(gpuarr__cu_stream st, size_t bytes, int n) {
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        gpuarr__cu_ptr p = 0;
        cu_check(CU.p_cuMemAllocAsync(&p, bytes, st), "cuMemAllocAsync");
        cu_check(CU.p_cuMemFreeAsync(p, st), "cuMemFreeAsync");
    }
    cu_check(CU.p_cuStreamSynchronize(st), "cuStreamSynchronize");
    return (now_s() - t0) / n;
}

static bool cu_async_ready(gpuarr__dev *d, gpuarr__cu_stream *st) {
    gpuarr__cu_mempool pool = NULL;
    uint64_t max = UINT64_MAX;
    if (!CU.p_cuMemAllocAsync || !CU.p_cuDeviceGetDefaultMemPool || !CU.p_cuMemPoolSetAttribute ||
        CU.p_cuDeviceGetDefaultMemPool(&pool, GPUARR__CU_DEV(d)->dev) != GPUARR__CUDA_SUCCESS)
        return false;
    cu_check(CU.p_cuMemPoolSetAttribute(pool, GPUARR__CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &max), "cuMemPoolSetAttribute");
    cu_check(CU.p_cuStreamCreate(st, GPUARR__CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    return true;
}

static void bench_cuda_pool_async(gpuarr__dev *d) {
    gpuarr__cu_stream st;
    if (!cu_async_ready(d, &st)) {
        printf("\n(cuMemAllocAsync: not supported by this driver or device)\n");
        return;
    }
    static const size_t sizes[] = {4096, (size_t)1 << 20, (size_t)64 << 20};
    printf("\n| %s: allocate + free, median per pair | pool alone | cuMemAllocAsync + cuMemFreeAsync, threshold max (baseline) | async / pool |\n|---|---|---|---|\n",
           d->info.spec);
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        double pool[15], async[15];
        cu_async_pairs(st, sizes[k], 100);
        for (int r = 0; r < 15; r++) {
            pool[r] = time_pairs(d, sizes[k], 0, 20000);
            async[r] = cu_async_pairs(st, sizes[k], 20000);
        }
        double tp = median(pool, 15), ta = median(async, 15);
        char label[32];
        gpuarr__format_bytes(label, sizeof label, sizes[k]);
        printf("| %s | %.0f ns | %.0f ns | %.1fx |\n", label, tp * 1e9, ta * 1e9, ta / tp);
    }
    /* the replay's sequence through cuMemAllocAsync */
    enum { STEPS = 100000, LIVE = 1000 };
    static gpuarr__cu_ptr live[LIVE];
    unsigned seed = 777;
    double t0 = now_s();
    for (int i = 0; i < STEPS; i++) {
        seed = seed * 1103515245u + 12345u;
        size_t size = 1024 + (size_t)(seed >> 4) % ((size_t)4 << 20);
        seed = seed * 1103515245u + 12345u;
        int slot = (int)((seed >> 8) % LIVE);
        if (live[slot]) cu_check(CU.p_cuMemFreeAsync(live[slot], st), "cuMemFreeAsync");
        cu_check(CU.p_cuMemAllocAsync(&live[slot], size, st), "cuMemAllocAsync");
    }
    cu_check(CU.p_cuStreamSynchronize(st), "cuStreamSynchronize");
    double t = now_s() - t0;
    for (int s = 0; s < LIVE; s++)
        if (live[s]) CU.p_cuMemFreeAsync(live[s], st), live[s] = 0;
    CU.p_cuStreamSynchronize(st);
    printf("\n| %s replay through cuMemAllocAsync (same sequence as above) | %.1f ms | %.2f us per allocation |\n|---|---|---|\n", d->info.spec,
           t * 1e3, t * 1e6 / STEPS);
    CU.p_cuStreamDestroy_v2(st);
}

/* The first f32->f16 cast in a fresh process: from the committed PTX (the driver's JIT, its
   cache empty, then filled) and from NVRTC (gpuarr's cache empty, then filled). */
static void bench_kernel_first_use(const char *self, const char *spec) {
    char dir[] = "/tmp/gpuarr-bench-cache-XXXXXX", env[900], cmd[600];
    if (!mkdtemp(dir)) die("mkdtemp");
    printf("\n| first f32->f16 cast on %s (loads that pair's kernel) | time |\n|---|---|\n", spec);
    snprintf(env, sizeof env, "GPUARR_CUDA_KERNELS=ptx CUDA_CACHE_PATH='%s/jit'", dir);
    double cold = run_probe(self, spec, env), warm = run_probe(self, spec, env);
    printf("| committed PTX, driver JIT cache empty | %.1f ms |\n| committed PTX, driver JIT cache filled | %.1f ms |\n", cold, warm);
    snprintf(env, sizeof env, "GPUARR_CUDA_KERNELS=nvrtc GPUARR_CACHE_DIR='%s/gpuarr'", dir);
    cold = run_probe(self, spec, env);
    warm = run_probe(self, spec, env);
    printf("| NVRTC, gpuarr's cache empty | %.1f ms |\n| NVRTC, gpuarr's cache filled | %.1f ms |\n", cold, warm);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static void bench_cuda(const char *self, size_t mib, int reps, const char *only) {
    bool any = false;
    for (int i = 0; i < gpuarr_device_count(); i++) {
        gpuarr_device_info info;
        gpuarr_device_get_info(gpuarr_device_at(i), &info);
        if (info.backend != GPUARR_BACKEND_CUDA || (only && strcmp(only, info.spec) != 0)) continue;
        any = true;
        struct CUctx_st *ctx = NULL;
        if (gpuarr_cuda_context(info.device, &ctx) != GPUARR_OK) die("gpuarr_cuda_context");
        cu_check(CU.p_cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
        printf("\n## %s: %s, sm_%d%d, %d SMs, %.1f GB, PCI %s, %s, %d copy engines\n", info.spec, info.name, info.compute_capability_major,
               info.compute_capability_minor, info.compute_units, (double)info.total_memory / 1e9, info.pci_bus_id, info.version,
               info.copy_engines);
        bench_cuda_transfers(info.device, mib, reps);
        /* 4 KiB .. 1 GiB; the pageable source, pinned buffers and arrays need about 4x the top size */
        size_t sweep_mib = 1024;
        while (sweep_mib > 1 && ((uint64_t)sweep_mib << 22) > info.total_memory) sweep_mib /= 4;
        if (sweep_mib < 1024) printf("\nsweep capped at %zu MiB: the device has %.1f GB\n", sweep_mib, (double)info.total_memory / 1e9);
        bench_cuda_sweep(info.device, sweep_mib);
        bench_cuda_casts(info.device, mib, reps);
        bench_cuda_narrow_download(info.device, mib, reps);
        bench_cuda_latency(info.device);
        bench_kernel_first_use(self, info.spec);
        gpuarr__dev *dev = &gpuarr__g.devices[(info.device.id & 0xffffu) - 1u];
        bench_pool_pairs(dev);
        bench_pool_replay(dev);
        bench_cuda_pool_async(dev);
        if (!only) break;
    }
    if (!any) {
        gpuarr_device d;
        gpuarr_device_find(only ? only : "cuda:0", &d);
        printf("\n## CUDA: skipped: %s\n", gpuarr_last_error());
    }
}
#endif
