"""LIRPG meta-gradient reward (coevo_jax/signals/meta.py): the meta-gradient
against central finite differences (float64 under the ``jax.enable_x64``
context, N = 1 and 2), exact zero when the internal reward is switched off, the
unrolled step equals the ordinary PPO step, truncation equals a restart from the
stopped iterate, the zero-gradient guard, and a vmapped batch of seeds equals
solo runs end to end."""
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import coevo_jax as cj
import envs_jax
from coevo_jax.networks import ActorCritic
from coevo_jax.ppo import make_optimizer, ppo_update
from coevo_jax.rollout import Trajectory
from coevo_jax.signals import meta

T, N, D, A = 6, 3, 4, 3


def _to(dtype, tree):
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def _modules(activation="tanh"):
    """Tiny policy (hidden 8), R_phi and V_ext."""
    return ActorCritic(A, (8,), activation), meta.RewardNet(A, (8,), 4), meta.ValueNet((8,))


# Tests compile many small second-order programs; XLA's cheapest settings halve the compile time.
_jit = partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True})


@partial(_jit, static_argnames=("dtype", "activation", "warm_steps", "dead_unit"))
def _data(hp, lr, seed=0, dtype=jnp.float64, activation="tanh", warm_steps=3, dead_unit=False):
    """A synthetic [T, N] trajectory collected by the tiny policy, a warmed-up
    Adam state, phi, psi and the external advantages, all in ``dtype``."""
    network, reward_net, v_net = _modules(activation)
    hp = _to(dtype, hp)
    ks = jax.random.split(jax.random.PRNGKey(seed), 10)
    obs = jax.random.normal(ks[0], (T, N, D), dtype)
    next_obs = jnp.concatenate([obs[1:], jax.random.normal(ks[1], (1, N, D), dtype)])
    # random params of the policy's shapes (network.init's orthogonal init would compile a slow QR)
    shapes, treedef = jax.tree.flatten(jax.eval_shape(network.init, ks[2], obs[0]))
    theta = treedef.unflatten([jax.random.normal(k, x.shape, dtype) / np.sqrt(x.shape[0])
                               for k, x in zip(jax.random.split(ks[2], len(shapes)), shapes)])
    if dead_unit:  # hidden unit 0 of the actor never fires: its gradients are exactly 0
        theta["params"]["actor_0"]["bias"] = theta["params"]["actor_0"]["bias"].at[0].set(-1e3)
    logits, value, features = network.apply(theta, obs)
    action = jax.random.categorical(ks[3], logits).astype(jnp.int32)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits), action[..., None], -1)[..., 0]
    next_value = network.apply(theta, next_obs)[1]
    terminated = jax.random.bernoulli(ks[4], 0.15, (T, N))
    truncated = jnp.logical_and(jax.random.bernoulli(ks[5], 0.1, (T, N)), ~terminated)
    reward = jnp.where(jax.random.bernoulli(ks[6], 0.3, (T, N)), jax.random.normal(ks[7], (T, N), dtype), 0.0)
    z = jnp.zeros((T, N), dtype)
    traj = Trajectory(obs, action, logp, value, features, reward, reward, terminated, truncated, next_obs,
                      next_value, z.astype(bool), z, z, z)
    opt_state = make_optimizer(1.0, 1.0).init(theta)
    tx = make_optimizer(hp.max_grad_norm, lr)
    for i in range(warm_steps):  # a non-trivial Adam state: a few steps on random gradients
        g = jax.tree.map(lambda x, k=jax.random.fold_in(ks[8], i): jax.random.normal(k, x.shape, x.dtype), theta)
        _, opt_state = tx.update(g, opt_state, theta)
    phi = _to(dtype, reward_net.init(ks[9], features[0], action[0]))
    psi = _to(dtype, v_net.init(ks[9], obs[0]))
    adv_ext, _ = meta.external_advantages(v_net, psi, traj, hp)
    return dict(theta=theta, opt_state=opt_state, traj=traj, lr=jnp.asarray(lr, dtype), phi=phi, adv_ext=adv_ext,
                hp=hp)


def _meta_grad(d, num_steps, truncate=0, theta=None, opt_state=None, activation="tanh"):
    network, reward_net, _ = _modules(activation)
    return meta.meta_gradient(d["phi"], d["theta"] if theta is None else theta,
                              d["opt_state"] if opt_state is None else opt_state, d["traj"], d["adv_ext"], network,
                              reward_net, d["hp"], d["lr"], num_steps, truncate)


@partial(_jit, static_argnames=("num_steps",))
def _grad_and_fd(d, num_steps, eps=1e-6):
    """The meta-gradient and its central finite-difference estimate on every coordinate of phi."""
    network, reward_net, _ = _modules()
    g = ravel_pytree(_meta_grad(d, num_steps)[1])[0]
    flat_phi, unravel = ravel_pytree(d["phi"])

    def f(phi):
        return meta.outer_objective(phi, d["theta"], d["opt_state"], d["traj"], d["adv_ext"], network, reward_net,
                                    d["hp"], d["lr"], num_steps)[0]

    basis = jnp.eye(g.size, dtype=g.dtype) * eps
    g_fd = jax.vmap(lambda e: (f(unravel(flat_phi + e)) - f(unravel(flat_phi - e))) / (2 * eps))(basis)
    return g, g_fd


@pytest.mark.parametrize("num_steps,r_ext_coef", [(1, 1.0), (2, 0.0)])
def test_meta_gradient_matches_central_finite_differences(num_steps, r_ext_coef):
    with jax.enable_x64(True):
        d = _data(cj.default_hparams("meta", r_ext_coef=r_ext_coef), 3e-3)
        g, g_fd = _grad_and_fd(d, num_steps)
        assert g.dtype == jnp.float64 and g.size > 100
        assert float(jnp.linalg.norm(g)) > 1e-8  # a real signal, not a vacuous 0 == 0
        rel = float(jnp.linalg.norm(g_fd - g) / jnp.linalg.norm(g))
        assert rel < 1e-3, rel
        if num_steps == 2:  # with r_int_coef = 0 the meta-gradient is exactly zero (same compiled function)
            g0, _ = _grad_and_fd(_data(cj.default_hparams("meta", r_ext_coef=r_ext_coef, r_int_coef=0.0), 3e-3), 2)
            assert bool(jnp.all(g0 == 0.0))


@_jit
def _unrolled_vs_ppo_update(d):
    network, reward_net, _ = _modules()
    theta1, opt1 = meta.inner_update(d["theta"], d["opt_state"], d["phi"], d["traj"], network, reward_net, d["hp"],
                                     d["lr"], num_steps=1)
    batch = meta.mixed_batch(d["phi"], d["traj"], reward_net, d["hp"])
    # the ordinary update: one epoch, one minibatch (a shuffle of the whole batch)
    theta_ref, opt_ref, _ = ppo_update(d["theta"], d["opt_state"], network, batch, jax.random.PRNGKey(1), d["hp"],
                                       d["lr"], num_epochs=1, num_minibatches=1)
    r_int = meta.intrinsic_reward(reward_net, d["phi"], d["traj"].features, d["traj"].action)
    return theta1, opt1, theta_ref, opt_ref, batch, r_int


def test_unrolled_step_equals_ordinary_ppo_update():
    d = _data(cj.default_hparams("meta"), 1e-3, dtype=jnp.float32)
    theta1, opt1, theta_ref, opt_ref, batch, r_int = _unrolled_vs_ppo_update(d)
    for a, b in zip(jax.tree.leaves((theta1, opt1)), jax.tree.leaves((theta_ref, opt_ref))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-7)
    moved = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(theta1), jax.tree.leaves(d["theta"])))
    assert moved > 1e-4
    # the batch's advantages: GAE of r_ext_coef * r_ext + r_int_coef * R_phi (both 1 here) with the policy critic
    tr = d["traj"]
    adv, _ = cj.gae(tr.reward + r_int, tr.value, tr.next_value, tr.terminated, tr.truncated, 0.99, 0.95)
    np.testing.assert_allclose(batch.advantage, adv.reshape(-1), rtol=1e-5, atol=1e-6)


@_jit
def _truncation_check(d):
    network, reward_net, _ = _modules()
    g_trunc = _meta_grad(d, 2, truncate=1)[1]
    theta1, opt1 = meta.inner_update(d["theta"], d["opt_state"], d["phi"], d["traj"], network, reward_net, d["hp"],
                                     d["lr"], num_steps=1)
    g_restart = _meta_grad(d, 1, theta=theta1, opt_state=opt1)[1]
    g_full = _meta_grad(d, 2)[1]
    return tuple(ravel_pytree(g)[0] for g in (g_trunc, g_restart, g_full))


def test_truncated_gradient_equals_restart_from_stopped_iterate():
    with jax.enable_x64(True):
        a, b, c = _truncation_check(_data(cj.default_hparams("meta"), 3e-3))
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-14)
        assert float(jnp.linalg.norm(a - c)) > 1e-6 * float(jnp.linalg.norm(c))  # truncation changes it


def test_zero_gradient_guard_keeps_meta_gradient_finite(monkeypatch):
    """A dead ReLU unit has exactly-zero policy gradients; with a fresh Adam state
    (nu = 0) the derivative of sqrt(nu) is infinite. The guard keeps the result finite."""
    d = _data(cj.default_hparams("meta"), 3e-3, dtype=jnp.float32, activation="relu", warm_steps=0, dead_unit=True)
    g = ravel_pytree(_jit(lambda d: _meta_grad(d, 1, activation="relu")[1])(d))[0]
    assert bool(jnp.all(jnp.isfinite(g))) and float(jnp.abs(g).max()) > 0.0
    monkeypatch.setattr(meta, "guard_adam_state", lambda opt_state, grads: opt_state)
    g_unguarded = ravel_pytree(_jit(lambda d: _meta_grad(d, 1, activation="relu")[1])(d))[0]
    assert not bool(jnp.all(jnp.isfinite(g_unguarded)))


def test_vmapped_seeds_equal_solo_runs_end_to_end():
    env, p = envs_jax.make("CartPole-v1", reward_freq=20)
    static = cj.StaticConfig(method="meta", num_envs=4, rollout_len=8, total_steps=4 * 8 * 3, num_minibatches=2,
                             update_epochs=1, hidden_sizes=(8,), reward_hidden=(8,), action_embed_dim=4)
    train = cj.make_train(static, env, p)
    hp = cj.default_hparams("meta", r_ext_coef=0.0, meta_lr=1e-2)
    keys = jax.random.split(jax.random.PRNGKey(3), 2)
    hps = jax.tree.map(lambda x: jnp.stack([x, x]), hp)
    state_b, metrics_b = _jit(jax.vmap(train))(keys, hps)
    state_0, metrics_0 = _jit(train)(keys[1], hp)
    for a, b in zip(jax.tree.leaves((state_0.params, state_0.signal_state)),
                    jax.tree.leaves(jax.tree.map(lambda x: x[1], (state_b.params, state_b.signal_state)))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)
    for k in ("signal/outer_objective", "signal/meta_grad_norm", "signal/r_int_mean", "signal/v_ext_loss"):
        assert metrics_0[k].shape == (3,) and bool(jnp.all(jnp.isfinite(metrics_0[k]))), k
    assert float(metrics_0["diverged"][-1]) == 0.0
    assert bool(jnp.all(metrics_0["signal/meta_grad_norm"] > 0))
    # phi moved, and with r_ext_coef = 0 the policy's reward is R_phi alone (in [-1, 1])
    phi0 = cj.Trainer(static, env, p).init(keys[1], hp).signal_state.phi
    assert float(ravel_pytree(jax.tree.map(lambda a, b: a - b, state_0.signal_state.phi, phi0))[0].__abs__().max()) > 1e-3
    assert float(jnp.abs(metrics_0["r_used_mean"]).max()) <= 1.0
