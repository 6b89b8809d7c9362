"""backend.upload / download / zero: the CPU backend's copies through a host view of an
ndarray must equal Taichi's own from_numpy / to_numpy, and a kernel must see them."""

import numpy as np
import pytest
import taichi as ti

from tisim import backend


@ti.kernel
def _add_index(a: ti.types.ndarray(dtype=ti.math.vec3, ndim=1)):
    for i in a:
        a[i] += ti.Vector([1.0 * i, 2.0 * i, 3.0 * i])


def _arrays(rng):
    return [
        (ti.Vector.ndarray(3, ti.f64, shape=7), rng.standard_normal((7, 3))),
        (ti.Matrix.ndarray(6, 6, ti.f64, shape=4), rng.standard_normal((4, 6, 6))),
        (ti.Matrix.ndarray(3, 2, ti.f32, shape=5), rng.standard_normal((5, 3, 2)).astype(np.float32)),
        (ti.ndarray(ti.i32, shape=(5, 4)), rng.integers(-100, 100, (5, 4)).astype(np.int32)),
        (ti.Vector.ndarray(4, ti.i32, shape=3), rng.integers(-9, 9, (3, 4)).astype(np.int32)),
    ]


def test_upload_and_download_equal_taichis_copies():
    rng = np.random.default_rng(0)
    for nd, a in _arrays(rng):
        backend.upload(nd, a)
        assert np.array_equal(nd.to_numpy(), a)  # Taichi's copy reads what the view wrote
        b = a + np.ones_like(a)
        nd.from_numpy(b)
        got = backend.download(nd)
        assert got.dtype == nd.to_numpy().dtype and np.array_equal(got, b)
        assert np.array_equal(backend.download(nd, 2), b[:2])
        got[...] = 0  # a copy, not the ndarray's memory
        assert np.array_equal(nd.to_numpy(), b)
        assert backend.zero(nd, 1) is True
        c = b.copy()
        c[:1] = 0
        assert np.array_equal(nd.to_numpy(), c)
        assert backend.zero(nd) is True
        assert not nd.to_numpy().any()


def test_a_kernel_sees_uploads_and_writes_downloads():
    nd = ti.Vector.ndarray(3, ti.f64, shape=6)
    x = np.arange(18, dtype=np.float64).reshape(6, 3)
    backend.upload(nd, x)
    _add_index(nd)
    i = np.arange(6)[:, None]
    assert np.array_equal(backend.download(nd), x + i * np.array([1, 2, 3]))


def test_upload_refuses_a_wrong_shape_and_fields_fall_back():
    nd = ti.Vector.ndarray(3, ti.f64, shape=4)
    with pytest.raises(ValueError, match="shape"):
        backend.upload(nd, np.zeros((5, 3)))
    f = ti.field(ti.f64, shape=3)
    backend.upload(f, np.array([1.0, 2.0, 3.0]))  # Taichi's from_numpy
    assert np.array_equal(backend.download(f), [1.0, 2.0, 3.0])
    assert backend.zero(f) is False  # no view: the caller zeroes it by a kernel
