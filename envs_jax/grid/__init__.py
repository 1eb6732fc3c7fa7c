"""Grid worlds: ``KeyDoor`` (MiniGrid DoorKey, Chevalier-Boisvert et al.) and
``FourRooms`` (Sutton, Precup and Singh 1999), ``KeyToDoor`` (Key-to-Door with
distractor apples, Hung et al. 2019), with host-side shortest-path
ground truth for credit-assignment studies (:func:`optimal_distances`,
:func:`optimal_advantage`; decoding observations and the optimal advantage of
recorded steps in :mod:`envs_jax.grid.ground_truth`).

Registered names: ``KeyDoor-5x5``, ``KeyDoor-6x6``, ``KeyDoor-8x8``, ``FourRooms``,
``KeyToDoor-Distractor`` (4x4 rooms; its params as keyword arguments, e.g.
``apple_reward=0`` for no distractor reward), ``KeyToDoor-Match`` (its memory version:
two key colours, the door of the key's colour to find).
"""
from envs_jax.registry import register
from envs_jax.grid._common import ShapedParams, optimal_advantage
from envs_jax.grid.fourrooms import FourRooms, FourRoomsParams, FourRoomsState
from envs_jax.grid.keytodoor import KeyToDoor, KeyToDoorParams, KeyToDoorState
from envs_jax.grid.keydoor import (
    KeyDoor,
    KeyDoorParams,
    KeyDoorState,
    optimal_distances,
    optimal_steps_to_goal,
)


def _keydoor_factory(size: int):
    def factory(**kwargs):
        return KeyDoor(size=size, **kwargs)

    return factory


for _size in (5, 6, 8):
    register(f"KeyDoor-{_size}x{_size}", _keydoor_factory(_size))
register("FourRooms", lambda **kwargs: FourRooms(**kwargs))
register("KeyToDoor-Distractor", lambda **kwargs: KeyToDoor(**kwargs))
register("KeyToDoor-Match", lambda **kwargs: KeyToDoor(colors=2, **kwargs))

__all__ = [
    "FourRooms", "FourRoomsParams", "FourRoomsState", "KeyDoor", "KeyDoorParams", "KeyDoorState",
    "KeyToDoor", "KeyToDoorParams", "KeyToDoorState", "ShapedParams",
    "optimal_advantage", "optimal_distances", "optimal_steps_to_goal",
]
