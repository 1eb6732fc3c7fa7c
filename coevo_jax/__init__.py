"""coevo-jax: learned rewards and turn-level credit assignment in JAX.

Public API (``__all__``): the configs (:class:`StaticConfig` =
``static_config(method, **flat fields)``, whose ``signal`` holds the method's
static options, a :class:`StaticOptions`; :class:`HParams`
= ``HParams(ppo=PPOParams(...), signal=<the method's params class>)``,
:func:`default_hparams` and their validation), the training loop
(:func:`make_train`, :class:`Trainer`, :class:`TrainState`), its parts
(:func:`rollout`, :class:`Trajectory`, :func:`gae`, :func:`ppo_loss`,
:func:`ppo_update`), the policy networks (:func:`make_policy_network`,
:class:`ActorCritic`; ``make_train(..., network=)`` takes your own), the reward-source
interface (:class:`Signal`, :class:`RewardStreams`, :class:`PolicyView`) and the
methods (:func:`registered_methods`, :func:`method_spec`, :func:`make_signal`).
Adding or removing a method is :mod:`coevo_jax.registry`'s (``register_method``);
its hyperparameters are a class declared with :func:`coevo_jax.params.hyperparams`,
its static options (if any) a frozen dataclass subclass of :class:`StaticOptions`.
Importing ``signals`` registers every built-in method (each module calls
``register_method``).
"""
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
