"""Registry of the hyperelastic materials by name: ``materials.get("neo-hookean")``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tisim.materials import hyperelastic as _h

__all__ = ["REGISTRY", "Material", "get", "names"]


@dataclass(frozen=True)
class Material:
    """One isotropic hyperelastic energy density, its derivatives and its properties.

    name: registry key (one of MATERIAL_NAMES).
    formula: psi(F) in words (see :mod:`tisim.materials.hyperelastic`).
    uses_rotation: psi depends on the polar rotation R of F (ARAP, corotated), so
        local-global solvers need R per element.
    barrier: psi -> inf as J -> 0+ (log or inverse terms); such materials need J > 0
        (``symmetric-dirichlet`` is finite again for J < 0, the others are inf there).
    inversion_safe: psi, P and dP/dF are finite and smooth for every F, J <= 0 included
        ("neo-hookean" only; ARAP/corotated are finite but have a kink at some
        inverted F, see :mod:`tisim.materials.polar`).
    uses_lambda: whether lam enters psi (False for "arap", "symmetric-dirichlet",
        "symmetric-gradient").

    Methods forward to the functions of :mod:`tisim.materials.hyperelastic`
    with this material's name (same shapes and units).
    """

    name: str
    formula: str
    uses_rotation: bool
    barrier: bool
    inversion_safe: bool
    uses_lambda: bool

    def energy_density(self, F, mu, lam=0.0) -> np.ndarray:
        return _h.energy_density(self.name, F, mu, lam)

    def first_piola(self, F, mu, lam=0.0) -> np.ndarray:
        return _h.first_piola(self.name, F, mu, lam)

    def piola_derivative(self, F, mu, lam=0.0, project_psd: bool = False) -> np.ndarray:
        return _h.piola_derivative(self.name, F, mu, lam, project_psd=project_psd)

    def energy_density_sigma(self, sigma, mu, lam=0.0) -> np.ndarray:
        return _h.energy_density_sigma(self.name, sigma, mu, lam)

    def gradient_sigma(self, sigma, mu, lam=0.0) -> np.ndarray:
        return _h.gradient_sigma(self.name, sigma, mu, lam)

    def hessian_sigma(self, sigma, mu, lam=0.0) -> np.ndarray:
        return _h.hessian_sigma(self.name, sigma, mu, lam)


REGISTRY: dict[str, Material] = {
    m.name: m
    for m in (
        Material("arap", "mu ||F - R||^2", True, False, False, False),
        Material("corotated", "mu ||F - R||^2 + lam/2 (J - 1)^2", True, False, False, True),
        Material(
            "neo-hookean",
            "mu/2 (I_C - 3) - mu (J - 1) + (lam + mu)/2 (J - 1)^2  (stable NH, Smith et al. 2018)",
            False,
            False,
            True,
            True,
        ),
        Material(
            "neo-hookean-log",
            "mu/2 (I_C - 3) - mu log J + lam/2 (log J)^2",
            False,
            True,
            False,
            True,
        ),
        Material("symmetric-dirichlet", "mu/2 (||F||^2 + ||F^-1||^2) - 3 mu", False, True, False, False),
        Material("symmetric-gradient", "mu/2 ||F||^2 - mu log J - 3 mu/2", False, True, False, False),
    )
}
assert tuple(REGISTRY) == _h.MATERIAL_NAMES


def get(name: str) -> Material:
    """The Material called ``name``; KeyError listing the valid names otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown material {name!r}: expected one of {', '.join(REGISTRY)}") from None


def names() -> tuple[str, ...]:
    return tuple(REGISTRY)
