"""Start-up checks: no solid object starts inside a collider or inside another object.

A solver given an initial overlap pushes the vertices out in its first step with
whatever force that takes, and a deep overlap then "diverges at frame 1" with no
hint why. :func:`check_initial_overlaps` runs between the model and the solver:

- object vs collider: the collider's signed distance at ``t = 0`` at every vertex
  of the object (``Collider.signed_distance``; negative inside);
- object vs object: which vertices of one lie inside the other's tet mesh
  (barycentric coordinates in the nearest tets), and how far they are from its
  surface (exact point-triangle distance to the nearest surface triangles).

An overlap deeper than ``SHALLOW_FRACTION`` of the object's size (the smallest
side of its bounding box) is a user error: one line naming the two, the depth
and a translation that clears it (:class:`~tisim.config.ConfigError`, exit code 2).
A shallow one is pushed out with a warning: the object is translated by that
translation, or, where no translation clears it (squeezed between two colliders),
the vertices inside a collider are moved onto its surface (the object starts
pre-compressed there, as a grip would leave it).

Cloth objects are left to the cloth solver's own start check (it needs a
strictly feasible start, within the contact thickness). Mesh colliders (cloth
solver only) have no signed distance here and are skipped.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from tisim.config import ConfigError

log = logging.getLogger(__name__)

SHALLOW_FRACTION = 0.05  # of the object's smallest bounding-box side: deeper is an error
TOUCH_TOLERANCE = 1e-6  # of the object's bounding-box diagonal: resting on a surface is not an overlap
_MAX_ITERATIONS = 64


@dataclasses.dataclass
class Overlap:
    """The deepest overlap of an object with one other thing.

    other: "collider 'NAME'" or "object 'NAME'". depth: m. push: (3,) unit direction
    that moves the object out at its deepest point.
    """

    other: str
    depth: float
    push: np.ndarray


def check_initial_overlaps(model):
    """Check the model's initial positions; return the model (a new one if a shallow
    overlap was pushed out). Raises ConfigError for a deep overlap."""
    solids = [i for i, n in enumerate(model.object_names) if model.scene.objects[n].kind == "solid"]
    if not solids:
        return model
    x = np.array(model.initial_positions, dtype=np.float64, copy=True)
    colliders = [c for c in model.colliders if c.kind != "mesh"]
    changed = False
    shifts: dict[int, np.ndarray] = {}
    for k, i in enumerate(solids):
        sl = model.object_vertex_slices[i]
        name = model.object_names[i]
        xi = x[sl]
        if len(xi) == 0:
            continue
        ext = np.ptp(xi, axis=0)
        size = float(ext.min()) if float(ext.min()) > 0 else float(ext.max())
        tol = TOUCH_TOLERANCE * float(np.linalg.norm(ext)) + 1e-12
        lo, hi = xi.min(axis=0) - tol, xi.max(axis=0) + tol
        fixed = [
            _Body.of(model, x, j, model.object_names[j])
            for j in solids[:k]
            if _boxes_meet(x[model.object_vertex_slices[j]], lo, hi)
        ]
        cells = _local_cells(model, i)
        found = _overlaps(xi, cells, colliders, fixed, tol)
        if not found:
            continue
        worst = max(found, key=lambda o: o.depth)
        shift = _clearing_translation(xi, cells, colliders, fixed, tol, worst.depth)
        deep = worst.depth > SHALLOW_FRACTION * size
        where = _describe(found)
        if not deep and shift is not None:
            x[sl] = xi + shift
            shifts[i] = shift
            changed = True
            log.warning(
                f"objects.{name} starts {where}: pushed out by {_vec(shift)} m "
                f"(shallow: under {SHALLOW_FRACTION:.0%} of its size)"
            )
            continue
        if not deep and not any(o.other.startswith("object") for o in found):
            pressed = _project_out(xi, colliders, tol)
            if _volumes_positive(pressed, cells[0]):
                x[sl] = pressed
                changed = True
                log.warning(
                    f"objects.{name} starts {where}, squeezed from opposite sides (no translation "
                    "clears it): its vertices inside are moved onto the colliders' surfaces"
                )
                continue
        raise ConfigError(f"objects.{name}", _deep_message(model, name, where, worst, size, shift), model.scene.path)
    if not changed:
        return model
    return _with_positions(model, x, shifts)


# --------------------------------------------------------------------------- overlaps
class _Body:
    """A tet mesh placed at x (n, 3) for point queries: which points lie inside it and
    how deep. tets (m, 4) and tri (k, 3) (its surface) index x."""

    def __init__(self, x: np.ndarray, tets: np.ndarray, tri: np.ndarray, name: str = ""):
        from scipy.spatial import cKDTree

        self.name, self.x, self.tets, self.tri = name, x, tets, tri
        self.lo, self.hi = x.min(axis=0), x.max(axis=0)
        self.tet_tree = cKDTree(x[tets].mean(axis=1))
        self.tri_tree = cKDTree(x[tri].mean(axis=1))
        self.tol = TOUCH_TOLERANCE * float(np.linalg.norm(self.hi - self.lo)) + 1e-12

    @classmethod
    def of(cls, model, x: np.ndarray, i: int, name: str = "") -> _Body:
        sl = model.object_vertex_slices[i]
        return cls(x[sl].copy(), *_local_cells(model, i), name=name)

    def depth_inside(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For points p (k, 3): depth (k,) inside this body (0 outside) and the unit
        direction (k, 3) from each point to the nearest surface point (out of the body)."""
        depth = np.zeros(len(p))
        out = np.zeros((len(p), 3))
        cand = np.flatnonzero(np.all((p >= self.lo - self.tol) & (p <= self.hi + self.tol), axis=1))
        if cand.size == 0:
            return depth, out
        inside = cand[points_in_tets(p[cand], self.x, self.tets, self.tet_tree)]
        if inside.size == 0:
            return depth, out
        d, closest = _distance_to_surface(p[inside], self.x, self.tri, self.tri_tree)
        depth[inside] = d
        dirs = closest - p[inside]
        out[inside] = dirs / np.maximum(np.linalg.norm(dirs, axis=1), 1e-300)[:, None]
        return depth, out


def _boxes_meet(y: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> bool:
    return len(y) > 0 and not (np.any(y.min(axis=0) > hi) or np.any(y.max(axis=0) < lo))


def _local_cells(model, i: int) -> tuple[np.ndarray, np.ndarray]:
    """Object i's tets and surface triangles, indexing its own vertices."""
    start = model.object_vertex_slices[i].start
    return (model.mesh.tets[model.object_tet_slices[i]] - start, model.surface[model.surface_object == i] - start)


def _overlaps(xi: np.ndarray, cells, colliders, fixed: list[_Body], tol: float) -> list[Overlap]:
    """Every collider and placed object that the object at ``xi`` (with ``cells``: its
    tets and surface) starts inside, with the deepest point of each."""
    found = []
    for c in colliders:
        sd, n = c.signed_distance(xi, 0.0)
        j = int(np.argmin(sd))
        if -sd[j] > tol:
            found.append(Overlap(f"collider {c.name!r}", float(-sd[j]), n[j].copy()))
    me = None
    for b in fixed:
        lo, hi = xi.min(axis=0), xi.max(axis=0)
        if np.any(lo > b.hi + tol) or np.any(hi < b.lo - tol):
            continue
        best = None
        d, u = b.depth_inside(xi)  # its vertices inside b
        j = int(np.argmax(d))
        if d[j] > tol:
            best = Overlap(f"object {b.name!r}", float(d[j]), u[j])
        me = me or _Body(xi, *cells)
        d, u = me.depth_inside(b.x)  # b's vertices inside it (a small body inside a big one)
        j = int(np.argmax(d))
        if d[j] > tol and (best is None or d[j] > best.depth):
            best = Overlap(f"object {b.name!r}", float(d[j]), -u[j])
        if best is not None:
            found.append(best)
    return found


def _clearing_translation(xi, cells, colliders, fixed, tol, depth0) -> np.ndarray | None:
    """A translation that moves ``xi`` out of every collider and placed object, or None
    where the pushes cancel (squeezed between opposite sides). Each round adds every
    overlap's deepest push; a small margin keeps it from ending exactly on a surface."""
    total = np.zeros(3)
    margin = 1e-4 * max(depth0, tol)
    for _ in range(_MAX_ITERATIONS):
        found = _overlaps(xi + total, cells, colliders, fixed, tol)
        if not found:
            return total
        step = sum(o.depth * o.push for o in found)
        if np.linalg.norm(step) < 0.25 * max(o.depth for o in found):
            return None
        total = total + step + margin * step / np.linalg.norm(step)
    return None


def _project_out(xi: np.ndarray, colliders, tol: float) -> np.ndarray:
    """The vertices inside any collider moved onto its surface (along its normal)."""
    y = xi.copy()
    for c in colliders:
        sd, n = c.signed_distance(y, 0.0)
        inside = sd < -tol
        y[inside] -= sd[inside, None] * n[inside]
    return y


def _volumes_positive(xi: np.ndarray, tets: np.ndarray) -> bool:
    from tisim.geometry.mesh import tet_signed_volumes

    return bool(np.all(tet_signed_volumes(xi, tets) > 0))


# --------------------------------------------------------------------------- geometry
def points_in_tets(
    p: np.ndarray, x: np.ndarray, tets: np.ndarray, tree=None, k: int = 16, eps: float = 1e-9
) -> np.ndarray:
    """(k,) bool: whether each point p (k, 3) lies inside the tet mesh (x (n, 3), tets (m, 4)).

    Barycentric coordinates in the ``k`` tets with the nearest centroids: exact for
    meshes whose tets are not much longer than wide (generated or TetGen meshes).
    """
    from scipy.spatial import cKDTree

    if len(tets) == 0 or len(p) == 0:
        return np.zeros(len(p), dtype=bool)
    tree = tree if tree is not None else cKDTree(x[tets].mean(axis=1))
    kk = min(k, len(tets))
    _, idx = tree.query(p, k=kk)
    idx = np.asarray(idx).reshape(len(p), kk)
    T = x[tets[idx]]  # (p, k, 4, 3)
    e1, e2, e3 = (T[:, :, m, :] - T[:, :, 0, :] for m in (1, 2, 3))
    r = p[:, None, :] - T[:, :, 0, :]
    # Cramer's rule (batched LAPACK solves of 3x3 systems are ~50x slower)
    n23 = np.cross(e2, e3)
    det = _dot(e1, n23)
    ok = np.abs(det) > 1e-300
    det = np.where(ok, det, 1.0)
    lam = np.stack([_dot(r, n23), _dot(e1, np.cross(r, e3)), _dot(e1, np.cross(e2, r))], axis=-1) / det[..., None]
    inside = ok & np.all(lam >= -eps, axis=-1) & (lam.sum(axis=-1) <= 1 + eps)
    return inside.any(axis=1)


def _distance_to_surface(p, x, tri, tree, k: int = 16):
    """Distance (k,) from points p to the nearest of the ``k`` triangles with the
    nearest centroids, and the closest points (k, 3)."""
    kk = min(k, len(tri))
    _, idx = tree.query(p, k=kk)
    idx = np.asarray(idx).reshape(len(p), kk)
    a, b, c = (x[tri[idx][..., m]] for m in range(3))
    q = closest_point_on_triangle(np.broadcast_to(p[:, None, :], a.shape), a, b, c)
    d = np.linalg.norm(q - p[:, None, :], axis=-1)
    j = np.argmin(d, axis=1)
    r = np.arange(len(p))
    return d[r, j], q[r, j]


def closest_point_on_triangle(p, a, b, c):
    """Closest points (..., 3) on triangles (a, b, c) to points p, all (..., 3)
    (Ericson, Real-Time Collision Detection, 5.1.5), vectorised."""
    ab, ac, ap = b - a, c - a, p - a
    d1, d2 = _dot(ab, ap), _dot(ac, ap)
    bp = p - b
    d3, d4 = _dot(ab, bp), _dot(ac, bp)
    cp = p - c
    d5, d6 = _dot(ab, cp), _dot(ac, cp)
    va = d3 * d6 - d5 * d4
    vb = d5 * d2 - d1 * d6
    vc = d1 * d4 - d3 * d2
    denom = va + vb + vc
    denom = np.where(np.abs(denom) > 1e-300, denom, 1e-300)
    v = vb / denom
    w = vc / denom
    out = a + ab * v[..., None] + ac * w[..., None]  # inside the face
    # edges, then vertices (later assignments win, matching the region tests' order)
    with np.errstate(divide="ignore", invalid="ignore"):
        t_ab = d1 / (d1 - d3)
        t_ac = d2 / (d2 - d6)
        t_bc = (d4 - d3) / ((d4 - d3) + (d5 - d6))
    m = (vc <= 0) & (d1 >= 0) & (d3 <= 0)
    out = np.where(m[..., None], a + ab * np.nan_to_num(t_ab)[..., None], out)
    m = (vb <= 0) & (d2 >= 0) & (d6 <= 0)
    out = np.where(m[..., None], a + ac * np.nan_to_num(t_ac)[..., None], out)
    m = (va <= 0) & ((d4 - d3) >= 0) & ((d5 - d6) >= 0)
    out = np.where(m[..., None], b + (c - b) * np.nan_to_num(t_bc)[..., None], out)
    out = np.where(((d1 <= 0) & (d2 <= 0))[..., None], a, out)
    out = np.where(((d3 >= 0) & (d4 <= d3))[..., None], b, out)
    out = np.where(((d6 >= 0) & (d5 <= d6))[..., None], c, out)
    return out


def _dot(u, v):
    return np.einsum("...i,...i->...", u, v)


# --------------------------------------------------------------------------- messages
def _vec(v) -> str:
    return "[" + ", ".join(f"{c:.4g}" if abs(c) > 1e-12 else "0" for c in v) + "]"


def _describe(found: list[Overlap]) -> str:
    parts = [f"{o.depth:.3g} m inside {o.other}" for o in sorted(found, key=lambda o: -o.depth)]
    return " and ".join(parts)


def _deep_message(model, name: str, where: str, worst: Overlap, size: float, shift) -> str:
    oc = model.scene.objects[name]
    head = f"starts {where} ({worst.depth / size:.0%} of its smallest side, {size:.3g} m)"
    if shift is None:
        return (
            head + ": no translation clears it (squeezed between opposite sides); "
            f"move the colliders apart or make it smaller (objects.{name}.scale)"
        )
    local = np.asarray(shift)
    if oc.frame is not None:  # translation is in the collider's frame
        from tisim.geometry.transforms import euler_xyz_deg

        local = euler_xyz_deg(model.scene.colliders[oc.frame].rotation).T @ local
    new = np.asarray(oc.translation) + local
    return (
        head + f": translate it by {_vec(shift)} m, e.g. --set objects.{name}.translation={_vec(new).replace(' ', '')}"
    )


# --------------------------------------------------------------------------- the new model
def _with_positions(model, x: np.ndarray, shifts: dict[int, np.ndarray]):
    """The model with initial positions ``x``; handles of translated objects move along
    (their rest positions and centres), handles of pressed ones hold the new positions."""
    from tisim.geometry.mesh import TetMesh

    owner = model.vertex_object
    handles = []
    for h in model.handles:
        obj = int(owner[h.vertices[0]]) if len(h.vertices) else -1
        if obj in shifts:
            h = dataclasses.replace(h, rest=h.rest + shifts[obj], center=h.center + shifts[obj])
        else:
            h = dataclasses.replace(h, rest=x[h.vertices].copy())
        handles.append(h)
    mesh = model.mesh
    if shifts:  # a rigid shift keeps the rest shape; the mesh shows where objects are
        v = mesh.vertices.copy()
        for i, s in shifts.items():
            v[model.object_vertex_slices[i]] += s
        mesh = TetMesh(v, mesh.tets)
    return dataclasses.replace(model, initial_positions=x, handles=tuple(handles), mesh=mesh)
