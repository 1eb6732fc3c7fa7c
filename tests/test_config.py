"""Configs: every HParams leaf is an array; bad values fail before compiling, naming the field."""
import dataclasses

import jax
import jax.numpy as jnp
import pytest

import coevo_jax as cj
from coevo_jax.config import HPARAM_FIELDS, HPARAM_RANGES, ConfigError, validate_hparams, validate_static


def test_every_hparams_leaf_is_an_array():
    hp = cj.HParams()
    leaves = jax.tree.leaves(hp)
    assert len(leaves) == len(HPARAM_FIELDS)
    for name in HPARAM_FIELDS:
        assert isinstance(getattr(hp, name), jax.Array), name
    assert hp.k.dtype == jnp.int32 and hp.lr.dtype == jnp.float32


def test_replace_casts_python_numbers_to_arrays():
    hp = cj.HParams().replace(lr=1e-3, k=8)
    assert isinstance(hp.lr, jax.Array) and hp.lr.dtype == jnp.float32
    assert isinstance(hp.k, jax.Array) and hp.k.dtype == jnp.int32 and int(hp.k) == 8
    assert dataclasses.replace(cj.StaticConfig(), num_envs=8).num_envs == 8


def test_default_hparams_per_method_and_unknown_names():
    assert int(cj.default_hparams("meta").k) == 1
    with pytest.raises(ConfigError, match="method: unknown method 'nope'"):
        cj.default_hparams("nope")
    with pytest.raises(ConfigError, match="unknown HParams field"):
        cj.default_hparams("ppo", learning_rate=1.0)


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("lr", 0.0, r"HParams.lr=0.0 is outside the allowed range \(0.0, 1.0\]"),
        ("lr", -1e-3, r"HParams.lr=-0.001"),
        ("gamma", 1.5, r"HParams.gamma=1.5 is outside the allowed range \[0.0, 1.0\]"),
        ("gae_lambda", -0.1, r"HParams.gae_lambda"),
        ("clip_eps", 0.0, r"HParams.clip_eps"),
        ("ent_coef", -0.01, r"HParams.ent_coef"),
        ("max_grad_norm", 0.0, r"HParams.max_grad_norm"),
        ("k", 0, r"HParams.k=0 is outside the allowed range \[1, 1000000\]"),
        ("reward_lr", float("nan"), r"HParams.reward_lr=nan"),
        ("normalize_int", 2.0, r"HParams.normalize_int=2.0"),
        ("credit_clip", 0.0, r"HParams.credit_clip"),
        ("rnd_lr", -0.5, r"HParams.rnd_lr=-0.5 is outside the allowed range \[0.0, 1.0\]"),
        ("drift_ema", 1.0, r"HParams.drift_ema=1.0 is outside the allowed range \[0.0, 1.0\)"),
    ],
)
def test_invalid_hparams_name_field_value_and_range(field, value, message):
    hp = dataclasses.replace(cj.HParams(), **{field: jnp.asarray(value)})
    with pytest.raises(ConfigError, match=message):
        validate_hparams(hp)


def test_invalid_value_inside_a_batch_is_found():
    hp = cj.HParams()
    batched = dataclasses.replace(hp, lr=jnp.array([1e-3, 2e-3, -1.0]))
    with pytest.raises(ConfigError, match="HParams.lr=-1.0"):
        validate_hparams(batched)


def test_every_range_accepts_the_default():
    validate_hparams(cj.HParams())
    for m in cj.METHODS:
        validate_hparams(cj.default_hparams(m))
    assert set(HPARAM_RANGES) == set(HPARAM_FIELDS)


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
        ({"activation": "gelu"}, r"StaticConfig.activation='gelu'"),
        ({"ensemble_combine": "max"}, r"StaticConfig.ensemble_combine='max'"),
        ({"meta_truncate": 1}, r"StaticConfig.meta_truncate=1 must be < meta_inner_steps=1"),
        ({"reward_input": "pixels"}, r"StaticConfig.reward_input='pixels' must be 'features' or 'obs'"),
        ({"potential_buffer_episodes": 0}, r"StaticConfig.potential_buffer_episodes=0 must be an integer in \[1, "),
        ({"potential_episode_len": 0}, r"StaticConfig.potential_episode_len=0 must be an integer in \[1, "),
    ],
)
def test_invalid_static_config(change, message):
    with pytest.raises(ConfigError, match=message):
        validate_static(dataclasses.replace(cj.StaticConfig(), **change))


def test_make_train_rejects_bad_static_before_compiling():
    import envs_jax

    env, p = envs_jax.make("CartPole-v1")
    with pytest.raises(ConfigError, match="StaticConfig.num_envs"):
        cj.make_train(cj.StaticConfig(num_envs=0), env, p)
