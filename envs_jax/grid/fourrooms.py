"""FourRooms: the four-rooms grid of Sutton, Precup and Singh (1999), "Between MDPs and semi-MDPs: a
framework for temporal abstraction in reinforcement learning", with the wall layout of gymnax's
``FourRooms-misc``."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs_jax.core import Box, Discrete, EnvState, Environment
from envs_jax.grid._common import (
    DIRS, ShapedParams, bfs_distances, cell_mask, goal_reward, nth_true, parse_map, potential,
    render_rows, same_cell, shaped_reward, take_index,
)

Array = jax.Array

#: gymnax's ``four_rooms_map`` (``x`` = wall).
FOUR_ROOMS_MAP = """
xxxxxxxxxxxxx
x     x     x
x     x     x
x           x
x     x     x
x     x     x
xx xxxx     x
x     xxx xxx
x     x     x
x     x     x
x           x
x     x     x
xxxxxxxxxxxxx
"""

#: The four doorway cells ``(x, y)``.
DOORWAYS = ((6, 3), (2, 6), (9, 7), (6, 10))

NUM_CHANNELS = 3  # wall, goal, agent
UNREACHABLE = 10**4


@struct.dataclass
class FourRoomsParams(ShapedParams):
    """``max_steps_in_episode``: the time limit ``T`` (also in the reward); ``shaping_scale``,
    ``shaping_gamma``: see :class:`~envs_jax.grid._common.ShapedParams`. All leaves."""

    max_steps_in_episode: int = 200


@struct.dataclass
class FourRoomsState(EnvState):
    """``agent_pos``, ``goal_pos``: int32 ``(2,)`` as ``(x, y)``; ``time``: int32 ``()``."""

    agent_pos: Array
    goal_pos: Array


def room_labels(walls: np.ndarray, doorways=DOORWAYS) -> np.ndarray:
    """Int ``(H, W)``: room id 0..k-1 of each floor cell, -1 on walls and doorways."""
    blocked = walls.copy()
    for x, y in doorways:
        blocked[y, x] = True
    labels = np.full(walls.shape, -1, dtype=np.int32)
    room = 0
    for y in range(walls.shape[0]):
        for x in range(walls.shape[1]):
            if not blocked[y, x] and labels[y, x] < 0:
                labels[bfs_distances(blocked, (x, y)) >= 0] = room
                room += 1
    return labels


def all_pairs_distances(walls: np.ndarray) -> np.ndarray:
    """Int32 ``(H*W, H*W)``: shortest-path moves between flat cells ``y*W + x``;
    ``UNREACHABLE`` for walls and disconnected pairs."""
    h, w = walls.shape
    table = np.full((h * w, h * w), UNREACHABLE, dtype=np.int32)
    for y in range(h):
        for x in range(w):
            d = bfs_distances(walls, (x, y)).reshape(-1)
            table[y * w + x] = np.where(d >= 0, d, UNREACHABLE)
    return table


class FourRooms(Environment):
    """Four rooms on a 13x13 grid (walls included) joined by one-cell doorways; agent and goal start in
    two different rooms (never on a doorway). Actions ``Discrete(4)``: 0 up, 1 right, 2 down, 3 left (a
    move into a wall stays put). The goal terminates with ``1 - 0.9 t / max_steps`` (default 200), else 0.
    Observation float32 ``(13 * 13 * 3,)``: per cell (``[y, x]``) channels ``[wall, goal, agent]``.
    ``info``: ``success``, ``phase`` (always 0), ``dense_reward = r + gamma Phi(s') - Phi(s)``
    (:meth:`potential`; ``Phi(s') = 0`` on termination)."""

    optional_outputs = ("dense_reward", "success")

    def __init__(self):
        self.name = "FourRooms"
        self.walls_np = parse_map(FOUR_ROOMS_MAP)
        self.size = self.walls_np.shape[0]
        self.rooms_np = room_labels(self.walls_np)
        if self.rooms_np.max() != 3:
            raise AssertionError("the four-rooms map must split into exactly four rooms")
        #: Host copy of the all-pairs shortest-path table, ``(169, 169)``.
        self.distance_table = all_pairs_distances(self.walls_np)
        self.max_dist = float(self.distance_table[self.distance_table < UNREACHABLE].max())

    @property
    def default_params(self) -> FourRoomsParams:
        return FourRoomsParams(max_steps_in_episode=200)

    def action_space(self, params=None) -> Discrete:
        return Discrete(4)

    def observation_space(self, params=None) -> Box:
        return Box(0.0, 1.0, (self.size * self.size * NUM_CHANNELS,), jnp.float32)

    # -- pure pieces
    def distance(self, pos: Array, goal: Array) -> Array:
        """Int32 ``()`` true shortest-path distance from ``pos`` to ``goal``."""
        table = jnp.asarray(self.distance_table)
        return table[pos[1] * self.size + pos[0], goal[1] * self.size + goal[0]]

    def potential(self, state: FourRoomsState, params: FourRoomsParams | None = None) -> Array:
        """Float32 ``()`` ``Phi = -shaping_scale * d / d_max`` in ``[-shaping_scale, 0]``, ``d`` the
        shortest-path distance to the goal (an all-pairs table computed at construction)."""
        params = self.default_params if params is None else params
        dist = self.distance(state.agent_pos, state.goal_pos)
        return potential(jnp.int32(0), dist, self.max_dist, num_phases=1, scale=params.shaping_scale)

    def observe(self, state: FourRoomsState) -> Array:
        n = self.size
        grid = jnp.stack(
            [jnp.asarray(self.walls_np), cell_mask(state.goal_pos, n), cell_mask(state.agent_pos, n)], axis=-1
        ).astype(jnp.float32)
        return grid.reshape(-1)

    def reset_env(self, key: Array, params: FourRoomsParams):
        word = jax.random.bits(key, (2,), jnp.uint32)  # one draw: cheap to compile
        rooms = jnp.asarray(self.rooms_np.reshape(-1))
        n = self.size
        in_room = rooms >= 0
        agent_idx = nth_true(in_room, take_index(word[0], jnp.sum(in_room))[0])
        other = jnp.logical_and(in_room, rooms != rooms[agent_idx])
        goal_idx = nth_true(other, take_index(word[1], jnp.sum(other))[0])
        to_pos = lambda i: jnp.stack([i % n, i // n]).astype(jnp.int32)
        state = FourRoomsState(time=jnp.int32(0), agent_pos=to_pos(agent_idx), goal_pos=to_pos(goal_idx))
        return self.observe(state), state

    def step_env(self, key: Array, state: FourRoomsState, action: Array, params: FourRoomsParams):
        action = jnp.asarray(action, jnp.int32)
        front = jnp.clip(state.agent_pos + jnp.asarray(DIRS)[action], 0, self.size - 1)
        wall = jnp.asarray(self.walls_np)[front[1], front[0]]
        pos = jnp.where(wall, state.agent_pos, front).astype(jnp.int32)
        nxt = state.replace(agent_pos=pos, time=state.time + 1)
        success = same_cell(pos, state.goal_pos)
        reward = jnp.where(success, goal_reward(nxt.time, params.max_steps_in_episode), 0.0).astype(jnp.float32)
        dense = shaped_reward(
            reward, self.potential(state, params), self.potential(nxt, params), success, params.shaping_gamma
        )
        info = {"success": success, "dense_reward": dense, "phase": jnp.int32(0)}
        return self.observe(nxt), nxt, reward, success, info

    def render(self, state: FourRoomsState, params=None) -> str:
        """Text drawing: ``#`` wall, ``.`` floor, ``G`` goal, ``A`` agent (no facing)."""
        s = jax.tree.map(np.asarray, state)
        rows = [["#" if w else "." for w in row] for row in self.walls_np]
        rows[int(s.goal_pos[1])][int(s.goal_pos[0])] = "G"
        rows[int(s.agent_pos[1])][int(s.agent_pos[0])] = "A"
        return render_rows(rows)
