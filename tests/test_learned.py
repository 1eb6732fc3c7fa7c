"""Tests of the co-evolving internal reward (coevo_jax/signals/learned.py) and
of the co-evolution diagnostics (coevo_jax/diagnostics.py)."""
import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import coevo_jax as cj
import envs_jax
from coevo_jax import diagnostics
from coevo_jax.signals import learned as L


def softplus(x):
    return math.log1p(math.exp(x))


# ----------------------------------------------------------------------------- losses, by hand
# Three valid episodes and one invalid one, L = 3. Per-step rewards r, mask, returns:
R = np.array([[0.5, 0.5, 0.9], [0.2, -0.1, 0.3], [1.0, 1.0, 1.0], [7.0, 7.0, 7.0]], np.float32)
MASK = np.array([[1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 1, 1]], np.float32)
RET = np.array([1.0, 0.0, 2.0, 5.0], np.float32)
VALID = np.array([True, True, True, False])
# episode sums over the mask: 1.0, 0.4, 3.0 (the 4th is invalid)


def test_regression_loss_by_hand():
    # errors 1.0-1.0=0, 0.4-0.0=0.4, 3.0-2.0=1.0 -> (0 + 0.16 + 1) / 3
    got = L.regression_loss(jnp.asarray(R), jnp.asarray(MASK), jnp.asarray(RET), jnp.asarray(VALID))
    assert float(got) == pytest.approx(1.16 / 3, rel=1e-6)


def test_ranking_loss_by_hand():
    # pairs with ret_i > ret_j: (0 over 1): S diff 0.6; (2 over 0): 2.0; (2 over 1): 2.6
    args = (jnp.asarray(R), jnp.asarray(MASK), jnp.asarray(RET), jnp.asarray(VALID))
    got1 = L.ranking_loss(*args, 1.0)
    assert float(got1) == pytest.approx((softplus(-0.6) + softplus(-2.0) + softplus(-2.6)) / 3, rel=1e-5)
    assert float(got1) == pytest.approx((0.4374880 + 0.1269280 + 0.0716447) / 3, rel=1e-5)
    got2 = L.ranking_loss(*args, 2.0)  # temperature halves every difference
    assert float(got2) == pytest.approx((0.5543552 + 0.3132617 + 0.2410085) / 3, rel=1e-5)
    # equal returns make no pair: the loss is 0, not NaN
    tie = L.ranking_loss(jnp.asarray(R), jnp.asarray(MASK), jnp.ones(4), jnp.asarray(VALID), 1.0)
    assert float(tie) == 0.0


def test_novelty_pieces_by_hand():
    pred = jnp.array([[1.0, 2.0], [0.0, 0.0]])
    target = jnp.array([[0.0, 0.0], [1.0, 1.0]])
    err = L.rnd_error(pred, target)  # (1 + 4) / 2, (1 + 1) / 2
    np.testing.assert_allclose(np.asarray(err), [2.5, 1.0])
    r_int = L.internal_reward(jnp.array([0.1, -0.2]), err, 0.5)
    np.testing.assert_allclose(np.asarray(r_int), [0.1 + 1.25, -0.2 + 0.5], rtol=1e-6)


def test_anti_collusion_terms_and_total_by_hand():
    r_old = R - np.array([[0.1, 0.2, 5.0], [0.0, 0.0, 0.3], [0.0, 0.0, 0.0], [9.0, 9.0, 9.0]], np.float32)
    mask = MASK * VALID[:, None]  # as buffer_mask: the invalid episode's row is zero
    # drift: masked squared changes 0.01, 0.04 | 0, 0, 0.09 | 0, 0, 0 over 8 steps
    drift = L.drift_loss(jnp.asarray(R), jnp.asarray(r_old), jnp.asarray(mask))
    assert float(drift) == pytest.approx((0.01 + 0.04 + 0.09) / 8, rel=1e-5)
    pre = np.array([[1.0, -2.0, 9.0], [0.5, 0.0, 0.0], [3.0, 0.0, 0.0], [9.0, 9.0, 9.0]], np.float32)
    extreme = L.extreme_loss(jnp.asarray(pre), jnp.asarray(mask))
    assert float(extreme) == pytest.approx((1 + 4 + 0.25 + 9) / 8, rel=1e-6)
    hp = cj.default_hparams("coevo-regression", anchor_weight=2.0, drift_weight=0.5, extreme_weight=0.1)
    args = (jnp.asarray(R), jnp.asarray(pre), jnp.asarray(r_old), jnp.asarray(mask), jnp.asarray(RET),
            jnp.asarray(VALID), hp)
    total, m = L.reward_objective(*args, "regression")
    assert float(total) == pytest.approx(2.0 * 1.16 / 3 + 0.5 * 0.14 / 8 + 0.1 * 14.25 / 8, rel=1e-5)
    assert float(m["fit_loss"]) == pytest.approx(1.16 / 3, rel=1e-6)
    total_rank, m_rank = L.reward_objective(*args, "ranking")
    bt = (softplus(-0.6) + softplus(-2.0) + softplus(-2.6)) / 3
    assert float(m_rank["fit_loss"]) == pytest.approx(bt, rel=1e-5)
    assert float(total_rank) == pytest.approx(2.0 * bt + 0.5 * 0.14 / 8 + 0.1 * 14.25 / 8, rel=1e-5)


def test_pearson_by_hand():
    x = jnp.array([1.0, 2.0, 3.0, 100.0])
    y = jnp.array([2.0, 4.0, 7.0, -50.0])
    w = jnp.array([1.0, 1.0, 1.0, 0.0])
    # over the first three: dx = -1, 0, 1; dy = -2.333, -0.333, 2.667 -> cov 5, vx 2, vy 12.667
    assert float(L.pearson(x, y, w)) == pytest.approx(5 / math.sqrt(2 * 12.666667), rel=1e-5)
    assert float(L.pearson(x, jnp.ones(4), w)) == 0.0


def test_reward_net_output_in_unit_interval():
    net = L.RewardNet(num_actions=3, hidden=(16, 16), action_embed_dim=4)
    feats = jax.random.normal(jax.random.PRNGKey(0), (64, 8))
    acts = jnp.arange(64) % 3

    @jax.jit
    def run(key):
        params = net.init(key, feats, acts)
        params = jax.tree.map(lambda p: p * 50.0, params)  # large weights: saturate the tanh
        return net.apply(params, feats * 1e3, acts)

    r, pre = run(jax.random.PRNGKey(1))
    assert r.shape == (64,)
    assert bool(jnp.all(jnp.abs(r) <= 1.0))
    assert float(jnp.abs(r).max()) > 0.99 and float(jnp.abs(pre).max()) > 10.0
    np.testing.assert_allclose(np.asarray(r), np.tanh(np.asarray(pre)), atol=1e-6)


# ----------------------------------------------------------------------------- episode buffer
def _rollout_arrays(rollout: int, done_steps, rewards):
    """A hand-built [T=5, N=2] rollout: feature = 100 n + 10 rollout + t (H = 1), action = feature % 3."""
    t, n = np.meshgrid(np.arange(5), np.arange(2), indexing="ij")
    f = (100 * n + 10 * rollout + t).astype(np.float32)
    done = np.zeros((5, 2), bool)
    for tt, nn in done_steps:
        done[tt, nn] = True
    rew = np.zeros((5, 2), np.float32)
    ep_ret = np.full((5, 2), 99.0, np.float32)
    for (tt, nn), (r, full) in rewards.items():
        rew[tt, nn] = r
        if full is not None:
            ep_ret[tt, nn] = full
    return jnp.asarray(f[..., None]), jnp.asarray(f.astype(np.int32) % 3), jnp.asarray(rew), jnp.asarray(done), \
        jnp.asarray(ep_ret)


def test_episode_buffer_across_rollout_boundaries():
    """L = 4, 8 train slots, 2 validation slots. Env 0: A = r1 t0-2 (ends), B = r1 t3-4 + r2 t0-1,
    C = r2 t2-4 (in progress). Env 1: D = r1 t0-4 + r2 t0-1 (7 steps: last 4 kept), E = r2 t2-3,
    F = r2 t4 (in progress). Commit order A, B, D, E: E is the 4th -> validation."""
    buf, val, seg = L.empty_buffer(8, 4, 1), L.empty_buffer(2, 4, 1), L.empty_segments(2, 4, 1)
    obs = jax.jit(L.observe_episodes)
    r1 = _rollout_arrays(1, [(2, 0)], {(2, 0): (1.0, 1.0), (1, 1): (0.5, None)})
    buf, val, seg, committed = obs(buf, val, seg, jnp.int32(0), *r1)
    assert int(committed) == 1 and int(buf.count) == 1 and int(val.count) == 0
    np.testing.assert_array_equal(np.asarray(buf.features[0, :3, 0]), [10, 11, 12])
    np.testing.assert_array_equal(np.asarray(seg.length), [2, 5])
    np.testing.assert_array_equal(np.asarray(seg.features[0, :2, 0]), [13, 14])
    # env 1 has 5 steps so far: positions 1..4 kept at rows 1, 2, 3, 0
    np.testing.assert_array_equal(np.asarray(seg.features[1, :, 0]), [114, 111, 112, 113])

    r2 = _rollout_arrays(2, [(1, 0), (1, 1), (3, 1)],
                         {(0, 0): (0.25, None), (1, 0): (0.0, 0.25), (1, 1): (1.0, 1.5), (3, 1): (2.0, 2.0)})
    buf, val, seg, committed = obs(buf, val, seg, committed, *r2)
    assert int(committed) == 4 and int(buf.count) == 3 and int(val.count) == 1
    np.testing.assert_array_equal(np.asarray(buf.valid), [1, 1, 1, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(np.asarray(buf.length[:3]), [3, 4, 7])
    np.testing.assert_array_equal(np.asarray(buf.features[1, :, 0]), [13, 14, 20, 21])  # B across the boundary
    np.testing.assert_array_equal(np.asarray(buf.features[2, :, 0]), [114, 120, 121, 113])  # D: positions 3..6
    np.testing.assert_array_equal(np.asarray(buf.actions[2]), np.array([114, 120, 121, 113]) % 3)
    np.testing.assert_allclose(np.asarray(buf.ret[:3]), [1.0, 0.25, 1.0])  # D's 0.5 at position 1 is cut
    np.testing.assert_allclose(np.asarray(buf.full_return[:3]), [1.0, 0.25, 1.5])
    mask = np.asarray(L.buffer_mask(buf))
    np.testing.assert_array_equal(mask[:3], [[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]])
    assert mask[3:].sum() == 0
    # validation: E only
    np.testing.assert_array_equal(np.asarray(val.valid), [1, 0])
    np.testing.assert_array_equal(np.asarray(val.features[0, :2, 0]), [122, 123])
    assert int(val.length[0]) == 2 and float(val.ret[0]) == 2.0
    # in progress: C (3 steps) and F (1 step)
    np.testing.assert_array_equal(np.asarray(seg.length), [3, 1])
    np.testing.assert_array_equal(np.asarray(seg.features[0, :3, 0]), [22, 23, 24])
    assert float(seg.features[1, 0, 0]) == 124


def test_episode_buffer_keeps_most_recent_when_overfull():
    """Ten one-step episodes per env in one rollout of T=10, N=1 into 4 train slots: the last three
    train episodes survive (episode c goes to validation when c % 4 == 3)."""
    T = 10
    f = jnp.arange(T, dtype=jnp.float32)[:, None, None]
    done = jnp.ones((T, 1), bool)
    rew = jnp.arange(T, dtype=jnp.float32)[:, None]
    buf, val, seg, c = L.observe_episodes(L.empty_buffer(4, 3, 1), L.empty_buffer(2, 3, 1),
                                          L.empty_segments(1, 3, 1), jnp.int32(0), f,
                                          jnp.zeros((T, 1), jnp.int32), rew, done, rew)
    # train episodes: 0,1,2,4,5,6,8,9 (8 of them) -> the last 4 are 5,6,8,9 at slots (4..7) % 4
    assert int(c) == 10 and int(buf.count) == 8 and int(val.count) == 2
    np.testing.assert_array_equal(np.sort(np.asarray(buf.features[:, 0, 0])), [5, 6, 8, 9])
    np.testing.assert_array_equal(np.sort(np.asarray(buf.ret)), [5, 6, 8, 9])
    np.testing.assert_array_equal(np.sort(np.asarray(val.features[:, 0, 0])), [3, 7])


# ----------------------------------------------------------------------------- fitting
def _fitting_setup(method, steps, lr, seed=0, episodes=16, max_len=8, feat_dim=4):
    env, env_params = envs_jax.make("CartPole-v1")  # 2 actions
    static = cj.StaticConfig(method=method, reward_hidden=(32, 32), action_embed_dim=4, reward_steps=steps,
                             buffer_episodes=episodes, max_episode_len=max_len)
    signal = L.make_learned(static, None, env, env_params)
    hp = cj.default_hparams(method, reward_lr=lr, drift_weight=0.0, extreme_weight=0.0)

    @jax.jit
    def setup(key):
        k1, k2, k3, k4 = jax.random.split(key, 4)
        feats = jax.random.normal(k1, (episodes, max_len, feat_dim))
        acts = jax.random.randint(k2, (episodes, max_len), 0, 2)
        length = jax.random.randint(k3, (episodes,), 3, max_len + 1)
        example = types.SimpleNamespace(features=feats[:2].transpose(1, 0, 2), action=acts[:2].T)
        state = signal.init(k4, example, hp)
        buf = L.empty_buffer(episodes, max_len, feat_dim).replace(
            features=feats, actions=acts.astype(jnp.int32), length=length, valid=jnp.ones(episodes, bool))
        return state, buf

    state, buf = setup(jax.random.PRNGKey(seed))
    return signal, state, buf, hp


def test_regression_fit_drives_sums_to_returns():
    signal, state, buf, hp = _fitting_setup("coevo-regression", steps=300, lr=3e-3)
    # a decomposable target: per-step reward 0.5 tanh(x0) + 0.3 [a == 1]
    per_step = 0.5 * jnp.tanh(buf.features[..., 0]) + 0.3 * (buf.actions == 1)
    mask = L.buffer_mask(buf)
    buf = buf.replace(ret=L.episode_sums(per_step, mask))
    state = state.replace(buffer=buf)

    @jax.jit
    def fit(state):
        def mse(params):
            r, _ = L.RewardNet(2, (32, 32), 4).apply(params, buf.features, buf.actions)
            return L.regression_loss(r, mask, buf.ret, buf.valid)

        new, metrics = signal.update(state, None, None, hp, jax.random.PRNGKey(0))
        return mse(state.params), mse(new.params), new, metrics

    before, after, new, metrics = fit(state)
    before, after = float(before), float(after)
    assert before > 0.5
    assert after < before / 20, (before, after)  # the stated factor: 20x
    assert float(metrics["buffer_corr"]) > 0.98
    # the copy of phi before the refit is kept for the drift penalty
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.all(a == b)), new.prev_params, state.params))


def test_ranking_fit_recovers_episode_order():
    signal, state, buf, hp = _fitting_setup("coevo-ranking", steps=300, lr=3e-3, episodes=6)
    # return = sum over the episode of tanh(x0): distinct returns, learnable from the features
    ret = L.episode_sums(jnp.tanh(buf.features[..., 0]), L.buffer_mask(buf))
    assert len(np.unique(np.asarray(ret))) == 6
    state = state.replace(buffer=buf.replace(ret=ret))

    @jax.jit
    def fit(state):
        def sums(params):
            r, _ = L.RewardNet(2, (32, 32), 4).apply(params, buf.features, buf.actions)
            return L.episode_sums(r, L.buffer_mask(buf))

        new, _ = signal.update(state, None, None, hp, jax.random.PRNGKey(0))
        return sums(state.params), sums(new.params)

    before, after = fit(state)
    order = np.argsort(np.asarray(ret))
    np.testing.assert_array_equal(np.argsort(np.asarray(after)), order)
    assert not np.array_equal(np.argsort(np.asarray(before)), order)  # the order was not right before the fit


def test_novelty_update_trains_the_rnd_predictor_only_on_visited_features():
    signal, state, buf, hp = _fitting_setup("coevo-novelty", steps=100, lr=3e-3)
    state = state.replace(buffer=buf.replace(ret=jnp.zeros(buf.ret.shape)))
    seen = types.SimpleNamespace(features=buf.features[:8].transpose(1, 0, 2), action=buf.actions[:8].T)
    unseen = 3.0 + buf.features[8:].transpose(1, 0, 2)  # far from anything visited

    @jax.jit
    def run(state):
        def error(s, feats):
            rnd = L.RNDNet((32, 32), 32)
            return L.rnd_error(rnd.apply(s.rnd_params, feats), rnd.apply(s.rnd_target, feats)).mean()

        new, metrics = signal.update(state, seen, None, hp, jax.random.PRNGKey(0))
        return (error(state, seen.features), error(new, seen.features), error(new, unseen), metrics["rnd_loss"],
                jax.tree.map(lambda a, b: jnp.all(a == b), new.rnd_target, state.rnd_target))

    before, after, other, loss, target_same = run(state)
    assert float(after) < float(before) / 5  # the predictor learnt the visited features
    assert float(other) > 2 * float(after)  # novel features keep a larger error (a larger bonus)
    assert float(loss) == pytest.approx(float(after), rel=0.2)
    assert jax.tree.all(target_same)  # the random target is fixed


def test_make_learned_rejects_other_methods():
    env, p = envs_jax.make("CartPole-v1")
    with pytest.raises(ValueError, match="coevo-regression, coevo-ranking, coevo-novelty"):
        L.make_learned(cj.StaticConfig(method="ppo"), None, env, p)


# ----------------------------------------------------------------------------- the training loop
SMALL = dict(num_envs=4, rollout_len=8, total_steps=4 * 8 * 4, num_minibatches=1, update_epochs=1,
             hidden_sizes=(16, 16), reward_hidden=(16, 16), action_embed_dim=4, reward_steps=2,
             buffer_episodes=8, max_episode_len=16)


@pytest.fixture(scope="module")
def loop():
    env, p = envs_jax.make("CartPole-v1")
    coevo = cj.StaticConfig(method="coevo-regression", **SMALL)
    return types.SimpleNamespace(
        coevo=jax.jit(cj.make_train(coevo, env, p)),
        ppo=jax.jit(cj.make_train(cj.StaticConfig(method="ppo", **SMALL), env, p)),
        swept=jax.jit(jax.vmap(cj.make_train(coevo, env, p))),
        gated=jax.jit(jax.vmap(cj.Trainer(coevo, env, p, batch_axis="runs").train, axis_name="runs")),
        train_fns=(cj.make_train(coevo, env, p), cj.Trainer(coevo, env, p, batch_axis="runs").train),
    )


def test_zero_internal_weight_equals_ppo(loop):
    key = jax.random.PRNGKey(3)
    hp = cj.default_hparams("coevo-regression", beta_ext=1.0, beta_int=0.0, k=1, reward_lr=1e-2)
    s_c, m_c = loop.coevo(key, hp)
    s_p, m_p = loop.ppo(key, cj.default_hparams("ppo"))
    for a, b in zip(jax.tree.leaves(s_c.params), jax.tree.leaves(s_p.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(m_c["episode_return"]), np.asarray(m_p["episode_return"]))
    # the reward net did train meanwhile (so the equality is not vacuous)
    assert float(m_c["signal/updated"].sum()) == 4
    assert float(jnp.abs(m_c["signal/r_int_var"]).max()) > 0


def test_swept_k_equals_separate_runs_and_compiles_once(loop):
    ks = [1, 2, 4]
    hps = [cj.default_hparams("coevo-regression", k=k, reward_lr=1e-2, beta_int=1.0) for k in ks]
    keys = jnp.stack([jax.random.PRNGKey(10 + i) for i in range(3)])
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *hps)
    s_b, m_b = loop.swept(keys, stacked)
    assert loop.swept._cache_size() == 1
    for i, (k, hp) in enumerate(zip(ks, hps)):
        s_i, m_i = loop.coevo(keys[i], hp)
        np.testing.assert_array_equal(np.asarray(m_b["signal/updated"][i]), np.asarray(m_i["signal/updated"]))
        assert float(m_i["signal/updated"].sum()) == {1: 4, 2: 2, 4: 1}[k]
        for a, b in zip(jax.tree.leaves((s_b.params, s_b.signal_state.params)),
                        jax.tree.leaves((s_i.params, s_i.signal_state.params))):
            np.testing.assert_allclose(np.asarray(a)[i], np.asarray(b), rtol=1e-4, atol=1e-5)
    # K is traced: other values reuse the same executable
    other = jax.tree.map(lambda *x: jnp.stack(x), *[hp.replace(k=k) for hp, k in zip(hps, [3, 5, 6])])
    loop.swept(keys, other)
    assert loop.swept._cache_size() == 1


# ----------------------------------------------------------------------------- diagnostics
def test_collusion_flag_on_synthetic_curves():
    i = np.arange(100, dtype=np.float64)
    rng = np.random.default_rng(0)
    rising = i / 10 + 0.05 * rng.standard_normal(100)
    # healthy: both rise -> never flagged
    assert not diagnostics.collusion_flag(rising, 2 * rising, window=10).any()
    # collusion from iteration 50 on: external return falls while the prediction keeps rising
    ext = np.where(i < 50, i / 10, 5.0 - (i - 50) / 10) + 0.05 * rng.standard_normal(100)
    pred = i / 5 + 0.05 * rng.standard_normal(100)
    flag = diagnostics.collusion_flag(ext, pred, window=10)
    assert not flag[:50].any()
    assert flag[60:].all()
    # both falling: not collusion; a flat noisy external return: not a trend
    assert not diagnostics.collusion_flag(-rising, -pred, window=10).any()
    flat = 5.0 + 1e-3 * rng.standard_normal(100)
    assert diagnostics.collusion_flag(flat, pred, window=10).mean() < 0.2
    assert not diagnostics.collusion_flag(flat, pred, window=10, atol=0.1).any()
    # never before a full window
    assert not diagnostics.collusion_flag(-i, i, window=10)[:9].any()
    assert diagnostics.collusion_flag(-i, i, window=10)[9:].all()
    with pytest.raises(ValueError, match="window must be >= 2"):
        diagnostics.collusion_flag(ext, pred, window=1)


def test_plot_coevo_diagnostics_writes_png(tmp_path):
    i = np.arange(30, dtype=np.float64)
    metrics = {"episode_return": np.where(i < 15, i, 30 - i), "signal/val_pred_return": i,
               "signal/r_int_var": np.exp(-i / 10), "env_steps": 64 * (i + 1)}
    path = diagnostics.plot_coevo_diagnostics(metrics, str(tmp_path / "diag.png"), window=5)
    with open(path, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(KeyError, match="signal/r_int_var"):
        diagnostics.plot_coevo_diagnostics({"episode_return": i, "signal/val_pred_return": i}, str(tmp_path / "x.png"))


def test_batch_aware_gate_equals_separate_runs_and_keeps_a_real_branch(loop):
    """With ``batch_axis`` the K-gated refit under vmap is a real ``cond`` on
    "does any run refit now" (not a select that refits every iteration), and
    every run still equals its solo run."""
    ks = [2, 4, 4]  # iterations 1 and 3: no run refits, so the branch is skipped
    hps = [cj.default_hparams("coevo-regression", k=k, reward_lr=1e-2, beta_int=1.0) for k in ks]
    keys = jnp.stack([jax.random.PRNGKey(20 + i) for i in range(3)])
    s_b, m_b = loop.gated(keys, jax.tree.map(lambda *x: jnp.stack(x), *hps))
    for i, hp in enumerate(hps):
        s_i, m_i = loop.coevo(keys[i], hp)
        np.testing.assert_array_equal(np.asarray(m_b["signal/updated"][i]), np.asarray(m_i["signal/updated"]))
        np.testing.assert_allclose(np.asarray(m_b["signal/buffer_corr"][i]), np.asarray(m_i["signal/buffer_corr"]),
                                   rtol=1e-4, atol=1e-5)
        for a, b in zip(jax.tree.leaves((s_b.params, s_b.signal_state.params)),
                        jax.tree.leaves((s_i.params, s_i.signal_state.params))):
            np.testing.assert_allclose(np.asarray(a)[i], np.asarray(b), rtol=1e-4, atol=1e-5)
    # the batch-aware program keeps one more real cond than the plain vmapped one
    plain, gated = loop.train_fns
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *hps)
    n_plain = str(jax.make_jaxpr(jax.vmap(plain))(keys, stacked)).count(" cond[")
    n_gated = str(jax.make_jaxpr(jax.vmap(gated, axis_name="runs"))(keys, stacked)).count(" cond[")
    assert n_gated == n_plain + 1
