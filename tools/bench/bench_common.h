/* bench_common.h -- what gpuarr-bench's suites share: the clock and medians, the error exit, the
 * source data, the machine each run starts with, and the first-use probe of a cast kernel (a fresh
 * process). gpuarr-bench.c includes it once, after gpuarr.h with the implementation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <math.h>
#include <pthread.h>
#include <dirent.h>
#include <stdatomic.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, compare_doubles);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void die(const char *what) {
    fprintf(stderr, "gpuarr-bench: %s: %s\n", what, gpuarr_last_error());
    exit(1);
}

static void fill_source(void *p, gpuarr_dtype t, size_t n) {
    unsigned seed = 12345;
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        double v = (double)(seed >> 8) / (double)(1u << 24) * 200.0 - 100.0;
        switch (t) {
        case GPUARR_F32: ((float *)p)[i] = (float)v; break;
        case GPUARR_F64: ((double *)p)[i] = v; break;
        case GPUARR_U8: ((uint8_t *)p)[i] = (uint8_t)(seed >> 16); break;
        default: break;
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * The machine, printed once at the top of every run (and as # lines at the top of --csv output)
 * ------------------------------------------------------------------------------------------- */
typedef struct cpu_desc {
    char name[256], vendor[64], flags[256]; /* flags: the ones that matter here, as /proc/cpuinfo spells them */
    int family, model, stepping;            /* -1 where /proc/cpuinfo does not say (not x86) */
    char tag[64];                           /* "zen3-avx2": names result files, so machines do not overwrite each other */
} cpu_desc;

/* The first value of `key` in /proc/cpuinfo (the first CPU), or "". */
static void cpuinfo_field(const char *key, char *out, size_t size) {
    out[0] = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    static char line[8192];
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon) continue;
        size_t klen = (size_t)(colon - line);
        while (klen && (line[klen - 1] == ' ' || line[klen - 1] == '\t')) klen--;
        if (klen != strlen(key) || strncmp(line, key, klen) != 0) continue;
        const char *v = colon + 1;
        while (*v == ' ') v++;
        snprintf(out, size, "%.*s", (int)strcspn(v, "\n"), v);
        break;
    }
    fclose(f);
}

static bool has_word(const char *list, const char *word) {
    size_t n = strlen(word);
    for (const char *p = list; (p = strstr(p, word)) != NULL; p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == 0)) return true;
    return false;
}

/* The microarchitecture's short name from the vendor, family and model (the common server and
   desktop parts; others are named by their numbers). */
static const char *cpu_uarch(const cpu_desc *c, char *buf, size_t size) {
    int f = c->family, m = c->model;
    if (strcmp(c->vendor, "AuthenticAMD") == 0) {
        if (f == 23) return m < 0x30 ? "zen" : "zen2";
        if (f == 25) return (m < 0x10 || (m >= 0x20 && m < 0x30) || (m >= 0x40 && m < 0x60)) ? "zen3" : "zen4";
        if (f == 26) return "zen5";
    } else if (strcmp(c->vendor, "GenuineIntel") == 0 && f == 6) {
        static const struct { int model; const char *name; } intel[] = {
            {0x3c, "haswell"}, {0x3f, "haswell"}, {0x45, "haswell"}, {0x46, "haswell"}, {0x3d, "broadwell"},
            {0x47, "broadwell"}, {0x4f, "broadwell"}, {0x56, "broadwell"}, {0x4e, "skylake"}, {0x5e, "skylake"},
            {0x8e, "skylake"}, {0x9e, "skylake"}, {0x55, "skylakex"}, {0x6a, "icelakex"}, {0x6c, "icelakex"},
            {0x7d, "icelake"}, {0x7e, "icelake"}, {0x8c, "tigerlake"}, {0x8d, "tigerlake"}, {0x97, "alderlake"},
            {0x9a, "alderlake"}, {0xb7, "raptorlake"}, {0xba, "raptorlake"}, {0xbf, "raptorlake"},
            {0x8f, "sapphirerapids"}, {0xcf, "emeraldrapids"}, {0xad, "graniterapids"}};
        for (size_t i = 0; i < sizeof intel / sizeof intel[0]; i++)
            if (intel[i].model == m) return intel[i].name;
    }
    if (f < 0) return "cpu";
    snprintf(buf, size, "%s-f%d-m%d", strcmp(c->vendor, "AuthenticAMD") == 0 ? "amd" : strcmp(c->vendor, "GenuineIntel") == 0 ? "intel" : "cpu", f, m);
    return buf;
}

static void read_cpu(cpu_desc *c) {
    static const char *const wanted[] = {"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_fp16"};
    char v[32], all[8192];
    memset(c, 0, sizeof *c);
    cpuinfo_field("model name", c->name, sizeof c->name);
    if (!c->name[0]) snprintf(c->name, sizeof c->name, "unknown CPU");
    cpuinfo_field("vendor_id", c->vendor, sizeof c->vendor);
    cpuinfo_field("cpu family", v, sizeof v);
    c->family = v[0] ? atoi(v) : -1;
    cpuinfo_field("model", v, sizeof v);
    c->model = v[0] ? atoi(v) : -1;
    cpuinfo_field("stepping", v, sizeof v);
    c->stepping = v[0] ? atoi(v) : -1;
    cpuinfo_field("flags", all, sizeof all);
    size_t len = 0;
    for (size_t i = 0; i < sizeof wanted / sizeof wanted[0]; i++)
        if (has_word(all, wanted[i])) len += (size_t)snprintf(c->flags + len, sizeof c->flags - len, "%s%s", len ? " " : "", wanted[i]);
    char buf[48];
    const char *isa = has_word(all, "avx512f") ? "avx512" : has_word(all, "avx2") ? "avx2" : "baseline";
    snprintf(c->tag, sizeof c->tag, "%s-%s", cpu_uarch(c, buf, sizeof buf), isa);
}

/* The run header: CPU, its flags, the build, the host cast kernels in use and every device. Each
   line starts with `prefix` ("" for the Markdown tables, "# " in the CSV). */
static void print_machine(FILE *out, const char *prefix, const cpu_desc *c) {
    gpuarr_device_info host_info;
    gpuarr_device_get_info(gpuarr_host(), &host_info);
    gpuarr_desc desc;
    gpuarr_query_desc(&desc);
    const char *isa_env = getenv("GPUARR_HOST_ISA");
    char date[32];
    time_t t = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&t));
    fprintf(out, "%sdate: %s\n", prefix, date);
    fprintf(out, "%scpu: %s (%s, family %d, model %d, stepping %d), %d CPUs online\n", prefix, c->name, c->vendor[0] ? c->vendor : "unknown vendor",
            c->family, c->model, c->stepping, host_info.compute_units);
    fprintf(out, "%scpu flags: %s%s\n", prefix, c->flags[0] ? c->flags : "(none of sse4_2 avx avx2 fma f16c bmi2 avx512*)",
            strstr(c->flags, "avx512") ? "" : " (no avx512)");
    fprintf(out, "%smachine tag: %s\n", prefix, c->tag);
#if defined(__AVX2__)
    const char *build_isa = "AVX2 enabled at compile time";
#else
    const char *build_isa = "no -m flags: the AVX2/F16C kernels are chosen at run time";
#endif
#ifdef __VERSION__
    fprintf(out, "%sbuild: compiler %s, %s\n", prefix, __VERSION__, build_isa);
#else
    fprintf(out, "%sbuild: %s\n", prefix, build_isa);
#endif
    fprintf(out, "%sgpuarr host cast kernels: %s (GPUARR_HOST_ISA=%s), host threads: %d\n", prefix, gpuarr__g.host_isa,
            isa_env ? isa_env : "auto, unset", desc.host_threads);
    bool any = false;
    for (int i = 0; i < gpuarr_device_count(); i++) {
        gpuarr_device_info info;
        gpuarr_device_get_info(gpuarr_device_at(i), &info);
        if (info.backend == GPUARR_BACKEND_HOST) continue;
        any = true;
        fprintf(out, "%sdevice %s: %s (%s), %s%s\n", prefix, info.spec, info.name, info.vendor, info.version,
                info.host_unified ? ", shares host memory" : "");
    }
    if (!any) fprintf(out, "%sdevices: the host only\n", prefix);
#ifndef GPUARR_NO_CUDA
    gpuarr_device cu;
    if (gpuarr_device_find("cuda:0", &cu) != GPUARR_OK) fprintf(out, "%scuda: none: %s\n", prefix, gpuarr_last_error());
#endif
}

/* a cast: source and destination dtype */
typedef struct cast_case {
    gpuarr_dtype src, dst;
} cast_case;

static volatile unsigned char sink;

/* ---------------------------------------------------------------------------------------------
 * First use of a cast kernel, measured in fresh processes
 * ------------------------------------------------------------------------------------------- */
/* In this (fresh) process: the time of the first cast on dev, which builds the kernels. */
static int probe_build_time(const char *spec) {
    if (gpuarr_init(NULL) != GPUARR_OK) die("gpuarr_init");
    gpuarr_device dev;
    if (gpuarr_device_find(spec, &dev) != GPUARR_OK) die("gpuarr_device_find");
    float x[64] = {0};
    int64_t shape[1] = {64};
    gpuarr_array a, b;
    if (gpuarr_from_host(dev, x, 1, shape, &a) != GPUARR_OK) die("from_host");
    double t0 = now_s();
    if (gpuarr_convert(a, dev, GPUARR_F16, &b) != GPUARR_OK) die("first cast");
    printf("%.1f\n", (now_s() - t0) * 1e3);
    gpuarr_release(a);
    gpuarr_release(b);
    gpuarr_shutdown();
    return 0;
}

#if !defined(GPUARR_NO_OPENCL) || !defined(GPUARR_NO_CUDA)
/* The probe in a fresh process, with `env` (VAR=value ...) set for it. */
static double run_probe(const char *self, const char *spec, const char *env) {
    char cmd[1536], line[64] = "";
    snprintf(cmd, sizeof cmd, "%s '%s' --probe-build '%s'", env, self, spec);
    FILE *p = popen(cmd, "r");
    if (!p || !fgets(line, sizeof line, p)) die("build-time probe");
    pclose(p);
    return strtod(line, NULL);
}
#endif
