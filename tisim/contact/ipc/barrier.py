"""IPC's log barrier and its derivatives, as ``@ti.func``s, with C-IPC's thickness offset.

    b(d, dhat) = -(d - dhat)^2 ln(d / dhat)   for 0 < d < dhat,   0 for d >= dhat,

with b' = (dhat - d) (2 ln(d/dhat) - dhat/d + 1) and
b'' = -2 ln(d/dhat) - 4 r + r^2, r = (d - dhat)/d.

C-IPC convention (notes §2.4 and §7, "C-IPC constants"): with shell thickness xi and
activation distance dhat (metres) the barrier acts on the squared distance d^2:
``s = d^2 - xi^2`` and ``s_hat = dhat^2 + 2 dhat xi``, so the contact activates at a
gap of dhat between the shells' surfaces. For s <= 0 (the surfaces touch or overlap)
the energy is +inf: the solver's CCD keeps every iterate at s > 0, and the line
search must reject an inf energy.

References: Li et al. 2020, "Incremental Potential Contact", eq. 6; Li et al. 2021,
"Codimensional Incremental Potential Contact", §4; IPC Toolkit's ``barrier``,
``barrier_first_derivative``, ``barrier_second_derivative`` (checked against in tests).
"""

import taichi as ti

from tisim import ti_math as tm


@ti.func
def barrier(d, dhat):
    """b(d, dhat) (units of d^2): +inf for d <= 0, 0 for d >= dhat.
    (The barrier is applied to s = d^2 - xi^2, so "d" here is in m^2.)"""
    b = 0.0
    if d <= 0.0:
        b = ti.math.inf
    elif d < dhat:
        b = -(d - dhat) * (d - dhat) * tm.log(d / dhat)
    return b


@ti.func
def barrier_first_derivative(d, dhat):
    """db/dd (units of d); 0 outside (0, dhat)."""
    g = 0.0
    if 0.0 < d < dhat:
        g = (dhat - d) * (2.0 * tm.log(d / dhat) - dhat / d + 1.0)
    return g


@ti.func
def barrier_second_derivative(d, dhat):
    """d^2 b/dd^2 (dimensionless); 0 outside (0, dhat)."""
    h = 0.0
    if 0.0 < d < dhat:
        r = (d - dhat) / d
        h = -2.0 * tm.log(d / dhat) - 4.0 * r + r * r
    return h


@ti.func
def shell_barrier_arguments(dist_sq, dhat, thickness):
    """(s, s_hat) of C-IPC: s = d^2 - xi^2, s_hat = dhat^2 + 2 dhat xi (m^2)."""
    return dist_sq - thickness * thickness, dhat * dhat + 2.0 * dhat * thickness


@ti.func
def shell_barrier_force_magnitude(dist_sq, dhat, thickness, kappa):
    """Normal force magnitude lambda = -kappa db/dd (N for kappa in J/m^4, since the
    barrier of s in m^2 is in m^4), d the unsquared distance: by the chain rule through
    s = d^2 - xi^2, db/dd = b'(s, s_hat) 2 d. Zero for inactive pairs."""
    s, s_hat = shell_barrier_arguments(dist_sq, dhat, thickness)
    return -kappa * barrier_first_derivative(s, s_hat) * 2.0 * ti.sqrt(ti.max(dist_sq, 0.0))
