"""A policy network the user passes (``make_train(..., network=)``): it is the one that trains,
and a module that breaks the contract is refused with a clear error before anything compiles."""
import flax.linen as nn
import jax
import numpy as np
import pytest

import coevo_jax as cj
import envs_jax
from xla_options import OPT0

STATIC = cj.StaticConfig(method="ppo", num_envs=2, rollout_len=8, total_steps=2 * 8 * 3, num_minibatches=1,
                         update_epochs=1)


class SharedTorso(nn.Module):
    """One shared tanh layer of 24 units for actor and critic (the built-in MLP has two separate torsos)."""

    num_actions: int

    @nn.compact
    def __call__(self, obs):
        h = nn.tanh(nn.Dense(24, name="torso")(obs))
        return nn.Dense(self.num_actions, name="pi")(h), nn.Dense(1, name="v")(h)[..., 0], h


class NoFeatures(nn.Module):
    @nn.compact
    def __call__(self, obs):
        return nn.Dense(2)(obs), nn.Dense(1)(obs)[..., 0]


def test_a_user_network_is_the_policy_that_trains():
    env, params = envs_jax.make("CartPole-v1")
    train = cj.make_train(STATIC, env, params, network=SharedTorso(2))
    state, metrics = jax.jit(train, compiler_options=OPT0)(jax.random.PRNGKey(0), cj.default_hparams("ppo"))
    layers = state.params["params"]
    assert set(layers) == {"torso", "pi", "v"} and layers["torso"]["kernel"].shape == (4, 24)
    assert metrics["episode_return"].shape == (3,) and np.isfinite(np.asarray(metrics["episode_return"])).all()
    assert not bool(state.diverged) and float(metrics["episodes"].sum()) > 0


@pytest.mark.parametrize("method, network, msg", [
    ("ppo", NoFeatures(), "NoFeatures must return (logits (2, 3, 2), value (2, 3, 1) or (2, 3), features (2, 3)"
                          " + (H,))"),
    ("ppo", SharedTorso(3), "logits (2, 3, 2)"),  # CartPole has 2 actions
    # icm adds an intrinsic stream: the critic needs a second head
    ("icm", SharedTorso(2), "value (2, 3, 2), features (2, 3) + (H,)) for observations (2, 3, 4) of CartPole-v1"
                            " (method 'icm': 2 value head(s)); it returned ((2, 3, 2), (2, 3), (2, 3, 24))"),
])
def test_a_network_that_breaks_the_contract_is_refused_before_compiling(method, network, msg):
    env, params = envs_jax.make("CartPole-v1")
    with pytest.raises(cj.ConfigError) as e:
        cj.make_train(STATIC.replace(method=method), env, params, network=network)
    assert msg in str(e.value)


@pytest.mark.parametrize("method, heads", [("ppo", 1), ("icm", 2)])
def test_values_carry_a_heads_axis_from_the_network_on(method, heads):
    """After the network every value is ``[..., V]``: the trajectory's ``value``, ``next_value`` and
    ``cont_value`` ``[T, N, V]`` and the PPO update's ``[B, V]``, from the library's MLP (``value
    [..., V]``) and from a user network that returns one value per sample (``[B]``, one head)."""
    from coevo_jax.ppo import policy_outputs
    from coevo_jax.rollout import RolloutState, rollout

    env, params = envs_jax.make("CartPole-v1")
    static = STATIC.replace(method=method)
    nets = [cj.make_policy_network(static, env, params)] + ([SharedTorso(2)] if heads == 1 else [])
    for net in nets:
        tr = cj.Trainer(static, env, params, network=net)
        obs, env_state = jax.vmap(tr.env.reset, (0, None))(jax.random.split(jax.random.PRNGKey(0), 2), params)
        theta = net.init(jax.random.PRNGKey(1), obs)
        run = jax.jit(lambda p, ro: rollout(net, p, tr.env, params, ro, jax.random.PRNGKey(2), 8)[1],
                      compiler_options=OPT0)
        traj = run(theta, RolloutState(env_state, obs))
        for v in (traj.value, traj.next_value, traj.cont_value):
            assert v.shape == (8, 2, heads), (type(net).__name__, v.shape)
        raw = net.apply(theta, traj.obs)[1]  # [T, N] from SharedTorso, [T, N, V] from the MLP
        np.testing.assert_allclose(traj.value, raw.reshape(traj.value.shape), rtol=1e-6, atol=1e-6)
        assert policy_outputs(net, theta, traj.obs[0])[1].shape == (2, heads)


def test_a_network_that_cannot_read_the_observations_is_named():
    class Tokens(nn.Module):  # a token-id policy, given CartPole's float vectors
        @nn.compact
        def __call__(self, obs):
            h = nn.Embed(16, 8)(obs).mean(-2)
            return nn.Dense(2)(h), nn.Dense(1)(h)[..., 0], h

    env, params = envs_jax.make("CartPole-v1")
    with pytest.raises(cj.ConfigError, match=r"network: Tokens fails on observations \(2, 3, 4\) float32 of Cart"):
        cj.Trainer(STATIC, env, params, network=Tokens())
