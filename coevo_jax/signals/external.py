"""Rewards read from the environment: sparse PPO (method ``ppo``) and the dense
oracle (method ``dense``), one episodic stream, unnormalised.

``dense`` is PPO on the env's hand-designed dense reward ``info["dense_reward"]``
(for the grid worlds: the external reward plus potential-based shaping ``gamma *
Phi(s') - Phi(s)`` with ``Phi(terminal) = 0``, so its optimal policy is the
external task's). The two are one signal told apart by the traced
``hp.signal.dense_weight`` (0: ``ppo``, 1: ``dense``): one factory and one
params class, so the study runner compiles one program for both. ``ppo``'s
reward is exactly the external one: ``1 * r + 0 * d == r`` for a finite ``d``.
"""
from coevo_jax.params import hyperparams, unit
from coevo_jax.registry import MethodSpec, register_method
from coevo_jax.signals.base import RewardStreams, Signal, SignalParams, no_observe, no_update


@hyperparams
class ExternalParams(SignalParams):
    """``ppo``'s and ``dense``'s hyperparameters."""

    dense_weight: float = unit(0.0, doc="weight of the env's dense reward, 1 - it of the external reward"
                                        " (ppo 0, dense 1)")


def external_rewards(traj, hp) -> RewardStreams:
    """``(1 - w) * traj.reward + w * traj.dense_reward`` ``[T, N]``, ``w = hp.signal.dense_weight``
    (``traj.dense_reward`` is the external reward on envs without a dense one)."""
    w = hp.signal.dense_weight
    return RewardStreams((1.0 - w) * traj.reward + w * traj.dense_reward)


def make_external(static, network, env, env_params) -> Signal:
    """The env's reward, sparse or dense by ``hp.signal.dense_weight`` (methods ``ppo``, ``dense``). ``dense``
    ``requires`` the env's ``dense_reward``: the Trainer checks it before compiling
    (:func:`coevo_jax.signals.check_env_outputs`)."""

    def init(key, traj, hp):
        return ()

    def rewards(state, traj, hp):
        return state, external_rewards(traj, hp), {}

    return Signal(init, no_observe, no_update, rewards)


register_method(MethodSpec(
    "ppo", make_external, ExternalParams,
    doc="sparse PPO: the external reward alone, one episodic stream (the reference every method reduces to)",
))
register_method(MethodSpec(
    "dense", make_external, ExternalParams, {"dense_weight": 1.0}, requires=("dense_reward",),
    doc="oracle: PPO on the environment's hand-designed dense reward, one episodic stream",
))
