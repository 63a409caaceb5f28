// Compile test, C++17: the implementation compiled as C++, the overloads, the RAII scope guard.
#define GPUARR_IMPLEMENTATION
#include "gpuarr.h"

#include <cstdio>
#include <cstring>
#include <vector>

static int check(bool ok, const char *what) {
    if (!ok) std::fprintf(stderr, "compile test (C++17): %s failed: %s\n", what, gpuarr_last_error());
    return ok ? 0 : 1;
}

static bool scoped(gpuarr_device d) {
    GPUARR_SCOPED_DEVICE(d);
    return gpuarr_current_device().id == d.id;
}

/* A failed scoped device leaves the block without a current device, and says why. */
static bool scoped_failure_reported() {
    gpuarr_result r = GPUARR_OK;
    GPUARR_SCOPED_DEVICE_R(gpuarr_device{999}, &r);
    return r == GPUARR_ERROR_INVALID_HANDLE && gpuarr_current_device().id == 0 &&
           gpuarr_stream_sync(gpuarr_stream{}) == GPUARR_ERROR_INVALID_HANDLE;
}

int main() {
    if (check(gpuarr_init(nullptr) == GPUARR_OK, "init")) return 1;
    gpuarr_device host = gpuarr_host();
    std::vector<double> in{1.0, 2.5, -3.0};
    std::vector<float> out(3);
    int64_t shape[1] = {3};
    gpuarr_array a{}, b{};
    int bad = 0;
    bad += check(gpuarr_from_host(host, in.data(), 1, shape, &a) == GPUARR_OK, "from_host(double*)");
    bad += check(gpuarr_convert(a, host, GPUARR_F32, &b) == GPUARR_OK, "convert");
    bad += check(gpuarr_to_host(b, out.data(), out.size()) == GPUARR_OK && out[1] == 2.5f, "to_host(float*)");
    const long long ll[1] = {7};
    int64_t one[1] = {1};
    gpuarr_array c{};
    gpuarr_array_info info{};
    bad += check(gpuarr_from_host(host, ll, 1, one, &c) == GPUARR_OK, "from_host(const long long*)");
    bad += check(gpuarr_array_get_info(c, &info) == GPUARR_OK && info.dtype == GPUARR_I64, "long long is I64");
    bad += check(scoped(host), "GPUARR_SCOPED_DEVICE");
    GPUARR_WITH_DEVICE(host) { bad += check(gpuarr_current_device().id == host.id, "GPUARR_WITH_DEVICE"); }
    bad += check(scoped_failure_reported(), "GPUARR_SCOPED_DEVICE_R on an invalid device");
    bad += check(gpuarr_current_device().id != 0, "the device after a failed GPUARR_SCOPED_DEVICE_R");
    gpuarr_result with_r = GPUARR_OK;
    GPUARR_WITH_DEVICE_R(gpuarr_device{999}, &with_r) { bad += check(false, "GPUARR_WITH_DEVICE_R ran on an invalid device"); }
    bad += check(with_r == GPUARR_ERROR_INVALID_HANDLE, "GPUARR_WITH_DEVICE_R's result");
    double sec = -1; /* gpuarr_transfer_estimate: one overload per kind of src (nothing moves: 0 s, no fit) */
    bad += check(gpuarr_transfer_estimate(a, host, GPUARR_DTYPE_INVALID, 0, &sec) == GPUARR_OK && sec == 0, "transfer_estimate(array)");
    bad += check(gpuarr_transfer_estimate(a, host, GPUARR_F64, 1000, &sec) == GPUARR_ERROR_INVALID_ARGUMENT &&
                     std::strncmp(gpuarr_last_error(), "gpuarr_transfer_estimate_array:", 31) == 0, "transfer_estimate(array) picks _array");
    bad += check(gpuarr_transfer_estimate(host, host, GPUARR_DTYPE_INVALID, 0, &sec) == GPUARR_ERROR_INVALID_ARGUMENT &&
                     std::strncmp(gpuarr_last_error(), "gpuarr_transfer_estimate_device:", 32) == 0, "transfer_estimate(device) picks _device");
    gpuarr_release(a);
    gpuarr_release(b);
    gpuarr_release(c);
    gpuarr_shutdown();
    if (!bad) std::puts("compile test (C++17): ok");
    return bad;
}
