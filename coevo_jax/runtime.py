"""Opt-in XLA:CPU settings for applications; importing the library applies none of them. Call
:func:`use_safe_xla_flags` before the first JAX computation of the process. Background:
``docs/design.md``."""
from __future__ import annotations

import os
from typing import MutableMapping

SAFE_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def use_safe_xla_flags(environ: MutableMapping[str, str] | None = None) -> bool:
    """Append :data:`SAFE_FLAG` to ``environ["XLA_FLAGS"]`` (default ``os.environ``) unless the
    scheduler option is set there; ``True`` when added. Effective only before the CPU backend starts."""
    env = os.environ if environ is None else environ
    flags = env.get("XLA_FLAGS", "")
    if "xla_cpu_enable_concurrency_optimized_scheduler" in flags:
        return False
    env["XLA_FLAGS"] = (flags + " " + SAFE_FLAG).strip()
    return True
