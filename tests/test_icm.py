"""ICM (Pathak et al. 2017): losses and reward on hand cases, and the forward
loss leaves the encoder alone (training every iteration and the separate reward
stream: tests/test_streams.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import coevo_jax as cj
import envs_jax
from coevo_jax.signals import icm as icm_mod


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
    static = cj.static_config("icm", hidden_sizes=(16,), icm_feature_dim=8, num_envs=4, rollout_len=8,
                              num_minibatches=2)
    key = jax.random.PRNGKey(5)
    obs = jax.random.bernoulli(key, 0.3, (8, 4) + env.observation_space(p).shape).astype(jnp.float32)
    z = jnp.zeros((8, 4))
    v2 = jnp.zeros((8, 4, 2))  # icm's two value heads
    traj = cj.Trajectory(obs=obs, action=jax.random.randint(key, (8, 4), 0, 6), logp=z, value=v2,
                         features=jnp.zeros((8, 4, 2)), reward=z, dense_reward=z, terminated=z > 0,
                         truncated=z > 0, next_obs=jnp.roll(obs, -1, 0), next_value=v2, episode_done=z > 0,
                         episode_return=z, episode_length=z, episode_success=z)
    return env, p, static, icm_mod.make_icm(static, None, env, p), traj


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
