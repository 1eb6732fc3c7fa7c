"""Shared machinery of the token-level dialogue environments (:class:`TextEnv`), also used by their
turn-level variants (:mod:`envs_jax.text.turns`); vocabulary, buffer writes and grammar are in
:mod:`envs_jax.text.tokens`."""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs_jax.core import Box, Discrete, EnvParams, EnvState, Environment
from envs_jax.text.tokens import AGENT, EOT, PAD, UNK, USER, Grammar, Vocab, write_tokens

Array = jax.Array


def _set(arr: Array, i: Array, value: Array) -> Array:
    """``arr.at[i].set(value)`` (dropped when out of range), without a scatter."""
    return jnp.where(jnp.arange(arr.shape[0]) == i, jnp.asarray(value, arr.dtype), arr)


# ----------------------------------------------------------------------------- params / state
@struct.dataclass
class TextParams(EnvParams):
    """``max_steps``: agent tokens per episode; ``max_turn_tokens``: per-turn cap
    (clipped to the longest utterance); ``use_legal_mask``: fill ``info["legal_mask"]``."""

    max_steps_in_episode: int = 128
    max_turn_tokens: int = 8
    use_legal_mask: bool = False


@struct.dataclass
class TextState(EnvState):
    """``buf``: the token buffer (the observation); ``pos``: write position;
    ``turn_toks``/``turn_len``: the agent's current turn so far; ``turns``:
    completed agent turns; ``invalid_turns``: malformed ones among them."""

    buf: Array
    pos: Array
    turn_toks: Array
    turn_len: Array
    turns: Array
    invalid_turns: Array


@struct.dataclass
class TurnOutcome:
    """What an environment's ``_on_turn`` returns (applied only when a turn ends)."""

    state: Any          # the state with the task fields updated
    words: Array        # int32 [R] the partner's reply words, pad-filled
    num_words: Array    # int32
    reward: Array       # float32
    dense_reward: Array  # float32 (the shaping part; the reward is added by the base)
    terminated: Array   # bool
    success: Array      # bool


@struct.dataclass
class TurnEnd:
    """What :meth:`TextEnv.end_turn` returns: a finished agent turn, answered."""

    state: Any          # the state after the reply (task fields, buf, pos, turn counters; time unchanged)
    end_pos: Array      # int32 write position after the reply, unclipped (> L: the buffer cut the reply)
    reward: Array       # float32
    dense_reward: Array  # float32, the reward plus the env's shaping
    terminated: Array   # bool
    success: Array      # bool (only when terminated)


def advance_time(time: Array, new_pos: Array, room: int, buffer_len: int, terminated: Array,
                 max_steps: Array) -> Array:
    """``time + 1``, or ``max_steps`` (so the base class truncates) when a running episode's buffer has
    fewer than ``room`` free slots after writing up to ``new_pos`` (``room``: the most tokens the next
    step may write before a reply: 1 at token level, the longest utterance at turn level)."""
    overflow = (new_pos + room > buffer_len) & jnp.logical_not(terminated)
    nxt = time + 1
    return jnp.where(overflow, jnp.maximum(nxt, jnp.asarray(max_steps, jnp.int32)), nxt).astype(jnp.int32)


def pack(tokens: Sequence[Any], length: int) -> tuple[Array, Array]:
    """``(int32 [length] pad-filled, count)`` from a short list of scalar ids."""
    if len(tokens) > length:
        raise ValueError("too many tokens for the reply buffer")
    items = [jnp.asarray(t, jnp.int32) for t in tokens] + [jnp.int32(PAD)] * (length - len(tokens))
    return jnp.stack(items), jnp.int32(len(tokens))


def select_reply(cases: Sequence[tuple[Array, tuple[Array, Array]]], default: tuple[Array, Array]):
    """First case whose condition holds (``[(cond, (words, n)), ...]``), else default."""
    words, n = default
    for cond, (w, k) in reversed(list(cases)):
        words = jnp.where(cond, w, words)
        n = jnp.where(cond, k, n)
    return words, n


# ----------------------------------------------------------------------------- base env
class TextEnv(Environment):
    """Base of the token-level dialogue environments: a dialogue with a simulated partner written into
    an int32 buffer ``[L]`` (``<user> hello <agent> ask cuisine <eot> <user> italian <agent> ...``).

    The observation is the buffer, ``<pad>`` (0) after the write position (the non-pad count). One
    action is one token (``Discrete(vocab_size)``); ``<pad>``, ``<user>``, ``<agent>`` are written as
    ``<unk>``. The agent's turn ends at ``<eot>`` or after ``max_turn_tokens``; the partner's reply
    ``<user> ... <agent>`` (no trailing marker when it ends the episode) is written in the same step. A
    turn is well formed iff it is exactly one of the grammar's utterances. A step that leaves no room for
    the next token truncates; failing the task terminates. ``info``: ``success``, ``dense_reward`` (the
    reward plus the env's turn-level bonus), ``turn_end``, ``invalid_turn``, ``turns``, ``legal_mask``
    (legal next tokens for the returned observation; all True unless ``params.use_legal_mask``).

    Subclasses set ``vocab``, ``grammar``, ``state_cls``, ``reply_words`` (longest reply) and
    ``buffer_len`` and implement ``_init_task(key, params) -> (fields, words, n)``, ``_on_turn(key,
    state, utt, valid, params) -> TurnOutcome``, ``expert_utterance`` and ``expert_action``."""

    vocab: Vocab
    grammar: Grammar
    state_cls: type
    reply_words: int
    buffer_len: int
    optional_outputs = ("dense_reward", "success", "legal_mask")

    # -- spaces
    @property
    def vocab_size(self) -> int:
        return self.vocab.size

    @property
    def max_tokens_per_step(self) -> int:
        """Most tokens one step can add (agent token + reply, or a fresh prompt);
        the chunk size incremental decoding needs."""
        return self.reply_words + 3

    def action_space(self, params=None) -> Discrete:
        return Discrete(self.vocab.size)

    def observation_space(self, params=None) -> Box:
        return Box(0, self.vocab.size - 1, (self.buffer_len,), jnp.int32)

    # -- helpers
    def _reply_tokens(self, words: Array, n: Array, closing: Array) -> tuple[Array, Array]:
        """``<user> words[:n]`` plus ``<agent>`` unless ``closing``."""
        toks = jnp.concatenate([jnp.array([USER], jnp.int32), words.astype(jnp.int32), jnp.array([PAD], jnp.int32)])
        marker = jnp.where(closing, PAD, AGENT).astype(jnp.int32)
        toks = toks.at[1 + n].set(marker)
        return toks, 1 + n + jnp.where(closing, 0, 1).astype(jnp.int32)

    def legal_mask(self, state: TextState, params: TextParams | None = None) -> Array:
        """Bool ``[V]``: legal next tokens (all True unless ``params.use_legal_mask``)."""
        params = self.default_params if params is None else params
        mask = self.grammar.legal(state.turn_toks, state.turn_len)
        return jnp.where(jnp.asarray(params.use_legal_mask), mask, jnp.ones_like(mask))

    # -- reset / step
    def reset_env(self, key: Array, params: TextParams):
        fields, words, n = self._init_task(key, params)
        toks, k = self._reply_tokens(words, n, jnp.bool_(False))
        buf = write_tokens(jnp.zeros(self.buffer_len, jnp.int32), jnp.int32(0), toks, k)
        state = self.state_cls(
            time=jnp.int32(0),
            buf=buf,
            pos=jnp.minimum(k, self.buffer_len).astype(jnp.int32),
            turn_toks=jnp.zeros(self.grammar.max_len, jnp.int32),
            turn_len=jnp.int32(0),
            turns=jnp.int32(0),
            invalid_turns=jnp.int32(0),
            **fields,
        )
        return buf, state

    def end_turn(self, key: Array, state: TextState, buf: Array, pos: Array, utt: Array, valid: Array,
                 params: TextParams) -> TurnEnd:
        """The partner's answer to a finished agent turn (shared with :mod:`envs_jax.text.turns`): ``buf
        [L]`` holds the turn (``<eot>`` included) up to ``pos``; ``utt`` is the matched utterance, ``valid``
        whether one matched. Counts the turn, applies ``_on_turn``, writes the reply at ``pos``; ``state.time``
        is the caller's."""
        counted = state.replace(
            turns=state.turns + 1,
            invalid_turns=state.invalid_turns + jnp.where(valid, 0, 1).astype(jnp.int32),
        )
        out: TurnOutcome = self._on_turn(key, counted, jnp.maximum(utt, 0), valid, params)
        terminated = jnp.asarray(out.terminated, jnp.bool_)
        reward = jnp.asarray(out.reward, jnp.float32)
        reply, k = self._reply_tokens(out.words, out.num_words, terminated)
        end_pos = (pos + k).astype(jnp.int32)
        new = out.state.replace(
            buf=write_tokens(buf, pos, reply, k),
            pos=jnp.minimum(end_pos, self.buffer_len).astype(jnp.int32),
            turn_toks=jnp.zeros_like(state.turn_toks),
            turn_len=jnp.int32(0),
        )
        return TurnEnd(
            state=new,
            end_pos=end_pos,
            reward=reward,
            dense_reward=(jnp.asarray(out.dense_reward, jnp.float32) + reward).astype(jnp.float32),
            terminated=terminated,
            success=jnp.asarray(out.success, jnp.bool_) & terminated,
        )

    def step_env(self, key: Array, state: TextState, action: Array, params: TextParams):
        L, V = self.buffer_len, self.vocab.size
        a = jnp.asarray(action, jnp.int32)
        bad = (a < 0) | (a >= V) | (a == PAD) | (a == USER) | (a == AGENT)
        tok = jnp.where(bad, UNK, a).astype(jnp.int32)

        buf = _set(state.buf, state.pos, tok)
        pos = state.pos + 1
        turn_toks = _set(state.turn_toks, state.turn_len, tok)
        turn_len = state.turn_len + 1
        cap = jnp.clip(jnp.asarray(params.max_turn_tokens, jnp.int32), 1, self.grammar.max_len)
        turn_end = (tok == EOT) | (turn_len >= cap)

        utt = self.grammar.match(turn_toks)
        valid = utt >= 0
        ended = self.end_turn(key, state, buf, pos, utt, valid, params)
        mid = state.replace(buf=buf, pos=jnp.minimum(pos, L).astype(jnp.int32), turn_toks=turn_toks,
                            turn_len=turn_len.astype(jnp.int32))
        new = jax.tree.map(lambda t, s: jnp.where(turn_end, t, s), ended.state, mid)
        terminated = turn_end & ended.terminated
        success = turn_end & ended.success
        reward = jnp.where(turn_end, ended.reward, 0.0)
        dense = jnp.where(turn_end, ended.dense_reward, 0.0)
        new_pos = jnp.where(turn_end, ended.end_pos, pos)
        new = new.replace(time=advance_time(state.time, new_pos, 1, L, terminated, params.max_steps_in_episode))

        ends = terminated | (new.time >= jnp.asarray(params.max_steps_in_episode, jnp.int32))
        mask = jnp.where(ends, jnp.asarray(self.grammar.start_mask_np), self.grammar.legal(new.turn_toks, new.turn_len))
        mask = jnp.where(jnp.asarray(params.use_legal_mask), mask, jnp.ones_like(mask))
        info = {
            "success": success,
            "dense_reward": dense.astype(jnp.float32),
            "turn_end": turn_end,
            "invalid_turn": turn_end & jnp.logical_not(valid),
            "turns": new.turns.astype(jnp.int32),
            "legal_mask": mask,
        }
        return new.buf, new, reward, terminated, info

    # -- rendering
    def render(self, state: TextState, params=None) -> str:
        """The dialogue, one ``user: ...`` / ``agent: ...`` line per turn."""
        ids = np.asarray(state.buf).reshape(-1)
        lines: list[str] = []
        role, words = None, []

        def flush():
            if role is not None and (words or role == "user"):
                lines.append(f"{role}: {' '.join(words)}".rstrip())

        for i in ids:
            i = int(i)
            if i == PAD:
                continue
            if i in (USER, AGENT):
                flush()
                role, words = ("user" if i == USER else "agent"), []
                continue
            if i == EOT:
                continue
            words.append(self.vocab.tokens[i] if 0 <= i < self.vocab.size else "<?>")
        flush()
        return "\n".join(lines)

    # -- to implement
    def _init_task(self, key: Array, params: TextParams):
        raise NotImplementedError

    def _on_turn(self, key: Array, state: TextState, utt: Array, valid: Array, params: TextParams) -> TurnOutcome:
        raise NotImplementedError
