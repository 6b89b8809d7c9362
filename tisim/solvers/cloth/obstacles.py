"""What the cloth meets besides itself: the scene's colliders (analytic when static planes,
spheres, boxes and cylinders, a static sphere as its centre when the cloth is coarse
against its curve; tessellated otherwise), the soft bodies' surfaces stepped by
a PD solver as moving obstacles, and the start-state checks against them."""

from __future__ import annotations

import math

import numpy as np


def _diag(x: np.ndarray) -> float:
    return float(np.linalg.norm(np.ptp(x, axis=0))) if len(x) else 1.0


def _refuse_vertices_inside(d, c, name: str, src) -> None:
    """One MeshError line for a cloth whose vertices' signed distances d (n,) to the
    collider ``c`` (``name`` in messages) put all of them, or some, inside it."""
    from tisim.geometry.mesh import MeshError

    if (d < 0).all():
        raise MeshError(
            f"the cloth starts inside {name} (every vertex; the deepest {-d.min():.3g} m): move the cloth out of it",
            src,
        )
    j = int(np.argmin(d))
    if d[j] < 0:  # some vertices inside, some outside
        raise MeshError(
            f"the cloth intersects collider {c.name!r}: cloth vertex {j} is {-d[j]:.3g} m inside "
            f"the {c.kind}: move the cloth away from it",
            src,
        )


def _check_start_analytic(xc, faces, edges, shape, c, xi: float, src) -> None:
    """Refuse a cloth (vertices xc (n, 3), faces, edges) that starts inside the analytic
    collider ``c`` (its ``shape``), crosses it, or has a vertex within the thickness xi
    of it: one MeshError line naming the collider."""
    from tisim.geometry.cloth import check_intersection_free
    from tisim.geometry.mesh import MeshError

    name = f"{c.kind} collider {c.name!r}"
    d = c.distance(xc, 0.0)  # from the real surface (a curved shape's is grown: the sag allowance)
    allowance = shape.r - c.radius if shape.kind in ("sphere", "cylinder") else 0.0
    i = int(np.argmin(d - allowance))
    _refuse_vertices_inside(d, c, name, src)
    if d[i] <= xi + allowance:
        extra = f" plus {allowance:.2g} m for its triangles' sag over the curve" if allowance > 0 else ""
        raise MeshError(
            f"cloth vertex {i} starts {d[i]:.3g} m from {name}, within the contact thickness "
            f"{xi:g} m{extra}: move the cloth away from it",
            src,
        )
    if shape.kind == "sphere":
        # a triangle whose vertices are all outside can still cut a cap off the sphere
        from tisim.geometry.distances import point_triangle_distance

        tri = xc[faces]
        reach = np.linalg.norm(tri - tri.mean(axis=1, keepdims=True), axis=2).max(axis=1)
        near = np.flatnonzero(d[faces].min(axis=1) - reach < 0)
        for f in near:
            if point_triangle_distance(shape.c, *tri[f]) < shape.r:
                raise MeshError(
                    f"the cloth intersects {name}: cloth face {f} (vertices "
                    f"{', '.join(map(str, faces[f]))}) cuts through it: move the cloth away from it",
                    src,
                )
    elif shape.kind in ("box", "cylinder"):
        # a box's edge or a cylinder's rim can pierce a triangle whose vertices are outside
        if shape.kind == "box":
            other = c.surface_mesh(0.0)
        else:
            m = _rim_segments(shape.r, xi)
            extent = 2.0 * float(np.abs(xc - shape.c).max()) + shape.r
            other = c.surface_mesh(0.0, extent=extent, segments=m)
        check_intersection_free(xc, faces, edges, source=src, other=other, other_name=name)


def _check_start_ball(xc, ball, c, x_dev, src) -> None:
    """Refuse a cloth (vertices xc (n, 3)) that starts inside the sphere ``c`` met by the
    BallPairs ``ball``, crosses it, or has a face within the contact thickness of it
    (the ball's rows detected at x_dev, the solver's positions): one MeshError line."""
    from tisim.geometry.mesh import MeshError

    _refuse_vertices_inside(c.distance(xc, 0.0), c, f"sphere collider {c.name!r}", src)
    gap = ball.clearance(x_dev)
    if gap <= ball.thickness:
        from tisim.geometry.distances import point_triangle_distance

        f = int(np.argmin([point_triangle_distance(c.center(0.0), *xc[t]) for t in ball.faces]))
        tri = f"cloth triangle {f} (vertices {', '.join(map(str, ball.faces[f]))})"
        if gap <= 0:
            msg = f"the cloth intersects collider {c.name!r}: {tri} cuts through the sphere"
        else:
            msg = (
                f"{tri} and the surface of collider {c.name!r} start {gap:.3g} m apart, within the "
                f"contact thickness {ball.thickness:g} m"
            )
        raise MeshError(f"{msg}: move the cloth away from it", src)


class _SolidView:
    """The solid part of a combined state, as a State the PD solver can step."""

    def __init__(self, state, ns):
        self.positions = state.positions[:ns]
        self.velocities = state.velocities[:ns]
        self.time = state.time
        self.warm = state.warm.setdefault("solids", {})
        self._state = state

    def __setattr__(self, k, v):
        object.__setattr__(self, k, v)
        if k == "time" and "_state" in self.__dict__:
            self._state.time = v

    def is_finite(self):
        return bool(np.isfinite(self.positions).all() and np.isfinite(self.velocities).all())


def _solid_solver(model, pd_config):
    """A PD solver over the scene's soft bodies alone (the model's first vertices)."""
    import dataclasses

    from tisim.model import Model
    from tisim.solvers.pd.solver import SolverPD

    scene = model.scene
    objs = {k: o for k, o in scene.objects.items() if o.kind == "solid"}
    sub = dataclasses.replace(scene, objects=objs, solver=pd_config)
    return SolverPD(Model.from_scene(sub), pd_config)


class _Obstacles:
    """Kinematic triangle meshes and line sets the cloth meets, and the static analytic
    shapes (``analytic``: planes, spheres, boxes, cylinders; tisim.contact.ipc.analytic).
    Mesh colliders and moving colliders are tessellated; the surfaces of the solids are
    met as they are. A static box's 12 edges and 8 corners and a static capped
    cylinder's rims (polylines) are line sets: the analytic terms keep the cloth's
    vertices off the shape, the line sets its edges and faces off the shape's edges.
    Vertex positions at time t come from the colliders' rigid motion and from the
    solids' current positions."""

    def __init__(self, model, cp, include_solids: bool = True, circumradius: float = 0.0):
        from tisim.contact.ipc.analytic import sag_allowance

        span = _diag(cp.rest)
        contact = model.scene.contact
        xi = contact.thickness
        self.parts = []  # (collider or None, vertex ids into the solid block or None, count)
        self.part_faces = []  # each part's rows of ``faces``, for its name in messages
        faces, mus, off = [], [], 0
        edges = []  # the line sets' edges (no faces)
        self._static = {}  # part index -> its fixed vertices (the line sets)
        mu_default = np.nan

        def fine_enough(c):
            # a cloth coarse against the curvature would float by its sag allowance: it
            # meets a sphere's centre instead (its triangles exactly) and a tessellated
            # cylinder, whose facets its triangles rest on
            return c.kind not in ("sphere", "cylinder") or sag_allowance(c.radius, xi, circumradius) <= (
                SAG_LIMIT * (xi + contact.dhat)
            )

        self.analytic = [
            c for c in model.colliders if c.kind in ANALYTIC_KINDS and not c.is_moving() and fine_enough(c)
        ]
        self.planes = [c for c in self.analytic if c.kind == "plane"]  # (the planes among them)
        # static spheres the cloth is too coarse for (its sag allowance too large): met by
        # the triangles exactly, the centre a static vertex (tisim.solvers.cloth.balls)
        self.balls = []  # (collider, index of its centre among the obstacle vertices)
        nf = 0
        for c in model.colliders:
            if c.kind == "sphere" and not c.is_moving() and c not in self.analytic:
                self.balls.append((c, off))
                self._static[len(self.parts)] = c.center(0.0)[None].astype(np.float64)
                V, F = self._static[len(self.parts)], np.zeros((0, 3), np.int64)
            elif c in self.analytic:
                V, E = _line_set(c, xi)
                if not len(V):
                    continue
                self._static[len(self.parts)] = V
                F = np.zeros((0, 3), np.int64)
                edges.append(E + off)
            else:
                V, F = self._mesh(c, 0.0, span)
            self.part_faces.append(slice(nf, nf + len(F)))
            nf += len(F)
            faces.append(F + off)
            mus.append(np.full(len(V), np.nan if c.friction is None else c.friction))
            self.parts.append((c, None, len(V)))
            off += len(V)
        ns = model.solid_vertex_count
        if include_solids and ns > 0 and model.element_count > 0:
            surf = model.surface[: len(model.surface) - len(model.cloth.faces)]
            ids = np.unique(surf)
            remap = np.full(ns, -1, dtype=np.int64)
            remap[ids] = np.arange(len(ids))
            self.part_faces.append(slice(nf, nf + len(surf)))
            faces.append(remap[surf] + off)
            mus.append(np.full(len(ids), mu_default))
            self.parts.append((None, ids, len(ids)))
            off += len(ids)
        self.vertex_count = off
        self.faces = np.concatenate(faces).astype(np.int32) if faces else np.zeros((0, 3), np.int32)
        self.line_edges = np.concatenate(edges).astype(np.int32) if edges else np.zeros((0, 2), np.int32)
        self.vertex_mu = np.concatenate(mus) if mus else np.zeros(0)
        self.span = span

    _ICO = None

    @classmethod
    def _mesh(cls, c, t, span):
        if c.kind == "plane":
            return c.surface_mesh(t, extent=max(4.0, 3 * span))
        if c.kind == "sphere":
            # a geodesic sphere: even triangles (a UV sphere's slivers at the poles make
            # poor contact primitives); 2,562 vertices, facets within 0.04% of the radius
            if cls._ICO is None:
                from tisim.geometry.generate import icosphere

                ico = icosphere(4)
                cls._ICO = (ico.vertices / np.linalg.norm(ico.vertices, axis=1, keepdims=True), ico.faces)
            V, F = cls._ICO
            return c.center(t) + c.radius * V @ c.orientation(t).T, F
        if c.kind == "cylinder":
            return c.surface_mesh(t, extent=max(4.0, 3 * span), segments=64)
        return c.surface_mesh(t)

    def positions(self, t: float, model_positions: np.ndarray) -> np.ndarray:
        """(vertex_count, 3) obstacle vertices at time t (solids from ``model_positions``)."""
        out = []
        for k, (c, ids, _) in enumerate(self.parts):
            if k in self._static:
                out.append(self._static[k])
            elif c is not None:
                out.append(self._mesh(c, t, self.span)[0])
            else:
                out.append(model_positions[ids])
        return np.concatenate(out) if out else np.zeros((0, 3))


# the stretch assumed for the curved colliders' sag allowance when there is no strain limit
NO_LIMIT_STRETCH = 1.1
# a static sphere or cylinder is analytic while the cloth's sag allowance over it is at
# most this many times the barrier's reach (thickness + dhat); beyond, it is tessellated
SAG_LIMIT = 1.0


def _largest_circumradius(x: np.ndarray, faces: np.ndarray) -> float:
    """The largest circumradius (m) of the triangles faces (m, 3) over x (n, 3)."""
    if not len(faces):
        return 0.0
    t = x[faces]
    a, b, c = (np.linalg.norm(t[:, i] - t[:, j], axis=1) for i, j in ((1, 2), (0, 2), (0, 1)))
    area2 = np.linalg.norm(np.cross(t[:, 1] - t[:, 0], t[:, 2] - t[:, 0]), axis=1)
    ok = area2 > 0  # (a degenerate triangle has no circumcircle; its edges bound it)
    rho = (a * b * c)[ok] / (2 * area2[ok])  # abc / (4 area)
    return float(max(rho.max(initial=0.0), 0.5 * max(a.max(), b.max(), c.max())))


# colliders met analytically when static (tisim.contact.ipc.analytic)
ANALYTIC_KINDS = ("plane", "sphere", "box", "cylinder")
# a capped cylinder's rim polyline keeps within this fraction of the contact thickness
# of the circle (its chords' sagitta), so the line set's guarantee loses at most 1%
RIM_SAGITTA = 0.01
RIM_MAX_SEGMENTS = 8192


def _rim_segments(radius: float, thickness: float) -> int:
    """Segments of a circle of ``radius`` whose chords' sagitta radius (1 - cos(pi / n))
    is at most RIM_SAGITTA * thickness (at least 16, at most RIM_MAX_SEGMENTS)."""
    c = 1.0 - RIM_SAGITTA * thickness / radius
    if c <= -1.0:
        return 16
    return int(min(max(math.ceil(math.pi / math.acos(max(c, -1.0))), 16), RIM_MAX_SEGMENTS))


def _line_set(c, thickness: float) -> tuple[np.ndarray, np.ndarray]:
    """(vertices (k, 3), edges (l, 2)) of a static analytic collider's edges: a box's 12
    edges, a capped cylinder's two rims; none for planes, spheres, unbounded cylinders."""
    from tisim.contact.ipc.analytic import Box, shape_of

    s = shape_of(c)
    if s.kind == "box":
        return s.corners(), Box.edges()
    if s.kind == "cylinder" and s.capped:
        m = _rim_segments(s.r, thickness)
        u = s._perp
        w = np.cross(s.a, u)
        th = 2 * np.pi * np.arange(m) / m
        ring = s.r * (np.cos(th)[:, None] * u + np.sin(th)[:, None] * w)
        V = np.concatenate([s.c + ring - s.half * s.a, s.c + ring + s.half * s.a])
        i = np.arange(m)
        E = np.concatenate([np.stack([i, (i + 1) % m], 1), m + np.stack([i, (i + 1) % m], 1)])
        return V, E
    return np.zeros((0, 3)), np.zeros((0, 2), np.int64)
