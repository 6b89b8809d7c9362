"""Isotropic hyperelastic materials shared by every solver.

numpy reference implementations (batched over (m, 3, 3) deformation gradients):
:mod:`tisim.materials.hyperelastic` (psi, P, dP/dF, singular-value forms),
:mod:`tisim.materials.polar` (rotation-variant SVD, polar rotation, dR/dF) and a
registry (``get(name) -> Material``). Taichi ``@ti.func`` versions for kernels
live in :mod:`tisim.materials.ti_funcs` (imported explicitly; importing this
package does not import Taichi).
"""

from __future__ import annotations

from tisim.materials.hyperelastic import (
    MATERIAL_NAMES,
    energy_density,
    energy_density_sigma,
    first_piola,
    gradient_sigma,
    hessian_sigma,
    piola_derivative,
    project_psd,
)
from tisim.materials.polar import polar_rotation, rotation_derivative, svd_rotation_variant
from tisim.materials.registry import REGISTRY, Material, get, names

__all__ = [
    "MATERIAL_NAMES",
    "REGISTRY",
    "Material",
    "energy_density",
    "energy_density_sigma",
    "first_piola",
    "get",
    "gradient_sigma",
    "hessian_sigma",
    "names",
    "piola_derivative",
    "polar_rotation",
    "project_psd",
    "rotation_derivative",
    "svd_rotation_variant",
]
