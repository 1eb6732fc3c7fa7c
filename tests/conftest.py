import os
import sys

# jax 0.10.2 on CPU can hang in vmapped programs with batched QR (orthogonal init);
# this flag prevents it. Set before jax starts its backend.
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_enable_concurrency_optimized_scheduler=false")
if "xla_cpu_enable_concurrency_optimized_scheduler" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_cpu_enable_concurrency_optimized_scheduler=false"

# what the study scripts share lives in sweeps/_study (an application, not the library); a script
# run as `python sweeps/<script>.py` finds it on its own path, the tests that load scripts and
# their helpers find it here
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sweeps"))

# The tests check semantics (shapes, equivalences, learning at tiny budgets), not speed, and compiling
# dominates them on CPU: XLA:CPU at -O0 without the fusion emitters (tests/xla_options.py's OPT0, here for
# every program of the test process and of the worker processes it starts) compiles ~4x faster.
for _flag in ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false"):
    if _flag.split("=")[0] not in os.environ["XLA_FLAGS"]:
        os.environ["XLA_FLAGS"] += " " + _flag
