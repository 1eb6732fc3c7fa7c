"""Orbax checkpoints of one batch of runs: save after each chunk, restore, refuse a mismatch.

A checkpoint holds the batched :class:`~coevo_jax.train.TrainState`, the
metric curves so far (``[metrics, B, iterations]``) and a JSON record of what
it is (config hash, batch size, run indices, metric names). A checkpoint of
another config or another batch layout is refused, never resumed.
"""
from __future__ import annotations

import dataclasses
import os

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


def manager(path: str):
    """An orbax ``CheckpointManager`` keeping the latest step of ``path``; with
    ``jax.distributed`` each host writes its own batches, alone."""
    import jax
    import orbax.checkpoint as ocp

    mp = ocp.options.MultiprocessingOptions()
    if jax.process_count() > 1:
        mp = ocp.options.MultiprocessingOptions(primary_host=jax.process_index(),
                                                active_processes={jax.process_index()})
    os.makedirs(path, exist_ok=True)  # (orbax cannot create it itself when active_processes is set)
    return ocp.CheckpointManager(path, options=ocp.CheckpointManagerOptions(
        max_to_keep=1, enable_async_checkpointing=False, create=False, multiprocessing_options=mp))


def check_record(meta: dict, record: BatchRecord, where: str) -> None:
    """:class:`StudyError` unless the checkpoint ``meta`` was written for ``record``."""
    if meta.get("config_hash") != record.config_hash:
        raise StudyError(f"checkpoint {where} was written for a different config (hash {meta.get('config_hash')}"
                         f" != {record.config_hash}); refusing to resume it: rerun with --overwrite or a new --out")
    if meta.get("batch") != record.batch or tuple(meta.get("runs", ())) != record.runs:
        raise StudyError(f"checkpoint {where} holds runs {meta.get('runs')} in batches of {meta.get('batch')}, not"
                         f" {list(record.runs)} in batches of {record.batch} (another --processes/--max-parallel or"
                         " device count); rerun with the original ones or --overwrite")


def restore(mngr, record: BatchRecord, state_abstract, host_local: bool, sharding):
    """``(state, curves [M, B, I_done], names, chunks_done)`` from the latest
    complete checkpoint, or ``None`` when there is none. A step that cannot be read
    (a save cut short by a kill) is deleted, with a warning, and the one before it tried."""
    import jax
    import orbax.checkpoint as ocp

    for step in sorted(mngr.all_steps(), reverse=True):
        try:
            meta = mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
            check_record(meta, record, str(mngr.directory))
            curves_abs = jax.ShapeDtypeStruct((len(meta["names"]), record.batch, step * meta["chunk_len"]), np.float32)
            target = (state_abstract if not host_local
                      else jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), state_abstract))
            got = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target),
                                                             curves=ocp.args.StandardRestore(curves_abs)))
        except StudyError:
            raise
        except Exception as e:  # noqa: BLE001 (whatever orbax raises on a partial step)
            _discard(mngr, step, e)
            continue
        state = jax.device_put(got["state"], sharding) if host_local else got["state"]
        return state, np.asarray(got["curves"]), meta["names"], step
    return None


def _discard(mngr, step: int, error: Exception) -> None:
    """Delete the unreadable ``step`` of ``mngr`` (warning on stderr) so its batch reruns from the step before."""
    import shutil
    import sys

    path = os.path.join(str(mngr.directory), str(step))
    print(f"warning: checkpoint {path} is incomplete ({type(error).__name__}: {str(error).splitlines()[0][:200]});"
          " deleting it and resuming from the step before (or from the start)", file=sys.stderr)
    shutil.rmtree(path, ignore_errors=True)
    mngr.reload()


def save(mngr, chunks_done: int, state, curves: np.ndarray, meta: dict, host_local: bool) -> None:
    """Checkpoint the batch after ``chunks_done`` chunks (synchronously)."""
    import jax
    import orbax.checkpoint as ocp

    mngr.save(chunks_done, args=ocp.args.Composite(
        state=ocp.args.StandardSave(jax.device_get(state) if host_local else state),
        curves=ocp.args.StandardSave(curves), meta=ocp.args.JsonSave(meta)))
    mngr.wait_until_finished()
