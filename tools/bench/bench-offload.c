/*
 * bench-offload.c -- the offload benchmark (`make bench-offload`; bench/results/offload.md).
 *
 * Regret: two tasks with a host implementation (plain loops) and an OpenCL one (a kernel built
 * here through gpuarr's OpenCL interop, enqueued on the stream gpuarr gives the implementation),
 * saxpy (memory-bound, inputs 1 KiB .. 64 MiB each) and a naive matmul (compute-bound, n = 16 ..
 * 512), on the host and opencl:0 as a discrete device (GPUARR_OPENCL_UNIFIED=off: transfers cost).
 * A call is "inputs on the host, output wanted on the host". The same shuffled call sequence
 * (each size REPS times) is run
 *   - forced on the host and forced on opencl:0, each call measured: the per-call oracle is the
 *     better of the two; always-host, always-device and the 1 MiB rule (more than 1 MiB of input:
 *     the device) are read off the same measurements;
 *   - by the planner (gpuarr_offload, policy AUTO) under other task names, so that the forced
 *     runs do not teach it anything: after gpuarr_calibrate(opencl:0) and one unmeasured pass of
 *     the sequence (its warm-up and explorations), then measured.
 * The planner's regret per call is its choice's forced time against the oracle (same
 * measurements: no run-to-run noise between the two); its own measured time is printed too.
 * Regret = t / t_oracle - 1; printed: total, median and p95 per policy and task.
 *
 * --map DEVICES: gpuarr_map of --items saxpy items (4 MiB inputs; --matmul: 256 x 256 matmuls) on
 * those candidates, three passes (the first warms up and teaches the models), items/s. Every
 * item's output is checked against the host reference after each pass (saxpy exactly, matmul
 * within 1e-4 relative); a mismatch exits 1 naming the item. --wrong-reference spoils one
 * element of the last item's reference, to see that check fail.
 * Raw per-call lines go to stdout; a summary at the end. Timings are wall clock on whatever
 * machine it runs on: a loaded machine makes them noisy (say so with the numbers).
 */
#define _POSIX_C_SOURCE 200809L
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "gpuarr.h"

#define CHECK(call)                                                                            \
    do {                                                                                       \
        gpuarr_result r_ = (call);                                                             \
        if (r_ != GPUARR_OK) {                                                                 \
            fprintf(stderr, "bench-offload: %s:%d: %s: %s\n", __FILE__, __LINE__, #call, gpuarr_last_error()); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------------------------------------
 * The implementations
 * ------------------------------------------------------------------------------------------- */
static const char *kernels_src =
    "__kernel void saxpy(float a, __global const float *x, ulong xo, __global const float *y, ulong yo,\n"
    "                    __global float *o, ulong oo) {\n"
    "    size_t i = get_global_id(0);\n"
    "    o[oo + i] = a * x[xo + i] + y[yo + i];\n"
    "}\n"
    "__kernel void matmul(uint n, __global const float *A, ulong ao, __global const float *B, ulong bo,\n"
    "                     __global float *C, ulong co) {\n"
    "    size_t c = get_global_id(0), r = get_global_id(1);\n"
    "    float s = 0.0f;\n"
    "    for (uint k = 0; k < n; k++) s += A[ao + r * n + k] * B[bo + k * n + c];\n"
    "    C[co + r * n + c] = s;\n"
    "}\n";

/* One program per OpenCL device (devices may share a context), built the first time it is needed. */
static pthread_mutex_t prog_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { cl_device_id dev; cl_program prog; } progs[8];
static int nprogs;

static gpuarr_result program_for(gpuarr_device d, cl_program *out) {
    cl_context ctx;
    cl_device_id dev;
    gpuarr_result r = gpuarr_opencl_context(d, &ctx);
    if (r == GPUARR_OK) r = gpuarr_opencl_device_id(d, &dev);
    if (r != GPUARR_OK) return r;
    pthread_mutex_lock(&prog_lock);
    for (int i = 0; i < nprogs; i++)
        if (progs[i].dev == dev) {
            *out = progs[i].prog;
            pthread_mutex_unlock(&prog_lock);
            return GPUARR_OK;
        }
    cl_int e;
    cl_program p = clCreateProgramWithSource(ctx, 1, &kernels_src, NULL, &e);
    if (e == CL_SUCCESS) e = clBuildProgram(p, 1, &dev, "", NULL, NULL);
    if (e != CL_SUCCESS || nprogs == 8) {
        pthread_mutex_unlock(&prog_lock);
        fprintf(stderr, "bench-offload: building the kernels: OpenCL error %d\n", e);
        return GPUARR_ERROR_BACKEND;
    }
    progs[nprogs].dev = dev;
    progs[nprogs++].prog = p;
    *out = p;
    pthread_mutex_unlock(&prog_lock);
    return GPUARR_OK;
}

static int64_t count_of(gpuarr_array a) {
    gpuarr_array_info in;
    return gpuarr_array_get_info(a, &in) == GPUARR_OK ? in.count : 0;
}

static int64_t side_of(gpuarr_array a) {
    gpuarr_array_info in;
    return gpuarr_array_get_info(a, &in) == GPUARR_OK ? in.shape[0] : 0;
}

static gpuarr_result saxpy_host(const gpuarr_array *in, int n_in, gpuarr_array *out, int n_out, gpuarr_stream s, void *user) {
    (void)n_in, (void)n_out, (void)s, (void)user;
    int64_t n = count_of(in[0]);
    void *px, *py, *po;
    gpuarr_result r = gpuarr_empty(gpuarr_host(), GPUARR_F32, 1, &n, &out[0]);
    if (r == GPUARR_OK) r = gpuarr_host_data(in[0], &px);
    if (r == GPUARR_OK) r = gpuarr_host_data(in[1], &py);
    if (r == GPUARR_OK) r = gpuarr_host_data(out[0], &po);
    if (r != GPUARR_OK) return r;
    const float *x = px, *y = py;
    float *o = po;
    for (int64_t i = 0; i < n; i++) o[i] = 2.0f * x[i] + y[i];
    return GPUARR_OK;
}

static gpuarr_result matmul_host(const gpuarr_array *in, int n_in, gpuarr_array *out, int n_out, gpuarr_stream s, void *user) {
    (void)n_in, (void)n_out, (void)s, (void)user;
    int64_t n = side_of(in[0]), shape[2] = {n, n};
    void *pa, *pb, *pc;
    gpuarr_result r = gpuarr_empty(gpuarr_host(), GPUARR_F32, 2, shape, &out[0]);
    if (r == GPUARR_OK) r = gpuarr_host_data(in[0], &pa);
    if (r == GPUARR_OK) r = gpuarr_host_data(in[1], &pb);
    if (r == GPUARR_OK) r = gpuarr_host_data(out[0], &pc);
    if (r != GPUARR_OK) return r;
    const float *A = pa, *B = pb;
    float *C = pc;
    for (int64_t i = 0; i < n; i++) /* naive, i-j-k: the kernel's algorithm, a dot product per element */
        for (int64_t j = 0; j < n; j++) {
            float sum = 0.0f;
            for (int64_t k = 0; k < n; k++) sum += A[i * n + k] * B[k * n + j];
            C[i * n + j] = sum;
        }
    return GPUARR_OK;
}

/* Enqueues kernel `name` on s over `global` (2 dims when global[1] > 0). */
static gpuarr_result enqueue(const char *name, const gpuarr_array *in, gpuarr_array out, gpuarr_stream s, cl_uint n_arg, size_t *global) {
    cl_program prog;
    cl_command_queue q;
    cl_mem m[3];
    size_t off[3];
    gpuarr_result r = program_for(gpuarr_current_device(), &prog);
    if (r == GPUARR_OK) r = gpuarr_opencl_queue(s, &q);
    for (int i = 0; i < 2 && r == GPUARR_OK; i++) r = gpuarr_opencl_mem(in[i], &m[i], &off[i]);
    if (r == GPUARR_OK) r = gpuarr_opencl_mem(out, &m[2], &off[2]);
    for (int i = 0; i < 2 && r == GPUARR_OK; i++) r = gpuarr_stream_wait_array(s, in[i]);
    if (r != GPUARR_OK) return r;
    cl_int e;
    cl_kernel k = clCreateKernel(prog, name, &e); /* one per call: gpuarr_map calls from several threads */
    if (e != CL_SUCCESS) return GPUARR_ERROR_BACKEND;
    cl_float a = 2.0f;
    cl_ulong o[3];
    for (int i = 0; i < 3; i++) o[i] = (cl_ulong)(off[i] / sizeof(float));
    e = global[1] ? clSetKernelArg(k, 0, sizeof n_arg, &n_arg) : clSetKernelArg(k, 0, sizeof a, &a);
    for (cl_uint i = 0; i < 3; i++) {
        e |= clSetKernelArg(k, 1 + 2 * i, sizeof(cl_mem), &m[i]);
        e |= clSetKernelArg(k, 2 + 2 * i, sizeof(cl_ulong), &o[i]);
    }
    if (e == CL_SUCCESS) e = clEnqueueNDRangeKernel(q, k, global[1] ? 2 : 1, NULL, global, NULL, 0, NULL, NULL);
    clReleaseKernel(k);
    if (e != CL_SUCCESS) return GPUARR_ERROR_BACKEND;
    r = gpuarr_array_record_stream(out, s);
    for (int i = 0; i < 2 && r == GPUARR_OK; i++) r = gpuarr_array_record_stream(in[i], s);
    return r;
}

static gpuarr_result saxpy_cl(const gpuarr_array *in, int n_in, gpuarr_array *out, int n_out, gpuarr_stream s, void *user) {
    (void)n_in, (void)n_out, (void)user;
    int64_t n = count_of(in[0]);
    gpuarr_result r = gpuarr_empty(gpuarr_current_device(), GPUARR_F32, 1, &n, &out[0]);
    if (r != GPUARR_OK) return r;
    size_t global[2] = {(size_t)n, 0};
    return enqueue("saxpy", in, out[0], s, 0, global);
}

static gpuarr_result matmul_cl(const gpuarr_array *in, int n_in, gpuarr_array *out, int n_out, gpuarr_stream s, void *user) {
    (void)n_in, (void)n_out, (void)user;
    int64_t n = side_of(in[0]), shape[2] = {n, n};
    gpuarr_result r = gpuarr_empty(gpuarr_current_device(), GPUARR_F32, 2, shape, &out[0]);
    if (r != GPUARR_OK) return r;
    size_t global[2] = {(size_t)n, (size_t)n};
    return enqueue("matmul", in, out[0], s, (cl_uint)n, global);
}

static uint64_t matmul_size(const gpuarr_array *in, int n_in, void *user) { /* n^3 multiply-adds */
    (void)n_in, (void)user;
    uint64_t n = (uint64_t)side_of(in[0]);
    return n * n * n;
}

static gpuarr_task make_task(const char *name, bool matmul) {
    gpuarr_task_desc td;
    memset(&td, 0, sizeof td);
    td.name = name;
    td.impl[GPUARR_BACKEND_HOST] = matmul ? matmul_host : saxpy_host;
    td.impl[GPUARR_BACKEND_OPENCL] = matmul ? matmul_cl : saxpy_cl;
    td.n_in = 2;
    td.n_out = 1;
    td.size = matmul ? matmul_size : NULL;
    gpuarr_task t;
    CHECK(gpuarr_task_create(&td, &t));
    return t;
}

/* ---------------------------------------------------------------------------------------------
 * The call sequence
 * ------------------------------------------------------------------------------------------- */
typedef struct call {
    int matmul;          /* 0 saxpy, 1 matmul */
    int64_t n;           /* saxpy: elements; matmul: side */
    uint64_t in_bytes;   /* both inputs */
    gpuarr_array in[2];
    double t_host, t_dev, t_plan, t_plan_choice;
    int plan_on_dev;
} call;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_rand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

/* A host array of f32 values 0.00 .. 0.96, the pattern shifted by seed (so items differ). */
static gpuarr_array filled_seed(int ndim, const int64_t *shape, int seed) {
    gpuarr_array a;
    void *p;
    CHECK(gpuarr_empty(gpuarr_host(), GPUARR_F32, ndim, shape, &a));
    CHECK(gpuarr_host_data(a, &p));
    int64_t count = ndim == 1 ? shape[0] : shape[0] * shape[1];
    float *f = p;
    for (int64_t i = 0; i < count; i++) f[i] = (float)((i + seed) % 97) * 0.01f;
    return a;
}

static gpuarr_array filled(int ndim, const int64_t *shape) { return filled_seed(ndim, shape, 0); }

/* Runs c with policy/devices; returns wall seconds (output back on the host, synced), *on_dev. */
static double run_call_keep(gpuarr_task t, call *c, const char *devices, gpuarr_offload_policy pol, int *on_dev, gpuarr_device cl,
                            gpuarr_array *keep) {
    gpuarr_offload_desc d;
    memset(&d, 0, sizeof d);
    d.devices = devices;
    d.policy = pol;
    d.out_device = gpuarr_host();
    gpuarr_array out;
    gpuarr_device ran;
    double t0 = now_s();
    CHECK(gpuarr_offload(t, c->in, 2, &out, 1, &d, &ran));
    CHECK(gpuarr_array_sync(out));
    double dt = now_s() - t0;
    if (keep) *keep = out;
    else CHECK(gpuarr_release(out));
    if (on_dev) *on_dev = ran.id == cl.id;
    return dt;
}

static double run_call(gpuarr_task t, call *c, const char *devices, gpuarr_offload_policy pol, int *on_dev, gpuarr_device cl) {
    return run_call_keep(t, c, devices, pol, on_dev, cl, NULL);
}

/* The OpenCL kernels compute what the host loops do (to float rounding): checked once per task. */
static void verify(gpuarr_task t, call *c, gpuarr_device cl) {
    gpuarr_array a, b;
    void *pa, *pb;
    run_call_keep(t, c, "host", GPUARR_OFFLOAD_HOST, NULL, cl, &a);
    run_call_keep(t, c, "opencl:0", GPUARR_OFFLOAD_GPU, NULL, cl, &b);
    CHECK(gpuarr_host_data(a, &pa));
    CHECK(gpuarr_host_data(b, &pb));
    int64_t count = c->matmul ? c->n * c->n : c->n;
    const float *x = pa, *y = pb;
    for (int64_t i = 0; i < count; i++) {
        float d = x[i] - y[i], m = x[i] < 0 ? -x[i] : x[i];
        if ((d < 0 ? -d : d) > 1e-4f * (m + 1.0f)) {
            fprintf(stderr, "bench-offload: %s n=%lld: element %lld: host %g, opencl:0 %g\n", c->matmul ? "matmul" : "saxpy", (long long)c->n,
                    (long long)i, (double)x[i], (double)y[i]);
            exit(1);
        }
    }
    printf("# verified: %s n=%lld, host and opencl:0 agree\n", c->matmul ? "matmul" : "saxpy", (long long)c->n);
    CHECK(gpuarr_release(a));
    CHECK(gpuarr_release(b));
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double quantile(double *v, int n, double q) { /* nearest rank, sorts v */
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int k = (int)(q * (double)n + 0.999999) - 1;
    if (k < 0) k = 0;
    if (k >= n) k = n - 1;
    return v[k];
}

enum { P_PLAN, P_HOST, P_DEV, P_RULE, P_ORACLE, P_COUNT };
static const char *pnames[P_COUNT] = {"planner", "always-host", "always-device", "1 MiB rule", "oracle"};

static double policy_time(const call *c, int p) {
    switch (p) {
    case P_PLAN: return c->t_plan_choice;
    case P_HOST: return c->t_host;
    case P_DEV: return c->t_dev;
    case P_RULE: return c->in_bytes > (1u << 20) ? c->t_dev : c->t_host;
    default: return c->t_host < c->t_dev ? c->t_host : c->t_dev;
    }
}

static void summary(const call *calls, int n, int which, const char *label) {
    double *reg = malloc(sizeof(double) * (size_t)n);
    printf("\n## %s\n\n| policy | total s | median regret | p95 regret | calls on device |\n|---|---|---|---|---|\n", label);
    for (int p = 0; p < P_COUNT; p++) {
        double total = 0;
        int k = 0, on_dev = 0;
        for (int i = 0; i < n; i++) {
            if (which >= 0 && calls[i].matmul != which) continue;
            const call *c = &calls[i];
            double t = policy_time(c, p), o = policy_time(c, P_ORACLE);
            total += t;
            reg[k++] = t / o - 1.0;
            on_dev += p == P_PLAN ? c->plan_on_dev : p == P_DEV ? 1 : p == P_RULE ? c->in_bytes > (1u << 20) : p == P_ORACLE ? c->t_dev < c->t_host : 0;
        }
        double med = quantile(reg, k, 0.5), p95 = quantile(reg, k, 0.95);
        printf("| %s | %.3f | %.1f%% | %.1f%% | %d of %d |\n", pnames[p], total, 100 * med, 100 * p95, on_dev, k);
    }
    if (which < 0) {
        double own = 0;
        for (int i = 0; i < n; i++) own += calls[i].t_plan;
        printf("\nplanner, its own runs measured (another run than the forced ones): total %.3f s\n", own);
    }
    free(reg);
}

static int run_regret(int reps) {
    gpuarr_device cl;
    CHECK(gpuarr_device_find("opencl:0", &cl));
    double t0 = now_s();
    CHECK(gpuarr_calibrate(cl));
    printf("# gpuarr_calibrate(opencl:0): %.2f s\n", now_s() - t0);
    static const int64_t saxpy_n[] = {256, 1024, 4096, 16384, 65536, 262144, 1 << 20, 1 << 22, 1 << 24}; /* 1 KiB .. 64 MiB per input */
    static const int64_t matmul_n[] = {16, 32, 64, 128, 256, 512};                                       /* 1 KiB .. 1 MiB per input */
    int ns = (int)(sizeof saxpy_n / sizeof *saxpy_n), nm = (int)(sizeof matmul_n / sizeof *matmul_n);
    int n = (ns + nm) * reps;
    call *calls = calloc((size_t)n, sizeof *calls);
    int k = 0;
    for (int r = 0; r < reps; r++) {
        for (int i = 0; i < ns; i++) calls[k].matmul = 0, calls[k++].n = saxpy_n[i];
        for (int i = 0; i < nm; i++) calls[k].matmul = 1, calls[k++].n = matmul_n[i];
    }
    for (int i = n - 1; i > 0; i--) { /* a fixed shuffle */
        int j = (int)(next_rand() % (uint64_t)(i + 1));
        call tmp = calls[i];
        calls[i] = calls[j], calls[j] = tmp;
    }
    for (int i = 0; i < n; i++) {
        call *c = &calls[i];
        int64_t shape[2] = {c->n, c->n};
        c->in[0] = filled(c->matmul ? 2 : 1, shape);
        c->in[1] = filled(c->matmul ? 2 : 1, shape);
        c->in_bytes = 2 * sizeof(float) * (uint64_t)(c->matmul ? c->n * c->n : c->n);
    }
    gpuarr_task plan[2] = {make_task("bench.saxpy", false), make_task("bench.matmul", true)};
    gpuarr_task forced[2] = {make_task("bench.saxpy.forced", false), make_task("bench.matmul.forced", true)};
    /* pass 0: the planner's cold pass (right after calibration: the 1 MiB rule, warm-ups and
       explorations), and the forced tasks' warm-ups (kernel builds); pass 1 measured */
    printf("# pass 0 (cold planner, after gpuarr_calibrate only)\n# task n in_bytes planner_s on\n");
    double cold_total = 0;
    int cold_dev = 0;
    for (int i = 0; i < n; i++) {
        call *c = &calls[i];
        int on;
        double t = run_call(plan[c->matmul], c, "host,opencl:0", GPUARR_OFFLOAD_AUTO, &on, cl);
        cold_total += t, cold_dev += on;
        printf("cold %s %lld %llu %.6f %s\n", c->matmul ? "matmul" : "saxpy", (long long)c->n, (unsigned long long)c->in_bytes, t, on ? "opencl:0" : "host");
        run_call(forced[c->matmul], c, "host", GPUARR_OFFLOAD_HOST, NULL, cl);
        run_call(forced[c->matmul], c, "opencl:0", GPUARR_OFFLOAD_GPU, NULL, cl);
    }
    printf("# cold pass: planner total %.3f s, %d of %d calls on opencl:0\n", cold_total, cold_dev, n);
    for (int want = 0; want < 2; want++) /* the first call of each task */
        for (int i = 0; i < n; i++)
            if (calls[i].matmul == want) {
                verify(forced[want], &calls[i], cl);
                break;
            }
    printf("# pass 1 (measured)\n# task n in_bytes host_s device_s planner_s planner_on\n");
    for (int i = 0; i < n; i++) {
        call *c = &calls[i];
        gpuarr_task ft = forced[c->matmul];
        if (i % 2) { /* alternate the order of the two forced runs */
            c->t_dev = run_call(ft, c, "opencl:0", GPUARR_OFFLOAD_GPU, NULL, cl);
            c->t_host = run_call(ft, c, "host", GPUARR_OFFLOAD_HOST, NULL, cl);
        } else {
            c->t_host = run_call(ft, c, "host", GPUARR_OFFLOAD_HOST, NULL, cl);
            c->t_dev = run_call(ft, c, "opencl:0", GPUARR_OFFLOAD_GPU, NULL, cl);
        }
        c->t_plan = run_call(plan[c->matmul], c, "host,opencl:0", GPUARR_OFFLOAD_AUTO, &c->plan_on_dev, cl);
        c->t_plan_choice = c->plan_on_dev ? c->t_dev : c->t_host;
        printf("call %s %lld %llu %.6f %.6f %.6f %s\n", c->matmul ? "matmul" : "saxpy", (long long)c->n, (unsigned long long)c->in_bytes,
               c->t_host, c->t_dev, c->t_plan, c->plan_on_dev ? "opencl:0" : "host");
    }
    static char buf[1 << 14];
    if (gpuarr_task_models_summary(buf, sizeof buf) == GPUARR_OK) printf("\n# models\n%s", buf);
    summary(calls, n, -1, "both tasks");
    summary(calls, n, 0, "saxpy (memory-bound)");
    summary(calls, n, 1, "matmul (compute-bound)");
    for (int i = 0; i < n; i++) {
        CHECK(gpuarr_release(calls[i].in[0]));
        CHECK(gpuarr_release(calls[i].in[1]));
    }
    for (int i = 0; i < 2; i++) {
        CHECK(gpuarr_task_destroy(plan[i]));
        CHECK(gpuarr_task_destroy(forced[i]));
    }
    free(calls);
    return 0;
}

/* The host's result for one map item (the host implementation's loops, run here), into ref. */
static void map_reference(const gpuarr_array *in, bool matmul, int64_t count, float *ref) {
    void *px, *py;
    CHECK(gpuarr_host_data(in[0], &px));
    CHECK(gpuarr_host_data(in[1], &py));
    const float *x = px, *y = py;
    if (!matmul) {
        for (int64_t i = 0; i < count; i++) ref[i] = 2.0f * x[i] + y[i];
        return;
    }
    int64_t n = side_of(in[0]);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++) {
            float sum = 0.0f;
            for (int64_t k = 0; k < n; k++) sum += x[i * n + k] * y[k * n + j];
            ref[i * n + j] = sum;
        }
}

/* Every item's output against the host reference, wherever it was computed: saxpy exactly (2x
   is exact in f32, so a fused multiply-add rounds 2x + y as the host loop does), matmul within
   1e-4 relative (a device may fuse the multiply-adds of the dot product). Exits on a mismatch. */
static void map_check(const gpuarr_array *out, int items, bool matmul, int64_t count, const float *refs, int pass) {
    float *got = malloc(sizeof(float) * (size_t)count);
    if (!got) exit(1);
    for (int it = 0; it < items; it++) {
        CHECK(gpuarr_to_host_as(out[it], GPUARR_F32, got, (size_t)count));
        const float *ref = refs + (size_t)it * (size_t)count;
        for (int64_t i = 0; i < count; i++) {
            float d = got[i] - ref[i], m = ref[i] < 0 ? -ref[i] : ref[i];
            if (matmul ? (d < 0 ? -d : d) > 1e-4f * (m + 1.0f) : got[i] != ref[i]) {
                fprintf(stderr, "bench-offload: MISMATCH: map %s pass %d item %d element %lld: %.9g, the host's reference %.9g\n",
                        matmul ? "matmul" : "saxpy", pass, it, (long long)i, (double)got[i], (double)ref[i]);
                exit(1);
            }
        }
    }
    free(got);
    printf("# checked: map %s pass %d: all %d items agree with the host reference (%s)\n", matmul ? "matmul" : "saxpy", pass, items,
           matmul ? "within 1e-4 relative" : "exactly");
}

/* gpuarr_map of `items` items on `devices`: saxpy of 1M elements (4 MiB per input), or a matmul
   of 256 x 256 (256 KiB per input); each item's inputs differ, and every output is checked
   against the host reference. wrong_ref: the reference of the last item is made wrong in one
   element, to see the check fail. */
static int run_map(const char *devices, int items, bool matmul, bool wrong_ref) {
    gpuarr_task t = make_task(matmul ? "bench.map.matmul" : "bench.map.saxpy", matmul);
    gpuarr_array *in = calloc((size_t)items * 2, sizeof *in), *out = calloc((size_t)items, sizeof *out);
    int64_t shape[2] = {matmul ? 256 : 1 << 20, 256}, count = matmul ? 256 * 256 : 1 << 20;
    for (int i = 0; i < 2 * items; i++) in[i] = filled_seed(matmul ? 2 : 1, shape, i);
    float *refs = malloc(sizeof(float) * (size_t)count * (size_t)items);
    if (!in || !out || !refs) return 1;
    for (int i = 0; i < items; i++) map_reference(in + 2 * i, matmul, count, refs + (size_t)i * (size_t)count);
    if (wrong_ref) refs[(size_t)(items - 1) * (size_t)count + (size_t)count / 2] += 1.0f;
    gpuarr_offload_desc d;
    memset(&d, 0, sizeof d);
    d.devices = devices;
    d.policy = GPUARR_OFFLOAD_AUTO;
    for (int pass = 0; pass < 3; pass++) { /* pass 0: warm-ups and models */
        double t0 = now_s();
        CHECK(gpuarr_map(t, in, items, out, &d, NULL));
        for (int i = 0; i < items; i++) CHECK(gpuarr_array_sync(out[i]));
        double dt = now_s() - t0;
        map_check(out, items, matmul, count, refs, pass);
        for (int i = 0; i < items; i++) CHECK(gpuarr_release(out[i]));
        printf("map %s %s pass %d: %d items in %.3f s, %.1f items/s\n", matmul ? "matmul" : "saxpy", devices, pass, items, dt, items / dt);
    }
    static const char *specs[] = {"host", "opencl:0", "opencl:1"};
    for (int i = 0; i < 3; i++) {
        gpuarr_device dev;
        gpuarr_task_stats st;
        if (gpuarr_device_find(specs[i], &dev) != GPUARR_OK || gpuarr_task_get_stats(t, dev, &st) != GPUARR_OK) continue;
        printf("map %s: %llu items on %s\n", devices, (unsigned long long)st.calls, specs[i]);
    }
    for (int i = 0; i < 2 * items; i++) CHECK(gpuarr_release(in[i]));
    free(in), free(out), free(refs);
    CHECK(gpuarr_task_destroy(t));
    return 0;
}

int main(int argc, char **argv) {
    int reps = 3, items = 32;
    bool matmul = false, wrong_ref = false;
    const char *map_devices = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--map") == 0 && i + 1 < argc) map_devices = argv[++i];
        else if (strcmp(argv[i], "--items") == 0 && i + 1 < argc) items = atoi(argv[++i]);
        else if (strcmp(argv[i], "--matmul") == 0) matmul = true;
        else if (strcmp(argv[i], "--wrong-reference") == 0) wrong_ref = true;
        else {
            fprintf(stderr, "usage: bench-offload [--reps N] | --map DEVICES [--items N] [--matmul] [--wrong-reference]\n");
            return 2;
        }
    }
    if (reps < 1 || items < 1) return 2;
    setenv("GPUARR_OPENCL_UNIFIED", "off", 0); /* PoCL as a discrete device: transfers cost */
    char dir[64] = "/tmp/bench-offload-XXXXXX";
    if (!getenv("GPUARR_CACHE_DIR")) { /* fresh models: nothing learned by an earlier run */
        if (!mkdtemp(dir)) return 1;
        setenv("GPUARR_CACHE_DIR", dir, 1);
    }
    printf("# bench-offload: GPUARR_OPENCL_UNIFIED=%s GPUARR_CACHE_DIR=%s POCL_DEVICES=%s\n", getenv("GPUARR_OPENCL_UNIFIED"),
           getenv("GPUARR_CACHE_DIR"), getenv("POCL_DEVICES") ? getenv("POCL_DEVICES") : "(unset)");
    CHECK(gpuarr_init(NULL));
    int rc = map_devices ? run_map(map_devices, items, matmul, wrong_ref) : run_regret(reps);
    gpuarr_shutdown();
    return rc;
}
