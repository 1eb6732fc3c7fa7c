"""Control policies that every results table carries.

:func:`uniform_random_curves` runs the uniform-random policy (uniform over
the legal actions when the env reports a legal-action mask) through the same
rollout shape and the same per-iteration episode statistics as a training run
(:func:`coevo_jax.train.episode_metrics`), so its "final" scores are
measured exactly like every learning arm's. An arm whose final success is
below this row's learned something worse than chance.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from coevo_jax.analysis import metrics
from coevo_jax.config import StaticConfig
from coevo_jax.rollout import current_legal_mask
from coevo_jax.train import episode_metrics, raw_key
from envs_jax.core import EpisodeStats


def uniform_actions(key: jax.Array, num_actions: int, mask: jax.Array | None, num_envs: int) -> jax.Array:
    """``[N]`` int32 actions drawn uniformly (among the ``True`` entries of ``mask [N, A]`` when given)."""
    logits = jnp.zeros((num_envs, num_actions)) if mask is None else jnp.where(mask, 0.0, -jnp.inf)
    return jax.random.categorical(key, logits).astype(jnp.int32)


def uniform_random_curves(static: StaticConfig, env, env_params, key: jax.Array) -> dict:
    """Per-iteration ``episode_return``, ``success_rate``, ``episodes``,
    ``episode_length`` and ``env_steps`` ``[num_iterations]`` of the uniform-random
    policy on ``static.num_envs`` envs for ``static.num_iterations`` rollouts of
    ``static.rollout_len`` steps (the training loop's shape). Pure; vmap it over keys."""
    env = env if isinstance(env, EpisodeStats) else EpisodeStats(env)
    n = static.num_envs
    num_actions = env.action_space(env_params).n
    k_reset, k_run = jax.random.split(raw_key(key))
    _, env_state = jax.vmap(env.reset, (0, None))(jax.random.split(k_reset, n), env_params)

    def step(env_state, k):
        k_act, k_env = jax.random.split(k)
        action = uniform_actions(k_act, num_actions, current_legal_mask(env, env_params, env_state), n)
        _, env_state, _, _, _, info = jax.vmap(env.step, (0, 0, 0, None))(
            jax.random.split(k_env, n), env_state, action, env_params)
        return env_state, info

    def iteration(carry, k):
        env_state, last_return, last_success, it = carry
        env_state, info = jax.lax.scan(step, env_state, jax.random.split(k, static.rollout_len))
        stats = _Episodes(info["returned_episode"], info["returned_episode_returns"],
                          info["returned_episode_lengths"].astype(jnp.float32), info["returned_episode_success"])
        metrics, ret, succ = episode_metrics(stats, last_return, last_success)
        metrics["env_steps"] = (it + 1).astype(jnp.float32) * static.steps_per_iteration
        return (env_state, ret, succ, it + 1), metrics

    init = (env_state, jnp.float32(0.0), jnp.float32(0.0), jnp.int32(0))
    _, curves = jax.lax.scan(iteration, init, jax.random.split(k_run, static.num_iterations))
    return curves


def random_curves(study, num_seeds: int | None = None) -> dict:
    """:func:`uniform_random_curves` on a :class:`~coevo_jax.experiment.Study`'s first arm's
    rollout shape and budget, one run per seed ``0 .. num_seeds - 1`` (default: the study's)
    folded into its base seed: numpy ``{metric: [seeds, iterations]}``."""
    static = study.arms[0].static
    env, params = study.make_env()
    n = num_seeds or study.num_seeds
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.PRNGKey(study.base_seed), i))(jnp.arange(n))
    curves = jax.device_get(jax.jit(jax.vmap(lambda k: uniform_random_curves(static, env, params, k)))(keys))
    return {k: np.asarray(v) for k, v in curves.items()}


def random_scores(study, num_seeds: int | None = None, curves: dict | None = None) -> dict:
    """Per-seed scores (:func:`coevo_jax.analysis.metrics.run_scores`) of the
    uniform-random policy (:func:`random_curves`, or the given ``curves``), with
    its env steps under ``"env_steps"``."""
    curves = random_curves(study, num_seeds) if curves is None else curves
    n, static = len(curves["env_steps"]), study.arms[0].static
    scores = metrics.run_scores(curves, np.arange(n), static.num_iterations, study.threshold, study.threshold_metric)
    return {**scores, "env_steps": float(curves["env_steps"][0, -1])}


def random_row(study, num_seeds: int | None = None, scores: dict | None = None) -> dict:
    """The uniform-random control of a :class:`~coevo_jax.experiment.Study`, as a
    summary row: :func:`random_scores` (or the given ``scores``), summarised by the
    same statistics as every arm (``num_seeds`` default: the study's)."""
    from coevo_jax.analysis.stats import score_columns  # report extra (rliable, scipy): imported on use

    scores = scores or random_scores(study, num_seeds)
    n = len(scores["final_success"])
    static = study.arms[0].static
    return {"env": study.env, "arm": "random", "method": "random", "n_seeds": n, "n_diverged": 0,
            **score_columns({k: v for k, v in scores.items() if k != "env_steps"}, study.threshold,
                            static.steps_per_iteration, seed=7),
            "env_steps": scores["env_steps"]}


class _Episodes(NamedTuple):
    """The episode fields :func:`episode_metrics` reads, ``[T, N]`` each."""

    episode_done: jax.Array
    episode_return: jax.Array
    episode_length: jax.Array
    episode_success: jax.Array
