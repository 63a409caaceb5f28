"""DLPack hand-over cost against a copy, through raw ctypes and through the gpuarr module
(make bench-dlpack).

For sizes from 4 KiB to 64 MiB on the host: numpy.from_dlpack of a gpuarr array (export, capsule,
import into NumPy, and the deleter when NumPy's array goes) and gpuarr_from_dlpack of a NumPy
array (with gpuarr_release), each against the baseline of the same run: numpy.copy of the same
bytes (a memcpy); then the same two through the module (python/gpuarr: numpy.from_dlpack of a
gpuarr.Array, gpuarr.from_dlpack of the NumPy array and its release). Median of 7 rounds; each
round times a loop long enough to take ~50 ms.
"""
import ctypes, os, sys, time
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "python"))
import test_numpy as t  # the bindings of the NumPy tests (GPUARR_LIB names the library)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import gpuarr  # the module, on the same library

def per_op(fn):
    n, el = 1, 0.0
    while el < 0.05:
        n *= 2
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        el = time.perf_counter() - t0
    return el / n

def median(fn):
    return sorted(per_op(fn) for _ in range(7))[3]

t.check(t.LIB.gpuarr_init(None), "gpuarr_init")
print(f"NumPy {np.__version__}, CPU: {open('/proc/cpuinfo').read().split('model name')[1].split(':')[1].splitlines()[0].strip()}")
print("| bytes | numpy.copy (baseline) | numpy.from_dlpack(gpuarr) | gpuarr_from_dlpack(numpy) + release "
      "| module: numpy.from_dlpack(Array) | module: gpuarr.from_dlpack(numpy) + release |")
print("|---|---|---|---|---|---|")
for size in (4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20):
    x = np.ones(size // 4, np.float32)
    a = t.from_numpy(x)
    def export():
        y = np.from_dlpack(t.Exported(a))
        del y
    def imp():
        r, h = t.take(x.__dlpack__(max_version=(1, 0)))
        t.LIB.gpuarr_release(h)
    m = gpuarr.from_dlpack(x)
    def module_export():
        y = np.from_dlpack(m)
        del y
    def module_import():
        gpuarr.from_dlpack(x).release()
    c, e, i = median(lambda: np.copy(x)), median(export), median(imp)
    me, mi = median(module_export), median(module_import)
    print(f"| {size} | {c*1e6:.2f} us | {e*1e6:.2f} us ({e/c:.3g}x) | {i*1e6:.2f} us ({i/c:.3g}x) "
          f"| {me*1e6:.2f} us ({me/c:.3g}x) | {mi*1e6:.2f} us ({mi/c:.3g}x) |")
    m.release()
    t.LIB.gpuarr_release(a)
t.LIB.gpuarr_shutdown()
