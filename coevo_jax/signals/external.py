"""Sparse PPO baseline: the policy optimises the external reward alone."""
from coevo_jax.signals.base import Signal, no_observe, no_update


def make_external(static, network, env, env_params) -> Signal:
    """``rewards = traj.reward`` (method ``ppo``)."""

    def init(key, traj, hp):
        return ()

    def rewards(state, traj, hp):
        return traj.reward, {}

    return Signal(init, no_observe, no_update, rewards)
