"""Reward methods as data: each method is one :class:`MethodSpec` (its factory, hyperparameter class,
static options, streams, required env outputs and ``off`` overrides), registered by the module that
implements it. ``default_hparams``, ``validate_static``, ``StaticConfig.value_heads`` and
``make_signal`` read the spec of the method they are given. The built-in methods register when
:mod:`coevo_jax.signals` is imported (``import coevo_jax`` does); a method from anywhere else registers
with :func:`register_method`. :class:`CoreStatic` declares the static fields every method has
(``StaticConfig``'s base). :mod:`coevo_jax.config` imports this module, never the reverse.
"""
from __future__ import annotations

import dataclasses
import types
from typing import Callable, ClassVar, Mapping

import numpy as np
from envs_jax.core import OPTIONAL_OUTPUTS  # (envs_jax depends on nothing in coevo_jax)

from coevo_jax.params import INF, ConfigError, Param, declarations, is_hyperparams  # noqa: F401  (INF re-exported)
from coevo_jax.ppo import PPOParams


def _frozen(mapping: Mapping | None) -> Mapping | None:
    return None if mapping is None else types.MappingProxyType(dict(mapping))


@dataclasses.dataclass(frozen=True)
class StaticOptions:
    """Base of a method's static options (``StaticConfig.signal``, ``MethodSpec.static``):
    what fixes its networks' shapes and loop lengths, a frozen, hashable dataclass
    declared beside the code that reads it (``static.signal.<field>``).

    A subclass declares its fields, each with a default (field names differ from
    the core ``StaticConfig`` fields: users, JSON and the CLI name them flat),
    ``checks``: integer field -> inclusive ``(lo, hi)``, and overrides
    :meth:`check` for anything else. ``validate_static`` runs both, the
    integer checks first; errors name the field as ``StaticConfig.<field>``.
    """

    checks: ClassVar[Mapping[str, tuple]] = types.MappingProxyType({})

    def check(self) -> None:
        """Raise :class:`ConfigError` for a bad value that ``checks`` does not cover (here: none)."""


@dataclasses.dataclass(frozen=True)
class CoreStatic:
    """The static fields every method has: the base of :class:`~coevo_jax.config.StaticConfig`,
    which adds ``signal`` (the method's :class:`StaticOptions`). Declared here so that a spec's
    static options class can be checked against these names (:func:`core_static_fields`)
    without this module importing :mod:`coevo_jax.config`, which imports it."""

    method: str = "ppo"
    num_envs: int = 16
    rollout_len: int = 128
    total_steps: int = 262_144
    num_minibatches: int = 4
    update_epochs: int = 4
    hidden_sizes: tuple = (64, 64)
    activation: str = "tanh"
    anneal_lr: bool = True
    normalize_advantages: bool = True
    # "mlp", "transformer", "bag" (bag-of-exchanges MLP over token buffers, networks.BagActorCritic),
    # "gru" (recurrent: recurrent.GRUActorCritic), or "auto" (transformer for int token observations, else mlp)
    network: str = "auto"
    gru_size: int = 128  # hidden units of network "gru" (its features' width)
    # "dense": one logit per action; "utterance": an utterance's logit adds its tokens' scores
    # (network "bag" on the turn-level text envs, see networks.BagActorCritic)
    action_head: str = "dense"
    # transformer policy (text environments); d_model is also the bag network's embedding width
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 4
    kv_cache: bool = True  # transformer rollouts decode incrementally with a key-value cache
    # transformer PPO update: score each env's rollout window in one causal pass
    # (minibatches are then whole envs: num_envs must be divisible by num_minibatches)
    packed_update: bool = True


def core_static_fields() -> tuple[str, ...]:
    """The fields every method has: ``StaticConfig``'s own, without ``signal`` (:class:`CoreStatic`'s)."""
    return tuple(f.name for f in dataclasses.fields(CoreStatic))


@dataclasses.dataclass(frozen=True, eq=False)
class MethodSpec:
    """One reward method.

    ``factory(static, network, env, env_params) -> Signal``. ``params``: the
    method's hyperparameter class (``HParams.signal``), a
    :func:`~coevo_jax.params.hyperparams` subclass of
    :class:`~coevo_jax.signals.base.SignalParams` whose field names differ from
    :class:`~coevo_jax.ppo.PPOParams`' (``None``: ``SignalParams`` itself). ``defaults``: values (flat field names)
    this method runs with instead of the class defaults, for a method that
    shares its class with another (``dense``: ``ppo``'s class with
    ``dense_weight`` 1). ``intrinsic_stream``: the signal pays a non-episodic
    bonus stream (the policy gets a second critic head). ``static``: the
    method's static options, a subclass of :class:`StaticOptions`
    (``StaticConfig.signal``; ``None``: the method has none, its
    ``StaticConfig.signal`` is ``None``).
    ``requires``: the environment's optional outputs the method reads
    (``envs_jax.core.OPTIONAL_OUTPUTS``). ``off``: the ``HParams`` overrides
    under which the method's rewards give exactly sparse PPO's advantages
    (``None`` where that does not apply). (What a study's tuning searches is the
    study's: ``sweeps/_study/tuning.py``.)

    A spec is checked when made (:class:`ConfigError`): the classes, unique field
    names, and every name in ``defaults`` and ``off`` a field of the method with a
    value in range.
    """

    name: str
    factory: Callable
    params: type | None = None
    defaults: Mapping[str, float] = dataclasses.field(default_factory=dict)
    intrinsic_stream: bool = False
    static: type | None = None
    requires: tuple = ()
    off: Mapping[str, float] | None = None
    doc: str = ""

    def __post_init__(self):
        for name in ("defaults", "off"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))
        object.__setattr__(self, "requires", tuple(self.requires))
        if self.params is None:
            object.__setattr__(self, "params", _signal_params())
        _check_spec(self)

    def declarations(self) -> dict[str, Param]:
        """``{field: Param}`` of the method's ``HParams``: :class:`~coevo_jax.ppo.PPOParams`' then ``params``'."""
        return {**declarations(PPOParams), **declarations(self.params)}


_METHODS: dict[str, MethodSpec] = {}


def _signal_params() -> type:
    """:class:`~coevo_jax.signals.base.SignalParams`, imported on use: importing ``coevo_jax.signals.base`` runs
    ``coevo_jax.signals``, which imports this module (a top-level import needs the class below the package)."""
    from coevo_jax.signals.base import SignalParams

    return SignalParams


def _check_spec(spec: MethodSpec) -> None:
    if not isinstance(spec.name, str) or not spec.name:
        raise ConfigError(f"MethodSpec needs a non-empty name, got {spec.name!r}")
    if not (is_hyperparams(spec.params) and issubclass(spec.params, _signal_params())):
        raise ConfigError(f"method {spec.name!r}: params={spec.params!r} must be a subclass of SignalParams"
                          " declared with @hyperparams")
    clash = [n for n in declarations(spec.params) if n in declarations(PPOParams)]
    if clash:
        raise ConfigError(f"method {spec.name!r}: {spec.params.__name__}.{clash[0]} clashes with PPOParams.{clash[0]}"
                          " (HParams field names must be unique across its ppo and signal classes)")
    decls = spec.declarations()
    _check_values(spec.defaults, decls, spec.name, "defaults")
    _check_values(spec.off, decls, spec.name, "off")
    unknown = [r for r in spec.requires if r not in OPTIONAL_OUTPUTS]
    if unknown:
        raise ConfigError(f"method {spec.name!r} requires unknown env output(s) {unknown}; expected some of"
                          f" {', '.join(OPTIONAL_OUTPUTS)}")
    if spec.static is not None:
        _check_static_class(spec.static, spec.name)


def _check_static_class(cls, owner: str) -> None:
    """``MethodSpec.static``: a frozen :class:`StaticOptions` dataclass whose fields all have defaults,
    none named like a core ``StaticConfig`` field, and whose ``checks`` name its fields with ``lo <= hi``."""
    if not (isinstance(cls, type) and issubclass(cls, StaticOptions) and "__dataclass_params__" in vars(cls)):
        raise ConfigError(f"method {owner!r}: static={cls!r} must be a subclass of StaticOptions declared with"
                          " @dataclasses.dataclass(frozen=True)")
    names = [f.name for f in dataclasses.fields(cls)]
    no_default = [f.name for f in dataclasses.fields(cls)
                  if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if no_default:
        raise ConfigError(f"method {owner!r}: {cls.__name__}.{no_default[0]} needs a default")
    clash = [n for n in names if n in core_static_fields()]
    if clash:
        raise ConfigError(f"method {owner!r}: {cls.__name__}.{clash[0]} clashes with StaticConfig.{clash[0]}"
                          " (StaticConfig field names must be unique across its core and signal fields)")
    for field, rng in cls.checks.items():
        if field not in names:
            raise ConfigError(f"method {owner!r}: {cls.__name__}.checks names {field!r}, which is no field of"
                              f" {cls.__name__}; fields are {', '.join(names) or '(none)'}")
        if len(rng) != 2 or rng[0] > rng[1]:
            raise ConfigError(f"method {owner!r}: {cls.__name__}.checks[{field!r}]={rng!r} must be (lo, hi),"
                              " lo <= hi")


def _check_values(values: Mapping | None, decls: dict, owner: str, what: str) -> None:
    for field, v in (values or {}).items():
        if field not in decls:
            raise ConfigError(f"method {owner!r}: {what} names unknown HParams field {field!r};"
                              f" fields are {', '.join(decls)}")
        if decls[field].outside(np.asarray(v)).any():
            raise ConfigError(f"method {owner!r}: {what} HParams.{field}={v} is outside the allowed range"
                              f" {decls[field].range_text()}")


def register_method(spec: MethodSpec) -> MethodSpec:
    """Add ``spec`` (checked when it was made). Raises :class:`ConfigError` for a taken name."""
    if not isinstance(spec, MethodSpec):
        raise ConfigError(f"register_method expects a MethodSpec, got {spec!r}")
    if spec.name in _METHODS:
        raise ConfigError(f"method {spec.name!r} is already registered (unregister_method it first)")
    _METHODS[spec.name] = spec
    return spec


def unregister_method(name: str) -> None:
    """Remove a registered method."""
    method_spec(name)
    del _METHODS[name]


def method_spec(name: str) -> MethodSpec:
    """The registered spec of ``name``; :class:`ConfigError` listing the registered names if there is none."""
    if name not in _METHODS:
        raise ConfigError(f"unknown method {name!r}; registered methods: {', '.join(_METHODS) or '(none)'}")
    return _METHODS[name]


def registered_methods() -> tuple[str, ...]:
    """Every registered method name, in registration order."""
    return tuple(_METHODS)


__all__ = ["INF", "ConfigError", "CoreStatic", "MethodSpec", "Param", "StaticOptions", "core_static_fields",
           "method_spec", "register_method", "registered_methods", "unregister_method"]
