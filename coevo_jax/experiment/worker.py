"""Run a study's arms (one process per host, every host making the same calls): compile each arm's
``init`` and one chunk of ``jit(shard_map(vmap(Trainer.run_chunk)))`` per batch shape, then run each
batch chunk by chunk from its checkpoint with an orbax checkpoint after each."""
from __future__ import annotations

import dataclasses
import json
import os
import resource
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.compilation_cache import compilation_cache as cc
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from coevo_jax.experiment import checkpoint
from coevo_jax.experiment.plan import arm_batches, run_keys
from coevo_jax.files import atomic_write_text
from coevo_jax.registry import method_spec
from coevo_jax.train import Trainer

BATCH_AXIS = "runs"  # the vmapped run axis; K-gated refits branch on it (Trainer.batch_axis)
DEVICE_AXIS = "devices"  # the mesh axis the batch is split over
# ``init`` runs once per batch: compiled without LLVM optimisation it compiles faster, and its run time
# (network init, env reset) stays negligible
INIT_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0}


class Stopped(Exception):
    """Raised when ``stop_after_chunks`` is reached (a deliberate interruption)."""


@dataclasses.dataclass
class Program:
    """One arm's compiled batch program: ``init(keys, hp)``, ``chunk(state, hp)``."""

    init: object
    chunk: object
    state_abstract: object
    sharding: object
    bytes_per_run: float


def compile_program(trainer, hp, b: int, chunk_len: int, devices) -> Program:
    """Compile ``init`` and one ``chunk_len``-iteration chunk for ``b`` runs, ``b / len(devices)`` per device."""
    mesh = Mesh(np.asarray(devices), (DEVICE_AXIS,))
    split = PartitionSpec(DEVICE_AXIS)
    sharding = NamedSharding(mesh, split)

    def per_device(f):
        return jax.shard_map(f, mesh=mesh, in_specs=(split, split), out_specs=split, check_vma=False)

    init_batch = per_device(jax.vmap(trainer.init))
    chunk_batch = per_device(jax.vmap(lambda s, h: trainer.run_chunk(s, h, chunk_len), axis_name=BATCH_AXIS))

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
    """What a compiled batch program depends on: the static config less the method name, what the method
    traces (factory, intrinsic stream), batch and chunk sizes, the hparams' structure. Methods equal in
    all of these share a program."""

    spec = method_spec(plan.arm.static.method)
    leaves, treedef = jax.tree.flatten(plan.hp)
    static = dataclasses.replace(plan.arm.static, method="")  # (the method's static options kept as they are)
    return (static, spec.factory, spec.intrinsic_stream, b, plan.chunk_len, treedef,
            tuple((np.shape(x)[1:], np.asarray(x).dtype) for x in leaves))


def default_compile_cache() -> str:
    """``$COEVO_JAX_COMPILE_CACHE`` or ``~/.cache/coevo_jax/xla``."""
    return os.environ.get("COEVO_JAX_COMPILE_CACHE") or os.path.expanduser("~/.cache/coevo_jax/xla")


def set_compile_cache(path: str | None) -> str | None:
    """Point JAX's persistent compilation cache at ``path``; returns the previous folder."""
    prev = jax.config.jax_compilation_cache_dir
    if path:
        os.makedirs(path, exist_ok=True)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    jax.config.update("jax_compilation_cache_dir", path)
    cc.reset_cache()
    return prev


class Reporter:
    """This process's progress (passed to ``callback``) and, at the end, the same in the JSON file ``path``."""

    def __init__(self, path: str, callback=None):
        self.path, self.callback = path, callback
        self.data = {"status": "running", "phase": "starting", "env_steps": 0, "env_steps_resumed": 0,
                     "run_iterations": 0, "runs_done": 0, "memory": {}, "compile_s": {}, "exec_s": 0.0}

    def add(self, **kw):
        self.update(**{k: self.data[k] + v for k, v in kw.items()})

    def update(self, **kw):
        self.data.update(kw)
        if self.callback is not None:
            self.callback(dict(self.data))

    def write(self, status: str):
        self.data.update(status=status, peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
        atomic_write_text(self.path, json.dumps(self.data))


def global_array(x: np.ndarray, sharding):
    """``x`` (the same on every host) as a jax.Array placed by ``sharding`` (each host fills its devices)."""
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


def run_arms(out: str, study, plans, digest: str, devices, max_parallel: int | None,
              stop_after_chunks: int | None, callback=None) -> str:
    """Run (or resume) every arm of the study in ``out`` on ``devices`` (under ``jax.distributed`` every
    host's). Writes ``out/checkpoints/a{arm}_b{batch}`` per batch and this host's
    ``out/checkpoints/host{i}.json``; returns ``"done"`` or ``"stopped"`` (``stop_after_chunks``)."""
    env, env_params = study.make_env()
    rep = Reporter(os.path.join(out, "checkpoints", f"host{jax.process_index()}.json"), callback)
    rep.update(devices=len(devices))
    cap = None if max_parallel is None else max_parallel * jax.process_count()
    chunks_run, programs = 0, {}  # program_key -> Program, shared by the arms
    try:
        for ai, plan in enumerate(plans):
            b, batches = arm_batches(plan, cap, len(devices))
            n_chunks = plan.num_iterations // plan.chunk_len
            folders = [os.path.join(out, "checkpoints", f"a{ai}_b{bi}") for bi in range(len(batches))]
            done = [checkpoint.finished(f, n_chunks) for f in folders]
            n = sum(len(r) for r, d in zip(batches, done) if d)  # runs finished before a resume
            steps = n * plan.num_iterations * plan.arm.static.steps_per_iteration
            rep.add(env_steps=steps, env_steps_resumed=steps, run_iterations=n * plan.num_iterations, runs_done=n)
            if all(done):
                continue
            key, t0 = program_key(plan, b), time.time()
            rep.data["compile_s"][plan.arm.name] = 0.0  # an arm that differs from one compiled here only in hparams
            if key not in programs:
                rep.update(phase=f"compiling {plan.arm.name} ({b} runs/batch on {len(devices)} device(s))")
                programs[key] = compile_program(Trainer(plan.arm.static, env, env_params, batch_axis=BATCH_AXIS),
                                                plan.hp, b, plan.chunk_len, devices)
                rep.data["compile_s"][plan.arm.name] = time.time() - t0
            rep.data["memory"][plan.arm.name] = {"compiled_bytes_per_run": programs[key].bytes_per_run, "batch": b}
            for bi in (bi for bi, d in enumerate(done) if not d):
                chunks_run = run_batch(study, plan, programs[key], batches[bi], b, folders[bi], digest, rep,
                                       chunks_run, stop_after_chunks, f"{plan.arm.name} batch {bi + 1}/{len(batches)}")
        rep.write("done")
        return "done"
    except Stopped:
        rep.write("stopped")
        return "stopped"


def run_batch(study, plan, program: Program, runs: np.ndarray, b: int, cdir: str, digest: str,
              rep: Reporter, chunks_run: int, stop_after: int | None, label: str) -> int:
    """Run one batch to the end from its checkpoint or from scratch; returns the chunk count.
    :class:`Stopped` after ``stop_after`` chunks."""
    real = len(runs)
    padded = np.concatenate([runs, np.repeat(runs[-1:], b - real)])  # copies of a real run, dropped at the end
    setting, seed = padded // study.num_seeds, padded % study.num_seeds
    hp = jax.tree.map(lambda x: global_array(np.asarray(x)[setting], program.sharding), plan.hp)
    along_runs = NamedSharding(program.sharding.mesh, PartitionSpec(None, DEVICE_AXIS))  # curves [M, B, I]
    record = checkpoint.BatchRecord(digest, b, tuple(int(r) for r in runs))
    mngr = checkpoint.manager(cdir, keep_all=study.save_chunks)
    got = checkpoint.restore(mngr, record, program.state_abstract, along_runs)
    if got is None:
        got = program.init(global_array(run_keys(study.base_seed, seed), program.sharding), hp), None, None, 0
    state, curves, names, done = got
    steps_per_chunk = real * plan.chunk_len * plan.arm.static.steps_per_iteration
    rep.add(env_steps_resumed=done * steps_per_chunk, env_steps=done * steps_per_chunk,
            run_iterations=real * done * plan.chunk_len)
    n_chunks = plan.num_iterations // plan.chunk_len
    try:
        while done < n_chunks:
            if stop_after is not None and chunks_run >= stop_after:
                raise Stopped()
            rep.update(phase=f"{label} chunk {done + 1}/{n_chunks}")
            t0 = time.time()
            state, metrics = program.chunk(state, hp)
            names = names or sorted(metrics)
            block = _stack([metrics[n] for n in names])
            curves = block if curves is None else _append(curves, block)
            jax.block_until_ready(curves)
            exec_s = time.time() - t0  # the chunk alone (checkpointing is timed apart)
            done, chunks_run = done + 1, chunks_run + 1
            keep = done < n_chunks or study.save_final or study.save_chunks  # the state, to resume or to study
            checkpoint.save(mngr, done, state if keep else None, curves, record.meta(names, plan.chunk_len))
            rep.add(env_steps=steps_per_chunk, run_iterations=real * plan.chunk_len, exec_s=exec_s)
    finally:
        mngr.close()
    rep.add(runs_done=real)
    return chunks_run


@jax.jit
def _stack(metrics: list):
    """A chunk's metrics ``[B, L]`` each, as one float32 block ``[M, B, L]`` on the batch's devices."""
    return jnp.stack([m.astype(jnp.float32) for m in metrics])


@jax.jit
def _append(curves, block):
    """``curves [M, B, I]`` followed by ``block [M, B, L]`` along the iterations."""
    return jnp.concatenate([curves, block], axis=-1)
