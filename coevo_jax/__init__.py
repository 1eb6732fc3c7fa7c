"""coevo-jax: learned rewards and turn-level credit assignment in JAX.

Public API (``__all__``): the configs (:class:`StaticConfig`, :class:`HParams`,
:func:`default_hparams` and their validation), the training loop
(:func:`make_train`, :class:`Trainer`, :class:`TrainState`), its parts
(:func:`rollout`, :class:`Trajectory`, :func:`gae`, :func:`ppo_loss`,
:func:`ppo_update`), the policy networks (:func:`make_policy_network`,
:class:`ActorCritic`; ``make_train(..., network=)`` takes your own), the reward-source
interface (:class:`Signal`, :class:`RewardStreams`, :class:`PolicyView`) and the
methods (:func:`registered_methods`, :func:`method_spec`, :func:`make_signal`).
Adding or removing a method is :mod:`coevo_jax.registry`'s (``register_method``).

Import order: ``config`` declares the core ``HParams`` fields in the registry,
then importing ``signals`` registers every built-in method (each module calls
``register_method``), so after ``import coevo_jax`` the registry is complete.
"""
from coevo_jax.registry import method_spec, registered_methods
from coevo_jax.config import (  # declares the core HParams fields
    ConfigError,
    HParams,
    StaticConfig,
    default_hparams,
    hparam_fields,
    validate_hparams,
    validate_static,
)
from coevo_jax import runtime  # noqa: F401  (opt-in XLA:CPU settings for applications; applies nothing)
from coevo_jax import signals  # registers the built-in methods (after config: the core fields come first)
from coevo_jax.networks import ActorCritic, make_policy_network
from coevo_jax.ppo import PPOBatch, gae, ppo_loss, ppo_update
from coevo_jax.rollout import Trajectory, rollout
from coevo_jax.signals import PolicyView, RewardStreams, Signal, make_signal
from coevo_jax.train import TrainState, Trainer, make_train

__all__ = [
    "ActorCritic", "ConfigError", "HParams", "PPOBatch", "PolicyView", "RewardStreams", "Signal", "StaticConfig",
    "TrainState", "Trainer", "Trajectory", "default_hparams", "gae", "hparam_fields", "make_policy_network",
    "make_signal", "make_train", "method_spec", "ppo_loss", "ppo_update", "registered_methods", "rollout",
    "validate_hparams", "validate_static",
]
