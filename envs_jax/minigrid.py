"""MiniGrid tasks from XLand-MiniGrid (``xminigrid``, Nikulin et al. 2024) in this package's API.

``from_xminigrid(env, params)`` wraps an ``xminigrid`` environment; every
``MiniGrid-*`` name xminigrid registers is registered here too, so
``envs_jax.make("MiniGrid-DoorKey-8x8")`` works. ``make(name, max_steps=T)``
sets the time limit; other keyword arguments go to ``xminigrid.make`` (fields
of its ``EnvParams``, e.g. ``view_size``).

Registration is lazy: importing ``xminigrid`` builds JAX arrays at module level,
which starts the XLA backend (~0.3-0.5 s, and it fixes the backend settings
before the user's own code runs), so ``import envs_jax`` registers the fixed
list :data:`MINIGRID_NAMES` (``tests/test_minigrid.py`` checks it against
``xminigrid.registered_environments()``) and ``xminigrid`` is imported on the
first ``make`` of one of them. For the same reason the tile and colour codes
are spelled out in :mod:`envs_jax.minigrid_grid` (checked against ``xminigrid`` in the tests).

Semantics (xminigrid's ``TimeStep``: ``step_type`` LAST ends an episode,
``discount == 0`` marks termination): ``terminated`` is the task ending (goal
reached; in ``Memory`` also the wrong object); the time limit
``params.max_steps_in_episode`` (by default xminigrid's, e.g. ``10 * H * W`` on DoorKey)
sets ``truncated``, never both. The reward is xminigrid's ``1 - 0.9 t / T`` on
success, else 0. ``info["success"]``: terminated with a positive reward.
Auto-reset and ``info["final_observation"]`` come from :class:`~envs_jax.core.Environment`.
The MiniGrid ports with xminigrid's generic ``step`` are stepped by
:func:`minigrid_step`, the same transition without the rule and goal
dispatch that the generic step evaluates in full (see :class:`MiniGridAdapter`).

Observation, float32 ``(V * V * 25 + 4 + 25,)`` (``V = view_size``, 7 by
default, so 1254): xminigrid's symbolic egocentric ``V x V`` view (rotated so
the agent faces up from the bottom centre; xminigrid's transparent view, in
which walls hide nothing behind them) with each cell's tile id one-hot over
the 13 tiles and its colour one-hot over the 12 colours, then the agent's
absolute direction one-hot (4), then the carried object (tile one-hot 13,
colour one-hot 12; all zero when the pocket is empty). One-hot
codes suit the MLP policy better than the raw integer ids (no false order
between, say, ``key = 7`` and ``door_locked = 8``). The direction is added
because the egocentric view alone hides the heading, which MiniGrid's own
``obs["direction"]`` supplies. The pocket is added because xminigrid (unlike
MiniGrid) does not draw the carried object into the view, so without it a
DoorKey agent could not tell whether it holds the key.

DoorKey (``MiniGrid-DoorKey-*``) also reports ``info["dense_reward"]`` and
``info["phase"]``, with the shaping convention of our own
:class:`~envs_jax.grid.KeyDoor`: ``dense_reward = reward + gamma * Phi(s') -
Phi(s)`` (Ng, Harada and Russell 1999), ``gamma = params.shaping_gamma``
(default 0.99; set it to the learner's discount), ``Phi(s') = 0`` on the step
that terminates, and ``Phi = -shaping_scale * (2 - phase + dist / max_dist) /
3``: ``phase`` 0 fetch the key (door locked, key not held), 1 reach the door
(locked with the key held, or closed), 2 reach the goal (door open), and
``dist`` the breadth-first-search distance on the env's grid, in JAX
(:func:`envs_jax.minigrid_grid.grid_distances`), from the agent to the current sub-goal cell, moving
through floor, goal, open doors and loose objects (a dropped key can be picked
up and moved, so it does not cut a path), capped at ``max_dist = (W - 3) + 2 (H
- 3)``, the longest such distance on an ``H x W`` DoorKey layout (door at one
end of the wall, agent in the far corner). ``env.potential(state, params)``
gives ``Phi``.
"""
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
    """``inner``: the xminigrid ``EnvParams`` (its fields are static: height,
    width, view_size, ...). ``max_steps`` (static): the time limit ``T``, also
    the ``T`` of the reward; it overrides ``inner.max_steps`` (every call into
    xminigrid gets :func:`xminigrid_params`), so ``params.replace(max_steps_in_episode=...)``
    and ``envs_jax.make(name, max_steps=...)`` change both."""

    inner: Any
    max_steps_in_episode: int = struct.field(pytree_node=False, default=100)


def xminigrid_params(params: MiniGridParams) -> Any:
    """The xminigrid ``EnvParams`` of ``params``, with ``max_steps`` from ``params``."""
    if params.inner.max_steps == params.max_steps_in_episode:
        return params.inner
    return params.inner.replace(max_steps=int(params.max_steps_in_episode))


@struct.dataclass
class DoorKeyParams(MiniGridParams):
    """Adds the shaping of ``info["dense_reward"]`` (leaves, sweepable under
    ``vmap``): ``shaping_scale`` (``Phi`` lies in ``[-shaping_scale, 0]``) and
    ``shaping_gamma`` (the ``gamma`` of ``gamma * Phi(s') - Phi(s)``; set it to
    the learner's discount), as :class:`envs_jax.grid.ShapedParams`."""

    shaping_scale: float = 1.0
    shaping_gamma: float = 0.99


@struct.dataclass
class MiniGridState(EnvState):
    """``inner``: the xminigrid ``State`` (``grid`` uint8 ``(H, W, 2)`` of
    ``[tile, colour]`` indexed ``[y, x]``; ``agent.position`` ``(y, x)``,
    ``agent.direction``, ``agent.pocket`` ``[tile, colour]``; ``step_num``).
    ``time``: int32 ``()``, equal to ``inner.step_num``."""

    inner: Any


# ----------------------------------------------------------------------------- observation
def obs_size(view_size: int) -> int:
    """Length of the observation vector for a ``view_size x view_size`` view."""
    return view_size * view_size * (NUM_TILES + NUM_COLORS) + 4 + NUM_TILES + NUM_COLORS


def encode_obs(view: Array, direction: Array, pocket: Array) -> Array:
    """Float32 ``(V * V * 25 + 4 + 25,)`` from the symbolic view uint8 ``(V, V, 2)``,
    the direction ``()`` and the pocket ``(2,)`` (see the module docstring)."""
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
    from xminigrid.core import goals

    cls = type(env)
    if not cls.__module__.startswith("xminigrid.envs.minigrid.") or cls.__name__ not in MINIGRID_GOALS:
        return None
    return getattr(goals, MINIGRID_GOALS[cls.__name__])


def minigrid_step(goal_cls: Any, inner: Any, action: Array, xparams: Any):
    """``(view uint8 (V, V, 2), inner, reward float32 (), terminated bool ())``:
    xminigrid's generic ``Environment.step`` for an environment without rules
    whose goal is always of type ``goal_cls``. The generic step runs every
    one of the 12 rule and 15 goal checks (``lax.switch`` on the encodings,
    all evaluated under ``vmap``); calling the one goal check directly gives
    the same transition (``tests/test_minigrid.py`` compares them) at about a
    third of the compile time."""
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
    """uint32 ``(2,)`` key data (xminigrid stores the key in its state, which is selected with ``where``)."""
    return jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key


class MiniGridAdapter(Environment):
    """An ``xminigrid`` environment in this package's API (see the module docstring).

    ``env``: an xminigrid ``Environment`` object; ``params``: its ``EnvParams``
    (default: ``env.default_params()``). Six actions: 0 forward, 1 turn right,
    2 turn left, 3 pick up, 4 put down, 5 toggle. ``lean`` (default True):
    step the MiniGrid ports of :data:`MINIGRID_GOALS` with :func:`minigrid_step`
    (the same transition, compiled ~3x faster) rather than xminigrid's generic
    ``step``; other environments (``Memory``, XLand) always use their own.
    """

    optional_outputs = ("success",)

    def __init__(self, env: Any, params: Any = None, name: str | None = None, lean: bool = True):
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
        """True when steps go through :func:`minigrid_step` (see the class docstring)."""
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
        """``(view, inner, reward, terminated)`` from the env's own ``step``; xminigrid
        ends an episode with a LAST ``TimeStep`` whose ``discount`` is 0 on
        termination and 1 on the time limit."""
        ts = self._timestep_cls(state=inner, step_type=self._mid, reward=jnp.float32(0.0),
                                discount=jnp.float32(1.0), observation=None)
        ts = self._xstep_fn(xparams, ts, action)
        return ts.observation, ts.state, ts.reward, jnp.asarray(ts.discount, jnp.float32) == 0.0

    def step_env(self, key: Array, state: MiniGridState, action: Array, params: MiniGridParams):
        obs, nxt, reward, terminated, success = self._inner_step(state, action, params)
        return obs, nxt, reward, terminated, {"success": success}

    def render(self, state: MiniGridState, params=None) -> str:
        """Text drawing of one unbatched state: ``#`` wall, ``.`` floor, ``G``
        goal, ``K`` key, ``L``/``C``/``/`` locked/closed/open door, ``o s p h *``
        ball/square/pyramid/hex/star, blank outside the map, ``^>v<`` the agent;
        then ``carrying: <colour> <tile>`` (or ``nothing``) and the step count."""
        grid = np.asarray(state.inner.grid)
        rows = [[TILE_GLYPHS[int(t)] for t in row] for row in grid[..., 0]]
        y, x = (int(v) for v in np.asarray(state.inner.agent.position))
        rows[y][x] = AGENT_GLYPHS[int(state.inner.agent.direction)]
        tile, color = (int(v) for v in np.asarray(state.inner.agent.pocket))
        carrying = "nothing" if tile == EMPTY else f"{COLORS[color]} {TILES[tile].replace('_', ' ')}"
        lines = ["".join(r) for r in rows] + [f"carrying: {carrying}", f"step: {int(state.time)}"]
        return "\n".join(lines)


class MiniGridDoorKey(MiniGridAdapter):
    """``MiniGrid-DoorKey-*`` with the sub-goal shaping ``info["dense_reward"]``
    and ``info["phase"]`` (see the module docstring)."""

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
    """Wrap an xminigrid environment object (``params``: its ``EnvParams``,
    default ``env.default_params()``; ``lean``: see :class:`MiniGridAdapter`).
    DoorKey environments get the shaped :class:`MiniGridDoorKey`; every other
    one the plain :class:`MiniGridAdapter`."""
    from xminigrid.envs.minigrid.doorkey import DoorKey

    cls = MiniGridDoorKey if isinstance(env, DoorKey) else MiniGridAdapter
    return cls(env, params, name, lean)


def _factory(name: str):
    def factory(**kwargs):
        import xminigrid

        env, params = xminigrid.make(name, **kwargs)
        return from_xminigrid(env, params, name)

    return factory


for _name in MINIGRID_NAMES:
    register(_name, _factory(_name))
