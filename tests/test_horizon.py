"""FixedHorizon: every episode lasts exactly H steps, the inner task's reward is
paid at step H, early task ends are absorbing.

The random-policy rollout and its reference (the inner env's ``step_env`` run
directly on the same keys and actions) are computed once per module.
``python tests/test_horizon.py`` prints the uniform-random success rates within
H on KeyDoor (not part of the test run).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import envs_jax
from envs_jax import EnvParams, EnvState, Environment, FixedHorizon, FixedHorizonState, provides
from envs_jax.core import Box, Discrete
from envs_jax.grid.keydoor import config_of, config_transitions, optimal_distances
from xla_options import OPT0

NAME = "KeyDoor-5x5"
H = 60  # long enough that some random episodes reach the goal early and are absorbed (checked below)
NUM_ENVS = 64
EPISODES = 3
GAMMA = 0.99  # KeyDoor's default shaping_gamma


# ----------------------------------------------------------------------------- shared rollouts
@pytest.fixture(scope="module")
def keydoor():
    return envs_jax.make(NAME, fixed_horizon=H)


@pytest.fixture(scope="module")
def inner_fns(keydoor):
    """Jitted, vmapped inner-env functions (time limit H): ``reset(keys, second)
    -> (obs, state, Phi)`` (``second``: use each key's second half, as the base
    class's auto-reset does) and ``step(keys, state, actions) -> (obs, state, reward,
    terminated, info, Phi(next))``, the key split as the base class's ``step`` does."""
    env, params = keydoor
    inner, iparams = env.unwrapped, params.env

    def reset(k, second):
        obs, state = inner.reset_env(jnp.where(second, jax.random.split(k)[1], k), iparams)
        return obs, state, inner.potential(state, iparams)

    def step(k, s, a):
        obs, state, r, term, info = inner.step_env(jax.random.split(k)[0], s, a, iparams)
        return obs, state, r, term, info, inner.potential(state, iparams)

    return jax.jit(jax.vmap(reset), compiler_options=OPT0), jax.jit(jax.vmap(step), compiler_options=OPT0)


def _shortest_path(state) -> list[int]:
    """Actions of a shortest path to the goal from one unbatched KeyDoor state,
    planned on the host model of the dynamics (breadth-first search)."""
    _, _, nxt = config_transitions(state)
    dist = optimal_distances(state)
    here = np.ravel_multi_index(config_of(state), dist.shape)
    dist = dist.reshape(-1)
    path = []
    while dist[here] > 0:
        path.append(int(np.argmin(dist[nxt[here]])))
        here = nxt[here, path[-1]]
    return path


@pytest.fixture(scope="module")
def inputs(keydoor, inner_fns):
    """Reset keys ``(N, 2)``, step keys ``(N, T, 2)`` and actions ``(N, T)`` int32
    (``T = EPISODES * H``): uniform random, except that env 0 first follows a
    shortest path to the goal (it then has to wait for step H); and that path's length."""
    env, _ = keydoor
    steps = EPISODES * H
    rng = np.random.default_rng(0)  # raw uint32 key data: no eager JAX ops to compile
    reset_keys = rng.integers(0, 2**32, (NUM_ENVS, 2), dtype=np.uint32)
    step_keys = rng.integers(0, 2**32, (NUM_ENVS, steps, 2), dtype=np.uint32)
    actions = rng.integers(0, env.num_actions, (NUM_ENVS, steps)).astype(np.int32)
    _, states, _ = inner_fns[0](reset_keys, np.zeros(NUM_ENVS, bool))
    path = _shortest_path(jax.tree.map(lambda x: x[0], states))
    assert 0 < len(path) < H
    actions[0, :len(path)] = path
    return reset_keys, step_keys, actions, len(path)


@pytest.fixture(scope="module")
def random_run(keydoor, inputs):
    """``EpisodeStats(env)`` under jit(vmap) on ``inputs``: the stacked ``(obs,
    reward, terminated, truncated, info)``, each ``(N, T, ...)``."""
    env, params = keydoor
    stats = envs_jax.EpisodeStats(env)
    reset_keys, step_keys, actions, _ = inputs

    def run(k0, ks, acts):
        _, state = stats.reset(k0, params)

        def body(state, x):
            k, a = x
            obs, state, r, term, trunc, info = stats.step(k, state, a, params)
            return state, (obs, r, term, trunc, info)

        return jax.lax.scan(body, state, (ks, acts))[1]

    return jax.tree.map(np.asarray, jax.jit(jax.vmap(run), compiler_options=OPT0)(reset_keys, step_keys, actions))


@pytest.fixture(scope="module")
def reference(inner_fns, inputs):
    """The inner env stepped with ``step_env`` on the same keys and actions, each
    episode until it terminates or reaches H (host-side bookkeeping). Per episode
    ``(N, EPISODES)``: totals of reward and dense reward, success, terminated, the
    step it ended (H if it did not), ``Phi(s_0)`` and ``Phi`` of its last state;
    ``last_obs`` ``(N, EPISODES, D)`` its last observation and ``reset_obs``
    ``(N, EPISODES + 1, D)`` each episode's first."""
    reset, step = inner_fns
    reset_keys, step_keys, actions, _ = inputs
    shape = (NUM_ENVS, EPISODES)
    ref = {k: np.zeros(shape) for k in ("reward", "dense", "phi0", "phi_last")}
    ref.update(success=np.zeros(shape, bool), terminated=np.zeros(shape, bool), end_step=np.full(shape, H))
    reset_obs, last_obs = [], []
    for e in range(EPISODES + 1):
        keys = reset_keys if e == 0 else step_keys[:, e * H - 1]
        obs, state, phi = jax.device_get(reset(keys, np.full(NUM_ENVS, e > 0)))
        reset_obs.append(obs)
        obs = np.array(obs)  # becomes the episode's last observation
        if e == EPISODES:
            break
        ref["phi0"][:, e] = phi
        alive = np.ones(NUM_ENVS, bool)
        for t in range(H):
            i = e * H + t
            obs_t, nxt, r, term, info, phi_t = jax.device_get(step(step_keys[:, i], state, actions[:, i]))
            ref["reward"][alive, e] += r[alive]
            ref["dense"][alive, e] += info["dense_reward"][alive]
            ref["success"][alive, e] |= info["success"][alive]
            ref["phi_last"][alive, e] = phi_t[alive]
            obs[alive] = obs_t[alive]
            state = jax.tree.map(lambda n, s: np.where(alive.reshape((-1,) + (1,) * (n.ndim - 1)), n, s), nxt, state)
            ended = alive & term
            ref["end_step"][ended, e] = t + 1
            ref["terminated"][ended, e] = True
            alive &= ~term
        last_obs.append(obs)
    ref["reset_obs"], ref["last_obs"] = np.stack(reset_obs, 1), np.stack(last_obs, 1)
    return ref


def _episodes(x):
    """``(N, EPISODES * H, ...)`` -> ``(N, EPISODES, H, ...)``."""
    return x.reshape((x.shape[0], EPISODES, H) + x.shape[2:])


# ----------------------------------------------------------------------------- episodes, reward, success
def test_every_episode_lasts_exactly_h_steps(random_run):
    obs, r, term, trunc, info = random_run
    step_in_episode = np.arange(EPISODES * H) % H
    assert not trunc.any(), "the base class's time limit fired"
    np.testing.assert_array_equal(term, np.broadcast_to(step_in_episode == H - 1, term.shape))
    assert (info["returned_episode_lengths"][:, H - 1::H] == H).all()
    assert info["returned_episode"].sum() == NUM_ENVS * EPISODES


def test_paid_reward_is_the_inner_episode_total_paid_at_h(random_run, reference):
    obs, r, term, trunc, info = random_run
    r = _episodes(r)
    assert (r[:, :, :-1] == 0).all(), "reward paid before step H"
    np.testing.assert_allclose(r[:, :, -1], reference["reward"], rtol=1e-6)
    # the run is informative: some episodes ended early (absorbed), most did not
    ended = reference["terminated"]
    assert 5 <= (reference["end_step"] < H).sum() and ended.sum() < ended.size // 2
    np.testing.assert_array_equal(ended, reference["success"])  # KeyDoor only ends at the goal
    # MiniGrid's 1 - 0.9 t / T with T = H: the inner time limit is the horizon
    np.testing.assert_allclose(r[:, :, -1][ended], 1 - 0.9 * reference["end_step"][ended] / H, rtol=1e-6)


def test_success_only_on_step_h_iff_the_task_was_solved(random_run, reference):
    obs, r, term, trunc, info = random_run
    success = _episodes(info["success"])
    assert not success[:, :, :-1].any()
    np.testing.assert_array_equal(success[:, :, -1], reference["success"])
    np.testing.assert_array_equal(info["returned_episode_success"][:, H - 1::H], reference["success"])


def test_final_obs_at_the_horizon_and_held_while_absorbed(random_run, reference):
    obs, r, term, trunc, info = random_run
    obs, final, phase = _episodes(obs), _episodes(info["final_observation"]), _episodes(info["phase"])
    # before H, final_obs is obs (no reset); at H it is the inner episode's last observation
    # and obs is the next episode's reset observation
    np.testing.assert_array_equal(final[:, :, :-1], obs[:, :, :-1])
    np.testing.assert_array_equal(final[:, :, -1], reference["last_obs"])
    np.testing.assert_array_equal(obs[:, :, -1], reference["reset_obs"][:, 1:])
    for n, e in zip(*np.nonzero(reference["end_step"] < H)):
        t_end = reference["end_step"][n, e]  # steps 1..H; index t_end - 1 is the step that ended the task
        held = final[n, e, t_end - 1:]
        np.testing.assert_array_equal(held, np.broadcast_to(reference["last_obs"][n, e], held.shape))
        assert (phase[n, e, t_end - 1:] == 2).all()  # the inner key "phase" is held at its final value


def test_dense_reward_telescopes_like_the_inner_episode(random_run, reference):
    obs, r, term, trunc, info = random_run
    dense, r = _episodes(info["dense_reward"]), _episodes(r)
    np.testing.assert_allclose(dense.sum(-1), reference["dense"], rtol=1e-5, atol=1e-5)
    # discounted shaping: gamma**T Phi(s_T) [not terminated] - Phi(s_0), T the inner episode's end
    discounted = ((dense - r) * GAMMA ** np.arange(H)).sum(-1)
    expected = np.where(reference["terminated"], 0.0, GAMMA ** H * reference["phi_last"]) - reference["phi0"]
    np.testing.assert_allclose(discounted, expected, rtol=1e-4, atol=1e-5)
    # while absorbed the shaping is 0 and on step H the dense reward is the payment (the goal has Phi = 0)
    for n, e in zip(*np.nonzero(reference["end_step"] < H)):
        t_end = reference["end_step"][n, e]
        assert (dense[n, e, t_end:-1] == 0).all() and dense[n, e, -1] == r[n, e, -1]


def test_scripted_goal_early_still_waits_for_h(keydoor, inputs, random_run):
    env, params = keydoor
    d = inputs[3]  # env 0 reaches the goal on step d of its first episode
    obs, r, term, trunc, info = jax.tree.map(lambda x: x[0, :H], random_run)
    assert not term[:-1].any() and term[-1] and not trunc.any()
    assert (r[:-1] == 0).all() and r[-1] == pytest.approx(1 - 0.9 * d / H)
    assert not info["success"][:-1].any() and info["success"][-1]
    assert (obs[d - 1:-1] == obs[d - 1]).all() and (info["final_observation"][-1] == obs[d - 1]).all()
    assert (obs[d - 2] != obs[d - 1]).any()  # it moved onto the goal on step d


def test_render_says_step_and_absorption(keydoor, inner_fns, inputs):
    env, params = keydoor
    _, states, _ = inner_fns[0](inputs[0], np.zeros(NUM_ENVS, bool))  # the shapes already compiled
    state = FixedHorizonState(time=jnp.int32(7), env_state=jax.tree.map(lambda x: x[0], states), obs=None,
                              absorbed=jnp.bool_(False), earned=jnp.float32(0.0), succeeded=jnp.bool_(False),
                              held_info={})
    text = env.render(state, params)
    assert text.startswith(env.unwrapped.render(state.env_state, params.env))
    assert text.endswith(f"step 7/{H}, running")
    absorbed = env.render(state.replace(absorbed=jnp.bool_(True), earned=jnp.float32(0.85)), params)
    assert absorbed.endswith(f"step 7/{H}, absorbed (task over, holding reward 0.850)")


# ----------------------------------------------------------------------------- a toy inner env
@struct.dataclass
class ToyState(EnvState):
    count: jax.Array


class Toy(Environment):
    """Action 1 pays 1 and counts; the third count ends the task (success);
    action 2 ends it with reward -1 and is illegal before the first count;
    action 3 forces the time limit (as the text envs do when their buffer is
    full). ``dense_reward`` = reward + 0.5; extra info key ``count``."""

    optional_outputs = ("dense_reward", "success", "legal_mask")
    name = "Toy"

    @property
    def default_params(self):
        return EnvParams(max_steps_in_episode=1000)

    def action_space(self, params=None):
        return Discrete(4)

    def observation_space(self, params=None):
        return Box(0, 1000, (2,), jnp.int32)

    def reset_env(self, key, params):
        state = ToyState(time=jnp.int32(0), count=jnp.int32(0))
        return jnp.stack([state.time, state.count]), state

    def legal_mask(self, state, params=None):
        return jnp.array([True, True, False, True]) | (state.count > 0)

    def step_env(self, key, state, action, params):
        count = state.count + (action == 1)
        time = jnp.where(action == 3, jnp.maximum(state.time + 1, params.max_steps_in_episode), state.time + 1)
        new = ToyState(time=time.astype(jnp.int32), count=count.astype(jnp.int32))
        reward = jnp.where(action == 1, 1.0, jnp.where(action == 2, -1.0, 0.0))
        success = count >= 3
        info = {"success": success, "dense_reward": reward + 0.5, "count": new.count,
                "legal_mask": self.legal_mask(new)}
        return jnp.stack([new.time, new.count]), new, reward, success | (action == 2), info


#: ``(horizon, actions)`` per toy run. Row 0: three rewards, absorbed after step 4,
#: then the trap on the second episode's step 2. Rows 1-3: the trap on step 1, then counting.
#: Row 4: the inner time limit forced on step 1.
TOY_RUNS = (
    (6, [1, 0, 1, 1, 1, 1, 1, 2, 1, 0, 0, 0]),
    (2, [2, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0]),
    (3, [2, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0]),
    (5, [2, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0]),
    (5, [3, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0]),
)


#: Raw key data: the reset key, then one per step.
TOY_KEYS = np.random.default_rng(1).integers(0, 2**32, (len(TOY_RUNS[0][1]) + 1, 2), dtype=np.uint32)


def _toy_run(env, params, actions):
    """``(obs, reward, terminated, truncated, info, inner state)`` stacked over
    ``actions`` ``(T,)`` from one reset, keys from :data:`TOY_KEYS`."""
    def body(state, xs):
        k, a = xs
        obs, state, r, term, trunc, info = env.step(k, state, a, params)
        return state, (obs, r, term, trunc, info, state.env_state)

    _, state = env.reset(TOY_KEYS[0], params)
    return jax.lax.scan(body, state, (TOY_KEYS[1:], actions))[1]


@pytest.fixture(scope="module")
def toy():
    """``(env, runs)``: :data:`TOY_RUNS` in one jit(vmap) over the horizon (a params leaf) and the actions."""
    env = FixedHorizon(Toy(), 6)
    horizons = np.array([h for h, _ in TOY_RUNS], np.int32)
    actions = np.array([a for _, a in TOY_RUNS], np.int32)
    run = jax.vmap(lambda h, a: _toy_run(env, env.default_params.replace(horizon=h), a))
    return env, jax.tree.map(np.asarray, jax.jit(run, compiler_options=OPT0)(horizons, actions))


def test_toy_accumulates_holds_info_and_masks(toy):
    env, (obs, r, term, trunc, info, inner) = toy
    params = env.default_params
    assert params.env.max_steps_in_episode == 6 and params.max_steps_in_episode == 6
    assert not trunc.any()
    info = {k: v[0] for k, v in info.items()}
    np.testing.assert_array_equal(r[0], [0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(term[0], [0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1])
    np.testing.assert_array_equal(info["success"], [0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(info["count"], [1, 1, 2, 3, 3, 3, 1, 1, 1, 1, 1, 1])  # held while absorbed
    np.testing.assert_allclose(info["dense_reward"], [.5, .5, .5, .5, 0, 3, .5, .5, 0, 0, 0, 0])
    np.testing.assert_array_equal(info["final_observation"][:, 0], [1, 2, 3, 4, 4, 4, 1, 2, 2, 2, 2, 2])
    # the inner state is frozen while absorbed (its clock too), and reset at each horizon
    np.testing.assert_array_equal(inner.time[0], [1, 2, 3, 4, 4, 0, 1, 2, 2, 2, 2, 0])
    np.testing.assert_array_equal(inner.count[0], [1, 1, 2, 3, 3, 0, 1, 1, 1, 1, 1, 0])
    # the legal mask: the inner one, all True while absorbed, the fresh episode's after the reset
    mask = info["legal_mask"]
    assert mask[:5].all() and mask[5].tolist() == [True, True, False, True]
    assert mask[6:11].all() and mask[11].tolist() == [True, True, False, True]


def test_toy_trap_pays_held_negative_reward_and_horizon_is_sweepable(toy):
    _, (obs, r, term, trunc, info, _) = toy
    np.testing.assert_array_equal(term[1:4, :6], [[0, 1, 0, 1, 0, 1], [0, 0, 1, 0, 0, 1], [0, 0, 0, 0, 1, 0]])
    # the trap's -1 is held until each horizon; with H = 3 the second episode counts to 3 and succeeds
    assert r[1, 1] == r[2, 2] == r[3, 4] == -1 and r[2, 5] == 3
    np.testing.assert_array_equal(info["success"][1:4, :6], [[0] * 6, [0, 0, 0, 0, 0, 1], [0] * 6])


def test_toy_inner_time_limit_ends_the_task_early(toy):
    _, (obs, r, term, trunc, info, inner) = toy
    np.testing.assert_array_equal(term[4, :6], [0, 0, 0, 0, 1, 0])
    assert not r[4, :5].any() and not info["success"][4].any() and not trunc[4].any()
    np.testing.assert_array_equal(info["count"][4, :6], [0, 0, 0, 0, 0, 1])  # the counting actions did nothing


def test_step_without_jit_matches_jit(toy):
    """Seven eager steps (through the first horizon and its reset) equal the jitted run."""
    env, runs = toy
    params = env.default_params
    _, state = env.reset(TOY_KEYS[0], params)
    for t, a in enumerate(TOY_RUNS[0][1][:7]):
        obs, state, r, term, trunc, info = env.step(TOY_KEYS[1 + t], state, np.int32(a), params)
        eager = (obs, r, term, trunc, info, state.env_state)
        jax.tree.map(lambda x, y: np.testing.assert_array_equal(x, y[0, t]), eager, runs)


# ----------------------------------------------------------------------------- construction
def test_make_and_wrapper_arguments(keydoor):
    env, params = keydoor
    assert isinstance(env, FixedHorizon) and env.name == f"{NAME}-Horizon{H}"
    assert params.max_steps_in_episode == params.horizon == params.env.max_steps_in_episode == H
    assert env.optional_outputs == env.unwrapped.optional_outputs and env.max_tokens_per_step is None
    assert repr(env.observation_space(params)) == repr(env.unwrapped.observation_space(params.env))
    assert env.action_space(params).n == 6 and not provides(env, "legal_mask")
    same, p2 = envs_jax.make(NAME, fixed_horizon=H, max_steps=H)
    assert p2.env.max_steps_in_episode == H
    delayed, p3 = envs_jax.make(NAME, fixed_horizon=40, reward_freq=7)
    assert isinstance(delayed, envs_jax.DelayedReward) and isinstance(delayed._env, FixedHorizon)
    assert p3.max_steps_in_episode == p3.env.horizon == p3.env.env.max_steps_in_episode == 40
    with pytest.raises(ValueError, match="max_steps=50 disagrees with fixed_horizon=40"):
        envs_jax.make(NAME, fixed_horizon=40, max_steps=50)
    for bad in (0, -3, 2.5, "ten"):
        with pytest.raises(ValueError, match="fixed_horizon must be an integer >= 1"):
            envs_jax.make(NAME, fixed_horizon=bad)
    with pytest.raises(ValueError, match="fixed_horizon must be an integer >= 1"):
        FixedHorizon(env.unwrapped, 0)
    with pytest.raises(ValueError, match="reset_env/step_env, which .* does not implement"):
        FixedHorizon(envs_jax.DelayedReward(env.unwrapped, 3), 10)


# The random success rate of a fixed-horizon task is measured by sweeps/random_success.py, e.g.
#   python sweeps/random_success.py --tasks "KeyDoor-5x5:fixed_horizon=40;KeyDoor-8x8:fixed_horizon=100"
