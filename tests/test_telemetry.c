/* gpuarr_device_get_telemetry on the device under test (GPUARR_TEST_DEVICE): valid bits that agree
   with the values, the errors. Where GPUARR_NVML_LIBRARY is tests/fake_nvml and the CUDA driver is
   tests/fake_cuda (make test's run on the fake driver), the NVML paths: each CUDA device reads the
   record of its own UUID (the fake lists them in reversed order, so a match by index fails), the
   older entry points where the newer are missing, and the driver's memory figures alone where
   NVML is missing, fails to start or does not know the device. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include "test_common.h"

TestSuite(telemetry, .init = test_setup, .fini = test_teardown);

#define ALL_BITS ((uint32_t)((1u << GPUARR_TELEMETRY_COUNT) - 1u))
#define GIB (1ull << 30)
#define MIB (1ull << 20)

static gpuarr_telemetry read_telemetry(gpuarr_device d) {
    gpuarr_telemetry t;
    memset(&t, 0xab, sizeof t); /* every field is written, read or not */
    TEST_OK(gpuarr_device_get_telemetry(d, &t));
    return t;
}

/* What holds on every device: no unknown bit, every field of a clear bit 0, every value of a set
   one plausible. */
static void expect_consistent(const gpuarr_telemetry *t, const char *spec) {
    cr_assert_eq(t->valid & ~ALL_BITS, 0u, "%s: unknown valid bits 0x%x", spec, t->valid);
#define BIT(name) ((t->valid & (uint32_t)GPUARR_TELEMETRY_##name) != 0)
    cr_assert(BIT(MEMORY_TOTAL), "%s: every backend reports its total memory (valid 0x%x)", spec, t->valid);
    cr_assert_gt(t->memory_total, 0u, "%s", spec);
    if (BIT(MEMORY_USAGE)) {
        cr_assert_leq(t->memory_free, t->memory_total, "%s", spec);
        cr_assert_leq(t->memory_used, t->memory_total - t->memory_free, "%s: used %llu + free %llu > total %llu", spec,
                      (unsigned long long)t->memory_used, (unsigned long long)t->memory_free, (unsigned long long)t->memory_total);
    } else {
        cr_assert(t->memory_used == 0 && t->memory_free == 0, "%s: memory usage set without its bit", spec);
    }
    if (BIT(GPU_UTILIZATION)) cr_assert(t->gpu_utilization_pct >= 0 && t->gpu_utilization_pct <= 100, "%s: %d %%", spec, t->gpu_utilization_pct);
    else cr_assert_eq(t->gpu_utilization_pct, 0, "%s", spec);
    if (BIT(MEMORY_UTILIZATION)) cr_assert(t->memory_utilization_pct >= 0 && t->memory_utilization_pct <= 100, "%s", spec);
    else cr_assert_eq(t->memory_utilization_pct, 0, "%s", spec);
    if (BIT(TEMPERATURE)) cr_assert(t->temperature_c > -60 && t->temperature_c < 200, "%s: %g C", spec, t->temperature_c);
    else cr_assert(t->temperature_c == 0.0, "%s", spec);
    if (BIT(POWER)) cr_assert(t->power_w >= 0, "%s", spec);
    else cr_assert(t->power_w == 0.0, "%s", spec);
    if (BIT(POWER_LIMIT)) cr_assert(t->power_limit_w > 0, "%s", spec);
    else cr_assert(t->power_limit_w == 0.0, "%s", spec);
    if (BIT(SM_CLOCK)) cr_assert_gt(t->sm_clock_mhz, 0, "%s", spec);
    else cr_assert_eq(t->sm_clock_mhz, 0, "%s", spec);
    if (BIT(MEMORY_CLOCK)) cr_assert_gt(t->memory_clock_mhz, 0, "%s", spec);
    else cr_assert_eq(t->memory_clock_mhz, 0, "%s", spec);
    if (!BIT(THROTTLE_REASONS)) cr_assert_eq(t->throttle_reasons, 0u, "%s", spec);
    if (BIT(PCIE_GENERATION)) cr_assert(t->pcie_generation >= 1 && t->pcie_generation <= 8, "%s", spec);
    else cr_assert_eq(t->pcie_generation, 0, "%s", spec);
    if (BIT(PCIE_WIDTH)) cr_assert(t->pcie_width >= 1 && t->pcie_width <= 64, "%s", spec);
    else cr_assert_eq(t->pcie_width, 0, "%s", spec);
#undef BIT
}

Test(telemetry, the_valid_bits_agree_with_the_values_on_the_device_under_test) {
    gpuarr_device d = test_device();
    gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(d, &info));
    for (int round = 0; round < 3; round++) { /* the host's CPU utilization: since boot, then since the last call */
        gpuarr_telemetry t = read_telemetry(d);
        expect_consistent(&t, info.spec);
        if (info.backend == GPUARR_BACKEND_HOST) {
            uint32_t want = GPUARR_TELEMETRY_MEMORY_TOTAL | GPUARR_TELEMETRY_MEMORY_USAGE | GPUARR_TELEMETRY_GPU_UTILIZATION;
            cr_assert_eq(t.valid & want, want, "host: memory and CPU utilization come from /proc (valid 0x%x)", t.valid);
            cr_assert_eq(t.valid & ~(want | (uint32_t)GPUARR_TELEMETRY_TEMPERATURE), 0u, "host: valid 0x%x", t.valid);
            cr_assert_eq(t.memory_total, info.total_memory, "host: MemTotal both ways");
            cr_assert_eq(t.memory_used + t.memory_free, t.memory_total, "host: used is total - MemAvailable");
        } else if (info.backend == GPUARR_BACKEND_OPENCL && strstr(info.version, "PoCL") && !info.same_as.id) {
            cr_assert_eq(t.valid, (uint32_t)GPUARR_TELEMETRY_MEMORY_TOTAL, "PoCL offers its total memory only (valid 0x%x)", t.valid);
            cr_assert_eq(t.memory_total, info.total_memory, "%s: CL_DEVICE_GLOBAL_MEM_SIZE", info.spec);
        } else if (info.backend == GPUARR_BACKEND_CUDA && !(t.valid & (uint32_t)GPUARR_TELEMETRY_TEMPERATURE)) {
            cr_assert_eq(t.memory_total, info.total_memory, "%s without NVML: the driver's total", info.spec);
        }
    }
}

Test(telemetry, the_errors_name_the_argument_and_leave_out_untouched) {
    gpuarr_device d = test_device();
    cr_assert_eq(gpuarr_device_get_telemetry(d, NULL), GPUARR_ERROR_INVALID_ARGUMENT);
    cr_assert_str_eq(gpuarr_last_error(), "gpuarr_device_get_telemetry: out is NULL");
    gpuarr_telemetry t, before;
    memset(&t, 0x5a, sizeof t);
    before = t;
    cr_assert_eq(gpuarr_device_get_telemetry((gpuarr_device){0}, &t), GPUARR_ERROR_INVALID_HANDLE);
    cr_assert_str_eq(gpuarr_last_error(), "gpuarr_device_get_telemetry: d is a zero device handle");
    cr_assert_eq(gpuarr_device_get_telemetry((gpuarr_device){d.id + 0x1000u}, &t), GPUARR_ERROR_INVALID_HANDLE);
    cr_assert(strstr(gpuarr_last_error(), "gpuarr_device_get_telemetry: d (id 0x"), "%s", gpuarr_last_error());
    cr_assert_eq(memcmp(&t, &before, sizeof t), 0, "a failed call wrote *out");
    gpuarr_shutdown();
    cr_assert_eq(gpuarr_device_get_telemetry(d, &t), GPUARR_ERROR_NOT_INITIALIZED);
    cr_assert_str_eq(gpuarr_last_error(), "gpuarr_device_get_telemetry: gpuarr is not initialized (call gpuarr_init first)");
    cr_assert_eq(memcmp(&t, &before, sizeof t), 0, "a failed call wrote *out");
}

Test(telemetry, every_bit_has_one_name_and_anything_else_is_unknown) {
    static const char *const want[] = {"memory_total", "memory_usage", "gpu_utilization", "memory_utilization",
                                       "temperature", "power", "power_limit", "sm_clock", "memory_clock",
                                       "throttle_reasons", "pcie_generation", "pcie_width"};
    cr_assert_eq(GPUARR_TELEMETRY_COUNT, 12);
    for (int i = 0; i < GPUARR_TELEMETRY_COUNT; i++) cr_assert_str_eq(gpuarr_telemetry_name(1u << i), want[i], "bit %d", i);
    cr_assert_str_eq(gpuarr_telemetry_name(GPUARR_TELEMETRY_PCIE_WIDTH), "pcie_width");
    cr_assert_str_eq(gpuarr_telemetry_name(0), "unknown");
    cr_assert_str_eq(gpuarr_telemetry_name(3), "unknown");
    cr_assert_str_eq(gpuarr_telemetry_name(1u << GPUARR_TELEMETRY_COUNT), "unknown");
    gpuarr_shutdown();
    cr_assert_str_eq(gpuarr_telemetry_name(GPUARR_TELEMETRY_TEMPERATURE), "temperature", "works without gpuarr_init");
}

static void *telemetry_worker(void *arg) {
    (void)arg;
    for (int k = 0; k < 40; k++)
        for (int i = 0; i < gpuarr_device_count(); i++) {
            gpuarr_telemetry t;
            if (gpuarr_device_get_telemetry(gpuarr_device_at(i), &t) != GPUARR_OK || !(t.valid & (uint32_t)GPUARR_TELEMETRY_MEMORY_TOTAL))
                return (void *)1;
        }
    return NULL;
}

Test(telemetry, every_device_answers_from_several_threads_at_once) {
    pthread_t th[4];
    for (int i = 0; i < 4; i++) cr_assert_eq(pthread_create(&th[i], NULL, telemetry_worker, NULL), 0);
    for (int i = 0; i < 4; i++) {
        void *ret;
        pthread_join(th[i], &ret);
        cr_assert_null(ret, "a thread's telemetry call failed");
    }
}

/* ---- NVML: the fake NVML with the fake CUDA driver -------------------------------------------- */
static void setenv_or_die(const char *k, const char *v) { cr_assert_eq(setenv(k, v, 1), 0); }

/* Skips unless the CUDA driver is tests/fake_cuda and GPUARR_NVML_LIBRARY tests/fake_nvml. */
static void require_fakes(void) {
    const char *cuda = getenv("GPUARR_CUDA_LIBRARY"), *nvml = getenv("GPUARR_NVML_LIBRARY");
    void *driver = cuda ? dlopen(cuda, RTLD_NOW | RTLD_NOLOAD) : NULL;
    if (!driver || !dlsym(driver, "fake_cuda_ops_run")) test_skip("the CUDA driver is not tests/fake_cuda (GPUARR_CUDA_LIBRARY)");
    if (!nvml || !strstr(nvml, "fake-nvml/")) test_skip("GPUARR_NVML_LIBRARY is not tests/fake_nvml (make test sets both in its fake-driver runs)");
}

/* Starts gpuarr again with a variable set (NULL: none) while gpuarr_init reads it, unset after. */
static void reinit_with(const char *key, const char *value) {
    gpuarr_shutdown();
    if (key) setenv_or_die(key, value);
    gpuarr_result r = gpuarr_init(NULL);
    if (key) unsetenv(key);
    cr_assert_eq(r, GPUARR_OK, "gpuarr_init with %s=%s: %s", key ? key : "-", value ? value : "-", gpuarr_last_error());
}

static gpuarr_device cuda(int c) {
    char spec[16];
    snprintf(spec, sizeof spec, "cuda:%d", c);
    gpuarr_device d;
    TEST_OK(gpuarr_device_find(spec, &d));
    return d;
}

/* The fake's readings for CUDA device c (tests/fake_nvml/fake_nvml.c); `older`: through the
   older entry points (memory v1, the management power limit). */
static void expect_fake_record(int c, bool older) {
    gpuarr_telemetry t = read_telemetry(cuda(c));
    expect_consistent(&t, "fake NVML");
    unsigned long long uc = (unsigned long long)c;
    cr_assert_eq(t.valid, ALL_BITS, "cuda:%d: every reading (valid 0x%x)", c, t.valid);
    cr_assert(t.temperature_c == 40.0 + 10.0 * c, "cuda:%d: %g C is another device's (matched by index?)", c, t.temperature_c);
    cr_assert_eq(t.memory_total, (8 + uc) * GIB, "cuda:%d", c);
    cr_assert_eq(t.memory_used, (1 + uc) * 256 * MIB + (older ? 64 * MIB : 0), "cuda:%d: used (%s)", c, older ? "v1: reserved included" : "v2");
    cr_assert_eq(t.memory_free, (8 + uc) * GIB - 64 * MIB - (1 + uc) * 256 * MIB, "cuda:%d", c);
    cr_assert_eq(t.gpu_utilization_pct, 10 + c);
    cr_assert_eq(t.memory_utilization_pct, 20 + c);
    cr_assert(t.power_w == 100.0 + c, "cuda:%d: %g W", c, t.power_w);
    cr_assert(t.power_limit_w == (older ? 300.0 : 250.0) + c, "cuda:%d: limit %g W (%s)", c, t.power_limit_w,
              older ? "management limit" : "enforced limit");
    cr_assert_eq(t.sm_clock_mhz, 1500 + c);
    cr_assert_eq(t.memory_clock_mhz, 5000 + c);
    cr_assert_eq(t.throttle_reasons, 1ull << c);
    cr_assert_eq(t.pcie_generation, 3 + c % 3);
    cr_assert_eq(t.pcie_width, 16 >> c);
}

Test(telemetry, each_cuda_device_reads_the_nvml_record_of_its_own_uuid) {
    require_fakes();
    for (int c = 0; c < 2; c++) expect_fake_record(c, false);
    expect_fake_record(0, false); /* the handle, looked up once, stays right */
}

Test(telemetry, without_the_newer_entry_points_the_older_ones_answer) {
    require_fakes();
    setenv_or_die("FAKE_NVML_NO_V2", "1"); /* they answer NVML_ERROR_FUNCTION_NOT_FOUND */
    for (int c = 0; c < 2; c++) expect_fake_record(c, true);
}

Test(telemetry, an_nvml_lacking_the_newer_symbols_is_read_through_the_older_ones) {
    require_fakes();
    const char *old = getenv("GPUARR_TEST_FAKE_NVML_OLD");
    if (!old) test_skip("GPUARR_TEST_FAKE_NVML_OLD (build/fake-nvml-old/libnvidia-ml.so.1) is not set");
    reinit_with("GPUARR_NVML_LIBRARY", old);
    for (int c = 0; c < 2; c++) expect_fake_record(c, true);
}

/* Without NVML's record: the driver's total always; free and used once the device is open. */
static void expect_driver_memory_only(void) {
    gpuarr_device d0 = cuda(0), d1 = cuda(1);
    gpuarr_array a;
    int64_t shape[1] = {1 << 20};
    TEST_OK(gpuarr_empty(d0, GPUARR_F32, 1, shape, &a)); /* opens cuda:0 */
    gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(d0, &info));
    gpuarr_telemetry t = read_telemetry(d0);
    expect_consistent(&t, "cuda:0");
    cr_assert_eq(t.valid, (uint32_t)(GPUARR_TELEMETRY_MEMORY_TOTAL | GPUARR_TELEMETRY_MEMORY_USAGE), "valid 0x%x", t.valid);
    cr_assert_eq(t.memory_total, info.total_memory, "cuDeviceTotalMem");
    cr_assert_eq(t.memory_used + t.memory_free, t.memory_total);
    cr_assert_geq(t.memory_used, 4u << 20, "cuMemGetInfo counts the array's 4 MiB");
    t = read_telemetry(d1); /* not open, its primary context inactive: no context is made for this */
    expect_consistent(&t, "cuda:1");
    cr_assert_eq(t.valid, (uint32_t)GPUARR_TELEMETRY_MEMORY_TOTAL, "valid 0x%x", t.valid);
    TEST_OK(gpuarr_release(a));
}

Test(telemetry, nvml_failing_to_start_leaves_the_driver_memory_figures) {
    require_fakes();
    setenv_or_die("FAKE_NVML_INIT_FAIL", "1");
    expect_driver_memory_only();
}

Test(telemetry, a_missing_nvml_leaves_the_driver_memory_figures) {
    require_fakes();
    char fake[512];
    snprintf(fake, sizeof fake, "%s", getenv("GPUARR_NVML_LIBRARY"));
    reinit_with("GPUARR_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1");
    setenv_or_die("GPUARR_NVML_LIBRARY", fake); /* too late: gpuarr_init read the variable */
    expect_driver_memory_only();
}

Test(telemetry, nvml_not_knowing_the_devices_leaves_the_driver_memory_figures) {
    require_fakes();
    setenv_or_die("FAKE_NVML_DEVICES", "0");
    expect_driver_memory_only();
}

Test(telemetry, nvml_starts_at_the_first_call_and_stops_with_gpuarr) {
    require_fakes();
    const char *path = getenv("GPUARR_NVML_LIBRARY");
    cr_assert_null(dlopen(path, RTLD_NOW | RTLD_NOLOAD), "NVML was loaded before any telemetry call");
    read_telemetry(gpuarr_host());
    cr_assert_null(dlopen(path, RTLD_NOW | RTLD_NOLOAD), "the host's telemetry loaded NVML");
    read_telemetry(cuda(1));
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    cr_assert_not_null(lib, "the first CUDA telemetry call did not load NVML");
    int (*live)(void) = NULL;
    *(void **)&live = dlsym(lib, "fake_nvml_inits_live");
    cr_assert_not_null(live);
    cr_assert_eq(live(), 1);
    read_telemetry(cuda(0));
    cr_assert_eq(live(), 1, "nvmlInit_v2 once per gpuarr_init");
    gpuarr_shutdown();
    cr_assert_eq(live(), 0, "gpuarr_shutdown did not call nvmlShutdown");
    reinit_with(NULL, NULL);
    expect_fake_record(1, false);
    cr_assert_eq(live(), 1, "NVML starts again after a new gpuarr_init");
    dlclose(lib);
}

static void capture_log(gpuarr_log_level level, const char *message, void *user) {
    char *seen = user;
    if (level == GPUARR_LOG_INFO && strstr(message, "telemetry:")) snprintf(seen, 512, "%s", message);
}

Test(telemetry, a_missing_nvml_is_logged_at_info_level_with_the_loader_reason) {
    require_fakes();
    gpuarr_shutdown();
    static char seen[512];
    gpuarr_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.logger.fn = capture_log;
    desc.logger.user_data = seen;
    desc.log_level = GPUARR_LOG_INFO;
    setenv_or_die("GPUARR_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1");
    TEST_OK(gpuarr_init(&desc));
    cr_assert_eq(seen[0], '\0', "logged before any telemetry call: %s", seen);
    read_telemetry(cuda(0));
    cr_assert(strstr(seen, "cannot load /nonexistent/libnvidia-ml.so.1 (GPUARR_NVML_LIBRARY)") && strstr(seen, "No such file"), "%s", seen);
}
