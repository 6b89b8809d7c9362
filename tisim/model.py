"""The immutable description of what is simulated, built once from a scene.

All objects of a scene are merged into one tet mesh (vertex and element ranges
per object are kept), so solvers see a single system.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

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
            "objects": {n: {"vertices": s.stop - s.start, "tets": t.stop - t.start}
                        for n, s, t in zip(self.object_names, self.object_vertex_slices, self.object_tet_slices)},
        }

    @classmethod
    def from_scene(cls, scene: Scene) -> Model:
        """Build the model: load or generate each object's mesh, transform it, merge."""
        verts, tets, mus, lams, mats, names, vsl, tsl = [], [], [], [], [], [], [], []
        vels, densities, handles = [], [], []
        offset = toffset = 0
        for name, oc in scene.objects.items():
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
        all_mesh = TetMesh(np.concatenate(verts), np.concatenate(tets))
        rest = tet_rest(all_mesh)
        density = np.concatenate(densities)
        mass = lumped_mass(all_mesh, density, rest.volume)
        element_object = np.concatenate([np.full(s.stop - s.start, i) for i, s in enumerate(tsl)])
        vertex_object = np.concatenate([np.full(s.stop - s.start, i) for i, s in enumerate(vsl)])
        surface = surface_triangles(all_mesh.tets)
        colliders = tuple(Collider.from_config(k, c) for k, c in scene.colliders.items())
        return cls(
            scene=scene,
            mesh=all_mesh,
            rest=rest,
            mass=mass,
            element_mu=np.concatenate(mus),
            element_lam=np.concatenate(lams),
            element_material=np.concatenate(mats),
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
        )


def _object_mesh(scene: Scene, name: str, oc: ObjectConfig) -> TetMesh:
    if oc.generator == "box":
        return generate.box(oc.size, oc.resolution, tets_per_cell=oc.tets_per_cell)
    if oc.generator == "ball":
        return generate.ball(oc.radius, oc.ball_resolution)
    from tisim.geometry.io import load_tet_mesh

    path = scene.resolve_path(oc.mesh)
    return load_tet_mesh(str(path))


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
