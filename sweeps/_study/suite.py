"""A suite of credit-assignment tasks, one configuration per method across it (the generalist protocol:
Patterson et al. 2024, "Empirical design in reinforcement learning"; bsuite, Osband et al. 2020).

A task (:class:`SuiteTask`, one entry of ``sweeps/suite.json``) is an env and its keyword arguments, the
rollout shape, the budget, the StaticConfig overrides (the policy network among them), the score it is
judged by (``episode_return`` or ``success_rate``: the final score, episodes of the last 10% of env
steps) and the random and optimum scores that normalise it: ``(x - random) / (optimum - random)``,
0 for the uniform policy, 1 for the best policy.

The protocol (:mod:`_study.tuning` across tasks): a configuration's score is its **mean normalised score
over the suite's tasks** (:func:`suite_score`; per task the mean over its seeds of the normalised AUC of
the score in stage 1 and 2, a run without a finished episode counting as random); stage 1 screens
``>= 32`` quasi-random configurations on 1 seed per task, stage 2 re-runs the best ``>= 4`` on ``>= 3``
fresh seeds per task and picks there, with P(pick > runner-up) over tasks and runs; the evaluation runs
each pick on fresh paired seeds. Statistics over tasks come from rliable (stratified bootstrap over runs
within tasks: :func:`aggregate`, :func:`improvement`).
"""
from __future__ import annotations

import ast
import csv
import dataclasses
import functools
import hashlib
import json
import os
from typing import Mapping

import numpy as np
from rliable import library as rly
from rliable import metrics as rlm

from coevo_jax.analysis.metrics import auc, final_score
from coevo_jax.analysis import stats
from coevo_jax.config import ConfigError

from _study.admitted import method_static

METRICS = ("episode_return", "success_rate")
ADMIT_LOW, ADMIT_HIGH = 0.1, 0.8  # admitted: the best tuned PPO's normalised IQM >= the random row's + 0.1, <= 0.8
ADMISSION = (f"the best tuned ppo arm's normalised IQM at least {ADMIT_LOW} above the random row's (the uniform policy"
             f" measured on the evaluation's seeds) and at most {ADMIT_HIGH}")
ALPHA = 0.05
RULE = ("a method wins on the suite only if, over tasks and runs (rliable, stratified bootstrap), P(method > tuned"
        " ppo), P(> tuned ppo-lambda1) and P(> each tuned control of the suite) all have the lower ends of their 95%"
        f" CIs above 0.5, under Holm over the suite's methods (a method's p-value is the largest of its one-sided"
        f" bootstrap p-values; Holm at one-sided family-wise level {ALPHA / 2:g}); scores are the normalised final"
        " scores of the admitted tasks")


@dataclasses.dataclass(frozen=True)
class SuiteTask:
    name: str
    env: str
    env_kwargs: Mapping[str, object]
    total_steps: int
    num_envs: int
    rollout_len: int
    metric: str  # "episode_return" or "success_rate"
    random: float  # the uniform policy's final score (normalised to 0)
    optimum: float  # the best policy's expected final score (normalised to 1)
    source: str  # where the task comes from (bsuite, xminigrid, coevo-jax)
    static_overrides: Mapping[str, object] = dataclasses.field(default_factory=dict)
    num_minibatches: int = 4
    update_epochs: int = 4
    why: str = ""  # the axis it tests (delay, noise, memory)

    def static(self, method: str, **fields):
        """``method``'s StaticConfig on this task (:func:`_study.admitted.method_static`)."""
        shape = dict(num_envs=self.num_envs, rollout_len=self.rollout_len, num_minibatches=self.num_minibatches,
                     update_epochs=self.update_epochs, total_steps=self.total_steps)
        return method_static(method, {**shape, **self.static_overrides}, **fields)

    def normalise(self, x):
        """``(x - random) / (optimum - random)``, NaN (no finished episode) as random's 0."""
        x = (np.asarray(x, np.float64) - self.random) / (self.optimum - self.random)
        return np.where(np.isfinite(x), x, 0.0)

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "env_kwargs": dict(self.env_kwargs),
                "static_overrides": dict(self.static_overrides)}


def load_suite(path: str) -> dict[str, SuiteTask]:
    """``{name: SuiteTask}`` of the suite file, in order; :class:`ConfigError` naming the task and field
    of an invalid entry (unknown field or metric, optimum not above random, a non-positive size)."""
    if not os.path.exists(path):
        raise ConfigError(f"no suite file at {path}")
    with open(path) as f:
        data = json.load(f)
    names = {f.name for f in dataclasses.fields(SuiteTask)}
    tasks = {}
    for entry in data.get("tasks", []):
        label = entry.get("name", "?")
        bad = sorted(set(entry) - names)
        if bad:
            raise ConfigError(f"{path}: task {label!r} has unknown field {bad[0]!r}; fields are {', '.join(names)}")
        try:
            task = SuiteTask(**entry)
        except TypeError as e:
            raise ConfigError(f"{path}: task {label!r}: {e}") from None
        if task.metric not in METRICS:
            raise ConfigError(f"{path}: task {label!r} metric={task.metric!r} must be one of {', '.join(METRICS)}")
        if not task.optimum > task.random:
            raise ConfigError(f"{path}: task {label!r} optimum={task.optimum} must be above random={task.random}")
        for field in ("total_steps", "num_envs", "rollout_len"):
            if getattr(task, field) < 1:
                raise ConfigError(f"{path}: task {label!r} {field}={getattr(task, field)} must be >= 1")
        tasks[label] = task
    if not tasks:
        raise ConfigError(f"{path} holds no task")
    return tasks


def digest(obj) -> str:
    """sha256 (16 hex digits) of ``obj``'s canonical JSON."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def code_digest(root: str) -> str:
    """sha256 (16 hex digits) of the library's code (the syntax trees of the ``coevo_jax/`` and ``envs_jax/``
    ``.py`` files under ``root``, docstrings and comments left out): scores from other library code carry
    another digest; an edited docstring does not change it."""
    h = hashlib.sha256()
    for pkg in ("coevo_jax", "envs_jax"):
        for folder, _, files in sorted(os.walk(os.path.join(root, pkg))):
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(folder, name)
                h.update(os.path.relpath(path, root).encode())
                stat = os.stat(path)
                h.update(_code_of(path, stat.st_mtime_ns, stat.st_size))
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def _code_of(path: str, mtime_ns: int, size: int) -> bytes:
    """The syntax tree of the file at ``path`` without docstrings, as text (parsed once per version)."""
    with open(path) as f:
        return ast.dump(_without_docstrings(ast.parse(f.read()))).encode()


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return tree


def run_scores(result, label: str, task: SuiteTask, score: str) -> np.ndarray:
    """Normalised scores ``[configs, seeds]`` of arm ``label`` of a finished study of ``task``: ``score``
    ``"auc"`` (the AUC of the task's metric, stages 1-2) or ``"final"`` (its final score, the evaluation)."""
    idx = result.select(label)
    _, arm = result.arm(label)
    n_it = arm.static.num_iterations
    curve = result.curves[task.metric][idx, :n_it]
    steps = result.curves["env_steps"][idx[0], :n_it]
    eps = result.curves["episodes"][idx, :n_it] if "episodes" in result.curves else None
    raw = auc(curve, steps) if score == "auc" else final_score(curve, eps, steps)
    out = np.full((len(arm.settings()), result.study.num_seeds), np.nan)
    out[np.asarray(result.runs["setting"][idx], int), np.asarray(result.runs["seed"][idx], int)] = raw
    return task.normalise(out)


def run_hashes(result, label: str, task: SuiteTask) -> list[str]:
    """``[seeds]`` fingerprints (16 hex digits of sha256) of the evaluation runs of arm ``label`` (one
    configuration): the bytes of each run's outcome curves (the task's metric, ``env_steps``, ``episodes``),
    which a run reproduces bit for bit only in the same batch and device layout (XLA:CPU compiles each layout
    to its own code, and their float rounding differs)."""
    idx = result.select(label)
    _, arm = result.arm(label)
    n_it = arm.static.num_iterations
    out = [""] * result.study.num_seeds
    for i in idx:
        h = hashlib.sha256()
        for key in (task.metric, "env_steps", "episodes"):
            if key in result.curves:
                h.update(np.ascontiguousarray(result.curves[key][i, :n_it]).tobytes())
        out[int(result.runs["seed"][i])] = h.hexdigest()[:16]
    return out


def suite_score(per_task: Mapping[str, np.ndarray]) -> np.ndarray:
    """A configuration's suite score ``[configs]``: the mean over tasks of the mean over seeds of
    ``per_task {task: [configs, seeds]}`` normalised scores."""
    return np.mean([np.asarray(s, np.float64).mean(-1) for s in per_task.values()], axis=0)


def finalists(per_task: Mapping[str, np.ndarray], n: int) -> list[int]:
    """The ``n`` best configurations by :func:`suite_score`, best first (ties: the earlier sample)."""
    return [int(i) for i in np.argsort(-suite_score(per_task), kind="stable")[:n]]


def matrix(per_task: Mapping[str, np.ndarray], row: int | None = None) -> np.ndarray:
    """``[seeds, tasks]`` of configuration ``row`` of ``per_task {task: [configs, seeds]}`` (``None``: the
    arrays are ``[seeds]`` already): rliable's score-matrix layout."""
    return np.stack([np.asarray(s if row is None else s[row], np.float64) for s in per_task.values()], -1)


def pick(per_task: Mapping[str, np.ndarray]) -> dict:
    """Stage 2's pick among the finalists ``per_task {task: [finalists, seeds]}`` (stage-1 order): the
    highest suite score (ties: the better stage-1 rank), with P(pick > runner-up) over tasks and runs
    (:func:`improvement`): ``{"index", "runner_up", "scores", "p", "ci_low", "ci_high", "confident"}``."""
    s = suite_score(per_task)
    order = np.argsort(-s, kind="stable")
    best, runner = int(order[0]), int(order[1]) if len(order) > 1 else int(order[0])
    x, y = matrix(per_task, best), matrix(per_task, runner)
    poi = dict(_improvement_of(x.tobytes(), y.tobytes(), x.shape, y.shape))
    return {"index": best, "runner_up": runner, "scores": [float(v) for v in s], **poi,
            "confident": poi["ci_low"] > 0.5}


def improvement(x: np.ndarray, y: np.ndarray, n_boot: int = 2000, seed: int = 0) -> dict:
    """P(X > Y) over tasks and runs of score matrices ``x, y [runs, tasks]`` (rliable: the mean over tasks of
    P(x_task > y_task), ties half) with its 95% stratified-bootstrap CI and the one-sided bootstrap p-value
    of P > 0.5 (resampling runs within each task): ``{"p", "ci_low", "ci_high", "pvalue"}``."""
    point, ci = stats.interval_estimates({"xy": (x, y)}, rlm.probability_of_improvement, n_boot, ALPHA, seed)
    rng = np.random.default_rng(seed)
    boots = np.empty(n_boot)
    for b in range(n_boot):
        xi = rng.integers(0, x.shape[0], x.shape)
        yi = rng.integers(0, y.shape[0], y.shape)
        xb, yb = np.take_along_axis(x, xi, 0), np.take_along_axis(y, yi, 0)
        d = xb[:, None, :] - yb[None, :, :]
        boots[b] = ((d > 0).mean((0, 1)) + 0.5 * (d == 0).mean((0, 1))).mean()
    low, high = np.ravel(ci["xy"])
    return {"p": float(np.ravel(point["xy"])[0]), "ci_low": float(low), "ci_high": float(high),
            "pvalue": float(np.mean(boots <= 0.5))}


@functools.lru_cache(maxsize=None)
def _improvement_of(x: bytes, y: bytes, x_shape: tuple, y_shape: tuple) -> tuple:
    """:func:`improvement` of the float64 matrices in ``x, y`` as items, computed once per pair (the
    evaluation stage and the report both ask for each arm's pick)."""
    return tuple(improvement(np.frombuffer(x).reshape(x_shape), np.frombuffer(y).reshape(y_shape)).items())


def aggregate(scores: Mapping[str, np.ndarray], n_boot: int = 2000, seed: int = 0) -> dict:
    """``{arm: {"IQM": (point, low, high), "mean": ..., "optimality gap": ...}}`` of ``scores {arm: [runs,
    tasks]}`` normalised final scores: rliable's aggregates with 95% stratified-bootstrap CIs."""
    funcs = {"IQM": rlm.aggregate_iqm, "mean": rlm.aggregate_mean, "optimality gap": rlm.aggregate_optimality_gap}

    def all_three(s):
        return np.array([f(s) for f in funcs.values()])

    point, ci = stats.interval_estimates(dict(scores), all_three, n_boot, ALPHA, seed)
    return {a: {name: (float(point[a][i]), float(ci[a][0][i]), float(ci[a][1][i])) for i, name in enumerate(funcs)}
            for a in point}


def profile(scores: Mapping[str, np.ndarray], taus: np.ndarray, n_boot: int = 1000, seed: int = 0) -> dict:
    """Performance profiles (rliable): ``{arm: (fraction of runs above each tau [T], low, high)}`` of
    ``scores {arm: [runs, tasks]}`` (every task's runs pooled, each task weighing the same)."""
    point, ci = stats.interval_estimates(dict(scores), lambda s: rly.score_distributions(s, taus), n_boot, ALPHA, seed)
    return {a: (point[a], ci[a][0], ci[a][1]) for a in point}


def verdicts(scores: Mapping[str, np.ndarray], methods: list[str], against: list[str]) -> list[dict]:
    """:data:`RULE` on ``scores {arm: [runs, tasks]}``: one row per method with P(> each of ``against``)
    and its CI, the largest p-value, Holm's threshold and the verdict (``"wins"`` or ``"no"``)."""
    cells, pvalues = {}, {}
    for m in methods:
        poi = {a: improvement(scores[m], scores[a]) for a in against}
        cells[m] = {f"P(> {a})": f"{v['p']:.2f} [{v['ci_low']:.2f}, {v['ci_high']:.2f}]" for a, v in poi.items()}
        pvalues[m] = max(v["pvalue"] for v in poi.values()) if poi else float("nan")
    won = stats.holm(pvalues, ALPHA / 2)
    order = sorted(methods, key=lambda k: (np.isnan(pvalues[k]), pvalues[k]))
    threshold = {k: ALPHA / 2 / (len(order) - i) for i, k in enumerate(order)}
    return [{"method": m, **cells[m], "p (largest)": f"{pvalues[m]:.3f}", "Holm threshold": f"{threshold[m]:.4f}",
             "verdict": "wins" if won[m] else "no"} for m in methods]


def admitted(ppo_iqms: Mapping[str, float], random_iqm: float) -> tuple[bool, str]:
    """The suite's admission rule (:data:`ADMISSION`) on a task from its tuned PPO arms' normalised IQMs
    ``{arm: iqm}`` and the random row's ``random_iqm``: PPO above random by a margin, and room below the optimum."""
    best = max(ppo_iqms.values())
    if best < random_iqm + ADMIT_LOW:
        return False, f"tuned ppo near random ({best:.2f} < random {random_iqm:.2f} + {ADMIT_LOW})"
    if best > ADMIT_HIGH:
        return False, f"tuned ppo solves it ({best:.2f} > {ADMIT_HIGH})"
    return True, ""


def stored_scores(path: str) -> dict:
    """``{"tasks": {task: {"settings", "code"}}, "scores": {(task, arm): {seed: score}}, "curves": {(task, arm):
    {seed: fingerprint}}}`` from a published ``scores.csv`` (columns task, arm, seed, score, settings, code and
    curve, :func:`run_hashes`; a file without the last gives empty fingerprints)."""
    out = {"tasks": {}, "scores": {}, "curves": {}}
    with open(path) as f:
        for row in csv.DictReader(f):
            out["tasks"][row["task"]] = {"settings": row["settings"], "code": row["code"]}
            out["scores"].setdefault((row["task"], row["arm"]), {})[int(row["seed"])] = float(row["score"])
            out["curves"].setdefault((row["task"], row["arm"]), {})[int(row["seed"])] = row.get("curve") or ""
    return out


def check_reproduced(stored: dict, task: str, arm: str, seeds: Mapping[int, str]) -> None:
    """:class:`ConfigError` unless each run ``{seed: fingerprint}`` of ``arm`` on ``task`` re-run here has the
    fingerprint stored for it (:func:`run_hashes`), naming the first that differs."""
    for seed, got in seeds.items():
        want = stored["curves"].get((task, arm), {}).get(seed, "")
        if not want:
            raise ConfigError(f"the stored scores hold no curve fingerprint for {arm} on {task}, seed {seed} (written"
                              " before scores.csv kept them): rerun the stored arms")
        if got != want:
            raise ConfigError(f"the stored {arm} on {task}, seed {seed}, does not reproduce at this library code"
                              f" (curve {got}, stored {want}): rerun the stored arms")


def check_stored(stored: dict, settings: Mapping[str, str], code: str, recheck: int = 0) -> None:
    """:class:`ConfigError` unless every task of ``settings {task: digest}`` has stored scores made with the
    same settings digest and the same library ``code`` digest (:func:`code_digest`), or, with ``recheck > 0``,
    other code whose runs the caller re-runs on ``recheck`` seeds (:func:`check_reproduced`)."""
    for task, digest_now in settings.items():
        rec = stored["tasks"].get(task)
        if rec is None:
            raise ConfigError(f"the stored scores hold no task {task!r}: run the stored arms on it first")
        if rec["settings"] != digest_now:
            raise ConfigError(f"the stored scores of {task} came from other settings (digest {rec['settings']}, now"
                              f" {digest_now}: its budget, shape, normaliser or evaluation seeds differ); rerun the"
                              " stored arms")
        if rec["code"] != code and not recheck:
            raise ConfigError(f"the stored scores of {task} came from other library code (digest {rec['code']}, now"
                              f" {code}); rerun the stored arms, or --recheck-stored K to reproduce K seeds of each")
