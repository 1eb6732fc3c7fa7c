"""Turn-level variants of the dialogue tasks (``Booking-Turns``, ``TwentyQuestions-Turns``,
``TextMaze-Turns``): one action is one whole utterance of the token-level env (:class:`TurnEnv`)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from envs_jax.core import Box, Discrete, Environment
from envs_jax.text.booking import Booking
from envs_jax.text.common import TextEnv, TextParams, TextState, advance_time
from envs_jax.text.tokens import PAD, write_tokens
from envs_jax.text.maze import TextMaze
from envs_jax.text.twenty_questions import TwentyQuestions

Array = jax.Array


def tokens_per_turn(token_env: TextEnv) -> int:
    """The most tokens one turn-level step writes: the longest utterance
    (``<eot>`` included) plus the longest reply with its ``<user>`` /
    ``<agent>`` markers (a fresh opening message is shorter)."""
    return token_env.grammar.max_len + token_env.reply_words + 2


def turns_that_fit(token_env: TextEnv) -> int:
    """The most turns ``token_env``'s buffer holds in the worst case: the
    longest opening message (``reply_words + 2`` tokens), then
    :func:`tokens_per_turn` per turn."""
    return (token_env.buffer_len - (token_env.reply_words + 2)) // tokens_per_turn(token_env)


class TurnEnv(Environment):
    """The turn-level variant of a token-level :class:`TextEnv` (``env.token_env``).

    The action indexes ``env.grammar.utterances`` (``Discrete(len(...))``, clipped); one step writes the
    utterance (``<eot>`` included) and the partner's reply into the same token buffer, exactly as the
    token-level env would. Partner, rewards, ``success`` and ``dense_reward`` are the token-level env's;
    only the discounting differs. ``params``: the token-level class, ``max_steps_in_episode`` counted in
    turns (``max_steps``; default :func:`turns_that_fit`); ``max_turn_tokens`` and ``use_legal_mask`` do
    not apply. A step leaving fewer free slots than the longest utterance truncates. ``info``: the
    token-level keys (``turn_end`` True, ``invalid_turn`` False, ``legal_mask`` all True).
    ``expert_action``: the token-level expert as an utterance index."""

    optional_outputs = TextEnv.optional_outputs

    def __init__(self, token_env: TextEnv, max_steps: int | None = None):
        if not isinstance(token_env, TextEnv):
            raise TypeError(f"TurnEnv wraps a token-level TextEnv, got {type(token_env).__name__}")
        fit = turns_that_fit(token_env)
        if fit < 1:
            raise ValueError(f"buffer_len={token_env.buffer_len} holds no whole turn of {token_env.name}")
        self.token_env = token_env
        self.name = f"{token_env.name}-Turns"
        self.max_steps_in_episode = fit if max_steps is None else int(max_steps)
        if self.max_steps_in_episode < 1:
            raise ValueError(f"max_steps must be >= 1 turn, got {max_steps}")
        table = token_env.grammar.table_np
        self._lengths_np = (table != PAD).sum(axis=1).astype(np.int32)  # [N] tokens per utterance, <eot> included

    # -- what the token-level env defines
    @property
    def vocab(self):
        return self.token_env.vocab

    @property
    def vocab_size(self) -> int:
        return self.token_env.vocab_size

    @property
    def grammar(self):
        return self.token_env.grammar

    @property
    def buffer_len(self) -> int:
        return self.token_env.buffer_len

    @property
    def num_utterances(self) -> int:
        return len(self.token_env.grammar.utterances)

    @property
    def max_tokens_per_step(self) -> int:
        """:func:`tokens_per_turn`."""
        return tokens_per_turn(self.token_env)

    @property
    def default_params(self) -> TextParams:
        return self.token_env.default_params.replace(max_steps_in_episode=self.max_steps_in_episode)

    def action_space(self, params=None) -> Discrete:
        return Discrete(self.num_utterances)

    def observation_space(self, params=None) -> Box:
        return self.token_env.observation_space(params)

    def legal_mask(self, state: TextState, params: TextParams | None = None) -> Array:
        """Bool ``[N]``, all True: every utterance is a well-formed turn."""
        return jnp.ones(self.num_utterances, jnp.bool_)

    def render(self, state: TextState, params=None) -> str:
        return self.token_env.render(state, params)

    def expert_action(self, state: TextState, params=None) -> Array:
        """The token-level env's scripted expert as an int32 utterance index."""
        return self.token_env.expert_utterance(state, params)

    # -- reset / step
    def reset_env(self, key: Array, params: TextParams):
        return self.token_env.reset_env(key, params)

    def step_env(self, key: Array, state: TextState, action: Array, params: TextParams):
        utt = jnp.clip(jnp.asarray(action, jnp.int32), 0, self.num_utterances - 1)
        n = jnp.asarray(self._lengths_np)[utt]
        buf = write_tokens(state.buf, state.pos, self.grammar.table[utt], n)
        ended = self.token_env.end_turn(key, state, buf, state.pos + n, utt, jnp.bool_(True), params)
        time = advance_time(state.time, ended.end_pos, self.grammar.max_len, self.buffer_len, ended.terminated,
                            params.max_steps_in_episode)
        new = ended.state.replace(time=time)
        info = {
            "success": ended.success,
            "dense_reward": ended.dense_reward,
            "turn_end": jnp.bool_(True),
            "invalid_turn": jnp.bool_(False),
            "turns": new.turns.astype(jnp.int32),
            "legal_mask": self.legal_mask(new, params),
        }
        return new.buf, new, ended.reward, ended.terminated, info


def booking_turns(buffer_len: int = 128, max_steps: int | None = None) -> TurnEnv:
    """``Booking-Turns``."""
    return TurnEnv(Booking(buffer_len=buffer_len), max_steps)


def twenty_questions_turns(buffer_len: int = 64, max_steps: int | None = None) -> TurnEnv:
    """``TwentyQuestions-Turns``."""
    return TurnEnv(TwentyQuestions(buffer_len=buffer_len), max_steps)


def text_maze_turns(partial: bool = False, buffer_len: int = 192, max_steps: int | None = None) -> TurnEnv:
    """``TextMaze-Turns`` (``partial=True``: the turn-level ``TextMaze-PO``)."""
    return TurnEnv(TextMaze(partial=partial, buffer_len=buffer_len), max_steps)
