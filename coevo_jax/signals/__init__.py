"""Reward sources, one module per method, all with the :class:`Signal` interface."""
from __future__ import annotations

import importlib

from coevo_jax.signals.base import PolicyView, Signal, gated_update, mix_rewards, standardise

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
    """Methods whose modules are importable in this installation."""
    out = []
    for name, (mod, _) in _FACTORIES.items():
        try:
            importlib.import_module(mod)
            out.append(name)
        except ModuleNotFoundError:
            pass
    return out


def make_signal(static, network, env, env_params) -> Signal:
    """The reward source for ``static.method``."""
    if static.method not in _FACTORIES:
        raise ValueError(f"unknown method {static.method!r}; choose one of {', '.join(_FACTORIES)}")
    mod, fn = _FACTORIES[static.method]
    return getattr(importlib.import_module(mod), fn)(static, network, env, env_params)


__all__ = ["PolicyView", "Signal", "available_methods", "gated_update", "make_signal", "mix_rewards", "standardise"]
