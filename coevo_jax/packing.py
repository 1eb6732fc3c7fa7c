"""Token rollouts packed for the transformer: windows of buffers as one token stream, cache restarts.

``pack_windows(obs, done, chunk)`` turns a ``[T, N, L]`` rollout window of
token buffers into one token stream per env (its first buffer, then the tokens
each step added) with a segment id per token, so that
:meth:`coevo_jax.transformer.TransformerActorCritic.score_packed` scores every
step in one causal pass (the PPO update's ``StaticConfig.packed_update``).
:func:`restart_rows` restarts the key-value cache rows of envs that reset.
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


def restart_rows(cache: dict, rows: Array, obs: Array, prompt_kv) -> dict:
    """``cache`` (from :meth:`TransformerActorCritic.init_cache`, batch ``[N]``)
    with the rows where ``rows`` [N] is True restarted on the short buffers
    ``obs`` [N, L] whose key/values ``prompt_kv`` came from
    :meth:`TransformerActorCritic.prompt_step` (``chunk`` = their length axis).
    Only the first ``chunk`` positions of those rows are written; the stale
    positions after them are never attended to (keys past a query's position
    are masked) and are overwritten as the episode grows."""
    pk, pv = prompt_kv
    chunk = pk[0].shape[-2]
    sel = rows[:, None, None, None]
    put = lambda full, new: full.at[..., :chunk, :].set(jnp.where(sel, new, full[..., :chunk, :]))
    new_len = jnp.minimum(jnp.sum(obs != PAD, axis=-1), chunk).astype(jnp.int32)
    return {
        "tokens": jnp.where(rows[:, None], obs.astype(jnp.int32), cache["tokens"]),
        "length": jnp.where(rows, new_len, cache["length"]),
        "k": tuple(put(f, n) for f, n in zip(cache["k"], pk)),
        "v": tuple(put(f, n) for f, n in zip(cache["v"], pv)),
    }
