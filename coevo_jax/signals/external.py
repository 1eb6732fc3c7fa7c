"""Reward sources that read a trajectory field directly: sparse PPO (the
external reward alone, method ``ppo``) and the oracle baseline (the
environment's hand-designed dense reward ``info["dense_reward"]``, method
``dense``). Both are one episodic stream, unnormalised."""
from coevo_jax.signals.base import RewardStreams, Signal, no_observe, no_update


def field_signal(field: str) -> Signal:
    """A :class:`Signal` whose episodic reward is ``getattr(traj, field)`` ``[T, N]``."""

    def init(key, traj, hp):
        return ()

    def rewards(state, traj, hp):
        return state, RewardStreams(getattr(traj, field)), {}

    return Signal(init, no_observe, no_update, rewards)


def make_external(static, network, env, env_params) -> Signal:
    """``rewards = traj.reward`` (method ``ppo``)."""
    return field_signal("reward")
