"""A reward method is one module: a toy method defined, registered and trained
here, with no library file naming it.

The toy is a count-based exploration bonus (Strehl and Littman 2008; hashed
counts as in Tang et al. 2017, "#Exploration"): observations are hashed into
``2^hash_bits`` buckets by the signs of a fixed random projection, ``observe``
counts the visits, and every step pays ``traj.reward + count_bonus /
sqrt(n(s'))``. Its hyperparameters are its own class, declared here: the
mixing fields every method has plus ``count_bonus`` (range ``[0, 1]``); at
``count_bonus = 0`` the method is sparse PPO bit for bit. Its static option
``hash_bits`` (the table's size, a shape) is its own class too.
"""
import dataclasses
import types
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import coevo_jax as cj
import envs_jax
from coevo_jax.params import hyperparams, unit
from coevo_jax.registry import MethodSpec, StaticOptions, register_method, unregister_method
from coevo_jax.signals import RewardStreams, Signal, SignalParams
from coevo_jax.signals.base import no_update
from xla_options import OPT0

TOY = "count-bonus"
STATIC = dict(num_envs=4, rollout_len=16, total_steps=4 * 16 * 4, num_minibatches=2, update_epochs=2,
              hidden_sizes=(16,))


def buckets(proj: jax.Array, obs: jax.Array) -> jax.Array:
    """SimHash bucket of each observation: ``proj [D, B]``, ``obs [T, N, ...] -> [T, N]`` int32 in ``[0, 2^B)``."""
    x = obs.reshape(obs.shape[:2] + (-1,)).astype(jnp.float32)
    bits = (x @ proj > 0).astype(jnp.int32)
    return (bits * (2 ** jnp.arange(proj.shape[1], dtype=jnp.int32))).sum(-1)


@hyperparams
class CountBonusParams(SignalParams):
    """The toy's hyperparameters (``HParams.signal``)."""

    count_bonus: float = unit(0.01, doc="weight of the 1 / sqrt(visit count) bonus")


@dataclasses.dataclass(frozen=True)
class CountBonusStatic(StaticOptions):
    """The toy's static options (``StaticConfig.signal``): the hash table's size."""

    hash_bits: int = 6  # B: observations hash into 2^B buckets

    checks = {"hash_bits": (1, 16)}


def make_count_bonus(static, network, env, env_params) -> Signal:
    """The toy's :class:`Signal`: state ``{"proj" [D, B], "counts" [2^B]}``, ``B = static.signal.hash_bits``."""
    bits = static.signal.hash_bits

    def init(key, traj, hp):
        return {"proj": jax.random.normal(key, (traj.obs[0, 0].size, bits)), "counts": jnp.zeros(2**bits)}

    def observe(state, traj, hp, key):
        counts = state["counts"].at[buckets(state["proj"], traj.next_obs).ravel()].add(1.0)
        return {**state, "counts": counts}, {"buckets_seen": (counts > 0).sum().astype(jnp.float32)}

    def rewards(state, traj, hp):
        n = state["counts"][buckets(state["proj"], traj.next_obs)]
        bonus = 1.0 / jnp.sqrt(jnp.maximum(n, 1.0))
        return state, RewardStreams(traj.reward + hp.signal.count_bonus * bonus), {"bonus_mean": bonus.mean()}

    return Signal(init, observe, no_update, rewards)


TOY_SPEC = MethodSpec(
    TOY, make_count_bonus,
    params=CountBonusParams,
    static=CountBonusStatic,
    off={"count_bonus": 0.0},
    doc="toy: a hashed count-based exploration bonus in the episodic stream",
)


@pytest.fixture(scope="module")
def toy():
    register_method(TOY_SPEC)
    yield TOY_SPEC
    unregister_method(TOY)
    assert TOY not in cj.registered_methods()


def test_registered_toy_has_its_own_class_default_and_range(toy):
    assert TOY in cj.registered_methods() and cj.hparam_fields(TOY)[-1] == "count_bonus"
    hp = cj.default_hparams(TOY)
    assert isinstance(hp.signal, CountBonusParams) and float(hp.signal.count_bonus) == np.float32(0.01)
    assert "count_bonus" not in cj.hparam_fields("ppo")  # other methods' HParams do not change
    assert [f.name for f in dataclasses.fields(hp.signal)] == ["beta_ext", "beta_int", "normalize_int", "k",
                                                               "count_bonus"]
    assert cj.StaticConfig(method=TOY).value_heads == 1
    for bad in (1.5, -0.1):
        with pytest.raises(cj.ConfigError,
                           match=rf"HParams.count_bonus={bad} is outside the allowed range \[0.0, 1.0\]"):
            cj.validate_hparams(cj.default_hparams(TOY, count_bonus=bad))
    with pytest.raises(cj.ConfigError, match="method 'ppo' needs HParams with signal=ExternalParams, got"
                                             " CountBonusParams"):
        cj.Trainer(cj.StaticConfig(method="ppo", **STATIC), *envs_jax.make("CartPole-v1")).init(
            jax.random.PRNGKey(0), hp)


def test_a_second_registration_is_refused_and_unregistering_removes_it(toy):
    spec = MethodSpec("count-bonus-2", make_count_bonus, CountBonusParams, static=CountBonusStatic)
    register_method(spec)
    try:
        assert cj.hparam_fields("count-bonus-2") == cj.hparam_fields(TOY)
        with pytest.raises(cj.ConfigError, match="is already registered"):
            register_method(spec)
    finally:
        unregister_method(spec.name)
    with pytest.raises(cj.ConfigError, match="unknown method 'count-bonus-2'; registered methods: ppo"):
        cj.method_spec("count-bonus-2")


def test_the_toys_static_option_is_its_own_and_shapes_its_signal(toy):
    """``hash_bits`` lands in the toy's ``StaticConfig.signal``, is range-checked, sizes the
    count table its signal builds, and is no field of the other methods."""
    static = cj.static_config(TOY, hash_bits=3, **STATIC)
    assert static.signal == CountBonusStatic(3) and static.as_dict()["hash_bits"] == 3
    assert cj.StaticConfig(method=TOY).signal == CountBonusStatic()
    env, p = envs_jax.make("KeyDoor-5x5")
    obs = jnp.zeros((2, 4) + env.observation_space(p).shape)
    signal = cj.make_signal(static, None, env, p)
    state = signal.init(jax.random.PRNGKey(0), types.SimpleNamespace(obs=obs), cj.default_hparams(TOY))
    assert state["counts"].shape == (8,) and state["proj"].shape == (obs[0, 0].size, 3)
    with pytest.raises(cj.ConfigError, match=r"^StaticConfig.hash_bits=0 must be an integer in \[1, 16\]$"):
        cj.validate_static(static.replace(hash_bits=0))
    with pytest.raises(cj.ConfigError, match=r"StaticConfig.hash_bits is a static option of method\(s\) count-bonus,"
                                             r" not of method 'ppo'"):
        cj.static_config("ppo", hash_bits=3)
    assert static.replace(method="ppo").signal is None  # ppo has no static options


def test_a_static_class_is_checked_when_the_spec_is_made():
    @dataclasses.dataclass(frozen=True)
    class Clash(StaticOptions):
        num_envs: int = 4

    @dataclasses.dataclass(frozen=True)
    class BadCheck(StaticOptions):
        width: int = 4
        checks = {"depth": (1, 2)}

    @dataclasses.dataclass(frozen=True)
    class NoDefault(StaticOptions):
        width: int

    with pytest.raises(cj.ConfigError, match=r"method 'x': Clash.num_envs clashes with StaticConfig.num_envs"):
        MethodSpec("x", make_count_bonus, static=Clash)
    with pytest.raises(cj.ConfigError, match=r"method 'x': BadCheck.checks names 'depth', which is no field of"
                                             " BadCheck; fields are width"):
        MethodSpec("x", make_count_bonus, static=BadCheck)
    with pytest.raises(cj.ConfigError, match=r"method 'x': NoDefault.width needs a default"):
        MethodSpec("x", make_count_bonus, static=NoDefault)
    with pytest.raises(cj.ConfigError, match=r"static=.* must be a subclass of StaticOptions declared with"):
        MethodSpec("x", make_count_bonus, static=CountBonusParams)


@pytest.fixture(scope="module")
def runs(toy):
    """2 seeds x count_bonus in (0, 0.5), as one ``jax.jit(jax.vmap(train))``
    call of the toy, and the same batch through sparse PPO."""
    env, p = envs_jax.make("KeyDoor-5x5")
    p = p.replace(max_steps_in_episode=12)
    seeds = jax.random.split(jax.random.PRNGKey(0), 2)
    keys = jnp.concatenate([seeds, seeds])
    stack = lambda hps: jax.tree.map(lambda *x: jnp.stack(x), *hps)  # noqa: E731
    hps = {TOY: stack([cj.default_hparams(TOY, count_bonus=w) for w in (0, 0, 0.5, 0.5)]),
           "ppo": stack([cj.default_hparams("ppo")] * 4)}
    lowered = [jax.jit(jax.vmap(cj.Trainer(cj.StaticConfig(method=m, **STATIC), env, p).train)).lower(keys, hps[m])
               for m in (TOY, "ppo")]
    with ThreadPoolExecutor(2) as pool:  # XLA releases the GIL: the two compile side by side
        compiled = list(pool.map(lambda low: low.compile(OPT0), lowered))
    return {m: train(keys, hps[m]) for m, train in zip((TOY, "ppo"), compiled)}


def test_toy_trains_end_to_end_and_is_ppo_at_zero_weight(runs):
    (s_toy, m_toy), (s_ppo, m_ppo) = runs[TOY], runs["ppo"]
    assert m_toy["episode_return"].shape == (4, 4) and not bool(s_toy.diverged.any())
    assert bool(jnp.all(m_toy["signal/buckets_seen"] > 1))  # observe counted distinct observations
    first = lambda tree, i: jax.tree.map(lambda x: np.asarray(x[i]), tree)  # noqa: E731
    for i in (0, 1):  # count_bonus = 0: sparse PPO, bit for bit
        jax.tree.map(np.testing.assert_array_equal, first(s_toy.params, i), first(s_ppo.params, i))
        np.testing.assert_array_equal(m_toy["episode_return"][i], m_ppo["episode_return"][i])
    for i in (2, 3):  # count_bonus = 0.5: same seed, other rewards, other policy
        assert float(jnp.abs(m_toy["r_used_mean"][i] - m_ppo["r_used_mean"][i]).max()) > 0.1
        kernel = s_toy.params["params"]["actor_out"]["kernel"]
        assert not np.array_equal(np.asarray(kernel[i]), np.asarray(kernel[i - 2]))
