/*
 * gpuarr_kernels_cuda.h -- the CUDA C++ dialect of gpuarr_kernels.h (see its header comment).
 *
 * NVRTC compiles this text, followed by one GPUARR_K_CAST_KERNEL(...) line per dtype pair, with
 * gpuarr_kernels.h handed over as an in-memory header: at run time when the committed PTX
 * cannot be used, and in tools/cuda-ptx.c, which makes that PTX. nvcc compiles it as is.
 * Both receive it as text from generated/gpuarr_kernels_source.h (tools/embed-kernels.sh).
 */
#ifdef __CUDACC_RTC__ /* NVRTC has no C library headers */
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#define INT8_MIN (-128)
#define INT8_MAX 127
#define UINT8_MAX 255
#define INT16_MIN (-32767 - 1)
#define INT16_MAX 32767
#define UINT16_MAX 65535
#define INT32_MIN (-2147483647 - 1)
#define INT32_MAX 2147483647
#define UINT32_MAX 4294967295u
#define INT64_MIN (-9223372036854775807LL - 1)
#define INT64_MAX 9223372036854775807LL
#define UINT64_MAX 18446744073709551615ULL
#else
#include <stdint.h>
#endif

#define GPUARR_K_FN static __device__ __forceinline__
#define GPUARR_K_F32_BITS(x) __float_as_uint(x)
#define GPUARR_K_BITS_F32(u) __uint_as_float(u)
#define GPUARR_K_F64_BITS(x) ((uint64_t)__double_as_longlong(x))
#define GPUARR_K_BITS_F64(u) __longlong_as_double((long long)(u))
#define GPUARR_K_CLZ64(x) __clzll((long long)(x))
#define GPUARR_K_U64(c) c##ULL
#define GPUARR_K_HAVE_F64 1
#define GPUARR_K_KERNEL extern "C" __global__
#define GPUARR_K_GLOBAL
#define GPUARR_K_SIZE uint64_t
#define GPUARR_K_INDEX ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x)

#include "gpuarr_kernels.h"
