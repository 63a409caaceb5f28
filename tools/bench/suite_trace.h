/* suite_trace.h -- what the trace costs (gpuarr-bench --trace-overhead)
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
 * Part of gpuarr-bench's one translation unit: gpuarr-bench.c includes it once, after
 * bench_common.h. */

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
