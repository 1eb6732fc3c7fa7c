"""Jittable environments: grid worlds and token-level text tasks (gymnax 1.0 API)."""
from envs_jax import adapters, minigrid  # noqa: F401  (registers the gymnax and MiniGrid names)
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
    provides,
)
from envs_jax.give_up import GiveUp, GiveUpState
from envs_jax.horizon import FixedHorizon, FixedHorizonParams, FixedHorizonState
from envs_jax.registry import make, register, registered

__all__ = [
    "Box", "DelayedReward", "DelayedRewardParams", "Discrete", "EnvParams", "EnvState",
    "Environment", "EpisodeStats", "FixedHorizon", "FixedHorizonParams", "FixedHorizonState",
    "GiveUp", "GiveUpState",
    "OPTIONAL_OUTPUTS", "Wrapper", "adapters", "make", "minigrid", "provides", "register",
    "registered",
]
