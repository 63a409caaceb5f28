/*
 * test_transfer_model_fit.c -- white-box: the transfer model's arithmetic on synthetic timings,
 * and the internal interface the offload layer uses (gpuarr__transfer_predict,
 * gpuarr__transfer_set_model). The fit recovers latency and bandwidth from exact points, a spike
 * in one of five repetitions does not move the median, a model set by hand predicts exactly
 * latency + bytes / bandwidth (a cast scaled by the bytes read and written), is shown as "set" and
 * never saved. This file compiles the implementation itself; it runs with the host and, when
 * present, opencl:0.
 */
#define GPUARR_IMPLEMENTATION
#include "test_common.h"

#include <dirent.h>
#include <pthread.h>

static char cache[64];

static void fit_setup(void) {
    snprintf(cache, sizeof cache, "/tmp/gpuarr-test-xfit-XXXXXX");
    cr_assert_not_null(mkdtemp(cache));
    cr_assert_eq(setenv("GPUARR_CACHE_DIR", cache, 1), 0);
    cr_assert_eq(setenv("GPUARR_CALIBRATE", "off", 1), 0); /* nothing measured: only what is set */
    test_setup();
}

static void fit_teardown(void) {
    test_teardown();
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", cache);
}

TestSuite(transfer_fit, .init = fit_setup, .fini = fit_teardown);

static void expect_near(double got, double want, const char *what) {
    cr_expect(fabs(got - want) <= 1e-9 * fabs(want), "%s: %.17g, want %.17g", what, got, want);
}

Test(transfer_fit, exact_points_give_back_latency_and_bandwidth) {
    double x[3] = {65536, 1 << 20, 16 << 20}, y[3];
    for (int i = 0; i < 3; i++) y[i] = 20e-6 + x[i] / 5e9;
    double lat, bps;
    gpuarr__xfer_fit(x, y, 3, &lat, &bps);
    expect_near(lat, 20e-6, "latency");
    expect_near(bps, 5e9, "bandwidth");
}

Test(transfer_fit, small_transfers_count_as_much_as_large_ones) {
    /* 10% noise on the largest point: an absolute least squares fit would throw the latency
       far off; on relative error it stays near */
    double x[3] = {65536, 1 << 20, 16 << 20}, y[3];
    for (int i = 0; i < 3; i++) y[i] = 20e-6 + x[i] / 5e9;
    y[2] *= 1.1;
    double lat, bps;
    gpuarr__xfer_fit(x, y, 3, &lat, &bps);
    cr_expect(lat > 10e-6 && lat < 30e-6, "latency %g", lat);
    cr_expect(bps > 4e9 && bps < 5e9, "bandwidth %g", bps);
}

Test(transfer_fit, a_negative_latency_or_a_falling_time_fits_through_zero) {
    double x[3] = {65536, 1 << 20, 16 << 20}, y[3] = {1e-6, 1e-4, 3.3e-3}; /* the line through them crosses below 0 */
    double lat, bps;
    gpuarr__xfer_fit(x, y, 3, &lat, &bps);
    cr_expect_eq(lat, 0.0);
    cr_expect(isfinite(bps) && bps > 0, "bandwidth %g", bps);
    double flat[3] = {2e-3, 1e-3, 5e-4}; /* noise: larger transfers measured faster */
    gpuarr__xfer_fit(x, flat, 3, &lat, &bps);
    cr_expect(lat >= 0 && isfinite(bps) && bps > 0, "%g s + bytes / %g", lat, bps);
}

Test(transfer_fit, one_spike_in_five_does_not_move_the_median) {
    double v[5] = {1.0e-3, 1.1e-3, 0.9e-3, 250e-3 /* a spike */, 1.05e-3};
    cr_expect_eq(gpuarr__xfer_median(v, 5), 1.05e-3);
    double w[4] = {4, 1, 3, 2};
    cr_expect_eq(gpuarr__xfer_median(w, 4), 2.5);
}

static gpuarr__dev *dev_of(const char *spec) {
    gpuarr_device d;
    gpuarr__dev *out;
    if (gpuarr_device_find(spec, &d) != GPUARR_OK) return NULL;
    cr_assert_eq(gpuarr__get_dev(d, "d", &out), GPUARR_OK);
    return out;
}

static double predict(gpuarr__dev *s, gpuarr__xfer_mem mem, gpuarr__dev *d, gpuarr_dtype st, gpuarr_dtype dt, uint64_t bytes,
                      bool *modeled) {
    double sec = -1;
    cr_assert_eq(gpuarr__transfer_predict(s, mem, d, st, dt, bytes, &sec, modeled), GPUARR_OK);
    return sec;
}

Test(transfer_fit, a_model_set_by_hand_predicts_exactly_and_is_not_saved) {
    gpuarr__dev *h = gpuarr__host_dev();
    bool modeled = true;
    cr_expect_eq(predict(h, GPUARR__XFER_PAGEABLE, h, GPUARR_F32, GPUARR_I32, 1 << 20, &modeled), 0.0, "same device: fallback 0");
    cr_expect(!modeled);
    gpuarr__transfer_set_model(h, GPUARR__XFER_PAGEABLE, h, true, 10e-6, 2e9);
    expect_near(predict(h, GPUARR__XFER_PAGEABLE, h, GPUARR_F32, GPUARR_I32, 1 << 20, &modeled), 10e-6 + 1048576 / 2e9, "f32 -> i32");
    cr_expect(modeled);
    /* f32 -> f16: 4 bytes read and 2 written per 4-byte source element, 3/4 of an equal-width cast */
    expect_near(predict(h, GPUARR__XFER_PAGEABLE, h, GPUARR_F32, GPUARR_F16, 1 << 20, &modeled), 10e-6 + 0.75 * 1048576 / 2e9,
                "f32 -> f16");
    /* pinned memory means nothing from the host to the host: the pageable model */
    expect_near(predict(h, GPUARR__XFER_PINNED, h, GPUARR_F32, GPUARR_I32, 1 << 20, &modeled), 10e-6 + 1048576 / 2e9, "pinned");
    cr_expect_eq(predict(h, GPUARR__XFER_PAGEABLE, h, GPUARR_F32, GPUARR_F32, 1 << 20, &modeled), 0.0, "nothing moves");
    cr_expect(modeled);
    char summary[1024];
    cr_assert_eq(gpuarr_transfer_models_summary(summary, sizeof summary), GPUARR_OK);
    cr_expect_str_eq(summary, "host -> host pageable cast: latency 10.0 us, 2.000 GB/s (set)\n");
    char dir[128];
    snprintf(dir, sizeof dir, "%s/models", cache);
    DIR *d = opendir(dir);
    cr_expect_null(d, "a set model is not saved");
    if (d) closedir(d);
    gpuarr__transfer_set_model(h, GPUARR__XFER_PAGEABLE, h, true, -1, 2e9); /* invalid: no model */
    predict(h, GPUARR__XFER_PAGEABLE, h, GPUARR_F32, GPUARR_I32, 1 << 20, &modeled);
    cr_expect(!modeled);
}

Test(transfer_fit, pinned_and_pageable_are_apart_for_a_device) {
    gpuarr__dev *h = gpuarr__host_dev(), *cl = dev_of("opencl:0");
    if (!cl) test_skip("needs opencl:0 (PoCL)");
    bool modeled = true;
    uint64_t b = 8 << 20;
    /* unified or not (info.host_unified), a plain copy to and from the host moves data: with no
       model yet it is the fallback, not 0 */
    cr_expect_eq(predict(h, GPUARR__XFER_PAGEABLE, cl, GPUARR_F32, GPUARR_F32, b, &modeled), (double)b / 1e9, "host -> device, no model");
    cr_expect(!modeled);
    cr_expect_eq(predict(cl, GPUARR__XFER_DEVICE, h, GPUARR_F32, GPUARR_F32, b, &modeled), (double)b / 1e9, "device -> host, no model");
    cr_expect(!modeled);
    gpuarr__transfer_set_model(h, GPUARR__XFER_PAGEABLE, cl, false, 20e-6, 4e9);
    gpuarr__transfer_set_model(h, GPUARR__XFER_PINNED, cl, false, 5e-6, 12e9);
    gpuarr__transfer_set_model(cl, GPUARR__XFER_PAGEABLE /* device memory, whatever is said */, h, false, 30e-6, 3e9);
    double pageable = predict(h, GPUARR__XFER_PAGEABLE, cl, GPUARR_F32, GPUARR_F32, b, &modeled);
    double pinned = predict(h, GPUARR__XFER_PINNED, cl, GPUARR_F32, GPUARR_F32, b, &modeled);
    double back = predict(cl, GPUARR__XFER_DEVICE, h, GPUARR_F32, GPUARR_F32, b, &modeled);
    expect_near(pageable, 20e-6 + (double)b / 4e9, "pageable");
    expect_near(pinned, 5e-6 + (double)b / 12e9, "pinned");
    expect_near(back, 30e-6 + (double)b / 3e9, "back");
    cr_expect(modeled);
    char summary[1024];
    cr_assert_eq(gpuarr_transfer_models_summary(summary, sizeof summary), GPUARR_OK);
    cr_expect(strstr(summary, "host -> opencl:0 pageable copy: latency 20.0 us, 4.000 GB/s (set)\n") != NULL, "%s", summary);
    bool m2;
    cr_expect_eq(predict(cl, GPUARR__XFER_DEVICE, h, GPUARR_F32, GPUARR_I32, b, &m2), (double)b / 1e9, "no cast model: the fallback");
    cr_expect(!m2);
}

Test(transfer_fit, calibrate_replaces_a_model_set_by_hand) {
    gpuarr__dev *h = gpuarr__host_dev();
    gpuarr__transfer_set_model(h, GPUARR__XFER_PAGEABLE, h, true, 1.0, 1.0);
    cr_assert_eq(gpuarr_calibrate(gpuarr_host()), GPUARR_OK, "%s", gpuarr_last_error());
    char summary[8192];
    cr_assert_eq(gpuarr_transfer_models_summary(summary, sizeof summary), GPUARR_OK);
    cr_expect(strstr(summary, "host -> host pageable cast") && strstr(summary, "(measured)") && !strstr(summary, "(set)"), "%s",
              summary);
    bool modeled;
    double s = predict(h, GPUARR__XFER_PAGEABLE, h, GPUARR_F32, GPUARR_I32, 1 << 20, &modeled);
    cr_expect(modeled && s > 0 && s < 1.0, "%g s", s);
}

/* Threads that need one pair at once: one measures it, the others wait for that fit. */
#define THREADS 6
static double got[THREADS];
static void *predict_in_thread(void *arg) {
    int i = (int)(intptr_t)arg;
    bool modeled = false;
    gpuarr__dev *h = gpuarr__host_dev();
    if (gpuarr__transfer_predict(h, GPUARR__XFER_PAGEABLE, h, GPUARR_F32, GPUARR_I32, 3 << 20, &got[i], &modeled) != GPUARR_OK || !modeled)
        got[i] = -1;
    return NULL;
}

Test(transfer_fit, threads_that_need_one_pair_share_one_fit) {
    gpuarr__xfer_state *xs = gpuarr__xfer_st();
    pthread_mutex_lock(&xs->lock);
    xs->lazy = true; /* as GPUARR_CALIBRATE=on */
    uint64_t before = xs->fits;
    pthread_mutex_unlock(&xs->lock);
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) cr_assert_eq(pthread_create(&th[i], NULL, predict_in_thread, (void *)(intptr_t)i), 0);
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    pthread_mutex_lock(&xs->lock);
    uint64_t fits = xs->fits - before;
    pthread_mutex_unlock(&xs->lock);
    cr_expect_eq(fits, 1u, "%llu fits for one pair", (unsigned long long)fits);
    for (int i = 0; i < THREADS; i++) cr_expect(got[i] > 0 && got[i] == got[0], "thread %d: %g s, thread 0: %g s", i, got[i], got[0]);
}
