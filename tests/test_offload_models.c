/*
 * test_offload_models.c -- white-box: the task models of gpuarr_offload on synthetic timings. The
 * fit recovers a and b, predictions converge on the times measured and keep the small calls'
 * fixed cost over a wide range of sizes, outliers are refused (and a shift of the device's speed
 * is followed), a new size is not judged against an extrapolation and is measured again;
 * with models and transfer models set by hand (gpuarr__transfer_set_model, the interface the
 * transfer model provides) the choice goes to the device the numbers say, queued work counts,
 * exploration stays within its bounds, and a model 3x slower than its twin's is explored again.
 * Real runs add real samples too, which the synthetic models refuse as outliers: each test
 * makes fewer than GPUARR__MODEL_SHIFT runs on a device whose model it set. Tests that need PoCL
 * devices skip without them. This file compiles the implementation itself.
 */
#define GPUARR_IMPLEMENTATION
#include "test_common.h"

static char cache_dir[64];

static void models_setup(void) {
    snprintf(cache_dir, sizeof cache_dir, "/tmp/gpuarr-test-models-XXXXXX");
    cr_assert_not_null(mkdtemp(cache_dir));
    cr_assert_eq(setenv("GPUARR_CACHE_DIR", cache_dir, 1), 0);
    cr_assert_eq(setenv("GPUARR_OPENCL_UNIFIED", "off", 1), 0); /* PoCL as a discrete device: transfers cost */
    test_setup();
    gpuarr__tls.api = "gpuarr_test";
}

static void models_teardown(void) {
    test_teardown();
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", cache_dir);
}

TestSuite(models, .init = models_setup, .fini = models_teardown);

static void expect_near(double got, double want, const char *what) {
    cr_assert(fabs(got - want) <= 1e-9 * fabs(want) + 1e-15, "%s = %.17g, expected %.17g", what, got, want);
}

Test(models, the_fit_recovers_a_and_b_through_noise_in_every_bucket) {
    gpuarr__tmodel m;
    memset(&m, 0, sizeof m);
    const double a = 2e-3, b = 1e-6, sizes[4] = {1e3, 1e4, 1e5, 1e6};
    for (int rep = 0; rep < 3; rep++)
        for (int i = 0; i < 4; i++) { /* per size: exact, 1.5x (accepted while young), exact */
            double t = (a + b * sizes[i]) * (rep == 1 && m.count < GPUARR__MODEL_TRUSTED ? 1.5 : 1.0);
            gpuarr__model_add(&m, sizes[i], t);
        }
    expect_near(m.a, a, "a");
    expect_near(m.b, b, "b");
}

Test(models, one_size_alone_fits_a_time_proportional_to_size) {
    gpuarr__tmodel m;
    memset(&m, 0, sizeof m);
    gpuarr__model_add(&m, 1000, 2e-3);
    expect_near(m.a, 0, "a");
    expect_near(m.b, 2e-6, "b");
}

Test(models, outliers_are_refused_and_a_lasting_shift_is_followed) {
    gpuarr__tmodel m;
    memset(&m, 0, sizeof m);
    for (int i = 0; i < 8; i++) gpuarr__model_add(&m, (double)(1000 << (i % 4)), 1e-3 + 1e-6 * (double)(1000 << (i % 4)));
    double a = m.a, b = m.b;
    cr_assert_not(gpuarr__model_add(&m, 1000, 10 * 2e-3), "a spike x10 was taken");
    cr_assert_not(gpuarr__model_add(&m, 1000, 2e-3 / 4), "a dip /4 was taken");
    cr_assert(gpuarr__model_add(&m, 1000, 2.5 * 2e-3), "x2.5 is no outlier");
    cr_assert_eq(m.rejected, 2u);
    cr_assert(fabs(m.a - a) < 1e-4 && fabs(m.b - b) < 1e-7, "the fit moved: %g + %g n", m.a, m.b);
    for (int i = 0; i < GPUARR__MODEL_SHIFT - 1; i++) cr_assert_not(gpuarr__model_add(&m, 2000, 10 * 3e-3));
    cr_assert(gpuarr__model_add(&m, 2000, 10 * 3e-3), "the shift was not followed");
    expect_near(gpuarr__model_predict(&m, 2000), 3e-2, "prediction after the shift");
    cr_assert_eq(m.count, GPUARR__MODEL_SHIFT);
}

/* Predictions converge on the times measured: exact at every size measured, between them on
   the line joining their medians, and a spike in one bucket moves nothing once the bucket's
   median holds. */
Test(models, predictions_converge_on_the_measured_times_at_every_size) {
    gpuarr__tmodel m;
    memset(&m, 0, sizeof m);
    const double sizes[4] = {1e3, 1e4, 1e5, 1e6}, times[4] = {3e-4, 5e-4, 2e-3, 1.5e-2}; /* no line fits these */
    for (int rep = 0; rep < 5; rep++)
        for (int i = 0; i < 4; i++) gpuarr__model_add(&m, sizes[i], times[i] * (rep == 1 ? 2.5 : 1.0)); /* x2.5: taken, outvoted */
    for (int i = 0; i < 4; i++) expect_near(gpuarr__model_predict(&m, sizes[i]), times[i], "prediction at a measured size");
    expect_near(gpuarr__model_predict(&m, 5.5e5), 0.5 * (2e-3 + 1.5e-2), "halfway between 1e5 and 1e6");
    cr_assert(gpuarr__model_predict(&m, 2e6) > 1.5e-2, "beyond the largest size: more than there");
}

/* A fixed cost (a kernel launch and copies: 250 us) under a time proportional to size that
   dominates from n = 2^18: the line through 5 orders of magnitude has a = 0 (the intercept is
   clamped), which predicted 80 us for the smallest call, measured at 250 us (bench-offload's
   run 4, the 32 x 32 matmul sent to the device). The prediction keeps what small calls measured,
   at and below the smallest size. */
Test(models, a_fit_over_a_wide_range_of_sizes_keeps_the_small_calls_fixed_cost) {
    gpuarr__tmodel m;
    memset(&m, 0, sizeof m);
    const double fixed = 250e-6, per = 2.45e-9;
    for (int rep = 0; rep < 3; rep++)
        for (int side = 32; side <= 512; side *= 2) {
            double n = (double)side * side * side, t = per * n;
            gpuarr__model_add(&m, n, t > fixed ? t : fixed);
        }
    cr_assert(m.a < 0.5 * fixed, "the line itself has lost the fixed cost (a = %g): the case this test is about", m.a);
    expect_near(gpuarr__model_predict(&m, 32.0 * 32 * 32), fixed, "32 x 32 x 32, measured");
    expect_near(gpuarr__model_predict(&m, 16.0 * 16 * 16), fixed, "16 x 16 x 16, smaller than any measured");
    expect_near(gpuarr__model_predict(&m, 512.0 * 512 * 512), per * 512.0 * 512 * 512, "512^3, measured");
    expect_near(gpuarr__model_predict(&m, 1024.0 * 1024 * 1024), per * 1024.0 * 1024 * 1024, "1024^3: beyond, on the slope");
}

/* A trusted model measured at small sizes only judges a run at a size far beyond them (more than
   4x) against nothing: the extrapolation is no measure of what is normal there. */
Test(models, a_run_at_a_new_size_is_not_refused_as_an_outlier_of_the_extrapolation) {
    gpuarr__tmodel m;
    memset(&m, 0, sizeof m);
    for (int i = 0; i < 6; i++) gpuarr__model_add(&m, (double)(256 << (i % 2)), 1e-4); /* 256 and 512: 100 us */
    cr_assert(gpuarr__model_add(&m, 512 * 16, 1e-2), "a run 16x beyond the sizes measured was refused");
    expect_near(gpuarr__model_predict(&m, 512 * 16), 1e-2, "the new size's time");
    cr_assert_not(gpuarr__model_add(&m, 512 * 2, 1e-1), "within 4x of the sizes measured the outlier rule holds");
    /* below: more than 4x under the smallest size measured is a new size too */
    cr_assert(gpuarr__model_add(&m, 256 / 8, 1e-3), "a run 8x below the sizes measured was refused");
    cr_assert_not(gpuarr__model_add(&m, 256 / 2, 1e-1), "within 4x of the sizes measured the outlier rule holds");
}

/* A run started and finished alone: a warm-up when it is the first of the process there. */
static bool measured(gpuarr__tmodel *m, double n, double t) { return gpuarr__model_measured(m, n, t, gpuarr__model_warmup(m)); }

/* The first run of (task, device) in a process, 100x the steady time (PoCL building the kernel),
   as observed with the README's program on opencl:0: it must not end in a young model. */
Test(models, a_slow_first_run_in_a_process_is_a_warm_up_and_does_not_poison_a_young_model) {
    pthread_mutex_lock(&gpuarr__offload_st()->lock);
    gpuarr__tmodel *m = gpuarr__model_get("warmup", (int)(gpuarr__host_dev() - gpuarr__g.devices));
    cr_assert_not_null(m);
    const double n = 1e6, steady = 1e-3;
    measured(m, n, 100 * steady);
    cr_assert_eq(m->count, 0, "the warm-up was added");
    for (int i = 1; i <= 4; i++) {
        measured(m, n, steady);
        cr_assert_eq(m->count, i, "run %d was refused", i + 1);
        expect_near(gpuarr__model_predict(m, n), steady, "prediction at 1M elements");
    }
    pthread_mutex_unlock(&gpuarr__offload_st()->lock);
}

/* A model with 5 samples or more (read from the cache folder, say) has the outlier rule: the
   first run is judged as any run, so a fast one is taken and a slow one refused. */
Test(models, a_trusted_model_judges_the_first_run_as_any_run) {
    gpuarr__tmodel m;
    memset(&m, 0, sizeof m);
    gpuarr__copy_string(m.task, sizeof m.task, "trusted"); /* it is saved */
    for (int i = 0; i < GPUARR__MODEL_TRUSTED; i++) gpuarr__model_add(&m, 1000, 1e-3);
    cr_assert_not(measured(&m, 1000, 0.1), "a first run 100x slow was taken");
    cr_assert_eq(m.rejected, 1u);
    cr_assert(measured(&m, 1000, 1.1e-3), "a steady second run was refused");
    cr_assert_eq(m.count, GPUARR__MODEL_TRUSTED + 1);
    memset(&m, 0, sizeof m);
    gpuarr__copy_string(m.task, sizeof m.task, "trusted");
    for (int i = 0; i < GPUARR__MODEL_TRUSTED; i++) gpuarr__model_add(&m, 1000, 1e-3);
    cr_assert(measured(&m, 1000, 1.1e-3), "a steady first run of a trusted model was refused");
}

/* ---------------------------------------------------------------------------------------------
 * Choices on set models
 * ------------------------------------------------------------------------------------------- */
static gpuarr_result widen(const gpuarr_array *in, int n_in, gpuarr_array *out, int n_out, gpuarr_stream s, void *user) {
    (void)n_in, (void)n_out, (void)user;
    return gpuarr_convert_async(in[0], gpuarr_current_device(), GPUARR_F64, s, &out[0]);
}

static gpuarr__dev *dev_or_skip(const char *spec) {
    gpuarr_device d;
    gpuarr__dev *dev;
    if (gpuarr_device_find(spec, &d) != GPUARR_OK) test_skip("needs %s (POCL_DEVICES=\"pthread pthread\"): %s", spec, gpuarr_last_error());
    TEST_OK(gpuarr__get_dev(d, "d", &dev));
    return dev;
}

static int index_of(gpuarr__dev *d) { return (int)(d - gpuarr__g.devices); }

/* Sets the model of (task, d) to t = a + b n, measured at 6 sizes. */
static void set_model(const char *task, gpuarr__dev *d, double a, double b) {
    pthread_mutex_lock(&gpuarr__offload_st()->lock);
    gpuarr__tmodel *m = gpuarr__model_get(task, index_of(d));
    cr_assert_not_null(m);
    for (int i = 0; i < 6; i++) gpuarr__model_add(m, (double)(256 << i), a + b * (double)(256 << i));
    pthread_mutex_unlock(&gpuarr__offload_st()->lock);
}

/* Transfers both ways between the host and d: t = latency + bytes / rate. */
static void set_transfers(gpuarr__dev *d, double latency, double rate) {
    gpuarr__dev *host = gpuarr__host_dev();
    for (int cast = 0; cast < 2; cast++) {
        gpuarr__transfer_set_model(host, GPUARR__XFER_PAGEABLE, d, cast, latency, rate);
        gpuarr__transfer_set_model(d, GPUARR__XFER_DEVICE, host, cast, latency, rate);
    }
}

static gpuarr_task task_on(const char *name) {
    gpuarr_task_desc td;
    memset(&td, 0, sizeof td);
    td.name = name;
    td.impl[GPUARR_BACKEND_HOST] = td.impl[GPUARR_BACKEND_OPENCL] = widen;
    td.n_in = td.n_out = 1;
    gpuarr_task t;
    TEST_OK(gpuarr_task_create(&td, &t));
    return t;
}

static gpuarr__dev *run(gpuarr_task t, const char *devices, int64_t n) {
    gpuarr_array in, out;
    TEST_OK(gpuarr_zeros(gpuarr_host(), GPUARR_F32, 1, &n, &in));
    gpuarr_offload_desc d;
    memset(&d, 0, sizeof d);
    d.devices = devices;
    gpuarr_device on;
    TEST_OK(gpuarr_offload(t, &in, 1, &out, 1, &d, &on));
    TEST_OK(gpuarr_release(out));
    TEST_OK(gpuarr_release(in));
    gpuarr__dev *dev;
    TEST_OK(gpuarr__get_dev(on, "on", &dev));
    return dev;
}

static gpuarr_task_stats stats_of(gpuarr_task t, gpuarr__dev *d) {
    gpuarr_task_stats st;
    TEST_OK(gpuarr_task_get_stats(t, d->info.device, &st));
    return st;
}

Test(models, the_choice_follows_compute_and_transfer_models) {
    gpuarr__dev *cl = dev_or_skip("opencl:0"), *host = gpuarr__host_dev();
    gpuarr_task t = task_on("follows");
    set_model("follows", host, 1e-3, 1e-6);  /* 2 ms at 1000 elements */
    set_model("follows", cl, 1e-5, 1e-9);    /* 11 us */
    set_transfers(cl, 1e-6, 1e10);           /* 4 KB: 1.4 us */
    cr_assert_eq(run(t, "host,opencl:0", 1000), cl, "fast compute, cheap transfers: the device");
    set_transfers(cl, 1.0, 1e10);            /* a second each way */
    cr_assert_eq(run(t, "host,opencl:0", 1000), host, "expensive transfers: the host");
    set_transfers(cl, 1e-6, 1e10);
    gpuarr__offload_st()->queued_s[index_of(cl)] = 5.0; /* 5 s of work queued there */
    cr_assert_eq(run(t, "host,opencl:0", 1000), host, "a long queue: the host");
    gpuarr__offload_st()->queued_s[index_of(cl)] = 0;
    gpuarr_task_stats st = stats_of(t, cl);
    cr_assert_eq(st.calls, 1u);
    expect_near(st.predicted_s, 1e-5 + 1e-9 * 1000, "predicted");
    cr_assert_eq(st.explorations, 0u);
    TEST_OK(gpuarr_task_destroy(t));
}

Test(models, an_unmeasured_device_is_explored_only_within_10x_and_a_few_times) {
    gpuarr__dev *cl = dev_or_skip("opencl:0"), *host = gpuarr__host_dev();
    gpuarr_task t = task_on("bounded");
    set_model("bounded", host, 1e-3, 0);
    set_transfers(cl, 1.0, 1e10); /* 2 s of transfers against 1 ms on the host: never worth a try */
    for (int i = 0; i < 3; i++) cr_assert_eq(run(t, "host,opencl:0", 100), host);
    cr_assert_eq(stats_of(t, cl).explorations, 0u);
    set_transfers(cl, 1e-6, 1e10); /* now within 10x: explored (at most 3 times: the twins' test) */
    for (int i = 0; i < 3; i++) run(t, "host,opencl:0", 100);
    gpuarr_task_stats st = stats_of(t, cl);
    /* the first run is a warm-up, not a measurement: the device is explored again; a third time
       when its one sample keeps it within 10x */
    cr_assert(st.explorations >= 2 && st.explorations <= GPUARR__EXPLORE_MAX, "%llu explorations", (unsigned long long)st.explorations);
    /* while the device had no sample the host was the models' choice; its one sample may make
       it the models' choice itself */
    cr_assert(st.changed_by_exploration >= 2 && st.changed_by_exploration <= st.explorations, "%llu of %llu changed the choice",
              (unsigned long long)st.changed_by_exploration, (unsigned long long)st.explorations);
    TEST_OK(gpuarr_task_destroy(t));
}

/* Adds one sample (n, t) to the model of (task, d). */
static void add_sample(const char *task, gpuarr__dev *d, double n, double t) {
    pthread_mutex_lock(&gpuarr__offload_st()->lock);
    gpuarr__tmodel *m = gpuarr__model_get(task, index_of(d));
    cr_assert_not_null(m);
    gpuarr__model_add(m, n, t);
    pthread_mutex_unlock(&gpuarr__offload_st()->lock);
}

/* bench-offload's n = 512 matmul: the device measured twice at small sizes (so "known", never
   explored again before), its extrapolation 4x the host's at a size 2048x beyond them. It is
   measured again there: explored twice (a warm-up, then a sample), then the models decide with
   that sample. */
Test(models, a_device_measured_only_at_small_sizes_is_measured_again_at_a_new_size) {
    gpuarr__dev *cl = dev_or_skip("opencl:0"), *host = gpuarr__host_dev();
    gpuarr_task t = task_on("resize");
    for (int i = 16; i <= 21; i++) add_sample("resize", host, (double)(1 << i), 5e-8 * (double)(1 << i)); /* 52 ms at 2^20 */
    add_sample("resize", cl, 256, 1e-4);
    add_sample("resize", cl, 512, 1.5e-4); /* slope 1.95e-7: 0.2 s at 2^20 */
    set_transfers(cl, 1e-6, 1e10);
    cr_assert_eq(run(t, "host,opencl:0", 1 << 20), cl, "the new size was not explored");
    for (int i = 0; i < 3; i++) run(t, "host,opencl:0", 1 << 20);
    gpuarr_task_stats st = stats_of(t, cl);
    cr_assert_eq(st.explorations, (uint64_t)GPUARR__SIZE_EXPLORE_MAX, "%llu explorations", (unsigned long long)st.explorations);
    cr_assert_eq(st.changed_by_exploration, (uint64_t)GPUARR__SIZE_EXPLORE_MAX);
    /* the warm-up, then a sample at 2^20 (then the models' choice: more there when it is faster) */
    cr_assert(st.samples >= 3u && st.samples <= st.calls + 1u, "%llu samples of %llu calls", (unsigned long long)st.samples,
              (unsigned long long)st.calls);
    pthread_mutex_lock(&gpuarr__offload_st()->lock);
    gpuarr__tmodel *m = gpuarr__model_get("resize", index_of(cl));
    cr_assert(!gpuarr__model_new_size(m, 1 << 20) && m->hi == (double)(1 << 20), "the range is 256..%g", m->hi);
    pthread_mutex_unlock(&gpuarr__offload_st()->lock);
    TEST_OK(gpuarr_task_destroy(t));
}

Test(models, a_new_size_is_explored_only_within_10x_and_a_few_times_per_octave) {
    gpuarr__tmodel m;
    memset(&m, 0, sizeof m);
    gpuarr__model_add(&m, 256, 1e-4);
    gpuarr__model_add(&m, 512, 1.5e-4);
    int octave;
    cr_assert_not(gpuarr__off_explorable(&m, true, 2048, 1.0, 0.5, &octave), "4x beyond is no new size");
    cr_assert_not(gpuarr__off_explorable(&m, true, 64, 1.0, 0.5, &octave), "4x below is no new size either");
    cr_assert(gpuarr__off_explorable(&m, true, 32, 1.0, 0.5, &octave), "8x below is");
    cr_assert(gpuarr__off_explorable(&m, true, 4096, 1.0, 0.5, &octave), "8x beyond is");
    cr_assert_eq(octave, gpuarr__octave(4096));
    cr_assert_not(gpuarr__off_explorable(&m, true, 4096, 1.0, 0.099, &octave), "more than 10x the best");
    m.size_explorations[gpuarr__octave(4096)] = GPUARR__SIZE_EXPLORE_MAX;
    cr_assert_not(gpuarr__off_explorable(&m, true, 4096, 1.0, 0.5, &octave), "that octave was explored enough");
    cr_assert(gpuarr__off_explorable(&m, true, 8192, 1.0, 0.5, &octave), "the next octave was not");
}

Test(models, a_model_3x_slower_than_its_twins_is_explored_again_at_most_3_times) {
    gpuarr__dev *c0 = dev_or_skip("opencl:0"), *c1 = dev_or_skip("opencl:1");
    cr_assert(gpuarr__twins(index_of(c0), index_of(c1)), "two PoCL pthread devices are twins");
    gpuarr_task t = task_on("twins");
    set_model("twins", c0, 1e-5, 1e-9);
    set_model("twins", c1, 1.0, 1e-3); /* poisoned: as if a spike had made it look slow */
    set_transfers(c0, 1e-6, 1e10);
    set_transfers(c1, 1e-6, 1e10);
    int on_c1 = 0;
    for (int i = 0; i < 6; i++) on_c1 += run(t, "opencl:0,opencl:1", 100) == c1;
    gpuarr_task_stats st = stats_of(t, c1);
    cr_assert_eq(st.explorations, (uint64_t)GPUARR__EXPLORE_MAX);
    cr_assert_eq(on_c1, GPUARR__EXPLORE_MAX, "ran %d times on opencl:1", on_c1);
    cr_assert_eq(st.changed_by_exploration, (uint64_t)GPUARR__EXPLORE_MAX);
    TEST_OK(gpuarr_task_destroy(t));
}

Test(models, a_model_file_of_another_device_or_driver_is_replaced_without_a_warning) {
    pthread_mutex_lock(&gpuarr__offload_st()->lock);
    gpuarr__tmodel *m = gpuarr__model_get("keyed", 0);
    gpuarr__model_add(m, 100, 1e-3);
    gpuarr__model_save(m);
    char file[128], path[700];
    gpuarr__model_file("keyed", 0, file, sizeof file);
    snprintf(path, sizeof path, "%s/%s", gpuarr__g.config.cache_dir, file);
    pthread_mutex_unlock(&gpuarr__offload_st()->lock);
    static char text[8192];
    FILE *in = fopen(path, "rb");
    cr_assert_not_null(in, "%s", path);
    size_t size = fread(text, 1, sizeof text - 1, in);
    fclose(in);
    text[size] = '\0';
    char *ver = strstr(text, "driver=");
    cr_assert_not_null(ver);
    ver[7] = ver[7] == 'X' ? 'Y' : 'X'; /* as if the driver had changed */
    FILE *f = fopen(path, "wb");
    fwrite(text, 1, size, f);
    fclose(f);
    gpuarr__tmodel fresh;
    memset(&fresh, 0, sizeof fresh);
    gpuarr__copy_string(fresh.task, sizeof fresh.task, "keyed");
    gpuarr__model_load(&fresh);
    cr_assert_eq(fresh.count, 0, "a model of another driver was loaded");
    cr_assert(fresh.dirty, "it is not replaced at the next save");
}

Test(models, map_leaves_the_items_to_a_device_4x_faster) {
    gpuarr__dev *cl = dev_or_skip("opencl:0"), *host = gpuarr__host_dev();
    gpuarr_task t = task_on("declines");
    set_model("declines", host, 10.0, 0); /* 10 s an item on the host */
    set_model("declines", cl, 1e-5, 0);
    enum { N = 10 };
    gpuarr_array in[N], out[N];
    int64_t n = 64;
    for (int i = 0; i < N; i++) TEST_OK(gpuarr_zeros(gpuarr_host(), GPUARR_F32, 1, &n, &in[i]));
    gpuarr_offload_desc d;
    memset(&d, 0, sizeof d);
    d.devices = "host,opencl:0";
    TEST_OK(gpuarr_map(t, in, N, out, &d, NULL));
    cr_assert_eq(stats_of(t, host).calls, 0u, "the host took items");
    cr_assert_eq(stats_of(t, cl).calls, (uint64_t)N);
    for (int i = 0; i < N; i++) {
        TEST_OK(gpuarr_release(out[i]));
        TEST_OK(gpuarr_release(in[i]));
    }
    TEST_OK(gpuarr_task_destroy(t));
}
