"""Reward sources, one module per method, all with the :class:`Signal` interface."""
from __future__ import annotations

import importlib

from coevo_jax.signals.base import (
    PolicyView, ReturnScale, RewardStreams, Signal, gated_update, init_return_scale, scale_normalise,
)

# method name -> (module, factory name); a factory is ``f(static, network, env, env_params) -> Signal``
_FACTORIES = {
    "ppo": ("coevo_jax.signals.external", "make_external"),
    "dense": ("coevo_jax.signals.dense", "make_dense"),
    "icm": ("coevo_jax.signals.icm", "make_icm"),
    "coevo-regression": ("coevo_jax.signals.learned", "make_learned"),
    "coevo-ranking": ("coevo_jax.signals.learned", "make_learned"),
    "coevo-novelty": ("coevo_jax.signals.learned", "make_learned"),
    "siop": ("coevo_jax.signals.potential", "make_potential"),
    "meta": ("coevo_jax.signals.meta", "make_meta"),
}


def available_methods() -> list[str]:
    """Every method name :func:`make_signal` accepts."""
    return list(_FACTORIES)


def make_signal(static, network, env, env_params) -> Signal:
    """The reward source for ``static.method``."""
    if static.method not in _FACTORIES:
        raise ValueError(f"unknown method {static.method!r}; choose one of {', '.join(_FACTORIES)}")
    mod, fn = _FACTORIES[static.method]
    return getattr(importlib.import_module(mod), fn)(static, network, env, env_params)


__all__ = ["PolicyView", "ReturnScale", "RewardStreams", "Signal", "available_methods", "gated_update",
           "init_return_scale", "make_signal", "scale_normalise"]
