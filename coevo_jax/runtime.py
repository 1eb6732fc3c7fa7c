"""Opt-in XLA:CPU settings for applications. Importing the library applies none of them.

The study scripts (``sweeps/_study/cli.py``), the runner's worker processes and
``sweeps/bench.py`` apply :func:`use_safe_xla_flags`; a library user who wants it
calls it before the first JAX computation of the process::

    import coevo_jax
    coevo_jax.runtime.use_safe_xla_flags()   # before anything runs on the CPU backend

**The no-hang scheduler flag.** jax/jaxlib 0.10.2 on CPU can hang forever in vmapped
programs with several batched QR decompositions (orthogonal initialisation under
``vmap``): every XLA worker idles while the main thread waits
(``shared/tools/xla_cpu_hang_repro.py`` reproduces it in about half of fresh processes).
The library's own programs avoid the trigger (its orthogonal initialiser,
:func:`coevo_jax.networks.orthogonal`, uses no QR decomposition); the flag
``--xla_cpu_enable_concurrency_optimized_scheduler=false`` prevented the hang in every
trial of the reproducer and is a guard for programs that do contain batched QR (a user's
own network, for example). XLA reads it when the CPU backend starts.
"""
from __future__ import annotations

import os
from typing import MutableMapping

SAFE_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def use_safe_xla_flags(environ: MutableMapping[str, str] | None = None) -> bool:
    """Append :data:`SAFE_FLAG` to ``environ["XLA_FLAGS"]`` (default ``os.environ``) unless the
    scheduler option is already set there; ``True`` when it was added.

    Effective only before the process's CPU backend starts (its first computation)."""
    env = os.environ if environ is None else environ
    flags = env.get("XLA_FLAGS", "")
    if "xla_cpu_enable_concurrency_optimized_scheduler" in flags:
        return False
    env["XLA_FLAGS"] = (flags + " " + SAFE_FLAG).strip()
    return True
