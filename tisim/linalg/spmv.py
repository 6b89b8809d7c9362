"""Taichi kernels for sparse matrices in CSR form.

Matrices are handed to the kernels as three 1-D arrays (indptr, indices, data).
On the CPU these are the numpy arrays of a ``scipy.sparse.csr_matrix``, accessed
in place (no copy, so a matrix kept on the host for other uses costs no extra
memory); on a GPU they are ``ti.ndarray`` copies (:func:`device_array`).
Vectors of 3-D points are (n, 3) arrays (scalar ndarrays: Taichi launches them
faster than vector-typed ones), so the x, y and z columns go through one pass
over the matrix. Every argument is an ndarray,
so each kernel compiles once per process whatever arrays it is given.

Every product is a gather (one thread per row), never a scatter with atomics,
so results are bitwise reproducible. Updates of global memory are written
``a[i] = a[i] + v``: Taichi turns ``a[i] += v`` into an atomic operation, which
is many times slower and unnecessary where each entry has one writer.

This module has no ``from __future__ import annotations``: Taichi reads the
kernels' type annotations when they are decorated.
"""

import logging

import numpy as np
import taichi as ti

from tisim.backend import download, upload

log = logging.getLogger(__name__)

# Mesa's lavapipe (Vulkan on the CPU) stops a shader invocation after this many loop
# iterations, silently; one thread per row must stay below it there.
LAVAPIPE_LOOP_LIMIT = 65535

__all__ = [
    "DeviceCSR",
    "device_array",
    "gather3",
    "inverse_columns",
    "inverse_entries",
    "inverse_paths",
    "read_back",
    "sparse_inverse_apply",
]


def device_array(a: np.ndarray):
    """``a`` itself on the CPU (kernels access numpy memory in place), else a ti.ndarray copy."""
    from tisim import backend

    if backend.current().arch == "cpu":
        return a
    dt = {
        np.dtype(np.int32): ti.i32,
        np.dtype(np.int64): ti.i64,
        np.dtype(np.float32): ti.f32,
        np.dtype(np.float64): ti.f64,
    }[a.dtype]
    d = ti.ndarray(dt, shape=a.shape)
    upload(d, a)
    return d


def read_back(dev, out: np.ndarray) -> None:
    """Copy a :func:`device_array` result into ``out`` (nothing to do when it is ``out``)."""
    if dev is out:
        return
    out[...] = download(dev)


class DeviceCSR:
    """A CSR matrix ready for the kernels of this module.

    matrix: scipy CSR (rows x cols); indices are converted to int32 and values
    to the backend's float type (f64 on the CPU by default). ``host`` is the
    scipy matrix whose buffers the kernels use on the CPU.
    """

    def __init__(self, matrix):
        import scipy.sparse as sp

        from tisim import backend

        A = sp.csr_matrix(matrix)
        A.sort_indices()
        if A.nnz >= 2**31:
            raise ValueError("matrix too large for int32 indices")
        dtype = backend.np_real()
        A = sp.csr_matrix(
            (
                np.ascontiguousarray(A.data, dtype=dtype),
                np.ascontiguousarray(A.indices, dtype=np.int32),
                np.ascontiguousarray(A.indptr, dtype=np.int32),
            ),
            shape=A.shape,
        )
        self.host = A
        longest = int(np.diff(A.indptr).max(initial=0))
        if backend.current().arch == "vulkan" and longest >= LAVAPIPE_LOOP_LIMIT:
            log.warning(
                "a CSR row has %d entries: Mesa's lavapipe Vulkan driver stops a thread after "
                "%d loop iterations, so products with this matrix are wrong there "
                "(a hardware Vulkan driver is not affected)",
                longest,
                LAVAPIPE_LOOP_LIMIT,
            )
        self.shape = A.shape
        self.nnz = A.nnz
        self.indptr = device_array(A.indptr)
        self.indices = device_array(A.indices)
        self.data = device_array(A.data)

    @property
    def nbytes(self) -> int:
        return self.host.data.nbytes + self.host.indices.nbytes + self.host.indptr.nbytes


@ti.func
def _row3(indptr: ti.template(), indices: ti.template(), data: ti.template(), x: ti.template(), i):
    """Row i of A times the points x: sum_j A[i, j] x[j]."""
    acc = ti.Vector([0.0, 0.0, 0.0])
    for p in range(indptr[i], indptr[i + 1]):
        j = indices[p]
        acc += data[p] * ti.Vector([x[j, 0], x[j, 1], x[j, 2]])
    return acc


@ti.func
def _matvec3(indptr: ti.template(), indices: ti.template(), data: ti.template(), x: ti.template(), y: ti.template()):
    """y[i] = sum_j A[i, j] x[j] for i < rows (x, y: (n, 3) arrays of points)."""
    for i in range(indptr.shape[0] - 1):
        acc = _row3(indptr, indices, data, x, i)
        y[i, 0] = acc[0]
        y[i, 1] = acc[1]
        y[i, 2] = acc[2]


@ti.func
def _matvec3_scatter_add(
    indptr: ti.template(),
    indices: ti.template(),
    data: ti.template(),
    x: ti.template(),
    rowmap: ti.template(),
    out: ti.template(),
):
    """out[rowmap[i]] += sum_j A[i, j] x[j] (rowmap is injective, so no atomics)."""
    for i in range(indptr.shape[0] - 1):
        acc = _row3(indptr, indices, data, x, i)
        r = rowmap[i]
        out[r, 0] = out[r, 0] + acc[0]
        out[r, 1] = out[r, 1] + acc[1]
        out[r, 2] = out[r, 2] + acc[2]


@ti.kernel
def sparse_inverse_apply(
    Sp: ti.types.ndarray(ndim=1),
    Sj: ti.types.ndarray(ndim=1),
    Sx: ti.types.ndarray(ndim=1),
    STp: ti.types.ndarray(ndim=1),
    STj: ti.types.ndarray(ndim=1),
    STx: ti.types.ndarray(ndim=1),
    b: ti.types.ndarray(ndim=2),
    work: ti.types.ndarray(ndim=2),
    rowmap: ti.types.ndarray(ndim=1),
    out: ti.types.ndarray(ndim=2),
):
    """out[rowmap] += S^T (S b) in one launch (the sparse-inverse global step, notes §2.3):
    the two products as two top-level loops, which Taichi runs in order, each in
    parallel; work holds S b (the two kernels it replaced, one per product, gave the same
    sums)."""
    _matvec3(Sp, Sj, Sx, b, work)
    _matvec3_scatter_add(STp, STj, STx, work, rowmap, out)


@ti.kernel
def gather3(src: ti.types.ndarray(ndim=2), index: ti.types.ndarray(ndim=1), dst: ti.types.ndarray(ndim=2)):
    """dst[i] = src[index[i]] for i < len(index)."""
    for i in range(index.shape[0]):
        j = index[i]
        dst[i, 0] = src[j, 0]
        dst[i, 1] = src[j, 1]
        dst[i, 2] = src[j, 2]


@ti.kernel
def inverse_columns(
    columns: ti.types.ndarray(dtype=ti.i32, ndim=1),
    begin: ti.i32,
    end: ti.i32,
    Lp: ti.types.ndarray(dtype=ti.i32, ndim=1),
    Li: ti.types.ndarray(dtype=ti.i32, ndim=1),
    Lx: ti.types.ndarray(dtype=ti.f64, ndim=1),
    parent: ti.types.ndarray(dtype=ti.i32, ndim=1),
    depth: ti.types.ndarray(dtype=ti.i32, ndim=1),
    Sp: ti.types.ndarray(dtype=ti.i64, ndim=1),
    Si: ti.types.ndarray(dtype=ti.i32, ndim=1),
    Sx: ti.types.ndarray(dtype=ti.f64, ndim=1),
):
    """Columns ``columns[begin:end]`` of S = L^-1 in CSC (Sp, Si, Sx), one thread each.

    Column j occupies Sp[j] .. Sp[j] + depth[j]: the etree path j -> root in
    ascending order, so node v of the path sits at offset depth[j] - depth[v].
    From L s_j = e_j: s_j = (e_j - sum_{i > j} L[i, j] s_i) / L[j, j], where every
    such i is an ancestor of j whose column s_i is the tail of s_j's path; the
    columns of ancestors must be done already (the caller goes level by level,
    roots first). L: lower-triangular CSC (Lp, Li, Lx), sorted, diagonal first.
    """
    for c in range(begin, end):
        j = columns[c]
        start = Sp[j]
        d = depth[j]
        Si[start] = j
        Sx[start] = 1.0
        p0 = parent[j]
        if p0 >= 0:
            s0 = Sp[p0]
            for t in range(d - 1):
                Si[start + 1 + t] = Si[s0 + t]
                Sx[start + 1 + t] = 0.0
        for p in range(Lp[j] + 1, Lp[j + 1]):
            i = Li[p]
            lij = Lx[p]
            off = start + d - depth[i]
            si = Sp[i]
            for u in range(depth[i]):
                Sx[off + u] = Sx[off + u] - lij * Sx[si + u]
        inv = 1.0 / Lx[Lp[j]]
        for t in range(d):
            Sx[start + t] = Sx[start + t] * inv


@ti.kernel
def inverse_paths(
    parent: ti.types.ndarray(dtype=ti.i32, ndim=1),
    depth: ti.types.ndarray(dtype=ti.i32, ndim=1),
    Sp: ti.types.ndarray(dtype=ti.i64, ndim=1),
    Si: ti.types.ndarray(dtype=ti.i32, ndim=1),
):
    """Row indices of every column of S = L^-1 (CSC): column j holds the etree path
    j -> root in ascending order (one thread a column, depth[j] iterations)."""
    for j in range(parent.shape[0]):
        start = Sp[j]
        v = j
        for t in range(depth[j]):
            Si[start + t] = v
            v = parent[v]


@ti.kernel
def inverse_entries(
    columns: ti.types.ndarray(dtype=ti.i32, ndim=1),
    begin: ti.i32,
    count: ti.i32,
    d: ti.i32,
    Lp: ti.types.ndarray(dtype=ti.i32, ndim=1),
    Li: ti.types.ndarray(dtype=ti.i32, ndim=1),
    Lx: ti.types.ndarray(dtype=ti.f64, ndim=1),
    depth: ti.types.ndarray(dtype=ti.i32, ndim=1),
    Sp: ti.types.ndarray(dtype=ti.i64, ndim=1),
    Si: ti.types.ndarray(dtype=ti.i32, ndim=1),
    Sx: ti.types.ndarray(dtype=ti.f64, ndim=1),
):
    """The ``count`` columns ``columns[begin:begin + count]`` of S = L^-1, all of depth d,
    one thread per entry (column, path node v): from L s_j = e_j,

        S[v, j] = (delta_vj - sum_{i > j} L[i, j] S[v, i]) / L[j, j],

    where every such i is an ancestor of j (on its path) and S[v, i] != 0 only when v is
    an ancestor-or-self of i, i.e. depth[v] <= depth[i]; it sits at offset
    depth[i] - depth[v] of column i. Needs the row indices (:func:`inverse_paths`) and
    the columns of all ancestors (the caller goes level by level, roots first).

    A thread runs nnz(L[:, j]) iterations, not the column's whole triangular solve: Mesa's
    lavapipe (Vulkan on the CPU) silently stops any shader invocation after 65,535 loop
    iterations, which truncated the one-thread-per-column version of this kernel on
    columns deeper than about 360 (the squeeze-ball demo's W was wrong under Vulkan).
    """
    for e in range(count * d):
        j = columns[begin + e // d]
        t = e % d
        off = Sp[j] + t
        v = Si[off]
        dv = depth[v]
        acc = ti.f64(0.0)  # S is built in f64 whatever the default precision
        if t == 0:
            acc = ti.f64(1.0)
        for p in range(Lp[j] + 1, Lp[j + 1]):
            i = Li[p]
            di = depth[i]
            if di >= dv:
                acc -= Lx[p] * Sx[Sp[i] + di - dv]
        Sx[off] = acc / Lx[Lp[j]]
