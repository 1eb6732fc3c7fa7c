"""A fixed-horizon variant of any episodic environment: every episode lasts exactly ``H`` steps and
the task's reward is paid at step ``H`` (:class:`FixedHorizon`; ``envs_jax.make(...,
fixed_horizon=H)``). Design notes: ``docs/design.md``."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs_jax.core import Environment, EnvState, Wrapper, provides

Array = jax.Array

#: Optional ``info`` keys the wrapper recomputes instead of holding.
REWRITTEN_KEYS = ("success", "dense_reward", "legal_mask")


def check_horizon(horizon: Any) -> int:
    """``horizon`` as an ``int``; ``ValueError`` unless it is an integer >= 1."""
    try:
        h = int(horizon)
    except (TypeError, ValueError):
        raise ValueError(f"fixed_horizon must be an integer >= 1, got {horizon!r}") from None
    if h != horizon or h < 1:
        raise ValueError(f"fixed_horizon must be an integer >= 1, got {horizon!r}")
    return h


@struct.dataclass
class FixedHorizonParams:
    """``env``: the wrapped env's params (handed over with ``max_steps_in_episode = horizon``);
    ``horizon``: ``H``, a leaf (sweepable under ``vmap``); ``max_steps_in_episode`` (read-only) is ``H``."""

    env: Any
    horizon: int = 100

    @property
    def max_steps_in_episode(self):
        return self.horizon


@struct.dataclass
class FixedHorizonState(EnvState):
    """One episode, unbatched. ``time``: int32 ``()`` in ``0..H``; ``env_state``: the inner state, frozen
    once absorbed; ``obs``: the inner env's latest observation; ``absorbed``: bool ``()`` the inner task
    ended; ``earned``: float32 ``()`` inner reward so far; ``succeeded``: bool ``()``; ``held_info``: the
    inner ``info`` keys other than :data:`REWRITTEN_KEYS` of the last live step (zeros before it)."""

    env_state: Any
    obs: Array
    absorbed: Array
    earned: Array
    succeeded: Array
    held_info: dict


# ----------------------------------------------------------------------------- pure pieces
def select(pred: Array, on_true: Any, on_false: Any) -> Any:
    """Leafwise ``jnp.where(pred, on_true, on_false)`` over two pytrees of one structure (``pred`` bool ``()``)."""
    return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


def held_keys(info: dict) -> dict:
    """The entries of an inner ``info`` that are held while absorbed (all but :data:`REWRITTEN_KEYS`)."""
    return {k: v for k, v in info.items() if k not in REWRITTEN_KEYS}


def advance(state: FixedHorizonState, obs: Array, env_state: Any, reward: Array, ended: Array,
            success: Array, info: dict) -> FixedHorizonState:
    """The wrapper state after one step from the inner step's outputs (ignored when
    ``state.absorbed``); ``reward`` float32 ``()``, ``ended``/``success`` bool ``()``."""
    live = jnp.logical_not(state.absorbed)
    return FixedHorizonState(
        time=(state.time + 1).astype(jnp.int32),
        env_state=select(live, env_state, state.env_state),
        obs=select(live, obs, state.obs),
        absorbed=jnp.logical_or(state.absorbed, ended),
        earned=(state.earned + jnp.where(live, reward, 0.0)).astype(jnp.float32),
        succeeded=jnp.logical_or(state.succeeded, jnp.logical_and(live, success)),
        held_info=select(live, held_keys(info), state.held_info),
    )


def payout(state: FixedHorizonState, horizon) -> tuple[Array, Array]:
    """``(reward, at_horizon)``: float32 ``()`` the held total on step ``H`` (else 0), bool ``()``."""
    at_horizon = state.time >= jnp.asarray(horizon, jnp.int32)
    return jnp.where(at_horizon, state.earned, 0.0).astype(jnp.float32), at_horizon


# ----------------------------------------------------------------------------- wrapper
class FixedHorizon(Wrapper):
    """``env`` with every episode exactly ``horizon`` steps long.

    When the inner task ends early (inner ``terminated``, or its time limit), the wrapper is absorbed:
    the observation stays the inner final one, actions do nothing and the reward earned is held. At
    step ``H`` the held total is paid and the episode ends ``terminated`` (never ``truncated``); every
    other step pays 0. The inner env runs with time limit ``H`` (so MiniGrid's ``1 - 0.9 t / T`` uses
    ``T = H``). ``info``: ``success`` (on step ``H``: the task succeeded at some step), ``dense_reward``
    (the inner shaping term before absorption, 0 after, plus the reward paid at ``H``), ``legal_mask``
    (all True while absorbed), other inner keys held at their last live value. The inner env must
    implement ``reset_env``/``step_env`` (``ValueError`` otherwise); other wrappers go outside."""

    def __init__(self, env: Environment, horizon: int):
        if type(env).step_env is Environment.step_env or type(env).reset_env is Environment.reset_env:
            raise ValueError(
                f"FixedHorizon steps the inner environment's reset_env/step_env, which {env.name} "
                f"({type(env).__name__}) does not implement; wrappers such as DelayedReward and EpisodeStats "
                "go outside FixedHorizon"
            )
        super().__init__(env)
        self._horizon = check_horizon(horizon)
        self.name = f"{env.name}-Horizon{self._horizon}"

    @property
    def default_params(self) -> FixedHorizonParams:
        return self.wrap_params(self._env.default_params)

    def wrap_params(self, env_params: Any, horizon: int | None = None) -> FixedHorizonParams:
        """Params for this wrapper around the inner ``env_params`` (their time limit set to the horizon)."""
        h = self._horizon if horizon is None else check_horizon(horizon)
        return FixedHorizonParams(env=env_params.replace(max_steps_in_episode=h), horizon=h)

    def _inner_params(self, params):
        return None if params is None else params.env.replace(max_steps_in_episode=params.horizon)

    def _inner_state(self, state):
        return state.env_state

    def _blank_info(self, key: Array, env_state: Any, env_params: Any) -> dict:
        """Zeros shaped like the held part of the inner ``info`` (traced, never run)."""
        space = self._env.action_space(env_params)
        action = jnp.zeros(space.shape, space.dtype)
        shapes = jax.eval_shape(lambda k, s: self._env.step_env(k, s, action, env_params)[4], key, env_state)
        return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), held_keys(shapes))

    def reset_env(self, key: Array, params: FixedHorizonParams):
        env_params = self._inner_params(params)
        obs, env_state = self._env.reset_env(key, env_params)
        state = FixedHorizonState(
            time=jnp.int32(0),
            env_state=env_state,
            obs=obs,
            absorbed=jnp.bool_(False),
            earned=jnp.float32(0.0),
            succeeded=jnp.bool_(False),
            held_info=self._blank_info(key, env_state, env_params),
        )
        return obs, state

    def step_env(self, key: Array, state: FixedHorizonState, action: Array, params: FixedHorizonParams):
        env_params = self._inner_params(params)
        obs, env_state, reward, terminated, info = self._env.step_env(key, state.env_state, action, env_params)
        reward = jnp.asarray(reward, jnp.float32)
        ended = jnp.logical_or(jnp.asarray(terminated, jnp.bool_), env_state.time >= env_params.max_steps_in_episode)
        success = jnp.asarray(info["success"], jnp.bool_) if provides(self._env, "success") else jnp.bool_(False)
        new = advance(state, obs, env_state, reward, ended, success, info)
        paid, at_horizon = payout(new, params.horizon)
        out = dict(new.held_info)
        if provides(self._env, "success"):
            out["success"] = jnp.logical_and(at_horizon, new.succeeded)
        if provides(self._env, "dense_reward"):
            shaping = jnp.asarray(info["dense_reward"], jnp.float32) - reward
            out["dense_reward"] = (jnp.where(state.absorbed, 0.0, shaping) + paid).astype(jnp.float32)
        if provides(self._env, "legal_mask"):
            out["legal_mask"] = self.legal_mask(new, params)
        return new.obs, new, paid, at_horizon, out

    def step(self, key: Array, state: FixedHorizonState, action: Array, params: FixedHorizonParams | None = None):
        """The base class's step (auto-reset), with ``info["legal_mask"]`` recomputed for the returned
        state."""
        params = self.default_params if params is None else params
        obs, state, reward, terminated, truncated, info = super().step(key, state, action, params)
        if provides(self, "legal_mask"):
            info["legal_mask"] = self.legal_mask(state, params)
        return obs, state, reward, terminated, truncated, info

    def legal_mask(self, state: FixedHorizonState, params: FixedHorizonParams | None = None) -> Array:
        """Bool ``(num_actions,)``: the inner env's mask, all True while absorbed."""
        params = self.default_params if params is None else params
        mask = self._env.legal_mask(state.env_state, self._inner_params(params))
        return jnp.logical_or(mask, state.absorbed)

    def render(self, state: FixedHorizonState, params: FixedHorizonParams | None = None) -> str:
        """The inner drawing plus a ``horizon: step t/H, running|absorbed ...`` line."""
        params = self.default_params if params is None else params
        inner = self._env.render(state.env_state, self._inner_params(params))
        t, h = int(np.asarray(state.time)), int(np.asarray(params.horizon))
        if bool(np.asarray(state.absorbed)):
            status = f"absorbed (task over, holding reward {float(np.asarray(state.earned)):.3f})"
        else:
            status = "running"
        return f"{inner}\nhorizon: step {t}/{h}, {status}"
