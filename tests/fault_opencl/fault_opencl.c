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
 * FAULT_OPENCL_COUNT=path writes "calls N" to path at exit. For tests, through dlsym:
 * fault_opencl_calls_made(), fault_opencl_fail_set(spec) (new rules, the count restarted; -1 for
 * a spec it cannot read), fault_opencl_fault_hit(name, len, &code) (the call number at which a
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
    X(O, cl_context, clCreateContext,                                                              \
      (const cl_context_properties *a, cl_uint b, const cl_device_id *c,                           \
       void(CL_CALLBACK *d)(const char *, const void *, size_t, void *), void *e, cl_int *errcode_ret), (a, b, c, d, e, errcode_ret)) \
    X(I, cl_int, clReleaseContext, (cl_context a), (a))                                            \
    X(O, cl_command_queue, clCreateCommandQueue, (cl_context a, cl_device_id b, cl_command_queue_properties c, cl_int *errcode_ret), \
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
    X(I, cl_int, clGetEventProfilingInfo, (cl_event a, cl_profiling_info b, size_t c, void *d, size_t *e), (a, b, c, d, e)) \
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
} fault = {.lock = PTHREAD_MUTEX_INITIALIZER};

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
#define FAULT_FORWARD(kind, ret, name, params, args)                                               \
    FAULT_API CL_API_ENTRY ret CL_API_CALL name params {                                           \
        cl_int e_ = fault_enter(FAULT_##name);                                                     \
        if (e_ != CL_SUCCESS) {                                                                    \
            FAULT_KEEP_##kind(name, args);                                                         \
            FAULT_FAIL_##kind(ret);                                                                \
        }                                                                                          \
        return fault.name args;                                                                    \
    }
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
FAULT_PROCS(FAULT_FORWARD)
#pragma GCC diagnostic pop

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

FAULT_API unsigned long long fault_opencl_fault_hit(char *name, size_t len, int *code);
FAULT_API unsigned long long fault_opencl_fault_hit(char *name, size_t len, int *code) {
    pthread_mutex_lock(&fault.lock);
    unsigned long long n = fault.hit_call;
    if (name && len) snprintf(name, len, "%s", n ? fault_names[fault.hit_entry] : "");
    if (code) *code = fault.hit_code;
    pthread_mutex_unlock(&fault.lock);
    return n;
}
