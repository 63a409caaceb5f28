/* suite_pools.h -- the pools against the raw allocations they replace (gpuarr-bench --pool-only)
 *
 * Pool section (--pool): the median cost of a cached allocate+free pair (the pool alone, and
 * gpuarr_empty + gpuarr_release) against the raw allocation it replaces (malloc + free on the
 * host; clCreateBuffer + making it resident + clReleaseMemObject on OpenCL); and an RMM-style
 * replay: 100,000 allocations of random sizes between 1 KiB and 4 MiB with at most 1,000 live,
 * timed against the same sequence of raw allocations, with fragmentation = peak reserved /
 * peak requested.
 *
 * Part of gpuarr-bench's one translation unit: gpuarr-bench.c includes it once, after
 * bench_common.h. */

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
           d->info.spec, d->backend->id == GPUARR_BACKEND_HOST   ? "malloc + free"
                         : d->backend->id == GPUARR_BACKEND_CUDA ? "cuMemAlloc + cuMemFree"
                                                                 : "clCreateBuffer + resident + release");
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

/* Contended: 4 threads each run pairs of 4 KiB (gpuarr_empty + gpuarr_release, or malloc + free,
   the baseline, in the same repetition); wall time per pair over all threads. */
typedef struct pair_thread {
    gpuarr_device dev; /* id 0: malloc + free */
    int n;
} pair_thread;

static void *run_pair_thread(void *arg) {
    pair_thread *pt = (pair_thread *)arg;
    int64_t shape[1] = {4096};
    for (int i = 0; i < pt->n; i++) {
        if (!pt->dev.id) {
            void *p = malloc(4096);
            sink = (unsigned char)(uintptr_t)p;
            free(p);
            continue;
        }
        gpuarr_array a;
        if (gpuarr_empty(pt->dev, GPUARR_U8, 1, shape, &a) != GPUARR_OK) die("gpuarr_empty");
        gpuarr_release(a);
    }
    return NULL;
}

static double time_pair_threads(gpuarr_device dev, int nthreads, int n) {
    pthread_t th[4];
    pair_thread pt[4];
    double t0 = now_s();
    for (int i = 0; i < nthreads; i++) {
        pt[i].dev = dev;
        pt[i].n = n;
        if (pthread_create(&th[i], NULL, run_pair_thread, &pt[i]) != 0) die("pthread_create");
    }
    for (int i = 0; i < nthreads; i++) pthread_join(th[i], NULL);
    return (now_s() - t0) / (double)(nthreads * n);
}

static void bench_pool_threads(gpuarr__dev *d) {
    double pub[15], raw[15];
    gpuarr_device none = {0};
    for (int r = 0; r < 15; r++) {
        pub[r] = time_pair_threads(d->info.device, 4, 20000);
        raw[r] = time_pair_threads(none, 4, 20000);
    }
    double tp = median(pub, 15), tr = median(raw, 15);
    printf("\n| %s: 4 threads, 4 KiB pairs, wall time per pair | gpuarr_empty + gpuarr_release | malloc + free (baseline) | ratio |\n|---|---|---|---|\n",
           d->info.spec);
    printf("| 4 threads | %.0f ns | %.0f ns | %.2f |\n", tp * 1e9, tr * 1e9, tp / tr);
}

static void bench_pools(const char *only) {
    for (int i = 0; i < gpuarr_device_count(); i++) {
        gpuarr__dev *d = &gpuarr__g.devices[i];
        if (only && strcmp(only, d->info.spec) != 0) continue;
        if (!only && d->backend->id == GPUARR_BACKEND_OPENCL && d->info.index > 0) continue;
        if (d->backend->id == GPUARR_BACKEND_CUDA) continue; /* in the CUDA section, with the driver's own pool */
        bench_pool_pairs(d);
        bench_pool_threads(d);
        bench_pool_replay(d);
    }
}
