"""Plain numpy geometry: mesh types, I/O, generators, topology, precomputation.

Nothing here imports Taichi, so all of it is testable on its own.
"""

from __future__ import annotations

from tisim.geometry.io import load_tet_mesh, load_tri_mesh, save_mesh
from tisim.geometry.mesh import MeshError, TetMesh, TriMesh

__all__ = ["MeshError", "TetMesh", "TriMesh", "load_tet_mesh", "load_tri_mesh", "save_mesh"]
