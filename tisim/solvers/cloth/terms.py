"""The cloth solver's elastic terms: :class:`ShellTerm` (membrane + bending on a level's own
mesh) and :class:`StrainTerm` (the strain-limit barrier), each evaluated in kernels and
assembled into a scipy matrix over the cloth's scalar dofs."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from tisim.backend import download, upload
from tisim.solvers.cloth.assembly import DeviceAssembler


class ShellTerm:
    """The shell's elastic energy on a level's own mesh: membrane + bending.

    The interface every elastic term offers the Newton solver (the progressive driver
    substitutes the finest level's energy through prolongation):
    ``evaluate(x, hessian) -> (energy J, gradient (n, 3), Hessian or None)``, the
    Hessian a PSD scipy sparse matrix over the cloth block's scalar dofs 3 v + axis.
    Membrane Hessians are projected per element; bending uses its Gauss-Newton part
    c grad(theta) grad(theta)^T (PSD by construction; notes §7).

    lumped_bending (``solver.bending_hessian = "lumped"``): a hinge's term c g g^T
    (g = grad theta over (e0, e1, o0, o1)) couples its two opposite vertices, which share
    no face: the only blocks of the Newton matrix outside the membrane's pattern, and on a
    regular sheet most of the factor's fill (64 x 64 vertices: 2.5M factor non-zeros with
    them, 0.95M without; PARDISO 12.3 against 3.4 ms on the bare pattern). Lumped, the
    hinge adds c (g g^T + u u^T) with u = ((g_o1 - g_o0) / 2, (g_o1 - g_o0) / 2, g_o0,
    -g_o1): its (o0, o1) block is zero, and g g^T + u u^T is the sum of two rank-one
    terms each on one of the hinge's faces, (g + u)(g + u)^T / 2 on (e0, e1, o0) and
    (g - u)(g - u)^T / 2 on (e0, e1, o1). It is PSD and above the Gauss-Newton term, so
    every Newton step is still a descent direction; u sums to zero over the hinge like
    g, so rigid translations stay in the matrix's null space (Newton steps keep the
    momentum as before); the gradient and the energy are exact, so the fixed point is
    the same. The decrement is measured in that matrix's metric, which still bounds the
    mass-weighted RMS of the step the solver takes (every term is PSD over M / h^2).
    """

    def __init__(
        self, vertex_count, faces, hinges, rest, mu, lam, thickness, bending_k, bending=True, lumped_bending=False
    ):
        import taichi as ti

        from tisim import backend
        from tisim.energies.shell import ShellEnergy, shell_rest

        real = backend.real()
        self.n = vertex_count
        hinges = hinges if bending else np.zeros((0, 4), dtype=np.int32)
        self.rest = shell_rest(rest, faces, hinges)
        self.energy_obj = ShellEnergy(
            vertex_count, faces, hinges, self.rest, mu, lam, thickness, bending_k if bending else np.zeros(len(hinges))
        )
        self.x = ti.Vector.ndarray(3, real, shape=max(vertex_count, 1))
        self.g = ti.Vector.ndarray(3, real, shape=max(vertex_count, 1))
        self.faces = faces
        self.hinges = hinges
        self._psd_b = None
        self.gauss_newton_bending = True
        e = self.energy_obj
        parts = [_np(e.face_stencils)] + ([_np(e.hinge_stencils)] if len(hinges) else [])
        self.lumped_bending = bool(lumped_bending)
        couplings = [None, HINGE_LUMPED_COUPLINGS if self.lumped_bending else None][: len(parts)]
        self.assembler = DeviceAssembler(3 * vertex_count, parts, couplings)
        # F-space (6 x 6) membrane Hessians, projected there (see shell_kernels.shell_hessian_f)
        self._hf = ti.ndarray(real, shape=(max(len(faces), 1), 6, 6))
        # per hinge: grad theta (12) and the Gauss-Newton factor c (bending_gauss_newton_factors)
        self._gn = ti.ndarray(real, shape=(max(len(hinges), 1), 13))
        # a strain limit on the same faces whose gradient and F-space Hessian are added
        # here (one projection of the sum); set by the solver, see fold_strain
        self.strain = None
        self._last = None  # the last full evaluation, see remember()
        self._scratch = ti.ndarray(real, shape=(2,))  # (shell_energy's strain sums, unused)
        self._energy_at = None  # (x, E) of the last energy-only evaluation

    def fold_strain(self, strain) -> bool:
        """Take over the gradient and Hessian of ``strain`` (a _StrainTerm on this very
        mesh): the sum of the two F-space Hessians is projected once, which is cheaper
        than two projections and closer to the true Hessian. Returns whether it did."""
        if strain is None or not np.array_equal(np.asarray(strain.faces), np.asarray(self.faces)):
            return False
        self.strain = strain
        return True

    def evaluate(self, x: np.ndarray, hessian: bool = True, energy_only: bool = False, folded: bool = True):
        """(E, g, H) of the shell energy at x; ``folded``: the gradient and Hessian include
        a folded strain limit's (``fold_strain``; its energy is the solver's to add).
        The progressive levels evaluate the finest level's term through prolongation with
        ``folded=False``: the finest level's solver folds its strain limit into this very
        object, and the coarser levels, which have strain limits of their own, must not
        get that one's gradient (without its energy) depending on whether the finest
        level's solver was built yet (a preview then differed by 3.8 mm after 3 frames)."""
        # A Newton step starts where the previous one converged, and the previous one's
        # last (confirming) iteration evaluated the Hessian right there: give it back.
        strain = self.strain if folded else None
        last = self._last
        if last is not None and last[4] == (self.gauss_newton_bending, strain) and np.array_equal(last[0], x):
            return last[1], (None if energy_only else last[2]), (last[3] if hessian and not energy_only else None)
        E, g, H = self._evaluate(x, hessian, energy_only, strain)
        if H is not None:
            self._last = remember(x, E, g, H, (self.gauss_newton_bending, strain))
        return E, g, H

    def _evaluate(self, x: np.ndarray, hessian: bool, energy_only: bool, strain=None):
        from tisim.linalg.psd import project_psd
        from tisim.solvers.cloth import elastic_kernels as EK

        upload(self.x, x)
        e = self.energy_obj
        hinge_args = (e.hinges, e.hinge_data, e.hinge_count)
        kept = self._energy_at
        if not energy_only and kept is not None and np.array_equal(kept[0], x):
            E = kept[1]  # the line search's last trial, where this Newton iteration starts
        else:
            # ShellEnergy.energy's two passes in one launch, the same sum; with a folded
            # strain limit, its energy too, for the line search's next call (StrainTerm.energy)
            o = strain.obj if strain is not None and energy_only else None
            s_args = (e.faces, e.face_data, 0, 0.0, 0.0, self._scratch)
            if o is not None:
                s_args = (o.faces, o.face_data, o.faces.shape[0], o.s_max, o.s_hat, o._scalar)
            EK.shell_energy(self.x, e.faces, e.face_data, *hinge_args, e._scalar, e._bending_sum, *s_args)
            E = float(download(e._scalar)[0]) + (float(download(e._bending_sum)[0]) if e.hinge_count else 0.0)
            if o is not None:
                strain.evaluated(x, *download(o._scalar)[:2])
        if energy_only:
            self._energy_at = (np.array(x, dtype=np.float64), E)
            return E, None, None
        _zero(self.g)
        st = strain
        strain_on = st is not None and st.active_at(x)
        # the membrane's, the bending's and the strain limit's gradients, in one launch
        o = st.obj if strain_on else None
        s_faces, s_data = (e.faces, e.face_data) if o is None else (o.faces, o.face_data)
        s_args = (0, 0.0, 0.0) if o is None else (o.faces.shape[0], o.s_max, o.s_hat)
        EK.shell_gradient(self.x, e.faces, e.face_data, *hinge_args, s_faces, s_data, *s_args, self.g)
        g = download(self.g)[: self.n]
        if not hessian:
            return E, g, None
        from tisim.energies import shell_kernels as K

        asm = self.assembler
        # membrane (+ strain limit) F-space Hessians, projected from their eigensystem
        f_args = (
            self.x,
            e.faces,
            e.face_data,
            s_data,
            1,
            int(strain_on),
            0.0 if o is None else o.s_max,
            0.0 if o is None else o.s_hat,
            0.0 if o is None else o._tol,
            1,
            self._hf,
        )
        if not len(self.hinges) or self.gauss_newton_bending:
            # and the Gauss-Newton bending, in the same launch (no hinges: placeholders)
            bend = asm.incidence[1] if len(self.hinges) else asm.incidence[0]
            n_gather = bend[0].shape[0] - 1 if len(self.hinges) else 0
            EK.shell_hessian(
                *f_args, *asm.incidence[0], asm.indptr, asm.data, *hinge_args, self._gn, *bend, n_gather,
                int(self.lumped_bending),
            )  # fmt: skip
            return E, g, asm.matrix()
        K.shell_hessian_f(*f_args)
        K.gather_face_hessians(e.face_data, self._hf, *asm.incidence[0], asm.indptr, asm.data)  # (zeroes first)
        if self.lumped_bending:
            raise ValueError(
                "the full bending Hessian needs the hinges' couplings in the pattern "
                "(solver.bending_hessian = 'coupled')"
            )
        K.bending_hessian(self.x, e.hinges, e.hinge_data, e.bending_hessians, True)
        self._psd_b = project_psd(e.bending_hessians, len(self.hinges), self._psd_b)
        K.scatter_blocks(e.bending_hessians, len(self.hinges), asm.slots[1], asm.data)
        return E, g, asm.matrix()


# a hinge's local vertices (e0, e1, o0, o1): with the bending Hessian lumped, there is no
# block between o0 and o1 (no shared face)
HINGE_LUMPED_COUPLINGS = ~np.array([[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]], dtype=bool)


def remember(x: np.ndarray, E: float, g: np.ndarray, H: sp.csr_matrix, *extra) -> tuple:
    """(x, E, g, H, *extra) for an elastic term's memo of its last full evaluation: a
    copy of x, and g and H's values made read-only (they are the very arrays handed to
    the caller), so that a caller writing into them fails loudly instead of corrupting
    the memo."""
    x = np.array(x, dtype=np.float64)
    for a in (x, g, H.data):
        a.flags.writeable = False
    return (x, E, g, H, *extra)


def _zero(a) -> None:
    """a[:] = 0 for a Vector ndarray. (ndarray.fill builds and compiles a fresh Taichi
    kernel on every call: 2.5 ms each, 4 calls per Newton iteration.)"""
    from tisim import backend
    from tisim.energies.shell_kernels import zero_vectors

    if not backend.zero(a):
        zero_vectors(a)


def _np(a) -> np.ndarray:
    """A Taichi field or a numpy array as numpy."""
    return a if isinstance(a, np.ndarray) else download(a)


class StrainTerm:
    """The strain-limit barrier on the level's own membrane (C-IPC), host interface."""

    def __init__(self, cls, n, faces, rest, s_max, stiffness, real):
        import taichi as ti

        from tisim.energies.shell import shell_rest

        self.obj = cls(n, faces, shell_rest(rest, faces), stiffness, s_max=s_max)
        self.n = n
        self.x = ti.Vector.ndarray(3, real, shape=max(n, 1))
        self.g = ti.Vector.ndarray(3, real, shape=max(n, 1))
        self.faces = faces
        self.s_max = s_max
        self.assembler = DeviceAssembler(3 * n, [_np(self.obj.face_stencils)])
        self._hf = ti.ndarray(real, shape=(max(len(faces), 1), 6, 6))
        self._stretch_at = None  # (x, largest stretch) of the last energy() call
        self._energy_at = None  # (x, energy) evaluated with the shell's (see evaluated)

    def energy(self, x):
        kept, self._energy_at = self._energy_at, None
        if kept is not None and np.array_equal(kept[0], x):
            return kept[1]  # evaluated with the shell's energy (ShellTerm, folded)
        upload(self.x, x)
        E = self.obj.energy(self.x)
        # the largest stretch came with it: max_stretch / active_at at the same x reuse it
        # (the Newton iteration after an accepted line search starts at its last trial)
        self._stretch_at = (np.array(x, dtype=np.float64), self.obj.last_max_stretch)
        return E

    def evaluated(self, x, E: float, stretch: float) -> None:
        """The energy E and largest stretch at x (n, 3), evaluated elsewhere (the shell's
        kernel, the same pass as ``energy``'s): the next :meth:`energy` call, if at x,
        returns E without a launch (once)."""
        x = np.array(x, dtype=np.float64)
        self.obj.last_max_stretch = float(stretch)
        self._energy_at = (x, float(E))
        self._stretch_at = (x, float(stretch))

    def gradient_hessian(self, x):
        from tisim.energies import shell_kernels as K

        upload(self.x, x)
        if not self.active(self.x):
            return None, None  # the barrier is inactive on every face: no force, no stiffness
        _zero(self.g)
        o = self.obj
        o.add_gradient(self.x, self.g)
        K.shell_hessian_f(self.x, o.faces, o.face_data, o.face_data, 0, 1, o.s_max, o.s_hat, o._tol, 1, self._hf)
        asm = self.assembler
        K.gather_face_hessians(o.face_data, self._hf, *asm.incidence[0], asm.indptr, asm.data)  # (zeroes first)
        return download(self.g)[: self.n], asm.matrix()

    def active(self, x) -> bool:
        """Whether the barrier acts on some face at positions x (an ndarray)."""
        return bool(self.obj.max_stretch(x) > self.obj.s_max - self.obj.s_hat)

    def active_at(self, x: np.ndarray) -> bool:
        """Whether the barrier acts on some face at positions x (n, 3)."""
        return self.max_stretch(x) > self.obj.s_max - self.obj.s_hat

    def max_stretch(self, x) -> float:
        kept = self._stretch_at
        if kept is not None and np.array_equal(kept[0], x):
            return kept[1]
        upload(self.x, x)
        return float(self.obj.max_stretch(self.x))

    def feasible(self, x) -> bool:
        upload(self.x, x)
        return bool(self.obj.feasible(self.x))


# the name the tests import
_StrainTerm = StrainTerm
