#!/usr/bin/env python
"""Cold start: the README's two set-up commands timed as a new user meets them.

A fresh clone of this repository's HEAD (committed files only), a fresh
virtualenv and an empty JAX compilation cache; then, timed apart:

1. ``python -m pip install -e ".[report]" -c constraints.txt`` and ``python sweeps/k_sensitivity.py``
   (the main job: its runs, and the seconds XLA spent compiling each program);
2. ``python -m pip install -e ".[test]" -c constraints.txt`` and ``python -m pytest``.

pip's download cache is the machine's (``--no-pip-cache``: none), so the install
time is that of a machine that has fetched the wheels before, unless asked. The
children get a clean environment: no ``PYTHONPATH``, ``XLA_FLAGS`` or virtualenv
of the caller. The target for command 1 is 5 minutes on 2 cores (issue: a cold start
under 5 minutes).

    python sweeps/cold_start.py                   # both commands, report printed
    python sweeps/cold_start.py --skip-tests --publish docs
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from _study.publish import command_line, git_commit, write_report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_S = 300.0


def timed(cmd: str, cwd: str, env: dict, timeout: float, log: str) -> tuple[float, str]:
    """``(seconds, output)`` of the shell command ``cmd``; ``RuntimeError`` (its last lines) if it fails."""
    t0 = time.time()
    p = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    with open(log, "a") as f:
        f.write(f"$ {cmd}\n{p.stdout}{p.stderr}\n")
    if p.returncode != 0:
        raise RuntimeError(f"`{cmd}` failed (exit {p.returncode}): {(p.stdout + p.stderr).strip()[-800:]}")
    return time.time() - t0, p.stdout + p.stderr


def clean_env(venv: str, cache: str, pip_cache: bool) -> dict:
    """The caller's environment less what a fresh shell would not have, with ``venv`` activated."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "XLA_FLAGS", "VIRTUAL_ENV", "PYTHONHOME") and not k.startswith("COEVO_JAX")}
    env.update(VIRTUAL_ENV=venv, PATH=os.path.join(venv, "bin") + os.pathsep + env.get("PATH", ""),
               COEVO_JAX_COMPILE_CACHE=cache)
    if not pip_cache:
        env["PIP_NO_CACHE_DIR"] = "1"
    return env


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-tests", action="store_true", help="time command 1 only (default: both)")
    ap.add_argument("--no-pip-cache", action="store_true", help="pip without its download cache (default: with)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per step before giving up (default 3600)")
    ap.add_argument("--publish", metavar="DIR", help="also write DIR/cold_start.md (e.g. docs; default: print only)")
    args = ap.parse_args(argv)
    work = tempfile.mkdtemp(prefix="coevo_cold_")
    repo, venv, cache, log = (os.path.join(work, n) for n in ("repo", "venv", "xla_cache", "log.txt"))
    subprocess.run(["git", "clone", "--quiet", ROOT, repo], check=True, timeout=600)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=600)
    env = clean_env(venv, cache, not args.no_pip_cache)
    rows, t_start = [], time.time()
    try:
        s, _ = timed('python -m pip install -e ".[report]" -c constraints.txt', repo, env, args.timeout, log)
        rows.append(("1", '`python -m pip install -e ".[report]" -c constraints.txt`', s))
        s, out = timed("python sweeps/k_sensitivity.py --quiet", repo, env, args.timeout, log)
        rows.append(("1", "`python sweeps/k_sensitivity.py` (empty compile cache)", s))
        if not args.skip_tests:
            s, _ = timed('python -m pip install -e ".[test]" -c constraints.txt', repo, env, args.timeout, log)
            rows.append(("2", '`python -m pip install -e ".[test]" -c constraints.txt`', s))
            s, tests = timed("python -m pytest -q", repo, env, args.timeout, log)
            rows.append(("2", "`python -m pytest`", s))
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"cold_start.py: error: {str(e).splitlines()[0]} [log: {log}]", file=sys.stderr)
        return 1
    info = json.load(open(os.path.join(repo, "results", "k_sensitivity", "run_info.json")))
    first = sum(s for c, _, s in rows if c == "1")
    lines = [f"Cold start on a fresh clone of {git_commit(repo)}, a fresh virtualenv and an empty JAX compilation"
             f" cache (pip's download cache: {'off' if args.no_pip_cache else 'the machine’s'}).", "",
             "| command | step | seconds |", "|---|---|---|"]
    lines += [f"| {c} | {step} | {s:.0f} |" for c, step, s in rows]
    lines += [f"| 1 | **total** (target {TARGET_S:.0f} s) | **{first:.0f}** |"]
    if not args.skip_tests:
        lines += [f"| 2 | **total** | **{sum(s for c, _, s in rows if c == '2'):.0f}** |"]
    programs = info["hosts"]["0"]["compile_s"]
    lines += ["", f"The main job: {info['total_runs']} runs, {info['total_env_steps']:,} env steps on"
              f" {info['devices_per_host']} {info['backend']} device(s); XLA compiled"
              f" {sum(v > 0 for v in programs.values())} programs in {info['compile_s_total']:.0f} s"
              f" ({', '.join(f'{k} {v:.1f} s' for k, v in programs.items() if v > 0)}; arms that share a program"
              " compile nothing)."]
    if not args.skip_tests:
        summary = next((ln for ln in reversed(tests.splitlines()) if " passed" in ln), "?").strip("= ")
        lines += ["", f"The tests: {summary}."]
    text = "\n".join(lines)
    print(text)
    if args.publish:
        path = write_report(args.publish, "cold_start", "Cold start: the README's two commands on a fresh machine",
                            command_line("sweeps/cold_start.py", sys.argv[1:] if argv is None else argv), text,
                            wall_s=time.time() - t_start, repo=ROOT)
        print(f"\nreport published to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
