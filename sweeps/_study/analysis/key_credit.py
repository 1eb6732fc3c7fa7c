"""Credit at the key pick-up, on KeyToDoor.

On :class:`~envs_jax.grid.keytodoor.KeyToDoor` the decision that matters is
taking the key in the first room; it pays only at the door, behind the apple
room's distractor rewards. The ground-truth credit of a step is the door's
payoff on the move that takes the key and 0 elsewhere
(:func:`envs_jax.grid.keytodoor.key_credit`). Every such decision is
enumerable: each key cell, each agent cell next to it (4-neighbours), each
step of the key room, each of the 4 moves (:func:`key_pairs`). A learned
per-step reward ``r(s, a)`` that has learned the credit pays the move onto
the key more than the other moves of the same state. Only moves that stay on
the grid are compared: a move into the wall wastes a step, and a reward that
learned to charge for it would otherwise look like credit for the key (the
move onto the key never hits the wall).

The control is the same geometry with the key already taken
(``key_taken=True``): the key is gone from the floor and the carrying flag
is set, so the move toward its old cell changes nothing. A reward that pays
that move there too has learned a direction or a place, not the pick-up.

Scored per run (:func:`key_scores`), as :mod:`_study.analysis.chain_credit`
scores the chain's choice, over the on-grid moves: ``spearman`` with the
ground truth over the pairs, ``top1`` (the share of states whose pick-up move
is paid most; a uniform guess: 1/3, the mean of 1 / on-grid moves) and
``gap`` (the mean reward of the pick-up moves less that of the other moves,
in the reward's own units). Which reward: the method's ``credit``, as
:func:`_study.analysis.chain_credit.pair_credit`, each pair a one-step episode paid
the return of a successful episode that ate every apple at its mean payoff
(``door_reward + num_apples * apple_reward``: the return a return-conditioned credit
reads; a credit that reads the future sees none).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from envs_jax.grid._common import DIRS
from envs_jax.grid.keytodoor import KeyToDoorState, key_credit, observe

from _study.analysis.chain_credit import pair_credit
from _study.analysis.credit import spearman

NUM_MOVES = 4


def key_states(size: int, key_steps: int) -> np.ndarray:
    """Int ``[P, 4]``: every ``(key cell, agent x, agent y, time)`` of the key room with the agent on a
    4-neighbour of the key, at each of the room's ``key_steps`` steps."""
    rows = []
    for key in range(size * size):
        kx, ky = key % size, key // size
        for dx, dy in DIRS:
            ax, ay = kx - int(dx), ky - int(dy)
            if 0 <= ax < size and 0 <= ay < size:
                rows += [(key, ax, ay, t) for t in range(key_steps)]
    return np.asarray(rows, np.int32)


def key_pairs(env, params, key_taken: bool = False):
    """``(obs [P*4, D], action [P*4], toward [P*4], on_grid [P*4])``: the observations of :func:`key_states`
    (state-major, each with the 4 moves), as the env shows them; ``toward`` marks the move onto the key's
    cell, ``on_grid`` the moves that do not hit the wall. With ``key_taken`` the key is off the floor and
    carried: the same moves, none of them a pick-up."""
    n = env.size
    s = key_states(n, int(params.key_steps))
    p = len(s)
    state = KeyToDoorState(
        time=jnp.asarray(s[:, 3]), agent_pos=jnp.asarray(s[:, 1:3]), starts=jnp.zeros((p, 3, 2), jnp.int32),
        key_pos=jnp.stack([s[:, 0] % n, s[:, 0] // n], -1).astype(jnp.int32),
        has_key=jnp.full((p,), key_taken), apples=jnp.zeros((p, n, n), bool), door_pos=jnp.zeros((p, 2), jnp.int32),
        key_color=jnp.zeros((p,), jnp.int32), other_door=jnp.full((p, 2), -1, jnp.int32))
    obs = np.repeat(np.asarray(jax.vmap(lambda st: observe(st, params, env.colors))(state)), NUM_MOVES, axis=0)
    action = np.tile(np.arange(NUM_MOVES, dtype=np.int32), p)
    step = DIRS[action]
    tx, ty = s[:, 1].repeat(NUM_MOVES) + step[:, 0], s[:, 2].repeat(NUM_MOVES) + step[:, 1]
    on_grid = (tx >= 0) & (tx < n) & (ty >= 0) & (ty < n)
    return obs, action, on_grid & (ty * n + tx == s[:, 0].repeat(NUM_MOVES)), on_grid


def key_truth(env, params) -> np.ndarray:
    """Float64 ``[P*4]``: the env's own ground-truth credit (:func:`~envs_jax.grid.keytodoor.key_credit`) of
    :func:`key_pairs` with the key on the floor."""
    obs, action = key_pairs(env, params)[:2]
    return key_credit(obs, action, env.size, float(params.door_reward), env.colors)


def key_scores(reward: np.ndarray, toward: np.ndarray, on_grid: np.ndarray, truth: np.ndarray) -> dict:
    """``{"spearman", "top1", "gap"}``, each ``[R]``, of rewards ``[R, P*4]`` on :func:`key_pairs`, over
    the ``on_grid`` moves (``toward``: the move onto the key's cell; ``truth``: :func:`key_truth`)."""
    reward = np.asarray(reward, np.float64)
    table = np.where(on_grid, reward, -np.inf).reshape(len(reward), -1, NUM_MOVES)
    right = np.asarray(toward).reshape(-1, NUM_MOVES).argmax(-1)
    other = on_grid & ~toward
    return {"spearman": np.array([spearman(r[on_grid], truth[on_grid]) for r in reward]),
            "top1": (table.argmax(-1) == right).mean(-1),
            "gap": reward[:, toward].mean(-1) - reward[:, other].mean(-1)}


def key_rewards(trainer, states, key_taken: bool = False, hp=None) -> np.ndarray:
    """The learned reward ``[R, P*4]`` of stacked :class:`~coevo_jax.train.TrainState` (leaves ``[R, ...]``)
    on :func:`key_pairs` of ``trainer``'s KeyToDoor (a feed-forward policy; module docstring)."""
    env, params = trainer.env.unwrapped, trainer.env_params
    obs, action = key_pairs(env, params, key_taken)[:2]
    z = float(params.door_reward) + float(params.num_apples) * float(params.apple_reward)
    return pair_credit(trainer, states, obs[:, None], action, 0, np.full((len(obs), 1), z, np.float32), hp)
