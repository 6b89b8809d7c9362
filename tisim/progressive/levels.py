"""The levels of a refine: the hierarchy built for a scene's cloth object, each level's
solver input (ClothPart) and mesh, and the state a level carries from step to step.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from tisim.config import ConfigError
from tisim.geometry.mesh import MeshError

log = logging.getLogger(__name__)


@dataclass
class LevelState:
    """What one level carries from step to step."""

    x: np.ndarray  # (n, 3) positions, m
    v: np.ndarray  # (n, 3) velocities, m/s
    t: float = 0.0
    kappa: float = 0.0  # the solver's adaptive barrier stiffness after the step
    kappa_max: float = math.inf  # and its cap (set with kappa at the first contact)
    obstacles: np.ndarray | None = None


def cloth_part_for_level(level, oc, mesh=None):
    """A ClothPart (the cloth solver's input) for one hierarchy level, with the
    object's material."""
    from tisim.geometry.cloth import ClothMesh
    from tisim.model import ClothPart

    mesh = mesh if mesh is not None else ClothMesh(level.vertices, level.faces)
    m = len(mesh.faces)
    mu, lam = oc.lame_plane_stress
    h = mesh.hinges
    return ClothPart(
        offset=0,
        vertex_count=mesh.vertex_count,
        faces=mesh.faces.astype(np.int32),
        edges=mesh.edges.astype(np.int32),
        hinges=np.asarray(h, dtype=np.int32).reshape(-1, 4),
        rest=np.asarray(level.vertices, dtype=np.float64).copy(),
        face_mu=np.full(m, mu),
        face_lam=np.full(m, lam),
        face_thickness=np.full(m, oc.thickness),
        hinge_k=np.full(len(h), oc.plate_bending_stiffness),
        vertex_mu=np.full(mesh.vertex_count, np.nan if oc.friction is None else oc.friction),
        face_object=np.zeros(m, dtype=np.int64),
        mass=np.asarray(level.mass, dtype=np.float64),
        meshes=(("cloth", slice(0, mesh.vertex_count), mesh),),
    )


def level_mesh(level):
    """The ``ClothMesh`` a level's frames are written with, UVs included: per-corner UVs
    as they are, per-vertex ones (decimated levels) as corners naming their vertex's UV."""
    from tisim.geometry.cloth import ClothMesh

    if level.uv is None:
        return ClothMesh(level.vertices, level.faces)
    face_uv = level.faces if level.face_uv is None else level.face_uv
    return ClothMesh(level.vertices, level.faces, level.uv, face_uv)


def build_levels(scene, model, count: int | None = None):
    """The hierarchy for ``scene``'s cloth object: (Hierarchy, ObjectConfig, name)."""
    from tisim.geometry import hierarchy as hy
    from tisim.geometry.cloth import load_cloth_mesh
    from tisim.model import _transform

    rc = scene.refine
    cloths = {k: o for k, o in scene.objects.items() if o.kind == "cloth"}
    solids = [k for k, o in scene.objects.items() if o.kind != "cloth"]
    if solids:
        raise ConfigError(f"objects.{solids[0]}", "tisim refine takes cloth objects and colliders only", scene.path)
    if rc.object is not None:
        if rc.object not in cloths:
            raise ConfigError("refine.object", f"expected the name of a cloth object ({', '.join(cloths)})", scene.path)
        name = rc.object
    elif len(cloths) != 1:
        raise ConfigError("refine.object", f"the scene has {len(cloths)} cloth objects: name one", scene.path)
    else:
        name = next(iter(cloths))
    oc = cloths[name]
    levels = count if count is not None else rc.levels
    cp = model.cloth
    _, _, mesh = cp.meshes[0]
    rho = oc.density * oc.thickness
    method = rc.method
    if method == "auto":
        method = "loop" if oc.generator in ("cloth", "sphere") else "decimate"
    # the object's own masses (the plain cloth solver's), so a one-level refine is that
    # solver exactly and a mesh-file finest level keeps them
    base = hy.Level(
        np.asarray(cp.rest, dtype=np.float64), mesh.faces, np.asarray(cp.mass, dtype=np.float64), mesh.uv, mesh.face_uv
    )
    try:
        if method in ("loop", "midpoint"):
            H = hy.build_hierarchy(base, levels, method=method, mass=rc.mass)
        elif method == "decimate":
            need = hy.decimation_minimum(levels, tuple(rc.coarse_vertices))
            if rc.method == "auto" and levels > 1 and base.vertex_count < need:
                # too coarse to decimate: refine upward, the mesh is the preview
                H = hy.build_hierarchy(base, levels, method="loop", mass=rc.mass)
                log.info(
                    "%s has %d vertices, too few to decimate into %d levels (%d needed): it is the "
                    "preview, and Loop subdivision makes the finer levels (%s vertices)",
                    oc.mesh,
                    base.vertex_count,
                    levels,
                    need,
                    ", ".join(str(lv.vertex_count) for lv in H.levels[1:]),
                )
            else:
                H = hy.build_hierarchy(
                    base, levels, method="decimate", coarse_vertices=tuple(rc.coarse_vertices), mass=rc.mass
                )
        else:
            if len(rc.meshes) != levels - 1:
                raise ConfigError(
                    "refine.meshes",
                    f"expected {levels - 1} coarser meshes for {levels} levels, got {len(rc.meshes)}",
                    scene.path,
                )
            user = []
            for i, f in enumerate(rc.meshes):
                m = load_cloth_mesh(str(scene.mesh_file(f, f"refine.meshes[{i}]")))
                user.append(hy.Level.from_mesh(_transform(m.vertices, oc, scene), m.faces, rho, m.uv, m.face_uv))
            H = hy.from_meshes(user + [base], mass=rc.mass)
    except MeshError as e:
        raise MeshError(
            str(e).split(": ", 1)[-1] if scene.path and str(e).startswith(scene.path) else str(e), scene.path
        ) from None
    return H, oc, name
