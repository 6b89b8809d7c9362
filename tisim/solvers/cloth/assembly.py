"""Host-side sparse assembly of local element Hessians (numpy, vectorised)."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from tisim import backend
from tisim.backend import download, upload


def local_to_coo(H: np.ndarray, stencils: np.ndarray, dof_map: np.ndarray | None = None):
    """COO triplets of a batch of local Hessians.

    H: (k, 3s, 3s) local Hessians over ``s`` vertices. stencils: (k, s) vertex indices
    (-1 for an unused slot). dof_map: (n,) vertex -> system vertex index, -1 for a
    vertex that is not a system unknown (its rows and columns are dropped); None keeps
    the vertex numbering. Returns (rows, cols, vals) over scalar dofs 3 v + axis.
    """
    k, d, _ = H.shape
    s = d // 3
    st = np.asarray(stencils[:k, :s], dtype=np.int64)
    if dof_map is not None:
        st = np.where(st >= 0, dof_map[np.maximum(st, 0)], -1)
    dofs = (3 * st[:, :, None] + np.arange(3)).reshape(k, d)
    dofs = np.where(np.repeat(st, 3, axis=1) >= 0, dofs, -1)
    r = np.broadcast_to(dofs[:, :, None], (k, d, d))
    c = np.broadcast_to(dofs[:, None, :], (k, d, d))
    keep = (r >= 0) & (c >= 0)
    return r[keep], c[keep], H[keep]


def structural_sum(A: sp.csr_matrix, rows, cols, vals) -> sp.csr_matrix:
    """A plus the triplets (rows, cols, vals), keeping every entry of both patterns, zero
    values included (scipy's sparse sum drops entries that come out zero).

    The Newton system's pattern is then set by the elements and the active contact pairs,
    not by which of their values happen to be zero this iteration (a compressed face's
    clamped out-of-plane modes, a flat sheet's bending blocks), so the linear solver's
    symbolic analysis is reused while the contact pairs stay within the elastic pattern.
    Implemented as a complex sum: every entry carries imaginary part 1, so no sum is zero,
    and the real parts add exactly as real numbers do."""
    n = A.shape[0]
    C = sp.coo_matrix((np.asarray(vals, dtype=np.float64) + 1j, (rows, cols)), shape=A.shape).tocsr()
    Ac = sp.csr_matrix((A.data + 1j, A.indices, A.indptr), shape=(n, n))
    S = Ac + C
    return sp.csr_matrix((np.ascontiguousarray(S.data.real), S.indices, S.indptr), shape=A.shape)


class PatternAssembler:
    """Sum COO triplets into a CSR matrix of size (N, N).

    Building a CSR matrix from scratch every Newton iteration spends most of its time
    sorting; ``fixed`` triplets whose (row, col) pattern never changes (elastic
    elements) are mapped to CSR slots once, and later calls only ``bincount`` their
    values. Other triplets (contact) are added as a second, small matrix.
    """

    def __init__(self, size: int, rows: np.ndarray, cols: np.ndarray):
        self.size = size
        key = rows.astype(np.int64) * size + cols
        uniq, self._slot = np.unique(key, return_inverse=True)
        self._rows = (uniq // size).astype(np.int32)
        self._cols = (uniq % size).astype(np.int32)
        m = sp.csr_matrix((np.arange(1, len(uniq) + 1, dtype=np.float64), (self._rows, self._cols)), shape=(size, size))
        m.sort_indices()
        # position of each unique (row, col) in the CSR data array
        order = np.empty(len(uniq), dtype=np.int64)
        order[(m.data - 1).astype(np.int64)] = np.arange(len(uniq))
        self._indptr, self._indices = m.indptr, m.indices
        self._slot = order[self._slot]
        self._nnz = len(uniq)

    def matrix(self, vals: np.ndarray, extra=None, diag: np.ndarray | None = None) -> sp.csr_matrix:
        """CSR from the fixed-pattern values (in the order of the construction's
        triplets), plus ``extra`` = (rows, cols, vals) triplets and a diagonal."""
        data = np.bincount(self._slot, weights=vals, minlength=self._nnz)
        A = sp.csr_matrix((data, self._indices, self._indptr), shape=(self.size, self.size))
        if extra is not None and len(extra[0]):
            A = A + sp.csr_matrix((extra[2], (extra[0], extra[1])), shape=(self.size, self.size))
        if diag is not None:
            A = A + sp.diags(diag, format="csr")
        return A


class DeviceAssembler:
    """A fixed-pattern CSR matrix whose values are summed on the device.

    parts: list of stencils arrays (k, s) (vertex indices, no -1) of element groups with
    (3 s x 3 s) local Hessians; size: number of scalar dofs (3 n). couplings: per group,
    None (every vertex block) or (s, s) bools, the blocks of its local Hessians that
    exist: the others are outside the pattern (their slots -1), so a group whose kernel
    leaves them zero adds no fill. Each group gets the
    positions of its local Hessians' entries in the CSR value array ``data``
    (``ti.ndarray(real, nnz)``), per vertex in ``incidence`` and per element in ``slots``;
    kernels add local Hessians into ``data`` there (``shell_kernels.gather_*`` /
    ``scatter_blocks``), and :meth:`matrix`
    reads the nnz values back once. This replaces copying every local Hessian to the host
    (9 x 9 per face, 12 x 12 per hinge) and summing them there with ``bincount``.
    """

    def __init__(self, size: int, parts: list[np.ndarray], couplings: list | None = None):
        import taichi as ti

        from tisim import backend

        # per group, the (3 s, 3 s) entries of its local Hessians that exist: all, or the
        # vertex blocks that ``couplings[group]`` (s, s) bools keep
        kept = []
        for st, cp in zip(parts, couplings or [None] * len(parts)):
            d = 3 * st.shape[1]
            mask = (
                np.ones((d, d), dtype=bool)
                if cp is None
                else np.kron(np.asarray(cp, dtype=bool), np.ones((3, 3), dtype=bool))
            )
            kept.append(np.broadcast_to(mask, (len(st), d, d)).ravel())
        triplets = [local_to_coo(np.ones((len(st), 3 * st.shape[1], 3 * st.shape[1])), st) for st in parts]
        rows = np.concatenate([t[0][m] for t, m in zip(triplets, kept)])
        cols = np.concatenate([t[1][m] for t, m in zip(triplets, kept)])
        self.pattern = PatternAssembler(size, rows, cols)
        self.size = size
        slot_arrays = []
        start = 0
        for st, m in zip(parts, kept):
            k, d = len(st), 3 * st.shape[1]
            sl = np.full(k * d * d, -1, dtype=np.int32)  # -1: an entry the pattern lacks
            sl[m] = self.pattern._slot[start : start + int(m.sum())]
            slot_arrays.append(sl.reshape(k, d, d))
            start += int(m.sum())
        self._slot_arrays = slot_arrays
        self._slots = None
        self.data = ti.ndarray(backend.real(), shape=max(self.pattern._nnz, 1))
        # per group: each vertex's (element, local index) pairs by increasing element, for
        # the kernels that sum the rows of a vertex in parallel (``gather_*``)
        self.incidence = [_incidence(st, size // 3, sl) for st, sl in zip(parts, slot_arrays)]
        # the pattern's row starts on the device: the first gather zeroes each vertex's rows
        # (``gather_face_hessians``) instead of a zeroing pass over ``data`` before it
        self.indptr = ti.ndarray(ti.i32, shape=size + 1)
        upload(self.indptr, np.asarray(self.pattern._indptr, dtype=np.int32))

    @property
    def slots(self) -> list:
        """Per group, the slots ndarray (k, 3 s, 3 s), for ``scatter_blocks`` (stored local
        Hessians: the exact bending Hessian); copied to the device at the first use."""
        import taichi as ti

        if self._slots is None:
            self._slots = []
            for sl in self._slot_arrays:
                k, d = sl.shape[0], sl.shape[1]
                a = ti.ndarray(ti.i32, shape=(max(k, 1), d, d))
                upload(a, sl if k else np.full((1, d, d), -1, np.int32))
                self._slots.append(a)
        return self._slots

    def matrix(self) -> sp.csr_matrix:
        """The summed matrix (CSR, sorted indices, float64)."""
        p = self.pattern
        data = download(self.data)[: p._nnz].astype(np.float64, copy=False)
        return sp.csr_matrix((data, p._indices, p._indptr), shape=(self.size, self.size))


def _incidence(stencils: np.ndarray, n: int, slots: np.ndarray):
    """(ptr (n + 1,), pairs (K, 2), rows (K, 3, 3 s)) as i32 ndarrays: vertex v's
    (element, local index) pairs are pairs[ptr[v]:ptr[v + 1]], by increasing element,
    and rows[j] the CSR slots of pair j's three rows of its element's local Hessian
    (slots[element, 3 local + k, :]), stored in pair order so that a vertex reads its
    slots contiguously (read through the elements, they were scattered over memory)."""
    import taichi as ti

    st = np.asarray(stencils, dtype=np.int64).reshape(len(stencils), -1)
    k, s = st.shape
    elem = np.repeat(np.arange(k), s)
    local = np.tile(np.arange(s), k)
    vert = st.ravel()
    keep = vert >= 0
    elem, local, vert = elem[keep], local[keep], vert[keep]
    order = np.lexsort((local, elem, vert))
    pairs = np.stack([elem[order], local[order]], axis=1).astype(np.int32)
    ptr = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(vert, minlength=n)[:n], out=ptr[1:])
    d = 3 * s
    rows = slots.reshape(k, s, 3, d)[pairs[:, 0], pairs[:, 1]] if len(pairs) else np.full((1, 3, d), -1)
    p_nd = ti.ndarray(ti.i32, shape=n + 1)
    upload(p_nd, ptr)
    q_nd = ti.ndarray(ti.i32, shape=(max(len(pairs), 1), 2))
    upload(q_nd, pairs if len(pairs) else np.zeros((1, 2), np.int32))
    r_nd = ti.ndarray(ti.i32, shape=(max(len(pairs), 1), 3, d))
    upload(r_nd, np.ascontiguousarray(rows, dtype=np.int32))
    return p_nd, q_nd, r_nd


class SystemAssembler:
    """The Newton system: a base CSR matrix (the elastic Hessian over the unknowns) plus a
    diagonal, per-vertex 3 x 3 blocks (the analytic planes) and the contact pairs' local
    Hessians, summed into the base's pattern.

    The contact Hessians are added on the device into the base's value array at slots
    found by a search in each row (``assembly_kernels.scatter_pairs``); the few entries
    outside the pattern (self-contact between vertices that share no element) come back
    as triplets and are inserted, so the result is the union of all the patterns, zero
    entries included, as :func:`structural_sum` gives. It replaces building a COO matrix
    of every contact entry and sorting its sum with the base on the host (about 10 ms
    an iteration on the 64 x 64 drape). Per base pattern, the positions of its diagonal
    and of its vertex blocks are found once and kept.

    Use: :meth:`set_unknowns` (vertex -> system vertex, -1: not an unknown), then per
    Newton iteration :meth:`begin` with the base, the ``add_*`` calls, :meth:`matrix`
    (CSR) or :meth:`block_upper` (the 3 x 3 block upper triangle that PARDISO reads).
    """

    def __init__(self, n: int):
        import taichi as ti

        self.n = n
        self.unknowns = ti.ndarray(ti.i32, shape=max(n, 1))
        self._key = None
        self._pattern = None  # (indptr, indices) of the base
        self._bmap = None  # see _set_pattern
        self._grow = None  # where the base lacked diagonal-block entries (inserted as zeros)
        self._outside = [np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32)]

    def set_unknowns(self, sysvert: np.ndarray) -> None:
        key = sysvert.tobytes()
        if key != self._key:  # unchanged through most Newton iterations
            upload(self.unknowns, np.asarray(sysvert, dtype=np.int32))
            self._key = key

    # ------------------------------------------------------------------ base pattern
    def _set_pattern(self, A: sp.csr_matrix) -> None:
        """Cache what the base's pattern gives: entry keys (row * size + column), the slots
        of every vertex's diagonal 3 x 3 block (inserting the entries of a block the base
        lacks, a vertex in no element, as zeros) and the pattern's device copies."""
        import taichi as ti

        from tisim.solvers.cloth.assembly_kernels import SEARCH_STEPS

        size = A.shape[0]
        indptr = A.indptr.astype(np.int64)
        indices = A.indices.astype(np.int64)
        keys = np.repeat(np.arange(size, dtype=np.int64), np.diff(indptr)) * size + indices
        base = 3 * np.arange(size // 3, dtype=np.int64)[:, None, None]
        want = ((base + np.arange(3)[None, :, None]) * size + base + np.arange(3)[None, None, :]).ravel()
        pos = np.searchsorted(keys, want)
        have = keys[np.minimum(pos, len(keys) - 1)] == want if len(keys) else np.zeros(len(want), dtype=bool)
        self._grow = None
        if not have.all():
            # a vertex in no element: its block's entries are inserted as zeros
            self._grow = pos[~have]
            miss = want[~have]
            indices = np.insert(indices, self._grow, miss % size)
            indptr = indptr + np.concatenate([[0], np.cumsum(np.bincount(miss // size, minlength=size))])
            keys = np.insert(keys, self._grow, miss)
        self._pattern = (A.indptr.copy(), A.indices.copy())
        self.size = size
        self.indptr = indptr.astype(np.int32)
        self.indices = indices.astype(np.int32)
        self._keys = keys
        longest = int(np.diff(indptr).max(initial=0))
        if longest > 1 << SEARCH_STEPS:
            raise ValueError(
                f"a Newton system row has {longest} entries, more than the {1 << SEARCH_STEPS} "
                "the device assembly searches"
            )
        self._block_slots = np.searchsorted(keys, want).reshape(-1, 3, 3)
        self.diag_slots = self._block_slots[:, [0, 1, 2], [0, 1, 2]].ravel()
        self._bmap = None  # the base's block map, made by the first block_upper() (PARDISO only)
        self._d_indptr = ti.ndarray(ti.i32, shape=max(size + 1, 1))
        self._d_indices = ti.ndarray(ti.i32, shape=max(len(indices), 1))
        upload(self._d_indptr, self.indptr)
        if len(indices):
            upload(self._d_indices, self.indices)

    def _same_pattern(self, A) -> bool:
        if self._pattern is None:
            return False
        ip, ix = self._pattern
        return (
            A.indptr.shape == ip.shape
            and A.indices.shape == ix.shape
            and np.array_equal(A.indptr, ip)
            and np.array_equal(A.indices, ix)
        )

    def begin(self, A: sp.csr_matrix) -> None:
        """Start a system from the base A (square CSR with sorted indices; not modified)."""
        if not self._same_pattern(A):
            self._set_pattern(A)
        data = np.array(A.data, dtype=np.float64)
        if self._grow is not None:
            data = np.insert(data, self._grow, 0.0)
        self.data = data
        self._extra = []

    # ------------------------------------------------------------------ terms
    def add_diagonal(self, d: np.ndarray) -> None:
        self.data[self.diag_slots] += d

    def diagonal(self) -> np.ndarray:
        return self.data[self.diag_slots]

    def add_vertex_blocks(self, vertices: np.ndarray, blocks: np.ndarray) -> None:
        """Add 3 x 3 blocks (k, 3, 3) on the diagonal of system vertices ``vertices`` (k,)
        (repeats allowed)."""
        if not len(vertices):
            return
        np.add.at(self.data, self._block_slots[vertices].ravel(), np.asarray(blocks, dtype=np.float64).ravel())

    def _outside_buffer(self, i: int, rows: int) -> np.ndarray:
        """The i-th scratch array of per-pair outside counts, of at least ``rows`` rows."""
        out = self._outside[i]
        if len(out) < rows:
            out = self._outside[i] = np.zeros(max(rows, 2 * len(out)), dtype=np.int32)
        return out

    def add_pairs(self, H, stencils, rows: int) -> None:
        """Add the local Hessians H[:rows] (12 x 12, ``stencils`` rows of 4 vertices) over
        the unknowns (``set_unknowns``)."""
        from tisim.solvers.cloth.assembly_kernels import scatter_pairs

        if rows <= 0:
            return
        out = self._outside_buffer(0, rows)
        scatter_pairs(H, stencils, rows, self.unknowns, self._d_indptr, self._d_indices, self.data, out)
        self._emit(H, stencils, out[:rows])

    def add_pair_batches(self, batches) -> None:
        """:meth:`add_pairs` of each (H, stencils, rows) in ``batches``, in order, two
        batches a launch (``scatter_two``: the same sums)."""
        from tisim.solvers.cloth.assembly_kernels import scatter_two

        batches = [b for b in batches if b[2] > 0]
        for i in range(0, len(batches) - 1, 2):
            (H, st, rows), (H2, st2, rows2) = batches[i], batches[i + 1]
            out, out2 = self._outside_buffer(0, rows), self._outside_buffer(1, rows2)
            ip, ix = self._d_indptr, self._d_indices
            scatter_two(H, st, rows, H2, st2, rows2, self.unknowns, ip, ix, self.data, out, out2)
            self._emit(H, st, out[:rows])
            self._emit(H2, st2, out2[:rows2])
        if len(batches) % 2:
            self.add_pairs(*batches[-1])

    def _emit(self, H, stencils, counts: np.ndarray) -> None:
        """The entries outside the pattern of the pairs with counts > 0 (``scatter_*``'s
        per-pair counts), kept as triplets for :meth:`matrix` / :meth:`block_upper`."""
        from tisim.solvers.cloth.assembly_kernels import emit_outside

        pairs = np.flatnonzero(counts).astype(np.int32)
        if not len(pairs):
            return
        per = counts[pairs]
        offsets = np.zeros(len(pairs), dtype=np.int32)
        np.cumsum(per[:-1], out=offsets[1:])
        total = int(per.sum())
        r = np.empty(total, dtype=np.int32)
        c = np.empty(total, dtype=np.int32)
        v = np.empty(total, dtype=backend.np_real())
        emit_outside(H, stencils, pairs, len(pairs), self.unknowns, self._d_indptr, self._d_indices, offsets, r, c, v)
        self._extra.append((r, c, v))

    def compile_kernels(self, H, stencils) -> None:
        """Compile :meth:`add_pairs`' kernels now for local Hessians like ``H`` / ``stencils``
        (launches over zero pairs into scratch arrays of the pattern's types)."""
        import taichi as ti

        from tisim.solvers.cloth.assembly_kernels import emit_outside, scatter_pairs, scatter_two

        ip, ix = ti.ndarray(ti.i32, shape=1), ti.ndarray(ti.i32, shape=1)
        i32 = np.zeros(1, dtype=np.int32)
        scatter_pairs(H, stencils, 0, self.unknowns, ip, ix, np.zeros(1), i32)
        scatter_two(H, stencils, 0, H, stencils, 0, self.unknowns, ip, ix, np.zeros(1), i32, i32.copy())
        emit_outside(
            H,
            stencils,
            i32,
            0,
            self.unknowns,
            ip,
            ix,
            i32,
            i32.copy(),
            i32.copy(),
            np.zeros(1, dtype=backend.np_real()),
        )

    def block_upper(self) -> sp.bsr_matrix | None:
        """The sum's 3 x 3 block upper triangle (BSR, row-major blocks; what
        ``pardiso.BlockUpper`` makes of :meth:`matrix`, the same values), or None when the
        base is not made of whole blocks. Built at the blocks' level: the base's map is kept
        per base pattern and the blocks outside it are inserted, 9x fewer keys than the
        CSR's entries (with self-contact the pattern changes at most Newton iterations)."""
        if self._bmap is None:
            # the base's 3 x 3 block upper triangle: where its values are (None when the base
            # is not made of whole blocks) and its blocks' keys (block row * blocks + column)
            from tisim.linalg.pardiso import block_upper_map

            pattern = sp.csr_matrix(
                (np.zeros(len(self.indices)), self.indices, self.indptr), shape=(self.size, self.size)
            )
            self._bmap = block_upper_map(pattern, 3)
            if self._bmap[0] is not None:
                nb = self.size // 3
                self._bkeys = np.repeat(np.arange(nb, dtype=np.int64), np.diff(self._bmap[1])) * nb + self._bmap[2]
        if self._bmap[0] is None:
            return None
        gather, indptr, indices = self._bmap
        size, nb = self.size, self.size // 3
        blocks = self.data[gather].reshape(-1, 3, 3)
        if self._extra:
            r = np.concatenate([t[0] for t in self._extra]).astype(np.int64)
            c = np.concatenate([t[1] for t in self._extra]).astype(np.int64)
            v = np.concatenate([t[2] for t in self._extra]).astype(np.float64)
            up = c // 3 >= r // 3  # (the base holds every diagonal block: these are off it)
            r, c, v = r[up], c[up], v[up]
            keys, inv = np.unique((r // 3) * nb + c // 3, return_inverse=True)
            vals = np.bincount(inv.ravel() * 9 + (r % 3) * 3 + c % 3, weights=v, minlength=9 * len(keys))
            pos = np.searchsorted(self._bkeys, keys)
            blocks = np.insert(blocks, pos, vals.reshape(-1, 3, 3), axis=0)
            indices = np.insert(indices, pos, (keys % nb).astype(indices.dtype))
            indptr = indptr + np.concatenate([[0], np.cumsum(np.bincount(keys // nb, minlength=nb))]).astype(
                indptr.dtype
            )
        return sp.bsr_matrix((blocks, indices, indptr), shape=(size, size))

    def matrix(self) -> sp.csr_matrix:
        """The sum (CSR, sorted indices, float64): the base's pattern plus the entries
        outside it, summed."""
        size = self.size
        if not self._extra:
            return sp.csr_matrix((self.data, self.indices, self.indptr), shape=(size, size))
        r = np.concatenate([t[0] for t in self._extra]).astype(np.int64)
        c = np.concatenate([t[1] for t in self._extra]).astype(np.int64)
        v = np.concatenate([t[2] for t in self._extra]).astype(np.float64)
        keys, inv = np.unique(r * size + c, return_inverse=True)
        vals = np.bincount(inv.ravel(), weights=v, minlength=len(keys))
        pos = np.searchsorted(self._keys, keys)
        indices = np.insert(self.indices, pos, (keys % size).astype(np.int32))
        data = np.insert(self.data, pos, vals)
        per_row = np.bincount(keys // size, minlength=size)
        indptr = self.indptr + np.concatenate([[0], np.cumsum(per_row)]).astype(np.int32)
        return sp.csr_matrix((data, indices, indptr), shape=(size, size))
