"""Frozen, keyword-only configuration dataclasses built from plain dicts (TOML).

``from_dict(cls, data, path)`` validates types, ranges and unknown keys and
raises :class:`ConfigError` naming the dotted key and what was expected. Range
rules live in field metadata (see :func:`num`), so every config class states its
own limits next to its defaults.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Literal, get_args, get_origin

Vec3 = tuple[float, float, float]
Int3 = tuple[int, int, int]


class ConfigError(ValueError):
    """A bad configuration value. ``key`` is the dotted path, e.g. ``objects.ball.density``."""

    def __init__(self, key: str, message: str, source: str | None = None):
        self.key = key
        self.detail = message
        self.source = source
        super().__init__(self._text())

    def _text(self) -> str:
        where = f"{self.source}: " if self.source else ""
        return f"{where}{self.key}: {self.detail}" if self.key else f"{where}{self.detail}"

    def with_source(self, source: str) -> ConfigError:
        return ConfigError(self.key, self.detail, source)


def num(default, *, gt=None, ge=None, lt=None, le=None, doc: str = ""):
    """A numeric dataclass field with range limits checked by :func:`from_dict`."""
    meta = {k: v for k, v in {"gt": gt, "ge": ge, "lt": lt, "le": le}.items() if v is not None}
    meta["doc"] = doc
    return dataclasses.field(default=default, metadata=meta)


def _describe(tp) -> str:
    origin = get_origin(tp)
    if tp is float:
        return "a number"
    if tp is int:
        return "an integer"
    if tp is bool:
        return "true or false"
    if tp is str:
        return "a string"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin is tuple:
        args = get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s"
        return f"a list of {len(args)} {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s"
    if origin is dict:
        return "a table"
    if dataclasses.is_dataclass(tp):
        return "a table"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in get_args(tp) if a is not type(None))
    return str(tp)


def _convert(tp, value, key: str):
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(a, value, key)
            except ConfigError as e:
                errors.append(e)
        raise ConfigError(key, f"expected {_describe(tp)}, got {value!r}")
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(key, f"expected true or false, got {value!r}")
    if tp is float:
        if value in ("inf", "+inf", "-inf"):  # how to_dict writes infinities for JSON
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, f"expected a number, got {value!r}")
        if math.isnan(value):
            raise ConfigError(key, f"expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(key, f"expected an integer, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(key, f"expected a string, got {value!r}")
        return value
    if origin is Literal:
        if value not in get_args(tp):
            raise ConfigError(key, f"expected {_describe(tp)}, got {value!r}")
        return value
    if origin is tuple:
        args = get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(key, f"expected {_describe(tp)}, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{key}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ConfigError(key, f"expected {_describe(tp)}, got {value!r}")
        return tuple(_convert(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if origin is dict:
        _kt, vt = get_args(tp)
        if not isinstance(value, dict):
            raise ConfigError(key, f"expected a table, got {value!r}")
        return {str(k): _convert(vt, v, f"{key}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, key)
    raise TypeError(f"unsupported config type {tp!r} at {key}")


def _check_finite(f: dataclasses.Field, value, key: str):
    """Refuse an infinite number (TOML's ``inf``, or ``1e400``) unless the field's own
    default is infinite (a time that never comes, an unbounded length): elsewhere it
    passed the range checks and ended in an internal error or NaN energies."""
    if isinstance(f.default, float) and math.isinf(f.default):
        return
    values = value if isinstance(value, tuple) else (value,)
    for i, v in enumerate(values):
        if isinstance(v, float) and math.isinf(v):
            where = f"{key}[{i}]" if isinstance(value, tuple) else key
            raise ConfigError(where, f"expected a finite number, got {v!r}")


def _check_range(f: dataclasses.Field, value, key: str):
    if value is None or not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    m = f.metadata
    if "gt" in m and not value > m["gt"]:
        raise ConfigError(key, f"expected a number > {m['gt']}, got {value!r}")
    if "ge" in m and not value >= m["ge"]:
        raise ConfigError(key, f"expected a number >= {m['ge']}, got {value!r}")
    if "lt" in m and not value < m["lt"]:
        raise ConfigError(key, f"expected a number < {m['lt']}, got {value!r}")
    if "le" in m and not value <= m["le"]:
        raise ConfigError(key, f"expected a number <= {m['le']}, got {value!r}")


def from_dict(cls, data, prefix: str = ""):
    """Build the frozen dataclass ``cls`` from ``data`` (a dict), validating every key."""
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise ConfigError(prefix, f"expected a table, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for k in data:
        if k not in fields:
            known = ", ".join(sorted(fields))
            raise ConfigError(_join(prefix, k), f"unknown key (known keys here: {known})")
    kwargs = {}
    for name, f in fields.items():
        key = _join(prefix, name)
        if name in data:
            value = _convert(hints[name], data[name], key)
            _check_finite(f, value, key)
            _check_range(f, value, key)
            if isinstance(value, tuple):
                for i, v in enumerate(value):
                    _check_range(f, v, f"{key}[{i}]")
            kwargs[name] = value
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(_join(prefix, e.key), e.detail) from None
    except TypeError as e:
        raise ConfigError(prefix, str(e)) from None


def to_dict(obj) -> Any:
    """The plain-dict (TOML/JSON-able) form of a config dataclass."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, float) and math.isinf(obj):
        return "inf" if obj > 0 else "-inf"
    return obj


def _join(prefix: str, key: str) -> str:
    if not key:
        return prefix
    return f"{prefix}.{key}" if prefix else key


def field_docs(cls) -> dict[str, str]:
    return {f.name: f.metadata.get("doc", "") for f in dataclasses.fields(cls)}
