"""Two configuration objects.

``StaticConfig`` holds everything that fixes shapes or loop lengths (hashable,
closed over by ``make_train``). ``HParams`` holds everything a user may sweep:
every leaf is a JAX array, so ``jax.vmap(train)(keys, hps)`` batches over any of
them with one compile. ``validate_static`` / ``validate_hparams`` reject bad
values before anything compiles, naming the field, the value and the range.

``HParams`` is built from the registry (:mod:`coevo_jax.registry`): its fields
are the core ones declared here (:data:`CORE_PARAMS`) and those each registered
method declares in its own module; ranges, per-method defaults, static checks
and the number of critic heads come from the method's ``MethodSpec``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from coevo_jax.registry import (
    INF, ConfigError, Param, declare_core_params, grad_clip, hparam_declarations, method_spec, registered_methods,
    unit, weight,
)


@dataclasses.dataclass(frozen=True)
class StaticConfig:
    """Shapes, loop lengths and method choice (hashable; not traced).

    One iteration collects ``num_envs * rollout_len`` env steps, then runs
    ``update_epochs`` x ``num_minibatches`` PPO steps. The method-specific
    fields below are checked by their method's ``MethodSpec`` (``static_checks``,
    ``check_static``) only when that method runs.
    """

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
    # or "auto" (transformer for int token observations, else mlp)
    network: str = "auto"
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
    # learned internal reward (co-evolution and meta-gradient)
    reward_hidden: tuple = (64, 64)
    action_embed_dim: int = 16
    reward_steps: int = 4  # gradient steps per refit
    # complete episodes kept for the refit: None = enough for two rollouts of time-limited episodes, at least 32
    # (episodes.replay_episodes)
    buffer_episodes: int | None = None
    # steps of an episode R_phi's buffer keeps (padded): None = the env's time limit (every step is decomposed);
    # a length shorter than the time limit is refused (episodes.episode_window)
    max_episode_len: int | None = None
    reward_input: str = "features"  # what R_phi and RND read: "features" (policy hidden state) or "obs"
    # potential (SIOP)
    potential_hidden: tuple = (64, 64)
    potential_steps: int = 4  # Adam steps per refit, each on minibatch_size transitions drawn from the replay
    potential_layernorm: bool = False
    potential_buffer_episodes: int = 64  # complete episodes in the potential's replay
    potential_episode_len: int | None = None  # steps of a replayed episode kept: None = the env's time limit
    ensemble_size: int = 1
    ensemble_combine: str = "mean"  # or "min"
    # compute-matched K: a refit takes reward_steps x K (potential_steps x K) steps, so R_phi / Phi get the same
    # gradient steps per env step whatever the update period K (hp.k; a traced count, fit.fit_traced_steps).
    # A refit with fewer than hp.min_refit_episodes complete episodes in its buffer takes none: the metric
    # refit_steps (cumulative) is the steps a run took
    refit_steps_per_k: bool = False
    credit_nstep: int = 1  # > 1: each step's credit spread back over n steps (policy invariance exact only at 1)
    # ICM
    icm_feature_dim: int = 32
    # meta-gradient
    meta_inner_steps: int = 1
    meta_truncate: int = 0  # stop gradients through the first `meta_truncate` inner steps

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
        return dataclasses.replace(self, **changes)


# ----------------------------------------------------------------------------- HParams
#: the fields every method has: PPO, reward mixing and the update period. Each
#: method's own fields are declared in its module (coevo_jax/signals/*.py).
CORE_PARAMS: dict[str, Param] = {
    # PPO
    "lr": Param(2.5e-4, 0.0, 1.0, low_inclusive=False),
    "gamma": unit(0.99),
    "gae_lambda": unit(0.95),
    "clip_eps": Param(0.2, 0.0, 1.0, low_inclusive=False),
    "ent_coef": weight(0.01),
    "vf_coef": weight(0.5),
    "max_grad_norm": grad_clip(0.5),
    # reward mixing: episodic r = beta_ext * r_ext + beta_int * n(r_int) (shaping / learned decomposition),
    # or a separate non-episodic stream with advantage weight beta_int (see each signal module)
    "beta_ext": Param(1.0, -INF, INF, False, False, doc="weight of the external reward"),
    "beta_int": Param(1.0, -INF, INF, False, False, doc="weight of the internal reward (or of its advantage)"),
    "normalize_int": unit(1.0, doc="1: divide r_int by a running RMS of its return (never shifted), 0: raw"),
    "k": Param(4, 1, 1_000_000, integer=True, doc="update period of the internal reward / potential, in"
                                                 " iterations"),
}
declare_core_params(CORE_PARAMS)


def _field_dtype(p: Param):
    return jnp.int32 if p.integer else jnp.float32


def _cast(name: str, value, p: Param | None):
    """``value`` as a JAX array of the field's dtype (int32 for integer params,
    else float32; tracers are cast, not checked). ``p`` ``None``: unchanged."""
    if p is None:
        return value
    dtype = _field_dtype(p)
    if isinstance(value, jax.core.Tracer):
        return value if value.dtype == dtype else value.astype(dtype)
    if isinstance(value, jax.Array) and value.dtype == dtype:
        return value
    arr = np.asarray(value)
    if arr.dtype.kind not in "biuf":
        raise ConfigError(f"HParams.{name}: expected a number, got {value!r}")
    if p.integer and np.any(arr != np.round(arr)):
        raise ConfigError(f"HParams.{name}: must be an integer, got {arr.tolist()}")
    return jnp.asarray(arr, dtype)


def _shown(v) -> str:
    """A leaf for ``repr``: the number, the list of a batch, or the tracer / shape."""
    if isinstance(v, (jax.Array, np.ndarray, float, int)) and not isinstance(v, jax.core.Tracer):
        return np.array2string(np.asarray(v), separator=", ")
    return repr(v)


class HParams:
    """Every leaf a JAX array (float32; int32 for integer fields), ``()`` for one
    run or ``[B]`` for a batch of runs; any field can be vmapped over.

    A frozen pytree whose keys are the field names (``hparam_fields()``: the
    core fields, then every registered method's). ``HParams(**kw)`` casts the
    given values and gives every other field its declared default; an unknown
    name is a :class:`ConfigError`. ``hp.replace(**kw)`` likewise.
    """

    __slots__ = ("_values",)

    def __init__(self, **values):
        decls = hparam_declarations()
        unknown = [n for n in values if n not in decls]
        if unknown:
            raise ConfigError(f"unknown HParams field {unknown[0]!r}; fields are {', '.join(decls)}")
        cast = {n: _cast(n, values[n] if n in values else p.default, p) for n, p in decls.items()}
        object.__setattr__(self, "_values", cast)

    def __getattr__(self, name: str):
        if not name.startswith("_"):
            values = object.__getattribute__(self, "_values")
            if name in values:
                return values[name]
            raise AttributeError(f"HParams has no field {name!r}; fields are {', '.join(values)}")
        raise AttributeError(name)

    def __setattr__(self, name, value):
        raise dataclasses.FrozenInstanceError(f"HParams is frozen: use hp.replace({name}=...)")

    __delattr__ = __setattr__

    def replace(self, **changes) -> "HParams":
        """A copy with ``changes`` (cast to each field's dtype)."""
        unknown = [n for n in changes if n not in self._values]
        if unknown:
            raise ConfigError(f"unknown HParams field {unknown[0]!r}; fields are {', '.join(self._values)}")
        decls = hparam_declarations()
        return _from_values({n: _cast(n, changes[n], decls.get(n)) if n in changes else v
                             for n, v in self._values.items()})

    def as_dict(self) -> dict[str, Any]:
        """``{field: leaf}`` in field order."""
        return dict(self._values)

    def __eq__(self, other) -> bool:
        if not isinstance(other, HParams):
            return NotImplemented
        a, b = self._values, other._values
        return tuple(a) == tuple(b) and all(np.array_equal(np.asarray(a[n]), np.asarray(b[n])) for n in a)

    __hash__ = None  # leaves are arrays

    def __repr__(self) -> str:
        return "HParams(" + ", ".join(f"{n}={_shown(v)}" for n, v in self._values.items()) + ")"

    def __reduce__(self):
        return _unflatten, (tuple(self._values), tuple(self._values.values()))


def _from_values(values: dict) -> HParams:
    """An ``HParams`` holding ``values`` as they are (pytree unflattening: any leaves)."""
    hp = object.__new__(HParams)
    object.__setattr__(hp, "_values", values)
    return hp


def _unflatten(names: tuple, leaves: Iterable) -> HParams:
    return _from_values(dict(zip(names, leaves)))


jax.tree_util.register_pytree_with_keys(
    HParams,
    lambda hp: (tuple((jax.tree_util.GetAttrKey(n), v) for n, v in hp._values.items()), tuple(hp._values)),
    _unflatten,
    lambda hp: (tuple(hp._values.values()), tuple(hp._values)),
)


def hparam_fields() -> tuple[str, ...]:
    """Every ``HParams`` field name: the core ones, then the registered methods'."""
    return tuple(hparam_declarations())


def as_arrays(hp: HParams) -> HParams:
    """Cast every field to a JAX array of its declared dtype (int32 for integer fields)."""
    decls = hparam_declarations()
    return _from_values({n: _cast(n, v, decls.get(n)) for n, v in hp.as_dict().items()})


def default_hparams(method: str = "ppo", **overrides) -> HParams:
    """``HParams()`` with the method's defaults (its ``MethodSpec.defaults``), then ``overrides``."""
    return HParams(**{**method_spec(method).defaults, **overrides})


def validate_hparams(hp: HParams) -> HParams:
    """Check every leaf (scalar or batched) is finite and inside its range.

    Returns ``hp`` cast to arrays. Raises :class:`ConfigError` naming the field.
    """
    decls = hparam_declarations()
    missing = [n for n in decls if n not in hp.as_dict()]
    if missing:
        raise ConfigError(f"HParams lacks field(s) {missing} (made before their method was registered?)")
    for name, v in hp.as_dict().items():
        if name not in decls:
            raise ConfigError(f"HParams.{name}: no registered method declares this field")
        if isinstance(v, jax.core.Tracer):
            continue
        p, arr = decls[name], np.asarray(v)
        if arr.dtype.kind not in "biuf":
            raise ConfigError(f"HParams.{name}: expected a number, got {v!r}")
        if p.integer and np.any(arr != np.round(arr)):
            raise ConfigError(f"HParams.{name}: must be an integer, got {arr.tolist()}")
        bad = p.outside(arr)
        if np.any(bad):
            shown = arr[bad].ravel()[0]  # numpy scalar: prints -0.1, not -0.10000000149
            raise ConfigError(f"HParams.{name}={shown!s} is outside the allowed range {p.range_text()}")
    return as_arrays(hp)


# ----------------------------------------------------------------------------- StaticConfig checks
#: integer fields every method uses -> inclusive (lo, hi); methods add theirs (``MethodSpec.static_checks``)
CORE_STATIC_CHECKS: dict[str, tuple] = {
    "num_envs": (1, 1 << 20),
    "rollout_len": (1, 1 << 20),
    "total_steps": (1, 1 << 40),
    "num_minibatches": (1, 1 << 20),
    "update_epochs": (1, 1000),
    "d_model": (1, 4096),
    "num_layers": (1, 64),
    "num_heads": (1, 64),
}


def check_int(static: StaticConfig, name: str, lo: int, hi: int) -> None:
    """:class:`ConfigError` unless ``static.<name>`` is an int in ``[lo, hi]``."""
    v = getattr(static, name)
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
        raise ConfigError(f"StaticConfig.{name}={v!r} must be an integer in [{lo}, {hi}]")


def check_sizes(static: StaticConfig, name: str) -> None:
    """:class:`ConfigError` unless ``static.<name>`` is a non-empty tuple of positive ints (layer widths)."""
    v = getattr(static, name)
    if not isinstance(v, tuple) or not v or not all(isinstance(h, int) and h >= 1 for h in v):
        raise ConfigError(f"StaticConfig.{name}={v!r} must be a non-empty tuple of positive ints")


def check_choice(static: StaticConfig, name: str, choices: tuple) -> None:
    """:class:`ConfigError` unless ``static.<name>`` is one of ``choices``."""
    v = getattr(static, name)
    if v not in choices:
        names = [repr(c) for c in choices]
        raise ConfigError(f"StaticConfig.{name}={v!r} must be {', '.join(names[:-1])} or {names[-1]}")


def validate_static(static: StaticConfig) -> StaticConfig:
    """Check the core fields of ``static`` and those its method's spec checks;
    raise :class:`ConfigError` naming the first bad one."""
    if static.method not in registered_methods():
        raise ConfigError(f"StaticConfig.method={static.method!r} is not one of {', '.join(registered_methods())}")
    spec = method_spec(static.method)
    for name, (lo, hi) in {**CORE_STATIC_CHECKS, **spec.static_checks}.items():
        if not hasattr(static, name):
            raise ConfigError(f"method {spec.name!r} checks StaticConfig.{name}, which does not exist")
        check_int(static, name, lo, hi)
    check_sizes(static, "hidden_sizes")
    check_choice(static, "activation", ("tanh", "relu"))
    check_choice(static, "network", ("auto", "mlp", "transformer", "bag"))
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
    if spec.check_static is not None:
        spec.check_static(static)
    return static
