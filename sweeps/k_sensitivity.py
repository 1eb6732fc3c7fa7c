#!/usr/bin/env python
"""K sensitivity: how the update period K of the internal reward / potential
changes learning (the project's main job; run it first).

Sweeps ``hp.signal.k`` -- the iterations between two refits of the learned internal
reward R_phi (co-evolution by regression, as in RUDDER's return decomposition,
Arjona-Medina et al. 2019; or by pairwise ranking, Christiano et al. 2017) or
of the self-induced outcome potential (SIOP) -- with sparse PPO, PPO on the
hand-designed dense reward and ``siop-critic`` (SIOP's credit with PPO's own critic as the
potential: what SIOP adds beyond the critic) as reference lines and the uniform-random policy as
the floor, on a task calibration admitted (``sweeps/admitted_tasks.json``: random
success <= 0.2, room above sparse PPO, the dense oracle beats PPO), with the
hyperparameters tuned there for each method (``sweeps/tune.py``; a method without
its own runs at ppo's lr / entropy coefficient).

Every method runs at the task's own settings (``AdmittedTask.static``: the sizes,
buffers and refit steps ``sweeps/tune.py`` tuned it at). **Compute-matched** by
default (``refit_steps_per_k``, R_phi's and siop's static option), anchored at the method's tuned K
(``k_ref``, its default 4 unless tuned): a refit at K takes ``reward_steps x K /
k_ref`` (``potential_steps x K / k_ref``) gradient steps, so R_phi and the potential
get the same gradient steps per env step at every K, K measures only *how stale*
the reward is, not how much it was trained, and the row at ``K = k_ref`` is the
tuning's own setting (it repeats the tuning's evaluation on the same seeds). A refit
whose buffer holds no complete episode yet (``hp.signal.min_refit_episodes``, 1) takes
no step, so the steps a run actually took differ between K (the refit due at
iteration 0 is skipped on most seeds, half the refits at K = 64): the table's
``refit steps`` column is their mean over seeds (the run's cumulative
``refit_steps`` metric). R_phi's buffer and the potential's replay keep every
step of an episode (their length is the task's time limit). SIOP is
crossed with normalisation (``siop``: raw credit, ``siop-norm``: divided by a
running RMS of its return, at siop's tuned ``beta_int`` or, with
``--norm-beta-int B1,B2``, one line per weight); the table's ``credit weight``
is what multiplies the raw potential difference in the policy's reward.

All runs go through the one runner (:mod:`coevo_jax.experiment`); metrics are
defined in :mod:`coevo_jax.analysis.metrics`, statistics are rliable's IQMs
with 95% stratified-bootstrap CIs.

    python sweeps/k_sensitivity.py                       # the defaults (>= 300 runs)
    python sweeps/k_sensitivity.py --k 1,4,16 --num-seeds 8 --task doorkey8-t100
    python sweeps/k_sensitivity.py --env FourRooms         # any env, the default task's shape

Outputs (``--out``, default ``results/k_sensitivity``): ``summary.csv``,
``k_table.md``, ``k_sensitivity.png`` (final success vs K with CI bands and
reference lines), ``k_diagnostics.png`` (external return, predicted cumulative
internal reward on held-out episodes, internal-reward variance for the
smallest, middle and largest K), ``learning_curves.png``, ``curves.npz``,
``config.json``. Rerunning the same command resumes an interrupted run.
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys

import numpy as np

from coevo_jax.analysis import metrics
from coevo_jax.config import ConfigError, StaticConfig, default_hparams
from coevo_jax.experiment import Arm, Study

from _study import cli, options
from _study.admitted import add_admitted_option, chosen_task, load_admitted
from _study.analysis.tables import write_table
from _study.random_policy import random_row, random_scores

SWEPT_METHODS = ("coevo-regression", "coevo-ranking", "siop")
REFERENCE_METHODS = ("ppo", "dense", "siop-critic")  # not swept (siop-critic has no refit: its potential is the critic)
# crossed with normalisation: a second line with the credit divided by a running RMS of its return
# (hp.signal.normalize_int = 1; siop's default is 0; R_phi's decomposition is never normalised, so only siop has one)
NORMALISED = {"siop": "siop-norm"}
DEFAULT_KS = (1, 4, 16, 64)
MIN_RUNS = 300
MIN_SEEDS = 20  # per setting: the paired seeds every table of the benchmark reports at least
# an admitted task (sweeps/calibrate.py) whose budget and rollout shape fit >= 300 runs in <= 10 minutes on 2 CPU
# cores: 128 iterations of 8 envs x 16 steps (so even K = 64 refits twice), 2 x 2 PPO passes
DEFAULT_TASK = "doorkey5-t60-16k"
HERE = os.path.dirname(os.path.abspath(__file__))
THRESHOLD = 0.8  # success rate that steps-to-threshold waits for, fixed in advance


def build_parser():
    p = cli.study_parser("k_sensitivity.py", __doc__.split("\n\n")[0], os.path.join("results", "k_sensitivity"))
    p.add_argument("--k", default=",".join(map(str, DEFAULT_KS)), metavar="K1,K2,...",
                   help=f"update periods to sweep, integers >= 1 (default: {','.join(map(str, DEFAULT_KS))})")
    p.add_argument("--methods", default=",".join(SWEPT_METHODS + REFERENCE_METHODS), metavar="M1,M2,...",
                   help="methods; ppo, dense and siop-critic are reference lines, the rest are swept over K"
                        f" (default: {','.join(SWEPT_METHODS + REFERENCE_METHODS)})")
    p.add_argument("--task", default=DEFAULT_TASK,
                   help="an admitted task of --admitted: its env, time limit, budget, rollout shape and tuned lr /"
                        f" ent_coef (default: {DEFAULT_TASK})")
    p.add_argument("--env", default=None,
                   help="instead of --task: any registered environment, with the default task's budget and shape"
                        " and the library's default hyperparameters (default: none)")
    add_admitted_option(p, os.path.join(HERE, "admitted_tasks.json"))
    p.add_argument("--not-compute-matched", action="store_true",
                   help="every refit takes the same steps whatever K (default: compute-matched, a refit takes"
                        " reward_steps x K / potential_steps x K steps)")
    p.add_argument("--no-normalised", action="store_true",
                   help=f"leave out the normalised lines ({', '.join(NORMALISED.values())}) (default: run them)")
    p.add_argument("--norm-beta-int", default=None, metavar="B1,B2,...",
                   help="one normalised line per beta_int value, labelled siop-norm@beta_int=B (default: one line at"
                        " the method's tuned value, which was tuned for the raw credit)")
    p.add_argument("--num-seeds", type=int, default=None, metavar="N",
                   help=f"seeds per setting, >= 1 (default: {MIN_SEEDS}, more if needed for {MIN_RUNS} runs in all)")
    p.add_argument("--total-steps", type=int, default=None, metavar="S",
                   help="env steps per run, at least one iteration (default: the task's budget)")
    options.add_study_options(p, None, THRESHOLD)
    return p


def parse_ks(text: str) -> tuple:
    """``"1,2,4"`` -> ``(1, 2, 4)``; :class:`ConfigError` for anything but distinct integers >= 1."""
    try:
        ks = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"--k={text!r} must be a comma list of integers >= 1") from None
    if not ks:
        raise ConfigError("--k needs at least one value")
    if min(ks) < 1:
        raise ConfigError(f"--k: K={min(ks)} is not allowed; K must be an integer >= 1 (HParams.k range [1, 1000000])")
    if len(set(ks)) != len(ks):
        raise ConfigError(f"--k={text!r} repeats a value")
    return tuple(sorted(ks))


def normalised_lines(label: str, text: str | None) -> list[tuple[str, dict]]:
    """``[(label, HParams overrides)]`` of the normalised lines: one at the tuned values when
    ``text`` is None, else one per ``beta_int`` of the comma list (each >= 0)."""
    if text is None:
        return [(label, {})]
    try:
        betas = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        betas = []
    if not betas or min(betas) < 0:
        raise ConfigError(f"--norm-beta-int={text!r} must be a comma list of numbers >= 0")
    return [(f"{label}@beta_int={b:g}", {"beta_int": b}) for b in betas]


def static_for(method: str, task, total_steps: int, matched: bool) -> StaticConfig:
    """The task's own StaticConfig for ``method`` (what ``sweeps/tune.py`` tuned it at); ``matched``:
    compute-matched refits anchored at the method's tuned K, ``k_ref``: a refit at K takes ``steps x K /
    k_ref`` gradient steps (``steps``: the task's ``reward_steps`` / ``potential_steps``), so the row at
    K = ``k_ref`` runs exactly the tuning's settings (a method without ``refit_steps_per_k`` has no refit to
    match). :class:`ConfigError` when ``k_ref`` does not divide them."""
    static = task.static(method, total_steps=total_steps)
    fields = static.as_dict()
    if not matched or "refit_steps_per_k" not in fields:
        return static
    k_ref = int(task.hparams(method).get("k", float(default_hparams(method).signal.k)))
    steps = {f: fields[f] for f in ("reward_steps", "potential_steps") if f in fields}
    if any(v % k_ref for v in steps.values()):
        raise ConfigError(f"{task.task}: {method}'s K = {k_ref} must divide reward_steps and potential_steps"
                          f" ({steps}) for compute-matched refits anchored at it")
    return static.replace(refit_steps_per_k=True, **{f: v // k_ref for f, v in steps.items()})


def studies(args) -> list:
    ks = parse_ks(args.k)
    methods = options.names(args.methods, "--methods")
    task, _ = chosen_task(args)
    if args.env is not None:  # any env, the task's shape, library defaults (no tuned values carried over)
        task = dataclasses.replace(task, task=args.env, env=args.env, env_kwargs={}, tuned={"ppo": {}, "dense": {}})
    per_iteration = task.num_envs * task.rollout_len
    total_steps = task.total_steps if args.total_steps is None else args.total_steps
    if total_steps < per_iteration:
        raise ConfigError(f"--total-steps={total_steps} must be >= {per_iteration} (one iteration)")
    matched = not args.not_compute_matched
    arms = []
    for m in methods:  # the reference methods are not swept
        static = static_for(m, task, total_steps, matched and m not in REFERENCE_METHODS)
        tuned = {f: v for f, v in task.hparams(m).items() if f != "k"}  # each method's tuned values; K is swept
        arms.append(Arm(static, {} if m in REFERENCE_METHODS else {"k": ks}, fixed=tuned))
        if m in NORMALISED and not args.no_normalised:
            for label, beta in normalised_lines(NORMALISED[m], args.norm_beta_int):
                arms.append(Arm(static, {"k": ks}, fixed={**tuned, "normalize_int": 1.0, **beta}, label=label))
    arms = tuple(arms)
    settings = sum(1 if not a.grid else len(ks) for a in arms)
    num_seeds = args.num_seeds if args.num_seeds is not None else max(MIN_SEEDS, math.ceil(MIN_RUNS / settings))
    return [Study(task.env, arms, num_seeds, env_kwargs=dict(task.env_kwargs), base_seed=args.seed,
                  num_chunks=args.num_chunks, threshold=args.threshold, name=task.task)]


def _signal_metric(names, *needles):
    """The first ``signal/...`` metric whose name contains a needle (in needle order), or None."""
    return next((n for needle in needles for n in sorted(names) if n.startswith("signal/") and needle in n), None)


def k_plots(result, ks, random_final) -> None:
    """``k_sensitivity.png`` and ``k_diagnostics.png`` in the results folder (``random_final``:
    the uniform-random policy's per-seed final success, a reference line)."""
    from coevo_jax.analysis import plots  # report extra (matplotlib): imported on use

    runs, curves, out = result.runs, result.curves, result.out
    labels = [a.name for a in result.study.arms]
    swept = [lab for lab in labels if lab not in REFERENCE_METHODS]
    refs = {lab: result.scores(lab)["final_success"] for lab in labels if lab in REFERENCE_METHODS}
    refs["uniform random"] = random_final
    lines = {lab: [result.scores(lab, k=k)["final_success"] for k in ks] for lab in swept}
    plots.plot_metric_vs_hparam(list(ks), lines, os.path.join(out, "k_sensitivity.png"), references=refs,
                                xlabel="K (iterations between refits)", ylabel="final success",
                                logx=len(ks) > 1 and max(ks) / min(ks) >= 4,
                                title=f"{result.study.name}: final success vs K (episodes of the last 10% of steps)")
    shown = sorted({ks[0], ks[len(ks) // 2], ks[-1]})
    rows, notes = {}, {}
    for lab in swept:
        mask = runs["label"] == lab
        names = [n for n in curves if np.isfinite(curves[n][mask]).any()]
        cols = {"external return": "episode_return", "predicted cumulative internal reward": _signal_metric(
            names, "pred"), "internal-reward variance": _signal_metric(names, "r_int_var", "credit_var", "var")}
        rows[lab] = {}
        for title, metric in cols.items():
            notes[(lab, title)] = metric or "not reported by this method"
            rows[lab][title] = {} if metric is None else {
                f"K={k}": (curves["env_steps"][result.select(lab, k=k)[0]], curves[metric][result.select(lab, k=k)])
                for k in shown}
    if swept:
        plots.plot_diagnostics(rows, os.path.join(out, "k_diagnostics.png"), stat="mean", notes=notes,
                               title=f"{result.study.env}: smallest, middle and largest K (mean, 95% bands)")


def report(args, results) -> str:
    from coevo_jax.analysis import stats  # report extra (rliable, scipy): imported on use

    result = results[0]
    ppo_final = result.scores("ppo")["final_success"] if any(a.name == "ppo" for a in result.study.arms) else None
    random = random_scores(result.study)
    ks = tuple(sorted({int(k) for a in result.study.arms for k in a.grid.get("k", ())}))
    if ks:  # (only reference lines, e.g. --methods ppo,dense: nothing varies with K)
        k_plots(result, ks, random["final_success"])
    rows = []
    for r in [random_row(result.study, scores=random)] + result.summary:
        swept = r["arm"] not in REFERENCE_METHODS + ("random",)
        idx = result.select(r["arm"], **({"k": r["k"]} if swept else {}))  # no runs for the random row
        osc = metrics.oscillation(result.curves["episode_return"][idx])
        refits = np.nanmax(result.curves["refit_steps"][idx], axis=1) if swept and len(idx) else np.array([np.nan])
        rows.append({"method": r["arm"], "K": int(r["k"]) if swept else "-", "seeds": r["n_seeds"],
                     "refit steps": float(np.nanmean(refits)) if swept else "-",
                     "diverged": r["n_diverged"], "success IQM": r["final_success_iqm"],
                     "95% CI": f"[{r['final_success_ci_low']:.3f}, {r['final_success_ci_high']:.3f}]",
                     "return IQM": r["final_return_iqm"], "AUC success": r["auc_success_iqm"],
                     f"steps to {result.study.threshold:g} (median)": r["steps_to_threshold_median"],
                     "reached": r["reached_fraction"],
                     "oscillation": float(np.nanmean(osc)) if len(idx) else float("nan"),
                     "credit weight": credit_weight(result, idx) if swept else "-",
                     "P(> ppo) [95% CI]": _p_over(stats, result, r, swept, ppo_final)})
    table = write_table(os.path.join(result.out, "k_table.md"), rows)
    matched = any(a.static.as_dict().get("refit_steps_per_k") for a in result.study.arms)
    return (f"\nK sensitivity on {result.study.name} ({result.study.env},"
            f" {'compute-matched: steps per refit x K' if matched else 'fixed steps per refit'}):"
            " final = episodes finished in the last 10% of env steps; IQM and"
            f" 95% stratified-bootstrap CI over seeds (rliable); steps to success {result.study.threshold:g}"
            f" (resolution {result.summary[0]['steps_resolution']} env steps); oscillation = variance of"
            " the return curve over the last 25% of iterations; credit weight = what multiplies the raw"
            " potential difference gamma Phi(s') - Phi(s) in the policy's reward: beta_int, divided by the credit's"
            " running return RMS on the normalised lines (mean over seeds of the last 25% of iterations)\n" + table
            + withdrawn_note(args, result.study.name))


def withdrawn_note(args, task: str) -> str:
    """A line saying the table cannot rank methods when ``task`` fails the admission rule at its tuned
    values (``withdrawn`` in ``--admitted``); ``""`` otherwise (or for ``--env``)."""
    admitted = load_admitted(args.admitted)
    why = admitted[task].withdrawn if task in admitted and args.env is None else ""
    return (f"\n\n**{task} is withdrawn** ({why}): at the tuned values it fails the admission rule of"
            " sweeps/calibrate.py, so this table cannot rank the methods." if why else "")


def credit_weight(result, idx) -> float | str:
    """SIOP's effective credit weight over the last 25% of iterations (``beta_int``, over
    the running RMS of the credit's return when normalised), mean over the runs ``idx``; "-" without a credit."""
    curves = result.curves.get("signal/credit_return_rms")
    if curves is None or not len(idx) or not np.isfinite(curves[idx]).any():
        return "-"
    beta, norm = result.runs["hp/beta_int"][idx], result.runs["hp/normalize_int"][idx]
    late = curves[idx, 3 * curves.shape[1] // 4:]
    scale = np.where(norm > 0, 1.0 / np.nanmean(late, axis=1), 1.0)
    return float(np.mean(beta * scale))


def _p_over(stats, result, row, swept: bool, ppo_final) -> str:
    """rliable's probability that the row's final success beats ppo's (paired seeds), with its 95% CI."""
    if ppo_final is None or row["arm"] in ("ppo", "random"):
        return "-"
    return stats.improvement_cell(result.scores(row["arm"], **({"k": row["k"]} if swept else {}))["final_success"],
                                  ppo_final)


def main(argv=None) -> int:
    return cli.main(build_parser(), studies, report, argv)


if __name__ == "__main__":
    sys.exit(main())
