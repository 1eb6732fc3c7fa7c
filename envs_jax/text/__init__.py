"""Token-level text environments: dialogues written into a fixed int32 token
buffer, one action = one token (see :mod:`envs_jax.text.common`).

Registered: ``Booking``, ``TwentyQuestions``, ``TextMaze``, ``TextMaze-PO``.
Each env also has ``env.expert_action(state, params)`` (the module-level
``*_expert_action`` functions): a scripted, jittable expert.
Every constructor takes ``use_legal_mask`` (default ``False``), the default of
``params.use_legal_mask``: ``envs_jax.make("Booking", use_legal_mask=True)``.
"""
from envs_jax.core import register
from envs_jax.text.booking import BOOKING_VOCAB, Booking, BookingParams, BookingState, booking_expert_action
from envs_jax.text.common import (
    AGENT,
    EOT,
    PAD,
    UNK,
    USER,
    Grammar,
    TextEnv,
    TextParams,
    TextState,
    Vocab,
    decode,
    encode,
    write_position,
)
from envs_jax.text.maze import MAZE_VOCAB, MazeParams, MazeState, TextMaze, maze_expert_action
from envs_jax.text.twenty_questions import (
    TWENTY_QUESTIONS_VOCAB,
    TwentyQuestions,
    TwentyQuestionsParams,
    TwentyQuestionsState,
    twenty_questions_expert_action,
)

register("Booking", lambda **kw: Booking(**kw))
register("TwentyQuestions", lambda **kw: TwentyQuestions(**kw))
register("TextMaze", lambda **kw: TextMaze(partial=False, **kw))
register("TextMaze-PO", lambda **kw: TextMaze(partial=True, **kw))

__all__ = [
    "AGENT", "EOT", "PAD", "UNK", "USER",
    "BOOKING_VOCAB", "MAZE_VOCAB", "TWENTY_QUESTIONS_VOCAB",
    "Booking", "BookingParams", "BookingState",
    "Grammar", "MazeParams", "MazeState", "TextEnv", "TextMaze", "TextParams", "TextState",
    "TwentyQuestions", "TwentyQuestionsParams", "TwentyQuestionsState", "Vocab",
    "booking_expert_action", "decode", "encode", "maze_expert_action",
    "twenty_questions_expert_action", "write_position",
]
