"""The report of a study (host side): metrics (``metrics``), statistics (``stats``, rliable), figures
(``plots``), the summary CSV (``tables``) and the report of a finished study (``report``). A layer above
the runner (:mod:`coevo_jax.experiment`), which never imports it: the core library runs and stores,
this package scores and draws. The studies' own analyses (ground truths, credit reports, results tables)
live in ``sweeps/_study/analysis``."""
import importlib.util

_MISSING = [m for m in ("matplotlib", "scipy", "rliable") if importlib.util.find_spec(m) is None]
if _MISSING:
    raise ImportError(f"coevo_jax.analysis (a study's report) needs {', '.join(_MISSING)}: install the report extra,"
                      " python -m pip install -e \".[report]\" -c constraints.txt")
