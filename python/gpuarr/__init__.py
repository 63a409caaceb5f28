"""gpuarr from Python: arrays on the host, CUDA and OpenCL devices, and DLPack both ways.

Pure Python over libgpuarr.so through ctypes; nothing to build. The library is the file named by
the environment variable GPUARR_LIB, else libgpuarr.so.0 where the loader finds it.

    import numpy as np, gpuarr
    a = gpuarr.from_dlpack(np.arange(6, dtype=np.float32))   # NumPy's memory, no copy
    b = a.to(device="opencl:0", dtype="f16")                 # gpuarr_convert
    y = np.from_dlpack(b.to(device="host"))                  # gpuarr's memory, no copy

gpuarr starts on first use (gpuarr_init(NULL)); gpuarr.init() and gpuarr.shutdown() do it
explicitly. Failed calls raise gpuarr.Error, whose .result is the gpuarr_result (gpuarr.ERROR_*)
and whose message is gpuarr_last_error(). The constants (dtypes, results, backends) are
generated from gpuarr.h (generated/gpuarr_constants.py in the repository, gpuarr/_constants.py
once installed).
"""
import ctypes as C
import importlib.util
import os
import threading
import weakref

try:  # the installed copy: make install puts generated/gpuarr_constants.py here
    from . import _constants as _k
except ImportError:  # the repository: python/gpuarr/../../generated/
    _path = os.path.join(os.path.dirname(__file__), "..", "..", "generated", "gpuarr_constants.py")
    _spec = importlib.util.spec_from_file_location("gpuarr._constants", _path)
    _k = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_k)

for _name in dir(_k):
    if _name.isupper() and not _name.startswith("_"):
        globals()[_name] = getattr(_k, _name)
DTYPE_NAMES = tuple(n for n, _, _ in _k.DTYPES)  # "bool", "i8", ... "f64"
_DTYPE_BY_NAME = {n: v for n, v, _ in _k.DTYPES}
_DTYPE_NAME = {v: n for n, v, _ in _k.DTYPES}
_RESULT_NAME = {v: n for n, v, _ in _k.RESULTS}
# other spellings of the dtypes: NumPy's and JAX's names
_DTYPE_ALIASES = {"bool_": "bool", "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
                  "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64", "float16": "f16",
                  "bfloat16": "bf16", "float32": "f32", "float64": "f64"}

# DLPack's device types (DLDeviceType) that gpuarr has, and the capsule flag of a copy
KDLCPU, KDLCUDA, KDLCUDAHOST, KDLOPENCL = 1, 2, 3, 4
_DLPACK_IS_COPIED = 2
_DLPACK_FLAGS_OFFSET = 24  # DLManagedTensorVersioned: version (8 bytes), manager_ctx, deleter, flags


class Error(Exception):
    """A gpuarr call failed: .result is its gpuarr_result, the message gpuarr_last_error()."""

    def __init__(self, result, message):
        self.result = result
        self.name = "GPUARR_" + _RESULT_NAME.get(result, "ERROR_%d" % result)
        super().__init__("%s: %s" % (self.name, message))


class DLPackError(Error, BufferError):
    """gpuarr refused a DLPack export or import: a BufferError, as the array API asks."""


class _Handle(C.Structure):  # gpuarr_device, gpuarr_array: {uint32_t id}
    _fields_ = [("id", C.c_uint32)]


class _DeviceInfo(C.Structure):  # gpuarr_device_info, field for field
    _fields_ = [("device", _Handle), ("backend", C.c_int), ("index", C.c_int), ("type", C.c_int),
                ("spec", C.c_char * 32), ("name", C.c_char * 256), ("vendor", C.c_char * 128),
                ("version", C.c_char * 128), ("compute_capability_major", C.c_int),
                ("compute_capability_minor", C.c_int), ("total_memory", C.c_uint64), ("free_memory", C.c_uint64),
                ("max_alloc_bytes", C.c_uint64), ("compute_units", C.c_int), ("copy_engines", C.c_int),
                ("clock_mhz", C.c_int), ("host_unified", C.c_bool), ("has_pci", C.c_bool), ("pci_domain", C.c_int),
                ("pci_bus", C.c_int), ("pci_device", C.c_int), ("pci_function", C.c_int),
                ("pci_bus_id", C.c_char * 32), ("has_uuid", C.c_bool), ("uuid", C.c_uint8 * 16),
                ("same_as", _Handle), ("state", C.c_int), ("failure", C.c_char * 256)]


class _ArrayInfo(C.Structure):  # gpuarr_array_info, field for field
    _fields_ = [("device", _Handle), ("dtype", C.c_int), ("ndim", C.c_int), ("shape", C.c_int64 * 8),
                ("count", C.c_int64), ("itemsize", C.c_size_t), ("nbytes", C.c_size_t),
                ("host_accessible", C.c_bool), ("wrapped", C.c_bool), ("host_fallback", C.c_bool),
                ("pinned", C.c_bool), ("is_view", C.c_bool), ("offset", C.c_size_t), ("refcount", C.c_uint32),
                ("read_only", C.c_bool)]


POOL_STATS_FIELDS = (
    "allocated_bytes", "peak_allocated_bytes", "total_allocated_bytes", "requested_bytes", "peak_requested_bytes",
    "total_requested_bytes", "reserved_bytes", "peak_reserved_bytes", "total_reserved_bytes", "allocations",
    "peak_allocations", "total_allocations", "segments", "peak_segments", "total_segments", "limit_bytes",
    "release_threshold_bytes", "cache_hits", "cache_misses", "backend_allocs", "backend_frees", "cross_stream_waits",
    "oom_handler_calls", "oom_oversize_releases", "oom_waits", "oom_trims", "oom_retries", "oom_failures",
    "host_fallbacks")


class _PoolStats(C.Structure):  # gpuarr_pool_stats: uint64_t counters, in order
    _fields_ = [(n, C.c_uint64) for n in POOL_STATS_FIELDS]


for _struct, _cname in ((_DeviceInfo, "gpuarr_device_info"), (_ArrayInfo, "gpuarr_array_info"),
                        (_PoolStats, "gpuarr_pool_stats")):
    if C.sizeof(_struct) != _k.SIZEOF[_cname]:
        raise ImportError("gpuarr: %s is %d bytes in gpuarr.h, %d in this module: the module does not match the "
                          "header (make python-constants, then mirror the struct)" %
                          (_cname, _k.SIZEOF[_cname], C.sizeof(_struct)))

_P = C.POINTER
_I64P = _P(C.c_int64)
_VP = C.c_void_p
_SIGNATURES = [  # name, result, arguments
    ("gpuarr_init", C.c_int, [_VP]), ("gpuarr_shutdown", None, []),
    ("gpuarr_result_name", C.c_char_p, [C.c_int]), ("gpuarr_last_error", C.c_char_p, []),
    ("gpuarr_version_string", C.c_char_p, []),
    ("gpuarr_device_count", C.c_int, []), ("gpuarr_device_at", _Handle, [C.c_int]), ("gpuarr_host", _Handle, []),
    ("gpuarr_device_find", C.c_int, [C.c_char_p, _P(_Handle)]),
    ("gpuarr_device_get_info", C.c_int, [_Handle, _P(_DeviceInfo)]),
    ("gpuarr_empty", C.c_int, [_Handle, C.c_int, C.c_int, _I64P, _P(_Handle)]),
    ("gpuarr_zeros", C.c_int, [_Handle, C.c_int, C.c_int, _I64P, _P(_Handle)]),
    ("gpuarr_convert", C.c_int, [_Handle, _Handle, C.c_int, _P(_Handle)]),
    ("gpuarr_copy", C.c_int, [_Handle, _Handle]),
    ("gpuarr_release", C.c_int, [_Handle]),
    ("gpuarr_array_get_info", C.c_int, [_Handle, _P(_ArrayInfo)]),
    ("gpuarr_host_data", C.c_int, [_Handle, _P(_VP)]),
    ("gpuarr_pool_get_stats", C.c_int, [_Handle, _P(_PoolStats)]),
    ("gpuarr_to_dlpack", C.c_int, [_Handle, C.c_uint64, _P(_VP)]),
    ("gpuarr_to_dlpack_legacy", C.c_int, [_Handle, _P(_VP)]),
    ("gpuarr_from_dlpack", C.c_int, [_VP, _P(_Handle)]),
    ("gpuarr_from_dlpack_legacy", C.c_int, [_VP, _P(_Handle)]),
    ("gpuarr_dlpack_capsule_name", _VP, [C.c_bool, C.c_bool]),
    ("gpuarr_opencl_mem_raw", C.c_int, [_Handle, _P(_VP), _P(C.c_size_t)]),
    ("gpuarr_opencl_wrap_mem_raw", C.c_int, [_Handle, _VP, C.c_size_t, C.c_int, C.c_int, _I64P, _P(_Handle)]),
]
# Bound when first called, so that the module imports with a library that lacks them.
_LATER_SIGNATURES = {
    "gpuarr_opencl_adopt_raw": (C.c_int, [_VP, _VP, _VP, _P(_Handle)]),
    "gpuarr_device_remove": (C.c_int, [_Handle]),
    "gpuarr_opencl_export_mem_raw": (C.c_int, [_Handle, _P(_VP)]),
}


def _load():
    path = os.environ.get("GPUARR_LIB") or "libgpuarr.so.0"
    try:
        lib = C.CDLL(path)
    except OSError as e:
        raise ImportError("gpuarr: cannot load %s (set GPUARR_LIB to libgpuarr.so's path, or install it where the "
                          "loader looks): %s" % (path, e)) from e
    for name, restype, argtypes in _SIGNATURES:
        f = getattr(lib, name)
        f.restype, f.argtypes = restype, argtypes
    return lib


_lib = _load()


class _api:  # CPython's capsule calls, as prototypes of our own: ctypes.pythonapi's are shared
    PyCapsule_New = C.PYFUNCTYPE(C.py_object, _VP, _VP, _VP)(("PyCapsule_New", C.pythonapi))
    PyCapsule_GetName = C.PYFUNCTYPE(C.c_char_p, C.py_object)(("PyCapsule_GetName", C.pythonapi))
    PyCapsule_GetPointer = C.PYFUNCTYPE(_VP, C.py_object, _VP)(("PyCapsule_GetPointer", C.pythonapi))
    PyCapsule_SetName = C.PYFUNCTYPE(C.c_int, C.py_object, _VP)(("PyCapsule_SetName", C.pythonapi))


# The capsule names are the library's static strings: a capsule keeps a pointer to its name, which
# must outlive every Python object. Its destructor is C too (gpuarr_dlpack_capsule_destructor).
_CAPSULE_NAME = {(v, u): _lib.gpuarr_dlpack_capsule_name(v, u) for v in (False, True) for u in (False, True)}
_CAPSULE_DESTRUCTOR = C.cast(_lib.gpuarr_dlpack_capsule_destructor, _VP)


def _later(name):
    """A library call added after this module's oldest supported library, bound on first use."""
    f = getattr(_lib, name, None)
    if f is None:
        raise Error(ERROR_UNSUPPORTED, "%s: not in this libgpuarr (%s)" % (name, _lib._name))
    f.restype, f.argtypes = _LATER_SIGNATURES[name]
    return f


def _check(result, cls=Error):
    if result != 0:
        raise cls(result, _lib.gpuarr_last_error().decode(errors="replace"))


# ---- starting and stopping ---------------------------------------------------------------------
class _State:
    lock = threading.RLock()  # a finalizer may run in a collection while this thread holds it
    held = False  # this module holds one gpuarr_init reference
    epoch = 0     # bumped by shutdown: handles of an earlier epoch are gone


def init():
    """Starts gpuarr (gpuarr_init(NULL)), unless this module already did."""
    with _State.lock:
        if not _State.held:
            _check(_lib.gpuarr_init(None))
            _State.held = True


def shutdown():
    """Drops this module's gpuarr reference: arrays and devices made before are gone (using them
    raises Error ERROR_INVALID_HANDLE, and their memory with them, also what consumers still hold
    through DLPack: their deleters then only free the tensors). The next use starts gpuarr
    again. At interpreter exit the module releases its arrays and leaves gpuarr running, so that
    tensors consumers hold stay valid to the end."""
    with _State.lock:
        if _State.held:
            _State.epoch += 1
            _State.held = False
            _lib.gpuarr_shutdown()



def _epoch():
    init()
    return _State.epoch


# ---- dtypes and devices ------------------------------------------------------------------------
def dtype_value(dtype):
    """The gpuarr_dtype of a name ("f32"), a NumPy or JAX dtype or its name ("float32"), or a value."""
    if isinstance(dtype, int):
        if dtype in _DTYPE_NAME:
            return dtype
        raise ValueError("dtype %d is no gpuarr dtype (1..%d)" % (dtype, len(_DTYPE_NAME)))
    name = getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype)
    name = _DTYPE_ALIASES.get(name, name)
    if name not in _DTYPE_BY_NAME:
        raise ValueError("dtype %r is no gpuarr dtype (%s)" % (dtype, ", ".join(DTYPE_NAMES)))
    return _DTYPE_BY_NAME[name]


class Device:
    """A gpuarr device: .spec ("host", "opencl:0", ...), .info() (gpuarr_device_info as a dict)."""
    __slots__ = ("_id", "_epoch", "spec")

    def __init__(self, handle):
        self._id, self._epoch = handle.id, _epoch()
        self.spec = self._info().spec.decode()

    def _handle(self):
        if self._epoch != _State.epoch or not _State.held:
            raise Error(ERROR_INVALID_HANDLE, "device %s: gpuarr.shutdown() ended it" % self.spec)
        return _Handle(self._id)

    def _info(self):
        i = _DeviceInfo()
        _check(_lib.gpuarr_device_get_info(_Handle(self._id), C.byref(i)))
        return i

    def info(self):
        self._handle()
        i = self._info()
        out = {}
        for name, _ in _DeviceInfo._fields_:
            v = getattr(i, name)
            out[name] = (v.decode(errors="replace") if isinstance(v, bytes) else
                         Device(v) if isinstance(v, _Handle) and v.id and name == "same_as" else
                         None if isinstance(v, _Handle) else bytes(v) if name == "uuid" else v)
        out["device"] = self
        return out

    def remove(self):
        """Drops a device made by opencl_adopt (gpuarr_device_remove)."""
        _check(_later("gpuarr_device_remove")(self._handle()))
        self._epoch = -1

    def __eq__(self, other):
        return isinstance(other, Device) and other._id == self._id and other._epoch == self._epoch

    def __hash__(self):
        return hash((self._id, self._epoch))

    def __repr__(self):
        return "gpuarr.Device(%r)" % self.spec


def device(spec="host"):
    """The device of a spec ("host", "cuda:1", "opencl:0", "gpu", "any": gpuarr_device_find)."""
    if isinstance(spec, Device):
        return spec
    _epoch()
    h = _Handle()
    _check(_lib.gpuarr_device_find(str(spec).encode(), C.byref(h)))
    return Device(h)


def devices():
    """Every device gpuarr has, the host first."""
    _epoch()
    return [Device(_lib.gpuarr_device_at(i)) for i in range(_lib.gpuarr_device_count())]


def pool_stats(dev="host"):
    """The memory pool's counters of a device (gpuarr_pool_get_stats) as a dict."""
    st = _PoolStats()
    _check(_lib.gpuarr_pool_get_stats(device(dev)._handle(), C.byref(st)))
    return {n: getattr(st, n) for n in POOL_STATS_FIELDS}


def _shape_arg(shape):
    shape = tuple(int(n) for n in shape)
    return len(shape), (C.c_int64 * max(len(shape), 1))(*shape)


# ---- arrays ------------------------------------------------------------------------------------
def _release(handle_id, epoch):
    """An Array's finalizer: one gpuarr_release, unless gpuarr.shutdown() already took the array."""
    with _State.lock:
        if epoch == _State.epoch and _State.held:
            _lib.gpuarr_release(_Handle(handle_id))


class Array:
    """Owns one gpuarr_array reference, released exactly once: by release(), or when the object
    goes (also at interpreter exit), or by gpuarr.shutdown()."""
    __slots__ = ("_id", "_epoch", "_finalizer", "_dl_device", "__weakref__")

    def __init__(self, handle):
        self._id, self._epoch = handle.id, _State.epoch
        self._dl_device = None  # __dlpack_device__'s answer, fixed for the array's life
        self._finalizer = weakref.finalize(self, _release, handle.id, self._epoch)

    def _handle(self):
        if not self._finalizer.alive:
            raise Error(ERROR_INVALID_HANDLE, "this gpuarr.Array was released")
        if self._epoch != _State.epoch or not _State.held:
            raise Error(ERROR_INVALID_HANDLE, "gpuarr.shutdown() ended this array")
        return _Handle(self._id)

    def release(self):
        """Drops the reference now (later calls do nothing)."""
        self._finalizer()

    def info(self):
        i = _ArrayInfo()
        _check(_lib.gpuarr_array_get_info(self._handle(), C.byref(i)))
        return i

    @property
    def dtype(self):
        return _DTYPE_NAME[self.info().dtype]

    @property
    def shape(self):
        i = self.info()
        return tuple(i.shape[:i.ndim])

    @property
    def ndim(self):
        return self.info().ndim

    @property
    def size(self):
        return self.info().count

    @property
    def nbytes(self):
        return self.info().nbytes

    @property
    def read_only(self):
        return self.info().read_only

    @property
    def device(self):
        """The spec of the array's device ("host", "opencl:0")."""
        return Device(self.info().device).spec

    @property
    def host_data(self):
        """The address of the first element of an array in host memory (gpuarr_host_data)."""
        p = _VP()
        _check(_lib.gpuarr_host_data(self._handle(), C.byref(p)))
        return p.value or 0

    def to(self, device=None, dtype=None):
        """The array on another device and/or as another dtype (gpuarr_convert); the same memory,
        no copy, when both are the array's own."""
        dev = _device_of(self) if device is None else globals()["device"](device)
        out = _Handle()
        _check(_lib.gpuarr_convert(self._handle(), dev._handle(), 0 if dtype is None else dtype_value(dtype),
                                   C.byref(out)))
        return Array(out)

    def copy(self, device=None):
        """A new array with the same elements, on `device` (default: the array's own)."""
        dev = _device_of(self) if device is None else globals()["device"](device)
        i = self.info()
        out = _Handle()
        ndim, shape = _shape_arg(i.shape[:i.ndim])
        _check(_lib.gpuarr_empty(dev._handle(), i.dtype, ndim, shape, C.byref(out)))
        a = Array(out)
        a.copy_from(self)
        return a

    def copy_from(self, src):
        """Writes src's elements (cast to this dtype) into this array (gpuarr_copy)."""
        _check(_lib.gpuarr_copy(self._handle(), src._handle()))

    def __dlpack_device__(self):
        if self._dl_device is None:  # asked twice per hand-over (consumers, then __dlpack__)
            self._dl_device = self._find_dlpack_device()
        return self._dl_device

    def _find_dlpack_device(self):
        i = self.info()
        backend, index = _device_static(i.device.id)
        if backend == BACKEND_CUDA:
            return (KDLCUDA, index)
        if backend == BACKEND_OPENCL:
            return (KDLOPENCL, index)
        if i.pinned:  # pinned for a CUDA device is kDLCUDAHost: the export says which
            p = _VP()
            _check(_lib.gpuarr_to_dlpack(self._handle(), 0, C.byref(p)), DLPackError)
            t = _DLManaged.from_address(p.value)
            kind = t.device_type
            t.deleter(p.value)
            return (kind, 0)
        return (KDLCPU, 0)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule of the array, as the array API says: "dltensor_versioned" when
        max_version >= (1, 0), else a legacy "dltensor"; no copy unless copy=True or dl_device
        names another device (copy=False then raises BufferError)."""
        own = self.__dlpack_device__()
        target = own if dl_device is None else (int(dl_device[0]), int(dl_device[1]))
        _check_stream(stream, target[0])
        src = self
        if target != own or copy:
            if copy is False:
                raise BufferError("gpuarr: dl_device %r is not the array's %r, and copy=False" % (target, own))
            src = self.copy(_device_of_dlpack(target))
        versioned = max_version is not None and tuple(max_version)[0] >= 1
        p = _VP()
        if versioned:
            _check(_lib.gpuarr_to_dlpack(src._handle(), 0, C.byref(p)), DLPackError)
            if src is not self:
                C.c_uint64.from_address(p.value + _DLPACK_FLAGS_OFFSET).value |= _DLPACK_IS_COPIED
        else:
            _check(_lib.gpuarr_to_dlpack_legacy(src._handle(), C.byref(p)), DLPackError)
        return _api.PyCapsule_New(p, _CAPSULE_NAME[versioned, False], _CAPSULE_DESTRUCTOR)

    def opencl_mem(self):
        """(cl_mem, byte offset) of an OpenCL array (gpuarr_opencl_mem_raw): gpuarr's, valid while
        the array lives."""
        mem, off = _VP(), C.c_size_t()
        _check(_lib.gpuarr_opencl_mem_raw(self._handle(), C.byref(mem), C.byref(off)))
        return mem.value, off.value

    def opencl_export(self):
        """A new cl_mem over exactly this array's bytes, the caller's to release
        (clReleaseMemObject; pyopencl: cl.Buffer.from_int_ptr(mem, retain=False))."""
        mem = _VP()
        _check(_later("gpuarr_opencl_export_mem_raw")(self._handle(), C.byref(mem)))
        return mem.value

    def __repr__(self):
        try:
            return "gpuarr.Array(shape=%r, dtype=%r, device=%r)" % (self.shape, self.dtype, self.device)
        except Error:
            return "gpuarr.Array(<gone>)"


class _DLManaged(C.Structure):  # the start of DLManagedTensorVersioned, to read its device
    _fields_ = [("version", C.c_uint32 * 2), ("manager_ctx", _VP), ("deleter", C.CFUNCTYPE(None, _VP)),
                ("flags", C.c_uint64), ("data", _VP), ("device_type", C.c_int32), ("device_id", C.c_int32)]


_DEVICE_STATIC = {}  # (epoch, device id) -> (backend, index): fixed while the device lives


def _device_static(device_id):
    """A device's backend and index without gpuarr_device_get_info's fresh memory reading."""
    key = (_State.epoch, device_id)
    found = _DEVICE_STATIC.get(key)
    if found is None:
        i = _DeviceInfo()
        _check(_lib.gpuarr_device_get_info(_Handle(device_id), C.byref(i)))
        found = _DEVICE_STATIC[key] = (i.backend, i.index)
    return found


def _device_of(a):
    return Device(a.info().device)


def _device_of_dlpack(dl_device):
    kind, index = dl_device
    spec = {KDLCPU: "host", KDLCUDA: "cuda:%d" % index, KDLOPENCL: "opencl:%d" % index}.get(kind)
    if spec is None:
        raise BufferError("gpuarr: dl_device %r: gpuarr exports to kDLCPU (1), kDLCUDA (2) and kDLOpenCL (4)"
                          % (dl_device,))
    try:
        return device(spec)
    except Error as e:
        raise BufferError("gpuarr: dl_device %r: %s" % (dl_device, e)) from e


def _check_stream(stream, kind):
    """The array API's stream rules: on kDLCPU only None; on CUDA None, -1, 1, 2 or a stream (the
    export waits for the data either way, which any consumer stream can rely on); OpenCL has no
    convention for streams yet: None or -1."""
    if stream is None:
        return
    if kind == KDLCUDA and isinstance(stream, int) and (stream == -1 or stream >= 1):
        return
    if kind == KDLOPENCL and stream == -1:
        return
    raise ValueError("gpuarr: stream=%r is not valid for DLPack device type %d (kDLCPU: None only; kDLCUDA: None, "
                     "-1 or a stream >= 1; kDLOpenCL: None or -1)" % (stream, kind))


def empty(shape, dtype="f32", device="host"):
    """An uninitialized array (gpuarr_empty)."""
    return _new(_lib.gpuarr_empty, shape, dtype, device)


def zeros(shape, dtype="f32", device="host"):
    """A zero-filled array (gpuarr_zeros)."""
    return _new(_lib.gpuarr_zeros, shape, dtype, device)


def _new(make, shape, dtype, dev):
    d = globals()["device"](dev)
    ndim, s = _shape_arg(shape)
    out = _Handle()
    _check(make(d._handle(), dtype_value(dtype), ndim, s, C.byref(out)))
    return Array(out)


# ---- DLPack import -----------------------------------------------------------------------------
def _is_capsule(obj):
    return type(obj).__name__ == "PyCapsule"


def _take(capsule):
    """A gpuarr array of a producer's capsule: versioned or legacy by its name, renamed "used_..."
    before gpuarr takes the tensor (gpuarr owns it whatever the outcome)."""
    name = _api.PyCapsule_GetName(capsule)
    if name not in (b"dltensor_versioned", b"dltensor"):
        raise BufferError("gpuarr.from_dlpack: a capsule named %r is no DLPack tensor, or was already used" % name)
    versioned = name == b"dltensor_versioned"
    p = _api.PyCapsule_GetPointer(capsule, _CAPSULE_NAME[versioned, False])
    if _api.PyCapsule_SetName(capsule, _CAPSULE_NAME[versioned, True]) != 0:
        raise BufferError("gpuarr.from_dlpack: PyCapsule_SetName failed")
    out = _Handle()
    take = _lib.gpuarr_from_dlpack if versioned else _lib.gpuarr_from_dlpack_legacy
    _check(take(p, C.byref(out)), DLPackError)
    return Array(out)


def from_dlpack(x, *, device=None, copy=None):
    """A gpuarr array of any DLPack producer (an object with __dlpack__, or a capsule): on the
    producer's memory with no copy, unless copy=True or `device` is another device (then copied
    there; copy=False refuses that with BufferError). Producers that speak DLPack 1.x give a
    versioned tensor; older ones (and JAX, asked for 1.0) a legacy one: both are taken."""
    _epoch()
    if _is_capsule(x):
        capsule = x
    else:
        try:
            capsule = x.__dlpack__(max_version=(1, 0))
        except TypeError:  # a producer that predates max_version
            capsule = x.__dlpack__()
    a = _take(capsule)
    if device is None and not copy:
        return a
    dev = _device_of(a) if device is None else globals()["device"](device)
    if dev == _device_of(a) and not copy:
        return a
    if copy is False:
        raise BufferError("gpuarr.from_dlpack: the tensor is on %s, not %s, and copy=False" % (a.device, dev.spec))
    out = a.copy(dev)
    a.release()
    return out


# ---- OpenCL contexts of other programs ---------------------------------------------------------
def opencl_adopt(context, device_id, queue=None):
    """A gpuarr device of the caller's cl_context and cl_device_id (integer handles, e.g.
    pyopencl's .int_ptr); the in-order cl_command_queue, if given, is its default stream
    (gpuarr_opencl_adopt_raw). Device.remove() drops it."""
    _epoch()
    out = _Handle()
    _check(_later("gpuarr_opencl_adopt_raw")(_VP(context), _VP(device_id), _VP(queue) if queue else None,
                                            C.byref(out)))
    return Device(out)


def opencl_wrap(dev, mem, dtype, shape, offset=0):
    """An array over the caller's cl_mem (an integer handle) from byte `offset` on
    (gpuarr_opencl_wrap_mem_raw): gpuarr retains the buffer while the array lives."""
    d = device(dev)
    ndim, s = _shape_arg(shape)
    out = _Handle()
    _check(_lib.gpuarr_opencl_wrap_mem_raw(d._handle(), _VP(mem), offset, dtype_value(dtype), ndim, s, C.byref(out)))
    return Array(out)


def version():
    return _lib.gpuarr_version_string().decode()
