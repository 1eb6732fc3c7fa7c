"""KeyToDoor: the three-phase Key-to-Door credit-assignment task with distractor rewards (Hung et al.
2019, "Optimizing agent behavior over long time scales by transporting value"; Raposo et al. 2021,
"Synthetic returns for long-term credit assignment"; Mesnard et al. 2021, "Counterfactual credit
assignment in model-free reinforcement learning").

Three rooms in turn, each for a fixed number of steps: the key room (a key to pick up, nothing paid),
the apple room (apples paying ``U[0, 2 * apple_reward]``, independent of phase 1) and the door room
(the door pays ``door_reward`` only to an agent carrying the key). ``KeyToDoor(colors=2)``
(``KeyToDoor-Match``) is the memory version. Host-side ground truth: :func:`key_pickups`,
:func:`key_credit`. Design notes: ``docs/design.md``."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs_jax.core import Box, Discrete, EnvState, Environment
from envs_jax.grid._common import DIRS, ShapedParams, cell_mask, render_rows, same_cell, shaped_reward

Array = jax.Array

NUM_CHANNELS = 4  # agent, key, apple, door
NUM_PHASES = 3  # key room, apple room, door room
OFF_GRID = (-1, -1)  # the position of what is not there: an opened door, the memory version's other door otherwise
PHASE_NAMES = ("key", "apples", "door")


@struct.dataclass
class KeyToDoorParams(ShapedParams):
    """All leaves (sweepable under ``jax.vmap``): the phase lengths ``key_steps``, ``apple_steps``,
    ``door_steps`` (``max_steps_in_episode`` defaults to their sum); ``num_apples`` (at most
    ``size**2 - 1``); ``apple_reward`` (mean apple payoff, 0: no distractors); ``door_reward``;
    ``show_carrying`` (1: the carrying flag in every phase, 0: key room only); ``door_ends_episode``
    (0: fixed horizon); ``shaping_*`` as :class:`~envs_jax.grid._common.ShapedParams`."""

    max_steps_in_episode: int = 30
    key_steps: int = 6
    apple_steps: int = 16
    door_steps: int = 8
    num_apples: int = 6
    apple_reward: float = 1.0
    door_reward: float = 1.0
    show_carrying: int = 0
    door_ends_episode: int = 1


@struct.dataclass
class KeyToDoorState(EnvState):
    """One episode, unbatched; positions ``(x, y)`` int32 ``(2,)``, ``(-1, -1)`` when absent (an
    opened door; ``other_door`` unless ``colors = 2``). ``starts`` ``(3, 2)``: the agent's start per room;
    ``apples`` bool ``(size, size)`` ``[y, x]``: apples not yet eaten."""

    agent_pos: Array
    starts: Array
    key_pos: Array
    has_key: Array
    apples: Array
    door_pos: Array
    key_color: Array
    other_door: Array


# ----------------------------------------------------------------------------- pure pieces
def phase_of(time: Array, params: KeyToDoorParams) -> Array:
    """Int32 ``()``: 0 key room, 1 apple room, 2 door room at step count ``time``."""
    time = jnp.asarray(time)
    return ((time >= params.key_steps).astype(jnp.int32)
            + (time >= params.key_steps + params.apple_steps).astype(jnp.int32))


def phase_fraction(time: Array, params: KeyToDoorParams) -> Array:
    """Float32 ``()``: the fraction of the current phase elapsed at ``time``, in ``[0, 1]``."""
    phase = phase_of(time, params)
    starts = jnp.stack([0, params.key_steps, params.key_steps + params.apple_steps])
    lengths = jnp.stack([params.key_steps, params.apple_steps, params.door_steps])
    frac = (time - starts[phase]).astype(jnp.float32) / jnp.maximum(lengths[phase], 1).astype(jnp.float32)
    return jnp.clip(frac, 0.0, 1.0)


def sample_layout(key: Array, size: int, params: KeyToDoorParams, colors: int = 1) -> KeyToDoorState:
    """A random episode start (``time = 0``), jittable: distinct cells per room from one random
    permutation each (agent, then key / apples / doors); the key's colour is a fair coin."""
    cells = size * size
    order = jnp.argsort(jax.random.uniform(key, (NUM_PHASES, cells)), axis=-1).astype(jnp.int32)
    to_pos = lambda i: jnp.stack([i % size, i // size], axis=-1).astype(jnp.int32)
    rank = jnp.argsort(order[1])  # rank[c]: the place of cell c in the apple room's order
    apples = jnp.logical_and(rank >= 1, rank <= params.num_apples).reshape(size, size)
    starts = to_pos(order[:, 0])
    return KeyToDoorState(
        time=jnp.int32(0), agent_pos=starts[0], starts=starts, key_pos=to_pos(order[0, 1]),
        has_key=jnp.bool_(False), apples=apples, door_pos=to_pos(order[2, 1]),
        key_color=(jax.random.bernoulli(jax.random.fold_in(key, 1)).astype(jnp.int32) if colors == 2
                   else jnp.int32(0)),
        other_door=to_pos(order[2, 2]) if colors == 2 else jnp.asarray(OFF_GRID, jnp.int32),
    )


def observe(state: KeyToDoorState, params: KeyToDoorParams, colors: int = 1) -> Array:
    """Float32 ``(obs_size(size, colors),)`` observation (see the module docstring)."""
    n = state.apples.shape[0]
    phase = phase_of(state.time, params)
    on_floor = jnp.logical_and(phase == 0, jnp.logical_not(state.has_key))
    key_shown = jnp.logical_and(cell_mask(state.key_pos, n), on_floor)
    doors = jnp.logical_and(jnp.logical_or(cell_mask(state.door_pos, n), cell_mask(state.other_door, n)), phase == 2)
    channels = [cell_mask(state.agent_pos, n), key_shown, jnp.logical_and(state.apples, phase == 1), doors]
    if colors == 2:
        color1_door = jnp.where(state.key_color == 1, state.door_pos, state.other_door)
        channels.append(jnp.logical_or(jnp.logical_and(key_shown, state.key_color == 1),
                                       jnp.logical_and(cell_mask(color1_door, n), phase == 2)))
    grid = jnp.stack(channels, axis=-1).astype(jnp.float32)
    tail = jnp.concatenate([
        jax.nn.one_hot(phase, NUM_PHASES, dtype=jnp.float32),
        jnp.logical_and(state.has_key, jnp.logical_or(phase == 0, params.show_carrying != 0)).astype(jnp.float32)[None],
        phase_fraction(state.time, params)[None],
    ])
    return jnp.concatenate([grid.reshape(-1), tail])


def obs_size(size: int, colors: int = 1) -> int:
    """Length of the observation vector for ``size x size`` rooms (``colors = 2``: one more channel)."""
    return size * size * (NUM_CHANNELS + colors - 1) + NUM_PHASES + 2


def potential(state: KeyToDoorState, params: KeyToDoorParams) -> Array:
    """Float32 ``()`` ``Phi = -shaping_scale * door_reward * (1 - has_key)``."""
    missing = 1.0 - jnp.asarray(state.has_key, jnp.float32)
    return (-jnp.asarray(params.shaping_scale, jnp.float32) * jnp.asarray(params.door_reward, jnp.float32)
            * missing).astype(jnp.float32)


OPEN_DOOR = OFF_GRID  # door_pos of an opened door (off the grid: not drawn, blocks nothing)


def door_open(state: KeyToDoorState) -> Array:
    """Bool ``()``: the door has been opened (only a fixed-horizon episode goes on after it)."""
    return state.door_pos[0] < 0


def transition(key: Array, state: KeyToDoorState, action: Array, params: KeyToDoorParams):
    """One step: ``(next state, reward, opened, picked, wrong)`` (``wrong``: onto the other colour's
    door); the agent moves to the next room's start when the step ends a phase."""
    n = state.apples.shape[0]
    phase = phase_of(state.time, params)
    front = jnp.clip(state.agent_pos + jnp.asarray(DIRS)[jnp.asarray(action, jnp.int32)], 0, n - 1)
    at_door = jnp.logical_and(phase == 2, same_cell(front, state.door_pos))
    opened = jnp.logical_and(at_door, state.has_key)
    wrong = jnp.logical_and(phase == 2, same_cell(front, state.other_door))
    pos = jnp.where(jnp.logical_and(at_door, jnp.logical_not(state.has_key)), state.agent_pos, front)
    picked = jnp.logical_and(jnp.logical_and(phase == 0, jnp.logical_not(state.has_key)),
                             same_cell(pos, state.key_pos))
    here = cell_mask(pos, n)
    eaten = jnp.logical_and(phase == 1, jnp.any(jnp.logical_and(here, state.apples)))
    apple_pay = 2.0 * jnp.asarray(params.apple_reward, jnp.float32) * jax.random.uniform(key, (), jnp.float32)
    reward = jnp.where(eaten, apple_pay, 0.0) + jnp.where(opened, jnp.asarray(params.door_reward, jnp.float32), 0.0)
    time = state.time + 1
    new_phase = phase_of(time, params)
    pos = jnp.where(new_phase != phase, state.starts[new_phase], pos)
    nxt = state.replace(
        time=time, agent_pos=pos.astype(jnp.int32), has_key=jnp.logical_or(state.has_key, picked),
        apples=jnp.logical_and(state.apples, jnp.logical_not(jnp.logical_and(here, eaten))),
        door_pos=jnp.where(opened, jnp.asarray(OPEN_DOOR, jnp.int32), state.door_pos),
    )
    return nxt, reward.astype(jnp.float32), opened, picked, wrong


# ----------------------------------------------------------------------------- environment
class KeyToDoor(Environment):
    """Key-to-Door on ``size x size`` open rooms (a move off the grid stays put); ``size`` and
    ``colors`` fix shapes, the rest is :class:`KeyToDoorParams`. ``ValueError`` on invalid settings.

    Actions ``Discrete(4)``: 0 up, 1 right, 2 down, 3 left. Observation float32 ``(obs_size(size,
    colors),)``: the current room's cells (row-major ``[y, x]``), channels ``[agent, key, apple, door]``
    (plus ``colour 1`` when ``colors = 2``), then the phase one-hot (3), the carrying-key flag and the
    fraction of the phase elapsed. The door blocks like a wall without the key; opened, it terminates
    (``door_ends_episode = 0``: it vanishes and the episode runs to the time limit). With ``colors = 2``
    the door of the key's colour opens and the other terminates with nothing. ``info``: ``success``,
    ``key_picked`` (this step took the key), ``phase`` (after the step) and ``dense_reward``
    (``r + gamma Phi(s') - Phi(s)``, :meth:`potential`; ``Phi(s') = 0`` on a terminating step)."""

    optional_outputs = ("dense_reward", "success")

    def __init__(self, size: int = 4, colors: int = 1, **param_overrides):
        if size < 2:
            raise ValueError(f"KeyToDoor needs size >= 2, got {size}")
        if colors not in (1, 2):
            raise ValueError(f"KeyToDoor colors must be 1 or 2 (the memory version), got {colors}")
        self.size, self.colors = int(size), int(colors)
        self.name = "KeyToDoor-Distractor" if colors == 1 else "KeyToDoor-Match"
        base = KeyToDoorParams()
        unknown = sorted(set(param_overrides) - set(KeyToDoorParams.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown KeyToDoor parameter(s) {unknown}; expected some of "
                             f"{sorted(KeyToDoorParams.__dataclass_fields__)}")
        p = base.replace(**param_overrides)
        if "max_steps_in_episode" not in param_overrides:
            p = p.replace(max_steps_in_episode=int(p.key_steps) + int(p.apple_steps) + int(p.door_steps))
        if not 0 <= int(p.num_apples) <= self.size * self.size - 1:
            raise ValueError(f"num_apples must be in [0, {self.size * self.size - 1}] for size {self.size}, "
                             f"got {p.num_apples}")
        if int(p.door_ends_episode) not in (0, 1):
            raise ValueError(f"door_ends_episode must be 0 or 1, got {p.door_ends_episode}")
        if colors == 2 and int(p.door_ends_episode) != 1:
            raise ValueError("the memory version (colors=2) needs door_ends_episode=1 (the wrong door ends the"
                             f" episode), got door_ends_episode={p.door_ends_episode}")
        if min(int(p.key_steps), int(p.apple_steps), int(p.door_steps)) < 1:
            raise ValueError("key_steps, apple_steps and door_steps must be >= 1, got "
                             f"{p.key_steps}, {p.apple_steps}, {p.door_steps}")
        self._params = p

    @property
    def default_params(self) -> KeyToDoorParams:
        return self._params

    def action_space(self, params=None) -> Discrete:
        return Discrete(4)

    def observation_space(self, params=None) -> Box:
        return Box(0.0, 1.0, (obs_size(self.size, self.colors),), jnp.float32)

    def potential(self, state: KeyToDoorState, params: KeyToDoorParams | None = None) -> Array:
        """Float32 ``()`` shaping potential ``Phi(state)`` of ``info["dense_reward"]``."""
        return potential(state, self.default_params if params is None else params)

    def reset_env(self, key: Array, params: KeyToDoorParams):
        state = sample_layout(key, self.size, params, self.colors)
        return observe(state, params, self.colors), state

    def step_env(self, key: Array, state: KeyToDoorState, action: Array, params: KeyToDoorParams):
        nxt, reward, opened, picked, wrong = transition(key, state, action, params)
        terminated = jnp.logical_or(jnp.logical_and(opened, params.door_ends_episode != 0), wrong)
        dense = shaped_reward(reward, potential(state, params), potential(nxt, params), terminated,
                              params.shaping_gamma)
        info = {"success": door_open(nxt), "dense_reward": dense, "key_picked": picked,
                "phase": phase_of(nxt.time, params)}
        return observe(nxt, params, self.colors), nxt, reward, terminated, info

    def render(self, state: KeyToDoorState, params=None) -> str:
        """Text drawing of the current room (``A`` agent, ``K`` key, ``a`` apple, ``D`` door, ``X``
        the other door, ``.`` floor) and a phase / carrying-key line."""
        params = self.default_params if params is None else params
        s = jax.tree.map(np.asarray, state)
        phase = int(phase_of(s.time, params))
        n = self.size
        rows = [["." for _ in range(n)] for _ in range(n)]
        if phase == 0 and not bool(s.has_key):
            rows[int(s.key_pos[1])][int(s.key_pos[0])] = "K"
        if phase == 1:
            for y, x in zip(*np.nonzero(s.apples)):
                rows[y][x] = "a"
        if phase == 2 and not bool(door_open(s)):
            rows[int(s.door_pos[1])][int(s.door_pos[0])] = "D"
        if phase == 2 and self.colors == 2:
            rows[int(s.other_door[1])][int(s.other_door[0])] = "X"
        rows[int(s.agent_pos[1])][int(s.agent_pos[0])] = "A"
        carrying = "yes" if bool(s.has_key) else "no"
        colour = f", key colour {int(s.key_color)} (D its door, X the other)" if self.colors == 2 else ""
        return render_rows(rows) + f"\nphase: {PHASE_NAMES[phase]}, carrying key: {carrying}{colour}"


# ----------------------------------------------------------------------------- host-side ground truth
def key_pickups(obs: np.ndarray, action: np.ndarray, size: int, colors: int = 1) -> np.ndarray:
    """Bool ``[...]``: the steps that took the key, from observations ``[..., D]`` and actions
    ``[...]`` (a move onto the key's cell in the key room while it lies there)."""
    obs, action = np.asarray(obs), np.asarray(action)
    n, channels = size, NUM_CHANNELS + colors - 1
    grid = obs[..., : n * n * channels].reshape(obs.shape[:-1] + (n * n, channels))
    agent = np.argmax(grid[..., 0], -1)
    key_there = grid[..., 1] > 0.5
    key_cell = np.argmax(key_there, -1)
    in_key_room = obs[..., n * n * channels] > 0.5
    step = DIRS[np.clip(action, 0, 3)]
    tx = np.clip(agent % n + step[..., 0], 0, n - 1)
    ty = np.clip(agent // n + step[..., 1], 0, n - 1)
    return in_key_room & key_there.any(-1) & (ty * n + tx == key_cell)


def key_credit(obs: np.ndarray, action: np.ndarray, size: int, door_reward: float, colors: int = 1) -> np.ndarray:
    """Float64 ``[...]``: ground-truth credit, ``door_reward`` on the steps that took the key
    (:func:`key_pickups`), 0 elsewhere."""
    return np.where(key_pickups(obs, action, size, colors), float(door_reward), 0.0)
