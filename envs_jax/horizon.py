"""A fixed-horizon variant of any episodic environment: every episode lasts
exactly ``H`` steps and the task's reward is paid at step ``H``.

On an episodic task that ends when it is solved (the grid worlds end on reaching
the goal), ending the episode early is itself an outcome a learned reward can
exploit: a living penalty then reads as progress. :class:`FixedHorizon` removes
that shortcut:

* When the inner task ends before ``H`` (inner ``terminated``, e.g. the goal or
  a trap, or an inner time limit the inner env forces early), the wrapper enters
  an *absorbing* state: the observation stays the inner task's final
  observation, actions do nothing, and the reward earned so far is held.
* At step ``H`` the held reward total is paid as one reward and the episode ends
  with ``terminated=True`` (the horizon is the task's natural end: nothing is
  bootstrapped beyond it) and ``truncated=False``. Every other step pays 0.
* The inner env runs with its time limit set to ``H``, so reward formulas that
  read ``max_steps`` (MiniGrid's ``1 - 0.9 t / T``) use ``T = H``.

The wrapper is built on the inner env's ``reset_env``/``step_env``; the one
auto-reset is the base class's, around the wrapper's own ``step_env``.
``params.max_steps_in_episode`` (read by that base class, and by anything that asks for the
episode length) is ``H``: at ``time == H`` the wrapper reports ``terminated``,
and the base class only truncates a step that did not terminate, so its time
limit can never fire first (and ``time`` never exceeds ``H``, as the episode
ends there).

``info`` (same keys every step):

* ``success`` (when the inner env declares it): on step ``H``, whether the inner
  task succeeded at any step of the episode; False on every other step.
* ``dense_reward`` (when declared): the inner shaping term (inner dense reward
  minus inner reward) on the steps before absorption, 0 while absorbed, plus the
  reward paid at ``H``. The shaping terms are the inner env's own, at the same
  steps, so over an episode they telescope exactly as the inner episode's do
  (for potential shaping, ``gamma**T Phi(s_T) [not terminated] - Phi(s_0)`` with
  ``T`` the step the inner task ended, ``H`` if it never did; in that case the
  last term keeps the inner env's ``gamma Phi(s_H)``, as on its own time-out).
* ``legal_mask`` (when declared): the inner env's mask for the returned
  observation; all True while absorbed (every action is then a no-op).
* every other inner key: the inner value while the task runs, held at its value
  from the last live step while absorbed.

Wrap only environments that implement ``reset_env``/``step_env`` (not ones that
replace ``step``, such as the gymnax adapter), and apply other wrappers
(:class:`~envs_jax.core.DelayedReward`, :class:`~envs_jax.core.EpisodeStats`)
outside this one; :func:`envs_jax.make` with ``fixed_horizon=H`` does so.
"""
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
    """``env``: the wrapped env's params; ``horizon``: ``H``, the exact episode
    length (a leaf, so it can be swept under ``jax.vmap``). The wrapper always
    hands the inner env ``env.replace(max_steps_in_episode=horizon)``. ``max_steps``
    (read-only) is ``H``: see the module docstring for why."""

    env: Any
    horizon: int = 100

    @property
    def max_steps_in_episode(self):
        return self.horizon


@struct.dataclass
class FixedHorizonState(EnvState):
    """One episode's state (unbatched shapes).

    ``time``: int32 ``()`` wrapper steps taken, ``0..H``. ``env_state``: the
    inner state, frozen once absorbed. ``obs``: the inner env's latest
    observation (its final one once absorbed). ``absorbed``: bool ``()`` the inner
    task has ended. ``earned``: float32 ``()`` inner reward so far, paid at
    ``H``. ``succeeded``: bool ``()`` the inner task succeeded at some step.
    ``held_info``: the inner ``info`` keys other than :data:`REWRITTEN_KEYS`, as
    of the last live step (zeros before the first step).
    """

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
    """The wrapper state after one step, given the inner step's outputs (used
    only if the task was still running; ignored when ``state.absorbed``).
    ``reward`` float32 ``()``, ``ended``/``success`` bool ``()``."""
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
    """``(reward, at_horizon)`` of the step that produced ``state``: float32 ``()``
    the held total on step ``H`` (else 0), and bool ``()`` the step is step ``H``."""
    at_horizon = state.time >= jnp.asarray(horizon, jnp.int32)
    return jnp.where(at_horizon, state.earned, 0.0).astype(jnp.float32), at_horizon


# ----------------------------------------------------------------------------- wrapper
class FixedHorizon(Wrapper):
    """``env`` with every episode exactly ``horizon`` steps long, its reward paid
    at the last step (see the module docstring)."""

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
        """The base class's step (auto-reset); ``info["legal_mask"]`` is then
        recomputed for the returned, possibly reset, state."""
        params = self.default_params if params is None else params
        obs, state, reward, terminated, truncated, info = super().step(key, state, action, params)
        if provides(self, "legal_mask"):
            info["legal_mask"] = self.legal_mask(state, params)
        return obs, state, reward, terminated, truncated, info

    def legal_mask(self, state: FixedHorizonState, params: FixedHorizonParams | None = None) -> Array:
        """Bool ``(num_actions,)``: the inner env's mask, all True while absorbed
        (only for inner envs that define ``legal_mask``)."""
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
