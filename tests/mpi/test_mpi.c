/*
 * test_mpi.c -- the MPI layer (the manual's MPI section) under mpirun, a plain C program per rank:
 *
 *   mpirun -np 4 --oversubscribe build/rel/tests/mpi/test_mpi     (make mpi-tests)
 *
 * Each rank puts its arrays on its own device: rank 0 the host, 1 opencl:0, 2 opencl:1, 3 opencl:0
 * handled as a discrete device (GPUARR_OPENCL_UNIFIED=off), with POCL_DEVICES="pthread pthread";
 * TEST_MPI_DEVICES="host,opencl:0,..." overrides the list (rank r takes item r % n; an item
 * "X/discrete" sets GPUARR_OPENCL_UNIFIED=off); make mpi-tests also runs host,cuda:0,opencl:0,cuda:1
 * on the fake CUDA driver (tests/fake_cuda). TEST_MPI_ONLY="name,name" runs only the tests named
 * (as the status lines name them; a quicker loop). MPI is started with MPI_THREAD_MULTIPLE (the
 * two-thread test is skipped, saying so, where MPI gives less). Every rank prints one status line; the exit
 * status is 0 only when every check of that rank passed. The last test has the last rank call
 * MPI_Finalize and exit before it sends: rank 0's receive from it must end in GPUARR_ERROR_TIMEOUT
 * within GPUARR_MPI_TIMEOUT_MS (2000 here), and the job must end.
 */
#define _DEFAULT_SOURCE 1
#include <mpi.h>

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GPUARR_MPI
#define GPUARR_IMPLEMENTATION
#include "gpuarr.h"

static int rank, size, failures, checks, thread_level;
static char device_spec[64];
static gpuarr_device dev;

#define CHECK(cond, ...)                                                                          \
    do {                                                                                          \
        checks++;                                                                                 \
        if (!(cond)) {                                                                            \
            failures++;                                                                           \
            fprintf(stderr, "rank %d (%s) FAILED %s:%d: %s: ", rank, device_spec, __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                                         \
            fprintf(stderr, " [last error: %s]\n", gpuarr_last_error());                         \
        }                                                                                         \
    } while (0)
#define CHECK_OK(expr) CHECK((expr) == GPUARR_OK, "%s", #expr)

static const gpuarr_dtype dtypes[] = {GPUARR_BOOL, GPUARR_I8,  GPUARR_U8,  GPUARR_I16, GPUARR_U16,
                                      GPUARR_I32,  GPUARR_U32, GPUARR_I64, GPUARR_U64, GPUARR_F16,
                                      GPUARR_BF16, GPUARR_F32, GPUARR_F64};
#define NDTYPES ((int)(sizeof dtypes / sizeof dtypes[0]))

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* An array of n elements of t on this rank's device, element i = f(i) (exact in every dtype). */
static gpuarr_array make(gpuarr_dtype t, int64_t n, double (*f)(int64_t, int), int salt) {
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = f ? f(i, salt) : 0.0;
    gpuarr_array a = {0};
    gpuarr_result r = gpuarr_empty(dev, t, 1, &n, &a);
    if (r == GPUARR_OK && n) r = gpuarr_write(a, 0, n, GPUARR_F64, v);
    CHECK(r == GPUARR_OK, "make %s[%lld]", gpuarr_dtype_name(t), (long long)n);
    free(v);
    return a;
}

static double small_int(int64_t i, int salt) { return (double)((i * 7 + salt) % 101); }
static double zero_one(int64_t i, int salt) { return (double)((i + salt) % 2); }

/* Elements [first, first + n) of a equal f(i - shift, salt), the others zero. */
static void expect(gpuarr_array a, int64_t first, int64_t n, int64_t shift, double (*f)(int64_t, int), int salt,
                   const char *what) {
    gpuarr_array_info info;
    CHECK_OK(gpuarr_array_get_info(a, &info));
    double *v = malloc((size_t)(info.count ? info.count : 1) * sizeof *v);
    CHECK_OK(gpuarr_read(a, 0, info.count, GPUARR_F64, v));
    int bad = 0;
    for (int64_t i = 0; i < info.count && bad < 3; i++) {
        double want = i >= first && i < first + n ? f(i - shift, salt) : 0.0;
        if (v[i] != want) {
            bad++;
            CHECK(v[i] == want, "%s: element %lld is %g, expected %g", what, (long long)i, v[i], want);
        }
    }
    free(v);
}

static int right(void) { return (rank + 1) % size; }
static int left(void) { return (rank + size - 1) % size; }

/* ---- native work recorded with gpuarr_array_record_stream, then sent ----------------------
   The rank's own work writes its array through the device's native API (loaded with dlopen:
   this test links neither OpenCL nor CUDA), and cannot finish at once: OpenCL, a fill waiting
   for a user event that a thread completes after 150 ms (a host rank: opencl:0 fills a buffer
   and reads it into the host array); CUDA on tests/fake_cuda, a cuMemsetD32Async, which runs only
   when the host waits for the stream. The send must carry what that work wrote. */
#define NATIVE_N 4096
#define NATIVE_VALUE 7.5f
typedef struct native_cl {
    void *lib;
    void *(*create_user_event)(void *ctx, int *err);
    int (*set_user_event_status)(void *ev, int status);
    int (*fill)(void *q, void *mem, const void *pattern, size_t pattern_size, size_t offset, size_t size, unsigned n,
                void *const *wait, void **ev);
    void *(*create_buffer)(void *ctx, uint64_t flags, size_t size, void *host, int *err);
    int (*read)(void *q, void *mem, unsigned blocking, size_t offset, size_t size, void *ptr, unsigned n, void *const *wait,
                void **ev);
    int (*flush)(void *q);
    int (*release_event)(void *ev);
    int (*release_mem)(void *mem);
    void *gate;
} native_cl;

static void *native_open_gate(void *arg) {
    native_cl *cl = (native_cl *)arg;
    struct timespec t = {0, 150 * 1000000L};
    nanosleep(&t, NULL);
    cl->set_user_event_status(cl->gate, 0 /* CL_COMPLETE */);
    return NULL;
}

static bool native_cl_load(native_cl *cl) {
    cl->lib = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cl->lib) return false;
    *(void **)&cl->create_user_event = dlsym(cl->lib, "clCreateUserEvent");
    *(void **)&cl->set_user_event_status = dlsym(cl->lib, "clSetUserEventStatus");
    *(void **)&cl->fill = dlsym(cl->lib, "clEnqueueFillBuffer");
    *(void **)&cl->create_buffer = dlsym(cl->lib, "clCreateBuffer");
    *(void **)&cl->read = dlsym(cl->lib, "clEnqueueReadBuffer");
    *(void **)&cl->flush = dlsym(cl->lib, "clFlush");
    *(void **)&cl->release_event = dlsym(cl->lib, "clReleaseEvent");
    *(void **)&cl->release_mem = dlsym(cl->lib, "clReleaseMemObject");
    return cl->create_user_event && cl->set_user_event_status && cl->fill && cl->create_buffer && cl->read && cl->flush &&
           cl->release_event && cl->release_mem;
}

/* Queues the gated native write of NATIVE_VALUE into a on a stream of its own (returned), and
   records it. false: this rank has no native API to test with (said why). */
static bool native_write(gpuarr_array a, gpuarr_stream *s, native_cl *cl, pthread_t *opener) {
    gpuarr_device_info info;
    CHECK_OK(gpuarr_device_get_info(dev, &info));
    size_t bytes = NATIVE_N * sizeof(float);
    float value = NATIVE_VALUE;
    if (info.backend == GPUARR_BACKEND_CUDA) {
        const char *name = getenv("GPUARR_CUDA_LIBRARY");
        void *driver = dlopen(name ? name : "libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        int (*memset_d32)(unsigned long long, unsigned int, size_t, void *) = NULL;
        if (driver) *(void **)&memset_d32 = dlsym(driver, "cuMemsetD32Async");
        struct CUstream_st *stream = NULL;
        void *p = NULL;
        unsigned int bits;
        memcpy(&bits, &value, sizeof bits);
        CHECK_OK(gpuarr_stream_create(dev, 0, s));
        CHECK_OK(gpuarr_cuda_stream(*s, &stream));
        CHECK_OK(gpuarr_cuda_ptr(a, &p));
        CHECK_OK(gpuarr_set_current_device(dev));
        CHECK(memset_d32 && memset_d32((unsigned long long)(uintptr_t)p, bits, NATIVE_N, stream) == 0, "cuMemsetD32Async");
        if (driver) dlclose(driver);
    } else {
        gpuarr_device qdev = dev;
        if (info.backend == GPUARR_BACKEND_HOST && gpuarr_device_find("opencl:0", &qdev) != GPUARR_OK) return false;
        if (!native_cl_load(cl)) return false;
        void *ctx = NULL, *q = NULL, *mem = NULL, *host = NULL, *done = NULL;
        size_t offset = 0;
        int err = 0;
        CHECK_OK(gpuarr_stream_create(qdev, 0, s));
        CHECK_OK(gpuarr_opencl_context_raw(qdev, &ctx));
        CHECK_OK(gpuarr_opencl_queue_raw(*s, &q));
        cl->gate = cl->create_user_event(ctx, &err);
        CHECK(err == 0, "clCreateUserEvent: %d", err);
        if (info.backend == GPUARR_BACKEND_HOST) {
            CHECK_OK(gpuarr_host_data(a, &host));
            mem = cl->create_buffer(ctx, 1 /* CL_MEM_READ_WRITE */, bytes, NULL, &err);
            CHECK(err == 0, "clCreateBuffer: %d", err);
        } else {
            CHECK_OK(gpuarr_opencl_mem_raw(a, &mem, &offset));
        }
        CHECK(cl->fill(q, mem, &value, sizeof value, offset, bytes, 1, &cl->gate, NULL) == 0, "clEnqueueFillBuffer");
        if (host) {
            CHECK(cl->read(q, mem, 0, 0, bytes, host, 0, NULL, &done) == 0, "clEnqueueReadBuffer");
            cl->release_event(done);
            cl->release_mem(mem); /* released once the read is done */
        }
        cl->flush(q);
        CHECK(pthread_create(opener, NULL, native_open_gate, cl) == 0, "pthread_create");
    }
    CHECK_OK(gpuarr_array_record_stream(a, *s));
    return true;
}

static void test_native_send(void) {
    gpuarr_array out = make(GPUARR_F32, NATIVE_N, NULL, 0), in = make(GPUARR_F32, NATIVE_N, NULL, 0);
    gpuarr_stream s = {0};
    native_cl cl;
    memset(&cl, 0, sizeof cl);
    pthread_t opener;
    bool native = native_write(out, &s, &cl, &opener);
    if (!native) printf("rank %d (%s): native_send: no native queue here (no opencl:0 or libOpenCL.so.1); sends zeros\n", rank, device_spec);
    CHECK_OK(gpuarr_mpi_sendrecv(out, 0, -1, right(), 50, in, 0, -1, 0, left(), 50, MPI_COMM_WORLD));
    int native_left = 0, native_here = native;
    MPI_Sendrecv(&native_here, 1, MPI_INT, right(), 51, &native_left, 1, MPI_INT, left(), 51, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    float *v = malloc(NATIVE_N * sizeof *v);
    CHECK_OK(gpuarr_read(in, 0, NATIVE_N, GPUARR_F32, v));
    int wrong = 0;
    for (int i = 0; i < NATIVE_N; i++) wrong += v[i] != (native_left ? NATIVE_VALUE : 0.0f);
    CHECK(wrong == 0, "rank %d's native work recorded on its array, then gpuarr_mpi_send: %d of %d elements received are not "
          "what that work wrote (element 0 is %g)", left(), wrong, NATIVE_N, (double)v[0]);
    free(v);
    if (cl.gate) {
        pthread_join(opener, NULL);
        cl.release_event(cl.gate);
    }
    if (s.id) {
        CHECK_OK(gpuarr_stream_sync(s));
        CHECK_OK(gpuarr_stream_destroy(s));
    }
    if (cl.lib) dlclose(cl.lib);
    gpuarr_release(out);
    gpuarr_release(in);
}

/* Every dtype pair: the ring sends dtype s, every rank receives into dtype r. */
static void test_dtype_pairs(void) {
    for (int si = 0; si < NDTYPES; si++)
        for (int ri = 0; ri < NDTYPES; ri++) {
            gpuarr_dtype s = dtypes[si], r = dtypes[ri];
            double (*f)(int64_t, int) = s == GPUARR_BOOL || r == GPUARR_BOOL ? zero_one : small_int;
            int64_t n = 257;
            gpuarr_array out = make(s, n, f, left()), in = make(r, n, NULL, 0);
            /* the receiver checks what its left neighbour sent: salt = the sender's rank */
            int tag = si * NDTYPES + ri;
            CHECK(gpuarr_mpi_sendrecv(out, 0, -1, right(), tag, in, 0, -1, s, left(), tag, MPI_COMM_WORLD) == GPUARR_OK,
                  "sendrecv %s -> %s", gpuarr_dtype_name(s), gpuarr_dtype_name(r));
            char what[64];
            snprintf(what, sizeof what, "%s -> %s", gpuarr_dtype_name(s), gpuarr_dtype_name(r));
            expect(in, 0, n, 0, f, (rank + size - 2) % size, what);
            gpuarr_release(out);
            gpuarr_release(in);
        }
}

/* Elements [10, 60) of 100 go to [5, 55) of the receiver's 80; count -1 = to the end. */
static void test_ranges(void) {
    setenv("GPUARR_MPI_TIMEOUT_MS", "-1", 1); /* forever: accepted */
    gpuarr_array out = make(GPUARR_I32, 100, small_int, 3), in = make(GPUARR_F32, 80, NULL, 0);
    CHECK_OK(gpuarr_mpi_sendrecv(out, 10, 50, right(), 500, in, 5, 50, GPUARR_I32, left(), 500, MPI_COMM_WORLD));
    expect(in, 5, 50, 5 - 10, small_int, 3, "range [10, 60) -> [5, 55)");
    gpuarr_array in2 = make(GPUARR_I64, 30, NULL, 0);
    CHECK_OK(gpuarr_mpi_sendrecv(out, 80, -1, right(), 501, in2, 10, -1, GPUARR_I32, left(), 501, MPI_COMM_WORLD));
    expect(in2, 10, 20, 10 - 80, small_int, 3, "range [80, end) -> [10, end)");
    CHECK_OK(gpuarr_mpi_sendrecv(out, 5, 0, right(), 502, in2, 3, 0, GPUARR_I32, left(), 502, MPI_COMM_WORLD));
    expect(in2, 10, 20, 10 - 80, small_int, 3, "an empty range changes nothing");
    /* one array, as in a halo exchange: elements [0, 40) go out, [60, 100) come in */
    gpuarr_array field = make(GPUARR_F32, 100, small_int, 4);
    CHECK_OK(gpuarr_mpi_sendrecv(field, 0, 40, right(), 503, field, 60, 40, GPUARR_F32, left(), 503, MPI_COMM_WORLD));
    double got[100];
    CHECK_OK(gpuarr_read(field, 0, 100, GPUARR_F64, got));
    int bad = 0;
    for (int i = 0; i < 100; i++) bad += got[i] != small_int(i < 60 ? i : i - 60, 4);
    CHECK(bad == 0, "send and receive in one array: %d elements wrong", bad);
    gpuarr_release(field);
    gpuarr_release(out);
    gpuarr_release(in);
    gpuarr_release(in2);
    setenv("GPUARR_MPI_TIMEOUT_MS", "60000", 1);
}

/* A message of many chunks (GPUARR_MPI_CHUNK small), with and without conversion, and two in
   flight at once on one peer and tag: they arrive whole and in order. */
static void test_chunks(void) {
    /* 250 or 602 f32 per chunk, not divisors of the count; neighbours differ: the sender's counts */
    setenv("GPUARR_MPI_CHUNK", rank % 2 ? "1000" : "2408", 1);
    int64_t n = 100003;
    gpuarr_array a = make(GPUARR_F32, n, small_int, 11), b = make(GPUARR_F32, n, small_int, 12);
    gpuarr_array ra = make(GPUARR_F64, n, NULL, 0), rb = make(GPUARR_F32, n, NULL, 0);
    gpuarr_mpi_request q[4] = {{0}, {0}, {0}, {0}};
    CHECK_OK(gpuarr_mpi_irecv(ra, 0, -1, GPUARR_F32, left(), 7, MPI_COMM_WORLD, &q[0]));
    CHECK_OK(gpuarr_mpi_irecv(rb, 0, -1, GPUARR_F32, left(), 7, MPI_COMM_WORLD, &q[1]));
    CHECK_OK(gpuarr_mpi_isend(a, 0, -1, right(), 7, MPI_COMM_WORLD, &q[2]));
    CHECK_OK(gpuarr_mpi_isend(b, 0, -1, right(), 7, MPI_COMM_WORLD, &q[3]));
    CHECK(q[0].id && q[1].id && q[2].id && q[3].id, "requests are not {0}");
    for (int i = 0; i < 4; i++) {
        CHECK_OK(gpuarr_mpi_wait(&q[i]));
        CHECK(q[i].id == 0, "wait sets *req to {0}");
    }
    expect(ra, 0, n, 0, small_int, 11, "first of two chunked messages, f32 -> f64");
    expect(rb, 0, n, 0, small_int, 12, "second of two chunked messages, f32");
    CHECK_OK(gpuarr_mpi_wait(&q[0])); /* {0}: nothing to wait for */
    unsetenv("GPUARR_MPI_CHUNK");
    gpuarr_release(a);
    gpuarr_release(b);
    gpuarr_release(ra);
    gpuarr_release(rb);
}

/* Host arrays with no cast go to MPI directly; other transfers take two chunk-sized buffers
   from the device's pinned pool (the host's own pool for the host). */
static void test_staging(void) {
    setenv("GPUARR_MPI_CHUNK", "4K", 1);
    int64_t n = 10000; /* 40000 bytes of f32: 10 chunks of 1024 elements */
    gpuarr_array out = make(GPUARR_F32, n, small_int, 2), in = make(GPUARR_F32, n, NULL, 0);
    gpuarr_array in64 = make(GPUARR_F64, n, NULL, 0);
    bool host = dev.id == gpuarr_host().id;
    gpuarr_pool_stats s0, s1, s2;
    gpuarr_result (*stats)(gpuarr_device, gpuarr_pool_stats *) = host ? gpuarr_pool_get_stats : gpuarr_pool_get_pinned_stats;
    CHECK_OK(stats(dev, &s0));
    CHECK_OK(gpuarr_mpi_sendrecv(out, 0, -1, right(), 40, in, 0, -1, 0, left(), 40, MPI_COMM_WORLD));
    CHECK_OK(stats(dev, &s1));
    CHECK_OK(gpuarr_mpi_sendrecv(out, 0, -1, right(), 41, in64, 0, -1, GPUARR_F32, left(), 41, MPI_COMM_WORLD));
    CHECK_OK(stats(dev, &s2));
    expect(in, 0, n, 0, small_int, 2, "staging test, f32");
    expect(in64, 0, n, 0, small_int, 2, "staging test, f32 -> f64");
    uint64_t b1 = s1.total_allocations - s0.total_allocations, b2 = s2.total_allocations - s1.total_allocations;
    uint64_t r1 = s1.total_requested_bytes - s0.total_requested_bytes, r2 = s2.total_requested_bytes - s1.total_requested_bytes;
    if (host) {
        CHECK(b1 == 0, "host, no cast: no staging buffer (%llu taken)", (unsigned long long)b1);
        CHECK(b2 == 2 && r2 == 2 * 4096, "host, a cast on receipt: 2 buffers of 4096 bytes (%llu, %llu bytes)",
              (unsigned long long)b2, (unsigned long long)r2);
    } else {
        CHECK(b1 == 4 && r1 == 4 * 4096, "device: 2 pinned buffers of 4096 bytes each way (%llu, %llu bytes)",
              (unsigned long long)b1, (unsigned long long)r1);
        CHECK(b2 == 4 && r2 == 4 * 4096, "device, a cast on receipt: the same (%llu, %llu bytes)", (unsigned long long)b2,
              (unsigned long long)r2);
    }
    unsetenv("GPUARR_MPI_CHUNK");
    gpuarr_release(out);
    gpuarr_release(in);
    gpuarr_release(in64);
}

/* Wildcards in receives; a ring waited for sends first. */
static void test_any_and_order(void) {
    gpuarr_array out = make(GPUARR_U16, 64, small_int, 8), in = make(GPUARR_I32, 64, NULL, 0);
    gpuarr_mpi_request rq = {0}, sq = {0};
    CHECK_OK(gpuarr_mpi_irecv(in, 0, -1, GPUARR_U16, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &rq));
    CHECK_OK(gpuarr_mpi_isend(out, 0, -1, right(), 300 + rank, MPI_COMM_WORLD, &sq));
    CHECK_OK(gpuarr_mpi_wait(&sq));
    CHECK_OK(gpuarr_mpi_wait(&rq));
    expect(in, 0, 64, 0, small_int, 8, "MPI_ANY_SOURCE, MPI_ANY_TAG");
    gpuarr_release(out);
    gpuarr_release(in);
}

/* gpuarr_mpi_device: the node-local rank within the comm given, then "local:R". mpirun puts every
   rank on this node, so on MPI_COMM_WORLD R is the rank and agrees with the launcher's variable
   ("local"); in a comm of every other rank R is rank / 2. With only PoCL's two devices (no CUDA)
   local rank R gets opencl:(R % 2). */
static void test_device(void) {
    gpuarr_device d = {0}, want = {0};
    char spec[32];
    CHECK_OK(gpuarr_mpi_device(MPI_COMM_WORLD, &d));
    CHECK_OK(gpuarr_device_find("local", &want));
    CHECK(d.id == want.id, "gpuarr_mpi_device(MPI_COMM_WORLD) and \"local\" agree");
    snprintf(spec, sizeof spec, "local:%d", rank);
    CHECK(gpuarr_device_find(spec, &want) == GPUARR_OK && d.id == want.id, "MPI_COMM_WORLD: %s", spec);
    gpuarr_device_info info;
    char pocl[32];
    snprintf(pocl, sizeof pocl, "opencl:%d", rank % 2);
    if (gpuarr_device_count() == 3)
        CHECK(gpuarr_device_get_info(d, &info) == GPUARR_OK && strcmp(info.spec, pocl) == 0, "rank %d got %s, expected %s",
              rank, info.spec, pocl);
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
    CHECK_OK(gpuarr_mpi_device(half, &d));
    snprintf(spec, sizeof spec, "local:%d", rank / 2);
    CHECK(gpuarr_device_find(spec, &want) == GPUARR_OK && d.id == want.id, "in a comm of every other rank: %s", spec);
    MPI_Comm_free(&half);
    CHECK(gpuarr_mpi_device(MPI_COMM_NULL, &d) == GPUARR_ERROR_INVALID_ARGUMENT, "MPI_COMM_NULL");
    CHECK(gpuarr_mpi_device(MPI_COMM_WORLD, NULL) == GPUARR_ERROR_INVALID_ARGUMENT, "out NULL");
}

/* Random transfers, the same sequence on every rank (a seed they share, TEST_MPI_SEED or 1):
   dtype pairs, ranges in larger arrays, chunk sizes, blocking or not, waits in either order. */
static uint64_t next_random(uint64_t *state) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return *state >> 33;
}

static void test_random(void) {
    const char *env = getenv("TEST_MPI_SEED");
    uint64_t state = env && *env ? strtoull(env, NULL, 10) : 1;
    if (rank == 0) printf("rank 0: test_random seed %llu (TEST_MPI_SEED)\n", (unsigned long long)state);
    for (int round = 0; round < 40; round++) {
        gpuarr_dtype s = dtypes[next_random(&state) % NDTYPES], r = dtypes[next_random(&state) % NDTYPES];
        int64_t n = (int64_t)(next_random(&state) % 3000), fs = (int64_t)(next_random(&state) % 50),
                fr = (int64_t)(next_random(&state) % 50), extra = (int64_t)(next_random(&state) % 3);
        char chunk[32];
        snprintf(chunk, sizeof chunk, "%llu", (unsigned long long)(256 + next_random(&state) % 4096));
        int how = (int)(next_random(&state) % 3);
        setenv("GPUARR_MPI_CHUNK", chunk, 1);
        double (*f)(int64_t, int) = s == GPUARR_BOOL || r == GPUARR_BOOL ? zero_one : small_int;
        /* the sender's values start at fs: its element fs + i is f(fs + i); the receiver's fr + i gets it */
        gpuarr_array out = make(s, fs + n + extra, f, round), in = make(r, fr + n + extra, NULL, 0);
        int64_t count = extra == 0 ? -1 : n; /* -1: to the end, which is n when nothing follows */
        int tag = 1000 + round;
        if (how == 0) {
            CHECK_OK(gpuarr_mpi_sendrecv(out, fs, count, right(), tag, in, fr, count, s, left(), tag, MPI_COMM_WORLD));
        } else {
            gpuarr_mpi_request rq = {0}, sq = {0};
            CHECK_OK(gpuarr_mpi_irecv(in, fr, count, s, left(), tag, MPI_COMM_WORLD, &rq));
            CHECK_OK(gpuarr_mpi_isend(out, fs, count, right(), tag, MPI_COMM_WORLD, &sq));
            CHECK_OK(gpuarr_mpi_wait(how == 1 ? &rq : &sq));
            CHECK_OK(gpuarr_mpi_wait(how == 1 ? &sq : &rq));
        }
        char what[96];
        snprintf(what, sizeof what, "round %d: %s -> %s, %lld elements, chunk %s, mode %d", round, gpuarr_dtype_name(s),
                 gpuarr_dtype_name(r), (long long)n, chunk, how);
        expect(in, fr, n, fr - fs, f, round, what);
        gpuarr_release(out);
        gpuarr_release(in);
    }
    unsetenv("GPUARR_MPI_CHUNK");
}

/* GPUARR_MPI_TIMEOUT_MS bounds standing still, not the whole transfer: 8192 chunks of 256 bytes
   take longer than the limit (1000 ms; TEST_MPI_SLOW_TIMEOUT_MS, which the ASan job raises, its
   transfers being slower too) where a PoCL rank copies each (about 60 us a copy here), and
   succeed. */
static void test_slow_but_moving(void) {
    const char *limit = getenv("TEST_MPI_SLOW_TIMEOUT_MS");
    if (!limit || !*limit) limit = "1000";
    setenv("GPUARR_MPI_TIMEOUT_MS", limit, 1);
    setenv("GPUARR_MPI_CHUNK", "256", 1);
    int64_t n = 524288;
    gpuarr_array out = make(GPUARR_F32, n, small_int, 9), in = make(GPUARR_F32, n, NULL, 0);
    double t0 = seconds();
    CHECK_OK(gpuarr_mpi_sendrecv(out, 0, -1, right(), 600, in, 0, -1, 0, left(), 600, MPI_COMM_WORLD));
    double dt = seconds() - t0;
    expect(in, 0, n, 0, small_int, 9, "8192 chunks");
    printf("rank %d (%s): 8192 chunks each way in %.2f s, GPUARR_MPI_TIMEOUT_MS=%s\n", rank, device_spec, dt, limit);
    unsetenv("GPUARR_MPI_CHUNK");
    setenv("GPUARR_MPI_TIMEOUT_MS", "60000", 1);
    gpuarr_release(out);
    gpuarr_release(in);
}

static void test_proc_null(void) {
    gpuarr_array a = make(GPUARR_I16, 10, small_int, 1);
    CHECK_OK(gpuarr_mpi_send(a, 0, -1, MPI_PROC_NULL, 1, MPI_COMM_WORLD));
    CHECK_OK(gpuarr_mpi_recv(a, 0, -1, GPUARR_F64, MPI_PROC_NULL, 1, MPI_COMM_WORLD));
    expect(a, 0, 10, 0, small_int, 1, "a receive from MPI_PROC_NULL leaves the array");
    gpuarr_mpi_request q = {0};
    CHECK_OK(gpuarr_mpi_isend(a, 0, -1, MPI_PROC_NULL, 1, MPI_COMM_WORLD, &q));
    CHECK(q.id != 0, "a request even for MPI_PROC_NULL");
    CHECK_OK(gpuarr_mpi_wait(&q));
    gpuarr_release(a);
}

/* The caller may release an array while a transfer of it is pending: the transfer holds its own
   reference, and a release of the array too many is refused as for any stale handle, not taken
   from the transfer (the fuzzer's soak found that it was). */
static void test_release_pending(void) {
    int64_t n = 1000;
    gpuarr_array out = make(GPUARR_I32, n, small_int, rank), in = make(GPUARR_I32, n, NULL, 0), view = {0};
    CHECK_OK(gpuarr_reshape(in, 1, &n, &view)); /* the received elements, read after in is gone */
    gpuarr_mpi_request rq = {0}, sq = {0};
    CHECK_OK(gpuarr_mpi_irecv(in, 0, -1, 0, left(), 600, MPI_COMM_WORLD, &rq));
    CHECK_OK(gpuarr_mpi_isend(out, 0, -1, right(), 600, MPI_COMM_WORLD, &sq));
    CHECK_OK(gpuarr_release(in));
    CHECK_OK(gpuarr_release(out));
    CHECK(gpuarr_release(in) == GPUARR_ERROR_INVALID_HANDLE, "a release too many of an array being received into");
    CHECK(gpuarr_release(out) == GPUARR_ERROR_INVALID_HANDLE, "a release too many of an array being sent");
    CHECK_OK(gpuarr_mpi_wait(&rq));
    CHECK_OK(gpuarr_mpi_wait(&sq));
    expect(view, 0, n, 0, small_int, left(), "received into an array released while pending (read through its view)");
    gpuarr_release(view);
}

static double rank_value(int64_t i, int r) { return (double)(r + 1 + i % 5); }

static void test_allreduce(void) {
    double sum_ranks = 0;
    for (int r = 0; r < size; r++) sum_ranks += r + 1;
    for (int di = 0; di < NDTYPES; di++) {
        gpuarr_dtype t = dtypes[di];
        int64_t n = 50;
        double *v = malloc((size_t)n * sizeof *v);
        for (int op = 0; op < GPUARR_MPI_OP_COUNT; op++) {
            gpuarr_array a = t == GPUARR_BOOL ? make(t, n, zero_one, rank) : make(t, n, rank_value, rank);
            CHECK(gpuarr_mpi_allreduce(a, (gpuarr_mpi_op)op, MPI_COMM_WORLD) == GPUARR_OK, "allreduce %s op %d",
                  gpuarr_dtype_name(t), op);
            CHECK_OK(gpuarr_read(a, 0, n, GPUARR_F64, v));
            for (int64_t i = 0; i < n; i++) {
                double want;
                if (t == GPUARR_BOOL) { /* ranks alternate 0/1 at each i: any = 1, all = 0 */
                    want = op == GPUARR_MPI_MIN ? 0.0 : 1.0;
                } else {
                    want = op == GPUARR_MPI_SUM ? sum_ranks + (double)size * (double)(i % 5)
                           : op == GPUARR_MPI_MIN ? 1.0 + (double)(i % 5)
                                                  : (double)size + (double)(i % 5);
                }
                if (v[i] != want) {
                    CHECK(v[i] == want, "allreduce %s op %d element %lld: %g, expected %g", gpuarr_dtype_name(t), op,
                          (long long)i, v[i], want);
                    break;
                }
            }
            gpuarr_release(a);
        }
        free(v);
    }
    /* integer sums wrap as the dtype does: 4 x 200 in u8 = 800 mod 256 = 32; 4 x 100 in i8 = -112 */
    gpuarr_array u = make(GPUARR_U8, 3, NULL, 0), s = make(GPUARR_I8, 3, NULL, 0);
    uint8_t u200 = 200;
    int8_t s100 = 100;
    CHECK_OK(gpuarr_fill(u, u200));
    CHECK_OK(gpuarr_fill(s, s100));
    CHECK_OK(gpuarr_mpi_allreduce(u, GPUARR_MPI_SUM, MPI_COMM_WORLD));
    CHECK_OK(gpuarr_mpi_allreduce(s, GPUARR_MPI_SUM, MPI_COMM_WORLD));
    uint8_t ub[3];
    int8_t sb[3];
    CHECK_OK(gpuarr_to_host(u, ub, 3));
    CHECK_OK(gpuarr_to_host(s, sb, 3));
    CHECK(ub[0] == (uint8_t)(200 * size) && ub[2] == (uint8_t)(200 * size), "u8 sum wraps: %d", ub[0]);
    CHECK(sb[1] == (int8_t)(uint8_t)(100 * size), "i8 sum wraps: %d", sb[1]);
    gpuarr_release(u);
    gpuarr_release(s);
}

static bool has(const char *text, const char *part) { return strstr(text, part) != NULL; }

/* Wrong input: a specific result and a message, and the traffic after it still right. */
static void test_bad_input(void) {
    gpuarr_array a = make(GPUARR_I32, 10, small_int, 5), forged = {12345};
    gpuarr_mpi_request q = {0};
    CHECK(gpuarr_mpi_send(forged, 0, -1, right(), 1, MPI_COMM_WORLD) == GPUARR_ERROR_INVALID_HANDLE, "forged array");
    CHECK(has(gpuarr_last_error(), "gpuarr_mpi_send"), "message names the call: %s", gpuarr_last_error());
    CHECK(gpuarr_mpi_send(a, 5, 6, right(), 1, MPI_COMM_WORLD) == GPUARR_ERROR_INVALID_ARGUMENT, "range past the end");
    CHECK(has(gpuarr_last_error(), "[5, 11)"), "message gives the range: %s", gpuarr_last_error());
    /* first + count past INT64_MAX: refused, and the message says it without overflowing (UBSan) */
    CHECK(gpuarr_mpi_send(a, 5, INT64_MAX, right(), 1, MPI_COMM_WORLD) == GPUARR_ERROR_INVALID_ARGUMENT, "count INT64_MAX");
    CHECK(has(gpuarr_last_error(), "[5, 5 + 9223372036854775807)"), "message gives the range: %s", gpuarr_last_error());
    CHECK(gpuarr_mpi_recv(a, -1, 2, GPUARR_I32, left(), 1, MPI_COMM_WORLD) == GPUARR_ERROR_INVALID_ARGUMENT, "first < 0");
    CHECK(gpuarr_mpi_recv(a, 0, -2, GPUARR_I32, left(), 1, MPI_COMM_WORLD) == GPUARR_ERROR_INVALID_ARGUMENT, "count < -1");
    CHECK(gpuarr_mpi_recv(a, 0, -1, (gpuarr_dtype)99, left(), 1, MPI_COMM_WORLD) == GPUARR_ERROR_INVALID_ARGUMENT, "sent 99");
    CHECK(gpuarr_mpi_send(a, 0, -1, size, 1, MPI_COMM_WORLD) == GPUARR_ERROR_INVALID_ARGUMENT, "dest = size");
    CHECK(has(gpuarr_last_error(), "not a rank"), "%s", gpuarr_last_error());
    CHECK(gpuarr_mpi_send(a, 0, -1, right(), -3, MPI_COMM_WORLD) == GPUARR_ERROR_INVALID_ARGUMENT, "tag -3");
    CHECK(gpuarr_mpi_send(a, 0, -1, right(), 1, MPI_COMM_NULL) == GPUARR_ERROR_INVALID_ARGUMENT, "MPI_COMM_NULL");
    CHECK(gpuarr_mpi_isend(a, 0, -1, right(), 1, MPI_COMM_WORLD, NULL) == GPUARR_ERROR_INVALID_ARGUMENT, "NULL request");
    CHECK(gpuarr_mpi_irecv(a, 0, -1, 0, left(), 1, MPI_COMM_WORLD, NULL) == GPUARR_ERROR_INVALID_ARGUMENT, "NULL request");
    CHECK(gpuarr_mpi_wait(NULL) == GPUARR_ERROR_INVALID_ARGUMENT, "wait(NULL)");
    q.id = 0x00420007u;
    CHECK(gpuarr_mpi_wait(&q) == GPUARR_ERROR_INVALID_HANDLE, "forged request");
    CHECK(gpuarr_mpi_allreduce(a, GPUARR_MPI_OP_COUNT, MPI_COMM_WORLD) == GPUARR_ERROR_INVALID_ARGUMENT, "bad op");
    { /* a read-only array (a read-only DLPack import): nothing may be received into it */
        DLManagedTensorVersioned *m = NULL;
        gpuarr_array ro = {0};
        CHECK(gpuarr_to_dlpack(a, GPUARR_DLPACK_READ_ONLY, &m) == GPUARR_OK && gpuarr_from_dlpack(m, &ro) == GPUARR_OK,
              "a read-only import: %s", gpuarr_last_error());
        CHECK(gpuarr_mpi_allreduce(ro, GPUARR_MPI_SUM, MPI_COMM_WORLD) == GPUARR_ERROR_INVALID_ARGUMENT &&
                  has(gpuarr_last_error(), "gpuarr_mpi_allreduce: a is read-only"),
              "allreduce into a read-only array: %s", gpuarr_last_error());
        CHECK(gpuarr_mpi_recv(ro, 0, -1, 0, left(), 1, MPI_COMM_WORLD) == GPUARR_ERROR_INVALID_ARGUMENT &&
                  has(gpuarr_last_error(), "gpuarr_mpi_recv: a is read-only"),
              "receive into a read-only array: %s", gpuarr_last_error());
        if (ro.id) gpuarr_release(ro);
    }
    setenv("GPUARR_MPI_CHUNK", "lots", 1);
    CHECK(gpuarr_mpi_send(a, 0, -1, right(), 1, MPI_COMM_WORLD) == GPUARR_ERROR_INVALID_ARGUMENT, "bad GPUARR_MPI_CHUNK");
    CHECK(has(gpuarr_last_error(), "GPUARR_MPI_CHUNK"), "%s", gpuarr_last_error());
    unsetenv("GPUARR_MPI_CHUNK");
    setenv("GPUARR_MPI_TIMEOUT_MS", "soon", 1);
    CHECK(gpuarr_mpi_send(a, 0, -1, MPI_PROC_NULL, 1, MPI_COMM_WORLD) == GPUARR_ERROR_INVALID_ARGUMENT, "bad timeout");
    CHECK(has(gpuarr_last_error(), "GPUARR_MPI_TIMEOUT_MS"), "%s", gpuarr_last_error());
    unsetenv("GPUARR_MPI_TIMEOUT_MS");
    setenv("GPUARR_MPI_CUDA_AWARE", "maybe", 1);
    CHECK(gpuarr_mpi_send(a, 0, -1, right(), 1, MPI_COMM_WORLD) == GPUARR_ERROR_INVALID_ARGUMENT, "bad GPUARR_MPI_CUDA_AWARE");
    CHECK(has(gpuarr_last_error(), "GPUARR_MPI_CUDA_AWARE"), "%s", gpuarr_last_error());
    unsetenv("GPUARR_MPI_CUDA_AWARE");
    /* every GPUARR_MPI_* variable is read when the transfer is made: a malformed timeout fails
       isend and irecv before they post anything (the peer sees nothing: the message below is intact) */
    setenv("GPUARR_MPI_TIMEOUT_MS", "soon", 1);
    q.id = 0;
    CHECK(gpuarr_mpi_isend(a, 0, 10, right(), 9, MPI_COMM_WORLD, &q) == GPUARR_ERROR_INVALID_ARGUMENT && q.id == 0,
          "isend with a bad timeout");
    CHECK(has(gpuarr_last_error(), "GPUARR_MPI_TIMEOUT_MS = \"soon\""), "%s", gpuarr_last_error());
    CHECK(gpuarr_mpi_irecv(a, 0, 10, 0, left(), 9, MPI_COMM_WORLD, &q) == GPUARR_ERROR_INVALID_ARGUMENT && q.id == 0,
          "irecv with a bad timeout");
    unsetenv("GPUARR_MPI_TIMEOUT_MS");
    q.id = 0;
    /* a tag above MPI_TAG_UB, a source outside comm: refused before anything is sent */
    void *ub = NULL;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    int tag_ub = flag ? *(int *)ub : 32767;
    if (tag_ub < INT32_MAX) { /* Open MPI's is INT_MAX: no int above it */
        CHECK(gpuarr_mpi_send(a, 0, -1, right(), tag_ub + 1, MPI_COMM_WORLD) == GPUARR_ERROR_INVALID_ARGUMENT, "tag MPI_TAG_UB + 1");
        CHECK(has(gpuarr_last_error(), "(MPI_TAG_UB)"), "%s", gpuarr_last_error());
    }
    CHECK(gpuarr_mpi_recv(a, 0, -1, 0, size, 9, MPI_COMM_WORLD) == GPUARR_ERROR_INVALID_ARGUMENT, "source = size");
    CHECK(has(gpuarr_last_error(), "source = "), "%s", gpuarr_last_error());
    CHECK(gpuarr_mpi_recv(a, 0, -1, 0, -7, 9, MPI_COMM_WORLD) == GPUARR_ERROR_INVALID_ARGUMENT, "source = -7");
    /* GPUARR_MPI_CHUNK: from 8 bytes to 1 GiB, K/M/G suffixes */
    const char *bad_chunks[] = {"7", "2G", "1025M", "0"}, *good_chunks[] = {"8", "1G", "1024M", "64K"};
    for (int i = 0; i < 4; i++) {
        setenv("GPUARR_MPI_CHUNK", bad_chunks[i], 1);
        CHECK(gpuarr_mpi_send(a, 0, -1, MPI_PROC_NULL, 1, MPI_COMM_WORLD) == GPUARR_ERROR_INVALID_ARGUMENT, "GPUARR_MPI_CHUNK=%s",
              bad_chunks[i]);
        setenv("GPUARR_MPI_CHUNK", good_chunks[i], 1);
        CHECK(gpuarr_mpi_send(a, 0, -1, MPI_PROC_NULL, 1, MPI_COMM_WORLD) == GPUARR_OK, "GPUARR_MPI_CHUNK=%s", good_chunks[i]);
    }
    setenv("GPUARR_MPI_CHUNK", "8", 1); /* 8 bytes: 2 i32 a chunk, 5 chunks */
    gpuarr_array b8 = make(GPUARR_I32, 10, NULL, 0);
    CHECK_OK(gpuarr_mpi_sendrecv(a, 0, 10, right(), 8, b8, 0, 10, 0, left(), 8, MPI_COMM_WORLD));
    expect(b8, 0, 10, 0, small_int, 5, "chunks of 8 bytes");
    gpuarr_release(b8);
    unsetenv("GPUARR_MPI_CHUNK");

    /* count mismatch: 10 elements arrive where 12 are expected; the next message is intact */
    gpuarr_array big = make(GPUARR_I32, 12, NULL, 0);
    CHECK_OK(gpuarr_mpi_isend(a, 0, 10, right(), 9, MPI_COMM_WORLD, &q));
    CHECK(gpuarr_mpi_recv(big, 0, 12, GPUARR_I32, left(), 9, MPI_COMM_WORLD) == GPUARR_ERROR_INVALID_ARGUMENT, "count mismatch");
    CHECK(has(gpuarr_last_error(), "sent 10 elements of i32") && has(gpuarr_last_error(), "expected 12 elements of i32"),
          "%s", gpuarr_last_error());
    CHECK_OK(gpuarr_mpi_wait(&q));
    /* dtype mismatch: i32 arrives, the receive says f32 */
    CHECK_OK(gpuarr_mpi_isend(a, 0, 10, right(), 9, MPI_COMM_WORLD, &q));
    CHECK(gpuarr_mpi_recv(big, 0, 10, GPUARR_F32, left(), 9, MPI_COMM_WORLD) == GPUARR_ERROR_INVALID_ARGUMENT, "dtype mismatch");
    CHECK(has(gpuarr_last_error(), "of i32") && has(gpuarr_last_error(), "of f32"), "%s", gpuarr_last_error());
    CHECK_OK(gpuarr_mpi_wait(&q));
    /* a sendrecv whose send is wrong posts nothing, its receive neither */
    CHECK(gpuarr_mpi_sendrecv(a, 0, 10, size + 5, 9, big, 1, 10, GPUARR_I32, left(), 9, MPI_COMM_WORLD) ==
              GPUARR_ERROR_INVALID_ARGUMENT, "sendrecv with dest out of range");
    CHECK(has(gpuarr_last_error(), "gpuarr_mpi_sendrecv: dest ="), "%s", gpuarr_last_error());
    CHECK_OK(gpuarr_mpi_sendrecv(a, 0, 10, right(), 9, big, 1, 10, GPUARR_I32, left(), 9, MPI_COMM_WORLD));
    expect(big, 1, 10, 1, small_int, 5, "the message after three refused ones");
    gpuarr_release(big);

    /* plain MPI bytes where a gpuarr message is expected: refused with MPI's words, and the
       comm's error handler (MPI_ERRORS_ARE_FATAL, MPI's default) was swapped only for the call */
    char raw[100] = {0};
    MPI_Request rr;
    MPI_Isend(raw, 100, MPI_BYTE, right(), 30, MPI_COMM_WORLD, &rr);
    CHECK(gpuarr_mpi_recv(a, 0, -1, 0, left(), 30, MPI_COMM_WORLD) == GPUARR_ERROR_INVALID_ARGUMENT, "100 plain bytes");
    CHECK(has(gpuarr_last_error(), "MPI_ERR_TRUNCATE"), "%s", gpuarr_last_error());
    MPI_Wait(&rr, MPI_STATUS_IGNORE);
    MPI_Isend(raw, 32, MPI_BYTE, right(), 31, MPI_COMM_WORLD, &rr);
    CHECK(gpuarr_mpi_recv(a, 0, -1, 0, left(), 31, MPI_COMM_WORLD) == GPUARR_ERROR_INVALID_ARGUMENT, "32 plain bytes");
    CHECK(has(gpuarr_last_error(), "not a gpuarr_mpi message"), "%s", gpuarr_last_error());
    MPI_Wait(&rr, MPI_STATUS_IGNORE);
    /* a header with gpuarr's magic number (layers/gpuarr_mpi.h) but a dtype that is none */
    struct { uint32_t magic; int32_t dtype; int64_t count, chunk, reserved; } fake = {0x67614d31u, 99, 10, 10, 0};
    MPI_Isend(&fake, (int)sizeof fake, MPI_BYTE, right(), 32, MPI_COMM_WORLD, &rr);
    CHECK(gpuarr_mpi_recv(a, 0, -1, 0, left(), 32, MPI_COMM_WORLD) == GPUARR_ERROR_INVALID_ARGUMENT, "damaged header");
    CHECK(has(gpuarr_last_error(), "damaged"), "%s", gpuarr_last_error());
    MPI_Wait(&rr, MPI_STATUS_IGNORE);
    MPI_Errhandler eh;
    MPI_Comm_get_errhandler(MPI_COMM_WORLD, &eh);
    CHECK(eh == MPI_ERRORS_ARE_FATAL, "MPI_COMM_WORLD's error handler is back to MPI_ERRORS_ARE_FATAL");
    MPI_Errhandler_free(&eh);
    gpuarr_release(a);
}

/* A receive that fails mid-message with a chunk's copy into the array still queued: the staging
   buffers go back to the pool only after that copy ran (the fake CUDA driver runs queued copies
   only when waited for, so a buffer handed out too early would have the next owner's bytes copied
   into the array). The sender is plain MPI: a header for 2048 i32 in chunks of 1024, chunk 0,
   then a chunk of 8 bytes. The receive names MPI_ANY_SOURCE and MPI_ANY_TAG; its error names the
   rank and tag the header came with. */
static void test_failed_receive_staging(void) {
    struct { uint32_t magic; int32_t dtype; int64_t count, chunk, reserved; } fake = {0x67614d31u, (int32_t)GPUARR_I32, 2048, 1024, 0};
    int32_t *chunk0 = malloc(1024 * sizeof *chunk0), junk[2] = {0, 0};
    for (int i = 0; i < 1024; i++) chunk0[i] = i;
    MPI_Request rr[3];
    MPI_Isend(&fake, (int)sizeof fake, MPI_BYTE, right(), 36, MPI_COMM_WORLD, &rr[0]);
    MPI_Isend(chunk0, 4096, MPI_BYTE, right(), 36, MPI_COMM_WORLD, &rr[1]);
    MPI_Isend(junk, 8, MPI_BYTE, right(), 36, MPI_COMM_WORLD, &rr[2]);
    gpuarr_array in = make(GPUARR_I32, 2048, NULL, 0);
    gpuarr_result r = gpuarr_mpi_recv(in, 0, -1, 0, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD);
    char want[96];
    snprintf(want, sizeof want, "the receive from rank %d (tag 36): chunk 1 from rank %d holds 8 bytes", left(), left());
    CHECK(r == GPUARR_ERROR_INVALID_ARGUMENT && has(gpuarr_last_error(), want), "a chunk of 8 bytes: %s (%s wanted)",
          gpuarr_last_error(), want);
    MPI_Waitall(3, rr, MPI_STATUSES_IGNORE);
    if (dev.id != gpuarr_host().id) { /* staged: take the pool's 4096-byte blocks and write them */
        gpuarr_array p[16];
        int64_t bytes = 4096;
        for (int i = 0; i < 16; i++) {
            void *h = NULL;
            CHECK(gpuarr_empty_pinned(dev, GPUARR_U8, 1, &bytes, &p[i]) == GPUARR_OK && gpuarr_host_data(p[i], &h) == GPUARR_OK,
                  "pinned block %d", i);
            if (h) memset(h, 0xab, 4096);
        }
        int32_t *got = malloc(1024 * sizeof *got);
        CHECK_OK(gpuarr_read(in, 0, 1024, GPUARR_I32, got));
        int bad = 0;
        for (int i = 0; i < 1024; i++) bad += got[i] != i;
        CHECK(bad == 0, "chunk 0 in the array after the failed receive: %d elements wrong (element 0: %d)", bad, got[0]);
        free(got);
        for (int i = 0; i < 16; i++) gpuarr_release(p[i]);
    }
    free(chunk0);
    gpuarr_release(in);
}

/* GPUARR_MPI_CHUNK's default, 4 MiB: a transfer of 8 MiB of f32 received as f64 takes two
   staging buffers of 4 MiB each way (the host rank: the receive's two, from the host's pool). */
static void test_default_chunk(void) {
    unsetenv("GPUARR_MPI_CHUNK");
    int64_t n = 2 << 20;
    gpuarr_array out = make(GPUARR_F32, n, small_int, 13), in = make(GPUARR_F64, n, NULL, 0);
    bool host = dev.id == gpuarr_host().id;
    gpuarr_result (*stats)(gpuarr_device, gpuarr_pool_stats *) = host ? gpuarr_pool_get_stats : gpuarr_pool_get_pinned_stats;
    gpuarr_pool_stats s0, s1;
    CHECK_OK(stats(dev, &s0));
    CHECK_OK(gpuarr_mpi_sendrecv(out, 0, -1, right(), 42, in, 0, -1, GPUARR_F32, left(), 42, MPI_COMM_WORLD));
    CHECK_OK(stats(dev, &s1));
    uint64_t b = s1.total_allocations - s0.total_allocations, req = s1.total_requested_bytes - s0.total_requested_bytes;
    uint64_t want = host ? 2 : 4;
    CHECK(b == want && req == want * (4u << 20), "default chunk: %llu buffers of 4 MiB expected, %llu taken, %llu bytes",
          (unsigned long long)want, (unsigned long long)b, (unsigned long long)req);
    expect(in, 0, n, 0, small_int, 13, "default chunk, f32 -> f64");
    gpuarr_release(out);
    gpuarr_release(in);
}

/* GPUARR_MPI_CUDA_AWARE: off stages even CUDA arrays (two pinned buffers each way on the fake
   CUDA ranks); on and auto are accepted (on is not tried on CUDA ranks: this MPI is not
   CUDA-aware, so device memory given to it would crash it). */
static void test_cuda_aware_setting(void) {
    setenv("GPUARR_MPI_CHUNK", "4K", 1);
    int64_t n = 10000;
    gpuarr_array out = make(GPUARR_F32, n, small_int, 14), in = make(GPUARR_F32, n, NULL, 0);
    bool cuda = strncmp(device_spec, "cuda:", 5) == 0, host = dev.id == gpuarr_host().id;
    const char *values[] = {"off", "auto", "on"};
    for (int i = 0; i < 3; i++) {
        /* every rank runs the same transfers; on, CUDA ranks send and receive through the host */
        bool skip = cuda && i == 2;
        setenv("GPUARR_MPI_CUDA_AWARE", values[i], 1);
        gpuarr_array o = out, d = in;
        if (skip) { /* host arrays instead: same message on the wire */
            int64_t m = n;
            gpuarr_empty(gpuarr_host(), GPUARR_F32, 1, &m, &o);
            gpuarr_empty(gpuarr_host(), GPUARR_F32, 1, &m, &d);
            gpuarr_copy(o, out);
        }
        gpuarr_pool_stats s0 = {0}, s1 = {0};
        if (!host) CHECK_OK(gpuarr_pool_get_pinned_stats(dev, &s0));
        CHECK(gpuarr_mpi_sendrecv(o, 0, -1, right(), 43 + i, d, 0, -1, 0, left(), 43 + i, MPI_COMM_WORLD) == GPUARR_OK,
              "GPUARR_MPI_CUDA_AWARE=%s", values[i]);
        if (!host) CHECK_OK(gpuarr_pool_get_pinned_stats(dev, &s1));
        expect(d, 0, n, 0, small_int, 14, values[i]);
        uint64_t b = s1.total_allocations - s0.total_allocations;
        if (cuda && i == 0) CHECK(b == 4, "GPUARR_MPI_CUDA_AWARE=off on %s: 4 pinned buffers, %llu taken", device_spec, (unsigned long long)b);
        if (!host && !skip) CHECK(b == 4, "GPUARR_MPI_CUDA_AWARE=%s, this MPI not CUDA-aware: staged, %llu buffers", values[i], (unsigned long long)b);
        if (skip) {
            gpuarr_release(o);
            gpuarr_release(d);
        }
    }
    unsetenv("GPUARR_MPI_CUDA_AWARE");
    unsetenv("GPUARR_MPI_CHUNK");
    gpuarr_release(out);
    gpuarr_release(in);
}

/* Threads (MPI_THREAD_MULTIPLE): a second wait on a request another thread waits for is refused
   at once; two threads' transfers, each longer than GPUARR_MPI_TIMEOUT_MS but moving, both
   succeed (the limit is on the whole process standing still, and a wait lets the others poll). */
typedef struct {
    gpuarr_mpi_request req;
    gpuarr_result second_wait;
    char msg[256];
    gpuarr_array out;
    gpuarr_result send;
} thread_arg;

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void *second_waiter(void *p) {
    thread_arg *t = p;
    sleep_ms(100);
    gpuarr_mpi_request copy = t->req;
    t->second_wait = gpuarr_mpi_wait(&copy);
    snprintf(t->msg, sizeof t->msg, "%s", gpuarr_last_error());
    sleep_ms(300);
    t->send = gpuarr_mpi_send(t->out, 0, -1, right(), 37, MPI_COMM_WORLD);
    return NULL;
}

typedef struct {
    int tag;
    gpuarr_array out, in;
    gpuarr_result r;
    char msg[512];
} slow_arg;

static void *slow_transfer(void *p) {
    slow_arg *t = p;
    t->r = gpuarr_mpi_sendrecv(t->out, 0, -1, right(), t->tag, t->in, 0, -1, 0, left(), t->tag, MPI_COMM_WORLD);
    snprintf(t->msg, sizeof t->msg, "%s", gpuarr_last_error());
    return NULL;
}

static void *allreduce_loop(void *p) {
    int *wrong = p;
    gpuarr_array x = make(GPUARR_I32, 4, NULL, 0);
    for (int i = 0; i < 200; i++) {
        int32_t v[4] = {1, 1, 1, 1};
        if (gpuarr_write(x, 0, 4, GPUARR_I32, v) != GPUARR_OK || gpuarr_mpi_allreduce(x, GPUARR_MPI_SUM, MPI_COMM_WORLD) != GPUARR_OK ||
            gpuarr_read(x, 0, 4, GPUARR_I32, v) != GPUARR_OK || v[3] != size)
            ++*wrong;
    }
    gpuarr_release(x);
    return NULL;
}

static void test_threads(void) {
    if (thread_level < MPI_THREAD_MULTIPLE) {
        if (rank == 0) printf("rank 0: test_threads skipped: MPI gives thread level %d, not MPI_THREAD_MULTIPLE\n", thread_level);
        return;
    }
    thread_arg t = {{0}, GPUARR_OK, "", make(GPUARR_I32, 64, small_int, 15), GPUARR_OK};
    gpuarr_array in = make(GPUARR_I32, 64, NULL, 0);
    CHECK_OK(gpuarr_mpi_irecv(in, 0, -1, 0, left(), 37, MPI_COMM_WORLD, &t.req));
    pthread_t th;
    pthread_create(&th, NULL, second_waiter, &t);
    CHECK_OK(gpuarr_mpi_wait(&t.req)); /* the left rank's thread sends after about 400 ms */
    pthread_join(th, NULL);
    CHECK(t.second_wait == GPUARR_ERROR_INVALID_HANDLE && has(t.msg, "being waited for by another thread"),
          "a second wait on one request: %s, %s", gpuarr_result_string(t.second_wait), t.msg);
    CHECK(t.send == GPUARR_OK, "the thread's send");
    expect(in, 0, 64, 0, small_int, 15, "received while another thread waited");
    gpuarr_release(t.out);
    gpuarr_release(in);

    const char *limit = getenv("TEST_MPI_SLOW_TIMEOUT_MS");
    setenv("GPUARR_MPI_TIMEOUT_MS", limit && *limit ? limit : "500", 1);
    setenv("GPUARR_MPI_CHUNK", "256", 1);
    int64_t n = 262144;
    slow_arg a[2];
    for (int i = 0; i < 2; i++) {
        a[i].tag = 610 + i;
        a[i].out = make(GPUARR_F32, n, small_int, 16 + i);
        a[i].in = make(GPUARR_F32, n, NULL, 0);
    }
    pthread_t ts[2];
    double t0 = seconds();
    for (int i = 0; i < 2; i++) pthread_create(&ts[i], NULL, slow_transfer, &a[i]);
    for (int i = 0; i < 2; i++) pthread_join(ts[i], NULL);
    double dt = seconds() - t0;
    for (int i = 0; i < 2; i++) {
        CHECK(a[i].r == GPUARR_OK, "thread %d's transfer: %s", i, a[i].msg);
        expect(a[i].in, 0, n, 0, small_int, 16 + i, "a thread's 4096 chunks");
        gpuarr_release(a[i].out);
        gpuarr_release(a[i].in);
    }
    if (rank == 0) printf("rank 0: two threads' 4096 chunks each way in %.2f s\n", dt);
    unsetenv("GPUARR_MPI_CHUNK");
    setenv("GPUARR_MPI_TIMEOUT_MS", "60000", 1);

    /* allreduces on one thread, transfers on another, both on MPI_COMM_WORLD: each swaps its
       error handler; MPI_ERRORS_ARE_FATAL is back at the end */
    pthread_t ta;
    int sums_wrong = 0;
    pthread_create(&ta, NULL, allreduce_loop, &sums_wrong);
    gpuarr_array out2 = make(GPUARR_I32, 16, small_int, 18), in2 = make(GPUARR_I32, 16, NULL, 0);
    for (int i = 0; i < 200; i++)
        CHECK(gpuarr_mpi_sendrecv(out2, 0, -1, right(), 620, in2, 0, -1, 0, left(), 620, MPI_COMM_WORLD) == GPUARR_OK, "transfer %d", i);
    pthread_join(ta, NULL);
    CHECK(sums_wrong == 0, "%d allreduces wrong or failed beside the transfers", sums_wrong);
    expect(in2, 0, 16, 0, small_int, 18, "transfers beside allreduces");
    MPI_Errhandler eh;
    MPI_Comm_get_errhandler(MPI_COMM_WORLD, &eh);
    CHECK(eh == MPI_ERRORS_ARE_FATAL, "MPI_COMM_WORLD's handler is MPI_ERRORS_ARE_FATAL after two threads' calls");
    MPI_Errhandler_free(&eh);
    gpuarr_release(out2);
    gpuarr_release(in2);
}

/* A receive whose header does not match drains the chunks through two host buffers; where the
   host's pool cannot give them (faults injected above 1 MiB), the receive fails saying so (it
   must not receive into no memory) and the sender, whose chunks nobody takes, times out. */
static void test_drain_without_memory(void) {
    setenv("GPUARR_MPI_CHUNK", "2M", 1);
    setenv("GPUARR_MPI_TIMEOUT_MS", "500", 1);
    gpuarr_array big = make(GPUARR_I32, 1 << 20, small_int, 19), small = make(GPUARR_I32, 10, NULL, 0);
    gpuarr_mpi_request q = {0};
    CHECK_OK(gpuarr_pool_trim(gpuarr_host()));
    CHECK_OK(gpuarr_pool_inject_faults(gpuarr_host(), 0, 1 << 20));
    CHECK_OK(gpuarr_mpi_isend(big, 0, -1, right(), 45, MPI_COMM_WORLD, &q));
    gpuarr_result r = gpuarr_mpi_recv(small, 0, -1, 0, left(), 45, MPI_COMM_WORLD);
    CHECK(r == GPUARR_ERROR_OUT_OF_MEMORY && has(gpuarr_last_error(), "cannot be drained") &&
              has(gpuarr_last_error(), "expected 10 elements of i32"),
          "a mismatch with no memory to drain: %s", gpuarr_result_string(r));
    CHECK_OK(gpuarr_pool_inject_faults(gpuarr_host(), 0, 0));
    r = gpuarr_mpi_wait(&q);
    CHECK(r == GPUARR_ERROR_TIMEOUT, "the send whose chunks nobody takes: %s", gpuarr_result_string(r));
    unsetenv("GPUARR_MPI_CHUNK");
    setenv("GPUARR_MPI_TIMEOUT_MS", "60000", 1);
    gpuarr_release(big);
    gpuarr_release(small);
}

/* The last gpuarr_shutdown and a fresh gpuarr_init in the middle of the run: dev is found again. */
static void reinit(void) {
    gpuarr_shutdown();
    CHECK(!gpuarr_is_initialized(), "the last gpuarr_shutdown");
    char spec[64];
    snprintf(spec, sizeof spec, "%s", device_spec);
    char *space = strchr(spec, ' ');
    if (space) *space = '\0';
    if (gpuarr_init(NULL) != GPUARR_OK || gpuarr_device_find(spec, &dev) != GPUARR_OK) {
        fprintf(stderr, "rank %d: gpuarr_init again, or %s: %s\n", rank, spec, gpuarr_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
}

#if defined(__SANITIZE_ADDRESS__)
#define TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ASAN 1
#endif
#endif

static void count_release(void *data, void *user) {
    (void)data;
    ++*(int *)user;
}

/* Receives pending at the last gpuarr_shutdown: it cancels them before their arrays go, so a
   message sent after it lands in no memory gpuarr freed. The wrapped array's memory is kept here:
   gpuarr released it (its callback ran at the shutdown), and it must still hold zeros once the
   message has arrived, whole, in the receive posted after the next gpuarr_init. Under ASan a
   receive into a host pool array is pending too: a write there is a use after free that ASan
   reports (without ASan it may crash the rank instead of failing a check). */
static void test_shutdown_pending(void) {
    setenv("GPUARR_MPI_TIMEOUT_MS", "5000", 1);
    enum { N = 1000 };
    static int32_t kept[N];
    memset(kept, 0, sizeof kept);
    int released = 0, ntags = 1;
    int64_t n = N;
    gpuarr_array w = {0};
    gpuarr_mpi_request q[2] = {{0}, {0}};
    CHECK_OK(gpuarr_wrap_host(kept, GPUARR_I32, 1, &n, count_release, &released, &w));
    CHECK_OK(gpuarr_mpi_irecv(w, 0, -1, 0, left(), 710, MPI_COMM_WORLD, &q[0]));
    CHECK_OK(gpuarr_release(w)); /* the transfer holds its own reference */
#ifdef TEST_ASAN
    gpuarr_array p = {0};
    CHECK_OK(gpuarr_zeros(gpuarr_host(), GPUARR_I32, 1, &n, &p));
    CHECK_OK(gpuarr_mpi_irecv(p, 0, -1, 0, left(), 711, MPI_COMM_WORLD, &q[1]));
    CHECK_OK(gpuarr_release(p));
    ntags = 2;
#endif
    CHECK(released == 0, "the wrapped array is not released while its receive is pending");
    reinit();
    CHECK(released == 1, "gpuarr_shutdown released the wrapped array (its callback ran %d times)", released);
    MPI_Barrier(MPI_COMM_WORLD); /* every rank has shut down before anything is sent */
    gpuarr_array out = make(GPUARR_I32, N, small_int, 21);
    for (int t = 0; t < ntags; t++) {
        gpuarr_array in = make(GPUARR_I32, N, NULL, 0);
        gpuarr_mpi_request sq = {0};
        CHECK_OK(gpuarr_mpi_isend(out, 0, -1, right(), 710 + t, MPI_COMM_WORLD, &sq));
        gpuarr_result r = gpuarr_mpi_recv(in, 0, -1, 0, left(), 710 + t, MPI_COMM_WORLD);
        CHECK(r == GPUARR_OK, "tag %d: the receive posted after gpuarr_init gets the message: %s", 710 + t, gpuarr_result_string(r));
        CHECK_OK(gpuarr_mpi_wait(&sq));
        expect(in, 0, N, 0, small_int, 21, "the message sent after a shutdown with a receive pending");
        gpuarr_release(in);
    }
    int written = 0;
    for (int i = 0; i < N; i++) written += kept[i] != 0;
    CHECK(written == 0, "%d elements landed in the wrapped array's memory after gpuarr_shutdown released it", written);
    gpuarr_release(out);
    setenv("GPUARR_MPI_TIMEOUT_MS", "60000", 1);
}

/* A request of an earlier gpuarr_init cycle: refused, saying so, the request left as it was; one
   of this cycle that was waited for already is still refused. */
static void test_earlier_cycle_request(void) {
    setenv("GPUARR_MPI_TIMEOUT_MS", "2000", 1);
    gpuarr_array a = make(GPUARR_I32, 16, NULL, 0);
    gpuarr_mpi_request q = {0};
    CHECK_OK(gpuarr_mpi_irecv(a, 0, -1, 0, left(), 720, MPI_COMM_WORLD, &q));
    CHECK_OK(gpuarr_release(a));
    uint32_t id = q.id;
    reinit();
    gpuarr_result r = gpuarr_mpi_wait(&q);
    CHECK(r == GPUARR_ERROR_INVALID_HANDLE && q.id == id, "a wait on a request from before gpuarr_shutdown: %s, {0x%x}",
          gpuarr_result_string(r), q.id);
    CHECK(has(gpuarr_last_error(), "gpuarr_mpi_wait: req {") && has(gpuarr_last_error(), "is from an earlier gpuarr_init"), "%s",
          gpuarr_last_error());
    gpuarr_array b = make(GPUARR_I32, 4, small_int, 1);
    CHECK_OK(gpuarr_mpi_isend(b, 0, -1, MPI_PROC_NULL, 721, MPI_COMM_WORLD, &q));
    id = q.id;
    CHECK_OK(gpuarr_mpi_wait(&q));
    q.id = id;
    CHECK(gpuarr_mpi_wait(&q) == GPUARR_ERROR_INVALID_HANDLE && has(gpuarr_last_error(), "waited for already") &&
              !has(gpuarr_last_error(), "earlier gpuarr_init"),
          "a request of this cycle waited for twice: %s", gpuarr_last_error());
    gpuarr_release(b);
    setenv("GPUARR_MPI_TIMEOUT_MS", "60000", 1);
}

/* A peer's header (sent by hand, gpuarr's format) for INT64_MAX elements where the receive
   expects 10, the path that drains a mismatch: refused at once, naming the rank and tag, with no
   overflow (UBSan) and no wait. INT64_MAX bytes (u8) are not refused (an array could hold them on
   paper): that receive drains, counting its chunks without overflow, and times out. */
static void test_absurd_header(void) {
    setenv("GPUARR_MPI_TIMEOUT_MS", "5000", 1);
    struct { uint32_t magic; int32_t dtype; int64_t count, chunk, reserved; } fake = {0x67614d31u, (int32_t)GPUARR_I32, INT64_MAX, 1024, 0};
    gpuarr_array a = make(GPUARR_I32, 10, NULL, 0);
    MPI_Request rr;
    MPI_Isend(&fake, (int)sizeof fake, MPI_BYTE, right(), 730, MPI_COMM_WORLD, &rr);
    double t0 = seconds();
    gpuarr_result r = gpuarr_mpi_recv(a, 0, -1, 0, left(), 730, MPI_COMM_WORLD);
    double dt = seconds() - t0;
    char want[128];
    snprintf(want, sizeof want, "rank %d sent a header for 9223372036854775807 elements of i32 (tag 730)", left());
    CHECK(r == GPUARR_ERROR_INVALID_ARGUMENT && has(gpuarr_last_error(), want), "count INT64_MAX: %s (%s wanted)",
          gpuarr_result_string(r), want);
    CHECK(dt < 2.0, "refused after %.2f s: at once expected", dt);
    MPI_Wait(&rr, MPI_STATUS_IGNORE);
    setenv("GPUARR_MPI_TIMEOUT_MS", "300", 1);
    fake.dtype = (int32_t)GPUARR_U8;
    MPI_Isend(&fake, (int)sizeof fake, MPI_BYTE, right(), 731, MPI_COMM_WORLD, &rr);
    r = gpuarr_mpi_recv(a, 0, -1, 0, left(), 731, MPI_COMM_WORLD);
    CHECK(r == GPUARR_ERROR_TIMEOUT && has(gpuarr_last_error(), "0 of 9007199254740992 chunks done"),
          "INT64_MAX elements of u8, drained: %s", gpuarr_result_string(r));
    MPI_Wait(&rr, MPI_STATUS_IGNORE);
    gpuarr_release(a);
    setenv("GPUARR_MPI_TIMEOUT_MS", "60000", 1);
}

/* A send nobody receives: rank 1's send to rank 2 times out, names the peer and tag, and what it
   posted is cancelled (or, where MPI cannot cancel a send, kept until MPI lets it go). */
static void test_send_timeout(void) {
    if (size < 3 || rank != 1) return;
    setenv("GPUARR_MPI_TIMEOUT_MS", "300", 1);
    gpuarr_array a = make(GPUARR_F64, 1 << 17, small_int, 1); /* 1 MiB: past MPI's eager sizes */
    double t0 = seconds();
    gpuarr_result r = gpuarr_mpi_send(a, 0, -1, 2, 900, MPI_COMM_WORLD);
    double dt = seconds() - t0;
    CHECK(r == GPUARR_ERROR_TIMEOUT, "a send nobody receives: %s", gpuarr_result_string(r));
    CHECK(has(gpuarr_last_error(), "the send to rank 2 (tag 900) did not move for 300 ms"), "%s", gpuarr_last_error());
    CHECK(dt >= 0.29 && dt < 5.0, "timed out after %.2f s (0.3 s asked)", dt);
    CHECK_OK(gpuarr_release(a)); /* the handle goes; memory MPI may still read stays until it is done */
    setenv("GPUARR_MPI_TIMEOUT_MS", "60000", 1);
}

/* The last rank leaves before it sends, with a receive of its own pending; rank 0's receive
   times out, within bounds. */
static void test_early_exit(void) {
    int last = size - 1;
    if (rank == last) {
        printf("rank %d (%s): %d checks, %d failed; leaving early (MPI_Finalize) before sending to rank 0\n", rank,
               device_spec, checks, failures);
        fflush(stdout);
        /* a receive left pending across MPI_Finalize: gpuarr_shutdown then calls no MPI function
           (MPI would abort) and frees its array (MPI writes nothing after MPI_Finalize) */
        static int32_t kept[8];
        int released = 0;
        int64_t eight = 8;
        gpuarr_array w = {0};
        gpuarr_mpi_request pending = {0};
        CHECK_OK(gpuarr_wrap_host(kept, GPUARR_I32, 1, &eight, count_release, &released, &w));
        CHECK_OK(gpuarr_mpi_irecv(w, 0, -1, 0, 0, 78, MPI_COMM_WORLD, &pending));
        CHECK_OK(gpuarr_release(w));
        MPI_Finalize();
        /* after MPI_Finalize: refused, saying so */
        gpuarr_array x = make(GPUARR_I32, 4, NULL, 0);
        gpuarr_mpi_request q = {0x00010001u};
        gpuarr_result rs[4] = {gpuarr_mpi_send(x, 0, -1, 0, 1, MPI_COMM_WORLD), gpuarr_mpi_allreduce(x, GPUARR_MPI_SUM, MPI_COMM_WORLD),
                               gpuarr_mpi_device(MPI_COMM_WORLD, &dev), gpuarr_mpi_wait(&q)};
        int bad = 0;
        for (int i = 0; i < 4; i++) bad += rs[i] != GPUARR_ERROR_NOT_INITIALIZED;
        CHECK(bad == 0 && has(gpuarr_last_error(), "MPI is finalized already"), "after MPI_Finalize: %d not refused, %s", bad,
              gpuarr_last_error());
        gpuarr_release(x);
        gpuarr_shutdown();
        CHECK(released == 1, "gpuarr_shutdown after MPI_Finalize freed the pending receive's array (callback ran %d times)", released);
        printf("rank %d (%s): after MPI_Finalize, %d failed in all\n", rank, device_spec, failures);
        exit(failures ? 1 : 0);
    }
    if (rank == 0) {
        setenv("GPUARR_MPI_TIMEOUT_MS", "2000", 1);
        gpuarr_array a = make(GPUARR_F32, 1000, NULL, 0);
        double t0 = seconds();
        gpuarr_result r = gpuarr_mpi_recv(a, 0, -1, GPUARR_F32, last, 77, MPI_COMM_WORLD);
        double dt = seconds() - t0;
        CHECK(r == GPUARR_ERROR_TIMEOUT, "the receive from a rank that left: %s", gpuarr_result_string(r));
        char want[64];
        snprintf(want, sizeof want, "rank %d (tag 77)", last);
        CHECK(has(gpuarr_last_error(), want) && has(gpuarr_last_error(), "GPUARR_MPI_TIMEOUT_MS"), "%s", gpuarr_last_error());
        CHECK(dt >= 1.9 && dt < 10.0, "timed out after %.2f s (2 s asked)", dt);
        printf("rank 0: the receive from rank %d that left ended in %.2f s: %s\n", last, dt, gpuarr_last_error());
        gpuarr_release(a);
    }
}

/* Whether name is an item of the comma-separated list. */
static bool listed(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; p; p = strchr(p, ',')) {
        if (*p == ',') p++;
        if (strncmp(p, name, n) == 0 && (p[n] == ',' || p[n] == '\0')) return true;
    }
    return false;
}

static void pick_device(void) {
    const char *list = getenv("TEST_MPI_DEVICES");
    if (!list || !*list) list = "host,opencl:0,opencl:1,opencl:0/discrete";
    char buf[512];
    snprintf(buf, sizeof buf, "%s", list);
    int n = 0;
    char *items[32], *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t && n < 32; t = strtok_r(NULL, ",", &save)) items[n++] = t;
    snprintf(device_spec, sizeof device_spec, "%s", items[rank % n]);
    char *slash = strchr(device_spec, '/');
    if (slash && strcmp(slash, "/discrete") == 0) {
        setenv("GPUARR_OPENCL_UNIFIED", "off", 1);
        *slash = '\0';
        snprintf(device_spec + strlen(device_spec), sizeof device_spec - strlen(device_spec), " discrete");
    }
}

int main(int argc, char **argv) {
    /* before MPI_Init: refused, saying so (checked once the rank is known) */
    gpuarr_result before_init = GPUARR_OK;
    char before_msg[256] = "";
    if (gpuarr_init(NULL) == GPUARR_OK) {
        int64_t one = 1;
        gpuarr_array x;
        if (gpuarr_zeros(gpuarr_host(), GPUARR_I32, 1, &one, &x) == GPUARR_OK) {
            before_init = gpuarr_mpi_send(x, 0, -1, 0, 0, MPI_COMM_WORLD);
            snprintf(before_msg, sizeof before_msg, "%s", gpuarr_last_error());
            gpuarr_mpi_request q = {0x00010001u};
            gpuarr_device d;
            /* the others too: the first that is not refused saying so spoils before_init */
            gpuarr_result rs[3] = {gpuarr_mpi_allreduce(x, GPUARR_MPI_SUM, MPI_COMM_WORLD), gpuarr_mpi_device(MPI_COMM_WORLD, &d),
                                   gpuarr_mpi_wait(&q)};
            for (int i = 0; i < 3; i++)
                if (rs[i] != GPUARR_ERROR_NOT_INITIALIZED || !has(gpuarr_last_error(), "MPI is not initialized")) before_init = rs[i];
            gpuarr_release(x);
        }
        gpuarr_shutdown();
    }
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &thread_level);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    pick_device();
    setenv("GPUARR_MPI_TIMEOUT_MS", "60000", 1);
    if (gpuarr_init(NULL) != GPUARR_OK) {
        fprintf(stderr, "rank %d: gpuarr_init: %s\n", rank, gpuarr_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    char spec[64];
    snprintf(spec, sizeof spec, "%s", device_spec);
    char *space = strchr(spec, ' ');
    if (space) *space = '\0';
    if (gpuarr_device_find(spec, &dev) != GPUARR_OK) {
        fprintf(stderr, "rank %d: no device %s: %s\n", rank, spec, gpuarr_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    CHECK(before_init == GPUARR_ERROR_NOT_INITIALIZED && has(before_msg, "MPI is not initialized"),
          "gpuarr_mpi_send before MPI_Init: %s", before_msg);
    struct {
        const char *name;
        void (*fn)(void);
    } tests[] = {{"device", test_device},           {"dtype_pairs", test_dtype_pairs}, {"ranges", test_ranges},       {"chunks", test_chunks},
                 {"staging", test_staging},         {"any_and_order", test_any_and_order},
                 {"random", test_random},           {"slow_but_moving", test_slow_but_moving},
                 {"proc_null", test_proc_null},     {"release_pending", test_release_pending}, {"allreduce", test_allreduce}, {"bad_input", test_bad_input},
                 {"failed_recv", test_failed_receive_staging}, {"default_chunk", test_default_chunk},
                 {"cuda_aware", test_cuda_aware_setting}, {"threads", test_threads}, {"drain_no_memory", test_drain_without_memory},
                 {"shutdown_pending", test_shutdown_pending}, {"earlier_cycle", test_earlier_cycle_request},
                 {"absurd_header", test_absurd_header}, {"send_timeout", test_send_timeout}, {"native_send", test_native_send},
                 {"early_exit", test_early_exit}};
    const char *only = getenv("TEST_MPI_ONLY"); /* "name,name": these tests only (a quicker loop) */
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        int before = failures;
        if (only && *only && !listed(only, tests[i].name)) continue;
        double t0 = seconds();
        if (size < 2) {
            fprintf(stderr, "test_mpi needs 2 ranks or more\n");
            failures++;
            break;
        }
        tests[i].fn();
        if (rank == 0 || failures != before)
            printf("rank %d (%s): %-12s %s (%.2f s)\n", rank, device_spec, tests[i].name, failures == before ? "ok" : "FAILED",
                   seconds() - t0);
        fflush(stdout);
    }
    printf("rank %d (%s): %d checks, %d failed\n", rank, device_spec, checks, failures);
    fflush(stdout);
    gpuarr_shutdown();
    MPI_Finalize();
    return failures ? 1 : 0;
}
