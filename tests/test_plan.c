/*
 * test_plan.c -- gpuarr_plan (the manual's PLANS): a device per step of a pipeline before
 * anything runs. Host steps go to the host, a pipeline's device steps to one device while it can
 * take them, the rest to the next; capacity (device memory, or a pool's limit) and fp64 are
 * checked; a step no device can take fails the call naming it, with out untouched; every bad
 * argument is named. Tests that need two PoCL devices (POCL_DEVICES="pthread pthread") skip
 * without them, saying so. The CUDA and OpenCL views of one GPU: test_lease_links.
 */
#include "test_common.h"

TestSuite(plan, .init = test_setup, .fini = test_teardown);

#define SENTINEL 0x5eed5eedu

static void expect_plan(const gpuarr_plan_step *steps, int count, gpuarr_placement placement, const gpuarr_device *want) {
    gpuarr_device out[8];
    for (int i = 0; i < 8; i++) out[i].id = SENTINEL;
    TEST_OK(gpuarr_plan(steps, count, placement, out));
    for (int i = 0; i < count; i++) {
        gpuarr_device_info a, b;
        TEST_OK(gpuarr_device_get_info(out[i], &a));
        TEST_OK(gpuarr_device_get_info(want[i], &b));
        cr_assert_eq(out[i].id, want[i].id, "steps[%d]: %s, expected %s", i, a.spec, b.spec);
    }
}

static gpuarr_device find_or_skip(const char *spec) {
    gpuarr_device d;
    if (gpuarr_device_find(spec, &d) != GPUARR_OK) test_skip("needs %s (POCL_DEVICES=\"pthread pthread\"): %s", spec, gpuarr_last_error());
    return d;
}

static uint64_t total_memory(gpuarr_device d) {
    gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(d, &info));
    return info.total_memory;
}

Test(plan, host_steps_go_to_the_host_and_device_steps_to_one_device) {
    gpuarr_device dev = test_device(), host = gpuarr_host();
    const char *spec = test_device_spec();
    gpuarr_plan_step steps[4] = {{"decode", "host", 0, 0}, {"denoise", spec, 0, 1 << 20}, {"segment", spec, 0, 0}, {NULL, "host", 0, 0}};
    expect_plan(steps, 4, GPUARR_PLACE_DEFAULT, (gpuarr_device[]){host, dev, dev, host});
}

Test(plan, a_pipeline_stays_on_one_device_and_goes_to_the_least_leased) {
    gpuarr_device cl0 = find_or_skip("opencl:0"), cl1 = find_or_skip("opencl:1");
    gpuarr_plan_step steps[3] = {{"a", "opencl:*", 0, 0}, {"b", "opencl:*", 0, 0}, {"c", "opencl:*", 0, 0}};
    expect_plan(steps, 3, GPUARR_PLACE_DEFAULT, (gpuarr_device[]){cl0, cl0, cl0}); /* a tie: list order */
    TEST_OK(gpuarr_device_set_slots(cl0, 2));
    TEST_OK(gpuarr_device_set_slots(cl1, 2));
    gpuarr_lease_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.devices = "opencl:0";
    gpuarr_lease l;
    TEST_OK(gpuarr_lease_acquire(&ld, &l));
    expect_plan(steps, 3, GPUARR_PLACE_DEFAULT, (gpuarr_device[]){cl1, cl1, cl1});
    expect_plan(steps, 3, GPUARR_PLACE_LEAST_LEASED, (gpuarr_device[]){cl1, cl1, cl1});
    TEST_OK(gpuarr_lease_release(l));
    expect_plan(steps, 3, GPUARR_PLACE_DEFAULT, (gpuarr_device[]){cl0, cl0, cl0});
    int total, in_use; /* a plan reserves nothing */
    TEST_OK(gpuarr_device_get_slots(cl0, &total, &in_use));
    cr_assert_eq(in_use, 0);
}

Test(plan, most_free_puts_free_memory_before_leases) {
    gpuarr_device cl0 = find_or_skip("opencl:0"), cl1 = find_or_skip("opencl:1");
    gpuarr_plan_step steps[2] = {{"a", "opencl:*", 0, 0}, {"b", "opencl:*", 0, 0}};
    TEST_OK(gpuarr_device_set_slots(cl1, 2));
    gpuarr_lease_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.devices = "opencl:1";
    gpuarr_lease l;
    TEST_OK(gpuarr_lease_acquire(&ld, &l));
    TEST_OK(gpuarr_pool_set_limit(cl0, 64 << 20)); /* opencl:0: at most 64 MiB free */
    expect_plan(steps, 2, GPUARR_PLACE_DEFAULT, (gpuarr_device[]){cl0, cl0});
    expect_plan(steps, 2, GPUARR_PLACE_MOST_FREE, (gpuarr_device[]){cl1, cl1});
    TEST_OK(gpuarr_lease_release(l));
    TEST_OK(gpuarr_pool_set_limit(cl0, 0));
}

Test(plan, round_robin_sends_each_plan_to_the_next_device) {
    gpuarr_device cl0 = find_or_skip("opencl:0"), cl1 = find_or_skip("opencl:1");
    gpuarr_plan_step steps[2] = {{"a", "opencl:*", 0, 0}, {"b", "opencl:*", 0, 0}};
    gpuarr_device out[2];
    TEST_OK(gpuarr_plan(steps, 2, GPUARR_PLACE_ROUND_ROBIN, out));
    gpuarr_device first = out[0], second = first.id == cl0.id ? cl1 : cl0;
    cr_assert_eq(out[1].id, first.id, "both steps on one device");
    expect_plan(steps, 2, GPUARR_PLACE_ROUND_ROBIN, (gpuarr_device[]){second, second});
    expect_plan(steps, 2, GPUARR_PLACE_ROUND_ROBIN, (gpuarr_device[]){first, first});
}

Test(plan, the_device_that_takes_most_steps_takes_them_and_the_rest_go_elsewhere) {
    gpuarr_device cl0 = find_or_skip("opencl:0"), cl1 = find_or_skip("opencl:1"), host = gpuarr_host();
    gpuarr_plan_step steps[5] = {
        {"only0", "opencl:0", 0, 0}, {"either", "opencl:*", 0, 0}, {"only1", "opencl:1", 0, 0}, {"one", "opencl:1", 0, 0}, {"cpu", "host", 0, 0}};
    expect_plan(steps, 5, GPUARR_PLACE_DEFAULT, (gpuarr_device[]){cl0, cl1, cl1, cl1, host});
    steps[2].devices = steps[3].devices = "opencl:0,host"; /* now opencl:0 takes four: the host is left its own */
    expect_plan(steps, 5, GPUARR_PLACE_DEFAULT, (gpuarr_device[]){cl0, cl0, cl0, cl0, host});
}

Test(plan, a_step_needing_more_memory_than_any_device_has_fails_naming_it) {
    gpuarr_device dev = test_device(), host = gpuarr_host();
    char list[64];
    snprintf(list, sizeof list, "host,%s", test_device_spec());
    uint64_t most = total_memory(dev) > total_memory(host) ? total_memory(dev) : total_memory(host);
    gpuarr_plan_step steps[2] = {{"load", "host", 0, 0}, {"huge", list, 0, most + 1}};
    gpuarr_device out[2] = {{SENTINEL}, {SENTINEL}};
    TEST_FAIL_WITH(gpuarr_plan(steps, 2, GPUARR_PLACE_DEFAULT, out), GPUARR_ERROR_NO_DEVICE, "steps[1] (\"huge\"): no device can take it");
    cr_assert(strstr(gpuarr_last_error(), "host has ") && strstr(gpuarr_last_error(), "the step needs"), "%s", gpuarr_last_error());
    cr_assert(out[0].id == SENTINEL && out[1].id == SENTINEL, "out written on failure");
    steps[1].memory_bytes = total_memory(dev); /* exactly what it has fits */
    steps[1].devices = test_device_spec();
    expect_plan(steps, 2, GPUARR_PLACE_DEFAULT, (gpuarr_device[]){host, dev});
}

Test(plan, a_pool_limit_lowers_what_a_device_can_take) {
    gpuarr_device dev = test_device(), host = gpuarr_host();
    if (test_device_is_host(dev)) test_skip("needs a device besides the host (GPUARR_TEST_DEVICE=host)");
    char list[64];
    snprintf(list, sizeof list, "%s,host", test_device_spec());
    gpuarr_plan_step steps[1] = {{"big", test_device_spec(), 0, 2 << 20}};
    expect_plan(steps, 1, GPUARR_PLACE_DEFAULT, (gpuarr_device[]){dev});
    TEST_OK(gpuarr_pool_set_limit(dev, 1 << 20));
    TEST_FAIL_WITH(gpuarr_plan(steps, 1, GPUARR_PLACE_DEFAULT, (gpuarr_device[1]){{0}}), GPUARR_ERROR_NO_DEVICE, "has 1.0 MiB, the step needs 2.0 MiB");
    steps[0].devices = list;
    expect_plan(steps, 1, GPUARR_PLACE_DEFAULT, (gpuarr_device[]){host});
    TEST_OK(gpuarr_pool_set_limit(dev, 0));
    steps[0].devices = test_device_spec();
    expect_plan(steps, 1, GPUARR_PLACE_DEFAULT, (gpuarr_device[]){dev});
}

Test(plan, an_fp64_step_avoids_an_opencl_device_without_doubles) {
    gpuarr_shutdown();
    cr_assert_eq(setenv("GPUARR_OPENCL_FP64", "off", 1), 0);
    gpuarr_result r = gpuarr_init(NULL);
    unsetenv("GPUARR_OPENCL_FP64");
    TEST_OK(r);
    gpuarr_device cl0 = find_or_skip("opencl:0"), host = gpuarr_host();
    gpuarr_plan_step steps[2] = {{"f32", "opencl:0", 0, 0}, {"f64", "opencl:0,host", GPUARR_NEED_FP64, 0}};
    expect_plan(steps, 2, GPUARR_PLACE_DEFAULT, (gpuarr_device[]){cl0, host});
    steps[0].devices = "opencl:0,host"; /* the host can take both: one device for the pipeline */
    expect_plan(steps, 2, GPUARR_PLACE_DEFAULT, (gpuarr_device[]){host, host});
    steps[1].devices = "opencl:0";
    TEST_FAIL_WITH(gpuarr_plan(steps, 2, GPUARR_PLACE_DEFAULT, (gpuarr_device[2]){{0}}), GPUARR_ERROR_NO_DEVICE,
                   "steps[1] (\"f64\"): no device can take it: opencl:0 has no fp64");
}

Test(plan, a_cuda_device_and_the_host_have_fp64) {
    gpuarr_device dev = test_device();
    if (strncmp(test_device_spec(), "opencl", 6) == 0) test_skip("fp64 on OpenCL depends on cl_khr_fp64 (the test above)");
    gpuarr_plan_step steps[1] = {{"f64", test_device_spec(), GPUARR_NEED_FP64, 0}};
    expect_plan(steps, 1, GPUARR_PLACE_DEFAULT, (gpuarr_device[]){dev});
}

Test(plan, bad_arguments_are_named) {
    test_device();
    gpuarr_plan_step ok = {"s", "host", 0, 0}, steps[2] = {{"s", "host", 0, 0}, {"t", "host", 0, 0}};
    gpuarr_device out[2] = {{SENTINEL}, {SENTINEL}};
    TEST_FAIL_WITH(gpuarr_plan(NULL, 1, GPUARR_PLACE_DEFAULT, out), GPUARR_ERROR_INVALID_ARGUMENT, "steps is NULL");
    TEST_FAIL_WITH(gpuarr_plan(&ok, 1, GPUARR_PLACE_DEFAULT, NULL), GPUARR_ERROR_INVALID_ARGUMENT, "out is NULL");
    TEST_FAIL_WITH(gpuarr_plan(&ok, 0, GPUARR_PLACE_DEFAULT, out), GPUARR_ERROR_INVALID_ARGUMENT, "count = 0");
    TEST_FAIL_WITH(gpuarr_plan(&ok, -3, GPUARR_PLACE_DEFAULT, out), GPUARR_ERROR_INVALID_ARGUMENT, "count = -3");
    TEST_FAIL_WITH(gpuarr_plan(&ok, 5000, GPUARR_PLACE_DEFAULT, out), GPUARR_ERROR_INVALID_ARGUMENT, "count = 5000");
    TEST_FAIL_WITH(gpuarr_plan(&ok, 1, (gpuarr_placement)9, out), GPUARR_ERROR_INVALID_ARGUMENT, "placement = 9");
    steps[1].needs = 0x80;
    TEST_FAIL_WITH(gpuarr_plan(steps, 2, GPUARR_PLACE_DEFAULT, out), GPUARR_ERROR_INVALID_ARGUMENT, "steps[1] (\"t\"): needs = 0x80");
    steps[1].needs = 0, steps[1].devices = "";
    TEST_FAIL_WITH(gpuarr_plan(steps, 2, GPUARR_PLACE_DEFAULT, out), GPUARR_ERROR_INVALID_ARGUMENT, "steps[1] (\"t\"): devices is \"\"");
    steps[1].devices = "gpus";
    TEST_FAIL_WITH(gpuarr_plan(steps, 2, GPUARR_PLACE_DEFAULT, out), GPUARR_ERROR_INVALID_ARGUMENT, "steps[1] (\"t\").devices = \"gpus\"");
    steps[1].name = NULL, steps[1].devices = "host,opencl:99";
    TEST_FAIL_WITH(gpuarr_plan(steps, 2, GPUARR_PLACE_DEFAULT, out), GPUARR_ERROR_NO_DEVICE, "steps[1].devices = \"host,opencl:99\"");
    cr_assert(out[0].id == SENTINEL && out[1].id == SENTINEL, "out written on failure");
    gpuarr_shutdown();
    TEST_FAIL_WITH(gpuarr_plan(&ok, 1, GPUARR_PLACE_DEFAULT, out), GPUARR_ERROR_NOT_INITIALIZED, "not initialized");
    TEST_OK(gpuarr_init(NULL));
}
