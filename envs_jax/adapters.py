"""Any gymnax-style environment in, this package's API out.

``from_gymnax(env, params)`` accepts gymnax 1.0 environments (``step`` returns
six values with ``terminated`` and ``truncated``) and older ones (five values
``obs, state, reward, done, info``; a ``done`` raised at the time limit counts
as ``truncated``). Observations are cast to float32 and flattened.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from envs_jax.core import Box, Discrete, EnvParams, Environment, register


@struct.dataclass
class GymnaxState:
    inner: Any
    time: jax.Array


@struct.dataclass
class GymnaxParams:
    inner: Any
    max_steps: int = struct.field(pytree_node=False, default=500)


class GymnaxAdapter(Environment):
    """Wraps ``env`` (a gymnax ``Environment`` object). Episode time limits stay
    the inner environment's; they are reported as ``truncated``."""

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
        params = self.default_params if params is None else params
        out = self._env.step(key, state.inner, action, params.inner)
        if self._six:
            obs, inner, reward, term, trunc, info = out
            final = info.get("final_observation", obs)
            term = jnp.asarray(term, jnp.bool_)
            trunc = jnp.logical_and(jnp.asarray(trunc, jnp.bool_), jnp.logical_not(term))
        else:
            obs, inner, reward, done, info = out
            final = obs  # old API: no final observation; the reset one is all there is
            timeout = state.time + 1 >= self._max_steps
            done = jnp.asarray(done, jnp.bool_)
            trunc = jnp.logical_and(done, timeout)
            term = jnp.logical_and(done, jnp.logical_not(timeout))
        done = jnp.logical_or(term, trunc)
        info = {"final_obs": self._obs(final)}
        time = jnp.where(done, 0, state.time + 1)
        return self._obs(obs), GymnaxState(inner, time), jnp.asarray(reward, jnp.float32), term, trunc, info

    def render(self, state, params=None) -> str:
        return f"{self.name} state: {jax.tree.map(lambda x: jnp.round(x, 3), state.inner)}"


def from_gymnax(env: Any, params: Any = None) -> GymnaxAdapter:
    """Wrap a gymnax environment object (1.0 or older ``step`` signature)."""
    return GymnaxAdapter(env, params)


def _gymnax_factory(name: str):
    def factory(**kwargs):
        import gymnax

        env, params = gymnax.make(name, **kwargs)
        return GymnaxAdapter(env, params)

    return factory


for _name in ("CartPole-v1", "Acrobot-v1", "MountainCar-v0"):
    register(_name, _gymnax_factory(_name))
