/*
 * fault_opencl.c -- an OpenCL library that fails chosen calls, for tests/faults. Built as
 * build/fault-opencl/libfault_opencl.so and loaded by gpuarr through GPUARR_OPENCL_LIBRARY: it
 * opens the real ICD loader (FAULT_OPENCL_REAL, default libOpenCL.so.1) and forwards every entry
 * point gpuarr uses (GPUARR__CL_PROCS in backends/gpuarr_opencl.h), counting the calls.
 *
 * FAULT_OPENCL_FAIL: one or more rules separated by commas, as FAKE_CUDA_FAIL in
 * tests/fake_cuda/fake_cuda.c:
 *   nth=N[:CODE]        the Nth call of the process, counting every entry point
 *   ENTRY:N[:CODE]      the Nth call of one entry point, by name
 * e.g. FAULT_OPENCL_FAIL="nth=17", "clEnqueueWriteBuffer:2:CL_OUT_OF_RESOURCES",
 * "clBuildProgram:1:-11". CODE is a cl_int, by number or by name (those below); CL_OUT_OF_RESOURCES
 * when left out. A failed call does not reach the driver: one returning cl_int returns CODE; one
 * returning an object (clCreateBuffer, clEnqueueMapBuffer...) returns NULL and stores CODE in
 * *errcode_ret. Calls are counted from the library's first call. An object whose clRelease* call
 * failed stays alive, as it would in the driver (and a buffer whose clEnqueueUnmapMemObject failed:
 * still mapped): the library keeps its handle (so LeakSanitizer
 * sees the driver's memory held, not lost).
 * FAULT_OPENCL_LOST=D:N[:notify] loses a device: opencl:D (every platform's devices in order, as
 * gpuarr numbers them) from the Nth call on one of its command queues (counted from the library's
 * first call): from then on every clEnqueue*, clFlush and clFinish on its queues, and every
 * clCreateCommandQueue for it, fail with CL_DEVICE_NOT_AVAILABLE without reaching the driver;
 * releases still work (the driver's objects are freed as on a real lost device). With notify,
 * the first such failure also calls the callback (pfn_notify) of the queue's context.
 * FAULT_OPENCL_PROFILING=marker-end-far gives markers' and barriers' profiled end 10^16 ns late,
 * as NVIDIA's OpenCL did on an H100.
 * FAULT_OPENCL_COUNT=path writes "calls N" to path at exit. For tests, through dlsym:
 * fault_opencl_calls_made(), fault_opencl_fail_set(spec) (new rules, the count restarted; -1 for
 * a spec it cannot read), fault_opencl_lose(D, N, notify) (FAULT_OPENCL_LOST from now; D = -1:
 * none), fault_opencl_fault_hit(name, len, &code) (the call number at which a
 * rule fired, 0 if none has).
 */
#define _GNU_SOURCE
#define CL_TARGET_OPENCL_VERSION 300
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include <CL/cl.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../faults/fault_spec.h"

#define FAULT_API __attribute__((visibility("default")))

/* kind I: returns cl_int; O: returns an object, errcode_ret its last parameter */
#define FAULT_PROCS(X)                                                                             \
    X(I, cl_int, clGetPlatformIDs, (cl_uint a, cl_platform_id *b, cl_uint *c), (a, b, c))         \
    X(I, cl_int, clGetPlatformInfo, (cl_platform_id a, cl_platform_info b, size_t c, void *d, size_t *e), (a, b, c, d, e)) \
    X(I, cl_int, clGetDeviceIDs, (cl_platform_id a, cl_device_type b, cl_uint c, cl_device_id *d, cl_uint *e), (a, b, c, d, e)) \
    X(I, cl_int, clGetDeviceInfo, (cl_device_id a, cl_device_info b, size_t c, void *d, size_t *e), (a, b, c, d, e)) \
    X(OC, cl_context, clCreateContext,                                                              \
      (const cl_context_properties *a, cl_uint b, const cl_device_id *c,                           \
       void(CL_CALLBACK *d)(const char *, const void *, size_t, void *), void *e, cl_int *errcode_ret), (a, b, c, d, e, errcode_ret)) \
    X(I, cl_int, clRetainContext, (cl_context a), (a))                                             \
    X(I, cl_int, clReleaseContext, (cl_context a), (a))                                            \
    X(I, cl_int, clGetContextInfo, (cl_context a, cl_context_info b, size_t c, void *d, size_t *e), (a, b, c, d, e)) \
    X(OC, cl_command_queue, clCreateCommandQueue, (cl_context a, cl_device_id b, cl_command_queue_properties c, cl_int *errcode_ret), \
      (a, b, c, errcode_ret))                                                                      \
    X(I, cl_int, clRetainCommandQueue, (cl_command_queue a), (a))                                  \
    X(I, cl_int, clReleaseCommandQueue, (cl_command_queue a), (a))                                 \
    X(I, cl_int, clGetCommandQueueInfo, (cl_command_queue a, cl_command_queue_info b, size_t c, void *d, size_t *e), (a, b, c, d, e)) \
    X(O, cl_mem, clCreateBuffer, (cl_context a, cl_mem_flags b, size_t c, void *d, cl_int *errcode_ret), (a, b, c, d, errcode_ret)) \
    X(O, cl_mem, clCreateSubBuffer, (cl_mem a, cl_mem_flags b, cl_buffer_create_type c, const void *d, cl_int *errcode_ret), \
      (a, b, c, d, errcode_ret))                                                                   \
    X(I, cl_int, clRetainMemObject, (cl_mem a), (a))                                               \
    X(I, cl_int, clReleaseMemObject, (cl_mem a), (a))                                              \
    X(I, cl_int, clGetMemObjectInfo, (cl_mem a, cl_mem_info b, size_t c, void *d, size_t *e), (a, b, c, d, e)) \
    X(I, cl_int, clSetMemObjectDestructorCallback, (cl_mem a, void(CL_CALLBACK *b)(cl_mem, void *), void *c), (a, b, c)) \
    X(I, cl_int, clEnqueueWriteBuffer,                                                             \
      (cl_command_queue a, cl_mem b, cl_bool c, size_t d, size_t e, const void *f, cl_uint g, const cl_event *h, cl_event *i), \
      (a, b, c, d, e, f, g, h, i))                                                                 \
    X(I, cl_int, clEnqueueReadBuffer,                                                              \
      (cl_command_queue a, cl_mem b, cl_bool c, size_t d, size_t e, void *f, cl_uint g, const cl_event *h, cl_event *i), \
      (a, b, c, d, e, f, g, h, i))                                                                 \
    X(I, cl_int, clEnqueueCopyBuffer,                                                              \
      (cl_command_queue a, cl_mem b, cl_mem c, size_t d, size_t e, size_t f, cl_uint g, const cl_event *h, cl_event *i), \
      (a, b, c, d, e, f, g, h, i))                                                                 \
    X(I, cl_int, clEnqueueFillBuffer,                                                              \
      (cl_command_queue a, cl_mem b, const void *c, size_t d, size_t e, size_t f, cl_uint g, const cl_event *h, cl_event *i), \
      (a, b, c, d, e, f, g, h, i))                                                                 \
    X(O, void *, clEnqueueMapBuffer,                                                               \
      (cl_command_queue a, cl_mem b, cl_bool c, cl_map_flags d, size_t e, size_t f, cl_uint g, const cl_event *h, cl_event *i, \
       cl_int *errcode_ret),                                                                       \
      (a, b, c, d, e, f, g, h, i, errcode_ret))                                                    \
    X(I, cl_int, clEnqueueUnmapMemObject, (cl_command_queue a, cl_mem b, void *c, cl_uint d, const cl_event *e, cl_event *f), \
      (a, b, c, d, e, f))                                                                          \
    X(I, cl_int, clEnqueueMigrateMemObjects,                                                       \
      (cl_command_queue a, cl_uint b, const cl_mem *c, cl_mem_migration_flags d, cl_uint e, const cl_event *f, cl_event *g), \
      (a, b, c, d, e, f, g))                                                                       \
    X(O, cl_program, clCreateProgramWithSource, (cl_context a, cl_uint b, const char **c, const size_t *d, cl_int *errcode_ret), \
      (a, b, c, d, errcode_ret))                                                                   \
    X(O, cl_program, clCreateProgramWithBinary,                                                    \
      (cl_context a, cl_uint b, const cl_device_id *c, const size_t *d, const unsigned char **e, cl_int *f, cl_int *errcode_ret), \
      (a, b, c, d, e, f, errcode_ret))                                                             \
    X(I, cl_int, clBuildProgram,                                                                   \
      (cl_program a, cl_uint b, const cl_device_id *c, const char *d, void(CL_CALLBACK *e)(cl_program, void *), void *f), \
      (a, b, c, d, e, f))                                                                          \
    X(I, cl_int, clGetProgramBuildInfo, (cl_program a, cl_device_id b, cl_program_build_info c, size_t d, void *e, size_t *f), \
      (a, b, c, d, e, f))                                                                          \
    X(I, cl_int, clGetProgramInfo, (cl_program a, cl_program_info b, size_t c, void *d, size_t *e), (a, b, c, d, e)) \
    X(I, cl_int, clReleaseProgram, (cl_program a), (a))                                            \
    X(O, cl_kernel, clCreateKernel, (cl_program a, const char *b, cl_int *errcode_ret), (a, b, errcode_ret)) \
    X(I, cl_int, clSetKernelArg, (cl_kernel a, cl_uint b, size_t c, const void *d), (a, b, c, d))  \
    X(I, cl_int, clReleaseKernel, (cl_kernel a), (a))                                              \
    X(I, cl_int, clGetKernelWorkGroupInfo, (cl_kernel a, cl_device_id b, cl_kernel_work_group_info c, size_t d, void *e, size_t *f), \
      (a, b, c, d, e, f))                                                                          \
    X(I, cl_int, clEnqueueNDRangeKernel,                                                           \
      (cl_command_queue a, cl_kernel b, cl_uint c, const size_t *d, const size_t *e, const size_t *f, cl_uint g, const cl_event *h, \
       cl_event *i),                                                                               \
      (a, b, c, d, e, f, g, h, i))                                                                 \
    X(I, cl_int, clEnqueueMarkerWithWaitList, (cl_command_queue a, cl_uint b, const cl_event *c, cl_event *d), (a, b, c, d)) \
    X(I, cl_int, clEnqueueBarrierWithWaitList, (cl_command_queue a, cl_uint b, const cl_event *c, cl_event *d), (a, b, c, d)) \
    X(I, cl_int, clFlush, (cl_command_queue a), (a))                                               \
    X(I, cl_int, clFinish, (cl_command_queue a), (a))                                              \
    X(I, cl_int, clWaitForEvents, (cl_uint a, const cl_event *b), (a, b))                          \
    X(I, cl_int, clGetEventInfo, (cl_event a, cl_event_info b, size_t c, void *d, size_t *e), (a, b, c, d, e)) \
    X(OC, cl_int, clGetEventProfilingInfo, (cl_event a, cl_profiling_info b, size_t c, void *d, size_t *e), (a, b, c, d, e)) \
    X(O, cl_event, clCreateUserEvent, (cl_context a, cl_int *errcode_ret), (a, errcode_ret))      \
    X(I, cl_int, clSetUserEventStatus, (cl_event a, cl_int b), (a, b))                             \
    X(I, cl_int, clSetEventCallback, (cl_event a, cl_int b, void(CL_CALLBACK *c)(cl_event, cl_int, void *), void *d), (a, b, c, d)) \
    X(I, cl_int, clRetainEvent, (cl_event a), (a))                                                 \
    X(I, cl_int, clReleaseEvent, (cl_event a), (a))

#define FAULT_ERRORS(X)                                                                            \
    X(CL_DEVICE_NOT_FOUND) X(CL_DEVICE_NOT_AVAILABLE) X(CL_COMPILER_NOT_AVAILABLE)                 \
    X(CL_MEM_OBJECT_ALLOCATION_FAILURE) X(CL_OUT_OF_RESOURCES) X(CL_OUT_OF_HOST_MEMORY)            \
    X(CL_BUILD_PROGRAM_FAILURE) X(CL_MAP_FAILURE) X(CL_INVALID_VALUE) X(CL_INVALID_PLATFORM)       \
    X(CL_INVALID_DEVICE) X(CL_INVALID_CONTEXT) X(CL_INVALID_COMMAND_QUEUE) X(CL_INVALID_MEM_OBJECT) \
    X(CL_INVALID_PROGRAM) X(CL_INVALID_KERNEL) X(CL_INVALID_KERNEL_ARGS) X(CL_INVALID_EVENT)       \
    X(CL_INVALID_OPERATION) X(CL_INVALID_BUFFER_SIZE) X(CL_INVALID_WORK_GROUP_SIZE)                \
    X(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)

/* ------------------------------------------------------------------------------------------- */
enum {
#define FAULT_INDEX(kind, ret, name, params, args) FAULT_##name,
    FAULT_PROCS(FAULT_INDEX)
#undef FAULT_INDEX
    FAULT_PROC_COUNT
};
static const char *const fault_names[] = {
#define FAULT_NAME(kind, ret, name, params, args) #name,
    FAULT_PROCS(FAULT_NAME)
#undef FAULT_NAME
};

typedef struct fault_rule {
    int entry; /* -1: any (nth=) */
    unsigned long long nth;
    cl_int code;
} fault_rule;

static struct {
    pthread_mutex_t lock;
    bool setup;
    void *real;
#define FAULT_MEMBER(kind, ret, name, params, args) ret(CL_API_CALL *name) params;
    FAULT_PROCS(FAULT_MEMBER)
#undef FAULT_MEMBER
    fault_rule rules[16];
    int rule_count;
    unsigned long long calls, entry_calls[FAULT_PROC_COUNT];
    unsigned long long hit_call;
    int hit_entry;
    cl_int hit_code;
    char count_path[4096];
    const void *kept[4096]; /* objects whose release failed: still the driver's */
    int kept_count;
    /* FAULT_OPENCL_LOST: a lost device */
    int lost_index;                    /* the device (opencl:N numbering); -1: none */
    cl_device_id lost_device;
    unsigned long long lost_nth, lost_calls; /* from its nth queue call on, it is gone */
    bool lost, lost_notify, notified;
    bool marker_end_far; /* FAULT_OPENCL_PROFILING=marker-end-far */
    struct { cl_command_queue queue; cl_device_id device; } queues[1024]; /* every queue made, newest last */
    int queue_count;
    struct { cl_context context; void(CL_CALLBACK *notify)(const char *, const void *, size_t, void *); void *user; } contexts[64];
    int context_count;
} fault = {.lock = PTHREAD_MUTEX_INITIALIZER, .lost_index = -1};

/* A failed clRelease*(object): the object lives on in the driver; so does a buffer whose
   clEnqueueUnmapMemObject failed (still mapped). */
static void fault_keep(const char *name, const void *object) {
    if (strncmp(name, "clRelease", 9) != 0 && strcmp(name, "clEnqueueUnmapMemObject") != 0) return;
    const void *parent = NULL; /* a mapped sub-buffer's parent is held by the mapping too */
    if (strcmp(name, "clEnqueueUnmapMemObject") == 0 && fault.clGetMemObjectInfo)
        fault.clGetMemObjectInfo((cl_mem)(uintptr_t)object, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof parent, &parent, NULL);
    pthread_mutex_lock(&fault.lock);
    if (fault.kept_count < 4096) fault.kept[fault.kept_count++] = object;
    if (parent && fault.kept_count < 4096) fault.kept[fault.kept_count++] = parent;
    pthread_mutex_unlock(&fault.lock);
}
#define FAULT_FIRST_(a, ...) a
#define FAULT_FIRST_ARG(...) FAULT_FIRST_(__VA_ARGS__, 0)

static bool fault_code(const char *text, cl_int *out) {
    char *end;
    long v = strtol(text, &end, 0);
    if (end != text && !*end) {
        *out = (cl_int)v;
        return true;
    }
#define FAULT_CODE(code)                                                                           \
    if (strcmp(text, #code) == 0) {                                                                \
        *out = code;                                                                               \
        return true;                                                                               \
    }
    FAULT_ERRORS(FAULT_CODE)
#undef FAULT_CODE
    return false;
}

static bool fault_parse(const char *spec) {
    fault.rule_count = 0;
    fault_spec_rule rule;
    int got;
    while (spec && (got = fault_spec_next(&spec, &rule)) != 0) {
        if (got < 0 || fault.rule_count == 16) goto bad;
        fault_rule *r = &fault.rules[fault.rule_count];
        r->entry = -1;
        r->code = CL_OUT_OF_RESOURCES;
        r->nth = rule.nth;
        if (rule.entry) {
            for (int i = 0; i < FAULT_PROC_COUNT; i++)
                if (strcmp(fault_names[i], rule.entry) == 0) r->entry = i;
            if (r->entry < 0) goto bad;
        }
        if (rule.code && !fault_code(rule.code, &r->code)) goto bad;
        fault.rule_count++;
    }
    return true;
bad:
    fault.rule_count = 0;
    return false;
}

static void fault_write_count(void) {
    pthread_mutex_lock(&fault.lock);
    FILE *f = fopen(fault.count_path, "w");
    if (f) {
        fprintf(f, "calls %llu\n", fault.calls);
        fclose(f);
    }
    pthread_mutex_unlock(&fault.lock);
}

static void fault_lost_arm(int index, unsigned long long nth, bool notify);

/* Under the lock. Aborts when the real loader or one of its entry points is missing: a test
   setup error, not a fault to inject. */
static void fault_setup(void) {
    if (fault.setup) return;
    fault.setup = true;
    const char *path = getenv("FAULT_OPENCL_REAL");
    fault.real = dlopen(path && *path ? path : "libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!fault.real) {
        fprintf(stderr, "fault-opencl: cannot open the real OpenCL library: %s\n", dlerror());
        abort();
    }
#define FAULT_BIND(kind, ret, name, params, args)                                                  \
    {                                                                                              \
        void *sym = dlsym(fault.real, #name);                                                      \
        if (!sym) {                                                                                \
            fprintf(stderr, "fault-opencl: the real OpenCL library lacks %s\n", #name);            \
            abort();                                                                               \
        }                                                                                          \
        memcpy(&fault.name, &sym, sizeof sym);                                                     \
    }
    FAULT_PROCS(FAULT_BIND)
#undef FAULT_BIND
    const char *spec = getenv("FAULT_OPENCL_FAIL");
    if (!fault_parse(spec)) {
        fprintf(stderr, "fault-opencl: FAULT_OPENCL_FAIL=\"%s\": expected nth=N[:CODE] or ENTRY:N[:CODE], comma-separated\n", spec);
        abort();
    }
    const char *lost = getenv("FAULT_OPENCL_LOST");
    if (lost && *lost) {
        int index = -1;
        unsigned long long nth = 0;
        char how[16] = "";
        if (sscanf(lost, "%d:%llu:%15s", &index, &nth, how) < 2 || (how[0] && strcmp(how, "notify") != 0)) {
            fprintf(stderr, "fault-opencl: FAULT_OPENCL_LOST=\"%s\": expected DEVICE:N or DEVICE:N:notify\n", lost);
            abort();
        }
        fault_lost_arm(index, nth, how[0] != 0);
    }
    const char *profiling = getenv("FAULT_OPENCL_PROFILING");
    if (profiling && *profiling) {
        if (strcmp(profiling, "marker-end-far") != 0) {
            fprintf(stderr, "fault-opencl: FAULT_OPENCL_PROFILING=\"%s\": expected marker-end-far\n", profiling);
            abort();
        }
        fault.marker_end_far = true;
    }
    const char *count = getenv("FAULT_OPENCL_COUNT");
    if (count && *count && strlen(count) < sizeof fault.count_path) {
        strcpy(fault.count_path, count);
        atexit(fault_write_count);
    }
}

/* Counts a call of entry point `entry`: the error it fails with, or CL_SUCCESS. */
static cl_int fault_enter(int entry) {
    pthread_mutex_lock(&fault.lock);
    fault_setup();
    unsigned long long n = ++fault.calls, here = ++fault.entry_calls[entry];
    cl_int e = CL_SUCCESS;
    for (int r = 0; r < fault.rule_count && e == CL_SUCCESS; r++) {
        const fault_rule *rule = &fault.rules[r];
        if (rule->entry >= 0 ? rule->entry == entry && rule->nth == here : rule->nth == n) {
            e = rule->code;
            if (!fault.hit_call) {
                fault.hit_call = n;
                fault.hit_entry = entry;
                fault.hit_code = e;
            }
        }
    }
    pthread_mutex_unlock(&fault.lock);
    return e;
}

/* ---- FAULT_OPENCL_LOST: calls on one device's queues fail with CL_DEVICE_NOT_AVAILABLE ---- */
static bool fault_is_queue_call(int entry) {
    const char *n = fault_names[entry];
    return strncmp(n, "clEnqueue", 9) == 0 || strcmp(n, "clFlush") == 0 || strcmp(n, "clFinish") == 0;
}

/* The lost device's id: the lost_index-th device of every platform's devices, in order (gpuarr's
   opencl:N). Under the lock. */
static void fault_find_lost_device(void) {
    fault.lost_device = NULL;
    cl_platform_id platforms[16];
    cl_uint np = 0;
    if (fault.lost_index < 0 || fault.clGetPlatformIDs(16, platforms, &np) != CL_SUCCESS) return;
    int k = 0;
    for (cl_uint p = 0; p < np && p < 16; p++) {
        cl_device_id ids[64];
        cl_uint nd = 0;
        if (fault.clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, 64, ids, &nd) != CL_SUCCESS) continue;
        for (cl_uint i = 0; i < nd && i < 64; i++, k++)
            if (k == fault.lost_index) fault.lost_device = ids[i];
    }
}

static cl_device_id fault_queue_device(const void *queue) {
    for (int i = fault.queue_count; i-- > 0;)
        if ((const void *)fault.queues[i].queue == queue) return fault.queues[i].device;
    return NULL;
}

/* A call's fate under FAULT_OPENCL_LOST: CL_SUCCESS, or CL_DEVICE_NOT_AVAILABLE; *notify is set
   when the context's callback must be called now (the first failure, with notify asked). */
static cl_int fault_lost_check(int entry, const void *first, const void *second, void (CL_CALLBACK **notify)(const char *, const void *, size_t, void *),
                               void **user) {
    *notify = NULL;
    pthread_mutex_lock(&fault.lock);
    cl_int e = CL_SUCCESS;
    cl_device_id dev = NULL;
    if (fault.lost_device && fault_is_queue_call(entry)) dev = fault_queue_device(first);
    else if (fault.lost_device && entry == FAULT_clCreateCommandQueue) dev = (cl_device_id)(uintptr_t)second;
    if (dev && dev == fault.lost_device) {
        if (entry != FAULT_clCreateCommandQueue && ++fault.lost_calls >= fault.lost_nth) fault.lost = true;
        if (fault.lost) e = CL_DEVICE_NOT_AVAILABLE;
        if (fault.lost && fault.lost_notify && !fault.notified) {
            fault.notified = true;
            cl_context ctx = NULL;
            if (entry != FAULT_clCreateCommandQueue) fault.clGetCommandQueueInfo((cl_command_queue)(uintptr_t)first, CL_QUEUE_CONTEXT, sizeof ctx, &ctx, NULL);
            for (int i = 0; i < fault.context_count; i++)
                if (fault.contexts[i].context == ctx) *notify = fault.contexts[i].notify, *user = fault.contexts[i].user;
        }
    }
    pthread_mutex_unlock(&fault.lock);
    return e;
}

static void fault_lost_arm(int index, unsigned long long nth, bool notify) {
    fault.lost_index = index;
    fault.lost_nth = nth ? nth : 1;
    fault.lost_calls = 0;
    fault.lost = fault.notified = false;
    fault.lost_notify = notify;
    fault_find_lost_device();
}

#define FAULT_FAIL_I(ret) return e_
#define FAULT_SECOND_(a, b, ...) b
#define FAULT_SECOND_ARG(...) FAULT_SECOND_(__VA_ARGS__, 0, 0)
#define FAULT_KEEP_I(name, args)                                                                   \
    fault_keep(#name, strcmp(#name, "clEnqueueUnmapMemObject") == 0 ? (const void *)(uintptr_t)(FAULT_SECOND_ARG args)   \
                                                                   : (const void *)(uintptr_t)(FAULT_FIRST_ARG args))
#define FAULT_KEEP_O(name, args)
#define FAULT_FAIL_O(ret)                                                                          \
    if (errcode_ret) *errcode_ret = e_;                                                            \
    return (ret)NULL
#define FAULT_FORWARD_GEN(kind, ret, name, params, args)                                           \
    FAULT_API CL_API_ENTRY ret CL_API_CALL name params {                                           \
        cl_int e_ = fault_enter(FAULT_##name);                                                     \
        void(CL_CALLBACK * notify_)(const char *, const void *, size_t, void *) = NULL;            \
        void *user_ = NULL;                                                                        \
        if (e_ == CL_SUCCESS)                                                                      \
            e_ = fault_lost_check(FAULT_##name, (const void *)(uintptr_t)(FAULT_FIRST_ARG args),  \
                                  (const void *)(uintptr_t)(FAULT_SECOND_ARG args), &notify_, &user_); \
        if (notify_) notify_("fault-opencl: the device was lost (FAULT_OPENCL_LOST)", NULL, 0, user_); \
        if (e_ != CL_SUCCESS) {                                                                    \
            FAULT_KEEP_##kind(name, args);                                                         \
            FAULT_FAIL_##kind(ret);                                                                \
        }                                                                                          \
        return fault.name args;                                                                    \
    }
#define FAULT_FORWARD_I FAULT_FORWARD_GEN
#define FAULT_FORWARD_O FAULT_FORWARD_GEN
#define FAULT_FORWARD_OC(kind, ret, name, params, args) /* written out below */
#define FAULT_FORWARD(kind, ret, name, params, args) FAULT_FORWARD_##kind(kind, ret, name, params, args)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
FAULT_PROCS(FAULT_FORWARD)
#pragma GCC diagnostic pop

/* FAULT_OPENCL_PROFILING=marker-end-far: a marker's or barrier's CL_PROFILING_COMMAND_END comes
   back 10^16 ns after the truth, as NVIDIA's OpenCL (driver 580.159.04, H100) gave for a marker
   waiting on events. */
FAULT_API CL_API_ENTRY cl_int CL_API_CALL clGetEventProfilingInfo(cl_event a, cl_profiling_info b, size_t c, void *d, size_t *e) {
    cl_int e_ = fault_enter(FAULT_clGetEventProfilingInfo);
    if (e_ != CL_SUCCESS) return e_;
    e_ = fault.clGetEventProfilingInfo(a, b, c, d, e);
    if (e_ != CL_SUCCESS || !fault.marker_end_far || b != CL_PROFILING_COMMAND_END || !d || c < sizeof(cl_ulong)) return e_;
    cl_command_type type = 0;
    if (fault.clGetEventInfo(a, CL_EVENT_COMMAND_TYPE, sizeof type, &type, NULL) == CL_SUCCESS &&
        (type == CL_COMMAND_MARKER || type == CL_COMMAND_BARRIER))
        *(cl_ulong *)d += 10000000000000000ull;
    return e_;
}

/* Contexts and queues are remembered: whose callback to call, which device a queue is on. */
FAULT_API CL_API_ENTRY cl_context CL_API_CALL clCreateContext(const cl_context_properties *a, cl_uint b, const cl_device_id *c,
                                                              void(CL_CALLBACK *d)(const char *, const void *, size_t, void *), void *e,
                                                              cl_int *errcode_ret) {
    cl_int e_ = fault_enter(FAULT_clCreateContext);
    if (e_ != CL_SUCCESS) {
        if (errcode_ret) *errcode_ret = e_;
        return NULL;
    }
    cl_context ctx = fault.clCreateContext(a, b, c, d, e, errcode_ret);
    pthread_mutex_lock(&fault.lock);
    if (ctx && fault.context_count < 64) {
        fault.contexts[fault.context_count].context = ctx;
        fault.contexts[fault.context_count].notify = d;
        fault.contexts[fault.context_count++].user = e;
    }
    pthread_mutex_unlock(&fault.lock);
    return ctx;
}

FAULT_API CL_API_ENTRY cl_command_queue CL_API_CALL clCreateCommandQueue(cl_context a, cl_device_id b, cl_command_queue_properties c,
                                                                         cl_int *errcode_ret) {
    cl_int e_ = fault_enter(FAULT_clCreateCommandQueue);
    void(CL_CALLBACK * notify)(const char *, const void *, size_t, void *) = NULL;
    void *user = NULL;
    if (e_ == CL_SUCCESS) e_ = fault_lost_check(FAULT_clCreateCommandQueue, a, b, &notify, &user);
    if (e_ != CL_SUCCESS) {
        if (errcode_ret) *errcode_ret = e_;
        return NULL;
    }
    cl_command_queue q = fault.clCreateCommandQueue(a, b, c, errcode_ret);
    pthread_mutex_lock(&fault.lock);
    if (q) {
        int i = fault.queue_count;
        while (i-- > 0 && fault.queues[i].queue != q) {}
        if (i < 0 && fault.queue_count == 1024) { /* full: the oldest go */
            memmove(fault.queues, fault.queues + 512, 512 * sizeof fault.queues[0]);
            fault.queue_count = 512;
        }
        if (i < 0) i = fault.queue_count++;
        fault.queues[i].queue = q;
        fault.queues[i].device = b;
    }
    pthread_mutex_unlock(&fault.lock);
    return q;
}

FAULT_API unsigned long long fault_opencl_calls_made(void);
FAULT_API unsigned long long fault_opencl_calls_made(void) {
    pthread_mutex_lock(&fault.lock);
    unsigned long long n = fault.calls;
    pthread_mutex_unlock(&fault.lock);
    return n;
}

FAULT_API int fault_opencl_fail_set(const char *spec);
FAULT_API int fault_opencl_fail_set(const char *spec) {
    pthread_mutex_lock(&fault.lock);
    fault_setup();
    bool ok = fault_parse(spec);
    fault.calls = 0;
    memset(fault.entry_calls, 0, sizeof fault.entry_calls);
    fault.hit_call = 0;
    fault.hit_entry = 0;
    fault.hit_code = CL_SUCCESS;
    pthread_mutex_unlock(&fault.lock);
    return ok ? 0 : -1;
}

/* FAULT_OPENCL_LOST at run time: device `index` (opencl:N numbering; -1: none) is lost from its
   nth queue call from now; with notify, its context's callback is called at the first failure. */
FAULT_API void fault_opencl_lose(int index, unsigned long long nth, int notify);
FAULT_API void fault_opencl_lose(int index, unsigned long long nth, int notify) {
    pthread_mutex_lock(&fault.lock);
    fault_setup();
    fault_lost_arm(index, nth, notify != 0);
    pthread_mutex_unlock(&fault.lock);
}

FAULT_API unsigned long long fault_opencl_fault_hit(char *name, size_t len, int *code);
FAULT_API unsigned long long fault_opencl_fault_hit(char *name, size_t len, int *code) {
    pthread_mutex_lock(&fault.lock);
    unsigned long long n = fault.hit_call;
    if (name && len) snprintf(name, len, "%s", n ? fault_names[fault.hit_entry] : "");
    if (code) *code = fault.hit_code;
    pthread_mutex_unlock(&fault.lock);
    return n;
}
