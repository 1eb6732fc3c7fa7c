"""Any gymnax-style environment in, this package's API out.

``from_gymnax(env, params)`` accepts gymnax 1.0 environments (``step`` returns
six values with ``terminated`` and ``truncated``) and older ones (five values
``obs, state, reward, done, info``; a ``done`` raised at the time limit counts
as ``truncated``). Observations are cast to float32 and flattened. The adapter
steps the inner ``step_env`` and resets itself, so ``info["final_observation"]`` is
always the observation the step reached (the old ``step`` only returns the
reset one). The inner ``info`` is dropped: adapted envs report none of the
optional outputs (``optional_outputs = ()``).

``from_xminigrid(env, params)`` (from :mod:`envs_jax.minigrid`) does the same
for XLand-MiniGrid environments.

The other way: :class:`FiveValueStep` turns any gymnax 1.0 environment (this
package's or gymnax's own) into the pre-1.0 five-value ``step`` that code
written for older gymnax (PureJaxRL's ``ppo.py`` and its wrappers) unpacks.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from envs_jax.core import Box, Discrete, Environment
from envs_jax.registry import register
from envs_jax.minigrid import from_xminigrid  # noqa: F401  (public name: envs_jax.adapters.from_xminigrid)


@struct.dataclass
class GymnaxState:
    inner: Any
    time: jax.Array


@struct.dataclass
class GymnaxParams:
    inner: Any
    max_steps_in_episode: int = struct.field(pytree_node=False, default=500)


class GymnaxAdapter(Environment):
    """Wraps ``env`` (a gymnax ``Environment`` object: ``reset_env``,
    ``step_env``, ``step``, ``action_space``, and ``is_truncated`` for the 1.0
    API). Episode time limits stay the inner environment's; they are reported
    as ``truncated``."""

    optional_outputs = ()

    def __init__(self, env: Any, params: Any = None):
        self._env = env
        self._params = env.default_params if params is None else params
        self.name = getattr(env, "name", type(env).__name__)
        max_steps = getattr(self._params, "max_steps_in_episode", None)
        self._max_steps = int(max_steps) if max_steps is not None else 10**9
        key = jax.random.key(0)
        obs, state = env.reset(key, self._params)
        out = jax.eval_shape(lambda s: env.step(key, s, 0, self._params), state)
        self._six = len(out) == 6
        self._obs_shape = (int(jnp.size(obs)),)

    @property
    def default_params(self) -> GymnaxParams:
        return GymnaxParams(self._params, self._max_steps)

    def action_space(self, params=None) -> Discrete:
        space = self._env.action_space(self._params if params is None else params.inner)
        if not hasattr(space, "n"):
            raise ValueError(f"{self.name}: only discrete action spaces are supported")
        return Discrete(int(space.n))

    def observation_space(self, params=None) -> Box:
        return Box(-jnp.inf, jnp.inf, self._obs_shape, jnp.float32)

    def _obs(self, obs):
        return jnp.reshape(obs, (-1,)).astype(jnp.float32)

    def reset_env(self, key, params):
        obs, state = self._env.reset_env(key, params.inner)
        return self._obs(obs), GymnaxState(state, jnp.int32(0))

    def reset(self, key, params=None):
        params = self.default_params if params is None else params
        return self.reset_env(key, params)

    def step(self, key, state, action, params=None):
        """One transition with auto-reset, done here rather than by the inner
        ``step``: the inner ``step_env`` (no reset), the flags, then the inner
        ``reset_env`` selected where the episode ended, so ``info["final_observation"]``
        is the true pre-reset observation for both ``step`` signatures (the old
        five-value ``step`` hands back only the reset one)."""
        params = self.default_params if params is None else params
        key_step, key_reset = jax.random.split(key)  # as gymnax's own step
        obs_st, inner_st, reward, done, _ = self._env.step_env(key_step, state.inner, action, params.inner)
        term, trunc = self._flags(jnp.asarray(done, jnp.bool_), inner_st, state.time + 1, params)
        ended = jnp.logical_or(term, trunc)
        obs_re, inner_re = self._env.reset_env(key_reset, params.inner)
        select = lambda re, st: jax.tree.map(lambda r, s: jnp.where(ended, r, s), re, st)
        new = GymnaxState(select(inner_re, inner_st), jnp.where(ended, 0, state.time + 1).astype(jnp.int32))
        obs = self._obs(select(obs_re, obs_st))
        info = {"terminated": term, "truncated": trunc, "final_observation": self._obs(obs_st)}
        return obs, new, jnp.asarray(reward, jnp.float32), term, trunc, info

    def _flags(self, done, inner_st, time, params):
        """``(terminated, truncated)`` from ``step_env``'s ``done`` flag. gymnax
        1.0's ``done`` is the natural termination and ``is_truncated`` the time
        limit; before 1.0 ``done`` included the time limit, so a ``done`` at
        ``max_steps`` (``time``: steps taken, counted here) counts as truncated."""
        if self._six:
            trunc = jnp.asarray(self._env.is_truncated(inner_st, params.inner), jnp.bool_)
            return done, jnp.logical_and(trunc, jnp.logical_not(done))
        timeout = time >= params.max_steps_in_episode
        return jnp.logical_and(done, jnp.logical_not(timeout)), jnp.logical_and(done, timeout)

    def render(self, state, params=None) -> str:
        return f"{self.name} state: {jax.tree.map(lambda x: jnp.round(x, 3), state.inner)}"


class FiveValueStep:
    """A gymnax 1.0 environment behind the pre-1.0 ``step``: ``(obs, state,
    reward, done, info)`` with ``done = terminated | truncated`` (the old
    ``done``, which included the time limit) and ``info`` without the three keys
    1.0 added (``terminated``, ``truncated``, ``final_observation``). Everything
    else is the wrapped env's. The same adapter serves gymnax's own CartPole and
    every environment of this package."""

    NEW_INFO_KEYS = ("terminated", "truncated", "final_observation")

    def __init__(self, env: Any):
        self._env = env

    def __getattr__(self, name):
        return getattr(self._env, name)

    def reset(self, key, params=None):
        return self._env.reset(key, params)

    def step(self, key, state, action, params=None):
        obs, state, reward, terminated, truncated, info = self._env.step(key, state, action, params)
        info = {k: v for k, v in info.items() if k not in self.NEW_INFO_KEYS}
        return obs, state, reward, jnp.logical_or(terminated, truncated), info


def from_gymnax(env: Any, params: Any = None) -> GymnaxAdapter:
    """Wrap a gymnax environment object (1.0 or older ``step`` signature)."""
    return GymnaxAdapter(env, params)


def _gymnax_factory(name: str):
    def factory(**kwargs):
        # lazy: gymnax's import is slow and starts JAX's backend (see envs_jax.core's spaces)
        import gymnax

        env, params = gymnax.make(name, **kwargs)
        return GymnaxAdapter(env, params)

    return factory


def _bsuite_factory(name: str, params_fields: tuple, episode_len=None):
    """bsuite's experiments as gymnax ships them (Osband et al. 2020, "Behaviour Suite for RL"): keyword
    arguments named in ``params_fields`` set the env's parameters (e.g. ``chain_length``), the others go
    to its constructor (e.g. ``n_distractor``). ``episode_len(params)``: the steps after which the env
    always terminates; the time limit is set to it (gymnax's 100 or 1000 would never bind first), so the
    dynamics are unchanged and a replay's row (the time limit) holds the episode without padding."""
    def factory(**kwargs):
        # lazy: gymnax's import is slow and starts JAX's backend (see envs_jax.core's spaces)
        import gymnax

        env, params = gymnax.make(name, **{k: v for k, v in kwargs.items() if k not in params_fields})
        params = params.replace(**{k: v for k, v in kwargs.items() if k in params_fields})
        if episode_len is not None:
            params = params.replace(max_steps_in_episode=int(episode_len(params)))
        return GymnaxAdapter(env, params)

    return factory


for _name in ("CartPole-v1", "Acrobot-v1", "MountainCar-v0"):
    register(_name, _gymnax_factory(_name))
register("UmbrellaChain-bsuite", _bsuite_factory("UmbrellaChain-bsuite", ("chain_length",),  # n_distractor
                                                  lambda p: p.chain_length))
register("DiscountingChain-bsuite", _bsuite_factory("DiscountingChain-bsuite", ()))  # mapping_seed, n_actions
register("MemoryChain-bsuite", _bsuite_factory("MemoryChain-bsuite", ("memory_length",),  # num_bits
                                               lambda p: p.memory_length + 1))
