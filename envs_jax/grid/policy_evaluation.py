"""Exact policy evaluation on KeyDoor (host NumPy): the advantage ``A^pi`` of any policy.

A KeyDoor layout (wall column, door row, key cell) has few configurations
``(x, y, direction, has_key, door_open)`` and deterministic dynamics
(:func:`envs_jax.grid.keydoor.config_transitions`), so the values of a
stationary policy ``pi(a | c)`` follow exactly from backward induction over
the episode clock ``t`` (the reward ``1 - 0.9 (t + 1) / T`` of the step that
reaches the goal depends on it, and the episode is cut at ``T``)::

    V_T(c) = 0
    Q_t(c, a) = r_t(c, a) + gamma * [c' is not the goal] * V_{t+1}(c'),   c' = next(c, a)
    V_t(c) = sum_a pi(a | c) Q_t(c, a),      A_t(c, a) = Q_t(c, a) - V_t(c)

:func:`expected_gae` gives, by the same recursion, what PPO's GAE(lambda)
advantage estimates in expectation for a critic ``V_hat``: the mean of
``sum_k (gamma lambda)^k delta_{t+k}`` over the policy's continuations, with
``delta = r + gamma [not goal] V_hat(c') - V_hat(c)`` and the chain cut at the
time limit (where GAE stops and bootstraps), not at rollout boundaries.

:func:`keydoor_layouts` enumerates every layout ``sample_layout`` can draw and
:func:`layout_model` the configurations reachable from its starts, with
their observations (the set of states credit is scored on).
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from envs_jax.grid.keydoor import KeyDoorState, config_transitions, observe

NUM_ACTIONS = 6


def keydoor_layouts(size: int) -> list[KeyDoorState]:
    """Every layout of a ``size`` KeyDoor (unbatched NumPy states, agent on the key's
    cell as a placeholder): wall column ``2 .. size-3``, door row ``1 .. size-2``,
    key on any cell left of the wall. ``KeyDoor-5x5`` has 9, ``6x6`` 48."""
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
    """The tabular model of one layout over its ``C`` reachable non-goal configurations.

    ``flat [C]``: each configuration's index in the ``(size, size, 4, 2, 2)``
    grid of :func:`config_transitions`; ``nxt [C, 6]``: the configuration each
    action leads to (row index; 0 where ``goal``); ``goal [C, 6]``: the action
    reaches the goal (ends the episode); ``start [C]``: a possible first state;
    ``obs [C, D]``: float32 observations.
    """

    flat: np.ndarray
    nxt: np.ndarray
    goal: np.ndarray
    start: np.ndarray
    obs: np.ndarray


def start_configs(layout: KeyDoorState) -> np.ndarray:
    """Bool ``(size, size, 4, 2, 2)``: where an episode of ``layout`` may begin
    (any facing, any cell left of the wall but the key's, no key, door locked)."""
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
    """The reward of reaching the goal on the step taken at time ``t`` (MiniGrid's ``1 - 0.9 (t+1) / T``)."""
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
    """``E_pi[GAE(lambda)]`` at ``(c, a)`` and time ``t0`` for critic values ``v_hat [C]``:
    float64 ``[C, 6]`` (see the module docstring). ``lambda = 0`` gives the one-step
    ``delta``; ``lambda = 1`` with ``v_hat = 0`` gives ``Q^pi``."""
    pi, v_hat = np.asarray(pi, np.float64), np.asarray(v_hat, np.float64)
    boot = np.where(model.goal, 0.0, gamma * v_hat[model.nxt]) - v_hat[:, None]
    g_next = np.zeros(len(model.flat))  # E_pi[GAE] of the next state, 0 past the time limit
    g = np.zeros((len(model.flat), NUM_ACTIONS))
    for t in range(max_steps - 1, t0 - 1, -1):
        reward = np.where(model.goal, _goal_reward(t, max_steps), 0.0)
        g = reward + boot + gamma * gae_lambda * np.where(model.goal, 0.0, g_next[model.nxt])
        g_next = (pi * g).sum(1)
    return g
