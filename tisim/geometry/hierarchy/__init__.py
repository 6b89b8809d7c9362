"""Multi-resolution cloth hierarchies and the shell prolongation operator.

A coarse cloth mesh is simulated as a preview and finer levels follow it
(progressive dynamics, note ``progressive-dynamics.md`` §2.1, §2.5, §5.1, §5.3
and §7 "Prolongation of the progressive shell work"). This package builds the
levels (triangle meshes with lumped masses) and the prolongation operators
between them, in plain numpy/scipy:

    P(x) = U x + a(x),      a_i(x) = gamma_i n_h(x) + R_h(x) t_i,

with ``U`` a sparse (n_fine, n_coarse) matrix whose rows sum to one (the
intrinsic part) and ``a`` the extrinsic offset of every fine vertex stored in
the frame of a coarse *host triangle* h: ``n_h`` its unit normal and
``R_h = [e, n x e]`` its tangent frame, ``e`` the normalised host edge x1 - x0.
The rest offsets gamma_i (normal part, metres) and t_i (tangential part, (2,),
metres) are chosen so that P reproduces the finer rest shape exactly.
Velocities prolongate with ``V = U`` and forces restrict with ``U^T`` (offsets
lagged), as in §2.2.

Three ways to get levels:

* ``loop_subdivide`` / ``build_hierarchy(method="loop"|"midpoint")``: nested
  1-to-4 refinement; U is the subdivision matrix and the fine rest shape is
  U X, so the offsets vanish at rest (the host frames are still stored so
  every operator is applied the same way).
* ``decimate`` + ``embed`` / ``build_hierarchy(method="decimate")``: quadric
  edge-collapse decimation (the ``fast-simplification`` package) of a given
  fine mesh; every fine vertex is embedded at its closest point on the coarse
  rest surface (three non-zeros per row of U, §7).
* ``from_meshes``: user-given levels, embedded the same way and checked.

Direct prolongations from level l to the finest level L (what the coarse
preview uses for Psi_L(P_l(x)), §5.9) are built by re-embedding the finest
vertices into level l (``direct``) for unstructured levels, or by composing
the linear parts and recomputing the offsets between l and L (``compose``) for
subdivision levels; see those functions for what agrees and what does not.

Nothing here imports Taichi. The package is split by what each part does:
``levels`` (Level, lumped masses), ``prolongation`` (the operator P),
``embedding`` (closest points, ``embed``, ``direct``, ``compose``),
``subdivision`` (``loop_subdivide``), ``decimation`` (``decimate`` and its
clean-up), ``uv`` (texture coordinates across levels) and ``build``
(``Hierarchy``, ``build_hierarchy``, ``from_meshes``). Every name is
re-exported here, so ``from tisim.geometry.hierarchy import X`` keeps working.
"""

from __future__ import annotations

# The private helpers below (``_x as _x``) are re-exported because the unit
# tests of hierarchies import them from the package.
from .build import DEFAULT_MAX_DISTANCE, Hierarchy, build_hierarchy, decimation_minimum, from_meshes
from .decimation import collapse_needles, decimate, flip_slivers
from .embedding import _barycentric_matrix as _barycentric_matrix
from .embedding import _lean_on_every_vertex as _lean_on_every_vertex
from .embedding import closest_on_surface, compose, direct, embed
from .levels import Level, lumped_masses
from .prolongation import DirectProlongation, Prolongation, identity
from .prolongation import _with_offsets as _with_offsets
from .subdivision import loop_subdivide
from .uv import uv_at, vertex_uv

__all__ = [
    "DEFAULT_MAX_DISTANCE",
    "DirectProlongation",
    "Hierarchy",
    "Level",
    "Prolongation",
    "build_hierarchy",
    "closest_on_surface",
    "collapse_needles",
    "compose",
    "decimate",
    "decimation_minimum",
    "direct",
    "embed",
    "flip_slivers",
    "from_meshes",
    "identity",
    "loop_subdivide",
    "lumped_masses",
    "uv_at",
    "vertex_uv",
]
