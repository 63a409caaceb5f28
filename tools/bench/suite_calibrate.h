/* suite_calibrate.h -- the transfer models' calibration and how well they predict (gpuarr-bench --calibrate)
 *
 * The models gpuarr_calibrate fits, and each against sizes the fit did not use.
 *
 * Part of gpuarr-bench's one translation unit: gpuarr-bench.c includes it once, after
 * bench_common.h. */

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
