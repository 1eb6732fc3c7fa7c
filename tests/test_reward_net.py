"""The one learned reward network R_phi (coevo and meta): its output at
initialisation, and what a frozen R_phi reads (policy features drift, observations do not)."""
import functools

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest

import coevo_jax as cj
import envs_jax
from coevo_jax import reward_net as RN
from coevo_jax.signals import learned as L
from coevo_jax.signals.base import flat_obs
from xla_options import OPT0

jit0 = functools.partial(jax.jit, compiler_options=OPT0)  # semantic checks: compile fast

SMALL = dict(num_envs=4, rollout_len=8, total_steps=4 * 8 * 4, num_minibatches=1, update_epochs=1,
             hidden_sizes=(16, 16), reward_hidden=(16, 16), action_embed_dim=4, reward_steps=2,
             buffer_episodes=8)  # R_phi's rows: the env's time limit


# ----------------------------------------------------------------------------- the shared reward net (item 5)
def _realistic_obs(name, num=32, steps=4):
    """Observations of ``num`` envs after 0..steps-1 uniformly random steps: ``[steps * num, ...]``."""
    env, params = envs_jax.make(name)
    n_act = int(env.action_space(params).n)

    @jit0
    def collect(key):
        k0, k1 = jax.random.split(key)
        obs, state = jax.vmap(env.reset, (0, None))(jax.random.split(k0, num), params)

        def step(carry, k):
            obs, state = carry
            ka, ks = jax.random.split(k)
            act = jax.random.randint(ka, (num,), 0, n_act)
            obs2, state, *_ = jax.vmap(env.step, (0, 0, 0, None))(jax.random.split(ks, num), state, act, params)
            return (obs2, state), (obs, act)

        return jax.lax.scan(step, (obs, state), jax.random.split(k1, steps))[1]

    obs, act = collect(jax.random.PRNGKey(0))
    return env, params, obs.reshape((-1,) + obs.shape[2:]), act.reshape(-1)


@pytest.mark.parametrize("name,reward_input", [("KeyDoor-5x5", "features"), ("KeyDoor-5x5", "obs"),
                                               ("TextMaze", "features"), ("TextMaze", "obs")])
def test_reward_net_starts_near_zero_on_realistic_inputs(name, reward_input):
    """Item 5: the one R_phi (used by coevo and meta) starts with |mean| < 0.01 and
    std < 0.01 over the inputs for each of 64 seeds: on a policy's features (MLP
    for the grid, transformer for text) and on raw observations (one-hot tokens
    for text). It is small, not constant zero (a frozen R_phi is still a function)."""
    env, params, obs, act = _realistic_obs(name)
    static = cj.static_config("coevo-regression", reward_input=reward_input)
    net = RN.make_reward_net(static, env, params)
    assert net.vocab == (int(env.observation_space(params).high) + 1 if reward_input == "obs" and name == "TextMaze"
                         else 0)
    if reward_input == "features":
        policy = cj.make_policy_network(static, env, params)
        x = jit0(policy.apply)(policy.init(jax.random.PRNGKey(1), obs[:1]), obs)[2]
    else:
        x = flat_obs(obs, len(env.observation_space(params).shape))

    @jit0
    def outputs(keys):
        return jax.vmap(lambda k: net.apply(net.init(k, x[:1], act[:1]), x, act)[0])(keys)

    r = np.asarray(outputs(jax.random.split(jax.random.PRNGKey(2), 64)))  # [64 seeds, B]
    assert r.shape == (64, x.shape[0])
    assert np.abs(r.mean(1)).max() < 0.01, np.abs(r.mean(1)).max()
    assert r.std(1).max() < 0.01, r.std(1).max()
    assert r.std(1).min() > 0.0


def test_both_methods_use_the_one_reward_net():
    """Item 5: coevo and meta build R_phi with coevo_jax.reward_net (no RewardNet of their own)."""
    from coevo_jax.signals import meta
    for module in (L, meta):
        assert getattr(module, "RewardNet", RN.RewardNet) is RN.RewardNet
    env, p = envs_jax.make("CartPole-v1")
    for method in ("coevo-regression", "meta"):
        static = cj.static_config(method, reward_input="obs")
        assert RN.make_reward_net(static, env, p) == RN.RewardNet(2, (64, 64), 16, "obs", 1, 0)


# ----------------------------------------------------------------------------- what a frozen R_phi reads (item 8d)
def test_reward_input_is_validated():
    for method in ("coevo-regression", "coevo-novelty", "meta"):  # the methods with an R_phi (RewardNetStatic)
        with pytest.raises(cj.ConfigError, match=r"StaticConfig.reward_input='pixels' must be 'features' or 'obs'"):
            cj.validate_static(cj.static_config(method, reward_input="pixels"))
    with pytest.raises(cj.ConfigError, match=r"StaticConfig.reward_input is a static option of method\(s\) .*not of"
                                             r" method 'ppo', whose static options are \(none\)"):
        cj.static_config("ppo", reward_input="pixels")  # not ppo's: refused by name


def test_frozen_reward_of_a_fixed_observation_stays_fixed_with_obs_input():
    """Item 8d: with reward_lr_ratio = 0 (the frozen control) and reward_input = "obs",
    R_phi of a fixed (observation, action) is the same before and after the policy
    trains; with "features" it is not (it reads the policy's drifting features)."""
    env, p = envs_jax.make("CartPole-v1")
    obs = jax.random.normal(jax.random.PRNGKey(5), (16, 4)) * 0.1
    act = jnp.arange(16) % 2
    hp = cj.default_hparams("coevo-regression", reward_lr_ratio=0.0, k=1, lr=1e-2)
    out = {}
    for reward_input in ("obs", "features"):
        trainer = cj.Trainer(cj.static_config("coevo-regression", reward_input=reward_input, **SMALL), env, p)
        net = RN.make_reward_net(trainer.static, env, p)

        def reward_of_fixed(state):
            x = obs if reward_input == "obs" else trainer.network.apply(state.params, obs)[2]
            return net.apply(state.signal_state.params, x, act)[0]

        @jit0
        def run(key):
            s0 = trainer.init(key, hp)
            s1, m = trainer.run_chunk(s0, hp, 4)
            moved = jnp.abs(jax.flatten_util.ravel_pytree(s1.params)[0] - jax.flatten_util.ravel_pytree(s0.params)[0])
            return reward_of_fixed(s0), reward_of_fixed(s1), m["signal/updated"].sum(), moved.max()

        out[reward_input] = run(jax.random.PRNGKey(0))
    r0, r1, updates, policy_moved = out["obs"]
    assert float(updates) == 4 and float(policy_moved) > 1e-3  # refits ran (at lr 0) while the policy trained
    np.testing.assert_array_equal(np.asarray(r0), np.asarray(r1))
    f0, f1, _, _ = out["features"]
    assert not np.allclose(np.asarray(f0), np.asarray(f1), rtol=1e-2, atol=0)
