"""Reward construction shared by every method: scale-only normalisation, the
non-episodic intrinsic stream with its own critic head, the dense oracle's
declared capability, and ICM's per-iteration training."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import coevo_jax as cj
import envs_jax
from coevo_jax.ppo import stream_advantages
from coevo_jax.rollout import Trajectory
from coevo_jax.signals import base
from coevo_jax.signals import icm as icm_mod
from xla_options import OPT0

jit0 = functools.partial(jax.jit, compiler_options=OPT0)  # semantic checks: compile fast


def traj_of(reward, terminated, truncated, value, next_value, obs=None, next_obs=None, action=None, cont_value=None):
    """A Trajectory with the given ``[T, N]`` fields (values ``[T, N, V]``); the rest zeros
    (``cont_value`` defaults to ``next_value``)."""
    T, N = reward.shape
    z = jnp.zeros((T, N), jnp.float32)
    obs = jnp.zeros((T, N, 3)) if obs is None else obs
    return Trajectory(
        obs=obs, action=jnp.zeros((T, N), jnp.int32) if action is None else action, logp=z, value=value,
        features=jnp.zeros((T, N, 2)), reward=reward, dense_reward=reward, terminated=terminated, truncated=truncated,
        next_obs=obs if next_obs is None else next_obs, next_value=next_value,
        episode_done=terminated | truncated, episode_return=z, episode_length=z, episode_success=z,
        cont_value=next_value if cont_value is None else cont_value)


def random_ends(key, shape, p_term=0.1, p_trunc=0.05):
    u = jax.random.uniform(key, shape)
    return u < p_term, (u >= p_term) & (u < p_term + p_trunc)


# ----------------------------------------------------------------------------- normalisation never shifts
@pytest.mark.parametrize("episodic", [True, False])
def test_scale_normalise_only_scales(episodic):
    """Adding a constant to every reward of a batch changes the output by a scale
    only: out(r + c) = s * (r + c) for one positive s, however many batches came before."""
    key = jax.random.PRNGKey(0)
    r = jax.random.normal(key, (32, 8)) * 0.3 + 0.1
    term, trunc = random_ends(jax.random.PRNGKey(1), r.shape)
    done = (term | trunc) if episodic else None
    scale = base.init_return_scale(8)
    for i in range(3):  # some history
        scale, _ = base.scale_normalise(scale, r * (i + 1), 0.99, 1.0, done)
    for c in (0.0, 5.0, -2.0):
        _, out = base.scale_normalise(scale, r + c, 0.99, 1.0, done)
        ratio = np.asarray(out) / np.asarray(r + c)
        np.testing.assert_allclose(ratio, ratio.flat[0], rtol=1e-5)
        assert ratio.flat[0] > 0
    # off: the identity (statistics still kept)
    s_off, out = base.scale_normalise(scale, r, 0.99, 0.0, done)
    np.testing.assert_array_equal(out, r)
    assert float(s_off.count) > float(scale.count)


def test_return_scale_tracks_the_discounted_return_rms():
    """The running std is that of the discounted returns of all batches seen
    (checked against numpy on the concatenated returns)."""
    rng = np.random.default_rng(0)
    gamma, scale, rets = 0.9, base.init_return_scale(4), []
    run = np.zeros(4)
    for _ in range(3):
        r = rng.normal(0.5, 1.0, size=(10, 4)).astype(np.float32)
        scale = base.update_return_scale(scale, jnp.asarray(r), gamma)
        for t in range(10):
            run = gamma * run + r[t]
            rets.append(run.copy())
    rets = np.concatenate(rets)
    np.testing.assert_allclose(float(base.return_rms(scale)), np.sqrt(np.mean(rets**2)), rtol=1e-4)
    assert abs(np.sqrt(np.mean(rets**2)) - np.std(rets)) > 0.1  # the mean counts: not the std


# ----------------------------------------------------------------------------- the intrinsic stream
def test_constant_bonus_has_zero_intrinsic_advantage():
    """External reward 0, a constant bonus c > 0 with the intrinsic critic at its
    fixed point c / (1 - gamma) on every state the env continues from: the
    advantage is 0 on every step, episode ends included, whatever the head says
    of the final observations (it never trains on them; here 0). Paid into the
    episodic stream instead, the same bonus makes ending an episode costly (a
    living reward)."""
    T, N, c, gamma = 64, 6, 0.3, 0.99
    term, trunc = random_ends(jax.random.PRNGKey(2), (T, N), 0.1, 0.05)
    assert bool(term.any()) and bool(trunc.any())
    hp = cj.default_hparams("icm", gamma=gamma, gae_lambda=0.95)
    v_int = jnp.full((T, N), c / (1 - gamma))
    value = jnp.stack([jnp.zeros((T, N)), v_int], -1)
    final = jnp.stack([jnp.zeros((T, N)), jnp.where(term | trunc, 0.0, v_int)], -1)  # V_int(next_obs)
    traj = traj_of(jnp.zeros((T, N)), term, trunc, value, final, cont_value=value)
    bonus = jnp.full((T, N), c)
    adv, targets = stream_advantages(base.RewardStreams(jnp.zeros((T, N)), bonus), traj, hp)
    np.testing.assert_allclose(adv, 0.0, atol=1e-4)
    assert targets.shape == (T, N, 2)
    # the same bonus in the episodic stream, with the episodic critic at its own fixed point
    one = traj_of(jnp.zeros((T, N)), term, trunc, v_int[..., None], v_int[..., None])
    adv_ep, _ = stream_advantages(base.RewardStreams(bonus), one, hp)
    assert float(jnp.abs(adv_ep[term]).min()) > 1.0  # terminating forfeits the bonus's future


def test_two_streams_add_and_one_stream_is_plain_gae():
    T, N = 16, 3
    key = jax.random.PRNGKey(3)
    r_e, r_i, v, nv = jax.random.normal(key, (4, T, N, 2))
    term, trunc = random_ends(jax.random.PRNGKey(4), (T, N))
    hp = cj.default_hparams("icm")
    traj = traj_of(r_e[..., 0], term, trunc, v, nv)
    adv, tgt = stream_advantages(base.RewardStreams(r_e[..., 0], r_i[..., 0]), traj, hp)
    a_e, t_e = cj.gae(r_e[..., 0], v[..., 0], nv[..., 0], term, trunc, hp.ppo.gamma, hp.ppo.gae_lambda)
    never = jnp.zeros_like(term)
    a_i, t_i = cj.gae(r_i[..., 0], v[..., 1], nv[..., 1], never, never, hp.ppo.gamma, hp.ppo.gae_lambda)
    np.testing.assert_allclose(adv, a_e + a_i, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tgt, np.stack([t_e, t_i], -1), rtol=1e-5, atol=1e-6)
    # the coefficient weighs the intrinsic advantage; at 0 the update is exactly the extrinsic one
    adv3, _ = stream_advantages(base.RewardStreams(r_e[..., 0], r_i[..., 0], 0.3), traj, hp)
    np.testing.assert_allclose(adv3, a_e + 0.3 * a_i, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(stream_advantages(base.RewardStreams(r_e[..., 0], r_i[..., 0], 0.0), traj, hp)[0],
                                  a_e)
    one = traj_of(r_e[..., 0], term, trunc, v[..., :1], nv[..., :1])
    adv1, tgt1 = stream_advantages(base.RewardStreams(r_e[..., 0]), one, hp)
    np.testing.assert_array_equal(adv1, a_e)
    np.testing.assert_array_equal(tgt1, t_e[..., None])  # targets keep the heads axis, [T, N, 1]
    with pytest.raises(ValueError, match="two value heads"):
        stream_advantages(base.RewardStreams(r_e[..., 0], r_i[..., 0]), one, hp)
    with pytest.raises(ValueError, match="one stream needs one value head"):
        stream_advantages(base.RewardStreams(r_e[..., 0]), traj, hp)


def test_intrinsic_return_runs_into_the_next_episode():
    """The non-episodic return is ``G_t = r_t + gamma * G_{t+1}`` through episode
    ends, ``G_{t+1}`` from the state the env continues from (after an end: the
    next episode's first observation). With lambda = 1 the intrinsic value
    target is exactly the discounted bonus to the rollout's end plus
    ``gamma^(T - t) V_int(s_T)``, whatever the critic says elsewhere, and
    nothing depends on ``V_int(final_obs)`` (``next_value``'s second head),
    which the head never trains on. The episodic stream still bootstraps a
    time-out from ``V_ext(final_obs)``."""
    T, N, gamma = 24, 5, 0.9
    k = jax.random.split(jax.random.PRNGKey(7), 4)
    term, trunc = random_ends(k[0], (T, N), 0.15, 0.1)
    assert bool(term.any()) and bool(trunc.any())
    bonus = jax.random.uniform(k[1], (T, N))
    value = jax.random.normal(k[2], (T, N, 2))
    last = jax.random.normal(k[3], (N, 2))  # the critic on the next rollout's first observation
    cont = jnp.concatenate([value[1:], last[None]], 0)
    hp = cj.default_hparams("icm", gamma=gamma, gae_lambda=1.0)

    def targets(next_value):
        traj = traj_of(jnp.zeros((T, N)), term, trunc, value, next_value, cont_value=cont)
        return np.asarray(stream_advantages(base.RewardStreams(jnp.zeros((T, N)), bonus), traj, hp)[1])

    garbage = 100.0 * jax.random.normal(k[0], (T, N, 2))  # V(final_obs) on done steps, anything
    tgt = targets(jnp.where((term | trunc)[..., None], garbage, cont))
    g, expected = np.asarray(last[:, 1], np.float64), np.zeros((T, N))
    for t in reversed(range(T)):
        g = np.asarray(bonus[t], np.float64) + gamma * g
        expected[t] = g
    np.testing.assert_allclose(tgt[..., 1], expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(targets(cont)[..., 1], tgt[..., 1], rtol=1e-5, atol=1e-5)
    # the episodic head: a time-out bootstraps from V_ext(final_obs), a termination from nothing
    assert not np.allclose(targets(cont)[..., 0], tgt[..., 0])
    with pytest.raises(ValueError, match="cont_value"):
        stream_advantages(base.RewardStreams(bonus, bonus), traj_of(bonus, term, trunc, value, value)._replace(
            cont_value=None), hp)


# ----------------------------------------------------------------------------- bonus first, then train
def _bonus_setup(method):
    """``(signal, traj, hp)`` for ICM (KeyDoor observations) or coevo-novelty (policy features)."""
    env, p = envs_jax.make("KeyDoor-5x5", max_steps=4)  # R_phi's buffer keeps whole episodes: 4 steps
    T, N = 8, 4
    key = jax.random.PRNGKey(5)
    obs = jax.random.bernoulli(key, 0.3, (T, N) + env.observation_space(p).shape).astype(jnp.float32)
    action = jax.random.randint(key, (T, N), 0, 6)
    z = jnp.zeros((T, N, 2))
    traj = traj_of(jnp.zeros((T, N)), jnp.zeros((T, N), bool), jnp.zeros((T, N), bool), z, z, obs,
                   jnp.roll(obs, -1, 0), action)._replace(features=jax.random.normal(key, (T, N, 8)))
    own = {"icm": dict(icm_feature_dim=8), "coevo-novelty": dict(reward_hidden=(16, 16), action_embed_dim=4,
                                                                  buffer_episodes=2)}[method]
    static = cj.static_config(method, hidden_sizes=(16,), num_envs=N, rollout_len=T, num_minibatches=4, **own)
    ratio = {"icm": "icm_lr_ratio", "coevo-novelty": "rnd_lr_ratio"}[method]
    hp = cj.default_hparams(method, **{ratio: 12.0}, normalize_int=0.0)  # 3e-3 at lr 2.5e-4
    from coevo_jax.signals import make_signal
    return make_signal(static, None, env, p), traj, hp


@pytest.mark.parametrize("method", ["icm", "coevo-novelty"])
def test_bonus_is_read_before_the_model_trains_on_the_rollout(method):
    """ICM's and RND's bonus of a rollout is the error of the model *before*
    ``observe`` trained it on that rollout (as at collection time in Pathak et
    al. and Burda et al.): the same as the untrained model's bonus on the first
    rollout, not the bonus of the model that has just fit these transitions
    (for RND, whose predictor fits the error itself, a smaller one)."""
    sig, traj, hp = _bonus_setup(method)

    @jit0
    def run(key):
        s0 = sig.init(key, traj, hp)
        s1, _ = sig.observe(s0, traj, hp, jax.random.fold_in(key, 1))
        before = sig.rewards(s0, traj, hp)[1].intrinsic  # the model that collected the rollout
        used = sig.rewards(s1, traj, hp)[1].intrinsic  # what PPO gets after observe
        # the model as it is after training on the rollout
        post = s1._replace(bonus_params=s1.params) if method == "icm" else s1.replace(rnd_bonus_params=s1.rnd_params)
        return before, used, sig.rewards(post, traj, hp)[1].intrinsic

    before, used, after = run(jax.random.PRNGKey(0))
    np.testing.assert_allclose(used, before, rtol=1e-6)
    assert np.abs(np.asarray(after - before)).max() > 1e-3 * float(before.max())  # the order matters
    if method == "coevo-novelty":
        assert float(after.mean()) < 0.9 * float(before.mean())  # the fitted predictor shrinks the bonus


@pytest.mark.parametrize("method,heads", [("ppo", 1), ("siop", 1), ("icm", 2), ("coevo-novelty", 2), ("meta", 2)])
def test_policy_has_a_critic_head_per_stream(method, heads):
    env, p = envs_jax.make("KeyDoor-5x5")
    static = cj.StaticConfig(method=method, hidden_sizes=(8,))
    net = cj.make_policy_network(static, env, p)
    obs = jnp.zeros((5,) + env.observation_space(p).shape)
    _, value, _ = jax.eval_shape(lambda o: net.apply(net.init(jax.random.PRNGKey(0), o), o), obs)
    assert value.shape == (5, heads)


# ----------------------------------------------------------------------------- the dense oracle
def test_dense_on_an_env_without_a_dense_reward_is_a_config_error():
    env, p = envs_jax.make("CartPole-v1")
    with pytest.raises(cj.ConfigError, match="CartPole-v1.*no dense reward"):
        cj.Trainer(cj.StaticConfig(method="dense"), env, p)
    env, p = envs_jax.make("KeyDoor-5x5")
    cj.Trainer(cj.StaticConfig(method="dense"), env, p)  # declared: fine


def test_ppo_and_dense_share_one_program_and_read_their_reward_exactly():
    """One jitted ``rewards`` (``hp.signal.dense_weight`` traced) gives ppo ``traj.reward`` and dense
    ``traj.dense_reward``, bit for bit; a weight between mixes them."""
    from coevo_jax.signals.external import make_external

    k1, k2 = jax.random.split(jax.random.PRNGKey(3))
    reward = jax.random.normal(k1, (16, 4)) * 1e-3
    dense = reward + jax.random.normal(k2, (16, 4))
    traj = traj_of(reward, *random_ends(k2, (16, 4)), jnp.zeros((16, 4, 1)), jnp.zeros((16, 4, 1)))
    traj = traj._replace(dense_reward=dense)
    signal = make_external(cj.StaticConfig(), None, None, None)
    rewards = jax.jit(lambda hp: signal.rewards((), traj, hp)[1].episodic)
    np.testing.assert_array_equal(rewards(cj.default_hparams("ppo")), reward)
    np.testing.assert_array_equal(rewards(cj.default_hparams("dense")), dense)
    np.testing.assert_allclose(rewards(cj.default_hparams("ppo", dense_weight=0.25)), 0.75 * reward + 0.25 * dense,
                               rtol=1e-6, atol=1e-7)
    assert rewards._cache_size() == 1


# ----------------------------------------------------------------------------- ICM trains every iteration
def test_icm_trains_in_observe_and_pays_a_separate_stream():
    env, p = envs_jax.make("KeyDoor-5x5")
    static = cj.static_config("icm", hidden_sizes=(16,), icm_feature_dim=8, num_envs=4, rollout_len=8,
                              num_minibatches=2)
    sig = icm_mod.make_icm(static, None, env, p)
    T, N = 8, 4
    key = jax.random.PRNGKey(5)
    obs = jax.random.bernoulli(key, 0.3, (T, N) + env.observation_space(p).shape).astype(jnp.float32)
    action = jax.random.randint(key, (T, N), 0, 6)
    term, trunc = random_ends(jax.random.PRNGKey(6), (T, N))
    z = jnp.zeros((T, N, 2))
    traj = traj_of(jnp.zeros((T, N)), term, trunc, z, z, obs, jnp.roll(obs, -1, 0), action)
    hp = cj.default_hparams("icm", icm_lr_ratio=12.0, beta_int=0.5, normalize_int=0.0)
    state = sig.init(jax.random.PRNGKey(0), traj, hp)
    observe = jax.jit(sig.observe)
    s1, m = observe(state, traj, hp, jax.random.PRNGKey(1))
    assert any(float(jnp.abs(a - b).max()) > 0 for a, b in zip(jax.tree.leaves(s1.params),
                                                                 jax.tree.leaves(state.params)))
    for k in jax.random.split(jax.random.PRNGKey(2), 20):
        s1, m2 = observe(s1, traj, hp, k)
    assert float(m2["icm_loss"]) < float(m["icm_loss"])
    # update (the K-gated refit) has nothing left to do
    s2, _ = sig.update(s1, traj, None, hp, jax.random.PRNGKey(3))
    jax.tree.map(np.testing.assert_array_equal, s2.params, s1.params)
    # rewards: the external reward in the episodic stream, the bonus in the intrinsic one (advantage weight beta_int)
    _, streams, _ = sig.rewards(s1, traj, hp)
    assert float(streams.intrinsic_coef) == pytest.approx(0.5)
    net = icm_mod.ICMNetwork(6, 8, (16,))
    _, phi_tp1, _, phi_pred = net.apply(s1.bonus_params, traj.obs, traj.next_obs, traj.action)
    np.testing.assert_allclose(streams.intrinsic, icm_mod.intrinsic_reward(phi_pred, phi_tp1, hp.signal.icm_eta),
                               rtol=1e-5, atol=1e-8)
    np.testing.assert_array_equal(streams.episodic, traj.reward)
