"""What to run: a :class:`Study` of :class:`Arm` s, as data with a JSON round trip. Seed ``s`` of every
arm and grid point uses ``fold_in(PRNGKey(base_seed), s)`` (seeds are paired across arms); the hash of
``config.json`` (the canonical JSON) guards resuming."""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
from typing import Any, Mapping, Sequence

import envs_jax
import numpy as np

from coevo_jax.config import ConfigError, StaticConfig, core_static_fields, static_config, static_fields

CONFIG_VERSION = 4
READABLE_VERSIONS = (3, 4)  # config.json versions Study.from_json reads (a study resumes only its own)


class StudyError(RuntimeError):
    """A study that cannot start or continue (bad output folder, mismatched checkpoint)."""


def _py(x):
    """A JSON-friendly Python scalar from a NumPy/JAX/Python number (anything else unchanged)."""
    try:
        return np.asarray(x).item()
    except (TypeError, ValueError):
        return x


@dataclasses.dataclass(frozen=True)
class Arm:
    """One method (``static``) with its grid of HParams values: ``grid`` ``{field: values}`` (cartesian
    product; with ``zipped`` point ``i`` takes value ``i`` of every field); ``fixed`` overrides on top of
    ``default_hparams(static.method)``; ``label`` names the arm (default the method)."""

    static: StaticConfig
    grid: Mapping[str, Sequence[float]] = dataclasses.field(default_factory=dict)
    fixed: Mapping[str, float] = dataclasses.field(default_factory=dict)
    label: str = ""
    zipped: bool = False

    @property
    def name(self) -> str:
        return self.label or self.static.method

    def settings(self) -> list[dict]:
        """The grid points: a list of ``{field: value}``."""
        fields = list(self.grid)
        columns = [list(self.grid[f]) for f in fields]
        if not self.zipped:
            return [dict(zip(fields, vals)) for vals in itertools.product(*columns)]
        if len({len(c) for c in columns}) > 1:
            raise ConfigError(f"{self.name}: a zipped grid needs as many values for every field, got"
                              f" {', '.join(f'{f}: {len(c)}' for f, c in zip(fields, columns))}")
        return [dict(zip(fields, vals)) for vals in zip(*columns)]

    def to_json(self) -> dict:
        d = {"label": self.name, "static": self.static.as_dict(),
             "grid": [[k, [_py(x) for x in v]] for k, v in self.grid.items()],  # pairs keep the field order
             "fixed": {k: _py(v) for k, v in self.fixed.items()}}
        return {**d, "zipped": True} if self.zipped else d  # (a crossed grid's config.json has no such key)

    @staticmethod
    def from_json(d: dict, version: int = CONFIG_VERSION) -> "Arm":
        """The arm of ``d`` (:meth:`to_json`; a ``version`` 3 file's flat static fields of other methods are
        dropped)."""
        flat = {k: tuple(v) if isinstance(v, list) else v for k, v in d["static"].items()}
        method = flat.pop("method")
        if version < 4:
            flat = {k: v for k, v in flat.items() if k in core_static_fields() or k in static_fields(method)}
        return Arm(static_config(method, **flat), {k: tuple(v) for k, v in d["grid"]}, dict(d["fixed"]), d["label"],
                   bool(d.get("zipped", False)))


@dataclasses.dataclass(frozen=True)
class Study:
    """A whole experiment: one environment, its arms, ``num_seeds`` seeds per grid point. ``threshold``:
    the absolute level of ``threshold_metric`` for ``steps_to_threshold`` (``None``: not reported);
    ``num_chunks``: checkpointed chunks per run (:func:`chunk_length`); ``save_final`` / ``save_chunks``:
    keep every run's final / per-chunk :class:`~coevo_jax.train.TrainState` in the checkpoints."""

    env: str
    arms: tuple
    num_seeds: int
    env_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    base_seed: int = 0
    num_chunks: int = 10
    threshold: float | None = None
    threshold_metric: str = "success_rate"
    name: str = "study"
    save_final: bool = False
    save_chunks: bool = False

    def make_env(self):
        """``(env, env_params)`` of the study; :class:`ConfigError` for an unknown name or bad kwargs."""
        names = envs_jax.registered()
        if self.env not in names:
            raise ConfigError(f"env: unknown environment {self.env!r}; registered: {', '.join(names)}")
        try:
            return envs_jax.make(self.env, **dict(self.env_kwargs))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"env_kwargs for {self.env}: {e}") from None

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d.update(version=CONFIG_VERSION, env_kwargs=dict(self.env_kwargs), arms=[a.to_json() for a in self.arms])
        return d

    @staticmethod
    def from_json(d: dict) -> "Study":
        d = dict(d)
        version = d.pop("version", None)
        if version not in READABLE_VERSIONS:
            raise StudyError("config.json was written by another version of coevo_jax.experiment; use a new --out")
        arms = tuple(Arm.from_json(a, version) for a in d["arms"])
        return Study(**{**d, "arms": arms, "env_kwargs": dict(d["env_kwargs"])})


def config_text(study: Study) -> str:
    """The canonical ``config.json`` content (sorted keys; its hash identifies the study)."""
    try:
        return json.dumps(study.to_json(), indent=1, sort_keys=True) + "\n"
    except TypeError as e:
        raise ConfigError(f"study is not JSON-serialisable: {e}") from None


def config_hash(text: str) -> str:
    """First 16 hex digits of the SHA-256 of ``config.json``'s content."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def chunk_length(num_iterations: int, num_chunks: int) -> int:
    """Iterations per chunk: the divisor of ``num_iterations`` nearest ``num_iterations / num_chunks``
    (ties: the smaller), so every chunk has the same compiled length."""
    target = num_iterations / max(1, num_chunks)
    divisors = [d for d in range(1, num_iterations + 1) if num_iterations % d == 0]
    return min(divisors, key=lambda d: (abs(math.log(d / target)) if target > 0 else d, d))
