"""Oracle baseline: PPO on the environment's hand-designed dense reward
``info["dense_reward"]`` (for the grid worlds: the external reward plus
potential-based shaping ``gamma * Phi(s') - Phi(s)`` with ``Phi(terminal) = 0``,
so its optimal policy is the external task's)."""
from envs_jax.core import provides

from coevo_jax.config import ConfigError
from coevo_jax.signals.external import field_signal


def make_dense(static, network, env, env_params):
    """``rewards = traj.dense_reward`` (method ``dense``). An env that declares no
    dense reward is a :class:`~coevo_jax.config.ConfigError` (raised before compiling)."""
    if not provides(env, "dense_reward"):
        raise ConfigError(f"method 'dense': environment {env.name!r} has no dense reward"
                          " (it does not declare 'dense_reward' in optional_outputs)")
    return field_signal("dense_reward")
