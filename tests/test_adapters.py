"""The gymnax adapter: both ``step`` signatures, terminated vs truncated, and
``info["final_observation"]`` holding the observation the step reached (not the reset one)."""
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from gymnax.environments import environment, spaces

import envs_jax
from envs_jax.adapters import from_gymnax


# ----------------------------------------------------------------------------- hand-written gymnax envs
@struct.dataclass
class WalkState:
    pos: jax.Array
    time: jax.Array


@struct.dataclass
class WalkParams:
    max_steps_in_episode: int = 4
    goal: int = 3


class Walk(environment.Environment):
    """gymnax 1.0 env: a walk on a line from 0; action 1 steps right, 0 stays;
    reaching ``goal`` terminates (reward 1). Observation ``[pos, time]``, so a
    reset one ``[0, 0]`` is told apart from any reached one."""

    @property
    def default_params(self):
        return WalkParams()

    def reset_env(self, key, params):
        state = WalkState(jnp.int32(0), jnp.int32(0))
        return self.obs(state), state

    def step_env(self, key, state, action, params):
        state = WalkState(state.pos + jnp.asarray(action, jnp.int32), state.time + 1)
        done = state.pos >= params.goal
        return self.obs(state), state, done.astype(jnp.float32), done, {}

    def obs(self, state):
        return jnp.stack([state.pos, state.time]).astype(jnp.float32)

    def action_space(self, params=None):
        return spaces.Discrete(2)


def old_step(env, key, state, action, params):
    """gymnax < 1.0 ``step``: five values, ``done`` includes the time limit and
    no final observation survives the auto-reset."""
    key_step, key_reset = jax.random.split(key)
    obs_st, state_st, reward, done, info = env.step_env(key_step, state, action, params)
    obs_re, state_re = env.reset_env(key_reset, params)
    state = jax.tree.map(lambda r, s: jnp.where(done, r, s), state_re, state_st)
    obs = jnp.where(done, obs_re, obs_st)
    return obs, state, reward, done, info


class OldWalk(Walk):
    """:class:`Walk` through the pre-1.0 API."""

    def step_env(self, key, state, action, params):
        obs, state, reward, done, info = super().step_env(key, state, action, params)
        return obs, state, reward, done | (state.time >= params.max_steps_in_episode), info

    def step(self, key, state, action, params=None):
        return old_step(self, key, state, action, self.default_params if params is None else params)


class OldStyle:
    """A gymnax 1.0 environment seen through the pre-1.0 API."""

    def __init__(self, env):
        self.env = env
        self.default_params = env.default_params

    def reset(self, key, params):
        return self.env.reset(key, params)

    def reset_env(self, key, params):
        return self.env.reset_env(key, params)

    def step_env(self, key, state, action, params):
        obs, state, reward, term, info = self.env.step_env(key, state, action, params)
        return obs, state, reward, term | self.env.is_truncated(state, params), info

    def step(self, key, state, action, params):
        return old_step(self, key, state, action, params)

    def action_space(self, params):
        return self.env.action_space(params)


def _rollout(env, actions, seed=0):
    """Eager steps of ``actions``; stacked numpy ``(obs, reward, term, trunc, final_obs)``."""
    params = env.default_params
    obs, state = env.reset(jax.random.PRNGKey(seed), params)
    out = []
    for t, a in enumerate(actions):
        obs, state, r, term, trunc, info = env.step(jax.random.PRNGKey(seed + 1 + t), state, jnp.int32(a), params)
        out.append((obs, r, term, trunc, info["final_observation"]))
    return [np.stack([np.asarray(o[i]) for o in out]) for i in range(5)]


# ----------------------------------------------------------------------------- tests
@pytest.mark.parametrize("cls", [Walk, OldWalk])
def test_final_obs_is_the_state_reached_on_time_out(cls):
    """Standing still for 4 steps: the 4th is a time-out whose ``final_observation`` is
    ``[0, 4]`` (the reached state), while ``obs`` is the reset ``[0, 0]``."""
    adapter = from_gymnax(cls())
    assert adapter._six == (cls is Walk)
    obs, r, term, trunc, final = _rollout(adapter, [0] * 6)
    assert term.tolist() == [False] * 6 and trunc.tolist() == [False, False, False, True, False, False]
    np.testing.assert_array_equal(final[3], [0.0, 4.0])
    np.testing.assert_array_equal(obs[3], [0.0, 0.0])
    np.testing.assert_array_equal(final[:3], obs[:3])  # no episode end: final_obs is obs
    np.testing.assert_array_equal(final[4:], [[0.0, 1.0], [0.0, 2.0]])  # a fresh episode


@pytest.mark.parametrize("cls", [Walk, OldWalk])
def test_final_obs_is_the_terminal_state(cls):
    obs, r, term, trunc, final = _rollout(from_gymnax(cls()), [1, 1, 1, 1])
    assert term.tolist() == [False, False, True, False] and not trunc.any()
    assert r.tolist() == [0.0, 0.0, 1.0, 0.0]
    np.testing.assert_array_equal(final[2], [3.0, 3.0])
    np.testing.assert_array_equal(obs[2:], [[0.0, 0.0], [1.0, 1.0]])


def test_done_at_the_time_limit():
    """Reaching the goal on the last allowed step: the 1.0 API says terminated;
    the old API cannot tell, and a ``done`` at the time limit counts as truncated."""
    params = WalkParams(max_steps_in_episode=3, goal=3)
    for cls, flags in ((Walk, (True, False)), (OldWalk, (False, True))):
        adapter = from_gymnax(cls(), params)
        obs, r, term, trunc, final = _rollout(adapter, [1, 1, 1])
        assert (bool(term[2]), bool(trunc[2])) == flags and not (term[:2] | trunc[:2]).any()
        np.testing.assert_array_equal(final[2], [3.0, 3.0])


def test_cartpole_time_out_final_obs_both_apis():
    """CartPole cut at 5 steps: both APIs agree step by step, and the time-out's
    ``final_observation`` is what the inner ``step_env`` reached, not the reset observation."""
    genv, gparams = gymnax.make("CartPole-v1")
    gparams = gparams.replace(max_steps_in_episode=5)
    new, old = from_gymnax(genv, gparams), from_gymnax(OldStyle(genv), gparams)
    assert new._six and not old._six
    actions = [t % 2 for t in range(12)]  # alternate pushes: the pole stays up
    o1, r1, te1, tr1, f1 = _rollout(new, actions, seed=2)
    o2, r2, te2, tr2, f2 = _rollout(old, actions, seed=2)
    assert not te1.any() and tr1.tolist() == [t % 5 == 4 for t in range(12)]
    for a, b in ((o1, o2), (r1, r2), (te1, te2), (tr1, tr2), (f1, f2)):
        np.testing.assert_allclose(a, b)
    # replay the first episode through the inner step_env: final_obs at the time-out is its last state
    obs, state = genv.reset(jax.random.PRNGKey(2), gparams)
    for t in range(5):
        key_step = jax.random.split(jax.random.PRNGKey(3 + t))[0]
        obs, state, *_ = genv.step_env(key_step, state, actions[t], gparams)
    np.testing.assert_allclose(f1[4], obs, rtol=1e-6)
    assert not np.allclose(o1[4], f1[4])  # the returned obs is the next episode's


def test_adapters_declare_no_optional_outputs():
    env, _ = envs_jax.make("CartPole-v1")
    assert env.optional_outputs == ()
    assert not any(envs_jax.provides(env, k) for k in envs_jax.OPTIONAL_OUTPUTS)


def test_bsuite_experiments_take_their_parameters_by_name():
    """bsuite's UmbrellaChain: ``chain_length`` is an env parameter (the episode ends after it), ``n_distractor``
    a constructor argument (the observation grows by it); the outcome (+-1 for the umbrella taken at the first
    step) is paid at the last step."""
    env, params = envs_jax.make("UmbrellaChain-bsuite", chain_length=7, n_distractor=3)
    assert env.observation_space(params).shape == (6,) and env.action_space(params).n == 2
    obs, state = env.reset(jax.random.PRNGKey(0), params)
    need = int(obs[0])
    for t in range(7):
        obs, state, r, term, trunc, info = env.step(jax.random.PRNGKey(t + 1), state, need if t == 0 else 1 - need,
                                                    params)
        assert bool(term) == (t == 6) and not bool(trunc)
    assert float(r) == 1.0  # the right umbrella, paid at the end (no distractor reward on the last step)
    env, params = envs_jax.make("MemoryChain-bsuite", memory_length=4)
    assert params.inner.memory_length == 4


@pytest.mark.parametrize("name, kwargs, length", [("UmbrellaChain-bsuite", {"chain_length": 5, "n_distractor": 2}, 5),
                                                  ("MemoryChain-bsuite", {"memory_length": 3}, 4)])
def test_bsuite_time_limit_is_the_chain_and_changes_no_step(name, kwargs, length):
    """The time limit is the chain (so a replay row holds an episode without padding), and under random actions
    over several episodes every output equals the same env at gymnax's own time limit (100 or 1000 steps)."""
    env, params = envs_jax.make(name, **kwargs)
    assert params.max_steps_in_episode == length == params.inner.max_steps_in_episode
    wide = params.replace(inner=params.inner.replace(max_steps_in_episode=1000), max_steps_in_episode=1000)

    def run(p):
        def step(carry, key):
            obs, state = carry
            k_act, k_step = jax.random.split(key)
            a = jax.random.randint(k_act, (), 0, env.action_space(p).n)
            obs, state, r, term, trunc, _ = env.step(k_step, state, a, p)
            return (obs, state), (obs, r, term, trunc)

        return jax.lax.scan(step, env.reset(jax.random.PRNGKey(0), p), jax.random.split(jax.random.PRNGKey(1), 4 * length))[1]

    short, long = run(params), run(wide)
    assert int(short[2].sum()) == 4 and not bool(short[3].any())  # four terminations, no truncation
    for a, b in zip(short, long):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
