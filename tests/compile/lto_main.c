/* Compile test: linked with gpuarr.c under -O3 -flto, where gcc inlines across the two units
   and reports what it finds at link time. */
#include "gpuarr.h"

int main(void) {
    if (gpuarr_init(NULL) != GPUARR_OK) return 1;
    float in[3] = {1.5f, -2.0f, 3.25f};
    double out[3] = {0, 0, 0};
    int64_t shape[1] = {3};
    gpuarr_array a, b;
    int bad = gpuarr_from_host(gpuarr_host(), in, 1, shape, &a) != GPUARR_OK;
    if (!bad) {
        bad = gpuarr_convert(a, gpuarr_host(), GPUARR_F64, &b) != GPUARR_OK;
        if (!bad) {
            bad = gpuarr_to_host(b, out, 3) != GPUARR_OK || out[2] != 3.25;
            gpuarr_release(b);
        }
        gpuarr_release(a);
    }
    gpuarr_shutdown();
    return bad;
}
