/* Compile test: a unit that only includes the header (no implementation). */
#include "gpuarr.h"

int two_units_round_trip(void);

int two_units_round_trip(void) {
    int in[3] = {1, -2, 3}, out[3] = {0};
    int64_t shape[1] = {3};
    gpuarr_array a;
    if (gpuarr_from_host(gpuarr_host(), in, 1, shape, &a) != GPUARR_OK) return 1;
    int r = gpuarr_to_host(a, out, 3) != GPUARR_OK || out[1] != -2;
    gpuarr_release(a);
    return r;
}
