"""Jittable environments: grid worlds and token-level text tasks (gymnax 1.0 API)."""
from envs_jax import _xla  # noqa: F401  (must run before the first JAX computation)
from envs_jax import adapters
from envs_jax.core import (
    Box,
    DelayedReward,
    DelayedRewardParams,
    Discrete,
    EnvParams,
    EnvState,
    Environment,
    OPTIONAL_OUTPUTS,
    EpisodeStats,
    Wrapper,
    make,
    provides,
    register,
    registered,
)

__all__ = [
    "Box", "DelayedReward", "DelayedRewardParams", "Discrete", "EnvParams", "EnvState",
    "Environment", "EpisodeStats", "OPTIONAL_OUTPUTS", "Wrapper", "adapters", "make", "provides", "register",
    "registered",
]
