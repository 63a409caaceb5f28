/* gpuarr-bench: measured performance, each figure next to its baseline from the same run.
 *
 *   gpuarr-bench [--mib N] [--cuda-mib N] [--reps N] [--host-only | --opencl-only | --pool-only |
 *                --cuda-only | --mutable-only | --batch-only] [--device SPEC]
 *                [--host-isa auto|baseline|avx2|both[,...]] [--csv FILE|- [--sweep-min SIZE] [--sweep-max SIZE]]
 *                [--trace-overhead] [--leases [--lease-jobs N]]
 *
 * Every run starts with the machine: the CPU's name, vendor, family, model and stepping, the ISA
 * flags that matter (sse4_2 avx avx2 fma f16c bmi2 avx512*), a machine tag made of them for
 * file names ("zen3-avx2"), the compiler, the host cast kernels in use (what gpuarr chose, or
 * GPUARR_HOST_ISA), and every device with its name and version (PoCL's names its target, e.g.
 * pthread-haswell).
 *
 * --host-isa LIST: the host cast section once per entry of the comma list (auto, baseline, avx2;
 * "both" = baseline,avx2), in one run and one table, each against memcpy timed in its own
 * repetitions and labelled with the kernels the library reports. Each entry restarts the
 * library with GPUARR_HOST_ISA set to it; an entry this CPU cannot run (avx2 without AVX2) is
 * reported and skipped. Without it: the kernels gpuarr_init chose, as before.
 *
 * --csv FILE ("-": stdout): instead of the tables, a size sweep for plots (tools/bench-plots.sh,
 * `make bench-plots`): sizes by powers of 4 from --sweep-min to --sweep-max (defaults 4K and
 * 256M; K, M, G suffixes), every path against its baselines: host casts (kernel, and
 * gpuarr_convert) against memcpy, once per --host-isa entry; on the first OpenCL device (or
 * --device) uploads (gpuarr_from_host_as, gpuarr_write into an existing array) against
 * clEnqueueWriteBuffer, downloads (gpuarr_to_host_as, gpuarr_read) against clEnqueueReadBuffer,
 * casts (gpuarr_convert) against clEnqueueCopyBuffer and memcpy; on the first CUDA device the
 * same against cuMemcpyHtoD, cuMemcpyDtoH (pageable memory) and cuMemcpyDtoDAsync + sync.
 * Columns: section,path,baseline,isa,device,bytes,gpuarr_seconds,baseline_seconds,gpuarr_GBps,
 * baseline_GBps,ratio,reps,gpuarr_calls,baseline_calls, after `# ` lines describing the machine
 * (see "--csv FILE" below for how each figure is timed). --reps caps the repetitions.
 *
 * Host section: casts f32->f64, f64->f32, u8->f32, f32->f16, f32->bf16 on N MiB source arrays
 * (default 64) against single-threaded memcpy of the same source bytes. Rates count bytes read
 * plus bytes written. "kernel" casts into memory that is already faulted in; "convert" is the
 * public gpuarr_convert, which also allocates (and first-touches) its output. Each repetition
 * runs memcpy, the kernel and gpuarr_convert back to back; ratios are the median over
 * repetitions of (cast rate / that repetition's memcpy rate). Then the median cost of gpuarr_empty + gpuarr_release of a 4 KiB host array.
 *
 * OpenCL section (each OpenCL device, or --device opencl:N): 64 MiB f32 uploads through
 * gpuarr_from_host (which allocates the array) against a raw blocking clEnqueueWriteBuffer into
 * a buffer that already exists, downloads through gpuarr_to_host against clEnqueueReadBuffer,
 * both against memcpy; the latency of 4 KiB, 64 KiB and 1 MiB uploads (gpuarr_from_host_as +
 * release) and downloads against blocking clEnqueueWriteBuffer / ReadBuffer into a buffer that
 * exists (medians of 501, interleaved); on-device casts f32->f64, f64->f32, f32->f16 timed by events around the
 * kernel, against memcpy's rate; the first cast's kernel build time cold (empty caches, PoCL's
 * own cache off) and warm (gpuarr's binary cache), each in a fresh process. Then batches
 * (alone with --batch-only): 1,000 host arrays of 4 KiB (1024 f32) onto the device as one
 * gpuarr_stack and one gpuarr_convert_many against 1,000 gpuarr_convert calls, dtype kept and
 * f32->f16. GPUARR_OPENCL_UNIFIED=off in the environment runs PoCL as a discrete device.
 *
 * Arrays you write into (--mutable-only): gpuarr_write / gpuarr_read against gpuarr_from_host /
 * gpuarr_to_host, gpuarr_fill against memset, gpuarr_copy between a pinned host array and an
 * OpenCL device against clEnqueueWriteBuffer / ReadBuffer (see that section below).
 *
 * Pool section (--pool): the median cost of a cached allocate+free pair (the pool alone, and
 * gpuarr_empty + gpuarr_release) against the raw allocation it replaces (malloc + free on the
 * host; clCreateBuffer + making it resident + clReleaseMemObject on OpenCL); and an RMM-style
 * replay: 100,000 allocations of random sizes between 1 KiB and 4 MiB with at most 1,000 live,
 * timed against the same sequence of raw allocations, with fragmentation = peak reserved /
 * peak requested.
 *
 * CUDA section (the first CUDA device, or --device cuda:N; --cuda-mib N, default 256), every
 * baseline a raw driver call in the same run: uploads and downloads from pinned memory against
 * cuMemcpyHtoDAsync/DtoHAsync + sync; from pageable malloc memory against cuMemcpyHtoD/DtoH (and
 * cuMemHostRegister + copy + unregister, the other way to reach DMA speed); the same by size from
 * 4 KiB to 1 GiB; on-device casts f64->f32, f32->f16, f32->f64 timed by events against
 * cuMemcpyDtoDAsync's rate (bytes read + written); f64 on the GPU to f32 on the host against
 * cuMemcpyDtoH + a host cast loop; the latency of a 4 KiB upload against cuMemcpyHtoDAsync +
 * cuStreamSynchronize; the first cast's kernel load (committed PTX through the driver's JIT, and
 * NVRTC, each with its cache empty and filled); the pool against cuMemAlloc + cuMemFree and
 * against cuMemAllocAsync + cuMemFreeAsync with the release threshold at its maximum, pairs and
 * the replay.
 *
 * --trace-overhead (alone): what the trace costs (see TRACING in gpuarr.h), in one run: the cached
 * 4 KiB host allocate+free pair (gpuarr_empty + gpuarr_release) and a 4 KiB upload into an
 * existing array on opencl:0 (or --device; gpuarr_write, synchronous), each timed with tracing
 * off (the hooks compiled in) and on (recording into a file in /tmp, written after each timed
 * batch, outside the timing), interleaved and alternating which goes first, in --reps
 * repetitions (default 21) of batches; medians per op, the median of the per-repetition ratios
 * on/off, and the spread of the off times across repetitions. Built with -DGPUARR_NO_TRACE
 * (`make build/rel/tools/gpuarr-bench-notrace`), the same rows with the hooks compiled out.
 * Output is a Markdown table, ready for bench/results/.
 *
 * --leases (alone; bench/results/leases.md, `make bench-leases`): what leases cost (LEASES in
 * gpuarr.h), in one run. (a) gpuarr_lease_acquire + gpuarr_lease_release, timeout 0, uncontended,
 * on host and opencl:0, with GPUARR_LEASE_DIR=off and with a fresh folder (flock'ed slot files),
 * the library restarted for each setting, and on host with placement ROUND_ROBIN too (the default
 * placement reads free memory: the host's from /proc/meminfo); baselines: two clock reads (the
 * floor of every per-pair time), an uncontended pthread mutex lock + unlock, a raw open + flock +
 * unlock + close in the same folder, and that with the holder's line a lease writes; median, p95
 * and max ns. (b) Across processes: 1 and 2 fresh processes (exec'd
 * peers, `--lease-peer`, each with its own gpuarr_init) taking the host's one slot in a shared
 * folder, N acquire (timeout -1) + release pairs each, tight and with 1 ms held / 1 ms pause;
 * pairs/s and the acquire's median, p95 and max. (c) Oversubscription: 8 threads on "opencl:*"
 * (2 devices with POCL_DEVICES="pthread pthread"; a line says so when there are not 2), a batch of
 * --lease-jobs jobs (default 256), each a lease, a 1 MiB f32 upload, a cast on the device to f64
 * or f16, the download (4 elements checked: a wrong result fails the run) and the releases, with
 * 1, 2, 4 and 1024 ("unlimited") slots per device, --reps repetitions (default 3) interleaved:
 * wall, jobs/s, input GB/s, p50 and p95 latency from wanting the lease to releasing it, p95 of
 * the time held, jobs per device. */
#define GPUARR_IMPLEMENTATION
#include "gpuarr.h"

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

typedef struct cast_case {
    gpuarr_dtype src, dst;
} cast_case;

static volatile unsigned char sink;

/* One repetition of each contender, interleaved, so that a noisy neighbour slows both alike. */
typedef struct cast_times {
    double memcpy_s[64], kernel_s[64], convert_s[64], kernel_ratio[64], convert_ratio[64];
} cast_times;

static double run_memcpy(void *dst, const void *src, size_t bytes) {
    double t0 = now_s();
    memcpy(dst, src, bytes);
    double t = now_s() - t0;
    sink = ((unsigned char *)dst)[bytes / 2];
    return t;
}

static double run_kernel(cast_case c, void *dst, const void *src, size_t n) {
    double t0 = now_s();
    gpuarr__cpu_cast(dst, c.dst, src, c.src, n);
    double t = now_s() - t0;
    sink = ((unsigned char *)dst)[n / 2];
    return t;
}

static double run_convert(cast_case c, gpuarr_array src) {
    gpuarr_array out;
    double t0 = now_s();
    if (gpuarr_convert(src, gpuarr_host(), c.dst, &out) != GPUARR_OK) die("gpuarr_convert");
    double t = now_s() - t0;
    gpuarr_release(out);
    return t;
}

/* --host-isa: the host cast kernels to measure, each in turn, through the library's own setting:
   GPUARR_HOST_ISA is set and the library restarted (on the host alone), so what is measured is
   what a program started with that setting gets, labelled with what the library then reports
   (gpuarr__g.host_isa: "baseline", "avx2", "avx2+f16c"). No list: the kernels init chose. */
enum { MAX_ISAS = 4 };
static const char *isa_list[MAX_ISAS];
static int isa_count;
static char *saved_isa_env; /* GPUARR_HOST_ISA as the run was started, or NULL */

static bool use_host_isa(const char *isa, char *why, size_t size) {
    gpuarr_shutdown();
    setenv("GPUARR_HOST_ISA", isa, 1);
    gpuarr_desc d;
    memset(&d, 0, sizeof d);
    d.devices = "host";
    if (gpuarr_init(&d) == GPUARR_OK) return true;
    snprintf(why, size, "%s", gpuarr_last_error());
    return false;
}

static void restore_host_isa(void) {
    if (gpuarr_is_initialized()) gpuarr_shutdown();
    if (saved_isa_env) setenv("GPUARR_HOST_ISA", saved_isa_env, 1);
    else unsetenv("GPUARR_HOST_ISA");
    if (gpuarr_init(NULL) != GPUARR_OK) die("gpuarr_init");
}

/* Runs body(arg) once per --host-isa entry with those kernels in use (once with the current ones
   when there is no list); an entry this CPU or build cannot run is reported and skipped. */
static void for_each_host_isa(void (*body)(void *arg), void *arg, FILE *note, const char *prefix, const char *suffix) {
    if (isa_count == 0) {
        body(arg);
        return;
    }
    for (int k = 0; k < isa_count; k++) {
        char why[512];
        if (!use_host_isa(isa_list[k], why, sizeof why)) {
            fprintf(note, "%shost cast kernels \"%s\": skipped: %s%s\n", prefix, isa_list[k], why, suffix);
            fprintf(stderr, "gpuarr-bench: --host-isa %s skipped: %s\n", isa_list[k], why);
            continue;
        }
        body(arg);
    }
    restore_host_isa();
}

typedef struct host_bufs {
    size_t mib;
    int reps;
    unsigned char *a, *b, *m; /* source, destination (4x), memcpy's destination */
} host_bufs;

static void host_cast_rows(void *arg) {
    static const cast_case cases[] = {{GPUARR_F32, GPUARR_F64}, {GPUARR_F64, GPUARR_F32}, {GPUARR_U8, GPUARR_F32},
                                      {GPUARR_F32, GPUARR_F16}, {GPUARR_F32, GPUARR_BF16}};
    const host_bufs *hb = (const host_bufs *)arg;
    size_t mib = hb->mib, src_bytes = mib << 20;
    int reps = hb->reps;
    unsigned char *a = hb->a, *b = hb->b, *m = hb->m;
    const char *isa = gpuarr__g.host_isa;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cast_case c = cases[i];
        size_t n = src_bytes / gpuarr_dtype_size(c.src);
        size_t moved = src_bytes + n * gpuarr_dtype_size(c.dst);
        fill_source(a, c.src, n);
        int64_t shape[1] = {(int64_t)n};
        gpuarr_array src;
        if (gpuarr_from_host_as(gpuarr_host(), c.src, a, 1, shape, &src) != GPUARR_OK) die("gpuarr_from_host_as");
        cast_times t;
        for (int r = -2; r < reps; r++) { /* two warm-up rounds */
            double tm = run_memcpy(m, a, src_bytes), tk = run_kernel(c, b, a, n), tc = run_convert(c, src);
            if (r < 0) continue;
            double memcpy_rate = 2.0 * (double)src_bytes / tm;
            t.memcpy_s[r] = tm;
            t.kernel_s[r] = tk;
            t.convert_s[r] = tc;
            t.kernel_ratio[r] = (double)moved / tk / memcpy_rate;
            t.convert_ratio[r] = (double)moved / tc / memcpy_rate;
        }
        gpuarr_release(src);
        double tm = median(t.memcpy_s, reps), tk = median(t.kernel_s, reps), tc = median(t.convert_s, reps);
        double mrate = 2.0 * (double)src_bytes / tm / 1e9;
        printf("| cast %s->%s, kernel | %s | %zu MiB | %zu MiB | %.2f ms | %.2f GB/s | %.2f GB/s | %.2f |\n", gpuarr_dtype_name(c.src),
               gpuarr_dtype_name(c.dst), isa, mib, moved >> 20, tk * 1e3, (double)moved / tk / 1e9, mrate, median(t.kernel_ratio, reps));
        printf("| cast %s->%s, gpuarr_convert (allocates) | %s | %zu MiB | %zu MiB | %.2f ms | %.2f GB/s | %.2f GB/s | %.2f |\n",
               gpuarr_dtype_name(c.src), gpuarr_dtype_name(c.dst), isa, mib, moved >> 20, tc * 1e3, (double)moved / tc / 1e9, mrate,
               median(t.convert_ratio, reps));
    }
}

static void bench_host_casts(size_t mib, int reps) {
    size_t src_bytes = mib << 20;
    host_bufs hb = {mib, reps, (unsigned char *)malloc(src_bytes), (unsigned char *)malloc(src_bytes * 4), (unsigned char *)malloc(src_bytes)};
    if (!hb.a || !hb.b || !hb.m) die("malloc");
    memset(hb.a, 1, src_bytes);
    memset(hb.b, 1, src_bytes * 4); /* fault the destinations in before timing */
    memset(hb.m, 1, src_bytes);
    printf("| operation | host cast kernels | source | bytes moved | median time | rate (read+written) | memcpy rate, same reps | ratio (median of reps) |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    for_each_host_isa(host_cast_rows, &hb, stdout, "| ", " |");
    free(hb.a);
    free(hb.b);
    free(hb.m);
}

static void bench_small_alloc(void) {
    enum { BATCH = 1000, BATCHES = 101 };
    double t[BATCHES];
    int64_t shape[1] = {4096 / 4};
    double base[BATCHES];
    for (int k = 0; k < BATCHES; k++) {
        double t0 = now_s();
        for (int i = 0; i < BATCH; i++) {
            gpuarr_array a;
            if (gpuarr_empty(gpuarr_host(), GPUARR_F32, 1, shape, &a) != GPUARR_OK) die("gpuarr_empty");
            gpuarr_release(a);
        }
        t[k] = (now_s() - t0) / BATCH;
        t0 = now_s();
        for (int i = 0; i < BATCH; i++) {
            void *p = malloc(4096);
            sink = (unsigned char)(uintptr_t)p;
            free(p);
        }
        base[k] = (now_s() - t0) / BATCH;
    }
    double tm = median(t, BATCHES), bm = median(base, BATCHES);
    printf("\n| operation | median per call | baseline (malloc+free 4 KiB, same run) | ratio |\n|---|---|---|---|\n");
    printf("| gpuarr_empty + gpuarr_release, 4 KiB host array | %.0f ns | %.0f ns | %.2f |\n", tm * 1e9, bm * 1e9, tm / bm);
}

/* ---------------------------------------------------------------------------------------------
 * --trace-overhead: the trace off (hooks compiled in) and on, interleaved
 * ------------------------------------------------------------------------------------------- */
/* One timed batch: n host 4 KiB allocate+free pairs (kind 0) or n 4 KiB uploads into up (kind 1). */
static double trace_batch(int kind, int n, gpuarr_array up, const float *src) {
    int64_t shape[1] = {1024};
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        if (kind == 0) {
            gpuarr_array a;
            if (gpuarr_empty(gpuarr_host(), GPUARR_F32, 1, shape, &a) != GPUARR_OK) die("gpuarr_empty");
            gpuarr_release(a);
        } else if (gpuarr_write(up, 0, 1024, GPUARR_F32, src) != GPUARR_OK) {
            die("gpuarr_write");
        }
    }
    return (now_s() - t0) / n;
}

static void bench_trace_overhead(int reps, const char *only) {
    gpuarr_device dev;
    const char *spec = only ? only : "opencl:0";
    if (gpuarr_device_find(spec, &dev) != GPUARR_OK) die(spec);
    int64_t shape[1] = {1024};
    static float src[1024];
    for (int i = 0; i < 1024; i++) src[i] = (float)i;
    gpuarr_array up;
    if (gpuarr_empty(dev, GPUARR_F32, 1, shape, &up) != GPUARR_OK) die("gpuarr_empty");
    char path[96];
    snprintf(path, sizeof path, "/tmp/gpuarr-bench-trace-%ld.json", (long)getpid());
    bool can_trace = gpuarr_trace_start(path) == GPUARR_OK && gpuarr_trace_stop() == GPUARR_OK;
    static const char *const what[2] = {"cached host allocate + free, 4 KiB (gpuarr_empty + gpuarr_release)", "4 KiB upload (gpuarr_write)"};
    static const int batch[2] = {2000, 200};
    printf("Tracing %s; the on runs record into %s (written after each batch, outside the timing). %d repetitions, each one "
           "batch off and one on (alternating which first); ns per operation.\n\n",
           can_trace ? "compiled in" : "compiled out (GPUARR_NO_TRACE): the off column only", path, reps);
    printf("| operation | device | batch | tracing off, median | off, min..max of reps | tracing on, median | on / off (median of per-rep ratios) |\n"
           "|---|---|---|---|---|---|---|\n");
    for (int kind = 0; kind < 2; kind++) {
        double off[64], on[64], ratio[64];
        gpuarr_array dst = kind ? up : (gpuarr_array){0};
        trace_batch(kind, batch[kind], dst, src); /* warm: caches, kernel-free paths, page faults */
        for (int r = 0; r < reps; r++) {
            for (int k = 0; k < 2; k++) {
                bool tracing = ((r + k) & 1) && can_trace;
                if (!can_trace && ((r + k) & 1)) continue;
                if (tracing && gpuarr_trace_start(path) != GPUARR_OK) die("gpuarr_trace_start");
                double t = trace_batch(kind, batch[kind], dst, src);
                if (tracing && gpuarr_trace_stop() != GPUARR_OK) die("gpuarr_trace_stop");
                if (tracing) on[r] = t;
                else off[r] = t;
            }
            ratio[r] = can_trace ? on[r] / off[r] : 0;
        }
        double lo = off[0], hi = off[0];
        for (int r = 1; r < reps; r++) lo = off[r] < lo ? off[r] : lo, hi = off[r] > hi ? off[r] : hi;
        double mon = can_trace ? median(on, reps) : 0, mratio = can_trace ? median(ratio, reps) : 0, moff = median(off, reps);
        printf("| %s | %s | %d | %.0f ns | %.0f..%.0f ns |", what[kind], kind ? spec : "host", batch[kind], moff * 1e9, lo * 1e9, hi * 1e9);
        if (can_trace) printf(" %.0f ns | %.3f |\n", mon * 1e9, mratio);
        else printf(" - | - |\n");
    }
    gpuarr_release(up);
    remove(path);
}

/* ---------------------------------------------------------------------------------------------
 * --leases: what a lease costs, alone, across processes, and with 8 threads on 2 devices
 * ------------------------------------------------------------------------------------------- */
/* The p-th percentile (0..1, nearest rank) of v; sorts v. */
static double percentile(double *v, int n, double p) {
    qsort(v, (size_t)n, sizeof *v, compare_doubles);
    int k = (int)ceil(p * n) - 1;
    return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

static double lease_now_ns(void) { return now_s() * 1e9; }

/* A fresh folder for slot files, so that no other program's leases (or an earlier run's files)
   are counted; lease_dir_remove deletes it and what the library left in it. */
static void lease_dir_make(char *dir, size_t size) {
    snprintf(dir, size, "/tmp/gpuarr-bench-leases-XXXXXX");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "gpuarr-bench: mkdtemp %s failed\n", dir);
        exit(1);
    }
}

static void lease_dir_remove(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    char path[600];
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

/* The library restarted with GPUARR_LEASE_DIR = dir ("off": per process). The folder is read at
   gpuarr_init only, so changing it takes a shutdown and an init (main's reference is the one
   dropped and taken again: the count stays 1). */
static void lease_restart(const char *dir) {
    gpuarr_shutdown();
    setenv("GPUARR_LEASE_DIR", dir, 1);
    if (gpuarr_init(NULL) != GPUARR_OK) die("gpuarr_init (GPUARR_LEASE_DIR)");
}

typedef struct lease_row {
    const char *what, *where;
    double *ns; /* one sample per pair, every round pooled */
    int n;
} lease_row;

static void lease_row_print(lease_row *r) {
    double med = percentile(r->ns, r->n, 0.5), p95 = percentile(r->ns, r->n, 0.95);
    printf("| %s | %s | %.0f | %.0f | %.0f | %d |\n", r->what, r->where, med, p95, r->ns[r->n - 1], r->n);
}

enum { LEASE_PAIRS = 2000, LEASE_ROUNDS = 3 };

/* n acquire(timeout 0)+release pairs on spec, each timed alone, appended to row. The default
   placement reads each open candidate's free memory (the host's: /proc/meminfo); ROUND_ROBIN
   reads none, which shows what that read costs. */
static void lease_time_pairs(const char *spec, gpuarr_placement placement, int n, lease_row *row) {
    gpuarr_lease_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.devices = spec;
    ld.placement = placement;
    for (int i = -100; i < n; i++) { /* 100 untimed first: the folder and its files made, caches warm */
        gpuarr_lease l;
        double t0 = lease_now_ns();
        if (gpuarr_lease_acquire(&ld, &l) != GPUARR_OK) die("gpuarr_lease_acquire");
        if (gpuarr_lease_release(l) != GPUARR_OK) die("gpuarr_lease_release");
        double t = lease_now_ns() - t0;
        if (i >= 0) row->ns[row->n++] = t;
    }
}

/* The floor under every per-pair figure: two clock reads with nothing between them. */
static void lease_time_clock(int n, lease_row *row) {
    for (int i = 0; i < n; i++) {
        double t0 = lease_now_ns();
        row->ns[row->n++] = lease_now_ns() - t0;
    }
}

/* What the per-process path is built on: an uncontended mutex. */
static void lease_time_mutex(int n, lease_row *row) {
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    for (int i = 0; i < n; i++) {
        double t0 = lease_now_ns();
        pthread_mutex_lock(&m);
        pthread_mutex_unlock(&m);
        row->ns[row->n++] = lease_now_ns() - t0;
    }
    pthread_mutex_destroy(&m);
}

/* What one slot costs the OS: the file opened, locked, unlocked and closed, as a lease does (it
   also writes its holder's line into the file, which this does not). */
static void lease_time_flock(const char *dir, int n, lease_row *row) {
    char path[600];
    snprintf(path, sizeof path, "%s/raw-baseline.slot", dir);
    for (int i = -100; i < n; i++) {
        double t0 = lease_now_ns();
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0 || flock(fd, LOCK_UN) != 0) {
            fprintf(stderr, "gpuarr-bench: open+flock %s failed\n", path);
            exit(1);
        }
        close(fd);
        double t = lease_now_ns() - t0;
        if (i >= 0) row->ns[row->n++] = t;
    }
    unlink(path);
}

/* The raw slot again, with what a lease adds to it (gpuarr__lease_file_write): the holder's
   line, padded to 192 bytes and written with one pwrite at the take (the host and program names
   are read once per process, here before the loop); the release only closes. */
static void lease_time_flock_line(const char *dir, int n, lease_row *row) {
    char path[600], host[64] = "?", comm[64] = "?", line[193];
    snprintf(path, sizeof path, "%s/raw-baseline-line.slot", dir);
    if (gethostname(host, sizeof host - 1) != 0) host[0] = 0;
    host[sizeof host - 1] = 0;
    FILE *f = fopen("/proc/self/comm", "r");
    if (f) {
        if (!fgets(comm, sizeof comm, f)) comm[0] = 0;
        comm[strcspn(comm, "\n")] = 0;
        fclose(f);
    }
    for (int i = -100; i < n; i++) {
        double t0 = lease_now_ns();
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0) {
            fprintf(stderr, "gpuarr-bench: open+flock %s failed\n", path);
            exit(1);
        }
        int len = snprintf(line, sizeof line, "pid %ld host %s program %s since %lld", (long)getpid(), host, comm, (long long)time(NULL));
        size_t used = len < 0 ? 0 : (size_t)len < 191 ? (size_t)len : 191;
        memset(line + used, ' ', 191 - used);
        line[191] = '\n';
        if (pwrite(fd, line, 192, 0) != 192 || flock(fd, LOCK_UN) != 0) {
            fprintf(stderr, "gpuarr-bench: writing %s failed\n", path);
            exit(1);
        }
        close(fd);
        double t = lease_now_ns() - t0;
        if (i >= 0) row->ns[row->n++] = t;
    }
    unlink(path);
}

/* a. One process: each setting in LEASE_ROUNDS rounds (the library restarted for each folder
   setting in every round, so that neither setting always runs first), samples pooled. */
static void bench_lease_latency(bool have_opencl) {
    enum { ROWS = 10 };
    lease_row rows[ROWS] = {{"two clock reads, nothing between (timer floor)", "-", NULL, 0},
                            {"pthread_mutex lock + unlock, uncontended", "-", NULL, 0},
                            {"gpuarr_lease_acquire + release, host", "off (per process)", NULL, 0},
                            {"gpuarr_lease_acquire + release, host, placement ROUND_ROBIN (no free-memory read)", "off (per process)", NULL, 0},
                            {"gpuarr_lease_acquire + release, opencl:0", "off (per process)", NULL, 0},
                            {"raw: open + flock(EX\\|NB) + flock(UN) + close", "folder", NULL, 0},
                            {"raw, plus the holder's line (one pwrite of 192 bytes)", "folder", NULL, 0},
                            {"gpuarr_lease_acquire + release, host", "folder (flock'ed files)", NULL, 0},
                            {"gpuarr_lease_acquire + release, host, placement ROUND_ROBIN (no free-memory read)", "folder (flock'ed files)", NULL, 0},
                            {"gpuarr_lease_acquire + release, opencl:0", "folder (flock'ed files)", NULL, 0}};
    for (int i = 0; i < ROWS; i++)
        if (!(rows[i].ns = (double *)malloc(sizeof(double) * LEASE_PAIRS * LEASE_ROUNDS))) die("malloc");
    char dir[64];
    lease_dir_make(dir, sizeof dir);
    for (int r = 0; r < LEASE_ROUNDS; r++) {
        for (int k = 0; k < 2; k++) {
            bool files = (r + k) & 1;
            lease_restart(files ? dir : "off");
            int at = files ? 7 : 2; /* this setting's three lease rows */
            if (!files) {
                lease_time_clock(LEASE_PAIRS, &rows[0]);
                lease_time_mutex(LEASE_PAIRS, &rows[1]);
            } else {
                lease_time_flock(dir, LEASE_PAIRS, &rows[5]);
                lease_time_flock_line(dir, LEASE_PAIRS, &rows[6]);
            }
            lease_time_pairs("host", GPUARR_PLACE_DEFAULT, LEASE_PAIRS, &rows[at]);
            lease_time_pairs("host", GPUARR_PLACE_ROUND_ROBIN, LEASE_PAIRS, &rows[at + 1]);
            if (have_opencl) lease_time_pairs("opencl:0", GPUARR_PLACE_DEFAULT, LEASE_PAIRS, &rows[at + 2]);
        }
    }
    printf("### Acquire + release, one process, uncontended (timeout 0)\n\n"
           "%d rounds x %d pairs per row, each pair timed alone (two clock reads around it: the first row is that floor); "
           "GPUARR_LEASE_DIR=off and a fresh folder (%s) alternate, the library restarted for each; ns per pair.\n\n",
           LEASE_ROUNDS, LEASE_PAIRS, dir);
    printf("| operation | lease folder | median ns | p95 ns | max ns | pairs |\n|---|---|---|---|---|---|\n");
    for (int i = 0; i < ROWS; i++) {
        if (rows[i].n) lease_row_print(&rows[i]);
        free(rows[i].ns);
    }
    if (!have_opencl) printf("\nopencl:0 rows left out: no OpenCL device.\n");
    lease_dir_remove(dir);
}

/* b. Across processes: `--lease-peer N HOLD_US PAUSE_US START` runs in a fresh process (exec'd,
   so it inits on its own, as two programs would), GPUARR_LEASE_DIR and GPUARR_SLOTS=host=1 set by
   the parent: at wall-clock time START it does N pairs of acquire(host, timeout -1), HOLD_US of
   holding, release, PAUSE_US of pause; prints its wall time, then each acquire's ns. */
static void lease_sleep_us(long us) {
    if (us <= 0) return;
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static double wall_clock_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int lease_peer(int n, long hold_us, long pause_us, double start) {
    if (n < 1 || gpuarr_init(NULL) != GPUARR_OK) die("lease peer: gpuarr_init");
    double *ns = (double *)malloc(sizeof(double) * (size_t)n);
    if (!ns) die("malloc");
    gpuarr_lease_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.devices = "host";
    ld.timeout_ms = -1;
    bool late = wall_clock_s() > start;
    while (wall_clock_s() < start) lease_sleep_us(100);
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        gpuarr_lease l;
        double a = lease_now_ns();
        if (gpuarr_lease_acquire(&ld, &l) != GPUARR_OK) die("lease peer: gpuarr_lease_acquire");
        ns[i] = lease_now_ns() - a;
        lease_sleep_us(hold_us);
        if (gpuarr_lease_release(l) != GPUARR_OK) die("lease peer: gpuarr_lease_release");
        lease_sleep_us(pause_us);
    }
    printf("%.6f %d\n", now_s() - t0, late);
    for (int i = 0; i < n; i++) printf("%.0f\n", ns[i]);
    free(ns);
    gpuarr_shutdown();
    return 0;
}

typedef struct lease_peer_run {
    int procs, n;
    long hold_us, pause_us;
    double wall_s[2], *ns; /* procs * n acquire times */
    bool late;
} lease_peer_run;

/* Starts procs peers on one folder, all at the same wall-clock time (1.5 s ahead: long enough
   for exec and init), and gathers their figures. popen spawns them, so nothing of this process
   (PoCL's threads, the library) is forked into them. */
static void lease_peers(const char *self, const char *dir, lease_peer_run *pr) {
    FILE *p[2];
    char cmd[1024];
    double start = wall_clock_s() + 1.5;
    for (int k = 0; k < pr->procs; k++) {
        snprintf(cmd, sizeof cmd, "GPUARR_DEVICES=host GPUARR_SLOTS=host=1 GPUARR_LEASE_DIR='%s' '%s' --lease-peer %d %ld %ld %.6f", dir, self,
                 pr->n, pr->hold_us, pr->pause_us, start);
        if (!(p[k] = popen(cmd, "r"))) die("popen (lease peer)");
    }
    pr->late = false;
    for (int k = 0; k < pr->procs; k++) {
        int late = 0;
        if (fscanf(p[k], "%lf %d", &pr->wall_s[k], &late) != 2) die("lease peer output");
        pr->late |= late != 0;
        for (int i = 0; i < pr->n; i++)
            if (fscanf(p[k], "%lf", &pr->ns[k * pr->n + i]) != 1) die("lease peer output");
        if (pclose(p[k]) != 0) die("lease peer exit");
    }
}

static void lease_peer_row(const char *self, const char *dir, int procs, int n, long hold_us, long pause_us) {
    lease_peer_run pr = {procs, n, hold_us, pause_us, {0, 0}, NULL, false};
    if (!(pr.ns = (double *)malloc(sizeof(double) * (size_t)(procs * n)))) die("malloc");
    lease_peers(self, dir, &pr);
    int total = procs * n, waited = 0;
    double wall = pr.wall_s[0] > pr.wall_s[procs - 1] ? pr.wall_s[0] : pr.wall_s[procs - 1];
    for (int i = 0; i < total; i++) waited += pr.ns[i] > 1e6;
    double med = percentile(pr.ns, total, 0.5), p95 = percentile(pr.ns, total, 0.95), max = pr.ns[total - 1];
    printf("| %d | %d | %ld / %ld | %.3f", procs, n, hold_us, pause_us, pr.wall_s[0]);
    if (procs > 1) printf(" / %.3f", pr.wall_s[1]);
    printf(" | %.0f | %.0f | %.0f | %.0f | %d of %d |%s\n", total / wall, med, p95, max, waited, total,
           pr.late ? " a peer started late" : "");
    free(pr.ns);
}

static void bench_lease_procs(const char *self) {
    char dir[64];
    lease_dir_make(dir, sizeof dir);
    printf("\n### Across processes: 1 slot on the host, shared through one folder\n\n"
           "Peers are fresh processes (exec'd, each with its own gpuarr_init; GPUARR_DEVICES=host GPUARR_SLOTS=host=1 "
           "GPUARR_LEASE_DIR=%s), started at one wall-clock time. Each does N pairs of acquire (timeout -1) + hold + release + pause. "
           "1 process is the uncontended baseline of the same run. A waiter in another process polls every 25 ms (see LEASES).\n\n",
           dir);
    printf("| processes | pairs each | hold / pause us | wall s (each) | pairs/s, total | acquire median ns | p95 ns | max ns | "
           "acquires > 1 ms |\n|---|---|---|---|---|---|---|---|---|\n");
    lease_peer_row(self, dir, 1, 2000, 0, 0);
    lease_peer_row(self, dir, 2, 2000, 0, 0);
    lease_peer_row(self, dir, 1, 100, 1000, 1000);
    lease_peer_row(self, dir, 2, 100, 1000, 1000);
    lease_dir_remove(dir);
}

/* c. Oversubscription: workers take jobs from one counter; each job is a lease on "opencl:*", a
   1 MiB f32 upload, a cast on the device (f64 for even jobs, f16 for odd), the download, and the
   releases. Latency runs from wanting the lease to having released it (waiting included); held
   is the lease's own time. */
enum { LEASE_WORKERS = 8, LEASE_JOB_FLOATS = 1 << 18, LEASE_MAX_DEVS = 8 };

typedef struct lease_batch {
    const float *src;
    int jobs;
    atomic_int next, failed;
    double *latency_ns, *held_ns;
    atomic_int per_dev[LEASE_MAX_DEVS];
} lease_batch;

/* A few elements of the result against the host's own conversion of the source. */
static bool lease_job_check(const float *src, gpuarr_dtype t, const void *out) {
    static const int idx[4] = {0, 1, LEASE_JOB_FLOATS / 2 + 7, LEASE_JOB_FLOATS - 1};
    for (int k = 0; k < 4; k++) {
        int i = idx[k];
        if (t == GPUARR_F64 && ((const double *)out)[i] != (double)src[i]) return false;
        if (t == GPUARR_F16 && ((const gpuarr_f16 *)out)[i].bits != gpuarr_f16_from_float(src[i]).bits) return false;
    }
    return true;
}

/* The work under the lease; false (with the reason on stderr) when a call fails or the check does. */
static bool lease_job_work(gpuarr_device dev, const float *src, gpuarr_dtype t, void *out) {
    int64_t shape[1] = {LEASE_JOB_FLOATS};
    gpuarr_array a = {0}, b = {0};
    bool ok = gpuarr_from_host_as(dev, GPUARR_F32, src, 1, shape, &a) == GPUARR_OK && gpuarr_convert(a, dev, t, &b) == GPUARR_OK &&
              gpuarr_to_host_as(b, t, out, LEASE_JOB_FLOATS) == GPUARR_OK;
    if (!ok) fprintf(stderr, "gpuarr-bench: lease job: %s\n", gpuarr_last_error());
    else if (!(ok = lease_job_check(src, t, out))) fprintf(stderr, "gpuarr-bench: lease job: wrong %s result\n", gpuarr_dtype_name(t));
    if (a.id) gpuarr_release(a);
    if (b.id) gpuarr_release(b);
    return ok;
}

static void *lease_worker(void *arg) {
    lease_batch *b = (lease_batch *)arg;
    void *out = malloc(sizeof(double) * LEASE_JOB_FLOATS);
    gpuarr_lease_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.devices = "opencl:*";
    ld.timeout_ms = -1;
    for (int j; out && (j = atomic_fetch_add(&b->next, 1)) < b->jobs;) {
        gpuarr_lease l;
        gpuarr_device dev;
        double want = lease_now_ns();
        if (gpuarr_lease_acquire(&ld, &l) != GPUARR_OK || gpuarr_lease_device(l, &dev) != GPUARR_OK) {
            fprintf(stderr, "gpuarr-bench: lease job: %s\n", gpuarr_last_error());
            atomic_fetch_add(&b->failed, 1);
            continue;
        }
        double got = lease_now_ns();
        if (!lease_job_work(dev, b->src, j % 2 ? GPUARR_F16 : GPUARR_F64, out)) atomic_fetch_add(&b->failed, 1);
        gpuarr_device_info info;
        if (gpuarr_device_get_info(dev, &info) == GPUARR_OK && info.index >= 0 && info.index < LEASE_MAX_DEVS)
            atomic_fetch_add(&b->per_dev[info.index], 1);
        gpuarr_lease_release(l);
        double done = lease_now_ns();
        b->latency_ns[j] = done - want;
        b->held_ns[j] = done - got;
    }
    free(out);
    return NULL;
}

typedef struct lease_rep {
    double wall_s, p50_ms, p95_ms, held_p95_ms;
    int per_dev[LEASE_MAX_DEVS];
} lease_rep;

/* One batch with `slots` on each OpenCL device. */
static lease_rep lease_batch_run(const float *src, int jobs, int slots, int ndev) {
    for (int d = 0; d < ndev; d++) {
        gpuarr_device dev;
        char spec[32];
        snprintf(spec, sizeof spec, "opencl:%d", d);
        if (gpuarr_device_find(spec, &dev) != GPUARR_OK || gpuarr_device_set_slots(dev, slots) != GPUARR_OK) die("gpuarr_device_set_slots");
    }
    lease_batch b;
    memset(&b, 0, sizeof b);
    b.src = src;
    b.jobs = jobs;
    b.latency_ns = (double *)malloc(sizeof(double) * (size_t)jobs);
    b.held_ns = (double *)malloc(sizeof(double) * (size_t)jobs);
    if (!b.latency_ns || !b.held_ns) die("malloc");
    pthread_t th[LEASE_WORKERS];
    double t0 = now_s();
    for (int i = 0; i < LEASE_WORKERS; i++)
        if (pthread_create(&th[i], NULL, lease_worker, &b) != 0) die("pthread_create");
    for (int i = 0; i < LEASE_WORKERS; i++) pthread_join(th[i], NULL);
    lease_rep r;
    r.wall_s = now_s() - t0;
    if (atomic_load(&b.failed)) {
        fprintf(stderr, "gpuarr-bench: --leases: %d of %d jobs failed (slots %d)\n", atomic_load(&b.failed), jobs, slots);
        exit(1);
    }
    r.p50_ms = percentile(b.latency_ns, jobs, 0.5) * 1e-6;
    r.p95_ms = percentile(b.latency_ns, jobs, 0.95) * 1e-6;
    r.held_p95_ms = percentile(b.held_ns, jobs, 0.95) * 1e-6;
    for (int d = 0; d < LEASE_MAX_DEVS; d++) r.per_dev[d] = atomic_load(&b.per_dev[d]);
    free(b.latency_ns);
    free(b.held_ns);
    return r;
}

static int compare_reps(const void *a, const void *b) {
    double x = ((const lease_rep *)a)->wall_s, y = ((const lease_rep *)b)->wall_s;
    return x < y ? -1 : x > y;
}

static void lease_oversub_print(int slots, lease_rep *reps, int nrep, int jobs, int ndev) {
    qsort(reps, (size_t)nrep, sizeof *reps, compare_reps);
    const lease_rep *m = &reps[nrep / 2];
    char label[32], spread[160] = "", split[64] = "";
    snprintf(label, sizeof label, slots >= 1024 ? "unlimited (%d)" : "%d", slots);
    for (int i = 0; i < nrep; i++)
        snprintf(spread + strlen(spread), sizeof spread - strlen(spread), "%s%.3f", i ? " / " : "", reps[i].wall_s);
    for (int d = 0; d < ndev; d++)
        snprintf(split + strlen(split), sizeof split - strlen(split), "%s%d", d ? " / " : "", m->per_dev[d]);
    double gb = (double)jobs * LEASE_JOB_FLOATS * 4 / 1e9;
    printf("| %s | %.3f | %s | %.0f | %.3f | %.1f | %.1f | %.1f | %s |\n", label, m->wall_s, spread, jobs / m->wall_s, gb / m->wall_s,
           m->p50_ms, m->p95_ms, m->held_p95_ms, split);
}

/* The number of OpenCL devices present (opencl:0, 1, ... until one is missing). */
static int lease_opencl_count(void) {
    int n = 0;
    char spec[32];
    for (;; n++) {
        gpuarr_device d;
        snprintf(spec, sizeof spec, "opencl:%d", n);
        if (gpuarr_device_find(spec, &d) != GPUARR_OK) return n;
    }
}

static void bench_lease_oversub(int jobs, int nrep) {
    enum { SETTINGS = 4 };
    static const int slot_settings[SETTINGS] = {1, 2, 4, 1024};
    int ndev = lease_opencl_count();
    printf("\n### Oversubscription: %d workers, candidates \"opencl:*\", %d jobs per batch\n\n", LEASE_WORKERS, jobs);
    if (ndev != 2) printf("**%d OpenCL devices here, not the 2 this section is meant for** (POCL_DEVICES=\"pthread pthread\" gives 2).\n\n", ndev);
    if (ndev == 0) return;
    if (ndev > LEASE_MAX_DEVS) ndev = LEASE_MAX_DEVS;
    char dir[64];
    lease_dir_make(dir, sizeof dir);
    lease_restart(dir);
    float *src = (float *)malloc(sizeof(float) * LEASE_JOB_FLOATS);
    if (!src) die("malloc");
    fill_source(src, GPUARR_F32, LEASE_JOB_FLOATS);
    lease_batch_run(src, 4 * ndev, 1024, ndev); /* untimed: kernels built, pools and caches warm */
    lease_rep reps[SETTINGS][16];
    for (int r = 0; r < nrep; r++) /* settings interleaved, so that a noisy spell hits them all */
        for (int s = 0; s < SETTINGS; s++) reps[s][r] = lease_batch_run(src, jobs, slot_settings[s], ndev);
    printf("Each job: gpuarr_lease_acquire (timeout -1) on \"opencl:*\", gpuarr_from_host_as of 1 MiB of f32 onto the leased device, "
           "gpuarr_convert on it to f64 (even jobs) or f16 (odd), gpuarr_to_host_as back, 4 elements checked against the host's "
           "conversion, releases. Slots set by gpuarr_device_set_slots on each device; slot files in a fresh folder (%s). "
           "%d repetitions per setting, settings interleaved; the row is the median repetition by wall time. "
           "Latency: from wanting the lease to having released it (waiting included); held: the lease's own time. "
           "GB/s: input bytes (%d MiB per batch) / wall.\n\n",
           dir, nrep, jobs);
    printf("| slots per device | wall s | wall s, every rep (sorted) | jobs/s | GB/s in | job p50 ms | job p95 ms | held p95 ms | "
           "jobs per device |\n|---|---|---|---|---|---|---|---|---|\n");
    for (int s = 0; s < SETTINGS; s++) lease_oversub_print(slot_settings[s], reps[s], nrep, jobs, ndev);
    free(src);
    lease_dir_remove(dir);
}

static void bench_leases(const char *self, int jobs, int nrep) {
    char *saved = getenv("GPUARR_LEASE_DIR") ? strdup(getenv("GPUARR_LEASE_DIR")) : NULL;
    bool have_opencl = lease_opencl_count() > 0;
    bench_lease_latency(have_opencl);
    bench_lease_procs(self);
    bench_lease_oversub(jobs, nrep);
    gpuarr_shutdown();
    if (saved) setenv("GPUARR_LEASE_DIR", saved, 1);
    else unsetenv("GPUARR_LEASE_DIR");
    free(saved);
    if (gpuarr_init(NULL) != GPUARR_OK) die("gpuarr_init");
}

/* ---------------------------------------------------------------------------------------------
 * Pools
 * ------------------------------------------------------------------------------------------- */
/* The raw allocation the pool replaces, for the baselines. */
static void *raw_alloc(gpuarr__dev *d, size_t bytes) {
    void *mem = NULL;
    if (d->backend->mem_alloc(d, bytes, &mem) != GPUARR_OK) die("raw allocation");
    return mem;
}

static double time_pairs(gpuarr__dev *d, size_t bytes, int mode, int n) {
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        if (mode == 0) { /* the pool alone */
            gpuarr__block *b;
            if (gpuarr__pool_alloc(&d->pool, bytes, NULL, &b) != GPUARR_OK) die("gpuarr__pool_alloc");
            gpuarr__pool_free(&d->pool, b, NULL, 0);
        } else if (mode == 1) { /* the public calls */
            int64_t shape[1] = {(int64_t)bytes};
            gpuarr_array a;
            if (gpuarr_empty(d->info.device, GPUARR_U8, 1, shape, &a) != GPUARR_OK) die("gpuarr_empty");
            gpuarr_release(a);
        } else { /* the raw device allocation */
            d->backend->mem_free(d, raw_alloc(d, bytes));
        }
    }
    return (now_s() - t0) / n;
}

static void bench_pool_pairs(gpuarr__dev *d) {
    static const size_t sizes[] = {4096, (size_t)1 << 20, (size_t)64 << 20};
    printf("\n| %s: allocate + free, median per pair | pool alone | gpuarr_empty + gpuarr_release | raw %s (baseline) | raw / pool |\n|---|---|---|---|---|\n",
           d->info.spec, d->backend->id == GPUARR_BACKEND_HOST   ? "malloc + free"
                         : d->backend->id == GPUARR_BACKEND_CUDA ? "cuMemAlloc + cuMemFree"
                                                                 : "clCreateBuffer + resident + release");
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t bytes = sizes[k];
        int raw_n = d->backend->id == GPUARR_BACKEND_HOST ? 2000 : 200, n = 20000;
        double pool[15], pub[15], raw[15];
        time_pairs(d, bytes, 0, 100); /* warm: the segment is cached */
        for (int r = 0; r < 15; r++) {
            pool[r] = time_pairs(d, bytes, 0, n);
            pub[r] = time_pairs(d, bytes, 1, n);
            raw[r] = time_pairs(d, bytes, 2, raw_n);
        }
        double tp = median(pool, 15), tu = median(pub, 15), tr = median(raw, 15);
        char label[32];
        gpuarr__format_bytes(label, sizeof label, bytes);
        printf("| %s | %.0f ns | %.0f ns | %.0f ns | %.0fx |\n", label, tp * 1e9, tu * 1e9, tr * 1e9, tr / tp);
    }
}

/* RMM-style replay: the same random sequence through the pool and through raw allocations. */
static void bench_pool_replay(gpuarr__dev *d) {
    enum { STEPS = 100000, LIVE = 1000 };
    static size_t sizes[STEPS];
    static int frees[STEPS];
    unsigned seed = 777;
    for (int i = 0; i < STEPS; i++) {
        seed = seed * 1103515245u + 12345u;
        sizes[i] = 1024 + (size_t)(seed >> 4) % ((size_t)4 << 20);
        seed = seed * 1103515245u + 12345u;
        frees[i] = (int)((seed >> 8) % LIVE);
    }
    void **live = (void **)calloc(LIVE, sizeof(void *));
    if (!live) die("calloc");
    gpuarr_device dev = d->info.device;
    gpuarr_pool_trim(dev);
    gpuarr_pool_reset_peaks(dev);
    uint64_t requested_now = 0, requested_peak = 0;
    size_t live_size[LIVE] = {0};
    double t0 = now_s();
    for (int i = 0; i < STEPS; i++) { /* pool */
        int slot = frees[i];
        if (live[slot]) {
            gpuarr__pool_free(&d->pool, (gpuarr__block *)live[slot], NULL, 0);
            requested_now -= live_size[slot];
        }
        gpuarr__block *b;
        if (gpuarr__pool_alloc(&d->pool, sizes[i], NULL, &b) != GPUARR_OK) die("replay: gpuarr__pool_alloc");
        live[slot] = b;
        live_size[slot] = sizes[i];
        requested_now += sizes[i];
        if (requested_now > requested_peak) requested_peak = requested_now;
    }
    double t_pool = now_s() - t0;
    gpuarr_pool_stats st;
    gpuarr_pool_get_stats(dev, &st);
    for (int s = 0; s < LIVE; s++)
        if (live[s]) gpuarr__pool_free(&d->pool, (gpuarr__block *)live[s], NULL, 0), live[s] = NULL;
    gpuarr_pool_trim(dev);
    t0 = now_s();
    for (int i = 0; i < STEPS; i++) { /* raw */
        int slot = frees[i];
        if (live[slot]) d->backend->mem_free(d, live[slot]);
        live[slot] = raw_alloc(d, sizes[i]);
    }
    double t_raw = now_s() - t0;
    for (int s = 0; s < LIVE; s++)
        if (live[s]) d->backend->mem_free(d, live[s]);
    free(live);
    printf("\n| %s replay: 100,000 allocations, 1 KiB..4 MiB, <= 1,000 live | time | per allocation |\n|---|---|---|\n", d->info.spec);
    printf("| pool | %.1f ms | %.2f us |\n| raw allocations (baseline) | %.1f ms | %.2f us |\n", t_pool * 1e3, t_pool * 1e6 / STEPS,
           t_raw * 1e3, t_raw * 1e6 / STEPS);
    printf("| pool speed-up | %.1fx | |\n", t_raw / t_pool);
    printf("| fragmentation: peak reserved / peak requested | %.3f (%.1f MiB / %.1f MiB) | |\n",
           (double)st.peak_reserved_bytes / (double)requested_peak, (double)st.peak_reserved_bytes / 1048576.0,
           (double)requested_peak / 1048576.0);
    gpuarr_pool_trim(dev);
}

/* Contended: 4 threads each run pairs of 4 KiB (gpuarr_empty + gpuarr_release, or malloc + free,
   the baseline, in the same repetition); wall time per pair over all threads. */
typedef struct pair_thread {
    gpuarr_device dev; /* id 0: malloc + free */
    int n;
} pair_thread;

static void *run_pair_thread(void *arg) {
    pair_thread *pt = (pair_thread *)arg;
    int64_t shape[1] = {4096};
    for (int i = 0; i < pt->n; i++) {
        if (!pt->dev.id) {
            void *p = malloc(4096);
            sink = (unsigned char)(uintptr_t)p;
            free(p);
            continue;
        }
        gpuarr_array a;
        if (gpuarr_empty(pt->dev, GPUARR_U8, 1, shape, &a) != GPUARR_OK) die("gpuarr_empty");
        gpuarr_release(a);
    }
    return NULL;
}

static double time_pair_threads(gpuarr_device dev, int nthreads, int n) {
    pthread_t th[4];
    pair_thread pt[4];
    double t0 = now_s();
    for (int i = 0; i < nthreads; i++) {
        pt[i].dev = dev;
        pt[i].n = n;
        if (pthread_create(&th[i], NULL, run_pair_thread, &pt[i]) != 0) die("pthread_create");
    }
    for (int i = 0; i < nthreads; i++) pthread_join(th[i], NULL);
    return (now_s() - t0) / (double)(nthreads * n);
}

static void bench_pool_threads(gpuarr__dev *d) {
    double pub[15], raw[15];
    gpuarr_device none = {0};
    for (int r = 0; r < 15; r++) {
        pub[r] = time_pair_threads(d->info.device, 4, 20000);
        raw[r] = time_pair_threads(none, 4, 20000);
    }
    double tp = median(pub, 15), tr = median(raw, 15);
    printf("\n| %s: 4 threads, 4 KiB pairs, wall time per pair | gpuarr_empty + gpuarr_release | malloc + free (baseline) | ratio |\n|---|---|---|---|\n",
           d->info.spec);
    printf("| 4 threads | %.0f ns | %.0f ns | %.2f |\n", tp * 1e9, tr * 1e9, tp / tr);
}

static void bench_pools(const char *only) {
    for (int i = 0; i < gpuarr_device_count(); i++) {
        gpuarr__dev *d = &gpuarr__g.devices[i];
        if (only && strcmp(only, d->info.spec) != 0) continue;
        if (!only && d->backend->id == GPUARR_BACKEND_OPENCL && d->info.index > 0) continue;
        if (d->backend->id == GPUARR_BACKEND_CUDA) continue; /* in the CUDA section, with the driver's own pool */
        bench_pool_pairs(d);
        bench_pool_threads(d);
        bench_pool_replay(d);
    }
}

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


/* ---------------------------------------------------------------------------------------------
 * OpenCL
 * ------------------------------------------------------------------------------------------- */
#ifndef GPUARR_NO_OPENCL
typedef struct cl_times {
    double memcpy_s[64], write_s[64], map_s[64], upload_s[64], read_s[64], download_s[64];
} cl_times;

/* One repetition of the raw baselines and gpuarr's calls, back to back. */
static void cl_transfer_rep(gpuarr_device dev, gpuarr__cl_command_queue q, gpuarr__cl_mem buf, float *src, float *dst,
                            float *scratch, size_t bytes, cl_times *t, int r) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    int64_t shape[1] = {(int64_t)(bytes / 4)};
    double t0 = now_s();
    memcpy(scratch, src, bytes);
    t->memcpy_s[r] = now_s() - t0;
    t0 = now_s();
    cl->clEnqueueWriteBuffer(q, buf, GPUARR__CL_TRUE, 0, bytes, src, 0, NULL, NULL);
    t->write_s[r] = now_s() - t0;
    t0 = now_s();
    gpuarr__cl_int e = 0;
    void *p = cl->clEnqueueMapBuffer(q, buf, GPUARR__CL_TRUE, GPUARR__CL_MAP_WRITE_INVALIDATE_REGION, 0, bytes, 0, NULL, NULL, &e);
    memcpy(p, src, bytes);
    cl->clEnqueueUnmapMemObject(q, buf, p, 0, NULL, NULL);
    cl->clFinish(q);
    t->map_s[r] = now_s() - t0;
    gpuarr_array a;
    t0 = now_s();
    if (gpuarr_from_host_as(dev, GPUARR_F32, src, 1, shape, &a) != GPUARR_OK) die("gpuarr_from_host_as");
    t->upload_s[r] = now_s() - t0;
    t0 = now_s();
    cl->clEnqueueReadBuffer(q, buf, GPUARR__CL_TRUE, 0, bytes, dst, 0, NULL, NULL);
    t->read_s[r] = now_s() - t0;
    t0 = now_s();
    if (gpuarr_to_host_as(a, GPUARR_F32, dst, bytes / 4) != GPUARR_OK) die("gpuarr_to_host_as");
    t->download_s[r] = now_s() - t0;
    gpuarr_release(a);
}

static void bench_opencl_transfers(gpuarr_device dev, size_t mib, int reps) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    size_t bytes = mib << 20;
    void *ctx, *queue;
    gpuarr_stream s;
    if (gpuarr_stream_create(dev, 0, &s) != GPUARR_OK || gpuarr_opencl_context_raw(dev, &ctx) != GPUARR_OK ||
        gpuarr_opencl_queue_raw(s, &queue) != GPUARR_OK)
        die("opencl setup");
    gpuarr__cl_int e = 0;
    gpuarr__cl_mem buf = cl->clCreateBuffer((gpuarr__cl_context)ctx, GPUARR__CL_MEM_READ_WRITE, bytes, NULL, &e);
    float *src = (float *)malloc(bytes), *dst = (float *)malloc(bytes), *scratch = (float *)malloc(bytes);
    if (!buf || !src || !dst || !scratch) die("allocating the buffers");
    fill_source(src, GPUARR_F32, bytes / 4);
    memset(dst, 0, bytes);
    memset(scratch, 0, bytes);
    cl_times t;
    for (int r = -2; r < reps; r++) cl_transfer_rep(dev, (gpuarr__cl_command_queue)queue, buf, src, dst, scratch, bytes, &t, r < 0 ? 0 : r);
    double tm = median(t.memcpy_s, reps), tw = median(t.write_s, reps), tmap = median(t.map_s, reps), tu = median(t.upload_s, reps);
    double tr = median(t.read_s, reps), td = median(t.download_s, reps);
    double gb = (double)bytes / 1e9;
    printf("| operation (%zu MiB f32) | median time | rate | vs clEnqueueWriteBuffer / ReadBuffer | vs memcpy |\n|---|---|---|---|---|\n", mib);
    printf("| memcpy, 1 thread (baseline) | %.2f ms | %.2f GB/s | | 1.00 |\n", tm * 1e3, gb / tm);
    printf("| clEnqueueWriteBuffer, blocking, existing buffer (baseline) | %.2f ms | %.2f GB/s | 1.00 | %.2f |\n", tw * 1e3, gb / tw, tm / tw);
    printf("| map + memcpy + unmap, existing buffer (1 thread) | %.2f ms | %.2f GB/s | %.2f | %.2f |\n", tmap * 1e3, gb / tmap, tw / tmap, tm / tmap);
    printf("| **gpuarr_from_host_as** (allocates the array) | %.2f ms | %.2f GB/s | **%.2f** | %.2f |\n", tu * 1e3, gb / tu, tw / tu, tm / tu);
    printf("| clEnqueueReadBuffer, blocking (baseline) | %.2f ms | %.2f GB/s | 1.00 | %.2f |\n", tr * 1e3, gb / tr, tm / tr);
    printf("| **gpuarr_to_host_as** into the caller's buffer | %.2f ms | %.2f GB/s | **%.2f** | %.2f |\n", td * 1e3, gb / td, tr / td, tm / td);
    cl->clReleaseMemObject(buf);
    gpuarr_stream_destroy(s);
    free(src);
    free(dst);
    free(scratch);
}

/* Small transfers: latency of gpuarr_from_host_as + release and gpuarr_to_host_as against a
   blocking clEnqueueWriteBuffer / ReadBuffer into a buffer that exists, interleaved, medians. */
static void bench_opencl_small_transfers(gpuarr_device dev) {
    enum { N = 501 };
    static const size_t sizes[] = {4096, (size_t)64 << 10, (size_t)1 << 20};
    gpuarr__cl_state *cl = &GPUARR__CL;
    void *ctx, *queue;
    gpuarr_stream s;
    if (gpuarr_stream_create(dev, 0, &s) != GPUARR_OK || gpuarr_opencl_context_raw(dev, &ctx) != GPUARR_OK ||
        gpuarr_opencl_queue_raw(s, &queue) != GPUARR_OK)
        die("opencl setup");
    gpuarr__cl_command_queue q = (gpuarr__cl_command_queue)queue;
    size_t top = sizes[sizeof sizes / sizeof sizes[0] - 1];
    gpuarr__cl_int e = 0;
    gpuarr__cl_mem buf = cl->clCreateBuffer((gpuarr__cl_context)ctx, GPUARR__CL_MEM_READ_WRITE, top, NULL, &e);
    float *host = (float *)malloc(top);
    if (!buf || !host) die("allocating the buffers");
    fill_source(host, GPUARR_F32, top / 4);
    printf("\n| small transfers, median of %d | gpuarr | blocking clEnqueueWriteBuffer / ReadBuffer, existing buffer (baseline) | "
           "gpuarr / baseline |\n|---|---|---|---|\n", N);
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        static double up[N], write[N], down[N], read[N];
        size_t bytes = sizes[k];
        int64_t shape[1] = {(int64_t)(bytes / 4)};
        gpuarr_array kept;
        if (gpuarr_from_host_as(dev, GPUARR_F32, host, 1, shape, &kept) != GPUARR_OK) die("gpuarr_from_host_as");
        for (int i = -20; i < N; i++) {
            int r = i < 0 ? 0 : i;
            gpuarr_array a;
            double t0 = now_s();
            if (gpuarr_from_host_as(dev, GPUARR_F32, host, 1, shape, &a) != GPUARR_OK) die("gpuarr_from_host_as");
            gpuarr_release(a);
            up[r] = now_s() - t0;
            t0 = now_s();
            cl->clEnqueueWriteBuffer(q, buf, GPUARR__CL_TRUE, 0, bytes, host, 0, NULL, NULL);
            write[r] = now_s() - t0;
            t0 = now_s();
            if (gpuarr_to_host_as(kept, GPUARR_F32, host, bytes / 4) != GPUARR_OK) die("gpuarr_to_host_as");
            down[r] = now_s() - t0;
            t0 = now_s();
            cl->clEnqueueReadBuffer(q, buf, GPUARR__CL_TRUE, 0, bytes, host, 0, NULL, NULL);
            read[r] = now_s() - t0;
        }
        gpuarr_release(kept);
        double tu = median(up, N), tw = median(write, N), td = median(down, N), tr = median(read, N);
        printf("| %zu KiB upload: gpuarr_from_host_as + gpuarr_release | %.1f us | %.1f us | %.2f |\n", bytes >> 10, tu * 1e6, tw * 1e6, tu / tw);
        printf("| %zu KiB download: gpuarr_to_host_as | %.1f us | %.1f us | %.2f |\n", bytes >> 10, td * 1e6, tr * 1e6, td / tr);
    }
    cl->clReleaseMemObject(buf);
    gpuarr_stream_destroy(s);
    free(host);
}

static void bench_opencl_casts(gpuarr_device dev, size_t mib, int reps) {
    static const cast_case cases[] = {{GPUARR_F32, GPUARR_F64}, {GPUARR_F64, GPUARR_F32}, {GPUARR_F32, GPUARR_F16}};
    size_t src_bytes = mib << 20;
    unsigned char *a = (unsigned char *)malloc(src_bytes), *m = (unsigned char *)malloc(src_bytes);
    if (!a || !m) die("malloc");
    memset(m, 1, src_bytes);
    gpuarr_event e0, e1;
    if (gpuarr_event_create(dev, GPUARR_EVENT_TIMING, &e0) != GPUARR_OK || gpuarr_event_create(dev, GPUARR_EVENT_TIMING, &e1) != GPUARR_OK)
        die("gpuarr_event_create");
    printf("\n| on-device cast (%zu MiB source) | bytes moved | kernel time (events) | rate | memcpy rate, same reps | ratio (median of reps) | gpuarr_convert with allocation |\n|---|---|---|---|---|---|---|\n", mib);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cast_case c = cases[i];
        size_t n = src_bytes / gpuarr_dtype_size(c.src), moved = src_bytes + n * gpuarr_dtype_size(c.dst);
        fill_source(a, c.src, n);
        int64_t shape[1] = {(int64_t)n};
        gpuarr_array src;
        if (gpuarr_from_host_as(dev, c.src, a, 1, shape, &src) != GPUARR_OK) die("gpuarr_from_host_as");
        double kernel[64], ratio[64], memcpy_s[64], total[64];
        for (int r = -2; r < reps; r++) {
            double t0 = now_s();
            memcpy(m, a, src_bytes);
            double tm = now_s() - t0;
            gpuarr_array out;
            t0 = now_s();
            if (gpuarr_event_record(e0, (gpuarr_stream){0}) != GPUARR_OK ||
                gpuarr_convert_async(src, dev, c.dst, (gpuarr_stream){0}, &out) != GPUARR_OK ||
                gpuarr_event_record(e1, (gpuarr_stream){0}) != GPUARR_OK || gpuarr_event_sync(e1) != GPUARR_OK)
                die("cast");
            double tt = now_s() - t0, ms = 0;
            if (gpuarr_event_elapsed_ms(e0, e1, &ms) != GPUARR_OK) die("gpuarr_event_elapsed_ms");
            gpuarr_release(out);
            if (r < 0) continue;
            kernel[r] = ms * 1e-3;
            memcpy_s[r] = tm;
            total[r] = tt;
            ratio[r] = ((double)moved / kernel[r]) / (2.0 * (double)src_bytes / tm);
        }
        gpuarr_release(src);
        double tk = median(kernel, reps), tm = median(memcpy_s, reps), tt = median(total, reps);
        printf("| %s->%s | %zu MiB | %.2f ms | %.2f GB/s | %.2f GB/s | %.2f | %.2f ms |\n", gpuarr_dtype_name(c.src),
               gpuarr_dtype_name(c.dst), moved >> 20, tk * 1e3, (double)moved / tk / 1e9, 2.0 * (double)src_bytes / tm / 1e9,
               median(ratio, reps), tt * 1e3);
    }
    gpuarr_event_destroy(e0);
    gpuarr_event_destroy(e1);
    free(a);
    free(m);
}

static void bench_opencl_build(const char *self, const char *spec) {
    char dir[] = "/tmp/gpuarr-bench-cache-XXXXXX";
    if (!mkdtemp(dir)) die("mkdtemp");
    char env[700];
    snprintf(env, sizeof env, "POCL_KERNEL_CACHE=0 GPUARR_CACHE_DIR='%s'", dir);
    double cold = run_probe(self, spec, env), warm = run_probe(self, spec, env);
    printf("\n| first f32->f16 cast on %s (builds that pair's kernel) | time |\n|---|---|\n", spec);
    printf("| cold: empty gpuarr cache, PoCL's kernel cache off | %.1f ms |\n| warm: gpuarr's binary cache | %.1f ms |\n", cold, warm);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* Batches: 1,000 host arrays of 4 KiB (1024 f32) onto the device, as 1,000 gpuarr_convert calls
   (the baseline), one gpuarr_stack and one gpuarr_convert_many, back to back in each repetition;
   kept dtype and f32->f16. Times are the calls alone (the releases are not timed). */
#define BATCH_N 1000
#define BATCH_COUNT 1024
static void bench_batches(gpuarr_device dev, int reps) {
    gpuarr_device_info info;
    gpuarr_device_get_info(dev, &info);
    static gpuarr_array src[BATCH_N], out[BATCH_N];
    float *x = (float *)malloc(sizeof(float) * BATCH_COUNT);
    if (!x) die("malloc");
    int64_t shape[1] = {BATCH_COUNT};
    for (int i = 0; i < BATCH_N; i++) {
        fill_source(x, GPUARR_F32, BATCH_COUNT);
        if (gpuarr_from_host(gpuarr_host(), x, 1, shape, &src[i]) != GPUARR_OK) die("gpuarr_from_host");
    }
    free(x);
    printf("\n| %d host arrays of 4 KiB (1024 f32) to %s (%s) | median time | per array | speed-up vs %d gpuarr_convert |\n|---|---|---|---|\n",
           BATCH_N, info.spec, info.host_unified ? "shares host memory" : "discrete: own memory, pinned staging", BATCH_N);
    gpuarr_dtype targets[2] = {GPUARR_DTYPE_INVALID, GPUARR_F16};
    for (int k = 0; k < 2; k++) {
        gpuarr_dtype t = targets[k];
        double conv_s[64], stack_s[64], many_s[64];
        for (int r = 0; r < reps; r++) {
            double t0 = now_s();
            for (int i = 0; i < BATCH_N; i++)
                if (gpuarr_convert(src[i], dev, t, &out[i]) != GPUARR_OK) die("gpuarr_convert");
            conv_s[r] = now_s() - t0;
            for (int i = 0; i < BATCH_N; i++) gpuarr_release(out[i]);
            gpuarr_array stacked;
            t0 = now_s();
            if (gpuarr_stack(src, BATCH_N, dev, t, &stacked) != GPUARR_OK) die("gpuarr_stack");
            stack_s[r] = now_s() - t0;
            gpuarr_release(stacked);
            t0 = now_s();
            if (gpuarr_convert_many(src, BATCH_N, dev, t, out) != GPUARR_OK) die("gpuarr_convert_many");
            many_s[r] = now_s() - t0;
            for (int i = 0; i < BATCH_N; i++) gpuarr_release(out[i]);
        }
        double tc = median(conv_s, reps), ts = median(stack_s, reps), tm = median(many_s, reps);
        const char *to = t ? "f32->f16" : "f32, dtype kept";
        printf("| %d x gpuarr_convert, %s (baseline) | %.2f ms | %.2f us | 1.00 |\n", BATCH_N, to, tc * 1e3, tc * 1e6 / BATCH_N);
        printf("| **gpuarr_stack**, %s | %.2f ms | %.2f us | **%.1fx** |\n", to, ts * 1e3, ts * 1e6 / BATCH_N, tc / ts);
        printf("| **gpuarr_convert_many**, %s | %.2f ms | %.2f us | **%.1fx** |\n", to, tm * 1e3, tm * 1e6 / BATCH_N, tc / tm);
    }
    for (int i = 0; i < BATCH_N; i++) gpuarr_release(src[i]);
}

static bool batch_only = false;

static void bench_opencl(const char *self, size_t mib, int reps, const char *only) {
    for (int i = 0; i < gpuarr_device_count(); i++) {
        gpuarr_device_info info;
        gpuarr_device_get_info(gpuarr_device_at(i), &info);
        if (info.backend != GPUARR_BACKEND_OPENCL || (only && strcmp(only, info.spec) != 0)) continue;
        printf("\n## %s: %s (%s), %s\n\n", info.spec, info.name, info.vendor, info.version);
        if (batch_only) {
            bench_batches(info.device, reps);
            if (!only) break;
            continue;
        }
        bench_opencl_transfers(info.device, mib, reps);
        bench_opencl_small_transfers(info.device);
        bench_opencl_casts(info.device, mib, reps);
        bench_opencl_build(self, info.spec);
        bench_batches(info.device, reps);
        if (!only) break; /* one device per platform kind is enough unless asked */
    }
}
#endif


/* ---------------------------------------------------------------------------------------------
 * Arrays you write into (--mutable-only): on the host and on each OpenCL device (the first
 * unless --device), every figure against a baseline timed in the same repetitions:
 *   gpuarr_write of a whole array that exists against gpuarr_from_host_as into a fresh one, and
 *   gpuarr_read against gpuarr_to_host_as (ratio = from_host time / write time: >= 1 is faster);
 *   gpuarr_fill against a single-threaded memset of as many bytes (of a nonzero byte: zero stores
 *   are faster on some CPUs), for a value whose bytes are all equal (a 1-byte pattern) and for
 *   1.5f (a 4-byte pattern); on OpenCL also a raw blocking clEnqueueFillBuffer of the same pattern
 *   into the array's buffer;
 *   OpenCL: gpuarr_copy between a pinned host array (gpuarr_empty_pinned) and a device array
 *   against clEnqueueWriteBuffer / clEnqueueReadBuffer, blocking, between the same two memories.
 * Besides the median of the per-repetition ratios, the ratio of the best times of each side.
 * Run it again with GPUARR_OPENCL_UNIFIED=off to measure PoCL handled as a discrete device.
 * ------------------------------------------------------------------------------------------- */
/* The ratio of the best times (base / measured) of v and base, already sorted by median(): less
   sensitive than the median to neighbours on a shared machine. */
static double best_ratio(const double *base, const double *v) { return base[0] / v[0]; }

static const char *device_mode(const gpuarr_device_info *info) {
    if (info->backend == GPUARR_BACKEND_HOST) return "host memory";
    return info->host_unified ? "host-unified: copies map the buffer and use the host's threads"
                              : "discrete: own memory, pageable copies staged through pinned chunks";
}

static void bench_write_read(gpuarr_device dev, size_t mib, int reps) {
    size_t bytes = mib << 20, n = bytes / 4;
    int64_t shape[1] = {(int64_t)n};
    float *src = (float *)malloc(bytes), *dst = (float *)malloc(bytes);
    if (!src || !dst) die("malloc");
    fill_source(src, GPUARR_F32, n);
    memset(dst, 0, bytes);
    gpuarr_array a;
    if (gpuarr_empty(dev, GPUARR_F32, 1, shape, &a) != GPUARR_OK) die("gpuarr_empty");
    double from[64], wr[64], to[64], rd[64], wratio[64], rratio[64];
    for (int r = -2; r < reps; r++) {
        int k = r < 0 ? 0 : r;
        gpuarr_array fresh;
        double t0 = now_s();
        if (gpuarr_from_host_as(dev, GPUARR_F32, src, 1, shape, &fresh) != GPUARR_OK) die("gpuarr_from_host_as");
        from[k] = now_s() - t0;
        gpuarr_release(fresh);
        t0 = now_s();
        if (gpuarr_write(a, 0, (int64_t)n, GPUARR_F32, src) != GPUARR_OK) die("gpuarr_write");
        wr[k] = now_s() - t0;
        t0 = now_s();
        if (gpuarr_to_host_as(a, GPUARR_F32, dst, n) != GPUARR_OK) die("gpuarr_to_host_as");
        to[k] = now_s() - t0;
        dst[n / 2] = 0;
        t0 = now_s();
        if (gpuarr_read(a, 0, (int64_t)n, GPUARR_F32, dst) != GPUARR_OK) die("gpuarr_read");
        rd[k] = now_s() - t0;
        if (dst[n / 2] != src[n / 2] || dst[n - 1] != src[n - 1]) die("gpuarr_read: wrong data");
        wratio[k] = from[k] / wr[k];
        rratio[k] = to[k] / rd[k];
    }
    double gb = (double)bytes / 1e9, tf = median(from, reps), tw = median(wr, reps), tt = median(to, reps), tr = median(rd, reps);
    printf("| operation (%zu MiB f32, pageable host memory) | median time | rate | ratio to its baseline (median of reps) | ratio of best times |\n|---|---|---|---|---|\n", mib);
    printf("| gpuarr_from_host_as into a fresh array (baseline) | %.2f ms | %.2f GB/s | 1.00 | |\n", tf * 1e3, gb / tf);
    printf("| **gpuarr_write** of the whole existing array | %.2f ms | %.2f GB/s | **%.2f** (target >= 0.95) | %.2f |\n", tw * 1e3, gb / tw,
           median(wratio, reps), best_ratio(from, wr));
    printf("| gpuarr_to_host_as (baseline) | %.2f ms | %.2f GB/s | 1.00 | |\n", tt * 1e3, gb / tt);
    printf("| **gpuarr_read** of the whole array | %.2f ms | %.2f GB/s | **%.2f** (target >= 0.95) | %.2f |\n", tr * 1e3, gb / tr,
           median(rratio, reps), best_ratio(to, rd));
    gpuarr_release(a);
    free(src);
    free(dst);
}

/* raw_fill (may be NULL): the backend's own fill of the same bytes, for comparison. */
typedef double (*raw_fill_fn)(gpuarr_array a, const void *pattern, size_t pattern_size, size_t bytes);

static void bench_fill(gpuarr_device dev, size_t mib, int reps, raw_fill_fn raw_fill, double target) {
    size_t bytes = mib << 20, n = bytes / 4;
    int64_t shape[1] = {(int64_t)n};
    unsigned char *m = (unsigned char *)malloc(bytes);
    if (!m) die("malloc");
    memset(m, 1, bytes);
    gpuarr_array a;
    if (gpuarr_zeros(dev, GPUARR_F32, 1, shape, &a) != GPUARR_OK) die("gpuarr_zeros");
    uint32_t uniform_bits = 0x3c3c3c3cu;
    float values[2];
    memcpy(&values[0], &uniform_bits, 4);
    values[1] = 1.5f;
    printf("\n| fill, %zu MiB f32 | median time | rate | memset of a nonzero byte, 1 thread, same reps (baseline) | ratio (median of reps) | ratio of best times |%s\n|---|---|---|---|---|---|%s\n",
           mib, raw_fill ? " raw clEnqueueFillBuffer, blocking | vs raw |" : "", raw_fill ? "---|---|" : "");
    for (int c = 0; c < 2; c++) {
        float v = values[c];
        unsigned char pattern[4];
        memcpy(pattern, &v, 4);
        size_t psize = c == 0 ? 1 : 4;
        unsigned char byte = pattern[0] ? pattern[0] : pattern[3]; /* memset of zero runs faster on some CPUs */
        double tf[64], tm[64], tr[64], ratio[64], rratio[64];
        for (int r = -2; r < reps; r++) {
            int k = r < 0 ? 0 : r;
            double t0 = now_s();
            memset(m, byte, bytes);
            tm[k] = now_s() - t0;
            sink = m[bytes / 2];
            t0 = now_s();
            if (gpuarr_fill(a, v) != GPUARR_OK) die("gpuarr_fill");
            tf[k] = now_s() - t0;
            tr[k] = raw_fill ? raw_fill(a, pattern, psize, bytes) : 0;
            ratio[k] = tm[k] / tf[k];
            rratio[k] = raw_fill ? tr[k] / tf[k] : 0;
        }
        float back[2] = {0, 0};
        if (gpuarr_fill(a, v) != GPUARR_OK || gpuarr_read(a, (int64_t)n - 2, 2, GPUARR_F32, back) != GPUARR_OK) die("gpuarr_read");
        if (memcmp(&back[0], &v, 4) != 0 || memcmp(&back[1], &v, 4) != 0) die("gpuarr_fill: wrong data");
        double f = median(tf, reps), mm = median(tm, reps), gb = (double)bytes / 1e9;
        printf("| **gpuarr_fill**, %s | %.2f ms | %.2f GB/s | %.2f GB/s | **%.2f** (target >= %.2f) | %.2f |",
               c == 0 ? "0x3c3c3c3c (1-byte pattern)" : "1.5f (4-byte pattern)", f * 1e3, gb / f, gb / mm, median(ratio, reps), target,
               best_ratio(tm, tf));
        if (raw_fill) {
            double rr = median(tr, reps);
            printf(" %.2f ms, %.2f GB/s | %.2f |", rr * 1e3, gb / rr, median(rratio, reps));
        }
        printf("\n");
    }
    gpuarr_release(a);
    free(m);
}

#ifndef GPUARR_NO_OPENCL
static gpuarr__cl_command_queue bench_cl_queue; /* a queue of the device measured, for the raw baselines */

static double cl_raw_fill(gpuarr_array a, const void *pattern, size_t pattern_size, size_t bytes) {
    void *mem;
    size_t off;
    if (gpuarr_opencl_mem_raw(a, &mem, &off) != GPUARR_OK) die("gpuarr_opencl_mem_raw");
    double t0 = now_s();
    if (GPUARR__CL.clEnqueueFillBuffer(bench_cl_queue, (gpuarr__cl_mem)mem, pattern, pattern_size, off, bytes, 0, NULL, NULL) !=
            GPUARR__CL_SUCCESS ||
        GPUARR__CL.clFinish(bench_cl_queue) != GPUARR__CL_SUCCESS)
        die("clEnqueueFillBuffer");
    return now_s() - t0;
}

static void bench_pinned_copies(gpuarr_device dev, size_t mib, int reps) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    size_t bytes = mib << 20, n = bytes / 4;
    int64_t shape[1] = {(int64_t)n};
    gpuarr_array pinned, a;
    float *p;
    void *mem;
    size_t off;
    if (gpuarr_empty_pinned(dev, GPUARR_F32, 1, shape, &pinned) != GPUARR_OK || gpuarr_empty(dev, GPUARR_F32, 1, shape, &a) != GPUARR_OK ||
        gpuarr_host_data(pinned, (void **)&p) != GPUARR_OK || gpuarr_opencl_mem_raw(a, &mem, &off) != GPUARR_OK)
        die("pinned setup");
    fill_source(p, GPUARR_F32, n);
    float probe = p[n / 2];
    gpuarr__cl_mem m = (gpuarr__cl_mem)mem;
    double rw[64], up[64], wp[64], rr[64], down[64], uratio[64], wratio[64], dratio[64];
    for (int r = -2; r < reps; r++) {
        int k = r < 0 ? 0 : r;
        double t0 = now_s();
        if (cl->clEnqueueWriteBuffer(bench_cl_queue, m, GPUARR__CL_TRUE, off, bytes, p, 0, NULL, NULL) != GPUARR__CL_SUCCESS)
            die("clEnqueueWriteBuffer");
        rw[k] = now_s() - t0;
        t0 = now_s();
        if (gpuarr_copy(a, pinned) != GPUARR_OK) die("gpuarr_copy up");
        up[k] = now_s() - t0;
        t0 = now_s();
        if (gpuarr_write(a, 0, (int64_t)n, GPUARR_F32, p) != GPUARR_OK) die("gpuarr_write from pinned");
        wp[k] = now_s() - t0;
        t0 = now_s();
        if (cl->clEnqueueReadBuffer(bench_cl_queue, m, GPUARR__CL_TRUE, off, bytes, p, 0, NULL, NULL) != GPUARR__CL_SUCCESS)
            die("clEnqueueReadBuffer");
        rr[k] = now_s() - t0;
        p[n / 2] = 0;
        t0 = now_s();
        if (gpuarr_copy(pinned, a) != GPUARR_OK) die("gpuarr_copy down");
        down[k] = now_s() - t0;
        if (p[n / 2] != probe) die("gpuarr_copy: wrong data");
        uratio[k] = rw[k] / up[k];
        wratio[k] = rw[k] / wp[k];
        dratio[k] = rr[k] / down[k];
    }
    double gb = (double)bytes / 1e9, trw = median(rw, reps), tup = median(up, reps), twp = median(wp, reps), trr = median(rr, reps),
           tdn = median(down, reps);
    printf("\n| pinned host array (gpuarr_empty_pinned) <-> device array, %zu MiB | median time | rate | ratio to the raw call (median of reps) | ratio of best times |\n|---|---|---|---|---|\n", mib);
    printf("| clEnqueueWriteBuffer, blocking, pinned -> the array's buffer (baseline) | %.2f ms | %.2f GB/s | 1.00 | |\n", trw * 1e3, gb / trw);
    printf("| **gpuarr_copy(device array, pinned array)** | %.2f ms | %.2f GB/s | **%.2f** (target >= 0.95) | %.2f |\n", tup * 1e3, gb / tup,
           median(uratio, reps), best_ratio(rw, up));
    printf("| gpuarr_write from the pinned array's memory | %.2f ms | %.2f GB/s | %.2f | %.2f |\n", twp * 1e3, gb / twp, median(wratio, reps),
           best_ratio(rw, wp));
    printf("| clEnqueueReadBuffer, blocking, the array's buffer -> pinned (baseline) | %.2f ms | %.2f GB/s | 1.00 | |\n", trr * 1e3, gb / trr);
    printf("| **gpuarr_copy(pinned array, device array)** | %.2f ms | %.2f GB/s | **%.2f** (target >= 0.95) | %.2f |\n", tdn * 1e3, gb / tdn,
           median(dratio, reps), best_ratio(rr, down));
    gpuarr_release(a);
    gpuarr_release(pinned);
}
#endif

static void bench_mutable(size_t mib, int reps, const char *only) {
    bool opencl_done = false;
    for (int i = 0; i < gpuarr_device_count(); i++) {
        gpuarr_device_info info;
        gpuarr_device_get_info(gpuarr_device_at(i), &info);
        if (only && strcmp(only, info.spec) != 0) continue;
        if (info.backend == GPUARR_BACKEND_CUDA) continue; /* not measured here yet */
        if (info.backend == GPUARR_BACKEND_OPENCL && opencl_done) continue;
        printf("\n## Arrays you write into, %s: %s (%s)\n\n", info.spec, info.name, device_mode(&info));
        bench_write_read(info.device, mib, reps);
        if (info.backend == GPUARR_BACKEND_HOST) {
            bench_fill(info.device, mib, reps, NULL, 0.8);
            continue;
        }
#ifndef GPUARR_NO_OPENCL
        gpuarr_stream s;
        void *queue;
        if (gpuarr_stream_create(info.device, 0, &s) != GPUARR_OK || gpuarr_opencl_queue_raw(s, &queue) != GPUARR_OK) die("opencl setup");
        bench_cl_queue = (gpuarr__cl_command_queue)queue;
        bench_fill(info.device, mib, reps, cl_raw_fill, 0.5);
        bench_pinned_copies(info.device, mib, reps);
        gpuarr_stream_destroy(s);
        opencl_done = !only;
#endif
    }
}


/* ---------------------------------------------------------------------------------------------
 * CUDA. The baselines are raw driver calls through gpuarr's own entry-point table (the same
 * driver gpuarr uses), on the device's primary context, made current for the section.
 * ------------------------------------------------------------------------------------------- */
#ifndef GPUARR_NO_CUDA
#define CU (GPUARR__CU)

static void cu_check(gpuarr__cu_result e, const char *what) {
    if (e != GPUARR__CUDA_SUCCESS) {
        fprintf(stderr, "gpuarr-bench: %s failed: CUDA error %u\n", what, e);
        exit(1);
    }
}

typedef struct cu_bufs {
    size_t bytes;
    gpuarr__cu_ptr dev;
    void *pinned, *pageable;
    gpuarr__cu_stream stream;
    gpuarr__cu_event e0, e1;
} cu_bufs;

static void cu_bufs_open(cu_bufs *b, size_t bytes) {
    memset(b, 0, sizeof *b);
    b->bytes = bytes;
    cu_check(CU.p_cuMemAlloc_v2(&b->dev, bytes), "cuMemAlloc");
    cu_check(CU.p_cuMemHostAlloc(&b->pinned, bytes, 0), "cuMemHostAlloc");
    b->pageable = malloc(bytes);
    if (!b->pageable) die("malloc");
    fill_source(b->pageable, GPUARR_F32, bytes / 4);
    memcpy(b->pinned, b->pageable, bytes);
    cu_check(CU.p_cuStreamCreate(&b->stream, GPUARR__CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    cu_check(CU.p_cuEventCreate(&b->e0, 0), "cuEventCreate");
    cu_check(CU.p_cuEventCreate(&b->e1, 0), "cuEventCreate");
}

static void cu_bufs_close(cu_bufs *b) {
    CU.p_cuEventDestroy_v2(b->e0);
    CU.p_cuEventDestroy_v2(b->e1);
    CU.p_cuStreamDestroy_v2(b->stream);
    CU.p_cuMemFree_v2(b->dev);
    CU.p_cuMemFreeHost(b->pinned);
    free(b->pageable);
}

/* Raw copies, timed on the host around the call and its completion. */
static double cu_h2d_async(cu_bufs *b, const void *src, size_t bytes) {
    double t0 = now_s();
    cu_check(CU.p_cuMemcpyHtoDAsync_v2(b->dev, src, bytes, b->stream), "cuMemcpyHtoDAsync");
    cu_check(CU.p_cuStreamSynchronize(b->stream), "cuStreamSynchronize");
    return now_s() - t0;
}
static double cu_d2h_async(cu_bufs *b, void *dst, size_t bytes) {
    double t0 = now_s();
    cu_check(CU.p_cuMemcpyDtoHAsync_v2(dst, b->dev, bytes, b->stream), "cuMemcpyDtoHAsync");
    cu_check(CU.p_cuStreamSynchronize(b->stream), "cuStreamSynchronize");
    return now_s() - t0;
}
static double cu_h2d_sync(cu_bufs *b, const void *src, size_t bytes) {
    double t0 = now_s();
    cu_check(CU.p_cuMemcpyHtoD_v2(b->dev, src, bytes), "cuMemcpyHtoD");
    return now_s() - t0;
}
static double cu_d2h_sync(cu_bufs *b, void *dst, size_t bytes) {
    double t0 = now_s();
    cu_check(CU.p_cuMemcpyDtoH_v2(dst, b->dev, bytes), "cuMemcpyDtoH");
    return now_s() - t0;
}
/* The other way to use pageable memory at DMA speed: register it for the copy. */
static double cu_h2d_registered(cu_bufs *b, void *src, size_t bytes) {
    if (!CU.p_cuMemHostRegister_v2) return 0;
    double t0 = now_s();
    cu_check(CU.p_cuMemHostRegister_v2(src, bytes, 0), "cuMemHostRegister");
    cu_check(CU.p_cuMemcpyHtoDAsync_v2(b->dev, src, bytes, b->stream), "cuMemcpyHtoDAsync");
    cu_check(CU.p_cuStreamSynchronize(b->stream), "cuStreamSynchronize");
    cu_check(CU.p_cuMemHostUnregister(src), "cuMemHostUnregister");
    return now_s() - t0;
}

/* gpuarr's: an upload that allocates its array (from the warm pool) and returns when the data
   is there; a download into the caller's buffer. */
static double ga_upload(gpuarr_device d, const void *src, size_t bytes) {
    int64_t shape[1] = {(int64_t)(bytes / 4)};
    gpuarr_array a;
    double t0 = now_s();
    if (gpuarr_from_host_as(d, GPUARR_F32, src, 1, shape, &a) != GPUARR_OK) die("gpuarr_from_host_as");
    double t = now_s() - t0;
    gpuarr_release(a);
    return t;
}
static double ga_download(gpuarr_array a, void *dst, size_t bytes) {
    double t0 = now_s();
    if (gpuarr_to_host_as(a, GPUARR_F32, dst, bytes / 4) != GPUARR_OK) die("gpuarr_to_host_as");
    return now_s() - t0;
}

static double rate(size_t bytes, double s) { return (double)bytes / s / 1e9; }

static void bench_cuda_transfers(gpuarr_device d, size_t mib, int reps) {
    size_t bytes = mib << 20;
    cu_bufs b;
    cu_bufs_open(&b, bytes);
    int64_t shape[1] = {(int64_t)(bytes / 4)};
    gpuarr_array a;
    if (gpuarr_from_host_as(d, GPUARR_F32, b.pageable, 1, shape, &a) != GPUARR_OK) die("gpuarr_from_host_as");
    double pin_raw[64], pin_ga[64], pg_raw[64], pg_ga[64], reg[64], dpin_raw[64], dpin_ga[64], dpg_raw[64], dpg_ga[64];
    for (int r = -2; r < reps; r++) {
        int k = r < 0 ? 0 : r;
        pin_raw[k] = cu_h2d_async(&b, b.pinned, bytes);
        pin_ga[k] = ga_upload(d, b.pinned, bytes);
        pg_raw[k] = cu_h2d_sync(&b, b.pageable, bytes);
        pg_ga[k] = ga_upload(d, b.pageable, bytes);
        reg[k] = cu_h2d_registered(&b, b.pageable, bytes);
        dpin_raw[k] = cu_d2h_async(&b, b.pinned, bytes);
        dpin_ga[k] = ga_download(a, b.pinned, bytes);
        dpg_raw[k] = cu_d2h_sync(&b, b.pageable, bytes);
        dpg_ga[k] = ga_download(a, b.pageable, bytes);
    }
    double tpr = median(pin_raw, reps), tpg = median(pin_ga, reps), tgr = median(pg_raw, reps), tgg = median(pg_ga, reps);
    double treg = median(reg, reps), dpr = median(dpin_raw, reps), dpg = median(dpin_ga, reps), dgr = median(dpg_raw, reps),
           dgg = median(dpg_ga, reps);
    printf("\n| transfer (%zu MiB f32) | median time | rate | gpuarr / its baseline | vs pinned raw |\n|---|---|---|---|---|\n", mib);
    printf("| cuMemcpyHtoDAsync + sync from pinned (baseline) | %.2f ms | %.2f GB/s | | 1.00 |\n", tpr * 1e3, rate(bytes, tpr));
    printf("| **gpuarr_from_host_as from pinned** (allocates) | %.2f ms | %.2f GB/s | **%.3f** (target >= 0.97) | %.3f |\n", tpg * 1e3,
           rate(bytes, tpg), tpr / tpg, tpr / tpg);
    printf("| cuMemcpyHtoD from pageable malloc memory (baseline) | %.2f ms | %.2f GB/s | | %.3f |\n", tgr * 1e3, rate(bytes, tgr), tpr / tgr);
    printf("| **gpuarr_from_host_as from pageable** (staged) | %.2f ms | %.2f GB/s | **%.2f** (target >= 1.5) | **%.3f** (target >= 0.85) |\n",
           tgg * 1e3, rate(bytes, tgg), tgr / tgg, tpr / tgg);
    if (treg > 0)
        printf("| cuMemHostRegister + async copy + unregister, pageable | %.2f ms | %.2f GB/s | | %.3f |\n", treg * 1e3, rate(bytes, treg),
               tpr / treg);
    printf("| cuMemcpyDtoHAsync + sync to pinned (baseline) | %.2f ms | %.2f GB/s | | 1.00 |\n", dpr * 1e3, rate(bytes, dpr));
    printf("| **gpuarr_to_host_as to pinned** | %.2f ms | %.2f GB/s | **%.3f** (target >= 0.97) | %.3f |\n", dpg * 1e3, rate(bytes, dpg),
           dpr / dpg, dpr / dpg);
    printf("| cuMemcpyDtoH to pageable (baseline) | %.2f ms | %.2f GB/s | | %.3f |\n", dgr * 1e3, rate(bytes, dgr), dpr / dgr);
    printf("| **gpuarr_to_host_as to pageable** (staged) | %.2f ms | %.2f GB/s | **%.2f** | %.3f |\n", dgg * 1e3, rate(bytes, dgg), dgr / dgg,
           dpr / dgg);
    gpuarr_release(a);
    cu_bufs_close(&b);
}

/* Upload and download rates by size, raw and through gpuarr (issue 6's table). */
static void bench_cuda_sweep(gpuarr_device d, size_t max_mib) {
    size_t max_bytes = max_mib << 20;
    cu_bufs b;
    cu_bufs_open(&b, max_bytes);
    printf("\n| size | H2D pinned raw | H2D pageable raw | gpuarr H2D pageable | gpuarr H2D pinned | D2H pinned raw | D2H pageable raw | gpuarr D2H pageable | gpuarr D2H pinned |\n"
           "|---|---|---|---|---|---|---|---|---|\n");
    for (size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
        int reps = bytes <= ((size_t)1 << 20) ? 51 : bytes <= ((size_t)64 << 20) ? 15 : 5;
        double v[8][51];
        int64_t shape[1] = {(int64_t)(bytes / 4)};
        gpuarr_array a;
        if (gpuarr_from_host_as(d, GPUARR_F32, b.pageable, 1, shape, &a) != GPUARR_OK) die("gpuarr_from_host_as");
        for (int r = -1; r < reps; r++) {
            int k = r < 0 ? 0 : r;
            v[0][k] = cu_h2d_async(&b, b.pinned, bytes);
            v[1][k] = cu_h2d_sync(&b, b.pageable, bytes);
            v[2][k] = ga_upload(d, b.pageable, bytes);
            v[3][k] = ga_upload(d, b.pinned, bytes);
            v[4][k] = cu_d2h_async(&b, b.pinned, bytes);
            v[5][k] = cu_d2h_sync(&b, b.pageable, bytes);
            v[6][k] = ga_download(a, b.pageable, bytes);
            v[7][k] = ga_download(a, b.pinned, bytes);
        }
        gpuarr_release(a);
        char label[32];
        gpuarr__format_bytes(label, sizeof label, bytes);
        printf("| %s", label);
        for (int c = 0; c < 8; c++) printf(" | %.2f GB/s", rate(bytes, median(v[c], reps)));
        printf(" |\n");
    }
    cu_bufs_close(&b);
}

/* On-device casts timed by events, against a device-to-device copy of the source's bytes. */
static void bench_cuda_casts(gpuarr_device d, size_t mib, int reps) {
    static const cast_case cases[] = {{GPUARR_F64, GPUARR_F32}, {GPUARR_F32, GPUARR_F16}, {GPUARR_F32, GPUARR_F64}};
    size_t src_bytes = mib << 20;
    cu_bufs b;
    cu_bufs_open(&b, src_bytes);
    gpuarr__cu_ptr scratch = 0;
    cu_check(CU.p_cuMemAlloc_v2(&scratch, src_bytes), "cuMemAlloc");
    gpuarr_event e0, e1;
    gpuarr_stream s;
    if (gpuarr_stream_create(d, 0, &s) != GPUARR_OK || gpuarr_event_create(d, GPUARR_EVENT_TIMING, &e0) != GPUARR_OK ||
        gpuarr_event_create(d, GPUARR_EVENT_TIMING, &e1) != GPUARR_OK)
        die("streams and events");
    printf("\n| on-device cast (%zu MiB source) | bytes read + written | time (events) | rate | cuMemcpyDtoDAsync rate, same reps | ratio (target >= 0.85) |\n"
           "|---|---|---|---|---|---|\n", mib);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cast_case c = cases[i];
        size_t n = src_bytes / gpuarr_dtype_size(c.src), moved = src_bytes + n * gpuarr_dtype_size(c.dst);
        int64_t shape[1] = {(int64_t)n};
        gpuarr_array src;
        if (gpuarr_from_host_as(d, c.src, b.pageable, 1, shape, &src) != GPUARR_OK) die("gpuarr_from_host_as");
        void *sp = NULL;
        gpuarr_cuda_ptr(src, &sp);
        double kernel[64], copy[64], ratio[64];
        for (int r = -2; r < reps; r++) {
            float ms = 0;
            cu_check(CU.p_cuEventRecord(b.e0, b.stream), "cuEventRecord");
            cu_check(CU.p_cuMemcpyDtoDAsync_v2(scratch, (gpuarr__cu_ptr)(uintptr_t)sp, src_bytes, b.stream), "cuMemcpyDtoDAsync");
            cu_check(CU.p_cuEventRecord(b.e1, b.stream), "cuEventRecord");
            cu_check(CU.p_cuEventSynchronize(b.e1), "cuEventSynchronize");
            cu_check(CU.p_cuEventElapsedTime(&ms, b.e0, b.e1), "cuEventElapsedTime");
            gpuarr_array out;
            double gms = 0;
            if (gpuarr_event_record(e0, s) != GPUARR_OK || gpuarr_convert_async(src, d, c.dst, s, &out) != GPUARR_OK ||
                gpuarr_event_record(e1, s) != GPUARR_OK || gpuarr_event_sync(e1) != GPUARR_OK || gpuarr_event_elapsed_ms(e0, e1, &gms) != GPUARR_OK)
                die("cast");
            gpuarr_release(out);
            if (r < 0) continue;
            copy[r] = ms * 1e-3;
            kernel[r] = gms * 1e-3;
            ratio[r] = ((double)moved / kernel[r]) / (2.0 * (double)src_bytes / copy[r]);
        }
        gpuarr_release(src);
        double tk = median(kernel, reps), tc = median(copy, reps);
        printf("| %s->%s | %zu MiB | %.3f ms | %.1f GB/s | %.1f GB/s | **%.2f** |\n", gpuarr_dtype_name(c.src), gpuarr_dtype_name(c.dst),
               moved >> 20, tk * 1e3, (double)moved / tk / 1e9, 2.0 * (double)src_bytes / tc / 1e9, median(ratio, reps));
    }
    gpuarr_event_destroy(e0);
    gpuarr_event_destroy(e1);
    gpuarr_stream_destroy(s);
    CU.p_cuMemFree_v2(scratch);
    cu_bufs_close(&b);
}

/* f64 on the GPU to f32 in host memory: gpuarr narrows on the device and moves half the bytes;
   the baseline is what a user writes: download the f64 and cast in a loop. */
static void bench_cuda_narrow_download(gpuarr_device d, size_t mib, int reps) {
    size_t bytes = mib << 20, n = bytes / 8;
    double *wide = (double *)malloc(bytes);
    float *out = (float *)malloc(n * 4);
    if (!wide || !out) die("malloc");
    fill_source(wide, GPUARR_F64, n);
    int64_t shape[1] = {(int64_t)n};
    gpuarr_array a;
    if (gpuarr_from_host(d, wide, 1, shape, &a) != GPUARR_OK) die("gpuarr_from_host");
    void *p = NULL;
    gpuarr_cuda_ptr(a, &p);
    double base[64], ga[64];
    for (int r = -2; r < reps; r++) {
        int k = r < 0 ? 0 : r;
        double t0 = now_s();
        cu_check(CU.p_cuMemcpyDtoH_v2(wide, (gpuarr__cu_ptr)(uintptr_t)p, bytes), "cuMemcpyDtoH");
        for (size_t i = 0; i < n; i++) out[i] = (float)wide[i];
        base[k] = now_s() - t0;
        sink = ((unsigned char *)out)[n];
        t0 = now_s();
        if (gpuarr_to_host_as(a, GPUARR_F32, out, n) != GPUARR_OK) die("gpuarr_to_host_as");
        ga[k] = now_s() - t0;
    }
    double tb = median(base, reps), tg = median(ga, reps);
    printf("\n| f64 on the GPU -> f32 on the host (%zu MiB of f64) | median time | speed-up |\n|---|---|---|\n", mib);
    printf("| cuMemcpyDtoH of the f64 + a cast loop on the host (baseline) | %.2f ms | 1.00 |\n", tb * 1e3);
    printf("| **gpuarr_to_host_as(a, GPUARR_F32, ...)** (cast on the GPU) | %.2f ms | **%.2f** (target >= 1.8) |\n", tg * 1e3, tb / tg);
    gpuarr_release(a);
    free(wide);
    free(out);
}

/* Small uploads: latency of 4 KiB, median over many. */
static void bench_cuda_latency(gpuarr_device d) {
    enum { N = 2001 };
    cu_bufs b;
    cu_bufs_open(&b, 4096);
    static double raw[N], ga[N];
    for (int i = 0; i < 50; i++) ga_upload(d, b.pageable, 4096); /* warm */
    for (int i = 0; i < N; i++) {
        raw[i] = cu_h2d_async(&b, b.pageable, 4096);
        ga[i] = ga_upload(d, b.pageable, 4096);
    }
    double tr = median(raw, N), tg = median(ga, N);
    printf("\n| 4 KiB upload from pageable memory, median of %d | latency | ratio |\n|---|---|---|\n", N);
    printf("| cuMemcpyHtoDAsync + cuStreamSynchronize (baseline) | %.1f us | 1.00 |\n", tr * 1e6);
    printf("| **gpuarr_from_host_as** (allocates from the pool) | %.1f us | **%.2f** (target <= 1.5) |\n", tg * 1e6, tg / tr);
    cu_bufs_close(&b);
}

/* The pool against cuMemAllocAsync/cuMemFreeAsync with the release threshold at its maximum. */
static double cu_async_pairs(gpuarr__cu_stream st, size_t bytes, int n) {
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        gpuarr__cu_ptr p = 0;
        cu_check(CU.p_cuMemAllocAsync(&p, bytes, st), "cuMemAllocAsync");
        cu_check(CU.p_cuMemFreeAsync(p, st), "cuMemFreeAsync");
    }
    cu_check(CU.p_cuStreamSynchronize(st), "cuStreamSynchronize");
    return (now_s() - t0) / n;
}

static bool cu_async_ready(gpuarr__dev *d, gpuarr__cu_stream *st) {
    gpuarr__cu_mempool pool = NULL;
    uint64_t max = UINT64_MAX;
    if (!CU.p_cuMemAllocAsync || !CU.p_cuDeviceGetDefaultMemPool || !CU.p_cuMemPoolSetAttribute ||
        CU.p_cuDeviceGetDefaultMemPool(&pool, GPUARR__CU_DEV(d)->dev) != GPUARR__CUDA_SUCCESS)
        return false;
    cu_check(CU.p_cuMemPoolSetAttribute(pool, GPUARR__CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &max), "cuMemPoolSetAttribute");
    cu_check(CU.p_cuStreamCreate(st, GPUARR__CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    return true;
}

static void bench_cuda_pool_async(gpuarr__dev *d) {
    gpuarr__cu_stream st;
    if (!cu_async_ready(d, &st)) {
        printf("\n(cuMemAllocAsync: not supported by this driver or device)\n");
        return;
    }
    static const size_t sizes[] = {4096, (size_t)1 << 20, (size_t)64 << 20};
    printf("\n| %s: allocate + free, median per pair | pool alone | cuMemAllocAsync + cuMemFreeAsync, threshold max (baseline) | async / pool |\n|---|---|---|---|\n",
           d->info.spec);
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        double pool[15], async[15];
        cu_async_pairs(st, sizes[k], 100);
        for (int r = 0; r < 15; r++) {
            pool[r] = time_pairs(d, sizes[k], 0, 20000);
            async[r] = cu_async_pairs(st, sizes[k], 20000);
        }
        double tp = median(pool, 15), ta = median(async, 15);
        char label[32];
        gpuarr__format_bytes(label, sizeof label, sizes[k]);
        printf("| %s | %.0f ns | %.0f ns | %.1fx |\n", label, tp * 1e9, ta * 1e9, ta / tp);
    }
    /* the replay's sequence through cuMemAllocAsync */
    enum { STEPS = 100000, LIVE = 1000 };
    static gpuarr__cu_ptr live[LIVE];
    unsigned seed = 777;
    double t0 = now_s();
    for (int i = 0; i < STEPS; i++) {
        seed = seed * 1103515245u + 12345u;
        size_t size = 1024 + (size_t)(seed >> 4) % ((size_t)4 << 20);
        seed = seed * 1103515245u + 12345u;
        int slot = (int)((seed >> 8) % LIVE);
        if (live[slot]) cu_check(CU.p_cuMemFreeAsync(live[slot], st), "cuMemFreeAsync");
        cu_check(CU.p_cuMemAllocAsync(&live[slot], size, st), "cuMemAllocAsync");
    }
    cu_check(CU.p_cuStreamSynchronize(st), "cuStreamSynchronize");
    double t = now_s() - t0;
    for (int s = 0; s < LIVE; s++)
        if (live[s]) CU.p_cuMemFreeAsync(live[s], st), live[s] = 0;
    CU.p_cuStreamSynchronize(st);
    printf("\n| %s replay through cuMemAllocAsync (same sequence as above) | %.1f ms | %.2f us per allocation |\n|---|---|---|\n", d->info.spec,
           t * 1e3, t * 1e6 / STEPS);
    CU.p_cuStreamDestroy_v2(st);
}

/* The first f32->f16 cast in a fresh process: from the committed PTX (the driver's JIT, its
   cache empty, then filled) and from NVRTC (gpuarr's cache empty, then filled). */
static void bench_kernel_first_use(const char *self, const char *spec) {
    char dir[] = "/tmp/gpuarr-bench-cache-XXXXXX", env[900], cmd[600];
    if (!mkdtemp(dir)) die("mkdtemp");
    printf("\n| first f32->f16 cast on %s (loads that pair's kernel) | time |\n|---|---|\n", spec);
    snprintf(env, sizeof env, "GPUARR_CUDA_KERNELS=ptx CUDA_CACHE_PATH='%s/jit'", dir);
    double cold = run_probe(self, spec, env), warm = run_probe(self, spec, env);
    printf("| committed PTX, driver JIT cache empty | %.1f ms |\n| committed PTX, driver JIT cache filled | %.1f ms |\n", cold, warm);
    snprintf(env, sizeof env, "GPUARR_CUDA_KERNELS=nvrtc GPUARR_CACHE_DIR='%s/gpuarr'", dir);
    cold = run_probe(self, spec, env);
    warm = run_probe(self, spec, env);
    printf("| NVRTC, gpuarr's cache empty | %.1f ms |\n| NVRTC, gpuarr's cache filled | %.1f ms |\n", cold, warm);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static void bench_cuda(const char *self, size_t mib, int reps, const char *only) {
    bool any = false;
    for (int i = 0; i < gpuarr_device_count(); i++) {
        gpuarr_device_info info;
        gpuarr_device_get_info(gpuarr_device_at(i), &info);
        if (info.backend != GPUARR_BACKEND_CUDA || (only && strcmp(only, info.spec) != 0)) continue;
        any = true;
        struct CUctx_st *ctx = NULL;
        if (gpuarr_cuda_context(info.device, &ctx) != GPUARR_OK) die("gpuarr_cuda_context");
        cu_check(CU.p_cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
        printf("\n## %s: %s, sm_%d%d, %d SMs, %.1f GB, PCI %s, %s, %d copy engines\n", info.spec, info.name, info.compute_capability_major,
               info.compute_capability_minor, info.compute_units, (double)info.total_memory / 1e9, info.pci_bus_id, info.version,
               info.copy_engines);
        bench_cuda_transfers(info.device, mib, reps);
        /* 4 KiB .. 1 GiB; the pageable source, pinned buffers and arrays need about 4x the top size */
        size_t sweep_mib = 1024;
        while (sweep_mib > 1 && ((uint64_t)sweep_mib << 22) > info.total_memory) sweep_mib /= 4;
        if (sweep_mib < 1024) printf("\nsweep capped at %zu MiB: the device has %.1f GB\n", sweep_mib, (double)info.total_memory / 1e9);
        bench_cuda_sweep(info.device, sweep_mib);
        bench_cuda_casts(info.device, mib, reps);
        bench_cuda_narrow_download(info.device, mib, reps);
        bench_cuda_latency(info.device);
        bench_kernel_first_use(self, info.spec);
        gpuarr__dev *dev = &gpuarr__g.devices[(info.device.id & 0xffffu) - 1u];
        bench_pool_pairs(dev);
        bench_pool_replay(dev);
        bench_cuda_pool_async(dev);
        if (!only) break;
    }
    if (!any) {
        gpuarr_device d;
        gpuarr_device_find(only ? only : "cuda:0", &d);
        printf("\n## CUDA: skipped: %s\n", gpuarr_last_error());
    }
}
#endif

/* ---------------------------------------------------------------------------------------------
 * --csv FILE: rate against size, every path against its baselines, for plots
 *
 * Sizes go by powers of 4 from --sweep-min (default 4 KiB) to --sweep-max (default 256 MiB);
 * `bytes` is the size of the source array. In every repetition each baseline and each gpuarr
 * path is timed back to back; a timing repeats a call until it lasts about 1 ms (at most 4096
 * calls; the counts are the last two columns) and gives the time per call. Medians over the
 * repetitions, which are fewer for larger sizes (15 up to 1 MiB, 11 up to 16 MiB, 7 up to
 * 64 MiB, 5 above; never more than --reps). `ratio` is the median over repetitions of gpuarr's
 * rate / the baseline's rate in that repetition (> 1: gpuarr is faster). Rates (GB/s = 1e9
 * bytes/s) count bytes read plus bytes written for casts and memcpy, the bytes moved for
 * transfers.
 * ------------------------------------------------------------------------------------------- */
enum { SWEEP_OPS = 8 };

typedef struct sweep_op {
    void (*run)(void *ctx);
    void *ctx;
    double moved; /* bytes the rate counts */
} sweep_op;

typedef struct sweep_times {
    int reps, calls[SWEEP_OPS];
    double t[SWEEP_OPS][64]; /* seconds per call, per repetition */
} sweep_times;

typedef struct sweep_out {
    FILE *f;
    int max_reps;
    const char *device, *isa;
    size_t bytes;
} sweep_out;

static int sweep_reps(size_t bytes, int max_reps) {
    int r = bytes <= ((size_t)1 << 20) ? 15 : bytes <= ((size_t)16 << 20) ? 11 : bytes <= ((size_t)64 << 20) ? 7 : 5;
    return r < max_reps ? r : max_reps;
}

static double time_calls(const sweep_op *op, int calls) {
    double t0 = now_s();
    for (int i = 0; i < calls; i++) op->run(op->ctx);
    return (now_s() - t0) / calls;
}

static void sweep_measure(const sweep_op *ops, int n, int reps, sweep_times *st) {
    for (int w = 0; w < 2; w++) /* warm-up, then one call each to choose its count */
        for (int i = 0; i < n; i++) {
            double t = time_calls(&ops[i], 1);
            if (w == 1) st->calls[i] = t >= 1e-3 ? 1 : t * 4096 < 1e-3 ? 4096 : (int)(1e-3 / t) + 1;
        }
    st->reps = reps;
    for (int r = 0; r < reps; r++)
        for (int i = 0; i < n; i++) st->t[i][r] = time_calls(&ops[i], st->calls[i]);
}

/* One CSV row: op g against op b. */
static void sweep_row(const sweep_out *o, const char *section, const char *path, const char *baseline, const sweep_op *ops,
                      const sweep_times *st, int g, int b) {
    double tg[64], tb[64], ratio[64];
    for (int r = 0; r < st->reps; r++) {
        tg[r] = st->t[g][r];
        tb[r] = st->t[b][r];
        ratio[r] = (ops[g].moved / tg[r]) / (ops[b].moved / tb[r]);
    }
    double mg = median(tg, st->reps), mb = median(tb, st->reps);
    fprintf(o->f, "%s,%s,%s,%s,%s,%zu,%.9g,%.9g,%.6g,%.6g,%.6g,%d,%d,%d\n", section, path, baseline, o->isa, o->device, o->bytes, mg,
            mb, ops[g].moved / mg / 1e9, ops[b].moved / mb / 1e9, median(ratio, st->reps), st->reps, st->calls[g], st->calls[b]);
    fflush(o->f);
}

/* --- host casts ---------------------------------------------------------------------------- */
typedef struct host_cast_ctx {
    cast_case c;
    unsigned char *a, *b, *m;
    size_t n, src_bytes;
    gpuarr_array src;
} host_cast_ctx;

static void op_memcpy(void *p) {
    host_cast_ctx *x = (host_cast_ctx *)p;
    memcpy(x->m, x->a, x->src_bytes);
    sink = x->m[x->src_bytes / 2];
}
static void op_cast_kernel(void *p) {
    host_cast_ctx *x = (host_cast_ctx *)p;
    gpuarr__cpu_cast(x->b, x->c.dst, x->a, x->c.src, x->n);
    sink = x->b[x->n / 2];
}
static void op_cast_convert(void *p) {
    host_cast_ctx *x = (host_cast_ctx *)p;
    gpuarr_array out;
    if (gpuarr_convert(x->src, gpuarr_host(), x->c.dst, &out) != GPUARR_OK) die("gpuarr_convert");
    gpuarr_release(out);
}

typedef struct sweep_host_arg {
    sweep_out *o;
    size_t min, max;
} sweep_host_arg;

static void sweep_host_casts(void *arg) {
    static const cast_case cases[] = {{GPUARR_F32, GPUARR_F64}, {GPUARR_F64, GPUARR_F32}, {GPUARR_U8, GPUARR_F32},
                                      {GPUARR_F32, GPUARR_F16}, {GPUARR_F32, GPUARR_BF16}};
    sweep_host_arg *h = (sweep_host_arg *)arg;
    sweep_out *o = h->o;
    host_cast_ctx x;
    memset(&x, 0, sizeof x);
    x.a = (unsigned char *)malloc(h->max);
    x.b = (unsigned char *)malloc(h->max * 4);
    x.m = (unsigned char *)malloc(h->max);
    if (!x.a || !x.b || !x.m) die("malloc");
    memset(x.b, 1, h->max * 4); /* fault the destinations in before timing */
    memset(x.m, 1, h->max);
    o->isa = gpuarr__g.host_isa;
    o->device = "host";
    fprintf(stderr, "gpuarr-bench: host casts, kernels %s\n", o->isa);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        x.c = cases[i];
        fill_source(x.a, x.c.src, h->max / gpuarr_dtype_size(x.c.src));
        char path[32];
        snprintf(path, sizeof path, "%s->%s", gpuarr_dtype_name(x.c.src), gpuarr_dtype_name(x.c.dst));
        for (size_t bytes = h->min; bytes <= h->max; bytes *= 4) {
            x.src_bytes = bytes;
            x.n = bytes / gpuarr_dtype_size(x.c.src);
            int64_t shape[1] = {(int64_t)x.n};
            if (gpuarr_from_host_as(gpuarr_host(), x.c.src, x.a, 1, shape, &x.src) != GPUARR_OK) die("gpuarr_from_host_as");
            double moved = (double)(bytes + x.n * gpuarr_dtype_size(x.c.dst));
            sweep_op ops[3] = {{op_memcpy, &x, 2.0 * (double)bytes}, {op_cast_kernel, &x, moved}, {op_cast_convert, &x, moved}};
            sweep_times st;
            o->bytes = bytes;
            sweep_measure(ops, 3, sweep_reps(bytes, o->max_reps), &st);
            sweep_row(o, "host-cast", path, "memcpy", ops, &st, 1, 0);
            sweep_row(o, "host-convert", path, "memcpy", ops, &st, 2, 0);
            gpuarr_release(x.src);
        }
    }
    free(x.a);
    free(x.b);
    free(x.m);
}

/* --- devices: transfers and casts, each backend's raw calls as the baselines ------------------ */
typedef struct dev_sweep_ctx {
    gpuarr_device dev;
    float *src, *dst, *scratch; /* pageable host memory of the largest size */
    size_t bytes;
    gpuarr_array kept; /* an existing array of `bytes` */
    cast_case c;
    gpuarr_array cast_src;
#ifndef GPUARR_NO_OPENCL
    gpuarr__cl_command_queue q;
    gpuarr__cl_mem buf, buf2; /* raw buffers of the baselines */
#endif
#ifndef GPUARR_NO_CUDA
    gpuarr__cu_ptr cbuf, cbuf2;
    gpuarr__cu_stream cstream;
#endif
} dev_sweep_ctx;

/* A backend's baselines: blocking upload and download of the pageable buffer, a device copy. */
typedef struct raw_baselines {
    const char *backend, *write_name, *read_name, *copy_name;
    void (*write)(void *), (*read)(void *), (*copy)(void *);
} raw_baselines;

static void op_host_memcpy(void *p) {
    dev_sweep_ctx *x = (dev_sweep_ctx *)p;
    memcpy(x->scratch, x->src, x->bytes);
    sink = ((unsigned char *)x->scratch)[x->bytes / 2];
}
static void op_ga_from_host(void *p) {
    dev_sweep_ctx *x = (dev_sweep_ctx *)p;
    int64_t shape[1] = {(int64_t)(x->bytes / 4)};
    gpuarr_array a;
    if (gpuarr_from_host_as(x->dev, GPUARR_F32, x->src, 1, shape, &a) != GPUARR_OK) die("gpuarr_from_host_as");
    gpuarr_release(a);
}
static void op_ga_write(void *p) {
    dev_sweep_ctx *x = (dev_sweep_ctx *)p;
    if (gpuarr_write(x->kept, 0, (int64_t)(x->bytes / 4), GPUARR_F32, x->src) != GPUARR_OK) die("gpuarr_write");
}
static void op_ga_to_host(void *p) {
    dev_sweep_ctx *x = (dev_sweep_ctx *)p;
    if (gpuarr_to_host_as(x->kept, GPUARR_F32, x->dst, x->bytes / 4) != GPUARR_OK) die("gpuarr_to_host_as");
}
static void op_ga_read(void *p) {
    dev_sweep_ctx *x = (dev_sweep_ctx *)p;
    if (gpuarr_read(x->kept, 0, (int64_t)(x->bytes / 4), GPUARR_F32, x->dst) != GPUARR_OK) die("gpuarr_read");
}
static void op_ga_convert(void *p) {
    dev_sweep_ctx *x = (dev_sweep_ctx *)p;
    gpuarr_array out;
    if (gpuarr_convert(x->cast_src, x->dev, x->c.dst, &out) != GPUARR_OK) die("gpuarr_convert");
    gpuarr_release(out);
}

/* The sweep on one device; x's host buffers and the raw buffers (of max bytes) are set. */
static void sweep_device(sweep_out *o, dev_sweep_ctx *x, const raw_baselines *raw, size_t min, size_t max) {
    gpuarr_device_info info;
    gpuarr_device_get_info(x->dev, &info);
    char transfer[32], casts[32];
    snprintf(transfer, sizeof transfer, "%s-transfer", raw->backend);
    snprintf(casts, sizeof casts, "%s-cast", raw->backend);
    o->isa = "-";
    o->device = info.spec;
    fprintf(stderr, "gpuarr-bench: %s transfers\n", info.spec);
    fill_source(x->src, GPUARR_F32, max / 4);
    for (size_t bytes = min; bytes <= max; bytes *= 4) {
        x->bytes = bytes;
        int64_t shape[1] = {(int64_t)(bytes / 4)};
        if (gpuarr_from_host_as(x->dev, GPUARR_F32, x->src, 1, shape, &x->kept) != GPUARR_OK) die("gpuarr_from_host_as");
        double b = (double)bytes;
        sweep_op ops[6] = {{raw->write, x, b}, {op_ga_from_host, x, b}, {op_ga_write, x, b},
                           {raw->read, x, b},  {op_ga_to_host, x, b},   {op_ga_read, x, b}};
        sweep_times st;
        o->bytes = bytes;
        sweep_measure(ops, 6, sweep_reps(bytes, o->max_reps), &st);
        sweep_row(o, transfer, "upload: gpuarr_from_host_as (allocates)", raw->write_name, ops, &st, 1, 0);
        sweep_row(o, transfer, "upload: gpuarr_write (existing array)", raw->write_name, ops, &st, 2, 0);
        sweep_row(o, transfer, "download: gpuarr_to_host_as", raw->read_name, ops, &st, 4, 3);
        sweep_row(o, transfer, "download: gpuarr_read", raw->read_name, ops, &st, 5, 3);
        gpuarr_release(x->kept);
    }
    static const cast_case cases[] = {{GPUARR_F32, GPUARR_F64}, {GPUARR_F64, GPUARR_F32}, {GPUARR_F32, GPUARR_F16}};
    fprintf(stderr, "gpuarr-bench: %s casts\n", info.spec);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        x->c = cases[i];
        fill_source(x->src, x->c.src, max / gpuarr_dtype_size(x->c.src));
        char path[32];
        snprintf(path, sizeof path, "%s->%s", gpuarr_dtype_name(x->c.src), gpuarr_dtype_name(x->c.dst));
        for (size_t bytes = min; bytes <= max; bytes *= 4) {
            x->bytes = bytes;
            size_t n = bytes / gpuarr_dtype_size(x->c.src);
            int64_t shape[1] = {(int64_t)n};
            if (gpuarr_from_host_as(x->dev, x->c.src, x->src, 1, shape, &x->cast_src) != GPUARR_OK) die("gpuarr_from_host_as");
            double moved = (double)(bytes + n * gpuarr_dtype_size(x->c.dst));
            sweep_op ops[3] = {{raw->copy, x, 2.0 * (double)bytes}, {op_host_memcpy, x, 2.0 * (double)bytes}, {op_ga_convert, x, moved}};
            sweep_times st;
            o->bytes = bytes;
            sweep_measure(ops, 3, sweep_reps(bytes, o->max_reps), &st);
            sweep_row(o, casts, path, raw->copy_name, ops, &st, 2, 0);
            sweep_row(o, casts, path, "memcpy", ops, &st, 2, 1);
            gpuarr_release(x->cast_src);
        }
    }
}

static void dev_sweep_open(dev_sweep_ctx *x, gpuarr_device dev, size_t max) {
    memset(x, 0, sizeof *x);
    x->dev = dev;
    x->src = (float *)malloc(max);
    x->dst = (float *)malloc(max);
    x->scratch = (float *)malloc(max);
    if (!x->src || !x->dst || !x->scratch) die("malloc");
    memset(x->dst, 0, max);
    memset(x->scratch, 0, max);
}

static void dev_sweep_close(dev_sweep_ctx *x) {
    free(x->src);
    free(x->dst);
    free(x->scratch);
}

#ifndef GPUARR_NO_OPENCL
static void op_cl_write(void *p) {
    dev_sweep_ctx *x = (dev_sweep_ctx *)p;
    if (GPUARR__CL.clEnqueueWriteBuffer(x->q, x->buf, GPUARR__CL_TRUE, 0, x->bytes, x->src, 0, NULL, NULL) != GPUARR__CL_SUCCESS)
        die("clEnqueueWriteBuffer");
}
static void op_cl_read(void *p) {
    dev_sweep_ctx *x = (dev_sweep_ctx *)p;
    if (GPUARR__CL.clEnqueueReadBuffer(x->q, x->buf, GPUARR__CL_TRUE, 0, x->bytes, x->dst, 0, NULL, NULL) != GPUARR__CL_SUCCESS)
        die("clEnqueueReadBuffer");
}
static void op_cl_copy(void *p) { /* the source's bytes, device to device */
    dev_sweep_ctx *x = (dev_sweep_ctx *)p;
    if (GPUARR__CL.clEnqueueCopyBuffer(x->q, x->buf, x->buf2, 0, 0, x->bytes, 0, NULL, NULL) != GPUARR__CL_SUCCESS ||
        GPUARR__CL.clFinish(x->q) != GPUARR__CL_SUCCESS)
        die("clEnqueueCopyBuffer");
}

static void sweep_opencl_device(sweep_out *o, gpuarr_device dev, size_t min, size_t max) {
    static const raw_baselines raw = {"opencl", "clEnqueueWriteBuffer", "clEnqueueReadBuffer", "clEnqueueCopyBuffer",
                                      op_cl_write, op_cl_read, op_cl_copy};
    gpuarr__cl_state *cl = &GPUARR__CL;
    dev_sweep_ctx x;
    dev_sweep_open(&x, dev, max);
    void *ctx = NULL, *queue = NULL;
    gpuarr_stream s;
    if (gpuarr_stream_create(dev, 0, &s) != GPUARR_OK || gpuarr_opencl_context_raw(dev, &ctx) != GPUARR_OK ||
        gpuarr_opencl_queue_raw(s, &queue) != GPUARR_OK)
        die("opencl setup");
    x.q = (gpuarr__cl_command_queue)queue;
    gpuarr__cl_int e = 0;
    x.buf = cl->clCreateBuffer((gpuarr__cl_context)ctx, GPUARR__CL_MEM_READ_WRITE, max, NULL, &e);
    x.buf2 = cl->clCreateBuffer((gpuarr__cl_context)ctx, GPUARR__CL_MEM_READ_WRITE, max, NULL, &e);
    if (!x.buf || !x.buf2) die("clCreateBuffer");
    sweep_device(o, &x, &raw, min, max);
    cl->clReleaseMemObject(x.buf);
    cl->clReleaseMemObject(x.buf2);
    gpuarr_stream_destroy(s);
    dev_sweep_close(&x);
}
#endif

#ifndef GPUARR_NO_CUDA
static void op_cu_write(void *p) {
    dev_sweep_ctx *x = (dev_sweep_ctx *)p;
    cu_check(CU.p_cuMemcpyHtoD_v2(x->cbuf, x->src, x->bytes), "cuMemcpyHtoD");
}
static void op_cu_read(void *p) {
    dev_sweep_ctx *x = (dev_sweep_ctx *)p;
    cu_check(CU.p_cuMemcpyDtoH_v2(x->dst, x->cbuf, x->bytes), "cuMemcpyDtoH");
}
static void op_cu_copy(void *p) {
    dev_sweep_ctx *x = (dev_sweep_ctx *)p;
    cu_check(CU.p_cuMemcpyDtoDAsync_v2(x->cbuf2, x->cbuf, x->bytes, x->cstream), "cuMemcpyDtoDAsync");
    cu_check(CU.p_cuStreamSynchronize(x->cstream), "cuStreamSynchronize");
}

static void sweep_cuda_device(sweep_out *o, gpuarr_device dev, size_t min, size_t max) {
    static const raw_baselines raw = {"cuda", "cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemcpyDtoDAsync+sync", op_cu_write, op_cu_read, op_cu_copy};
    struct CUctx_st *ctx = NULL;
    if (gpuarr_cuda_context(dev, &ctx) != GPUARR_OK) die("gpuarr_cuda_context");
    cu_check(CU.p_cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    dev_sweep_ctx x;
    dev_sweep_open(&x, dev, max);
    cu_check(CU.p_cuMemAlloc_v2(&x.cbuf, max), "cuMemAlloc");
    cu_check(CU.p_cuMemAlloc_v2(&x.cbuf2, max), "cuMemAlloc");
    cu_check(CU.p_cuStreamCreate(&x.cstream, GPUARR__CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    sweep_device(o, &x, &raw, min, max);
    CU.p_cuStreamDestroy_v2(x.cstream);
    CU.p_cuMemFree_v2(x.cbuf);
    CU.p_cuMemFree_v2(x.cbuf2);
    dev_sweep_close(&x);
}
#endif

/* The first device of `backend` (or the one --device names); false when there is none. */
static bool sweep_backend(sweep_out *o, gpuarr_backend backend, const char *only, size_t min, size_t max) {
    for (int i = 0; i < gpuarr_device_count(); i++) {
        gpuarr_device_info info;
        gpuarr_device_get_info(gpuarr_device_at(i), &info);
        if (info.backend != backend || (only && strcmp(only, info.spec) != 0)) continue;
#ifndef GPUARR_NO_OPENCL
        if (backend == GPUARR_BACKEND_OPENCL) sweep_opencl_device(o, info.device, min, max);
#endif
#ifndef GPUARR_NO_CUDA
        if (backend == GPUARR_BACKEND_CUDA) sweep_cuda_device(o, info.device, min, max);
#endif
        return true;
    }
    return false;
}

static void sweep(const char *file, const cpu_desc *cpu, size_t min, size_t max, int max_reps, bool host, bool opencl, bool cuda,
                  const char *only) {
    FILE *f = strcmp(file, "-") == 0 ? stdout : fopen(file, "w");
    if (!f) {
        fprintf(stderr, "gpuarr-bench: cannot write %s\n", file);
        exit(1);
    }
    double t0 = now_s();
    sweep_out o = {f, max_reps, "host", "-", 0};
    print_machine(f, "# ", cpu);
    fprintf(f, "# sweep: %zu .. %zu bytes by powers of 4, at most %d repetitions\n", min, max, max_reps);
    fprintf(f, "section,path,baseline,isa,device,bytes,gpuarr_seconds,baseline_seconds,gpuarr_GBps,baseline_GBps,ratio,reps,gpuarr_calls,baseline_calls\n");
    if (host) {
        sweep_host_arg h = {&o, min, max};
        for_each_host_isa(sweep_host_casts, &h, f, "# ", "");
    }
    /* --device SPEC: that device's backend alone */
    if (opencl && (!only || strncmp(only, "opencl", 6) == 0) && !sweep_backend(&o, GPUARR_BACKEND_OPENCL, only, min, max))
        fprintf(f, "# opencl: no OpenCL device%s%s: no OpenCL rows\n", only ? " " : "", only ? only : "");
    if (cuda && (!only || strncmp(only, "cuda", 4) == 0) && !sweep_backend(&o, GPUARR_BACKEND_CUDA, only, min, max))
        fprintf(f, "# cuda: no CUDA device%s%s: no CUDA rows\n", only ? " " : "", only ? only : "");
    fprintf(f, "# done in %.1f s\n", now_s() - t0);
    fprintf(stderr, "gpuarr-bench: sweep done in %.1f s\n", now_s() - t0);
    if (f != stdout) fclose(f);
}

/* "4096", "64K", "256M", "1G" (K, M, G: powers of 1024); 0 when it is not a size. */
static size_t parse_size(const char *s) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    int shift = *end == 'K' || *end == 'k' ? 10 : *end == 'M' || *end == 'm' ? 20 : *end == 'G' || *end == 'g' ? 30 : 0;
    if (shift) end++;
    if (end == s || *end || v > (SIZE_MAX >> shift)) return 0;
    return (size_t)v << shift;
}

/* --host-isa: a comma list of auto, baseline, avx2; "both" = baseline,avx2. */
static bool parse_isa_list(const char *text) {
    static char copy[128];
    snprintf(copy, sizeof copy, "%s", strcmp(text, "both") == 0 ? "baseline,avx2" : text);
    isa_count = 0;
    for (char *p = strtok(copy, ","); p; p = strtok(NULL, ",")) {
        if (strcmp(p, "auto") != 0 && strcmp(p, "baseline") != 0 && strcmp(p, "avx2") != 0) {
            fprintf(stderr, "gpuarr-bench: --host-isa: \"%s\" is not auto, baseline or avx2 (or both)\n", p);
            return false;
        }
        if (isa_count == MAX_ISAS) {
            fprintf(stderr, "gpuarr-bench: --host-isa: at most %d entries\n", MAX_ISAS);
            return false;
        }
        isa_list[isa_count++] = p;
    }
    if (isa_count == 0) fprintf(stderr, "gpuarr-bench: --host-isa: empty list\n");
    return isa_count > 0;
}

/* --calibrate: gpuarr_calibrate on every device (each timed), the models it fitted
   (gpuarr_transfer_models_summary), then how well they predict sizes the fit did not use
   (256 KiB, 4 MiB, 64 MiB): for every device but the host, host -> device from pageable and from
   pinned memory, f32 and f32 -> i32, and device -> host, f32 and f32 -> i32, the estimate
   (gpuarr_transfer_estimate of the source array) against the median of 5 synchronous gpuarr_copy
   calls after one warm-up -- the call the models are fitted from. Models go to the cache as
   gpuarr_calibrate saves them. */
typedef struct calib_kind {
    const char *name;
    bool to_device, pinned;
    gpuarr_dtype to;
} calib_kind;

static double calib_measure(gpuarr_array to, gpuarr_array from) {
    double t[5];
    if (gpuarr_copy(to, from) != GPUARR_OK) die("gpuarr_copy");
    for (int i = 0; i < 5; i++) {
        double t0 = now_s();
        if (gpuarr_copy(to, from) != GPUARR_OK) die("gpuarr_copy");
        t[i] = now_s() - t0;
    }
    return median(t, 5);
}

static void calib_check(gpuarr_device dev, const gpuarr_device_info *info, const calib_kind *k, int64_t bytes) {
    int64_t n = bytes / 4;
    gpuarr_device host = gpuarr_host(), src_dev = k->to_device ? host : dev, dst_dev = k->to_device ? dev : host;
    gpuarr_array from, to;
    gpuarr_result r = k->pinned ? gpuarr_empty_pinned(dev, GPUARR_F32, 1, &n, &from) : gpuarr_empty(src_dev, GPUARR_F32, 1, &n, &from);
    if (r != GPUARR_OK) die("the source array");
    float zero = 0;
    if (gpuarr_fill_as(from, GPUARR_F32, &zero) != GPUARR_OK || gpuarr_empty(dst_dev, k->to, 1, &n, &to) != GPUARR_OK) die("the arrays");
    double predicted = -1;
    if (gpuarr_transfer_estimate(from, dst_dev, k->to, 0, &predicted) != GPUARR_OK) die("gpuarr_transfer_estimate");
    double measured = calib_measure(to, from);
    char ratio[32] = "-";
    if (predicted > 0) snprintf(ratio, sizeof ratio, "%.2f", measured / predicted);
    printf("| %s %s %s | %lld KiB | %.4f | %.4f | %s |\n", k->to_device ? "host ->" : info->spec, k->to_device ? info->spec : "-> host",
           k->name, (long long)(bytes >> 10), predicted * 1e3, measured * 1e3, ratio);
    gpuarr_release(from);
    gpuarr_release(to);
}

static int bench_calibrate(void) {
    if (gpuarr_init(NULL) != GPUARR_OK) die("gpuarr_init");
    cpu_desc cpu;
    read_cpu(&cpu);
    printf("## Run\n\n");
    print_machine(stdout, "- ", &cpu);
    printf("\n## Calibration\n\n| device | gpuarr_calibrate seconds |\n|---|---|\n");
    for (int i = 0; i < gpuarr_device_count(); i++) {
        gpuarr_device_info info;
        if (gpuarr_device_get_info(gpuarr_device_at(i), &info) != GPUARR_OK) die("gpuarr_device_get_info");
        double t0 = now_s();
        if (gpuarr_calibrate(info.device) != GPUARR_OK) die("gpuarr_calibrate");
        printf("| %s | %.2f |\n", info.spec, now_s() - t0);
    }
    static char models[65536];
    if (gpuarr_transfer_models_summary(models, sizeof models) != GPUARR_OK) die("gpuarr_transfer_models_summary");
    printf("\n## Models (t = latency + bytes / bandwidth)\n\n```\n%s```\n", models);
    static const calib_kind kinds[] = {{"pageable f32", true, false, GPUARR_F32}, {"pinned f32", true, true, GPUARR_F32},
                                       {"pageable f32->i32", true, false, GPUARR_I32}, {"f32", false, false, GPUARR_F32},
                                       {"f32->i32", false, false, GPUARR_I32}};
    static const int64_t sizes[] = {256 << 10, 4 << 20, 64 << 20};
    printf("\n## Predicted against measured (sizes not used in the fit)\n\n"
           "| transfer | size | predicted ms | measured ms (median of 5 gpuarr_copy) | measured / predicted |\n|---|---|---|---|---|\n");
    for (int i = 1; i < gpuarr_device_count(); i++) {
        gpuarr_device_info info;
        if (gpuarr_device_get_info(gpuarr_device_at(i), &info) != GPUARR_OK) die("gpuarr_device_get_info");
        for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
            for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) calib_check(info.device, &info, &kinds[k], sizes[s]);
    }
    gpuarr_shutdown();
    return 0;
}

int main(int argc, char **argv) {
    size_t mib = 64;
    int reps = 11;
    const char *only = NULL;
    bool host = true, opencl = true, pools = true, cuda = true, mutable_arrays = true;
    size_t cuda_mib = 256, sweep_min = 4096, sweep_max = (size_t)256 << 20;
    const char *csv = NULL;
    bool reps_given = false, trace_overhead = false, leases = false;
    int lease_jobs = 256;
    saved_isa_env = getenv("GPUARR_HOST_ISA") ? strdup(getenv("GPUARR_HOST_ISA")) : NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc) mib = (size_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]), reps_given = true;
        else if (strcmp(argv[i], "--host-isa") == 0 && i + 1 < argc) {
            if (!parse_isa_list(argv[++i])) return 2;
        } else if (strcmp(argv[i], "--csv") == 0 && i + 1 < argc) csv = argv[++i];
        else if (strcmp(argv[i], "--sweep-min") == 0 && i + 1 < argc) sweep_min = parse_size(argv[++i]);
        else if (strcmp(argv[i], "--sweep-max") == 0 && i + 1 < argc) sweep_max = parse_size(argv[++i]);
        else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) only = argv[++i];
        else if (strcmp(argv[i], "--cuda-mib") == 0 && i + 1 < argc) cuda_mib = (size_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--host-only") == 0) opencl = pools = cuda = mutable_arrays = false;
        else if (strcmp(argv[i], "--opencl-only") == 0) host = pools = cuda = mutable_arrays = false;
        else if (strcmp(argv[i], "--pool-only") == 0) host = opencl = cuda = mutable_arrays = false;
        else if (strcmp(argv[i], "--cuda-only") == 0) host = opencl = pools = mutable_arrays = false;
        else if (strcmp(argv[i], "--mutable-only") == 0) host = opencl = pools = cuda = false;
#ifndef GPUARR_NO_OPENCL
        else if (strcmp(argv[i], "--batch-only") == 0) { host = pools = cuda = mutable_arrays = false; batch_only = true; }
#endif
        else if (strcmp(argv[i], "--probe-build") == 0 && i + 1 < argc) return probe_build_time(argv[i + 1]);
        else if (strcmp(argv[i], "--trace-overhead") == 0) trace_overhead = true;
        else if (strcmp(argv[i], "--leases") == 0) leases = true;
        else if (strcmp(argv[i], "--lease-jobs") == 0 && i + 1 < argc) lease_jobs = atoi(argv[++i]);
        else if (strcmp(argv[i], "--lease-peer") == 0 && i + 4 < argc)
            return lease_peer(atoi(argv[i + 1]), atol(argv[i + 2]), atol(argv[i + 3]), strtod(argv[i + 4], NULL));
        else if (strcmp(argv[i], "--calibrate") == 0) return bench_calibrate();
        else {
            fprintf(stderr,
                    "usage: %s [--mib N] [--cuda-mib N] [--reps N (1..63)] [--host-only | --opencl-only | --pool-only | --cuda-only | "
                    "--mutable-only | --batch-only] [--device SPEC] [--host-isa auto|baseline|avx2|both[,...]] "
                    "[--csv FILE|- [--sweep-min SIZE] [--sweep-max SIZE]] [--trace-overhead] [--leases [--lease-jobs N]] [--calibrate]\n",
                    argv[0]);
            return 2;
        }
    }
    if (mib == 0 || reps < 1 || reps > 63 || lease_jobs < 1 || (leases && reps > 15)) {
        fprintf(stderr, "gpuarr-bench: --mib and --lease-jobs must be > 0, --reps 1..63 (1..15 with --leases)\n");
        return 2;
    }
    if (sweep_min < 64 || sweep_min % 8 || sweep_max < sweep_min) {
        fprintf(stderr, "gpuarr-bench: --sweep-min must be >= 64 and a multiple of 8, --sweep-max >= --sweep-min (sizes: 4096, 64K, 256M)\n");
        return 2;
    }
    if (gpuarr_init(NULL) != GPUARR_OK) die("gpuarr_init");
    cpu_desc cpu;
    read_cpu(&cpu);
    if (csv) {
        sweep(csv, &cpu, sweep_min, sweep_max, reps_given ? reps : 63, host, opencl, cuda, only);
        gpuarr_shutdown();
        free(saved_isa_env);
        return 0;
    }
    printf("## Run\n\n");
    print_machine(stdout, "- ", &cpu);
    printf("\n");
    if (trace_overhead) {
        bench_trace_overhead(reps_given ? reps : 21, only);
        gpuarr_shutdown();
        free(saved_isa_env);
        return 0;
    }
    if (leases) {
        bench_leases(argv[0], lease_jobs, reps_given ? reps : 3);
        gpuarr_shutdown();
        free(saved_isa_env);
        return 0;
    }
    printf("memcpy: glibc, one thread, %zu MiB, interleaved with the measured calls in every repetition; %d repetitions.\n\n", mib, reps);
    if (host) {
        bench_host_casts(mib, reps);
        bench_small_alloc();
    }
    if (pools) bench_pools(only);
    if (mutable_arrays) bench_mutable(mib, reps, only);
#ifndef GPUARR_NO_OPENCL
    if (opencl) bench_opencl(argv[0], mib, reps, only);
#else
    GPUARR__UNUSED(opencl);
#endif
#ifndef GPUARR_NO_CUDA
    if (cuda) bench_cuda(argv[0], cuda_mib, reps, only);
#else
    GPUARR__UNUSED(cuda);
    GPUARR__UNUSED(cuda_mib);
#endif
    GPUARR__UNUSED(only);
    gpuarr_shutdown();
    free(saved_isa_env);
    return 0;
}
