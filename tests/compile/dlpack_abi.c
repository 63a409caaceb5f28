/* Compile test: gpuarr.h's DLPack declarations have the v1.1 ABI (x86-64 / LP64 layout). With
   <dlpack/dlpack.h> on the include path (GPUARR_TEST_REAL_DLPACK; make python-tests takes the
   official header from a wheel, as Debian does not package it) that header comes first and
   gpuarr.h uses it; the same assertions then hold for it, so both agree field by field, and a
   round trip runs on its types. */
#define _DEFAULT_SOURCE 1 /* the implementation follows C library headers (dlpack.h's) */
#ifdef GPUARR_TEST_REAL_DLPACK
#include <dlpack/dlpack.h>
#endif
#define GPUARR_IMPLEMENTATION
#include "gpuarr.h"
#include <stdio.h>

#define AT(type, field, off) GPUARR__STATIC_ASSERT(offsetof(type, field) == (off), #type "." #field " is not at " #off);
#define SIZE(type, n) GPUARR__STATIC_ASSERT(sizeof(type) == (n), "sizeof(" #type ") is not " #n);

GPUARR__STATIC_ASSERT(DLPACK_MAJOR_VERSION == 1, "DLPack major version 1");
GPUARR__STATIC_ASSERT(DLPACK_FLAG_BITMASK_READ_ONLY == 1 && DLPACK_FLAG_BITMASK_IS_COPIED == 2, "DLPack flag bits");
GPUARR__STATIC_ASSERT(GPUARR_DLPACK_READ_ONLY == DLPACK_FLAG_BITMASK_READ_ONLY, "GPUARR_DLPACK_READ_ONLY is DLPack's bit");
GPUARR__STATIC_ASSERT(kDLCPU == 1 && kDLCUDA == 2 && kDLCUDAHost == 3 && kDLOpenCL == 4 && kDLCUDAManaged == 13, "device types");
GPUARR__STATIC_ASSERT(kDLInt == 0 && kDLUInt == 1 && kDLFloat == 2 && kDLOpaqueHandle == 3 && kDLBfloat == 4 &&
                          kDLComplex == 5 && kDLBool == 6, "dtype codes");
SIZE(DLPackVersion, 8) AT(DLPackVersion, major, 0) AT(DLPackVersion, minor, 4)
SIZE(DLDeviceType, 4)
SIZE(DLDevice, 8) AT(DLDevice, device_type, 0) AT(DLDevice, device_id, 4)
SIZE(DLDataType, 4) AT(DLDataType, code, 0) AT(DLDataType, bits, 1) AT(DLDataType, lanes, 2)
SIZE(DLTensor, 48)
AT(DLTensor, data, 0) AT(DLTensor, device, 8) AT(DLTensor, ndim, 16) AT(DLTensor, dtype, 20)
AT(DLTensor, shape, 24) AT(DLTensor, strides, 32) AT(DLTensor, byte_offset, 40)
SIZE(DLManagedTensor, 64)
AT(DLManagedTensor, dl_tensor, 0) AT(DLManagedTensor, manager_ctx, 48) AT(DLManagedTensor, deleter, 56)
SIZE(DLManagedTensorVersioned, 80)
AT(DLManagedTensorVersioned, version, 0) AT(DLManagedTensorVersioned, manager_ctx, 8)
AT(DLManagedTensorVersioned, deleter, 16) AT(DLManagedTensorVersioned, flags, 24) AT(DLManagedTensorVersioned, dl_tensor, 32)

/* And a round trip through the types of whichever header declared them, spelled both ways. */
int main(void) {
    if (gpuarr_init(NULL) != GPUARR_OK) return 1;
    int64_t n = 3;
    float v[3] = {1, 2, 3};
    gpuarr_array a, b;
    struct DLManagedTensorVersioned *t; /* the official header's C spelling */
    if (gpuarr_from_host(gpuarr_host(), v, 1, &n, &a) != GPUARR_OK || gpuarr_to_dlpack(a, 0, &t) != GPUARR_OK) return 1;
    DLManagedTensorVersioned *same = t; /* and gpuarr.h's typedef */
    int ok = same->version.major == 1 && t->dl_tensor.ndim == 1 && t->dl_tensor.shape[0] == 3 &&
             t->dl_tensor.dtype.code == kDLFloat && ((float *)t->dl_tensor.data)[2] == 3.0f;
    if (gpuarr_release(a) != GPUARR_OK || gpuarr_from_dlpack(t, &b) != GPUARR_OK) return 1;
    float back[3] = {0};
    ok = ok && gpuarr_to_host(b, back, 3) == GPUARR_OK && back[1] == 2.0f && gpuarr_release(b) == GPUARR_OK;
    gpuarr_shutdown();
    printf("dlpack-abi: DLPack %d.%d %s: sizes and offsets hold, round trip %s\n", DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION,
#ifdef GPUARR_TEST_REAL_DLPACK
           "from <dlpack/dlpack.h>",
#else
           "from gpuarr.h",
#endif
           ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}
