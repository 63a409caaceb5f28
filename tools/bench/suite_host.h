/* suite_host.h -- the host section: casts against memcpy, a small allocation (--host-only)
 *
 * Host section: casts f32->f64, f64->f32, u8->f32, f32->f16, f32->bf16 on N MiB source arrays
 * (default 64) against single-threaded memcpy of the same source bytes. Rates count bytes read
 * plus bytes written. "kernel" casts into memory that is already faulted in; "convert" is the
 * public gpuarr_convert, which also allocates (and first-touches) its output. Each repetition
 * runs memcpy, the kernel and gpuarr_convert back to back; ratios are the median over
 * repetitions of (cast rate / that repetition's memcpy rate). Then the median cost of
 * gpuarr_empty + gpuarr_release of a 4 KiB host array.
 *
 * --host-isa LIST: the host cast section once per entry of the comma list (auto, baseline, avx2;
 * "both" = baseline,avx2), in one run and one table, each against memcpy timed in its own
 * repetitions and labelled with the kernels the library reports. Each entry restarts the
 * library with GPUARR_HOST_ISA set to it; an entry this CPU cannot run (avx2 without AVX2) is
 * reported and skipped. Without it: the kernels gpuarr_init chose.
 *
 * Part of gpuarr-bench's one translation unit: gpuarr-bench.c includes it once, after
 * bench_common.h. */

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
