"""A small causal transformer actor-critic over token buffers.

``TransformerActorCritic(num_actions, vocab_size, max_len=L)`` reads an int32
buffer ``[..., L]`` (``<pad>`` = 0 after the write position, as the text
environments of :mod:`envs_jax.text` write it) and returns
``(logits [..., num_actions], value [..., V], features [..., d_model])`` at the
last non-pad position (the write position - 1), ``V = value_heads``; ``features``
is the final hidden state the policy and value heads read. That is the same
contract as the library's MLP policy, so every reward source works unchanged
on text.

Pre-LayerNorm blocks with learned token and position embeddings. Because the
attention is causal, the output at position ``t`` depends only on tokens
``0..t``, so

* ``score_sequence(obs_final)`` returns the per-position outputs of a whole
  episode buffer in one pass (as LM training does), equal to the per-step calls;
* ``score_packed(pack_windows(obs, done, chunk))`` scores every step of a
  ``[T, N]`` rollout window in one pass per env: the window's observations
  are packed into one token stream (its first buffer, then the tokens each
  step added) and a segment mask keeps episodes apart. This is what the PPO
  update uses (``StaticConfig.packed_update``);
* ``init_cache`` / ``decode_step`` give incremental decoding with a key-value
  cache: each call processes only the tokens added since the previous call
  (at most ``chunk`` of them, e.g. ``env.max_tokens_per_step``) and detects an
  environment auto-reset by comparing the buffer with the cached tokens.
  A call with ``chunk`` >= the buffer length is a prefill: one causal pass.

Usage::

    model = TransformerActorCritic(env.num_actions, env.vocab_size, max_len=L)
    params = model.init(key, obs)
    logits, value, feats = model.apply(params, obs)
    cache = model.init_cache(batch_shape, chunk=16)
    (logits, value, feats), cache = model.apply(params, cache, obs, chunk=16,
                                                method=model.decode_step)
"""
from __future__ import annotations

import dataclasses
import math
import flax.linen as nn
import jax
import jax.numpy as jnp

from coevo_jax.packing import PAD, PackedWindows

Array = jax.Array


class CausalSelfAttention(nn.Module):
    d_model: int
    num_heads: int

    @nn.compact
    def __call__(self, x: Array, q_pos: Array, k_cache: Array | None, v_cache: Array | None,
                 x_kv: Array | None = None, mask: Array | None = None):
        """``x`` [B, C, d] at positions ``q_pos`` [B, C].

        * plain: the C tokens are the whole sequence (``q_pos = arange(C)``);
        * ``x_kv`` [B, Lk, d]: keys/values come from the whole sequence ``x_kv``
          and only the queries ``x`` are computed (the last layer of a pass that
          needs outputs at a few positions);
        * ``mask`` [B, C, Lk] (bool): which keys each query sees, replacing the
          causal mask ``key position <= q_pos`` (packed streams of several
          episodes, see :meth:`TransformerActorCritic.score_packed`);
        * cache (``[B, H, Lc, dh]``, ``Lc >= max(q_pos) + 1``): the keys/values of
          ``x`` are written into it at ``q_pos[:, 0]`` onwards (contiguous) and
          the queries attend over the cache.

        Returns ``(y, k_cache, v_cache)``; without a cache, ``(y, k, v)`` with the
        keys/values ``[B, Lk, H, dh]`` of ``x_kv`` (or ``x``) it computed."""
        h = self.num_heads
        dh = self.d_model // h
        src = x if x_kv is None else x_kv
        q = nn.DenseGeneral((h, dh), name="query")(x) / math.sqrt(dh)
        k = nn.DenseGeneral((h, dh), name="key")(src)
        v = nn.DenseGeneral((h, dh), name="value")(src)
        if k_cache is not None:
            y, k_cache, v_cache = _cached_attention(q, k, v, q_pos, k_cache, v_cache)
        else:
            if mask is None:
                mask = jnp.arange(k.shape[1])[None, None, :] <= q_pos[:, :, None]  # [B, C, Lk]
            att = jnp.einsum("bqhd,bkhd->bhqk", q, k)
            att = jax.nn.softmax(jnp.where(mask[:, None], att, jnp.finfo(att.dtype).min), axis=-1)
            y = jnp.einsum("bhqk,bkhd->bqhd", att, v)
            k_cache, v_cache = k, v
        y = nn.DenseGeneral(self.d_model, axis=(-2, -1), name="out")(y)
        return y, k_cache, v_cache


def _cached_attention(q: Array, k: Array, v: Array, q_pos: Array, k_cache: Array, v_cache: Array):
    """Write ``k, v`` [B, C, H, dh] into the caches [B, H, Lc, dh] at
    ``q_pos[:, 0]`` (one contiguous slice per row, no scatter) and attend the
    (pre-scaled) queries ``q`` [B, C, H, dh] causally over the caches.

    Returns ``(y [B, C, H, dh], k_cache, v_cache)``. The two formulations of
    the attention are the fastest ones measured on XLA:CPU for one query and
    for a few queries per row (a batched dot is slow for a handful of queries;
    broadcast-multiply-reduce is slow for one)."""
    write = jax.vmap(lambda c, s, u: jax.lax.dynamic_update_slice(c, u.astype(c.dtype).transpose(1, 0, 2), (0, s, 0)))
    k_cache = write(k_cache, q_pos[:, 0], k)
    v_cache = write(v_cache, q_pos[:, 0], v)
    mask = jnp.arange(k_cache.shape[2])[None, None, None, :] <= q_pos[:, None, :, None]  # [B, 1, C, Lc]
    qh = q.transpose(0, 2, 1, 3)  # [B, H, C, dh]
    if q.shape[1] == 1:
        att = jnp.einsum("bhqd,bhkd->bhqk", qh, k_cache)
    else:
        att = jnp.sum(qh[:, :, :, None, :] * k_cache[:, :, None, :, :], axis=-1)
    att = jax.nn.softmax(jnp.where(mask, att, jnp.finfo(att.dtype).min), axis=-1)
    if q.shape[1] == 1:
        y = jnp.einsum("bhqk,bhkd->bhqd", att, v_cache)
    else:
        y = jnp.sum(att[..., None] * v_cache[:, :, None, :, :], axis=3)
    return y.transpose(0, 2, 1, 3), k_cache, v_cache


class Block(nn.Module):
    d_model: int
    num_heads: int
    mlp_ratio: int = 4

    @nn.compact
    def __call__(self, x, q_pos, k_cache=None, v_cache=None, x_kv=None, mask=None):
        ln1 = nn.LayerNorm(name="ln1")
        y, k_cache, v_cache = CausalSelfAttention(self.d_model, self.num_heads, name="attn")(
            ln1(x), q_pos, k_cache, v_cache, None if x_kv is None else ln1(x_kv), mask
        )
        x = x + y
        y = nn.LayerNorm(name="ln2")(x)
        y = nn.Dense(self.mlp_ratio * self.d_model, name="mlp_in")(y)
        y = nn.Dense(self.d_model, name="mlp_out")(nn.gelu(y))
        return x + y, k_cache, v_cache


class TransformerActorCritic(nn.Module):
    """Causal pre-LN transformer actor-critic; see the module docstring."""

    #: the loop's token paths (KV-cache rollouts, packed updates) use any network that declares this and
    #: provides ``init_cache``, ``decode_step`` and ``score_packed`` with these signatures
    decodes_incrementally = True
    num_actions: int
    vocab_size: int
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 4
    max_len: int = dataclasses.field(kw_only=True)
    value_heads: int = 1  # V: 2 = critic heads for the episodic and the intrinsic return (value [..., 2])

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
        self.value_head = nn.Dense(self.value_heads, kernel_init=nn.initializers.normal(1.0 / math.sqrt(self.d_model)))

    # -- helpers
    def _check(self, obs):
        if obs.shape[-1] > self.max_len:
            raise ValueError(f"buffer length {obs.shape[-1]} exceeds max_len={self.max_len}")

    def _embed(self, toks, pos):
        toks = jnp.clip(toks.astype(jnp.int32), 0, self.vocab_size - 1)
        return self.tok_embed(toks) + self.pos_embed[jnp.clip(pos, 0, self.max_len - 1)]

    def _heads(self, feats):
        """``feats [..., d] -> (logits [..., A], value [..., V])``."""
        return self.policy_head(feats), self.value_head(feats)

    def _encode(self, toks: Array, pos: Array, mask: Array | None = None, query: Array | None = None,
                with_kv: bool = False):
        """Final hidden states of one pass over tokens ``[B, P]`` at buffer
        positions ``pos`` [B, P]: ``[B, P, d]``, or ``[B, Q, d]`` at the stream
        indices ``query`` [B, Q] (the last block then computes only those
        queries: same numbers, less work). ``mask`` [B, P, P] replaces the causal
        mask by position (packed streams). ``with_kv``: also return each layer's
        keys and values (two tuples of ``[B, P, H, dh]``)."""
        x = self._embed(toks, pos)
        ks, vs = [], []
        for blk in self.blocks if query is None else self.blocks[:-1]:
            x, k, v = blk(x, pos, mask=mask)
            ks, vs = ks + [k], vs + [v]
        if query is None:
            h = self.ln_f(x)
        else:
            x_q = jnp.take_along_axis(x, query[:, :, None], axis=1)  # [B, Q, d]
            mask_q = None if mask is None else jnp.take_along_axis(mask, query[:, :, None], axis=1)  # [B, Q, P]
            x_q, k, v = self.blocks[-1](x_q, jnp.take_along_axis(pos, query, axis=1), x_kv=x, mask=mask_q)
            h, ks, vs = self.ln_f(x_q), ks + [k], vs + [v]
        return (h, tuple(ks), tuple(vs)) if with_kv else h

    def _trunk(self, obs2, last_only: Array | None = None):
        """Final hidden states ``[B, L, d]`` of a full causal pass over buffers
        ``[B, L]``, or ``[B, d]`` at positions ``last_only`` [B]."""
        b, l = obs2.shape
        pos = jnp.broadcast_to(jnp.arange(l), (b, l))
        if last_only is None:
            return self._encode(obs2, pos)
        return self._encode(obs2, pos, query=last_only[:, None])[:, 0]

    # -- public
    def __call__(self, obs: Array):
        """``(logits [..., A], value [..., V], features [..., d])`` at the last non-pad token."""
        self._check(obs)
        batch, l = obs.shape[:-1], obs.shape[-1]
        obs2 = obs.reshape(-1, l)
        idx = jnp.clip(jnp.sum(obs2 != PAD, axis=-1) - 1, 0, l - 1).astype(jnp.int32)
        feats = self._trunk(obs2, last_only=idx)
        logits, value = self._heads(feats)
        return (
            logits.reshape(batch + (self.num_actions,)),
            value.reshape(batch + (self.value_heads,)),
            feats.reshape(batch + (self.d_model,)),
        )

    def score_sequence(self, obs_final: Array):
        """Per-position ``(logits [..., L, A], value [..., L, V], features [..., L, d])``
        of one causal pass; position ``t`` equals ``__call__`` on the buffer cut
        after token ``t``."""
        self._check(obs_final)
        batch, l = obs_final.shape[:-1], obs_final.shape[-1]
        h = self._trunk(obs_final.reshape(-1, l))
        logits, value = self._heads(h)
        return (
            logits.reshape(batch + (l, self.num_actions)),
            value.reshape(batch + (l, self.value_heads)),
            h.reshape(batch + (l, self.d_model)),
        )

    def score_packed(self, packed: "PackedWindows"):
        """Outputs at the ``T`` query positions of packed token streams (see
        :func:`coevo_jax.packing.pack_windows`): ``(logits [..., T, A], value [..., T, V],
        features [..., T, d])``, where entry ``t`` equals ``__call__`` on the
        buffer ``obs[t]`` the stream was packed from. One causal pass per stream
        in which a token sees only the earlier tokens of its own episode."""
        tokens, pos, seg, query = packed
        batch, p, t = tokens.shape[:-1], tokens.shape[-1], query.shape[-1]
        tokens, pos, seg, query = (a.reshape(-1, a.shape[-1]) for a in (tokens, pos, seg, query))
        idx = jnp.arange(p)
        mask = (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] >= 0) & (idx[None, None, :] <= idx[None, :, None])
        feats = self._encode(tokens, pos, mask, query)  # [B, T, d]
        logits, value = self._heads(feats)
        return (
            logits.reshape(batch + (t, self.num_actions)),
            value.reshape(batch + (t, self.value_heads)),
            feats.reshape(batch + (t, self.d_model)),
        )

    def _cached_blocks(self, toks: Array, q_pos: Array, k_all, v_all):
        """Tokens ``[B, C]`` at positions ``q_pos`` through every block with the
        per-layer caches: ``(final hidden [B, C, d], new k caches, new v caches)``."""
        x = self._embed(toks, q_pos)
        ks, vs = [], []
        for i, blk in enumerate(self.blocks):
            x, k_i, v_i = blk(x, q_pos, k_all[i], v_all[i])
            ks.append(k_i)
            vs.append(v_i)
        return self.ln_f(x), ks, vs

    def _prefill(self, obs2: Array, batch: tuple, kv_shape: tuple):
        """:meth:`decode_step` from scratch (the whole buffers ``[B, L]``) as one
        causal pass, the last block computing only the last query; the keys and
        values of every layer fill the first ``L`` cache slots."""
        b, l = obs2.shape
        new_len = jnp.sum(obs2 != PAD, axis=-1).astype(jnp.int32)
        idx = jnp.clip(new_len - 1, 0, l - 1)
        pos = jnp.broadcast_to(jnp.arange(l), (b, l))
        feats, ks, vs = self._encode(obs2, pos, query=idx[:, None], with_kv=True)
        logits, value = self._heads(feats[:, 0])
        slack = kv_shape[-2] - l
        to_cache = lambda a: jnp.pad(a.transpose(0, 2, 1, 3), ((0, 0), (0, 0), (0, slack), (0, 0))).reshape(kv_shape)
        cache = {"tokens": obs2.reshape(batch + (l,)), "length": new_len.reshape(batch),
                 "k": tuple(map(to_cache, ks)), "v": tuple(map(to_cache, vs))}
        out = (logits.reshape(batch + (self.num_actions,)), value.reshape(batch + (self.value_heads,)),
               feats[:, 0].reshape(batch + (self.d_model,)))
        return out, cache

    def init_cache(self, batch_shape=(), buffer_len: int | None = None, chunk: int = 16) -> dict:
        """Empty key-value cache for buffers ``[*batch_shape, buffer_len]``
        (``buffer_len`` defaults to ``max_len``) decoded ``chunk`` tokens at a
        time; needs no parameters. ``"k"`` and ``"v"`` hold one array per layer,
        ``[*batch_shape, num_heads, buffer_len + chunk, d_head]``:
        ``chunk`` slack slots keep every write one contiguous slice."""
        l = self.max_len if buffer_len is None else int(buffer_len)
        b = tuple(batch_shape)
        dh = self.d_model // self.num_heads
        kv = (self.num_heads, l + int(chunk), dh)
        return {
            "tokens": jnp.zeros(b + (l,), jnp.int32),
            "length": jnp.zeros(b, jnp.int32),
            "k": tuple(jnp.zeros(b + kv, jnp.float32) for _ in range(self.num_layers)),
            "v": tuple(jnp.zeros(b + kv, jnp.float32) for _ in range(self.num_layers)),
        }

    def decode_step(self, cache: dict, obs: Array, chunk: int = 16):
        """Incremental ``__call__``: ``((logits [..., A], value [..., V], features [..., d]), new_cache)``.

        Processes the tokens from the cached length (0 when the buffer no longer
        starts with the cached tokens, e.g. after an auto-reset) up to the write
        position; at most ``chunk`` (static) new tokens per call are supported.
        A ``chunk`` of at least the buffer length recomputes the whole buffer
        (a prefill). The cache must come from ``init_cache(..., chunk=c)`` with
        ``c >= chunk`` (a prefill needs ``buffer_len + c >= chunk``).
        """
        self._check(obs)
        batch, l = obs.shape[:-1], obs.shape[-1]
        obs2 = obs.reshape(-1, l).astype(jnp.int32)
        b = obs2.shape[0]
        toks_c = cache["tokens"].reshape(b, l)
        len_c = cache["length"].reshape(b)
        kv_shape = cache["k"][0].shape
        k_all = [c.reshape((b,) + kv_shape[len(batch):]) for c in cache["k"]]
        v_all = [c.reshape((b,) + kv_shape[len(batch):]) for c in cache["v"]]
        prefill = chunk >= l
        if kv_shape[-2] < (chunk if prefill else l + chunk):
            raise ValueError(f"the cache holds {kv_shape[-2]} positions; decoding chunk={chunk} of a "
                             f"{l}-token buffer needs {chunk if prefill else l + chunk}: use init_cache(..., chunk={chunk})")
        if prefill:
            return self._prefill(obs2, batch, kv_shape)

        cols = jnp.arange(l)
        new_len = jnp.sum(obs2 != PAD, axis=-1).astype(jnp.int32)
        same = jnp.all((obs2 == toks_c) | (cols[None, :] >= len_c[:, None]), axis=-1)
        start = jnp.where(same, len_c, 0)
        start = jnp.minimum(start, jnp.maximum(new_len - 1, 0))  # always recompute the last token
        q_pos = start[:, None] + jnp.arange(chunk)[None, :]  # [B, C]
        toks = jnp.take_along_axis(obs2, jnp.clip(q_pos, 0, l - 1), axis=1)
        toks = jnp.where(q_pos < l, toks, PAD)
        h, ks, vs = self._cached_blocks(toks, q_pos, k_all, v_all)
        idx = jnp.clip(new_len - 1 - start, 0, chunk - 1)
        feats = jnp.take_along_axis(h, idx[:, None, None], axis=1)[:, 0]
        logits, value = self._heads(feats)
        new_cache = {
            "tokens": obs2.reshape(batch + (l,)),
            "length": jnp.minimum(new_len, start + chunk).reshape(batch),
            "k": tuple(c.reshape(kv_shape) for c in ks),
            "v": tuple(c.reshape(kv_shape) for c in vs),
        }
        out = (
            logits.reshape(batch + (self.num_actions,)),
            value.reshape(batch + (self.value_heads,)),
            feats.reshape(batch + (self.d_model,)),
        )
        return out, new_cache
