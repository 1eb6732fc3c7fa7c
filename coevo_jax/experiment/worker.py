"""A worker: runs its share of every arm, batch by batch, chunk by chunk, checkpointing.

``python -m coevo_jax.experiment.worker OUT --worker-index W --num-workers N``
is what the launcher starts (one per core on CPU); ``run_worker`` is the same
in-process. For each arm it compiles ``init`` and one chunk of
``jit(vmap(Trainer.run_chunk))`` for its batch shape (or loads them from the
launch's program store, :mod:`coevo_jax.experiment.programs`), then per batch:
:func:`restore_or_init`, chunks with a checkpoint after each, and
:func:`finish_batch` (the batch's curves to ``a{arm}_b{batch}.npz``).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import threading
import time

import numpy as np

from coevo_jax.experiment import checkpoint
from coevo_jax.experiment.cpu_priority import lower_execution_priority
from coevo_jax.experiment.folder import atomic_savez, atomic_write_text
from coevo_jax.experiment.plan import build_plan, make_env, run_keys, worker_batches
from coevo_jax.experiment.programs import BATCH_AXIS, Program, compile_program, obtain_program, program_key
from coevo_jax.experiment.spec import Study, config_hash


WAITING = {"program": "waiting for {}'s program (another worker compiles it)",
           "turn": "waiting to compile {} (another worker is compiling)"}


class Stopped(Exception):
    """Raised inside a worker when ``stop_after_chunks`` is reached (a deliberate interruption)."""


def default_compile_cache() -> str:
    """``$COEVO_JAX_COMPILE_CACHE`` or ``~/.cache/coevo_jax/xla``."""
    return os.environ.get("COEVO_JAX_COMPILE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "coevo_jax",
                                                                      "xla")


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
                     "run_iterations": 0, "runs_done": 0, "peak_rss_mb": 0.0, "memory": {}, "compile_s": {},
                     "wait_s": {}, "program_source": {}, "compile_spans": [], "exec_s": 0.0, "pid": os.getpid()}

    def add(self, **kw):
        self.update(**{k: self.data[k] + v for k, v in kw.items()})

    def update(self, **kw):
        import resource

        self.data.update(kw, updated=time.time(),
                         peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
        atomic_write_text(self.path, json.dumps(self.data))
        if self.callback is not None:
            self.callback(dict(self.data))


def restore_or_init(program: Program, mngr, record, study: Study, seeds: np.ndarray, hp, host_local: bool):
    """``(state, curves, names, chunks_done)``: from the batch's checkpoint, or fresh from the runs' keys."""
    import jax

    got = checkpoint.restore(mngr, record, program.state_abstract, host_local, program.sharding)
    if got is not None:
        return got
    return program.init(jax.device_put(run_keys(study.base_seed, seeds), program.sharding), hp), None, None, 0


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
               stop_after_chunks: int | None = None, callback=None, compile_cache: str | None = None,
               program_store: str | None = None) -> str:
    """Run (or resume) worker ``worker``'s share of the study in ``out``.

    Writes ``out/checkpoints/w{worker}/``: one orbax folder per unfinished
    batch, ``a{arm}_b{batch}.npz`` per finished one and ``progress.json``.
    ``program_store``: the launch's folder of compiled programs, shared with
    the other workers it started (see :mod:`coevo_jax.experiment.programs`).
    Returns ``"done"`` or ``"stopped"`` (after ``stop_after_chunks`` chunks).
    """
    import jax

    text = open(os.path.join(out, "config.json")).read()
    study = Study.from_json(json.loads(text))
    plans = build_plan(study)  # imports every arm's code now, so all arms run the code as it was at start-up
    env, env_params = make_env(study)
    wdir = os.path.join(out, "checkpoints", f"w{worker}")
    os.makedirs(wdir, exist_ok=True)
    rep = Reporter(os.path.join(wdir, "progress.json"), callback)
    prev_cache = set_compile_cache(compile_cache) if compile_cache else None
    devices = jax.local_devices()
    host_local = jax.process_count() > 1  # orbax refuses host-local jax.Arrays under jax.distributed
    pin = os.environ.get("COEVO_JAX_WORKER_CPU")
    pin = {int(pin)} if pin is not None else None
    allowed = os.sched_getaffinity(0) if pin else None
    if pin:  # one worker per core: the others' compiles run before this worker's chunks (cpu_priority)
        rep.data["execution_threads_reniced"] = lower_execution_priority()
    layouts = [worker_batches(p, worker, num_workers, max_parallel, len(devices)) for p in plans]

    def done_path(ai, bi):
        return os.path.join(wdir, f"a{ai}_b{bi}.npz")

    chunks_run = 0
    programs = {}  # program_key -> Program, shared by the arms of this worker
    try:
        finished = [(p, len(r)) for ai, (p, (b, bs)) in enumerate(zip(plans, layouts)) for bi, r in enumerate(bs)
                    if os.path.exists(done_path(ai, bi))]
        steps = sum(n * p.num_iterations * p.arm.static.steps_per_iteration for p, n in finished)
        rep.update(status="running", env_steps=steps, env_steps_resumed=steps, devices=len(devices),
                   run_iterations=sum(n * p.num_iterations for p, n in finished),
                   runs_done=sum(n for _, n in finished))
        # rotated arm order: workers compile different arms first, then load the others from the launch's
        # program store (a worker that reaches a program another one is compiling waits for it)
        first = (worker * len(plans)) // max(1, num_workers)
        for ai in [(first + i) % len(plans) for i in range(len(plans))]:
            plan, (b, batches) = plans[ai], layouts[ai]
            todo = [bi for bi in range(len(batches)) if not os.path.exists(done_path(ai, bi))]
            if not todo:
                continue
            key = program_key(plan, b)
            if key in programs:  # an arm that differs from one compiled here only in hparam values
                program, compile_s, source = programs[key], 0.0, "shared"
            else:
                t0 = time.time()
                program, source, waited = obtain_program(
                    program_store, key, devices, lambda: _compile(plan, env, env_params, b, devices, rep, allowed, pin),
                    lambda what: rep.update(phase=WAITING[what].format(plan.arm.name)))
                programs[key], compile_s = program, time.time() - t0 - waited  # with the store's save or load
                rep.data["compile_spans"].append([t0 + waited, t0 + waited + compile_s])
                rep.data["wait_s"][plan.arm.name] = waited
            rep.data["compile_s"][plan.arm.name] = compile_s
            rep.data["program_source"][plan.arm.name] = source
            rep.data["memory"][plan.arm.name] = {"compiled_bytes_per_run": program.bytes_per_run, "batch": b}
            for bi in todo:
                chunks_run = run_batch(study, plan, program, batches[bi], b, os.path.join(wdir, f"a{ai}_b{bi}"),
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


def _compile(plan, env, env_params, b: int, devices, rep: Reporter, allowed, pin) -> Program:
    """Compile an arm's program on every core this worker may use, then pin it back to its own."""
    from coevo_jax.train import Trainer

    trainer = Trainer(plan.arm.static, env, env_params, batch_axis=BATCH_AXIS)
    rep.update(phase=f"compiling {plan.arm.name} ({b} runs/batch on {len(devices)} device(s))")
    set_thread_affinity(allowed)
    try:
        return compile_program(trainer, plan.hp, b, plan.chunk_len, devices)
    finally:
        set_thread_affinity(pin)


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
    state, curves, names, done = restore_or_init(program, mngr, record, study, seed, hp, host_local)
    steps_per_chunk = real * plan.chunk_len * plan.arm.static.steps_per_iteration
    if done:
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
        if chunks_run == _sigkill_after_chunks():  # a crash test: die with no clean-up at all
            os.kill(os.getpid(), signal.SIGKILL)
        rep.add(env_steps=steps_per_chunk, run_iterations=real * plan.chunk_len, exec_s=exec_s)
    mngr.close()
    finish_batch(f"{cdir}.npz", curves, names, runs, state, study.save_final)
    shutil.rmtree(cdir, ignore_errors=True)
    rep.add(runs_done=real)
    return chunks_run


def _sigkill_after_chunks() -> int | None:
    """``$COEVO_JAX_SIGKILL_AFTER_CHUNKS``: a worker kills itself with SIGKILL right after
    saving that many chunks (how the tests interrupt a study the way ``kill -9`` does)."""
    value = os.environ.get("COEVO_JAX_SIGKILL_AFTER_CHUNKS")
    return int(value) if value else None


def _exit_with_parent(poll_s: float = 2.0) -> None:
    """End this worker if the process that started it dies (so no orphan keeps computing)."""
    parent = os.getppid()

    def watch():
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m coevo_jax.experiment.worker",
                                description="A study's worker process (started by run_study; not for direct use).")
    p.add_argument("out", help="the study's output folder")
    p.add_argument("--worker-index", type=int, required=True)
    p.add_argument("--num-workers", type=int, required=True)
    p.add_argument("--max-parallel", type=int, default=None)
    p.add_argument("--stop-after-chunks", type=int, default=None)
    p.add_argument("--compile-cache", default=None)
    p.add_argument("--program-store", default=None)
    a = p.parse_args(argv)
    _exit_with_parent()
    status = run_worker(a.out, a.worker_index, a.num_workers, a.max_parallel, a.stop_after_chunks, None,
                        a.compile_cache, a.program_store)
    print(f"worker {a.worker_index}: {status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
