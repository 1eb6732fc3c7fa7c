"""``siop-critic`` (coevo_jax/signals/critic_shaping.py): SIOP's credit with
PPO's own critic as the potential telescopes per episode, is zero for a zero
critic, reads the episodic head, and turns PPO's TD error into one with the
critic counted ``1 + beta_int`` times. SIOP's outcome target
(``hp.signal.potential_outcome``, coevo_jax/signals/potential.py): the fit's reward
is the final reward of terminated episodes only, and the tabular potential
converges to the discounted outcome to go."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import coevo_jax as cj
from coevo_jax import episodes as ep
from coevo_jax.ppo import gae, stream_advantages
from coevo_jax.signals import critic_shaping as cs
from coevo_jax.signals import potential as pot
from test_potential import GAMMA, POLICY, chain_rollouts, fake_traj, return_to_go, segments
from xla_options import OPT0


def critic_traj(seed, T=12, N=3, heads=1):
    """Random episodes (terminations and time-outs) with critic values that are
    consistent along each episode: ``next_value[t] == value[t+1]`` unless the
    episode ends at t (then ``V(final_obs)``, a value of its own). Numpy: nothing to compile."""
    rng = np.random.default_rng(seed)
    ends = rng.random((T, N)) < 0.25
    term = ends & (rng.random((T, N)) < 0.5)
    v = rng.standard_normal((T + 1, N, heads)).astype(np.float32)  # values [T, N, V]
    v_final = rng.standard_normal((T, N, heads)).astype(np.float32)
    done = ends[..., None]
    obs = np.zeros((T, N, 1), np.float32)
    traj = fake_traj(obs, obs, jnp.asarray(rng.standard_normal((T, N)), jnp.float32), jnp.asarray(term),
                     jnp.asarray(ends & ~term))
    return traj._replace(value=jnp.asarray(v[:T]), next_value=jnp.asarray(np.where(done, v_final, v[1:])))


SIGNAL = cs.make_critic_shaping(cj.StaticConfig(method="siop-critic"))


@jax.jit
def _credit(traj, hp):
    return SIGNAL.rewards(SIGNAL.init(None, traj, hp), traj, hp)[1].episodic


def credit_of(traj, **kw):
    """``siop-critic``'s credit ``[T, N]`` (its episodic stream with beta_ext 0, beta_int 1)."""
    return _credit(traj, cj.default_hparams("siop-critic", beta_ext=0.0, beta_int=1.0, **kw))


@pytest.mark.parametrize("seed", [0, 1])
def test_credit_telescopes_per_episode(seed):
    """Over every episode segment of the rollout, ``sum_t gamma^t F_t = gamma^n
    V(s_n) - V(s_0)``, ``V(s_n) = 0`` when it terminated, ``V(final_obs)`` when
    it timed out or runs past the rollout."""
    traj = critic_traj(seed)
    gamma = 0.9
    credit = np.asarray(credit_of(traj, gamma=gamma))
    done = np.asarray(jnp.logical_or(traj.terminated, traj.truncated))
    v, v_next = np.asarray(traj.value[..., 0]), np.asarray(traj.next_value[..., 0])  # the one head
    term = np.asarray(traj.terminated)
    checked = {"terminated": 0, "other": 0}
    for n in range(done.shape[1]):
        for start, stop in segments(done[:, n]):
            disc = gamma ** np.arange(stop - start)
            end = 0.0 if term[stop - 1, n] else v_next[stop - 1, n]
            want = gamma ** (stop - start) * end - v[start, n]
            np.testing.assert_allclose((disc * credit[start:stop, n]).sum(), want, rtol=1e-5, atol=1e-5)
            checked["terminated" if term[stop - 1, n] else "other"] += 1
    assert checked["terminated"] > 0 and checked["other"] > 0


def test_zero_or_constant_critic():
    traj = critic_traj(2)
    zero = traj._replace(value=jnp.zeros_like(traj.value), next_value=jnp.zeros_like(traj.next_value))
    np.testing.assert_array_equal(np.asarray(credit_of(zero)), 0.0)
    # gamma = 1, V = c everywhere: no credit but -c where an episode terminates
    const = traj._replace(value=jnp.full_like(traj.value, 2.0), next_value=jnp.full_like(traj.next_value, 2.0))
    want = np.where(np.asarray(traj.terminated), -2.0, 0.0)
    np.testing.assert_allclose(np.asarray(credit_of(const, gamma=1.0)), want, atol=1e-6)


def test_reads_the_episodic_head_of_two():
    two = critic_traj(3, heads=2)
    one = two._replace(value=two.value[..., :1], next_value=two.next_value[..., :1])
    np.testing.assert_array_equal(np.asarray(credit_of(two)), np.asarray(credit_of(one)))
    swapped = two._replace(value=two.value[..., ::-1], next_value=two.next_value[..., ::-1])
    assert not np.allclose(np.asarray(credit_of(swapped)), np.asarray(credit_of(two)))  # head 1 would differ


@pytest.mark.parametrize("beta_int", [1.0, 0.5])
def test_advantages_are_ppos_with_the_critic_counted_one_plus_beta_times(beta_int):
    """With ``n = 1`` the GAE of ``r + beta_int F`` under critic ``V`` is the GAE of
    ``r`` under ``(1 + beta_int) V`` (module docstring)."""
    traj = critic_traj(4)
    hp = cj.default_hparams("siop-critic", beta_int=beta_int, gamma=0.95, gae_lambda=0.8)

    @jax.jit
    def both(traj, hp):
        adv, _ = stream_advantages(SIGNAL.rewards((), traj, hp)[1], traj, hp)
        c = 1.0 + hp.signal.beta_int
        want, _ = gae(traj.reward, c * traj.value[..., 0], c * traj.next_value[..., 0], traj.terminated,
                      traj.truncated, hp.ppo.gamma, hp.ppo.gae_lambda)
        return adv, want

    adv, want = both(traj, hp)
    np.testing.assert_allclose(np.asarray(adv), np.asarray(want), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- SIOP's outcome target
def test_fit_rewards_keep_the_final_reward_of_terminated_episodes_only():
    """Two episodes with intermediate rewards: a terminated one (length 5, kept
    rows rotated in a buffer of L = 4) and a timed-out one (length 3)."""
    buf = ep.empty_buffer(2, 4, {"reward": jnp.float32(0)}, {"terminated": jnp.bool_(False)})
    # episode 0: rewards 0.1 0.2 0.3 0.4 0.5 (positions 0..4), last L = 4 kept: rows hold positions 4, 1, 2, 3
    rewards = jnp.array([[0.5, 0.2, 0.3, 0.4], [0.3, -0.2, 0.7, 0.0]])
    buf = buf.replace(steps={"reward": rewards}, ends={"terminated": jnp.array([True, False])},
                      length=jnp.array([5, 3]), valid=jnp.array([True, True]))
    fit_rewards = jax.jit(pot.fit_rewards)
    np.testing.assert_array_equal(np.asarray(fit_rewards(buf, 0.0)), np.asarray(rewards))  # the return, exactly
    outcome = np.asarray(fit_rewards(buf, 1.0))
    np.testing.assert_array_equal(outcome, [[0.5, 0, 0, 0], [0, 0, 0, 0]])  # a time-out has no outcome
    np.testing.assert_allclose(np.asarray(fit_rewards(buf, 0.25)), 0.75 * np.asarray(rewards) + 0.25 * outcome)
    g0, boot = jax.jit(pot.replay_targets)(buf, 0.9, outcome)
    # the target on an episode with intermediate rewards is the discounted final reward
    np.testing.assert_allclose(np.asarray(g0[0]), [0.5, 0.5 * 0.9**3, 0.5 * 0.9**2, 0.5 * 0.9], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(g0[1]), 0.0)
    np.testing.assert_allclose(np.asarray(boot[1, :3]), [0.9**3, 0.9**2, 0.9], rtol=1e-6)


def test_outcome_potential_minimiser_is_the_discounted_outcome_to_go():
    """The tabular chain of test_potential (chain A pays 0.5 on the way and 1 at
    the end; the time-outs on chain A collect the 0.5): with the outcome target
    both losses reach 0 at the discounted *final* reward to go, the time-outs
    consistent with it through their bootstrap."""
    static = cj.static_config("siop", potential_hidden=(), potential_steps=1000, num_envs=3, rollout_len=6,
                              num_minibatches=1, potential_buffer_episodes=16, potential_episode_len=8)
    hp = cj.default_hparams("siop", gamma=GAMMA, w_reg=0.0, lr=0.02, potential_lr_ratio=1.0, potential_max_grad_norm=100.0,
                            potential_outcome=1.0)
    sig = pot.make_potential(static)
    r1, r2 = chain_rollouts()

    def run(r1, r2, hp):
        state = sig.init(jax.random.PRNGKey(0), r1, hp)
        state, _ = sig.observe(state, r1, hp, None)
        state, _ = sig.observe(state, r2, hp, None)
        return sig.update(state, r2, POLICY, hp, jax.random.PRNGKey(1))

    state, metrics = jax.jit(run).lower(r1, r2, hp).compile(OPT0)(r1, r2, hp)
    phi = np.asarray(pot.potential_values(static, state, jnp.eye(9)))
    np.testing.assert_allclose(phi[:4], return_to_go([0.0, 0.0, 0.0, 1.0]), atol=1e-4)  # not chain A's return
    np.testing.assert_allclose(phi[4:8], return_to_go([0.0, 0.0, 0.0, 1.0]), atol=1e-4)
    assert float(metrics["potential_loss"]) < 1e-8


def test_outcome_target_is_validated():
    assert cj.default_hparams("siop").signal.potential_outcome == 0.0
    assert "potential_outcome" in cj.hparam_fields("siop-shuffled")
    with pytest.raises(cj.ConfigError, match=r"potential_outcome=1.5 is outside the allowed range \[0.0, 1.0\]"):
        cj.validate_hparams(cj.default_hparams("siop", potential_outcome=1.5))


def test_siop_critic_is_registered_as_a_control():
    spec = cj.method_spec("siop-critic")
    assert spec.off == {"beta_int": 0.0} and not spec.intrinsic_stream
    assert cj.default_hparams("siop-critic").signal.beta_int == 1.0


# ----------------------------------------------------------------------------- diagnostics (issue 32 item 2)
def diag_traj():
    """``[T=6, N=2]``: env 0 terminates at t=2 (reward 1) and times out at t=5; env 1 never ends."""
    T, N = 6, 2
    reward = np.zeros((T, N), np.float32)
    reward[2, 0] = 1.0
    term = np.zeros((T, N), bool)
    term[2, 0] = True
    trunc = np.zeros((T, N), bool)
    trunc[5, 0] = True
    z = jnp.zeros((T, N, 3))
    return fake_traj(z, z, jnp.asarray(reward), jnp.asarray(term), jnp.asarray(trunc))


def test_heldout_fit_compares_phi_with_the_realised_return_to_go():
    traj = diag_traj()
    phi_next = jnp.zeros((6, 2)).at[5, 0].set(0.5)  # the time-out's bootstrap Phi(final_obs)
    g0 = [GAMMA**2, GAMMA, 1.0, GAMMA**3 * 0.5, GAMMA**2 * 0.5, GAMMA * 0.5]  # env 0's return to go
    exact = jnp.zeros((6, 2)).at[:, 0].set(jnp.asarray(g0))
    m = pot.heldout_return_fit(exact, phi_next, traj, GAMMA)
    assert float(m["potential_heldout_steps"]) == 6  # env 1's steps: no episode ended, not compared
    assert float(m["potential_heldout_mae"]) == pytest.approx(0.0, abs=1e-7)
    assert float(m["potential_heldout_corr"]) == pytest.approx(1.0, abs=1e-6)
    off = pot.heldout_return_fit(exact.at[:, 0].add(0.1), phi_next, traj, GAMMA)
    assert float(off["potential_heldout_mae"]) == pytest.approx(0.1, abs=1e-6)
    flipped = pot.heldout_return_fit(-exact, phi_next, traj, GAMMA)
    assert float(flipped["potential_heldout_corr"]) == pytest.approx(-1.0, abs=1e-6)


def test_critic_agreement_and_explained_variance_by_hand():
    from coevo_jax.ppo import explained_variance

    traj = diag_traj()
    v = jnp.arange(12.0).reshape(6, 2) / 10
    traj = traj._replace(value=v[..., None])  # one head
    same = pot.critic_agreement(v, traj)
    assert float(same["potential_critic_corr"]) == pytest.approx(1.0, abs=1e-6)
    assert float(same["potential_critic_msgap"]) == 0.0
    shifted = pot.critic_agreement(2 * v + 1, traj)  # correlated, but far apart
    assert float(shifted["potential_critic_corr"]) == pytest.approx(1.0, abs=1e-6)
    assert float(shifted["potential_critic_msgap"]) == pytest.approx(float(jnp.mean((v + 1) ** 2)), rel=1e-6)
    target = jnp.stack([v, -v], -1)  # two heads: the first is read
    assert float(explained_variance(jnp.stack([v, v], -1), target)) == pytest.approx(1.0)
    assert float(explained_variance(jnp.full((6, 2, 2), 0.55), target)) == pytest.approx(0.0, abs=1e-6)
    assert float(explained_variance(v + 0.3, v)) == pytest.approx(1.0, abs=1e-6)  # a constant offset: EV 1
    assert float(explained_variance(v, jnp.ones((6, 2)))) == 0.0  # targets without variance
