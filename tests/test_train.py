"""The training loop: vmap equals solo, jit equals no-jit, one compile over a
learning-rate batch, chunks equal one call, divergence is isolated.

Compiled functions are shared through module fixtures: compile time dominates
these tests on a 2-core CPU.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import coevo_jax as cj
import envs_jax

STATIC = cj.StaticConfig(method="ppo", num_envs=4, rollout_len=16, total_steps=4 * 16 * 3,
                         num_minibatches=2, update_epochs=2, hidden_sizes=(16, 16))
GOOD_LRS = (1e-4, 1e-3)


def _stack(hps):
    return jax.tree.map(lambda *x: jnp.stack(x), *hps)


def _close(a, b, **kw):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), **kw)


def _hps(lrs):
    good = [cj.default_hparams("ppo", lr=lr) for lr in lrs]
    # an absurd learning rate with no clipping blows the parameters up
    bad = cj.default_hparams("ppo", lr=1.0, max_grad_norm=1e30, vf_coef=1e30)
    return good, _stack(good + [bad])


@pytest.fixture(scope="module")
def trainer():
    env, p = envs_jax.make("CartPole-v1")
    return cj.Trainer(STATIC, env, p)


@pytest.fixture(scope="module")
def batched(trainer):
    traces = []

    def counted(key, hp):
        traces.append(1)
        return trainer.train(key, hp)

    fn = jax.jit(jax.vmap(counted))
    keys = jax.random.split(jax.random.PRNGKey(7), 3)
    good, hps = _hps(GOOD_LRS)
    states, metrics = fn(keys, hps)
    return dict(fn=fn, traces=traces, keys=keys, good=good, states=states, metrics=metrics)


@pytest.fixture(scope="module")
def solo(trainer):
    return jax.jit(trainer.train)


def test_vmapped_runs_equal_solo_runs(batched, solo):
    for i in (0, 1):
        state_i, metrics_i = solo(batched["keys"][i], batched["good"][i])
        _close(jax.tree.map(lambda x: x[i], batched["states"].params), state_i.params, rtol=2e-5, atol=2e-6)
        np.testing.assert_allclose(batched["metrics"]["episode_return"][i], metrics_i["episode_return"], rtol=1e-5)
    kernels = batched["states"].params["params"]["actor_out"]["kernel"]
    assert not np.allclose(kernels[0], kernels[1])  # the lr batch really differs


def test_diverged_run_is_frozen_and_flagged_others_unaffected(batched):
    states, metrics = batched["states"], batched["metrics"]
    assert np.asarray(states.diverged).tolist() == [False, False, True]
    assert metrics["diverged"][2, -1] == 1.0 and metrics["diverged"][:2].max() == 0.0
    # the diverged run keeps its last finite parameters
    assert all(np.isfinite(np.asarray(x[2])).all() for x in jax.tree.leaves(states.params))


def test_freeze_keeps_a_diverged_runs_policy_and_moves_the_rest_on():
    from coevo_jax.train import TrainState, freeze_diverged

    def state(v):
        f = jnp.full((3,), v, jnp.float32)
        return TrainState(params={"w": f}, opt_state=(f,), signal_state={"buffer": f}, rollout=f,
                          key=jnp.zeros(2, jnp.uint32), iteration=jnp.int32(5), diverged=jnp.bool_(False),
                          last_return=f[0], last_success=f[0])

    old, new = state(1.0), state(jnp.nan)
    for diverged in (True, False):
        out = freeze_diverged(old, new, jnp.bool_(diverged))
        assert int(out.iteration) == 6 and bool(out.diverged) == diverged
        policy = (out.params["w"], out.opt_state[0], out.last_return, out.last_success)
        # a diverged run keeps its last finite policy; a healthy one takes the new one
        assert all(np.isfinite(np.asarray(x)).all() == diverged for x in policy)
        # the signal's state and the rollout move on either way
        assert np.isnan(np.asarray(out.signal_state["buffer"])).all() and np.isnan(np.asarray(out.rollout)).all()


def test_batch_over_other_learning_rates_reuses_the_compile(batched):
    _, hps = _hps((3e-4, 5e-4))
    jax.block_until_ready(batched["fn"](batched["keys"], hps))
    assert len(batched["traces"]) == 1


def test_chunks_equal_one_call_and_jit_equals_no_jit(trainer, batched, solo):
    hp = batched["good"][0]
    key = batched["keys"][0]
    whole, m_whole = solo(key, hp)
    chunk = jax.jit(trainer.run_chunk, static_argnums=2)
    s = trainer.init(key, hp)
    ms = []
    for _ in range(STATIC.num_iterations):
        s, m = chunk(s, hp, 1)
        ms.append(m)
    _close(whole.params, s.params, rtol=1e-6, atol=1e-7)
    assert int(s.iteration) == 3
    assert np.concatenate([m["env_steps"] for m in ms]).tolist() == [64.0, 128.0, 192.0]
    # one iteration called without jit (op-by-op outside its inner scans) equals the jitted one
    s0 = trainer.init(key, hp)
    s_eager, m_eager = trainer.iteration(s0, hp)
    s_jit, m_jit = chunk(s0, hp, 1)
    _close(s_jit.params, s_eager.params, rtol=1e-4, atol=1e-5)
    assert float(m_eager["policy_loss"]) == pytest.approx(float(m_jit["policy_loss"][0]), rel=1e-3, abs=1e-5)


def test_metrics_have_iteration_axis_and_expected_keys(batched):
    for key in ("env_steps", "episode_return", "success_rate", "policy_loss", "value_loss", "entropy",
                "signal/updated", "diverged"):
        assert batched["metrics"][key].shape == (3, STATIC.num_iterations), key
