"""``run_study``: validate, prepare the folder, run the workers, merge, write.

Parallelism, outermost first: hosts (``jax.distributed``; each runs its share,
process 0 merges), worker processes (one per core on CPU, 1 on accelerators),
devices (inside a process the batch axis is sharded over the local devices).
Rerunning the same call on the same folder resumes every batch from its last
checkpoint, with results identical to an uninterrupted run.
"""
from __future__ import annotations

import json
import math
import os
import time
from typing import Mapping

import numpy as np

from coevo_jax.config import ConfigError
from coevo_jax.experiment.folder import atomic_write_text, check_out, prepare_out, read_json
from coevo_jax.experiment.launcher import Progress, barrier, fmt_time, launch_workers
from coevo_jax.experiment.plan import build_plan
from coevo_jax.experiment.results import StudyResult, assemble, merge_batches, write_outputs
from coevo_jax.experiment.spec import Study, StudyError, config_hash, config_text
from coevo_jax.experiment.worker import default_compile_cache, run_worker


def covered_seconds(spans) -> float:
    """Seconds covered by the union of ``[start, end]`` intervals (overlaps counted once)."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(spans):
        total += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return total


def _positive(name: str, v) -> None:
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1):
        raise ConfigError(f"{name}={v!r} must be an integer >= 1")


def default_processes() -> int:
    """One worker per available core on CPU, 1 on GPU/TPU."""
    import jax

    return len(os.sched_getaffinity(0)) if jax.default_backend() == "cpu" else 1


def _layout(out: str, action: str, plans, processes, max_parallel, num_hosts: int) -> dict:
    """The processes / max_parallel / hosts the checkpoints were (or will be) written with."""
    saved = read_json(os.path.join(out, "checkpoints", "layout.json")) if action == "resume" else None
    if saved:
        processes = saved["processes"] if processes is None else processes
        max_parallel = saved["max_parallel"] if max_parallel is None else max_parallel
    processes = default_processes() if processes is None else processes
    processes = int(min(processes, max(1, math.ceil(max(p.num_runs for p in plans) / num_hosts))))
    layout = {"processes": processes, "max_parallel": max_parallel, "num_hosts": num_hosts}
    if saved and saved != layout:
        raise StudyError(f"checkpoints in {out} were written with layout {saved}, not {layout}; rerun with"
                         f" --processes {saved['processes']} --max-parallel {saved['max_parallel']}, or --overwrite")
    return layout


def _wait_for_workers(out: str, num_workers: int, prog: Progress) -> dict:
    """Process 0: poll every worker's ``progress.json`` (all hosts, shared folder) until all are done."""
    while True:
        info = {w: read_json(os.path.join(out, "checkpoints", f"w{w}", "progress.json"), {})
                for w in range(num_workers)}
        for w, d in info.items():
            if d.get("status") == "error":
                raise StudyError(f"worker {w} failed: {d.get('phase')}")
            prog.set(w, d)
        if all(d.get("status") == "done" for d in info.values()):
            return info
        prog.show()
        time.sleep(2.0)


def run_study(study: Study, out: str, *, overwrite: bool = False, processes: int | None = None,
              max_parallel: int | None = None, stop_after_chunks: int | None = None, progress: bool = True,
              compile_cache: str | bool | None = True, distributed: Mapping | None = None,
              log=print) -> StudyResult | None:
    """Run (or resume) ``study`` into the folder ``out``.

    ``processes``: worker processes on this host (default one per core on CPU);
    ``max_parallel``: runs resident at once on this host; ``stop_after_chunks``:
    stop every worker after that many chunks (rerun to resume);
    ``compile_cache``: JAX's persistent compilation cache folder (``True``: the
    default folder; ``False``: off); ``distributed``: keyword arguments for
    ``jax.distributed.initialize``. Everything is validated before anything
    compiles or is written. Returns the :class:`StudyResult`, or ``None`` when
    stopped early or on hosts other than process 0.
    """
    import jax

    t_start = time.time()
    _positive("processes", processes)
    _positive("max_parallel", max_parallel)
    if stop_after_chunks is not None and stop_after_chunks < 0:
        raise ConfigError(f"stop_after_chunks={stop_after_chunks!r} must be >= 0")
    text = config_text(study)
    study = Study.from_json(json.loads(text))  # exactly what the workers will read back
    if distributed and not jax.distributed.is_initialized():
        jax.distributed.initialize(**distributed)  # before any JAX computation
    plans = build_plan(study)
    action = check_out(out, text, overwrite)
    host, num_hosts = jax.process_index(), jax.process_count()
    out = os.path.abspath(out)
    layout = _layout(out, action, plans, processes, max_parallel, num_hosts)
    processes = layout["processes"]
    if host == 0:
        prepare_out(out, text, action)
        atomic_write_text(os.path.join(out, "checkpoints", "layout.json"), json.dumps(layout))
    barrier("coevo_jax_study_prepared")
    if config_hash(open(os.path.join(out, "config.json")).read()) != config_hash(text):
        raise StudyError(f"host {host}: {out}/config.json differs from this host's study")
    cap = None if max_parallel is None else max(1, max_parallel // processes)
    num_workers = processes * num_hosts
    worker_ids = [host * processes + i for i in range(processes)]
    total_runs = sum(p.num_runs for p in plans)
    total_steps = sum(p.num_runs * p.num_iterations * p.arm.static.steps_per_iteration for p in plans)
    prog = Progress(total_runs, sum(p.num_runs * p.num_iterations for p in plans), total_steps, enabled=progress)
    if progress:
        log(f"{study.name}: {total_runs} runs ({', '.join(f'{p.arm.name} x{p.num_runs}' for p in plans)})"
            f" on {study.env}, {total_steps:,} env steps; {num_workers} worker process(es)"
            f"{'' if num_hosts == 1 else f' over {num_hosts} hosts'}, backend {jax.default_backend()}"
            f"{'; resuming from checkpoints' if action == 'resume' else ''}; output {out}")
    cache = default_compile_cache() if compile_cache is True else (compile_cache or None)
    flags = os.environ.get("XLA_FLAGS", "").split()
    if processes == 1 and all(f in flags for f in study.xla_flags.split()):
        def show(d):
            prog.set(worker_ids[0], d)
            prog.show()

        statuses = {worker_ids[0]: run_worker(out, worker_ids[0], num_workers, cap, stop_after_chunks, show, cache)}
    else:
        statuses = launch_workers(out, worker_ids, num_workers, cap, stop_after_chunks, cache, prog, study.xla_flags)
    if any(s != "done" for s in statuses.values()) or host != 0:
        prog.close()
        if progress:
            log(f"stopped early ({stop_after_chunks} chunk(s) per worker); rerun the same command to resume"
                if host == 0 else f"host {host}: share done; process 0 merges and writes the results")
        return None
    workers = _wait_for_workers(out, num_workers, prog)
    prog.close()
    devices = int(workers[worker_ids[0]].get("devices", 1))
    per_arm = merge_batches(out, plans, num_workers, cap, devices)
    curves, runs = assemble(study, plans, per_arm)
    wall = time.time() - t_start
    new_steps = sum(d.get("env_steps", 0) - d.get("env_steps_resumed", 0) for d in workers.values())
    compile_s = sum(sum(d.get("compile_s", {}).values()) for d in workers.values())
    compile_wall = covered_seconds([s for d in workers.values() for s in d.get("compile_spans", [])])
    wait_s = sum(sum(d.get("wait_s", {}).values()) for d in workers.values())  # for another worker's compile
    info = {"wall_s": wall, "backend": jax.default_backend(), "num_hosts": num_hosts,
            "processes_per_host": processes, "devices_per_process": devices, "max_parallel": max_parallel,
            "total_runs": total_runs, "total_env_steps": total_steps, "env_steps_this_call": new_steps,
            "env_steps_per_s_wall": new_steps / wall if wall > 0 else float("nan"), "compile_s_total": compile_s,
            "compile_wall_s": compile_wall, "wait_s_total": wait_s,
            "workers": {str(w): {k: d.get(k) for k in ("compile_s", "wait_s", "exec_s", "peak_rss_mb", "memory",
                                                       "devices")} for w, d in workers.items()}}
    rows = write_outputs(out, study, plans, curves, runs, per_arm, info)
    if progress:
        mem = sorted({f"{arm}: {m['compiled_bytes_per_run'] / 2**20:.2f} MiB/run (batch {m['batch']})"
                      for d in workers.values() for arm, m in (d.get("memory") or {}).items()})
        peak = max((d.get("peak_rss_mb") or 0) for d in workers.values())
        log(f"done in {fmt_time(wall)}: {new_steps / wall:,.0f} env steps/s overall; compiling {compile_s:.0f} s"
            f" summed over workers ({compile_wall:.0f} s of wall time with a compile running; workers waited"
            f" {wait_s:.0f} s for another's compile); peak RSS per process"
            f" {peak:.0f} MiB; compiled memory {'; '.join(mem)}")
    return StudyResult(out, study, curves, runs, rows, info)
