/*
 * test_lease_links.c -- white-box: leases across backends. A GPU seen through CUDA and OpenCL has
 * one count of slots, and a lease's affinity key follows the physical GPU from one view to the
 * other. PoCL and the fake CUDA driver share no UUID, so the link (info.same_as, as
 * gpuarr__registry_link makes it) is made by hand between opencl:0 and cuda:1. Skips, saying why,
 * without the fake driver (make test runs it with FAKE_ENV). This file compiles the
 * implementation itself.
 */
#define GPUARR_IMPLEMENTATION
#include "test_common.h"

static char dir[64];
static gpuarr__dev *linked[2];

static void links_setup(void) {
    snprintf(dir, sizeof dir, "/tmp/gpuarr-test-links-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    cr_assert_eq(setenv("GPUARR_LEASE_DIR", dir, 1), 0);
    test_setup();
}

static void links_teardown(void) { /* also before a skip: a skipped test's .fini does not run */
    if (linked[0]) linked[0]->info.same_as.id = 0, linked[1]->info.same_as.id = 0;
    test_teardown();
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

TestSuite(lease_links, .init = links_setup, .fini = links_teardown);

static gpuarr_device find_or_skip(const char *spec) {
    gpuarr_device d;
    if (gpuarr_device_find(spec, &d) != GPUARR_OK) links_teardown(), test_skip("needs %s (the fake CUDA driver and PoCL): %s", spec, gpuarr_last_error());
    return d;
}

static gpuarr_device leased(const char *devices, const char *key, gpuarr_lease *l) {
    gpuarr_lease_desc d;
    memset(&d, 0, sizeof d);
    d.devices = devices;
    d.affinity = key;
    gpuarr_device on = {0};
    TEST_OK(gpuarr_lease_acquire(&d, l));
    TEST_OK(gpuarr_lease_device(*l, &on));
    return on;
}

static void expect_slots(gpuarr_device d, int total, int in_use) {
    int t, u;
    TEST_OK(gpuarr_device_get_slots(d, &t, &u));
    cr_assert(t == total && u == in_use, "%d of %d in use, expected %d of %d", u, t, in_use, total);
}

Test(lease_links, affinity_follows_a_gpu_from_its_cuda_view_to_its_opencl_view) {
    gpuarr_device cl = find_or_skip("opencl:0"), cu1 = find_or_skip("cuda:1"), cu0 = find_or_skip("cuda:0");
    gpuarr__tls.api = "gpuarr_test";
    TEST_OK(gpuarr__get_dev(cl, "cl", &linked[0]));
    TEST_OK(gpuarr__get_dev(cu1, "cu1", &linked[1]));
    linked[0]->info.same_as = cu1; /* as gpuarr__registry_link does for one GPU seen through both */
    linked[1]->info.same_as = cl;
    TEST_OK(gpuarr_device_set_slots(cl, 2)); /* sets cuda:1's: one count */
    expect_slots(cu1, 2, 0);
    TEST_OK(gpuarr_device_set_slots(cu0, 2));
    gpuarr_lease a, b, c, d;
    cr_assert_eq(leased("cuda:1", "k", &a).id, cu1.id);
    expect_slots(cl, 2, 1);
    /* cuda:0 is less leased (0 of 2 against 1 of 2), but the key is on the GPU opencl:0 shows */
    cr_assert_eq(leased("cuda:0,opencl:0", "k", &b).id, cl.id, "the key's GPU, through its OpenCL view");
    expect_slots(cu1, 2, 2);
    expect_slots(cl, 2, 2);
    /* full: the key goes elsewhere; without a key, least leased decides */
    cr_assert_eq(leased("cuda:0,opencl:0", "k", &c).id, cu0.id);
    TEST_OK(gpuarr_lease_release(b));
    cr_assert_eq(leased("opencl:0,cuda:0", NULL, &d).id, cl.id, "1 of 2 on each: list order");
    TEST_OK(gpuarr_lease_release(d));
    cr_assert_eq(leased("cuda:0,opencl:0", NULL, &d).id, cl.id, "cuda:0 1 of 2, the GPU 1 of 2: list order again");
    TEST_OK(gpuarr_lease_release(d));
    TEST_OK(gpuarr_lease_release(c));
    cr_assert_eq(leased("cuda:0,opencl:0", NULL, &d).id, cu0.id, "cuda:0 0 of 2, the GPU 1 of 2");
    TEST_OK(gpuarr_lease_release(d));
    TEST_OK(gpuarr_lease_release(a));
    expect_slots(cl, 2, 0);
}

/* gpuarr_plan (PLANS): steps that need the CUDA view and the OpenCL view of one GPU land on it. */
Test(lease_links, a_plan_puts_cuda_and_opencl_steps_on_the_gpu_both_views_show) {
    gpuarr_device cl = find_or_skip("opencl:0"), cu1 = find_or_skip("cuda:1"), cu0 = find_or_skip("cuda:0");
    gpuarr_plan_step steps[4] = {{"upload", "cuda:*", 0, 0}, {"opencl kernel", "opencl:0", 0, 0}, {"cuda kernel", "cuda", 0, 0}, {"save", "host", 0, 0}};
    gpuarr_device out[4];
    TEST_OK(gpuarr_plan(steps, 4, GPUARR_PLACE_DEFAULT, out)); /* unlinked: cuda:0 takes two, a tie, list order */
    cr_assert(out[0].id == cu0.id && out[1].id == cl.id && out[2].id == cu0.id && out[3].id == gpuarr_host().id);
    gpuarr__tls.api = "gpuarr_test";
    TEST_OK(gpuarr__get_dev(cl, "cl", &linked[0]));
    TEST_OK(gpuarr__get_dev(cu1, "cu1", &linked[1]));
    linked[0]->info.same_as = cu1;
    linked[1]->info.same_as = cl;
    TEST_OK(gpuarr_plan(steps, 4, GPUARR_PLACE_DEFAULT, out)); /* cuda:1 and opencl:0 are one GPU: it takes three */
    cr_assert_eq(out[0].id, cu1.id, "the CUDA steps follow the OpenCL step to its GPU");
    cr_assert_eq(out[1].id, cl.id, "through the view the step named");
    cr_assert_eq(out[2].id, cu1.id);
    cr_assert_eq(out[3].id, gpuarr_host().id);
}

/* "local" (LOCAL RANK): one view per physical device, so with opencl:0 the same GPU as cuda:1 the
   ranks go over cuda:0, cuda:1, opencl:1 (and a lease on "local" counts cuda:1's slots). */
Test(lease_links, local_ranks_count_a_gpu_seen_through_two_backends_once) {
    gpuarr_device cl = find_or_skip("opencl:0"), cu1 = find_or_skip("cuda:1"), cu0 = find_or_skip("cuda:0"), cl1 = find_or_skip("opencl:1");
    static const char *const unlinked[] = {"cuda:0", "cuda:1", "opencl:0", "opencl:1"};
    gpuarr_device d;
    for (int r = 0; r < 4; r++) {
        char spec[24];
        gpuarr_device_info info;
        snprintf(spec, sizeof spec, "local:%d", r);
        TEST_OK(gpuarr_device_find(spec, &d));
        TEST_OK(gpuarr_device_get_info(d, &info));
        cr_assert_str_eq(info.spec, unlinked[r], "%s before the link", spec);
    }
    gpuarr__tls.api = "gpuarr_test";
    TEST_OK(gpuarr__get_dev(cl, "cl", &linked[0]));
    TEST_OK(gpuarr__get_dev(cu1, "cu1", &linked[1]));
    linked[0]->info.same_as = cu1;
    linked[1]->info.same_as = cl;
    const gpuarr_device linked_order[] = {cu0, cu1, cl1};
    for (int r = 0; r < 6; r++) {
        char spec[24];
        snprintf(spec, sizeof spec, "local:%d", r);
        TEST_OK(gpuarr_device_find(spec, &d));
        cr_assert_eq(d.id, linked_order[r % 3].id, "%s after the link", spec);
    }
    TEST_OK(gpuarr_device_set_slots(cu1, 1));
    gpuarr_lease a;
    cr_assert_eq(leased("local:1", NULL, &a).id, cu1.id);
    expect_slots(cl, 1, 1);
    TEST_OK(gpuarr_lease_release(a));
}
