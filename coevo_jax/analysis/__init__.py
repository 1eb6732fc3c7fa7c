"""A study's report (host side): ``metrics``, ``stats`` (rliable), ``plots``, ``tables`` and ``report``.
A layer above the runner (:mod:`coevo_jax.experiment`), which never imports it."""
import importlib.util

_MISSING = [m for m in ("matplotlib", "scipy", "rliable") if importlib.util.find_spec(m) is None]
if _MISSING:
    raise ImportError(f"coevo_jax.analysis (a study's report) needs {', '.join(_MISSING)}: install the report extra,"
                      " python -m pip install -e \".[report]\" -c constraints.txt")
