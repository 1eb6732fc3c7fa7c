"""Sparse PPO (method ``ppo``): the external reward alone, one episodic stream,
unnormalised (:func:`~coevo_jax.signals.base.field_signal`)."""
from coevo_jax.registry import MethodSpec, register_method
from coevo_jax.signals.base import Signal, field_signal


def make_external(static, network, env, env_params) -> Signal:
    """``rewards = traj.reward`` (method ``ppo``)."""
    return field_signal("reward")


register_method(MethodSpec(
    "ppo", make_external,
    doc="sparse PPO: the external reward alone, one episodic stream (the reference every method reduces to)",
))
