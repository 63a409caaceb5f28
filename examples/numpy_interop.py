"""gpuarr <-> NumPy through DLPack, with ctypes alone: python numpy_interop.py [libgpuarr.so] [device]"""
import ctypes as C, sys
import numpy as np

lib = C.CDLL(sys.argv[1] if len(sys.argv) > 1 else "libgpuarr.so.0")
class Handle(C.Structure): _fields_ = [("id", C.c_uint32)]  # gpuarr_device, gpuarr_array
api = C.pythonapi
api.PyCapsule_New.restype, api.PyCapsule_New.argtypes = C.py_object, [C.c_void_p] * 3
api.PyCapsule_GetPointer.restype, api.PyCapsule_GetPointer.argtypes = C.c_void_p, [C.py_object, C.c_void_p]
api.PyCapsule_SetName.argtypes = [C.py_object, C.c_void_p]
lib.gpuarr_host.restype, lib.gpuarr_last_error.restype = Handle, C.c_char_p
lib.gpuarr_dlpack_capsule_name.restype, lib.gpuarr_dlpack_capsule_name.argtypes = C.c_void_p, [C.c_bool] * 2
VERSIONED, USED = lib.gpuarr_dlpack_capsule_name(True, False), lib.gpuarr_dlpack_capsule_name(True, True)

class Exported:  # what numpy.from_dlpack takes: a gpuarr host array, no copy
    def __init__(self, a): self.a = a
    def __dlpack_device__(self): return (1, 0)  # kDLCPU
    def __dlpack__(self, stream=None, max_version=None, **_):
        t = C.c_void_p()
        assert lib.gpuarr_to_dlpack(self.a, C.c_uint64(0), C.byref(t)) == 0, lib.gpuarr_last_error()
        return api.PyCapsule_New(t, VERSIONED, C.cast(lib.gpuarr_dlpack_capsule_destructor, C.c_void_p))

def from_numpy(x):  # a gpuarr array on x's memory, no copy; NumPy's deleter runs when it goes
    capsule = x.__dlpack__(max_version=(1, 0))
    t = api.PyCapsule_GetPointer(capsule, VERSIONED)
    api.PyCapsule_SetName(capsule, USED)  # gpuarr owns the tensor now, whatever happens next
    a = Handle()
    assert lib.gpuarr_from_dlpack(C.c_void_p(t), C.byref(a)) == 0, lib.gpuarr_last_error()
    return a

assert lib.gpuarr_init(None) == 0
x = np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3)
a, dev, on_dev, back = from_numpy(x), Handle(), Handle(), Handle()
assert lib.gpuarr_device_find((sys.argv[2] if len(sys.argv) > 2 else "host").encode(), C.byref(dev)) == 0, lib.gpuarr_last_error()
assert lib.gpuarr_convert(a, dev, 0, C.byref(on_dev)) == 0 and lib.gpuarr_convert(on_dev, lib.gpuarr_host(), 0, C.byref(back)) == 0
y = np.from_dlpack(Exported(back))  # the round trip's result, viewed by NumPy without a copy
print("NumPy -> gpuarr -> device -> NumPy:", y.tolist())
assert np.array_equal(x, y)
for h in (a, on_dev, back): lib.gpuarr_release(h)
del y
lib.gpuarr_shutdown()
