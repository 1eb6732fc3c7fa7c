"""coevo-jax: learned rewards and turn-level credit assignment in JAX.

Public API: :class:`StaticConfig`, :class:`HParams`, :func:`make_train`,
:class:`Trainer`, :func:`gae`, :func:`ppo_loss`, :func:`ppo_update`, and the
reward-source interface in :mod:`coevo_jax.signals`.
"""
import envs_jax._xla  # noqa: F401  (safe XLA:CPU flags before the first JAX computation)
from coevo_jax.config import (
    METHODS,
    ConfigError,
    HParams,
    StaticConfig,
    default_hparams,
    validate_hparams,
    validate_static,
)
from coevo_jax.networks import ActorCritic, make_policy_network
from coevo_jax.ppo import PPOBatch, gae, make_optimizer, ppo_loss, ppo_update
from coevo_jax.rollout import Trajectory, rollout
from coevo_jax.train import TrainState, Trainer, make_train

__all__ = [
    "METHODS", "ActorCritic", "ConfigError", "HParams", "PPOBatch", "StaticConfig", "TrainState", "Trainer",
    "Trajectory", "default_hparams", "gae", "make_optimizer", "make_policy_network", "make_train", "ppo_loss",
    "ppo_update", "rollout", "validate_hparams", "validate_static",
]
