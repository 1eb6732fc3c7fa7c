"""``run_study``: validate, prepare the folder, run the workers, merge, write.

Parallelism, outermost first: ``jax.distributed`` processes (P per host, one
per core on CPU, 1 on accelerators; each runs its share of every arm, process 0
merges), devices (inside a process the batch axis is sharded over the local
devices). One process on one host runs in this process. Rerunning the same
call on the same folder resumes every batch from its last checkpoint, with
results identical to an uninterrupted run.
"""
from __future__ import annotations

import json
import math
import os
import time
from typing import Mapping

import numpy as np

from coevo_jax.config import ConfigError
from coevo_jax.experiment.folder import check_out, prepare_out, read_json, wait_prepared
from coevo_jax.experiment.launcher import Progress, fmt_time, free_port, launch_workers
from coevo_jax.experiment.plan import build_plan
from coevo_jax.experiment.results import StudyResult, assemble, merge_batches, write_outputs
from coevo_jax.experiment.spec import Study, StudyError, config_hash, config_text
from coevo_jax.experiment.worker import default_compile_cache, run_worker
from coevo_jax.files import atomic_write_text


def _positive(name: str, v) -> None:
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1):
        raise ConfigError(f"{name}={v!r} must be an integer >= 1")


def _layout(out: str, action: str, plans, processes, max_parallel, num_hosts: int) -> dict:
    """The processes / max_parallel / hosts the checkpoints were (or will be) written with
    (processes: one per available core on CPU, 1 on GPU/TPU, unless given or resumed)."""
    import jax

    saved = read_json(os.path.join(out, "checkpoints", "layout.json")) if action == "resume" else None
    if saved:
        processes = saved["processes"] if processes is None else processes
        max_parallel = saved["max_parallel"] if max_parallel is None else max_parallel
    if processes is None:
        processes = len(os.sched_getaffinity(0)) if jax.default_backend() == "cpu" else 1
    processes = int(min(processes, max(1, math.ceil(max(p.num_runs for p in plans) / num_hosts))))
    layout = {"processes": processes, "max_parallel": max_parallel, "num_hosts": num_hosts}
    if saved and saved != layout:
        raise StudyError(f"checkpoints in {out} were written with layout {saved}, not {layout}; rerun with"
                         f" --processes {saved['processes']} --max-parallel {saved['max_parallel']}, or --overwrite")
    return layout


def run_study(study: Study, out: str, *, overwrite: bool = False, processes: int | None = None,
              max_parallel: int | None = None, stop_after_chunks: int | None = None, progress: bool = True,
              compile_cache: str | bool | None = True, distributed: Mapping | None = None,
              log=print) -> StudyResult | None:
    """Run (or resume) ``study`` into the folder ``out``.

    ``processes``: ``jax.distributed`` worker processes on this host (default one
    per core on CPU); ``max_parallel``: runs resident at once on this host;
    ``stop_after_chunks``: stop every worker after that many chunks (rerun to
    resume); ``compile_cache``: JAX's persistent compilation cache folder
    (``True``: the default folder; ``False``: off); ``distributed``: several
    hosts, as ``jax.distributed.initialize``'s ``coordinator_address``,
    ``num_processes`` (hosts) and ``process_id`` (this host), every host with
    the same ``processes`` and a shared ``out``. Everything is validated before
    anything compiles or is written. Returns the :class:`StudyResult`, or
    ``None`` when stopped early or on hosts other than host 0.
    """
    import jax

    t_start = time.time()
    _positive("processes", processes)
    _positive("max_parallel", max_parallel)
    if stop_after_chunks is not None and stop_after_chunks < 0:
        raise ConfigError(f"stop_after_chunks={stop_after_chunks!r} must be >= 0")
    text = config_text(study)
    study = Study.from_json(json.loads(text))  # exactly what the workers will read back
    plans = build_plan(study)
    host, num_hosts = (distributed["process_id"], distributed["num_processes"]) if distributed else (0, 1)
    out = os.path.abspath(out)
    action = check_out(out, text, overwrite) if host == 0 else "new"  # the other hosts wait for host 0's folder
    layout = _layout(out, action, plans, processes, max_parallel, num_hosts)
    processes = layout["processes"]
    if host == 0:
        prepare_out(out, text, action)
        atomic_write_text(os.path.join(out, "checkpoints", "layout.json"), json.dumps(layout))
    else:
        wait_prepared(out, text)
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
    if num_workers == 1 and all(f in flags for f in study.xla_flags.split()):
        def show(d):
            prog.set(0, d)
            prog.show()

        run_worker(out, 0, 1, cap, stop_after_chunks, show, cache)
    else:
        coordinator = distributed["coordinator_address"] if distributed else f"127.0.0.1:{free_port()}"
        launch_workers(out, worker_ids, {
            "coordinator": coordinator, "num_processes": num_workers, "max_parallel": cap,
            "stop_after_chunks": stop_after_chunks, "compile_cache": cache, "config_hash": config_hash(text)},
            prog, study.xla_flags)
    # the workers' last barrier: when this host's workers have exited, every host's have finished or stopped
    workers = {w: read_json(os.path.join(out, "checkpoints", f"w{w}", "progress.json"), {})
               for w in range(num_workers)}
    prog.close()
    if host != 0 or any(d.get("status") != "done" for d in workers.values()):
        if progress:
            log(f"stopped early ({stop_after_chunks} chunk(s) per worker); rerun the same command to resume"
                if host == 0 else f"host {host}: share done; host 0 merges and writes the results")
        return None
    devices = int(workers[0].get("devices", 1))
    per_arm = merge_batches(out, plans, num_workers, cap, devices)
    curves, runs = assemble(study, plans, per_arm)
    wall = time.time() - t_start
    new_steps = sum(d.get("env_steps", 0) - d.get("env_steps_resumed", 0) for d in workers.values())
    compile_s = sum(sum(d.get("compile_s", {}).values()) for d in workers.values())
    info = {"wall_s": wall, "backend": jax.default_backend(), "num_hosts": num_hosts,
            "processes_per_host": processes, "devices_per_process": devices, "max_parallel": max_parallel,
            "total_runs": total_runs, "total_env_steps": total_steps, "env_steps_this_call": new_steps,
            "env_steps_per_s_wall": new_steps / wall if wall > 0 else float("nan"), "compile_s_total": compile_s,
            "workers": {str(w): {k: d.get(k) for k in ("compile_s", "exec_s", "peak_rss_mb", "memory", "devices",
                                                       "processes")} for w, d in workers.items()}}
    rows = write_outputs(out, study, plans, curves, runs, per_arm, info)
    if progress:
        mem = sorted({f"{arm}: {m['compiled_bytes_per_run'] / 2**20:.2f} MiB/run (batch {m['batch']})"
                      for d in workers.values() for arm, m in (d.get("memory") or {}).items()})
        peak = max((d.get("peak_rss_mb") or 0) for d in workers.values())
        programs = {}  # seconds each compiled program took, the slowest worker's (arms that reuse one count 0)
        for d in workers.values():
            for arm, sec in (d.get("compile_s") or {}).items():
                programs[arm] = max(programs.get(arm, 0.0), sec)
        compiled = ", ".join(f"{arm} {sec:.0f} s" for arm, sec in programs.items() if sec > 0)
        log(f"done in {fmt_time(wall)}: {new_steps / wall:,.0f} env steps/s overall; compiling {compile_s:.0f} s"
            f" summed over workers ({compiled}); peak RSS per process {peak:.0f} MiB; compiled memory"
            f" {'; '.join(mem)}")
    return StudyResult(out, study, curves, runs, rows, info)
