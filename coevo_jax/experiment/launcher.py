"""Worker processes and the progress bar.

Every worker process is one ``jax.distributed`` process: on one host the
launcher starts P of them with a coordinator on the loopback address; over
several hosts each host's launcher starts its P, all joining one coordinator.
On CPU each is pinned to a core with single-threaded Eigen (on the 2-core
machines this is where the speed-up comes from). The launcher polls their
``progress.json`` files into one bar; :func:`barrier` synchronises them.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
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
    """The workers' progress (``set(worker, progress.json data)``) as one line on stdout: runs,
    iterations, env steps/s, ETA, phase (redrawn every 0.5 s on a terminal, a line every 10 s otherwise)."""

    def __init__(self, total_runs: int, total_iters: int, total_steps: int, enabled: bool = True):
        self.totals, self.enabled, self.workers = (total_runs, total_iters, total_steps), enabled, {}
        self.tty = sys.stdout.isatty()
        self.t0, self.first, self.last_print = time.time(), None, 0.0  # first: (time, steps) of the first new steps

    def set(self, worker: int, data: dict):
        self.workers[worker] = data

    def line(self) -> str:
        runs, iters, steps, resumed = (sum(d.get(k, 0) for d in self.workers.values())
                                       for k in ("runs_done", "run_iterations", "env_steps", "env_steps_resumed"))
        now = time.time()
        if steps > resumed and self.first is None:
            self.first = (now, steps)
        rate = (steps - self.first[1]) / (now - self.first[0]) if self.first and now > self.first[0] else 0.0
        frac = iters / max(1, self.totals[1])
        phases = {w: d.get("phase", "") for w, d in sorted(self.workers.items())}
        phase = (next(iter(phases.values())) if len(set(phases.values())) == 1
                 else "; ".join(f"w{w}: {p}" for w, p in phases.items()) or "starting workers")
        return (f"[{'#' * int(frac * 20):.<20}] {100 * frac:5.1f}% runs {runs}/{self.totals[0]} | iters {iters}/"
                f"{self.totals[1]} | {rate:,.0f} env steps/s | elapsed {fmt_time(now - self.t0)} | ETA"
                f" {fmt_time((self.totals[2] - steps) / rate if rate > 0 else float('nan'))} | {phase}")

    def show(self, force: bool = False):
        if self.enabled and (force or time.time() - self.last_print >= (0.5 if self.tty else 10.0)):
            self.last_print = time.time()
            sys.stdout.write("\r\x1b[2K" + self.line() if self.tty else self.line() + "\n")
            sys.stdout.flush()

    def close(self):
        self.show(force=True)
        if self.enabled and self.tty:
            sys.stdout.write("\n")


def worker_env(cpu: int | None, config_flags: str = "") -> dict:
    """Environment for a worker subprocess: the no-hang scheduler flag and single-threaded Eigen
    (``$COEVO_JAX_WORKER_XLA_FLAGS``, when set, replaces the inherited flags and the Eigen ones)."""
    env = dict(os.environ)
    flags = env.get("XLA_FLAGS", "")
    extra = ["--xla_cpu_enable_concurrency_optimized_scheduler=false", "--xla_cpu_multi_thread_eigen=false",
             "intra_op_parallelism_threads=1"]
    if "COEVO_JAX_WORKER_XLA_FLAGS" in env:  # an explicit choice (e.g. to share a cache with this process)
        flags, extra = env["COEVO_JAX_WORKER_XLA_FLAGS"], extra[:1]
    for f in extra + config_flags.split():
        if f.split("=")[0] not in flags:
            flags += " " + f
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env.update(XLA_FLAGS=flags.strip(), OMP_NUM_THREADS="1",
               PYTHONPATH=root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""))
    if cpu is not None:
        env["COEVO_JAX_WORKER_CPU"] = str(cpu)
    return env


def free_port() -> int:
    """A TCP port free on the loopback address now (for a local coordinator)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_workers(out: str, worker_ids, args: dict, progress: Progress, config_flags: str = "") -> None:
    """Start one ``jax.distributed`` worker process per id (``args``: the worker's options:
    coordinator, num_processes, config_hash, ...) and poll their progress files into ``progress``
    until all exit; :class:`StudyError` (one line) as soon as one fails."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    wdirs = {w: os.path.join(out, "checkpoints", f"w{w}") for w in worker_ids}
    procs = {}
    try:
        for i, w in enumerate(worker_ids):
            os.makedirs(wdirs[w], exist_ok=True)
            cmd = [sys.executable, "-m", "coevo_jax.experiment.worker", out, "--process-id", str(w)]
            cmd += [x for k, v in args.items() if v is not None for x in (f"--{k.replace('_', '-')}", str(v))]
            with open(os.path.join(wdirs[w], "log.txt"), "w") as log:
                procs[w] = subprocess.Popen(cmd, env=worker_env(cpus[i % len(cpus)] if cpus else None, config_flags),
                                            stdout=log, stderr=subprocess.STDOUT)
        while True:
            for w in worker_ids:
                progress.set(w, read_json(os.path.join(wdirs[w], "progress.json"), progress.workers.get(w, {})))
            progress.show()
            codes = {w: p.poll() for w, p in procs.items()}
            for w, code in codes.items():
                if code not in (None, 0):
                    tail = open(os.path.join(wdirs[w], "log.txt")).read().strip().splitlines()
                    msg = next((ln for ln in reversed(tail) if ln.strip() and not ln.startswith(" ")), "no output")
                    raise StudyError(f"worker {w} failed (exit {code}): {msg}"
                                     f" [log: {os.path.join(wdirs[w], 'log.txt')}]")
            if all(c == 0 for c in codes.values()):
                return
            time.sleep(0.5)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()


def barrier(name: str, timeout_s: int = 3600) -> None:
    """Wait for every ``jax.distributed`` process (a no-op without it): the coordination
    service's barrier, which needs no collective on the devices."""
    import jax

    if jax.process_count() <= 1:
        return
    from jax._src import distributed  # the public API has no barrier without a device computation

    distributed.global_state.client.wait_at_barrier(name, timeout_s * 1000)
