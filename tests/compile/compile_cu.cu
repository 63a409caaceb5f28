// Compile test, CUDA: gpuarr.h (implementation included) inside a .cu file next to a kernel.
// Runs without a GPU: only the host device is used.
#define GPUARR_IMPLEMENTATION
#include "gpuarr.h"

#include <cstdio>

__global__ void scale(float *x, int n, float factor) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= factor;
}

int main() {
    if (gpuarr_init(nullptr) != GPUARR_OK) return 1;
    float in[4] = {1, 2, 3, 4};
    double out[4];
    int64_t shape[1] = {4};
    gpuarr_array a{};
    bool ok = gpuarr_from_host(gpuarr_host(), in, 1, shape, &a) == GPUARR_OK &&
              gpuarr_to_host(a, out, 4) == GPUARR_OK && out[3] == 4.0;
    gpuarr_release(a);
    gpuarr_shutdown();
    (void)scale; // the kernel only has to compile here
    std::puts(ok ? "compile test (.cu): ok" : "compile test (.cu): FAILED");
    return ok ? 0 : 1;
}
