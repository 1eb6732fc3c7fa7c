"""The control reward sources (:mod:`coevo_jax.signals.placebo`): the shuffled
SIOP credit keeps every episode segment's values and total but loses their
timing; the constant reward shifts every step by exactly ``beta_int * c``."""

import jax
import numpy as np
import pytest

import coevo_jax as cj
from coevo_jax.signals import PolicyView, make_signal
from coevo_jax.signals.placebo import shuffle_within_episodes
from test_signal_contract import synthetic_trajectory, tiny_static
from xla_options import OPT0

OBS_SHAPE, NUM_ACTIONS = (5,), 4


def _segments(done_col):
    """Index arrays of the episode segments of one column."""
    ends = np.flatnonzero(done_col)
    return [s for s in np.split(np.arange(len(done_col)), ends + 1) if len(s)]


def _assert_permuted_within_segments(x, y, done):
    moved = 0
    for n in range(x.shape[1]):
        for seg in _segments(done[:, n]):
            np.testing.assert_allclose(np.sort(y[seg, n]), np.sort(x[seg, n]), rtol=1e-5, atol=1e-9)  # 1 ulp
            np.testing.assert_allclose(y[seg, n].sum(), x[seg, n].sum(), rtol=1e-6, atol=1e-6)
            moved += int(not np.allclose(y[seg, n], x[seg, n], rtol=0, atol=0))
    return moved


def test_shuffle_stays_inside_each_episode_segment_and_changes_the_order():
    rng = np.random.default_rng(0)
    T, N = 64, 8
    done = rng.random((T, N)) < 0.1
    x = rng.standard_normal((T, N)).astype(np.float32)
    fn = jax.jit(shuffle_within_episodes).lower(x, done, jax.random.PRNGKey(0)).compile(OPT0)
    y = np.asarray(fn(x, done, jax.random.PRNGKey(0)))
    moved = _assert_permuted_within_segments(x, y, done)
    long_segments = sum(len(s) >= 4 for n in range(N) for s in _segments(done[:, n]))
    assert moved >= long_segments > 0  # every segment of 4+ steps was reordered (identity: 1/24 each, at most)
    # a segment label that crossed a boundary would break the per-segment multisets above; a new key, a new order
    assert not np.array_equal(np.asarray(fn(x, done, jax.random.PRNGKey(1))), y)


@pytest.fixture(scope="module")
def traj():
    return synthetic_trajectory(3, OBS_SHAPE, NUM_ACTIONS, heads=1, hidden=8)


def _pass(method, traj, key, env=(None, None), **hp_overrides):
    static = tiny_static(method)
    signal = make_signal(static, None, *env)
    hp = cj.default_hparams(method, **hp_overrides)

    def run(key, traj, hp):
        k0, k1, k2 = jax.random.split(key, 3)
        s = signal.init(k0, traj, hp)
        s, _ = signal.observe(s, traj, hp, k1)
        s, _ = signal.update(s, traj, PolicyView(None, None, None, hp.ppo.lr), hp, k2)
        return s, signal.rewards(s, traj, hp)

    return jax.jit(run).lower(key, traj, hp).compile(OPT0)(key, traj, hp)


def test_siop_shuffled_trains_siop_s_potential_and_pays_its_credit_in_random_order(traj):
    key = jax.random.PRNGKey(4)
    state, (_, placebo, _) = _pass("siop-shuffled", traj, key, beta_ext=0.0)  # credit alone
    # siop's own rewards from the very potential the placebo trained
    siop = make_signal(tiny_static("siop"), None, None, None)
    hp = cj.default_hparams("siop", beta_ext=0.0)
    _, honest, _ = jax.jit(siop.rewards)(state.inner, traj, hp)
    credit, shuffled = np.asarray(honest.episodic), np.asarray(placebo.episodic)
    assert np.abs(credit).max() > 1e-4  # a trained potential pays some credit
    done = np.asarray(traj.terminated | traj.truncated)
    assert _assert_permuted_within_segments(credit, shuffled, done) > 0


def test_coevo_shuffled_keeps_each_episodes_multiset_of_r_phi_and_loses_its_timing():
    """The control for "R_phi helps by its size or its episode sums, not by where it puts them":
    every episode segment pays exactly the rewards R_phi gives it, in a random order."""
    import envs_jax

    env = envs_jax.make("KeyDoor-5x5", max_steps=6)  # within the buffers' episode length
    traj = synthetic_trajectory(3, env[0].observation_space(env[1]).shape, env[0].action_space(env[1]).n, heads=1,
                                hidden=8)
    key = jax.random.PRNGKey(5)
    state, (_, placebo, _) = _pass("coevo-shuffled", traj, key, env, beta_ext=0.0, beta_int=3.0)
    reg = make_signal(tiny_static("coevo-regression"), None, *env)
    hp = cj.default_hparams("coevo-regression", beta_ext=0.0, beta_int=3.0)
    _, honest, _ = jax.jit(reg.rewards)(state.inner, traj, hp)
    r_phi, shuffled = np.asarray(honest.episodic), np.asarray(placebo.episodic)
    assert np.abs(r_phi).std() > 0  # R_phi pays different rewards at different steps
    done = np.asarray(traj.terminated | traj.truncated)
    assert _assert_permuted_within_segments(r_phi, shuffled, done) > 0
    # the external reward is added back unshuffled
    _, (_, mixed, _) = _pass("coevo-shuffled", traj, key, env, beta_ext=1.0, beta_int=3.0)
    np.testing.assert_allclose(np.asarray(mixed.episodic) - np.asarray(traj.reward), shuffled, atol=1e-6)


@pytest.mark.parametrize("c", [0.02, -0.05])
def test_constant_reward_shifts_every_step_by_beta_int_times_c(traj, c):
    _, (_, streams, _) = _pass("constant", traj, jax.random.PRNGKey(0), constant_reward=c, beta_int=0.5)
    assert streams.intrinsic is None
    np.testing.assert_allclose(np.asarray(streams.episodic), np.asarray(traj.reward) + 0.5 * c, rtol=0, atol=1e-7)


def test_constant_reward_out_of_range_is_a_config_error_naming_the_field():
    with pytest.raises(cj.ConfigError, match="constant_reward"):
        cj.validate_hparams(cj.default_hparams("constant", constant_reward=float("inf")))


def test_cue_bonus_pays_only_for_the_cue_and_only_where_it_says():
    """On DelayedChain's own observations: every step whose action equals the cue earns beta_int, or with
    cue_after_choice = 1 only the steps after the choice (the first step of an episode earns nothing)."""
    import envs_jax

    env, params = envs_jax.make("DelayedChain", length=4, noise_std=0.0)
    T, N = 12, 6
    rng = np.random.default_rng(0)
    actions = rng.integers(0, env.num_actions, (T, N)).astype(np.int32)
    keys = jax.random.split(jax.random.PRNGKey(0), N)
    _, state = jax.vmap(env.reset, (0, None))(keys, params)
    obs_t = []
    for t in range(T):
        obs, state, _, _, _ = jax.vmap(env.step, (0, 0, 0, None))(jax.random.split(jax.random.PRNGKey(t), N), state,
                                                                    actions[t], params)[:5]
        obs_t.append(obs)
    # the observation each action was taken at: the reset one, then each step's (auto-reset at the chain's end)
    first = jax.vmap(env.reset, (0, None))(keys, params)[0]
    obs = np.stack([np.asarray(first)] + [np.asarray(o) for o in obs_t[:-1]])
    traj = synthetic_trajectory(3, obs.shape[2:], env.num_actions, heads=1, hidden=8)._replace(
        obs=jax.numpy.asarray(obs), action=jax.numpy.asarray(actions), reward=jax.numpy.zeros((T, N)))
    k = env.num_actions
    cue, elapsed = obs[..., :k].argmax(-1), obs[..., -1]
    match = (actions == cue)
    assert match.any() and (~match).any() and (elapsed == 0).any() and (elapsed > 0).any()
    for after, where in ((0.0, match), (1.0, match & (elapsed > 0))):
        static = tiny_static("cue-bonus")
        signal = make_signal(static, None, env, params)
        hp = cj.default_hparams("cue-bonus", beta_int=0.3, cue_after_choice=after)
        _, streams, _ = jax.jit(signal.rewards)((), traj, hp)
        np.testing.assert_allclose(np.asarray(streams.episodic), 0.3 * where, atol=1e-7)
    with pytest.raises(cj.ConfigError, match="'KeyDoor-5x5' shows no cue"):
        make_signal(tiny_static("cue-bonus"), None, *envs_jax.make("KeyDoor-5x5"))
