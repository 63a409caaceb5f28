/*
 * bench-kernels.c -- portable kernels against their baselines, measured in the same run
 * (`make bench-kernels`; bench/results/kernels.md):
 *   launch   a 4 KiB saxpy (1024 floats) through the typed launcher on opencl:0, against the same
 *            kernel text built and launched with raw clSetKernelArg + clEnqueueNDRangeKernel on
 *            the same queue; per launch, over 2000 launches then one wait, the two alternating
 *            (medians of 15 runs each)
 *   kernel   the same on 64 MiB per array (16 Mi floats), 10 launches a run, 9 runs: the kernel
 *            time dominates
 *   host     a saxpy over 64 MiB on the host through the launcher, against a hand-written loop
 *            split over the same number of threads (pthreads, one slice each)
 *   first    a new process's first launch with the kernel in the cache folder (it loads the
 *            binary, no compiler): gpuarr_init, then the timed launch and its wait; opencl:0, and
 *            cuda:0 where GPUARR_CUDA_LIBRARY names a driver (the fake one: NVRTC's cubin)
 *   nvrtc    cuda:0 with an empty cache folder: the first launch, NVRTC compiling the kernel
 *   reduce   gpuarr_reduce GPUARR_SUM of 64 MiB of f32 on the host and opencl:0, against a plain
 *            C loop (one thread, float accumulator) and numpy.sum (BENCH_PYTHON, default python3;
 *            the same values)
 * Wall clock on whatever machine runs it; the CPU is printed first.
 */
#define _GNU_SOURCE
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tgmath.h> /* a file that defines kernels includes it (KERNELS) */
#include <time.h>
#include <unistd.h>
#include "gpuarr.h"

GPUARR_KERNEL(saxpy, (GPUARR_SCALAR(float, a), GPUARR_IN(float, x), GPUARR_INOUT(float, y)), {
    int64_t i = gpuarr_index(0);
    y[i] = a * x[i] + y[i];
})

/* the raw baseline: what gpuarr builds for saxpy, written out (arrays as buffer + offset) */
static const char *raw_source =
    "__kernel void raw_saxpy(const float a, __global const float *xp, ulong xo, __global float *yp, ulong yo, long n) {\n"
    "    long i = get_global_id(0);\n"
    "    if (i >= n) return;\n"
    "    __global const float *x = xp + xo; __global float *y = yp + yo;\n"
    "    y[i] = a * x[i] + y[i];\n"
    "}\n";

#define CHECK(call)                                                                            \
    do {                                                                                       \
        gpuarr_result r_ = (call);                                                             \
        if (r_ != GPUARR_OK) {                                                                 \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, gpuarr_last_error()); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)
#define CL_CHECK(e, what)                                                                      \
    do {                                                                                       \
        if ((e) != CL_SUCCESS) {                                                               \
            fprintf(stderr, "%s failed: %d\n", what, (int)(e));                                \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof v[0], cmp_double);
    return v[n / 2];
}

typedef struct raw_kernel {
    cl_command_queue queue;
    cl_kernel kernel;
    cl_mem x, y;
    size_t xo, yo;
} raw_kernel;

static raw_kernel raw_make(gpuarr_stream s, gpuarr_array x, gpuarr_array y) {
    raw_kernel k;
    void *ctx, *dev, *queue, *xm, *ym;
    gpuarr_device d;
    CHECK(gpuarr_stream_get_device(s, &d));
    CHECK(gpuarr_opencl_context_raw(d, &ctx));
    CHECK(gpuarr_opencl_device_id_raw(d, &dev));
    CHECK(gpuarr_opencl_queue_raw(s, &queue));
    CHECK(gpuarr_opencl_mem_raw(x, &xm, &k.xo));
    CHECK(gpuarr_opencl_mem_raw(y, &ym, &k.yo));
    cl_int e;
    cl_device_id id = (cl_device_id)dev;
    cl_program p = clCreateProgramWithSource((cl_context)ctx, 1, &raw_source, NULL, &e);
    CL_CHECK(e, "clCreateProgramWithSource");
    CL_CHECK(clBuildProgram(p, 1, &id, "-cl-std=CL1.2 -cl-fp32-correctly-rounded-divide-sqrt", NULL, NULL), "clBuildProgram");
    k.kernel = clCreateKernel(p, "raw_saxpy", &e);
    CL_CHECK(e, "clCreateKernel");
    clReleaseProgram(p);
    k.queue = (cl_command_queue)queue;
    k.x = (cl_mem)xm;
    k.y = (cl_mem)ym;
    return k;
}

/* One raw launch, arguments set each time as gpuarr's launcher does; with an event (released at
   the next launch), as gpuarr keeps the last command of a stream to know when it is done. */
static cl_event raw_last;
static void raw_launch(raw_kernel *k, float a, long n, bool with_event) {
    cl_ulong xo = k->xo / sizeof(float), yo = k->yo / sizeof(float);
    size_t local = 256, global = ((size_t)n + local - 1) / local * local;
    CL_CHECK(clSetKernelArg(k->kernel, 0, sizeof a, &a), "clSetKernelArg");
    CL_CHECK(clSetKernelArg(k->kernel, 1, sizeof k->x, &k->x), "clSetKernelArg");
    CL_CHECK(clSetKernelArg(k->kernel, 2, sizeof xo, &xo), "clSetKernelArg");
    CL_CHECK(clSetKernelArg(k->kernel, 3, sizeof k->y, &k->y), "clSetKernelArg");
    CL_CHECK(clSetKernelArg(k->kernel, 4, sizeof yo, &yo), "clSetKernelArg");
    CL_CHECK(clSetKernelArg(k->kernel, 5, sizeof n, &n), "clSetKernelArg");
    cl_event ev = NULL;
    CL_CHECK(clEnqueueNDRangeKernel(k->queue, k->kernel, 1, NULL, &global, &local, 0, NULL, with_event ? &ev : NULL), "clEnqueueNDRangeKernel");
    if (raw_last) clReleaseEvent(raw_last);
    raw_last = ev;
}

/* Seconds per launch: gpuarr's, raw, and raw with events, `launches` each then a wait, median of `runs`. */
static void launch_pair(gpuarr_device d, int64_t n, int launches, int runs, double *gp, double *raw, double *raw_ev) {
    gpuarr_stream s;
    gpuarr_array x, y;
    CHECK(gpuarr_stream_create(d, 0, &s));
    CHECK(gpuarr_zeros(d, GPUARR_F32, 1, &n, &x));
    CHECK(gpuarr_zeros(d, GPUARR_F32, 1, &n, &y));
    raw_kernel k = raw_make(s, x, y);
    gpuarr_launch l = {s, 0, {0, 0, 0}};
    double g[16], r[16], re[16];
    for (int run = -1; run < runs; run++) { /* run -1 warms both up (gpuarr builds its kernel) */
        double t0 = now_s();
        for (int i = 0; i < launches; i++) CHECK(saxpy(&l, 0.5f, x, y));
        CHECK(gpuarr_stream_sync(s));
        double t1 = now_s();
        for (int i = 0; i < launches; i++) raw_launch(&k, 0.5f, (long)n, false);
        CL_CHECK(clFinish(k.queue), "clFinish");
        double t2 = now_s();
        for (int i = 0; i < launches; i++) raw_launch(&k, 0.5f, (long)n, true);
        CL_CHECK(clFinish(k.queue), "clFinish");
        double t3 = now_s();
        if (run >= 0) g[run] = (t1 - t0) / launches, r[run] = (t2 - t1) / launches, re[run] = (t3 - t2) / launches;
    }
    *gp = median(g, runs);
    *raw = median(r, runs);
    *raw_ev = median(re, runs);
    clReleaseKernel(k.kernel);
    gpuarr_release(x);
    gpuarr_release(y);
    gpuarr_stream_destroy(s);
}

typedef struct slice {
    float a;
    const float *x;
    float *y;
    size_t begin, end;
} slice;

static void *hand_saxpy(void *arg) {
    slice *s = (slice *)arg;
    for (size_t i = s->begin; i < s->end; i++) s->y[i] = s->a * s->x[i] + s->y[i];
    return NULL;
}

/* The host: the launcher against the loop over the same threads; seconds, median of 7. */
static void host_pair(int64_t n, int threads, double *gp, double *hand) {
    gpuarr_array x, y;
    CHECK(gpuarr_zeros(gpuarr_host(), GPUARR_F32, 1, &n, &x));
    CHECK(gpuarr_zeros(gpuarr_host(), GPUARR_F32, 1, &n, &y));
    void *xp, *yp;
    CHECK(gpuarr_host_data(x, &xp));
    CHECK(gpuarr_host_data(y, &yp));
    double g[7], h[7];
    for (int run = -1; run < 7; run++) {
        double t0 = now_s();
        CHECK(saxpy(NULL, 0.5f, x, y));
        double t1 = now_s();
        pthread_t tid[64];
        slice sl[64];
        for (int t = 0; t < threads; t++) {
            sl[t] = (slice){0.5f, (const float *)xp, (float *)yp, (size_t)n * (size_t)t / (size_t)threads, (size_t)n * (size_t)(t + 1) / (size_t)threads};
            if (t) pthread_create(&tid[t], NULL, hand_saxpy, &sl[t]);
        }
        hand_saxpy(&sl[0]);
        for (int t = 1; t < threads; t++) pthread_join(tid[t], NULL);
        double t2 = now_s();
        if (run >= 0) g[run] = t1 - t0, h[run] = t2 - t1;
    }
    *gp = median(g, 7);
    *hand = median(h, 7);
    gpuarr_release(x);
    gpuarr_release(y);
}

/* Child mode: init, then the first launch on spec and its wait; prints "init MS launch MS". */
static int child_first_launch(const char *spec) {
    double t0 = now_s();
    CHECK(gpuarr_init(NULL));
    gpuarr_device d;
    CHECK(gpuarr_device_find(spec, &d));
    int64_t n = 1024;
    gpuarr_array x, y;
    CHECK(gpuarr_zeros(d, GPUARR_F32, 1, &n, &x));
    CHECK(gpuarr_zeros(d, GPUARR_F32, 1, &n, &y));
    CHECK(gpuarr_array_sync(y));
    double t1 = now_s();
    CHECK(saxpy(NULL, 2.0f, x, y));
    CHECK(gpuarr_array_sync(y));
    double t2 = now_s();
    printf("init %.2f launch %.2f\n", (t1 - t0) * 1e3, (t2 - t1) * 1e3);
    gpuarr_release(x);
    gpuarr_release(y);
    gpuarr_shutdown();
    return 0;
}

/* Runs this program as a child for its first launch on spec; its launch milliseconds. */
static double first_launch_ms(const char *self, const char *spec) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "'%s' --child-first-launch %s", self, spec);
    FILE *p = popen(cmd, "r");
    double init = -1, launch = -1;
    if (!p || fscanf(p, "init %lf launch %lf", &init, &launch) != 2) launch = -1;
    if (p) pclose(p);
    return launch;
}

static void reduce_rows(gpuarr_device d, const float *v, int64_t n) {
    gpuarr_array a;
    CHECK(gpuarr_from_host(d, v, 1, &n, &a));
    double g[5];
    float sum = 0;
    for (int run = -1; run < 5; run++) {
        gpuarr_array out;
        double t0 = now_s();
        CHECK(gpuarr_reduce(a, GPUARR_SUM, GPUARR_F32, &out));
        CHECK(gpuarr_to_host(out, &sum, 1));
        if (run >= 0) g[run] = now_s() - t0;
        gpuarr_release(out);
    }
    gpuarr_device_info info;
    CHECK(gpuarr_device_get_info(d, &info));
    printf("| reduce | gpuarr_reduce SUM f32, 64 MiB, %s | %.2f ms (sum %.9g) |\n", info.spec, median(g, 5) * 1e3, (double)sum);
    gpuarr_release(a);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--child-first-launch") == 0) return child_first_launch(argv[2]);
    char self[1024];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) return 1;
    self[len] = '\0';
    char cache[] = "/tmp/gpuarr-bench-kernels-XXXXXX";
    if (!mkdtemp(cache)) return 1;
    setenv("GPUARR_CACHE_DIR", cache, 1); /* a folder of its own: "first" starts from what this run built */
    FILE *cpu = popen("lscpu | sed -n 's/^Model name: *//p'", "r");
    char cpu_name[256] = "?";
    if (cpu && fgets(cpu_name, sizeof cpu_name, cpu)) cpu_name[strcspn(cpu_name, "\n")] = '\0';
    if (cpu) pclose(cpu);
    long threads = sysconf(_SC_NPROCESSORS_ONLN);
    printf("CPU: %s, %ld threads; %s\n\n| what | case | gpuarr | baseline | ratio |\n|---|---|---|---|---|\n", cpu_name, threads, gpuarr_version_string());
    CHECK(gpuarr_init(NULL));
    gpuarr_device cl;
    bool have_cl = gpuarr_device_find("opencl:0", &cl) == GPUARR_OK;
    if (have_cl) {
        double g, r, re;
        launch_pair(cl, 1024, 2000, 15, &g, &r, &re);
        printf("| launch | saxpy 4 KiB, opencl:0, per launch | %.2f us | raw clEnqueueNDRangeKernel %.2f us | %.2fx the raw time |\n", g * 1e6,
               r * 1e6, g / r);
        printf("| launch | (the same raw launch asking for its event, as gpuarr's streams do) | | %.2f us | %.2fx that |\n", re * 1e6, g / re);
        launch_pair(cl, (int64_t)16 << 20, 10, 9, &g, &r, &re);
        printf("| kernel | saxpy 64 MiB per array, opencl:0, per launch | %.2f ms | raw %.2f ms | %.2f of the raw speed |\n", g * 1e3, r * 1e3, r / g);
    }
    double g, h;
    host_pair((int64_t)16 << 20, (int)threads, &g, &h);
    printf("| host | saxpy 64 MiB per array, host, %ld threads | %.2f ms | hand-written loop over %ld pthreads %.2f ms | %.2f of its speed |\n",
           threads, g * 1e3, threads, h * 1e3, h / g);
    static float v[16 << 20];
    for (int64_t i = 0; i < (16 << 20); i++) v[i] = (float)((i * 7919) % 1000) / 1000.0f;
    double loop[5];
    float s = 0;
    for (int run = 0; run < 5; run++) {
        double t0 = now_s();
        s = 0;
        for (int i = 0; i < (16 << 20); i++) s += v[i];
        loop[run] = now_s() - t0;
    }
    printf("| reduce | plain C loop, one thread, float accumulator | %.2f ms (sum %.9g) | | |\n", median(loop, 5) * 1e3, (double)s);
    reduce_rows(gpuarr_host(), v, (int64_t)16 << 20);
    if (have_cl) reduce_rows(cl, v, (int64_t)16 << 20);
    const char *python = getenv("BENCH_PYTHON"); /* make bench-kernels: the test venv's, which has NumPy */
    char np_cmd[1400];
    snprintf(np_cmd, sizeof np_cmd, "%s -c \"import numpy as np, time; v = ((np.arange(16 << 20, dtype=np.int64) * 7919) %% 1000).astype(np.float32) / np.float32(1000); "
                     "t = []; [ (t.append(time.perf_counter()), v.sum(), t.append(time.perf_counter())) for _ in range(5) ]; "
                     "d = sorted(t[i + 1] - t[i] for i in range(0, 10, 2)); print('%%.2f %%.9g' %% (d[2] * 1e3, v.sum()))\" 2>/dev/null",
             python && *python ? python : "python3");
    FILE *np = popen(np_cmd, "r");
    double np_ms = -1, np_sum = 0;
    if (np && fscanf(np, "%lf %lf", &np_ms, &np_sum) == 2) printf("| reduce | numpy.sum f32, 64 MiB | %.2f ms (sum %.9g) | | |\n", np_ms, np_sum);
    else printf("| reduce | numpy.sum | not measured: python3 with numpy not found | | |\n");
    if (np) pclose(np);
    gpuarr_device cu;
    bool have_cu = gpuarr_device_find("cuda:0", &cu) == GPUARR_OK;
    gpuarr_shutdown();
    if (have_cl) printf("| first | a new process's first launch, cached kernel, opencl:0 | %.2f ms | | |\n", first_launch_ms(self, "opencl:0"));
    if (have_cu) {
        char empty[] = "/tmp/gpuarr-bench-kernels-nvrtc-XXXXXX";
        if (!mkdtemp(empty)) return 1;
        setenv("GPUARR_CACHE_DIR", empty, 1);
        printf("| nvrtc | first launch on cuda:0, empty cache (NVRTC compiles saxpy) | %.2f ms | | |\n", first_launch_ms(self, "cuda:0"));
        printf("| first | a new process's first launch, cached cubin, cuda:0 | %.2f ms | | |\n", first_launch_ms(self, "cuda:0"));
    }
    return 0;
}
