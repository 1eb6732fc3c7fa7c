"""Oracle baseline: PPO on the environment's hand-designed dense reward
``info["dense_reward"]`` (for the grid worlds: the external reward plus
potential-based shaping ``gamma * Phi(s') - Phi(s)`` with ``Phi(terminal) = 0``,
so its optimal policy is the external task's)."""
from coevo_jax.registry import MethodSpec, register_method
from coevo_jax.signals.base import field_signal


def make_dense(static, network, env, env_params):
    """``rewards = traj.dense_reward`` (method ``dense``). The method ``requires``
    the env's ``dense_reward``: the Trainer checks it before compiling
    (:func:`coevo_jax.signals.check_env_outputs`)."""
    return field_signal("dense_reward")


register_method(MethodSpec(
    "dense", make_dense, requires=("dense_reward",),
    doc="oracle: PPO on the environment's hand-designed dense reward, one episodic stream",
))
