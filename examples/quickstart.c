/* quickstart: list the devices, then round-trip an f64 array through f32 on the best device.
   Build: cc -std=c11 -I.. quickstart.c ../gpuarr.c -lm -lpthread -ldl */
#include <math.h>
#include <stdio.h>
#include "gpuarr.h"

#define CHECK(call)                                                                         \
    do {                                                                                    \
        gpuarr_result r_ = (call);                                                          \
        if (r_ != GPUARR_OK) {                                                              \
            fprintf(stderr, "%s failed: %s\n", #call, gpuarr_last_error());                 \
            return 1;                                                                       \
        }                                                                                   \
    } while (0)

int main(void) {
    CHECK(gpuarr_init(NULL));

    printf("%-10s %-6s %-44s %10s %6s\n", "device", "type", "name", "memory", "units");
    for (int i = 0; i < gpuarr_device_count(); i++) {
        gpuarr_device_info info;
        CHECK(gpuarr_device_get_info(gpuarr_device_at(i), &info));
        static const char *types[] = {"?", "cpu", "gpu", "accel"};
        printf("%-10s %-6s %-44.44s %7.1f GB %6d\n", info.spec, types[info.type], info.name,
               (double)info.total_memory / 1e9, info.compute_units);
    }

    gpuarr_device dev;
    CHECK(gpuarr_device_find("any", &dev)); /* the best GPU, else the host */
    gpuarr_device_info info;
    CHECK(gpuarr_device_get_info(dev, &info));

    enum { ROWS = 3, COLS = 4 };
    double in[ROWS * COLS], back[ROWS * COLS];
    for (int i = 0; i < ROWS * COLS; i++) in[i] = 0.1 * i - 0.5;
    int64_t shape[2] = {ROWS, COLS};

    gpuarr_array a, b;
    CHECK(gpuarr_from_host(dev, in, 2, shape, &a)); /* F64, picked from `double *` */
    CHECK(gpuarr_convert(a, dev, GPUARR_F32, &b));  /* the cast runs on the device */
    CHECK(gpuarr_to_host(b, back, ROWS * COLS));   /* and back into doubles */

    int wrong = 0;
    for (int i = 0; i < ROWS * COLS; i++)
        if (back[i] != (double)(float)in[i]) wrong++;
    printf("\nround trip f64 -> f32 -> f64 of a %dx%d array on %s: %s\n", ROWS, COLS, info.spec,
           wrong ? "WRONG" : "ok");

    CHECK(gpuarr_release(a));
    CHECK(gpuarr_release(b));
    gpuarr_shutdown();
    return wrong ? 1 : 0;
}
