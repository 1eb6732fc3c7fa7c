"""q-advantage: the credit has mean 0 under the policy, and a return model fit on the chain puts
its credit on the choice, not on the steps where the action has no effect (the property that a
time-invariant "action = cue" reward, or a reward of the state alone, breaks)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import envs_jax
from coevo_jax.episodes import discounted_to_go
from coevo_jax.signals.q_advantage import QNet, action_credit, policy_mean, q_loss, taken


def test_credit_has_mean_zero_under_the_policy_and_is_q_minus_its_mean():
    k = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(k[0], (5, 7, 4))
    probs = jax.nn.softmax(3.0 * jax.random.normal(k[1], (5, 7, 4)))
    action = jax.random.randint(k[2], (5, 7), 0, 4)
    c = action_credit(q, probs, action)
    want = np.take_along_axis(np.asarray(q), np.asarray(action)[..., None], -1)[..., 0] - (np.asarray(q) * np.asarray(probs)).sum(-1)
    np.testing.assert_allclose(c, want, rtol=1e-6, atol=1e-6)
    every = jnp.stack([action_credit(q, probs, jnp.full((5, 7), a)) for a in range(4)], -1)
    np.testing.assert_allclose((every * probs).sum(-1), 0.0, atol=1e-6)  # E_pi[c] = 0 at every h
    # a flat Q (the action changes nothing) pays nothing, whatever its level
    flat = jnp.broadcast_to(jax.random.normal(k[0], (5, 7, 1)), (5, 7, 4))
    np.testing.assert_allclose(action_credit(flat, probs, action), 0.0, atol=1e-6)
    assert policy_mean(q, probs).shape == (5, 7) and taken(q, action).shape == (5, 7)


def test_q_loss_counts_only_stored_steps():
    q = jnp.zeros((2, 3, 2))
    action, target = jnp.zeros((2, 3), jnp.int32), jnp.array([[1.0, 2.0, 99.0], [3.0, 99.0, 99.0]])
    mask = jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert float(q_loss(q, action, target, mask)) == pytest.approx(np.mean([1.0, 4.0, 9.0]))


def _chain_episodes(num_episodes: int, length: int, hide_cue: int, key):
    """Uniform-random episodes of the 4-choice chain: ``(obs [E, L, D], action [E, L], reward [E, L])``."""
    env, params = envs_jax.make("DelayedChain", num_choices=4, length=length, noise_std=0.5, hide_cue=hide_cue)

    def episode(k):
        k_reset, k_act, k_step = jax.random.split(k, 3)
        obs, state = env.reset(k_reset, params)
        actions = jax.random.randint(k_act, (length,), 0, 4)

        def body(carry, xs):
            obs, state = carry
            a, ks = xs
            nobs, state, r, _, _, _ = env.step(ks, state, a, params)
            return (nobs, state), (obs, r)

        _, (o, r) = jax.lax.scan(body, (obs, state), (actions, jax.random.split(k_step, length)))
        return o, actions, r

    return jax.jit(jax.vmap(episode))(jax.random.split(key, num_episodes))


HIDDEN, LR, STEPS = (32,), 1e-2, 300


def test_fitted_credit_finds_the_choice_on_both_chains():
    """On a chain whose first action alone decides the outcome and 0.5-std noise follows, Q fit to
    the return-to-go of 2048 random episodes pays the correct choice and charges the wrong ones at the
    first step, and pays (almost) nothing at the last step, where actions change nothing: the
    credit at the choice is at least 5x the credit at the last step, on the chain that shows the cue
    every step and on the memory chain that shows it only at the choice."""
    L = 6
    for hide_cue in (0, 1):
        E = 2048
        obs, action, reward = _chain_episodes(E, L, hide_cue, jax.random.key(hide_cue))
        target = discounted_to_go(reward, jnp.full((E,), L, jnp.int32), 1.0)
        mask = jnp.ones((E, L))
        net = QNet(4, HIDDEN)
        params = net.init(jax.random.key(2), obs[0])
        tx = optax.adam(LR)
        opt = tx.init(params)

        def step(carry, _):
            params, opt = carry
            g = jax.grad(lambda p: q_loss(net.apply(p, obs), action, target, mask))(params)
            upd, opt = tx.update(g, opt)
            return (optax.apply_updates(params, upd), opt), None

        params, _ = jax.jit(lambda c: jax.lax.scan(step, c, None, STEPS)[0])((params, opt))
        uniform = jnp.full((E, L, 4), 0.25)
        credit = np.asarray(action_credit(net.apply(params, obs), uniform, action))
        cue = np.argmax(np.asarray(obs[:, 0, :4]), -1)
        right = np.asarray(action[:, 0]) == cue
        at_choice = np.abs(credit[:, 0]).mean()
        at_last = np.abs(credit[:, -1]).mean()
        assert credit[right, 0].mean() > 0.5 and credit[~right, 0].mean() < -0.15, hide_cue  # truth: +0.75, -0.25
        assert at_choice >= 5 * at_last, (hide_cue, at_choice, at_last)
