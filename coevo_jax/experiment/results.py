"""A finished study's results: merged curves and the output folder's files, ``config.json``,
``curves.npz`` (every metric ``[runs, iterations]`` under ``metric/``, per-run metadata under
``run/``), ``run_info.json``, ``checkpoints/`` and, last, ``FINISHED``. No statistics here."""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import time

import jax
import numpy as np

from coevo_jax.experiment import checkpoint
from coevo_jax.experiment.folder import FINISHED_MARK, read_json
from coevo_jax.experiment.plan import ArmPlan, arm_hparams
from coevo_jax.experiment.spec import Study, StudyError
from coevo_jax.files import atomic_savez, atomic_write_text
from coevo_jax.train import Trainer


@dataclasses.dataclass
class StudyResult:
    """What a finished study returns (and wrote to ``out``)."""

    out: str
    study: Study
    curves: dict  # metric -> [runs, iterations] float32 (NaN where an arm lacks it / is shorter)
    runs: dict  # per-run metadata: arm, label, method, setting, seed, diverged, hp/<field> (NaN: not its method's)
    info: dict

    def select(self, label: str, **hp) -> np.ndarray:
        """Run indices of arm ``label`` whose HParams equal ``hp``, in seed order."""
        mask = self.runs["label"] == label
        for k, v in hp.items():
            mask &= np.isclose(self.runs[f"hp/{k}"], v)
        return np.nonzero(mask)[0]

    def arm(self, label: str):
        """``(index, Arm)`` of the arm named ``label``."""
        found = [(i, a) for i, a in enumerate(self.study.arms) if a.name == label]
        if not found:
            raise StudyError(f"no arm {label!r}; arms: {', '.join(a.name for a in self.study.arms)}")
        return found[0]

    def hparams(self, label: str):
        """Arm ``label``'s HParams as its runs used them: leaves ``[runs]`` (each run's grid point)."""
        _, arm = self.arm(label)
        setting = np.arange(len(arm.settings()) * self.study.num_seeds) // self.study.num_seeds
        return jax.tree.map(lambda x: np.asarray(x)[setting], arm_hparams(arm))

    def final_states(self, label: str):
        """Stacked final :class:`~coevo_jax.train.TrainState` of arm ``label``'s runs (needs
        ``save_final`` or ``save_chunks``)."""
        return self.chunk_states(label, None)

    def chunk_states(self, label: str, chunk: int | None):
        """Stacked :class:`~coevo_jax.train.TrainState` of arm ``label``'s runs after ``chunk`` chunks
        (``1 .. num_chunks``, ``None``: the last; needs ``save_chunks``)."""
        ai, arm = self.arm(label)
        num_runs = len(arm.settings()) * self.study.num_seeds
        shape = state_shape(self.study, arm)
        _, _, leaves = checkpoint.read_arm(batch_folders(self.out, ai), num_runs, chunk, shape)
        return jax.tree.unflatten(jax.tree.structure(shape), leaves)


def state_shape(study: Study, arm):
    """The abstract :class:`~coevo_jax.train.TrainState` of one run of ``arm``."""
    return jax.eval_shape(Trainer(arm.static, *study.make_env()).init, jax.random.PRNGKey(0), arm_hparams(arm))


def batch_folders(out: str, arm_index: int) -> list[str]:
    """The checkpoint folders of arm ``arm_index``'s batches."""
    return sorted(glob.glob(os.path.join(out, "checkpoints", f"a{arm_index}_b*")))


def merge_batches(out: str, plans: list[ArmPlan]) -> list[dict]:
    """Every batch's curves from its last checkpoint, per arm: ``[{metric: [R, I]}]``."""
    per_arm = []
    for ai, plan in enumerate(plans):
        names, curves, _ = checkpoint.read_arm(batch_folders(out, ai), plan.num_runs)
        per_arm.append(dict(zip(names, curves)))
    return per_arm


def assemble(study: Study, plans: list[ArmPlan], per_arm) -> tuple[dict, dict]:
    """``(curves {metric: [runs, I]}, runs {column: [runs]})`` over all arms, arm after arm."""
    total, iters = sum(p.num_runs for p in plans), max(p.num_iterations for p in plans)
    names = sorted({n for blocks in per_arm for n in blocks})
    curves = {n: np.full((total, iters), np.nan, np.float32) for n in names}
    parts, start = [], 0  # per arm: {column: [its runs]}
    fields = dict.fromkeys(f for p in plans for f in p.hp.as_dict())  # hp/<field>: NaN in arms without the field
    for ai, (plan, blocks) in enumerate(zip(plans, per_arm)):
        n, r = plan.num_runs, np.arange(plan.num_runs)
        for name, arr in blocks.items():
            curves[name][start:start + n, :arr.shape[1]] = arr
        parts.append({"arm": np.full(n, ai), "label": np.full(n, plan.arm.name),
                      "method": np.full(n, plan.arm.static.method), "setting": r // study.num_seeds,
                      "seed": r % study.num_seeds, "diverged": blocks["diverged"][:, -1] > 0,
                      **{f"hp/{f}": np.asarray(plan.hp.as_dict().get(f, np.full(len(plan.settings), np.nan)),
                                               np.float64)[r // study.num_seeds] for f in fields}})
        start += n
    return curves, {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def write_outputs(out: str, curves, runs, info) -> None:
    """``curves.npz`` and ``run_info.json``; then ``FINISHED``."""
    atomic_savez(os.path.join(out, "curves.npz"), **{f"metric/{k}": v for k, v in curves.items()},
                 **{f"run/{k}": v for k, v in runs.items()})
    atomic_write_text(os.path.join(out, "run_info.json"), json.dumps(info, indent=1, default=float))
    atomic_write_text(os.path.join(out, FINISHED_MARK), time.strftime("%Y-%m-%d %H:%M:%S") + "\n")


def load_result(out: str) -> StudyResult:
    """Read a finished study folder back."""
    if not os.path.exists(os.path.join(out, FINISHED_MARK)):
        raise StudyError(f"{out} holds no finished study")
    study = Study.from_json(json.loads(open(os.path.join(out, "config.json")).read()))
    with np.load(os.path.join(out, "curves.npz"), allow_pickle=False) as z:
        curves = {k[len("metric/"):]: z[k] for k in z.files if k.startswith("metric/")}
        runs = {k[len("run/"):]: z[k] for k in z.files if k.startswith("run/")}
    return StudyResult(out, study, curves, runs, read_json(os.path.join(out, "run_info.json"), {}))
