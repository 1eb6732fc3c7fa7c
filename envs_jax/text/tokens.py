"""Tokens of the text environments: the vocabulary, the token buffer and the grammar.

``PAD`` (id 0) fills a buffer after its write position; ``<eot>`` ends an
agent turn; ``<user>`` / ``<agent>`` open the partner's and the agent's
turns; ``<unk>`` replaces an action that would break the buffer's form. A
:class:`Grammar` is the finite list of an env's well-formed utterances, with
the jittable matching, legal-next-token and expert-emission functions the
token-level envs (:mod:`envs_jax.text.common`) use.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

PAD, EOT, USER, AGENT, UNK = 0, 1, 2, 3, 4
SPECIAL_TOKENS = ("<pad>", "<eot>", "<user>", "<agent>", "<unk>")


# ----------------------------------------------------------------------------- vocabulary
class Vocab:
    """A fixed word-level vocabulary: the special tokens (ids 0-4) then ``words``."""

    def __init__(self, words: Sequence[str]):
        tokens = tuple(SPECIAL_TOKENS) + tuple(words)
        if len(set(tokens)) != len(tokens):
            dup = sorted({t for t in tokens if tokens.count(t) > 1})
            raise ValueError(f"duplicate vocabulary tokens: {dup}")
        self.tokens = tokens
        self._index = {t: i for i, t in enumerate(tokens)}

    @property
    def size(self) -> int:
        return len(self.tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, word: str) -> bool:
        return word in self._index

    def __getitem__(self, word: str) -> int:
        try:
            return self._index[word]
        except KeyError:
            raise KeyError(f"{word!r} is not in the vocabulary {self.tokens}") from None

    def __repr__(self) -> str:
        return f"Vocab({self.size} tokens)"


def encode(vocab: Vocab, text: str | Sequence[str]) -> np.ndarray:
    """Whitespace-separated words (or a list of words) to an int32 id array."""
    words = text.split() if isinstance(text, str) else list(text)
    return np.asarray([vocab[w] for w in words], dtype=np.int32)


def decode(vocab: Vocab, ids: Any, skip_pad: bool = True) -> str:
    """Ids to space-joined words; ``<pad>`` is dropped unless ``skip_pad=False``."""
    ids = np.asarray(ids).reshape(-1)
    words = [vocab.tokens[int(i)] if 0 <= int(i) < vocab.size else "<?>" for i in ids]
    if skip_pad:
        words = [w for w in words if w != "<pad>"]
    return " ".join(words)


def write_position(buf: Array) -> Array:
    """Number of non-pad tokens of a buffer ``[..., L]`` (int32 ``[...]``)."""
    return jnp.sum(buf != PAD, axis=-1).astype(jnp.int32)


def write_tokens(buf: Array, pos: Array, toks: Array, n: Array) -> Array:
    """``buf`` with ``toks[:n]`` written at ``pos``; writes past the end are dropped."""
    rel = jnp.arange(buf.shape[0], dtype=jnp.int32) - pos
    inside = (rel >= 0) & (rel < jnp.minimum(n, toks.shape[0]))
    return jnp.where(inside, toks.astype(buf.dtype)[jnp.clip(rel, 0, toks.shape[0] - 1)], buf)


# ----------------------------------------------------------------------------- grammar
class Grammar:
    """The finite list of well-formed agent utterances of one environment.

    ``table`` (int32 ``[N, U]``) holds each utterance's ids, ``<eot>`` last, then
    pads; ``U`` is the longest utterance, which is also the per-turn token cap.
    """

    def __init__(self, vocab: Vocab, utterances: Sequence[str]):
        rows = [encode(vocab, u) for u in utterances]
        for u, r in zip(utterances, rows):
            if len(r) == 0 or r[-1] != EOT or np.any(r[:-1] == EOT) or np.any(r == PAD):
                raise ValueError(f"utterance {u!r} must end with a single <eot> and hold no <pad>")
        self.utterances = tuple(utterances)
        self.max_len = max(len(r) for r in rows)
        table = np.zeros((len(rows), self.max_len), np.int32)
        for k, r in enumerate(rows):
            table[k, : len(r)] = r
        if len({tuple(r) for r in table}) != len(rows):
            raise ValueError("duplicate utterances")
        self.table_np = table
        self.vocab_size = vocab.size
        self.start_mask_np = np.zeros(vocab.size, bool)
        self.start_mask_np[table[:, 0]] = True

    @property
    def table(self) -> Array:
        return jnp.asarray(self.table_np)

    def match(self, turn_toks: Array) -> Array:
        """Index of the utterance equal to ``turn_toks`` (``[U]``, pad-filled), else -1."""
        eq = jnp.all(self.table == turn_toks[None, :], axis=1)
        return jnp.where(jnp.any(eq), jnp.argmax(eq), -1).astype(jnp.int32)

    def legal(self, turn_toks: Array, turn_len: Array) -> Array:
        """Bool ``[V]``: tokens extending the current prefix towards some utterance
        (just ``<eot>`` when no utterance is reachable any more)."""
        table = self.table
        u = table.shape[1]
        cols = jnp.arange(u)
        prefix_ok = jnp.all((table == turn_toks[None, :]) | (cols[None, :] >= turn_len), axis=1)
        nxt = table[:, jnp.clip(turn_len, 0, u - 1)]
        ok = prefix_ok & (turn_len < u) & (nxt != PAD)
        mask = jnp.any((nxt[:, None] == jnp.arange(self.vocab_size)[None, :]) & ok[:, None], axis=0)
        eot_only = jnp.arange(self.vocab_size) == EOT
        return jnp.where(jnp.any(mask), mask, eot_only)

    def emit(self, utt: Array, turn_toks: Array, turn_len: Array) -> Array:
        """Next token of utterance ``utt`` given the turn so far (``<eot>`` if the
        turn already departed from it)."""
        target = self.table[utt]
        u = target.shape[0]
        cols = jnp.arange(u)
        prefix_ok = jnp.all((target == turn_toks) | (cols >= turn_len))
        tok = target[jnp.clip(turn_len, 0, u - 1)]
        good = prefix_ok & (turn_len < u) & (tok != PAD)
        return jnp.where(good, tok, EOT).astype(jnp.int32)
