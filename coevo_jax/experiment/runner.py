"""``run_study``: validate, prepare the folder, run the arms over this host's devices (and, with
``jax.distributed``, every host's), merge and write (host 0). Rerunning the same call on the same
folder resumes every batch, with results identical to an uninterrupted run."""
from __future__ import annotations

import json
import os
import time
from typing import Mapping

import jax
import numpy as np
from jax._src import distributed as jax_distributed  # barrier(): the public API has none without a computation

from coevo_jax.config import ConfigError
from coevo_jax.experiment.folder import check_out, prepare_out, read_json, wait_prepared
from coevo_jax.experiment.plan import build_plan
from coevo_jax.experiment.progress import Progress, fmt_time
from coevo_jax.experiment.results import StudyResult, assemble, merge_batches, write_outputs
from coevo_jax.experiment.spec import Study, StudyError, config_hash, config_text
from coevo_jax.experiment.worker import default_compile_cache, run_arms, set_compile_cache


def _positive(name: str, v) -> None:
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1):
        raise ConfigError(f"{name}={v!r} must be an integer >= 1")


def start_devices(devices: int | None = None, distributed: Mapping | None = None) -> list:
    """Join ``jax.distributed`` (``distributed``: ``coordinator_address``, ``num_processes``,
    ``process_id``) and return this process's first ``devices`` local devices (default all; on CPU that
    many host devices are made). Call before the first JAX computation."""
    _positive("devices", devices)
    if distributed and not jax.distributed.is_initialized():
        try:
            jax.distributed.initialize(**distributed)
        except RuntimeError as e:
            raise StudyError(f"distributed: {str(e).splitlines()[0]} (start it before any JAX computation)") from None
    if devices is not None and jax.config.jax_num_cpu_devices != devices:
        try:
            jax.config.update("jax_num_cpu_devices", devices)
        except RuntimeError:  # the CPU backend is running already: use its devices
            pass
    local = jax.local_devices()
    if devices is not None and len(local) < devices:
        raise ConfigError(f"devices={devices}: this process has {len(local)} {local[0].platform} device(s) (on CPU,"
                          " choose the count before the first JAX computation of the process)")
    return local[:devices] if devices else local


def barrier(name: str, timeout_s: int = 24 * 3600) -> None:
    """Wait for every ``jax.distributed`` process (no-op without it)."""
    if jax.process_count() <= 1:
        return
    jax_distributed.global_state.client.wait_at_barrier(name, timeout_s * 1000)


def run_study(study: Study, out: str, *, overwrite: bool = False, devices: int | None = None,
              max_parallel: int | None = None, stop_after_chunks: int | None = None, progress: bool = True,
              compile_cache: str | bool | None = True, distributed: Mapping | None = None,
              log=print) -> StudyResult | None:
    """Run (or resume) ``study`` into the folder ``out``; :class:`StudyResult`, or ``None`` when stopped
    early or on hosts other than 0. Everything is validated before anything compiles or is written.

    ``devices``: local devices per batch (:func:`start_devices`); ``max_parallel``: runs resident at once
    on this host; ``stop_after_chunks``: stop after that many chunks; ``compile_cache``: JAX's persistent
    compilation cache folder (``True`` default folder, ``False`` off); ``distributed``: see
    :func:`start_devices` (the hosts share ``out``)."""
    t_start = time.time()
    _positive("max_parallel", max_parallel)
    if stop_after_chunks is not None and stop_after_chunks < 0:
        raise ConfigError(f"stop_after_chunks={stop_after_chunks!r} must be >= 0")
    text = config_text(study)
    local = start_devices(devices, distributed)
    study = Study.from_json(json.loads(text))  # exactly what a resumed run will read back
    plans = build_plan(study)
    host, num_hosts = jax.process_index(), jax.process_count()
    out = os.path.abspath(out)
    action = check_out(out, text, overwrite) if host == 0 else "new"  # the other hosts wait for host 0's folder
    if host == 0:
        prepare_out(out, text, action)
    else:
        wait_prepared(out, text)
    total_runs = sum(p.num_runs for p in plans)
    total_steps = sum(p.num_runs * p.num_iterations * p.arm.static.steps_per_iteration for p in plans)
    prog = Progress(total_runs, sum(p.num_runs * p.num_iterations for p in plans), total_steps, enabled=progress)
    if progress:
        log(f"{study.name}: {total_runs} runs ({', '.join(f'{p.arm.name} x{p.num_runs}' for p in plans)})"
            f" on {study.env}, {total_steps:,} env steps; {len(local)} {local[0].platform} device(s)"
            f"{'' if num_hosts == 1 else f' on each of {num_hosts} hosts'}"
            f"{'; resuming from checkpoints' if action == 'resume' else ''}; output {out}")
    cache = default_compile_cache() if compile_cache is True else (compile_cache or None)
    prev_cache = set_compile_cache(cache) if cache else None
    try:
        everywhere = [d for h in range(num_hosts) for d in [d for d in jax.devices() if d.process_index == h][
            :len(local)]] if num_hosts > 1 else local
        status = run_arms(out, study, plans, config_hash(text), everywhere, max_parallel, stop_after_chunks,
                           prog.set)
    finally:
        if cache:
            set_compile_cache(prev_cache)
    barrier("coevo_jax_study_done")  # every host's info file is written
    prog.close()
    hosts = {h: read_json(os.path.join(out, "checkpoints", f"host{h}.json"), {}) for h in range(num_hosts)}
    if status != "done":
        if progress:
            log(f"stopped early ({stop_after_chunks} chunk(s)); rerun the same command to resume")
        return None
    per_arm = merge_batches(out, plans)  # (every host reads: orbax's reads are collective)
    if host != 0:
        if progress:
            log(f"host {host}: done; host 0 writes the results")
        return None
    curves, runs = assemble(study, plans, per_arm)
    wall = time.time() - t_start
    new_steps = hosts[0].get("env_steps", 0) - hosts[0].get("env_steps_resumed", 0)  # every host ran every batch
    compile_s = sum(hosts[0].get("compile_s", {}).values())
    info = {"wall_s": wall, "backend": jax.default_backend(), "num_hosts": num_hosts, "devices_per_host": len(local),
            "max_parallel": max_parallel, "total_runs": total_runs, "total_env_steps": total_steps,
            "env_steps_this_call": new_steps, "env_steps_per_s_wall": new_steps / wall if wall > 0 else float("nan"),
            "compile_s_total": compile_s,
            "hosts": {str(h): {k: d.get(k) for k in ("compile_s", "exec_s", "peak_rss_mb", "memory")}
                      for h, d in hosts.items()}}
    write_outputs(out, curves, runs, info)
    if progress:
        mem = sorted({f"{arm}: {m['compiled_bytes_per_run'] / 2**20:.2f} MiB/run (batch {m['batch']})"
                      for d in hosts.values() for arm, m in (d.get("memory") or {}).items()})
        peak = max((d.get("peak_rss_mb") or 0) for d in hosts.values())
        compiled = ", ".join(f"{arm} {sec:.0f} s" for arm, sec in hosts[0].get("compile_s", {}).items() if sec > 0)
        log(f"done in {fmt_time(wall)}: {new_steps / wall:,.0f} env steps/s overall; compiling {compile_s:.0f} s"
            f" ({compiled}); peak RSS {peak:.0f} MiB; compiled memory {'; '.join(mem)}")
    return StudyResult(out, study, curves, runs, info)
