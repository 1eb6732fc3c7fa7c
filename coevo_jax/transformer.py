"""A small causal pre-LayerNorm transformer actor-critic over int32 token buffers ``[..., L]`` (``<pad>``
= 0 after the write position, as :mod:`envs_jax.text` writes them), with the MLP policy's contract at
the last non-pad token. It also scores a whole episode buffer in one pass (``score_sequence``), every
step of packed rollout windows (``score_packed``, used by the PPO update) and decodes incrementally
with a key-value cache (``init_cache``, ``decode_step``). Design notes: ``docs/design.md``."""
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
        """``x [B, C, d]`` at positions ``q_pos [B, C]`` -> ``(y, k, v)``. Keys and values come from ``x_kv
        [B, Lk, d]`` when given (queries only at ``x``); ``mask [B, C, Lk]`` replaces the causal mask; with
        caches ``[B, H, Lc, dh]`` the keys and values of ``x`` are written at ``q_pos[:, 0]`` onwards and the
        caches returned, else the computed ``[B, Lk, H, dh]``."""
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
    """Write ``k, v [B, C, H, dh]`` into the caches ``[B, H, Lc, dh]`` at ``q_pos[:, 0]`` (one contiguous
    slice per row) and attend the pre-scaled ``q`` causally: ``(y [B, C, H, dh], k_cache, v_cache)``."""
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
    """Causal pre-LN transformer actor-critic: ``obs [..., L] -> (logits [..., A], value [..., V],
    features [..., d_model])`` at the last non-pad token (``features``: the final hidden state)."""

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
        """Final hidden states ``[B, P, d]`` of one pass over tokens ``[B, P]`` at positions ``pos [B, P]``,
        or ``[B, Q, d]`` at stream indices ``query [B, Q]``; ``mask [B, P, P]`` replaces the causal mask;
        ``with_kv`` also returns each layer's keys and values."""
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
        """Final hidden states ``[B, L, d]`` of a full pass over ``[B, L]``, or ``[B, d]`` at ``last_only [B]``."""
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
        """Per-position ``(logits [..., L, A], value [..., L, V], features [..., L, d])`` of one causal pass;
        position ``t`` equals ``__call__`` on the buffer cut after token ``t``."""
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
        """``(logits [..., T, A], value [..., T, V], features [..., T, d])`` at the query positions of packed
        streams (:func:`coevo_jax.packing.pack_windows`); entry ``t`` equals ``__call__`` on ``obs[t]``. A
        token sees only the earlier tokens of its own episode."""
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
        """Tokens ``[B, C]`` at ``q_pos`` through every block with the per-layer caches:
        ``(final hidden [B, C, d], k caches, v caches)``."""
        x = self._embed(toks, q_pos)
        ks, vs = [], []
        for i, blk in enumerate(self.blocks):
            x, k_i, v_i = blk(x, q_pos, k_all[i], v_all[i])
            ks.append(k_i)
            vs.append(v_i)
        return self.ln_f(x), ks, vs

    def _prefill(self, obs2: Array, batch: tuple, kv_shape: tuple):
        """:meth:`decode_step` from scratch: one causal pass over ``[B, L]`` whose keys and values fill the
        first ``L`` cache slots."""
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
        """Empty key-value cache for buffers ``[*batch_shape, buffer_len]`` (default ``max_len``) decoded
        ``chunk`` tokens at a time (no parameters needed): ``"k"``, ``"v"`` one array per layer, ``[*batch_shape,
        num_heads, buffer_len + chunk, d_head]``, plus ``"tokens"`` and ``"length"``."""
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

        Processes the tokens from the cached length (0 when the buffer no longer starts with the cached
        tokens, e.g. after an auto-reset) to the write position, at most ``chunk`` (static) per call;
        ``chunk >= L`` is a prefill. The cache must come from ``init_cache(..., chunk=c)``, ``c >= chunk``
        (``ValueError`` otherwise)."""
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
