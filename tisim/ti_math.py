"""log, atan2, sin and cos as ``@ti.func``s that also compile in f64 on SPIR-V backends.

Taichi's SPIR-V code generator (Vulkan, Metal, OpenGL) maps these functions to
GLSL.std.450 instructions, which exist for 16- and 32-bit floats only: a kernel that
calls ``ti.log`` on an f64 value fails to compile there ("Instruction Log(28) does not
64bits operation"). Where that is the case (decided when a kernel is compiled), the
functions below evaluate in f64 arithmetic instead:

- log x: exact range reduction x = m 2^e by powers of two (m in [sqrt(1/2), sqrt(2)]),
  then log m = 2 atanh(s), s = (m - 1)/(m + 1), |s| <= 0.172, by its odd series to
  s^25 (the first omitted term is below 1e-19 relative);
- atan t (|t| <= 1): two half-angle reductions t <- t / (1 + sqrt(1 + t^2)) to
  |t| <= tan(pi/16) = 0.199, then the odd series to t^27 (omitted term < 1e-20);
  atan2 by the usual octant logic;
- sin / cos: reduced to [-pi/4, pi/4] by the nearest multiple k of pi/2 (a two-part
  pi/2; Taichi's fast math may fold the two parts, which costs ~|k| ulp), then Taylor
  series to x^25 / x^24.

Accuracy: 1e-15 absolute or better over the ranges the solvers use (log over
1e-300..1e300, atan2 everywhere, sin/cos on |x| <= 4; tested against numpy).
Everywhere else (CPU and CUDA backends, and f32 on SPIR-V) they are ``ti.log``,
``ti.atan2``, ``ti.sin``, ``ti.cos``.

This module has no ``from __future__ import annotations``: Taichi reads annotations.
"""

import math

import taichi as ti

_LN2 = 0.6931471805599453
_SQRT2 = 1.4142135623730951
_PI = math.pi
_PI_2_HI = 1.5707963267341256  # pi/2 split in two parts: hi has 26 significant bits,
_PI_2_LO = 6.077100506506192e-11  # so k * hi is exact for |k| < 2^26
# series coefficients, highest order first (Horner): log's 1/(2k+1), atan's (-1)^k/(2k+1),
# sin's (-1)^j/(2j+1)!, cos's (-1)^j/(2j)!
_LOG_C = tuple(1.0 / (2 * k + 1) for k in range(12, -1, -1))
_ATAN_C = tuple((-1.0) ** k / (2 * k + 1) for k in range(13, -1, -1))
_SIN_C = tuple((-1.0) ** j / math.factorial(2 * j + 1) for j in range(12, -1, -1))
_COS_C = tuple((-1.0) ** j / math.factorial(2 * j) for j in range(12, -1, -1))


def soft_f64() -> bool:
    """Whether the f64 functions must be evaluated in software here (SPIR-V backends in
    f64). Evaluated when a kernel is compiled."""
    from taichi.lang import impl

    spirv = tuple(a for a in (getattr(ti, n, None) for n in ("vulkan", "metal", "opengl", "gles")) if a is not None)
    return impl.current_cfg().arch in spirv and impl.get_runtime().default_fp == ti.f64


@ti.func
def _log_soft(x):
    out = ti.math.nan
    if x == 0.0:
        out = -ti.math.inf
    elif x > 0.0 and x < ti.math.inf:
        m = x
        e = 0.0
        while m > 4294967296.0:
            m *= 2.3283064365386963e-10
            e += 32.0
        while m < 2.3283064365386963e-10:
            m *= 4294967296.0
            e -= 32.0
        while m > _SQRT2:
            m *= 0.5
            e += 1.0
        while m < 0.5 * _SQRT2:
            m *= 2.0
            e -= 1.0
        s = (m - 1.0) / (m + 1.0)
        s2 = s * s
        acc = 0.0
        for k in ti.static(range(len(_LOG_C))):  # Horner in s^2
            acc = acc * s2 + _LOG_C[k]
        out = e * _LN2 + 2.0 * s * acc
    elif x == ti.math.inf:
        out = x
    return out


@ti.func
def log(x):
    """Natural logarithm (nan for x < 0, -inf at 0)."""
    r = x
    if ti.static(soft_f64()):
        r = _log_soft(x)
    else:
        r = ti.log(x)
    return r


@ti.func
def _atan_unit(t):
    """atan t for |t| <= 1."""
    u = t
    for _ in ti.static(range(2)):
        u = u / (1.0 + ti.sqrt(1.0 + u * u))
    u2 = u * u
    acc = 0.0
    for k in ti.static(range(len(_ATAN_C))):  # Horner in u^2
        acc = acc * u2 + _ATAN_C[k]
    return 4.0 * u * acc


@ti.func
def _atan2_soft(y, x):
    ax = ti.abs(x)
    ay = ti.abs(y)
    a = 0.0
    if ax == 0.0 and ay == 0.0:
        a = 0.0
    elif ay <= ax:
        a = _atan_unit(ay / ax)
    else:
        a = 0.5 * _PI - _atan_unit(ax / ay)
    if x < 0.0:
        a = _PI - a
    if y < 0.0:
        a = -a
    return a


@ti.func
def atan2(y, x):
    """The angle of (x, y) in (-pi, pi], radians."""
    r = y
    if ti.static(soft_f64()):
        r = _atan2_soft(y, x)
    else:
        r = ti.atan2(y, x)
    return r


@ti.func
def _sincos_soft(x):
    """(sin x, cos x) for |x| < ~1e8."""
    k = ti.round(x * (2.0 / _PI))
    r = (x - k * _PI_2_HI) - k * _PI_2_LO
    r2 = r * r
    s = 0.0
    c = 0.0
    for j in ti.static(range(len(_SIN_C))):  # Horner in r^2
        s = s * r2 + _SIN_C[j]
        c = c * r2 + _COS_C[j]
    s *= r
    q = ti.cast(k, ti.i32) & 3
    sn = s
    cs = c
    if q == 1:
        sn, cs = c, -s
    elif q == 2:
        sn, cs = -s, -c
    elif q == 3:
        sn, cs = -c, s
    return sn, cs


@ti.func
def sin(x):
    r = x
    if ti.static(soft_f64()):
        r, _c = _sincos_soft(x)
    else:
        r = ti.sin(x)
    return r


@ti.func
def cos(x):
    r = x
    if ti.static(soft_f64()):
        _s, r = _sincos_soft(x)
    else:
        r = ti.cos(x)
    return r
