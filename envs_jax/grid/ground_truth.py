"""Host-side ground truth on the grid worlds, for credit-assignment studies (NumPy).

KeyDoor: :func:`decode_keydoor_obs` recovers the state behind an observation
(exact for everything the breadth-first search reads); :class:`KeyDoorDistances`
gives the minimal number of actions to the goal ``d(s)``
(:func:`envs_jax.grid.keydoor.optimal_distances`, one search per layout,
cached); :func:`keydoor_optimal_advantages` turns ``(d(s_t), d(s_t+1))`` into
the optimal advantage ``A*(s_t, a_t)`` under MiniGrid's reward ``1 - 0.9 t / T``
(:func:`envs_jax.grid.optimal_advantage`).

States of one layout by agent position, for a picture of a value over the grid:
:func:`keydoor_phase_states` (per sub-goal phase, the four facings) and
:func:`fourrooms_cell_states` (the goal fixed).
"""
from __future__ import annotations

import numpy as np

from envs_jax.grid._common import optimal_advantage
from envs_jax.grid.fourrooms import FourRooms, FourRoomsState
from envs_jax.grid.keydoor import NUM_CHANNELS as KEYDOOR_CHANNELS
from envs_jax.grid.keydoor import KeyDoorState, optimal_distances


# ----------------------------------------------------------------------------- KeyDoor
def decode_keydoor_obs(obs: np.ndarray, size: int) -> KeyDoorState:
    """The :class:`KeyDoorState` behind one KeyDoor observation ``[size*size*6 + 5]``.

    Exact for everything the BFS reads; when the key is carried its former cell
    is not visible and ``key_pos`` is set to the door cell (distances of
    key-held configurations do not depend on it). ``time`` is 0.
    """
    obs = np.asarray(obs)
    n = size
    grid = obs[: n * n * KEYDOOR_CHANNELS].reshape(n, n, KEYDOOR_CHANNELS) > 0.5
    direction = int(np.argmax(obs[n * n * KEYDOOR_CHANNELS: n * n * KEYDOOR_CHANNELS + 4]))
    has_key = bool(obs[-1] > 0.5)

    def where(ch):
        ys, xs = np.nonzero(grid[:, :, ch])
        return np.array([xs[0], ys[0]], np.int32) if len(xs) else None

    locked, opened = where(2), where(3)
    door_open = opened is not None
    door = opened if door_open else locked
    key = where(1)
    return KeyDoorState(
        time=np.int32(0), walls=grid[:, :, 0], agent_pos=where(5), agent_dir=np.int32(direction),
        key_pos=door if key is None else key, has_key=np.bool_(has_key), door_pos=door,
        door_open=np.bool_(door_open), goal_pos=where(4),
    )


class KeyDoorDistances:
    """``d(s)`` for decoded observations, one BFS per layout (cached)."""

    def __init__(self, size: int):
        self.size = size
        self._cache: dict = {}

    def __call__(self, obs: np.ndarray) -> float:
        s = decode_keydoor_obs(obs, self.size)
        key = (s.walls.tobytes(), tuple(s.door_pos), tuple(s.goal_pos), None if s.has_key else tuple(s.key_pos))
        if key not in self._cache:
            self._cache[key] = optimal_distances(s)
        x, y = (int(v) for v in s.agent_pos)
        return float(self._cache[key][x, y, int(s.agent_dir), int(bool(s.has_key)), int(bool(s.door_open))])


def keydoor_optimal_advantages(obs, next_obs, terminated, size: int, max_steps: int) -> np.ndarray:
    """Optimal advantage of every step: ``obs, next_obs [..., D]``, ``terminated [...]``
    -> float64 ``[...]`` (any leading shape, e.g. a ``[T, N]`` trajectory).

    Steps whose start state cannot reach the goal get NaN (none do on KeyDoor
    layouts, but a decoded observation is checked, not assumed).
    """
    obs, next_obs = np.asarray(obs), np.asarray(next_obs)
    lead, d = obs.shape[:-1], obs.shape[-1]
    dist = KeyDoorDistances(size)
    term = np.asarray(terminated, bool).reshape(-1)
    d_t = np.array([dist(o) for o in obs.reshape(-1, d)])
    d_tp1 = np.array([0.0 if t else dist(o) for o, t in zip(next_obs.reshape(-1, d), term)])
    adv = np.asarray(optimal_advantage(np.where(np.isfinite(d_t), d_t, 0.0), np.where(np.isfinite(d_tp1), d_tp1, 0.0),
                                       term, max_steps), np.float64)
    return np.where(np.isfinite(d_t) & np.isfinite(d_tp1), adv, np.nan).reshape(lead)


def keydoor_phase_states(state: KeyDoorState):
    """For one unbatched KeyDoor ``state``: ``{phase: [(x, y, [states over 4 facings])]}``
    for every cell the agent may occupy in that phase (0 fetch key, 1 key held
    with the door locked, 2 door open) and that can reach the goal."""
    s = KeyDoorState(**{k: np.asarray(getattr(state, k)) for k in KeyDoorState.__dataclass_fields__})
    n = s.walls.shape[0]
    dist = optimal_distances(s)
    out = {}
    for phase, (has_key, door_open) in enumerate(((False, False), (True, False), (True, True))):
        cells = []
        for y in range(n):
            for x in range(n):
                if not np.isfinite(dist[x, y, :, int(has_key), int(door_open)]).any():
                    continue  # a wall, the key on the floor, the locked door, or cut off from the goal
                states = [s.replace(agent_pos=np.array([x, y], np.int32), agent_dir=np.int32(d),
                                    has_key=np.bool_(has_key), door_open=np.bool_(door_open)) for d in range(4)]
                cells.append((x, y, states))
        out[phase] = cells
    return out


# ----------------------------------------------------------------------------- FourRooms
def fourrooms_cell_states(env: FourRooms, state) -> tuple[list, FourRoomsState]:
    """``(cells, states)``: every free cell ``(x, y)`` of ``env``'s map and a
    batch of states ``[C]`` with the agent there, the goal of one unbatched
    ``state`` and ``time = 0``."""
    n = env.size
    cells = [(x, y) for y in range(n) for x in range(n) if not env.walls_np[y, x]]
    states = FourRoomsState(time=np.zeros(len(cells), np.int32), agent_pos=np.array(cells, np.int32),
                            goal_pos=np.tile(np.asarray(state.goal_pos, np.int32), (len(cells), 1)))
    return cells, states
