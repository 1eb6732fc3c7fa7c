"""Compiled batch programs: one arm's ``init`` and chunk for a batch shape, and
their hand-over between the workers of one launch.

A worker compiles ``jit(vmap(Trainer.init))`` and one chunk of
``jit(vmap(Trainer.run_chunk))`` (:func:`compile_program`). The launcher gives
the workers it starts one fresh folder (a *program store*); a worker that
compiled a program writes it there as serialized executables
(:func:`save_program`), and a worker that needs the same program
(:func:`program_key`) loads it (:func:`load_program`) instead of compiling.
A worker about to compile first claims the program (:func:`obtain_program`);
a worker that finds it claimed waits for it and loads it, instead of compiling
the same program beside the other one (two workers that start with the same
arm, as in every one-arm study). Compiles take turns (:func:`compile_turn`):
one at a time over the launch, each on every core, ahead of the other
workers' chunks (:mod:`coevo_jax.experiment.cpu_priority`).
(A program that came out of JAX's persistent cache is not written: such an
executable serializes without its kernels. The other worker then finds it in
that cache too.)
JAX's persistent compilation cache would share it too, but only after
re-tracing and re-lowering the program to find its cache key (3-5 s for the
main job's programs); loading the executables takes about half a second. The
store lives as long as the launch, so every program in it was compiled from the
code the loading worker runs.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import pickle
import time

import numpy as np

from coevo_jax.experiment.folder import atomic_write_bytes
from coevo_jax.registry import program_of

BATCH_AXIS = "runs"  # the vmapped (and sharded) run axis; K-gated refits branch on it (Trainer.batch_axis)
# ``init`` runs once per batch: compiled without LLVM optimisation it compiles ~3x faster (5-7 s -> ~2 s for the
# main job's arms) and its run time (network init, env reset) stays negligible
INIT_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0}


@dataclasses.dataclass
class Program:
    """One arm's compiled batch program and what its batches need."""

    init: object
    chunk: object
    state_abstract: object
    sharding: object
    compile_s: float  # seconds to compile it (trace + lower + XLA), or to load it from a program store
    bytes_per_run: float
    from_cache: bool = False  # XLA's work came from JAX's persistent cache: such executables serialize
    # without their kernels (running a loaded copy fails with "Function ... not found"), so they are not stored


def batch_sharding(devices):
    """The run axis sharded over ``devices``."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    return NamedSharding(Mesh(np.asarray(devices), (BATCH_AXIS,)), PartitionSpec(BATCH_AXIS))


def compile_program(trainer, hp, b: int, chunk_len: int, devices) -> Program:
    """Compile ``init`` and one ``chunk_len``-iteration chunk for ``b`` runs sharded over ``devices``."""
    import jax

    sharding = batch_sharding(devices)

    def init_batch(keys, hp):
        return jax.vmap(trainer.init)(keys, hp)

    def chunk_batch(state, hp):
        return jax.vmap(lambda s, h: trainer.run_chunk(s, h, chunk_len), axis_name=BATCH_AXIS)(state, hp)

    def spec(x):
        return jax.ShapeDtypeStruct((b,) + x.shape[1:], x.dtype, sharding=sharding)

    keys_abs = jax.ShapeDtypeStruct((b, 2), np.uint32, sharding=sharding)
    hp_abs = jax.tree.map(spec, hp)
    hits = []

    def count_hits(event, **_):
        if event == "/jax/compilation_cache/cache_hits":
            hits.append(event)

    t0 = time.time()
    jax.monitoring.register_event_listener(count_hits)
    try:
        init_c = jax.jit(init_batch, out_shardings=sharding).lower(keys_abs, hp_abs).compile(INIT_COMPILER_OPTIONS)
        state_abs = jax.tree.map(spec, jax.eval_shape(init_batch, keys_abs, hp_abs))
        chunk_c = jax.jit(chunk_batch, out_shardings=sharding, donate_argnums=0).lower(state_abs, hp_abs).compile()
    finally:
        jax.monitoring.unregister_event_listener(count_hits)
    seconds = time.time() - t0
    m = chunk_c.memory_analysis()
    per_run = float("nan") if m is None else (
        m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes) / b
    return Program(init_c, chunk_c, state_abs, sharding, seconds, per_run, bool(hits))


def program_key(plan, b: int) -> tuple:
    """What a compiled batch program depends on: the arm's static config (its method
    as the one whose program it runs, :func:`~coevo_jax.registry.program_of`), the
    batch and chunk sizes and the hparams' structure (not their values, which are inputs)."""
    import jax

    static = plan.arm.static.replace(method=program_of(plan.arm.static.method))
    leaves, treedef = jax.tree.flatten(plan.hp)
    return static, b, plan.chunk_len, treedef, tuple((np.shape(x)[1:], np.asarray(x).dtype) for x in leaves)


def _path(store: str, key: tuple) -> str:
    return os.path.join(store, hashlib.sha256(repr(key).encode()).hexdigest()[:32] + ".pkl")


def save_program(store: str, key: tuple, program: Program) -> None:
    """Write ``program`` to the store under ``key`` (atomically: a reader sees all of it or nothing);
    a program that came from the persistent cache is not written (see ``Program.from_cache``)."""
    import jax
    from jax.experimental.serialize_executable import serialize

    if program.from_cache:
        return
    leaves, treedef = jax.tree.flatten(program.state_abstract)
    payload = {"key": repr(key), "init": serialize(program.init), "chunk": serialize(program.chunk),
               "state": (treedef, [(x.shape, x.dtype) for x in leaves]), "bytes_per_run": program.bytes_per_run}
    atomic_write_bytes(_path(store, key), pickle.dumps(payload))


def load_program(store: str, key: tuple, devices) -> Program | None:
    """The program another worker of this launch saved under ``key``, or ``None``
    (not there yet, or unreadable: the caller then compiles it)."""
    import jax
    from jax.experimental.serialize_executable import deserialize_and_load

    path = _path(store, key)
    if not os.path.exists(path):
        return None
    t0 = time.time()
    try:
        with open(path, "rb") as f:
            payload = pickle.load(f)
        if payload["key"] != repr(key):  # a hash collision
            return None
        init_c, chunk_c = (deserialize_and_load(*payload[k]) for k in ("init", "chunk"))
    except Exception:  # noqa: BLE001 -- a store is an optimisation: any failure falls back to compiling
        return None
    sharding = batch_sharding(devices)
    treedef, shapes = payload["state"]
    state_abs = treedef.unflatten([jax.ShapeDtypeStruct(s, d, sharding=sharding) for s, d in shapes])
    return Program(init_c, chunk_c, state_abs, sharding, time.time() - t0, payload["bytes_per_run"])


def _claim_path(store: str, key: tuple) -> str:
    return _path(store, key)[:-len(".pkl")] + ".claim"


def _turn_path(store: str) -> str:
    return os.path.join(store, "compile.turn")


def _take(path: str) -> bool:
    """Create ``path`` exclusively, holding this process's id: ``True`` when it
    did not exist (or no usable store: then nothing is shared to hold)."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    except OSError:
        return True
    with os.fdopen(fd, "w") as f:
        f.write(str(os.getpid()))
    return True


def _drop(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _holder_alive(path: str) -> bool:
    """Whether the process named in a claim or turn file runs (one still being written counts as alive)."""
    try:
        with open(path) as f:
            pid = int(f.read())
    except (OSError, ValueError):  # released meanwhile, or its process id not written yet
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        pass
    return True


def claim_program(store: str, key: tuple) -> bool:
    """Claim the compile of ``key``'s program for this process: ``True`` when
    no other process of the launch holds the claim (the caller compiles, saves
    and :func:`release_claim`), ``False`` when one does."""
    return _take(_claim_path(store, key))


def release_claim(store: str, key: tuple) -> None:
    """Drop this process's claim on ``key`` (after saving its program, or failing to compile it)."""
    _drop(_claim_path(store, key))


def wait_for_program(store: str, key: tuple, devices, poll_s: float = 0.2) -> Program | None:
    """Wait while another process holds the claim on ``key``; the program it
    saved, or ``None`` when it released the claim without saving one (its
    program came from the persistent cache) or died holding it."""
    claim = _claim_path(store, key)
    while True:
        held = os.path.exists(claim)
        program = load_program(store, key, devices)
        if program is not None or not held or not _holder_alive(claim):
            return program
        time.sleep(poll_s)


@contextlib.contextmanager
def compile_turn(store: str, on_wait=None, poll_s: float = 0.2):
    """Hold the launch's compile turn: one compile at a time over its workers.

    Two compiles side by side on a 2-core machine each take about their CPU
    time; one alone runs its code generation on both cores (1.5x faster), and
    the other workers' chunks, at a lower CPU priority (:mod:`~coevo_jax.experiment.cpu_priority`),
    fill what it leaves. A turn left by a dead process is taken over. It is an
    optimisation only: should two workers ever hold it at once (a race on a
    dead holder's file), they compile side by side as without it.
    ``on_wait()`` is called once if the turn has to be waited for.
    """
    path = _turn_path(store)
    while not _take(path):
        if not _holder_alive(path):
            _drop(path)
            continue
        if on_wait is not None:
            on_wait()
            on_wait = None
        time.sleep(poll_s)
    try:
        yield
    finally:
        _drop(path)


def obtain_program(store: str | None, key: tuple, devices, compile_fn, on_wait=None
                   ) -> tuple[Program, str, float]:
    """``key``'s program, where it came from, and the seconds spent waiting for
    another worker (for its program or for the compile turn, :func:`compile_turn`).

    The source is ``"loaded"`` from the store, ``"waited"`` for while another
    worker compiled it, or ``"compiled"`` here by ``compile_fn()`` (then saved
    to the store, when there is one). ``on_wait(what)`` is called when a wait
    starts, ``what`` being ``"program"`` or ``"turn"``.
    """
    if store is None:
        return compile_fn(), "compiled", 0.0
    program = load_program(store, key, devices)
    if program is not None:
        return program, "loaded", 0.0
    t0 = time.time()
    claimed = claim_program(store, key)
    if not claimed:
        if on_wait is not None:
            on_wait("program")
        program = wait_for_program(store, key, devices)
        if program is not None:
            return program, "waited", time.time() - t0 - program.compile_s
    try:
        with compile_turn(store, None if on_wait is None else lambda: on_wait("turn")):
            waited = time.time() - t0
            program = compile_fn()
            save_program(store, key, program)
    finally:
        if claimed:
            release_claim(store, key)
    return program, "compiled", waited
