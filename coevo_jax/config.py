"""Two configuration objects.

``StaticConfig`` holds everything that fixes shapes or loop lengths (hashable,
closed over by ``make_train``). ``HParams`` holds everything a user may sweep:
``HParams(ppo=PPOParams(...), signal=SIOPParams(...))``, two frozen
hyperparameter classes (:mod:`coevo_jax.params`) declared beside the code that
reads them (:class:`~coevo_jax.ppo.PPOParams` in :mod:`coevo_jax.ppo`, each
method's subclass of :class:`~coevo_jax.signals.base.SignalParams` in its signal
module). Every leaf is a JAX array, so ``jax.vmap(train)(keys, hps)`` batches
over any of them with one compile. ``validate_static`` / ``validate_hparams``
reject bad values before anything compiles, naming the field, the value and the
range. A method's spec (:mod:`coevo_jax.registry`) names its class, its
per-method defaults, its static checks and its number of critic heads.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from coevo_jax import params
from coevo_jax.params import ConfigError, declarations
from coevo_jax.ppo import PPOParams
from coevo_jax.registry import CoreStatic, StaticOptions, core_static_fields, method_spec, registered_methods

if TYPE_CHECKING:
    from coevo_jax.signals.base import SignalParams


@dataclasses.dataclass(frozen=True)
class StaticConfig(CoreStatic):
    """Shapes, loop lengths and method choice (hashable; not traced).

    One iteration collects ``num_envs * rollout_len`` env steps, then runs
    ``update_epochs`` x ``num_minibatches`` PPO steps. The fields every method
    uses are declared in :class:`~coevo_jax.registry.CoreStatic` (this class's
    base; :func:`core_static_fields`); ``signal`` holds the method's own static options
    (its ``MethodSpec.static`` class, e.g.
    :class:`~coevo_jax.reward_net.RewardNetStatic`: code reads
    ``static.signal.reward_steps``). Users, JSON and the CLI name every field
    flat (names are unique across the core and each method's class):
    :func:`static_config` and :meth:`replace` route them, :meth:`as_dict` lists them.
    """

    # the method's static options: an instance of its spec's class (MethodSpec.static, declared beside the code
    # that reads it, e.g. reward_net.RewardNetStatic); None: that class's defaults (None for a method without one)
    signal: StaticOptions | None = None

    def __post_init__(self):
        if self.signal is None:
            object.__setattr__(self, "signal", _default_signal(self.method))

    @property
    def value_heads(self) -> int:
        """Critic heads of the policy: 2 (episodic, intrinsic) for methods with a
        non-episodic bonus stream (``MethodSpec.intrinsic_stream``), else 1."""
        return 2 if method_spec(self.method).intrinsic_stream else 1

    @property
    def steps_per_iteration(self) -> int:
        return self.num_envs * self.rollout_len

    @property
    def num_iterations(self) -> int:
        return max(1, self.total_steps // self.steps_per_iteration)

    @property
    def minibatch_size(self) -> int:
        return self.steps_per_iteration // self.num_minibatches

    def replace(self, **changes) -> "StaticConfig":
        """A copy with ``changes``, flat names routed to the core fields or to ``signal``
        (:func:`static_config`). A ``method`` with another static options class starts
        from that class's defaults; :class:`ConfigError` for a name the method does not have."""
        method = changes.get("method", self.method)
        core, own = _route_static(changes, method)
        cls = _static_class(method)
        keep = cls is not None and type(self.signal) is cls
        signal = core.pop("signal", self.signal if keep else _default_signal(method))
        if own:
            signal = dataclasses.replace(signal or _default_signal(method), **own)
        return dataclasses.replace(self, **core, signal=signal)

    def as_dict(self) -> dict[str, Any]:
        """``{field: value}`` with flat names: the core fields, then ``signal``'s (none when it is ``None``)."""
        core = {n: getattr(self, n) for n in core_static_fields()}
        return {**core, **(_fields_of(self.signal) if self.signal is not None else {})}


def static_config(method: str = "ppo", **fields) -> StaticConfig:
    """``method``'s :class:`StaticConfig`: the defaults, then ``fields`` (flat names: core
    fields, or fields of the method's static options class, which land in ``signal``).

    A name of another method's static options is a :class:`ConfigError` naming it, the
    method and the method's fields; a name no method has lists the method's fields."""
    return StaticConfig(method=method).replace(**fields)


def _static_class(method: str) -> type | None:
    """``method``'s static options class (``MethodSpec.static``); ``None`` for none or an unregistered method."""
    return method_spec(method).static if method in registered_methods() else None


def _default_signal(method: str) -> StaticOptions | None:
    cls = _static_class(method)
    return None if cls is None else cls()


def static_fields(method: str | None = None) -> tuple[str, ...]:
    """The flat names of ``method``'s static options (``MethodSpec.static``'s fields); ``None``:
    every registered method's, each name once."""
    methods = registered_methods() if method is None else (method,)
    classes = [_static_class(m) for m in methods]
    return tuple(dict.fromkeys(f.name for c in classes if c is not None for f in dataclasses.fields(c)))


def _route_static(flat: dict, method: str) -> tuple[dict, dict]:
    """``flat`` split into ``(core fields, fields of method's static options)``; :class:`ConfigError`
    for a name in neither (naming the methods that have it, if any)."""
    core, own = (*core_static_fields(), "signal"), static_fields(method)
    for name in flat:
        if name in core or name in own:
            continue
        owners = [m for m in registered_methods() if name in static_fields(m)]
        if owners:
            raise ConfigError(f"StaticConfig.{name} is a static option of method(s) {', '.join(owners)}, not of"
                              f" method {method!r}, whose static options are {', '.join(own) or '(none)'}")
        raise ConfigError(f"unknown StaticConfig field {name!r}; the fields of method {method!r} are"
                          f" {', '.join([*core_static_fields(), *own])}")
    return {n: v for n, v in flat.items() if n in core}, {n: v for n, v in flat.items() if n in own}


# ----------------------------------------------------------------------------- HParams
def _shown(v) -> str:
    """A leaf for ``repr``: the number, the list of a batch, or the tracer / shape."""
    if isinstance(v, (jax.Array, np.ndarray, float, int)) and not isinstance(v, jax.core.Tracer):
        return np.array2string(np.asarray(v), separator=", ")
    return repr(v)


@dataclasses.dataclass(frozen=True, eq=False)
class HParams:
    """Everything a user may sweep: ``ppo`` (:class:`~coevo_jax.ppo.PPOParams`) and
    ``signal`` (the method's class, a subclass of
    :class:`~coevo_jax.signals.base.SignalParams`: ``MethodSpec.params``).

    A frozen pytree; after :func:`default_hparams`, :meth:`replace` or
    :func:`as_arrays` every leaf is a JAX array (float32; int32 for integer
    fields), ``()`` for one run or ``[B]`` for a batch of runs, and any field
    can be vmapped over. Code reads ``hp.ppo.lr``, ``hp.signal.k``. Users,
    JSON and the runner name fields flat (``lr``, ``k``: names are unique across
    the two classes): :meth:`replace` and :func:`default_hparams` route them,
    :meth:`as_dict` lists them.
    """

    ppo: PPOParams
    signal: SignalParams

    def replace(self, **changes) -> "HParams":
        """A copy with ``changes`` (flat field names, routed to ``ppo`` or ``signal``
        and cast to each field's dtype); an unknown name is a :class:`ConfigError`."""
        ppo, signal = _route(changes, type(self.signal), "")
        return HParams(self.ppo.replace(**ppo) if ppo else self.ppo,
                       self.signal.replace(**signal) if signal else self.signal)

    def as_dict(self) -> dict[str, Any]:
        """``{field: leaf}``: ``ppo``'s fields, then ``signal``'s."""
        return {**_fields_of(self.ppo), **_fields_of(self.signal)}

    def __eq__(self, other) -> bool:
        if not isinstance(other, HParams):
            return NotImplemented
        a, b = self.as_dict(), other.as_dict()
        return (type(self.signal) is type(other.signal) and tuple(a) == tuple(b)
                and all(np.array_equal(np.asarray(a[n]), np.asarray(b[n])) for n in a))

    __hash__ = None  # leaves are arrays

    def __repr__(self) -> str:
        def shown(obj) -> str:
            return f"{type(obj).__name__}(" + ", ".join(f"{n}={_shown(v)}" for n, v in _fields_of(obj).items()) + ")"

        return f"HParams(ppo={shown(self.ppo)}, signal={shown(self.signal)})"


jax.tree_util.register_dataclass(HParams, data_fields=["ppo", "signal"], meta_fields=[])


def _fields_of(obj) -> dict:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def _route(flat: dict, signal_cls: type, method: str) -> tuple[dict, dict]:
    """``flat`` split into ``(ppo fields, signal fields)``; :class:`ConfigError` for a name in neither."""
    ppo_names, signal_names = declarations(PPOParams), declarations(signal_cls)
    unknown = [n for n in flat if n not in ppo_names and n not in signal_names]
    if unknown:
        owner = f"method {method!r}" if method else signal_cls.__name__
        raise ConfigError(f"unknown HParams field {unknown[0]!r} ({owner}); fields are"
                          f" {', '.join([*ppo_names, *signal_names])}")
    return ({n: v for n, v in flat.items() if n in ppo_names}, {n: v for n, v in flat.items() if n in signal_names})


def hparam_fields(method: str | None = None) -> tuple[str, ...]:
    """The flat ``HParams`` field names of ``method`` (``PPOParams``' then its
    signal class's); ``None``: every registered method's, each name once."""
    if method is not None:
        return tuple(method_spec(method).declarations())
    return tuple(dict.fromkeys(n for m in registered_methods() for n in method_spec(m).declarations()))


def as_arrays(hp: HParams) -> HParams:
    """``hp`` with every leaf a JAX array of its field's dtype (int32 for integer
    fields; tracers are cast, not checked)."""
    return HParams(params.cast(hp.ppo), params.cast(hp.signal))


def default_hparams(method: str = "ppo", **overrides) -> HParams:
    """``method``'s ``HParams``: the class defaults, its spec's ``defaults``,
    then ``overrides`` (flat names); every leaf an array."""
    spec = method_spec(method)
    ppo, signal = _route({**spec.defaults, **overrides}, spec.params, method)
    return as_arrays(HParams(PPOParams(**ppo), spec.params(**signal)))


def validate_hparams(hp: HParams) -> HParams:
    """Check every leaf (scalar or batched) is a finite number inside its range.

    Returns ``hp`` cast to arrays. Raises :class:`ConfigError` naming the field.
    """
    if not isinstance(hp, HParams) or not isinstance(hp.ppo, PPOParams) or not params.is_hyperparams(
            type(hp.signal)):
        raise ConfigError(f"expected HParams(ppo=PPOParams(...), signal=<a method's params class>), got {hp!r}")
    params.check(hp.ppo)
    params.check(hp.signal)
    return as_arrays(hp)


# ----------------------------------------------------------------------------- StaticConfig checks
#: integer fields every method uses -> inclusive (lo, hi); methods add theirs (``StaticOptions.checks``)
CORE_STATIC_CHECKS: dict[str, tuple] = {
    "num_envs": (1, 1 << 20),
    "rollout_len": (1, 1 << 20),
    "total_steps": (1, 1 << 40),
    "num_minibatches": (1, 1 << 20),
    "update_epochs": (1, 1000),
    "d_model": (1, 4096),
    "num_layers": (1, 64),
    "num_heads": (1, 64),
    "gru_size": (1, 1 << 16),
}


def check_int(static, name: str, lo: int, hi: int) -> None:
    """:class:`ConfigError` unless ``static.<name>`` is an int in ``[lo, hi]`` (``static``: a
    :class:`StaticConfig` or a method's static options; the message names ``StaticConfig.<name>``)."""
    v = getattr(static, name)
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
        raise ConfigError(f"StaticConfig.{name}={v!r} must be an integer in [{lo}, {hi}]")


def check_sizes(static, name: str) -> None:
    """:class:`ConfigError` unless ``static.<name>`` is a non-empty tuple of positive ints (layer widths)."""
    v = getattr(static, name)
    if not isinstance(v, tuple) or not v or not all(isinstance(h, int) and h >= 1 for h in v):
        raise ConfigError(f"StaticConfig.{name}={v!r} must be a non-empty tuple of positive ints")


def check_choice(static, name: str, choices: tuple) -> None:
    """:class:`ConfigError` unless ``static.<name>`` is one of ``choices``."""
    v = getattr(static, name)
    if v not in choices:
        names = [repr(c) for c in choices]
        raise ConfigError(f"StaticConfig.{name}={v!r} must be {', '.join(names[:-1])} or {names[-1]}")


def validate_static(static: StaticConfig) -> StaticConfig:
    """Check the core fields of ``static``, then its method's static options
    (``static.signal``: its class's ``checks``, then its ``check()``); raise
    :class:`ConfigError` naming the first bad one."""
    if static.method not in registered_methods():
        raise ConfigError(f"StaticConfig.method={static.method!r} is not one of {', '.join(registered_methods())}")
    spec = method_spec(static.method)
    for name, (lo, hi) in CORE_STATIC_CHECKS.items():
        check_int(static, name, lo, hi)
    check_sizes(static, "hidden_sizes")
    check_choice(static, "activation", ("tanh", "relu"))
    check_choice(static, "network", ("auto", "mlp", "transformer", "bag", "gru"))
    check_choice(static, "action_head", ("dense", "utterance"))
    for name in ("kv_cache", "packed_update"):
        if not isinstance(getattr(static, name), bool):
            raise ConfigError(f"StaticConfig.{name}={getattr(static, name)!r} must be True or False")
    if static.steps_per_iteration % static.num_minibatches:
        raise ConfigError(
            f"StaticConfig.num_minibatches={static.num_minibatches} must divide num_envs * rollout_len"
            f" = {static.steps_per_iteration}"
        )
    if static.total_steps < static.steps_per_iteration:
        raise ConfigError(
            f"StaticConfig.total_steps={static.total_steps} must be >= num_envs * rollout_len"
            f" = {static.steps_per_iteration} (one iteration)"
        )
    if static.d_model % static.num_heads:
        raise ConfigError(f"StaticConfig.num_heads={static.num_heads} must divide d_model={static.d_model}")
    _check_signal(static.signal, spec)
    return static


def _check_signal(signal, spec) -> None:
    """``signal`` is an instance of ``spec.static`` (or ``None`` when that is) with valid values."""
    if spec.static is None:
        if signal is not None:
            raise ConfigError(f"StaticConfig.signal={signal!r} must be None: method {spec.name!r} has no static"
                              " options")
        return
    if type(signal) is not spec.static:
        raise ConfigError(f"StaticConfig.signal={signal!r} must be a {spec.static.__name__} (method {spec.name!r}'s"
                          f" static options; static_config({spec.name!r}, ...) makes one)")
    for name, (lo, hi) in spec.static.checks.items():
        check_int(signal, name, lo, hi)
    signal.check()
