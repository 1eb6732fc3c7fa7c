"""Worker processes and the progress bar.

On CPU a study runs one worker subprocess per core, each pinned to its core
with single-threaded Eigen (on the 2-core machines this is where the speed-up
comes from); the parent polls their ``progress.json`` files into one bar. With
``jax.distributed`` each host launches its own workers and :func:`barrier`
synchronises the hosts.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from coevo_jax.experiment.folder import read_json
from coevo_jax.experiment.spec import StudyError


def fmt_time(s: float) -> str:
    if not np.isfinite(s):
        return "?"
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Progress:
    """Aggregates the workers' progress into one bar on stdout: runs, iterations, env steps/s, ETA
    (redrawn every 0.5 s on a terminal, a line every 10 s otherwise). Used from one thread only."""

    def __init__(self, total_runs: int, total_iters: int, total_steps: int, enabled: bool = True):
        self.total_runs, self.total_iters, self.total_steps = total_runs, total_iters, total_steps
        self.enabled = enabled
        self.stream = sys.stdout
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.interval = 0.5 if self.tty else 10.0
        self.workers: dict[int, dict] = {}
        self.t0 = time.time()
        self.t_first = None  # when new (non-resumed) env steps first appeared
        self.steps_first = 0
        self.last_print = 0.0
        self.last_line = ""

    def set(self, worker: int, data: dict):
        self.workers[worker] = data

    def line(self) -> str:
        runs, iters, steps, resumed = (sum(d.get(k, 0) for d in self.workers.values())
                                       for k in ("runs_done", "run_iterations", "env_steps", "env_steps_resumed"))
        now = time.time()
        new = steps - resumed
        if new > 0 and self.t_first is None:
            self.t_first, self.steps_first = now, new
        rate = (new - self.steps_first) / (now - self.t_first) if self.t_first and now > self.t_first else 0.0
        eta = (self.total_steps - steps) / rate if rate > 0 else float("nan")
        frac = iters / max(1, self.total_iters)
        bar = "#" * int(frac * 20) + "." * (20 - int(frac * 20))
        phases = {w: d.get("phase", "") for w, d in sorted(self.workers.items())}
        if not phases:
            phase = "starting workers"
        elif len(set(phases.values())) == 1:
            phase = next(iter(phases.values()))
        else:
            phase = "; ".join(f"w{w}: {p}" for w, p in phases.items())
        return (f"[{bar}] {100 * frac:5.1f}% runs {runs}/{self.total_runs} | iters {iters}/{self.total_iters}"
                f" | {rate:,.0f} env steps/s | elapsed {fmt_time(now - self.t0)} | ETA {fmt_time(eta)} | {phase}")

    def show(self, force: bool = False):
        if not self.enabled:
            return
        now = time.time()
        if not force and now - self.last_print < self.interval:
            return
        text = self.line()
        if text == self.last_line and not force:
            return
        self.last_print, self.last_line = now, text
        self.stream.write("\r\x1b[2K" + text if self.tty else text + "\n")
        self.stream.flush()

    def close(self):
        if self.enabled:
            self.show(force=True)
            if self.tty:
                self.stream.write("\n")
                self.stream.flush()


def worker_env(cpu: int | None, config_flags: str = "") -> dict:
    """Environment for a worker subprocess: the no-hang scheduler flag and single-threaded Eigen
    (``$COEVO_JAX_WORKER_XLA_FLAGS``, when set, replaces the inherited flags and the Eigen ones)."""
    env = dict(os.environ)
    flags = env.get("XLA_FLAGS", "")
    extra = ["--xla_cpu_enable_concurrency_optimized_scheduler=false", "--xla_cpu_multi_thread_eigen=false",
             "intra_op_parallelism_threads=1"]
    if "COEVO_JAX_WORKER_XLA_FLAGS" in env:  # an explicit choice (e.g. to share a cache with this process)
        flags, extra = env["COEVO_JAX_WORKER_XLA_FLAGS"], extra[:1]
    extra += config_flags.split()
    for f in extra:
        if f.split("=")[0] not in flags:
            flags += " " + f
    env["XLA_FLAGS"] = flags.strip()
    env["OMP_NUM_THREADS"] = "1"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if cpu is not None:
        env["COEVO_JAX_WORKER_CPU"] = str(cpu)
    return env


def launch_workers(out, worker_ids, num_workers, cap, stop_after_chunks, compile_cache, progress: Progress,
                    config_flags: str = ""):
    """Start one subprocess per worker id, poll their progress files, return their statuses."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:
        cpus = []
    wdirs = {w: os.path.join(out, "checkpoints", f"w{w}") for w in worker_ids}
    procs = {}
    logs = {}
    store = tempfile.mkdtemp(prefix="coevo_jax_programs_")  # this launch's compiled programs (experiment.programs)
    try:
        for i, w in enumerate(worker_ids):
            os.makedirs(wdirs[w], exist_ok=True)
            cmd = [sys.executable, "-m", "coevo_jax.experiment.worker", out, "--worker-index", str(w),
                   "--num-workers", str(num_workers)]
            for flag, value in (("--max-parallel", cap), ("--stop-after-chunks", stop_after_chunks),
                                ("--compile-cache", compile_cache), ("--program-store", store)):
                cmd += [] if value is None else [flag, str(value)]
            cpu = cpus[i % len(cpus)] if cpus else None
            logs[w] = open(os.path.join(wdirs[w], "log.txt"), "w")
            procs[w] = subprocess.Popen(cmd, env=worker_env(cpu, config_flags), stdout=logs[w],
                                        stderr=subprocess.STDOUT)
        while True:
            for w in worker_ids:
                d = read_json(os.path.join(wdirs[w], "progress.json"))
                if d is not None:
                    progress.set(w, d)
            progress.show()
            codes = {w: p.poll() for w, p in procs.items()}
            failed = [w for w, c in codes.items() if c not in (None, 0)]
            if failed:
                w = failed[0]
                logs[w].flush()
                tail = open(os.path.join(wdirs[w], "log.txt")).read().strip().splitlines()
                msg = next((ln for ln in reversed(tail) if ln.strip() and not ln.startswith(" ")), "no output")
                raise StudyError(f"worker {w} failed (exit {codes[w]}): {msg}"
                                 f" [log: {os.path.join(wdirs[w], 'log.txt')}]")
            if all(c == 0 for c in codes.values()):
                break
            time.sleep(0.5)
        for w in worker_ids:
            progress.set(w, read_json(os.path.join(wdirs[w], "progress.json"), {}))
        return {w: progress.workers[w].get("status", "missing") for w in worker_ids}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        for f in logs.values():
            f.close()
        shutil.rmtree(store, ignore_errors=True)


def barrier(name: str, timeout_s: int = 3600) -> None:
    """Wait for every host (a no-op without ``jax.distributed``): the coordination
    service's barrier, which needs no cross-host collective on the devices."""
    import jax

    if jax.process_count() <= 1:
        return
    from jax._src import distributed  # the public API has no barrier without a device computation

    distributed.global_state.client.wait_at_barrier(name, timeout_s * 1000)
