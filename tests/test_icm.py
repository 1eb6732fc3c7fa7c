"""ICM (Pathak et al. 2017): losses and reward on hand cases, the forward loss
leaves the encoder alone, and training lowers the loss."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import coevo_jax as cj
import envs_jax
from coevo_jax.signals import icm as icm_mod
from test_potential import synthetic_traj


def test_inverse_loss_by_hand():
    logits = jnp.array([[0.0, jnp.log(3.0)], [0.0, 0.0]])
    action = jnp.array([1, 0])
    # -log(3/4) and -log(1/2), averaged
    np.testing.assert_allclose(icm_mod.inverse_loss(logits, action), (-np.log(0.75) - np.log(0.5)) / 2, rtol=1e-6)


def test_forward_error_reward_and_loss_mix_by_hand():
    pred = jnp.array([[1.0, 2.0], [0.0, 0.0]])
    target = jnp.array([[0.0, 0.0], [0.0, 1.0]])
    np.testing.assert_allclose(icm_mod.forward_error(pred, target), [2.5, 0.5])
    np.testing.assert_allclose(icm_mod.forward_loss(pred, target), 1.5)
    np.testing.assert_allclose(icm_mod.intrinsic_reward(pred, target, 0.1), [0.25, 0.05], rtol=1e-6)
    np.testing.assert_allclose(icm_mod.icm_loss(2.0, 1.0, 0.2), 0.8 * 2.0 + 0.2 * 1.0, rtol=1e-6)
    # the forward loss does not push the target features
    g_target = jax.grad(lambda t: icm_mod.forward_loss(pred, t))(target)
    np.testing.assert_array_equal(g_target, 0.0)


@pytest.fixture(scope="module")
def setup():
    env, p = envs_jax.make("KeyDoor-5x5")
    static = cj.StaticConfig(method="icm", hidden_sizes=(16,), icm_feature_dim=8, num_envs=4, rollout_len=8,
                             num_minibatches=2)
    return env, p, static, icm_mod.make_icm(static, None, env, p), synthetic_traj()


def test_forward_loss_leaves_encoder_alone(setup):
    env, p, static, sig, traj = setup
    hp = cj.default_hparams("icm")
    state = jax.jit(sig.init)(jax.random.PRNGKey(0), traj, hp)
    net = icm_mod.ICMNetwork(6, 8, (16,))

    def losses(params):
        _, phi_tp1, logits, phi_pred = net.apply(params, traj.obs, traj.next_obs, traj.action)
        return icm_mod.inverse_loss(logits, traj.action), icm_mod.forward_loss(phi_pred, phi_tp1)

    g_fwd = jax.jit(jax.grad(lambda q: losses(q)[1]))(state.params)["params"]
    g_inv = jax.jit(jax.grad(lambda q: losses(q)[0]))(state.params)["params"]
    enc = [k for k in g_fwd if "encoder" in k]
    assert enc, list(g_fwd)
    for k in enc:
        jax.tree.map(lambda g: np.testing.assert_array_equal(g, 0.0), g_fwd[k])
    assert any(float(jnp.abs(g).max()) > 0 for k in enc for g in jax.tree.leaves(g_inv[k]))
    assert any(float(jnp.abs(g).max()) > 0 for k in g_fwd if "forward" in k for g in jax.tree.leaves(g_fwd[k]))


def test_update_lowers_losses_and_reward_is_external_plus_curiosity(setup):
    env, p, static, sig, traj = setup
    net = icm_mod.ICMNetwork(6, 8, (16,))

    def losses(params):
        _, phi_tp1, logits, phi_pred = net.apply(params, traj.obs, traj.next_obs, traj.action)
        return icm_mod.inverse_loss(logits, traj.action), icm_mod.forward_loss(phi_pred, phi_tp1)

    upd1, init = jax.jit(sig.update), jax.jit(sig.init)

    def upd(state, traj, policy, hp, key):  # 15 updates of one epoch (2 minibatches) each
        for k in jax.random.split(key, 15):
            state, m = upd1(state, traj, policy, hp, k)
        return state, m
    # mixed loss: the inverse model learns the actions (the features move, so the forward error may not fall)
    hp = cj.default_hparams("icm", icm_lr=3e-3, icm_eta=0.5)
    state = init(jax.random.PRNGKey(0), traj, hp)
    s1, _ = upd(state, traj, None, hp, jax.random.PRNGKey(0))
    assert float(losses(s1.params)[0]) < float(losses(state.params)[0]) - 0.05
    # beta = 1: the encoder gets no gradient (fixed features) and the forward model fits them
    hp1 = hp.replace(icm_forward_weight=1.0)
    f1, _ = upd(state, traj, None, hp1, jax.random.PRNGKey(0))
    jax.tree.map(np.testing.assert_array_equal, [v for k, v in f1.params["params"].items() if "encoder" in k],
                 [v for k, v in state.params["params"].items() if "encoder" in k])
    assert float(losses(f1.params)[1]) < 0.5 * float(losses(state.params)[1])
    # r_used = r_ext + eta * 0.5 * ||f(phi_t, a_t) - phi_tp1||^2
    r_used, rm = jax.jit(sig.rewards)(s1, traj, hp)
    _, phi_tp1, _, phi_pred = net.apply(s1.params, traj.obs, traj.next_obs, traj.action)
    want = traj.reward + 0.5 * 0.5 * jnp.sum((phi_pred - phi_tp1) ** 2, -1)
    np.testing.assert_allclose(r_used, want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(rm["icm_reward_mean"], (want - traj.reward).mean(), rtol=1e-5)
