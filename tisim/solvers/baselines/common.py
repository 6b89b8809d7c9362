"""Energies shared by the baseline integrators (numpy/scipy): the same elastic energies
ADMM integrates, gravity and the penalty contact potential, with gradients and
(projected) Hessians for Newton's method.

Elastic energy: E(x) = sum_e w_e psi_e(F_e(x)), psi from :mod:`tisim.materials` under
the names of :func:`tisim.solvers.admm.prox.energy_name` (the scene's "neo-hookean" is
the log-barrier Neo-Hookean of the ADMM notes, unless ``stable_neo_hookean``).
Gravity: -sum_v m_v g . x_v. Penalty: sum_v sum_c k/2 max(0, -d_c(x_v, t))^2 for the
analytic colliders c (k = ``contact.stiffness``), the potential ADMM's contact step uses.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from tisim import materials
from tisim.geometry.precompute import deformation_gradients
from tisim.scene import MATERIALS


def material_name(scene_material: str, stable_neo_hookean: bool = False) -> str:
    """The tisim.materials energy integrated for a scene material name."""
    if scene_material == "neo-hookean":
        return "neo-hookean" if stable_neo_hookean else "neo-hookean-log"
    return scene_material


class ModelEnergy:
    """Potential energy of a model and its derivatives.

    Positions x: (n, 3) metres. Energies in J, gradients (n, 3) in N (dE/dx),
    Hessians scipy CSR (3n, 3n) in N/m with dof index 3 v + c.
    """

    def __init__(self, model, stable_neo_hookean: bool = False):
        self.model = model
        self.tets = np.asarray(model.mesh.tets)
        self.grad = np.asarray(model.rest.grad)
        self.w = np.asarray(model.rest.volume)
        self.mu = np.asarray(model.element_mu)
        self.lam = np.asarray(model.element_lam)
        self.mass = np.asarray(model.mass)
        self.gravity = np.asarray(model.gravity, dtype=np.float64)
        codes = np.asarray(model.element_material)
        self.groups = [
            (material_name(MATERIALS[c], stable_neo_hookean), np.flatnonzero(codes == c)) for c in np.unique(codes)
        ]
        scene = model.scene
        self.colliders = list(model.colliders) if scene.contact.enabled else []
        self.kc = float(scene.contact.stiffness)
        n = model.vertex_count
        # COO pattern of the element Hessians: dof rows/cols of the (m, 12, 12) blocks
        dofs = (3 * self.tets[:, :, None] + np.arange(3)[None, None, :]).reshape(-1, 12)
        self._rows = np.repeat(dofs[:, :, None], 12, axis=2).ravel()
        self._cols = np.repeat(dofs[:, None, :], 12, axis=1).ravel()
        self._n = n

    # elastic ---------------------------------------------------------------
    def F(self, x: np.ndarray) -> np.ndarray:
        return deformation_gradients(x, self.tets, self.model.rest.Dm_inv)

    def elastic(self, x: np.ndarray) -> float:
        F = self.F(x)
        e = 0.0
        with np.errstate(all="ignore"):
            for name, idx in self.groups:
                psi = materials.energy_density(name, F[idx], self.mu[idx], self.lam[idx])
                e += float(np.sum(self.w[idx] * psi))
        return e if np.isfinite(e) else np.inf

    def elastic_gradient(self, x: np.ndarray) -> np.ndarray:
        F = self.F(x)
        P = np.empty_like(F)
        for name, idx in self.groups:
            P[idx] = materials.first_piola(name, F[idx], self.mu[idx], self.lam[idx])
        # dE/dx_a = w P grad_a
        f = self.w[:, None, None] * np.einsum("eij,eaj->eai", P, self.grad)
        out = np.zeros((self._n, 3))
        np.add.at(out, self.tets.ravel(), f.reshape(-1, 3))
        return out

    def elastic_hessian(self, x: np.ndarray, project: bool = True) -> sp.csr_matrix:
        F = self.F(x)
        D = np.empty((len(F), 9, 9))
        for name, idx in self.groups:
            D[idx] = materials.piola_derivative(name, F[idx], self.mu[idx], self.lam[idx], project_psd=project)
        D4 = D.reshape(-1, 3, 3, 3, 3)  # [e, k, j, l, n] = dP_kj / dF_ln
        H = np.einsum("eaj,ekjln,ebn->eakbl", self.grad, D4, self.grad, optimize=True)
        H *= self.w[:, None, None, None, None]
        return sp.csr_matrix((H.ravel(), (self._rows, self._cols)), shape=(3 * self._n, 3 * self._n))

    # gravity and contact ----------------------------------------------------
    def gravity_energy(self, x: np.ndarray) -> float:
        return -float(self.mass @ (x @ self.gravity))

    def penalty(self, x: np.ndarray, t: float) -> float:
        e = 0.0
        for c in self.colliders:
            d = c.distance(x, t)
            pen = np.minimum(d, 0.0)
            e += 0.5 * self.kc * float(pen @ pen)
        return e

    def penalty_gradient_hessian(self, x: np.ndarray, t: float) -> tuple[np.ndarray, sp.csr_matrix]:
        """Gradient (n, 3) and Gauss-Newton Hessian k n n^T per penetrating vertex (curvature of
        the collider surface neglected)."""
        g = np.zeros((self._n, 3))
        rows, cols, vals = [], [], []
        for c in self.colliders:
            d, nrm = c.signed_distance(x, t)
            pen = np.flatnonzero(d < 0)
            if pen.size == 0:
                continue
            g[pen] += self.kc * d[pen, None] * nrm[pen]
            blocks = self.kc * nrm[pen, :, None] * nrm[pen, None, :]
            dof = 3 * pen[:, None] + np.arange(3)
            rows.append(np.repeat(dof[:, :, None], 3, axis=2).ravel())
            cols.append(np.repeat(dof[:, None, :], 3, axis=1).ravel())
            vals.append(blocks.ravel())
        if rows:
            H = sp.csr_matrix(
                (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(3 * self._n, 3 * self._n)
            )
        else:
            H = sp.csr_matrix((3 * self._n, 3 * self._n))
        return g, H

    def contacts(self, x: np.ndarray, t: float) -> tuple[int, float]:
        """Vertices inside a collider and the deepest penetration (m; NaN without colliders)."""
        if not self.colliders:
            return 0, float("nan")
        count, depth = 0, 0.0
        for c in self.colliders:
            d = c.distance(x, t)
            inside = d < 0
            count += int(np.count_nonzero(inside))
            if np.any(inside):
                depth = max(depth, float(-d.min()))
        return count, depth

    def potential(self, x: np.ndarray, t: float) -> float:
        """Elastic + gravity + penalty energy in J."""
        return self.elastic(x) + self.gravity_energy(x) + self.penalty(x, t)
