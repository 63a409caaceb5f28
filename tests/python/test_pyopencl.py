"""gpuarr inside a pyopencl program: pyopencl's own context (first PoCL device) adopted by gpuarr
(gpuarr.opencl_adopt with the int_ptr of pyopencl's context, device and queue), a pyopencl buffer
wrapped as a gpuarr array, converted to the host and to gpuarr's own opencl:0 and compared; and a
gpuarr array of the adopted device handed back to pyopencl (Array.opencl_export, then
cl.Buffer.from_int_ptr(..., retain=False)), which reads it with enqueue_copy.

Needs gpuarr_opencl_adopt_raw, gpuarr_opencl_export_mem_raw and gpuarr_device_remove in the
library. Run by `make python-tests`: build/venv/bin/python tests/python/test_pyopencl.py
(PYTHONPATH=python, GPUARR_LIB the library).
"""
import gc
import os
import sys
import unittest

import numpy as np
import pyopencl as cl

import gpuarr

DEVICE = os.environ.get("GPUARR_PY_DEVICE", "opencl:0")


def pocl_device():
    for p in cl.get_platforms():
        if "Portable Computing Language" in p.name:
            return p.get_devices()[0]
    if os.environ.get("GPUARR_TEST_REQUIRE") == "1":  # make python-tests: PoCL is installed, its absence a failure
        raise AssertionError("no PoCL platform, but GPUARR_TEST_REQUIRE=1")
    raise unittest.SkipTest("no PoCL platform")


class PyOpenCL(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dev = pocl_device()
        cls.ctx = cl.Context([cls.dev])  # pyopencl's own context, not gpuarr's
        cls.queue = cl.CommandQueue(cls.ctx)
        cls.adopted = gpuarr.opencl_adopt(cls.ctx.int_ptr, cls.dev.int_ptr, cls.queue.int_ptr)

    @classmethod
    def tearDownClass(cls):
        gc.collect()
        cls.adopted.remove()

    def test_adopted_device_is_a_device(self):
        self.assertIn(self.adopted, gpuarr.devices())
        self.assertTrue(self.adopted.spec.startswith("opencl:"), self.adopted.spec)
        self.assertNotEqual(self.adopted.spec, DEVICE, "a device of its own, beside gpuarr's")

    def test_pyopencl_buffer_to_gpuarr_host_and_device(self):
        for dtype, name in ((np.float32, "f32"), (np.int16, "i16"), (np.uint64, "u64")):
            x = (np.arange(24) * 37 - 300).astype(dtype).reshape(2, 3, 4)
            buf = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=x)
            a = gpuarr.opencl_wrap(self.adopted, buf.int_ptr, name, x.shape)
            del buf  # gpuarr holds its own reference to the cl_mem
            gc.collect()
            self.assertEqual((a.device, a.dtype, a.shape), (self.adopted.spec, name, x.shape))
            host = np.from_dlpack(a.to(device="host"))
            self.assertTrue(np.array_equal(host, x), name)
            ours = a.to(device=DEVICE, dtype="f64")  # gpuarr's own context, cast on the way
            self.assertTrue(np.array_equal(np.from_dlpack(ours.to(device="host")), x.astype(np.float64)), name)
            again = a.to(device=DEVICE).to(device=self.adopted)  # there and back into pyopencl's context
            self.assertTrue(np.array_equal(np.from_dlpack(again.to(device="host")), x), name)

    def test_gpuarr_array_read_by_pyopencl(self):
        x = np.linspace(-3, 3, 1000).astype(np.float32)
        a = gpuarr.from_dlpack(x).to(device=self.adopted)
        mem = a.opencl_export()
        buf = cl.Buffer.from_int_ptr(mem, retain=False)  # pyopencl owns it now
        self.assertEqual(buf.size, x.nbytes)
        a.release()  # the exported cl_mem keeps the memory valid
        gc.collect()
        out = np.empty_like(x)
        cl.enqueue_copy(self.queue, out, buf)
        self.queue.finish()
        self.assertTrue(np.array_equal(out, x))
        del buf

    def test_wrap_at_an_offset(self):
        x = np.arange(16, dtype=np.int32)
        buf = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=x)
        a = gpuarr.opencl_wrap(self.adopted, buf.int_ptr, "i32", (4,), offset=8 * 4)
        self.assertEqual(np.from_dlpack(a.to(device="host")).tolist(), [8, 9, 10, 11])


if __name__ == "__main__":
    print("gpuarr module from %s, pyopencl %s, NumPy %s" % (os.path.dirname(gpuarr.__file__), cl.VERSION_TEXT,
                                                             np.__version__))
    unittest.main(verbosity=2)
