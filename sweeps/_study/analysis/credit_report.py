"""How good is a trained SIOP potential's credit? Measured on the final policies of a study.

:func:`siop_credit_report` takes a finished study run with
``Study(save_final=True)``, rolls out every run's final policy, computes SIOP's
per-step credit ``gamma Phi(s') - Phi(s)`` on those trajectories with the
run's own potential and, on KeyDoor, its Spearman rank correlation with the
true optimal advantage ``A*`` (breadth-first-search ground truth) over the
policy's own steps. For run 0 it also draws the potential over every agent
position of one fixed layout and the credit of one complete episode.
"""
from __future__ import annotations

import os

import jax
import numpy as np

from coevo_jax.signals.potential import potential_values, trajectory_credit
from envs_jax.grid.ground_truth import keydoor_optimal_advantages
from envs_jax.grid.keydoor import KeyDoor

from _study.analysis.credit import complete_episode, credit_correlation, plot_episode_credit, potential_heatmap
from _study.analysis.final_policies import final_rollouts, run_state, trainer_for


def _credit(static, signal_state, traj, hp):
    return trajectory_credit(static, signal_state, traj, hp)[0]


def credit_spearman(trainer, credit: np.ndarray, traj) -> np.ndarray:
    """Per run: Spearman correlation of ``credit [R, T, N]`` with the optimal advantage
    of the steps of ``traj`` (leaves ``[R, T, N, ...]``) on KeyDoor. ``[R]``."""
    env, max_steps = trainer.env.unwrapped, int(trainer.env_params.max_steps_in_episode)
    return np.array([credit_correlation(credit[r], traj.obs[r], traj.next_obs[r], traj.terminated[r], env.size,
                                        max_steps) for r in range(credit.shape[0])], np.float64)


def siop_credit_report(result, label: str = "siop", key=None, out: str | None = None, run: int = 0) -> dict:
    """Credit diagnostics of arm ``label``'s final potentials. Returns ``{"spearman": [R]
    (empty off KeyDoor), "figures": [paths]}``; the figures (``potential_<env>.png``,
    ``credit_<env>.png``, of run ``run``) go to ``out`` (default: the study folder)."""
    key = jax.random.PRNGKey(99) if key is None else key
    out, env_name = out or result.out, result.study.env
    trainer = trainer_for(result, label)
    static, env = trainer.static, trainer.env.unwrapped
    keydoor = isinstance(env, KeyDoor)
    states, hp = result.final_states(label), result.hparams(label)
    traj = final_rollouts(trainer, states, key, static.rollout_len)
    credit = np.asarray(jax.jit(jax.vmap(lambda s, t, h: _credit(static, s, t, h)))(states.signal_state, traj, hp))
    spearman = credit_spearman(trainer, credit, traj) if keydoor else np.zeros(0)

    sig, hp_r = run_state(states.signal_state, run), run_state(hp, run)
    _, layout = env.reset(jax.random.PRNGKey(123), trainer.env_params)
    figures = [os.path.join(out, f"potential_{env_name}.png")]
    potential_heatmap(jax.jit(lambda o: potential_values(static, sig, o)), env, layout, figures[0],
                      title=f"SIOP potential V(s), {env_name}, run {run} (final)")
    # one complete episode of run `run`: a rollout of 2 T + 1 steps holds at least one
    max_steps = int(trainer.env_params.max_steps_in_episode)
    one = jax.tree.map(lambda x: x[run:run + 1], states)
    long = run_state(final_rollouts(trainer, one, jax.random.fold_in(key, 1), 2 * max_steps + 1), 0)
    c = np.asarray(jax.jit(_credit, static_argnums=0)(static, sig, long, hp_r))
    ep = complete_episode(long.terminated | long.truncated)
    if ep is not None:
        n, a, b = ep
        adv = keydoor_optimal_advantages(long.obs[a:b + 1, n], long.next_obs[a:b + 1, n], long.terminated[a:b + 1, n],
                                         env.size, max_steps) if keydoor else None
        figures.append(os.path.join(out, f"credit_{env_name}.png"))
        plot_episode_credit(c[a:b + 1, n], figures[-1], reward=long.reward[a:b + 1, n], optimal_adv=adv,
                            title=f"SIOP credit of one episode ({'success' if long.terminated[b, n] else 'time-out'}),"
                                  f" {env_name}, run {run}, final policy")
    return {"spearman": spearman, "figures": figures}


def median_iqr(x: np.ndarray) -> str:
    """``"median [q1, q3]"`` of the finite entries of ``x`` (``"-"`` if none)."""
    x = np.asarray(x, np.float64)
    x = x[np.isfinite(x)]
    if not len(x):
        return "-"
    q1, med, q3 = np.percentile(x, [25, 50, 75])
    return f"{med:.3f} [{q1:.3f}, {q3:.3f}]"
