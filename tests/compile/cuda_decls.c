/* Compile test: the CUDA backend's own declarations equal the official <cuda.h> and <nvrtc.h>.
   Every entry point is assigned to a pointer of gpuarr's declared type: with -Werror a different
   signature does not compile. Compiled (not linked: that would need the driver) where the CUDA
   toolkit is. */
#define _DEFAULT_SOURCE 1 /* <cuda.h> comes before the implementation: see HOW TO USE IT */
#include <cuda.h>
#include <nvrtc.h>
#define GPUARR_IMPLEMENTATION
#include "gpuarr.h"
#include <stdio.h>

#define SAME(ours, theirs) GPUARR__STATIC_ASSERT((long long)(ours) == (long long)(theirs), #ours " differs from " #theirs);
#define SAME_TYPE(ours, theirs) GPUARR__STATIC_ASSERT(sizeof(ours) == sizeof(theirs), #ours " and " #theirs " differ in size");

SAME(GPUARR__CUDA_SUCCESS, CUDA_SUCCESS)
SAME(GPUARR__CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_OUT_OF_MEMORY)
SAME(GPUARR__CUDA_ERROR_NO_DEVICE, CUDA_ERROR_NO_DEVICE)
SAME(GPUARR__CUDA_ERROR_NOT_READY, CUDA_ERROR_NOT_READY)
SAME(GPUARR__CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
SAME(GPUARR__CU_DEVICE_ATTRIBUTE_CLOCK_RATE, CU_DEVICE_ATTRIBUTE_CLOCK_RATE)
SAME(GPUARR__CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
SAME(GPUARR__CU_DEVICE_ATTRIBUTE_INTEGRATED, CU_DEVICE_ATTRIBUTE_INTEGRATED)
SAME(GPUARR__CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT)
SAME(GPUARR__CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)
SAME(GPUARR__CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
SAME(GPUARR__CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
SAME(GPUARR__CU_STREAM_NON_BLOCKING, CU_STREAM_NON_BLOCKING)
SAME(GPUARR__CU_EVENT_DISABLE_TIMING, CU_EVENT_DISABLE_TIMING)
SAME(GPUARR__CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTALLOC_PORTABLE)
SAME(GPUARR__CU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_CONTEXT)
SAME(GPUARR__CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_MEMORY_TYPE)
SAME(GPUARR__CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_HOST)
SAME(GPUARR__CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_DEVICE)
SAME(GPUARR__CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER)
SAME(GPUARR__CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
SAME(GPUARR__CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
SAME_TYPE(gpuarr__cu_result, CUresult)
SAME_TYPE(gpuarr__cu_device, CUdevice)
SAME_TYPE(gpuarr__cu_ptr, CUdeviceptr)
SAME_TYPE(gpuarr__nvrtc_result, nvrtcResult)
GPUARR__STATIC_ASSERT(sizeof(CUuuid) == 16, "CUuuid is 16 bytes");

/* The same types, so the pointers are interchangeable without a cast. */
static CUcontext context_check(gpuarr__cu_context c) { return c; }
static CUstream stream_check(gpuarr__cu_stream s) { return s; }
static CUevent event_check(gpuarr__cu_event e) { return e; }
static CUmodule module_check(gpuarr__cu_module m) { return m; }
static CUfunction function_check(gpuarr__cu_function f) { return f; }
static CUmemoryPool pool_check(gpuarr__cu_mempool p) { return p; }
static nvrtcProgram program_check(gpuarr__nvrtc_program p) { return p; }

#define CHECK_PROC(ret, name, params) ret(*check_##name) params = &name; (void)check_##name;
int main(void) {
    GPUARR__CU_PROCS(CHECK_PROC)
    GPUARR__CU_OPTIONAL_PROCS(CHECK_PROC)
    GPUARR__NVRTC_PROCS(CHECK_PROC)
    (void)context_check, (void)stream_check, (void)event_check, (void)module_check, (void)function_check, (void)pool_check;
    (void)program_check;
    puts("compile test (CUDA declarations): ok");
    return 0;
}
