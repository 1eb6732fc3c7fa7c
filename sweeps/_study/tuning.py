"""The tuning protocol: every method of a comparison gets the same budget over its own
key hyperparameters, in two stages, with rules fixed in advance.

* **What is searched** (:func:`search_space`): the policy's ``lr``, ``ent_coef``
  and ``gae_lambda`` (:data:`POLICY_SEARCH`) for every method, then the method's own
  key hyperparameters (:data:`METHOD_SEARCH`; a method not listed there searches
  the policy's fields only). A range
  ``(low, high)`` is searched log-uniformly, ``(low, high, "linear")`` uniformly and
  ``(low, high, "log1m")`` log-uniformly in ``1 - x``: GAE lambda in [0.7, 0.9999], so
  ``1 - lambda`` spans [1e-4, 0.3] and 0.99 and 0.999 are as likely as 0.8 and 0.9 (a
  decision ``d`` steps before its outcome keeps ``lambda^d`` of the outcome's advantage).
  Lambda = 1 (Monte Carlo advantages) is the standing control ``ppo-lambda1``
  (:mod:`_study.controls`), tuned alike over lr and entropy.
* **Stage 1, the screen** (:func:`sample_configs`): ``n >= 32`` points of a Halton
  sequence (bases 2, 3, 5, ... in the order of the fields) shifted by a fixed-seed
  uniform offset modulo 1 (a Cranley-Patterson rotation), mapped into the ranges,
  each value rounded to 3 significant digits, on 2-3 seeds. The policy's fields
  come first, so with the same seed every method gets the same lr / ent_coef /
  gae_lambda coordinates. One compile per method: the sample is one zipped
  :class:`~coevo_jax.experiment.spec.Arm` (:func:`tuning_arm`).
* **Stage 2, the finalists** (:func:`finalists`): the best ``>= 4`` configurations by
  :data:`RULE` re-run on ``>= 12`` fresh seeds; the pick (:data:`FINAL_RULE`,
  :func:`select_finalist`) is made on this stage alone, and the report gives each
  finalist's IQM with its CI and P(pick > each other finalist) (:func:`finalist_rows`),
  so a reader sees whether the pick beats the runner-up with confidence.
* **Edges** (:func:`edge_fields`): a pick whose value lies in the outer
  :data:`EDGE` of a range (in the sampling scale) is flagged: the optimum may lie outside.
* **Seeds**: stage 1 runs on base seed ``tune_base``, stage 2 on ``tune_base +
  FINALIST_SEED_OFFSET``, the evaluation on ``seed``; run keys are
  ``fold_in(PRNGKey(base), s)``, so the three sets never meet (:func:`stage_bases`).
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from coevo_jax.analysis.metrics import auc, final_score
from coevo_jax.config import ConfigError
from coevo_jax.experiment.spec import Arm
from coevo_jax.registry import method_spec

from _study.analysis.credit import spearman
from _study.controls import CONTROLS

#: searched for every method: the policy's Adam step and entropy bonus (log-uniformly), GAE lambda
#: (log-uniformly in 1 - lambda)
POLICY_SEARCH = {"lr": (3e-5, 3e-2), "ent_coef": (1e-4, 1e-1), "gae_lambda": (0.7, 0.9999, "log1m")}
SCALES = ("linear", "log1m")  # a range's optional third entry (none: log-uniform)
MIN_CONFIGS = 32  # stage 1: configurations per method, at least
MIN_FINALISTS = 4  # stage 2: configurations re-run, at least
MIN_FINALIST_SEEDS = 12  # stage 2: fresh seeds per finalist, at least
TUNE_SEED_OFFSET = 1000  # stage 1's default base seed: the evaluation's + this
FINALIST_SEED_OFFSET = 1000  # stage 2's base seed: stage 1's + this
EDGE = 0.05  # a pick within this fraction of either end of a range (sampling scale) is flagged
RULE = ("mean over the tuning seeds of the AUC of success (mean success rate over training);"
        " ties: the earlier sample")
FINAL_RULE = ("the finalist with the highest IQM over the stage-2 seeds of the AUC of success;"
              " ties: the better stage-1 rank")
_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53)
_R_PHI = {"reward_lr_ratio": (0.01, 20.0), "beta_int": (0.1, 2.0)}  # a learned reward's step and its weight
_SIOP = {"potential_lr_ratio": (0.2, 20.0), "beta_int": (0.25, 2.0)}
#: each method's own searched fields, ``(low, high)`` log-uniformly (in this order: the Halton sample's axes)
METHOD_SEARCH = {
    "icm": {"beta_int": (0.01, 1.0), "icm_lr_ratio": (0.1, 10.0)},
    "coevo-regression": _R_PHI, "coevo-ranking": _R_PHI, "coevo-shuffled": _R_PHI,
    "coevo-novelty": {**_R_PHI, "novelty_coef": (0.03, 1.0)},
    "siop": _SIOP, "siop-shuffled": _SIOP, "siop-critic": {"beta_int": (0.25, 2.0)},
    "meta": {"meta_lr_ratio": (0.04, 4.0), "r_int_coef": (0.01, 1.0)},
    "ircr": {"ircr_lr_ratio": (0.2, 200.0)}, "rrd": {"rrd_lr_ratio": (0.2, 200.0)},
    "q-advantage": _R_PHI, "hca": _R_PHI, "cca": {**_R_PHI, "indep_coef": (0.1, 1000.0)},
}


def search_space(method: str) -> dict[str, tuple]:
    """``{field: (low, high[, "linear"])}`` searched for ``method`` (a registered method or a control label
    of :data:`_study.controls.CONTROLS`): :data:`POLICY_SEARCH`, then the method's :data:`METHOD_SEARCH`
    (log-uniform), or the control's ``space`` (after that of the method it is ``like``); checked
    (:func:`check_space`)."""
    held = ()
    if method in CONTROLS:
        c = CONTROLS[method]
        own, held = {**METHOD_SEARCH.get(c.like, {}), **c.space}, tuple(c.fixed)
    else:
        own = dict(METHOD_SEARCH.get(method, {}))
    check_space(method_of(method), own)
    return {**{f: r for f, r in POLICY_SEARCH.items() if f not in own and f not in held}, **own}


def check_space(method: str, space: Mapping[str, tuple]) -> None:
    """:class:`ConfigError` unless every ``space[field]`` names a float HParams field of the registered
    ``method`` and is ``(low, high)`` with ``0 < low < high`` (log-uniform), ``(low, high, "linear")``
    with ``low < high`` or ``(low, high, "log1m")`` with ``low < high < 1``, both ends inside the field's
    range."""
    decls = method_spec(method).declarations()
    for field, rng in space.items():
        p = decls.get(field)
        if p is None:
            raise ConfigError(f"method {method!r}: the search space names unknown HParams field {field!r};"
                              f" fields are {', '.join(decls)}")
        ok = isinstance(rng, tuple) and (len(rng) == 2 or (len(rng) == 3 and rng[2] in SCALES)) and not p.integer
        positive = {"linear": True, "log1m": ok and rng[1] < 1}.get(scale(rng) if ok else "", ok and 0 < rng[0])
        if not (ok and positive and rng[0] < rng[1] and not p.outside(np.asarray(rng[:2])).any()):
            raise ConfigError(f"method {method!r}: search range {field}={rng!r} must be (low, high) with 0 < low <"
                              f" high, (low, high, 'linear') with low < high or (low, high, 'log1m') with low < high"
                              f" < 1, inside HParams.{field}'s range {p.range_text()}"
                              f"{' (an integer field)' if p.integer else ''}")


def arm_of(label: str, static, configs: list[dict] | None = None, pick: Mapping[str, float] | None = None):
    """The :class:`~coevo_jax.experiment.spec.Arm` of a method or control ``label`` at ``static`` (its method
    set by the caller): the zipped ``configs`` (stages 1-2) or the ``pick`` (evaluation), with a control's
    held values."""
    fixed = dict(CONTROLS[label].fixed) if label in CONTROLS else {}
    if configs is not None:
        return tuning_arm(static, configs, fixed, label if label in CONTROLS else "")
    return Arm(static, fixed={**fixed, **pick}, label=label if label in CONTROLS else "")


def method_of(label: str) -> str:
    """The registered method a method or control ``label`` runs."""
    return CONTROLS[label].method if label in CONTROLS else label


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


def scale(rng: tuple) -> str:
    """A search range's sampling scale: ``"log"`` (``(low, high)``), ``"linear"`` or ``"log1m"``."""
    return rng[2] if len(rng) == 3 else "log"


def is_linear(rng: tuple) -> bool:
    """Whether a search range ``(low, high[, scale])`` is searched uniformly."""
    return scale(rng) == "linear"


def _warp(x: float, rng: tuple) -> float:
    """``x`` in the coordinate its range is uniform in: ``x``, ``log x`` or ``log(1 - x)``."""
    kind = scale(rng)
    return x if kind == "linear" else math.log(x) if kind == "log" else math.log1p(-x)


def from_unit(u: float, rng: tuple) -> float:
    """The point at ``u`` in ``[0, 1]`` of the range ``rng`` in its sampling scale."""
    lo, hi = _warp(rng[0], rng), _warp(rng[1], rng)
    w, kind = lo + u * (hi - lo), scale(rng)
    return w if kind == "linear" else math.exp(w) if kind == "log" else -math.expm1(w)


def to_unit(x: float, rng: tuple) -> float:
    """The inverse of :func:`from_unit`: where ``x`` lies in ``rng``, in ``[0, 1]`` of its sampling scale."""
    lo, hi = _warp(rng[0], rng), _warp(rng[1], rng)
    return (_warp(x, rng) - lo) / (hi - lo)


def sample_configs(space: Mapping[str, tuple], n: int, seed: int = 0) -> list[dict]:
    """``n`` configurations ``{field: value}`` inside ``space`` (module docstring: Halton points,
    log-uniform, uniform or log-uniform in ``1 - x`` per range, 3 significant digits, clipped back into the range after rounding)."""
    if n < 1:
        raise ConfigError(f"number of configurations {n} must be >= 1")
    fields = list(space)
    u = unit_sample(n, len(fields), seed)
    return [{f: min(max(_round(from_unit(ui, space[f]), space[f]), space[f][0]), space[f][1])
             for f, ui in zip(fields, row)} for row in u]


def _round(x: float, rng: tuple) -> float:
    """``x`` to 3 significant digits in its sampling coordinate (of ``1 - x`` on a ``"log1m"`` range)."""
    return round(1.0 - round_sig(1.0 - x), 12) if scale(rng) == "log1m" else round_sig(x)


def edge_fields(config: Mapping[str, float], space: Mapping[str, tuple], edge: float = EDGE) -> list[str]:
    """``["lr (high)", ...]``: the fields of ``config`` whose value lies within ``edge`` of either end of
    its range in ``space`` (in the sampling scale); ``[]`` when the pick is inside every range."""
    out = []
    for f, rng in space.items():
        u = to_unit(config[f], rng)
        if u <= edge or u >= 1.0 - edge:
            out.append(f"{f} ({'low' if u <= edge else 'high'})")
    return out


def stage_bases(seed: int, tune_base: int | None = None) -> tuple[int, int, int]:
    """``(stage 1, stage 2, evaluation)`` base seeds: ``tune_base`` (default ``seed + TUNE_SEED_OFFSET``),
    ``tune_base + FINALIST_SEED_OFFSET`` and ``seed``; :class:`ConfigError` unless all three differ and,
    for a reproduction (``tune_base`` given), its two stages also miss the default run's stage seeds."""
    b1 = seed + TUNE_SEED_OFFSET if tune_base is None else tune_base
    bases = (b1, b1 + FINALIST_SEED_OFFSET, seed)
    default = {seed + TUNE_SEED_OFFSET, seed + TUNE_SEED_OFFSET + FINALIST_SEED_OFFSET}
    if len(set(bases)) < 3 or min(bases) < 0:
        raise ConfigError(f"--tune-base={b1} gives stage base seeds {bases[:2]} that meet the evaluation's"
                          f" {seed} (or are negative); choose another")
    if tune_base is not None and tune_base != seed + TUNE_SEED_OFFSET and default & set(bases[:2]):
        raise ConfigError(f"--tune-base={b1} gives stage base seeds {bases[:2]} that meet the default run's"
                          f" {sorted(default)}: a reproduction needs seeds of its own; choose another")
    return bases


def tuning_arm(static, configs: list[dict], fixed: Mapping[str, float] | None = None, label: str = ""):
    """One :class:`~coevo_jax.experiment.spec.Arm` running every configuration (a zipped grid: one compile)."""
    grid = {f: tuple(c[f] for c in configs) for f in configs[0]}
    return Arm(static, grid, dict(fixed or {}), label, zipped=True)


def config_scores(success: np.ndarray, env_steps: np.ndarray, setting: np.ndarray, seed: np.ndarray,
                  num_configs: int, num_seeds: int, episodes: np.ndarray | None = None,
                  score: str = "auc") -> np.ndarray:
    """Each run's score laid out ``[configs, seeds]``: ``success [R, I]`` (per-iteration success rate,
    NaN before any episode finished: counts 0 in the AUC), ``env_steps [I]``, each run's ``setting`` and
    ``seed`` ``[R]``. ``score``: ``"auc"`` (the AUC of success) or ``"final"`` (final success,
    :func:`coevo_jax.analysis.metrics.final_score`, weighted by ``episodes [R, I]``). A missing
    (config, seed) stays NaN."""
    out = np.full((num_configs, num_seeds), np.nan)
    value = auc(success, env_steps) if score == "auc" else final_score(success, episodes, env_steps)
    out[np.asarray(setting, int), np.asarray(seed, int)] = value
    return out


def select_config(scores: np.ndarray) -> int:
    """:data:`RULE` on ``scores [configs, seeds]`` (AUC of success): the index of the highest
    mean over seeds (a NaN counts 0), the first on ties."""
    return finalists(scores, 1)[0]


def finalists(scores: np.ndarray, n: int) -> list[int]:
    """The ``n`` best configurations of stage 1 by :data:`RULE` on ``scores [configs, seeds]``, best
    first (a NaN counts 0; ties: the earlier sample)."""
    scores = np.asarray(scores, np.float64)
    mean = np.where(np.isfinite(scores), scores, 0.0).mean(-1)
    return [int(i) for i in np.argsort(-mean, kind="stable")[:n]]


def select_finalist(scores: np.ndarray) -> int:
    """:data:`FINAL_RULE` on stage 2's ``scores [finalists, seeds]`` (rows in stage-1 rank order): the
    row index of the highest IQM over seeds (a NaN counts 0), the better stage-1 rank on ties."""
    from coevo_jax.analysis.stats import iqm  # report extra (rliable, scipy): imported on use

    return int(np.argmax([iqm(np.where(np.isfinite(row), row, 0.0)) for row in np.asarray(scores, np.float64)]))


def finalist_rows(configs: list[dict], stage1: np.ndarray, stage2: np.ndarray, final: np.ndarray,
                  pick: int) -> list[dict]:
    """Stage 2 as table rows, one per finalist (stage-1 rank order): its values, stage-1 mean AUC,
    stage-2 AUC IQM [95% CI] and final-success IQM [95% CI] (``stage1 [F, S1]``, ``stage2 [F, S2]``
    AUCs, ``final [F, S2]`` final success), and P(pick > it) [95% CI] on the AUC (rliable)."""
    from coevo_jax.analysis import stats  # report extra (rliable, scipy): imported on use

    s2 = np.where(np.isfinite(stage2), stage2, 0.0)
    return [{"finalist": i + 1, "pick": "PICK" if i == pick else "",
             "values": ", ".join(f"{f}={v:g}" for f, v in config.items()),
             "stage-1 AUC": float(np.nan_to_num(stage1[i]).mean()),
             "stage-2 AUC IQM [95% CI]": stats.iqm_text(s2[i], digits=3),
             "final success IQM [95% CI]": stats.iqm_text(final[i], digits=3),
             "P(pick > it) [95% CI]": "-" if i == pick else stats.improvement_cell(s2[pick], s2[i])}
            for i, config in enumerate(configs)]


def pick_verdict(stage2: np.ndarray, pick: int) -> dict:
    """P(pick > runner-up) on stage 2's AUCs ``[F, S2]`` (runner-up: the next-highest IQM) and whether any
    other finalist beats the pick with confidence: ``{"runner_up", "p", "ci_low", "ci_high", "confident",
    "beaten_by"}`` (``confident``: the CI's lower end above 0.5; ``beaten_by``: finalists with P(it > pick)'s
    lower end above 0.5)."""
    from coevo_jax.analysis import stats  # report extra (rliable, scipy): imported on use

    s = np.where(np.isfinite(stage2), stage2, 0.0)
    order = np.argsort([-stats.iqm(r) for r in s], kind="stable")
    runner = int(next(i for i in order if i != pick))
    poi = stats.probability_of_improvement(s[pick], s[runner])
    beaten = [i for i in range(len(s)) if i != pick and stats.probability_of_improvement(s[i], s[pick])["ci_low"] > 0.5]
    return {"runner_up": runner, **poi, "confident": poi["ci_low"] > 0.5, "beaten_by": beaten}


def arm_scores(result, label: str, score: str = "auc") -> np.ndarray:
    """:func:`config_scores` (``score``: ``"auc"`` or ``"final"``) of the zipped arm ``label`` of a finished
    tuning study (:class:`~coevo_jax.experiment.results.StudyResult`)."""
    if "success_rate" not in result.curves:
        raise ConfigError(f"{result.study.env} reports no success rate: the tuning rule is the AUC of success")
    idx = result.select(label)
    _, arm = result.arm(label)
    n_it = arm.static.num_iterations
    eps = result.curves["episodes"][idx, :n_it] if "episodes" in result.curves else None
    return config_scores(result.curves["success_rate"][idx, :n_it], result.curves["env_steps"][idx[0], :n_it],
                         result.runs["setting"][idx], result.runs["seed"][idx], len(arm.settings()),
                         result.study.num_seeds, eps, score)


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
