"""Shell energies of the C-IPC cloth solver: Neo-Hookean membrane, hinge bending, strain limit.

Rest data (:func:`shell_rest`, :func:`hinges`, :func:`dihedral_angles`) is plain
numpy. :class:`ShellEnergy` (membrane + bending) and :class:`StrainLimit` own
their Taichi ndarrays (indices, packed rest data and parameters, local Hessians,
reduction scratch), allocated once in ``__init__``; every method is a kernel
launch over all elements (no Python loop over elements) that reads a positions
ndarray ``x: ti.Vector.ndarray(3, real, vertex_count)`` (metres, created by the
caller), so the same object evaluates any configuration, e.g. the finest level of
a hierarchy at a prolonged state. Kernels are in :mod:`tisim.energies.shell_kernels`;
they take ndarray arguments, so each compiles once per process (per precision)
for every object and size.

Energies (notes §2.4 and §7, "Neo-Hookean membrane", "Discrete-hinge bending",
"Strain limiting"):

* membrane, per face: Psi_m = tau A_bar [mu/2 (tr(a_bar^-1 a) - 2 - 2 ln J) + lam/2 ln^2 J],
  a = [e1.e1, e1.e2; e1.e2, e2.e2] (e1 = x1 - x0, e2 = x2 - x0), ln J = 1/2 ln(det a / det a_bar);
  mu = E / (2 (1 + nu)), lam = E nu / (1 - nu^2) (plane stress, :func:`lame_plane_stress`);
* bending, per interior edge: Psi_b = k (theta - theta_bar)^2 3 |e_bar|^2 / A_bar_e,
  A_bar_e the sum of the two adjacent rest areas, k = E tau^3 / (24 (1 - nu^2))
  (:func:`bending_stiffness`), theta the signed dihedral angle;
* strain limit, per face: Phi = kappa A_bar sum_i b(s_max - sigma_i, s_hat), sigma_i the
  singular values of the membrane deformation, b the IPC log barrier; active for
  sigma_i > s_max - s_hat (1 by default), +inf for sigma_i >= s_max.

Local Hessians are raw (not projected to PSD) and stored per element in ndarrays
(``(m, 9, 9)`` per face, ``(h, 12, 12)`` per hinge), with the element's vertices in
``face_stencils`` / ``hinge_stencils``; entry [e, 3 a + k, 3 b + l] is
d^2 Psi / (dx_{stencil[e, a], k} dx_{stencil[e, b], l}).

References:
    M. Li, D. M. Kaufman, C. Jiang. Codimensional Incremental Potential Contact
    (C-IPC). ACM TOG 40(4), 2021.
    R. Bridson, S. Marino, R. Fedkiw. Simulation of clothing with folds and wrinkles. SCA 2003.
    E. Grinspun, A. Hirani, M. Desbrun, P. Schröder. Discrete shells. SCA 2003.

Limitations:
    theta lives in (-pi, pi]: a hinge folded through +-pi (faces passing through
    each other, which contact forbids) jumps by 2 pi. Degenerate (zero-area)
    deformed triangles give +inf membrane energy and non-finite derivatives.
    The first call of each kernel in a process pays its compilation (or an
    offline-cache load); later objects of any size reuse it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from tisim.backend import download, upload

log = logging.getLogger(__name__)

__all__ = [
    "ShellEnergy",
    "ShellRest",
    "StrainLimit",
    "assemble_dense",
    "bending_stiffness",
    "dihedral_angles",
    "hinges",
    "lame_plane_stress",
    "shell_rest",
]


# ---------------------------------------------------------------------------
# topology and rest data (numpy)


def hinges(faces: np.ndarray) -> np.ndarray:
    """(h, 4) int32 hinges (e0, e1, o0, o1) of the interior manifold edges of a triangle mesh.

    faces: (m, 3) vertex indices. Delegates to :func:`tisim.geometry.topology.hinges`
    (same convention: e0 -> e1 runs in the winding of face (e0, e1, o0), the other
    face is (e1, e0, o1); boundary and non-manifold edges give none).
    """
    from tisim.geometry import topology

    f = np.asarray(faces, dtype=np.int64)
    if f.ndim != 2 or f.shape[1] != 3:
        raise ValueError(f"faces must have shape (m, 3), got {f.shape}")
    return np.ascontiguousarray(topology.hinges(f), dtype=np.int32).reshape(-1, 4)


_interior_hinges = hinges  # shell_rest's argument shadows the function


def dihedral_angles(x: np.ndarray, hinges: np.ndarray) -> np.ndarray:
    """(h,) signed dihedral angles in radians, in (-pi, pi], of hinges (e0, e1, o0, o1).

    theta = atan2((n0 x n1) . e_hat, n0 . n1) with n0 the normal of (e0, e1, o0), n1
    that of (e1, e0, o1) and e = x_e1 - x_e0: 0 when flat, positive when the hinge
    bends away from the normals (convex, for outward normals).
    """
    x = np.asarray(x, dtype=np.float64)
    hg = np.asarray(hinges)
    xe0, xe1, xo0, xo1 = (x[hg[:, i]] for i in range(4))
    e = xe1 - xe0
    n0 = np.cross(e, xo0 - xe0)
    n1 = np.cross(xe0 - xe1, xo1 - xe1)
    s = np.einsum("ij,ij->i", np.cross(n0, n1), e) / np.linalg.norm(e, axis=1)
    return np.arctan2(s, np.einsum("ij,ij->i", n0, n1))


def lame_plane_stress(young, poisson) -> tuple[np.ndarray, np.ndarray]:
    """(mu, lam) in Pa of a thin sheet in plane stress: mu = E / (2 (1 + nu)),
    lam = E nu / (1 - nu^2). young: Pa, poisson: dimensionless in (-1, 0.5]."""
    E = np.asarray(young, dtype=np.float64)
    nu = np.asarray(poisson, dtype=np.float64)
    return E / (2.0 * (1.0 + nu)), E * nu / (1.0 - nu * nu)


def bending_stiffness(young, poisson, thickness) -> np.ndarray:
    """Hinge bending stiffness k = E tau^3 / (24 (1 - nu^2)) in J (N m)."""
    E = np.asarray(young, dtype=np.float64)
    nu = np.asarray(poisson, dtype=np.float64)
    t = np.asarray(thickness, dtype=np.float64)
    return E * t**3 / (24.0 * (1.0 - nu * nu))


@dataclass(frozen=True)
class ShellRest:
    """Rest data of a shell mesh (numpy, float64, SI).

    a_bar: (m, 2, 2) rest first fundamental forms, m^2. a_bar_inv: (m, 2, 2) inverses, m^-2.
    frame: (m, 2, 2) G = L^-T with a_bar = L L^T (Cholesky), m^-1: F = [e1, e2] G is
        the membrane deformation (F^T F = I at rest).
    area: (m,) rest areas A_bar, m^2.
    theta_bar: (h,) rest dihedral angles, radians (from the initial shape, so a curved
        rest shape is stress-free; replace with zeros for a flat rest state).
    hinge_weight: (h,) 3 |e_bar|^2 / A_bar_e, dimensionless.
    edge_length: (h,) |e_bar|, m. hinge_area: (h,) A_bar_e, m^2.
    """

    a_bar: np.ndarray
    a_bar_inv: np.ndarray
    frame: np.ndarray
    area: np.ndarray
    theta_bar: np.ndarray
    hinge_weight: np.ndarray
    edge_length: np.ndarray
    hinge_area: np.ndarray

    @property
    def face_count(self) -> int:
        return len(self.area)

    @property
    def hinge_count(self) -> int:
        return len(self.theta_bar)


def shell_rest(vertices: np.ndarray, faces: np.ndarray, hinges: np.ndarray | None = None) -> ShellRest:
    """Rest data of a triangle mesh.

    vertices: (n, 3) rest positions, metres. faces: (m, 3). hinges: (h, 4) rows
    (e0, e1, o0, o1) (default: :func:`hinges` of ``faces``).
    Raises ValueError for a degenerate rest triangle or hinge.
    """
    X = np.asarray(vertices, dtype=np.float64)
    F = np.asarray(faces, dtype=np.int64)
    if X.ndim != 2 or X.shape[1] != 3:
        raise ValueError(f"vertices must have shape (n, 3), got {X.shape}")
    if F.ndim != 2 or F.shape[1] != 3 or len(F) == 0:
        raise ValueError(f"faces must have shape (m, 3) with m >= 1, got {F.shape}")
    H = _interior_hinges(F) if hinges is None else np.asarray(hinges, dtype=np.int64).reshape(-1, 4)
    e1 = X[F[:, 1]] - X[F[:, 0]]
    e2 = X[F[:, 2]] - X[F[:, 0]]
    a11 = np.einsum("ij,ij->i", e1, e1)
    a12 = np.einsum("ij,ij->i", e1, e2)
    a22 = np.einsum("ij,ij->i", e2, e2)
    det = a11 * a22 - a12 * a12
    # det a_bar = (2 A)^2; a relative floor catches slivers and repeated vertices
    bad = ~(det > 1e-24 * np.maximum(a11 * a22, np.finfo(np.float64).tiny))
    if np.any(bad):
        raise ValueError(f"degenerate rest triangles (zero area): faces {np.flatnonzero(bad)[:10].tolist()}")
    a_bar = np.stack([np.stack([a11, a12], -1), np.stack([a12, a22], -1)], -2)
    a_inv = np.stack([np.stack([a22, -a12], -1), np.stack([-a12, a11], -1)], -2) / det[:, None, None]
    area = 0.5 * np.sqrt(det)
    # Cholesky a_bar = L L^T: L = [[l00, 0], [l10, l11]]; G = L^-T
    l00 = np.sqrt(a11)
    l10 = a12 / l00
    l11 = np.sqrt(det) / l00
    frame = np.zeros((len(F), 2, 2))
    frame[:, 0, 0] = 1.0 / l00
    frame[:, 0, 1] = -l10 / (l00 * l11)
    frame[:, 1, 1] = 1.0 / l11
    if len(H):
        xe0, xe1, xo0, xo1 = (X[H[:, i]] for i in range(4))
        e = xe1 - xe0
        elen = np.linalg.norm(e, axis=1)
        hinge_area = 0.5 * (
            np.linalg.norm(np.cross(e, xo0 - xe0), axis=1) + np.linalg.norm(np.cross(xe0 - xe1, xo1 - xe1), axis=1)
        )
        if np.any(~(hinge_area > 0.0)) or np.any(~(elen > 0.0)):
            raise ValueError("degenerate rest hinge (zero edge length or area)")
        theta_bar = dihedral_angles(X, H)
        weight = 3.0 * elen**2 / hinge_area
    else:
        elen = hinge_area = theta_bar = weight = np.zeros(0)
    return ShellRest(
        a_bar=a_bar,
        a_bar_inv=a_inv,
        frame=frame,
        area=area,
        theta_bar=theta_bar,
        hinge_weight=weight,
        edge_length=elen,
        hinge_area=hinge_area,
    )


def assemble_dense(local: np.ndarray, stencils: np.ndarray, vertex_count: int) -> np.ndarray:
    """Dense (3n, 3n) matrix summed from local (k, 3s, 3s) blocks on stencils (k, s).
    For tests and small meshes only."""
    local = np.asarray(local, dtype=np.float64)
    st = np.asarray(stencils, dtype=np.int64)
    k, s = st.shape
    idx = (3 * st[:, :, None] + np.arange(3)).reshape(k, 3 * s)
    H = np.zeros((3 * vertex_count, 3 * vertex_count))
    np.add.at(H, (idx[:, :, None], idx[:, None, :]), local.reshape(k, 3 * s, 3 * s))
    return H


def _per_element(value, count: int, name: str, *, positive: bool = True, allow_zero: bool = False) -> np.ndarray:
    """A scalar or (count,) array as (count,) float64, validated."""
    a = np.asarray(value, dtype=np.float64)
    if a.ndim == 0:
        a = np.full(count, float(a))
    if a.shape != (count,):
        raise ValueError(f"{name} must be a scalar or have shape ({count},), got {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be finite")
    if positive and (np.any(a < 0.0) if allow_zero else np.any(a <= 0.0)):
        raise ValueError(f"{name} must be {'non-negative' if allow_zero else 'positive'}")
    return a


# ---------------------------------------------------------------------------
# Taichi-backed energies


class _NdarrayEnergy:
    """Shared plumbing: ndarray storage and numpy wrappers over scratch ndarrays."""

    vertex_count: int

    def _alloc_common(self, vertex_count: int, faces: np.ndarray, frame_cols: np.ndarray) -> None:
        import taichi as ti

        from tisim import backend

        real = backend.real()
        self._np_real = backend.np_real()
        self.vertex_count = int(vertex_count)
        if faces.max() >= self.vertex_count or faces.min() < 0:
            raise ValueError(f"faces index vertices outside 0..{self.vertex_count - 1}")
        self.face_stencils = np.ascontiguousarray(faces, dtype=np.int32)
        self.face_stencils.setflags(write=False)
        m = len(faces)
        self.faces = ti.ndarray(ti.i32, shape=(m, 3))
        upload(self.faces, self.face_stencils)
        self.face_data = ti.ndarray(real, shape=(m, frame_cols.shape[1]))
        upload(self.face_data, frame_cols.astype(self._np_real))
        self._scalar = ti.ndarray(real, shape=(2,))
        self._count = ti.ndarray(ti.i32, shape=(1,))
        self._sigma = ti.ndarray(real, shape=(m,))
        # numpy-wrapper scratch, allocated on first use
        self._x_scratch = None
        self._g_scratch = None

    def _check_faces(self, faces) -> np.ndarray:
        f = np.asarray(faces, dtype=np.int64)
        if f.ndim != 2 or f.shape[1] != 3 or len(f) == 0:
            raise ValueError(f"faces must have shape (m, 3) with m >= 1, got {f.shape}")
        return f

    # -- stats shared by both energies (columns 0..2 of face_data are G)

    def membrane_strain(self, x) -> np.ndarray:
        """(m,) largest singular value sigma_1 of each face's membrane deformation."""
        from tisim.energies import shell_kernels as K

        K.face_stretch(x, self.faces, self.face_data, self._sigma, self._scalar)
        return download(self._sigma).astype(np.float64)

    def max_stretch(self, x) -> float:
        """Largest sigma_1 over all faces (1 at rest)."""
        from tisim.energies import shell_kernels as K

        K.face_stretch(x, self.faces, self.face_data, self._sigma, self._scalar)
        return float(self._scalar[0])

    # -- numpy wrappers (copy in and out on every call: tests and small scripts only)

    def _load(self, X: np.ndarray):
        """X (n, 3) copied into a scratch ``ti.Vector.ndarray(3, real, n)`` (returned)."""
        import taichi as ti

        from tisim import backend

        X = np.asarray(X, dtype=np.float64).reshape(self.vertex_count, 3)
        if self._x_scratch is None:
            self._x_scratch = ti.Vector.ndarray(3, backend.real(), shape=self.vertex_count)
        upload(self._x_scratch, X.astype(self._np_real))
        return self._x_scratch

    def energy_np(self, X: np.ndarray) -> float:
        """energy at positions X (n, 3), metres."""
        return self.energy(self._load(X))

    def gradient_np(self, X: np.ndarray) -> np.ndarray:
        """(n, 3) gradient at X, N."""
        import taichi as ti

        from tisim import backend
        from tisim.energies import shell_kernels as K

        x = self._load(X)
        if self._g_scratch is None:
            self._g_scratch = ti.Vector.ndarray(3, backend.real(), shape=self.vertex_count)
        K.zero_vectors(self._g_scratch)
        self.add_gradient(x, self._g_scratch)
        return download(self._g_scratch).astype(np.float64)

    def hessian_np(self, X: np.ndarray, **kwargs) -> np.ndarray:
        """Dense (3n, 3n) Hessian at X assembled from the local Hessians, N/m."""
        self.local_hessians(self._load(X), **kwargs)
        return sum(
            assemble_dense(download(arr), stencils, self.vertex_count) for arr, stencils in self._hessian_parts()
        )


class ShellEnergy(_NdarrayEnergy):
    """Neo-Hookean membrane + discrete-hinge bending of a triangle mesh, as Taichi kernels.

    vertex_count: n. faces: (m, 3). hinges: (h, 4) rows (e0, e1, o0, o1) (may be empty).
    rest: :class:`ShellRest` of these faces and hinges.
    mu, lam: Lamé parameters (plane stress), Pa, scalar or (m,).
    thickness: tau, metres, scalar or (m,).
    bending_k: hinge stiffness k, J, scalar or (h,) (e.g. :func:`bending_stiffness`,
        or a user bending stiffness; 0 disables bending).

    Ndarrays (allocated once): ``membrane_hessians`` ``ti.ndarray(real, (m, 9, 9))``
    on ``face_stencils`` (m, 3), ``bending_hessians`` ``(max(h, 1), 12, 12)`` on
    ``hinge_stencils`` (h, 4) (both stencils numpy int32; ``faces`` / ``hinges``
    hold them as i32 ndarrays (m, 3) / (max(h, 1), 4); ``face_data`` /
    ``hinge_data`` the packed rest data and parameters, real).
    Every method takes positions ``x: ti.Vector.ndarray(3, real, n)`` in metres;
    :meth:`update` changes rest data or parameters in place (no recompilation:
    no kernel recompiles for a new object either).
    """

    def __init__(self, vertex_count: int, faces, hinges, rest: ShellRest, mu, lam, thickness, bending_k):
        import taichi as ti

        from tisim import backend
        from tisim.energies import shell_kernels as K

        faces = self._check_faces(faces)
        hg = np.asarray(hinges, dtype=np.int64).reshape(-1, 4)
        m, h = len(faces), len(hg)
        if max(faces.max(), hg.max(initial=-1)) >= vertex_count or min(faces.min(), hg.min(initial=0)) < 0:
            raise ValueError(f"faces/hinges index vertices outside 0..{vertex_count - 1}")
        self._alloc_common(vertex_count, faces, np.zeros((m, K.MEMBRANE_COLS)))
        real = backend.real()
        self.hinge_count = h
        self.hinge_stencils = np.ascontiguousarray(hg, dtype=np.int32)
        self.hinge_stencils.setflags(write=False)
        hrows = max(h, 1)  # no empty ndarrays; kernels are skipped when h == 0
        self.hinges = ti.ndarray(ti.i32, shape=(hrows, 4))
        self.hinge_data = ti.ndarray(real, shape=(hrows, K.BENDING_COLS))
        if h:
            upload(self.hinges, self.hinge_stencils)
        else:
            upload(self.hinges, np.zeros((1, 4), np.int32))
            upload(self.hinge_data, np.zeros((1, K.BENDING_COLS), self._np_real))
        self.membrane_hessians = ti.ndarray(real, shape=(m, 9, 9))
        self.bending_hessians = ti.ndarray(real, shape=(hrows, 12, 12))
        self._bending_sum = ti.ndarray(real, shape=(1,))
        self._face_np = np.zeros((m, K.MEMBRANE_COLS))
        self._hinge_np = np.zeros((h, K.BENDING_COLS))
        self.update(rest=rest, mu=mu, lam=lam, thickness=thickness, bending_k=bending_k)

    def update(self, *, rest: ShellRest | None = None, mu=None, lam=None, thickness=None, bending_k=None) -> None:
        """Change rest data and/or parameters in place (same ndarrays, no recompilation).

        Arguments as in the constructor; None keeps the current value. mu and
        bending_k may be 0 (that term off); lam may be negative (nu < 0).
        """
        from tisim.energies import shell_kernels as K

        m, h = len(self.face_stencils), self.hinge_count
        if rest is not None:
            if rest.face_count != m or rest.hinge_count != h:
                raise ValueError(
                    f"rest data has {rest.face_count} faces and {rest.hinge_count} hinges, "
                    f"the mesh {m} faces and {h} hinges"
                )
            self.rest = rest
            self._face_np[:, K.M_G00] = rest.frame[:, 0, 0]
            self._face_np[:, K.M_G01] = rest.frame[:, 0, 1]
            self._face_np[:, K.M_G11] = rest.frame[:, 1, 1]
            self._face_np[:, K.M_AREA] = rest.area
            self._hinge_np[:, K.B_THETA] = rest.theta_bar
            self._hinge_np[:, K.B_WEIGHT] = rest.hinge_weight
        if mu is not None:
            self._face_np[:, K.M_MU] = _per_element(mu, m, "mu", allow_zero=True)
        if lam is not None:
            self._face_np[:, K.M_LAM] = _per_element(lam, m, "lam", positive=False)
        if thickness is not None:
            self._face_np[:, K.M_THICK] = _per_element(thickness, m, "thickness")
        if bending_k is not None:
            self._hinge_np[:, K.B_K] = _per_element(bending_k, h, "bending_k", allow_zero=True)
        upload(self.face_data, self._face_np.astype(self._np_real))
        if h:
            upload(self.hinge_data, self._hinge_np.astype(self._np_real))

    @classmethod
    def from_material(
        cls,
        vertices: np.ndarray,
        faces: np.ndarray,
        *,
        young: float,
        poisson: float,
        thickness: float,
        bending_k=None,
        hinge_rows: np.ndarray | None = None,
        flat_rest: bool = False,
    ) -> ShellEnergy:
        """Build from rest positions (n, 3) m and a material: Young's modulus (Pa),
        Poisson ratio, thickness (m); bending_k defaults to :func:`bending_stiffness`.
        flat_rest=True sets every rest angle to 0 (a sheet that wants to be flat)."""
        faces = np.asarray(faces)
        hg = hinges(faces) if hinge_rows is None else np.asarray(hinge_rows)
        rest = shell_rest(vertices, faces, hg)
        if flat_rest:
            from dataclasses import replace

            rest = replace(rest, theta_bar=np.zeros_like(rest.theta_bar))
        mu, lam = lame_plane_stress(young, poisson)
        k = bending_stiffness(young, poisson, thickness) if bending_k is None else bending_k
        return cls(len(vertices), faces, hg, rest, mu, lam, thickness, k)

    def energy_parts(self, x) -> dict[str, float]:
        """{"membrane": Psi_m, "bending": Psi_b} in J (inf for a degenerate triangle)."""
        from tisim.energies import shell_kernels as K

        K.membrane_energy(x, self.faces, self.face_data, self._scalar)
        bending = 0.0
        if self.hinge_count:
            K.bending_energy(x, self.hinges, self.hinge_data, self._bending_sum)
            bending = float(self._bending_sum[0])
        return {"membrane": float(self._scalar[0]), "bending": bending}

    def energy(self, x) -> float:
        """Psi_m + Psi_b in J."""
        parts = self.energy_parts(x)
        return parts["membrane"] + parts["bending"]

    def add_gradient(self, x, g) -> None:
        """g += d(Psi_m + Psi_b)/dx, N (g: ti.Vector.ndarray(3, real, n); element order on
        the CPU backend, parallel atomics on GPU backends)."""
        from tisim.energies import shell_kernels as K

        K.membrane_gradient(x, self.faces, self.face_data, g)
        if self.hinge_count:
            K.bending_gradient(x, self.hinges, self.hinge_data, g)

    def local_hessians(self, x, *, project_bending: bool = False) -> None:
        """Fill ``membrane_hessians`` (m, 9, 9) and ``bending_hessians`` (h, 12, 12), N/m.

        Raw Hessians; project_bending=True drops the (theta - theta_bar) Hess(theta)
        term, which leaves a PSD rank-one bending Hessian (Gauss-Newton)."""
        from tisim.energies import shell_kernels as K

        K.membrane_hessian(x, self.faces, self.face_data, self.membrane_hessians)
        if self.hinge_count:
            K.bending_hessian(x, self.hinges, self.hinge_data, self.bending_hessians, not project_bending)

    def _hessian_parts(self):
        parts = [(self.membrane_hessians, self.face_stencils)]
        if self.hinge_count:
            parts.append((self.bending_hessians, self.hinge_stencils))
        return parts


class StrainLimit(_NdarrayEnergy):
    """C-IPC strain-limiting barrier on the membrane singular values, as Taichi kernels.

    Phi = sum_faces kappa A_bar sum_i b(s_max - sigma_i, s_hat), b(d, dhat) =
    -(d - dhat)^2 ln(d / dhat) on 0 < d < dhat (notes §2.4 "Strain limiting").

    vertex_count: n. faces: (m, 3). rest: :class:`ShellRest` of these faces (uses
    frame and area). kappa: barrier stiffness, J/m^2 (Pa m), scalar or (m,).
    s_max: largest allowed singular value (1.01 = 1 % stretch). s_hat: barrier
    width; default s_max - 1, so the barrier is active only for sigma > 1 (C-IPC).

    Ndarrays: ``hessians`` ``ti.ndarray(real, (m, 9, 9))`` on ``face_stencils`` (m, 3);
    every method takes positions ``x: ti.Vector.ndarray(3, real, n)``.
    """

    def __init__(
        self,
        vertex_count: int,
        faces,
        rest: ShellRest,
        kappa,
        *,
        s_max: float = 1.01,
        s_hat: float | None = None,
    ):
        import taichi as ti

        from tisim import backend
        from tisim.energies import shell_kernels as K

        faces = self._check_faces(faces)
        m = len(faces)
        s_hat = s_max - 1.0 if s_hat is None else float(s_hat)
        if not (s_max > 0.0 and 0.0 < s_hat <= s_max):
            raise ValueError(f"strain limit needs 0 < s_hat <= s_max, got s_max={s_max}, s_hat={s_hat}")
        self.s_max = float(s_max)
        self.s_hat = float(s_hat)
        self._alloc_common(vertex_count, faces, np.zeros((m, K.STRAIN_COLS)))
        self.hessians = ti.ndarray(backend.real(), shape=(m, 9, 9))
        # Switch from the divided difference (g'_1 - g'_2)/(l_1 - l_2) to its limit g''
        # where rounding (eps / dl) and truncation ((dl / 2 s_hat)^2) errors balance.
        self._tol = float(np.cbrt(np.finfo(self._np_real).eps)) * 2.0 * self.s_hat
        self._face_np = np.zeros((m, K.STRAIN_COLS))
        self.update(rest=rest, kappa=kappa)

    def update(self, *, rest: ShellRest | None = None, kappa=None) -> None:
        """Change the rest data and/or kappa in place (same ndarrays, no recompilation)."""
        from tisim.energies import shell_kernels as K

        m = len(self.face_stencils)
        if rest is not None:
            if rest.face_count != m:
                raise ValueError(f"rest data has {rest.face_count} faces, the mesh {m}")
            self.rest = rest
            self._face_np[:, K.S_G00] = rest.frame[:, 0, 0]
            self._face_np[:, K.S_G01] = rest.frame[:, 0, 1]
            self._face_np[:, K.S_G11] = rest.frame[:, 1, 1]
            self._face_np[:, K.S_AREA] = rest.area
        if kappa is not None:
            self._face_np[:, K.S_KAPPA] = _per_element(kappa, m, "kappa")
        upload(self.face_data, self._face_np.astype(self._np_real))

    def energy_parts(self, x) -> dict[str, float]:
        return {"strain_limit": self.energy(x)}

    def energy(self, x) -> float:
        """Phi in J; +inf if some sigma_i >= s_max. Keeps the largest sigma_1 at x in
        ``last_max_stretch``."""
        from tisim.energies import shell_kernels as K

        K.strain_energy(x, self.faces, self.face_data, self._scalar, self.s_max, self.s_hat)
        e, s1 = download(self._scalar)[:2]
        self.last_max_stretch = float(s1)  # max_stretch(x), from the same pass
        return float(e)

    def add_gradient(self, x, g) -> None:
        """g += dPhi/dx, N (element order on the CPU backend, parallel atomics on GPU
        backends). Undefined (left unchanged) on infeasible faces."""
        from tisim.energies import shell_kernels as K

        K.strain_gradient(x, self.faces, self.face_data, g, self.s_max, self.s_hat)

    def local_hessians(self, x) -> None:
        """Fill ``hessians`` (m, 9, 9) with the raw Hessians of Phi, N/m (zero where inactive)."""
        from tisim.energies import shell_kernels as K

        K.strain_hessian(x, self.faces, self.face_data, self.hessians, self.s_max, self.s_hat, self._tol)

    def infeasible_count(self, x) -> int:
        """Number of faces with sigma_1 >= s_max (or a non-finite deformation)."""
        from tisim.energies import shell_kernels as K

        K.count_infeasible(x, self.faces, self.face_data, self._count, self.s_max)
        return int(download(self._count)[0])

    def feasible(self, x) -> bool:
        """Whether every face has sigma_1 < s_max (the line search keeps this true)."""
        return self.infeasible_count(x) == 0

    def feasible_faces(self, x) -> np.ndarray:
        """(m,) bool: sigma_1 < s_max per face."""
        return self.membrane_strain(x) < self.s_max

    def _hessian_parts(self):
        return [(self.hessians, self.face_stencils)]
