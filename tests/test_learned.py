"""Tests of the co-evolving internal reward (coevo_jax/signals/learned.py), of
the shared reward network (coevo_jax/reward_net.py) and of the co-evolution
diagnostics (sweeps/_study/analysis/diagnostics.py)."""
import collections
import math
import types
from functools import partial

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import coevo_jax as cj
import envs_jax
from coevo_jax import episodes as ep
from coevo_jax import reward_net as RN
from coevo_jax.rollout import rollout
from coevo_jax.signals import PolicyView, init_return_scale
from coevo_jax.signals import learned as L

from _study.analysis import diagnostics

#: what ``update`` reads of the policy: its annealing factor (here 1: no annealing)
POLICY = PolicyView(None, None, None, jnp.float32(0.0), jnp.float32(1.0))


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


def test_rnd_error_and_streams_by_hand():
    """Item 4: R_phi (a decomposition of the return) stays raw in the episodic
    stream; the RND bonus goes to the non-episodic intrinsic stream, divided by
    the std of its (non-episodic) discounted returns when normalize_int, never shifted."""
    pred = jnp.array([[1.0, 2.0], [0.0, 0.0]])
    target = jnp.array([[0.0, 0.0], [1.0, 1.0]])
    err = RN.rnd_error(pred, target)  # (1 + 4) / 2, (1 + 1) / 2
    np.testing.assert_allclose(np.asarray(err), [2.5, 1.0])
    # [T=2, N=1]
    r_ext, r_phi, bonus = jnp.array([[0.0], [1.0]]), jnp.array([[0.1], [-0.2]]), jnp.array([[2.0], [1.0]])
    hp = cj.default_hparams("coevo-novelty", beta_ext=2.0, beta_int=0.5, novelty_coef=3.0, gamma=0.5,
                            normalize_int=1.0)
    scale0 = init_return_scale(1)
    _, raw = L.coevo_streams(r_ext, r_phi, None, scale0, hp)  # regression / ranking: one stream, never normalised
    np.testing.assert_allclose(np.asarray(raw.episodic), [[0.05], [1.9]], rtol=1e-6)
    assert raw.intrinsic is None
    scale, st = L.coevo_streams(r_ext, r_phi, bonus, scale0, hp)
    np.testing.assert_allclose(np.asarray(st.episodic), np.asarray(raw.episodic))
    np.testing.assert_allclose(np.asarray(scale.ret), [2.0])  # the running return: 2, then 0.5 * 2 + 1
    scale2, st2 = L.coevo_streams(r_ext, r_phi, bonus, scale, hp)
    # running returns over both batches: 2, 2, 3, 2.5 (gamma 0.5, never reset) -> the RMS of all four
    std = np.sqrt(np.mean(np.square([2.0, 2.0, 3.0, 2.5])))
    np.testing.assert_allclose(np.asarray(st2.intrinsic), np.asarray(bonus) / std, rtol=1e-5)
    assert float(st2.intrinsic_coef) == 3.0  # novelty_coef weighs the intrinsic advantage
    _, off = L.coevo_streams(r_ext, r_phi, bonus, scale, hp.replace(normalize_int=0.0))
    np.testing.assert_allclose(np.asarray(off.intrinsic), np.asarray(bonus), rtol=1e-6)


def test_anti_collusion_terms_and_total_by_hand():
    r_old = R - np.array([[0.1, 0.2, 5.0], [0.0, 0.0, 0.3], [0.0, 0.0, 0.0], [9.0, 9.0, 9.0]], np.float32)
    mask = MASK * VALID[:, None]  # as buffer_mask: the invalid episode's row is zero
    # drift: per episode n_e * sum of masked squared changes: 2 * (0.01 + 0.04) | 3 * 0.09 | 0, over 3 episodes
    drift = L.drift_loss(jnp.asarray(R), jnp.asarray(r_old), jnp.asarray(mask))
    assert float(drift) == pytest.approx((0.1 + 0.27) / 3, rel=1e-5)
    pre = np.array([[1.0, -2.0, 9.0], [0.5, 0.0, 0.0], [3.0, 0.0, 0.0], [9.0, 9.0, 9.0]], np.float32)
    extreme = L.extreme_loss(jnp.asarray(pre), jnp.asarray(mask))
    assert float(extreme) == pytest.approx((1 + 4 + 0.25 + 9) / 8, rel=1e-6)
    hp = cj.default_hparams("coevo-regression", anchor_weight=2.0, drift_weight=0.5, extreme_weight=0.1)
    args = (jnp.asarray(R), jnp.asarray(pre), jnp.asarray(r_old), jnp.asarray(mask), jnp.asarray(RET),
            jnp.asarray(VALID), hp)
    total, m = L.reward_objective(*args)
    assert float(total) == pytest.approx(2.0 * 1.16 / 3 + 0.5 * 0.37 / 3 + 0.1 * 14.25 / 8, rel=1e-5)
    assert float(m["fit_loss"]) == pytest.approx(1.16 / 3, rel=1e-6)
    # the regression objective enters exactly: ranking_weight 0 adds 0 * (a finite ranking loss)
    assert float(m["fit_loss"]) == float(L.regression_loss(*args[:1], *args[3:6]))
    rank_args = args[:-1] + (cj.default_hparams("coevo-ranking", anchor_weight=2.0, drift_weight=0.5,
                                                extreme_weight=0.1),)
    total_rank, m_rank = L.reward_objective(*rank_args)
    bt = (softplus(-0.6) + softplus(-2.0) + softplus(-2.6)) / 3
    assert float(m_rank["fit_loss"]) == pytest.approx(bt, rel=1e-5)
    assert float(total_rank) == pytest.approx(2.0 * bt + 0.5 * 0.37 / 3 + 0.1 * 14.25 / 8, rel=1e-5)
    mixed = L.reward_objective(*args[:-1], hp.replace(ranking_weight=0.25))[1]["fit_loss"]
    assert float(mixed) == pytest.approx(0.75 * 1.16 / 3 + 0.25 * bt, rel=1e-5)


def test_ircr_options_change_the_target_and_the_fit_exactly():
    """minmax_target = 1 regresses the sums onto IRCR's normalised returns; per_step_weight = 1 fits
    every step to its episode's target (IRCR's guidance loss); both at 0 leave the decomposition
    exactly as it was; the ranking fit ignores them."""
    mask = jnp.asarray(MASK * VALID[:, None])
    r, ret, valid = jnp.asarray(R), jnp.asarray(RET), jnp.asarray(VALID)
    fit = lambda **kw: float(L.reward_objective(  # noqa: E731
        r, r, r, mask, ret, valid, cj.default_hparams("coevo-regression", **kw))[1]["fit_loss"])
    y = L.minmax_normalise(ret, valid)
    assert fit() == float(L.regression_loss(r, mask, ret, valid))
    assert fit(minmax_target=1.0) == float(L.regression_loss(r, mask, y, valid))
    assert fit(minmax_target=1.0, per_step_weight=1.0) == pytest.approx(float(L.guidance_loss(r, y, mask)), rel=1e-5)
    assert fit(per_step_weight=1.0) == pytest.approx(float(L.guidance_loss(r, jnp.where(valid, ret, 0.0), mask)),
                                                     rel=1e-5)
    assert fit(per_step_weight=1.0) != fit()
    both = fit(per_step_weight=0.5, minmax_target=1.0)
    halves = 0.5 * float(L.regression_loss(r, mask, y, valid)) + 0.5 * float(L.guidance_loss(r, y, mask))
    assert both == pytest.approx(halves, rel=1e-6)
    assert fit(ranking_weight=1.0, per_step_weight=1.0, minmax_target=1.0) == fit(ranking_weight=1.0)


def test_pearson_by_hand():
    x = jnp.array([1.0, 2.0, 3.0, 100.0])
    y = jnp.array([2.0, 4.0, 7.0, -50.0])
    w = jnp.array([1.0, 1.0, 1.0, 0.0])
    # over the first three: dx = -1, 0, 1; dy = -2.333, -0.333, 2.667 -> cov 5, vx 2, vy 12.667
    assert float(L.pearson(x, y, w)) == pytest.approx(5 / math.sqrt(2 * 12.666667), rel=1e-5)
    assert float(L.pearson(x, jnp.ones(4), w)) == 0.0


def test_reward_net_output_in_unit_interval():
    net = RN.RewardNet(num_actions=3, hidden=(16, 16), action_embed_dim=4)
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


def test_observe_fills_the_episode_replay():
    """``observe`` stores complete episodes in the replay of coevo_jax.episodes: per
    step R_phi's input x, the action and the external reward, per episode the whole
    return; every 4th committed episode is held out. L = 4, 8 train slots, 2
    validation slots. Env 0: A = r1 t0-2 (ends), B = r1 t3-4 + r2 t0-1, C = r2 t2-4
    (in progress). Env 1: D = r1 t0-4 + r2 t0-1 (7 steps: last 4 kept), E = r2 t2-3,
    F = r2 t4 (in progress). Commit order A, B, D, E: E is the 4th -> validation."""
    env, p = envs_jax.make("CartPole-v1", max_steps=4)  # buffer rows of 4 steps
    static = cj.static_config("coevo-regression", reward_hidden=(4,), action_embed_dim=2, buffer_episodes=8)
    signal = L.make_learned(static, None, env, p)
    hp = cj.default_hparams("coevo-regression")

    def traj(arrays):  # a pytree with the fields observe reads
        return collections.namedtuple("Rollout", "features action reward episode_done episode_return")(*arrays)

    r1 = traj(_rollout_arrays(1, [(2, 0)], {(2, 0): (1.0, 1.0), (1, 1): (0.5, None)}))
    r2 = traj(_rollout_arrays(2, [(1, 0), (1, 1), (3, 1)],
                              {(0, 0): (0.25, None), (1, 0): (0.0, 0.25), (1, 1): (1.0, 1.5), (3, 1): (2.0, 2.0)}))
    observe = jax.jit(signal.observe)
    state = signal.init(jax.random.PRNGKey(0), r1, hp)
    state = observe(observe(state, r1, hp, jax.random.PRNGKey(1))[0], r2, hp, jax.random.PRNGKey(2))[0]
    train, val = state.replay.train, state.replay.val
    assert int(state.replay.committed) == 4 and int(train.count) == 3 and int(val.count) == 1
    np.testing.assert_array_equal(np.asarray(train.valid), [1, 1, 1, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(np.asarray(train.length[:3]), [3, 4, 7])
    np.testing.assert_array_equal(np.asarray(train.steps["x"][1, :, 0]), [13, 14, 20, 21])  # B across the boundary
    np.testing.assert_array_equal(np.asarray(train.steps["x"][2, :, 0]), [114, 120, 121, 113])  # D: positions 3..6
    np.testing.assert_array_equal(np.asarray(train.steps["action"][2]), np.array([114, 120, 121, 113]) % 3)
    # the fit's target: the reward within the kept steps (D's 0.5 at position 1 is cut); the whole return is kept
    np.testing.assert_allclose(np.asarray(L.episode_sum(train.steps["reward"], train)[:3]), [1.0, 0.25, 1.0])
    np.testing.assert_allclose(np.asarray(train.ends["full_return"][:3]), [1.0, 0.25, 1.5])
    np.testing.assert_array_equal(np.asarray(val.valid), [1, 0])  # validation: E only
    np.testing.assert_array_equal(np.asarray(val.steps["x"][0, :2, 0]), [122, 123])
    assert int(val.length[0]) == 2 and float(L.episode_sum(val.steps["reward"], val)[0]) == 2.0
    np.testing.assert_array_equal(np.asarray(state.replay.segments.length), [3, 1])  # C and F in progress


# ----------------------------------------------------------------------------- fitting
def _fitting_setup(method, steps, lr, seed=0, episodes=16, max_len=8, feat_dim=4, fit_batch=0):
    env, env_params = envs_jax.make("CartPole-v1", max_steps=max_len)  # 2 actions
    static = cj.static_config(method, reward_hidden=(32, 32), action_embed_dim=4, reward_steps=steps,
                              buffer_episodes=episodes, fit_batch_episodes=fit_batch)
    signal = L.make_learned(static, None, env, env_params)
    hp = cj.default_hparams(method, lr=lr, reward_lr_ratio=1.0, drift_weight=0.0, extreme_weight=0.0)

    @jax.jit
    def setup(key):
        k1, k2, k3, k4 = jax.random.split(key, 4)
        feats = jax.random.normal(k1, (episodes, max_len, feat_dim))
        acts = jax.random.randint(k2, (episodes, max_len), 0, 2)
        length = jax.random.randint(k3, (episodes,), 3, max_len + 1)
        example = types.SimpleNamespace(features=feats[:2].transpose(1, 0, 2), action=acts[:2].T)
        state = signal.init(k4, example, hp)
        mask = (jnp.arange(max_len)[None, :] < length[:, None]).astype(jnp.float32)
        return state, dict(features=feats, actions=acts.astype(jnp.int32), length=length,
                           valid=jnp.ones(episodes, bool), mask=mask)

    state, buf = setup(jax.random.PRNGKey(seed))
    return signal, state, types.SimpleNamespace(**buf), hp


def _with_returns(state, buf, ret):
    """``state`` whose training buffer holds ``buf``'s episodes with external
    returns ``ret [E]`` (all paid on each episode's first step)."""
    reward = jnp.zeros(buf.actions.shape).at[:, 0].set(ret)
    train = state.replay.train.replace(steps={"x": buf.features, "action": buf.actions, "reward": reward},
                                       length=buf.length, valid=buf.valid)
    return state.replace(replay=state.replay.replace(train=train))


def test_regression_fit_drives_sums_to_returns():
    signal, state, buf, hp = _fitting_setup("coevo-regression", steps=300, lr=3e-3)
    # a decomposable target: per-step reward 0.5 tanh(x0) + 0.3 [a == 1]
    per_step = 0.5 * jnp.tanh(buf.features[..., 0]) + 0.3 * (buf.actions == 1)
    mask = buf.mask
    ret = L.episode_sums(per_step, mask)
    state = _with_returns(state, buf, ret)

    @jax.jit
    def fit(state):
        def mse(params):
            r, _ = RN.RewardNet(2, (32, 32), 4).apply(params, buf.features, buf.actions)
            return L.regression_loss(r, mask, ret, buf.valid)

        new, metrics = signal.update(state, None, POLICY, hp, jax.random.PRNGKey(0))
        return mse(state.params), mse(new.params), new, metrics

    before, after, new, metrics = fit(state)
    before, after = float(before), float(after)
    assert before > 0.5
    assert after < before / 20, (before, after)  # the stated factor: 20x
    assert float(metrics["buffer_corr"]) > 0.98
    # the drift anchor moved toward the refit's result: anchor = drift_ema * old anchor + (1 - drift_ema) * phi
    for a, p0, p1 in zip(*map(jax.tree.leaves, (new.anchor_params, state.anchor_params, new.params))):
        np.testing.assert_allclose(np.asarray(a), 0.9 * np.asarray(p0) + 0.1 * np.asarray(p1), rtol=1e-5, atol=1e-7)


def test_minibatch_of_the_whole_replay_is_the_whole_replay_fit():
    """``fit_batch_episodes`` = the replay's size (every slot valid) draws all of it, in some order:
    a refit step's losses (regression, ranking, drift, saturation; the min-max target), gradient norm,
    step and diagnostics are the whole replay's; 2 episodes of the 6 give another loss."""
    out = {}
    for b in (0, 6, 2):
        signal, state, buf, hp = _fitting_setup("coevo-ranking", steps=1, lr=3e-3, episodes=6, fit_batch=b)
        hp = hp.replace(ranking_weight=0.5, minmax_target=1.0, drift_weight=0.1, extreme_weight=0.01)
        state = _with_returns(state, buf, L.episode_sums(jnp.tanh(buf.features[..., 0]), buf.mask))
        state = state.replace(anchor_params=jax.tree.map(lambda a: a + 0.05, state.params))  # drift and its gradient
        new, metrics = jax.jit(signal.update)(state, None, POLICY, hp, jax.random.PRNGKey(0))
        out[b] = new.params, {k: float(v) for k, v in metrics.items()}
    (whole, m_whole), (drawn, m_drawn), (_, m_two) = out[0], out[6], out[2]
    assert m_whole["drift_loss"] > 1e-3 and m_whole["fit_loss"] > 1e-2
    assert m_drawn.keys() == m_whole.keys()
    for k, v in m_whole.items():
        np.testing.assert_allclose(m_drawn[k], v, rtol=1e-5, atol=1e-7, err_msg=k)
    for a, b in zip(jax.tree.leaves(drawn), jax.tree.leaves(whole)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
    assert abs(m_two["first_reward_loss"] - m_whole["first_reward_loss"]) > 1e-4


@pytest.mark.parametrize("method", ["ircr", "rrd", "q-advantage", "hca",
                                    pytest.param("cca", marks=pytest.mark.slow)])  # cca: only runs (see below)
def test_replay_methods_fit_minibatches_of_episodes(method):
    """Each learned model on the episode replay: a refit step on a minibatch of every episode of a
    full replay is the whole replay's step (losses, gradient norm, diagnostics, parameters; CCA draws
    its cuts from another key, so only runs here); 2 episodes give another loss."""
    env, p = envs_jax.make("DelayedChain", length=4)  # 16 episodes a rollout, 12 to the training buffer
    static = cj.static_config(method, num_envs=4, rollout_len=16, total_steps=64, reward_hidden=(8,),
                              action_embed_dim=2, reward_steps=1, reward_input="obs", buffer_episodes=8)
    trainer = cj.Trainer(static, env, p)
    hp = cj.default_hparams(method)
    state = trainer.init(jax.random.PRNGKey(0), hp)
    traj = jax.jit(lambda s: rollout(trainer.network, s.params, trainer.env, p, s.rollout, s.key, 16)[1])(state)
    replay = jax.jit(trainer.signal.observe)(state.signal_state, traj, hp, state.key)[0]
    assert bool(replay.replay.train.valid.all())
    policy = PolicyView(None, None, None, jnp.float32(1e-3), jnp.float32(1.0))
    out = {}
    for b in (0, 8, 2):
        signal = cj.signals.make_signal(static.replace(fit_batch_episodes=b), trainer.network, trainer.env, p)
        new, metrics = jax.jit(signal.update)(replay, traj, policy, hp, jax.random.PRNGKey(1))
        out[b] = new.params, {k: float(v) for k, v in metrics.items()}
    (whole, m_whole), (drawn, m_drawn), (_, m_two) = out[0], out[8], out[2]
    assert m_drawn.keys() == m_whole.keys() and all(np.isfinite(v) for v in m_drawn.values())
    first = next(k for k in m_whole if "first" in k)
    assert abs(m_two[first] - m_whole[first]) > 1e-6 * (1 + abs(m_whole[first]))
    if method == "cca":
        return
    for k, v in m_whole.items():
        np.testing.assert_allclose(m_drawn[k], v, rtol=1e-5, atol=1e-7, err_msg=k)
    for a, b in zip(jax.tree.leaves(drawn), jax.tree.leaves(whole)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def test_fit_batch_larger_than_the_replay_is_refused_before_compiling():
    env, p = envs_jax.make("DelayedChain", length=16)
    static = cj.static_config("q-advantage", num_envs=16, rollout_len=64, buffer_episodes=8, fit_batch_episodes=9)
    with pytest.raises(cj.ConfigError, match=r"^StaticConfig.fit_batch_episodes=9 must be an integer in \[0, 8\],"
                                             r" at most buffer_episodes=8 \(the training replay's episodes\); 0:"):
        cj.validate_static(static)
    derived = ep.replay_episodes(None, 16, 64, env, p)  # 128: the size a None buffer_episodes gives
    for method in ("coevo-regression", "rrd", "ircr", "q-advantage", "hca", "cca"):
        too_many = cj.static_config(method, num_envs=16, rollout_len=64, fit_batch_episodes=derived + 1)
        cj.validate_static(too_many)  # the replay's size is not known before the env is
        with pytest.raises(cj.ConfigError, match=rf"fit_batch_episodes={derived + 1} .* at most"
                                                 rf" buffer_episodes={derived} "):
            cj.Trainer(too_many, env, p)
    with pytest.raises(cj.ConfigError, match=r"fit_batch_episodes=-1 must be an integer in \[0, 65536\]"):
        cj.validate_static(static.replace(buffer_episodes=None, fit_batch_episodes=-1))


def test_ranking_fit_recovers_episode_order():
    signal, state, buf, hp = _fitting_setup("coevo-ranking", steps=300, lr=3e-3, episodes=6)
    # return = sum over the episode of tanh(x0): distinct returns, learnable from the features
    ret = L.episode_sums(jnp.tanh(buf.features[..., 0]), buf.mask)
    assert len(np.unique(np.asarray(ret))) == 6
    state = _with_returns(state, buf, ret)

    @jax.jit
    def fit(state):
        def sums(params):
            r, _ = RN.RewardNet(2, (32, 32), 4).apply(params, buf.features, buf.actions)
            return L.episode_sums(r, buf.mask)

        new, _ = signal.update(state, None, POLICY, hp, jax.random.PRNGKey(0))
        return sums(state.params), sums(new.params)

    before, after = fit(state)
    order = np.argsort(np.asarray(ret))
    np.testing.assert_array_equal(np.argsort(np.asarray(after)), order)
    assert not np.array_equal(np.argsort(np.asarray(before)), order)  # the order was not right before the fit


def _novelty_traj(features, actions):
    """A ``[T, N]`` rollout with no finished episode (what ``observe`` reads)."""
    z = jnp.zeros(actions.shape)
    return types.SimpleNamespace(features=features, action=actions, reward=z, episode_done=z.astype(bool),
                                 episode_return=z)


def test_rnd_predictor_trains_every_iteration_in_observe():
    """Item 4: the RND predictor trains on every rollout in ``observe`` at its own
    ``rnd_lr_ratio * lr`` (not in the K-gated refit): it learns the visited features, novel
    ones keep a larger error, the target stays fixed, and ``rnd_lr_ratio = 0`` freezes it."""
    env, env_params = envs_jax.make("CartPole-v1", max_steps=8)
    static = cj.static_config("coevo-novelty", reward_hidden=(32, 32), action_embed_dim=4,
                              buffer_episodes=8, num_minibatches=4)
    signal = L.make_learned(static, None, env, env_params)
    feats = jax.random.normal(jax.random.PRNGKey(1), (8, 8, 4))
    seen = _novelty_traj(feats, (jnp.arange(64).reshape(8, 8) % 2).astype(jnp.int32))
    unseen = 3.0 + jax.random.normal(jax.random.PRNGKey(2), (64, 4))  # far from anything visited
    rnd = RN.RNDNet((32, 32), 32)

    @jax.jit
    def run(hp):
        state = signal.init(jax.random.PRNGKey(0), seen, hp)

        def error(s, x):
            return RN.rnd_error(rnd.apply(s.rnd_params, x), rnd.apply(s.rnd_target, x)).mean()

        def body(i, s):
            return signal.observe(s, seen, hp, jax.random.fold_in(jax.random.PRNGKey(3), i))[0]

        once, metrics = signal.observe(state, seen, hp, jax.random.PRNGKey(3))
        new = jax.lax.fori_loop(0, 100, body, state)
        refit, _ = signal.update(new, seen, POLICY, hp, jax.random.PRNGKey(4))
        def same(a, b):
            return jnp.all(jnp.stack([jnp.all(x == y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))]))

        return (error(state, feats), error(once, feats), error(new, feats), error(new, unseen),
                metrics["rnd_loss"], same(new.rnd_target, state.rnd_target), same(refit.rnd_params, new.rnd_params),
                same(once.rnd_params, state.rnd_params))

    hp = cj.default_hparams("coevo-novelty", lr=3e-3, rnd_lr_ratio=1.0, reward_lr_ratio=1.0)
    before, once, after, other, loss, target_same, refit_same, _ = run(hp)
    assert float(once) < float(before)  # one iteration's observe already trains it
    assert float(loss) == pytest.approx(float(before), rel=0.3)  # the mean minibatch loss of that epoch
    assert float(after) < float(before) / 5  # the predictor learnt the visited features
    assert float(other) > 2 * float(after)  # novel features keep a larger error (a larger bonus)
    assert bool(target_same) and bool(refit_same)  # the target is fixed; the refit leaves the predictor alone
    assert bool(run(hp.replace(rnd_lr_ratio=0.0))[-1])  # rnd_lr_ratio = 0: the predictor does not move


def _streams_traj(key, num_actions=2, t=6, n=3, h=4):
    k1, k2, k3 = jax.random.split(key, 3)
    z = jnp.zeros((t, n))
    return types.SimpleNamespace(
        features=jax.random.normal(k1, (t, n, h)), action=jax.random.randint(k2, (t, n), 0, num_actions),
        reward=(jax.random.uniform(k3, (t, n)) < 0.3).astype(jnp.float32), episode_done=z.astype(bool),
        episode_return=z)


@pytest.mark.parametrize("method", ["coevo-regression", "coevo-ranking", "coevo-novelty"])
def test_signal_rewards_streams_per_method(method):
    """Item 4, end of the signal: R_phi stays raw in the episodic stream (also with
    normalize_int = 1); only coevo-novelty has an intrinsic stream, its RND bonus
    times novelty_coef divided by one positive number."""
    env, env_params = envs_jax.make("CartPole-v1", max_steps=4)
    static = cj.static_config(method, reward_hidden=(16,), action_embed_dim=4, buffer_episodes=4)
    signal = L.make_learned(static, None, env, env_params)
    traj = _streams_traj(jax.random.PRNGKey(0))
    novelty = {"novelty_coef": 3.0} if method == "coevo-novelty" else {}
    hp = cj.default_hparams(method, beta_ext=2.0, beta_int=0.5, normalize_int=1.0, **novelty)
    net, rnd = RN.make_reward_net(static, env, env_params), RN.make_rnd_net(static, env, env_params)

    @jax.jit
    def run(hp):
        state = signal.init(jax.random.PRNGKey(1), traj, hp)
        new, streams, metrics = signal.rewards(state, traj, hp)
        r_phi = net.apply(state.params, traj.features, traj.action)[0]
        bonus = RN.rnd_error(rnd.apply(state.rnd_params, traj.features), rnd.apply(state.rnd_target, traj.features)) \
            if method == "coevo-novelty" else jnp.zeros_like(r_phi)
        return streams, r_phi, bonus, new.scale.count, metrics

    streams, r_phi, bonus, count, metrics = run(hp)
    np.testing.assert_allclose(np.asarray(streams.episodic), 2.0 * np.asarray(traj.reward) + 0.5 * np.asarray(r_phi),
                               rtol=1e-6, atol=1e-8)
    assert 0 < float(jnp.abs(r_phi).max()) < 0.01  # untrained: near zero, not zero
    if method != "coevo-novelty":
        assert streams.intrinsic is None
        return
    assert float(streams.intrinsic_coef) == 3.0
    ratio = np.asarray(streams.intrinsic) / np.asarray(bonus)
    np.testing.assert_allclose(ratio, ratio.flat[0], rtol=1e-5)  # one factor: scaled, not shifted
    assert ratio.flat[0] > 0 and int(count) == traj.action.size
    np.testing.assert_allclose(ratio.flat[0], 1.0 / float(metrics["int_return_rms"]), rtol=1e-5)


def test_make_learned_rejects_other_methods():
    env, p = envs_jax.make("CartPole-v1")
    with pytest.raises(ValueError, match="coevo-regression, coevo-ranking, coevo-novelty"):
        L.make_learned(cj.StaticConfig(method="ppo"), None, env, p)


# ----------------------------------------------------------------------------- the training loop
SMALL = dict(num_envs=4, rollout_len=8, total_steps=4 * 8 * 4, num_minibatches=1, update_epochs=1,
             hidden_sizes=(16, 16), reward_hidden=(16, 16), action_embed_dim=4, reward_steps=2,
             buffer_episodes=8)  # R_phi's rows: CartPole's time limit


@pytest.fixture(scope="module")
def loop():
    env, p = envs_jax.make("CartPole-v1")
    coevo = cj.static_config("coevo-regression", **SMALL)
    # both programs at XLA's lowest backend optimisation level (compiles several times faster; compared
    # with each other only, to a tolerance)
    opt0 = {"xla_backend_optimization_level": 0}
    return types.SimpleNamespace(
        coevo=jax.jit(cj.make_train(coevo, env, p), compiler_options=opt0),
        gated=jax.jit(jax.vmap(cj.Trainer(coevo, env, p, batch_axis="runs").train, axis_name="runs"),
                      compiler_options=opt0),
        train_fns=(cj.make_train(coevo, env, p), cj.Trainer(coevo, env, p, batch_axis="runs").train),
        init=cj.Trainer(coevo, env, p).init,
    )


def adam_count(opt_state) -> int:
    """Adam's step count in a :func:`coevo_jax.fit.make_optimizer` state."""
    return int(next(s.count for s in opt_state if isinstance(s, optax.ScaleByAdamState)))


def test_no_refit_before_the_first_complete_episode(loop):
    """Issue 30 item 2: the refit due at iteration 0 finds no complete episode in the
    buffer (the first rollout ends none), so it takes no step: R_phi and its Adam
    state (count 0) stay as initialised, and the run reports 0 refit steps. With a
    refit every iteration, Adam's count is exactly the run's reported refit steps."""
    key = jax.random.PRNGKey(0)
    hp = cj.default_hparams("coevo-regression", k=4)  # 4 iterations: the only refit due is at iteration 0
    state, m = loop.coevo(key, hp)
    assert float(m["episodes"][0]) == 0 and float(m["signal/updated"][0]) == 1  # due, but no episode ended
    assert adam_count(state.signal_state.opt_state) == 0
    init = loop.init(key, hp).signal_state  # (eagerly: equal to the compiled init up to float rounding)
    for a, b in zip(jax.tree.leaves((init.params, init.anchor_params)),
                    jax.tree.leaves((state.signal_state.params, state.signal_state.anchor_params))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)  # an Adam step moves ~5e-5
    assert float(m["refit_steps"][-1]) == 0.0 and float(m["signal/refit_steps"][0]) == 0.0
    state, m = loop.coevo(key, hp.replace(k=1))  # the same program: a refit due every iteration
    count = adam_count(state.signal_state.opt_state)
    assert 0 < count < 2 * 4  # reward_steps = 2 on the iterations after the first episode ended
    assert count == float(m["refit_steps"][-1]) == float(m["signal/refit_steps"].sum())
    np.testing.assert_array_equal(np.asarray(m["refit_steps"]), np.cumsum(np.asarray(m["signal/refit_steps"])))


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
    hps = [cj.default_hparams("coevo-regression", k=k, reward_lr_ratio=40.0, beta_int=1.0) for k in ks]
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
    plain, _ = loop.train_fns
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *hps)
    n_plain = str(jax.make_jaxpr(jax.vmap(plain))(keys, stacked)).count(" cond[")
    n_gated = str(loop.gated.trace(keys, stacked).jaxpr).count(" cond[")  # the program run above (no retrace)
    assert n_gated == n_plain + 1


# ----------------------------------------------------------------------------- anti-collusion terms (item 6)
@pytest.fixture(scope="module")
def jumped():
    """R_phi fit to returns A (30 refits, no drift), anchor set to it; then the returns jump by +1."""
    signal, state, buf, hp = _fitting_setup("coevo-regression", steps=20, lr=3e-3)
    mask = buf.mask
    ret_a = L.episode_sums(0.5 * jnp.tanh(buf.features[..., 0]) + 0.3 * (buf.actions == 1), mask)
    net = RN.RewardNet(2, (32, 32), 4)

    @partial(jax.jit, static_argnums=2)
    def refits(state, hp, n):
        return jax.lax.fori_loop(0, n, lambda i, s: signal.update(s, None, POLICY, hp, jax.random.PRNGKey(i))[0],
                                 state)

    fitted = refits(_with_returns(state, buf, ret_a), hp, 30)
    sums = jax.jit(lambda s: L.episode_sums(net.apply(s.params, buf.features, buf.actions)[0], mask))
    assert float(jnp.abs(sums(fitted) - ret_a).max()) < 0.05
    fitted = _with_returns(fitted.replace(anchor_params=fitted.params), buf, ret_a + 1.0)
    return types.SimpleNamespace(refits=refits, sums=sums, start=fitted, hp=hp)


def test_drift_penalty_binds_when_returns_jump(jumped):
    """Item 6: with the anchor an EMA over refits, the drift penalty holds R_phi back
    after the external returns jump (+1 per episode): over 10 refits the predicted
    returns move a third less with drift_weight = 1 than without. Measured against
    the start of each refit (drift_ema = 0, the old anchor) it would not bind."""
    j = jumped

    def moved(**kw):
        s = j.refits(j.start, j.hp.replace(**kw), 10)
        return float((j.sums(s) - j.sums(j.start)).mean())

    free = moved(drift_weight=0.0)
    held = moved(drift_weight=1.0, drift_ema=0.9)
    assert free > 0.95  # without drift the fit follows the jump
    assert held < 0.8 * free, (held, free)
    assert moved(drift_weight=1.0, drift_ema=0.0) > 0.99 * free  # the lagging anchor is what binds


def test_reward_step_is_a_ratio_of_the_annealed_policy_lr():
    """Issue 30 item 3: the refit's Adam step is reward_lr_ratio * lr * lr_frac, so
    R_phi's lr follows the policy's: from one state, the step at lr_frac = 0.25 is a
    quarter of that at 1, and lr 4e-3 at ratio 0.25 steps exactly like lr 1e-3 at ratio 1."""
    signal, state, buf, hp = _fitting_setup("coevo-regression", steps=1, lr=1e-3)
    state = _with_returns(state, buf, jnp.ones(buf.length.shape))

    @jax.jit
    def step(frac, hp):
        policy = PolicyView(None, None, None, jnp.float32(0.0), frac)
        new, metrics = signal.update(state, None, policy, hp, jax.random.PRNGKey(0))
        delta = jax.tree.map(lambda a, b: a - b, new.params, state.params)
        return jnp.concatenate([x.ravel() for x in jax.tree.leaves(delta)]), metrics["reward_step_size"]

    (d1, s1), (d4, s4) = step(jnp.float32(1.0), hp), step(jnp.float32(0.25), hp)
    assert float(s1) == pytest.approx(1e-3) and float(s4) == pytest.approx(0.25e-3)
    assert float(jnp.abs(d1).max()) > 1e-4
    np.testing.assert_allclose(np.asarray(d4), 0.25 * np.asarray(d1), rtol=1e-4, atol=3e-7)  # ulps of the params
    d_ratio, s_ratio = step(jnp.float32(1.0), hp.replace(lr=4e-3, reward_lr_ratio=0.25))
    assert float(s_ratio) == pytest.approx(1e-3)
    np.testing.assert_allclose(np.asarray(d_ratio), np.asarray(d1), rtol=1e-5, atol=3e-7)


def test_buffer_length_is_the_env_time_limit():
    """Issue 30 item 4: R_phi's buffer keeps every step of an episode up to the env's
    time limit by default (the regression target is the whole episode's return); a
    shorter explicit length is refused before anything compiles, naming both numbers."""
    env, p = envs_jax.make("KeyDoor-5x5")  # its default limit: 250 steps
    static = cj.static_config("coevo-regression", reward_hidden=(4,), action_embed_dim=2, buffer_episodes=4)
    signal = L.make_learned(static, None, env, p)
    example = collections.namedtuple("Example", "features action")(jnp.zeros((3, 2, 5)), jnp.zeros((3, 2), jnp.int32))
    state = jax.eval_shape(signal.init, jax.random.PRNGKey(0), example, cj.default_hparams("coevo-regression"))
    assert state.replay.train.steps["x"].shape == (4, 250, 5) and state.replay.segments.steps["x"].shape == (2, 250, 5)
    with pytest.raises(cj.ConfigError, match=r"^StaticConfig.max_episode_len=32 is shorter than the env's time limit"
                                             r" 250: .* None to keep all 250\)$"):
        cj.Trainer(static.replace(max_episode_len=32), env, p)
    _, p60 = envs_jax.make("KeyDoor-5x5", max_steps=60)
    assert L.make_learned(static.replace(max_episode_len=64), None, env, p60)  # longer than the limit: allowed


def test_default_replay_holds_two_rollouts_of_episodes():
    """A rollout must not push the rollout before it out of R_phi's replay: by default
    (``buffer_episodes=None``) the replay holds the episodes of two rollouts that run
    every episode to the time limit, at least 32; a given size is kept as given."""
    env, p = envs_jax.make("DelayedChain", length=16)  # 16-step episodes: 64-step rollouts of 16 envs finish 64
    static = cj.static_config("coevo-regression", reward_hidden=(4,), action_embed_dim=2, num_envs=16,
                              rollout_len=64)
    example = collections.namedtuple("Example", "features action")(jnp.zeros((3, 16, 5)), jnp.zeros((3, 16), jnp.int32))

    def rows(s):
        state = jax.eval_shape(L.make_learned(s, None, env, p).init, jax.random.PRNGKey(0), example,
                               cj.default_hparams("coevo-regression"))
        return state.replay.train.steps["x"].shape[0] + state.replay.val.steps["x"].shape[0]

    derived = ep.replay_episodes(None, 16, 64, env, p)
    assert derived == 2 * 16 * 4 and rows(static) == rows(static.replace(buffer_episodes=derived))
    assert rows(static.replace(buffer_episodes=8)) < rows(static)
    assert ep.replay_episodes(None, 8, 16, *envs_jax.make("KeyDoor-5x5", max_steps=60)) == 32  # the floor
    assert ep.replay_episodes(7, 16, 64, env, p) == 7
    with pytest.raises(cj.ConfigError, match=r"^StaticConfig.buffer_episodes=1 must be an integer in \[2, 65536\]"):
        cj.validate_static(static.replace(buffer_episodes=1))
