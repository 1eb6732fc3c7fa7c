"""The learned reward's credit at the decision that matters, on the tasks with a known one (:data:`DECISIONS`):
DelayedChain's choice (:mod:`_study.analysis.chain_credit`) and KeyToDoor's pick-up
(:mod:`_study.analysis.key_credit`), read through each signal's ``credit`` function; no method is named."""
from __future__ import annotations

import jax
import numpy as np

from coevo_jax.experiment.spec import chunk_length

from _study.analysis.chain_credit import choice_rewards, choice_scores, wrong_choice_share
from _study.analysis.final_policies import trainer_for
from _study.analysis.key_credit import key_pairs, key_rewards, key_scores, key_truth

#: env -> (the decision that matters, the control: the same pairs where the action has no effect)
DECISIONS = {"DelayedChain": ("choice", "last step"), "KeyToDoor-Distractor": ("pick-up", "key taken")}


def decision_scores(trainer, states) -> dict:
    """``{score: [R]}`` of stacked states' learned reward at the task's decision (``spearman``, ``top1``,
    ``gap``) and ``gap, <control>`` at the same pairs where the action has no effect (:data:`DECISIONS`)."""
    env, params = trainer.env.unwrapped, trainer.env_params
    control = f"gap, {DECISIONS[trainer.env.name][1]}"
    if trainer.env.name == "DelayedChain":
        k, outcome = env.num_choices, float(params.outcome_reward)
        last = (int(params.length) - 1) / int(params.length)  # the last step's elapsed fraction
        return {**choice_scores(choice_rewards(trainer, states), k, outcome),
                control: choice_scores(choice_rewards(trainer, states, last), k, outcome)["gap"],
                "p(wrong choice)": wrong_choice_share(trainer, states)}
    (_, _, toward, on_grid), truth = key_pairs(env, params), key_truth(env, params)
    return {**key_scores(key_rewards(trainer, states), toward, on_grid, truth),
            control: key_scores(key_rewards(trainer, states, key_taken=True), toward, on_grid, truth)["gap"]}


def credit_curves(result) -> dict:
    """``{arm: (env steps [S], {score: [R, S]})}`` of the arms with a learned reward of (state, action) (a
    signal with a ``credit`` function)."""
    study, out = result.study, {}
    for arm in study.arms:
        trainer = trainer_for(result, arm.name)
        if trainer.signal.credit is None:
            continue
        chunk = chunk_length(arm.static.num_iterations, study.num_chunks)
        snapshots = range(1, arm.static.num_iterations // chunk + 1)
        states = jax.tree.map(lambda *x: np.concatenate(x), *[result.chunk_states(arm.name, c) for c in snapshots])
        scores = decision_scores(trainer, states)
        steps = np.array([c * chunk * arm.static.steps_per_iteration for c in snapshots], np.float64)
        out[arm.name] = (steps, {k: v.reshape(len(snapshots), -1).T for k, v in scores.items()})
    return out
