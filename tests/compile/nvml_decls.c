/* Compile test: the CUDA backend's NVML declarations equal the official <nvml.h> (NVML API 13;
   not in Debian nor in the CUDA toolkit's default install: `make compile-tests` runs this where
   one is found, NVML_H). Included before gpuarr.h, nvml.h's own struct types take the place of
   gpuarr's, so every entry point is assigned to a pointer of gpuarr's declared type (with
   -Werror a different signature does not compile), and the layouts gpuarr asserts for its own
   structs are asserted here of nvml.h's. Compiled, not linked. */
#define _DEFAULT_SOURCE 1
#define NVML_NO_UNVERSIONED_FUNC_DEFS 1 /* the exported names, which gpuarr binds */
#include <nvml.h>
#include <stddef.h>
#define GPUARR_IMPLEMENTATION
#include "gpuarr.h"
#include <stdio.h>

#define SAME(ours, theirs) GPUARR__STATIC_ASSERT((long long)(ours) == (long long)(theirs), #ours " differs from " #theirs);

SAME(GPUARR__NVML_SUCCESS, NVML_SUCCESS)
SAME(GPUARR__NVML_TEMPERATURE_GPU, NVML_TEMPERATURE_GPU)
SAME(GPUARR__NVML_CLOCK_SM, NVML_CLOCK_SM)
SAME(GPUARR__NVML_CLOCK_MEM, NVML_CLOCK_MEM)
SAME(GPUARR__NVML_STRUCT_VERSION(gpuarr__nvml_memory_v2, 2), nvmlMemory_v2)
SAME(GPUARR__NVML_STRUCT_VERSION(gpuarr__nvml_temperature, 1), nvmlTemperature_v1)
GPUARR__STATIC_ASSERT(sizeof(gpuarr__nvml_return) == sizeof(nvmlReturn_t), "nvmlReturn_t");
/* the numbers gpuarr_cuda.h asserts of its own structs */
GPUARR__STATIC_ASSERT(sizeof(nvmlMemory_t) == 24 && offsetof(nvmlMemory_t, free) == 8 && offsetof(nvmlMemory_t, used) == 16, "nvmlMemory_t");
GPUARR__STATIC_ASSERT(sizeof(nvmlMemory_v2_t) == 40 && offsetof(nvmlMemory_v2_t, total) == 8 && offsetof(nvmlMemory_v2_t, reserved) == 16 &&
                          offsetof(nvmlMemory_v2_t, free) == 24 && offsetof(nvmlMemory_v2_t, used) == 32,
                      "nvmlMemory_v2_t");
GPUARR__STATIC_ASSERT(sizeof(nvmlTemperature_t) == 12 && offsetof(nvmlTemperature_t, sensorType) == 4 &&
                          offsetof(nvmlTemperature_t, temperature) == 8,
                      "nvmlTemperature_v1_t");
GPUARR__STATIC_ASSERT(sizeof(nvmlUtilization_t) == 8 && offsetof(nvmlUtilization_t, memory) == 4, "nvmlUtilization_t");

static nvmlDevice_t device_check(gpuarr__nvml_device d) { return d; }

/* nvml.h marks the older entry points deprecated: gpuarr calls them only where the newer are missing */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#define CHECK_PROC(ret, name, params) ret(*check_##name) params = &name; (void)check_##name;
int main(void) {
    GPUARR__NVML_PROCS(CHECK_PROC)
    GPUARR__NVML_OPTIONAL_PROCS(CHECK_PROC)
    (void)device_check;
    puts("compile test (NVML declarations): ok");
    return 0;
}
