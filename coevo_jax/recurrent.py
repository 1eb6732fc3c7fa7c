"""Recurrent policies in the form of PureJaxRL's recurrent PPO (Lu et al. 2022): the rollout carries
the hidden state, resets it before each episode's first observation and stores the carry each step
started from; the PPO update replays each env's window from it (:class:`Sequences`).

Contract (:class:`GRUActorCritic`, or your own module): ``recurrent = True``,
``initialize_carry(batch_shape) -> carry [*batch_shape, H]`` and ``apply(params, carry [B, H], obs
[B, T, ...], first [B, T]) -> (carry, (logits [B, T, A], value [B, T, V], features [B, T, H]))``."""
from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from coevo_jax.encoding import encode_obs
from coevo_jax.layers import activation, head_dot_general, orthogonal, torso


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


def reset_gru_step(size: int, carry: jax.Array, x: jax.Array, reset: jax.Array):
    """One GRU step (the calling compact module's ``cell``) on ``x [B, D]`` from ``carry [B, H]`` zeroed
    where ``reset [B]``: ``(the zeroed carry, the new carry)``, both ``[B, H]``."""
    start = jnp.where(reset[:, None], jnp.zeros_like(carry), carry)
    # orthogonal(): the QR-free initialiser (coevo_jax.layers)
    new, _ = nn.GRUCell(size, recurrent_kernel_init=orthogonal(), name="cell")(start, x)
    return start, new


class _ResetGRU(nn.Module):
    """One GRU step that zeroes the carry where an episode starts:
    ``(carry [B, H], (x [B, D], first [B])) -> (carry, h)``."""

    size: int

    @nn.compact
    def __call__(self, carry, inputs):
        x, first = inputs
        _, carry = reset_gru_step(self.size, carry, x, first)
        return carry, carry  # a GRU's output is its new state


class GRUActorCritic(nn.Module):
    """The recurrent policy (``StaticConfig.network = "gru"``): ``apply(params, carry [B, H], obs [B, T,
    ...], first [B, T]) -> (carry [B, H], (logits [B, T, A], value [B, T, V], features [B, T, H]))``. An
    MLP embedding (``hidden_sizes[0]``) feeds a GRU of ``gru_size`` scanned over time; actor and critic
    torsos (``hidden_sizes[1:]``) read its state, which is also ``features``."""

    num_actions: int
    hidden_sizes: Sequence[int] = (64, 64)
    gru_size: int = 128
    activation: str = "tanh"
    value_heads: int = 1
    vocab: int = 0
    recurrent = True

    def initialize_carry(self, batch_shape: tuple) -> jax.Array:
        """Zeros ``[*batch_shape, gru_size]``."""
        return jnp.zeros(tuple(batch_shape) + (self.gru_size,), jnp.float32)

    @nn.compact
    def __call__(self, carry, obs, first):
        act = activation(self.activation)
        x = encode_obs(obs, obs.ndim - 2, self.vocab)  # [B, T, D]
        x = torso(x, tuple(self.hidden_sizes)[:1], act, "embed")
        scan = nn.scan(_ResetGRU, variable_broadcast="params", split_rngs={"params": False}, in_axes=1, out_axes=1)
        carry, h = scan(self.gru_size, name="gru")(carry, (x, first))  # h [B, T, H]
        a = torso(h, tuple(self.hidden_sizes)[1:], act, "actor")
        logits = nn.Dense(self.num_actions, kernel_init=orthogonal(0.01), name="actor_out",
                          dot_general=head_dot_general)(a)
        v = torso(h, tuple(self.hidden_sizes)[1:], act, "critic")
        value = nn.Dense(self.value_heads, kernel_init=orthogonal(1.0), name="critic_out",
                         dot_general=head_dot_general)(v)
        return carry, (logits, value, h)
