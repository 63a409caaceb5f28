/*
 * gpuarr_opencl.h -- the OpenCL backend: every device of every platform, through the ICD loader.
 *
 * Included by gpuarr.h's implementation unless GPUARR_NO_OPENCL. The loader (libOpenCL.so.1, or
 * GPUARR_OPENCL_LIBRARY) is opened at run time and its entry points come from one X-macro list;
 * no loader or no platform means zero OpenCL devices, never an error. GPUARR_NO_RUNTIME_LINKING
 * links -lOpenCL instead (then <CL/cl.h> must be on the include path). OpenCL 1.2 is the
 * baseline. The types and constants below are the library's own, checked against <CL/cl.h> by
 * tests/compile/opencl_decls.c.
 *
 * Shape: one context per platform holding its registered devices (so device-to-device copies
 * within a platform are clEnqueueCopyBuffer), an in-order queue per stream (profiling on, for
 * timing events), one program per device with a cast kernel for every dtype pair, built at first
 * use and cached on disk. Each device's global memory is its allocation limit, and buffers are
 * made resident when allocated, so running out shows at allocation, not at first use.
 */
#if !defined(GPUARR_OPENCL_BACKEND_INCLUDED)
#define GPUARR_OPENCL_BACKEND_INCLUDED

#include "../generated/gpuarr_kernels_source.h"

/* ---------------------------------------------------------------------------------------------
 * Declarations (ABI of OpenCL 1.2)
 * ------------------------------------------------------------------------------------------- */
typedef int32_t gpuarr__cl_int;
typedef uint32_t gpuarr__cl_uint;
typedef uint64_t gpuarr__cl_ulong;
typedef uint64_t gpuarr__cl_bitfield;
typedef struct gpuarr__cl_platform_s *gpuarr__cl_platform_id;
typedef struct gpuarr__cl_device_s *gpuarr__cl_device_id;
typedef struct gpuarr__cl_context_s *gpuarr__cl_context;
typedef struct gpuarr__cl_queue_s *gpuarr__cl_command_queue;
typedef struct gpuarr__cl_mem_s *gpuarr__cl_mem;
typedef struct gpuarr__cl_program_s *gpuarr__cl_program;
typedef struct gpuarr__cl_kernel_s *gpuarr__cl_kernel;
typedef struct gpuarr__cl_event_s *gpuarr__cl_event;
typedef intptr_t gpuarr__cl_context_properties;
typedef void (*gpuarr__cl_notify_fn)(const char *, const void *, size_t, void *);
typedef void (*gpuarr__cl_build_fn)(gpuarr__cl_program, void *);
typedef void (*gpuarr__cl_mem_fn)(gpuarr__cl_mem, void *);
typedef void (*gpuarr__cl_event_fn)(gpuarr__cl_event, gpuarr__cl_int, void *);

#define GPUARR__CL_SUCCESS 0
#define GPUARR__CL_MEM_OBJECT_ALLOCATION_FAILURE (-4)
#define GPUARR__CL_OUT_OF_RESOURCES (-5)
#define GPUARR__CL_OUT_OF_HOST_MEMORY (-6)
#define GPUARR__CL_BUILD_PROGRAM_FAILURE (-11)
#define GPUARR__CL_INVALID_BUFFER_SIZE (-61)
#define GPUARR__CL_PLATFORM_NOT_FOUND_KHR (-1001)
#define GPUARR__CL_FALSE 0u
#define GPUARR__CL_TRUE 1u
#define GPUARR__CL_PLATFORM_VERSION 0x0901u
#define GPUARR__CL_PLATFORM_NAME 0x0902u
#define GPUARR__CL_PLATFORM_VENDOR 0x0903u
#define GPUARR__CL_DEVICE_TYPE_CPU (1u << 1)
#define GPUARR__CL_DEVICE_TYPE_GPU (1u << 2)
#define GPUARR__CL_DEVICE_TYPE_ACCELERATOR (1u << 3)
#define GPUARR__CL_DEVICE_TYPE_ALL 0xFFFFFFFFu
#define GPUARR__CL_DEVICE_TYPE 0x1000u
#define GPUARR__CL_DEVICE_MAX_COMPUTE_UNITS 0x1002u
#define GPUARR__CL_DEVICE_MAX_WORK_GROUP_SIZE 0x1004u
#define GPUARR__CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT 0x100Au
#define GPUARR__CL_DEVICE_MAX_CLOCK_FREQUENCY 0x100Cu
#define GPUARR__CL_DEVICE_MAX_MEM_ALLOC_SIZE 0x1010u
#define GPUARR__CL_DEVICE_MEM_BASE_ADDR_ALIGN 0x1019u
#define GPUARR__CL_DEVICE_GLOBAL_MEM_SIZE 0x101Fu
#define GPUARR__CL_DEVICE_SINGLE_FP_CONFIG 0x101Bu
#define GPUARR__CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT (1u << 7)
#define GPUARR__CL_DEVICE_HOST_UNIFIED_MEMORY 0x1035u
#define GPUARR__CL_DEVICE_NAME 0x102Bu
#define GPUARR__CL_DEVICE_VENDOR 0x102Cu
#define GPUARR__CL_DRIVER_VERSION 0x102Du
#define GPUARR__CL_DEVICE_VERSION 0x102Fu
#define GPUARR__CL_DEVICE_EXTENSIONS 0x1030u
#define GPUARR__CL_DEVICE_UUID_KHR 0x106Au
#define GPUARR__CL_DEVICE_PCI_BUS_INFO_KHR 0x410Fu
#define GPUARR__CL_DEVICE_PCI_BUS_ID_NV 0x4008u
#define GPUARR__CL_DEVICE_GLOBAL_FREE_MEMORY_AMD 0x4039u /* size_t[2] in KiB: free in all, largest free block */
#define GPUARR__CL_DEVICE_PCI_SLOT_ID_NV 0x4009u
#define GPUARR__CL_DEVICE_PCI_DOMAIN_ID_NV 0x400Au
#define GPUARR__CL_DEVICE_TOPOLOGY_AMD 0x4037u
#define GPUARR__CL_CONTEXT_PLATFORM 0x1084
#define GPUARR__CL_QUEUE_PROFILING_ENABLE (1u << 1)
#define GPUARR__CL_MEM_READ_WRITE (1u << 0)
#define GPUARR__CL_MEM_USE_HOST_PTR (1u << 3)
#define GPUARR__CL_MEM_ALLOC_HOST_PTR (1u << 4)
#define GPUARR__CL_MAP_READ (1u << 0)
#define GPUARR__CL_MAP_WRITE (1u << 1)
#define GPUARR__CL_MAP_WRITE_INVALIDATE_REGION (1u << 2)
#define GPUARR__CL_MIGRATE_MEM_OBJECT_CONTENT_UNDEFINED (1u << 1)
#define GPUARR__CL_MEM_SIZE 0x1102u
#define GPUARR__CL_BUFFER_CREATE_TYPE_REGION 0x1220u
#define GPUARR__CL_MEM_CONTEXT 0x1106u
#define GPUARR__CL_QUEUE_CONTEXT 0x1090u
#define GPUARR__CL_PROGRAM_BINARY_SIZES 0x1165u
#define GPUARR__CL_PROGRAM_BINARIES 0x1166u
#define GPUARR__CL_PROGRAM_BUILD_LOG 0x1183u
#define GPUARR__CL_KERNEL_WORK_GROUP_SIZE 0x11B0u
#define GPUARR__CL_EVENT_COMMAND_EXECUTION_STATUS 0x11D3u
#define GPUARR__CL_EVENT_CONTEXT 0x11D4u
#define GPUARR__CL_EVENT_COMMAND_QUEUE 0x11D0u
#define GPUARR__CL_COMPLETE 0
#define GPUARR__CL_PROFILING_COMMAND_QUEUED 0x1280u
#define GPUARR__CL_PROFILING_COMMAND_START 0x1282u
#define GPUARR__CL_PROFILING_COMMAND_END 0x1283u

/* ---------------------------------------------------------------------------------------------
 * Entry points: X(return type, name, parameters)
 * ------------------------------------------------------------------------------------------- */
#define GPUARR__CL_PROCS(X)                                                                    \
    X(gpuarr__cl_int, clGetPlatformIDs, (gpuarr__cl_uint, gpuarr__cl_platform_id *, gpuarr__cl_uint *)) \
    X(gpuarr__cl_int, clGetPlatformInfo, (gpuarr__cl_platform_id, gpuarr__cl_uint, size_t, void *, size_t *)) \
    X(gpuarr__cl_int, clGetDeviceIDs,                                                          \
      (gpuarr__cl_platform_id, gpuarr__cl_bitfield, gpuarr__cl_uint, gpuarr__cl_device_id *, gpuarr__cl_uint *)) \
    X(gpuarr__cl_int, clGetDeviceInfo, (gpuarr__cl_device_id, gpuarr__cl_uint, size_t, void *, size_t *)) \
    X(gpuarr__cl_context, clCreateContext,                                                     \
      (const gpuarr__cl_context_properties *, gpuarr__cl_uint, const gpuarr__cl_device_id *,   \
       gpuarr__cl_notify_fn, void *, gpuarr__cl_int *))                                        \
    X(gpuarr__cl_int, clRetainContext, (gpuarr__cl_context))                                   \
    X(gpuarr__cl_int, clReleaseContext, (gpuarr__cl_context))                                  \
    X(gpuarr__cl_int, clGetContextInfo, (gpuarr__cl_context, gpuarr__cl_uint, size_t, void *, size_t *)) \
    X(gpuarr__cl_command_queue, clCreateCommandQueue,                                          \
      (gpuarr__cl_context, gpuarr__cl_device_id, gpuarr__cl_bitfield, gpuarr__cl_int *))       \
    X(gpuarr__cl_int, clRetainCommandQueue, (gpuarr__cl_command_queue))                        \
    X(gpuarr__cl_int, clReleaseCommandQueue, (gpuarr__cl_command_queue))                       \
    X(gpuarr__cl_int, clGetCommandQueueInfo, (gpuarr__cl_command_queue, gpuarr__cl_uint, size_t, void *, size_t *)) \
    X(gpuarr__cl_mem, clCreateBuffer, (gpuarr__cl_context, gpuarr__cl_bitfield, size_t, void *, gpuarr__cl_int *)) \
    X(gpuarr__cl_mem, clCreateSubBuffer,                                                       \
      (gpuarr__cl_mem, gpuarr__cl_bitfield, gpuarr__cl_uint, const void *, gpuarr__cl_int *))   \
    X(gpuarr__cl_int, clRetainMemObject, (gpuarr__cl_mem))                                     \
    X(gpuarr__cl_int, clReleaseMemObject, (gpuarr__cl_mem))                                    \
    X(gpuarr__cl_int, clGetMemObjectInfo, (gpuarr__cl_mem, gpuarr__cl_uint, size_t, void *, size_t *)) \
    X(gpuarr__cl_int, clSetMemObjectDestructorCallback, (gpuarr__cl_mem, gpuarr__cl_mem_fn, void *)) \
    X(gpuarr__cl_int, clEnqueueWriteBuffer,                                                    \
      (gpuarr__cl_command_queue, gpuarr__cl_mem, gpuarr__cl_uint, size_t, size_t, const void *, \
       gpuarr__cl_uint, const gpuarr__cl_event *, gpuarr__cl_event *))                         \
    X(gpuarr__cl_int, clEnqueueReadBuffer,                                                     \
      (gpuarr__cl_command_queue, gpuarr__cl_mem, gpuarr__cl_uint, size_t, size_t, void *,      \
       gpuarr__cl_uint, const gpuarr__cl_event *, gpuarr__cl_event *))                         \
    X(gpuarr__cl_int, clEnqueueCopyBuffer,                                                     \
      (gpuarr__cl_command_queue, gpuarr__cl_mem, gpuarr__cl_mem, size_t, size_t, size_t,       \
       gpuarr__cl_uint, const gpuarr__cl_event *, gpuarr__cl_event *))                         \
    X(gpuarr__cl_int, clEnqueueFillBuffer,                                                     \
      (gpuarr__cl_command_queue, gpuarr__cl_mem, const void *, size_t, size_t, size_t,         \
       gpuarr__cl_uint, const gpuarr__cl_event *, gpuarr__cl_event *))                         \
    X(void *, clEnqueueMapBuffer,                                                              \
      (gpuarr__cl_command_queue, gpuarr__cl_mem, gpuarr__cl_uint, gpuarr__cl_bitfield, size_t, size_t, \
       gpuarr__cl_uint, const gpuarr__cl_event *, gpuarr__cl_event *, gpuarr__cl_int *))       \
    X(gpuarr__cl_int, clEnqueueUnmapMemObject,                                                 \
      (gpuarr__cl_command_queue, gpuarr__cl_mem, void *, gpuarr__cl_uint, const gpuarr__cl_event *, \
       gpuarr__cl_event *))                                                                    \
    X(gpuarr__cl_int, clEnqueueMigrateMemObjects,                                              \
      (gpuarr__cl_command_queue, gpuarr__cl_uint, const gpuarr__cl_mem *, gpuarr__cl_bitfield, \
       gpuarr__cl_uint, const gpuarr__cl_event *, gpuarr__cl_event *))                         \
    X(gpuarr__cl_program, clCreateProgramWithSource,                                           \
      (gpuarr__cl_context, gpuarr__cl_uint, const char **, const size_t *, gpuarr__cl_int *))  \
    X(gpuarr__cl_program, clCreateProgramWithBinary,                                           \
      (gpuarr__cl_context, gpuarr__cl_uint, const gpuarr__cl_device_id *, const size_t *,      \
       const unsigned char **, gpuarr__cl_int *, gpuarr__cl_int *))                            \
    X(gpuarr__cl_int, clBuildProgram,                                                          \
      (gpuarr__cl_program, gpuarr__cl_uint, const gpuarr__cl_device_id *, const char *,        \
       gpuarr__cl_build_fn, void *))                                                           \
    X(gpuarr__cl_int, clGetProgramBuildInfo,                                                   \
      (gpuarr__cl_program, gpuarr__cl_device_id, gpuarr__cl_uint, size_t, void *, size_t *))   \
    X(gpuarr__cl_int, clGetProgramInfo, (gpuarr__cl_program, gpuarr__cl_uint, size_t, void *, size_t *)) \
    X(gpuarr__cl_int, clReleaseProgram, (gpuarr__cl_program))                                  \
    X(gpuarr__cl_kernel, clCreateKernel, (gpuarr__cl_program, const char *, gpuarr__cl_int *)) \
    X(gpuarr__cl_int, clSetKernelArg, (gpuarr__cl_kernel, gpuarr__cl_uint, size_t, const void *)) \
    X(gpuarr__cl_int, clReleaseKernel, (gpuarr__cl_kernel))                                    \
    X(gpuarr__cl_int, clGetKernelWorkGroupInfo,                                                \
      (gpuarr__cl_kernel, gpuarr__cl_device_id, gpuarr__cl_uint, size_t, void *, size_t *))    \
    X(gpuarr__cl_int, clEnqueueNDRangeKernel,                                                  \
      (gpuarr__cl_command_queue, gpuarr__cl_kernel, gpuarr__cl_uint, const size_t *, const size_t *, \
       const size_t *, gpuarr__cl_uint, const gpuarr__cl_event *, gpuarr__cl_event *))        \
    X(gpuarr__cl_int, clEnqueueMarkerWithWaitList,                                             \
      (gpuarr__cl_command_queue, gpuarr__cl_uint, const gpuarr__cl_event *, gpuarr__cl_event *)) \
    X(gpuarr__cl_int, clEnqueueBarrierWithWaitList,                                            \
      (gpuarr__cl_command_queue, gpuarr__cl_uint, const gpuarr__cl_event *, gpuarr__cl_event *)) \
    X(gpuarr__cl_int, clFlush, (gpuarr__cl_command_queue))                                     \
    X(gpuarr__cl_int, clFinish, (gpuarr__cl_command_queue))                                    \
    X(gpuarr__cl_int, clWaitForEvents, (gpuarr__cl_uint, const gpuarr__cl_event *))           \
    X(gpuarr__cl_int, clGetEventInfo, (gpuarr__cl_event, gpuarr__cl_uint, size_t, void *, size_t *)) \
    X(gpuarr__cl_int, clGetEventProfilingInfo, (gpuarr__cl_event, gpuarr__cl_uint, size_t, void *, size_t *)) \
    X(gpuarr__cl_event, clCreateUserEvent, (gpuarr__cl_context, gpuarr__cl_int *))            \
    X(gpuarr__cl_int, clSetUserEventStatus, (gpuarr__cl_event, gpuarr__cl_int))                \
    X(gpuarr__cl_int, clSetEventCallback, (gpuarr__cl_event, gpuarr__cl_int, gpuarr__cl_event_fn, void *)) \
    X(gpuarr__cl_int, clRetainEvent, (gpuarr__cl_event))                                       \
    X(gpuarr__cl_int, clReleaseEvent, (gpuarr__cl_event))

/* ---------------------------------------------------------------------------------------------
 * State (one object, hung off the core's state)
 * ------------------------------------------------------------------------------------------- */
typedef struct gpuarr__cl_platform {
    gpuarr__cl_platform_id id;
    gpuarr__cl_context context; /* made at the first open of one of its devices */
    char version[128];
} gpuarr__cl_platform;

typedef struct gpuarr__cl_device {
    gpuarr__cl_device_id id;
    int platform;
    gpuarr__cl_bitfield type;
    bool fp64, host_unified;
    bool amd_free_memory; /* cl_amd_device_attribute_query: CL_DEVICE_GLOBAL_FREE_MEMORY_AMD */
    size_t host_align; /* CL_DEVICE_MEM_BASE_ADDR_ALIGN in bytes: for CL_MEM_USE_HOST_PTR */
    uint64_t global_mem, max_alloc;
    size_t max_group; /* CL_DEVICE_MAX_WORK_GROUP_SIZE; 0 = not reported */
    unsigned per_item;  /* elements each cast work-item converts: gpuarr__cl_choose_per_item */
    bool half_store;    /* f32->f16 runs use vstore_half8_rte: gpuarr__cl_half_store_exact */
    uint64_t allocated; /* atomic: bytes of live buffers, held against global_mem */
    gpuarr__cl_command_queue internal_queue; /* residency work */
    pthread_mutex_t kernel_lock; /* builds; clSetKernelArg is not thread-safe */
    pthread_mutex_t mem_lock;    /* device-memory buffers made and released one at a time (see
                                    gpuarr__cl_create_buffer) */
    gpuarr_result build_result;  /* a compile error, remembered; OK otherwise */
    char build_error[512];
    gpuarr__cl_program programs[GPUARR_DTYPE_COUNT][GPUARR_DTYPE_COUNT]; /* one per pair, at first use */
    gpuarr__cl_kernel casts[GPUARR_DTYPE_COUNT][GPUARR_DTYPE_COUNT];
    size_t local_sizes[GPUARR_DTYPE_COUNT][GPUARR_DTYPE_COUNT]; /* each cast kernel's work-group size */
    struct gpuarr__cl_user_kernel *user_kernels; /* portable kernels built here (kernel_lock) */
    bool fp32_rounded; /* CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT: float / and sqrt correctly rounded on request */
    size_t base_align; /* CL_DEVICE_MEM_BASE_ADDR_ALIGN in bytes: where sub-buffers may start */
    bool adopted;      /* made of the caller's context (its platform row holds that context) */
    gpuarr__cl_command_queue adopted_queue; /* the caller's queue for default streams, retained; or NULL */
} gpuarr__cl_device;

typedef struct gpuarr__cl_state {
    void *library;
#define GPUARR__CL_PROC_MEMBER(ret, name, params) ret(*name) params;
    GPUARR__CL_PROCS(GPUARR__CL_PROC_MEMBER)
#undef GPUARR__CL_PROC_MEMBER
    pthread_mutex_t context_lock;
    pthread_mutex_t build_lock; /* one program build at a time, process-wide: drivers' compilers
                                   (PoCL's LLVM) are not all safe to run concurrently */
    int platform_count, device_count; /* found by load, then a row of each per adopted device */
    int found_devices;                /* device_count at load */
    gpuarr__cl_platform *platforms;   /* room for GPUARR__ADOPT_MAX more rows: they never move */
    gpuarr__cl_device *devices;       /* the same */
    uint32_t host_calls; /* atomic: host functions handed to the driver and not yet finished */
} gpuarr__cl_state;

/* The native event: the marker of its latest record. */
typedef struct gpuarr__cl_event_box {
    gpuarr__cl_event event;
} gpuarr__cl_event_box;

/* The native stream: an in-order queue and the event of the last command put on it, so that
   "has everything enqueued so far completed" has an exact answer. */
struct gpuarr__cl_stream {
    gpuarr__cl_command_queue queue;
    pthread_mutex_t lock;  /* guards last */
    gpuarr__cl_event last; /* NULL = nothing enqueued yet */
};

#define GPUARR__CL (*(gpuarr__cl_state *)gpuarr__g.backend_state[GPUARR_BACKEND_OPENCL])
#define GPUARR__CL_DEV(d) (&GPUARR__CL.devices[(d)->info.index])
#define GPUARR__CL_STREAM(native) ((gpuarr__cl_stream *)(native))
#define GPUARR__CL_QUEUE(s) (GPUARR__CL_STREAM((s)->native)->queue)
#define GPUARR__CL_LAST(s) GPUARR__CL_STREAM((s)->native)

static const char *gpuarr__cl_error_name(gpuarr__cl_int e) {
    switch (e) {
    case -1: return "CL_DEVICE_NOT_FOUND";
    case -2: return "CL_DEVICE_NOT_AVAILABLE";
    case -3: return "CL_COMPILER_NOT_AVAILABLE";
    case -4: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case -5: return "CL_OUT_OF_RESOURCES";
    case -6: return "CL_OUT_OF_HOST_MEMORY";
    case -11: return "CL_BUILD_PROGRAM_FAILURE";
    case -30: return "CL_INVALID_VALUE";
    case -34: return "CL_INVALID_CONTEXT";
    case -36: return "CL_INVALID_COMMAND_QUEUE";
    case -38: return "CL_INVALID_MEM_OBJECT";
    case -48: return "CL_INVALID_KERNEL";
    case -52: return "CL_INVALID_KERNEL_ARGS";
    case -54: return "CL_INVALID_WORK_GROUP_SIZE";
    case -58: return "CL_INVALID_EVENT";
    case -61: return "CL_INVALID_BUFFER_SIZE";
    case -1001: return "CL_PLATFORM_NOT_FOUND_KHR";
    default: return "OpenCL error";
    }
}

/* Maps an OpenCL error to a result, with the call named in the message. CL_DEVICE_NOT_AVAILABLE
   from a call on a device (where names it) means the device is gone: it fails the device
   (GPUARR_ERROR_DEVICE_LOST). Running out of resources does not. */
static gpuarr_result gpuarr__cl_fail(gpuarr__cl_int e, const char *call, const char *where) {
    gpuarr__dev *lost = e == -2 ? gpuarr__dev_by_spec(where) : NULL;
    if (lost) { /* the entry point's name, out of "cl->clFinish(q)" too */
        const char *arrow = strstr(call, "->"), *name = arrow ? arrow + 2 : call;
        char entry[64];
        snprintf(entry, sizeof entry, "%.*s", (int)strcspn(name, "("), name);
        gpuarr__dev_mark_failed(lost, "CL_DEVICE_NOT_AVAILABLE", entry);
        return gpuarr__fail(GPUARR_ERROR_DEVICE_LOST, "%s: %s failed: CL_DEVICE_NOT_AVAILABLE (-2); %s is lost (failed: %s) until gpuarr_device_reset",
                            where, call, where, lost->failure);
    }
    gpuarr_result r = (e == GPUARR__CL_MEM_OBJECT_ALLOCATION_FAILURE || e == GPUARR__CL_OUT_OF_HOST_MEMORY ||
                       e == GPUARR__CL_OUT_OF_RESOURCES || e == GPUARR__CL_INVALID_BUFFER_SIZE)
                          ? GPUARR_ERROR_OUT_OF_MEMORY
                          : GPUARR_ERROR_BACKEND;
    return gpuarr__fail(r, "%s: %s failed: %s (%d)", where, call, gpuarr__cl_error_name(e), (int)e);
}
typedef struct gpuarr__cl_stream gpuarr__cl_stream;
/* Keeps ev as the stream's last command (the previous one is released). */
static void gpuarr__cl_track(gpuarr__cl_stream *st, gpuarr__cl_event ev);
#define GPUARR__CL_CHECK(expr, where)                                                          \
    do {                                                                                       \
        gpuarr__cl_int gpuarr__e = (expr);                                                     \
        if (gpuarr__e != GPUARR__CL_SUCCESS) return gpuarr__cl_fail(gpuarr__e, #expr, where);  \
    } while (0)

/* ---------------------------------------------------------------------------------------------
 * Loading
 * ------------------------------------------------------------------------------------------- */
#ifdef GPUARR_NO_RUNTIME_LINKING
#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include <CL/cl.h>
/* The addresses of the linked functions, bit-copied into the table (the official prototypes use
   the official handle types). clCreateCommandQueue is deprecated after 1.2 but it is the 1.2 API. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static gpuarr_result gpuarr__cl_bind(gpuarr__cl_state *cl) {
    void (*fp)(void);
#define GPUARR__CL_BIND_STATIC(ret, name, params)                                              \
    fp = (void (*)(void))&name;                                                                \
    memcpy(&cl->name, &fp, sizeof fp);
    GPUARR__CL_PROCS(GPUARR__CL_BIND_STATIC)
#undef GPUARR__CL_BIND_STATIC
    return GPUARR_OK;
}
#pragma GCC diagnostic pop
#else
static gpuarr_result gpuarr__cl_bind(gpuarr__cl_state *cl) {
    /* The loader stays resident after dlclose: drivers register exit handlers and keep state,
       and unloading them mid-process is not safe. */
#ifdef RTLD_NODELETE
    const int flags = RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE;
#else
    const int flags = RTLD_NOW | RTLD_LOCAL;
#endif
    const char *path = gpuarr__setting(GPUARR__SET_OPENCL_LIBRARY);
    cl->library = dlopen(path ? path : "libOpenCL.so.1", flags);
    if (!cl->library && !path) cl->library = dlopen("libOpenCL.so", flags);
    if (!cl->library) /* the reason reaches gpuarr-info and device_find's errors */
        return gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "cannot load %s%s: %s", path ? path : "libOpenCL.so.1 or libOpenCL.so",
                            path ? " (GPUARR_OPENCL_LIBRARY)" : "", dlerror());
    /* dlsym returns an object pointer; copying its bits into the function pointer is the
       portable way that ISO C accepts. */
#define GPUARR__CL_BIND_DYNAMIC(ret, name, params)                                             \
    {                                                                                          \
        void *sym = dlsym(cl->library, #name);                                                 \
        if (!sym)                                                                              \
            return gpuarr__fail(GPUARR_ERROR_BACKEND, "the OpenCL loader lacks %s (OpenCL 1.2 is needed)", #name); \
        memcpy(&cl->name, &sym, sizeof sym);                                                   \
    }
    GPUARR__CL_PROCS(GPUARR__CL_BIND_DYNAMIC)
#undef GPUARR__CL_BIND_DYNAMIC
    return GPUARR_OK;
}
#endif

static bool gpuarr__cl_has_extension(gpuarr__cl_state *cl, gpuarr__cl_device_id id, const char *ext) {
    size_t size = 0;
    if (cl->clGetDeviceInfo(id, GPUARR__CL_DEVICE_EXTENSIONS, 0, NULL, &size) != GPUARR__CL_SUCCESS || !size) return false;
    char *list = (char *)gpuarr__malloc(size + 1);
    if (!list) return false;
    bool found = false;
    if (cl->clGetDeviceInfo(id, GPUARR__CL_DEVICE_EXTENSIONS, size, list, NULL) == GPUARR__CL_SUCCESS) {
        list[size] = '\0';
        size_t n = strlen(ext);
        for (const char *p = strstr(list, ext); p && !found; p = strstr(p + 1, ext))
            found = (p == list || p[-1] == ' ') && (p[n] == '\0' || p[n] == ' ');
    }
    gpuarr__free(list);
    return found;
}

static void gpuarr__cl_unload(void) {
    gpuarr__cl_state *cl = (gpuarr__cl_state *)gpuarr__g.backend_state[GPUARR_BACKEND_OPENCL];
    if (!cl) return;
    /* a host function whose gate is open may still be returning from the driver's calls */
    while (__atomic_load_n(&cl->host_calls, __ATOMIC_ACQUIRE)) sched_yield();
    for (int i = 0; i < cl->device_count; i++) {
        pthread_mutex_destroy(&cl->devices[i].kernel_lock);
        pthread_mutex_destroy(&cl->devices[i].mem_lock);
    }
    for (int i = 0; i < cl->platform_count; i++)
        if (cl->platforms[i].context) cl->clReleaseContext(cl->platforms[i].context);
    pthread_mutex_destroy(&cl->context_lock);
    pthread_mutex_destroy(&cl->build_lock);
#ifndef GPUARR_NO_RUNTIME_LINKING
    if (cl->library) dlclose(cl->library);
#endif
    gpuarr__free(cl->devices);
    gpuarr__free(cl->platforms);
    gpuarr__free(cl);
    gpuarr__g.backend_state[GPUARR_BACKEND_OPENCL] = NULL;
}

/* Records every device of every platform, in platform order then device order. */
static gpuarr_result gpuarr__cl_enumerate(gpuarr__cl_state *cl) {
    gpuarr__cl_uint np = 0;
    gpuarr__cl_int e = cl->clGetPlatformIDs(0, NULL, &np);
    if (e == GPUARR__CL_PLATFORM_NOT_FOUND_KHR || np == 0) return GPUARR_OK; /* loader without drivers */
    if (e != GPUARR__CL_SUCCESS) return gpuarr__cl_fail(e, "clGetPlatformIDs", "listing OpenCL platforms");
    gpuarr__cl_platform_id *ids = (gpuarr__cl_platform_id *)gpuarr__calloc(sizeof *ids * np);
    cl->platforms = (gpuarr__cl_platform *)gpuarr__calloc(sizeof *cl->platforms * (np + GPUARR__ADOPT_MAX));
    if (!ids || !cl->platforms) {
        gpuarr__free(ids);
        return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for the OpenCL platform list");
    }
    e = cl->clGetPlatformIDs(np, ids, NULL);
    gpuarr__cl_uint total = 0;
    for (gpuarr__cl_uint p = 0; e == GPUARR__CL_SUCCESS && p < np; p++) {
        gpuarr__cl_uint nd = 0;
        if (cl->clGetDeviceIDs(ids[p], GPUARR__CL_DEVICE_TYPE_ALL, 0, NULL, &nd) == GPUARR__CL_SUCCESS) total += nd;
    }
    cl->devices = (gpuarr__cl_device *)gpuarr__calloc(sizeof *cl->devices * (total + GPUARR__ADOPT_MAX));
    if (!cl->devices) {
        gpuarr__free(ids);
        return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for the OpenCL device list");
    }
    for (gpuarr__cl_uint p = 0; e == GPUARR__CL_SUCCESS && p < np; p++) {
        gpuarr__cl_platform *pl = &cl->platforms[cl->platform_count++];
        pl->id = ids[p];
        cl->clGetPlatformInfo(ids[p], GPUARR__CL_PLATFORM_VERSION, sizeof pl->version - 1, pl->version, NULL);
        gpuarr__cl_uint nd = 0;
        if (cl->clGetDeviceIDs(ids[p], GPUARR__CL_DEVICE_TYPE_ALL, 0, NULL, &nd) != GPUARR__CL_SUCCESS || !nd) continue;
        if ((gpuarr__cl_uint)cl->device_count + nd > total) nd = total - (gpuarr__cl_uint)cl->device_count;
        gpuarr__cl_device_id dev_ids[64];
        nd = GPUARR__MIN(nd, 64u);
        if (cl->clGetDeviceIDs(ids[p], GPUARR__CL_DEVICE_TYPE_ALL, nd, dev_ids, NULL) != GPUARR__CL_SUCCESS) continue;
        for (gpuarr__cl_uint k = 0; k < nd; k++) {
            gpuarr__cl_device *d = &cl->devices[cl->device_count++];
            d->id = dev_ids[k];
            d->platform = cl->platform_count - 1;
            pthread_mutex_init(&d->kernel_lock, NULL);
            pthread_mutex_init(&d->mem_lock, NULL);
        }
    }
    gpuarr__free(ids);
    cl->found_devices = cl->device_count;
    return e == GPUARR__CL_SUCCESS ? GPUARR_OK : gpuarr__cl_fail(e, "clGetPlatformIDs", "listing OpenCL platforms");
}

static gpuarr_result gpuarr__cl_load(void) {
    gpuarr__cl_state *cl = (gpuarr__cl_state *)gpuarr__calloc(sizeof *cl);
    if (!cl) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for the OpenCL backend");
    pthread_mutex_init(&cl->context_lock, NULL);
    pthread_mutex_init(&cl->build_lock, NULL);
    gpuarr__g.backend_state[GPUARR_BACKEND_OPENCL] = cl;
    gpuarr_result r = gpuarr__cl_bind(cl);
    if (r == GPUARR_OK) r = gpuarr__cl_enumerate(cl);
    if (r != GPUARR_OK) gpuarr__cl_unload();
    return r;
}

static int gpuarr__cl_device_count(void) {
    gpuarr__cl_state *cl = (gpuarr__cl_state *)gpuarr__g.backend_state[GPUARR_BACKEND_OPENCL];
    return cl ? __atomic_load_n(&cl->device_count, __ATOMIC_ACQUIRE) : 0;
}

/* ---------------------------------------------------------------------------------------------
 * Device properties
 * ------------------------------------------------------------------------------------------- */
/* OpenCL refuses a buffer shorter than the value, so read it whole and truncate. */
static void gpuarr__cl_info_string(gpuarr__cl_device_id id, gpuarr__cl_uint what, char *out, size_t cap) {
    size_t size = 0;
    out[0] = '\0';
    if (GPUARR__CL.clGetDeviceInfo(id, what, 0, NULL, &size) != GPUARR__CL_SUCCESS || !size) return;
    char *all = (char *)gpuarr__malloc(size + 1);
    if (!all) return;
    if (GPUARR__CL.clGetDeviceInfo(id, what, size, all, NULL) == GPUARR__CL_SUCCESS) {
        all[size] = '\0';
        gpuarr__copy_string(out, cap, all);
    }
    gpuarr__free(all);
}

static uint64_t gpuarr__cl_info_u64(gpuarr__cl_device_id id, gpuarr__cl_uint what) {
    gpuarr__cl_ulong v = 0;
    if (GPUARR__CL.clGetDeviceInfo(id, what, sizeof v, &v, NULL) != GPUARR__CL_SUCCESS) v = 0;
    return v;
}

static uint32_t gpuarr__cl_info_u32(gpuarr__cl_device_id id, gpuarr__cl_uint what) {
    gpuarr__cl_uint v = 0;
    if (GPUARR__CL.clGetDeviceInfo(id, what, sizeof v, &v, NULL) != GPUARR__CL_SUCCESS) v = 0;
    return v;
}

/* PCI address: cl_khr_pci_bus_info, else the NVIDIA or AMD vendor queries. */
static void gpuarr__cl_pci_info(gpuarr__cl_device_id id, gpuarr_device_info *info) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    if (gpuarr__cl_has_extension(cl, id, "cl_khr_pci_bus_info")) {
        gpuarr__cl_uint pci[4];
        if (cl->clGetDeviceInfo(id, GPUARR__CL_DEVICE_PCI_BUS_INFO_KHR, sizeof pci, pci, NULL) == GPUARR__CL_SUCCESS) {
            info->has_pci = true;
            info->pci_domain = (int)pci[0], info->pci_bus = (int)pci[1], info->pci_device = (int)pci[2], info->pci_function = (int)pci[3];
        }
    } else if (gpuarr__cl_has_extension(cl, id, "cl_nv_device_attribute_query")) {
        gpuarr__cl_uint bus = 0, slot = 0, domain = 0;
        if (cl->clGetDeviceInfo(id, GPUARR__CL_DEVICE_PCI_BUS_ID_NV, sizeof bus, &bus, NULL) == GPUARR__CL_SUCCESS &&
            cl->clGetDeviceInfo(id, GPUARR__CL_DEVICE_PCI_SLOT_ID_NV, sizeof slot, &slot, NULL) == GPUARR__CL_SUCCESS) {
            cl->clGetDeviceInfo(id, GPUARR__CL_DEVICE_PCI_DOMAIN_ID_NV, sizeof domain, &domain, NULL);
            info->has_pci = true;
            info->pci_domain = (int)domain, info->pci_bus = (int)bus, info->pci_device = (int)(slot >> 3), info->pci_function = (int)(slot & 7u);
        }
    } else if (gpuarr__cl_has_extension(cl, id, "cl_amd_device_attribute_query")) {
        unsigned char topo[24]; /* cl_device_topology_amd: cl_uint type (1 = PCIe), 17 bytes, bus, device, function */
        gpuarr__cl_uint kind = 0;
        if (cl->clGetDeviceInfo(id, GPUARR__CL_DEVICE_TOPOLOGY_AMD, sizeof topo, topo, NULL) == GPUARR__CL_SUCCESS &&
            (memcpy(&kind, topo, sizeof kind), kind == 1u)) {
            info->has_pci = true;
            info->pci_bus = topo[21], info->pci_device = topo[22], info->pci_function = topo[23];
        }
    }
    if (info->has_pci)
        snprintf(info->pci_bus_id, sizeof info->pci_bus_id, "%04x:%02x:%02x.%x", (unsigned)info->pci_domain & 0xffffu,
                 (unsigned)info->pci_bus & 0xffu, (unsigned)info->pci_device & 0xffu, (unsigned)info->pci_function & 7u);
}

/* Elements per work-item of the cast kernels (GPUARR_K_PER_ITEM in gpuarr_kernels.h).
   GPUs: 1, so a warp's accesses stay coalesced (neighbouring work-items, neighbouring elements).
   CPUs (PoCL): a contiguous run per work-item, which the kernel compiler turns into vector loads,
   converts and stores (vcvtps2pd on ymm for f32->f64 on pthread-haswell); two of the device's
   preferred f32 vectors (16 with AVX2), between 8 and 16. The local size stays 256
   (gpuarr__cl_local_size): a work-group then covers 4096 elements. Measured on PoCL 3.1,
   pthread-haswell, 2 Zen 3 cores, 64 MiB source, kernel time as a fraction of memcpy's rate
   (medians of 5 alternated runs): 1 per work-item 0.71 / 0.62 / 0.31 (f32->f64 / f64->f32 /
   f32->f16); 8: 1.25 / 1.22 / 0.94; 16: 1.21 / 1.32 / 1.01; 32: 1.25 / 1.33 / 0.98; 64 no better;
   local sizes 64 and 1024 no better than 256. Not measured on a GPU: there 1 is the usual choice.
   Wider runs gained nothing, and the half store below needs a multiple of 8. */
static unsigned gpuarr__cl_choose_per_item(const gpuarr__cl_device *d) {
    if (!(d->type & GPUARR__CL_DEVICE_TYPE_CPU)) return 1;
    unsigned width = (unsigned)gpuarr__cl_info_u32(d->id, GPUARR__CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT);
    return GPUARR__MIN(GPUARR__MAX(2u * width, 8u), 16u);
}

/* Whether f32->f16 runs may use OpenCL's vstore_half8_rte instead of gpuarr's integer rounding:
   only on PoCL's CPU devices, where it compiles to the F16C conversion and gives the same bits
   as gpuarr_k_f32_to_f16 (NaN payloads included; test_casts checks every route on opencl:0),
   and was 1.35x faster (f32->f16 0.84 -> 1.17 of memcpy, medians of 5 alternated runs). Other
   drivers' half stores are not known to keep NaN payloads: they keep the integer rounding. */
static bool gpuarr__cl_half_store_exact(const gpuarr__cl_device *d, const char *version) {
    return d->per_item % 8 == 0 && (d->type & GPUARR__CL_DEVICE_TYPE_CPU) && strstr(version, "PoCL") != NULL;
}

static gpuarr_result gpuarr__cl_device_info(int index, gpuarr_device_info *info) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    gpuarr__cl_device *d = &cl->devices[index];
    gpuarr__cl_bitfield type = gpuarr__cl_info_u64(d->id, GPUARR__CL_DEVICE_TYPE);
    d->type = type;
    info->type = (type & GPUARR__CL_DEVICE_TYPE_GPU)           ? GPUARR_DEVICE_TYPE_GPU
                 : (type & GPUARR__CL_DEVICE_TYPE_ACCELERATOR) ? GPUARR_DEVICE_TYPE_ACCELERATOR
                 : (type & GPUARR__CL_DEVICE_TYPE_CPU)         ? GPUARR_DEVICE_TYPE_CPU
                                                               : GPUARR_DEVICE_TYPE_UNKNOWN;
    gpuarr__cl_info_string(d->id, GPUARR__CL_DEVICE_NAME, info->name, sizeof info->name);
    gpuarr__cl_info_string(d->id, GPUARR__CL_DEVICE_VENDOR, info->vendor, sizeof info->vendor);
    char device_version[80], driver[40];
    gpuarr__cl_info_string(d->id, GPUARR__CL_DEVICE_VERSION, device_version, sizeof device_version);
    gpuarr__cl_info_string(d->id, GPUARR__CL_DRIVER_VERSION, driver, sizeof driver);
    snprintf(info->version, sizeof info->version, "%.79s, driver %.39s", device_version, driver);
    info->compute_units = (int)gpuarr__cl_info_u32(d->id, GPUARR__CL_DEVICE_MAX_COMPUTE_UNITS);
    info->clock_mhz = (int)gpuarr__cl_info_u32(d->id, GPUARR__CL_DEVICE_MAX_CLOCK_FREQUENCY);
    /* the sizes allocations are held against: without them the device is left out (a zero would
       refuse every allocation as out of memory, naming no call) */
    gpuarr__cl_ulong global_mem = 0, max_alloc = 0;
    gpuarr__cl_int e = cl->clGetDeviceInfo(d->id, GPUARR__CL_DEVICE_GLOBAL_MEM_SIZE, sizeof global_mem, &global_mem, NULL);
    if (e == GPUARR__CL_SUCCESS) e = cl->clGetDeviceInfo(d->id, GPUARR__CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL);
    if (e != GPUARR__CL_SUCCESS) return gpuarr__cl_fail(e, "clGetDeviceInfo", "reading an OpenCL device's memory sizes");
    d->global_mem = global_mem;
    d->max_alloc = max_alloc;
    if (cl->clGetDeviceInfo(d->id, GPUARR__CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof d->max_group, &d->max_group, NULL) != GPUARR__CL_SUCCESS)
        d->max_group = 0;
    d->per_item = gpuarr__cl_choose_per_item(d);
    d->half_store = gpuarr__cl_half_store_exact(d, info->version);
    info->total_memory = d->global_mem;
    info->free_memory = d->global_mem;
    info->max_alloc_bytes = d->max_alloc;
    /* GPUARR_OPENCL_UNIFIED=off handles every device as discrete (own memory, staged copies):
       how PoCL tests the paths a discrete GPU takes. */
    d->host_unified = gpuarr__cl_info_u32(d->id, GPUARR__CL_DEVICE_HOST_UNIFIED_MEMORY) != 0 &&
                      gpuarr__setting_value(GPUARR__SET_OPENCL_UNIFIED, 1);
    /* one query (GPUARR__MAX evaluates its arguments twice: a second query that failed made it 0) */
    size_t base_align = (size_t)gpuarr__cl_info_u32(d->id, GPUARR__CL_DEVICE_MEM_BASE_ADDR_ALIGN) / 8u;
    d->host_align = GPUARR__MAX((size_t)64, base_align);
    d->base_align = GPUARR__MAX((size_t)1, base_align);
    info->host_unified = d->host_unified;
    /* GPUARR_OPENCL_FP64=off treats every device as lacking doubles (slow or emulated fp64). */
    d->fp64 = gpuarr__setting_value(GPUARR__SET_OPENCL_FP64, 1) && gpuarr__cl_has_extension(cl, d->id, "cl_khr_fp64");
    d->fp32_rounded = (gpuarr__cl_info_u64(d->id, GPUARR__CL_DEVICE_SINGLE_FP_CONFIG) & GPUARR__CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT) != 0;
    if (gpuarr__cl_has_extension(cl, d->id, "cl_khr_device_uuid") &&
        cl->clGetDeviceInfo(d->id, GPUARR__CL_DEVICE_UUID_KHR, sizeof info->uuid, info->uuid, NULL) == GPUARR__CL_SUCCESS)
        info->has_uuid = true;
    gpuarr__cl_pci_info(d->id, info);
    d->amd_free_memory = gpuarr__cl_has_extension(cl, d->id, "cl_amd_device_attribute_query");
    return GPUARR_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Contexts and queues
 * ------------------------------------------------------------------------------------------- */
/* The context's error callback (pfn_notify): OpenCL does not say which of the context's devices
   the error is about, so every open device of the platform fails, with the driver's words. May run
   on a driver thread. */
static void gpuarr__cl_context_error(const char *errinfo, const void *private_info, size_t cb, void *user) {
    GPUARR__UNUSED(private_info);
    GPUARR__UNUSED(cb);
    int platform = (int)(intptr_t)user;
    char what[200];
    snprintf(what, sizeof what, "the OpenCL context reported \"%s\"", errinfo ? errinfo : "");
    for (int i = 0; i < gpuarr__g.device_count; i++) {
        gpuarr__dev *d = &gpuarr__g.devices[i];
        if (d->backend->id == GPUARR_BACKEND_OPENCL && GPUARR__CL_DEV(d)->platform == platform && __atomic_load_n(&d->opened, __ATOMIC_ACQUIRE))
            gpuarr__dev_mark_failed(d, what, "its context error callback");
    }
}

/* One context per platform with all of its devices that GPUARR_DEVICES lets in. */
static gpuarr_result gpuarr__cl_platform_context(int platform, gpuarr__cl_context *out) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    pthread_mutex_lock(&cl->context_lock);
    gpuarr__cl_platform *pl = &cl->platforms[platform];
    gpuarr_result r = GPUARR_OK;
    if (!pl->context) {
        gpuarr__cl_device_id ids[64];
        gpuarr__cl_uint n = 0;
        for (int i = 0; i < cl->found_devices && n < 64; i++) /* adopted devices have contexts of their own */
            if (cl->devices[i].platform == platform && gpuarr__filter_allows(GPUARR_BACKEND_OPENCL, i)) ids[n++] = cl->devices[i].id;
        gpuarr__cl_context_properties props[3] = {GPUARR__CL_CONTEXT_PLATFORM, (gpuarr__cl_context_properties)pl->id, 0};
        gpuarr__cl_int e = GPUARR__CL_SUCCESS;
        pl->context = cl->clCreateContext(props, n, ids, gpuarr__cl_context_error, (void *)(intptr_t)platform, &e);
        if (!pl->context) r = gpuarr__cl_fail(e, "clCreateContext", "opening an OpenCL device");
    }
    *out = pl->context;
    pthread_mutex_unlock(&cl->context_lock);
    return r;
}

static gpuarr_result gpuarr__cl_new_queue(gpuarr__dev *d, gpuarr__cl_command_queue *out) {
    gpuarr__cl_device *cd = GPUARR__CL_DEV(d);
    gpuarr__cl_int e = GPUARR__CL_SUCCESS;
    gpuarr__cl_context ctx = GPUARR__CL.platforms[cd->platform].context;
    *out = GPUARR__CL.clCreateCommandQueue(ctx, cd->id, GPUARR__CL_QUEUE_PROFILING_ENABLE, &e);
    if (!*out) return gpuarr__cl_fail(e, "clCreateCommandQueue", d->info.spec);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__cl_device_open(gpuarr__dev *d) {
    gpuarr__cl_device *cd = GPUARR__CL_DEV(d);
    gpuarr__cl_context ctx;
    GPUARR__CHECK(gpuarr__cl_platform_context(cd->platform, &ctx));
    GPUARR__CHECK(gpuarr__cl_new_queue(d, &cd->internal_queue));
    d->native = cd;
    return GPUARR_OK;
}

static void gpuarr__cl_user_kernels_free(gpuarr__cl_device *cd);

static void gpuarr__cl_device_close(gpuarr__dev *d) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    gpuarr__cl_device *cd = GPUARR__CL_DEV(d);
    for (int s = 0; s < GPUARR_DTYPE_COUNT; s++)
        for (int t = 0; t < GPUARR_DTYPE_COUNT; t++) {
            if (cd->casts[s][t]) cl->clReleaseKernel(cd->casts[s][t]);
            if (cd->programs[s][t]) cl->clReleaseProgram(cd->programs[s][t]);
        }
    if (cd->internal_queue) cl->clReleaseCommandQueue(cd->internal_queue);
    memset(cd->casts, 0, sizeof cd->casts);
    memset(cd->programs, 0, sizeof cd->programs);
    gpuarr__cl_user_kernels_free(cd);
    cd->internal_queue = NULL;
    cd->build_result = GPUARR_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Memory
 * ------------------------------------------------------------------------------------------- */
static gpuarr_result gpuarr__cl_mem_info(gpuarr__dev *d, uint64_t *free_bytes, uint64_t *total_bytes) {
    gpuarr__cl_device *cd = GPUARR__CL_DEV(d);
    uint64_t used = GPUARR__ATOMIC_LOAD(&cd->allocated);
    uint64_t avail = cd->global_mem > used ? cd->global_mem - used : 0;
    if (cd->host_unified) { /* it shares the host's memory: it cannot have more free than the host */
        uint64_t host_free = 0, host_total = 0;
        gpuarr__host_mem_info(NULL, &host_free, &host_total);
        if (host_free && host_free < avail) avail = host_free;
    }
    *free_bytes = avail;
    *total_bytes = cd->global_mem;
    return GPUARR_OK;
}

static gpuarr_result gpuarr__cl_make_resident(gpuarr__dev *d, gpuarr__cl_mem mem) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    gpuarr__cl_device *cd = GPUARR__CL_DEV(d);
    gpuarr__cl_event ev = NULL;
    GPUARR__CL_CHECK(cl->clEnqueueMigrateMemObjects(cd->internal_queue, 1, &mem, GPUARR__CL_MIGRATE_MEM_OBJECT_CONTENT_UNDEFINED, 0, NULL, &ev), d->info.spec);
    gpuarr__cl_int e = cl->clWaitForEvents(1, &ev);
    cl->clReleaseEvent(ev);
    if (e != GPUARR__CL_SUCCESS) return gpuarr__cl_fail(e, "clEnqueueMigrateMemObjects", d->info.spec);
    return GPUARR_OK;
}

/* Host-unified devices (PoCL, integrated GPUs) use memory gpuarr allocates itself, aligned for
   the device and on huge pages, as CL_MEM_USE_HOST_PTR: mapping is then free and copies run on
   all the host's threads. OpenCL calls back when it has let go of the memory; it is freed then. */
static void gpuarr__cl_free_host_block(gpuarr__cl_mem mem, void *block) {
    GPUARR__UNUSED(mem);
    gpuarr__aligned_free(block);
}

static gpuarr_result gpuarr__cl_create_buffer(gpuarr__dev *d, size_t bytes, gpuarr__cl_mem *out) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    gpuarr__cl_device *cd = GPUARR__CL_DEV(d);
    gpuarr__cl_context ctx = cl->platforms[cd->platform].context;
    gpuarr__cl_int e = GPUARR__CL_SUCCESS;
    if (!cd->host_unified) {
        /* One at a time per device, as their release: NVIDIA's OpenCL (driver 580.159.04, H100)
           crashed in a thread of its own when threads made and released buffers at once */
        pthread_mutex_lock(&cd->mem_lock);
        *out = cl->clCreateBuffer(ctx, GPUARR__CL_MEM_READ_WRITE, bytes, NULL, &e);
        gpuarr_result r = *out ? gpuarr__cl_make_resident(d, *out) /* out of memory shows now, not at first use */
                               : gpuarr__cl_fail(e, "clCreateBuffer", d->info.spec);
        pthread_mutex_unlock(&cd->mem_lock);
        return r;
    }
    uint64_t host_free = 0, host_total = 0;
    gpuarr__host_mem_info(NULL, &host_free, &host_total);
    if (host_free && bytes > host_free)
        return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "%s: %zu bytes requested, the host (whose memory it uses) has %llu available",
                            d->info.spec, bytes, (unsigned long long)host_free);
    void *block = gpuarr__aligned_malloc(bytes, cd->host_align);
    if (!block) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "%s: no host memory for %zu bytes", d->info.spec, bytes);
    gpuarr__advise_huge_pages(block, bytes);
    *out = cl->clCreateBuffer(ctx, GPUARR__CL_MEM_READ_WRITE | GPUARR__CL_MEM_USE_HOST_PTR, bytes, block, &e);
    if (!*out) {
        gpuarr__aligned_free(block);
        return gpuarr__cl_fail(e, "clCreateBuffer", d->info.spec);
    }
    e = cl->clSetMemObjectDestructorCallback(*out, gpuarr__cl_free_host_block, block);
    if (e != GPUARR__CL_SUCCESS) { /* cannot know when it is unused: do not hand it out */
        cl->clReleaseMemObject(*out); /* no command ever used it: the memory is free once it is released */
        gpuarr__aligned_free(block);
        *out = NULL;
        return gpuarr__cl_fail(e, "clSetMemObjectDestructorCallback", d->info.spec);
    }
    return GPUARR_OK;
}

static gpuarr_result gpuarr__cl_mem_alloc(gpuarr__dev *d, size_t bytes, void **mem) {
    gpuarr__cl_device *cd = GPUARR__CL_DEV(d);
    if (bytes > cd->max_alloc)
        return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY,
                            "%s: %zu bytes requested, above the device's largest allocation "
                            "(CL_DEVICE_MAX_MEM_ALLOC_SIZE = %llu bytes)",
                            d->info.spec, bytes, (unsigned long long)cd->max_alloc);
    uint64_t used = __atomic_add_fetch(&cd->allocated, (uint64_t)bytes, __ATOMIC_ACQ_REL);
    if (used > cd->global_mem) {
        __atomic_sub_fetch(&cd->allocated, (uint64_t)bytes, __ATOMIC_ACQ_REL);
        return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY,
                            "%s: %zu bytes requested, %llu of the device's %llu bytes available "
                            "(its global memory is the limit)",
                            d->info.spec, bytes, (unsigned long long)(cd->global_mem - GPUARR__MIN(cd->global_mem, used - bytes)),
                            (unsigned long long)cd->global_mem);
    }
    gpuarr__cl_mem m = NULL;
    gpuarr_result r = gpuarr__cl_create_buffer(d, bytes, &m);
    if (r != GPUARR_OK) {
        if (m) GPUARR__CL.clReleaseMemObject(m);
        __atomic_sub_fetch(&cd->allocated, (uint64_t)bytes, __ATOMIC_ACQ_REL);
        return r;
    }
    *mem = m;
    return GPUARR_OK;
}

static void gpuarr__cl_mem_free(gpuarr__dev *d, void *mem) {
    gpuarr__cl_device *cd = GPUARR__CL_DEV(d);
    size_t size = 0;
    GPUARR__CL.clGetMemObjectInfo((gpuarr__cl_mem)mem, GPUARR__CL_MEM_SIZE, sizeof size, &size, NULL);
    __atomic_sub_fetch(&cd->allocated, (uint64_t)size, __ATOMIC_ACQ_REL);
    if (!cd->host_unified) pthread_mutex_lock(&cd->mem_lock);
    GPUARR__CL.clReleaseMemObject((gpuarr__cl_mem)mem);
    if (!cd->host_unified) pthread_mutex_unlock(&cd->mem_lock);
}

/* Pool blocks start at multiples of this, so each can be its own sub-buffer. */
static size_t gpuarr__cl_mem_alignment(gpuarr__dev *d) { return GPUARR__CL_DEV(d)->host_align; }

/* A pool block is a sub-buffer of its segment: its own cl_mem, so work on different blocks of
   one segment from different queues is defined (OpenCL 1.2, 5.2.1). */
static gpuarr_result gpuarr__cl_mem_view(gpuarr__dev *d, void *segment, size_t offset, size_t bytes, void **mem, size_t *mem_offset) {
    size_t region[2] = {offset, bytes};
    gpuarr__cl_int e = GPUARR__CL_SUCCESS;
    gpuarr__cl_mem sub = GPUARR__CL.clCreateSubBuffer((gpuarr__cl_mem)segment, GPUARR__CL_MEM_READ_WRITE,
                                                      GPUARR__CL_BUFFER_CREATE_TYPE_REGION, region, &e);
    if (!sub) return gpuarr__cl_fail(e, "clCreateSubBuffer", d->info.spec);
    *mem = sub;
    *mem_offset = 0;
    return GPUARR_OK;
}

static void gpuarr__cl_mem_view_release(gpuarr__dev *d, void *mem) {
    GPUARR__UNUSED(d);
    GPUARR__CL.clReleaseMemObject((gpuarr__cl_mem)mem);
}

/* Pinned host memory: a buffer the runtime allocates host-side (CL_MEM_ALLOC_HOST_PTR), mapped
   once for good. Drivers recognize its address in clEnqueueRead/WriteBuffer and copy by DMA. */
typedef struct gpuarr__cl_pinned {
    gpuarr__cl_mem mem;
    void *host;
} gpuarr__cl_pinned;

static gpuarr_result gpuarr__cl_pinned_alloc(gpuarr__dev *d, size_t bytes, void **handle, void **host_ptr) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    gpuarr__cl_device *cd = GPUARR__CL_DEV(d);
    gpuarr__cl_pinned *pin = (gpuarr__cl_pinned *)gpuarr__calloc(sizeof *pin);
    if (!pin) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for a pinned buffer record");
    gpuarr__cl_int e = GPUARR__CL_SUCCESS;
    pin->mem = cl->clCreateBuffer(cl->platforms[cd->platform].context, GPUARR__CL_MEM_READ_WRITE | GPUARR__CL_MEM_ALLOC_HOST_PTR, bytes, NULL, &e);
    if (pin->mem)
        pin->host = cl->clEnqueueMapBuffer(cd->internal_queue, pin->mem, GPUARR__CL_TRUE, GPUARR__CL_MAP_READ | GPUARR__CL_MAP_WRITE, 0,
                                           bytes, 0, NULL, NULL, &e);
    if (!pin->host) {
        const char *call = pin->mem ? "clEnqueueMapBuffer" : "clCreateBuffer";
        if (pin->mem) cl->clReleaseMemObject(pin->mem);
        gpuarr__free(pin);
        return gpuarr__cl_fail(e, call, d->info.spec);
    }
    *handle = pin;
    *host_ptr = pin->host;
    return GPUARR_OK;
}

static void gpuarr__cl_pinned_free(gpuarr__dev *d, void *handle) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    gpuarr__cl_pinned *pin = (gpuarr__cl_pinned *)handle;
    gpuarr__cl_event ev = NULL;
    if (cl->clEnqueueUnmapMemObject(GPUARR__CL_DEV(d)->internal_queue, pin->mem, pin->host, 0, NULL, &ev) == GPUARR__CL_SUCCESS) {
        cl->clWaitForEvents(1, &ev);
        cl->clReleaseEvent(ev);
    }
    cl->clReleaseMemObject(pin->mem);
    gpuarr__free(pin);
}

/* ---------------------------------------------------------------------------------------------
 * Copies. Host-unified devices (PoCL, integrated GPUs) map the buffer and copy with the host's
 * threads: their write/read paths are far slower than a memcpy (bench/results/opencl-pocl.md).
 * ------------------------------------------------------------------------------------------- */
static gpuarr_result gpuarr__cl_launch_host_fn(gpuarr__stream *s, gpuarr__host_fn fn, void *ctx);

/* In an async call a host-unified copy may not wait for the queue (a blocking map does): the map
   is queued without blocking, the memcpy runs as a host function once it is done, and the unmap
   follows in queue order. */
typedef struct gpuarr__cl_queued_copy {
    void *dst;
    const void *src;
    size_t bytes;
} gpuarr__cl_queued_copy;

static void gpuarr__cl_queued_copy_run(void *ctx) {
    gpuarr__cl_queued_copy *c = (gpuarr__cl_queued_copy *)ctx;
    gpuarr__cpu_memcpy(c->dst, c->src, c->bytes);
    gpuarr__free(c);
    gpuarr__host_fn_done();
}

static gpuarr_result gpuarr__cl_copy_queued(gpuarr__stream *s, gpuarr__cl_mem m, size_t off, size_t bytes, void *host, bool to_device) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    gpuarr__cl_queued_copy *c = (gpuarr__cl_queued_copy *)gpuarr__calloc(sizeof *c);
    if (!c) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for a queued copy");
    gpuarr__cl_int e = GPUARR__CL_SUCCESS;
    uint64_t flags = to_device ? GPUARR__CL_MAP_WRITE_INVALIDATE_REGION : GPUARR__CL_MAP_READ;
    void *p = cl->clEnqueueMapBuffer(GPUARR__CL_QUEUE(s), m, GPUARR__CL_FALSE, flags, off, bytes, 0, NULL, NULL, &e);
    if (!p) {
        gpuarr__free(c);
        return gpuarr__cl_fail(e, "clEnqueueMapBuffer", s->dev->info.spec);
    }
    c->dst = to_device ? p : host;
    c->src = to_device ? (const void *)host : (const void *)p;
    c->bytes = bytes;
    gpuarr_result r = gpuarr__cl_launch_host_fn(s, gpuarr__cl_queued_copy_run, c);
    if (r != GPUARR_OK) gpuarr__free(c); /* not queued: the unmap below still balances the map */
    gpuarr__cl_event ev = NULL;
    gpuarr__cl_int ue = cl->clEnqueueUnmapMemObject(GPUARR__CL_QUEUE(s), m, p, 0, NULL, &ev);
    if (ue == GPUARR__CL_SUCCESS) gpuarr__cl_track(GPUARR__CL_LAST(s), ev);
    if (r == GPUARR_OK && ue != GPUARR__CL_SUCCESS) r = gpuarr__cl_fail(ue, "clEnqueueUnmapMemObject", s->dev->info.spec);
    return r;
}

/* Host-unified devices: a synchronous copy below this goes through the driver's read or write
   call, one command; the map, the host's threads and the unmap pay off only above it (PoCL on
   a 2-core Zen 3: the write call took 47-104 us for 4 KiB-1 MiB against 67-187 us mapped, and
   the two were even at 4 MiB; at 64 MiB the map is 1.6x faster). */
#define GPUARR__CL_MAP_MIN ((size_t)4 << 20)

static gpuarr_result gpuarr__cl_copy_h2d(gpuarr__stream *s, void *dst, size_t dst_off, const void *src, size_t bytes, bool async) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    gpuarr__cl_device *cd = GPUARR__CL_DEV(s->dev);
    if (cd->host_unified && async)
        return gpuarr__cl_copy_queued(s, (gpuarr__cl_mem)dst, dst_off, bytes, (void *)(uintptr_t)src, true);
    if (cd->host_unified && bytes >= GPUARR__CL_MAP_MIN) {
        gpuarr__cl_int e = GPUARR__CL_SUCCESS;
        void *p = cl->clEnqueueMapBuffer(GPUARR__CL_QUEUE(s), (gpuarr__cl_mem)dst, GPUARR__CL_TRUE,
                                         GPUARR__CL_MAP_WRITE_INVALIDATE_REGION, dst_off, bytes, 0, NULL, NULL, &e);
        if (!p) return gpuarr__cl_fail(e, "clEnqueueMapBuffer", s->dev->info.spec);
        gpuarr__cpu_memcpy(p, src, bytes);
        gpuarr__cl_event ev = NULL;
        GPUARR__CL_CHECK(cl->clEnqueueUnmapMemObject(GPUARR__CL_QUEUE(s), (gpuarr__cl_mem)dst, p, 0, NULL, &ev), s->dev->info.spec);
        gpuarr__cl_track(GPUARR__CL_LAST(s), ev);
        return GPUARR_OK;
    }
    gpuarr__cl_event ev = NULL;
    GPUARR__CL_CHECK(cl->clEnqueueWriteBuffer(GPUARR__CL_QUEUE(s), (gpuarr__cl_mem)dst, GPUARR__CL_FALSE, dst_off, bytes, src, 0, NULL, &ev),
                     s->dev->info.spec);
    gpuarr__cl_track(GPUARR__CL_LAST(s), ev);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__cl_copy_d2h(gpuarr__stream *s, void *dst, const void *src, size_t src_off, size_t bytes, bool async) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    gpuarr__cl_device *cd = GPUARR__CL_DEV(s->dev);
    gpuarr__cl_mem m = (gpuarr__cl_mem)(uintptr_t)src;
    if (cd->host_unified && async) return gpuarr__cl_copy_queued(s, m, src_off, bytes, dst, false);
    if (cd->host_unified && bytes >= GPUARR__CL_MAP_MIN) {
        gpuarr__cl_int e = GPUARR__CL_SUCCESS;
        void *p = cl->clEnqueueMapBuffer(GPUARR__CL_QUEUE(s), m, GPUARR__CL_TRUE, GPUARR__CL_MAP_READ, src_off, bytes, 0, NULL, NULL, &e);
        if (!p) return gpuarr__cl_fail(e, "clEnqueueMapBuffer", s->dev->info.spec);
        gpuarr__cpu_memcpy(dst, p, bytes);
        gpuarr__cl_event ev = NULL;
        GPUARR__CL_CHECK(cl->clEnqueueUnmapMemObject(GPUARR__CL_QUEUE(s), m, p, 0, NULL, &ev), s->dev->info.spec);
        gpuarr__cl_track(GPUARR__CL_LAST(s), ev);
        return GPUARR_OK;
    }
    gpuarr__cl_event ev = NULL;
    GPUARR__CL_CHECK(cl->clEnqueueReadBuffer(GPUARR__CL_QUEUE(s), m, GPUARR__CL_FALSE, src_off, bytes, dst, 0, NULL, &ev),
                     s->dev->info.spec);
    gpuarr__cl_track(GPUARR__CL_LAST(s), ev);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__cl_copy_d2d(gpuarr__stream *s, void *dst, size_t dst_off, const void *src, size_t src_off,
                                         size_t bytes) {
    gpuarr__cl_event ev = NULL;
    GPUARR__CL_CHECK(GPUARR__CL.clEnqueueCopyBuffer(GPUARR__CL_QUEUE(s), (gpuarr__cl_mem)(uintptr_t)src, (gpuarr__cl_mem)dst,
                                                    src_off, dst_off, bytes, 0, NULL, &ev),
                     s->dev->info.spec);
    gpuarr__cl_track(GPUARR__CL_LAST(s), ev);
    return GPUARR_OK;
}

/* Within one platform's context a buffer can be copied to another device's buffer directly. */
static bool gpuarr__cl_can_copy_peer(gpuarr__dev *dst, gpuarr__dev *src) {
    return GPUARR__CL_DEV(dst)->platform == GPUARR__CL_DEV(src)->platform;
}

static gpuarr_result gpuarr__cl_copy_peer(gpuarr__stream *s, gpuarr__dev *dst_dev, void *dst, size_t dst_off,
                                          gpuarr__dev *src_dev, const void *src, size_t src_off, size_t bytes) {
    GPUARR__UNUSED(dst_dev);
    GPUARR__UNUSED(src_dev);
    return gpuarr__cl_copy_d2d(s, dst, dst_off, src, src_off, bytes);
}

#define GPUARR__CL_FILL_WIDE 32

/* One clEnqueueFillBuffer (none for an empty range). */
static gpuarr_result gpuarr__cl_fill_range(gpuarr__stream *s, void *dst, size_t off, const void *pattern, size_t pattern_size, size_t bytes) {
    if (bytes == 0) return GPUARR_OK;
    gpuarr__cl_event ev = NULL;
    GPUARR__CL_CHECK(GPUARR__CL.clEnqueueFillBuffer(GPUARR__CL_QUEUE(s), (gpuarr__cl_mem)dst, pattern, pattern_size, off, bytes, 0, NULL, &ev),
                     s->dev->info.spec);
    gpuarr__cl_track(GPUARR__CL_LAST(s), ev);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__cl_fill(gpuarr__stream *s, void *dst, size_t dst_off, const void *pattern, size_t pattern_size,
                                     size_t bytes, bool async) {
    GPUARR__TRACE_SCOPE(gpuarr__trace_fill, s, bytes, pattern_size);
    gpuarr__cl_state *cl = &GPUARR__CL;
    gpuarr__cl_event ev = NULL;
    if (bytes == 0) return GPUARR_OK;
    /* Host-unified devices fill the way they copy: the buffer mapped, the host's threads writing.
       PoCL's clEnqueueFillBuffer writes a pattern wider than one byte several times slower
       than memset (bench/results/mutable.md). An async call keeps the enqueued fill, which
       does not wait for the queue as a blocking map would. */
    if (GPUARR__CL_DEV(s->dev)->host_unified && !async) {
        gpuarr__cl_int e = GPUARR__CL_SUCCESS;
        void *p = cl->clEnqueueMapBuffer(GPUARR__CL_QUEUE(s), (gpuarr__cl_mem)dst, GPUARR__CL_TRUE,
                                         GPUARR__CL_MAP_WRITE_INVALIDATE_REGION, dst_off, bytes, 0, NULL, NULL, &e);
        if (!p) return gpuarr__cl_fail(e, "clEnqueueMapBuffer", s->dev->info.spec);
        gpuarr__cpu_fill(p, pattern, pattern_size, bytes);
        GPUARR__CL_CHECK(cl->clEnqueueUnmapMemObject(GPUARR__CL_QUEUE(s), (gpuarr__cl_mem)dst, p, 0, NULL, &ev), s->dev->info.spec);
        gpuarr__cl_track(GPUARR__CL_LAST(s), ev);
        return GPUARR_OK;
    }
    /* A pattern wider than a byte is repeated to 32 bytes over the aligned middle of the range:
       PoCL fills a 4-byte pattern at a third of the rate of a 16- to 128-byte one. */
    size_t head = 0, body = 0;
    unsigned char wide[GPUARR__CL_FILL_WIDE];
    if (pattern_size > 1 && bytes >= 2 * GPUARR__CL_FILL_WIDE) {
        head = (GPUARR__CL_FILL_WIDE - dst_off % GPUARR__CL_FILL_WIDE) % GPUARR__CL_FILL_WIDE; /* a multiple of pattern_size */
        body = (bytes - head) / GPUARR__CL_FILL_WIDE * GPUARR__CL_FILL_WIDE;
        for (size_t i = 0; i < GPUARR__CL_FILL_WIDE; i += pattern_size) memcpy(wide + i, pattern, pattern_size);
    }
    GPUARR__CHECK(gpuarr__cl_fill_range(s, dst, dst_off, pattern, pattern_size, body ? head : bytes));
    if (!body) return GPUARR_OK;
    GPUARR__CHECK(gpuarr__cl_fill_range(s, dst, dst_off + head, wide, GPUARR__CL_FILL_WIDE, body));
    return gpuarr__cl_fill_range(s, dst, dst_off + head + body, pattern, pattern_size, bytes - head - body);
}

/* ---------------------------------------------------------------------------------------------
 * Kernels: the shared source plus one instantiation line per dtype pair, built for one device at
 * its first cast (thread-safe), from a cached binary when there is one.
 * ------------------------------------------------------------------------------------------- */
static bool gpuarr__cl_pair_supported(const gpuarr__cl_device *cd, int s, int t) {
    return cd->fp64 || (s != GPUARR_F64 && t != GPUARR_F64);
}

static const char gpuarr__cl_preamble_text[] =
    "typedef char int8_t;\ntypedef uchar uint8_t;\ntypedef short int16_t;\ntypedef ushort uint16_t;\n"
    "typedef int int32_t;\ntypedef uint uint32_t;\ntypedef long int64_t;\ntypedef ulong uint64_t;\n"
    "#define GPUARR_K_FN static inline\n"
    "#define GPUARR_K_F32_BITS(x) as_uint(x)\n#define GPUARR_K_BITS_F32(u) as_float(u)\n"
    "#define GPUARR_K_F64_BITS(x) as_ulong(x)\n#define GPUARR_K_BITS_F64(u) as_double(u)\n"
    "#define GPUARR_K_CLZ64(x) ((int)clz((ulong)(x)))\n#define GPUARR_K_U64(c) c##UL\n"
    "#define GPUARR_K_KERNEL __kernel\n#define GPUARR_K_GLOBAL __global\n#define GPUARR_K_SIZE ulong\n"
    "#define GPUARR_K_INDEX get_global_id(0)\n"
    /* the dtype table's limits: OpenCL C does not promise the <stdint.h> names (PoCL has them) */
    "#ifndef INT8_MIN\n#define INT8_MIN (-128)\n#define INT8_MAX 127\n#define UINT8_MAX 255\n"
    "#define INT16_MIN (-32767 - 1)\n#define INT16_MAX 32767\n#define UINT16_MAX 65535\n"
    "#define INT32_MIN (-2147483647 - 1)\n#define INT32_MAX 2147483647\n#define UINT32_MAX 4294967295u\n"
    "#define INT64_MIN (-9223372036854775807L - 1)\n#define INT64_MAX 9223372036854775807L\n"
    "#define UINT64_MAX 18446744073709551615UL\n#endif\n";

/* f32->f16 full runs through the device's half store (gpuarr__cl_half_store_exact), 8 at a time:
   float16 arguments would change the ABI without AVX-512, which PoCL's compiler prints. */
static const char gpuarr__cl_half_store_text[] =
    "#define GPUARR_K_RUN_gpuarr__k_f32_gpuarr__k_f16 ~, GPUARR_K_RUN_HALF_STORE\n"
    "#define GPUARR_K_RUN_HALF_STORE(skind, scat, dkind, dstore, dlo, dhi, s, d) "
    "for (int j = 0; j < GPUARR_K_PER_ITEM; j += 8) vstore_half8_rte(vload8(0, (s) + j), 0, (__global half *)((d) + j))\n";

/* The program text for one dtype pair on one device: preamble, the shared source, one
   instantiation. Returned as pieces for clCreateProgramWithSource, and hashed for the cache. */
typedef struct gpuarr__cl_source {
    const char *pieces[sizeof gpuarr__kernels_source / sizeof gpuarr__kernels_source[0] + 5];
    size_t count;
    char per_item[48];
    char instantiation[256];
} gpuarr__cl_source;

static void gpuarr__cl_source_make(const gpuarr__cl_device *cd, int s, int t, gpuarr__cl_source *out) {
    size_t shared = sizeof gpuarr__kernels_source / sizeof gpuarr__kernels_source[0];
    size_t n = 0;
    out->pieces[n++] = gpuarr__cl_preamble_text;
    out->pieces[n++] = cd->fp64 ? "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n#define GPUARR_K_HAVE_F64 1\n" : "\n";
    snprintf(out->per_item, sizeof out->per_item, "#define GPUARR_K_PER_ITEM %u\n", cd->per_item);
    out->pieces[n++] = out->per_item;
    out->pieces[n++] = cd->half_store ? gpuarr__cl_half_store_text : "\n";
    for (size_t i = 0; i < shared; i++) out->pieces[n++] = gpuarr__kernels_source[i];
    gpuarr__kernel_instantiation(s, t, out->instantiation, sizeof out->instantiation);
    out->pieces[n++] = out->instantiation;
    out->count = n;
}

/* Over the program text, the device and driver, and the build options. */
static uint64_t gpuarr__cl_cache_key(const gpuarr__cl_source *src, const gpuarr__dev *d, const char *options) {
    uint64_t h = gpuarr__hash_pieces(GPUARR__HASH_SEED, src->pieces, src->count);
    const char *parts[4] = {d->info.name, d->info.version, options, gpuarr__cl_preamble_text};
    return gpuarr__hash_pieces(h, parts, 4);
}

/* Keeps prog's binary as the cache file `file` (key: what its name is made of). */
static void gpuarr__cl_save_binary(gpuarr__cl_program prog, const char *file, uint64_t key) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    size_t size = 0;
    if (!gpuarr__g.config.cache_dir[0]) return;
    if (cl->clGetProgramInfo(prog, GPUARR__CL_PROGRAM_BINARY_SIZES, sizeof size, &size, NULL) != GPUARR__CL_SUCCESS || !size) return;
    unsigned char *bin = (unsigned char *)gpuarr__malloc(size);
    if (!bin) return;
    if (cl->clGetProgramInfo(prog, GPUARR__CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL) == GPUARR__CL_SUCCESS)
        gpuarr__cache_store(file, key, bin, size);
    gpuarr__free(bin);
}

/* The program and kernel `name` from the cache file `file`: false when there is none, or when the
   driver does not take it, build it or find the kernel in it (then the caller builds from source
   and replaces the file). The header's checks keep a damaged file from the driver, which may
   crash on one. */
static bool gpuarr__cl_from_cache(gpuarr__dev *d, const char *file, uint64_t key, const char *options, const char *name,
                                  gpuarr__cl_program *prog_out, gpuarr__cl_kernel *k_out) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    gpuarr__cl_device *cd = GPUARR__CL_DEV(d);
    size_t size = 0;
    unsigned char *bin = gpuarr__cache_load(file, key, GPUARR__CACHE_KERNEL_MAX, &size);
    if (!bin) return false;
    const unsigned char *bins[1] = {bin};
    gpuarr__cl_int status = GPUARR__CL_SUCCESS, e = GPUARR__CL_SUCCESS;
    gpuarr__cl_program prog = cl->clCreateProgramWithBinary(cl->platforms[cd->platform].context, 1, &cd->id, &size, bins, &status, &e);
    gpuarr__free(bin);
    const char *failed = !prog || status != GPUARR__CL_SUCCESS ? "clCreateProgramWithBinary"
                         : (e = cl->clBuildProgram(prog, 1, &cd->id, options, NULL, NULL)) != GPUARR__CL_SUCCESS ? "clBuildProgram"
                                                                                                               : NULL;
    gpuarr__cl_kernel k = failed ? NULL : cl->clCreateKernel(prog, name, &e);
    if (!failed && !k) failed = "clCreateKernel";
    if (!failed) {
        *prog_out = prog;
        *k_out = k;
        return true;
    }
    gpuarr__log(GPUARR_LOG_INFO, "%s: the cached kernel binary %s/%s was not taken (%s failed: %s (%d)): rebuilt from source", d->info.spec,
                gpuarr__g.config.cache_dir, file, failed, gpuarr__cl_error_name(e != GPUARR__CL_SUCCESS ? e : status),
                (int)(e != GPUARR__CL_SUCCESS ? e : status));
    if (prog) cl->clReleaseProgram(prog);
    return false;
}

static gpuarr_result gpuarr__cl_build_error(gpuarr__dev *d, gpuarr__cl_program prog, gpuarr__cl_int e) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    char log[700] = "";
    size_t n = 0;
    cl->clGetProgramBuildInfo(prog, GPUARR__CL_DEV(d)->id, GPUARR__CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, &n);
    log[sizeof log - 1] = '\0';
    if (n > sizeof log) gpuarr__log(GPUARR_LOG_ERROR, "%s: the OpenCL build log is %zu bytes; its start is in the error", d->info.spec, n);
    return gpuarr__fail(GPUARR_ERROR_BACKEND, "%s: building the cast kernels failed: clBuildProgram failed: %s (%d): %s", d->info.spec,
                        gpuarr__cl_error_name(e), (int)e, log);
}

/* The work-group size to launch k with: 256, or less where the kernel (CL_KERNEL_WORK_GROUP_SIZE,
   which depends on its registers and the device) or the device allows less; a launch above
   either limit fails with CL_INVALID_WORK_GROUP_SIZE. */
static gpuarr_result gpuarr__cl_local_size(gpuarr__dev *d, gpuarr__cl_kernel k, size_t *out) {
    gpuarr__cl_device *cd = GPUARR__CL_DEV(d);
    size_t limit = 0;
    gpuarr__cl_int e = GPUARR__CL.clGetKernelWorkGroupInfo(k, cd->id, GPUARR__CL_KERNEL_WORK_GROUP_SIZE, sizeof limit, &limit, NULL);
    if (e != GPUARR__CL_SUCCESS) return gpuarr__cl_fail(e, "clGetKernelWorkGroupInfo", d->info.spec);
    size_t local = GPUARR__MIN((size_t)256, limit);
    if (cd->max_group) local = GPUARR__MIN(local, cd->max_group);
    *out = GPUARR__MAX(local, (size_t)1);
    return GPUARR_OK;
}

/* Builds the cast kernel for one pair: from the on-disk binary when it is there and loads, else
   from source (then saved). Called with the device's kernel lock held. */
static gpuarr_result gpuarr__cl_build_pair(gpuarr__dev *d, int s, int t) {
    GPUARR__TRACE_SCOPE(gpuarr__trace_kernel, d, s, t);
    gpuarr__cl_state *cl = &GPUARR__CL;
    gpuarr__cl_device *cd = GPUARR__CL_DEV(d);
    gpuarr__cl_context ctx = cl->platforms[cd->platform].context;
    const char *extra = gpuarr__setting(GPUARR__SET_OPENCL_BUILD_OPTIONS);
    char options[512];
    snprintf(options, sizeof options, "-cl-std=CL1.2 %s", extra ? extra : "");
    gpuarr__cl_source src;
    gpuarr__cl_source_make(cd, s, t, &src);
    char file[64], name[96];
    uint64_t key = gpuarr__cl_cache_key(&src, d, options);
    snprintf(file, sizeof file, "opencl-%016llx.bin", (unsigned long long)key);
    gpuarr__kernel_name(s, t, name, sizeof name);
    gpuarr__cl_program prog = NULL;
    gpuarr__cl_kernel k = NULL;
    gpuarr__cl_int e = GPUARR__CL_SUCCESS;
    bool from_cache = gpuarr__cl_from_cache(d, file, key, options, name, &prog, &k);
    if (from_cache) { GPUARR__TRACE_SET(s1, "disk cache"); GPUARR__TRACE_SET(s2, "true"); }
    if (!from_cache) {
        prog = cl->clCreateProgramWithSource(ctx, (gpuarr__cl_uint)src.count, src.pieces, NULL, &e);
        if (!prog) return gpuarr__cl_fail(e, "clCreateProgramWithSource", d->info.spec);
        e = cl->clBuildProgram(prog, 1, &cd->id, options, NULL, NULL);
        if (e != GPUARR__CL_SUCCESS) {
            gpuarr_result r = gpuarr__cl_build_error(d, prog, e);
            cl->clReleaseProgram(prog);
            return r;
        }
        k = cl->clCreateKernel(prog, name, &e);
    }
    gpuarr_result r = k ? gpuarr__cl_local_size(d, k, &cd->local_sizes[s][t]) : gpuarr__cl_fail(e, "clCreateKernel", d->info.spec);
    if (r != GPUARR_OK) {
        if (k) cl->clReleaseKernel(k);
        cl->clReleaseProgram(prog);
        return r;
    }
    if (!from_cache) gpuarr__cl_save_binary(prog, file, key); /* also replaces a file that was refused */
    cd->programs[s][t] = prog;
    cd->casts[s][t] = k;
    return GPUARR_OK;
}

/* The kernel for a pair, built at its first use (with the device's kernel lock held). A compile
   error is remembered and reported to every later caller; running out of memory is not. */
static gpuarr_result gpuarr__cl_ensure_kernel(gpuarr__dev *d, int s, int t) {
    gpuarr__cl_device *cd = GPUARR__CL_DEV(d);
    if (cd->build_result != GPUARR_OK) return gpuarr__fail(cd->build_result, "%s", cd->build_error);
    if (cd->casts[s][t]) return GPUARR_OK;
    double t0 = gpuarr__now_ms();
    pthread_mutex_lock(&GPUARR__CL.build_lock);
    gpuarr_result r = gpuarr__cl_build_pair(d, s, t);
    pthread_mutex_unlock(&GPUARR__CL.build_lock);
    if (r == GPUARR_OK) {
        gpuarr__log(GPUARR_LOG_INFO, "%s: %s->%s cast kernel ready in %.1f ms", d->info.spec, gpuarr__dtype_names[s],
                    gpuarr__dtype_names[t], gpuarr__now_ms() - t0);
    } else if (r != GPUARR_ERROR_OUT_OF_MEMORY) {
        gpuarr__copy_string(cd->build_error, sizeof cd->build_error, gpuarr__tls.error_detail);
        cd->build_result = r;
    }
    return r;
}

static gpuarr_result gpuarr__cl_cast_supported(gpuarr__dev *d, gpuarr_dtype dst_t, gpuarr_dtype src_t) {
    if (gpuarr__cl_pair_supported(GPUARR__CL_DEV(d), (int)src_t, (int)dst_t)) return GPUARR_OK;
    return gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "%s has no cl_khr_fp64: it cannot cast %s to %s", d->info.spec,
                        gpuarr__dtype_names[src_t], gpuarr__dtype_names[dst_t]);
}

static gpuarr_result gpuarr__cl_cast(gpuarr__stream *s, void *dst, size_t dst_off, gpuarr_dtype dst_t, const void *src,
                                     size_t src_off, gpuarr_dtype src_t, size_t count) {
    GPUARR__TRACE_SCOPE(gpuarr__trace_cast, s, dst_t, src_t, count);
    gpuarr__cl_state *cl = &GPUARR__CL;
    gpuarr__dev *d = s->dev;
    gpuarr__cl_device *cd = GPUARR__CL_DEV(d);
    GPUARR__CHECK(gpuarr__cl_cast_supported(d, dst_t, src_t));
    pthread_mutex_lock(&cd->kernel_lock);
    gpuarr_result r = gpuarr__cl_ensure_kernel(d, (int)src_t, (int)dst_t);
    if (r == GPUARR_OK) {
        gpuarr__cl_kernel k = cd->casts[src_t][dst_t];
        gpuarr__cl_mem sm = (gpuarr__cl_mem)(uintptr_t)src, dm = (gpuarr__cl_mem)dst;
        gpuarr__cl_ulong so = src_off / gpuarr__dtype_sizes[src_t], doff = dst_off / gpuarr__dtype_sizes[dst_t], n = count;
        size_t items = (count + cd->per_item - 1) / cd->per_item; /* per_item elements each, the last fewer */
        size_t local = cd->local_sizes[src_t][dst_t], global = (items + local - 1) / local * local;
        const char *call = "clSetKernelArg";
        gpuarr__cl_int e = cl->clSetKernelArg(k, 0, sizeof sm, &sm);
        if (e == GPUARR__CL_SUCCESS) e = cl->clSetKernelArg(k, 1, sizeof so, &so);
        if (e == GPUARR__CL_SUCCESS) e = cl->clSetKernelArg(k, 2, sizeof dm, &dm);
        if (e == GPUARR__CL_SUCCESS) e = cl->clSetKernelArg(k, 3, sizeof doff, &doff);
        if (e == GPUARR__CL_SUCCESS) e = cl->clSetKernelArg(k, 4, sizeof n, &n);
        gpuarr__cl_event ev = NULL;
        if (e == GPUARR__CL_SUCCESS) {
            call = "clEnqueueNDRangeKernel";
            e = cl->clEnqueueNDRangeKernel(GPUARR__CL_QUEUE(s), k, 1, NULL, &global, &local, 0, NULL, &ev);
        }
        if (e == GPUARR__CL_SUCCESS) gpuarr__cl_track(GPUARR__CL_LAST(s), ev);
        else r = gpuarr__cl_fail(e, call, d->info.spec);
    }
    pthread_mutex_unlock(&cd->kernel_lock);
    return r;
}

/* ---------------------------------------------------------------------------------------------
 * Portable kernels: the body's text in OpenCL C, built per device at first use (from the cache
 * folder when it holds the binary), launched with the arrays as (buffer, element offset).
 * ------------------------------------------------------------------------------------------- */
typedef struct gpuarr__cl_user_kernel {
    struct gpuarr__cl_user_kernel *next;
    const gpuarr_kernel *kernel;
    gpuarr__cl_program program;
    gpuarr__cl_kernel cl_kernel; /* NULL: its build failed (result and message below) */
    size_t local;                /* 1-D work-group size */
    gpuarr_result result;
    char *message;
} gpuarr__cl_user_kernel;

static void gpuarr__cl_user_kernels_free(gpuarr__cl_device *cd) {
    while (cd->user_kernels) {
        gpuarr__cl_user_kernel *u = cd->user_kernels;
        cd->user_kernels = u->next;
        if (u->cl_kernel) GPUARR__CL.clReleaseKernel(u->cl_kernel);
        if (u->program) GPUARR__CL.clReleaseProgram(u->program);
        gpuarr__free(u->message);
        gpuarr__free(u);
    }
}

/* The OpenCL dialect: its types and the conversion rules (as for the casts), no contraction. */
static char *gpuarr__cl_user_source(const gpuarr__cl_device *cd, const gpuarr_kernel *k) {
    char *prelude = NULL;
    size_t len = 0, cap = 0;
    bool ok = gpuarr__text_add(&prelude, &len, &cap, "%s%s#pragma OPENCL FP_CONTRACT OFF\n", gpuarr__cl_preamble_text,
                               cd->fp64 ? "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n#define GPUARR_K_HAVE_F64 1\n" : "");
    for (size_t i = 0; ok && i < sizeof gpuarr__kernels_source / sizeof gpuarr__kernels_source[0]; i++)
        ok = gpuarr__text_add(&prelude, &len, &cap, "%s", gpuarr__kernels_source[i]);
    ok = ok && gpuarr__text_add(&prelude, &len, &cap, "%s", gpuarr__kernel_prelude_common);
    if (!ok) return NULL;
    gpuarr__kernel_dialect dialect = {prelude, "__kernel void", "__global ", true,
                                      {"(int64_t)get_global_id(0)", "(int64_t)get_global_id(1)", "(int64_t)get_global_id(2)"}};
    char *text = gpuarr__kernel_source(k, &dialect);
    gpuarr__free(prelude);
    return text;
}

/* The whole build log of prog on cd (gpuarr__malloc'ed, "" when none; NULL: out of memory). */
static char *gpuarr__cl_full_log(gpuarr__cl_device *cd, gpuarr__cl_program prog) {
    size_t n = 0;
    GPUARR__CL.clGetProgramBuildInfo(prog, cd->id, GPUARR__CL_PROGRAM_BUILD_LOG, 0, NULL, &n);
    char *log = (char *)gpuarr__malloc(n + 1);
    if (!log) return NULL;
    if (!n || GPUARR__CL.clGetProgramBuildInfo(prog, cd->id, GPUARR__CL_PROGRAM_BUILD_LOG, n, log, NULL) != GPUARR__CL_SUCCESS) n = 0;
    log[n] = '\0';
    return log;
}

/* Builds k for d into u (with the process-wide build lock held). */
static gpuarr_result gpuarr__cl_user_build(gpuarr__dev *d, const gpuarr_kernel *k, gpuarr__cl_user_kernel *u) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    gpuarr__cl_device *cd = GPUARR__CL_DEV(d);
    const char *extra = gpuarr__setting(GPUARR__SET_OPENCL_BUILD_OPTIONS);
    char options[600], name[96], file[64];
    snprintf(options, sizeof options, "-cl-std=CL1.2%s %s", cd->fp32_rounded ? " -cl-fp32-correctly-rounded-divide-sqrt" : "", extra ? extra : "");
    snprintf(name, sizeof name, "gpuarr_kernel_%s", k->name);
    char *text = gpuarr__cl_user_source(cd, k);
    if (!text) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "kernel %s: no host memory for its OpenCL source", k->name);
    const char *parts[4] = {text, d->info.name, d->info.version, options};
    uint64_t key = gpuarr__hash_pieces(GPUARR__HASH_SEED, parts, 4);
    snprintf(file, sizeof file, "opencl-kernel-%016llx.bin", (unsigned long long)key);
    gpuarr__cl_int e = GPUARR__CL_SUCCESS;
    bool cached = gpuarr__cl_from_cache(d, file, key, options, name, &u->program, &u->cl_kernel);
    gpuarr_result r = GPUARR_OK;
    if (!cached) {
        const char *pieces[1] = {text};
        u->program = cl->clCreateProgramWithSource(cl->platforms[cd->platform].context, 1, pieces, NULL, &e);
        if (!u->program) r = gpuarr__cl_fail(e, "clCreateProgramWithSource", d->info.spec);
        if (r == GPUARR_OK && (e = cl->clBuildProgram(u->program, 1, &cd->id, options, NULL, NULL)) != GPUARR__CL_SUCCESS) {
            char *log = gpuarr__cl_full_log(cd, u->program), how[80];
            snprintf(how, sizeof how, "clBuildProgram failed: %s (%d)", gpuarr__cl_error_name(e), (int)e);
            r = log ? gpuarr__kernel_build_failed(d, k, how, log) : gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "kernel %s: no host memory for its build log", k->name);
            gpuarr__free(log);
        }
        if (r == GPUARR_OK && !(u->cl_kernel = cl->clCreateKernel(u->program, name, &e))) r = gpuarr__cl_fail(e, "clCreateKernel", d->info.spec);
    }
    gpuarr__free(text);
    if (r == GPUARR_OK) r = gpuarr__cl_local_size(d, u->cl_kernel, &u->local);
    if (r == GPUARR_OK && !cached) gpuarr__cl_save_binary(u->program, file, key);
    if (r == GPUARR_OK && !cached) gpuarr__kernel_log_set(d, k, NULL);
    return r;
}

/* k's entry on d, built at its first use; a failed build is remembered and reported again. Called
   with cd->kernel_lock held. */
static gpuarr_result gpuarr__cl_user_kernel_get(gpuarr__dev *d, const gpuarr_kernel *k, gpuarr__cl_user_kernel **out) {
    gpuarr__cl_device *cd = GPUARR__CL_DEV(d);
    for (int i = 0; i < k->nparams; i++)
        if (k->params[i].dtype == GPUARR_F64 && !cd->fp64)
            return gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "kernel %s: parameter %s is double, but %s has no cl_khr_fp64%s", k->name, k->params[i].name,
                                d->info.spec, gpuarr__setting_value(GPUARR__SET_OPENCL_FP64, 1) ? "" : " (GPUARR_OPENCL_FP64=off)");
    gpuarr__cl_user_kernel *u = cd->user_kernels;
    while (u && u->kernel != k) u = u->next;
    if (u) {
        *out = u;
        return u->cl_kernel ? GPUARR_OK : gpuarr__fail(u->result, "%s", u->message ? u->message : "the kernel's earlier build failed");
    }
    if (!(u = (gpuarr__cl_user_kernel *)gpuarr__calloc(sizeof *u))) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for kernel %s", k->name);
    double t0 = gpuarr__now_ms();
    pthread_mutex_lock(&GPUARR__CL.build_lock);
    gpuarr_result r = gpuarr__cl_user_build(d, k, u);
    pthread_mutex_unlock(&GPUARR__CL.build_lock);
    if (r == GPUARR_ERROR_OUT_OF_MEMORY) { /* not remembered: it may pass later */
        if (u->program) GPUARR__CL.clReleaseProgram(u->program);
        gpuarr__free(u);
        return r;
    }
    u->kernel = k;
    u->result = r;
    if (r != GPUARR_OK) {
        u->message = gpuarr__strdup(gpuarr__tls.error_detail);
        if (u->cl_kernel) GPUARR__CL.clReleaseKernel(u->cl_kernel);
        u->cl_kernel = NULL;
    } else {
        gpuarr__log(GPUARR_LOG_INFO, "%s: kernel %s ready in %.1f ms", d->info.spec, k->name, gpuarr__now_ms() - t0);
    }
    u->next = cd->user_kernels;
    cd->user_kernels = u;
    *out = u;
    return r;
}

static gpuarr_result gpuarr__cl_kernel_build(gpuarr__dev *d, const gpuarr_kernel *k) {
    gpuarr__cl_device *cd = GPUARR__CL_DEV(d);
    gpuarr__cl_user_kernel *u;
    pthread_mutex_lock(&cd->kernel_lock);
    gpuarr_result r = gpuarr__cl_user_kernel_get(d, k, &u);
    pthread_mutex_unlock(&cd->kernel_lock);
    return r;
}

/* Sets the arguments (in the order gpuarr__kernel_source declares them) and enqueues. */
static gpuarr_result gpuarr__cl_user_enqueue(gpuarr__stream *s, const gpuarr__kernel_call *call, gpuarr__cl_user_kernel *u) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    const gpuarr_kernel *k = call->kernel;
    gpuarr__cl_kernel ck = u->cl_kernel;
    gpuarr__cl_int e = GPUARR__CL_SUCCESS;
    gpuarr__cl_uint at = 0;
    for (int i = 0; i < k->nparams && e == GPUARR__CL_SUCCESS; i++) {
        const gpuarr_kernel_param *p = &k->params[i];
        if (p->kind == GPUARR_PARAM_SCALAR) {
            e = cl->clSetKernelArg(ck, at++, gpuarr__dtype_sizes[p->dtype], call->scalar[i]);
            continue;
        }
        gpuarr__cl_mem m = (gpuarr__cl_mem)call->mem[i];
        gpuarr__cl_ulong off = call->offset[i] / gpuarr__dtype_sizes[p->dtype];
        e = cl->clSetKernelArg(ck, at++, sizeof m, &m);
        if (e == GPUARR__CL_SUCCESS) e = cl->clSetKernelArg(ck, at++, sizeof off, &off);
    }
    for (int dim = 0; dim < 3 && e == GPUARR__CL_SUCCESS; dim++) e = cl->clSetKernelArg(ck, at++, sizeof(int64_t), &call->global[dim]);
    if (e != GPUARR__CL_SUCCESS) return gpuarr__cl_fail(e, "clSetKernelArg", s->dev->info.spec);
    size_t global[3], local[3] = {u->local, 1, 1};
    for (int dim = 0; dim < 3; dim++) global[dim] = (size_t)call->global[dim];
    if (call->ndim == 1) global[0] = (global[0] + u->local - 1) / u->local * u->local; /* the body's guard skips the extra */
    gpuarr__cl_event ev = NULL;
    /* 2-D and 3-D: the driver picks the work-group shape that divides the index space */
    e = cl->clEnqueueNDRangeKernel(GPUARR__CL_QUEUE(s), ck, (gpuarr__cl_uint)call->ndim, NULL, global, call->ndim == 1 ? local : NULL, 0, NULL, &ev);
    if (e != GPUARR__CL_SUCCESS) return gpuarr__cl_fail(e, "clEnqueueNDRangeKernel", s->dev->info.spec);
    gpuarr__cl_track(GPUARR__CL_LAST(s), ev);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__cl_kernel_launch(gpuarr__stream *s, const gpuarr__kernel_call *call) {
    gpuarr__cl_device *cd = GPUARR__CL_DEV(s->dev);
    gpuarr__cl_user_kernel *u;
    pthread_mutex_lock(&cd->kernel_lock); /* clSetKernelArg and the enqueue, one launch of a kernel at a time */
    gpuarr_result r = gpuarr__cl_user_kernel_get(s->dev, call->kernel, &u);
    if (r == GPUARR_OK) r = gpuarr__cl_user_enqueue(s, call, u);
    pthread_mutex_unlock(&cd->kernel_lock);
    return r;
}

/* ---------------------------------------------------------------------------------------------
 * Streams (in-order queues) and events (markers)
 * ------------------------------------------------------------------------------------------- */
/* The trace's device times: the queue has profiling on, so every command's event has them. */
static void gpuarr__cl_trace_retain(void *ev) { GPUARR__CL.clRetainEvent((gpuarr__cl_event)ev); }
static void gpuarr__cl_trace_release(void *ev) { GPUARR__CL.clReleaseEvent((gpuarr__cl_event)ev); }
static bool gpuarr__cl_trace_times(void *command, uint64_t *queued, uint64_t *start, uint64_t *end) {
    gpuarr__cl_event ev = (gpuarr__cl_event)command;
    gpuarr__cl_int status = -1;
    gpuarr__cl_ulong t[3] = {0, 0, 0};
    static const gpuarr__cl_uint what[3] = {GPUARR__CL_PROFILING_COMMAND_QUEUED, GPUARR__CL_PROFILING_COMMAND_START,
                                            GPUARR__CL_PROFILING_COMMAND_END};
    if (GPUARR__CL.clGetEventInfo(ev, GPUARR__CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL) != GPUARR__CL_SUCCESS ||
        status != GPUARR__CL_COMPLETE)
        return false;
    for (int i = 0; i < 3; i++)
        if (GPUARR__CL.clGetEventProfilingInfo(ev, what[i], sizeof t[i], &t[i], NULL) != GPUARR__CL_SUCCESS) return false;
    /* NVIDIA's OpenCL gives a marker that waits on events an END it never set (seen on an H100:
       10^16 ns past its START): times out of order or spanning over an hour are not device times,
       and the trace keeps the host's for that command */
    if (t[0] > t[1] || t[1] > t[2] || t[2] - t[0] > 3600ull * 1000000000ull) return false;
    *queued = t[0], *start = t[1], *end = t[2];
    return true;
}
static const gpuarr__trace_clock gpuarr__cl_trace_clock = {GPUARR_BACKEND_OPENCL, gpuarr__cl_trace_retain, gpuarr__cl_trace_release,
                                                           gpuarr__cl_trace_times};

static void gpuarr__cl_track(gpuarr__cl_stream *st, gpuarr__cl_event ev) {
    GPUARR__TRACE_COMMAND(ev, &gpuarr__cl_trace_clock);
    pthread_mutex_lock(&st->lock);
    gpuarr__cl_event old = st->last;
    st->last = ev;
    pthread_mutex_unlock(&st->lock);
    if (old) GPUARR__CL.clReleaseEvent(old);
}

/* A host function on a queue: a marker for the work before it, whose completion callback runs
   fn and then opens a gate (a user event) that a second marker, and so everything queued after
   it, waits for. A driver may call the callback at once, on the registering thread, when the
   marker is already complete: fn then runs on a thread of its own, never in the caller's. */
typedef struct gpuarr__cl_host_call {
    gpuarr__host_fn fn;
    void *ctx;
    gpuarr__cl_event gate;
    gpuarr__cl_int status;
} gpuarr__cl_host_call;

/* Once the gate is open the waiting thread may shut gpuarr down: everything needed after that is
   taken first, and the count of calls in flight, which unload waits for, drops last. */
static void *gpuarr__cl_host_call_finish(void *user) {
    gpuarr__cl_host_call *call = (gpuarr__cl_host_call *)user;
    gpuarr__host_fn_starts();
    call->fn(call->ctx);
    gpuarr__cl_state *cl = &GPUARR__CL;
    gpuarr__cl_event gate = call->gate;
    gpuarr__cl_int status = call->status < 0 ? call->status : GPUARR__CL_COMPLETE;
    gpuarr__free(call);
    cl->clSetUserEventStatus(gate, status);
    cl->clReleaseEvent(gate);
    __atomic_sub_fetch(&cl->host_calls, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void gpuarr__event_wait_job(void *ctx);

static void gpuarr__cl_host_call_run(gpuarr__cl_event ev, gpuarr__cl_int status, void *user) {
    GPUARR__UNUSED(ev);
    gpuarr__cl_host_call *call = (gpuarr__cl_host_call *)user;
    call->status = status;
    /* A wait for another backend's event may block for long, on work that itself needs this
       driver (a CUDA host function waiting for an OpenCL marker): on the driver's own thread it
       would hold one of its few workers (PoCL's pthread device has one per core), and with all
       of them so held no OpenCL command anywhere completes. It gets a thread of its own. */
    if (gpuarr__tls.registering_host_fn || call->fn == gpuarr__event_wait_job) {
        pthread_attr_t attr;
        pthread_t t;
        bool started = pthread_attr_init(&attr) == 0;
        if (started) {
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            started = pthread_create(&t, &attr, gpuarr__cl_host_call_finish, call) == 0;
            pthread_attr_destroy(&attr);
        }
        if (started) return;
    }
    gpuarr__cl_host_call_finish(call); /* on the driver's callback thread */
}

static gpuarr_result gpuarr__cl_launch_host_fn(gpuarr__stream *s, gpuarr__host_fn fn, void *ctx) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    gpuarr__cl_command_queue q = GPUARR__CL_QUEUE(s);
    gpuarr__cl_context context = NULL;
    gpuarr__cl_event before = NULL, after = NULL;
    gpuarr__cl_host_call *call = (gpuarr__cl_host_call *)gpuarr__calloc(sizeof *call);
    if (!call) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for a host function");
    call->fn = fn;
    call->ctx = ctx;
    gpuarr__cl_int e = cl->clGetCommandQueueInfo(q, GPUARR__CL_QUEUE_CONTEXT, sizeof context, &context, NULL);
    if (e == GPUARR__CL_SUCCESS) call->gate = cl->clCreateUserEvent(context, &e);
    if (e == GPUARR__CL_SUCCESS) e = cl->clEnqueueMarkerWithWaitList(q, 0, NULL, &before);
    if (e == GPUARR__CL_SUCCESS) e = cl->clEnqueueMarkerWithWaitList(q, 1, &call->gate, &after);
    if (e != GPUARR__CL_SUCCESS) {
        if (before) cl->clReleaseEvent(before);
        if (call->gate) cl->clReleaseEvent(call->gate);
        gpuarr__free(call);
        return gpuarr__cl_fail(e, "queueing a host function", s->dev->info.spec);
    }
    gpuarr__cl_track(GPUARR__CL_LAST(s), after);
    gpuarr__host_fn_queued();
    __atomic_add_fetch(&cl->host_calls, 1, __ATOMIC_RELAXED);
    gpuarr__tls.registering_host_fn = true;
    e = cl->clSetEventCallback(before, GPUARR__CL_COMPLETE, gpuarr__cl_host_call_run, call);
    gpuarr__tls.registering_host_fn = false;
    cl->clReleaseEvent(before);
    if (e != GPUARR__CL_SUCCESS) { /* open the gate without fn, so the queue still drains */
        __atomic_sub_fetch(&cl->host_calls, 1, __ATOMIC_RELAXED);
        cl->clSetUserEventStatus(call->gate, e);
        cl->clReleaseEvent(call->gate);
        gpuarr__free(call);
        return gpuarr__cl_fail(e, "clSetEventCallback", s->dev->info.spec);
    }
    cl->clFlush(q);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__cl_stream_wrap(gpuarr__cl_command_queue q, void **native) {
    gpuarr__cl_stream *st = (gpuarr__cl_stream *)gpuarr__calloc(sizeof *st);
    if (!st) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for a stream");
    st->queue = q;
    pthread_mutex_init(&st->lock, NULL);
    *native = st;
    return GPUARR_OK;
}

static gpuarr_result gpuarr__cl_stream_create(gpuarr__dev *d, void **native) {
    gpuarr__cl_command_queue q;
    GPUARR__CHECK(gpuarr__cl_new_queue(d, &q));
    gpuarr_result r = gpuarr__cl_stream_wrap(q, native);
    if (r != GPUARR_OK) GPUARR__CL.clReleaseCommandQueue(q);
    return r;
}

/* Drops this stream's reference to the queue (a wrapped caller's queue keeps theirs). */
static void gpuarr__cl_stream_destroy(gpuarr__dev *d, void *native) {
    GPUARR__UNUSED(d);
    gpuarr__cl_stream *st = GPUARR__CL_STREAM(native);
    if (st->last) GPUARR__CL.clReleaseEvent(st->last);
    GPUARR__CL.clReleaseCommandQueue(st->queue);
    pthread_mutex_destroy(&st->lock);
    gpuarr__free(st);
}

static gpuarr_result gpuarr__cl_stream_sync(gpuarr__dev *d, void *native) {
    GPUARR__CL_CHECK(GPUARR__CL.clFinish(GPUARR__CL_STREAM(native)->queue), d->info.spec);
    gpuarr__host_fn_seen();
    return GPUARR_OK;
}

static gpuarr_result gpuarr__cl_event_status(gpuarr__dev *d, gpuarr__cl_event ev, bool *done) {
    gpuarr__cl_int status = 0;
    GPUARR__CL_CHECK(GPUARR__CL.clGetEventInfo(ev, GPUARR__CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL), d->info.spec);
    if (status < 0) return gpuarr__cl_fail(status, "a queued command", d->info.spec);
    *done = status == GPUARR__CL_COMPLETE;
    if (*done) gpuarr__host_fn_seen();
    return GPUARR_OK;
}

/* In order: the stream is idle when its last command has completed. */
static gpuarr_result gpuarr__cl_stream_query(gpuarr__dev *d, void *native, bool *done) {
    gpuarr__cl_stream *st = GPUARR__CL_STREAM(native);
    GPUARR__CL.clFlush(st->queue);
    gpuarr__cl_event last = NULL;
    /* hold a reference while asking: another thread may replace it */
    pthread_mutex_lock(&st->lock);
    last = st->last;
    if (last) GPUARR__CL.clRetainEvent(last);
    pthread_mutex_unlock(&st->lock);
    if (!last) {
        *done = true;
        return GPUARR_OK;
    }
    gpuarr_result r = gpuarr__cl_event_status(d, last, done);
    GPUARR__CL.clReleaseEvent(last);
    return r;
}

static gpuarr_result gpuarr__cl_event_create(gpuarr__dev *d, bool timing, void **native) {
    GPUARR__UNUSED(d);
    GPUARR__UNUSED(timing); /* every queue has profiling on */
    gpuarr__cl_event_box *box = (gpuarr__cl_event_box *)gpuarr__calloc(sizeof *box);
    if (!box) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for an event");
    *native = box;
    return GPUARR_OK;
}

static void gpuarr__cl_event_destroy(gpuarr__dev *d, void *native) {
    GPUARR__UNUSED(d);
    gpuarr__cl_event_box *box = (gpuarr__cl_event_box *)native;
    if (box->event) GPUARR__CL.clReleaseEvent(box->event);
    gpuarr__free(box);
}

/* A marker captures the queue's work so far; flushing lets other queues wait on it. */
static gpuarr_result gpuarr__cl_event_record(gpuarr__dev *d, void *event, void *stream) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    gpuarr__cl_event_box *box = (gpuarr__cl_event_box *)event;
    gpuarr__cl_event ev = NULL;
    gpuarr__cl_command_queue q = GPUARR__CL_STREAM(stream)->queue;
    GPUARR__CL_CHECK(cl->clEnqueueMarkerWithWaitList(q, 0, NULL, &ev), d->info.spec);
    cl->clFlush(q);
    gpuarr__cl_event old = __atomic_exchange_n(&box->event, ev, __ATOMIC_ACQ_REL);
    if (old) cl->clReleaseEvent(old);
    return GPUARR_OK;
}

/* After gpuarr's own command on the queue: its event (the queue is in order, so it completes
   after everything before it), no marker and no flush: a wait on the event flushes its queue
   first (gpuarr__cl_flush_for), so launches in a row cost one enqueue each. */
static gpuarr_result gpuarr__cl_event_record_after_own(gpuarr__dev *d, void *event, void *stream) {
    gpuarr__cl_stream *st = GPUARR__CL_STREAM(stream);
    gpuarr__cl_event_box *box = (gpuarr__cl_event_box *)event;
    pthread_mutex_lock(&st->lock);
    gpuarr__cl_event ev = st->last;
    if (ev) GPUARR__CL.clRetainEvent(ev);
    pthread_mutex_unlock(&st->lock);
    if (!ev) return gpuarr__cl_event_record(d, event, stream);
    gpuarr__cl_event old = __atomic_exchange_n(&box->event, ev, __ATOMIC_ACQ_REL);
    if (old) GPUARR__CL.clReleaseEvent(old);
    return GPUARR_OK;
}

/* Before waiting for ev, or polling it: its queue flushed, so that a command enqueued without a
   flush (a kernel launch) is sure to be submitted; a driver need not do so by itself. */
static void gpuarr__cl_flush_for(gpuarr__cl_event ev) {
    gpuarr__cl_command_queue q = NULL;
    if (GPUARR__CL.clGetEventInfo(ev, GPUARR__CL_EVENT_COMMAND_QUEUE, sizeof q, &q, NULL) == GPUARR__CL_SUCCESS && q) GPUARR__CL.clFlush(q);
}

static gpuarr_result gpuarr__cl_event_sync(gpuarr__dev *d, void *event) {
    gpuarr__cl_event ev = ((gpuarr__cl_event_box *)event)->event;
    if (ev) gpuarr__cl_flush_for(ev);
    if (ev) GPUARR__CL_CHECK(GPUARR__CL.clWaitForEvents(1, &ev), d->info.spec);
    gpuarr__host_fn_seen();
    return GPUARR_OK;
}

static gpuarr_result gpuarr__cl_event_query(gpuarr__dev *d, void *event, bool *done) {
    gpuarr__cl_event ev = ((gpuarr__cl_event_box *)event)->event;
    if (!ev) {
        *done = true;
        return GPUARR_OK;
    }
    gpuarr__cl_flush_for(ev);
    return gpuarr__cl_event_status(d, ev, done);
}

static gpuarr_result gpuarr__cl_event_elapsed(gpuarr__dev *d, void *start, void *end, double *ms) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    gpuarr__cl_event a = ((gpuarr__cl_event_box *)start)->event, b = ((gpuarr__cl_event_box *)end)->event;
    bool done_a = false, done_b = false;
    GPUARR__CHECK(gpuarr__cl_event_status(d, a, &done_a));
    GPUARR__CHECK(gpuarr__cl_event_status(d, b, &done_b));
    if (!done_a || !done_b) return gpuarr__fail(GPUARR_ERROR_NOT_READY, "%s: the events have not completed yet", d->info.spec);
    gpuarr__cl_ulong ta = 0, tb = 0;
    gpuarr__cl_int e = cl->clGetEventProfilingInfo(a, GPUARR__CL_PROFILING_COMMAND_END, sizeof ta, &ta, NULL);
    if (e == GPUARR__CL_SUCCESS) e = cl->clGetEventProfilingInfo(b, GPUARR__CL_PROFILING_COMMAND_END, sizeof tb, &tb, NULL);
    if (e != GPUARR__CL_SUCCESS)
        return gpuarr__fail(GPUARR_ERROR_BACKEND, "%s: no profiling information (%s): a queue made without "
                                                  "CL_QUEUE_PROFILING_ENABLE cannot time events", d->info.spec, gpuarr__cl_error_name(e));
    *ms = ((double)tb - (double)ta) * 1e-6;
    return GPUARR_OK;
}

/* Events of another context cannot sit in a wait list: those are waited for on the host. */
static gpuarr_result gpuarr__cl_stream_wait_event(gpuarr__dev *d, void *stream, void *event) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    gpuarr__cl_event ev = ((gpuarr__cl_event_box *)event)->event;
    if (!ev) return GPUARR_OK;
    gpuarr__cl_flush_for(ev);
    gpuarr__cl_context ev_ctx = NULL, q_ctx = NULL;
    GPUARR__CL_CHECK(cl->clGetEventInfo(ev, GPUARR__CL_EVENT_CONTEXT, sizeof ev_ctx, &ev_ctx, NULL), d->info.spec);
    gpuarr__cl_command_queue q = GPUARR__CL_STREAM(stream)->queue;
    GPUARR__CL_CHECK(cl->clGetCommandQueueInfo(q, GPUARR__CL_QUEUE_CONTEXT, sizeof q_ctx, &q_ctx, NULL), d->info.spec);
    if (ev_ctx != q_ctx) {
        GPUARR__CL_CHECK(cl->clWaitForEvents(1, &ev), d->info.spec);
        return GPUARR_OK;
    }
    gpuarr__cl_event barrier = NULL;
    GPUARR__CL_CHECK(cl->clEnqueueBarrierWithWaitList(q, 1, &ev, &barrier), d->info.spec);
    gpuarr__cl_track(GPUARR__CL_STREAM(stream), barrier);
    return GPUARR_OK;
}

/* Telemetry: what the platform offers. The device's global memory always; free memory where the
   vendor has a query for it (AMD's). PoCL has none: the total alone. */
static void gpuarr__cl_telemetry(gpuarr__dev *d, gpuarr_telemetry *out) {
    gpuarr__cl_device *cd = GPUARR__CL_DEV(d);
    out->memory_total = cd->global_mem;
    out->valid |= (uint32_t)GPUARR_TELEMETRY_MEMORY_TOTAL;
    size_t free_kib[2] = {0, 0};
    if (cd->amd_free_memory &&
        GPUARR__CL.clGetDeviceInfo(cd->id, GPUARR__CL_DEVICE_GLOBAL_FREE_MEMORY_AMD, sizeof free_kib, free_kib, NULL) == GPUARR__CL_SUCCESS &&
        (uint64_t)free_kib[0] <= cd->global_mem / 1024u) {
        out->memory_free = (uint64_t)free_kib[0] * 1024u;
        out->memory_used = cd->global_mem - out->memory_free;
        out->valid |= (uint32_t)GPUARR_TELEMETRY_MEMORY_USAGE;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Interop: the functions of GPUARR__INTEROP_OPENCL, called by the public ones the core generates
 * ------------------------------------------------------------------------------------------- */
#define GPUARR__CL_QUEUE_DEVICE 0x1091u
#define GPUARR__CL_QUEUE_PROPERTIES 0x1093u
#define GPUARR__CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE (1u << 0)

static gpuarr_result gpuarr__cl_get_dev(gpuarr_device d, const char *arg, gpuarr__dev **out) {
    GPUARR__CHECK(gpuarr__get_dev(d, arg, out));
    if ((*out)->backend->id != GPUARR_BACKEND_OPENCL)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "%s is %s, not an OpenCL device", arg, (*out)->info.spec);
    return gpuarr__dev_open(*out);
}

static gpuarr_result gpuarr__opencl_context_raw(gpuarr_device d, void **out) {
    GPUARR__REQUIRE_PTR(out);
    gpuarr__dev *dev;
    GPUARR__CHECK(gpuarr__cl_get_dev(d, "d", &dev));
    *out = GPUARR__CL.platforms[GPUARR__CL_DEV(dev)->platform].context;
    return GPUARR_OK;
}

static gpuarr_result gpuarr__opencl_device_id_raw(gpuarr_device d, void **out) {
    GPUARR__REQUIRE_PTR(out);
    gpuarr__dev *dev;
    GPUARR__CHECK(gpuarr__cl_get_dev(d, "d", &dev));
    *out = GPUARR__CL_DEV(dev)->id;
    return GPUARR_OK;
}

static gpuarr_result gpuarr__opencl_queue_raw(gpuarr_stream s, void **out) {
    GPUARR__REQUIRE_PTR(out);
    gpuarr__stream *st;
    GPUARR__CHECK(gpuarr__resolve_stream_of(s, GPUARR_BACKEND_OPENCL, "an OpenCL device", &st));
    *out = GPUARR__CL_STREAM(st->native)->queue;
    gpuarr__obj_release(&st->obj);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__opencl_mem_raw(gpuarr_array a, void **out, size_t *offset) {
    GPUARR__REQUIRE_PTR(out);
    GPUARR__REQUIRE_PTR(offset);
    gpuarr__array *arr;
    GPUARR__CHECK(gpuarr__get_array(a, "a", &arr));
    gpuarr_result r = GPUARR_OK;
    if (arr->dev->backend->id != GPUARR_BACKEND_OPENCL) {
        r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "a lives on %s, not on an OpenCL device", arr->dev->info.spec);
    } else {
        *out = arr->mem;
        *offset = arr->offset;
    }
    gpuarr__obj_release(&arr->obj);
    return r;
}

static void gpuarr__cl_release_wrapped(void *mem, void *user) {
    GPUARR__UNUSED(user);
    GPUARR__CL.clReleaseMemObject((gpuarr__cl_mem)mem);
}

/* The caller's buffer must be in gpuarr's context for d and hold offset + the array's bytes. */
static gpuarr_result gpuarr__cl_check_wrapped(gpuarr__dev *dev, gpuarr__cl_mem mem, size_t offset, const gpuarr__array *a) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    gpuarr__cl_context ctx = NULL;
    size_t size = 0;
    if (cl->clGetMemObjectInfo(mem, GPUARR__CL_MEM_CONTEXT, sizeof ctx, &ctx, NULL) != GPUARR__CL_SUCCESS ||
        cl->clGetMemObjectInfo(mem, GPUARR__CL_MEM_SIZE, sizeof size, &size, NULL) != GPUARR__CL_SUCCESS)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "mem is not a valid cl_mem");
    if (ctx != cl->platforms[GPUARR__CL_DEV(dev)->platform].context)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "mem belongs to another cl_context than %s's "
                                                           "(create it in gpuarr_opencl_context_raw's context)", dev->info.spec);
    if (offset % gpuarr__dtype_sizes[a->dtype] != 0)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "offset %zu is not a multiple of the %s size (%zu)", offset,
                            gpuarr__dtype_names[a->dtype], gpuarr__dtype_sizes[a->dtype]);
    if (offset > size || size - offset < a->nbytes)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "mem holds %zu bytes; offset %zu + %zu bytes of the array do not fit",
                            size, offset, a->nbytes);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__opencl_wrap_mem_raw(gpuarr_device d, void *mem, size_t offset, gpuarr_dtype t, int ndim,
                                                 const int64_t *shape, gpuarr_array *out) {
    GPUARR__REQUIRE_PTR(out);
    GPUARR__REQUIRE_PTR(mem);
    gpuarr__dev *dev;
    gpuarr__array *a;
    GPUARR__CHECK(gpuarr__cl_get_dev(d, "d", &dev));
    GPUARR__CHECK(gpuarr__array_alloc_struct(dev, t, ndim, shape, &a));
    gpuarr_result r = gpuarr__cl_check_wrapped(dev, (gpuarr__cl_mem)mem, offset, a);
    uint32_t id = 0;
    if (r == GPUARR_OK) {
        a->mem = mem;
        a->offset = offset;
        a->wrapped = true;
        r = gpuarr__table_insert(&gpuarr__g.arrays, &a->obj, &id);
    }
    if (r != GPUARR_OK) {
        gpuarr__free(a);
        return r;
    }
    GPUARR__CL.clRetainMemObject((gpuarr__cl_mem)mem); /* released by the array's destruction */
    a->release_fn = gpuarr__cl_release_wrapped;
    out->id = id;
    return GPUARR_OK;
}

/* A caller's queue must be valid, of ctx and id, and in order: gpuarr enqueues a stream's steps
   with empty wait lists, so only queue order keeps them in order. arg: the parameter's name;
   whose: the device or context it must match, for the message. */
static gpuarr_result gpuarr__cl_queue_check(gpuarr__cl_command_queue q, gpuarr__cl_context ctx, gpuarr__cl_device_id id, const char *arg,
                                            const char *whose) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    gpuarr__cl_context q_ctx = NULL;
    gpuarr__cl_device_id q_dev = NULL;
    gpuarr__cl_bitfield props = 0;
    if (cl->clGetCommandQueueInfo(q, GPUARR__CL_QUEUE_CONTEXT, sizeof q_ctx, &q_ctx, NULL) != GPUARR__CL_SUCCESS ||
        cl->clGetCommandQueueInfo(q, GPUARR__CL_QUEUE_DEVICE, sizeof q_dev, &q_dev, NULL) != GPUARR__CL_SUCCESS ||
        cl->clGetCommandQueueInfo(q, GPUARR__CL_QUEUE_PROPERTIES, sizeof props, &props, NULL) != GPUARR__CL_SUCCESS)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "%s is not a valid cl_command_queue", arg);
    if (q_ctx != ctx || q_dev != id)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "%s belongs to another %s than %s", arg, q_ctx != ctx ? "context" : "device",
                            whose);
    if (props & GPUARR__CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "%s is out of order (CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE): gpuarr "
                                                           "orders a stream's work by queue order; pass an in-order queue", arg);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__opencl_wrap_queue_raw(gpuarr_device d, void *queue, gpuarr_stream *out) {
    GPUARR__REQUIRE_PTR(out);
    GPUARR__REQUIRE_PTR(queue);
    gpuarr__cl_state *cl = &GPUARR__CL;
    gpuarr__dev *dev;
    GPUARR__CHECK(gpuarr__cl_get_dev(d, "d", &dev));
    gpuarr__cl_command_queue q = (gpuarr__cl_command_queue)queue;
    GPUARR__CHECK(gpuarr__cl_queue_check(q, cl->platforms[GPUARR__CL_DEV(dev)->platform].context, GPUARR__CL_DEV(dev)->id, "queue",
                                         dev->info.spec));
    void *native = NULL;
    GPUARR__CHECK(gpuarr__cl_stream_wrap(q, &native));
    cl->clRetainCommandQueue(q); /* the stream's reference; the caller keeps theirs */
    gpuarr__stream *s;
    GPUARR__CHECK(gpuarr__stream_adopt(dev, native, &s));
    return gpuarr__stream_publish(s, out);
}

/* ---------------------------------------------------------------------------------------------
 * Adopted devices (ADOPTED DEVICES): the caller's context sits in a platform row of its own, so
 * every path that asks a device for its context (buffers, programs, queues, the wrap checks)
 * gets the caller's, and peer copies (same platform row) stay within one context.
 * ------------------------------------------------------------------------------------------- */
#define GPUARR__CL_CONTEXT_DEVICES 0x1081u
#define GPUARR__CL_CONTEXT_NUM_DEVICES 0x1083u
#define GPUARR__CL_DEVICE_PLATFORM 0x1031u

/* Whether id is one of ctx's devices (INVALID_ARGUMENT saying why not). */
static gpuarr_result gpuarr__cl_context_has(gpuarr__cl_context ctx, gpuarr__cl_device_id id) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    gpuarr__cl_uint n = 0;
    gpuarr__cl_int e = cl->clGetContextInfo(ctx, GPUARR__CL_CONTEXT_NUM_DEVICES, sizeof n, &n, NULL);
    if (e != GPUARR__CL_SUCCESS || n == 0)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "cl_context is not a valid cl_context (clGetContextInfo: %s)",
                            gpuarr__cl_error_name(e));
    gpuarr__cl_device_id *ids = (gpuarr__cl_device_id *)gpuarr__calloc(sizeof *ids * n);
    if (!ids) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for cl_context's device list");
    bool found = false;
    if (cl->clGetContextInfo(ctx, GPUARR__CL_CONTEXT_DEVICES, sizeof *ids * n, ids, NULL) == GPUARR__CL_SUCCESS)
        for (gpuarr__cl_uint i = 0; i < n; i++) found |= ids[i] == id;
    gpuarr__free(ids);
    if (!found) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "cl_device_id is not one of cl_context's %u devices", n);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__cl_device_adopt(void *context, void *device, void *queue, int *index, int *same) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    gpuarr__cl_context ctx = (gpuarr__cl_context)context;
    gpuarr__cl_device_id id = (gpuarr__cl_device_id)device;
    gpuarr__cl_command_queue q = (gpuarr__cl_command_queue)queue;
    if (!ctx) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "cl_context is NULL");
    if (!id) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "cl_device_id is NULL");
    if (!cl->devices || !cl->platforms)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "cl_context: the OpenCL loader gpuarr uses lists no platform");
    GPUARR__CHECK(gpuarr__cl_context_has(ctx, id));
    if (q) GPUARR__CHECK(gpuarr__cl_queue_check(q, ctx, id, "cl_command_queue", "the one adopted"));
    for (int i = cl->found_devices; i < cl->device_count; i++)
        if (cl->devices[i].adopted && cl->devices[i].id == id && cl->platforms[cl->devices[i].platform].context == ctx)
            return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "that cl_context and cl_device_id are adopted already, as opencl:%d "
                                                               "(one device per context and device)", i);
    gpuarr__cl_platform *pl = &cl->platforms[cl->platform_count];
    gpuarr__cl_device *d = &cl->devices[cl->device_count];
    memset(pl, 0, sizeof *pl);
    memset(d, 0, sizeof *d);
    if (cl->clGetDeviceInfo(id, GPUARR__CL_DEVICE_PLATFORM, sizeof pl->id, &pl->id, NULL) != GPUARR__CL_SUCCESS)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "cl_device_id is not a valid cl_device_id");
    cl->clGetPlatformInfo(pl->id, GPUARR__CL_PLATFORM_VERSION, sizeof pl->version - 1, pl->version, NULL);
    *same = -1;
    for (int i = 0; i < cl->found_devices; i++)
        if (cl->devices[i].id == id) *same = i;
    cl->clRetainContext(ctx);
    if (q) cl->clRetainCommandQueue(q);
    pl->context = ctx;
    d->id = id;
    d->platform = cl->platform_count++;
    d->adopted = true;
    d->adopted_queue = q;
    pthread_mutex_init(&d->kernel_lock, NULL);
    pthread_mutex_init(&d->mem_lock, NULL);
    *index = cl->device_count;
    __atomic_store_n(&cl->device_count, cl->device_count + 1, __ATOMIC_RELEASE);
    return GPUARR_OK;
}

/* The caller's objects go back; the rows stay (an adopted device's row is never reused). */
static void gpuarr__cl_device_forget(gpuarr__dev *d) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    gpuarr__cl_device *cd = GPUARR__CL_DEV(d);
    gpuarr__cl_platform *pl = &cl->platforms[cd->platform];
    if (cd->adopted_queue) cl->clReleaseCommandQueue(cd->adopted_queue);
    if (pl->context) cl->clReleaseContext(pl->context);
    cd->adopted_queue = NULL;
    pl->context = NULL;
}

/* Every thread's default stream of an adopted device with a queue runs on that queue. */
static gpuarr_result gpuarr__cl_stream_create_default(gpuarr__dev *d, void **native) {
    gpuarr__cl_command_queue q = GPUARR__CL_DEV(d)->adopted_queue;
    if (!q) return gpuarr__cl_stream_create(d, native);
    GPUARR__CHECK(gpuarr__cl_stream_wrap(q, native));
    GPUARR__CL.clRetainCommandQueue(q); /* the stream's reference */
    return GPUARR_OK;
}

static gpuarr_result gpuarr__opencl_adopt_raw(void *context, void *device, void *queue, gpuarr_device *out) {
    GPUARR__REQUIRE_PTR(out);
    return gpuarr__registry_adopt(GPUARR_BACKEND_OPENCL, context, device, queue, out);
}

/* ---------------------------------------------------------------------------------------------
 * Exported buffers: a sub-buffer over exactly an array's bytes, whose destructor callback lets
 * go of the array's hold once the caller's last reference goes.
 * ------------------------------------------------------------------------------------------- */
#define GPUARR__CL_MEM_ASSOCIATED_MEMOBJECT 0x1107u
#define GPUARR__CL_MEM_OFFSET 0x1108u

static void gpuarr__cl_export_gone(gpuarr__cl_mem mem, void *hold) {
    GPUARR__UNUSED(mem);
    gpuarr__hold_let_go((gpuarr__hold *)hold);
}

/* The sub-buffer of a's bytes, made from the buffer that holds them (not a sub-buffer itself). */
static gpuarr_result gpuarr__cl_export_sub(gpuarr__dev *dev, const gpuarr__array *a, gpuarr__cl_mem *out) {
    gpuarr__cl_state *cl = &GPUARR__CL;
    gpuarr__cl_mem base = (gpuarr__cl_mem)a->mem, parent = NULL;
    size_t origin = a->offset, parent_offset = 0;
    if (cl->clGetMemObjectInfo(base, GPUARR__CL_MEM_ASSOCIATED_MEMOBJECT, sizeof parent, &parent, NULL) == GPUARR__CL_SUCCESS && parent &&
        cl->clGetMemObjectInfo(base, GPUARR__CL_MEM_OFFSET, sizeof parent_offset, &parent_offset, NULL) == GPUARR__CL_SUCCESS) {
        base = parent;
        origin += parent_offset;
    }
    size_t align = GPUARR__CL_DEV(dev)->base_align;
    if (a->nbytes == 0) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "a is empty: OpenCL has no buffer of 0 bytes");
    if (origin % align != 0)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "a starts at byte %zu of its buffer, not a multiple of %s's "
                            "CL_DEVICE_MEM_BASE_ADDR_ALIGN (%zu bytes): a sub-buffer cannot start there; export a copy",
                            origin, dev->info.spec, align);
    size_t region[2] = {origin, a->nbytes};
    gpuarr__cl_int e = GPUARR__CL_SUCCESS;
    *out = cl->clCreateSubBuffer(base, GPUARR__CL_MEM_READ_WRITE, GPUARR__CL_BUFFER_CREATE_TYPE_REGION, region, &e);
    if (!*out) return gpuarr__cl_fail(e, "clCreateSubBuffer", dev->info.spec);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__opencl_export_mem_raw(gpuarr_array a, void **out) {
    GPUARR__REQUIRE_PTR(out);
    gpuarr__hold *hold;
    gpuarr__array *arr;
    GPUARR__CHECK(gpuarr__hold_array(a, GPUARR_BACKEND_OPENCL, &hold, &arr));
    gpuarr__cl_mem sub = NULL;
    gpuarr_result r = gpuarr__cl_export_sub(arr->dev, arr, &sub);
    if (r == GPUARR_OK) {
        gpuarr__cl_int e = GPUARR__CL.clSetMemObjectDestructorCallback(sub, gpuarr__cl_export_gone, hold);
        if (e != GPUARR__CL_SUCCESS) {
            GPUARR__CL.clReleaseMemObject(sub);
            r = gpuarr__cl_fail(e, "clSetMemObjectDestructorCallback", arr->dev->info.spec);
        }
    }
    if (r == GPUARR_OK) *out = sub;
    else gpuarr__hold_cancel(hold);
    gpuarr__obj_release(&arr->obj);
    return r;
}

static const gpuarr__interop_OPENCL gpuarr__cl_interop = {GPUARR_BACKEND_OPENCL, GPUARR__INTEROP_OPENCL(GPUARR__INTEROP_IMPL)};

/* The OpenCL table: asynchronous, devices named "opencl:N", device memory, copies from pageable
   memory queued, CL_DEVICE_MAX_MEM_ALLOC_SIZE. Left NULL: device_reset (the context is the
   platform's, shared with its other devices: it stays; device_close and device_open around the
   reset make the device's queues and kernels anew), host_ptr_pinned (OpenCL cannot tell whether
   the caller's memory is page-locked: assume not), activate and deactivate (OpenCL has no
   current context). */
static void gpuarr__cl_backend_fill(gpuarr__backend *b) {
    b->id = GPUARR_BACKEND_OPENCL;
    b->name = "opencl";
    b->flags = GPUARR__BACKEND_PAGEABLE_ASYNC;
    b->max_alloc_name = "CL_DEVICE_MAX_MEM_ALLOC_SIZE";
    b->interop = &gpuarr__cl_interop;
    b->load = gpuarr__cl_load;
    b->unload = gpuarr__cl_unload;
    b->device_count = gpuarr__cl_device_count;
    b->device_info = gpuarr__cl_device_info;
    b->device_open = gpuarr__cl_device_open;
    b->device_close = gpuarr__cl_device_close;
    b->device_adopt = gpuarr__cl_device_adopt;
    b->device_forget = gpuarr__cl_device_forget;
    b->mem_info = gpuarr__cl_mem_info;
    b->mem_alloc = gpuarr__cl_mem_alloc;
    b->mem_free = gpuarr__cl_mem_free;
    b->mem_alignment = gpuarr__cl_mem_alignment;
    b->mem_view = gpuarr__cl_mem_view;
    b->mem_view_release = gpuarr__cl_mem_view_release;
    b->pinned_alloc = gpuarr__cl_pinned_alloc;
    b->pinned_free = gpuarr__cl_pinned_free;
    b->copy_h2d = gpuarr__cl_copy_h2d;
    b->copy_d2h = gpuarr__cl_copy_d2h;
    b->copy_d2d = gpuarr__cl_copy_d2d;
    b->can_copy_peer = gpuarr__cl_can_copy_peer;
    b->copy_peer = gpuarr__cl_copy_peer;
    b->cast = gpuarr__cl_cast;
    b->cast_supported = gpuarr__cl_cast_supported;
    b->fill = gpuarr__cl_fill;
    b->kernel_build = gpuarr__cl_kernel_build;
    b->kernel_launch = gpuarr__cl_kernel_launch;
    b->launch_host_fn = gpuarr__cl_launch_host_fn;
    b->stream_create = gpuarr__cl_stream_create;
    b->stream_create_default = gpuarr__cl_stream_create_default;
    b->stream_destroy = gpuarr__cl_stream_destroy;
    b->stream_sync = gpuarr__cl_stream_sync;
    b->stream_query = gpuarr__cl_stream_query;
    b->stream_wait_event = gpuarr__cl_stream_wait_event;
    b->event_create = gpuarr__cl_event_create;
    b->event_destroy = gpuarr__cl_event_destroy;
    b->event_record = gpuarr__cl_event_record;
    b->event_record_after_own = gpuarr__cl_event_record_after_own;
    b->event_sync = gpuarr__cl_event_sync;
    b->event_query = gpuarr__cl_event_query;
    b->event_elapsed = gpuarr__cl_event_elapsed;
    b->telemetry = gpuarr__cl_telemetry;
}
#define GPUARR__BACKEND_FILL_OPENCL gpuarr__cl_backend_fill

#endif /* GPUARR_OPENCL_BACKEND_INCLUDED */
