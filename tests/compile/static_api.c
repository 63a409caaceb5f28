/* Compile test: GPUARR_STATIC makes every public function static to this unit, and the ones it
   does not call draw no -Wunused-function. */
#define GPUARR_STATIC
#define GPUARR_IMPLEMENTATION
#include "gpuarr.h"

int main(void) {
    if (gpuarr_init(NULL) != GPUARR_OK) return 1;
    int in[2] = {1, -2}, out[2] = {0, 0};
    int64_t shape[1] = {2};
    gpuarr_array a;
    int bad = gpuarr_from_host(gpuarr_host(), in, 1, shape, &a) != GPUARR_OK;
    bad = bad || gpuarr_to_host(a, out, 2) != GPUARR_OK || out[1] != -2;
    if (!bad) gpuarr_release(a);
    gpuarr_shutdown();
    return bad;
}
