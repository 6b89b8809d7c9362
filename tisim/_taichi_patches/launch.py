"""A shorter Python path for Taichi 1.7 kernel launches (installed by ``backend.init``).

Every kernel call in Taichi 1.7 goes through ``Kernel.__call__``: it rebuilds the full
argument list, extracts a template key from every argument (dtype, dimensions, element
shape, gradient) to find the compiled instance, and then sets each argument on a new
launch context through a chain of ``isinstance`` tests. For our kernels, which take only
scalars, real vectors and arrays (Taichi ndarrays or numpy), that is 25-30 us of Python
for an 8-argument kernel whose body may take less (measured: 41 -> 15 us per launch),
and a cloth Newton iteration launches about 42 of them, a PD frame hundreds.

``install()`` replaces ``Kernel.__call__`` with a path that, per kernel, classifies the
annotations once (a *plan*) and, per call:

- keys the compiled instance by what Taichi's key depends on for these annotations: each
  array argument's element type and dimensions (a numpy array's dtype, dimensions and
  element shape); the first call with a new key goes through Taichi's own path, which
  checks the arguments against the annotations and compiles, and the key is kept;
- checks scalar arguments' types as Taichi does (a float for an integer argument is
  refused with Taichi's own error, by handing the call to Taichi's path);
- sets the arguments on the launch context with the same calls Taichi makes, and
  launches with the same ``compile_kernel`` (Taichi's compiled-kernel cache) and
  ``launch_kernel``, so results are bit for bit the same.

A kernel's return values (real or integer scalars and vectors) are read as Taichi reads
them, after the same synchronisation; a vector is built as ``ti.Vector(entries, dt=...)``
directly, the object Taichi's ``VectorType.__call__`` ends in after 30 us of argument
sorting (an ADMM iteration's sums, a PD iteration's residual: one such launch per
iteration).

Anything else goes through Taichi's path unchanged: kernels with template, struct or
matrix (2-D) arguments (a ``ti.data_oriented`` class's kernels, whose ``self`` is a
template), other return types or ``print``; keyword or missing arguments; an
ndarray with a gradient; a numpy array that is not C-contiguous; autodiff (tapes,
forward mode). After ``ti.reset()`` Taichi empties each kernel's compiled instances,
and a kept key that no longer finds one goes through Taichi's path again.

Applies to: Taichi 1.7; skipped (with a debug log) where its internals are not 1.7's.
Results: bit for bit the same (the same launch calls Taichi makes).
Why here: see ``tisim._taichi_patches``.
"""

from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger(__name__)

# launches that took the short path and those handed to Taichi's (tests read them)
counts = {"short": 0, "taichi": 0}
taichi_call = None  # Taichi's own Kernel.__call__, once replaced


def install() -> bool:
    """Replace ``Kernel.__call__`` (once per process); returns whether it is in place.

    One function on purpose: the replacement call and its helpers close over Taichi's
    internal classes, imported here rather than at module import, so that a Taichi whose
    internals differ leaves the launch path as it is instead of failing to import."""
    try:
        from taichi.lang import impl, kernel_impl, runtime_ops
        from taichi.lang._ndarray import Ndarray
        from taichi.lang.enums import AutodiffMode
        from taichi.lang.matrix import MatrixType, Vector
        from taichi.lang.util import cook_dtype
        from taichi.types import ndarray_type, primitive_types
        from taichi.types.utils import is_signed
    except ImportError as exc:
        log.debug("Taichi's kernel launch path left as it is: %s", exc)
        return False
    global taichi_call
    K = kernel_impl.Kernel
    if getattr(K.__call__, "_tisim", False):
        return True
    taichi_call = K.__call__
    if (
        not hasattr(K, "ensure_compiled")
        or not hasattr(K, "launch_kernel")
        or not hasattr(primitive_types, "real_type_ids")
        or not hasattr(primitive_types, "integer_type_ids")
    ):
        log.debug("Taichi's kernel launch path left as it is: its internals are not 1.7's")
        return False
    from_cpp = getattr(kernel_impl, "handle_exception_from_cpp", None)
    real_ids, int_ids = primitive_types.real_type_ids, primitive_types.integer_type_ids
    NONE = AutodiffMode.NONE

    def scalar_kind(anno):
        if id(anno) in real_ids:
            return "f"
        if id(anno) in int_ids:
            return "i" if is_signed(cook_dtype(anno)) else "u"
        return None

    def returns_of(kernel):
        """[(kind, vector length or None, vector dtype or None)] per return value, [] for
        none, or None when Taichi's path must read them."""
        rets = []
        for r in kernel.return_type or ():
            if isinstance(r, MatrixType) and r.ndim == 1:  # its dtype is cooked: compared by value
                if r.dtype in primitive_types.real_types:
                    rets.append(("f", r.n, r.dtype))
                elif r.dtype in primitive_types.integer_types:
                    rets.append(("i" if is_signed(cook_dtype(r.dtype)) else "u", r.n, r.dtype))
                else:
                    return None
            elif scalar_kind(r):
                rets.append((scalar_kind(r), None, None))
            else:
                return None
        return rets

    def plan_of(kernel):
        """[(kind, extra)] per argument and the return values' reading, or False when a call
        must take Taichi's path."""
        rets = returns_of(kernel)
        if rets is None or kernel.has_print:
            return False
        kinds = []
        for a in kernel.arguments:
            anno = a.annotation
            if scalar_kind(anno):
                kinds.append((scalar_kind(anno), None))
            elif isinstance(anno, ndarray_type.NdarrayType):
                if anno.needs_grad:
                    return False
                kinds.append(("a", anno.dtype.ndim if isinstance(anno.dtype, MatrixType) else 0))
            elif isinstance(anno, MatrixType) and anno.ndim == 1 and anno.dtype in primitive_types.real_types:
                kinds.append(("v", anno))
            else:
                return False
        return {"kinds": kinds, "keys": {}, "rets": rets}

    def call(self, *args, **kwargs):
        plan = self.__dict__.get("_tisim_plan")
        if plan is None:
            plan = self._tisim_plan = plan_of(self)
        rt = self.runtime
        if (
            plan is False
            or kwargs
            or len(args) != len(plan["kinds"])
            or rt.fwd_mode_manager
            or rt.target_tape
            or self.autodiff_mode != NONE
        ):
            counts["taichi"] += 1
            return taichi_call(self, *args, **kwargs)
        sig = []
        for (kind, extra), v in zip(plan["kinds"], args):
            if kind == "a":
                if isinstance(v, Ndarray):
                    if v.grad is not None:
                        break
                    sig.append((v.element_type, len(v.shape)))
                elif isinstance(v, np.ndarray) and v.flags.c_contiguous:
                    sig.append((v.dtype, v.ndim, v.shape[v.ndim - extra :] if extra else ()))
                else:
                    break
            elif (kind == "f" and not isinstance(v, (float, int, np.floating, np.integer))) or (
                kind in ("i", "u") and not isinstance(v, (int, np.integer))
            ):
                break  # Taichi's path raises its error
        else:
            sig = tuple(sig)
            key = plan["keys"].get(sig)
            kernel_cpp = self.compiled_kernels.get(key) if key is not None else None
            if kernel_cpp is not None:
                counts["short"] += 1
                return _launch(self, kernel_cpp, plan, args)
            # a new key (or Taichi was reset): Taichi's checks and compilation, once
            key = self.ensure_compiled(*args)
            plan["keys"][sig] = key
            counts["taichi"] += 1
            return self.launch_kernel(self.compiled_kernels[key], *args)
        counts["taichi"] += 1
        return taichi_call(self, *args, **kwargs)

    def _launch(self, kernel_cpp, plan, args):
        ctx = kernel_cpp.make_launch_context()
        for slot, ((kind, extra), v) in enumerate(zip(plan["kinds"], args)):
            idx = (slot,)
            if kind == "a":
                if isinstance(v, Ndarray):
                    ctx.set_arg_ndarray(idx, v.arr)
                else:
                    shape = v.shape[: v.ndim - extra] if extra else v.shape
                    ctx.set_arg_external_array_with_shape(idx, int(v.ctypes.data), v.nbytes, shape, 0)
            elif kind == "f":
                ctx.set_arg_float(idx, float(v))
            elif kind == "i":
                ctx.set_arg_int(idx, int(v))
            elif kind == "u":
                ctx.set_arg_uint(idx, int(v))
            else:  # a real vector: what Taichi's set_kernel_struct_args sets, entry by entry,
                # without building the ti.Vector it takes (a quarter of a launch's Python)
                for i in range(extra.n):
                    ctx.set_struct_arg_float((slot, i), float(v[i]))
        prog = impl.get_runtime().prog
        try:
            prog.launch_kernel(prog.compile_kernel(prog.config(), prog.get_device_caps(), kernel_cpp), ctx)
        except Exception as e:
            if from_cpp is None:
                raise
            raise from_cpp(e) from None
        rets = plan["rets"]
        if not rets:
            return None
        runtime_ops.sync()  # as Taichi's launch_kernel does before reading a return value
        out = []
        for i, (kind, n, dtype) in enumerate(rets):
            get = (
                ctx.get_struct_ret_float
                if kind == "f"
                else ctx.get_struct_ret_int
                if kind == "i"
                else ctx.get_struct_ret_uint
            )
            if n is None:
                out.append(get((i,)))
            else:
                cast = float if kind == "f" else int
                out.append(Vector([cast(get((i, j))) for j in range(n)], dt=dtype))
        return out[0] if len(out) == 1 else out

    call._tisim = True
    call.__doc__ = taichi_call.__doc__
    K.__call__ = call
    return True
