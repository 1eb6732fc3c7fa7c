"""The progress bar: this process's runs, iterations, env steps/s, ETA and phase on one line."""
from __future__ import annotations

import sys
import time

import numpy as np


def fmt_time(s: float) -> str:
    if not np.isfinite(s):
        return "?"
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Progress:
    """A :class:`~coevo_jax.experiment.worker.Reporter`'s progress (``set(data)``) as one stdout line,
    redrawn every 0.5 s on a terminal, every 10 s otherwise."""

    def __init__(self, total_runs: int, total_iters: int, total_steps: int, enabled: bool = True):
        self.totals, self.enabled, self.data = (total_runs, total_iters, total_steps), enabled, {}
        self.tty = sys.stdout.isatty()
        self.t0, self.first, self.last_print = time.time(), None, 0.0  # first: (time, steps) of the first new steps

    def set(self, data: dict):
        self.data = data
        self.show()

    def line(self) -> str:
        runs, iters, steps, resumed = (self.data.get(k, 0)
                                       for k in ("runs_done", "run_iterations", "env_steps", "env_steps_resumed"))
        now = time.time()
        if steps > resumed and self.first is None:
            self.first = (now, steps)
        rate = (steps - self.first[1]) / (now - self.first[0]) if self.first and now > self.first[0] else 0.0
        frac = iters / max(1, self.totals[1])
        phase = self.data.get("phase", "starting")
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
