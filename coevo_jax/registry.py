"""Reward methods as data: each method is one :class:`MethodSpec`, registered by
the module that implements it.

A spec names the method, its signal factory, the :class:`Param` s (the
``HParams`` fields) it owns, the defaults it runs with, whether it pays a
separate intrinsic stream (a second critic head), its ``StaticConfig`` checks,
the optional environment outputs it needs, and the ``HParams`` overrides that
switch its contribution off. Everything else is built from the registry:
``HParams`` and its ranges (:func:`hparam_declarations`), ``default_hparams``,
``validate_static``, ``StaticConfig.value_heads`` and ``make_signal``.

The core fields (PPO, reward mixing, ``k``) are declared by
:mod:`coevo_jax.config` through :func:`declare_core_params`; the built-in
methods register when :mod:`coevo_jax.signals` is imported (``import
coevo_jax`` does). This module imports nothing from the rest of ``coevo_jax``
(``ConfigError`` lives here; :mod:`coevo_jax.config` re-exports it).
"""
from __future__ import annotations

import dataclasses
import math
import types
from typing import Callable, Mapping

import numpy as np
from envs_jax.core import OPTIONAL_OUTPUTS  # (envs_jax depends on nothing in coevo_jax)

INF = math.inf
#: attribute names of ``HParams`` itself: no hyperparameter may take them
RESERVED_NAMES = frozenset({"replace", "as_dict"})


class ConfigError(ValueError):
    """A configuration value outside its allowed range (raised before compiling)."""


@dataclasses.dataclass(frozen=True)
class Param:
    """One hyperparameter: its default and its allowed range.

    The range is ``low .. high``, each end inclusive or not; ``integer`` params
    are int32 leaves (float32 otherwise) and must hold whole numbers.
    """

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
        """Bool mask (shape of ``arr``) of values that are non-finite or out of range."""
        arr = np.asarray(arr, np.float64)
        below = arr < self.low if self.low_inclusive else arr <= self.low
        above = arr > self.high if self.high_inclusive else arr >= self.high
        return ~np.isfinite(arr) | below | above


def unit(default: float, doc: str = "") -> Param:
    """A value in ``[0, 1]`` (a step size, a fraction, a 0/1 switch)."""
    return Param(default, 0.0, 1.0, doc=doc)


def weight(default: float, doc: str = "") -> Param:
    """A non-negative finite weight, ``[0, inf)``."""
    return Param(default, 0.0, INF, high_inclusive=False, doc=doc)


def grad_clip(default: float, doc: str = "") -> Param:
    """A global-norm clip (or any positive finite scale), ``(0, inf)``."""
    return Param(default, 0.0, INF, False, False, doc=doc)


def _frozen(mapping: Mapping | None) -> Mapping | None:
    return None if mapping is None else types.MappingProxyType(dict(mapping))


@dataclasses.dataclass(frozen=True, eq=False)
class MethodSpec:
    """One reward method.

    ``factory(static, network, env, env_params) -> Signal``. ``params``: the
    ``HParams`` fields this method owns (a field may be declared by several
    specs only with equal declarations). ``defaults``: values of any field
    this method runs with by default. ``intrinsic_stream``: the signal pays a
    non-episodic bonus stream (the policy gets a second critic head).
    ``static_checks``: ``StaticConfig`` integer field -> inclusive ``(lo,
    hi)``; ``check_static(static)`` raises :class:`ConfigError` for anything
    else. ``requires``: the environment's optional outputs the method reads
    (``envs_jax.core.OPTIONAL_OUTPUTS``). ``off``: the ``HParams`` overrides
    under which the method's rewards give exactly sparse PPO's advantages
    (``None`` where that does not apply). ``program``: another registered
    method whose compiled program this one runs, told apart only by HParams
    values (its ``defaults``): the same factory and streams, so the runner
    compiles one program for both (``""``: its own). ``tune``: the method's
    own key hyperparameters that equal-budget tuning searches
    (``sweeps/_study/tuning.py``, beside the policy's ``lr`` and
    ``ent_coef`` that every method searches), field -> ``(low, high)``,
    sampled log-uniformly: ``0 < low < high``, inside the field's range.
    """

    name: str
    factory: Callable
    params: Mapping[str, Param] = dataclasses.field(default_factory=dict)
    defaults: Mapping[str, float] = dataclasses.field(default_factory=dict)
    intrinsic_stream: bool = False
    static_checks: Mapping[str, tuple] = dataclasses.field(default_factory=dict)
    check_static: Callable | None = None
    requires: tuple = ()
    off: Mapping[str, float] | None = None
    program: str = ""
    doc: str = ""
    tune: Mapping[str, tuple] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        for name in ("params", "defaults", "static_checks", "off", "tune"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))
        object.__setattr__(self, "requires", tuple(self.requires))


_CORE: dict[str, Param] = {}
_METHODS: dict[str, MethodSpec] = {}
_DECLARED: list = []  # cache of hparam_declarations() (cleared on every change)


def declare_core_params(params: Mapping[str, Param]) -> None:
    """Set the fields every method has (PPO, reward mixing, ``k``); called by :mod:`coevo_jax.config`."""
    for name, p in params.items():
        _check_param(name, p, "core")
    _CORE.clear()
    _CORE.update(params)
    _DECLARED.clear()


def _check_param(name: str, p: Param, owner: str) -> None:
    if not isinstance(p, Param):
        raise ConfigError(f"{owner}: declaration of {name!r} must be a Param, got {p!r}")
    if not name.isidentifier() or name.startswith("_") or name in RESERVED_NAMES:
        raise ConfigError(f"{owner}: {name!r} cannot be an HParams field (an identifier not starting with '_',"
                          f" not one of {', '.join(sorted(RESERVED_NAMES))})")


def _merge(decls: dict, params: Mapping[str, Param], owner: str) -> dict:
    """``decls`` plus ``params``, a field declared again only with an equal declaration."""
    out = dict(decls)
    for name, p in params.items():
        _check_param(name, p, f"method {owner!r}")
        if name in out and out[name] != p:
            raise ConfigError(f"method {owner!r} declares HParams.{name} as {p}, but it is already declared as"
                              f" {out[name]}")
        out.setdefault(name, p)
    return out


def _declarations(specs) -> dict[str, Param]:
    decls = dict(_CORE)
    for spec in specs:
        decls = _merge(decls, spec.params, spec.name)
    return decls


def _check_values(values: Mapping | None, decls: dict, owner: str, what: str) -> None:
    for field, v in (values or {}).items():
        if field not in decls:
            raise ConfigError(f"method {owner!r}: {what} names unknown HParams field {field!r};"
                              f" fields are {', '.join(decls)}")
        if decls[field].outside(np.asarray(v)).any():
            raise ConfigError(f"method {owner!r}: {what} HParams.{field}={v} is outside the allowed range"
                              f" {decls[field].range_text()}")


def register_method(spec: MethodSpec) -> MethodSpec:
    """Add ``spec`` (its fields join ``HParams``). Raises :class:`ConfigError` for a
    taken name, a conflicting field declaration or defaults/overrides out of range."""
    if not isinstance(spec, MethodSpec) or not isinstance(spec.name, str) or not spec.name:
        raise ConfigError(f"register_method expects a MethodSpec with a non-empty name, got {spec!r}")
    if spec.name in _METHODS:
        raise ConfigError(f"method {spec.name!r} is already registered (unregister_method it first)")
    decls = _declarations(list(_METHODS.values()) + [spec])
    _check_values(spec.defaults, decls, spec.name, "defaults")
    _check_values(spec.off, decls, spec.name, "off")
    unknown = [r for r in spec.requires if r not in OPTIONAL_OUTPUTS]
    if unknown:
        raise ConfigError(f"method {spec.name!r} requires unknown env output(s) {unknown}; expected some of"
                          f" {', '.join(OPTIONAL_OUTPUTS)}")
    for field, rng in spec.static_checks.items():
        if len(rng) != 2 or rng[0] > rng[1]:
            raise ConfigError(f"method {spec.name!r}: static_checks[{field!r}]={rng!r} must be (lo, hi), lo <= hi")
    for field, rng in spec.tune.items():
        _check_search_range(field, rng, decls, spec.name)
    if spec.program:
        _check_program(spec)
    _METHODS[spec.name] = spec
    _DECLARED.clear()
    return spec


def _check_search_range(field: str, rng, decls: dict, owner: str) -> None:
    """``tune[field] = (low, high)``: a declared float field, ``0 < low < high``, both inside its range."""
    p = decls.get(field)
    if p is None:
        raise ConfigError(f"method {owner!r}: tune names unknown HParams field {field!r};"
                          f" fields are {', '.join(decls)}")
    ok = isinstance(rng, tuple) and len(rng) == 2 and not p.integer
    if not (ok and 0 < rng[0] < rng[1] and not p.outside(np.asarray(rng)).any()):
        raise ConfigError(f"method {owner!r}: tune[{field!r}]={rng!r} must be (low, high) with 0 < low < high inside"
                          f" HParams.{field}'s range {p.range_text()}{' (an integer field)' if p.integer else ''}")


def _check_program(spec: MethodSpec) -> None:
    """``spec.program`` must name a registered method with its own program and the same factory and streams."""
    host = _METHODS.get(spec.program)
    if host is None or host.program:
        raise ConfigError(f"method {spec.name!r}: program={spec.program!r} must name a registered method that runs"
                          f" its own program; registered: {', '.join(m for m in _METHODS if not _METHODS[m].program)}")
    if (host.factory, host.intrinsic_stream) != (spec.factory, spec.intrinsic_stream):
        raise ConfigError(f"method {spec.name!r}: program={spec.program!r} needs {spec.program!r}'s factory and"
                          " intrinsic_stream (the two must compile to one program)")


def program_of(method: str) -> str:
    """The method whose compiled program ``method`` runs (itself unless its spec names a ``program``)."""
    return method_spec(method).program or method


def unregister_method(name: str) -> None:
    """Remove a registered method (its own fields leave ``HParams``); not one whose program another runs."""
    method_spec(name)
    riders = [m for m, spec in _METHODS.items() if spec.program == name]
    if riders:
        raise ConfigError(f"method {name!r} cannot be unregistered while {', '.join(riders)} run(s) its program")
    del _METHODS[name]
    _DECLARED.clear()


def method_spec(name: str) -> MethodSpec:
    """The registered spec of ``name``; :class:`ConfigError` listing the registered names if there is none."""
    if name not in _METHODS:
        raise ConfigError(f"unknown method {name!r}; registered methods: {', '.join(_METHODS) or '(none)'}")
    return _METHODS[name]


def registered_methods() -> tuple[str, ...]:
    """Every registered method name, in registration order."""
    return tuple(_METHODS)


def hparam_declarations() -> Mapping[str, Param]:
    """Every ``HParams`` field: the core ones, then each registered method's new
    ones in registration order. A read-only ``{name: Param}``."""
    if not _DECLARED:
        _DECLARED.append(types.MappingProxyType(_declarations(_METHODS.values())))
    return _DECLARED[0]


__all__ = ["INF", "ConfigError", "MethodSpec", "Param", "declare_core_params", "hparam_declarations",
           "method_spec", "program_of", "register_method", "registered_methods", "unregister_method"]
