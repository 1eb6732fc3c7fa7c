"""Exact policy evaluation on KeyDoor (envs_jax/grid/policy_evaluation.py)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from envs_jax.grid.keydoor import KeyDoor, KeyDoorState, optimal_distances, sample_layout
from envs_jax.grid.policy_evaluation import (
    expected_gae,
    keydoor_layouts,
    layout_model,
    policy_advantages,
    policy_values,
    start_configs,
)

GAMMA = 0.99


def _model(size=5, index=4):
    layout = keydoor_layouts(size)[index]
    return layout, layout_model(layout)


def test_layouts_are_every_layout_the_env_samples():
    assert len(keydoor_layouts(5)) == 9 and len(keydoor_layouts(6)) == 48
    known = {(tuple(s.door_pos), tuple(s.key_pos)) for s in keydoor_layouts(6)}
    drawn = jax.jit(jax.vmap(lambda k: sample_layout(k, 6)))(jax.random.split(jax.random.PRNGKey(0), 512))
    pairs = {(tuple(d), tuple(k)) for d, k in zip(np.asarray(drawn.door_pos), np.asarray(drawn.key_pos))}
    assert pairs <= known and len(pairs) == len(known)  # 512 draws of 48 layouts: every one is seen


def _states(layout, flat):
    """The env states (leaves ``[C, ...]``, time 0) of ``layout`` at configurations ``flat [C]``."""
    n = layout.walls.shape[0]
    x, y, d, k, o = np.unravel_index(flat, (n, n, 4, 2, 2))
    return jax.tree.map(jnp.asarray, KeyDoorState(
        time=np.zeros(len(x), np.int32), walls=np.broadcast_to(layout.walls, (len(x), n, n)),
        agent_pos=np.stack([x, y], 1).astype(np.int32), agent_dir=d.astype(np.int32),
        key_pos=np.broadcast_to(layout.key_pos, (len(x), 2)), has_key=k.astype(bool),
        door_pos=np.broadcast_to(layout.door_pos, (len(x), 2)), door_open=o.astype(bool),
        goal_pos=np.broadcast_to(layout.goal_pos, (len(x), 2))))


def test_model_transitions_are_the_env_transitions():
    """Every (configuration, action) of a layout stepped in the real env lands where the model says."""
    layout, model = _model()
    env = KeyDoor(5)
    states = _states(layout, model.flat)

    def step(s, a):
        obs, _, _, term, _ = env.step_env(jax.random.PRNGKey(0), s, a, env.default_params)
        return obs, term

    obs, term = jax.jit(jax.vmap(jax.vmap(step, (None, 0)), (0, None)))(states, jnp.arange(6))
    np.testing.assert_array_equal(np.asarray(term), model.goal)
    live = ~model.goal
    np.testing.assert_array_equal(np.asarray(obs)[live], model.obs[model.nxt[live]])
    assert model.start.sum() == start_configs(layout).sum() == 2 * 4  # 2 free left cells x 4 facings


def test_optimal_policy_values_follow_the_shortest_path():
    """A greedy policy on BFS distances: V_0(c) = gamma^(d-1) (1 - 0.9 d / T) and no advantage above 0."""
    layout, model = _model()
    T = 30
    dist = optimal_distances(layout).reshape(-1)
    d_next = np.where(model.goal, 0.0, dist[model.flat[model.nxt]])
    pi = np.eye(6)[np.argmin(d_next, axis=1)]
    q, v = policy_values(pi, model, T, GAMMA)
    d = dist[model.flat]
    ok = d <= T
    np.testing.assert_allclose(v[ok], GAMMA ** (d[ok] - 1) * (1 - 0.9 * d[ok] / T), rtol=1e-12)
    np.testing.assert_array_equal(v[~ok], 0.0)
    adv = policy_advantages(pi, model, T, GAMMA)
    assert adv.max() <= 1e-12 and np.abs((pi * adv).sum(1)).max() <= 1e-12


def _monte_carlo_start_value(layout, config, T, episodes=4096):
    """Discounted return of uniform-random actions from ``config`` in the real env (jitted)."""
    env = KeyDoor(layout.walls.shape[0])
    params = env.default_params.replace(max_steps_in_episode=T)
    n = layout.walls.shape[0]
    x, y, d, k, o = np.unravel_index(config, (n, n, 4, 2, 2))
    start = jax.tree.map(jnp.asarray, layout.replace(agent_pos=np.array([x, y], np.int32), agent_dir=np.int32(d),
                                                     has_key=np.bool_(k), door_open=np.bool_(o)))

    def episode(key):
        def step(carry, k):
            state, alive, ret, disc = carry
            a = jax.random.randint(k, (), 0, 6)
            _, nxt, r, term, _ = env.step_env(k, state, a, params)
            ret = ret + alive * disc * r
            return (nxt, alive * (1.0 - term), ret, disc * GAMMA), None

        (_, _, ret, _), _ = jax.lax.scan(step, (start, 1.0, 0.0, 1.0), jax.random.split(key, T))
        return ret

    returns = np.asarray(jax.jit(jax.vmap(episode))(jax.random.split(jax.random.PRNGKey(1), episodes)))
    return returns.mean(), returns.std() / np.sqrt(episodes)


def test_uniform_policy_value_equals_monte_carlo_of_the_env():
    layout, model = _model()
    T = 40
    pi = np.full((len(model.flat), 6), 1 / 6)
    _, v = policy_values(pi, model, T, GAMMA)
    for i in (int(np.nonzero(model.start)[0][0]), int(np.argsort(v)[len(v) // 2])):  # a start; a middle value
        mean, se = _monte_carlo_start_value(layout, model.flat[i], T)
        assert v[i] > 1e-3 and abs(v[i] - mean) < 4 * se, (i, v[i], mean, se)


def test_expected_gae_limits():
    _, model = _model()
    T = 25
    rng = np.random.default_rng(0)
    pi = rng.dirichlet(np.ones(6), len(model.flat))
    v_hat = rng.normal(size=len(model.flat))
    # lambda = 0: the one-step delta at t0 (reward only on the step that reaches the goal)
    t0 = 3
    r = np.where(model.goal, 1 - 0.9 * (t0 + 1) / T, 0.0)
    delta = r + np.where(model.goal, 0.0, GAMMA * v_hat[model.nxt]) - v_hat[:, None]
    np.testing.assert_allclose(expected_gae(pi, v_hat, model, T, GAMMA, 0.0, t0), delta, atol=1e-12)
    # lambda = 1 with a zero critic: the Monte-Carlo return, i.e. Q^pi
    q, _ = policy_values(pi, model, T, GAMMA, t0)
    np.testing.assert_allclose(expected_gae(pi, np.zeros_like(v_hat), model, T, GAMMA, 1.0, t0), q, atol=1e-12)
    # lambda = 1, any critic, a policy that always reaches the goal in time: the sum telescopes to Q^pi - V_hat
    dist = optimal_distances(keydoor_layouts(5)[4]).reshape(-1)
    greedy = np.eye(6)[np.argmin(np.where(model.goal, 0.0, dist[model.flat[model.nxt]]), axis=1)]
    q, _ = policy_values(greedy, model, 60, GAMMA)
    np.testing.assert_allclose(expected_gae(greedy, v_hat, model, 60, GAMMA, 1.0), q - v_hat[:, None], atol=1e-12)


def test_placebo_permutation_stays_inside_each_layout():
    from _study.analysis.credit_quality import keydoor_models, layout_permutation

    models = keydoor_models(5)
    perm = layout_permutation(models)
    start = 0
    for m in models:
        block = perm[start:start + len(m.flat) * 6]
        assert sorted(block) == list(range(start, start + len(block))) and (block != np.sort(block)).any()
        start += len(block)
    assert start == len(perm)


def test_dense_shaping_is_the_envs_dense_reward():
    """On every pair of every KeyDoor-5x5 layout (time limit 60, shaping gamma 0.9, not the default): the
    shaping is step_env's ``dense_reward`` less its reward, and ``r`` the reward of a step at time 0."""
    from _study.analysis.credit_quality import config_states, dense_shaping, keydoor_models

    env, models = KeyDoor(5), keydoor_models(5)
    params = env.default_params.replace(max_steps_in_episode=60, shaping_gamma=0.9)
    shaping = dense_shaping(env, params, models)
    layouts = keydoor_layouts(5)
    states = jax.tree.map(lambda *x: jnp.concatenate(x), *[_states(lay, m.flat) for lay, m in zip(layouts, models)])
    ours = jax.tree.map(lambda *x: np.concatenate(x), *[config_states(lay, m.flat) for lay, m in zip(layouts, models)])
    jax.tree.map(np.testing.assert_array_equal, ours, jax.device_get(states))

    def step(s, a):
        _, _, reward, term, info = env.step_env(jax.random.PRNGKey(0), s, a, params)
        return reward, term, info["dense_reward"]

    reward, term, dense = map(np.asarray, jax.jit(jax.vmap(jax.vmap(step, (None, 0)), (0, None)))(states, jnp.arange(6)))
    goal = np.concatenate([m.goal for m in models])
    np.testing.assert_array_equal(term, goal)
    np.testing.assert_allclose(reward, np.where(goal, 1 - 0.9 / 60, 0.0), atol=1e-6)
    np.testing.assert_allclose(shaping, dense - reward, atol=1e-6)
    assert (shaping > 0).any() and (shaping < 0).any() and len(np.unique(np.round(shaping, 6))) > 10


def test_dense_shaping_telescopes_along_shortest_paths():
    """From every start of every layout, the shaping discounted by its own gamma along a BFS-optimal path
    sums to ``-Phi(start)`` (``Phi(goal) = 0``): it is potential-based."""
    from _study.analysis.credit_quality import dense_shaping, keydoor_models

    env, models = KeyDoor(5), keydoor_models(5)
    offsets = np.cumsum([0] + [len(m.flat) for m in models])
    for gamma in (1.0, 0.9):
        params = env.default_params.replace(shaping_gamma=gamma)
        shaping = dense_shaping(env, params, models)
        for layout, m, off in zip(keydoor_layouts(5), models, offsets):
            dist = optimal_distances(layout).reshape(-1)
            best = np.argmin(np.where(m.goal, 0.0, dist[m.flat[m.nxt]]), axis=1)
            starts = np.nonzero(m.start)[0]
            phi = np.asarray(jax.vmap(env.potential, (0, None))(_states(layout, m.flat[starts]), params))
            for c, phi_start in zip(starts, phi):
                total, discount = 0.0, 1.0
                for _ in range(int(dist[m.flat[c]])):
                    a = best[c]
                    total, discount = total + discount * shaping[off + c, a], discount * gamma
                    if m.goal[c, a]:
                        break
                    c = m.nxt[c, a]
                assert m.goal[c, a] and abs(total + phi_start) < 1e-5 and phi_start < 0, (gamma, c, total, phi_start)


def test_null_signal_scores_zero():
    """The uniform-random null row: independent draws per run, reproducible, and its Spearman with a fixed
    ``A^pi`` (a random policy's, 1,926 pooled pairs) within 4 SE of 0 per run and on average over 20 runs."""
    from _study.analysis.credit_quality import exact_targets, keydoor_models, null_signal, signal_spearmans

    models = keydoor_models(5)
    pi = np.random.default_rng(1).dirichlet(np.ones(6), sum(len(m.flat) for m in models))[None]
    adv, _ = exact_targets(pi, models, 60, GAMMA)
    shape = (20,) + adv.shape[1:]
    noise = null_signal(shape)
    np.testing.assert_array_equal(noise, null_signal(shape))
    assert not np.array_equal(noise[0], noise[1]) and 0 <= noise.min() and noise.max() < 1
    rho = signal_spearmans("random", noise, np.broadcast_to(pi, shape), np.broadcast_to(adv, shape))
    se = 1 / np.sqrt(adv.size - 1)
    for name in ("random", "random raw"):
        assert np.abs(rho[name]).max() < 4 * se and abs(rho[name].mean()) < 4 * se / np.sqrt(20), (name, rho[name])
    assert signal_spearmans("adv", adv, pi, adv)["adv"][0] > 0.99  # the same scoring ranks A^pi itself at 1
