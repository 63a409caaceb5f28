/*
 * test_transfer_model.c -- the transfer model (the manual's TRANSFER MODEL section), on the
 * device under test (GPUARR_TEST_DEVICE): estimates are 0 when nothing moves and grow with the
 * bytes (a plain copy between the host and a unified device moves data too); an array's memory kind picks its model; models persist in GPUARR_CACHE_DIR/models and
 * come back equal; a corrupted file is ignored with a warning naming it and rebuilt; a file with
 * another key (driver version) is refitted; GPUARR_CALIBRATE=off fits nothing and writes nothing;
 * every bad argument is named. Each test has a cache folder of its own. No test looks at how long
 * a measured transfer took beyond its being positive and finite. Synthetic models, fits and
 * medians: test_transfer_model_fit.c.
 */
#include "test_common.h"

#include <dirent.h>
#include <pthread.h>
#include <unistd.h>

static char cache[64];
static char logged[16384]; /* the warnings and infos gpuarr logged, one a line */

static void keep_log(gpuarr_log_level level, const char *message, void *user) {
    (void)user;
    size_t used = strlen(logged);
    if (level <= GPUARR_LOG_WARN) snprintf(logged + used, sizeof logged - used, "%s\n", message);
}

/* (Re)starts gpuarr with GPUARR_CALIBRATE on or off, keeping the warnings. */
static void start(bool calibrate) {
    if (gpuarr_is_initialized()) gpuarr_shutdown();
    cr_assert_eq(setenv("GPUARR_CALIBRATE", calibrate ? "on" : "off", 1), 0);
    gpuarr_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.logger.fn = keep_log;
    gpuarr_result r = gpuarr_init(&desc);
    cr_assert_eq(r, GPUARR_OK, "gpuarr_init = %s: %s", gpuarr_result_name(r), gpuarr_last_error());
}

static void xfer_setup(void) {
    snprintf(cache, sizeof cache, "/tmp/gpuarr-test-xfer-XXXXXX");
    cr_assert_not_null(mkdtemp(cache));
    cr_assert_eq(setenv("GPUARR_CACHE_DIR", cache, 1), 0);
    logged[0] = '\0';
    start(true);
}

static void xfer_teardown(void) {
    if (gpuarr_is_initialized()) gpuarr_shutdown();
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", cache);
}

TestSuite(transfer_model, .init = xfer_setup, .fini = xfer_teardown);

#define MIB (1u << 20)
#define ELEMS (4 * MIB) /* f32: 16 MiB */

/* A transfer that moves data on every device: from the device under test to the host, as i32
   when the device is the host itself (a plain copy there is free; to a unified device it is not). */
typedef struct moving {
    gpuarr_device dev, host;
    gpuarr_array a; /* ELEMS f32 on dev */
    gpuarr_dtype t;
    bool same_device; /* the host itself: the fallback is then 0 */
} moving;

static moving moving_make(void) {
    moving m;
    m.dev = test_device();
    m.host = gpuarr_host();
    gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(m.dev, &info));
    m.same_device = test_device_is_host(m.dev);
    m.t = m.same_device ? GPUARR_I32 : GPUARR_F32;
    int64_t n = ELEMS;
    TEST_OK(gpuarr_zeros(m.dev, GPUARR_F32, 1, &n, &m.a));
    return m;
}

static double moving_estimate(const moving *m, uint64_t bytes) {
    double s = -1;
    TEST_OK(gpuarr_transfer_estimate(m->a, m->host, m->t, bytes, &s));
    return s;
}

static double fallback(const moving *m, uint64_t bytes) { return m->same_device ? 0.0 : (double)bytes / 1e9; }

/* The model files (their count; the first's path in first). */
static int model_files(char *first, size_t cap) {
    char dir[128];
    snprintf(dir, sizeof dir, "%s/models", cache);
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strstr(e->d_name, ".model") || strstr(e->d_name, ".tmp")) continue;
        if (n++ == 0 && first) snprintf(first, cap, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    return n;
}

/* Calls fn(path) for every model file. */
static void each_model_file(void (*fn)(const char *path)) {
    char dir[128], path[512];
    snprintf(dir, sizeof dir, "%s/models", cache);
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "no folder %s", dir);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strstr(e->d_name, ".model")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        fn(path);
    }
    closedir(d);
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    static char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    return text;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

Test(transfer_model, nothing_moving_costs_nothing) {
    moving m = moving_make();
    double s = -1;
    TEST_OK(gpuarr_transfer_estimate(m.dev, m.dev, GPUARR_F32, 64 * MIB, &s));
    cr_expect_eq(s, 0.0);
    s = -1;
    TEST_OK(gpuarr_transfer_estimate(m.a, m.dev, 0, 0, &s)); /* same device, same dtype */
    cr_expect_eq(s, 0.0);
    s = -1;
    TEST_OK(gpuarr_transfer_estimate(m.host, m.dev, GPUARR_F32, 0, &s)); /* no bytes */
    cr_expect_eq(s, 0.0);
    gpuarr_release(m.a);
}

/* The host and a device that shares its memory: gpuarr_convert / gpuarr_copy still copy the data
   into another array, so a same-dtype move costs time, grows with the bytes and has a model. */
Test(transfer_model, a_plain_copy_between_the_host_and_a_unified_device_is_modeled) {
    gpuarr_device dev = test_device(), host = gpuarr_host();
    gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(dev, &info));
    if (test_device_is_host(dev) || !info.host_unified) test_skip("needs a device that shares host memory");
    double prev = 0, s = -1;
    for (uint64_t bytes = 4096; bytes <= 16 * MIB; bytes *= 4) {
        TEST_OK(gpuarr_transfer_estimate(host, dev, GPUARR_F32, bytes, &s));
        cr_expect(isfinite(s) && s > prev, "host -> %s, %llu bytes: %g s, after %g s", info.spec, (unsigned long long)bytes, s, prev);
        prev = s;
    }
    s = -1;
    TEST_OK(gpuarr_transfer_estimate(dev, host, GPUARR_F32, 16 * MIB, &s));
    cr_expect(isfinite(s) && s > 0, "%s -> host: %g s", info.spec, s);
    char summary[8192], want[128];
    TEST_OK(gpuarr_transfer_models_summary(summary, sizeof summary));
    snprintf(want, sizeof want, "host -> %s pageable copy: ", info.spec);
    cr_expect(strstr(summary, want) != NULL, "want \"%s\" in:\n%s", want, summary);
    snprintf(want, sizeof want, "%s -> host device copy: ", info.spec);
    cr_expect(strstr(summary, want) != NULL, "want \"%s\" in:\n%s", want, summary);
    size_t whole = strlen(summary), second = (size_t)(strchr(summary, '\n') - summary) + 1;
    cr_assert(summary[whole - 1] == '\n', "the summary does not end with a newline: %s", summary);
    char cut[8192]; /* cut inside the second line: the first line alone */
    TEST_OK(gpuarr_transfer_models_summary(cut, second + 5));
    cr_expect(strlen(cut) == second && strncmp(cut, summary, second) == 0, "cut to %zu: \"%s\", want the first line of:\n%s",
              second + 5, cut, summary);
}

Test(transfer_model, an_estimate_grows_with_the_bytes) {
    moving m = moving_make();
    double prev = 0;
    for (uint64_t bytes = 4096; bytes <= 16 * MIB; bytes *= 4) {
        double s = moving_estimate(&m, bytes);
        cr_expect(isfinite(s) && s > prev, "%llu bytes: %g s, after %g s", (unsigned long long)bytes, s, prev);
        prev = s;
    }
    cr_expect_eq(moving_estimate(&m, 0), moving_estimate(&m, 16 * MIB), "bytes 0 = the whole array");
    char summary[8192];
    TEST_OK(gpuarr_transfer_models_summary(summary, sizeof summary));
    cr_expect(strstr(summary, "(measured)") != NULL, "fitted at first use: %s", summary);
    char path[512], want[512], host[64] = "";
    cr_expect_eq(model_files(path, sizeof path), 1, "the pair's file was written");
    /* named by the devices' UUID, else PCI address, else host name and spec (':' as '-') */
    gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(m.dev, &info));
    cr_assert_eq(gethostname(host, sizeof host - 1), 0);
    char key[128];
    if (info.has_uuid) snprintf(key, sizeof key, "GPU-%02x%02x%02x%02x-", info.uuid[0], info.uuid[1], info.uuid[2], info.uuid[3]);
    else if (info.has_pci) snprintf(key, sizeof key, "pci-%04x:%02x:%02x.%x", (unsigned)info.pci_domain, (unsigned)info.pci_bus,
                                    (unsigned)info.pci_device, (unsigned)info.pci_function);
    else {
        snprintf(key, sizeof key, "%s-%s", host, info.spec);
        for (char *c = key; *c; c++) *c = *c == ':' ? '-' : *c;
    }
    snprintf(want, sizeof want, "%s/models/%s", cache, key);
    cr_expect(strncmp(path, want, strlen(want)) == 0, "%s does not start with %s", path, want);
    snprintf(want, sizeof want, "--%s-host.model", host);
    cr_expect(strlen(path) > strlen(want) && strcmp(path + strlen(path) - strlen(want), want) == 0, "%s does not end with %s", path, want);
    gpuarr_release(m.a);
}

Test(transfer_model, a_pinned_array_has_its_own_model) {
    gpuarr_device dev = test_device();
    if (test_device_is_host(dev)) test_skip("the host has no pinned memory of its own");
    gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(dev, &info));
    gpuarr_dtype t = GPUARR_F32; /* a plain copy, to a unified device too */
    int64_t n = MIB;
    gpuarr_array pinned, pageable;
    TEST_OK(gpuarr_empty_pinned(dev, GPUARR_F32, 1, &n, &pinned));
    TEST_OK(gpuarr_zeros(gpuarr_host(), GPUARR_F32, 1, &n, &pageable));
    double s1 = -1, s2 = -1;
    TEST_OK(gpuarr_transfer_estimate(pinned, dev, t, 0, &s1));
    char summary[8192], want[128];
    TEST_OK(gpuarr_transfer_models_summary(summary, sizeof summary));
    snprintf(want, sizeof want, "host -> %s pinned copy", info.spec);
    cr_expect(strstr(summary, want) != NULL, "want \"%s\" in:\n%s", want, summary);
    snprintf(want, sizeof want, "host -> %s pageable", info.spec);
    cr_expect(strstr(summary, want) == NULL, "no pageable model yet:\n%s", summary);
    TEST_OK(gpuarr_transfer_estimate(pageable, dev, t, 0, &s2));
    TEST_OK(gpuarr_transfer_models_summary(summary, sizeof summary));
    cr_expect(strstr(summary, want) != NULL, "want \"%s\" in:\n%s", want, summary);
    cr_expect(s1 > 0 && s2 > 0 && isfinite(s1) && isfinite(s2));
    gpuarr_release(pinned);
    gpuarr_release(pageable);
}

Test(transfer_model, models_persist_and_come_back_equal) {
    moving m = moving_make();
    TEST_OK(gpuarr_calibrate(m.dev));
    double before = moving_estimate(&m, 3 * MIB);
    char summary[8192];
    TEST_OK(gpuarr_transfer_models_summary(summary, sizeof summary));
    cr_expect(strstr(summary, "(loaded)") == NULL);
    gpuarr_release(m.a);
    start(false);
    m = moving_make();
    cr_expect_eq(moving_estimate(&m, 3 * MIB), before, "the model read back is the one saved");
    TEST_OK(gpuarr_transfer_models_summary(summary, sizeof summary));
    cr_expect(strstr(summary, "(loaded)") != NULL, "%s", summary);
    cr_expect(strstr(summary, "(measured)") == NULL, "nothing fitted with GPUARR_CALIBRATE=off: %s", summary);
    gpuarr_release(m.a);
}

static void cut_in_half(const char *path) {
    char *text = read_text(path);
    text[strlen(text) / 2] = '\0';
    write_text(path, text);
}

Test(transfer_model, a_corrupted_file_is_ignored_with_a_warning_and_rebuilt) {
    moving m = moving_make();
    TEST_OK(gpuarr_calibrate(m.dev));
    double measured = moving_estimate(&m, MIB);
    cr_expect(measured > 0);
    gpuarr_release(m.a);
    each_model_file(cut_in_half);
    char path[512];
    cr_assert_gt(model_files(path, sizeof path), 0);
    logged[0] = '\0';
    start(false); /* nothing refitted: the fallback shows the file was not used */
    m = moving_make();
    cr_expect_eq(moving_estimate(&m, MIB), fallback(&m, MIB));
    cr_expect(strstr(logged, "corrupted") != NULL && strstr(logged, cache) != NULL, "the warning names the file: %s", logged);
    gpuarr_release(m.a);
    start(true); /* refitted at first use, and the file written whole again */
    m = moving_make();
    cr_expect_gt(moving_estimate(&m, MIB), 0.0);
    gpuarr_release(m.a);
    logged[0] = '\0';
    start(false);
    m = moving_make();
    double again = moving_estimate(&m, MIB);
    cr_expect(again > 0 && again != fallback(&m, MIB), "rebuilt: %g s", again);
    char summary[8192];
    TEST_OK(gpuarr_transfer_models_summary(summary, sizeof summary));
    cr_expect(strstr(summary, "(loaded)") != NULL, "%s", summary);
    gpuarr_release(m.a);
}

Test(transfer_model, garbage_and_an_empty_file_are_ignored_too) {
    moving m = moving_make();
    TEST_OK(gpuarr_calibrate(m.dev));
    gpuarr_release(m.a);
    char path[512];
    cr_assert_gt(model_files(path, sizeof path), 0);
    static const char *const bad[] = {"", "gpuarr-transfer-model 1\nhost x\n", "\x01\x02 not a model\n",
                                      "gpuarr-transfer-model 1\nhost h\nsrc s\nsrc-version v\ndst d\ndst-version v\nmodel pinned copy 1e-5 -3\nend\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        each_model_file(cut_in_half); /* every file bad, then this one as bad[i] */
        write_text(path, bad[i]);
        logged[0] = '\0';
        start(false);
        char summary[8192];
        TEST_OK(gpuarr_transfer_models_summary(summary, sizeof summary));
        cr_expect_str_eq(summary, "", "bad[%zu]: nothing loaded", i);
        cr_expect(strstr(logged, path) != NULL, "bad[%zu]: the warning names %s: %s", i, path, logged);
    }
}

static void change_version(const char *path) {
    char *text = read_text(path), out[8192];
    char *v = strstr(text, "\nsrc-version ");
    cr_assert_not_null(v, "%s", text);
    char *end = strchr(v + 1, '\n');
    *v = '\0';
    snprintf(out, sizeof out, "%s\nsrc-version driver 0.0-old%s", text, end);
    write_text(path, out);
}

Test(transfer_model, a_file_for_another_driver_version_is_refitted) {
    moving m = moving_make();
    TEST_OK(gpuarr_calibrate(m.dev));
    gpuarr_release(m.a);
    each_model_file(change_version);
    logged[0] = '\0';
    start(false);
    m = moving_make();
    cr_expect_eq(moving_estimate(&m, MIB), fallback(&m, MIB), "a stale model is not used");
    cr_expect(strstr(logged, "corrupted") == NULL, "stale is not corrupted: %s", logged);
    gpuarr_release(m.a);
    start(true);
    m = moving_make();
    cr_expect_gt(moving_estimate(&m, MIB), 0.0);
    gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(m.dev, &info));
    char path[512], want[256];
    cr_assert_gt(model_files(path, sizeof path), 0);
    snprintf(want, sizeof want, "\nsrc-version %s\n", info.version);
    bool refitted = false;
    char dir[128];
    snprintf(dir, sizeof dir, "%s/models", cache);
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) { /* the pair's file has the device's own version again */
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (strstr(e->d_name, ".model") && strstr(read_text(p), want) && !strstr(read_text(p), "0.0-old")) refitted = true;
    }
    if (d) closedir(d);
    cr_expect(refitted, "no file has \"%s\" back", want);
    gpuarr_release(m.a);
}

Test(transfer_model, calibrate_off_without_a_file_gives_the_fallback_and_writes_nothing) {
    start(false);
    moving m = moving_make();
    cr_expect_eq(moving_estimate(&m, 8 * MIB), fallback(&m, 8 * MIB));
    double s = -1;
    TEST_OK(gpuarr_transfer_estimate(m.dev, m.dev, GPUARR_F32, 8 * MIB, &s));
    cr_expect_eq(s, 0.0);
    char summary[256];
    TEST_OK(gpuarr_transfer_models_summary(summary, sizeof summary));
    cr_expect_str_eq(summary, "");
    cr_expect_eq(model_files(NULL, 0), 0);
    TEST_OK(gpuarr_calibrate(m.dev)); /* asked for: fitted even so */
    cr_expect_neq(moving_estimate(&m, 8 * MIB), fallback(&m, 8 * MIB));
    cr_expect_gt(model_files(NULL, 0), 0);
    gpuarr_release(m.a);
}

Test(transfer_model, a_cache_dir_of_off_keeps_models_in_the_process) {
    cr_assert_eq(setenv("GPUARR_CACHE_DIR", "off", 1), 0);
    start(true);
    moving m = moving_make();
    cr_expect_gt(moving_estimate(&m, MIB), 0.0);
    cr_expect_eq(model_files(NULL, 0), 0);
    gpuarr_release(m.a);
}

Test(transfer_model, calibrate_setting_is_checked) {
    gpuarr_shutdown();
    cr_assert_eq(setenv("GPUARR_CALIBRATE", "sometimes", 1), 0);
    TEST_FAIL_WITH(gpuarr_init(NULL), GPUARR_ERROR_INVALID_ARGUMENT, "GPUARR_CALIBRATE");
    cr_assert_eq(setenv("GPUARR_CALIBRATE", "OFF", 1), 0);
    TEST_OK(gpuarr_init(NULL));
}

Test(transfer_model, bad_arguments_are_named_and_leave_seconds_alone) {
    moving m = moving_make();
    double s = 42;
    gpuarr_device none = {0}, forged = {0x12345678u};
    gpuarr_array no_array = {0};
    TEST_FAIL_WITH(gpuarr_transfer_estimate_array(m.a, m.host, GPUARR_F32, 0, NULL), GPUARR_ERROR_INVALID_ARGUMENT, "seconds");
    TEST_FAIL_WITH(gpuarr_transfer_estimate_array(m.a, m.host, (gpuarr_dtype)99, 0, &s), GPUARR_ERROR_INVALID_ARGUMENT, "t = 99");
    TEST_FAIL_WITH(gpuarr_transfer_estimate_array(m.a, m.host, (gpuarr_dtype)-1, 0, &s), GPUARR_ERROR_INVALID_ARGUMENT, "t = -1");
    TEST_FAIL_WITH(gpuarr_transfer_estimate_array(no_array, m.host, GPUARR_F32, 0, &s), GPUARR_ERROR_INVALID_HANDLE, "src");
    TEST_FAIL_WITH(gpuarr_transfer_estimate_array(m.a, none, GPUARR_F32, 0, &s), GPUARR_ERROR_INVALID_HANDLE, "dst");
    TEST_FAIL_WITH(gpuarr_transfer_estimate_array(m.a, forged, GPUARR_F32, 0, &s), GPUARR_ERROR_INVALID_HANDLE, "dst");
    TEST_FAIL_WITH(gpuarr_transfer_estimate_array(m.a, m.host, GPUARR_F32, 16 * MIB + 1, &s), GPUARR_ERROR_INVALID_ARGUMENT,
                   "bytes = 16777217");
    TEST_FAIL_WITH(gpuarr_transfer_estimate_device(m.dev, m.host, GPUARR_F32, 0, NULL), GPUARR_ERROR_INVALID_ARGUMENT, "seconds");
    TEST_FAIL_WITH(gpuarr_transfer_estimate_device(m.dev, m.host, GPUARR_DTYPE_INVALID, 0, &s), GPUARR_ERROR_INVALID_ARGUMENT,
                   "t = 0");
    TEST_FAIL_WITH(gpuarr_transfer_estimate_device(m.dev, m.host, GPUARR_DTYPE_COUNT, 0, &s), GPUARR_ERROR_INVALID_ARGUMENT, "t = 14");
    TEST_FAIL_WITH(gpuarr_transfer_estimate_device(none, m.host, GPUARR_F32, 0, &s), GPUARR_ERROR_INVALID_HANDLE, "src");
    TEST_FAIL_WITH(gpuarr_transfer_estimate_device(m.dev, forged, GPUARR_F32, 0, &s), GPUARR_ERROR_INVALID_HANDLE, "dst");
    TEST_FAIL_WITH(gpuarr_calibrate(none), GPUARR_ERROR_INVALID_HANDLE, "d");
    TEST_FAIL_WITH(gpuarr_calibrate(forged), GPUARR_ERROR_INVALID_HANDLE, "d");
    char buf[8] = "xxxxxxx";
    TEST_FAIL_WITH(gpuarr_transfer_models_summary(NULL, 8), GPUARR_ERROR_INVALID_ARGUMENT, "buf");
    TEST_FAIL_WITH(gpuarr_transfer_models_summary(buf, 0), GPUARR_ERROR_INVALID_ARGUMENT, "len");
    cr_expect_str_eq(buf, "xxxxxxx");
    cr_expect_eq(s, 42.0, "seconds written on failure");
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(m.a, &info));
    gpuarr_release(m.a);
    TEST_FAIL_WITH(gpuarr_transfer_estimate_array(m.a, m.host, GPUARR_F32, 0, &s), GPUARR_ERROR_INVALID_HANDLE, "src");
    cr_expect_eq(s, 42.0);
    gpuarr_shutdown();
    TEST_FAIL_WITH(gpuarr_transfer_estimate_device(m.dev, m.host, GPUARR_F32, 0, &s), GPUARR_ERROR_NOT_INITIALIZED, "gpuarr_init");
    TEST_FAIL_WITH(gpuarr_calibrate(m.dev), GPUARR_ERROR_NOT_INITIALIZED, "gpuarr_init");
    TEST_FAIL_WITH(gpuarr_transfer_models_summary(buf, sizeof buf), GPUARR_ERROR_NOT_INITIALIZED, "gpuarr_init");
}

Test(transfer_model, the_summary_is_cut_to_its_buffer) {
    moving m = moving_make();
    moving_estimate(&m, MIB);
    char whole[8192], small[17];
    TEST_OK(gpuarr_transfer_models_summary(whole, sizeof whole));
    cr_assert_gt(strlen(whole), sizeof small);
    memset(small, 'x', sizeof small);
    TEST_OK(gpuarr_transfer_models_summary(small, sizeof small)); /* shorter than a line: no line */
    cr_expect_eq(strlen(small), 0u, "a line cut short: \"%s\"", small);
    char one[1] = {'x'};
    TEST_OK(gpuarr_transfer_models_summary(one, 1));
    cr_expect_eq(one[0], '\0');
    gpuarr_release(m.a);
}

/* Threads that need one pair at once: one fits it, the others wait, and all get its estimate. */
#define THREADS 4
static moving shared;
static void *estimate_in_thread(void *arg) {
    double *out = (double *)arg;
    *out = -1;
    if (gpuarr_transfer_estimate(shared.a, shared.host, shared.t, 5 * MIB, out) != GPUARR_OK) *out = -2;
    return NULL;
}

Test(transfer_model, threads_wait_for_one_fit) {
    shared = moving_make();
    pthread_t th[THREADS];
    double got[THREADS];
    for (int i = 0; i < THREADS; i++) cr_assert_eq(pthread_create(&th[i], NULL, estimate_in_thread, &got[i]), 0);
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < THREADS; i++) cr_expect(got[i] > 0 && got[i] == got[0], "thread %d: %g s, thread 0: %g s", i, got[i], got[0]);
    cr_expect_eq(moving_estimate(&shared, 5 * MIB), got[0]);
    gpuarr_release(shared.a);
}

/* The lines gpuarr_calibrate(d) must leave in the summary: every kind of transfer d takes part in. */
static int expect_line(const char *summary, const char *src, const char *dst, const char *kind) {
    char want[160];
    snprintf(want, sizeof want, "%s -> %s %s:", src, dst, kind);
    cr_expect(strstr(summary, want) != NULL, "no \"%s\" in:\n%s", want, summary);
    return 1;
}

static int expect_host_pairs(const char *summary, const gpuarr_device_info *e) {
    int n = 0;
    for (int cast = 0; cast < 2; cast++) { /* a unified e too */
        char pageable[32], pinned[32], device[32];
        snprintf(pageable, sizeof pageable, "pageable %s", cast ? "cast" : "copy");
        snprintf(pinned, sizeof pinned, "pinned %s", cast ? "cast" : "copy");
        snprintf(device, sizeof device, "device %s", cast ? "cast" : "copy");
        n += expect_line(summary, "host", e->spec, pageable);
        n += expect_line(summary, "host", e->spec, pinned);
        n += expect_line(summary, e->spec, "host", device);
    }
    return n;
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

Test(transfer_model, calibrate_fits_every_kind_of_transfer_of_a_device) {
    gpuarr_device dev = test_device();
    TEST_OK(gpuarr_calibrate(dev));
    static char summary[65536];
    TEST_OK(gpuarr_transfer_models_summary(summary, sizeof summary));
    gpuarr_device_info me;
    TEST_OK(gpuarr_device_get_info(dev, &me));
    int want = 0;
    if (test_device_is_host(dev)) {
        want += expect_line(summary, "host", "host", "pageable cast");
        for (int i = 1; i < gpuarr_device_count(); i++) {
            gpuarr_device_info e;
            TEST_OK(gpuarr_device_get_info(gpuarr_device_at(i), &e));
            want += expect_host_pairs(summary, &e);
        }
    } else {
        want += expect_host_pairs(summary, &me);
        want += expect_line(summary, me.spec, me.spec, "device cast");
        for (int i = 1; i < gpuarr_device_count(); i++) {
            gpuarr_device_info e;
            TEST_OK(gpuarr_device_get_info(gpuarr_device_at(i), &e));
            if (e.device.id == dev.id) continue;
            want += expect_line(summary, me.spec, e.spec, "device copy") + expect_line(summary, me.spec, e.spec, "device cast");
            want += expect_line(summary, e.spec, me.spec, "device copy") + expect_line(summary, e.spec, me.spec, "device cast");
        }
    }
    cr_expect_eq(count_lines(summary), want, "these models and no others:\n%s", summary);
    cr_expect(strstr(summary, "(measured)") != NULL && strstr(summary, "(loaded)") == NULL);
    /* written under a temporary name, then renamed: none is left */
    char dir[128];
    snprintf(dir, sizeof dir, "%s/models", cache);
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) cr_expect(strstr(e->d_name, ".tmp") == NULL, "left behind: %s", e->d_name);
    closedir(d);
}

Test(transfer_model, a_fit_that_fails_leaves_the_fallback_and_calibrate_names_the_transfer) {
    moving m = moving_make();
    TEST_OK(gpuarr_pool_set_limit(m.host, 64 << 10)); /* the host's side of every measurement fails */
    cr_expect_eq(moving_estimate(&m, MIB), fallback(&m, MIB));
    char want[64];
    gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(m.dev, &info));
    snprintf(want, sizeof want, "fitting host -> %s", info.spec);
    TEST_FAIL_WITH(gpuarr_calibrate(m.dev), GPUARR_ERROR_OUT_OF_MEMORY, want);
    TEST_OK(gpuarr_pool_set_limit(m.host, 0));
    cr_expect_eq(moving_estimate(&m, MIB), fallback(&m, MIB), "not fitted again lazily in this process");
    TEST_OK(gpuarr_calibrate(m.dev));
    cr_expect_neq(moving_estimate(&m, MIB), fallback(&m, MIB));
    gpuarr_release(m.a);
}
