#!/usr/bin/env python
"""What SIOP adds beyond PPO's own critic: SIOP against sparse PPO and the
siop-critic control in settings where the critic lags, and a potential of the
outcome against one of the return.

Potential-based shaping leaves every advantage unchanged when the critic is
exact, so SIOP can only help through the critic's errors. The reading under
test: SIOP sits at PPO's level where the critic is good and beats PPO where the
critic lags while the potential does not. Every setting is fixed in advance and
changes both arms alike (a potential-only setting changes SIOP alone and is
compared with PPO's default):

* ``default``: the task's settings;
* ``td0``: TD(0) advantages, ``gae_lambda = 0`` (the critic's bootstrap errors
  reach the advantages in full);
* ``1-epoch``: one PPO epoch per iteration instead of 4 (the critic trains a
  quarter as much; so does the policy);
* ``potential-heavy``: SIOP's potential takes 16 Adam steps per refit instead of
  4, on a replay of 256 episodes instead of 64 (much more training than the
  critic's);
* ``td0+potential-heavy``: both.

Arms per setting: ``ppo``, ``siop`` and ``siop-critic`` (PPO's own value head
as the potential). Two studies (``--regime-tasks``): the main job's task
(``doorkey5-t60-16k``, at the values ``sweeps/tune.py`` recorded for each
method) and the Booking-Turns dialogue (``sweeps/turn_learning.py``'s policy
and budget). The verdict rule, fixed in advance, on P(siop > ppo in the same
setting) over final success with its 95% CI (rliable, paired seeds):
**holds** if some critic-lag setting has the CI's lower end above 0.5;
**does not hold** if no critic-lag setting has P above 0.5; **mixed**
otherwise. The critic's explained variance and SIOP's diagnostics
(potential-critic correlation, held-out return fit) are reported per setting,
so a reader can see whether the critic did lag.

The outcome study (``--outcome-tasks``, the positive controls): ``siop``
fitting the episode's whole return (``potential_outcome = 0``) against
``siop-outcome`` fitting only the final reward (``potential_outcome = 1``),
beside ``ppo``, ``siop-critic`` and the dense oracle, at each task's tuned
values, where distractor rewards make the two targets differ. Its verdict, fixed
in advance, on P(siop-outcome > siop) over final success with its 95% CI: **the
outcome is better** if the CI's lower end is above 0.5, **the return is better**
if its upper end is below 0.5, **no difference** otherwise.

    python sweeps/siop_vs_critic.py                              # 20 paired seeds, both parts
    python sweeps/siop_vs_critic.py --outcome-tasks '' --num-seeds 8
    python sweeps/siop_vs_critic.py --publish docs/results

Outputs (``--out``, default ``results/siop_vs_critic``): one study folder per
task with ``regime.md`` / ``outcome.md`` and ``diagnostics_<study>.png`` (the
diagnostics over training per setting).
"""
from __future__ import annotations

import os
import sys

import numpy as np

from coevo_jax.config import ConfigError, static_config
from coevo_jax.experiment import Arm, Study

from _study import cli, options
from _study.admitted import add_admitted_option, load_admitted
from _study.analysis.tables import arm_finals, ci, definitions, study_rows, write_table
from _study.random_policy import random_row

HERE = os.path.dirname(os.path.abspath(__file__))
#: setting -> (HParams overrides, StaticConfig overrides, whether it changes PPO's critic)
SETTINGS = {
    "default": ({}, {}, True),
    "td0": ({"gae_lambda": 0.0}, {}, True),
    "1-epoch": ({}, {"update_epochs": 1}, True),
    "potential-heavy": ({}, {"potential_steps": 16, "potential_buffer_episodes": 256}, False),
    "td0+potential-heavy": ({"gae_lambda": 0.0}, {"potential_steps": 16, "potential_buffer_episodes": 256}, True),
}
LAG_SETTINGS = tuple(s for s in SETTINGS if s != "default")
POTENTIAL_ONLY = ("potential_steps", "potential_buffer_episodes")
#: the dialogue: sweeps/turn_learning.py's policy, rollout and budget for Booking-Turns
DIALOGUE = "Booking-Turns"
DIALOGUE_STATIC = dict(network="bag", action_head="utterance", num_envs=16, rollout_len=32, num_minibatches=4,
                       update_epochs=4, d_model=64, hidden_sizes=(64, 64), total_steps=32_768)
DIALOGUE_HP = {"lr": 1e-3, "ent_coef": 0.01}
DIAGNOSTICS = ("value_explained_variance", "signal/potential_critic_corr", "signal/potential_heldout_corr")
THRESHOLD = 0.8  # success rate, fixed in advance


def build_parser():
    p = cli.study_parser("siop_vs_critic.py", __doc__.split("\n\n")[0], os.path.join("results", "siop_vs_critic"))
    p.add_argument("--regime-tasks", default=f"doorkey5-t60-16k,{DIALOGUE}",
                   help=f"comma list of admitted tasks and/or {DIALOGUE} for the regime test"
                        f" (default: doorkey5-t60-16k,{DIALOGUE}; '' for none)")
    p.add_argument("--outcome-tasks", default="keytodoor-a1,chain-l16-n05",
                   help="comma list of admitted tasks for the outcome-or-return test"
                        " (default: keytodoor-a1,chain-l16-n05; '' for none)")
    p.add_argument("--settings", default=",".join(SETTINGS), help=f"regime settings (default: {','.join(SETTINGS)})")
    add_admitted_option(p, os.path.join(HERE, "admitted_tasks.json"))
    options.add_study_options(p, 20, THRESHOLD)
    return p


def regime_arms(make_arm, settings) -> list:
    """Per setting ``ppo``, ``siop`` and ``siop-critic`` labelled ``<method>@<setting>``; a setting that
    changes only the potential gets its ``siop`` arm alone (PPO's and siop-critic's are the default's).
    ``make_arm(method, label, hp, static) -> Arm``."""
    arms = []
    for s in settings:
        hp, static, critic = SETTINGS[s]
        for m in ("ppo", "siop", "siop-critic") if critic else ("siop",):
            st = static if m == "siop" else {k: v for k, v in static.items() if k not in POTENTIAL_ONLY}
            arms.append(make_arm(m, f"{m}@{s}", hp, st))
    return arms


def studies(args) -> list:
    admitted = load_admitted(args.admitted)
    regime = options.names(args.regime_tasks, "--regime-tasks", [*admitted, DIALOGUE]) if args.regime_tasks else []
    outcome = options.names(args.outcome_tasks, "--outcome-tasks", list(admitted)) if args.outcome_tasks else []
    settings = options.names(args.settings, "--settings", list(SETTINGS))
    if "default" not in settings:
        raise ConfigError("--settings must include 'default' (the potential-only settings compare with its ppo arm)")
    if not regime and not outcome:
        raise ConfigError("nothing to run: --regime-tasks and --outcome-tasks are both empty")
    common = dict(num_seeds=args.num_seeds, base_seed=args.seed, num_chunks=args.num_chunks, threshold=args.threshold)
    out = []
    for name in regime:
        if name == DIALOGUE:
            def make_arm(m, label, hp, st):
                return Arm(static_config(m, **{**DIALOGUE_STATIC, **st}), fixed={**DIALOGUE_HP, **hp},
                           label=label)
            out.append(Study(DIALOGUE, tuple(regime_arms(make_arm, settings)), name=f"regime-{DIALOGUE}", **common))
        else:
            task = admitted[name]
            arms = regime_arms(lambda m, label, hp, st: task.arm(m, label, hp, st), settings)
            out.append(Study(task.env, tuple(arms), env_kwargs=dict(task.env_kwargs), name=f"regime-{name}", **common))
    for name in outcome:
        task = admitted[name]
        arms = (task.arm("ppo"), task.arm("dense"), task.arm("siop"),
                task.arm("siop", "siop-outcome", {"potential_outcome": 1.0}, tuned_as="siop"), task.arm("siop-critic"))
        out.append(Study(task.env, arms, env_kwargs=dict(task.env_kwargs), name=f"outcome-{name}", **common))
    return out


def _mean_late(curves: np.ndarray) -> float:
    """Mean over runs of each run's mean over its last 25% of iterations (NaN-aware)."""
    n = curves.shape[1]
    late = curves[:, n - max(1, n // 4):]
    with np.errstate(all="ignore"):
        return float(np.nanmean(np.nanmean(late, axis=1)))


def regime_rows(res) -> tuple[list, str]:
    """``(rows, verdict)`` of a regime study (module docstring's rule)."""
    from coevo_jax.analysis import stats  # report extra (rliable, scipy): imported on use

    finals = arm_finals(res)
    summary = {r["arm"]: r for r in res.summary}
    settings = list(dict.fromkeys(a.name.split("@")[1] for a in res.study.arms))
    rows, lag_p = [], {}
    for s in settings:
        ref = f"ppo@{s}" if f"ppo@{s}" in finals else "ppo@default"
        for m in ("ppo", "siop", "siop-critic"):
            label = f"{m}@{s}"
            if label not in finals:
                continue
            idx = res.select(label)
            row = {"setting": s, "method": m, "seeds": summary[label]["n_seeds"],
                   "final success IQM [95% CI]": ci(summary[label], "final_success")}
            if m == "ppo":
                row["P(> ppo, same setting) [95% CI]"] = "-"
            else:
                poi = stats.probability_of_improvement(finals[label], finals[ref])
                row["P(> ppo, same setting) [95% CI]"] = stats.improvement_text(poi)
                if m == "siop" and s in LAG_SETTINGS:
                    lag_p[s] = poi
            for d in DIAGNOSTICS:
                row[f"{d} (last 25%)"] = (f"{_mean_late(res.curves[d][idx]):.3f}" if d in res.curves
                                          and np.isfinite(res.curves[d][idx]).any() else "-")
            rows.append(row)
    detail = ", ".join(f"{s}: {stats.improvement_text(p)}" for s, p in lag_p.items())
    return rows, f"**verdict: {verdict(lag_p)}** (P(siop > ppo) in the critic-lag settings: {detail or 'none run'})"


def verdict(lag_p: dict) -> str:
    """The rule fixed in advance (module docstring) on ``{setting: P(siop > ppo) dict}`` of the
    critic-lag settings: "holds", "does not hold" or "mixed"."""
    if any(p["ci_low"] > 0.5 for p in lag_p.values()):
        return "holds"
    if not any(p["p"] > 0.5 for p in lag_p.values()):
        return "does not hold"
    return "mixed"


def outcome_verdict(finals: dict) -> str:
    """The outcome study's verdict line (module docstring's rule) from ``{arm: final success [R]}``."""
    from coevo_jax.analysis import stats  # report extra (rliable, scipy): imported on use

    if "siop" not in finals or "siop-outcome" not in finals:
        return "**verdict: not measured** (the study lacks siop or siop-outcome)"
    poi = stats.probability_of_improvement(finals["siop-outcome"], finals["siop"])
    word = ("the outcome is better" if poi["ci_low"] > 0.5 else "the return is better" if poi["ci_high"] < 0.5
            else "no difference")
    return f"**verdict: {word}** (P(siop-outcome > siop) = {stats.improvement_text(poi)})"


def diagnostics_figure(res, out: str) -> str:
    """``out/diagnostics_<study>.png``: rows = method, columns = success and the diagnostics, lines = settings."""
    from coevo_jax.analysis.plots import plot_diagnostics  # report extra (matplotlib): imported on use

    rows = {}
    for m in ("ppo", "siop", "siop-critic"):
        for metric in ("success_rate",) + DIAGNOSTICS:
            lines = {}
            for a in res.study.arms:
                meth, s = a.name.split("@")
                idx = res.select(a.name)
                if meth == m and metric in res.curves and np.isfinite(res.curves[metric][idx]).any():
                    lines[s] = (res.curves["env_steps"][idx[0]], res.curves[metric][idx])
            rows.setdefault(m, {})[metric] = lines
    return plot_diagnostics(rows, os.path.join(out, f"diagnostics_{res.study.name}.png"),
                            title=f"{res.study.name}: per setting (mean over seeds, 95% bands)")


def report(args, results) -> str:
    from coevo_jax.analysis import stats  # report extra (rliable, scipy): imported on use

    texts = []
    for res in results:
        if res.study.name.startswith("regime-"):
            rows, line = regime_rows(res)
            fig = diagnostics_figure(res, res.out)  # in the study folder: --publish copies its figures
            rnd = random_row(res.study)
            header = (f"## Regime test on {res.study.name[len('regime-'):]} ({res.study.env})\n{definitions(res.study)}"
                      f" Uniform-random final success: {rnd.get('final_success_iqm', float('nan')):.3g}. Diagnostics:"
                      " mean over seeds of each run's mean over its last 25% of iterations.\n\n" + line)
            table = write_table(os.path.join(res.out, "regime.md"), rows, header)
            texts.append(f"{header}\n\n{table}\ndiagnostics over training: {fig}")
        else:
            finals = arm_finals(res)

            def extra(r, finals=finals):
                if r["arm"] == "ppo" or r["arm"] not in finals or "ppo" not in finals:
                    return {"P(> ppo) [95% CI]": "-"}
                return {"P(> ppo) [95% CI]": stats.improvement_cell(finals[r["arm"]], finals["ppo"])}

            title = f"## Outcome or return on {res.study.name[len('outcome-'):]} ({res.study.env})"
            header = f"{title}\n{definitions(res.study)}\n\n{outcome_verdict(finals)}"
            table = write_table(os.path.join(res.out, "outcome.md"), study_rows(res, extra=extra), header)
            texts.append(f"{header}\n\n{table}")
    return "\n\n".join(texts)


def main(argv=None) -> int:
    return cli.main(build_parser(), studies, report, argv)


if __name__ == "__main__":
    sys.exit(main())
