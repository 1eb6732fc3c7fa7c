"""A "give up" action for any episodic environment: one more action that, taken twice in a row, ends
the episode with reward 0 (:class:`GiveUp`; ``envs_jax.make(..., give_up=True)``). Design notes:
``docs/design.md``."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from envs_jax.core import Discrete, Environment, EnvState, Wrapper, provides

Array = jax.Array


@struct.dataclass
class GiveUpState(EnvState):
    """``env_state``: the inner state; ``obs``: its latest observation; ``armed``: bool ``()`` the last
    action was a first give-up; ``time``: the inner step count."""

    env_state: Any
    obs: Array
    armed: Array


class GiveUp(Wrapper):
    """``env`` plus action ``n`` (the inner env has ``0 .. n-1``): taken once it arms (the inner state is
    not stepped, the clock advances), taken again at once it ends the episode (``terminated``); any
    other action disarms. Both give-up steps return the current observation and reward 0; ``info``:
    ``success`` False, ``dense_reward`` the inner potential shaping (``gamma Phi(s) - Phi(s)``, then
    ``-Phi(s)``; needs the inner ``potential(state, params)``), ``legal_mask`` with ``True`` appended;
    other keys as the inner step with action 0. ``ValueError`` for an inner env without
    ``reset_env``/``step_env``."""

    def __init__(self, env: Environment):
        if type(env).step_env is Environment.step_env or type(env).reset_env is Environment.reset_env:
            raise ValueError(f"GiveUp steps the inner environment's reset_env/step_env, which {env.name} "
                             f"({type(env).__name__}) does not implement")
        if provides(env, "dense_reward") and not hasattr(env, "potential"):
            raise ValueError(f"GiveUp needs {env.name}'s potential(state, params) to shape the give-up step's "
                             "dense reward")
        super().__init__(env)
        self.name = f"{env.name}-GiveUp"

    @property
    def give_up_action(self) -> int:
        """The index of the added action (the inner env's action count)."""
        return self._env.action_space(self._env.default_params).n

    def action_space(self, params=None) -> Discrete:
        return Discrete(self._env.action_space(params).n + 1)

    def _inner_state(self, state: GiveUpState):
        return state.env_state

    def reset_env(self, key: Array, params):
        obs, env_state = self._env.reset_env(key, params)
        return obs, GiveUpState(time=env_state.time, env_state=env_state, obs=obs, armed=jnp.bool_(False))

    def step_env(self, key: Array, state: GiveUpState, action: Array, params):
        give_up = jnp.asarray(action) == self.give_up_action
        quit_ = jnp.logical_and(give_up, state.armed)
        obs, env_state, reward, terminated, info = self._env.step_env(
            key, state.env_state, jnp.where(give_up, 0, action), params)
        held = state.env_state.replace(time=state.env_state.time + 1)
        env_state = jax.tree.map(lambda a, b: jnp.where(give_up, a, b), held, env_state)
        obs = jnp.where(give_up, state.obs, obs)
        info = dict(info)
        if provides(self._env, "success"):
            info["success"] = jnp.logical_and(jnp.logical_not(give_up), info["success"])
        if provides(self._env, "dense_reward"):
            phi = jnp.asarray(self._env.potential(state.env_state, params), jnp.float32)
            still = jnp.where(quit_, 0.0, params.shaping_gamma * phi) - phi  # Phi(terminal) = 0
            info["dense_reward"] = jnp.where(give_up, still, info["dense_reward"]).astype(jnp.float32)
        new = GiveUpState(time=env_state.time, env_state=env_state, obs=obs,
                          armed=jnp.logical_and(give_up, jnp.logical_not(state.armed)))
        if provides(self._env, "legal_mask"):
            info["legal_mask"] = self.legal_mask(new, params)
        reward = jnp.where(give_up, 0.0, jnp.asarray(reward, jnp.float32)).astype(jnp.float32)
        terminated = jnp.logical_and(jnp.logical_not(give_up), jnp.asarray(terminated, jnp.bool_))
        return obs, new, reward, jnp.logical_or(quit_, terminated), info

    def legal_mask(self, state: GiveUpState, params=None) -> Array:
        """Bool ``(n + 1,)``: the inner env's mask, and giving up (always legal)."""
        params = self.default_params if params is None else params
        return jnp.concatenate([self._env.legal_mask(state.env_state, params), jnp.ones((1,), jnp.bool_)])

    def render(self, state: GiveUpState, params=None) -> str:
        return self._env.render(state.env_state, params) + f"\n(action {self.give_up_action}: give up)"
