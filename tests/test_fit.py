"""The fitting loop's traced step count (:func:`coevo_jax.fit.fit_traced_steps`)
and the compute-matched K it serves (``refit_steps_per_k``, a static option of the learned rewards)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

import coevo_jax as cj
import envs_jax
from coevo_jax.fit import fit, init_optimizer, make_optimizer
from coevo_jax.signals import PolicyView, make_signal
from test_signal_contract import STATIC, synthetic_trajectory, tiny_static
from xla_options import OPT0

X = jax.random.normal(jax.random.PRNGKey(0), (32, 3))
Y = X @ jnp.array([1.0, -2.0, 0.5]) + 0.3


def _loss(w, batch):
    x, y = batch
    err = x @ w[:3] + w[3] - y
    return jnp.mean(err**2), {"mse": jnp.mean(err**2)}


def _fit(w, steps, traced: bool):
    tx = make_optimizer(1.0, 0.05)
    count = jnp.int32(steps) if traced else steps
    return fit(_loss, w, init_optimizer(w), tx, lambda _: (X, Y), jax.random.PRNGKey(1), steps=count)


def test_traced_step_count_equals_the_static_loop_and_vmaps_per_run():
    w0 = jnp.zeros(4)
    run = jax.jit(lambda n: _fit(w0, n, True), compiler_options=OPT0)
    for n in (1, 3, 7):
        w_static, o_static, m_static = jax.jit(lambda: _fit(w0, n, False), compiler_options=OPT0)()
        w_traced, o_traced, m_traced = run(n)  # one program for every count
        np.testing.assert_allclose(w_traced, w_static, rtol=1e-6, atol=1e-7)
        assert int(_adam_count(o_traced)) == int(_adam_count(o_static)) == n  # Adam took exactly n steps
        np.testing.assert_allclose(m_traced["loss"], m_static["loss"][jnp.array([0, -1])], rtol=1e-6)
    # vmapped over counts: each run takes its own number of steps (the others are masked, not stepped)
    ws, opts, _ = jax.jit(jax.vmap(lambda n: _fit(w0, n, True)), compiler_options=OPT0)(jnp.array([1, 3, 7]))
    np.testing.assert_array_equal(_adam_count(opts), [1, 3, 7])
    np.testing.assert_allclose(ws[1], run(3)[0], rtol=1e-6, atol=1e-7)


def _adam_count(opt_state) -> np.ndarray:
    counts = [s.count for s in jax.tree.leaves(opt_state, is_leaf=lambda s: isinstance(s, optax.ScaleByAdamState))
              if isinstance(s, optax.ScaleByAdamState)]
    return np.asarray(counts[0])


def test_compute_matched_refit_takes_k_times_the_steps():
    """Under ``refit_steps_per_k`` one refit of R_phi (and of each potential member)
    takes ``steps x K`` Adam steps, so the steps per env step do not depend on K."""
    env, p = envs_jax.make("KeyDoor-5x5", max_steps=6)  # the buffers' rows (8) cover the time limit
    traj = synthetic_trajectory(5, env.observation_space(p).shape, env.action_space(p).n, heads=1,
                                hidden=STATIC.hidden_sizes[-1])
    for method, attr in (("coevo-regression", "reward_steps"), ("siop", "potential_steps")):
        for matched in (False, True):
            static = tiny_static(method).replace(refit_steps_per_k=matched)
            signal = make_signal(static, None, env, p)
            hp = cj.default_hparams(method, k=3)

            def refit(key):
                s = signal.init(key, traj, hp)
                s, _ = signal.observe(s, traj, hp, key)
                return signal.update(s, traj, PolicyView(None, None, None, hp.ppo.lr), hp, key)[0].opt_state

            count = _adam_count(jax.jit(refit, compiler_options=OPT0)(jax.random.PRNGKey(2)))
            assert np.all(count == getattr(static.signal, attr) * (3 if matched else 1)), (method, matched, count)


def test_shuffle_is_a_uniform_permutation_with_jaxs_round_rule():
    """Every one of the 24 orders of 4 items comes up 1/24 of the time (240,000 draws: each
    count within 5 standard deviations, ~98, of 10,000); large ``n`` are permutations too, and
    the rounds follow JAX's rule for the key bits left after the index."""
    from coevo_jax.fit import shuffle, shuffle_rounds

    out = np.asarray(jax.jit(jax.vmap(lambda k: shuffle(k, 4)))(jax.random.split(jax.random.PRNGKey(1), 240_000)))
    _, counts = np.unique(out @ np.array([64, 16, 4, 1]), return_counts=True)
    assert len(counts) == 24 and np.abs(counts - 10_000).max() < 500
    for n in (1, 2, 100, 512, 3000):
        np.testing.assert_array_equal(np.sort(np.asarray(shuffle(jax.random.PRNGKey(n), n))), np.arange(n))
    assert [shuffle_rounds(n) for n in (128, 512, 4096, 1 << 16)] == [1, 2, 2, 4]
    # the index bits never leak into the order: two keys give different orders of 512 items
    assert (np.asarray(shuffle(jax.random.PRNGKey(0), 512)) != np.asarray(shuffle(jax.random.PRNGKey(1), 512))).any()
