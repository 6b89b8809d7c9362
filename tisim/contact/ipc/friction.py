"""IPC's smoothed lagged friction, as ``@ti.func``s: mollifiers, tangent bases and the
closest-point weights of point-triangle and edge-edge pairs.

Friction potential of one pair (notes §2.4 "Lagged friction", §7):

    D_k(x) = mu_k lambda_k f0(|u_k|),   u_k = T_k^T sum_i w_ki (x_i - x_ref_i)   (m)

with the normal force lambda_k, the tangent basis T_k (3 x 2, orthonormal columns)
and the closest-point weights w_k (4, one per pair slot) all lagged (frozen at the
last update), and the smoothed friction mollifier (eps = eps_v h, metres)

    f0(y) = -y^3 / (3 eps^2) + y^2 / eps + eps / 3   for y < eps,   y otherwise,
    f1 = f0',  f2 = f1'.

Gradient: dD/dx_i = mu lambda w_i T (f1(y)/y) u. Hessian block (i, j):
mu lambda w_i w_j T M T^T with the 2 x 2 M = (f1/y) I + ((f2 y - f1)/y^3) u u^T, whose
eigenvalues f1/y (across u) and f2 (along u) are >= 0 for every y, so the friction
Hessian is PSD by construction when mu lambda >= 0 (``inner_matrix(..., project=True)``
clamps f2 at 0 anyway, against round-off at y ~ eps).

Tangent bases follow the closest features, like IPC Toolkit's conversion of pairs to
vertex-vertex / edge-vertex / face-vertex / edge-edge contacts: the tangent plane is
normal to the vector between the closest points (the face normal for P_T, ea x eb for
EA_EB). For P_T and EA_EB the bases equal ipctk's ``point_triangle_tangent_basis`` /
``edge_edge_tangent_basis``; for point-edge and point-point features the plane is the
same as ipctk's and the columns may differ by a rotation in it, which changes no
|u| (hence no energy, gradient or Hessian).

References: Li et al. 2020, "Incremental Potential Contact", §5 (smoothed friction,
f0 and f1); IPC Toolkit ``smooth_friction_f0``, ``smooth_friction_f1``,
``smooth_friction_f1_over_x``, ``smooth_friction_f2``,
``smooth_friction_f2_x_minus_f1_over_x3`` (1.6 names; checked against in tests).
"""

import taichi as ti

from tisim.contact.ipc import distance as dist

# ---------------------------------------------------------------------------------
# mollifiers (y >= 0, eps > 0, both metres)


@ti.func
def smooth_friction_f0(y, eps):
    """f0(y) (m): C^1 blend of y, f0(0) = eps/3."""
    r = y
    if ti.abs(y) < eps:
        r = -y * y * y / (3.0 * eps * eps) + y * y / eps + eps / 3.0
    return r


@ti.func
def smooth_friction_f1(y, eps):
    """f1 = f0' (dimensionless): 2y/eps - y^2/eps^2 below eps, 1 above."""
    r = 1.0
    if ti.abs(y) < eps:
        r = -y * y / (eps * eps) + 2.0 * y / eps
    return r


@ti.func
def smooth_friction_f1_over_x(y, eps):
    """f1(y)/y (1/m), finite at y = 0 (2/eps)."""
    r = 0.0
    if ti.abs(y) < eps:
        r = -y / (eps * eps) + 2.0 / eps
    else:
        r = 1.0 / y
    return r


@ti.func
def smooth_friction_f2(y, eps):
    """f2 = f1' (1/m): 2/eps - 2y/eps^2 below eps, 0 above."""
    r = 0.0
    if ti.abs(y) < eps:
        r = -2.0 * y / (eps * eps) + 2.0 / eps
    return r


@ti.func
def smooth_friction_f2_x_minus_f1_over_x3(y, eps):
    """(f2(y) y - f1(y)) / y^3 (1/m^3): -1/(y eps^2) below eps, -1/y^3 above
    (unbounded at y = 0, where it only ever multiplies u u^T = O(y^2))."""
    r = 0.0
    if ti.abs(y) < eps:
        r = -1.0 / (y * eps * eps)
    else:
        r = -1.0 / (y * y * y)
    return r


@ti.func
def inner_matrix(u, eps, project):
    """The 2 x 2 M = (f1/y) I + ((f2 y - f1)/y^3) u u^T of a tangential displacement u (2,
    m) (1/m). Written as a (I - uh uh^T) + b uh uh^T with a = f1/y, b = f2 (the two
    eigenvalues), so y = 0 needs no special case beyond picking any uh; ``project``
    clamps b at 0 (a >= 0 always)."""
    y = u.norm()
    a = smooth_friction_f1_over_x(y, eps)
    b = smooth_friction_f2(y, eps)
    if project:
        b = ti.max(b, 0.0)
    M = a * ti.Matrix.identity(float, 2)
    if y > 0.0:
        uh = u / y
        M += (b - a) * uh.outer_product(uh)
    return M


# ---------------------------------------------------------------------------------
# tangent bases (3 x 2, orthonormal columns)


@ti.func
def tangent_basis_from_normal(n, hint):
    """Orthonormal (t0, t1) spanning the plane normal to n (any length > 0): t0 along
    hint's component in the plane, t1 = nh x t0. (3 x 2)"""
    nh = n.normalized()
    t0 = (hint - hint.dot(nh) * nh).normalized()
    return ti.Matrix.cols([t0, nh.cross(t0)])


@ti.func
def _least_aligned_axis(n):
    """The coordinate axis least aligned with n (a safe hint for any normal)."""
    a = ti.abs(n)
    h = ti.Vector([1.0, 0.0, 0.0])
    if a[1] <= a[0] and a[1] <= a[2]:
        h = ti.Vector([0.0, 1.0, 0.0])
    elif a[2] <= a[0] and a[2] <= a[1]:
        h = ti.Vector([0.0, 0.0, 1.0])
    return h


@ti.func
def point_point_tangent_basis(p0, p1):
    """Basis of the plane normal to p1 - p0 (columns in ipctk's plane; rotation free)."""
    n = p1 - p0
    return tangent_basis_from_normal(n, _least_aligned_axis(n))


@ti.func
def point_edge_tangent_basis(p, e0, e1):
    """(e/|e|, normalised e x (p - e0)), e = e1 - e0 (as ipctk)."""
    e = e1 - e0
    return ti.Matrix.cols([e.normalized(), e.cross(p - e0).normalized()])


@ti.func
def point_triangle_tangent_basis(p, t0, t1, t2):
    """(e/|e|, normalised n x e), e = t1 - t0, n = e x (t2 - t0) (as ipctk)."""
    e = t1 - t0
    n = e.cross(t2 - t0)
    return ti.Matrix.cols([e.normalized(), n.cross(e).normalized()])


@ti.func
def edge_edge_tangent_basis(ea0, ea1, eb0, eb1):
    """(ea/|ea|, normalised n x ea), n = ea x eb (as ipctk)."""
    ea = ea1 - ea0
    n = ea.cross(eb1 - eb0)
    return ti.Matrix.cols([ea.normalized(), n.cross(ea).normalized()])


# ---------------------------------------------------------------------------------
# per-pair frames: tangent basis and closest-point weights by distance type


@ti.func
def _frame(n, hint, axis_hint):
    """Tangent basis normal to n, first column along ``hint`` (or the axis least
    aligned with n where ``axis_hint``): one inlined copy for every distance type."""
    h = hint
    if axis_hint:
        h = _least_aligned_axis(n)
    return tangent_basis_from_normal(n, h)


@ti.func
def point_triangle_frame_data(p, t0, t1, t2, dtype):
    """(w, n, hint, axis_hint) of a point-triangle pair of type ``dtype``: w (4) the
    closest-point weights over (p, t0, t1, t2) with sum_i w_i x_i = p - closest point,
    n the contact normal direction (the face normal for P_T, p - closest point
    otherwise) and the first tangent's hint (t1 - t0, the edge, or an axis for P_T*)."""
    b = dist.point_triangle_closest_point(p, t0, t1, t2, dtype)
    w = ti.Vector([1.0, b[0] + b[1] - 1.0, -b[0], -b[1]])
    n = p + w[1] * t0 + w[2] * t1 + w[3] * t2
    hint = t1 - t0
    if dtype == dist.PT_P_T:
        n = hint.cross(t2 - t0)
    elif dtype == dist.PT_P_E1:
        hint = t2 - t1
    elif dtype == dist.PT_P_E2:
        hint = t0 - t2
    return w, n, hint, dtype < dist.PT_P_E0


@ti.func
def edge_edge_frame_data(ea0, ea1, eb0, eb1, dtype):
    """(w, n, hint, axis_hint) of an edge-edge pair of type ``dtype``; w over
    (ea0, ea1, eb0, eb1) with sum_i w_i x_i = (closest point on ea) - (closest point on
    eb); n = ea x eb for EA_EB, the vector between the closest points otherwise; hint
    ea (EA_EB and ea's interior), eb (eb's interior) or an axis (endpoint pairs)."""
    st = dist.edge_edge_closest_point(ea0, ea1, eb0, eb1, dtype)
    w = ti.Vector([1.0 - st[0], st[0], st[1] - 1.0, -st[1]])
    n = w[0] * ea0 + w[1] * ea1 + w[2] * eb0 + w[3] * eb1
    hint = ea1 - ea0
    if dtype == dist.EE_EA_EB:
        n = hint.cross(eb1 - eb0)
    elif dtype == dist.EE_EA0_EB or dtype == dist.EE_EA1_EB:
        hint = eb1 - eb0
    return w, n, hint, dtype <= dist.EE_EA1_EB1


@ti.func
def frame_basis(n, hint, axis_hint):
    """Tangent basis (3 x 2) normal to n, first column along ``hint`` (or along the axis
    least aligned with n where ``axis_hint``)."""
    h = hint
    if axis_hint:
        h = _least_aligned_axis(n)
    return tangent_basis_from_normal(n, h)


@ti.func
def point_triangle_frame(p, t0, t1, t2, dtype):
    """(T, w): tangent basis (3 x 2) and closest-point weights (4) of a point-triangle
    pair of type ``dtype`` (see :func:`point_triangle_frame_data`). For P_T, T equals
    ipctk's point_triangle_tangent_basis."""
    w, n, hint, axis = point_triangle_frame_data(p, t0, t1, t2, dtype)
    return frame_basis(n, hint, axis), w


@ti.func
def edge_edge_frame(ea0, ea1, eb0, eb1, dtype):
    """(T, w) of an edge-edge pair of type ``dtype`` (see :func:`edge_edge_frame_data`).
    For EA_EB, T equals ipctk's edge_edge_tangent_basis."""
    w, n, hint, axis = edge_edge_frame_data(ea0, ea1, eb0, eb1, dtype)
    return frame_basis(n, hint, axis), w
