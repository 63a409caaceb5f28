"""Test data the Python suites share: a NumPy array of a dtype and shape, reproducible by seed,
spanning the dtype's whole range for integers (both ends included)."""
import numpy as np


def sample(np_dtype, shape, seed):
    rng = np.random.default_rng(seed)
    if np_dtype == np.bool_:
        return np.asarray(rng.integers(0, 2, size=shape).astype(np.bool_))
    if np.issubdtype(np_dtype, np.integer):
        lim = np.iinfo(np_dtype)
        return np.asarray(rng.integers(lim.min, lim.max, size=shape, dtype=np_dtype, endpoint=True))
    return np.asarray((rng.standard_normal(size=shape) * 100).astype(np_dtype))
