"""The environments have gymnax 1.0's interface: gymnax's own wrappers run on them unchanged,
and PureJaxRL's unmodified ``ppo.py`` (tests/anchors/purejaxrl, Apache-2.0) trains on them
through the one adapter it needs for gymnax's own CartPole (``envs_jax.adapters.FiveValueStep``)."""
import importlib.util
import os
import sys
import types

import gymnax
import jax
import numpy as np
import pytest
from gymnax.environments import spaces
from gymnax.wrappers.purerl import FlattenObservationWrapper, LogWrapper, StickyActionWrapper

import envs_jax
from envs_jax.adapters import FiveValueStep

ANCHOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "anchors", "purejaxrl")
TASKS = {  # one grid task, the credit task, a MiniGrid task and a text task
    "KeyDoor-5x5": {"max_steps": 12},
    "DelayedChain": {"length": 6},
    "MiniGrid-DoorKey-5x5": {"max_steps": 12},
    "Booking-Turns": {},
}
N, T = 4, 30  # envs, steps: every task ends episodes within T steps


def _run(env, params, actions, key):
    """Jitted ``T`` steps of ``N`` envs under fixed ``actions [T, N]``: stacked step outputs."""
    def one(k, acts):
        obs, state = env.reset(k, params)

        def body(carry, a):
            state, k = carry
            k, sub = jax.random.split(k)
            out = env.step(sub, state, a, params)
            return (out[1], k), (out[0], out[2], out[3], out[4], out[5])

        return jax.lax.scan(body, (state, k), acts)[1]

    return jax.jit(jax.vmap(one, in_axes=(0, 1)))(jax.random.split(key, N), actions)


@pytest.mark.parametrize("name", TASKS)
def test_gymnax_wrappers_run_unchanged(name):
    env, params = envs_jax.make(name, **TASKS[name])
    assert int(params.max_steps_in_episode) >= 1  # gymnax's field name (its base reads it for truncation)
    assert isinstance(env.action_space(params), spaces.Discrete) and isinstance(env.observation_space(params), spaces.Box)
    n = env.action_space(params).n
    acts = jax.random.randint(jax.random.key(1), (T, N), 0, n)
    key = jax.random.key(0)

    obs, rew, term, trunc, info = _run(env, params, acts, key)
    assert bool((term | trunc).any()), "no episode ended: the test would check nothing"
    np.testing.assert_array_equal(info["terminated"], term)
    np.testing.assert_array_equal(info["truncated"], trunc)
    done = np.asarray(term | trunc)
    np.testing.assert_array_equal(np.asarray(info["final_observation"])[~done], np.asarray(obs)[~done])

    # FlattenObservationWrapper + LogWrapper: same transitions, flattened observations, and
    # LogWrapper's episode returns equal the sums of the rewards between episode ends
    logged = LogWrapper(FlattenObservationWrapper(env))
    f_obs, f_rew, f_term, f_trunc, f_info = _run(logged, params, acts, key)
    np.testing.assert_array_equal(f_rew, rew)
    np.testing.assert_array_equal(f_term, term)
    np.testing.assert_array_equal(np.asarray(f_obs), np.asarray(obs).reshape(N, T, -1))
    np.testing.assert_array_equal(np.asarray(f_info["final_observation"]),
                                  np.asarray(info["final_observation"]).reshape(N, T, -1))
    r, want = np.asarray(rew), []
    for i in range(N):
        total = 0.0
        for t in range(T):
            total += r[i, t]
            if done[i, t]:
                want.append(total)
                total = 0.0
    np.testing.assert_allclose(np.asarray(f_info["returned_episode_returns"])[done], want, rtol=1e-6)

    # StickyActionWrapper: probability 0 changes nothing; probability 1 replays its initial action 0 forever
    _, s_rew, s_term, _, _ = _run(StickyActionWrapper(env, 0.0), params, acts, key)
    np.testing.assert_array_equal(s_rew, rew)
    np.testing.assert_array_equal(s_term, term)
    executed = _executed_actions(StickyActionWrapper(env, 1.0), params, acts, key)
    assert (np.asarray(acts) != 0).any() and (executed == 0).all()


def _executed_actions(env, params, actions, key):
    """The action a :class:`StickyActionWrapper` executed at each step, ``[N, T]``."""
    def one(k, acts):
        _, state = env.reset(k, params)

        def body(state, a):
            state = env.step(k, state, a, params)[1]
            return state, state.last_action

        return jax.lax.scan(body, state, acts)[1]

    return np.asarray(jax.jit(jax.vmap(one, in_axes=(0, 1)))(jax.random.split(key, N), actions))


def _purejaxrl_ppo():
    """PureJaxRL's ppo.py as published. Its wrappers.py imports brax and navix at the top
    (for wrapper classes ppo.py never uses); neither is a dependency, so empty modules stand in."""
    for name in ("brax", "brax.envs", "brax.envs.wrappers", "brax.envs.wrappers.training", "navix"):
        if name not in sys.modules:
            mod = types.ModuleType(name)
            mod.__path__ = []
            sys.modules[name] = mod
    sys.modules["brax"].envs = sys.modules["brax.envs"]
    training = sys.modules["brax.envs.wrappers.training"]
    training.EpisodeWrapper = training.AutoResetWrapper = None
    sys.path.insert(0, ANCHOR)  # ppo.py does `from wrappers import ...`
    try:
        spec = importlib.util.spec_from_file_location("purejaxrl_ppo", os.path.join(ANCHOR, "ppo.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(ANCHOR)
    return mod


@pytest.mark.parametrize("name,kwargs,steps,lr,floor", [
    ("CartPole-v1", None, 32_768, 1e-3, 150.0),  # gymnax's own env, the adapter's reference use: 29 -> 215
    ("KeyDoor-5x5", {"max_steps": 60}, 32_768, 3e-3, 0.4),  # random ~0.03 per episode; 0.02 -> 0.75
])
def test_purejaxrl_ppo_trains_through_the_cartpole_adapter(monkeypatch, name, kwargs, steps, lr, floor):
    ppo = _purejaxrl_ppo()
    gymnax_make = gymnax.make

    def make(env_id, **kw):  # what ppo.py calls: the named env, behind the five-value step
        env, params = gymnax_make(env_id, **kw) if kwargs is None else envs_jax.make(env_id, **kwargs)
        return FiveValueStep(env), params

    monkeypatch.setattr(gymnax, "make", make)
    config = {"LR": lr, "NUM_ENVS": 4, "NUM_STEPS": 128, "TOTAL_TIMESTEPS": steps, "UPDATE_EPOCHS": 4,
              "NUM_MINIBATCHES": 4, "GAMMA": 0.99, "GAE_LAMBDA": 0.95, "CLIP_EPS": 0.2, "ENT_COEF": 0.01,
              "VF_COEF": 0.5, "MAX_GRAD_NORM": 0.5, "ACTIVATION": "tanh", "ENV_NAME": name, "ANNEAL_LR": True,
              "DEBUG": False}
    metrics = jax.jit(ppo.make_train(config))(jax.random.key(0))["metrics"]
    returns, ended = np.asarray(metrics["returned_episode_returns"]), np.asarray(metrics["returned_episode"])
    tenth = returns.shape[0] // 10
    first, last = returns[:tenth][ended[:tenth]].mean(), returns[-tenth:][ended[-tenth:]].mean()
    assert last >= floor and last > 2 * first, (first, last)
