"""IRCR (coevo_jax/signals/ircr.py): the min-max normalised targets, the fitted
guidance reward of a state is the mean normalised return of the episodes it
occurs in (so states of higher-return episodes get more), invariance to a
shift or a positive scale of every return, and how it enters the streams."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import coevo_jax as cj
import envs_jax
from coevo_jax.signals import PolicyView
from coevo_jax.signals import ircr
from test_potential import fake_traj
from xla_options import OPT0

RETURNS = np.array([1.0, 0.0, 0.25], np.float32)  # per env: the return of each of its episodes
#: the fitted guidance reward of the start state S (every episode) and of each env's own state
WANT_S = (2 * 1.0 + 2 * 0.0 + 2 * 0.25) / 6
WANT_OWN = RETURNS  # already min-max normalised: min 0, max 1


def test_minmax_normalise_by_hand():
    ret = jnp.array([2.0, 5.0, 3.0, 99.0])
    valid = jnp.array([True, True, True, False])
    np.testing.assert_allclose(ircr.minmax_normalise(ret, valid), [0.0, 1.0, 1.0 / 3.0, 0.0], rtol=1e-6)
    # a shift and a positive scale of every return change nothing
    np.testing.assert_allclose(ircr.minmax_normalise(3.0 * ret - 7.0, valid), [0.0, 1.0, 1.0 / 3.0, 0.0],
                               rtol=1e-6, atol=1e-7)
    # no spread (every return equal, or no valid episode): every target 0
    np.testing.assert_array_equal(ircr.minmax_normalise(jnp.array([0.5, 0.5, 9.0]), jnp.array([1, 1, 0], bool)),
                                  0.0)
    np.testing.assert_array_equal(ircr.minmax_normalise(ret, jnp.zeros(4, bool)), 0.0)


def test_guidance_loss_and_episode_means_by_hand():
    g = jnp.array([[0.5, 1.0, 7.0], [0.0, 0.2, 0.4]])
    mask = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    target = jnp.array([1.0, 0.0])
    # errors 0.25, 0, (padding), 0, 0.04, 0.16 over 5 stored steps
    assert float(ircr.guidance_loss(g, target, mask)) == pytest.approx(0.45 / 5, rel=1e-6)
    np.testing.assert_allclose(ircr.episode_means(g, mask), [0.75, 0.2], rtol=1e-6)


def episodes_traj(returns):
    """``[T=8, N=3]``: each env runs two 4-step episodes, start state S (obs
    index 0), then its own state (index 1 + env) three times, terminated with
    reward ``returns[env]`` (KeyDoor-5x5's observation width, one-hot)."""
    T, N, D = 8, 3, 155
    t, n = np.meshgrid(np.arange(T), np.arange(N), indexing="ij")
    s = np.where(t % 4 == 0, 0, 1 + n)
    nxt = np.where(t % 4 == 3, 4, 1 + n)
    term = jnp.asarray(t % 4 == 3)
    eye = jnp.eye(D, dtype=jnp.float32)
    reward = jnp.where(term, returns[None, :], 0.0)
    return fake_traj(eye[s], eye[nxt], reward, term, episode_return=reward), s


@pytest.fixture(scope="module")
def fitted():
    """``fit(returns, hp) -> (r_g [T, N], update metrics, streams)``: one compiled
    init -> observe -> update (1000 full-batch steps) -> rewards, tabular network."""
    env, p = envs_jax.make("KeyDoor-5x5", max_steps=4)  # the buffer keeps whole episodes: 4 steps
    static = cj.static_config("ircr", reward_input="obs", reward_hidden=(), reward_steps=1000,
                              buffer_episodes=8, num_envs=3, rollout_len=8, num_minibatches=1)
    sig = ircr.make_ircr(static, None, env, p)

    def run(returns, hp):
        traj, _ = episodes_traj(returns)
        state = sig.init(jax.random.PRNGKey(0), traj, hp)
        state, _ = sig.observe(state, traj, hp, None)
        policy = PolicyView(None, None, None, hp.ppo.lr, 1.0)
        state, metrics = sig.update(state, traj, policy, hp, jax.random.PRNGKey(1))
        _, streams, _ = sig.rewards(state, traj, hp)
        guidance = sig.rewards(state, traj, hp.replace(beta_ext=0.0, beta_int=1.0))[1].episodic
        return guidance, metrics, streams

    hp = cj.default_hparams("ircr", lr=1e-2, ircr_lr_ratio=1.0, reward_max_grad_norm=100.0)
    compiled = jax.jit(run).lower(jnp.asarray(RETURNS), hp).compile(OPT0)
    return lambda returns, **kw: compiled(jnp.asarray(returns, jnp.float32), hp.replace(**kw))


def test_fit_gives_each_state_the_mean_normalised_return_of_its_episodes(fitted):
    g, metrics, streams = fitted(RETURNS)
    _, s = episodes_traj(RETURNS)
    g = np.asarray(g)
    np.testing.assert_allclose(g[s == 0], WANT_S, atol=2e-3)  # S: in every episode
    for env in range(3):
        np.testing.assert_allclose(g[s == 1 + env], WANT_OWN[env], atol=2e-3)
    # states of higher-return episodes get a higher guidance reward
    assert g[s == 1].min() > g[s == 3].max() > g[s == 2].max()
    assert float(metrics["buffer_size"]) == 6.0
    # the loss left is the spread of S's targets alone (6 of the 24 stored steps)
    s_targets = np.repeat(RETURNS, 2)
    assert float(metrics["ircr_loss"]) == pytest.approx(s_targets.var() * 6 / 24, rel=1e-3)
    assert float(metrics["ircr_first_loss"]) > 5 * float(metrics["ircr_loss"])
    assert float(metrics["buffer_corr"]) > 0.99
    assert float(metrics["buffer_return_min"]) == 0.0 and float(metrics["buffer_return_max"]) == 1.0
    # the default replaces the external reward (beta_ext 0, beta_int 1)
    np.testing.assert_array_equal(np.asarray(streams.episodic), g)
    assert streams.intrinsic is None


def test_guidance_is_invariant_to_a_shift_and_scale_of_every_return(fitted):
    g = np.asarray(fitted(RETURNS)[0])
    np.testing.assert_allclose(np.asarray(fitted(RETURNS + 3.0)[0]), g, atol=1e-5)
    np.testing.assert_allclose(np.asarray(fitted(2.5 * RETURNS - 1.0)[0]), g, atol=1e-5)
    # every return equal: every target 0, so the fit drives the guidance to 0
    np.testing.assert_allclose(np.asarray(fitted(np.full(3, 0.7, np.float32))[0]), 0.0, atol=2e-3)


def test_streams_mix_and_off_is_the_external_reward(fitted):
    traj, _ = episodes_traj(RETURNS)
    g, _, streams = fitted(RETURNS, beta_ext=0.5, beta_int=2.0)
    np.testing.assert_allclose(np.asarray(streams.episodic), 0.5 * np.asarray(traj.reward) + 2.0 * np.asarray(g),
                               rtol=1e-6)
    _, _, off = fitted(RETURNS, **cj.method_spec("ircr").off)
    np.testing.assert_array_equal(np.asarray(off.episodic), np.asarray(traj.reward))


def test_no_refit_without_enough_complete_episodes(fitted):
    """The buffer holds 6 complete episodes: with ``min_refit_episodes = 7`` the refit takes no step."""
    g, metrics, _ = fitted(RETURNS, min_refit_episodes=7.0)
    assert float(metrics["refit_steps"]) == 0.0 and float(metrics["ircr_loss"]) == 0.0
    assert float(metrics["buffer_size"]) == 6.0
    assert float(fitted(RETURNS)[1]["refit_steps"]) == 1000.0
    assert np.abs(np.asarray(g) - WANT_S).max() > 0.05  # unfitted


def test_ircr_hyperparameters_are_validated():
    spec = cj.method_spec("ircr")
    assert spec.declarations()["ircr_lr_ratio"].default == 4.0 and not spec.intrinsic_stream
    assert cj.default_hparams("ircr").signal.beta_ext == 0.0
    with pytest.raises(cj.ConfigError, match="ircr_lr_ratio"):
        cj.validate_hparams(cj.default_hparams("ircr", ircr_lr_ratio=-1.0))
