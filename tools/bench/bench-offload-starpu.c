/*
 * bench-offload-starpu.c -- the workload of tools/bench/bench-offload.c (the same saxpy and naive
 * matmul, kernels and host loops, the same sizes, the same shuffled sequence of 45 calls) under
 * StarPU's dmda scheduler, for bench/results/offload.md: one CPU worker and one OpenCL worker on
 * PoCL (run with STARPU_SCHED=dmda STARPU_NCPU=1 STARPU_NOPENCL=1 STARPU_OPENCL_ON_CPUS=1 and a
 * STARPU_HOME of its own; `make bench-offload-starpu` does). History-based performance models:
 * --calibrate passes first (STARPU_CALIBRATE=1 from the environment), then one measured pass
 * run call by call (each call waited for, data back in main memory: gpuarr_offload's semantics)
 * and one with the whole sequence submitted at once (StarPU's makespan). Not part of make test.
 */
#define _POSIX_C_SOURCE 200809L
#define CL_TARGET_OPENCL_VERSION 120
#include <starpu.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *kernels_src =
    "__kernel void saxpy(float a, __global const float *x, __global const float *y, __global float *o) {\n"
    "    size_t i = get_global_id(0);\n"
    "    o[i] = a * x[i] + y[i];\n"
    "}\n"
    "__kernel void matmul(uint n, __global const float *A, __global const float *B, __global float *C) {\n"
    "    size_t c = get_global_id(0), r = get_global_id(1);\n"
    "    float s = 0.0f;\n"
    "    for (uint k = 0; k < n; k++) s += A[r * n + k] * B[k * n + c];\n"
    "    C[r * n + c] = s;\n"
    "}\n";

static struct starpu_opencl_program programs;
static atomic_int ran_cpu, ran_ocl;

static void saxpy_cpu(void *buffers[], void *arg) {
    (void)arg;
    size_t n = STARPU_VECTOR_GET_NX(buffers[0]);
    const float *x = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]), *y = (const float *)STARPU_VECTOR_GET_PTR(buffers[1]);
    float *o = (float *)STARPU_VECTOR_GET_PTR(buffers[2]);
    for (size_t i = 0; i < n; i++) o[i] = 2.0f * x[i] + y[i];
    atomic_fetch_add(&ran_cpu, 1);
}

static void matmul_cpu(void *buffers[], void *arg) {
    int64_t n = *(const int64_t *)arg;
    const float *A = (const float *)STARPU_VECTOR_GET_PTR(buffers[0]), *B = (const float *)STARPU_VECTOR_GET_PTR(buffers[1]);
    float *C = (float *)STARPU_VECTOR_GET_PTR(buffers[2]);
    for (int64_t i = 0; i < n; i++) /* naive, i-j-k, as tools/bench/bench-offload.c */
        for (int64_t j = 0; j < n; j++) {
            float sum = 0.0f;
            for (int64_t k = 0; k < n; k++) sum += A[i * n + k] * B[k * n + j];
            C[i * n + j] = sum;
        }
    atomic_fetch_add(&ran_cpu, 1);
}

static void run_ocl(void *buffers[], const char *name, cl_uint n, size_t *global, cl_uint dims) {
    int devid = starpu_worker_get_devid(starpu_worker_get_id());
    cl_kernel k;
    cl_command_queue q;
    if (starpu_opencl_load_kernel(&k, &q, &programs, name, devid) != CL_SUCCESS) STARPU_ABORT();
    cl_mem m[3];
    for (int i = 0; i < 3; i++) m[i] = (cl_mem)STARPU_VECTOR_GET_DEV_HANDLE(buffers[i]);
    cl_float a = 2.0f;
    cl_int e = dims == 2 ? clSetKernelArg(k, 0, sizeof n, &n) : clSetKernelArg(k, 0, sizeof a, &a);
    for (cl_uint i = 0; i < 3; i++) e |= clSetKernelArg(k, 1 + i, sizeof(cl_mem), &m[i]);
    if (e == CL_SUCCESS) e = clEnqueueNDRangeKernel(q, k, dims, NULL, global, NULL, 0, NULL, NULL);
    if (e == CL_SUCCESS) e = clFinish(q);
    if (e != CL_SUCCESS) STARPU_OPENCL_REPORT_ERROR(e);
    starpu_opencl_release_kernel(k);
    atomic_fetch_add(&ran_ocl, 1);
}

static void saxpy_ocl(void *buffers[], void *arg) {
    (void)arg;
    size_t global[2] = {STARPU_VECTOR_GET_NX(buffers[0]), 0};
    run_ocl(buffers, "saxpy", 0, global, 1);
}

static void matmul_ocl(void *buffers[], void *arg) {
    int64_t n = *(const int64_t *)arg;
    size_t global[2] = {(size_t)n, (size_t)n};
    run_ocl(buffers, "matmul", (cl_uint)n, global, 2);
}

static struct starpu_perfmodel saxpy_model = {.type = STARPU_HISTORY_BASED, .symbol = "gpuarr_bench_saxpy"};
static struct starpu_perfmodel matmul_model = {.type = STARPU_HISTORY_BASED, .symbol = "gpuarr_bench_matmul"};
static struct starpu_codelet cl_saxpy = {.cpu_funcs = {saxpy_cpu}, .opencl_funcs = {saxpy_ocl}, .nbuffers = 3,
                                         .modes = {STARPU_R, STARPU_R, STARPU_W}, .model = &saxpy_model, .name = "saxpy"};
static struct starpu_codelet cl_matmul = {.cpu_funcs = {matmul_cpu}, .opencl_funcs = {matmul_ocl}, .nbuffers = 3,
                                          .modes = {STARPU_R, STARPU_R, STARPU_W}, .model = &matmul_model, .name = "matmul"};

typedef struct call {
    int matmul;
    int64_t n, count;
    float *in[2], *out;
    starpu_data_handle_t h[3];
} call;

static uint64_t rng = 0x9e3779b97f4a7c15ull; /* the same sequence as tools/bench/bench-offload.c */
static uint64_t next_rand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

static void submit(call *c) {
    for (int i = 0; i < 2; i++) starpu_vector_data_register(&c->h[i], STARPU_MAIN_RAM, (uintptr_t)c->in[i], (uint32_t)c->count, sizeof(float));
    starpu_vector_data_register(&c->h[2], STARPU_MAIN_RAM, (uintptr_t)c->out, (uint32_t)c->count, sizeof(float));
    struct starpu_task *t = starpu_task_create();
    t->cl = c->matmul ? &cl_matmul : &cl_saxpy;
    for (int i = 0; i < 3; i++) t->handles[i] = c->h[i];
    t->cl_arg = &c->n;
    t->cl_arg_size = sizeof c->n;
    if (starpu_task_submit(t) != 0) STARPU_ABORT();
}

static void finish(call *c) { /* unregistering brings the output back to main memory */
    for (int i = 0; i < 3; i++) starpu_data_unregister(c->h[i]);
}

int main(int argc, char **argv) {
    int reps = 3, calib = 4;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--calibrate") == 0 && i + 1 < argc) calib = atoi(argv[++i]);
        else return fprintf(stderr, "usage: bench-offload-starpu [--reps N] [--calibrate PASSES]\n"), 2;
    }
    if (starpu_init(NULL) != 0) return fprintf(stderr, "starpu_init failed\n"), 1;
    if (starpu_opencl_load_opencl_from_string(kernels_src, &programs, NULL) != 0) return fprintf(stderr, "OpenCL build failed\n"), 1;
    printf("# StarPU %d.%d, scheduler %s, %u CPU workers, %u OpenCL workers\n", STARPU_MAJOR_VERSION, STARPU_MINOR_VERSION,
           getenv("STARPU_SCHED") ? getenv("STARPU_SCHED") : "(default)", starpu_cpu_worker_get_count(), starpu_opencl_worker_get_count());
    static const int64_t saxpy_n[] = {256, 1024, 4096, 16384, 65536, 262144, 1 << 20, 1 << 22, 1 << 24};
    static const int64_t matmul_n[] = {16, 32, 64, 128, 256, 512};
    int ns = 9, nm = 6, n = (ns + nm) * reps, k = 0;
    call *calls = calloc((size_t)n, sizeof *calls);
    for (int r = 0; r < reps; r++) {
        for (int i = 0; i < ns; i++) calls[k].matmul = 0, calls[k++].n = saxpy_n[i];
        for (int i = 0; i < nm; i++) calls[k].matmul = 1, calls[k++].n = matmul_n[i];
    }
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(next_rand() % (uint64_t)(i + 1));
        call tmp = calls[i];
        calls[i] = calls[j], calls[j] = tmp;
    }
    for (int i = 0; i < n; i++) {
        call *c = &calls[i];
        c->count = c->matmul ? c->n * c->n : c->n;
        for (int j = 0; j < 2; j++) {
            c->in[j] = malloc(sizeof(float) * (size_t)c->count);
            for (int64_t e = 0; e < c->count; e++) c->in[j][e] = (float)(e % 97) * 0.01f;
        }
        c->out = malloc(sizeof(float) * (size_t)c->count);
    }
    for (int pass = 0; pass < calib + 2; pass++) {
        ran_cpu = ran_ocl = 0;
        double t0 = now_s();
        if (pass <= calib) { /* call by call */
            for (int i = 0; i < n; i++) {
                submit(&calls[i]);
                starpu_task_wait_for_all();
                finish(&calls[i]);
            }
        } else { /* all at once: StarPU's makespan */
            for (int i = 0; i < n; i++) submit(&calls[i]);
            starpu_task_wait_for_all();
            for (int i = 0; i < n; i++) finish(&calls[i]);
        }
        double dt = now_s() - t0;
        printf("%s pass %d: %d calls in %.3f s (%d on the CPU worker, %d on the OpenCL worker)\n",
               pass < calib ? "calibration" : pass == calib ? "measured, call by call" : "measured, all submitted at once", pass, n, dt,
               (int)ran_cpu, (int)ran_ocl);
    }
    for (int i = 0; i < n; i++) free(calls[i].in[0]), free(calls[i].in[1]), free(calls[i].out);
    free(calls);
    starpu_opencl_unload_opencl(&programs);
    starpu_shutdown();
    return 0;
}
