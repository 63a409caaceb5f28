/*
 * test_offload_kernels.c -- tasks made from portable kernels (desc.kernel) run by gpuarr_offload
 * and gpuarr_map on the host and the device GPUARR_TEST_DEVICE names, with no implementation of
 * their own; gpuarr_map's item_devices; an implementation's own message (gpuarr_set_error) in
 * the call's error; and the errors of a kernel task's desc. Each test has its own cache folder,
 * so models never leak between tests or runs. A device whose backend runs no portable kernels
 * (yet) skips the tests that need it, saying why.
 */
#include "test_common.h"

#include <tgmath.h>
#include <unistd.h>

static char cache_dir[64];

static void setup(void) {
    snprintf(cache_dir, sizeof cache_dir, "/tmp/gpuarr-test-offk-XXXXXX");
    cr_assert_not_null(mkdtemp(cache_dir));
    cr_assert_eq(setenv("GPUARR_CACHE_DIR", cache_dir, 1), 0);
    test_setup();
}

static void teardown(void) {
    test_teardown();
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", cache_dir);
}

TestSuite(offload_kernels, .init = setup, .fini = teardown);

/* Two inputs, two outputs of other dtypes, a scalar: y = a * x + k (as f64), z = x - a. */
GPUARR_KERNEL(kt_affine, (GPUARR_SCALAR(float, a), GPUARR_IN(float, x), GPUARR_IN(int32_t, k), GPUARR_OUT(double, y),
                          GPUARR_OUT(float, z)), {
    int64_t i = gpuarr_index(0);
    y[i] = (double)(a * x[i]) + (double)k[i];
    z[i] = x[i] - a;
})

GPUARR_KERNEL(kt_inout, (GPUARR_IN(float, x), GPUARR_INOUT(float, y)), {
    int64_t i = gpuarr_index(0);
    y[i] += x[i];
})

GPUARR_KERNEL(kt_fill, (GPUARR_SCALAR(int32_t, v), GPUARR_OUT(int32_t, y)), {
    y[gpuarr_index(0)] = v;
})

static const float kt_a = 1.5f;

static gpuarr_task affine_task(void) {
    gpuarr_task_desc td;
    memset(&td, 0, sizeof td);
    td.kernel = &kt_affine_gpuarr_kernel;
    float a = kt_a; /* copied at create: the local may go */
    td.kernel_scalars[0] = &a;
    gpuarr_task t;
    TEST_OK(gpuarr_task_create(&td, &t));
    return t;
}

/* Item i's inputs on the host: x (given as i16: the task converts it to the kernel's f32) and k. */
#define N 1000
static void make_inputs(int item, gpuarr_array *in) {
    int16_t x[N];
    int32_t k[N];
    for (int j = 0; j < N; j++) x[j] = (int16_t)(j - 300 + item), k[j] = j * 3 - item;
    int64_t n = N;
    TEST_OK(gpuarr_from_host_as(gpuarr_host(), GPUARR_I16, x, 1, &n, &in[0]));
    TEST_OK(gpuarr_from_host_as(gpuarr_host(), GPUARR_I32, k, 1, &n, &in[1]));
}

/* out[0..1] against the same arithmetic here. */
static void check_outputs(int item, const gpuarr_array *out) {
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(out[0], &info));
    cr_assert_eq(info.dtype, GPUARR_F64);
    cr_assert_eq(info.count, N);
    TEST_OK(gpuarr_array_get_info(out[1], &info));
    cr_assert_eq(info.dtype, GPUARR_F32);
    double y[N];
    float z[N];
    TEST_OK(gpuarr_read(out[0], 0, N, GPUARR_F64, y));
    TEST_OK(gpuarr_read(out[1], 0, N, GPUARR_F32, z));
    for (int j = 0; j < N; j++) {
        float x = (float)(j - 300 + item);
        double want_y = (double)(kt_a * x) + (double)(j * 3 - item);
        cr_assert_eq(test_f64_bits(y[j]), test_f64_bits(want_y), "item %d: y[%d] = %.17g, want %.17g", item, j, y[j], want_y);
        cr_assert_eq(test_f32_bits(z[j]), test_f32_bits(x - kt_a), "item %d: z[%d] = %.9g, want %.9g", item, j, (double)z[j],
                     (double)(x - kt_a));
    }
}

static void release(gpuarr_array *a, int n) {
    for (int i = 0; i < n; i++) gpuarr_release(a[i]);
}

/* Skips when the test device's backend runs no portable kernels (a CUDA backend without them). */
static void need_kernels(gpuarr_device d) {
    float x = 1, y = 0;
    int64_t n = 1;
    gpuarr_array ax, ay;
    TEST_OK(gpuarr_from_host(d, &x, 1, &n, &ax));
    TEST_OK(gpuarr_from_host(d, &y, 1, &n, &ay));
    gpuarr_result r = kt_inout(NULL, ax, ay);
    char why[1200];
    snprintf(why, sizeof why, "%s", gpuarr_last_error());
    gpuarr_release(ax);
    gpuarr_release(ay);
    if (r == GPUARR_ERROR_UNSUPPORTED) test_skip("%s runs no portable kernels here: %s", test_device_spec(), why);
    cr_assert_eq(r, GPUARR_OK, "a kernel on %s: %s", test_device_spec(), why);
}

Test(offload_kernels, a_kernel_task_runs_on_the_host_and_the_test_device_with_no_implementation) {
    gpuarr_device dev = test_device();
    need_kernels(dev);
    gpuarr_task t = affine_task();
    const char *where[2] = {"host", test_device_spec()};
    for (int w = 0; w < 2; w++) {
        gpuarr_array in[2], out[2];
        make_inputs(w, in);
        gpuarr_offload_desc od;
        memset(&od, 0, sizeof od);
        od.devices = where[w];
        gpuarr_device on = {0};
        TEST_OK(gpuarr_offload(t, in, 2, out, 2, &od, &on));
        cr_assert_eq(on.id, w ? dev.id : gpuarr_host().id, "ran on the wrong device for devices = %s", where[w]);
        gpuarr_array_info info;
        TEST_OK(gpuarr_array_get_info(out[0], &info));
        cr_assert_eq(info.device.id, on.id, "the outputs are made where it ran");
        check_outputs(w, out);
        release(in, 2);
        release(out, 2);
    }
    /* the name defaults to the kernel's: the models are kept under it */
    gpuarr_task_stats st;
    TEST_OK(gpuarr_task_get_stats(t, gpuarr_host(), &st));
    cr_assert_eq(st.calls, test_device_is_host(dev) ? 2u : 1u);
    char summary[4096];
    TEST_OK(gpuarr_task_models_summary(summary, sizeof summary));
    cr_assert(strstr(summary, "task kt_affine on host") != NULL, "%s", summary);
    TEST_OK(gpuarr_task_destroy(t));
}

Test(offload_kernels, map_over_16_items_reports_each_items_device) {
    gpuarr_device dev = test_device();
    need_kernels(dev);
    gpuarr_task t = affine_task();
    enum { ITEMS = 16 };
    gpuarr_array in[ITEMS * 2], out[ITEMS * 2];
    for (int i = 0; i < ITEMS; i++) make_inputs(i, &in[i * 2]);
    char devices[80];
    snprintf(devices, sizeof devices, "host,%s", test_device_spec());
    gpuarr_device ran[ITEMS];
    memset(ran, 0, sizeof ran);
    gpuarr_offload_desc od;
    memset(&od, 0, sizeof od);
    od.devices = test_device_is_host(dev) ? "host" : devices;
    od.item_devices = ran;
    TEST_OK(gpuarr_map(t, in, ITEMS, out, &od, NULL));
    for (int i = 0; i < ITEMS; i++) {
        cr_assert(ran[i].id == gpuarr_host().id || ran[i].id == dev.id, "item %d ran on device id %u: not a candidate", i, ran[i].id);
        gpuarr_array_info info;
        TEST_OK(gpuarr_array_get_info(out[i * 2], &info));
        cr_assert_eq(info.device.id, ran[i].id, "item %d: item_devices says %u, its output is on %u", i, ran[i].id, info.device.id);
        check_outputs(i, &out[i * 2]);
    }
    release(in, ITEMS * 2);
    release(out, ITEMS * 2);
    TEST_OK(gpuarr_task_destroy(t));
}

/* Fails item `*(int *)user` with its own message; the others widen in[0] to f64. */
static gpuarr_result picky(const gpuarr_array *in, int n_in, gpuarr_array *out, int n_out, gpuarr_stream s, void *user) {
    (void)n_in, (void)n_out;
    float first = 0;
    gpuarr_result r = gpuarr_read(in[0], 0, 1, GPUARR_F32, &first);
    if (r != GPUARR_OK) return r;
    if ((int)first == *(const int *)user) return gpuarr_set_error(GPUARR_ERROR_BACKEND, "value %d refused, %s", (int)first, "politely");
    return gpuarr_convert_async(in[0], gpuarr_current_device(), GPUARR_F64, s, &out[0]);
}

Test(offload_kernels, an_implementations_own_message_is_in_the_maps_error) {
    int bad = 5;
    gpuarr_task_desc td;
    memset(&td, 0, sizeof td);
    td.name = "picky";
    td.impl[GPUARR_BACKEND_HOST] = picky;
    td.n_in = td.n_out = 1;
    td.user_data = &bad;
    gpuarr_task t;
    TEST_OK(gpuarr_task_create(&td, &t));
    enum { ITEMS = 8 };
    gpuarr_array in[ITEMS], out[ITEMS];
    int64_t n = 4;
    for (int i = 0; i < ITEMS; i++) {
        float v[4] = {(float)i, 0, 0, 0};
        TEST_OK(gpuarr_from_host(gpuarr_host(), v, 1, &n, &in[i]));
    }
    gpuarr_device ran[ITEMS];
    for (int i = 0; i < ITEMS; i++) ran[i].id = 77;
    gpuarr_offload_desc od;
    memset(&od, 0, sizeof od);
    od.devices = "host";
    od.item_devices = ran;
    int failed = -1;
    TEST_FAIL_WITH(gpuarr_map(t, in, ITEMS, out, &od, &failed), GPUARR_ERROR_BACKEND,
                   "gpuarr_map: item 5: task \"picky\" on host: value 5 refused, politely");
    cr_assert_eq(failed, 5);
    for (int i = 0; i < ITEMS; i++) cr_assert_eq(ran[i].id, 77u, "item_devices is written on success only (entry %d)", i);
    /* gpuarr_offload too */
    gpuarr_array o;
    TEST_FAIL_WITH(gpuarr_offload(t, &in[5], 1, &o, 1, &od, NULL), GPUARR_ERROR_BACKEND,
                   "gpuarr_offload: task \"picky\" on host: value 5 refused, politely");
    release(in, ITEMS);
    TEST_OK(gpuarr_task_destroy(t));
}

Test(offload_kernels, set_error_leaves_the_callers_words_and_refuses_what_is_not_an_error) {
    cr_assert_eq(gpuarr_set_error(GPUARR_ERROR_TIMEOUT, "waited %d s", 3), GPUARR_ERROR_TIMEOUT);
    cr_assert_str_eq(gpuarr_last_error(), "waited 3 s");
    TEST_FAIL_WITH(gpuarr_set_error(GPUARR_OK, "fine"), GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_set_error: r = 0 is not an error result");
    TEST_FAIL_WITH(gpuarr_set_error((gpuarr_result)-12345, "%s", "x"), GPUARR_ERROR_INVALID_ARGUMENT, "is not an error result");
    TEST_FAIL_WITH(gpuarr_set_error(GPUARR_ERROR_BACKEND, NULL), GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_set_error: fmt is NULL");
    /* a later failing call names itself again */
    TEST_FAIL_WITH(gpuarr_task_create(NULL, NULL), GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_task_create: desc is NULL");
}

static gpuarr_result unused_impl(const gpuarr_array *in, int n_in, gpuarr_array *out, int n_out, gpuarr_stream s, void *user) {
    (void)in, (void)n_in, (void)out, (void)n_out, (void)s, (void)user;
    return GPUARR_ERROR_BACKEND;
}

Test(offload_kernels, a_kernel_tasks_desc_errors_name_the_field) {
    float a = 1;
    gpuarr_task t = {0};
    gpuarr_task_desc td;
#define RESET() (memset(&td, 0, sizeof td), td.kernel = &kt_affine_gpuarr_kernel, td.kernel_scalars[0] = &a)
    RESET();
    td.impl[GPUARR_BACKEND_HOST] = unused_impl;
    TEST_FAIL_WITH(gpuarr_task_create(&td, &t), GPUARR_ERROR_INVALID_ARGUMENT, "desc->impl[1] and desc->kernel are both set");
    RESET();
    td.kernel = &kt_inout_gpuarr_kernel;
    td.kernel_scalars[0] = NULL;
    TEST_FAIL_WITH(gpuarr_task_create(&td, &t), GPUARR_ERROR_INVALID_ARGUMENT, "kt_inout: parameter y is INOUT");
    RESET();
    td.n_in = 1;
    TEST_FAIL_WITH(gpuarr_task_create(&td, &t), GPUARR_ERROR_INVALID_ARGUMENT, "desc->n_in = 1, but kernel kt_affine has 2 IN parameters");
    RESET();
    td.n_out = 3;
    TEST_FAIL_WITH(gpuarr_task_create(&td, &t), GPUARR_ERROR_INVALID_ARGUMENT, "desc->n_out = 3, but kernel kt_affine has 2 OUT");
    RESET();
    td.kernel_scalars[0] = NULL;
    TEST_FAIL_WITH(gpuarr_task_create(&td, &t), GPUARR_ERROR_INVALID_ARGUMENT, "desc->kernel_scalars[0] is NULL, but kernel kt_affine's parameter a");
    RESET();
    td.kernel_scalars[1] = &a;
    TEST_FAIL_WITH(gpuarr_task_create(&td, &t), GPUARR_ERROR_INVALID_ARGUMENT, "desc->kernel_scalars[1] is set, but parameter x is an array");
    RESET();
    td.kernel_scalars[9] = &a;
    TEST_FAIL_WITH(gpuarr_task_create(&td, &t), GPUARR_ERROR_INVALID_ARGUMENT, "desc->kernel_scalars[9] is set, but the kernel has fewer");
    RESET();
    td.in_dtype[1] = GPUARR_F32;
    TEST_FAIL_WITH(gpuarr_task_create(&td, &t), GPUARR_ERROR_INVALID_ARGUMENT, "desc->in_dtype[1] = ");
    RESET();
    td.kernel = &kt_fill_gpuarr_kernel;
    TEST_FAIL_WITH(gpuarr_task_create(&td, &t), GPUARR_ERROR_INVALID_ARGUMENT, "kt_fill has 0 IN parameters");
    RESET();
    td.name = "bad name";
    TEST_FAIL_WITH(gpuarr_task_create(&td, &t), GPUARR_ERROR_INVALID_ARGUMENT, "desc->name = \"bad name\"");
    gpuarr_kernel forged = kt_affine_gpuarr_kernel;
    forged.nparams = 0;
    RESET();
    td.kernel = &forged;
    TEST_FAIL_WITH(gpuarr_task_create(&td, &t), GPUARR_ERROR_INVALID_ARGUMENT, "desc->kernel: k is not a kernel GPUARR_KERNEL made");
    cr_assert_eq(t.id, 0u, "no task was made");
    /* n_in, n_out set to the kernel's, and a name of one's own, are fine; the call checks n_in */
    RESET();
    td.n_in = 2, td.n_out = 2, td.name = "affine.mine";
    TEST_OK(gpuarr_task_create(&td, &t));
    gpuarr_array in[3], out[2];
    make_inputs(0, in);
    in[2] = in[1];
    TEST_FAIL_WITH(gpuarr_offload(t, in, 3, out, 2, NULL, NULL), GPUARR_ERROR_INVALID_ARGUMENT, "n_in = 3, but task \"affine.mine\" has 2");
    gpuarr_offload_desc od;
    memset(&od, 0, sizeof od);
    od.devices = "host";
    TEST_OK(gpuarr_offload(t, in, 2, out, 2, &od, NULL));
    release(out, 2);
    release(in, 2);
    TEST_OK(gpuarr_task_destroy(t));
#undef RESET
}
