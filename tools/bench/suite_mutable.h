/* suite_mutable.h -- arrays you write into (gpuarr-bench --mutable-only)
 *
 * Arrays you write into (--mutable-only): gpuarr_write / gpuarr_read against gpuarr_from_host /
 * gpuarr_to_host, gpuarr_fill against memset, gpuarr_copy between a pinned host array and an
 * OpenCL device against clEnqueueWriteBuffer / ReadBuffer (see that section below).
 *
 * Part of gpuarr-bench's one translation unit: gpuarr-bench.c includes it once, after
 * bench_common.h. */

/* ---------------------------------------------------------------------------------------------
 * Arrays you write into (--mutable-only): on the host and on each OpenCL device (the first
 * unless --device), every figure against a baseline timed in the same repetitions:
 *   gpuarr_write of a whole array that exists against gpuarr_from_host_as into a fresh one, and
 *   gpuarr_read against gpuarr_to_host_as (ratio = from_host time / write time: >= 1 is faster);
 *   gpuarr_fill against a single-threaded memset of as many bytes (of a nonzero byte: zero stores
 *   are faster on some CPUs), for a value whose bytes are all equal (a 1-byte pattern) and for
 *   1.5f (a 4-byte pattern); on OpenCL also a raw blocking clEnqueueFillBuffer of the same pattern
 *   into the array's buffer;
 *   OpenCL: gpuarr_copy between a pinned host array (gpuarr_empty_pinned) and a device array
 *   against clEnqueueWriteBuffer / clEnqueueReadBuffer, blocking, between the same two memories.
 * Besides the median of the per-repetition ratios, the ratio of the best times of each side.
 * Run it again with GPUARR_OPENCL_UNIFIED=off to measure PoCL handled as a discrete device.
 * ------------------------------------------------------------------------------------------- */
/* The ratio of the best times (base / measured) of v and base, already sorted by median(): less
   sensitive than the median to neighbours on a shared machine. */
static double best_ratio(const double *base, const double *v) { return base[0] / v[0]; }

static const char *device_mode(const gpuarr_device_info *info) {
    if (info->backend == GPUARR_BACKEND_HOST) return "host memory";
    return info->host_unified ? "host-unified: copies map the buffer and use the host's threads"
                              : "discrete: own memory, pageable copies staged through pinned chunks";
}

static void bench_write_read(gpuarr_device dev, size_t mib, int reps) {
    size_t bytes = mib << 20, n = bytes / 4;
    int64_t shape[1] = {(int64_t)n};
    float *src = (float *)malloc(bytes), *dst = (float *)malloc(bytes);
    if (!src || !dst) die("malloc");
    fill_source(src, GPUARR_F32, n);
    memset(dst, 0, bytes);
    gpuarr_array a;
    if (gpuarr_empty(dev, GPUARR_F32, 1, shape, &a) != GPUARR_OK) die("gpuarr_empty");
    double from[64], wr[64], to[64], rd[64], wratio[64], rratio[64];
    for (int r = -2; r < reps; r++) {
        int k = r < 0 ? 0 : r;
        gpuarr_array fresh;
        double t0 = now_s();
        if (gpuarr_from_host_as(dev, GPUARR_F32, src, 1, shape, &fresh) != GPUARR_OK) die("gpuarr_from_host_as");
        from[k] = now_s() - t0;
        gpuarr_release(fresh);
        t0 = now_s();
        if (gpuarr_write(a, 0, (int64_t)n, GPUARR_F32, src) != GPUARR_OK) die("gpuarr_write");
        wr[k] = now_s() - t0;
        t0 = now_s();
        if (gpuarr_to_host_as(a, GPUARR_F32, dst, n) != GPUARR_OK) die("gpuarr_to_host_as");
        to[k] = now_s() - t0;
        dst[n / 2] = 0;
        t0 = now_s();
        if (gpuarr_read(a, 0, (int64_t)n, GPUARR_F32, dst) != GPUARR_OK) die("gpuarr_read");
        rd[k] = now_s() - t0;
        if (dst[n / 2] != src[n / 2] || dst[n - 1] != src[n - 1]) die("gpuarr_read: wrong data");
        wratio[k] = from[k] / wr[k];
        rratio[k] = to[k] / rd[k];
    }
    double gb = (double)bytes / 1e9, tf = median(from, reps), tw = median(wr, reps), tt = median(to, reps), tr = median(rd, reps);
    printf("| operation (%zu MiB f32, pageable host memory) | median time | rate | ratio to its baseline (median of reps) | ratio of best times |\n|---|---|---|---|---|\n", mib);
    printf("| gpuarr_from_host_as into a fresh array (baseline) | %.2f ms | %.2f GB/s | 1.00 | |\n", tf * 1e3, gb / tf);
    printf("| **gpuarr_write** of the whole existing array | %.2f ms | %.2f GB/s | **%.2f** (target >= 0.95) | %.2f |\n", tw * 1e3, gb / tw,
           median(wratio, reps), best_ratio(from, wr));
    printf("| gpuarr_to_host_as (baseline) | %.2f ms | %.2f GB/s | 1.00 | |\n", tt * 1e3, gb / tt);
    printf("| **gpuarr_read** of the whole array | %.2f ms | %.2f GB/s | **%.2f** (target >= 0.95) | %.2f |\n", tr * 1e3, gb / tr,
           median(rratio, reps), best_ratio(to, rd));
    gpuarr_release(a);
    free(src);
    free(dst);
}

/* raw_fill (may be NULL): the backend's own fill of the same bytes, for comparison. */
typedef double (*raw_fill_fn)(gpuarr_array a, const void *pattern, size_t pattern_size, size_t bytes);

static void bench_fill(gpuarr_device dev, size_t mib, int reps, raw_fill_fn raw_fill, double target) {
    size_t bytes = mib << 20, n = bytes / 4;
    int64_t shape[1] = {(int64_t)n};
    unsigned char *m = (unsigned char *)malloc(bytes);
    if (!m) die("malloc");
    memset(m, 1, bytes);
    gpuarr_array a;
    if (gpuarr_zeros(dev, GPUARR_F32, 1, shape, &a) != GPUARR_OK) die("gpuarr_zeros");
    uint32_t uniform_bits = 0x3c3c3c3cu;
    float values[2];
    memcpy(&values[0], &uniform_bits, 4);
    values[1] = 1.5f;
    printf("\n| fill, %zu MiB f32 | median time | rate | memset of a nonzero byte, 1 thread, same reps (baseline) | ratio (median of reps) | ratio of best times |%s\n|---|---|---|---|---|---|%s\n",
           mib, raw_fill ? " raw clEnqueueFillBuffer, blocking | vs raw |" : "", raw_fill ? "---|---|" : "");
    for (int c = 0; c < 2; c++) {
        float v = values[c];
        unsigned char pattern[4];
        memcpy(pattern, &v, 4);
        size_t psize = c == 0 ? 1 : 4;
        unsigned char byte = pattern[0] ? pattern[0] : pattern[3]; /* memset of zero runs faster on some CPUs */
        double tf[64], tm[64], tr[64], ratio[64], rratio[64];
        for (int r = -2; r < reps; r++) {
            int k = r < 0 ? 0 : r;
            double t0 = now_s();
            memset(m, byte, bytes);
            tm[k] = now_s() - t0;
            sink = m[bytes / 2];
            t0 = now_s();
            if (gpuarr_fill(a, v) != GPUARR_OK) die("gpuarr_fill");
            tf[k] = now_s() - t0;
            tr[k] = raw_fill ? raw_fill(a, pattern, psize, bytes) : 0;
            ratio[k] = tm[k] / tf[k];
            rratio[k] = raw_fill ? tr[k] / tf[k] : 0;
        }
        float back[2] = {0, 0};
        if (gpuarr_fill(a, v) != GPUARR_OK || gpuarr_read(a, (int64_t)n - 2, 2, GPUARR_F32, back) != GPUARR_OK) die("gpuarr_read");
        if (memcmp(&back[0], &v, 4) != 0 || memcmp(&back[1], &v, 4) != 0) die("gpuarr_fill: wrong data");
        double f = median(tf, reps), mm = median(tm, reps), gb = (double)bytes / 1e9;
        printf("| **gpuarr_fill**, %s | %.2f ms | %.2f GB/s | %.2f GB/s | **%.2f** (target >= %.2f) | %.2f |",
               c == 0 ? "0x3c3c3c3c (1-byte pattern)" : "1.5f (4-byte pattern)", f * 1e3, gb / f, gb / mm, median(ratio, reps), target,
               best_ratio(tm, tf));
        if (raw_fill) {
            double rr = median(tr, reps);
            printf(" %.2f ms, %.2f GB/s | %.2f |", rr * 1e3, gb / rr, median(rratio, reps));
        }
        printf("\n");
    }
    gpuarr_release(a);
    free(m);
}

#ifndef GPUARR_NO_OPENCL
static gpuarr__cl_command_queue bench_cl_queue; /* a queue of the device measured, for the raw baselines */

static double cl_raw_fill(gpuarr_array a, const void *pattern, size_t pattern_size, size_t bytes) {
    void *mem;
    size_t off;
    if (gpuarr_opencl_mem_raw(a, &mem, &off) != GPUARR_OK) die("gpuarr_opencl_mem_raw");
    double t0 = now_s();
    if (GPUARR__CL.clEnqueueFillBuffer(bench_cl_queue, (gpuarr__cl_mem)mem, pattern, pattern_size, off, bytes, 0, NULL, NULL) !=
            GPUARR__CL_SUCCESS ||
        GPUARR__CL.clFinish(bench_cl_queue) != GPUARR__CL_SUCCESS)
        die("clEnqueueFillBuffer");
    return now_s() - t0;
}

static void bench_pinned_copies(gpuarr_device dev, size_t mib, int reps) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    size_t bytes = mib << 20, n = bytes / 4;
    int64_t shape[1] = {(int64_t)n};
    gpuarr_array pinned, a;
    float *p;
    void *mem;
    size_t off;
    if (gpuarr_empty_pinned(dev, GPUARR_F32, 1, shape, &pinned) != GPUARR_OK || gpuarr_empty(dev, GPUARR_F32, 1, shape, &a) != GPUARR_OK ||
        gpuarr_host_data(pinned, (void **)&p) != GPUARR_OK || gpuarr_opencl_mem_raw(a, &mem, &off) != GPUARR_OK)
        die("pinned setup");
    fill_source(p, GPUARR_F32, n);
    float probe = p[n / 2];
    gpuarr__cl_mem m = (gpuarr__cl_mem)mem;
    double rw[64], up[64], wp[64], rr[64], down[64], uratio[64], wratio[64], dratio[64];
    for (int r = -2; r < reps; r++) {
        int k = r < 0 ? 0 : r;
        double t0 = now_s();
        if (cl->clEnqueueWriteBuffer(bench_cl_queue, m, GPUARR__CL_TRUE, off, bytes, p, 0, NULL, NULL) != GPUARR__CL_SUCCESS)
            die("clEnqueueWriteBuffer");
        rw[k] = now_s() - t0;
        t0 = now_s();
        if (gpuarr_copy(a, pinned) != GPUARR_OK) die("gpuarr_copy up");
        up[k] = now_s() - t0;
        t0 = now_s();
        if (gpuarr_write(a, 0, (int64_t)n, GPUARR_F32, p) != GPUARR_OK) die("gpuarr_write from pinned");
        wp[k] = now_s() - t0;
        t0 = now_s();
        if (cl->clEnqueueReadBuffer(bench_cl_queue, m, GPUARR__CL_TRUE, off, bytes, p, 0, NULL, NULL) != GPUARR__CL_SUCCESS)
            die("clEnqueueReadBuffer");
        rr[k] = now_s() - t0;
        p[n / 2] = 0;
        t0 = now_s();
        if (gpuarr_copy(pinned, a) != GPUARR_OK) die("gpuarr_copy down");
        down[k] = now_s() - t0;
        if (p[n / 2] != probe) die("gpuarr_copy: wrong data");
        uratio[k] = rw[k] / up[k];
        wratio[k] = rw[k] / wp[k];
        dratio[k] = rr[k] / down[k];
    }
    double gb = (double)bytes / 1e9, trw = median(rw, reps), tup = median(up, reps), twp = median(wp, reps), trr = median(rr, reps),
           tdn = median(down, reps);
    printf("\n| pinned host array (gpuarr_empty_pinned) <-> device array, %zu MiB | median time | rate | ratio to the raw call (median of reps) | ratio of best times |\n|---|---|---|---|---|\n", mib);
    printf("| clEnqueueWriteBuffer, blocking, pinned -> the array's buffer (baseline) | %.2f ms | %.2f GB/s | 1.00 | |\n", trw * 1e3, gb / trw);
    printf("| **gpuarr_copy(device array, pinned array)** | %.2f ms | %.2f GB/s | **%.2f** (target >= 0.95) | %.2f |\n", tup * 1e3, gb / tup,
           median(uratio, reps), best_ratio(rw, up));
    printf("| gpuarr_write from the pinned array's memory | %.2f ms | %.2f GB/s | %.2f | %.2f |\n", twp * 1e3, gb / twp, median(wratio, reps),
           best_ratio(rw, wp));
    printf("| clEnqueueReadBuffer, blocking, the array's buffer -> pinned (baseline) | %.2f ms | %.2f GB/s | 1.00 | |\n", trr * 1e3, gb / trr);
    printf("| **gpuarr_copy(pinned array, device array)** | %.2f ms | %.2f GB/s | **%.2f** (target >= 0.95) | %.2f |\n", tdn * 1e3, gb / tdn,
           median(dratio, reps), best_ratio(rr, down));
    gpuarr_release(a);
    gpuarr_release(pinned);
}
#endif

static void bench_mutable(size_t mib, int reps, const char *only) {
    bool opencl_done = false;
    for (int i = 0; i < gpuarr_device_count(); i++) {
        gpuarr_device_info info;
        gpuarr_device_get_info(gpuarr_device_at(i), &info);
        if (only && strcmp(only, info.spec) != 0) continue;
        if (info.backend == GPUARR_BACKEND_CUDA) continue; /* not measured here yet */
        if (info.backend == GPUARR_BACKEND_OPENCL && opencl_done) continue;
        printf("\n## Arrays you write into, %s: %s (%s)\n\n", info.spec, info.name, device_mode(&info));
        bench_write_read(info.device, mib, reps);
        if (info.backend == GPUARR_BACKEND_HOST) {
            bench_fill(info.device, mib, reps, NULL, 0.8);
            continue;
        }
#ifndef GPUARR_NO_OPENCL
        gpuarr_stream s;
        void *queue;
        if (gpuarr_stream_create(info.device, 0, &s) != GPUARR_OK || gpuarr_opencl_queue_raw(s, &queue) != GPUARR_OK) die("opencl setup");
        bench_cl_queue = (gpuarr__cl_command_queue)queue;
        bench_fill(info.device, mib, reps, cl_raw_fill, 0.5);
        bench_pinned_copies(info.device, mib, reps);
        gpuarr_stream_destroy(s);
        opencl_done = !only;
#endif
    }
}
