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


def test_model_transitions_are_the_env_transitions():
    """Every (configuration, action) of a layout stepped in the real env lands where the model says."""
    layout, model = _model()
    env = KeyDoor(5)
    n = layout.walls.shape[0]
    x, y, d, k, o = np.unravel_index(model.flat, (n, n, 4, 2, 2))
    states = jax.tree.map(jnp.asarray, KeyDoorState(
        time=np.zeros(len(x), np.int32), walls=np.broadcast_to(layout.walls, (len(x), n, n)),
        agent_pos=np.stack([x, y], 1).astype(np.int32), agent_dir=d.astype(np.int32),
        key_pos=np.broadcast_to(layout.key_pos, (len(x), 2)), has_key=k.astype(bool),
        door_pos=np.broadcast_to(layout.door_pos, (len(x), 2)), door_open=o.astype(bool),
        goal_pos=np.broadcast_to(layout.goal_pos, (len(x), 2))))

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
    params = env.default_params.replace(max_steps=T)
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
    from coevo_jax.analysis.credit_quality import keydoor_models, layout_permutation

    models = keydoor_models(5)
    perm = layout_permutation(models)
    start = 0
    for m in models:
        block = perm[start:start + len(m.flat) * 6]
        assert sorted(block) == list(range(start, start + len(block))) and (block != np.sort(block)).any()
        start += len(block)
    assert start == len(perm)
