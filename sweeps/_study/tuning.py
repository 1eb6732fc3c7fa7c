"""Equal-budget tuning: every method of a comparison gets the same number of
configurations over its own key hyperparameters, chosen by one rule fixed in advance.

* **What is searched** (:func:`search_space`): the policy's ``lr`` and
  ``ent_coef`` (:data:`POLICY_SEARCH`) for every method, then the fields the
  method declares in its :class:`~coevo_jax.registry.MethodSpec` ``tune``,
  each a range ``(low, high)`` searched log-uniformly.
* **The sample** (:func:`sample_configs`): ``n`` points of a Halton sequence
  (bases 2, 3, 5, ... in the order of the fields) shifted by a fixed-seed
  uniform offset modulo 1 (a Cranley-Patterson rotation), mapped log-uniformly
  into the ranges, each value rounded to 3 significant digits. The policy's
  fields come first, so with the same seed every method gets the same lr /
  ent_coef coordinates.
* **One compile per method**: the sample is one :class:`~coevo_jax.experiment.spec.Arm`
  with a zipped grid (:func:`tuning_arm`), its ``n x seeds`` runs vmapped over
  the HParams leaves.
* **The rule** (:data:`RULE`, :func:`select_config`): the configuration with the
  highest mean, over the tuning seeds, of the AUC of success (the mean success
  rate over training, :func:`coevo_jax.analysis.metrics.auc`); ties go to the
  earlier sample.
* **Seeds**: tuning runs on base seed ``seed + TUNE_SEED_OFFSET``, evaluation on
  ``seed``: the keys ``fold_in(PRNGKey(base), s)`` of the two never meet.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from coevo_jax.config import ConfigError

#: searched for every method: the policy's Adam step and entropy bonus, log-uniformly
POLICY_SEARCH = {"lr": (1e-4, 1e-2), "ent_coef": (1e-3, 1e-1)}
MIN_CONFIGS = 16  # configurations per method, at least
TUNE_SEED_OFFSET = 1000  # tuning seeds' base seed: the evaluation's + this
RULE = ("mean over the tuning seeds of the AUC of success (mean success rate over training);"
        " ties: the earlier sample")
_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53)


def search_space(method: str) -> dict[str, tuple[float, float]]:
    """``{field: (low, high)}`` searched for ``method``: :data:`POLICY_SEARCH`, then its ``MethodSpec.tune``."""
    from coevo_jax.registry import method_spec

    own = dict(method_spec(method).tune)
    return {**{f: r for f, r in POLICY_SEARCH.items() if f not in own}, **own}


def radical_inverse(i: np.ndarray, base: int) -> np.ndarray:
    """Van der Corput radical inverse of the integers ``i [n]`` in ``base``: ``[n]`` in ``[0, 1)``."""
    i = np.asarray(i, np.int64).copy()
    out, scale = np.zeros(i.shape), 1.0 / base
    while (i > 0).any():
        out += (i % base) * scale
        i //= base
        scale /= base
    return out


def unit_sample(n: int, dims: int, seed: int = 0) -> np.ndarray:
    """``[n, dims]`` points in ``[0, 1)``: Halton points 1..n rotated by a fixed-seed uniform shift."""
    if dims > len(_PRIMES):
        raise ConfigError(f"at most {len(_PRIMES)} tuned fields, got {dims}")
    shift = np.random.default_rng(seed).random(dims)
    idx = np.arange(1, n + 1)
    return np.stack([(radical_inverse(idx, _PRIMES[d]) + shift[d]) % 1.0 for d in range(dims)], -1).reshape(n, dims)


def round_sig(x: float, digits: int = 3) -> float:
    """``x`` rounded to ``digits`` significant digits."""
    return float(f"{x:.{digits - 1}e}")


def sample_configs(space: Mapping[str, tuple], n: int, seed: int = 0) -> list[dict]:
    """``n`` configurations ``{field: value}`` inside ``space`` (module docstring: log-uniform
    Halton points, 3 significant digits, clipped back into the range after rounding)."""
    if n < 1:
        raise ConfigError(f"number of configurations {n} must be >= 1")
    fields = list(space)
    u = unit_sample(n, len(fields), seed)
    out = []
    for row in u:
        cfg = {}
        for f, ui in zip(fields, row):
            lo, hi = space[f]
            cfg[f] = min(max(round_sig(math.exp(math.log(lo) + ui * (math.log(hi) - math.log(lo)))), lo), hi)
        out.append(cfg)
    return out


def tuning_arm(static, configs: list[dict], fixed: Mapping[str, float] | None = None, label: str = ""):
    """One :class:`~coevo_jax.experiment.spec.Arm` running every configuration (a zipped grid: one compile)."""
    from coevo_jax.experiment.spec import Arm

    grid = {f: tuple(c[f] for c in configs) for f in configs[0]}
    return Arm(static, grid, dict(fixed or {}), label, zipped=True)


def config_scores(success: np.ndarray, env_steps: np.ndarray, setting: np.ndarray, seed: np.ndarray,
                  num_configs: int, num_seeds: int) -> np.ndarray:
    """The AUC of success of each run, laid out ``[configs, seeds]``: ``success [R, I]`` (per-iteration
    success rate, NaN before any episode finished: counts 0), ``env_steps [I]``, each run's
    ``setting`` and ``seed`` ``[R]``. A missing (config, seed) stays NaN."""
    from coevo_jax.analysis.metrics import auc

    out = np.full((num_configs, num_seeds), np.nan)
    out[np.asarray(setting, int), np.asarray(seed, int)] = auc(success, env_steps)
    return out


def select_config(scores: np.ndarray) -> int:
    """:data:`RULE` on ``scores [configs, seeds]`` (AUC of success): the index of the highest
    mean over seeds (a NaN counts 0), the first on ties."""
    scores = np.asarray(scores, np.float64)
    return int(np.argmax(np.where(np.isfinite(scores), scores, 0.0).mean(-1)))


def arm_scores(result, label: str) -> np.ndarray:
    """:func:`config_scores` of the zipped arm ``label`` of a finished tuning study
    (:class:`~coevo_jax.experiment.results.StudyResult`)."""
    if "success_rate" not in result.curves:
        raise ConfigError(f"{result.study.env} reports no success rate: the tuning rule is the AUC of success")
    idx = result.select(label)
    _, arm = result.arm(label)
    n_it = arm.static.num_iterations
    return config_scores(result.curves["success_rate"][idx, :n_it], result.curves["env_steps"][idx[0], :n_it],
                         result.runs["setting"][idx], result.runs["seed"][idx], len(arm.settings()),
                         result.study.num_seeds)


#: R_phi's diagnostics in a tuning study's curves (coevo_jax.signals.learned): its held-out
#: correlation with the return, and its size per step
R_PHI_METRICS = {"held-out corr": "signal/val_corr", "|R_phi| per step": "signal/r_phi_abs_mean"}


def learned_reward_rows(result, label: str) -> tuple[list[dict], dict]:
    """What R_phi learned at each configuration of the zipped arm ``label`` (a method whose
    runs report :data:`R_PHI_METRICS`): per configuration, in order of its ``reward_lr_ratio``,
    the policy's lr, the ratio, R_phi's own lr (their product), ``beta_int``, the tuning AUC
    (mean over seeds), and the mean over seeds of each metric averaged over the second half
    of training. Also ``{"tuning AUC": rho, "held-out corr": rho}``: Spearman's rho of each against
    the ratio, over the configurations. ``([], {})`` when the arm reports no R_phi."""
    from coevo_jax.credit import spearman

    if any(m not in result.curves for m in R_PHI_METRICS.values()):
        return [], {}
    idx = result.select(label)
    _, arm = result.arm(label)
    settings = arm.settings()
    if "reward_lr_ratio" not in settings[0]:
        return [], {}
    n_it = arm.static.num_iterations
    scores = np.nan_to_num(arm_scores(result, label)).mean(-1)
    setting = np.asarray(result.runs["setting"][idx], int)
    rows = []
    for i, config in enumerate(settings):
        runs = idx[setting == i]
        row = {"config": i, "lr": config["lr"], "reward_lr_ratio": config["reward_lr_ratio"],
               "R_phi lr": round_sig(config["lr"] * config["reward_lr_ratio"]),
               "beta_int": config.get("beta_int", float("nan")), "tuning AUC": float(scores[i])}
        for name, metric in R_PHI_METRICS.items():
            late = result.curves[metric][runs, n_it // 2:n_it]
            row[name] = float(np.nanmean(late)) if np.isfinite(late).any() else float("nan")
        rows.append(row)
    rows.sort(key=lambda r: r["reward_lr_ratio"])
    ratio = np.array([r["reward_lr_ratio"] for r in rows])
    rho = {name: spearman(ratio, np.array([r[name] for r in rows])) for name in ("tuning AUC", "held-out corr")}
    return rows, rho
