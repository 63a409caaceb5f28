/* Compile test: gpuarr.h's DLPack declarations have the v1.1 ABI (x86-64 / LP64 layout). With
   <dlpack/dlpack.h> on the include path (GPUARR_TEST_REAL_DLPACK) the official header comes first
   and gpuarr.h uses it; the same assertions then hold for it, so both agree field by field. */
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

int main(void) {
    puts("dlpack-abi: DLPack v1.1 sizes and offsets hold");
    return 0;
}
