"""The admitted-task file that ``sweeps/calibrate.py`` writes and the method
studies read: which tasks and budgets can tell the reward methods apart, with
the rollout shape and each method's tuned hyperparameters.

Per task, ``tuned`` maps a method to the HParams values every study on the
task runs it with: calibration writes ppo's and dense's (lr, ent_coef from its
grid), ``sweeps/tune.py`` each method's from the equal-budget search
(:mod:`_study.tuning`). How they were chosen (``tuning``) and the values they
replaced (``tuned_history``) are the task's records, kept in their own file
``tuning_records/<task>.json`` beside the admitted-task file (:func:`records_path`;
none: no records). A method without values of its own runs at sparse PPO's. A task on
which sparse PPO and the oracle, once tuned by ``sweeps/tune.py``, no longer pass
the admission rule (:func:`admit`) is kept with its values but marked
``withdrawn`` (why), and the comparisons leave it out.
Recorded values are never replaced silently: :func:`record_tuned` refuses a
different value unless told to replace it, and then keeps the old one under
``tuned_history``."""
from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Mapping

import numpy as np

from coevo_jax.config import ConfigError, core_static_fields, static_config, static_fields
from coevo_jax.experiment.spec import Arm
from coevo_jax.files import atomic_write_text
from coevo_jax.registry import method_spec

from _study import options
from _study.tuning import MIN_CONFIGS, MIN_FINALIST_SEEDS, MIN_FINALISTS

RANDOM_MAX, PPO_MAX, POI_LOW_MIN = 0.2, 0.8, 0.6  # the admission rule, fixed in advance
RECORDS = ("tuning", "tuned_history")  # a task's parts kept in its own records file


@dataclasses.dataclass(frozen=True)
class AdmittedTask:
    task: str  # the calibration candidate's name, e.g. "doorkey5-t60"
    env: str
    env_kwargs: Mapping[str, float]
    total_steps: int
    num_envs: int
    rollout_len: int
    tuned: Mapping[str, Mapping[str, float]]  # method -> {HParams field: value}; "ppo" always present
    random_success: float
    ppo_success_iqm: float
    dense_success_iqm: float
    num_minibatches: int = 4  # PPO's passes at calibration
    update_epochs: int = 4
    # method -> how tune.py chose it (from the task's records file)
    tuning: Mapping[str, Mapping] = dataclasses.field(default_factory=dict)
    # StaticConfig fields every method runs with on this task (e.g. the learned rewards' replay size)
    static_overrides: Mapping[str, object] = dataclasses.field(default_factory=dict)
    withdrawn: str = ""  # why the task no longer passes the admission rule at tuned values ("": it does)

    def hparams(self, method: str, tuned_as: str | None = None) -> dict:
        """The tuned values ``method`` runs with: those recorded for it (or for ``tuned_as``,
        e.g. a placebo runs at its method's), otherwise sparse PPO's."""
        return dict(self.tuned.get(tuned_as or method, self.tuned["ppo"]))

    def untuned(self, methods) -> list[str]:
        """The ``methods`` whose values here did not come from the equal-budget tuning (``sweeps/tune.py``)."""
        return [m for m in methods if m not in self.tuning]

    def not_two_stage(self, methods) -> list[str]:
        """The ``methods`` whose values here did not come from the two-stage protocol of
        :mod:`_study.tuning` (no record, or one of the older single-stage 16 x 3 tunings, or one
        without GAE lambda in its space or held): a verdict against them would rest on a mis-selection."""

        def two_stage(r):
            return (r.get("num_configs", 0) >= MIN_CONFIGS and r.get("finalists", 0) >= MIN_FINALISTS
                    and r.get("finalist_seeds", 0) >= MIN_FINALIST_SEEDS and "gae_lambda" in {**r.get("space", {}), **r.get("held", {})})

        return [m for m in methods if not two_stage(self.tuning.get(m, {}))]

    def stage_bases(self) -> set[int]:
        """The base seeds of every recorded tuning stage here (an evaluation must use none of them)."""
        return {r[k] for r in self.tuning.values() for k in ("tune_base_seed", "finalist_base_seed") if k in r}

    def static(self, method: str, **overrides):
        """The :class:`~coevo_jax.config.StaticConfig` of ``method`` at this task's budget, rollout
        shape, PPO passes and ``static_overrides`` (those of its fields ``method`` has:
        :func:`method_static`); ``overrides`` replace further fields (each one ``method``'s)."""
        shape = dict(num_envs=self.num_envs, rollout_len=self.rollout_len, num_minibatches=self.num_minibatches,
                     update_epochs=self.update_epochs, total_steps=self.total_steps)
        return method_static(method, {**shape, **self.static_overrides}, **overrides)

    def arm(self, method: str, label: str = "", overrides: Mapping[str, float] | None = None,
            static_overrides: Mapping[str, object] | None = None, tuned_as: str | None = None):
        """An :class:`~coevo_jax.experiment.spec.Arm` of ``method`` at :meth:`static` with its tuned
        values (:meth:`hparams`) and ``overrides`` on top; ``static_overrides`` replace further
        :class:`~coevo_jax.config.StaticConfig` fields."""
        fixed = {**self.hparams(method, tuned_as), **(overrides or {})}
        return Arm(self.static(method, **(static_overrides or {})), fixed=fixed, label=label)

    def policy_values(self, method: str) -> tuple:
        """``(("lr", v), ("ent_coef", v), ("gae_lambda", v))``: the policy values ``method`` runs with here
        (``gae_lambda`` when it was tuned)."""
        hp = self.hparams(method)
        return tuple((f, hp[f]) for f in ("lr", "ent_coef", "gae_lambda") if f in hp)

    def own_ppo(self, method: str) -> str:
        """The label of sparse PPO's arm at ``method``'s policy values: ``"ppo"`` when they are PPO's own."""
        pair = self.policy_values(method)
        if pair == self.policy_values("ppo"):
            return "ppo"
        short = {"ent_coef": "ent", "gae_lambda": "lam"}
        return "ppo@" + ",".join(f"{short.get(f, f)}={v:g}" for f, v in pair)

    def own_ppo_arms(self, methods) -> list:
        """Sparse PPO at every other pair of policy values that one of ``methods`` was tuned to (one
        arm per pair, labelled by :meth:`own_ppo`): did a method's reward help, or its policy values?"""
        labels = {self.own_ppo(m): m for m in methods}
        return [self.arm("ppo", label, dict(self.policy_values(m))) for label, m in labels.items() if label != "ppo"]


def method_static(method: str, shared: Mapping[str, object], **fields):
    """``method``'s :class:`~coevo_jax.config.StaticConfig` with the ``shared`` fields (flat names set
    for every method of a task or study, e.g. a task's ``static_overrides``: ``method`` takes the core
    fields and those of its own static options, and leaves out the other methods'; JSON lists become
    tuples), then ``fields``. :class:`ConfigError` for an unregistered method, a shared name no
    registered method has, or a name in ``fields`` that ``method`` does not have."""
    method_spec(method)  # (an unknown method: the registry's error, naming the registered ones)
    unknown = [k for k in shared if k not in core_static_fields() and k not in static_fields()]
    if unknown:
        raise ConfigError(f"StaticConfig has no field {unknown[0]!r} (in the fields shared by every method:"
                          f" {', '.join(shared)})")
    own = (*core_static_fields(), *static_fields(method))
    kept = {k: tuple(v) if isinstance(v, list) else v for k, v in shared.items() if k in own}
    return static_config(method, **{**kept, **fields})


def records_path(path: str, task: str) -> str:
    """The file of ``task``'s tuning records (``{"tuning": ..., "tuned_history": ...}``) beside the
    admitted-task file at ``path``: ``tuning_records/<task>.json``."""
    return os.path.join(os.path.dirname(os.path.abspath(path)), "tuning_records", f"{task}.json")


def with_records(path: str, entry: Mapping) -> dict:
    """A task ``entry`` of the admitted-task file at ``path`` with its records (those of
    :func:`records_path`, none when it is missing; a part still held in the entry itself, as
    files of the older layout do, is taken as it is)."""
    file = records_path(path, entry["task"])
    records = {}
    if os.path.exists(file):
        with open(file) as f:
            records = json.load(f)
    return {**records, **entry}


def save_admitted(path: str, data: Mapping, entries=(), dropped=()) -> None:
    """Write the admitted-task file ``data`` to ``path``. Each task of ``entries`` (task dicts of
    ``data`` holding their records, which are taken out of them) has its records file written whole
    (removed when it has none); the records files of the tasks ``dropped`` are removed. Each file is
    written atomically, the records before the admitted-task file."""
    for entry in entries:
        parts = {k: v for k in RECORDS if (v := entry.pop(k, None))}
        file = records_path(path, entry["task"])
        if parts:
            os.makedirs(os.path.dirname(file), exist_ok=True)
            atomic_write_text(file, json.dumps(parts, indent=1) + "\n")
        elif os.path.exists(file):
            os.remove(file)
    atomic_write_text(path, json.dumps(data, indent=1) + "\n")
    for task in dropped:
        if os.path.exists(file := records_path(path, task)):
            os.remove(file)


def load_admitted(path: str) -> dict[str, AdmittedTask]:
    """``{task name: AdmittedTask}`` from the file, in its order, each with its records
    (:func:`with_records`). A missing or empty file is a :class:`ConfigError` that says how to make one."""
    if not os.path.exists(path):
        raise ConfigError(f"no admitted-task file at {path}: run sweeps/calibrate.py first")
    with open(path) as f:
        data = json.load(f)
    fields = {f.name for f in dataclasses.fields(AdmittedTask)}
    tasks = {t["task"]: AdmittedTask(**{k: v for k, v in with_records(path, t).items() if k in fields})
             for t in data.get("tasks", [])}
    if not tasks:
        raise ConfigError(f"{path} admits no task: nothing can tell the methods apart at these budgets")
    known = set(core_static_fields()) - {"method"} | set(static_fields())
    for t in tasks.values():
        bad = sorted(set(t.static_overrides) - known)
        if bad:
            raise ConfigError(f"{path}: task {t.task!r} static_overrides has {', '.join(bad)}, not StaticConfig"
                              " fields")
    return tasks


def admit(random_success: float, ppo: np.ndarray, dense: np.ndarray, n_boot: int = 2000) -> dict:
    """The admission rule on one task's numbers: the random policy's final success and the
    per-seed final successes ``[seeds]`` of ppo and dense (paired). Returns the numbers and
    ``admitted`` with ``why_not``."""
    from coevo_jax.analysis import stats  # report extra (rliable, scipy): imported on use

    poi = stats.probability_of_improvement(dense, ppo, n_boot=n_boot)
    ppo_iqm, dense_iqm = stats.iqm(ppo), stats.iqm(dense)
    reasons = [why for bad, why in (
        (not random_success <= RANDOM_MAX, f"random {random_success:.2f} > {RANDOM_MAX}"),
        (not ppo_iqm <= PPO_MAX, f"ppo {ppo_iqm:.2f} > {PPO_MAX}"),
        (not poi["ci_low"] > POI_LOW_MIN, f"P(dense > ppo) CI low {poi['ci_low']:.2f} <= {POI_LOW_MIN}")) if bad]
    return {"random": random_success, "ppo": ppo_iqm, "dense": dense_iqm, "poi": poi, "admitted": not reasons,
            "why_not": "; ".join(reasons)}


def add_admitted_option(parser, path: str) -> None:
    """The ``--admitted FILE`` option of the scripts that read calibration's verdicts (default ``path``)."""
    parser.add_argument("--admitted", default=path, help="the admitted-task file (default: sweeps/admitted_tasks.json)")


def chosen_task(args) -> tuple[AdmittedTask, dict[str, AdmittedTask]]:
    """``(the task named by args.task, every admitted task)`` from ``args.admitted``;
    an unknown name is a :class:`ConfigError` listing the admitted ones."""
    admitted = load_admitted(args.admitted)
    return admitted[options.names(args.task, "--task", list(admitted))[0]], admitted


def comparable(admitted: Mapping[str, AdmittedTask], names: str, option: str = "--tasks") -> list[str]:
    """The tasks a comparison runs: ``names`` (a comma list, or ``all``: every task not
    withdrawn). Unknown or withdrawn names are a :class:`ConfigError` saying why."""
    live = [t for t, a in admitted.items() if not a.withdrawn]
    if names == "all":
        return live
    for name in (n.strip() for n in names.split(",")):
        if name in admitted and admitted[name].withdrawn:
            raise ConfigError(f"{option}: {name} is withdrawn ({admitted[name].withdrawn}); choose from"
                              f" {', '.join(live)}")
    return options.names(names, option, live)


def same_values(a: Mapping[str, float], b: Mapping[str, float]) -> bool:
    """Whether two ``{field: value}`` hold the same fields and values (to float32 precision: values
    that went through an HParams leaf compare equal to the numbers they were made from)."""
    return set(a) == set(b) and all(np.isclose(float(a[f]), float(b[f]), rtol=1e-6, atol=0.0) for f in a)


def record_tuned(entry: dict, method: str, values: Mapping[str, float], tuning: Mapping | None,
                 replace: bool = False) -> bool:
    """Record ``method``'s tuned ``values`` (and ``tuning``: how they were chosen, ``None``:
    not by the equal-budget tuning) in a task ``entry`` of the admitted-task file (a JSON
    dict, changed in place). Returns whether the values changed.

    Equal values keep their entry (a given ``tuning`` replaces the old one). Different
    values already recorded are a :class:`ConfigError` unless ``replace``; then the old
    values and their ``tuning`` move to ``entry["tuned_history"]``, with the time."""
    tuned, records = entry.setdefault("tuned", {}), entry.setdefault("tuning", {})
    old = tuned.get(method)
    values = {f: float(v) for f, v in values.items()}
    if old is not None and same_values(old, values):
        if tuning is not None:
            records[method] = dict(tuning)
        return False
    if old is not None:
        if not replace:
            show = ", ".join(f"{f}={v:.4g}" for f, v in sorted(old.items()))
            new = ", ".join(f"{f}={v:.4g}" for f, v in sorted(values.items()))
            raise ConfigError(f"{entry['task']}: {method} already has tuned values {show}, not {new}; pass"
                              " --replace-tuned to record the new ones (the old move to tuned_history)")
        entry.setdefault("tuned_history", []).append({
            "method": method, "tuned": old, "tuning": records.get(method),
            "replaced": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())})
    tuned[method] = values
    if tuning is None:
        records.pop(method, None)
    else:
        records[method] = dict(tuning)
    return True


def write_tuned(path: str, task: str, values: Mapping[str, Mapping[str, float]], tuning: Mapping[str, Mapping],
                replace: bool = False, withdrawn: str | None = None) -> list[str]:
    """:func:`record_tuned` for each method of ``values`` (``{method: {field: value}}``, with
    ``tuning[method]``) into task ``task`` of the file at ``path`` and its records file
    (:func:`save_admitted`), all or nothing (a refused method writes nothing). ``withdrawn``: why
    the task fails the admission rule at these values (``""``: it passes; ``None``: not judged here).
    Returns the methods whose values changed."""
    if not os.path.exists(path):
        raise ConfigError(f"no admitted-task file at {path}: run sweeps/calibrate.py first")
    with open(path) as f:
        data = json.load(f)
    tasks = data.get("tasks", [])
    i = next((i for i, t in enumerate(tasks) if t["task"] == task), None)
    if i is None:
        raise ConfigError(f"{path} does not admit task {task!r}")
    tasks[i] = entry = with_records(path, tasks[i])
    changed = [m for m in values if record_tuned(entry, m, values[m], tuning.get(m), replace)]
    if withdrawn:
        entry["withdrawn"] = withdrawn
    elif withdrawn == "":
        entry.pop("withdrawn", None)
    save_admitted(path, data, [entry])
    return changed
