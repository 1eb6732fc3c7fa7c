"""The positive-control tasks for credit assignment: Key-to-Door with distractor
apples (``KeyToDoor-Distractor``) and the delayed-choice chain
(``DelayedChain``): dynamics, the distractor and its 0 setting, the outcome's
dependence on the decision alone, the oracle's shaping, the ground truth and a
scripted expert."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from envs_jax.chain import DelayedChain, choice_credit
from envs_jax.grid.keytodoor import KeyToDoorState, key_credit, key_pickups, phase_of
from xla_options import OPT0

GAMMA = 0.99
CHOICES = 8  # DelayedChain's default num_choices
N = 128  # episodes per batched run


def _episodes(env, params, mode, key, n=N):
    """``n`` whole episodes' worth of steps (``params.max_steps_in_episode`` from a reset)
    under policy ``mode`` (0 uniform random, 1 the scripted expert, 2 / 3 on
    DelayedChain: the correct / a wrong first choice, then random), one compiled
    program per env. Returns numpy ``obs [n, T, D]``, ``action, reward, dense,
    done, success, flag, terminated [n, T]`` (``flag``: ``info["key_picked"]``
    or ``info["choice_correct"]``)."""
    return _runner(env, int(params.max_steps_in_episode))(params, jnp.int32(mode), jax.random.split(key, n))


@functools.lru_cache(maxsize=None)
def _runner(env, steps):
    chain = isinstance(env.unwrapped, DelayedChain)
    flag = "choice_correct" if chain else "key_picked"
    expert = _chain_policy if chain else _ktd_expert(env.unwrapped)
    n_actions = env.action_space(env.default_params).n

    def run(params, mode, key):
        k0, key = jax.random.split(key)
        obs, state = env.reset(k0, params)

        def step(carry, k):
            obs, state = carry
            ka, ks = jax.random.split(k)
            random = jax.random.randint(ka, (), 0, n_actions)
            action = jnp.where(mode == 0, random, expert(state, params, mode, random))
            obs2, state2, r, term, trunc, info = env.step(ks, state, action, params)
            row = (obs, action, r, info["dense_reward"], term | trunc, info["success"], info[flag], term)
            return (obs2, state2), row

        return jax.lax.scan(step, (obs, state), jax.random.split(key, steps))[1]

    fn = jax.jit(jax.vmap(run, (None, None, 0)), compiler_options=OPT0)
    return lambda params, mode, keys: tuple(np.asarray(x) for x in fn(params, mode, keys))


@functools.lru_cache(maxsize=None)
def _step(env):
    """``env.step`` compiled once per env."""
    return jax.jit(env.step, compiler_options=OPT0)


def _first_episode(done):
    """Bool ``[n, T]``: the steps of each row's first episode (up to its first ``done``)."""
    return np.cumsum(done, axis=1) - done == 0


# ----------------------------------------------------------------------------- Key-to-Door
@functools.lru_cache(maxsize=None)
def _ktd_expert(env):
    """Greedy walker: to the key (phase 1), to the nearest apple (phase 2), to the door (phase 3)."""
    n = env.size

    def policy(state: KeyToDoorState, params, mode, random):
        p = state.agent_pos
        phase = phase_of(state.time, params)
        ys, xs = jnp.mgrid[0:n, 0:n]
        dist = jnp.abs(xs - p[0]) + jnp.abs(ys - p[1])
        apple = jnp.unravel_index(jnp.argmin(jnp.where(state.apples, dist, 10**6)), (n, n))
        target = jnp.where(phase == 0, state.key_pos, jnp.where(phase == 1, jnp.stack([apple[1], apple[0]]),
                                                                   state.door_pos))
        dx, dy = target[0] - p[0], target[1] - p[1]
        # 0 up, 1 right, 2 down, 3 left
        return jnp.where(dx > 0, 1, jnp.where(dx < 0, 3, jnp.where(dy > 0, 2, 0))).astype(jnp.int32)

    return policy


@pytest.fixture(scope="module")
def ktd():
    env, params = envs_jax.make("KeyToDoor-Distractor")
    return env, params


def test_keytodoor_phases_teleport_and_render(ktd):
    env, params = ktd
    assert int(params.max_steps_in_episode) == int(params.key_steps + params.apple_steps + params.door_steps)
    obs, state = jax.jit(env.reset, compiler_options=OPT0)(jax.random.PRNGKey(3), params)
    assert obs.shape == env.observation_space(params).shape
    assert "K" in env.render(state, params) and "phase: key" in env.render(state, params)
    # standing still (bumping into the top wall at y = 0 when possible) for key_steps steps teleports to the apples
    state = state.replace(agent_pos=jnp.array([0, 0], jnp.int32), key_pos=jnp.array([3, 3], jnp.int32))
    for t in range(int(params.key_steps)):
        obs, state, r, term, trunc, info = _step(env)(jax.random.PRNGKey(t), state, jnp.int32(0), params)
    assert int(info["phase"]) == 1 and np.array_equal(state.agent_pos, state.starts[1])
    phase_onehot, carrying = np.asarray(obs[-5:-2]), float(obs[-2])
    assert not bool(state.has_key) and carrying == 0.0 and phase_onehot.tolist() == [0.0, 1.0, 0.0]
    assert "phase: apples" in env.render(state, params)


def test_keytodoor_door_pays_only_with_the_key(ktd):
    env, params = ktd
    _, state = jax.jit(env.reset, compiler_options=OPT0)(jax.random.PRNGKey(0), params)
    t_door = int(params.key_steps + params.apple_steps)
    door = jnp.array([2, 1], jnp.int32)
    base = state.replace(time=jnp.int32(t_door), agent_pos=jnp.array([1, 1], jnp.int32), door_pos=door)
    outcomes = {}
    for has_key in (False, True):
        s = base.replace(has_key=jnp.bool_(has_key))
        obs, s2, r, term, trunc, info = _step(env)(jax.random.PRNGKey(1), s, jnp.int32(1), params)  # step right
        outcomes[has_key] = (float(r), bool(term), bool(info["success"]), np.asarray(info["final_observation"]))
    assert outcomes[True][:3] == (float(params.door_reward), True, True)
    r, term, success, final = outcomes[False]
    assert (r, term, success) == (0.0, False, False)
    n = env.size
    assert final[: n * n * 4].reshape(n, n, 4)[1, 1, 0] == 1.0  # blocked: the agent stayed at (1, 1)


def test_keytodoor_random_runs_jit_vmap_and_zero_variance(ktd):
    env, params = ktd
    obs, act, r, dense, done, success, picked, term = _episodes(env, params, 0, jax.random.PRNGKey(0))
    T = int(params.max_steps_in_episode)
    assert obs.shape == (N, T, env.observation_space(params).shape[0])
    first = _first_episode(done)
    assert (done & first).sum(1).tolist() == [1] * N  # every row holds one whole episode
    picked_all = picked
    r, dense, picked, success = r * first, dense * first, picked & first, success & first
    # with apples: rewards other than the door's (distractors) occur, only in phase 2
    apple_r = np.where(success, 0.0, r)
    ks, ae = int(params.key_steps), int(params.key_steps + params.apple_steps)
    assert (apple_r[:, ks:ae] > 0).any() and (apple_r[:, :ks] == 0).all() and (apple_r[:, ae:] == 0).all()
    # the door pays exactly when it opens, and only in episodes that took the key
    assert np.array_equal(r[success], np.full(success.sum(), float(params.door_reward)))
    assert (picked.any(1) | ~success.any(1)).all()
    # the sanity setting: no distractor reward at all; return = door_reward * success
    p0 = params.replace(apple_reward=0.0)
    _, _, r0, _, _, s0, _, _ = _episodes(env, p0, 0, jax.random.PRNGKey(0))
    np.testing.assert_array_equal(r0, np.where(s0, float(params.door_reward), 0.0))
    assert 0 < s0.any(1).mean() < 0.3
    # the oracle: discounted shaping telescopes to gamma**len Phi(s_end) [not terminated] - Phi(s_0), with
    # Phi(s_0) = -door_reward and Phi = 0 once the key is held (and at the door)
    disc = GAMMA ** np.arange(T)
    phi0 = -float(params.door_reward)
    length = first.sum(1)
    phi_end = np.where(picked.any(1), 0.0, phi0)
    np.testing.assert_allclose((dense * disc).sum(1), (r * disc).sum(1) + GAMMA**length * phi_end - phi0, atol=1e-4)
    assert (length < T).any() and (length == T).any()  # both a door opened and a time-out
    # the key pick-up step's shaping pays the door's payoff at once
    np.testing.assert_allclose((dense - r)[picked], float(params.door_reward), atol=1e-6)
    # ground truth from observations and actions agrees with the env's own flag
    np.testing.assert_array_equal(key_pickups(obs, act, env.size), picked_all)
    np.testing.assert_array_equal(key_credit(obs, act, env.size, 2.0), np.where(picked_all, 2.0, 0.0))
    assert picked.any(1).mean() > 0
    # the carried key is observed in the key room only, unless show_carrying = 1
    held = np.maximum.accumulate(picked, axis=1)[:, :-1] & first[:, 1:]  # before step t+1: the key is held
    after_room = obs[:, 1:, -5] == 0.0
    assert (held & after_room).any() and (obs[:, 1:, -2][held & after_room] == 0.0).all()
    obs1 = _episodes(env, params.replace(show_carrying=1), 0, jax.random.PRNGKey(0))[0]
    np.testing.assert_array_equal(obs1[:, 1:, -2][held], 1.0)


def test_keytodoor_scripted_expert_always_opens_the_door(ktd):
    env, params = ktd
    _, _, r, dense, done, success, picked, term = _episodes(env, params, 1, jax.random.PRNGKey(7))
    first = _first_episode(done)
    assert (success & first).any(1).all() and (picked & first).any(1).all()
    # the maximum return: the door's payoff (alone with apple_reward = 0), plus every apple
    p0 = params.replace(apple_reward=0.0)
    _, _, r0, _, done0, _, _, _ = _episodes(env, p0, 1, jax.random.PRNGKey(7))
    np.testing.assert_allclose((r0 * _first_episode(done0)).sum(1), float(params.door_reward))
    apples_eaten = ((r > 0) & ~success & first).sum(1)
    assert (apples_eaten == int(params.num_apples)).mean() > 0.9  # 16 steps clear 6 apples on a 4x4 room


def test_keytodoor_fixed_horizon_pays_the_door_once_and_keeps_success_to_the_time_limit(ktd):
    env, params = ktd
    fixed = params.replace(door_ends_episode=0, apple_reward=0.0)
    T = int(params.max_steps_in_episode)
    _, _, r, _, done, success, picked, term = _episodes(env, fixed, 1, jax.random.PRNGKey(7))  # the expert
    assert not term.any() and done[:, T - 1].all() and not done[:, : T - 1].any()  # every episode lasts T steps
    np.testing.assert_allclose(r.sum(1), float(params.door_reward))  # the door pays once, nothing after it
    opened = np.argmax(success, axis=1)
    assert success[:, -1].all() and all(success[i, opened[i]:].all() for i in range(len(opened)))
    assert (opened < T - 1).all()  # so the steps after the opening really ran
    # the random policy never ends an episode early either
    _, _, _, _, done_r, _, _, term_r = _episodes(env, fixed, 0, jax.random.PRNGKey(8))
    assert not term_r.any() and done_r[:, T - 1].all() and not done_r[:, : T - 1].any()
    with pytest.raises(ValueError, match="door_ends_episode must be 0 or 1"):
        envs_jax.make("KeyToDoor-Distractor", door_ends_episode=2)


def test_keytodoor_params_are_checked():
    with pytest.raises(ValueError, match="num_apples must be in"):
        envs_jax.make("KeyToDoor-Distractor", num_apples=16)
    with pytest.raises(ValueError, match="unknown KeyToDoor parameter"):
        envs_jax.make("KeyToDoor-Distractor", apples=3)
    _, p = envs_jax.make("KeyToDoor-Distractor", apple_steps=4, max_steps=12)
    assert int(p.max_steps_in_episode) == 12 and int(p.apple_steps) == 4


def _match_state(time, key_color, has_key=True, agent=(0, 0), door=(1, 0), other=(0, 1)):
    """A KeyToDoor-Match state of a 4x4 room at step ``time``, the agent at ``agent``."""
    i32 = lambda v: jnp.asarray(v, jnp.int32)  # noqa: E731
    return KeyToDoorState(time=i32(time), agent_pos=i32(agent), starts=jnp.zeros((3, 2), jnp.int32),
                          key_pos=i32((3, 3)), has_key=jnp.bool_(has_key), apples=jnp.zeros((4, 4), bool),
                          door_pos=i32(door), key_color=i32(key_color), other_door=i32(other))


def test_the_memory_version_shows_the_key_colour_only_in_the_key_room():
    """KeyToDoor-Match: the colour channel marks a colour-1 key in the key room; after it, a state
    and its twin with the other key colour (the doors' colours kept on their cells, so the
    right door swapped) look the same: only memory tells which door opens."""
    from envs_jax.grid.keytodoor import observe

    env, params = envs_jax.make("KeyToDoor-Match")
    assert env.name == "KeyToDoor-Match" and env.observation_space(params).shape == (4 * 4 * 5 + 5,)
    key_room = [np.asarray(observe(_match_state(0, c, has_key=False), params, 2)) for c in (0, 1)]
    colour = lambda o: o[: 4 * 4 * 5].reshape(16, 5)[:, 4]  # noqa: E731
    assert colour(key_room[0]).sum() == 0 and colour(key_room[1])[15] == 1  # the key at (3, 3)
    for t in (6, 10, 22, 25):  # the apple room and the door room
        a = np.asarray(observe(_match_state(t, 0, door=(1, 0), other=(0, 1)), params, 2))
        b = np.asarray(observe(_match_state(t, 1, door=(0, 1), other=(1, 0)), params, 2))
        np.testing.assert_array_equal(a, b)
    door_room = np.asarray(observe(_match_state(22, 1, door=(1, 0), other=(0, 1)), params, 2))
    grid = door_room[: 4 * 4 * 5].reshape(16, 5)
    assert grid[1, 3] == grid[4, 3] == 1 and grid[1, 4] == 1 and grid[4, 4] == 0  # both doors; (1, 0) is colour 1


def test_the_memory_version_opens_the_door_of_the_key_colour_and_ends_on_the_other():
    env, params = envs_jax.make("KeyToDoor-Match")
    right = 1  # from (0, 0): action 1 moves to (1, 0), the door of the key's colour
    _, _, r, term, info = env.step_env(jax.random.PRNGKey(0), _match_state(22, 0), right, params)
    assert float(r) == float(params.door_reward) and bool(term) and bool(info["success"])
    down = 2  # to (0, 1): the other colour's door
    _, _, r, term, info = env.step_env(jax.random.PRNGKey(0), _match_state(22, 0), down, params)
    assert float(r) == 0.0 and bool(term) and not bool(info["success"])
    _, _, r, term, info = env.step_env(jax.random.PRNGKey(0), _match_state(22, 0, has_key=False), right, params)
    assert float(r) == 0.0 and not bool(term)  # without the key the right door blocks, as in KeyToDoor
    colours = jax.vmap(lambda k: env.reset(k, params)[1].key_color)(jax.random.split(jax.random.PRNGKey(1), 2000))
    assert 0.45 < float(colours.mean()) < 0.55
    with pytest.raises(ValueError, match="needs door_ends_episode=1"):
        envs_jax.make("KeyToDoor-Match", door_ends_episode=0)


# ----------------------------------------------------------------------------- delayed chain
def _chain_policy(state, params, mode, random):
    """Mode 1: always the cue (the expert); 2: the cue first, then random; 3: a wrong first choice, then random."""
    first = jnp.where(mode == 3, (state.cue + 1) % CHOICES, state.cue)
    return jnp.where(mode == 1, state.cue, jnp.where(state.time == 0, first, random)).astype(jnp.int32)


@pytest.fixture(scope="module")
def chain():
    return envs_jax.make("DelayedChain", length=12, noise_std=2.0)


def test_chain_outcome_depends_only_on_the_first_action(chain):
    env, params = chain
    assert env.num_choices == CHOICES
    # the same keys: the same cues, noise and later (random) actions; only the first action differs
    runs = {}
    for mode, outcome in ((2, True), (3, False)):
        _, _, r, _, _, success, correct, term = _episodes(env, params, mode, jax.random.PRNGKey(3))
        assert term[:, -1].all() and (success[:, -1] == outcome).all() and (correct[:, 0] == outcome).all()
        runs[outcome] = r
    gap = runs[True] - runs[False]
    np.testing.assert_allclose(gap[:, -1], float(params.outcome_reward), atol=1e-5)
    np.testing.assert_array_equal(gap[:, :-1], 0.0)


def test_chain_random_runs_noise_oracle_and_ground_truth(chain):
    env, params = chain
    T = int(params.length)
    obs, act, r, dense, done, success, correct, term = _episodes(env, params, 0, jax.random.PRNGKey(1))
    assert term[:, -1].all() and not done[:, :-1].any()
    assert (r[:, 0] == 0).all() and r[:, 1:].std() > 1.0  # noise after the choice
    np.testing.assert_array_equal(success[:, -1], correct[:, 0])
    assert 0.05 < correct[:, 0].mean() < 0.25  # 1 / 8 at random
    # the oracle telescopes exactly (Phi(s_0) = 0 = Phi(terminal)): same discounted return
    disc = GAMMA ** np.arange(T)
    np.testing.assert_allclose((dense * disc).sum(1), (r * disc).sum(1), atol=1e-4)
    # with shaping_gamma = 1 it pays the outcome on the choice step: the same undiscounted return, moved
    p1 = params.replace(shaping_gamma=1.0)
    _, _, r1, d1, _, _, c1, _ = _episodes(env, p1, 0, jax.random.PRNGKey(1))
    np.testing.assert_allclose(d1[:, 0], np.where(c1[:, 0], float(params.outcome_reward), 0.0))
    np.testing.assert_allclose(d1.sum(1), r1.sum(1), atol=1e-4)
    np.testing.assert_allclose(d1[:, -1], r1[:, -1] - np.where(c1[:, 0], float(params.outcome_reward), 0.0),
                               atol=1e-5)
    # ground truth from observations and actions
    np.testing.assert_array_equal(choice_credit(obs, act, env.num_choices, 3.0), np.where(correct, 3.0, 0.0))
    # the choice is not observed unless show_choice = 1
    k = env.num_choices
    assert (obs[:, :, k:2 * k] == 0).all()
    shown = _episodes(env, params.replace(show_choice=1), 0, jax.random.PRNGKey(1))[0]
    np.testing.assert_array_equal(np.argmax(shown[:, 1:, k:2 * k], -1), np.broadcast_to(act[:, :1], (N, T - 1)))


def test_chain_zero_noise_and_expert_return(chain):
    env, params = chain
    p0 = params.replace(noise_std=0.0)
    _, _, r, _, _, success, _, _ = _episodes(env, p0, 1, jax.random.PRNGKey(2))
    np.testing.assert_array_equal(r.sum(1), np.full(N, float(params.outcome_reward)))  # the maximum, every episode
    assert success[:, -1].all()
    # with noise the expected return is still the outcome: the mean is within 4 standard errors of it
    _, _, r, _, _, _, _, _ = _episodes(env, params, 1, jax.random.PRNGKey(2))
    se = float(params.noise_std) * np.sqrt(int(params.length) - 1) / np.sqrt(N)
    assert abs(r.sum(1).mean() - float(params.outcome_reward)) < 4 * se and r.sum(1).std() > 3.0
