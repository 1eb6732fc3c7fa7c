"""SIOP: the potential's losses share one fixed point (the discounted return to
go, tabular chain), the credit telescopes (one step, n-step, scaled), shaping
keeps the optimal policy (value iteration) where the old shaping did not, the
policy's episodic reward pays the outcome once, the replay, ensembles and
equivalence with PPO at beta_int = 0. (The KeyDoor ground truth: test_credit.py.)"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import coevo_jax as cj
import envs_jax
from coevo_jax.rollout import Trajectory
from coevo_jax.signals import PolicyView, base
from coevo_jax.signals import potential as pot


#: what ``update`` reads of the policy: its annealing factor (here 1: no annealing)
POLICY = PolicyView(None, None, None, jnp.float32(0.0), jnp.float32(1.0))


def hp_(**kw):
    return cj.default_hparams("siop", **kw)


def fake_traj(obs, next_obs, reward, terminated, truncated=None, episode_return=None, action=None):
    """A Trajectory with the fields SIOP/ICM read; the rest zeros (values ``[T, N, 1]``). Shapes [T, N, ...]."""
    T, N = reward.shape
    z = jnp.zeros((T, N), jnp.float32)
    truncated = jnp.zeros((T, N), bool) if truncated is None else truncated
    done = jnp.logical_or(terminated, truncated)
    return Trajectory(
        obs=obs, action=jnp.zeros((T, N), jnp.int32) if action is None else action, logp=z, value=z[..., None],
        features=jnp.zeros((T, N, 2)), reward=reward, dense_reward=reward, terminated=terminated, truncated=truncated,
        next_obs=next_obs, next_value=z[..., None], episode_done=done,
        episode_return=z if episode_return is None else episode_return, episode_length=z, episode_success=z,
    )


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


def random_episodes_traj(key, T=12, N=3, D=6, p_end=0.25):
    """Random observations and rewards with random terminations and time-outs."""
    k = jax.random.split(key, 5)
    obs = jax.random.normal(k[0], (T + 1, N, D))
    final = jax.random.normal(k[1], (T, N, D))
    ends = jax.random.uniform(k[2], (T, N)) < p_end
    term = jnp.logical_and(ends, jax.random.uniform(k[3], (T, N)) < 0.5)
    trunc = jnp.logical_and(ends, ~term)
    next_obs = jnp.where(ends[..., None], final, obs[1:])
    return fake_traj(obs[:T], next_obs, jax.random.normal(k[4], (T, N)), term, trunc)


def perturbed_state(sig, traj, hp, key, noise=0.5):
    """A signal state whose potential is far from constant (random parameters)."""
    state = sig.init(key, traj, hp)
    leaves, tree = jax.tree.flatten(state.params)
    keys = jax.random.split(jax.random.PRNGKey(99), len(leaves))
    leaves = [x + noise * jax.random.normal(kk, x.shape) for x, kk in zip(leaves, keys)]
    return state._replace(params=jax.tree.unflatten(tree, leaves))


def segments(done_col):
    """``[(start, stop)]`` of the episode segments of one env's ``done [T]``."""
    out, start = [], 0
    for t, d in enumerate(done_col):
        if d:
            out.append((start, t + 1))
            start = t + 1
    if start < len(done_col):
        out.append((start, len(done_col)))
    return out


# ----------------------------------------------------------------------------- item 2a: one fixed point
GAMMA = 0.9
CHAIN_A = [0.0, 0.5, 0.0, 1.0]  # intermediate and final rewards, states 0..3
CHAIN_B = [0.0, 0.0, 0.0, 1.0]  # a delayed reward, states 4..7


def return_to_go(r, gamma=GAMMA):
    g, out = 0.0, []
    for x in reversed(r):
        g = x + gamma * g
        out.append(g)
    return out[::-1]


def chain_rollouts():
    """Two 6-step rollouts of 3 envs on a deterministic chain, one-hot obs (9
    states, 8 = the terminal observation): env 0 runs chain A, env 1 chain B
    (4-step episodes, spanning the rollout boundary), env 2 times out after 2
    steps of chain A (final observation: state 2, so its bootstrap is exact)."""
    T, N, D = 12, 3, 9
    obs = np.zeros((T, N), int)
    nxt = np.zeros((T, N), int)
    rew = np.zeros((T, N), np.float32)
    term = np.zeros((T, N), bool)
    trunc = np.zeros((T, N), bool)
    for t in range(T):
        s = t % 4
        obs[t, 0], obs[t, 1] = s, 4 + s
        nxt[t, 0], nxt[t, 1] = (s + 1 if s < 3 else 8), (5 + s if s < 3 else 8)
        rew[t, 0], rew[t, 1] = CHAIN_A[s], CHAIN_B[s]
        term[t, :2] = s == 3
        obs[t, 2], nxt[t, 2], rew[t, 2], trunc[t, 2] = t % 2, t % 2 + 1, CHAIN_A[t % 2], t % 2 == 1
    oh = lambda x: jnp.asarray(np.eye(D, dtype=np.float32)[x])  # noqa: E731
    traj = fake_traj(oh(obs), oh(nxt), jnp.asarray(rew), jnp.asarray(term), jnp.asarray(trunc),
                     episode_return=jnp.asarray(rew))
    return [jax.tree.map(lambda x: x[:6], traj), jax.tree.map(lambda x: x[6:], traj)]


@pytest.mark.parametrize("max_len", [8, 3])
def test_potential_loss_minimiser_is_the_discounted_return_to_go(max_len):
    """Tabular (one-hot, linear) potential, many Adam steps on fit + consistency
    with w_reg = 0 on the replay: Phi equals the closed-form discounted return to
    go on a chain with intermediate rewards, one with a delayed reward, and from
    time-outs that bootstrap. With L = 3 only each episode's last 3 steps are
    kept, and their values are still exact."""
    static = cj.static_config("siop", potential_hidden=(), potential_steps=1000, num_envs=3, rollout_len=6,
                              num_minibatches=1, potential_buffer_episodes=16, potential_episode_len=max_len)
    hp = hp_(gamma=GAMMA, w_reg=0.0, lr=0.02, potential_lr_ratio=1.0, potential_max_grad_norm=100.0)
    sig = pot.make_potential(static)
    r1, r2 = chain_rollouts()
    state = sig.init(jax.random.PRNGKey(0), r1, hp)
    observe = jax.jit(sig.observe)
    state, _ = observe(state, r1, hp, None)
    state, m = observe(state, r2, hp, None)
    assert float(m["episodes_committed"]) == 3 + 3 + 6
    state, metrics = jax.jit(sig.update)(state, r2, POLICY, hp, jax.random.PRNGKey(1))
    phi = np.asarray(pot.potential_values(static, state, jnp.eye(9)))
    want_a, want_b = return_to_go(CHAIN_A), return_to_go(CHAIN_B)
    np.testing.assert_allclose(phi[:4], want_a, atol=1e-4)  # states 0, 1 are also in the time-outs
    kept = list(range(4 - min(max_len, 4), 4))  # chain B: the kept steps only
    np.testing.assert_allclose(phi[[4 + s for s in kept]], [want_b[s] for s in kept], atol=1e-4)
    assert float(metrics["potential_loss"]) < 1e-8


def test_loss_terms_by_hand():
    """One replayed transition of each kind: mid-episode, terminated last step,
    truncated last step (bootstrap ``Phi(final_obs)`` in both targets)."""
    batch = {"g0": jnp.array([1.5, 1.0, 0.5]), "boot": jnp.array([0.0, 0.0, 0.9]),
             "reward": jnp.array([0.5, 1.0, 0.5]), "terminated": jnp.array([False, True, False])}
    phi, phi_next, phi_final = jnp.array([1.0, 0.8, 0.2]), jnp.array([2.0, 7.0, 3.0]), jnp.array([9.0, 9.0, 3.0])
    w = jnp.array([1.0, 1.0, 1.0])
    terms = pot.potential_loss_terms(phi, phi_next, phi_final, batch, w, 0.9)
    fit_t = np.array([1.5, 1.0, 0.5 + 0.9 * 3.0])
    td_t = np.array([0.5 + 0.9 * 2.0, 1.0, 0.5 + 0.9 * 3.0])
    np.testing.assert_allclose(terms["fit"], np.mean((np.asarray(phi) - fit_t) ** 2), rtol=1e-6)
    np.testing.assert_allclose(terms["consistency"], np.mean((np.asarray(phi) - td_t) ** 2), rtol=1e-6)
    np.testing.assert_allclose(terms["l2"], np.mean(np.asarray(phi) ** 2), rtol=1e-6)
    hp = hp_(w_fit=2.0, w_cons=3.0, w_reg=0.1)
    np.testing.assert_allclose(pot.combine_loss(terms, hp), 2 * terms["fit"] + 3 * terms["consistency"]
                               + 0.1 * terms["l2"], rtol=1e-6)
    # the targets carry no gradient
    loss = lambda a, b, c: pot.combine_loss(pot.potential_loss_terms(a, b, c, batch, w, 0.9), hp)  # noqa: E731
    _, g_next, g_final = jax.grad(loss, argnums=(0, 1, 2))(phi, phi_next, phi_final)
    np.testing.assert_array_equal(g_next, 0.0)
    np.testing.assert_array_equal(g_final, 0.0)


# ----------------------------------------------------------------------------- items 1, 2b: telescoping
@pytest.mark.parametrize("nstep,normalize", [(1, 0.0), (1, 1.0), (3, 1.0)])
def test_credit_telescopes_per_episode(nstep, normalize):
    """``sum_t gamma^t F_t`` over every episode segment of the rollout equals
    ``(gamma^len Phi(s_end) - Phi(s_start)) / scale``: ``Phi(s_end) = 0`` after a
    termination, ``Phi(final_obs)`` after a time-out or at the rollout's end."""
    gamma = 0.9
    traj = random_episodes_traj(jax.random.PRNGKey(2))
    static = cj.static_config("siop", potential_hidden=(8,), credit_nstep=nstep, num_envs=3, rollout_len=12,
                              potential_episode_len=16)
    hp = hp_(gamma=gamma, beta_ext=0.0, beta_int=1.0, normalize_int=normalize, potential_init=0.3)
    sig = pot.make_potential(static)
    state = perturbed_state(sig, traj, hp, jax.random.PRNGKey(3))
    phi = np.asarray(pot.potential_values(static, state, traj.obs))
    phi_next = np.asarray(pot.potential_values(static, state, traj.next_obs))
    new, streams, metrics = jax.jit(sig.rewards)(state, traj, hp)
    scale = float(base.return_rms(new.scale)) if normalize else 1.0
    assert normalize == 0.0 or abs(scale - 1.0) > 0.01  # the scale is not trivially 1
    credit = np.asarray(streams.episodic)
    done = np.asarray(traj.terminated | traj.truncated)
    term = np.asarray(traj.terminated)
    n_checked = 0
    for n in range(3):
        for a, b in segments(done[:, n]):
            lhs = sum(gamma ** (t - a) * credit[t, n] for t in range(a, b))
            end = 0.0 if term[b - 1, n] else phi_next[b - 1, n]
            np.testing.assert_allclose(lhs, (gamma ** (b - a) * end - phi[a, n]) / scale, rtol=1e-4, atol=1e-5)
            n_checked += 1
    assert n_checked >= 6 and term.any() and np.asarray(traj.truncated).any()
    assert float(metrics["credit_clip_frac"]) == 0.0


def test_nstep_spread_by_hand():
    c = jnp.array([[1.0], [2.0], [3.0], [4.0]])
    done = jnp.array([[False], [True], [False], [False]])
    np.testing.assert_array_equal(pot.nstep_receivers(done, 3)[:, 0], [1, 2, 1, 2])
    out = np.asarray(pot.nstep_spread(c, done, 0.5, 3)[:, 0])
    # F_1 = 2 splits over steps 0, 1 (1 at step 1, 0.5^-1 * 1 in discounted terms at step 0); F_3 = 4 over 2, 3
    np.testing.assert_allclose(out, [1 + 0.5 * 1.0, 1.0, 3 + 0.5 * 2.0, 2.0])
    np.testing.assert_allclose(pot.clip_credit(jnp.array([2.0, -0.1]), 0.25), [0.25, -0.1])


def test_scale_normalise_only_scales():
    """Adding a constant to every reward of a batch changes the output by a
    scale only: the output is always the input times one positive number."""
    r = jax.random.normal(jax.random.PRNGKey(0), (16, 4))
    done = jax.random.uniform(jax.random.PRNGKey(1), (16, 4)) < 0.1
    scale = base.init_return_scale(4)
    for c in (0.0, 3.0, -2.0):
        _, out = base.scale_normalise(scale, r + c, 0.9, 1.0, done)
        ratio = np.asarray(out / (r + c))
        np.testing.assert_allclose(ratio, ratio.flat[0], rtol=1e-5)
        assert ratio.flat[0] > 0
    _, same = base.scale_normalise(scale, r + 3.0, 0.9, 0.0, done)
    np.testing.assert_allclose(same, r + 3.0, rtol=1e-6)  # off: unchanged
    _, shifted = base.scale_normalise(scale, jnp.full((16, 4), 2.0), 0.9, 1.0, done)
    assert float(shifted.mean()) > 0  # a positive constant stays positive (no mean removed)


# ----------------------------------------------------------------------------- item 2c: policy invariance
def q_iteration(P, R, gamma, iters=2000):
    """Optimal ``Q [S, A]`` of a finite MDP: ``P [S, A, S + 1]`` (last index: the
    terminal state), ``R [S, A, S + 1]`` the reward of each transition."""
    S, A, _ = P.shape
    V = np.zeros(S + 1)
    for _ in range(iters):
        Q = (P * (R + gamma * V[None, None, :])).sum(-1)
        V = np.append(Q.max(-1), 0.0)
    return Q


def shaped(R, phi_ext, gamma, credit=None):
    """``R + F`` per transition with ``F`` from :func:`pot.shaping_credit` (or ``credit``)."""
    S = R.shape[0]
    term = np.zeros(S + 1, bool)
    term[S] = True
    phi_s, phi_n = np.broadcast_arrays(phi_ext[:S, None, None], phi_ext[None, None, :])
    F = credit(phi_s, phi_n) if credit else np.asarray(pot.shaping_credit(
        jnp.asarray(phi_s), jnp.asarray(phi_n), jnp.asarray(np.broadcast_to(term, phi_n.shape)), gamma))
    return R + F


def test_shaping_keeps_the_optimal_policy():
    rng = np.random.default_rng(0)
    S, A, gamma = 5, 3, 0.9
    P = rng.dirichlet(np.ones(S + 1) * 0.5, size=(S, A))
    R = rng.normal(size=(S, A, S + 1))
    R[..., S] += 2.0  # terminal rewards
    q = q_iteration(P, R, gamma)
    for seed in range(5):
        phi = np.append(np.random.default_rng(seed).normal(scale=5.0, size=S), 7.0)  # Phi(terminal) input ignored
        q_shaped = q_iteration(P, shaped(R, phi, gamma), gamma)
        np.testing.assert_allclose(q_shaped, q - phi[:S, None], atol=1e-6)  # Q' = Q - Phi(s)
        np.testing.assert_array_equal(q_shaped.argmax(-1), q.argmax(-1))


def test_old_shaping_changes_the_optimal_policy():
    """States A, B; "finish" ends the episode with reward 1, "move" goes A <-> B.
    Finishing at once is optimal, and stays optimal under the new shaping; a
    fitted (non-zero) terminal potential or undiscounted shaping makes looping
    forever optimal instead."""
    gamma = 0.9
    P = np.zeros((2, 2, 3))
    P[:, 0, 2] = 1.0  # finish
    P[0, 1, 1] = P[1, 1, 0] = 1.0  # move
    R = np.zeros((2, 2, 3))
    R[:, 0, 2] = 1.0
    policy = lambda phi, f=None: q_iteration(P, shaped(R, phi, gamma, f), gamma).argmax(-1).tolist()  # noqa: E731
    assert q_iteration(P, R, gamma).argmax(-1).tolist() == [0, 0]  # finish
    fitted_terminal, high_b = np.array([0.0, 0.0, -5.0]), np.array([0.0, 10.0, 0.0])
    assert policy(fitted_terminal) == policy(high_b) == [0, 0]  # new shaping: still finish
    # old: terminal potential fitted to a non-zero value (discounted otherwise)
    assert policy(fitted_terminal, lambda s, n: gamma * n - s) == [1, 1]  # loop forever
    # old: undiscounted shaping V(s') - V(s), Phi(terminal) = 0
    assert policy(high_b, lambda s, n: np.where(np.arange(3) == 2, 0.0, n) - s) == [1, 1]


# ----------------------------------------------------------------------------- item 3: the outcome is paid once
def test_policy_reward_pays_the_outcome_once():
    """Default siop hparams (beta_ext = beta_int = 1, raw credit): over a
    terminated episode the episodic stream's discounted sum is ``G - Phi(s_0)``;
    over a timed-out one ``G + gamma^T Phi(final_obs) - Phi(s_0)``."""
    traj = synthetic_traj()
    static = cj.static_config("siop", potential_hidden=(8,), num_envs=4, rollout_len=8, potential_episode_len=16)
    hp = hp_()
    assert float(hp.signal.beta_ext) == float(hp.signal.beta_int) == 1.0 and float(hp.signal.normalize_int) == 0.0
    sig = pot.make_potential(static)
    state = perturbed_state(sig, traj, hp, jax.random.PRNGKey(0))
    _, streams, _ = jax.jit(sig.rewards)(state, traj, hp)
    phi = np.asarray(pot.potential_values(static, state, traj.obs))
    phi_next = np.asarray(pot.potential_values(static, state, traj.next_obs))
    g = float(hp.ppo.gamma)
    ep = np.asarray(streams.episodic)
    disc = g ** np.arange(8)
    G = float((disc * np.asarray(traj.reward)[:, 0]).sum())
    np.testing.assert_allclose((disc * ep[:, 0]).sum(), G - phi[0, 0], rtol=1e-5)  # env 0: terminated, G = 0.8 g^7
    np.testing.assert_allclose((disc[:4] * ep[:4, 1]).sum(), g**4 * phi_next[3, 1] - phi[0, 1], rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- network, ensemble, replay, signal
@pytest.fixture(scope="module")
def kd_traj():
    return synthetic_traj()


def test_init_bias_and_ensemble_combination(kd_traj):
    static = cj.static_config("siop", potential_hidden=(8,), ensemble_size=3)
    net = pot.make_potential_network(static)
    params = pot.init_potential_params(net, jax.random.PRNGKey(0), jnp.zeros((1, 155)), 0.5, 3)
    np.testing.assert_array_equal(params["params"]["out"]["bias"], 0.5)
    vals = jax.jit(pot.member_values, static_argnums=0)(net, params, kd_traj.obs)
    assert vals.shape == (3, 8, 4)
    np.testing.assert_allclose(vals, 0.5, atol=1e-2)  # near-zero output kernel: Phi starts at the guess
    for m in range(3):
        np.testing.assert_allclose(vals[m], net.apply(jax.tree.map(lambda x: x[m], params), kd_traj.obs), rtol=1e-6)
    np.testing.assert_allclose(pot.combine_members(vals, "mean"), vals.mean(0), rtol=1e-6)
    np.testing.assert_allclose(pot.combine_members(vals, "min"), vals.min(0), rtol=1e-6)


def test_replay_transitions_and_one_member_ensemble(kd_traj):
    """The replay holds the two ended episodes; a one-member ensemble's update
    equals :func:`pot.refit` on that member by hand."""
    static = cj.static_config("siop", potential_hidden=(8,), potential_steps=3, ensemble_size=1,
                              num_envs=4, rollout_len=8, num_minibatches=2, potential_episode_len=16)
    sig = pot.make_potential(static)
    hp = hp_(lr=1e-2, potential_lr_ratio=1.0)
    state = jax.jit(sig.init)(jax.random.PRNGKey(3), kd_traj, hp)
    state, om = jax.jit(sig.observe)(state, kd_traj, hp, None)
    buf = state.replay.train
    assert float(om["replay_episodes"]) == 2.0
    # slot 0: env 1's time-out at step 3 (ended first), slot 1: env 0's termination at step 7
    assert np.asarray(buf.length[:2]).tolist() == [4, 8] and np.asarray(buf.ends["terminated"][:2]).tolist() == [0, 1]
    g0, boot = pot.replay_targets(buf, float(hp.ppo.gamma))
    g = float(hp.ppo.gamma)
    np.testing.assert_allclose(g0[1, :8], [0.8 * g ** (7 - t) for t in range(8)], rtol=1e-5)
    np.testing.assert_allclose(boot[1], 0.0)
    np.testing.assert_allclose(g0[0, :4], 0.0)
    np.testing.assert_allclose(boot[0, :4], [g ** (4 - t) for t in range(4)], rtol=1e-5)
    b = pot.gather_transitions(buf, g0, boot, jnp.array([1, 1, 0]), jnp.array([2, 7, 3]))
    np.testing.assert_array_equal(b["next_obs"][0], kd_traj.obs[3, 0])
    np.testing.assert_array_equal(b["next_obs"][1], kd_traj.next_obs[7, 0])
    np.testing.assert_array_equal(b["next_obs"][2], kd_traj.next_obs[3, 1])
    assert np.asarray(b["terminated"]).tolist() == [False, True, False]
    key = jax.random.PRNGKey(5)
    new, metrics = jax.jit(sig.update)(state, kd_traj, POLICY, hp, key)
    net = pot.make_potential_network(static)
    one = lambda t: jax.tree.map(lambda x: x[0], t)  # noqa: E731
    refit = jax.jit(pot.refit, static_argnums=(0, 6, 7))
    params, _, terms = refit(net, one(state.params), one(state.opt_state), buf, hp, jax.random.split(key, 1)[0],
                             3, static.minibatch_size)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a[0], b, rtol=1e-5, atol=1e-7), new.params, params)
    np.testing.assert_allclose(metrics["potential_loss"], terms["loss"][-1], rtol=1e-5)


def test_update_reduces_loss_and_rewards_mix(kd_traj):
    static = cj.static_config("siop", potential_hidden=(16,), potential_steps=40, ensemble_size=2,
                              ensemble_combine="min", num_envs=4, rollout_len=8, num_minibatches=1,
                              potential_episode_len=16)
    sig = pot.make_potential(static)
    hp = hp_(lr=3e-3, potential_lr_ratio=1.0, beta_ext=1.0, beta_int=0.5, credit_clip=0.05)
    state, _ = sig.observe(jax.jit(sig.init)(jax.random.PRNGKey(0), kd_traj, hp), kd_traj, hp, None)
    upd = jax.jit(sig.update)
    s1, m1 = upd(state, kd_traj, POLICY, hp, jax.random.PRNGKey(0))
    s2, m2 = upd(s1, kd_traj, POLICY, hp, jax.random.PRNGKey(0))
    assert float(m2["potential_loss"]) < float(m1["potential_loss"]) < float(m1["potential_first_loss"])
    assert float(m1["potential_fit"]) > 0
    _, streams, rm = jax.jit(sig.rewards)(s2, kd_traj, hp)
    assert streams.intrinsic is None
    credit, _, _ = pot.trajectory_credit(static, s2, kd_traj, hp)
    np.testing.assert_allclose(streams.episodic, kd_traj.reward + 0.5 * jnp.clip(credit, -0.05, 0.05), rtol=1e-5,
                               atol=1e-7)
    assert set(rm) == {"potential_mean", "potential_min", "potential_max", "credit_mean", "credit_var",
                       "credit_clip_frac", "credit_return_rms", "potential_diverged", "potential_critic_corr",
                       "potential_critic_msgap"}
    assert float(rm["credit_clip_frac"]) > 0
    assert float(rm["potential_diverged"]) == 0.0
    assert float(state.max_abs_return) == pytest.approx(0.8)


def test_divergence_flag():
    assert float(pot.potential_diverged(jnp.array([1.0, -50.0]), 1.0)) == 0.0
    assert float(pot.potential_diverged(jnp.array([1.0, 201.0]), 1.0)) == 1.0
    assert float(pot.potential_diverged(jnp.array([jnp.nan]), 1.0)) == 1.0


# ----------------------------------------------------------------------------- issue 30: refit gate, window, lr ratio
def test_refit_waits_for_complete_episodes(kd_traj):
    """Issue 30 item 2: a refit on an empty replay takes no step (Phi and Adam's
    count stay as initialised, refit_steps 0); with the two episodes of ``kd_traj``
    it takes ``potential_steps``, unless ``min_refit_episodes`` asks for more.
    Item 3: its step is ``potential_lr_ratio`` times the policy's lr."""
    static = cj.static_config("siop", potential_hidden=(8,), potential_steps=3, num_envs=4, rollout_len=8,
                              num_minibatches=2, potential_episode_len=16)
    sig = pot.make_potential(static)
    hp = hp_(lr=1e-3, potential_lr_ratio=3.0)
    empty = jax.jit(sig.init)(jax.random.PRNGKey(3), kd_traj, hp)
    full, _ = jax.jit(sig.observe)(empty, kd_traj, hp, None)
    update = jax.jit(sig.update)

    def count(state):
        return np.asarray(next(x.count for x in state.opt_state if isinstance(x, optax.ScaleByAdamState)))

    def same(a, b):
        return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))

    for state, min_episodes, steps in ((empty, 1, 0), (full, 1, 3), (full, 2, 3), (full, 3, 0)):
        new, m = update(state, kd_traj, POLICY, hp.replace(min_refit_episodes=min_episodes), jax.random.PRNGKey(0))
        assert count(new).tolist() == [steps] and float(m["refit_steps"]) == steps, (min_episodes, steps)
        assert same(new.params, state.params) == (steps == 0)
        assert float(m["potential_step_size"]) == pytest.approx(3e-3 if steps else 0.0)


def test_replay_length_is_the_env_time_limit(kd_traj):
    """Issue 30 item 4: by default the replay keeps every step of an episode up to
    the env's time limit; a shorter explicit length is refused, naming both."""
    env, params = envs_jax.make("KeyDoor-5x5", max_steps=60)
    sig = pot.make_potential(cj.StaticConfig(method="siop"), None, env, params)
    state = jax.eval_shape(sig.init, jax.random.PRNGKey(0), kd_traj, hp_())
    assert state.replay.train.steps["obs"].shape[:2] == (64, 60)
    env, params = envs_jax.make("KeyDoor-5x5")  # the default limit, 250 steps
    with pytest.raises(cj.ConfigError, match=r"^StaticConfig.potential_episode_len=128 is shorter than the env's time"
                                             r" limit 250: .* None to keep all 250\)$"):
        pot.make_potential(cj.static_config("siop", potential_episode_len=128), None, env, params)
    assert pot.make_potential(cj.static_config("siop", potential_episode_len=300), None, env, params)
