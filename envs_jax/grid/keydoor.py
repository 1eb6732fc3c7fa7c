"""KeyDoor: a jittable version of MiniGrid's DoorKey task (Chevalier-Boisvert et al., "Minimalistic
Gridworld Environment for Gymnasium", ``DoorKeyEnv``), with absolute moves instead of turns.

A ``size x size`` room (outer wall included) is split by a wall with a locked door; the agent must
pick up the key, open the door and reach the goal. Host-side ground truth: :func:`optimal_distances`,
:func:`optimal_steps_to_goal` and :func:`envs_jax.grid.optimal_advantage`. Design notes:
``docs/design.md``."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs_jax.core import Box, Discrete, EnvState, Environment
from envs_jax.grid._common import (
    AGENT_GLYPHS,
    DIRS,
    cell_mask,
    ShapedParams,
    goal_reward,
    manhattan,
    potential,
    render_rows,
    same_cell,
    shaped_reward,
    take_index,
)

Array = jax.Array

NUM_CHANNELS = 6  # wall, key, locked door, open door, goal, agent
NUM_PHASES = 3  # fetch key, open door, reach goal
UP, RIGHT, DOWN, LEFT, PICKUP, TOGGLE = range(6)


@struct.dataclass
class KeyDoorParams(ShapedParams):
    """``max_steps_in_episode``: the time limit ``T`` (also in the reward); ``shaping_scale``,
    ``shaping_gamma``: see :class:`~envs_jax.grid._common.ShapedParams`. All leaves."""

    max_steps_in_episode: int = 250


@struct.dataclass
class KeyDoorState(EnvState):
    """One episode, unbatched; positions ``(x, y)`` int32. ``walls``: bool ``(size, size)`` ``[y, x]``
    (the door cell is not a wall); ``agent_dir``: 0 up 1 right 2 down 3 left; ``key_pos`` stays set
    after the pick-up."""

    walls: Array
    agent_pos: Array
    agent_dir: Array
    key_pos: Array
    has_key: Array
    door_pos: Array
    door_open: Array
    goal_pos: Array


# ----------------------------------------------------------------------------- pure pieces
def phase_of(state: KeyDoorState) -> Array:
    """Int32 ``()``: 0 before the key is taken, 1 holding it with the door locked, 2 door open."""
    return jnp.where(state.door_open, 2, jnp.where(state.has_key, 1, 0)).astype(jnp.int32)


def subgoal_distance(state: KeyDoorState) -> Array:
    """Int32 ``()`` grid distance (moves, facing ignored) to the current sub-goal: the key, the door,
    or the goal through the door."""
    to_key = manhattan(state.agent_pos, state.key_pos)
    to_door = manhattan(state.agent_pos, state.door_pos)
    left_of_wall = state.agent_pos[0] < state.door_pos[0]
    to_goal = jnp.where(
        left_of_wall,
        to_door + manhattan(state.door_pos, state.goal_pos),
        manhattan(state.agent_pos, state.goal_pos),
    )
    phase = phase_of(state)
    return jnp.where(phase == 0, to_key, jnp.where(phase == 1, to_door, to_goal)).astype(jnp.int32)


def max_subgoal_distance(size: int) -> float:
    """The largest :func:`subgoal_distance` on a ``size`` grid, ``3 * (size - 3)``."""
    return float(3 * (size - 3))


def blocked(state: KeyDoorState, cell: Array) -> Array:
    """Bool ``()``: the agent cannot step onto ``cell`` (wall, key on the floor, locked door)."""
    wall = state.walls[cell[1], cell[0]]
    key_there = jnp.logical_and(jnp.logical_not(state.has_key), same_cell(cell, state.key_pos))
    locked_door = jnp.logical_and(jnp.logical_not(state.door_open), same_cell(cell, state.door_pos))
    return jnp.logical_or(wall, jnp.logical_or(key_there, locked_door))


def transition(state: KeyDoorState, action: Array) -> KeyDoorState:
    """Deterministic dynamics of one action (``time`` not advanced)."""
    action = jnp.asarray(action, jnp.int32)
    is_move = action < 4
    new_dir = jnp.where(is_move, action, state.agent_dir).astype(jnp.int32)
    front = state.agent_pos + jnp.asarray(DIRS)[new_dir]
    n = state.walls.shape[0]
    front = jnp.clip(front, 0, n - 1)
    move = jnp.logical_and(is_move, jnp.logical_not(blocked(state, front)))
    pos = jnp.where(move, front, state.agent_pos)
    key_ahead = jnp.logical_and(jnp.logical_not(state.has_key), same_cell(front, state.key_pos))
    pick = jnp.logical_and(action == PICKUP, key_ahead)
    door_ahead = jnp.logical_and(jnp.logical_not(state.door_open), same_cell(front, state.door_pos))
    opens = jnp.logical_and(action == TOGGLE, jnp.logical_and(door_ahead, state.has_key))
    return state.replace(
        agent_pos=pos.astype(jnp.int32),
        agent_dir=new_dir,
        has_key=jnp.logical_or(state.has_key, pick),
        door_open=jnp.logical_or(state.door_open, opens),
    )


def observe(state: KeyDoorState) -> Array:
    """Float32 ``(size * size * 6 + 5,)`` observation (see :class:`KeyDoor`)."""
    n = state.walls.shape[0]
    door = cell_mask(state.door_pos, n)
    grid = jnp.stack(
        [
            state.walls,
            jnp.logical_and(cell_mask(state.key_pos, n), jnp.logical_not(state.has_key)),
            jnp.logical_and(door, jnp.logical_not(state.door_open)),
            jnp.logical_and(door, state.door_open),
            cell_mask(state.goal_pos, n),
            cell_mask(state.agent_pos, n),
        ],
        axis=-1,
    ).astype(jnp.float32)
    direction = jax.nn.one_hot(state.agent_dir, 4, dtype=jnp.float32)
    carrying = jnp.asarray(state.has_key, jnp.float32)[None]
    return jnp.concatenate([grid.reshape(-1), direction, carrying])


def obs_size(size: int) -> int:
    """Length of the observation vector for a ``size`` grid."""
    return size * size * NUM_CHANNELS + 4 + 1


def sample_layout(key: Array, size: int) -> KeyDoorState:
    """A random episode start (``time = 0``) for a ``size`` grid; jittable."""
    # two random words: layout choices from the first, the key and agent cells from the second
    word = jax.random.bits(key, (2,), jnp.uint32)
    wall_x, rest = take_index(word[0], size - 4)  # left and right parts >= 1 column
    wall_x = wall_x + 2
    door_y, rest = take_index(rest, size - 2)
    door_y = door_y + 1
    agent_dir, _ = take_index(rest, 4)
    width = wall_x - 1
    n_left = width * (size - 2)
    key_idx, rest = take_index(word[1], n_left)
    agent_idx, _ = take_index(rest, n_left - 1)
    agent_idx = agent_idx + (agent_idx >= key_idx)  # skip the key's cell
    to_pos = lambda i: jnp.stack([1 + i % width, 1 + i // width]).astype(jnp.int32)
    ys = jnp.arange(size)[:, None]
    xs = jnp.arange(size)[None, :]
    border = (xs == 0) | (ys == 0) | (xs == size - 1) | (ys == size - 1)
    walls = border | ((xs == wall_x) & (ys != door_y))
    return KeyDoorState(
        time=jnp.int32(0),
        walls=walls,
        agent_pos=to_pos(agent_idx),
        agent_dir=agent_dir,
        key_pos=to_pos(key_idx),
        has_key=jnp.bool_(False),
        door_pos=jnp.stack([wall_x, door_y]).astype(jnp.int32),
        door_open=jnp.bool_(False),
        goal_pos=jnp.array([size - 2, size - 2], jnp.int32),
    )


# ----------------------------------------------------------------------------- environment
class KeyDoor(Environment):
    """MiniGrid DoorKey-like task on a ``size x size`` grid (outer wall included, ``size >= 5``).

    The wall stands at a random interior column ``c in [2, size-3]`` with the locked door at a random
    row; key and agent (random facing) start on distinct cells left of it; the goal is ``(size-2,
    size-2)``. Actions ``Discrete(6)``: 0..3 up, right, down, left (face that way, then step onto floor,
    an open door or the goal), 4 pick up the key ahead, 5 open the locked door ahead with the key.
    Reaching the goal terminates with ``1 - 0.9 t / max_steps`` (MiniGrid's; default ``max_steps = 10 *
    size**2``), else 0. Observation float32 ``(size * size * 6 + 5,)``: per cell (``[y, x]``) channels
    ``[wall, key, locked door, open door, goal, agent]``, the direction one-hot (4), the carrying-key
    flag. ``info``: ``success``, ``phase`` (0 fetch key, 1 open door, 2 reach goal, after the step),
    ``dense_reward = r + gamma Phi(s') - Phi(s)`` (:meth:`potential`; ``Phi(s') = 0`` on termination)."""

    optional_outputs = ("dense_reward", "success")

    def __init__(self, size: int = 5):
        if size < 5:
            raise ValueError(f"KeyDoor needs size >= 5 (a 3x3 interior), got {size}")
        self.size = int(size)
        self.name = f"KeyDoor-{self.size}x{self.size}"
        self.max_dist = max_subgoal_distance(self.size)

    @property
    def default_params(self) -> KeyDoorParams:
        return KeyDoorParams(max_steps_in_episode=10 * self.size * self.size)

    def action_space(self, params=None) -> Discrete:
        return Discrete(6)

    def observation_space(self, params=None) -> Box:
        return Box(0.0, 1.0, (obs_size(self.size),), jnp.float32)

    def potential(self, state: KeyDoorState, params: KeyDoorParams | None = None) -> Array:
        """Float32 ``()`` ``Phi = -shaping_scale * (2 - phase + dist / max_dist) / 3`` in
        ``[-shaping_scale, 0]`` (0 at the goal; :func:`subgoal_distance`, :func:`max_subgoal_distance`)."""
        params = self.default_params if params is None else params
        return potential(phase_of(state), subgoal_distance(state), self.max_dist, NUM_PHASES, params.shaping_scale)

    def reset_env(self, key: Array, params: KeyDoorParams):
        state = sample_layout(key, self.size)
        return observe(state), state

    def step_env(self, key: Array, state: KeyDoorState, action: Array, params: KeyDoorParams):
        nxt = transition(state, action)
        nxt = nxt.replace(time=state.time + 1)
        success = same_cell(nxt.agent_pos, nxt.goal_pos)
        reward = jnp.where(success, goal_reward(nxt.time, params.max_steps_in_episode), 0.0).astype(jnp.float32)
        dense = shaped_reward(
            reward, self.potential(state, params), self.potential(nxt, params), success, params.shaping_gamma
        )
        info = {"success": success, "dense_reward": dense, "phase": phase_of(nxt)}
        return observe(nxt), nxt, reward, success, info

    def render(self, state: KeyDoorState, params=None) -> str:
        """Text drawing (``#`` wall, ``K`` key, ``D`` locked door, ``/`` open door, ``G`` goal,
        ``^>v<`` agent, ``.`` floor) and a ``carrying key: yes/no`` line."""
        s = jax.tree.map(np.asarray, state)
        walls = s.walls
        rows = [["#" if walls[y, x] else "." for x in range(walls.shape[1])] for y in range(walls.shape[0])]
        gx, gy = s.goal_pos
        rows[gy][gx] = "G"
        dx, dy = s.door_pos
        rows[dy][dx] = "/" if bool(s.door_open) else "D"
        if not bool(s.has_key):
            kx, ky = s.key_pos
            rows[ky][kx] = "K"
        ax, ay = s.agent_pos
        rows[ay][ax] = AGENT_GLYPHS[int(s.agent_dir)]
        carrying = "yes" if bool(s.has_key) else "no"
        return render_rows(rows) + f"\ncarrying key: {carrying}"


# ----------------------------------------------------------------------------- host-side ground truth
def config_transitions(state: KeyDoorState):
    """NumPy model of the dynamics over every configuration of one unbatched ``state``'s layout.

    Configurations ``(x, y, direction, has_key, door_open)``, shape ``(size, size, 4, 2, 2)`` flattened
    C-order. Returns ``(valid, terminal, nxt)``: bool ``(n,)`` (not in a wall, on the lying key or in the
    locked door), bool ``(n,)`` (valid and on the goal), int ``(n, 6)`` the successor per action."""
    s = jax.tree.map(np.asarray, state)
    if s.walls.ndim != 2:
        raise ValueError("config_transitions expects one unbatched state")
    walls = s.walls.astype(bool)
    n = walls.shape[0]
    shape = (n, n, 4, 2, 2)
    X, Y, D, K, O = np.indices(shape)
    kx, ky = (int(v) for v in s.key_pos)
    dx, dy = (int(v) for v in s.door_pos)
    gx, gy = (int(v) for v in s.goal_pos)
    at_key = lambda x, y: (x == kx) & (y == ky)
    at_door = lambda x, y: (x == dx) & (y == dy)
    valid = ~walls[Y, X] & ~((K == 0) & at_key(X, Y)) & ~((O == 0) & at_door(X, Y))
    terminal = valid & (X == gx) & (Y == gy)
    nxt = []
    for a in range(6):
        nd = np.full_like(D, a) if a < 4 else D
        fx = np.clip(X + DIRS[nd, 0], 0, n - 1)
        fy = np.clip(Y + DIRS[nd, 1], 0, n - 1)
        key_ahead = (K == 0) & at_key(fx, fy)
        door_ahead = (O == 0) & at_door(fx, fy)
        nx, ny, nk, no = X, Y, K, O
        if a < 4:
            stop = walls[fy, fx] | key_ahead | door_ahead
            nx, ny = np.where(stop, X, fx), np.where(stop, Y, fy)
        elif a == PICKUP:
            nk = K | key_ahead
        else:
            no = O | (door_ahead & (K == 1))
        nxt.append(np.ravel_multi_index((nx, ny, nd, nk, no), shape).reshape(-1))
    return valid.reshape(-1), terminal.reshape(-1), np.stack(nxt, axis=1)


def optimal_distances(state: KeyDoorState) -> np.ndarray:
    """Float64 ``(size, size, 4, 2, 2)`` ``[x, y, direction, has_key, door_open]``: the fewest actions
    to the goal from each configuration of one unbatched ``state``'s layout (backward BFS); 0 on the
    goal, ``inf`` where unreachable or impossible."""
    valid, terminal, nxt = config_transitions(state)
    dist = np.full(valid.shape, np.inf)
    dist[terminal] = 0.0
    level = 0
    while True:
        frontier = valid & np.isinf(dist) & np.any(dist[nxt] == level, axis=1)
        if not frontier.any():
            break
        level += 1
        dist[frontier] = level
    n = np.asarray(state.walls).shape[0]
    return dist.reshape(n, n, 4, 2, 2)


def config_of(state: KeyDoorState) -> tuple[int, int, int, int, int]:
    """The ``(x, y, direction, has_key, door_open)`` index of one unbatched state."""
    s = jax.tree.map(np.asarray, state)
    return (int(s.agent_pos[0]), int(s.agent_pos[1]), int(s.agent_dir), int(bool(s.has_key)), int(bool(s.door_open)))


def optimal_steps_to_goal(state: KeyDoorState) -> int:
    """Fewest actions from one unbatched ``state`` to the goal; ``-1`` if unreachable."""
    d = optimal_distances(state)[config_of(state)]
    return int(d) if np.isfinite(d) else -1
