"""GGUI draw calls from host (numpy) arrays, without Taichi fields.

Taichi 1.7's ``Scene.mesh_instance``, ``particles`` and ``lines`` take Taichi fields. On
every call they copy the fields into a fresh numpy vertex buffer with a kernel templated
on those fields, and read the index and transform fields back with ``to_numpy``. Then they
hand the numpy arrays to the C++ scene (``FieldSource.HostMappedPtr``), which copies them
at once. Each new field therefore instantiates and compiles Taichi's own copy kernels:
``from_numpy`` into the field, the copy to the vertex buffer, and ``to_numpy`` out of the
index and transform fields. That is 20-60 ms a field. A ``--headless`` run spent about 2 s
of its start-up there (29-61 instantiations), and the test suite's workers spent 76 s.
It also cost kernel launches and an index read-back on every frame drawn.

Here a mesh keeps its vertex buffer as one numpy array in GGUI's layout, and the draw
passes it, with the index and transform arrays, straight to the C++ scene, as Taichi's
own wrappers do after their copies. The pixels are the same (tests/unit/test_render.py).

Applies to: Taichi 1.7 (``taichi.ui.utils.get_field_info``, ``Scene.scene``'s
``mesh_instance``, ``particles`` and ``lines`` signatures); ``pyproject.toml`` pins <1.8.
"""

from __future__ import annotations

import numpy as np

STRIDE = 12  # a vertex in GGUI's buffer: position 3, normal 3, texture coordinates 2, RGBA 4
POS, NORMAL, COLOR = slice(0, 3), slice(3, 6), slice(8, 12)


def vertex_buffer(n: int) -> np.ndarray:
    """(max(n, 1), STRIDE) f32 zeros, opaque white: GGUI's vertex layout."""
    vbo = np.zeros((max(int(n), 1), STRIDE), dtype=np.float32)
    vbo[:, COLOR] = 1.0
    return vbo


def _info(array: np.ndarray | None):
    from taichi.ui.utils import get_field_info

    return get_field_info(array)


def mesh(
    scene,
    vbo: np.ndarray,
    indices: np.ndarray,
    transforms: np.ndarray,
    color,
    *,
    two_sided: bool = True,
    vertex_count: int | None = None,
    index_count: int | None = None,
) -> None:
    """One instance of a triangle mesh with per-vertex colours: ``vbo`` from
    :func:`vertex_buffer`, ``indices`` int32 (3k,), ``transforms`` f32 (1, 4, 4)."""
    scene.scene.mesh_instance(
        _info(vbo),
        True,  # per-vertex colour
        _info(indices),
        tuple(float(c) for c in color),
        bool(two_sided),
        _info(transforms),
        1,  # instance count
        0,  # instance offset
        int(len(indices) if index_count is None else index_count),
        0,  # index offset
        int(len(vbo) if vertex_count is None else vertex_count),
        0,  # vertex offset
        False,  # wireframe
    )


def particles(scene, vbo: np.ndarray, radius: float, color, *, index_offset: int = 0, index_count: int) -> None:
    """Spheres of one ``radius`` at ``vbo[:, POS]`` (a :func:`vertex_buffer`), one colour."""
    scene.scene.particles(
        _info(vbo), False, False, tuple(float(c) for c in color), float(radius), int(index_count), int(index_offset)
    )


def lines(scene, vbo: np.ndarray, width: float, color, *, vertex_count: int | None = None) -> None:
    """Segments between consecutive pairs of ``vbo[:, POS]``, one colour."""
    n = int(len(vbo) if vertex_count is None else vertex_count)
    scene.scene.lines(_info(vbo), _info(None), False, tuple(float(c) for c in color), float(width), n, 0, n, 0)
