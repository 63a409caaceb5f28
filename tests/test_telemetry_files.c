/*
 * test_telemetry_files.c -- white-box tests of telemetry: the host's readers of /proc/meminfo,
 * /proc/stat and hwmon, on fixture files written under a temporary folder that
 * gpuarr__g.host_telemetry.fs_root points at (well-formed and malformed ones); and an OpenCL device
 * linked to a CUDA device (same_as) reading that device's NVML record, with the link made by hand
 * (PoCL and the fake CUDA driver share no UUID), where the fake driver and the fake NVML are in
 * use. This file compiles the implementation itself.
 */
#define GPUARR_IMPLEMENTATION
#include "test_common.h"

#include <sys/stat.h>

static char root[256];

static void write_file(const char *rel, const char *text) {
    char path[512], dir[512];
    snprintf(path, sizeof path, "%s%s", root, rel);
    snprintf(dir, sizeof dir, "%s", path);
    for (char *p = dir + strlen(root) + 1; *p; p++) /* make the folders on the way */
        if (*p == '/') {
            *p = '\0';
            mkdir(dir, 0755);
            *p = '/';
        }
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

static void remove_file(const char *rel) {
    char path[512];
    snprintf(path, sizeof path, "%s%s", root, rel);
    unlink(path);
}

static void init_host_with_fixtures(void) {
    gpuarr_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.devices = "host";
    TEST_OK(gpuarr_init(&desc));
    snprintf(root, sizeof root, "/tmp/gpuarr-telemetry-XXXXXX");
    cr_assert_not_null(mkdtemp(root));
    snprintf(gpuarr__g.host_telemetry.fs_root, sizeof gpuarr__g.host_telemetry.fs_root, "%s", root);
}

static void remove_fixtures(void) {
    gpuarr_shutdown();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (root[0] && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
}

TestSuite(telemetry_files, .init = init_host_with_fixtures, .fini = remove_fixtures);

static gpuarr_telemetry host_telemetry(void) {
    gpuarr_telemetry t;
    TEST_OK(gpuarr_device_get_telemetry(gpuarr_host(), &t));
    return t;
}

#define HAS(t, name) (((t).valid & (uint32_t)GPUARR_TELEMETRY_##name) != 0)

Test(telemetry_files, meminfo_gives_total_and_available_in_kib) {
    write_file("/proc/meminfo", "MemTotal:       16000000 kB\nMemFree:         1000000 kB\nMemAvailable:    4000000 kB\n");
    gpuarr_telemetry t = host_telemetry();
    cr_assert(HAS(t, MEMORY_TOTAL) && HAS(t, MEMORY_USAGE));
    cr_assert_eq(t.memory_total, 16000000ull * 1024);
    cr_assert_eq(t.memory_free, 4000000ull * 1024, "free is MemAvailable, not MemFree");
    cr_assert_eq(t.memory_used, 12000000ull * 1024);
}

Test(telemetry_files, malformed_meminfo_leaves_the_memory_bits_clear) {
    static const char *const bad_total[] = {
        "MemTotal: lots kB\nMemAvailable: 5 kB\n",        /* not a number */
        "MemTotal: 100\nMemAvailable: 5 kB\n",            /* no unit */
        "MemTotal: 0 kB\nMemAvailable: 0 kB\n",           /* nothing */
        "MemTotalX: 100 kB\nMemAvailable: 5 kB\n",        /* another key */
        "MemTotal: 99999999999999999999 kB\n",             /* beyond 64 bits */
        "MemTotal: 18014398509481984 kB\n",                /* 2^54 KiB: beyond 64 bits in bytes */
        "",
    };
    for (size_t i = 0; i < sizeof bad_total / sizeof bad_total[0]; i++) {
        write_file("/proc/meminfo", bad_total[i]);
        gpuarr_telemetry t = host_telemetry();
        cr_assert(!HAS(t, MEMORY_TOTAL) && !HAS(t, MEMORY_USAGE), "\"%s\" read as valid", bad_total[i]);
        cr_assert(t.memory_total == 0 && t.memory_free == 0 && t.memory_used == 0);
    }
    write_file("/proc/meminfo", "MemTotal: 100 kB\nMemAvailable: 200 kB\n"); /* more available than there is */
    gpuarr_telemetry t = host_telemetry();
    cr_assert(HAS(t, MEMORY_TOTAL) && !HAS(t, MEMORY_USAGE));
    cr_assert_eq(t.memory_total, 102400u);
    write_file("/proc/meminfo", "MemTotal: 100 kB\n"); /* a kernel before 3.14: no MemAvailable */
    t = host_telemetry();
    cr_assert(HAS(t, MEMORY_TOTAL) && !HAS(t, MEMORY_USAGE));
    remove_file("/proc/meminfo");
    t = host_telemetry();
    cr_assert(!HAS(t, MEMORY_TOTAL));
}

Test(telemetry_files, cpu_utilization_is_since_boot_first_then_since_the_last_call) {
    write_file("/proc/stat", "cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 100 0 100 700 100 0 0 0 0 0\nintr 1\n");
    gpuarr_telemetry t = host_telemetry();
    cr_assert(HAS(t, GPU_UTILIZATION));
    cr_assert_eq(t.gpu_utilization_pct, 20, "200 busy of 1000 ticks (idle and iowait are not busy)");
    write_file("/proc/stat", "cpu  150 0 150 750 150 0 0 0 0 0\n");
    t = host_telemetry();
    cr_assert_eq(t.gpu_utilization_pct, 50, "100 busy of the 200 ticks since the last call");
    t = host_telemetry();
    cr_assert(HAS(t, GPU_UTILIZATION));
    cr_assert_eq(t.gpu_utilization_pct, 50, "no tick since: the last value again");
    write_file("/proc/stat", "cpu  150 0 150 850 150 0 0 0 0 0\n");
    t = host_telemetry();
    cr_assert_eq(t.gpu_utilization_pct, 0, "idle since");
    write_file("/proc/stat", "cpu  1 0 1 2\n"); /* counters went back (another machine's file): since boot */
    t = host_telemetry();
    cr_assert_eq(t.gpu_utilization_pct, 50);
}

Test(telemetry_files, malformed_proc_stat_leaves_the_utilization_bit_clear) {
    static const char *const bad[] = {
        "cpu  1 2 3\n",                               /* fewer than user nice system idle */
        "intr 5\ncpu  1 2 3 4\n",                     /* not the first line */
        "cpu  1 2 3 x 5\n",                           /* not a number */
        "cpu  99999999999999999999 1 1 1\n",          /* beyond 64 bits */
        "cpu  18446744073709551615 1 1 1\n",          /* the sum beyond 64 bits */
        "cpu0 1 2 3 4\n",                             /* one CPU, not all */
        "",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file("/proc/stat", bad[i]);
        gpuarr_telemetry t = host_telemetry();
        cr_assert(!HAS(t, GPU_UTILIZATION), "\"%s\" read as valid", bad[i]);
        cr_assert_eq(t.gpu_utilization_pct, 0);
    }
    remove_file("/proc/stat");
    cr_assert(!HAS(host_telemetry(), GPU_UTILIZATION));
}

Test(telemetry_files, the_temperature_comes_from_a_cpu_sensor_by_hwmon_name) {
    write_file("/sys/class/hwmon/hwmon0/name", "acpitz\n"); /* not a CPU sensor gpuarr knows */
    write_file("/sys/class/hwmon/hwmon0/temp1_input", "99000\n");
    gpuarr_telemetry t = host_telemetry();
    cr_assert(!HAS(t, TEMPERATURE), "acpitz taken for the CPU");
    write_file("/sys/class/hwmon/hwmon2/name", "coretemp\n");
    write_file("/sys/class/hwmon/hwmon2/temp2_input", "45500\n"); /* no temp1_input: the first that reads */
    write_file("/sys/class/hwmon/hwmon2/temp3_input", "60000\n");
    t = host_telemetry();
    cr_assert(HAS(t, TEMPERATURE));
    cr_assert(t.temperature_c == 45.5, "%g", t.temperature_c);
    write_file("/sys/class/hwmon/hwmon1/name", "k10temp\n"); /* a lower number wins */
    write_file("/sys/class/hwmon/hwmon1/temp1_input", "-5000\n");
    t = host_telemetry();
    cr_assert(t.temperature_c == -5.0, "%g", t.temperature_c);
    static const char *const names[] = {"zenpower\n", "cpu_thermal\n"};
    for (int i = 0; i < 2; i++) {
        write_file("/sys/class/hwmon/hwmon1/name", names[i]);
        cr_assert(host_telemetry().temperature_c == -5.0, "%s", names[i]);
    }
}

Test(telemetry_files, malformed_hwmon_files_leave_the_temperature_bit_clear) {
    static const char *const bad[] = {"abc\n", "", "42 C\n", "12.5\n", "99999999999999999999999\n", "2000000\n"};
    write_file("/sys/class/hwmon/hwmon0/name", "k10temp\n");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file("/sys/class/hwmon/hwmon0/temp1_input", bad[i]);
        gpuarr_telemetry t = host_telemetry();
        cr_assert(!HAS(t, TEMPERATURE), "\"%s\" read as a temperature", bad[i]);
        cr_assert(t.temperature_c == 0.0);
    }
    write_file("/sys/class/hwmon/hwmon0/name", ""); /* an empty name */
    write_file("/sys/class/hwmon/hwmon0/temp1_input", "40000\n");
    cr_assert(!HAS(host_telemetry(), TEMPERATURE));
}

Test(telemetry_files, nothing_readable_is_no_reading_and_no_error) {
    snprintf(gpuarr__g.host_telemetry.fs_root, sizeof gpuarr__g.host_telemetry.fs_root, "/nonexistent/gpuarr");
    gpuarr_telemetry t;
    memset(&t, 0xab, sizeof t);
    TEST_OK(gpuarr_device_get_telemetry(gpuarr_host(), &t));
    gpuarr_telemetry zero;
    memset(&zero, 0, sizeof zero);
    cr_assert_eq(memcmp(&t, &zero, sizeof t), 0, "valid 0x%x, and the fields not all zero", t.valid);
}

/* ---- an OpenCL device that is a CUDA device reads the CUDA device's NVML record ---------------- */
Test(telemetry_sharing, an_opencl_device_linked_to_a_cuda_device_reads_its_nvml_record, .fini = gpuarr_shutdown) {
    const char *nvml = getenv("GPUARR_NVML_LIBRARY");
    if (!nvml || !strstr(nvml, "fake-nvml/")) test_skip("GPUARR_NVML_LIBRARY is not tests/fake_nvml (make test runs this with the fakes)");
    TEST_OK(gpuarr_init(NULL));
    gpuarr_device cl, cu;
    if (gpuarr_device_find("opencl:0", &cl) != GPUARR_OK || gpuarr_device_find("cuda:1", &cu) != GPUARR_OK)
        test_skip("needs opencl:0 and cuda:1: %s", gpuarr_last_error());
    gpuarr__tls.api = "gpuarr_test";
    gpuarr__dev *cld, *cud;
    TEST_OK(gpuarr__get_dev(cl, "cl", &cld));
    TEST_OK(gpuarr__get_dev(cu, "cu", &cud));
    gpuarr_telemetry alone, linked, direct;
    TEST_OK(gpuarr_device_get_telemetry(cl, &alone));
    cr_assert(!(alone.valid & (uint32_t)GPUARR_TELEMETRY_TEMPERATURE), "PoCL alone has no temperature");
    cld->info.same_as = cu; /* as gpuarr__registry_link does for one GPU seen through both */
    cud->info.same_as = cl;
    TEST_OK(gpuarr_device_get_telemetry(cl, &linked));
    TEST_OK(gpuarr_device_get_telemetry(cu, &direct));
    cr_assert_eq(linked.valid, (uint32_t)((1u << GPUARR_TELEMETRY_COUNT) - 1u), "valid 0x%x", linked.valid);
    cr_assert(linked.temperature_c == 50.0, "cuda:1's record is 50 C, got %g", linked.temperature_c);
    cr_assert_eq(memcmp(&linked, &direct, sizeof linked), 0, "the OpenCL device's telemetry differs from its CUDA device's");
    gpuarr_telemetry cuda_side;
    TEST_OK(gpuarr_device_get_telemetry(cu, &cuda_side)); /* the CUDA side still reads its own */
    cr_assert(cuda_side.temperature_c == 50.0);
    cld->info.same_as.id = 0;
    cud->info.same_as.id = 0;
}
