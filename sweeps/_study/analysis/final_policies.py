"""The trained policies of a finished study (one run with ``Study(save_final=True)``).

:func:`final_rollouts` runs every run's final policy for a fresh rollout, from
the env states its training ended in; :func:`run_state` takes one run out of
the stacked states.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from coevo_jax.rollout import rollout
from coevo_jax.train import Trainer


def trainer_for(result, label: str):
    """The :class:`~coevo_jax.train.Trainer` of arm ``label`` (same static config and env as its runs)."""
    arm = next(a for a in result.study.arms if a.name == label)
    return Trainer(arm.static, *result.study.make_env())


def run_state(states, i: int):
    """Run ``i`` of stacked states (leaves ``[runs, ...]``), as JAX arrays (safe to close over in ``jit``)."""
    return jax.tree.map(lambda x: jnp.asarray(x[i]), states)


def final_rollouts(trainer, states, key, length: int):
    """One rollout of ``length`` steps of every run's final policy, continuing from
    its last env states: a :class:`~coevo_jax.rollout.Trajectory` with leaves ``[R, T, N, ...]``
    (host NumPy)."""

    def one(s, k):
        return rollout(trainer.network, s.params, trainer.env, trainer.env_params, s.rollout, k, length,
                       trainer.decode_chunk)[1]

    runs = jax.tree.leaves(states.iteration)[0].shape[0]
    return jax.device_get(jax.jit(jax.vmap(one))(states, jax.random.split(key, runs)))
