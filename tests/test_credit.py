"""Turn-level credit against the ground truth: Spearman correlation and the
potential heat map (:mod:`_study.analysis.credit`), the KeyDoor optimal advantage
(:mod:`envs_jax.grid.ground_truth`)."""
import os

import jax
import numpy as np
import pytest

import envs_jax
from envs_jax.grid import ground_truth as gt

from _study.analysis import credit as cr


@pytest.fixture(scope="module")
def keydoor():
    return envs_jax.make("KeyDoor-5x5")


def test_spearman_known_case():
    assert cr.spearman([1, 2, 3, 4], [10, 20, 40, 30]) == pytest.approx(0.8)
    assert cr.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    # ties: ranks [1.5, 1.5, 3] vs [1, 2, 3] -> pearson = sqrt(3)/2
    assert cr.spearman([0, 0, 1], [1, 2, 3]) == pytest.approx(np.sqrt(3) / 2)
    assert np.isnan(cr.spearman([1, 1, 1], [1, 2, 3]))


def test_keydoor_optimal_advantage_on_a_layout(keydoor):
    from envs_jax.grid.keydoor import observe, optimal_distances, transition

    env, p = keydoor
    _, state = env.reset(jax.random.PRNGKey(4), p)
    dec = gt.decode_keydoor_obs(np.asarray(observe(state)), 5)
    for f in ("walls", "agent_pos", "agent_dir", "key_pos", "door_pos", "goal_pos", "has_key", "door_open"):
        np.testing.assert_array_equal(getattr(dec, f), np.asarray(getattr(state, f)), err_msg=f)
    dist = optimal_distances(state)
    cfg = lambda s: (int(s.agent_pos[0]), int(s.agent_pos[1]), int(s.agent_dir), int(s.has_key), int(s.door_open))  # noqa
    d0 = dist[cfg(state)]
    # an optimal action (one that lowers d by 1) scores 0; "pickup" with no key ahead wastes a step
    nxt = [transition(state, a) for a in range(6)]
    best = min(range(6), key=lambda a: dist[cfg(nxt[a])])
    assert dist[cfg(nxt[best])] == d0 - 1
    obs = np.stack([np.asarray(observe(state))] * 2)
    next_obs = np.stack([np.asarray(observe(nxt[best])), np.asarray(observe(state))])
    adv = gt.keydoor_optimal_advantages(obs, next_obs, np.array([False, False]), 5, int(p.max_steps_in_episode))
    np.testing.assert_allclose(adv, [0.0, -0.9 / int(p.max_steps_in_episode)], atol=1e-7)
    # any leading shape: a [T, N] batch gives [T, N]
    adv_tn = gt.keydoor_optimal_advantages(obs[:, None], next_obs[:, None], np.zeros((2, 1), bool), 5,
                                           int(p.max_steps_in_episode))
    np.testing.assert_array_equal(adv_tn, adv[:, None])
    # credit that ranks like A* correlates perfectly
    assert cr.credit_correlation(np.array([1.0, -1.0, 0.5]), np.concatenate([obs, obs[:1]]),
                                 np.concatenate([next_obs, next_obs[1:]]), np.zeros(3, bool), 5,
                                 int(p.max_steps_in_episode)) == pytest.approx(np.sqrt(3) / 2)


def test_potential_grid_places_values_and_writes_png(keydoor, tmp_path):
    env, p = keydoor
    _, state = env.reset(jax.random.PRNGKey(4), p)

    def x_of_agent(obs):  # Phi = the agent's column (channel 5 of the cell grid)
        grid = np.asarray(obs)[:, : 5 * 5 * 6].reshape(-1, 5, 5, 6)[..., 5]
        return grid.sum(axis=1).argmax(axis=1).astype(np.float64)

    path = os.path.join(tmp_path, "v.png")
    grids = cr.potential_heatmap(x_of_agent, env, state, path)
    assert os.path.getsize(path) > 1000
    assert len(grids) == 3
    door = np.asarray(state.door_pos)
    g0, g1, g2 = grids.values()
    ys, xs = np.nonzero(np.isfinite(g2))
    np.testing.assert_array_equal(g2[ys, xs], xs)
    assert np.isnan(g0[door[1], door[0]]) and g2[door[1], door[0]] == door[0]  # locked door is not a cell
    key = np.asarray(state.key_pos)
    assert np.isnan(g0[key[1], key[0]]) and g1[key[1], key[0]] == key[0]  # the key blocks its cell until taken
