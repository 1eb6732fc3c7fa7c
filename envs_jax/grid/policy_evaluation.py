"""Exact policy evaluation on KeyDoor (host NumPy): ``Q^pi``, ``A^pi`` and the expected GAE of any
stationary policy by finite-horizon backward induction over one layout's configurations
(:func:`layout_model`; :func:`keydoor_layouts` lists every layout). Derivation: ``docs/design.md``."""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from envs_jax.grid.keydoor import KeyDoorState, config_transitions, observe

NUM_ACTIONS = 6


def keydoor_layouts(size: int) -> list[KeyDoorState]:
    """Every layout of a ``size`` KeyDoor as unbatched NumPy states (agent on the key's cell as a
    placeholder): wall column ``2 .. size-3``, door row ``1 .. size-2``, key left of the wall."""
    ys, xs = np.arange(size)[:, None], np.arange(size)[None, :]
    border = (xs == 0) | (ys == 0) | (xs == size - 1) | (ys == size - 1)
    out = []
    for wall_x in range(2, size - 2):
        for door_y in range(1, size - 1):
            walls = border | ((xs == wall_x) & (ys != door_y))
            for key_y in range(1, size - 1):
                for key_x in range(1, wall_x):
                    key = np.array([key_x, key_y], np.int32)
                    out.append(KeyDoorState(
                        time=np.int32(0), walls=walls, agent_pos=key, agent_dir=np.int32(0), key_pos=key,
                        has_key=np.bool_(False), door_pos=np.array([wall_x, door_y], np.int32),
                        door_open=np.bool_(False), goal_pos=np.array([size - 2, size - 2], np.int32)))
    return out


@dataclasses.dataclass(frozen=True)
class LayoutModel:
    """The tabular model of one layout over its ``C`` reachable non-goal configurations: ``flat [C]``
    index in :func:`config_transitions`' grid; ``nxt [C, 6]`` successor row (0 where ``goal``);
    ``goal [C, 6]`` the action reaches the goal; ``start [C]`` a possible first state; ``obs [C, D]``."""

    flat: np.ndarray
    nxt: np.ndarray
    goal: np.ndarray
    start: np.ndarray
    obs: np.ndarray


def start_configs(layout: KeyDoorState) -> np.ndarray:
    """Bool ``(size, size, 4, 2, 2)``: where an episode of ``layout`` may begin."""
    n = layout.walls.shape[0]
    start = np.zeros((n, n, 4, 2, 2), bool)
    wall_x, (kx, ky) = int(layout.door_pos[0]), (int(v) for v in layout.key_pos)
    for y in range(1, n - 1):
        for x in range(1, wall_x):
            if (x, y) != (kx, ky):
                start[x, y, :, 0, 0] = True
    return start


def layout_model(layout: KeyDoorState) -> LayoutModel:
    """The :class:`LayoutModel` of one unbatched ``layout`` (forward search from its starts)."""
    valid, terminal, nxt = config_transitions(layout)
    start = start_configs(layout).reshape(-1)
    seen = start.copy()
    frontier = start.copy()
    while frontier.any():
        reached = np.zeros_like(seen)
        reached[nxt[frontier & ~terminal].reshape(-1)] = True
        frontier = reached & ~seen
        seen |= reached
    keep = np.nonzero(seen & valid & ~terminal)[0]
    row = np.full(valid.shape, -1)
    row[keep] = np.arange(len(keep))
    goal = terminal[nxt[keep]]
    n = layout.walls.shape[0]
    x, y, d, k, o = np.unravel_index(keep, (n, n, 4, 2, 2))
    states = KeyDoorState(
        time=np.zeros(len(keep), np.int32), walls=np.broadcast_to(layout.walls, (len(keep), n, n)),
        agent_pos=np.stack([x, y], 1).astype(np.int32), agent_dir=d.astype(np.int32),
        key_pos=np.broadcast_to(layout.key_pos, (len(keep), 2)), has_key=k.astype(bool),
        door_pos=np.broadcast_to(layout.door_pos, (len(keep), 2)), door_open=o.astype(bool),
        goal_pos=np.broadcast_to(layout.goal_pos, (len(keep), 2)))
    obs = np.asarray(jax.jit(jax.vmap(observe))(states))
    return LayoutModel(flat=keep, nxt=np.where(goal, 0, row[nxt[keep]]), goal=goal, start=start[keep], obs=obs)


def _goal_reward(t: int, max_steps: int) -> float:
    """MiniGrid's ``1 - 0.9 (t+1) / T`` for reaching the goal on the step taken at time ``t``."""
    return 1.0 - 0.9 * (t + 1) / max_steps


def policy_values(pi: np.ndarray, model: LayoutModel, max_steps: int, gamma: float, t0: int = 0):
    """``(Q [C, 6], V [C])`` of policy ``pi [C, 6]`` (rows sum to 1) at episode time
    ``t0`` (float64): finite-horizon backward induction from the time limit."""
    pi = np.asarray(pi, np.float64)
    v = np.zeros(len(model.flat))
    q = np.zeros((len(model.flat), NUM_ACTIONS))
    for t in range(max_steps - 1, t0 - 1, -1):
        q = np.where(model.goal, _goal_reward(t, max_steps), gamma * v[model.nxt])
        v = (pi * q).sum(1)
    return q, v


def policy_advantages(pi: np.ndarray, model: LayoutModel, max_steps: int, gamma: float, t0: int = 0) -> np.ndarray:
    """Exact ``A^pi_t0(c, a) = Q - V`` of policy ``pi [C, 6]``: float64 ``[C, 6]``."""
    q, v = policy_values(pi, model, max_steps, gamma, t0)
    return q - v[:, None]


def expected_gae(pi: np.ndarray, v_hat: np.ndarray, model: LayoutModel, max_steps: int, gamma: float,
                 gae_lambda: float, t0: int = 0) -> np.ndarray:
    """Float64 ``[C, 6]`` ``E_pi[GAE(lambda)]`` at ``(c, a)`` and time ``t0`` for critic values
    ``v_hat [C]``; ``lambda = 0`` gives the one-step ``delta``, ``lambda = 1`` with ``v_hat = 0``
    gives ``Q^pi``."""
    pi, v_hat = np.asarray(pi, np.float64), np.asarray(v_hat, np.float64)
    boot = np.where(model.goal, 0.0, gamma * v_hat[model.nxt]) - v_hat[:, None]
    g_next = np.zeros(len(model.flat))  # E_pi[GAE] of the next state, 0 past the time limit
    g = np.zeros((len(model.flat), NUM_ACTIONS))
    for t in range(max_steps - 1, t0 - 1, -1):
        reward = np.where(model.goal, _goal_reward(t, max_steps), 0.0)
        g = reward + boot + gamma * gae_lambda * np.where(model.goal, 0.0, g_next[model.nxt])
        g_next = (pi * g).sum(1)
    return g
