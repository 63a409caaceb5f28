/*
 * fake_cuda.c -- a CUDA driver (libcuda.so.1) that runs on the CPU, for testing gpuarr's CUDA
 * backend on machines without a GPU. It is built as build/fake-cuda/libcuda.so.1 and loaded by
 * gpuarr through GPUARR_CUDA_LIBRARY; `make test` runs the whole suite on its cuda:0 and cuda:1.
 *
 * It is not a GPU simulator; it is a strict model of the driver contract gpuarr relies on, so
 * that the mistakes a real GPU would punish show up here as wrong values or errors:
 *   - work on a stream (copies, kernels, host functions) runs only when the host waits for it
 *     (stream or event synchronize, a query -- the first query of pending work answers
 *     NOT_READY, the second runs it -- a wait of another stream, or a blocking call), so missing
 *     waits between streams read stale data; destroying an event does not wait;
 *   - async copies from and to pinned memory (cuMemHostAlloc, cuMemHostRegister) happen when
 *     the stream runs, so a staging buffer reused too early is caught; pageable sources are
 *     copied at the call and pageable destinations make the call synchronous, as CUDA does;
 *   - device addresses are non-canonical (dereferencing one on the host crashes) and never
 *     reused; every copy, memset and kernel argument is checked against the allocations;
 *   - every call that needs a context fails with CUDA_ERROR_INVALID_CONTEXT without one, and a
 *     stream, event or function used from another context is refused;
 *   - contexts: each device's primary one, and those cuCtxCreate (_v2, _v4) makes, pushed on the
 *     thread's context stack (cuCtxPushCurrent/PopCurrent; cuCtxSetCurrent replaces its top, NULL
 *     pops). Memory, pinned blocks, streams, events and modules belong to the context current at
 *     their creation; a kernel reaches only its context's memory and that of contexts it enabled
 *     peer access to (never another context of the same device); cuMemcpyPeer copies between any
 *     two. cuCtxDestroy runs the context's queued work, then frees all it holds; a destroyed or
 *     unknown context handle is refused with CUDA_ERROR_INVALID_CONTEXT (CONTEXT_IS_DESTROYED
 *     where it is still current on a thread), and a freed event, module or function handle with
 *     CUDA_ERROR_INVALID_HANDLE, never read;
 *   - modules are PTX (its .version checked against FAKE_CUDA_PTX_MAX_ISA, default 9.0, and its
 *     .target against the device) or a CUDA ELF cubin for the device's sm; kernels named
 *     gpuarr_k_cast_<S>_<T> run gpuarr's own host reference casts, over the launched threads;
 *     kernels named gpuarr_kernel_<name> (portable kernels, GPUARR_KERNEL) run their host form
 *     through the hooks below.
 * Portable kernels: gpuarr's CUDA backend, right after loading this library, finds the exported
 * gpuarr_sim_kernel_hooks_set(hooks, on) with dlsym and hands over its gpuarr__sim_kernel_hooks
 * (gpuarr.h), so any program run with GPUARR_CUDA_LIBRARY=<this library> has them, nothing to
 * set up. cuLaunchKernel of a gpuarr_kernel_* function (1-3 dimensions, CUDA's limits: at most
 * 1024 threads a block, 1024 x 1024 x 64, a grid of 2^31-1 x 65535 x 65535 blocks) captures the
 * parameters through the hooks (a launch gpuarr did not build, or whose threads do not cover the
 * index space, is refused with CUDA_ERROR_INVALID_VALUE), checks every array address against the
 * allocations the device can reach (CUDA_ERROR_ILLEGAL_ADDRESS at the call, as the casts), and
 * queues the run on the stream like any op: it counts for FAKE_CUDA_STICKY, for memory still in
 * use at cuMemFree, and an address with no memory behind it when it runs faults the context with
 * CUDA_ERROR_ILLEGAL_ADDRESS. Several gpuarr copies in one process may each register (up to 8).
 * Environment: FAKE_CUDA_DEVICES (default 2), FAKE_CUDA_MEMORY (bytes per device, default
 * 1 GiB), FAKE_CUDA_PEER=0 (no peer access), FAKE_CUDA_PTX_MAX_ISA ("7.0" makes newer PTX fail
 * to load, as an old driver does), FAKE_CUDA_PTXAS=<ptxas> (every PTX module loaded is first
 * compiled by that ptxas for sm_90, and one it refuses fails with CUDA_ERROR_INVALID_PTX, ptxas's
 * words in the JIT log and on stderr: how make test checks the PTX NVRTC makes), FAKE_CUDA_TRACE=1 (a line per refused call on stderr; 2: also a line per operation run).
 * fake_cuda_ops_run() (exported, for tests through dlsym) counts the operations the calling
 * thread has run; fake_cuda_destroyed_stream_uses() the calls given a destroyed stream (refused
 * here, a crash on a real driver).
 *
 * Faults (tests/faults): FAKE_CUDA_FAIL fails chosen driver calls. Its value is one or more rules
 * separated by commas:
 *   nth=N[:CODE]        the Nth driver call of the process, counting every entry point
 *   ENTRY:N[:CODE]      the Nth call of one entry point, by its exported name
 * e.g. FAKE_CUDA_FAIL="nth=17", "cuMemcpyHtoDAsync_v2:2:CUDA_ERROR_LAUNCH_FAILED",
 * "cuMemAlloc_v2:1:2,cuLaunchKernel:3:700". CODE is a CUresult, by number or by name (the names
 * cuGetErrorName knows, below); CUDA_ERROR_UNKNOWN (999) when left out. N counts from 1. A failed
 * call does nothing else (out-parameters untouched). Calls are counted from the first call after
 * the library is loaded (cuInit included); cuGetErrorName, cuGetErrorString and cuGetExportTable
 * are neither counted nor failed.
 * Sticky errors: CUDA_ERROR_ILLEGAL_ADDRESS, LAUNCH_FAILED, LAUNCH_TIMEOUT, ASSERT,
 * HARDWARE_STACK_ERROR, ILLEGAL_INSTRUCTION, MISALIGNED_ADDRESS, INVALID_ADDRESS_SPACE and
 * INVALID_PC, injected into a call made with a current context, corrupt that context as on the
 * real driver: every later call in it (anything but cuInit, cuDriverGetVersion, cuDevice* and
 * cuCtxGetCurrent/cuCtxSetCurrent) returns that error, its queued work never runs (host
 * functions included: the driver does not call them after a context error), until the primary
 * context is released to zero retains (destroyed), which also drops its streams' queued work.
 * FAKE_CUDA_STICKY=N: the Nth copy, memset or kernel that runs on a stream (not at its call: when
 * the stream runs it) faults with CUDA_ERROR_ILLEGAL_ADDRESS, a sticky error found mid-stream as
 * on a GPU: it does not run, its context is corrupted as above, and the synchronize or query that
 * ran it returns the error; cuDevicePrimaryCtxReset destroys the context (and the error) at once.
 * FAKE_CUDA_COUNT=path writes "calls N" (the calls counted) to path at exit. For tests, through
 * dlsym: fake_cuda_calls_made() (calls counted so far), fake_cuda_fail_set(spec) (sets the rules
 * as FAKE_CUDA_FAIL does and restarts the count: 0, or -1 for a spec it cannot read, which
 * clears the rules), fake_cuda_sticky_set(n) (FAKE_CUDA_STICKY from now: the nth op run faults; 0
 * none), fake_cuda_fault_hit(name, len, &code) (the call number at which a rule
 * fired and the entry point's name, 0 if none has), fake_cuda_live_objects() (allocations, pinned
 * blocks, streams, events and modules alive).
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <elf.h>
#include <fenv.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../faults/fault_spec.h"

/* gpuarr's host casts are the reference the kernels compute (hidden: -fvisibility=hidden). */
#define GPUARR_NO_CUDA
#define GPUARR_NO_OPENCL
#define GPUARR_IMPLEMENTATION
#include "gpuarr.h"

#define FAKE_API __attribute__((visibility("default")))
#define FAKE_MAX_DEVICES 8
#define FAKE_ADDRESS_BASE 0x8000000000000000ull /* non-canonical on x86-64 and arm64 */

/* ---------------------------------------------------------------------------------------------
 * State (one lock: the fake is about order, not speed)
 * ------------------------------------------------------------------------------------------- */
#define FAKE_MAX_PEERS 32
#define FAKE_STACK_MAX 32
/* A context: a device's primary one (fake.contexts, retained) or one cuCtxCreate made (listed in
   fake.created, never freed: a destroyed one is only marked, so a stale handle is refused with
   CUDA_ERROR_INVALID_CONTEXT instead of read after free). */
struct CUctx_st {
    int device;
    int retains;    /* a primary context: its retains (0: not active) */
    bool created;   /* cuCtxCreate's, not the device's primary context */
    bool destroyed; /* cuCtxDestroy'ed */
    unsigned int flags;
    unsigned long long id; /* cuCtxGetId's */
    struct CUctx_st *next_created;
    CUresult sticky; /* a sticky error corrupted it (FAKE_CUDA_FAIL): every call in it fails */
    struct CUctx_st *peers[FAKE_MAX_PEERS]; /* contexts whose memory its kernels may reach (cuCtxEnablePeerAccess) */
    int peer_count;
};

typedef struct fake_alloc {
    CUdeviceptr address;
    size_t size;
    char *data;
    int device;
    CUcontext ctx; /* the context it was made in: its kernels reach it, and its peers' */
} fake_alloc;

typedef struct fake_pinned {
    char *base;
    size_t size;
    bool registered; /* cuMemHostRegister: the caller owns the memory */
    CUcontext ctx;
} fake_pinned;

typedef enum { OP_COPY, OP_SET, OP_CAST, OP_RECORD, OP_WAIT, OP_HOST, OP_KERNEL } fake_op_kind;

typedef struct fake_op {
    struct fake_op *next;
    fake_op_kind kind;
    char *dst;           /* host view of the destination (device memory is host memory here) */
    const char *src;
    size_t bytes;        /* OP_COPY; OP_SET: the extent, first row to the end of the last */
    unsigned int value;  /* OP_SET: height rows of width elements of elem_size bytes, pitch apart */
    size_t elem_size, width, height, pitch;
    char *owned;         /* a snapshot of a pageable source, freed with the op */
    gpuarr__cast_fn cast; /* OP_CAST: NULL for an identity copy */
    size_t count, src_size, dst_size;
    CUevent event;          /* OP_RECORD */
    struct CUstream_st *on; /* OP_WAIT: run `on` through its op number `through` */
    uint64_t seq, through;  /* ops are numbered per stream */
    CUhostFn fn;            /* OP_HOST */
    void *user;
    const gpuarr__sim_kernel_hooks *hooks; /* OP_KERNEL: who captured `launch` (user) */
} fake_op;

/* Streams are never freed, only marked destroyed (and listed): a wait queued elsewhere may still
   name one. */
struct CUstream_st {
    CUcontext ctx;
    struct CUstream_st *next_stream; /* every stream ever made */
    fake_op *head, *tail;
    uint64_t queued, ran; /* op numbers */
    bool asked;           /* a query saw the pending work once */
    bool destroyed;
    bool running; /* a thread runs one of its ops (a host function, or a wait draining another
                     stream): it may drop the lock meanwhile, and the stream's next op waits */
};

struct CUevent_st {
    struct CUevent_st *prev_event, *next_event; /* every live event: one a failed destroy kept is the driver's, not lost */
    CUcontext ctx;
    unsigned int flags;
    CUstream stream; /* where the latest record went; NULL: none, or it ran at the call */
    uint64_t seq;    /* its op number there */
    bool recorded, asked;
    bool destroyed; /* destroyed with its record still queued: freed when the record runs */
    double time_ms;
};

static bool fake_event_done(CUevent e) { return !e->stream || e->stream->ran >= e->seq; }
static void fake_event_free(CUevent e);
struct CUmod_st;
static void fake_module_free(struct CUmod_st *m);

typedef struct fake_kernel {
    char name[96];
    int src, dst;  /* dtypes */
    bool portable; /* gpuarr_kernel_<name>: src and dst unused */
} fake_kernel;

struct CUmod_st {
    struct CUmod_st *prev_module, *next_module; /* every loaded module */
    CUcontext ctx;
    int kernel_count;
    struct CUfunc_st *functions;
};

struct CUfunc_st {
    CUmodule module;
    fake_kernel kernel;
};

static struct {
    pthread_mutex_t lock;
    pthread_cond_t op_done; /* a stream's running op has finished (streams' `running`) */
    bool initialized;
    int device_count;
    size_t memory;
    bool peer;
    int ptx_max_major, ptx_max_minor;
    bool trace, trace_ops;
    struct CUctx_st contexts[FAKE_MAX_DEVICES]; /* the primary contexts */
    CUcontext created;                          /* cuCtxCreate's, newest first, destroyed ones too */
    unsigned long long next_ctx_id;
    size_t used[FAKE_MAX_DEVICES];
    CUdeviceptr next_address[FAKE_MAX_DEVICES];
    fake_alloc *allocs;
    size_t alloc_count, alloc_cap;
    fake_pinned *pinned;
    size_t pinned_count, pinned_cap;
    CUstream streams;
    CUevent events;
    CUmodule modules;
    gpuarr__cast_fn casts[GPUARR_DTYPE_COUNT][GPUARR_DTYPE_COUNT]; /* the host's portable kernels */
    const gpuarr__sim_kernel_hooks *hooks[8]; /* gpuarr_sim_kernel_hooks_set's, NULL where free */
} fake = {.lock = PTHREAD_MUTEX_INITIALIZER, .op_done = PTHREAD_COND_INITIALIZER};

/* The thread's context stack: fake_current is its top, fake_below the rest (bottom first). */
static __thread CUcontext fake_current;
static __thread CUcontext fake_below[FAKE_STACK_MAX];
static __thread int fake_below_count;
static __thread unsigned long long fake_ops_run_here; /* operations this thread ran (fake_cuda_ops_run) */

/* Handles checked before they are read: one freed with its context (cuCtxDestroy, a primary
   context's reset) is refused with CUDA_ERROR_INVALID_HANDLE, not read after free. */
static bool fake_event_live(CUevent e) {
    for (CUevent k = fake.events; k; k = k->next_event)
        if (k == e) return true;
    return false;
}

static CUresult fake_refuse(CUresult e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static CUresult fake_refuse(CUresult e, const char *fmt, ...) {
    if (fake.trace) {
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, "fake-cuda: error %d: ", (int)e);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
    }
    return e;
}

/* ---------------------------------------------------------------------------------------------
 * Faults (FAKE_CUDA_FAIL; see the top of the file). Under fake.lock.
 * ------------------------------------------------------------------------------------------- */
#define FAKE_MAX_RULES 16
#define FAKE_MAX_ENTRIES 96
typedef struct fake_rule {
    char entry[48]; /* "" = any entry point (nth=) */
    unsigned long long nth;
    CUresult code;
} fake_rule;

static struct {
    bool parsed;
    fake_rule rules[FAKE_MAX_RULES];
    int rule_count;
    unsigned long long calls;
    const char *entries[FAKE_MAX_ENTRIES]; /* __func__ of each entry point called, and its count */
    unsigned long long entry_calls[FAKE_MAX_ENTRIES];
    int entry_count;
    unsigned long long hit_call;
    char hit_name[48];
    CUresult hit_code;
    char count_path[4096];
    unsigned long long sticky_at, sticky_ops; /* FAKE_CUDA_STICKY: the op that faults, the ops run so far */
} fault;

static bool fake_error_code(const char *text, CUresult *out);

static bool fake_is_sticky(CUresult e) {
    switch ((int)e) {
    case CUDA_ERROR_ILLEGAL_ADDRESS: case CUDA_ERROR_LAUNCH_FAILED: case CUDA_ERROR_LAUNCH_TIMEOUT: case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR: case CUDA_ERROR_ILLEGAL_INSTRUCTION: case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE: case CUDA_ERROR_INVALID_PC: return true;
    default: return false;
    }
}

/* Parses a FAKE_CUDA_FAIL value into fault.rules; false (and no rules) if it cannot. */
static bool fake_fault_parse(const char *spec) {
    fault.rule_count = 0;
    fault_spec_rule rule;
    int got;
    while (spec && (got = fault_spec_next(&spec, &rule)) != 0) {
        if (got < 0 || fault.rule_count == FAKE_MAX_RULES) goto bad;
        fake_rule *r = &fault.rules[fault.rule_count];
        memset(r, 0, sizeof *r);
        r->code = CUDA_ERROR_UNKNOWN;
        r->nth = rule.nth;
        if (rule.entry && strlen(rule.entry) >= sizeof r->entry) goto bad;
        if (rule.entry) strcpy(r->entry, rule.entry);
        if (rule.code && !fake_error_code(rule.code, &r->code)) goto bad;
        fault.rule_count++;
    }
    return true;
bad:
    fault.rule_count = 0;
    return false;
}

static void fake_fault_write_count(void) {
    pthread_mutex_lock(&fake.lock);
    FILE *f = fault.count_path[0] ? fopen(fault.count_path, "w") : NULL;
    if (f) {
        fprintf(f, "calls %llu\n", fault.calls);
        fclose(f);
    }
    pthread_mutex_unlock(&fake.lock);
}

static void fake_fault_setup(void) {
    if (fault.parsed) return;
    fault.parsed = true;
    const char *spec = getenv("FAKE_CUDA_FAIL");
    if (!fake_fault_parse(spec)) {
        fprintf(stderr, "fake-cuda: FAKE_CUDA_FAIL=\"%s\": expected nth=N[:CODE] or ENTRY:N[:CODE], comma-separated\n", spec);
        abort();
    }
    const char *sticky = getenv("FAKE_CUDA_STICKY");
    if (sticky && *sticky) fault.sticky_at = strtoull(sticky, NULL, 10);
    const char *count = getenv("FAKE_CUDA_COUNT");
    if (count && *count && strlen(count) < sizeof fault.count_path) {
        strcpy(fault.count_path, count);
        atexit(fake_fault_write_count);
    }
}

/* Calls that do not run in a context: a corrupted one does not stop them. */
static bool fake_context_free(const char *call) {
    return strcmp(call, "cuInit") == 0 || strcmp(call, "cuDriverGetVersion") == 0 || strncmp(call, "cuDevice", 8) == 0 ||
           strcmp(call, "cuCtxGetCurrent") == 0 || strcmp(call, "cuCtxSetCurrent") == 0 || strncmp(call, "cuCtxCreate", 11) == 0 ||
           strncmp(call, "cuCtxDestroy", 12) == 0 || strncmp(call, "cuCtxPushCurrent", 16) == 0 || strncmp(call, "cuCtxPopCurrent", 15) == 0 ||
           strcmp(call, "cuCtxGetApiVersion") == 0 || strcmp(call, "cuCtxGetId") == 0;
}

/* Counts a call to `call` and says whether it fails: the error, or CUDA_SUCCESS. */
static CUresult fake_fault(const char *call) {
    fake_fault_setup();
    unsigned long long n = ++fault.calls, here = 0;
    int i;
    for (i = 0; i < fault.entry_count; i++)
        if (fault.entries[i] == call || strcmp(fault.entries[i], call) == 0) break;
    if (i < FAKE_MAX_ENTRIES) {
        if (i == fault.entry_count) {
            fault.entries[i] = call;
            fault.entry_calls[i] = 0;
            fault.entry_count++;
        }
        here = ++fault.entry_calls[i];
    }
    for (int r = 0; r < fault.rule_count; r++) {
        const fake_rule *rule = &fault.rules[r];
        if (rule->entry[0] ? strcmp(rule->entry, call) == 0 && rule->nth == here : rule->nth == n) {
            if (!fault.hit_call) {
                fault.hit_call = n;
                snprintf(fault.hit_name, sizeof fault.hit_name, "%s", call);
                fault.hit_code = rule->code;
            }
            if (fake_is_sticky(rule->code) && fake_current && !fake_context_free(call)) fake_current->sticky = rule->code;
            return fake_refuse(rule->code, "%s: call %llu (its call %llu) fails as FAKE_CUDA_FAIL asks", call, n, here);
        }
    }
    if (fake_current && fake_current->destroyed && !fake_context_free(call)) /* destroyed by another thread, current here */
        return fake_refuse(CUDA_ERROR_CONTEXT_IS_DESTROYED, "%s: the current context %p was destroyed", call, (void *)fake_current);
    if (fake_current && fake_current->sticky && !fake_context_free(call)) return fake_current->sticky;
    return CUDA_SUCCESS;
}

FAKE_API unsigned long long fake_cuda_calls_made(void);
FAKE_API unsigned long long fake_cuda_calls_made(void) {
    pthread_mutex_lock(&fake.lock);
    unsigned long long n = fault.calls;
    pthread_mutex_unlock(&fake.lock);
    return n;
}

FAKE_API int fake_cuda_fail_set(const char *spec);
FAKE_API int fake_cuda_fail_set(const char *spec) {
    pthread_mutex_lock(&fake.lock);
    fake_fault_setup();
    bool ok = fake_fault_parse(spec);
    fault.calls = 0;
    fault.entry_count = 0;
    fault.hit_call = 0;
    fault.hit_name[0] = 0;
    fault.hit_code = CUDA_SUCCESS;
    pthread_mutex_unlock(&fake.lock);
    return ok ? 0 : -1;
}

/* Driver objects alive now: allocations, pinned blocks, streams, events, modules (after the
   program's last gpuarr_shutdown: what it left behind). */
/* FAKE_CUDA_STICKY at run time: the nth copy, memset or kernel run on a stream from now faults
   (0: none); returns the ops run since the last call. */
FAKE_API unsigned long long fake_cuda_sticky_set(unsigned long long nth);
FAKE_API unsigned long long fake_cuda_sticky_set(unsigned long long nth) {
    pthread_mutex_lock(&fake.lock);
    fake_fault_setup();
    unsigned long long ran = fault.sticky_ops;
    fault.sticky_at = nth;
    fault.sticky_ops = 0;
    pthread_mutex_unlock(&fake.lock);
    return ran;
}

FAKE_API unsigned long long fake_cuda_live_objects(void);
FAKE_API unsigned long long fake_cuda_live_objects(void) {
    pthread_mutex_lock(&fake.lock);
    unsigned long long n = fake.alloc_count + fake.pinned_count;
    for (CUstream st = fake.streams; st; st = st->next_stream) n += !st->destroyed;
    for (CUevent e = fake.events; e; e = e->next_event) n += !e->destroyed;
    for (CUmodule m = fake.modules; m; m = m->next_module) n++;
    pthread_mutex_unlock(&fake.lock);
    return n;
}

FAKE_API unsigned long long fake_cuda_fault_hit(char *name, size_t len, unsigned int *code);
FAKE_API unsigned long long fake_cuda_fault_hit(char *name, size_t len, unsigned int *code) {
    pthread_mutex_lock(&fake.lock);
    unsigned long long n = fault.hit_call;
    if (name && len) snprintf(name, len, "%s", fault.hit_name);
    if (code) *code = (unsigned int)fault.hit_code;
    pthread_mutex_unlock(&fake.lock);
    return n;
}

#define FAKE_ENTER_AS(call)                                                                        \
    pthread_mutex_lock(&fake.lock);                                                                \
    if (!fake.initialized) {                                                                       \
        pthread_mutex_unlock(&fake.lock);                                                          \
        return CUDA_ERROR_NOT_INITIALIZED;                                                         \
    }                                                                                              \
    {                                                                                              \
        CUresult fault_ = fake_fault(call);                                                        \
        if (fault_ != CUDA_SUCCESS) {                                                              \
            pthread_mutex_unlock(&fake.lock);                                                      \
            return fault_;                                                                         \
        }                                                                                          \
    }
#define FAKE_ENTER() FAKE_ENTER_AS(__func__)
#define FAKE_RETURN(e)                                                                             \
    do {                                                                                           \
        CUresult r_ = (e);                                                                         \
        pthread_mutex_unlock(&fake.lock);                                                          \
        return r_;                                                                                 \
    } while (0)
#define FAKE_NEED_CONTEXT()                                                                        \
    if (!fake_current) FAKE_RETURN(fake_refuse(CUDA_ERROR_INVALID_CONTEXT, "%s without a current context", __func__))

static double fake_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static size_t fake_env_size(const char *name, size_t fallback) {
    const char *v = getenv(name);
    return v && *v ? (size_t)strtoull(v, NULL, 0) : fallback;
}

/* ---------------------------------------------------------------------------------------------
 * Memory lookup
 * ------------------------------------------------------------------------------------------- */
static fake_alloc *fake_alloc_at(CUdeviceptr p) {
    for (size_t i = 0; i < fake.alloc_count; i++)
        if (p >= fake.allocs[i].address && p - fake.allocs[i].address < fake.allocs[i].size) return &fake.allocs[i];
    return NULL;
}

/* The host view of [p, p + bytes) of device memory, or NULL when it is not inside one allocation. */
static char *fake_device_range(CUdeviceptr p, size_t bytes, int *device) {
    fake_alloc *a = fake_alloc_at(p);
    if (!a || bytes > a->size - (p - a->address)) return bytes == 0 && a ? a->data : NULL;
    if (device) *device = a->device;
    return a->data + (p - a->address);
}

/* Whether kernels in c may touch a: memory of c, or of a context c enabled peer access to (a
   context's memory is in its own GPU address space: another context of the same GPU cannot reach
   it, and cuCtxEnablePeerAccess between two contexts of one device is unsupported). */
static bool fake_reaches(const struct CUctx_st *c, const fake_alloc *a) {
    if (!a) return false;
    if (a->ctx == c) return true;
    for (int i = 0; i < c->peer_count; i++)
        if (c->peers[i] == a->ctx) return true;
    return false;
}

static fake_pinned *fake_pinned_at(const void *p, size_t bytes) {
    for (size_t i = 0; i < fake.pinned_count; i++) {
        fake_pinned *m = &fake.pinned[i];
        if ((const char *)p >= m->base && (size_t)((const char *)p - m->base) < m->size &&
            bytes <= m->size - (size_t)((const char *)p - m->base))
            return m;
    }
    return NULL;
}

static bool fake_grow(void **array, size_t *cap, size_t count, size_t item) {
    if (count < *cap) return true;
    size_t n = *cap ? *cap * 2 : 64;
    void *p = realloc(*array, n * item);
    if (!p) return false;
    *array = p;
    *cap = n;
    return true;
}

/* ---------------------------------------------------------------------------------------------
 * Streams: deferred work
 * ------------------------------------------------------------------------------------------- */
static void fake_drain(CUstream s, uint64_t through);

/* An op done or dropped: what it holds goes with it (a kernel's captured launch too). */
static void fake_op_free(fake_op *op) {
    if (op->kind == OP_KERNEL && op->hooks) op->hooks->release(op->user);
    free(op->owned);
    free(op);
}

/* The host memory behind a device address, for a portable kernel run in ctx's device (its own
   memory, or a peer's it enabled access to); NULL when there is none. */
static void *fake_translate(void *ctx, unsigned long long address) {
    const struct CUctx_st *c = (const struct CUctx_st *)ctx;
    char *p = fake_device_range((CUdeviceptr)address, 1, NULL);
    return p && fake_reaches(c, fake_alloc_at((CUdeviceptr)address)) ? p : NULL;
}

static void fake_run(CUstream s, fake_op *op) {
    static const char *const kinds[] = {"copy", "set", "cast", "record", "wait", "host function", "kernel"};
    fake_ops_run_here++;
    if (fake.trace_ops)
        fprintf(stderr, "fake-cuda: run %s #%llu on %p: dst %p src %p bytes %zu count %zu\n", kinds[op->kind], (unsigned long long)op->seq, (void *)s,
                (void *)op->dst, (const void *)(op->owned ? op->owned : op->src), op->bytes, op->count);
    switch (op->kind) {
    case OP_COPY: memmove(op->dst, op->owned ? op->owned : op->src, op->bytes); break;
    case OP_SET:
        for (size_t r = 0; r < op->height; r++) {
            char *row = op->dst + r * op->pitch;
            uint16_t v16 = (uint16_t)op->value;
            if (op->elem_size == 1) memset(row, (int)op->value, op->width);
            else if (op->elem_size == 2) for (size_t i = 0; i < op->width; i++) memcpy(row + 2 * i, &v16, 2);
            else for (size_t i = 0; i < op->width; i++) memcpy(row + 4 * i, &op->value, 4);
        }
        break;
    case OP_CAST: { /* a GPU ignores the host thread's rounding mode and flush-to-zero */
        fenv_t caller;
        fegetenv(&caller);
        fesetenv(FE_DFL_ENV);
        if (op->cast) op->cast(op->src, op->dst, op->count);
        else memmove(op->dst, op->src, op->count * op->dst_size);
        fesetenv(&caller);
        break;
    }
    case OP_KERNEL: { /* its host form; an address with no memory behind it faults as on a GPU */
        CUcontext ctx = s ? s->ctx : fake_current;
        fenv_t caller;
        fegetenv(&caller);
        fesetenv(FE_DFL_ENV);
        int failed = op->hooks->run(op->user, fake_translate, ctx);
        fesetenv(&caller);
        if (failed) {
            if (fake.trace) fprintf(stderr, "fake-cuda: a kernel #%llu on %p reads an address no memory of context %p (device %d) is at\n",
                                    (unsigned long long)op->seq, (void *)s, (void *)ctx, ctx->device);
            ctx->sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
        }
        break;
    }
    case OP_RECORD:
        if (op->event->stream == s && op->event->seq == op->seq) {
            op->event->time_ms = fake_now_ms();
            if (op->event->destroyed) fake_event_free(op->event);
        }
        break;
    case OP_WAIT: fake_drain(op->on, op->through); break;
    case OP_HOST: /* without the lock, as on the driver's own thread: it may wait for other work */
        pthread_mutex_unlock(&fake.lock);
        op->fn(op->user);
        pthread_mutex_lock(&fake.lock);
        break;
    }
    if (fake.trace_ops && op->dst) {
        uint64_t first = 0;
        memcpy(&first, op->dst, 8);
        fprintf(stderr, "fake-cuda:   the destination starts 0x%016llx\n", (unsigned long long)first);
    }
}

/* Runs s's work in order, through its op number `through`. */
static void fake_drain(CUstream s, uint64_t through) {
    if (s->ctx && s->ctx->sticky) return; /* a corrupted context runs nothing more */
    for (;;) {
        /* work through `through` that already ran is done, whatever later host function runs now
           (an event recorded before a host function completes without it, as on the driver) */
        if (s->ran >= through) break;
        /* the stream's order: its next op waits until the running one is done. Not only a host
           function drops the lock: so does a wait whose stream runs one, or is itself running.
           Ops that run meanwhile may reach `through`: then this wait is over, whatever runs
           next (that op may itself wait for work of ours: waiting on would be a cycle) */
        while (s->running && s->ran < through) pthread_cond_wait(&fake.op_done, &fake.lock);
        if (!s->head || s->ran >= through) break;
        fake_op *op = s->head;
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        if ((op->kind == OP_COPY || op->kind == OP_SET || op->kind == OP_CAST || op->kind == OP_KERNEL) && fault.sticky_at &&
            ++fault.sticky_ops == fault.sticky_at) {
            /* FAKE_CUDA_STICKY: this op faults on the "GPU", as a kernel reading a bad address does:
               it does not run, and its context is corrupted (the sync that waited for it says so) */
            if (fake.trace) fprintf(stderr, "fake-cuda: op #%llu on %p faults as FAKE_CUDA_STICKY asks\n", (unsigned long long)op->seq, (void *)s);
            s->ctx->sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
            s->ran = op->seq;
            fake_op_free(op);
            break;
        }
        s->running = true;
        fake_run(s, op);
        s->ran = op->seq;
        s->running = false;
        pthread_cond_broadcast(&fake.op_done);
        fake_op_free(op);
    }
    s->asked = false;
}

/* Stream 0 and the per-thread stream have no queue here: their work runs at the call. */
static bool fake_immediate(CUstream s) { return s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD; }

static CUresult fake_enqueue(CUstream s, fake_op *op) {
    if (fake_immediate(s)) {
        fake_run(NULL, op);
        fake_op_free(op);
        return CUDA_SUCCESS;
    }
    op->seq = ++s->queued;
    if (s->tail) s->tail->next = op;
    else s->head = op;
    s->tail = op;
    return CUDA_SUCCESS;
}

static fake_op *fake_op_new(fake_op_kind kind) {
    fake_op *op = (fake_op *)calloc(1, sizeof *op);
    if (op) op->kind = kind;
    return op;
}

/* A stream that may be used from the current context. */
/* A real driver may crash on a destroyed stream (an H100's cuEventRecord did): counted, for tests. */
static unsigned long long fake_destroyed_stream_uses;
FAKE_API unsigned long long fake_cuda_destroyed_stream_uses(void);
FAKE_API unsigned long long fake_cuda_destroyed_stream_uses(void) { return __atomic_load_n(&fake_destroyed_stream_uses, __ATOMIC_RELAXED); }

static CUresult fake_check_stream(CUstream s, const char *call) {
    if (fake_immediate(s)) return CUDA_SUCCESS;
    if (s->destroyed) {
        __atomic_add_fetch(&fake_destroyed_stream_uses, 1ull, __ATOMIC_RELAXED);
        return fake_refuse(CUDA_ERROR_INVALID_HANDLE, "%s: a destroyed stream", call);
    }
    if (s->ctx != fake_current)
        return fake_refuse(CUDA_ERROR_INVALID_HANDLE, "%s: the stream belongs to context %p (device %d), the current context is %p (device %d)", call,
                           (void *)s->ctx, s->ctx->device, (void *)fake_current, fake_current->device);
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * Initialization, devices, contexts
 * ------------------------------------------------------------------------------------------- */
FAKE_API CUresult cuInit(unsigned int flags) {
    pthread_mutex_lock(&fake.lock);
    CUresult fault_ = fake_fault(__func__);
    if (fault_ != CUDA_SUCCESS || flags != 0) {
        pthread_mutex_unlock(&fake.lock);
        return fault_ != CUDA_SUCCESS ? fault_ : CUDA_ERROR_INVALID_VALUE;
    }
    if (!fake.initialized) {
        gpuarr__host_casts_base(fake.casts);
        fake.device_count = (int)fake_env_size("FAKE_CUDA_DEVICES", 2);
        if (fake.device_count > FAKE_MAX_DEVICES) fake.device_count = FAKE_MAX_DEVICES;
        fake.memory = fake_env_size("FAKE_CUDA_MEMORY", (size_t)1 << 30);
        const char *peer = getenv("FAKE_CUDA_PEER");
        fake.peer = !(peer && strcmp(peer, "0") == 0);
        const char *isa = getenv("FAKE_CUDA_PTX_MAX_ISA");
        fake.ptx_max_major = 9;
        fake.ptx_max_minor = 0;
        if (isa && sscanf(isa, "%d.%d", &fake.ptx_max_major, &fake.ptx_max_minor) != 2) fake.ptx_max_major = 9;
        const char *trace = getenv("FAKE_CUDA_TRACE");
        fake.trace = trace && (strcmp(trace, "1") == 0 || strcmp(trace, "2") == 0);
        fake.trace_ops = trace && strcmp(trace, "2") == 0;
        for (int i = 0; i < FAKE_MAX_DEVICES; i++) {
            fake.contexts[i].device = i;
            fake.contexts[i].id = ++fake.next_ctx_id;
            fake.next_address[i] = FAKE_ADDRESS_BASE + ((CUdeviceptr)(i + 1) << 40);
        }
        fake.initialized = true;
    }
    pthread_mutex_unlock(&fake.lock);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuDriverGetVersion(int *v) {
    pthread_mutex_lock(&fake.lock);
    CUresult e = fake_fault(__func__);
    pthread_mutex_unlock(&fake.lock);
    if (e != CUDA_SUCCESS) return e;
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = 13000;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceGetCount(int *n) {
    FAKE_ENTER();
    if (!n) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    *n = fake.device_count;
    FAKE_RETURN(CUDA_SUCCESS);
}

#define FAKE_CHECK_DEVICE(dev)                                                                     \
    if ((dev) < 0 || (dev) >= fake.device_count) FAKE_RETURN(fake_refuse(CUDA_ERROR_INVALID_DEVICE, "%s: device %d", __func__, (int)(dev)))

FAKE_API CUresult cuDeviceGet(CUdevice *out, int ordinal) {
    FAKE_ENTER();
    FAKE_CHECK_DEVICE(ordinal);
    if (!out) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    *out = ordinal;
    FAKE_RETURN(CUDA_SUCCESS);
}

FAKE_API CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    FAKE_ENTER();
    FAKE_CHECK_DEVICE(dev);
    if (!name || len <= 0) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    snprintf(name, (size_t)len, "Fake CUDA Device %d (CPU)", (int)dev);
    FAKE_RETURN(CUDA_SUCCESS);
}

FAKE_API CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute attr, CUdevice dev) {
    FAKE_ENTER();
    FAKE_CHECK_DEVICE(dev);
    if (!v) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    switch (attr) {
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *v = 1755000; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: *v = 3; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
    default: *v = 0; break;
    }
    FAKE_RETURN(CUDA_SUCCESS);
}

FAKE_API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    FAKE_ENTER();
    FAKE_CHECK_DEVICE(dev);
    if (!bytes) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    *bytes = fake.memory;
    FAKE_RETURN(CUDA_SUCCESS);
}

FAKE_API CUresult cuDeviceGetPCIBusId(char *id, int len, CUdevice dev) {
    FAKE_ENTER();
    FAKE_CHECK_DEVICE(dev);
    if (!id || len <= 0) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    snprintf(id, (size_t)len, "0000:%02X:00.0", 0x18 + (int)dev);
    FAKE_RETURN(CUDA_SUCCESS);
}

FAKE_API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
    FAKE_ENTER();
    FAKE_CHECK_DEVICE(dev);
    if (!uuid) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    for (int i = 0; i < 16; i++) uuid->bytes[i] = (char)(0xfa ^ (i * 17) ^ (int)dev);
    FAKE_RETURN(CUDA_SUCCESS);
}

FAKE_API CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer) {
    FAKE_ENTER();
    FAKE_CHECK_DEVICE(dev);
    FAKE_CHECK_DEVICE(peer);
    if (!can) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    *can = fake.peer && dev != peer;
    FAKE_RETURN(CUDA_SUCCESS);
}

FAKE_API CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    FAKE_ENTER();
    FAKE_CHECK_DEVICE(dev);
    if (!ctx) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    fake.contexts[dev].retains++;
    *ctx = &fake.contexts[dev];
    FAKE_RETURN(CUDA_SUCCESS);
}


/* The streams of a destroyed context: their queued work dropped (host functions not called), and
   marked destroyed. */
static void fake_drop_streams(CUcontext ctx) {
    for (CUstream s = fake.streams; s; s = s->next_stream) {
        if (s->ctx != ctx) continue;
        while (s->head) {
            fake_op *op = s->head;
            s->head = op->next;
            fake_op_free(op);
        }
        s->tail = NULL;
        s->destroyed = true;
    }
}

FAKE_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    FAKE_ENTER();
    FAKE_CHECK_DEVICE(dev);
    if (fake.contexts[dev].retains == 0)
        FAKE_RETURN(fake_refuse(CUDA_ERROR_INVALID_CONTEXT, "cuDevicePrimaryCtxRelease of device %d, not retained", (int)dev));
    if (--fake.contexts[dev].retains == 0 && fake.contexts[dev].sticky) { /* destroyed: the error goes with it */
        fake_drop_streams(&fake.contexts[dev]);
        fake.contexts[dev].sticky = CUDA_SUCCESS;
    }
    FAKE_RETURN(CUDA_SUCCESS);
}

/* Every context, primary and created, in turn: for (CUcontext c = fake_ctx_first(); c; c = fake_ctx_next(c)). */
static CUcontext fake_ctx_first(void) { return &fake.contexts[0]; }
static CUcontext fake_ctx_next(CUcontext c) {
    if (c >= &fake.contexts[0] && c < &fake.contexts[FAKE_MAX_DEVICES - 1]) return c + 1;
    return c == &fake.contexts[FAKE_MAX_DEVICES - 1] ? fake.created : c->next_created;
}

/* Whether c is a context handle this driver gave out (compared, never read, until it is known). */
static bool fake_ctx_known(CUcontext c) {
    if (!c) return false;
    for (CUcontext k = fake_ctx_first(); k; k = fake_ctx_next(k))
        if (k == c) return true;
    return false;
}

/* A context a call may use: a retained primary context, or a created one not destroyed. */
static bool fake_ctx_usable(CUcontext c) {
    if (!fake_ctx_known(c)) return false;
    return c->created ? !c->destroyed : c->device < fake.device_count && c->retains > 0;
}

/* Everything ctx holds goes: its memory, pinned blocks, events and modules, its streams with their
   queued work (host functions are not called), peer access to and from it, a sticky error. */
static void fake_ctx_clear(CUcontext ctx) {
    fake_drop_streams(ctx);
    for (size_t i = fake.alloc_count; i-- > 0;) {
        if (fake.allocs[i].ctx != ctx) continue;
        fake.used[fake.allocs[i].device] -= (fake.allocs[i].size + 511) & ~(size_t)511;
        free(fake.allocs[i].data);
        fake.allocs[i] = fake.allocs[--fake.alloc_count];
    }
    for (size_t i = fake.pinned_count; i-- > 0;) {
        if (fake.pinned[i].ctx != ctx) continue;
        if (!fake.pinned[i].registered) free(fake.pinned[i].base);
        fake.pinned[i] = fake.pinned[--fake.pinned_count];
    }
    for (CUevent e = fake.events, next; e; e = next) {
        next = e->next_event;
        if (e->ctx == ctx) fake_event_free(e);
    }
    for (CUmodule m = fake.modules, next; m; m = next) {
        next = m->next_module;
        if (m->ctx == ctx) fake_module_free(m);
    }
    for (CUcontext c = fake_ctx_first(); c; c = fake_ctx_next(c))
        for (int i = c->peer_count; i-- > 0;)
            if (c->peers[i] == ctx) c->peers[i] = c->peers[--c->peer_count];
    ctx->peer_count = 0;
    ctx->sticky = CUDA_SUCCESS;
}

/* Destroys the primary context whatever its retains (cudaDeviceReset): its memory, pinned blocks,
   events and modules go, its streams with their queued work (host functions are not called), and
   a sticky error with it; the next cuDevicePrimaryCtxRetain gets a fresh one. Contexts cuCtxCreate
   made on the device keep theirs. */
FAKE_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    FAKE_ENTER();
    FAKE_CHECK_DEVICE(dev);
    CUcontext ctx = &fake.contexts[dev];
    fake_ctx_clear(ctx);
    ctx->retains = 0;
    FAKE_RETURN(CUDA_SUCCESS);
}

FAKE_API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
    FAKE_ENTER();
    FAKE_CHECK_DEVICE(dev);
    if (!flags || !active) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    *flags = 0;
    *active = fake.contexts[dev].retains > 0;
    FAKE_RETURN(CUDA_SUCCESS);
}

FAKE_API CUresult cuCtxGetCurrent(CUcontext *ctx) {
    FAKE_ENTER();
    if (!ctx) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    *ctx = fake_current;
    FAKE_RETURN(CUDA_SUCCESS);
}

/* Replaces the top of the thread's stack; NULL pops it (as the driver documents). */
FAKE_API CUresult cuCtxSetCurrent(CUcontext ctx) {
    FAKE_ENTER();
    if (ctx && !fake_ctx_usable(ctx))
        FAKE_RETURN(fake_refuse(CUDA_ERROR_INVALID_CONTEXT, "cuCtxSetCurrent of %p: not a retained primary context nor a live created one", (void *)ctx));
    if (ctx) fake_current = ctx;
    else fake_current = fake_below_count ? fake_below[--fake_below_count] : NULL;
    FAKE_RETURN(CUDA_SUCCESS);
}

static CUresult fake_push(CUcontext ctx) {
    if (fake_current) {
        if (fake_below_count == FAKE_STACK_MAX) return fake_refuse(CUDA_ERROR_OUT_OF_MEMORY, "the context stack is full (%d)", FAKE_STACK_MAX + 1);
        fake_below[fake_below_count++] = fake_current;
    }
    fake_current = ctx;
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    FAKE_ENTER();
    if (!fake_ctx_usable(ctx)) FAKE_RETURN(fake_refuse(CUDA_ERROR_INVALID_CONTEXT, "cuCtxPushCurrent of %p: not a usable context", (void *)ctx));
    FAKE_RETURN(fake_push(ctx));
}

FAKE_API CUresult cuCtxPopCurrent_v2(CUcontext *out) {
    FAKE_ENTER();
    if (!fake_current) FAKE_RETURN(fake_refuse(CUDA_ERROR_INVALID_CONTEXT, "cuCtxPopCurrent with no current context"));
    if (out) *out = fake_current;
    fake_current = fake_below_count ? fake_below[--fake_below_count] : NULL;
    FAKE_RETURN(CUDA_SUCCESS);
}

/* A new context of dev, pushed on the thread's stack (current). Flags: a scheduling mode and the
   CU_CTX_* bits up to CU_CTX_FLAGS_MASK; execution affinity and CIG (params) are not modelled. */
static CUresult fake_ctx_create(const char *call, CUcontext *out, const CUctxCreateParams *params, unsigned int flags, CUdevice dev) {
    FAKE_ENTER_AS(call);
    FAKE_CHECK_DEVICE(dev);
    unsigned int sched = flags & CU_CTX_SCHED_MASK;
    if (!out || (flags & ~(unsigned int)CU_CTX_FLAGS_MASK) || (sched != 0 && sched != 1 && sched != 2 && sched != 4))
        FAKE_RETURN(fake_refuse(CUDA_ERROR_INVALID_VALUE, "%s: flags 0x%x", call, flags));
    if (params && (params->numExecAffinityParams || params->execAffinityParams || params->cigParams))
        FAKE_RETURN(fake_refuse(CUDA_ERROR_NOT_SUPPORTED, "%s: execution affinity and CIG are not modelled", call));
    CUcontext c = (CUcontext)calloc(1, sizeof *c);
    if (!c) FAKE_RETURN(CUDA_ERROR_OUT_OF_MEMORY);
    CUresult e = fake_push(c);
    if (e != CUDA_SUCCESS) {
        free(c);
        FAKE_RETURN(e);
    }
    c->device = dev;
    c->created = true;
    c->flags = flags;
    c->id = ++fake.next_ctx_id;
    c->next_created = fake.created;
    fake.created = c;
    *out = c;
    FAKE_RETURN(CUDA_SUCCESS);
}

/* cuda.h 13 maps cuCtxCreate to _v4; older headers to _v2 (no parameters struct). */
FAKE_API CUresult cuCtxCreate_v4(CUcontext *out, CUctxCreateParams *params, unsigned int flags, CUdevice dev) {
    return fake_ctx_create(__func__, out, params, flags, dev);
}

FAKE_API CUresult cuCtxCreate_v2(CUcontext *out, unsigned int flags, CUdevice dev);
FAKE_API CUresult cuCtxCreate_v2(CUcontext *out, unsigned int flags, CUdevice dev) { return fake_ctx_create(__func__, out, NULL, flags, dev); }

/* Its queued work runs first (unless a sticky error stopped the context), then everything it
   holds goes; popped from this thread's stack if on top. Threads where it is still current get
   CUDA_ERROR_CONTEXT_IS_DESTROYED; a handle to it, CUDA_ERROR_INVALID_CONTEXT. A primary context
   cannot be destroyed (cuDevicePrimaryCtxRelease/Reset). */
FAKE_API CUresult cuCtxDestroy_v2(CUcontext ctx) {
    FAKE_ENTER();
    if (!fake_ctx_known(ctx) || !ctx->created || ctx->destroyed)
        FAKE_RETURN(fake_refuse(CUDA_ERROR_INVALID_CONTEXT, "cuCtxDestroy of %p: %s", (void *)ctx,
                                !fake_ctx_known(ctx) ? "not a context" : !ctx->created ? "a primary context" : "destroyed already"));
    for (CUstream s = fake.streams; s; s = s->next_stream)
        if (s->ctx == ctx && !s->destroyed) fake_drain(s, UINT64_MAX);
    fake_ctx_clear(ctx);
    ctx->destroyed = true;
    if (fake_current == ctx) fake_current = fake_below_count ? fake_below[--fake_below_count] : NULL;
    FAKE_RETURN(CUDA_SUCCESS);
}

FAKE_API CUresult cuCtxGetDevice(CUdevice *out) {
    FAKE_ENTER();
    FAKE_NEED_CONTEXT();
    if (!out) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    *out = fake_current->device;
    FAKE_RETURN(CUDA_SUCCESS);
}

/* ctx NULL: the current one. */
static CUresult fake_ctx_arg(CUcontext *ctx, const char *call) {
    if (!*ctx) *ctx = fake_current;
    if (!*ctx) return fake_refuse(CUDA_ERROR_INVALID_CONTEXT, "%s without a context", call);
    if (fake_ctx_known(*ctx) && (*ctx)->destroyed) return fake_refuse(CUDA_ERROR_CONTEXT_IS_DESTROYED, "%s: context %p was destroyed", call, (void *)*ctx);
    if (!fake_ctx_usable(*ctx)) return fake_refuse(CUDA_ERROR_INVALID_CONTEXT, "%s: %p is not a usable context", call, (void *)*ctx);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version) {
    FAKE_ENTER();
    CUresult e = fake_ctx_arg(&ctx, __func__);
    if (e == CUDA_SUCCESS && !version) e = CUDA_ERROR_INVALID_VALUE;
    if (e == CUDA_SUCCESS) *version = 3020;
    FAKE_RETURN(e);
}

FAKE_API CUresult cuCtxGetId(CUcontext ctx, unsigned long long *id) {
    FAKE_ENTER();
    CUresult e = fake_ctx_arg(&ctx, __func__);
    if (e == CUDA_SUCCESS && !id) e = CUDA_ERROR_INVALID_VALUE;
    if (e == CUDA_SUCCESS) *id = ctx->id;
    FAKE_RETURN(e);
}

/* Runs every stream of the current context; its sticky error if that corrupted it. */
FAKE_API CUresult cuCtxSynchronize(void) {
    FAKE_ENTER();
    FAKE_NEED_CONTEXT();
    for (CUstream s = fake.streams; s; s = s->next_stream)
        if (s->ctx == fake_current && !s->destroyed) fake_drain(s, UINT64_MAX);
    FAKE_RETURN(fake_current->sticky);
}

/* Access from the current context to peer's memory (one way). Two contexts of one device cannot
   (cuDeviceCanAccessPeer(d, d) is 0): PEER_ACCESS_UNSUPPORTED, as between GPUs without peer
   access; the current context itself: INVALID_CONTEXT. */
FAKE_API CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
    FAKE_ENTER();
    FAKE_NEED_CONTEXT();
    if (flags != 0) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    if (!fake_ctx_usable(peer) || peer == fake_current)
        FAKE_RETURN(fake_refuse(CUDA_ERROR_INVALID_CONTEXT, "cuCtxEnablePeerAccess of %p: %s", (void *)peer,
                                peer == fake_current ? "the current context" : "not a usable context"));
    if (!fake.peer || peer->device == fake_current->device) FAKE_RETURN(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
    for (int i = 0; i < fake_current->peer_count; i++)
        if (fake_current->peers[i] == peer) FAKE_RETURN(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    if (fake_current->peer_count == FAKE_MAX_PEERS) FAKE_RETURN(CUDA_ERROR_TOO_MANY_PEERS);
    fake_current->peers[fake_current->peer_count++] = peer;
    FAKE_RETURN(CUDA_SUCCESS);
}

/* ---------------------------------------------------------------------------------------------
 * Memory
 * ------------------------------------------------------------------------------------------- */
FAKE_API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    FAKE_ENTER();
    FAKE_NEED_CONTEXT();
    if (!free_bytes || !total) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    *total = fake.memory;
    *free_bytes = fake.memory - fake.used[fake_current->device];
    FAKE_RETURN(CUDA_SUCCESS);
}

FAKE_API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
    FAKE_ENTER();
    FAKE_NEED_CONTEXT();
    if (!p || bytes == 0) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    int dev = fake_current->device;
    size_t rounded = (bytes + 511) & ~(size_t)511;
    if (rounded > fake.memory - fake.used[dev]) FAKE_RETURN(CUDA_ERROR_OUT_OF_MEMORY);
    if (!fake_grow((void **)&fake.allocs, &fake.alloc_cap, fake.alloc_count, sizeof *fake.allocs)) FAKE_RETURN(CUDA_ERROR_OUT_OF_MEMORY);
    char *data = (char *)malloc(bytes); /* untouched pages cost nothing; contents are garbage, as on a GPU */
    if (!data) FAKE_RETURN(CUDA_ERROR_OUT_OF_MEMORY);
    fake_alloc *a = &fake.allocs[fake.alloc_count++];
    a->address = fake.next_address[dev];
    a->size = bytes;
    a->data = data;
    a->device = dev;
    a->ctx = fake_current;
    fake.next_address[dev] += rounded + 512; /* a gap: one past the end is nobody's */
    fake.used[dev] += rounded;
    *p = a->address;
    FAKE_RETURN(CUDA_SUCCESS);
}

static bool fake_overlaps(const char *p, size_t n, const fake_alloc *a) { return p && p < a->data + a->size && a->data < p + n; }

/* Whether queued work still reads or writes a. */
static const char *fake_in_use(const fake_alloc *a) {
    for (CUstream s = fake.streams; s; s = s->next_stream)
        for (const fake_op *op = s->head; op; op = op->next) {
            size_t dn = op->kind == OP_CAST ? op->count * op->dst_size : op->bytes;
            size_t sn = op->kind == OP_CAST ? op->count * op->src_size : op->bytes;
            if ((op->kind == OP_COPY || op->kind == OP_SET || op->kind == OP_CAST) &&
                (fake_overlaps(op->dst, dn, a) || (op->kind != OP_SET && !op->owned && fake_overlaps(op->src, sn, a))))
                return op->kind == OP_CAST ? "a kernel" : op->kind == OP_SET ? "a memset" : "a copy";
            unsigned long long at[GPUARR_KERNEL_MAX_PARAMS];
            int n = op->kind == OP_KERNEL ? op->hooks->addresses(op->user, at, GPUARR_KERNEL_MAX_PARAMS) : 0;
            for (int i = 0; i < n && i < GPUARR_KERNEL_MAX_PARAMS; i++)
                if (at[i] >= a->address && at[i] - a->address < a->size) return "a portable kernel";
        }
    return NULL;
}

/* The real cuMemFree "may perform implicit synchronization": gpuarr must not count on it, so
   freeing memory that queued work still uses is a fatal error here. */
FAKE_API CUresult cuMemFree_v2(CUdeviceptr p) {
    FAKE_ENTER();
    FAKE_NEED_CONTEXT();
    fake_alloc *a = fake_alloc_at(p);
    if (!a || a->address != p) FAKE_RETURN(fake_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemFree of 0x%llx, not an allocation's start", (unsigned long long)p));
    const char *user = fake_in_use(a);
    if (user) {
        fprintf(stderr, "fake-cuda: cuMemFree of 0x%llx (%zu bytes) while %s queued on a stream still uses it\n", (unsigned long long)p, a->size, user);
        abort();
    }
    int dev = a->device;
    free(a->data);
    fake.used[dev] -= (a->size + 511) & ~(size_t)511;
    *a = fake.allocs[--fake.alloc_count];
    FAKE_RETURN(CUDA_SUCCESS);
}

FAKE_API CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
    FAKE_ENTER();
    fake_alloc *a = fake_alloc_at(p);
    if (!a) FAKE_RETURN(CUDA_ERROR_NOT_FOUND);
    if (base) *base = a->address;
    if (size) *size = a->size;
    FAKE_RETURN(CUDA_SUCCESS);
}

static CUresult fake_pin(void *p, size_t bytes, bool registered) {
    if (!fake_grow((void **)&fake.pinned, &fake.pinned_cap, fake.pinned_count, sizeof *fake.pinned)) return CUDA_ERROR_OUT_OF_MEMORY;
    fake.pinned[fake.pinned_count++] = (fake_pinned){(char *)p, bytes, registered, fake_current};
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemHostAlloc(void **p, size_t bytes, unsigned int flags) {
    FAKE_ENTER();
    FAKE_NEED_CONTEXT();
    if (!p || bytes == 0 || (flags & ~0xfu)) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    void *m = NULL;
    if (posix_memalign(&m, 4096, bytes) != 0) FAKE_RETURN(CUDA_ERROR_OUT_OF_MEMORY);
    CUresult e = fake_pin(m, bytes, false);
    if (e != CUDA_SUCCESS) free(m);
    else *p = m;
    FAKE_RETURN(e);
}

static CUresult fake_unpin(void *p, bool registered) {
    for (size_t i = 0; i < fake.pinned_count; i++)
        if (fake.pinned[i].base == p && fake.pinned[i].registered == registered) {
            if (!registered) free(p);
            fake.pinned[i] = fake.pinned[--fake.pinned_count];
            return CUDA_SUCCESS;
        }
    return registered ? CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED : CUDA_ERROR_INVALID_VALUE;
}

FAKE_API CUresult cuMemFreeHost(void *p) {
    FAKE_ENTER();
    FAKE_RETURN(fake_unpin(p, false));
}

FAKE_API CUresult cuMemHostRegister_v2(void *p, size_t bytes, unsigned int flags) {
    FAKE_ENTER();
    FAKE_NEED_CONTEXT();
    (void)flags;
    if (!p || bytes == 0) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    if (fake_pinned_at(p, 1)) FAKE_RETURN(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    FAKE_RETURN(fake_pin(p, bytes, true));
}

FAKE_API CUresult cuMemHostUnregister(void *p) {
    FAKE_ENTER();
    FAKE_RETURN(fake_unpin(p, true));
}

FAKE_API CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr p) {
    FAKE_ENTER();
    if (!data) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    fake_alloc *a = fake_alloc_at(p);
    fake_pinned *m = a ? NULL : fake_pinned_at((const void *)(uintptr_t)p, 1);
    if (!a && !m) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE); /* memory CUDA does not know */
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned int *)data = a ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST; break;
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = a ? a->ctx : m->ctx; break;
    default: FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    }
    FAKE_RETURN(CUDA_SUCCESS);
}

/* As the driver: unknown memory is no error here, its attributes read as zeros. */
FAKE_API CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute *attrs, void **data, CUdeviceptr p) {
    FAKE_ENTER();
    if (!attrs || !data) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    fake_alloc *a = fake_alloc_at(p);
    fake_pinned *m = a ? NULL : fake_pinned_at((const void *)(uintptr_t)p, 1);
    for (unsigned int i = 0; i < n; i++) {
        if (!data[i]) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
        switch (attrs[i]) {
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
            *(unsigned int *)data[i] = a ? CU_MEMORYTYPE_DEVICE : m ? CU_MEMORYTYPE_HOST : 0u;
            break;
        case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data[i] = a ? a->ctx : m ? m->ctx : NULL; break;
        default: FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
        }
    }
    FAKE_RETURN(CUDA_SUCCESS);
}

/* ---------------------------------------------------------------------------------------------
 * Copies
 * ------------------------------------------------------------------------------------------- */
/* The device memory [p, p + bytes) as seen from the current context, or an error. */
static CUresult fake_device_view(CUdeviceptr p, size_t bytes, const char *call, char **out) {
    int dev = -1;
    *out = fake_device_range(p, bytes, &dev);
    if (!*out) return fake_refuse(CUDA_ERROR_INVALID_VALUE, "%s: 0x%llx + %zu bytes is not inside one allocation", call, (unsigned long long)p, bytes);
    return CUDA_SUCCESS;
}

static CUresult fake_copy_op(CUstream s, char *dst, const char *src, size_t bytes, bool snapshot) {
    fake_op *op = fake_op_new(OP_COPY);
    if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
    op->dst = dst;
    op->src = src;
    op->bytes = bytes;
    if (snapshot && !fake_immediate(s)) { /* pageable source: consumed at the call */
        op->owned = (char *)malloc(bytes ? bytes : 1);
        if (!op->owned) {
            free(op);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        memcpy(op->owned, src, bytes);
    }
    return fake_enqueue(s, op);
}

static CUresult fake_htod(const char *call, CUdeviceptr dst, const void *src, size_t bytes, CUstream s) {
    FAKE_ENTER_AS(call);
    FAKE_NEED_CONTEXT();
    CUresult e = fake_check_stream(s, call);
    char *d = NULL;
    if (e == CUDA_SUCCESS) e = fake_device_view(dst, bytes, call, &d);
    if (e == CUDA_SUCCESS && bytes && !src) e = CUDA_ERROR_INVALID_VALUE;
    if (e == CUDA_SUCCESS && bytes) e = fake_copy_op(s, d, (const char *)src, bytes, !fake_pinned_at(src, bytes));
    FAKE_RETURN(e);
}

static CUresult fake_dtoh(const char *call, void *dst, CUdeviceptr src, size_t bytes, CUstream s) {
    FAKE_ENTER_AS(call);
    FAKE_NEED_CONTEXT();
    CUresult e = fake_check_stream(s, call);
    char *sv = NULL;
    if (e == CUDA_SUCCESS) e = fake_device_view(src, bytes, call, &sv);
    if (e == CUDA_SUCCESS && bytes && !dst) e = CUDA_ERROR_INVALID_VALUE;
    if (e == CUDA_SUCCESS && bytes) e = fake_copy_op(s, (char *)dst, sv, bytes, false);
    if (e == CUDA_SUCCESS && bytes && !fake_pinned_at(dst, bytes) && !fake_immediate(s))
        fake_drain(s, UINT64_MAX); /* to pageable memory the call returns once the copy is done */
    FAKE_RETURN(e);
}

FAKE_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, CUstream s) {
    return fake_htod(__func__, dst, src, bytes, s);
}

FAKE_API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, CUstream s) {
    return fake_dtoh(__func__, dst, src, bytes, s);
}

FAKE_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes) {
    return fake_htod(__func__, dst, src, bytes, NULL);
}

FAKE_API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes) {
    return fake_dtoh(__func__, dst, src, bytes, NULL);
}

FAKE_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s) {
    FAKE_ENTER();
    FAKE_NEED_CONTEXT();
    CUresult e = fake_check_stream(s, __func__);
    char *d = NULL, *sv = NULL;
    if (e == CUDA_SUCCESS) e = fake_device_view(dst, bytes, __func__, &d);
    if (e == CUDA_SUCCESS) e = fake_device_view(src, bytes, __func__, &sv);
    if (e == CUDA_SUCCESS && bytes) e = fake_copy_op(s, d, sv, bytes, false);
    FAKE_RETURN(e);
}

FAKE_API CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t bytes, CUstream s) {
    FAKE_ENTER();
    FAKE_NEED_CONTEXT();
    CUresult e = fake_check_stream(s, __func__);
    char *d = NULL, *sv = NULL;
    if (e == CUDA_SUCCESS && (!fake_ctx_usable(dst_ctx) || !fake_ctx_usable(src_ctx)))
        e = fake_refuse(CUDA_ERROR_INVALID_CONTEXT, "cuMemcpyPeerAsync: context %p or %p is not usable", (void *)dst_ctx, (void *)src_ctx);
    if (e == CUDA_SUCCESS) e = fake_device_view(dst, bytes, __func__, &d);
    if (e == CUDA_SUCCESS) e = fake_device_view(src, bytes, __func__, &sv);
    if (e == CUDA_SUCCESS) { /* each pointer must be memory of the context named with it */
        const fake_alloc *da = fake_alloc_at(dst), *sa = fake_alloc_at(src);
        if (da->ctx != dst_ctx || sa->ctx != src_ctx)
            e = fake_refuse(CUDA_ERROR_INVALID_VALUE, "cuMemcpyPeerAsync: pointers of contexts %p and %p, named with %p and %p", (void *)da->ctx,
                            (void *)sa->ctx, (void *)dst_ctx, (void *)src_ctx);
    }
    if (e == CUDA_SUCCESS && bytes) e = fake_copy_op(s, d, sv, bytes, false);
    FAKE_RETURN(e);
}

/* The memsets: height rows of width elements of elem_size bytes, pitch bytes apart. The
   destination must be aligned to the element, as the driver requires; a 2D one's pitch too, and
   its rows must not overlap. Called with the lock held. */
static CUresult fake_memset(CUdeviceptr dst, size_t pitch, unsigned int value, size_t elem_size, size_t width, size_t height, CUstream s,
                            const char *call) {
    if (!fake_current) return fake_refuse(CUDA_ERROR_INVALID_CONTEXT, "%s without a current context", call);
    CUresult e = fake_check_stream(s, call);
    char *d = NULL;
    size_t extent = 0, last_row = 0;
    if (e == CUDA_SUCCESS && dst % elem_size != 0)
        e = fake_refuse(CUDA_ERROR_INVALID_VALUE, "%s: 0x%llx is not aligned to %zu bytes", call, (unsigned long long)dst, elem_size);
    if (e == CUDA_SUCCESS && height > 1 && (pitch % elem_size != 0 || width > pitch / elem_size))
        e = fake_refuse(CUDA_ERROR_INVALID_VALUE, "%s: pitch %zu for rows of %zu elements of %zu bytes", call, pitch, width, elem_size);
    if (e == CUDA_SUCCESS && width && height) {
        if (__builtin_mul_overflow(height - 1, pitch, &last_row) || __builtin_mul_overflow(width, elem_size, &extent) ||
            __builtin_add_overflow(last_row, extent, &extent))
            e = fake_refuse(CUDA_ERROR_INVALID_VALUE, "%s: %zu rows of %zu elements, pitch %zu, overflow", call, height, width, pitch);
    }
    if (e == CUDA_SUCCESS) e = fake_device_view(dst, extent, call, &d);
    if (e == CUDA_SUCCESS && extent) {
        fake_op *op = fake_op_new(OP_SET);
        if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
        op->dst = d;
        op->bytes = extent;
        op->value = value;
        op->elem_size = elem_size;
        op->width = width;
        op->height = height;
        op->pitch = pitch;
        e = fake_enqueue(s, op);
    }
    return e;
}

FAKE_API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream s) {
    FAKE_ENTER();
    FAKE_RETURN(fake_memset(dst, n, value, 1, n, 1, s, __func__));
}

FAKE_API CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short value, size_t n, CUstream s) {
    FAKE_ENTER();
    FAKE_RETURN(fake_memset(dst, 2 * n, value, 2, n, 1, s, __func__));
}

FAKE_API CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t n, CUstream s) {
    FAKE_ENTER();
    FAKE_RETURN(fake_memset(dst, 4 * n, value, 4, n, 1, s, __func__));
}

FAKE_API CUresult cuMemsetD2D32Async(CUdeviceptr dst, size_t pitch, unsigned int value, size_t width, size_t height, CUstream s) {
    FAKE_ENTER();
    FAKE_RETURN(fake_memset(dst, pitch, value, 4, width, height, s, __func__));
}

/* ---------------------------------------------------------------------------------------------
 * Streams and events
 * ------------------------------------------------------------------------------------------- */
FAKE_API CUresult cuStreamCreate(CUstream *out, unsigned int flags) {
    FAKE_ENTER();
    FAKE_NEED_CONTEXT();
    if (!out || (flags & ~1u)) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    CUstream s = (CUstream)calloc(1, sizeof *s);
    if (!s) FAKE_RETURN(CUDA_ERROR_OUT_OF_MEMORY);
    s->ctx = fake_current;
    s->next_stream = fake.streams;
    fake.streams = s;
    *out = s;
    FAKE_RETURN(CUDA_SUCCESS);
}

/* The real driver lets queued work finish after the call; here it runs first. */
FAKE_API CUresult cuStreamDestroy_v2(CUstream s) {
    FAKE_ENTER();
    if (fake_immediate(s) || s->destroyed) FAKE_RETURN(CUDA_ERROR_INVALID_HANDLE);
    fake_drain(s, UINT64_MAX);
    s->destroyed = true;
    FAKE_RETURN(CUDA_SUCCESS);
}

/* CUDA_SUCCESS, or the sticky error that corrupted s's context while its work ran. */
static CUresult fake_stream_status(CUstream s) { return !fake_immediate(s) && s->ctx && s->ctx->sticky ? s->ctx->sticky : CUDA_SUCCESS; }

FAKE_API CUresult cuStreamSynchronize(CUstream s) {
    FAKE_ENTER();
    if (!fake_immediate(s)) fake_drain(s, UINT64_MAX);
    FAKE_RETURN(fake_stream_status(s));
}

FAKE_API CUresult cuStreamQuery(CUstream s) {
    FAKE_ENTER();
    if (fake_immediate(s) || (!s->head && !s->running)) FAKE_RETURN(CUDA_SUCCESS); /* a running op is pending work too */
    if (!s->asked) {
        s->asked = true;
        FAKE_RETURN(CUDA_ERROR_NOT_READY);
    }
    fake_drain(s, UINT64_MAX);
    FAKE_RETURN(fake_stream_status(s));
}

/* Runs in stream order when the stream runs (on the waiting thread here, the driver's own on a GPU). */
FAKE_API CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *user) {
    FAKE_ENTER();
    FAKE_NEED_CONTEXT();
    if (!fn) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    CUresult e = fake_check_stream(s, __func__);
    if (e != CUDA_SUCCESS) FAKE_RETURN(e);
    fake_op *op = fake_op_new(OP_HOST);
    if (!op) FAKE_RETURN(CUDA_ERROR_OUT_OF_MEMORY);
    op->fn = fn;
    op->user = user;
    FAKE_RETURN(fake_enqueue(s, op));
}

/* For tests (found with dlsym): how many operations the calling thread has run, so that a test
   can see that an async call returned without running any of its work itself (another thread,
   such as an OpenCL callback waiting for an event, may run it meanwhile, as a GPU would). */
FAKE_API unsigned long long fake_cuda_ops_run(void);
FAKE_API unsigned long long fake_cuda_ops_run(void) { return fake_ops_run_here; }

FAKE_API CUresult cuStreamGetCtx(CUstream s, CUcontext *ctx) {
    FAKE_ENTER();
    if (!ctx) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    if (fake_immediate(s)) {
        FAKE_NEED_CONTEXT();
        *ctx = fake_current;
    } else {
        *ctx = s->ctx;
    }
    FAKE_RETURN(CUDA_SUCCESS);
}

static void fake_event_free(CUevent e) {
    if (e->prev_event) e->prev_event->next_event = e->next_event;
    else fake.events = e->next_event;
    if (e->next_event) e->next_event->prev_event = e->prev_event;
    free(e);
}

FAKE_API CUresult cuEventCreate(CUevent *out, unsigned int flags) {
    FAKE_ENTER();
    FAKE_NEED_CONTEXT();
    if (!out || (flags & ~0xfu)) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    CUevent e = (CUevent)calloc(1, sizeof *e);
    if (!e) FAKE_RETURN(CUDA_ERROR_OUT_OF_MEMORY);
    e->ctx = fake_current;
    e->flags = flags;
    e->next_event = fake.events;
    if (fake.events) fake.events->prev_event = e;
    fake.events = e;
    *out = e;
    FAKE_RETURN(CUDA_SUCCESS);
}

/* As the driver does, an event whose record is still queued is released once the record runs
   (the call returns at once); a wait already queued on it is not affected. */
FAKE_API CUresult cuEventDestroy_v2(CUevent e) {
    FAKE_ENTER();
    if (!e || !fake_event_live(e) || e->destroyed) FAKE_RETURN(CUDA_ERROR_INVALID_HANDLE);
    if (fake_event_done(e)) fake_event_free(e);
    else e->destroyed = true;
    FAKE_RETURN(CUDA_SUCCESS);
}

FAKE_API CUresult cuEventRecord(CUevent e, CUstream s) {
    FAKE_ENTER();
    FAKE_NEED_CONTEXT();
    if (!e || !fake_event_live(e)) FAKE_RETURN(CUDA_ERROR_INVALID_HANDLE);
    CUresult r = fake_check_stream(s, __func__);
    if (r != CUDA_SUCCESS) FAKE_RETURN(r);
    if (e->ctx != fake_current)
        FAKE_RETURN(fake_refuse(CUDA_ERROR_INVALID_HANDLE, "cuEventRecord: the event belongs to context %p (device %d), the current one is %p (device %d)",
                                (void *)e->ctx, e->ctx->device, (void *)fake_current, fake_current->device));
    if (!fake_event_done(e) && e->stream != s) fake_drain(e->stream, e->seq); /* its older record names it too */
    fake_op *op = fake_op_new(OP_RECORD);
    if (!op) FAKE_RETURN(CUDA_ERROR_OUT_OF_MEMORY);
    op->event = e;
    e->recorded = true;
    e->asked = false;
    if (fake_immediate(s)) {
        e->stream = NULL;
        e->time_ms = fake_now_ms();
        free(op);
        FAKE_RETURN(CUDA_SUCCESS);
    }
    e->stream = s;
    e->seq = s->queued + 1;
    FAKE_RETURN(fake_enqueue(s, op));
}

FAKE_API CUresult cuEventSynchronize(CUevent e) {
    FAKE_ENTER();
    if (!e || !fake_event_live(e)) FAKE_RETURN(CUDA_ERROR_INVALID_HANDLE);
    if (fake.trace_ops)
        fprintf(stderr, "fake-cuda: cuEventSynchronize %p: stream %p, record #%llu, ran %llu\n", (void *)e, (void *)e->stream, (unsigned long long)e->seq,
                e->stream ? (unsigned long long)e->stream->ran : 0ull);
    if (!fake_event_done(e)) fake_drain(e->stream, e->seq);
    FAKE_RETURN(e->stream ? fake_stream_status(e->stream) : CUDA_SUCCESS);
}

FAKE_API CUresult cuEventQuery(CUevent e) {
    FAKE_ENTER();
    if (!e || !fake_event_live(e)) FAKE_RETURN(CUDA_ERROR_INVALID_HANDLE);
    if (fake_event_done(e)) FAKE_RETURN(CUDA_SUCCESS);
    if (!e->asked) {
        e->asked = true;
        FAKE_RETURN(CUDA_ERROR_NOT_READY);
    }
    fake_drain(e->stream, e->seq);
    FAKE_RETURN(CUDA_SUCCESS);
}

/* cuda.h 12.8+ renames cuEventElapsedTime to _v2; drivers export both, and gpuarr uses the first. */
#undef cuEventElapsedTime
FAKE_API CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end);
FAKE_API CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
    FAKE_ENTER();
    if (!ms || !start || !end) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    if (!fake_event_live(start) || !fake_event_live(end)) FAKE_RETURN(CUDA_ERROR_INVALID_HANDLE);
    if ((start->flags | end->flags) & CU_EVENT_DISABLE_TIMING) FAKE_RETURN(CUDA_ERROR_INVALID_HANDLE);
    if (!start->recorded || !end->recorded) FAKE_RETURN(CUDA_ERROR_INVALID_HANDLE);
    if (!fake_event_done(start) || !fake_event_done(end)) FAKE_RETURN(CUDA_ERROR_NOT_READY);
    *ms = (float)(end->time_ms - start->time_ms);
    FAKE_RETURN(CUDA_SUCCESS);
}

FAKE_API CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
    FAKE_ENTER();
    FAKE_NEED_CONTEXT();
    if (!e || flags != 0) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    if (!fake_event_live(e)) FAKE_RETURN(fake_refuse(CUDA_ERROR_INVALID_HANDLE, "cuStreamWaitEvent: %p is not a live event", (void *)e));
    CUresult r = fake_check_stream(s, __func__);
    if (r != CUDA_SUCCESS) FAKE_RETURN(r);
    if (fake_event_done(e) || e->stream == s) FAKE_RETURN(CUDA_SUCCESS); /* nothing to wait for, or in order already */
    if (fake_immediate(s)) { /* the legacy stream: wait now */
        fake_drain(e->stream, e->seq);
        FAKE_RETURN(CUDA_SUCCESS);
    }
    fake_op *op = fake_op_new(OP_WAIT);
    if (!op) FAKE_RETURN(CUDA_ERROR_OUT_OF_MEMORY);
    op->on = e->stream;
    op->through = e->seq;
    FAKE_RETURN(fake_enqueue(s, op));
}

/* ---------------------------------------------------------------------------------------------
 * Modules and kernels
 * ------------------------------------------------------------------------------------------- */
static void fake_log(unsigned int n, CUjit_option *opts, void **values, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void fake_log(unsigned int n, CUjit_option *opts, void **values, const char *fmt, ...) {
    char *buf = NULL;
    size_t cap = 0;
    for (unsigned int i = 0; i < n; i++) {
        if (opts[i] == CU_JIT_ERROR_LOG_BUFFER) buf = (char *)values[i];
        if (opts[i] == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES) cap = (size_t)(uintptr_t)values[i];
    }
    if (!buf || !cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
}

/* "gpuarr_kernel_saxpy" -> a portable kernel, but not its parameters' PTX names
   ("gpuarr_kernel_saxpy_param_0"). */
static bool fake_portable_parse(const char *name, size_t len, fake_kernel *k) {
    static const char prefix[] = "gpuarr_kernel_";
    if (len >= sizeof k->name || len < sizeof prefix || memcmp(name, prefix, sizeof prefix - 1) != 0) return false;
    size_t digits = 0;
    while (digits < len && name[len - 1 - digits] >= '0' && name[len - 1 - digits] <= '9') digits++;
    if (digits && len - digits >= 7 && memcmp(name + len - digits - 7, "_param_", 7) == 0) return false;
    memset(k, 0, sizeof *k);
    memcpy(k->name, name, len);
    k->portable = true;
    return true;
}

/* "gpuarr_k_cast_GPUARR_F32_GPUARR_F16" -> the two dtypes. */
static bool fake_kernel_parse(const char *name, size_t len, fake_kernel *k) {
    static const char prefix[] = "gpuarr_k_cast_";
    if (fake_portable_parse(name, len, k)) return true;
    if (len >= sizeof k->name || len < sizeof prefix || memcmp(name, prefix, sizeof prefix - 1) != 0) return false;
    memset(k, 0, sizeof *k);
    memcpy(k->name, name, len);
    k->name[len] = 0;
    for (int s = 1; s < GPUARR_DTYPE_COUNT; s++)
        for (int t = 1; t < GPUARR_DTYPE_COUNT; t++) {
            char want[96];
            snprintf(want, sizeof want, "%s%s_%s", prefix, gpuarr__dtype_texts[s].name, gpuarr__dtype_texts[t].name);
            if (strcmp(want, k->name) == 0) {
                k->src = s;
                k->dst = t;
                return true;
            }
        }
    return false;
}

/* Every gpuarr kernel name in [text, text + len): casts and portable kernels. */
static int fake_find_kernels(const char *text, size_t len, CUmodule m) {
    static const char *const prefixes[] = {"gpuarr_k_cast_", "gpuarr_kernel_"};
    int found = 0;
    for (int which = 0; which < 2; which++) {
        for (const char *p = text; (p = (const char *)memmem(p, len - (size_t)(p - text), prefixes[which], strlen(prefixes[which]))) != NULL; p++) {
            size_t n = 0;
            while ((size_t)(p - text) + n < len && (p[n] == '_' || (p[n] >= 'a' && p[n] <= 'z') || (p[n] >= 'A' && p[n] <= 'Z') ||
                                                    (p[n] >= '0' && p[n] <= '9')))
                n++;
            fake_kernel k;
            if (!fake_kernel_parse(p, n, &k)) continue;
            bool seen = false;
            for (int i = 0; i < m->kernel_count; i++) seen = seen || strcmp(m->functions[i].kernel.name, k.name) == 0;
            if (seen) continue;
            struct CUfunc_st *grown = (struct CUfunc_st *)realloc(m->functions, (size_t)(m->kernel_count + 1) * sizeof *grown);
            if (!grown) return -1;
            m->functions = grown;
            m->functions[m->kernel_count++] = (struct CUfunc_st){m, k};
            found++;
        }
    }
    return found;
}

/* FAKE_CUDA_PTXAS: the real ptxas compiles the module for sm_90, as the driver's JIT would. */
static CUresult fake_ptxas(const char *ptx, unsigned int n, CUjit_option *opts, void **values) {
    const char *ptxas = getenv("FAKE_CUDA_PTXAS");
    if (!ptxas || !*ptxas) return CUDA_SUCCESS;
    char dir[] = "/tmp/fake-cuda-ptxas-XXXXXX", file[64], cmd[1024], out[600] = "";
    if (!mkdtemp(dir)) return CUDA_ERROR_OUT_OF_MEMORY;
    snprintf(file, sizeof file, "%s/module.ptx", dir);
    FILE *f = fopen(file, "w");
    bool written = f && fputs(ptx, f) >= 0;
    if (f) fclose(f);
    snprintf(cmd, sizeof cmd, "'%s' -arch=sm_90 '%s' -o /dev/null 2>&1", ptxas, file);
    FILE *p = written ? popen(cmd, "r") : NULL;
    size_t got = p ? fread(out, 1, sizeof out - 1, p) : 0;
    out[got] = '\0';
    int status = p ? pclose(p) : -1;
    remove(file);
    rmdir(dir);
    if (status == 0) return CUDA_SUCCESS;
    fprintf(stderr, "fake_cuda: %s refused a PTX module: %s\n", ptxas, out);
    fake_log(n, opts, values, "%s", out[0] ? out : "ptxas failed to run");
    return CUDA_ERROR_INVALID_PTX;
}

static CUresult fake_load_ptx(const char *ptx, CUmodule m, unsigned int n, CUjit_option *opts, void **values) {
    int major = 0, minor = 0, sm = 0;
    const char *v = strstr(ptx, ".version ");
    const char *t = strstr(ptx, ".target sm_");
    if (!v || sscanf(v, ".version %d.%d", &major, &minor) != 2 || !t || sscanf(t, ".target sm_%d", &sm) != 1) {
        fake_log(n, opts, values, "ptxas fatal   : not PTX (no .version or .target)");
        return CUDA_ERROR_INVALID_PTX;
    }
    if (major > fake.ptx_max_major || (major == fake.ptx_max_major && minor > fake.ptx_max_minor)) {
        fake_log(n, opts, values, "ptxas application ptx input, line 1; fatal   : Unsupported .version %d.%d; current version is '%d.%d'", major, minor,
                 fake.ptx_max_major, fake.ptx_max_minor);
        return CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
    }
    if (sm > 90) {
        fake_log(n, opts, values, "ptxas fatal   : PTX for sm_%d does not run on sm_90", sm);
        return CUDA_ERROR_INVALID_PTX;
    }
    if (fake_find_kernels(ptx, strlen(ptx), m) <= 0) {
        fake_log(n, opts, values, "ptxas fatal   : no gpuarr kernel in this PTX");
        return CUDA_ERROR_INVALID_PTX;
    }
    return fake_ptxas(ptx, n, opts, values);
}

/* A cubin: an ELF for the CUDA machine built for sm_90 (the arch is the low byte of e_flags). */
static CUresult fake_load_cubin(const unsigned char *image, CUmodule m, unsigned int n, CUjit_option *opts, void **values) {
    Elf64_Ehdr h;
    memcpy(&h, image, sizeof h);
    if (h.e_ident[EI_CLASS] != ELFCLASS64 || h.e_machine != 190 /* EM_CUDA */) {
        fake_log(n, opts, values, "not a CUDA ELF image");
        return CUDA_ERROR_INVALID_IMAGE;
    }
    unsigned arch = h.e_flags & 0xffu, arch_new = (h.e_flags >> 8) & 0xffu;
    if (arch != 90 && arch_new != 90) {
        fake_log(n, opts, values, "the cubin is for another architecture (e_flags 0x%x), the device is sm_90", h.e_flags);
        return CUDA_ERROR_NO_BINARY_FOR_GPU;
    }
    size_t size = (size_t)h.e_shoff + (size_t)h.e_shnum * h.e_shentsize;
    if (fake_find_kernels((const char *)image, size, m) <= 0) {
        fake_log(n, opts, values, "no gpuarr kernel in this cubin");
        return CUDA_ERROR_INVALID_IMAGE;
    }
    return CUDA_SUCCESS;
}

static bool fake_module_live(CUmodule m) {
    for (CUmodule k = fake.modules; k; k = k->next_module)
        if (k == m) return true;
    return false;
}

static bool fake_function_live(CUfunction f) {
    for (CUmodule k = fake.modules; k; k = k->next_module)
        if (f >= k->functions && f < k->functions + k->kernel_count) return true;
    return false;
}

static void fake_module_free(CUmodule m) {
    if (m->prev_module) m->prev_module->next_module = m->next_module;
    else fake.modules = m->next_module;
    if (m->next_module) m->next_module->prev_module = m->prev_module;
    free(m->functions);
    free(m);
}

FAKE_API CUresult cuModuleLoadDataEx(CUmodule *out, const void *image, unsigned int n, CUjit_option *opts, void **values) {
    FAKE_ENTER();
    FAKE_NEED_CONTEXT();
    if (!out || !image || (n && (!opts || !values))) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    CUmodule m = (CUmodule)calloc(1, sizeof *m);
    if (!m) FAKE_RETURN(CUDA_ERROR_OUT_OF_MEMORY);
    m->ctx = fake_current;
    m->next_module = fake.modules;
    if (fake.modules) fake.modules->prev_module = m;
    fake.modules = m;
    const unsigned char *bytes = (const unsigned char *)image;
    CUresult e = memcmp(bytes, ELFMAG, SELFMAG) == 0 ? fake_load_cubin(bytes, m, n, opts, values) : fake_load_ptx((const char *)image, m, n, opts, values);
    if (e != CUDA_SUCCESS) {
        fake_module_free(m);
        FAKE_RETURN(e);
    }
    *out = m;
    FAKE_RETURN(CUDA_SUCCESS);
}

FAKE_API CUresult cuModuleUnload(CUmodule m) {
    FAKE_ENTER();
    if (!m || !fake_module_live(m)) FAKE_RETURN(fake_refuse(CUDA_ERROR_INVALID_HANDLE, "cuModuleUnload of %p: not a loaded module", (void *)m));
    fake_module_free(m);
    FAKE_RETURN(CUDA_SUCCESS);
}

FAKE_API CUresult cuModuleGetFunction(CUfunction *out, CUmodule m, const char *name) {
    FAKE_ENTER();
    if (!out || !m || !name) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    if (!fake_module_live(m)) FAKE_RETURN(fake_refuse(CUDA_ERROR_INVALID_HANDLE, "cuModuleGetFunction: %p is not a loaded module", (void *)m));
    for (int i = 0; i < m->kernel_count; i++)
        if (strcmp(m->functions[i].kernel.name, name) == 0) {
            *out = &m->functions[i];
            FAKE_RETURN(CUDA_SUCCESS);
        }
    FAKE_RETURN(CUDA_ERROR_NOT_FOUND);
}

/* gpuarr's CUDA backend hands over its hooks here (see the top of the file); on = 0 takes them back. */
FAKE_API void gpuarr_sim_kernel_hooks_set(const gpuarr__sim_kernel_hooks *hooks, int on);
FAKE_API void gpuarr_sim_kernel_hooks_set(const gpuarr__sim_kernel_hooks *hooks, int on) {
    if (!hooks || hooks->version != GPUARR__SIM_KERNEL_HOOKS_VERSION) return;
    pthread_mutex_lock(&fake.lock);
    int slot = -1;
    for (int i = 0; i < 8; i++) {
        if (fake.hooks[i] == hooks) fake.hooks[i] = NULL;
        if (!fake.hooks[i] && slot < 0) slot = i;
    }
    if (on && slot >= 0) fake.hooks[slot] = hooks;
    pthread_mutex_unlock(&fake.lock);
}

/* A portable kernel: its launch captured by the gpuarr that built it, every array it is given
   memory the device can reach, then queued like any op. */
static CUresult fake_launch_portable(CUfunction f, const unsigned int grid[3], const unsigned int block[3], CUstream s, void **params) {
    unsigned long long threads[3];
    for (int d = 0; d < 3; d++) threads[d] = (unsigned long long)grid[d] * block[d];
    char why[256] = "no gpuarr handed this driver its kernel hooks";
    void *launch = NULL;
    const gpuarr__sim_kernel_hooks *hooks = NULL;
    for (int i = 0; i < 8 && !launch; i++)
        if (fake.hooks[i] && (launch = fake.hooks[i]->capture(f, params, threads, why, sizeof why)) != NULL) hooks = fake.hooks[i];
    if (!launch) return why[0] ? fake_refuse(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel: %s: %s", f->kernel.name, why) : CUDA_ERROR_OUT_OF_MEMORY;
    unsigned long long at[GPUARR_KERNEL_MAX_PARAMS];
    int n = hooks->addresses(launch, at, GPUARR_KERNEL_MAX_PARAMS);
    for (int i = 0; i < n && i < GPUARR_KERNEL_MAX_PARAMS; i++)
        if (!fake_translate(fake_current, at[i])) {
            hooks->release(launch);
            return fake_refuse(CUDA_ERROR_ILLEGAL_ADDRESS, "%s: array %d at 0x%llx is not memory context %p (device %d) can reach", f->kernel.name, i,
                               at[i], (void *)fake_current, fake_current->device);
        }
    fake_op *op = fake_op_new(OP_KERNEL);
    if (!op) {
        hooks->release(launch);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    op->hooks = hooks;
    op->user = launch;
    return fake_enqueue(s, op);
}

/* gpuarr's cast kernels take (src, src_index, dst, dst_index, n): thread i < n casts element i. */
FAKE_API CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz,
                                 unsigned int shared, CUstream s, void **params, void **extra) {
    FAKE_ENTER();
    FAKE_NEED_CONTEXT();
    if (!f || !params || extra) FAKE_RETURN(CUDA_ERROR_INVALID_VALUE);
    if (!fake_function_live(f)) FAKE_RETURN(fake_refuse(CUDA_ERROR_INVALID_HANDLE, "cuLaunchKernel: %p is not a function of a loaded module", (void *)f));
    if (f->module->ctx != fake_current)
        FAKE_RETURN(fake_refuse(CUDA_ERROR_INVALID_HANDLE, "cuLaunchKernel: a function of context %p (device %d) launched in context %p (device %d)",
                                (void *)f->module->ctx, f->module->ctx->device, (void *)fake_current, fake_current->device));
    CUresult e = fake_check_stream(s, __func__);
    if (e != CUDA_SUCCESS) FAKE_RETURN(e);
    if (f->kernel.portable) { /* CUDA's limits */
        if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0 || bx > 1024 || by > 1024 || bz > 64 || (unsigned long long)bx * by * bz > 1024 ||
            gx > 0x7fffffffu || gy > 65535 || gz > 65535 || shared > 48 * 1024)
            FAKE_RETURN(fake_refuse(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel: grid %ux%ux%u, block %ux%ux%u", gx, gy, gz, bx, by, bz));
        const unsigned int grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
        FAKE_RETURN(fake_launch_portable(f, grid, block, s, params));
    }
    if (gx == 0 || gy != 1 || gz != 1 || bx == 0 || bx > 1024 || by != 1 || bz != 1 || gx > 0x7fffffffu || shared > 48 * 1024)
        FAKE_RETURN(fake_refuse(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel: grid %ux%ux%u, block %ux%ux%u", gx, gy, gz, bx, by, bz));
    CUdeviceptr sp, dp;
    uint64_t s_at, d_at, n;
    memcpy(&sp, params[0], sizeof sp);
    memcpy(&s_at, params[1], sizeof s_at);
    memcpy(&dp, params[2], sizeof dp);
    memcpy(&d_at, params[3], sizeof d_at);
    memcpy(&n, params[4], sizeof n);
    uint64_t threads = (uint64_t)gx * bx, count = n < threads ? n : threads;
    size_t ss = gpuarr__dtype_sizes[f->kernel.src], ds = gpuarr__dtype_sizes[f->kernel.dst];
    char *src = NULL, *dst = NULL;
    if (count) {
        src = fake_device_range(sp + s_at * ss, count * ss, NULL);
        dst = fake_device_range(dp + d_at * ds, count * ds, NULL);
    }
    if (count && (!src || !dst || !fake_reaches(fake_current, fake_alloc_at(sp + s_at * ss)) || !fake_reaches(fake_current, fake_alloc_at(dp + d_at * ds))))
        FAKE_RETURN(fake_refuse(CUDA_ERROR_ILLEGAL_ADDRESS,
                                "%s: elements %llu.. of 0x%llx or %llu.. of 0x%llx (%llu of them) are not memory context %p (device %d) can reach",
                                f->kernel.name, (unsigned long long)s_at, (unsigned long long)sp, (unsigned long long)d_at, (unsigned long long)dp,
                                (unsigned long long)count, (void *)fake_current, fake_current->device));
    if (!count) FAKE_RETURN(CUDA_SUCCESS);
    fake_op *op = fake_op_new(OP_CAST);
    if (!op) FAKE_RETURN(CUDA_ERROR_OUT_OF_MEMORY);
    op->src = src;
    op->dst = dst;
    op->count = count;
    op->src_size = ss;
    op->dst_size = ds;
    op->cast = fake.casts[f->kernel.src][f->kernel.dst];
    FAKE_RETURN(fake_enqueue(s, op));
}

/* NVRTC opens libcuda.so.1 too (this library, once loaded) and asks for the driver's private
   tables, calling the result of dlsym unchecked: there are none here. */
FAKE_API CUresult cuGetExportTable(const void **table, const CUuuid *id) {
    (void)id;
    if (table) *table = NULL;
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------- */
#define FAKE_ERRORS(X)                                                                             \
    X(CUDA_SUCCESS, "no error")                                                                    \
    X(CUDA_ERROR_INVALID_VALUE, "invalid argument")                                                \
    X(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")                                                   \
    X(CUDA_ERROR_NOT_INITIALIZED, "initialization error")                                          \
    X(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal")                                         \
    X(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid")                                  \
    X(CUDA_ERROR_INVALID_CONTEXT, "invalid device context")                                        \
    X(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed")                                     \
    X(CUDA_ERROR_TOO_MANY_PEERS, "peer mapping resources exhausted")                               \
    X(CUDA_ERROR_NO_BINARY_FOR_GPU, "no kernel image is available for execution on the device")    \
    X(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "peer access is not supported between these two devices") \
    X(CUDA_ERROR_INVALID_PTX, "a PTX JIT compilation failed")                                      \
    X(CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "the provided PTX was compiled with an unsupported toolchain.") \
    X(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle")                                        \
    X(CUDA_ERROR_NOT_FOUND, "named symbol not found")                                              \
    X(CUDA_ERROR_NOT_READY, "device not ready")                                                    \
    X(CUDA_ERROR_NOT_SUPPORTED, "operation not supported")                                         \
    X(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered")                      \
    X(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "peer access is already enabled")                    \
    X(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "part or all of the requested memory range is already mapped") \
    X(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "pointer does not correspond to a registered memory region") \
    X(CUDA_ERROR_INVALID_ADDRESS_SPACE, "operation not supported on global/shared address space")  \
    X(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure")                                      \
    X(CUDA_ERROR_LAUNCH_TIMEOUT, "the launch timed out and was terminated")                        \
    X(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch")               \
    X(CUDA_ERROR_ASSERT, "device-side assert triggered")                                           \
    X(CUDA_ERROR_HARDWARE_STACK_ERROR, "hardware stack error")                                     \
    X(CUDA_ERROR_ILLEGAL_INSTRUCTION, "an illegal instruction was encountered")                    \
    X(CUDA_ERROR_MISALIGNED_ADDRESS, "misaligned address")                                         \
    X(CUDA_ERROR_INVALID_PC, "invalid program counter")                                            \
    X(CUDA_ERROR_ECC_UNCORRECTABLE, "uncorrectable ECC error encountered")                         \
    X(CUDA_ERROR_NOT_PERMITTED, "operation not permitted")                                         \
    X(CUDA_ERROR_DEINITIALIZED, "driver shutting down")                                            \
    X(CUDA_ERROR_UNKNOWN, "unknown error")

FAKE_API CUresult cuGetErrorName(CUresult e, const char **out) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
#define FAKE_NAME(code, text)                                                                      \
    if (e == code) {                                                                               \
        *out = #code;                                                                              \
        return CUDA_SUCCESS;                                                                       \
    }
    FAKE_ERRORS(FAKE_NAME)
#undef FAKE_NAME
    *out = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

FAKE_API CUresult cuGetErrorString(CUresult e, const char **out) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
#define FAKE_TEXT(code, text)                                                                      \
    if (e == code) {                                                                               \
        *out = text;                                                                               \
        return CUDA_SUCCESS;                                                                       \
    }
    FAKE_ERRORS(FAKE_TEXT)
#undef FAKE_TEXT
    *out = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* A CUresult by number or by name (FAKE_CUDA_FAIL). */
static bool fake_error_code(const char *text, CUresult *out) {
    char *end;
    unsigned long v = strtoul(text, &end, 0);
    if (end != text && !*end) {
        *out = (CUresult)v;
        return true;
    }
#define FAKE_CODE(code, words)                                                                     \
    if (strcmp(text, #code) == 0) {                                                                \
        *out = code;                                                                               \
        return true;                                                                               \
    }
    FAKE_ERRORS(FAKE_CODE)
#undef FAKE_CODE
    return false;
}
