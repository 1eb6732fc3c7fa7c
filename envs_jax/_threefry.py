"""Threefry without a loop on CPU: the same random bits, fewer loop trips.

JAX lowers its Threefry-2x32 hash (every ``jax.random.split``, ``uniform``,
``categorical`` ...) as five loop trips of four rounds on CPU, and unrolled on
every other backend. Inside an RL rollout that is several tiny ``while`` loops
per env step (the step key's split, the per-env keys, the action's Gumbel noise,
the auto-reset's draws), and their loop overhead, not the hashing, dominates
the step at small batches: PPO on CartPole at one seed ran 1.36x faster unrolled,
at 8-64 seeds 0.97-1.17x (``sweeps/bench.py --sections ppo --threefry-ab``, medians
of 3 interleaved repetitions; the table is in the README).
This module registers JAX's own unrolled lowering (the one GPUs get) for CPU
too. The arithmetic is the same, so every random number is bit for bit what
the rolled loop gives (tested); only the compiled program's shape changes.

Applied when ``envs_jax`` is imported; ``COEVO_JAX_ROLLED_THREEFRY=1`` keeps
JAX's CPU default. It uses JAX internals (``jax._src.random.threefry2x32``);
where they are missing (another JAX version) it does nothing.
"""
import os


def use_unrolled_threefry_on_cpu() -> bool:
    """Register the unrolled Threefry lowering for CPU; ``True`` when it was registered."""
    if os.environ.get("COEVO_JAX_ROLLED_THREEFRY") == "1":
        return False
    try:
        from jax._src.interpreters import mlir
        from jax._src.random import threefry2x32 as tf

        rule, prim = tf._threefry2x32_lowering_rule, tf.threefry2x32_p
    except (ImportError, AttributeError):  # a JAX without these internals: keep its default
        return False
    mlir.register_lowering(prim, rule, platform="cpu")
    return True


UNROLLED = use_unrolled_threefry_on_cpu()
