/*
 * fuzz_api.c -- the API fuzz target: an op-code interpreter over a small table of live
 * handles (arrays and views, streams, events, scopes), calling every public function of gpuarr.h
 * with arguments taken from the input, on the host, PoCL's opencl:0/opencl:1 and the fake CUDA
 * driver's cuda:0/cuda:1 (telemetry through the fake NVML), while allocations fail as the input says (gpuarr_pool_inject_faults).
 *
 * What it asserts (abort() on a violation, so that the fuzzer reports it):
 *   - a failing call returns a known negative gpuarr_result and gpuarr_last_error() names the
 *     function ("gpuarr_<name>: ..."); an out handle is left as it was;
 *   - cheap results are right: a write then a read of the same elements in the array's dtype
 *     gives the bytes back, from_host/to_host round-trips, a same-dtype copy or convert gives the
 *     source's bytes, an integer fill sets every element;
 *   - every input ends clean: each handle it made is released, streams and events destroyed,
 *     scopes left, OOM handlers removed, faults and limits reset; then every pool (and pinned
 *     pool) has allocated_bytes 0 and, after gpuarr_pool_trim, reserved_bytes 0, and every
 *     wrapped host buffer's release callback has run.
 * gpuarr_init runs once per process (PoCL's start is slow); an op shuts the library down and
 * starts it again with another desc now and then. tests/fuzz/soak.c runs the same interpreter
 * from 8 threads (fz_soak = 1): handle tables are per thread, and the process-wide ops (init,
 * shutdown, set_limit) and the per-input pool checks are left out there. DLPack export/import
 * runs from op_misc (op_dlpack), with the Python capsule helpers (no-ops outside Python). Built
 * with FUZZ_MPI (where Open MPI is installed), op_mpi calls the gpuarr_mpi_* functions in a
 * one-rank MPI job started in fz_start: every transfer goes to this rank itself.
 *
 * Built with clang -fsanitize=fuzzer,address,undefined by `make fuzz`, and with gcc's ASan+UBSan
 * and tests/fuzz/standalone.c by `make fuzz-replay` (the committed corpus, tests/fuzz/corpus/api).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <time.h>

#ifdef FUZZ_MPI /* the Makefile's builds where Open MPI is installed: the MPI part too */
#include <mpi.h>
#define GPUARR_MPI 1
#if defined(__has_feature) /* clang */
#if __has_feature(address_sanitizer)
#define FZ_LSAN 1
#endif
#elif defined(__SANITIZE_ADDRESS__) /* gcc */
#define FZ_LSAN 1
#endif
#ifdef FZ_LSAN
#include <sanitizer/lsan_interface.h>
#endif
#endif
#include "gpuarr.h"
#include <tgmath.h> /* a file that defines kernels (op_kernel) */

#ifndef FUZZ_FAKE_CUDA
#define FUZZ_FAKE_CUDA "build/fake-cuda/libcuda.so.1"
#endif
#ifndef FUZZ_FAKE_NVML
#define FUZZ_FAKE_NVML "build/fake-nvml/libnvidia-ml.so.1"
#endif
#ifndef FUZZ_CACHE_DIR
#define FUZZ_CACHE_DIR "off"
#endif

#define FZ_ARRAYS 8
#define FZ_STREAMS 4
#define FZ_EVENTS 4
#define FZ_SCOPES 4
#define FZ_LEASES 4
#define FZ_MREQS 4 /* pending gpuarr_mpi requests */
#define FZ_ALIASES 16
#define FZ_STALE 8
#define FZ_DEVICES 5
#define FZ_EXPORTS 4 /* cl_mem from gpuarr_opencl_export_mem_raw, released later */
#define FZ_MAX_ELEMS 8192 /* 64 KiB of f64 */
#define FZ_MAX_OPS 96
#define FZ_SENTINEL 0xA5A5A5A5u

static int fz_soak; /* set by soak.c before its threads start */
static const char *const fz_specs[FZ_DEVICES] = {"host", "opencl:0", "opencl:1", "cuda:0", "cuda:1"};
static const gpuarr_desc *fz_default_desc(void);

static _Thread_local const uint8_t *fz_cur_data; /* the input running on this thread */
static _Thread_local size_t fz_cur_size;

static void fz_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fz_die(const char *fmt, ...) {
    const char *keep = getenv("FUZZ_API_CRASH_INPUT"); /* the soak's: libFuzzer keeps its own */
    if (keep && fz_cur_data) {
        FILE *f = fopen(keep, "wb");
        if (f) {
            fwrite(fz_cur_data, 1, fz_cur_size, f);
            fclose(f);
            fprintf(stderr, "fuzz_api: the input (%zu bytes) is in %s\n", fz_cur_size, keep);
        }
    }
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fuzz_api: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    abort();
}

/* host buffers the interpreter owns: freed at the end of the input, after every device synced */
typedef struct fz_buf {
    struct fz_buf *next;
    size_t size;
    unsigned char bytes[];
} fz_buf;

typedef struct fz {
    const uint8_t *data;
    size_t size, pos;
    gpuarr_device dev[FZ_DEVICES];
    gpuarr_array arr[FZ_ARRAYS]; /* each non-zero slot holds one reference */
    gpuarr_array keep[FZ_ARRAYS]; /* arrays whose memory a wrapper uses (cuda_wrap_ptr, opencl_wrap_mem_raw) */
    int nkeep;
    gpuarr_stream st[FZ_STREAMS];
    bool st_pinned[FZ_STREAMS]; /* a wrapped stream (cuda_wrap_stream) uses its native stream */
    bool st_wrapped[FZ_STREAMS];
    gpuarr_event ev[FZ_EVENTS];
    gpuarr_scope scope[FZ_SCOPES];
    int nscope;
    gpuarr_lease lease[FZ_LEASES]; /* live leases; released at the end of the input */
    int slots_saved[FZ_DEVICES];   /* a device's slots before this input changed them, 0 = unchanged */
    uint32_t stale[FZ_STALE]; /* ids released or destroyed, of any kind */
    int nstale;
    int handlers; /* OOM handlers added (fz_oom with user data z + k) */
    bool faults, limits, reinit;
    bool tracing; /* this input started a trace (gpuarr_trace_start): stopped at its end */
    uint32_t mreq[FZ_MREQS]; /* pending gpuarr_mpi requests (ids), waited for at the end */
    uint32_t mstale[FZ_STALE]; /* requests waited for: their own list (their ids may equal array ids) */
    int nmstale;
    uint32_t alias[FZ_ALIASES]; /* arrays sharing memory with another (DLPack imports, wrappers) */
    int nalias;
    gpuarr_device adev;      /* a device adopted by gpuarr_opencl_adopt_raw, removed by the end of the input */
    uint32_t adev_removed;   /* one this input removed: every call on it must fail */
    void *adev_ctx, *adev_id; /* the cl_context and cl_device_id it was adopted with */
    void *exp[FZ_EXPORTS];   /* exported cl_mem, the fuzzer's to release */
    int nexp;
    fz_buf *bufs;
} fz;

static long fz_wraps_alive; /* wrapped host buffers whose release callback has not run */

/* ---- reading the input ---- */
static uint8_t u8(fz *z) { return z->pos < z->size ? z->data[z->pos++] : 0; }
/* Every read is its own statement, and no call takes two of them as arguments: the order in
   which a compiler evaluates operands or arguments is unspecified (gcc and clang differ), and an
   input must mean the same in the clang fuzzer and the gcc replay. */
static uint16_t u16(fz *z) {
    uint16_t lo = u8(z);
    return (uint16_t)(lo | (u8(z) << 8));
}
static uint32_t u32(fz *z) {
    uint32_t lo = u16(z);
    return lo | ((uint32_t)u16(z) << 16);
}
static uint64_t u64(fz *z) {
    uint64_t lo = u32(z);
    return lo | ((uint64_t)u32(z) << 32);
}

static void *fz_alloc(fz *z, size_t size) {
    fz_buf *b = (fz_buf *)malloc(sizeof *b + size + 1);
    if (!b) fz_die("out of host memory");
    b->next = z->bufs;
    b->size = size;
    z->bufs = b;
    uint32_t x = 0x9e3779b9u * (1u + u8(z)); /* one input byte seeds the contents */
    for (size_t i = 0; i < size; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        b->bytes[i] = (unsigned char)x;
    }
    return b->bytes;
}

/* ---- results ---- */
static void fz_ok_or_error(gpuarr_result r, const char *api) {
    if (r == GPUARR_OK) return;
    if ((int)r > 0 || (int)r <= -GPUARR_RESULT_COUNT) fz_die("%s returned %d, not a gpuarr_result", api, (int)r);
    const char *m = gpuarr_last_error();
    size_t n = strlen(api);
    if (!m || strncmp(m, "gpuarr_", 7) != 0) fz_die("%s failed (%s) with the message \"%s\"", api, gpuarr_result_name(r), m ? m : "(null)");
    if (strncmp(m, api, n) != 0 || (m[n] != ':' && m[n] != ' '))
        fz_die("%s failed (%s) with a message naming another function: \"%s\"", api, gpuarr_result_name(r), m);
}
static int fz_trace; /* FUZZ_API_TRACE=1: each call and its result on stderr */
static unsigned long long fz_mpi_calls[2]; /* gpuarr_mpi_* calls made, and those that succeeded (the soak says) */
static gpuarr_result fz_call(gpuarr_result r, const char *api) {
    if (strncmp(api, "gpuarr_mpi_", 11) == 0) {
        __atomic_add_fetch(&fz_mpi_calls[0], 1, __ATOMIC_RELAXED);
        if (r == GPUARR_OK) __atomic_add_fetch(&fz_mpi_calls[1], 1, __ATOMIC_RELAXED);
    }
    if (fz_trace) fprintf(stderr, "  %s -> %s%s%s\n", api, gpuarr_result_name(r), r ? ": " : "", r ? gpuarr_last_error() : "");
    fz_ok_or_error(r, api);
    return r;
}
#define FZ_CALL(r, name, call) ((r) = fz_call((call), (name)))
#define FZ_KEEP_OUT(r, name, h)                                                                 \
    do {                                                                                        \
        if ((r) != GPUARR_OK && (h).id != FZ_SENTINEL) fz_die("%s failed but wrote its out handle", name); \
    } while (0)

/* ---- choosing handles: live, empty, stale, forged ---- */
static uint32_t fz_forged(fz *z, uint32_t near) {
    switch (u8(z) & 3) {
    case 0: return u32(z);
    case 1: return near + 1;
    case 2: return near ^ 1u;
    default: return near ^ 0x10000u;
    }
}
static uint32_t fz_pick_id(fz *z, const uint32_t *ids, int n) {
    uint8_t b = u8(z);
    if (b < 0xe0) return ids[b % n];
    if (b < 0xf0) return z->nstale ? z->stale[b % z->nstale] : 0;
    return fz_forged(z, ids[b % n]);
}
static gpuarr_array fz_arr(fz *z) {
    uint32_t ids[FZ_ARRAYS];
    for (int i = 0; i < FZ_ARRAYS; i++) ids[i] = z->arr[i].id;
    gpuarr_array a = {fz_pick_id(z, ids, FZ_ARRAYS)};
    return a;
}
static gpuarr_stream fz_stream(fz *z) {
    uint32_t ids[FZ_STREAMS];
    for (int i = 0; i < FZ_STREAMS; i++) ids[i] = z->st[i].id;
    gpuarr_stream s = {fz_pick_id(z, ids, FZ_STREAMS)};
    if ((u8(z) & 3) == 0) s.id = 0; /* the current or default stream */
    return s;
}
static gpuarr_event fz_event(fz *z) {
    uint32_t ids[FZ_EVENTS];
    for (int i = 0; i < FZ_EVENTS; i++) ids[i] = z->ev[i].id;
    gpuarr_event e = {fz_pick_id(z, ids, FZ_EVENTS)};
    return e;
}
static gpuarr_device fz_dev(fz *z) {
    uint8_t b = u8(z);
    if (b >= 0xe0 && b < 0xf0 && (z->adev.id || z->adev_removed)) { /* the adopted device, or the one removed */
        gpuarr_device d = {z->adev.id ? z->adev.id : z->adev_removed};
        return d;
    }
    if (b < 0xf0) return z->dev[b % FZ_DEVICES];
    gpuarr_device d = {b < 0xf8 ? 0u : fz_forged(z, z->dev[0].id)};
    return d;
}
static gpuarr_dtype fz_dtype(fz *z) {
    uint8_t b = u8(z);
    if (b < 0xf0) return (gpuarr_dtype)(1 + b % (GPUARR_DTYPE_COUNT - 1));
    return (gpuarr_dtype)(b & 1 ? 0 : (int)(b - 0xf0 + GPUARR_DTYPE_COUNT)); /* 0 = keep, or not a dtype */
}
static void fz_stale_add(fz *z, uint32_t id) {
    if (!id) return;
    if (z->nstale < FZ_STALE) z->stale[z->nstale++] = id;
    else z->stale[id % FZ_STALE] = id;
}

/* A shape of at most FZ_MAX_ELEMS elements, or (rarely) a hostile one that must be refused. */
static int fz_shape(fz *z, int64_t *shape, bool hostile_ok) {
    uint8_t b = u8(z);
    int ndim = b & 3;
    if ((b & 0x30) == 0x30) ndim = (b >> 2 & 3) + 3; /* 3..6 */
    int64_t count = 1;
    for (int i = 0; i < ndim; i++) {
        int64_t v = u8(z) % 24;
        if (count * (v ? v : 1) > FZ_MAX_ELEMS) v = 1;
        shape[i] = v;
        count *= v ? v : 1;
    }
    if (hostile_ok && (b & 0xc0) == 0xc0) {
        static const int64_t bad[] = {-1, INT64_MAX, INT64_MIN, (int64_t)1 << 40, (int64_t)1 << 62, 3};
        int which = u8(z);
        if (ndim == 0) ndim = 1;
        shape[which % ndim] = bad[(which >> 4) % 6];
        if ((which >> 4) % 6 == 5) ndim = (which & 1) ? 9 : -1; /* an ndim out of range */
    }
    return ndim;
}
/* the product of the shape; -1 when it overflows (an empty array may have huge other dims) */
static int64_t fz_count(int ndim, const int64_t *shape) {
    int64_t c = 1;
    bool over = false;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == 0) return 0;
        over |= __builtin_mul_overflow(c, shape[i], &c);
    }
    return over ? -1 : c;
}
static bool fz_shape_sane(int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > GPUARR_MAX_DIMS) return false;
    int64_t c = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || shape[i] > FZ_MAX_ELEMS) return false;
        c *= shape[i];
        if (c > FZ_MAX_ELEMS) return false;
    }
    return true;
}

/* Whether this thread still holds a reference to id: in an array slot (other than slot `except`)
   or in the keep list (a wrapped pointer's source). Only an id held nowhere is stale. */
static bool fz_held(const fz *z, uint32_t id, int except) {
    if (!id) return false;
    for (int k = 0; k < FZ_ARRAYS; k++)
        if (k != except && z->arr[k].id == id) return true;
    for (int k = 0; k < z->nkeep; k++)
        if (z->keep[k].id == id) return true;
    return false;
}

static int fz_free_slot(fz *z) {
    for (int i = 0; i < FZ_ARRAYS; i++)
        if (!z->arr[i].id) return i;
    return -1;
}
/* A new array: into a free slot, else released at once. */
static void fz_adopt(fz *z, gpuarr_array a) {
    int i = fz_free_slot(z);
    if (i >= 0) {
        z->arr[i] = a;
        return;
    }
    gpuarr_result r;
    FZ_CALL(r, "gpuarr_release", gpuarr_release(a));
    if (r != GPUARR_OK) fz_die("gpuarr_release of a new array failed: %s", gpuarr_last_error());
    if (!fz_held(z, a.id, -1)) fz_stale_add(z, a.id); /* a retained id may still be held */
}

/* Arrays that share memory with another that is not a view of it (a wrapper of its buffer, a
   DLPack import of its export): the MPI op checks no transfer between such. A full list makes
   every array count as one. */
static void fz_alias_add(fz *z, uint32_t a, uint32_t b) {
    uint32_t ids[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        if (z->nalias < FZ_ALIASES) z->alias[z->nalias] = ids[i];
        if (z->nalias <= FZ_ALIASES) z->nalias++;
    }
}
static bool fz_aliased(const fz *z, uint32_t id) {
    if (z->nalias > FZ_ALIASES) return true;
    for (int i = 0; i < z->nalias; i++)
        if (z->alias[i] == id) return true;
    return false;
}

static bool fz_info(gpuarr_array a, gpuarr_array_info *info) { return gpuarr_array_get_info(a, info) == GPUARR_OK; }

/* "opencl:0, a view, pinned": where an array lives, for messages */
static const char *fz_where(const gpuarr_array_info *info, char *buf, size_t len) {
    gpuarr_device_info di;
    memset(&di, 0, sizeof di);
    (void)gpuarr_device_get_info(info->device, &di);
    snprintf(buf, len, "%s %s, %lld elements%s%s%s%s", gpuarr_dtype_name(info->dtype), di.spec, (long long)info->count,
             info->is_view ? ", a view" : "", info->pinned ? ", pinned" : "", info->host_fallback ? ", a host fallback" : "",
             info->wrapped ? ", wrapped" : "");
    return buf;
}

/* the array's elements in its own dtype, into a new buffer (NULL when the read fails) */
static unsigned char *fz_read_all(fz *z, gpuarr_array a, const gpuarr_array_info *info) {
    unsigned char *buf = (unsigned char *)fz_alloc(z, info->nbytes);
    gpuarr_result r;
    if (FZ_CALL(r, "gpuarr_read", gpuarr_read(a, 0, info->count, GPUARR_DTYPE_INVALID, buf)) != GPUARR_OK) return NULL;
    return buf;
}

static bool fz_oom(gpuarr_device d, uint64_t requested, void *user) {
    (void)d;
    (void)requested;
    return ((uintptr_t)user & 1u) != 0; /* odd: "retry" */
}
static void fz_wrap_release(void *data, void *user) {
    if (data != user) fz_die("a release callback got %p, not the wrapped %p", data, user);
    free(data);
    __atomic_fetch_sub(&fz_wraps_alive, 1, __ATOMIC_SEQ_CST);
}

/* ---- the ops ---- */
static void op_create(fz *z, int kind) {
    gpuarr_device d = fz_dev(z);
    gpuarr_dtype t = fz_dtype(z);
    int64_t shape[GPUARR_MAX_DIMS + 1] = {0};
    int ndim = fz_shape(z, shape, kind != 2 && kind != 3);
    gpuarr_array out = {FZ_SENTINEL};
    gpuarr_result r;
    const char *name = "";
    void *host = NULL;
    size_t itemsize = gpuarr_dtype_size(t) ? gpuarr_dtype_size(t) : 1;
    bool sane = fz_shape_sane(ndim, shape);
    size_t bytes = sane ? (size_t)fz_count(ndim, shape) * itemsize : 16;
    switch (kind) {
    case 0: name = "gpuarr_empty"; r = gpuarr_empty(d, t, ndim, (u8(z) & 15) ? shape : NULL, &out); break;
    case 1: name = "gpuarr_zeros"; r = gpuarr_zeros(d, t, ndim, shape, &out); break;
    case 2:
        host = fz_alloc(z, bytes);
        if (u8(z) & 1) {
            name = "gpuarr_from_host_as";
            r = gpuarr_from_host_as(d, t, host, ndim, shape, &out);
        } else if (t == GPUARR_F32) {
            name = "gpuarr_from_host";
            r = gpuarr_from_host(d, (const float *)host, ndim, shape, &out);
        } else if (t == GPUARR_I64) {
            name = "gpuarr_from_host_i64";
            r = gpuarr_from_host_i64(d, (const int64_t *)host, ndim, shape, &out);
        } else if (t == GPUARR_U64) {
            name = "gpuarr_from_host_u64";
            r = gpuarr_from_host_u64(d, (const uint64_t *)host, ndim, shape, &out);
        } else if (t == GPUARR_F16) {
            name = "gpuarr_from_host";
            r = gpuarr_from_host(d, (const gpuarr_f16 *)host, ndim, shape, &out);
        } else {
            name = "gpuarr__from_host_named";
            r = gpuarr__from_host_named("gpuarr__from_host_named", d, t, host, ndim, shape, &out);
        }
        break;
    case 3: {
        name = "gpuarr_wrap_host";
        uint8_t how = u8(z);
        void *mem = (how & 3) == 0 && bytes == 0 ? NULL : malloc(bytes ? bytes : 1);
        unsigned char *p = (unsigned char *)mem;
        if ((how & 12) == 12 && p && itemsize > 1) p += 1; /* misaligned: must be refused */
        __atomic_fetch_add(&fz_wraps_alive, 1, __ATOMIC_SEQ_CST);
        r = gpuarr_wrap_host(p, t, ndim, shape, (how & 16) ? NULL : fz_wrap_release, mem, &out);
        bool released_by_lib = r == GPUARR_OK && !(how & 16);
        if (!released_by_lib) __atomic_fetch_sub(&fz_wraps_alive, 1, __ATOMIC_SEQ_CST);
        if (r == GPUARR_OK && (how & 16)) {
            /* no callback: the memory must outlive the array; keep it in a buffer of ours */
            fz_ok_or_error(r, name);
            gpuarr_result rr;
            FZ_CALL(rr, "gpuarr_release", gpuarr_release(out));
            if (rr != GPUARR_OK) fz_die("gpuarr_release of a wrapped array failed");
            fz_stale_add(z, out.id);
            free(mem);
            return;
        }
        if (r != GPUARR_OK) free(mem);
        break;
    }
    default: name = "gpuarr_empty_pinned"; r = gpuarr_empty_pinned(d, t, ndim, shape, &out); break;
    }
    if (fz_trace) fprintf(stderr, "  %s(dev 0x%x, %s, ndim %d, count %lld) = 0x%x\n", name, d.id, gpuarr_dtype_name(t), ndim,
                          (long long)fz_count(ndim, shape), out.id);
    fz_call(r, name);
    FZ_KEEP_OUT(r, name, out);
    if (r != GPUARR_OK) return;
    gpuarr_array_info info;
    if (!fz_info(out, &info)) fz_die("%s: a new array has no info: %s", name, gpuarr_last_error());
    if (kind == 2 && info.dtype == t && info.nbytes == bytes) { /* the round trip gives the bytes back */
        unsigned char *back = fz_read_all(z, out, &info);
        if (back && memcmp(back, host, bytes) != 0) {
            char w[160];
            size_t k = 0;
            while (back[k] == ((unsigned char *)host)[k]) k++;
            fz_die("%s then gpuarr_read: the bytes differ (%s; first at byte %zu of %zu)", name, fz_where(&info, w, sizeof w), k, bytes);
        }
        if (info.dtype == GPUARR_F32 && back) {
            float *f = (float *)fz_alloc(z, bytes);
            if (gpuarr_to_host(out, f, (size_t)info.count) == GPUARR_OK && memcmp(f, host, bytes) != 0)
                fz_die("gpuarr_to_host (f32): the bytes differ");
        }
    }
    if (kind == 1 && info.nbytes) { /* zeros: all zero */
        unsigned char *back = fz_read_all(z, out, &info);
        for (size_t i = 0; back && i < info.nbytes; i++)
            if (back[i]) {
                gpuarr_device_info di;
                memset(&di, 0, sizeof di);
                (void)gpuarr_device_get_info(info.device, &di);
                fz_die("gpuarr_zeros: byte %zu of %zu is %u (%s on %s%s%s)", i, info.nbytes, back[i], gpuarr_dtype_name(info.dtype), di.spec,
                       info.host_fallback ? ", a host fallback" : "", info.pinned ? ", pinned" : "");
            }
    }
    fz_adopt(z, out);
}

static void op_release(fz *z) {
    uint8_t b = u8(z);
    int i = b % FZ_ARRAYS;
    gpuarr_result r;
    if (b >= 0xc0) { /* a stale, forged or empty id: refused */
        gpuarr_array a = fz_arr(z);
        if (fz_held(z, a.id, -1)) return;
        if (FZ_CALL(r, "gpuarr_release", gpuarr_release(a)) == GPUARR_OK && a.id) fz_die("gpuarr_release of a non-live id 0x%x succeeded", a.id);
        return;
    }
    if (!z->arr[i].id) return;
    if (FZ_CALL(r, "gpuarr_release", gpuarr_release(z->arr[i])) != GPUARR_OK) fz_die("gpuarr_release of an owned array failed");
    if (!fz_held(z, z->arr[i].id, i)) fz_stale_add(z, z->arr[i].id);
    z->arr[i].id = 0;
}

static void op_retain(fz *z) {
    gpuarr_array a = fz_arr(z);
    gpuarr_result r;
    if (FZ_CALL(r, "gpuarr_retain", gpuarr_retain(a)) != GPUARR_OK) return;
    if (!fz_held(z, a.id, -1)) fz_die("gpuarr_retain of a non-live id 0x%x succeeded", a.id);
    fz_adopt(z, a);
}

static void op_info(fz *z) {
    gpuarr_array a = fz_arr(z);
    gpuarr_array_info info;
    gpuarr_result r;
    void *p = (void *)&z->pos;
    switch (u8(z) % 4) {
    case 0:
        FZ_CALL(r, "gpuarr_array_get_info", gpuarr_array_get_info(a, (u8(z) & 7) ? &info : NULL));
        if (r == GPUARR_OK && info.count != fz_count(info.ndim, info.shape) && info.ndim > 0) fz_die("array_get_info: count != product of shape");
        break;
    case 1:
        FZ_CALL(r, "gpuarr_host_data", gpuarr_host_data(a, &p));
        if (r != GPUARR_OK && p != (void *)&z->pos) fz_die("gpuarr_host_data failed but wrote *out");
        if (r == GPUARR_OK && fz_info(a, &info) && info.nbytes) {
            volatile unsigned char *c = (unsigned char *)p; /* readable, to the last byte */
            (void)c[0];
            (void)c[info.nbytes - 1];
        }
        break;
    case 2: {
        bool ready;
        FZ_CALL(r, "gpuarr_array_query", gpuarr_array_query(a, &ready));
        break;
    }
    default: FZ_CALL(r, "gpuarr_array_sync", gpuarr_array_sync(a)); break;
    }
}

static void op_convert(fz *z, int async) {
    gpuarr_array a = fz_arr(z), out = {FZ_SENTINEL};
    gpuarr_device d = fz_dev(z);
    gpuarr_dtype t = (u8(z) & 1) ? GPUARR_DTYPE_INVALID : fz_dtype(z);
    gpuarr_result r;
    const char *name = async ? "gpuarr_convert_async" : "gpuarr_convert";
    gpuarr_stream s = async ? fz_stream(z) : (gpuarr_stream){0};
    if (async) r = gpuarr_convert_async(a, d, t, s, &out);
    else r = gpuarr_convert(a, d, t, &out);
    if (fz_trace) fprintf(stderr, "  %s(0x%x, dev 0x%x, %s, stream 0x%x) = 0x%x\n", name, a.id, d.id, gpuarr_dtype_name(t), s.id, out.id);
    fz_call(r, name);
    FZ_KEEP_OUT(r, name, out);
    if (r != GPUARR_OK) return;
    gpuarr_array_info si, oi;
    if (!fz_info(out, &oi)) fz_die("%s: no info for the result", name);
    if (fz_info(a, &si) && si.dtype == oi.dtype && si.nbytes == oi.nbytes && (u8(z) & 1)) {
        unsigned char *x = fz_read_all(z, a, &si), *y = fz_read_all(z, out, &oi);
        if (x && y && memcmp(x, y, si.nbytes) != 0) {
            size_t k = 0;
            while (x[k] == y[k]) k++;
            gpuarr_device_info a_dev, o_dev;
            memset(&a_dev, 0, sizeof a_dev);
            memset(&o_dev, 0, sizeof o_dev);
            (void)gpuarr_device_get_info(si.device, &a_dev);
            (void)gpuarr_device_get_info(oi.device, &o_dev);
            fz_die("%s to the same dtype changed the bytes (%s, %s%s -> %s, %zu bytes, first difference at byte %zu)", name,
                   gpuarr_dtype_name(si.dtype), a_dev.spec, si.is_view ? " (a view)" : "", o_dev.spec, si.nbytes, k);
        }
    }
    fz_adopt(z, out);
}

static void op_copy(fz *z, int async) {
    gpuarr_array dst = fz_arr(z), src = fz_arr(z);
    gpuarr_result r;
    gpuarr_array_info di, si;
    bool check = (u8(z) & 1) && fz_info(dst, &di) && fz_info(src, &si) && di.dtype == si.dtype && di.nbytes == si.nbytes;
    if (async) FZ_CALL(r, "gpuarr_copy_async", gpuarr_copy_async(dst, src, fz_stream(z)));
    else FZ_CALL(r, "gpuarr_copy", gpuarr_copy(dst, src));
    if (r == GPUARR_OK && check) {
        unsigned char *x = fz_read_all(z, src, &si), *y = fz_read_all(z, dst, &di);
        if (x && y && memcmp(x, y, si.nbytes) != 0) {
            char w1[160], w2[160];
            fz_die("gpuarr_copy%s: dst (%s) differs from src (%s)", async ? "_async" : "", fz_where(&di, w1, sizeof w1), fz_where(&si, w2, sizeof w2));
        }
    }
}

static void op_rw(fz *z, int kind) {
    gpuarr_array a = fz_arr(z);
    gpuarr_array_info info;
    bool have = fz_info(a, &info);
    uint8_t how = u8(z);
    int64_t first, count;
    if ((how & 3) == 3) {
        first = (int64_t)u64(z);
        count = (int64_t)u64(z);
    } else {
        int64_t n = have ? info.count : 0;
        first = n ? (int64_t)(u16(z) % (uint64_t)(n + 1)) : u8(z) % 3;
        count = n - first > 0 ? (int64_t)(u16(z) % (uint64_t)(n - first + 1)) : u8(z) % 3;
    }
    gpuarr_dtype t = (how & 4) ? fz_dtype(z) : GPUARR_DTYPE_INVALID;
    size_t itemsize = t ? gpuarr_dtype_size(t) : have ? info.itemsize : 8;
    if (!itemsize) itemsize = 8;
    /* count elements where the call can succeed (arrays from gpuarr_stack hold more than
       FZ_MAX_ELEMS); one where it must fail */
    int64_t most = have && info.count > FZ_MAX_ELEMS ? info.count : FZ_MAX_ELEMS;
    size_t n = count > 0 && count <= most ? (size_t)count : 1;
    unsigned char *buf = (unsigned char *)fz_alloc(z, n * itemsize);
    unsigned char *copy = (unsigned char *)malloc(n * itemsize + 1);
    memcpy(copy, buf, n * itemsize);
    gpuarr_result r;
    const void *src = (how & 0x70) == 0x70 ? NULL : buf;
    if (fz_trace) fprintf(stderr, "  rw kind %d on 0x%x [%lld, +%lld) as %s\n", kind, a.id, (long long)first, (long long)count, gpuarr_dtype_name(t));
    switch (kind) {
    case 0:
        FZ_CALL(r, "gpuarr_write", gpuarr_write(a, first, count, t, src));
        if (r == GPUARR_OK && t == GPUARR_DTYPE_INVALID && count > 0 && (how & 8)) { /* read it back */
            unsigned char *back = (unsigned char *)fz_alloc(z, n * itemsize);
            char w[160];
            if (FZ_CALL(r, "gpuarr_read", gpuarr_read(a, first, count, t, back)) == GPUARR_OK && memcmp(back, buf, n * itemsize) != 0)
                fz_die("gpuarr_write then gpuarr_read of [%lld, +%lld) gave other bytes (%s)", (long long)first, (long long)count,
                       fz_where(&info, w, sizeof w));
        }
        break;
    case 1: FZ_CALL(r, "gpuarr_write_async", gpuarr_write_async(a, first, count, t, src, fz_stream(z))); break;
    case 2:
        FZ_CALL(r, "gpuarr_read", gpuarr_read(a, first, count, t, (void *)src));
        if (r != GPUARR_OK && src && memcmp(buf, copy, n * itemsize) != 0) fz_die("gpuarr_read failed but wrote the caller's memory");
        break;
    default: FZ_CALL(r, "gpuarr_read_async", gpuarr_read_async(a, first, count, t, (void *)src, fz_stream(z))); break;
    }
    free(copy);
}

static void op_to_host(fz *z) {
    gpuarr_array a = fz_arr(z);
    gpuarr_array_info info;
    bool have = fz_info(a, &info);
    uint8_t how = u8(z);
    size_t count = have && !(how & 1) ? (size_t)info.count : u16(z) % (FZ_MAX_ELEMS + 1);
    if (how & 2 && count) count--; /* one short: refused */
    gpuarr_dtype t = (how & 4) ? fz_dtype(z) : GPUARR_DTYPE_INVALID;
    size_t itemsize = t ? gpuarr_dtype_size(t) : have ? info.itemsize : 8;
    if (!itemsize) itemsize = 8;
    unsigned char *buf = (unsigned char *)fz_alloc(z, (count ? count : 1) * itemsize);
    gpuarr_result r;
    switch ((how >> 4) & 3) {
    case 0: FZ_CALL(r, "gpuarr_to_host_as", gpuarr_to_host_as(a, t, buf, count)); break;
    case 1: FZ_CALL(r, "gpuarr_to_host", gpuarr_to_host(a, (double *)(void *)buf, count * itemsize / 8)); break;
    case 2: FZ_CALL(r, "gpuarr_to_host_i64", gpuarr_to_host_i64(a, (int64_t *)(void *)buf, count * itemsize / 8)); break;
    default:
        if (how & 8) FZ_CALL(r, "gpuarr_to_host_u64", gpuarr_to_host_u64(a, (uint64_t *)(void *)buf, count * itemsize / 8));
        else FZ_CALL(r, "gpuarr__to_host_named", gpuarr__to_host_named("gpuarr__to_host_named", a, t, buf, count));
        break;
    }
    if (r == GPUARR_OK && have && t == GPUARR_DTYPE_INVALID && ((how >> 4) & 3) == 0) {
        unsigned char *back = fz_read_all(z, a, &info);
        if (back && memcmp(back, buf, info.nbytes) != 0) fz_die("gpuarr_to_host_as and gpuarr_read disagree");
    }
}

static void op_fill(fz *z) {
    gpuarr_array a = fz_arr(z);
    uint8_t how = u8(z);
    gpuarr_dtype t = fz_dtype(z);
    uint64_t v = u64(z);
    gpuarr_result r;
    switch (how & 7) {
    case 0: FZ_CALL(r, "gpuarr_fill", gpuarr_fill(a, (float)(int32_t)v)); break;
    case 1: FZ_CALL(r, "gpuarr_fill", gpuarr_fill(a, (int)v)); break;
    case 2: FZ_CALL(r, "gpuarr_fill", gpuarr_fill(a, (double)(int64_t)v)); break;
    case 3: FZ_CALL(r, "gpuarr_fill", gpuarr_fill(a, gpuarr_bf16_from_float((float)(int16_t)v))); break;
    case 4: FZ_CALL(r, "gpuarr_fill_as", gpuarr_fill_as(a, t, NULL)); break;
    case 5: FZ_CALL(r, "gpuarr__fill_named", gpuarr__fill_named("gpuarr__fill_named", a, t, &v)); break;
    default: {
        gpuarr_array_info info;
        bool have = fz_info(a, &info);
        gpuarr_dtype ft = (how & 8) || !have ? t : info.dtype;
        FZ_CALL(r, "gpuarr_fill_as", gpuarr_fill_as(a, ft, &v));
        bool integer = have && ft == info.dtype && ft >= GPUARR_I8 && ft <= GPUARR_U64;
        if (r == GPUARR_OK && integer && info.nbytes) {
            unsigned char *back = fz_read_all(z, a, &info);
            for (size_t i = 0; back && i < info.nbytes; i++)
                if (back[i] != ((unsigned char *)&v)[i % info.itemsize]) fz_die("gpuarr_fill_as (%s): byte %zu differs", gpuarr_dtype_name(ft), i);
        }
        break;
    }
    }
}

static void op_view(fz *z) {
    gpuarr_array a = fz_arr(z), out = {FZ_SENTINEL};
    gpuarr_result r;
    const char *name;
    if (u8(z) & 1) {
        name = "gpuarr_reshape";
        int64_t shape[GPUARR_MAX_DIMS + 1] = {0};
        int ndim = fz_shape(z, shape, true);
        gpuarr_array_info info;
        if ((u8(z) & 3) && fz_info(a, &info) && ndim > 0 && ndim <= GPUARR_MAX_DIMS) { /* a shape of the same count */
            shape[0] = info.count;
            for (int i = 1; i < ndim; i++) shape[i] = 1;
        }
        r = gpuarr_reshape(a, ndim, shape, &out);
    } else {
        name = "gpuarr_slice";
        uint8_t how = u8(z);
        int64_t b = (how & 0xc0) == 0xc0 ? (int64_t)u64(z) : u8(z) % 26 - 1, e = (how & 0xc0) == 0xc0 ? (int64_t)u64(z) : u8(z) % 26 - 1;
        r = gpuarr_slice(a, b, e, &out);
    }
    fz_ok_or_error(r, name);
    FZ_KEEP_OUT(r, name, out);
    if (r == GPUARR_OK) fz_adopt(z, out);
}

static void op_batch(fz *z) {
    gpuarr_array src[9], outs[9];
    int n = u8(z) % 10 - 1; /* -1..8 */
    for (int i = 0; i < 9; i++) {
        src[i] = fz_arr(z);
        outs[i].id = FZ_SENTINEL;
    }
    if (u8(z) & 1) { /* the same array n times: a valid stack */
        for (int i = 1; i < 9; i++) src[i] = src[0];
    }
    gpuarr_device d = fz_dev(z);
    gpuarr_dtype t = (u8(z) & 1) ? GPUARR_DTYPE_INVALID : fz_dtype(z);
    gpuarr_result r;
    if (u8(z) & 1) {
        gpuarr_array out = {FZ_SENTINEL};
        FZ_CALL(r, "gpuarr_stack", gpuarr_stack(n > 0 || (u8(z) & 1) ? src : NULL, n, d, t, &out));
        FZ_KEEP_OUT(r, "gpuarr_stack", out);
        if (r == GPUARR_OK) fz_adopt(z, out);
    } else {
        FZ_CALL(r, "gpuarr_convert_many", gpuarr_convert_many(n > 0 || (u8(z) & 1) ? src : NULL, n, d, t, outs));
        for (int i = 0; i < 9; i++) {
            if (r != GPUARR_OK || i >= n) {
                if (outs[i].id != FZ_SENTINEL) fz_die("gpuarr_convert_many wrote out[%d] (result %d, n %d)", i, (int)r, n);
                continue;
            }
            fz_adopt(z, outs[i]);
        }
    }
}

static void op_stream(fz *z) {
    uint8_t how = u8(z);
    int i = (how >> 4) % FZ_STREAMS;
    gpuarr_result r;
    switch (how & 15) {
    case 0:
    case 1: {
        if (z->st[i].id) return;
        gpuarr_stream out = {FZ_SENTINEL};
        gpuarr_device d = fz_dev(z);
        uint32_t flags = (u8(z) & 7) ? 0u : 1u;
        FZ_CALL(r, "gpuarr_stream_create", gpuarr_stream_create(d, flags, &out));
        FZ_KEEP_OUT(r, "gpuarr_stream_create", out);
        if (r == GPUARR_OK) z->st[i] = out;
        break;
    }
    case 2: {
        gpuarr_stream s = fz_stream(z);
        bool owned, pinned = false;
        int k;
        for (k = 0; k < FZ_STREAMS && z->st[k].id != s.id; k++) {}
        owned = k < FZ_STREAMS && s.id;
        if (owned) pinned = z->st_pinned[k];
        if (pinned) return; /* a wrapped stream still uses it: destroyed at the end */
        FZ_CALL(r, "gpuarr_stream_destroy", gpuarr_stream_destroy(s));
        if (owned && r != GPUARR_OK) fz_die("gpuarr_stream_destroy of an owned stream failed: %s", gpuarr_last_error());
        if (!owned && r == GPUARR_OK && s.id) fz_die("gpuarr_stream_destroy of a non-live id succeeded");
        if (owned) {
            z->st_wrapped[k] = false; /* what it wrapped stays pinned until the end */
            fz_stale_add(z, s.id);
            z->st[k].id = 0;
        }
        break;
    }
    case 3: FZ_CALL(r, "gpuarr_stream_sync", gpuarr_stream_sync(fz_stream(z))); break;
    case 4: {
        bool done;
        gpuarr_stream s = fz_stream(z);
        FZ_CALL(r, "gpuarr_stream_query", gpuarr_stream_query(s, (u8(z) & 7) ? &done : NULL));
        break;
    }
    case 5: {
        gpuarr_device d = {FZ_SENTINEL};
        FZ_CALL(r, "gpuarr_stream_get_device", gpuarr_stream_get_device(fz_stream(z), &d));
        if (r != GPUARR_OK && d.id != FZ_SENTINEL) fz_die("gpuarr_stream_get_device failed but wrote *out");
        break;
    }
    case 6: {
        gpuarr_stream s = fz_stream(z);
        FZ_CALL(r, "gpuarr_stream_wait", gpuarr_stream_wait(s, fz_event(z)));
        break;
    }
    case 7: {
        gpuarr_stream s = fz_stream(z);
        FZ_CALL(r, "gpuarr_stream_wait_array", gpuarr_stream_wait_array(s, fz_arr(z)));
        break;
    }
    case 8: {
        gpuarr_array a = fz_arr(z);
        FZ_CALL(r, "gpuarr_array_record_stream", gpuarr_array_record_stream(a, fz_stream(z)));
        break;
    }
    case 9: FZ_CALL(r, "gpuarr_set_current_stream", gpuarr_set_current_stream(fz_stream(z))); break;
    case 10: (void)gpuarr_current_stream(); break;
    case 11: FZ_CALL(r, "gpuarr_set_current_device", gpuarr_set_current_device(fz_dev(z))); break;
    case 12: (void)gpuarr_current_device(); break;
    case 13: /* refused while the device has live handles; no other thread may use it meanwhile */
        if (fz_soak) break;
        FZ_CALL(r, "gpuarr_device_reset", gpuarr_device_reset(fz_dev(z)));
        break;
    default: FZ_CALL(r, "gpuarr_device_sync", gpuarr_device_sync(fz_dev(z))); break;
    }
}

static void op_event(fz *z) {
    uint8_t how = u8(z);
    int i = (how >> 4) % FZ_EVENTS;
    gpuarr_result r;
    switch (how & 7) {
    case 0:
    case 1: {
        if (z->ev[i].id) return;
        gpuarr_event out = {FZ_SENTINEL};
        uint8_t f = u8(z);
        FZ_CALL(r, "gpuarr_event_create", gpuarr_event_create(fz_dev(z), f < 0xf0 ? (f & 1u) : f, &out));
        FZ_KEEP_OUT(r, "gpuarr_event_create", out);
        if (r == GPUARR_OK) z->ev[i] = out;
        break;
    }
    case 2: {
        gpuarr_event e = fz_event(z);
        int k;
        for (k = 0; k < FZ_EVENTS && z->ev[k].id != e.id; k++) {}
        bool owned = k < FZ_EVENTS && e.id;
        FZ_CALL(r, "gpuarr_event_destroy", gpuarr_event_destroy(e));
        if (owned && r != GPUARR_OK) fz_die("gpuarr_event_destroy of an owned event failed");
        if (!owned && r == GPUARR_OK && e.id) fz_die("gpuarr_event_destroy of a non-live id succeeded");
        if (owned) {
            fz_stale_add(z, e.id);
            z->ev[k].id = 0;
        }
        break;
    }
    case 3: {
        gpuarr_event e = fz_event(z);
        FZ_CALL(r, "gpuarr_event_record", gpuarr_event_record(e, fz_stream(z)));
        break;
    }
    case 4: FZ_CALL(r, "gpuarr_event_sync", gpuarr_event_sync(fz_event(z))); break;
    case 5: {
        bool done;
        FZ_CALL(r, "gpuarr_event_query", gpuarr_event_query(fz_event(z), &done));
        break;
    }
    default: {
        double ms = -12345;
        gpuarr_event a = fz_event(z), b = fz_event(z);
        FZ_CALL(r, "gpuarr_event_elapsed_ms", gpuarr_event_elapsed_ms(a, b, (u8(z) & 7) ? &ms : NULL));
        break;
    }
    }
}

static void op_scope(fz *z) {
    uint8_t how = u8(z);
    if ((how & 3) == 3) { /* leave the innermost, twice (the second does nothing) */
        if (!z->nscope) return;
        gpuarr_scope *s = &z->scope[--z->nscope];
        gpuarr_scope_leave(s);
        if (how & 4) gpuarr_scope_leave(s);
        return;
    }
    if (z->nscope == FZ_SCOPES) return;
    gpuarr_scope s;
    if (how & 1) s = gpuarr_scope_enter_stream(fz_stream(z));
    else s = gpuarr_scope_enter_device(fz_dev(z));
    fz_ok_or_error(s.result, (how & 1) ? "gpuarr_scope_enter_stream" : "gpuarr_scope_enter_device");
    if (how & 8) s = gpuarr_scope_hold(s);
    else if (!s.active) return; /* GPUARR_WITH_*: the block is skipped, nothing to leave */
    z->scope[z->nscope++] = s;
}

/* ---- adopted devices and exported buffers (ADOPTED DEVICES) ----
   The binary does not link OpenCL: the few calls the caller's side needs come from the loader
   gpuarr opens (GPUARR_OPENCL_LIBRARY, else libOpenCL.so.1), loaded once in fz_start. */
#define FZ_CL_MEM_SIZE 0x1102u
#define FZ_CL_CONTEXT_REFERENCE_COUNT 0x1080u
static struct {
    int (*release_mem)(void *mem);
    int (*mem_info)(void *mem, uint32_t param, size_t size, void *value, size_t *size_ret);
    int (*read_buffer)(void *queue, void *mem, uint32_t blocking, size_t offset, size_t size, void *ptr, uint32_t nwait,
                       const void *wait, void *event);
    void *(*create_context)(const intptr_t *props, uint32_t ndev, void *const *devices, void *notify, void *user, int32_t *err);
    int (*context_info)(void *ctx, uint32_t param, size_t size, void *value, size_t *size_ret);
} fz_cl;
static void *fz_own_ctx; /* a context of the fuzzer's own, of opencl:1's device only (made once, kept) */

static void fz_cl_sym(void *lib, const char *name, void *fn_ptr) {
    void *sym = dlsym(lib, name);
    memcpy(fn_ptr, &sym, sizeof sym); /* an object pointer's bits into a function pointer */
}
static void fz_cl_load(void) {
    const char *path = getenv("GPUARR_OPENCL_LIBRARY");
    void *lib = dlopen(path ? path : "libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib && !path) lib = dlopen("libOpenCL.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return; /* then no export can succeed: gpuarr could not load it either */
    fz_cl_sym(lib, "clReleaseMemObject", &fz_cl.release_mem);
    fz_cl_sym(lib, "clGetMemObjectInfo", &fz_cl.mem_info);
    fz_cl_sym(lib, "clEnqueueReadBuffer", &fz_cl.read_buffer);
    fz_cl_sym(lib, "clCreateContext", &fz_cl.create_context);
    fz_cl_sym(lib, "clGetContextInfo", &fz_cl.context_info);
}

static void fz_export_release(fz *z, int k) {
    if (!fz_cl.release_mem) fz_die("an export succeeded but the fuzzer has no clReleaseMemObject");
    int e = fz_cl.release_mem(z->exp[k]);
    if (e != 0) fz_die("clReleaseMemObject of an exported buffer: %d", e);
    z->exp[k] = z->exp[--z->nexp];
}

/* The exported buffer holds exactly a's bytes: its size, and (sometimes) its contents read on a
   queue of a stream of a's device. */
static void fz_export_check(fz *z, gpuarr_array a, void *mem) {
    gpuarr_array_info info;
    if (!fz_info(a, &info)) fz_die("gpuarr_opencl_export_mem_raw succeeded on an array with no info");
    size_t size = 0;
    if (!fz_cl.mem_info || fz_cl.mem_info(mem, FZ_CL_MEM_SIZE, sizeof size, &size, NULL) != 0)
        fz_die("clGetMemObjectInfo of an exported buffer failed");
    if (size != info.nbytes) fz_die("gpuarr_opencl_export_mem_raw: a buffer of %zu bytes for an array of %zu", size, info.nbytes);
    if (!(u8(z) & 1)) return;
    gpuarr_stream s = {FZ_SENTINEL};
    void *q = NULL;
    gpuarr_result r;
    if (FZ_CALL(r, "gpuarr_stream_create", gpuarr_stream_create(info.device, 0, &s)) != GPUARR_OK) return; /* faults */
    if (FZ_CALL(r, "gpuarr_opencl_queue_raw", gpuarr_opencl_queue_raw(s, &q)) != GPUARR_OK) fz_die("no queue for a stream of an OpenCL array's device");
    unsigned char *got = (unsigned char *)fz_alloc(z, info.nbytes), *want = fz_read_all(z, a, &info);
    int e = fz_cl.read_buffer(q, mem, 1u, 0, info.nbytes, got, 0, NULL, NULL);
    if (e != 0) fz_die("clEnqueueReadBuffer of an exported buffer: %d", e);
    char w[160];
    if (want && memcmp(got, want, info.nbytes) != 0) fz_die("an exported buffer differs from its array (%s)", fz_where(&info, w, sizeof w));
    if (gpuarr_stream_destroy(s) != GPUARR_OK) fz_die("gpuarr_stream_destroy: %s", gpuarr_last_error());
}

static void op_export(fz *z, uint8_t how) {
    gpuarr_array a = fz_arr(z);
    void *mem = (void *)&z->pos;
    gpuarr_result r;
    FZ_CALL(r, "gpuarr_opencl_export_mem_raw", gpuarr_opencl_export_mem_raw(a, (how & 0xe0) == 0xe0 ? NULL : &mem));
    if (r != GPUARR_OK) {
        if (mem != (void *)&z->pos) fz_die("gpuarr_opencl_export_mem_raw failed but wrote *out");
        return;
    }
    gpuarr_array_info info;
    gpuarr_device_info di;
    if (!fz_info(a, &info) || gpuarr_device_get_info(info.device, &di) != GPUARR_OK || di.backend != GPUARR_BACKEND_OPENCL ||
        info.host_fallback || !info.nbytes)
        fz_die("gpuarr_opencl_export_mem_raw succeeded on an array that is not an OpenCL device's, or empty");
    fz_export_check(z, a, mem);
    z->exp[z->nexp++] = mem;
    if ((how & 0x10) || z->nexp == FZ_EXPORTS) fz_export_release(z, z->nexp - 1); /* at once */
}

/* The context and device to adopt: gpuarr's own of an OpenCL device, the fuzzer's own context, or
   NULL; the device of that context, of the other one, or NULL (never garbage: OpenCL cannot tell). */
static void fz_adopt_args(fz *z, uint8_t how, void **ctx, void **id, bool *own) {
    gpuarr_device src = z->dev[1 + u8(z) % 2], other = z->dev[1 + u8(z) % 2];
    *ctx = *id = NULL;
    *own = false;
    switch ((how >> 2) & 7) {
    case 0: break; /* NULL */
    case 1:
        if (!fz_own_ctx && fz_cl.create_context && z->dev[2].id && gpuarr_opencl_device_id_raw(z->dev[2], id) == GPUARR_OK) {
            int32_t e = 0;
            fz_own_ctx = fz_cl.create_context(NULL, 1, id, NULL, NULL, &e);
            *id = NULL;
        }
        *ctx = fz_own_ctx;
        *own = fz_own_ctx != NULL;
        break;
    default: (void)fz_call(gpuarr_opencl_context_raw(src, ctx), "gpuarr_opencl_context_raw"); break;
    }
    switch ((how >> 5) & 3) {
    case 0: break; /* NULL */
    case 1: (void)fz_call(gpuarr_opencl_device_id_raw(other, id), "gpuarr_opencl_device_id_raw"); break;
    default: (void)fz_call(gpuarr_opencl_device_id_raw(*own ? z->dev[2] : src, id), "gpuarr_opencl_device_id_raw"); break;
    }
}

static unsigned fz_context_refs(void *ctx) {
    uint32_t refs = 0;
    if (!fz_cl.context_info || fz_cl.context_info(ctx, FZ_CL_CONTEXT_REFERENCE_COUNT, sizeof refs, &refs, NULL) != 0)
        fz_die("clGetContextInfo(CL_CONTEXT_REFERENCE_COUNT) failed");
    return refs;
}

/* The context's references once they come down to `want`, or after 2 s: PoCL's worker threads
   drop the references their finished commands hold a little after the commands complete. */
static unsigned fz_context_refs_settled(void *ctx, unsigned want) {
    unsigned refs = fz_context_refs(ctx);
    for (int i = 0; i < 2000 && refs != want; i++) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
        refs = fz_context_refs(ctx);
    }
    return refs;
}

static void fz_adopt_device(fz *z, uint8_t how) {
    void *ctx, *id, *q = NULL;
    bool own;
    fz_adopt_args(z, how, &ctx, &id, &own);
    uint8_t more = u8(z);
    if (more & 1) { /* the queue of a stream: its device's, another's, or a wrapped one */
        (void)fz_call(gpuarr_opencl_queue_raw(z->st[u8(z) % FZ_STREAMS], &q), "gpuarr_opencl_queue_raw");
    }
    bool null_out = (more & 0x1e) == 0x1e;
    /* the soak's threads would use another's adopted device while it is removed (no other thread
       may, the manual says): there only adoptions that must be refused */
    if (fz_soak && ctx && id && !null_out) return;
    gpuarr_device out = {FZ_SENTINEL};
    gpuarr_result r;
    unsigned refs = own ? fz_context_refs(ctx) : 0;
    FZ_CALL(r, "gpuarr_opencl_adopt_raw", gpuarr_opencl_adopt_raw(ctx, id, q, null_out ? NULL : &out));
    FZ_KEEP_OUT(r, "gpuarr_opencl_adopt_raw", out);
    if (r == GPUARR_ERROR_OUT_OF_MEMORY && !fz_soak) z->reinit = true; /* the cycle's adoptions are spent: start a new one */
    if (own && r != GPUARR_OK && fz_context_refs_settled(ctx, refs) != refs) fz_die("a refused gpuarr_opencl_adopt_raw kept a reference to the context");
    if (r != GPUARR_OK) return;
    if (!ctx || !id || null_out) fz_die("gpuarr_opencl_adopt_raw accepted a NULL argument");
    if (z->adev.id && ctx == z->adev_ctx && id == z->adev_id) fz_die("gpuarr_opencl_adopt_raw adopted a context and device twice");
    gpuarr_device_info info, twin;
    void *got_ctx = NULL, *got_id = NULL;
    if (gpuarr_device_get_info(out, &info) != GPUARR_OK || !info.adopted || info.backend != GPUARR_BACKEND_OPENCL)
        fz_die("an adopted device's info: %s", gpuarr_last_error());
    if (gpuarr_device_get_info(info.same_as, &twin) != GPUARR_OK || twin.adopted)
        fz_die("an adopted device's same_as is not a device gpuarr found");
    if (gpuarr_opencl_context_raw(out, &got_ctx) != GPUARR_OK || got_ctx != ctx || gpuarr_opencl_device_id_raw(out, &got_id) != GPUARR_OK ||
        got_id != id || gpuarr_opencl_device_id_raw(info.same_as, &got_id) != GPUARR_OK || got_id != id)
        fz_die("an adopted device's context or device is not the one adopted");
    if (z->adev.id) { /* another pair: the fuzzer keeps one, this one goes at once (nothing lives on it) */
        FZ_CALL(r, "gpuarr_device_remove", gpuarr_device_remove(out));
        if (r != GPUARR_OK) fz_die("gpuarr_device_remove of a device just adopted: %s", gpuarr_last_error());
        if (own && fz_context_refs_settled(ctx, refs) != refs) fz_die("adopting and removing kept a reference to the context");
        return;
    }
    z->adev = out;
    z->adev_ctx = ctx;
    z->adev_id = id;
}

/* Removing: the adopted device, the one removed, or any (only adopted ones are removed). On
   success nothing of the fuzzer's may be left on it. */
static void fz_remove_device(fz *z, uint8_t how) {
    gpuarr_device d = (how & 0x40) ? fz_dev(z) : z->adev;
    gpuarr_result r;
    if (fz_soak && d.id && d.id != z->adev.id) return; /* (another thread's adopted device, by a forged id) */
    FZ_CALL(r, "gpuarr_device_remove", gpuarr_device_remove(d));
    if (r != GPUARR_OK) return;
    if (!d.id || d.id != z->adev.id) fz_die("gpuarr_device_remove of a device not adopted (0x%x) succeeded", d.id);
    for (int i = 0; i < FZ_ARRAYS; i++) {
        gpuarr_array_info info;
        if ((z->arr[i].id && fz_info(z->arr[i], &info) && info.device.id == d.id) ||
            (i < z->nkeep && fz_info(z->keep[i], &info) && info.device.id == d.id))
            fz_die("gpuarr_device_remove succeeded while array slot %d (or kept array %d) lives on the device", i, i);
    }
    for (int i = 0; i < FZ_STREAMS; i++) {
        gpuarr_device sd = {0};
        if (z->st[i].id && gpuarr_stream_get_device(z->st[i], &sd) == GPUARR_OK && sd.id == d.id)
            fz_die("gpuarr_device_remove succeeded while stream 0x%x lives on the device", z->st[i].id);
    }
    gpuarr_device_info info;
    if (gpuarr_device_get_info(d, &info) != GPUARR_ERROR_INVALID_HANDLE) fz_die("a removed device still answers gpuarr_device_get_info");
    if (z->adev_ctx == fz_own_ctx && fz_context_refs_settled(fz_own_ctx, 1) != 1)
        fz_die("gpuarr_device_remove kept %u references to the context", fz_context_refs(fz_own_ctx) - 1);
    z->adev_removed = d.id;
    z->adev.id = 0;
    z->adev_ctx = z->adev_id = NULL;
}

static void op_adopt(fz *z) {
    uint8_t how = u8(z);
    switch (how & 3) {
    case 0: fz_remove_device(z, how); break;
    case 1: op_export(z, how); break;
    case 2:
        if (z->nexp) fz_export_release(z, (how >> 2) % z->nexp);
        else (void)fz_call(gpuarr_device_remove(fz_dev(z)), "gpuarr_device_remove");
        break;
    default: fz_adopt_device(z, how); break;
    }
}

static void op_device(fz *z) {
    uint8_t how = u8(z);
    gpuarr_result r;
    switch (how % 6) {
    case 0: {
        char spec[24];
        size_t n = u8(z) % sizeof spec;
        for (size_t i = 0; i < n; i++) spec[i] = (char)u8(z);
        spec[n] = '\0';
        gpuarr_device d = {FZ_SENTINEL};
        static const char *const known[] = {"host", "cpu", "gpu", "any", "cuda:0", "opencl:1", "cuda:7", "opencl", "cuda:", "Host",
                                            "local", "local:3", "local:x"};
        unsigned k = (unsigned)how >> 3; /* 20..22 (host, cpu, gpu a second time before): the local specs */
        const char *s = (how & 0x40) ? spec : known[k >= 20 && k <= 22 ? k - 10 : k % 10];
        FZ_CALL(r, "gpuarr_device_find", gpuarr_device_find((how & 0x80) && (how & 0x40) ? NULL : s, &d));
        if (r != GPUARR_OK && d.id != FZ_SENTINEL) fz_die("gpuarr_device_find failed but wrote *out");
        break;
    }
    case 1: {
        if (how & 0x40) { /* telemetry: never an error on a live device; the valid bits agree with the values */
            gpuarr_telemetry t, before;
            memset(&t, 0x5a, sizeof t);
            before = t;
            FZ_CALL(r, "gpuarr_device_get_telemetry", gpuarr_device_get_telemetry(fz_dev(z), (how & 0x80) ? NULL : &t));
            if (r != GPUARR_OK && memcmp(&t, &before, sizeof t) != 0) fz_die("gpuarr_device_get_telemetry failed but wrote *out");
            if (r == GPUARR_OK) {
                if (t.valid >> GPUARR_TELEMETRY_COUNT) fz_die("telemetry: unknown valid bits 0x%x", t.valid);
                if (!(t.valid & (uint32_t)GPUARR_TELEMETRY_MEMORY_TOTAL) || !t.memory_total) fz_die("telemetry: no total memory");
                if ((t.valid & (uint32_t)GPUARR_TELEMETRY_MEMORY_USAGE) && t.memory_used > t.memory_total - (t.memory_free < t.memory_total ? t.memory_free : t.memory_total))
                    fz_die("telemetry: used + free > total");
            }
            const char *name = gpuarr_telemetry_name((uint32_t)1u << (u8(z) % 16));
            if (!name || !*name) fz_die("gpuarr_telemetry_name gave nothing");
            break;
        }
        gpuarr_device_info info;
        FZ_CALL(r, "gpuarr_device_get_info", gpuarr_device_get_info(fz_dev(z), (how & 0x80) ? NULL : &info));
        if (r == GPUARR_OK && !memchr(info.spec, '\0', sizeof info.spec)) fz_die("device_get_info: spec not terminated");
        break;
    }
    case 2: {
        int n = gpuarr_device_count();
        int i = (int)(int8_t)u8(z);
        gpuarr_device d = gpuarr_device_at(i);
        if ((i < 0 || i >= n) && d.id) fz_die("gpuarr_device_at(%d) of %d gave a device", i, n);
        if (gpuarr_host().id == 0) fz_die("gpuarr_host() is {0} while initialized");
        break;
    }
    case 3: { /* the interop getters: errors for the wrong backend */
        void *p = NULL;
        size_t off = 0;
        int ord = 0;
        struct CUctx_st *ctx = NULL;
        struct CUstream_st *cs = NULL;
        switch (u8(z) % 8) {
        case 0: FZ_CALL(r, "gpuarr_opencl_context_raw", gpuarr_opencl_context_raw(fz_dev(z), &p)); break;
        case 1: FZ_CALL(r, "gpuarr_opencl_device_id_raw", gpuarr_opencl_device_id_raw(fz_dev(z), (how & 0x80) ? NULL : &p)); break;
        case 2: FZ_CALL(r, "gpuarr_opencl_queue_raw", gpuarr_opencl_queue_raw(fz_stream(z), &p)); break;
        case 3: FZ_CALL(r, "gpuarr_opencl_mem_raw", gpuarr_opencl_mem_raw(fz_arr(z), &p, (how & 0x80) ? NULL : &off)); break;
        case 4: FZ_CALL(r, "gpuarr_cuda_context", gpuarr_cuda_context(fz_dev(z), &ctx)); break;
        case 5: FZ_CALL(r, "gpuarr_cuda_device_ordinal", gpuarr_cuda_device_ordinal(fz_dev(z), (how & 0x80) ? NULL : &ord)); break;
        case 6: FZ_CALL(r, "gpuarr_cuda_stream", gpuarr_cuda_stream(fz_stream(z), &cs)); break;
        default: FZ_CALL(r, "gpuarr_cuda_ptr", gpuarr_cuda_ptr(fz_arr(z), &p)); break;
        }
        break;
    }
    case 4: { /* wrapping: a native object gpuarr handed out, or NULL */
        gpuarr_result r2;
        uint8_t w = u8(z);
        int64_t shape[GPUARR_MAX_DIMS + 1] = {0};
        int ndim = fz_shape(z, shape, true);
        gpuarr_dtype t = fz_dtype(z);
        gpuarr_device d = fz_dev(z);
        if (w & 1) { /* an array's memory */
            gpuarr_array src = fz_arr(z), out = {FZ_SENTINEL};
            gpuarr_array_info si;
            void *p = NULL;
            size_t off = 0;
            if (w & 2) {
                if ((w & 4) || FZ_CALL(r, "gpuarr_opencl_mem_raw", gpuarr_opencl_mem_raw(src, &p, &off)) == GPUARR_OK) {
                    size_t o = (w & 8) ? (size_t)u32(z) : off;
                    FZ_CALL(r2, "gpuarr_opencl_wrap_mem_raw", gpuarr_opencl_wrap_mem_raw(d, p, o, t, ndim, shape, &out));
                    FZ_KEEP_OUT(r2, "gpuarr_opencl_wrap_mem_raw", out);
                    /* the buffer is src's pool block: valid while src lives (the wrapper's
                       reference keeps the cl_mem, not the block, which the pool hands to the
                       next array once src goes). Keep src alive, as for a CUDA pointer. */
                    if (r2 == GPUARR_OK && z->nkeep < FZ_ARRAYS) {
                        if (gpuarr_retain(src) != GPUARR_OK) fz_die("retain of a live array failed");
                        z->keep[z->nkeep++] = src;
                        fz_alias_add(z, src.id, out.id);
                        fz_adopt(z, out);
                    } else if (r2 == GPUARR_OK) {
                        FZ_CALL(r2, "gpuarr_release", gpuarr_release(out));
                        if (r2 != GPUARR_OK) fz_die("gpuarr_release of a wrapped buffer failed");
                        fz_stale_add(z, out.id);
                    }
                }
            } else if (z->nkeep < FZ_ARRAYS) {
                if ((w & 4) || FZ_CALL(r, "gpuarr_cuda_ptr", gpuarr_cuda_ptr(src, &p)) == GPUARR_OK) {
                    /* the caller's duty: the pointer holds the whole array. Keep src alive. */
                    bool fits = p && fz_info(src, &si) && fz_shape_sane(ndim, shape) && gpuarr_dtype_size(t) &&
                                (size_t)fz_count(ndim, shape) * gpuarr_dtype_size(t) <= si.nbytes;
                    if (!p || fits) {
                        FZ_CALL(r2, "gpuarr_cuda_wrap_ptr",
                                gpuarr_cuda_wrap_ptr(d, p, t, ndim, shape, NULL, NULL, &out));
                        FZ_KEEP_OUT(r2, "gpuarr_cuda_wrap_ptr", out);
                        if (r2 == GPUARR_OK) {
                            if (gpuarr_retain(src) != GPUARR_OK) fz_die("retain of a live array failed");
                            z->keep[z->nkeep++] = src;
                            fz_alias_add(z, src.id, out.id);
                            fz_adopt(z, out);
                        }
                    }
                }
            }
        } else { /* a stream's queue */
            int k = u8(z) % FZ_STREAMS, free_slot = -1;
            for (int j = 0; j < FZ_STREAMS; j++)
                if (!z->st[j].id) free_slot = j;
            if (free_slot < 0) return;
            gpuarr_stream out = {FZ_SENTINEL};
            void *q = NULL;
            struct CUstream_st *cs = NULL;
            if ((w & 0x18) == 0x18) { /* adopting a context gpuarr has already (a primary one), or none: refused */
                struct CUctx_st *ctx = NULL;
                gpuarr_device adopted = {FZ_SENTINEL};
                if ((w & 0x20) || FZ_CALL(r, "gpuarr_cuda_context", gpuarr_cuda_context(d, &ctx)) == GPUARR_OK) {
                    FZ_CALL(r2, "gpuarr_cuda_adopt", gpuarr_cuda_adopt(ctx, &adopted));
                    if (r2 == GPUARR_OK) fz_die("gpuarr_cuda_adopt took %s context %p", ctx ? "a primary" : "a NULL", (void *)ctx);
                    FZ_KEEP_OUT(r2, "gpuarr_cuda_adopt", adopted);
                }
            } else if (w & 2) {
                if ((w & 4) || FZ_CALL(r, "gpuarr_opencl_queue_raw", gpuarr_opencl_queue_raw(z->st[k], &q)) == GPUARR_OK) {
                    FZ_CALL(r2, "gpuarr_opencl_wrap_queue_raw", gpuarr_opencl_wrap_queue_raw(d, q, &out));
                    FZ_KEEP_OUT(r2, "gpuarr_opencl_wrap_queue_raw", out);
                    if (r2 == GPUARR_OK) z->st[free_slot] = out;
                }
            } else {
                if ((w & 4) || FZ_CALL(r, "gpuarr_cuda_stream", gpuarr_cuda_stream(z->st[k], &cs)) == GPUARR_OK) {
                    FZ_CALL(r2, "gpuarr_cuda_wrap_stream", gpuarr_cuda_wrap_stream(d, cs, &out));
                    FZ_KEEP_OUT(r2, "gpuarr_cuda_wrap_stream", out);
                    if (r2 == GPUARR_OK) {
                        z->st[free_slot] = out;
                        z->st_wrapped[free_slot] = true;
                        if (cs) z->st_pinned[k] = true;
                    }
                }
            }
        }
        break;
    }
    default: /* bytes from 0x80 up: adopted devices and exported buffers; they synced a device before */
        if (how >= 0x80) op_adopt(z);
        else FZ_CALL(r, "gpuarr_device_sync", gpuarr_device_sync(fz_dev(z)));
        break;
    }
}

static void op_pool(fz *z) {
    uint8_t how = u8(z);
    gpuarr_device d = fz_dev(z);
    gpuarr_result r;
    switch (how % 10) {
    case 0: {
        gpuarr_pool_stats st;
        FZ_CALL(r, "gpuarr_pool_get_stats", gpuarr_pool_get_stats(d, (how & 0x80) ? NULL : &st));
        break;
    }
    case 1: {
        gpuarr_pool_stats st;
        FZ_CALL(r, "gpuarr_pool_get_pinned_stats", gpuarr_pool_get_pinned_stats(d, (how & 0x80) ? NULL : &st));
        break;
    }
    case 2: FZ_CALL(r, "gpuarr_pool_reset_peaks", gpuarr_pool_reset_peaks(d)); break;
    case 3:
        if (fz_soak) break; /* process-wide: not from the soak's threads */
        z->limits = true;
        FZ_CALL(r, "gpuarr_pool_set_limit", gpuarr_pool_set_limit(d, (how & 0x80) ? u64(z) : (uint64_t)u8(z) << 12));
        break;
    case 4: FZ_CALL(r, "gpuarr_pool_trim", gpuarr_pool_trim(d)); break;
    case 5: {
        size_t len = u16(z) % 4096;
        char *buf = (how & 0x80) && !len ? NULL : (char *)fz_alloc(z, len);
        FZ_CALL(r, "gpuarr_pool_summary", gpuarr_pool_summary(d, buf, len));
        if (r == GPUARR_OK && len && !memchr(buf, '\0', len)) fz_die("gpuarr_pool_summary: not NUL-terminated within len");
        break;
    }
    case 6: {
        size_t ms = u8(z) % 8, mb = u8(z) % 8, sc = 7777, bc = 7777;
        gpuarr_pool_segment_info segs[8];
        gpuarr_pool_block_info blocks[8];
        FZ_CALL(r, "gpuarr_pool_snapshot",
                gpuarr_pool_snapshot(d, (how & 0x40) && !ms ? NULL : segs, ms, (how & 0x80) ? NULL : &sc, (how & 0x20) && !mb ? NULL : blocks, mb,
                                     &bc));
        break;
    }
    case 7:
        z->faults = true;
        uint64_t nth = u8(z) % 8;
        FZ_CALL(r, "gpuarr_pool_inject_faults", gpuarr_pool_inject_faults(d, nth, (how & 0x80) ? (uint64_t)u16(z) : 0));
        break;
    case 8: {
        uintptr_t k = u8(z) % 20;
        if (how & 0x80) {
            FZ_CALL(r, "gpuarr_oom_handler_remove", gpuarr_oom_handler_remove(fz_oom, (char *)z + k));
            if (r == GPUARR_OK) {
                if (!(z->handlers & (1 << k))) fz_die("gpuarr_oom_handler_remove of a pair never added succeeded");
                z->handlers &= ~(1 << k);
            }
        } else if (!(z->handlers & (1 << k))) {
            FZ_CALL(r, "gpuarr_oom_handler_add", gpuarr_oom_handler_add((how & 0x40) ? NULL : fz_oom, (char *)z + k));
            if (r == GPUARR_OK) z->handlers |= 1 << k;
        }
        break;
    }
    default: {
        gpuarr_desc q;
        FZ_CALL(r, "gpuarr_query_desc", gpuarr_query_desc((how & 0x80) ? NULL : &q));
        if (!gpuarr_is_initialized()) fz_die("gpuarr_is_initialized is false while initialized");
        break;
    }
    }
}

/* DLPack: export (versioned, async on a stream, or legacy), then the consumer's deleter at once,
   or an import of the tensor as it is or with one field broken: a refused import calls the
   deleter itself, so the export's reference goes either way (the end-of-input checks see a
   leak otherwise). */
static void op_dlpack(fz *z) {
    gpuarr_array a = fz_arr(z), out = {FZ_SENTINEL};
    uint8_t how = u8(z);
    uint64_t flags = (how & 0x80) ? (uint64_t)u8(z) : (uint64_t)(how & 1);
    gpuarr_result r;
    const char *name = gpuarr_dlpack_capsule_name(how & 1, how & 0x10); /* the names ctypes users pass */
    if (!name || strcmp(name + ((how & 0x10) ? 5 : 0), (how & 1) ? "dltensor_versioned" : "dltensor") != 0)
        fz_die("gpuarr_dlpack_capsule_name(%d, %d) = %s", how & 1, (how & 0x10) != 0, name ? name : "NULL");
    gpuarr_dlpack_capsule_destructor(NULL);
    if (how & 0x40) {
        DLManagedTensor *l = NULL;
        if (FZ_CALL(r, "gpuarr_to_dlpack_legacy", gpuarr_to_dlpack_legacy(a, &l)) != GPUARR_OK) {
            if (l) fz_die("gpuarr_to_dlpack_legacy failed but wrote *out");
            return;
        }
        if (how & 2) {
            l->deleter(l);
            return;
        }
        FZ_CALL(r, "gpuarr_from_dlpack_legacy", gpuarr_from_dlpack_legacy(l, &out));
        FZ_KEEP_OUT(r, "gpuarr_from_dlpack_legacy", out);
        if (r == GPUARR_OK) fz_alias_add(z, a.id, out.id), fz_adopt(z, out);
        return;
    }
    DLManagedTensorVersioned *m = NULL;
    if (how & 0x20) FZ_CALL(r, "gpuarr_to_dlpack_async", gpuarr_to_dlpack_async(a, fz_stream(z), flags, &m));
    else FZ_CALL(r, "gpuarr_to_dlpack", gpuarr_to_dlpack(a, flags, &m));
    if (r != GPUARR_OK) {
        if (m) fz_die("gpuarr_to_dlpack failed but wrote *out");
        return;
    }
    if (how & 2) {
        gpuarr_dlpack_capsule_destructor(m); /* not a Python process: must not touch m (ASan sees a double free) */
        m->deleter(m);
        return;
    }
    DLTensor *t = &m->dl_tensor;
    switch ((how >> 2) & 7) { /* 0..2: as it is */
    case 3: m->version.major = u8(z); break;
    case 4: t->dtype.lanes = (uint16_t)(u8(z) | 1u), t->dtype.code = u8(z) % 8; break;
    case 5: if (t->ndim > 0) t->strides[u8(z) % (unsigned)t->ndim] = (int64_t)(int8_t)u8(z); break;
    /* only lies gpuarr can see through: another device of the same backend (its context checks
       the memory), a device type it has no backend for, fewer elements; never a host address
       that is not one, or an offset past the end (a wrapped host pointer is taken on trust) */
    case 6:
        if (u8(z) & 1) t->device.device_type = (DLDeviceType)(5 + u8(z) % 16);
        else t->device.device_id = (int8_t)u8(z);
        break;
    case 7: t->ndim = (int32_t)(int8_t)u8(z) % 12; break;
    default: break;
    }
    FZ_CALL(r, "gpuarr_from_dlpack", gpuarr_from_dlpack(m, &out));
    FZ_KEEP_OUT(r, "gpuarr_from_dlpack", out);
    if (r == GPUARR_OK) fz_alias_add(z, a.id, out.id), fz_adopt(z, out);
}

/* The trace: started into /dev/null (or refused: NULL, empty, unwritable), stopped; one trace
   per process, so under the soak another thread's start or stop makes these fail, as they should. */
static void op_trace(fz *z) {
    gpuarr_result r;
    uint8_t how = u8(z);
    static const char *const paths[] = {"/dev/null", NULL, "", "/nonexistent-gpuarr-fuzz/trace.json"};
    if (how & 1) {
        if (FZ_CALL(r, "gpuarr_trace_start", gpuarr_trace_start(paths[(how >> 1) & 3])) == GPUARR_OK) z->tracing = true;
    } else if (FZ_CALL(r, "gpuarr_trace_stop", gpuarr_trace_stop()) == GPUARR_OK) {
        z->tracing = false;
    }
}

/* gpuarr_plan: up to 5 steps of any lists, needs (an unknown bit among them), memory; out written
   only on success, and then with devices that exist. */
static void op_plan(fz *z) {
    static const char *const lists[] = {NULL, "host", "opencl:*", "cuda:*", "host,opencl:0", "gpu", "any", "opencl:9", "gpus", "",
                                        "cuda,opencl", "opencl:1,host"};
    gpuarr_plan_step steps[5];
    gpuarr_device out[5];
    uint8_t how = u8(z);
    int count = (int)(u8(z) % 7) - 1;
    for (int i = 0; i < 5; i++) {
        uint8_t b = u8(z);
        steps[i].name = (b & 1) ? NULL : "step";
        steps[i].devices = lists[u8(z) % 12];
        steps[i].needs = (uint32_t)(b & 0x82) >> 1; /* GPUARR_NEED_FP64, or an unknown bit */
        steps[i].memory_bytes = (b & 4) ? u64(z) : (b & 8) ? (uint64_t)u16(z) << 20 : 0;
        out[i].id = FZ_SENTINEL;
    }
    gpuarr_result r;
    FZ_CALL(r, "gpuarr_plan", gpuarr_plan((how & 1) ? NULL : steps, count, (gpuarr_placement)((int)(u8(z) % 6) - 1), (how & 2) ? NULL : out));
    for (int i = 0; i < 5; i++) {
        gpuarr_device_info info;
        if (r != GPUARR_OK && out[i].id != FZ_SENTINEL) fz_die("gpuarr_plan failed but wrote out[%d]", i);
        if (r == GPUARR_OK && i < count && gpuarr_device_get_info(out[i], &info) != GPUARR_OK) fz_die("gpuarr_plan gave out[%d], not a device", i);
    }
}

/* Leases: acquire (never waiting: timeout 0), release, device, slots, the lease scope; and plans. */
static void op_lease(fz *z) {
    uint8_t how = u8(z);
    gpuarr_result r;
    int k = u8(z) % FZ_LEASES;
    switch (how % 6) {
    case 0:
    case 1: {
        static const char *const lists[] = {NULL, "host", "opencl:*", "cuda:*", "host,opencl:0", "gpu", "any", "opencl:9", "gpu0", "",
                                            "cuda,opencl", "host,,cuda:1", "local", "local:5,host"};
        static const char *const keys[] = {NULL, "a", "b", ""};
        gpuarr_lease_desc d;
        memset(&d, 0, sizeof d);
        uint8_t list = u8(z); /* 252, 253 (NULL, "host" a second time before): the local lists */
        d.devices = lists[list >= 252 && list <= 253 ? list - 240 : list % 12];
        d.placement = (gpuarr_placement)((int)(u8(z) % 6) - 1);
        d.slots = (int)(u8(z) % 5) - 1;
        d.affinity = keys[u8(z) % 4];
        d.memory_bytes = (how & 0x40) ? u64(z) : 0;
        if (how & 0x80) { /* the scope form: left at the end of the input or by op_scope */
            if (z->nscope == FZ_SCOPES) return;
            gpuarr_scope s = gpuarr_scope_enter_lease(&d);
            fz_ok_or_error(s.result, "gpuarr_scope_enter_lease");
            if (s.active) z->scope[z->nscope++] = s;
            return;
        }
        if (z->lease[k].id) return;
        gpuarr_lease l = {FZ_SENTINEL};
        FZ_CALL(r, "gpuarr_lease_acquire", gpuarr_lease_acquire(&d, (how & 0x20) ? NULL : &l));
        FZ_KEEP_OUT(r, "gpuarr_lease_acquire", l);
        if (r == GPUARR_OK) z->lease[k] = l;
        break;
    }
    case 2: {
        uint32_t ids[FZ_LEASES];
        for (int i = 0; i < FZ_LEASES; i++) ids[i] = z->lease[i].id;
        gpuarr_lease l = {fz_pick_id(z, ids, FZ_LEASES)};
        FZ_CALL(r, "gpuarr_lease_release", gpuarr_lease_release(l));
        for (int i = 0; r == GPUARR_OK && i < FZ_LEASES; i++)
            if (z->lease[i].id == l.id) z->lease[i].id = 0;
        if (r == GPUARR_OK) fz_stale_add(z, l.id);
        break;
    }
    case 3: {
        if (how & 0x40) { /* plans (PLANS) */
            op_plan(z);
            break;
        }
        uint32_t ids[FZ_LEASES];
        for (int i = 0; i < FZ_LEASES; i++) ids[i] = z->lease[i].id;
        gpuarr_lease l = {fz_pick_id(z, ids, FZ_LEASES)};
        gpuarr_device d = {FZ_SENTINEL};
        FZ_CALL(r, "gpuarr_lease_device", gpuarr_lease_device(l, (how & 0x80) ? NULL : &d));
        FZ_KEEP_OUT(r, "gpuarr_lease_device", d);
        break;
    }
    case 4: {
        if (how & 0x20) {
            size_t len = u16(z) % 512;
            char *buf = (how & 0x10) && !len ? NULL : (char *)fz_alloc(z, len);
            FZ_CALL(r, "gpuarr_lease_summary", gpuarr_lease_summary(fz_dev(z), buf, len));
            if (r == GPUARR_OK && !memchr(buf, '\0', len)) fz_die("gpuarr_lease_summary: not NUL-terminated within len");
            break;
        }
        int total = -7, in_use = -7;
        FZ_CALL(r, "gpuarr_device_get_slots",
                gpuarr_device_get_slots(fz_dev(z), (how & 0x80) ? NULL : &total, (how & 0x40) ? NULL : &in_use));
        if (r == GPUARR_OK && (total < 1 || in_use < 0 || in_use > total)) fz_die("gpuarr_device_get_slots: %d of %d in use", in_use, total);
        break;
    }
    default: {
        if (fz_soak) break; /* process-wide: not from the soak's threads */
        int i = u8(z) % FZ_DEVICES, slots = (int)(u8(z) % 6) - 1, total, in_use;
        if (!z->dev[i].id) break;
        if (!z->slots_saved[i] && gpuarr_device_get_slots(z->dev[i], &total, &in_use) == GPUARR_OK) z->slots_saved[i] = total;
        FZ_CALL(r, "gpuarr_device_set_slots", gpuarr_device_set_slots(z->dev[i], slots));
        break;
    }
    }
}

/* Transfer estimates (TRANSFER MODEL): from an array or a device, dtypes valid and not, bytes
   0, within, at and past the array's end, seconds NULL; the summary into odd lengths (NULL with
   len 0). A first estimate of a pair fits its model (a few 16 MiB copies, once per process and
   pair). gpuarr_calibrate takes seconds: a bad handle any time, a real device at most once per
   process. seconds is written only on success, and then finite and >= 0. */
static void op_transfer(fz *z) {
    static int calibrated; /* atomic: the soak's threads share it */
    uint8_t how = u8(z);
    gpuarr_result r = GPUARR_OK;
    double s = -7.0;
    gpuarr_dtype t = fz_dtype(z);
    const char *api = "gpuarr_transfer_estimate_array";
    switch (how % 4) {
    case 0: {
        gpuarr_array a = fz_arr(z);
        gpuarr_array_info info;
        uint64_t bytes = (how & 0x10) ? u64(z) : (uint64_t)u16(z);
        if ((how & 0x20) && gpuarr_array_get_info(a, &info) == GPUARR_OK) bytes = info.nbytes + ((how & 0x40) ? 1u : 0u);
        FZ_CALL(r, api, gpuarr_transfer_estimate(a, fz_dev(z), t, bytes, (how & 0x80) ? NULL : &s));
        break;
    }
    case 1: {
        api = "gpuarr_transfer_estimate_device";
        gpuarr_device src = fz_dev(z), dst = fz_dev(z);
        uint64_t bytes = (how & 0x10) ? u64(z) : (uint64_t)u32(z) % (32u << 20);
        FZ_CALL(r, api, gpuarr_transfer_estimate(src, dst, t, bytes, (how & 0x80) ? NULL : &s));
        break;
    }
    case 2: {
        size_t len = u16(z) % 600;
        char *buf = (how & 0x10) && !len ? NULL : (char *)fz_alloc(z, len);
        FZ_CALL(r, "gpuarr_transfer_models_summary", gpuarr_transfer_models_summary(buf, len));
        if (r == GPUARR_OK && !memchr(buf, '\0', len)) fz_die("gpuarr_transfer_models_summary: not NUL-terminated within len");
        return;
    }
    default: {
        gpuarr_device d = fz_dev(z);
        gpuarr_device_info info;
        bool real = gpuarr_device_get_info(d, &info) == GPUARR_OK;
        if (real && __atomic_exchange_n(&calibrated, 1, __ATOMIC_RELAXED)) return;
        FZ_CALL(r, "gpuarr_calibrate", gpuarr_calibrate(d));
        return;
    }
    }
    if (r != GPUARR_OK && s != -7.0) fz_die("%s failed but wrote seconds (%g)", api, s);
    if (r == GPUARR_OK && !(s >= 0 && s < 1e300)) fz_die("%s: %g seconds", api, s);
}

/* ---- MPI (the manual's MPI section): a singleton MPI job (fz_start's MPI_Init_thread), so every
   transfer goes from this rank to itself. Each thread has its own communicator (fz_comms, a dup
   of MPI_COMM_SELF), where leftovers of failed transfers are drained at the end of the input;
   MPI_COMM_SELF and MPI_COMM_WORLD (shared by the soak's threads) and MPI_COMM_NULL come up too,
   but never in a collective (MPI forbids concurrent collectives on one comm). A receive that no
   send matches gives up after GPUARR_MPI_TIMEOUT_MS (fz_start: 200 ms). ---- */
static _Thread_local int fz_thread __attribute__((unused)); /* 0; the soak's thread t sets 1 + t (read by the MPI part) */
#ifdef GPUARR_MPI
#define FZ_COMMS 9 /* [0] the fuzzer's and the replay's thread, [1 + t] the soak's thread t */
static MPI_Comm fz_comms[FZ_COMMS];
static _Thread_local uint32_t fz_tag_count;

static MPI_Comm fz_own_comm(void) { return fz_comms[fz_thread % FZ_COMMS]; }
/* a tag no other thread uses and no chaos op (tags 0..7) sends with: 1000 + 2^24 per thread */
static int fz_fresh_tag(void) { return 1000 + fz_thread * (1 << 24) + (int)(fz_tag_count++ % (1u << 24)); }

static MPI_Comm fz_mpi_comm(fz *z, bool collective) {
    uint8_t b = u8(z);
    if (b < 0xd0) return fz_own_comm();
    if (b < 0xe0) return MPI_COMM_NULL;
    if (collective) return fz_own_comm();
    return (b & 1) ? MPI_COMM_SELF : MPI_COMM_WORLD;
}
static int fz_mpi_rank(fz *z) {
    uint8_t b = u8(z);
    if (b < 0xc0) return 0;
    switch (b & 7) {
    case 0: return MPI_PROC_NULL;
    case 1: return MPI_ANY_SOURCE; /* a send must refuse it */
    case 2: return 1;              /* outside a one-rank comm */
    case 3: return -7;
    case 4: return INT_MAX;
    case 5: return (int)u32(z);
    default: return 0;
    }
}
static int fz_mpi_tag(fz *z) {
    uint8_t b = u8(z);
    if (b < 0xc0) return b & 7;
    switch (b & 3) {
    case 0: return MPI_ANY_TAG; /* a send must refuse it */
    case 1: return -1;
    case 2: return INT_MAX; /* Open MPI's MPI_TAG_UB: valid */
    default: return (int)u32(z);
    }
}
/* elements [first, first + count): mostly within the array (count -1 now and then), else anything */
static void fz_mpi_range(fz *z, gpuarr_array a, int64_t *first, int64_t *count) {
    gpuarr_array_info info;
    uint8_t b = u8(z);
    int64_t n = fz_info(a, &info) ? info.count : 0;
    if (b >= 0xf0) {
        *first = (int64_t)u64(z);
        *count = (int64_t)u64(z);
        return;
    }
    *first = n ? (int64_t)(u16(z) % (uint64_t)(n + 1)) : 0;
    *count = (b & 3) == 0 ? -1 : (int64_t)(u16(z) % (uint64_t)(n - *first + 1));
}
/* A wait on a request of ours: it finds the request (and sets it to {0}) whatever the transfer's
   result, which may be GPUARR_ERROR_INVALID_HANDLE too (an inner call's); one it does not find
   it leaves. Under the soak another thread's wait on a forged id may have taken ours. */
static void fz_mpi_waited(gpuarr_result r, uint32_t after, uint32_t id) {
    if (!after) return;
    if (r != GPUARR_ERROR_INVALID_HANDLE) fz_die("gpuarr_mpi_wait (%s) left its request 0x%x", gpuarr_result_name(r), after);
    if (!fz_soak) fz_die("gpuarr_mpi_wait: the pending request 0x%x was not found", id);
}
static void fz_mstale_add(fz *z, uint32_t id) {
    if (z->nmstale < FZ_STALE) z->mstale[z->nmstale++] = id;
    else z->mstale[id % FZ_STALE] = id;
}
static int fz_mreq_slot(fz *z) { /* a free request slot; the oldest waited for when none is */
    for (int i = 0; i < FZ_MREQS; i++)
        if (!z->mreq[i]) return i;
    gpuarr_mpi_request q = {z->mreq[0]};
    gpuarr_result r;
    FZ_CALL(r, "gpuarr_mpi_wait", gpuarr_mpi_wait(&q));
    fz_mpi_waited(r, q.id, z->mreq[0]);
    fz_mstale_add(z, z->mreq[0]);
    z->mreq[0] = 0;
    return 0;
}
static bool fz_mreq_pending(const fz *z) {
    for (int i = 0; i < FZ_MREQS; i++)
        if (z->mreq[i]) return true;
    return false;
}

/* A transfer from a to b through this rank's own comm on a fresh tag: when both ranges and the
   dtypes agree, a success must have moved a's elements into b's; when they disagree it must fail. */
static void fz_mpi_checked(fz *z) {
    gpuarr_array a = fz_arr(z), b = fz_arr(z);
    int64_t sf, sc, rf, rc;
    fz_mpi_range(z, a, &sf, &sc);
    fz_mpi_range(z, b, &rf, &rc);
    uint8_t how = u8(z);
    gpuarr_array_info ai, bi;
    bool known = fz_info(a, &ai) && fz_info(b, &bi);
    gpuarr_dtype sent = (how & 1) && known ? ai.dtype : (how & 2) ? fz_dtype(z) : GPUARR_DTYPE_INVALID;
    int tag = fz_fresh_tag();
    MPI_Comm comm = fz_own_comm();
    bool valid = known && sf >= 0 && sf <= ai.count && sc >= -1 && (sc < 0 || sc <= ai.count - sf) && rf >= 0 &&
                 rf <= bi.count && rc >= -1 && (rc < 0 || rc <= bi.count - rf) && !bi.read_only;
    int64_t n_sent = valid ? (sc < 0 ? ai.count - sf : sc) : 0, n_recv = valid ? (rc < 0 ? bi.count - rf : rc) : 0;
    gpuarr_dtype wire = sent ? sent : known ? bi.dtype : GPUARR_DTYPE_INVALID;
    bool agree = valid && n_sent == n_recv && wire == ai.dtype;
    /* the bytes are compared only where nothing else can write b: no pending transfer of this
       thread, a and b not sharing memory, no cast */
    bool compare = agree && !fz_mreq_pending(z) && a.id != b.id && !ai.is_view && !bi.is_view && !ai.wrapped && !bi.wrapped &&
                   !fz_aliased(z, a.id) && !fz_aliased(z, b.id) && ai.dtype == bi.dtype;
    unsigned char *expect = compare ? fz_read_all(z, a, &ai) : NULL;
    gpuarr_result r;
    if (how & 4) {
        FZ_CALL(r, "gpuarr_mpi_sendrecv", gpuarr_mpi_sendrecv(a, sf, sc, 0, tag, b, rf, rc, sent, 0, tag, comm));
    } else { /* the receive posted first, then a blocking send, then the wait */
        gpuarr_mpi_request q = {0};
        gpuarr_result rs;
        if (FZ_CALL(r, "gpuarr_mpi_irecv", gpuarr_mpi_irecv(b, rf, rc, sent, 0, tag, comm, &q)) != GPUARR_OK) {
            if (q.id) fz_die("gpuarr_mpi_irecv failed but wrote its request");
            return;
        }
        if (!q.id) fz_die("gpuarr_mpi_irecv succeeded with the request {0}");
        FZ_CALL(rs, "gpuarr_mpi_send", gpuarr_mpi_send(a, sf, sc, 0, tag, comm));
        FZ_CALL(r, "gpuarr_mpi_wait", gpuarr_mpi_wait(&q));
        /* under the soak another thread's wait on a forged id may have taken it */
        fz_mpi_waited(r, q.id, q.id);
        if (rs != GPUARR_OK && r == GPUARR_OK) fz_die("gpuarr_mpi_send failed (%s) but its receive succeeded", gpuarr_result_name(rs));
    }
    if (r == GPUARR_OK && valid && !agree)
        fz_die("a transfer of %lld elements of %s was received as %lld of %s", (long long)n_sent, gpuarr_dtype_name(ai.dtype),
               (long long)n_recv, gpuarr_dtype_name(wire));
    if (r != GPUARR_OK || !expect || !n_sent) return;
    unsigned char *got = fz_read_all(z, b, &bi);
    if (got && memcmp(got + (size_t)rf * bi.itemsize, expect + (size_t)sf * ai.itemsize, (size_t)n_sent * ai.itemsize) != 0) {
        char w1[160], w2[160];
        fz_die("gpuarr_mpi: elements [%lld, +%lld) of %s arrived other than sent from [%lld, +%lld) of %s", (long long)rf,
               (long long)n_sent, fz_where(&bi, w1, sizeof w1), (long long)sf, (long long)n_sent, fz_where(&ai, w2, sizeof w2));
    }
}

/* allreduce over a one-rank comm leaves every element as it was (f16 and bf16 go through f32:
   a NaN may come back another NaN; bool is not compared: its bytes other than 0 and 1 are the
   caller's fault) */
static bool fz_half_is_nan(gpuarr_dtype t, const unsigned char *p) {
    uint16_t bits;
    memcpy(&bits, p, 2);
    float f = t == GPUARR_F16 ? gpuarr_f16_to_float((gpuarr_f16){bits}) : gpuarr_bf16_to_float((gpuarr_bf16){bits});
    return f != f;
}
static void fz_mpi_allreduce(fz *z) {
    gpuarr_array a = fz_arr(z);
    uint8_t how = u8(z);
    gpuarr_mpi_op op = (how & 0xc0) == 0xc0 ? (gpuarr_mpi_op)(int8_t)u8(z) : (gpuarr_mpi_op)(how % 3);
    MPI_Comm comm = fz_mpi_comm(z, true);
    gpuarr_array_info info;
    bool compare = fz_info(a, &info) && comm != MPI_COMM_NULL && !fz_mreq_pending(z) && info.dtype != GPUARR_BOOL;
    unsigned char *before = compare ? fz_read_all(z, a, &info) : NULL;
    gpuarr_result r;
    FZ_CALL(r, "gpuarr_mpi_allreduce", gpuarr_mpi_allreduce(a, op, comm));
    if (r == GPUARR_OK && ((int)op < 0 || op >= GPUARR_MPI_OP_COUNT)) fz_die("gpuarr_mpi_allreduce took op %d", (int)op);
    if (r == GPUARR_OK && comm == MPI_COMM_NULL) fz_die("gpuarr_mpi_allreduce took MPI_COMM_NULL");
    if (r != GPUARR_OK || !before) return;
    unsigned char *after = fz_read_all(z, a, &info);
    if (!after) return;
    bool half = info.dtype == GPUARR_F16 || info.dtype == GPUARR_BF16;
    for (int64_t i = 0; i < info.count; i++) {
        const unsigned char *x = before + (size_t)i * info.itemsize, *y = after + (size_t)i * info.itemsize;
        if (!memcmp(x, y, info.itemsize)) continue;
        if (half && fz_half_is_nan(info.dtype, x) && fz_half_is_nan(info.dtype, y)) continue;
        char w[160];
        fz_die("gpuarr_mpi_allreduce (op %d) over one rank changed element %lld of %s", (int)op, (long long)i, fz_where(&info, w, sizeof w));
    }
}

static void op_mpi(fz *z) {
    uint8_t how = u8(z);
    gpuarr_result r;
    switch (how % 8) {
    case 0: case 1: { /* isend / irecv, any arguments; the request kept */
        bool send = how % 8 == 0;
        gpuarr_array a = fz_arr(z);
        int64_t first, count;
        fz_mpi_range(z, a, &first, &count);
        gpuarr_dtype sent = (how & 0x10) ? fz_dtype(z) : GPUARR_DTYPE_INVALID;
        int peer = fz_mpi_rank(z);
        int tag = fz_mpi_tag(z);
        MPI_Comm comm = fz_mpi_comm(z, false);
        int k = fz_mreq_slot(z);
        gpuarr_mpi_request q = {FZ_SENTINEL};
        gpuarr_mpi_request *qp = (how & 0xe0) == 0xe0 ? NULL : &q;
        const char *api = send ? "gpuarr_mpi_isend" : "gpuarr_mpi_irecv";
        if (send) FZ_CALL(r, api, gpuarr_mpi_isend(a, first, count, peer, tag, comm, qp));
        else FZ_CALL(r, api, gpuarr_mpi_irecv(a, first, count, sent, peer, tag, comm, qp));
        if (r != GPUARR_OK && q.id != FZ_SENTINEL) fz_die("%s failed but wrote its request", api);
        if (r == GPUARR_OK && !qp) fz_die("%s took req NULL", api);
        if (r == GPUARR_OK && (comm == MPI_COMM_NULL || (send && (peer == MPI_ANY_SOURCE || tag == MPI_ANY_TAG)) || tag < MPI_ANY_TAG))
            fz_die("%s took comm %s, peer %d, tag %d", api, comm == MPI_COMM_NULL ? "MPI_COMM_NULL" : "live", peer, tag);
        if (r == GPUARR_OK) z->mreq[k] = q.id;
        break;
    }
    case 2: { /* wait: a kept request, {0}, a stale or forged id, NULL */
        uint8_t b = u8(z);
        int k = b % FZ_MREQS;
        gpuarr_mpi_request q = {z->mreq[k]};
        bool own = true;
        if (b >= 0xc0) {
            q.id = (b & 0x20) ? (z->nmstale ? z->mstale[b % z->nmstale] : 0) : fz_forged(z, z->mreq[k]);
            own = false;
            for (int i = 0; i < FZ_MREQS; i++)
                if (q.id && z->mreq[i] == q.id) k = i, own = true; /* an id of ours after all */
        }
        if ((b & 0x30) == 0x30 && b >= 0xc0) {
            if (FZ_CALL(r, "gpuarr_mpi_wait", gpuarr_mpi_wait(NULL)) != GPUARR_ERROR_INVALID_ARGUMENT) fz_die("gpuarr_mpi_wait(NULL) gave %s", gpuarr_result_name(r));
            break;
        }
        uint32_t id = q.id;
        FZ_CALL(r, "gpuarr_mpi_wait", gpuarr_mpi_wait(&q));
        if (!id) {
            if (r != GPUARR_OK) fz_die("gpuarr_mpi_wait of {0} failed");
            break;
        }
        if (q.id) { /* not found: refused, and the request left as it was */
            if (r != GPUARR_ERROR_INVALID_HANDLE || q.id != id) fz_die("gpuarr_mpi_wait (%s) changed 0x%x to 0x%x", gpuarr_result_name(r), id, q.id);
            if (own && !fz_soak) fz_die("gpuarr_mpi_wait: the pending request 0x%x was not found", id);
            break;
        }
        if (!own && !fz_soak) fz_die("gpuarr_mpi_wait took 0x%x, which is no pending request", id);
        if (own && id) {
            fz_mstale_add(z, id);
            z->mreq[k] = 0;
        }
        break;
    }
    case 3: case 4: { /* blocking send / receive, any arguments */
        gpuarr_array a = fz_arr(z);
        int64_t first, count;
        fz_mpi_range(z, a, &first, &count);
        int peer = fz_mpi_rank(z);
        int tag = fz_mpi_tag(z);
        MPI_Comm comm = fz_mpi_comm(z, false);
        if (how % 8 == 3) FZ_CALL(r, "gpuarr_mpi_send", gpuarr_mpi_send(a, first, count, peer, tag, comm));
        else FZ_CALL(r, "gpuarr_mpi_recv", gpuarr_mpi_recv(a, first, count, (how & 0x10) ? fz_dtype(z) : GPUARR_DTYPE_INVALID, peer, tag, comm));
        if (r == GPUARR_OK && comm == MPI_COMM_NULL) fz_die("a blocking gpuarr_mpi call took MPI_COMM_NULL");
        break;
    }
    case 5: case 6: fz_mpi_checked(z); break;
    default:
        if (how & 0x10) {
            fz_mpi_allreduce(z);
            break;
        }
        gpuarr_device d = {FZ_SENTINEL}, local = {0};
        MPI_Comm comm = fz_mpi_comm(z, true);
        FZ_CALL(r, "gpuarr_mpi_device", gpuarr_mpi_device(comm, (how & 0x20) ? NULL : &d));
        if (r != GPUARR_OK && d.id != FZ_SENTINEL) fz_die("gpuarr_mpi_device failed but wrote its device");
        if (r == GPUARR_OK && (how & 0x20)) fz_die("gpuarr_mpi_device took out NULL");
        if (r == GPUARR_OK && gpuarr_device_find("local:0", &local) == GPUARR_OK && local.id != d.id)
            fz_die("gpuarr_mpi_device on one rank gave device 0x%x, \"local:0\" is 0x%x", d.id, local.id);
        break;
    }
}

/* the end of an input: every request waited for, the leftovers of failed transfers taken off
   the comms, then one call that moves transfers, so that memory MPI let go of since goes back
   to the pools (the manual: "kept until a later gpuarr_mpi call"). */
static void fz_mpi_drain(MPI_Comm comm) {
    for (;;) {
        int flag = 0, bytes = 0;
        MPI_Status st;
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &flag, &st);
        if (!flag) return;
        MPI_Get_count(&st, MPI_BYTE, &bytes);
        void *buf = malloc(bytes > 0 ? (size_t)bytes : 1);
        if (!buf) fz_die("out of host memory");
        MPI_Recv(buf, bytes, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, comm, MPI_STATUS_IGNORE);
        free(buf);
    }
}
static void fz_mpi_cleanup(fz *z) {
    gpuarr_result r;
    for (int i = 0; i < FZ_MREQS; i++) {
        if (!z->mreq[i]) continue;
        gpuarr_mpi_request q = {z->mreq[i]};
        FZ_CALL(r, "gpuarr_mpi_wait", gpuarr_mpi_wait(&q));
        fz_mpi_waited(r, q.id, z->mreq[i]);
        z->mreq[i] = 0;
    }
    if (fz_soak) {
        fz_mpi_drain(fz_own_comm());
        return;
    }
    for (int i = 0; i < FZ_COMMS; i++) fz_mpi_drain(fz_comms[i]);
    fz_mpi_drain(MPI_COMM_SELF);
    fz_mpi_drain(MPI_COMM_WORLD);
    static unsigned char byte; /* wrapped: no pool memory, which a limit or fault could refuse */
    gpuarr_array one;
    gpuarr_mpi_request q = {0};
    if (gpuarr_wrap_host(&byte, GPUARR_U8, 0, NULL, NULL, NULL, &one) != GPUARR_OK) fz_die("gpuarr_wrap_host: %s", gpuarr_last_error());
    if (gpuarr_mpi_isend(one, 0, -1, MPI_PROC_NULL, 0, MPI_COMM_SELF, &q) != GPUARR_OK || gpuarr_mpi_wait(&q) != GPUARR_OK)
        fz_die("a send to MPI_PROC_NULL: %s", gpuarr_last_error());
    if (gpuarr_release(one) != GPUARR_OK) fz_die("gpuarr_release");
}

static void fz_mpi_start(void) {
    int provided = 0;
    /* Open MPI's start puts its own handlers on these signals (a stack trace, then _exit), over
       libFuzzer's and ASan's, and a crash would leave no crash file: theirs are put back */
    static const int sigs[] = {SIGABRT, SIGBUS, SIGFPE, SIGILL, SIGSEGV};
    struct sigaction saved[sizeof sigs / sizeof sigs[0]];
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaction(sigs[i], NULL, &saved[i]);
#ifdef FZ_LSAN
    __lsan_disable(); /* what Open MPI's start allocates and never frees is not gpuarr's leak */
#endif
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS || provided < MPI_THREAD_MULTIPLE)
        fz_die("MPI_Init_thread: MPI_THREAD_MULTIPLE not provided (%d)", provided);
    for (int i = 0; i < FZ_COMMS; i++) MPI_Comm_dup(MPI_COMM_SELF, &fz_comms[i]);
#ifdef FZ_LSAN
    __lsan_enable();
#endif
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) sigaction(sigs[i], &saved[i], NULL);
    /* never finalized: MPI_Finalize frees part of Open MPI's state, and LeakSanitizer then reports
       the rest, which it cannot tell apart by library (Debian's Open MPI has no frame pointers) */
    setenv("GPUARR_MPI_TIMEOUT_MS", "200", 0);
    setenv("GPUARR_MPI_CHUNK", "4K", 0); /* 64 KiB arrays: up to 16 chunks */
}
#else
static void op_mpi(fz *z) { (void)u8(z); }
static void fz_mpi_cleanup(fz *z) { (void)z; }
static void fz_mpi_start(void) {}
#endif

/* ---- tasks, gpuarr_offload, gpuarr_map (OFFLOAD): the task lives within the op ---- */
static gpuarr_result fz_widen(const gpuarr_array *in, int n_in, gpuarr_array *out, int n_out, gpuarr_stream s, void *user) {
    (void)n_in, (void)n_out;
    if (user) return gpuarr_set_error(GPUARR_ERROR_BACKEND, "fz_widen fails %s", "on purpose"); /* the failing variant */
    return gpuarr_convert_async(in[0], gpuarr_current_device(), GPUARR_F64, s, &out[0]);
}
#include <tgmath.h> /* a file with kernels: float math as on the devices */
/* a kernel task's kernel: a scalar, an input, an output (and the INOUT refused in a task) */
GPUARR_KERNEL(fz_scale, (GPUARR_SCALAR(float, a), GPUARR_IN(float, x), GPUARR_OUT(double, y)), {
    int64_t i = gpuarr_index(0);
    y[i] = (double)(a * x[i]);
})
GPUARR_KERNEL(fz_acc, (GPUARR_IN(float, x), GPUARR_INOUT(float, y)), { y[gpuarr_index(0)] += x[gpuarr_index(0)]; })

static bool fz_task(fz *z, gpuarr_task *t) {
    static const char *const names[] = {NULL, "", "fz", "bad name", "fz.task-1", "a/b",
                                        "0123456789012345678901234567890123456789012345678901234567890123"};
    gpuarr_task_desc td;
    memset(&td, 0, sizeof td);
    uint8_t how = u8(z);
    td.name = names[u8(z) % 7];
    td.n_in = (how & 1) ? (int)(u8(z) % 11) - 1 : 1;
    td.n_out = (how & 2) ? (int)(u8(z) % 11) - 1 : 1;
    if (how & 4) td.in_dtype[u8(z) % 8] = (gpuarr_dtype)(int8_t)u8(z);
    uint8_t impl = u8(z);
    for (int b = 0; b < GPUARR_BACKEND_COUNT; b++)
        if (impl & (1u << b)) td.impl[b] = fz_widen;
    td.user_data = (how & 8) ? z : NULL;
    float a = 2.0f;
    if (how & 0x40) { /* a kernel task (k & 8: the impl bits above kept, an error) */
        uint8_t k = u8(z);
        if (!(k & 8)) memset(td.impl, 0, sizeof td.impl);
        td.kernel = (k & 1) ? &fz_acc_gpuarr_kernel : &fz_scale_gpuarr_kernel;
        td.kernel_scalars[(k >> 1) % 4 == 3 ? u8(z) % GPUARR_KERNEL_MAX_PARAMS : 0] = (k & 2) ? NULL : &a;
        if (k & 4) td.n_in = td.n_out = 0;
    }
    if (how & 0x80) { /* gpuarr_set_error: the caller's words for an error result, else INVALID_ARGUMENT */
        gpuarr_result code = (gpuarr_result)(int8_t)u8(z), got = gpuarr_set_error(code, "%s", "fz");
        bool error = (int)code < 0 && (int)code > -GPUARR_RESULT_COUNT;
        if (error ? got != code || strcmp(gpuarr_last_error(), "fz") != 0
                  : got != GPUARR_ERROR_INVALID_ARGUMENT || strncmp(gpuarr_last_error(), "gpuarr_set_error: ", 18) != 0)
            fz_die("gpuarr_set_error(%d) = %s: \"%s\"", (int)code, gpuarr_result_name(got), gpuarr_last_error());
    }
    gpuarr_task out = {FZ_SENTINEL};
    gpuarr_result r;
    FZ_CALL(r, "gpuarr_task_create", gpuarr_task_create((how & 0x10) ? NULL : &td, (how & 0x20) ? NULL : &out));
    FZ_KEEP_OUT(r, "gpuarr_task_create", out);
    *t = out;
    return r == GPUARR_OK;
}

static void fz_offload_desc(fz *z, gpuarr_offload_desc *d, gpuarr_device *ran) {
    static const char *const lists[] = {NULL, "host", "all", "opencl:*", "host,opencl:0", "gpu", "any", "opencl:9", "", "cuda,host"};
    memset(d, 0, sizeof *d);
    uint8_t how = u8(z);
    d->devices = lists[u8(z) % 10];
    d->policy = (gpuarr_offload_policy)((int)(u8(z) % 6) - 1);
    if (how & 1) d->out_device = fz_dev(z);
    if (how & 2) d->out_dtype = (gpuarr_dtype)(int8_t)u8(z);
    if (how & 4) d->streams = (int)(u8(z) % 20) - 1;
    if (how & 0x10) d->item_devices = ran;
    /* a lease of this input, or (the soak) of another thread's, could make the call wait for ever */
    bool holds = z->nscope > 0 || fz_soak;
    for (int i = 0; i < FZ_LEASES; i++) holds |= z->lease[i].id != 0;
    d->lease = (how & 8) && !holds;
}

static void op_offload(fz *z) {
    gpuarr_task t;
    bool made = fz_task(z, &t);
    uint8_t how = u8(z);
    if (!made) t.id = (how & 1) ? fz_forged(z, 0) : 0;
    gpuarr_offload_desc d;
    gpuarr_device ran[3]; /* item_devices: n < 4 items */
    for (int i = 0; i < 3; i++) ran[i].id = FZ_SENTINEL;
    fz_offload_desc(z, &d, ran);
    gpuarr_result r;
    gpuarr_array in[3 * 8], out[3 * 8]; /* gpuarr_map: n (< 4) items of up to 8 inputs and 8 outputs */
    int n = (int)(u8(z) % 4);
    uint8_t own = u8(z); /* bit i: in[i] a small host array of the op's own, else one of the input's handles */
    bool owned[3];
    for (int i = 0; i < 3; i++) {
        int64_t count = u8(z) % 64;
        owned[i] = (own & (1u << i)) && gpuarr_zeros(gpuarr_host(), GPUARR_F32, 1, &count, &in[i]) == GPUARR_OK;
        if (!owned[i]) in[i] = fz_arr(z);
    }
    for (int i = 0; i < 3 * 8; i++) {
        if (i >= 3) in[i] = in[i % 3];
        out[i].id = FZ_SENTINEL;
    }
    if (how & 2) {
        gpuarr_device on = {FZ_SENTINEL};
        FZ_CALL(r, "gpuarr_offload", gpuarr_offload(t, (how & 4) ? NULL : in, n, (how & 8) ? NULL : out, 1, (how & 0x10) ? NULL : &d, &on));
        FZ_KEEP_OUT(r, "gpuarr_offload", on);
        FZ_KEEP_OUT(r, "gpuarr_offload", out[0]);
        if (r == GPUARR_OK) fz_ok_or_error(gpuarr_release(out[0]), "gpuarr_release");
    } else {
        int failed = -7;
        FZ_CALL(r, "gpuarr_map", gpuarr_map(t, (how & 4) ? NULL : in, n, (how & 8) ? NULL : out, (how & 0x10) ? NULL : &d, &failed));
        for (int i = 0; i < 3 * 8 && !(how & 8); i++) {
            if (r != GPUARR_OK && out[i].id != FZ_SENTINEL && out[i].id != 0) fz_die("gpuarr_map failed but left out[%d]", i);
            if (r == GPUARR_OK && out[i].id != FZ_SENTINEL) fz_ok_or_error(gpuarr_release(out[i]), "gpuarr_release");
        }
        if (r == GPUARR_OK ? failed != -7 : failed != -7 && (failed < 0 || failed >= n))
            fz_die("gpuarr_map: failed_item %d with %s", failed, gpuarr_result_name(r));
        for (int i = 0; i < 3 && d.item_devices; i++)
            if ((r == GPUARR_OK && i < n) != (ran[i].id != FZ_SENTINEL))
                fz_die("gpuarr_map (%s, %d items): item_devices[%d] %s", gpuarr_result_name(r), n, i, ran[i].id != FZ_SENTINEL ? "written" : "not written");
    }
    gpuarr_task_stats st;
    FZ_CALL(r, "gpuarr_task_get_stats", gpuarr_task_get_stats(t, fz_dev(z), (how & 0x20) ? NULL : &st));
    if (how & 0x40) {
        size_t len = u16(z) % 512;
        char *buf = (how & 0x80) && !len ? NULL : (char *)fz_alloc(z, len);
        FZ_CALL(r, "gpuarr_task_models_summary", gpuarr_task_models_summary(buf, len));
        if (r == GPUARR_OK && !memchr(buf, '\0', len)) fz_die("gpuarr_task_models_summary: not NUL-terminated within len");
    }
    for (int i = 0; i < 3; i++)
        if (owned[i]) fz_ok_or_error(gpuarr_release(in[i]), "gpuarr_release"); /* the input's handles are not ours */
    if (made) fz_ok_or_error(gpuarr_task_destroy(t), "gpuarr_task_destroy");
    FZ_CALL(r, "gpuarr_task_destroy", gpuarr_task_destroy(t)); /* again: destroyed already, or never made */
    if (r == GPUARR_OK) fz_die("gpuarr_task_destroy took a task twice");
}

/* ---- portable kernels (KERNELS): launches through the typed launchers (any shape, any
   stream, the input's arrays or arrays of their own), gpuarr_kernel_launch with arguments and
   descriptions it must refuse, builds, build logs and gpuarr_reduce ---- */
/* Each body bounds its flattened index by n, the fewest elements of its arrays: a launch of any
   shape stays inside them. */
GPUARR_KERNEL(fz_kaxpy, (GPUARR_SCALAR(int64_t, n), GPUARR_SCALAR(float, a), GPUARR_IN(float, x), GPUARR_INOUT(float, y)), {
    int64_t i = gpuarr_index(0) + gpuarr_size(0) * (gpuarr_index(1) + gpuarr_size(1) * gpuarr_index(2));
    if (i >= n) return;
    y[i] = a * x[i] + y[i];
})
GPUARR_KERNEL(fz_kwiden, (GPUARR_SCALAR(int64_t, n), GPUARR_IN(uint8_t, x), GPUARR_OUT(int32_t, y)), {
    int64_t i = gpuarr_index(0) + gpuarr_size(0) * (gpuarr_index(1) + gpuarr_size(1) * gpuarr_index(2));
    if (i >= n) return;
    y[i] = (int32_t)x[i] * 3 - 7;
})
GPUARR_KERNEL(fz_khalf, (GPUARR_SCALAR(int64_t, n), GPUARR_SCALAR(gpuarr_bf16, s), GPUARR_IN(gpuarr_f16, x), GPUARR_OUT(gpuarr_bf16, y)), {
    int64_t i = gpuarr_index(0) + gpuarr_size(0) * (gpuarr_index(1) + gpuarr_size(1) * gpuarr_index(2));
    if (i >= n) return;
    gpuarr_store_bf16(y, i, gpuarr_load_f16(x, i) * gpuarr_load_bf16(&s, 0));
})
/* doubles: UNSUPPORTED where fp64 is off (an input's GPUARR_OPENCL_FP64=off) */
GPUARR_KERNEL(fz_kf64, (GPUARR_SCALAR(int64_t, n), GPUARR_INOUT(double, y)), {
    int64_t i = gpuarr_index(0) + gpuarr_size(0) * (gpuarr_index(1) + gpuarr_size(1) * gpuarr_index(2));
    if (i >= n) return;
    y[i] = sqrt(fabs(y[i])) * 0.5 + 1.0;
})
/* C but neither OpenCL C nor CUDA C++ (`private` is their keyword): GPUARR_ERROR_BUILD there */
GPUARR_KERNEL(fz_kbad, (GPUARR_SCALAR(int64_t, n), GPUARR_OUT(int32_t, y)), {
    int64_t i = gpuarr_index(0) + gpuarr_size(0) * (gpuarr_index(1) + gpuarr_size(1) * gpuarr_index(2));
    int private = 5;
    if (i < n) y[i] = private;
})
#define FZ_KERNELS 5
static const gpuarr_kernel *const fz_kernels[FZ_KERNELS] = {&fz_kaxpy_gpuarr_kernel, &fz_kwiden_gpuarr_kernel, &fz_khalf_gpuarr_kernel,
                                                            &fz_kf64_gpuarr_kernel, &fz_kbad_gpuarr_kernel};
/* the element types of each kernel's arrays, x then y (0: none) */
static const gpuarr_dtype fz_kernel_dtypes[FZ_KERNELS][2] = {
    {GPUARR_F32, GPUARR_F32}, {GPUARR_U8, GPUARR_I32}, {GPUARR_F16, GPUARR_BF16}, {GPUARR_F64, 0}, {GPUARR_I32, 0}};

/* A launch shape from the input: l's fields, and whether it must be refused. Valid shapes stay
   small (at most 40 x 40 x 40); hostile ones have a negative size or two sizes whose product
   overflows, never a huge one that would run. */
static bool fz_launch_shape(fz *z, gpuarr_launch *l) {
    uint8_t how = u8(z);
    memset(l, 0, sizeof *l);
    if (how & 0x10) l->stream = fz_stream(z);
    switch (how & 3) {
    case 0: return false; /* the defaults */
    case 1:
        l->ndim = (int)(u8(z) % 5); /* 4: refused */
        for (int d = 0; d < 3; d++) l->global[d] = u8(z) % 41;
        return l->ndim == 4;
    case 2: {
        static const int64_t big[] = {INT64_MAX, (int64_t)1 << 40, (int64_t)1 << 62, INT64_MAX / 3};
        l->ndim = 2 + (how >> 2 & 1);
        l->global[0] = big[u8(z) & 3];
        l->global[1] = big[u8(z) & 3];
        l->global[2] = (int64_t)(u8(z) % 3) - 1;
        return true;
    }
    default: {
        static const int64_t neg[] = {-1, INT64_MIN, -40, -((int64_t)1 << 40)};
        l->ndim = 1 + (int)(u8(z) % 3);
        for (int d = 0; d < 3; d++) l->global[d] = u8(z) % 9;
        int at = u8(z) % l->ndim;
        l->global[at] = neg[u8(z) & 3];
        return true;
    }
    }
}

/* n for a kernel's bound: the fewest elements of its arrays (0 when one is not an array) */
static int64_t fz_kernel_bound(gpuarr_array x, gpuarr_array y, bool has_y) {
    gpuarr_array_info xi, yi;
    if (!fz_info(x, &xi)) return 0;
    if (!has_y) return xi.count;
    if (!fz_info(y, &yi)) return 0;
    return xi.count < yi.count ? xi.count : yi.count;
}

/* fz_kwiden ran: y[i] = 3 x[i] - 7 over the indices the launch covered */
static void fz_kwiden_check(fz *z, gpuarr_array x, gpuarr_array y, const gpuarr_launch *l, bool defaults, int64_t n) {
    gpuarr_array_info xi, yi;
    if (x.id == y.id || fz_aliased(z, x.id) || fz_aliased(z, y.id) || !fz_info(x, &xi) || !fz_info(y, &yi)) return;
    int64_t covered = defaults ? xi.count : 1;
    for (int d = 0; !defaults && d < l->ndim; d++) covered *= l->global[d];
    if (covered > n) covered = n;
    unsigned char *xs = fz_read_all(z, x, &xi), *ys = fz_read_all(z, y, &yi);
    if (!xs || !ys) return;
    for (int64_t i = 0; i < covered; i++) {
        int32_t got;
        memcpy(&got, ys + 4 * i, 4);
        if (got != (int32_t)xs[i] * 3 - 7) {
            char w[160];
            fz_die("fz_kwiden: y[%lld] = %d after x[%lld] = %u (%lld of %lld indices covered; y %s)", (long long)i, got, (long long)i, xs[i],
                   (long long)covered, (long long)n, fz_where(&yi, w, sizeof w));
        }
    }
}

/* a typed launch, on the input's arrays or (how & 0x80) on new ones of the kernel's dtypes */
static void fz_kernel_typed(fz *z, uint8_t how) {
    int which = u8(z) % FZ_KERNELS;
    bool has_y = fz_kernel_dtypes[which][1] != 0;
    gpuarr_array x = fz_arr(z), y = has_y ? fz_arr(z) : x;
    if (how & 0x80) { /* arrays of the right dtypes on one device, kept in the table for later ops */
        gpuarr_device d = fz_dev(z);
        int64_t nx = u8(z) % 64, ny = u8(z) % 64;
        gpuarr_array a = {0}, b = {0};
        gpuarr_result r;
        if (FZ_CALL(r, "gpuarr_empty", gpuarr_empty(d, fz_kernel_dtypes[which][0], 1, &nx, &a)) != GPUARR_OK) return;
        if (FZ_CALL(r, "gpuarr_write", gpuarr_write(a, 0, nx, GPUARR_U8, fz_alloc(z, (size_t)nx))) != GPUARR_OK) {
            fz_ok_or_error(gpuarr_release(a), "gpuarr_release");
            return;
        }
        if (has_y && FZ_CALL(r, "gpuarr_zeros", gpuarr_zeros(d, fz_kernel_dtypes[which][1], 1, &ny, &b)) != GPUARR_OK) {
            fz_ok_or_error(gpuarr_release(a), "gpuarr_release");
            return;
        }
        x = a, y = has_y ? b : a;
        fz_adopt(z, a);
        if (has_y) fz_adopt(z, b);
        if (!fz_held(z, x.id, -1) || !fz_held(z, y.id, -1)) return; /* released at once: no free slot */
    }
    gpuarr_launch l;
    bool refused = fz_launch_shape(z, &l), defaults = !(how & 0x40);
    const gpuarr_launch *lp = defaults && !refused ? NULL : &l;
    if (lp && !lp->ndim) defaults = true; /* ndim 0: the defaults, but on l's stream */
    int64_t n = fz_kernel_bound(x, y, has_y);
    uint64_t bits = u64(z);
    float a;
    memcpy(&a, &bits, sizeof a);
    gpuarr_result r;
    switch (which) {
    case 0: FZ_CALL(r, "gpuarr_kernel_launch", fz_kaxpy(lp, n, a, x, y)); break;
    case 1: FZ_CALL(r, "gpuarr_kernel_launch", fz_kwiden(lp, n, x, y)); break;
    case 2: FZ_CALL(r, "gpuarr_kernel_launch", fz_khalf(lp, n, gpuarr_bf16_from_float(a), x, y)); break;
    case 3: FZ_CALL(r, "gpuarr_kernel_launch", fz_kf64(lp, n, x)); break;
    default: FZ_CALL(r, "gpuarr_kernel_launch", fz_kbad(lp, n, x)); break;
    }
    if (r == GPUARR_OK && refused && lp)
        fz_die("a launch of %s with ndim %d, global {%lld, %lld, %lld} succeeded", fz_kernels[which]->name, l.ndim, (long long)l.global[0],
               (long long)l.global[1], (long long)l.global[2]);
    if (r == GPUARR_OK && which == 1 && (how & 0x20)) fz_kwiden_check(z, x, y, &l, lp == NULL || defaults, n);
}

/* gpuarr_kernel_launch itself: good arguments, NULL ones, a description it must refuse */
static void fz_kernel_direct(fz *z) {
    uint8_t how = u8(z);
    gpuarr_array x = fz_arr(z), y = fz_arr(z);
    int64_t n = fz_kernel_bound(x, y, true);
    gpuarr_kernel_arg args[3] = {{{0}, &n}, {x, NULL}, {y, NULL}};
    if (how & 1) args[0].scalar = NULL;                        /* a scalar without a value */
    if (how & 2) args[1].array.id = 0, args[1].scalar = &n;    /* a scalar where an array goes */
    gpuarr_kernel k = fz_kwiden_gpuarr_kernel;
    gpuarr_kernel_param params[3] = {k.params[0], k.params[1], k.params[2]};
    k.params = params;
    bool broken = true;
    int at = u8(z) % 3, v = u8(z);
    switch (u8(z) % 9) { /* break the description in a way the check must catch */
    case 0: k.nparams = (v & 1) ? -(v >> 1) : GPUARR_KERNEL_MAX_PARAMS + 1 + (v >> 1); break; /* <= 0 or > 16 */
    case 1: params[at].kind = (gpuarr_param_kind)(5 + v % 9); break;
    case 2: params[at].dtype = (v & 1) ? GPUARR_BOOL : (gpuarr_dtype)(GPUARR_DTYPE_COUNT + v % 9); break;
    case 3: params[1].kind = params[2].kind = GPUARR_PARAM_SCALAR; break;
    case 4: k.host = NULL; break;
    case 5: k.name = NULL; break;
    case 6: k.body = NULL; break;
    case 7: params[at].name = NULL; break;
    default: broken = false; break;
    }
    /* a copy that is right is not launched: a kernel is what GPUARR_KERNEL made, not a copy */
    const gpuarr_kernel *kp = broken ? &k : &fz_kwiden_gpuarr_kernel;
    gpuarr_launch l;
    bool bad_shape = fz_launch_shape(z, &l);
    const gpuarr_launch *lp = (how & 4) ? &l : NULL;
    gpuarr_result r;
    switch (how >> 4 & 3) {
    case 0: FZ_CALL(r, "gpuarr_kernel_launch", gpuarr_kernel_launch(kp, lp, (how & 8) ? NULL : args)); break;
    case 1: FZ_CALL(r, "gpuarr_kernel_launch", gpuarr_kernel_launch(NULL, lp, args)); broken = true; break;
    default: FZ_CALL(r, "gpuarr_kernel_launch", gpuarr_kernel_launch(kp, lp, args)); break;
    }
    if (r == GPUARR_OK && (broken || (how & 3) || ((how >> 4 & 3) == 0 && (how & 8)) || (lp && bad_shape)))
        fz_die("gpuarr_kernel_launch with bad arguments (how 0x%02x, broken %d) succeeded", how, (int)broken);
}

static void op_kernel(fz *z, uint8_t how) {
    gpuarr_result r;
    switch (how & 7) {
    case 0: case 1: case 2: fz_kernel_typed(z, u8(z)); break;
    case 3: fz_kernel_direct(z); break;
    case 4: {
        uint8_t b = u8(z);
        const gpuarr_kernel *k = (b & 0xf0) == 0xf0 ? NULL : fz_kernels[b % FZ_KERNELS];
        FZ_CALL(r, "gpuarr_kernel_build", gpuarr_kernel_build(k, fz_dev(z)));
        if (r == GPUARR_OK && !k) fz_die("gpuarr_kernel_build(NULL) succeeded");
        break;
    }
    case 5: {
        uint8_t b = u8(z);
        const gpuarr_kernel *k = (b & 0xf0) == 0xf0 ? NULL : fz_kernels[b % FZ_KERNELS];
        size_t len = u16(z) % 700;
        char *buf = (b & 8) && !len ? NULL : (char *)fz_alloc(z, len ? len : 1);
        FZ_CALL(r, "gpuarr_kernel_build_log", gpuarr_kernel_build_log(k, fz_dev(z), buf, len));
        if (r == GPUARR_OK && (!len || !memchr(buf, '\0', len))) fz_die("gpuarr_kernel_build_log: not NUL-terminated within len %zu", len);
        break;
    }
    default: { /* gpuarr_reduce: any result; a new 0-d array on a's device when it succeeds */
        gpuarr_array a = fz_arr(z), out = {FZ_SENTINEL};
        uint8_t b = u8(z);
        gpuarr_reduce_op op = (gpuarr_reduce_op)((b & 0xf0) == 0xf0 ? (int)(int8_t)b : 1 + b % (GPUARR_REDUCE_OP_COUNT - 1));
        gpuarr_dtype t = (u8(z) & 1) ? GPUARR_DTYPE_INVALID : fz_dtype(z);
        bool no_out = (b & 0xe0) == 0xe0;
        FZ_CALL(r, "gpuarr_reduce", gpuarr_reduce(a, op, t, no_out ? NULL : &out));
        FZ_KEEP_OUT(r, "gpuarr_reduce", out);
        if (r == GPUARR_OK && no_out) fz_die("gpuarr_reduce with out NULL succeeded");
        if (r != GPUARR_OK) break;
        gpuarr_array_info ai, oi;
        if (!fz_info(out, &oi) || oi.ndim != 0 || oi.count != 1) fz_die("gpuarr_reduce: the result is not a 0-d array");
        if (fz_info(a, &ai) && ai.device.id != oi.device.id) fz_die("gpuarr_reduce: the result is not on a's device");
        fz_adopt(z, out);
        break;
    }
    }
}

static void op_misc(fz *z) {
    uint8_t how = u8(z);
    if (how >= 0xf0) { /* leases (bytes 0xf0..0xff; committed inputs with them ran op_misc's other cases before) */
        op_lease(z);
        return;
    }
    if (how >= 0xe8) { /* tasks and offload (bytes 0xe8..0xef, which ran the cases below before) */
        op_offload(z);
        return;
    }
    if (how >= 0xe0) { /* transfer estimates (bytes 0xe0..0xe7, the same) */
        op_transfer(z);
        return;
    }
    if (how >= 0xd0) { /* portable kernels (bytes 0xd0..0xdf, the same) */
        op_kernel(z, how);
        return;
    }
    switch (how % 4) {
    case 0: {
        gpuarr_result r = (gpuarr_result)(int8_t)u8(z);
        if (!gpuarr_result_string(r) || !gpuarr_result_name(r)) fz_die("a result has no name");
        gpuarr_dtype t = (gpuarr_dtype)(int8_t)u8(z);
        const char *n = gpuarr_dtype_name(t);
        if (gpuarr_dtype_size(t) && gpuarr_dtype_from_name(n) != t) fz_die("dtype name %s does not map back", n);
        char s[8];
        for (int i = 0; i < 7; i++) s[i] = (char)u8(z);
        s[7] = '\0';
        (void)gpuarr_dtype_from_name(s);
        (void)gpuarr_dtype_from_name(NULL);
        gpuarr_backend b = (gpuarr_backend)(int8_t)u8(z);
        if (!gpuarr_backend_name(b)) fz_die("gpuarr_backend_name gave NULL");
        (void)gpuarr_backend_compiled(b);
        (void)gpuarr_version_string();
        (void)gpuarr_last_error();
        int rank = -1;
        const char *var = "?";
        gpuarr_result lr;
        if (FZ_CALL(lr, "gpuarr_local_rank", gpuarr_local_rank((how & 0x40) ? NULL : &rank, (how & 0x80) ? NULL : &var)) == GPUARR_OK &&
            (rank < 0 || (var && strcmp(var, "?") == 0 && !(how & 0x80))))
            fz_die("gpuarr_local_rank: rank %d, variable %s", rank, var ? var : "NULL");
        break;
    }
    case 1: {
        uint64_t bits = u64(z);
        double x;
        float f;
        memcpy(&x, &bits, sizeof x);
        memcpy(&f, &bits, sizeof f);
        gpuarr_f16 h = gpuarr_f16_from_float(f), h2 = gpuarr_f16_from_double(x);
        gpuarr_bf16 b = gpuarr_bf16_from_float(f), b2 = gpuarr_bf16_from_double(x);
        float back = gpuarr_f16_to_float(h);
        if (back == back && gpuarr_f16_from_float(back).bits != h.bits) fz_die("f16 0x%04x does not round-trip", h.bits);
        back = gpuarr_bf16_to_float(b);
        if (back == back && gpuarr_bf16_from_float(back).bits != b.bits) fz_die("bf16 0x%04x does not round-trip", b.bits);
        (void)gpuarr_f16_to_float(h2);
        (void)gpuarr_bf16_to_float(b2);
        break;
    }
    case 2: { /* init/shutdown as reference counting: never drops the library */
        gpuarr_result r;
        gpuarr_desc d;
        memset(&d, 0, sizeof d);
        d.host_threads = (how & 0x80) ? 3 : 0;
        d.alloc_conf = (how & 0x40) ? "limit:1M" : NULL;
        if (FZ_CALL(r, "gpuarr_init", gpuarr_init((how & 0x20) ? NULL : &d)) == GPUARR_OK) gpuarr_shutdown();
        if (!gpuarr_is_initialized()) fz_die("init/shutdown pair dropped the library");
        break;
    }
    default:
        if (how & 0x40) op_dlpack(z);
        else if (!fz_soak && (how & 0x80)) z->reinit = true; /* at the end of this input (needs everything released) */
        else if (how & 0x20) op_trace(z);
        else op_mpi(z); /* bytes that did nothing before the MPI part came */
        break;
    }
}

/* ---- the end of an input ---- */
static void fz_cleanup(fz *z) {
    gpuarr_result r;
    if (z->tracing) FZ_CALL(r, "gpuarr_trace_stop", gpuarr_trace_stop()); /* the soak: maybe another thread's */
    z->tracing = false;
    while (z->nscope) gpuarr_scope_leave(&z->scope[--z->nscope]);
    for (int i = 0; i < FZ_LEASES; i++)
        if (z->lease[i].id) {
            if (FZ_CALL(r, "gpuarr_lease_release", gpuarr_lease_release(z->lease[i])) != GPUARR_OK) fz_die("releasing lease %d failed", i);
            z->lease[i].id = 0;
        }
    for (int i = 0; i < FZ_DEVICES; i++) {
        int total, in_use;
        if (!z->dev[i].id || gpuarr_device_get_slots(z->dev[i], &total, &in_use) != GPUARR_OK) continue;
        if (!fz_soak && in_use) fz_die("%s: %d slots still in use after every lease was released", fz_specs[i], in_use);
        if (z->slots_saved[i] && gpuarr_device_set_slots(z->dev[i], z->slots_saved[i]) != GPUARR_OK)
            fz_die("restoring the slots of %s: %s", fz_specs[i], gpuarr_last_error());
        z->slots_saved[i] = 0;
    }
    gpuarr_stream none = {0};
    gpuarr_device nodev = {0};
    if (gpuarr_set_current_stream(none) != GPUARR_OK) fz_die("gpuarr_set_current_stream({0}): %s", gpuarr_last_error());
    if (gpuarr_set_current_device(nodev) != GPUARR_OK) fz_die("gpuarr_set_current_device({0}): %s", gpuarr_last_error());
    for (int i = 0; i < FZ_ARRAYS; i++)
        if (z->arr[i].id) {
            if (FZ_CALL(r, "gpuarr_release", gpuarr_release(z->arr[i])) != GPUARR_OK) fz_die("releasing array slot %d failed", i);
            z->arr[i].id = 0;
        }
    while (z->nexp) fz_export_release(z, z->nexp - 1);
    for (int i = 0; i < FZ_EVENTS; i++)
        if (z->ev[i].id && FZ_CALL(r, "gpuarr_event_destroy", gpuarr_event_destroy(z->ev[i])) != GPUARR_OK) fz_die("destroying event %d failed", i);
    for (int pass = 0; pass < 2; pass++) /* wrapped streams before the streams they wrap */
        for (int i = 0; i < FZ_STREAMS; i++)
            if (z->st[i].id && z->st_pinned[i] == (pass == 1)) {
                if (FZ_CALL(r, "gpuarr_stream_destroy", gpuarr_stream_destroy(z->st[i])) != GPUARR_OK) fz_die("destroying stream %d failed", i);
                z->st[i].id = 0;
            }
    for (uintptr_t k = 0; k < 20; k++)
        if (z->handlers & (1 << k) && gpuarr_oom_handler_remove(fz_oom, (char *)z + k) != GPUARR_OK) fz_die("removing an OOM handler failed");
    for (int i = 0; i < FZ_DEVICES; i++) {
        if (!z->dev[i].id) continue;
        if (z->faults) (void)gpuarr_pool_inject_faults(z->dev[i], 0, 0);
        if (z->limits) (void)gpuarr_pool_set_limit(z->dev[i], 0);
        if (gpuarr_device_sync(z->dev[i]) != GPUARR_OK) fz_die("gpuarr_device_sync(%s) at the end: %s", fz_specs[i], gpuarr_last_error());
    }
    if (z->adev.id) {
        if (z->faults) (void)gpuarr_pool_inject_faults(z->adev, 0, 0);
        if (gpuarr_device_sync(z->adev) != GPUARR_OK) fz_die("gpuarr_device_sync(the adopted device) at the end: %s", gpuarr_last_error());
    }
    fz_mpi_cleanup(z); /* the faults are off now: the drain's one-byte array is made */
    /* the arrays whose memory wrappers used: only now that the wrappers' queued work is done
       (released before, a block would go back to the pool while that work may still write it) */
    for (int i = 0; i < z->nkeep; i++)
        if (gpuarr_release(z->keep[i]) != GPUARR_OK) fz_die("releasing a kept array failed");
    z->nkeep = 0;
    if (z->adev.id) { /* with every handle of it released and its exports given back: removed */
        gpuarr_pool_stats st;
        if (!fz_soak && (gpuarr_pool_get_stats(z->adev, &st) != GPUARR_OK || st.allocated_bytes))
            fz_die("the adopted device: %llu bytes still allocated after every handle was released (%s)",
                   (unsigned long long)st.allocated_bytes, gpuarr_last_error());
        fz_remove_device(z, 0);
        if (z->adev.id) fz_die("gpuarr_device_remove(the adopted device) at the end: %s", gpuarr_last_error());
    }
    if (!fz_soak) {
        for (int i = 0; i < FZ_DEVICES; i++) {
            if (!z->dev[i].id) continue;
            gpuarr_pool_stats st, pst;
            if (gpuarr_pool_get_stats(z->dev[i], &st) != GPUARR_OK || gpuarr_pool_get_pinned_stats(z->dev[i], &pst) != GPUARR_OK)
                fz_die("pool stats of %s: %s", fz_specs[i], gpuarr_last_error());
            if (st.allocated_bytes || st.allocations || pst.allocated_bytes || pst.allocations)
                fz_die("%s: %llu bytes in %llu blocks (pinned: %llu in %llu) still allocated after every handle was released", fz_specs[i],
                       (unsigned long long)st.allocated_bytes, (unsigned long long)st.allocations, (unsigned long long)pst.allocated_bytes,
                       (unsigned long long)pst.allocations);
            if (gpuarr_pool_trim(z->dev[i]) != GPUARR_OK) fz_die("gpuarr_pool_trim(%s): %s", fz_specs[i], gpuarr_last_error());
            if (gpuarr_pool_get_stats(z->dev[i], &st) != GPUARR_OK) fz_die("stats");
            if (st.reserved_bytes) fz_die("%s: trim left %llu bytes reserved", fz_specs[i], (unsigned long long)st.reserved_bytes);
        }
        if (__atomic_load_n(&fz_wraps_alive, __ATOMIC_SEQ_CST)) fz_die("%ld wrapped host buffers were never given back", fz_wraps_alive);
    }
    while (z->bufs) {
        fz_buf *b = z->bufs;
        z->bufs = b->next;
        free(b);
    }
}

static void fz_find_devices(fz *z) {
    for (int i = 0; i < FZ_DEVICES; i++) {
        z->dev[i].id = 0;
        (void)gpuarr_device_find(fz_specs[i], &z->dev[i]);
    }
}

/* Shuts the library down and starts it again with a desc from the input (then back to the
   default at the end of the input): the registry, pools and backends are rebuilt. */
static void fz_reinit(fz *z, const gpuarr_desc *desc) {
    gpuarr_shutdown();
    if (gpuarr_is_initialized()) fz_die("gpuarr_shutdown of the only reference left it initialized");
    gpuarr_result r;
    if (FZ_CALL(r, "gpuarr_init", gpuarr_init(desc)) != GPUARR_OK) {
        if (desc == fz_default_desc()) fz_die("gpuarr_init with the default desc failed: %s", gpuarr_last_error());
        if (gpuarr_init(fz_default_desc()) != GPUARR_OK) fz_die("gpuarr_init after a failed one: %s", gpuarr_last_error());
    }
    fz_find_devices(z);
}

static void fz_log(gpuarr_log_level level, const char *message, void *user) {
    (void)level;
    (void)message;
    (void)user;
}

static const gpuarr_desc *fz_default_desc(void) {
    static gpuarr_desc d;
    d.logger.fn = fz_log;
    d.alloc_conf = "limit:32M,host_limit:32M";
    return &d;
}

static pthread_once_t fz_once = PTHREAD_ONCE_INIT;
static void fz_start(void) {
    fz_trace = getenv("FUZZ_API_TRACE") != NULL;
    if (getenv("FUZZ_API_SOAK")) fz_soak = 1; /* replaying a soak's input as the soak ran it */
    setenv("POCL_DEVICES", "pthread pthread", 0);
    setenv("GPUARR_CUDA_LIBRARY", FUZZ_FAKE_CUDA, 0);
    setenv("GPUARR_NVML_LIBRARY", FUZZ_FAKE_NVML, 0);
    setenv("GPUARR_CACHE_DIR", FUZZ_CACHE_DIR, 0);
    /* lease slot files: the fuzzer's own folder, not the user's (every acquire here tries once) */
    char path[] = FUZZ_CACHE_DIR "/";
    for (char *c = path + 1; *c; c++) /* mkdir -p */
        if (*c == '/') *c = '\0', (void)mkdir(path, 0700), *c = '/';
    setenv("GPUARR_LEASE_DIR", FUZZ_CACHE_DIR "/leases", 0);
    setenv("FAKE_CUDA_MEMORY", "268435456", 0);
    fz_mpi_start();
    fz_cl_load();
    if (gpuarr_init(fz_default_desc()) != GPUARR_OK) fz_die("gpuarr_init: %s", gpuarr_last_error());
    int found = 0;
    for (int i = 0; i < FZ_DEVICES; i++) {
        gpuarr_device d;
        found += gpuarr_device_find(fz_specs[i], &d) == GPUARR_OK;
    }
    if (getenv("FUZZ_API_VERBOSE") || found < FZ_DEVICES) /* say so: those inputs test less */
        fprintf(stderr, "fuzz_api: %d of the %d devices (host, opencl:0/1, cuda:0/1 of %s) present\n", found, FZ_DEVICES,
                getenv("GPUARR_CUDA_LIBRARY"));
}

/* One input: a sequence of ops, then the checks. Thread-safe with fz_soak set. */
static void fz_run(const uint8_t *data, size_t size) {
    pthread_once(&fz_once, fz_start);
    fz_cur_data = data;
    fz_cur_size = size;
    fz z;
    memset(&z, 0, sizeof z);
    z.data = data;
    z.size = size;
    fz_find_devices(&z);
    uint8_t head = u8(&z);
    if (!fz_soak && (head & 0xc0) == 0xc0) { /* start from another configuration */
        /* each after the default's limits (later keys win): no array reaches a size that takes long to fill */
        static const char *const confs[] = {"limit:32M,host_limit:32M,caching:0",
                                            "limit:32M,host_limit:32M,max_split_size:4K,release_threshold:0",
                                            "limit:32M,host_limit:32M,host_fallback:1,limit:64K",
                                            "limit:32M,host_limit:32M,limit:1%,host_limit:256K",
                                            "limit:32M,host_limit:32M,release_threshold:none",
                                            "limit:32M,host_limit:32M,host_fallback:1,caching:0,limit:128K"};
        static const char *const faults[] = {"host:nth=5", "opencl:0:above=4K,cuda:0:nth=3", "cuda:1:pinned_above=1K,opencl:1:pinned_above=0",
                                             "opencl:1:nth=2,host:above=64K"};
        uint8_t env = u8(&z);
        gpuarr_desc d = *fz_default_desc();
        d.alloc_conf = confs[(head & 7) % 6];
        d.oom_host_fallback = (head & 8) != 0;
        d.host_threads = (head & 16) ? 1 : 0;
        d.devices = (head & 32) ? "opencl:1,cuda:0" : NULL;
        /* variables gpuarr_init reads once: set around the init only */
        if (env & 1) setenv("GPUARR_OPENCL_UNIFIED", "off", 1); /* PoCL as a discrete device: staging, pinned pools */
        if (env & 2) setenv("GPUARR_FAULTS", faults[(env >> 4) & 3], 1);
        if (env & 4) setenv("GPUARR_PEER_COPIES", "off", 1);
        if (env & 8) setenv("GPUARR_OPENCL_FP64", "off", 1);
        fz_reinit(&z, &d);
        unsetenv("GPUARR_OPENCL_UNIFIED");
        unsetenv("GPUARR_FAULTS");
        unsetenv("GPUARR_PEER_COPIES");
        unsetenv("GPUARR_OPENCL_FP64");
        z.reinit = true;
        z.faults = true;
    }
    for (int ops = 0; ops < FZ_MAX_OPS && z.pos < z.size; ops++) {
        if (fz_trace) fprintf(stderr, "op %d at byte %zu: %u\n", ops, z.pos, z.pos < z.size ? z.data[z.pos] % 24u : 0u);
        switch (u8(&z) % 24) {
        case 0: case 1: op_create(&z, 0); break;
        case 2: op_create(&z, 1); break;
        case 3: case 4: op_create(&z, 2); break;
        case 5: op_create(&z, 3); break;
        case 6: op_create(&z, 4); break;
        case 7: op_release(&z); break;
        case 8: op_retain(&z); break;
        case 9: op_info(&z); break;
        case 10: op_convert(&z, 0); break;
        case 11: op_convert(&z, 1); break;
        case 12: op_copy(&z, u8(&z) & 1); break;
        case 13: case 14: op_rw(&z, u8(&z) & 3); break;
        case 15: op_to_host(&z); break;
        case 16: op_fill(&z); break;
        case 17: op_view(&z); break;
        case 18: op_batch(&z); break;
        case 19: op_stream(&z); break;
        case 20: op_event(&z); break;
        case 21: op_scope(&z); break;
        case 22: op_device(&z); break;
        default:
            if (u8(&z) & 1) op_pool(&z);
            else op_misc(&z);
            break;
        }
    }
    fz_cleanup(&z);
    if (z.reinit) fz_reinit(&z, fz_default_desc());
}

#ifndef FUZZ_API_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_run(data, size);
    return 0;
}
#endif
