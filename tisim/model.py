"""The immutable description of what is simulated, built once from a scene.

All objects of a scene are merged into one tet mesh (vertex and element ranges
per object are kept), so solvers see a single system.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tisim.contact.colliders import Collider
from tisim.geometry import generate
from tisim.geometry.mesh import MeshError, TetMesh
from tisim.geometry.precompute import TetRest, lumped_mass, tet_rest
from tisim.geometry.topology import surface_triangles
from tisim.geometry.transforms import euler_xyz_deg, rotation_vector
from tisim.scene import MATERIALS, HandleConfig, ObjectConfig, Scene
from tisim.state import State

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class Handle:
    """Vertices that follow a prescribed rigid motion until released.

    vertices: (h,) indices into the model. rest: (h, 3) their initial positions, m.
    """

    name: str
    vertices: np.ndarray
    rest: np.ndarray
    velocity: np.ndarray
    angular_velocity: np.ndarray
    center: np.ndarray
    start: float
    stop: float
    release: float

    def active(self, t: float) -> bool:
        return t < self.release

    def targets(self, t: float) -> np.ndarray:
        """(h, 3) prescribed positions at time ``t``."""
        te = min(max(t - self.start, 0.0), max(self.stop - self.start, 0.0))
        R = rotation_vector(self.angular_velocity * te)
        return (self.rest - self.center) @ R.T + self.center + self.velocity * te

    def velocities(self, t: float) -> np.ndarray:
        """(h, 3) prescribed velocities at time ``t`` (zero outside the motion window)."""
        if not (self.start <= t < self.stop):
            return np.zeros_like(self.rest)
        x = self.targets(t)
        c = self.center + self.velocity * (t - self.start)
        return self.velocity + np.cross(self.angular_velocity, x - c)


@dataclass(frozen=True, eq=False)
class ClothPart:
    """The cloth objects of a scene, merged: vertices ``offset .. offset + vertex_count``
    of the model (after every solid's vertices).

    faces (m, 3), edges (e, 2), hinges (h, 4): int32, indices local to the cloth block
    (add ``offset`` for model indices). rest: (vertex_count, 3) rest positions, m.
    face_mu, face_lam: (m,) plane-stress Lame parameters, Pa. face_thickness: (m,) m.
    hinge_k: (h,) bending stiffness, N m. vertex_mu: (vertex_count,) friction
    coefficient (NaN: the scene's contact.mu). face_object: (m,) object index.
    meshes: per cloth object (name, local vertex slice, ClothMesh with its UVs) for export.
    """

    offset: int
    vertex_count: int
    faces: np.ndarray
    edges: np.ndarray
    hinges: np.ndarray
    rest: np.ndarray
    face_mu: np.ndarray
    face_lam: np.ndarray
    face_thickness: np.ndarray
    hinge_k: np.ndarray
    vertex_mu: np.ndarray
    face_object: np.ndarray
    mass: np.ndarray  # (vertex_count,) lumped masses, kg
    meshes: tuple = ()

    @property
    def vertex_slice(self) -> slice:
        return slice(self.offset, self.offset + self.vertex_count)


@dataclass(frozen=True, eq=False)
class Model:
    """Rest shapes, masses, elements, materials, handles and colliders.

    mesh: all objects merged (n vertices, m tets). rest: per-tet rest data.
    mass: (n,) kg. element_mu, element_lam: (m,) Lame parameters, Pa.
    element_material: (m,) index into ``tisim.scene.MATERIALS``.
    element_object / vertex_object: (m,) / (n,) object index.
    surface: (k, 3) outward boundary triangles; surface_object: (k,).
    initial_positions, initial_velocities: (n, 3).
    """

    scene: Scene
    mesh: TetMesh
    rest: TetRest
    mass: np.ndarray
    element_mu: np.ndarray
    element_lam: np.ndarray
    element_material: np.ndarray
    element_object: np.ndarray
    vertex_object: np.ndarray
    object_names: tuple[str, ...]
    object_vertex_slices: tuple[slice, ...]
    object_tet_slices: tuple[slice, ...]
    surface: np.ndarray
    surface_object: np.ndarray
    handles: tuple[Handle, ...]
    colliders: tuple[Collider, ...]
    gravity: np.ndarray
    initial_positions: np.ndarray
    initial_velocities: np.ndarray
    dt: float
    extra: dict = field(default_factory=dict)
    cloth: ClothPart | None = None

    @property
    def solid_vertex_count(self) -> int:
        """Vertices of the solids (the first ones; cloth vertices follow)."""
        return self.vertex_count - (self.cloth.vertex_count if self.cloth is not None else 0)

    @property
    def vertex_count(self) -> int:
        return self.mesh.vertex_count

    @property
    def element_count(self) -> int:
        return self.mesh.element_count

    @property
    def materials_used(self) -> set[str]:
        return {MATERIALS[i] for i in np.unique(self.element_material)}

    def material_of(self, obj: int) -> str:
        return MATERIALS[int(self.element_material[self.object_tet_slices[obj].start])]

    def initial_state(self) -> State:
        return State(self.initial_positions.copy(), self.initial_velocities.copy(), 0.0)

    def handle_targets(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        """Indices (h,) and positions (h, 3) of all vertices held by active handles at ``t``."""
        return self._stack_handles(t, Handle.targets)

    def handle_velocities(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        """Indices (h,) and prescribed velocities (h, 3) of the held vertices at ``t``."""
        return self._stack_handles(t, Handle.velocities)

    def _stack_handles(self, t: float, what) -> tuple[np.ndarray, np.ndarray]:
        active = [h for h in self.handles if h.active(t)]
        if not active:
            return np.zeros(0, dtype=np.int32), np.zeros((0, 3))
        return (
            np.concatenate([h.vertices for h in active]).astype(np.int32),
            np.concatenate([what(h, t) for h in active]),
        )

    @property
    def pinned_mask(self) -> np.ndarray:
        """(n,) bool: vertices that belong to any handle (ever)."""
        m = np.zeros(self.vertex_count, dtype=bool)
        for h in self.handles:
            m[h.vertices] = True
        return m

    def sizes(self) -> dict:
        return {
            "vertices": self.vertex_count,
            "tets": self.element_count,
            "surface_triangles": int(len(self.surface)),
            **(
                {
                    "cloth_vertices": self.cloth.vertex_count,
                    "cloth_faces": int(len(self.cloth.faces)),
                    "cloth_hinges": int(len(self.cloth.hinges)),
                }
                if self.cloth is not None
                else {}
            ),
            "objects": {
                n: {"vertices": s.stop - s.start, "tets": t.stop - t.start}
                for n, s, t in zip(self.object_names, self.object_vertex_slices, self.object_tet_slices)
            },
        }

    @classmethod
    def from_scene(cls, scene: Scene) -> Model:
        """Build the model: load or generate each object's mesh, transform it, merge.
        A ConfigError found here (a pin preset, a handle region) names the scene file."""
        from tisim.config import ConfigError

        try:
            return cls._from_scene(scene)
        except ConfigError as err:
            if err.source is None and scene.path:
                raise err.with_source(str(scene.path)) from None
            raise

    @classmethod
    def _from_scene(cls, scene: Scene) -> Model:
        verts, tets, mus, lams, mats, names, vsl, tsl = [], [], [], [], [], [], [], []
        vels, densities, handles = [], [], []
        offset = toffset = 0
        solids = {k: o for k, o in scene.objects.items() if o.kind == "solid"}
        cloths = {k: o for k, o in scene.objects.items() if o.kind == "cloth"}
        for name, oc in solids.items():
            mesh = _object_mesh(scene, name, oc)
            x = _transform(mesh.vertices, oc, scene)
            v = _initial_velocity(x, oc, mesh)
            n, m = len(x), len(mesh.tets)
            verts.append(x)
            tets.append(mesh.tets + offset)
            mu, lam = oc.lame
            mus.append(np.full(m, mu))
            lams.append(np.full(m, lam))
            mats.append(np.full(m, MATERIALS.index(oc.material), dtype=np.int32))
            densities.append(np.full(m, oc.density))
            vels.append(v)
            names.append(name)
            vsl.append(slice(offset, offset + n))
            tsl.append(slice(toffset, toffset + m))
            for hname, hc in oc.handles.items():
                handles.append(_make_handle(f"{name}.{hname}", hc, x, offset, f"objects.{name}.handles.{hname}"))
            offset += n
            toffset += m
        cloth = None
        if cloths:
            cloth, cx, cv, cmass, chandles = _cloth_part(scene, cloths, offset, len(names))
            verts.append(cx)
            vels.append(cv)
            handles += chandles
            for name in cloths:
                names.append(name)
            vsl += [slice(offset + s.start, offset + s.stop) for _, s, _ in cloth.meshes]
            tsl += [slice(toffset, toffset)] * len(cloths)
        empty = np.zeros((0,), dtype=np.float64)
        all_mesh = TetMesh(np.concatenate(verts), np.concatenate(tets) if tets else np.zeros((0, 4), np.int32))
        rest = tet_rest(all_mesh)
        density = np.concatenate(densities) if densities else empty
        mass = lumped_mass(all_mesh, density, rest.volume).astype(np.float64)
        if cloth is not None:
            mass[cloth.vertex_slice] += cmass
        element_object = np.concatenate([np.full(s.stop - s.start, i) for i, s in enumerate(tsl)])
        vertex_object = np.concatenate([np.full(s.stop - s.start, i) for i, s in enumerate(vsl)])
        surface = surface_triangles(all_mesh.tets) if len(all_mesh.tets) else np.zeros((0, 3), np.int64)
        if cloth is not None:
            surface = np.concatenate([surface, cloth.faces + cloth.offset]).astype(surface.dtype)
        src = Path(scene.path).parent if scene.path else None
        colliders = tuple(
            Collider.from_config(k, _resolved_collider(scene, k, c), src) for k, c in scene.colliders.items()
        )
        return cls(
            scene=scene,
            mesh=all_mesh,
            rest=rest,
            mass=mass,
            element_mu=np.concatenate(mus) if mus else empty,
            element_lam=np.concatenate(lams) if lams else empty,
            element_material=np.concatenate(mats) if mats else np.zeros(0, np.int32),
            element_object=element_object,
            vertex_object=vertex_object,
            object_names=tuple(names),
            object_vertex_slices=tuple(vsl),
            object_tet_slices=tuple(tsl),
            surface=surface,
            surface_object=vertex_object[surface[:, 0]],
            handles=tuple(handles),
            colliders=colliders,
            gravity=np.asarray(scene.sim.gravity, dtype=np.float64),
            initial_positions=all_mesh.vertices.copy(),
            initial_velocities=np.concatenate(vels),
            dt=scene.sim.dt,
            cloth=cloth,
        )


def _resolved_collider(scene: Scene, name: str, c):
    """A mesh collider's config with its file found as the scene's other meshes are (a
    ConfigError naming the key when it is not there); other colliders as they are."""
    if c.type != "mesh" or c.mesh is None:
        return c
    return dataclasses.replace(c, mesh=str(scene.mesh_file(c.mesh, f"colliders.{name}.mesh")))


def _object_mesh(scene: Scene, name: str, oc: ObjectConfig) -> TetMesh:
    if oc.generator == "box":
        return generate.box(oc.size, oc.resolution, tets_per_cell=oc.tets_per_cell)
    if oc.generator == "ball":
        return generate.ball(oc.radius, oc.ball_resolution)
    from tisim.geometry.io import load_tet_mesh
    from tisim.geometry.tetrahedralize import warn_slivers

    mv = None if oc.tet_max_volume is None else oc.tet_max_volume / oc.scale**3  # the file's units
    mesh = load_tet_mesh(
        str(scene.mesh_file(oc.mesh, f"objects.{name}.mesh")),
        max_volume=mv,
        quality={"minratio": oc.tet_radius_edge_ratio, "mindihedral": oc.tet_min_dihedral},
    )
    warn_slivers(mesh, f"objects.{name}.mesh")
    return mesh


def _cloth_mesh(scene: Scene, name: str, oc: ObjectConfig):
    """The cloth object's mesh as loaded or generated, remeshed when ``remesh`` asks."""
    from tisim.geometry.cloth import load_cloth_mesh
    from tisim.geometry.generate import cloth_rectangle

    if oc.generator == "cloth":
        mesh = cloth_rectangle(oc.cloth_size, oc.cloth_resolution, (0.0, 0.0, 0.0), oc.cloth_normal)
    elif oc.generator == "sphere":
        from tisim.geometry.generate import cloth_sphere

        mesh = cloth_sphere(oc.radius, oc.sphere_subdivisions)
    else:
        mesh = load_cloth_mesh(str(scene.mesh_file(oc.mesh, f"objects.{name}.mesh")))
    if oc.remesh is False:
        return mesh
    from tisim.geometry.remesh import remesh

    # remesh is in metres after the object's scale; the mesh is remeshed in its file's units
    target = None if oc.remesh is True else float(oc.remesh) / oc.scale
    try:
        return remesh(mesh, target)
    except MeshError as e:
        raise MeshError(f"objects.{name}.remesh: {e.detail}", e.path) from None


def _corner_vertices(x: np.ndarray, faces: np.ndarray, boundary: np.ndarray) -> np.ndarray:
    """The corners of a sheet: boundary vertices where the boundary turns by more than
    30 degrees (the four corners of a rectangle), the sharpest four; a sheet with fewer
    (a disc) gets the boundary vertices extreme along the diagonals of its plane."""
    from tisim.geometry.topology import boundary_edges

    be = boundary_edges(faces) if len(faces) else np.zeros((0, 2), np.int64)
    nxt = dict(zip(be[:, 0].tolist(), be[:, 1].tolist()))
    prv = dict(zip(be[:, 1].tolist(), be[:, 0].tolist()))
    turn = []
    for v in boundary.tolist():
        if v in nxt and v in prv:
            a, c = x[v] - x[prv[v]], x[nxt[v]] - x[v]
            cosang = float(a @ c) / max(float(np.linalg.norm(a) * np.linalg.norm(c)), 1e-300)
            turn.append((np.degrees(np.arccos(np.clip(cosang, -1, 1))), v))
    sharp = sorted([t for t in turn if t[0] > 30.0], reverse=True)[:4]
    if len(sharp) == 4:
        return np.array(sorted(v for _, v in sharp), dtype=np.int64)
    # in-plane axes: the two world axes most perpendicular to the mean normal
    e = x[faces]
    nrm = np.cross(e[:, 1] - e[:, 0], e[:, 2] - e[:, 0]).sum(axis=0)
    ax = np.argsort(np.abs(nrm))[:2]
    q = x[boundary][:, ax] - x[boundary][:, ax].mean(axis=0)
    idx = {int(boundary[np.argmax(q @ np.array([su, sw]))]) for su in (-1, 1) for sw in (-1, 1)}
    return np.array(sorted(idx), dtype=np.int64)


def _border_vertices(x: np.ndarray, mesh) -> np.ndarray:
    """The sheet's border vertices (all of them for a closed surface)."""
    from tisim.geometry.topology import boundary_edges

    b = np.unique(boundary_edges(mesh.faces)) if len(mesh.faces) else np.arange(len(x))
    return b if b.size else np.arange(len(x))


def _pin_vertices(x: np.ndarray, mesh, pin: str, b: np.ndarray) -> np.ndarray:
    """Local indices of the vertices a ``pin`` preset selects on a transformed cloth
    (b: its border vertices)."""
    tol = 1e-6 * max(float(np.ptp(x, axis=0).max()), 1e-9)
    if pin == "corners":
        return _corner_vertices(x, mesh.faces, b)
    axis = {"top-edge": 1, "x-min": 0, "x-max": 0, "z-min": 2, "z-max": 2}[pin]
    vals = x[b, axis]
    target = vals.min() if pin.endswith("min") else vals.max()
    # border vertices at the extreme (all vertices of a closed surface; the whole border
    # of a sheet lying flat across the axis, which the caller refuses)
    band = b[np.abs(vals - target) <= tol + 1e-9]
    if band.size == b.size:
        return band
    # the side of the sheet facing that way: on a sheet turned a few degrees, a disc or a
    # scanned mesh the extreme is one vertex, which a cloth cannot hang from
    direction = np.zeros(3)
    direction[axis] = -1.0 if pin.endswith("min") else 1.0
    side = _side_vertices(x, mesh.faces, direction)
    return side if side.size > band.size else band


def _side_vertices(x: np.ndarray, faces: np.ndarray, direction: np.ndarray) -> np.ndarray:
    """The border vertices on the side of a sheet that faces ``direction`` (a unit
    vector): the ends of the border edges whose outward normal (in the sheet, pointing
    away from it) is within 45 degrees of it. On a rectangle turned less than 45 degrees
    from a side across ``direction``: that side, its two corners included."""
    from tisim.geometry.topology import boundary_edges

    faces = np.asarray(faces, dtype=np.int64)
    be = boundary_edges(faces) if len(faces) else np.zeros((0, 2), np.int64)
    if not len(be):
        return np.zeros(0, np.int64)
    # each face edge (a, b) with the face's third vertex c; a border edge has one face
    tri = faces[:, [0, 1, 2, 1, 2, 0, 2, 0, 1]].reshape(-1, 3)
    n = len(x)
    codes = tri[:, :2].min(axis=1) * n + tri[:, :2].max(axis=1)
    order = np.argsort(codes, kind="stable")
    bcodes = be.min(axis=1) * n + be.max(axis=1)
    third = tri[order[np.searchsorted(codes[order], bcodes)], 2]
    xa, xb, xc = x[be[:, 0]], x[be[:, 1]], x[third]
    e = xb - xa
    m = 0.5 * (xa + xb) - xc
    out = m - ((m * e).sum(axis=1) / np.maximum((e * e).sum(axis=1), 1e-300))[:, None] * e
    out /= np.maximum(np.linalg.norm(out, axis=1), 1e-300)[:, None]
    facing = out @ direction >= np.cos(np.pi / 4) - 1e-6
    return np.unique(be[facing])


def cloth_handles(name: str, oc: ObjectConfig, x: np.ndarray, mesh, offset: int) -> list[Handle]:
    """The handles of a cloth object placed at ``x`` (its ``handles`` regions and its
    ``pin`` preset), with vertex indices shifted by ``offset``."""
    from tisim.config import ConfigError

    out = []
    key = f"objects.{name}"
    for hname, hc in oc.handles.items():
        out.append(_make_handle(f"{name}.{hname}", hc, x, offset, f"{key}.handles.{hname}"))
    if oc.pin is not None:
        b = _border_vertices(x, mesh)
        idx = _pin_vertices(x, mesh, oc.pin, b)
        if idx.size == 0:
            raise ConfigError(f"{key}.pin", f"{oc.pin!r} selects no vertex")
        border = b.size
        if oc.pin != "corners" and idx.size == border and border > 4:
            axis = {"top-edge": "y", "x-min": "x", "x-max": "x", "z-min": "z", "z-max": "z"}[oc.pin]
            raise ConfigError(
                f"{key}.pin",
                f"{oc.pin!r} selects the whole border ({border} vertices): the cloth "
                f"lies flat across {axis}; expected 'corners' or a side along an axis "
                "the cloth spans (x-min, x-max, z-min, z-max; top-edge for a hanging one)",
            )
        out.append(
            Handle(
                name=f"{name}.pin",
                vertices=(idx + offset).astype(np.int32),
                rest=x[idx].copy(),
                velocity=np.zeros(3),
                angular_velocity=np.zeros(3),
                center=x[idx].mean(axis=0),
                start=0.0,
                stop=0.0,
                release=math.inf,
            )
        )
    return out


def _cloth_part(scene: Scene, cloths: dict, offset: int, first_object: int):
    """Merge the cloth objects: (ClothPart, positions, velocities, masses, handles)."""
    xs, vs, faces, hinges, edges, metas = [], [], [], [], [], []
    fmu, flam, fthk, hk, vmu, fobj, masses, handles = [], [], [], [], [], [], [], []
    base = 0
    for k, (name, oc) in enumerate(cloths.items()):
        mesh = _cloth_mesh(scene, name, oc)
        x = _transform(mesh.vertices, oc, scene)
        v = _initial_velocity(x, oc, mesh)
        n, m = len(x), len(mesh.faces)
        e = x[mesh.faces]
        area = 0.5 * np.linalg.norm(np.cross(e[:, 1] - e[:, 0], e[:, 2] - e[:, 0]), axis=1)
        mu, lam = oc.lame_plane_stress
        h = mesh.hinges
        xs.append(x)
        vs.append(v)
        faces.append(mesh.faces + base)
        edges.append(mesh.edges + base)
        hinges.append(h + base)
        fmu.append(np.full(m, mu))
        flam.append(np.full(m, lam))
        fthk.append(np.full(m, oc.thickness))
        hk.append(np.full(len(h), oc.plate_bending_stiffness))
        vmu.append(np.full(n, np.nan if oc.friction is None else oc.friction))
        fobj.append(np.full(m, first_object + k))
        masses.append(
            np.bincount(mesh.faces.ravel(), weights=np.repeat(oc.density * oc.thickness * area / 3, 3), minlength=n)
        )
        metas.append((name, slice(base, base + n), mesh))
        handles += cloth_handles(name, oc, x, mesh, offset + base)
        base += n
    x = np.concatenate(xs)
    part = ClothPart(
        offset=offset,
        vertex_count=len(x),
        faces=np.concatenate(faces).astype(np.int32),
        edges=np.concatenate(edges).astype(np.int32),
        hinges=np.concatenate(hinges).astype(np.int32).reshape(-1, 4),
        rest=x.copy(),
        face_mu=np.concatenate(fmu),
        face_lam=np.concatenate(flam),
        face_thickness=np.concatenate(fthk),
        hinge_k=np.concatenate(hk),
        vertex_mu=np.concatenate(vmu),
        face_object=np.concatenate(fobj),
        mass=np.concatenate(masses),
        meshes=tuple(metas),
    )
    return part, x, np.concatenate(vs), part.mass, handles


def _transform(x: np.ndarray, oc: ObjectConfig, scene: Scene) -> np.ndarray:
    R = euler_xyz_deg(oc.rotation)
    y = (x * oc.scale) @ R.T + np.asarray(oc.translation)
    if oc.frame is not None:  # relative to a collider's initial pose
        c = scene.colliders[oc.frame]
        y = y @ euler_xyz_deg(c.rotation).T + np.asarray(c.position)
    return y


def _initial_velocity(x: np.ndarray, oc: ObjectConfig, mesh: TetMesh) -> np.ndarray:
    w = np.asarray(oc.angular_velocity, dtype=np.float64)
    v = np.broadcast_to(np.asarray(oc.velocity, dtype=np.float64), x.shape).copy()
    if np.any(w):
        c = x.mean(axis=0) if len(x) else np.zeros(3)
        v += np.cross(w, x - c)
    return v


def _make_handle(name: str, hc: HandleConfig, x: np.ndarray, offset: int, key: str) -> Handle:
    from tisim.config import ConfigError

    if hc.vertices:
        idx = np.asarray(hc.vertices, dtype=np.int64)
        if idx.min() < 0 or idx.max() >= len(x):
            raise ConfigError(f"{key}.vertices", f"expected indices in 0..{len(x) - 1}")
    else:
        lo, hi = np.asarray(hc.region_min), np.asarray(hc.region_max)
        idx = np.flatnonzero(np.all((x >= lo) & (x <= hi), axis=1))
        if idx.size == 0:
            raise ConfigError(key, f"region_min {list(lo)} .. region_max {list(hi)} selects no vertex of the object")
    rest = x[idx]
    center = rest.mean(axis=0) if hc.center is None else np.asarray(hc.center, dtype=np.float64)
    return Handle(
        name=name,
        vertices=(idx + offset).astype(np.int32),
        rest=rest.copy(),
        velocity=np.asarray(hc.velocity, dtype=np.float64),
        angular_velocity=np.asarray(hc.angular_velocity, dtype=np.float64),
        center=center,
        start=hc.start,
        stop=hc.stop,
        release=hc.release,
    )
