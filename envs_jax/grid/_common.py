"""Pieces shared by the grid worlds: directions, MiniGrid's reward, the shaping params, potential and
shaped reward, the optimal advantage and host-side grid tools. Positions are ``(x, y)`` (``x`` the
column, ``y`` the row growing down), grids are indexed ``[y, x]``, directions and moves are 0 up,
1 right, 2 down, 3 left."""
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
    """``(index, rest)``: an int32 index uniform on ``[0, n)`` (``n`` may be traced) from uniform uint32
    ``bits``, and the remaining bits ``bits // n``, uniform on ``[0, 2**32 // n)``."""
    n = jnp.asarray(n, jnp.uint32)
    return (bits % n).astype(jnp.int32), bits // n


def nth_true(mask: Array, k: Array) -> Array:
    """Int32 ``()`` flat index of the ``k``-th (0-based) True entry of a 1-D bool ``mask``."""
    return jnp.argmax(jnp.cumsum(mask.astype(jnp.int32)) > k).astype(jnp.int32)


def goal_reward(time: Array, max_steps) -> Array:
    """MiniGrid's success reward ``1 - 0.9 * t / T``, float32 ``()`` (``t``: step count after the step)."""
    return (1.0 - 0.9 * time.astype(jnp.float32) / jnp.asarray(max_steps, jnp.float32)).astype(jnp.float32)


@struct.dataclass
class ShapedParams(EnvParams):
    """Params of an env with potential-based ``info["dense_reward"]`` (leaves, sweepable under ``vmap``):
    ``shaping_scale`` (``Phi`` runs from ``-shaping_scale`` to 0 at the goal) and ``shaping_gamma``
    (the ``gamma`` of ``gamma Phi(s') - Phi(s)``; set it to the learner's discount)."""

    shaping_scale: float = 1.0
    shaping_gamma: float = 0.99


def potential(phase: Array, dist: Array, max_dist: float, num_phases: int, scale) -> Array:
    """Float32 ``()`` ``Phi = -scale * (num_phases - 1 - phase + dist / max_dist) / num_phases``, in
    ``[-scale, 0]``, 0 at the goal (``0 <= dist <= max_dist``: distance to the current sub-goal)."""
    phases_left = jnp.float32(num_phases - 1) - phase.astype(jnp.float32)
    to_go = (phases_left + dist.astype(jnp.float32) / jnp.float32(max_dist)) / jnp.float32(num_phases)
    return (-jnp.asarray(scale, jnp.float32) * to_go).astype(jnp.float32)


def shaped_reward(reward: Array, phi: Array, phi_next: Array, terminated: Array, gamma) -> Array:
    """Float32 ``()`` ``r + gamma * Phi(s') - Phi(s)`` (Ng, Harada and Russell 1999), ``Phi(s') = 0``
    when the step ``terminated``; a truncated step keeps ``Phi(s')``."""
    phi_next = jnp.where(jnp.asarray(terminated, jnp.bool_), 0.0, phi_next)
    return (reward + jnp.asarray(gamma, jnp.float32) * phi_next - phi).astype(jnp.float32)


def optimal_advantage(d_t, d_tp1, terminal, max_steps):
    """Float32 optimal advantage ``A* = -0.9 / T * (1 + d(s_t+1) - d(s_t))`` of one step (broadcasting)
    under reward ``1 - 0.9 t / T``, no discount; ``d``: fewest actions to the goal before (``d_t``) and
    after (``d_tp1``, taken as 0 where ``terminal``); ``max_steps``: ``T``."""
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
