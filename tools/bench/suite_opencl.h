/* suite_opencl.h -- transfers, casts, kernel builds and batches on OpenCL (gpuarr-bench --opencl-only, --batch-only)
 *
 * OpenCL section (each OpenCL device, or --device opencl:N): 64 MiB f32 uploads through
 * gpuarr_from_host (which allocates the array) against a raw blocking clEnqueueWriteBuffer into
 * a buffer that already exists, downloads through gpuarr_to_host against clEnqueueReadBuffer,
 * both against memcpy; the latency of 4 KiB, 64 KiB and 1 MiB uploads (gpuarr_from_host_as +
 * release) and downloads against blocking clEnqueueWriteBuffer / ReadBuffer into a buffer that
 * exists (medians of 501, interleaved); on-device casts f32->f64, f64->f32, f32->f16 timed by events around the
 * kernel, against memcpy's rate; the first cast's kernel build time cold (empty caches, PoCL's
 * own cache off) and warm (gpuarr's binary cache), each in a fresh process. Then batches
 * (alone with --batch-only): 1,000 host arrays of 4 KiB (1024 f32) onto the device as one
 * gpuarr_stack and one gpuarr_convert_many against 1,000 gpuarr_convert calls, dtype kept and
 * f32->f16. GPUARR_OPENCL_UNIFIED=off in the environment runs PoCL as a discrete device.
 *
 * Part of gpuarr-bench's one translation unit: gpuarr-bench.c includes it once, after
 * bench_common.h. */

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

/* Small transfers: latency of gpuarr_from_host_as + release and gpuarr_to_host_as against a
   blocking clEnqueueWriteBuffer / ReadBuffer into a buffer that exists, interleaved, medians. */
static void bench_opencl_small_transfers(gpuarr_device dev) {
    enum { N = 501 };
    static const size_t sizes[] = {4096, (size_t)64 << 10, (size_t)1 << 20};
    gpuarr__cl_state *cl = &GPUARR__CL;
    void *ctx, *queue;
    gpuarr_stream s;
    if (gpuarr_stream_create(dev, 0, &s) != GPUARR_OK || gpuarr_opencl_context_raw(dev, &ctx) != GPUARR_OK ||
        gpuarr_opencl_queue_raw(s, &queue) != GPUARR_OK)
        die("opencl setup");
    gpuarr__cl_command_queue q = (gpuarr__cl_command_queue)queue;
    size_t top = sizes[sizeof sizes / sizeof sizes[0] - 1];
    gpuarr__cl_int e = 0;
    gpuarr__cl_mem buf = cl->clCreateBuffer((gpuarr__cl_context)ctx, GPUARR__CL_MEM_READ_WRITE, top, NULL, &e);
    float *host = (float *)malloc(top);
    if (!buf || !host) die("allocating the buffers");
    fill_source(host, GPUARR_F32, top / 4);
    printf("\n| small transfers, median of %d | gpuarr | blocking clEnqueueWriteBuffer / ReadBuffer, existing buffer (baseline) | "
           "gpuarr / baseline |\n|---|---|---|---|\n", N);
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        static double up[N], write[N], down[N], read[N];
        size_t bytes = sizes[k];
        int64_t shape[1] = {(int64_t)(bytes / 4)};
        gpuarr_array kept;
        if (gpuarr_from_host_as(dev, GPUARR_F32, host, 1, shape, &kept) != GPUARR_OK) die("gpuarr_from_host_as");
        for (int i = -20; i < N; i++) {
            int r = i < 0 ? 0 : i;
            gpuarr_array a;
            double t0 = now_s();
            if (gpuarr_from_host_as(dev, GPUARR_F32, host, 1, shape, &a) != GPUARR_OK) die("gpuarr_from_host_as");
            gpuarr_release(a);
            up[r] = now_s() - t0;
            t0 = now_s();
            cl->clEnqueueWriteBuffer(q, buf, GPUARR__CL_TRUE, 0, bytes, host, 0, NULL, NULL);
            write[r] = now_s() - t0;
            t0 = now_s();
            if (gpuarr_to_host_as(kept, GPUARR_F32, host, bytes / 4) != GPUARR_OK) die("gpuarr_to_host_as");
            down[r] = now_s() - t0;
            t0 = now_s();
            cl->clEnqueueReadBuffer(q, buf, GPUARR__CL_TRUE, 0, bytes, host, 0, NULL, NULL);
            read[r] = now_s() - t0;
        }
        gpuarr_release(kept);
        double tu = median(up, N), tw = median(write, N), td = median(down, N), tr = median(read, N);
        printf("| %zu KiB upload: gpuarr_from_host_as + gpuarr_release | %.1f us | %.1f us | %.2f |\n", bytes >> 10, tu * 1e6, tw * 1e6, tu / tw);
        printf("| %zu KiB download: gpuarr_to_host_as | %.1f us | %.1f us | %.2f |\n", bytes >> 10, td * 1e6, tr * 1e6, td / tr);
    }
    cl->clReleaseMemObject(buf);
    gpuarr_stream_destroy(s);
    free(host);
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

static void bench_opencl_build(const char *self, const char *spec) {
    char dir[] = "/tmp/gpuarr-bench-cache-XXXXXX";
    if (!mkdtemp(dir)) die("mkdtemp");
    char env[700];
    snprintf(env, sizeof env, "POCL_KERNEL_CACHE=0 GPUARR_CACHE_DIR='%s'", dir);
    double cold = run_probe(self, spec, env), warm = run_probe(self, spec, env);
    printf("\n| first f32->f16 cast on %s (builds that pair's kernel) | time |\n|---|---|\n", spec);
    printf("| cold: empty gpuarr cache, PoCL's kernel cache off | %.1f ms |\n| warm: gpuarr's binary cache | %.1f ms |\n", cold, warm);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* Batches: 1,000 host arrays of 4 KiB (1024 f32) onto the device, as 1,000 gpuarr_convert calls
   (the baseline), one gpuarr_stack and one gpuarr_convert_many, back to back in each repetition;
   kept dtype and f32->f16. Times are the calls alone (the releases are not timed). */
#define BATCH_N 1000
#define BATCH_COUNT 1024
static void bench_batches(gpuarr_device dev, int reps) {
    gpuarr_device_info info;
    gpuarr_device_get_info(dev, &info);
    static gpuarr_array src[BATCH_N], out[BATCH_N];
    float *x = (float *)malloc(sizeof(float) * BATCH_COUNT);
    if (!x) die("malloc");
    int64_t shape[1] = {BATCH_COUNT};
    for (int i = 0; i < BATCH_N; i++) {
        fill_source(x, GPUARR_F32, BATCH_COUNT);
        if (gpuarr_from_host(gpuarr_host(), x, 1, shape, &src[i]) != GPUARR_OK) die("gpuarr_from_host");
    }
    free(x);
    printf("\n| %d host arrays of 4 KiB (1024 f32) to %s (%s) | median time | per array | speed-up vs %d gpuarr_convert |\n|---|---|---|---|\n",
           BATCH_N, info.spec, info.host_unified ? "shares host memory" : "discrete: own memory, pinned staging", BATCH_N);
    gpuarr_dtype targets[2] = {GPUARR_DTYPE_INVALID, GPUARR_F16};
    for (int k = 0; k < 2; k++) {
        gpuarr_dtype t = targets[k];
        double conv_s[64], stack_s[64], many_s[64];
        for (int r = 0; r < reps; r++) {
            double t0 = now_s();
            for (int i = 0; i < BATCH_N; i++)
                if (gpuarr_convert(src[i], dev, t, &out[i]) != GPUARR_OK) die("gpuarr_convert");
            conv_s[r] = now_s() - t0;
            for (int i = 0; i < BATCH_N; i++) gpuarr_release(out[i]);
            gpuarr_array stacked;
            t0 = now_s();
            if (gpuarr_stack(src, BATCH_N, dev, t, &stacked) != GPUARR_OK) die("gpuarr_stack");
            stack_s[r] = now_s() - t0;
            gpuarr_release(stacked);
            t0 = now_s();
            if (gpuarr_convert_many(src, BATCH_N, dev, t, out) != GPUARR_OK) die("gpuarr_convert_many");
            many_s[r] = now_s() - t0;
            for (int i = 0; i < BATCH_N; i++) gpuarr_release(out[i]);
        }
        double tc = median(conv_s, reps), ts = median(stack_s, reps), tm = median(many_s, reps);
        const char *to = t ? "f32->f16" : "f32, dtype kept";
        printf("| %d x gpuarr_convert, %s (baseline) | %.2f ms | %.2f us | 1.00 |\n", BATCH_N, to, tc * 1e3, tc * 1e6 / BATCH_N);
        printf("| **gpuarr_stack**, %s | %.2f ms | %.2f us | **%.1fx** |\n", to, ts * 1e3, ts * 1e6 / BATCH_N, tc / ts);
        printf("| **gpuarr_convert_many**, %s | %.2f ms | %.2f us | **%.1fx** |\n", to, tm * 1e3, tm * 1e6 / BATCH_N, tc / tm);
    }
    for (int i = 0; i < BATCH_N; i++) gpuarr_release(src[i]);
}

static bool batch_only = false;

static void bench_opencl(const char *self, size_t mib, int reps, const char *only) {
    for (int i = 0; i < gpuarr_device_count(); i++) {
        gpuarr_device_info info;
        gpuarr_device_get_info(gpuarr_device_at(i), &info);
        if (info.backend != GPUARR_BACKEND_OPENCL || (only && strcmp(only, info.spec) != 0)) continue;
        printf("\n## %s: %s (%s), %s\n\n", info.spec, info.name, info.vendor, info.version);
        if (batch_only) {
            bench_batches(info.device, reps);
            if (!only) break;
            continue;
        }
        bench_opencl_transfers(info.device, mib, reps);
        bench_opencl_small_transfers(info.device);
        bench_opencl_casts(info.device, mib, reps);
        bench_opencl_build(self, info.spec);
        bench_batches(info.device, reps);
        if (!only) break; /* one device per platform kind is enough unless asked */
    }
}
#endif
