"""The environment API (gymnax 1.0's interface and spaces, without importing gymnax at import
time), auto-reset, and the wrappers :class:`EpisodeStats` and :class:`DelayedReward`.

An environment is a stateless object of pure functions of ``(key, state, action, params)``; every
array lives in ``state`` or ``params`` (flax struct dataclasses), so ``jit`` and ``vmap`` apply
directly. Design notes: ``docs/design.md``."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

Array = jax.Array

#: The optional ``info`` keys an environment may report (and must then declare).
OPTIONAL_OUTPUTS = ("dense_reward", "success", "legal_mask")


# ----------------------------------------------------------------------------- spaces
# gymnax's own space classes, so that gymnax's wrappers (which check ``isinstance(space,
# gymnax.environments.spaces.Box)``) accept ours. Imported when a space is made, not when this
# module is: importing gymnax initialises JAX's backend (its environments build arrays at import),
# which must not happen on ``import envs_jax`` (``jax.distributed.initialize`` comes first).
def Discrete(n: int, dtype: Any = jnp.int32):
    """gymnax's ``Discrete(n)``: integer actions ``0..n-1``."""
    from gymnax.environments import spaces

    return spaces.Discrete(int(n), dtype=dtype)


def Box(low, high, shape: tuple, dtype: Any = jnp.float32):
    """gymnax's ``Box(low, high, shape, dtype)``."""
    from gymnax.environments import spaces

    return spaces.Box(low, high, tuple(shape), dtype)


# ----------------------------------------------------------------------------- base
@struct.dataclass
class EnvParams:
    """Parameters every environment has, gymnax's time limit; subclasses add their own leaves."""

    max_steps_in_episode: int = 100


@struct.dataclass
class EnvState:
    """State every environment has (gymnax's): the step counter within the episode."""

    time: Array


class Environment:
    """Base class. Subclasses implement ``reset_env``, ``step_env``, ``default_params``,
    ``action_space`` and ``observation_space``.

    ``step_env(key, state, action, params) -> (obs, state, reward, terminated, info)`` must increment
    ``state.time`` and return the same ``info`` keys every step; :meth:`step` adds truncation at
    ``params.max_steps_in_episode`` and the auto-reset. ``optional_outputs`` names exactly the keys of
    :data:`OPTIONAL_OUTPUTS` that ``info`` holds (test with :func:`provides`): ``dense_reward`` float32
    ``()`` (the reward plus a hand-designed shaping), ``success`` bool ``()`` (solved on this step),
    ``legal_mask`` bool ``(num_actions,)`` (legal actions for the returned observation; the env then has
    ``legal_mask(state, params)``). ``max_tokens_per_step``: for a token-buffer observation, the most
    tokens one step appends; ``None`` otherwise."""

    name: str = "Environment"
    optional_outputs: tuple[str, ...] = ()
    max_tokens_per_step: int | None = None

    # -- to implement
    @property
    def default_params(self) -> EnvParams:
        raise NotImplementedError

    def reset_env(self, key: Array, params: EnvParams) -> tuple[Array, Any]:
        raise NotImplementedError

    def step_env(self, key: Array, state: Any, action: Array, params: EnvParams):
        raise NotImplementedError

    def action_space(self, params: EnvParams | None = None) -> Discrete:
        raise NotImplementedError

    def observation_space(self, params: EnvParams | None = None) -> Box:
        raise NotImplementedError

    def render(self, state: Any, params: EnvParams | None = None) -> str:
        """Host-side text drawing of one (unbatched) state."""
        raise NotImplementedError

    # -- provided
    @property
    def num_actions(self) -> int:
        return self.action_space(self.default_params).n

    @property
    def unwrapped(self) -> Environment:
        """The innermost environment: ``self`` here, the wrapped env's for a :class:`Wrapper`."""
        return self

    def reset(self, key: Array, params: EnvParams | None = None) -> tuple[Array, Any]:
        """``(obs, state)`` of a fresh episode."""
        params = self.default_params if params is None else params
        return self.reset_env(key, params)

    def step(self, key: Array, state: Any, action: Array, params: EnvParams | None = None):
        """One transition with auto-reset: ``(obs, state, reward, terminated, truncated, info)``.

        ``reward`` float32 ``()``, flags bool ``()``, never both true (time limit: ``truncated``). When an
        episode ends, ``obs``/``state`` belong to the next one; ``info`` adds ``"terminated"``,
        ``"truncated"`` and ``"final_observation"`` (the observation before any reset), as gymnax 1.0."""
        params = self.default_params if params is None else params
        key_step, key_reset = jax.random.split(key)
        obs_st, state_st, reward, terminated, info = self.step_env(key_step, state, action, params)
        terminated = jnp.asarray(terminated, jnp.bool_)
        truncated = jnp.logical_and(state_st.time >= params.max_steps_in_episode, jnp.logical_not(terminated))
        done = jnp.logical_or(terminated, truncated)
        obs_re, state_re = self.reset_env(key_reset, params)
        state = jax.tree.map(lambda r, s: jnp.where(done, r, s), state_re, state_st)
        obs = jax.tree.map(lambda r, s: jnp.where(done, r, s), obs_re, obs_st)
        info = {**info, "terminated": terminated, "truncated": truncated, "final_observation": obs_st}
        return obs, state, jnp.asarray(reward, jnp.float32), terminated, truncated, info


def provides(env: Environment, name: str) -> bool:
    """True if ``env`` (wrapped or not) reports the optional ``info[name]``,
    ``name`` one of :data:`OPTIONAL_OUTPUTS`."""
    if name not in OPTIONAL_OUTPUTS:
        raise ValueError(f"unknown optional output {name!r}; expected one of {OPTIONAL_OUTPUTS}")
    return name in env.optional_outputs


# ----------------------------------------------------------------------------- wrappers
class Wrapper(Environment):
    """Delegates everything to ``env``; subclasses override what they change."""

    def __init__(self, env: Environment):
        self._env = env
        self.name = env.name

    def __getattr__(self, name):
        return getattr(self._env, name)

    @property
    def unwrapped(self) -> Environment:
        return self._env.unwrapped

    # the declared capabilities are the wrapped env's (the base's class attributes would hide ``__getattr__``)
    @property
    def optional_outputs(self) -> tuple[str, ...]:
        return self._env.optional_outputs

    @property
    def max_tokens_per_step(self) -> int | None:
        return self._env.max_tokens_per_step

    @property
    def default_params(self):
        return self._env.default_params

    def action_space(self, params=None):
        return self._env.action_space(self._inner_params(params))

    def observation_space(self, params=None):
        return self._env.observation_space(self._inner_params(params))

    def render(self, state, params=None):
        return self._env.render(self._inner_state(state), self._inner_params(params))

    def legal_mask(self, state, params=None):
        """The wrapped env's legal-action mask (only for envs that define one)."""
        return self._env.legal_mask(self._inner_state(state), self._inner_params(params))

    def _inner_params(self, params):
        return params

    def _inner_state(self, state):
        return state


@struct.dataclass
class EpisodeStatsState:
    env_state: Any
    episode_return: Array
    episode_length: Array
    returned_episode_returns: Array
    returned_episode_lengths: Array
    returned_episode_success: Array


class EpisodeStats(Wrapper):
    """Adds PureJaxRL ``LogWrapper`` keys to ``info``: ``returned_episode_returns``,
    ``returned_episode_lengths``, ``returned_episode_success`` (the finished episode's
    ``info["success"]``, else ``return > 0``), holding the last finished episode, and
    ``returned_episode`` (bool: an episode ended on this step)."""

    def reset(self, key, params=None):
        params = self.default_params if params is None else params
        obs, env_state = self._env.reset(key, params)
        z = jnp.float32(0.0)
        return obs, EpisodeStatsState(env_state, z, jnp.int32(0), z, jnp.int32(0), z)

    def step(self, key, state, action, params=None):
        params = self.default_params if params is None else params
        obs, env_state, reward, term, trunc, info = self._env.step(key, state.env_state, action, params)
        done = jnp.logical_or(term, trunc)
        ret = state.episode_return + reward
        length = state.episode_length + 1
        success = info["success"].astype(jnp.float32) if "success" in info else (ret > 0).astype(jnp.float32)
        new = EpisodeStatsState(
            env_state=env_state,
            episode_return=jnp.where(done, 0.0, ret),
            episode_length=jnp.where(done, 0, length),
            returned_episode_returns=jnp.where(done, ret, state.returned_episode_returns),
            returned_episode_lengths=jnp.where(done, length, state.returned_episode_lengths),
            returned_episode_success=jnp.where(done, success, state.returned_episode_success),
        )
        info = dict(info)
        info["returned_episode_returns"] = new.returned_episode_returns
        info["returned_episode_lengths"] = new.returned_episode_lengths
        info["returned_episode_success"] = new.returned_episode_success
        info["returned_episode"] = done
        return obs, new, reward, term, trunc, info

    def _inner_state(self, state):
        return state.env_state


@struct.dataclass
class DelayedRewardParams:
    """``env``: the wrapped environment's params; ``reward_freq``: pay every D steps."""

    env: Any
    reward_freq: Array = struct.field(default_factory=lambda: jnp.int32(20))

    @property
    def max_steps_in_episode(self):
        return self.env.max_steps_in_episode


@struct.dataclass
class DelayedRewardState:
    env_state: Any
    pending: Array
    steps: Array


class DelayedReward(Wrapper):
    """LIRPG's ``reward_freq`` protocol (Zheng, Oh and Singh 2018): the reward is withheld and the
    accumulated sum paid every ``params.reward_freq`` steps and when an episode ends (same total).
    ``info["undelayed_reward"]`` keeps the original; an env without ``dense_reward`` gets it as
    ``info["dense_reward"]`` (declared)."""

    def __init__(self, env: Environment, reward_freq: int = 20):
        super().__init__(env)
        self._reward_freq = int(reward_freq)
        self.name = f"{env.name}-Delayed{reward_freq}"

    @property
    def default_params(self):
        return DelayedRewardParams(self._env.default_params, jnp.int32(self._reward_freq))

    @property
    def optional_outputs(self) -> tuple[str, ...]:
        inner = self._env.optional_outputs
        return inner if "dense_reward" in inner else ("dense_reward",) + inner

    def _inner_params(self, params):
        return None if params is None else params.env

    def _inner_state(self, state):
        return state.env_state

    def reset(self, key, params=None):
        params = self.default_params if params is None else params
        obs, env_state = self._env.reset(key, params.env)
        return obs, DelayedRewardState(env_state, jnp.float32(0.0), jnp.int32(0))

    def step(self, key, state, action, params=None):
        params = self.default_params if params is None else params
        obs, env_state, reward, term, trunc, info = self._env.step(key, state.env_state, action, params.env)
        done = jnp.logical_or(term, trunc)
        pending = state.pending + reward
        steps = state.steps + 1
        pay = jnp.logical_or(done, steps % params.reward_freq == 0)
        paid = jnp.where(pay, pending, 0.0)
        info = dict(info)
        info["undelayed_reward"] = reward
        info.setdefault("dense_reward", reward)
        new = DelayedRewardState(env_state, jnp.where(pay, 0.0, pending), jnp.where(done, 0, steps))
        return obs, new, paid, term, trunc, info
