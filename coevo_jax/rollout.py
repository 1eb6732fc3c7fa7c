"""Collect a ``[T, N]`` trajectory with ``lax.scan`` (``T`` steps of ``N`` envs) on one of three paths:
plain (the policy applied to the whole observation), cached (transformer policies on token buffers
decode incrementally with a key-value cache, ``decode_chunk``) and recurrent
(:mod:`coevo_jax.recurrent`). Critic values always carry a heads axis ``[T, N, V]``
(:func:`with_value_heads`): head 0 episodic, head 1 intrinsic."""
from __future__ import annotations

from typing import Any, NamedTuple

import distrax
import flax.linen as nn
import jax
import jax.numpy as jnp

from coevo_jax.packing import PAD, decode_rows
from coevo_jax.recurrent import is_recurrent, step_outputs
from envs_jax.core import provides


class Trajectory(NamedTuple):
    """One rollout, leading axes ``[T, N]`` on every field. ``next_obs[t]``: the observation before any
    auto-reset (``info["final_observation"]``); ``next_value``: the critic on it (bootstraps truncated
    episodes); ``cont_value``: the critic on the observation the env continues from after step ``t``
    (after any auto-reset; bootstraps the non-episodic intrinsic stream). ``episode_*`` fields are set
    on ``episode_done`` steps."""

    obs: jax.Array  # [T, N, ...]
    action: jax.Array  # [T, N] int32
    logp: jax.Array  # [T, N]
    value: jax.Array  # [T, N, V]
    features: jax.Array  # [T, N, H]
    reward: jax.Array  # [T, N] external reward
    dense_reward: jax.Array  # [T, N] hand-designed dense reward (or the external one)
    terminated: jax.Array  # [T, N] bool
    truncated: jax.Array  # [T, N] bool
    next_obs: jax.Array  # [T, N, ...]
    next_value: jax.Array  # [T, N, V]
    episode_done: jax.Array  # [T, N] bool
    episode_return: jax.Array  # [T, N]
    episode_length: jax.Array  # [T, N]
    episode_success: jax.Array  # [T, N]
    legal_mask: Any = None  # [T, N, A] bool legal actions at obs[t] (envs with a legal-action mask), else None
    cont_value: Any = None  # [T, N, V] critic on the observation after step t, after any auto-reset (see above)
    probs: Any = None  # [T, N, A] the policy's action probabilities at obs[t] (legal actions only), as it acted
    carry: Any = None  # [T, N, H] a recurrent policy's carry before step t (before its reset), else None
    first: Any = None  # [T, N] bool obs[t] starts an episode (a recurrent policy's carry resets), else None


def flatten_time(traj_field: jax.Array) -> jax.Array:
    """``[T, N, ...] -> [T * N, ...]``: one trajectory field as a flat batch."""
    return traj_field.reshape((-1,) + traj_field.shape[2:])


class RolloutState(NamedTuple):
    env_state: Any  # batched [N] EpisodeStats state
    obs: jax.Array  # [N, ...]
    carry: Any = None  # [N, H] a recurrent policy's carry after the last step, else None
    first: Any = None  # [N] bool obs starts an episode (recurrent policies), else None


ILLEGAL_LOGIT = -1e9


def mask_logits(logits: jax.Array, mask: jax.Array | None) -> jax.Array:
    """``logits [..., A]`` with ``ILLEGAL_LOGIT`` where ``mask`` is False; unchanged for ``mask=None``."""
    if mask is None:
        return logits
    return jnp.where(mask, logits, ILLEGAL_LOGIT)


def has_legal_mask(env) -> bool:
    """Whether ``env`` (possibly wrapped) declares legal-action masks."""
    return provides(env, "legal_mask")


def current_legal_mask(env, env_params, env_state) -> jax.Array | None:
    """Bool ``[N, A]`` legal actions of the batched current states, or ``None``."""
    if not has_legal_mask(env):
        return None
    return jax.vmap(env.legal_mask, (0, None))(env_state, env_params)


def sample_action(logits: jax.Array, key: jax.Array, mask: jax.Array | None = None):
    """``logits [N, A] -> (action [N] int32, logp [N], probs [N, A])``, sampling only where ``mask
    [N, A]`` is True when given."""
    dist = distrax.Categorical(logits=mask_logits(logits, mask))
    action = dist.sample(seed=key)
    return action.astype(jnp.int32), dist.log_prob(action), dist.probs


def with_value_heads(outputs):
    """The policy's outputs ``(logits [..., A], value, features [..., H])`` with ``value [..., V]``: a
    network's ``value [...]`` gets a heads axis of 1. Every call of the policy in the rollout and the
    PPO update goes through it."""
    logits, value, features = outputs
    if value.ndim == logits.ndim - 1:
        value = value[..., None]
    return logits, value, features


def policy_step(network: nn.Module, params, obs: jax.Array, key: jax.Array, mask: jax.Array | None = None):
    """Sample actions. ``obs [N, ...] -> (action [N], logp [N], probs [N, A], value [N, V], features [N, H])``."""
    logits, value, features = with_value_heads(network.apply(params, obs))
    action, logp, probs = sample_action(logits, key, mask)
    return action, logp, probs, value, features


def env_step(env, env_params, env_state, action: jax.Array, key: jax.Array):
    """Step the batched env: ``(obs [N, ...], env_state, fields)``, ``fields`` the env-side part of a
    :class:`Trajectory` row."""
    env_keys = jax.random.split(key, action.shape[0])
    obs, env_state, reward, term, trunc, info = jax.vmap(env.step, (0, 0, 0, None))(
        env_keys, env_state, action, env_params
    )
    dense = info["dense_reward"] if "dense_reward" in info else reward
    fields = dict(
        reward=reward, dense_reward=dense.astype(jnp.float32), terminated=term, truncated=trunc,
        next_obs=info["final_observation"], episode_done=info["returned_episode"],
        episode_return=info["returned_episode_returns"],
        episode_length=info["returned_episode_lengths"].astype(jnp.float32),
        episode_success=info["returned_episode_success"],
        next_legal_mask=info.get("legal_mask"),
    )
    return obs, env_state, fields


def rollout(network: nn.Module, params, env, env_params, state: RolloutState, key: jax.Array, length: int,
            decode_chunk: int | None = None):
    """``(new RolloutState, Trajectory [length, N])``: ``length`` steps of the batched env with the
    current policy. ``env`` must be wrapped in :class:`envs_jax.EpisodeStats`. With ``decode_chunk``
    (static; the network provides ``init_cache`` and ``decode_step``) the policy decodes incrementally,
    equal to the plain path up to float rounding."""
    if decode_chunk is not None:
        return _rollout_cached(network, params, env, env_params, state, key, length, decode_chunk)
    if is_recurrent(network):
        return _rollout_recurrent(network, params, env, env_params, state, key, length)

    def one_step(carry, step_key):
        ro, mask = carry
        k_act, k_env = jax.random.split(step_key)
        action, logp, probs, value, features = policy_step(network, params, ro.obs, k_act, mask)
        obs, env_state, fields = env_step(env, env_params, ro.env_state, action, k_env)
        next_mask = fields.pop("next_legal_mask")
        step = dict(obs=ro.obs, action=action, logp=logp, probs=probs, value=value, features=features,
                    legal_mask=mask, **fields)
        return (RolloutState(env_state, obs), next_mask), step

    mask = current_legal_mask(env, env_params, state.env_state)
    (state, _), steps = jax.lax.scan(one_step, (state, mask), jax.random.split(key, length))
    next_value = with_value_heads(network.apply(params, steps["next_obs"]))[1]
    last_value = with_value_heads(network.apply(params, state.obs))[1]  # the next rollout's first observation
    cont_value = jnp.concatenate([steps["value"][1:], last_value[None]], axis=0)
    return state, Trajectory(next_value=next_value, cont_value=cont_value, **steps)


def _rollout_recurrent(network, params, env, env_params, state: RolloutState, key, length: int):
    """The recurrent path of :func:`rollout`; ``next_value[t]`` comes from the carry after step ``t``,
    without a reset."""

    def one_step(carry, step_key):
        ro, mask = carry
        k_act, k_env = jax.random.split(step_key)
        new_carry, out = step_outputs(network, params, ro.carry, ro.obs, ro.first)
        logits, value, features = with_value_heads(out)
        action, logp, probs = sample_action(logits, k_act, mask)
        obs, env_state, fields = env_step(env, env_params, ro.env_state, action, k_env)
        next_mask = fields.pop("next_legal_mask")
        next_out = step_outputs(network, params, new_carry, fields["next_obs"], jnp.zeros_like(ro.first))[1]
        next_value = with_value_heads(next_out)[1]
        done = jnp.logical_or(fields["terminated"], fields["truncated"])
        step = dict(obs=ro.obs, action=action, logp=logp, probs=probs, value=value, features=features,
                    legal_mask=mask, carry=ro.carry, first=ro.first, next_value=next_value, **fields)
        return (RolloutState(env_state, obs, new_carry, done), next_mask), step

    mask = current_legal_mask(env, env_params, state.env_state)
    (state, _), steps = jax.lax.scan(one_step, (state, mask), jax.random.split(key, length))
    last_value = with_value_heads(step_outputs(network, params, state.carry, state.obs, state.first)[1])[1]
    cont_value = jnp.concatenate([steps["value"][1:], last_value[None]], axis=0)
    return state, Trajectory(cont_value=cont_value, **steps)


# Cached rollouts decode the partner's reply / a fresh prompt on compacted groups of
# 1/REPLY_SHARE / 1/RESET_SHARE of the envs (more groups run when more envs need one).
REPLY_SHARE, RESET_SHARE = 4, 16


def _rollout_cached(network, params, env, env_params, state: RolloutState, key, length: int, chunk: int):
    """The key-value-cached path of :func:`rollout`: per step, act, step the env, then decode
    ``final_observation`` (the agent's token for every env, the partner's reply on a compacted
    sub-batch) and the fresh prompts of the envs that reset."""
    n = state.obs.shape[0]

    def decode(c):  # ((logits, value [N, V], features), cache) after decoding up to c new tokens
        def call(cache, obs):
            out, cache = network.apply(params, cache, obs, chunk=c, method=network.decode_step)
            return with_value_heads(out), cache
        return call

    cache = network.init_cache(state.obs.shape[:-1], state.obs.shape[-1], chunk=chunk)
    out, cache = decode(state.obs.shape[-1])(cache, state.obs)  # prefill: one causal pass
    reply_group, reset_group = -(-n // REPLY_SHARE), -(-n // RESET_SHARE)

    def one_step(carry, step_key):
        ro, mask, out, cache = carry
        logits, value, features = out
        k_act, k_env = jax.random.split(step_key)
        action, logp, probs = sample_action(logits, k_act, mask)
        obs, env_state, fields = env_step(env, env_params, ro.env_state, action, k_env)
        next_mask = fields.pop("next_legal_mask")
        final = fields["next_obs"]
        if reply_group < n:
            out_final, cache = decode(1)(cache, final)
            more = jnp.sum(final != PAD, axis=-1) > cache["length"]  # a reply follows the agent's token
            out_final, cache = decode_rows(decode(chunk), cache, final, out_final, more, reply_group)
        else:  # too few envs to gain from compacting
            out_final, cache = decode(chunk)(cache, final)
        reset = jnp.logical_or(fields["terminated"], fields["truncated"])
        out, cache = decode_rows(decode(chunk), cache, obs, out_final, reset, reset_group)
        step = dict(obs=ro.obs, action=action, logp=logp, probs=probs, value=value, features=features,
                    next_value=out_final[1], cont_value=out[1], legal_mask=mask, **fields)
        return (RolloutState(env_state, obs), next_mask, out, cache), step

    mask = current_legal_mask(env, env_params, state.env_state)
    (state, _, _, _), steps = jax.lax.scan(one_step, (state, mask, out, cache), jax.random.split(key, length))
    return state, Trajectory(**steps)
