"""Token-level text environments: dialogues written into a fixed int32 token
buffer, one action = one token (see :mod:`envs_jax.text.common`).

Registered: ``Booking``, ``TwentyQuestions``, ``TextMaze``, ``TextMaze-PO``,
and their turn-level variants ``Booking-Turns``, ``TwentyQuestions-Turns``,
``TextMaze-Turns`` (one action = one whole utterance, see
:mod:`envs_jax.text.turns`; ``make("TextMaze-Turns", partial=True)`` is the
turn-level ``TextMaze-PO``).
Each env also has ``env.expert_action(state, params)`` (the module-level
``*_expert_action`` functions): a scripted, jittable expert; token-level envs
also have ``env.expert_utterance(state, params)``, the utterance it is saying.
Every token-level constructor takes ``use_legal_mask`` (default ``False``), the default of
``params.use_legal_mask``: ``envs_jax.make("Booking", use_legal_mask=True)``.
"""
from envs_jax.registry import register
from envs_jax.text.booking import (
    BOOKING_VOCAB,
    Booking,
    BookingParams,
    BookingState,
    booking_expert_action,
    booking_expert_utterance,
)
from envs_jax.text.common import TextEnv, TextParams, TextState
from envs_jax.text.tokens import AGENT, EOT, PAD, UNK, USER, Grammar, Vocab, decode, encode, write_position
from envs_jax.text.maze import MAZE_VOCAB, MazeParams, MazeState, TextMaze, maze_expert_action, maze_expert_utterance
from envs_jax.text.turns import TurnEnv, booking_turns, text_maze_turns, turns_that_fit, twenty_questions_turns
from envs_jax.text.twenty_questions import (
    TWENTY_QUESTIONS_VOCAB,
    TwentyQuestions,
    TwentyQuestionsParams,
    TwentyQuestionsState,
    twenty_questions_expert_action,
    twenty_questions_expert_utterance,
)

register("Booking", lambda **kw: Booking(**kw))
register("TwentyQuestions", lambda **kw: TwentyQuestions(**kw))
register("TextMaze", lambda **kw: TextMaze(partial=False, **kw))
register("TextMaze-PO", lambda **kw: TextMaze(partial=True, **kw))
register("Booking-Turns", booking_turns)
register("TwentyQuestions-Turns", twenty_questions_turns)
register("TextMaze-Turns", text_maze_turns)

__all__ = [
    "AGENT", "EOT", "PAD", "UNK", "USER",
    "BOOKING_VOCAB", "MAZE_VOCAB", "TWENTY_QUESTIONS_VOCAB",
    "Booking", "BookingParams", "BookingState",
    "Grammar", "MazeParams", "MazeState", "TextEnv", "TextMaze", "TextParams", "TextState", "TurnEnv",
    "TwentyQuestions", "TwentyQuestionsParams", "TwentyQuestionsState", "Vocab",
    "booking_expert_action", "booking_expert_utterance", "booking_turns", "decode", "encode",
    "maze_expert_action", "maze_expert_utterance", "text_maze_turns", "turns_that_fit",
    "twenty_questions_expert_action", "twenty_questions_expert_utterance", "twenty_questions_turns",
    "write_position",
]
