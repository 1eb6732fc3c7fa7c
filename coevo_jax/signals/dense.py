"""Upper-bound baseline: PPO on the environment's hand-designed dense reward
(``info["dense_reward"]``: external reward plus potential-based shaping)."""
from coevo_jax.signals.base import Signal, no_observe, no_update


def make_dense(static, network, env, env_params) -> Signal:
    """``rewards = traj.dense_reward`` (method ``dense``)."""

    def init(key, traj, hp):
        return ()

    def rewards(state, traj, hp):
        return traj.dense_reward, {}

    return Signal(init, no_observe, no_update, rewards)
