/*
 * fault_matrix.c -- a failure at every driver call, with nothing crashed, leaked or corrupted.
 *
 * For each scenario below and N = 1, 2, 3, ... a fresh process (fork) starts gpuarr, sets the
 * scenario up, then fails the Nth driver call of the scenario proper (fake_cuda_fail_set /
 * fault_opencl_fail_set: tests/fake_cuda/fake_cuda.c, tests/fault_opencl/fault_opencl.c) and runs
 * it, until a run ends without reaching call N. The "init" scenarios count from the process start
 * instead (FAKE_CUDA_FAIL / FAULT_OPENCL_FAIL in the environment): gpuarr_init failing is a
 * scenario too. Each run checks:
 *   - the gpuarr call that met the fault returns an error and gpuarr_last_error() names the
 *     driver call and its code (or the fault is absorbed -- a fallback, a retry -- and the
 *     scenario's results are still right: "recovered");
 *   - nothing the caller owns changed: host sources are unchanged, out handles untouched on error;
 *   - every array released, each pool's allocated_bytes (device and pinned) is back where it was;
 *   - the device still works: a fresh small round trip succeeds -- except after a sticky CUDA
 *     error (CUDA_ERROR_ILLEGAL_ADDRESS), where the context is lost: then the round trip must fail
 *     cleanly with an error naming the code, without a crash or a hang (the device-failed state
 *     is a later issue);
 *   - no crash, no hang (an alarm), no sanitizer report (built with ASan+UBSan; the child's
 *     stderr is read for reports), and its exit status is 0.
 * Usage: fault_matrix [-s SCENARIO[,..]] [-e K (every Kth N only)] [-c CAP (most N per walk)]
 *        [-n N (that N alone, printing the run's output)] [-v]
 * It prints each walk's N range, the fault sites (distinct entry point x scenario) per backend,
 * and a summary line; the exit status is 1 if any run failed.
 */
#define _GNU_SOURCE
#include "gpuarr.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------
 * The fault libraries, found with dlsym in the library gpuarr loaded
 * ------------------------------------------------------------------------------------------- */
typedef enum { BK_CUDA, BK_OPENCL } backend_kind;
static const char *const backend_names[] = {"cuda", "opencl"};

typedef unsigned long long (*calls_fn)(void);
typedef int (*set_fn)(const char *);
typedef unsigned long long (*hit_fn)(char *, size_t, void *);

typedef struct fault_lib {
    calls_fn calls;
    set_fn set;
    hit_fn hit;
} fault_lib;

static bool fault_lib_get(backend_kind b, fault_lib *out) {
    const char *path = getenv(b == BK_CUDA ? "GPUARR_CUDA_LIBRARY" : "GPUARR_OPENCL_LIBRARY");
    void *h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    if (!h) return false;
    const char *prefix = b == BK_CUDA ? "fake_cuda" : "fault_opencl";
    char name[64];
    snprintf(name, sizeof name, "%s_calls_made", prefix);
    *(void **)&out->calls = dlsym(h, name);
    snprintf(name, sizeof name, "%s_fail_set", prefix);
    *(void **)&out->set = dlsym(h, name);
    snprintf(name, sizeof name, "%s_fault_hit", prefix);
    *(void **)&out->hit = dlsym(h, name);
    dlclose(h);
    return out->calls && out->set && out->hit;
}

/* ---------------------------------------------------------------------------------------------
 * One run (in the child)
 * ------------------------------------------------------------------------------------------- */
typedef struct run {
    backend_kind backend;
    bool sticky;
    fault_lib lib;
    char code_text[48]; /* the code's name as injected */
    unsigned code_number;
    bool armed;
    /* what happened */
    unsigned long long hit_call;
    char hit_name[64];
    bool errored; /* a scenario call failed (on the fault) */
    char error[512];
    char failure[1024]; /* a check that failed ("" = none) */
    /* devices and pools */
    gpuarr_device devs[4];
    int ndevs;
    uint64_t allocated[4], pinned[4];
} run;

static run R;

static void failf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void failf(const char *fmt, ...) {
    if (R.failure[0]) return; /* the first one says most */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(R.failure, sizeof R.failure, fmt, ap);
    va_end(ap);
}

static void fault_poll(void) {
    if (!R.armed || R.hit_call) return;
    unsigned code = 0;
    R.hit_call = R.lib.hit(R.hit_name, sizeof R.hit_name, &code);
}

/* The entry point's name without a _v2 suffix: what a message must contain. */
static void base_name(const char *name, char *out, size_t len) {
    snprintf(out, len, "%s", name);
    size_t n = strlen(out);
    if (n > 3 && strcmp(out + n - 3, "_v2") == 0) out[n - 3] = 0;
}

static bool names_fault(const char *msg) {
    char base[64], number[32];
    base_name(R.hit_name, base, sizeof base);
    if (R.backend == BK_OPENCL) snprintf(number, sizeof number, "(%d)", (int)R.code_number);
    else snprintf(number, sizeof number, "(%u)", R.code_number);
    return strstr(msg, base) && (strstr(msg, R.code_text) || strstr(msg, number));
}

/* A scenario call: on an error, checks the message and stops the scenario (returns false). */
static bool step_check(gpuarr_result r, const char *what, bool oom_expected) {
    if (r == GPUARR_OK) return true;
    fault_poll();
    const char *msg = gpuarr_last_error();
    if (oom_expected && r == GPUARR_ERROR_OUT_OF_MEMORY && (!R.hit_call || !names_fault(msg)) && strstr(msg, "would pass the pool limit"))
        return false; /* the limit */
    R.errored = true;
    snprintf(R.error, sizeof R.error, "%s", msg);
    if (!R.hit_call) failf("%s failed with no fault injected: %s", what, msg);
    else if (!names_fault(msg) && !(R.sticky && strstr(msg, R.code_text))) /* sticky: a probe may absorb it, the next call meets it */
        failf("%s: the error does not name %s and %s: %s", what, R.hit_name, R.code_text, msg);
    return false;
}
#define STEP(call) (step_check((call), #call, false))

static const gpuarr_array SENTINEL = {0xdeadbeefu};
static bool untouched(const gpuarr_array *a, int n, const char *what) {
    for (int i = 0; i < n; i++)
        if (a[i].id != SENTINEL.id) {
            failf("%s set its out handle on an error", what);
            return false;
        }
    return true;
}
/* out-handle calls: out starts as SENTINEL and must stay so on an error */
#define STEP_OUT(call, out)                                                                        \
    ((out) = SENTINEL, step_check((call), #call, false) || (untouched(&(out), 1, #call), false))

/* Arrays made by the scenario: all released at the end. */
static gpuarr_array arrays[256];
static int narrays;
static void keep(gpuarr_array a) {
    if (a.id && a.id != SENTINEL.id && narrays < 256) arrays[narrays++] = a;
}
static void release_all(void) {
    for (int i = 0; i < narrays; i++)
        if (gpuarr_release(arrays[i]) != GPUARR_OK) failf("gpuarr_release: %s", gpuarr_last_error());
    narrays = 0;
}

/* Host buffers the scenario gives as sources: checked unchanged at the end. */
typedef struct source {
    const void *p;
    void *copy;
    size_t n;
} source;
static source sources[16];
static int nsources;
static void *host_source(size_t n, unsigned seed) {
    unsigned char *p = malloc(n);
    float *f = (float *)p;
    for (size_t i = 0; i < n / 4; i++) f[i] = (float)((i * 37u + seed) % 1000u) * 0.25f;
    void *copy = malloc(n);
    memcpy(copy, p, n);
    sources[nsources++] = (source){p, copy, n};
    return p;
}
static void check_sources(void) {
    for (int i = 0; i < nsources; i++) {
        if (memcmp(sources[i].p, sources[i].copy, sources[i].n) != 0) failf("a host source buffer changed");
        free((void *)sources[i].p);
        free(sources[i].copy);
    }
    nsources = 0;
}

static void expect_floats(const float *got, const float *want, size_t n, const char *what) {
    fault_poll();
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i]) {
            failf("%s: element %zu is %g, expected %g (%s)", what, i, (double)got[i], (double)want[i],
                  R.hit_call ? "silently wrong after the fault" : "no fault");
            return;
        }
}

static gpuarr_device dev_of(const char *spec) {
    gpuarr_device d = {0};
    if (gpuarr_device_find(spec, &d) != GPUARR_OK) {
        fprintf(stderr, "fault_matrix: no device %s: %s\n", spec, gpuarr_last_error());
        exit(3);
    }
    return d;
}

/* ---------------------------------------------------------------------------------------------
 * Scenarios: setup (before the fault is armed) and the scenario proper
 * ------------------------------------------------------------------------------------------- */
typedef struct scenario scenario;
typedef struct env {
    gpuarr_device a, b;        /* the device under test; the other device (peer, cross-backend) */
    float *src, *big;          /* host sources */
    size_t n, big_n;
    gpuarr_array ready;        /* an f32 array of n elements on a, made in setup */
    gpuarr_stream s1, s2;
} env;
static env E;

#define N_SMALL 1000
#define N_BIG ((size_t)(1u << 20) / 4 + 4096) /* > 1 MiB: staged */

static bool sc_upload(void) {
    gpuarr_array x;
    int64_t shape[1] = {(int64_t)E.n};
    if (!STEP_OUT(gpuarr_from_host_as(E.a, GPUARR_F32, E.src, 1, shape, &x), x)) return false;
    keep(x);
    float *got = calloc(E.n, 4);
    bool ok = STEP(gpuarr_to_host_as(x, GPUARR_F32, got, E.n));
    if (ok) expect_floats(got, E.src, E.n, "upload round trip");
    free(got);
    return ok;
}

static bool sc_staged(void) {
    gpuarr_array x;
    int64_t shape[1] = {(int64_t)E.big_n};
    if (!STEP_OUT(gpuarr_from_host_as(E.a, GPUARR_F32, E.big, 1, shape, &x), x)) return false;
    keep(x);
    float *got = calloc(E.big_n, 4);
    bool ok = STEP(gpuarr_to_host_as(x, GPUARR_F32, got, E.big_n));
    if (ok) expect_floats(got, E.big, E.big_n, "staged round trip");
    free(got);
    return ok;
}

static bool sc_download_cast(void) {
    double *got = calloc(E.n, 8);
    bool ok = STEP(gpuarr_to_host_as(E.ready, GPUARR_F64, got, E.n));
    if (ok)
        for (size_t i = 0; i < E.n; i++)
            if (got[i] != (double)E.src[i]) {
                failf("download as f64: element %zu is %g, expected %g", i, got[i], (double)E.src[i]);
                break;
            }
    free(got);
    if (!ok) return false;
    gpuarr_array h;
    if (!STEP_OUT(gpuarr_convert(E.ready, E.a, GPUARR_F16, &h), h)) return false;
    keep(h);
    float *back = calloc(E.n, 4);
    ok = STEP(gpuarr_to_host_as(h, GPUARR_F32, back, E.n));
    if (ok) expect_floats(back, E.src, E.n, "f32 -> f16 on the device -> f32"); /* the values are exact in f16 */
    free(back);
    return ok;
}

/* a -> b (peer or cross-backend), as a new array and into an existing one, and back */
static bool sc_transfer(void) {
    gpuarr_array x, y, z;
    if (!STEP_OUT(gpuarr_convert(E.ready, E.b, 0, &x), x)) return false;
    keep(x);
    int64_t shape[1] = {(int64_t)E.n};
    if (!STEP_OUT(gpuarr_empty(E.a, GPUARR_F32, 1, shape, &y), y)) return false;
    keep(y);
    if (!STEP(gpuarr_copy(y, x))) return false;
    if (!STEP_OUT(gpuarr_convert(y, E.b, GPUARR_F64, &z), z)) return false;
    keep(z);
    float *got = calloc(E.n, 4);
    bool ok = STEP(gpuarr_to_host_as(z, GPUARR_F32, got, E.n));
    if (ok) expect_floats(got, E.src, E.n, "a -> b -> a -> b as f64");
    free(got);
    return ok;
}

static bool sc_async(void) {
    int64_t shape[1] = {(int64_t)E.n};
    gpuarr_array a, h, c;
    gpuarr_event ev = {0};
    bool ok = false;
    float *got = calloc(E.n, 4);
    if (!STEP_OUT(gpuarr_empty(E.a, GPUARR_F32, 1, shape, &a), a)) goto out;
    keep(a);
    if (!STEP(gpuarr_write_async(a, 0, (int64_t)E.n, GPUARR_F32, E.src, E.s1))) goto out;
    if (!STEP_OUT(gpuarr_convert_async(a, E.a, GPUARR_F16, E.s1, &h), h)) goto out;
    keep(h);
    if (!STEP(gpuarr_event_create(E.a, 0, &ev))) goto out;
    if (!STEP(gpuarr_event_record(ev, E.s1))) goto out;
    if (!STEP(gpuarr_stream_wait(E.s2, ev))) goto out;
    if (!STEP_OUT(gpuarr_empty(E.a, GPUARR_F32, 1, shape, &c), c)) goto out;
    keep(c);
    if (!STEP(gpuarr_copy_async(c, h, E.s2))) goto out;
    if (!STEP(gpuarr_read_async(c, 0, (int64_t)E.n, GPUARR_F32, got, E.s2))) goto out;
    if (!STEP(gpuarr_stream_sync(E.s2))) goto out;
    expect_floats(got, E.src, E.n, "write_async, convert_async, copy_async, read_async on two streams");
    ok = true;
out:
    if (ev.id && gpuarr_event_destroy(ev) != GPUARR_OK) failf("gpuarr_event_destroy: %s", gpuarr_last_error());
    if (!ok) {
        gpuarr_stream_sync(E.s1); /* the caller's buffer is read until then */
        gpuarr_stream_sync(E.s2);
    }
    free(got);
    return ok;
}

static bool sc_pool(void) {
    if (gpuarr_pool_set_limit(E.a, 8u << 20) != GPUARR_OK) {
        failf("gpuarr_pool_set_limit: %s", gpuarr_last_error());
        return false;
    }
    int64_t shape[1] = {(512 << 10) / 4}; /* 512 KiB */
    gpuarr_array live[32];
    int n = 0;
    bool ok = true;
    for (; n < 32; n++) {
        live[n] = SENTINEL;
        gpuarr_result r = gpuarr_empty(E.a, GPUARR_F32, 1, shape, &live[n]);
        if (r != GPUARR_OK) {
            untouched(&live[n], 1, "gpuarr_empty");
            ok = step_check(r, "gpuarr_empty (growing the pool to its limit)", true) || R.errored;
            ok = !R.errored;
            break;
        }
    }
    if (ok && n == 32) failf("the pool limit of 8 MiB let 32 arrays of 512 KiB through");
    /* the ladder: release every other one, a larger one must fit after a trim */
    for (int i = 0; i < n; i += 2) gpuarr_release(live[i]);
    for (int i = 1; i < n; i += 2) keep(live[i]);
    if (!ok) return false;
    gpuarr_array big;
    int64_t big_shape[1] = {(3 << 20) / 4};
    gpuarr_result r = gpuarr_empty(E.a, GPUARR_F32, 1, big_shape, &big);
    if (r == GPUARR_OK) keep(big);
    else if (!step_check(r, "gpuarr_empty (3 MiB after releasing half)", true) && R.errored) return false;
    release_all();
    if (!STEP(gpuarr_pool_trim(E.a))) return false;
    return sc_upload();
}

static bool sc_kernel_build(void) {
    gpuarr_array h;
    if (!STEP_OUT(gpuarr_convert(E.ready, E.a, GPUARR_F16, &h), h)) return false;
    keep(h);
    float *got = calloc(E.n, 4);
    bool ok = STEP(gpuarr_to_host_as(h, GPUARR_F32, got, E.n));
    if (ok) expect_floats(got, E.src, E.n, "f32 -> f16 -> f32 (the first cast: the kernels are built)");
    free(got);
    return ok;
}

static bool sc_mutable(void) {
    int64_t shape[1] = {(int64_t)E.n}, shape2[2] = {10, (int64_t)E.n / 10};
    gpuarr_array y, v, w, p, st, many[2];
    float *got = calloc(2 * E.n, 4);
    bool ok = false;
    /* copy into an existing array, ranges, fill, views */
    if (!STEP_OUT(gpuarr_empty(E.a, GPUARR_F32, 1, shape, &y), y)) goto out;
    keep(y);
    if (!STEP(gpuarr_copy(y, E.ready))) goto out;
    if (!STEP(gpuarr_write(y, 10, 100, GPUARR_F32, E.src + 500))) goto out;
    if (!STEP(gpuarr_read(y, 5, 200, GPUARR_F32, got))) goto out;
    for (int i = 0; i < 200; i++) {
        float want = (i + 5 >= 10 && i + 5 < 110) ? E.src[500 + i + 5 - 10] : E.src[i + 5];
        if (got[i] != want) {
            failf("gpuarr_write/gpuarr_read range: element %d is %g, expected %g", i + 5, (double)got[i], (double)want);
            break;
        }
    }
    float fill = 2.5f;
    if (!STEP_OUT(gpuarr_reshape(y, 2, shape2, &v), v)) goto out;
    keep(v);
    if (!STEP_OUT(gpuarr_slice(v, 3, 5, &w), w)) goto out;
    keep(w);
    if (!STEP(gpuarr_fill_as(w, GPUARR_F32, &fill))) goto out;
    if (!STEP(gpuarr_read(y, 0, (int64_t)E.n, GPUARR_F32, got))) goto out;
    size_t row = E.n / 10;
    for (size_t i = 0; i < E.n; i++) {
        float want = (i >= 3 * row && i < 5 * row) ? 2.5f : (i >= 10 && i < 110) ? E.src[500 + i - 10] : E.src[i];
        if (got[i] != want) {
            failf("gpuarr_fill of a view: element %zu is %g, expected %g", i, (double)got[i], (double)want);
            break;
        }
    }
    /* pinned host memory, then a batch */
    if (!STEP_OUT(gpuarr_empty_pinned(E.a, GPUARR_F32, 1, shape, &p), p)) goto out;
    keep(p);
    if (!STEP(gpuarr_write(p, 0, (int64_t)E.n, GPUARR_F32, E.src))) goto out;
    gpuarr_array pair[2] = {E.ready, p};
    if (!STEP_OUT(gpuarr_stack(pair, 2, E.a, GPUARR_F16, &st), st)) goto out;
    keep(st);
    if (!STEP(gpuarr_to_host_as(st, GPUARR_F32, got, 2 * E.n))) goto out;
    expect_floats(got, E.src, E.n, "gpuarr_stack, first");
    expect_floats(got + E.n, E.src, E.n, "gpuarr_stack, second");
    many[0] = many[1] = SENTINEL;
    if (!step_check(gpuarr_convert_many(pair, 2, E.a, GPUARR_F64, many), "gpuarr_convert_many", false)) {
        untouched(many, 2, "gpuarr_convert_many");
        goto out;
    }
    keep(many[0]);
    keep(many[1]);
    if (!STEP(gpuarr_to_host_as(many[1], GPUARR_F32, got, E.n))) goto out;
    expect_floats(got, E.src, E.n, "gpuarr_convert_many");
    ok = true;
out:
    free(got);
    return ok;
}

/* ---------------------------------------------------------------------------------------------
 * The table
 * ------------------------------------------------------------------------------------------- */
struct scenario {
    const char *name;
    backend_kind backend; /* whose calls fail */
    const char *a, *b;    /* device specs */
    bool discrete;        /* GPUARR_OPENCL_UNIFIED=off */
    bool fresh_cache;     /* an empty GPUARR_CACHE_DIR: the kernels are really built */
    bool warm;            /* a cast in setup: kernels loaded before the fault is armed */
    bool streams;
    bool sticky;          /* CUDA: the code is CUDA_ERROR_ILLEGAL_ADDRESS */
    bool init;            /* the fault counts from the process start: gpuarr_init is part of it */
    bool (*fn)(void);
};

static const scenario scenarios[] = {
    {"init", BK_CUDA, "cuda:0", NULL, false, false, false, false, false, true, sc_upload},
    {"init", BK_OPENCL, "opencl:0", NULL, false, false, false, false, false, true, sc_upload},
    {"upload", BK_CUDA, "cuda:0", NULL, false, false, false, false, false, false, sc_upload},
    {"upload", BK_OPENCL, "opencl:0", NULL, false, false, false, false, false, false, sc_upload},
    {"upload-sticky", BK_CUDA, "cuda:0", NULL, false, false, false, false, true, false, sc_upload},
    {"staged-upload", BK_CUDA, "cuda:0", NULL, false, false, false, false, false, false, sc_staged},
    {"staged-upload", BK_OPENCL, "opencl:0", NULL, true, false, false, false, false, false, sc_staged},
    {"download-cast", BK_CUDA, "cuda:0", NULL, false, false, true, false, false, false, sc_download_cast},
    {"download-cast", BK_OPENCL, "opencl:0", NULL, true, false, true, false, false, false, sc_download_cast},
    {"peer-copy", BK_CUDA, "cuda:0", "cuda:1", false, false, true, false, false, false, sc_transfer},
    {"cross-backend", BK_CUDA, "cuda:0", "opencl:0", false, false, true, false, false, false, sc_transfer},
    {"cross-backend", BK_OPENCL, "opencl:0", "cuda:0", true, false, true, false, false, false, sc_transfer},
    {"async-two-streams", BK_CUDA, "cuda:0", NULL, false, false, true, true, false, false, sc_async},
    {"async-two-streams", BK_OPENCL, "opencl:0", NULL, true, false, true, true, false, false, sc_async},
    {"async-sticky", BK_CUDA, "cuda:0", NULL, false, false, true, true, true, false, sc_async},
    {"pool-oom-ladder", BK_CUDA, "cuda:0", NULL, false, false, false, false, false, false, sc_pool},
    {"pool-oom-ladder", BK_OPENCL, "opencl:0", NULL, true, false, false, false, false, false, sc_pool},
    {"kernel-build", BK_CUDA, "cuda:0", NULL, false, true, false, false, false, false, sc_kernel_build},
    {"kernel-build", BK_OPENCL, "opencl:0", NULL, false, true, false, false, false, false, sc_kernel_build},
    {"issue-12-calls", BK_CUDA, "cuda:0", NULL, false, false, true, false, false, false, sc_mutable},
    {"issue-12-calls", BK_OPENCL, "opencl:0", NULL, true, false, true, false, false, false, sc_mutable},
};
#define NSCENARIOS (int)(sizeof scenarios / sizeof scenarios[0])

static void pool_numbers(gpuarr_device d, uint64_t *alloc, uint64_t *pinned) {
    gpuarr_pool_stats st;
    *alloc = *pinned = UINT64_MAX;
    if (gpuarr_pool_get_stats(d, &st) == GPUARR_OK) *alloc = st.allocated_bytes;
    if (gpuarr_pool_get_pinned_stats(d, &st) == GPUARR_OK) *pinned = st.allocated_bytes;
}

/* A fresh small round trip on d: "" if it worked, else the error. */
static const char *round_trip(gpuarr_device d) {
    static char why[512];
    float in[64], out[64];
    for (int i = 0; i < 64; i++) in[i] = (float)i * 1.5f;
    int64_t shape[1] = {64};
    gpuarr_array x = SENTINEL;
    gpuarr_result r = gpuarr_from_host_as(d, GPUARR_F32, in, 1, shape, &x);
    if (r != GPUARR_OK) {
        snprintf(why, sizeof why, "%s", gpuarr_last_error());
        if (x.id != SENTINEL.id) failf("the round trip's gpuarr_from_host set its out handle on an error");
        return why;
    }
    r = gpuarr_to_host_as(x, GPUARR_F32, out, 64);
    if (r != GPUARR_OK) snprintf(why, sizeof why, "%s", gpuarr_last_error());
    gpuarr_release(x);
    if (r != GPUARR_OK) return why;
    if (memcmp(in, out, sizeof in) != 0) return "the round trip read back wrong values";
    return "";
}

/* Writes one line to fd: "<hit call> <entry> <outcome> <calls made>\t<failure>\t<error>" (calls made:
   by the scenario proper, the fault armed; "none" as the outcome ends the walk: N passed them). */
static void child(const scenario *sc, unsigned long long nth, int fd) {
    bool lost = false;
    unsigned long long calls = 0, left_behind = 0; /* the scenario's calls: how far past them a run's N was */
    char cache[64] = "";
    memset(&R, 0, sizeof R);
    R.backend = sc->backend;
    R.sticky = sc->sticky;
    if (sc->backend == BK_CUDA) {
        snprintf(R.code_text, sizeof R.code_text, "%s", sc->sticky ? "CUDA_ERROR_ILLEGAL_ADDRESS" : "CUDA_ERROR_UNKNOWN");
        R.code_number = sc->sticky ? 700 : 999;
    } else {
        snprintf(R.code_text, sizeof R.code_text, "CL_OUT_OF_RESOURCES");
        R.code_number = (unsigned)-5;
    }
    char spec[96];
    snprintf(spec, sizeof spec, "nth=%llu:%s", nth, R.code_text);
    if (sc->discrete) setenv("GPUARR_OPENCL_UNIFIED", "off", 1);
    if (sc->fresh_cache) {
        snprintf(cache, sizeof cache, "/tmp/gpuarr-faults-XXXXXX");
        if (!mkdtemp(cache)) exit(4);
        setenv("GPUARR_CACHE_DIR", cache, 1);
    }
    if (sc->init) setenv(sc->backend == BK_CUDA ? "FAKE_CUDA_FAIL" : "FAULT_OPENCL_FAIL", spec, 1);
    char devices[64];
    snprintf(devices, sizeof devices, "host,%s%s%s", sc->a, sc->b ? "," : "", sc->b ? sc->b : "");
    setenv("GPUARR_DEVICES", devices, 1);
    alarm(120);

    gpuarr_result r = gpuarr_init(NULL);
    if (sc->init) {
        R.armed = fault_lib_get(sc->backend, &R.lib); /* the library was loaded by init, or not */
        if (!R.armed) { /* init failed before or at loading it: impossible with dlopen, but say so */
            dprintf(fd, "0 - none 0\t%s\t\n", r == GPUARR_OK ? "" : "gpuarr_init failed without loading the driver");
            exit(0);
        }
    }
    if (r != GPUARR_OK) {
        fault_poll();
        if (!sc->init || !R.hit_call) failf("gpuarr_init: %s", gpuarr_last_error());
        else if (!names_fault(gpuarr_last_error())) failf("gpuarr_init: the error does not name %s: %s", R.hit_name, gpuarr_last_error());
        R.errored = true;
        snprintf(R.error, sizeof R.error, "%s", gpuarr_last_error());
        goto report;
    }
    if (!sc->init && !fault_lib_get(sc->backend, &R.lib)) {
        gpuarr_device d;
        gpuarr_device_find(sc->a, &d); /* loads the backend */
        if (!fault_lib_get(sc->backend, &R.lib)) {
            fprintf(stderr, "fault_matrix: the %s library is not the fault one (GPUARR_CUDA_LIBRARY / GPUARR_OPENCL_LIBRARY)\n",
                    backend_names[sc->backend]);
            exit(3);
        }
    }
    if (sc->init) {
        /* gpuarr_init may have left the device out (a warning names the call): then it is gone */
        gpuarr_device d;
        if (gpuarr_device_find(sc->a, &d) != GPUARR_OK) {
            fault_poll();
            if (!R.hit_call) failf("%s is missing with no fault injected: %s", sc->a, gpuarr_last_error());
            R.errored = true;
            snprintf(R.error, sizeof R.error, "%s left out by gpuarr_init", sc->a);
            goto shutdown;
        }
    }
    memset(&E, 0, sizeof E);
    E.a = dev_of(sc->a);
    if (sc->b) E.b = dev_of(sc->b);
    R.devs[R.ndevs++] = E.a;
    if (sc->b) R.devs[R.ndevs++] = E.b;
    for (int i = 0; i < R.ndevs; i++) pool_numbers(R.devs[i], &R.allocated[i], &R.pinned[i]);
    E.n = N_SMALL;
    E.big_n = N_BIG;
    E.src = host_source(E.n * 4, 7);
    E.big = host_source(E.big_n * 4, 11);
    bool setup_ok = true;
    if (sc->warm || sc->fn != sc_upload) {
        int64_t shape[1] = {(int64_t)E.n};
        setup_ok = gpuarr_from_host_as(E.a, GPUARR_F32, E.src, 1, shape, &E.ready) == GPUARR_OK;
        if (setup_ok && sc->warm) {
            double tmp[4];
            gpuarr_array h;
            setup_ok = gpuarr_convert(E.ready, E.a, GPUARR_F16, &h) == GPUARR_OK && gpuarr_to_host_as(h, GPUARR_F64, tmp, 4) != GPUARR_ERROR_BACKEND;
            if (h.id) gpuarr_release(h);
        }
    }
    if (setup_ok && sc->streams)
        setup_ok = gpuarr_stream_create(E.a, 0, &E.s1) == GPUARR_OK && gpuarr_stream_create(E.a, 0, &E.s2) == GPUARR_OK;
    if (!setup_ok) {
        fault_poll();
        if (!sc->init || !R.hit_call) failf("setup failed: %s", gpuarr_last_error());
        R.errored = true;
        snprintf(R.error, sizeof R.error, "%s", gpuarr_last_error());
    } else {
        if (!sc->init && R.lib.set(spec) != 0) exit(5);
        R.armed = true;
        sc->fn();
        fault_poll();
        calls = R.lib.calls();
        R.lib.set(NULL); /* disarmed: the checks below run fault-free */
    }
    /* cleanup and the checks */
    release_all();
    if (E.ready.id) gpuarr_release(E.ready);
    if (E.s1.id) gpuarr_stream_sync(E.s1), gpuarr_stream_destroy(E.s1);
    if (E.s2.id) gpuarr_stream_sync(E.s2), gpuarr_stream_destroy(E.s2);
    check_sources();
    for (int i = 0; i < R.ndevs; i++) {
        const char *why = round_trip(R.devs[i]);
        if (why[0]) {
            if (sc->sticky && R.hit_call && strstr(why, "CUDA_ERROR_ILLEGAL_ADDRESS") && i == 0) lost = true;
            else failf("the device does not work after the fault: a round trip on %s: %s", sc->a, why);
        } else if (sc->sticky && R.hit_call && i == 0) {
            /* fine: the fault landed where no context was current (cuDevice*, cuCtx*) */
        }
    }
    if (!lost) {
        gpuarr_device_sync(E.a);
        for (int i = 0; i < R.ndevs; i++) {
            uint64_t a, p;
            pool_numbers(R.devs[i], &a, &p);
            if (a != R.allocated[i] || p != R.pinned[i])
                failf("the pools do not balance on device %d: allocated %llu (was %llu), pinned %llu (was %llu)", i,
                      (unsigned long long)a, (unsigned long long)R.allocated[i], (unsigned long long)p, (unsigned long long)R.pinned[i]);
        }
    }
    if (R.hit_call && !R.errored && !R.failure[0]) snprintf(R.error, sizeof R.error, "recovered");
shutdown:
    gpuarr_shutdown();
    if (sc->backend == BK_CUDA && !lost) { /* the driver objects left behind (see the report) */
        unsigned long long (*live)(void) = NULL;
        void *h = dlopen(getenv("GPUARR_CUDA_LIBRARY"), RTLD_NOW | RTLD_NOLOAD);
        if (h) *(void **)&live = dlsym(h, "fake_cuda_live_objects");
        if (live) left_behind = live();
        if (h) dlclose(h);
    }
    if (cache[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", cache);
        if (system(cmd) != 0) failf("cannot remove %s", cache);
    }
report:
    fault_poll();
    {
        const char *outcome = !R.hit_call ? "none" : R.errored ? (lost ? "lost" : "reported") : "recovered";
        for (char *c = R.error; *c; c++)
            if (*c == '\t' || *c == '\n') *c = ' ';
        for (char *c = R.failure; *c; c++)
            if (*c == '\t' || *c == '\n') *c = ' ';
        dprintf(fd, "%llu %s %s %llu %llu\t%s\t%s\n", R.hit_call, R.hit_name[0] ? R.hit_name : "-", outcome, calls, left_behind, R.failure,
                R.error);
    }
    exit(0);
}

/* ---------------------------------------------------------------------------------------------
 * The walk (in the parent, which never starts gpuarr)
 * ------------------------------------------------------------------------------------------- */
typedef struct site {
    char entry[64];
    const char *scenario;
    int backend;
} site;
static site sites[2048];
static int nsites;

static void add_site(const char *entry, const char *scen, int backend) {
    for (int i = 0; i < nsites; i++)
        if (sites[i].backend == backend && sites[i].scenario == scen && strcmp(sites[i].entry, entry) == 0) return;
    if (nsites < 2048) {
        snprintf(sites[nsites].entry, sizeof sites[nsites].entry, "%s", entry);
        sites[nsites].scenario = scen;
        sites[nsites].backend = backend;
        nsites++;
    }
}

static bool sanitizer_report(const char *log) {
    FILE *f = fopen(log, "r");
    if (!f) return false;
    char line[1024];
    bool found = false;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, "Sanitizer") || strstr(line, "runtime error") || strstr(line, "fake-cuda: cuMemFree");
    fclose(f);
    return found;
}

static void print_log(const char *log) {
    FILE *f = fopen(log, "r");
    if (!f) return;
    char line[1024];
    int lines = 0;
    while (fgets(line, sizeof line, f) && lines++ < 60) fprintf(stderr, "    | %s", line);
    fclose(f);
}

int main(int argc, char **argv) {
    const char *only = NULL;
    unsigned long long every = 1, cap = 600, from = 1;
    bool verbose = false;
    int opt;
    while ((opt = getopt(argc, argv, "s:e:c:n:v")) != -1) {
        switch (opt) {
        case 's': only = optarg; break;
        case 'e': every = strtoull(optarg, NULL, 10); break;
        case 'c': cap = strtoull(optarg, NULL, 10); break;
        case 'n': from = cap = strtoull(optarg, NULL, 10); break; /* that N alone, its output kept */
        case 'v': verbose = true; break;
        default: fprintf(stderr, "usage: %s [-s scenario[,..]] [-e every] [-c cap] [-n N] [-v]\n", argv[0]); return 2;
        }
    }
    if (every == 0) every = 1;
    if (!getenv("GPUARR_CUDA_LIBRARY") || !getenv("GPUARR_OPENCL_LIBRARY")) {
        fprintf(stderr, "fault_matrix: set GPUARR_CUDA_LIBRARY (tests/fake_cuda) and GPUARR_OPENCL_LIBRARY (tests/fault_opencl)\n");
        return 2;
    }
    char log[64];
    snprintf(log, sizeof log, "/tmp/gpuarr-faults-%d.log", (int)getpid());
    int runs = 0, failures = 0, capped = 0, leaky_runs = 0, nleaky = 0;
    static char leaky[64][160];
    int outcomes[2][4] = {{0}}; /* reported, recovered, lost, walks */
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int s = 0; s < NSCENARIOS; s++) {
        const scenario *sc = &scenarios[s];
        if (only) {
            char want[64];
            snprintf(want, sizeof want, "%s/%s", sc->name, backend_names[sc->backend]);
            bool match = false;
            for (const char *p = only; *p;) {
                size_t n = strcspn(p, ",");
                if ((n == strlen(sc->name) && strncmp(p, sc->name, n) == 0) || (n == strlen(want) && strncmp(p, want, n) == 0)) match = true;
                p += n;
                if (*p) p++;
            }
            if (!match) continue;
        }
        unsigned long long n, first_hit = 0, last_hit = 0, reported = 0, recovered = 0, lost = 0;
        bool done = false;
        int scenario_failures = 0;
        for (n = from; n <= cap && !done; n++) {
            /* every Kth N, but always the first few and the walk to the end */
            if (every > 1 && n > 3 && n % every != 0) continue;
            int fds[2];
            if (pipe(fds) != 0) return 2;
            fflush(NULL);
            pid_t pid = fork();
            if (pid == 0) {
                close(fds[0]);
                int lf = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
                if (lf >= 0) {
                    dup2(lf, 1);
                    dup2(lf, 2);
                    close(lf);
                }
                child(sc, n, fds[1]);
            }
            close(fds[1]);
            char line[2048] = "";
            size_t got = 0;
            ssize_t k;
            while ((k = read(fds[0], line + got, sizeof line - 1 - got)) > 0) got += (size_t)k;
            line[got] = 0;
            close(fds[0]);
            int status = 0;
            waitpid(pid, &status, 0);
            runs++;
            unsigned long long hit = 0, made = 0, left = 0;
            char entry[64] = "", outcome[16] = "";
            char *tab1 = strchr(line, '\t'), *tab2 = tab1 ? strchr(tab1 + 1, '\t') : NULL;
            char failure[1024] = "", error[1024] = "";
            if (tab1 && tab2) {
                *tab1 = *tab2 = 0;
                sscanf(line, "%llu %63s %15s %llu %llu", &hit, entry, outcome, &made, &left);
                snprintf(failure, sizeof failure, "%s", tab1 + 1);
                snprintf(error, sizeof error, "%s", tab2 + 1);
                char *nl = strchr(error, '\n');
                if (nl) *nl = 0;
            }
            const char *bad = NULL;
            char why[1200];
            if (WIFSIGNALED(status)) {
                snprintf(why, sizeof why, "killed by signal %d%s", WTERMSIG(status), WTERMSIG(status) == SIGALRM ? " (a hang)" : "");
                bad = why;
            } else if (WEXITSTATUS(status) != 0) {
                snprintf(why, sizeof why, "exit status %d", WEXITSTATUS(status));
                bad = why;
            } else if (sanitizer_report(log)) {
                bad = "a sanitizer report";
            } else if (!tab2) {
                bad = "no report from the run";
            } else if (failure[0]) {
                bad = failure;
            } else if (strcmp(outcome, "none") == 0 && made >= n) {
                snprintf(why, sizeof why, "call %llu was not failed, though the run made %llu calls", n, made);
                bad = why;
            }
            if (bad) {
                failures++;
                scenario_failures++;
                fprintf(stderr, "FAIL %s/%s N=%llu (fault at %s, call %llu): %s\n", sc->name, backend_names[sc->backend], n,
                        entry[0] ? entry : "?", hit, bad);
                if (!tab2 || !failure[0] || from == cap) print_log(log);
            } else if (verbose) {
                printf("  %s/%s N=%llu: %s %s (%llu calls): %s\n", sc->name, backend_names[sc->backend], n, entry, outcome, made, error);
            }
            if (left) {
                leaky_runs++;
                char where[160];
                snprintf(where, sizeof where, "%s (%s)", entry, sc->name);
                bool seen = false;
                for (int i = 0; i < nleaky; i++) seen = seen || strcmp(leaky[i], where) == 0;
                if (!seen && nleaky < 64) snprintf(leaky[nleaky++], sizeof leaky[0], "%s", where);
                if (verbose) printf("    %llu driver objects left behind\n", left);
            }
            if (strcmp(outcome, "none") == 0) {
                done = true;
                continue;
            }
            if (hit) {
                if (!first_hit) first_hit = n;
                last_hit = n;
                add_site(entry, sc->name, (int)sc->backend);
                if (strcmp(outcome, "recovered") == 0) recovered++;
                else if (strcmp(outcome, "lost") == 0) lost++;
                else reported++;
            }
            if (scenario_failures >= 25) {
                fprintf(stderr, "  (%s/%s: 25 failures, walk stopped)\n", sc->name, backend_names[sc->backend]);
                done = true;
            }
        }
        if (!done) capped++;
        outcomes[sc->backend][0] += (int)reported;
        outcomes[sc->backend][1] += (int)recovered;
        outcomes[sc->backend][2] += (int)lost;
        outcomes[sc->backend][3]++;
        int here = 0;
        for (int i = 0; i < nsites; i++) here += sites[i].scenario == sc->name && sites[i].backend == (int)sc->backend;
        printf("%-18s %-6s N=%llu..%llu: %llu reported, %llu recovered, %d sites%s\n", sc->name, backend_names[sc->backend], first_hit,
               last_hit, reported, recovered, here, scenario_failures ? "  FAILURES" : "");
        if (!done) printf("    capped at N=%llu: the scenario has more calls than that\n", cap);
        if (lost) printf("    %llu runs lost the context (sticky error): later calls failed cleanly naming it\n", lost);
        fflush(stdout);
    }
    unlink(log);
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    for (int b = 0; b < 2; b++) {
        int count = 0, entries = 0;
        for (int i = 0; i < nsites; i++) {
            if (sites[i].backend != b) continue;
            count++;
            bool first = true;
            for (int j = 0; j < i; j++) first = first && !(sites[j].backend == b && strcmp(sites[j].entry, sites[i].entry) == 0);
            entries += first;
        }
        printf("fault sites, %s: %d (entry point x scenario), %d entry points; %d errors reported, %d recovered, %d contexts lost\n",
               backend_names[b], count, entries, outcomes[b][0], outcomes[b][1], outcomes[b][2]);
    }
    if (leaky_runs) {
        printf("driver objects left behind after gpuarr_shutdown (fake CUDA; not failures: a release the driver refused, or one gpuarr skipped) in %d runs, faults at:",
               leaky_runs);
        for (int i = 0; i < nleaky; i++) printf("%s %s", i ? "," : "", leaky[i]);
        printf("\n");
    }
    printf("fault matrix: %d runs, %d failed, %d walks capped, %.0f s\n", runs, failures, capped,
           (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
    return failures ? 1 : 0;
}
