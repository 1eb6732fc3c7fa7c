"""What every script in ``sweeps/`` shares: its options, its errors, its main loop.

A script is a function ``studies(args) -> [Study, ...]`` plus a function
``report(args, results) -> str`` (the printed tables; it may write figures
into the results folders). :func:`main` parses the options, runs every study
through :func:`~coevo_jax.experiment.runner.run_study` (resuming, devices,
hosts, progress, output layout and metrics come with it), and turns any
:class:`ConfigError` / :class:`StudyError` into one line on stderr and exit 2.
With several studies, study ``s`` writes to ``--out/<s.name>``. A script whose
studies depend on earlier results (tune, then evaluate) uses :func:`staged_main`.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import jax

from coevo_jax.config import ConfigError
from coevo_jax.experiment import runner
from coevo_jax.experiment.runner import run_study
from coevo_jax.experiment.spec import StudyError, config_hash, config_text
from coevo_jax.experiment.worker import default_compile_cache
from coevo_jax.runtime import use_safe_xla_flags

from _study import publish


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are a single line (no usage block) and exit 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def study_parser(prog: str, doc: str, default_out: str) -> OneLineParser:
    """A parser with the options every study script shares (add the script's own to it)."""
    p = OneLineParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=default_out, help=f"output folder (default: {default_out})")
    p.add_argument("--overwrite", action="store_true", help="replace a finished or mismatched output folder (default: refuse)")
    p.add_argument("--replot", action="store_true", help="rebuild tables and figures from a finished --out; run nothing (default: run)")
    p.add_argument("--quiet", action="store_true", help="no progress bar (default: show it)")
    p.add_argument("--publish", default=None, metavar="DIR",
                   help="also write the report to DIR/<script>.md with its command, commit and machine, figures"
                        " in DIR/<script>/ (e.g. docs/results; default: print only)")
    g = p.add_argument_group("execution (none of these changes the results)")
    g.add_argument("--devices", type=int, default=None, metavar="D",
                   help="devices to split each batch of runs over, >= 1 (default: on CPU one host device per core,"
                        " else every local device)")
    g.add_argument("--max-parallel", type=int, default=None, metavar="N",
                   help="at most N runs resident at once on this host, >= 1 (default: all runs of an arm)")
    g.add_argument("--no-compile-cache", action="store_true",
                   help=f"do not use JAX's persistent compilation cache (default: on, in {default_compile_cache()})")
    g.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                   help="multi-host: jax.distributed coordinator address (default: single host)")
    g.add_argument("--num-hosts", type=int, default=None, metavar="N", help="multi-host: number of hosts (default: 1)")
    g.add_argument("--host-index", type=int, default=None, metavar="I",
                   help="multi-host: this host's index, 0 .. N-1 (default: 0)")
    g.add_argument("--stop-after-chunks", type=int, default=None, metavar="C",
                   help="stop after C chunks (to test resuming); default: run to the end")
    return p


def execution_kwargs(args) -> dict:
    """``run_study`` keyword arguments from the shared options (validated)."""
    for name, low in (("max_parallel", 1), ("devices", 1), ("num_hosts", 1), ("stop_after_chunks", 0)):
        v = getattr(args, name)
        if v is not None and v < low:
            raise ConfigError(f"--{name.replace('_', '-')}={v} must be >= {low}")
    dist = None
    if args.coordinator or args.num_hosts or args.host_index is not None:
        if not (args.coordinator and args.num_hosts and args.host_index is not None):
            raise ConfigError("multi-host needs all of --coordinator, --num-hosts and --host-index")
        if not 0 <= args.host_index < args.num_hosts:
            raise ConfigError(f"--host-index={args.host_index} must be in [0, --num-hosts={args.num_hosts})")
        dist = {"coordinator_address": args.coordinator, "num_processes": args.num_hosts,
                "process_id": args.host_index}
    return {"max_parallel": args.max_parallel, "devices": args.devices, "distributed": dist,
            "compile_cache": not args.no_compile_cache, "stop_after_chunks": args.stop_after_chunks}


def start_devices(args) -> list:
    """This process's devices, made before its first JAX computation: ``--devices``, by default on
    CPU one host device per core (unless ``XLA_FLAGS`` or an earlier computation chose them), each
    running its programs on one thread (``--xla_cpu_multi_thread_eigen=false`` unless set)."""
    kw = execution_kwargs(args)
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_multi_thread_eigen" not in flags:  # one thread per CPU device: the devices are the parallelism
        os.environ["XLA_FLAGS"] = (flags + " --xla_cpu_multi_thread_eigen=false").strip()
    if kw["devices"] is None and jax.config.jax_num_cpu_devices == -1 and "device_count" not in flags:
        try:
            jax.config.update("jax_num_cpu_devices", len(os.sched_getaffinity(0)))
        except RuntimeError:  # JAX runs already (a script called in-process): its devices as they are
            pass
    return runner.start_devices(kw["devices"], kw["distributed"])


def run_studies(args, studies: list, last: bool = True) -> list | None:
    """Run (or resume, or with ``--replot`` reload) every study; ``None`` if any stopped early.

    A finished study of the same config is loaded, not rerun, when it is part of an interrupted
    run: one of several studies, or of a stage before the ``last`` (tune, then evaluate)."""
    from coevo_jax.analysis.report import load_report, rebuild_report, write_report  # report extra: imported on use
    outs = [args.out if len(studies) == 1 else os.path.join(args.out, s.name) for s in studies]
    if args.replot:
        return [rebuild_report(out) for out in outs]
    kw = execution_kwargs(args)
    if len(studies) > 1 and os.path.exists(args.out) and not os.path.isdir(args.out):
        raise StudyError(f"{args.out} exists and is not a folder")
    finished = [os.path.exists(os.path.join(o, "FINISHED")) and _same_config(o, s) for o, s in zip(outs, studies)]
    if last and len(studies) > 1 and all(finished) and not args.overwrite:
        raise StudyError(f"{args.out} holds these finished studies; pass --overwrite to replace them, --replot to"
                         " rebuild the report, or choose another --out")
    results = []
    for s, out, done in zip(studies, outs, finished):
        if done and not args.overwrite and (len(studies) > 1 or not last):  # an interrupted run's finished part
            results.append(load_report(out))
            continue
        res = run_study(s, out, overwrite=args.overwrite, progress=not args.quiet, **kw)
        if res is None:
            return None
        results.append(write_report(res))
    return results


def _same_config(out: str, study) -> bool:
    return config_hash(open(os.path.join(out, "config.json")).read()) == config_hash(config_text(study))


def main(parser: OneLineParser, studies, report, argv=None) -> int:
    """Parse, build the studies, run them, print ``report(args, results)``; one-line errors, exit 2."""
    return staged_main(parser, [("", lambda args, earlier: studies(args))],
                       lambda args, stages: report(args, stages[0]), argv)


def staged_main(parser: OneLineParser, stages, report, argv=None, figures=None) -> int:
    """:func:`main` for a script whose studies depend on earlier ones (e.g. tune, then evaluate).

    ``stages``: ``[(name, build(args, earlier) -> [Study, ...]), ...]``; ``earlier`` is the list of
    the finished stages' results (one list of ``StudyReport`` per stage). Stage ``name`` writes to
    ``--out/<name>`` (``""``: ``--out`` itself). ``report(args, results_per_stage) -> str``.
    ``figures(args) -> [png]``: what ``--publish`` copies (default: every study folder's figures).
    """
    use_safe_xla_flags()  # this process is an application: the no-hang flag, before its first computation
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    t0 = time.time()
    done = []
    try:
        if not args.replot:
            start_devices(args)
        for name, low in (("num_seeds", 1), ("num_chunks", 1), ("seed", 0), ("total_steps", 1)):
            v = getattr(args, name, None)
            if isinstance(v, int) and v < low:
                raise ConfigError(f"--{name.replace('_', '-')}={v} must be >= {low}")
        for i, (name, build) in enumerate(stages):
            stage_args = argparse.Namespace(**{**vars(args), "out": os.path.join(args.out, name) if name else args.out})
            results = run_studies(stage_args, build(args, done), last=i == len(stages) - 1)
            if results is None:
                return 0
            done.append(results)
        text = report(args, done)
        print(text)
        if args.publish:
            path = _publish(parser, argv, args, text, done, None if args.replot else time.time() - t0, figures)
            print(f"\nreport published to {path}")
    except (ConfigError, StudyError) as e:
        print(f"{parser.prog}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    if args.replot:
        print(f"\nreport rebuilt from {args.out} in {time.time() - t0:.0f} s")
        return 0
    runs, compile_s = (sum(r.info.get(k, 0) for stage in done for r in stage)
                       for k in ("total_runs", "compile_s_total"))
    print(f"\n{runs} runs in {time.time() - t0:.0f} s (compiling {compile_s:.0f} s);"
          f" results in {args.out}")
    return 0


def _publish(parser, argv, args, text: str, done: list, wall_s, figures=None) -> str:
    """Write the printed report as ``--publish``'s ``<script>.md`` (see :mod:`_study.publish`)."""
    name = os.path.splitext(parser.prog)[0]
    title = " ".join((parser.description or name).strip().split("\n\n")[0].split()).rstrip(".")  # first paragraph
    outs = [r.out for stage in done for r in stage]
    return publish.write_report(args.publish, name, title, publish.command_line(f"sweeps/{parser.prog}", argv), text,
                                publish.study_figures(outs) if figures is None else figures(args), wall_s,
                                repo=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
