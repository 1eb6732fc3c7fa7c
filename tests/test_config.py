"""Configs: HParams is two frozen hyperparameter classes (PPOParams and the
method's), a pytree of arrays with flat field names for users; StaticConfig is
the core fields plus the method's static options (``signal``), named flat too;
bad values fail before compiling, naming the field and its range; the method
registry's checks."""
import dataclasses
import math
import pickle
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import coevo_jax as cj
from coevo_jax.config import ConfigError, hparam_fields, validate_hparams, validate_static
from coevo_jax.params import Param, hyperparams, param, unit
from coevo_jax.ppo import PPOParams
from coevo_jax.registry import MethodSpec, method_spec, register_method
from coevo_jax.reward_net import RewardNetStatic
from coevo_jax.signals.base import SignalParams
from coevo_jax.signals.meta import MetaStatic
from coevo_jax.signals.potential import PotentialStatic

PPO_FIELDS = ["lr", "gamma", "gae_lambda", "clip_eps", "ent_coef", "vf_coef", "max_grad_norm"]
#: every field of every method, with a method that has it
OWNER = {f: m for m in reversed(cj.registered_methods()) for f in hparam_fields(m)}


def _flat_defaults(method: str) -> dict:
    return {**{f: p.default for f, p in method_spec(method).declarations().items()}, **method_spec(method).defaults}


@pytest.mark.parametrize("method", cj.registered_methods())
def test_every_leaf_is_an_array_of_its_declared_dtype_holding_the_methods_default(method):
    hp = cj.default_hparams(method)
    assert isinstance(hp.ppo, PPOParams) and isinstance(hp.signal, method_spec(method).params)
    assert list(hp.as_dict()) == list(hparam_fields(method)) == PPO_FIELDS + list(hparam_fields(method))[7:]
    assert len(jax.tree.leaves(hp)) == len(hparam_fields(method))
    for name, p in method_spec(method).declarations().items():
        v = hp.as_dict()[name]
        assert isinstance(v, jax.Array) and v.dtype == (jnp.int32 if p.integer else jnp.float32), name
        assert float(v) == np.float32(_flat_defaults(method)[name]), name
    assert hp.signal.k.dtype == jnp.int32 and hp.ppo.lr.dtype == jnp.float32


def test_hparams_fields_are_plain_dataclass_fields():
    assert [f.name for f in dataclasses.fields(cj.HParams)] == ["ppo", "signal"]
    assert [f.name for f in dataclasses.fields(PPOParams)] == PPO_FIELDS
    assert [f.name for f in dataclasses.fields(SignalParams)] == ["beta_ext", "beta_int", "normalize_int", "k"]
    from coevo_jax.signals.potential import SIOPParams

    assert issubclass(SIOPParams, SignalParams) and "w_fit" in [f.name for f in dataclasses.fields(SIOPParams)]
    assert dataclasses.fields(SIOPParams)[0].metadata["param"] == Param(1.0, -math.inf, math.inf, False, False,
                                                                        doc="weight of the external reward")


def test_flat_names_route_to_ppo_or_signal_and_round_trip():
    hp = cj.default_hparams("siop", lr=1e-3, k=8, w_reg=0.5)
    assert float(hp.ppo.lr) == np.float32(1e-3) and int(hp.signal.k) == 8 and float(hp.signal.w_reg) == 0.5
    flat = hp.as_dict()
    assert list(flat) == list(hparam_fields("siop")) and int(flat["k"]) == 8
    assert cj.default_hparams("siop", **flat) == hp  # as_dict -> default_hparams round trip
    again = cj.default_hparams("siop").replace(**{f: flat[f] for f in ("lr", "k", "w_reg")})
    assert again == hp and again.signal.k.dtype == jnp.int32
    assert hp.replace(gamma=0.5).ppo.gamma == 0.5 and hp.replace(gamma=0.5).signal is hp.signal
    with pytest.raises(ConfigError, match=r"unknown HParams field 'w_reg' \(ExternalParams\); fields are lr, gamma, "):
        cj.default_hparams("ppo").replace(w_reg=1.0)  # a field of siop, not of ppo
    with pytest.raises(ConfigError, match=r"unknown HParams field 'learning_rate' \(method 'siop'\); fields are"
                                          r" lr, gamma, gae_lambda, clip_eps, ent_coef, vf_coef, max_grad_norm,"
                                          r" beta_ext, beta_int, normalize_int, k, "):
        cj.default_hparams("siop", learning_rate=1.0)


def test_pytree_keys_are_the_field_paths_and_tree_map_keeps_the_classes():
    hp = cj.default_hparams("ppo")
    paths = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(hp)[0]]
    assert paths == [f".ppo.{n}" for n in PPO_FIELDS] + [f".signal.{n}" for n in hparam_fields("ppo")[7:]]
    doubled = jax.tree.map(lambda x: x * 2, hp)
    assert isinstance(doubled, cj.HParams) and float(doubled.ppo.lr) == pytest.approx(5e-4)
    batched = jax.tree.map(lambda *x: jnp.stack(x), hp, hp.replace(lr=1e-3))
    assert batched.ppo.lr.shape == (2,) and batched.signal.k.dtype == jnp.int32


def test_replace_and_as_arrays_cast_python_numbers_to_arrays():
    hp = cj.default_hparams("ppo").replace(lr=1e-3, k=8)
    assert isinstance(hp.ppo.lr, jax.Array) and hp.ppo.lr.dtype == jnp.float32
    assert isinstance(hp.signal.k, jax.Array) and hp.signal.k.dtype == jnp.int32 and int(hp.signal.k) == 8
    hp = cj.default_hparams("ppo", k=np.array([2.0, 3.0]), lr=np.float64(1e-3))
    assert hp.signal.k.dtype == jnp.int32 and hp.signal.k.tolist() == [2, 3] and hp.ppo.lr.dtype == jnp.float32
    plain = cj.HParams(PPOParams(lr=1e-3), SignalParams(k=3))  # the classes' own constructors keep the numbers
    cast = cj.config.as_arrays(plain)
    assert plain.signal.k == 3 and cast.signal.k.dtype == jnp.int32 and float(cast.ppo.gamma) == np.float32(0.99)
    with pytest.raises(ConfigError, match=r"HParams.k: must be an integer, got \[2.5\]"):
        cj.default_hparams("ppo", k=[2.5])
    with pytest.raises(ConfigError, match="HParams.lr: expected a number"):
        cj.default_hparams("ppo").replace(lr="fast")
    with pytest.raises(AttributeError):
        cj.default_hparams("ppo").nope  # noqa: B018
    with pytest.raises(dataclasses.FrozenInstanceError):
        cj.default_hparams("ppo").ppo.lr = 1.0
    assert dataclasses.replace(cj.StaticConfig(), num_envs=8).num_envs == 8


def test_equality_repr_pickle_jit_and_vmap():
    hp = cj.default_hparams("icm")
    assert hp == cj.default_hparams("icm") and hp != hp.replace(lr=1e-3)
    assert repr(hp).startswith("HParams(ppo=PPOParams(lr=0.00025, gamma=0.99, ") and "k=4" in repr(hp)
    assert "signal=ICMParams(beta_ext=1., beta_int=0.1," in repr(hp)
    assert pickle.loads(pickle.dumps(hp)) == hp
    out = jax.jit(lambda h: h.replace(lr=h.ppo.lr * 2))(hp)
    assert isinstance(out, cj.HParams) and float(out.ppo.lr) == pytest.approx(5e-4) and out.signal.k.dtype == jnp.int32
    batched = jax.tree.map(lambda *x: jnp.stack(x), hp, hp.replace(k=7))
    ks = jax.vmap(lambda h: h.signal.k * 2 + jnp.int32(h.ppo.lr > 0))(batched)
    assert ks.tolist() == [9, 15]


def test_orbax_round_trip_of_a_train_state_holding_hparams(tmp_path):
    import orbax.checkpoint as ocp

    from coevo_jax.rollout import RolloutState

    hp = jax.tree.map(lambda *x: jnp.stack(x), cj.default_hparams("siop"), cj.default_hparams("siop", k=9))
    state = cj.TrainState(params={"w": jnp.arange(3.0)}, opt_state=(), signal_state={"hp": hp},
                          rollout=RolloutState(jnp.zeros(2), jnp.ones(2)), key=jnp.zeros(2, jnp.uint32),
                          iteration=jnp.int32(3), diverged=jnp.bool_(False), last_return=jnp.float32(0.5),
                          last_success=jnp.float32(0.25))
    ckpt = ocp.StandardCheckpointer()
    ckpt.save(tmp_path / "ckpt", state)
    ckpt.wait_until_finished()
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    got = ckpt.restore(tmp_path / "ckpt", target)
    assert isinstance(got.signal_state["hp"], cj.HParams)
    assert got.signal_state["hp"] == hp and got.signal_state["hp"].signal.k.dtype == jnp.int32


def test_default_hparams_per_method_and_unknown_names():
    assert int(cj.default_hparams("meta").signal.k) == 1
    assert float(cj.default_hparams("siop").signal.normalize_int) == 0.0
    with pytest.raises(ConfigError, match="unknown method 'nope'; registered methods: ppo, dense, icm"):
        cj.default_hparams("nope")
    with pytest.raises(ConfigError, match="unknown HParams field 'learning_rate'"):
        cj.default_hparams("ppo", learning_rate=1.0)


def _outside_values(p: Param) -> list:
    """Values just outside ``p``'s range (and nan, always rejected)."""
    out = [math.nan]
    step = 1 if p.integer else 1e-3
    if math.isfinite(p.low):
        out.append(p.low if not p.low_inclusive else p.low - step)
    if math.isfinite(p.high):
        out.append(p.high if not p.high_inclusive else p.high + step * max(1.0, abs(p.high)))
    if not math.isfinite(p.high) and not p.high_inclusive:
        out.append(math.inf)
    return out


@pytest.mark.parametrize("field", list(OWNER))
def test_every_declared_range_rejects_values_outside_it_naming_field_and_range(field):
    method = OWNER[field]
    p = method_spec(method).declarations()[field]
    validate_hparams(cj.default_hparams(method, **{field: p.default}))
    for value in _outside_values(p):
        if p.integer and not math.isfinite(value):
            continue  # not an integer: rejected when cast (test_replace_and_as_arrays_cast...)
        hp = cj.default_hparams(method, **{field: value})
        shown = str(np.asarray(hp.as_dict()[field])[()])
        with pytest.raises(ConfigError, match=re.escape(f"HParams.{field}={shown} is outside the allowed range"
                                                        f" {p.range_text()}")):
            validate_hparams(hp)


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("lr", 0.0, r"HParams.lr=0.0 is outside the allowed range \(0.0, 1.0\]"),
        ("gamma", 1.5, r"HParams.gamma=1.5 is outside the allowed range \[0.0, 1.0\]"),
        ("k", 0, r"HParams.k=0 is outside the allowed range \[1, 1000000\]"),
        ("rnd_lr_ratio", -0.5, r"HParams.rnd_lr_ratio=-0.5 is outside the allowed range \[0.0, inf\)"),
        ("drift_ema", 1.0, r"HParams.drift_ema=1.0 is outside the allowed range \[0.0, 1.0\)"),
    ],
)
def test_invalid_hparams_messages(field, value, message):
    with pytest.raises(ConfigError, match=message):
        validate_hparams(cj.default_hparams(OWNER[field], **{field: value}))


def test_invalid_value_inside_a_batch_is_found():
    with pytest.raises(ConfigError, match="HParams.lr=-1.0"):
        validate_hparams(cj.default_hparams("ppo", lr=[1e-3, 2e-3, -1.0]))


def test_every_method_default_is_in_range():
    for m in cj.registered_methods():
        validate_hparams(cj.default_hparams(m))


@pytest.mark.parametrize(
    "change,message",
    [
        ({"method": "bogus"}, r"StaticConfig.method='bogus' is not one of ppo"),
        ({"num_envs": 0}, r"StaticConfig.num_envs=0 must be an integer in \[1, "),
        ({"num_envs": 2.5}, r"StaticConfig.num_envs=2.5"),
        ({"rollout_len": -3}, r"StaticConfig.rollout_len=-3"),
        ({"num_minibatches": 3}, r"StaticConfig.num_minibatches=3 must divide num_envs \* rollout_len"),
        ({"total_steps": 10}, r"StaticConfig.total_steps=10 must be >= num_envs \* rollout_len"),
        ({"hidden_sizes": ()}, r"StaticConfig.hidden_sizes=\(\) must be a non-empty tuple"),
        ({"activation": "gelu"}, r"StaticConfig.activation='gelu' must be 'tanh' or 'relu'"),
        # the method's own checks (its static options class: StaticOptions.checks / check)
        ({"method": "siop", "ensemble_combine": "max"}, r"StaticConfig.ensemble_combine='max'"),
        ({"method": "siop", "potential_hidden": (0,)}, r"StaticConfig.potential_hidden=\(0,\)"),
        ({"method": "meta", "meta_truncate": 1}, r"StaticConfig.meta_truncate=1 must be < meta_inner_steps=1"),
        ({"method": "coevo-regression", "reward_input": "pixels"},
         r"StaticConfig.reward_input='pixels' must be 'features' or 'obs'"),
        ({"method": "coevo-ranking", "buffer_episodes": 1},
         r"StaticConfig.buffer_episodes=1 must be an integer in \[2, "),
        ({"method": "siop", "potential_buffer_episodes": 0},
         r"StaticConfig.potential_buffer_episodes=0 must be an integer in \[1, "),
        ({"method": "siop", "potential_episode_len": 0}, r"StaticConfig.potential_episode_len=0 must be an integer"),
        ({"method": "icm", "icm_feature_dim": 0}, r"StaticConfig.icm_feature_dim=0 must be an integer"),
    ],
)
def test_invalid_static_config(change, message):
    with pytest.raises(ConfigError, match=message):
        validate_static(cj.static_config(**change))


def test_a_methods_static_fields_land_in_its_signal_options():
    s = cj.static_config("siop", ensemble_size=2, num_envs=8)
    assert s.num_envs == 8 and s.signal == PotentialStatic(ensemble_size=2) and s.method == "siop"
    assert list(s.as_dict()) == [*cj.config.core_static_fields(), *(f.name for f in dataclasses.fields(PotentialStatic))]
    assert s.as_dict()["ensemble_size"] == 2 and "reward_steps" not in s.as_dict()
    assert s.replace(credit_nstep=3, rollout_len=16).signal.credit_nstep == 3 and s.replace(rollout_len=16).rollout_len == 16
    assert cj.StaticConfig(method="meta").signal == MetaStatic() and cj.StaticConfig().signal is None  # ppo has none
    assert cj.StaticConfig(method="bogus").signal is None  # unregistered: left for validate_static to refuse
    assert cj.static_config("meta", reward_steps=2, meta_inner_steps=3).signal == MetaStatic(reward_steps=2,
                                                                                             meta_inner_steps=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.signal.ensemble_size = 3


def test_a_field_of_another_method_or_of_none_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"^StaticConfig.reward_steps is a static option of method\(s\) coevo-regression,"
                                          r" .*, not of method 'siop', whose static options are potential_hidden, .*,"
                                          r" credit_nstep$"):
        cj.static_config("siop", reward_steps=3)
    with pytest.raises(ConfigError, match=r"^unknown StaticConfig field 'nope'; the fields of method 'icm' are method,"
                                          r" num_envs, .*, packed_update, icm_feature_dim$"):
        cj.static_config("icm").replace(nope=1)
    with pytest.raises(ConfigError, match=r"StaticConfig.ensemble_size is a static option of method\(s\) siop,"
                                          r" siop-shuffled, not of method 'ppo', whose static options are \(none\)"):
        cj.static_config("ppo", ensemble_size=2)


def test_changing_the_method_starts_from_the_new_classes_defaults():
    s = cj.static_config("siop", ensemble_size=2, num_envs=8)
    assert s.replace(method="coevo-regression").signal == RewardNetStatic()  # another class: its defaults
    assert s.replace(method="coevo-regression").num_envs == 8  # the core fields stay
    assert s.replace(method="siop-shuffled").signal == s.signal  # the same class: kept
    assert s.replace(method="coevo-regression", reward_steps=8).signal == RewardNetStatic(reward_steps=8)
    meta = cj.static_config("meta", reward_steps=2)
    assert meta.replace(method="coevo-regression").signal == RewardNetStatic()  # a subclass is another class
    assert s.replace(method="ppo").signal is None and s.replace(method="ppo").replace(method="siop").signal == \
        PotentialStatic()
    with pytest.raises(ConfigError, match="StaticConfig.ensemble_size is a static option"):
        s.replace(method="coevo-regression", ensemble_size=2)


def test_equal_static_configs_hash_equal():
    a, b = cj.static_config("siop", ensemble_size=2), cj.static_config("siop").replace(ensemble_size=2)
    assert a == b and hash(a) == hash(b) and len({a, b, cj.static_config("siop")}) == 2
    assert a != cj.static_config("siop-shuffled", ensemble_size=2)  # the method is a core field
    # dataclasses.replace keeps a given signal (validate_static then checks its class)
    kept = dataclasses.replace(a, method="coevo-regression")
    assert kept.signal == a.signal
    with pytest.raises(ConfigError, match=r"StaticConfig.signal=PotentialStatic\(.*\) must be a RewardNetStatic"
                                          r" \(method 'coevo-regression''s static options"):
        validate_static(kept)
    with pytest.raises(ConfigError, match="must be None: method 'ppo' has no static options"):
        validate_static(dataclasses.replace(a, method="ppo"))
    assert pickle.loads(pickle.dumps(a)) == a


def test_value_heads_come_from_the_spec():
    for m in cj.registered_methods():
        assert cj.StaticConfig(method=m).value_heads == (2 if method_spec(m).intrinsic_stream else 1)
    assert [m for m in cj.registered_methods() if method_spec(m).intrinsic_stream] == \
        ["icm", "coevo-novelty", "meta"]


def test_registry_rejects_conflicts_and_bad_specs():
    def factory(*a):
        raise AssertionError

    @hyperparams
    class ClashParams(SignalParams):
        lr: float = param(1e-3, 0.0, 1.0)

    with pytest.raises(ConfigError, match="method 'ppo' is already registered"):
        register_method(MethodSpec("ppo", factory))
    with pytest.raises(ConfigError, match=r"method 'clash': ClashParams.lr clashes with PPOParams.lr \(HParams field"
                                          " names must be unique"):
        MethodSpec("clash", factory, ClashParams)
    with pytest.raises(ConfigError, match=r"defaults HParams.gamma=2.0 is outside the allowed range \[0.0, 1.0\]"):
        MethodSpec("bad-default", factory, defaults={"gamma": 2.0})
    with pytest.raises(ConfigError, match="off names unknown HParams field 'nope'"):
        MethodSpec("bad-off", factory, off={"nope": 0.0})
    with pytest.raises(ConfigError, match="requires unknown env output"):
        MethodSpec("bad-env", factory, requires=("pixels",))
    with pytest.raises(ConfigError, match="params=.* must be a subclass of SignalParams declared with @hyperparams"):
        MethodSpec("bad-class", factory, PPOParams)

    class Undecorated(SignalParams):  # a subclass that is not itself declared: not a pytree of its fields
        pass

    with pytest.raises(ConfigError, match="must be a subclass of SignalParams declared with @hyperparams"):
        MethodSpec("bad-class", factory, Undecorated)
    with pytest.raises(ConfigError, match="ReservedParams.replace: a hyperparameter name must not"):
        @hyperparams
        class ReservedParams(SignalParams):
            replace: float = unit(0.0)
    with pytest.raises(ConfigError, match=r"BareParams.x must be declared with param\(...\)"):
        @hyperparams
        class BareParams(SignalParams):
            x: float = 0.0
    with pytest.raises(ConfigError, match=r"Param default 2.0 is outside its own range \[0.0, 1.0\]"):
        Param(2.0, 0.0, 1.0)
    assert cj.registered_methods()[:2] == ("ppo", "dense") and "clash" not in cj.registered_methods()
    assert set(hparam_fields()) == set(OWNER) and "lr" in hparam_fields()


def test_methods_that_differ_only_in_hparams_values_share_a_compiled_program():
    """The runner keys a compiled program on what the method traces (factory, intrinsic
    stream, params class), not on its name: ``dense`` runs ``ppo``'s program and
    ``coevo-ranking`` ``coevo-regression``'s (told apart by ``dense_weight`` / ``ranking_weight``)."""
    from coevo_jax.experiment.plan import arm_hparams
    from coevo_jax.experiment.spec import Arm
    from coevo_jax.experiment.worker import program_key

    def key(method, **static):
        arm = Arm(cj.StaticConfig(method=method, **static))
        return program_key(types.SimpleNamespace(arm=arm, hp=arm_hparams(arm), chunk_len=2), 4)

    assert key("dense") == key("ppo") and key("coevo-ranking") == key("coevo-regression")
    assert float(cj.default_hparams("dense").signal.dense_weight) == 1.0
    assert float(cj.default_hparams("coevo-ranking").signal.ranking_weight) == 1.0
    assert float(cj.default_hparams("coevo-regression").signal.ranking_weight) == 0.0
    assert key("coevo-novelty") != key("coevo-regression")  # another class and a second critic head
    assert key("siop-shuffled") != key("siop")  # the same class, another factory
    assert key("dense", num_envs=8) != key("ppo")


def test_a_missing_env_output_is_a_config_error_naming_method_env_and_output():
    import envs_jax

    env, p = envs_jax.make("CartPole-v1")
    with pytest.raises(ConfigError, match="method 'dense' requires the environment output 'dense_reward', but"
                                          " environment 'CartPole-v1' has no dense reward"):
        cj.Trainer(cj.StaticConfig(method="dense"), env, p)


def test_make_train_rejects_bad_static_before_compiling():
    import envs_jax

    env, p = envs_jax.make("CartPole-v1")
    with pytest.raises(ConfigError, match="StaticConfig.num_envs"):
        cj.make_train(cj.StaticConfig(num_envs=0), env, p)
