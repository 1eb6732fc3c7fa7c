"""Reward sources, one module per method, all with the :class:`Signal` interface.

Each module declares its method's hyperparameter class (a subclass of
:class:`SignalParams`) and registers its method(s) with
:func:`coevo_jax.registry.register_method` when it is imported; importing this
package imports every built-in one (an import error surfaces here), so
``import coevo_jax`` registers them all.
"""
from __future__ import annotations

from envs_jax.core import provides

from coevo_jax.registry import ConfigError, method_spec
from coevo_jax.signals.base import (
    REFIT_STEPS, CreditFn, PolicyView, RefitGateParams, ReturnScale, RewardStreams, Signal, SignalParams, gated_update,
    init_return_scale, scale_normalise,
)

# the built-in methods, in registration order (ppo first: it is the reference the others reduce to)
from coevo_jax.signals import external  # noqa: F401  ppo, dense
from coevo_jax.signals import icm  # noqa: F401  icm
from coevo_jax.signals import learned  # noqa: F401  coevo-regression, coevo-ranking, coevo-novelty
from coevo_jax.signals import potential  # noqa: F401  siop
from coevo_jax.signals import meta  # noqa: F401  meta
from coevo_jax.signals import placebo  # noqa: F401  constant, siop-shuffled (controls)
from coevo_jax.signals import critic_shaping  # noqa: F401  siop-critic (control)
from coevo_jax.signals import ircr  # noqa: F401  ircr
from coevo_jax.signals import q_advantage  # noqa: F401  q-advantage
from coevo_jax.signals import rrd  # noqa: F401  rrd
from coevo_jax.signals import hca  # noqa: F401  hca
from coevo_jax.signals import cca  # noqa: F401  cca


def make_signal(static, network, env, env_params) -> Signal:
    """The reward source for ``static.method`` (its registered spec's factory)."""
    return method_spec(static.method).factory(static, network, env, env_params)


def check_env_outputs(method: str, env) -> None:
    """:class:`~coevo_jax.registry.ConfigError` naming the method, the env and the
    output when ``env`` lacks an optional output the method ``requires``."""
    for output in method_spec(method).requires:
        if not provides(env, output):
            raise ConfigError(f"method {method!r} requires the environment output {output!r}, but environment"
                              f" {env.name!r} has no {output.replace('_', ' ')} (it declares optional_outputs="
                              f"{tuple(env.optional_outputs)})")


__all__ = ["CreditFn", "PolicyView", "RefitGateParams", "ReturnScale", "RewardStreams", "Signal", "SignalParams",
           "check_env_outputs", "gated_update", "init_return_scale", "make_signal", "scale_normalise"]
