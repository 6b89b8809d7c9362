"""Cloth meshes (triangle shells): loading with per-corner UVs, validation,
topology and per-frame OBJ export; the intersection check for initial states
(`tisim.geometry.intersections`, re-exported here).

Every problem with a cloth mesh raises ``MeshError`` with a one-line message
naming the file and the element (vertex, face, edge; indices count from 0 in
the order of the file, after polygons are fan-triangulated; OBJ messages also
give the line). Repairable problems are repaired with a logged warning:
inconsistent orientation (faces flipped), unreferenced vertices (dropped).
Plain numpy/scipy; nothing here imports Taichi.
"""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from tisim.geometry import topology
from tisim.geometry.intersections import (
    Intersection,
    _ints,
    check_intersection_free,
    find_intersections,
)
from tisim.geometry.mesh import MeshError, TriMesh, _as_cells, _as_vertices

log = logging.getLogger(__name__)

_WARNED: set[tuple[str, str]] = set()  # (file, note) already told in this process


def _warn(src: str, note: str) -> None:
    """Log a mesh note once per file and process: ``tisim refine my.obj`` reads the mesh to
    build its scene and again as that scene's mesh (once by the name given, once by the
    absolute path); the second reading's notes go to the debug log."""
    if not src or src.startswith("<"):  # a mesh not from a file: nothing to know it by
        log.warning("%s: %s", src, note)
        return
    key = (os.path.abspath(src), note)
    if key in _WARNED:
        log.debug("%s: %s", src, note)
        return
    _WARNED.add(key)
    log.warning("%s: %s", src, note)


# A face is degenerate when 2A <= DEGENERATE_TOL * (its longest edge)^2 (a
# sliver or a repeated point; same tolerance as tisim.geometry.io) or when
# A <= AREA_TOL * L^2 with L the diagonal of the mesh's bounding box (a face
# so small against the sheet that its stiffness would dwarf every other: a
# 1 m sheet rejects faces under 1e-12 m^2, i.e. edges of about a micrometre).
DEGENERATE_TOL = 1e-10
AREA_TOL = 1e-12
COINCIDENT_TOL = 1e-9  # two vertices closer than this times the mesh size are one (unwelded)


# ---------------------------------------------------------------------------
# The mesh type


@dataclass(frozen=True, eq=False)
class ClothMesh:
    """A triangle shell (cloth) with optional texture coordinates.

    vertices: (n, 3) float64, metres. faces: (m, 3) int32, consistently
    oriented (counter-clockwise seen from the side the normal points to; see
    ``validate_cloth``). uv: (k, 2) float64 texture coordinates or None.
    face_uv: (m, 3) int32 indices into ``uv`` per face corner (as OBJ's
    ``f v/vt``, so a seam vertex can carry two UVs) or None; given together
    with ``uv``. source: the file it came from, if any.

    The constructor checks shapes and index ranges only; ``ClothMesh.from_arrays``
    and ``load_cloth_mesh`` run the full validation.
    """

    vertices: np.ndarray
    faces: np.ndarray
    uv: np.ndarray | None = None
    face_uv: np.ndarray | None = None
    source: str | None = None

    def __post_init__(self):
        v = _as_vertices(self.vertices, self.source)
        f = _as_cells(self.faces, 3, len(v), "faces", self.source)
        object.__setattr__(self, "vertices", v)
        object.__setattr__(self, "faces", f)
        if (self.uv is None) != (self.face_uv is None):
            raise MeshError("uv and face_uv must be given together", self.source)
        if self.uv is not None:
            uv = np.ascontiguousarray(np.asarray(self.uv, dtype=np.float64))
            if uv.ndim != 2 or uv.shape[1] != 2:
                raise MeshError(f"uv must have shape (k, 2), got {uv.shape}", self.source)
            if not np.all(np.isfinite(uv)):
                bad = int(np.argwhere(~np.isfinite(uv))[0, 0])
                raise MeshError(f"texture coordinate {bad} is NaN or infinite", self.source)
            fuv = _as_cells(self.face_uv, 3, len(uv), "face_uvs", self.source)
            if len(fuv) != len(f):
                raise MeshError(f"face_uv has {len(fuv)} rows but there are {len(f)} faces", self.source)
            object.__setattr__(self, "uv", uv)
            object.__setattr__(self, "face_uv", fuv)

    @classmethod
    def from_arrays(cls, vertices, faces, *, uv=None, face_uv=None, source: str | None = None) -> ClothMesh:
        """Validate (``validate_cloth``: errors, orientation fix, unreferenced
        vertices dropped) and build; ``face_uv`` follows any flipped face."""
        x, f, _, flip = _validate(vertices, faces, source)
        if face_uv is not None:
            face_uv = np.array(face_uv, dtype=np.int64).reshape(-1, 3)
            face_uv[flip] = face_uv[flip][:, [0, 2, 1]]
        return cls(x, f, uv, face_uv, source)

    @property
    def vertex_count(self) -> int:
        return len(self.vertices)

    @property
    def face_count(self) -> int:
        return len(self.faces)

    @cached_property
    def _edge_counts(self) -> tuple[np.ndarray, np.ndarray]:
        e, c = topology.edge_face_counts(self.faces)
        return e.astype(np.int32), c

    @property
    def edges(self) -> np.ndarray:
        """(ne, 2) int32 unique undirected edges, each row sorted, rows in
        lexicographic order."""
        return self._edge_counts[0]

    @property
    def edge_count(self) -> int:
        return len(self._edge_counts[0])

    @cached_property
    def _hinges(self) -> tuple[np.ndarray, np.ndarray]:
        h, hf = topology.hinges(self.faces, return_faces=True)
        return h.astype(np.int32), hf.astype(np.int32)

    @property
    def hinges(self) -> np.ndarray:
        """(h, 4) int32 rows (e0, e1, o0, o1), one per interior edge, in the
        order of ``edges``: face A = (e0, e1, o0) and face B = (e1, e0, o1), both
        in their winding order, so n_A = (e1 - e0) x (o0 - e0) and
        n_B = (o1 - e0) x (e1 - e0) are the outward normals of the two faces and
        the dihedral sign is consistent over the sheet."""
        return self._hinges[0]

    @property
    def hinge_faces(self) -> np.ndarray:
        """(h, 2) int32 the faces (A, B) of every hinge."""
        return self._hinges[1]

    @property
    def hinge_edges(self) -> np.ndarray:
        """(h,) int64 row of ``edges`` for every hinge."""
        return np.flatnonzero(self._edge_counts[1] == 2)

    @cached_property
    def boundary_edges(self) -> np.ndarray:
        """(b, 2) int32 boundary edges (used by one face), directed in that
        face's winding order, so they run counter-clockwise around the sheet."""
        return topology.boundary_edges(self.faces).astype(np.int32)

    @property
    def euler_characteristic(self) -> int:
        """V - E + F (1 for a disc, 0 for a cylinder or an annulus)."""
        return self.vertex_count - self.edge_count + self.face_count

    def face_areas(self, positions: np.ndarray | None = None) -> np.ndarray:
        """(m,) face areas, m^2, at ``positions`` (default: the rest vertices)."""
        x = self.vertices if positions is None else np.asarray(positions, dtype=np.float64)
        p = x[self.faces]
        return 0.5 * np.linalg.norm(np.cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0]), axis=1)

    def to_trimesh(self) -> TriMesh:
        """The same surface as a ``TriMesh`` (without UVs)."""
        return TriMesh(self.vertices, self.faces, source=self.source)

    @cached_property
    def _obj_tail(self) -> str:
        """The 'vt' and 'f' lines of an OBJ file, which every frame shares."""
        f1 = self.faces.astype(np.int64) + 1
        if self.uv is None:
            uv_text = ""
            face_text = ("f %d %d %d\n" * len(f1)) % tuple(f1.ravel().tolist())
        else:
            uv_text = ("vt %.9g %.9g\n" * len(self.uv)) % tuple(self.uv.ravel().tolist())
            t1 = self.face_uv.astype(np.int64) + 1
            inter = np.stack([f1, t1], axis=2).ravel().tolist()  # v/vt per corner
            face_text = ("f %d/%d %d/%d %d/%d\n" * len(f1)) % tuple(inter)
        return uv_text + face_text


# ---------------------------------------------------------------------------
# Validation


class _Names:
    """How messages name faces and vertices (with their OBJ line when known)."""

    def __init__(self, face_lines=None, vertex_lines=None):
        self.face_lines = face_lines
        self.vertex_lines = vertex_lines

    def face(self, j: int, detail: str = "") -> str:
        about = [] if self.face_lines is None else [f"line {int(self.face_lines[j])}"]
        about += [detail] if detail else []
        return f"face {j} ({', '.join(about)})" if about else f"face {j}"

    def vertex(self, i: int) -> str:
        line = "" if self.vertex_lines is None else f" (line {int(self.vertex_lines[i])})"
        return f"vertex {i}{line}"


def validate_cloth(vertices, faces, source: str | None = None):
    """Check and repair a cloth mesh; the checks ``load_cloth_mesh`` applies.

    vertices: (n, 3) metres; faces: (m, 3) vertex indices. Returns
    (vertices (n', 3) float64, faces (m, 3) int32, notes: list[str] describing
    each repair made).

    Raises MeshError (one line, naming ``source`` and the element) for: wrong
    shapes, no vertices or no faces, a NaN/inf coordinate (the vertex), an index
    out of range (the face), a degenerate face (repeated index, or zero or
    near-zero area, see DEGENERATE_TOL / AREA_TOL), duplicate faces (the same
    three vertices; both faces), a non-manifold edge (shared by three or more
    faces; its vertices and faces), a non-orientable piece (Moebius strip).

    Repairs with a logged warning: faces wound against their neighbours are
    flipped (in each connected piece the majority keeps its winding); vertices
    no face uses are dropped and the faces renumbered. Non-manifold vertices
    (two sheets touching at a single vertex) are allowed with a warning: every
    energy and contact primitive is defined there.
    """
    x, f, notes, _ = _validate(vertices, faces, source)
    return x, f, notes


def _check_faces_geometry(x, f, source, names: _Names) -> np.ndarray:
    """Refuse degenerate faces, unwelded vertices and duplicate faces; return the sorted
    ids of the vertices that faces use."""
    m = len(f)
    repeated = (f[:, 0] == f[:, 1]) | (f[:, 1] == f[:, 2]) | (f[:, 0] == f[:, 2])
    p = x[f]
    area = 0.5 * np.linalg.norm(np.cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0]), axis=1)
    longest2 = np.max([np.sum((p[:, a] - p[:, b]) ** 2, axis=1) for a, b in ((0, 1), (1, 2), (2, 0))], axis=0)
    used = np.unique(f)
    scale2 = float(np.sum(np.ptp(x[used], axis=0) ** 2))
    degenerate = repeated | (2 * area <= DEGENERATE_TOL * longest2) | (area <= AREA_TOL * scale2)
    if np.any(degenerate):
        j = int(np.argmax(degenerate))
        more = f"; {int(degenerate.sum())} degenerate faces" if degenerate.sum() > 1 else ""
        why = "repeated vertex" if repeated[j] else f"area {area[j]:.3g} m^2"
        raise MeshError(f"{names.face(j, f'vertices {_ints(f[j])}')} is degenerate ({why}{more})", source)

    # vertices at the same place: an unwelded mesh (every triangle with its own corners,
    # as some exporters write), which the contact check would report as the cloth
    # intersecting itself
    from scipy.spatial import cKDTree

    close = cKDTree(x[used]).query_pairs(r=max(COINCIDENT_TOL * np.sqrt(scale2), 1e-300), output_type="ndarray")
    if len(close):
        a, b = sorted(int(used[i]) for i in close[np.lexsort(close.T[::-1])][0])
        raise MeshError(
            f"{names.vertex(a)} and {names.vertex(b)} are at the same place ({len(close)} such pairs): "
            "the mesh is not welded; merge its vertices by distance in the modelling tool",
            source,
        )

    srt = np.sort(f, axis=1)
    order = np.lexsort((srt[:, 2], srt[:, 1], srt[:, 0]))  # stable: equal rows in file order
    rows = srt[order]
    start = np.r_[True, np.any(rows[1:] != rows[:-1], axis=1)]
    twin = np.empty(m, dtype=np.int64)  # the earliest face with the same three vertices
    twin[order] = order[np.flatnonzero(start)][np.cumsum(start) - 1]
    dup = twin != np.arange(m)
    if np.any(dup):
        b = int(np.argmax(dup))
        raise MeshError(
            f"{names.face(int(twin[b]))} and {names.face(b)} are duplicates (both use vertices {_ints(srt[b])})",
            source,
        )

    return used


def _check_manifold(f, source, names: _Names) -> None:
    """Refuse an edge shared by more than two faces."""
    he, _, face, key, _ = topology._half_edges(f)
    horder, start, count = topology._edge_groups(key)
    if np.any(count > 2):
        g = int(np.argmax(count > 2))
        members = face[horder[start[g] : start[g] + count[g]]]
        e = np.sort(he[horder[start[g]]])
        raise MeshError(
            f"edge ({e[0]}, {e[1]}) is non-manifold: shared by {count[g]} faces "
            f"({', '.join(names.face(int(j)) for j in np.sort(members))}); "
            "a cloth edge belongs to at most two faces",
            source,
        )


def _validate(vertices, faces, source: str | None, names: _Names | None = None):
    """validate_cloth, also returning (m,) bool which faces were flipped (so
    per-corner data such as face_uv can follow)."""
    names = names or _Names()
    src = source or "<mesh>"
    x = np.asarray(vertices, dtype=np.float64)
    f = np.asarray(faces)
    if x.ndim != 2 or x.shape[1] != 3:
        raise MeshError(f"vertices must have shape (n, 3), got {x.shape}", source)
    if f.size == 0:
        raise MeshError("contains no triangles (empty mesh)", source)
    if f.ndim != 2 or f.shape[1] != 3:
        raise MeshError(f"faces must have shape (m, 3), got {f.shape}", source)
    if not np.issubdtype(f.dtype, np.integer):
        if not np.all(np.isfinite(f)) or np.any(f != np.round(f)):
            raise MeshError("face indices must be integers", source)
    f = f.astype(np.int64)
    n, m = len(x), len(f)
    if n == 0:
        raise MeshError("contains no vertices (empty mesh)", source)

    bad = ~np.all(np.isfinite(x), axis=1)
    if np.any(bad):
        i = int(np.argmax(bad))
        more = f"; {int(bad.sum())} such vertices" if bad.sum() > 1 else ""
        raise MeshError(f"{names.vertex(i)} has a NaN or infinite coordinate ({_fmt(x[i])}{more})", source)

    out = (f < 0) | (f >= n)
    if np.any(out):
        j = int(np.argmax(np.any(out, axis=1)))
        k = int(f[j][out[j]][0])
        raise MeshError(f"{names.face(j)} references vertex {k}, outside 0..{n - 1}", source)

    used = _check_faces_geometry(x, f, source, names)
    _check_manifold(f, source, names)

    notes: list[str] = []
    flip, non_orientable = topology.consistent_orientation(f)
    if np.any(non_orientable):
        j = int(np.argmax(non_orientable))
        raise MeshError(
            f"the surface is not orientable (a Moebius strip or similar): the piece "
            f"containing {names.face(j)} cannot be given consistent normals",
            source,
        )
    if np.any(flip):
        note = (
            f"flipped {int(flip.sum())} of {m} faces to make the orientation consistent "
            f"(first: {names.face(int(np.argmax(flip)))})"
        )
        _warn(src, note)
        notes.append(note)
        f = f.copy()
        f[flip] = f[flip][:, [0, 2, 1]]

    bowties = topology.nonmanifold_vertices(f)
    if len(bowties):
        note = (
            f"{len(bowties)} non-manifold vertices where separate sheets touch (first: {names.vertex(int(bowties[0]))})"
        )
        _warn(src, note)
        notes.append(note)

    if len(used) < n:
        note = f"dropped {n - len(used)} unreferenced vertices"
        _warn(src, note)
        notes.append(note)
        x, f = x[used], np.searchsorted(used, f)
    return np.ascontiguousarray(x), f.astype(np.int32), notes, flip


def _fmt(v) -> str:
    return ", ".join(f"{c:.6g}" for c in v)


# ---------------------------------------------------------------------------
# Loading


def load_cloth_mesh(path) -> ClothMesh:
    """Load a cloth mesh from any triangle format, validated (``validate_cloth``).

    ``.obj`` is read by our own reader so per-corner texture coordinates
    survive: ``v``, ``vt`` and ``f`` with corners ``v``, ``v/vt``, ``v//vn`` or
    ``v/vt/vn`` and negative (relative) indices; polygons are fan-triangulated
    (logged); ``vn``, comments, ``o``, ``g``, ``s``, ``usemtl``, ``mtllib``,
    lines and points are ignored. UVs are kept only when every face has them.
    Other formats (.ply, .stl, .off, .vtk, .vtu, .msh, ...) go through meshio;
    quads and polygons are fan-triangulated, and per-vertex UVs stored as point
    data (``s``/``t``, ``u``/``v``, ``texture_u``/``texture_v``) are kept.

    Raises MeshError (one line naming the file) for missing or unreadable
    files, files without triangles or with tetrahedra, and everything
    ``validate_cloth`` rejects.
    """
    p = Path(path)
    src = str(path)
    if p.suffix.lower() == ".obj":
        if not p.exists():
            raise MeshError("file not found", src)
        if p.is_dir():
            raise MeshError("is a directory, not a mesh file", src)
        x, f, uv, fuv, notes, names = _read_obj(p, src)
    else:
        x, f, uv, fuv, notes = _read_meshio(p, src)
        names = None
    for note in notes:
        log.info("%s: %s", src, note)
    x, f, _, flip = _validate(x, f, src, names)
    if fuv is not None:
        fuv = fuv.copy()
        fuv[flip] = fuv[flip][:, [0, 2, 1]]
    return ClothMesh(x, f, uv, fuv, src)


def _read_meshio(path: Path, src: str):
    from tisim.geometry import io as mesh_io

    mesh, src = mesh_io._read(path)
    x = mesh_io._points(mesh, src)
    if any(b.type.startswith(("tetra", "hexahedron", "wedge", "pyramid")) for b in mesh.cells):
        raise MeshError(
            f"contains volume cells ({mesh_io._cell_types(mesh)}); a cloth needs a triangle surface",
            src,
        )
    f = mesh_io._cells(mesh, "triangle")
    if len(f) == 0:
        raise MeshError(f"contains no triangles (cells: {mesh_io._cell_types(mesh)})", src)
    notes = []
    polys = sum(len(b.data) for b in mesh.cells if b.type.startswith(("quad", "polygon")))
    if polys:
        notes.append(f"fan-triangulated {polys} polygons")
    uv = fuv = None
    for ku, kv in (("s", "t"), ("u", "v"), ("texture_u", "texture_v")):
        if ku in mesh.point_data and kv in mesh.point_data:
            uv = np.stack([mesh.point_data[ku], mesh.point_data[kv]], axis=1).astype(np.float64)
            fuv = f.copy()  # per-vertex UVs: the corner's UV is its vertex's
            break
    return x, f, uv, fuv, notes


def _obj_face_corners(corners, ln: int, n_verts: int, n_uvs: int, src: str):
    """One OBJ face's corners ``v``, ``v/t``, ``v//n`` or ``v/t/n`` as 0-based (vertex ids,
    texture ids or None); negative indices count back from the last element read so far."""
    cv, ct = [], []
    for corner in corners:
        parts = corner.split("/")
        try:
            vi = int(parts[0])
            ti = int(parts[1]) if len(parts) > 1 and parts[1] else None
        except ValueError:
            raise MeshError(f"line {ln}: cannot read face corner {corner!r}", src) from None
        if vi == 0 or ti == 0:
            raise MeshError(f"line {ln}: index 0 in {corner!r} (OBJ counts from 1)", src)
        cv.append(vi - 1 if vi > 0 else n_verts + vi)
        ct.append(None if ti is None else (ti - 1 if ti > 0 else n_uvs + ti))
    return cv, ct


def _read_obj(path: Path, src: str):
    """Parse a Wavefront OBJ: (vertices, faces, uv | None, face_uv | None, notes, names)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise MeshError(f"cannot read the file ({err.strerror})", src) from None
    if not text.strip():
        raise MeshError("file is empty", src)
    verts: list[list[float]] = []
    vlines: list[int] = []
    uvs: list[list[float]] = []
    fv: list[list[int]] = []
    ft: list[list[int]] = []
    flines: list[int] = []
    no_uv = polygons = ignored = 0
    pending = ""
    for ln, raw in enumerate(text.splitlines(), 1):
        line = pending + raw.split("#", 1)[0]
        if line.rstrip().endswith("\\"):  # line continuation
            pending = line.rstrip()[:-1] + " "
            continue
        pending = ""
        tok = line.split()
        if not tok:
            continue
        tag = tok[0]
        if tag == "v":
            try:
                verts.append([float(t) for t in tok[1:4]])
            except ValueError:
                verts.append([])
            if len(verts[-1]) != 3:
                raise MeshError(f"line {ln}: cannot read {line.strip()!r} as a vertex", src)
            vlines.append(ln)
        elif tag == "vt":
            try:
                t = [float(c) for c in tok[1:3]]
            except ValueError:
                t = []
            if not t:
                raise MeshError(f"line {ln}: cannot read {line.strip()!r} as a texture coordinate", src)
            uvs.append(t + [0.0] * (2 - len(t)))
        elif tag == "f":
            if len(tok) < 4:
                raise MeshError(f"line {ln}: a face needs at least 3 vertices", src)
            cv, ct = _obj_face_corners(tok[1:], ln, len(verts), len(uvs), src)
            has_t = all(t is not None for t in ct)
            if len(cv) > 3:
                polygons += 1
            for k in range(1, len(cv) - 1):  # fan from the first corner
                fv.append([cv[0], cv[k], cv[k + 1]])
                ft.append([ct[0], ct[k], ct[k + 1]] if has_t else [-1, -1, -1])
                flines.append(ln)
            no_uv += not has_t
        elif tag in ("l", "p"):
            ignored += 1
        # vn, vp, o, g, s, usemtl, mtllib and unknown tags carry nothing we use
    notes = []
    if polygons:
        notes.append(f"fan-triangulated {polygons} polygons into triangles")
    if ignored:
        notes.append(f"ignored {ignored} line/point elements")
    if not fv:
        raise MeshError("contains no faces", src)
    x = np.asarray(verts, dtype=np.float64).reshape(-1, 3)
    f = np.asarray(fv, dtype=np.int64)
    out = (f < 0) | (f >= len(x))
    if np.any(out):
        j = int(np.argmax(np.any(out, axis=1)))
        k = int(f[j][out[j]][0])
        raise MeshError(
            f"face {j} (line {flines[j]}) references vertex {k + 1}, but the file has "
            f"{len(x)} vertices (OBJ numbering from 1)",
            src,
        )
    uv = fuv = None
    if uvs and no_uv == 0:
        uv = np.asarray(uvs, dtype=np.float64)
        fuv = np.asarray(ft, dtype=np.int64)
        out = (fuv < 0) | (fuv >= len(uv))
        if np.any(out):
            j = int(np.argmax(np.any(out, axis=1)))
            k = int(fuv[j][out[j]][0])
            raise MeshError(
                f"face {j} (line {flines[j]}) references texture coordinate {k + 1}, but the "
                f"file has {len(uv)} (OBJ numbering from 1)",
                src,
            )
    elif uvs and no_uv:
        note = f"texture coordinates dropped: {no_uv} faces have none"
        _warn(src, note)
        notes.append(note)
    return x, f, uv, fuv, notes, _Names(np.asarray(flines), np.asarray(vlines))


# ---------------------------------------------------------------------------
# Export


def save_cloth_obj(path, vertices, mesh: ClothMesh, *, precision: int = 9) -> None:
    """Write one frame of a cloth as OBJ with the mesh's original UVs
    (``vt`` lines and ``f v/vt`` corners), atomically: the text goes to a
    temporary file in the same folder that then replaces ``path``, so a viewer
    or a crash never sees half a file.

    vertices: (n, 3) metres, n = mesh.vertex_count. precision: significant
    digits of the positions (9 resolves 1 nm on a 1 m sheet). The UV and face
    lines are formatted once per mesh and reused; a 4k-vertex frame takes a few
    milliseconds. The folder must exist. Raises MeshError naming the file.
    """
    p = Path(path)
    src = str(path)
    x = np.asarray(vertices, dtype=np.float64)
    if x.shape != (mesh.vertex_count, 3):
        raise MeshError(
            f"positions must have shape ({mesh.vertex_count}, 3) to match the mesh, got {x.shape}",
            src,
        )
    if not p.parent.is_dir():
        raise MeshError(f"folder {p.parent} does not exist", src)
    fmt = f"v %.{int(precision)}g %.{int(precision)}g %.{int(precision)}g\n"
    text = (
        f"# tisim cloth: {mesh.vertex_count} vertices, {mesh.face_count} faces\n"
        + (fmt * len(x)) % tuple(x.ravel().tolist())
        + mesh._obj_tail
    )
    # A unique name beside the target: os.replace is atomic within one file
    # system, and open() (unlike mkstemp) keeps the usual permissions.
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "x", encoding="ascii", newline="\n") as fh:
            fh.write(text)
        os.replace(tmp, p)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise MeshError(f"cannot write the OBJ file ({err.strerror or err})", src) from None


__all__ = [
    "AREA_TOL",
    "DEGENERATE_TOL",
    "ClothMesh",
    "Intersection",
    "check_intersection_free",
    "find_intersections",
    "load_cloth_mesh",
    "save_cloth_obj",
    "validate_cloth",
]
