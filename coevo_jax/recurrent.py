"""Recurrent policies in the form of PureJaxRL's recurrent PPO (Lu et al. 2022): the rollout carries
the hidden state, resets it before each episode's first observation and stores the carry each step
started from; the PPO update replays each env's window from it (:class:`Sequences`).

Contract (:class:`coevo_jax.networks.GRUActorCritic`, or your own module): ``recurrent = True``,
``initialize_carry(batch_shape) -> carry [*batch_shape, H]`` and ``apply(params, carry [B, H], obs
[B, T, ...], first [B, T]) -> (carry, (logits [B, T, A], value [B, T, V], features [B, T, H]))``."""
from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp


class Sequences(NamedTuple):
    """``B`` envs' rollout windows for a recurrent update (leading ``[B]``: minibatches are whole envs)."""

    obs: Any  # [B, T, ...]
    first: jax.Array  # [B, T] bool: obs[b, t] starts an episode (the carry resets before it)
    carry: jax.Array  # [B, H] the carry before obs[b, 0] (before its reset)


def is_recurrent(network) -> bool:
    """Whether ``network`` declares the recurrent policy contract (``recurrent = True``)."""
    return bool(getattr(network, "recurrent", False))


def init_recurrent(network: nn.Module, key: jax.Array, obs: jax.Array):
    """A recurrent policy's parameters from first observations ``obs [N, ...]``."""
    n = obs.shape[0]
    return network.init(key, network.initialize_carry((n,)), obs[:, None], jnp.ones((n, 1), bool))


def step_outputs(network: nn.Module, params, carry, obs, first):
    """One step of every env: ``carry [N, H], obs [N, ...], first [N] -> (carry, (logits [N, A], value,
    features [N, H]))``, ``value`` as the network returns it."""
    carry, out = network.apply(params, carry, obs[:, None], first[:, None])
    return carry, jax.tree.map(lambda x: x[:, 0], out)
