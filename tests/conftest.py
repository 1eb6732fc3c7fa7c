import os

# jax 0.10.2 on CPU can hang in vmapped programs with batched QR (orthogonal init);
# this flag prevents it. Set before jax starts its backend.
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_enable_concurrency_optimized_scheduler=false")
if "xla_cpu_enable_concurrency_optimized_scheduler" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_cpu_enable_concurrency_optimized_scheduler=false"
