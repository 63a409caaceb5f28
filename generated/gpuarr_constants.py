# Generated from gpuarr.h (GPUARR_DTYPE_LIST, GPUARR_RESULT_LIST, GPUARR_BACKEND_LIST and the
# sizes of three structs) by tools/python-constants.c (make python-constants). Do not edit.
"""gpuarr's constants, for the Python module (python/gpuarr)."""
VERSION = "0.1.0"
# dtypes: GPUARR_DTYPE_LIST. 0 (DTYPE_INVALID) also means "keep the source's dtype".
DTYPE_INVALID = 0
BOOL = 1
I8 = 2
U8 = 3
I16 = 4
U16 = 5
I32 = 6
U32 = 7
I64 = 8
U64 = 9
F16 = 10
BF16 = 11
F32 = 12
F64 = 13
# (name, value, bytes per element), in the list's order
DTYPES = (
    ("bool", 1, 1),
    ("i8", 2, 1),
    ("u8", 3, 1),
    ("i16", 4, 2),
    ("u16", 5, 2),
    ("i32", 6, 4),
    ("u32", 7, 4),
    ("i64", 8, 8),
    ("u64", 9, 8),
    ("f16", 10, 2),
    ("bf16", 11, 2),
    ("f32", 12, 4),
    ("f64", 13, 8),
)
# results: GPUARR_RESULT_LIST. 0 is success, errors are negative.
OK = 0
ERROR_INVALID_ARGUMENT = -1
ERROR_INVALID_HANDLE = -2
ERROR_OUT_OF_MEMORY = -3
ERROR_NO_DEVICE = -4
ERROR_UNSUPPORTED = -5
ERROR_BACKEND = -6
ERROR_NOT_INITIALIZED = -7
ERROR_OVERFLOW = -8
ERROR_TIMEOUT = -9
ERROR_NOT_READY = -10
ERROR_DEVICE_LOST = -11
ERROR_BUILD = -12
# (name, value, description), in the list's order
RESULTS = (
    ("OK", 0, "success"),
    ("ERROR_INVALID_ARGUMENT", -1, "invalid argument"),
    ("ERROR_INVALID_HANDLE", -2, "invalid, released or stale handle"),
    ("ERROR_OUT_OF_MEMORY", -3, "out of memory"),
    ("ERROR_NO_DEVICE", -4, "no such device"),
    ("ERROR_UNSUPPORTED", -5, "not supported by this device or build"),
    ("ERROR_BACKEND", -6, "backend error"),
    ("ERROR_NOT_INITIALIZED", -7, "gpuarr is not initialized"),
    ("ERROR_OVERFLOW", -8, "size or count overflow"),
    ("ERROR_TIMEOUT", -9, "timed out"),
    ("ERROR_NOT_READY", -10, "work has not completed yet"),
    ("ERROR_DEVICE_LOST", -11, "the device failed earlier; gpuarr_device_reset brings it back"),
    ("ERROR_BUILD", -12, "a kernel did not compile for the device"),
)
# backends: GPUARR_BACKEND_LIST (gpuarr_device_info.backend)
BACKEND_HOST = 1
BACKEND_CUDA = 2
BACKEND_OPENCL = 3
# sizeof of the structs the module mirrors (python/gpuarr checks its own against them)
SIZEOF = {"gpuarr_device_info": 944, "gpuarr_array_info": 128, "gpuarr_pool_stats": 232}
