"""LIRPG meta-gradient reward (coevo_jax/signals/meta.py): the meta-gradient
against central finite differences (float64 under the ``jax.enable_x64``
context, N = 1 and 2), exact zero when the internal reward is switched off, the
unrolled step equals the ordinary PPO step, truncation equals a restart from the
stopped iterate, the zero-gradient guard, the legal-action masks in the outer
ratio, the reward streams (R_phi in the non-episodic intrinsic stream) and the
meta step annealed with the policy's learning rate. (vmap == solo, jit == no
jit, finiteness and "the update moves phi" are in test_signal_contract.py.)"""
import types
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.flatten_util import ravel_pytree

import coevo_jax as cj
from coevo_jax.networks import ActorCritic
from coevo_jax.ppo import make_optimizer, ppo_update
from coevo_jax.reward_net import RewardNet
from coevo_jax.rollout import Trajectory
from coevo_jax.signals import PolicyView, meta

T, N, D, A = 6, 3, 4, 3


def _to(dtype, tree):
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def _modules():
    """Tiny policy (hidden 8, two value heads: meta has an intrinsic stream), R_phi and V_ext."""
    return ActorCritic(A, (8,), "tanh", 2), RewardNet(A, (8,), 4), meta.ValueNet((8,))


# Tests compile many small second-order programs; XLA's cheapest settings halve the compile time.
_jit = partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0,
                                          "xla_llvm_disable_expensive_passes": True})


@_jit
def _apply(theta, obs):
    return _modules()[0].apply(theta, obs)


def _random_params(module, rng, dtype, *example):
    """NumPy-random params of ``module``'s shapes: N(0, 1/fan_in) matrices, N(0, 0.01) vectors."""
    shapes, treedef = jax.tree.flatten(jax.eval_shape(module.init, jax.random.PRNGKey(0), *example))
    return treedef.unflatten([jnp.asarray(rng.normal(size=x.shape) / np.sqrt(x.shape[0] if len(x.shape) == 2 else 1e4),
                                          dtype) for x in shapes])


def _data(hp, lr, seed=0, dtype=jnp.float64, warm_steps=3, dead_unit=False, masked=False):
    """A synthetic [T, N] trajectory collected by the tiny policy, an Adam state
    after ``warm_steps`` steps on random gradients, phi and psi, all in ``dtype``
    (built with NumPy: nothing to compile but the policy's forward pass).
    ``masked``: about a third of the actions are illegal at each step
    (``traj.legal_mask``); the behaviour policy samples among the legal ones."""
    network, reward_net, v_net = _modules()
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(T + 1, N, D))
    theta = _random_params(network, rng, dtype, obs[0])
    if dead_unit:  # hidden unit 0 of the actor saturates (tanh(-1e3) == -1 exactly): its input gradients are exactly 0
        theta["params"]["actor_0"]["bias"] = theta["params"]["actor_0"]["bias"].at[0].set(-1e3)
    obs, next_obs = jnp.asarray(obs[:-1], dtype), jnp.asarray(obs[1:], dtype)
    logits, value, features = _apply(theta, obs)
    next_value = _apply(theta, next_obs)[1]
    logits = np.asarray(logits, np.float64)
    legal = None
    if masked:
        legal = rng.random((T, N, A)) > 0.35
        legal[..., 0] |= ~legal.any(-1)  # at least one legal action
        logits = np.where(legal, logits, -1e9)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    action = (rng.random((T, N, 1)) > probs.cumsum(-1)).sum(-1).clip(0, A - 1)
    logp = np.log(np.take_along_axis(probs, action[..., None], -1)[..., 0])
    terminated = rng.random((T, N)) < 0.15
    truncated = (rng.random((T, N)) < 0.1) & ~terminated
    reward = np.where(rng.random((T, N)) < 0.3, rng.normal(size=(T, N)), 0.0)
    z = jnp.zeros((T, N), dtype)
    traj = Trajectory(obs, jnp.asarray(action, jnp.int32), jnp.asarray(logp, dtype), value, features,
                      jnp.asarray(reward, dtype), jnp.asarray(reward, dtype), jnp.asarray(terminated),
                      jnp.asarray(truncated), next_obs, next_value, z.astype(bool), z, z, z,
                      None if legal is None else jnp.asarray(legal), next_value)  # next_obs = obs[t+1]: no resets
    # Adam's state after warm_steps steps on N(0, 1) gradients
    leaves, treedef = jax.tree.flatten(theta)
    mu, nu = [np.zeros(x.shape) for x in leaves], [np.zeros(x.shape) for x in leaves]
    for _ in range(warm_steps):
        for m, v in zip(mu, nu):
            g = rng.normal(size=m.shape)
            m *= 0.9
            m += 0.1 * g
            v *= 0.999
            v += 0.001 * g * g
    adam = optax.ScaleByAdamState(count=jnp.asarray(warm_steps, jnp.int32),
                                  mu=treedef.unflatten([jnp.asarray(m, dtype) for m in mu]),
                                  nu=treedef.unflatten([jnp.asarray(v, dtype) for v in nu]))
    opt_state = tuple(adam if isinstance(x, optax.ScaleByAdamState) else x
                      for x in make_optimizer(1.0, 1.0).init(theta))
    phi = _random_params(reward_net, rng, dtype, features[0], traj.action[0])
    psi = _random_params(v_net, rng, dtype, obs[0])
    return dict(theta=theta, opt_state=opt_state, traj=traj, lr=jnp.asarray(lr, dtype), phi=phi, psi=psi,
                hp=_to(dtype, hp))


def _adv_ext(d):
    return meta.external_advantages(_modules()[2], d["psi"], d["traj"], d["hp"])[0]


def _meta_grad(d, num_steps, truncate=0, theta=None, opt_state=None):
    network, reward_net, _ = _modules()
    return meta.meta_gradient(d["phi"], d["theta"] if theta is None else theta,
                              d["opt_state"] if opt_state is None else opt_state, d["traj"], _adv_ext(d), network,
                              reward_net, d["hp"], d["lr"], num_steps, truncate)


@partial(_jit, static_argnames=("num_steps",))
def _grad_and_fd(d, num_steps, eps=1e-6):
    """The meta-gradient and its central finite-difference estimate on every coordinate of phi."""
    network, reward_net, _ = _modules()
    g = ravel_pytree(_meta_grad(d, num_steps)[1])[0]
    flat_phi, unravel = ravel_pytree(d["phi"])

    def f(phi):
        return meta.outer_objective(phi, d["theta"], d["opt_state"], d["traj"], _adv_ext(d), network, reward_net,
                                    d["hp"], d["lr"], num_steps)[0]

    basis = jnp.eye(g.size, dtype=g.dtype) * eps
    g_fd = jax.vmap(lambda e: (f(unravel(flat_phi + e)) - f(unravel(flat_phi - e))) / (2 * eps))(basis)
    return g, g_fd


@pytest.mark.parametrize("num_steps,r_ext_coef", [(1, 1.0), (2, 0.0)])
def test_meta_gradient_matches_central_finite_differences(num_steps, r_ext_coef):
    with jax.enable_x64(True):
        d = _data(cj.default_hparams("meta", r_ext_coef=r_ext_coef, r_int_coef=1.0), 3e-3)
        g, g_fd = _grad_and_fd(d, num_steps)
        assert g.dtype == jnp.float64 and g.size > 100
        assert float(jnp.linalg.norm(g)) > 1e-8  # a real signal, not a vacuous 0 == 0
        rel = float(jnp.linalg.norm(g_fd - g) / jnp.linalg.norm(g))
        assert rel < 1e-3, rel
        if num_steps == 2:
            # with r_int_coef = 0, R_phi no longer weighs the policy's advantage: phi then reaches theta' only
            # through the intrinsic critic head's targets (the value loss, and the global-norm clipping it
            # feeds); without the value loss the meta-gradient is exactly zero (same compiled function)
            hp0 = cj.default_hparams("meta", r_ext_coef=r_ext_coef, r_int_coef=0.0, vf_coef=0.0)
            g0, _ = _grad_and_fd(_data(hp0, 3e-3), 2)
            assert bool(jnp.all(g0 == 0.0))
            g1, _ = _grad_and_fd(_data(hp0.replace(r_int_coef=1.0), 3e-3), 2)
            assert float(jnp.linalg.norm(g1)) > 1e-8


@_jit
def _unrolled_vs_ppo_update(d):
    network, reward_net, _ = _modules()
    theta1, opt1 = meta.inner_update(d["theta"], d["opt_state"], d["phi"], d["traj"], network, reward_net, d["hp"],
                                     d["lr"], num_steps=1)
    batch = meta.mixed_batch(d["phi"], d["traj"], reward_net, d["hp"])
    # the ordinary update: one epoch, one minibatch (a shuffle of the whole batch)
    theta_ref, opt_ref, _ = ppo_update(d["theta"], d["opt_state"], network, batch, jax.random.PRNGKey(1), d["hp"],
                                       d["lr"], num_epochs=1, num_minibatches=1)
    r_int = meta.intrinsic_reward(reward_net, d["phi"], d["traj"])
    return theta1, opt1, theta_ref, opt_ref, batch, r_int


def test_unrolled_step_equals_ordinary_ppo_update():
    d = _data(cj.default_hparams("meta", r_int_coef=1.0), 1e-3, dtype=jnp.float32)
    theta1, opt1, theta_ref, opt_ref, batch, r_int = _unrolled_vs_ppo_update(d)
    for a, b in zip(jax.tree.leaves((theta1, opt1)), jax.tree.leaves((theta_ref, opt_ref))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-7)
    moved = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(theta1), jax.tree.leaves(d["theta"])))
    assert moved > 1e-4
    # the batch's advantages: episodic GAE of r_ext_coef * r_ext with the first critic head plus
    # non-episodic GAE (no episode ends) of r_int_coef * R_phi (coefficients 1, raw) with the second
    tr = d["traj"]
    adv_e, tgt_e = cj.gae(tr.reward, tr.value[..., 0], tr.next_value[..., 0], tr.terminated, tr.truncated, 0.99, 0.95)
    never = jnp.zeros_like(tr.terminated)
    adv_i, tgt_i = cj.gae(r_int, tr.value[..., 1], tr.next_value[..., 1], never, never, 0.99, 0.95)
    np.testing.assert_allclose(batch.advantage, (adv_e + adv_i).reshape(-1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(batch.target, jnp.stack([tgt_e, tgt_i], -1).reshape(-1, 2), rtol=1e-5, atol=1e-6)
    assert float(jnp.abs(adv_i).max()) > 1e-3  # R_phi does reach the advantages


@_jit
def _truncation_check(d):
    network, reward_net, _ = _modules()
    g_trunc = _meta_grad(d, 2, truncate=1)[1]
    theta1, opt1 = meta.inner_update(d["theta"], d["opt_state"], d["phi"], d["traj"], network, reward_net, d["hp"],
                                     d["lr"], num_steps=1)
    g_restart = _meta_grad(d, 1, theta=theta1, opt_state=opt1)[1]
    return ravel_pytree(g_trunc)[0], ravel_pytree(g_restart)[0]


def test_truncated_gradient_equals_restart_from_stopped_iterate():
    """N = 2 with the first step truncated is the N = 1 meta-gradient taken from
    the first step's (theta_1, opt_state_1) held constant (an untruncated N = 2
    gradient also flows through theta_1 and differs)."""
    with jax.enable_x64(True):
        g_trunc, g_restart = _truncation_check(_data(cj.default_hparams("meta"), 3e-3))
        assert float(jnp.linalg.norm(g_trunc)) > 1e-8
        np.testing.assert_allclose(g_trunc, g_restart, rtol=1e-9, atol=1e-14)


def test_zero_gradient_guard_keeps_meta_gradient_finite(monkeypatch):
    """A saturated (dead) unit has exactly-zero policy gradients; with a fresh Adam
    state (nu = 0) the derivative of sqrt(nu) is infinite. The guard keeps the result finite."""
    d = _data(cj.default_hparams("meta"), 3e-3, dtype=jnp.float32, warm_steps=0, dead_unit=True)
    g = ravel_pytree(_jit(lambda d: _meta_grad(d, 1)[1])(d))[0]
    assert bool(jnp.all(jnp.isfinite(g))) and float(jnp.abs(g).max()) > 0.0
    monkeypatch.setattr(meta, "guard_adam_state", lambda opt_state, grads: opt_state)
    g_unguarded = ravel_pytree(_jit(lambda d: _meta_grad(d, 1)[1])(d))[0]
    assert not bool(jnp.all(jnp.isfinite(g_unguarded)))


@_jit
def _outer_at_zero_lr(d):
    network, reward_net, _ = _modules()
    adv = _adv_ext(d)
    obj, theta_new = meta.outer_objective(d["phi"], d["theta"], d["opt_state"], d["traj"], adv, network, reward_net,
                                          d["hp"], 0.0 * d["lr"], normalize_advantages=False)
    tr = d["traj"]
    logp = meta.policy_log_prob(theta_new, network, tr.obs.reshape(T * N, D), tr.action.reshape(-1),
                                tr.legal_mask.reshape(T * N, A))
    return obj, adv.mean(), logp, theta_new


def test_outer_ratio_is_one_at_theta_with_legal_masks():
    """Item 8a: with legal-action masks the outer surrogate's ratio pi_theta' / pi_old
    is 1 at theta' = theta (a zero inner step), as in the inner PPO step and the
    stored log-probabilities, so the surrogate equals the mean external advantage."""
    d = _data(cj.default_hparams("meta"), 3e-3, dtype=jnp.float32, masked=True)
    assert not bool(d["traj"].legal_mask.all())  # some actions are illegal
    obj, adv_mean, logp, theta_new = _outer_at_zero_lr(d)
    for a, b in zip(jax.tree.leaves(theta_new), jax.tree.leaves(d["theta"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_allclose(np.asarray(logp), np.asarray(d["traj"].logp).reshape(-1), rtol=1e-5, atol=1e-5)
    assert abs(float(adv_mean)) > 1e-3
    assert float(obj) == pytest.approx(float(adv_mean), rel=1e-4, abs=1e-6)


def _fake_env(num_actions=A, obs_dim=D):
    return types.SimpleNamespace(
        action_space=lambda p: types.SimpleNamespace(n=num_actions),
        observation_space=lambda p: types.SimpleNamespace(shape=(obs_dim,), dtype=jnp.float32, high=1.0))


def test_meta_rewards_r_phi_is_the_intrinsic_stream_scaled_not_shifted():
    """Item 4: the episodic stream is r_ext_coef * r_ext; R_phi goes to the
    non-episodic intrinsic stream as r_int_coef * R_phi, raw by default and, with
    normalize_int, divided by one positive number (never shifted)."""
    static = cj.static_config("meta", reward_hidden=(8,), action_embed_dim=4)
    signal = meta.make_meta(static, None, _fake_env(), None)
    hp0 = cj.default_hparams("meta", r_ext_coef=0.5, r_int_coef=2.0)
    assert float(hp0.signal.normalize_int) == 0.0  # the meta default: raw R_phi
    d = _data(hp0, 1e-3, dtype=jnp.float32)

    @jax.jit
    def run(hp):
        state = signal.init(jax.random.PRNGKey(0), d["traj"], hp)
        state = state._replace(phi=d["phi"])  # a trained-looking (non-tiny) R_phi
        r_phi = meta.intrinsic_reward(_modules()[1], d["phi"], d["traj"])
        new, streams, metrics = signal.rewards(state, d["traj"], hp)
        return r_phi, streams, new.scale.count, metrics

    for on in (0.0, 1.0):
        r_phi, streams, count, metrics = run(hp0.replace(normalize_int=on))
        np.testing.assert_allclose(np.asarray(streams.episodic), 0.5 * np.asarray(d["traj"].reward), rtol=1e-6)
        assert float(streams.intrinsic_coef) == 2.0  # r_int_coef weighs the intrinsic advantage
        ratio = np.asarray(streams.intrinsic) / np.asarray(r_phi)
        assert int(count) == T * N
        if on:  # one positive factor, the inverse of the running RMS of the non-episodic intrinsic return
            returns = np.zeros((T, N))
            ret = np.zeros(N)
            for t in range(T):
                ret = 0.99 * ret + np.asarray(r_phi)[t]
                returns[t] = ret
            rms = np.sqrt(np.mean(returns**2))
            np.testing.assert_allclose(ratio, 1.0 / rms, rtol=1e-4)
            assert abs(rms - 1.0) > 0.1  # the normalisation did something
        else:
            np.testing.assert_allclose(ratio, 1.0, rtol=1e-6)
        assert set(metrics) == {"r_int_mean", "r_int_std", "int_return_rms"}
    # LIRPG's own construction: R_phi paid in the episodic return, the intrinsic stream weighted 0
    r_phi, streams, _, _ = run(hp0.replace(r_int_episodic=1.0))
    np.testing.assert_allclose(np.asarray(streams.episodic),
                               0.5 * np.asarray(d["traj"].reward) + 2.0 * np.asarray(r_phi), rtol=1e-5, atol=1e-7)
    assert float(streams.intrinsic_coef) == 0.0


@_jit
def _meta_updates(d, fracs):
    network, reward_net, v_net = _modules()
    state = meta.MetaState(d["phi"], meta.init_optimizer(d["phi"]), d["psi"], meta.init_optimizer(d["psi"]),
                           meta.init_return_scale(N))
    deltas = []
    for frac in fracs:
        policy = PolicyView(network, d["theta"], d["opt_state"], d["lr"], jnp.float32(frac))
        new, _ = meta.meta_update(state, d["traj"], policy, d["hp"], jax.random.PRNGKey(0), reward_net, v_net)
        deltas.append(ravel_pytree(new.phi)[0] - ravel_pytree(state.phi)[0])
    return deltas


def test_meta_step_is_annealed_with_the_policy_lr():
    """Item 6: phi's step size is meta_lr_ratio * lr * lr_frac, so it stays a fixed
    multiple of the policy's lr over a run: from the same state the step at lr_frac = 0.25 is a quarter of
    the step at lr_frac = 1 (Adam's first step is proportional to its step size)."""
    d = _data(cj.default_hparams("meta", meta_lr_ratio=40.0), 3e-3, dtype=jnp.float32)  # a step of 1e-2 at lr 2.5e-4
    full, quarter = _meta_updates(d, (1.0, 0.25))
    assert float(jnp.abs(full).max()) > 1e-3
    np.testing.assert_allclose(np.asarray(quarter), 0.25 * np.asarray(full), rtol=1e-4, atol=1e-9)
