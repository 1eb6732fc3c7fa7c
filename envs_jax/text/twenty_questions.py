"""``TwentyQuestions``: a twenty-questions-lite guessing game.

A hidden item is drawn uniformly from a fixed table of 16 items x 6 binary
attributes (every item has a distinct attribute code). Agent utterances:

    is <attribute> <eot>      the oracle answers yes / no
    guess <item> <eot>        right: yes (terminated, success); wrong: no (terminated)

A malformed turn is answered ``what`` and uses up a question. After
``params.max_questions`` questions the agent must guess; one more question ends
the episode (``bye``, terminated failure). Reward: +1 on success, else 0
(sparse, paid only on the step the episode ends). ``dense_reward`` adds the
fraction of the remaining candidates the answer eliminated and subtracts
``params.invalid_penalty`` per malformed turn: a hand-designed heuristic, not
potential-based shaping (the fractions do not telescope), so the dense return
can prefer different policies from the external one.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs_jax.text.common import TextEnv, TextParams, TextState, TurnOutcome, pack, select_reply
from envs_jax.text.tokens import Grammar, Vocab

ATTRIBUTES = ("alive", "big", "fly", "water", "legs", "metal")
# item: (alive, big, fly, water, legs, metal)
ITEM_TABLE = {
    "cat": (1, 0, 0, 0, 1, 0),
    "horse": (1, 1, 0, 0, 1, 0),
    "sparrow": (1, 0, 1, 0, 1, 0),
    "eagle": (1, 1, 1, 0, 1, 0),
    "fish": (1, 0, 0, 1, 0, 0),
    "whale": (1, 1, 0, 1, 0, 0),
    "duck": (1, 0, 1, 1, 1, 0),
    "snake": (1, 0, 0, 0, 0, 0),
    "frog": (1, 0, 0, 1, 1, 0),
    "tree": (1, 1, 0, 0, 0, 0),
    "car": (0, 1, 0, 0, 0, 1),
    "plane": (0, 1, 1, 0, 0, 1),
    "boat": (0, 1, 0, 1, 0, 1),
    "spoon": (0, 0, 0, 0, 0, 1),
    "chair": (0, 0, 0, 0, 1, 0),
    "ball": (0, 0, 0, 0, 0, 0),
}
ITEMS = tuple(ITEM_TABLE)
ATTR_TABLE = np.array([ITEM_TABLE[i] for i in ITEMS], np.bool_)  # [16, 6]
assert len({tuple(r) for r in ATTR_TABLE}) == len(ITEMS), "items must be distinguishable"
NUM_ITEMS, NUM_ATTRS = ATTR_TABLE.shape

TWENTY_QUESTIONS_VOCAB = Vocab(("is", "guess") + ATTRIBUTES + ITEMS + ("hello", "yes", "no", "what", "bye"))
_UTTS = [f"is {a} <eot>" for a in ATTRIBUTES] + [f"guess {i} <eot>" for i in ITEMS]
TWENTY_QUESTIONS_GRAMMAR = Grammar(TWENTY_QUESTIONS_VOCAB, _UTTS)


@struct.dataclass
class TwentyQuestionsParams(TextParams):
    max_steps_in_episode: int = 64
    max_turn_tokens: int = 3
    use_legal_mask: bool = False
    max_questions: int = 6
    invalid_penalty: float = 0.1


@struct.dataclass
class TwentyQuestionsState(TextState):
    item: jax.Array        # int32 hidden item
    candidates: jax.Array  # bool [16] items consistent with the answers so far
    questions: jax.Array   # int32 questions used (malformed turns included)


class TwentyQuestions(TextEnv):
    name = "TwentyQuestions"
    vocab = TWENTY_QUESTIONS_VOCAB
    grammar = TWENTY_QUESTIONS_GRAMMAR
    state_cls = TwentyQuestionsState
    reply_words = 1

    def __init__(self, buffer_len: int = 64, use_legal_mask: bool = False):
        self.buffer_len = int(buffer_len)
        self.use_legal_mask = bool(use_legal_mask)

    @property
    def default_params(self) -> TwentyQuestionsParams:
        return TwentyQuestionsParams(max_steps_in_episode=self.buffer_len, use_legal_mask=self.use_legal_mask)

    def _init_task(self, key, params):
        item = jax.random.randint(key, (), 0, NUM_ITEMS, jnp.int32)
        words, n = pack([self.vocab["hello"]], self.reply_words)
        fields = {"item": item, "candidates": jnp.ones(NUM_ITEMS, jnp.bool_), "questions": jnp.int32(0)}
        return fields, words, n

    def _on_turn(self, key, state, utt, valid, params):
        v = self.vocab
        table = jnp.asarray(ATTR_TABLE)
        is_guess = valid & (utt >= NUM_ATTRS)
        is_question = jnp.logical_not(is_guess)  # malformed turns count as questions
        attr = jnp.clip(utt, 0, NUM_ATTRS - 1)
        guess = jnp.clip(utt - NUM_ATTRS, 0, NUM_ITEMS - 1)

        over = is_question & (state.questions >= params.max_questions)
        answer = table[state.item, attr]
        asked = valid & jnp.logical_not(is_guess) & jnp.logical_not(over)
        candidates = jnp.where(asked, state.candidates & (table[:, attr] == answer), state.candidates)
        before = jnp.sum(state.candidates).astype(jnp.float32)
        eliminated = (before - jnp.sum(candidates).astype(jnp.float32)) / jnp.maximum(before, 1.0)

        correct = is_guess & (guess == state.item)
        terminated = is_guess | over
        reward = jnp.where(correct, 1.0, 0.0)
        shaping = eliminated - jnp.where(valid, 0.0, params.invalid_penalty)

        R = self.reply_words
        words, n = select_reply(
            [
                (over, pack([v["bye"]], R)),
                (jnp.logical_not(valid), pack([v["what"]], R)),
                (is_guess, select_reply([(correct, pack([v["yes"]], R))], pack([v["no"]], R))),
                (answer, pack([v["yes"]], R)),
            ],
            pack([v["no"]], R),
        )
        new = state.replace(
            candidates=candidates,
            questions=state.questions + jnp.where(is_question, 1, 0).astype(jnp.int32),
        )
        return TurnOutcome(new, words, n, reward, shaping, terminated, correct)

    def expert_action(self, state, params=None):
        return twenty_questions_expert_action(state, params)

    def expert_utterance(self, state, params=None):
        return twenty_questions_expert_utterance(state, params)


def twenty_questions_expert_utterance(state: TwentyQuestionsState, params=None) -> jax.Array:
    """The expert's next utterance (int32 index into ``TWENTY_QUESTIONS_GRAMMAR``):
    ask the attribute splitting the remaining candidates most evenly; guess when
    one candidate is left (at most 6 questions)."""
    table = jnp.asarray(ATTR_TABLE)
    cands = state.candidates
    yes = jnp.sum(cands[:, None] & table, axis=0)
    no = jnp.sum(cands[:, None] & jnp.logical_not(table), axis=0)
    split = jnp.minimum(yes, no)
    attr = jnp.argmax(split).astype(jnp.int32)
    done = jnp.sum(cands) <= 1
    return jnp.where(done, NUM_ATTRS + jnp.argmax(cands), attr).astype(jnp.int32)


def twenty_questions_expert_action(state: TwentyQuestionsState, params=None) -> jax.Array:
    """The expert's next token: :func:`twenty_questions_expert_utterance`, one token per step."""
    utt = twenty_questions_expert_utterance(state, params)
    return TWENTY_QUESTIONS_GRAMMAR.emit(utt, state.turn_toks, state.turn_len)
