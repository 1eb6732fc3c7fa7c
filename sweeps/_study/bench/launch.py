"""Measurement processes: every measurement runs in fresh processes started here
(with the no-hang XLA flag), and PureJaxRL's own ``ppo.py`` runs unmodified in
its processes through the harness ``../shared/tools/purejaxrl_bench.py``.

A :class:`Budget` caps the wall time of a whole benchmark: a measurement that
would start after it is spent raises :class:`OutOfTime`, and a running one is
stopped when it runs out.
"""
from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SWEEPS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # holds _study
ROOT = os.path.dirname(SWEEPS)  # the repository
from coevo_jax.runtime import SAFE_FLAG as SAFE  # noqa: E402  (every child gets the no-hang flag)
# PureJaxRL's published ppo.py / wrappers.py and the harness that runs them unmodified, beside the repository
DEFAULT_PUREJAXRL = os.path.join(ROOT, "..", "shared", "anchors", "purejaxrl")
DEFAULT_PUREJAXRL_TOOL = os.path.join(ROOT, "..", "shared", "tools", "purejaxrl_bench.py")
IMPLS = ("purejaxrl", "coevo-jax")


class OutOfTime(RuntimeError):
    """The benchmark's time budget was spent before or during a measurement."""


class Budget:
    """Wall-clock budget of a whole benchmark from now (``seconds=None``: unlimited)."""

    def __init__(self, seconds: float | None = None):
        self.end = None if seconds is None else time.time() + seconds

    def spent(self) -> bool:
        return self.end is not None and time.time() > self.end - 1.0

    def clip(self, timeout: float) -> float:
        """``timeout`` capped to what is left; :class:`OutOfTime` when nothing is."""
        if self.spent():
            raise OutOfTime("the time budget (--deadline) was spent")
        return timeout if self.end is None else min(timeout, self.end - time.time())


def anchor_paths(purejaxrl: str | None, tool: str | None) -> tuple[str | None, str | None, str | None]:
    """Where PureJaxRL's unmodified ``ppo.py`` and the harness that runs it are.

    ``purejaxrl``: a folder with PureJaxRL's ``ppo.py`` and ``wrappers.py``
    (``None``: ``../shared/anchors/purejaxrl`` beside the repository); ``tool``:
    the harness (``None``: ``../shared/tools/purejaxrl_bench.py``). Returns
    ``(folder, tool, None)`` when both are there, else ``(None, None, why)``
    where ``why`` says what is missing and how to get a PureJaxRL checkout.
    """
    folder = os.path.normpath(purejaxrl or DEFAULT_PUREJAXRL)
    tool = os.path.normpath(tool or DEFAULT_PUREJAXRL_TOOL)
    if not os.path.isfile(os.path.join(folder, "ppo.py")) or not os.path.isfile(os.path.join(folder, "wrappers.py")):
        why = (f"no PureJaxRL ppo.py and wrappers.py in {folder}. To get them: git clone "
               "https://github.com/luchris429/purejaxrl and pass its purejaxrl/ folder: "
               "--purejaxrl <checkout>/purejaxrl")
    elif not os.path.isfile(tool):
        why = (f"no PureJaxRL harness at {tool} (the script that runs PureJaxRL's ppo.py unmodified on "
               "gymnax 1.0); pass it with --purejaxrl-tool PATH")
    else:
        return folder, tool, None
    return None, None, "PureJaxRL rows skipped: " + why


def child_env(extra: dict | None = None) -> dict:
    return {**os.environ, "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " " + SAFE).strip(),
            "PYTHONPATH": os.pathsep.join((ROOT, SWEEPS, os.environ.get("PYTHONPATH", ""))), **(extra or {})}


def worker_cmd(cfg: dict) -> list:
    """The command that runs one measurement of :mod:`_study.bench.workers`."""
    return [sys.executable, "-m", "_study.bench.workers", json.dumps(cfg)]


def run_processes(cmds: list, timeout: float, budget: Budget | None = None, pin: bool = False,
                  env: dict | None = None) -> list[str]:
    """Start ``cmds`` together (process ``i`` pinned to core ``i % cores`` when
    ``pin``; ``env``: variables added to their environment), wait up to
    ``timeout`` s (capped by ``budget``) for all of them and return their
    stdouts. A failed process raises ``RuntimeError`` with its last stderr
    lines; running out of time kills them all and raises
    :class:`OutOfTime` (budget spent) or ``TimeoutError``."""
    limit = (budget or Budget()).clip(timeout)
    ncpu = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="bench_") as tmp, contextlib.ExitStack() as files:
        procs = []
        try:
            for i, cmd in enumerate(cmds):
                fo, fe = (files.enter_context(open(os.path.join(tmp, f"{i}.{x}"), "w+")) for x in ("out", "err"))
                cores = {i % ncpu}
                pre = (lambda: os.sched_setaffinity(0, cores)) if pin and hasattr(os, "sched_setaffinity") else None
                procs.append((subprocess.Popen(cmd, stdout=fo, stderr=fe, env=child_env(env), cwd=ROOT,
                                               preexec_fn=pre), fo, fe))
            end = time.time() + limit
            for p, _, _ in procs:
                p.wait(timeout=max(1.0, end - time.time()))
        except subprocess.TimeoutExpired:
            if budget is not None and budget.spent():
                raise OutOfTime("the time budget (--deadline) ran out during a measurement") from None
            raise TimeoutError(f"a measurement ran past its {limit:.0f} s limit (--timeout)") from None
        finally:
            for p, _, _ in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        outs = []
        for p, fo, fe in procs:
            fo.seek(0)
            fe.seek(0)
            out, err = fo.read(), fe.read()
            if p.returncode != 0:
                what = p.args[3][:60] if p.args[1] == "-m" else os.path.basename(p.args[1])
                raise RuntimeError(f"{what} exited with {p.returncode}: {' | '.join(err.strip().splitlines()[-3:])}")
            outs.append(out)
    return outs


def parse_result(stdout: str) -> dict:
    """The ``RESULT {json}`` line a worker prints last."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        raise RuntimeError("the worker printed no RESULT line")
    return json.loads(lines[-1][len("RESULT "):])


def run_worker(cfg: dict, timeout: float, budget: Budget | None = None) -> dict:
    """Run one measurement (``cfg["kind"]`` names it) in a fresh process; return its result."""
    return parse_result(run_processes([worker_cmd(cfg)], timeout, budget)[0])


def measure_each(cfgs: list, timeout: float, budget: Budget | None = None, log=None) -> tuple[list, list]:
    """Run the measurements ``cfgs`` one after the other: ``([(cfg, result)], notes)``.
    A failed one is noted and skipped; the budget running out stops the loop."""
    rows, notes = [], []
    for cfg in cfgs:
        what = ", ".join(f"{k} {v}" for k, v in cfg.items() if isinstance(v, (int, str)))
        try:
            rows.append((cfg, run_worker(cfg, timeout, budget)))
        except OutOfTime as e:
            notes.append(f"Not measured from ({what}) on: {e}.")
            break
        except (RuntimeError, OSError) as e:
            notes.append(f"({what}) failed: {e}")
            if log:
                log(notes[-1])
    return rows, notes


_PROBE: dict = {}


def probe(budget: Budget | None = None) -> dict:
    """Backend, device and large-matmul GFLOP/s (the ``probe`` worker), measured once per process."""
    if not _PROBE:
        _PROBE.update(run_worker({"kind": "probe"}, 300, budget))
    return _PROBE


def ppo_batch(impl: str, seeds: int, procs: int, total_steps: int, timeout: float, anchor: str | None = None,
              tool: str | None = None, runs: int = 2, budget: Budget | None = None, program: str = "ppo") -> dict:
    """One measurement: ``procs`` fresh processes started together, each with its
    share of ``seeds`` (pinned to one core each when ``procs > 1``). ``impl``:
    ``"purejaxrl"`` (the harness running PureJaxRL's ``program``.py, its JSON parsed),
    ``"coevo-jax"`` (the ``ppo`` worker, with the GRU policy for ``program="ppo_rnn"``). Env steps/s is the
    sum over processes of each one's steady (last) run of its compiled program; compile seconds and peak RSS
    the largest of any process."""
    counts = [seeds // procs + (i < seeds % procs) for i in range(procs)]
    with tempfile.TemporaryDirectory(prefix="bench_ppo_") as tmp:
        jsons = [os.path.join(tmp, f"{i}.json") for i in range(procs)]
        if impl == "purejaxrl":
            cmds = [[sys.executable, tool, "--seeds", str(n), "--total-timesteps", str(total_steps), "--mode", "aot",
                     "--runs", str(runs), "--src", anchor, "--seed", str(42 + i), "--json", jsons[i],
                     "--program", program]
                    for i, n in enumerate(counts)]
        else:
            cmds = [worker_cmd({"kind": "ppo", "seeds": n, "total_steps": total_steps, "seed": 42 + i, "runs": runs,
                                 "program": program})
                    for i, n in enumerate(counts)]
        outs = run_processes(cmds, timeout, budget, pin=procs > 1)
        if impl == "purejaxrl":
            results = []
            for path in jsons:
                with open(path) as f:
                    r = json.load(f)
                results.append({"trace_lower_s": r["trace_lower_s"], "compile_s": r["compile_s"],
                                "env_steps_per_s": r["env_steps_per_s"], "peak_mb": r["max_rss_gib"] * 1024,
                                "final_return": r["final_episode_return_last10upd_mean"]})
        else:
            results = [parse_result(out) for out in outs]
    return {"trace_lower_s": max(r["trace_lower_s"] for r in results),
            "compile_s": max(r["compile_s"] for r in results),
            "env_steps_per_s": sum(r["env_steps_per_s"] for r in results),
            "peak_mb": max(r["peak_mb"] for r in results),
            "final_return": sum(r["final_return"] * n for r, n in zip(results, counts)) / seeds,
            "flops_per_env_step": results[0].get("flops_per_env_step")}


def compare_ppo(settings: list, reps: int, total_steps: int, timeout: float, anchor: str | None,
                tool: str | None, budget: Budget | None = None, log=None, impls: tuple = IMPLS,
                program: str = "ppo") -> tuple[dict, list]:
    """This library's PPO vs PureJaxRL's ``program``.py (``ppo`` or ``ppo_rnn``) at every ``(seeds, processes)``
    of ``settings``, interleaved: each of ``reps`` repetitions measures every
    setting for both implementations back to back, alternating which goes first.
    ``anchor=None`` leaves PureJaxRL out.
    Returns ``(results, notes)``:
    ``results[(impl, seeds, procs)]`` is the list of :func:`ppo_batch` results and
    ``notes`` says which PureJaxRL measurements failed, or where the budget ran out."""
    res, notes = {}, []
    try:
        for rep in range(reps):
            for seeds, procs in settings:
                # both programs run twice: allow 1 s per 10,000 env steps on top of the timeout
                limit = timeout + 2 * seeds * total_steps / 10_000
                for impl in impls if rep % 2 == 0 else impls[::-1]:
                    if impl == "purejaxrl" and anchor is None:
                        continue
                    try:
                        r = ppo_batch(impl, seeds, procs, total_steps, limit, anchor, tool, budget=budget,
                                      program=program)
                    except OutOfTime:
                        raise
                    except (RuntimeError, OSError, KeyError, ValueError) as e:
                        if impl != "purejaxrl":
                            raise
                        notes.append(f"PureJaxRL, {seeds} seeds x {procs} process(es), repetition {rep + 1}:"
                                     f" the harness failed ({e})")
                        continue
                    res.setdefault((impl, seeds, procs), []).append(r)
                    if log:
                        log(f"rep {rep + 1}/{reps} {impl:9s} {seeds:4d} seeds x {procs} process(es):"
                            f" {r['env_steps_per_s']:,.0f} env steps/s, compile {r['compile_s']:.1f}s")
    except OutOfTime as e:
        notes.append(f"Stopped early: {e}; the rows show the measurements made before.")
    return res, notes


def medians(res: dict) -> dict:
    """Per key of :func:`compare_ppo`'s results: the median of every number over
    the repetitions, with ``n`` and the ``min`` / ``max`` of env steps/s."""
    out = {}
    for key, rs in res.items():
        sps = [r["env_steps_per_s"] for r in rs]
        out[key] = {k: statistics.median([r[k] for r in rs]) for k in rs[0] if isinstance(rs[0][k], (int, float))}
        out[key].update(n=len(rs), min=min(sps), max=max(sps))
    return out
