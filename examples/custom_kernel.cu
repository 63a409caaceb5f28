// custom_kernel: your own CUDA kernel on gpuarr arrays, on a gpuarr stream.
//
//   cc -std=c11 -O2 -I.. -c ../gpuarr.c                   (once: the implementation, in C)
//   nvcc -std=c++17 -O2 -I.. custom_kernel.cu gpuarr.o -o custom_kernel -lm -lpthread -ldl
//
// (make builds it when nvcc is found: build/rel/examples/custom_kernel.) The implementation is
// kept out of the .cu file: it takes a while to compile, and then editing a kernel recompiles
// only this file. The header's declarations are extern "C", so the C object links as it is.
//
// gpuarr uses each GPU's primary context, the one the CUDA runtime uses, so the pointers and
// streams it hands out are ordinary runtime pointers and cudaStream_t's. On a machine without a
// CUDA GPU it says so and exits 0.
#include "gpuarr.h"

#include <cmath>
#include <cstdio>
#include <vector>

#define CHECK(call)                                                                            \
    do {                                                                                       \
        gpuarr_result r_ = (call);                                                             \
        if (r_ != GPUARR_OK) {                                                                 \
            std::fprintf(stderr, "%s failed: %s\n", #call, gpuarr_last_error());               \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

// y = a * x + y, one element per thread
__global__ void saxpy(float a, const float *x, float *y, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

int main() {
    CHECK(gpuarr_init(nullptr));
    gpuarr_device gpu;
    if (gpuarr_device_find("cuda:0", &gpu) != GPUARR_OK) {
        std::printf("custom_kernel: no CUDA GPU here (%s); nothing to do\n", gpuarr_last_error());
        gpuarr_shutdown();
        return 0;
    }
    int ordinal = 0;
    CHECK(gpuarr_cuda_device_ordinal(gpu, &ordinal));
    cudaSetDevice(ordinal); // the runtime and gpuarr now share the GPU's primary context

    // x and y come from doubles on the host and live on the GPU as f32 (converted on the way)
    const int64_t n = 1 << 20;
    std::vector<double> xs(n), ys(n);
    for (int64_t i = 0; i < n; i++) xs[i] = 0.001 * (double)i, ys[i] = 1.0;
    int64_t shape[1] = {n};
    gpuarr_array x, y;
    gpuarr_array xh, yh;
    CHECK(gpuarr_wrap_host(xs.data(), GPUARR_F64, 1, shape, nullptr, nullptr, &xh));
    CHECK(gpuarr_wrap_host(ys.data(), GPUARR_F64, 1, shape, nullptr, nullptr, &yh));
    CHECK(gpuarr_convert(xh, gpu, GPUARR_F32, &x));
    CHECK(gpuarr_convert(yh, gpu, GPUARR_F32, &y));

    // the kernel runs on a gpuarr stream, on gpuarr's memory
    gpuarr_stream s;
    cudaStream_t stream;
    float *xp, *yp;
    CHECK(gpuarr_stream_create(gpu, 0, &s));
    CHECK(gpuarr_cuda_stream(s, &stream));
    CHECK(gpuarr_cuda_ptr(x, (void **)&xp));
    CHECK(gpuarr_cuda_ptr(y, (void **)&yp));
    saxpy<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(2.0f, xp, yp, n);
    cudaError_t launched = cudaGetLastError(); // reading it also resets it: read it once
    if (launched != cudaSuccess) {
        std::fprintf(stderr, "saxpy did not launch: %s\n", cudaGetErrorString(launched));
        return 1;
    }
    // gpuarr did not run this work, so it is told which stream used its memory: every later
    // gpuarr call on x or y runs after the kernel, on any stream, and their memory is not reused
    // for another array before the kernel is done, even if released early
    CHECK(gpuarr_array_record_stream(x, s));
    CHECK(gpuarr_array_record_stream(y, s));

    // back to f64 on the host: a synchronous call on the thread's own stream, after the kernel
    gpuarr_array back;
    CHECK(gpuarr_convert(y, gpuarr_host(), GPUARR_F64, &back));
    std::vector<double> out(n);
    CHECK(gpuarr_to_host(back, out.data(), (size_t)n));
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double want = (double)(2.0f * (float)xs[i] + 1.0f);
        worst = std::fmax(worst, std::fabs(out[i] - want));
    }
    std::printf("custom_kernel: saxpy on %lld elements on cuda:%d through gpuarr's stream; largest error %g\n", (long long)n, ordinal, worst);

    CHECK(gpuarr_release(back));
    CHECK(gpuarr_release(x));
    CHECK(gpuarr_release(y));
    CHECK(gpuarr_release(xh));
    CHECK(gpuarr_release(yh));
    CHECK(gpuarr_stream_destroy(s));
    gpuarr_shutdown();
    return worst < 1e-3 ? 0 : 1; // f32 rounding (the GPU may fuse a * x + y) at values up to 2100
}
