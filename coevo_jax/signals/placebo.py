"""Control reward sources: what a method's reward would be without its information.

* ``constant`` pays ``beta_ext * r_ext + beta_int * c`` with a fixed ``hp.signal.constant_reward = c``,
  mixed like ``coevo-regression``'s ``R_phi`` (the same episodic stream, the same ``beta_int`` default,
  unnormalised): with ``c > 0`` a living bonus, with ``c < 0`` a step penalty.
* ``siop-shuffled`` and ``coevo-shuffled`` (placebos) are ``siop`` and ``coevo-regression`` with each
  step's credit moved to a uniformly random step of the *same episode segment* of the rollout: every
  segment's credit keeps its sum, values, scale and sign balance, but not *which* step earned it.
* ``cue-bonus`` (DelayedChain only) pays ``beta_int`` for the action that equals the cue, on every step
  or only on the steps after the choice, where actions have no effect.

The frozen co-evolved reward needs no module: ``coevo-regression`` with ``reward_lr_ratio = 0``. What
each control rules out: ``docs/design.md``, ``coevo_jax.signals.placebo``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from envs_jax.chain import DelayedChain, cue_matches

from coevo_jax.params import INF, ConfigError, default_of, hyperparams, param, unit
from coevo_jax.registry import MethodSpec, method_spec, register_method
from coevo_jax.signals.base import RewardStreams, Signal, SignalParams, mixed_reward, no_observe, no_update
from coevo_jax.signals.potential import make_potential


# ----------------------------------------------------------------------------- constant reward
def make_constant(static, network, env, env_params) -> Signal:
    """``episodic = beta_ext * r_ext + beta_int * constant_reward`` every step (method ``constant``)."""

    def init(key, traj, hp):
        return ()

    def rewards(state, traj, hp):
        c = jnp.full(traj.reward.shape, hp.signal.constant_reward, jnp.float32)
        return state, RewardStreams(mixed_reward(hp, traj.reward, c)), {}

    return Signal(init, no_observe, no_update, rewards)


@hyperparams
class ConstantParams(SignalParams):
    """``constant``'s hyperparameters, mixed like ``coevo-regression``'s R_phi (``beta_int`` 0.5)."""

    beta_int: float = default_of(SignalParams, "beta_int", 0.5)
    constant_reward: float = param(0.02, -INF, INF, False, False,
                                   doc="the reward c added (times beta_int) at every step: > 0 a living bonus, < 0"
                                       " a step penalty")


register_method(MethodSpec(
    "constant", make_constant, ConstantParams, off={"beta_int": 0.0},
    doc="control: a constant reward per step in the episodic stream, mixed like coevo-regression's R_phi",
))


# ----------------------------------------------------------------------------- cue bonus (DelayedChain)
def make_cue_bonus(static, network, env, env_params) -> Signal:
    """``episodic = beta_ext * r_ext + beta_int * [action = cue]`` on every step, or with
    ``cue_after_choice = 1`` only on the steps after the choice (method ``cue-bonus``; DelayedChain only:
    :func:`envs_jax.chain.cue_matches`)."""
    if env is not None and not isinstance(env.unwrapped, DelayedChain):
        raise ConfigError(f"method 'cue-bonus' pays for the action that equals DelayedChain's cue; environment"
                          f" {env.unwrapped.name!r} shows no cue")

    def init(key, traj, hp):
        return ()

    def rewards(state, traj, hp):
        bonus = cue_matches(traj.obs, traj.action, hp.signal.cue_after_choice)
        return state, RewardStreams(mixed_reward(hp, traj.reward, bonus)), {}

    return Signal(init, no_observe, no_update, rewards)


@hyperparams
class CueBonusParams(SignalParams):
    """``cue-bonus``'s hyperparameters: ``beta_int`` is the bonus per matching step."""

    beta_int: float = default_of(SignalParams, "beta_int", 0.01)
    cue_after_choice: float = unit(0.0, doc="1: pay only on the steps after the choice (where actions have no"
                                            " effect), 0: on every step")


register_method(MethodSpec(
    "cue-bonus", make_cue_bonus, CueBonusParams, off={"beta_int": 0.0},
    doc="control (DelayedChain): a hand-written bonus for the action that equals the cue, on every step or only"
        " after the choice: help through the shared policy without any temporal credit",
))


# ----------------------------------------------------------------------------- shuffled credit
def shuffle_within_episodes(x: jax.Array, done: jax.Array, key: jax.Array) -> jax.Array:
    """``x [T, N]`` with each column's entries permuted uniformly at random
    within each episode segment (the steps between two ``done [T, N]`` ends;
    a step with ``done`` closes its segment). Segment sums are unchanged."""
    done = done.astype(jnp.int32)
    segment = (jnp.cumsum(done, axis=0) - done).astype(jnp.float32)  # episode ends strictly before t
    order = jnp.argsort(segment + jax.random.uniform(key, x.shape), axis=0)
    return jnp.take_along_axis(x, order, axis=0)


class ShuffledState(NamedTuple):
    inner: Any  # the shuffled method's own state (siop's PotentialState, coevo-regression's LearnedState)
    key: jax.Array  # drawn from for each rollout's permutation


def make_shuffled(inner_method: str, inner_factory):
    """A factory ``(static, network, env, env_params) -> Signal``: ``inner_method`` (made by ``inner_factory``)
    with its credit (its episodic stream at ``beta_ext = 0``, ``beta_int = 1``) shuffled in time
    within each episode segment; its own network trains exactly as the method's."""

    def factory(static, network=None, env=None, env_params=None) -> Signal:
        inner = inner_factory(dataclasses.replace(static, method=inner_method), network, env, env_params)  # its options

        def init(key, traj, hp):
            k_inner, k_shuffle = jax.random.split(key)
            return ShuffledState(inner.init(k_inner, traj, hp), k_shuffle)

        def observe(state, traj, hp, key):
            s, metrics = inner.observe(state.inner, traj, hp, key)
            return state._replace(inner=s), metrics

        def update(state, traj, policy, hp, key):
            s, metrics = inner.update(state.inner, traj, policy, hp, key)
            return state._replace(inner=s), metrics

        def rewards(state, traj, hp):
            # with beta_ext = 0 and beta_int = 1 the episodic stream is exactly the method's (scaled) credit
            s, streams, metrics = inner.rewards(state.inner, traj, hp.replace(beta_ext=0.0, beta_int=1.0))
            key, k = jax.random.split(state.key)
            credit = shuffle_within_episodes(streams.episodic, jnp.logical_or(traj.terminated, traj.truncated), k)
            out = RewardStreams(mixed_reward(hp, traj.reward, credit))
            return ShuffledState(s, key), out, metrics

        return Signal(init, observe, update, rewards)  # no credit: the shuffled reward is no function of (s, a)

    return factory


#: SIOP with its credit shuffled in time within each episode segment (method ``siop-shuffled``)
make_shuffled_potential = make_shuffled("siop", make_potential)
#: coevo-regression's R_phi shuffled in time within each episode segment (method ``coevo-shuffled``)
make_shuffled_learned = make_shuffled("coevo-regression", method_spec("coevo-regression").factory)

register_method(dataclasses.replace(
    method_spec("siop"), name="siop-shuffled", factory=make_shuffled_potential,
    doc="placebo: siop with each step's credit moved to a random step of the same episode segment",
))
register_method(dataclasses.replace(
    method_spec("coevo-regression"), name="coevo-shuffled", factory=make_shuffled_learned,
    doc="placebo: coevo-regression with R_phi's reward moved to a random step of the same episode segment"
        " (its size, sign balance and per-episode sums kept, its timing destroyed)",
))
