"""The xminigrid adapter (``envs_jax.minigrid``): registration, episode-end
semantics, ``final_observation``, success under a scripted expert, the DoorKey shaping,
the lean step against xminigrid's own, rendering and training.

Compiles dominate on a 2-core CPU, so the tests share two programs: one
rollout (``_run``: an expert on some envs, uniform-random actions on the
others, the state before every step recorded) and one replay of its steps
without resets (``_replay``: what needs the state a step reached, the shaping
at several gammas, and the lean step against xminigrid's own).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from envs_jax import minigrid as mg
from envs_jax import minigrid_grid as mgg
from xla_options import OPT0

NAME = "MiniGrid-DoorKey-5x5"
MAX_STEPS = 40  # short, so that random play times out often
N_EXPERT, N_RANDOM, STEPS = 6, 18, 160
GAMMAS = (0.99, 0.9, 1.0)  # the env's default shaping gamma, then two more for the shaping tests


# ----------------------------------------------------------------------------- helpers
def expert_action(inner) -> jax.Array:
    """Int32 ``()`` action of a greedy DoorKey expert on one xminigrid state: with
    the BFS distance map to the current sub-goal, interact with the sub-goal
    when facing it (pick up the key, toggle the door, step onto the goal),
    step forward when that shortens the distance, else turn (right if that
    faces a shorter path, else left)."""
    tiles = inner.grid[..., 0]
    phase = mgg.doorkey_phase(tiles, inner.agent.pocket)
    target = mgg.subgoal_cells(tiles, phase)
    dist = mgg.grid_distances(mgg.passable_cells(tiles) | target, target, tiles.size)
    steps = jnp.array([[-1, 0], [0, 1], [1, 0], [0, -1]])  # (dy, dx) per direction, as xminigrid
    pos, facing = inner.agent.position, inner.agent.direction
    ahead = pos + steps[facing]
    right = pos + steps[(facing + 1) % 4]
    here = dist[pos[0], pos[1]]
    interact = jnp.array([mgg.PICK_UP, mgg.TOGGLE, mgg.FORWARD])[phase]
    turn = jnp.where(dist[right[0], right[1]] < here, mgg.TURN_RIGHT, mgg.TURN_LEFT)
    forward = jnp.where(dist[ahead[0], ahead[1]] < here, mgg.FORWARD, turn)
    return jnp.where(target[ahead[0], ahead[1]], interact, forward).astype(jnp.int32)


def _obs_hash(obs: jax.Array) -> jax.Array:
    """Float32 ``()`` fingerprint of one observation (0/1 entries; distinct ones differ by >= 0.5)."""
    weights = jax.random.uniform(jax.random.key(0), obs.shape, jnp.float32, 0.5, 1.5)
    return jnp.dot(obs, weights)


@functools.lru_cache(maxsize=None)
def _program():
    """``(env, params, run)``: ``run(params)`` steps ``N_EXPERT`` expert and
    ``N_RANDOM`` random envs for ``STEPS`` steps through ``env.step`` and returns
    numpy arrays ``[N, STEPS]``, with the state before each step (one compile;
    params is an argument). What needs the state a step reached comes from
    :func:`_replay`, a second program without the costly reset."""
    env, params = envs_jax.make(NAME, max_steps=MAX_STEPS)

    def episode(key, use_expert, params):
        k0, key = jax.random.split(key)
        obs0, state0 = env.reset(k0, params)

        def step(carry, k):
            obs, state, length = carry
            ka, ks = jax.random.split(k)
            action = jnp.where(use_expert, expert_action(state.inner), env.action_space(params).sample(ka))
            obs2, nxt, r, term, trunc, info = env.step(ks, state, action, params)
            rec = dict(
                state=state, action=action, reward=r, term=term, trunc=trunc, success=info["success"],
                phase=info["phase"], shaping=info["dense_reward"] - r, length=length + 1, next_time=nxt.time,
                final_hash=_obs_hash(info["final_observation"]), obs_hash=_obs_hash(obs2),
                obs_in_space=env.observation_space(params).contains(obs2),
            )
            return (obs2, nxt, jnp.where(term | trunc, 0, length + 1)), rec

        return jax.lax.scan(step, (obs0, state0, jnp.int32(0)), jax.random.split(key, STEPS))[1]

    keys = jax.random.split(jax.random.key(3), N_EXPERT + N_RANDOM)
    use_expert = jnp.arange(N_EXPERT + N_RANDOM) < N_EXPERT
    batched = jax.jit(jax.vmap(episode, in_axes=(0, 0, None)), compiler_options=OPT0)
    return env, params, lambda p: jax.tree.map(np.asarray, batched(keys, use_expert, p))


@functools.lru_cache(maxsize=None)
def _run():
    env, params, run = _program()
    return run(params)


@functools.lru_cache(maxsize=None)
def _replay():
    """Every recorded ``(state, action)`` of :func:`_run` stepped again with
    ``step_env`` (no reset): the reached state's observation fingerprint and
    time, ``Phi`` before and after, the BFS distances, the shaping for each
    gamma of :data:`GAMMAS` (``shaping_<gamma>``), and whether the lean step
    equals xminigrid's generic ``step`` (``lean=False``). Numpy ``[N, STEPS]``."""
    import xminigrid

    env, params, _ = _program()
    rec = _run()
    generic = mg.from_xminigrid(*xminigrid.make(NAME), lean=False)
    size = params.inner.height * params.inner.width

    def one(state, action):
        lean = env.step_env(jax.random.key(0), state, action, params)
        ref = generic.step_env(jax.random.key(0), state, action, params)
        same = jnp.all(jnp.stack([jnp.all(a == b) for a, b in zip(jax.tree.leaves(lean), jax.tree.leaves(ref))]))
        obs, reached = lean[:2]
        shaping = {}
        for gamma in GAMMAS:
            _, _, r, _, info = env.step_env(jax.random.key(0), state, action, params.replace(shaping_gamma=gamma))
            shaping[f"shaping_{gamma}"] = info["dense_reward"] - r
        return dict(reached_hash=_obs_hash(obs), time=reached.time, same_as_generic=same, **shaping,
                    phi=env.potential(state, params), phi_reached=env.potential(reached, params),
                    dist=mgg.subgoal_distance(state.inner, size)[1],
                    dist_reached=mgg.subgoal_distance(reached.inner, size)[1])

    flat = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), (rec["state"], rec["action"]))
    out = jax.jit(jax.vmap(one), compiler_options=OPT0)(*flat)
    return jax.tree.map(lambda x: np.asarray(x).reshape(rec["action"].shape), out)


def _episodes(rec):
    """``(env index, start, end)`` of every complete episode (``end`` inclusive)."""
    out = []
    for i in range(rec["term"].shape[0]):
        start = 0
        for end in np.flatnonzero(rec["term"][i] | rec["trunc"][i]):
            out.append((i, start, end))
            start = end + 1
    return out


# ----------------------------------------------------------------------------- registration
def test_names_tiles_and_goals_match_xminigrid():
    import xminigrid
    from xminigrid.core import constants, goals

    assert mg.MINIGRID_NAMES == tuple(n for n in xminigrid.registered_environments() if n.startswith("MiniGrid"))
    assert set(mg.MINIGRID_NAMES) <= set(envs_jax.registered())
    assert [getattr(constants.Tiles, t.upper()) for t in mgg.TILES] == list(range(mgg.NUM_TILES))
    assert [getattr(constants.Colors, c.upper()) for c in mgg.COLORS] == list(range(mgg.NUM_COLORS))
    assert (constants.NUM_TILES, constants.NUM_COLORS) == (mgg.NUM_TILES, mgg.NUM_COLORS)
    assert set(np.asarray(constants.PICKABLE).tolist()) == set(mgg.PICKABLE)
    assert all(hasattr(goals, g) for g in mg.MINIGRID_GOALS.values())
    # the adapter types and the public adapter name
    assert envs_jax.adapters.from_xminigrid is mg.from_xminigrid
    env, _ = envs_jax.make("MiniGrid-Empty-5x5")
    assert type(env) is mg.MiniGridAdapter and env.optional_outputs == ("success",)
    assert type(envs_jax.make(NAME)[0]) is mg.MiniGridDoorKey


def test_import_does_not_load_xminigrid():
    """``import envs_jax`` stays cheap: no module of the package imports xminigrid
    at module level (importing it starts the XLA backend); only the factories
    and adapter methods do."""
    import ast
    import pathlib

    root = pathlib.Path(envs_jax.__file__).parent
    for path in root.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:  # module-level statements only
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "xminigrid" for n in names), f"{path} imports xminigrid"


# ----------------------------------------------------------------------------- episode ends
def test_time_limit_truncates_and_goal_terminates_never_both():
    rec = _run()
    term, trunc, length = rec["term"], rec["trunc"], rec["length"]
    assert not np.any(term & trunc)
    # truncated exactly when an episode reaches max_steps without terminating
    np.testing.assert_array_equal(trunc, (length == MAX_STEPS) & ~term)
    assert np.all(length <= MAX_STEPS) and np.array_equal(_replay()["time"], length)
    assert trunc[N_EXPERT:].sum() >= 20 and term[:N_EXPERT].sum() >= 20  # random play times out, the expert succeeds
    # DoorKey terminates only at the goal, with MiniGrid's reward; no other step pays
    np.testing.assert_array_equal(term, rec["success"])
    np.testing.assert_allclose(rec["reward"][term], 1 - 0.9 * length[term] / MAX_STEPS, rtol=1e-6)
    assert np.all(rec["reward"][~term] == 0.0)


def test_final_obs_is_the_pre_reset_observation():
    rec, rep = _run(), _replay()
    done = rec["term"] | rec["trunc"]
    np.testing.assert_allclose(rec["final_hash"], rep["reached_hash"], atol=1e-3)
    assert rec["obs_in_space"].all()
    np.testing.assert_allclose(rec["obs_hash"][~done], rep["reached_hash"][~done], atol=1e-3)
    # after an episode ends the returned obs belongs to a fresh episode (step 0), not to the state reached
    assert np.all(rec["next_time"][done] == 0)
    assert np.mean(np.abs(rec["obs_hash"][done] - rep["reached_hash"][done]) > 0.25) > 0.9


def test_expert_reaches_the_goal_every_episode():
    rec = _run()
    term, trunc = rec["term"][:N_EXPERT], rec["trunc"][:N_EXPERT]
    assert not trunc.any() and term.sum(axis=1).min() >= 5  # several successes per env, never a time-out
    assert rec["success"][:N_EXPERT].sum() == term.sum()


def test_lean_step_equals_xminigrid_step():
    """The adapter's lean step (one goal check, no rules) equals xminigrid's
    generic ``step`` on every recorded state and action, terminal ones included."""
    import xminigrid

    assert _program()[0].lean and not mg.from_xminigrid(*xminigrid.make(NAME), lean=False).lean
    assert _replay()["same_as_generic"].all() and _run()["term"].sum() >= 20


# ----------------------------------------------------------------------------- shaping
def test_shaping_telescopes_and_is_zero_at_terminal():
    gamma = 0.9
    rec, rep = _run(), _replay()
    # the shaping the rollout's env.step reported equals step_env's (the replay's) at the same gamma
    np.testing.assert_allclose(rec["shaping"], rep["shaping_0.99"], atol=1e-6)
    phi, phi_reached = rep["phi"].astype(np.float64), rep["phi_reached"].astype(np.float64)
    shaping, term, trunc = rep["shaping_0.9"].astype(np.float64), rec["term"], rec["trunc"]
    assert np.all(phi >= -1.0 - 1e-6) and np.all(phi <= 0.0)
    assert np.all(phi_reached[term] == 0.0)  # the goal state has Phi = 0 ...
    np.testing.assert_allclose(shaping[term], -phi[term], atol=1e-6)  # ... and the terminal step uses Phi(s') = 0
    np.testing.assert_allclose(shaping[trunc], gamma * phi_reached[trunc] - phi[trunc], atol=1e-6)
    assert np.all(phi_reached[trunc] < 0)  # a time-out keeps the potential of the state reached
    episodes = _episodes(rec)
    assert len(episodes) == term.sum() + trunc.sum()
    for i, start, end in episodes:
        total = np.sum(gamma ** np.arange(end + 1 - start) * shaping[i, start:end + 1])
        want = gamma ** (end + 1 - start) * phi_reached[i, end] * (not term[i, end]) - phi[i, start]
        assert total == pytest.approx(want, abs=2e-5)


def test_progress_steps_get_positive_shaping_turns_none_at_gamma_one():
    """With gamma = 1 the shaping is ``Phi(s') - Phi(s)``: positive on every
    step of the expert that moves closer or completes a sub-goal (its forward,
    pick-up and toggle steps), zero on its turns in place."""
    rec, rep = _run(), _replay()
    sl = slice(0, N_EXPERT)
    shaping, action = rep["shaping_1.0"][sl], rec["action"][sl]
    turns = np.isin(action, [mgg.TURN_RIGHT, mgg.TURN_LEFT])
    assert turns.sum() > 0 and np.isin(action[~turns], [mgg.FORWARD, mgg.PICK_UP, mgg.TOGGLE]).all()
    assert np.all(shaping[~turns] > 0)
    np.testing.assert_allclose(shaping[turns], 0.0, atol=1e-7)
    # forward steps shorten the BFS distance unless they complete a sub-goal (the last one ends the episode)
    moved = (action == mgg.FORWARD) & ~rec["term"][sl]
    assert np.all(rep["dist_reached"][sl][moved] == rep["dist"][sl][moved] - 1)
    # the sub-goal distance never exceeds the bound that normalises Phi
    max_dist = mgg.max_subgoal_distance(5, 5)
    assert rep["dist"].max() <= max_dist and rep["dist_reached"].max() <= max_dist
    assert set(np.unique(rec["phase"]).tolist()) == {0, 1, 2}


# ----------------------------------------------------------------------------- observation and render
def test_observation_encoding_and_render():
    env, params, _ = _program()
    inner = jax.tree.map(lambda x: x[0, 0], _run()["state"].inner)
    obs = np.asarray(mg.encode_obs(jnp.zeros((7, 7, 2), jnp.uint8), jnp.int32(2),
                                   jnp.array([mgg.KEY, 5], jnp.uint8)))
    assert obs.shape == (mg.obs_size(7),) == tuple(env.observation_space(params).shape) == (1254,)
    cells = obs[:49 * 25].reshape(7, 7, 25)
    assert np.all(cells[..., mgg.EMPTY] == 1) and np.all(cells[..., mgg.NUM_TILES] == 1) and cells.sum() == 98
    np.testing.assert_array_equal(obs[49 * 25: 49 * 25 + 4], [0, 0, 1, 0])  # facing down
    assert obs[-25 + mgg.KEY] == 1 and obs[-12 + 5] == 1 and obs[-25:].sum() == 2  # carrying a yellow key
    empty_pocket = np.asarray(mg.encode_obs(jnp.zeros((7, 7, 2), jnp.uint8), jnp.int32(0), jnp.zeros(2, jnp.uint8)))
    assert empty_pocket[-25:].sum() == 0
    rows = env.render(mg.MiniGridState(time=inner.step_num, inner=inner), params).split("\n")
    assert len(rows) == 5 + 2 and all(len(r) == 5 for r in rows[:5])
    grid = "".join(rows[:5])
    assert grid.count("K") == grid.count("L") == grid.count("G") == 1 and grid.count("#") == 16 + 2
    assert sum(grid.count(g) for g in "^>v<") == 1 and rows[5:] == ["carrying: nothing", "step: 0"]


# ----------------------------------------------------------------------------- training
def test_make_train_runs_on_doorkey_under_jit_vmap():
    import coevo_jax as cj

    env, params = envs_jax.make(NAME)
    static = cj.StaticConfig(method="dense", num_envs=2, rollout_len=8, total_steps=2 * 8 * 2,
                             num_minibatches=1, update_epochs=1, hidden_sizes=(8,))
    train = cj.make_train(static, env, params)
    hp = cj.default_hparams("dense")
    hps = jax.tree.map(lambda x: jnp.stack([x, x]), hp)
    states, metrics = jax.jit(jax.vmap(train), compiler_options=OPT0)(jax.random.split(jax.random.PRNGKey(0), 2), hps)
    assert metrics["policy_loss"].shape == (2, 2)
    assert all(np.isfinite(np.asarray(v)).all() for v in jax.tree.leaves((states.params, metrics)))
    assert not np.asarray(states.diverged).any()
