"""The give-up action (envs_jax/give_up.py): ends the episode with reward 0, keeps the dense oracle exact."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax

GAMMA = 0.99


@pytest.fixture(scope="module")
def pair():
    inner, p_inner = envs_jax.make("KeyDoor-5x5", max_steps=30)
    env, params = envs_jax.make("KeyDoor-5x5", max_steps=30, give_up=True)
    return inner, p_inner, env, params


def test_give_up_twice_ends_the_episode_with_nothing(pair):
    inner, _, env, params = pair
    assert env.num_actions == inner.num_actions + 1 == 7 and env.name == "KeyDoor-5x5-GiveUp"
    obs, state = env.reset(jax.random.PRNGKey(0), params)
    step = jax.jit(lambda k, s, a: env.step(k, s, a, params))
    obs1, state1, r, term, trunc, info = step(jax.random.PRNGKey(1), state, 1)  # a move: the task goes on
    assert not bool(term) and int(state1.time) == 1
    phi = float(inner.potential(state1.env_state, params))
    # the first give-up only arms: nothing moves, the clock runs, shaping of a state that stays put
    obs2, state2, r, term, trunc, info = step(jax.random.PRNGKey(2), state1, env.give_up_action)
    assert not bool(term) and bool(state2.armed) and int(state2.time) == 2 and float(r) == 0.0
    np.testing.assert_array_equal(obs2, obs1)
    assert float(info["dense_reward"]) == pytest.approx((params.shaping_gamma - 1) * phi, rel=1e-5)
    # another action disarms
    _, state3, *_ = step(jax.random.PRNGKey(3), state2, 4)
    assert not bool(state3.armed)
    # twice in a row: the episode ends with reward 0, no success, shaping into a terminal state (-Phi)
    _, state4, *_ = step(jax.random.PRNGKey(4), state3, env.give_up_action)
    _, state5, r, term, trunc, info = step(jax.random.PRNGKey(5), state4, env.give_up_action)
    assert bool(term) and not bool(trunc) and float(r) == 0.0 and not bool(info["success"])
    np.testing.assert_array_equal(info["final_observation"], obs1)  # the current observation, not a stepped one
    assert int(state5.time) == 0 and not bool(state5.armed)  # auto-reset
    assert float(info["dense_reward"]) == pytest.approx(-phi) and -phi > 0  # Phi < 0 away from the goal


def test_other_actions_are_the_inner_env_exactly(pair):
    inner, p_inner, env, params = pair
    keys = jax.random.split(jax.random.PRNGKey(3), 40)
    actions = jax.random.randint(jax.random.PRNGKey(4), (40,), 0, 6)
    _, s_in = inner.reset(jax.random.PRNGKey(5), p_inner)
    _, s_gu = env.reset(jax.random.PRNGKey(5), params)
    for k, a in zip(keys, actions):
        o1, s_in, r1, t1, tr1, i1 = inner.step(k, s_in, a, p_inner)
        o2, s_gu, r2, t2, tr2, i2 = env.step(k, s_gu, a, params)
        np.testing.assert_array_equal(o1, o2)
        assert (float(r1), bool(t1), bool(tr1)) == (float(r2), bool(t2), bool(tr2))
        assert sorted(i1) == sorted(i2)
        for name in i1:
            np.testing.assert_array_equal(i1[name], i2[name], err_msg=name)


def test_dense_return_telescopes_with_give_ups(pair):
    """Random episodes (arming, disarming) that end by giving up or at the goal: sum_t gamma^t (dense - r) = -Phi(s_0), as for
    the inner env's own successful episodes (potential shaping with Phi(terminal) = 0)."""
    _, _, env, params = pair
    params = params.replace(shaping_gamma=GAMMA)

    def episode(key):
        k0, k1 = jax.random.split(key)
        _, s0 = env.reset(k0, params)

        def body(carry, k):
            s, alive, acc, disc = carry
            ka, ks = jax.random.split(k)
            a = jnp.where(jax.random.uniform(ka) < 0.4, env.give_up_action, jax.random.randint(ka, (), 0, 6))
            _, s2, r, term, trunc, info = env.step(ks, s, a, params)
            acc = acc + alive * disc * (info["dense_reward"] - r)
            done = jnp.logical_or(term, trunc)
            return (s2, alive * (1.0 - done), acc, disc * GAMMA), (done, term)

        (_, _, acc, _), (done, term) = jax.lax.scan(body, (s0, 1.0, 0.0, 1.0), jax.random.split(k1, 30))
        return acc, env.potential(s0.env_state, params), done, term

    acc, phi0, done, term = jax.jit(jax.vmap(episode))(jax.random.split(jax.random.PRNGKey(7), 256))
    ended_by_term = np.asarray(term).any(1) & (np.argmax(np.asarray(done), 1) == np.argmax(np.asarray(term), 1))
    # episodes that terminated (goal or give-up) within the limit: the sum is exactly -Phi(s_0)
    np.testing.assert_allclose(np.asarray(acc)[ended_by_term], -np.asarray(phi0)[ended_by_term], atol=1e-5)
    assert ended_by_term.sum() > 100


def test_give_up_must_be_a_bool():
    with pytest.raises(ValueError, match="give_up must be True or False"):
        envs_jax.make("KeyDoor-5x5", give_up="yes")
