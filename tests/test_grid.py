"""Tests of the grid worlds (KeyDoor, FourRooms): dynamics, layouts, rewards,
shaping, BFS ground truth, jit/vmap consistency and rendering."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from envs_jax.grid import (
    FourRooms, FourRoomsState, KeyDoor, optimal_advantage, optimal_distances, optimal_steps_to_goal,
)
from envs_jax.grid.keydoor import KeyDoorState, config_of, subgoal_distance, transition

SIZES = (5, 6, 8)
INFO_KEYS = {"success", "dense_reward", "phase", "terminated", "truncated", "final_observation"}


# ----------------------------------------------------------------------------- helpers
B = 4  # batch of the shared jitted step (few compilations keep the suite fast)
N_RESET = 200


@functools.lru_cache(maxsize=None)
def _env(name):
    """(env, params, jitted fns) with one compilation of each function per environment."""
    env, params = envs_jax.make(name)
    n_actions = env.num_actions
    fns = {
        "reset": jax.jit(jax.vmap(env.reset, in_axes=(0, None))),
        "step": jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, None))),
        "step_env": jax.jit(jax.vmap(env.step_env, in_axes=(0, 0, 0, None))),
        "potential": jax.jit(jax.vmap(env.potential, in_axes=(0, None))),
    }
    if name.startswith("KeyDoor"):
        fns["try_all"] = jax.jit(jax.vmap(lambda s: jax.vmap(lambda a: transition(s, a))(jnp.arange(n_actions))))
    return env, params, fns


@functools.lru_cache(maxsize=None)
def _resets(name):
    """``N_RESET`` vmapped resets (obs, states) of ``name``, computed once."""
    env, params, fns = _env(name)
    return fns["reset"](jax.random.split(jax.random.key(len(name)), N_RESET), params)


def _keys(seed, n=B):
    return jax.random.split(jax.random.key(seed), n)


def _slice(tree, lo, hi):
    return jax.tree.map(lambda x: np.asarray(x)[lo:hi], tree)


def _hand_state(agent=(1, 1), direction=0, has_key=False, door_open=False):
    """5x5 layout (x right, y down), splitting wall at x=2, door at (2,1), key at (1,3)::

        #####
        #.D.#
        #.#.#
        #K#G#
        #####
    """
    walls = np.ones((5, 5), bool)
    walls[1:4, 1] = False
    walls[1:4, 3] = False
    walls[1, 2] = False  # door cell
    return KeyDoorState(
        time=jnp.int32(0),
        walls=jnp.asarray(walls),
        agent_pos=jnp.array(agent, jnp.int32),
        agent_dir=jnp.int32(direction),
        key_pos=jnp.array([1, 3], jnp.int32),
        has_key=jnp.bool_(has_key),
        door_pos=jnp.array([2, 1], jnp.int32),
        door_open=jnp.bool_(door_open),
        goal_pos=jnp.array([3, 3], jnp.int32),
    )


def _unbatch(tree, i):
    return jax.tree.map(lambda x: np.asarray(x)[i], tree)  # index on the host: no per-slice dispatch


def _configs(states):
    """Config index tuples from batched (..., ) states as numpy arrays."""
    s = jax.tree.map(np.asarray, states)
    return (s.agent_pos[..., 0], s.agent_pos[..., 1], s.agent_dir, s.has_key.astype(int), s.door_open.astype(int))


# ----------------------------------------------------------------------------- registry and spaces
@pytest.mark.parametrize("name,dim,n_actions", [
    ("KeyDoor-5x5", 5 * 5 * 6 + 5, 6), ("KeyDoor-6x6", 6 * 6 * 6 + 5, 6),
    ("KeyDoor-8x8", 8 * 8 * 6 + 5, 6), ("FourRooms", 13 * 13 * 3, 4),
])
def test_registered_spaces_and_info_keys(name, dim, n_actions):
    env, params = envs_jax.make(name)
    assert env.observation_space(params).shape == (dim,)
    assert env.action_space(params).n == n_actions
    obs, state = jax.eval_shape(env.reset, jax.random.key(0), params)
    assert obs.shape == (dim,) and obs.dtype == jnp.float32
    out = jax.eval_shape(env.step, jax.random.key(1), state, jnp.int32(1), params)
    assert len(out) == 6 and out[2].dtype == jnp.float32 and out[3].dtype == jnp.bool_
    info = out[-1]
    assert set(info) == INFO_KEYS
    assert info["success"].dtype == jnp.bool_ and info["phase"].dtype == jnp.int32
    assert info["dense_reward"].dtype == jnp.float32 and info["final_observation"].shape == (dim,)
    expected_T = 200 if name == "FourRooms" else 10 * int(name[-1]) ** 2
    assert int(params.max_steps_in_episode) == expected_T


# ----------------------------------------------------------------------------- BFS ground truth
def test_optimal_distances_hand_checked():
    d = optimal_distances(_hand_state())
    assert d.shape == (5, 5, 4, 2, 2)
    up, right, down, left = range(4)
    # no key, door locked: walk down to (1,2) [1], pickup [2], up [3], face door [4],
    # toggle [5], right into door [6], right [7], down [8], down onto goal [9]
    for direction in range(4):
        assert d[1, 1, direction, 0, 0] == 9
    assert d[1, 2, down, 0, 0] == 8  # already facing the key
    assert d[1, 2, up, 0, 0] == 9
    assert d[1, 2, right, 0, 0] == 9
    # holding the key, door locked
    assert d[1, 1, right, 1, 0] == 5  # toggle, right, right, down, down
    assert d[1, 1, up, 1, 0] == 6
    assert d[1, 2, down, 1, 0] == 7
    assert d[1, 3, up, 1, 0] == 8  # standing where the key was
    # door open
    assert d[2, 1, right, 1, 1] == 3
    assert d[1, 1, left, 1, 1] == 4
    assert d[1, 1, left, 0, 1] == 4  # open door without key (unreachable from reset, still a configuration)
    assert d[3, 2, left, 0, 0] == 1
    assert d[3, 1, up, 0, 0] == 2  # right of the wall: no key needed
    assert d[3, 3, up, 1, 1] == 0
    # impossible configurations
    assert np.isinf(d[0, 0, up, 0, 0])  # in a wall
    assert np.isinf(d[2, 2, up, 1, 1])  # in the splitting wall
    assert np.isinf(d[1, 3, up, 0, 0])  # on the key lying on the floor
    assert np.isinf(d[2, 1, up, 1, 0])  # in the locked door
    assert optimal_steps_to_goal(_hand_state()) == 9
    assert optimal_steps_to_goal(_hand_state(agent=(1, 2), direction=down)) == 8


def test_optimal_advantage_helper():
    T = 100
    assert float(optimal_advantage(5, 4, False, T)) == pytest.approx(0.0, abs=1e-7)
    assert float(optimal_advantage(5, 5, False, T)) == pytest.approx(-0.009)
    assert float(optimal_advantage(5, 6, False, T)) == pytest.approx(-0.018)
    assert float(optimal_advantage(1, np.inf, True, T)) == pytest.approx(0.0, abs=1e-7)  # d_tp1 ignored
    # agrees with V*(s_t) = 1 - 0.9 (t + d) / T
    v = lambda t, d: 1 - 0.9 * (t + d) / T
    t, d_t, d_tp1 = 7, 10, 11
    assert float(optimal_advantage(d_t, d_tp1, False, T)) == pytest.approx(v(t + 1, d_tp1) - v(t, d_t), rel=1e-5)
    got = optimal_advantage(jnp.array([3, 3]), jnp.array([2, 4]), jnp.array([False, False]), T)
    np.testing.assert_allclose(np.asarray(got), [0.0, -0.018], atol=1e-7)


# ----------------------------------------------------------------------------- dynamics
def test_blocked_moves_pickup_and_toggle():
    env = KeyDoor(5)
    params = env.default_params
    step = env.step_env  # eager: shares the op cache with the jit/vmap test
    key = jax.random.key(0)
    pos = lambda s: tuple(int(v) for v in s.agent_pos)

    s = _hand_state(agent=(1, 1), direction=2)
    _, s1, r, term, _ = step(key, s, 0, params)  # up: outer wall
    assert pos(s1) == (1, 1) and int(s1.agent_dir) == 0 and float(r) == 0 and not bool(term)
    _, s2, *_ = step(key, s1, 3, params)  # left: outer wall
    assert pos(s2) == (1, 1) and int(s2.agent_dir) == 3
    _, s3, *_ = step(key, s2, 1, params)  # right: locked door blocks
    assert pos(s3) == (1, 1) and int(s3.agent_dir) == 1
    _, s4, *_ = step(key, s3, 5, params)  # toggle without key: nothing
    assert not bool(s4.door_open) and pos(s4) == (1, 1)
    _, s5, *_ = step(key, s4, 4, params)  # pickup facing the door: nothing
    assert not bool(s5.has_key)
    _, s6, *_ = step(key, s5, 1, params)  # still blocked
    assert pos(s6) == (1, 1) and int(s6.time) == 6

    s = _hand_state(agent=(1, 2), direction=0)
    _, s1, *_ = step(key, s, 4, params)  # pickup facing up (floor): nothing
    assert not bool(s1.has_key)
    _, s2, *_ = step(key, s1, 2, params)  # down: the key blocks
    assert pos(s2) == (1, 2) and int(s2.agent_dir) == 2
    obs3, s3, *_ = step(key, s2, 4, params)  # pickup
    assert bool(s3.has_key)
    grid = np.asarray(obs3[:-5]).reshape(5, 5, 6)
    assert grid[..., 1].sum() == 0 and obs3[-1] == 1.0  # key off the grid, carried
    _, s4, *_ = step(key, s3, 2, params)  # the key's old cell is now free
    assert pos(s4) == (1, 3)

    s = _hand_state(agent=(1, 1), direction=1, has_key=True)
    obs1, s1, *_ = step(key, s, 5, params)  # toggle with key facing the door
    assert bool(s1.door_open)
    grid = np.asarray(obs1[:-5]).reshape(5, 5, 6)
    assert grid[1, 2, 2] == 0 and grid[1, 2, 3] == 1  # locked -> open door channel
    _, s2, *_ = step(key, s1, 1, params)  # walk into the open door
    assert pos(s2) == (2, 1)
    _, s3, *_ = step(key, s2, 2, params)  # down from the door: wall
    assert pos(s3) == (2, 1)


# ----------------------------------------------------------------------------- layouts
@pytest.mark.parametrize("size", SIZES)
def test_reset_layouts_valid(size):
    name = f"KeyDoor-{size}x{size}"
    obs, states = _resets(name)  # N_RESET keys, vmapped
    obs = np.asarray(obs)
    s = jax.tree.map(np.asarray, states)
    n_keys = obs.shape[0]
    assert n_keys == N_RESET and obs.shape[1] == size * size * 6 + 5
    assert np.all((obs == 0) | (obs == 1))
    grid = obs[:, : size * size * 6].reshape(n_keys, size, size, 6)
    assert np.all(grid.sum(-1) <= 1)  # one-hot
    assert np.all(grid[..., 0] == s.walls)
    assert np.all(grid[..., 1].sum((1, 2)) == 1)  # exactly one key
    assert np.all(grid[..., 2].sum((1, 2)) == 1) and np.all(grid[..., 3].sum((1, 2)) == 0)  # one locked door
    assert np.all(grid[..., 5].sum((1, 2)) == 1)  # one agent
    assert np.all(grid[:, size - 2, size - 2, 4] == 1) and np.all(grid[..., 4].sum((1, 2)) == 1)
    assert np.all(obs[:, -5:-1].sum(1) == 1) and np.all(obs[:, -1] == 0)
    assert np.all(s.time == 0)
    wall_x, door_y = s.door_pos[:, 0], s.door_pos[:, 1]
    assert np.all((wall_x >= 2) & (wall_x <= size - 3))
    assert np.all((door_y >= 1) & (door_y <= size - 2))
    interior = np.arange(1, size - 1)
    for i in range(n_keys):
        w = s.walls[i]
        assert np.all(w[0]) and np.all(w[-1]) and np.all(w[:, 0]) and np.all(w[:, -1])
        inner = w[1:-1, 1:-1]
        cols = np.nonzero(inner.any(0))[0] + 1
        assert list(cols) == [wall_x[i]]  # the only interior wall is the door's column
        assert list(interior[~w[1:-1, wall_x[i]]]) == [door_y[i]]  # broken only at the door
        assert grid[i, door_y[i], wall_x[i], 2] == 1
        assert grid[i, s.key_pos[i, 1], s.key_pos[i, 0], 1] == 1
        assert 1 <= s.key_pos[i, 0] < wall_x[i] and 1 <= s.agent_pos[i, 0] < wall_x[i]  # left side
        assert 1 <= s.key_pos[i, 1] <= size - 2 and 1 <= s.agent_pos[i, 1] <= size - 2
        assert tuple(s.key_pos[i]) != tuple(s.agent_pos[i])
        assert optimal_steps_to_goal(_unbatch(states, i)) > 0  # goal reachable
    # the layouts are really random
    assert len(set(door_y.tolist())) == size - 2 and len(set(map(tuple, s.key_pos))) > 2
    assert np.all(np.abs(np.bincount(s.agent_dir, minlength=4) - n_keys / 4) < 25)  # ~uniform facing
    key_left = s.key_pos[:, 0] - 1 + (s.key_pos[:, 1] - 1) * (wall_x - 1)  # index among the left cells
    assert np.mean(key_left) == pytest.approx(np.mean(((wall_x - 1) * (size - 2) - 1) / 2), abs=1.5)
    assert len(set(wall_x.tolist())) == size - 4


# ----------------------------------------------------------------------------- optimal play
@pytest.mark.parametrize("size", SIZES)
def test_scripted_shortest_path_policy(size):
    """BFS-optimal actions, stepped through ``env.step``, reach the goal on 20 layouts
    at exactly the predicted step with reward ``1 - 0.9 t / T``, and the dense
    reward's shaping pays every one of them."""
    name = f"KeyDoor-{size}x{size}"
    env, params, fns = _env(name)
    T = int(params.max_steps_in_episode)
    _, all_states = _resets(name)
    for group in range(20 // B):
        states = _slice(all_states, group * B, (group + 1) * B)
        tables = [optimal_distances(_unbatch(states, i)) for i in range(B)]
        d0 = np.array([tables[i][config_of(_unbatch(states, i))] for i in range(B)])
        assert np.all(np.isfinite(d0)) and np.all(d0 >= 3)
        done = np.zeros(B, bool)
        for t in range(1, int(d0.max()) + 1):
            cur = _configs(states)
            nxt = _configs(fns["try_all"](states))  # arrays (B, 6): where each action leads, per env
            actions = np.zeros(B, np.int32)
            for i in np.nonzero(~done)[0]:
                d_cur = tables[i][tuple(c[i] for c in cur)]
                assert d_cur == d0[i] - (t - 1)  # still on a shortest path
                d_next = np.array([tables[i][tuple(c[i, a] for c in nxt)] for a in range(6)])
                assert d_next.min() == d_cur - 1  # some action makes progress under the env's dynamics
                actions[i] = int(np.argmin(d_next))
                # optimal steps have zero optimal advantage, the others a negative one
                adv = np.asarray(optimal_advantage(np.full(6, d_cur), d_next, d_next == 0, T))
                assert adv[actions[i]] == pytest.approx(0.0, abs=1e-7) and np.all(adv <= 1e-7)
            out = fns["step"](_keys(1000 * size + 10 * group + t), states, jnp.asarray(actions), params)
            _, states, reward, term, trunc, info = out
            reward, term, trunc = np.asarray(reward), np.asarray(term), np.asarray(trunc)
            shaping = np.asarray(info["dense_reward"]) - reward
            for i in np.nonzero(~done)[0]:
                assert not trunc[i]
                assert shaping[i] > 0  # the oracle pays every optimal step (the goal step: -Phi(s))
                if t == d0[i]:
                    assert term[i] and bool(info["success"][i]) and int(info["phase"][i]) == 2
                    assert reward[i] == pytest.approx(1 - 0.9 * t / T, rel=1e-6)
                    done[i] = True
                else:
                    assert not term[i] and reward[i] == 0.0 and not bool(info["success"][i])
        assert done.all()


# ----------------------------------------------------------------------------- shaping
def _shaping_rollout(name, params, num_envs=32, steps=400, seed=0):
    """Random-policy rollouts through ``env.step`` in one compiled program.

    Returns float64 / bool numpy arrays ``[num_envs, steps]``: the shaping
    ``dense_reward - reward``, ``Phi(s_t)``, ``Phi`` of the state the step
    reached (before any auto-reset, replayed with ``step_env`` on the step's
    own key), ``terminated`` and ``truncated``.
    """
    env = _env(name)[0]
    space = env.action_space(params)

    def episode(key):
        k0, key = jax.random.split(key)
        _, state = env.reset(k0, params)

        def step(state, k):
            ka, ks = jax.random.split(k)
            action = space.sample(ka)
            _, nxt, r, term, trunc, info = env.step(ks, state, action, params)
            reached = env.step_env(jax.random.split(ks)[0], state, action, params)[1]
            phis = (env.potential(state, params), env.potential(reached, params))
            return nxt, (info["dense_reward"] - r, *phis, term, trunc)

        return jax.lax.scan(step, state, jax.random.split(key, steps))[1]

    out = jax.jit(jax.vmap(episode))(jax.random.split(jax.random.key(seed), num_envs))
    shaping, phi, phi_reached, term, trunc = (np.asarray(x) for x in out)
    return shaping.astype(np.float64), phi.astype(np.float64), phi_reached.astype(np.float64), term, trunc


@pytest.mark.parametrize("name,max_steps,gamma", [("KeyDoor-5x5", 50, 0.99), ("FourRooms", 60, 0.9)])
def test_dense_reward_is_discounted_potential_shaping(name, max_steps, gamma):
    """``dense - reward = gamma Phi(s') - Phi(s)`` with ``Phi(terminal) = 0``:
    over every complete episode of random play (some reach the goal, some time
    out) the discounted shaping sums to ``gamma**T Phi(s_T) [not terminated] -
    Phi(s_0)``, a goal-reaching step pays exactly ``-Phi(s)``, a time-out keeps
    ``Phi(s_T)``, and ``Phi`` lies in ``[-shaping_scale, 0]``."""
    env, params, _ = _env(name)
    params = params.replace(max_steps_in_episode=max_steps, shaping_gamma=gamma)
    shaping, phi, phi_reached, term, trunc = _shaping_rollout(name, params)
    assert term.sum() >= 3 and trunc.sum() >= 3  # both kinds of episode end occur
    scale = float(params.shaping_scale)
    assert np.all(phi >= -scale - 1e-6) and np.all(phi <= 0.0) and np.all(phi_reached[term] == 0.0)
    np.testing.assert_allclose(shaping[term], -phi[term], atol=1e-6)  # Phi(terminal) = 0
    np.testing.assert_allclose(shaping[trunc], gamma * phi_reached[trunc] - phi[trunc], atol=1e-6)
    assert np.all(phi_reached[trunc] < 0)  # time-outs keep a non-zero potential
    checked = 0
    for i in range(shaping.shape[0]):
        start = 0
        for end in np.flatnonzero(term[i] | trunc[i]):
            discounts = gamma ** np.arange(end + 1 - start)
            total = np.sum(discounts * shaping[i, start:end + 1])
            want = gamma ** (end + 1 - start) * phi_reached[i, end] * (not term[i, end]) - phi[i, start]
            assert total == pytest.approx(want, abs=2e-5)
            start, checked = end + 1, checked + 1
    assert checked == term.sum() + trunc.sum()


def test_shaping_scale_and_subgoal_distance_bound():
    """``max_dist`` really bounds the sub-goal distance (so ``Phi >= -scale`` and
    later phases score higher): the worst case, door open at one end of the
    wall and the agent in the far corner of the left room, reaches it."""
    for size in SIZES:
        env = KeyDoor(size)
        wall_x = size - 3
        walls = np.zeros((size, size), bool)
        walls[[0, -1], :] = walls[:, [0, -1]] = True
        walls[2:size - 1, wall_x] = True
        state = KeyDoorState(
            time=jnp.int32(0), walls=jnp.asarray(walls), agent_pos=jnp.array([1, size - 2], jnp.int32),
            agent_dir=jnp.int32(0), key_pos=jnp.array([1, 1], jnp.int32), has_key=jnp.bool_(True),
            door_pos=jnp.array([wall_x, 1], jnp.int32), door_open=jnp.bool_(True),
            goal_pos=jnp.array([size - 2, size - 2], jnp.int32),
        )
        assert int(subgoal_distance(state)) == env.max_dist == optimal_steps_to_goal(state)
        params = env.default_params
        assert float(env.potential(state, params)) == pytest.approx(-float(params.shaping_scale) / 3)
        at_goal = state.replace(agent_pos=state.goal_pos)
        assert float(env.potential(at_goal, params)) == 0.0


# ----------------------------------------------------------------------------- FourRooms
def test_fourrooms_layout_distances_and_optimal_play():
    env, params, fns = _env("FourRooms")
    rooms = env.rooms_np
    assert sorted(set(rooms.reshape(-1).tolist())) == [-1, 0, 1, 2, 3]
    assert (~env.walls_np).sum() == 104  # 100 room cells + 4 doorways
    D = env.distance_table
    idx = lambda x, y: y * 13 + x
    assert D[idx(1, 1), idx(5, 5)] == 8
    assert D[idx(1, 1), idx(7, 1)] == 10  # through the doorway at (6, 3)
    assert D[idx(1, 1), idx(11, 11)] == 20 and env.max_dist == 20
    assert D[idx(2, 5), idx(2, 7)] == 2  # through the doorway at (2, 6)
    np.testing.assert_array_equal(D, D.T)

    obs, all_states = _resets("FourRooms")
    n = obs.shape[0]
    a, g = np.asarray(all_states.agent_pos), np.asarray(all_states.goal_pos)
    ra, rg = rooms[a[:, 1], a[:, 0]], rooms[g[:, 1], g[:, 0]]
    assert np.all(ra >= 0) and np.all(rg >= 0) and np.all(ra != rg)  # different rooms, never a doorway
    assert set(ra.tolist()) == {0, 1, 2, 3} and set(rg.tolist()) == {0, 1, 2, 3}
    grid = np.asarray(obs).reshape(n, 13, 13, 3)
    assert np.all(grid[..., 0] == env.walls_np) and np.all(grid[..., 1:].sum((1, 2)) == 1)
    assert np.all(grid[np.arange(n), a[:, 1], a[:, 0], 2] == 1) and np.all(grid[np.arange(n), g[:, 1], g[:, 0], 1] == 1)

    # greedy play on the true distance table reaches the goal in exactly d0 steps
    dirs = np.array([[0, -1], [1, 0], [0, 1], [-1, 0]])
    for group in range(2):
        states = _slice(all_states, group * B, (group + 1) * B)
        a, g = np.asarray(states.agent_pos), np.asarray(states.goal_pos)
        d0 = D[idx(a[:, 0], a[:, 1]), idx(g[:, 0], g[:, 1])]
        done = np.zeros(B, bool)
        for t in range(1, int(d0.max()) + 1):
            a = np.asarray(states.agent_pos)
            actions = np.zeros(B, np.int32)
            for i in range(B):
                actions[i] = int(np.argmin([D[idx(*(a[i] + dirs[k])), idx(*g[i])] for k in range(4)]))
            _, states, r, term, trunc, info = fns["step"](_keys(50 * group + t), states, jnp.asarray(actions), params)
            gamma = float(params.shaping_gamma)
            for i in np.nonzero(~done)[0]:
                d = d0[i] - (t - 1)  # distance before this step
                shaping = float(info["dense_reward"][i]) - float(r[i])
                if t == d0[i]:
                    assert bool(term[i]) and bool(info["success"][i])
                    assert float(r[i]) == pytest.approx(1 - 0.9 * t / 200, rel=1e-6)
                    assert shaping == pytest.approx(1 / 20, abs=1e-6)  # -Phi(s), as Phi(goal) = 0
                    done[i] = True
                else:
                    assert not bool(term[i]) and float(r[i]) == 0.0
                    # Phi = -d / 20 and an optimal step shortens d by one
                    assert shaping == pytest.approx((d - gamma * (d - 1)) / 20, abs=1e-6)
        assert done.all()


# ----------------------------------------------------------------------------- jit / vmap
def test_jit_vmap_step_matches_unjitted():
    """``jit(vmap(step))`` on a batch of 4 equals the eager step of each env,
    through truncations and auto-resets (FourRooms' batched step is checked
    against exact ground truth in the optimal-play test)."""
    env, params, fns = _env("KeyDoor-5x5")
    params = params.replace(max_steps_in_episode=2)  # force truncation and auto-reset within the run
    states = _slice(_resets("KeyDoor-5x5")[1], 0, B)
    rng = np.random.default_rng(0)
    saw_reset = False
    for t in range(3):
        keys = _keys(20 + t)
        key_data = np.asarray(jax.random.key_data(keys))
        actions = rng.integers(env.num_actions, size=B).astype(np.int32)
        batched = fns["step"](keys, states, jnp.asarray(actions), params)
        host_states, host_batched = jax.tree.map(np.asarray, states), jax.tree.map(np.asarray, batched)
        for i in range(B):
            key_i = jax.random.wrap_key_data(key_data[i])
            single = env.step(key_i, jax.tree.map(lambda x: x[i], host_states), actions[i], params)  # not jitted
            for x, y in zip(jax.tree.leaves(single), jax.tree.leaves(jax.tree.map(lambda z: z[i], host_batched))):
                np.testing.assert_allclose(np.asarray(x), y, rtol=1e-6, atol=1e-6)
        saw_reset |= bool(np.any(host_batched[3] | host_batched[4]))
        states = batched[1]
    assert saw_reset


# ----------------------------------------------------------------------------- render
def test_render_keydoor():
    env = KeyDoor(5)
    text = env.render(_hand_state(agent=(1, 2), direction=1))
    assert text == "#####\n#.D.#\n#>#.#\n#K#G#\n#####\ncarrying key: no"
    text = env.render(_hand_state(agent=(1, 3), direction=2, has_key=True, door_open=True))
    assert text == "#####\n#./.#\n#.#.#\n#v#G#\n#####\ncarrying key: yes"
    _, state = env.reset(jax.random.key(0))
    lines = env.render(state).split("\n")
    assert len(lines) == 6 and all(len(line) == 5 for line in lines[:5])
    body = "".join(lines[:5])
    assert body.count("K") == 1 and body.count("D") == 1 and body.count("G") == 1
    assert sum(body.count(c) for c in "^>v<") == 1


def test_render_fourrooms():
    env = FourRooms()
    state = FourRoomsState(time=jnp.int32(0), agent_pos=jnp.array([1, 1]), goal_pos=jnp.array([11, 11]))
    lines = env.render(state).split("\n")
    assert len(lines) == 13 and all(len(line) == 13 for line in lines)
    assert lines[0] == "#" * 13
    assert lines[1] == "#A....#.....#"
    assert lines[3] == "#...........#"  # doorway at (6, 3)
    assert lines[6] == "##.####.....#"
    assert lines[11] == "#.....#....G#"
