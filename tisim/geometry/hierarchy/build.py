"""Hierarchies: levels 0 (coarsest) .. L (finest) with their one-level and
direct prolongations, built from meshes, by subdivision or by decimation, and
checked."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from tisim.geometry.mesh import MeshError

from .decimation import decimate
from .embedding import compose, embed
from .levels import Level, lumped_masses
from .prolongation import Prolongation, identity
from .subdivision import loop_subdivide
from .uv import uv_at, vertex_uv

log = logging.getLogger(__name__)


# Default allowed embedding distance between consecutive levels, as a fraction
# of the finer level's bounding-box diagonal. Measured: a unit sphere decimated
# from 642 to 100 vertices lies within 0.9% of its fine mesh; a square cloth
# decimated to 80-300 vertices within 2-7%, all of it at the corners the
# decimator cuts (interior vertices are exactly on the coarse surface). 10%
# still rejects levels that are plainly different shapes (scaled, shifted,
# another object).
DEFAULT_MAX_DISTANCE = 0.1


@dataclass(frozen=True, eq=False)
class Hierarchy:
    """Levels 0 (coarsest) .. L (finest) with their prolongations.

    levels: (L+1) Levels. prolongations: L one-level operators, l -> l+1.
    direct: L+1 operators l -> L (the identity at L), what the coarse preview
    evaluates Psi_L through. method: how it was built. mass: "consistent" or
    "lumped". mass_deviation: per level, max_i |m_i - lumped_i| / lumped_i of
    the masses in use against area-lumped ones (0 for lumped masses and for
    the finest level).
    """

    levels: tuple[Level, ...]
    prolongations: tuple[Prolongation, ...]
    direct: tuple[Prolongation, ...]
    method: str
    mass: str
    mass_deviation: tuple[float, ...]

    @property
    def level_count(self) -> int:
        return len(self.levels)

    @property
    def finest(self) -> Level:
        return self.levels[-1]

    @property
    def coarsest(self) -> Level:
        return self.levels[0]

    def to_finest(self, level: int) -> Prolongation:
        """The direct prolongation P_l from ``level`` to the finest level."""
        return self.direct[level]


def _check_finer(levels: Sequence[Level]) -> None:
    for k in range(1, len(levels)):
        a, b = levels[k - 1].vertex_count, levels[k].vertex_count
        if b <= a:
            raise MeshError(f"level {k} ({b} vertices) is not finer than level {k - 1} ({a} vertices)")


def _check_distance(P: Prolongation, k: int, fine: Level, max_distance: float) -> None:
    worst = float(P.distance.max())
    diag = fine.diagonal
    if worst > max_distance * diag:
        raise MeshError(
            f"level {k} is far from level {k - 1}: max embedding distance {worst:.4g} m exceeds "
            f"{max_distance:g} x bounding-box diagonal {diag:.4g} m"
        )


def _finish(
    levels: list[Level],
    prolongations: list[Prolongation | None],
    method: str,
    mass: str,
    rho: float,
    max_distance: float,
    zero_mean_tangent: bool,
    embedded: bool,
) -> Hierarchy:
    """Embed (when ``embedded``), set masses and build the direct operators.
    Works from the finest level down so consistent masses are known on the
    fine side of every embedding."""
    if mass not in ("consistent", "lumped"):
        raise ValueError(f"mass must be 'consistent' or 'lumped', got {mass!r}")
    L = len(levels) - 1
    deviation = [0.0] * (L + 1)
    for lvl in range(L - 1, -1, -1):
        if embedded:
            P = embed(levels[lvl + 1], levels[lvl], zero_mean_tangent=zero_mean_tangent)
            _check_distance(P, lvl + 1, levels[lvl + 1], max_distance)
            prolongations[lvl] = P
        P = prolongations[lvl]
        lumped = lumped_masses(levels[lvl].vertices, levels[lvl].faces, rho)
        if mass == "consistent":
            m = P.restrict(levels[lvl + 1].mass)
            if np.any(m <= 0):
                bad = int(np.argmin(m))
                raise MeshError(
                    f"consistent mass U^T m of level {lvl} vertex {bad} is {m[bad]:.3g} kg "
                    "(no fine vertex leans on it: it lies on degenerate triangles only); "
                    "set refine.mass = \"lumped\""
                )
            deviation[lvl] = float(np.max(np.abs(m - lumped) / lumped))
        else:
            m = lumped
        levels[lvl] = levels[lvl].with_mass(m)
    if mass == "consistent" and L > 0:
        log.info(
            "consistent masses: max relative deviation from area-lumped masses per level %s",
            ", ".join(f"{d:.3g}" for d in deviation),
        )
    if embedded:
        directs = [embed(levels[L], levels[lvl], zero_mean_tangent=zero_mean_tangent) for lvl in range(L - 1)]
    else:
        directs = [compose(*prolongations[lvl:]) for lvl in range(L - 1)]
    directs += [prolongations[L - 1]] if L > 0 else []
    directs.append(identity(levels[L]))
    return Hierarchy(
        levels=tuple(levels),
        prolongations=tuple(prolongations),
        direct=tuple(directs),
        method=method,
        mass=mass,
        mass_deviation=tuple(deviation),
    )


def from_meshes(
    levels: Sequence[Level],
    *,
    mass: str = "consistent",
    areal_density: float | None = None,
    max_distance: float = DEFAULT_MAX_DISTANCE,
    zero_mean_tangent: bool = False,
) -> Hierarchy:
    """A hierarchy from user-given levels, coarsest first, each embedded in the
    one before (``embed``) and directly in every coarser one (``direct``).

    Raises MeshError (one line) when a level has no more vertices than the one
    before, or when its max embedding distance exceeds ``max_distance`` times
    its bounding-box diagonal (the levels are not the same surface). Masses as
    in ``build_hierarchy``; the finest level keeps its own.
    """
    levels = list(levels)
    if not levels:
        raise MeshError("from_meshes needs at least one level")
    _check_finer(levels)
    rho = levels[-1].areal_density if areal_density is None else float(areal_density)
    return _finish(
        levels,
        [None] * (len(levels) - 1),
        "meshes",
        mass,
        rho,
        max_distance,
        zero_mean_tangent,
        embedded=True,
    )


def decimation_minimum(
    levels: int, coarse_vertices: int | tuple[int, int] = (300, 1000), min_ratio: float = 2.0
) -> int:
    """The fewest finest-level vertices that ``build_hierarchy(method="decimate")`` can
    turn into ``levels`` levels."""
    lo = coarse_vertices if np.isscalar(coarse_vertices) else coarse_vertices[0]
    return int(np.ceil(int(lo) * min_ratio ** (int(levels) - 1)))


def build_hierarchy(
    level: Level,
    levels: int = 3,
    method: str = "decimate",
    coarse_vertices: int | tuple[int, int] = (300, 1000),
    *,
    mass: str = "consistent",
    areal_density: float | None = None,
    max_distance: float = DEFAULT_MAX_DISTANCE,
    zero_mean_tangent: bool = False,
    min_ratio: float = 2.0,
    preserve_border: bool = False,
) -> Hierarchy:
    """A ``levels``-level hierarchy (L = levels - 1).

    method "decimate": ``level`` is the finest level; coarser ones come from
    repeated decimation, the coarsest aiming at n_fine / 4^L vertices clamped
    into ``coarse_vertices`` = (lo, hi) (an int means lo = hi), intermediate
    ones spaced geometrically. Every consecutive pair must differ by at least
    ``min_ratio`` in vertex count, so the fine mesh needs at least
    lo * min_ratio^L vertices; otherwise MeshError naming the counts.
    method "loop" | "midpoint": ``level`` is the coarsest; L subdivisions.

    mass "consistent" (default): the finest level keeps its masses (for
    subdivision, lumped with ``areal_density``) and every coarser level gets
    m_l = U_l^T m_{l+1}, so U^T m_fine = m_coarse holds exactly and the total
    mass is the same on every level (rows of U sum to one); this is what the
    centre-of-mass consistency of §5.3 needs. The masses then differ from
    area-lumped ones (``Hierarchy.mass_deviation``). Loop, midpoint and
    embedding weights are all non-negative, so these masses are positive
    unless a coarse vertex has no fine vertex leaning on it (MeshError). With
    ``zero_mean_tangent`` the weights may be negative (same check).
    mass "lumped": area times ``areal_density`` on every level (totals then
    differ by the area difference between levels).

    §5.3 also needs m_fine^T a(x) = 0. The offsets satisfy it exactly when
    they vanish at rest (subdivision hierarchies, and flat embedded meshes
    whose coarse boundary covers the fine one); ``zero_mean_tangent`` removes
    the tangential part everywhere, exactly (see ``embed``); the normal part
    sum_f (sum_i m_i gamma_i) n_f(x) of curved embedded meshes remains: it
    cannot be removed without losing P(X_coarse) = X_fine.

    areal_density: kg/m^2 for lumped masses (default: ``level``'s mass/area).
    max_distance: embedding distance limit, fraction of the bounding-box diagonal.
    preserve_border: passed to ``decimate`` (keep every border vertex).
    """
    L = int(levels) - 1
    if L < 0:
        raise MeshError(f"a hierarchy needs at least one level, got {levels}")
    rho = level.areal_density if areal_density is None else float(areal_density)
    if method in ("loop", "midpoint"):
        chain = [level]
        prolongations: list[Prolongation | None] = []
        for _ in range(L):
            fine, P = loop_subdivide(chain[-1], method, areal_density=rho)
            chain.append(fine)
            prolongations.append(P)
        return _finish(chain, prolongations, method, mass, rho, max_distance, False, embedded=False)
    if method != "decimate":
        raise ValueError(f"method must be 'decimate', 'loop' or 'midpoint', got {method!r}")
    lo, hi = (coarse_vertices, coarse_vertices) if np.isscalar(coarse_vertices) else coarse_vertices
    lo, hi = int(lo), int(hi)
    n = level.vertex_count
    if L == 0:
        return _finish([level], [], method, mass, rho, max_distance, False, embedded=True)
    need = decimation_minimum(levels, (lo, hi), min_ratio)
    if n < need:
        raise MeshError(
            f"a {levels}-level hierarchy needs a finest mesh of at least {need} vertices "
            f"(coarsest {lo} x {min_ratio:g}^{L}), got {n}; refine.method = \"loop\" makes it the "
            f"preview and subdivides it"
        )
    c0 = float(np.clip(n / 4.0**L, lo, hi))
    c0 = min(c0, n / min_ratio**L)
    targets = [round(c0 * (n / c0) ** (k / L)) for k in range(L)]
    chain = [level]
    for k in range(L - 1, -1, -1):
        chain.insert(0, decimate(chain[0], targets[k], areal_density=rho, preserve_border=preserve_border))
    _check_finer(chain)
    fine_uv = vertex_uv(level)
    if fine_uv is not None:  # from the finest mesh itself, not level by level
        chain[:-1] = [replace(c, uv=uv_at(level, fine_uv, c.vertices)) for c in chain[:-1]]
    return _finish(chain, [None] * L, method, mass, rho, max_distance, zero_mean_tangent, embedded=True)
