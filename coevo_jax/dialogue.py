"""Policy networks for dialogue token buffers ``obs [..., L] int``: :class:`BagActorCritic` (a bag of
exchanges under :class:`~coevo_jax.networks.ActorCritic`'s torsos) and :class:`UtteranceTransformer`, each with
the utterance head on turn-level text envs (an utterance's logit adds its words' scores)."""
from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from coevo_jax.layers import activation, head_dot_general, orthogonal, torso
from coevo_jax.params import ConfigError
from coevo_jax.transformer import TransformerActorCritic
from envs_jax.text.tokens import AGENT, PAD, USER
from envs_jax.text.turns import TurnEnv


def exchange_starts(tokens: jax.Array) -> jax.Array:
    """``tokens [B, L] -> [B, L]`` int32: where each position's exchange starts, one past the last
    ``<agent>`` marker strictly before it (0 in the opening message)."""
    idx = jnp.arange(tokens.shape[-1], dtype=jnp.int32)
    after_marker = jax.lax.cummax(jnp.where(tokens == AGENT, idx + 1, 0), axis=tokens.ndim - 1)
    return jnp.concatenate([jnp.zeros_like(after_marker[..., :1]), after_marker[..., :-1]], axis=-1)


def said_by(tokens: jax.Array, vocab_size: int) -> tuple[jax.Array, jax.Array]:
    """``tokens [B, L] -> (user [B, V], agent [B, V])`` float32 indicators of the words the partner and
    the agent have said so far."""
    idx = jnp.arange(tokens.shape[-1], dtype=jnp.int32)
    last = lambda marker: jax.lax.cummax(jnp.where(tokens == marker, idx, -1), axis=tokens.ndim - 1)
    by_user = last(USER) > last(AGENT)  # [B, L]
    said = jax.nn.one_hot(tokens, vocab_size) * (tokens != PAD)[..., None]  # [B, L, V]
    user = jnp.max(said * by_user[..., None], axis=-2)
    agent = jnp.max(said * jnp.logical_not(by_user)[..., None], axis=-2)
    return user, agent


def utterance_counts(action_tokens: tuple, vocab_size: int) -> jax.Array:
    """``[A][U]`` utterance token ids (pad-filled) -> float32 ``[A, V]`` counts of each word."""
    table = jnp.asarray(action_tokens, jnp.int32)
    return jnp.sum(jax.nn.one_hot(table, vocab_size) * (table != PAD)[..., None], axis=1)


def utterance_tokens(env) -> tuple:
    """``[A][U]`` token ids (pad-filled) of each action's utterance on a turn-level text env
    (:class:`envs_jax.text.turns.TurnEnv`, possibly wrapped); :class:`ConfigError` otherwise."""
    inner = env.unwrapped
    if not isinstance(inner, TurnEnv):
        raise ConfigError(f"StaticConfig.action_head='utterance' needs an env whose actions are utterances (the"
                          f" '-Turns' text envs); {env.name} is not one")
    return tuple(tuple(int(t) for t in row) for row in inner.grammar.table_np)


class ExchangeBag(nn.Module):
    """Pooled bag-of-exchanges encoding: ``tokens [B, L] int -> [B, 2 * embed_dim + 1]``, the mean over
    exchanges (:func:`exchange_starts`; from ``max_exchanges - 1`` on they share a slot), the latest one
    and ``log(1 + #exchanges)``. An exchange is LayerNorm, Dense, tanh of the sum of its embedded
    (token, offset in the exchange) pairs (offsets from ``max_offset - 1`` on shared)."""

    vocab_size: int
    embed_dim: int = 64
    max_offset: int = 32
    max_exchanges: int = 32

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        tokens = jnp.clip(tokens.astype(jnp.int32), 0, self.vocab_size - 1)
        live = tokens != PAD
        idx = jnp.arange(tokens.shape[-1], dtype=jnp.int32)
        offset = jnp.clip(idx - exchange_starts(tokens), 0, self.max_offset - 1)
        is_agent = (tokens == AGENT).astype(jnp.int32)
        exchange = jnp.minimum(jnp.cumsum(is_agent, axis=-1) - is_agent, self.max_exchanges - 1)  # [B, L]
        emb = nn.Embed(self.max_offset * self.vocab_size, self.embed_dim, embedding_init=nn.initializers.normal(1.0),
                       name="pair_embed")(offset * self.vocab_size + tokens)  # [B, L, E]
        member = jax.nn.one_hot(exchange, self.max_exchanges) * live[..., None]  # [B, L, S]
        sums = jnp.einsum("bls,ble->bse", member, emb)  # [B, S, E]
        h = jnp.tanh(nn.Dense(self.embed_dim, name="exchange")(nn.LayerNorm(name="exchange_norm")(sums)))
        present = jnp.any(member > 0, axis=1)  # [B, S]
        count = jnp.sum(present, axis=-1, keepdims=True).astype(jnp.float32)  # [B, 1]
        mean = jnp.sum(h * present[..., None], axis=1) / jnp.maximum(count, 1.0)
        last = jnp.max(jnp.where(live, exchange, 0), axis=-1)  # [B]
        latest = jnp.einsum("bs,bse->be", jax.nn.one_hot(last, self.max_exchanges), h)
        return jnp.concatenate([mean, latest, jnp.log1p(count)], axis=-1)


class BagActorCritic(nn.Module):
    """Bag-of-exchanges actor-critic: ``obs [..., L] int -> (logits [..., A], value [..., V],
    features [..., H])``, :class:`ActorCritic`'s torsos on :class:`ExchangeBag`. With ``action_tokens``
    (:func:`utterance_tokens`) ``logits += scores @ counts.T`` (``counts [A, V]``), a word's score
    ``Dense_V(f) + g_user(f) * said_by_user + g_agent(f) * said_by_agent`` (:func:`said_by`; the copy
    gates are zero at init). ``max_exchanges``: see :func:`exchange_slots`."""

    num_actions: int
    vocab_size: int
    embed_dim: int = 64
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"
    value_heads: int = 1
    action_tokens: tuple = ()
    max_exchanges: int = 32

    @nn.compact
    def __call__(self, obs):
        batch, length = obs.shape[:-1], obs.shape[-1]
        z = ExchangeBag(self.vocab_size, self.embed_dim, max_exchanges=self.max_exchanges,
                        name="encoder")(obs.reshape(-1, length))
        act = activation(self.activation)
        features = torso(z, self.hidden_sizes, act, "actor")
        logits = nn.Dense(self.num_actions, kernel_init=orthogonal(0.01), name="actor_out",
                          dot_general=head_dot_general)(features)
        if self.action_tokens:
            counts = utterance_counts(self.action_tokens, self.vocab_size)  # [A, V]
            word = lambda name, init: nn.Dense(self.vocab_size, kernel_init=init, name=name)(features)  # [B, V]
            user, agent = said_by(obs.reshape(-1, length), self.vocab_size)
            zeros = nn.initializers.zeros
            scores = word("actor_tokens", orthogonal(0.01)) + word("copy_user", zeros) * user \
                + word("copy_agent", zeros) * agent
            logits = logits + scores @ counts.T
        v = torso(z, self.hidden_sizes, act, "critic")
        value = nn.Dense(self.value_heads, kernel_init=orthogonal(1.0), name="critic_out",
                         dot_general=head_dot_general)(v)
        return (logits.reshape(batch + logits.shape[-1:]), value.reshape(batch + (self.value_heads,)),
                features.reshape(batch + features.shape[-1:]))


class UtteranceTransformer(TransformerActorCritic):
    """The transformer with the utterance head ``logits = Dense_A(h) + Dense_V(h) @ counts.T`` (no copy
    gates), applied on every scoring path through ``_heads``."""

    action_tokens: tuple = ()

    def setup(self):
        super().setup()
        self.word_head = nn.Dense(self.vocab_size, kernel_init=nn.initializers.normal(0.01 / np.sqrt(self.d_model)))

    def _heads(self, feats):
        logits, value = super()._heads(feats)
        return logits + self.word_head(feats) @ utterance_counts(self.action_tokens, self.vocab_size).T, value


def exchange_slots(env, env_params) -> int:
    """:class:`ExchangeBag`'s slots for ``env``: on a turn-level text env the opening message plus one
    per turn (``max_steps_in_episode + 1``), else 32."""
    if isinstance(env.unwrapped, TurnEnv):
        return int(env_params.max_steps_in_episode) + 1
    return 32
