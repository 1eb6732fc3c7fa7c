"""Policy networks. Every policy maps observations ``[..., obs]`` to
``(logits [..., A], value [...], features [..., H])`` where ``features`` is the
penultimate hidden state of the actor (what learned-reward networks read).
With ``value_heads = 2`` (methods with a non-episodic bonus stream, see
:class:`coevo_jax.signals.base.RewardStreams`) ``value`` is ``[..., 2]``: the
critic of the episodic return and that of the intrinsic return, two heads on
one critic torso as in Burda et al. (2018).

The MLP follows PureJaxRL's PPO actor-critic (separate actor and critic
torsos, orthogonal init with gain sqrt(2), 0.01 on the policy head).
"""
from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from coevo_jax.config import StaticConfig


def orthonormal_columns(a: jax.Array) -> jax.Array:
    """``Q`` of the QR decomposition of ``a [m, n]`` (``m >= n``) with a positive
    diagonal of ``R``, by classical Gram-Schmidt with re-orthogonalisation (CGS2,
    as accurate as Householder QR for well-conditioned input).

    Pure ``jnp`` arithmetic in a ``fori_loop``: no LAPACK custom call, so a
    vmapped initialisation holds no batched QR decompositions (the trigger of
    the jax 0.10.2 XLA:CPU hang, see :mod:`envs_jax._xla`).
    """
    m, n = a.shape

    def column(j, q):
        v = a[:, j]
        for _ in range(2):  # project out the columns found so far (later ones are still zero), twice
            v = v - q @ (q.T @ v)
        return q.at[:, j].set(v / jnp.linalg.norm(v))

    return jax.lax.fori_loop(0, n, column, jnp.zeros((m, n), a.dtype))


def orthogonal(scale: float = 1.0):
    """Drop-in for ``flax.linen.initializers.orthogonal(scale)`` on 2-D kernels:
    the same matrix (the sign-corrected ``Q`` of a Gaussian matrix, so
    Haar-distributed) up to float rounding, computed by :func:`orthonormal_columns`."""

    def init(key, shape, dtype=jnp.float32):
        if len(shape) != 2:
            raise ValueError(f"orthogonal: expected a 2-D kernel shape, got {shape}")
        rows, cols = shape
        tall = rows >= cols
        a = jax.random.normal(key, (rows, cols) if tall else (cols, rows), dtype)
        q = orthonormal_columns(a)
        return (scale * (q if tall else q.T)).astype(dtype)

    return init


def _act(name: str):
    return {"tanh": nn.tanh, "relu": nn.relu}[name]


class ActorCritic(nn.Module):
    """MLP actor-critic. ``__call__(obs [..., D]) -> (logits [..., A], value [...] or [..., 2], features [..., H])``."""

    num_actions: int
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"
    value_heads: int = 1

    @nn.compact
    def __call__(self, obs):
        act = _act(self.activation)
        x = obs.astype(jnp.float32)
        h = x
        for i, width in enumerate(self.hidden_sizes):
            h = act(nn.Dense(width, kernel_init=orthogonal(np.sqrt(2)), name=f"actor_{i}")(h))
        features = h
        logits = nn.Dense(self.num_actions, kernel_init=orthogonal(0.01), name="actor_out")(h)
        v = x
        for i, width in enumerate(self.hidden_sizes):
            v = act(nn.Dense(width, kernel_init=orthogonal(np.sqrt(2)), name=f"critic_{i}")(v))
        value = nn.Dense(self.value_heads, kernel_init=orthogonal(1.0), name="critic_out")(v)
        return logits, value[..., 0] if self.value_heads == 1 else value, features


def make_policy_network(static: StaticConfig, env, env_params) -> nn.Module:
    """The policy for ``env``: a causal transformer for integer token observations
    (``static.network='auto'``), else the MLP actor-critic."""
    num_actions = env.action_space(env_params).n
    space = env.observation_space(env_params)
    use_tf = static.network == "transformer" or (
        static.network == "auto" and jnp.issubdtype(space.dtype, jnp.integer)
    )
    if use_tf:
        from coevo_jax.transformer import TransformerActorCritic

        return TransformerActorCritic(
            num_actions=num_actions,
            vocab_size=int(space.high) + 1,
            d_model=static.d_model,
            num_layers=static.num_layers,
            num_heads=static.num_heads,
            max_len=int(space.shape[-1]),
            value_heads=static.value_heads,
        )
    return ActorCritic(num_actions, tuple(static.hidden_sizes), static.activation, static.value_heads)


def features_dim(network: nn.Module, params, example_obs: jax.Array) -> int:
    """Width H of the ``features`` the network returns."""
    return int(jax.eval_shape(network.apply, params, example_obs)[2].shape[-1])
