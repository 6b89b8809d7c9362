"""Material constants and lumped masses against textbook numbers and hand-computed sums.

Plane stress (a thin sheet, sigma_zz = 0; e.g. Timoshenko & Goodier, Theory of
Elasticity, §16, or any FEM text): mu = E / (2 (1 + nu)), lambda* = E nu / (1 - nu^2),
plate bending D = E t^3 / (12 (1 - nu^2)) (the hinge stiffness k = D / 2 of the shell
notes). The numbers below are literals worked out by hand, not calls of the function
under test; the membrane energy of small in-plane stretches is checked against the
textbook strain-energy densities, which involve E and nu only:

* stretch e along x with the y extent held: W = E e^2 / (2 (1 - nu^2)) per unit area and
  thickness (sigma_xx = E e / (1 - nu^2), W = sigma_xx e / 2);
* equal stretch e in both directions: W = E e^2 / (1 - nu) (sigma = E e / (1 - nu)).

Lumped masses on an irregular mesh (triangles of very different areas, where a wrong
vertex-to-face mapping changes the answer; on a regular grid every face has the same area
and such a mapping error cancels): each vertex carries a third of the mass of its incident
triangles (a quarter of its incident tetrahedra's), summed by a plain loop here.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial import Delaunay

from tisim.energies.shell import ShellEnergy, bending_stiffness, lame_plane_stress
from tisim.geometry.hierarchy import lumped_masses
from tisim.geometry.precompute import lumped_mass
from tisim.model import Model
from tisim.scene import scene_from_dict

# (E Pa, nu) -> (mu, lambda*) in Pa, by hand: 1e6 / 2.6, 3e5 / 0.91; 2e5 / 2.9, 9e4 / 0.7975
TEXTBOOK = [
    (1.0e6, 0.3, 384615.38461538462, 329670.32967032967),
    (2.0e5, 0.45, 68965.517241379310, 112852.66457680251),
    (5.0e4, 0.0, 25000.0, 0.0),
]


@pytest.mark.parametrize("E,nu,mu,lam", TEXTBOOK)
def test_plane_stress_lame_parameters_are_the_textbook_numbers(E, nu, mu, lam):
    m, lm = lame_plane_stress(E, nu)
    assert float(m) == pytest.approx(mu, rel=1e-14)
    assert float(lm) == pytest.approx(lam, rel=1e-14, abs=1e-9)
    sc = scene_from_dict(
        {
            "solver": {"type": "cloth"},
            "objects": {"c": {"kind": "cloth", "generator": "cloth", "youngs_modulus": E, "poisson_ratio": nu}},
        }
    )
    oc = sc.objects["c"]
    assert oc.lame_plane_stress[0] == pytest.approx(mu, rel=1e-14)
    assert oc.lame_plane_stress[1] == pytest.approx(lam, rel=1e-14, abs=1e-9)
    model = Model.from_scene(sc)
    np.testing.assert_allclose(model.cloth.face_mu, mu, rtol=1e-14)
    np.testing.assert_allclose(model.cloth.face_lam, lam, rtol=1e-14, atol=1e-9)


def test_plate_bending_stiffness_is_the_textbook_number():
    # D = E t^3 / (12 (1 - nu^2)) = 1e6 * 1e-9 / (12 * 0.91) = 9.157509157509158e-05 N m;
    # the hinge stiffness is half of it
    assert float(bending_stiffness(1.0e6, 0.3, 1e-3)) == pytest.approx(4.578754578754579e-05, rel=1e-14)
    sc = scene_from_dict(
        {
            "solver": {"type": "cloth"},
            "objects": {
                "c": {
                    "kind": "cloth",
                    "generator": "cloth",
                    "youngs_modulus": 1.0e6,
                    "poisson_ratio": 0.3,
                    "thickness": 1e-3,
                }
            },
        }
    )
    assert sc.objects["c"].plate_bending_stiffness == pytest.approx(4.578754578754579e-05, rel=1e-14)


@pytest.mark.parametrize("E,nu", [(1.0e6, 0.3), (2.0e5, 0.45)])
def test_membrane_energy_of_small_stretches_is_the_plane_stress_density(E, nu):
    tau = 2e-3
    X = np.array([[0.0, 0.0, 0.0], [0.3, 0.0, 0.05], [0.1, 0.0, 0.4]])  # in the xz plane
    area = 0.5 * np.linalg.norm(np.cross(X[1] - X[0], X[2] - X[0]))
    shell = ShellEnergy.from_material(X, np.array([[0, 1, 2]]), young=E, poisson=nu, thickness=tau)
    e = 1e-5
    uni = X * np.array([1.0 + e, 1.0, 1.0])
    bi = X * np.array([1.0 + e, 1.0, 1.0 + e])
    # relative error of the small-strain densities: O(e)
    assert shell.energy_np(uni) == pytest.approx(tau * area * E * e * e / (2 * (1 - nu * nu)), rel=1e-4)
    assert shell.energy_np(bi) == pytest.approx(tau * area * E * e * e / (1 - nu), rel=1e-4)


def _irregular_sheet(rng, n=40):
    """A Delaunay triangulation of random points, lifted to a gentle bump: face areas
    spread over more than a factor 10."""
    p = np.vstack([rng.uniform(0, 1, size=(n, 2)), [[0, 0], [1, 0], [0, 1], [1, 1]]])
    f = Delaunay(p).simplices.astype(np.int32)
    x = np.column_stack([p[:, 0], 0.1 * np.sin(3 * p[:, 0]) * p[:, 1], p[:, 1]])
    # counter-clockwise seen from +y
    e1, e2 = x[f[:, 1]] - x[f[:, 0]], x[f[:, 2]] - x[f[:, 0]]
    flip = np.cross(e1, e2)[:, 1] < 0
    f[flip] = f[flip][:, [0, 2, 1]]
    return x, f


def _expected_lumped(x, f, density):
    m = np.zeros(len(x))
    for tri in f:
        a = 0.5 * np.linalg.norm(np.cross(x[tri[1]] - x[tri[0]], x[tri[2]] - x[tri[0]]))
        for v in tri:
            m[v] += density * a / 3.0
    return m


def test_triangle_mass_lumping_on_an_irregular_mesh(rng):
    x, f = _irregular_sheet(rng)
    areas = 0.5 * np.linalg.norm(np.cross(x[f[:, 1]] - x[f[:, 0]], x[f[:, 2]] - x[f[:, 0]]), axis=1)
    assert areas.max() > 10 * areas.min()
    expected = _expected_lumped(x, f, 0.6)
    np.testing.assert_allclose(lumped_masses(x, f, 0.6), expected, rtol=1e-13)


def test_cloth_model_masses_on_an_irregular_mesh(rng, tmp_path):
    x, f = _irregular_sheet(rng)
    path = tmp_path / "sheet.obj"
    with open(path, "w") as fh:
        fh.writelines(f"v {float(p[0])!r} {float(p[1])!r} {float(p[2])!r}\n" for p in x)
        fh.writelines(f"f {t[0] + 1} {t[1] + 1} {t[2] + 1}\n" for t in f)
    sc = scene_from_dict(
        {
            "solver": {"type": "cloth"},
            "objects": {"c": {"kind": "cloth", "mesh": str(path), "density": 300.0, "thickness": 2e-3, "scale": 1.5}},
        },
        str(tmp_path / "scene.toml"),
    )
    model = Model.from_scene(sc)
    cs = model.cloth.vertex_slice
    # the masses of the mesh as placed (scaled by 1.5: areas x 2.25), 0.6 kg/m^2
    xs, fs = model.cloth.rest, model.cloth.faces
    np.testing.assert_allclose(model.mass[cs], _expected_lumped(xs, fs, 0.6), rtol=1e-12)
    assert model.mass[cs].sum() == pytest.approx(0.6 * 2.25 * _expected_lumped(x, f, 1.0).sum(), rel=1e-12)


def test_tet_mass_lumping_on_an_irregular_mesh(rng):
    from tisim.geometry.mesh import TetMesh

    p = rng.uniform(0, 1, size=(30, 3))
    t = Delaunay(p).simplices.astype(np.int32)
    vol = np.einsum("ij,ij->i", np.cross(p[t[:, 1]] - p[t[:, 0]], p[t[:, 2]] - p[t[:, 0]]), p[t[:, 3]] - p[t[:, 0]]) / 6
    t[vol < 0] = t[vol < 0][:, [0, 2, 1, 3]]
    vol = np.abs(vol)
    assert vol.max() > 10 * vol.min()
    expected = np.zeros(len(p))
    for k, tet in enumerate(t):
        for v in tet:
            expected[v] += 1000.0 * vol[k] / 4.0
    np.testing.assert_allclose(lumped_mass(TetMesh(p, t), 1000.0), expected, rtol=1e-12)
