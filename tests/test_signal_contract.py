"""The reward-method contract, for every registered built-in method (as
``test_env_contract.py`` is for environments).

On one tiny config and one synthetic ``[T, N]`` trajectory (random episode
ends, sparse rewards): ``init -> observe -> update -> rewards`` give ``[T, N]``
streams, an intrinsic stream exactly when the spec says so, scalar metrics,
finite values and a state of unchanged structure (a ``lax.scan`` carry); a
non-trivial ``observe`` / ``update`` really changes the state; jit equals no
jit for ``observe`` and ``rewards``, the per-iteration bookkeeping and the
rewards PPO optimises (``init`` and the refits are left out: eagerly, every
one of their ops compiles on its own, for tens of seconds, and their fitting
loops are ``lax.scan`` s compiled either way); ``vmap`` over two keys equals
the solo passes; under the spec's ``off`` overrides the advantages are sparse
PPO's bit for bit (and for one single-stream method per refit machinery a
whole short training run is PPO's, for two values of K from one compiled
program); ``K`` is traced: one
trace of ``train`` serves every K (and ``hp`` is a traced argument of every
compiled pass here).

Compile time dominates on a 2-core CPU: every program is compiled once (module
cache) at XLA's lowest backend optimisation level, and a method whose programs
the runner shares with another's (``dense`` with ``ppo``, ``coevo-ranking`` with
``coevo-regression``) runs on that method's executables, as in a study.
"""
import functools
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import coevo_jax as cj
import envs_jax
from coevo_jax.config import static_fields
from coevo_jax.ppo import init_optimizer, stream_advantages
from coevo_jax.rollout import Trajectory
from coevo_jax.signals import PolicyView, base
from xla_options import OPT0

# the built-ins (a test's own methods register later, in fixtures); cue-bonus reads DelayedChain's cue and
# refuses other envs (tests/test_placebo.py checks it on the chain)
METHODS = tuple(m for m in cj.registered_methods() if m != "cue-bonus")
T, N = 8, 4
CORE = dict(num_envs=N, rollout_len=T, total_steps=N * T * 3, num_minibatches=2, update_epochs=1, hidden_sizes=(8,))
#: every method's static options at a tiny size (each method takes those it has)
OPTIONS = dict(reward_hidden=(8,), action_embed_dim=4, reward_steps=2, buffer_episodes=4, max_episode_len=8,
               potential_hidden=(8,), potential_steps=2, potential_buffer_episodes=4, potential_episode_len=8,
               icm_feature_dim=4)


def tiny_static(method: str) -> cj.StaticConfig:
    own = static_fields(method)
    return cj.static_config(method, **CORE, **{k: v for k, v in OPTIONS.items() if k in own})


STATIC = tiny_static("ppo")
KEYS = jax.random.split(jax.random.PRNGKey(1), 2)


def _compile(fn, *args):
    return jax.jit(fn).lower(*args).compile(OPT0)


def _compile_concurrently(*lowered):
    """Compile lowered programs two at a time (XLA releases the GIL: both cores work)."""
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda low: low.compile(OPT0), lowered))


def _leaves_equal(a, b) -> bool:
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _close(a, b, rtol=1e-5, atol=1e-6):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def synthetic_trajectory(seed: int, obs_shape, num_actions: int, heads: int, hidden: int) -> Trajectory:
    """A ``[T, N]`` trajectory with random observations, actions, values and
    features, episodes ending at random (terminated or truncated) and a sparse
    reward on terminated steps (numpy: nothing to compile)."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    obs = (rng.random((T + 1, N) + tuple(obs_shape)) < 0.3).astype(f32)
    done = rng.random((T, N)) < 0.3
    term = done & (rng.random((T, N)) < 0.6)
    reward = np.where(term, rng.uniform(0.2, 1.0, (T, N)), 0.0).astype(f32)
    vshape = (T, N, heads)  # values [T, N, V]
    traj = Trajectory(
        obs=obs[:-1], action=rng.integers(0, num_actions, (T, N)).astype(np.int32),
        logp=np.full((T, N), -np.log(num_actions), f32), value=(0.1 * rng.standard_normal(vshape)).astype(f32),
        features=rng.standard_normal((T, N, hidden)).astype(f32), reward=reward,
        dense_reward=(reward + 0.01 * rng.standard_normal((T, N))).astype(f32), terminated=term,
        truncated=done & ~term, next_obs=obs[1:], next_value=(0.1 * rng.standard_normal(vshape)).astype(f32),
        episode_done=done, episode_return=np.where(done, reward + 0.5, 0.0).astype(f32),
        episode_length=np.where(done, 5.0, 0.0).astype(f32), episode_success=np.where(term, 1.0, 0.0).astype(f32),
        probs=rng.dirichlet(np.ones(num_actions), (T, N)).astype(f32),
    )
    traj = traj._replace(cont_value=traj.next_value)  # next_obs = obs[t+1]: the env continues from it
    return jax.tree.map(jnp.asarray, traj)


def episodic_view(traj: Trajectory) -> Trajectory:
    """The trajectory as a one-critic policy sees it (the first value head, values ``[T, N, 1]``)."""
    return traj._replace(value=traj.value[..., :1], next_value=traj.next_value[..., :1],
                         cont_value=traj.cont_value[..., :1])


def signal_pass(signal, network, key, traj, params, opt_state, hp):
    """``init -> observe -> update -> rewards`` on one trajectory. Returns
    ``(states (s0, s1, s2, s3), streams, metrics (observe, update, rewards))``."""
    k0, k1, k2 = jax.random.split(key, 3)
    s0 = signal.init(k0, traj, hp)
    s1, m_obs = signal.observe(s0, traj, hp, k1)
    s2, m_upd = signal.update(s1, traj, PolicyView(network, params, opt_state, hp.ppo.lr), hp, k2)
    s3, streams, m_rew = signal.rewards(s2, traj, hp)
    return (s0, s1, s2, s3), streams, (m_obs, m_upd, m_rew)


def advantages(signal, state, traj, hp):
    """The advantages the loop's PPO update would use for ``signal``'s rewards ``[T, N]``."""
    return stream_advantages(signal.rewards(state, traj, hp)[1], traj, hp)[0]


@pytest.fixture(scope="module")
def env():
    env, p = envs_jax.make("KeyDoor-5x5")
    return env, p.replace(max_steps_in_episode=6)  # short episodes: every rollout completes some, so refits have data


@pytest.fixture(scope="module")
def policies(env):
    """Per number of value heads: ``(network, params, opt_state, traj)``."""
    env, p = env
    out = {}
    for heads, method in ((1, "ppo"), (2, "icm")):
        static = tiny_static(method)
        net = cj.make_policy_network(static, env, p)
        traj = synthetic_trajectory(heads, env.observation_space(p).shape, env.action_space(p).n, heads,
                                    static.hidden_sizes[-1])
        params = _compile(net.init, KEYS[0], traj.obs[0])(KEYS[0], traj.obs[0])
        out[heads] = (net, params, init_optimizer(params), traj)
    return out


@functools.lru_cache(maxsize=None)
def _program_owners() -> dict:
    """Each method -> the first registered method whose compiled programs it runs on, by the
    runner's own rule (:func:`coevo_jax.experiment.worker.program_key`; ``dense`` runs on
    ``ppo``'s programs, ``coevo-ranking`` on ``coevo-regression``'s); one plan for all methods."""
    from coevo_jax.experiment import Arm, Study, build_plan
    from coevo_jax.experiment.worker import program_key

    study = Study("KeyDoor-5x5", tuple(Arm(tiny_static(m)) for m in METHODS), num_seeds=2)
    keys = [program_key(plan, 2) for plan in build_plan(study, check_trainers=False)]
    return {m: METHODS[keys.index(k)] for m, k in zip(METHODS, keys)}


def program_owner(method: str) -> str:
    """The registered method whose compiled programs ``method`` runs on (see ``_program_owners``)."""
    return _program_owners()[method]


_CACHE: dict = {}


@pytest.fixture(scope="module")
def passes(env, policies):
    """``passes(method)``: the method's signal and its solo / vmapped / off runs, computed once
    (a method runs on its :func:`program_owner`'s compiled programs, with its own hparams)."""
    env, p = env

    def get(method: str):
        if method in _CACHE:
            return _CACHE[method]
        spec = cj.method_spec(method)
        net, params, opt_state, traj = policies[2 if spec.intrinsic_stream else 1]
        static = tiny_static(method)
        signal = spec.factory(static, net, cj.Trainer(static, env, p).env, p)
        hp = cj.default_hparams(method)
        hp_off = cj.default_hparams(method, **(spec.off or {}))
        ppo = cj.method_spec("ppo").factory(static, net, env, p)

        def off_advantages(s2, h):
            """``(adv [T, N], sparse PPO's adv [T, N])`` on ``traj`` under ``h`` (PPO: ``h.ppo`` with ppo's signal)."""
            h_ppo = cj.HParams(h.ppo, cj.default_hparams("ppo").signal)
            return advantages(signal, s2, traj, h), advantages(ppo, (), episodic_view(traj), h_ppo)

        def solo_and_off(key, params, opt_state, hp, hp_off):  # one program: the pass, then the off advantages
            out = signal_pass(signal, net, key, traj, params, opt_state, hp)
            return out, off_advantages(out[0][2], hp_off)

        owner = program_owner(method)
        if owner != method:
            solo, batched = get(owner)["programs"]
        else:
            run = functools.partial(signal_pass, signal, net)
            solo, batched = _compile_concurrently(
                jax.jit(solo_and_off).lower(KEYS[0], params, opt_state, hp, hp_off),
                jax.jit(jax.vmap(run, in_axes=(0, None, None, None, None))).lower(KEYS, traj, params, opt_state, hp))
        runs = [solo(k, params, opt_state, hp, hp_off) for k in KEYS]
        out = dict(spec=spec, signal=signal, traj=traj, hp=hp, solo=[s for s, _ in runs], programs=(solo, batched),
                   batched=batched(KEYS, traj, params, opt_state, hp))
        if spec.off is not None:
            out["off"] = dict(jit=runs[0][1], eager=off_advantages(runs[0][0][0][2], hp_off))
        _CACHE[method] = out
        return out

    yield get
    _CACHE.clear()


@pytest.mark.parametrize("method", METHODS)
def test_outputs_shapes_finite_and_state_structure(passes, method):
    r = passes(method)
    (s0, s1, s2, s3), streams, metrics = r["solo"][0]
    assert streams.episodic.shape == (T, N) and streams.episodic.dtype == jnp.float32
    assert (streams.intrinsic is not None) == r["spec"].intrinsic_stream
    if streams.intrinsic is not None:
        assert streams.intrinsic.shape == (T, N) and jnp.shape(streams.intrinsic_coef) == ()
    for m in metrics:
        assert all(jnp.shape(v) == () for v in m.values()), m
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves((s0, s1, s2, s3, streams, metrics))
               if jnp.issubdtype(x.dtype, jnp.inexact))
    shapes = [jax.tree.map(lambda x: (x.shape, x.dtype), s) for s in (s0, s1, s2, s3)]
    assert all(s == shapes[0] for s in shapes)  # a lax.scan / lax.cond carry
    # a method that observes or refits really changes its state (the checks below are not vacuous)
    if r["signal"].observe is not base.no_observe:
        assert not _leaves_equal(s0, s1)
    if r["signal"].update is not base.no_update:
        assert not _leaves_equal(s1, s2)


@pytest.mark.parametrize("method", METHODS)
def test_jit_equals_no_jit(passes, method):
    r = passes(method)
    sig, traj, hp = r["signal"], r["traj"], r["hp"]
    (s0, s1, s2, s3), streams, (m_obs, _, m_rew) = r["solo"][0]
    _close(sig.observe(s0, traj, hp, jax.random.split(KEYS[0], 3)[1]), (s1, m_obs))
    _close(sig.rewards(s2, traj, hp), (s3, streams, m_rew))


@pytest.mark.parametrize("method", METHODS)
def test_vmap_over_keys_equals_solo(passes, method):
    r = passes(method)
    for i in (0, 1):
        _close(jax.tree.map(lambda x: x[i], r["batched"]), r["solo"][i], rtol=1e-4, atol=1e-5)
    s0_a, s0_b = r["solo"][0][0][0], r["solo"][1][0][0]
    if jax.tree.leaves(s0_a):
        assert not _leaves_equal(s0_a, s0_b)  # two keys, two initialisations


#: the built-ins with a learned per-step reward of (state, action): their signals define ``credit``
CREDIT_METHODS = ("coevo-regression", "coevo-ranking", "coevo-novelty", "ircr", "rrd", "meta", "q-advantage", "hca",
                  "cca")


def test_the_methods_with_a_learned_reward_of_state_and_action_have_credit(env):
    env, p = env
    assert {m for m in METHODS if cj.Trainer(tiny_static(m), env, p).signal.credit is not None} == set(CREDIT_METHODS)


@pytest.mark.parametrize("method", CREDIT_METHODS)
def test_credit_at_the_action_taken_is_what_rewards_pays(passes, method):
    """``credit`` is ``[T, N, A]`` and finite; at the action taken it is the reward ``rewards`` pays at
    ``beta_ext = 0, beta_int = 1``, unnormalised (in the episodic stream, or in the intrinsic one where
    the method pays it there). hca's credit conditions on the step's episode return, ``rewards`` on the
    rollout's bootstrapped return-to-go: its value is checked in tests/test_chain_credit.py."""
    r = passes(method)
    signal, traj, state = r["signal"], r["traj"], r["solo"][0][0][2]
    hp = r["hp"].replace(beta_ext=0.0, beta_int=1.0, normalize_int=0.0)
    credit = jax.jit(signal.credit)(state, traj, hp, traj.probs)
    assert credit.shape == traj.probs.shape and bool(jnp.all(jnp.isfinite(credit)))
    if method == "hca":
        return
    paid = np.asarray(jnp.take_along_axis(credit, traj.action[..., None], -1)[..., 0])
    streams = jax.jit(signal.rewards)(state, traj, hp)[1]
    assert any(np.allclose(paid, np.asarray(s), rtol=1e-5, atol=1e-7) for s in (streams.episodic, streams.intrinsic)
               if s is not None)
    assert np.abs(paid).max() > 0 and np.abs(credit - paid[..., None]).max() > 0  # the actions are told apart


@pytest.mark.parametrize("method", [m for m in METHODS if cj.method_spec(m).off is not None])
def test_off_gives_sparse_ppos_advantages_bit_for_bit(passes, method):
    r = passes(method)
    for mode in ("jit", "eager"):
        adv, adv_ppo = r["off"][mode]
        assert adv.shape == (T, N)
        np.testing.assert_array_equal(np.asarray(adv), np.asarray(adv_ppo), err_msg=mode)
    # not vacuous: with the default weights the advantages differ
    on = advantages(r["signal"], r["solo"][0][0][2], r["traj"], r["hp"])
    assert not np.array_equal(np.asarray(on), np.asarray(r["off"]["eager"][1]))


_TRAINS: dict = {}


@pytest.fixture(scope="module")
def trains(env):
    """``trains(method) -> (jitted train, traces)``: one jitted ``Trainer.train`` per
    method (KeyDoor-5x5, 3 iterations) that counts its traces, shared by the tests."""
    env, p = env

    def get(method: str):
        if method not in _TRAINS:
            trainer, traces = cj.Trainer(tiny_static(method), env, p), []

            def train(key, hp):
                traces.append(1)
                return trainer.train(key, hp)

            _TRAINS[method] = (jax.jit(train), traces)
        return _TRAINS[method]

    yield get
    _TRAINS.clear()


@pytest.mark.parametrize("method", METHODS)
def test_k_is_traced_one_trace_serves_every_k(trains, method):
    train, traces = trains(method)
    for k in (1, 3):
        out = train.trace(KEYS[0], cj.default_hparams(method, k=k)).out_info
    assert len(traces) == 1
    assert out[1]["signal/updated"].shape == (STATIC.num_iterations,)


# one method per refit machinery: learned.py's R_phi, potential.py's Phi, replay_model.py's return model
# (q-advantage; hca and cca refit through it), ircr's and rrd's own; coevo-ranking runs on coevo-regression's
# program. The placebos wrap a refit above (siop-shuffled, coevo-shuffled) or refit nothing (constant, siop-critic):
# test_off_gives_sparse_ppos_advantages_bit_for_bit covers them and every other method's own maths.
SINGLE_STREAM_OFF = [m for m in ("coevo-regression", "coevo-ranking", "siop", "q-advantage", "ircr", "rrd")
                     if m in METHODS and cj.method_spec(m).off is not None and not cj.method_spec(m).intrinsic_stream]


@pytest.fixture(scope="module")
def off_runs(trains):
    """``{method: [(state, metrics) for K = 1, 2]}`` of the single-stream methods
    under their ``off`` overrides, and sparse PPO's run; each program compiled once
    (for its :func:`program_owner`), concurrently."""
    hps = {m: cj.default_hparams(m, k=1, **(cj.method_spec(m).off or {})) for m in ["ppo"] + SINGLE_STREAM_OFF}
    owners = sorted({program_owner(m) for m in hps}, key=list(hps).index)
    compiled = dict(zip(owners, _compile_concurrently(*[trains(o)[0].lower(KEYS[0], hps[o]) for o in owners])))
    return {m: [compiled[program_owner(m)](KEYS[0], hp.replace(k=k)) for k in (1, 2)] for m, hp in hps.items()}


@pytest.mark.parametrize("method", SINGLE_STREAM_OFF)
def test_single_stream_off_training_equals_ppo_for_two_k_from_one_compile(trains, off_runs, method):
    s_ppo, m_ppo = off_runs["ppo"][0]
    for (s, m), refits in zip(off_runs[method], (3, 2)):  # K = 1, 2 from one executable
        assert float(m["signal/updated"].sum()) == refits  # the refit really ran, K read at run time
        jax.tree.map(np.testing.assert_array_equal, s.params, s_ppo.params)
        np.testing.assert_array_equal(np.asarray(m["episode_return"]), np.asarray(m_ppo["episode_return"]))
    assert len(trains(program_owner(method))[1]) == 1  # one trace (shared with test_k_is_traced_one_trace_serves_every_k)
