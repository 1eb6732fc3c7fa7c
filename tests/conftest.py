import os
import sys

import pytest

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

# The slowest files first (measured: each takes a minute or more of a worker's time). With
# `--dist loadfile --no-loadscope-reorder` (pyproject.toml) xdist hands files out in this order, so
# the two workers end together instead of one running a long file alone at the end.
SLOWEST_FIRST = ("test_signal_contract.py", "test_learned.py", "test_experiment.py", "test_suite.py",
                 "test_chain_credit.py", "test_text.py", "test_recurrent.py", "test_env_contract.py",
                 "test_learning.py", "test_reward_net.py", "test_meta.py", "test_gymnax_api.py", "test_potential.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the other files keep their order


#: the resamples a library default of 1,000 or more bootstraps with in a test (a test passing fewer keeps them)
TEST_BOOTSTRAP = 100


@pytest.fixture(autouse=True)
def few_bootstrap_resamples(monkeypatch):
    """Every report a test writes bootstraps its CIs with :data:`TEST_BOOTSTRAP` resamples, not the library's
    1,000-2,000: rliable's bootstrap is a Python loop per resample, and no test checks a CI's width."""
    from coevo_jax.analysis import stats

    full = stats.interval_estimates

    def few(scores, func, n_boot, alpha, seed):
        return full(scores, func, min(n_boot, TEST_BOOTSTRAP) if n_boot >= 1000 else n_boot, alpha, seed)

    monkeypatch.setattr(stats, "interval_estimates", few)
