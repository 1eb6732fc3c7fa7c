"""Hyperparameter classes: frozen dataclasses and pytrees (one JAX leaf per field, so ``vmap`` batches
any field) whose fields are declared with a default and an allowed range::

    @hyperparams
    class PPOParams:
        lr: float = param(2.5e-4, 0.0, 1.0, low_inclusive=False, doc="Adam step")

Imports nothing from the rest of ``coevo_jax``."""
from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

INF = math.inf
#: method names of the hyperparameter classes and of ``HParams``: no field may take them
RESERVED_NAMES = frozenset({"replace", "as_dict"})


class ConfigError(ValueError):
    """A configuration value outside its allowed range (raised before compiling)."""


@dataclasses.dataclass(frozen=True)
class Param:
    """One hyperparameter: default and range ``low .. high`` (each end inclusive or not); ``integer``
    params are int32 leaves holding whole numbers, others float32."""

    default: float
    low: float
    high: float
    low_inclusive: bool = True
    high_inclusive: bool = True
    integer: bool = False
    doc: str = ""

    def __post_init__(self):
        if self.outside(np.asarray(self.default)).any():
            raise ConfigError(f"Param default {self.default} is outside its own range {self.range_text()}")

    def range_text(self) -> str:
        """``[lo, hi)`` style text of the range."""
        return f"{'[' if self.low_inclusive else '('}{self.low}, {self.high}{']' if self.high_inclusive else ')'}"

    def outside(self, arr: np.ndarray) -> np.ndarray:
        """Bool mask (shape of ``arr``) of non-finite or out-of-range values."""
        arr = np.asarray(arr, np.float64)
        below = arr < self.low if self.low_inclusive else arr <= self.low
        above = arr > self.high if self.high_inclusive else arr >= self.high
        return ~np.isfinite(arr) | below | above

    @property
    def dtype(self):
        """The leaf's dtype: int32 for integer params, float32 otherwise."""
        return jnp.int32 if self.integer else jnp.float32


def declare(p: Param) -> Any:
    """The dataclass field of ``p``: default ``p.default``, ``p`` in its metadata."""
    return dataclasses.field(default=p.default, metadata={"param": p})


def param(default: float, low: float, high: float, low_inclusive: bool = True, high_inclusive: bool = True,
          integer: bool = False, doc: str = "") -> Any:
    """A field with its default and allowed range (see :class:`Param`)."""
    return declare(Param(default, low, high, low_inclusive, high_inclusive, integer, doc))


def unit(default: float, doc: str = "") -> Any:
    """A value in ``[0, 1]`` (a step size, a fraction, a 0/1 switch)."""
    return param(default, 0.0, 1.0, doc=doc)


def weight(default: float, doc: str = "") -> Any:
    """A non-negative finite weight, ``[0, inf)``."""
    return param(default, 0.0, INF, high_inclusive=False, doc=doc)


def grad_clip(default: float, doc: str = "") -> Any:
    """A global-norm clip (or any positive finite scale), ``(0, inf)``."""
    return param(default, 0.0, INF, False, False, doc=doc)


def default_of(cls: type, name: str, default: float) -> Any:
    """``cls``'s field ``name`` (same range and doc) with another default, for a subclass."""
    return declare(dataclasses.replace(declarations(cls)[name], default=default))


@typing.dataclass_transform(frozen_default=True, field_specifiers=(param, unit, weight, grad_clip, declare,
                                                                      default_of, dataclasses.field))
def hyperparams(cls: type) -> type:
    """Make ``cls`` a frozen dataclass and pytree, every field declared with :func:`param` (or a helper);
    subclasses add fields or change defaults (:func:`default_of`) and are decorated too.
    ``obj.replace(**fields)`` returns a cast copy. :class:`ConfigError` on an undeclared or reserved field."""
    cls = dataclasses.dataclass(frozen=True)(cls)
    for f in dataclasses.fields(cls):
        if not isinstance(f.metadata.get("param"), Param):
            raise ConfigError(f"{cls.__name__}.{f.name} must be declared with param(...) (a default and a range)")
        if f.name.startswith("_") or f.name in RESERVED_NAMES:
            raise ConfigError(f"{cls.__name__}.{f.name}: a hyperparameter name must not start with '_' nor be one"
                              f" of {', '.join(sorted(RESERVED_NAMES))}")
    cls.replace = _replace
    cls._is_hyperparams = True  # set on each decorated class (is_hyperparams reads the class's own dict)
    return jax.tree_util.register_dataclass(cls, data_fields=[f.name for f in dataclasses.fields(cls)],
                                            meta_fields=[])


def _replace(self, **changes):
    """A copy with ``changes`` cast to each field's dtype."""
    decls = declarations(type(self))
    unknown = [n for n in changes if n not in decls]
    if unknown:
        raise ConfigError(f"unknown {type(self).__name__} field {unknown[0]!r}; fields are {', '.join(decls)}")
    return dataclasses.replace(self, **{n: cast_value(n, v, decls[n]) for n, v in changes.items()})


def is_hyperparams(cls: Any) -> bool:
    """Whether ``cls`` itself (not only a base) was declared with :func:`hyperparams`."""
    return isinstance(cls, type) and cls.__dict__.get("_is_hyperparams", False)


def declarations(cls_or_obj: Any) -> dict[str, Param]:
    """``{field: Param}`` of a :func:`hyperparams` class (or instance), in field order."""
    return {f.name: f.metadata["param"] for f in dataclasses.fields(cls_or_obj)}


def cast_value(name: str, value, p: Param):
    """``value`` as a JAX array of ``p``'s dtype (tracers cast, not checked); :class:`ConfigError`
    naming ``HParams.<name>`` for a non-number or a non-integer integer param."""
    if isinstance(value, jax.core.Tracer):
        return value if value.dtype == p.dtype else value.astype(p.dtype)
    if isinstance(value, jax.Array) and value.dtype == p.dtype:
        return value
    arr = np.asarray(value)
    if arr.dtype.kind not in "biuf":
        raise ConfigError(f"HParams.{name}: expected a number, got {value!r}")
    if p.integer and np.any(arr != np.round(arr)):
        raise ConfigError(f"HParams.{name}: must be an integer, got {arr.tolist()}")
    return jnp.asarray(arr, p.dtype)


def cast(obj):
    """``obj`` (a :func:`hyperparams` instance) with every leaf a JAX array of its field's dtype."""
    decls = declarations(obj)
    return dataclasses.replace(obj, **{n: cast_value(n, getattr(obj, n), p) for n, p in decls.items()})


def check(obj) -> None:
    """:class:`ConfigError` naming the first field of ``obj`` (scalar or batched) that is not a finite
    number in its range; tracers are skipped."""
    for name, p in declarations(obj).items():
        v = getattr(obj, name)
        if isinstance(v, jax.core.Tracer):
            continue
        arr = np.asarray(v)
        if arr.dtype.kind not in "biuf":
            raise ConfigError(f"HParams.{name}: expected a number, got {v!r}")
        if p.integer and np.any(arr != np.round(arr)):
            raise ConfigError(f"HParams.{name}: must be an integer, got {arr.tolist()}")
        bad = p.outside(arr)
        if np.any(bad):
            shown = arr[bad].ravel()[0]  # numpy scalar: prints -0.1, not -0.10000000149
            raise ConfigError(f"HParams.{name}={shown!s} is outside the allowed range {p.range_text()}")


__all__ = ["INF", "ConfigError", "Param", "cast", "cast_value", "check", "declarations", "declare", "default_of",
           "grad_clip", "hyperparams", "is_hyperparams", "param", "unit", "weight"]
