"""Two configuration objects.

``StaticConfig`` holds everything that fixes shapes or loop lengths (hashable,
closed over by ``make_train``). ``HParams`` holds everything a user may sweep:
every leaf is a JAX array, so ``jax.vmap(train)(keys, hps)`` batches over any of
them with one compile. ``validate_static`` / ``validate_hparams`` reject bad
values before anything compiles, naming the field, the value and the range.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

METHODS = (
    "ppo", "dense", "icm", "coevo-regression", "coevo-ranking", "coevo-novelty", "siop", "meta",
)
#: methods whose per-step bonus has its own non-episodic return and critic head
#: (:class:`coevo_jax.signals.base.RewardStreams`)
INTRINSIC_STREAM_METHODS = ("icm", "coevo-novelty", "meta")


@dataclasses.dataclass(frozen=True)
class StaticConfig:
    """Shapes, loop lengths and method choice (hashable; not traced).

    One iteration collects ``num_envs * rollout_len`` env steps, then runs
    ``update_epochs`` x ``num_minibatches`` PPO steps.
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
    network: str = "auto"  # "mlp", "transformer", or "auto" (transformer for int token observations)
    # transformer policy (text environments)
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
    buffer_episodes: int = 32  # complete episodes kept for the refit
    max_episode_len: int = 32  # the last this-many steps of each episode are kept (padded) in the buffer
    reward_input: str = "features"  # what R_phi and RND read: "features" (policy hidden state) or "obs"
    # potential (SIOP)
    potential_hidden: tuple = (64, 64)
    potential_steps: int = 4  # Adam steps per refit, each on minibatch_size transitions drawn from the replay
    potential_layernorm: bool = False
    potential_buffer_episodes: int = 64  # complete episodes in the potential's replay
    potential_episode_len: int = 128  # the last this-many steps of each replayed episode are kept
    ensemble_size: int = 1
    ensemble_combine: str = "mean"  # or "min"
    credit_nstep: int = 1  # > 1: each step's credit spread back over n steps (policy invariance exact only at 1)
    # ICM
    icm_feature_dim: int = 32
    # meta-gradient
    meta_inner_steps: int = 1
    meta_truncate: int = 0  # stop gradients through the first `meta_truncate` inner steps

    @property
    def value_heads(self) -> int:
        """Critic heads of the policy: 2 (episodic, intrinsic) for methods with a
        non-episodic bonus stream, else 1."""
        return 2 if self.method in INTRINSIC_STREAM_METHODS else 1

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


def _f(x) -> Any:
    return struct.field(default_factory=lambda: jnp.asarray(x, jnp.float32))


def _i(x) -> Any:
    return struct.field(default_factory=lambda: jnp.asarray(x, jnp.int32))


@struct.dataclass
class HParams:
    """Every leaf a JAX array; any field can be vmapped over.

    Groups: PPO; reward mixing and update period ``k``; learned reward
    (co-evolution); potential (SIOP); ICM; meta-gradient.
    """

    # PPO
    lr: jax.Array = _f(2.5e-4)
    gamma: jax.Array = _f(0.99)
    gae_lambda: jax.Array = _f(0.95)
    clip_eps: jax.Array = _f(0.2)
    ent_coef: jax.Array = _f(0.01)
    vf_coef: jax.Array = _f(0.5)
    max_grad_norm: jax.Array = _f(0.5)
    # reward mixing: episodic r = beta_ext * r_ext + beta_int * n(r_int) (shaping / learned decomposition),
    # or a separate non-episodic stream beta_int * n(bonus) (icm; coevo-novelty: novelty_coef * n(RND error));
    # see each signal module
    beta_ext: jax.Array = _f(1.0)
    beta_int: jax.Array = _f(1.0)
    normalize_int: jax.Array = _f(1.0)  # 1: divide r_int by a running RMS of its return (never shifted), 0: raw
    k: jax.Array = _i(4)  # update period of the internal reward / potential, in iterations
    # learned internal reward R_phi (co-evolution)
    reward_lr: jax.Array = _f(5e-5)
    reward_max_grad_norm: jax.Array = _f(1.0)
    anchor_weight: jax.Array = _f(1.0)  # weight of the external-reward anchor (fit) term
    drift_weight: jax.Array = _f(0.1)  # penalty on drift of R_phi's outputs from the anchor's (drift_ema)
    extreme_weight: jax.Array = _f(0.01)  # penalty on extreme (saturated) outputs
    drift_ema: jax.Array = _f(0.9)  # the drift anchor: EMA (per refit) of R_phi's params; 0 = the last refit's
    novelty_coef: jax.Array = _f(0.5)  # weight of the RND novelty bonus (coevo-novelty, intrinsic stream)
    rnd_lr: jax.Array = _f(2.5e-4)  # the RND predictor's Adam step (it trains on every rollout)
    ranking_temp: jax.Array = _f(1.0)
    # potential V(s) (SIOP)
    potential_lr: jax.Array = _f(5e-4)
    potential_max_grad_norm: jax.Array = _f(1.0)
    w_fit: jax.Array = _f(1.0)  # Monte-Carlo return-to-go fit
    w_cons: jax.Array = _f(1.0)  # TD consistency, same fixed point as the fit
    w_reg: jax.Array = _f(1e-3)
    potential_init: jax.Array = _f(0.0)  # initial output bias: a guess of the return
    credit_clip: jax.Array = _f(1e6)  # |credit| cap after scaling; the default never binds (clipping breaks telescoping)
    # ICM
    icm_lr: jax.Array = _f(2.5e-4)
    icm_eta: jax.Array = _f(0.01)
    icm_forward_weight: jax.Array = _f(0.2)
    # meta-gradient (LIRPG)
    meta_lr: jax.Array = _f(1e-4)
    meta_max_grad_norm: jax.Array = _f(1.0)
    r_ext_coef: jax.Array = _f(1.0)
    r_int_coef: jax.Array = _f(1.0)


def _replace(self: HParams, **changes) -> HParams:
    """Like ``dataclasses.replace`` but casts new values to each field's dtype."""
    return as_arrays(dataclasses.replace(self, **changes))


HParams.replace = _replace  # flax's struct.dataclass installs its own `replace`; ours also casts

HPARAM_FIELDS = tuple(f.name for f in dataclasses.fields(HParams))
_INT_FIELDS = ("k",)

# (low, high, low_inclusive, high_inclusive)
INF = math.inf
HPARAM_RANGES: dict[str, tuple] = {
    "lr": (0.0, 1.0, False, True),
    "gamma": (0.0, 1.0, True, True),
    "gae_lambda": (0.0, 1.0, True, True),
    "clip_eps": (0.0, 1.0, False, True),
    "ent_coef": (0.0, INF, True, False),
    "vf_coef": (0.0, INF, True, False),
    "max_grad_norm": (0.0, INF, False, False),
    "beta_ext": (-INF, INF, False, False),
    "beta_int": (-INF, INF, False, False),
    "normalize_int": (0.0, 1.0, True, True),
    "k": (1, 1_000_000, True, True),
    "reward_lr": (0.0, 1.0, True, True),
    "reward_max_grad_norm": (0.0, INF, False, False),
    "anchor_weight": (0.0, INF, True, False),
    "drift_weight": (0.0, INF, True, False),
    "extreme_weight": (0.0, INF, True, False),
    "drift_ema": (0.0, 1.0, True, False),
    "novelty_coef": (0.0, INF, True, False),
    "rnd_lr": (0.0, 1.0, True, True),
    "ranking_temp": (0.0, INF, False, False),
    "potential_lr": (0.0, 1.0, True, True),
    "potential_max_grad_norm": (0.0, INF, False, False),
    "w_fit": (0.0, INF, True, False),
    "w_cons": (0.0, INF, True, False),
    "w_reg": (0.0, INF, True, False),
    "potential_init": (-INF, INF, False, False),
    "credit_clip": (0.0, INF, False, True),
    "icm_lr": (0.0, 1.0, True, True),
    "icm_eta": (0.0, INF, True, False),
    "icm_forward_weight": (0.0, 1.0, True, True),
    "meta_lr": (0.0, 1.0, True, True),
    "meta_max_grad_norm": (0.0, INF, False, False),
    "r_ext_coef": (0.0, INF, True, False),
    "r_int_coef": (0.0, INF, True, False),
}
assert set(HPARAM_RANGES) == set(HPARAM_FIELDS), set(HPARAM_FIELDS) ^ set(HPARAM_RANGES)

# Method defaults: the reward mixing each method is usually run with.
METHOD_DEFAULTS: dict[str, dict] = {
    "ppo": {},
    "dense": {},
    # Intrinsic-advantage weights (icm beta_int, coevo-novelty novelty_coef, meta r_int_coef): from a grid of
    # 0.01-0.03, 0.1, 0.3, 1 on KeyDoor-5x5 at the main job's budget, 8 tuning seeds kept apart from the
    # evaluation seeds (README, "Reward construction"), the largest weight whose final success stayed within
    # 0.05 of sparse PPO's (0.84 there): every bonus cost success on that task, more the larger its weight.
    "icm": {"beta_int": 0.1},
    # R_phi is a decomposition of the return, in the episodic stream, never normalised (signals/learned.py)
    "coevo-regression": {"beta_ext": 1.0, "beta_int": 0.5},
    "coevo-ranking": {"beta_ext": 1.0, "beta_int": 0.5},
    # the RND bonus, in the intrinsic stream, divided by a running RMS of its return
    "coevo-novelty": {"beta_ext": 1.0, "beta_int": 0.5, "normalize_int": 1.0, "novelty_coef": 0.3},
    # raw shaping: Phi is in units of the external return, so r_ext + F pays the outcome once (signals/potential.py)
    "siop": {"beta_ext": 1.0, "beta_int": 1.0, "normalize_int": 0.0},
    # raw R_phi: the untrained R_phi is ~0 (|r| < 0.01); divided by its own tiny return scale it would be O(1)
    # noise
    "meta": {"k": 1, "normalize_int": 0.0, "r_int_coef": 0.1},
}



class ConfigError(ValueError):
    """A configuration value outside its allowed range (raised before compiling)."""


def as_arrays(hp: HParams) -> HParams:
    """Cast every field to a JAX array of its declared dtype (int32 for ``k``)."""
    vals = {}
    for name in HPARAM_FIELDS:
        v = getattr(hp, name)
        dtype = jnp.int32 if name in _INT_FIELDS else jnp.float32
        if isinstance(v, jax.core.Tracer):
            vals[name] = v.astype(dtype) if v.dtype != dtype else v
        else:
            vals[name] = jnp.asarray(v, dtype)
    return HParams(**vals)


def default_hparams(method: str = "ppo", **overrides) -> HParams:
    """``HParams()`` with the method's usual reward mixing, then ``overrides``."""
    if method not in METHODS:
        raise ConfigError(f"method: unknown method {method!r}; choose one of {', '.join(METHODS)}")
    unknown = set(overrides) - set(HPARAM_FIELDS)
    if unknown:
        raise ConfigError(f"unknown HParams field(s) {sorted(unknown)}; fields are {', '.join(HPARAM_FIELDS)}")
    return as_arrays(dataclasses.replace(HParams(), **{**METHOD_DEFAULTS[method], **overrides}))


def _range_text(lo, hi, lo_inc, hi_inc) -> str:
    return f"{'[' if lo_inc else '('}{lo}, {hi}{']' if hi_inc else ')'}"


def validate_hparams(hp: HParams) -> HParams:
    """Check every leaf (scalar or batched) is finite and inside its range.

    Returns ``hp`` cast to arrays. Raises :class:`ConfigError` naming the field.
    """
    for name in HPARAM_FIELDS:
        v = getattr(hp, name)
        if isinstance(v, jax.core.Tracer):
            continue
        arr = np.asarray(v)
        if arr.dtype.kind not in "biuf":
            raise ConfigError(f"HParams.{name}: expected a number, got {v!r}")
        lo, hi, lo_inc, hi_inc = HPARAM_RANGES[name]
        if name in _INT_FIELDS and np.any(arr != np.round(arr)):
            raise ConfigError(f"HParams.{name}: must be an integer, got {arr.tolist()}")
        bad = ~np.isfinite(arr) | (arr < lo if lo_inc else arr <= lo) | (arr > hi if hi_inc else arr >= hi)
        if np.any(bad):
            shown = arr[bad].ravel()[0].item()
            raise ConfigError(
                f"HParams.{name}={shown} is outside the allowed range {_range_text(lo, hi, lo_inc, hi_inc)}"
            )
    return as_arrays(hp)


_STATIC_CHECKS: dict[str, tuple] = {
    "num_envs": (1, 1 << 20),
    "rollout_len": (1, 1 << 20),
    "total_steps": (1, 1 << 40),
    "num_minibatches": (1, 1 << 20),
    "update_epochs": (1, 1000),
    "d_model": (1, 4096),
    "num_layers": (1, 64),
    "num_heads": (1, 64),
    "action_embed_dim": (1, 4096),
    "reward_steps": (1, 10_000),
    "buffer_episodes": (2, 1 << 16),
    "max_episode_len": (1, 1 << 16),
    "potential_steps": (1, 10_000),
    "potential_buffer_episodes": (1, 1 << 16),
    "potential_episode_len": (1, 1 << 16),
    "ensemble_size": (1, 64),
    "credit_nstep": (1, 1024),
    "icm_feature_dim": (1, 4096),
    "meta_inner_steps": (1, 64),
    "meta_truncate": (0, 63),
}


def validate_static(static: StaticConfig) -> StaticConfig:
    """Check every field of ``static``; raise :class:`ConfigError` naming the first bad one."""
    if static.method not in METHODS:
        raise ConfigError(f"StaticConfig.method={static.method!r} is not one of {', '.join(METHODS)}")
    for name, (lo, hi) in _STATIC_CHECKS.items():
        v = getattr(static, name)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
            raise ConfigError(f"StaticConfig.{name}={v!r} must be an integer in [{lo}, {hi}]")
    for name in ("hidden_sizes", "reward_hidden", "potential_hidden"):
        v = getattr(static, name)
        if not isinstance(v, tuple) or not v or not all(isinstance(h, int) and h >= 1 for h in v):
            raise ConfigError(f"StaticConfig.{name}={v!r} must be a non-empty tuple of positive ints")
    if static.activation not in ("tanh", "relu"):
        raise ConfigError(f"StaticConfig.activation={static.activation!r} must be 'tanh' or 'relu'")
    if static.network not in ("auto", "mlp", "transformer"):
        raise ConfigError(f"StaticConfig.network={static.network!r} must be 'auto', 'mlp' or 'transformer'")
    for name in ("kv_cache", "packed_update"):
        if not isinstance(getattr(static, name), bool):
            raise ConfigError(f"StaticConfig.{name}={getattr(static, name)!r} must be True or False")
    if static.reward_input not in ("features", "obs"):
        raise ConfigError(f"StaticConfig.reward_input={static.reward_input!r} must be 'features' or 'obs'")
    if static.ensemble_combine not in ("mean", "min"):
        raise ConfigError(f"StaticConfig.ensemble_combine={static.ensemble_combine!r} must be 'mean' or 'min'")
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
    if static.meta_truncate >= static.meta_inner_steps:
        raise ConfigError(
            f"StaticConfig.meta_truncate={static.meta_truncate} must be < meta_inner_steps={static.meta_inner_steps}"
        )
    return static
