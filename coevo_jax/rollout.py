"""Collect a ``[T, N]`` trajectory with ``lax.scan`` (T steps of N envs)."""
from __future__ import annotations

from typing import Any, NamedTuple

import distrax
import flax.linen as nn
import jax
import jax.numpy as jnp


class Trajectory(NamedTuple):
    """One rollout. Leading axes ``[T, N]`` on every field.

    ``next_obs[t]`` is the observation the step produced before any auto-reset
    (``info["final_obs"]``), so ``next_obs[t] == obs[t+1]`` unless the episode
    ended at ``t``. ``next_value`` is the critic on ``next_obs`` (bootstraps
    truncated episodes). ``episode_*`` fields are set on ``episode_done`` steps.
    """

    obs: jax.Array  # [T, N, ...]
    action: jax.Array  # [T, N] int32
    logp: jax.Array  # [T, N]
    value: jax.Array  # [T, N]
    features: jax.Array  # [T, N, H]
    reward: jax.Array  # [T, N] external reward
    dense_reward: jax.Array  # [T, N] hand-designed dense reward (or the external one)
    terminated: jax.Array  # [T, N] bool
    truncated: jax.Array  # [T, N] bool
    next_obs: jax.Array  # [T, N, ...]
    next_value: jax.Array  # [T, N]
    episode_done: jax.Array  # [T, N] bool
    episode_return: jax.Array  # [T, N]
    episode_length: jax.Array  # [T, N]
    episode_success: jax.Array  # [T, N]


class RolloutState(NamedTuple):
    env_state: Any  # batched [N] EpisodeStats state
    obs: jax.Array  # [N, ...]


def policy_step(network: nn.Module, params, obs: jax.Array, key: jax.Array):
    """Sample actions. ``obs [N, ...] -> (action [N], logp [N], value [N], features [N, H])``."""
    logits, value, features = network.apply(params, obs)
    dist = distrax.Categorical(logits=logits)
    action = dist.sample(seed=key)
    return action.astype(jnp.int32), dist.log_prob(action), value, features


def rollout(network: nn.Module, params, env, env_params, state: RolloutState, key: jax.Array, length: int):
    """Run ``length`` steps of the batched env with the current policy.

    ``env`` must be wrapped in :class:`envs_jax.EpisodeStats`. Returns
    ``(new RolloutState, Trajectory [length, N])``.
    """
    num_envs = state.obs.shape[0]

    def one_step(carry: RolloutState, step_key):
        k_act, k_env = jax.random.split(step_key)
        action, logp, value, features = policy_step(network, params, carry.obs, k_act)
        env_keys = jax.random.split(k_env, num_envs)
        obs, env_state, reward, term, trunc, info = jax.vmap(env.step, (0, 0, 0, None))(
            env_keys, carry.env_state, action, env_params
        )
        dense = info["dense_reward"] if "dense_reward" in info else reward
        step = dict(
            obs=carry.obs, action=action, logp=logp, value=value, features=features, reward=reward,
            dense_reward=dense.astype(jnp.float32), terminated=term, truncated=trunc,
            next_obs=info["final_obs"], episode_done=info["returned_episode"],
            episode_return=info["returned_episode_returns"],
            episode_length=info["returned_episode_lengths"].astype(jnp.float32),
            episode_success=info["returned_episode_success"],
        )
        return RolloutState(env_state, obs), step

    state, steps = jax.lax.scan(one_step, state, jax.random.split(key, length))
    next_value = network.apply(params, steps["next_obs"])[1]
    return state, Trajectory(next_value=next_value, **steps)
