/*
 * fuzz_dlpack.c -- the DLPack fuzz target: malformed tensors given to
 * gpuarr_from_dlpack and gpuarr_from_dlpack_legacy. The input describes one tensor field by field
 * (version, flags, ndim, shape, strides, dtype, device, byte_offset, data, deleter), with the
 * lies a producer can tell: negative, huge and overflowing shapes, ndim out of range, strides
 * that are not compact, unknown dtype codes and widths, vector lanes, devices gpuarr does not
 * have, misaligned or NULL data, another major version.
 *
 * What it asserts (abort() on a violation):
 *   - the call returns GPUARR_OK or a known negative gpuarr_result with a message naming it;
 *   - on failure the producer's deleter has run exactly once and *out is untouched;
 *   - on success the array is what the tensor says (dtype, shape, read-only flag, address
 *     data + byte_offset), its elements read back as the producer's bytes and, unless read-only,
 *     a write lands in the producer's memory (where the input's buffer covers the tensor; gpuarr
 *     takes host memory on trust, so a tensor claiming more than its buffer is never touched);
 *     writes into a read-only one are refused; an export of it gives the same tensor back;
 *   - the deleter runs once, when the array and a view of it are both released, and not before.
 * gpuarr runs with the host device only: a kDLCUDA or kDLOpenCL tensor names a device gpuarr does
 * not have (a lie about a real device's memory cannot be checked by anyone).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpuarr.h"

#define FD_MAX_BYTES (1u << 20) /* the largest buffer an input gets */

typedef struct fd_input {
    const uint8_t *p;
    size_t n;
} fd_input;

static uint8_t u8(fd_input *in) {
    if (!in->n) return 0;
    in->n--;
    return *in->p++;
}

static uint64_t u64(fd_input *in) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | u8(in);
    return v;
}

static void fd_die(const char *fmt, const char *detail) __attribute__((noreturn));
static void fd_die(const char *fmt, const char *detail) {
    fprintf(stderr, "fuzz_dlpack: %s %s (last error \"%s\")\n", fmt, detail ? detail : "", gpuarr_last_error());
    abort();
}

/* the producer: its deleter counts */
typedef struct fd_producer {
    int deleted;
} fd_producer;

static void fd_deleter(DLManagedTensorVersioned *self) { ((fd_producer *)self->manager_ctx)->deleted++; }
static void fd_deleter_legacy(DLManagedTensor *self) { ((fd_producer *)self->manager_ctx)->deleted++; }

/* A shape entry: mostly small, sometimes a value that breaks arithmetic. */
static int64_t fd_extent(fd_input *in) {
    static const int64_t special[] = {-1, INT64_MIN, INT64_MAX, (int64_t)1 << 40, (int64_t)1 << 62, 3037000500};
    uint8_t b = u8(in);
    return b < 250 ? (int64_t)(b % 8) : special[b - 250];
}

/* The gpuarr dtype a DLPack one must map to, from DLPack's documentation, or 0. */
static gpuarr_dtype fd_expected_dtype(DLDataType d) {
    if (d.lanes != 1) return GPUARR_DTYPE_INVALID;
    switch (d.code) {
    case kDLBool: return d.bits == 8 ? GPUARR_BOOL : GPUARR_DTYPE_INVALID;
    case kDLInt: return d.bits == 8 ? GPUARR_I8 : d.bits == 16 ? GPUARR_I16 : d.bits == 32 ? GPUARR_I32 : d.bits == 64 ? GPUARR_I64 : GPUARR_DTYPE_INVALID;
    case kDLUInt: return d.bits == 8 ? GPUARR_U8 : d.bits == 16 ? GPUARR_U16 : d.bits == 32 ? GPUARR_U32 : d.bits == 64 ? GPUARR_U64 : GPUARR_DTYPE_INVALID;
    case kDLFloat: return d.bits == 16 ? GPUARR_F16 : d.bits == 32 ? GPUARR_F32 : d.bits == 64 ? GPUARR_F64 : GPUARR_DTYPE_INVALID;
    case kDLBfloat: return d.bits == 16 ? GPUARR_BF16 : GPUARR_DTYPE_INVALID;
    default: return GPUARR_DTYPE_INVALID;
    }
}

static void fd_check_error(gpuarr_result r, const char *api) {
    if ((int)r >= 0 || (int)r <= -GPUARR_RESULT_COUNT) fd_die("not a gpuarr error result from", api);
    const char *m = gpuarr_last_error();
    size_t n = strlen(api);
    if (strncmp(m, api, n) != 0 || m[n] != ':' || strlen(m) < n + 4) fd_die("an error without a message naming", api);
}

static void fd_start(void) {
    if (gpuarr_is_initialized()) return;
    static gpuarr_desc d;
    d.devices = "host";
    d.host_threads = 1;
    d.log_level = GPUARR_LOG_OFF;
    if (gpuarr_init(&d) != GPUARR_OK) fd_die("gpuarr_init failed", NULL);
}

/* Everything the array must be when the import succeeded. */
static void fd_check_array(gpuarr_array a, const DLTensor *t, bool read_only, const uint8_t *buf, size_t covered) {
    gpuarr_array_info info;
    if (gpuarr_array_get_info(a, &info) != GPUARR_OK) fd_die("gpuarr_array_get_info of an import failed", NULL);
    if (info.dtype != fd_expected_dtype(t->dtype) || info.ndim != t->ndim || info.read_only != read_only)
        fd_die("the import's dtype, ndim or read-only flag is not the tensor's", NULL);
    for (int i = 0; i < t->ndim; i++)
        if (info.shape[i] != t->shape[i]) fd_die("the import's shape is not the tensor's", NULL);
    if (info.count == 0) return;
    void *host = NULL;
    if (gpuarr_host_data(a, &host) != GPUARR_OK || host != (const uint8_t *)t->data + t->byte_offset)
        fd_die("the import does not point at data + byte_offset", NULL);
    if (!covered) return; /* the buffer does not hold what the tensor claims: never touched */
    uint8_t *back = (uint8_t *)malloc(info.nbytes);
    if (!back) fd_die("out of host memory", NULL);
    if (gpuarr_read(a, 0, info.count, GPUARR_DTYPE_INVALID, back) != GPUARR_OK) fd_die("gpuarr_read of an import failed", NULL);
    if (memcmp(back, buf + t->byte_offset, info.nbytes) != 0) fd_die("the import reads other bytes than the producer's", NULL);
    free(back);
    uint8_t one = 1;
    gpuarr_result w = gpuarr_write(a, info.count - 1, 1, GPUARR_U8, &one);
    if (read_only) {
        if (w != GPUARR_ERROR_INVALID_ARGUMENT) fd_die("a write into a read-only import was not refused", NULL);
        fd_check_error(w, "gpuarr_write");
    } else {
        if (w != GPUARR_OK) fd_die("a write into an import failed", NULL);
        uint8_t got[8];
        if (gpuarr_read(a, info.count - 1, 1, GPUARR_DTYPE_INVALID, got) != GPUARR_OK ||
            memcmp(got, buf + t->byte_offset + info.nbytes - info.itemsize, info.itemsize) != 0)
            fd_die("a write into an import did not land in the producer's memory", NULL);
    }
}

/* The import exported again: the same tensor, flagged read-only when it is. */
static void fd_check_export(gpuarr_array a, const DLTensor *t, bool read_only) {
    DLManagedTensorVersioned *m = NULL;
    if (gpuarr_to_dlpack(a, 0, &m) != GPUARR_OK) fd_die("gpuarr_to_dlpack of an import failed", NULL);
    const DLTensor *e = &m->dl_tensor;
    if (e->ndim != t->ndim || e->dtype.code != t->dtype.code || e->dtype.bits != t->dtype.bits ||
        ((m->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0) != read_only)
        fd_die("the export of an import is not the tensor", NULL);
    bool empty = false;
    for (int i = 0; i < t->ndim; i++) {
        if (e->shape[i] != t->shape[i]) fd_die("the export's shape is not the tensor's", NULL);
        empty = empty || t->shape[i] == 0;
    }
    if (!empty && (const uint8_t *)e->data + e->byte_offset != (const uint8_t *)t->data + t->byte_offset)
        fd_die("the export's first element is not the tensor's", NULL);
    m->deleter(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fd_input in = {data, size};
    fd_start();
    uint8_t how = u8(&in);
    bool legacy = how & 1, no_deleter = how & 2, null_strides = how & 4, misalign = how & 8, null_data = how & 16,
         null_shape = how & 32, with_view = how & 64;

    DLTensor t;
    memset(&t, 0, sizeof t);
    uint8_t b = u8(&in);
    t.ndim = b < 240 ? b % 10 : (int32_t)(int8_t)b; /* 0..9, or negative */
    int64_t *shape = NULL, *strides = NULL;
    if (t.ndim > 0 && !null_shape) {
        shape = (int64_t *)malloc((size_t)t.ndim * sizeof *shape); /* exactly ndim: ASan sees a read past it */
        strides = (int64_t *)malloc((size_t)t.ndim * sizeof *strides);
        if (!shape || !strides) fd_die("out of host memory", NULL);
        for (int i = 0; i < t.ndim; i++) shape[i] = fd_extent(&in);
    }
    t.shape = shape;
    b = u8(&in);
    static const uint8_t widths[] = {8, 16, 32, 64, 1, 4, 128, 0};
    t.dtype.code = (uint8_t)(b < 200 ? b % 7 : b % 20);
    t.dtype.bits = widths[u8(&in) % 8];
    b = u8(&in);
    t.dtype.lanes = (uint16_t)(b < 240 ? 1 : b);
    size_t itemsize = t.dtype.bits >= 8 ? t.dtype.bits / 8u : 1;

    /* the extent the tensor claims, if it is a sane one */
    uint64_t count = 1;
    bool sane = t.ndim >= 0 && t.ndim <= GPUARR_MAX_DIMS && (t.ndim == 0 || shape);
    for (int i = 0; sane && i < t.ndim; i++) {
        if (shape[i] < 0 || (shape[i] > 0 && count > FD_MAX_BYTES / (uint64_t)shape[i])) sane = false;
        else count *= (uint64_t)shape[i];
    }
    if (strides) { /* compact, then perhaps one lie */
        uint64_t s = 1; /* wraps where the shape is absurd (a zero extent lets the rest be huge) */
        for (int i = t.ndim - 1; i >= 0; i--) {
            strides[i] = (int64_t)s;
            s *= shape[i] > 0 ? (uint64_t)shape[i] : 1u;
        }
        b = u8(&in);
        if (b >= 128 && t.ndim > 0) strides[b % (unsigned)t.ndim] = (int64_t)(int8_t)u8(&in);
    }
    t.strides = null_strides ? NULL : strides;
    t.byte_offset = (uint64_t)(u8(&in) % 8) * itemsize + (u8(&in) == 255 ? 1u : 0u);

    b = u8(&in);
    switch (b % 8) {
    case 0: case 1: case 2: t.device.device_type = kDLCPU; break;
    case 3: t.device.device_type = kDLCUDAHost; break;
    case 4: t.device.device_type = kDLCUDA; break;   /* gpuarr runs without CUDA devices here */
    case 5: t.device.device_type = kDLOpenCL; break; /* and without OpenCL devices */
    default: t.device.device_type = (DLDeviceType)(5 + u8(&in) % 20); break;
    }
    t.device.device_id = (b & 0x80) ? (int32_t)(int8_t)u8(&in) : 0;

    /* the producer's memory: as much as the tensor claims when that is at most FD_MAX_BYTES */
    size_t covered = 0;
    uint8_t *buf = NULL;
    if (sane && count * itemsize + t.byte_offset <= FD_MAX_BYTES) covered = (size_t)(count * itemsize + t.byte_offset);
    buf = (uint8_t *)malloc(covered + 16);
    if (!buf) fd_die("out of host memory", NULL);
    for (size_t i = 0; i < covered + 16; i++) buf[i] = (uint8_t)(i * 131u + 7u);
    if (misalign) covered = 0; /* data + 1: the buffer no longer covers the tensor */
    t.data = null_data ? NULL : buf + (misalign ? 1 : 0);

    fd_producer producer = {0};
    gpuarr_array out = {0xA5A5A5A5u};
    gpuarr_result r;
    bool read_only = false;
    DLManagedTensorVersioned v;
    DLManagedTensor l;
    const char *api = legacy ? "gpuarr_from_dlpack_legacy" : "gpuarr_from_dlpack";
    if (legacy) {
        memset(&l, 0, sizeof l);
        l.dl_tensor = t;
        l.manager_ctx = &producer;
        l.deleter = no_deleter ? NULL : fd_deleter_legacy;
        r = gpuarr_from_dlpack_legacy(&l, &out);
    } else {
        memset(&v, 0, sizeof v);
        v.version.major = u8(&in) < 230 ? 1u : u8(&in);
        v.version.minor = u8(&in);
        v.flags = u64(&in) & ((u8(&in) & 1) ? ~(uint64_t)0 : DLPACK_FLAG_BITMASK_READ_ONLY);
        v.manager_ctx = &producer;
        v.deleter = no_deleter ? NULL : fd_deleter;
        v.dl_tensor = t;
        read_only = (v.flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0;
        r = gpuarr_from_dlpack(&v, &out);
    }
    int want_deleted = no_deleter ? 0 : 1;
    if (r != GPUARR_OK) {
        fd_check_error(r, api);
        if (producer.deleted != want_deleted) fd_die("a refused import did not call the deleter exactly once:", api);
        if (out.id != 0xA5A5A5A5u) fd_die("a refused import wrote *out:", api);
    } else {
        if (producer.deleted) fd_die("an import called the deleter while its array lives:", api);
        if (sane && count > 0 && ((uintptr_t)t.data + t.byte_offset) % itemsize) fd_die("a misaligned import was accepted:", api);
        fd_check_array(out, &t, read_only, buf, covered);
        fd_check_export(out, &t, read_only);
        gpuarr_array view = {0};
        if (with_view && t.ndim > 0 && t.shape[0] > 0 && gpuarr_slice(out, 0, 1, &view) != GPUARR_OK)
            fd_die("gpuarr_slice of an import failed", NULL);
        if (gpuarr_release(out) != GPUARR_OK) fd_die("gpuarr_release of an import failed", NULL);
        if (view.id) {
            if (producer.deleted) fd_die("the deleter ran while a view of the import lives:", api);
            if (gpuarr_release(view) != GPUARR_OK) fd_die("gpuarr_release of a view failed", NULL);
        }
        if (producer.deleted != want_deleted) fd_die("the last release did not call the deleter exactly once:", api);
    }
    free(buf);
    free(shape);
    free(strides);
    return 0;
}
