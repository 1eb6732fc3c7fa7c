"""A small causal transformer actor-critic over token buffers.

``TransformerActorCritic(num_actions, vocab_size, max_len=L)`` reads an int32
buffer ``[..., L]`` (``<pad>`` = 0 after the write position, as the text
environments of :mod:`envs_jax.text` write it) and returns
``(logits [..., num_actions], value [...], features [..., d_model])`` at the
last non-pad position (the write position - 1); ``features`` is the final
hidden state the policy and value heads read. That is the same contract as the
library's MLP policy, so every reward source works unchanged on text.

Pre-LayerNorm blocks with learned token and position embeddings. Because the
attention is causal, the output at position ``t`` depends only on tokens
``0..t``, so

* ``score_sequence(obs_final)`` returns the per-position outputs of a whole
  episode buffer in one pass (as LM training does), equal to the per-step calls;
* ``init_cache`` / ``decode_step`` give incremental decoding with a key-value
  cache: each call processes only the tokens added since the previous call
  (at most ``chunk`` of them, e.g. ``env.max_tokens_per_step``) and detects an
  environment auto-reset by comparing the buffer with the cached tokens.

Usage::

    model = TransformerActorCritic(env.num_actions, env.vocab_size, max_len=L)
    params = model.init(key, obs)
    logits, value, feats = model.apply(params, obs)
    cache = model.init_cache(batch_shape)
    (logits, value, feats), cache = model.apply(params, cache, obs, chunk=16,
                                                method=model.decode_step)
"""
from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array
PAD = 0


class CausalSelfAttention(nn.Module):
    d_model: int
    num_heads: int

    @nn.compact
    def __call__(self, x: Array, q_pos: Array, k_cache: Array | None, v_cache: Array | None,
                 x_kv: Array | None = None):
        """``x`` [B, C, d] at positions ``q_pos`` [B, C].

        * plain: the C tokens are the whole sequence (``q_pos = arange(C)``);
        * ``x_kv`` [B, L, d]: keys/values come from the whole sequence ``x_kv``
          and only the queries ``x`` are computed (the last layer of ``__call__``);
        * cache (``[B, L, H, dh]``): the keys/values of ``x`` are written into it
          at ``q_pos`` and the queries attend over the cache.

        Returns ``(y, k_cache, v_cache)``."""
        h = self.num_heads
        dh = self.d_model // h
        src = x if x_kv is None else x_kv
        q = nn.DenseGeneral((h, dh), name="query")(x)
        k = nn.DenseGeneral((h, dh), name="key")(src)
        v = nn.DenseGeneral((h, dh), name="value")(src)
        if k_cache is not None:
            write = jax.vmap(lambda c, p, u: c.at[p].set(u.astype(c.dtype), mode="drop"))
            k_cache = write(k_cache, q_pos, k)
            v_cache = write(v_cache, q_pos, v)
            k, v = k_cache, v_cache
        k_pos = jnp.arange(k.shape[1])
        mask = k_pos[None, None, :] <= q_pos[:, :, None]  # [B, C, Lk]
        att = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(dh)
        att = jnp.where(mask[:, None], att, jnp.finfo(att.dtype).min)
        att = jax.nn.softmax(att, axis=-1)
        y = jnp.einsum("bhqk,bkhd->bqhd", att, v)
        y = nn.DenseGeneral(self.d_model, axis=(-2, -1), name="out")(y)
        return y, k_cache, v_cache


class Block(nn.Module):
    d_model: int
    num_heads: int
    mlp_ratio: int = 4

    @nn.compact
    def __call__(self, x, q_pos, k_cache=None, v_cache=None, x_kv=None):
        ln1 = nn.LayerNorm(name="ln1")
        y, k_cache, v_cache = CausalSelfAttention(self.d_model, self.num_heads, name="attn")(
            ln1(x), q_pos, k_cache, v_cache, None if x_kv is None else ln1(x_kv)
        )
        x = x + y
        y = nn.LayerNorm(name="ln2")(x)
        y = nn.Dense(self.mlp_ratio * self.d_model, name="mlp_in")(y)
        y = nn.Dense(self.d_model, name="mlp_out")(nn.gelu(y))
        return x + y, k_cache, v_cache


class TransformerActorCritic(nn.Module):
    """Causal pre-LN transformer actor-critic; see the module docstring."""

    num_actions: int
    vocab_size: int
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 4
    max_len: int = dataclasses.field(kw_only=True)

    def setup(self):
        if self.d_model % self.num_heads:
            raise ValueError("d_model must be divisible by num_heads")
        if self.num_layers < 1:
            raise ValueError("num_layers must be >= 1")
        init = nn.initializers.normal(0.02)
        self.tok_embed = nn.Embed(self.vocab_size, self.d_model, embedding_init=init)
        self.pos_embed = self.param("pos_embed", init, (self.max_len, self.d_model))
        self.blocks = [Block(self.d_model, self.num_heads, name=f"block_{i}") for i in range(self.num_layers)]
        self.ln_f = nn.LayerNorm()
        self.policy_head = nn.Dense(self.num_actions, kernel_init=nn.initializers.normal(0.01 / math.sqrt(self.d_model)))
        self.value_head = nn.Dense(1, kernel_init=nn.initializers.normal(1.0 / math.sqrt(self.d_model)))

    # -- helpers
    def _check(self, obs):
        if obs.shape[-1] > self.max_len:
            raise ValueError(f"buffer length {obs.shape[-1]} exceeds max_len={self.max_len}")

    def _embed(self, toks, pos):
        toks = jnp.clip(toks.astype(jnp.int32), 0, self.vocab_size - 1)
        return self.tok_embed(toks) + self.pos_embed[jnp.clip(pos, 0, self.max_len - 1)]

    def _heads(self, feats):
        return self.policy_head(feats), self.value_head(feats)[..., 0]

    def _trunk(self, obs2, last_only: Array | None = None):
        """Final hidden states ``[B, L, d]`` of a full causal pass, or ``[B, d]``
        at positions ``last_only`` [B] (the last block then computes only that
        query: same numbers, less work)."""
        b, l = obs2.shape
        pos = jnp.broadcast_to(jnp.arange(l), (b, l))
        x = self._embed(obs2, pos)
        blocks = self.blocks if last_only is None else self.blocks[:-1]
        for blk in blocks:
            x, _, _ = blk(x, pos)
        if last_only is None:
            return self.ln_f(x)
        x_q = jnp.take_along_axis(x, last_only[:, None, None], axis=1)  # [B, 1, d]
        x_q, _, _ = self.blocks[-1](x_q, last_only[:, None], x_kv=x)
        return self.ln_f(x_q[:, 0])

    # -- public
    def __call__(self, obs: Array):
        """``(logits [..., A], value [...], features [..., d])`` at the last non-pad token."""
        self._check(obs)
        batch, l = obs.shape[:-1], obs.shape[-1]
        obs2 = obs.reshape(-1, l)
        idx = jnp.clip(jnp.sum(obs2 != PAD, axis=-1) - 1, 0, l - 1).astype(jnp.int32)
        feats = self._trunk(obs2, last_only=idx)
        logits, value = self._heads(feats)
        return (
            logits.reshape(batch + (self.num_actions,)),
            value.reshape(batch),
            feats.reshape(batch + (self.d_model,)),
        )

    def score_sequence(self, obs_final: Array):
        """Per-position ``(logits [..., L, A], value [..., L], features [..., L, d])``
        of one causal pass; position ``t`` equals ``__call__`` on the buffer cut
        after token ``t``."""
        self._check(obs_final)
        batch, l = obs_final.shape[:-1], obs_final.shape[-1]
        h = self._trunk(obs_final.reshape(-1, l))
        logits, value = self._heads(h)
        return (
            logits.reshape(batch + (l, self.num_actions)),
            value.reshape(batch + (l,)),
            h.reshape(batch + (l, self.d_model)),
        )

    def init_cache(self, batch_shape=(), buffer_len: int | None = None) -> dict:
        """Empty key-value cache for buffers ``[*batch_shape, buffer_len]``
        (``buffer_len`` defaults to ``max_len``); needs no parameters."""
        l = self.max_len if buffer_len is None else int(buffer_len)
        b = tuple(batch_shape)
        dh = self.d_model // self.num_heads
        kv = (self.num_layers, l, self.num_heads, dh)
        return {
            "tokens": jnp.zeros(b + (l,), jnp.int32),
            "length": jnp.zeros(b, jnp.int32),
            "k": jnp.zeros(b + kv, jnp.float32),
            "v": jnp.zeros(b + kv, jnp.float32),
        }

    def decode_step(self, cache: dict, obs: Array, chunk: int = 16):
        """Incremental ``__call__``: ``((logits, value, features), new_cache)``.

        Processes the tokens from the cached length (0 when the buffer no longer
        starts with the cached tokens, e.g. after an auto-reset) up to the write
        position; at most ``chunk`` (static) new tokens per call are supported.
        """
        self._check(obs)
        batch, l = obs.shape[:-1], obs.shape[-1]
        obs2 = obs.reshape(-1, l).astype(jnp.int32)
        b = obs2.shape[0]
        toks_c = cache["tokens"].reshape(b, l)
        len_c = cache["length"].reshape(b)
        k_all = cache["k"].reshape((b,) + cache["k"].shape[len(batch):])
        v_all = cache["v"].reshape((b,) + cache["v"].shape[len(batch):])

        cols = jnp.arange(l)
        new_len = jnp.sum(obs2 != PAD, axis=-1).astype(jnp.int32)
        same = jnp.all((obs2 == toks_c) | (cols[None, :] >= len_c[:, None]), axis=-1)
        start = jnp.where(same, len_c, 0)
        start = jnp.minimum(start, jnp.maximum(new_len - 1, 0))  # always recompute the last token
        q_pos = start[:, None] + jnp.arange(chunk)[None, :]  # [B, C]
        toks = jnp.take_along_axis(obs2, jnp.clip(q_pos, 0, l - 1), axis=1)
        toks = jnp.where(q_pos < l, toks, PAD)
        x = self._embed(toks, q_pos)
        ks, vs = [], []
        for i, blk in enumerate(self.blocks):
            x, k_i, v_i = blk(x, q_pos, k_all[:, i], v_all[:, i])
            ks.append(k_i)
            vs.append(v_i)
        h = self.ln_f(x)
        idx = jnp.clip(new_len - 1 - start, 0, chunk - 1)
        feats = jnp.take_along_axis(h, idx[:, None, None], axis=1)[:, 0]
        logits, value = self._heads(feats)
        new_cache = {
            "tokens": obs2.reshape(batch + (l,)),
            "length": jnp.minimum(new_len, start + chunk).reshape(batch),
            "k": jnp.stack(ks, axis=1).reshape(cache["k"].shape),
            "v": jnp.stack(vs, axis=1).reshape(cache["v"].shape),
        }
        out = (
            logits.reshape(batch + (self.num_actions,)),
            value.reshape(batch),
            feats.reshape(batch + (self.d_model,)),
        )
        return out, new_cache
