"""Policy networks: ``obs [..., D] -> (logits [..., A], value [..., V], features [..., H])``, ``features``
the actor's penultimate hidden state (what learned rewards read), ``V = value_heads`` (1, or 2: the
episodic and the intrinsic critic on one torso, Burda et al. 2018; one head may return ``value
[...]``). :class:`ActorCritic`, the MLP, follows PureJaxRL's PPO actor-critic; the dialogue networks
(:mod:`coevo_jax.dialogue`) and the transformer read token buffers; :class:`~coevo_jax.recurrent.GRUActorCritic`
is recurrent. :func:`make_policy_network` picks one by ``StaticConfig.network``; :func:`check_policy_network`
checks any module against the contract. Design notes: ``docs/design.md``."""
from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from coevo_jax.config import ConfigError, StaticConfig
from coevo_jax.dialogue import BagActorCritic, UtteranceTransformer, exchange_slots, utterance_tokens
from coevo_jax.encoding import encode_obs, obs_vocab
from coevo_jax.layers import activation, head_dot_general, orthogonal
from coevo_jax.recurrent import GRUActorCritic
from coevo_jax.transformer import TransformerActorCritic


class ActorCritic(nn.Module):
    """MLP actor-critic. ``__call__(obs [..., D]) -> (logits [..., A], value [..., V], features [..., H])``;
    ``obs`` read through :func:`~coevo_jax.encoding.encode_obs` (``vocab > 0``: token ids, one-hot)."""

    num_actions: int
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"
    value_heads: int = 1
    vocab: int = 0

    @nn.compact
    def __call__(self, obs):
        act = activation(self.activation)
        x = encode_obs(obs, 1, self.vocab)
        h = x
        for i, width in enumerate(self.hidden_sizes):
            h = act(nn.Dense(width, kernel_init=orthogonal(np.sqrt(2)), name=f"actor_{i}")(h))
        features = h
        logits = nn.Dense(self.num_actions, kernel_init=orthogonal(0.01), name="actor_out",
                          dot_general=head_dot_general)(h)
        v = x
        for i, width in enumerate(self.hidden_sizes):
            v = act(nn.Dense(width, kernel_init=orthogonal(np.sqrt(2)), name=f"critic_{i}")(v))
        value = nn.Dense(self.value_heads, kernel_init=orthogonal(1.0), name="critic_out",
                         dot_general=head_dot_general)(v)
        return logits, value, features


def make_policy_network(static: StaticConfig, env, env_params) -> nn.Module:
    """The policy for ``env`` by ``static.network``: ``"auto"`` a causal transformer for token
    observations, else the MLP; ``"bag"`` :class:`BagActorCritic`; ``"gru"`` :class:`GRUActorCritic`;
    ``static.action_head = "utterance"`` adds the utterance head. :class:`ConfigError` on a mismatch."""
    num_actions = env.action_space(env_params).n
    space = env.observation_space(env_params)
    tokens = jnp.issubdtype(space.dtype, jnp.integer)
    use_tf = static.network == "transformer" or (static.network == "auto" and tokens)
    if static.action_head == "utterance" and not (use_tf or static.network == "bag"):
        raise ConfigError(f"StaticConfig.action_head='utterance' needs the transformer or network='bag', got"
                          f" network={static.network!r} on {env.name}")
    action_tokens = utterance_tokens(env) if static.action_head == "utterance" else ()
    if static.network == "gru":
        if static.action_head != "dense":
            raise ConfigError(f"StaticConfig.network='gru' has one logit per action (action_head='dense'), got"
                              f" action_head={static.action_head!r}")
        return GRUActorCritic(num_actions, tuple(static.hidden_sizes), static.gru_size, static.activation,
                              static.value_heads, obs_vocab(env, env_params))
    if static.network == "bag":
        if not tokens or len(space.shape) != 1:
            raise ConfigError(f"StaticConfig.network='bag' reads token buffers [L]; {env.name} observations are"
                              f" {jnp.dtype(space.dtype).name} {tuple(space.shape)}")
        return BagActorCritic(num_actions, vocab_size=int(space.high) + 1, embed_dim=static.d_model,
                              hidden_sizes=tuple(static.hidden_sizes), activation=static.activation,
                              value_heads=static.value_heads, action_tokens=action_tokens,
                              max_exchanges=exchange_slots(env, env_params))
    if use_tf:
        extra = {"action_tokens": action_tokens} if action_tokens else {}
        return (UtteranceTransformer if action_tokens else TransformerActorCritic)(
            **extra,
            num_actions=num_actions,
            vocab_size=int(space.high) + 1,
            d_model=static.d_model,
            num_layers=static.num_layers,
            num_heads=static.num_heads,
            max_len=int(space.shape[-1]),
            value_heads=static.value_heads,
        )
    return ActorCritic(num_actions, tuple(static.hidden_sizes), static.activation, static.value_heads,
                       obs_vocab(env, env_params))


def check_policy_network(network: nn.Module, static: StaticConfig, env, env_params) -> nn.Module:
    """``network`` if it keeps the policy contract on ``env``, else a :class:`ConfigError` saying what it
    returned; checked with ``jax.eval_shape`` (nothing compiles).

    Contract: ``network.init(key, obs)`` gives the parameters and ``network.apply(params, obs [...,
    *obs_shape])`` returns ``(logits [..., A], value [..., V], features [..., H])`` over any leading dims,
    ``V = static.value_heads`` (``value [...]`` accepted for one head). A recurrent network
    (``network.recurrent``) is checked by :func:`check_recurrent_network`."""
    if getattr(network, "recurrent", False):
        return check_recurrent_network(network, static, env, env_params)
    space, num_actions = env.observation_space(env_params), env.action_space(env_params).n
    lead = (2, 3)
    obs = jax.ShapeDtypeStruct(lead + tuple(space.shape), space.dtype)
    name = type(network).__name__
    try:
        params = jax.eval_shape(network.init, jax.random.PRNGKey(0), obs)
        out = jax.eval_shape(network.apply, params, obs)
    except Exception as e:  # the user's module, whatever it raises: name the input it failed on
        raise ConfigError(f"network: {name} fails on observations {obs.shape} {jnp.dtype(obs.dtype).name} of"
                          f" {env.name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    value = value_shapes(lead, static.value_heads)
    want = f"(logits {lead + (num_actions,)}, value {' or '.join(map(str, value))}, features {lead} + (H,))"
    shapes = [getattr(x, "shape", None) for x in out] if isinstance(out, (tuple, list)) else None
    if (shapes is None or len(shapes) != 3 or shapes[0] != lead + (num_actions,) or shapes[1] not in value
            or shapes[2] is None or len(shapes[2]) != len(lead) + 1 or shapes[2][:len(lead)] != lead):
        got = jax.tree.map(lambda x: tuple(x.shape), out)
        raise ConfigError(f"network: {name} must return {want} for observations {obs.shape} of {env.name}"
                          f" (method {static.method!r}: {static.value_heads} value head(s)); it returned {got}")
    return network


def value_shapes(lead: tuple, heads: int) -> tuple:
    """The value shapes allowed for leading dims ``lead``: ``lead + (heads,)``, and ``lead`` for one head."""
    return (lead + (heads,),) + ((lead,) if heads == 1 else ())


def features_dim(network: nn.Module, params, example_obs: jax.Array) -> int:
    """Width H of the ``features`` the network returns."""
    return int(jax.eval_shape(network.apply, params, example_obs)[2].shape[-1])


def check_recurrent_network(network: nn.Module, static, env, env_params):
    """The recurrent contract (:class:`GRUActorCritic`'s shapes) on abstract values, or a
    ``ConfigError`` naming what came back."""
    space, num_actions = env.observation_space(env_params), env.action_space(env_params).n
    b, t = 2, 3
    obs = jax.ShapeDtypeStruct((b, t) + tuple(space.shape), space.dtype)
    first = jax.ShapeDtypeStruct((b, t), jnp.bool_)
    name = type(network).__name__
    try:
        carry = jax.eval_shape(lambda: network.initialize_carry((b,)))
        params = jax.eval_shape(network.init, jax.random.PRNGKey(0), carry, obs, first)
        new_carry, out = jax.eval_shape(network.apply, params, carry, obs, first)
    except Exception as e:  # the user's module, whatever it raises
        raise ConfigError(f"network: recurrent {name} fails on observations {obs.shape} of {env.name}:"
                          f" {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    value = value_shapes((b, t), static.value_heads)
    shapes = [getattr(x, "shape", None) for x in out] if isinstance(out, (tuple, list)) else None
    ok = (shapes is not None and len(shapes) == 3 and shapes[0] == (b, t, num_actions) and shapes[1] in value
          and shapes[2] is not None and len(shapes[2]) == 3 and shapes[2][:2] == (b, t)
          and jax.tree.map(np.shape, new_carry) == jax.tree.map(np.shape, carry))
    if not ok:
        raise ConfigError(f"network: recurrent {name} must return (carry like initialize_carry, (logits"
                          f" {(b, t, num_actions)}, value {' or '.join(map(str, value))}, features {(b, t)} + (H,)))"
                          f" for observations {obs.shape} of {env.name}; it returned"
                          f" {jax.tree.map(np.shape, (new_carry, out))}")
    return network
