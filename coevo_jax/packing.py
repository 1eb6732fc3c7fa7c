"""Token rollouts packed for the transformer: :func:`pack_windows` turns a ``[T, N, L]`` window of
token buffers into one token stream per env for
:meth:`~coevo_jax.transformer.TransformerActorCritic.score_packed`; :func:`decode_rows` decodes only
the rows of a batch that need it."""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array
PAD = 0


class PackedWindows(NamedTuple):
    """One env's ``T`` window observations as one token stream of length ``P = L + (T - 1) * chunk``
    (leading batch axes allowed), built by :func:`pack_windows`."""

    tokens: Array  # int32 [..., P]
    pos: Array  # int32 [..., P] buffer position of each token
    seg: Array  # int32 [..., P] episode id within the window; -1 marks padding
    query: Array  # int32 [..., T] stream index of the last token of obs[t]


def pack_window(obs: Array, fresh: Array, chunk: int) -> PackedWindows:
    """Pack one env's ``obs [T, L]`` (``fresh [T]``: starts an episode) into a :class:`PackedWindows`:
    ``obs[0]`` whole (``L`` slots), then ``chunk`` slots per step for the tokens it added (the whole
    prompt when fresh). Each non-fresh ``obs[t]`` must extend ``obs[t-1]`` by 1..``chunk`` tokens, as the
    text envs do with ``chunk = env.max_tokens_per_step``."""
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
    """Pack ``obs [T, N, L]`` per env (``done [T, N]``: the episode ended): fields ``[N, P]``, ``query [N, T]``."""
    fresh = jnp.concatenate([jnp.ones_like(done[:1]), done[:-1]], axis=0)
    return jax.vmap(pack_window, in_axes=(1, 1, None))(obs, fresh, chunk)


def decode_rows(decode, cache: dict, obs: Array, out, rows: Array, group: int):
    """``(out, cache)`` with ``decode(cache_rows, obs_rows) -> (out_rows, cache_rows)`` run only on the
    rows where ``rows [N]`` is True, ``group`` (static) rows at a time, gathered and written back; other
    rows keep ``out`` (pytree of ``[N, ...]``) and ``cache`` (``init_cache`` dict, batch ``[N]``). One
    group always runs, further ones while rows remain; ``group >= N`` decodes the whole batch."""
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
