/*
 * test_config.c -- configuration: every GPUARR_* variable checked once at gpuarr_init, the desc in
 * effect (gpuarr_query_desc), a second gpuarr_init with another desc, pool limits per device and
 * the host fallback, device filter messages and warnings, and the names errors give.
 * Each test runs in its own process, so environment variables set here do not leak.
 */
#include "test_common.h"

#include <sys/stat.h>
#include <unistd.h>

static void set(const char *name, const char *value) { cr_assert_eq(setenv(name, value, 1), 0); }

/* A logger that keeps the last messages, joined. */
static char logged[8192];
static void keep_log(gpuarr_log_level level, const char *message, void *user) {
    (void)level;
    (void)user;
    size_t n = strlen(logged);
    snprintf(logged + n, sizeof logged - n, "%s\n", message);
}
static gpuarr_result init_logging(const char *alloc_conf, bool host_fallback) {
    gpuarr_desc desc = {0};
    desc.logger.fn = keep_log;
    desc.alloc_conf = alloc_conf;
    desc.oom_host_fallback = host_fallback;
    logged[0] = '\0';
    return gpuarr_init(&desc);
}

/* ---- item: every variable has one parser, run at init ---- */

static void expect_rejected(const char *name, const char *value) {
    set(name, value);
    gpuarr_result r = gpuarr_init(NULL);
    if (r == GPUARR_OK) gpuarr_shutdown();
    cr_expect_eq(r, GPUARR_ERROR_INVALID_ARGUMENT, "%s=\"%.40s\": gpuarr_init gave %s", name, value, gpuarr_result_name(r));
    cr_expect(strstr(gpuarr_last_error(), name) != NULL, "%s=\"%.40s\": the error does not name it: %s", name, value,
              gpuarr_last_error());
    unsetenv(name);
}

Test(config_env, every_variable_rejects_a_bad_value_naming_it) {
    char longer[600];
    memset(longer, 'x', sizeof longer - 1);
    longer[sizeof longer - 1] = '\0';
    expect_rejected("GPUARR_DEVICES", "bogus:0");
    expect_rejected("GPUARR_LOG", "loud");
    expect_rejected("GPUARR_THREADS", "0");
    expect_rejected("GPUARR_HOST_ISA", "sse9");
    expect_rejected("GPUARR_CACHE_DIR", "relative/cache");
    expect_rejected("GPUARR_CACHE_DIR", "offf");
    expect_rejected("GPUARR_OPENCL_LIBRARY", longer);
    expect_rejected("GPUARR_OPENCL_BUILD_OPTIONS", longer);
    expect_rejected("GPUARR_OPENCL_FP64", "maybe");
    expect_rejected("GPUARR_OPENCL_UNIFIED", "bogus");
    expect_rejected("GPUARR_CUDA_LIBRARY", longer);
    expect_rejected("GPUARR_CUDA_KERNELS", "bogus");
    expect_rejected("GPUARR_NVRTC_LIBRARY", longer);
    expect_rejected("GPUARR_NVML_LIBRARY", longer);
    expect_rejected("GPUARR_PEER_COPIES", "sometimes");
    expect_rejected("GPUARR_ALLOC_CONF", "colour:blue");
    expect_rejected("GPUARR_FAULTS", "host:often=1");
    expect_rejected("GPUARR_CALIBRATE", "sometimes");
    TEST_OK(gpuarr_init(NULL)); /* nothing left behind */
    gpuarr_shutdown();
}

Test(config_env, keywords_take_any_case_and_every_boolean_spelling) {
    static const char *const flags[] = {"on", "OFF", "1", "0", "True", "false", "YES", "no"};
    for (int i = 0; i < 8; i++) {
        set("GPUARR_PEER_COPIES", flags[i]);
        set("GPUARR_OPENCL_FP64", flags[i]);
        set("GPUARR_OPENCL_UNIFIED", flags[i]);
        set("GPUARR_CALIBRATE", flags[i]);
        cr_expect_eq(gpuarr_init(NULL), GPUARR_OK, "flag \"%s\": %s", flags[i], gpuarr_last_error());
        gpuarr_shutdown();
    }
    set("GPUARR_LOG", "DeBuG");
    set("GPUARR_CUDA_KERNELS", "PTX");
    set("GPUARR_HOST_ISA", "Baseline");
    set("GPUARR_CACHE_DIR", "Off");
    TEST_OK(gpuarr_init(NULL));
    gpuarr_desc d;
    TEST_OK(gpuarr_query_desc(&d));
    cr_expect_eq(d.log_level, GPUARR_LOG_DEBUG);
    gpuarr_shutdown();
}

static gpuarr_device opencl0_or_skip(void) {
    gpuarr_device d;
    if (gpuarr_device_find("opencl:0", &d) != GPUARR_OK) test_skip("no opencl:0 here: %s", gpuarr_last_error());
    return d;
}

Test(config_env, opencl_unified_0_makes_a_unified_device_discrete) {
    set("GPUARR_OPENCL_UNIFIED", "0");
    TEST_OK(gpuarr_init(NULL));
    gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(opencl0_or_skip(), &info));
    cr_expect(!info.host_unified, "GPUARR_OPENCL_UNIFIED=0 left %s unified", info.spec);
    gpuarr_shutdown();
}

Test(config_env, opencl_fp64_false_turns_doubles_off) {
    set("GPUARR_OPENCL_FP64", "false");
    TEST_OK(gpuarr_init(NULL));
    gpuarr_device d = opencl0_or_skip();
    double in[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    gpuarr_array a = {0}, b = {0};
    TEST_OK(gpuarr_from_host(d, in, 1, shape, &a));
    cr_expect_eq(gpuarr_convert(a, d, GPUARR_F32, &b), GPUARR_ERROR_UNSUPPORTED, "an f64 cast ran with GPUARR_OPENCL_FP64=false");
    gpuarr_release(a);
    gpuarr_shutdown();
}

Test(config_env, cache_dir_OFF_is_not_a_folder_name) {
    char dir[] = "/tmp/gpuarr-config-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    cr_assert_eq(chdir(dir), 0);
    set("GPUARR_CACHE_DIR", "OFF");
    TEST_OK(gpuarr_init(NULL));
    gpuarr_device d = opencl0_or_skip();
    float in[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    gpuarr_array a = {0}, b = {0};
    TEST_OK(gpuarr_from_host(d, in, 1, shape, &a));
    TEST_OK(gpuarr_convert(a, d, GPUARR_I32, &b)); /* builds a kernel, which is cached when a cache exists */
    gpuarr_release(a);
    gpuarr_release(b);
    gpuarr_shutdown();
    struct stat st;
    cr_expect_neq(stat("OFF", &st), 0, "GPUARR_CACHE_DIR=OFF made a folder named OFF");
    rmdir("OFF");
    rmdir(dir);
}

/* ---- item: the desc in effect, and a second gpuarr_init ---- */

Test(config_desc, query_desc_gives_the_alloc_conf_in_effect) {
    gpuarr_desc desc = {0};
    desc.alloc_conf = "caching:0";
    TEST_OK(gpuarr_init(&desc));
    gpuarr_desc d;
    TEST_OK(gpuarr_query_desc(&d));
    cr_assert_not_null(d.alloc_conf, "alloc_conf set in the desc came back NULL");
    cr_expect_str_eq(d.alloc_conf, "caching:0");
    gpuarr_shutdown();
    set("GPUARR_ALLOC_CONF", "release_threshold:1M");
    TEST_OK(gpuarr_init(NULL));
    TEST_OK(gpuarr_query_desc(&d));
    cr_assert_not_null(d.alloc_conf, "GPUARR_ALLOC_CONF came back NULL");
    cr_expect_str_eq(d.alloc_conf, "release_threshold:1M");
    gpuarr_shutdown();
}

Test(config_desc, a_second_init_with_another_desc_fails_naming_the_field) {
    gpuarr_desc first = {0};
    first.host_threads = 2;
    first.alloc_conf = "caching:1";
    TEST_OK(gpuarr_init(&first));
    gpuarr_desc other = {0};
    other.host_threads = 1;
    cr_expect_eq(gpuarr_init(&other), GPUARR_ERROR_INVALID_ARGUMENT, "a different host_threads was accepted");
    cr_expect(strstr(gpuarr_last_error(), "host_threads") != NULL, "%s", gpuarr_last_error());
    other.host_threads = 0;
    other.alloc_conf = "caching:0";
    cr_expect_eq(gpuarr_init(&other), GPUARR_ERROR_INVALID_ARGUMENT, "a different alloc_conf was accepted");
    cr_expect(strstr(gpuarr_last_error(), "alloc_conf") != NULL, "%s", gpuarr_last_error());
    gpuarr_desc d;
    TEST_OK(gpuarr_query_desc(&d));
    cr_expect_eq(d.host_threads, 2);
    TEST_OK(gpuarr_init(&first)); /* the same desc: a reference */
    gpuarr_desc zero = {0};
    TEST_OK(gpuarr_init(&zero)); /* fields left zero accept what runs */
    TEST_OK(gpuarr_init(NULL));
    for (int i = 0; i < 3; i++) gpuarr_shutdown();
    cr_expect(gpuarr_is_initialized(), "a refused init added a reference, or an accepted one did not");
    gpuarr_shutdown();
    cr_expect(!gpuarr_is_initialized(), "the refused inits added references");
}

/* ---- item: limits per device, the host fallback ---- */

static gpuarr_pool_stats pool_of(gpuarr_device d) {
    gpuarr_pool_stats st;
    TEST_OK(gpuarr_pool_get_stats(d, &st));
    return st;
}

Test(config_pool, a_limit_applies_to_devices_and_host_limit_to_the_host) {
    TEST_OK(init_logging("limit:1M,host_fallback:1", false));
    int64_t shape[1] = {4 << 20};
    gpuarr_array a;
    TEST_OK(gpuarr_empty(gpuarr_host(), GPUARR_U8, 1, shape, &a)); /* the host has no limit */
    TEST_OK(gpuarr_release(a));
    cr_expect_eq(pool_of(gpuarr_host()).limit_bytes, 0u);
    gpuarr_device d = test_device();
    if (!test_device_is_host(d)) cr_expect_eq(pool_of(d).limit_bytes, (uint64_t)(1 << 20));
    gpuarr_shutdown();
    TEST_OK(init_logging("limit:2G,host_limit:1M", false));
    cr_expect_eq(gpuarr_empty(gpuarr_host(), GPUARR_U8, 1, shape, &a), GPUARR_ERROR_OUT_OF_MEMORY);
    cr_expect_eq(pool_of(gpuarr_host()).limit_bytes, (uint64_t)(1 << 20));
    gpuarr_shutdown();
}

Test(config_pool, the_fallback_is_logged_only_when_it_worked) {
    gpuarr_device d;
    set("GPUARR_FAULTS", "host:above=1M"); /* the host cannot take it either */
    TEST_OK(init_logging("limit:1M,host_fallback:1", false));
    d = test_device();
    if (test_device_is_host(d)) test_skip("the host has no host to fall back to");
    int64_t shape[1] = {4 << 20};
    gpuarr_array a;
    cr_expect_eq(gpuarr_empty(d, GPUARR_U8, 1, shape, &a), GPUARR_ERROR_OUT_OF_MEMORY);
    cr_expect(strstr(logged, "on the host") == NULL, "a fallback that failed was logged: %s", logged);
    cr_expect_eq(pool_of(d).host_fallbacks, 0u);
    gpuarr_shutdown();
}

Test(config_pool, host_fallback_0_in_alloc_conf_turns_the_desc_flag_off) {
    TEST_OK(init_logging("limit:1M,host_fallback:0", true));
    gpuarr_desc q;
    TEST_OK(gpuarr_query_desc(&q));
    cr_expect(!q.oom_host_fallback, "host_fallback:0 left desc.oom_host_fallback on");
    gpuarr_device d = test_device();
    if (!test_device_is_host(d)) {
        int64_t shape[1] = {4 << 20};
        gpuarr_array a;
        cr_expect_eq(gpuarr_empty(d, GPUARR_U8, 1, shape, &a), GPUARR_ERROR_OUT_OF_MEMORY);
    }
    gpuarr_shutdown();
}

/* ---- item: device filter messages, library paths, API names ---- */

Test(config_devices, a_filtered_out_device_is_named_as_such) {
    set("GPUARR_DEVICES", "opencl:1");
    TEST_OK(gpuarr_init(NULL));
    gpuarr_device d;
    if (gpuarr_device_find("opencl:1", &d) != GPUARR_OK) test_skip("no opencl:1 here (POCL_DEVICES=\"pthread pthread\")");
    cr_expect_eq(gpuarr_device_find("opencl:0", &d), GPUARR_ERROR_NO_DEVICE);
    cr_expect(strstr(gpuarr_last_error(), "leaves it out") && strstr(gpuarr_last_error(), "opencl:1"), "%s", gpuarr_last_error());
    gpuarr_shutdown();
}

Test(config_devices, a_filter_naming_an_absent_device_warns) {
    set("GPUARR_DEVICES", "host,opencl:7");
    TEST_OK(init_logging(NULL, false));
    cr_expect(strstr(logged, "opencl:7") != NULL, "no warning about opencl:7; the log: %s", logged);
    gpuarr_shutdown();
}

static void expect_library_reason(const char *var, const char *spec) {
    set(var, "/nonexistent/libgpuarr-test.so");
    TEST_OK(gpuarr_init(NULL));
    gpuarr_device d;
    cr_expect_eq(gpuarr_device_find(spec, &d), GPUARR_ERROR_NO_DEVICE);
    cr_expect(strstr(gpuarr_last_error(), "/nonexistent/libgpuarr-test.so") && strstr(gpuarr_last_error(), "No such file"),
              "%s: the path or dlerror() is missing: %s", var, gpuarr_last_error());
    gpuarr_shutdown();
    unsetenv(var);
}

Test(config_devices, a_bad_library_path_is_named_with_the_loader_reason) {
    expect_library_reason("GPUARR_OPENCL_LIBRARY", "opencl:0");
    expect_library_reason("GPUARR_CUDA_LIBRARY", "cuda:0");
}

Test(config_devices, typed_host_io_errors_name_the_typed_call) {
    TEST_OK(gpuarr_init(NULL));
    float out[4];
    cr_expect_eq(gpuarr_to_host((gpuarr_array){0}, out, 4), GPUARR_ERROR_INVALID_HANDLE);
    cr_expect(strncmp(gpuarr_last_error(), "gpuarr_to_host:", 15) == 0, "%s", gpuarr_last_error());
    cr_expect_eq(gpuarr_to_host_as((gpuarr_array){0}, GPUARR_F32, out, 4), GPUARR_ERROR_INVALID_HANDLE);
    cr_expect(strncmp(gpuarr_last_error(), "gpuarr_to_host_as:", 18) == 0, "%s", gpuarr_last_error());
    gpuarr_array a;
    cr_expect_eq(gpuarr_from_host((gpuarr_device){0}, out, 1, (int64_t[]){4}, &a), GPUARR_ERROR_INVALID_HANDLE);
    cr_expect(strncmp(gpuarr_last_error(), "gpuarr_from_host:", 17) == 0, "%s", gpuarr_last_error());
    gpuarr_shutdown();
}

/* The entry points behind the typed wrappers: they do what the _as calls do and report errors
   under the name they are given. */
Test(config_devices, the_named_host_io_entries_copy_and_report_under_their_name) {
    TEST_OK(gpuarr_init(NULL));
    float in[4] = {1.5f, -2.0f, 3.25f, 0.0f};
    double back[4] = {0};
    gpuarr_array a;
    TEST_OK(gpuarr__from_host_named("my_upload", gpuarr_host(), GPUARR_F32, in, 1, (int64_t[]){4}, &a));
    TEST_OK(gpuarr__to_host_named("my_download", a, GPUARR_F64, back, 4));
    for (int i = 0; i < 4; i++) cr_expect_eq(back[i], (double)in[i], "element %d", i);
    cr_expect_eq(gpuarr__to_host_named("my_download", a, GPUARR_F64, back, 3), GPUARR_ERROR_INVALID_ARGUMENT);
    cr_expect(strncmp(gpuarr_last_error(), "my_download:", 12) == 0, "%s", gpuarr_last_error());
    gpuarr_array b;
    cr_expect_eq(gpuarr__from_host_named("my_upload", (gpuarr_device){0}, GPUARR_F32, in, 1, (int64_t[]){4}, &b),
                 GPUARR_ERROR_INVALID_HANDLE);
    cr_expect(strncmp(gpuarr_last_error(), "my_upload:", 10) == 0, "%s", gpuarr_last_error());
    TEST_OK(gpuarr_release(a));
    gpuarr_shutdown();
}
