"""Pieces shared by the grid worlds: directions, the MiniGrid reward, the
shaping params, potential and shaped reward, the optimal-advantage helper and
host-side grid tools.

Coordinates are ``(x, y)`` with ``x`` the column (growing right) and ``y`` the
row (growing down); grids are indexed ``[y, x]``. Directions and move actions
share one code: 0 up, 1 right, 2 down, 3 left.
"""
from __future__ import annotations

from collections import deque

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs_jax.core import EnvParams

Array = jax.Array

#: ``(dx, dy)`` per direction code 0 up, 1 right, 2 down, 3 left; shape ``(4, 2)``.
DIRS = np.array([[0, -1], [1, 0], [0, 1], [-1, 0]], dtype=np.int32)

#: Text glyph of the agent per direction code.
AGENT_GLYPHS = "^>v<"


def cell_mask(pos: Array, n: int) -> Array:
    """Bool ``(n, n)`` grid (indexed ``[y, x]``) that is True only at ``pos = (x, y)``."""
    ys = jnp.arange(n)[:, None]
    xs = jnp.arange(n)[None, :]
    return jnp.logical_and(xs == pos[0], ys == pos[1])


def same_cell(a: Array, b: Array) -> Array:
    """Bool ``()``: positions ``(2,)`` ``a`` and ``b`` are equal."""
    return jnp.all(a == b)


def manhattan(a: Array, b: Array) -> Array:
    """Int32 ``()`` L1 distance between positions ``(2,)``."""
    return jnp.sum(jnp.abs(a - b)).astype(jnp.int32)


def take_index(bits: Array, n) -> tuple[Array, Array]:
    """Split uniform uint32 ``bits`` into an int32 index uniform on ``[0, n)``
    (``n`` may be traced) and the remaining bits ``bits // n``, which are
    uniform on ``[0, 2**32 // n)``. Drawing several small choices from one
    word this way biases them by at most ``prod(n) / 2**32``; one scalar
    ``jax.random.bits`` call also compiles far faster than several draws."""
    n = jnp.asarray(n, jnp.uint32)
    return (bits % n).astype(jnp.int32), bits // n


def nth_true(mask: Array, k: Array) -> Array:
    """Int32 ``()`` flat index of the ``k``-th (0-based) True entry of a 1-D bool ``mask``."""
    return jnp.argmax(jnp.cumsum(mask.astype(jnp.int32)) > k).astype(jnp.int32)


def goal_reward(time: Array, max_steps) -> Array:
    """MiniGrid's success reward ``1 - 0.9 * t / T``, float32 ``()``; ``t`` is
    the step count after the step that reaches the goal."""
    return (1.0 - 0.9 * time.astype(jnp.float32) / jnp.asarray(max_steps, jnp.float32)).astype(jnp.float32)


@struct.dataclass
class ShapedParams(EnvParams):
    """Params of an environment with potential-based ``info["dense_reward"]``
    (all leaves, so they can be swept under ``jax.vmap``).

    ``shaping_scale``: the potential runs from ``-shaping_scale`` (farthest from
    the goal) to 0 (at the goal), see :func:`potential`. The default 1.0 makes
    the whole path worth about as much as the goal reward (at most 1), so the
    shaping is a signal a learner actually notices (on ``KeyDoor-5x5`` one
    step of progress pays about ``1 / 18``).

    ``shaping_gamma``: the discount ``gamma`` in the shaping term
    ``gamma * Phi(s') - Phi(s)``. Ng, Harada and Russell's policy invariance
    holds exactly only when it equals the discount of the learner that
    maximises the dense return; set it to the learner's gamma.
    """

    shaping_scale: float = 1.0
    shaping_gamma: float = 0.99


def potential(phase: Array, dist: Array, max_dist: float, num_phases: int, scale) -> Array:
    """Shaping potential ``Phi = -scale * to_go``, float32 ``()``.

    ``to_go = (num_phases - 1 - phase + dist / max_dist) / num_phases`` is the
    normalised distance still to cover when the task is a chain of
    ``num_phases`` sub-goals: ``dist`` (``0 <= dist <= max_dist``) to the
    current sub-goal ``phase`` plus a full ``max_dist`` for each later one. So
    ``Phi`` lies in ``[-scale, 0]``, grows as the agent nears the goal, every
    state of a later phase scores at least as high as any state of an earlier
    one, and ``Phi = 0`` exactly at the goal (last phase, ``dist = 0``), which
    agrees with ``Phi(terminal) = 0`` (see :func:`shaped_reward`).
    """
    phases_left = jnp.float32(num_phases - 1) - phase.astype(jnp.float32)
    to_go = (phases_left + dist.astype(jnp.float32) / jnp.float32(max_dist)) / jnp.float32(num_phases)
    return (-jnp.asarray(scale, jnp.float32) * to_go).astype(jnp.float32)


def shaped_reward(reward: Array, phi: Array, phi_next: Array, terminated: Array, gamma) -> Array:
    """Potential-based shaped reward ``r + gamma * Phi(s') - Phi(s)`` (Ng, Harada
    and Russell 1999), float32 ``()``, with ``Phi(s') = 0`` when the step
    ``terminated`` (a terminal state has no future, so it has no potential).

    A truncated (timed-out) step keeps ``Phi(s')`` of the state it reached, as
    the episode could have continued. Over an episode ``s_0 .. s_T`` the
    discounted shaping sums to ``gamma**T * Phi(s_T) * (1 - terminated) -
    Phi(s_0)``, so with a learner discounting by the same ``gamma`` (and
    bootstrapping time-outs) the optimal policies are unchanged. With
    ``Phi <= 0``, a step that leaves ``Phi`` unchanged is paid
    ``(1 - gamma) * |Phi(s)|`` (at most ``(1 - gamma) * scale``): that is part
    of the invariance (shaped values are ``Q(s, a) - Phi(s)``), not a loophole.
    """
    phi_next = jnp.where(jnp.asarray(terminated, jnp.bool_), 0.0, phi_next)
    return (reward + jnp.asarray(gamma, jnp.float32) * phi_next - phi).astype(jnp.float32)


def optimal_advantage(d_t, d_tp1, terminal, max_steps):
    """Optimal advantage ``A*(s_t, a_t)`` of one step (float32, broadcasting).

    With reward ``1 - 0.9 t / T`` on reaching the goal (``t`` = step count after
    the step), no discount and ``d(s)`` the minimal number of actions from
    ``s`` to the goal, the optimal value is ``V*(s_t) = 1 - 0.9 (t + d(s_t)) / T``
    (valid while ``t + d(s_t) <= T``, i.e. the goal can still be reached before
    the time limit). Hence a non-terminal step has
    ``A* = V*(s_{t+1}) - V*(s_t) = -0.9 / T * (1 + d(s_{t+1}) - d(s_t))``, and a
    step that reaches the goal the same formula with ``d(s_{t+1}) = 0``, i.e.
    ``0.9 (d(s_t) - 1) / T`` (zero when the step was optimal).

    ``d_t``, ``d_tp1``: distances before and after the step (``d_tp1`` is
    ignored where ``terminal``); ``terminal``: the step reached the goal;
    ``max_steps``: ``T``. Optimal steps score 0, every wasted action
    ``-0.9 / T``.
    """
    d_t = jnp.asarray(d_t, jnp.float32)
    d_next = jnp.where(jnp.asarray(terminal, jnp.bool_), 0.0, jnp.asarray(d_tp1, jnp.float32))
    return (-0.9 / jnp.asarray(max_steps, jnp.float32) * (1.0 + d_next - d_t)).astype(jnp.float32)


# ----------------------------------------------------------------------------- host-side tools
def parse_map(text: str) -> np.ndarray:
    """Bool ``(H, W)`` wall grid from lines of ``#``/``x`` (wall) and other characters (floor)."""
    rows = [r for r in text.strip("\n").split("\n")]
    return np.array([[c in "#x" for c in row] for row in rows], dtype=bool)


def bfs_distances(walls: np.ndarray, start: tuple[int, int]) -> np.ndarray:
    """Int64 ``(H, W)`` moves from ``start = (x, y)`` to every cell under 4-neighbour
    moves through non-wall cells; ``-1`` where unreachable (walls included)."""
    h, w = walls.shape
    dist = np.full((h, w), -1, dtype=np.int64)
    x0, y0 = start
    if walls[y0, x0]:
        return dist
    dist[y0, x0] = 0
    queue = deque([(x0, y0)])
    while queue:
        x, y = queue.popleft()
        for dx, dy in DIRS:
            nx, ny = x + dx, y + dy
            if 0 <= nx < w and 0 <= ny < h and not walls[ny, nx] and dist[ny, nx] < 0:
                dist[ny, nx] = dist[y, x] + 1
                queue.append((nx, ny))
    return dist


def render_rows(rows: list[list[str]]) -> str:
    """Join a character grid (list of rows) into one string, one row per line."""
    return "\n".join("".join(r) for r in rows)
