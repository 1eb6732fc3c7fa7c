"""Configs: HParams is a registry-driven pytree of arrays; bad values fail before
compiling, naming the field and its range; the method registry's checks."""
import dataclasses
import math
import pickle
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import coevo_jax as cj
from coevo_jax.config import ConfigError, hparam_fields, validate_hparams, validate_static
from coevo_jax.registry import (
    MethodSpec, Param, hparam_declarations, method_spec, program_of, register_method, unregister_method,
)

DECLS = dict(hparam_declarations())


def test_every_hparams_leaf_is_an_array_of_its_declared_dtype():
    hp = cj.HParams()
    leaves = jax.tree.leaves(hp)
    assert len(leaves) == len(hparam_fields()) == len(DECLS)
    for name, p in DECLS.items():
        v = getattr(hp, name)
        assert isinstance(v, jax.Array), name
        assert v.dtype == (jnp.int32 if p.integer else jnp.float32), name
        assert float(v) == np.float32(p.default), name
    assert hp.k.dtype == jnp.int32 and hp.lr.dtype == jnp.float32


def test_pytree_keys_are_the_field_names_and_tree_map_keeps_the_class():
    hp = cj.HParams()
    paths = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(hp)[0]]
    assert paths == [f".{n}" for n in hparam_fields()]
    doubled = jax.tree.map(lambda x: x * 2, hp)
    assert isinstance(doubled, cj.HParams) and float(doubled.lr) == pytest.approx(5e-4)
    batched = jax.tree.map(lambda *x: jnp.stack(x), hp, hp.replace(lr=1e-3))
    assert batched.lr.shape == (2,) and batched.k.dtype == jnp.int32


def test_replace_and_constructor_cast_python_numbers_to_arrays():
    hp = cj.HParams().replace(lr=1e-3, k=8)
    assert isinstance(hp.lr, jax.Array) and hp.lr.dtype == jnp.float32
    assert isinstance(hp.k, jax.Array) and hp.k.dtype == jnp.int32 and int(hp.k) == 8
    hp = cj.HParams(k=np.array([2.0, 3.0]), lr=np.float64(1e-3))
    assert hp.k.dtype == jnp.int32 and hp.k.tolist() == [2, 3] and hp.lr.dtype == jnp.float32
    assert float(hp.gamma) == pytest.approx(0.99)  # missing fields take their declared default
    with pytest.raises(ConfigError, match=r"HParams.k: must be an integer, got \[2.5\]"):
        cj.HParams(k=[2.5])
    with pytest.raises(ConfigError, match="HParams.lr: expected a number"):
        cj.HParams(lr="fast")
    assert dataclasses.replace(cj.StaticConfig(), num_envs=8).num_envs == 8


def test_unknown_field_is_an_error_naming_it_and_listing_the_fields():
    with pytest.raises(ConfigError, match=r"unknown HParams field 'learning_rate'; fields are lr, gamma, "):
        cj.HParams(learning_rate=1.0)
    with pytest.raises(ConfigError, match="unknown HParams field 'nope'"):
        cj.HParams().replace(nope=1.0)
    with pytest.raises(AttributeError, match="HParams has no field 'nope'"):
        cj.HParams().nope  # noqa: B018
    with pytest.raises(dataclasses.FrozenInstanceError):
        cj.HParams().lr = 1.0


def test_equality_repr_pickle_jit_and_vmap():
    hp = cj.default_hparams("icm")
    assert hp == cj.default_hparams("icm") and hp != hp.replace(lr=1e-3)
    assert repr(hp).startswith("HParams(lr=0.00025, gamma=0.99, ") and "k=4" in repr(hp)
    assert pickle.loads(pickle.dumps(hp)) == hp
    out = jax.jit(lambda h: h.replace(lr=h.lr * 2))(hp)
    assert isinstance(out, cj.HParams) and float(out.lr) == pytest.approx(5e-4) and out.k.dtype == jnp.int32
    batched = jax.tree.map(lambda *x: jnp.stack(x), hp, hp.replace(k=7))
    ks = jax.vmap(lambda h: h.k * 2 + jnp.int32(h.lr > 0))(batched)
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
    assert got.signal_state["hp"] == hp and got.signal_state["hp"].k.dtype == jnp.int32


def test_default_hparams_per_method_and_unknown_names():
    assert int(cj.default_hparams("meta").k) == 1
    assert float(cj.default_hparams("siop").normalize_int) == 0.0
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


@pytest.mark.parametrize("field", list(DECLS))
def test_every_declared_range_rejects_values_outside_it_naming_field_and_range(field):
    p = DECLS[field]
    validate_hparams(cj.HParams(**{field: p.default}))
    for value in _outside_values(p):
        if p.integer and not math.isfinite(value):
            continue  # not an integer: rejected when cast (test_replace_and_constructor_cast...)
        hp = cj.HParams(**{field: value})
        shown = str(np.asarray(getattr(hp, field))[()])
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
        validate_hparams(cj.HParams(**{field: value}))


def test_invalid_value_inside_a_batch_is_found():
    with pytest.raises(ConfigError, match="HParams.lr=-1.0"):
        validate_hparams(cj.HParams(lr=[1e-3, 2e-3, -1.0]))


def test_every_method_default_is_in_range():
    validate_hparams(cj.HParams())
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
        # the method's own checks (MethodSpec.static_checks / check_static)
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
        validate_static(dataclasses.replace(cj.StaticConfig(), **change))


def test_other_methods_fields_are_not_checked():
    validate_static(cj.StaticConfig(method="ppo", ensemble_combine="max", meta_truncate=5, reward_input="pixels"))


def test_value_heads_come_from_the_spec():
    for m in cj.registered_methods():
        assert cj.StaticConfig(method=m).value_heads == (2 if method_spec(m).intrinsic_stream else 1)
    assert [m for m in cj.registered_methods() if method_spec(m).intrinsic_stream] == \
        ["icm", "coevo-novelty", "meta"]


def test_registry_rejects_conflicts_and_bad_specs():
    def factory(*a):
        raise AssertionError

    with pytest.raises(ConfigError, match="method 'ppo' is already registered"):
        register_method(MethodSpec("ppo", factory))
    with pytest.raises(ConfigError, match=r"declares HParams.lr as .* already declared"):
        register_method(MethodSpec("clash", factory, {"lr": Param(1e-3, 0.0, 1.0)}))
    with pytest.raises(ConfigError, match=r"defaults HParams.gamma=2.0 is outside the allowed range \[0.0, 1.0\]"):
        register_method(MethodSpec("bad-default", factory, defaults={"gamma": 2.0}))
    with pytest.raises(ConfigError, match="off names unknown HParams field 'nope'"):
        register_method(MethodSpec("bad-off", factory, off={"nope": 0.0}))
    with pytest.raises(ConfigError, match="requires unknown env output"):
        register_method(MethodSpec("bad-env", factory, requires=("pixels",)))
    with pytest.raises(ConfigError, match="cannot be an HParams field"):
        register_method(MethodSpec("bad-name", factory, {"replace": Param(0.0, 0.0, 1.0)}))
    with pytest.raises(ConfigError, match=r"Param default 2.0 is outside its own range \[0.0, 1.0\]"):
        Param(2.0, 0.0, 1.0)
    assert cj.registered_methods()[:2] == ("ppo", "dense") and "clash" not in cj.registered_methods()
    assert "lr" in hparam_fields() and len(hparam_fields()) == len(DECLS)


def test_methods_that_share_a_program_are_checked_at_registration():
    """``dense`` runs ``ppo``'s program and ``coevo-ranking`` ``coevo-regression``'s (told apart by
    ``dense_weight`` / ``ranking_weight``); a ``program`` must name a method with the same factory."""
    assert [(m, program_of(m)) for m in cj.registered_methods() if program_of(m) != m] == \
        [("dense", "ppo"), ("coevo-ranking", "coevo-regression")]
    assert cj.default_hparams("dense").dense_weight == 1.0 and cj.default_hparams("ppo").dense_weight == 0.0
    assert cj.default_hparams("coevo-ranking").ranking_weight == 1.0
    assert cj.default_hparams("coevo-regression").ranking_weight == 0.0

    def factory(*a):
        raise AssertionError

    with pytest.raises(ConfigError, match="program='nope' must name a registered method that runs its own program"):
        register_method(MethodSpec("rider", factory, program="nope"))
    with pytest.raises(ConfigError, match="program='dense' must name a registered method that runs its own program"):
        register_method(MethodSpec("rider", method_spec("ppo").factory, program="dense"))
    with pytest.raises(ConfigError, match="program='ppo' needs 'ppo''s factory and intrinsic_stream"):
        register_method(MethodSpec("rider", factory, program="ppo"))
    with pytest.raises(ConfigError, match="'ppo' cannot be unregistered while dense run"):
        unregister_method("ppo")
    assert "rider" not in cj.registered_methods()


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
