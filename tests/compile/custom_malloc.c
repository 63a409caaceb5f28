/* Compile test: GPUARR_MALLOC / GPUARR_FREE replace every allocation the library makes. */
#define _DEFAULT_SOURCE 1 /* libc headers come before the implementation: see HOW TO USE IT */
#include <stdio.h>
#include <stdlib.h>

static long live_blocks, total_blocks;
static void *counting_malloc(size_t n) {
    live_blocks++;
    total_blocks++;
    return malloc(n);
}
static void counting_free(void *p) {
    if (p) live_blocks--;
    free(p);
}
#define GPUARR_MALLOC(n) counting_malloc(n)
#define GPUARR_FREE(p) counting_free(p)
#define GPUARR_IMPLEMENTATION
#include "gpuarr.h"

int main(void) {
    if (gpuarr_init(NULL) != GPUARR_OK) return 1;
    float in[1000] = {0};
    int64_t shape[1] = {1000};
    gpuarr_array a;
    if (gpuarr_from_host(gpuarr_host(), in, 1, shape, &a) != GPUARR_OK) return 1;
    gpuarr_release(a);
    gpuarr_shutdown();
    int ok = total_blocks > 0 && live_blocks == 0;
    printf("compile test (GPUARR_MALLOC): %s (%ld allocations, %ld left)\n", ok ? "ok" : "FAILED", total_blocks, live_blocks);
    return ok ? 0 : 1;
}
