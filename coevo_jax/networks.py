"""Policy networks. Every policy maps observations ``[..., obs]`` to
``(logits [..., A], value [...], features [..., H])`` where ``features`` is the
penultimate hidden state of the actor (what learned-reward networks read).

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


def _act(name: str):
    return {"tanh": nn.tanh, "relu": nn.relu}[name]


class ActorCritic(nn.Module):
    """MLP actor-critic. ``__call__(obs [..., D]) -> (logits [..., A], value [...], features [..., H])``."""

    num_actions: int
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"

    @nn.compact
    def __call__(self, obs):
        act = _act(self.activation)
        x = obs.astype(jnp.float32)
        h = x
        for i, width in enumerate(self.hidden_sizes):
            h = act(nn.Dense(width, kernel_init=nn.initializers.orthogonal(np.sqrt(2)), name=f"actor_{i}")(h))
        features = h
        logits = nn.Dense(self.num_actions, kernel_init=nn.initializers.orthogonal(0.01), name="actor_out")(h)
        v = x
        for i, width in enumerate(self.hidden_sizes):
            v = act(nn.Dense(width, kernel_init=nn.initializers.orthogonal(np.sqrt(2)), name=f"critic_{i}")(v))
        value = nn.Dense(1, kernel_init=nn.initializers.orthogonal(1.0), name="critic_out")(v)[..., 0]
        return logits, value, features


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
        )
    return ActorCritic(num_actions, tuple(static.hidden_sizes), static.activation)


def features_dim(network: nn.Module, params, example_obs: jax.Array) -> int:
    """Width H of the ``features`` the network returns."""
    return int(jax.eval_shape(network.apply, params, example_obs)[2].shape[-1])
