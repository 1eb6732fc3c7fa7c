"""``TextMaze`` / ``TextMaze-PO``: LMRL-Gym's Maze task as a token dialogue.

A fixed 7x7 maze (``#`` walls) with a fixed goal; the start is uniform over the
other open cells. Each user turn is an observation:

    fully observed:      pos <x> <y> goal <x> <y> walls <dirs...|none>
    partially observed:  walls <dirs...|none>

(``x`` is the column, ``y`` the row, ``up`` decreases ``y``; ``walls`` lists
the blocked neighbours in the order up down left right.) Agent utterances:
``move up|down|left|right <eot>``. LMRL reward table: -1 per move, -4 for an
illegal one (into a wall, or a malformed turn; the position stays), 0 on
reaching the goal (terminated, success). ``params.sparse`` switches to +1 at the
goal and 0 otherwise. ``dense_reward`` adds the shortest-path progress
``dist(before) - dist(after)``: potential-based shaping with ``Phi = -dist``
(so ``Phi = 0`` at the goal, the only terminal state) but undiscounted
(``gamma = 1``), so it leaves optimal policies exactly unchanged only for an
undiscounted learner. Episodes otherwise end by truncation (the
buffer filling up, or ``params.max_steps_in_episode`` agent tokens).
"""
from __future__ import annotations

from collections import deque

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs_jax.text.common import TextEnv, TextParams, TextState, TurnOutcome
from envs_jax.text.tokens import Grammar, Vocab

MAZE_LAYOUT = (
    "#######",
    "#...#.#",
    "#.#...#",
    "#.#.#.#",
    "#...#.#",
    "##.#..#",
    "#######",
)
GOAL = (3, 3)  # (x, y)
DIRECTIONS = ("up", "down", "left", "right")
_DELTAS = ((0, -1), (0, 1), (-1, 0), (1, 0))

MAZE_VOCAB = Vocab(("move",) + DIRECTIONS + ("pos", "goal", "walls", "none") + tuple(str(i) for i in range(7)))
_UTTS = [f"move {d} <eot>" for d in DIRECTIONS]
MAZE_GRAMMAR = Grammar(MAZE_VOCAB, _UTTS)


def _build_tables():
    h, w = len(MAZE_LAYOUT), len(MAZE_LAYOUT[0])
    free = np.array([[c == "." for c in row] for row in MAZE_LAYOUT])
    cells = [(x, y) for y in range(h) for x in range(w) if free[y, x]]
    index = {c: i for i, c in enumerate(cells)}
    n = len(cells)
    nxt = np.zeros((n, 4), np.int32)       # next cell per direction (self if blocked)
    blocked = np.zeros((n, 4), np.bool_)
    for i, (x, y) in enumerate(cells):
        for d, (dx, dy) in enumerate(_DELTAS):
            c = (x + dx, y + dy)
            ok = 0 <= c[0] < w and 0 <= c[1] < h and free[c[1], c[0]]
            blocked[i, d] = not ok
            nxt[i, d] = index[c] if ok else i
    goal = index[GOAL]
    dist = np.full(n, -1, np.int32)
    dist[goal] = 0
    q = deque([goal])
    while q:
        i = q.popleft()
        for d in range(4):
            j = nxt[i, d]
            if dist[j] < 0:
                dist[j] = dist[i] + 1
                q.append(j)
    assert np.all(dist >= 0), "maze must be connected"
    xy = np.array(cells, np.int32)
    return cells, xy, nxt, blocked, dist, goal


CELLS, CELL_XY, NEXT_CELL, BLOCKED, DIST_TO_GOAL, GOAL_CELL = _build_tables()
NUM_CELLS = len(CELLS)


def _observation_table(full: bool):
    v = MAZE_VOCAB
    rows = []
    for i, (x, y) in enumerate(CELLS):
        words = []
        if full:
            words += ["pos", str(x), str(y), "goal", str(GOAL[0]), str(GOAL[1])]
        words.append("walls")
        dirs = [DIRECTIONS[d] for d in range(4) if BLOCKED[i, d]]
        words += dirs if dirs else ["none"]
        rows.append([v[w] for w in words])
    width = max(len(r) for r in rows)
    table = np.zeros((len(rows), width), np.int32)
    lens = np.zeros(len(rows), np.int32)
    for i, r in enumerate(rows):
        table[i, : len(r)] = r
        lens[i] = len(r)
    return table, lens


_FULL_OBS, _FULL_LEN = _observation_table(full=True)
_PART_OBS, _PART_LEN = _observation_table(full=False)
_OBS_WORDS = max(_FULL_OBS.shape[1], _PART_OBS.shape[1])
_OBS_TABLE = np.zeros((2, NUM_CELLS, _OBS_WORDS), np.int32)  # [partial, cell, word]
_OBS_TABLE[0, :, : _FULL_OBS.shape[1]] = _FULL_OBS
_OBS_TABLE[1, :, : _PART_OBS.shape[1]] = _PART_OBS
_OBS_LEN = np.stack([_FULL_LEN, _PART_LEN])


@struct.dataclass
class MazeParams(TextParams):
    """``sparse``: +1 at the goal only; ``partial``: observations show only the
    adjacent walls (``TextMaze-PO`` is ``TextMaze`` with ``partial=True``)."""

    max_steps_in_episode: int = 192
    max_turn_tokens: int = 3
    use_legal_mask: bool = False
    sparse: bool = False
    partial: bool = False


@struct.dataclass
class MazeState(TextState):
    cell: jax.Array  # int32 index into CELLS


class TextMaze(TextEnv):
    """``partial=True`` gives ``TextMaze-PO`` (only the adjacent walls are shown);
    the flag only sets ``default_params.partial``, so both share one program."""

    vocab = MAZE_VOCAB
    grammar = MAZE_GRAMMAR
    state_cls = MazeState

    reply_words = _OBS_WORDS

    def __init__(self, partial: bool = False, buffer_len: int = 192, use_legal_mask: bool = False):
        self.partial = bool(partial)
        self.use_legal_mask = bool(use_legal_mask)
        self.name = "TextMaze-PO" if partial else "TextMaze"
        self.buffer_len = int(buffer_len)

    @property
    def default_params(self) -> MazeParams:
        return MazeParams(max_steps_in_episode=self.buffer_len, partial=self.partial,
                          use_legal_mask=self.use_legal_mask)

    def _observe(self, cell, params):
        p = jnp.asarray(params.partial).astype(jnp.int32)
        return jnp.asarray(_OBS_TABLE)[p, cell], jnp.asarray(_OBS_LEN)[p, cell]

    def _init_task(self, key, params):
        # uniform over the open cells other than the goal
        k = jax.random.randint(key, (), 0, NUM_CELLS - 1, jnp.int32)
        cell = jnp.where(k >= GOAL_CELL, k + 1, k).astype(jnp.int32)
        words, n = self._observe(cell, params)
        return {"cell": cell}, words, n

    def _on_turn(self, key, state, utt, valid, params):
        d = jnp.clip(utt, 0, 3)
        legal = valid & jnp.logical_not(jnp.asarray(BLOCKED)[state.cell, d])
        cell = jnp.where(legal, jnp.asarray(NEXT_CELL)[state.cell, d], state.cell)
        at_goal = cell == GOAL_CELL
        dist = jnp.asarray(DIST_TO_GOAL)
        progress = (dist[state.cell] - dist[cell]).astype(jnp.float32)
        dense_reward = jnp.where(at_goal, 0.0, jnp.where(legal, -1.0, -4.0))
        reward = jnp.where(jnp.asarray(params.sparse), jnp.where(at_goal, 1.0, 0.0), dense_reward)
        words, n = self._observe(cell, params)
        return TurnOutcome(state.replace(cell=cell), words, n, reward, progress, at_goal, at_goal)

    def expert_action(self, state, params=None):
        return maze_expert_action(state, params)

    def expert_utterance(self, state, params=None):
        return maze_expert_utterance(state, params)

    def render(self, state, params=None) -> str:
        cell = int(np.asarray(state.cell))
        x, y = CELLS[cell]
        rows = [list(r) for r in MAZE_LAYOUT]
        rows[GOAL[1]][GOAL[0]] = "G"
        rows[y][x] = "A"
        grid = "\n".join("".join(r) for r in rows)
        return super().render(state, params) + "\n" + grid


def maze_expert_utterance(state: MazeState, params=None) -> jax.Array:
    """The expert's next utterance (int32 index into ``MAZE_GRAMMAR``, i.e. the
    direction): a move along a shortest path to the goal (uses the true position)."""
    nxt = jnp.asarray(NEXT_CELL)[state.cell]
    dist = jnp.asarray(DIST_TO_GOAL)[nxt]
    dist = jnp.where(jnp.asarray(BLOCKED)[state.cell], 10**6, dist)
    return jnp.argmin(dist).astype(jnp.int32)


def maze_expert_action(state: MazeState, params=None) -> jax.Array:
    """The expert's next token: :func:`maze_expert_utterance`, one token per step."""
    return MAZE_GRAMMAR.emit(maze_expert_utterance(state, params), state.turn_toks, state.turn_len)
