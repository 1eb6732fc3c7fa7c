"""SIOP potential: losses against hand values, telescoping credit, stop-gradient,
ensembles, equivalence with PPO at beta_int = 0, and the KeyDoor ground truth."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import coevo_jax as cj
import envs_jax
from coevo_jax import credit as cr
from coevo_jax.rollout import Trajectory
from coevo_jax.signals import potential as pot


def hp_(**kw):
    return cj.default_hparams("siop", **kw)


def fake_traj(obs, next_obs, reward, terminated, truncated=None, episode_return=None, action=None):
    """A Trajectory with the fields SIOP/ICM read; the rest zeros. Shapes [T, N, ...]."""
    T, N = reward.shape
    z = jnp.zeros((T, N), jnp.float32)
    truncated = jnp.zeros((T, N), bool) if truncated is None else truncated
    done = jnp.logical_or(terminated, truncated)
    return Trajectory(
        obs=obs, action=jnp.zeros((T, N), jnp.int32) if action is None else action, logp=z, value=z,
        features=jnp.zeros((T, N, 2)), reward=reward, dense_reward=reward, terminated=terminated, truncated=truncated,
        next_obs=next_obs, next_value=z, episode_done=done,
        episode_return=z if episode_return is None else episode_return, episode_length=z, episode_success=z,
    )


# ----------------------------------------------------------------------------- bookkeeping and losses by hand
def test_episode_final_returns_by_hand():
    done = jnp.array([[0], [1], [0], [0], [1], [0]], bool)
    ep_ret = jnp.array([[0.0], [0.7], [0.0], [0.0], [0.4], [0.0]])
    g, c = pot.episode_final_returns(done, ep_ret)
    np.testing.assert_allclose(g[:, 0], [0.7, 0.7, 0.4, 0.4, 0.4, 0.0])
    np.testing.assert_allclose(c[:, 0], [1, 1, 1, 1, 1, 0])


def test_loss_terms_by_hand():
    # one env, T = 3: steps 0, 1 inside an episode, step 1 ends it (reward 1), step 2 runs on.
    v_obs = jnp.array([[0.5], [0.2], [0.1]])
    v_next = jnp.array([[0.2], [0.9], [0.3]])
    reward = jnp.array([[0.0], [1.0], [0.0]])
    done = jnp.array([[False], [True], [False]])
    g, c = pot.episode_final_returns(done, reward)  # G = [1, 1, 0], complete = [1, 1, 0]
    # fitted terminal: fit on V(s_T) = 0.9 -> (0.9 - 1)^2
    np.testing.assert_allclose(pot.fit_loss(v_obs, v_next, done, g, c, 1.0), 0.01, rtol=1e-6)
    # zero terminal: fit on the last state V(obs_1) = 0.2 -> (0.2 - 1)^2
    np.testing.assert_allclose(pot.fit_loss(v_obs, v_next, done, g, c, 0.0), 0.64, rtol=1e-6)
    # weak fit over complete steps 0, 1: ((0.5 - 1)^2 + (0.2 - 1)^2) / 2
    np.testing.assert_allclose(pot.fit_all_loss(v_obs, g, c), (0.25 + 0.64) / 2, rtol=1e-6)
    # consistency, fitted: targets [0.2, 0.9 (reward inside the fitted V(s_T)), 0.3]
    want = ((0.5 - 0.2) ** 2 + (0.2 - 0.9) ** 2 + (0.1 - 0.3) ** 2) / 3
    np.testing.assert_allclose(pot.consistency_loss(v_obs, v_next, reward, done, 1.0), want, rtol=1e-6)
    # consistency, zero terminal: target of the ending step is r = 1
    want0 = ((0.5 - 0.2) ** 2 + (0.2 - 1.0) ** 2 + (0.1 - 0.3) ** 2) / 3
    np.testing.assert_allclose(pot.consistency_loss(v_obs, v_next, reward, done, 0.0), want0, rtol=1e-6)
    # a reward on a non-ending step is added to the target: V(s_t) ~ V(s_t+1) + r_t
    r_mid = jnp.array([[0.5], [0.0], [0.0]])
    np.testing.assert_allclose(pot.consistency_target(v_next, r_mid, done, 1.0)[0, 0], 0.7, rtol=1e-6)
    np.testing.assert_allclose(pot.l2_loss(v_obs), (0.25 + 0.04 + 0.01) / 3, rtol=1e-6)
    # the weighted sum
    hp = hp_(w_fit=2.0, w_fit_all=0.5, w_cons=3.0, w_reg=0.1)
    terms = pot.potential_loss_terms(v_obs, v_next, reward, done, g, c, 1.0)
    total = pot.combine_loss(terms, hp, 2.0)
    np.testing.assert_allclose(total, 2 * 0.01 + 0.5 * 0.445 + 3 * want + 0.1 * 0.1, rtol=1e-5)


def test_fit_weight_ramps_linearly():
    np.testing.assert_allclose([pot.fit_weight(2.0, i, 4.0) for i in (0, 1, 2, 4, 9)], [0, 0.5, 1, 2, 2])
    assert float(pot.fit_weight(2.0, 0, 0.0)) == 2.0


def test_consistency_stop_gradient():
    v_obs = jnp.array([[0.5], [0.2], [0.1]])
    v_next = jnp.array([[0.2], [0.9], [0.3]])
    reward = jnp.array([[0.0], [1.0], [0.0]])
    done = jnp.array([[False], [True], [False]])
    g_obs, g_next = jax.grad(pot.consistency_loss, argnums=(0, 1))(v_obs, v_next, reward, done, 1.0)
    np.testing.assert_array_equal(g_next, 0.0)
    target = pot.consistency_target(v_next, reward, done, 1.0)
    np.testing.assert_allclose(g_obs, 2 * (v_obs - target) / 3, rtol=1e-6)


# ----------------------------------------------------------------------------- credit
def _chain(key, T=7, D=5, ends=(3,)):
    """One env; obs[t+1] == next_obs[t] except after episode ends."""
    k1, k2 = jax.random.split(key)
    obs = jax.random.normal(k1, (T, 1, D))
    final = jax.random.normal(k2, (T, 1, D))
    done = np.zeros((T, 1), bool)
    done[list(ends), 0] = True
    next_obs = jnp.concatenate([obs[1:], final[-1:]], 0)
    next_obs = jnp.where(jnp.asarray(done)[..., None], final, next_obs)
    return obs, next_obs, jnp.asarray(done)


@pytest.mark.parametrize("credit_gamma", [0.0, 1.0])
def test_credit_telescopes(credit_gamma):
    net = pot.PotentialNetwork((8,))
    params = net.init(jax.random.PRNGKey(1), jnp.zeros((1, 5)))
    obs, next_obs, done = _chain(jax.random.PRNGKey(2), T=7, ends=(3,))
    v_obs, v_next = net.apply(params, obs), net.apply(params, next_obs)
    hp = hp_(credit_clip=1e6, credit_gamma=credit_gamma, gamma=0.9, terminal_potential=1.0)
    credit_fn = jax.jit(pot.compute_credit, static_argnums=4)
    credit = credit_fn(v_obs, v_next, done, hp, 1)[:, 0]
    g = 0.9 if credit_gamma else 1.0
    # episode 0: steps 0..3, s_T = next_obs[3]; sum g^t credit_t = g^4 V(s_T) - V(s_0)
    lhs = sum(g**t * credit[t] for t in range(4))
    np.testing.assert_allclose(lhs, g**4 * v_next[3, 0] - v_obs[0, 0], rtol=1e-4, atol=1e-6)
    # episode 1 (runs past the end): steps 4..6 telescope to g^3 V(next_obs[6]) - V(s_4)
    lhs = sum(g**t * credit[4 + t] for t in range(3))
    np.testing.assert_allclose(lhs, g**3 * v_next[6, 0] - v_obs[4, 0], rtol=1e-4, atol=1e-6)
    # zero terminal potential: episode 0 sums to -V(s_0)
    credit0 = credit_fn(v_obs, v_next, done, hp.replace(terminal_potential=0.0), 1)[:, 0]
    np.testing.assert_allclose(sum(g**t * credit0[t] for t in range(4)), -v_obs[0, 0], rtol=1e-4, atol=1e-6)


def test_nstep_smoothing_and_clip_by_hand():
    c = jnp.array([[1.0], [2.0], [3.0], [4.0]])
    done = jnp.array([[False], [True], [False], [False]])
    out = pot.nstep_smooth(c, done, 0.5, 3)[:, 0]
    # t0: 1 + .5*2 (episode ends at 1); t1: 2; t2: 3 + .5*4 (trajectory ends); t3: 4
    np.testing.assert_allclose(out, [2.0, 2.0, 5.0, 4.0])
    hp = hp_(credit_clip=0.25)
    v_obs = jnp.array([[0.0], [0.0]])
    v_next = jnp.array([[1.0], [-0.1]])
    np.testing.assert_allclose(pot.compute_credit(v_obs, v_next, jnp.zeros((2, 1), bool), hp, 1)[:, 0], [0.25, -0.1])


# ----------------------------------------------------------------------------- network, ensemble, signal
@pytest.fixture(scope="module")
def keydoor():
    return envs_jax.make("KeyDoor-5x5")


def synthetic_traj(T=8, N=4, D=155, seed=0):
    """A ``[T, N]`` trajectory of binary observations (KeyDoor-5x5 width) where
    ``next_obs[t] == obs[t+1]`` except where an episode ends: env 0 ends with reward
    0.8 at the last step (terminated), env 1 times out at step 3 (truncated, return 0)."""
    rng = np.random.default_rng(seed)
    obs = (rng.random((T + 1, N, D)) < 0.2).astype(np.float32)
    final = (rng.random((T, N, D)) < 0.2).astype(np.float32)
    term = np.zeros((T, N), bool)
    trunc = np.zeros((T, N), bool)
    term[-1, 0] = True
    trunc[3, 1] = True
    done = term | trunc
    next_obs = np.where(done[..., None], final, obs[1:])
    reward = np.zeros((T, N), np.float32)
    reward[-1, 0] = 0.8
    action = rng.integers(0, 6, (T, N)).astype(np.int32)
    return fake_traj(jnp.asarray(obs[:T]), jnp.asarray(next_obs), jnp.asarray(reward), jnp.asarray(term),
                     jnp.asarray(trunc), episode_return=jnp.asarray(reward), action=jnp.asarray(action))


@pytest.fixture(scope="module")
def kd_traj():
    return synthetic_traj()


def test_init_bias_and_ensemble_combination(kd_traj):
    static = cj.StaticConfig(method="siop", potential_hidden=(8,), ensemble_size=3)
    net = pot.make_potential_network(static)
    params = pot.init_potential_params(net, jax.random.PRNGKey(0), jnp.zeros((1, 155)), 0.5, 3)
    np.testing.assert_array_equal(params["params"]["out"]["bias"], 0.5)
    traj = kd_traj
    vals = jax.jit(pot.member_values, static_argnums=0)(net, params, traj.obs)
    assert vals.shape == (3, 8, 4)
    np.testing.assert_allclose(vals, 0.5, atol=1e-2)  # near-zero output kernel: V starts at the guess
    for m in range(3):
        one = jax.tree.map(lambda x: x[m], params)
        np.testing.assert_allclose(vals[m], net.apply(one, traj.obs), rtol=1e-6)
    np.testing.assert_allclose(pot.combine_members(vals, "mean"), vals.mean(0), rtol=1e-6)
    np.testing.assert_allclose(pot.combine_members(vals, "min"), vals.min(0), rtol=1e-6)


def test_minibatch_indices_are_shuffled_epochs():
    idx = np.asarray(pot.minibatch_indices(jax.random.PRNGKey(0), 12, 3, 5))
    assert idx.shape == (5, 4)
    assert sorted(idx[:3].ravel().tolist()) == list(range(12))  # the first epoch visits every sample once
    assert len(set(idx[3:].ravel().tolist())) == 8  # the second epoch starts afresh


def test_one_member_ensemble_equals_single_potential(keydoor, kd_traj):
    env, p = keydoor
    static = cj.StaticConfig(method="siop", potential_hidden=(8,), potential_steps=3, ensemble_size=1,
                             num_envs=4, rollout_len=8, num_minibatches=2)
    sig = pot.make_potential(static, None, env, p)
    hp = hp_(potential_lr=1e-2, fit_ramp_iters=0.0)
    traj = kd_traj
    state = sig.observe(jax.jit(sig.init)(jax.random.PRNGKey(3), traj, hp), traj, hp)
    key = jax.random.PRNGKey(5)
    new, metrics = jax.jit(sig.update)(state, traj, None, hp, key)
    # the same steps on the single (unstacked) member by hand, minibatch by minibatch
    net = pot.make_potential_network(static)
    single = jax.tree.map(lambda x: x[0], state.params)
    opt = jax.tree.map(lambda x: x[0], state.opt_state)
    batch = pot.update_batch(traj, 1)
    idx = pot.minibatch_indices(jax.random.split(key, 1)[0], 32, 2, 3)
    step = jax.jit(pot.potential_step, static_argnums=0)
    for i in idx:
        single, opt, terms = step(net, single, opt, jax.tree.map(lambda x: x[i], batch), hp, hp.w_fit)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a[0], b, rtol=1e-5, atol=1e-7), new.params, single)
    np.testing.assert_allclose(metrics["potential_loss"], terms["loss"], rtol=1e-5)
    # and the combined values of a one-member ensemble are that member's
    np.testing.assert_allclose(pot.potential_values(static, new, traj.obs), net.apply(single, traj.obs), rtol=1e-5)


def test_update_reduces_loss_and_rewards_mix(keydoor, kd_traj):
    env, p = keydoor
    static = cj.StaticConfig(method="siop", potential_hidden=(16,), potential_steps=40, ensemble_size=2,
                             ensemble_combine="min", num_envs=4, rollout_len=8, num_minibatches=1)
    sig = pot.make_potential(static, None, env, p)
    hp = hp_(potential_lr=3e-3, fit_ramp_iters=0.0, normalize_int=0.0, beta_ext=1.0, beta_int=0.5)
    traj = kd_traj
    state = sig.observe(jax.jit(sig.init)(jax.random.PRNGKey(0), traj, hp), traj, hp)
    upd = jax.jit(sig.update)
    s1, m1 = upd(state, traj, None, hp, jax.random.PRNGKey(0))
    s2, m2 = upd(s1, traj, None, hp, jax.random.PRNGKey(0))
    assert float(m2["potential_loss"]) < float(m1["potential_loss"])
    assert float(m1["potential_fit"]) > 0  # the fit term saw the ended episode
    assert float(m1["terminal_episodes"]) == 2.0  # one terminated, one truncated
    r_used, rm = jax.jit(sig.rewards)(s2, traj, hp)
    credit, _, _ = pot.trajectory_credit(static, s2, traj, hp)
    np.testing.assert_allclose(r_used, traj.reward + 0.5 * credit, rtol=1e-5, atol=1e-7)
    assert set(rm) == {"potential_mean", "potential_min", "potential_max", "credit_mean", "credit_var",
                       "credit_clip_frac", "potential_diverged"}
    assert float(rm["potential_diverged"]) == 0.0
    assert float(state.max_abs_return) == pytest.approx(0.8)


def test_divergence_flag():
    assert float(pot.potential_diverged(jnp.array([1.0, -50.0]), 1.0)) == 0.0
    assert float(pot.potential_diverged(jnp.array([1.0, 201.0]), 1.0)) == 1.0
    assert float(pot.potential_diverged(jnp.array([jnp.nan]), 1.0)) == 1.0


def test_siop_with_zero_credit_weight_equals_ppo():
    env, p = envs_jax.make("KeyDoor-5x5")
    base = cj.StaticConfig(num_envs=4, rollout_len=8, total_steps=4 * 8 * 3, num_minibatches=1, update_epochs=1,
                           hidden_sizes=(16,), potential_hidden=(8,), potential_steps=1)
    hp = cj.default_hparams("siop", beta_int=0.0, beta_ext=1.0, k=1)
    key = jax.random.PRNGKey(7)

    def run(method):  # both programs at XLA's lowest backend optimisation level: half the compile time
        train = jax.jit(cj.make_train(base.replace(method=method), env, p))
        return train.lower(key, hp).compile(compiler_options={"xla_backend_optimization_level": 0})(key, hp)

    s_siop, m_siop = run("siop")
    s_ppo, m_ppo = run("ppo")
    jax.tree.map(np.testing.assert_array_equal, s_siop.params, s_ppo.params)
    assert float(m_siop["signal/updated"].sum()) == 3.0  # the potential was really trained
    assert float(jnp.abs(m_siop["signal/potential_mean"] - hp.potential_init).max()) > 0.0


# ----------------------------------------------------------------------------- ground truth and pictures
def test_spearman_known_case():
    assert cr.spearman([1, 2, 3, 4], [10, 20, 40, 30]) == pytest.approx(0.8)
    assert cr.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    np.testing.assert_allclose(cr.rankdata([5, 1, 5, 2]), [3.5, 1, 3.5, 2])
    # ties: ranks [1.5, 1.5, 3] vs [1, 2, 3] -> pearson = sqrt(3)/2
    assert cr.spearman([0, 0, 1], [1, 2, 3]) == pytest.approx(np.sqrt(3) / 2)
    assert np.isnan(cr.spearman([1, 1, 1], [1, 2, 3]))


def test_keydoor_optimal_advantage_on_a_layout(keydoor):
    from envs_jax.grid.keydoor import observe, optimal_distances, transition

    env, p = keydoor
    _, state = env.reset(jax.random.PRNGKey(4), p)
    dec = cr.decode_keydoor_obs(np.asarray(observe(state)), 5)
    for f in ("walls", "agent_pos", "agent_dir", "key_pos", "door_pos", "goal_pos", "has_key", "door_open"):
        np.testing.assert_array_equal(getattr(dec, f), np.asarray(getattr(state, f)), err_msg=f)
    dist = optimal_distances(state)
    cfg = lambda s: (int(s.agent_pos[0]), int(s.agent_pos[1]), int(s.agent_dir), int(s.has_key), int(s.door_open))
    d0 = dist[cfg(state)]
    # an optimal action (one that lowers d by 1) scores 0; "pickup" with no key ahead wastes a step
    nxt = [transition(state, a) for a in range(6)]
    best = min(range(6), key=lambda a: dist[cfg(nxt[a])])
    assert dist[cfg(nxt[best])] == d0 - 1
    obs = np.stack([np.asarray(observe(state))] * 2)
    next_obs = np.stack([np.asarray(observe(nxt[best])), np.asarray(observe(state))])
    adv = cr.keydoor_optimal_advantages(obs, next_obs, np.array([False, False]), 5, int(p.max_steps))
    np.testing.assert_allclose(adv, [0.0, -0.9 / int(p.max_steps)], atol=1e-7)
    # credit that ranks like A* correlates perfectly
    assert cr.credit_correlation(np.array([1.0, -1.0, 0.5]), np.concatenate([obs, obs[:1]]),
                                 np.concatenate([next_obs, next_obs[1:]]), np.zeros(3, bool), 5,
                                 int(p.max_steps)) == pytest.approx(np.sqrt(3) / 2)


def test_potential_grid_places_values_and_writes_png(keydoor, tmp_path):
    env, p = keydoor
    _, state = env.reset(jax.random.PRNGKey(4), p)

    def x_of_agent(obs):  # V = the agent's column (channel 5 of the cell grid)
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
