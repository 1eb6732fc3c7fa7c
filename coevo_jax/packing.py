"""Token rollouts packed for the transformer: windows of buffers as one token stream, cache restarts.

``pack_windows(obs, done, chunk)`` turns a ``[T, N, L]`` rollout window of
token buffers into one token stream per env (its first buffer, then the tokens
each step added) with a segment id per token, so that
:meth:`coevo_jax.transformer.TransformerActorCritic.score_packed` scores every
step in one causal pass (the PPO update's ``StaticConfig.packed_update``).
:func:`decode_rows` decodes just the rows of a batch that need it (a turn's reply, a fresh prompt).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array
PAD = 0


class PackedWindows(NamedTuple):
    """The ``T`` observations of a rollout window of one env, packed into one
    token stream of length ``P = L + (T - 1) * chunk`` (leading batch axes
    allowed on every field). Built by :func:`pack_windows`; scored by
    :meth:`TransformerActorCritic.score_packed`."""

    tokens: Array  # int32 [..., P]
    pos: Array  # int32 [..., P] buffer position of each token
    seg: Array  # int32 [..., P] episode id within the window; -1 marks padding
    query: Array  # int32 [..., T] stream index of the last token of obs[t]


def pack_window(obs: Array, fresh: Array, chunk: int) -> PackedWindows:
    """Pack one env's observations ``obs`` [T, L] into a :class:`PackedWindows`.

    ``fresh`` [T] (bool) marks the observations that start an episode (after an
    auto-reset); ``obs[0]`` is taken whole. Every other ``obs[t]`` must extend
    ``obs[t-1]`` (unless fresh) by 1..``chunk`` tokens, which holds for the
    text environments with ``chunk = env.max_tokens_per_step`` (a fresh
    observation holds at most ``chunk`` tokens). The stream is ``obs[0]`` (L
    slots), then ``chunk`` slots per later step holding the tokens the step
    added (the whole prompt when fresh); unused slots are padding.
    """
    t_len, l = obs.shape
    obs = obs.astype(jnp.int32)
    width = jnp.sum(obs != PAD, axis=-1).astype(jnp.int32)  # [T]
    fresh = fresh.at[0].set(True)
    seg_id = jnp.cumsum(fresh.astype(jnp.int32)) - 1  # [T]
    start = jnp.where(fresh, 0, jnp.concatenate([jnp.zeros(1, jnp.int32), width[:-1]]))  # [T]

    j = jnp.arange(chunk)
    pos_rest = start[1:, None] + j[None, :]  # [T-1, C]
    tok_rest = jnp.take_along_axis(obs[1:], jnp.clip(pos_rest, 0, l - 1), axis=1)
    ok_rest = pos_rest < width[1:, None]
    cols = jnp.arange(l)
    ok_first = cols < width[0]
    tokens = jnp.concatenate([jnp.where(ok_first, obs[0], PAD), jnp.where(ok_rest, tok_rest, PAD).reshape(-1)])
    pos = jnp.concatenate([cols, pos_rest.reshape(-1)]).astype(jnp.int32)
    seg = jnp.concatenate([jnp.where(ok_first, seg_id[0], -1),
                           jnp.where(ok_rest, seg_id[1:, None], -1).reshape(-1)]).astype(jnp.int32)
    last = jnp.maximum(width - 1, 0)
    query = jnp.concatenate([last[:1], l + jnp.arange(t_len - 1) * chunk + jnp.clip(last[1:] - start[1:], 0, chunk - 1)])
    return PackedWindows(tokens, pos, seg, query.astype(jnp.int32))


def pack_windows(obs: Array, done: Array, chunk: int) -> PackedWindows:
    """Pack a ``[T, N, L]`` rollout window per env: fields ``[N, P]`` and
    ``query [N, T]``. ``done`` [T, N] marks the steps whose episode ended (so
    ``obs[t + 1]`` is fresh)."""
    fresh = jnp.concatenate([jnp.ones_like(done[:1]), done[:-1]], axis=0)
    return jax.vmap(pack_window, in_axes=(1, 1, None))(obs, fresh, chunk)


def decode_rows(decode, cache: dict, obs: Array, out, rows: Array, group: int):
    """Run ``decode(cache_rows, obs_rows) -> (out_rows, cache_rows)`` on just the
    rows where ``rows`` [N] is True, ``group`` (static) rows at a time: each group
    is gathered out of the batch (its cache rows included), decoded, and written
    back; the other rows keep ``out`` and ``cache``. One group always runs (its
    unused slots decode a copy of row ``N - 1`` and are dropped); a
    ``while_loop`` runs the further groups only while rows remain, so a step
    costs about ``group / N`` of a whole-batch decode when few rows need one.
    With ``group >= N`` the whole batch is decoded and the rows selected.

    ``cache``: a :meth:`TransformerActorCritic.init_cache` dict with batch
    ``[N]``; ``obs`` [N, L]; ``out``: a pytree of ``[N, ...]`` outputs.
    Returns ``(out, cache)``."""
    n = rows.shape[0]
    if group >= n:
        new_out, new_cache = decode(cache, obs)
        pick = lambda new, old: jnp.where(rows.reshape(rows.shape + (1,) * (new.ndim - 1)), new, old)
        return jax.tree.map(pick, new_out, out), jax.tree.map(pick, new_cache, cache)

    def one_group(todo, out, cache):
        idx = jnp.nonzero(todo, size=group, fill_value=n)[0]  # [G]; n marks an unused slot
        take = jnp.minimum(idx, n - 1)
        sub_out, sub_cache = decode(jax.tree.map(lambda a: a[take], cache), obs[take])
        put = lambda full, sub: full.at[idx].set(sub, mode="drop")
        return todo.at[idx].set(False, mode="drop"), jax.tree.map(put, out, sub_out), jax.tree.map(put, cache, sub_cache)

    carry = one_group(rows, out, cache)
    _, out, cache = jax.lax.while_loop(lambda c: jnp.any(c[0]), lambda c: one_group(*c), carry)
    return out, cache
