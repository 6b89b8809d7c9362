"""Mesh files: loading with validation, and per-frame export (through meshio).

Every problem with a file raises ``MeshError`` whose message is one line naming
the file and the problem. Repairable problems are repaired with a logged
warning: unreferenced vertices are dropped, inverted tets are re-oriented.
"""

from __future__ import annotations

import logging
from pathlib import Path

import meshio
import numpy as np

from tisim.geometry.mesh import MeshError, TetMesh, TriMesh, tet_signed_volumes
from tisim.geometry.topology import surface_triangles

log = logging.getLogger(__name__)

# A tet is degenerate when 6|V| < DEGENERATE_TOL * (longest edge)^3, a triangle
# when 2A < DEGENERATE_TOL * (longest edge)^2. Relative to the element's own size,
# so the test is independent of units; 1e-10 is far above the rounding error of
# the determinant (~1e-16 * |x| / edge) for any sensible mesh, and an element
# that flat would make any stiffness matrix singular in practice.
DEGENERATE_TOL = 1e-10

# Formats that can hold tetrahedra; the others hold surfaces only.
_SURFACE_ONLY = {".obj", ".ply", ".stl", ".off", ".svg", ".wkt"}


def supported_extensions() -> list[str]:
    """Sorted file extensions that can be read (everything meshio reads, which
    includes TetGen's .node/.ele pair)."""
    return sorted(meshio.extension_to_filetypes)


def _extension(path: Path) -> str:
    """The longest known extension the name ends with (handles '.vol.gz'), else
    the last suffix."""
    name = path.name.lower()
    known = [e for e in meshio.extension_to_filetypes if name.endswith(e)]
    return max(known, key=len) if known else path.suffix.lower()


def _unknown_format(ext: str, src: str) -> MeshError:
    return MeshError(f"unknown mesh format '{ext}'; supported: {', '.join(supported_extensions())}", src)


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _read(path) -> tuple[meshio.Mesh, str]:
    """meshio.read with every failure turned into a one-line MeshError."""
    p = Path(path)
    src = str(path)
    if not p.exists():
        raise MeshError("file not found", src)
    if p.is_dir():
        raise MeshError("is a directory, not a mesh file", src)
    ext = _extension(p)
    if ext not in meshio.extension_to_filetypes:
        raise _unknown_format(ext or p.name, src)
    if p.stat().st_size == 0:
        raise MeshError("file is empty", src)
    formats = sorted(meshio.extension_to_filetypes[ext], key=lambda f: f != "gmsh")
    errors = []
    for fmt in formats:
        # meshio raises many exception types for corrupt files (and SystemExit
        # from meshio.read); each becomes part of one message. Readers probe
        # headers with arithmetic that may overflow, hence errstate.
        try:
            with np.errstate(all="ignore"):
                return _read_format(p, fmt), src
        except (Exception, SystemExit) as err:
            errors.append(f"as {fmt}: {_one_line(err)}")
    raise MeshError(f"cannot read the file ({'; '.join(errors)})", src)


def _read_format(path: Path, fmt: str) -> meshio.Mesh:
    """Read with one meshio reader. meshio.read itself prints reader errors to
    stdout and calls sys.exit when every candidate format fails, so the reader is
    called directly where meshio exposes it."""
    readers = getattr(getattr(meshio, "_helpers", None), "reader_map", None)
    if readers is not None and fmt in readers:
        return readers[fmt](str(path))
    return meshio.read(path, file_format=fmt)


def _points(mesh: meshio.Mesh, src: str) -> np.ndarray:
    pts = np.asarray(mesh.points, dtype=np.float64)
    if pts.ndim != 2 or pts.shape[1] not in (2, 3) or len(pts) == 0:
        raise MeshError(f"has no usable vertices (points array of shape {pts.shape})", src)
    if pts.shape[1] == 2:  # planar files (e.g. some .obj/.msh): z = 0
        pts = np.concatenate([pts, np.zeros((len(pts), 1))], axis=1)
    bad = ~np.all(np.isfinite(pts), axis=1)
    if np.any(bad):
        first = int(np.argmax(bad))
        raise MeshError(
            f"{int(bad.sum())} vertices have NaN or infinite coordinates (first: vertex {first})",
            src,
        )
    return pts


def _cells(mesh: meshio.Mesh, kind: str) -> np.ndarray:
    """All cells of ``kind`` ("tetra" or "triangle"), higher-order cells reduced
    to their corner vertices and polygons fan-triangulated; (m, 4) or (m, 3)."""
    out = []
    for block in mesh.cells:
        data = np.asarray(block.data, dtype=np.int64)
        t = block.type
        if kind == "tetra" and t.startswith("tetra"):  # tetra, tetra10: corners first
            out.append(data[:, :4])
        elif kind == "triangle" and t.startswith("triangle"):
            out.append(data[:, :3])
        elif kind == "triangle" and t.startswith(("quad", "polygon")):
            if t.startswith("quad"):  # quad, quad8, quad9: corners first
                data = data[:, :4]
            fan = [data[:, [0, i, i + 1]] for i in range(1, data.shape[1] - 1)]
            out.append(np.stack(fan, axis=1).reshape(-1, 3))
    width = 4 if kind == "tetra" else 3
    return np.concatenate(out) if out else np.zeros((0, width), dtype=np.int64)


def _cell_types(mesh: meshio.Mesh) -> str:
    kinds = sorted({b.type for b in mesh.cells})
    return ", ".join(kinds) if kinds else "no cells"


def _check_indices(cells: np.ndarray, n: int, what: str, src: str | None) -> None:
    if cells.size and (cells.min() < 0 or cells.max() >= n):
        bad = int(np.argmax(np.any((cells < 0) | (cells >= n), axis=1)))
        raise MeshError(f"{what} {bad} references a vertex outside 0..{n - 1}", src)


def _drop_unreferenced(vertices: np.ndarray, cells: np.ndarray, src: str) -> tuple[np.ndarray, np.ndarray]:
    used = np.zeros(len(vertices), dtype=bool)
    used[cells.ravel()] = True
    dropped = int(len(vertices) - used.sum())
    if dropped:
        log.warning("%s: dropped %d unreferenced vertices", src, dropped)
        new_id = np.cumsum(used) - 1
        vertices, cells = vertices[used], new_id[cells]
    return vertices, cells


def _longest_edge(x: np.ndarray, cells: np.ndarray) -> np.ndarray:
    k = cells.shape[1]
    p = x[cells]
    lengths = [np.linalg.norm(p[:, a] - p[:, b], axis=1) for a in range(k) for b in range(a + 1, k)]
    return np.max(lengths, axis=0)


def validate_tets(vertices, tets, source: str | None = None) -> TetMesh:
    """Check and repair a tet mesh; the checks ``load_tet_mesh`` applies.

    vertices: (n, 3) metres; tets: (m, 4) vertex indices. Raises MeshError for
    non-finite coordinates, out-of-range indices, no tets, degenerate tets (see
    DEGENERATE_TOL). Drops unreferenced vertices and re-orients inverted tets
    (swapping their last two vertices), each with a logged warning.
    """
    src = source or "<mesh>"
    x = np.asarray(vertices, dtype=np.float64)
    t = np.asarray(tets, dtype=np.int64).reshape(-1, 4)
    if x.ndim != 2 or x.shape[1] != 3:
        raise MeshError(f"vertices must have shape (n, 3), got {x.shape}", source)
    bad = ~np.all(np.isfinite(x), axis=1)
    if np.any(bad):
        raise MeshError(
            f"{int(bad.sum())} vertices have NaN or infinite coordinates (first: vertex {int(np.argmax(bad))})",
            source,
        )
    if len(t) == 0:
        raise MeshError("contains no tetrahedra", source)
    _check_indices(t, len(x), "tet", source)
    vol6 = 6.0 * tet_signed_volumes(x, t)
    degenerate = np.abs(vol6) <= DEGENERATE_TOL * _longest_edge(x, t) ** 3
    if np.any(degenerate):
        raise MeshError(
            f"{int(degenerate.sum())} degenerate tets with (nearly) zero volume "
            f"(first: tet {int(np.argmax(degenerate))})",
            source,
        )
    x, t = _drop_unreferenced(x, t, src)
    inverted = vol6 < 0
    if np.any(inverted):
        log.warning("%s: re-oriented %d inverted tets", src, int(inverted.sum()))
        t = t.copy()
        t[inverted, 2], t[inverted, 3] = t[inverted, 3].copy(), t[inverted, 2].copy()
    return TetMesh(x, t, source=source)


def validate_triangles(vertices, faces, source: str | None = None) -> TriMesh:
    """Check and repair a triangle mesh; the checks ``load_tri_mesh`` applies.

    Raises MeshError for non-finite coordinates, out-of-range indices, no
    triangles, degenerate (zero-area) triangles; drops unreferenced vertices
    with a logged warning. The winding is kept as given.
    """
    src = source or "<mesh>"
    x = np.asarray(vertices, dtype=np.float64)
    f = np.asarray(faces, dtype=np.int64).reshape(-1, 3)
    if x.ndim != 2 or x.shape[1] != 3:
        raise MeshError(f"vertices must have shape (n, 3), got {x.shape}", source)
    bad = ~np.all(np.isfinite(x), axis=1)
    if np.any(bad):
        raise MeshError(
            f"{int(bad.sum())} vertices have NaN or infinite coordinates (first: vertex {int(np.argmax(bad))})",
            source,
        )
    if len(f) == 0:
        raise MeshError("contains no triangles", source)
    _check_indices(f, len(x), "triangle", source)
    p = x[f]
    area2 = np.linalg.norm(np.cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0]), axis=1)
    degenerate = area2 <= DEGENERATE_TOL * _longest_edge(x, f) ** 2
    if np.any(degenerate):
        raise MeshError(
            f"{int(degenerate.sum())} degenerate triangles with (nearly) zero area "
            f"(first: triangle {int(np.argmax(degenerate))})",
            source,
        )
    x, f = _drop_unreferenced(x, f, src)
    return TriMesh(x, f, source=source)


def _merge_duplicates(x: np.ndarray, f: np.ndarray, src: str) -> tuple[np.ndarray, np.ndarray]:
    """Merge vertices with identical coordinates (a closed surface stored as a
    triangle soup, e.g. STL written by some tools)."""
    uniq, first, inverse = np.unique(x, axis=0, return_index=True, return_inverse=True)
    if len(uniq) == len(x):
        return x, f
    log.info("%s: merged %d duplicate vertices", src, len(x) - len(uniq))
    order = np.argsort(first, kind="stable")  # keep the file's vertex order
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return x[np.sort(first)], rank[inverse.ravel()][f]


def load_tet_mesh(path, *, max_volume: float | None = None, quality: dict | None = None) -> TetMesh:
    """Load a volumetric tet mesh, validated and positively oriented.

    path: any format meshio reads (.msh, .vtk, .vtu, .mesh, .xdmf, TetGen
    .node/.ele, ...). A file with triangles but no tets (.obj, .ply, .stl,
    .off, or a surface saved in any format) is a closed surface to fill: it is
    tetrahedralized with TetGen (``tetrahedralize``; ``max_volume`` in m^3 bounds
    the tet size, ``quality`` overrides TetGen's {"minratio", "mindihedral"}) and an
    info message says so. Higher-order tets keep their
    corners; all tet blocks of the file are merged into one mesh.

    Raises MeshError (one line naming the file) for: missing file, unknown
    extension (listing the supported ones), unreadable or corrupt contents, no
    tets and no triangles, NaN/Inf coordinates, out-of-range indices, degenerate
    tets. Drops unreferenced vertices and re-orients inverted tets, logging a
    warning with the count and the file.
    """
    mesh, src = _read(path)
    x = _points(mesh, src)
    tets = _cells(mesh, "tetra")
    if len(tets):
        return validate_tets(x, tets, src)
    tris = _cells(mesh, "triangle")
    if len(tris) == 0:
        raise MeshError(f"contains no tetrahedra and no triangles to fill (cells: {_cell_types(mesh)})", src)
    from tisim.geometry.tetrahedralize import tetrahedralize

    surface = validate_triangles(*_merge_duplicates(x, tris, src), source=src)
    log.info("%s: surface mesh (%d triangles), tetrahedralizing with TetGen", src, len(tris))
    solid = tetrahedralize(surface, max_volume=max_volume, quality=True if quality is None else quality)
    return validate_tets(solid.vertices, solid.tets, src)


def load_tri_mesh(path) -> TriMesh:
    """Load a triangle surface (cloth, shells), validated; winding kept as in
    the file. Quads and polygons are fan-triangulated.

    Raises MeshError (one line naming the file) for: missing file, unknown
    extension, corrupt contents, no triangles (e.g. a tet-only file), NaN/Inf
    coordinates, out-of-range indices, zero-area triangles. Drops unreferenced
    vertices with a logged warning.
    """
    mesh, src = _read(path)
    x = _points(mesh, src)
    tris = _cells(mesh, "triangle")
    if len(tris) == 0:
        raise MeshError(f"contains no triangles (cells: {_cell_types(mesh)})", src)
    return validate_triangles(x, tris, src)


def save_mesh(path, vertices, cells, *, keep_unused_vertices: bool = False) -> None:
    """Write one mesh (e.g. one frame for ``--export-meshes``) through meshio.

    vertices: (n, 3) metres. cells: (m, 3) triangles or (m, 4) tets. The format
    follows the extension (.ply, .obj, .vtu, .vtk, .msh, .mesh, .stl, .off, ...).
    Tets written to a surface-only format (.obj, .ply, .stl, .off) are replaced
    by their outward boundary triangles (the tets must be positively oriented).
    Vertices no cell uses (e.g. the interior of a soft body whose surface is
    written) are left out and the cells renumbered, unless
    ``keep_unused_vertices``; the result is the same for every frame of a mesh.
    The parent folder must exist. Raises MeshError naming the file on failure.
    """
    p = Path(path)
    src = str(path)
    x = np.asarray(vertices, dtype=np.float64)
    c = np.asarray(cells, dtype=np.int64)
    if x.ndim != 2 or x.shape[1] != 3:
        raise MeshError(f"vertices must have shape (n, 3), got {x.shape}", src)
    if c.ndim != 2 or c.shape[1] not in (3, 4):
        raise MeshError(f"cells must have shape (m, 3) or (m, 4), got {c.shape}", src)
    _check_indices(c, len(x), "cell", src)
    ext = _extension(p)
    if ext not in meshio.extension_to_filetypes:
        raise _unknown_format(ext or p.name, src)
    if not p.parent.is_dir():
        raise MeshError(f"folder {p.parent} does not exist", src)
    kind = "triangle" if c.shape[1] == 3 else "tetra"
    if kind == "tetra" and ext in _SURFACE_ONLY:  # only the boundary fits these formats
        c, kind = surface_triangles(c), "triangle"
    if not keep_unused_vertices:
        used = np.unique(c)
        if len(used) < len(x):
            x, c = x[used], np.searchsorted(used, c)
    if ext == ".ply":  # PLY has no 64-bit integers; meshio would warn and cast
        c = c.astype(np.int32)
    cell_data = {}
    if ext == ".msh":  # gmsh wants physical/geometrical tags; without them meshio warns on stderr
        cell_data = {
            "gmsh:physical": [np.ones(len(c), int)],
            "gmsh:geometrical": [np.ones(len(c), int)],
        }
    try:
        meshio.write(
            p,
            meshio.Mesh(x, [(kind, c)], cell_data=cell_data),
            file_format="gmsh22" if ext == ".msh" else None,
        )
    except Exception as err:  # any writer failure becomes one line
        raise MeshError(f"cannot write {ext} mesh ({_one_line(err)})", src) from None
