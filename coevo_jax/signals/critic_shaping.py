"""SIOP's credit with PPO's own critic as the potential (method ``siop-critic``): the control that asks
what SIOP's potential adds beyond the critic.

``siop-critic`` keeps SIOP's credit construction (:mod:`coevo_jax.signals.potential`) and replaces
``Phi`` by the critic's episodic head ``V`` as recorded at collection time (``traj.value``,
``traj.next_value``; no gradient, no network of its own):

    F_t = gamma * V(s_t+1) - V(s_t),   V(s_t+1) = 0 if terminated_t, V(final_obs_t) if truncated_t,

spread over ``static.signal.credit_nstep`` steps, clipped at ``hp.signal.credit_clip`` and paid as
``beta_ext * r_ext + beta_int * F``, raw, exactly as ``siop`` with ``normalize_int = 0``
(:func:`~coevo_jax.signals.potential.trajectory_shaping`); ``hp.signal.normalize_int`` is not read.
The critic trains on this shaped stream, so the combined baseline ``(1 + beta_int) V`` tends to the
external value (``docs/design.md``, ``coevo_jax.signals.critic_shaping``); the optimal policies are
unchanged. ``beta_int = 0`` (``off``) is sparse PPO exactly.
"""
from __future__ import annotations

import dataclasses

from coevo_jax.registry import MethodSpec, StaticOptions, register_method
from coevo_jax.signals.base import Signal, float_metrics, no_observe, no_update
from coevo_jax.signals.potential import ShapingParams, episodic_values, shaping_streams, trajectory_shaping


@dataclasses.dataclass(frozen=True)
class CriticShapingStatic(StaticOptions):
    """``siop-critic``'s static options (``StaticConfig.signal``)."""

    credit_nstep: int = 1  # > 1: each step's credit spread back over n steps, as siop's (PotentialStatic)

    checks = {"credit_nstep": (1, 1024)}


def make_critic_shaping(static, network=None, env=None, env_params=None) -> Signal:
    """``siop-critic``: SIOP's shaping credit with ``Phi = V``, PPO's critic (module docstring)."""
    nstep = int(static.signal.credit_nstep)

    def init(key, traj, hp):
        return ()

    def rewards(state, traj, hp):
        phi, phi_next = episodic_values(traj)
        streams, metrics = shaping_streams(trajectory_shaping(phi, phi_next, traj, hp, nstep), phi, traj, hp)
        return state, streams, float_metrics(metrics)

    return Signal(init, no_observe, no_update, rewards)


register_method(MethodSpec(
    "siop-critic", make_critic_shaping, ShapingParams,  # siop's mixing: raw shaping in units of the external return
    static=CriticShapingStatic, off={"beta_int": 0.0},
    doc="control: siop's shaping credit gamma V(s') - V(s) with PPO's own critic V as the potential",
))
