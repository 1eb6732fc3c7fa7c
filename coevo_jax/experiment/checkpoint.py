"""Orbax checkpoints of one batch of runs, the runner's storage format: the batched
:class:`~coevo_jax.train.TrainState`, the curves so far ``[metrics, B, iterations]`` and a JSON
record (config hash, batch size, run indices, metric names). A mismatched checkpoint is refused,
never resumed; a batch's folder keeps its last step (every step with ``save_chunks``)."""
from __future__ import annotations

import dataclasses
import os
import shutil
import sys

import jax
import numpy as np

from coevo_jax.experiment.spec import StudyError


@dataclasses.dataclass(frozen=True)
class BatchRecord:
    """What a batch checkpoint must match to be resumed."""

    config_hash: str
    batch: int
    runs: tuple

    def meta(self, names, chunk_len: int) -> dict:
        return {"config_hash": self.config_hash, "batch": self.batch, "runs": list(self.runs), "names": names,
                "chunk_len": chunk_len}


def _orbax():
    """``orbax.checkpoint``, imported on first use (kept lazy: importing it configures the root logger,
    absl calling ``logging.basicConfig()``, which importing :mod:`coevo_jax.experiment` must not do)."""
    import orbax.checkpoint as ocp

    return ocp


def _open(path: str, **options):
    """An orbax ``CheckpointManager`` of ``path`` (absolute; synchronous saves; every host writes its
    devices' part)."""
    ocp = _orbax()
    return ocp.CheckpointManager(os.path.abspath(path), options=ocp.CheckpointManagerOptions(enable_async_checkpointing=False,
                                                                            **options))


def manager(path: str, keep_all: bool = False):
    """An orbax ``CheckpointManager`` of ``path`` keeping the latest step (``keep_all``: every step)."""
    return _open(path, max_to_keep=None if keep_all else 1)


def check_record(meta: dict, record: BatchRecord, where: str) -> None:
    """:class:`StudyError` unless the checkpoint ``meta`` was written for ``record``."""
    if meta.get("config_hash") != record.config_hash:
        raise StudyError(f"checkpoint {where} was written for a different config (hash {meta.get('config_hash')}"
                         f" != {record.config_hash}); refusing to resume it: rerun with --overwrite or a new --out")
    if meta.get("batch") != record.batch or tuple(meta.get("runs", ())) != record.runs:
        raise StudyError(f"checkpoint {where} holds runs {meta.get('runs')} in batches of {meta.get('batch')}, not"
                         f" {list(record.runs)} in batches of {record.batch} (another --devices/--max-parallel or"
                         " host count); rerun with the original ones or --overwrite")


def restore(mngr, record: BatchRecord, state_abstract, curves_sharding):
    """``(state, curves [M, B, I_done], names, chunks_done)`` from the latest complete checkpoint, or
    ``None``; an unreadable step (a save cut short) is deleted with a warning and the one before tried."""
    ocp = _orbax()
    for step in sorted(mngr.all_steps(), reverse=True):
        try:
            meta = mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
            check_record(meta, record, str(mngr.directory))
            curves_abs = jax.ShapeDtypeStruct((len(meta["names"]), record.batch, step * meta["chunk_len"]), np.float32,
                                              sharding=curves_sharding)
            got = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(state_abstract),
                                                             curves=ocp.args.StandardRestore({"curves": curves_abs})))
        except StudyError:
            raise
        except Exception as e:  # noqa: BLE001 (whatever orbax raises on a partial step)
            _discard(mngr, step, e)
            continue
        return got["state"], got["curves"]["curves"], meta["names"], step
    return None


def _discard(mngr, step: int, error: Exception) -> None:
    """Delete the unreadable ``step`` of ``mngr`` (warning on stderr) so its batch reruns from the step before."""
    path = os.path.join(str(mngr.directory), str(step))
    print(f"warning: checkpoint {path} is incomplete ({type(error).__name__}: {str(error).splitlines()[0][:200]});"
          " deleting it and resuming from the step before (or from the start)", file=sys.stderr)
    shutil.rmtree(path, ignore_errors=True)
    mngr.reload()


def save(mngr, chunks_done: int, state, curves, meta: dict) -> None:
    """Checkpoint the batch after ``chunks_done`` chunks (synchronously; ``state=None``: curves only)."""
    ocp = _orbax()
    items = {"curves": ocp.args.StandardSave({"curves": curves}), "meta": ocp.args.JsonSave(meta)}
    mngr.save(chunks_done, args=ocp.args.Composite(
        **items, **({} if state is None else {"state": ocp.args.StandardSave(state)})))
    mngr.wait_until_finished()


def finished(path: str, num_chunks: int) -> bool:
    """Whether the batch folder ``path`` holds a checkpoint after its last chunk."""
    return os.path.isdir(os.path.join(path, str(num_chunks)))


def read(path: str, step: int | None = None, state_shape=None) -> dict:
    """Step ``step`` (default the last) of the batch folder ``path`` as NumPy: ``{"meta", "curves" [M, B,
    I], "state"}`` (``state`` only given ``state_shape``, one run's abstract state)."""
    ocp = _orbax()
    with _open(path, read_only=True) as mngr:
        step = mngr.latest_step() if step is None else step
        if step not in mngr.all_steps():
            raise StudyError(f"{path} holds no checkpoint after chunk {step} (steps: {sorted(mngr.all_steps())})")
        if state_shape is not None and not os.path.isdir(os.path.join(path, str(step), "state")):
            raise StudyError(f"{path} kept no state after chunk {step} (run the study with save_final=True, or"
                             " save_chunks=True for every chunk)")
        meta = mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        shape = (len(meta["names"]), meta["batch"], step * meta["chunk_len"])
        args = {"curves": ocp.args.StandardRestore({"curves": np.zeros(shape, np.float32)})}
        if state_shape is not None:
            target = jax.tree.map(lambda x: np.zeros((meta["batch"],) + x.shape, x.dtype), state_shape)
            args["state"] = ocp.args.StandardRestore(target)
        got = mngr.restore(step, args=ocp.args.Composite(**args))
    return {"meta": meta, "curves": np.asarray(got["curves"]["curves"]),
            "state": jax.device_get(got["state"]) if state_shape is not None else None}


def read_arm(folders, num_runs: int, step: int | None = None, state_shape=None):
    """``(names, curves [M, R, I], state leaves [R, ...] or None)`` of one arm's batches at ``step``,
    placed by run index; :class:`StudyError` unless they hold every run once."""
    names, curves, leaves, seen = None, None, None, np.zeros(num_runs, int)
    for path in folders:
        got = read(path, step, state_shape)
        runs = np.asarray(got["meta"]["runs"])
        names = names or list(got["meta"]["names"])
        block = got["curves"][:, :len(runs)]
        curves = np.full((len(names), num_runs, block.shape[-1]), np.nan, np.float32) if curves is None else curves
        curves[:, runs] = block
        if state_shape is not None:
            parts = jax.tree.leaves(got["state"])
            leaves = leaves or [np.zeros((num_runs,) + x.shape[1:], x.dtype) for x in parts]
            for leaf, x in zip(leaves, parts):
                leaf[runs] = x[:len(runs)]
        seen[runs] += 1
    if not (seen == 1).all():
        raise StudyError(f"checkpoints {', '.join(folders) or '(none)'} hold runs {np.nonzero(seen != 1)[0].tolist()}"
                         " not exactly once; rerun with --overwrite")
    return names, curves, leaves
