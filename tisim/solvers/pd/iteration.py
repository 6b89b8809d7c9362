"""The local-global iterations of one PD time step (:meth:`SolverPD.step` sets the step up
and reads the result): local step and residual, convergence test, global step, and the
contact update between global steps."""

from __future__ import annotations

import math
import time

import numpy as np


class StepIterations:
    """Iterate one step's local-global map on the device.

    Convergence: the relative momentum residual res = ||r|| / (||r_0|| + floor), floor the
    round-off level of the right-hand side (a body at rest reports ~0, not noise / noise),
    against ``config.tolerance`` (0: a fixed iteration count). GPU backends leave each plain
    iteration's ||r||^2 on the device and read them every ``residual_interval`` iterations
    (tolerance > 0) or once after the loop: a read is a synchronisation (the host waits for
    the queue to drain). With contact too when its update runs on the device (it reads
    nothing either), except in an iteration whose contact forces are on the host (the
    step's first: detection and the Delassus operator); not with Anderson (its safeguard
    decides per iteration).
    """

    def __init__(self, solver, gs, h: float, drag, accel):
        self.s, self.gs, self.accel = solver, gs, accel
        self.k = solver.kernels
        self.h2 = h * h
        self.drag_v, self.drag_t, self.coef, self.column = drag
        self.kdrag = solver.config.handle_stiffness if self.drag_v >= 0 else 0.0
        self.floor = (
            1e-12 * float(np.linalg.norm(solver.model.mass * np.linalg.norm(solver._x_tilde, axis=1))) / self.h2
        )
        self.tol = float(solver.config.tolerance)
        self.rot_iters = int(solver.config.rotation_iterations)
        self.interval = int(solver.residual_interval)
        contact = solver.contact
        self.stored = self.interval != 1 and accel is None and (contact is None or contact.implementation == "device")
        self.res0 = self.res = math.nan
        self.unread = 0  # the first iteration whose stored residual is not read yet
        self.local_steps = 0
        self.done = 0
        self.converged = True
        self.t_local = self.t_global = self.t_contact = 0.0

    def _relative(self, rsq, first: bool) -> float:
        gnorm = math.sqrt(max(float(rsq), 0.0)) / self.h2
        if first:
            self.res0 = gnorm
        self.res = gnorm / (self.res0 + self.floor) if self.res0 + self.floor > 0 else 0.0
        return self.res

    def read_stored(self, upto: int) -> float:
        """Residuals of iterations unread..upto-1 from the device; returns the last res."""
        for j, value in enumerate(self.k.read_rsq(upto)[self.unread :], start=self.unread):
            if self._relative(value, j == 0) < self.tol and self.tol > 0:
                break
        self.unread = upto
        return self.res

    def _local(self, it: int, gidx, gout, fdev):
        """The local step with the residual's squared norm (None when left on the device)."""
        k, A, h2 = self.k, self.s._A_dev, self.h2
        if self.stored:
            k.iterate_stored(it, self.rot_iters, A, h2, self.drag_v, self.kdrag, self.drag_t, gidx, gout, fdev, h2)
            return None
        if self.accel is None:
            return k.iterate(self.rot_iters, A, h2, self.drag_v, self.kdrag, self.drag_t, gidx, gout, fdev, h2)
        accel = self.accel
        # the safeguard may replace the iterate (then the local step runs again)
        return accel.safeguard(
            k,
            lambda slot, count, record: k.iterate_anderson(
                self.rot_iters,
                A,
                h2,
                self.drag_v,
                self.kdrag,
                self.drag_t,
                gidx,
                gout,
                accel.arrays,
                slot,
                count,
                record,
            ),
        )

    def _solve(self, exact: bool, gathered: bool) -> None:
        tb = time.perf_counter()
        self.s._solve(self.gs, self.drag_v, self.coef, self.column, exact=exact, gathered=gathered)
        self.t_global += time.perf_counter() - tb

    def _contact_update(self, on_device: bool, force, gidx, gout) -> None:
        """Update the contact forces at the new iterate and correct it with an exact solve."""
        s, k = self.s, self.k
        tc = time.perf_counter()
        if on_device:  # the iterate and the forces stay on the device
            s.contact.update_device(k.x)
            k.set_residual_difference(s.contact.force_device(), k.kept, self.h2, gidx, gout)  # and gathered
        else:  # numpy contact, or the step's first update (detection, W on the host)
            k.read_x(s._xout)
            s.contact.update(s._xout)
            df = s.contact.force() - force
            k.set_residual(np.ascontiguousarray(df), self.h2)
        self.t_contact += time.perf_counter() - tc
        self._solve(exact=True, gathered=on_device)

    def run(self) -> None:
        s, k = self.s, self.k
        contact = s.contact
        tol = self.tol
        for it in range(s._iterations):
            ta = time.perf_counter()
            gidx, gout = self.gs.gather_target(k)
            # contact forces on the device (after this step's first contact update) enter
            # the residual inside the local step's launch: A q = b + h^2 H^T lambda
            # (notes §2.4), so r is the momentum residual; nothing of size n crosses
            fdev = contact.force_device() if contact is not None else None
            self.local_steps = it + 1
            rsq = self._local(it, gidx, gout, fdev)
            self.t_local += time.perf_counter() - ta
            force = None
            gathered = True
            on_device = fdev is not None  # this iteration's contact forces stay in Taichi arrays
            if contact is not None and not on_device:
                tc = time.perf_counter()
                force = np.ascontiguousarray(contact.force())
                if np.any(force):  # A q = b + h^2 H^T lambda (notes §2.4)
                    k.add_to_residual(force, self.h2)
                    rsq = k.residual_norm_sq()  # the momentum residual includes the contact forces
                    gathered = False
                self.t_contact += time.perf_counter() - tc
            if rsq is not None:
                # read here (the stored norm misses the contact forces the host added)
                if self.stored and self.unread < it:
                    self.read_stored(it)  # the stored norms before this one, in order
                self.unread = it + 1
                if self._relative(rsq, it == 0) < tol and tol > 0:
                    break
            elif (
                tol > 0 and self.local_steps - self.unread >= self.interval and self.read_stored(self.local_steps) < tol
            ):
                break
            self._solve(exact=False, gathered=gathered)
            if contact is not None and contact.active:
                self._contact_update(on_device, force, gidx, gout)
            self.done = it + 1
            if s.iteration_callback is not None:
                k.read_x(s._xout)
                s.iteration_callback(it, s._xout.copy())
        if self.stored and self.unread < self.local_steps:
            self.read_stored(self.local_steps)
        if tol > 0 and not (self.res < tol):
            self.converged = False
