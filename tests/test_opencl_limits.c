/*
 * test_opencl_limits.c -- white-box tests of the OpenCL backend against limits that PoCL's CPU
 * devices do not have: a cast kernel whose CL_KERNEL_WORK_GROUP_SIZE is below the 256 work-items
 * gpuarr prefers (a GPU kernel that uses many registers). The loader's entry points are
 * replaced in the backend's table by ones that report the lower limit and refuse, as a driver
 * does, a launch above it. Runs on PoCL (POCL_DEVICES="pthread pthread").
 * This file compiles the implementation itself (it is linked without gpuarr.o).
 */
#define GPUARR_IMPLEMENTATION
#include "test_common.h"

enum { KERNEL_LIMIT = 48 };

static gpuarr__cl_int (*real_enqueue)(gpuarr__cl_command_queue, gpuarr__cl_kernel, gpuarr__cl_uint, const size_t *,
                                      const size_t *, const size_t *, gpuarr__cl_uint, const gpuarr__cl_event *, gpuarr__cl_event *);
static gpuarr__cl_int (*real_group_info)(gpuarr__cl_kernel, gpuarr__cl_device_id, gpuarr__cl_uint, size_t, void *, size_t *);
static int launches;

static gpuarr__cl_int limited_group_info(gpuarr__cl_kernel k, gpuarr__cl_device_id dev, gpuarr__cl_uint what, size_t size,
                                         void *value, size_t *size_ret) {
    gpuarr__cl_int e = real_group_info(k, dev, what, size, value, size_ret);
    if (e == GPUARR__CL_SUCCESS && what == GPUARR__CL_KERNEL_WORK_GROUP_SIZE && size == sizeof(size_t))
        *(size_t *)value = GPUARR__MIN(*(size_t *)value, (size_t)KERNEL_LIMIT);
    return e;
}

static gpuarr__cl_int limited_enqueue(gpuarr__cl_command_queue q, gpuarr__cl_kernel k, gpuarr__cl_uint dims, const size_t *offset,
                                      const size_t *global, const size_t *local, gpuarr__cl_uint n, const gpuarr__cl_event *wait,
                                      gpuarr__cl_event *ev) {
    launches++;
    if (local && local[0] > KERNEL_LIMIT) return -54; /* CL_INVALID_WORK_GROUP_SIZE */
    return real_enqueue(q, k, dims, offset, global, local, n, wait, ev);
}

static gpuarr_device opencl0(void) {
    gpuarr_device d = {0};
    gpuarr_result r = gpuarr_device_find("opencl:0", &d);
    if (r != GPUARR_OK && test_devices_required()) cr_assert_fail("opencl:0 is absent but GPUARR_TEST_REQUIRE=1: %s", gpuarr_last_error());
    if (r != GPUARR_OK) test_skip("opencl:0 is absent (run with POCL_DEVICES=\"pthread pthread\"): %s", gpuarr_last_error());
    return d;
}

TestSuite(opencl_limits, .init = test_setup, .fini = test_teardown);

Test(opencl_limits, cast_kernels_launch_within_the_kernels_work_group_limit) {
    gpuarr_device d = opencl0();
    gpuarr__cl_state *cl = &GPUARR__CL;
    real_enqueue = cl->clEnqueueNDRangeKernel;
    real_group_info = cl->clGetKernelWorkGroupInfo;
    cl->clEnqueueNDRangeKernel = limited_enqueue;
    cl->clGetKernelWorkGroupInfo = limited_group_info;
    enum { N = 1000 }; /* not a multiple of the limit: the last group is partial */
    float in[N];
    int32_t out[N];
    for (int i = 0; i < N; i++) in[i] = (float)i - 500.25f;
    int64_t shape[1] = {N};
    gpuarr_array f, i32;
    TEST_OK(gpuarr_from_host(d, in, 1, shape, &f));
    TEST_OK(gpuarr_convert(f, d, GPUARR_I32, &i32)); /* same device: the cast kernel runs there */
    TEST_OK(gpuarr_to_host(i32, out, N));
    cr_assert(launches > 0, "no cast kernel was launched: the test checked nothing");
    for (int i = 0; i < N; i++) cr_assert_eq(out[i], (int32_t)in[i], "element %d: %d", i, out[i]);
    TEST_OK(gpuarr_release(i32));
    TEST_OK(gpuarr_release(f));
}
