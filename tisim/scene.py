"""Scene files: TOML mapped one to one onto frozen config dataclasses.

A scene has the sections ``[scene]``, ``[sim]``, ``[solver]``, ``[contact]``,
``[objects.NAME]`` (with ``[objects.NAME.handles.GROUP]``), ``[colliders.NAME]``,
``[camera]`` and ``[render]``. Every value has a dotted path, and any value can
be overridden with ``--set path=value`` (the value parsed as TOML).
``--set objects.NAME.mesh=FILE`` replaces the object's generator (and
``...generator=KIND`` its mesh): the last source set wins.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tisim.config import ConfigError, Int3, Vec3, from_dict, num, to_dict

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

log = logging.getLogger(__name__)

INF = math.inf
MATERIALS = ("arap", "corotated", "neo-hookean", "symmetric-dirichlet", "symmetric-gradient")
Material = Literal["arap", "corotated", "neo-hookean", "symmetric-dirichlet", "symmetric-gradient"]


@dataclass(frozen=True, kw_only=True)
class SceneInfo:
    name: str = ""
    description: str = ""
    # what a viewer should watch for (``tisim demo NAME --about``, docs/teaching.md)
    look_for: str = ""

    def __post_init__(self):
        # the name makes file and folder names (out/NAME/, NAME.mp4): a path in it wrote
        # outside the output folder ('../x') or broke the video's path ('a/b')
        n = self.name
        if n and (any(c in n for c in "/\\") or n.strip(".") == "" or n != n.strip() or any(ord(c) < 32 for c in n)):
            raise ConfigError(
                "name",
                "expected a name without '/', '\\', control characters or "
                f"leading/trailing spaces, and not '.' or '..', got {n!r}",
            )


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    """Time stepping. Units: seconds, metres."""

    dt: float = num(0.01, gt=0, le=1.0, doc="time step, s")
    frames: int = num(100, ge=1, doc="frames to simulate")
    substeps: int = num(1, ge=1, doc="solver steps per output frame")
    gravity: Vec3 = (0.0, -9.81, 0.0)
    damping: float = num(0.0, ge=0, doc="mass-proportional (Rayleigh-like) damping, 1/s")
    # what the runner does when a step diverges beyond NaN (infinite energy, an inverted
    # element, a run of non-converged steps): "stop" (exit code 3) or "continue" (logged, in run.json)
    on_divergence: Literal["stop", "continue"] = "stop"


@dataclass(frozen=True, kw_only=True)
class HandleConfig:
    """A group of vertices that follow a prescribed motion (pinned when it has none).

    Vertices are selected by an axis-aligned box in world coordinates (after the
    object's transform), or listed by index. The group's rest positions are
    translated by ``velocity * t`` and rotated by ``angular_velocity * t`` about
    ``center`` (default: the group's centroid); the motion runs from ``start`` to
    ``stop`` seconds and the group is let go at ``release`` seconds.
    """

    region_min: Vec3 | None = None
    region_max: Vec3 | None = None
    vertices: tuple[int, ...] = ()
    velocity: Vec3 = (0.0, 0.0, 0.0)
    angular_velocity: Vec3 = (0.0, 0.0, 0.0)
    center: Vec3 | None = None
    start: float = num(0.0, ge=0)
    stop: float = num(INF, ge=0)
    release: float = num(INF, ge=0)

    def __post_init__(self):
        if not self.vertices and (self.region_min is None or self.region_max is None):
            raise ConfigError("", "a handle needs region_min and region_max, or vertices")


@dataclass(frozen=True, kw_only=True)
class ObjectConfig:
    """A soft body (``kind = "solid"``, tets) or a cloth / shell (``kind = "cloth"``,
    triangles): a mesh file or a generator, a material and an initial state.

    Cloth keys: ``generator = "cloth"`` makes a ``cloth_size`` (m) rectangle with
    ``cloth_resolution`` cells facing ``cloth_normal``; ``thickness`` (m) and ``density``
    (kg/m^3) give the areal density; ``bending_stiffness`` (N m) overrides the plate
    value E t^3 / (24 (1 - nu^2)); ``pin`` pins "corners", "top-edge" (the border
    vertices of largest y) or the border at the smallest/largest x or z (a preset that
    selects the whole border, a sheet lying flat across that axis, is refused); ``friction`` overrides
    ``contact.mu`` for this object; ``remesh`` (true, or a target edge length in m) remeshes the
    cloth's mesh isotropically at load, keeping its border and UVs (handles by vertex index refused). ``generator = "sphere"`` makes a closed spherical
    shell of ``radius`` (an icosphere of ``sphere_subdivisions``).
    """

    kind: Literal["solid", "cloth"] = "solid"
    mesh: str | None = None
    generator: Literal["box", "ball", "cloth", "sphere"] | None = None
    size: Vec3 = (1.0, 1.0, 1.0)
    resolution: Int3 = (4, 4, 4)
    tets_per_cell: Literal[5, 6] = 5
    radius: float = num(0.5, gt=0)
    ball_resolution: float = num(8.0, ge=2, doc="lattice cells across the ball's diameter (17.65 -> ~7k vertices)")
    material: Material = "neo-hookean"
    youngs_modulus: float = num(1e5, gt=0, doc="Pa")
    poisson_ratio: float = num(0.3, ge=0, lt=0.5)
    density: float = num(1000.0, gt=0, doc="kg/m^3")
    translation: Vec3 = (0.0, 0.0, 0.0)
    rotation: Vec3 = (0.0, 0.0, 0.0)  # XYZ Euler angles, degrees
    scale: float = num(1.0, gt=0)
    # Name of a collider: translation and rotation are then relative to that
    # collider's pose at t = 0, so tilting an incline carries the box on it along.
    frame: str | None = None
    velocity: Vec3 = (0.0, 0.0, 0.0)
    angular_velocity: Vec3 = (0.0, 0.0, 0.0)  # rad/s about the centre of mass
    # a closed surface given as ``mesh`` is filled by TetGen with these quality switches
    tet_radius_edge_ratio: float = num(1.5, ge=1.1, doc="TetGen's radius-edge ratio bound (-q), for a surface mesh")
    tet_min_dihedral: float = num(10.0, ge=0, le=18, doc="TetGen's minimum dihedral angle bound, degrees")
    tet_max_volume: float | None = num(None, gt=0, doc="TetGen's tet volume bound (-a), m^3 after scale")
    handles: dict[str, HandleConfig] = field(default_factory=dict)
    # cloth
    cloth_size: tuple[float, float] = (1.0, 1.0)
    cloth_resolution: tuple[int, int] = (20, 20)
    cloth_normal: Literal["x", "y", "z"] = "y"
    sphere_subdivisions: int = num(1, ge=0, le=5, doc="generator 'sphere': icosphere subdivisions (10*4^s+2 vertices)")
    thickness: float = num(1e-3, gt=0, doc="shell thickness, m (mass and bending)")
    bending_stiffness: float | None = None
    pin: Literal["corners", "top-edge", "x-min", "x-max", "z-min", "z-max"] | None = None
    friction: float | None = None
    # a cloth's mesh remeshed isotropically at load (tisim.geometry.remesh): true for its
    # mean edge length, or a target edge length in metres
    remesh: bool | float = num(False, gt=0, doc="cloth: remesh the mesh at load (true, or a target edge length, m)")

    def __post_init__(self):
        if (self.mesh is None) == (self.generator is None):
            raise ConfigError("", "an object needs exactly one of 'mesh' (a file) or 'generator'")
        if self.kind == "cloth" and self.generator not in (None, "cloth", "sphere"):
            raise ConfigError(
                "generator", f"a cloth object takes generator = 'cloth', 'sphere' or a mesh, got {self.generator!r}"
            )
        if self.kind == "solid" and self.generator == "sphere":
            raise ConfigError("kind", "generator = 'sphere' (a closed shell) needs kind = 'cloth'")
        if self.kind == "solid" and self.generator == "cloth":
            raise ConfigError("kind", "generator = 'cloth' needs kind = 'cloth'")
        if any(r < 1 for r in self.cloth_resolution):
            raise ConfigError("cloth_resolution", f"expected two integers >= 1, got {list(self.cloth_resolution)}")
        if any(s <= 0 for s in self.cloth_size):
            raise ConfigError("cloth_size", f"expected two numbers > 0, got {list(self.cloth_size)}")
        for k in ("bending_stiffness", "friction"):
            v = getattr(self, k)
            if v is not None and v < 0:
                raise ConfigError(k, f"expected a number >= 0, got {v}")
        if self.remesh is not False:
            if self.kind != "cloth":
                raise ConfigError("remesh", "remeshing applies to cloth objects (kind = 'cloth') only")
            by_index = [k for k, hc in self.handles.items() if hc.vertices]
            if by_index:
                raise ConfigError(
                    "remesh",
                    f"handles.{by_index[0]} picks vertices by index, which a remesh "
                    "renumbers: select them with region_min/region_max, or set remesh = false",
                )
        if any(r < 1 for r in self.resolution):
            raise ConfigError("resolution", f"expected three integers >= 1, got {list(self.resolution)}")
        if any(s <= 0 for s in self.size):
            raise ConfigError("size", f"expected three numbers > 0, got {list(self.size)}")

    @property
    def lame(self) -> tuple[float, float]:
        """(mu, lambda) Lame parameters in Pa."""
        E, nu = self.youngs_modulus, self.poisson_ratio
        return E / (2 * (1 + nu)), E * nu / ((1 + nu) * (1 - 2 * nu))

    @property
    def lame_plane_stress(self) -> tuple[float, float]:
        """(mu, lambda_2D) for a shell membrane in plane stress, Pa."""
        E, nu = self.youngs_modulus, self.poisson_ratio
        return E / (2 * (1 + nu)), E * nu / (1 - nu * nu)

    @property
    def plate_bending_stiffness(self) -> float:
        """k = E t^3 / (24 (1 - nu^2)) in N m, or the user's ``bending_stiffness``."""
        if self.bending_stiffness is not None:
            return self.bending_stiffness
        E, nu, t = self.youngs_modulus, self.poisson_ratio, self.thickness
        return E * t**3 / (24 * (1 - nu * nu))


@dataclass(frozen=True, kw_only=True)
class ColliderConfig:
    """An obstacle: plane, sphere, box or cylinder (roller), or a triangle mesh
    (``type = "mesh"``, only for the cloth solver; ``mesh`` names the file, placed by
    ``scale``, ``rotation`` and ``position``).

    ``position``: a point of the plane / the centre. ``normal``: plane normal.
    ``axis``, ``length``: cylinder axis direction and length (inf = unbounded).
    ``half_extents``: box half sizes. Moving colliders translate with ``velocity``
    and spin with ``angular_velocity`` (rad/s, about ``position``); a cylinder
    spinning about its own axis stays in place but drags what touches it.

    Keyframed motion: ``position_keys`` rows ``[t, x, y, z]`` (s, m) replace
    ``position`` and ``velocity``; ``rotation_keys`` rows ``[t, rx, ry, rz]`` (s, XYZ
    Euler degrees) replace ``rotation`` and ``angular_velocity``. Times increase
    strictly; the pose is held before the first key and after the last.
    ``interpolation``: "smooth" (eases in and out: at rest at every key) or "linear".
    """

    type: Literal["plane", "sphere", "box", "cylinder", "mesh"]
    mesh: str | None = None  # type = "mesh": a triangle mesh file (relative to the scene)
    scale: float = num(1.0, gt=0)
    position: Vec3 = (0.0, 0.0, 0.0)
    normal: Vec3 = (0.0, 1.0, 0.0)
    radius: float = num(0.5, gt=0)
    axis: Vec3 = (0.0, 0.0, 1.0)
    length: float = num(INF, gt=0)
    half_extents: Vec3 = (0.5, 0.5, 0.5)
    rotation: Vec3 = (0.0, 0.0, 0.0)  # box orientation, XYZ Euler degrees
    velocity: Vec3 = (0.0, 0.0, 0.0)
    angular_velocity: Vec3 = (0.0, 0.0, 0.0)
    friction: float | None = None  # overrides contact.mu for this collider
    visible: bool = True
    position_keys: tuple[tuple[float, float, float, float], ...] = ()
    rotation_keys: tuple[tuple[float, float, float, float], ...] = ()
    interpolation: Literal["linear", "smooth"] = "smooth"

    def __post_init__(self):
        if self.friction is not None and self.friction < 0:
            raise ConfigError("friction", f"expected a number >= 0, got {self.friction}")
        for k, replaces in (
            ("position_keys", ("position", "velocity")),
            ("rotation_keys", ("rotation", "angular_velocity")),
        ):
            rows = getattr(self, k)
            for i in range(1, len(rows)):
                if not rows[i][0] > rows[i - 1][0]:
                    raise ConfigError(
                        f"{k}[{i}]",
                        f"expected a time > {rows[i - 1][0]} (rows are [t, x, y, z] "
                        f"with strictly increasing t), got {rows[i][0]}",
                    )
            if rows and any(any(getattr(self, r)) for r in replaces):
                raise ConfigError(k, f"keyframes replace {' and '.join(replaces)}: leave those out")
        for k in ("normal", "axis"):
            if sum(c * c for c in getattr(self, k)) == 0:
                raise ConfigError(k, "expected a non-zero vector")
        if (self.type == "mesh") != (self.mesh is not None):
            raise ConfigError("mesh", "type = 'mesh' needs mesh = FILE (and only it takes one)")


@dataclass(frozen=True, kw_only=True)
class ContactConfig:
    """Contact and friction, shared by the solvers that handle contact."""

    enabled: bool = True
    mu: float = num(0.3, ge=0, doc="Coulomb friction coefficient")
    ncp: Literal["fischer-burmeister", "min-map"] = "fischer-burmeister"
    preconditioner: Literal["delassus", "mass"] = "delassus"
    cr_iterations: int = num(10, ge=1)
    newton_iterations: int = num(3, ge=1, doc="NCP Newton steps per local-global iteration (the notes use 1)")
    friction_jacobian: Literal["full", "lagged"] = "full"  # "lagged": the notes' omega_t = 0, E_t = I
    # PD contact update per local-global iteration: numpy on the host, or Taichi kernels;
    # "auto": kernels, except on Vulkan (measured slow on lavapipe) and on CUDA in f32
    # (wrong contact there, measured on an H200: tisim.contact.ncp.pd_contact.choose_implementation)
    implementation: Literal["auto", "host", "device"] = "auto"
    objects: bool = True  # object-object contact
    self_collision: bool = False
    margin: float = num(0.0, ge=0, doc="detection distance beyond contact, m")
    stiffness: float = num(1e4, gt=0, doc="penalty stiffness for penalty-based solvers, N/m")
    # C-IPC (cloth solver)
    # (below a picometre the barrier's band is narrower than the round-off of metre-scale
    # coordinates, and at 1e-300 its squares underflow: the barrier stiffness divided by 0)
    dhat: float = num(1e-3, ge=1e-12, doc="barrier activation distance beyond the thickness, m")
    thickness: float = num(1e-3, ge=0, doc="contact offset xi: no two primitives come closer, m")
    eps_v: float = num(1e-3, gt=0, doc="friction smoothing velocity: slower counts as sticking, m/s")
    friction_iterations: int = num(
        3,
        ge=0,
        doc="friction lagging passes per step at most (0: frictionless); the cloth solver "
        "lags again only while the normal forces move by more than friction_lag_tolerance",
    )
    friction_lag_tolerance: float = num(
        0.1,
        ge=0,
        doc="cloth: another friction lagging pass when the total friction bound sum mu lambda "
        "changed by more than this fraction in the last one (0: always friction_iterations "
        "passes)",
    )
    kappa: float = num(0.0, ge=0, doc="barrier stiffness; 0 chooses and adapts it automatically")
    kappa_max_ratio: float = num(
        1e4,
        ge=100,
        doc="cap of the barrier stiffness's doubling, a multiple of IPC's minimum "
        "(the start stays within IPC's [1, 100]; IPC caps at 100, which light cloth "
        "reaches at impact, leaving sub-micrometre gaps that cut Newton's steps)",
    )


@dataclass(frozen=True, kw_only=True)
class WindConfig:
    """A wind field acting on cloth faces by a simple aerodynamic model: drag along
    the relative air velocity's normal component and lift across it (per face,
    0.5 rho_air |v_rel| A (c_drag (v_rel.n) n + c_lift ...)), with gusts from seeded
    smooth noise scaling the velocity by 1 + gust * noise(t)."""

    velocity: Vec3 = (0.0, 0.0, 0.0)  # mean wind, m/s
    gust: float = num(0.0, ge=0, doc="relative gust amplitude")
    gust_period: float = num(1.0, gt=0, doc="typical gust time scale, s")
    seed: int = 0
    air_density: float = num(1.2, ge=0, doc="kg/m^3")
    drag: float = num(1.0, ge=0, doc="normal drag coefficient")
    lift: float = num(0.3, ge=0, doc="lift coefficient")


@dataclass(frozen=True, kw_only=True)
class RefineConfig:
    """Progressive dynamics (``tisim refine``): how the levels are built and advanced.

    method "auto": Loop subdivision of a generated cloth (the scene's sheet is the
    coarsest level), decimation of a mesh file (the file is the finest level);
    "meshes": the files in ``meshes`` (coarsest first) below the object's own mesh.
    """

    levels: int = num(3, ge=1, le=6, doc="number of levels (the preview is level 0)")
    method: Literal["auto", "decimate", "loop", "midpoint", "meshes"] = "auto"
    meshes: tuple[str, ...] = ()
    coarse_vertices: tuple[int, int] = (300, 1000)
    # "consistent": every coarser level's masses are U^T m of the finer one's (the
    # centre of mass is then the same on every level); "lumped": area times density on
    # every level (the totals differ by the levels' area difference)
    mass: Literal["consistent", "lumped"] = "consistent"
    schedule: Literal["sequential", "pipelined"] = "sequential"
    intermediate_tolerance: float = num(1e-2, gt=0, doc="Newton tolerance of non-finest levels")
    # 1: the paper's target P(x_l) + U (x_l - x_l'); below 1, position and velocity are
    # prolonged separately: x_{l+1} + U (x_l - x_l') + gain (P(x_l) - x_{l+1})
    position_gain: float = num(1.0, gt=0, le=1, doc="pull of a level's position towards the prolonged one per step")
    # Newton iterations that share one elastic Hessian on the levels below the finest, whose
    # Hessian is the finest level's restricted through U (their costliest part); the
    # finest level and direct runs keep solver.hessian_reuse
    hessian_reuse: int = num(8, ge=1, doc="Newton iterations sharing one elastic Hessian below the finest level")
    object: str | None = None  # the cloth object to refine (default: the only one)


@dataclass(frozen=True, kw_only=True)
class CameraConfig:
    position: Vec3 = (2.0, 1.5, 3.0)
    lookat: Vec3 = (0.0, 0.0, 0.0)
    up: Vec3 = (0.0, 1.0, 0.0)
    fov: float = num(45.0, gt=0, lt=180)

    def __post_init__(self):
        d = [a - b for a, b in zip(self.lookat, self.position)]
        dd = sum(c * c for c in d)
        if dd == 0:
            raise ConfigError("lookat", f"expected a point other than camera.position, got {list(self.lookat)}")
        uu = sum(c * c for c in self.up)
        cross = (
            d[1] * self.up[2] - d[2] * self.up[1],
            d[2] * self.up[0] - d[0] * self.up[2],
            d[0] * self.up[1] - d[1] * self.up[0],
        )
        if uu == 0 or sum(c * c for c in cross) <= 1e-12 * dd * uu:
            raise ConfigError(
                "up",
                f"expected a non-zero vector not along the view direction (lookat - position), got {list(self.up)}",
            )


@dataclass(frozen=True, kw_only=True)
class RenderConfig:
    width: int = num(960, ge=16, le=8192)  # 8192: see tisim.cli.app.MAX_IMAGE_SIDE
    height: int = num(720, ge=16, le=8192)
    fps: float | None = num(None, gt=0, doc="video frame rate; default: simulated time runs at real speed")
    background: Vec3 = (0.12, 0.12, 0.14)
    color: Vec3 = (0.85, 0.45, 0.25)
    overlay: bool = True  # a text block in rendered frames: time, key parameters, energy


@dataclass(frozen=True, kw_only=True)
class Scene:
    scene: SceneInfo = field(default_factory=SceneInfo)
    sim: SimConfig = field(default_factory=SimConfig)
    solver: Any = None  # the registered solver's config dataclass (has a ``type`` field)
    contact: ContactConfig = field(default_factory=ContactConfig)
    objects: dict[str, ObjectConfig] = field(default_factory=dict)
    colliders: dict[str, ColliderConfig] = field(default_factory=dict)
    wind: WindConfig = field(default_factory=WindConfig)
    refine: RefineConfig = field(default_factory=RefineConfig)
    camera: CameraConfig = field(default_factory=CameraConfig)
    render: RenderConfig = field(default_factory=RenderConfig)
    path: str | None = None  # the file it came from; relative mesh paths resolve against it

    @property
    def name(self) -> str:
        if self.scene.name:
            return self.scene.name
        return Path(self.path).stem if self.path else "scene"

    def resolve_path(self, p: str) -> Path:
        """A path from the scene, relative to the scene file's folder (or the cwd);
        ``assets/NAME`` found in neither is the bundled asset (also when installed)."""
        q = Path(p).expanduser()
        if q.is_absolute():
            return q
        cand = Path(self.path).parent / q if self.path is not None else q
        if cand.exists() or q.exists():
            return cand if cand.exists() else q
        if len(q.parts) > 1 and q.parts[0] == "assets":
            from tisim.resources import assets_dir

            bundled = assets_dir().joinpath(*q.parts[1:])
            if bundled.exists():
                return bundled
        return cand

    def mesh_file(self, p: str, key: str) -> Path:
        """``resolve_path`` of a mesh file the scene names at ``key``; a ConfigError naming
        the scene file, the key and where a relative path was looked for when it is not
        there."""
        path = self.resolve_path(p)
        if not path.exists():
            where = (
                ""
                if Path(p).expanduser().is_absolute()
                else (
                    f" (a relative path is read from the scene's folder {Path(self.path).parent} or the current one)"
                    if self.path is not None
                    else " (a relative path is read from the current folder)"
                )
            )
            raise ConfigError(key, f"no such file {p!r}{where}", self.path)
        return path

    def to_dict(self) -> dict:
        d = to_dict(self)
        d.pop("path", None)
        return d


_SECTIONS = {f.name for f in dataclasses.fields(Scene)} - {"path"}


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``a.b.c=value``; the value is TOML (a bare word is taken as a string)."""
    if "=" not in text:
        raise ConfigError("", f"--set expects KEY=VALUE, got {text!r}")
    key, raw = text.split("=", 1)
    key = key.strip()
    parts = list(key.split("."))
    if not key or any(not p for p in parts):
        raise ConfigError("", f"--set expects a dotted key like contact.mu, got {key!r}")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return parts, value


def apply_overrides(data: dict, overrides: list[str] | tuple[str, ...]) -> dict:
    """Apply ``--set`` overrides to a raw scene dict (a deep copy is returned)."""
    import copy

    data = copy.deepcopy(data)
    for text in overrides:
        parts, value = parse_override(text)
        node = data
        for i, p in enumerate(parts[:-1]):
            nxt = node.get(p)
            if nxt is None:
                nxt = node[p] = {}
            elif not isinstance(nxt, dict):
                raise ConfigError(".".join(parts[: i + 1]), "is a value, not a table; cannot set a key inside it")
            node = nxt
        if len(parts) == 3 and parts[0] == "objects" and parts[2] in ("mesh", "generator"):
            _replace_source(node, parts[1], parts[2], value)
        else:
            node[parts[-1]] = value
    return data


# The keys that only mean something for one source of an object's shape: replacing the
# source drops them (a ball's radius means nothing to a mesh file). ``scale``,
# ``translation``, ``rotation`` and the material work with any source.
GENERATOR_KEYS = {
    "box": ("size", "resolution", "tets_per_cell"),
    "ball": ("radius", "ball_resolution"),
    "cloth": ("cloth_size", "cloth_resolution", "cloth_normal"),
    "sphere": ("radius", "sphere_subdivisions"),
}


def _replace_source(obj: dict, name: str, key: str, value) -> None:
    """``--set objects.NAME.mesh=FILE`` / ``...generator=KIND``: the new source replaces
    the other one (the last override wins); keys that belong only to the replaced
    generator are dropped with a one-line note. An empty string removes the key."""
    old_gen = obj.get("generator")
    old_mesh = obj.get("mesh")
    if value == "":
        obj.pop(key, None)
        return
    obj[key] = value
    new_keys = set(GENERATOR_KEYS.get(value, ())) if key == "generator" and isinstance(value, str) else set()
    replaced = []
    if key == "mesh" and old_gen is not None:
        obj.pop("generator")
        replaced.append(f"generator {old_gen!r}")
    if key == "generator" and old_mesh is not None:
        obj.pop("mesh")
        replaced.append(f"mesh {old_mesh!r}")
    if key == "generator" and old_gen is not None and old_gen != value:
        replaced.append(f"generator {old_gen!r}")
    dropped = []
    if isinstance(old_gen, str) and old_gen != value:
        dropped = [k for k in GENERATOR_KEYS.get(old_gen, ()) if k in obj and k not in new_keys]
        for k in dropped:
            del obj[k]
    if replaced:
        note = f"--set objects.{name}.{key}={value!r} replaces the {' and the '.join(replaced)}"
        if dropped:
            note += " (dropped " + ", ".join(f"objects.{name}.{k}" for k in dropped) + ")"
        log.info(note)


def scene_from_dict(data: dict, path: str | None = None) -> Scene:
    """Validate a raw scene dict into a :class:`Scene` (``path`` is named in errors)."""
    from tisim.solvers.registry import solver_config_class

    try:
        if not isinstance(data, dict):
            raise ConfigError("", "a scene must be a table")
        for k in data:
            if k not in _SECTIONS:
                raise ConfigError(k, f"unknown section (known sections: {', '.join(sorted(_SECTIONS))})")
        raw = dict(data)
        solver_raw = dict(raw.pop("solver", {}) or {})
        if not isinstance(solver_raw, dict):
            raise ConfigError("solver", "expected a table")
        solver_type = solver_raw.get("type", "pd")
        cfg_cls = solver_config_class(solver_type)  # raises ConfigError for unknown types
        solver_raw["type"] = solver_type
        solver = from_dict(cfg_cls, solver_raw, "solver")
        kwargs = {}
        for f in dataclasses.fields(Scene):
            if f.name in raw:
                kwargs[f.name] = raw[f.name]
        scene = from_dict(Scene, kwargs)
        scene = dataclasses.replace(scene, solver=solver, path=path)
        if not scene.objects:
            raise ConfigError("objects", "a scene needs at least one object ([objects.NAME])")
        for name, obj in scene.objects.items():
            if obj.frame is not None and obj.frame not in scene.colliders:
                known = ", ".join(sorted(scene.colliders)) or "none"
                raise ConfigError(
                    f"objects.{name}.frame", f"expected the name of a collider (colliders: {known}), got {obj.frame!r}"
                )
        return scene
    except ConfigError as e:
        raise e.with_source(path) if path else e from None


def load_scene(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Scene:
    """Read, override and validate a scene file. Raises :class:`ConfigError`."""
    p = Path(path)
    if not p.exists():
        raise ConfigError("", "no such scene file", str(p))
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("", f"not valid TOML: {e}", str(p)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError("", f"cannot read: {e}", str(p)) from None
    in_file = {k: set(v) if isinstance(v, dict) else set() for k, v in data.items() if k in ("objects", "colliders")}
    try:
        data = apply_overrides(data, overrides)
    except ConfigError as e:
        raise ConfigError(e.key, e.detail + " (in --set)", str(p)) from None
    # a --set naming an object or collider the file does not have made a new, incomplete
    # one (a typo, objects.clth.density=1): say so, not what that new one lacks
    for section, names in in_file.items():
        for name, table in (data.get(section) or {}).items():
            needs = ("mesh", "generator") if section == "objects" else ("type",)
            if name not in names and isinstance(table, dict) and not any(k in table for k in needs):
                known = ", ".join(sorted(names)) or "none"
                raise ConfigError(
                    f"{section}.{name}",
                    f"no such entry in the scene file ({section}: {known}); "
                    f"a --set that adds one must give it {' or '.join(needs)} (in --set)",
                    str(p),
                )
    return scene_from_dict(data, str(p))


def toml_value(v: Any) -> str:
    """A Python value written as a TOML value (for ``--set`` override text)."""
    import json

    import numpy as np

    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        v = float(v)
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if math.isnan(v):
            return "nan"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string for anything json escapes
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise ConfigError("--vary", f"cannot write {v!r} as a scene value")


def resolve_scene(scene: str | Path) -> Path:
    """The scene file for ``scene``: a path to a TOML file, or the name of a bundled demo
    (``tisim demo --list``). A path that exists wins over a demo of the same name.

    Raises:
        ConfigError: neither a file nor a demo.
    """
    from tisim.config import ConfigError
    from tisim.resources import demo_path, demos_dir

    p = Path(scene)
    if p.exists():
        return p
    if demo_path(str(scene)).exists():
        return demo_path(str(scene))
    names = ", ".join(sorted(q.stem for q in demos_dir().glob("*.toml")))
    raise ConfigError("", f"no such scene file or demo (demos: {names})", str(scene))


def override_strings(overrides: Mapping[str, Any]) -> list[str]:
    """``{"contact.mu": 0.18}`` as the CLI's ``--set`` texts ``["contact.mu=0.18"]``.

    Values are written as TOML (numbers, booleans, strings, lists), so a Python value
    means what the same value typed after ``--set`` means.

    Raises:
        ConfigError: a key without a dot (scene keys are ``section.key``), or a value
            that has no TOML form.
    """
    from tisim.config import ConfigError

    out = []
    for key, value in overrides.items():
        if "." not in key:
            raise ConfigError(
                key,
                "expected a dotted scene key such as 'contact.mu' or 'sim.dt' "
                "(pass overrides as **{'contact.mu': 0.2})",
            )
        try:
            text = toml_value(value)
        except ConfigError:
            raise ConfigError(
                key, f"cannot write {value!r} as a scene value (expected a number, bool, string or list)"
            ) from None
        out.append(f"{key}={text}")
    return out
