"""One runner for every study: a grid of hyperparameters x seeds, per method,
run as one batch axis of independent training runs.

Each *arm* (a :class:`~coevo_jax.config.StaticConfig`, i.e. one method with its
shapes) sweeps a cartesian grid of :class:`~coevo_jax.config.HParams` values;
every grid point is run with ``num_seeds`` seeds. Run ``r`` of a setting uses
the key ``fold_in(PRNGKey(base_seed), seed_index)`` whatever the batching, so a
run's result never depends on how the batch axis was cut. The runs of an arm
are executed as ``jit(vmap(Trainer.run_chunk))`` with the HParams batched too
(one compile per arm, whatever is swept), in chunks of iterations; between
chunks the host prints progress and saves an orbax checkpoint of the whole
batched :class:`~coevo_jax.train.TrainState` plus the metrics so far. The
statistics follow Agarwal et al. (2021), "Deep RL at the Edge of the
Statistical Precipice" (IQM with bootstrap CIs, see :mod:`coevo_jax.stats`).

Parallelism, outermost first:

* hosts: with ``jax.distributed`` (pass ``distributed=dict(coordinator_address=,
  num_processes=, process_id=)`` or the ``--coordinator/--num-hosts/--host-index``
  script options) each host runs its share of the run axis; only process 0
  merges and writes the results. ``out`` must then be on a filesystem every host
  sees (the merge reads the other hosts' per-batch result files).
* worker processes (``processes``; default one per core on CPU, 1 on GPU/TPU):
  ``python -m coevo_jax.sweep --worker OUT ...`` subprocesses, each pinned to one
  core (``os.sched_setaffinity``) with single-threaded Eigen, checkpoint their
  own share; the parent merges. On the 2-core CPU machines this is where the
  speed-up comes from (forced host devices inside one process gave none).
* devices: inside a process the batch axis is sharded over all local devices
  (1-D ``Mesh`` + ``NamedSharding``; the batch is padded to a multiple of the
  device count with copies of a real run, which are dropped).

``max_parallel`` bounds how many runs are resident at once over the processes
of one host (each process gets ``max_parallel // processes``); the rest run in
later batches of the same compiled shape.

Launching on a cluster (N hosts, shared filesystem, same command on each)::

    # host i of N (i = 0 .. N-1); host 0 also serves as the coordinator
    python sweeps/k_sensitivity.py --out /shared/results/k_sens \\
        --coordinator host0.example:12345 --num-hosts N --host-index i

or, from Python, ``run_sweep(config, out, distributed=dict(coordinator_address=
"host0:12345", num_processes=N, process_id=i))``. Every host must use the same
``--processes`` (default: its core count on CPU; 1 on accelerators) and
``--max-parallel``. Rerunning the same command resumes every host from its last
checkpoint.

Resuming: rerunning the same call on the same ``out`` continues every batch
from its last checkpoint; the final results are identical to an uninterrupted
run. A folder holding another config's checkpoints (``config.json`` hash), or
written with another ``processes``/``max_parallel``/device layout, is refused
with a one-line message; a finished folder is refused unless ``overwrite``.

Compiling dominates small sweeps on CPU, so JAX's persistent compilation cache
is on by default (:func:`default_compile_cache`), and workers visit the arms in
rotated order so that each compiles different arms first and loads the others
from the cache (the batch shape of an arm is the same on every worker).

Measured on the 2-core development machine while other jobs kept its load at
8-13 (so absolute numbers are low; ratios are what carry over):

* one process vs 2 pinned single-threaded-Eigen workers, PPO on KeyDoor-5x5, 32
  runs x 10k steps: 11.5-12k env steps/s vs 38-40k env steps/s in the compiled
  chunks (one process with single-threaded Eigen: 8-10k). Results are
  bit-identical across batch sizes, process counts and the Eigen setting;
  sharding over forced host devices changes only the summation order of two
  per-minibatch diagnostics (``approx_kl``, ``policy_loss``; ~1e-9).
* the run axis is vmapped with ``axis_name="runs"`` and the trainers are built
  with ``batch_axis="runs"``, so the K-gated refit stays a real branch taken
  only on iterations where some run of the batch refits (a plain ``vmap``
  would turn it into a select that refits every iteration); an arm that mixes
  K = 1 with larger K still refits every iteration.
* ``xla_flags="--xla_backend_optimization_level=0"`` compiled a PPO chunk
  3.4x faster and ran it 26% slower, and changes low-order bits.

Output folder: ``config.json`` (everything needed to rerun), ``summary.csv``,
``curves.npz`` (every metric ``[runs, iterations]``, ``env_steps`` among them,
plus per-run metadata), PNG plots, ``run_info.json`` (timings, memory) and
``checkpoints/``; ``FINISHED`` marks a complete folder. Every results file is
written to a temporary name and renamed, so an interrupted sweep never leaves a
half-written one.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import hashlib
import io
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Any, Mapping, Sequence

import numpy as np

from coevo_jax import stats
from coevo_jax.config import (
    HPARAM_FIELDS,
    ConfigError,
    StaticConfig,
    default_hparams,
    validate_hparams,
    validate_static,
)

CONFIG_VERSION = 1
FINISHED_MARK = "FINISHED"
RETURN_METRIC = "episode_return"
SUCCESS_METRIC = "success_rate"


BATCH_AXIS = "runs"  # the vmapped (and sharded) run axis; the K-gated refits branch on it (Trainer.batch_axis)


class SweepError(RuntimeError):
    """A sweep that cannot start or continue (bad output folder, mismatched checkpoint, failed worker)."""


class SweepStopped(Exception):
    """Raised inside a worker when ``stop_after_chunks`` is reached (a deliberate interruption)."""


# ============================================================================ configuration
@dataclasses.dataclass(frozen=True)
class Arm:
    """One method (``static``) with its grid of HParams values.

    ``grid`` maps HParams field -> values (cartesian product over fields, in the
    order given); ``fixed`` holds HParams overrides applied to every setting on
    top of ``default_hparams(static.method)``; ``label`` names the arm in tables
    (default: the method name).
    """

    static: StaticConfig
    grid: Mapping[str, Sequence[float]] = dataclasses.field(default_factory=dict)
    fixed: Mapping[str, float] = dataclasses.field(default_factory=dict)
    label: str = ""

    @property
    def name(self) -> str:
        return self.label or self.static.method

    def settings(self) -> list[dict]:
        """The cartesian product of ``grid`` as a list of ``{field: value}``."""
        fields = list(self.grid)
        return [dict(zip(fields, vals)) for vals in itertools.product(*(list(self.grid[f]) for f in fields))]

    def to_json(self) -> dict:
        static = dataclasses.asdict(self.static)
        return {"label": self.name, "static": static,
                "grid": [[k, [_py(x) for x in v]] for k, v in self.grid.items()],  # pairs: keeps the field order
                "fixed": {k: _py(v) for k, v in self.fixed.items()}}

    @staticmethod
    def from_json(d: dict) -> "Arm":
        fields = {f.name for f in dataclasses.fields(StaticConfig)}
        static = {k: tuple(v) if isinstance(v, list) else v for k, v in d["static"].items() if k in fields}
        return Arm(StaticConfig(**static), {k: tuple(v) for k, v in d["grid"]}, dict(d["fixed"]), d["label"])


def _py(x):
    """A JSON-friendly Python scalar from a NumPy/JAX/Python number (anything else unchanged)."""
    if isinstance(x, (bool, int, float, str)) or x is None:
        return x
    try:
        return np.asarray(x).item()
    except (TypeError, ValueError):
        return x


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    """A whole study: one environment, one or more arms, ``num_seeds`` seeds per setting.

    ``num_chunks``: how many checkpointed chunks a run is cut into (the chunk
    length is a divisor of the iteration count near ``iterations / num_chunks``).
    ``threshold``: the return that ``steps_to_threshold`` waits for; ``None``
    means half of the best final return reached by any run in the sweep.
    ``xla_flags``: extra ``XLA_FLAGS`` for the processes that run the sweep
    (e.g. ``--xla_backend_optimization_level=0``, which compiles ~3x faster on
    CPU and runs ~25% slower). Part of the config because such flags can change
    the low-order bits of the results; with flags the runs always happen in
    worker subprocesses (a running process cannot change its XLA flags).
    """

    env: str
    arms: tuple
    num_seeds: int
    env_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    base_seed: int = 0
    num_chunks: int = 10
    threshold: float | None = None
    study: str = "sweep"
    xla_flags: str = ""

    def to_json(self) -> dict:
        return {"version": CONFIG_VERSION, "study": self.study, "env": self.env, "env_kwargs": dict(self.env_kwargs),
                "num_seeds": self.num_seeds, "base_seed": self.base_seed, "num_chunks": self.num_chunks,
                "threshold": self.threshold, "xla_flags": self.xla_flags, "arms": [a.to_json() for a in self.arms]}

    @staticmethod
    def from_json(d: dict) -> "SweepConfig":
        return SweepConfig(env=d["env"], arms=tuple(Arm.from_json(a) for a in d["arms"]), num_seeds=d["num_seeds"],
                           env_kwargs=dict(d["env_kwargs"]), base_seed=d["base_seed"], num_chunks=d["num_chunks"],
                           threshold=d["threshold"], study=d.get("study", "sweep"), xla_flags=d.get("xla_flags", ""))


def config_text(config: SweepConfig) -> str:
    """The canonical ``config.json`` content (sorted keys; its hash identifies the sweep)."""
    return json.dumps(config.to_json(), indent=1, sort_keys=True) + "\n"


def config_hash(text: str) -> str:
    """First 16 hex digits of the SHA-256 of ``config.json``'s content."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def chunk_length(num_iterations: int, num_chunks: int) -> int:
    """Iterations per chunk: the divisor of ``num_iterations`` nearest to
    ``num_iterations / num_chunks`` (ties: the smaller), so every chunk has the
    same compiled length."""
    target = num_iterations / max(1, num_chunks)
    divisors = [d for d in range(1, num_iterations + 1) if num_iterations % d == 0]
    return min(divisors, key=lambda d: (abs(math.log(d / target)) if target > 0 else d, d))


# ============================================================================ the plan (validated)
@dataclasses.dataclass
class ArmPlan:
    """An arm resolved to arrays: ``hp`` leaves ``[S]`` (settings), run ``r`` is
    setting ``r // num_seeds``, seed ``r % num_seeds``."""

    arm: Arm
    settings: list
    hp: Any  # HParams with leaves [S]
    num_runs: int
    num_iterations: int
    chunk_len: int


def _available_methods() -> list[str]:
    from coevo_jax.signals import available_methods

    return available_methods()


def make_env(config: SweepConfig):
    """``(env, env_params)`` for the config, raising :class:`ConfigError` for an unknown name or bad kwargs."""
    import envs_jax

    names = envs_jax.registered()
    if config.env not in names:
        raise ConfigError(f"env: unknown environment {config.env!r}; registered: {', '.join(names)}")
    try:
        return envs_jax.make(config.env, **dict(config.env_kwargs))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"env_kwargs for {config.env}: {e}") from None


def build_plan(config: SweepConfig, check_trainers: bool = True) -> list[ArmPlan]:
    """Validate everything (static configs, every HParams value, env, seeds)
    and resolve each arm to batched HParams. Nothing is compiled.

    Raises :class:`ConfigError` with a one-line message naming the bad value.
    """
    import jax.numpy as jnp

    from coevo_jax.config import HParams

    if isinstance(config.num_seeds, bool) or not isinstance(config.num_seeds, (int, np.integer)) \
            or config.num_seeds < 1:
        raise ConfigError(f"num_seeds={config.num_seeds!r} must be an integer >= 1")
    if not isinstance(config.base_seed, (int, np.integer)) or config.base_seed < 0:
        raise ConfigError(f"base_seed={config.base_seed!r} must be an integer >= 0")
    if not isinstance(config.num_chunks, (int, np.integer)) or config.num_chunks < 1:
        raise ConfigError(f"num_chunks={config.num_chunks!r} must be an integer >= 1")
    if config.threshold is not None and not np.isfinite(config.threshold):
        raise ConfigError(f"threshold={config.threshold!r} must be a finite number or None")
    if not config.arms:
        raise ConfigError("arms: a sweep needs at least one arm (method)")
    labels = [a.name for a in config.arms]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"arms: labels must be unique, got {labels}")
    env, env_params = make_env(config)
    available = _available_methods()
    plans = []
    for arm in config.arms:
        static = validate_static(arm.static)
        if static.method not in available:
            raise ConfigError(f"method {static.method!r} is not available yet (its module does not import);"
                              f" available: {', '.join(available)}")
        for field in list(arm.grid) + list(arm.fixed):
            if field not in HPARAM_FIELDS:
                raise ConfigError(f"{arm.name}: unknown HParams field {field!r}; fields are {', '.join(HPARAM_FIELDS)}")
        for field, vals in arm.grid.items():
            if len(list(vals)) == 0:
                raise ConfigError(f"{arm.name}: grid field {field!r} has no values")
            if field in arm.fixed:
                raise ConfigError(f"{arm.name}: field {field!r} is both swept and fixed")
        settings = arm.settings()
        base = default_hparams(static.method)
        raw = {}
        for field in HPARAM_FIELDS:
            if field in arm.grid:
                vals = [s[field] for s in settings]
            elif field in arm.fixed:
                vals = [arm.fixed[field]] * len(settings)
            else:
                vals = [np.asarray(getattr(base, field)).item()] * len(settings)
            try:
                raw[field] = np.asarray(vals, np.float64)
            except (TypeError, ValueError):
                raise ConfigError(f"{arm.name}: HParams.{field} values {vals!r} are not numbers") from None
        hp = validate_hparams(HParams(**raw))
        hp = HParams(**{f: jnp.asarray(getattr(hp, f)) for f in HPARAM_FIELDS})
        if check_trainers:
            from coevo_jax.train import Trainer

            try:  # builds network and signal (no compiling): catches method/env mismatches early
                Trainer(static, env, env_params)
            except ConfigError:
                raise
            except Exception as e:  # noqa: BLE001 - report any construction failure as a config error
                msg = str(e).splitlines()[0] if str(e) else ""
                raise ConfigError(f"{arm.name} cannot run on {config.env}: {type(e).__name__}: {msg}") from None
        plans.append(ArmPlan(arm, settings, hp, len(settings) * config.num_seeds, static.num_iterations,
                             chunk_length(static.num_iterations, config.num_chunks)))
    return plans


def run_keys(base_seed: int, seed_index: np.ndarray):
    """``fold_in(PRNGKey(base_seed), seed_index)`` for each entry: uint32 ``[B, 2]``."""
    import jax

    base = jax.random.PRNGKey(base_seed)
    return jax.vmap(lambda i: jax.random.fold_in(base, i))(np.asarray(seed_index, np.uint32))


# ============================================================================ layout of the run axis
def worker_share(num_runs: int, worker: int, num_workers: int) -> np.ndarray:
    """Contiguous run indices of ``worker`` (``np.array_split`` of ``[0, num_runs)``)."""
    return np.array_split(np.arange(num_runs), num_workers)[worker]


def batch_size(num_runs: int, num_workers: int, cap: int | None, num_devices: int) -> int:
    """Runs per compiled batch for one arm: the same on every worker (so the
    compiled program and its cache entry are shared), at most ``cap`` rounded up
    to a multiple of ``num_devices``, balanced so the last batch is nearly full."""
    largest = max(1, math.ceil(num_runs / num_workers))
    cap = largest if cap is None else max(1, min(cap, largest))
    batches = math.ceil(largest / cap)
    b = math.ceil(largest / batches)
    return int(math.ceil(b / num_devices) * num_devices)


def batches_of(share: np.ndarray, b: int) -> list[np.ndarray]:
    """Cut a worker's run indices into consecutive batches of at most ``b``."""
    return [share[i:i + b] for i in range(0, len(share), b)]


# ============================================================================ small file helpers
def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and ``os.replace``."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_bytes(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_savez(path: str, **arrays) -> None:
    """``np.savez`` to ``path`` atomically."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write_bytes(path, buf.getvalue())


def _read_json(path: str, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


# ============================================================================ worker: runs one share
def _enable_compile_cache(path: str | None):
    """Point JAX's persistent compilation cache at ``path`` (returns the previous setting)."""
    import jax

    prev = jax.config.jax_compilation_cache_dir
    if path:
        os.makedirs(path, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
        try:
            from jax.experimental.compilation_cache import compilation_cache as cc

            cc.reset_cache()
        except Exception:  # noqa: BLE001 - an older/newer JAX without reset_cache still works uncached
            pass
    return prev


def _restore_compile_cache(prev: str | None) -> None:
    """Undo :func:`_enable_compile_cache` (in-process workers leave the caller's JAX config as it was)."""
    import jax

    jax.config.update("jax_compilation_cache_dir", prev)
    try:
        from jax.experimental.compilation_cache import compilation_cache as cc

        cc.reset_cache()
    except Exception:  # noqa: BLE001
        pass


def default_compile_cache() -> str:
    """``$COEVO_JAX_COMPILE_CACHE`` or ``~/.cache/coevo_jax/xla``."""
    return os.environ.get("COEVO_JAX_COMPILE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "coevo_jax",
                                                                      "xla")


def _set_thread_affinity(cpus) -> None:
    """Set the CPU affinity of every thread of this process (Linux; a no-op elsewhere).

    Workers compile on all allowed cores, then pin every thread (XLA's pools
    included) to their own core for execution."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, set(cpus))
        except OSError:
            pass


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class _Reporter:
    """A worker's progress, written to ``progress.json`` (and to a callback in-process)."""

    def __init__(self, path: str, callback=None):
        self.path, self.callback = path, callback
        self.data = {"status": "starting", "phase": "starting", "env_steps": 0, "env_steps_resumed": 0,
                     "run_iterations": 0, "runs_done": 0, "peak_rss_mb": 0.0, "memory": {}, "compile_s": {},
                     "exec_s": 0.0, "pid": os.getpid(), "updated": time.time()}

    def update(self, **kw):
        self.data.update(kw)
        self.data["updated"] = time.time()
        self.data["peak_rss_mb"] = _peak_rss_mb()
        atomic_write_text(self.path, json.dumps(self.data))
        if self.callback is not None:
            self.callback(dict(self.data))


def _ckpt_manager(path: str, read_only: bool = False):
    import jax
    import orbax.checkpoint as ocp

    mp = ocp.options.MultiprocessingOptions()
    if jax.process_count() > 1:  # each host checkpoints its own share, alone
        mp = ocp.options.MultiprocessingOptions(primary_host=jax.process_index(),
                                                active_processes={jax.process_index()})
    if not read_only:
        os.makedirs(path, exist_ok=True)  # (orbax cannot create it itself when active_processes is set)
    return ocp.CheckpointManager(path, options=ocp.CheckpointManagerOptions(
        max_to_keep=1, enable_async_checkpointing=False, create=False, multiprocessing_options=mp))


def _batch_program(trainer, plan: ArmPlan, b: int, devices):
    """Compile ``init`` and one chunk for a batch of ``b`` runs sharded over ``devices``.

    Returns ``(init_c, chunk_c, state_abstract, sharding, seconds, bytes_per_run)``.
    """
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.asarray(devices), (BATCH_AXIS,))
    sharding = NamedSharding(mesh, PartitionSpec(BATCH_AXIS))
    length = plan.chunk_len

    def init_batch(keys, hp):
        return jax.vmap(trainer.init)(keys, hp)

    def chunk_batch(state, hp):
        return jax.vmap(lambda s, h: trainer.run_chunk(s, h, length), axis_name=BATCH_AXIS)(state, hp)

    def spec(x):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

    keys_abs = jax.ShapeDtypeStruct((b, 2), np.uint32, sharding=sharding)
    hp_abs = jax.tree.map(lambda x: jax.ShapeDtypeStruct((b,) + x.shape[1:], x.dtype, sharding=sharding), plan.hp)
    t0 = time.time()
    init_c = jax.jit(init_batch, out_shardings=sharding).lower(keys_abs, hp_abs).compile()
    state_abs = jax.tree.map(spec, jax.eval_shape(init_batch, keys_abs, hp_abs))
    chunk_c = jax.jit(chunk_batch, out_shardings=sharding, donate_argnums=0).lower(state_abs, hp_abs).compile()
    seconds = time.time() - t0
    per_run = float("nan")
    try:
        m = chunk_c.memory_analysis()
        total = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
        per_run = total / b
    except Exception:  # noqa: BLE001 - not every backend reports memory
        pass
    return init_c, chunk_c, state_abs, sharding, seconds, per_run


def run_worker(out: str, worker: int, num_workers: int, max_parallel: int | None = None,
               stop_after_chunks: int | None = None, callback=None, compile_cache: str | None = None) -> str:
    """Run worker ``worker``'s share of every arm of the sweep in ``out``.

    Reads ``out/config.json``; writes ``out/checkpoints/w{worker}/``: one orbax
    checkpoint folder per unfinished batch, ``a{arm}_b{batch}.npz`` per finished
    batch and ``progress.json``. Resumes from whatever is there. Returns
    ``"done"`` or ``"stopped"`` (``stop_after_chunks`` chunks were run).
    """
    import jax
    import orbax.checkpoint as ocp

    from coevo_jax.train import Trainer

    text = open(os.path.join(out, "config.json")).read()
    digest = config_hash(text)
    config = SweepConfig.from_json(json.loads(text))
    # check_trainers imports every arm's signal module now, at start-up, so all
    # arms of this worker run the code as it was when the sweep started
    plans = build_plan(config, check_trainers=True)
    env, env_params = make_env(config)
    wdir = os.path.join(out, "checkpoints", f"w{worker}")
    os.makedirs(wdir, exist_ok=True)
    rep = _Reporter(os.path.join(wdir, "progress.json"), callback)
    prev_cache = _enable_compile_cache(compile_cache) if compile_cache else None
    devices = jax.local_devices()
    # with jax.distributed, orbax refuses host-local jax.Arrays: checkpoint host copies instead
    host_local = jax.process_count() > 1
    cap = None if max_parallel is None else max(1, int(max_parallel))
    pin = os.environ.get("COEVO_JAX_WORKER_CPU")
    pin = {int(pin)} if pin is not None else None
    allowed = os.sched_getaffinity(0) if pin and hasattr(os, "sched_getaffinity") else None
    chunks_run = 0
    exec_s = 0.0
    try:
        # count the work already on disk (finished batches) so progress includes it
        resumed_steps = resumed_iters = resumed_runs = 0
        layouts = []
        for ai, plan in enumerate(plans):
            share = worker_share(plan.num_runs, worker, num_workers)
            b = batch_size(plan.num_runs, num_workers, cap, len(devices))
            layouts.append((share, b))
            for bi, runs in enumerate(batches_of(share, b)):
                if os.path.exists(os.path.join(wdir, f"a{ai}_b{bi}.npz")):
                    resumed_runs += len(runs)
                    resumed_iters += len(runs) * plan.num_iterations
                    resumed_steps += len(runs) * plan.num_iterations * plan.arm.static.steps_per_iteration
        rep.update(status="running", env_steps=resumed_steps, env_steps_resumed=resumed_steps,
                   run_iterations=resumed_iters, runs_done=resumed_runs, devices=len(devices))
        # rotate the arm order so that workers compile different arms first and
        # later pick the others up from the shared persistent compilation cache
        first = (worker * len(plans)) // max(1, num_workers)
        order = [(first + i) % len(plans) for i in range(len(plans))]
        for ai in order:
            plan = plans[ai]
            share, b = layouts[ai]
            batches = batches_of(share, b)
            todo = [bi for bi in range(len(batches)) if not os.path.exists(os.path.join(wdir, f"a{ai}_b{bi}.npz"))]
            if not todo:
                continue
            static = plan.arm.static
            trainer = Trainer(static, env, env_params, batch_axis=BATCH_AXIS)
            rep.update(phase=f"compiling {plan.arm.name} ({b} runs/batch on {len(devices)} device(s))")
            _set_thread_affinity(allowed)  # compile on every allowed core ...
            init_c, chunk_c, state_abs, sharding, comp_s, per_run = _batch_program(trainer, plan, b, devices)
            _set_thread_affinity(pin)  # ... run pinned to this worker's core
            rep.data["compile_s"][plan.arm.name] = comp_s
            rep.data["memory"][plan.arm.name] = {"compiled_bytes_per_run": per_run, "batch": b}
            n_chunks = plan.num_iterations // plan.chunk_len
            for bi in todo:
                runs = batches[bi]
                real = len(runs)
                padded = np.concatenate([runs, np.repeat(runs[-1:], b - real)])
                setting, seed = padded // config.num_seeds, padded % config.num_seeds
                hp = jax.tree.map(lambda x: jax.device_put(np.asarray(x)[setting], sharding), plan.hp)
                cdir = os.path.join(wdir, f"a{ai}_b{bi}")
                mngr = _ckpt_manager(os.path.abspath(cdir))
                step = mngr.latest_step()
                names = None
                if step is not None:
                    meta = mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
                    if meta.get("config_hash") != digest:
                        raise SweepError(
                            f"checkpoint {cdir} was written for a different config (hash {meta.get('config_hash')}"
                            f" != {digest}); refusing to resume it: rerun with --overwrite or a new --out")
                    if meta.get("batch") != b or meta.get("runs") != [int(r) for r in runs]:
                        raise SweepError(
                            f"checkpoint {cdir} holds runs {meta.get('runs')} in batches of {meta.get('batch')}, not"
                            f" {[int(r) for r in runs]} in batches of {b} (another --processes/--max-parallel or"
                            " device count); rerun with the original ones or --overwrite")
                    names = meta["names"]
                    curves_abs = jax.ShapeDtypeStruct((len(names), b, step * plan.chunk_len), np.float32)
                    target = state_abs if not host_local else jax.tree.map(
                        lambda x: np.zeros(x.shape, x.dtype), state_abs)
                    restored = mngr.restore(step, args=ocp.args.Composite(
                        state=ocp.args.StandardRestore(target), curves=ocp.args.StandardRestore(curves_abs)))
                    state, curves = restored["state"], [np.asarray(restored["curves"])]
                    if host_local:
                        state = jax.device_put(state, sharding)
                    done_chunks = step
                    done_steps = real * step * plan.chunk_len * static.steps_per_iteration
                    rep.update(env_steps_resumed=rep.data["env_steps_resumed"] + done_steps,
                               env_steps=rep.data["env_steps"] + done_steps,
                               run_iterations=rep.data["run_iterations"] + real * step * plan.chunk_len)
                else:
                    state = init_c(jax.device_put(run_keys(config.base_seed, seed), sharding), hp)
                    curves, done_chunks = [], 0
                while done_chunks < n_chunks:
                    if stop_after_chunks is not None and chunks_run >= stop_after_chunks:
                        mngr.close()
                        raise SweepStopped()
                    rep.update(phase=f"{plan.arm.name} batch {bi + 1}/{len(batches)}"
                                     f" chunk {done_chunks + 1}/{n_chunks}")
                    t0 = time.time()
                    state, metrics = chunk_c(state, hp)
                    metrics = jax.device_get(metrics)
                    exec_s += time.time() - t0
                    if names is None:
                        names = sorted(metrics)
                    curves.append(np.stack([np.asarray(metrics[n], np.float32) for n in names]))
                    done_chunks += 1
                    chunks_run += 1
                    allc = np.concatenate(curves, axis=-1)
                    curves = [allc]
                    mngr.save(done_chunks, args=ocp.args.Composite(
                        state=ocp.args.StandardSave(jax.device_get(state) if host_local else state),
                        curves=ocp.args.StandardSave(allc),
                        meta=ocp.args.JsonSave({"config_hash": digest, "batch": b, "runs": [int(r) for r in runs],
                                                "names": names, "chunk_len": plan.chunk_len})))
                    mngr.wait_until_finished()
                    rep.update(env_steps=rep.data["env_steps"] + real * plan.chunk_len * static.steps_per_iteration,
                               run_iterations=rep.data["run_iterations"] + real * plan.chunk_len, exec_s=exec_s)
                mngr.close()
                allc = curves[0] if len(curves) == 1 else np.concatenate(curves, axis=-1)
                atomic_savez(os.path.join(wdir, f"a{ai}_b{bi}.npz"), curves=allc[:, :real],
                             names=np.asarray(names), runs=np.asarray(runs),
                             diverged=np.asarray(jax.device_get(state.diverged))[:real])
                shutil.rmtree(cdir, ignore_errors=True)
                rep.update(runs_done=rep.data["runs_done"] + real)
        rep.update(status="done", phase="done", exec_s=exec_s)
        return "done"
    except SweepStopped:
        rep.update(status="stopped", phase=f"stopped after {chunks_run} chunk(s)", exec_s=exec_s)
        return "stopped"
    except BaseException as e:
        rep.update(status="error", phase=f"{type(e).__name__}: {e}".splitlines()[0][:300])
        raise
    finally:
        if compile_cache:
            _restore_compile_cache(prev_cache)


# ============================================================================ parent: progress and workers
def _fmt_time(s: float) -> str:
    if not np.isfinite(s):
        return "?"
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Progress:
    """Aggregates the workers' progress into one bar: runs, iterations, env steps/s, ETA."""

    def __init__(self, total_runs: int, total_iters: int, total_steps: int, enabled: bool = True,
                 stream=None, interval: float | None = None):
        self.total_runs, self.total_iters, self.total_steps = total_runs, total_iters, total_steps
        self.enabled = enabled
        self.stream = stream or sys.stdout
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.interval = interval if interval is not None else (0.5 if self.tty else 10.0)
        self.workers: dict[int, dict] = {}
        self.t0 = time.time()
        self.t_first = None  # when new (non-resumed) env steps first appeared
        self.steps_first = 0
        self.last_print = 0.0
        self.last_line = ""
        self.lock = threading.Lock()

    def set(self, worker: int, data: dict):
        with self.lock:
            self.workers[worker] = data

    def totals(self):
        runs = sum(d.get("runs_done", 0) for d in self.workers.values())
        iters = sum(d.get("run_iterations", 0) for d in self.workers.values())
        steps = sum(d.get("env_steps", 0) for d in self.workers.values())
        resumed = sum(d.get("env_steps_resumed", 0) for d in self.workers.values())
        return runs, iters, steps, resumed

    def line(self) -> str:
        runs, iters, steps, resumed = self.totals()
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
                f" | {rate:,.0f} env steps/s | elapsed {_fmt_time(now - self.t0)} | ETA {_fmt_time(eta)} | {phase}")

    def show(self, force: bool = False):
        if not self.enabled:
            return
        now = time.time()
        if not force and now - self.last_print < self.interval:
            return
        with self.lock:
            text = self.line()
        if text == self.last_line and not force:
            return
        self.last_print, self.last_line = now, text
        if self.tty:
            self.stream.write("\r\x1b[2K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self):
        if self.enabled:
            self.show(force=True)
            if self.tty:
                self.stream.write("\n")
                self.stream.flush()


def _worker_env(cpu: int | None, config_flags: str = "") -> dict:
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
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if cpu is not None:
        env["COEVO_JAX_WORKER_CPU"] = str(cpu)
    return env


def _launch_workers(out, worker_ids, num_workers, cap, stop_after_chunks, compile_cache, progress: Progress,
                    config_flags: str = ""):
    """Start one subprocess per worker id, poll their progress files, return their statuses."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:
        cpus = []
    procs = {}
    logs = {}
    try:
        for i, w in enumerate(worker_ids):
            wdir = os.path.join(out, "checkpoints", f"w{w}")
            os.makedirs(wdir, exist_ok=True)
            cmd = [sys.executable, "-m", "coevo_jax.sweep", "--worker", out, "--worker-index", str(w),
                   "--num-workers", str(num_workers)]
            if cap is not None:
                cmd += ["--max-parallel", str(cap)]
            if stop_after_chunks is not None:
                cmd += ["--stop-after-chunks", str(stop_after_chunks)]
            if compile_cache:
                cmd += ["--compile-cache", compile_cache]
            cpu = cpus[i % len(cpus)] if cpus else None
            logs[w] = open(os.path.join(wdir, "log.txt"), "w")
            procs[w] = subprocess.Popen(cmd, env=_worker_env(cpu, config_flags), stdout=logs[w],
                                        stderr=subprocess.STDOUT)
        while True:
            for w in worker_ids:
                d = _read_json(os.path.join(out, "checkpoints", f"w{w}", "progress.json"))
                if d is not None:
                    progress.set(w, d)
            progress.show()
            codes = {w: p.poll() for w, p in procs.items()}
            failed = [w for w, c in codes.items() if c not in (None, 0)]
            if failed:
                w = failed[0]
                logs[w].flush()
                tail = open(os.path.join(out, "checkpoints", f"w{w}", "log.txt")).read().strip().splitlines()
                msg = next((ln for ln in reversed(tail) if ln.strip() and not ln.startswith(" ")), "no output")
                raise SweepError(f"worker {w} failed (exit {codes[w]}): {msg}"
                                 f" [log: {os.path.join(out, 'checkpoints', f'w{w}', 'log.txt')}]")
            if all(c == 0 for c in codes.values()):
                break
            time.sleep(0.5)
        statuses = {}
        for w in worker_ids:
            d = _read_json(os.path.join(out, "checkpoints", f"w{w}", "progress.json"), {})
            progress.set(w, d)
            statuses[w] = d.get("status", "missing")
        return statuses
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


# ============================================================================ output folder
def check_out(out: str, text: str, overwrite: bool) -> str:
    """Decide what to do with ``out``: ``"new"``, ``"resume"`` or ``"wipe"``.

    Raises :class:`SweepError` (one line) for a finished folder without
    ``overwrite``, a folder holding a different config's checkpoints, or a
    non-empty folder that is not a sweep folder. Writes nothing.
    """
    if not os.path.exists(out):
        return "new"
    if not os.path.isdir(out):
        raise SweepError(f"{out} exists and is not a folder")
    if not os.listdir(out):
        return "new"
    old = os.path.join(out, "config.json")
    if not os.path.exists(old):
        raise SweepError(f"{out} exists and is not a sweep output folder (no config.json); choose another --out")
    if os.path.exists(os.path.join(out, FINISHED_MARK)):
        if overwrite:
            return "wipe"
        raise SweepError(f"{out} holds a finished sweep; pass --overwrite (overwrite=True) to replace it,"
                         " or choose another --out")
    old_hash = config_hash(open(old).read())
    if old_hash != config_hash(text):
        if overwrite:
            return "wipe"
        raise SweepError(f"checkpoint in {out} is from a different config (hash {old_hash} != {config_hash(text)});"
                         " refusing to resume it: pass --overwrite to discard it, or choose another --out")
    return "resume"


def prepare_out(out: str, text: str, action: str) -> None:
    """Create/wipe ``out`` and write ``config.json`` (atomically)."""
    if action == "wipe":
        shutil.rmtree(out)
    os.makedirs(os.path.join(out, "checkpoints"), exist_ok=True)
    if action != "resume":
        atomic_write_text(os.path.join(out, "config.json"), text)


# ============================================================================ results
@dataclasses.dataclass
class SweepResult:
    """What a finished sweep returns (and wrote to ``out``)."""

    out: str
    config: SweepConfig
    curves: dict  # metric -> [runs, iterations] float32 (NaN where an arm lacks it / is shorter)
    runs: dict  # per-run metadata: arm, label, method, setting, seed, hp/<field>  [runs]
    summary: list  # one dict per (arm, setting)
    info: dict

    def select(self, label: str, **hp) -> np.ndarray:
        """Run indices of arm ``label`` whose swept/fixed HParams equal ``hp``."""
        mask = self.runs["label"] == label
        for k, v in hp.items():
            mask &= np.isclose(self.runs[f"hp/{k}"], v)
        return np.nonzero(mask)[0]


def merge_results(out: str, plans: list[ArmPlan], num_workers: int, cap, num_devices: int):
    """Assemble the per-batch result files of every worker into ``[runs, iterations]`` arrays."""
    per_arm = []
    for ai, plan in enumerate(plans):
        names, blocks, div = None, {}, np.zeros(plan.num_runs, bool)
        b = batch_size(plan.num_runs, num_workers, cap, num_devices)
        for w in range(num_workers):
            share = worker_share(plan.num_runs, w, num_workers)
            for bi, runs in enumerate(batches_of(share, b)):
                path = os.path.join(out, "checkpoints", f"w{w}", f"a{ai}_b{bi}.npz")
                with np.load(path) as z:
                    if not np.array_equal(z["runs"], runs):
                        raise SweepError(f"{path} holds runs {z['runs'].tolist()} but the layout expects"
                                         f" {runs.tolist()}; rerun with --overwrite")
                    n = [str(x) for x in z["names"]]
                    names = names or n
                    for j, name in enumerate(n):
                        blocks.setdefault(name, np.full((plan.num_runs, plan.num_iterations), np.nan, np.float32))
                        blocks[name][runs] = z["curves"][j]
                    div[runs] = z["diverged"]
        per_arm.append((blocks, div))
    return per_arm


def _assemble(config: SweepConfig, plans: list[ArmPlan], per_arm) -> tuple[dict, dict]:
    total = sum(p.num_runs for p in plans)
    iters = max(p.num_iterations for p in plans)
    names = sorted({n for blocks, _ in per_arm for n in blocks})
    curves = {n: np.full((total, iters), np.nan, np.float32) for n in names}
    runs = {"arm": [], "label": [], "method": [], "setting": [], "seed": [], "diverged": []}
    hp_cols = {f: [] for f in HPARAM_FIELDS}
    start = 0
    for ai, (plan, (blocks, div)) in enumerate(zip(plans, per_arm)):
        n = plan.num_runs
        for name, arr in blocks.items():
            curves[name][start:start + n, :arr.shape[1]] = arr
        r = np.arange(n)
        runs["arm"].append(np.full(n, ai))
        runs["label"].append(np.full(n, plan.arm.name, dtype=object))
        runs["method"].append(np.full(n, plan.arm.static.method, dtype=object))
        runs["setting"].append(r // config.num_seeds)
        runs["seed"].append(r % config.num_seeds)
        runs["diverged"].append(div)
        for f in HPARAM_FIELDS:
            hp_cols[f].append(np.asarray(getattr(plan.hp, f), np.float64)[r // config.num_seeds])
        start += n
    runs = {k: np.concatenate(v) for k, v in runs.items()}
    runs["label"] = runs["label"].astype(str)
    runs["method"] = runs["method"].astype(str)
    runs.update({f"hp/{f}": np.concatenate(v) for f, v in hp_cols.items()})
    return curves, runs


def resolve_threshold(config: SweepConfig, curves: dict) -> float:
    """``config.threshold``, or half of the best final return of any run."""
    if config.threshold is not None:
        return float(config.threshold)
    final = stats.tail_fraction_mean(curves[RETURN_METRIC], 0.1)
    best = np.nanmax(final) if np.isfinite(final).any() else np.nan
    return float(0.5 * best)


def summarize_runs(config: SweepConfig, plans: list[ArmPlan], curves: dict, runs: dict) -> list[dict]:
    """One row per (arm, setting): counts, final return (mean, IQM, 95% bootstrap CI of the IQM),
    final success, median steps to threshold, oscillation, plus the swept HParams values.

    Definitions: a run's *final* return / success is its mean over the last 10% of
    iterations; *steps to threshold* is the first env step from which the
    episode-weighted mean return over a trailing window of 10% of the iterations
    stays >= ``threshold`` to the end (:func:`stats.steps_to_sustained_threshold`;
    ``inf`` if never), median over seeds; *oscillation* is the variance of a run's
    return curve over the last 25% of iterations, mean over seeds. Diverged runs
    are kept (their frozen policy is what the setting produced) and counted.
    """
    threshold = resolve_threshold(config, curves)
    swept = []
    for p in plans:
        swept += [f for f in p.arm.grid if f not in swept]
    rows = []
    ret, steps = curves[RETURN_METRIC], curves["env_steps"]
    succ = curves.get(SUCCESS_METRIC)
    for ai, plan in enumerate(plans):
        for si, setting in enumerate(plan.settings):
            idx = np.nonzero((runs["arm"] == ai) & (runs["setting"] == si))[0]
            n_it = plan.num_iterations
            final = stats.tail_fraction_mean(ret[idx, :n_it], 0.1)
            s = stats.summarize(final, seed=ai * 1000 + si)
            weights = curves["episodes"][idx, :n_it] if "episodes" in curves else None
            sts = stats.steps_to_sustained_threshold(ret[idx, :n_it], steps[idx[0], :n_it], threshold,
                                                     window=max(1, n_it // 10), weights=weights)
            osc = stats.tail_fraction_variance(ret[idx, :n_it], 0.25)
            row = {
                "env": config.env, "method": plan.arm.name, "k": int(runs["hp/k"][idx[0]]),
                "n_seeds": len(idx), "n_diverged": int(runs["diverged"][idx].sum()),
                "final_return_mean": s["mean"], "final_return_iqm": s["iqm"],
                "final_return_ci_low": s["ci_low"], "final_return_ci_high": s["ci_high"],
                "final_success_mean": float(np.nanmean(stats.tail_fraction_mean(succ[idx, :n_it], 0.1)))
                if succ is not None else float("nan"),
                "steps_to_threshold_median": stats.median_steps(sts), "threshold": threshold,
                "return_oscillation_mean": float(np.nanmean(osc)) if np.isfinite(osc).any() else float("nan"),
                "env_steps": float(steps[idx[0], n_it - 1]),
            }
            for f in swept:
                if f != "k":
                    row[f] = float(runs[f"hp/{f}"][idx[0]])
            rows.append(row)
    return rows


def rows_to_csv(rows: list[dict]) -> str:
    """CSV text of summary rows (union of keys, in first-seen order)."""
    cols = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, restval="", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    return buf.getvalue()


def format_table(rows: list[dict], cols: Sequence[str] | None = None) -> str:
    """A fixed-width text table of summary rows."""
    if not rows:
        return "(no rows)"
    cols = list(cols or rows[0].keys())

    def fmt(v):
        if isinstance(v, float):
            return "inf" if v == math.inf else ("nan" if not np.isfinite(v) else f"{v:.4g}")
        return str(v)

    cells = [[fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def write_outputs(out: str, config: SweepConfig, plans, curves, runs, rows, info) -> None:
    """``curves.npz``, ``summary.csv``, ``run_info.json``, default plots; then ``FINISHED``."""
    arrays = {f"metric/{k}": v for k, v in curves.items()}
    arrays.update({f"run/{k}": v for k, v in runs.items()})
    atomic_savez(os.path.join(out, "curves.npz"), **arrays)
    atomic_write_text(os.path.join(out, "summary.csv"), rows_to_csv(rows))
    try:
        from coevo_jax import plots

        plots.sweep_default_plots(out, config, plans, curves, runs, rows)
    except Exception as e:  # noqa: BLE001 - a plotting failure must not lose the results
        info["plot_error"] = f"{type(e).__name__}: {e}"
    atomic_write_text(os.path.join(out, "run_info.json"), json.dumps(info, indent=1, default=float))
    atomic_write_text(os.path.join(out, FINISHED_MARK), time.strftime("%Y-%m-%d %H:%M:%S") + "\n")


def _parse_cell(text: str):
    """A CSV cell back to int / float (``inf``/``nan`` included) where it is one, else the text."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def load_result(out: str) -> SweepResult:
    """Read a finished sweep folder back into a :class:`SweepResult`."""
    text = open(os.path.join(out, "config.json")).read()
    config = SweepConfig.from_json(json.loads(text))
    with np.load(os.path.join(out, "curves.npz"), allow_pickle=False) as z:
        curves = {k[len("metric/"):]: z[k] for k in z.files if k.startswith("metric/")}
        runs = {k[len("run/"):]: z[k] for k in z.files if k.startswith("run/")}
    with open(os.path.join(out, "summary.csv")) as f:
        rows = [{k: _parse_cell(v) for k, v in r.items()} for r in csv.DictReader(f)]
    info = _read_json(os.path.join(out, "run_info.json"), {})
    return SweepResult(out, config, curves, runs, rows, info)


def rebuild_outputs(out: str) -> SweepResult:
    """Recompute ``summary.csv`` and the default plots of a finished sweep from its
    ``curves.npz`` (e.g. after a change to the statistics); runs nothing."""
    if not os.path.exists(os.path.join(out, FINISHED_MARK)):
        raise SweepError(f"{out} holds no finished sweep to rebuild")
    res = load_result(out)
    plans = build_plan(res.config, check_trainers=False)
    rows = summarize_runs(res.config, plans, res.curves, res.runs)
    atomic_write_text(os.path.join(out, "summary.csv"), rows_to_csv(rows))
    from coevo_jax import plots

    plots.sweep_default_plots(out, res.config, plans, res.curves, res.runs, rows)
    res.summary = rows
    return res


# ============================================================================ the entry point
def _barrier(name: str, timeout_s: int = 3600) -> None:
    """Wait for every host (no-op without ``jax.distributed``)."""
    import jax

    if jax.process_count() <= 1:
        return
    try:
        from jax._src import distributed

        distributed.global_state.client.wait_at_barrier(name, timeout_s * 1000)
    except Exception:  # noqa: BLE001 - fall back to a device barrier
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def run_sweep(config: SweepConfig, out: str, *, overwrite: bool = False, processes: int | None = None,
              max_parallel: int | None = None, stop_after_chunks: int | None = None, progress: bool = True,
              compile_cache: str | bool | None = True, distributed: Mapping | None = None,
              log=print) -> SweepResult | None:
    """Run (or resume) ``config`` into the folder ``out``.

    ``processes``: worker processes on this host (default: one per available
    core on CPU, 1 on GPU/TPU; 1 runs in this process). ``max_parallel``: runs
    resident at once on this host. ``stop_after_chunks``: stop every worker
    after that many chunks (a deliberate interruption; rerun to resume).
    ``compile_cache``: JAX's persistent compilation cache folder (``True``:
    :func:`default_compile_cache`; ``False``/``None``: off). ``distributed``:
    keyword arguments for ``jax.distributed.initialize`` (multi-host).

    Everything is validated before anything compiles or is written. Returns the
    :class:`SweepResult`, or ``None`` when stopped early or on hosts other than
    process 0.
    """
    import jax

    t_start = time.time()
    if processes is not None and (not isinstance(processes, (int, np.integer)) or processes < 1):
        raise ConfigError(f"processes={processes!r} must be an integer >= 1")
    if max_parallel is not None and (not isinstance(max_parallel, (int, np.integer)) or max_parallel < 1):
        raise ConfigError(f"max_parallel={max_parallel!r} must be an integer >= 1")
    if stop_after_chunks is not None and stop_after_chunks < 0:
        raise ConfigError(f"stop_after_chunks={stop_after_chunks!r} must be >= 0")
    try:
        text = config_text(config)
    except TypeError as e:
        raise ConfigError(f"config is not JSON-serialisable: {e}") from None
    config = SweepConfig.from_json(json.loads(text))  # the exact config the workers will read back
    if distributed and not jax.distributed.is_initialized():
        jax.distributed.initialize(**distributed)  # before any JAX computation
    plans = build_plan(config)
    action = check_out(out, text, overwrite)
    host, num_hosts = jax.process_index(), jax.process_count()
    out = os.path.abspath(out)
    layout_path = os.path.join(out, "checkpoints", "layout.json")
    saved = _read_json(layout_path) if action == "resume" else None
    backend = jax.default_backend()
    if processes is None:
        if saved:
            processes = saved["processes"]
        elif backend == "cpu":
            try:
                processes = len(os.sched_getaffinity(0))
            except AttributeError:
                processes = os.cpu_count() or 1
        else:
            processes = 1
    max_runs = max(p.num_runs for p in plans)
    processes = int(min(processes, max(1, math.ceil(max_runs / num_hosts))))
    if max_parallel is None and saved:
        max_parallel = saved["max_parallel"]
    layout = {"processes": processes, "max_parallel": max_parallel, "num_hosts": num_hosts}
    if saved and saved != layout:
        raise SweepError(f"checkpoints in {out} were written with layout {saved}, not {layout}; rerun with"
                         f" --processes {saved['processes']} --max-parallel {saved['max_parallel']}, or --overwrite")
    if host == 0:
        prepare_out(out, text, action)
        if not saved:
            atomic_write_text(layout_path, json.dumps(layout))
    _barrier("coevo_jax_sweep_prepared")
    if host != 0 and config_hash(open(os.path.join(out, "config.json")).read()) != config_hash(text):
        raise SweepError(f"host {host}: {out}/config.json differs from this host's config")
    cap = None if max_parallel is None else max(1, max_parallel // processes)
    num_workers = processes * num_hosts
    worker_ids = [host * processes + i for i in range(processes)]
    total_runs = sum(p.num_runs for p in plans)
    total_iters = sum(p.num_runs * p.num_iterations for p in plans)
    total_steps = sum(p.num_runs * p.num_iterations * p.arm.static.steps_per_iteration for p in plans)
    prog = Progress(total_runs, total_iters, total_steps, enabled=progress)
    if progress:
        log(f"sweep {config.study}: {total_runs} runs ({', '.join(f'{p.arm.name} x{p.num_runs}' for p in plans)})"
            f" on {config.env}, {total_steps:,} env steps; {num_workers} worker process(es)"
            f"{'' if num_hosts == 1 else f' over {num_hosts} hosts'}, backend {backend}"
            f"{'' if action != 'resume' else '; resuming from checkpoints'}; output {out}")
    cache = default_compile_cache() if compile_cache is True else (compile_cache or None)
    in_process = processes == 1 and all(f in os.environ.get("XLA_FLAGS", "").split() for f in config.xla_flags.split())
    if in_process:
        w = worker_ids[0]

        def cb(d):
            prog.set(w, d)
            prog.show()

        device_count = len(jax.local_devices())
        statuses = {w: run_worker(out, w, num_workers, cap, stop_after_chunks, cb, cache)}
    else:
        device_count = None
        statuses = _launch_workers(out, worker_ids, num_workers, cap, stop_after_chunks, cache, prog,
                                   config.xla_flags)
    if any(s != "done" for s in statuses.values()):
        prog.close()
        if progress:
            log(f"sweep stopped early ({stop_after_chunks} chunk(s) per worker); rerun the same command to resume")
        return None
    if host != 0:
        prog.close()
        if progress:
            log(f"host {host}: share done; process 0 merges and writes the results")
        return None
    # process 0: wait for the other hosts' workers (shared filesystem), then merge
    worker_info = {}
    while True:
        pend = []
        for w in range(num_workers):
            d = _read_json(os.path.join(out, "checkpoints", f"w{w}", "progress.json"), {})
            worker_info[w] = d
            if d.get("status") == "error":
                raise SweepError(f"worker {w} failed: {d.get('phase')}")
            if d.get("status") != "done":
                pend.append(w)
            prog.set(w, d)
        if not pend:
            break
        prog.show()
        time.sleep(2.0)
    prog.close()
    if device_count is None:
        device_count = int(worker_info[worker_ids[0]].get("devices", 1))
    per_arm = merge_results(out, plans, num_workers, cap, device_count)
    curves, runs = _assemble(config, plans, per_arm)
    rows = summarize_runs(config, plans, curves, runs)
    wall = time.time() - t_start
    exec_steps = sum(d.get("env_steps", 0) - d.get("env_steps_resumed", 0) for d in worker_info.values())
    info = {
        "wall_s": wall, "backend": backend, "num_hosts": num_hosts, "processes_per_host": processes,
        "devices_per_process": device_count, "max_parallel": max_parallel, "total_runs": total_runs,
        "total_env_steps": total_steps, "env_steps_this_call": exec_steps,
        "env_steps_per_s_wall": exec_steps / wall if wall > 0 else float("nan"),
        "workers": {str(w): {k: d.get(k) for k in ("compile_s", "exec_s", "peak_rss_mb", "memory", "devices")}
                    for w, d in worker_info.items()},
    }
    write_outputs(out, config, plans, curves, runs, rows, info)
    if progress:
        mem = []
        for w, d in worker_info.items():
            for arm, m in (d.get("memory") or {}).items():
                mem.append(f"{arm}: {m['compiled_bytes_per_run'] / 2**20:.2f} MiB/run (batch {m['batch']})")
        peak = max((d.get("peak_rss_mb") or 0) for d in worker_info.values())
        log(f"done in {_fmt_time(wall)}: {exec_steps / wall:,.0f} env steps/s overall;"
            f" peak RSS per process {peak:.0f} MiB; compiled memory {'; '.join(sorted(set(mem)))}")
    return SweepResult(out, config, curves, runs, rows, info)


# ============================================================================ shared CLI options
def add_execution_args(parser: argparse.ArgumentParser) -> None:
    """The options every sweep script shares (execution only; none changes results)."""
    g = parser.add_argument_group("execution (none of these changes the results)")
    g.add_argument("--max-parallel", type=int, default=None, metavar="N",
                   help="at most N runs resident at once on this host, >= 1 (default: all runs of an arm)")
    g.add_argument("--processes", type=int, default=None, metavar="P",
                   help="worker processes on this host, >= 1 (default: one per core on CPU, 1 on GPU/TPU)")
    g.add_argument("--no-compile-cache", action="store_true",
                   help=f"do not use JAX's persistent compilation cache (default: on, in {default_compile_cache()})")
    g.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                   help="multi-host: jax.distributed coordinator address (default: single host)")
    g.add_argument("--num-hosts", type=int, default=None, metavar="N",
                   help="multi-host: number of hosts, >= 1 (default: 1)")
    g.add_argument("--host-index", type=int, default=None, metavar="I",
                   help="multi-host: this host's index, 0 .. N-1 (default: 0)")
    g.add_argument("--stop-after-chunks", type=int, default=None, metavar="C",
                   help="stop each worker after C chunks (to test resuming); default: run to the end")


def execution_kwargs(args) -> dict:
    """``run_sweep`` keyword arguments from :func:`add_execution_args` options (validated)."""
    if args.max_parallel is not None and args.max_parallel < 1:
        raise ConfigError(f"--max-parallel={args.max_parallel} must be >= 1")
    if args.processes is not None and args.processes < 1:
        raise ConfigError(f"--processes={args.processes} must be >= 1")
    if args.stop_after_chunks is not None and args.stop_after_chunks < 0:
        raise ConfigError(f"--stop-after-chunks={args.stop_after_chunks} must be >= 0")
    dist = None
    if args.coordinator or args.num_hosts or args.host_index is not None:
        if not (args.coordinator and args.num_hosts and args.host_index is not None):
            raise ConfigError("multi-host needs all of --coordinator, --num-hosts and --host-index")
        if args.num_hosts < 1 or not 0 <= args.host_index < args.num_hosts:
            raise ConfigError(f"--host-index={args.host_index} must be in [0, --num-hosts={args.num_hosts})")
        dist = {"coordinator_address": args.coordinator, "num_processes": args.num_hosts,
                "process_id": args.host_index}
    return {"max_parallel": args.max_parallel, "processes": args.processes,
            "compile_cache": not args.no_compile_cache, "distributed": dist,
            "stop_after_chunks": args.stop_after_chunks}


def _exit_with_parent(poll_s: float = 2.0) -> None:
    """End this worker if the process that started it dies (so no orphan keeps computing)."""
    parent = os.getppid()

    def watch():
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def _worker_cli(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m coevo_jax.sweep",
                                description="A sweep worker process (started by run_sweep; not for direct use).")
    p.add_argument("--worker", required=True, metavar="OUT", help="the sweep's output folder")
    p.add_argument("--worker-index", type=int, required=True)
    p.add_argument("--num-workers", type=int, required=True)
    p.add_argument("--max-parallel", type=int, default=None)
    p.add_argument("--stop-after-chunks", type=int, default=None)
    p.add_argument("--compile-cache", default=None)
    a = p.parse_args(argv)
    _exit_with_parent()
    status = run_worker(a.worker, a.worker_index, a.num_workers, a.max_parallel, a.stop_after_chunks, None,
                        a.compile_cache)
    print(f"worker {a.worker_index}: {status}")
    return 0


if __name__ == "__main__":
    sys.exit(_worker_cli())
