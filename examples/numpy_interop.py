"""gpuarr <-> NumPy through DLPack with the gpuarr module: python numpy_interop.py [device]

Run with python/ on PYTHONPATH (or gpuarr installed) and GPUARR_LIB naming libgpuarr.so if the
loader does not find libgpuarr.so.0.
"""
import sys

import numpy as np

import gpuarr

x = np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3)
a = gpuarr.from_dlpack(x)  # x's memory, no copy
on_dev = a.to(device=sys.argv[1] if len(sys.argv) > 1 else "host", dtype="f64")
y = np.from_dlpack(on_dev.to(device="host"))  # gpuarr's memory, no copy
print("NumPy -> gpuarr -> %s -> NumPy:" % on_dev.device, y.tolist())
assert np.array_equal(x, y) and y.dtype == np.float64
