"""Upper-bound baseline: PPO on the environment's hand-designed dense reward
(``info["dense_reward"]``: external reward plus potential-based shaping)."""
from coevo_jax.signals.external import field_signal


def make_dense(static, network, env, env_params):
    """``rewards = traj.dense_reward`` (method ``dense``)."""
    return field_signal("dense_reward")
