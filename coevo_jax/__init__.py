"""coevo-jax: learned rewards and turn-level credit assignment in JAX.

Public API: the configs (:class:`StaticConfig`, :class:`HParams`, :func:`static_config`,
:func:`default_hparams`), the training loop (:func:`make_train`, :class:`Trainer`) and its parts, the
policy networks, the reward-source interface (:class:`Signal`, :class:`RewardStreams`) and the
methods (:func:`registered_methods`, :func:`method_spec`, :func:`make_signal`; a method is added with
:func:`coevo_jax.registry.register_method`)."""
from coevo_jax.registry import StaticOptions, method_spec, registered_methods
from coevo_jax.config import (
    ConfigError,
    HParams,
    StaticConfig,
    default_hparams,
    hparam_fields,
    static_config,
    validate_hparams,
    validate_static,
)
from coevo_jax import runtime  # noqa: F401  (opt-in XLA:CPU settings for applications; applies nothing)
from coevo_jax import signals  # registers the built-in methods
from coevo_jax.networks import ActorCritic, make_policy_network
from coevo_jax.ppo import PPOBatch, PPOParams, gae, ppo_loss, ppo_update
from coevo_jax.rollout import Trajectory, rollout
from coevo_jax.signals import PolicyView, RewardStreams, Signal, SignalParams, make_signal
from coevo_jax.train import TrainState, Trainer, make_train

__all__ = [
    "ActorCritic", "ConfigError", "HParams", "PPOBatch", "PPOParams", "PolicyView", "RewardStreams", "Signal",
    "SignalParams", "StaticConfig", "StaticOptions", "TrainState", "Trainer", "Trajectory", "default_hparams", "gae",
    "hparam_fields", "make_policy_network", "make_signal", "make_train", "method_spec", "ppo_loss", "ppo_update",
    "registered_methods", "rollout", "static_config", "validate_hparams", "validate_static",
]
