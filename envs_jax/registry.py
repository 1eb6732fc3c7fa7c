"""The registry of environment names: :func:`register`, :func:`registered` and
:func:`make` (a registered env with the harder variants of its keyword
arguments: time limit, fixed horizon, give-up action, delayed reward)."""
from __future__ import annotations

import importlib
from typing import Any, Callable

from envs_jax.core import DelayedReward, Environment
from envs_jax.give_up import GiveUp
from envs_jax.horizon import FixedHorizon, check_horizon

_REGISTRY: dict[str, Callable[..., Environment]] = {}


def register(name: str, factory: Callable[..., Environment]) -> None:
    """Register ``factory(**kwargs) -> Environment`` under ``name``."""
    _REGISTRY[name] = factory


def registered() -> list[str]:
    """Sorted names ``make`` accepts."""
    _load_builtin()
    return sorted(_REGISTRY)


def make(name: str, **kwargs) -> tuple[Environment, Any]:
    """``(env, default_params)`` for a registered name.

    ``reward_freq=D`` wraps the environment in :class:`DelayedReward`;
    ``max_steps=T`` sets the time limit in the returned params
    (``params.max_steps_in_episode``, gymnax's field; every env has one); ``fixed_horizon=H`` wraps it in
    :class:`~envs_jax.horizon.FixedHorizon` (every episode exactly ``H`` steps;
    ``max_steps``, if also given, must equal ``H``; a delay wraps outside it);
    ``give_up=True`` adds :class:`~envs_jax.give_up.GiveUp`'s action that ends
    the episode with reward 0 (innermost);
    other keyword arguments go to the environment's constructor.
    """
    _load_builtin()
    if name not in _REGISTRY:
        raise ValueError(f"unknown environment {name!r}; registered: {', '.join(sorted(_REGISTRY))}")
    reward_freq = kwargs.pop("reward_freq", None)
    max_steps = kwargs.pop("max_steps", None)
    fixed_horizon = kwargs.pop("fixed_horizon", None)
    give_up = kwargs.pop("give_up", False)
    if give_up not in (True, False, 0, 1):
        raise ValueError(f"give_up must be True or False, got {give_up!r}")
    if fixed_horizon is not None:
        fixed_horizon = check_horizon(fixed_horizon)
        if max_steps is not None and max_steps != fixed_horizon:
            raise ValueError(
                f"max_steps={max_steps} disagrees with fixed_horizon={fixed_horizon}: a fixed-horizon "
                "episode lasts exactly fixed_horizon steps (give one of them, or equal values)"
            )
    env = _REGISTRY[name](**kwargs)
    params = env.default_params
    if max_steps is not None:
        if int(max_steps) != max_steps or max_steps < 1:
            raise ValueError(f"max_steps must be an integer >= 1, got {max_steps}")
        params = params.replace(max_steps_in_episode=int(max_steps))
    if give_up:
        env = GiveUp(env)
    if fixed_horizon is not None:
        env = FixedHorizon(env, fixed_horizon)
        params = env.wrap_params(params)
    if reward_freq is not None:
        if int(reward_freq) < 1:
            raise ValueError(f"reward_freq must be an integer >= 1, got {reward_freq}")
        env = DelayedReward(env, int(reward_freq))
        params = env.default_params.replace(env=params)
    return env, params


_LOADED = False


def _load_builtin() -> None:
    """Import the built-in env packages (they register their names), once; here rather than at
    the top because they import this module."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    for mod in ("envs_jax.grid", "envs_jax.chain", "envs_jax.text", "envs_jax.adapters", "envs_jax.minigrid"):
        importlib.import_module(mod)
