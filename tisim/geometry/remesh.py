"""Isotropic remeshing of a cloth whose triangles are too poor to simulate well.

A mesh from a scan or a Delaunay triangulation can carry sliver triangles a tenth
of a millimetre high: their vertices sit closer than the contact thickness to the
triangle across, and their stiffness rows are badly conditioned. ``remesh`` rebuilds
the surface with near-equilateral triangles of one edge length (Botsch and Kobbelt's
split / collapse / flip / smooth / project loop, ``gpytoolbox.remesh_botsch``),
keeping the border, the holes and the separate pieces, and carries the texture
coordinates over by projection onto the input.
"""

from __future__ import annotations

import logging

import numpy as np

from tisim.geometry import topology
from tisim.geometry.cloth import ClothMesh
from tisim.geometry.mesh import MeshError

log = logging.getLogger(__name__)

# A triangle whose smallest height is below this fraction of the target edge length
# counts as degenerate in the result.
_DEGENERATE = 1e-6


def mean_edge_length(vertices: np.ndarray, faces: np.ndarray) -> float:
    """The mean length of the unique edges of ``faces`` (m, 3) over ``vertices`` (n, 3), metres."""
    e = topology.edges(faces)
    return float(np.linalg.norm(vertices[e[:, 0]] - vertices[e[:, 1]], axis=1).mean())


def triangle_heights(vertices: np.ndarray, faces: np.ndarray) -> np.ndarray:
    """(m,) the smallest height of each triangle (twice its area over its longest
    edge), metres: how close a vertex comes to the opposite side."""
    p = vertices[faces]
    area2 = np.linalg.norm(np.cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0]), axis=1)
    longest = np.linalg.norm(p[:, [1, 2, 0]] - p, axis=2).max(axis=1)
    return area2 / np.maximum(longest, 1e-300)


def _check_result(x_in, f_in, x, f, h: float, source: str | None) -> None:
    """Refuse a remeshed surface that the solver could not use: a degenerate
    triangle, an edge of more than two triangles, a lost border vertex."""
    edges, counts = topology.edge_face_counts(f)
    if len(f) == 0:
        raise MeshError("remeshing (gpytoolbox.remesh_botsch) returned no triangles", source)
    if counts.max() > 2:
        e = edges[int(np.argmax(counts))]
        raise MeshError(
            f"remeshing (gpytoolbox.remesh_botsch) made a non-manifold edge ({e[0]}, {e[1]}) of "
            f"{int(counts.max())} triangles: use the mesh as it is (remesh = false)",
            source,
        )
    heights = triangle_heights(x, f)
    if heights.min() < _DEGENERATE * h:
        j = int(np.argmin(heights))
        raise MeshError(
            f"remeshing (gpytoolbox.remesh_botsch) made a degenerate triangle {j} "
            f"({heights[j]:.3g} m high for a target edge length of {h:.3g} m): "
            "use the mesh as it is (remesh = false) or another target length",
            source,
        )
    # a fold: a new triangle facing against the input at its centroid's closest point
    from tisim.geometry.hierarchy import closest_on_surface

    p = x[f]
    normal = np.cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0])
    host, _, _ = closest_on_surface(p.mean(axis=1), x_in, f_in)
    q = x_in[f_in[host]]
    facing = np.einsum("ij,ij->i", normal, np.cross(q[:, 1] - q[:, 0], q[:, 2] - q[:, 0]))
    if (facing <= 0).any():
        raise MeshError(
            f"remeshing (gpytoolbox.remesh_botsch) folded {int((facing <= 0).sum())} triangles over "
            f"(target edge length {h:.3g} m): use the mesh as it is (remesh = false) or a shorter "
            "target length",
            source,
        )
    border = np.unique(topology.boundary_edges(f_in))
    if len(border):
        kept = {tuple(p) for p in x.tolist()}
        lost = [int(i) for i in border if tuple(x_in[i].tolist()) not in kept]
        if lost:
            raise MeshError(
                f"remeshing (gpytoolbox.remesh_botsch) moved border vertex {lost[0]} "
                f"({len(lost)} of {len(border)} moved)",
                source,
            )


def remesh(mesh: ClothMesh, target_edge_length: float | None = None, *, iterations: int = 10) -> ClothMesh:
    """An isotropic remesh of the cloth ``mesh``: near-equilateral triangles whose
    edges are about ``target_edge_length`` metres (default: the mean edge length of
    ``mesh``, so the vertex count stays about the same).

    Kept: every border vertex where it is (the outline, the rims of holes and slits:
    the library fixes boundary vertices and edges), so holes and separate pieces
    stay as they are (same Euler characteristic, same boundary loops); the surface, by
    projection of every new vertex onto the input (area within a fraction of a percent
    on a flat or smooth sheet, less on a noisy scan, whose noise finer than the target
    is smoothed out). Texture coordinates: one per vertex (or per-corner ones that
    agree at every vertex, as an OBJ without seams loads) are interpolated
    (barycentric) at the closest input surface point of every new vertex, exact where
    the UVs are affine over a triangle.

    Raises MeshError for a target that is not a positive length, a mesh with an edge
    of three or more triangles (the library needs a manifold one), a failure of the
    library, and a result with a degenerate, folded or non-manifold triangle.

    Limitations: a border vertex never moves, so a sliver whose three corners are all
    on the border (a thin triangle cutting off a corner of the outline) stays unless
    an edge flip removes it; the library never splits a boundary edge, so a border
    much coarser than the target (an edge several targets long) keeps thin triangles
    along it, and a border finer than the target keeps its short edges. A fold (a
    new triangle facing against the input) is refused. With UV seams (a vertex with two different UVs) the result
    gets no UVs (a warning is logged): a new triangle may straddle a seam.
    """
    from tisim.geometry.hierarchy import Level, uv_at, vertex_uv

    src = mesh.source
    x_in, f_in = mesh.vertices, mesh.faces.astype(np.int64)
    h = mean_edge_length(x_in, f_in) if target_edge_length is None else target_edge_length
    if isinstance(h, bool) or not isinstance(h, (int, float, np.floating)) or not np.isfinite(h) or h <= 0:
        raise MeshError(f"remeshing needs a target edge length > 0 m, got {target_edge_length!r}", src)
    h = float(h)
    edges, counts = topology.edge_face_counts(f_in)
    if counts.max(initial=0) > 2:
        e = edges[int(np.argmax(counts))]
        raise MeshError(
            f"cannot remesh: edge ({e[0]}, {e[1]}) is shared by {int(counts.max())} triangles "
            "(remeshing needs each edge on at most two)",
            src,
        )
    try:
        import gpytoolbox
    except ImportError as err:  # pragma: no cover - a declared dependency
        raise MeshError("remeshing needs the 'gpytoolbox' package (pip install 'gpytoolbox>=0.3,<0.4')", src) from err
    try:
        x, f = gpytoolbox.remesh_botsch(x_in, f_in.astype(np.int32), i=int(iterations), h=h, project=True)
    except (ValueError, RuntimeError) as err:
        raise MeshError(f"remeshing (gpytoolbox.remesh_botsch) failed: {err}", src) from None
    x, f = np.asarray(x, dtype=np.float64), np.asarray(f, dtype=np.int64)
    _check_result(x_in, f_in, x, f, h, src)

    uv = face_uv = None
    if mesh.uv is not None:
        level = Level.from_mesh(x_in, f_in, 1.0, uv=mesh.uv, face_uv=mesh.face_uv)
        input_uv = vertex_uv(level)
        if input_uv is None:
            log.warning(
                "%s: the mesh has UV seams (a vertex with two texture coordinates): the remeshed cloth has no UVs",
                src or "remesh",
            )
        else:
            uv = uv_at(level, input_uv, x)
            face_uv = f
    out = ClothMesh.from_arrays(x, f, uv=uv, face_uv=face_uv, source=src)
    before, after = triangle_heights(x_in, f_in).min(), triangle_heights(out.vertices, out.faces).min()
    log.info(
        "remeshed %s: %d -> %d vertices, target edge length %.3g m, smallest triangle height %.3g -> %.3g m",
        src or "the cloth",
        len(x_in),
        out.vertex_count,
        h,
        before,
        after,
    )
    if after < before:
        # the border is kept as it is: a thin triangle against it can get thinner
        log.warning(
            "%s: remeshing left a thinner triangle than the mesh had (%.3g m high, was %.3g m), next "
            "to the border, which it keeps: the mesh may run better as it is (remesh = false)",
            src or "remesh",
            after,
            before,
        )
    return out
