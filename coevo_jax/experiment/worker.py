"""A worker: compiles each arm's batch program and runs its share of every arm, chunk by chunk, checkpointing.

``python -m coevo_jax.experiment.worker OUT --coordinator H:P --num-processes N --process-id I``
is one ``jax.distributed`` process (the launcher starts one per core on CPU);
``run_worker`` is the same in-process. For each arm it compiles ``init`` and
one chunk of ``jit(vmap(Trainer.run_chunk))`` for its batch shape (a program
compiled before, by this or an earlier study, comes from JAX's persistent
compilation cache), then per batch: :func:`restore_or_init`, chunks with a
checkpoint after each, and :func:`finish_batch` (curves to ``a{arm}_b{batch}.npz``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import sys
import threading
import time

import numpy as np

from coevo_jax.experiment import checkpoint
from coevo_jax.experiment.plan import build_plan, run_keys, worker_batches
from coevo_jax.experiment.spec import Study, StudyError, config_hash
from coevo_jax.files import atomic_savez, atomic_write_text
from coevo_jax.registry import method_spec

BATCH_AXIS = "runs"  # the vmapped (and sharded) run axis; K-gated refits branch on it (Trainer.batch_axis)
# ``init`` runs once per batch: compiled without LLVM optimisation it compiles ~3x faster and its run time
# (network init, env reset) stays negligible
INIT_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0}


class Stopped(Exception):
    """Raised inside a worker when ``stop_after_chunks`` is reached (a deliberate interruption)."""


@dataclasses.dataclass
class Program:
    """One arm's compiled batch program: ``init(keys, hp)``, ``chunk(state, hp)``."""

    init: object
    chunk: object
    state_abstract: object
    sharding: object
    bytes_per_run: float


def compile_program(trainer, hp, b: int, chunk_len: int, devices) -> Program:
    """Compile ``init`` and one ``chunk_len``-iteration chunk for ``b`` runs sharded over ``devices``."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    sharding = NamedSharding(Mesh(np.asarray(devices), (BATCH_AXIS,)), PartitionSpec(BATCH_AXIS))

    def init_batch(keys, hp):
        return jax.vmap(trainer.init)(keys, hp)

    def chunk_batch(state, hp):
        return jax.vmap(lambda s, h: trainer.run_chunk(s, h, chunk_len), axis_name=BATCH_AXIS)(state, hp)

    def spec(x):
        return jax.ShapeDtypeStruct((b,) + x.shape[1:], x.dtype, sharding=sharding)

    keys_abs, hp_abs = jax.ShapeDtypeStruct((b, 2), np.uint32, sharding=sharding), jax.tree.map(spec, hp)
    init_c = jax.jit(init_batch, out_shardings=sharding).lower(keys_abs, hp_abs).compile(INIT_COMPILER_OPTIONS)
    state_abs = jax.tree.map(spec, jax.eval_shape(init_batch, keys_abs, hp_abs))
    chunk_c = jax.jit(chunk_batch, out_shardings=sharding, donate_argnums=0).lower(state_abs, hp_abs).compile()
    m = chunk_c.memory_analysis()
    per_run = float("nan") if m is None else (
        m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes) / b
    return Program(init_c, chunk_c, state_abs, sharding, per_run)


def program_key(plan, b: int) -> tuple:
    """What a compiled batch program depends on: the arm's static config less its method
    name, what the method traces (its spec's factory and intrinsic stream; its params
    class is in the hparams' structure), the batch and chunk sizes and the hparams'
    structure (not their values, which are inputs). Methods equal in all of these
    (``ppo`` and ``dense``, ``coevo-regression`` and ``coevo-ranking``) share a program."""
    import jax

    spec = method_spec(plan.arm.static.method)
    leaves, treedef = jax.tree.flatten(plan.hp)
    return (plan.arm.static.replace(method=""), spec.factory, spec.intrinsic_stream, b, plan.chunk_len, treedef,
            tuple((np.shape(x)[1:], np.asarray(x).dtype) for x in leaves))


def default_compile_cache() -> str:
    """``$COEVO_JAX_COMPILE_CACHE`` or ``~/.cache/coevo_jax/xla``."""
    return os.environ.get("COEVO_JAX_COMPILE_CACHE") or os.path.expanduser("~/.cache/coevo_jax/xla")


def set_compile_cache(path: str | None) -> str | None:
    """Point JAX's persistent compilation cache at ``path``; returns the previous folder."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc

    prev = jax.config.jax_compilation_cache_dir
    if path:
        os.makedirs(path, exist_ok=True)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    jax.config.update("jax_compilation_cache_dir", path)
    cc.reset_cache()
    return prev


def set_thread_affinity(cpus) -> None:
    """Pin every thread of this process (XLA's pools included) to ``cpus`` (Linux; else a no-op)."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return
    for tid in (int(t) for t in os.listdir("/proc/self/task")):
        try:
            os.sched_setaffinity(tid, set(cpus))
        except OSError:  # the thread ended meanwhile
            pass


class Reporter:
    """A worker's progress, written to ``progress.json`` (and passed to a callback in-process)."""

    def __init__(self, path: str, callback=None):
        self.path, self.callback = path, callback
        self.data = {"status": "starting", "phase": "starting", "env_steps": 0, "env_steps_resumed": 0,
                     "run_iterations": 0, "runs_done": 0, "memory": {}, "compile_s": {}, "exec_s": 0.0}

    def add(self, **kw):
        self.update(**{k: self.data[k] + v for k, v in kw.items()})

    def update(self, **kw):
        import resource

        self.data.update(kw, peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
        atomic_write_text(self.path, json.dumps(self.data))
        if self.callback is not None:
            self.callback(dict(self.data))


def state_arrays(host_state, real: int) -> dict:
    """``{"state/i": leaf i [real, ...]}``: the TrainState leaves of a batch's real runs."""
    import jax

    return {f"state/{i}": np.asarray(x)[:real] for i, x in enumerate(jax.tree.leaves(host_state))}


def finish_batch(path: str, curves: np.ndarray, names, runs: np.ndarray, state, save_final: bool) -> None:
    """Write the batch's real runs: curves ``[M, R, I]``, names, run indices,
    divergence flags (and, with ``save_final``, the final TrainState leaves)."""
    import jax

    real = len(runs)
    host = jax.device_get(state)
    arrays = {"curves": curves[:, :real], "names": np.asarray(names), "runs": np.asarray(runs),
              "diverged": np.asarray(host.diverged)[:real]}
    if save_final:
        arrays.update(state_arrays(host, real))
    atomic_savez(path, **arrays)


def run_worker(out: str, worker: int, num_workers: int, max_parallel: int | None = None,
               stop_after_chunks: int | None = None, callback=None, compile_cache: str | None = None) -> str:
    """Run (or resume) worker ``worker``'s share of the study in ``out``.

    Writes ``out/checkpoints/w{worker}/``: one orbax folder per unfinished
    batch, ``a{arm}_b{batch}.npz`` per finished one and ``progress.json``.
    Returns ``"done"`` or ``"stopped"`` (after ``stop_after_chunks`` chunks).
    """
    import jax

    from coevo_jax.train import Trainer

    text = open(os.path.join(out, "config.json")).read()
    study = Study.from_json(json.loads(text))
    plans = build_plan(study)  # imports every arm's code now, so all arms run the code as it was at start-up
    env, env_params = study.make_env()
    wdir = os.path.join(out, "checkpoints", f"w{worker}")
    os.makedirs(wdir, exist_ok=True)
    rep = Reporter(os.path.join(wdir, "progress.json"), callback)
    prev_cache = set_compile_cache(compile_cache) if compile_cache else None
    devices = jax.local_devices()
    host_local = jax.process_count() > 1  # orbax refuses host-local jax.Arrays under jax.distributed
    pin = os.environ.get("COEVO_JAX_WORKER_CPU")  # one worker per core: it compiles on all, runs on its own
    pin, allowed = ({int(pin)}, os.sched_getaffinity(0)) if pin is not None else (None, None)
    chunks_run, programs = 0, {}  # program_key -> Program, shared by the arms of this worker
    try:
        rep.update(status="running", devices=len(devices), processes=jax.process_count())
        for ai, plan in enumerate(plans):
            b, batches = worker_batches(plan, worker, num_workers, max_parallel, len(devices))
            todo = [bi for bi in range(len(batches)) if not os.path.exists(os.path.join(wdir, f"a{ai}_b{bi}.npz"))]
            n = sum(len(r) for bi, r in enumerate(batches) if bi not in todo)  # runs finished before a resume
            steps = n * plan.num_iterations * plan.arm.static.steps_per_iteration
            rep.add(env_steps=steps, env_steps_resumed=steps, run_iterations=n * plan.num_iterations, runs_done=n)
            if not todo:
                continue
            key, t0 = program_key(plan, b), time.time()
            rep.data["compile_s"][plan.arm.name] = 0.0  # an arm that differs from one compiled here only in hparams
            if key not in programs:
                rep.update(phase=f"compiling {plan.arm.name} ({b} runs/batch on {len(devices)} device(s))")
                set_thread_affinity(allowed)
                try:
                    programs[key] = compile_program(Trainer(plan.arm.static, env, env_params, batch_axis=BATCH_AXIS),
                                                    plan.hp, b, plan.chunk_len, devices)
                finally:
                    set_thread_affinity(pin)
                rep.data["compile_s"][plan.arm.name] = time.time() - t0
            rep.data["memory"][plan.arm.name] = {"compiled_bytes_per_run": programs[key].bytes_per_run, "batch": b}
            for bi in todo:
                chunks_run = run_batch(study, plan, programs[key], batches[bi], b, os.path.join(wdir, f"a{ai}_b{bi}"),
                                       config_hash(text), rep, host_local, chunks_run, stop_after_chunks,
                                       f"{plan.arm.name} batch {bi + 1}/{len(batches)}")
        rep.update(status="done", phase="done")
        return "done"
    except Stopped:
        rep.update(status="stopped", phase=f"stopped after {chunks_run} chunk(s)")
        return "stopped"
    except BaseException as e:
        rep.update(status="error", phase=f"{type(e).__name__}: {e}".splitlines()[0][:300])
        raise
    finally:
        if compile_cache:
            set_compile_cache(prev_cache)


def run_batch(study: Study, plan, program: Program, runs: np.ndarray, b: int, cdir: str, digest: str,
              rep: Reporter, host_local: bool, chunks_run: int, stop_after: int | None, label: str) -> int:
    """Run one batch to the end from its checkpoint (or from scratch); returns the
    worker's chunk count. Raises :class:`Stopped` after ``stop_after`` chunks."""
    import jax

    real = len(runs)
    padded = np.concatenate([runs, np.repeat(runs[-1:], b - real)])  # copies of a real run, dropped at the end
    setting, seed = padded // study.num_seeds, padded % study.num_seeds
    hp = jax.tree.map(lambda x: jax.device_put(np.asarray(x)[setting], program.sharding), plan.hp)
    record = checkpoint.BatchRecord(digest, b, tuple(int(r) for r in runs))
    mngr = checkpoint.manager(os.path.abspath(cdir))
    got = checkpoint.restore(mngr, record, program.state_abstract, host_local, program.sharding)
    state, curves, names, done = got or (program.init(jax.device_put(run_keys(study.base_seed, seed),
                                                                     program.sharding), hp), None, None, 0)
    steps_per_chunk = real * plan.chunk_len * plan.arm.static.steps_per_iteration
    rep.add(env_steps_resumed=done * steps_per_chunk, env_steps=done * steps_per_chunk,
            run_iterations=real * done * plan.chunk_len)
    n_chunks = plan.num_iterations // plan.chunk_len
    while done < n_chunks:
        if stop_after is not None and chunks_run >= stop_after:
            mngr.close()
            raise Stopped()
        rep.update(phase=f"{label} chunk {done + 1}/{n_chunks}")
        t0 = time.time()
        state, metrics = program.chunk(state, hp)
        metrics = jax.device_get(metrics)
        exec_s = time.time() - t0  # the chunk alone (checkpointing is timed apart)
        names = names or sorted(metrics)
        block = np.stack([np.asarray(metrics[n], np.float32) for n in names])
        curves = block if curves is None else np.concatenate([curves, block], axis=-1)
        done, chunks_run = done + 1, chunks_run + 1
        if study.save_chunks:  # before the checkpoint: a resumed chunk rewrites its snapshot identically
            atomic_savez(f"{cdir}_c{done}.npz", runs=np.asarray(runs), **state_arrays(jax.device_get(state), real))
        checkpoint.save(mngr, done, state, curves, record.meta(names, plan.chunk_len), host_local)
        if chunks_run == int(os.environ.get("COEVO_JAX_SIGKILL_AFTER_CHUNKS") or -1):  # a crash test (kill -9)
            os.kill(os.getpid(), signal.SIGKILL)
        rep.add(env_steps=steps_per_chunk, run_iterations=real * plan.chunk_len, exec_s=exec_s)
    mngr.close()
    finish_batch(f"{cdir}.npz", curves, names, runs, state, study.save_final)
    shutil.rmtree(cdir, ignore_errors=True)
    rep.add(runs_done=real)
    return chunks_run


def main(argv=None) -> int:
    """One ``jax.distributed`` process of a study: join, wait for the folder, run this share, wait for all."""
    import jax

    from coevo_jax.experiment.launcher import barrier

    p = argparse.ArgumentParser(prog="python -m coevo_jax.experiment.worker",
                                description="A study's worker process (started by run_study; not for direct use).")
    p.add_argument("out", help="the study's output folder (prepared by process 0's launcher)")
    for flag in ("--coordinator", "--compile-cache", "--config-hash"):
        p.add_argument(flag, default=None)
    for flag in ("--num-processes", "--process-id", "--max-parallel", "--stop-after-chunks"):
        p.add_argument(flag, type=int, default=None)
    a = p.parse_args(argv)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    jax.distributed.initialize(a.coordinator, a.num_processes, a.process_id)
    barrier("coevo_jax_study_prepared")
    if config_hash(open(os.path.join(a.out, "config.json")).read()) != a.config_hash:
        raise StudyError(f"process {a.process_id}: {a.out}/config.json differs from this host's study")
    status = run_worker(a.out, a.process_id, a.num_processes, a.max_parallel, a.stop_after_chunks, None,
                        a.compile_cache)
    barrier("coevo_jax_study_done")  # so process 0 merges only once every process has finished or stopped
    print(f"worker {a.process_id}: {status}")
    return 0


def _exit_with_parent(parent: int) -> None:
    """End this worker when the launcher that started it dies (so no orphan keeps computing)."""
    while os.getppid() == parent:
        time.sleep(2.0)
    os._exit(3)


if __name__ == "__main__":
    sys.exit(main())
