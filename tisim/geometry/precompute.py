"""Per-element rest-shape quantities shared by every solver."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from tisim.geometry.mesh import MeshError, TetMesh, tet_signed_volumes


@dataclass(frozen=True, eq=False)
class TetRest:
    """Rest-shape data of a tet mesh.

    Dm: (m, 3, 3) rest edge matrices [X1-X0, X2-X0, X3-X0] (columns), metres.
    Dm_inv: (m, 3, 3) their inverses, 1/metres.
    volume: (m,) rest volumes, m^3 (positive).
    grad: (m, 4, 3) gradients of the four linear shape functions, 1/metres;
        F = sum_a x_a grad[a]^T, i.e. F = Ds Dm^-1.
    """

    Dm: np.ndarray
    Dm_inv: np.ndarray
    volume: np.ndarray
    grad: np.ndarray


def tet_rest(mesh: TetMesh) -> TetRest:
    x = mesh.vertices[mesh.tets]
    Dm = np.transpose(x[:, 1:] - x[:, :1], (0, 2, 1))  # columns are edges
    vol = tet_signed_volumes(mesh.vertices, mesh.tets)
    scale = np.max(np.ptp(mesh.vertices, axis=0)) if mesh.vertex_count else 1.0
    tiny = 1e-14 * max(scale, 1e-30) ** 3
    if np.any(vol <= tiny):
        bad = int(np.argmin(vol))
        what = "degenerate (zero volume)" if abs(vol[bad]) <= tiny else "inverted"
        raise MeshError(f"tet {bad} is {what}: signed volume {vol[bad]:.3g} m^3", mesh.source)
    Dm_inv = np.linalg.inv(Dm)
    grad = np.empty((len(vol), 4, 3))
    grad[:, 1:, :] = Dm_inv  # row j of Dm^-1 is grad N_{j}, j = 1..3
    grad[:, 0, :] = -Dm_inv.sum(axis=1)
    return TetRest(Dm=Dm, Dm_inv=Dm_inv, volume=vol, grad=grad)


def deformation_gradients(positions: np.ndarray, tets: np.ndarray, Dm_inv: np.ndarray) -> np.ndarray:
    """(m, 3, 3) F = Ds Dm^-1 at ``positions`` (n, 3)."""
    x = positions[tets]
    Ds = np.transpose(x[:, 1:] - x[:, :1], (0, 2, 1))
    return Ds @ Dm_inv


def lumped_mass(mesh: TetMesh, density, volume: np.ndarray | None = None) -> np.ndarray:
    """(n,) lumped vertex masses in kg: a quarter of each incident tet's mass.

    density: scalar or (m,) kg/m^3.
    """
    vol = tet_signed_volumes(mesh.vertices, mesh.tets) if volume is None else volume
    em = np.broadcast_to(np.asarray(density, dtype=np.float64), vol.shape) * vol
    return np.bincount(mesh.tets.ravel(), weights=np.repeat(em / 4.0, 4), minlength=mesh.vertex_count)


def gradient_operator(tets: np.ndarray, grad: np.ndarray, vertex_count: int) -> sp.csr_matrix:
    """Scalar discrete gradient G_hat, shape (3m, n): rows 3e..3e+2 map nodal values
    u (n,) to grad u on tet e. For positions q (n, 3), (G_hat @ q)[3e:3e+3] = F_e^T.

    The 3D operator of the notes is G_hat kron I_3; with lumped mass every global
    matrix of the form M + sum w G^T G is (scalar matrix) kron I_3, so solvers
    factor only the scalar n x n part.
    """
    m = len(tets)
    rows = (3 * np.arange(m)[:, None, None] + np.arange(3)[None, None, :]).repeat(4, axis=1)
    cols = np.broadcast_to(tets[:, :, None], (m, 4, 3))
    vals = grad  # (m, 4, 3): d(grad u)_k / d u_a = grad[e, a, k]
    return sp.csr_matrix((vals.ravel(), (rows.ravel(), cols.ravel())), shape=(3 * m, vertex_count))
