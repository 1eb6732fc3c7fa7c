"""The environment contract, for every registered environment (the gymnax
adapter's own tests are in ``test_adapters.py``)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from envs_jax import OPTIONAL_OUTPUTS, provides
from xla_options import OPT0

STEPS = 64
GYMNAX = ("CartPole", "Acrobot", "Mountain", "UmbrellaChain-bsuite", "DiscountingChain-bsuite", "MemoryChain-bsuite")  # adapted gymnax envs: no optional outputs
#: The MiniGrid names given the full contract; every MiniGrid program costs
#: seconds of XLA compile, so the others get :func:`test_contract_traced`.
MINIGRID_FULL = ("MiniGrid-Empty-5x5",)  # DoorKey-5x5: tests/test_minigrid.py
FULL = [n for n in envs_jax.registered() if not n.startswith("MiniGrid-") or n in MINIGRID_FULL]


def _random_run(env, params, key, steps=STEPS, num_envs=3, compiler_options=None):
    """One compiled program per env: vmapped random-policy rollouts. Returns the
    reset observations and the stacked ``(obs, next_obs, reward, terminated,
    truncated, final_obs)`` of every step, plus the first step's ``info``."""
    space = env.action_space(params)

    def run(key):
        k0, key = jax.random.split(key)
        obs0, state = env.reset(k0, params)

        def step(carry, k):
            obs, state = carry
            ka, ks = jax.random.split(k)
            obs2, state2, r, term, trunc, info = env.step(ks, state, space.sample(ka), params)
            return (obs2, state2), ((obs, obs2, r, term, trunc, info["final_observation"]), info)

        _, (out, infos) = jax.lax.scan(step, (obs0, state), jax.random.split(key, steps))
        return obs0, out, jax.tree.map(lambda x: x[0], infos)

    return jax.jit(jax.vmap(run), compiler_options=compiler_options)(jax.random.split(key, num_envs))


@pytest.mark.parametrize("name", FULL)
def test_contract(name):
    env, params = envs_jax.make(name)
    obs_space, act_space = env.observation_space(params), env.action_space(params)
    key = jax.random.PRNGKey(0)
    a = act_space.sample(key)
    assert bool(act_space.contains(a)) and not bool(act_space.contains(jnp.int32(act_space.n)))
    obs0, (cur, nxt, rew, term, trunc, final), info = _random_run(env, params, key, compiler_options=OPT0)
    assert obs0.shape[1:] == tuple(obs_space.shape) and obs0.dtype == obs_space.dtype
    assert rew.dtype == jnp.float32 and term.dtype == jnp.bool_ and trunc.dtype == jnp.bool_
    assert final.shape == cur.shape
    assert not bool(jnp.any(term & trunc)), "terminated and truncated both set"
    assert bool(jnp.all(jax.vmap(jax.vmap(obs_space.contains))(cur)))
    # final_obs equals the next observation unless the episode ended (then obs is a fresh reset)
    done = np.asarray(term | trunc)
    same = np.all(np.asarray(final == nxt).reshape(done.shape + (-1,)), axis=-1)
    assert same[~done].all()
    assert np.isfinite(np.asarray(rew)).all()
    # the optional info keys are exactly the declared ones
    assert set(env.optional_outputs) <= set(OPTIONAL_OUTPUTS)
    assert set(info) & set(OPTIONAL_OUTPUTS) == set(env.optional_outputs)
    assert env.optional_outputs == envs_jax.EpisodeStats(env).optional_outputs  # wrappers forward them
    _, state = env.reset(key, params)
    if provides(env, "legal_mask"):
        assert info["legal_mask"].shape[1:] == (act_space.n,) and info["legal_mask"].dtype == jnp.bool_
        assert env.legal_mask(state, params).shape == (act_space.n,)
    if provides(env, "dense_reward"):
        assert info["dense_reward"].dtype == jnp.float32
    if provides(env, "success"):
        assert info["success"].dtype == jnp.bool_
    if not name.startswith(GYMNAX):
        # the project's own envs: info keys for the baselines (of MiniGrid, only DoorKey is shaped), and a text drawing
        success_only = name.startswith("MiniGrid-") and not name.startswith("MiniGrid-DoorKey")
        assert ({"success"} if success_only else {"success", "dense_reward"}) <= set(env.optional_outputs)
        text = env.render(state, params)
        assert isinstance(text, str) and len(text) > 0


@pytest.mark.parametrize("name", [n for n in envs_jax.registered() if n not in FULL])
def test_contract_traced(name):
    """The other MiniGrid names: the contract's shapes, dtypes and info keys,
    from a traced (``jax.eval_shape``, not compiled) reset and step."""
    env, params = envs_jax.make(name)

    def run(key):
        obs, state = env.reset(key, params)
        return obs, env.step(key, state, env.action_space(params).sample(key), params)

    obs0, (obs, _, rew, term, trunc, info) = jax.eval_shape(run, jax.random.PRNGKey(0))
    space = env.observation_space(params)
    assert obs0.shape == obs.shape == info["final_observation"].shape == tuple(space.shape)
    assert obs0.dtype == obs.dtype == space.dtype
    assert rew.dtype == jnp.float32 and term.dtype == jnp.bool_ and trunc.dtype == jnp.bool_
    assert set(info) & set(OPTIONAL_OUTPUTS) == set(env.optional_outputs)
    assert "success" in env.optional_outputs and info["success"].dtype == jnp.bool_
    assert env.optional_outputs == envs_jax.EpisodeStats(env).optional_outputs


def test_provides_and_wrappers_forward_declarations():
    env, _ = envs_jax.make("TextMaze")
    assert all(provides(env, k) for k in OPTIONAL_OUTPUTS)
    delayed, _ = envs_jax.make("KeyDoor-5x5", reward_freq=3)
    stacked = envs_jax.EpisodeStats(delayed)
    assert stacked.optional_outputs == delayed.optional_outputs == ("dense_reward", "success")
    assert provides(stacked, "success") and not provides(stacked, "legal_mask")
    with pytest.raises(ValueError, match="unknown optional output 'reward'"):
        provides(env, "reward")


def test_delayed_reward_pays_same_total_every_d_steps():
    env, params = envs_jax.make("CartPole-v1", reward_freq=7)
    base, bparams = envs_jax.make("CartPole-v1")
    assert int(params.reward_freq) == 7
    key = jax.random.PRNGKey(4)

    def run(e, p, key, n=120):
        obs, state = e.reset(key, p)

        def step(c, k):
            obs, state = c
            obs, state, r, term, trunc, info = e.step(k, state, jnp.int32(0), p)
            return (obs, state), (r, term | trunc)

        return jax.lax.scan(step, (obs, state), jax.random.split(key, n))[1]

    assert provides(env, "dense_reward") and not provides(base, "dense_reward")  # the undelayed reward
    _, state = env.reset(key, params)
    info = env.step(key, state, jnp.int32(0), params)[-1]
    assert float(info["dense_reward"]) == float(info["undelayed_reward"]) == 1.0
    r_del, done_del = jax.jit(lambda k: run(env, params, k))(key)
    r_raw, done_raw = jax.jit(lambda k: run(base, bparams, k))(key)
    np.testing.assert_array_equal(done_del, done_raw)
    # per-episode totals match; payments only every 7 steps within an episode or at its end
    ends = np.flatnonzero(np.asarray(done_raw))
    start = 0
    for end in ends:
        assert np.isclose(r_del[start:end + 1].sum(), r_raw[start:end + 1].sum())
        paid = np.flatnonzero(np.asarray(r_del[start:end + 1]) != 0)
        assert all((i + 1) % 7 == 0 or i == end - start for i in paid)
        start = end + 1
    assert len(ends) >= 2


def test_delayed_reward_param_is_sweepable_under_vmap():
    env, params = envs_jax.make("CartPole-v1", reward_freq=5)
    freqs = jnp.array([1, 5, 50], jnp.int32)
    ps = jax.vmap(lambda f: params.replace(reward_freq=f))(freqs)

    def first_payment(p):
        obs, state = env.reset(jax.random.PRNGKey(0), p)
        obs, state, r, *_ = env.step(jax.random.PRNGKey(1), state, jnp.int32(0), p)
        return r

    r = jax.vmap(first_payment)(ps)
    assert np.asarray(r).tolist() == [1.0, 0.0, 0.0]


def test_unknown_env_name_lists_registered():
    with pytest.raises(ValueError, match="unknown environment 'Nope'; registered: .*CartPole-v1"):
        envs_jax.make("Nope")
    with pytest.raises(ValueError, match="reward_freq must be an integer >= 1"):
        envs_jax.make("CartPole-v1", reward_freq=0)


def test_episode_stats_wrapper_records_returns():
    env, params = envs_jax.make("CartPole-v1")
    wrapped = envs_jax.EpisodeStats(env)
    key = jax.random.PRNGKey(0)
    obs, state = wrapped.reset(key, params)
    total, ended = 0.0, None
    for t in range(200):
        obs, state, r, term, trunc, info = wrapped.step(jax.random.PRNGKey(t), state, jnp.int32(0), params)
        total += float(r)
        if bool(info["returned_episode"]):
            ended = t
            break
    assert ended is not None
    assert float(info["returned_episode_returns"]) == total
    assert int(info["returned_episode_lengths"]) == ended + 1
