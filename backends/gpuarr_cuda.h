/*
 * gpuarr_cuda.h -- the CUDA backend: every NVIDIA GPU the driver shows, through the driver API.
 *
 * Included by gpuarr.h's implementation unless GPUARR_NO_CUDA. The driver (libcuda.so.1, or
 * GPUARR_CUDA_LIBRARY) is opened at run time and its entry points come from one X-macro list,
 * by their exported names (the _v2 ones where they exist); no driver or no GPU means zero CUDA
 * devices, never an error, so a program built with plain gcc runs anywhere. The types below are
 * the library's own, with CUDA's struct tags, checked against <cuda.h> by
 * tests/compile/cuda_decls.c. GPUARR_NO_RUNTIME_LINKING links -lcuda instead (<cuda.h> needed).
 * CUDA_VISIBLE_DEVICES is applied by the driver: "cuda:N" is the runtime's device N.
 *
 * Shape: each device's primary context (the one the CUDA runtime uses, so a user's runtime
 * code shares pointers, streams and events with gpuarr), made current only around gpuarr's own
 * driver calls and then restored; non-blocking streams; events without timing unless asked;
 * cast kernels from kernels/gpuarr_kernels.h, one module per dtype pair at its first use: the
 * committed PTX (generated/gpuarr_cuda_ptx.h, loaded by the driver's JIT) or, where that PTX
 * cannot be used, NVRTC (loaded at run time) compiling for the device, cached on disk.
 */
#if !defined(GPUARR_CUDA_BACKEND_INCLUDED)
#define GPUARR_CUDA_BACKEND_INCLUDED

#include "../generated/gpuarr_kernels_source.h"
#include "../generated/gpuarr_cuda_ptx.h"

/* ---------------------------------------------------------------------------------------------
 * Declarations (the driver API's ABI). CUresult and the attribute enums have only non-negative
 * values, so their C type is unsigned int.
 * ------------------------------------------------------------------------------------------- */
typedef unsigned int gpuarr__cu_result;
typedef int gpuarr__cu_device;
typedef unsigned long long gpuarr__cu_ptr; /* CUdeviceptr */
typedef struct CUctx_st *gpuarr__cu_context;
typedef struct CUstream_st *gpuarr__cu_stream;
typedef struct CUevent_st *gpuarr__cu_event;
typedef struct CUmod_st *gpuarr__cu_module;
typedef struct CUfunc_st *gpuarr__cu_function;
typedef struct CUmemPoolHandle_st *gpuarr__cu_mempool;
struct CUuuid_st; /* 16 bytes */

#define GPUARR__CUDA_SUCCESS 0u
#define GPUARR__CUDA_ERROR_OUT_OF_MEMORY 2u
#define GPUARR__CUDA_ERROR_NO_DEVICE 100u
#define GPUARR__CUDA_ERROR_NOT_READY 600u
#define GPUARR__CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED 704u
#define GPUARR__CU_DEVICE_ATTRIBUTE_CLOCK_RATE 13u
#define GPUARR__CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16u
#define GPUARR__CU_DEVICE_ATTRIBUTE_INTEGRATED 18u
#define GPUARR__CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT 40u
#define GPUARR__CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING 41u
#define GPUARR__CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75u
#define GPUARR__CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76u
#define GPUARR__CU_STREAM_NON_BLOCKING 1u
#define GPUARR__CU_EVENT_DISABLE_TIMING 2u
#define GPUARR__CU_MEMHOSTALLOC_PORTABLE 1u
#define GPUARR__CU_POINTER_ATTRIBUTE_CONTEXT 1u
#define GPUARR__CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2u
#define GPUARR__CU_MEMORYTYPE_HOST 1u
#define GPUARR__CU_MEMORYTYPE_DEVICE 2u
#define GPUARR__CU_JIT_ERROR_LOG_BUFFER 5u
#define GPUARR__CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES 6u
#define GPUARR__CU_MEMPOOL_ATTR_RELEASE_THRESHOLD 4u

/* ---------------------------------------------------------------------------------------------
 * Entry points: X(return type, exported name, parameters). Members are p_<name>, so no macro
 * of <cuda.h> (which renames cuEventRecord and others) can touch them.
 * ------------------------------------------------------------------------------------------- */
#define GPUARR__CU_PROCS(X)                                                                    \
    X(gpuarr__cu_result, cuInit, (unsigned int))                                               \
    X(gpuarr__cu_result, cuDriverGetVersion, (int *))                                          \
    X(gpuarr__cu_result, cuDeviceGetCount, (int *))                                            \
    X(gpuarr__cu_result, cuDeviceGet, (gpuarr__cu_device *, int))                              \
    X(gpuarr__cu_result, cuDeviceGetName, (char *, int, gpuarr__cu_device))                    \
    X(gpuarr__cu_result, cuDeviceGetAttribute, (int *, unsigned int, gpuarr__cu_device))       \
    X(gpuarr__cu_result, cuDeviceTotalMem_v2, (size_t *, gpuarr__cu_device))                   \
    X(gpuarr__cu_result, cuDeviceGetPCIBusId, (char *, int, gpuarr__cu_device))                \
    X(gpuarr__cu_result, cuDeviceCanAccessPeer, (int *, gpuarr__cu_device, gpuarr__cu_device)) \
    X(gpuarr__cu_result, cuDevicePrimaryCtxRetain, (gpuarr__cu_context *, gpuarr__cu_device))  \
    X(gpuarr__cu_result, cuDevicePrimaryCtxRelease_v2, (gpuarr__cu_device))                    \
    X(gpuarr__cu_result, cuDevicePrimaryCtxGetState, (gpuarr__cu_device, unsigned int *, int *)) \
    X(gpuarr__cu_result, cuDevicePrimaryCtxReset_v2, (gpuarr__cu_device))                      \
    X(gpuarr__cu_result, cuCtxGetCurrent, (gpuarr__cu_context *))                              \
    X(gpuarr__cu_result, cuCtxSetCurrent, (gpuarr__cu_context))                                \
    X(gpuarr__cu_result, cuCtxGetDevice, (gpuarr__cu_device *))                                \
    X(gpuarr__cu_result, cuCtxGetApiVersion, (gpuarr__cu_context, unsigned int *))             \
    X(gpuarr__cu_result, cuCtxEnablePeerAccess, (gpuarr__cu_context, unsigned int))            \
    X(gpuarr__cu_result, cuMemGetInfo_v2, (size_t *, size_t *))                                \
    X(gpuarr__cu_result, cuMemAlloc_v2, (gpuarr__cu_ptr *, size_t))                            \
    X(gpuarr__cu_result, cuMemFree_v2, (gpuarr__cu_ptr))                                       \
    X(gpuarr__cu_result, cuMemHostAlloc, (void **, size_t, unsigned int))                      \
    X(gpuarr__cu_result, cuMemFreeHost, (void *))                                              \
    X(gpuarr__cu_result, cuMemGetAddressRange_v2, (gpuarr__cu_ptr *, size_t *, gpuarr__cu_ptr)) \
    X(gpuarr__cu_result, cuPointerGetAttributes, (unsigned int, unsigned int *, void **, gpuarr__cu_ptr)) \
    X(gpuarr__cu_result, cuMemcpyHtoD_v2, (gpuarr__cu_ptr, const void *, size_t))              \
    X(gpuarr__cu_result, cuMemcpyDtoH_v2, (void *, gpuarr__cu_ptr, size_t))                    \
    X(gpuarr__cu_result, cuMemcpyHtoDAsync_v2, (gpuarr__cu_ptr, const void *, size_t, gpuarr__cu_stream)) \
    X(gpuarr__cu_result, cuMemcpyDtoHAsync_v2, (void *, gpuarr__cu_ptr, size_t, gpuarr__cu_stream)) \
    X(gpuarr__cu_result, cuMemcpyDtoDAsync_v2, (gpuarr__cu_ptr, gpuarr__cu_ptr, size_t, gpuarr__cu_stream)) \
    X(gpuarr__cu_result, cuMemcpyPeerAsync,                                                    \
      (gpuarr__cu_ptr, gpuarr__cu_context, gpuarr__cu_ptr, gpuarr__cu_context, size_t, gpuarr__cu_stream)) \
    X(gpuarr__cu_result, cuMemsetD8Async, (gpuarr__cu_ptr, unsigned char, size_t, gpuarr__cu_stream)) \
    X(gpuarr__cu_result, cuMemsetD16Async, (gpuarr__cu_ptr, unsigned short, size_t, gpuarr__cu_stream)) \
    X(gpuarr__cu_result, cuMemsetD32Async, (gpuarr__cu_ptr, unsigned int, size_t, gpuarr__cu_stream)) \
    X(gpuarr__cu_result, cuMemsetD2D32Async,                                                   \
      (gpuarr__cu_ptr, size_t, unsigned int, size_t, size_t, gpuarr__cu_stream))               \
    X(gpuarr__cu_result, cuStreamCreate, (gpuarr__cu_stream *, unsigned int))                  \
    X(gpuarr__cu_result, cuStreamDestroy_v2, (gpuarr__cu_stream))                              \
    X(gpuarr__cu_result, cuStreamSynchronize, (gpuarr__cu_stream))                             \
    X(gpuarr__cu_result, cuStreamQuery, (gpuarr__cu_stream))                                   \
    X(gpuarr__cu_result, cuStreamWaitEvent, (gpuarr__cu_stream, gpuarr__cu_event, unsigned int)) \
    X(gpuarr__cu_result, cuStreamGetCtx, (gpuarr__cu_stream, gpuarr__cu_context *))            \
    X(gpuarr__cu_result, cuLaunchHostFunc, (gpuarr__cu_stream, void (*)(void *), void *))      \
    X(gpuarr__cu_result, cuEventCreate, (gpuarr__cu_event *, unsigned int))                    \
    X(gpuarr__cu_result, cuEventDestroy_v2, (gpuarr__cu_event))                                \
    X(gpuarr__cu_result, cuEventRecord, (gpuarr__cu_event, gpuarr__cu_stream))                 \
    X(gpuarr__cu_result, cuEventSynchronize, (gpuarr__cu_event))                               \
    X(gpuarr__cu_result, cuEventQuery, (gpuarr__cu_event))                                     \
    X(gpuarr__cu_result, cuEventElapsedTime, (float *, gpuarr__cu_event, gpuarr__cu_event))    \
    X(gpuarr__cu_result, cuModuleLoadDataEx, (gpuarr__cu_module *, const void *, unsigned int, unsigned int *, void **)) \
    X(gpuarr__cu_result, cuModuleUnload, (gpuarr__cu_module))                                  \
    X(gpuarr__cu_result, cuModuleGetFunction, (gpuarr__cu_function *, gpuarr__cu_module, const char *)) \
    X(gpuarr__cu_result, cuLaunchKernel,                                                       \
      (gpuarr__cu_function, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, \
       unsigned int, gpuarr__cu_stream, void **, void **))                                     \
    X(gpuarr__cu_result, cuGetErrorName, (gpuarr__cu_result, const char **))                   \
    X(gpuarr__cu_result, cuGetErrorString, (gpuarr__cu_result, const char **))

/* Newer than the oldest driver gpuarr runs on: NULL where missing. */
#define GPUARR__CU_OPTIONAL_PROCS(X)                                                           \
    X(gpuarr__cu_result, cuDeviceGetUuid_v2, (struct CUuuid_st *, gpuarr__cu_device))          \
    X(gpuarr__cu_result, cuDeviceGetUuid, (struct CUuuid_st *, gpuarr__cu_device))             \
    X(gpuarr__cu_result, cuMemAllocAsync, (gpuarr__cu_ptr *, size_t, gpuarr__cu_stream))       \
    X(gpuarr__cu_result, cuMemFreeAsync, (gpuarr__cu_ptr, gpuarr__cu_stream))                  \
    X(gpuarr__cu_result, cuDeviceGetDefaultMemPool, (gpuarr__cu_mempool *, gpuarr__cu_device)) \
    X(gpuarr__cu_result, cuMemPoolSetAttribute, (gpuarr__cu_mempool, unsigned int, void *))    \
    X(gpuarr__cu_result, cuMemHostRegister_v2, (void *, size_t, unsigned int))                 \
    X(gpuarr__cu_result, cuMemHostUnregister, (void *))

/* NVRTC, loaded at the first kernel it has to compile (always at run time). */
typedef unsigned int gpuarr__nvrtc_result; /* nvrtcResult: an enum of non-negative values */
typedef struct _nvrtcProgram *gpuarr__nvrtc_program;
#define GPUARR__NVRTC_PROCS(X)                                                                 \
    X(const char *, nvrtcGetErrorString, (gpuarr__nvrtc_result))                               \
    X(gpuarr__nvrtc_result, nvrtcVersion, (int *, int *))                                      \
    X(gpuarr__nvrtc_result, nvrtcCreateProgram,                                                \
      (gpuarr__nvrtc_program *, const char *, const char *, int, const char *const *, const char *const *)) \
    X(gpuarr__nvrtc_result, nvrtcDestroyProgram, (gpuarr__nvrtc_program *))                    \
    X(gpuarr__nvrtc_result, nvrtcCompileProgram, (gpuarr__nvrtc_program, int, const char *const *)) \
    X(gpuarr__nvrtc_result, nvrtcGetProgramLogSize, (gpuarr__nvrtc_program, size_t *))         \
    X(gpuarr__nvrtc_result, nvrtcGetProgramLog, (gpuarr__nvrtc_program, char *))               \
    X(gpuarr__nvrtc_result, nvrtcGetPTXSize, (gpuarr__nvrtc_program, size_t *))                \
    X(gpuarr__nvrtc_result, nvrtcGetPTX, (gpuarr__nvrtc_program, char *))                      \
    X(gpuarr__nvrtc_result, nvrtcGetCUBINSize, (gpuarr__nvrtc_program, size_t *))              \
    X(gpuarr__nvrtc_result, nvrtcGetCUBIN, (gpuarr__nvrtc_program, char *))


/* NVML (libnvidia-ml.so.1, or GPUARR_NVML_LIBRARY), for telemetry: loaded at the first
   gpuarr_device_get_telemetry on a CUDA device (always at run time, also with
   GPUARR_NO_RUNTIME_LINKING), shut down with the backend. Declared from NVML's nvml.h (API
   version 13): nvmlReturn_t and the enums are plain C enums of non-negative values. A device is
   found by its UUID, never by index (NVML ignores CUDA_VISIBLE_DEVICES and orders by PCI). */
typedef unsigned int gpuarr__nvml_return;
typedef struct nvmlDevice_st *gpuarr__nvml_device;
#define GPUARR__NVML_SUCCESS 0u
#define GPUARR__NVML_TEMPERATURE_GPU 0u
#define GPUARR__NVML_CLOCK_SM 1u
#define GPUARR__NVML_CLOCK_MEM 2u
#if defined(NVML_API_VERSION) && !defined(__cplusplus) /* <nvml.h> came first, in C (tests/compile/nvml_decls.c
                                                          checks the entry points on its types) */
typedef nvmlMemory_t gpuarr__nvml_memory;
typedef nvmlMemory_v2_t gpuarr__nvml_memory_v2;
typedef nvmlTemperature_t gpuarr__nvml_temperature;
typedef nvmlUtilization_t gpuarr__nvml_utilization;
#else
typedef struct gpuarr__nvml_memory { /* nvmlMemory_t */
    unsigned long long total, free, used;
} gpuarr__nvml_memory;
typedef struct gpuarr__nvml_memory_v2 { /* nvmlMemory_v2_t */
    unsigned int version;
    unsigned long long total, reserved, free, used;
} gpuarr__nvml_memory_v2;
typedef struct gpuarr__nvml_temperature { /* nvmlTemperature_v1_t */
    unsigned int version;
    unsigned int sensorType; /* nvmlTemperatureSensors_t */
    int temperature;
} gpuarr__nvml_temperature;
typedef struct gpuarr__nvml_utilization { /* nvmlUtilization_t */
    unsigned int gpu, memory;
} gpuarr__nvml_utilization;
#endif
/* The layouts of nvml.h (tests/compile/nvml_decls.c asserts the same numbers of its types). */
GPUARR__STATIC_ASSERT(sizeof(gpuarr__nvml_memory) == 24 && offsetof(gpuarr__nvml_memory, used) == 16, "nvmlMemory_t");
GPUARR__STATIC_ASSERT(sizeof(gpuarr__nvml_memory_v2) == 40 && offsetof(gpuarr__nvml_memory_v2, total) == 8 &&
                          offsetof(gpuarr__nvml_memory_v2, free) == 24 && offsetof(gpuarr__nvml_memory_v2, used) == 32,
                      "nvmlMemory_v2_t");
GPUARR__STATIC_ASSERT(sizeof(gpuarr__nvml_temperature) == 12 && offsetof(gpuarr__nvml_temperature, temperature) == 8,
                      "nvmlTemperature_v1_t");
GPUARR__STATIC_ASSERT(sizeof(gpuarr__nvml_utilization) == 8 && offsetof(gpuarr__nvml_utilization, memory) == 4, "nvmlUtilization_t");
/* NVML_STRUCT_VERSION: the struct's size, its version in the top byte */
#define GPUARR__NVML_STRUCT_VERSION(type, ver) ((unsigned int)(sizeof(type) | ((unsigned int)(ver) << 24)))

/* Required: without them no telemetry comes from NVML. */
#define GPUARR__NVML_PROCS(X)                                                                  \
    X(gpuarr__nvml_return, nvmlInit_v2, (void))                                                \
    X(gpuarr__nvml_return, nvmlShutdown, (void))                                               \
    X(gpuarr__nvml_return, nvmlDeviceGetHandleByUUID, (const char *, gpuarr__nvml_device *))
/* Each reading's entry points, newest first: NULL where missing (an older NVML). */
#define GPUARR__NVML_OPTIONAL_PROCS(X)                                                         \
    X(gpuarr__nvml_return, nvmlDeviceGetMemoryInfo_v2, (gpuarr__nvml_device, gpuarr__nvml_memory_v2 *)) \
    X(gpuarr__nvml_return, nvmlDeviceGetMemoryInfo, (gpuarr__nvml_device, gpuarr__nvml_memory *)) \
    X(gpuarr__nvml_return, nvmlDeviceGetUtilizationRates, (gpuarr__nvml_device, gpuarr__nvml_utilization *)) \
    X(gpuarr__nvml_return, nvmlDeviceGetTemperatureV, (gpuarr__nvml_device, gpuarr__nvml_temperature *)) \
    X(gpuarr__nvml_return, nvmlDeviceGetTemperature, (gpuarr__nvml_device, unsigned int, unsigned int *)) \
    X(gpuarr__nvml_return, nvmlDeviceGetPowerUsage, (gpuarr__nvml_device, unsigned int *))     \
    X(gpuarr__nvml_return, nvmlDeviceGetEnforcedPowerLimit, (gpuarr__nvml_device, unsigned int *)) \
    X(gpuarr__nvml_return, nvmlDeviceGetPowerManagementLimit, (gpuarr__nvml_device, unsigned int *)) \
    X(gpuarr__nvml_return, nvmlDeviceGetClockInfo, (gpuarr__nvml_device, unsigned int, unsigned int *)) \
    X(gpuarr__nvml_return, nvmlDeviceGetCurrentClocksEventReasons, (gpuarr__nvml_device, unsigned long long *)) \
    X(gpuarr__nvml_return, nvmlDeviceGetCurrentClocksThrottleReasons, (gpuarr__nvml_device, unsigned long long *)) \
    X(gpuarr__nvml_return, nvmlDeviceGetCurrPcieLinkGeneration, (gpuarr__nvml_device, unsigned int *)) \
    X(gpuarr__nvml_return, nvmlDeviceGetCurrPcieLinkWidth, (gpuarr__nvml_device, unsigned int *))

/* ---------------------------------------------------------------------------------------------
 * State
 * ------------------------------------------------------------------------------------------- */
#define GPUARR__CU_PROC_MEMBER(ret, name, params) ret(*p_##name) params;

typedef struct gpuarr__cu_device_state {
    gpuarr__cu_device dev;
    gpuarr__cu_context ctx; /* the primary context, retained while the device is open; an adopted device's: the caller's */
    gpuarr__cu_context adopted; /* gpuarr_cuda_adopt: the caller's context (not retained: CUDA counts no references on
                                   created contexts), NULL once forgotten; NULL for the devices load found */
    bool is_adopted;
    int cc_major, cc_minor;
    pthread_mutex_t kernel_lock; /* builds */
    gpuarr_result build_result;  /* a failure to get kernels at all, remembered; OK otherwise */
    char build_error[512];
    gpuarr__cu_module modules[GPUARR_DTYPE_COUNT][GPUARR_DTYPE_COUNT];
    gpuarr__cu_function casts[GPUARR_DTYPE_COUNT][GPUARR_DTYPE_COUNT];
    signed char *peer; /* per other device: 0 not asked yet, 1 peer copies, -1 none */
    int nvml_found;    /* 0 not looked up yet, 1 nvml_device is it, -1 NVML does not know it (cu->nvml.lock) */
    gpuarr__nvml_device nvml_device;
    struct gpuarr__cu_host_call *host_calls; /* handed to the driver, not run yet (cu->host_lock) */
    struct gpuarr__cu_user_kernel *user_kernels; /* portable kernels built here: prepended under kernel_lock,
                                                    read without it (atomic head), freed at device_close */
} gpuarr__cu_device_state;

/* A host function handed to cuLaunchHostFunc: listed until it runs, because the driver never
   runs one after a context error (a sticky error such as CUDA_ERROR_ILLEGAL_ADDRESS), and what
   it holds is freed when the device closes instead. */
typedef struct gpuarr__cu_host_call {
    struct gpuarr__cu_host_call *prev, *next;
    gpuarr__cu_device_state *ds;
    gpuarr__host_fn fn;
    void *ctx;
} gpuarr__cu_host_call;

typedef struct gpuarr__cu_state {
    void *library;
    GPUARR__CU_PROCS(GPUARR__CU_PROC_MEMBER)
    GPUARR__CU_OPTIONAL_PROCS(GPUARR__CU_PROC_MEMBER)
    int driver_version;
    int device_count;  /* found by load; adopted devices follow them (adopted_count, room for GPUARR__ADOPT_MAX) */
    int adopted_count; /* rows are never reused: a removed device's index stays its own */
    gpuarr__cu_device_state *devices;
    pthread_mutex_t peer_lock;
    pthread_mutex_t host_lock; /* the devices' host_calls lists */
    void (*sim_hooks_set)(const gpuarr__sim_kernel_hooks *, int); /* a simulating driver's (see gpuarr__sim_kernel_hooks); NULL */
    struct {
        pthread_mutex_t lock; /* the lazy load and init, and the devices' lookups */
        int status;           /* 0 not tried yet, 1 initialized, -1 unavailable */
        void *library;
        GPUARR__NVML_PROCS(GPUARR__CU_PROC_MEMBER)
        GPUARR__NVML_OPTIONAL_PROCS(GPUARR__CU_PROC_MEMBER)
    } nvml;
} gpuarr__cu_state;

typedef struct gpuarr__nvrtc_state {
    pthread_mutex_t lock;
    bool tried, loaded;
    void *library;
    char error[256]; /* why it is not loaded */
    int major, minor;
    GPUARR__NVRTC_PROCS(GPUARR__CU_PROC_MEMBER)
} gpuarr__nvrtc_state;
/* Process-wide and kept: NVRTC does not depend on gpuarr_init (tools/cuda-ptx uses it alone). */
static gpuarr__nvrtc_state gpuarr__nvrtc = {PTHREAD_MUTEX_INITIALIZER, false, false, NULL, "", 0, 0,
#define GPUARR__NULL_MEMBER(ret, name, params) NULL,
                                            GPUARR__NVRTC_PROCS(GPUARR__NULL_MEMBER)
#undef GPUARR__NULL_MEMBER
};
#undef GPUARR__CU_PROC_MEMBER

/* A stream: the driver's, and whether gpuarr made it (a wrapped one is the caller's). */
typedef struct gpuarr__cu_stream_box {
    gpuarr__cu_stream stream;
    bool owned;
} gpuarr__cu_stream_box;

#define GPUARR__CU (*(gpuarr__cu_state *)gpuarr__g.backend_state[GPUARR_BACKEND_CUDA])
#define GPUARR__CU_DEV(d) (&GPUARR__CU.devices[(d)->info.index])
#define GPUARR__CU_STREAM(native) (((gpuarr__cu_stream_box *)(native))->stream)
#define GPUARR__CU_PTR(mem, off) ((gpuarr__cu_ptr)(uintptr_t)(mem) + (gpuarr__cu_ptr)(off))

/* The errors that stop cuInit, named even where the driver cannot (its stub, a broken install). */
static const char *gpuarr__cu_error_name(gpuarr__cu_state *cu, gpuarr__cu_result e) {
    const char *name = NULL;
    if (cu && cu->p_cuGetErrorName && cu->p_cuGetErrorName(e, &name) == GPUARR__CUDA_SUCCESS && name) return name;
    switch (e) {
    case 3: return "CUDA_ERROR_NOT_INITIALIZED";
    case 34: return "CUDA_ERROR_STUB_LIBRARY";
    case 35: return "CUDA_ERROR_INSUFFICIENT_DRIVER";
    case 46: return "CUDA_ERROR_DEVICES_UNAVAILABLE";
    case 100: return "CUDA_ERROR_NO_DEVICE";
    case 101: return "CUDA_ERROR_INVALID_DEVICE";
    case 803: return "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH";
    case 804: return "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE";
    case 999: return "CUDA_ERROR_UNKNOWN";
    default: return "CUDA error";
    }
}

/* What gpuarr__cu_enter answers for a failed device, without calling the driver (no CUresult). */
#define GPUARR__CU_LOST 0x7fffffffu

/* The errors after which, in the driver's words, "the process is in an inconsistent state and any
   further CUDA work will return the same error": 700 ILLEGAL_ADDRESS, 702 LAUNCH_TIMEOUT, 710
   ASSERT, 714..719 HARDWARE_STACK_ERROR .. LAUNCH_FAILED, 911 EXTERNAL_DEVICE. They fail the device. */
static bool gpuarr__cu_sticky(gpuarr__cu_result e) { return e == 700 || e == 702 || e == 710 || (e >= 714 && e <= 719) || e == 911; }

/* Maps a driver error to a result, naming the call and the driver's words. A sticky error on a
   device (where names it) fails the device: GPUARR_ERROR_DEVICE_LOST. */
static gpuarr_result gpuarr__cu_fail(gpuarr__cu_result e, const char *call, const char *where) {
    const char *name, *text = NULL;
    gpuarr__cu_state *cu = (gpuarr__cu_state *)gpuarr__g.backend_state[GPUARR_BACKEND_CUDA];
    name = gpuarr__cu_error_name(cu, e);
    if (cu && cu->p_cuGetErrorString) cu->p_cuGetErrorString(e, &text);
    gpuarr__dev *lost = gpuarr__cu_sticky(e) || e == GPUARR__CU_LOST ? gpuarr__dev_by_spec(where) : NULL;
    if (lost && e == GPUARR__CU_LOST) return gpuarr__dev_alive(lost);
    if (lost) {
        gpuarr__dev_mark_failed(lost, name, call);
        return gpuarr__fail(GPUARR_ERROR_DEVICE_LOST, "%s: %s failed: %s (%u): %s; %s is lost (failed: %s) until gpuarr_device_reset", where,
                            call, name, e, text ? text : "no description", where, lost->failure);
    }
    return gpuarr__fail(e == GPUARR__CUDA_ERROR_OUT_OF_MEMORY ? GPUARR_ERROR_OUT_OF_MEMORY : GPUARR_ERROR_BACKEND, "%s: %s failed: %s (%u): %s",
                        where, call, name, e, text ? text : "no description");
}

/* The device's primary context is made current around gpuarr's driver calls and the caller's
   context put back after, so a user's CUDA runtime code on this thread is not disturbed. */
typedef struct gpuarr__cu_scope {
    gpuarr__cu_context previous;
    bool switched;
    const char *failed; /* the context call that failed entering, for the message; NULL if none */
} gpuarr__cu_scope;
/* The call to name for an error after gpuarr__cu_enter: the context call if that failed. */
#define GPUARR__CU_CALLED(sc, call) ((sc).failed ? (sc).failed : (call))

static gpuarr__cu_result gpuarr__cu_enter(gpuarr__dev *d, gpuarr__cu_scope *sc) {
    gpuarr__cu_context want = GPUARR__CU_DEV(d)->ctx, cur = NULL;
    sc->switched = false;
    sc->previous = NULL;
    sc->failed = "a failed device";
    if (gpuarr__dev_failed(d)) return GPUARR__CU_LOST; /* its context is unusable: not even entered */
    sc->failed = "cuCtxGetCurrent";
    gpuarr__cu_result e = GPUARR__CU.p_cuCtxGetCurrent(&cur);
    sc->previous = cur;
    if (e != GPUARR__CUDA_SUCCESS) return e;
    sc->failed = NULL;
    if (cur == want) return e;
    e = GPUARR__CU.p_cuCtxSetCurrent(want);
    sc->switched = e == GPUARR__CUDA_SUCCESS;
    if (!sc->switched) sc->failed = "cuCtxSetCurrent";
    return e;
}

static void gpuarr__cu_leave(gpuarr__cu_scope *sc) {
    if (sc->switched) GPUARR__CU.p_cuCtxSetCurrent(sc->previous);
}

/* For the calls that free (memory, streams, events, modules): they cannot report, and skipping
   the driver call leaks the object for the context's life, so a context switch that failed is
   tried once more. */
static gpuarr__cu_result gpuarr__cu_enter_to_release(gpuarr__dev *d, gpuarr__cu_scope *sc) {
    gpuarr__cu_result e = gpuarr__cu_enter(d, sc);
    if (e != GPUARR__CUDA_SUCCESS) e = gpuarr__cu_enter(d, sc);
    return e;
}

/* One driver call on d's context: GPUARR__CU_DO(d, "cuMemFree", cuMemFree_v2(p)). */
#define GPUARR__CU_DO(d, what, call)                                                           \
    do {                                                                                       \
        gpuarr__cu_scope sc_;                                                                  \
        gpuarr__cu_result e_ = gpuarr__cu_enter((d), &sc_);                                    \
        if (e_ == GPUARR__CUDA_SUCCESS) e_ = GPUARR__CU.p_##call;                              \
        gpuarr__cu_leave(&sc_);                                                                \
        if (e_ != GPUARR__CUDA_SUCCESS) return gpuarr__cu_fail(e_, GPUARR__CU_CALLED(sc_, what), (d)->info.spec); \
    } while (0)

/* ---------------------------------------------------------------------------------------------
 * Loading
 * ------------------------------------------------------------------------------------------- */
/* dlsym returns an object pointer; copying its bits into the function pointer is the portable
   way ISO C accepts. */
static void *gpuarr__dl_symbol(void *library, const char *name, void *member, size_t size) {
    void *sym = dlsym(library, name);
    if (sym) memcpy(member, &sym, size);
    return sym;
}

#ifdef GPUARR_NO_RUNTIME_LINKING
#include <cuda.h>
static gpuarr_result gpuarr__cu_bind(gpuarr__cu_state *cu) {
    void (*fp)(void);
#define GPUARR__CU_BIND_STATIC(ret, name, params)                                              \
    fp = (void (*)(void))&name;                                                                \
    memcpy(&cu->p_##name, &fp, sizeof fp);
    GPUARR__CU_PROCS(GPUARR__CU_BIND_STATIC)
#undef GPUARR__CU_BIND_STATIC
    cu->library = dlopen(NULL, RTLD_NOW); /* the program, linked with -lcuda: for the optional entry points */
    return GPUARR_OK;
}
#else
static gpuarr_result gpuarr__cu_bind(gpuarr__cu_state *cu) {
    /* kept loaded: the driver registers exit handlers and must not be unloaded mid-process */
#ifdef RTLD_NODELETE
    const int flags = RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE;
#else
    const int flags = RTLD_NOW | RTLD_LOCAL;
#endif
    const char *path = gpuarr__setting(GPUARR__SET_CUDA_LIBRARY);
    cu->library = dlopen(path ? path : "libcuda.so.1", flags);
    if (!cu->library) /* the reason reaches gpuarr-info and device_find's errors */
        return gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "cannot load %s%s: %s", path ? path : "libcuda.so.1",
                            path ? " (GPUARR_CUDA_LIBRARY)" : "", dlerror());
#define GPUARR__CU_BIND_DYNAMIC(ret, name, params)                                             \
    if (!gpuarr__dl_symbol(cu->library, #name, &cu->p_##name, sizeof cu->p_##name))          \
        return gpuarr__fail(GPUARR_ERROR_BACKEND, "the CUDA driver lacks %s (too old)", #name);
    GPUARR__CU_PROCS(GPUARR__CU_BIND_DYNAMIC)
#undef GPUARR__CU_BIND_DYNAMIC
    return GPUARR_OK;
}
#endif

static const gpuarr__sim_kernel_hooks *gpuarr__cu_sim_hooks(void);

static void gpuarr__cu_unload(void) {
    gpuarr__cu_state *cu = (gpuarr__cu_state *)gpuarr__g.backend_state[GPUARR_BACKEND_CUDA];
    if (!cu) return;
    if (cu->sim_hooks_set) cu->sim_hooks_set(gpuarr__cu_sim_hooks(), 0);
    for (int i = 0; i < cu->device_count + cu->adopted_count; i++) {
        pthread_mutex_destroy(&cu->devices[i].kernel_lock);
        gpuarr__free(cu->devices[i].peer);
    }
    if (cu->nvml.status == 1) cu->nvml.p_nvmlShutdown();
    if (cu->nvml.library) dlclose(cu->nvml.library);
    pthread_mutex_destroy(&cu->nvml.lock);
    pthread_mutex_destroy(&cu->peer_lock);
    pthread_mutex_destroy(&cu->host_lock);
#ifndef GPUARR_NO_RUNTIME_LINKING
    if (cu->library) dlclose(cu->library);
#endif
    gpuarr__free(cu->devices);
    gpuarr__free(cu);
    gpuarr__g.backend_state[GPUARR_BACKEND_CUDA] = NULL;
}

static gpuarr_result gpuarr__cu_enumerate(gpuarr__cu_state *cu) {
    gpuarr__cu_result e = cu->p_cuInit(0);
    if (e == GPUARR__CUDA_ERROR_NO_DEVICE) return GPUARR_OK; /* a driver but no GPU */
    if (e != GPUARR__CUDA_SUCCESS)
        return gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "cuInit failed: %s (%u)", gpuarr__cu_error_name(cu, e), e);
    cu->p_cuDriverGetVersion(&cu->driver_version);
    int count = 0;
    if ((e = cu->p_cuDeviceGetCount(&count)) != GPUARR__CUDA_SUCCESS) return gpuarr__cu_fail(e, "cuDeviceGetCount", "listing CUDA devices");
    /* room for the adopted devices from the start: pointers to entries are kept */
    size_t rows = (size_t)count + GPUARR__ADOPT_MAX;
    cu->devices = (gpuarr__cu_device_state *)gpuarr__calloc(sizeof *cu->devices * rows);
    if (!cu->devices) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for the CUDA device list");
    for (int i = 0; i < count; i++) {
        gpuarr__cu_device_state *ds = &cu->devices[i];
        if ((e = cu->p_cuDeviceGet(&ds->dev, i)) != GPUARR__CUDA_SUCCESS) return gpuarr__cu_fail(e, "cuDeviceGet", "listing CUDA devices");
        ds->peer = (signed char *)gpuarr__calloc(rows);
        if (!ds->peer) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for the CUDA device list");
        pthread_mutex_init(&ds->kernel_lock, NULL);
        cu->device_count++;
    }
    return GPUARR_OK;
}

static gpuarr_result gpuarr__cu_load(void) {
    gpuarr__cu_state *cu = (gpuarr__cu_state *)gpuarr__calloc(sizeof *cu);
    if (!cu) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for the CUDA backend");
    pthread_mutex_init(&cu->peer_lock, NULL);
    pthread_mutex_init(&cu->host_lock, NULL);
    pthread_mutex_init(&cu->nvml.lock, NULL);
    gpuarr__g.backend_state[GPUARR_BACKEND_CUDA] = cu;
    gpuarr_result r = gpuarr__cu_bind(cu);
    if (r == GPUARR_OK) {
#define GPUARR__CU_BIND_OPTIONAL(ret, name, params) gpuarr__dl_symbol(cu->library, #name, &cu->p_##name, sizeof cu->p_##name);
        GPUARR__CU_OPTIONAL_PROCS(GPUARR__CU_BIND_OPTIONAL)
#undef GPUARR__CU_BIND_OPTIONAL
        gpuarr__dl_symbol(cu->library, "gpuarr_sim_kernel_hooks_set", &cu->sim_hooks_set, sizeof cu->sim_hooks_set);
        if (cu->sim_hooks_set) cu->sim_hooks_set(gpuarr__cu_sim_hooks(), 1);
        r = gpuarr__cu_enumerate(cu);
    }
    if (r != GPUARR_OK) gpuarr__cu_unload();
    return r;
}

static int gpuarr__cu_device_count(void) {
    gpuarr__cu_state *cu = (gpuarr__cu_state *)gpuarr__g.backend_state[GPUARR_BACKEND_CUDA];
    return cu ? cu->device_count : 0;
}

/* ---------------------------------------------------------------------------------------------
 * Device properties
 * ------------------------------------------------------------------------------------------- */
static int gpuarr__cu_attribute(gpuarr__cu_device dev, unsigned int what) {
    int v = 0;
    if (GPUARR__CU.p_cuDeviceGetAttribute(&v, what, dev) != GPUARR__CUDA_SUCCESS) v = 0;
    return v;
}

/* Free memory needs a context. Where the primary context is already active (gpuarr's or the
   user's runtime's) it is asked; otherwise none is created just for that, and free = total.
   Returns whether the driver was asked. */
static bool gpuarr__cu_free_memory(gpuarr__cu_device_state *ds, uint64_t *free_bytes, uint64_t total) {
    gpuarr__cu_state *cu = &GPUARR__CU;
    unsigned int flags = 0;
    int active = 0;
    bool asked = false;
    *free_bytes = total;
    if (cu->p_cuDevicePrimaryCtxGetState(ds->dev, &flags, &active) != GPUARR__CUDA_SUCCESS || !active) return false;
    gpuarr__cu_context ctx = NULL, prev = NULL;
    if (cu->p_cuDevicePrimaryCtxRetain(&ctx, ds->dev) != GPUARR__CUDA_SUCCESS) return false;
    size_t f = 0, t = 0;
    cu->p_cuCtxGetCurrent(&prev);
    if (cu->p_cuCtxSetCurrent(ctx) == GPUARR__CUDA_SUCCESS) {
        if (cu->p_cuMemGetInfo_v2(&f, &t) == GPUARR__CUDA_SUCCESS) *free_bytes = f, asked = true;
        cu->p_cuCtxSetCurrent(prev);
    }
    cu->p_cuDevicePrimaryCtxRelease_v2(ds->dev);
    return asked;
}

/* An adopted device's free memory, asked in the caller's context; total where it cannot be. */
static bool gpuarr__cu_adopted_free_memory(gpuarr__cu_device_state *ds, uint64_t *free_bytes, uint64_t total) {
    gpuarr__cu_state *cu = &GPUARR__CU;
    gpuarr__cu_context prev = NULL;
    size_t f = 0, t = 0;
    bool asked = false;
    *free_bytes = total;
    if (!ds->adopted || cu->p_cuCtxGetCurrent(&prev) != GPUARR__CUDA_SUCCESS) return false;
    if (cu->p_cuCtxSetCurrent(ds->adopted) == GPUARR__CUDA_SUCCESS) {
        if (cu->p_cuMemGetInfo_v2(&f, &t) == GPUARR__CUDA_SUCCESS) *free_bytes = f, asked = true;
        cu->p_cuCtxSetCurrent(prev);
    }
    return asked;
}

static gpuarr_result gpuarr__cu_device_info(int index, gpuarr_device_info *info) {
    gpuarr__cu_state *cu = &GPUARR__CU;
    gpuarr__cu_device_state *ds = &cu->devices[index];
    gpuarr__cu_result e = cu->p_cuDeviceGetName(info->name, (int)sizeof info->name - 1, ds->dev);
    if (e != GPUARR__CUDA_SUCCESS) return gpuarr__cu_fail(e, "cuDeviceGetName", "reading a CUDA device's properties");
    info->type = GPUARR_DEVICE_TYPE_GPU;
    gpuarr__copy_string(info->vendor, sizeof info->vendor, "NVIDIA Corporation");
    snprintf(info->version, sizeof info->version, "CUDA driver %d.%d", cu->driver_version / 1000, cu->driver_version % 1000 / 10);
    ds->cc_major = info->compute_capability_major = gpuarr__cu_attribute(ds->dev, GPUARR__CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    ds->cc_minor = info->compute_capability_minor = gpuarr__cu_attribute(ds->dev, GPUARR__CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    size_t total = 0;
    if ((e = cu->p_cuDeviceTotalMem_v2(&total, ds->dev)) != GPUARR__CUDA_SUCCESS)
        return gpuarr__cu_fail(e, "cuDeviceTotalMem", "reading a CUDA device's properties");
    info->total_memory = total;
    info->max_alloc_bytes = total;
    if (ds->is_adopted) gpuarr__cu_adopted_free_memory(ds, &info->free_memory, total);
    else gpuarr__cu_free_memory(ds, &info->free_memory, total);
    info->compute_units = gpuarr__cu_attribute(ds->dev, GPUARR__CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    info->clock_mhz = gpuarr__cu_attribute(ds->dev, GPUARR__CU_DEVICE_ATTRIBUTE_CLOCK_RATE) / 1000;
    info->copy_engines = gpuarr__cu_attribute(ds->dev, GPUARR__CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT);
    info->host_unified = gpuarr__cu_attribute(ds->dev, GPUARR__CU_DEVICE_ATTRIBUTE_INTEGRATED) != 0; /* Jetson, GH200 C2C is not */
    char bus[32] = "";
    unsigned int dom = 0, b = 0, dv = 0, fn = 0;
    if (cu->p_cuDeviceGetPCIBusId(bus, (int)sizeof bus, ds->dev) == GPUARR__CUDA_SUCCESS && sscanf(bus, "%x:%x:%x.%x", &dom, &b, &dv, &fn) == 4) {
        info->has_pci = true;
        info->pci_domain = (int)dom, info->pci_bus = (int)b, info->pci_device = (int)dv, info->pci_function = (int)fn;
        snprintf(info->pci_bus_id, sizeof info->pci_bus_id, "%04x:%02x:%02x.%x", dom & 0xffffu, b & 0xffu, dv & 0xffu, fn & 7u);
    }
    /* v2 gives MIG instances their own UUID; both give the GPU's UUID otherwise */
    gpuarr__cu_result (*get_uuid)(struct CUuuid_st *, gpuarr__cu_device) =
        cu->p_cuDeviceGetUuid_v2 ? cu->p_cuDeviceGetUuid_v2 : cu->p_cuDeviceGetUuid;
    if (get_uuid && get_uuid((struct CUuuid_st *)(void *)info->uuid, ds->dev) == GPUARR__CUDA_SUCCESS) info->has_uuid = true;
    return GPUARR_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Contexts
 * ------------------------------------------------------------------------------------------- */
static gpuarr_result gpuarr__cu_device_open(gpuarr__dev *d) {
    gpuarr__cu_device_state *ds = GPUARR__CU_DEV(d);
    if (ds->is_adopted) { /* the caller's context, kept alive by the caller */
        if (!ds->adopted) return gpuarr__fail(GPUARR_ERROR_INVALID_HANDLE, "%s was removed (gpuarr_device_remove)", d->info.spec);
        ds->ctx = ds->adopted;
        d->native = ds;
        return GPUARR_OK;
    }
    gpuarr__cu_result e = GPUARR__CU.p_cuDevicePrimaryCtxRetain(&ds->ctx, ds->dev);
    if (e != GPUARR__CUDA_SUCCESS) return gpuarr__cu_fail(e, "cuDevicePrimaryCtxRetain", d->info.spec);
    d->native = ds;
    return GPUARR_OK;
}

static void gpuarr__cu_user_kernels_free(gpuarr__dev *d);

static void gpuarr__cu_device_close(gpuarr__dev *d) {
    gpuarr__cu_state *cu = &GPUARR__CU;
    gpuarr__cu_device_state *ds = GPUARR__CU_DEV(d);
    gpuarr__cu_scope sc;
    if (gpuarr__cu_enter_to_release(d, &sc) == GPUARR__CUDA_SUCCESS) {
        for (int s = 0; s < GPUARR_DTYPE_COUNT; s++)
            for (int t = 0; t < GPUARR_DTYPE_COUNT; t++)
                if (ds->modules[s][t]) cu->p_cuModuleUnload(ds->modules[s][t]);
    }
    gpuarr__cu_leave(&sc);
    memset(ds->modules, 0, sizeof ds->modules);
    memset(ds->casts, 0, sizeof ds->casts);
    gpuarr__cu_user_kernels_free(d);
    /* Host functions still listed when the context has failed will never run (the driver drops
       them): free what they hold. A healthy context still runs its own. */
    gpuarr__cu_host_call *left = NULL;
    size_t free_bytes = 0, total_bytes = 0;
    gpuarr__cu_result health = gpuarr__cu_enter(d, &sc);
    if (health == GPUARR__CUDA_SUCCESS) health = cu->p_cuMemGetInfo_v2(&free_bytes, &total_bytes);
    gpuarr__cu_leave(&sc);
    if (gpuarr__cu_sticky(health) || health == GPUARR__CU_LOST) {
        pthread_mutex_lock(&cu->host_lock);
        left = ds->host_calls;
        ds->host_calls = NULL;
        pthread_mutex_unlock(&cu->host_lock);
    }
    while (left) {
        gpuarr__cu_host_call *next = left->next;
        gpuarr__host_fn_discard(left->fn, left->ctx);
        gpuarr__free(left);
        left = next;
    }
    ds->build_result = GPUARR_OK;
    if (!ds->is_adopted) cu->p_cuDevicePrimaryCtxRelease_v2(ds->dev); /* the runtime's own references keep it alive */
    ds->ctx = NULL;
}

static gpuarr_result gpuarr__cu_adopted_reset(gpuarr__dev *d);

/* After device_close: the primary context goes, with everything in it (the CUDA runtime's use of
   it too); device_open makes a fresh one. Peer access was enabled to the old one: asked anew. */
static gpuarr_result gpuarr__cu_device_reset(gpuarr__dev *d) {
    gpuarr__cu_state *cu = &GPUARR__CU;
    gpuarr__cu_device_state *ds = GPUARR__CU_DEV(d);
    pthread_mutex_lock(&cu->peer_lock);
    int rows = cu->device_count + __atomic_load_n(&cu->adopted_count, __ATOMIC_ACQUIRE); /* one may be adopted meanwhile */
    for (int i = 0; i < rows; i++) ds->peer[i] = cu->devices[i].peer[d->info.index] = 0;
    pthread_mutex_unlock(&cu->peer_lock);
    if (ds->is_adopted) return gpuarr__cu_adopted_reset(d);
    gpuarr__cu_result e = cu->p_cuDevicePrimaryCtxReset_v2(ds->dev);
    if (e != GPUARR__CUDA_SUCCESS) return gpuarr__cu_fail(e, "cuDevicePrimaryCtxReset", d->info.spec);
    return GPUARR_OK;
}

/* An adopted device's reset destroys nothing of the caller's: gpuarr's own objects in the context
   went at device_close. A context a sticky error corrupted stays so (only cuCtxDestroy, the
   caller's, ends it): refused, saying to adopt a new one. */
static gpuarr_result gpuarr__cu_adopted_reset(gpuarr__dev *d) {
    gpuarr__cu_state *cu = &GPUARR__CU;
    gpuarr__cu_device_state *ds = GPUARR__CU_DEV(d);
    if (!ds->adopted) return gpuarr__fail(GPUARR_ERROR_INVALID_HANDLE, "%s was removed (gpuarr_device_remove)", d->info.spec);
    gpuarr__cu_context prev = NULL;
    size_t f = 0, t = 0;
    gpuarr__cu_result e = cu->p_cuCtxGetCurrent(&prev);
    if (e == GPUARR__CUDA_SUCCESS && (e = cu->p_cuCtxSetCurrent(ds->adopted)) == GPUARR__CUDA_SUCCESS) {
        e = cu->p_cuMemGetInfo_v2(&f, &t);
        cu->p_cuCtxSetCurrent(prev);
    }
    if (e == GPUARR__CUDA_SUCCESS) return GPUARR_OK;
    return gpuarr__fail(GPUARR_ERROR_DEVICE_LOST, "%s is the caller's CUDA context %p, which answers %s (%u): gpuarr cannot reset a context "
                        "it did not make; gpuarr_device_remove it, cuCtxDestroy the context and adopt a new one (gpuarr_cuda_adopt)",
                        d->info.spec, (void *)ds->adopted, gpuarr__cu_error_name(cu, e), e);
}

static gpuarr_result gpuarr__cu_activate(gpuarr__dev *d, void **previous) {
    GPUARR__CHECK(gpuarr__dev_alive(d));
    gpuarr__cu_context cur = NULL;
    gpuarr__cu_result e = GPUARR__CU.p_cuCtxGetCurrent(&cur);
    if (e == GPUARR__CUDA_SUCCESS) e = GPUARR__CU.p_cuCtxSetCurrent(GPUARR__CU_DEV(d)->ctx);
    if (e != GPUARR__CUDA_SUCCESS) return gpuarr__cu_fail(e, "cuCtxSetCurrent", d->info.spec);
    *previous = cur;
    return GPUARR_OK;
}

static void gpuarr__cu_deactivate(gpuarr__dev *d, void *previous) {
    GPUARR__UNUSED(d);
    GPUARR__CU.p_cuCtxSetCurrent((gpuarr__cu_context)previous);
}

/* ---------------------------------------------------------------------------------------------
 * Memory. A block's handle is its device address (CUdeviceptr in a void *).
 * ------------------------------------------------------------------------------------------- */
static gpuarr_result gpuarr__cu_mem_info(gpuarr__dev *d, uint64_t *free_bytes, uint64_t *total_bytes) {
    *total_bytes = d->info.total_memory;
    if (!d->opened) {
        gpuarr__cu_free_memory(GPUARR__CU_DEV(d), free_bytes, d->info.total_memory);
        return GPUARR_OK;
    }
    size_t f = 0, t = 0;
    GPUARR__CU_DO(d, "cuMemGetInfo", cuMemGetInfo_v2(&f, &t));
    *free_bytes = f;
    return GPUARR_OK;
}

/* Free memory as cuMemGetInfo gives it, for telemetry: false where it cannot be asked. */
static bool gpuarr__cu_read_free_memory(gpuarr__dev *d, uint64_t *free_bytes) {
    if (!__atomic_load_n(&d->opened, __ATOMIC_ACQUIRE)) return gpuarr__cu_free_memory(GPUARR__CU_DEV(d), free_bytes, d->info.total_memory);
    size_t f = 0, t = 0;
    gpuarr__cu_scope sc;
    gpuarr__cu_result e = gpuarr__cu_enter(d, &sc);
    if (e == GPUARR__CUDA_SUCCESS) e = GPUARR__CU.p_cuMemGetInfo_v2(&f, &t);
    gpuarr__cu_leave(&sc);
    if (e != GPUARR__CUDA_SUCCESS) return false;
    *free_bytes = f;
    return true;
}

static gpuarr_result gpuarr__cu_mem_alloc(gpuarr__dev *d, size_t bytes, void **mem) {
    gpuarr__cu_ptr p = 0;
    GPUARR__CU_DO(d, "cuMemAlloc", cuMemAlloc_v2(&p, bytes));
    *mem = (void *)(uintptr_t)p;
    return GPUARR_OK;
}

static void gpuarr__cu_mem_free(gpuarr__dev *d, void *mem) {
    gpuarr__cu_scope sc;
    if (gpuarr__cu_enter_to_release(d, &sc) == GPUARR__CUDA_SUCCESS) GPUARR__CU.p_cuMemFree_v2(GPUARR__CU_PTR(mem, 0));
    gpuarr__cu_leave(&sc);
}

static size_t gpuarr__cu_mem_alignment(gpuarr__dev *d) {
    GPUARR__UNUSED(d);
    return 256; /* cuMemAlloc's; the pool rounds to 512 anyway */
}

/* A block is an address inside its segment. */
static gpuarr_result gpuarr__cu_mem_view(gpuarr__dev *d, void *segment, size_t offset, size_t bytes, void **mem, size_t *mem_offset) {
    GPUARR__UNUSED(d);
    GPUARR__UNUSED(bytes);
    *mem = (void *)(uintptr_t)GPUARR__CU_PTR(segment, offset);
    *mem_offset = 0;
    return GPUARR_OK;
}

/* Pinned (page-locked) host memory, usable by every context (portable). */
static gpuarr_result gpuarr__cu_pinned_alloc(gpuarr__dev *d, size_t bytes, void **handle, void **host_ptr) {
    void *p = NULL;
    GPUARR__CU_DO(d, "cuMemHostAlloc", cuMemHostAlloc(&p, bytes, GPUARR__CU_MEMHOSTALLOC_PORTABLE));
    *handle = p;
    *host_ptr = p;
    return GPUARR_OK;
}

static void gpuarr__cu_pinned_free(gpuarr__dev *d, void *handle) {
    gpuarr__cu_scope sc;
    if (gpuarr__cu_enter_to_release(d, &sc) == GPUARR__CUDA_SUCCESS) GPUARR__CU.p_cuMemFreeHost(handle);
    gpuarr__cu_leave(&sc);
}

/* What the driver knows of a pointer: its memory type (0 = memory the driver does not know) and
   context. cuPointerGetAttributes, unlike cuPointerGetAttribute, answers unknown memory with
   CUDA_SUCCESS and zeros: probing pageable memory is no API error (compute-sanitizer reports
   every failed call). */
static gpuarr__cu_result gpuarr__cu_pointer_kind(gpuarr__dev *d, const void *p, unsigned int *type, gpuarr__cu_context *ctx) {
    unsigned int attrs[2] = {GPUARR__CU_POINTER_ATTRIBUTE_MEMORY_TYPE, GPUARR__CU_POINTER_ATTRIBUTE_CONTEXT};
    gpuarr__cu_context c = NULL;
    void *data[2] = {type, &c};
    *type = 0;
    gpuarr__cu_scope sc;
    gpuarr__cu_result e = gpuarr__cu_enter(d, &sc);
    if (e == GPUARR__CUDA_SUCCESS) e = GPUARR__CU.p_cuPointerGetAttributes(2, attrs, data, (gpuarr__cu_ptr)(uintptr_t)p);
    gpuarr__cu_leave(&sc);
    if (ctx) *ctx = c;
    return e;
}

/* Page-locked by anyone (cudaHostAlloc, cudaHostRegister, gpuarr's own pinned pool). */
static bool gpuarr__cu_host_ptr_pinned(gpuarr__dev *d, const void *p) {
    unsigned int type = 0;
    return gpuarr__cu_pointer_kind(d, p, &type, NULL) == GPUARR__CUDA_SUCCESS && type == GPUARR__CU_MEMORYTYPE_HOST;
}

/* ---------------------------------------------------------------------------------------------
 * Copies, all on the stream. From pinned memory they are DMA transfers that return at once;
 * from pageable memory the driver copies through its own staging (gpuarr stages large ones
 * itself, see the core).
 * ------------------------------------------------------------------------------------------- */
static gpuarr_result gpuarr__cu_copy_h2d(gpuarr__stream *s, void *dst, size_t dst_off, const void *src, size_t bytes, bool async) {
    GPUARR__UNUSED(async); /* the driver never waits for queued work at these calls */
    GPUARR__CU_DO(s->dev, "cuMemcpyHtoDAsync", cuMemcpyHtoDAsync_v2(GPUARR__CU_PTR(dst, dst_off), src, bytes, GPUARR__CU_STREAM(s->native)));
    return GPUARR_OK;
}

static gpuarr_result gpuarr__cu_copy_d2h(gpuarr__stream *s, void *dst, const void *src, size_t src_off, size_t bytes, bool async) {
    GPUARR__UNUSED(async); /* the driver never waits for queued work at these calls */
    GPUARR__CU_DO(s->dev, "cuMemcpyDtoHAsync", cuMemcpyDtoHAsync_v2(dst, GPUARR__CU_PTR(src, src_off), bytes, GPUARR__CU_STREAM(s->native)));
    return GPUARR_OK;
}

static gpuarr_result gpuarr__cu_copy_d2d(gpuarr__stream *s, void *dst, size_t dst_off, const void *src, size_t src_off, size_t bytes) {
    GPUARR__CU_DO(s->dev, "cuMemcpyDtoDAsync",
                  cuMemcpyDtoDAsync_v2(GPUARR__CU_PTR(dst, dst_off), GPUARR__CU_PTR(src, src_off), bytes, GPUARR__CU_STREAM(s->native)));
    return GPUARR_OK;
}

/* Peer copies where the two GPUs can reach each other (NVLink, or PCIe P2P): access is enabled
   once, both ways. Elsewhere the core goes through pinned host memory. */
static bool gpuarr__cu_can_copy_peer(gpuarr__dev *dst, gpuarr__dev *src) {
    gpuarr__cu_state *cu = &GPUARR__CU;
    gpuarr__cu_device_state *a = GPUARR__CU_DEV(dst), *b = GPUARR__CU_DEV(src);
    if (!dst->opened || !src->opened || gpuarr__dev_failed(dst) || gpuarr__dev_failed(src)) return false;
    if (a->dev == b->dev) return true; /* two contexts of one GPU: cuMemcpyPeer copies between them on the GPU */
    pthread_mutex_lock(&cu->peer_lock);
    signed char known = a->peer[src->info.index];
    if (!known) {
        int ab = 0, ba = 0;
        known = -1;
        if (cu->p_cuDeviceCanAccessPeer(&ab, a->dev, b->dev) == GPUARR__CUDA_SUCCESS && ab &&
            cu->p_cuDeviceCanAccessPeer(&ba, b->dev, a->dev) == GPUARR__CUDA_SUCCESS && ba) {
            gpuarr__cu_scope sc;
            gpuarr__cu_result e1 = gpuarr__cu_enter(dst, &sc), e2 = GPUARR__CUDA_SUCCESS;
            if (e1 == GPUARR__CUDA_SUCCESS) e1 = cu->p_cuCtxEnablePeerAccess(b->ctx, 0);
            gpuarr__cu_leave(&sc);
            if ((e2 = gpuarr__cu_enter(src, &sc)) == GPUARR__CUDA_SUCCESS) e2 = cu->p_cuCtxEnablePeerAccess(a->ctx, 0);
            gpuarr__cu_leave(&sc);
            bool ok1 = e1 == GPUARR__CUDA_SUCCESS || e1 == GPUARR__CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
            bool ok2 = e2 == GPUARR__CUDA_SUCCESS || e2 == GPUARR__CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
            known = ok1 && ok2 ? 1 : -1;
            if (!ok1 || !ok2) gpuarr__log(GPUARR_LOG_INFO, "%s <-> %s: enabling peer access failed (%u, %u); copies go through the host",
                                          dst->info.spec, src->info.spec, e1, e2);
        }
        a->peer[src->info.index] = b->peer[dst->info.index] = known;
    }
    pthread_mutex_unlock(&cu->peer_lock);
    return known > 0;
}

static gpuarr_result gpuarr__cu_copy_peer(gpuarr__stream *s, gpuarr__dev *dst_dev, void *dst, size_t dst_off, gpuarr__dev *src_dev,
                                          const void *src, size_t src_off, size_t bytes) {
    GPUARR__CU_DO(s->dev, "cuMemcpyPeerAsync",
                  cuMemcpyPeerAsync(GPUARR__CU_PTR(dst, dst_off), GPUARR__CU_DEV(dst_dev)->ctx, GPUARR__CU_PTR(src, src_off),
                                    GPUARR__CU_DEV(src_dev)->ctx, bytes, GPUARR__CU_STREAM(s->native)));
    return GPUARR_OK;
}

/* The driver has no 64-bit memset: an 8-byte pattern is two strided 32-bit ones, the low word
   at each element's first 4 bytes and the high word at the next 4 (little-endian). */
static gpuarr_result gpuarr__cu_fill(gpuarr__stream *s, void *dst, size_t dst_off, const void *pattern, size_t pattern_size,
                                     size_t bytes, bool async) {
    GPUARR__UNUSED(async); /* the driver never waits for queued work at these calls */
    GPUARR__TRACE_SCOPE(gpuarr__trace_fill, s, bytes, pattern_size);
    gpuarr__cu_ptr p = GPUARR__CU_PTR(dst, dst_off);
    gpuarr__cu_stream cs = GPUARR__CU_STREAM(s->native);
    unsigned short u16;
    unsigned int u32[2];
    if (bytes == 0) return GPUARR_OK;
    switch (pattern_size) {
    case 1: GPUARR__CU_DO(s->dev, "cuMemsetD8Async", cuMemsetD8Async(p, *(const unsigned char *)pattern, bytes, cs)); break;
    case 2:
        memcpy(&u16, pattern, 2);
        GPUARR__CU_DO(s->dev, "cuMemsetD16Async", cuMemsetD16Async(p, u16, bytes / 2, cs));
        break;
    case 4:
        memcpy(u32, pattern, 4);
        GPUARR__CU_DO(s->dev, "cuMemsetD32Async", cuMemsetD32Async(p, u32[0], bytes / 4, cs));
        break;
    default:
        memcpy(u32, pattern, 8);
        GPUARR__CU_DO(s->dev, "cuMemsetD2D32Async", cuMemsetD2D32Async(p, 8, u32[0], 1, bytes / 8, cs));
        GPUARR__CU_DO(s->dev, "cuMemsetD2D32Async", cuMemsetD2D32Async(p + 4, 8, u32[1], 1, bytes / 8, cs));
        break;
    }
    return GPUARR_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Kernel source: the CUDA dialect, the shared rules as an in-memory header, one instantiation.
 * ------------------------------------------------------------------------------------------- */
#define GPUARR__CU_PIECES(a) (sizeof(a) / sizeof((a)[0]))
#define GPUARR__CU_NVRTC_OPTIONS "-std=c++17", "--fmad=false"

/* Joins string pieces into one allocation (NUL-terminated). */
static char *gpuarr__join_pieces(const char *const *pieces, size_t count) {
    size_t n = 1;
    for (size_t i = 0; i < count; i++) n += strlen(pieces[i]);
    char *out = (char *)gpuarr__malloc(n), *p = out;
    if (!out) return NULL;
    for (size_t i = 0; i < count; i++) {
        size_t len = strlen(pieces[i]);
        memcpy(p, pieces[i], len);
        p += len;
    }
    *p = '\0';
    return out;
}

/* What the committed PTX was made from: the two sources, every instantiation and the options.
   A mismatch means someone changed the kernels without `make cuda-kernels`. */
static uint64_t gpuarr__cu_source_hash(void) {
    uint64_t h = gpuarr__hash_pieces(GPUARR__HASH_SEED, gpuarr__kernels_source, GPUARR__CU_PIECES(gpuarr__kernels_source));
    h = gpuarr__hash_pieces(h, gpuarr__kernels_cuda_source, GPUARR__CU_PIECES(gpuarr__kernels_cuda_source));
    const char *options[] = {GPUARR__CU_NVRTC_OPTIONS};
    h = gpuarr__hash_pieces(h, options, GPUARR__CU_PIECES(options));
    for (int s = 1; s < GPUARR_DTYPE_COUNT; s++)
        for (int t = 1; t < GPUARR_DTYPE_COUNT; t++) {
            char line[256];
            const char *piece = line;
            gpuarr__kernel_instantiation(s, t, line, sizeof line);
            h = gpuarr__hash_pieces(h, &piece, 1);
        }
    return h;
}

/* ---------------------------------------------------------------------------------------------
 * NVRTC
 * ------------------------------------------------------------------------------------------- */
/* GPUARR_NVRTC_LIBRARY, else the names CUDA 11.2 to 13 install, then CUDA_HOME's. */
static bool gpuarr__nvrtc_load(void) {
    gpuarr__nvrtc_state *nv = &gpuarr__nvrtc;
    pthread_mutex_lock(&nv->lock);
    if (!nv->tried) {
        nv->tried = true;
        char home[600] = "";
        const char *cuda_home = gpuarr__env("CUDA_HOME", GPUARR__ENV_IGNORED);
        snprintf(home, sizeof home, "%s/lib64/libnvrtc.so", cuda_home && *cuda_home ? cuda_home : "/usr/local/cuda");
        const char *env = gpuarr__setting(GPUARR__SET_NVRTC_LIBRARY);
        const char *names[] = {env && *env ? env : "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so", home};
        for (size_t i = 0; i < (env && *env ? 1u : GPUARR__CU_PIECES(names)) && !nv->library; i++)
            nv->library = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        bool ok = nv->library != NULL;
        if (!ok) snprintf(nv->error, sizeof nv->error, "NVRTC not found (%s; set GPUARR_NVRTC_LIBRARY)", env && *env ? env : "libnvrtc.so.*");
#define GPUARR__NVRTC_BIND(ret, name, params)                                                  \
    if (ok && !gpuarr__dl_symbol(nv->library, #name, &nv->p_##name, sizeof nv->p_##name)) {  \
        ok = false;                                                                            \
        snprintf(nv->error, sizeof nv->error, "the NVRTC found lacks %s (CUDA 11.1 or later is needed)", #name); \
    }
        GPUARR__NVRTC_PROCS(GPUARR__NVRTC_BIND)
#undef GPUARR__NVRTC_BIND
        if (ok) nv->p_nvrtcVersion(&nv->major, &nv->minor);
        nv->loaded = ok;
    }
    bool loaded = nv->loaded;
    pthread_mutex_unlock(&nv->lock);
    return loaded;
}

/* What one NVRTC compile gives: the image, NVRTC's log and its error (all empty on success). */
typedef struct gpuarr__nvrtc_output {
    unsigned char *image; /* gpuarr__malloc'ed: a cubin for "sm_XY", PTX for "compute_XY" */
    size_t size;
    char *log;         /* NVRTC's program log, gpuarr__malloc'ed; NULL when it gave none */
    const char *error; /* why it failed: NVRTC's error string, or why NVRTC is not loaded */
} gpuarr__nvrtc_output;

/* Compiles program (with the conversion rules as the in-memory header "gpuarr_kernels.h") for
   arch with options[0..n): OK; UNSUPPORTED without NVRTC; BUILD when the program does not compile
   (out->log says why); OUT_OF_MEMORY; BACKEND for any other NVRTC failure. The cast kernels and
   the portable kernels both come through here. */
static gpuarr_result gpuarr__nvrtc_run(const char *program, const char *file, const char *arch, const char *const *options, int n,
                                       gpuarr__nvrtc_output *out) {
    gpuarr__nvrtc_state *nv = &gpuarr__nvrtc;
    memset(out, 0, sizeof *out);
    if (!gpuarr__nvrtc_load()) {
        out->error = nv->error;
        return GPUARR_ERROR_UNSUPPORTED;
    }
    char arch_option[48];
    const char *all[8]; /* the architecture and options[0..n) */
    if (n < 0 || n >= (int)GPUARR__CU_PIECES(all)) {
        out->error = "too many NVRTC options";
        return GPUARR_ERROR_BACKEND;
    }
    char *rules = gpuarr__join_pieces(gpuarr__kernels_source, GPUARR__CU_PIECES(gpuarr__kernels_source));
    if (!rules) {
        out->error = "no host memory for the kernel source";
        return GPUARR_ERROR_OUT_OF_MEMORY;
    }
    snprintf(arch_option, sizeof arch_option, "--gpu-architecture=%s", arch);
    all[0] = arch_option;
    memcpy(all + 1, options, sizeof *options * (size_t)n);
    const char *headers[1] = {rules}, *names[1] = {"gpuarr_kernels.h"};
    gpuarr__nvrtc_program prog = NULL;
    gpuarr__nvrtc_result e = nv->p_nvrtcCreateProgram(&prog, program, file, 1, headers, names), compiled = 1;
    if (e == 0) e = compiled = nv->p_nvrtcCompileProgram(prog, n + 1, all);
    bool cubin = strncmp(arch, "sm_", 3) == 0;
    if (e == 0) e = cubin ? nv->p_nvrtcGetCUBINSize(prog, &out->size) : nv->p_nvrtcGetPTXSize(prog, &out->size);
    if (e == 0 && !(out->image = (unsigned char *)gpuarr__malloc(out->size))) e = 1; /* NVRTC_ERROR_OUT_OF_MEMORY */
    if (e == 0) e = cubin ? nv->p_nvrtcGetCUBIN(prog, (char *)out->image) : nv->p_nvrtcGetPTX(prog, (char *)out->image);
    size_t log_size = 0;
    if (e != 0 && prog && nv->p_nvrtcGetProgramLogSize(prog, &log_size) == 0 && log_size > 1 && (out->log = (char *)gpuarr__malloc(log_size)) &&
        nv->p_nvrtcGetProgramLog(prog, out->log) != 0)
        out->log[0] = '\0';
    if (prog) nv->p_nvrtcDestroyProgram(&prog);
    gpuarr__free(rules);
    if (e == 0) return GPUARR_OK;
    out->error = nv->p_nvrtcGetErrorString(e);
    gpuarr__free(out->image);
    out->image = NULL;
    return e == 1 ? GPUARR_ERROR_OUT_OF_MEMORY : compiled == 6 /* NVRTC_ERROR_COMPILATION */ ? GPUARR_ERROR_BUILD : GPUARR_ERROR_BACKEND;
}

/* Compiles the cast kernel of one pair for `arch` ("sm_90": a cubin; "compute_75": PTX). The
   image is gpuarr__malloc'ed; on failure `log` holds the reason. */
static gpuarr_result gpuarr__nvrtc_compile(int s, int t, const char *arch, unsigned char **image, size_t *size, char *log, size_t log_cap) {
    *image = NULL;
    *size = 0;
    char line[256];
    gpuarr__kernel_instantiation(s, t, line, sizeof line);
    const char *program_pieces[GPUARR__CU_PIECES(gpuarr__kernels_cuda_source) + 1];
    memcpy(program_pieces, gpuarr__kernels_cuda_source, sizeof gpuarr__kernels_cuda_source);
    program_pieces[GPUARR__CU_PIECES(gpuarr__kernels_cuda_source)] = line;
    char *program = gpuarr__join_pieces(program_pieces, GPUARR__CU_PIECES(program_pieces));
    if (!program) {
        gpuarr__copy_string(log, log_cap, "no host memory for the kernel source");
        return GPUARR_ERROR_OUT_OF_MEMORY;
    }
    const char *options[] = {GPUARR__CU_NVRTC_OPTIONS};
    gpuarr__nvrtc_output out;
    gpuarr_result r = gpuarr__nvrtc_run(program, "gpuarr_cast.cu", arch, options, (int)GPUARR__CU_PIECES(options), &out);
    gpuarr__free(program);
    if (r == GPUARR_ERROR_UNSUPPORTED || r == GPUARR_ERROR_OUT_OF_MEMORY) gpuarr__copy_string(log, log_cap, out.error);
    else if (r != GPUARR_OK)
        snprintf(log, log_cap, "NVRTC %d.%d, %s: %s%s%s", gpuarr__nvrtc.major, gpuarr__nvrtc.minor, arch, out.error, out.log ? ": " : "",
                 out.log ? out.log : "");
    gpuarr__free(out.log);
    *image = out.image;
    *size = out.size;
    return r == GPUARR_ERROR_BUILD ? GPUARR_ERROR_BACKEND : r;
}

/* ---------------------------------------------------------------------------------------------
 * Kernels, one module per dtype pair at its first use. GPUARR_CUDA_KERNELS = auto (default:
 * the committed PTX, then NVRTC), ptx or nvrtc (only that).
 * ------------------------------------------------------------------------------------------- */
/* The committed PTX of one pair, joined (gpuarr__malloc'ed), or NULL when stale or absent. */
/* The committed PTX of a pair, NULL when it is stale or has none; OUT_OF_MEMORY when it cannot be
   put together. */
static gpuarr_result gpuarr__cu_committed_ptx(int s, int t, char **out) {
    *out = NULL;
    static int current = -1; /* the source hash matches: computed once */
    int known = __atomic_load_n(&current, __ATOMIC_ACQUIRE);
    if (known < 0) {
        known = gpuarr__cu_source_hash() == GPUARR__CUDA_PTX_SOURCE_HASH;
        if (!known) gpuarr__log(GPUARR_LOG_WARN, "generated/gpuarr_cuda_ptx.h is stale (run `make cuda-kernels`): compiling with NVRTC");
        __atomic_store_n(&current, known, __ATOMIC_RELEASE);
    }
    if (!known || !gpuarr__cuda_ptx_index[s][t][1]) return GPUARR_OK;
    *out = gpuarr__join_pieces(gpuarr__cuda_ptx_lines + gpuarr__cuda_ptx_index[s][t][0], gpuarr__cuda_ptx_index[s][t][1]);
    if (!*out) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for the PTX of the %s->%s cast kernel", gpuarr__dtype_names[s],
                                   gpuarr__dtype_names[t]);
    return GPUARR_OK;
}

static gpuarr__cu_result gpuarr__cu_load_module(gpuarr__cu_module *mod, const void *image, char *log, size_t log_cap) {
    unsigned int options[2] = {GPUARR__CU_JIT_ERROR_LOG_BUFFER, GPUARR__CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *values[2] = {log, (void *)(uintptr_t)log_cap};
    log[0] = '\0';
    return GPUARR__CU.p_cuModuleLoadDataEx(mod, image, 2, options, values);
}

/* NVRTC for this device's architecture, through the disk cache. */
static gpuarr_result gpuarr__cu_nvrtc_module(gpuarr__dev *d, int s, int t, gpuarr__cu_module *mod, char *why, size_t why_cap) {
    gpuarr__cu_device_state *ds = GPUARR__CU_DEV(d);
    char arch[16], file[64], line[256];
    snprintf(arch, sizeof arch, "sm_%d%d", ds->cc_major, ds->cc_minor);
    if (!gpuarr__nvrtc_load()) {
        gpuarr__copy_string(why, why_cap, gpuarr__nvrtc.error);
        return GPUARR_ERROR_UNSUPPORTED;
    }
    gpuarr__kernel_instantiation(s, t, line, sizeof line);
    char version[32];
    snprintf(version, sizeof version, "nvrtc %d.%d", gpuarr__nvrtc.major, gpuarr__nvrtc.minor);
    const char *key_parts[3] = {arch, version, line};
    uint64_t key = gpuarr__hash_pieces(gpuarr__cu_source_hash(), key_parts, 3);
    snprintf(file, sizeof file, "cuda-%016llx.cubin", (unsigned long long)key);
    size_t size = 0;
    char log[1024] = "";
    gpuarr__cu_scope sc;
    gpuarr__cu_result e;
    unsigned char *image = gpuarr__cache_load(file, key, GPUARR__CACHE_KERNEL_MAX, &size);
    if (image) { /* one the driver refuses is compiled again and replaced */
        if ((e = gpuarr__cu_enter(d, &sc)) == GPUARR__CUDA_SUCCESS) e = gpuarr__cu_load_module(mod, image, log, sizeof log);
        gpuarr__cu_leave(&sc);
        gpuarr__free(image);
        if (e == GPUARR__CUDA_SUCCESS) return GPUARR_OK;
        gpuarr__log(GPUARR_LOG_INFO, "%s: the cached cubin %s/%s was not taken (%s failed: %s (%u): %.200s): compiled again", d->info.spec,
                    gpuarr__g.config.cache_dir, file, GPUARR__CU_CALLED(sc, "cuModuleLoadDataEx"), gpuarr__cu_error_name(&GPUARR__CU, e), e, log);
    }
    gpuarr_result r = gpuarr__nvrtc_compile(s, t, arch, &image, &size, why, why_cap);
    if (r != GPUARR_OK) return r;
    if ((e = gpuarr__cu_enter(d, &sc)) == GPUARR__CUDA_SUCCESS) e = gpuarr__cu_load_module(mod, image, log, sizeof log);
    gpuarr__cu_leave(&sc);
    if (e == GPUARR__CUDA_SUCCESS) gpuarr__cache_store(file, key, image, size);
    gpuarr__free(image);
    if (e != GPUARR__CUDA_SUCCESS) {
        snprintf(why, why_cap, "the NVRTC cubin for %s did not load: %s failed: %s (%u): %.400s", arch, GPUARR__CU_CALLED(sc, "cuModuleLoadDataEx"),
                 gpuarr__cu_error_name(&GPUARR__CU, e), e, log);
        return GPUARR_ERROR_BACKEND;
    }
    return GPUARR_OK;
}

static gpuarr_result gpuarr__cu_build_pair(gpuarr__dev *d, int s, int t) {
    GPUARR__TRACE_SCOPE(gpuarr__trace_kernel, d, s, t);
    gpuarr__cu_device_state *ds = GPUARR__CU_DEV(d);
    int mode = gpuarr__setting_value(GPUARR__SET_CUDA_KERNELS, GPUARR__KERNELS_AUTO);
    bool try_ptx = mode != GPUARR__KERNELS_NVRTC, try_nvrtc = mode != GPUARR__KERNELS_PTX;
    char ptx_why[600] = "not tried (GPUARR_CUDA_KERNELS=nvrtc)", nvrtc_why[600] = "not tried (GPUARR_CUDA_KERNELS=ptx)";
    gpuarr__cu_module mod = NULL;
    gpuarr_result r = GPUARR_ERROR_BACKEND;
    if (try_ptx) {
        char *ptx, log[1024];
        GPUARR__CHECK(gpuarr__cu_committed_ptx(s, t, &ptx));
        if (!ptx) {
            gpuarr__copy_string(ptx_why, sizeof ptx_why, "the committed PTX is stale or missing");
        } else {
            gpuarr__cu_scope sc;
            gpuarr__cu_result e = gpuarr__cu_enter(d, &sc);
            if (e == GPUARR__CUDA_SUCCESS) e = gpuarr__cu_load_module(&mod, ptx, log, sizeof log);
            gpuarr__cu_leave(&sc);
            if (e == GPUARR__CUDA_SUCCESS) r = GPUARR_OK;
            else snprintf(ptx_why, sizeof ptx_why, "the driver did not take the PTX (ISA %s, sm_%d): %s failed: %s (%u): %.400s",
                          GPUARR__CUDA_PTX_ISA, GPUARR__CUDA_PTX_ARCH, GPUARR__CU_CALLED(sc, "cuModuleLoadDataEx"), gpuarr__cu_error_name(&GPUARR__CU, e),
                          e, log);
            if (e == GPUARR__CUDA_ERROR_OUT_OF_MEMORY) r = GPUARR_ERROR_OUT_OF_MEMORY;
        }
        gpuarr__free(ptx);
    }
    GPUARR__TRACE_SET(s1, r == GPUARR_OK ? "committed ptx" : "nvrtc");
    if (r == GPUARR_ERROR_BACKEND && try_nvrtc) r = gpuarr__cu_nvrtc_module(d, s, t, &mod, nvrtc_why, sizeof nvrtc_why);
    if (r != GPUARR_OK)
        return gpuarr__fail(r == GPUARR_ERROR_OUT_OF_MEMORY ? r : GPUARR_ERROR_BACKEND, "%s: no %s->%s cast kernel: PTX: %s; NVRTC: %s", d->info.spec,
                            gpuarr__dtype_names[s], gpuarr__dtype_names[t], ptx_why, nvrtc_why);
    char name[96];
    gpuarr__kernel_name(s, t, name, sizeof name);
    gpuarr__cu_function fn = NULL;
    gpuarr__cu_result e = GPUARR__CU.p_cuModuleGetFunction(&fn, mod, name);
    if (e != GPUARR__CUDA_SUCCESS) {
        GPUARR__CU.p_cuModuleUnload(mod);
        return gpuarr__cu_fail(e, "cuModuleGetFunction", d->info.spec);
    }
    ds->modules[s][t] = mod;
    __atomic_store_n(&ds->casts[s][t], fn, __ATOMIC_RELEASE);
    return GPUARR_OK;
}

/* The function for a pair: built once (under the device's kernel lock); launches need no lock. */
static gpuarr_result gpuarr__cu_kernel(gpuarr__dev *d, int s, int t, gpuarr__cu_function *out) {
    gpuarr__cu_device_state *ds = GPUARR__CU_DEV(d);
    *out = __atomic_load_n(&ds->casts[s][t], __ATOMIC_ACQUIRE);
    if (*out) return GPUARR_OK;
    pthread_mutex_lock(&ds->kernel_lock);
    gpuarr_result r = GPUARR_OK;
    if (ds->build_result != GPUARR_OK) {
        r = gpuarr__fail(ds->build_result, "%s", ds->build_error);
    } else if (!ds->casts[s][t]) {
        double t0 = gpuarr__now_ms();
        r = gpuarr__cu_build_pair(d, s, t);
        if (r == GPUARR_OK) {
            gpuarr__log(GPUARR_LOG_INFO, "%s: %s->%s cast kernel ready in %.1f ms", d->info.spec, gpuarr__dtype_names[s], gpuarr__dtype_names[t],
                        gpuarr__now_ms() - t0);
        } else if (r == GPUARR_ERROR_BACKEND) { /* neither way works: do not retry at every cast */
            gpuarr__copy_string(ds->build_error, sizeof ds->build_error, gpuarr__tls.error_detail);
            ds->build_result = r;
        }
    }
    *out = ds->casts[s][t];
    pthread_mutex_unlock(&ds->kernel_lock);
    return r;
}

static gpuarr_result gpuarr__cu_cast(gpuarr__stream *s, void *dst, size_t dst_off, gpuarr_dtype dst_t, const void *src, size_t src_off,
                                     gpuarr_dtype src_t, size_t count) {
    GPUARR__TRACE_SCOPE(gpuarr__trace_cast, s, dst_t, src_t, count);
    gpuarr__dev *d = s->dev;
    gpuarr__cu_function fn;
    GPUARR__CHECK(gpuarr__cu_kernel(d, (int)src_t, (int)dst_t, &fn));
    const uint64_t block = 256, max_blocks = 0x7fffffffu;
    gpuarr__cu_ptr sp = GPUARR__CU_PTR(src, 0), dp = GPUARR__CU_PTR(dst, 0);
    uint64_t so = src_off / gpuarr__dtype_sizes[src_t], doff = dst_off / gpuarr__dtype_sizes[dst_t];
    for (uint64_t done = 0; done < count;) { /* one element per thread; a grid holds 2^31 - 1 blocks */
        uint64_t n = GPUARR__MIN((uint64_t)count - done, block * max_blocks);
        uint64_t s_at = so + done, d_at = doff + done;
        void *params[5] = {&sp, &s_at, &dp, &d_at, &n};
        GPUARR__CU_DO(d, "cuLaunchKernel",
                      cuLaunchKernel(fn, (unsigned int)((n + block - 1) / block), 1, 1, (unsigned int)block, 1, 1, 0, GPUARR__CU_STREAM(s->native),
                                     params, NULL));
        done += n;
    }
    return GPUARR_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Portable kernels: the body's text in CUDA C++, compiled by NVRTC for the device's exact sm_XY
 * (a cubin, kept in the cache folder), launched with each array as its address.
 * ------------------------------------------------------------------------------------------- */
/* No contraction into fma; division and sqrt correctly rounded (NVRTC's defaults, said anyway). */
#define GPUARR__CU_KERNEL_OPTIONS "-std=c++17", "--fmad=false", "-prec-div=true", "-prec-sqrt=true"

/* A portable kernel on one device; entries are never changed once listed. */
typedef struct gpuarr__cu_user_kernel {
    struct gpuarr__cu_user_kernel *next;
    const gpuarr_kernel *kernel;
    gpuarr__cu_module module;
    gpuarr__cu_function function; /* NULL: its build failed (result and message below) */
    gpuarr_result result;
    char *message;
} gpuarr__cu_user_kernel;

static void gpuarr__cu_user_kernels_free(gpuarr__dev *d) {
    gpuarr__cu_device_state *ds = GPUARR__CU_DEV(d);
    gpuarr__cu_scope sc;
    bool entered = ds->user_kernels && gpuarr__cu_enter_to_release(d, &sc) == GPUARR__CUDA_SUCCESS;
    while (ds->user_kernels) {
        gpuarr__cu_user_kernel *u = ds->user_kernels;
        ds->user_kernels = u->next;
        if (u->module && entered) GPUARR__CU.p_cuModuleUnload(u->module);
        gpuarr__free(u->message);
        gpuarr__free(u);
    }
    if (entered) gpuarr__cu_leave(&sc);
}

/* What C's <math.h> and <float.h> give a body on the host and NVRTC has no header for (the math
   functions themselves NVRTC declares, for float and double). */
static const char gpuarr__cu_kernel_constants[] =
    "#define INFINITY (__int_as_float(0x7f800000))\n"
    "#define NAN (__int_as_float(0x7fc00000))\n"
    "#define HUGE_VALF INFINITY\n"
    "#define HUGE_VAL (__longlong_as_double(0x7ff0000000000000LL))\n"
    "#define FLT_MAX 0x1.fffffep+127f\n"
    "#define FLT_MIN 0x1p-126f\n"
    "#define FLT_EPSILON 0x1p-23f\n"
    "#define DBL_MAX 0x1.fffffffffffffp+1023\n"
    "#define DBL_MIN 0x1p-1022\n"
    "#define DBL_EPSILON 0x1p-52\n";

/* k's CUDA source (gpuarr__malloc'ed; NULL: out of memory): the CUDA dialect of the conversion
   rules, the constants, the common prelude, then the kernel. */
static char *gpuarr__cu_kernel_text(const gpuarr_kernel *k) {
    char *prelude = NULL;
    size_t len = 0, cap = 0;
    bool ok = true;
    for (size_t i = 0; ok && i < GPUARR__CU_PIECES(gpuarr__kernels_cuda_source); i++)
        ok = gpuarr__text_add(&prelude, &len, &cap, "%s", gpuarr__kernels_cuda_source[i]);
    ok = ok && gpuarr__text_add(&prelude, &len, &cap, "%s%s", gpuarr__cu_kernel_constants, gpuarr__kernel_prelude_common);
    if (!ok) return NULL;
    gpuarr__kernel_dialect dialect = {prelude, "extern \"C\" __global__ void", "", false,
                                      {"((int64_t)blockIdx.x * blockDim.x + threadIdx.x)", "((int64_t)blockIdx.y * blockDim.y + threadIdx.y)",
                                       "((int64_t)blockIdx.z * blockDim.z + threadIdx.z)"}};
    char *text = gpuarr__kernel_source(k, &dialect);
    gpuarr__free(prelude);
    return text;
}

/* Compiles a kernel's text for arch: "sm_XY" gives the cubin a launch loads, "compute_XY" PTX
   (for checking it with ptxas). See gpuarr__nvrtc_run. */
static gpuarr_result gpuarr__cu_kernel_compile(const char *text, const char *arch, gpuarr__nvrtc_output *out) {
    const char *options[] = {GPUARR__CU_KERNEL_OPTIONS};
    return gpuarr__nvrtc_run(text, "gpuarr_kernel.cu", arch, options, (int)GPUARR__CU_PIECES(options), out);
}

/* Loads a cubin as a module of d's primary context. */
static gpuarr__cu_result gpuarr__cu_load_image(gpuarr__dev *d, const void *image, gpuarr__cu_module *mod, const char **call) {
    char log[1024];
    gpuarr__cu_scope sc;
    gpuarr__cu_result e = gpuarr__cu_enter(d, &sc);
    if (e == GPUARR__CUDA_SUCCESS) e = gpuarr__cu_load_module(mod, image, log, sizeof log);
    gpuarr__cu_leave(&sc);
    *call = GPUARR__CU_CALLED(sc, "cuModuleLoadDataEx");
    return e;
}

/* NVRTC's answer for k as a result: BUILD with its log, UNSUPPORTED saying what to install. */
static gpuarr_result gpuarr__cu_kernel_compile_failed(gpuarr__dev *d, const gpuarr_kernel *k, const char *arch, gpuarr_result r,
                                                      const gpuarr__nvrtc_output *out) {
    char how[64];
    snprintf(how, sizeof how, "NVRTC %d.%d, %s", gpuarr__nvrtc.major, gpuarr__nvrtc.minor, arch);
    if (r == GPUARR_ERROR_BUILD) return gpuarr__kernel_build_failed(d, k, how, out->log ? out->log : out->error);
    if (r == GPUARR_ERROR_UNSUPPORTED)
        return gpuarr__fail(r, "kernel %s cannot be compiled for %s: %s; install the CUDA toolkit's libnvrtc, or `pip install "
                            "nvidia-cuda-nvrtc-cu12` and point GPUARR_NVRTC_LIBRARY at the wheel's libnvrtc.so.12", k->name, d->info.spec, out->error);
    return gpuarr__fail(r, "kernel %s: %s could not compile it for %s: %s%s%.400s", k->name, how, d->info.spec, out->error, out->log ? ": " : "",
                        out->log ? out->log : "");
}

/* Builds k for d into u (kernel_lock held): the cubin from the cache folder, else NVRTC's. */
static gpuarr_result gpuarr__cu_user_build(gpuarr__dev *d, const gpuarr_kernel *k, gpuarr__cu_user_kernel *u, bool *cached) {
    gpuarr__cu_device_state *ds = GPUARR__CU_DEV(d);
    char arch[16], version[32], file[64], name[96];
    /* GPUARR_CUDA_KERNELS=ptx: PTX for the architecture, which the driver compiles (and which a
       tool can check with ptxas); otherwise a cubin for the exact GPU */
    bool ptx = gpuarr__setting_value(GPUARR__SET_CUDA_KERNELS, GPUARR__KERNELS_AUTO) == GPUARR__KERNELS_PTX;
    snprintf(arch, sizeof arch, "%s_%d%d", ptx ? "compute" : "sm", ds->cc_major, ds->cc_minor);
    snprintf(name, sizeof name, "gpuarr_kernel_%s", k->name);
    gpuarr__nvrtc_output out;
    memset(&out, 0, sizeof out);
    char *text = gpuarr__cu_kernel_text(k);
    if (!text) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "kernel %s: no host memory for its CUDA source", k->name);
    /* keyed by what the driver loads the cubin with, not by NVRTC's version: a cached kernel
       loads without opening NVRTC (about 100 ms), and one the driver refuses is compiled again */
    snprintf(version, sizeof version, "driver %d", GPUARR__CU.driver_version);
    const char *parts[] = {text, arch, version, GPUARR__CU_KERNEL_OPTIONS};
    uint64_t key = gpuarr__hash_pieces(GPUARR__HASH_SEED, parts, GPUARR__CU_PIECES(parts));
    snprintf(file, sizeof file, "cuda-kernel-%016llx.%s", (unsigned long long)key, ptx ? "ptx" : "cubin");
    const char *call = "cuModuleLoadDataEx";
    gpuarr__cu_result e = GPUARR__CUDA_SUCCESS;
    size_t size = 0;
    unsigned char *image = gpuarr__cache_load(file, key, GPUARR__CACHE_KERNEL_MAX, &size);
    *cached = image && (e = gpuarr__cu_load_image(d, image, &u->module, &call)) == GPUARR__CUDA_SUCCESS;
    if (image && !*cached) /* one the driver refuses is compiled again and replaced */
        gpuarr__log(GPUARR_LOG_INFO, "%s: kernel %s: the cached cubin %s/%s was not taken (%s failed: %s (%u)): compiled again", d->info.spec, k->name,
                    gpuarr__g.config.cache_dir, file, call, gpuarr__cu_error_name(&GPUARR__CU, e), e);
    gpuarr__free(image);
    gpuarr_result r = GPUARR_OK;
    if (!*cached) {
        r = gpuarr__cu_kernel_compile(text, arch, &out);
        if (r != GPUARR_OK) r = gpuarr__cu_kernel_compile_failed(d, k, arch, r, &out);
        else if ((e = gpuarr__cu_load_image(d, out.image, &u->module, &call)) != GPUARR__CUDA_SUCCESS) r = gpuarr__cu_fail(e, call, d->info.spec);
        if (r == GPUARR_OK) gpuarr__cache_store(file, key, out.image, out.size);
        if (r == GPUARR_OK) gpuarr__kernel_log_set(d, k, NULL);
        gpuarr__free(out.image);
        gpuarr__free(out.log);
    }
    gpuarr__free(text);
    if (r == GPUARR_OK && (e = GPUARR__CU.p_cuModuleGetFunction(&u->function, u->module, name)) != GPUARR__CUDA_SUCCESS)
        r = gpuarr__cu_fail(e, "cuModuleGetFunction", d->info.spec);
    return r;
}

/* k's entry on d, the list read without a lock. */
static gpuarr__cu_user_kernel *gpuarr__cu_user_find(gpuarr__cu_device_state *ds, const gpuarr_kernel *k) {
    gpuarr__cu_user_kernel *u = __atomic_load_n(&ds->user_kernels, __ATOMIC_ACQUIRE);
    while (u && u->kernel != k) u = u->next;
    return u;
}

/* k's entry on d, built at its first use (under kernel_lock); a failed build is remembered and
   reported again, except running out of memory. */
static gpuarr_result gpuarr__cu_user_kernel_get(gpuarr__dev *d, const gpuarr_kernel *k, gpuarr__cu_user_kernel **out) {
    gpuarr__cu_device_state *ds = GPUARR__CU_DEV(d);
    gpuarr__cu_user_kernel *u = gpuarr__cu_user_find(ds, k);
    gpuarr_result r = GPUARR_OK;
    if (!u) {
        pthread_mutex_lock(&ds->kernel_lock);
        if (!(u = gpuarr__cu_user_find(ds, k)) && (u = (gpuarr__cu_user_kernel *)gpuarr__calloc(sizeof *u)) != NULL) {
            double t0 = gpuarr__now_ms();
            bool cached = false;
            u->kernel = k;
            u->result = r = gpuarr__cu_user_build(d, k, u, &cached);
            if (r == GPUARR_OK)
                gpuarr__log(GPUARR_LOG_INFO, "%s: kernel %s ready in %.1f ms (%s)", d->info.spec, k->name, gpuarr__now_ms() - t0,
                            cached ? "its cubin from the cache" : "compiled by NVRTC");
            if (r != GPUARR_OK && u->module) GPUARR__CU.p_cuModuleUnload(u->module);
            if (r != GPUARR_OK) u->module = NULL, u->function = NULL, u->message = gpuarr__strdup(gpuarr__tls.error_detail);
            if (r == GPUARR_ERROR_OUT_OF_MEMORY) { /* not remembered: it may pass later */
                gpuarr__free(u->message);
                gpuarr__free(u);
                pthread_mutex_unlock(&ds->kernel_lock);
                return r;
            }
            u->next = ds->user_kernels;
            __atomic_store_n(&ds->user_kernels, u, __ATOMIC_RELEASE);
        } else if (!u) {
            r = gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for kernel %s", k->name);
        }
        pthread_mutex_unlock(&ds->kernel_lock);
        if (!u) return r;
    }
    *out = u;
    if (u->function) return GPUARR_OK;
    return r != GPUARR_OK ? r : gpuarr__fail(u->result, "%s", u->message ? u->message : "the kernel's earlier build failed");
}

static gpuarr_result gpuarr__cu_kernel_build(gpuarr__dev *d, const gpuarr_kernel *k) {
    gpuarr__cu_user_kernel *u;
    return gpuarr__cu_user_kernel_get(d, k, &u);
}

/* Blocks of 256 threads: 256 x 1 x 1 (1-D), 32 x 8 (2-D), 8 x 8 x 4 (3-D), a dimension shorter
   than its block side giving threads to x; the grid within CUDA's 2^31 - 1 x 65535 x 65535. */
static gpuarr_result gpuarr__cu_launch_dims(const gpuarr__kernel_call *call, unsigned int block[3], unsigned int grid[3]) {
    static const unsigned int sides[3][3] = {{256, 1, 1}, {32, 8, 1}, {8, 8, 4}};
    const uint64_t limits[3] = {0x7fffffffu, 65535u, 65535u};
    uint64_t blocks[3];
    memcpy(block, sides[call->ndim - 1], sizeof sides[0]);
    for (int d = call->ndim - 1; d >= 1; d--)
        while (block[d] > 1 && (int64_t)(block[d] / 2) >= call->global[d]) block[d] /= 2, block[0] *= 2;
    bool fits = true;
    for (int d = 0; d < 3; d++) {
        blocks[d] = ((uint64_t)call->global[d] + block[d] - 1) / block[d];
        fits = fits && blocks[d] <= limits[d];
        grid[d] = (unsigned int)blocks[d];
    }
    if (fits) return GPUARR_OK;
    return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "kernel %s: the index space %lld x %lld x %lld does not fit a CUDA grid (%llu x %llu x %llu "
                        "blocks of %u x %u x %u threads; at most 2147483647 x 65535 x 65535 blocks)", call->kernel->name,
                        (long long)call->global[0], (long long)call->global[1], (long long)call->global[2], (unsigned long long)blocks[0],
                        (unsigned long long)blocks[1], (unsigned long long)blocks[2], block[0], block[1], block[2]);
}

/* The parameters in gpuarr__kernel_source's order: each array's address (its memory plus its
   offset), each scalar's value, then the index space. */
static gpuarr_result gpuarr__cu_kernel_launch(gpuarr__stream *s, const gpuarr__kernel_call *call) {
    gpuarr__dev *d = s->dev;
    const gpuarr_kernel *k = call->kernel;
    unsigned int block[3], grid[3];
    GPUARR__CHECK(gpuarr__cu_launch_dims(call, block, grid));
    gpuarr__cu_user_kernel *u;
    GPUARR__CHECK(gpuarr__cu_user_kernel_get(d, k, &u));
    gpuarr__cu_ptr address[GPUARR_KERNEL_MAX_PARAMS];
    int64_t g[3] = {call->global[0], call->global[1], call->global[2]};
    void *params[GPUARR_KERNEL_MAX_PARAMS + 3];
    for (int i = 0; i < k->nparams; i++) {
        if (k->params[i].kind == GPUARR_PARAM_SCALAR) {
            params[i] = (void *)(uintptr_t)call->scalar[i]; /* the driver only reads it */
        } else {
            address[i] = GPUARR__CU_PTR(call->mem[i], call->offset[i]);
            params[i] = &address[i];
        }
    }
    for (int i = 0; i < 3; i++) params[k->nparams + i] = &g[i];
    GPUARR__CU_DO(d, "cuLaunchKernel",
                  cuLaunchKernel(u->function, grid[0], grid[1], grid[2], block[0], block[1], block[2], 0, GPUARR__CU_STREAM(s->native), params, NULL));
    return GPUARR_OK;
}

/* ---- the hooks a simulating driver runs portable kernels with (gpuarr__sim_kernel_hooks) ---- */
/* One launch as the driver saw it; malloc'ed (the driver's memory, freed by the driver's call). */
typedef struct gpuarr__cu_sim_launch {
    const gpuarr_kernel *kernel;
    gpuarr__cu_ptr address[GPUARR_KERNEL_MAX_PARAMS]; /* an array parameter's first element */
    uint64_t scalar[GPUARR_KERNEL_MAX_PARAMS];        /* a scalar parameter's value (at most 8 bytes) */
    int64_t global[3];
} gpuarr__cu_sim_launch;

/* The kernel f belongs to, from the devices' lists (no lock: the driver holds its own, which a
   build holds while it waits for ours). */
static const gpuarr_kernel *gpuarr__cu_sim_kernel_of(gpuarr__cu_function f) {
    gpuarr__cu_state *cu = (gpuarr__cu_state *)gpuarr__g.backend_state[GPUARR_BACKEND_CUDA];
    for (int i = 0; cu && f && i < cu->device_count; i++)
        for (gpuarr__cu_user_kernel *u = __atomic_load_n(&cu->devices[i].user_kernels, __ATOMIC_ACQUIRE); u; u = u->next)
            if (u->function == f) return u->kernel;
    return NULL;
}

static void *gpuarr__cu_sim_capture(struct CUfunc_st *f, void *const *params, const unsigned long long threads[3], char *why, size_t why_cap) {
    const gpuarr_kernel *k = gpuarr__cu_sim_kernel_of(f);
    if (!k) {
        snprintf(why, why_cap, "the function is no portable kernel this gpuarr built");
        return NULL;
    }
    gpuarr__cu_sim_launch *l = (gpuarr__cu_sim_launch *)calloc(1, sizeof *l);
    if (!l) {
        if (why_cap) why[0] = '\0';
        return NULL;
    }
    l->kernel = k;
    for (int i = 0; i < k->nparams; i++) {
        if (k->params[i].kind == GPUARR_PARAM_SCALAR) memcpy(&l->scalar[i], params[i], gpuarr__dtype_sizes[k->params[i].dtype]);
        else memcpy(&l->address[i], params[i], sizeof l->address[i]);
    }
    for (int d = 0; d < 3; d++) memcpy(&l->global[d], params[k->nparams + d], sizeof l->global[d]);
    for (int d = 0; d < 3; d++)
        if (threads[d] < (unsigned long long)l->global[d]) {
            snprintf(why, why_cap, "kernel %s: the launch's %llu x %llu x %llu threads do not cover its index space %lld x %lld x %lld", k->name,
                     threads[0], threads[1], threads[2], (long long)l->global[0], (long long)l->global[1], (long long)l->global[2]);
            free(l);
            return NULL;
        }
    return l;
}

static int gpuarr__cu_sim_addresses(const void *launch, unsigned long long *out, int cap) {
    const gpuarr__cu_sim_launch *l = (const gpuarr__cu_sim_launch *)launch;
    int n = 0;
    for (int i = 0; i < l->kernel->nparams; i++) {
        if (l->kernel->params[i].kind == GPUARR_PARAM_SCALAR) continue;
        if (n < cap) out[n] = l->address[i];
        n++;
    }
    return n;
}

/* The host form over the whole index space (past ndim it is 1), as one range of its last
   dimension. */
static int gpuarr__cu_sim_run(void *launch, void *(*translate)(void *ctx, unsigned long long address), void *ctx) {
    gpuarr__cu_sim_launch *l = (gpuarr__cu_sim_launch *)launch;
    void *args[GPUARR_KERNEL_MAX_PARAMS];
    for (int i = 0; i < l->kernel->nparams; i++) {
        args[i] = l->kernel->params[i].kind == GPUARR_PARAM_SCALAR ? (void *)&l->scalar[i] : translate(ctx, l->address[i]);
        if (!args[i]) return -1;
    }
    l->kernel->host(args, l->global, 3, 0, l->global[2]);
    return 0;
}

static void gpuarr__cu_sim_release(void *launch) { free(launch); }

static const gpuarr__sim_kernel_hooks *gpuarr__cu_sim_hooks(void) {
    static const gpuarr__sim_kernel_hooks hooks = {GPUARR__SIM_KERNEL_HOOKS_VERSION, gpuarr__cu_sim_capture, gpuarr__cu_sim_addresses,
                                                   gpuarr__cu_sim_run, gpuarr__cu_sim_release};
    return &hooks;
}

/* ---------------------------------------------------------------------------------------------
 * Streams and events
 * ------------------------------------------------------------------------------------------- */
static void gpuarr__cu_host_call_unlink(gpuarr__cu_host_call *c) {
    if (c->prev) c->prev->next = c->next;
    else c->ds->host_calls = c->next;
    if (c->next) c->next->prev = c->prev;
}

static void gpuarr__cu_host_call_run(void *user) {
    gpuarr__cu_host_call *c = (gpuarr__cu_host_call *)user;
    pthread_mutex_lock(&GPUARR__CU.host_lock);
    gpuarr__cu_host_call_unlink(c);
    pthread_mutex_unlock(&GPUARR__CU.host_lock);
    gpuarr__host_fn fn = c->fn;
    void *ctx = c->ctx;
    gpuarr__free(c);
    fn(ctx);
}

/* The driver runs fn on its own thread, in stream order. */
static gpuarr_result gpuarr__cu_launch_host_fn(gpuarr__stream *s, gpuarr__host_fn fn, void *ctx) {
    gpuarr__cu_host_call *c = (gpuarr__cu_host_call *)gpuarr__calloc(sizeof *c);
    if (!c) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for a host function");
    c->ds = GPUARR__CU_DEV(s->dev);
    c->fn = fn;
    c->ctx = ctx;
    pthread_mutex_lock(&GPUARR__CU.host_lock);
    c->next = c->ds->host_calls;
    if (c->next) c->next->prev = c;
    c->ds->host_calls = c;
    pthread_mutex_unlock(&GPUARR__CU.host_lock);
    gpuarr__cu_scope sc;
    gpuarr__cu_result e = gpuarr__cu_enter(s->dev, &sc);
    if (e == GPUARR__CUDA_SUCCESS) e = GPUARR__CU.p_cuLaunchHostFunc(GPUARR__CU_STREAM(s->native), gpuarr__cu_host_call_run, c);
    gpuarr__cu_leave(&sc);
    if (e != GPUARR__CUDA_SUCCESS) {
        pthread_mutex_lock(&GPUARR__CU.host_lock);
        gpuarr__cu_host_call_unlink(c);
        pthread_mutex_unlock(&GPUARR__CU.host_lock);
        gpuarr__free(c);
        return gpuarr__cu_fail(e, GPUARR__CU_CALLED(sc, "cuLaunchHostFunc"), s->dev->info.spec);
    }
    return GPUARR_OK;
}

static gpuarr_result gpuarr__cu_stream_wrap(gpuarr__cu_stream stream, bool owned, void **native) {
    gpuarr__cu_stream_box *box = (gpuarr__cu_stream_box *)gpuarr__calloc(sizeof *box);
    if (!box) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for a stream");
    box->stream = stream;
    box->owned = owned;
    *native = box;
    return GPUARR_OK;
}

/* Non-blocking: gpuarr's streams never wait for the legacy default stream (stream 0). */
static gpuarr_result gpuarr__cu_stream_create(gpuarr__dev *d, void **native) {
    gpuarr__cu_stream st = NULL;
    GPUARR__CU_DO(d, "cuStreamCreate", cuStreamCreate(&st, GPUARR__CU_STREAM_NON_BLOCKING));
    gpuarr_result r = gpuarr__cu_stream_wrap(st, true, native);
    if (r != GPUARR_OK) GPUARR__CU.p_cuStreamDestroy_v2(st);
    return r;
}

static void gpuarr__cu_stream_destroy(gpuarr__dev *d, void *native) {
    gpuarr__cu_stream_box *box = (gpuarr__cu_stream_box *)native;
    if (box->owned) {
        gpuarr__cu_scope sc;
        if (gpuarr__cu_enter_to_release(d, &sc) == GPUARR__CUDA_SUCCESS) GPUARR__CU.p_cuStreamDestroy_v2(box->stream);
        gpuarr__cu_leave(&sc);
    }
    gpuarr__free(box);
}

static gpuarr_result gpuarr__cu_stream_sync(gpuarr__dev *d, void *native) {
    GPUARR__CU_DO(d, "cuStreamSynchronize", cuStreamSynchronize(GPUARR__CU_STREAM(native)));
    gpuarr__host_fn_seen();
    return GPUARR_OK;
}

/* NOT_READY is an answer, not an error. */
static gpuarr_result gpuarr__cu_status(gpuarr__dev *d, gpuarr__cu_result e, const char *call, bool *done) {
    *done = e == GPUARR__CUDA_SUCCESS;
    if (*done) gpuarr__host_fn_seen();
    if (e == GPUARR__CUDA_SUCCESS || e == GPUARR__CUDA_ERROR_NOT_READY) return GPUARR_OK;
    return gpuarr__cu_fail(e, call, d->info.spec);
}

static gpuarr_result gpuarr__cu_stream_query(gpuarr__dev *d, void *native, bool *done) {
    gpuarr__cu_scope sc;
    gpuarr__cu_result e = gpuarr__cu_enter(d, &sc);
    if (e == GPUARR__CUDA_SUCCESS) e = GPUARR__CU.p_cuStreamQuery(GPUARR__CU_STREAM(native));
    gpuarr__cu_leave(&sc);
    return gpuarr__cu_status(d, e, GPUARR__CU_CALLED(sc, "cuStreamQuery"), done);
}

static gpuarr_result gpuarr__cu_event_create(gpuarr__dev *d, bool timing, void **native) {
    gpuarr__cu_event ev = NULL;
    GPUARR__CU_DO(d, "cuEventCreate", cuEventCreate(&ev, timing ? 0u : GPUARR__CU_EVENT_DISABLE_TIMING));
    *native = ev;
    return GPUARR_OK;
}

static void gpuarr__cu_event_destroy(gpuarr__dev *d, void *native) {
    gpuarr__cu_scope sc;
    if (gpuarr__cu_enter_to_release(d, &sc) == GPUARR__CUDA_SUCCESS) GPUARR__CU.p_cuEventDestroy_v2((gpuarr__cu_event)native);
    gpuarr__cu_leave(&sc);
}

static gpuarr_result gpuarr__cu_event_record(gpuarr__dev *d, void *event, void *stream) {
    GPUARR__CU_DO(d, "cuEventRecord", cuEventRecord((gpuarr__cu_event)event, GPUARR__CU_STREAM(stream)));
    return GPUARR_OK;
}

static gpuarr_result gpuarr__cu_event_sync(gpuarr__dev *d, void *event) {
    GPUARR__CU_DO(d, "cuEventSynchronize", cuEventSynchronize((gpuarr__cu_event)event));
    gpuarr__host_fn_seen();
    return GPUARR_OK;
}

static gpuarr_result gpuarr__cu_event_query(gpuarr__dev *d, void *event, bool *done) {
    gpuarr__cu_scope sc;
    gpuarr__cu_result e = gpuarr__cu_enter(d, &sc);
    if (e == GPUARR__CUDA_SUCCESS) e = GPUARR__CU.p_cuEventQuery((gpuarr__cu_event)event);
    gpuarr__cu_leave(&sc);
    return gpuarr__cu_status(d, e, GPUARR__CU_CALLED(sc, "cuEventQuery"), done);
}

static gpuarr_result gpuarr__cu_event_elapsed(gpuarr__dev *d, void *start, void *end, double *ms) {
    float t = 0;
    gpuarr__cu_scope sc;
    gpuarr__cu_result e = gpuarr__cu_enter(d, &sc);
    if (e == GPUARR__CUDA_SUCCESS) e = GPUARR__CU.p_cuEventElapsedTime(&t, (gpuarr__cu_event)start, (gpuarr__cu_event)end);
    gpuarr__cu_leave(&sc);
    if (e == GPUARR__CUDA_ERROR_NOT_READY) return gpuarr__fail(GPUARR_ERROR_NOT_READY, "%s: the events have not completed yet", d->info.spec);
    if (e != GPUARR__CUDA_SUCCESS) return gpuarr__cu_fail(e, GPUARR__CU_CALLED(sc, "cuEventElapsedTime"), d->info.spec);
    *ms = t;
    return GPUARR_OK;
}

/* The driver orders streams on events of any device. */
static gpuarr_result gpuarr__cu_stream_wait_event(gpuarr__dev *d, void *stream, void *event) {
    GPUARR__CU_DO(d, "cuStreamWaitEvent", cuStreamWaitEvent(GPUARR__CU_STREAM(stream), (gpuarr__cu_event)event, 0));
    return GPUARR_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Interop: the functions of GPUARR__INTEROP_CUDA, called by the public ones the core generates
 * ------------------------------------------------------------------------------------------- */
static gpuarr_result gpuarr__cu_get_dev(gpuarr_device d, const char *arg, gpuarr__dev **out) {
    GPUARR__CHECK(gpuarr__get_dev(d, arg, out));
    if ((*out)->backend->id != GPUARR_BACKEND_CUDA)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "%s is %s, not a CUDA device", arg, (*out)->info.spec);
    return gpuarr__dev_open(*out);
}

static gpuarr_result gpuarr__cuda_context(gpuarr_device d, struct CUctx_st **out) {
    GPUARR__REQUIRE_PTR(out);
    gpuarr__dev *dev;
    GPUARR__CHECK(gpuarr__cu_get_dev(d, "d", &dev));
    *out = GPUARR__CU_DEV(dev)->ctx;
    return GPUARR_OK;
}

static gpuarr_result gpuarr__cuda_device_ordinal(gpuarr_device d, int *out) {
    GPUARR__REQUIRE_PTR(out);
    gpuarr__dev *dev;
    GPUARR__CHECK(gpuarr__cu_get_dev(d, "d", &dev));
    *out = GPUARR__CU_DEV(dev)->dev;
    return GPUARR_OK;
}

static gpuarr_result gpuarr__cuda_stream(gpuarr_stream s, struct CUstream_st **out) {
    GPUARR__REQUIRE_PTR(out);
    gpuarr__stream *st;
    GPUARR__CHECK(gpuarr__resolve_stream_of(s, GPUARR_BACKEND_CUDA, "a CUDA device", &st));
    *out = GPUARR__CU_STREAM(st->native);
    gpuarr__obj_release(&st->obj);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__cuda_ptr(gpuarr_array a, void **out) {
    GPUARR__REQUIRE_PTR(out);
    gpuarr__array *arr;
    GPUARR__CHECK(gpuarr__get_array(a, "a", &arr));
    gpuarr_result r = GPUARR_OK;
    if (arr->dev->backend->id != GPUARR_BACKEND_CUDA)
        r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "a lives on %s, not on a CUDA device", arr->dev->info.spec);
    else
        *out = (void *)(uintptr_t)GPUARR__CU_PTR(arr->mem, arr->offset);
    gpuarr__obj_release(&arr->obj);
    return r;
}

/* For the messages about objects of another context. */
static const char *gpuarr__cu_context_kind(gpuarr__dev *d) { return GPUARR__CU_DEV(d)->is_adopted ? "adopted context" : "primary context"; }
static const char *gpuarr__cu_context_hint(gpuarr__dev *d) {
    return GPUARR__CU_DEV(d)->is_adopted ? " (wrap it on the device of its own context: gpuarr_cuda_adopt that context, or cuda:N for a primary one's)"
                                         : " (a context the caller made is a device of its own: gpuarr_cuda_adopt)";
}

/* The pointer must be device memory of d's context, and hold the array from where it points. */
static gpuarr_result gpuarr__cu_check_wrapped(gpuarr__dev *dev, void *ptr, const gpuarr__array *a) {
    gpuarr__cu_state *cu = &GPUARR__CU;
    gpuarr__cu_ptr p = (gpuarr__cu_ptr)(uintptr_t)ptr, base = 0;
    gpuarr__cu_context ctx = NULL;
    unsigned int type = 0;
    size_t size = 0;
    gpuarr__cu_result e = gpuarr__cu_pointer_kind(dev, ptr, &type, &ctx);
    if (e == GPUARR__CUDA_SUCCESS && type == GPUARR__CU_MEMORYTYPE_DEVICE) {
        gpuarr__cu_scope sc;
        e = gpuarr__cu_enter(dev, &sc);
        if (e == GPUARR__CUDA_SUCCESS) e = cu->p_cuMemGetAddressRange_v2(&base, &size, p);
        gpuarr__cu_leave(&sc);
    }
    if (e != GPUARR__CUDA_SUCCESS || type != GPUARR__CU_MEMORYTYPE_DEVICE)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "ptr %p is not CUDA device memory (%s)", ptr,
                            e != GPUARR__CUDA_SUCCESS || type == 0 ? "the driver does not know it" : "it is host memory");
    if (ctx != GPUARR__CU_DEV(dev)->ctx)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "ptr %p belongs to context %p, not to %s's %s %p%s", ptr, (void *)ctx, dev->info.spec,
                            gpuarr__cu_context_kind(dev), (void *)GPUARR__CU_DEV(dev)->ctx, gpuarr__cu_context_hint(dev));
    if (p % gpuarr__dtype_sizes[a->dtype] != 0)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "ptr %p is not aligned to %zu bytes (the size of %s)", ptr,
                            gpuarr__dtype_sizes[a->dtype], gpuarr__dtype_names[a->dtype]);
    if (base + size - p < a->nbytes)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "the allocation holding ptr %p has %llu bytes from there; the array needs %zu", ptr,
                            (unsigned long long)(base + size - p), a->nbytes);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__cuda_wrap_ptr(gpuarr_device d, void *ptr, gpuarr_dtype t, int ndim, const int64_t *shape,
                                           gpuarr_release_fn release, void *user_data, gpuarr_array *out) {
    GPUARR__REQUIRE_PTR(out);
    GPUARR__REQUIRE_PTR(ptr);
    gpuarr__dev *dev;
    gpuarr__array *a;
    GPUARR__CHECK(gpuarr__cu_get_dev(d, "d", &dev));
    GPUARR__CHECK(gpuarr__array_alloc_struct(dev, t, ndim, shape, &a));
    gpuarr_result r = gpuarr__cu_check_wrapped(dev, ptr, a);
    uint32_t id = 0;
    if (r == GPUARR_OK) {
        a->mem = ptr;
        a->offset = 0;
        a->wrapped = true;
        r = gpuarr__table_insert(&gpuarr__g.arrays, &a->obj, &id);
    }
    if (r != GPUARR_OK) { /* the caller keeps ownership: no release callback */
        gpuarr__free(a);
        return r;
    }
    a->release_fn = release;
    a->release_user = user_data;
    out->id = id;
    return GPUARR_OK;
}

static gpuarr_result gpuarr__cuda_wrap_stream(gpuarr_device d, struct CUstream_st *stream, gpuarr_stream *out) {
    GPUARR__REQUIRE_PTR(out);
    gpuarr__dev *dev;
    GPUARR__CHECK(gpuarr__cu_get_dev(d, "d", &dev));
    gpuarr__cu_context ctx = NULL;
    gpuarr__cu_scope sc;
    gpuarr__cu_result e = gpuarr__cu_enter(dev, &sc);
    if (e == GPUARR__CUDA_SUCCESS) e = GPUARR__CU.p_cuStreamGetCtx(stream, &ctx);
    gpuarr__cu_leave(&sc);
    if (e != GPUARR__CUDA_SUCCESS) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "stream %p is not a valid CUDA stream (%u)", (void *)stream, e);
    if (ctx != GPUARR__CU_DEV(dev)->ctx)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "stream %p belongs to context %p, not to %s's %s %p%s", (void *)stream, (void *)ctx,
                            dev->info.spec, gpuarr__cu_context_kind(dev), (void *)GPUARR__CU_DEV(dev)->ctx, gpuarr__cu_context_hint(dev));
    void *native = NULL;
    GPUARR__CHECK(gpuarr__cu_stream_wrap(stream, false, &native));
    gpuarr__stream *s;
    GPUARR__CHECK(gpuarr__stream_adopt(dev, native, &s));
    return gpuarr__stream_publish(s, out);
}


/* ---------------------------------------------------------------------------------------------
 * Adopted contexts (gpuarr_cuda_adopt): a device of the caller's CUcontext, after those load found.
 * ------------------------------------------------------------------------------------------- */
/* The device of a usable context: it is made current for a moment (cuCtxGetApiVersion first, so a
   handle the driver does not know is refused before it is made current), and a sticky error in
   it is seen by cuMemGetInfo. */
static gpuarr_result gpuarr__cu_adopt_probe(gpuarr__cu_context ctx, gpuarr__cu_device *dev) {
    gpuarr__cu_state *cu = &GPUARR__CU;
    unsigned int version = 0;
    size_t f = 0, t = 0;
    gpuarr__cu_context prev = NULL;
    const char *call = "cuCtxGetApiVersion";
    gpuarr__cu_result e = cu->p_cuCtxGetApiVersion(ctx, &version);
    if (e == GPUARR__CUDA_SUCCESS && (e = cu->p_cuCtxGetCurrent(&prev)) == GPUARR__CUDA_SUCCESS) {
        call = "cuCtxSetCurrent";
        if ((e = cu->p_cuCtxSetCurrent(ctx)) == GPUARR__CUDA_SUCCESS) {
            call = "cuCtxGetDevice";
            e = cu->p_cuCtxGetDevice(dev);
            if (e == GPUARR__CUDA_SUCCESS) call = "cuMemGetInfo", e = cu->p_cuMemGetInfo_v2(&f, &t);
            cu->p_cuCtxSetCurrent(prev);
        }
    }
    if (e == GPUARR__CUDA_SUCCESS) return GPUARR_OK;
    return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "ctx %p is not a usable CUDA context: %s answers %s (%u)%s", (void *)ctx, call,
                        gpuarr__cu_error_name(cu, e), e,
                        gpuarr__cu_sticky(e) ? " (a sticky error corrupted it: destroy it and adopt a new one)" : " (destroyed, or never one)");
}

/* A context gpuarr already has: an adopted one, or a device's primary context (only compared where
   it is active, so none is created for the question). Returns the row, or -1. */
static int gpuarr__cu_adopt_owner(gpuarr__cu_context ctx, gpuarr__cu_device dev) {
    gpuarr__cu_state *cu = &GPUARR__CU;
    for (int i = cu->device_count; i < cu->device_count + cu->adopted_count; i++)
        if (cu->devices[i].adopted == ctx) return i;
    unsigned int flags = 0;
    int active = 0;
    gpuarr__cu_context primary = NULL;
    if (cu->p_cuDevicePrimaryCtxGetState(dev, &flags, &active) != GPUARR__CUDA_SUCCESS || !active) return -1;
    if (cu->p_cuDevicePrimaryCtxRetain(&primary, dev) != GPUARR__CUDA_SUCCESS) return -1;
    cu->p_cuDevicePrimaryCtxRelease_v2(dev);
    for (int i = 0; primary == ctx && i < cu->device_count; i++)
        if (cu->devices[i].dev == dev) return i;
    return -1;
}

static gpuarr_result gpuarr__cu_device_adopt(void *context, void *device, void *queue, int *index, int *same) {
    gpuarr__cu_state *cu = &GPUARR__CU;
    gpuarr__cu_context ctx = (gpuarr__cu_context)context;
    if (!ctx) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "ctx is NULL");
    if (device || queue) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "a CUDA context is adopted alone (no device, no queue)");
    int row = cu->device_count + cu->adopted_count;
    if (cu->adopted_count >= GPUARR__ADOPT_MAX)
        return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "%d CUDA contexts were adopted since gpuarr_init, the most one cycle holds", GPUARR__ADOPT_MAX);
    gpuarr__cu_device dev = -1;
    GPUARR__CHECK(gpuarr__cu_adopt_probe(ctx, &dev));
    int owner = gpuarr__cu_adopt_owner(ctx, dev);
    if (owner >= 0)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "ctx %p is %s already, as cuda:%d%s", (void *)ctx,
                            owner < cu->device_count ? "a device's primary context" : "adopted", owner,
                            owner < cu->device_count ? ": use that device" : " (one device per context)");
    *same = -1;
    for (int i = 0; i < cu->device_count; i++)
        if (cu->devices[i].dev == dev) *same = i;
    gpuarr__cu_device_state *ds = &cu->devices[row];
    memset(ds, 0, sizeof *ds);
    ds->peer = (signed char *)gpuarr__calloc((size_t)cu->device_count + GPUARR__ADOPT_MAX);
    if (!ds->peer) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for an adopted CUDA device");
    ds->dev = dev;
    ds->adopted = ctx;
    ds->is_adopted = true;
    pthread_mutex_init(&ds->kernel_lock, NULL);
    *index = row;
    __atomic_store_n(&cu->adopted_count, cu->adopted_count + 1, __ATOMIC_RELEASE);
    return GPUARR_OK;
}

/* After device_close: the caller's context is never touched again (the row stays, unused). */
static void gpuarr__cu_device_forget(gpuarr__dev *d) {
    gpuarr__cu_state *cu = &GPUARR__CU;
    gpuarr__cu_device_state *ds = GPUARR__CU_DEV(d);
    pthread_mutex_lock(&cu->peer_lock);
    for (int i = 0; i < cu->device_count + cu->adopted_count; i++)
        if (cu->devices[i].peer) cu->devices[i].peer[d->info.index] = 0;
    pthread_mutex_unlock(&cu->peer_lock);
    ds->adopted = NULL;
    ds->ctx = NULL;
}

static gpuarr_result gpuarr__cuda_adopt(struct CUctx_st *ctx, gpuarr_device *out) {
    GPUARR__REQUIRE_PTR(out);
    return gpuarr__registry_adopt(GPUARR_BACKEND_CUDA, ctx, NULL, NULL, out);
}

/* ---------------------------------------------------------------------------------------------
 * Telemetry: NVML's readings for the device's UUID; without NVML (missing, its init failing, the
 * device unknown to it) the driver's memory figures alone.
 * ------------------------------------------------------------------------------------------- */
/* Loads and initializes NVML once; false (and logged once, at info) if it cannot. Under nvml.lock. */
static bool gpuarr__nvml_ready(gpuarr__cu_state *cu) {
    if (cu->nvml.status) return cu->nvml.status > 0;
    cu->nvml.status = -1;
    const char *path = gpuarr__setting(GPUARR__SET_NVML_LIBRARY);
    const char *name = path ? path : "libnvidia-ml.so.1";
#ifdef RTLD_NODELETE
    cu->nvml.library = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
#else
    cu->nvml.library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
#endif
    if (!cu->nvml.library) {
        gpuarr__log(GPUARR_LOG_INFO, "telemetry: cannot load %s%s: %s; CUDA devices report the driver's memory figures only", name,
                    path ? " (GPUARR_NVML_LIBRARY)" : "", dlerror());
        return false;
    }
    const char *missing = NULL;
#define GPUARR__NVML_BIND(ret, fn, params)                                                     \
    if (!gpuarr__dl_symbol(cu->nvml.library, #fn, &cu->nvml.p_##fn, sizeof cu->nvml.p_##fn) && !missing) missing = #fn;
    GPUARR__NVML_PROCS(GPUARR__NVML_BIND)
#undef GPUARR__NVML_BIND
#define GPUARR__NVML_BIND_OPTIONAL(ret, fn, params) gpuarr__dl_symbol(cu->nvml.library, #fn, &cu->nvml.p_##fn, sizeof cu->nvml.p_##fn);
    GPUARR__NVML_OPTIONAL_PROCS(GPUARR__NVML_BIND_OPTIONAL)
#undef GPUARR__NVML_BIND_OPTIONAL
    gpuarr__nvml_return e = missing ? 0u : cu->nvml.p_nvmlInit_v2();
    if (missing || e != GPUARR__NVML_SUCCESS) {
        if (missing) gpuarr__log(GPUARR_LOG_INFO, "telemetry: %s lacks %s; CUDA devices report the driver's memory figures only", name, missing);
        else gpuarr__log(GPUARR_LOG_INFO, "telemetry: nvmlInit_v2 failed (%u); CUDA devices report the driver's memory figures only", e);
        dlclose(cu->nvml.library);
        cu->nvml.library = NULL;
        return false;
    }
    cu->nvml.status = 1;
    return true;
}

/* NVML's text form of a UUID: "GPU-" (or "MIG-") and 8-4-4-4-12 lowercase hex digits. */
static void gpuarr__nvml_uuid_text(const uint8_t uuid[16], const char *prefix, char out[48]) {
    static const char hex[] = "0123456789abcdef";
    size_t n = strlen(prefix);
    memcpy(out, prefix, n);
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10) out[n++] = '-';
        out[n++] = hex[uuid[i] >> 4];
        out[n++] = hex[uuid[i] & 15u];
    }
    out[n] = '\0';
}

/* The device's NVML handle, looked up by its UUID once; NULL if there is none. */
static gpuarr__nvml_device gpuarr__nvml_handle(gpuarr__dev *d) {
    gpuarr__cu_state *cu = &GPUARR__CU;
    gpuarr__cu_device_state *ds = GPUARR__CU_DEV(d);
    pthread_mutex_lock(&cu->nvml.lock);
    if (gpuarr__nvml_ready(cu) && !ds->nvml_found) {
        ds->nvml_found = -1;
        static const char *const prefixes[] = {"GPU-", "MIG-"}; /* a MIG instance's own UUID (cuDeviceGetUuid_v2) */
        for (int i = 0; i < 2 && d->info.has_uuid && ds->nvml_found < 0; i++) {
            char text[48];
            gpuarr__nvml_uuid_text(d->info.uuid, prefixes[i], text);
            if (cu->nvml.p_nvmlDeviceGetHandleByUUID(text, &ds->nvml_device) == GPUARR__NVML_SUCCESS && ds->nvml_device) ds->nvml_found = 1;
        }
        if (ds->nvml_found < 0)
            gpuarr__log(GPUARR_LOG_INFO, "telemetry: NVML does not know %s by its UUID; it reports the driver's memory figures only",
                        d->info.spec);
    }
    gpuarr__nvml_device h = ds->nvml_found > 0 ? ds->nvml_device : NULL;
    pthread_mutex_unlock(&cu->nvml.lock);
    return h;
}

/* Each reading from the newest entry point NVML has, else the older one; one that fails leaves
   its bit clear. */
static void gpuarr__nvml_read(gpuarr__cu_state *cu, gpuarr__nvml_device h, gpuarr_telemetry *out) {
#define GPUARR__NVML_OK(fn, ...) (cu->nvml.p_##fn && cu->nvml.p_##fn(__VA_ARGS__) == GPUARR__NVML_SUCCESS)
    gpuarr__nvml_memory_v2 m2;
    gpuarr__nvml_memory m1;
    memset(&m2, 0, sizeof m2);
    memset(&m1, 0, sizeof m1);
    m2.version = GPUARR__NVML_STRUCT_VERSION(gpuarr__nvml_memory_v2, 2);
    if (GPUARR__NVML_OK(nvmlDeviceGetMemoryInfo_v2, h, &m2) && m2.total && m2.used + m2.free <= m2.total) {
        m1.total = m2.total, m1.free = m2.free, m1.used = m2.used;
    } else if (!GPUARR__NVML_OK(nvmlDeviceGetMemoryInfo, h, &m1) || !m1.total || m1.used + m1.free > m1.total) {
        m1.total = 0;
    }
    if (m1.total) {
        out->memory_total = m1.total, out->memory_free = m1.free, out->memory_used = m1.used;
        out->valid |= (uint32_t)GPUARR_TELEMETRY_MEMORY_TOTAL | (uint32_t)GPUARR_TELEMETRY_MEMORY_USAGE;
    }
    gpuarr__nvml_utilization u = {0, 0};
    if (GPUARR__NVML_OK(nvmlDeviceGetUtilizationRates, h, &u) && u.gpu <= 100u && u.memory <= 100u) {
        out->gpu_utilization_pct = (int)u.gpu, out->memory_utilization_pct = (int)u.memory;
        out->valid |= (uint32_t)GPUARR_TELEMETRY_GPU_UTILIZATION | (uint32_t)GPUARR_TELEMETRY_MEMORY_UTILIZATION;
    }
    gpuarr__nvml_temperature tv;
    memset(&tv, 0, sizeof tv);
    tv.version = GPUARR__NVML_STRUCT_VERSION(gpuarr__nvml_temperature, 1);
    tv.sensorType = GPUARR__NVML_TEMPERATURE_GPU;
    unsigned int v = 0;
    if (GPUARR__NVML_OK(nvmlDeviceGetTemperatureV, h, &tv)) {
        out->temperature_c = (double)tv.temperature;
        out->valid |= (uint32_t)GPUARR_TELEMETRY_TEMPERATURE;
    } else if (GPUARR__NVML_OK(nvmlDeviceGetTemperature, h, GPUARR__NVML_TEMPERATURE_GPU, &v)) {
        out->temperature_c = (double)v;
        out->valid |= (uint32_t)GPUARR_TELEMETRY_TEMPERATURE;
    }
    if (GPUARR__NVML_OK(nvmlDeviceGetPowerUsage, h, &v)) { /* milliwatts */
        out->power_w = (double)v / 1000.0;
        out->valid |= (uint32_t)GPUARR_TELEMETRY_POWER;
    }
    if (GPUARR__NVML_OK(nvmlDeviceGetEnforcedPowerLimit, h, &v) || GPUARR__NVML_OK(nvmlDeviceGetPowerManagementLimit, h, &v)) {
        out->power_limit_w = (double)v / 1000.0;
        out->valid |= (uint32_t)GPUARR_TELEMETRY_POWER_LIMIT;
    }
    if (GPUARR__NVML_OK(nvmlDeviceGetClockInfo, h, GPUARR__NVML_CLOCK_SM, &v) && v <= (unsigned int)INT_MAX) {
        out->sm_clock_mhz = (int)v;
        out->valid |= (uint32_t)GPUARR_TELEMETRY_SM_CLOCK;
    }
    if (GPUARR__NVML_OK(nvmlDeviceGetClockInfo, h, GPUARR__NVML_CLOCK_MEM, &v) && v <= (unsigned int)INT_MAX) {
        out->memory_clock_mhz = (int)v;
        out->valid |= (uint32_t)GPUARR_TELEMETRY_MEMORY_CLOCK;
    }
    unsigned long long reasons = 0;
    if (GPUARR__NVML_OK(nvmlDeviceGetCurrentClocksEventReasons, h, &reasons) ||
        GPUARR__NVML_OK(nvmlDeviceGetCurrentClocksThrottleReasons, h, &reasons)) {
        out->throttle_reasons = reasons;
        out->valid |= (uint32_t)GPUARR_TELEMETRY_THROTTLE_REASONS;
    }
    if (GPUARR__NVML_OK(nvmlDeviceGetCurrPcieLinkGeneration, h, &v) && v <= (unsigned int)INT_MAX) {
        out->pcie_generation = (int)v;
        out->valid |= (uint32_t)GPUARR_TELEMETRY_PCIE_GENERATION;
    }
    if (GPUARR__NVML_OK(nvmlDeviceGetCurrPcieLinkWidth, h, &v) && v <= (unsigned int)INT_MAX) {
        out->pcie_width = (int)v;
        out->valid |= (uint32_t)GPUARR_TELEMETRY_PCIE_WIDTH;
    }
#undef GPUARR__NVML_OK
}

/* Without NVML: the total always; free and used where cuMemGetInfo can be asked (the device is
   open, or its primary context active: none is created just for this). */
static void gpuarr__cu_telemetry(gpuarr__dev *d, gpuarr_telemetry *out) {
    gpuarr__nvml_device h = gpuarr__nvml_handle(d);
    if (h) gpuarr__nvml_read(&GPUARR__CU, h, out);
    if (out->valid & (uint32_t)GPUARR_TELEMETRY_MEMORY_TOTAL) return;
    out->memory_total = d->info.total_memory;
    out->valid |= (uint32_t)GPUARR_TELEMETRY_MEMORY_TOTAL;
    uint64_t free_bytes = 0;
    if (gpuarr__cu_read_free_memory(d, &free_bytes) && free_bytes <= out->memory_total) {
        out->memory_free = free_bytes;
        out->memory_used = out->memory_total - free_bytes;
        out->valid |= (uint32_t)GPUARR_TELEMETRY_MEMORY_USAGE;
    }
}

static const gpuarr__interop_CUDA gpuarr__cu_interop = {GPUARR_BACKEND_CUDA, GPUARR__INTEROP_CUDA(GPUARR__INTEROP_IMPL)};

/* The CUDA table: asynchronous, devices named "cuda:N", device memory, no allocation limit of
   its own. A view is an address inside its segment: nothing to release (mem_view_release NULL);
   every pair has a kernel, from the committed PTX or NVRTC, and failing to get one is
   GPUARR_ERROR_BACKEND at the cast (cast_supported NULL). */
static void gpuarr__cu_backend_fill(gpuarr__backend *b) {
    b->id = GPUARR_BACKEND_CUDA;
    b->name = "cuda";
    b->flags = 0; /* asynchronous; the driver consumes pageable copies at the call */
    b->max_alloc_name = NULL;
    b->interop = &gpuarr__cu_interop;
    b->load = gpuarr__cu_load;
    b->unload = gpuarr__cu_unload;
    b->device_count = gpuarr__cu_device_count;
    b->device_info = gpuarr__cu_device_info;
    b->device_open = gpuarr__cu_device_open;
    b->device_close = gpuarr__cu_device_close;
    b->device_reset = gpuarr__cu_device_reset;
    b->device_adopt = gpuarr__cu_device_adopt;
    b->device_forget = gpuarr__cu_device_forget;
    b->mem_info = gpuarr__cu_mem_info;
    b->mem_alloc = gpuarr__cu_mem_alloc;
    b->mem_free = gpuarr__cu_mem_free;
    b->mem_alignment = gpuarr__cu_mem_alignment;
    b->mem_view = gpuarr__cu_mem_view;
    b->pinned_alloc = gpuarr__cu_pinned_alloc;
    b->pinned_free = gpuarr__cu_pinned_free;
    b->host_ptr_pinned = gpuarr__cu_host_ptr_pinned;
    b->copy_h2d = gpuarr__cu_copy_h2d;
    b->copy_d2h = gpuarr__cu_copy_d2h;
    b->copy_d2d = gpuarr__cu_copy_d2d;
    b->can_copy_peer = gpuarr__cu_can_copy_peer;
    b->copy_peer = gpuarr__cu_copy_peer;
    b->cast = gpuarr__cu_cast;
    b->fill = gpuarr__cu_fill;
    b->kernel_build = gpuarr__cu_kernel_build;
    b->kernel_launch = gpuarr__cu_kernel_launch;
    b->launch_host_fn = gpuarr__cu_launch_host_fn;
    b->stream_create = gpuarr__cu_stream_create;
    b->stream_destroy = gpuarr__cu_stream_destroy;
    b->stream_sync = gpuarr__cu_stream_sync;
    b->stream_query = gpuarr__cu_stream_query;
    b->stream_wait_event = gpuarr__cu_stream_wait_event;
    b->event_create = gpuarr__cu_event_create;
    b->event_destroy = gpuarr__cu_event_destroy;
    b->event_record = gpuarr__cu_event_record;
    b->event_sync = gpuarr__cu_event_sync;
    b->event_query = gpuarr__cu_event_query;
    b->event_elapsed = gpuarr__cu_event_elapsed;
    b->activate = gpuarr__cu_activate;
    b->deactivate = gpuarr__cu_deactivate;
    b->telemetry = gpuarr__cu_telemetry;
}
#define GPUARR__BACKEND_FILL_CUDA gpuarr__cu_backend_fill

#endif /* GPUARR_CUDA_BACKEND_INCLUDED */
