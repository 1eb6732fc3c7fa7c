"""Metrics (``metrics``), statistics (``stats``, rliable), tables and figures of the studies'
reports (host side). A layer below the runner (:mod:`coevo_jax.experiment`): nothing here
imports it; functions that read a finished study take its result as an argument."""
