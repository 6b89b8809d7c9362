"""Extended position-based dynamics (XPBD) with small steps: a baseline for the comparison.

Per time step h: ``substeps`` substeps of h_s = h / substeps, each (Macklin et al. 2019)
predicting x = x + h_s v + h_s^2 g, projecting the element constraints once
(``iterations`` times) with compliance (Macklin et al. 2016), projecting vertices out of
the colliders, then v = (x - x_prev) / h_s.

Constraints per tet (rest volume V, Lame mu, lam), Gauss-Seidel in parallel over a
graph colouring of the tets (tets of one colour share no vertex):

* "neo-hookean": the log-barrier Neo-Hookean that ADMM and implicit Euler integrate,
  psi = mu/2 (I_C - 3) - mu log J + lam/2 (log J)^2, as the constraint pair of Macklin &
  Mueller 2021 with a log hydrostatic part: deviatoric C_D = ||F||_F with compliance
  1/(mu V) and hydrostatic C_H = log J - mu/lam with compliance 1/(lam V), solved together
  as one 2x2 block. Their energy mu/2 C_D^2 + lam/2 C_H^2 (times V) is psi V plus a
  constant, and the pair keeps the rest state in place. For J <= 1e-6 (inverted or
  crushed: log J undefined) C_H falls back to Macklin & Mueller's det F - (1 + mu/lam),
  which pushes the tet back out. With lam = 0: C_D = ||F||_F - sqrt(3) alone (no -mu log J
  term: a stand-in).
* "symmetric-dirichlet", "symmetric-gradient": a stand-in, Macklin & Mueller's stable
  Neo-Hookean pair (C_H = det F - gamma, gamma = 1 + mu/lam) with the same rest
  stiffness mu, not the same energy (:func:`integrated_energy` says so, and
  ``tisim compare`` refuses to compare its energy with the others').
* "arap": C = ||F - R||_F (R the polar rotation), compliance 1/(2 mu V), i.e. the energy
  mu ||F - R||^2; "corotated" adds C_H = det F - 1 with compliance 1/(lam V) (2x2 block):
  both exactly the energies the other integrators use.

Handles hold their vertices (inverse mass 0); colliders are frictionless position
projections along their normal (or the shared penalty potential as an external force,
``contact = "penalty"``). The potential reported in StepStats is the model energy ADMM
integrates (:class:`tisim.solvers.baselines.common.ModelEnergy`), so energy curves of the
integrators compare like with like.

References:
    M. Macklin, M. Mueller, N. Chentanez, XPBD: Position-based simulation of compliant
    constrained dynamics, MIG 2016; M. Macklin, K. Storey, M. Lu, P. Terdiman,
    N. Chentanez, S. Jeschke, M. Mueller, Small steps in physics simulation, SCA 2019;
    M. Macklin, M. Mueller, A constraint-based formulation of stable Neo-Hookean materials,
    MIG 2021.

Limitations:
    * Dissipative and only approximately conservative. The constraint energies are the
      monitored energy (up to a constant) for "arap", "corotated" and "neo-hookean"; the
      symmetric energies get a stand-in (see above).
    * No iteration to convergence: stiffness is resolved only as far as the substeps allow.
    * Frictionless contact; no self-collision.
"""

# No "from __future__ import annotations": Taichi reads kernel annotations as objects.

import logging
import math

import numpy as np
import taichi as ti

from tisim import backend
from tisim.scene import MATERIALS
from tisim.solvers.admm import prox
from tisim.solvers.base import Solver, StepStats
from tisim.solvers.baselines.common import ModelEnergy
from tisim.solvers.baselines.config import XPBDConfig

log = logging.getLogger(__name__)

ND1 = ti.types.ndarray(ndim=1)
ND2 = ti.types.ndarray(ndim=2)
ND3 = ti.types.ndarray(ndim=3)
_ARAP = MATERIALS.index("arap")
_COROTATED = MATERIALS.index("corotated")
_NEO_HOOKEAN = MATERIALS.index("neo-hookean")
_LOG_J_FLOOR = 1e-6  # below, C_H = log J is replaced by det F - gamma (log undefined at J <= 0)

# tisim.materials energy each scene material's constraints integrate (None: a stand-in)
_INTEGRATED = {
    "arap": "arap",
    "corotated": "corotated",
    "neo-hookean": "neo-hookean-log",
    "symmetric-dirichlet": None,
    "symmetric-gradient": None,
}


def integrated_energy(material: str) -> str:
    """Name of the energy XPBD's constraints integrate for a scene material: a
    :mod:`tisim.materials` name when they integrate it exactly (up to a constant), else
    "xpbd-stable-neo-hookean-stand-in" (the symmetric energies)."""
    name = _INTEGRATED[material]
    return name if name is not None else "xpbd-stable-neo-hookean-stand-in"


_PARALLEL_FROM = 20000  # tets; below, one serial sweep beats a launch per colour


@ti.func
def _F(x: ti.template(), topo: ti.template(), grad: ti.template(), e):
    F = ti.Matrix.zero(float, 3, 3)
    for a in ti.static(range(4)):
        v = topo[e, a]
        F += ti.Vector([x[v, 0], x[v, 1], x[v, 2]]).outer_product(
            ti.Vector([grad[e, a, 0], grad[e, a, 1], grad[e, a, 2]])
        )
    return F


@ti.func
def _cofactor(F):
    c0 = ti.Vector([F[0, 1], F[1, 1], F[2, 1]]).cross(ti.Vector([F[0, 2], F[1, 2], F[2, 2]]))
    c1 = ti.Vector([F[0, 2], F[1, 2], F[2, 2]]).cross(ti.Vector([F[0, 0], F[1, 0], F[2, 0]]))
    c2 = ti.Vector([F[0, 0], F[1, 0], F[2, 0]]).cross(ti.Vector([F[0, 1], F[1, 1], F[2, 1]]))
    return ti.Matrix.cols([c0, c1, c2])


@ti.func
def _apply(
    x: ti.template(),
    invm: ti.template(),
    topo: ti.template(),
    grad: ti.template(),
    e,
    C,
    dC,
    alpha_t,
    lam_acc: ti.template(),
    k,
):
    """One compliant constraint update: dlambda = (-C - alpha~ lambda) / (sum w |grad C|^2 + alpha~)."""
    denom = alpha_t
    for a in ti.static(range(4)):
        g = dC @ ti.Vector([grad[e, a, 0], grad[e, a, 1], grad[e, a, 2]])
        denom += invm[topo[e, a]] * g.norm_sqr()
    if denom > 1e-300:
        dl = (-C - alpha_t * lam_acc[e, k]) / denom
        lam_acc[e, k] += dl
        for a in ti.static(range(4)):
            v = topo[e, a]
            g = dC @ ti.Vector([grad[e, a, 0], grad[e, a, 1], grad[e, a, 2]])
            for c in ti.static(range(3)):
                x[v, c] += invm[v] * g[c] * dl


@ti.func
def _apply2(
    x: ti.template(),
    invm: ti.template(),
    topo: ti.template(),
    grad: ti.template(),
    e,
    C1,
    dC1,
    a1,
    C2,
    dC2,
    a2,
    lam_acc: ti.template(),
):
    """Two compliant constraints of one tet solved together (a 2x2 block):
    (J W J^T + diag(alpha~)) dlambda = -(C + alpha~ lambda). Unlike two sequential updates,
    this leaves the rest state of the Neo-Hookean pair exactly in place (its two gradients
    are parallel there and only their compliance-weighted combination balances)."""
    A11 = a1
    A22 = a2
    A12 = 0.0
    for a in ti.static(range(4)):
        ga = ti.Vector([grad[e, a, 0], grad[e, a, 1], grad[e, a, 2]])
        g1 = dC1 @ ga
        g2 = dC2 @ ga
        wa = invm[topo[e, a]]
        A11 += wa * g1.norm_sqr()
        A22 += wa * g2.norm_sqr()
        A12 += wa * g1.dot(g2)
    b1 = -C1 - a1 * lam_acc[e, 0]
    b2 = -C2 - a2 * lam_acc[e, 1]
    det = A11 * A22 - A12 * A12
    if det > 1e-300 * ti.max(1.0, A11 * A22):
        d1 = (A22 * b1 - A12 * b2) / det
        d2 = (A11 * b2 - A12 * b1) / det
        lam_acc[e, 0] += d1
        lam_acc[e, 1] += d2
        for a in ti.static(range(4)):
            v = topo[e, a]
            ga = ti.Vector([grad[e, a, 0], grad[e, a, 1], grad[e, a, 2]])
            dx = (dC1 @ ga) * d1 + (dC2 @ ga) * d2
            for c in ti.static(range(3)):
                x[v, c] += invm[v] * dx[c]


@ti.kernel
def project_tets(
    x: ND2,
    invm: ND1,
    topo: ND2,
    grad: ND3,
    params: ND2,
    order: ND1,
    start: ti.i32,
    end: ti.i32,
    lam_acc: ND2,
    inv_h2: float,
):
    """Project the constraints of tets order[start:end] in parallel (one colour: no shared
    vertices). params[e] = (V, mu, lam)."""
    for k in range(start, end):
        _project_tet(x, invm, topo, grad, params, order[k], lam_acc, inv_h2)


@ti.kernel
def project_tets_serial(x: ND2, invm: ND1, topo: ND2, grad: ND3, params: ND2, order: ND1, lam_acc: ND2, inv_h2: float):
    """All tets one after the other in colour order: the same result as the colour-parallel
    passes (tets of one colour are independent), with one launch (faster for small meshes)."""
    ti.loop_config(serialize=True)
    for k in range(order.shape[0]):
        _project_tet(x, invm, topo, grad, params, order[k], lam_acc, inv_h2)


@ti.func
def _project_tet(
    x: ti.template(),
    invm: ti.template(),
    topo: ti.template(),
    grad: ti.template(),
    params: ti.template(),
    e,
    lam_acc: ti.template(),
    inv_h2,
):
    vol = params[e, 0]
    mu = params[e, 1]
    lam = params[e, 2]
    mat = topo[e, 4]
    F = _F(x, topo, grad, e)
    if mat == _ARAP or mat == _COROTATED:
        R = prox.closest_rotation(F)
        D = F - R
        c = D.norm()
        dC = ti.Matrix.zero(float, 3, 3)
        if c > 1e-12:  # at c = 0 the gradient is undefined and the constraint is satisfied
            dC = D / c
        if mat == _COROTATED and lam > 0.0:
            _apply2(
                x,
                invm,
                topo,
                grad,
                e,
                c,
                dC,
                inv_h2 / (2.0 * mu * vol),
                F.determinant() - 1.0,
                _cofactor(F),
                inv_h2 / (lam * vol),
                lam_acc,
            )
        elif c > 1e-12:
            _apply(x, invm, topo, grad, e, c, dC, inv_h2 / (2.0 * mu * vol), lam_acc, 0)
    else:
        n = F.norm()
        if lam > 0.0:
            J = F.determinant()
            C_H = J - (1.0 + mu / lam)  # Macklin & Mueller's stable pair (the stand-in)
            dC_H = _cofactor(F)
            if mat == _NEO_HOOKEAN and J > _LOG_J_FLOOR:
                C_H = ti.log(J) - mu / lam  # the log-barrier Neo-Hookean's own energy
                dC_H = dC_H / J
            _apply2(x, invm, topo, grad, e, n, F / n, inv_h2 / (mu * vol), C_H, dC_H, inv_h2 / (lam * vol), lam_acc)
        else:
            _apply(x, invm, topo, grad, e, n - ti.sqrt(3.0), F / n, inv_h2 / (mu * vol), lam_acc, 0)


def color_tets(tets: np.ndarray, vertex_count: int) -> tuple[np.ndarray, np.ndarray]:
    """Greedy graph colouring: tets sharing a vertex get different colours.

    Returns (order (m,) tet indices sorted by colour, starts (colours + 1,) offsets into order).
    """
    m = len(tets)
    colors = np.empty(m, dtype=np.int64)
    used = [0] * vertex_count  # bit masks of colours used at each vertex
    for e in range(m):
        a, b, c, d = (int(i) for i in tets[e])
        mask = used[a] | used[b] | used[c] | used[d]
        col = (~mask & (mask + 1)).bit_length() - 1  # lowest free colour
        colors[e] = col
        bit = 1 << col
        used[a] |= bit
        used[b] |= bit
        used[c] |= bit
        used[d] |= bit
    order = np.argsort(colors, kind="stable").astype(np.int32)
    counts = np.bincount(colors, minlength=int(colors.max()) + 1 if m else 1)
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return order, starts


class SolverXPBD(Solver):
    """XPBD with small steps (see the module doc). StepStats.iterations = substeps x passes."""

    name = "xpbd"

    def __init__(self, model, config: XPBDConfig | None = None):
        super().__init__(model, config if config is not None else XPBDConfig())
        real = backend.np_real()
        self._real = real
        m, n = model.element_count, model.vertex_count
        topo = np.empty((m, 5), dtype=np.int32)
        topo[:, :4] = model.mesh.tets
        topo[:, 4] = model.element_material
        self._topo = topo
        self._grad = np.ascontiguousarray(model.rest.grad, dtype=real)
        self._params = np.ascontiguousarray(
            np.stack([model.rest.volume, model.element_mu, model.element_lam], axis=1), dtype=real
        )
        self._order, self._starts = color_tets(model.mesh.tets, n)
        self._lam = np.zeros((m, 2), dtype=real)
        self.mass = np.asarray(model.mass, dtype=np.float64)
        self.energy = ModelEnergy(model)
        self._colliders = list(model.colliders) if model.scene.contact.enabled else []
        self._damping = float(model.scene.sim.damping)

    @property
    def colors(self) -> int:
        return len(self._starts) - 1

    def step(self, state_in, state_out, dt: float) -> StepStats:
        if not (math.isfinite(dt) and dt > 0):
            raise ValueError(f"XPBD step: the time step must be a finite number > 0, got {dt!r}")
        x = np.array(state_in.positions, dtype=self._real)
        v = np.array(state_in.velocities, dtype=np.float64)
        if not (np.all(np.isfinite(x)) and np.all(np.isfinite(v))):
            raise ValueError("XPBD step: the input state has NaN/inf positions or velocities")
        cfg = self.config
        hs = float(dt) / cfg.substeps
        t = float(state_in.time)
        g = self.model.gravity
        penalty = cfg.contact == "penalty"
        for s in range(cfg.substeps):
            ts = t + (s + 1) * hs
            held, held_x, held_v = self.held_vertices(ts)
            invm = np.ascontiguousarray(1.0 / self.mass, dtype=self._real)
            invm[held] = 0.0
            acc = np.broadcast_to(g, v.shape).copy()
            if penalty and self._colliders:
                gp, _ = self.energy.penalty_gradient_hessian(x.astype(np.float64), ts)
                acc -= gp / self.mass[:, None]
            v += hs * acc
            x_prev = x.astype(np.float64)
            x += (hs * v).astype(self._real)
            x[held] = held_x
            self._lam[:] = 0.0
            for _ in range(cfg.iterations):
                if self.model.element_count < _PARALLEL_FROM:
                    project_tets_serial(
                        x, invm, self._topo, self._grad, self._params, self._order, self._lam, 1.0 / (hs * hs)
                    )
                    continue
                for c in range(self.colors):
                    project_tets(
                        x,
                        invm,
                        self._topo,
                        self._grad,
                        self._params,
                        self._order,
                        int(self._starts[c]),
                        int(self._starts[c + 1]),
                        self._lam,
                        1.0 / (hs * hs),
                    )
            if not penalty:
                for col in self._colliders:
                    d, nrm = col.signed_distance(x, ts)
                    pen = d < 0
                    pen[held] = False
                    if np.any(pen):
                        x[pen] -= (d[pen, None] * nrm[pen]).astype(self._real)
            v = (x.astype(np.float64) - x_prev) / hs
            if len(held):
                v[held] = held_v
            if self._damping > 0:
                v /= 1.0 + self._damping * hs
        xf = x.astype(np.float64)
        np.copyto(state_out.positions, xf)
        np.copyto(state_out.velocities, v)
        t1 = t + float(dt)
        state_out.time = t1
        n_contacts, depth = self.energy.contacts(xf, t1)
        return StepStats(
            iterations=cfg.substeps * cfg.iterations,
            residual=math.nan,
            converged=True,
            potential=self.energy.potential(xf, t1),
            n_contacts=n_contacts,
            max_penetration=depth,
            extra={"colors": float(self.colors)},
        )

    def potential_energy(self, positions: np.ndarray) -> float:
        return self.energy.potential(np.asarray(positions, dtype=np.float64), 0.0)

    def integrated_energies(self) -> dict[str, str]:
        """{scene material: energy its constraints integrate} for the model's materials."""
        codes = np.unique(np.asarray(self.model.element_material))
        return {MATERIALS[int(c)]: integrated_energy(MATERIALS[int(c)]) for c in codes}

    def info(self) -> dict:
        return {
            "solver": "xpbd",
            "substeps": self.config.substeps,
            "iterations": self.config.iterations,
            "colors": self.colors,
            "energies": self.integrated_energies(),
        }
