"""The grid of the MiniGrid tasks: xminigrid's tile, colour and action codes, and
DoorKey's sub-goals on them (the phase, the breadth-first-search distance to the
current sub-goal and the potential built from both; see :mod:`envs_jax.minigrid`).

The codes are spelled out here rather than read from ``xminigrid``, whose import
builds JAX arrays at module level (``tests/test_minigrid.py`` checks them against
``xminigrid``).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from envs_jax.grid._common import potential

Array = jax.Array

#: xminigrid's tile codes (``xminigrid.core.constants.Tiles``), in code order.
TILES = ("empty", "floor", "wall", "ball", "square", "pyramid", "goal", "key",
         "door_locked", "door_closed", "door_open", "hex", "star")
#: xminigrid's colour codes (``xminigrid.core.constants.Colors``), in code order.
COLORS = ("empty", "red", "green", "blue", "purple", "yellow", "grey", "black", "orange", "white", "brown", "pink")
NUM_TILES, NUM_COLORS = len(TILES), len(COLORS)
(EMPTY, FLOOR, WALL, BALL, SQUARE, PYRAMID, GOAL, KEY,
 DOOR_LOCKED, DOOR_CLOSED, DOOR_OPEN, HEX, STAR) = range(NUM_TILES)
#: ASCII glyph per tile code (see :meth:`MiniGridAdapter.render`).
TILE_GLYPHS = (" ", ".", "#", "o", "s", "p", "G", "K", "L", "C", "/", "h", "*")
#: The agent's glyph per direction code (0 up, 1 right, 2 down, 3 left, as xminigrid).
AGENT_GLYPHS = "^>v<"
#: Tiles an object the agent can pick up (and so move out of the way).
PICKABLE = (BALL, SQUARE, PYRAMID, KEY, HEX, STAR)
#: Actions: xminigrid's codes.
FORWARD, TURN_RIGHT, TURN_LEFT, PICK_UP, PUT_DOWN, TOGGLE = range(6)
NUM_PHASES = 3  # DoorKey: fetch key, reach door, reach goal


# ----------------------------------------------------------------------------- DoorKey sub-goals
_INF = 1 << 20


def grid_distances(passable: Array, source: Array, num_iters: int) -> Array:
    """Int32 ``(H, W)`` breadth-first-search distance from the nearest ``source``
    cell (4-neighbour moves through ``passable`` cells), exact up to
    ``num_iters``; farther or unreachable cells (and impassable non-source
    cells) hold a value above ``num_iters``. ``passable``, ``source``: bool
    ``(H, W)``. Jittable and vmappable (a fixed number of relaxation sweeps)."""

    def sweep(_, d):
        p = jnp.pad(d, 1, constant_values=_INF)
        near = jnp.minimum(jnp.minimum(p[:-2, 1:-1], p[2:, 1:-1]), jnp.minimum(p[1:-1, :-2], p[1:-1, 2:]))
        return jnp.where(passable, jnp.minimum(d, near + 1), d)

    d0 = jnp.where(source, 0, _INF).astype(jnp.int32)
    return jax.lax.fori_loop(0, num_iters, sweep, d0)


def doorkey_phase(tiles: Array, pocket: Array) -> Array:
    """Int32 ``()``: 0 fetch the key (a locked door, key not held), 1 reach the
    door (locked with the key held, or closed), 2 reach the goal (no closed
    door left). ``tiles``: uint8 ``(H, W)`` tile codes; ``pocket``: ``(2,)``."""
    locked = jnp.any(tiles == DOOR_LOCKED)
    closed = jnp.any(tiles == DOOR_CLOSED)
    has_key = pocket[0] == KEY
    return jnp.where(locked, jnp.where(has_key, 1, 0), jnp.where(closed, 1, 2)).astype(jnp.int32)


def subgoal_cells(tiles: Array, phase: Array) -> Array:
    """Bool ``(H, W)``: the cells of the current sub-goal (keys, closed doors or the goal)."""
    door = jnp.logical_or(tiles == DOOR_LOCKED, tiles == DOOR_CLOSED)
    return jnp.where(phase == 0, tiles == KEY, jnp.where(phase == 1, door, tiles == GOAL))


def passable_cells(tiles: Array) -> Array:
    """Bool ``(H, W)``: cells a shortest path may cross (floor, goal, open doors, loose objects)."""
    ok = (tiles == FLOOR) | (tiles == GOAL) | (tiles == DOOR_OPEN)
    return ok | jnp.isin(tiles, jnp.asarray(PICKABLE, tiles.dtype))


def max_subgoal_distance(height: int, width: int) -> int:
    """The largest sub-goal distance on an ``height x width`` DoorKey layout:
    ``(width - 3) + 2 (height - 3)``, with the door open at the top of the
    wall and the agent in the bottom-left corner (to the door, then to the goal
    in the bottom-right corner)."""
    return (width - 3) + 2 * (height - 3)


def subgoal_distance(inner: Any, num_iters: int) -> tuple[Array, Array]:
    """``(phase, dist)`` int32 ``()`` of one xminigrid DoorKey ``State``:
    the phase (:func:`doorkey_phase`) and the BFS distance from the agent to
    the nearest cell of its sub-goal, exact up to ``num_iters`` (else above it)."""
    tiles = inner.grid[..., 0]
    phase = doorkey_phase(tiles, inner.agent.pocket)
    target = subgoal_cells(tiles, phase)
    dist = grid_distances(passable_cells(tiles) | target, target, num_iters)
    y, x = inner.agent.position[0], inner.agent.position[1]
    return phase, dist[y, x]


def doorkey_potential(inner: Any, height: int, width: int, scale) -> tuple[Array, Array]:
    """``(Phi, phase)``: float32 ``()`` potential in ``[-scale, 0]`` (0 at the
    goal) and int32 ``()`` phase of one xminigrid DoorKey ``State``."""
    max_dist = max_subgoal_distance(height, width)
    phase, dist = subgoal_distance(inner, max_dist + 1)
    return potential(phase, jnp.minimum(dist, max_dist), max_dist, NUM_PHASES, scale), phase
