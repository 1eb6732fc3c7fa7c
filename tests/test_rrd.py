"""RRD (coevo_jax.signals.rrd): the random subsets are uniform and exactly sized, the
loss is the paper's (return decomposition when the subset is the whole episode), and
a proxy reward fit with it puts the credit of an outcome on the step that decided it."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

import coevo_jax as cj
from coevo_jax.signals.learned import regression_loss
from coevo_jax.signals.rrd import random_subsets, rrd_loss


def test_subsets_have_min_k_n_distinct_stored_steps_drawn_uniformly():
    mask = np.zeros((3, 6), np.float32)
    mask[0, :6], mask[1, :4], mask[2, :1] = 1, 1, 1
    draws = np.stack([np.asarray(random_subsets(jax.random.PRNGKey(i), jnp.asarray(mask), 3)) for i in range(2000)])
    np.testing.assert_array_equal(draws.sum(-1), np.broadcast_to([3, 3, 1], draws.shape[:2]))
    assert not draws[:, mask == 0].any()
    np.testing.assert_allclose(draws[:, 0, :].mean(0), 0.5, atol=0.04)  # each of 6 steps with probability 3/6
    np.testing.assert_allclose(draws[:, 1, :4].mean(0), 0.75, atol=0.04)


def test_loss_is_the_scaled_subset_sum_against_the_return_and_decomposition_on_the_whole_episode():
    r = jnp.array([[0.1, 0.2, 0.3, 0.4], [1.0, -1.0, 0.5, 0.0]])
    mask = jnp.array([[1, 1, 1, 1], [1, 1, 1, 0]], jnp.float32)
    subset = jnp.array([[0, 1, 0, 1], [1, 0, 0, 0]], jnp.float32)
    ret, valid = jnp.array([2.0, 0.0]), jnp.array([True, True])
    want = ((4 / 2 * 0.6 - 2.0) ** 2 + (3 / 1 * 1.0 - 0.0) ** 2) / 2
    np.testing.assert_allclose(float(rrd_loss(r, mask, subset, ret, valid)), want, rtol=1e-6)
    np.testing.assert_allclose(float(rrd_loss(r, mask, mask, ret, valid)), float(regression_loss(r, mask, ret, valid)),
                               rtol=1e-6)
    assert float(rrd_loss(r, mask, subset, ret, jnp.array([False, False]))) == 0.0


def fitted_table(subset: int, e: int = 2048, n: int = 8, a: int = 4) -> np.ndarray:
    """A tabular ``r_hat(step, action) [n, a]`` fit by the RRD loss with subsets of ``subset``
    steps on ``e`` episodes of ``n`` random actions whose return is 1 when the first action is 0."""
    actions = jax.random.randint(jax.random.PRNGKey(0), (e, n), 0, a)
    ret = (actions[:, 0] == 0).astype(jnp.float32)
    mask, valid = jnp.ones((e, n)), jnp.ones((e,), bool)
    opt = optax.adam(0.05)

    def step(carry, key):
        w, s = carry
        g = jax.grad(lambda w: rrd_loss(w[jnp.arange(n)[None], actions], mask, random_subsets(key, mask, subset), ret,
                                        valid))(w)
        u, s = opt.update(g, s)
        return (optax.apply_updates(w, u), s), None

    table = jnp.zeros((n, a))
    (table, _), _ = jax.lax.scan(step, (table, opt.init(table)), jax.random.split(jax.random.PRNGKey(1), 1500))
    return np.asarray(table)


def test_fitted_proxy_reward_credits_the_deciding_step():
    """The return is decided by the first action alone. Fit on the whole episode (subset = 8 of 8:
    return decomposition) r_hat pays the deciding choice (step 0, action 0) the whole outcome over
    the other actions; on subsets of 2 the paper's variance term (rewards within an episode pulled
    together) shrinks that gap, but it still stays at step 0: at least 5x any later step's gap,
    where actions have no effect (a subset that never held step 0 could not credit it)."""
    gaps = {}
    for k in (8, 2):
        table = fitted_table(k)
        gap = table[:, 0] - table[:, 1:].mean(-1)  # action 0 against the others, per step
        assert gap[0] >= 5 * np.abs(gap[1:]).max(), (k, gap)
        gaps[k] = gap[0]
    assert gaps[8] > 0.9 and 0.1 < gaps[2] < 0.5 * gaps[8], gaps


def test_rrd_is_registered_with_its_declared_range_and_replaces_the_reward_by_default():
    hp = cj.default_hparams("rrd")
    assert float(hp.signal.beta_ext) == 0.0 and float(hp.signal.beta_int) == 1.0 and int(hp.signal.rrd_subset) == 8
    import pytest

    with pytest.raises(cj.ConfigError, match="rrd_subset"):
        cj.validate_hparams(hp.replace(rrd_subset=0))
