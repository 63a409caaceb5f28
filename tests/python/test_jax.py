"""The Python module (python/gpuarr) against JAX on the CPU, both ways through DLPack: every dtype
JAX has (64-bit ones with jax_enable_x64), 0-d to 4-d, no copy (same address), round trips through
GPUARR_PY_DEVICE (default opencl:0) compared exactly, and what JAX accepts and refuses, printed
as a summary at the end.

JAX calls __dlpack__ without max_version and takes only legacy "dltensor" capsules; asked for
DLPack 1.0 it still hands a legacy capsule. Run by `make python-tests` as:
build/venv/bin/python tests/python/test_jax.py (PYTHONPATH=python, GPUARR_LIB the library).
"""
import gc
import os
import sys
import unittest
import weakref

import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_platforms", "cpu")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import gpuarr  # noqa: E402

DEVICE = os.environ.get("GPUARR_PY_DEVICE", "opencl:0")
JAX_DTYPES = {"bool": jnp.bool_, "i8": jnp.int8, "i16": jnp.int16, "i32": jnp.int32, "i64": jnp.int64,
              "u8": jnp.uint8, "u16": jnp.uint16, "u32": jnp.uint32, "u64": jnp.uint64,
              "f16": jnp.float16, "bf16": jnp.bfloat16, "f32": jnp.float32, "f64": jnp.float64}
SHAPES = [(), (5,), (3, 4), (2, 3, 4), (2, 1, 3, 2)]
SUMMARY = []  # (direction, what, "accepted" / "refused: ...")


def record(direction, what, outcome):
    SUMMARY.append((direction, what, outcome))


def sample(name, shape, seed):
    rng = np.random.default_rng(seed)
    if name == "bool":
        x = rng.integers(0, 2, size=shape).astype(np.bool_)
    elif name[0] in "iu":
        lim = np.iinfo(np.dtype(JAX_DTYPES[name]))
        x = rng.integers(lim.min, lim.max, size=shape, dtype=np.dtype(JAX_DTYPES[name]), endpoint=True)
    else:
        x = (rng.standard_normal(size=shape) * 100).astype(np.float32)
    return jnp.asarray(x, dtype=JAX_DTYPES[name])


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and np.asarray(a).tobytes() == np.asarray(b).tobytes()


class Jax(unittest.TestCase):
    def tearDown(self):
        gc.collect()

    def test_jax_to_gpuarr_every_dtype_every_rank_through_the_device(self):
        for seed, name in enumerate(JAX_DTYPES):
            for shape in SHAPES:
                j = sample(name, shape, seed)
                a = gpuarr.from_dlpack(j)  # JAX gives a legacy capsule though asked for 1.0
                self.assertEqual((a.dtype, a.shape), (name, shape))
                self.assertEqual(a.host_data, j.unsafe_buffer_pointer(), "no copy: gpuarr reads JAX's buffer")
                back = a.to(device=DEVICE).to(device="host")
                self.assertTrue(same_bits(jax.dlpack.from_dlpack(back), j), "%s %s" % (name, shape))
        record("JAX -> gpuarr", "all %d dtypes, 0-d to 4-d" % len(JAX_DTYPES), "accepted, no copy")

    def test_gpuarr_to_jax_every_dtype_every_rank_no_copy(self):
        for seed, name in enumerate(JAX_DTYPES):
            for shape in SHAPES:
                j = sample(name, shape, 100 + seed)
                a = gpuarr.from_dlpack(j).to(device=DEVICE).to(device="host")  # gpuarr's own memory
                k = jax.dlpack.from_dlpack(a)  # JAX asks without max_version: a legacy capsule
                self.assertEqual(k.unsafe_buffer_pointer(), a.host_data, "no copy: JAX reads gpuarr's memory")
                self.assertTrue(same_bits(k, j), "%s %s" % (name, shape))
        record("gpuarr -> JAX", "all %d dtypes, 0-d to 4-d" % len(JAX_DTYPES), "accepted, no copy")

    def test_deleters_run_once_both_ways(self):
        base = gpuarr.pool_stats()["allocations"]
        a = gpuarr.zeros((64,), "f32")
        k = jax.dlpack.from_dlpack(a)
        a.release()
        self.assertEqual(gpuarr.pool_stats()["allocations"], base + 1, "JAX's array holds gpuarr's memory")
        del k
        gc.collect()
        self.assertEqual(gpuarr.pool_stats()["allocations"], base, "JAX called the deleter")
        j = jnp.arange(16, dtype=jnp.float32)
        before = sys.getrefcount(j)
        b = gpuarr.from_dlpack(j)
        b.release()
        gc.collect()
        self.assertEqual(sys.getrefcount(j), before)
        gone = weakref.ref(b)
        del b
        self.assertIsNone(gone())

    def test_what_jax_refuses(self):
        x = np.arange(4, dtype=np.float32)
        x.flags.writeable = False
        ro = gpuarr.from_dlpack(x)  # read-only: a legacy capsule cannot say so
        with self.assertRaisesRegex(BufferError, "read-only") as e:
            jax.dlpack.from_dlpack(ro)
        record("gpuarr -> JAX", "read-only array", "refused by gpuarr (BufferError: %s)" % e.exception.name)
        on_dev = gpuarr.zeros((4,), "f32", DEVICE)
        with self.assertRaisesRegex(TypeError, "unsupported device type"):
            jax.dlpack.from_dlpack(on_dev)
        record("gpuarr -> JAX", "kDLOpenCL array", "refused by JAX (TypeError: unsupported device type)")
        try:
            k = jax.dlpack.from_dlpack(on_dev, device=jax.devices("cpu")[0])
            self.assertTrue(same_bits(k, jnp.zeros(4, jnp.float32)))
            record("gpuarr -> JAX", "kDLOpenCL array, device=cpu", "accepted (gpuarr copies to the host)")
        except (TypeError, BufferError, ValueError) as err:
            record("gpuarr -> JAX", "kDLOpenCL array, device=cpu", "refused by JAX (%s)" % type(err).__name__)
        asked = []

        class Recording:  # what JAX passes to __dlpack__
            def __init__(self, a):
                self.a = a

            def __dlpack_device__(self):
                return self.a.__dlpack_device__()

            def __dlpack__(self, **kwargs):
                asked.append(kwargs)
                return self.a.__dlpack__(**kwargs)

        jax.dlpack.from_dlpack(Recording(gpuarr.zeros((2,), "f32")))
        self.assertIsNone(asked[0].get("max_version"), asked)
        record("gpuarr -> JAX", "JAX passes __dlpack__ %s" % sorted(asked[0]), "no max_version: a legacy capsule")
        j = jnp.arange(12, dtype=jnp.int32).reshape(3, 4)
        cap = j.__dlpack__(max_version=(1, 0))
        self.assertEqual(gpuarr.__dict__["_api"].PyCapsule_GetName(cap), b"dltensor", "JAX's capsule is legacy")
        record("JAX -> gpuarr", "__dlpack__(max_version=(1, 0))", "gives a legacy capsule: taken as legacy")
        t = gpuarr.from_dlpack(j[1:])  # JAX slices are new buffers: compact
        self.assertEqual(np.from_dlpack(t).tolist(), [[4, 5, 6, 7], [8, 9, 10, 11]])
        record("JAX -> gpuarr", "j[1:]", "accepted (JAX makes a new compact buffer)")


if __name__ == "__main__":
    print("gpuarr module from %s, JAX %s (jaxlib %s), NumPy %s, device %s" % (
        os.path.dirname(gpuarr.__file__), jax.__version__, jax.lib.__version__ if hasattr(jax.lib, "__version__")
        else "?", np.__version__, DEVICE))
    result = unittest.main(verbosity=2, exit=False).result
    print("JAX %s with gpuarr, what each side accepted and refused:" % jax.__version__)
    for direction, what, outcome in SUMMARY:
        print("  %-14s %-32s %s" % (direction, what, outcome))
    sys.exit(0 if result.wasSuccessful() else 1)
