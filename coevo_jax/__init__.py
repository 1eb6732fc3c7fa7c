"""coevo-jax: learned rewards and turn-level credit assignment in JAX.

Public API: :class:`StaticConfig`, :class:`HParams`, :func:`make_train`,
:class:`Trainer`, :func:`gae`, :func:`ppo_loss`, :func:`ppo_update`, the
reward-source interface in :mod:`coevo_jax.signals` and the method registry
(:mod:`coevo_jax.registry`: a reward method is one :class:`MethodSpec`).

Import order: ``config`` declares the core ``HParams`` fields in the registry,
then importing ``signals`` registers every built-in method (each module calls
``register_method``), so after ``import coevo_jax`` the registry is complete.
"""
from coevo_jax import registry
from coevo_jax.registry import MethodSpec, Param, method_spec, register_method, registered_methods, unregister_method
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
from coevo_jax.ppo import PPOBatch, gae, make_optimizer, ppo_loss, ppo_update
from coevo_jax.rollout import Trajectory, rollout
from coevo_jax.train import TrainState, Trainer, make_train

__all__ = [
    "ActorCritic", "ConfigError", "HParams", "MethodSpec", "PPOBatch", "Param", "StaticConfig", "TrainState",
    "Trainer", "Trajectory", "default_hparams", "gae", "hparam_fields", "make_optimizer", "make_policy_network",
    "make_train", "method_spec", "ppo_loss", "ppo_update", "register_method", "registered_methods", "registry",
    "rollout", "signals", "unregister_method", "validate_hparams", "validate_static",
]
