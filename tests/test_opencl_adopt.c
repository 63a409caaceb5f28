/* Adopted OpenCL contexts (the manual's ADOPTED DEVICES), on PoCL with two devices
   (POCL_DEVICES="pthread pthread"): a context, queue and buffers this test makes itself, as an
   application that owns its OpenCL objects would, become a gpuarr device and its arrays, and
   gpuarr's arrays go back to that context. */
#define _POSIX_C_SOURCE 200809L /* mkstemp */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdbool.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <tgmath.h>
#include "test_common.h"

TestSuite(adopt, .init = test_setup, .fini = test_teardown);

GPUARR_KERNEL(adopt_scale, (GPUARR_SCALAR(float, k), GPUARR_INOUT(float, y)), {
    int64_t i = gpuarr_index(0);
    y[i] = k * y[i];
})

/* The caller's side: device n of the first platform, a context of its own, an in-order queue. */
typedef struct mine {
    cl_device_id device;
    cl_context context;
    cl_command_queue queue;
} mine;

static cl_device_id platform_device(int n) {
    cl_platform_id p;
    cl_device_id ids[8];
    cl_uint count = 0;
    cr_assert_eq(clGetPlatformIDs(1, &p, NULL), CL_SUCCESS);
    cr_assert_eq(clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 8, ids, &count), CL_SUCCESS);
    if (count < 2) cr_assert_fail("PoCL lists %u devices: run with POCL_DEVICES=\"pthread pthread\"", count);
    return ids[n];
}

static mine make_mine(int n, cl_command_queue_properties props) {
    mine m;
    cl_int e;
    m.device = platform_device(n);
    m.context = clCreateContext(NULL, 1, &m.device, NULL, NULL, &e);
    cr_assert_eq(e, CL_SUCCESS);
    m.queue = clCreateCommandQueue(m.context, m.device, props, &e);
    cr_assert_eq(e, CL_SUCCESS);
    return m;
}

static void free_mine(mine *m) {
    cr_assert_eq(clReleaseCommandQueue(m->queue), CL_SUCCESS);
    cr_assert_eq(clReleaseContext(m->context), CL_SUCCESS);
}

static cl_uint context_refs(cl_context c) {
    cl_uint refs = 0;
    cr_assert_eq(clGetContextInfo(c, CL_CONTEXT_REFERENCE_COUNT, sizeof refs, &refs, NULL), CL_SUCCESS);
    return refs;
}

static cl_uint queue_refs(cl_command_queue q) {
    cl_uint refs = 0;
    cr_assert_eq(clGetCommandQueueInfo(q, CL_QUEUE_REFERENCE_COUNT, sizeof refs, &refs, NULL), CL_SUCCESS);
    return refs;
}

/* PoCL's worker threads drop the references their finished commands held a moment after the
   commands complete: a count is compared once the queue is idle and they had up to 2 s. */
static bool refs_settle(cl_command_queue q, cl_context c, cl_uint want_ctx, cl_uint want_queue) {
    clFinish(q);
    for (int i = 0; i < 2000; i++) {
        if (context_refs(c) == want_ctx && queue_refs(q) == want_queue) return true;
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    return false;
}

static gpuarr_device spec_device(const char *spec) {
    gpuarr_device d;
    TEST_OK(gpuarr_device_find(spec, &d));
    return d;
}

static void expect_values(gpuarr_array a, const float *want, size_t n) {
    float got[64];
    cr_assert(n <= 64);
    TEST_OK(gpuarr_to_host(a, got, n));
    for (size_t i = 0; i < n; i++) cr_assert_eq(got[i], want[i], "element %zu: %g, want %g", i, got[i], want[i]);
}

static void expect_refused(gpuarr_result r, gpuarr_result want, const char *words) {
    cr_assert_eq(r, want, "got %s (%s), want %s", gpuarr_result_name(r), gpuarr_last_error(), gpuarr_result_name(want));
    cr_assert(strstr(gpuarr_last_error(), words), "message \"%s\" lacks \"%s\"", gpuarr_last_error(), words);
}

Test(adopt, a_context_of_the_callers_is_a_device_like_any_other) {
    mine m = make_mine(1, 0);
    gpuarr_device d;
    int found = gpuarr_device_count();
    cl_uint refs = context_refs(m.context), qrefs = queue_refs(m.queue); /* PoCL counts its own, too */
    TEST_OK(gpuarr_opencl_adopt(m.context, m.device, m.queue, &d));
    cr_assert_eq(context_refs(m.context), refs + 1, "gpuarr holds one reference");
    cr_assert_eq(queue_refs(m.queue), qrefs + 1, "and one of the queue");
    gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(d, &info));
    gpuarr_device own = spec_device("opencl:1");
    cr_assert(info.adopted);
    cr_assert_eq(info.same_as.id, own.id, "an adopted device is linked to gpuarr's own view of it");
    cr_assert_str_eq(info.spec, "opencl:2");
    cr_assert_eq(spec_device("opencl:2").id, d.id, "its spec finds it");
    cr_assert_eq(gpuarr_device_count(), found + 1, "the devices gpuarr_init found and the adopted one");
    cr_assert_eq(gpuarr_device_at(found).id, d.id);
    cl_context ctx;
    cl_device_id id;
    TEST_OK(gpuarr_opencl_context(d, &ctx));
    TEST_OK(gpuarr_opencl_device_id(d, &id));
    cr_assert_eq(ctx, m.context);
    cr_assert_eq(id, m.device);

    /* arrays there, conversions to and from every other device, the caller's queue as the default stream */
    float xs[40], twice[40];
    for (int i = 0; i < 40; i++) xs[i] = (float)i - 7.5f, twice[i] = 2 * xs[i];
    int64_t n = 40;
    gpuarr_array a, on0, back, h;
    TEST_OK(gpuarr_from_host(d, xs, 1, &n, &a));
    gpuarr_scope sc = gpuarr_scope_enter_device(d);
    cl_command_queue q = NULL;
    gpuarr_stream none = {0};
    TEST_OK(gpuarr_opencl_queue(none, &q));
    gpuarr_scope_leave(&sc);
    cr_assert_eq(q, m.queue, "the default stream runs on the caller's queue");
    TEST_OK(adopt_scale(NULL, 2.0f, a)); /* a portable kernel, built in the caller's context */
    char trace[] = "/tmp/gpuarr-adopt-trace-XXXXXX";
    int fd = mkstemp(trace);
    cr_assert_geq(fd, 0);
    close(fd);
    TEST_OK(gpuarr_trace_start(trace));
    TEST_OK(gpuarr_convert(a, spec_device("opencl:0"), 0, &on0));
    TEST_OK(gpuarr_trace_stop());
    FILE *tf = fopen(trace, "r");
    cr_assert(tf);
    static char text[1 << 16];
    size_t len = fread(text, 1, sizeof text - 1, tf);
    text[len] = 0;
    fclose(tf);
    unlink(trace);
    cr_assert(strstr(text, "opencl:2"), "the trace names the adopted device");
    TEST_OK(gpuarr_convert(on0, d, GPUARR_F64, &back));
    TEST_OK(gpuarr_convert(back, gpuarr_host(), GPUARR_F32, &h));
    expect_values(on0, twice, 40);
    expect_values(h, twice, 40);
    gpuarr_array f16;
    TEST_OK(gpuarr_convert(a, own, GPUARR_F16, &f16)); /* to gpuarr's own context of the same device */
    expect_values(f16, twice, 40);                    /* small integers and halves: exact in f16 */
    int total = 0, own_total = 0, in_use = 0;
    TEST_OK(gpuarr_device_get_slots(d, &total, &in_use));
    TEST_OK(gpuarr_device_get_slots(own, &own_total, &in_use));
    cr_assert_eq(total, own_total, "slots are counted once per physical device");
    TEST_OK(gpuarr_device_set_slots(d, own_total + 3));
    TEST_OK(gpuarr_device_get_slots(own, &own_total, &in_use));
    cr_assert_eq(own_total, total + 3, "the adopted device and gpuarr's own view share their slots");
    for (gpuarr_array *x = (gpuarr_array[]){a, on0, back, h, f16}, *end = x + 5; x < end; x++) TEST_OK(gpuarr_release(*x));

    TEST_OK(gpuarr_device_remove(d));
    cr_assert(refs_settle(m.queue, m.context, refs, qrefs), "gpuarr_device_remove gave the context and the queue back: "
              "%u and %u references, want %u and %u", context_refs(m.context), queue_refs(m.queue), refs, qrefs);
    gpuarr_array late;
    expect_refused(gpuarr_zeros(d, GPUARR_F32, 1, &n, &late), GPUARR_ERROR_INVALID_HANDLE, "removed by gpuarr_device_remove");
    expect_refused(gpuarr_device_find("opencl:2", &d), GPUARR_ERROR_NO_DEVICE, "removed");
    free_mine(&m);
}

static int destroyed; /* the caller's buffer's destructor callback */
static void CL_CALLBACK count_destroyed(cl_mem mem, void *user) {
    (void)mem;
    (void)user;
    __atomic_add_fetch(&destroyed, 1, __ATOMIC_RELAXED);
}

Test(adopt, the_callers_buffers_become_arrays_and_arrays_go_back_as_buffers) {
    mine m = make_mine(0, 0);
    gpuarr_device d;
    TEST_OK(gpuarr_opencl_adopt(m.context, m.device, NULL, &d));
    float xs[16], got[16];
    for (int i = 0; i < 16; i++) xs[i] = (float)(i * i);
    cl_int e;
    cl_mem buf = clCreateBuffer(m.context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof xs, xs, &e);
    cr_assert_eq(e, CL_SUCCESS);
    destroyed = 0;
    cr_assert_eq(clSetMemObjectDestructorCallback(buf, count_destroyed, NULL), CL_SUCCESS);
    int64_t n = 12;
    gpuarr_array w, on1, h;
    TEST_OK(gpuarr_opencl_wrap_mem(d, buf, 4 * sizeof(float), GPUARR_F32, 1, &n, &w)); /* elements 4..15 */
    TEST_OK(gpuarr_convert(w, spec_device("opencl:1"), 0, &on1));
    TEST_OK(gpuarr_convert(on1, gpuarr_host(), 0, &h));
    expect_values(h, xs + 4, 12);
    cr_assert_eq(clReleaseMemObject(buf), CL_SUCCESS);
    cr_assert_eq(destroyed, 0, "the array still holds the caller's buffer");
    TEST_OK(gpuarr_release(w));
    cr_assert_eq(destroyed, 1, "the last of gpuarr's references went with the array");
    gpuarr_array wrong;
    cl_mem other = clCreateBuffer(m.context, CL_MEM_READ_WRITE, 64, NULL, &e);
    expect_refused(gpuarr_opencl_wrap_mem(spec_device("opencl:0"), other, 0, GPUARR_F32, 1, &n, &wrong),
                   GPUARR_ERROR_INVALID_ARGUMENT, "another cl_context");
    clReleaseMemObject(other);

    /* the other way: an array of the adopted device handed to the caller as a buffer of their own */
    gpuarr_array a;
    TEST_OK(gpuarr_from_host(d, xs, 1, &n, &a));
    cl_mem out = NULL;
    TEST_OK(gpuarr_opencl_export_mem(a, &out));
    size_t size = 0;
    cr_assert_eq(clGetMemObjectInfo(out, CL_MEM_SIZE, sizeof size, &size, NULL), CL_SUCCESS);
    cr_assert_eq(size, 12 * sizeof(float), "exactly the array's bytes");
    TEST_OK(gpuarr_release(a)); /* the buffer holds the memory, not the handle */
    memset(got, 0, sizeof got);
    cr_assert_eq(clEnqueueReadBuffer(m.queue, out, CL_TRUE, 0, size, got, 0, NULL, NULL), CL_SUCCESS);
    for (int i = 0; i < 12; i++) cr_assert_eq(got[i], xs[i]);
    expect_refused(gpuarr_device_remove(d), GPUARR_ERROR_INVALID_ARGUMENT, "1 arrays, 0 streams and 0 events alive (exported");
    cr_assert_eq(clReleaseMemObject(out), CL_SUCCESS);
    TEST_OK(gpuarr_device_remove(d)); /* the export let go: its memory went back first */
    for (int i = 0; i < 2; i++) TEST_OK(gpuarr_release(i ? h : on1));
    free_mine(&m);
}

Test(adopt, requirements_the_callers_objects_do_not_meet_are_refused) {
    mine m = make_mine(0, 0), other = make_mine(1, 0);
    gpuarr_device d = {0};
    cl_uint refs = context_refs(m.context);
    expect_refused(gpuarr_opencl_adopt(NULL, m.device, NULL, &d), GPUARR_ERROR_INVALID_ARGUMENT, "cl_context is NULL");
    expect_refused(gpuarr_opencl_adopt(m.context, NULL, NULL, &d), GPUARR_ERROR_INVALID_ARGUMENT, "cl_device_id is NULL");
    expect_refused(gpuarr_opencl_adopt(m.context, other.device, NULL, &d), GPUARR_ERROR_INVALID_ARGUMENT,
                   "not one of cl_context's 1 devices");
    expect_refused(gpuarr_opencl_adopt((cl_context)(void *)m.queue, m.device, NULL, &d), GPUARR_ERROR_INVALID_ARGUMENT,
                   "not a valid cl_context");
    expect_refused(gpuarr_opencl_adopt(m.context, m.device, other.queue, &d), GPUARR_ERROR_INVALID_ARGUMENT, "another context");
    cl_int e;
    cl_command_queue ooo = clCreateCommandQueue(m.context, m.device, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &e);
    if (e == CL_SUCCESS) {
        expect_refused(gpuarr_opencl_adopt(m.context, m.device, ooo, &d), GPUARR_ERROR_INVALID_ARGUMENT, "out of order");
        clReleaseCommandQueue(ooo);
    }
    cr_assert_eq(context_refs(m.context), refs, "a refused adoption keeps nothing");
    TEST_OK(gpuarr_opencl_adopt(m.context, m.device, m.queue, &d));
    gpuarr_device again;
    expect_refused(gpuarr_opencl_adopt(m.context, m.device, NULL, &again), GPUARR_ERROR_INVALID_ARGUMENT, "adopted already, as opencl:2");
    expect_refused(gpuarr_device_remove(spec_device("opencl:0")), GPUARR_ERROR_INVALID_ARGUMENT, "only adopted devices are removed");
    int64_t n = 8;
    gpuarr_array a;
    TEST_OK(gpuarr_zeros(d, GPUARR_F32, 1, &n, &a));
    expect_refused(gpuarr_device_remove(d), GPUARR_ERROR_INVALID_ARGUMENT, "1 arrays, 0 streams and 0 events alive");
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_device_remove(d));
    expect_refused(gpuarr_device_remove(d), GPUARR_ERROR_INVALID_HANDLE, "removed");
    free_mine(&other);
    free_mine(&m);
}

Test(adopt, shutdown_gives_back_what_adopted_devices_hold) {
    mine m = make_mine(1, CL_QUEUE_PROFILING_ENABLE);
    gpuarr_device d;
    cl_uint refs = context_refs(m.context), qrefs = queue_refs(m.queue);
    TEST_OK(gpuarr_opencl_adopt(m.context, m.device, m.queue, &d));
    int64_t n = 1000;
    gpuarr_array a;
    TEST_OK(gpuarr_zeros(d, GPUARR_U8, 1, &n, &a)); /* left for the shutdown, with its default stream */
    cr_assert_gt(queue_refs(m.queue), 1);
    gpuarr_shutdown();
    cr_assert(refs_settle(m.queue, m.context, refs, qrefs), "the context and the queue are the caller's alone again: "
              "%u and %u references, want %u and %u", context_refs(m.context), queue_refs(m.queue), refs, qrefs);
    test_setup(); /* for the fixture's shutdown */
    gpuarr_device stale;
    cr_assert_neq(gpuarr_device_find("opencl:2", &stale), GPUARR_OK, "a new cycle starts without adopted devices");
    free_mine(&m);
}

Test(adopt, leases_plans_and_telemetry_go_through_gpuarrs_own_view) {
    mine m = make_mine(1, 0);
    gpuarr_device d, got;
    TEST_OK(gpuarr_opencl_adopt(m.context, m.device, NULL, &d));
    gpuarr_lease_desc ld = {0};
    ld.devices = "opencl:2";
    gpuarr_lease l;
    TEST_OK(gpuarr_lease_acquire(&ld, &l));
    TEST_OK(gpuarr_lease_device(l, &got));
    cr_assert_eq(got.id, spec_device("opencl:1").id, "the lease is on opencl:1, the same device in gpuarr's context");
    int total = 0, in_use = 0;
    TEST_OK(gpuarr_device_get_slots(d, &total, &in_use));
    cr_assert_eq(in_use, 1, "counted on the one physical device");
    TEST_OK(gpuarr_lease_release(l));
    gpuarr_plan_step steps[2] = {{"adopted", "opencl:2", 0, 0}, {"own", "opencl:1", 0, 0}};
    gpuarr_device placed[2];
    TEST_OK(gpuarr_plan(steps, 2, GPUARR_PLACE_DEFAULT, placed));
    cr_assert_eq(placed[0].id, placed[1].id, "a plan sees one physical device in both");
    cr_assert_eq(placed[0].id, spec_device("opencl:1").id);
    gpuarr_telemetry mine_t, own_t;
    TEST_OK(gpuarr_device_get_telemetry(d, &mine_t));
    TEST_OK(gpuarr_device_get_telemetry(spec_device("opencl:1"), &own_t));
    cr_assert(mine_t.valid & GPUARR_TELEMETRY_MEMORY_TOTAL);
    cr_assert_eq(mine_t.memory_total, own_t.memory_total, "telemetry reports through gpuarr's own view");
    double to_mine = 0, to_own = 0;
    TEST_OK(gpuarr_transfer_estimate_device(gpuarr_host(), d, GPUARR_F32, 1 << 20, &to_mine));
    TEST_OK(gpuarr_transfer_estimate_device(gpuarr_host(), spec_device("opencl:1"), GPUARR_F32, 1 << 20, &to_own));
    cr_assert_eq(to_mine, to_own, "one transfer model for both: %g s and %g s", to_mine, to_own);
    TEST_OK(gpuarr_device_remove(d));
    free_mine(&m);
}

Test(adopt, exports_that_cannot_be_sub_buffers_are_refused) {
    mine m = make_mine(0, 0);
    gpuarr_device d;
    TEST_OK(gpuarr_opencl_adopt(m.context, m.device, NULL, &d));
    cl_int e;
    cl_mem buf = clCreateBuffer(m.context, CL_MEM_READ_WRITE, 4096, NULL, &e);
    cr_assert_eq(e, CL_SUCCESS);
    int64_t n = 16, zero = 0;
    gpuarr_array odd, empty;
    cl_mem out = NULL;
    TEST_OK(gpuarr_opencl_wrap_mem(d, buf, 4, GPUARR_F32, 1, &n, &odd));
    expect_refused(gpuarr_opencl_export_mem(odd, &out), GPUARR_ERROR_INVALID_ARGUMENT, "CL_DEVICE_MEM_BASE_ADDR_ALIGN");
    TEST_OK(gpuarr_empty(d, GPUARR_F32, 1, &zero, &empty));
    expect_refused(gpuarr_opencl_export_mem(empty, &out), GPUARR_ERROR_INVALID_ARGUMENT, "empty");
    expect_refused(gpuarr_opencl_export_mem_raw(odd, NULL), GPUARR_ERROR_INVALID_ARGUMENT, "NULL");
    TEST_OK(gpuarr_release(odd));
    TEST_OK(gpuarr_release(empty));
    clReleaseMemObject(buf);
    TEST_OK(gpuarr_device_remove(d)); /* a refused export holds nothing */
    free_mine(&m);
}

Test(adopt, without_gpuarrs_own_view_of_the_device_adoption_is_refused) {
    mine m = make_mine(1, 0);
    gpuarr_device d;
    gpuarr_shutdown();
    gpuarr_desc desc = {0};
    desc.devices = "host,opencl:0";
    TEST_OK(gpuarr_init(&desc));
    expect_refused(gpuarr_opencl_adopt(m.context, m.device, NULL, &d), GPUARR_ERROR_INVALID_ARGUMENT, "GPUARR_DEVICES leaves it out");
    gpuarr_shutdown();
    desc.devices = "host";
    TEST_OK(gpuarr_init(&desc));
    expect_refused(gpuarr_opencl_adopt(m.context, m.device, NULL, &d), GPUARR_ERROR_UNSUPPORTED, "the opencl backend is not loaded");
    gpuarr_shutdown();
    test_setup();
    free_mine(&m);
}

Test(adopt, a_cycle_adopts_64_devices_at_most) {
    mine m = make_mine(0, 0);
    gpuarr_device d;
    for (int i = 0; i < 64; i++) {
        TEST_OK(gpuarr_opencl_adopt(m.context, m.device, NULL, &d));
        TEST_OK(gpuarr_device_remove(d));
    }
    expect_refused(gpuarr_opencl_adopt(m.context, m.device, NULL, &d), GPUARR_ERROR_OUT_OF_MEMORY, "64 devices were adopted");
    gpuarr_shutdown();
    test_setup();
    TEST_OK(gpuarr_opencl_adopt(m.context, m.device, NULL, &d)); /* a new cycle starts afresh */
    TEST_OK(gpuarr_device_remove(d));
    free_mine(&m);
}

/* Other threads keep working on gpuarr's own devices, and look the registry over, while this
   one adopts and removes (make check runs it under TSan). */
typedef struct busy {
    gpuarr_device dev;
    int rounds;
    int failures;
} busy;

static void *busy_thread(void *arg) {
    busy *b = arg;
    float xs[256], got[256];
    int64_t n = 256;
    for (int i = 0; i < 256; i++) xs[i] = (float)i;
    for (int r = 0; r < b->rounds; r++) {
        gpuarr_array a, h;
        if (gpuarr_from_host(b->dev, xs, 1, &n, &a) != GPUARR_OK) b->failures++;
        else {
            if (gpuarr_convert(a, gpuarr_host(), 0, &h) != GPUARR_OK || gpuarr_to_host(h, got, 256) != GPUARR_OK ||
                memcmp(got, xs, sizeof xs) != 0)
                b->failures++;
            else gpuarr_release(h);
            gpuarr_release(a);
        }
        for (int k = 0; k < gpuarr_device_count(); k++) { /* rows appear while this reads them */
            gpuarr_device_info info;
            gpuarr_device d = gpuarr_device_at(k);
            gpuarr_result r = d.id ? gpuarr_device_get_info(d, &info) : GPUARR_OK;
            if (r != GPUARR_OK && r != GPUARR_ERROR_INVALID_HANDLE) b->failures++; /* a removed one: refused */
        }
    }
    return NULL;
}

Test(adopt, adoption_and_removal_while_other_threads_work) {
    mine m = make_mine(1, 0);
    busy work[2] = {{spec_device("opencl:0"), 40, 0}, {gpuarr_host(), 40, 0}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&t[i], NULL, busy_thread, &work[i]), 0);
    float xs[16], got[16];
    int64_t n = 16;
    for (int i = 0; i < 16; i++) xs[i] = (float)-i;
    for (int round = 0; round < 20; round++) {
        gpuarr_device d;
        gpuarr_array a;
        TEST_OK(gpuarr_opencl_adopt(m.context, m.device, round % 2 ? m.queue : NULL, &d));
        TEST_OK(gpuarr_from_host(d, xs, 1, &n, &a));
        TEST_OK(gpuarr_to_host(a, got, 16));
        cr_assert_eq(memcmp(got, xs, sizeof xs), 0);
        TEST_OK(gpuarr_release(a));
        TEST_OK(gpuarr_device_remove(d));
    }
    for (int i = 0; i < 2; i++) cr_assert_eq(pthread_join(t[i], NULL), 0);
    cr_assert_eq(work[0].failures + work[1].failures, 0);
    free_mine(&m);
}
