"""MiniGrid tasks from XLand-MiniGrid (``xminigrid``, Nikulin et al. 2024) in this package's API.

:func:`from_xminigrid` wraps an ``xminigrid`` environment. Every name of :data:`MINIGRID_NAMES` is
registered without importing ``xminigrid`` (imported on the first ``make``), so
``envs_jax.make("MiniGrid-DoorKey-8x8", max_steps=T)`` works; other keyword arguments go to
``xminigrid.make`` (fields of its ``EnvParams``, e.g. ``view_size``). Design notes: ``docs/design.md``."""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs_jax.core import Box, Discrete, EnvState, Environment
from envs_jax.registry import register
from envs_jax.grid._common import shaped_reward
from envs_jax.minigrid_grid import (AGENT_GLYPHS, COLORS, EMPTY, NUM_COLORS, NUM_TILES, TILE_GLYPHS, TILES,
                                   doorkey_potential)

Array = jax.Array

#: Every ``MiniGrid-*`` name of xminigrid 0.9.3, registered here without importing it.
MINIGRID_NAMES = (
    "MiniGrid-BlockedUnlockPickUp",
    "MiniGrid-DoorKey-5x5", "MiniGrid-DoorKey-6x6", "MiniGrid-DoorKey-8x8", "MiniGrid-DoorKey-16x16",
    "MiniGrid-Empty-5x5", "MiniGrid-Empty-6x6", "MiniGrid-Empty-8x8", "MiniGrid-Empty-16x16",
    "MiniGrid-EmptyRandom-5x5", "MiniGrid-EmptyRandom-6x6", "MiniGrid-EmptyRandom-8x8", "MiniGrid-EmptyRandom-16x16",
    "MiniGrid-FourRooms", "MiniGrid-LockedRoom",
    "MiniGrid-MemoryS8", "MiniGrid-MemoryS16", "MiniGrid-MemoryS32", "MiniGrid-MemoryS64", "MiniGrid-MemoryS128",
    "MiniGrid-Playground", "MiniGrid-Unlock", "MiniGrid-UnlockPickUp",
)


# ----------------------------------------------------------------------------- params and state
@struct.dataclass
class MiniGridParams:
    """``inner``: xminigrid's ``EnvParams`` (static fields); ``max_steps_in_episode`` (static): the time
    limit ``T``, also the ``T`` of the reward; it overrides ``inner.max_steps`` (:func:`xminigrid_params`)."""

    inner: Any
    max_steps_in_episode: int = struct.field(pytree_node=False, default=100)


def xminigrid_params(params: MiniGridParams) -> Any:
    """The xminigrid ``EnvParams`` of ``params``, with ``max_steps`` from ``params``."""
    if params.inner.max_steps == params.max_steps_in_episode:
        return params.inner
    return params.inner.replace(max_steps=int(params.max_steps_in_episode))


@struct.dataclass
class DoorKeyParams(MiniGridParams):
    """Adds the leaves ``shaping_scale`` and ``shaping_gamma`` of ``info["dense_reward"]``, as
    :class:`envs_jax.grid.ShapedParams`."""

    shaping_scale: float = 1.0
    shaping_gamma: float = 0.99


@struct.dataclass
class MiniGridState(EnvState):
    """``inner``: xminigrid's ``State`` (``grid`` uint8 ``(H, W, 2)`` of ``[tile, colour]`` indexed
    ``[y, x]``, ``agent``, ``step_num``); ``time``: int32 ``()``, equal to ``inner.step_num``."""

    inner: Any


# ----------------------------------------------------------------------------- observation
def obs_size(view_size: int) -> int:
    """Length of the observation vector for a ``view_size x view_size`` view."""
    return view_size * view_size * (NUM_TILES + NUM_COLORS) + 4 + NUM_TILES + NUM_COLORS


def encode_obs(view: Array, direction: Array, pocket: Array) -> Array:
    """Float32 ``(V * V * 25 + 4 + 25,)`` from the view uint8 ``(V, V, 2)``, the direction ``()`` and
    the pocket ``(2,)``, all one-hot (see :class:`MiniGridAdapter`)."""
    cells = jnp.concatenate([jax.nn.one_hot(view[..., 0], NUM_TILES, dtype=jnp.float32),
                             jax.nn.one_hot(view[..., 1], NUM_COLORS, dtype=jnp.float32)], axis=-1)
    holding = pocket[0] != EMPTY
    carried = jnp.concatenate([jax.nn.one_hot(pocket[0], NUM_TILES, dtype=jnp.float32),
                               jax.nn.one_hot(pocket[1], NUM_COLORS, dtype=jnp.float32)]) * holding
    return jnp.concatenate([cells.reshape(-1), jax.nn.one_hot(direction, 4, dtype=jnp.float32), carried])


# ----------------------------------------------------------------------------- a lean xminigrid step
#: The goal type of each MiniGrid port (``xminigrid.envs.minigrid``) that uses
#: xminigrid's generic ``step``; all of them have no rules (only ``EmptyRule``).
#: ``Memory`` has its own ``step`` and is not listed.
MINIGRID_GOALS = {
    "DoorKey": "AgentOnTileGoal", "Empty": "AgentOnTileGoal", "EmptyRandom": "AgentOnTileGoal",
    "FourRooms": "AgentOnTileGoal", "LockedRoom": "AgentOnTileGoal", "Playground": "EmptyGoal",
    "Unlock": "TileOnPositionGoal", "UnlockPickUp": "AgentHoldGoal", "BlockedUnlockPickUp": "AgentHoldGoal",
}


def minigrid_goal_class(env: Any):
    """The xminigrid goal class of a MiniGrid port listed in :data:`MINIGRID_GOALS`, else ``None``."""
    # lazy: xminigrid's import is slow and starts JAX's backend
    from xminigrid.core import goals

    cls = type(env)
    if not cls.__module__.startswith("xminigrid.envs.minigrid.") or cls.__name__ not in MINIGRID_GOALS:
        return None
    return getattr(goals, MINIGRID_GOALS[cls.__name__])


def minigrid_step(goal_cls: Any, inner: Any, action: Array, xparams: Any):
    """``(view uint8 (V, V, 2), inner, reward float32 (), terminated bool ())``: xminigrid's generic
    ``Environment.step`` for an environment without rules whose goal is always ``goal_cls``, running
    that one goal check (``tests/test_minigrid.py`` checks the transitions are the same)."""
    # lazy: xminigrid's import is slow and starts JAX's backend
    from xminigrid.core.actions import take_action
    from xminigrid.core.observation import transparent_field_of_view

    grid, agent, changed = take_action(inner.grid, inner.agent, action)
    inner = inner.replace(grid=grid, agent=agent, step_num=inner.step_num + 1)
    view = transparent_field_of_view(grid, agent, xparams.view_size, xparams.view_size)
    terminated = jnp.asarray(goal_cls.decode(inner.goal_encoding)(grid, agent, action, changed), jnp.bool_)
    t = inner.step_num.astype(jnp.float32) / jnp.float32(xparams.max_steps)
    return view, inner, jnp.where(terminated, 1.0 - 0.9 * t, 0.0).astype(jnp.float32), terminated


# ----------------------------------------------------------------------------- environments
def _raw_key(key: Array) -> Array:
    """uint32 ``(2,)`` key data (xminigrid keeps the key in its state, selected with ``where``)."""
    return jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key


class MiniGridAdapter(Environment):
    """An ``xminigrid`` environment (``params``: its ``EnvParams``, default ``env.default_params()``).

    Six actions: 0 forward, 1 turn right, 2 turn left, 3 pick up, 4 put down, 5 toggle. Observation
    float32 ``(V * V * 25 + 4 + 25,)`` (``V = view_size``): xminigrid's transparent egocentric view (the
    agent at the bottom centre, facing up), per cell tile one-hot (13) and colour one-hot (12), then the
    absolute direction one-hot (4) and the carried object (tile and colour one-hot, zeros when empty).
    ``terminated``: the goal (in ``Memory`` also the wrong object); the time limit truncates. Reward:
    xminigrid's ``1 - 0.9 t / T`` on success, else 0; ``info["success"]``: terminated with a positive
    reward. ``lean`` (default True): step the ports of :data:`MINIGRID_GOALS` with :func:`minigrid_step`."""

    optional_outputs = ("success",)

    def __init__(self, env: Any, params: Any = None, name: str | None = None, lean: bool = True):
        # lazy: xminigrid's import is slow and starts JAX's backend
        from xminigrid.environment import Environment as XEnvironment
        from xminigrid.types import StepType, TimeStep

        self._xenv = env
        self._xparams = env.default_params() if params is None else params
        if self._xparams.max_steps is None:
            raise ValueError(f"{type(env).__name__}: xminigrid params need a max_steps")
        self._timestep_cls, self._mid = TimeStep, StepType.MID
        self.name = name or f"MiniGrid-{type(env).__name__}"
        # jitted: inlined under an outer jit, and one compile rather than slow op-by-op
        # dispatch when called eagerly (xminigrid's layout samplers are many small ops)
        self._reset_fn = jax.jit(env.reset)  # (xparams, key) -> TimeStep
        self._xstep_fn = jax.jit(env.step)  # (xparams, TimeStep, action) -> TimeStep
        goal = minigrid_goal_class(env) if lean and type(env).step is XEnvironment.step else None
        self._lean_step_fn = None if goal is None else jax.jit(functools.partial(minigrid_step, goal))

    @property
    def lean(self) -> bool:
        """True when steps go through :func:`minigrid_step`."""
        return self._lean_step_fn is not None

    @property
    def default_params(self) -> MiniGridParams:
        return MiniGridParams(self._xparams, int(self._xparams.max_steps))

    def action_space(self, params=None) -> Discrete:
        return Discrete(int(self._xenv.num_actions(self._inner(params))))

    def observation_space(self, params=None) -> Box:
        return Box(0.0, 1.0, (obs_size(int(self._inner(params).view_size)),), jnp.float32)

    def _inner(self, params):
        return self._xparams if params is None else xminigrid_params(params)

    def _obs(self, view: Array, inner: Any) -> Array:
        return encode_obs(view, inner.agent.direction, inner.agent.pocket)

    def reset_env(self, key: Array, params: MiniGridParams):
        ts = self._reset_fn(xminigrid_params(params), _raw_key(key))
        inner = ts.state.replace(step_num=jnp.asarray(ts.state.step_num, jnp.int32))
        return self._obs(ts.observation, inner), MiniGridState(time=inner.step_num, inner=inner)

    def _inner_step(self, state: MiniGridState, action: Array, params: MiniGridParams):
        """``(obs, next_state, reward, terminated, success)`` of one xminigrid step (no reset)."""
        action = jnp.asarray(action, jnp.int32)
        xparams = xminigrid_params(params)
        if self.lean:
            view, inner, reward, terminated = self._lean_step_fn(state.inner, action, xparams)
        else:
            view, inner, reward, terminated = self._xminigrid_step(state.inner, action, xparams)
        inner = inner.replace(step_num=jnp.asarray(inner.step_num, jnp.int32))
        nxt = MiniGridState(time=inner.step_num, inner=inner)
        reward = jnp.asarray(reward, jnp.float32)
        return self._obs(view, inner), nxt, reward, terminated, jnp.logical_and(terminated, reward > 0)

    def _xminigrid_step(self, inner: Any, action: Array, xparams: Any):
        """``(view, inner, reward, terminated)`` from the env's own ``step`` (a LAST ``TimeStep`` with
        ``discount`` 0 is a termination, with 1 the time limit)."""
        ts = self._timestep_cls(state=inner, step_type=self._mid, reward=jnp.float32(0.0),
                                discount=jnp.float32(1.0), observation=None)
        ts = self._xstep_fn(xparams, ts, action)
        return ts.observation, ts.state, ts.reward, jnp.asarray(ts.discount, jnp.float32) == 0.0

    def step_env(self, key: Array, state: MiniGridState, action: Array, params: MiniGridParams):
        obs, nxt, reward, terminated, success = self._inner_step(state, action, params)
        return obs, nxt, reward, terminated, {"success": success}

    def render(self, state: MiniGridState, params=None) -> str:
        """Text drawing of one unbatched state (``#`` wall, ``.`` floor, ``G`` goal, ``K`` key, ``L C /``
        locked, closed, open door, ``o s p h *`` objects, ``^>v<`` agent), the pocket and the step count."""
        grid = np.asarray(state.inner.grid)
        rows = [[TILE_GLYPHS[int(t)] for t in row] for row in grid[..., 0]]
        y, x = (int(v) for v in np.asarray(state.inner.agent.position))
        rows[y][x] = AGENT_GLYPHS[int(state.inner.agent.direction)]
        tile, color = (int(v) for v in np.asarray(state.inner.agent.pocket))
        carrying = "nothing" if tile == EMPTY else f"{COLORS[color]} {TILES[tile].replace('_', ' ')}"
        lines = ["".join(r) for r in rows] + [f"carrying: {carrying}", f"step: {int(state.time)}"]
        return "\n".join(lines)


class MiniGridDoorKey(MiniGridAdapter):
    """``MiniGrid-DoorKey-*`` with ``info["phase"]`` (0 fetch the key, 1 reach the door, 2 reach the
    goal) and ``info["dense_reward"] = r + gamma Phi(s') - Phi(s)`` (``gamma = shaping_gamma``,
    ``Phi(s') = 0`` on termination), ``Phi = -shaping_scale * (2 - phase + dist / max_dist) / 3``,
    ``dist`` the BFS distance to the current sub-goal (:mod:`envs_jax.minigrid_grid`)."""

    optional_outputs = ("dense_reward", "success")

    @property
    def default_params(self) -> DoorKeyParams:
        return DoorKeyParams(self._xparams, int(self._xparams.max_steps))

    def potential(self, state: MiniGridState, params: DoorKeyParams | None = None) -> Array:
        """Float32 ``()`` shaping potential ``Phi(state)`` in ``[-shaping_scale, 0]`` (0 at the goal)."""
        params = self.default_params if params is None else params
        return self._potential(state, params)[0]

    def _potential(self, state, params):
        inner = params.inner
        return doorkey_potential(state.inner, int(inner.height), int(inner.width), params.shaping_scale)

    def step_env(self, key: Array, state: MiniGridState, action: Array, params: DoorKeyParams):
        obs, nxt, reward, terminated, success = self._inner_step(state, action, params)
        phi_next, phase = self._potential(nxt, params)
        dense = shaped_reward(reward, self._potential(state, params)[0], phi_next, terminated, params.shaping_gamma)
        return obs, nxt, reward, terminated, {"success": success, "dense_reward": dense, "phase": phase}


def from_xminigrid(env: Any, params: Any = None, name: str | None = None, lean: bool = True) -> MiniGridAdapter:
    """Wrap an xminigrid environment: :class:`MiniGridDoorKey` for DoorKey, else
    :class:`MiniGridAdapter` (``params``, ``lean``: see there)."""
    # lazy: xminigrid's import is slow and starts JAX's backend
    from xminigrid.envs.minigrid.doorkey import DoorKey

    cls = MiniGridDoorKey if isinstance(env, DoorKey) else MiniGridAdapter
    return cls(env, params, name, lean)


def _factory(name: str):
    def factory(**kwargs):
        # lazy: xminigrid's import is slow and starts JAX's backend
        import xminigrid

        env, params = xminigrid.make(name, **kwargs)
        return from_xminigrid(env, params, name)

    return factory


for _name in MINIGRID_NAMES:
    register(_name, _factory(_name))
