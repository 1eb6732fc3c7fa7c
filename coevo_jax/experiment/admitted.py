"""The admitted-task file that ``sweeps/calibrate.py`` writes and the method
studies read: which tasks and budgets can tell the reward methods apart, with
the rollout shape and the lr / entropy coefficient tuned for ppo and dense."""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Mapping

from coevo_jax.config import ConfigError


@dataclasses.dataclass(frozen=True)
class AdmittedTask:
    task: str  # the calibration candidate's name, e.g. "doorkey5-t60"
    env: str
    env_kwargs: Mapping[str, float]
    total_steps: int
    num_envs: int
    rollout_len: int
    tuned: Mapping[str, Mapping[str, float]]  # "ppo" / "dense" -> {"lr": ..., "ent_coef": ...}
    random_success: float
    ppo_success_iqm: float
    dense_success_iqm: float
    num_minibatches: int = 4  # PPO's passes at calibration
    update_epochs: int = 4

    def hparams(self, method: str) -> dict:
        """The tuned lr / ent_coef a method runs with: dense its own, every other method ppo's."""
        return dict(self.tuned["dense" if method == "dense" else "ppo"])

    def arm(self, method: str, label: str = "", overrides: Mapping[str, float] | None = None,
            static_overrides: Mapping[str, object] | None = None):
        """An :class:`~coevo_jax.experiment.spec.Arm` of ``method`` at this task's budget,
        rollout shape and PPO passes, with its tuned lr / ent_coef (and ``overrides``);
        ``static_overrides`` replace further :class:`~coevo_jax.config.StaticConfig` fields."""
        from coevo_jax.config import StaticConfig
        from coevo_jax.experiment.spec import Arm

        static = StaticConfig(method=method, num_envs=self.num_envs, rollout_len=self.rollout_len,
                              num_minibatches=self.num_minibatches, update_epochs=self.update_epochs,
                              total_steps=self.total_steps).replace(**(static_overrides or {}))
        return Arm(static, fixed={**self.hparams(method), **(overrides or {})}, label=label)


def load_admitted(path: str) -> dict[str, AdmittedTask]:
    """``{task name: AdmittedTask}`` from the file, in its order. A missing or
    empty file is a :class:`ConfigError` that says how to make one."""
    if not os.path.exists(path):
        raise ConfigError(f"no admitted-task file at {path}: run sweeps/calibrate.py first")
    with open(path) as f:
        data = json.load(f)
    fields = {f.name for f in dataclasses.fields(AdmittedTask)}
    tasks = {t["task"]: AdmittedTask(**{k: v for k, v in t.items() if k in fields}) for t in data.get("tasks", [])}
    if not tasks:
        raise ConfigError(f"{path} admits no task: nothing can tell the methods apart at these budgets")
    return tasks


def add_admitted_option(parser, path: str) -> None:
    """The ``--admitted FILE`` option of the scripts that read calibration's verdicts (default ``path``)."""
    parser.add_argument("--admitted", default=path, help="the admitted-task file (default: sweeps/admitted_tasks.json)")


def chosen_task(args) -> tuple[AdmittedTask, dict[str, AdmittedTask]]:
    """``(the task named by args.task, every admitted task)`` from ``args.admitted``;
    an unknown name is a :class:`ConfigError` listing the admitted ones."""
    from coevo_jax.experiment import options

    admitted = load_admitted(args.admitted)
    return admitted[options.names(args.task, "--task", list(admitted))[0]], admitted
