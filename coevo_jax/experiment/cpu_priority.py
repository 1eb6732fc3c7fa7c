"""Chunks at a lower CPU priority than compiles, for workers that share a host's cores.

XLA:CPU runs a compiled program on its intra-op threads (named ``tf_XLAEigen``;
they do all of a chunk's work), and compiles on other threads. With one worker
per core, a worker's compile shares the cores with the other workers' chunks,
and without priorities each gets a fair share: the compile then takes about
its CPU time (coevo's program on 2 cores: ~30 s instead of ~18 s alone).
:func:`lower_execution_priority` raises the nice value of this process's
execution threads, so a compile anywhere on the host runs first and the chunks
take what it leaves: the cores stay busy and the work is the same.

Linux only (threads are found under ``/proc/self/task``; elsewhere it does
nothing). A nice value can only be raised by an unprivileged process, so the
change lasts as long as the threads.
"""
from __future__ import annotations

import os

EXECUTION_THREAD = "tf_XLAEigen"  # the name XLA:CPU gives its intra-op (execution) threads
EXECUTION_NICENESS = 10  # CFS weight 110 against 1024 at nice 0: a compile gets ~90% of a shared core


def execution_threads() -> list[int]:
    """Thread ids of this process's XLA:CPU execution threads (empty without ``/proc``)."""
    tids = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return tids
    for t in tasks:
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                if f.read().strip() == EXECUTION_THREAD:
                    tids.append(int(t))
        except OSError:  # the thread ended meanwhile
            pass
    return tids


def lower_execution_priority(niceness: int = EXECUTION_NICENESS) -> int:
    """Raise the nice value of this process's XLA:CPU execution threads to at
    least ``niceness`` (call it after JAX has started its CPU backend); returns
    how many threads now run at it."""
    done = 0
    for tid in execution_threads():
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < niceness:
                os.setpriority(os.PRIO_PROCESS, tid, niceness)
            done += 1
        except OSError:  # ended meanwhile, or not permitted
            pass
    return done
