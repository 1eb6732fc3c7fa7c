"""The training loop: vmap equals solo, jit equals no-jit, one compile over a
learning-rate batch, chunks equal one call, divergence is isolated."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import coevo_jax as cj
import envs_jax

STATIC = cj.StaticConfig(method="ppo", num_envs=4, rollout_len=16, total_steps=4 * 16 * 3,
                         num_minibatches=2, update_epochs=2, hidden_sizes=(16, 16))


@pytest.fixture(scope="module")
def cartpole():
    return envs_jax.make("CartPole-v1")


def _stack(hps):
    return jax.tree.map(lambda *x: jnp.stack(x), *hps)


def _close(a, b, **kw):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), **kw)


def test_vmapped_runs_equal_solo_runs_over_seeds_and_lr(cartpole):
    env, p = cartpole
    train = cj.make_train(STATIC, env, p)
    hps = [cj.default_hparams("ppo", lr=lr) for lr in (1e-4, 3e-4, 1e-3)]
    keys = jax.random.split(jax.random.PRNGKey(7), 3)
    state_b, metrics_b = jax.jit(jax.vmap(train))(keys, _stack(hps))
    for i in (0, 2):
        state_i, metrics_i = jax.jit(train)(keys[i], hps[i])
        _close(jax.tree.map(lambda x: x[i], state_b.params), state_i.params, rtol=2e-5, atol=2e-6)
        _close(metrics_b["episode_return"][i], metrics_i["episode_return"], rtol=1e-5)
    # the batch really differs across lr
    assert not np.allclose(state_b.params["params"]["actor_out"]["kernel"][0],
                           state_b.params["params"]["actor_out"]["kernel"][2])


def test_jit_equals_no_jit(cartpole):
    env, p = cartpole
    static = STATIC.replace(total_steps=4 * 16 * 2)
    trainer = cj.Trainer(static, env, p)
    hp = cj.default_hparams("ppo")
    key = jax.random.PRNGKey(3)
    s_jit, m_jit = jax.jit(trainer.train)(key, hp)
    with jax.disable_jit():
        s_eager = trainer.init(key, hp)
        m_eager = []
        for _ in range(static.num_iterations):
            s_eager, m = trainer.iteration(s_eager, hp)
            m_eager.append(m)
    _close(s_jit.params, s_eager.params, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(m_jit["episode_return"], [m["episode_return"] for m in m_eager], rtol=1e-5)


def test_batch_over_learning_rates_compiles_once(cartpole):
    env, p = cartpole
    trainer = cj.Trainer(STATIC.replace(total_steps=4 * 16), env, p)
    traces = []

    def counted(key, hp):
        traces.append(1)
        return trainer.train(key, hp)

    f = jax.jit(jax.vmap(counted))
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    for lrs in ([1e-4, 2e-4, 3e-4, 4e-4], [5e-4, 6e-4, 7e-4, 8e-4]):
        hps = _stack([cj.default_hparams("ppo", lr=lr) for lr in lrs])
        jax.block_until_ready(f(keys, hps))
    assert len(traces) == 1


def test_chunks_equal_one_call(cartpole):
    env, p = cartpole
    trainer = cj.Trainer(STATIC, env, p)
    hp = cj.default_hparams("ppo")
    key = jax.random.PRNGKey(11)
    whole, m_whole = jax.jit(trainer.train)(key, hp)
    chunk = jax.jit(trainer.run_chunk, static_argnums=2)
    s = trainer.init(key, hp)
    s, m1 = chunk(s, hp, 1)
    s, m2 = chunk(s, hp, 2)
    _close(whole.params, s.params, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(m_whole["env_steps"], np.concatenate([m1["env_steps"], m2["env_steps"]]))
    assert int(s.iteration) == 3
    assert np.asarray(m_whole["env_steps"]).tolist() == [64.0, 128.0, 192.0]


def test_diverged_run_is_frozen_and_flagged_others_unaffected(cartpole):
    env, p = cartpole
    train = cj.make_train(STATIC, env, p)
    good = cj.default_hparams("ppo")
    # an absurd learning rate and no clipping blow the parameters up
    bad = good.replace(lr=1.0, max_grad_norm=1e30, vf_coef=1e30)
    keys = jax.random.split(jax.random.PRNGKey(5), 2)
    states, metrics = jax.jit(jax.vmap(train))(keys, _stack([good, bad]))
    solo, _ = jax.jit(train)(keys[0], good)
    assert not bool(states.diverged[0]) and bool(states.diverged[1])
    assert metrics["diverged"][1, -1] == 1.0
    # the diverged run keeps finite (frozen) parameters
    assert all(np.isfinite(np.asarray(x[1])).all() for x in jax.tree.leaves(states.params))
    _close(jax.tree.map(lambda x: x[0], states.params), solo.params, rtol=2e-5, atol=2e-6)


def test_metrics_have_iteration_axis_and_expected_keys(cartpole):
    env, p = cartpole
    _, metrics = jax.jit(cj.make_train(STATIC, env, p))(jax.random.PRNGKey(0), cj.default_hparams("ppo"))
    for key in ("env_steps", "episode_return", "success_rate", "policy_loss", "value_loss", "entropy",
                "signal/updated", "diverged"):
        assert metrics[key].shape == (STATIC.num_iterations,), key
