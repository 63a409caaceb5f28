"""The Python module (python/gpuarr) against NumPy (>= 2.1): DLPack both ways through the module,
its constants, errors, __dlpack__'s rules (stream, max_version, dl_device, copy), shutdown.

Run by `make python-tests` as: build/venv/bin/python tests/python/test_module.py, with
PYTHONPATH=python, GPUARR_LIB naming the library and GPUARR_PY_DEVICE the device the round trips go
through (default opencl:0).
"""
import ctypes
import gc
import os
import sys
import unittest
import weakref

import numpy as np

import gpuarr
from samples import sample  # tests/python/samples.py

DEVICE = os.environ.get("GPUARR_PY_DEVICE", "opencl:0")
NUMPY_DTYPES = {"bool": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
                "u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64,
                "f16": np.float16, "f32": np.float32, "f64": np.float64}  # NumPy has no bf16
SHAPES = [(), (5,), (3, 4), (2, 3, 4), (2, 1, 3, 2), (0, 3)]


class LegacyProducer:
    """A producer from before DLPack 1.0: __dlpack__ takes no max_version (gpuarr.from_dlpack
    asks again without it) and gives a legacy capsule."""

    def __init__(self, x):
        self.x = x

    def __dlpack__(self, stream=None):
        return self.x.__dlpack__()


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))
capsule_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))
capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


class CountingProducer:
    """A hand-made DLManagedTensorVersioned over a NumPy buffer, whose deleter counts its calls."""
    NAME = b"dltensor_versioned"  # a Python bytes object lives as long as this producer

    def __init__(self, x, code, bits):
        self.x, self.calls = x, 0
        self.shape = (ctypes.c_int64 * max(x.ndim, 1))(*x.shape)
        self.deleter = DELETER(self._delete)
        self.t = DLManagedTensorVersioned(DLPackVersion(1, 1), None, self.deleter, 0,
                                          DLTensor(x.ctypes.data, 1, 0, x.ndim, code, bits, 1, self.shape, None, 0))

    def _delete(self, _):
        self.calls += 1

    def capsule(self):  # no destructor: the test owns the struct and keeps it alive
        return capsule_new(ctypes.addressof(self.t), self.NAME, None)


class Module(unittest.TestCase):
    def tearDown(self):
        gc.collect()

    def test_constants_come_from_the_header(self):
        for name, value, size in gpuarr.DTYPES:
            self.assertEqual(gpuarr.dtype_value(name), value)
            self.assertEqual(getattr(gpuarr, name.upper()), value)
            self.assertEqual(gpuarr.empty((1,), name).nbytes, size)
        self.assertEqual(gpuarr.U8, 3)
        self.assertEqual(gpuarr.F32, 12)
        for name, value, _ in gpuarr.RESULTS:
            self.assertEqual(gpuarr._lib.gpuarr_result_name(value).decode(), "GPUARR_" + name)
        self.assertEqual(gpuarr.VERSION, gpuarr.version())
        self.assertEqual(gpuarr.dtype_value(np.float16), gpuarr.F16)
        self.assertEqual(gpuarr.dtype_value(np.dtype("uint64")), gpuarr.U64)

    def test_errors_carry_the_result_and_gpuarrs_message(self):
        with self.assertRaises(gpuarr.Error) as e:
            gpuarr.device("opencl:99")
        self.assertEqual(e.exception.result, gpuarr.ERROR_NO_DEVICE)
        self.assertIn("gpuarr_device_find", str(e.exception))
        self.assertIn("opencl:99", str(e.exception))
        with self.assertRaises(ValueError):
            gpuarr.empty((2,), "complex64")

    def test_devices_and_pool_stats(self):
        specs = [d.spec for d in gpuarr.devices()]
        self.assertEqual(specs[0], "host")
        self.assertIn(DEVICE, specs)
        self.assertEqual(gpuarr.device(DEVICE).info()["spec"], DEVICE)
        before = gpuarr.pool_stats(DEVICE)
        self.assertEqual(tuple(before), gpuarr.POOL_STATS_FIELDS)
        a = gpuarr.zeros((1000,), "f64", DEVICE)
        self.assertEqual(gpuarr.pool_stats(DEVICE)["allocations"], before["allocations"] + 1)
        self.assertGreaterEqual(gpuarr.pool_stats(DEVICE)["allocated_bytes"], before["allocated_bytes"] + 8000)
        a.release()
        a.release()  # once only
        self.assertEqual(gpuarr.pool_stats(DEVICE)["allocations"], before["allocations"])
        with self.assertRaises(gpuarr.Error) as e:
            a.shape
        self.assertEqual(e.exception.result, gpuarr.ERROR_INVALID_HANDLE)

    # ---- NumPy -> gpuarr -> device -> gpuarr -> NumPy -------------------------------------------
    def round_trip(self, x, make_producer, versioned):
        before = sys.getrefcount(x)
        a = gpuarr.from_dlpack(make_producer())
        self.assertEqual((a.dtype, a.shape), (next(k for k, v in NUMPY_DTYPES.items() if np.dtype(v) == x.dtype),
                                              x.shape))
        if x.size:
            self.assertEqual(a.host_data, x.ctypes.data, "imported without a copy")
        back = a.to(device=DEVICE).to(device="host")
        a.release()
        self.assertEqual(sys.getrefcount(x), before, "NumPy's deleter ran once the array went")
        cap = back.__dlpack__(max_version=(1, 0) if versioned else None)
        self.assertEqual(capsule_name(cap), b"dltensor_versioned" if versioned else b"dltensor")
        y = np.from_dlpack(back) if versioned else np.from_dlpack(LegacyProducer(back))
        self.assertTrue(np.array_equal(y, x), "%s %s" % (x.dtype, x.shape))
        self.assertEqual(y.dtype, x.dtype)
        if x.size:
            self.assertEqual(y.ctypes.data, back.host_data, "exported without a copy")
        del cap

    def test_every_numpy_dtype_every_rank_both_protocols_through_the_device(self):
        for seed, (name, npt) in enumerate(NUMPY_DTYPES.items()):
            for shape in SHAPES:
                x = sample(npt, shape, seed)
                self.round_trip(x, lambda: x, versioned=True)
                self.round_trip(x, lambda: LegacyProducer(x), versioned=False)
                self.round_trip(x, lambda: x.__dlpack__(max_version=(1, 0)), versioned=True)  # a raw capsule

    def test_exported_tensor_outlives_the_array_and_frees_once(self):
        base = gpuarr.pool_stats()["allocations"]
        a = gpuarr.from_dlpack(np.arange(10, dtype=np.int32)).copy()
        y = np.from_dlpack(a)
        a.release()
        self.assertEqual(gpuarr.pool_stats()["allocations"], base + 1, "NumPy's tensor holds the memory")
        self.assertEqual(y.tolist(), list(range(10)))
        gone = weakref.ref(y)
        del y
        gc.collect()
        self.assertIsNone(gone())
        self.assertEqual(gpuarr.pool_stats()["allocations"], base, "the deleter ran: memory back in the pool")
        cap = gpuarr.zeros((4,), "u8").__dlpack__(max_version=(1, 1))
        self.assertEqual(gpuarr.pool_stats()["allocations"], base + 1)
        del cap  # taken by nobody: the library's capsule destructor calls the deleter
        self.assertEqual(gpuarr.pool_stats()["allocations"], base)

    def test_a_counting_deleter_runs_exactly_once(self):
        x = np.arange(6, dtype=np.float32)
        p = CountingProducer(x, 2, 32)  # kDLFloat 32
        a = gpuarr.from_dlpack(p.capsule())
        self.assertEqual(a.host_data, x.ctypes.data)
        b = a.to(device=DEVICE)
        a.release()
        self.assertEqual(p.calls, 1)
        self.assertTrue(np.array_equal(np.from_dlpack(b.to(device="host")), x))
        bad = CountingProducer(x, 5, 64)  # kDLComplex: refused, and the deleter still runs once
        with self.assertRaises(BufferError) as e:
            gpuarr.from_dlpack(bad.capsule())
        self.assertEqual(e.exception.result, gpuarr.ERROR_UNSUPPORTED)
        self.assertEqual(bad.calls, 1)
        used = p.capsule()
        gpuarr.from_dlpack(used).release()
        with self.assertRaisesRegex(BufferError, "already used"):
            gpuarr.from_dlpack(used)
        self.assertEqual(p.calls, 2)

    def test_views_compact_ones_shared_others_refused(self):
        x = np.zeros((4, 6), np.float32)
        before = sys.getrefcount(x)
        a = gpuarr.from_dlpack(x[1:])
        self.assertEqual(a.host_data, x[1:].ctypes.data)
        a.copy_from(gpuarr.from_dlpack(np.full((3, 6), 2.5, np.float32)))
        self.assertTrue((x[1:] == 2.5).all() and (x[0] == 0).all(), "gpuarr wrote into NumPy's memory")
        a.release()
        for view in (x[:, ::2], x.T):
            with self.assertRaisesRegex(BufferError, "not compact row-major") as e:
                gpuarr.from_dlpack(view)
            self.assertEqual(e.exception.result, gpuarr.ERROR_UNSUPPORTED)
        del view, e  # the views and the exception's frames hold x
        gc.collect()
        self.assertEqual(sys.getrefcount(x), before, "NumPy's deleter ran for each, refused or not")

    def test_read_only_numpy_array_gives_a_read_only_array(self):
        x = np.arange(5, dtype=np.float64)
        x.flags.writeable = False
        a = gpuarr.from_dlpack(x)
        self.assertTrue(a.read_only)
        with self.assertRaisesRegex(gpuarr.Error, "read-only") as e:
            a.copy_from(gpuarr.zeros((5,), "f64"))
        self.assertEqual(e.exception.result, gpuarr.ERROR_INVALID_ARGUMENT)
        self.assertEqual(x.tolist(), [0, 1, 2, 3, 4])
        y = np.from_dlpack(a)
        self.assertFalse(y.flags.writeable, "exported read-only again")
        with self.assertRaisesRegex(BufferError, "read-only"):
            a.__dlpack__()  # legacy: it cannot say read-only

    # ---- __dlpack__'s arguments, as the array API gives them ------------------------------------
    def test_max_version_picks_the_capsule(self):
        a = gpuarr.zeros((3,), "i16")
        for max_version, name in ((None, b"dltensor"), ((0, 8), b"dltensor"), ((1, 0), b"dltensor_versioned"),
                                  ((1, 3), b"dltensor_versioned"), ((2, 0), b"dltensor_versioned")):
            self.assertEqual(capsule_name(a.__dlpack__(max_version=max_version)), name, max_version)

    def test_stream_rules(self):
        host, dev = gpuarr.zeros((3,), "f32"), gpuarr.zeros((3,), "f32", DEVICE)
        self.assertEqual(host.__dlpack_device__(), (gpuarr.KDLCPU, 0))
        self.assertEqual(dev.__dlpack_device__(), (gpuarr.KDLOPENCL, gpuarr.device(DEVICE).info()["index"]))
        for s in (-1, 0, 1, 2, 12345):
            with self.assertRaisesRegex(ValueError, "kDLCPU: None only"):
                host.__dlpack__(stream=s)
        dev.__dlpack__(stream=-1)
        with self.assertRaises(ValueError):
            dev.__dlpack__(stream=1)

    def test_copy_and_dl_device(self):
        x = sample(np.int32, (3, 4), 7)
        a = gpuarr.from_dlpack(x)
        with self.assertRaisesRegex(BufferError, "copy=False"):
            a.__dlpack__(dl_device=(gpuarr.KDLOPENCL, 0), copy=False)
        self.assertIsNotNone(a.__dlpack__(dl_device=(gpuarr.KDLCPU, 0), copy=False), "its own device: no copy")
        with self.assertRaises(BufferError):
            a.__dlpack__(dl_device=(7, 0))  # kDLVulkan
        y = np.from_dlpack(a, copy=True)
        self.assertNotEqual(y.ctypes.data, x.ctypes.data)
        self.assertTrue(np.array_equal(y, x))
        t = DLManagedTensorVersioned.from_address(capsule_pointer(a.__dlpack__(max_version=(1, 0), copy=True),
                                                                  b"dltensor_versioned"))
        self.assertEqual(t.flags & 2, 2, "a copy is flagged DLPACK_FLAG_BITMASK_IS_COPIED")
        on_dev = gpuarr.from_dlpack(a.__dlpack__(max_version=(1, 0), dl_device=(gpuarr.KDLOPENCL, 0)))
        self.assertEqual(on_dev.device, "opencl:0")
        z = np.from_dlpack(on_dev, device="cpu")  # dl_device=(kDLCPU, 0): a copy to the host
        self.assertTrue(np.array_equal(z, x))
        with self.assertRaises(BufferError):
            np.from_dlpack(on_dev, device="cpu", copy=False)
        b = gpuarr.from_dlpack(x, device=DEVICE)
        self.assertEqual(b.device, DEVICE)
        with self.assertRaisesRegex(BufferError, "copy=False"):
            gpuarr.from_dlpack(x, device=DEVICE, copy=False)
        c = gpuarr.from_dlpack(x, copy=True)
        self.assertNotEqual(c.host_data, x.ctypes.data)
        self.assertTrue(np.array_equal(np.from_dlpack(c), x))

    def test_to_converts_dtype_and_device(self):
        x = np.array([0.5, -1.75, 300.0], np.float32)
        a = gpuarr.from_dlpack(x).to(device=DEVICE, dtype="f16")
        self.assertEqual((a.device, a.dtype), (DEVICE, "f16"))
        self.assertTrue(np.array_equal(np.from_dlpack(a.to(device="host")), x.astype(np.float16)))
        same = gpuarr.from_dlpack(x)
        self.assertEqual(same.to().host_data, x.ctypes.data, "same device and dtype: the same memory")

    # ---- last: shutdown ends every handle; consumers' tensors free themselves afterwards ---------
    def test_zz_shutdown_ends_handles_without_crashing(self):
        a = gpuarr.from_dlpack(np.arange(4, dtype=np.int64))
        d = gpuarr.device(DEVICE)
        y = np.from_dlpack(gpuarr.zeros((8,), "u8"))
        cap = gpuarr.zeros((2,), "f32").__dlpack__(max_version=(1, 0))
        gpuarr.shutdown()
        for use in (lambda: a.shape, lambda: d.info(), lambda: a.to(device="host")):
            with self.assertRaises(gpuarr.Error) as e:
                use()
            self.assertEqual(e.exception.result, gpuarr.ERROR_INVALID_HANDLE)
        del y, cap  # deleters after gpuarr_shutdown: they only free their tensors
        a.release()  # nothing to release any more: a no-op
        b = gpuarr.zeros((3,), "f32")  # starts gpuarr again
        self.assertEqual(b.shape, (3,))
        del a
        gc.collect()
        self.assertEqual(b.shape, (3,), "the old handle was not released into the new session")


if __name__ == "__main__":
    print("gpuarr module from %s, NumPy %s, Python %s, device %s" % (os.path.dirname(gpuarr.__file__), np.__version__,
                                                                 sys.version.split()[0], DEVICE))
    unittest.main(verbosity=2)
