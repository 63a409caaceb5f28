"""DLPack against the real consumer and producer: NumPy (>= 2.1), through ctypes only.

libgpuarr.so (make lib) is loaded with ctypes; exported tensors are wrapped in capsules made by
CPython's PyCapsule_New with gpuarr_dlpack_capsule_destructor (C, in the library) as their
destructor, offered through __dlpack__ / __dlpack_device__ and taken by numpy.from_dlpack. The
other way, NumPy's own capsules are imported with gpuarr_from_dlpack(_legacy).

Run by `make test` as: build/venv/bin/python tests/python/test_numpy.py (GPUARR_LIB names the
library; GPUARR_PY_DEVICE the device the round trips go through, default opencl:0).
"""
import ctypes
import gc
import os
import sys
import unittest

import numpy as np
from samples import sample  # tests/python/samples.py

LIB = ctypes.CDLL(os.environ.get("GPUARR_LIB", "build/lib/libgpuarr.so"))
DEVICE = os.environ.get("GPUARR_PY_DEVICE", "opencl:0").encode()
MAX_DIMS = 8
OK = 0


class Handle(ctypes.Structure):  # gpuarr_device, gpuarr_array: {uint32_t id}
    _fields_ = [("id", ctypes.c_uint32)]


class ArrayInfo(ctypes.Structure):  # gpuarr_array_info, field for field
    _fields_ = [("device", Handle), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * MAX_DIMS), ("count", ctypes.c_int64),
                ("itemsize", ctypes.c_size_t), ("nbytes", ctypes.c_size_t),
                ("host_accessible", ctypes.c_bool), ("wrapped", ctypes.c_bool),
                ("host_fallback", ctypes.c_bool), ("pinned", ctypes.c_bool), ("is_view", ctypes.c_bool),
                ("offset", ctypes.c_size_t), ("refcount", ctypes.c_uint32), ("read_only", ctypes.c_bool)]


class PoolStats(ctypes.Structure):  # gpuarr_pool_stats: 29 uint64_t counters; `allocations` = live blocks
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "allocated_bytes", "peak_allocated_bytes", "total_allocated_bytes", "requested_bytes", "peak_requested_bytes",
        "total_requested_bytes", "reserved_bytes", "peak_reserved_bytes", "total_reserved_bytes", "allocations",
        "peak_allocations", "total_allocations", "segments", "peak_segments", "total_segments", "limit_bytes",
        "release_threshold_bytes", "cache_hits", "cache_misses", "backend_allocs", "backend_frees", "cross_stream_waits",
        "oom_handler_calls", "oom_oversize_releases", "oom_waits", "oom_trims", "oom_retries", "oom_failures",
        "host_fallbacks")]


def declare(name, restype, *argtypes):
    f = getattr(LIB, name)
    f.restype, f.argtypes = restype, list(argtypes)


P = ctypes.POINTER
I64P = P(ctypes.c_int64)
for n, r, a in [
    ("gpuarr_init", ctypes.c_int, (ctypes.c_void_p,)),
    ("gpuarr_shutdown", None, ()),
    ("gpuarr_host", Handle, ()),
    ("gpuarr_device_find", ctypes.c_int, (ctypes.c_char_p, P(Handle))),
    ("gpuarr_dtype_from_name", ctypes.c_int, (ctypes.c_char_p,)),
    ("gpuarr_result_name", ctypes.c_char_p, (ctypes.c_int,)),
    ("gpuarr_last_error", ctypes.c_char_p, ()),
    ("gpuarr_empty", ctypes.c_int, (Handle, ctypes.c_int, ctypes.c_int, I64P, P(Handle))),
    ("gpuarr_from_host_as", ctypes.c_int, (Handle, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, I64P, P(Handle))),
    ("gpuarr_to_host_as", ctypes.c_int, (Handle, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)),
    ("gpuarr_write", ctypes.c_int, (Handle, ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p)),
    ("gpuarr_convert", ctypes.c_int, (Handle, Handle, ctypes.c_int, P(Handle))),
    ("gpuarr_slice", ctypes.c_int, (Handle, ctypes.c_int64, ctypes.c_int64, P(Handle))),
    ("gpuarr_reshape", ctypes.c_int, (Handle, ctypes.c_int, I64P, P(Handle))),
    ("gpuarr_release", ctypes.c_int, (Handle,)),
    ("gpuarr_host_data", ctypes.c_int, (Handle, P(ctypes.c_void_p))),
    ("gpuarr_array_get_info", ctypes.c_int, (Handle, P(ArrayInfo))),
    ("gpuarr_to_dlpack", ctypes.c_int, (Handle, ctypes.c_uint64, P(ctypes.c_void_p))),
    ("gpuarr_to_dlpack_legacy", ctypes.c_int, (Handle, P(ctypes.c_void_p))),
    ("gpuarr_from_dlpack", ctypes.c_int, (ctypes.c_void_p, P(Handle))),
    ("gpuarr_from_dlpack_legacy", ctypes.c_int, (ctypes.c_void_p, P(Handle))),
    ("gpuarr_dlpack_capsule_name", ctypes.c_void_p, (ctypes.c_bool, ctypes.c_bool)),
    ("gpuarr_pool_get_stats", ctypes.c_int, (Handle, P(PoolStats))),
]:
    declare(n, r, *a)

capsule_new = ctypes.pythonapi.PyCapsule_New
capsule_new.restype, capsule_new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
capsule_get = ctypes.pythonapi.PyCapsule_GetPointer
capsule_get.restype, capsule_get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_void_p]
capsule_set_name = ctypes.pythonapi.PyCapsule_SetName
capsule_set_name.restype, capsule_set_name.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_void_p]
capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
capsule_is_valid.restype, capsule_is_valid.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_void_p]
DESTRUCTOR = ctypes.cast(LIB.gpuarr_dlpack_capsule_destructor, ctypes.c_void_p)
NAME = {(v, u): LIB.gpuarr_dlpack_capsule_name(v, u) for v in (False, True) for u in (False, True)}
READ_ONLY = 1  # GPUARR_DLPACK_READ_ONLY

# every dtype NumPy has, by gpuarr name (bf16 has no NumPy dtype)
NUMPY_DTYPES = {"bool": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
                "u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64,
                "f16": np.float16, "f32": np.float32, "f64": np.float64}
SHAPES = [(), (5,), (3, 4), (2, 3, 4), (2, 1, 3, 2), (0, 3)]


def check(r, what):
    if r != OK:
        raise AssertionError(f"{what}: {LIB.gpuarr_result_name(r).decode()}: {LIB.gpuarr_last_error().decode()}")


def dtype_of(name):
    return LIB.gpuarr_dtype_from_name(name.encode())


def shape_arg(shape):
    return (ctypes.c_int64 * max(len(shape), 1))(*shape)


def info(a):
    i = ArrayInfo()
    check(LIB.gpuarr_array_get_info(a, ctypes.byref(i)), "gpuarr_array_get_info")
    return i


def live_blocks():
    """Blocks of the host pool that live arrays hold: what tells whether an exported tensor still
    holds gpuarr memory once the caller's handle is gone."""
    st = PoolStats()
    check(LIB.gpuarr_pool_get_stats(LIB.gpuarr_host(), ctypes.byref(st)), "gpuarr_pool_get_stats")
    return st.allocations


def from_numpy(x, device=None):
    """A gpuarr copy of x (not DLPack: the reference the tests compare against)."""
    a = Handle()
    x = np.asarray(x) if np.asarray(x).flags.c_contiguous else np.array(x, order="C")  # keeps 0-d
    name = next(k for k, v in NUMPY_DTYPES.items() if np.dtype(v) == x.dtype)
    check(LIB.gpuarr_from_host_as(device or LIB.gpuarr_host(), dtype_of(name), x.ctypes.data, x.ndim,
                                  shape_arg(x.shape), ctypes.byref(a)), "gpuarr_from_host_as")
    return a


class Exported:
    """What numpy.from_dlpack takes: a gpuarr array offered through the Python DLPack protocol."""

    def __init__(self, a, flags=0):
        self.a, self.flags = a, flags

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU: these tests export host arrays

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if copy:
            raise BufferError("gpuarr exports without copying")
        p = ctypes.c_void_p()
        if max_version is not None and max_version[0] >= 1:
            check(LIB.gpuarr_to_dlpack(self.a, self.flags, ctypes.byref(p)), "gpuarr_to_dlpack")
            return capsule_new(p, NAME[True, False], DESTRUCTOR)
        check(LIB.gpuarr_to_dlpack_legacy(self.a, ctypes.byref(p)), "gpuarr_to_dlpack_legacy")
        return capsule_new(p, NAME[False, False], DESTRUCTOR)


class LegacyOnly(Exported):
    """A producer that predates DLPack 1.0: NumPy calls it again without max_version."""

    def __dlpack__(self, *, stream=None):
        return super().__dlpack__(stream=stream)


def take(capsule, versioned=True):
    """Imports a NumPy capsule: the pointer out, the capsule marked used, gpuarr owns the tensor."""
    p = capsule_get(capsule, NAME[versioned, False])
    if capsule_set_name(capsule, NAME[versioned, True]) != 0:
        raise AssertionError("PyCapsule_SetName failed")
    a = Handle()
    r = (LIB.gpuarr_from_dlpack if versioned else LIB.gpuarr_from_dlpack_legacy)(p, ctypes.byref(a))
    return r, a


class NumpyInterop(unittest.TestCase):
    def setUp(self):
        check(LIB.gpuarr_init(None), "gpuarr_init")
        self.host = LIB.gpuarr_host()
        self.dev = Handle()
        check(LIB.gpuarr_device_find(DEVICE, ctypes.byref(self.dev)), f"gpuarr_device_find({DEVICE.decode()})")

    def tearDown(self):
        gc.collect()
        LIB.gpuarr_shutdown()

    def expect_fail(self, r, code, words):
        self.assertEqual(LIB.gpuarr_result_name(r).decode(), code, LIB.gpuarr_last_error().decode())
        self.assertIn(words, LIB.gpuarr_last_error().decode())

    # ---- gpuarr -> NumPy -------------------------------------------------------------------
    def export_and_compare(self, producer, x, a, release=True):
        """numpy.from_dlpack(producer) is x, on a's memory; with release, a's handle goes at once
        and the tensor NumPy holds keeps the memory."""
        host = ctypes.c_void_p()
        check(LIB.gpuarr_host_data(a, ctypes.byref(host)), "gpuarr_host_data")
        blocks = live_blocks()
        y = np.from_dlpack(producer)
        if release:
            check(LIB.gpuarr_release(a), "gpuarr_release")
            self.assertEqual(live_blocks(), blocks, "the tensor NumPy holds keeps the memory")
        self.assertEqual(y.dtype, x.dtype)
        self.assertEqual(y.shape, x.shape)
        self.assertTrue(np.array_equal(y, x), f"{x.dtype} {x.shape}")
        if x.size:
            self.assertEqual(y.ctypes.data, host.value, "no copy: NumPy reads gpuarr's memory (a view's too)")
        del y
        gc.collect()

    def test_every_dtype_numpy_has_in_every_rank_both_protocols(self):
        for seed, (name, npt) in enumerate(NUMPY_DTYPES.items()):
            for shape in SHAPES:
                x = sample(npt, shape, seed)
                for producer in (Exported, LegacyOnly):
                    base = live_blocks()
                    a = from_numpy(x)
                    self.export_and_compare(producer(a), x, a)
                    self.assertEqual(live_blocks(), base, "NumPy called the deleter when its array went: memory freed")

    def test_numpy_sees_gpuarr_writes_no_copy(self):
        x = np.arange(12, dtype=np.float32)
        a = from_numpy(x)
        y = np.from_dlpack(Exported(a))
        v = ctypes.c_double(-7.5)
        check(LIB.gpuarr_write(a, 3, 1, dtype_of("f64"), ctypes.byref(v)), "gpuarr_write")
        self.assertEqual(y[3], np.float32(-7.5))
        y[4] = 99  # and the other way: the NumPy array is writable gpuarr memory
        out = np.empty(12, np.float32)
        check(LIB.gpuarr_to_host_as(a, 0, out.ctypes.data, 12), "gpuarr_to_host_as")
        self.assertEqual(out[4], 99)
        del y
        check(LIB.gpuarr_release(a), "gpuarr_release")

    def test_views_export_with_their_offset(self):
        x = sample(np.int32, (6, 5), 3)
        base = live_blocks()
        a = from_numpy(x)
        v, r = Handle(), Handle()
        check(LIB.gpuarr_slice(a, 2, 5, ctypes.byref(v)), "gpuarr_slice")
        self.export_and_compare(Exported(v), x[2:5], v, release=False)
        check(LIB.gpuarr_reshape(v, 2, shape_arg((5, 3)), ctypes.byref(r)), "gpuarr_reshape")
        self.export_and_compare(Exported(r), x[2:5].reshape(5, 3), r, release=False)
        self.export_and_compare(LegacyOnly(r), x[2:5].reshape(5, 3), r, release=False)
        check(LIB.gpuarr_release(a), "gpuarr_release")  # the views hold the memory
        y = np.from_dlpack(Exported(v))
        check(LIB.gpuarr_release(v), "gpuarr_release")
        check(LIB.gpuarr_release(r), "gpuarr_release")
        self.assertEqual(live_blocks(), base + 1)
        self.assertTrue(np.array_equal(y, x[2:5]), "the tensor alone keeps the memory alive")
        del y
        gc.collect()
        self.assertEqual(live_blocks(), base)

    def test_read_only_export(self):
        x = sample(np.float64, (4, 4), 5)
        a = from_numpy(x)
        y = np.from_dlpack(Exported(a, READ_ONLY))
        self.assertFalse(y.flags.writeable)
        with self.assertRaises(ValueError):
            y[0, 0] = 1.0
        self.assertTrue(np.array_equal(y, x))
        z = np.from_dlpack(Exported(a))
        self.assertTrue(z.flags.writeable, "the flag is per export")
        del y, z
        check(LIB.gpuarr_release(a), "gpuarr_release")

    def test_bf16_is_refused_by_numpy_cleanly(self):
        base = live_blocks()
        a = Handle()
        check(LIB.gpuarr_empty(self.host, dtype_of("bf16"), 1, shape_arg((8,)), ctypes.byref(a)), "gpuarr_empty")
        for producer in (Exported(a), LegacyOnly(a)):
            with self.assertRaisesRegex((BufferError, TypeError, RuntimeError), "dtype"):  # 2.4: RuntimeError
                np.from_dlpack(producer)
        check(LIB.gpuarr_release(a), "gpuarr_release")
        gc.collect()  # the capsules NumPy refused: their destructor (C, in gpuarr) calls the deleters
        self.assertEqual(live_blocks(), base, "nothing leaked: the unused capsules' destructor ran the deleters")

    def test_capsule_dropped_unused_and_capsule_after_shutdown(self):
        base = live_blocks()
        a = from_numpy(np.arange(4, dtype=np.int64))
        cap = Exported(a).__dlpack__(max_version=(1, 1))
        check(LIB.gpuarr_release(a), "gpuarr_release")
        self.assertEqual(live_blocks(), base + 1, "the capsule's tensor holds the memory")
        del cap
        self.assertEqual(live_blocks(), base, "a capsule nobody took lets it go")
        a = from_numpy(np.arange(4, dtype=np.int64))
        late = Exported(a).__dlpack__(max_version=(1, 1))
        late_legacy = Exported(a).__dlpack__()
        check(LIB.gpuarr_release(a), "gpuarr_release")  # the capsules hold the memory now
        LIB.gpuarr_shutdown()
        del late, late_legacy  # deleters after gpuarr_shutdown: they only free their tensors
        check(LIB.gpuarr_init(None), "gpuarr_init")

    # ---- NumPy -> gpuarr -------------------------------------------------------------------
    def test_import_every_dtype_through_the_device_and_back(self):
        for seed, (name, npt) in enumerate(NUMPY_DTYPES.items()):
            for shape in SHAPES:
                x = sample(npt, shape, 100 + seed)
                before = sys.getrefcount(x)
                r, a = take(x.__dlpack__(max_version=(1, 0)))
                check(r, f"gpuarr_from_dlpack {name} {shape}")
                self.assertGreater(sys.getrefcount(x), before, "NumPy's tensor holds x")
                i = info(a)
                self.assertEqual(i.dtype, dtype_of(name))
                self.assertEqual(tuple(i.shape[:i.ndim]), shape)
                self.assertFalse(i.read_only)
                if x.size:
                    host = ctypes.c_void_p()
                    check(LIB.gpuarr_host_data(a, ctypes.byref(host)), "gpuarr_host_data")
                    self.assertEqual(host.value, x.ctypes.data, "imported without a copy")
                on_dev, back = Handle(), Handle()
                check(LIB.gpuarr_convert(a, self.dev, 0, ctypes.byref(on_dev)), "to the device")
                check(LIB.gpuarr_convert(on_dev, self.host, 0, ctypes.byref(back)), "and back")
                out = np.empty_like(x)
                check(LIB.gpuarr_to_host_as(back, 0, out.ctypes.data, x.size), "gpuarr_to_host_as")
                self.assertTrue(np.array_equal(out, x), f"{name} {shape}")
                for h in (a, on_dev, back):
                    check(LIB.gpuarr_release(h), "gpuarr_release")
                self.assertEqual(sys.getrefcount(x), before, "NumPy's deleter ran exactly once")

    def test_import_legacy_capsule(self):
        x = sample(np.uint16, (3, 7), 9)
        before = sys.getrefcount(x)
        r, a = take(x.__dlpack__(), versioned=False)
        check(r, "gpuarr_from_dlpack_legacy")
        out = np.empty_like(x)
        check(LIB.gpuarr_to_host_as(a, 0, out.ctypes.data, x.size), "gpuarr_to_host_as")
        self.assertTrue(np.array_equal(out, x))
        check(LIB.gpuarr_release(a), "gpuarr_release")
        self.assertEqual(sys.getrefcount(x), before)

    def test_import_view_writes_reach_numpy(self):
        x = np.zeros((4, 6), np.float32)
        before = sys.getrefcount(x)
        r, a = take(x[1:3].__dlpack__(max_version=(1, 0)))
        check(r, "gpuarr_from_dlpack of a NumPy view")
        v = ctypes.c_float(2.5)
        check(LIB.gpuarr_write(a, 7, 1, dtype_of("f32"), ctypes.byref(v)), "gpuarr_write")
        self.assertEqual(x[2, 1], 2.5, "element 7 of rows 1..2 is x[2, 1]")
        check(LIB.gpuarr_release(a), "gpuarr_release")
        gc.collect()
        self.assertEqual(sys.getrefcount(x), before)

    def test_import_read_only_refuses_writes(self):
        x = np.arange(10, dtype=np.float64)
        x.flags.writeable = False
        before = sys.getrefcount(x)
        r, a = take(x.__dlpack__(max_version=(1, 0)))
        check(r, "gpuarr_from_dlpack of a read-only array")
        self.assertTrue(info(a).read_only)
        v = ctypes.c_double(1.0)
        self.expect_fail(LIB.gpuarr_write(a, 0, 1, dtype_of("f64"), ctypes.byref(v)), "GPUARR_ERROR_INVALID_ARGUMENT",
                         "read-only")
        self.assertEqual(x[0], 0.0)
        y = np.from_dlpack(Exported(a))  # and back out: still read-only
        self.assertFalse(y.flags.writeable)
        self.assertTrue(np.array_equal(y, x))
        p = ctypes.c_void_p()
        self.expect_fail(LIB.gpuarr_to_dlpack_legacy(a, ctypes.byref(p)), "GPUARR_ERROR_INVALID_ARGUMENT", "read-only")
        del y
        check(LIB.gpuarr_release(a), "gpuarr_release")
        gc.collect()
        self.assertEqual(sys.getrefcount(x), before)

    def test_import_refusals_still_call_numpys_deleter(self):
        x = np.arange(24, dtype=np.int16).reshape(4, 6)
        before = sys.getrefcount(x)
        r, a = take(x[:, ::2].__dlpack__(max_version=(1, 0)))
        self.expect_fail(r, "GPUARR_ERROR_UNSUPPORTED", "not compact row-major")
        r, a = take(x.T.__dlpack__(max_version=(1, 0)))
        self.expect_fail(r, "GPUARR_ERROR_UNSUPPORTED", "not compact row-major")
        c = np.ones(3, np.complex64)  # no gpuarr dtype
        before_c = sys.getrefcount(c)
        r, a = take(c.__dlpack__(max_version=(1, 0)))
        self.expect_fail(r, "GPUARR_ERROR_UNSUPPORTED", "has no gpuarr dtype")
        gc.collect()
        self.assertEqual(sys.getrefcount(x), before, "NumPy's deleter ran on each refusal")
        self.assertEqual(sys.getrefcount(c), before_c)


if __name__ == "__main__":
    print(f"NumPy {np.__version__}, Python {sys.version.split()[0]}, device {DEVICE.decode()}")
    unittest.main(verbosity=2)
