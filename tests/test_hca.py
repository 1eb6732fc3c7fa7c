"""hca (return-conditional hindsight credit): with the exact hindsight distribution the credit's mean
given an action is that action's advantage Q(x, a) - V(x) and its mean under the policy is 0; where
the action does not change the return, h = pi and the credit is exactly 0; and a hindsight model fit
on the chain puts its credit on the choice, not on the steps where the action has no effect."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy.stats import norm

import coevo_jax as cj
from coevo_jax.episodes import discounted_to_go
from coevo_jax.registry import method_spec
from coevo_jax.signals.hca import HindsightNet, bayes_logits, hca_credit, hindsight_loss, hindsight_ratio
from coevo_jax.signals.q_advantage import taken
from test_q_advantage import _chain_episodes


def test_exact_hindsight_credit_is_the_advantage_and_has_mean_zero_under_the_policy():
    """A one-step bandit, returns Z | a ~ N(mu_a, 1) (overlapping), h(a | z) by Bayes: the Monte-Carlo
    mean of (1 - pi / h) Z for each action is mu_a - sum_b pi_b mu_b (the paper's identity); a formula
    with h / pi, or without Z, misses it."""
    pi, mu = np.array([0.5, 0.3, 0.2]), np.array([1.0, 0.0, -0.5])
    rng = np.random.default_rng(0)
    n = 400_000
    a = rng.choice(3, size=n, p=pi)
    z = mu[a] + rng.normal(size=n)
    joint = pi[None, :] * norm.pdf(z[:, None], mu[None, :], 1.0)
    h = joint / joint.sum(1, keepdims=True)
    c = np.asarray(hca_credit(jnp.asarray(pi[a]), jnp.asarray(h[np.arange(n), a]), jnp.asarray(z)))
    advantage = mu - pi @ mu
    for act in range(3):
        assert c[a == act].mean() == pytest.approx(advantage[act], abs=0.03), act
    assert c.mean() == pytest.approx(0.0, abs=0.02)


def test_where_the_action_changes_nothing_the_credit_is_zero_and_the_clip_bounds_the_ratio():
    k = jax.random.split(jax.random.key(0), 2)
    pi = jax.random.uniform(k[0], (5, 7), minval=0.05, maxval=1.0)
    z = 3.0 * jax.random.normal(k[1], (5, 7))
    np.testing.assert_allclose(hca_credit(pi, pi, z), 0.0, atol=1e-6)  # h = pi: the return says nothing
    assert float(hindsight_ratio(jnp.float32(0.5), jnp.float32(1e-9), 10.0)) == 10.0
    assert float(hca_credit(jnp.float32(0.5), jnp.float32(1e-9), jnp.float32(2.0), 10.0)) == pytest.approx(-18.0)


def test_bayes_form_follows_the_current_policy():
    """h = softmax(log pi + g): a flat g (the return says nothing about the action) gives h = pi and credit 0
    under any policy, not only the one the data came from; a g that favours an action raises h there by
    exactly its likelihood ratio."""
    k = jax.random.split(jax.random.key(3), 3)
    pi = jax.nn.softmax(2.0 * jax.random.normal(k[0], (6, 4)))
    flat = jnp.broadcast_to(jax.random.normal(k[1], (6, 1)), (6, 4))
    h = jax.nn.softmax(bayes_logits(pi, flat))
    np.testing.assert_allclose(h, pi, rtol=1e-5, atol=1e-7)
    action = jax.random.randint(k[2], (6,), 0, 4)
    np.testing.assert_allclose(hca_credit(taken(pi, action), taken(h, action), jnp.full((6,), 3.0)), 0.0, atol=1e-5)
    g = jnp.zeros((6, 4)).at[:, 1].set(jnp.log(3.0))  # P(z | a = 1) three times that of the others
    h = np.asarray(jax.nn.softmax(bayes_logits(pi, g)))
    want = np.asarray(pi) * np.array([1.0, 3.0, 1.0, 1.0])
    np.testing.assert_allclose(h, want / want.sum(-1, keepdims=True), rtol=1e-5)
    assert float(jax.nn.softmax(bayes_logits(jnp.array([0.5, 0.5, 0.0]), jnp.zeros(3)))[2]) < 1e-29


def test_hindsight_loss_counts_only_stored_steps():
    logits = jnp.log(jnp.array([[[0.5, 0.5], [0.25, 0.75], [0.5, 0.5]]]))
    action, mask = jnp.array([[0, 1, 1]]), jnp.array([[1.0, 1.0, 0.0]])
    assert float(hindsight_loss(logits, action, mask)) == pytest.approx(-(np.log(0.5) + np.log(0.75)) / 2, rel=1e-6)


HIDDEN, LR, STEPS = (32,), 1e-2, 300


def test_fitted_hindsight_credit_finds_the_choice_on_both_chains():
    """h (Bayes form over the acting uniform policy) fit by cross-entropy on (obs, return-to-go) -> action of
    2048 uniform-random episodes of the
    4-choice chain (the first action decides the outcome, 0.5-std noise follows): with pi uniform, the
    credit pays the correct choice and charges the wrong ones at the first step and pays (almost)
    nothing at the last step: at the choice at least 5x the last step, on both chains."""
    L = 6
    for hide_cue in (0, 1):
        E = 2048
        obs, action, reward = _chain_episodes(E, L, hide_cue, jax.random.key(hide_cue))
        z = discounted_to_go(reward, jnp.full((E,), L, jnp.int32), 1.0)
        mask = jnp.ones((E, L))
        net = HindsightNet(4, HIDDEN)
        params = net.init(jax.random.key(2), obs[0], z[0])
        behaviour = jnp.full((E, L, 4), 0.25)  # the random policy that acted
        tx = optax.adam(LR)
        opt = tx.init(params)

        def step(carry, _):
            params, opt = carry
            g = jax.grad(lambda p: hindsight_loss(bayes_logits(behaviour, net.apply(p, obs, z)), action, mask))(params)
            upd, opt = tx.update(g, opt)
            return (optax.apply_updates(params, upd), opt), None

        params, _ = jax.jit(lambda c: jax.lax.scan(step, c, None, STEPS)[0])((params, opt))
        h = taken(jax.nn.softmax(bayes_logits(behaviour, net.apply(params, obs, z))), action)
        credit = np.asarray(hca_credit(jnp.full((E, L), 0.25), h, z, 10.0))
        cue = np.argmax(np.asarray(obs[:, 0, :4]), -1)
        right = np.asarray(action[:, 0]) == cue
        at_choice, at_last = np.abs(credit[:, 0]).mean(), np.abs(credit[:, -1]).mean()
        assert credit[right, 0].mean() > 0.4 and credit[~right, 0].mean() < -0.1, hide_cue  # truth: +0.75, -0.25
        assert at_choice >= 5 * at_last, (hide_cue, at_choice, at_last)


def test_hca_is_registered_with_its_declared_range():
    spec = method_spec("hca")
    assert spec.off == {"beta_int": 0.0}
    hp = cj.default_hparams("hca")
    assert float(hp.signal.ratio_clip) == 10.0
    with pytest.raises(cj.ConfigError, match="ratio_clip"):
        cj.validate_hparams(cj.default_hparams("hca", ratio_clip=0.5))
