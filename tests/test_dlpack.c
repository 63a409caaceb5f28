/*
 * test_dlpack.c -- DLPack export and import (the C side; tests/python has NumPy's), on the device
 * named by GPUARR_TEST_DEVICE: every field of an exported tensor for each dtype and 0-d to 4-d shapes, a
 * view's byte_offset, the reference an export holds and its deleter, round trips (versioned,
 * legacy, async on a stream), import refusals with the producer's deleter called exactly once on
 * each, read-only imports refusing writes, and deleters run after gpuarr_shutdown.
 */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include "test_common.h"

TestSuite(dlpack, .init = test_setup, .fini = test_teardown);

/* The DLPack facts, written from the DLPack header's documentation, not read from gpuarr. */
static void expect_dtype(gpuarr_dtype t, DLDataType d) {
    uint8_t code;
    switch (t) {
    case GPUARR_BOOL: code = 6; break;
    case GPUARR_I8: case GPUARR_I16: case GPUARR_I32: case GPUARR_I64: code = 0; break;
    case GPUARR_U8: case GPUARR_U16: case GPUARR_U32: case GPUARR_U64: code = 1; break;
    case GPUARR_BF16: code = 4; break;
    default: code = 2; break;
    }
    cr_expect_eq(d.code, code, "%s: code %u, want %u", test_dtype_str(t), d.code, code);
    cr_expect_eq(d.bits, test_dtype_bytes(t) * 8, "%s: bits %u", test_dtype_str(t), d.bits);
    cr_expect_eq(d.lanes, 1, "%s: lanes %u", test_dtype_str(t), d.lanes);
}

/* The device type and id an array on d must export as. */
static void expect_device(gpuarr_device d, DLDevice dev) {
    gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(d, &info));
    int want = info.backend == GPUARR_BACKEND_CUDA ? 2 : info.backend == GPUARR_BACKEND_OPENCL ? 4 : 1;
    cr_expect_eq((int)dev.device_type, want, "%s: device_type %d, want %d", info.spec, (int)dev.device_type, want);
    cr_expect_eq(dev.device_id, info.backend == GPUARR_BACKEND_HOST ? 0 : info.index, "%s: device_id %d", info.spec,
                 (int)dev.device_id);
}

/* data + byte_offset is where gpuarr says the first element is (OpenCL: the cl_mem and offset). */
static void expect_data(gpuarr_array a, const DLTensor *t) {
    gpuarr_array_info ai;
    gpuarr_device_info di;
    TEST_OK(gpuarr_array_get_info(a, &ai));
    TEST_OK(gpuarr_device_get_info(ai.device, &di));
    if (ai.count == 0) {
        cr_expect_null(t->data, "an empty array exports data = NULL");
        return;
    }
    cr_assert_not_null(t->data);
    if (di.backend == GPUARR_BACKEND_HOST) {
        void *p;
        TEST_OK(gpuarr_host_data(a, &p));
        cr_expect_eq((char *)t->data + t->byte_offset, (char *)p);
    } else if (di.backend == GPUARR_BACKEND_CUDA) {
        void *p;
        TEST_OK(gpuarr_cuda_ptr(a, &p));
        cr_expect_eq((char *)t->data + t->byte_offset, (char *)p);
    } else {
        void *mem;
        size_t off;
        TEST_OK(gpuarr_opencl_mem_raw(a, &mem, &off));
        cr_expect_eq(t->data, mem, "OpenCL: data is the cl_mem");
        cr_expect_eq(t->byte_offset, off);
    }
}

static const int64_t shapes[5][4] = {{0}, {5}, {2, 3}, {2, 1, 3}, {1, 2, 2, 3}};

Test(dlpack, export_fills_every_field_for_each_dtype_and_rank) {
    gpuarr_device d = test_device();
    for (gpuarr_dtype t = TEST_FIRST_DTYPE; t <= TEST_LAST_DTYPE; t++) {
        for (int nd = 0; nd <= 4; nd++) {
            gpuarr_array a;
            TEST_OK(gpuarr_zeros(d, t, nd, nd ? shapes[nd] : NULL, &a));
            DLManagedTensorVersioned *m = NULL;
            TEST_OK(gpuarr_to_dlpack(a, 0, &m));
            cr_assert_not_null(m);
            cr_expect_eq(m->version.major, 1u);
            cr_expect_geq(m->version.minor, 1u);
            cr_expect_eq(m->flags, 0u);
            cr_expect_not_null(m->deleter);
            const DLTensor *x = &m->dl_tensor;
            cr_expect_eq(x->ndim, nd);
            expect_dtype(t, x->dtype);
            expect_device(d, x->device);
            cr_assert(nd == 0 || (x->shape && x->strides), "shape and strides are filled");
            int64_t stride = 1;
            for (int i = nd - 1; i >= 0; i--) {
                cr_expect_eq(x->shape[i], shapes[nd][i], "%s ndim %d: shape[%d]", test_dtype_str(t), nd, i);
                cr_expect_eq(x->strides[i], stride, "%s ndim %d: strides[%d] = %lld, want %lld", test_dtype_str(t), nd, i,
                             (long long)x->strides[i], (long long)stride);
                stride *= shapes[nd][i];
            }
            expect_data(a, x);
            m->deleter(m);
            TEST_OK(gpuarr_release(a));
        }
    }
}

Test(dlpack, a_view_exports_its_byte_offset_from_the_shared_memory) {
    gpuarr_device d = test_device();
    int64_t shape[2] = {6, 4};
    gpuarr_array a, v;
    TEST_OK(gpuarr_zeros(d, GPUARR_F32, 2, shape, &a));
    TEST_OK(gpuarr_slice(a, 2, 5, &v));
    DLManagedTensorVersioned *ma, *mv;
    TEST_OK(gpuarr_to_dlpack(a, 0, &ma));
    TEST_OK(gpuarr_to_dlpack(v, 0, &mv));
    cr_expect_eq(mv->dl_tensor.shape[0], 3);
    cr_expect_eq(mv->dl_tensor.data, ma->dl_tensor.data, "a view points at the memory of the array it shares");
    cr_expect_eq(mv->dl_tensor.byte_offset, ma->dl_tensor.byte_offset + 2 * 4 * sizeof(float));
    expect_data(v, &mv->dl_tensor);
    mv->deleter(mv);
    ma->deleter(ma);
    TEST_OK(gpuarr_release(v));
    TEST_OK(gpuarr_release(a));
}

static uint64_t live_blocks(gpuarr_device d) {
    gpuarr_pool_stats st;
    TEST_OK(gpuarr_pool_get_stats(d, &st));
    return st.allocations;
}

/* The tensor holds the memory, as a view does, not a count on the caller's handle: once the caller
   releases it the handle is gone (a release too many fails instead of freeing what the consumer
   reads), and the memory goes with the deleter. */
Test(dlpack, the_export_holds_the_memory_until_its_deleter_runs) {
    gpuarr_device d = test_device();
    int64_t n = 16;
    int32_t in[16], out[16] = {0};
    for (int i = 0; i < 16; i++) in[i] = i * 7 - 3;
    uint64_t before = live_blocks(d);
    gpuarr_array a;
    TEST_OK(gpuarr_from_host(d, in, 1, &n, &a));
    cr_expect_eq(live_blocks(d), before + 1);
    gpuarr_array_info info;
    DLManagedTensorVersioned *m, *m2;
    TEST_OK(gpuarr_to_dlpack(a, 0, &m));
    TEST_OK(gpuarr_to_dlpack(a, 0, &m2));
    TEST_OK(gpuarr_array_get_info(a, &info));
    cr_expect_eq(info.refcount, 1u, "the caller's handle keeps its one reference");
    TEST_OK(gpuarr_release(a));
    TEST_FAIL_WITH(gpuarr_array_get_info(a, &info), GPUARR_ERROR_INVALID_HANDLE, "a");
    TEST_FAIL_WITH(gpuarr_release(a), GPUARR_ERROR_INVALID_HANDLE, "a"); /* a release too many takes nothing */
    cr_expect_eq(live_blocks(d), before + 1, "the tensors keep the memory");
    m2->deleter(m2);
    cr_expect_eq(live_blocks(d), before + 1, "the other tensor still does");
    gpuarr_array b; /* and it still holds the data */
    TEST_OK(gpuarr_from_dlpack(m, &b));
    TEST_OK(gpuarr_to_host(b, out, 16));
    cr_expect_arr_eq(out, in, sizeof in);
    TEST_OK(gpuarr_release(b)); /* m's deleter: the last hold on the memory */
    cr_expect_eq(live_blocks(d), before, "the memory went with the last deleter");
}

/* An empty array may have extents whose product overflows int64 (its count is 0): its strides
   saturate at INT64_MAX instead of overflowing (found by fuzz_dlpack under UBSan). */
Test(dlpack, an_empty_array_with_huge_extents_exports_saturated_strides) {
    int64_t shape[3] = {0, 3037000500, 3037000500};
    gpuarr_array a;
    TEST_OK(gpuarr_empty(test_device(), GPUARR_F32, 3, shape, &a));
    DLManagedTensorVersioned *m;
    TEST_OK(gpuarr_to_dlpack(a, 0, &m));
    cr_expect_eq(m->dl_tensor.strides[2], 1);
    cr_expect_eq(m->dl_tensor.strides[1], 3037000500);
    cr_expect_eq(m->dl_tensor.strides[0], INT64_MAX, "3037000500^2 does not fit: saturated");
    cr_expect_null(m->dl_tensor.data, "an empty array exports data = NULL");
    gpuarr_array b; /* and back: an import of an empty tensor ignores its strides */
    TEST_OK(gpuarr_from_dlpack(m, &b));
    gpuarr_array_info ai;
    TEST_OK(gpuarr_array_get_info(b, &ai));
    cr_expect_eq(ai.count, 0);
    cr_expect_eq(ai.shape[2], 3037000500);
    TEST_OK(gpuarr_release(b));
    TEST_OK(gpuarr_release(a));
}

Test(dlpack, export_refusals) {
    gpuarr_device d = test_device();
    gpuarr_array a, none = {0};
    int64_t n = 4;
    TEST_OK(gpuarr_zeros(d, GPUARR_U8, 1, &n, &a));
    DLManagedTensorVersioned *m = NULL;
    DLManagedTensor *l = NULL;
    TEST_FAIL_WITH(gpuarr_to_dlpack(a, 0, NULL), GPUARR_ERROR_INVALID_ARGUMENT, "out is NULL");
    TEST_FAIL_WITH(gpuarr_to_dlpack(a, 4, &m), GPUARR_ERROR_INVALID_ARGUMENT, "flags");
    TEST_FAIL_WITH(gpuarr_to_dlpack(none, 0, &m), GPUARR_ERROR_INVALID_HANDLE, "zero");
    TEST_FAIL_WITH(gpuarr_to_dlpack_legacy(none, &l), GPUARR_ERROR_INVALID_HANDLE, "zero");
    gpuarr_stream bad = {a.id}; /* an array id given as a stream */
    TEST_FAIL_WITH(gpuarr_to_dlpack_async(a, bad, 0, &m), GPUARR_ERROR_INVALID_HANDLE, "consumer");
    cr_expect_null(m);
    cr_expect_null(l);
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(a, &info));
    cr_expect_eq(info.refcount, 1u, "a refused export holds no reference");
    TEST_OK(gpuarr_to_dlpack(a, GPUARR_DLPACK_READ_ONLY, &m));
    cr_expect_eq(m->flags, (uint64_t)DLPACK_FLAG_BITMASK_READ_ONLY);
    m->deleter(m);
    TEST_OK(gpuarr_release(a));
}

/* Fills a with i * 3 - 50 as int32 and checks b holds the same. */
static void expect_same_contents(gpuarr_array a, gpuarr_array b) {
    gpuarr_array_info ia, ib;
    TEST_OK(gpuarr_array_get_info(a, &ia));
    TEST_OK(gpuarr_array_get_info(b, &ib));
    cr_assert_eq(ia.count, ib.count);
    cr_expect_eq(ia.dtype, ib.dtype);
    cr_expect_eq(ia.device.id, ib.device.id, "the import is on the device of the export");
    cr_expect_eq(ia.ndim, ib.ndim);
    for (int i = 0; i < ia.ndim; i++) cr_expect_eq(ia.shape[i], ib.shape[i]);
    double *x = calloc((size_t)ia.count + 1, sizeof *x), *y = calloc((size_t)ia.count + 1, sizeof *y);
    TEST_OK(gpuarr_to_host_as(a, GPUARR_F64, x, (size_t)ia.count));
    TEST_OK(gpuarr_to_host_as(b, GPUARR_F64, y, (size_t)ib.count));
    cr_expect_arr_eq(x, y, (size_t)ia.count * sizeof *x);
    free(x);
    free(y);
}

Test(dlpack, round_trip_shares_memory_for_each_dtype) {
    gpuarr_device d = test_device();
    int64_t shape[3] = {2, 3, 4};
    int32_t in[24];
    for (int i = 0; i < 24; i++) in[i] = i % 2;
    for (gpuarr_dtype t = TEST_FIRST_DTYPE; t <= TEST_LAST_DTYPE; t++) {
        gpuarr_array a, b;
        TEST_OK(gpuarr_from_host_as(d, GPUARR_I32, in, 3, shape, &a));
        gpuarr_array c;
        TEST_OK(gpuarr_convert(a, d, t, &c));
        TEST_OK(gpuarr_release(a));
        DLManagedTensorVersioned *m;
        TEST_OK(gpuarr_to_dlpack(c, 0, &m));
        TEST_OK(gpuarr_from_dlpack(m, &b));
        expect_same_contents(c, b);
        uint8_t one = 1; /* a write through the import shows in the export's array: no copy */
        TEST_OK(gpuarr_write(b, 0, 1, GPUARR_U8, &one));
        double first = 0;
        TEST_OK(gpuarr_read(c, 0, 1, GPUARR_F64, &first));
        cr_expect_eq(first, 1.0, "%s: the import shares the memory", test_dtype_str(t));
        TEST_OK(gpuarr_release(c));
        TEST_OK(gpuarr_release(b)); /* runs the export's deleter: the last reference goes */
    }
}

Test(dlpack, legacy_round_trip) {
    gpuarr_device d = test_device();
    int64_t shape[2] = {3, 5};
    float in[15];
    for (int i = 0; i < 15; i++) in[i] = (float)i * 0.5f;
    gpuarr_array a, b, v;
    TEST_OK(gpuarr_from_host(d, in, 2, shape, &a));
    TEST_OK(gpuarr_slice(a, 1, 3, &v));
    DLManagedTensor *m;
    TEST_OK(gpuarr_to_dlpack_legacy(v, &m));
    cr_expect_eq(m->dl_tensor.ndim, 2);
    expect_data(v, &m->dl_tensor);
    TEST_OK(gpuarr_from_dlpack_legacy(m, &b));
    expect_same_contents(v, b);
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(v));
    TEST_OK(gpuarr_release(b));
}

/* The consumer's stream, not the host, waits: the producer's work is queued on s1, the consumer
   reads on s2 through an import of the tensor (an array gpuarr knows no pending work of) and only
   s2 is synchronized. On the fake CUDA driver stream work runs only when its stream is made to,
   so a missing wait reads zeros there. */
Test(dlpack, async_export_orders_the_consumer_stream) {
    gpuarr_device d = test_device();
    gpuarr_stream s1, s2;
    TEST_OK(gpuarr_stream_create(d, 0, &s1));
    TEST_OK(gpuarr_stream_create(d, 0, &s2));
    enum { N = 1 << 18 };
    int64_t n = N;
    gpuarr_array a, c, b;
    TEST_OK(gpuarr_zeros(d, GPUARR_I32, 1, &n, &a));
    int32_t seven = 7;
    TEST_OK(gpuarr_fill(a, seven));
    TEST_OK(gpuarr_convert_async(a, d, GPUARR_F32, s1, &c)); /* ready only when s1 gets there */
    DLManagedTensorVersioned *m;
    TEST_OK(gpuarr_to_dlpack_async(c, s2, 0, &m));
    TEST_OK(gpuarr_from_dlpack(m, &b));
    float *out = malloc(N * sizeof *out);
    cr_assert_not_null(out);
    TEST_OK(gpuarr_read_async(b, 0, N, GPUARR_F32, out, s2));
    TEST_OK(gpuarr_stream_sync(s2));
    for (int i = 0; i < N; i++)
        if (out[i] != 7.0f) cr_assert_fail("element %d is %g: the consumer's stream did not wait for the producer's", i, out[i]);
    free(out);
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(c));
    TEST_OK(gpuarr_release(b));
    TEST_OK(gpuarr_stream_destroy(s1));
    TEST_OK(gpuarr_stream_destroy(s2));
}

/* ---------------------------------------------------------------------------------------------
 * Import of a producer's tensor: host memory owned by the test, a deleter that counts.
 * ------------------------------------------------------------------------------------------- */
typedef struct producer {
    DLManagedTensorVersioned m;
    int64_t shape[4], strides[4];
    double data[24];
    int deleted;
} producer;

static void producer_deleter(DLManagedTensorVersioned *self) { ((producer *)self->manager_ctx)->deleted++; }

static void producer_init(producer *p) {
    memset(p, 0, sizeof *p);
    p->m.version.major = 1;
    p->m.version.minor = 1;
    p->m.manager_ctx = p;
    p->m.deleter = producer_deleter;
    p->shape[0] = 2, p->shape[1] = 3, p->shape[2] = 4;
    p->strides[0] = 12, p->strides[1] = 4, p->strides[2] = 1;
    for (int i = 0; i < 24; i++) p->data[i] = i;
    DLTensor *t = &p->m.dl_tensor;
    t->data = p->data;
    t->device.device_type = kDLCPU;
    t->ndim = 3;
    t->dtype.code = kDLFloat;
    t->dtype.bits = 64;
    t->dtype.lanes = 1;
    t->shape = p->shape;
    t->strides = p->strides;
}

#define REFUSED(setup, code, substr)                                                               \
    do {                                                                                           \
        producer p;                                                                                \
        producer_init(&p);                                                                         \
        setup;                                                                                     \
        gpuarr_array out = {0};                                                                    \
        TEST_FAIL_WITH(gpuarr_from_dlpack(&p.m, &out), code, substr);                                 \
        cr_expect_eq(p.deleted, 1, "%s: the deleter ran %d times, want once", #setup, p.deleted);  \
        cr_expect_eq(out.id, 0u, "%s: out is left alone", #setup);                                 \
        cr_expect_eq(p.data[5], 5.0, "the producer's data is untouched");                          \
    } while (0)

Test(dlpack, import_refusals_call_the_deleter_exactly_once) {
    REFUSED(p.m.version.major = 2, GPUARR_ERROR_UNSUPPORTED, "2.1");
    REFUSED(p.m.version.major = 0, GPUARR_ERROR_UNSUPPORTED, "major");
    REFUSED(p.m.dl_tensor.dtype.lanes = 2, GPUARR_ERROR_UNSUPPORTED, "lanes");
    REFUSED(p.m.dl_tensor.dtype.code = kDLComplex, GPUARR_ERROR_UNSUPPORTED, "code 5");
    REFUSED(p.m.dl_tensor.dtype.bits = 24, GPUARR_ERROR_UNSUPPORTED, "24 bits");
    REFUSED(p.strides[1] = 8, GPUARR_ERROR_UNSUPPORTED, "dimension 1 has stride 8");
    REFUSED((p.strides[0] = 1, p.strides[2] = 6), GPUARR_ERROR_UNSUPPORTED, "compact");
    REFUSED(p.m.dl_tensor.device.device_type = kDLVulkan, GPUARR_ERROR_NO_DEVICE, "device_type 7");
    REFUSED(p.m.dl_tensor.device.device_type = (DLDeviceType)99, GPUARR_ERROR_NO_DEVICE, "device_type 99");
    REFUSED((p.m.dl_tensor.device.device_type = kDLCUDA, p.m.dl_tensor.device.device_id = 77), GPUARR_ERROR_NO_DEVICE, "cuda:77");
    REFUSED((p.m.dl_tensor.device.device_type = kDLOpenCL, p.m.dl_tensor.device.device_id = -1), GPUARR_ERROR_NO_DEVICE, "opencl:-1");
    REFUSED(p.m.dl_tensor.ndim = 9, GPUARR_ERROR_UNSUPPORTED, "ndim = 9");
    REFUSED(p.m.dl_tensor.ndim = -1, GPUARR_ERROR_UNSUPPORTED, "ndim = -1");
    REFUSED(p.m.dl_tensor.shape = NULL, GPUARR_ERROR_INVALID_ARGUMENT, "NULL shape");
    REFUSED(p.shape[1] = -3, GPUARR_ERROR_INVALID_ARGUMENT, "shape");
    REFUSED(p.m.dl_tensor.data = NULL, GPUARR_ERROR_INVALID_ARGUMENT, "data is NULL");
    REFUSED(p.m.dl_tensor.byte_offset = 4, GPUARR_ERROR_INVALID_ARGUMENT, "byte_offset 4");
    REFUSED(p.m.dl_tensor.data = (char *)p.data + 1, GPUARR_ERROR_INVALID_ARGUMENT, "aligned");
    /* NULL out: gpuarr still took t, so it calls the deleter */
    producer p;
    producer_init(&p);
    TEST_FAIL_WITH(gpuarr_from_dlpack(&p.m, NULL), GPUARR_ERROR_INVALID_ARGUMENT, "out is NULL");
    cr_expect_eq(p.deleted, 1);
    gpuarr_array out = {0};
    TEST_FAIL_WITH(gpuarr_from_dlpack(NULL, &out), GPUARR_ERROR_INVALID_ARGUMENT, "t is NULL");
    TEST_FAIL_WITH(gpuarr_from_dlpack_legacy(NULL, &out), GPUARR_ERROR_INVALID_ARGUMENT, "t is NULL");
    /* a NULL deleter is allowed: nothing to call */
    producer_init(&p);
    p.m.deleter = NULL;
    p.m.version.major = 2;
    TEST_FAIL_WITH(gpuarr_from_dlpack(&p.m, &out), GPUARR_ERROR_UNSUPPORTED, "major");
    cr_expect_eq(out.id, 0u);
}

Test(dlpack, import_calls_the_deleter_once_when_the_last_reference_goes) {
    producer p;
    producer_init(&p);
    p.m.dl_tensor.strides = NULL; /* NULL strides: compact */
    gpuarr_array a, v;
    TEST_OK(gpuarr_from_dlpack(&p.m, &a));
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(a, &info));
    cr_expect_eq(info.device.id, gpuarr_host().id);
    cr_expect_eq(info.dtype, GPUARR_F64);
    cr_expect_eq(info.ndim, 3);
    cr_expect(info.wrapped);
    cr_expect(!info.read_only);
    void *hp;
    TEST_OK(gpuarr_host_data(a, &hp));
    cr_expect_eq(hp, (void *)p.data, "no copy");
    TEST_OK(gpuarr_slice(a, 1, 2, &v));
    TEST_OK(gpuarr_release(a));
    cr_expect_eq(p.deleted, 0, "the view keeps the memory");
    double x = 0;
    TEST_OK(gpuarr_read(v, 0, 1, GPUARR_F64, &x));
    cr_expect_eq(x, 12.0);
    TEST_OK(gpuarr_release(v));
    cr_expect_eq(p.deleted, 1);
}

Test(dlpack, import_accepts_any_stride_on_size_one_dimensions_and_a_byte_offset) {
    producer p;
    producer_init(&p);
    p.shape[0] = 1, p.shape[1] = 2, p.shape[2] = 4;
    p.strides[0] = 999, p.strides[1] = 4, p.strides[2] = 1;
    p.m.dl_tensor.byte_offset = 4 * sizeof(double);
    gpuarr_array a;
    TEST_OK(gpuarr_from_dlpack(&p.m, &a));
    double out[8];
    TEST_OK(gpuarr_to_host(a, out, 8));
    for (int i = 0; i < 8; i++) cr_expect_eq(out[i], (double)(i + 4));
    TEST_OK(gpuarr_release(a));
    cr_expect_eq(p.deleted, 1);
}

Test(dlpack, a_read_only_import_refuses_writes) {
    gpuarr_device d = test_device();
    producer p;
    producer_init(&p);
    p.m.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
    gpuarr_array a, v, other;
    TEST_OK(gpuarr_from_dlpack(&p.m, &a));
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(a, &info));
    cr_expect(info.read_only);
    TEST_OK(gpuarr_slice(a, 0, 1, &v));
    int64_t n = 24;
    TEST_OK(gpuarr_zeros(d, GPUARR_F64, 1, &n, &other));
    double x = 1.0;
    TEST_FAIL_WITH(gpuarr_write(a, 0, 1, GPUARR_F64, &x), GPUARR_ERROR_INVALID_ARGUMENT, "read-only");
    TEST_FAIL_WITH(gpuarr_write(v, 0, 1, GPUARR_F64, &x), GPUARR_ERROR_INVALID_ARGUMENT, "read-only");
    TEST_FAIL_WITH(gpuarr_fill(a, x), GPUARR_ERROR_INVALID_ARGUMENT, "read-only");
    TEST_FAIL_WITH(gpuarr_fill_as(v, GPUARR_F64, &x), GPUARR_ERROR_INVALID_ARGUMENT, "read-only");
    TEST_FAIL_WITH(gpuarr_copy(a, other), GPUARR_ERROR_INVALID_ARGUMENT, "dst is read-only");
    gpuarr_stream s;
    TEST_OK(gpuarr_stream_create(d, 0, &s));
    TEST_FAIL_WITH(gpuarr_copy_async(a, other, s), GPUARR_ERROR_INVALID_ARGUMENT, "dst is read-only");
    TEST_FAIL_WITH(gpuarr_write_async(a, 0, 1, GPUARR_F64, &x, s), GPUARR_ERROR_INVALID_ARGUMENT, "read-only");
    TEST_OK(gpuarr_stream_destroy(s));
    cr_expect_eq(p.data[0], 0.0, "nothing was written");
    TEST_OK(gpuarr_copy(other, a)); /* reading it is fine */
    double y = 0;
    TEST_OK(gpuarr_read(other, 5, 1, GPUARR_F64, &y));
    cr_expect_eq(y, 5.0);
    DLManagedTensorVersioned *m;
    TEST_OK(gpuarr_to_dlpack(a, 0, &m));
    cr_expect_eq(m->flags & DLPACK_FLAG_BITMASK_READ_ONLY, (uint64_t)DLPACK_FLAG_BITMASK_READ_ONLY, "it exports read-only");
    m->deleter(m);
    DLManagedTensor *l = NULL; /* a legacy tensor cannot carry the flag: refused, as NumPy refuses */
    TEST_FAIL_WITH(gpuarr_to_dlpack_legacy(v, &l), GPUARR_ERROR_INVALID_ARGUMENT, "legacy DLManagedTensor cannot say so");
    cr_expect_null(l, "*out is set only on success");
    TEST_OK(gpuarr_release(v));
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(other));
    cr_expect_eq(p.deleted, 1);
}

/* ---------------------------------------------------------------------------------------------
 * Deleters and gpuarr_shutdown
 * ------------------------------------------------------------------------------------------- */
Test(dlpack, an_export_deleter_after_shutdown_only_frees_its_tensor) {
    gpuarr_device d = test_device();
    int64_t n = 8;
    gpuarr_array a;
    TEST_OK(gpuarr_zeros(d, GPUARR_I16, 1, &n, &a));
    DLManagedTensorVersioned *m1, *m2;
    DLManagedTensor *l;
    TEST_OK(gpuarr_to_dlpack(a, 0, &m1));
    TEST_OK(gpuarr_to_dlpack(a, 0, &m2));
    TEST_OK(gpuarr_to_dlpack_legacy(a, &l));
    gpuarr_shutdown();
    m1->deleter(m1); /* not initialized */
    TEST_OK(gpuarr_init(NULL));
    m2->deleter(m2); /* a later init cycle: the old handle is not released again */
    l->deleter(l);
    cr_expect_eq(gpuarr_device_count() > 0, 1, "gpuarr still works");
}

/* Consumers free tensors on their own threads: four threads call the deleters of 64 exports each
   at once (under TSan in make check); the memory goes with the last. */
enum { DELETER_THREADS = 4, EXPORTS_PER_THREAD = 64 };
static void *run_deleters(void *arg) {
    DLManagedTensorVersioned **m = arg;
    for (int i = 0; i < EXPORTS_PER_THREAD; i++) m[i]->deleter(m[i]);
    return NULL;
}

Test(dlpack, deleters_run_on_any_thread) {
    gpuarr_device d = test_device();
    int64_t n = 16;
    uint64_t before = live_blocks(d);
    gpuarr_array a;
    TEST_OK(gpuarr_zeros(d, GPUARR_F32, 1, &n, &a));
    static DLManagedTensorVersioned *m[DELETER_THREADS][EXPORTS_PER_THREAD];
    for (int t = 0; t < DELETER_THREADS; t++)
        for (int i = 0; i < EXPORTS_PER_THREAD; i++) TEST_OK(gpuarr_to_dlpack(a, 0, &m[t][i]));
    TEST_OK(gpuarr_release(a)); /* the tensors alone hold the memory now */
    pthread_t th[DELETER_THREADS];
    for (int t = 0; t < DELETER_THREADS; t++) cr_assert_eq(pthread_create(&th[t], NULL, run_deleters, m[t]), 0);
    for (int t = 0; t < DELETER_THREADS; t++) pthread_join(th[t], NULL);
    cr_expect_eq(live_blocks(d), before, "the last deleter, on whichever thread, freed the memory");
}

Test(dlpack, import_before_init_calls_the_deleter) {
    gpuarr_shutdown();
    producer p;
    producer_init(&p);
    gpuarr_array out = {0};
    gpuarr_result r = gpuarr_from_dlpack(&p.m, &out);
    TEST_OK(gpuarr_init(NULL)); /* for the fixture's teardown */
    cr_expect_eq(r, GPUARR_ERROR_NOT_INITIALIZED);
    cr_expect_eq(p.deleted, 1);
}

Test(dlpack, pinned_host_memory_of_a_cuda_device_exports_as_cuda_host) {
    gpuarr_device d = test_device();
    gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(d, &info));
    int64_t n = 32;
    gpuarr_array a;
    TEST_OK(gpuarr_empty_pinned(d, GPUARR_F32, 1, &n, &a));
    gpuarr_array_info ai;
    TEST_OK(gpuarr_array_get_info(a, &ai));
    DLManagedTensorVersioned *m;
    TEST_OK(gpuarr_to_dlpack(a, 0, &m));
    if (info.backend == GPUARR_BACKEND_CUDA) cr_expect(ai.pinned, "a CUDA device has a pinned pool");
    int want = (ai.pinned && info.backend == GPUARR_BACKEND_CUDA) ? 3 : 1; /* kDLCUDAHost : kDLCPU */
    cr_expect_eq((int)m->dl_tensor.device.device_type, want, "%s: device_type %d, want %d", info.spec,
                 (int)m->dl_tensor.device.device_type, want);
    cr_expect_eq(m->dl_tensor.device.device_id, 0);
    expect_data(a, &m->dl_tensor);
    gpuarr_array b; /* and back: host memory */
    TEST_OK(gpuarr_from_dlpack(m, &b));
    TEST_OK(gpuarr_array_get_info(b, &ai));
    cr_expect_eq(ai.device.id, gpuarr_host().id);
    TEST_OK(gpuarr_release(b));
    TEST_OK(gpuarr_release(a));
}

/* The Python capsule helpers (tests/python/test_numpy.py uses them from NumPy): the names, and a
   destructor that outside a Python process leaves what it is given alone. */
Test(dlpack, capsule_names_and_the_destructor_outside_python) {
    cr_expect_str_eq(gpuarr_dlpack_capsule_name(true, false), "dltensor_versioned");
    cr_expect_str_eq(gpuarr_dlpack_capsule_name(true, true), "used_dltensor_versioned");
    cr_expect_str_eq(gpuarr_dlpack_capsule_name(false, false), "dltensor");
    cr_expect_str_eq(gpuarr_dlpack_capsule_name(false, true), "used_dltensor");
    cr_expect_eq(gpuarr_dlpack_capsule_name(true, false), gpuarr_dlpack_capsule_name(true, false), "static strings");
    gpuarr_device d = test_device();
    uint64_t before = live_blocks(d);
    int64_t n = 4;
    gpuarr_array a;
    TEST_OK(gpuarr_zeros(d, GPUARR_U8, 1, &n, &a));
    DLManagedTensorVersioned *m;
    TEST_OK(gpuarr_to_dlpack(a, 0, &m));
    TEST_OK(gpuarr_release(a));
    gpuarr_dlpack_capsule_destructor(NULL);
    gpuarr_dlpack_capsule_destructor(m); /* no CPython here: it must not call m's deleter */
    cr_expect_eq(live_blocks(d), before + 1, "the tensor still holds the memory");
    m->deleter(m);
    cr_expect_eq(live_blocks(d), before);
}
