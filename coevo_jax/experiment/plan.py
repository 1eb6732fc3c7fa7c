"""How a study is cut: runs -> batches -> chunks, and each run's key. Run ``r`` of an arm is grid point
``r // num_seeds``, seed ``r % num_seeds``; batches share one compiled shape; a run's key depends on
its seed index alone."""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np

from coevo_jax.config import ConfigError, default_hparams, hparam_fields, validate_hparams, validate_static
from coevo_jax.experiment.spec import Arm, Study, chunk_length
from coevo_jax.train import Trainer


@dataclasses.dataclass
class ArmPlan:
    """An arm resolved to arrays: ``hp`` leaves ``[S]`` (one per grid point)."""

    arm: Arm
    settings: list
    hp: Any
    num_runs: int
    num_iterations: int
    chunk_len: int


def _check_counts(study: Study) -> None:
    for name, low in (("num_seeds", 1), ("base_seed", 0), ("num_chunks", 1)):
        v = getattr(study, name)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
            raise ConfigError(f"{name}={v!r} must be an integer >= {low}")
    if study.threshold is not None and not np.isfinite(study.threshold):
        raise ConfigError(f"threshold={study.threshold!r} must be a finite number or None")
    if not study.arms:
        raise ConfigError("arms: a study needs at least one arm")
    labels = [a.name for a in study.arms]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"arms: labels must be unique, got {labels}")


def arm_hparams(arm: Arm) -> Any:
    """The arm's HParams (its method's classes) with leaves ``[S]`` (grid points), validated."""
    fields = hparam_fields(arm.static.method)
    for field in list(arm.grid) + list(arm.fixed):
        if field not in fields:
            raise ConfigError(f"{arm.name}: unknown HParams field {field!r} of method {arm.static.method!r};"
                              f" fields are {', '.join(fields)}")
    for field, vals in arm.grid.items():
        if len(list(vals)) == 0:
            raise ConfigError(f"{arm.name}: grid field {field!r} has no values")
        if field in arm.fixed:
            raise ConfigError(f"{arm.name}: field {field!r} is both swept and fixed")
    settings = arm.settings()
    base = default_hparams(arm.static.method).as_dict()
    raw = {}
    for field in fields:
        fixed = [arm.fixed.get(field, base[field])] * len(settings)
        vals = [s[field] for s in settings] if field in arm.grid else fixed
        try:
            raw[field] = np.asarray(vals, np.float64)
        except (TypeError, ValueError):
            raise ConfigError(f"{arm.name}: HParams.{field} values {vals!r} are not numbers") from None
    return validate_hparams(default_hparams(arm.static.method, **raw))


def build_plan(study: Study, check_trainers: bool = True) -> list[ArmPlan]:
    """Validate everything (counts, static configs, HParams, env) and resolve each arm, compiling nothing;
    :class:`ConfigError` names the bad value."""
    _check_counts(study)
    env, env_params = study.make_env()
    plans = []
    for arm in study.arms:
        static = validate_static(arm.static)
        hp = arm_hparams(arm)
        if check_trainers:
            try:  # builds network and signal (no compiling): method/env mismatches surface here
                Trainer(static, env, env_params)
            except ConfigError as e:
                raise ConfigError(f"{arm.name}: {e}") from None
        settings = arm.settings()
        plans.append(ArmPlan(arm, settings, hp, len(settings) * study.num_seeds, static.num_iterations,
                             chunk_length(static.num_iterations, study.num_chunks)))
    return plans


def run_keys(base_seed: int, seed_index: np.ndarray):
    """``fold_in(PRNGKey(base_seed), seed_index)`` for each entry: uint32 ``[B, 2]``."""
    base = jax.random.PRNGKey(base_seed)
    return jax.vmap(lambda i: jax.random.fold_in(base, i))(np.asarray(seed_index, np.uint32))


def batch_size(num_runs: int, cap: int | None, num_devices: int) -> int:
    """Runs per compiled batch: at most ``cap`` rounded up to a multiple of ``num_devices``, balanced
    so the last batch is nearly full."""
    cap = num_runs if cap is None else max(1, min(cap, num_runs))
    batches = math.ceil(num_runs / cap)
    return int(math.ceil(math.ceil(num_runs / batches) / num_devices) * num_devices)


def arm_batches(plan: ArmPlan, cap: int | None, num_devices: int):
    """``(b, [run indices of each batch])`` of one arm: consecutive runs in batches of at most ``b``."""
    b = batch_size(plan.num_runs, cap, num_devices)
    return b, [np.arange(i, min(i + b, plan.num_runs)) for i in range(0, plan.num_runs, b)]
