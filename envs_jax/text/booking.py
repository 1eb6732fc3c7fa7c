"""``Booking``: a restaurant-booking dialogue with a rule-based user simulator.

The user holds a hidden goal: one value for each of the slots ``cuisine``
(italian chinese indian french), ``area`` (north south east west), ``price``
(cheap moderate expensive) and ``size`` (two four six). Agent utterances:

    ask <slot> <eot>
    propose <cuisine> <area> <price> <size> <eot>
    bye <eot>

The user answers ``ask`` with the slot's value, rejects a wrong proposal with
``no <first wrong slot>``, accepts the right one with ``yes booked``
(terminated, success, reward +1), says ``sorry`` to a malformed turn and leaves
(``sorry bye``) after ``params.max_invalid`` of them. ``bye``, the user leaving
and reaching ``params.max_turns`` turns without a booking are terminated
failures with reward -1; all other steps pay 0. ``dense_reward`` adds
``params.reveal_bonus`` per newly revealed slot and subtracts
``params.invalid_penalty`` per malformed turn. This is a hand-designed
heuristic, not potential-based shaping: the reveal bonus is the undiscounted
change of ``reveal_bonus * #revealed``, which is not zeroed at termination, and
the penalty is a plain cost, so the dense return can prefer different policies
from the external one.
"""
from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs_jax.text.common import TextEnv, TextParams, TextState, TurnOutcome, pack, select_reply
from envs_jax.text.tokens import Grammar, Vocab

SLOTS = ("cuisine", "area", "price", "size")
SLOT_VALUES = (
    ("italian", "chinese", "indian", "french"),
    ("north", "south", "east", "west"),
    ("cheap", "moderate", "expensive"),
    ("two", "four", "six"),
)
NUM_VALUES = tuple(len(v) for v in SLOT_VALUES)
_USER_WORDS = ("hello", "no", "yes", "booked", "sorry")
_AGENT_WORDS = ("ask", "propose", "bye")

BOOKING_VOCAB = Vocab(_AGENT_WORDS + SLOTS + sum(SLOT_VALUES, ()) + _USER_WORDS)

# utterances: asks (0..3), bye (4), proposals (5..) in mixed-radix order
_UTTS = [f"ask {s} <eot>" for s in SLOTS] + ["bye <eot>"]
_PROPOSALS = list(itertools.product(*[range(n) for n in NUM_VALUES]))
_UTTS += [
    "propose " + " ".join(SLOT_VALUES[i][v] for i, v in enumerate(vals)) + " <eot>" for vals in _PROPOSALS
]
BOOKING_GRAMMAR = Grammar(BOOKING_VOCAB, _UTTS)
_KIND_ASK, _KIND_BYE, _KIND_PROPOSE = 0, 1, 2
_UTT_KIND = np.array([_KIND_ASK] * 4 + [_KIND_BYE] + [_KIND_PROPOSE] * len(_PROPOSALS), np.int32)
_UTT_SLOT = np.array(list(range(4)) + [0] * (1 + len(_PROPOSALS)), np.int32)
_UTT_VALUES = np.array([[0] * 4] * 5 + [list(v) for v in _PROPOSALS], np.int32)
_SLOT_TOKENS = np.array([BOOKING_VOCAB[s] for s in SLOTS], np.int32)
_VALUE_TOKENS = np.zeros((4, max(NUM_VALUES)), np.int32)
for _i, _vals in enumerate(SLOT_VALUES):
    for _j, _v in enumerate(_vals):
        _VALUE_TOKENS[_i, _j] = BOOKING_VOCAB[_v]
_REPLY_WORDS = 2


@struct.dataclass
class BookingParams(TextParams):
    max_steps_in_episode: int = 128
    max_turn_tokens: int = 6
    use_legal_mask: bool = False
    max_turns: int = 10
    max_invalid: int = 3
    reveal_bonus: float = 0.1
    invalid_penalty: float = 0.1


@struct.dataclass
class BookingState(TextState):
    goal: jax.Array       # int32 [4] value index per slot
    revealed: jax.Array   # bool [4] slots the user has told the agent


class Booking(TextEnv):
    name = "Booking"
    vocab = BOOKING_VOCAB
    grammar = BOOKING_GRAMMAR
    state_cls = BookingState
    reply_words = _REPLY_WORDS

    def __init__(self, buffer_len: int = 128, use_legal_mask: bool = False):
        self.buffer_len = int(buffer_len)
        self.use_legal_mask = bool(use_legal_mask)

    @property
    def default_params(self) -> BookingParams:
        return BookingParams(max_steps_in_episode=self.buffer_len, use_legal_mask=self.use_legal_mask)

    def _init_task(self, key, params):
        code = jax.random.randint(key, (), 0, int(np.prod(NUM_VALUES)), jnp.int32)
        goal = []
        for n in reversed(NUM_VALUES):  # mixed-radix digits: a uniform goal
            goal.append(code % n)
            code = code // n
        goal = jnp.stack(goal[::-1]).astype(jnp.int32)
        words, n = pack([self.vocab["hello"]], self.reply_words)
        return {"goal": goal, "revealed": jnp.zeros(4, jnp.bool_)}, words, n

    def _on_turn(self, key, state, utt, valid, params):
        v = self.vocab
        kind = jnp.asarray(_UTT_KIND)[utt]
        slot = jnp.asarray(_UTT_SLOT)[utt]
        vals = jnp.asarray(_UTT_VALUES)[utt]
        is_ask = valid & (kind == _KIND_ASK)
        is_bye = valid & (kind == _KIND_BYE)
        is_prop = valid & (kind == _KIND_PROPOSE)

        newly = is_ask & jnp.logical_not(state.revealed[slot])
        revealed = state.revealed | (is_ask & (jnp.arange(4) == slot))
        wrong = vals != state.goal
        correct = is_prop & jnp.logical_not(jnp.any(wrong))
        first_wrong = jnp.argmax(wrong)

        leaves = jnp.logical_not(valid) & (state.invalid_turns >= params.max_invalid)
        timeout = (state.turns >= params.max_turns) & jnp.logical_not(correct)
        fail = is_bye | leaves | timeout
        terminated = correct | fail
        reward = jnp.where(correct, 1.0, jnp.where(fail, -1.0, 0.0))
        shaping = jnp.where(newly, params.reveal_bonus, 0.0) - jnp.where(valid, 0.0, params.invalid_penalty)

        R = self.reply_words
        words, n = select_reply(
            [
                (correct, pack([v["yes"], v["booked"]], R)),
                (is_bye, pack([v["bye"]], R)),
                (fail, pack([v["sorry"], v["bye"]], R)),
                (is_ask, pack([jnp.asarray(_VALUE_TOKENS)[slot, state.goal[slot]]], R)),
                (is_prop, pack([v["no"], jnp.asarray(_SLOT_TOKENS)[first_wrong]], R)),
            ],
            pack([v["sorry"]], R),
        )
        return TurnOutcome(
            state=state.replace(revealed=revealed),
            words=words,
            num_words=n,
            reward=reward,
            dense_reward=shaping,
            terminated=terminated,
            success=correct,
        )

    def expert_action(self, state, params=None):
        return booking_expert_action(state, params)

    def expert_utterance(self, state, params=None):
        return booking_expert_utterance(state, params)


def booking_expert_utterance(state: BookingState, params=None) -> jax.Array:
    """The expert's next utterance (int32 index into ``BOOKING_GRAMMAR``): ask
    each slot not yet revealed (in order), then propose the revealed goal."""
    unrevealed = jnp.logical_not(state.revealed)
    ask = jnp.argmax(unrevealed).astype(jnp.int32)
    idx = jnp.int32(0)
    for g, n in zip(range(4), NUM_VALUES):
        idx = idx * n + state.goal[g]
    return jnp.where(jnp.any(unrevealed), ask, 5 + idx).astype(jnp.int32)


def booking_expert_action(state: BookingState, params=None) -> jax.Array:
    """The expert's next token: :func:`booking_expert_utterance`, one token per step."""
    return BOOKING_GRAMMAR.emit(booking_expert_utterance(state, params), state.turn_toks, state.turn_len)
