"""The shell term's passes of a Newton iteration (:class:`~tisim.solvers.cloth.terms.ShellTerm`),
each in one launch: the energy (membrane, bending, a folded strain limit), the gradient (membrane, bending, a
folded strain limit) and the Hessian (the membrane's and the strain limit's projected
F-space Hessians gathered into the CSR values, then the bending's Gauss-Newton term).

Each kernel runs the energies' passes (``*_pass`` in :mod:`tisim.energies.shell_kernels`
and :mod:`tisim.energies.bending_kernels`) one after the other, as their kernels of one
pass each did: a kernel's top-level loops, those of the ``ti.func``s it calls at its top
level included, run in order. A Python launch costs 15-20 us on the 2-core benchmark
machine, more than some of these passes. Counts (hinges, strain faces, vertices of the
bending's gather) of 0 skip a pass: its arrays are then only placeholders.

This module has no ``from __future__ import annotations``: Taichi reads the kernels'
type annotations when they are decorated.
"""

import taichi as ti

from tisim.energies import bending_kernels as B
from tisim.energies import shell_kernels as K


@ti.kernel
def shell_energy(
    x: ti.types.ndarray(),
    faces: ti.types.ndarray(),
    face_data: ti.types.ndarray(),
    hinges: ti.types.ndarray(),
    hinge_data: ti.types.ndarray(),
    n_hinges: ti.i32,
    membrane: ti.types.ndarray(),
    bending: ti.types.ndarray(),
    strain_faces: ti.types.ndarray(),
    strain_data: ti.types.ndarray(),
    n_strain: ti.i32,
    s_max: float,
    s_hat: float,
    strain: ti.types.ndarray(),
):
    """membrane[0] = Psi_m, bending[0] = Psi_b over the first n_hinges hinges (J), and
    the strain limit's Phi and largest stretch over its first n_strain faces in strain[0]
    and strain[1] (``strain_energy``; n_strain = 0: none, strain a scratch array)."""
    K.membrane_energy_pass(x, faces, face_data, membrane)
    B.bending_energy_pass(x, hinges, hinge_data, bending, n_hinges)
    K.strain_energy_pass(x, strain_faces, strain_data, strain, s_max, s_hat, n_strain)


@ti.kernel
def shell_gradient(
    x: ti.types.ndarray(),
    faces: ti.types.ndarray(),
    face_data: ti.types.ndarray(),
    hinges: ti.types.ndarray(),
    hinge_data: ti.types.ndarray(),
    n_hinges: ti.i32,
    strain_faces: ti.types.ndarray(),
    strain_data: ti.types.ndarray(),
    n_strain: ti.i32,
    s_max: float,
    s_hat: float,
    g: ti.types.ndarray(),
):
    """g += d(Psi_m + Psi_b + Phi)/dx (N): the membrane, the first n_hinges hinges, the
    strain limit's first n_strain faces (0: none)."""
    K.membrane_gradient_pass(x, faces, face_data, g)
    B.bending_gradient_pass(x, hinges, hinge_data, g, n_hinges)
    K.strain_gradient_pass(x, strain_faces, strain_data, g, s_max, s_hat, n_strain)


@ti.kernel
def shell_hessian(
    x: ti.types.ndarray(),
    faces: ti.types.ndarray(),
    face_data: ti.types.ndarray(),
    strain_data: ti.types.ndarray(),
    membrane_on: ti.i32,
    strain_on: ti.i32,
    s_max: float,
    s_hat: float,
    tol: float,
    project: ti.i32,
    hf: ti.types.ndarray(),
    face_ptr: ti.types.ndarray(),
    face_inc: ti.types.ndarray(),
    face_rows: ti.types.ndarray(),
    indptr: ti.types.ndarray(),
    csr: ti.types.ndarray(),
    hinges: ti.types.ndarray(),
    hinge_data: ti.types.ndarray(),
    n_hinges: ti.i32,
    gn: ti.types.ndarray(),
    hinge_ptr: ti.types.ndarray(),
    hinge_inc: ti.types.ndarray(),
    hinge_rows: ti.types.ndarray(),
    n_gather: ti.i32,
    lumped: ti.i32,
):
    """The shell's Hessian into the CSR values csr: ``shell_hessian_f`` into hf (6 x 6 per
    face), ``gather_face_hessians`` (which zeroes each vertex's rows first), then the
    Gauss-Newton bending: ``bending_gauss_newton_factors`` of the first n_hinges hinges
    into gn and ``gather_bending_gauss_newton`` over the first n_gather vertices."""
    K.shell_hessian_f_pass(x, faces, face_data, strain_data, membrane_on, strain_on, s_max, s_hat, tol, project, hf)
    K.gather_face_hessians_pass(face_data, hf, face_ptr, face_inc, face_rows, indptr, csr)
    B.gauss_newton_factors_pass(x, hinges, hinge_data, n_hinges, gn)
    B.gather_bending_gauss_newton_pass(gn, hinge_ptr, hinge_inc, hinge_rows, csr, lumped, n_gather)
