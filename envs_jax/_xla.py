"""A safe XLA:CPU default, applied before the first JAX computation.

jax/jaxlib 0.10.2 on CPU can hang forever in vmapped programs with several
batched QR decompositions (orthogonal initialisation under ``vmap``): every
XLA worker idles while the main thread waits. Turning off the concurrency-
optimised scheduler prevented it in every trial at ~5% cost. XLA reads the flag
when the CPU backend starts, so importing this package before the first JAX
computation is enough; users can opt out with ``COEVO_JAX_KEEP_XLA_FLAGS=1``.
The flag is not a guarantee (a 64-run vmapped sweep still hung once with it),
so ``coevo_jax`` also avoids the trigger: its orthogonal initialiser
(``coevo_jax.networks.orthogonal``) uses no QR decomposition.
"""
import os

SAFE_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def apply_safe_xla_flags() -> None:
    """Append the no-hang scheduler flag to ``XLA_FLAGS`` unless told not to."""
    if os.environ.get("COEVO_JAX_KEEP_XLA_FLAGS") == "1":
        return
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_enable_concurrency_optimized_scheduler" not in flags:
        os.environ["XLA_FLAGS"] = (flags + " " + SAFE_FLAG).strip()


apply_safe_xla_flags()
