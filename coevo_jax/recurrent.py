"""Recurrent policies: a hidden state that carries the episode's history through the
rollout and the PPO update, in the form of PureJaxRL's recurrent PPO (Lu et al. 2022).

The rollout carries the GRU's hidden state from step to step and resets it
to zeros before the first observation of every episode; it stores the carry
each step started from (``Trajectory.carry``) and which observations start an
episode (``Trajectory.first``). The PPO update then replays each env's whole
window from the carry its first step started from (:class:`Sequences`;
minibatches are whole envs), so the hidden states it differentiates through
are the ones the policy acted on. ``features`` is the GRU's hidden state: every
learned network that reads the policy's features (R_phi, RND, q-advantage's
return model) reads a summary of the history, the seeds' "hidden state".

Every recurrent policy (:class:`coevo_jax.networks.GRUActorCritic`, or your own
flax module) has ``recurrent = True`` and two methods beyond
``init`` / ``apply``: ``initialize_carry(batch_shape) -> carry [*batch_shape, H]``
and ``apply(params, carry [B, H], obs [B, T, ...], first [B, T]) -> (carry,
(logits [B, T, A], value [B, T, V], features [B, T, H]))`` (``value [B, T]``
for one head is accepted too: :func:`coevo_jax.rollout.with_value_heads`).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp


class Sequences(NamedTuple):
    """``B`` envs' rollout windows for a recurrent policy's update (leading
    ``[B]`` on every field, so minibatches are whole envs)."""

    obs: Any  # [B, T, ...]
    first: jax.Array  # [B, T] bool: obs[b, t] starts an episode (the carry resets before it)
    carry: jax.Array  # [B, H] the carry before obs[b, 0] (before its reset)


def is_recurrent(network) -> bool:
    """Whether ``network`` declares the recurrent policy contract (``recurrent = True``)."""
    return bool(getattr(network, "recurrent", False))


def init_recurrent(network: nn.Module, key: jax.Array, obs: jax.Array):
    """The parameters of a recurrent policy, from a batch of first observations ``obs [N, ...]``."""
    n = obs.shape[0]
    return network.init(key, network.initialize_carry((n,)), obs[:, None], jnp.ones((n, 1), bool))


def step_outputs(network: nn.Module, params, carry, obs, first):
    """One step of every env: ``carry [N, H], obs [N, ...], first [N] -> (carry [N, H],
    (logits [N, A], value, features [N, H]))``: ``value`` as the network returns it
    (``[N, V]``, or ``[N]``: :func:`coevo_jax.rollout.with_value_heads` makes it ``[N, V]``)."""
    carry, out = network.apply(params, carry, obs[:, None], first[:, None])
    return carry, jax.tree.map(lambda x: x[:, 0], out)
