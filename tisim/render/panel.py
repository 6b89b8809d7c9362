"""How the live panel shows a tunable: its unit, the number it displays, and the value it
passes on (exactly the number shown, never the float32 the slider held).

Every tunable is shown in units (``dt = 10 ms``, ``grab.stiffness = 250 N/m``), never as a
log exponent; the slider runs linearly over the tunable's range in those units, and a
tunable with a log range also gets halve / double buttons to reach the small end. A value
the panel passes on is rounded to the 4 significant digits it displays, so a refine
launched from the panel gets ``contact.mu=0.394``, not ``0.39399999380111694``.
"""

from __future__ import annotations

import math

# name -> (unit shown, factor from SI to that unit)
UNITS: dict[str, tuple[str, float]] = {
    "dt": ("ms", 1e3),
    "stiffness": ("x E", 1.0),  # a scale on the scene's Young's moduli
    "iterations": ("", 1.0),
    "contact.mu": ("", 1.0),
    "grab.stiffness": ("N/m", 1.0),
    "youngs_modulus": ("kPa", 1e-3),
    "wind_x": ("m/s", 1.0),
    "wind_z": ("m/s", 1.0),
    "velocity_x": ("m/s", 1.0),
    "velocity_y": ("m/s", 1.0),
    "velocity_z": ("m/s", 1.0),
}
INTEGER = {"iterations"}
DIGITS = 4


def unit(name: str) -> tuple[str, float]:
    return UNITS.get(name, ("", 1.0))


def shown_value(t, value: float) -> float:
    """``value`` (SI) rounded to what the panel displays for tunable ``t`` (a
    ``tisim.solvers.base.Tunable``): an integer for counts, else 4 significant digits in
    the displayed unit; kept inside [t.low, t.high]."""
    v = float(value)
    if not math.isfinite(v):
        return float(t.value)
    if t.name in INTEGER:
        return float(min(max(round(v), math.ceil(t.low)), math.floor(t.high)))
    _, f = unit(t.name)
    r = float(f"{v * f:.{DIGITS}g}") / f
    r = float(f"{r:.12g}")  # 10.0 / 1e3 -> 0.01, not 0.010000000000000002
    return min(max(r, float(t.low)), float(t.high))


def label(name: str, value: float) -> str:
    """``name = value unit`` as the panel shows it."""
    u, f = unit(name)
    if name in INTEGER:
        return f"{name} = {round(value)}"
    return f"{name} = {value * f:.{DIGITS}g}" + (f" {u}" if u else "")


def slider_range(t) -> tuple[float, float]:
    """The slider's (low, high) in the displayed unit."""
    _, f = unit(t.name)
    return float(t.low) * f, float(t.high) * f


def overlay_lines(time: float, frame: int, params=(), *, energy: float | None = None, rate: str = "") -> list[str]:
    """The overlay's text block: time and frame, ``rate`` (FPS, or the video's slow-motion
    factor), the key parameters (``params``: Tunables, shown as the panel shows them, two
    to a line) and the total energy (J) where the solver reports one."""
    lines = [f"t = {time:.3f} s   frame {frame}" + (f"   {rate}" if rate else "")]
    shown = [label(t.name, t.value) for t in params if t.name != "grab.stiffness"]
    for i in range(0, len(shown), 2):
        lines.append("   ".join(shown[i : i + 2]))
    if energy is not None and math.isfinite(energy):
        lines.append(f"energy {energy:.4g} J")
    return lines
