/*
 * test_native_order.c -- work the caller queues through native interop, then
 * gpuarr_array_record_stream(a, s): every later gpuarr call that reads or writes a runs after it.
 *
 * Runs on GPUARR_TEST_DEVICE like the generic suite. The native work writes N copies of a value
 * into a and cannot finish at once:
 *   - opencl:N: a clEnqueueFillBuffer on gpuarr_opencl_queue(s) that waits for a user event,
 *     completed by another thread after GATE_MS;
 *   - cuda:N on tests/fake_cuda: a cuMemsetD32Async on gpuarr_cuda_stream(s), which that driver
 *     runs only when the host waits for the stream (on a GPU it is merely fast);
 *   - the host: a host array written by opencl:0's queue (a gated fill of a buffer, then a
 *     clEnqueueReadBuffer into the array's memory), recorded on that queue's stream.
 * Each test then makes one gpuarr call on a and checks that it saw the native work's result.
 */
#define _GNU_SOURCE 1
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <dlfcn.h>
#include <pthread.h>
#include <time.h>

#include "test_common.h"

#define N 4096
#define GATE_MS 150
#define OLD_VALUE 1.0f
#define NEW_VALUE 7.5f

TestSuite(native_order, .init = test_setup, .fini = test_teardown);

/* ---- the native writer ------------------------------------------------------------------- */
typedef struct native_work {
    gpuarr_device dev;    /* the device whose stream runs the work */
    gpuarr_stream s;
    cl_event gate, done;  /* OpenCL: the user event the work waits for, the work's last command */
    cl_mem scratch;       /* the host case: the buffer filled, then read into the array */
    pthread_t opener;
    bool opener_started;
} native_work;

static void sleep_ms(int ms) {
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static void *open_gate(void *arg) {
    native_work *w = (native_work *)arg;
    sleep_ms(GATE_MS);
    clSetUserEventStatus(w->gate, CL_COMPLETE);
    return NULL;
}

static bool is_backend(gpuarr_device d, gpuarr_backend b) {
    gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(d, &info));
    return info.backend == b;
}

/* A fill of `bytes` bytes at `offset` of m on s's queue, waiting for a user event that another
   thread completes after GATE_MS. */
static void opencl_gated_fill(native_work *w, cl_mem m, size_t offset, size_t bytes, cl_event *done) {
    cl_context ctx = NULL;
    cl_command_queue q = NULL;
    cl_int err;
    float value = NEW_VALUE;
    TEST_OK(gpuarr_opencl_context(w->dev, &ctx));
    TEST_OK(gpuarr_opencl_queue(w->s, &q));
    w->gate = clCreateUserEvent(ctx, &err);
    cr_assert_eq(err, CL_SUCCESS, "clCreateUserEvent: %d", err);
    err = clEnqueueFillBuffer(q, m, &value, sizeof value, offset, bytes, 1, &w->gate, done);
    cr_assert_eq(err, CL_SUCCESS, "clEnqueueFillBuffer: %d", err);
    clFlush(q);
    cr_assert_eq(pthread_create(&w->opener, NULL, open_gate, w), 0);
    w->opener_started = true;
}

static void cuda_memset(native_work *w, gpuarr_array a) {
    typedef int (*memset_fn)(unsigned long long, unsigned int, size_t, struct CUstream_st *);
    const char *lib = getenv("GPUARR_CUDA_LIBRARY");
    void *driver = dlopen(lib ? lib : "libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    cr_assert(driver, "the CUDA driver gpuarr loaded is not found: %s", dlerror());
    memset_fn memset_d32;
    *(void **)&memset_d32 = dlsym(driver, "cuMemsetD32Async");
    cr_assert(memset_d32, "cuMemsetD32Async: %s", dlerror());
    struct CUstream_st *stream;
    void *p;
    float value = NEW_VALUE;
    unsigned int bits;
    memcpy(&bits, &value, sizeof bits);
    TEST_OK(gpuarr_cuda_stream(w->s, &stream));
    TEST_OK(gpuarr_cuda_ptr(a, &p));
    TEST_OK(gpuarr_set_current_device(w->dev)); /* the primary context, current for the call */
    int err = memset_d32((unsigned long long)(uintptr_t)p, bits, N, stream);
    cr_assert_eq(err, 0, "cuMemsetD32Async: %d", err);
    dlclose(driver);
}

/* Queues the native work writing NEW_VALUE into every element of a (f32, N elements), then
   tells gpuarr with gpuarr_array_record_stream. */
static void native_write(native_work *w, gpuarr_array a) {
    memset(w, 0, sizeof *w);
    gpuarr_device d = test_device();
    if (test_device_is_host(d)) {
        if (gpuarr_device_find("opencl:0", &w->dev) != GPUARR_OK)
            test_skip("a host array written by a device's queue needs opencl:0: %s", gpuarr_last_error());
    } else {
        w->dev = d;
    }
    TEST_OK(gpuarr_stream_create(w->dev, 0, &w->s));
    size_t bytes = N * sizeof(float);
    if (test_device_is_host(d)) {
        cl_context ctx = NULL;
        cl_command_queue q = NULL;
        cl_int err;
        void *host = NULL;
        TEST_OK(gpuarr_opencl_context(w->dev, &ctx));
        TEST_OK(gpuarr_opencl_queue(w->s, &q));
        TEST_OK(gpuarr_host_data(a, &host));
        w->scratch = clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
        cr_assert_eq(err, CL_SUCCESS, "clCreateBuffer: %d", err);
        opencl_gated_fill(w, w->scratch, 0, bytes, NULL);
        err = clEnqueueReadBuffer(q, w->scratch, CL_FALSE, 0, bytes, host, 0, NULL, &w->done);
        cr_assert_eq(err, CL_SUCCESS, "clEnqueueReadBuffer: %d", err);
        clFlush(q);
    } else if (is_backend(d, GPUARR_BACKEND_OPENCL)) {
        cl_mem m = NULL;
        size_t offset;
        TEST_OK(gpuarr_opencl_mem(a, &m, &offset));
        opencl_gated_fill(w, m, offset, bytes, &w->done);
    } else if (is_backend(d, GPUARR_BACKEND_CUDA)) {
        cuda_memset(w, a);
    } else {
        test_skip("%s: no native queue to test with", test_device_spec());
    }
    TEST_OK(gpuarr_array_record_stream(a, w->s));
}

/* Whether the native work has finished (OpenCL: its last command is complete). */
static bool native_finished(native_work *w) {
    if (!w->done) return true; /* CUDA: seen through the values only */
    cl_int status = CL_QUEUED;
    clGetEventInfo(w->done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
    return status == CL_COMPLETE;
}

static void native_end(native_work *w) {
    if (w->opener_started) pthread_join(w->opener, NULL);
    TEST_OK(gpuarr_stream_sync(w->s));
    TEST_OK(gpuarr_stream_destroy(w->s));
    if (w->done) clReleaseEvent(w->done);
    if (w->gate) clReleaseEvent(w->gate);
    if (w->scratch) clReleaseMemObject(w->scratch);
}

/* a: N f32 elements of OLD_VALUE on the device under test. */
static gpuarr_array old_array(void) {
    static float old[N];
    for (int i = 0; i < N; i++) old[i] = OLD_VALUE;
    int64_t shape[1] = {N};
    gpuarr_array a;
    TEST_OK(gpuarr_from_host(test_device(), old, 1, shape, &a));
    TEST_OK(gpuarr_array_sync(a));
    return a;
}

static void expect_new_values(const float *v, const char *what) {
    int wrong = 0, first = -1;
    for (int i = 0; i < N; i++)
        if (v[i] != NEW_VALUE && wrong++ == 0) first = i;
    cr_expect_eq(wrong, 0, "%s on %s: %d of %d elements are not the native work's %g (element %d is %g): "
                 "the call did not wait for the work recorded with gpuarr_array_record_stream",
                 what, test_device_spec(), wrong, N, (double)NEW_VALUE, first, first >= 0 ? (double)v[first] : 0.0);
}

static void expect_array_new(gpuarr_array b, const char *what) {
    static float v[N];
    TEST_OK(gpuarr_read(b, 0, N, GPUARR_F32, v));
    expect_new_values(v, what);
}

/* ---- the calls that read a ---------------------------------------------------------------- */
Test(native_order, read_waits_for_recorded_native_work) {
    gpuarr_array a = old_array();
    native_work w;
    native_write(&w, a);
    static float v[N];
    TEST_OK(gpuarr_read(a, 0, N, GPUARR_F32, v));
    expect_new_values(v, "gpuarr_read_as");
    native_end(&w);
    TEST_OK(gpuarr_release(a));
}

Test(native_order, to_host_waits_for_recorded_native_work) {
    gpuarr_array a = old_array();
    native_work w;
    native_write(&w, a);
    static double v[N];
    TEST_OK(gpuarr_to_host(a, v, N));
    static float f[N];
    for (int i = 0; i < N; i++) f[i] = (float)v[i];
    expect_new_values(f, "gpuarr_to_host (f32 -> f64)");
    native_end(&w);
    TEST_OK(gpuarr_release(a));
}

Test(native_order, read_async_on_another_stream_waits_for_recorded_native_work) {
    gpuarr_array a = old_array();
    native_work w;
    native_write(&w, a);
    gpuarr_stream other;
    TEST_OK(gpuarr_stream_create(test_device(), 0, &other));
    static float v[N];
    TEST_OK(gpuarr_read_async(a, 0, N, GPUARR_F32, v, other));
    TEST_OK(gpuarr_stream_sync(other));
    expect_new_values(v, "gpuarr_read_async on a second stream");
    TEST_OK(gpuarr_stream_destroy(other));
    native_end(&w);
    TEST_OK(gpuarr_release(a));
}

Test(native_order, convert_to_host_waits_for_recorded_native_work) {
    gpuarr_array a = old_array(), b;
    native_work w;
    native_write(&w, a);
    TEST_OK(gpuarr_convert(a, gpuarr_host(), GPUARR_F64, &b));
    expect_array_new(b, "gpuarr_convert to the host as f64");
    native_end(&w);
    TEST_OK(gpuarr_release(b));
    TEST_OK(gpuarr_release(a));
}

Test(native_order, convert_on_the_device_waits_for_recorded_native_work) {
    gpuarr_array a = old_array(), b;
    native_work w;
    native_write(&w, a);
    TEST_OK(gpuarr_convert(a, test_device(), GPUARR_F64, &b));
    cr_expect(native_finished(&w), "gpuarr_convert returned before the native work finished");
    expect_array_new(b, "gpuarr_convert on the device (f32 -> f64)");
    native_end(&w);
    TEST_OK(gpuarr_release(b));
    TEST_OK(gpuarr_release(a));
}

Test(native_order, identity_convert_waits_for_recorded_native_work) {
    gpuarr_array a = old_array(), b;
    native_work w;
    native_write(&w, a);
    TEST_OK(gpuarr_convert(a, test_device(), GPUARR_F32, &b)); /* a itself, retained */
    cr_expect(native_finished(&w), "the identity gpuarr_convert returned before the native work finished");
    native_end(&w);
    expect_array_new(b, "the identity gpuarr_convert");
    TEST_OK(gpuarr_release(b));
    TEST_OK(gpuarr_release(a));
}

Test(native_order, copy_from_waits_for_recorded_native_work) {
    gpuarr_array a = old_array(), b;
    int64_t shape[1] = {N};
    TEST_OK(gpuarr_zeros(test_device(), GPUARR_F32, 1, shape, &b));
    native_work w;
    native_write(&w, a);
    TEST_OK(gpuarr_copy(b, a));
    cr_expect(native_finished(&w), "gpuarr_copy(b, a) returned before the native work on a finished");
    expect_array_new(b, "gpuarr_copy(b, a)");
    native_end(&w);
    TEST_OK(gpuarr_release(b));
    TEST_OK(gpuarr_release(a));
}

Test(native_order, copy_into_waits_for_recorded_native_work) {
    gpuarr_array a = old_array(), b;
    static float twos[N];
    for (int i = 0; i < N; i++) twos[i] = 2.0f;
    int64_t shape[1] = {N};
    TEST_OK(gpuarr_from_host(test_device(), twos, 1, shape, &b));
    native_work w;
    native_write(&w, a);
    TEST_OK(gpuarr_copy(a, b)); /* must land after the native fill, not under it */
    native_end(&w);
    static float v[N];
    TEST_OK(gpuarr_read(a, 0, N, GPUARR_F32, v));
    cr_expect(v[0] == 2.0f && v[N - 1] == 2.0f, "gpuarr_copy(a, b) on %s ran before the native work: a[0] = %g, a[N-1] = %g",
              test_device_spec(), (double)v[0], (double)v[N - 1]);
    TEST_OK(gpuarr_release(b));
    TEST_OK(gpuarr_release(a));
}

Test(native_order, fill_waits_for_recorded_native_work) {
    gpuarr_array a = old_array();
    native_work w;
    native_write(&w, a);
    TEST_OK(gpuarr_fill(a, 3.0f));
    native_end(&w);
    static float v[N];
    TEST_OK(gpuarr_read(a, 0, N, GPUARR_F32, v));
    cr_expect(v[0] == 3.0f && v[N - 1] == 3.0f, "gpuarr_fill on %s ran before the native work: a[0] = %g, a[N-1] = %g",
              test_device_spec(), (double)v[0], (double)v[N - 1]);
    TEST_OK(gpuarr_release(a));
}

Test(native_order, dlpack_export_waits_for_recorded_native_work) {
    gpuarr_array a = old_array();
    native_work w;
    native_write(&w, a);
    DLManagedTensorVersioned *t = NULL;
    TEST_OK(gpuarr_to_dlpack(a, 0, &t));
    cr_expect(native_finished(&w), "gpuarr_to_dlpack returned before the native work finished");
    if (test_device_is_host(test_device())) expect_new_values((const float *)t->dl_tensor.data, "the DLPack tensor's data");
    t->deleter(t);
    native_end(&w);
    if (!test_device_is_host(test_device())) expect_array_new(a, "a after gpuarr_to_dlpack");
    TEST_OK(gpuarr_release(a));
}

static gpuarr_result copy_to_host_task(const gpuarr_array *in, int n_in, gpuarr_array *out, int n_out, gpuarr_stream s, void *user) {
    (void)n_in, (void)n_out, (void)s, (void)user;
    void *p;
    gpuarr_result r = gpuarr_host_data(in[0], &p); /* the task reads the memory itself */
    if (r != GPUARR_OK) return r;
    int64_t shape[1] = {N};
    return gpuarr_from_host(gpuarr_host(), (const float *)p, 1, shape, &out[0]);
}

Test(native_order, map_input_waits_for_recorded_native_work) {
    gpuarr_array a = old_array();
    gpuarr_task_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.name = "native_order_copy";
    desc.impl[GPUARR_BACKEND_HOST] = copy_to_host_task;
    desc.n_in = 1;
    desc.n_out = 1;
    gpuarr_task task;
    TEST_OK(gpuarr_task_create(&desc, &task));
    native_work w;
    native_write(&w, a);
    gpuarr_offload_desc od;
    memset(&od, 0, sizeof od);
    od.devices = "host";
    od.policy = GPUARR_OFFLOAD_HOST;
    gpuarr_array out = {0};
    TEST_OK(gpuarr_map(task, &a, 1, &out, &od, NULL));
    expect_array_new(out, "gpuarr_map's input");
    native_end(&w);
    TEST_OK(gpuarr_release(out));
    TEST_OK(gpuarr_task_destroy(task));
    TEST_OK(gpuarr_release(a));
}

Test(native_order, query_sees_recorded_native_work_pending) {
    gpuarr_device d = test_device();
    if (!is_backend(d, GPUARR_BACKEND_OPENCL) && !test_device_is_host(d))
        test_skip("%s: only a gated OpenCL queue stays pending for certain", test_device_spec());
    gpuarr_array a = old_array();
    native_work w;
    native_write(&w, a);
    bool ready = true;
    TEST_OK(gpuarr_array_query(a, &ready));
    cr_expect(!ready || native_finished(&w), "gpuarr_array_query says ready while the recorded native work is pending");
    native_end(&w);
    TEST_OK(gpuarr_array_query(a, &ready));
    cr_expect(ready, "gpuarr_array_query says not ready after the stream finished");
    TEST_OK(gpuarr_release(a));
}

/* ---- what record_stream refuses ---------------------------------------------------------- */
Test(native_order, record_stream_of_another_device_refused_for_a_device_array) {
    gpuarr_device d = test_device();
    if (test_device_is_host(d)) test_skip("the device under test is the host: any stream may be recorded");
    gpuarr_array a = old_array();
    gpuarr_stream hs;
    TEST_OK(gpuarr_stream_create(gpuarr_host(), 0, &hs));
    TEST_FAIL_WITH(gpuarr_array_record_stream(a, hs), GPUARR_ERROR_INVALID_ARGUMENT, "only a host array may be recorded");
    TEST_OK(gpuarr_stream_destroy(hs));
    TEST_OK(gpuarr_release(a));
}
